"""The implementation of moe8.torch (imported from there when PyTorch is present)."""
import json
import os
import stat
import warnings

import numpy as np
import torch

from . import ACTS, SCORES, Error, Layer, Rules, _as_rules, _rule_dict
from ._torch_op import _act_of

_RULES_MAX = 64 << 20  # the library's bound on a rules file

_NAMES = ("router", "gate", "up", "down", "shared_gate", "shared_up", "shared_down", "shared_gate_w", "router_bias", "gate_up_bias",
          "down_bias", "out_bias", "router_scale", "expert_scale", "in_norm", "out_norm")
_CONFIG = ("score", "norm_topk_prob", "routed_scaling_factor", "use_selection_bias", "capacity_factor", "aux_loss_weight", "n_group",
           "topk_group", "shared_ffn", "shared_gate")


class _MoE8Function(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, block, *params):
        layer = block.layer
        xn = x.detach().contiguous().numpy()
        ws = layer.new_workspace(xn.shape[0])
        y, aux = layer.forward(xn, workspace=ws)
        ctx.block, ctx.xn, ctx.ws = block, xn, ws
        ctx.names = block.param_names
        return torch.from_numpy(y), torch.tensor(aux, dtype=torch.float32)

    @staticmethod
    def backward(ctx, dy, daux):
        layer = ctx.block.layer
        if ctx.block.aux_loss_weight != 0 and float(daux) != 1.0:
            raise RuntimeError("moe8: the aux loss must enter the loss with weight 1 (set aux_loss_weight instead)")
        g = layer.backward(ctx.xn, dy.detach().contiguous().numpy(), workspace=ctx.ws)
        grads = [torch.from_numpy(g[n]) for n in ctx.names]
        return (torch.from_numpy(g["dx"]), None, *grads)


