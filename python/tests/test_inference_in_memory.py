"""Layer.inference_from_experts: the lean inference layer from weights in
memory (no file), the same bytes as a prepared training layer holding the
same weights; and patch / from_hf(inference=True) built with it, writing
no temporary files."""
import gc
import os
import tempfile
import time
import weakref

import numpy as np
import pytest

import moe8

D, F, E, K, FS = 64, 32, 8, 2, 48
RULES = {None: None,
         "f8": {"rules": [{"module_path": ".*", "weight_qtype": "float8_e4m3fn", "act_qtype": "float8_e4m3fn", "tile_size": 32}]},
         "i8": {"rules": [{"module_path": r"layers\.1\.", "weight_qtype": "int8", "act_qtype": "int8", "tile_size": 32}]},
         "f8w": {"rules": [{"module_path": ".*", "weight_qtype": "float8_e4m3fn"}]}}


def _training(rules, shared, path):
    cfg = dict(num_experts=E, top_k=K, hidden=D, ffn=F, norm_topk_prob=True)
    if shared:
        cfg.update(shared_ffn=FS, shared_gate=True)
    lay = moe8.Layer(rules=rules, module_path=path, **cfg)
    lay.init_random(3)
    return lay, cfg


@pytest.mark.parametrize("shared", [False, True], ids=["no_shared", "shared"])
@pytest.mark.parametrize("rules", list(RULES), ids=[str(k) for k in RULES])
def test_inference_from_experts_is_a_prepared_training_layers_bytes(rules, shared):
    path = "model.layers.1.mlp.experts"
    train, cfg = _training(RULES[rules], shared, path)
    g, u, d = (train.weight_copy(n) for n in ("gate", "up", "down"))
    weights = {"router": train.weight_copy("router")}
    sh = None
    if shared:
        weights["shared_gate_w"] = train.weight_copy("shared_gate_w")
        sh = (np.concatenate([train.weight_copy("shared_gate"), train.weight_copy("shared_up")], 1), train.weight_copy("shared_down"))
    asked = []

    def expert(e):  # one at a time: the previous expert's arrays are already released
        assert all(r() is None for r in asked), "an earlier expert's arrays are still held"
        gu, dn = np.concatenate([g[e], u[e]], 1), d[e].copy()
        asked.append(weakref.ref(gu))
        return gu, dn

    got = moe8.Layer.inference_from_experts(expert, rules=RULES[rules], module_path=path, weights=weights, shared=sh, **cfg)
    assert len(asked) == E
    assert "inference" in got.describe()
    assert got.weight_copy("gate") is None  # no expert masters
    again = moe8.Layer.inference_from_experts([(np.concatenate([g[e], u[e]], 1), d[e]) for e in range(E)], rules=RULES[rules],
                                              module_path=path, weights=weights, shared=sh, **cfg)
    train.prepare()
    rng = np.random.default_rng(0)
    for T in (29, 3):
        x = rng.standard_normal((T, D)).astype(np.float32)
        want = train.forward(x, fused=True)
        assert np.array_equal(got.forward(x, fused=True).view(np.uint32), want.view(np.uint32))
        assert np.array_equal(again.forward(x, fused=True).view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("rules", list(RULES), ids=[str(k) for k in RULES])
def test_ungated_relu2_from_experts(rules):
    """Nemotron-H's ungated experts (act "relu2"): no gate weight or
    gradient; inference_from_experts takes each expert's up [D, F] alone
    (and the shared expert's) and gives the prepared training layer's bytes."""
    path = "model.layers.1.mlp.experts"
    cfg = dict(num_experts=E, top_k=K, hidden=D, ffn=F, norm_topk_prob=True, score="sigmoid", act="relu2", shared_ffn=FS)
    train = moe8.Layer(rules=RULES[rules], module_path=path, **cfg)
    train.init_random(5)
    assert train.act == "relu2" and train.weight_copy("gate") is None and train.weight_copy("shared_gate") is None
    x = np.random.default_rng(1).standard_normal((9, D)).astype(np.float32)
    train.forward(x)
    g = train.backward(x, np.ones_like(x))
    assert "gate" not in g and "shared_gate" not in g and g["up"].shape == (E, D, F) and np.isfinite(g["up"]).all()
    u, d = train.weight_copy("up"), train.weight_copy("down")
    sh = (train.weight_copy("shared_up"), train.weight_copy("shared_down"))
    got = moe8.Layer.inference_from_experts([(u[e], d[e]) for e in range(E)], rules=RULES[rules], module_path=path,
                                            weights={"router": train.weight_copy("router")}, shared=sh, **cfg)
    with pytest.raises(moe8.Error, match="shape"):  # gate|up [D, 2F] is a gated expert's
        moe8.Layer.inference_from_experts([(np.zeros((D, 2 * F), np.float32), d[e]) for e in range(E)], module_path=path,
                                          weights={"router": train.weight_copy("router")}, shared=sh, **cfg)
    train.prepare()
    for T in (29, 3):
        x = np.random.default_rng(T).standard_normal((T, D)).astype(np.float32)
        assert np.array_equal(got.forward(x, fused=True).view(np.uint32), train.forward(x, fused=True).view(np.uint32))


def test_inference_from_experts_refusals():
    cfg = dict(num_experts=E, top_k=K, hidden=D, ffn=F)
    one = (np.zeros((D, 2 * F), np.float32), np.zeros((F, D), np.float32))
    router = {"router": np.zeros((D, E), np.float32)}
    with pytest.raises(moe8.Error, match="gave 3 experts"):
        moe8.Layer.inference_from_experts([one] * 3, weights=router, **cfg)
    with pytest.raises(moe8.Error, match="more than"):
        moe8.Layer.inference_from_experts([one] * (E + 1), weights=router, **cfg)
    with pytest.raises(moe8.Error, match="router"):
        moe8.Layer.inference_from_experts([one] * E, **cfg)
    with pytest.raises(moe8.Error, match="shape"):
        moe8.Layer.inference_from_experts([(one[1], one[0])] * E, weights=router, **cfg)
    with pytest.raises(moe8.Error, match="shared"):
        moe8.Layer.inference_from_experts([one] * E, weights=router, shared_ffn=16, **cfg)
    bad = (np.full((D, 2 * F), np.nan, np.float32), one[1])
    with pytest.raises(moe8.Error, match="expert"):
        moe8.Layer.inference_from_experts(lambda e: bad if e == 5 else one, weights=router, **cfg)


def _no_temporary_files(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("the inference path made a temporary file or directory")
    for name in ("mkdtemp", "mkstemp", "TemporaryDirectory", "NamedTemporaryFile", "TemporaryFile", "SpooledTemporaryFile"):
        monkeypatch.setattr(tempfile, name, refuse)


def test_patch_inference_writes_no_temporary_files(monkeypatch):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (apt-get install python3-torch): the torch tests are skipped")
    from moe8.torch import patch
    import test_torch_inference as ti
    before = set(os.listdir(tempfile.gettempdir()))
    train, infer = ti._models(torch.bfloat16)
    patch(train, ti.F8, inference=False)
    _no_temporary_files(monkeypatch)
    infer.eval()
    t0 = time.perf_counter()
    assert patch(infer, ti.F8) == ti.LAYERS
    dt = time.perf_counter() - t0
    print("patch (inference, %d blocks of E=%d D=%d F=%d): %.4f s" % (ti.LAYERS, ti.E, ti.D, ti.F, dt))
    assert all(layer["mlp"].moe.inference_only for layer in infer.layers)
    assert ti._expert_sized(infer) == []
    x = torch.randn(2, 7, ti.D).to(torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(infer(x).view(torch.int16), train(x).view(torch.int16))
    gc.collect()
    assert not [n for n in set(os.listdir(tempfile.gettempdir())) - before if n.startswith("moe8-")]


def test_experts_hook_builds_a_lean_layer_when_not_training():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (apt-get install python3-torch): the torch tests are skipped")
    from moe8._torch_op import transformers_experts_forward

    class Experts(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_up_proj = torch.nn.Parameter(torch.randn(E, 2 * F, D) * D ** -0.5)
            self.down_proj = torch.nn.Parameter(torch.randn(E, D, F) * F ** -0.5)

    torch.manual_seed(0)
    m = Experts()
    x = torch.randn(11, D)
    ids = torch.randint(0, E, (11, K))
    w = torch.rand(11, K)
    with torch.no_grad():
        m.train()
        with torch.enable_grad():
            want = transformers_experts_forward(m, x, ids, w)
        full = m.__dict__["_moe8_experts"][1]
        assert full.weight_copy("gate") is not None
        m.eval()
        got = transformers_experts_forward(m, x, ids, w)
        lean = m.__dict__["_moe8_experts"][1]
    assert lean is not full and lean.weight_copy("gate") is None  # no f32 masters
    assert torch.equal(got, want)


def _capacity_ref(x, wr, br, up, down, cap, seq, mutate=None):
    """SwitchTransformers' block in float64 (its Top1Router and experts):
    top-1 of softmax(x Wr + b) weighted by its probability; in each sequence
    of seq rows (None: all), a token past the first cap that chose its
    expert is dropped (output 0); experts down(relu(up x)).  mutate
    "global": the count over all rows (not the model's rule)."""
    T = x.shape[0]
    S = T if seq is None or mutate == "global" else seq
    p = np.exp(x @ wr + br - (x @ wr + br).max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    idx, w = p.argmax(1), p.max(1)
    out, dropped = np.zeros_like(x), 0
    for b in range(T // S):
        n = np.zeros(wr.shape[1], dtype=np.int64)
        for t in range(b * S, (b + 1) * S):
            n[idx[t]] += 1
            if n[idx[t]] > cap:
                dropped += 1
                continue
            out[t] = w[t] * (np.maximum(x[t] @ up[idx[t]], 0.0) @ down[idx[t]])
    return out, dropped


@pytest.mark.parametrize("rules", [None, "i8"], ids=["f32", "i8"])
def test_expert_capacity_per_sequence(rules):
    """expert_capacity (SwitchTransformers'): counted per sequence of
    forward()'s seq_len rows; a dropped token's row is +0.0; the fused path
    gives the forward's bytes; a count over all rows (not the rule) is told
    apart; seq_len not dividing T, the backward and the trainer refused."""
    path = "model.layers.1.mlp.experts"
    cfg = dict(num_experts=4, top_k=1, hidden=D, ffn=F, act="relu", router_bias=True, expert_capacity=2)
    lay = moe8.Layer(rules=RULES[rules], module_path=path, **cfg)
    lay.init_random(7)
    lay.weight("router_bias")[:] = np.array([0.3, -0.2, 0.1, 0.0], np.float32)
    assert lay.expert_capacity == 2
    x = np.random.default_rng(2).standard_normal((24, D)).astype(np.float32)
    wr, br, up, dn = (lay.weight_copy(n).astype(np.float64) for n in ("router", "router_bias", "up", "down"))
    for seq in (6, None):
        got, _ = lay.forward(x, seq_len=seq)
        ref, dropped = _capacity_ref(x.astype(np.float64), wr, br, up, dn, 2, seq)
        assert 0 < dropped < 24
        zero = np.all(ref == 0.0, axis=1)
        assert np.all(got[zero] == 0.0) and not np.signbit(got[zero]).any()
        if rules is None:
            assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max()
        else:  # int8 activations and weights: the routing (f32) and the dropped rows are the rule's
            assert np.array_equal(np.all(got == 0.0, axis=1), zero)
        if seq:
            wrong = _capacity_ref(x.astype(np.float64), wr, br, up, dn, 2, seq, mutate="global")[0]
            assert not np.array_equal(np.all(got == 0.0, axis=1), np.all(wrong == 0.0, axis=1))
        lay.prepare()
        assert np.array_equal(lay.forward(x, fused=True, seq_len=seq).view(np.uint32), got.view(np.uint32))
    with pytest.raises(moe8.Error, match="seq_len"):
        lay.forward(x, seq_len=5)
    lay.forward(x, seq_len=6)
    with pytest.raises(moe8.Error, match="expert_capacity"):
        lay.backward(x, np.ones_like(x))
    with pytest.raises(moe8.Error, match="expert_capacity"):
        moe8.Layer(expert_capacity=2, zero_experts=1, **{k: v for k, v in cfg.items() if k != "expert_capacity"})


def _zaya_ref(x, lay, state):
    """Zaya's block in float64 (its ZayaRouter, ZayaRouterMLP, ZayaExperts)
    from the layer's own weights (x @ W layout): s = x A + a (+ state * c),
    RMSNorm, two Linear + exact GELU, the logits over E + 1 classes, the
    top-1 of softmax + bias weighted by its probability; class E adds
    nothing.  Returns (y, s, chosen)."""
    import math
    w = {n: lay.weight_copy(n).astype(np.float64) for n in ("router_down", "router_down_bias", "router_mlp_norm", "router_fc1",
                                                              "router_fc1_bias", "router_fc2", "router_fc2_bias", "router", "bias",
                                                              "gate", "up", "down")}
    gelu = np.vectorize(lambda v: 0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0))))
    s = x @ w["router_down"] + w["router_down_bias"]
    if state is not None:
        s = s + state * lay.weight_copy("router_state_scale")
    u = s / np.sqrt(np.mean(s * s, axis=1, keepdims=True) + 1e-5) * w["router_mlp_norm"]
    v = gelu(gelu(u @ w["router_fc1"] + w["router_fc1_bias"]) @ w["router_fc2"] + w["router_fc2_bias"])
    lg = v @ w["router"]
    p = np.exp(lg - lg.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    idx = np.argmax(p + w["bias"], axis=1)
    y = np.zeros_like(x)
    for t, e in enumerate(idx):
        if e < lay.num_experts:
            g, up = x[t] @ w["gate"][e], x[t] @ w["up"][e]
            y[t] = p[t, e] * ((g / (1.0 + np.exp(-g)) * up) @ w["down"][e])
    return y, s, idx


def test_zaya_router_state():
    """Zaya's MLP router (router_mlp, router_state, skip_experts): forward
    returns the router state, which the next layer takes; fused gives the
    same bytes; against a float64 block; the missing state, an unwanted
    one and the backward refused by name."""
    cfg = dict(num_experts=4, top_k=1, hidden=D, ffn=F, use_selection_bias=True, router_mlp=16, skip_experts=1, rms_eps=1e-5)
    lays = [moe8.Layer(module_path="model.layers.%d.mlp.experts" % l, router_state=l > 0, **cfg) for l in range(2)]
    rng = np.random.default_rng(5)
    for l, lay in enumerate(lays):
        lay.init_random(11 + l)
        lay.weight("router")[:] *= 4.0
        lay.weight("bias")[:] = [0.0, 0.01, -1.0, 0.0, 0.03]  # expert 2 never chosen, the skip class sometimes
        for n in ("router_down_bias", "router_fc1_bias", "router_fc2_bias"):
            lay.weight(n)[:] = 0.3 * rng.standard_normal(16)
        assert lay.router_mlp == 16 and lay.skip_experts == 1 and lay.router_state == (l > 0)
    assert lays[0].weight_copy("router_state_scale") is None and lays[0].weight("router").shape == (16, 5)
    x = rng.standard_normal((2, 21, D)).astype(np.float32)
    y0, _, s0 = lays[0].forward(x[0])
    y1, _, s1 = lays[1].forward(x[1], router_state=s0)
    skipped = 0
    for l, (y, s, st) in enumerate(((y0, s0, None), (y1, s1, s0))):
        ref, rs, idx = _zaya_ref(x[l].astype(np.float64), lays[l], None if st is None else st.astype(np.float64))
        assert np.abs(y - ref).max() <= 1e-5 * np.abs(ref).max() and np.abs(s - rs).max() <= 1e-5 * np.abs(rs).max()
        assert not (idx == 2).any() and np.all(y[idx == 4] == 0.0)
        skipped += int((idx == 4).sum())
    assert 0 < skipped < 42
    for lay in lays:
        lay.prepare()
    f1, fs1 = lays[1].forward(x[1], fused=True, router_state=s0)
    assert np.array_equal(f1.view(np.uint32), y1.view(np.uint32)) and np.array_equal(fs1.view(np.uint32), s1.view(np.uint32))
    with pytest.raises(moe8.Error, match=r"model\.layers\.1\.mlp\.experts.*router state"):
        lays[1].forward(x[1])
    with pytest.raises(moe8.Error, match="takes no router state"):
        lays[0].forward(x[0], router_state=s0)
    with pytest.raises(moe8.Error, match="router_state"):
        lays[1].forward(x[1], router_state=s0[:, :8])
    with pytest.raises(moe8.Error, match="MLP router"):
        lays[1].forward(x[1], router_state=s0)
        lays[1].backward(x[1], np.ones_like(y1))
    with pytest.raises(moe8.Error, match="no MLP router"):
        moe8.Layer(num_experts=4, top_k=1, hidden=D, ffn=F).forward(x[0], router_state=s0)
