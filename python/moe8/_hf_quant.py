"""transformers' quantizer plug-in: from_pretrained(...,
quantization_config=moe8.torch.Moe8Config(rules)) loads every experts
module straight into moe8's inference layer (docs/integration.md, "The
lean load through transformers").

transformers builds the model on the meta device and then loads the
checkpoint one tensor at a time (merging per-expert tensors into the fused
gate_up_proj / down_proj first where the checkpoint keeps them apart).  For
an experts module moe8 runs, this quantizer takes each fused tensor as it
is loaded (the quantize op), builds the module's lean layer (quantized and
packed as the rule says, one expert's float32 copy at a time) once both of
its tensors are in, and leaves an empty tensor in the parameter's place:
the bf16 or f32 expert weights are never kept.  Everything else (attention,
norms, embeddings, the routers, shared experts) loads as transformers loads
it.  The module's forward then runs through experts_implementation "moe8".

Imported by register_transformers() (it imports transformers)."""
import ctypes
import json
import mmap
import os
import re
import struct

import torch

from transformers.core_model_loading import ConversionOps
from transformers.quantizers.auto import register_quantization_config, register_quantizer
from transformers.quantizers.base import HfQuantizer
from transformers.utils.quantization_config import QuantizationConfigMixin

from . import Layer, Rules
from ._torch_op import _act_of, _lean_layer, _ungated, _why_not, register_layer

METHOD = "moe8"

# The config keys transformers' families give the experts a token is routed
# to (the experts module does not hold it; the layer needs it).
_TOP_K_KEYS = ("num_experts_per_tok", "moe_topk", "moe_k", "top_k", "num_experts_per_token", "experts_per_token",
               "moe_top_k", "num_selected_experts")


class Moe8Config(QuantizationConfigMixin):
    """The quantization config of moe8's load: rules (a dict, JSON text or
    a rules file's path; None: no rule, the experts kept in float32) match
    each experts module by its path in the model (e.g.
    model.layers.3.mlp.experts); modules_to_not_convert lists module-path
    prefixes left to transformers."""

    def __init__(self, rules=None, modules_to_not_convert=None, experts_from_files=False, **kwargs):
        from ._torch import _rules_text
        self.quant_method = METHOD
        self.rules = _rules_text(rules)
        self.modules_to_not_convert = list(modules_to_not_convert or [])
        # True: moe8's own loader reads each experts module's tensors from
        # the checkpoint's files (any file `moe8 run` reads: float, moe8's
        # FP8 / int8 / MXFP4, GPT-OSS's MXFP4); transformers reads the rest
        # (moe8.torch.from_pretrained)
        self.experts_from_files = bool(experts_from_files)

    def to_dict(self):
        return {"quant_method": METHOD, "rules": self.rules, "modules_to_not_convert": list(self.modules_to_not_convert),
                "experts_from_files": self.experts_from_files}


def _expert_ranges(files):
    """(file, start, end) of each checkpoint tensor whose name has an
    ".experts." part, from the safetensors headers (8 bytes of header
    length, the JSON header, then the data)."""
    out = []
    for path in files or ():
        if not str(path).endswith(".safetensors"):
            continue
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                continue
            n = struct.unpack("<Q", head)[0]
            if n > (100 << 20):
                continue
            meta = json.loads(f.read(n))
        real = os.path.realpath(path)
        for key, v in meta.items():
            if key != "__metadata__" and ".experts." in key and isinstance(v, dict) and "data_offsets" in v:
                b, e = v["data_offsets"]
                out.append((real, 8 + n + b, 8 + n + e))
    return out


_MADV_DONTNEED = 4
_libc = None


