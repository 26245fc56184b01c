"""torch.ops.moe8.experts (docs/integration.md, "As the expert op of a
serving stack"): the layer's experts on tokens the caller routed, as a
PyTorch operator; the vLLM and KTransformers call shapes; torch.compile.
Skipped with a notice where torch is absent."""
import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (apt-get install python3-torch): the torch tests are skipped")
import moe8  # noqa: E402
from moe8.torch import KExperts, experts, fused_experts, register_layer, unregister_layer  # noqa: E402

E, K, D, F, FS, T = 8, 2, 32, 16, 16, 7
F8 = {"rules": [{"module_path": ".*", "weight_qtype": "float8_e4m3fn", "act_qtype": "float8_e4m3fn", "tile_size": 16}]}


def _layer(shared_ffn=FS, rules=None, seed=3, **kw):
    L = moe8.Layer(num_experts=E, top_k=K, hidden=D, ffn=F, shared_ffn=shared_ffn, rules=rules, norm_topk_prob=True, **kw)
    L.init_random(seed)
    L.prepare()
    return L


def _routing(seed=0, T=T):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, D, generator=g)
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    w = torch.rand(T, K, generator=g)
    return x, ids, w


@pytest.mark.parametrize("rules", [None, F8])
def test_op_is_the_layers_experts_bytes(rules):
    L = _layer(rules=rules)
    h = register_layer(L)
    x, ids, w = _routing()
    y = torch.ops.moe8.experts(x, ids, w, h)
    assert y.dtype == torch.float32 and tuple(y.shape) == (T, D)
    assert np.array_equal(y.numpy(), L.experts(x.numpy(), ids.numpy(), w.numpy()))
    assert register_layer(L) == h  # the same layer, the same handle


def test_op_equals_the_routing_path():
    """Given the ids and weights the layer's router picks, the op gives the
    forward's bytes.  A zero router scores every expert alike: top-2 of 8
    is experts 0 and 1, each with weight 1/2 after renormalization."""
    L = _layer()
    L.weight("router")[:] = 0
    L.prepare()
    x = torch.randn(T, D)
    want = L.forward(x.numpy(), fused=True)
    for ids in ([0, 1], [1, 0]):
        got = torch.ops.moe8.experts(x, torch.tensor([ids] * T), torch.full((T, K), 0.5), register_layer(L))
        assert np.array_equal(got.numpy(), want)
    # a random router: the same within f32 noise (the routing computed here in float64)
    L = _layer(seed=5)
    x = torch.randn(T, D)
    logits = x.double() @ torch.from_numpy(L.weight_copy("router")).double()
    w, ids = torch.topk(torch.softmax(logits, -1), K, -1)
    w = (w / w.sum(-1, keepdim=True)).float()
    got = torch.ops.moe8.experts(x, ids, w, register_layer(L))
    want = torch.from_numpy(L.forward(x.numpy(), fused=True))
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()


def test_dtypes_bf16_and_int32_int64_ids():
    L = _layer()
    h = register_layer(L)
    x, ids, w = _routing(1)
    ref = torch.ops.moe8.experts(x, ids, w, h)
    assert torch.equal(torch.ops.moe8.experts(x, ids.to(torch.int32), w, h), ref)
    assert torch.equal(torch.ops.moe8.experts(x, ids.to(torch.int64), w, h), ref)
    xb, wb = x.bfloat16(), w.bfloat16()
    yb = torch.ops.moe8.experts(xb, ids.to(torch.int32), wb, h)
    assert yb.dtype == torch.bfloat16
    # bf16 in: computed in f32 on the bf16 values, rounded to bf16 once
    want = torch.ops.moe8.experts(xb.float(), ids, wb.float(), h).bfloat16()
    assert torch.equal(yb, want)
    assert torch.equal(experts(L, xb, ids, wb), yb)  # the Python entry point, a Layer in the handle's place


def test_negative_ids_are_skipped():
    L = _layer()
    h = register_layer(L)
    x, ids, w = _routing(2)
    skip = ids.clone()
    skip[::2, 1] = -1
    skip[3, :] = -7
    zero = w.clone()
    zero[skip < 0] = 0
    assert torch.equal(torch.ops.moe8.experts(x, skip, w, h), torch.ops.moe8.experts(x, ids, zero, h))
    with pytest.raises(moe8.Error):
        torch.ops.moe8.experts(x, torch.full((T, K), E), w, h)  # an id >= E is an error
    with pytest.raises(moe8.Error):
        torch.ops.moe8.experts(x, torch.full((T, K), -(2 ** 40)), w, h)  # would wrap in int32


def test_out_is_written():
    L = _layer()
    h = register_layer(L)
    x, ids, w = _routing(3)
    ref = torch.ops.moe8.experts(x, ids, w, h)
    out = torch.full((T, D), 7.0)
    r = torch.ops.moe8.experts(x, ids, w, h, out=out)
    assert r.data_ptr() == out.data_ptr() and torch.equal(out, ref)
    outb = torch.empty(T, D, dtype=torch.bfloat16)
    torch.ops.moe8.experts(x, ids, w, h, out=outb)
    assert torch.equal(outb, ref.bfloat16())
    # vLLM's inplace=True: the result replaces hidden_states
    xi = x.clone()
    assert fused_experts(L, xi, w, ids, inplace=True) is xi and torch.equal(xi, ref)
    assert torch.equal(fused_experts(h, x, w, ids), ref)
    # vLLM's expert_map: global ids (16 experts, this rank holds 8..15) to the layer's own, -1 skipped
    emap = torch.full((2 * E,), -1, dtype=torch.int32)
    emap[E:] = torch.arange(E, dtype=torch.int32)
    gids = ids + E
    gids[0, 0] = 1  # another rank's expert
    skip = ids.clone()
    skip[0, 0] = -1
    got = fused_experts(L, x, w, gids, global_num_experts=2 * E, expert_map=emap)
    assert torch.equal(got, torch.ops.moe8.experts(x, skip, w, h))
    with pytest.raises(ValueError):
        fused_experts(L, x, w, ids, activation="gelu")


