"""torch.ops.moe8.experts: moe8's expert op (moe8_layer_experts) as a
PyTorch operator, the thin adapters for serving stacks' call shapes, and
transformers 5's experts_implementation="moe8" (docs/integration.md).

The operator takes tensors and scalars only, so the layer is named by an
integer handle: register_layer(layer) puts a moe8.Layer (or a MoE8Block's
layer) in a registry held here and returns its handle; unregister_layer
takes it out.  The registry holds the layer alive until then."""
import itertools
import threading

import numpy as np

import torch

from . import Error, Layer, _check, _layer_experts, _layer_experts_routed, _layer_weights_changed, _P

# ---- the layer registry -------------------------------------------------------------------------
_LAYERS = {}
_NEXT = itertools.count(1)
_LOCK = threading.Lock()


def _as_layer(layer):
    """A moe8.Layer from a Layer, a MoE8Block (its layer) or a handle."""
    if isinstance(layer, Layer):
        return layer
    if isinstance(layer, bool):
        raise TypeError("moe8: a layer handle is an int, not a bool")
    if isinstance(layer, int):
        try:
            return _LAYERS[layer]
        except KeyError:
            raise KeyError("moe8: no layer is registered under handle %d (register_layer gives one)" % layer) from None
    inner = getattr(layer, "layer", None)
    if isinstance(inner, Layer):
        return inner
    raise TypeError("moe8: expected a moe8.Layer, a MoE8Block or a handle from register_layer, not %s" % type(layer).__name__)


def register_layer(layer):
    """The handle (an int >= 1) torch.ops.moe8.experts names `layer` by (a
    moe8.Layer or a MoE8Block).  Registering the same layer again gives
    the same handle.  The registry keeps the layer alive until
    unregister_layer(handle)."""
    lay = _as_layer(layer)
    with _LOCK:
        h = getattr(lay, "_op_handle", None)
        if h is not None and _LAYERS.get(h) is lay:
            return h
        h = next(_NEXT)
        _LAYERS[h] = lay
        lay._op_handle = h
        return h


def unregister_layer(handle):
    """Takes the layer out of the registry (its handle is not reused)."""
    with _LOCK:
        lay = _LAYERS.pop(handle, None)
        if lay is not None:
            lay._op_handle = None


# ---- the kernel ------------------------------------------------------------------------------
def _run(lay, hidden, topk_ids, topk_weights, out, shared):
    """out (a contiguous float32 [T, D] tensor) = the layer's experts."""
    if hidden.device.type != "cpu" or hidden.dim() != 2 or hidden.shape[1] != lay.hidden:
        raise ValueError("moe8: hidden must be a CPU tensor [T, %d], got %s %s on %s" % (lay.hidden, hidden.dtype, list(hidden.shape),
                                                                                       hidden.device))
    if hidden.dtype not in (torch.float32, torch.bfloat16):
        raise TypeError("moe8: hidden must be float32 or bfloat16, got %s" % hidden.dtype)
    T = hidden.shape[0]
    if tuple(topk_ids.shape) != (T, lay.top_k) or topk_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError("moe8: topk_ids must be int32 or int64 [%d, %d], got %s %s" % (T, lay.top_k, topk_ids.dtype, list(topk_ids.shape)))
    if tuple(topk_weights.shape) != (T, lay.top_k) or topk_weights.dtype not in (torch.float32, torch.bfloat16):
        raise ValueError("moe8: topk_weights must be float32 or bfloat16 [%d, %d], got %s %s"
                         % (T, lay.top_k, topk_weights.dtype, list(topk_weights.shape)))
    if T == 0:
        return
    if topk_ids.dtype == torch.int64:  # ids that would not survive the conversion to int32 (the C call checks ids >= E)
        lo, hi = int(topk_ids.min()), int(topk_ids.max())
        if lo < -(2 ** 31) or hi >= lay.num_experts:
            raise Error(2, "topk_ids hold %d: ids must be in [-2^31, num_experts = %d) (ids < 0 are skipped)"
                        % (lo if lo < -(2 ** 31) else hi, lay.num_experts))
    # f32 staging only where the C API needs it (no copy of a contiguous f32 input)
    x = hidden.detach().contiguous().to(torch.float32)
    ids = topk_ids.detach().to(torch.int32).contiguous()
    w = topk_weights.detach().to(torch.float32).contiguous()
    if x.data_ptr() == out.data_ptr():  # in place (out is hidden): the C call reads x while it writes out
        x = x.clone()
    if lay._views_out and not lay._prepared:
        _layer_weights_changed(lay._h)
    ws = lay._workspace(T)
    fn = _layer_experts if shared else _layer_experts_routed  # routed: the shared expert left out (the caller runs its own)
    _check(fn(lay._h, _P(x.data_ptr()), T, _P(ids.data_ptr()), _P(w.data_ptr()), _P(out.data_ptr()), ws.ptr, ws.n))


