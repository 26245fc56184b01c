"""Hostile and careless use of the bindings (docs/testing.md, round 3):
each class of defect found against them, now an error with a message or
the right bytes.  Pure numpy; the PyTorch classes are in test_torch.py."""
import gc
import os
import threading

import numpy as np
import pytest

import moe8

FP8 = {"rules": [{"module_path": ".*", "weight_qtype": "float8_e4m3fn", "act_qtype": "float8_e4m3fn", "tile_size": 32}]}


def small(rules=None, hidden=64):
    layer = moe8.Layer(num_experts=4, top_k=2, hidden=hidden, ffn=32, norm_topk_prob=True, rules=rules)
    layer.init_random(1)
    return layer


def test_x_width_is_checked():
    layer = small()
    for bad in (np.ones((5, 128), np.float32), np.ones((1, 1), np.float32), np.ones((3,), np.float32)):
        with pytest.raises(moe8.Error, match="x"):
            layer.forward(bad)
    layer.prepare()
    with pytest.raises(moe8.Error, match=r"x has shape \[5, 128\], expected \['\*', 64\]"):
        layer.forward(np.ones((5, 128), np.float32), fused=True)


def test_out_must_be_writable_and_right():
    layer = small()
    x = np.ones((3, 64), np.float32)
    ro = np.zeros((3, 64), np.float32)
    ro.flags.writeable = False
    with pytest.raises(moe8.Error, match="read-only"):
        layer.forward(x, out=ro)
    frozen = np.frombuffer(bytes(3 * 64 * 4), dtype=np.float32).reshape(3, 64)  # an immutable bytes buffer
    with pytest.raises(moe8.Error, match="read-only"):
        layer.forward(x, out=frozen)
    assert not frozen.any()
    with pytest.raises(moe8.Error, match="shape"):
        layer.forward(x, out=np.zeros((3, 63), np.float32))


def test_views_keep_the_layer_alive():
    w = small().weight("gate")
    gc.collect()
    before = float(w.sum())  # the layer's memory, still there
    w[0, 0, 0] += 1.0
    assert float(w.sum()) != before


def test_backward_checks_the_forward():
    layer = small()
    x = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    ws = layer.new_workspace(64)
    layer.forward(x, workspace=ws)
    with pytest.raises(moe8.Error, match="T = 32, but the workspace holds the forward of T = 64"):
        layer.backward(x[:32], np.ones((32, 64), np.float32), workspace=ws)
    with pytest.raises(moe8.Error, match="dout has shape"):
        layer.backward(x, np.ones((1, 64), np.float32), workspace=ws)
    with pytest.raises(moe8.Error, match="dout has shape"):
        layer.backward(x, np.ones((64, 128), np.float32), workspace=ws)
    with pytest.raises(moe8.Error, match="holds no successful forward"):
        layer.backward(x, np.ones((64, 64), np.float32), workspace=layer.new_workspace(64))
    g = layer.backward(x, np.ones((64, 64), np.float32), workspace=ws)
    assert g["dx"].shape == (64, 64)


@pytest.mark.parametrize("rules", [None, FP8])
def test_one_layer_many_threads(rules):
    layer = small(rules)
    rng = np.random.default_rng(5)
    xs = [rng.standard_normal((9, 64)).astype(np.float32) for _ in range(8)]
    want = [layer.forward(x)[0].copy() for x in xs]
    wrong = []

    def run(i):
        for _ in range(25):
            y, _ = layer.forward(xs[i])  # the layer's default workspace: one per thread
            if not np.array_equal(y, want[i]):
                wrong.append(i)

    th = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    assert not wrong, "%d of 200 outputs wrong" % len(wrong)


def test_writes_through_a_view_reach_the_forward():
    layer = small(FP8)
    x = np.random.default_rng(2).standard_normal((5, 64)).astype(np.float32)
    y0 = layer.forward(x)[0].copy()
    layer.weight("down")[:] *= 2.0
    y1 = layer.forward(x)[0]
    assert not np.allclose(y0, y1)


def test_dequantize_checks_codes_and_scales():
    x = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)
    q, s = moe8.quantize(x, "f8e4m3", "row")
    assert np.array_equal(moe8.dequantize(q, s, "f8e4m3", "row").shape, (4, 64))
    with pytest.raises(moe8.Error, match="must be 4 values, got 2"):
        moe8.dequantize(q, s[:2], "f8e4m3", "row")
    with pytest.raises(moe8.Error, match="uint8"):
        moe8.dequantize(x, s, "f8e4m3", "row")
    with pytest.raises(moe8.Error, match="int8"):
        moe8.dequantize(q, s, "i8", "row")


def test_rules_paths(tmp_path):
    fifo = tmp_path / "rules.fifo"
    os.mkfifo(fifo)
    with pytest.raises(moe8.Error, match="rules.fifo"):
        moe8.Rules(str(fifo))
    with pytest.raises(moe8.Error):
        moe8.Rules("/dev/zero")
    with pytest.raises(moe8.Error, match="none.json"):
        moe8.Rules(str(tmp_path / "none.json"))
    p = tmp_path / "r.json"
    p.write_text('{"rules": []}')
    moe8.Rules(str(p))
    moe8.Rules(p)


def test_options_are_checked():
    with pytest.raises(moe8.Error, match="score"):
        moe8.Layer(num_experts=4, top_k=2, hidden=8, ffn=8, score="bogus")
    with pytest.raises(moe8.Error, match="num_experts"):
        moe8.Layer(num_experts=2**64 + 4, top_k=2, hidden=8, ffn=8)
    with pytest.raises(moe8.Error, match="top_k"):
        moe8.Layer(num_experts=4, top_k=5, hidden=8, ffn=8)
    with pytest.raises(moe8.Error, match="hidden"):
        moe8.Layer(num_experts=4, top_k=2, hidden=2.5, ffn=8)