def test_shared_expert_left_out():
    L = _layer()
    h = register_layer(L)
    x, ids, w = _routing(4)
    full = torch.ops.moe8.experts(x, ids, w, h)
    shared = torch.ops.moe8.experts(x, torch.full_like(ids, -1), w, h)  # every slot skipped: the shared expert alone
    routed = torch.ops.moe8.experts(x, ids, w, h, False)
    assert shared.abs().max() > 0
    assert (routed - (full - shared)).abs().max() <= 1e-5 * full.abs().max()
    # a layer without a shared expert, same routed experts: the same bytes
    # (the shared expert is not computed, not taken off)
    N = _layer(shared_ffn=0)
    for n in ("router", "gate", "up", "down"):
        N.weight(n)[:] = L.weight_copy(n)
    N.prepare()
    want = torch.ops.moe8.experts(x, ids, w, register_layer(N))
    assert torch.equal(routed, want)
    assert torch.equal(torch.ops.moe8.experts(x, ids, w, register_layer(N), False), want)  # nothing to leave out
    out = torch.empty_like(want)
    torch.ops.moe8.experts(x.bfloat16(), ids, w, h, False, out=out)
    assert torch.equal(out, torch.ops.moe8.experts(x.bfloat16().float(), ids, w, register_layer(N)))  # out= f32: not rounded


def test_ktransformers_shape_and_registry():
    L = _layer()
    x, ids, w = _routing(5)
    k = KExperts(L)
    assert torch.equal(k(x.bfloat16(), ids, w), experts(L, x.bfloat16(), ids, w))
    h = register_layer(L)
    unregister_layer(h)
    with pytest.raises(KeyError):
        torch.ops.moe8.experts(x, ids, w, h)


def test_meta_and_fake_shapes():
    L = _layer()
    h = register_layer(L)
    x, ids, w = _routing(6)
    y = torch.ops.moe8.experts(x.bfloat16().to("meta"), ids.to("meta"), w.to("meta"), h)
    assert y.device.type == "meta" and y.dtype == torch.bfloat16 and tuple(y.shape) == (T, D)