def _experts_cpu(hidden, topk_ids, topk_weights, layer, shared=True):
    lay = _as_layer(int(layer))
    y = torch.empty((hidden.shape[0], lay.hidden), dtype=torch.float32)
    _run(lay, hidden, topk_ids, topk_weights, y, shared)
    return y if hidden.dtype == torch.float32 else y.to(hidden.dtype)


def _experts_out_cpu(hidden, topk_ids, topk_weights, layer, shared=True, *, out):
    lay = _as_layer(int(layer))
    if tuple(out.shape) != (hidden.shape[0], lay.hidden) or out.dtype not in (torch.float32, torch.bfloat16) or out.device.type != "cpu":
        raise ValueError("moe8: out must be a float32 or bfloat16 CPU tensor [%d, %d], got %s %s"
                         % (hidden.shape[0], lay.hidden, out.dtype, list(out.shape)))
    direct = out.dtype == torch.float32 and out.is_contiguous()
    y = out if direct else torch.empty(tuple(out.shape), dtype=torch.float32)
    _run(lay, hidden, topk_ids, topk_weights, y, shared)
    if not direct:
        out.copy_(y)
    return out


def _experts_fake(hidden, topk_ids, topk_weights, layer, shared=True):
    return hidden.new_empty(hidden.shape)


def _experts_out_fake(hidden, topk_ids, topk_weights, layer, shared=True, *, out):
    return out


# The schema: `layer` is a handle from register_layer; shared=False leaves
# the layer's shared expert out.
_SCHEMA = "experts(Tensor hidden, Tensor topk_ids, Tensor topk_weights, int layer, bool shared=True) -> Tensor"
_SCHEMA_OUT = ("experts.out(Tensor hidden, Tensor topk_ids, Tensor topk_weights, int layer, bool shared=True, *, Tensor(a!) out) "
               "-> Tensor(a!)")

_lib = None


def _register_op():
    global _lib
    if _lib is not None:
        return
    if hasattr(torch.ops, "moe8") and hasattr(torch.ops.moe8, "experts"):
        try:
            torch.ops.moe8.experts.default
            return  # defined already (another copy of this package in the process)
        except (AttributeError, RuntimeError):
            pass
    lib = torch.library.Library("moe8", "DEF")
    lib.define(_SCHEMA)
    lib.define(_SCHEMA_OUT)
    lib.impl("experts", _experts_cpu, "CPU")
    lib.impl("experts.out", _experts_out_cpu, "CPU")
    fake = getattr(torch.library, "register_fake", None) or getattr(torch.library, "impl_abstract", None)
    if fake is not None:  # newer torch: the fake kernel torch.compile traces with
        fake("moe8::experts", _experts_fake, lib=lib)
        fake("moe8::experts.out", _experts_out_fake, lib=lib)
    else:  # torch 1.13 (no torch.library.custom_op or register_fake): a Meta kernel, and at AutogradMeta, which 1.13 does not fall through
        for key in ("Meta", "AutogradMeta"):
            lib.impl("experts", _experts_fake, key)
            lib.impl("experts.out", _experts_out_fake, key)
    _lib = lib


_register_op()