def test_unaligned_input_is_copied_not_misread():
    layer = small()
    x = np.random.default_rng(4).standard_normal((3, 64)).astype(np.float32)
    raw = np.zeros(3 * 64 * 4 + 1, np.uint8)
    un = np.frombuffer(raw.data, dtype=np.float32, count=3 * 64, offset=1).reshape(3, 64)
    un[:] = x
    assert not un.flags.aligned
    assert np.array_equal(layer.forward(un)[0], layer.forward(x)[0])


def test_truncated_mapped_model_is_a_message(tmp_path):
    import json
    import subprocess
    import sys
    bin_ = os.environ.get("MOE8_BIN", "moe8")
    (tmp_path / "cfg.json").write_text(json.dumps({"model_type": "qwen3_moe", "num_experts": 8, "num_experts_per_tok": 2, "hidden_size": 256,
                                                   "moe_intermediate_size": 128, "num_hidden_layers": 1}))
    (tmp_path / "rules.json").write_text(json.dumps(FP8).replace("32", "128"))
    subprocess.run([bin_, "init", "--config", str(tmp_path / "cfg.json"), "--out", str(tmp_path / "m")], check=True, capture_output=True)
    subprocess.run([bin_, "quantize", str(tmp_path / "m"), str(tmp_path / "q"), "--rules", str(tmp_path / "rules.json")], check=True,
                   capture_output=True)
    code = ("import os, numpy as np, moe8\n"
            "layer = moe8.Layer.from_model(%r)\n"
            "os.truncate(%r, 4096)\n"
            "layer.forward(np.ones((64, 256), np.float32), fused=True)\n") % (str(tmp_path / "q"), str(tmp_path / "q" / "model.safetensors"))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(moe8.__file__)) + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert p.returncode == 1, (p.returncode, p.stderr)
    assert "model.safetensors was truncated or removed while in use" in p.stderr


def test_structs_match_the_library():
    import ctypes
    for name, cls in (("moe8_layer_config", moe8._LayerConfig), ("moe8_quant_spec", moe8._QuantSpec), ("moe8_layer_grads", moe8._Grads),
                      ("moe8_load_options", moe8._LoadOptions)):
        assert moe8._struct_size(name.encode()) == ctypes.sizeof(cls) > 0
    assert moe8._struct_size(b"no_such_struct") == 0
    assert moe8.__version__ == moe8.version()


@pytest.mark.parametrize("rules", [None, FP8])
def test_experts_entry_equals_forward(rules):
    """The serving op with the routing recomputed here (float64 softmax,
    so equal to the forward up to the weights' rounding; the C test
    test_experts_entry proves the bytes with the C router's weights)."""
    layer = small(rules)
    layer.prepare()
    x = np.random.default_rng(7).standard_normal((13, 64)).astype(np.float32)
    logits = x.astype(np.float64) @ layer.weight("router").astype(np.float64)
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    ids = np.argsort(-p, axis=1, kind="stable")[:, :2].astype(np.int32)
    w = np.take_along_axis(p, ids, 1)
    w = (w / w.sum(1, keepdims=True)).astype(np.float32)
    y = layer.forward(x)[0]
    assert np.allclose(layer.experts(x, ids, w), y, rtol=1e-4, atol=1e-5)
    assert not layer.experts(x, np.full_like(ids, -1), w).any()  # every slot skipped, no shared expert
    with pytest.raises(moe8.Error, match="topk_ids"):
        layer.experts(x, ids[:, :1], w)
    with pytest.raises(moe8.Error, match="num_experts"):
        layer.experts(x, ids + 10, w)


def test_experts_names_the_bad_id_and_where():
    """An id out of range (>= num_experts, or below -2^31 in an int64
    array, which int32 cannot hold) is named with its position, not
    reported as the array's maximum."""
    layer = small()
    layer.prepare()
    x, w = np.ones((3, 64), np.float32), np.full((3, 2), 0.5, np.float32)
    for ids, where, value in (([[0, 1], [3, -(2 ** 40)], [2, 1]], "[1, 1]", -(2 ** 40)), ([[0, 1], [3, 2], [2, 4]], "[2, 1]", 4),
                              ([[0, -(2 ** 31) - 1], [7, 2], [2, 1]], "[0, 1]", -(2 ** 31) - 1)):
        with pytest.raises(moe8.Error, match=r"topk_ids\%s = %d" % (where, value)):
            layer.experts(x, np.array(ids, np.int64), w)
    with pytest.raises(moe8.Error, match=r"topk_ids\[0, 0\] = 9"):
        layer.experts(x, np.array([[9, 0], [1, 2], [2, 1]], np.uint64), w)
    ok = np.array([[0, -(2 ** 31)], [-1, 3], [2, 1]], np.int64)  # the lowest int32 is a skipped slot, not an error
    assert layer.experts(x, ok, w).shape == (3, 64)


def test_model_without_a_moe_layer_says_so(tmp_path):
    """Layer.from_model on a model none of whose layers is MoE says "no MoE
    layer" and why, as `moe8 run` does (not "layer -1 is outside ...")."""
    import json
    import struct
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "qwen2_moe", "num_experts": 4, "num_experts_per_tok": 2, "hidden_size": 16, "moe_intermediate_size": 8,
        "shared_expert_intermediate_size": 8, "mlp_only_layers": [0], "intermediate_size": 32, "num_hidden_layers": 1}))
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", 8) + b"{}      ")
    for mode in ("inference", "training"):
        with pytest.raises(moe8.Error, match=r"config.json has no MoE layer: layer 0 is a dense MLP layer \(listed in mlp_only_layers\)"):
            moe8.Layer.from_model(str(tmp_path), mode=mode)