def _release(ranges, model):
    """Drops this process's pages of the checkpoint's expert tensors once
    they are read (madvise MADV_DONTNEED on their whole pages in the
    mappings of the files): the kernel keeps them as page cache and reads
    them again if they are touched again.  A page that holds any byte of a
    live parameter or buffer of the model (transformers maps the other
    weights in place) is kept."""
    global _libc
    if not ranges:
        return
    maps = {}
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6:
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                maps.setdefault(parts[5].strip(), []).append((lo, hi, int(parts[2], 16)))
    live = []
    for t in list(model.parameters()) + list(model.buffers()):
        if t.device.type == "cpu" and t.numel() > 0:
            st = t.untyped_storage()
            live.append((st.data_ptr(), st.data_ptr() + st.nbytes()))
    live.sort()
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    page = mmap.PAGESIZE
    for path, b, e in ranges:
        for lo, hi, off in maps.get(path, ()):
            a0, a1 = lo + b - off, lo + e - off
            a0, a1 = max(lo, (a0 + page - 1) // page * page), min(hi, a1 // page * page)
            if a1 <= a0 or any(x < a1 and y > a0 for x, y in live):
                continue
            _libc.madvise(a0, a1 - a0, _MADV_DONTNEED)


def _experts_modules(model):
    """(name, module) of each experts module (transformers' experts
    classes: fused gate_up_proj, or up_proj alone for ungated experts, and
    down_proj tensors)."""
    for name, m in model.named_modules():
        gu, dn = getattr(m, "gate_up_proj", getattr(m, "up_proj", None)), getattr(m, "down_proj", None)
        if isinstance(gu, torch.Tensor) and isinstance(dn, torch.Tensor) and hasattr(m, "is_concatenated"):
            yield name, m


def _tensors_of(m):
    """The names of the tensors an experts module's lean layer is built
    from: up_proj for ungated experts (Nemotron-H's), gate_up_proj else;
    down_proj; with expert biases (GPT-OSS's), both biases."""
    names = ("up_proj" if _ungated(m) else "gate_up_proj", "down_proj")
    return names + (("gate_up_proj_bias", "down_proj_bias") if getattr(m, "has_bias", False) else ())


def _rule_for(text, name):
    """The rule set that gives the rule `name` (the experts module's path
    in the transformers model) matches, for a layer the files may name
    otherwise (Mixtral's block_sparse_moe.): that rule alone, matching any
    path; None when no rule matches (the file's own format)."""
    if text is None:
        return None
    i = Rules(text).match(name)
    if i is None:
        return None
    spec = json.loads(text)
    spec = {"rules": spec} if isinstance(spec, list) else dict(spec)
    rule = dict(spec["rules"][i], module_path=".*")
    spec["rules"] = [rule]
    return spec


def _top_k(config):
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    for key in _TOP_K_KEYS:
        v = getattr(cfg, key, None)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    raise ValueError("moe8: the model's config names no experts per token (one of %s)" % ", ".join(_TOP_K_KEYS))


class Moe8Quantize(ConversionOps):
    """The quantize op: a fused expert tensor in, its module's lean layer
    built once both are in, an empty tensor out in its place."""

    def __init__(self, quantizer):
        self.hf_quantizer = quantizer

    def convert(self, input_dict, **kwargs):
        q = self.hf_quantizer
        out = {}
        for key, value in input_dict.items():
            t = value[0] if isinstance(value, list) else value
            path, _, name = key.rpartition(".")
            slot = q._pending.setdefault(path, {})
            slot[name] = t
            out[key] = torch.empty(0, dtype=t.dtype)
            need = _tensors_of(q._targets[path])
            if all(n in slot for n in need):
                q._build(path, *(slot.pop(n) for n in need))
                del q._pending[path]
        return out

    @property
    def reverse_op(self):
        raise NotImplementedError("moe8: a model loaded by moe8's quantizer cannot be saved back in transformers' layout")


class Moe8HfQuantizer(HfQuantizer):
    """moe8's HfQuantizer: quantizes on the fly (a float checkpoint: bf16,
    f16 or f32); the experts modules moe8 runs (what experts_implementation
    "moe8" runs: SwiGLU and its clamped forms, GeGLU, ungated relu² / relu,
    GPT-OSS's interleaved experts with biases) are loaded into lean moe8
    layers, any other module is loaded by transformers unchanged.
    Inference only."""

    requires_calibration = False

    def __init__(self, quantization_config, **kwargs):
        super().__init__(quantization_config, **kwargs)
        self._targets, self._pending, self._k, self._ranges, self._model = {}, {}, None, [], None

    def validate_environment(self, *args, **kwargs):
        if self.pre_quantized:
            raise ValueError("moe8: this checkpoint's config.json already names quant_method \"moe8\"; moe8 quantizes while it "
                             "loads a float checkpoint and does not write one")

    def _process_model_before_weight_loading(self, model, checkpoint_files=None, **kwargs):
        self._k = _top_k(model.config)
        self._model = model
        if self.quantization_config.experts_from_files:
            return self._load_from_files(model, checkpoint_files)
        self._ranges = _expert_ranges(checkpoint_files)
        skip = tuple(self.quantization_config.modules_to_not_convert)
        for name, m in _experts_modules(model):
            if skip and name.startswith(skip):
                continue
            if _why_not(m) or getattr(m, "has_post_expert_norm", False):
                continue  # transformers loads and runs it as it is (MuSE-Spark's: experts_implementation="moe8")
            m.__dict__["_moe8_rules"], m.__dict__["_moe8_path"] = self.quantization_config.rules, name or "experts"
            self._targets[name] = m
        if not self._targets:
            raise ValueError("moe8: %s has no experts module moe8 runs (what experts_implementation \"moe8\" runs: gate_up_proj "
                             "or ungated up_proj, and down_proj; no norm after each expert: run MuSE-Spark's with "
                             "experts_implementation=\"moe8\")" % type(model).__name__)

    def _load_from_files(self, model, checkpoint_files):
        """Every experts module of a MoE layer: its moe8 inference layer
        read from the checkpoint by moe8's loader (as `moe8 run` reads
        it), its parameters replaced by empty ones, and the checkpoint's
        tensors under it left unread by transformers."""
        files = [str(f) for f in checkpoint_files or ()]
        if not files:
            raise ValueError("moe8: experts_from_files needs the checkpoint's files (a local model directory)")
        model_dir = os.path.dirname(os.path.abspath(files[0]))
        skip = tuple(self.quantization_config.modules_to_not_convert)
        rules = self.quantization_config.rules
        for name, m in _experts_modules(model):
            if skip and name.startswith(skip):
                continue
            if getattr(m, "has_post_expert_norm", False):
                continue  # MuSE-Spark's: the files' layer is the whole latent block, not this module's experts
            found = re.search(r"(?:^|\.)layers\.([0-9]+)\.", name + ".")
            if not found:
                raise ValueError("moe8: experts module %s names no layer (layers.N.)" % name)
            lay = Layer.from_model(model_dir, layer=int(found.group(1)), rules=_rule_for(rules, name))
            # (the files may name the block otherwise: Mixtral's block_sparse_moe., which transformers renames)
            gu = m.gate_up_proj
            E = gu.shape[0]
            if lay.num_experts != E or lay.top_k != self._k or lay.hidden not in gu.shape[1:]:
                raise ValueError("moe8: %s is %d experts of hidden %s, top-%d; the checkpoint's layer has %d of hidden %d, top-%d"
                                 % (name, E, list(gu.shape[1:]), self._k, lay.num_experts, lay.hidden, lay.top_k))
            for pname, p in list(m.named_parameters(recurse=False)):  # out of the state dict: not loaded, not missing
                del m._parameters[pname]
                m.__dict__[pname] = torch.empty(0, dtype=p.dtype)
            register_layer(lay)
            m.__dict__["_moe8_loaded"], m.__dict__["_moe8_path"] = lay, name
            self._targets[name] = m
        if not self._targets:
            raise ValueError("moe8: %s has no experts module" % type(model).__name__)
        # the experts' tensors in the files are moe8's: neither read by
        # transformers nor reported missing or unexpected
        pats = {r"(^|\.)%s\." % re.escape(n) for n in self._targets}
        for attr in ("_keys_to_ignore_on_load_unexpected", "_keys_to_ignore_on_load_missing"):
            setattr(model, attr, set(getattr(model, attr, None) or ()) | pats)

    def param_needs_quantization(self, model, param_name, **kwargs):
        if self.quantization_config.experts_from_files:
            return False
        path, _, name = param_name.rpartition(".")
        return path in self._targets and name in _tensors_of(self._targets[path])

    def get_quantize_ops(self):
        return Moe8Quantize(self)

    def _build(self, path, gu, dn, *biases):
        m = self._targets[path]
        lay = _lean_layer(gu, dn, getattr(m, "is_transposed", False), self._k, m.__dict__.get("_moe8_rules"), path, _act_of(m),
                          not getattr(m, "is_concatenated", True), tuple(biases) if biases else None)
        register_layer(lay)
        m.__dict__["_moe8_loaded"] = lay
        del gu, dn, biases
        _release(self._ranges, self._model)

    def _process_model_after_weight_loading(self, model, **kwargs):
        missing = sorted(p for p, m in self._targets.items() if "_moe8_loaded" not in m.__dict__)
        if missing or self._pending:
            raise ValueError("moe8: the checkpoint did not give both expert tensors of %s"
                             % ", ".join(missing or sorted(self._pending)))
        model.set_experts_implementation(METHOD)
        self._model, self._ranges = None, []
        return model

    def is_serializable(self, *args, **kwargs):
        return False

    @property
    def is_trainable(self):
        return False


def from_pretrained(model_dir, rules=None, model_class=None, **kwargs):
    """A transformers model loaded from a local checkpoint directory with
    its experts read by moe8's own loader (Moe8Config(experts_from_files=
    True)): each experts module holds only what moe8's inference load
    keeps (GPT-OSS's MXFP4 codes as they are, moe8's FP8 / int8 / MXFP4
    files' codes, a float checkpoint quantized as `rules` say), and no
    float copy of an expert weight is made.  The rest of the model is
    loaded by transformers (kwargs go to model_class.from_pretrained,
    default AutoModelForCausalLM; e.g. dtype=torch.bfloat16).  A config
    whose quantization_config is MXFP4 (GPT-OSS: only the experts are
    quantized) is loaded so; other quantized checkpoints are refused."""
    from transformers import AutoConfig, AutoModelForCausalLM
    register()
    from ._torch_op import register_transformers
    register_transformers()
    config = kwargs.pop("config", None) or AutoConfig.from_pretrained(model_dir)
    qc = getattr(config, "quantization_config", None)
    if qc is not None:
        method = qc.get("quant_method") if isinstance(qc, dict) else getattr(qc, "quant_method", None)
        method = getattr(method, "value", method)
        if method != "mxfp4":
            raise ValueError("moe8: %s: config.json's quantization_config is %r; moe8.torch.from_pretrained reads float "
                             "checkpoints, moe8's own files and MXFP4 experts (GPT-OSS)" % (model_dir, method))
        del config.quantization_config  # only the experts are MXFP4: moe8 reads them, transformers the rest
    if "quantization_config" in kwargs:
        raise ValueError("moe8: from_pretrained sets quantization_config itself (give rules=...)")
    cls = model_class or AutoModelForCausalLM
    return cls.from_pretrained(model_dir, config=config, quantization_config=Moe8Config(rules, experts_from_files=True), **kwargs)


def register():
    """Registers Moe8Config and Moe8HfQuantizer under "moe8" (once)."""
    from transformers.quantizers.auto import AUTO_QUANTIZATION_CONFIG_MAPPING, AUTO_QUANTIZER_MAPPING
    if AUTO_QUANTIZATION_CONFIG_MAPPING.get(METHOD) is not Moe8Config:
        AUTO_QUANTIZATION_CONFIG_MAPPING.pop(METHOD, None)
        register_quantization_config(METHOD)(Moe8Config)
    if AUTO_QUANTIZER_MAPPING.get(METHOD) is not Moe8HfQuantizer:
        AUTO_QUANTIZER_MAPPING.pop(METHOD, None)
        register_quantizer(METHOD)(Moe8HfQuantizer)


for _obj in (Moe8Config, Moe8HfQuantizer, Moe8Quantize):
    _obj.__module__ = "moe8.torch"