# ---- Python entry points and the serving stacks' call shapes ------------------------------------
def _handle(layer):
    return layer if isinstance(layer, int) and not isinstance(layer, bool) else register_layer(layer)


def experts(layer, hidden, topk_ids, topk_weights, out=None, shared=True):
    """torch.ops.moe8.experts on `layer` (a Layer, a MoE8Block or a handle):
    hidden [T, D] float32 / bfloat16, topk_ids [T, k] int32 / int64 (ids
    < 0 skipped), topk_weights [T, k] float32 / bfloat16, used as given;
    returns hidden's dtype, or writes `out`."""
    h = _handle(layer)
    if out is None:
        return torch.ops.moe8.experts(hidden, topk_ids, topk_weights, h, shared)
    return torch.ops.moe8.experts(hidden, topk_ids, topk_weights, h, shared, out=out)


def fused_experts(layer, hidden_states, topk_weights, topk_ids, inplace=False, shared=True, activation="silu",
                  apply_router_weight_on_input=False, global_num_experts=-1, expert_map=None):
    """vLLM's fused_experts(hidden_states, w1, w2, topk_weights, topk_ids,
    inplace=..., activation=..., global_num_experts=..., expert_map=...)
    with the moe8 layer (a Layer, a MoE8Block or a handle) in the weights'
    place: inplace=True writes the result into hidden_states and returns
    it.  expert_map [global_num_experts] maps the ids to the layer's own
    experts (-1: not here, skipped), as vLLM's expert parallelism gives it.
    moe8 runs SwiGLU with the weights on the output: other activations
    and apply_router_weight_on_input=True are refused."""
    if activation not in ("silu", "swiglu"):
        raise ValueError("moe8: fused_experts runs SwiGLU (activation=\"silu\"), not %r" % (activation,))
    if apply_router_weight_on_input:
        raise ValueError("moe8: fused_experts applies the router weights to the experts' outputs "
                         "(apply_router_weight_on_input=True is not supported)")
    if expert_map is not None:
        topk_ids = expert_map.to(torch.int64)[topk_ids.to(torch.int64)]
    if inplace:
        return experts(layer, hidden_states, topk_ids, topk_weights, out=hidden_states, shared=shared)
    return experts(layer, hidden_states, topk_ids, topk_weights, shared=shared)


class KExperts(torch.nn.Module):
    """KTransformers' CPU experts operator shape: forward(input_tensor,
    expert_ids, weights) -> output [T, D] in input_tensor's dtype."""

    def __init__(self, layer, shared=True):
        super().__init__()
        self.handle, self.shared = register_layer(layer), shared

    def forward(self, input_tensor, expert_ids, weights):
        shape = input_tensor.shape
        x = input_tensor.reshape(-1, shape[-1])
        return torch.ops.moe8.experts(x, expert_ids.reshape(x.shape[0], -1), weights.reshape(x.shape[0], -1), self.handle,
                                      self.shared).reshape(shape)


# ---- transformers 5: experts_implementation="moe8" ------------------------------------------------
# Experts classes whose own _apply_gate is the limited SwiGLU
# act(gate.clamp(max=L)) * up.clamp(-L, L) with SiLU, L = module.swiglu_limit
# (DeepSeek-V4's: module.limit).
_LIMITED = ("Glm5NextTextExperts", "HYV4Experts", "HYV4VLExperts", "DeepseekV4Experts")
# ... GPT-OSS's clamped SwiGLU g' = min(g, L), u' = clamp(u, +-L), g' sigmoid(a g') (u' + 1), as
# (alpha, limit) attribute names; GPT-OSS's gate and up columns alternate (is_concatenated False), and
# GPT-OSS and the privacy filter have expert biases (has_bias)
_CLAMPED = {"GptOssExperts": ("alpha", "limit"), "OpenAIPrivacyFilterExperts": ("alpha", "limit"),
            "MiniMaxM3VLExperts": ("swiglu_alpha", "swiglu_limit")}