def _rules_text(rules):
    """The rule set as JSON text (kept for pickling), or None."""
    if rules is None:
        return None
    if isinstance(rules, dict):
        return json.dumps(rules)
    if isinstance(rules, Rules):
        raise TypeError("moe8: MoE8Block takes rules as a dict, JSON text or a path (a parsed Rules cannot be pickled)")
    text = os.fspath(rules) if isinstance(rules, os.PathLike) else str(rules)
    if text.lstrip()[:1] in ("{", "["):
        return text
    # A path.  The library's loader checks it by name first (a regular file
    # only, never blocking on a FIFO or a device, at most 64 MiB); then its
    # text is read through a descriptor opened without blocking and checked
    # again, so a FIFO put in its place meanwhile is refused, never waited on.
    Rules(text)
    fd = os.open(text, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_size > _RULES_MAX:
            raise Error(1, "rules %s: not a regular file of at most 64 MiB" % text)
        raw = f.read(_RULES_MAX + 1)
    Rules(raw)  # the text kept is the text checked
    return raw.decode("utf-8")


class _Parameter(torch.nn.Parameter):
    """A MoE8Block parameter.  Writes through the tensor itself (an
    optimizer step, copy_ under no_grad) advance its version counter, but
    `p.data` hands out a tensor with a fresh counter of its own, so a write
    through it (p.data.copy_(...)) would be invisible: every time `.data`
    is taken is counted as a possible write, and the block re-prepares its
    quantized, packed experts before its next inference forward."""

    @property
    def data(self):
        self.__dict__["_moe8_data_taken"] = self.__dict__.get("_moe8_data_taken", 0) + 1
        return torch.Tensor.data.__get__(self)

    @data.setter
    def data(self, value):
        torch.Tensor.data.__set__(self, value)


class MoE8Block(torch.nn.Module):
    """A Mixture-of-Experts block computed by moe8: x [..., D] -> [..., D].

    MoE8Block(hidden, ffn, num_experts, top_k, score="softmax",
              norm_topk_prob=True, shared_ffn=0, shared_gate=False,
              rules=None, seed=0, aux_loss_weight=0.0, ...)"""

    def __init__(self, hidden, ffn, num_experts, top_k, rules=None, seed=0, module_path="model.layers.0.mlp.experts", _layer=None,
                 _init=True, **config):
        super().__init__()
        config.setdefault("norm_topk_prob", True)
        self._rules = _rules_text(rules)
        self._module_path = module_path
        self._config = dict(config)
        self._codes = None  # (qtype, tile) of expert codes loaded from a file, which set the weights' format
        if _layer is None:
            _layer = Layer(num_experts=num_experts, top_k=top_k, hidden=hidden, ffn=ffn, rules=self._rules, module_path=module_path,
                           **config)
            if _init:  # (from_hf writes every weight itself: no random fill first)
                _layer.init_random(seed)
        self._attach(_layer)

    @property
    def inference_only(self):
        """True for a block made for inference only (patch or from_hf with
        inference=True): its layer holds the experts as moe8's inference
        load does (quantized, packed), no f32 masters, no backward."""
        return bool(getattr(self, "_inference", False))

    def _attach(self, layer, inference=False):
        self.layer = layer
        self._inference = inference
        self.aux_loss_weight = self._config.get("aux_loss_weight", 0.0)
        self.param_names = [n for n in _NAMES if not n.startswith("shared") or self.layer.shared_ffn > 0]
        if not self.layer.shared_gate and "shared_gate_w" in self.param_names:
            self.param_names.remove("shared_gate_w")
        if not self.layer.router_bias:
            self.param_names.remove("router_bias")
        if not self.layer.expert_bias:
            self.param_names.remove("gate_up_bias")
            self.param_names.remove("down_bias")
        if not self.layer.out_bias:
            self.param_names.remove("out_bias")
        for n in ("router_scale", "expert_scale", "in_norm", "out_norm"):  # Gemma-4's norms and scales
            if not getattr(self.layer, "router_norm" if n == "router_scale" else n):
                self.param_names.remove(n)
        if getattr(self.layer, "act", None) in ("relu2", "relu"):  # ungated experts: no gate weights
            self.param_names = [n for n in self.param_names if n not in ("gate", "shared_gate")]
        self._addr = {}
        if inference:  # no expert masters: only what the layer still holds in f32 (router, shared expert, ...)
            self.param_names = [n for n in self.param_names if n not in ("gate", "up", "down", "gate_up_bias", "down_bias")
                                and self.layer.weight_copy(n) is not None]
        for n in self.param_names:
            # the layer's memory itself: the optimizer updates moe8's masters
            # (the tensor keeps the layer alive through the view's buffer)
            view = self.layer.weight(n)
            self._addr[n] = (view.ctypes.data, view.shape)
            self.register_parameter(n, _Parameter(torch.from_numpy(view), requires_grad=not inference))
        self.aux_loss = None
        self._prepared_at = None

    @classmethod
    def from_pretrained(cls, model_dir, layer=None, rules=None, arch=None):
        """The MoE block of layer `layer` (default: the first MoE layer) of a
        checkpoint, with f32 master weights (trainable)."""
        text = _rules_text(rules)
        lay = Layer.from_model(model_dir, layer=layer, mode="training", rules=text, arch=arch)
        if lay.hash_routing:
            raise Error(1, "%s layer %d routes by token id (DeepSeek-V4's hash_moe layers): MoE8Block takes no token ids; run it "
                        "with moe8.Layer.from_model(...).forward(x, token_ids=...)" % (model_dir, lay.layer_index))
        # What the load chose is kept, so a copy (deepcopy, pickle) computes
        # the same bytes: the rule the layer runs under (the one given that
        # matched its path, or without rules the checkpoint's own, e.g. an
        # FP8 file's activations) and, for experts that came as FP8 / int8
        # codes, their format (the file's type and K block), which is the
        # weights' quantization whatever the rule says.
        text = lay.rule_json()
        codes = lay._prepared_spec() if "(loaded pre-quantized)" in lay.describe() else None
        c = _cfg(lay)
        cfg = {"score": SCORES[c.score], "group_score": "max" if c.group_score == 1 else "top2_sum",
               "act": ACTS[c.act]}
        for k in ("norm_topk_prob", "routed_scaling_factor", "use_selection_bias", "capacity_factor", "aux_loss_weight", "n_group",
                  "topk_group", "shared_ffn", "shared_gate", "act_alpha", "act_limit", "router_bias", "expert_bias", "weight_input",
                  "shared_plain_act", "norm_min", "norm_eps", "select_logits", "out_bias", "norm_p", "shared_scale", "shared_act_limit",
                  "group_mask_zero", "scored_shared", "router_norm", "expert_scale", "in_norm", "out_norm", "router_norm_scale", "rms_eps",
                  "router_jitter", "zero_experts"):
            cfg[k] = getattr(_cfg(lay), k)
        block = cls(lay.hidden, lay.ffn, lay.num_experts, lay.top_k, rules=text, _layer=lay, module_path=lay.module_path, **cfg)
        block._codes = codes
        return block

    def extra_repr(self):
        return "hidden=%d, ffn=%d, num_experts=%d, top_k=%d%s, rules=%s, path=%s" % (
            self.layer.hidden, self.layer.ffn, self.layer.num_experts, self.layer.top_k,
            ", shared_ffn=%d" % self.layer.shared_ffn if self.layer.shared_ffn else "", "yes" if self._rules else "none",
            "inference (packed experts, no f32 masters, no backward)" if self.inference_only else "training (f32 masters, autograd)")

    # ---- pickling: the config, the rules and the weights --------------------------------
    def __getstate__(self):
        if self.inference_only:
            raise TypeError("moe8: an inference-only MoE8Block holds no f32 expert weights to copy or pickle; patch the original "
                            "model again (or make it with inference=False)")
        L = self.layer
        return {"shape": (L.hidden, L.ffn, L.num_experts, L.top_k), "config": dict(self._config), "rules": self._rules,
                "module_path": self._module_path, "training": self.training, "codes": self._codes,
                "weights": {n: getattr(self, n).detach().numpy().copy() for n in self.param_names},
                "selection_bias": L.weight_copy("bias"),  # not a parameter (no gradient), but the routing's
                "requires_grad": {n: getattr(self, n).requires_grad for n in self.param_names}}

    def __setstate__(self, state):
        torch.nn.Module.__init__(self)
        hidden, ffn, E, k = state["shape"]
        self._rules, self._module_path, self._config = state["rules"], state["module_path"], state["config"]
        self._codes = state.get("codes")
        layer = Layer(num_experts=E, top_k=k, hidden=hidden, ffn=ffn, rules=self._rules, module_path=self._module_path, **self._config)
        if self._codes is not None:
            layer._load_codes(*self._codes)  # the file's weight format, as the original's load set it
        self._attach(layer)
        if state.get("selection_bias") is not None:
            layer.weight("bias")[:] = state["selection_bias"]
        with torch.no_grad():
            for n, w in state["weights"].items():
                getattr(self, n).copy_(torch.from_numpy(w))
                getattr(self, n).requires_grad_(state["requires_grad"][n])
        self.train(state["training"])

    def __deepcopy__(self, memo):
        new = MoE8Block.__new__(MoE8Block)
        new.__setstate__(self.__getstate__())
        memo[id(self)] = new
        return new

    def _check_params(self):
        """The autograd function computes with the layer's memory: a
        parameter that is no longer that memory would silently stop
        training, so it is refused."""
        for n in self.param_names:
            p = getattr(self, n)
            addr, shape = self._addr[n]
            if (not isinstance(p, torch.Tensor) or p.device.type != "cpu" or p.dtype != torch.float32 or not p.is_contiguous()
                    or p.data_ptr() != addr or tuple(p.shape) != tuple(shape)):
                raise RuntimeError("moe8: parameter %s is no longer the moe8 layer's memory (it was replaced, converted or moved: "
                                   "p.data = ..., .double(), .half(), .to(), share_memory()); MoE8Block's parameters must stay "
                                   "float32 CPU tensors over the layer's weights. Write new values in place (p.data.copy_(...))" % n)

    def _versions(self):
        """What says a parameter may have been written since the last
        preparation: each one's version counter (in-place writes through
        the tensor) and how often its `.data` was taken (writes through
        that, which no counter sees)."""
        return tuple((getattr(self, n)._version, getattr(self, n).__dict__.get("_moe8_data_taken", 0)) for n in self.param_names)

    def forward(self, x):
        if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.bfloat16):
            raise TypeError("moe8: MoE8Block takes float32 or bfloat16 CPU tensors, got %s on %s" % (x.dtype, x.device))
        if x.dim() < 1 or x.shape[-1] != self.layer.hidden:
            raise ValueError("moe8: MoE8Block input has shape %s; its last dimension must be hidden = %d"
                             % (list(x.shape), self.layer.hidden))
        self._check_params()
        dt, shape = x.dtype, x.shape
        x2 = x.reshape(-1, shape[-1]).float()
        if self.inference_only or not torch.is_grad_enabled() or not (
                x.requires_grad or any(getattr(self, n).requires_grad for n in self.param_names)):
            # inference: the prepared, fused path; re-prepared after any in-place change of a parameter
            v = self._versions()
            if self._prepared_at != v or not self.layer._prepared:  # (or written through layer.weight() views)
                self.layer.prepare()
                self._prepared_at = v
            y = torch.from_numpy(self.layer.forward(x2.detach().contiguous().numpy(), fused=True))
            self.aux_loss = torch.zeros((), dtype=torch.float32)
        else:
            y, aux = _MoE8Function.apply(x2, self, *[getattr(self, n) for n in self.param_names])
            self.aux_loss = aux
            self._prepared_at = None
        return y.reshape(shape).to(dt)