def test_torch_compile_fullgraph():
    if not hasattr(torch, "compile"):
        print("torch %s has no torch.compile: the fullgraph trace test is skipped" % torch.__version__)
        pytest.skip("torch %s has no torch.compile (torch >= 2.0 needed): the fullgraph trace is not tested" % torch.__version__)
    L = _layer()

    class Experts(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.handle = register_layer(L)
            self.router = torch.nn.Linear(D, E, bias=False)

        def forward(self, x):
            w, ids = torch.topk(torch.softmax(self.router(x), -1), K, -1)
            return torch.ops.moe8.experts(x, ids, w / w.sum(-1, keepdim=True), self.handle) * 2

    m = Experts()
    x = torch.randn(T, D)
    with torch.no_grad():
        want = m(x)
        got = torch.compile(m, fullgraph=True, backend="eager")(x)
        got2 = torch.compile(m, fullgraph=True, backend="aot_eager")(x)
    assert torch.equal(got, want)
    assert torch.equal(got2, want)


# ---- the experts forms of transformers' experts classes, without transformers -----------------------
class _Experts(torch.nn.Module):
    """A stand-in for a transformers experts class (the attributes its
    @use_experts_implementation decorator and __init__ set), its eager
    forward the class's math in float64."""

    def __init__(self, name, gate, transposed=False, interleaved=False, bias=False, **attrs):
        super().__init__()
        g = torch.Generator().manual_seed(len(name))
        shape_gu, shape_dn = ((E, D, 2 * F), (E, F, D)) if transposed else ((E, 2 * F, D), (E, D, F))
        self.gate_up_proj = torch.nn.Parameter(torch.randn(*shape_gu, generator=g) * 0.4)
        self.down_proj = torch.nn.Parameter(torch.randn(*shape_dn, generator=g) * 0.4)
        if bias:
            self.gate_up_proj_bias = torch.nn.Parameter(torch.randn(E, 2 * F, generator=g) * 0.5)
            self.down_proj_bias = torch.nn.Parameter(torch.randn(E, D, generator=g) * 0.5)
        self.has_gate, self.has_bias, self.has_post_expert_norm = True, bias, False
        self.is_transposed, self.is_concatenated, self._is_expert_parallel = transposed, not interleaved, False
        self.gate_fn = gate
        for k, v in attrs.items():
            setattr(self, k, v)

    def _apply_gate(self, gu):
        return self.gate_fn(self, gu)

    def reference(self, x, ids, w):
        out = torch.zeros(x.shape[0], D, dtype=torch.float64)
        gu_all, dn_all = self.gate_up_proj.detach().double(), self.down_proj.detach().double()
        for t in range(x.shape[0]):
            for j in range(ids.shape[1]):
                e = int(ids[t, j])
                gu = x[t].double() @ (gu_all[e] if self.is_transposed else gu_all[e].t())
                if self.has_bias:
                    gu = gu + self.gate_up_proj_bias[e].detach().double()
                h = self._apply_gate(gu)
                y = h @ (dn_all[e] if self.is_transposed else dn_all[e].t())
                if self.has_bias:
                    y = y + self.down_proj_bias[e].detach().double()
                out[t] += float(w[t, j]) * y
        return out


def _split(gu, interleaved):
    return (gu[..., 0::2], gu[..., 1::2]) if interleaved else gu.chunk(2, dim=-1)


def _clamped(m, gu):  # GPT-OSS's _apply_gate (its alpha and limit attribute names vary by class)
    a, l = (m.alpha, m.limit) if hasattr(m, "alpha") else (m.swiglu_alpha, m.swiglu_limit)
    g, u = _split(gu, not m.is_concatenated)
    g, u = g.clamp(max=l), u.clamp(min=-l, max=l)
    return (u + 1) * g * torch.sigmoid(g * a)


def _limited(m, gu):  # GLM-5 / HY-V4 / DeepSeek-V4
    lim = getattr(m, "swiglu_limit", getattr(m, "limit", None))
    g, u = gu.chunk(2, dim=-1)
    return torch.nn.functional.silu(g.clamp(max=lim)) * u.clamp(min=-lim, max=lim)


class _Cap(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.softcap = c


class _Softcapped(torch.nn.Module):  # Inkling-2's act_fn
    def __init__(self, cg, cu):
        super().__init__()
        self.gate_softcap, self.up_softcap = _Cap(cg), _Cap(cu)


def _softcap(m, gu):
    g, u = gu.chunk(2, dim=-1)
    cg, cu = m.act_fn.gate_softcap.softcap, m.act_fn.up_softcap.softcap
    return cg * torch.tanh(g / cg) * torch.sigmoid(g) * cu * torch.tanh(u / cu)


def _form(name):
    """The stand-in of transformers' experts class `name` (limits small
    enough to bind on the test's pre-activations)."""
    if name in ("GptOssExperts", "OpenAIPrivacyFilterExperts"):
        return _Experts(name, _clamped, transposed=True, interleaved=name == "GptOssExperts", bias=True, alpha=1.702, limit=0.9)
    if name == "MiniMaxM3VLExperts":
        return _Experts(name, _clamped, swiglu_alpha=1.5, swiglu_limit=0.8)
    if name == "DeepseekV4Experts":
        return _Experts(name, _limited, limit=0.7, act_fn=torch.nn.SiLU())
    if name == "Glm5NextTextExperts":
        return _Experts(name, _limited, swiglu_limit=0.6)
    if name == "Inkling2Experts":
        return _Experts(name, _softcap, act_fn=_Softcapped(0.9, 1.1))
    raise KeyError(name)


@pytest.mark.parametrize("name", ["GptOssExperts", "OpenAIPrivacyFilterExperts", "MiniMaxM3VLExperts", "DeepseekV4Experts",
                                  "Glm5NextTextExperts", "Inkling2Experts"])
def test_experts_forms_of_transformers_classes(name):
    """experts_implementation="moe8" on the experts classes whose own
    _apply_gate is one of moe8's activations (GPT-OSS's clamped SwiGLU with
    its alternating gate/up columns and expert biases, MiniMax-M3's in
    halves, the limited SwiGLU, Inkling-2's softcapped SwiGLU): the
    class's math in float64 to f32 noise, lean (no grad) and training
    layers alike, and each form's parameter matters (a mutation moves the
    output).  The module is a stand-in named as transformers' class."""
    from moe8._torch_op import transformers_experts_forward
    cls = type(name, (_Experts,), {"_apply_gate": _Experts._apply_gate})
    m = _form(name)
    m.__class__ = cls
    x, ids, w = _routing(seed=5)
    want = m.reference(x, ids, w)
    top = float(want.abs().max())
    for grad in (False, True):
        m.train(grad)
        with torch.set_grad_enabled(grad):
            got = transformers_experts_forward(m, x, ids, w)
        assert got.dtype == x.dtype
        err = float((got.double() - want).abs().max())
        assert err <= 2e-6 * top, (name, grad, err, top)
    # the form's parameter is read: another limit (or cap) gives another output
    for attr in ("limit", "swiglu_limit"):
        if hasattr(m, attr):
            setattr(m, attr, getattr(m, attr) * 3)
    if name == "Inkling2Experts":
        m.act_fn.up_softcap.softcap *= 3
    m.__dict__.pop("_moe8_experts", None)
    with torch.no_grad():
        moved = transformers_experts_forward(m, x, ids, w)
    assert float((moved.double() - want).abs().max()) > 1e-3 * top


def test_experts_forms_refused_by_name():
    """An experts class moe8 cannot compute is refused naming the class and
    the reason, never run wrong: a gate function of its own, no gate
    projection (relu² experts), a norm after each expert other than
    MuSE-Spark's."""
    from moe8._torch_op import transformers_experts_forward
    x, ids, w = _routing(seed=6)
    odd = type("OddExperts", (_Experts,), {"_apply_gate": lambda self, gu: gu[..., :F] * 2})(
        "OddExperts", lambda m, gu: gu[..., :F])
    with pytest.raises(TypeError, match="cannot run OddExperts: its own gate function"):
        transformers_experts_forward(odd, x, ids, w)
    ungated = _Experts("UpOnlyExperts", _limited)
    ungated.has_gate = False
    del ungated.gate_up_proj
    ungated.up_proj = torch.nn.Parameter(torch.zeros(E, F, D))
    with pytest.raises(TypeError, match="no gate projection"):
        transformers_experts_forward(ungated, x, ids, w)
    normed = _Experts("NormedExperts", _limited)
    normed.has_post_expert_norm = True
    with pytest.raises(TypeError, match="a norm after each expert"):
        transformers_experts_forward(normed, x, ids, w)


def test_every_transformers_experts_class(tmp_path):
    """Every @use_experts_implementation experts class of the installed
    transformers, built from its configuration class's defaults shrunk to
    a small size: experts_implementation="moe8" equals the class's eager
    forward to f32 noise, or is refused naming the class and why (the
    forms moe8 does not compute: printed)."""
    transformers = _transformers_or_skip("every experts class")
    import importlib
    import inspect
    import pkgutil
    import warnings
    import transformers.models as tm
    from moe8.torch import register_transformers
    assert register_transformers()
    from moe8._hf_quant import _experts_modules, _tensors_of
    quantized = []
    small = dict(hidden_size=64, intermediate_size=32, moe_intermediate_size=32, expert_ffn_hidden_size=32, num_experts=8,
                 num_local_experts=8, n_routed_experts=8, moe_num_experts=8, num_experts_per_tok=2, moe_k=2, moe_topk=2, top_k_experts=2,
                 shared_expert_intermediate_size=32, moe_hidden_size=64)
    ran, refused = [], []
    for mi in pkgutil.iter_modules(tm.__path__):
        try:
            mod = importlib.import_module("transformers.models.%s.modeling_%s" % (mi.name, mi.name))
            cmod = importlib.import_module("transformers.models.%s.configuration_%s" % (mi.name, mi.name))
        except Exception:
            continue
        for cn, cls in inspect.getmembers(mod, inspect.isclass):
            if cls.__module__ != mod.__name__ or "Experts" not in cn or not hasattr(cls, "_apply_gate"):
                continue
            cfgs = [c for _, c in inspect.getmembers(cmod, inspect.isclass) if issubclass(c, transformers.PretrainedConfig)
                    and c.__module__ == cmod.__name__]
            cfgs.sort(key=lambda c: 0 if "Text" in c.__name__ else 1 if "Vision" not in c.__name__ and "Audio" not in c.__name__ else 2)
            module = None
            for c in cfgs:
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        cfg = c()
                    for k, v in small.items():
                        if isinstance(getattr(cfg, k, None), int):
                            setattr(cfg, k, v)
                    module = cls(cfg)
                    break
                except Exception:
                    module = None
            if module is None:
                continue  # no configuration of the package builds it alone (a composite model's part)
            torch.manual_seed(0)
            for p in module.parameters():
                torch.nn.init.normal_(p, std=0.1)
            module.eval()
            n = getattr(module, "num_experts", 8)
            x, ids, w = torch.randn(5, cfg.hidden_size), torch.randint(0, n, (5, 2)), torch.rand(5, 2)
            cfg._experts_implementation = "eager"
            with torch.no_grad():
                try:
                    want = module(x, ids, w)
                except Exception:
                    continue  # the shrunk sizes do not fit its eager forward (latent experts)
            cfg._experts_implementation = "moe8"
            try:
                with torch.no_grad():
                    got = module(x, ids, w)
            except TypeError as e:
                assert "cannot run %s" % cn in str(e), (cn, str(e))
                refused.append("%s (%s)" % (cn, str(e).split(": ", 2)[-1]))
                continue
            top = float(want.abs().max())
            assert float((got - want).abs().max()) <= 1e-5 * top, cn
            ran.append(cn)
            # moe8's quantizer (Moe8Config) takes the same module as it loads:
            # every tensor its lean layer is built from is a parameter of it
            # (MuSE-Spark's, a norm after each expert, is left to transformers)
            holder = torch.nn.Module()
            holder.experts = module
            if getattr(module, "is_concatenated", None) is not None and not getattr(module, "has_post_expert_norm", False):
                assert [n for n, _ in _experts_modules(holder)] == ["experts"], cn
                assert set(_tensors_of(module)) <= set(dict(module.named_parameters(recurse=False))), cn
                quantized.append(cn)
    print("experts_implementation=\"moe8\": %d classes ran; refused by name: %s; %d taken by moe8's quantizer"
          % (len(ran), "; ".join(refused) or "none", len(quantized)))
    assert len(ran) >= 60 and len(quantized) >= 60


def _transformers_or_skip(what):
    """transformers 5 (its ExpertsInterface and quantizer base), or a skip naming what is not tested."""
    try:
        import transformers
        from transformers.integrations.moe import ExpertsInterface  # noqa: F401
        from transformers.quantizers.base import HfQuantizer  # noqa: F401
    except ImportError:
        pytest.skip("transformers 5 is not installed: %s is not tested" % what)
    return transformers


_FP8_EXPERTS = {"rules": [{"module_path": r"layers\.[0-9]+\.mlp\.experts", "weight_qtype": "float8_e4m3fn",
                           "act_qtype": "float8_e4m3fn", "tile_size": 32}]}


def _tiny_models(transformers, mixtral_ffn=32, mixtral_experts=8):
    """Tiny Qwen3-MoE and Mixtral (class, config) pairs."""
    return [(transformers.Qwen3MoeForCausalLM, transformers.Qwen3MoeConfig(
                 vocab_size=128, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True)),
            (transformers.MixtralForCausalLM, transformers.MixtralConfig(
                 vocab_size=128, hidden_size=64, intermediate_size=mixtral_ffn, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, num_local_experts=mixtral_experts, num_experts_per_tok=2))]


def test_transformers_experts_implementation(tmp_path):
    """transformers 5's ExpertsInterface: experts_implementation="moe8" on
    tiny Qwen3-MoE and Mixtral models gives eager's logits within f32 noise
    (with an FP8 rule, within FP8 noise), from_pretrained included."""
    transformers = _transformers_or_skip("experts_implementation=\"moe8\"")
    from moe8.torch import register_transformers, set_experts_rules
    assert register_transformers()
    torch.manual_seed(0)
    rules = _FP8_EXPERTS
    models = _tiny_models(transformers)
    ids = torch.randint(0, 128, (2, 9))
    for cls, cfg in models:
        model = cls(cfg).eval()
        with torch.no_grad():
            model.set_experts_implementation("eager")
            want = model(ids).logits
            model.set_experts_implementation("moe8")
            got = model(ids).logits
            top = want.abs().max()
            assert 0 < (got - want).abs().max() <= 1e-5 * top  # moe8 ran (not eager's bytes), within f32 noise
            assert set_experts_rules(model, rules) == 2
            q = model(ids).logits
            assert 1e-5 * top < (q - want).abs().max() <= 2e-2 * top  # FP8 noise
        d = tmp_path / cls.__name__
        model.save_pretrained(d)
        m2 = cls.from_pretrained(d, experts_implementation="moe8", dtype=torch.float32).eval()
        with torch.no_grad():
            assert (m2(ids).logits - want).abs().max() <= 1e-5 * top


def test_transformers_ungated_experts():
    """Nemotron-H's ungated experts (NemotronHExperts: has_gate false,
    up_proj and down_proj, relu2 or ReLU) under experts_implementation="moe8":
    each NemotronHMoE block within f32 noise of eager's, in eval and in train
    mode (the lean and the training layer)."""
    transformers = _transformers_or_skip("experts_implementation=\"moe8\" on ungated experts")
    if not hasattr(transformers, "NemotronHConfig"):
        pytest.skip("this transformers has no NemotronH: the ungated experts are not tested")
    from moe8.torch import register_transformers
    assert register_transformers()
    torch.manual_seed(0)
    for act in ("relu2", "relu"):
        cfg = transformers.NemotronHConfig(vocab_size=100, hidden_size=64, n_routed_experts=8, num_experts_per_tok=2,
                                           moe_intermediate_size=32, moe_shared_expert_intermediate_size=48, n_group=2, topk_group=1,
                                           routed_scaling_factor=2.5, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                           mamba_num_heads=4, mamba_head_dim=16, ssm_state_size=16, n_groups=2, intermediate_size=64,
                                           mlp_hidden_act=act, hybrid_override_pattern="ME*E-")
        model = transformers.NemotronHForCausalLM(cfg).eval()
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "experts" in n or "mixer.gate" in n:
                    p.normal_(0, p.shape[-1] ** -0.5 * 1.5)
        blocks = [layer.mixer for layer in model.model.layers if type(layer.mixer).__name__ == "NemotronHMoE"]
        assert len(blocks) == 2
        x = torch.randn(1, 20, 64) * 2
        with torch.no_grad():
            model.set_experts_implementation("eager")
            want = [b(x) for b in blocks]
            model.set_experts_implementation("moe8")
            got = [b(x) for b in blocks]
        model.train()
        trained = [b(x) for b in blocks]  # grad enabled, train mode: the layer with f32 masters
        for g, t, w, b in zip(got, trained, want, blocks):
            top = w.abs().max()
            assert "_moe8_experts" in b.experts.__dict__  # moe8 ran (its layer is made)
            assert (g - w).abs().max() <= 1e-5 * top  # within f32 noise
            assert (t.detach() - w).abs().max() <= 1e-5 * top


def test_transformers_post_expert_norm(tmp_path):
    """MuSE-Spark's experts (MuseSparkExperts: a norm after each expert,
    MuseSparkTextInputScaledRMSNorm, the output times 1 + w then
    RMS-normalized) under experts_implementation="moe8": each MuseSparkMoE
    block within f32 noise of eager's in eval and in train mode (the lean
    and the training layer; its latent projections and router
    transformers' own); a weight written in place is seen on the next
    call; moe8's quantizer (Moe8Config) leaves them to transformers."""
    transformers = _transformers_or_skip("experts_implementation=\"moe8\" on MuSE-Spark's experts")
    try:
        from transformers.models.muse_spark.modeling_muse_spark import MuseSparkTextModel
    except ImportError:
        pytest.skip("this transformers has no MuSE-Spark: its experts are not tested")
    from moe8.torch import register_transformers
    assert register_transformers()
    torch.manual_seed(0)
    cfg = transformers.MuseSparkTextConfig(vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                           num_key_value_heads=2, head_dim=16, num_local_experts=8, num_experts_per_tok=3,
                                           moe_intermediate_size=32, moe_hidden_size=48, routed_scaling_factor=2.0, post_norm_eps=1e-6)
    model = MuseSparkTextModel(cfg).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".mlp." in n:
                p.normal_(0, p.shape[-1] ** -0.5 if p.dim() > 1 else 0.3)
    blocks = [layer.mlp for layer in model.layers if type(layer.mlp).__name__ == "MuseSparkMoE"]
    assert len(blocks) == 2
    x = torch.randn(1, 20, 64)
    for step in range(2):
        with torch.no_grad():
            model.set_experts_implementation("eager")
            want = [b(x) for b in blocks]
            model.set_experts_implementation("moe8")
            got = [b(x) for b in blocks]
        for g, w, b in zip(got, want, blocks):
            assert "_moe8_experts" in b.experts.__dict__  # moe8 ran (its layer is made)
            assert (g - w).abs().max() <= 1e-5 * w.abs().max()
        with torch.no_grad():  # the norm's weight changed in place: the layer is made again
            for b in blocks:
                b.experts.post_expert_norm.weight.add_(0.5)
    model.train()
    with torch.no_grad():
        model.set_experts_implementation("eager")
        want = [b(x) for b in blocks]
        model.set_experts_implementation("moe8")
    trained = [b(x) for b in blocks]  # grad enabled, train mode: the layer with f32 masters
    for t, w in zip(trained, want):
        assert (t.detach() - w).abs().max() <= 1e-5 * w.abs().max()
    # moe8's quantizer leaves them to transformers: a model with no other experts is refused by name
    from moe8.torch import Moe8Config
    model.save_pretrained(tmp_path / "muse")
    for files in (False, True):
        with pytest.raises(ValueError, match="has no experts module"):
            MuseSparkTextModel.from_pretrained(tmp_path / "muse", quantization_config=Moe8Config(rules=None, experts_from_files=files))


def test_transformers_latent_blocks(tmp_path):
    """Latent MoE blocks from their files (Layer.from_model, training mode)
    against transformers' own modules: MuseSparkMoE and NemotronHMoE with
    moe_latent_size, their forward and every gradient torch's autograd
    gives (x, the router, both projections, MuSE-Spark's norms, the
    experts) within 1e-5 of the largest (moe8 holds MuSE-Spark's router
    weight times output_multiplier: its gradient is the file weight's
    divided by it)."""
    transformers = _transformers_or_skip("latent MoE blocks against transformers")
    try:
        from transformers.models.muse_spark.modeling_muse_spark import MuseSparkTextModel
    except ImportError:
        pytest.skip("this transformers has no MuSE-Spark: the latent blocks are not tested")
    torch.manual_seed(3)
    muse = MuseSparkTextModel(transformers.MuseSparkTextConfig(
        vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, num_local_experts=8, num_experts_per_tok=3, moe_intermediate_size=32, moe_hidden_size=48, output_multiplier=0.37,
        routed_scaling_factor=2.0, post_norm_eps=1e-6))
    nem = transformers.NemotronHForCausalLM(transformers.NemotronHConfig(
        vocab_size=100, hidden_size=64, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
        moe_shared_expert_intermediate_size=48, moe_latent_size=40, n_group=2, topk_group=1, routed_scaling_factor=2.5,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, mamba_num_heads=4, mamba_head_dim=16, ssm_state_size=16, n_groups=2,
        intermediate_size=64, hybrid_override_pattern="ME"))
    for model, blk, names in ((muse, muse.layers[1].mlp, {"latent_in": "pre_expert_proj.weight", "latent_out": "post_expert_proj.weight",
                                                          "latent_norm": "pre_expert_norm.weight",
                                                          "expert_out_norm": "experts.post_expert_norm.weight"}),
                              (nem, nem.model.layers[1].mixer, {"latent_in": "fc1_latent_proj.weight", "latent_out": "fc2_latent_proj.weight"})):
        with torch.no_grad():
            for n, p in blk.named_parameters():
                p.normal_(0, p.shape[-1] ** -0.5 if p.dim() > 1 else 0.3)
        d = tmp_path / type(model).__name__
        model.float().save_pretrained(d)
        x = torch.randn(20, 64, requires_grad=True)
        y = blk(x[None])[0]
        g = torch.randn_like(y)
        (y * g).sum().backward()
        lay = moe8.Layer.from_model(str(d), layer=1, mode="training")
        got, _ = lay.forward(x.detach().numpy())
        assert np.abs(got - y.detach().numpy()).max() <= 1e-5 * float(y.detach().abs().max())
        gr = lay.backward(x.detach().numpy(), g.numpy())
        mult = getattr(blk.gate, "output_multiplier", 1.0)
        want = {"dx": x.grad, "router": blk.gate.weight.grad.T / mult}
        for k, n in names.items():
            t = blk.get_parameter(n).grad
            want[k] = t.T if t.dim() == 2 else t
        if hasattr(blk.experts, "gate_up_proj"):
            F = blk.experts.gate_up_proj.shape[1] // 2
            want["gate"], want["up"] = blk.experts.gate_up_proj.grad[:, :F].transpose(1, 2), blk.experts.gate_up_proj.grad[:, F:].transpose(1, 2)
        else:
            want["up"] = blk.experts.up_proj.grad.transpose(1, 2)
        want["down"] = blk.experts.down_proj.grad.transpose(1, 2)
        for k, w in want.items():
            w = w.detach().numpy()
            assert np.abs(gr[k] - w).max() <= 1e-5 * np.abs(w).max(), (type(model).__name__, k)


def test_transformers_zaya_blocks(tmp_path):
    """Zaya's blocks from their files (Layer.from_model, inference and
    training loads) against transformers' ZayaSparseMoeBlock: three layers,
    each fed the previous layer's router state (moe8's own, as a caller
    chains them), every router weight and balancing_biases drawn away from
    their initial values so that the skip class is chosen by some tokens
    and an expert by none; outputs and states within 1e-5 of the largest;
    the fused path gives the unfused bytes."""
    transformers = _transformers_or_skip("Zaya's blocks against transformers")
    if not hasattr(transformers, "ZayaConfig"):
        pytest.skip("this transformers has no Zaya: its blocks are not tested")
    torch.manual_seed(4)
    R, NL = 24, 3
    cfg = transformers.ZayaConfig(vocab_size=64, hidden_size=64, num_hidden_layers=NL, num_attention_heads=2, num_key_value_heads=1,
                                  head_dim=32, moe_intermediate_size=48, num_experts=6, router_hidden_size=R, eos_token_id=1)
    model = transformers.ZayaForCausalLM(cfg).eval()
    with torch.no_grad():
        for l, layer in enumerate(model.model.layers):
            g = layer.mlp.gate
            for p in g.parameters():
                p.copy_(torch.randn_like(p) * (0.1 if p.dim() == 1 else p.shape[-1] ** -0.5))
            g.router_mlp.norm.weight.copy_(1.0 + 0.3 * torch.randn(R))
            g.router_mlp.out_proj.weight.mul_(4.0)
            g.balancing_biases.copy_(torch.tensor([0.0, 0.01, -1.0, 0.02, 0.0, 0.01, (0.02, 0.0, 0.04)[l]]))
            layer.mlp.experts.gate_up_proj.normal_(0, 64 ** -0.5)
            layer.mlp.experts.down_proj.normal_(0, 48 ** -0.5)
    model.save_pretrained(tmp_path / "zaya")
    x = torch.randn(NL, 1, 37, 64)
    state, chosen = None, set()
    for l in range(NL):
        blk = model.model.layers[l].mlp
        with torch.no_grad():
            y, s = blk(x[l], None if state is None else torch.from_numpy(state)[None])
            logits = blk.gate.router_mlp(s)  # s: what the router's MLP read (the layer's state)
        y, s = y[0].numpy(), s[0].numpy()
        chosen |= set((torch.softmax(logits, -1) + blk.gate.balancing_biases).argmax(-1).flatten().tolist())
        lay = moe8.Layer.from_model(str(tmp_path / "zaya"), layer=l)
        got, st = lay.forward(x[l, 0].numpy(), fused=True, router_state=state)
        assert np.abs(got - y).max() <= 1e-5 * np.abs(y).max() and np.abs(st - s).max() <= 1e-5 * np.abs(s).max(), l
        tr = moe8.Layer.from_model(str(tmp_path / "zaya"), layer=l, mode="training")
        got2, _, st2 = tr.forward(x[l, 0].numpy(), router_state=state)
        assert np.array_equal(got2, got) and np.array_equal(st2, st)
        state = st
    assert 6 in chosen and 2 not in chosen  # the skip class chosen, expert 2 never


def test_transformers_quantizer(tmp_path):
    """transformers' quantizer plug-in: from_pretrained(...,
    quantization_config=Moe8Config(rules)) on bf16 Qwen3-MoE and Mixtral
    checkpoints keeps no float expert tensor (each experts module holds
    empty tensors and its lean moe8 layer), gives the bytes of the same
    checkpoint loaded by transformers then run through
    experts_implementation="moe8" under the same rules, and refuses
    training and a later change of rules by name."""
    transformers = _transformers_or_skip("the moe8 quantizer")
    from moe8.torch import register_transformers, set_experts_rules
    assert register_transformers()
    from moe8.torch import Moe8Config
    torch.manual_seed(1)
    rules = _FP8_EXPERTS
    models = _tiny_models(transformers, mixtral_ffn=48, mixtral_experts=6)
    ids = torch.randint(0, 128, (2, 7))
    for cls, cfg in models:
        d = tmp_path / cls.__name__
        cls(cfg).to(torch.bfloat16).save_pretrained(d)
        for r in (None, rules):
            ref = cls.from_pretrained(d, experts_implementation="moe8").eval()
            set_experts_rules(ref, r)
            q = transformers.AutoModelForCausalLM.from_pretrained(d, quantization_config=Moe8Config(rules=r))
            assert not q.training
            experts = [(n, m) for n, m in q.named_modules() if n.endswith("mlp.experts")]
            assert len(experts) == 2
            for n, m in experts:
                assert m.gate_up_proj.numel() == 0 and m.down_proj.numel() == 0, n
            big = [n for n, t in list(q.named_parameters()) + list(q.named_buffers())
                   if ".experts." in n and t.is_floating_point() and t.numel() > 0]
            assert big == []
            with torch.no_grad():
                want, got = ref(ids).logits, q(ids).logits
            assert got.dtype == want.dtype == torch.bfloat16
            assert torch.equal(got, want)
            q.train()
            with pytest.raises(RuntimeError, match="loaded for inference by moe8's quantizer"):
                q(ids)
            with pytest.raises(ValueError, match="loaded by moe8's quantizer"):
                set_experts_rules(q, rules)


def test_transformers_quantizer_ungated_and_biased(tmp_path):
    """moe8's quantizer on the experts forms beyond SwiGLU: Nemotron-H's
    ungated relu² experts (up_proj alone) and GPT-OSS's interleaved,
    biased, clamped experts, from bf16 checkpoints: no float expert tensor
    or bias is kept, and the logits are the bytes of the same checkpoint
    loaded by transformers and run through experts_implementation="moe8"
    under the same rules."""
    transformers = _transformers_or_skip("the moe8 quantizer on ungated and biased experts")
    if not hasattr(transformers, "NemotronHConfig") or not hasattr(transformers, "GptOssConfig"):
        pytest.skip("this transformers has no NemotronH or GPT-OSS: the quantizer on their experts is not tested")
    from moe8.torch import register_transformers, set_experts_rules
    assert register_transformers()
    from moe8.torch import Moe8Config
    torch.manual_seed(2)
    rules = {"rules": [{"module_path": r"layers\.[0-9]+\.(mlp|mixer)\.experts", "weight_qtype": "float8_e4m3fn",
                        "act_qtype": "float8_e4m3fn", "tile_size": 32}]}
    nemo = transformers.NemotronHConfig(vocab_size=128, hidden_size=64, n_routed_experts=8, num_experts_per_tok=2,
                                        moe_intermediate_size=32, moe_shared_expert_intermediate_size=48, n_group=2, topk_group=1,
                                        routed_scaling_factor=2.5, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                        mamba_num_heads=4, mamba_head_dim=16, ssm_state_size=16, n_groups=2, intermediate_size=64,
                                        mlp_hidden_act="relu2", hybrid_override_pattern="ME*E")
    oss = transformers.GptOssConfig(hidden_size=64, num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2, experts_per_token=2,
                                    intermediate_size=64, vocab_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                    sliding_window=8, layer_types=["sliding_attention", "full_attention"])
    ids = torch.randint(0, 128, (2, 7))
    for cls, cfg, where, names in ((transformers.NemotronHForCausalLM, nemo, "mixer.experts", ("up_proj", "down_proj")),
                                   (transformers.GptOssForCausalLM, oss, "mlp.experts",
                                    ("gate_up_proj", "down_proj", "gate_up_proj_bias", "down_proj_bias"))):
        model = cls(cfg)
        with torch.no_grad():  # weights away from the init's zeros and ones (biases included)
            for n, p in model.named_parameters():
                if ".experts." in n or "router" in n or "mixer.gate" in n:
                    p.normal_(0, 0.05 if n.endswith("bias") else p.shape[-1] ** -0.5 * 1.5)
        d = tmp_path / cls.__name__
        model.to(torch.bfloat16).save_pretrained(d)
        for r in (None, rules):
            ref = cls.from_pretrained(d, experts_implementation="moe8").eval()
            set_experts_rules(ref, r)
            q = transformers.AutoModelForCausalLM.from_pretrained(d, quantization_config=Moe8Config(rules=r))
            experts = [(n, m) for n, m in q.named_modules() if n.endswith(where)]
            assert len(experts) == 2
            for n, m in experts:
                assert "_moe8_loaded" in m.__dict__, n
                for t in names:
                    assert getattr(m, t).numel() == 0, (n, t)
            big = [n for n, t in list(q.named_parameters()) + list(q.named_buffers())
                   if ".experts." in n and t.is_floating_point() and t.numel() > 0]
            assert big == []
            with torch.no_grad():
                want, got = ref(ids).logits, q(ids).logits
            assert torch.isfinite(want).all() and want.abs().max() > 0
            assert torch.equal(got, want), (cls.__name__, r is not None, (got.float() - want.float()).abs().max())


def _gpt_oss_mxfp4(transformers, d, layers=2, experts=4, k=2, hidden=64, ffn=64, vocab=128, seed=0):
    """A tiny GPT-OSS checkpoint in its released MXFP4 layout (random E2M1
    codes and E8M0 scales for the experts, bf16 for the rest)."""
    import json
    from safetensors.torch import save_file
    cfg = transformers.GptOssConfig(hidden_size=hidden, num_hidden_layers=layers, num_local_experts=experts, num_experts_per_tok=k,
                                    experts_per_token=k, intermediate_size=ffn, vocab_size=vocab, num_attention_heads=4,
                                    num_key_value_heads=2, head_dim=16, sliding_window=8,
                                    layer_types=["sliding_attention", "full_attention"] * (layers // 2))
    with torch.device("meta"):
        shapes = {n: p.shape for n, p in transformers.GptOssForCausalLM(cfg).state_dict().items() if ".mlp.experts." not in n}
    g = torch.Generator().manual_seed(seed)
    sd = {n: (torch.ones(s) if "norm" in n else torch.randn(s, generator=g) * 0.05).to(torch.bfloat16) for n, s in shapes.items()}
    for layer in range(layers):
        pre = "model.layers.%d.mlp.experts." % layer
        for proj, n, kk in (("gate_up_proj", 2 * ffn, hidden), ("down_proj", hidden, ffn)):
            sd[pre + proj + "_blocks"] = torch.randint(0, 256, (experts, n, kk // 32, 16), generator=g, dtype=torch.uint8)
            sd[pre + proj + "_scales"] = torch.randint(118, 124, (experts, n, kk // 32), generator=g, dtype=torch.uint8)
            sd[pre + proj + "_bias"] = (torch.randn((experts, n), generator=g) * 0.05).to(torch.bfloat16)
    os.makedirs(d, exist_ok=True)
    save_file(sd, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    c = cfg.to_dict()
    c["architectures"] = ["GptOssForCausalLM"]
    c["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(c, f)


def test_transformers_experts_from_files(tmp_path):
    """moe8.torch.from_pretrained: moe8's loader reads each experts module
    from the checkpoint's files. On bf16 Qwen3-MoE and Mixtral checkpoints
    the logits are the bytes of the quantizer path under the same rules;
    on a GPT-OSS checkpoint in its MXFP4 layout the MXFP4 codes are kept
    (no float expert tensor anywhere) and the logits are transformers' own
    (its experts dequantized) within f32 noise; other quantized configs
    are refused by name."""
    transformers = _transformers_or_skip("moe8.torch.from_pretrained")
    import moe8.torch as mt
    assert mt.register_transformers()
    from moe8.torch import Moe8Config
    torch.manual_seed(2)
    ids = torch.randint(0, 128, (2, 7))
    for cls, cfg in _tiny_models(transformers):
        d = tmp_path / cls.__name__
        cls(cfg).to(torch.bfloat16).save_pretrained(d)
        for r in (None, _FP8_EXPERTS):
            want = transformers.AutoModelForCausalLM.from_pretrained(d, quantization_config=Moe8Config(rules=r)).eval()
            got = mt.from_pretrained(d, rules=r).eval()
            assert [n for n, t in got.state_dict().items() if ".experts." in n and t.numel() > 0] == []
            with torch.no_grad():
                assert torch.equal(got(ids).logits, want(ids).logits)
    d = tmp_path / "gpt_oss"
    _gpt_oss_mxfp4(transformers, d)
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        d, dtype=torch.float32, quantization_config=transformers.Mxfp4Config(dequantize=True)).eval()
    got = mt.from_pretrained(d, dtype=torch.float32).eval()
    experts = [m for n, m in got.named_modules() if n.endswith("mlp.experts")]
    assert len(experts) == 2 and all("mxfp4" in m._moe8_loaded.model_format for m in experts)
    assert [n for n, t in list(got.named_parameters()) + list(got.named_buffers()) if ".experts." in n] == []
    with torch.no_grad():
        want, out = ref(ids).logits, got(ids).logits
    assert (out - want).abs().max() <= 1e-5 * want.abs().max()
    with open(d / "config.json") as f:
        c = json.load(f)
    c["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    with open(d / "config.json", "w") as f:
        json.dump(c, f)
    with pytest.raises(ValueError, match="quantization_config is 'fp8'"):
        mt.from_pretrained(d)