# ... the softcapped SwiGLU cg tanh(g / cg) sigmoid(g) cu tanh(u / cu) (Inkling-2's act_fn)
_SOFTCAP = ("Inkling2Experts", "Inkling2LoopExperts")
# ... the plain SwiGLU computed in float32 (the same as moe8's)
_PLAIN = ("BeamExperts",)


def _silu(act):
    return act is torch.nn.functional.silu or isinstance(act, torch.nn.SiLU) or type(act).__name__ == "SiLUActivation"


# The activations of ungated experts (has_gate False: up_proj and
# down_proj, Nemotron-H's) moe8 runs, by the act_fn's class name.
_UNGATED_ACTS = {"ReLUSquaredActivation": "relu2", "ReLU": "relu"}


def _ungated(module):
    """moe8's act for an ungated experts module it runs, else None."""
    if getattr(module, "has_gate", True) or not isinstance(getattr(module, "up_proj", None), torch.Tensor):
        return None
    return _UNGATED_ACTS.get(type(getattr(module, "act_fn", None)).__name__)


def _post_norm(module):
    """(scale [D] as float32: 1 + w, eps) of an experts module's norm after
    each expert that moe8 computes (MuSE-Spark's post_expert_norm,
    MuseSparkTextInputScaledRMSNorm: the output times 1 + w, then
    RMS-normalized), else None."""
    n = getattr(module, "post_expert_norm", None)
    if type(n).__name__ != "MuseSparkTextInputScaledRMSNorm" or not isinstance(getattr(n, "weight", None), torch.Tensor):
        return None
    with torch.no_grad():
        return (1.0 + n.weight.detach()).float(), float(n.eps)  # 1 + w in the weight's dtype, as the class rounds it


def _act_of(module):
    """The Layer keywords of an experts module's activation ({} for the
    plain SwiGLU)."""
    name = type(module).__name__
    if name in _LIMITED:
        return {"act": "swiglu_limit", "act_limit": float(getattr(module, "swiglu_limit", getattr(module, "limit", 0)) or 0)}
    if name in _CLAMPED:
        a, l = _CLAMPED[name]
        return {"act": "swiglu_clamp", "act_alpha": float(getattr(module, a)), "act_limit": float(getattr(module, l))}
    if name in _SOFTCAP:
        return {"act": "swiglu_softcap", "act_alpha": float(module.act_fn.gate_softcap.softcap),
                "act_limit": float(module.act_fn.up_softcap.softcap)}
    if _ungated(module):
        return {"act": _ungated(module)}
    if type(getattr(module, "act_fn", None)).__name__ == "GELUTanh":  # gelu_pytorch_tanh: Gemma-4's GeGLU experts
        return {"act": "geglu"}
    return {}


def _why_not(module):
    """What of a transformers experts module moe8 cannot run (a list of
    reasons, empty when it can)."""
    why = []
    name = type(module).__name__
    known = name in _LIMITED or name in _CLAMPED or name in _SOFTCAP or name in _PLAIN
    gate = getattr(type(module), "_apply_gate", None)
    if gate is not None and gate.__name__ != "_default_apply_gate" and not known:
        why.append("its own gate function (%s._apply_gate)" % name)
    ung = _ungated(module)
    if not ung and (not getattr(module, "has_gate", True) or not isinstance(getattr(module, "gate_up_proj", None), torch.Tensor)):
        why.append("no gate projection (gate_up_proj), and an activation moe8 does not run ungated (relu2, relu)")
    if not isinstance(getattr(module, "down_proj", None), torch.Tensor):
        why.append("no down_proj")
    if not isinstance(getattr(module, "up_proj" if ung else "gate_up_proj", None), torch.Tensor) or \
            not isinstance(getattr(module, "down_proj", None), torch.Tensor):
        return why
    act = _act_of(module)
    if act.get("act") in ("swiglu_limit", "swiglu_clamp", "swiglu_softcap") and not act.get("act_limit", 0) > 0:
        why.append("limit %r (moe8 clamps at a positive limit)" % (act.get("act_limit"),))
    if act.get("act") in ("swiglu_clamp", "swiglu_softcap") and not act.get("act_alpha", 0) > 0:
        why.append("alpha %r (moe8 needs a positive one)" % (act.get("act_alpha"),))
    if getattr(module, "has_bias", False) and not (name in _CLAMPED and _biases(module) is not None):
        why.append("expert biases")
    if not getattr(module, "is_concatenated", True) and name != "GptOssExperts":
        why.append("interleaved gate/up columns")
    if getattr(module, "has_post_expert_norm", False) and _post_norm(module) is None:
        why.append("a norm after each expert")
    fn = getattr(module, "act_fn", None)
    if fn is not None and name not in _SOFTCAP and not _silu(fn) and type(fn).__name__ != "GELUTanh" and not _ungated(module):
        why.append("activation %s (moe8 runs SwiGLU: SiLU, or GeGLU: GELUTanh)" % type(fn).__name__)
    return why