def _cfg(layer):
    from . import _layer_get_config
    return _layer_get_config(layer._h).contents


# ---- transformers blocks --------------------------------------------------------------------
# The MoE blocks of transformers moe8 computes (class name -> family; OLMoE
# is Qwen3-MoE's block); the
# per-expert (4.x: experts is a ModuleList) and fused (5.x: experts holds
# gate_up_proj [E, 2F, D] and down_proj [E, D, F]) layouts both.
_HF_BLOCKS = {"Qwen2MoeSparseMoeBlock": "qwen2_moe", "Qwen3MoeSparseMoeBlock": "qwen3_moe", "MixtralSparseMoeBlock": "mixtral",
              "DeepseekV3MoE": "deepseek_v3", "OlmoeSparseMoeBlock": "olmoe", "Glm4MoeMoE": "deepseek_v3",
              "Qwen3NextSparseMoeBlock": "qwen2_moe", "DeepseekV2Moe": "deepseek_v2", "DeepseekV2MoE": "deepseek_v2",
              "GptOssMLP": "gpt_oss", "Llama4TextMoe": "llama4_text", "Dots1MoE": "deepseek_v3",
              "Glm5NextTextMoE": "deepseek_v3", "HYV4MoE": "deepseek_v3", "HYV4VLMoE": "deepseek_v3", "Mistral4MoE": "deepseek_v3",
              "MiniMaxSparseMoeBlock": "mixtral", "MiniMaxM2SparseMoeBlock": "minimax_m2"}


