"""The Python package: parity with the moe8 command, errors as exceptions,
no copies where the docs promise none.  Needs MOE8_LIBRARY (libmoe8.so) and
MOE8_BIN (the moe8 command) in the environment, as ctest sets them."""
import json
import os
import subprocess

import numpy as np
import pytest

import moe8

BIN = os.environ.get("MOE8_BIN", "moe8")


def sh(*args):
    p = subprocess.run([BIN, *args], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return p.stdout


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("m")
    cfg = d / "cfg.json"
    cfg.write_text(json.dumps({"model_type": "qwen2_moe", "num_experts": 8, "num_experts_per_tok": 2, "hidden_size": 256,
                               "moe_intermediate_size": 64, "shared_expert_intermediate_size": 96, "num_hidden_layers": 1}))
    sh("init", "--config", str(cfg), "--out", str(d / "m"))
    rules = d / "rules.json"
    rules.write_text(json.dumps({"rules": [{"module_path": ".*", "weight_qtype": "float8_e4m3fn", "act_qtype": "float8_e4m3fn",
                                            "tile_size": 128}]}))
    x = np.random.default_rng(3).standard_normal((7, 256)).astype(np.float32)
    np.save(d / "x.npy", x)
    return d, x


@pytest.mark.parametrize("rules", [False, True])
def test_parity_with_the_command(model, rules):
    d, x = model
    extra = ["--rules", str(d / "rules.json")] if rules else []
    sh("run", "--model", str(d / "m"), "--input", str(d / "x.npy"), "--output", str(d / "y.npy"), *extra)
    want = np.load(d / "y.npy")
    L = moe8.Layer.from_model(str(d / "m"), rules=str(d / "rules.json") if rules else None)
    got = L.forward(x, fused=True)
    assert got.tobytes() == want.tobytes()
    # the training load gives the same bytes
    T = moe8.Layer.from_model(str(d / "m"), mode="training", rules=str(d / "rules.json") if rules else None)
    got2, _ = T.forward(x)
    assert got2.tobytes() == want.tobytes()


@pytest.mark.parametrize("fmt", ["moe8", "deepseek"])
def test_fp8_checkpoint_without_rules_is_the_commands(model, fmt):
    """A quantized checkpoint, loaded without rules, runs with the
    activations it was made for (FP8 per token and K block), as `moe8 run`
    does: the same bytes, not f32 activations."""
    d, x = model
    q = d / ("q_" + fmt)
    if not q.exists():
        sh("quantize", str(d / "m"), str(q), "--rules", str(d / "rules.json"), "--format", fmt)
    sh("run", "--model", str(q), "--input", str(d / "x.npy"), "--output", str(d / ("yq_" + fmt + ".npy")))
    want = np.load(d / ("yq_" + fmt + ".npy"))
    L = moe8.Layer.from_model(str(q))
    assert "activations f8e4m3" in L.describe()
    assert L.forward(x, fused=True).tobytes() == want.tobytes()


def test_errors_raise_with_the_message(model, tmp_path):
    d, x = model
    with pytest.raises(moe8.Error, match="config.json: cannot open"):
        moe8.Layer.from_model(str(tmp_path))
    with pytest.raises(moe8.Error, match="malformed JSON"):
        moe8.Rules("{\"rules\": [")
    L = moe8.Layer.from_model(str(d / "m"))
    with pytest.raises(moe8.Error, match="x must be 2-D"):
        L.forward(x[0])
    bad = x.copy()
    bad[2, 5] = np.nan
    with pytest.raises(moe8.Error, match="non-finite") as e:
        L.forward(bad)
    assert e.value.status == 4 and e.value.status_name == "non-finite or invalid value"
    with pytest.raises(moe8.Error, match="loaded for inference"):
        L.backward(x, x)
    with pytest.raises(moe8.Error, match="no gate weight"):
        L.weight("gate")
    with pytest.raises(moe8.Error, match="top_k"):
        moe8.Layer(num_experts=4, top_k=5, hidden=8, ffn=8)
    with pytest.raises(moe8.Error, match="out must be"):
        L.forward(x, out=np.empty((7, 256), np.float64))


def test_no_copies(model):
    d, x = model
    L = moe8.Layer.from_model(str(d / "m"), mode="training")
    out = np.empty((7, 256), np.float32)
    y, _ = L.forward(x, out=out)
    assert y is out and y.ctypes.data == out.ctypes.data  # written in place
    assert moe8._f32(x, "x") is x  # a C-contiguous float32 input is passed as it is
    w1, w2 = L.weight("down"), L.weight("down")
    assert w1.ctypes.data == w2.ctypes.data  # the layer's own memory, not copies
    before, _ = L.forward(x)
    w1 *= 2.0  # writes reach the layer
    after, _ = L.forward(x)
    assert not np.array_equal(before, after)


def test_quantize_convert():
    x = np.random.default_rng(1).standard_normal((5, 300)).astype(np.float32)
    q, s = moe8.quantize(x, "f8e4m3", "row_tile", tile=128)
    assert q.dtype == np.uint8 and s.shape == (5 * 3,)
    y = moe8.dequantize(q, s, "f8e4m3", "row_tile", tile=128)
    assert np.max(np.abs(y - x)) <= np.max(np.abs(x)) / 8
    codes = moe8.convert(x, "f8e4m3")
    back = moe8.convert(codes, "f32", "f8e4m3")
    assert np.allclose(back, x, rtol=0.07, atol=2e-3)
    assert moe8.version() == "0.2.0"


def test_from_model_progress(model):
    d, x = model
    seen = []
    L = moe8.Layer.from_model(str(d / "m"), progress=lambda done, total: seen.append((done, total)))
    assert L.hidden == 256
    assert seen and seen[-1][0] == seen[-1][1] > 0  # at least the final call, done = total
    assert all(0 <= a <= b for a, b in seen)


def test_num_threads():
    """The process-wide thread count: set, read back, checked; the bytes of a
    forward do not depend on it."""
    L = moe8.Layer(num_experts=4, top_k=2, hidden=32, ffn=16)
    L.init_random(3)
    x = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
    try:
        moe8.set_num_threads(1)
        assert moe8.get_num_threads() == 1
        y1, _ = L.forward(x)
        moe8.set_num_threads(2)
        assert moe8.get_num_threads() == 2
        y2, _ = L.forward(x)
        assert y1.tobytes() == y2.tobytes()
        for bad in (-1, 5000, 1.5, "2"):
            with pytest.raises(moe8.Error, match="must be an integer"):
                moe8.set_num_threads(bad)
    finally:
        moe8.set_num_threads(0)
    assert moe8.get_num_threads() >= 1


def test_mxfp4_file_from_python(model, tmp_path):
    """moe8.quantize_model under weight_qtype mxfp4: the file, loaded without
    rules, gives the bytes of the input loaded under the rule."""
    d, x = model
    rules = tmp_path / "mx.json"
    rules.write_text(json.dumps({"rules": [{"module_path": ".*", "weight_qtype": "mxfp4"}]}))
    out = tmp_path / "mx4"
    moe8.quantize_model(str(d / "m"), str(out), str(rules))
    assert json.loads((out / "config.json").read_text())["moe8_quantization"]["weight_qtype"] == "mxfp4"
    want = moe8.Layer.from_model(str(d / "m"), rules=str(rules)).forward(x, fused=True)
    got = moe8.Layer.from_model(str(out)).forward(x, fused=True)
    assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("fmt", ["moe8", "deepseek"])
def test_quantize_model_is_the_commands(model, tmp_path, fmt):
    """moe8.quantize_model writes the files `moe8 quantize` writes, byte for
    byte, reports progress, refuses an existing model without force and
    leaves it whole when it refuses."""
    d, _ = model
    q_cli, q_py = tmp_path / "cli", tmp_path / "py"
    sh("quantize", str(d / "m"), str(q_cli), "--rules", str(d / "rules.json"), "--format", fmt)
    lines = []
    moe8.quantize_model(str(d / "m"), str(q_py), str(d / "rules.json"), format=fmt, progress=lines.append)
    for f in ("config.json", "model.safetensors"):
        assert (q_cli / f).read_bytes() == (q_py / f).read_bytes(), f
    assert any(line.startswith("quantize ") and "F8_E4M3" in line for line in lines), lines
    assert lines[-1].startswith("quantize: ") and str(q_py) in lines[-1]
    before = (q_py / "model.safetensors").read_bytes()
    with pytest.raises(moe8.Error, match="already holds a model"):
        moe8.quantize_model(str(d / "m"), str(q_py), str(d / "rules.json"), format=fmt)
    with pytest.raises(moe8.Error, match="is the input model"):
        moe8.quantize_model(str(d / "m"), str(d / "m"), str(d / "rules.json"))
    with pytest.raises(moe8.Error, match="format must be"):
        moe8.quantize_model(str(d / "m"), str(q_py), str(d / "rules.json"), format="gguf")
    assert (q_py / "model.safetensors").read_bytes() == before
    moe8.quantize_model(str(d / "m"), str(q_py), str(d / "rules.json"), format=fmt, force=True)
    assert (q_py / "model.safetensors").read_bytes() == before


def test_gemma4_branch_from_python(tmp_path):
    """Gemma-4's routed branch through the package: the layer's config
    (GeGLU, the norms and scales) as the library holds it, the forward's
    bytes the command's, the four vectors' gradients in backward() and each
    of them changing the output."""
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"model_type": "gemma4_text", "enable_moe_block": True, "num_experts": 8, "top_k_experts": 2,
                               "hidden_size": 64, "moe_intermediate_size": 32, "num_hidden_layers": 1}))
    sh("init", "--config", str(cfg), "--out", str(tmp_path / "m"))
    x = np.random.default_rng(5).standard_normal((6, 64)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    sh("run", "--model", str(tmp_path / "m"), "--input", str(tmp_path / "x.npy"), "--output", str(tmp_path / "y.npy"))
    L = moe8.Layer.from_model(str(tmp_path / "m"), mode="training")
    assert (L.router_norm, L.expert_scale, L.in_norm, L.out_norm) == (True, True, True, True)
    y, _ = L.forward(x)
    assert y.tobytes() == np.load(tmp_path / "y.npy").tobytes()
    g = L.backward(x, np.ones_like(y))
    assert g["router_scale"].shape == (64,) and g["expert_scale"].shape == (8,) and g["in_norm"].shape == (64,)
    assert g["out_norm"].shape == (64,)
    for name in ("router_scale", "expert_scale", "in_norm", "out_norm"):
        w = L.weight(name)
        keep = w.copy()
        w[:] = keep * 1.5 + 0.1
        y2, _ = L.forward(x)
        w[:] = keep
        assert not np.array_equal(y2, y), name