def _biases(module):
    """(gate_up_proj_bias [E, 2F], down_proj_bias [E, D]) of a module with
    expert biases, or None."""
    b1, b2 = getattr(module, "gate_up_proj_bias", None), getattr(module, "down_proj_bias", None)
    return (b1, b2) if isinstance(b1, torch.Tensor) and isinstance(b2, torch.Tensor) else None


def _halves(t, interleaved):
    """The last axis of t (gate and up) as gate columns then up columns."""
    return torch.cat([t[..., 0::2], t[..., 1::2]], dim=-1) if interleaved else t


def _lean_layer(gu, dn, transposed, k, rules, path, act=None, interleaved=False, biases=None, post_norm=None):
    """The lean inference layer of fused expert weights (gate_up_proj
    [E, 2F, D] gate rows first and down_proj [E, D, F]; transposed:
    [E, D, 2F] and [E, F, D]; interleaved: gate and up alternate, GPT-OSS's
    transposed layout; ungated experts (act relu2 or relu): up_proj [E, F, D]
    alone), built one expert at a time (one expert's float32 copy at most
    beside the codes); biases: (gate_up [E, 2F] in the same order, down
    [E, D]); post_norm: (scale [D], eps) of a norm on each expert's output
    (_post_norm); the caller routes."""
    with torch.no_grad():
        E = gu.shape[0]
        n1 = 1 if (act or {}).get("act") in ("relu2", "relu") else 2  # up alone, or gate and up
        D, F = (gu.shape[1], gu.shape[2] // n1) if transposed else (gu.shape[2], gu.shape[1] // n1)
        want = (E, F, D) if transposed else (E, D, F)
        if tuple(dn.shape) != want or gu.shape[0] != dn.shape[0]:
            raise ValueError("moe8: %s: down_proj is %s, gate_up_proj %s needs %s" % (path, list(dn.shape), list(gu.shape), list(want)))

        # One float32 pair for every expert: each is handed over before the
        # next is asked for (new pages for each would be zeroed by the kernel).
        bufs = torch.empty((D, n1 * F), dtype=torch.float32), torch.empty((F, D), dtype=torch.float32)

        def expert(e):
            a, b = (gu[e], dn[e]) if transposed else (gu[e].t(), dn[e].t())
            if interleaved:
                bufs[0][:, :F].copy_(a[:, 0::2].detach())
                bufs[0][:, F:].copy_(a[:, 1::2].detach())
                return bufs[0], bufs[1].copy_(b.detach())
            return bufs[0].copy_(a.detach()), bufs[1].copy_(b.detach())
        weights = {"router": np.zeros((D, E), np.float32)}  # the caller routes
        if biases is not None:
            weights["gate_up_bias"] = _halves(biases[0].detach().float(), interleaved).numpy()
            weights["down_bias"] = biases[1].detach().float().numpy()
        if post_norm is not None:
            weights["expert_out_norm"] = post_norm[0].numpy()
        return Layer.inference_from_experts(expert, rules=rules, module_path=path, weights=weights, num_experts=E, top_k=k, hidden=D,
                                            ffn=F, expert_bias=biases is not None, expert_out_norm=post_norm is not None,
                                            expert_out_eps=post_norm[1] if post_norm is not None else 0.0, **(act or {}))


def _experts_layer(module, k):
    """The moe8 layer of a transformers experts module (gate_up_proj
    [E, 2F, D] gate rows first, down_proj [E, D, F]; transposed: [E, D, 2F]
    and [E, F, D]), made on its first call and again when its weights
    change (another tensor, or an in-place write).  A module loaded by
    moe8's quantizer (moe8.torch.Moe8Config) has its layer already and no
    other copy of its weights."""
    loaded = module.__dict__.get("_moe8_loaded")
    if loaded is not None:
        if torch.is_grad_enabled() and module.training:
            raise RuntimeError("moe8: %s was loaded for inference by moe8's quantizer (its experts are held only as moe8's "
                               "codes): call it in eval mode or under torch.no_grad(), or load the model without "
                               "quantization_config to train it" % module.__dict__.get("_moe8_path", "experts"))
        if loaded.top_k != k:
            raise ValueError("moe8: %s was loaded with top_k = %d (the config's), called with %d experts a token"
                             % (module.__dict__.get("_moe8_path", "experts"), loaded.top_k, k))
        return loaded
    why = _why_not(module)
    if why:
        raise TypeError("moe8: experts_implementation=\"moe8\" cannot run %s: %s" % (type(module).__name__, ", ".join(why)))
    gu, dn = module.up_proj if _ungated(module) else module.gate_up_proj, module.down_proj
    biases = _biases(module) if getattr(module, "has_bias", False) else None
    interleaved = not getattr(module, "is_concatenated", True)
    try:
        key = (k, gu.data_ptr(), gu._version, dn.data_ptr(), dn._version)
    except RuntimeError:  # inference tensors keep no version counter (and cannot be written in place)
        key = (k, gu.data_ptr(), None, dn.data_ptr(), None)
    # not training (no grad, or the module in eval mode): the lean inference
    # layer, built one expert at a time (no f32 masters beside the codes)
    lean = not torch.is_grad_enabled() or not module.training
    key = key + (lean,)
    post_norm = _post_norm(module) if getattr(module, "has_post_expert_norm", False) else None
    if post_norm is not None:
        w = module.post_expert_norm.weight
        try:
            key = key + (w.data_ptr(), w._version, post_norm[1])
        except RuntimeError:
            key = key + (w.data_ptr(), None, post_norm[1])
    cached = module.__dict__.get("_moe8_experts")
    if biases is not None:
        key = key + tuple((b.data_ptr(), getattr(b, "_version", None)) for b in biases)
    if cached is not None and cached[0] == key:
        return cached[1]
    if lean:
        lay = _lean_layer(gu, dn, getattr(module, "is_transposed", False), k, module.__dict__.get("_moe8_rules"),
                          module.__dict__.get("_moe8_path", "experts"), _act_of(module), interleaved, biases, post_norm)
    else:
        with torch.no_grad():
            gu32, dn32 = gu.detach().float(), dn.detach().float()
            if _ungated(module):  # up_proj [E, F, D] alone (transposed: [E, D, F])
                tr = getattr(module, "is_transposed", False)
                E, D, F = (gu32.shape if tr else (gu32.shape[0], gu32.shape[2], gu32.shape[1]))
                g, u, d = None, gu32 if tr else gu32.transpose(1, 2), dn32 if tr else dn32.transpose(1, 2)
            elif getattr(module, "is_transposed", False):  # [E, D, 2F], [E, F, D]: already x @ W
                E, D, F2 = gu32.shape
                F = F2 // 2
                gu32 = _halves(gu32, interleaved)
                g, u, d = gu32[:, :, :F], gu32[:, :, F:], dn32
            else:
                E, F2, D = gu32.shape
                F = F2 // 2
                g, u, d = gu32[:, :F, :].transpose(1, 2), gu32[:, F:, :].transpose(1, 2), dn32.transpose(1, 2)
            lay = Layer(num_experts=E, top_k=k, hidden=D, ffn=F, rules=module.__dict__.get("_moe8_rules"),
                        module_path=module.__dict__.get("_moe8_path", "experts"), expert_bias=biases is not None,
                        expert_out_norm=post_norm is not None, expert_out_eps=post_norm[1] if post_norm is not None else 0.0,
                        **_act_of(module))
            if post_norm is not None:
                lay.weight("expert_out_norm")[:] = post_norm[0].numpy()
            for name, t in (("gate", g), ("up", u), ("down", d)):
                if t is not None:  # an ungated layer has no gate
                    lay.weight(name)[:] = t.numpy()
            if biases is not None:
                lay.weight("gate_up_bias")[:] = _halves(biases[0].detach().float(), interleaved).numpy()
                lay.weight("down_bias")[:] = biases[1].detach().float().numpy()
            lay.prepare()
    old = cached[1] if cached is not None else None
    if old is not None:
        unregister_layer(getattr(old, "_op_handle", None))
    register_layer(lay)
    module.__dict__["_moe8_experts"] = (key, lay)
    return lay


def transformers_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """The function registered as "moe8" in transformers' ExpertsInterface:
    called as the experts module's forward, (self, hidden_states [T, D],
    top_k_index [T, k], top_k_weights [T, k]) -> [T, D] in hidden_states'
    dtype, the router's weights used as given."""
    lay = _experts_layer(self, top_k_index.shape[-1])
    ids = top_k_index
    if getattr(self, "_is_expert_parallel", False):  # expert-parallel sentinels (ids >= E): skipped
        ids = torch.where(ids >= lay.num_experts, torch.full_like(ids, -1), ids)
    x = hidden_states if hidden_states.dtype in (torch.float32, torch.bfloat16) else hidden_states.float()
    w = top_k_weights if top_k_weights.dtype in (torch.float32, torch.bfloat16) else top_k_weights.float()
    # transformers runs a block's shared experts itself: the routed experts alone
    return torch.ops.moe8.experts(x, ids, w, lay._op_handle, False).to(hidden_states.dtype)


def register_transformers():
    """Registers "moe8" in transformers' ExpertsInterface, so that
    from_pretrained(..., experts_implementation="moe8") (or
    model.set_experts_implementation("moe8")) runs every
    @use_experts_implementation experts module through moe8, and moe8's
    quantizer under quant_method "moe8", so that from_pretrained(...,
    quantization_config=moe8.torch.Moe8Config(rules)) loads the experts
    straight into lean moe8 layers (no float copy kept).  Returns
    False when transformers (5.x, with transformers.integrations.moe) is
    not importable."""
    try:
        from transformers.integrations.moe import ExpertsInterface
        from . import _hf_quant
    except ImportError:
        return False
    ExpertsInterface.register("moe8", transformers_experts_forward)
    _hf_quant.register()
    return True


def set_experts_rules(model, rules):
    """Quantization rules for the "moe8" experts of a transformers model:
    each experts module (one with gate_up_proj and down_proj) is matched
    by its own path, "<its name in model.named_modules()>" (e.g.
    model.layers.1.mlp.experts).  Layers already made are made again on
    their next call.  Returns how many experts modules were marked."""
    from ._torch import _rules_text
    text = _rules_text(rules)
    n = 0
    for name, m in model.named_modules():
        if isinstance(getattr(m, "gate_up_proj", None) if _ungated(m) is None else m.up_proj, torch.Tensor) and \
                isinstance(getattr(m, "down_proj", None), torch.Tensor):
            if "_moe8_loaded" in m.__dict__:
                raise ValueError("moe8: %s was loaded by moe8's quantizer under its rules (its float weights are gone): "
                                 "load it again with Moe8Config(rules=...)" % (name or "experts"))
            m.__dict__["_moe8_rules"], m.__dict__["_moe8_path"] = text, name or "experts"
            old = m.__dict__.pop("_moe8_experts", None)
            if old is not None:
                unregister_layer(getattr(old[1], "_op_handle", None))
            n += 1
    return n