def _first(*vals):
    for v in vals:
        if v is not None:
            return v
    return None


def _f32c(t):
    """t (a CPU tensor) as a contiguous float32 tensor: t itself when it is
    one, else one copy."""
    t = t.detach()
    if t.dtype == torch.float32 and t.is_contiguous():
        return t
    return torch.empty(t.shape, dtype=torch.float32).copy_(t)


def _hf_spec(block, family, cfg):
    """What moe8 needs of a transformers block, read without copying its
    experts: {"config": Layer()'s keyword arguments, "router": [D, E],
    "expert": e -> (gate_up [D, 2F] gate columns first, down [F, D]) in
    x @ W layout as views (or one expert's copy) in the block's dtype,
    "shared": None or () -> (gate_up [D, 2Fs], down [Fs, D]), "weights":
    {name: tensor} of the other f32 weights (biases, the shared gate)}."""
    if family == "gpt_oss":
        return _gpt_oss_spec(block, cfg)
    if family == "llama4_text":
        return _llama4_spec(block, cfg)
    gate = block.gate
    wr = gate.weight.detach()  # [E, D]
    E, D = wr.shape
    experts = block.experts
    if hasattr(experts, "gate_up_proj"):  # fused 3-D (transformers 5): gate_up_proj [E, 2F, D] gate rows first, down_proj [E, D, F]
        F = experts.gate_up_proj.shape[1] // 2

        def expert(e):
            return experts.gate_up_proj[e].detach().t(), experts.down_proj[e].detach().t()
    else:
        names = ("w1", "w3", "w2") if family in ("mixtral", "minimax_m2") else ("gate_proj", "up_proj", "down_proj")
        F = getattr(experts[0], names[0]).weight.shape[0]

        def expert(e):
            g, u, d = (getattr(experts[e], n).weight.detach() for n in names)
            return torch.cat([g.t(), u.t()], 1), d.t()
    top_k = _first(getattr(block, "top_k", None), getattr(gate, "top_k", None), getattr(cfg, "num_experts_per_tok", None))
    kw = {}
    def attr(name, default):
        """The routing setting: on the block (transformers 5), its router
        (4.x), or the config; else the family's default."""
        return _first(getattr(block, name, None), getattr(gate, name, None), getattr(cfg, name, None), default)

    if family == "mixtral":
        kw["norm_topk_prob"] = True
    elif family == "minimax_m2":
        kw.update(score="sigmoid", use_selection_bias=True, norm_topk_prob=True)
    elif family == "deepseek_v3":
        dots = type(block).__name__ == "Dots1MoE"  # Dots1Config's defaults: no renormalization, scaling 1.0
        softmax = type(block).__name__ == "Mistral4MoE"  # DeepSeek-V3's groups on softmax scores, no bias
        kw.update(score="softmax" if softmax else "sigmoid", use_selection_bias=not softmax,
                  norm_topk_prob=bool(attr("norm_topk_prob", not dots)),
                  routed_scaling_factor=float(attr("routed_scaling_factor", 1.0 if dots else 2.5)),
                  n_group=int(attr("n_group", 1)), topk_group=int(attr("topk_group", 1)))
        # GLM-5 and HY-V4: the limited SwiGLU (HY-V4's shared experts unclamped)
        kw.update(_act_of(experts))
        if kw.get("act") and type(block).__name__ in ("HYV4MoE", "HYV4VLMoE"):
            kw["shared_plain_act"] = True
    elif family == "deepseek_v2":
        method = _first(getattr(block, "topk_method", None), getattr(cfg, "topk_method", None), "greedy")
        if method not in ("greedy", "group_limited_greedy"):
            raise ValueError("moe8: DeepSeek-V2's topk_method %r is not one moe8 computes (greedy, group_limited_greedy)" % (method,))
        if bool(_first(getattr(block, "norm_topk_prob", None), getattr(cfg, "norm_topk_prob", None), False)):
            raise ValueError("moe8: DeepSeek-V2 with norm_topk_prob true is refused (docs/models.md)")
        kw.update(norm_topk_prob=False, group_score="max",
                  routed_scaling_factor=float(_first(getattr(block, "routed_scaling_factor", None), getattr(cfg, "routed_scaling_factor", None), 1.0)))
        if method == "group_limited_greedy":
            kw["n_group"] = int(_first(getattr(block, "num_group", None), getattr(block, "n_group", None), getattr(cfg, "n_group", None)))
            kw["topk_group"] = int(_first(getattr(block, "topk_group", None), getattr(cfg, "topk_group", None)))
    else:
        kw["norm_topk_prob"] = bool(_first(getattr(block, "norm_topk_prob", None), getattr(gate, "norm_topk_prob", None),
                                           getattr(cfg, "norm_topk_prob", None), False))
    weights = {}
    shared = getattr(block, "shared_expert", None) or getattr(block, "shared_experts", None)
    shared_fn = None
    if shared is not None:
        kw["shared_ffn"] = shared.gate_proj.weight.shape[0]
        kw["shared_gate"] = getattr(block, "shared_expert_gate", None) is not None

        def shared_fn():
            return (torch.cat([shared.gate_proj.weight.detach().t(), shared.up_proj.weight.detach().t()], 1),
                    shared.down_proj.weight.detach().t())
        if kw["shared_gate"]:
            weights["shared_gate_w"] = block.shared_expert_gate.weight.detach().reshape(-1)
    if family == "deepseek_v3" and kw.get("use_selection_bias"):
        weights["bias"] = gate.e_score_correction_bias.detach()
    if family == "minimax_m2":  # the block holds MiniMax-M2's bias
        weights["bias"] = block.e_score_correction_bias.detach()
    kw.update(num_experts=E, top_k=int(top_k), hidden=D, ffn=F)
    return {"config": kw, "router": wr.t(), "expert": expert, "shared": shared_fn, "weights": weights}


def _gpt_oss_spec(block, cfg):
    """transformers' GptOssMLP: router (weight [E, D], bias [E]) and experts
    (gate_up_proj [E, D, 2F] with gate and up in alternate columns, its bias
    [E, 2F], down_proj [E, F, D], its bias [E, D], alpha, limit)."""
    r, ex = block.router, block.experts
    wr = r.weight.detach()
    E, D = wr.shape
    F = ex.gate_up_proj.shape[2] // 2
    top_k = int(_first(getattr(r, "top_k", None), getattr(cfg, "num_experts_per_tok", None)))
    kw = dict(num_experts=E, top_k=top_k, hidden=D, ffn=F, norm_topk_prob=True, act="swiglu_clamp",
              act_alpha=float(_first(getattr(ex, "alpha", None), 1.702)),
              act_limit=float(_first(getattr(ex, "limit", None), getattr(cfg, "swiglu_limit", None), 7.0)),
              router_bias=True, expert_bias=True)

    def expert(e):
        gu = ex.gate_up_proj[e].detach()
        return torch.cat([gu[:, 0::2], gu[:, 1::2]], 1), ex.down_proj[e].detach()
    gub = ex.gate_up_proj_bias.detach()
    weights = {"router_bias": r.bias.detach(), "gate_up_bias": torch.cat([gub[:, 0::2], gub[:, 1::2]], dim=1),
               "down_bias": ex.down_proj_bias.detach()}
    return {"config": kw, "router": wr.t(), "expert": expert, "shared": None, "weights": weights}


def _llama4_spec(block, cfg):
    """transformers' Llama4TextMoe: router (Linear [E, D]), experts
    (gate_up_proj [E, D, 2F], gate the first F columns, down_proj
    [E, F, D]), shared_expert (gate/up/down Linear); the sigmoid of each
    chosen logit scales that expert's input."""
    wr = block.router.weight.detach()
    E, D = wr.shape
    ex = block.experts
    F = ex.gate_up_proj.shape[2] // 2
    sh = block.shared_expert
    top_k = int(_first(getattr(block, "top_k", None), getattr(cfg, "num_experts_per_tok", None), 1))
    kw = dict(num_experts=E, top_k=top_k, hidden=D, ffn=F, score="sigmoid", norm_topk_prob=False, weight_input=True,
              shared_ffn=sh.gate_proj.weight.shape[0])

    def expert(e):
        return ex.gate_up_proj[e].detach(), ex.down_proj[e].detach()

    def shared_fn():
        return torch.cat([sh.gate_proj.weight.detach().t(), sh.up_proj.weight.detach().t()], 1), sh.down_proj.weight.detach().t()
    return {"config": kw, "router": wr.t(), "expert": expert, "shared": shared_fn, "weights": {}}


def from_hf(block, config=None, rules=None, module_path="model.layers.0.mlp.experts", inference=False):
    """A MoE8Block computing transformers' MoE block `block` (Qwen2-MoE,
    Qwen3-MoE, Qwen3-Next, Mixtral, MiniMax, MiniMax-M2, OLMoE, DeepSeek-V2,
    DeepSeek-V3, GLM-4.5, dots.llm1, GPT-OSS, Llama-4), its weights copied;
    `config` is the model's config (for what the block does not hold);
    `module_path` is the experts' path the rules are matched against (patch
    gives each block its own: "<the block's name in the model>.experts").

    inference=True: the block is built as moe8's inference load builds a
    layer (Layer.inference_from_experts, from the block's tensors in
    memory, one expert converted at a time, no file written): the experts
    are held only as the kernels' packed weights (quantized by the rule),
    with no f32 masters and no backward; this needs the model's config.
    The same bytes as the training path's inference forward."""
    family = _HF_BLOCKS.get(type(block).__name__)
    if family is None:
        raise TypeError("moe8: %s is not a MoE block moe8 computes (%s)" % (type(block).__name__, ", ".join(sorted(_HF_BLOCKS))))
    cfg = config if config is not None else getattr(block, "config", None)
    if inference:
        return _from_hf_inference(block, family, cfg, rules, module_path)
    spec = _hf_spec(block, family, cfg)
    kw = dict(spec["config"])
    D, F, E, k = kw.pop("hidden"), kw.pop("ffn"), kw.pop("num_experts"), kw.pop("top_k")
    out = MoE8Block(hidden=D, ffn=F, num_experts=E, top_k=k, rules=rules, module_path=module_path, _init=False, **kw)
    with torch.no_grad():
        out.router.copy_(spec["router"])
        for e in range(E):  # one expert at a time: no f32 copy of all of them beside the masters
            gu, dn = spec["expert"](e)
            out.gate[e].copy_(gu[:, :F])
            out.up[e].copy_(gu[:, F:])
            out.down[e].copy_(dn)
            del gu, dn
        if spec["shared"] is not None:
            gu, dn = spec["shared"]()
            Fs = dn.shape[0]
            out.shared_gate.copy_(gu[:, :Fs])
            out.shared_up.copy_(gu[:, Fs:])
            out.shared_down.copy_(dn)
        for name, w in spec["weights"].items():
            if name == "bias":  # the selection bias: not a parameter (no gradient)
                out.layer.weight("bias")[:] = w.float().numpy()
            else:
                getattr(out, name).copy_(w)
    out._hf_family = family
    return out


def _from_hf_inference(block, family, cfg, rules, module_path):
    """The block as an inference layer built in memory
    (Layer.inference_from_experts): each expert converted to float32,
    quantized and packed one at a time; no file written."""
    if cfg is None:
        raise ValueError("moe8: from_hf(inference=True) needs the model's config")
    text = _rules_text(rules)
    spec = _hf_spec(block, family, cfg)
    kw = dict(spec["config"])
    kw.setdefault("norm_topk_prob", True)  # as MoE8Block
    f = spec["expert"]

    def expert(e):
        gu, dn = f(e)
        return _f32c(gu), _f32c(dn)
    shared = None
    if spec["shared"] is not None:
        gu, dn = spec["shared"]()
        shared = (_f32c(gu), _f32c(dn))
    weights = {"router": _f32c(spec["router"])}
    weights.update({n: _f32c(w) for n, w in spec["weights"].items()})
    lay = Layer.inference_from_experts(expert, rules=text, module_path=module_path, weights=weights, shared=shared, **kw)
    del shared, weights
    c = _cfg(lay)
    kw = {"score": SCORES[c.score], "group_score": "max" if c.group_score == 1 else "top2_sum",
          "act": ACTS[c.act]}
    for k in ("norm_topk_prob", "routed_scaling_factor", "use_selection_bias", "capacity_factor", "aux_loss_weight", "n_group",
              "topk_group", "shared_ffn", "shared_gate", "act_alpha", "act_limit", "router_bias", "expert_bias", "weight_input",
                  "shared_plain_act", "norm_min", "norm_eps", "select_logits", "out_bias", "norm_p", "shared_scale", "shared_act_limit",
                  "group_mask_zero", "scored_shared", "router_norm", "expert_scale", "in_norm", "out_norm", "router_norm_scale", "rms_eps",
                  "router_jitter", "zero_experts"):
        kw[k] = getattr(c, k)
    out = MoE8Block.__new__(MoE8Block)
    torch.nn.Module.__init__(out)
    out._rules, out._module_path, out._config, out._codes = text, module_path, kw, None
    out._attach(lay, inference=True)
    out._hf_family = family
    out.eval()
    return out


class _HFBlock(torch.nn.Module):
    """moe8 in a transformers block's place: the block's input and what it
    returned (the hidden states, or (hidden states, router logits) as the
    4.x Qwen and Mixtral blocks do: learned by calling the original once).
    Hidden states of any floating dtype go in (computed in float32) and
    the output has their dtype."""

    def __init__(self, moe, family, with_logits):
        super().__init__()
        self.moe, self.family, self.with_logits = moe, family, with_logits

    def extra_repr(self):
        return "family=%s" % self.family

    def forward(self, hidden_states, *args, **kwargs):
        dt = hidden_states.dtype
        x = hidden_states if dt in (torch.float32, torch.bfloat16) else hidden_states.float()
        y = self.moe(x).to(dt)
        if not self.with_logits:
            return y
        x = hidden_states.reshape(-1, hidden_states.shape[-1]).float()
        return y, (x @ self.moe.router).to(dt)


def _block_dtype(m):
    """The dtype most of the block's floating weights have (the model's:
    transformers keeps some router tensors in float32 in a bf16 model)."""
    count = {}
    for t in list(m.parameters()) + list(m.buffers()):
        if t.is_floating_point():
            count[t.dtype] = count.get(t.dtype, 0) + t.numel()
    return max(count, key=count.get) if count else torch.float32


def patch(model, rules=None, inference=None):
    """Replaces every MoE block of a transformers model moe8 computes by
    moe8 (weights copied); returns how many were replaced.  The rules are
    matched against each block's own experts path, "<its name in
    model.named_modules()>.experts" (e.g. model.layers.1.mlp.experts).

    inference: True loads each block as moe8's inference load does (the
    experts only as packed, quantized weights: no f32 masters, no
    backward); False keeps the training path (f32 masters, autograd);
    None (the default) chooses inference when the model is in eval mode
    (model.eval(), as from_pretrained returns it) and training otherwise.
    Each transformers block replaced is dropped (the model holds no
    reference to its expert tensors any more)."""
    config = getattr(model, "config", None)
    if inference is None:
        inference = not model.training
        auto = True
    else:
        auto = False
    names = [name for name, m in model.named_modules() if type(m).__name__ in _HF_BLOCKS]
    for name in names:
        parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
        m = model.get_submodule(name)
        family = _HF_BLOCKS[type(m).__name__]
        wr = (m.router if family in ("gpt_oss", "llama4_text") else m.gate).weight
        with torch.no_grad():
            r = m(torch.zeros(1, 1, wr.shape[1], dtype=_block_dtype(m)))
        with_logits = isinstance(r, tuple)
        del r, wr
        path = name + ".experts" if name else "experts"
        try:
            moe = from_hf(m, config, rules, module_path=path, inference=inference)
        except (Error, ValueError) as e:
            if not (inference and auto):
                raise
            warnings.warn("moe8: %s: the inference load failed (%s); this block runs the training path" % (name, e))
            moe = from_hf(m, config, rules, module_path=path)
        setattr(parent, name.rsplit(".", 1)[-1], _HFBlock(moe, family, with_logits))
        del m, moe
    return len(names)


for _obj in (MoE8Block, _HFBlock, from_hf, patch, _MoE8Function):
    _obj.__module__ = "moe8.torch"
