"""moe8 from Python: the quantized Mixture-of-Experts layer over the shared
library libmoe8.so (ctypes; numpy arrays in and out).

    import numpy as np, moe8
    layer = moe8.Layer.from_model("model_dir")            # inference load
    y = layer.forward(np.zeros((4, layer.hidden), np.float32))

Arrays: inputs must be C-contiguous float32 (others are converted, which
copies); outputs are new arrays unless `out=` is given, which is written in
place.  `Layer.weight(name)` is a view of the layer's own f32 master (no
copy): writing to it changes the layer.  Every failing call raises
`moe8.Error` carrying moe8_last_error()'s message and the status.
The library: $MOE8_LIBRARY, else the copy installed with this package,
else the system's (ldconfig / LD_LIBRARY_PATH)."""
import ctypes as C
import ctypes.util
import glob
import json
import math
import os
import threading

import numpy as np

__all__ = ["__version__", "Error", "Layer", "Rules", "version", "quantize", "dequantize", "convert", "library_path", "DTYPES", "set_num_threads", "quantize_model",
           "get_num_threads"]

# ---- the library -----------------------------------------------------------------------
def _find_library():
    env = os.environ.get("MOE8_LIBRARY")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    for pat in ("_lib/libmoe8.so*", "../../build/libmoe8.so*"):
        hits = sorted(glob.glob(os.path.join(here, pat)))
        if hits:
            return hits[0]
    found = ctypes.util.find_library("moe8")
    if found:
        return found
    raise OSError("moe8: libmoe8.so not found (set MOE8_LIBRARY, install the package with the library, or install moe8)")


library_path = _find_library()
_lib = C.CDLL(library_path)

_P = C.c_void_p
_i64 = C.c_int64


def _fn(name, res, *args):
    f = getattr(_lib, name)
    f.restype = res
    f.argtypes = list(args)
    return f


DTYPES = {"none": 0, "f32": 1, "bf16": 2, "f8e4m3": 3, "f8e5m2": 4, "i8": 5}
_NP = {1: np.float32, 2: np.uint16, 3: np.uint8, 4: np.uint8, 5: np.int8}
_GRAN = {"tensor": 0, "row": 1, "row_tile": 2, "channel": 3, "channel_tile": 4, "block2d": 5}
_STATUS = ["ok", "invalid argument", "shape mismatch", "unsupported dtype", "non-finite or invalid value", "out of memory", "i/o error",
           "format error", "parse error", "unsupported", "internal error"]


class Error(Exception):
    """A moe8 call failed: .status (int), .status_name, and the message."""

    def __init__(self, status, message):
        self.status = status
        self.status_name = _STATUS[status] if 0 <= status < len(_STATUS) else str(status)
        super().__init__("moe8: %s: %s" % (self.status_name, message))


_last_error = _fn("moe8_last_error", C.c_char_p)


def _check(st):
    if st != 0:
        raise Error(st, _last_error().decode("utf-8", "replace"))


# The experts' activations by moe8_expert_act value (include/moe8.h).
ACTS = ("swiglu", "swiglu_clamp", "swiglu_limit", "swiglu_post", "swiglu_softcap", "geglu", "relu2", "relu", "silu")
# The ungated ones: up [D, F] alone, no gate weight ("silu": the product-key experts', Doge's).
UNGATED = ("relu2", "relu", "silu")
# The router's score functions by moe8_score_func value.
SCORES = ("softmax", "sigmoid", "sqrtsoftplus", "sparsemixer")


class _LayerConfig(C.Structure):
    _fields_ = [("num_experts", _i64), ("top_k", _i64), ("hidden", _i64), ("ffn", _i64), ("score", C.c_int),
                ("norm_topk_prob", C.c_bool), ("routed_scaling_factor", C.c_float), ("use_selection_bias", C.c_bool),
                ("capacity_factor", C.c_float), ("aux_loss_weight", C.c_float), ("n_group", _i64), ("topk_group", _i64),
                ("shared_ffn", _i64), ("shared_gate", C.c_bool), ("group_score", C.c_int), ("act", C.c_int),
                ("act_alpha", C.c_float), ("act_limit", C.c_float), ("router_bias", C.c_bool), ("expert_bias", C.c_bool),
                ("weight_input", C.c_bool), ("shared_plain_act", C.c_bool), ("norm_min", C.c_float),
                ("norm_eps", C.c_float), ("select_logits", C.c_bool), ("out_bias", C.c_bool),
                ("norm_p", C.c_float), ("shared_scale", C.c_float), ("shared_act_limit", C.c_float), ("hash_routing", C.c_bool),
                ("group_mask_zero", C.c_bool), ("scored_shared", _i64), ("router_norm", C.c_bool), ("expert_scale", C.c_bool),
                ("in_norm", C.c_bool), ("out_norm", C.c_bool), ("router_norm_scale", C.c_float), ("rms_eps", C.c_float),
                ("router_jitter", C.c_float), ("zero_experts", _i64), ("latent", _i64), ("latent_norm", C.c_bool),
                ("expert_out_norm", C.c_bool), ("expert_out_eps", C.c_float), ("expert_capacity", _i64), ("router_mlp", _i64),
                ("router_state", C.c_bool), ("skip_experts", _i64), ("product_keys", C.c_bool), ("capacity_fraction", C.c_double),
                ("capacity_ranked", C.c_bool)]


class _QuantSpec(C.Structure):
    _fields_ = [("qtype", C.c_int), ("gran", C.c_int), ("tile", _i64), ("block_n", _i64), ("calib", C.c_int), ("clip", C.c_float),
                ("pow2", C.c_bool)]


class _Grads(C.Structure):
    _fields_ = [(n, _P) for n in ("dx", "dwr", "dwg", "dwu", "dwd", "dwsg", "dwsu", "dwsd", "dwsgate", "dwrb", "dwgub", "dwdb", "dwob",
                                      "dwrs", "dwes", "dwin", "dwon", "dwli", "dwlo", "dwln", "dweon")]


_PROGRESS = C.CFUNCTYPE(None, C.c_void_p, C.c_int64, C.c_int64)


class _LoadOptions(C.Structure):
    _fields_ = [("size", C.c_size_t), ("mode", C.c_int), ("progress", _P), ("ctx", _P)]


class _QuantizeOptions(C.Structure):
    _fields_ = [("size", C.c_size_t), ("format", C.c_int), ("force", C.c_bool), ("progress", _P), ("ctx", _P)]


_LINE = C.CFUNCTYPE(None, C.c_void_p, C.c_char_p)


class _Prepared(C.Structure):
    _fields_ = [("dtype", C.c_int), ("tile", _i64), ("w_gate_up", _P), ("s_gate_up", _P), ("w_down", _P), ("s_down", _P)]


_version_string = _fn("moe8_version_string", C.c_char_p)
_struct_size = _fn("moe8_struct_size", C.c_size_t, C.c_char_p)
# The structs mirrored here must be the library's: checked once, at import.
for _name, _cls in (("moe8_layer_config", _LayerConfig), ("moe8_quant_spec", _QuantSpec), ("moe8_layer_grads", _Grads),
                    ("moe8_load_options", _LoadOptions), ("moe8_quantize_options", _QuantizeOptions), ("moe8_prepared", _Prepared)):
    if _struct_size(_name.encode()) != C.sizeof(_cls):
        raise ImportError("moe8: %s is %d bytes in %s but %d in this package: the package and the library do not match"
                          % (_name, _struct_size(_name.encode()), library_path, C.sizeof(_cls)))
_rules_parse = _fn("moe8_rules_parse", C.c_int, C.c_char_p, C.c_size_t, C.c_char_p, C.POINTER(_P))
_rules_destroy = _fn("moe8_rules_destroy", None, _P)
_layer_create = _fn("moe8_layer_create", C.c_int, C.POINTER(_LayerConfig), _P, C.c_char_p, C.POINTER(_P))
_layer_destroy = _fn("moe8_layer_destroy", None, _P)
_layer_create_inference = _fn("moe8_layer_create_inference", C.c_int, C.POINTER(_LayerConfig), _P, C.c_char_p, C.POINTER(_P))
_layer_put_expert = _fn("moe8_layer_put_expert", C.c_int, _P, C.c_int, _i64, _P, _P)
_layer_finish_load = _fn("moe8_layer_finish_load", C.c_int, _P)
_layer_weight = _fn("moe8_layer_weight", C.POINTER(C.c_float), _P, C.c_int, C.POINTER(C.c_size_t))
_layer_weight_read = _fn("moe8_layer_weight_read", C.POINTER(C.c_float), _P, C.c_int, C.POINTER(C.c_size_t))
_layer_init_random = _fn("moe8_layer_init_random", C.c_int, _P, C.c_uint64)
_layer_get_config = _fn("moe8_layer_get_config", C.POINTER(_LayerConfig), _P)
_layer_describe = _fn("moe8_layer_describe", C.c_char_p, _P)
_layer_ws = _fn("moe8_layer_workspace_size", C.c_size_t, _P, _i64)
_layer_forward = _fn("moe8_layer_forward", C.c_int, _P, _P, _i64, _P, C.POINTER(C.c_float), _P, C.c_size_t)
_layer_forward_fused = _fn("moe8_layer_forward_fused", C.c_int, _P, _P, _i64, _P, _P, C.c_size_t)
_layer_forward_tokens = _fn("moe8_layer_forward_tokens", C.c_int, _P, _P, _i64, _P, _P, C.POINTER(C.c_float), _P, C.c_size_t)
_layer_forward_fused_tokens = _fn("moe8_layer_forward_fused_tokens", C.c_int, _P, _P, _i64, _P, _P, _P, C.c_size_t)
_layer_forward_seq = _fn("moe8_layer_forward_seq", C.c_int, _P, _P, _i64, _P, _i64, _P, C.POINTER(C.c_float), _P, C.c_size_t)
_layer_forward_fused_seq = _fn("moe8_layer_forward_fused_seq", C.c_int, _P, _P, _i64, _P, _i64, _P, _P, C.c_size_t)
_layer_forward_state = _fn("moe8_layer_forward_state", C.c_int, _P, _P, _i64, _P, _P, _P, C.POINTER(C.c_float), _P, C.c_size_t)
_layer_forward_fused_state = _fn("moe8_layer_forward_fused_state", C.c_int, _P, _P, _i64, _P, _P, _P, _P, C.c_size_t)
_layer_set_hash_table = _fn("moe8_layer_set_hash_table", C.c_int, _P, _P, _i64)
_layer_hash_table = _fn("moe8_layer_hash_table", C.POINTER(C.c_int32), _P, C.POINTER(_i64))
_layer_backward = _fn("moe8_layer_backward", C.c_int, _P, _P, _i64, _P, _P, C.c_size_t, C.POINTER(_Grads))
_layer_prepare = _fn("moe8_layer_prepare", C.c_int, _P)
_layer_weights_changed = _fn("moe8_layer_weights_changed", None, _P)
_layer_experts = _fn("moe8_layer_experts", C.c_int, _P, _P, _i64, _P, _P, _P, _P, C.c_size_t)
_layer_experts_routed = _fn("moe8_layer_experts_routed", C.c_int, _P, _P, _i64, _P, _P, _P, _P, C.c_size_t)
_rules_load = _fn("moe8_rules_load", C.c_int, C.c_char_p, C.POINTER(_P))
_model_open_as = _fn("moe8_model_open_as", C.c_int, C.c_char_p, C.c_char_p, C.POINTER(_P))
_model_close = _fn("moe8_model_close", None, _P)
_model_load = _fn("moe8_model_load_layer_ex", C.c_int, _P, _i64, _P, C.POINTER(_LoadOptions), C.POINTER(_P))
_first_moe = _fn("moe8_hf_config_first_moe_layer", _i64, _P)
_check_moe_layer = _fn("moe8_hf_config_check_moe_layer", C.c_int, _P, _i64)
_model_config = _fn("moe8_model_config", _P, _P)
_model_prefix = _fn("moe8_model_prefix", None, _P, _i64, C.c_char_p, C.c_size_t)
_model_format = _fn("moe8_model_format", C.c_char_p, _P, _i64)


class _Rule(C.Structure):
    _fields_ = [("module_path", C.c_char_p), ("weight_qtype", C.c_int), ("act_qtype", C.c_int), ("bwd_qtype", C.c_int),
                ("tile_size", _i64), ("weight_clip", C.c_float), ("weight_pow2", C.c_bool), ("act_clip", C.c_float),
                ("act_pow2", C.c_bool), ("weight_calib", C.c_int), ("act_calib", C.c_int), ("weight_mxfp4", C.c_bool),
                ("weight_mx8", C.c_bool)]


_layer_rule = _fn("moe8_layer_rule", C.POINTER(_Rule), _P)
_rules_at = _fn("moe8_rules_at", C.POINTER(_Rule), _P, C.c_size_t)
_rules_match = _fn("moe8_rules_match", C.c_void_p, _P, C.c_char_p)
_rules_count = _fn("moe8_rules_count", C.c_size_t, _P)
_layer_prepared = _fn("moe8_layer_prepared", C.c_int, _P, C.POINTER(_Prepared))
_layer_load_prepared = _fn("moe8_layer_load_prepared", C.c_int, _P, C.POINTER(_Prepared))
_quantize = _fn("moe8_quantize", C.c_int, C.POINTER(_QuantSpec), _P, _i64, _i64, _i64, _P, _P, C.POINTER(C.c_size_t))
_dequantize = _fn("moe8_dequantize", C.c_int, C.POINTER(_QuantSpec), _P, _P, _i64, _i64, _i64, _P)
_scale_count = _fn("moe8_quant_scale_count", C.c_size_t, C.POINTER(_QuantSpec), _i64, _i64, _i64, C.POINTER(C.c_int))
_convert = _fn("moe8_convert", C.c_int, _P, C.c_int, _P, C.c_int, C.c_size_t, C.c_uint)


def version():
    """The linked library's version string, e.g. "0.2.0"."""
    return _version_string().decode()


__version__ = version()

_set_threads = _fn("moe8_set_num_threads", C.c_int, C.c_int)
_get_threads = _fn("moe8_get_num_threads", C.c_int)


def set_num_threads(n):
    """Threads for moe8's large loops, for the whole process: n >= 1, or 0
    for OpenMP's count (OMP_NUM_THREADS, else one per CPU).  Small loops run
    on the calling thread whatever n is.  Results do not depend on n.  Next
    to other busy threads (a serving process) also start Python with
    OMP_WAIT_POLICY=passive (docs/performance.md)."""
    _check(_set_threads(_int_arg(n, "n", 0, 4096)))


def get_num_threads():
    """The threads a large moe8 loop runs on now."""
    return int(_get_threads())


def _f32(a, name, ndim=None, shape=None):
    """a as a C-contiguous, aligned float32 array (no copy when it already
    is one); ndim and shape (None entries: any) are checked."""
    arr = np.require(a, dtype=np.float32, requirements=["C", "A"])
    if ndim is not None and arr.ndim != ndim:
        raise Error(2, "%s must be %d-D, got %d-D %s" % (name, ndim, arr.ndim, list(arr.shape)))
    if shape is not None and any(w is not None and w != g for w, g in zip(shape, arr.shape)):
        raise Error(2, "%s has shape %s, expected %s" % (name, list(arr.shape), ["*" if w is None else w for w in shape]))
    return arr


def _out(out, shape, name="out"):
    """An out= array: written in place, so it must already be a writable,
    aligned, C-contiguous float32 array of the right shape (no copy)."""
    if not isinstance(out, np.ndarray) or out.dtype != np.float32 or not out.flags.c_contiguous or tuple(out.shape) != tuple(shape):
        raise Error(1, "%s must be a C-contiguous float32 numpy array of shape %s" % (name, tuple(shape)))
    if not out.flags.writeable:
        raise Error(1, "%s is read-only; moe8 writes its result there" % name)
    if not out.flags.aligned:
        raise Error(1, "%s is not aligned for float32" % name)
    return out


def _int_arg(v, name, lo=0, hi=(1 << 62)):
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not lo <= int(v) <= hi:
        raise Error(1, "%s = %r must be an integer in [%d, %d]" % (name, v, lo, hi))
    return int(v)


def _ptr(a):
    return C.c_void_p(a.ctypes.data) if a is not None else None


# ---- rules -------------------------------------------------------------------------------
class Rules:
    """A quantization rule set, from JSON text, a dict or a file path."""

    def __init__(self, rules):
        h = _P()
        if isinstance(rules, dict):
            raw = json.dumps(rules).encode()
            _check(_rules_parse(raw, len(raw), b"rules", C.byref(h)))
        elif isinstance(rules, (bytes, str)) and rules.lstrip()[:1] in ("{", "[", b"{", b"["):
            raw = rules.encode() if isinstance(rules, str) else rules
            _check(_rules_parse(raw, len(raw), b"rules", C.byref(h)))
        elif isinstance(rules, (str, bytes, os.PathLike)):
            # a path: the library's own loader (a regular file only, never
            # blocking on a FIFO or a device, at most 64 MiB)
            _check(_rules_load(os.fsencode(rules), C.byref(h)))
        else:
            raise Error(1, "rules must be a dict, JSON text or a path, not %s" % type(rules).__name__)
        self._h = h

    def match(self, module_path):
        """The index of the rule that applies to module_path (the first
        whose pattern matches, as a layer picks its rule), or None."""
        hit = _rules_match(self._h, module_path.encode())
        if not hit:
            return None
        for i in range(_rules_count(self._h)):
            if C.addressof(_rules_at(self._h, i).contents) == hit:
                return i
        return None

    def __del__(self):
        if getattr(self, "_h", None):
            _rules_destroy(self._h)
            self._h = None


def _as_rules(rules):
    return rules if rules is None or isinstance(rules, Rules) else Rules(rules)


_model_quantize = _fn("moe8_model_quantize", C.c_int, C.c_char_p, C.c_char_p, _P, C.POINTER(_QuantizeOptions))


def quantize_model(model_dir, out_dir, rules, format="moe8", force=False, progress=None):
    """Pre-quantizes the expert weights of the model in model_dir into out_dir,
    as `moe8 quantize` does (the same files): each MoE layer whose
    "<prefix>experts" module path matches a rule with weight_qtype f8e4m3
    or int8; everything else is copied.  format "moe8" ([E, nb, 1, N]
    scales, the kernels' packed layout) or "deepseek" (F8_E4M3 with 128x128
    block scales).  out_dir may not be model_dir; a model already there is
    replaced only with force=True.  A failure raises moe8.Error and leaves
    out_dir as it was.  progress(line) gets one line per tensor or layer
    and a summary; progress=True prints them."""
    fmts = {"moe8": 0, "deepseek": 1}
    if format not in fmts:
        raise Error(1, "format must be 'moe8' or 'deepseek', not %r" % (format,))
    r = _as_rules(rules)
    if r is None:
        raise Error(1, "quantize_model needs rules (a dict, JSON text, a path or moe8.Rules)")
    if progress is True:
        progress = print
    errors = []

    def _line(ctx, line):
        try:
            progress(line.decode(errors="replace"))
        except BaseException as e:  # never unwind through C
            errors.append(e)

    cb = _LINE(_line) if progress else None
    o = _QuantizeOptions(C.sizeof(_QuantizeOptions), fmts[format], bool(force),
                         C.cast(cb, _P) if cb else None, None)
    _check(_model_quantize(os.fsencode(model_dir), os.fsencode(out_dir), r._h, C.byref(o)))
    if errors:
        raise errors[0]


# ---- quantization ------------------------------------------------------------------------
def _spec(qtype, granularity, tile, block_n, clip, pow2):
    return _QuantSpec(DTYPES[qtype], _GRAN[granularity], tile, block_n, 0, clip, pow2)


def quantize(x, qtype="f8e4m3", granularity="row", tile=0, block_n=0, clip=1.0, pow2=False):
    """Quantizes x (2-D [R, C] or 3-D [E, R, C], float32) as moe8 does;
    returns (codes, scales) with the granularity's scale shape flattened."""
    x = _f32(x, "x")
    E, R, Cc = (1,) + x.shape if x.ndim == 2 else x.shape
    s = _spec(qtype, granularity, tile, block_n, clip, pow2)
    st = C.c_int(0)
    n = _scale_count(C.byref(s), E, R, Cc, C.byref(st))
    _check(st.value)
    q = np.empty(x.shape, dtype=_NP[DTYPES[qtype]])
    sc = np.empty(n, dtype=np.float32)
    _check(_quantize(C.byref(s), _ptr(x), E, R, Cc, _ptr(q), _ptr(sc), None))
    return q, sc


def dequantize(q, scales, qtype="f8e4m3", granularity="row", tile=0, block_n=0):
    if qtype not in ("f8e4m3", "f8e5m2", "i8"):
        raise Error(3, "dequantize: qtype must be f8e4m3, f8e5m2 or i8, not %r" % (qtype,))
    if granularity not in _GRAN:
        raise Error(1, "dequantize: unknown granularity %r" % (granularity,))
    q = np.asarray(q)
    want = _NP[DTYPES[qtype]]
    if q.dtype != want:
        raise Error(3, "dequantize: %s codes must be a %s array, got %s" % (qtype, np.dtype(want).name, q.dtype))
    if q.ndim not in (2, 3):
        raise Error(2, "dequantize: codes must be 2-D or 3-D, got shape %s" % (list(q.shape),))
    q = np.require(q, requirements=["C", "A"])
    E, R, Cc = (1,) + q.shape if q.ndim == 2 else q.shape
    s = _spec(qtype, granularity, tile, block_n, 1.0, False)
    st = C.c_int(0)
    n = _scale_count(C.byref(s), E, R, Cc, C.byref(st))
    _check(st.value)
    scales = _f32(scales, "scales").reshape(-1)
    if scales.size != n:
        raise Error(2, "dequantize: %s scales for codes of shape %s at %s granularity (tile %d) must be %d values, got %d"
                    % (qtype, list(q.shape), granularity, tile, n, scales.size))
    y = np.empty(q.shape, dtype=np.float32)
    _check(_dequantize(C.byref(s), _ptr(q), _ptr(scales), E, R, Cc, _ptr(y)))
    return y


def convert(x, dst="f8e4m3", src="f32", saturate=True):
    """Element conversion between f32, bf16 (uint16 bits), f8e4m3/f8e5m2
    (uint8 codes) and i8, each a single rounding of the exact value."""
    x = np.ascontiguousarray(x, dtype=_NP[DTYPES[src]])
    y = np.empty(x.shape, dtype=_NP[DTYPES[dst]])
    _check(_convert(_ptr(y), DTYPES[dst], _ptr(x), DTYPES[src], x.size, 0 if saturate else 1))
    return y


# ---- the layer ---------------------------------------------------------------------------
_WEIGHTS = {"router": 0, "gate": 1, "up": 2, "down": 3, "bias": 4, "shared_gate": 5, "shared_up": 6, "shared_down": 7,
            "shared_gate_w": 8, "router_bias": 9, "gate_up_bias": 10, "down_bias": 11,
            "out_bias": 12, "router_scale": 13, "expert_scale": 14, "in_norm": 15, "out_norm": 16,
            "latent_in": 17, "latent_out": 18, "latent_norm": 19, "expert_out_norm": 20,
            "router_down": 21, "router_down_bias": 22, "router_state_scale": 23, "router_mlp_norm": 24, "router_fc1": 25,
            "router_fc1_bias": 26, "router_fc2": 27, "router_fc2_bias": 28}


_QT_JSON = {0: None, 3: "float8_e4m3fn", 4: "float8_e5m2", 5: "int8"}
_CALIB = {0: "absmax", 1: "qwix", 2: "mx"}


def _calib_text(calib, clip, pow2):
    """A calibration as the rules write it ("absmax", "absmax_pow2,0.5",
    "qwix,0.9", "mx"); None for the default (absmax, clip 1)."""
    if calib == 0 and not pow2 and clip == 1.0:
        return None
    if calib == 2:
        return "mx"
    name = "absmax_pow2" if pow2 and calib == 0 else _CALIB[calib]
    return name if clip == 1.0 else "%s,%r" % (name, float(clip))


def _rule_dict(r, module_path):
    """A moe8_rule as the JSON object that parses back to it."""
    _check_rule_layout()
    d = {"module_path": module_path}
    if r.weight_mxfp4:
        d["weight_qtype"] = "mxfp4"
    elif r.weight_mx8:
        d["weight_qtype"] = "mxfp8"
    else:
        d["weight_qtype"] = _QT_JSON[r.weight_qtype]
    d["act_qtype"], d["bwd_qtype"] = _QT_JSON[r.act_qtype], _QT_JSON[r.bwd_qtype]
    if r.tile_size:
        d["tile_size"] = int(r.tile_size)
    wc = None if r.weight_mx8 else _calib_text(r.weight_calib, r.weight_clip, r.weight_pow2)
    ac = _calib_text(r.act_calib, r.act_clip, r.act_pow2)
    if wc is not None:
        d["weight_calibration_method"] = wc
    if ac is not None:
        d["act_calibration_method"] = ac
    return d


_rule_layout_ok = []


def _check_rule_layout():
    """moe8_rule has no struct_size entry: its mirror here is checked once
    by reading back a parsed rule whose every field differs from its
    default."""
    if _rule_layout_ok:
        return
    raw = (b'{"rules": [{"module_path": "p", "weight_qtype": "int8", "act_qtype": "float8_e5m2", "bwd_qtype": "float8_e4m3fn",'
           b' "tile_size": 48, "weight_calibration_method": "absmax_pow2,0.5", "act_calibration_method": "qwix,0.25"}]}')
    h = _P()
    _check(_rules_parse(raw, len(raw), b"layout check", C.byref(h)))
    try:
        r = _rules_at(h, 0).contents
        got = (r.module_path, r.weight_qtype, r.act_qtype, r.bwd_qtype, r.tile_size, r.weight_clip, r.weight_pow2, r.act_clip,
               r.act_pow2, r.weight_calib, r.act_calib, r.weight_mxfp4, r.weight_mx8)
    finally:
        _rules_destroy(h)
    if got != (b"p", 5, 4, 3, 48, 0.5, True, 0.25, False, 0, 1, False, False):
        raise Error(10, "moe8_rule in %s does not match this package's mirror of it (read %r)" % (library_path, got))
    _rule_layout_ok.append(True)


class _Workspace:
    """A 64-byte aligned scratch buffer of at least n bytes."""

    def __init__(self, n):
        self.buf = np.empty(n + 64, dtype=np.uint8)
        off = (-self.buf.ctypes.data) % 64
        self.view = self.buf[off:off + n]
        self.n = n

    @property
    def ptr(self):
        return C.c_void_p(self.view.ctypes.data)


def _layer_config(num_experts=None, top_k=None, hidden=None, ffn=None, score="softmax", norm_topk_prob=False, routed_scaling_factor=0.0,
                  use_selection_bias=False, capacity_factor=0.0, aux_loss_weight=0.0, n_group=0, topk_group=0, shared_ffn=0,
                  shared_gate=False, group_score="top2_sum", act="swiglu", act_alpha=0.0, act_limit=0.0, router_bias=False,
                  expert_bias=False, weight_input=False, shared_plain_act=False, norm_min=0.0, norm_eps=0.0,
                  select_logits=False, out_bias=False, norm_p=0.0, shared_scale=0.0, shared_act_limit=0.0, hash_routing=False,
                  group_mask_zero=False, scored_shared=0, router_norm=False, expert_scale=False, in_norm=False, out_norm=False,
                  router_norm_scale=0.0, rms_eps=0.0, router_jitter=0.0, zero_experts=0, latent=0, latent_norm=False,
                  expert_out_norm=False, expert_out_eps=0.0, expert_capacity=0, router_mlp=0, router_state=False, skip_experts=0,
                  product_keys=False, capacity_fraction=0.0, capacity_ranked=False):
    """The moe8_layer_config of Layer()'s keyword arguments, checked."""
    if score not in SCORES:
        raise Error(1, "score must be 'softmax', 'sigmoid', 'sqrtsoftplus' (DeepSeek-V4) or 'sparsemixer' (PhiMoE), not %r" % (score,))
    num_experts = _int_arg(num_experts, "num_experts", 1, 1 << 20 if product_keys else 4096)  # MOE8_MAX_PK_EXPERTS, MOE8_MAX_EXPERTS
    zero_experts = _int_arg(zero_experts, "zero_experts", 0, max(0, 4096 - num_experts))
    skip_experts = _int_arg(skip_experts, "skip_experts", 0, max(0, 4096 - num_experts - zero_experts))
    top_k = _int_arg(top_k, "top_k", 1, num_experts + zero_experts + skip_experts)
    hidden, ffn = _int_arg(hidden, "hidden", 1), _int_arg(ffn, "ffn", 1)
    n_group, topk_group = _int_arg(n_group, "n_group"), _int_arg(topk_group, "topk_group")
    shared_ffn = _int_arg(shared_ffn, "shared_ffn")
    gscores = {"top2_sum": 0, "max": 1}
    if group_score not in gscores:
        raise Error(1, "group_score must be 'top2_sum' (DeepSeek-V3) or 'max' (DeepSeek-V2), not %r" % (group_score,))
    if act not in ACTS:
        raise Error(1, "act must be 'swiglu', 'swiglu_clamp' (GPT-OSS), 'swiglu_limit' (GLM-5, HY-V4), 'swiglu_post' (Step-3.5/3.7), "
                    "'swiglu_softcap' (Inkling-2), 'geglu' (Gemma-4), 'relu2' (Nemotron-H, ungated), 'relu' (ungated) or 'silu' (ungated: "
                    "the product-key experts'), not %r" % (act,))
    return _LayerConfig(num_experts, top_k, hidden, ffn, SCORES.index(score), norm_topk_prob, routed_scaling_factor,
                        use_selection_bias, capacity_factor, aux_loss_weight, n_group, topk_group, shared_ffn, shared_gate,
                        gscores[group_score], ACTS.index(act), act_alpha, act_limit, router_bias, expert_bias, weight_input,
                        bool(shared_plain_act), float(norm_min), float(norm_eps), bool(select_logits),
                        bool(out_bias), float(norm_p), float(shared_scale), float(shared_act_limit), bool(hash_routing),
                        bool(group_mask_zero), _int_arg(scored_shared, "scored_shared"), bool(router_norm), bool(expert_scale),
                        bool(in_norm), bool(out_norm), float(router_norm_scale), float(rms_eps), float(router_jitter), zero_experts,
                        _int_arg(latent, "latent"), bool(latent_norm), bool(expert_out_norm), float(expert_out_eps),
                        _int_arg(expert_capacity, "expert_capacity"), _int_arg(router_mlp, "router_mlp"), bool(router_state),
                        skip_experts, bool(product_keys), float(capacity_fraction), bool(capacity_ranked))


def _f32_any(a, name, shape):
    """a (a numpy array or a CPU torch tensor of any floating dtype) as a
    C-contiguous float32 numpy array of `shape`: no copy when it already
    is one, else exactly one."""
    if hasattr(a, "detach") and hasattr(a, "numpy") and not isinstance(a, np.ndarray):  # a torch tensor (not imported here)
        a = a.detach()
        if str(a.dtype) != "torch.float32":
            a = a.float()
        a = a.contiguous().numpy()
    return _f32(a, name, len(shape), shape)


class Layer:
    """One MoE layer.  Layer(num_experts=, top_k=, hidden=, ffn=, ...) makes
    one with zero weights (fill them through weight() or init_random());
    Layer.from_model(dir) loads one from a checkpoint."""

    def __init__(self, num_experts=None, top_k=None, hidden=None, ffn=None, score="softmax", norm_topk_prob=False,
                 routed_scaling_factor=0.0, use_selection_bias=False, capacity_factor=0.0, aux_loss_weight=0.0, n_group=0, topk_group=0,
                 shared_ffn=0, shared_gate=False, group_score="top2_sum", act="swiglu", act_alpha=0.0, act_limit=0.0, router_bias=False,
                 expert_bias=False, weight_input=False, shared_plain_act=False, norm_min=0.0, norm_eps=0.0,
                 select_logits=False, out_bias=False, norm_p=0.0, shared_scale=0.0, shared_act_limit=0.0, hash_routing=False, group_mask_zero=False,
                 scored_shared=0, router_norm=False, expert_scale=False, in_norm=False, out_norm=False, router_norm_scale=0.0, rms_eps=0.0,
                 router_jitter=0.0, zero_experts=0, latent=0, latent_norm=False, expert_out_norm=False, expert_out_eps=0.0,
                 expert_capacity=0, router_mlp=0, router_state=False, skip_experts=0, product_keys=False, capacity_fraction=0.0,
                 capacity_ranked=False, rules=None,
                 module_path="experts",
                 _handle=None, _keep=None):
        self._keep = _keep
        self.module_path = module_path  # the path the rules were matched against
        self._tls = threading.local()  # each thread's default workspace and last forward
        self._views_out = False
        self._prepared = False
        if _handle is not None:
            self._h = _handle
        else:
            cfg = _layer_config(num_experts, top_k, hidden, ffn, score, norm_topk_prob, routed_scaling_factor, use_selection_bias,
                                capacity_factor, aux_loss_weight, n_group, topk_group, shared_ffn, shared_gate, group_score, act,
                                act_alpha, act_limit, router_bias, expert_bias, weight_input, shared_plain_act, norm_min,
                                norm_eps, select_logits, out_bias, norm_p, shared_scale, shared_act_limit, hash_routing,
                                group_mask_zero, scored_shared, router_norm, expert_scale, in_norm, out_norm, router_norm_scale, rms_eps,
                                router_jitter, zero_experts, latent, latent_norm, expert_out_norm, expert_out_eps, expert_capacity,
                                router_mlp, router_state, skip_experts, product_keys, capacity_fraction, capacity_ranked)
            self._rules = _as_rules(rules)
            h = _P()
            _check(_layer_create(C.byref(cfg), self._rules._h if self._rules else None, module_path.encode(), C.byref(h)))
            self._h = h
        c = _layer_get_config(self._h).contents
        self.num_experts, self.top_k, self.hidden, self.ffn = c.num_experts, c.top_k, c.hidden, c.ffn
        self.shared_ffn, self.shared_gate = c.shared_ffn, bool(c.shared_gate)
        self.router_bias, self.expert_bias = bool(c.router_bias), bool(c.expert_bias)
        self.out_bias = bool(c.out_bias)
        self.router_norm, self.expert_scale = bool(c.router_norm), bool(c.expert_scale)  # Gemma-4's norms and scales
        self.in_norm, self.out_norm = bool(c.in_norm), bool(c.out_norm)
        self.score = SCORES[c.score]
        self.act = ACTS[c.act] if 0 <= c.act < len(ACTS) else c.act
        self.hash_routing = bool(c.hash_routing)  # routes by token id: forward() needs token_ids
        self.zero_experts = c.zero_experts  # identity experts after the routed ones (LongCat-Flash): the router's E + Z columns
        self.latent, self.latent_norm = c.latent, bool(c.latent_norm)  # latent experts: their width (0: hidden)
        self.expert_out_norm = bool(c.expert_out_norm)  # MuSE-Spark's norm of each expert's output
        self.expert_capacity = c.expert_capacity  # SwitchTransformers' capacity per sequence: forward()'s seq_len (0: none)
        # Zaya's MLP router: its width (0: a linear router), whether it adds the previous layer's router state
        # (forward()'s router_state), and the skip classes after the experts
        self.router_mlp, self.router_state, self.skip_experts = c.router_mlp, bool(c.router_state), c.skip_experts
        self.product_keys = bool(c.product_keys)  # Doge's product-key experts: the router [D, 2 floor(sqrt(E))]
        # NLLB-MoE's capacity: by rank over all rows, ceil(capacity_fraction x T) (0: expert_capacity), renormalized after the drop
        self.capacity_fraction, self.capacity_ranked = c.capacity_fraction, bool(c.capacity_ranked)

    @classmethod
    def from_model(cls, model_dir, layer=None, mode="inference", rules=None, arch=None, progress=None):
        """Layer `layer` (default: the first MoE layer) of a model directory;
        mode "inference" (no f32 masters) or "training".  Without rules an
        FP8 checkpoint runs with the activations it was made for (as `moe8
        run`).  progress(done, total) is called as the experts load."""
        if mode not in ("inference", "training"):
            raise Error(1, "mode must be 'inference' or 'training', not %r" % (mode,))
        m = _P()
        _check(_model_open_as(os.fsencode(model_dir), arch.encode() if arch else None, C.byref(m)))
        try:
            if layer is None:
                layer = _first_moe(_model_config(m))
                if layer < 0:  # as `moe8 run` says it: why, by what layer 0 is
                    st = _check_moe_layer(_model_config(m), 0)
                    raise Error(st or 1, "%s: config.json has no MoE layer%s" % (
                        os.fsdecode(model_dir), ": " + _last_error().decode("utf-8", "replace") if st else ""))
            r = _as_rules(rules)
            cb = None
            if progress is not None:
                cb = _PROGRESS(lambda ctx, done, total: progress(int(done), int(total)))
            opt = _LoadOptions(C.sizeof(_LoadOptions), 1 if mode == "inference" else 0, C.cast(cb, _P) if cb else None, None)
            h = _P()
            _check(_model_load(m, layer, r._h if r else None, C.byref(opt), C.byref(h)))
            prefix = C.create_string_buffer(256)
            _model_prefix(m, layer, prefix, len(prefix))
            fmt = _model_format(m, layer)
        finally:
            _model_close(m)
        obj = cls(_handle=h)
        obj._rules = r
        obj.layer_index = layer  # the model layer it is (the first MoE layer when not given)
        obj.module_path = prefix.value.decode() + "experts"  # what the rules were matched against
        obj.model_format = (fmt or b"").decode()  # the checkpoint's expert-weight format
        return obj

    @classmethod
    def inference_from_experts(cls, experts, rules=None, module_path="experts", weights=None, shared=None, progress=None, **config):
        """An inference layer (as from_model(mode="inference") builds: the
        experts kept only as the rule makes them, quantized and packed; no
        f32 masters, no backward) from weights in memory, with no file.

        config: Layer()'s keyword arguments (num_experts, top_k, hidden,
        ffn, score, shared_ffn, ...).  experts: for every expert e in
        order, (gate_up [hidden, 2*ffn]: the gate's columns then the up's,
        down [ffn, hidden]) in x @ W layout, as numpy arrays or CPU torch
        tensors of any float dtype; an iterable of such pairs, or a
        callable e -> pair.  Each pair is converted to float32 (one copy at
        most) and handed over before the next is asked for, so at most one
        expert's float32 copy is held beside the layer.  shared: with
        shared_ffn > 0, the shared expert's (gate_up [hidden, 2*shared_ffn],
        down [shared_ffn, hidden]).  weights: {name: array} for what the
        layer keeps in f32 (router [hidden, E], and as the config has them
        bias, router_bias, gate_up_bias, down_bias, shared_gate_w); the
        router is required.  progress(done, total) after each expert."""
        cfg = _layer_config(**config)
        E, D, F, Fs = cfg.num_experts, cfg.hidden, cfg.ffn, cfg.shared_ffn
        H = cfg.latent or D  # the routed experts' width (latent experts')
        ungated = ACTS[cfg.act] in UNGATED  # the experts' up [D, F] alone, no gate
        r = _as_rules(rules)
        h = _P()
        _check(_layer_create_inference(C.byref(cfg), r._h if r else None, module_path.encode(), C.byref(h)))
        obj = cls(_handle=h)  # destroys the handle if anything below fails
        obj._rules = r
        obj.module_path = module_path
        weights = dict(weights or {})
        if "router" not in weights:
            raise Error(1, "inference_from_experts: weights has no router [%d, %d]" % (D, E))
        for name, w in weights.items():
            if name not in _WEIGHTS or name in ("gate", "up", "down", "shared_gate", "shared_up", "shared_down"):
                raise Error(1, "inference_from_experts: weights[%r]: not a weight the layer keeps in f32 (the experts come through "
                            "experts= and shared=)" % (name,))
            shape = obj._shape(name)
            a = _f32_any(w, name, shape)
            n = C.c_size_t(0)
            p = _layer_weight(obj._h, _WEIGHTS[name], C.byref(n))
            if not p:
                raise Error(1, "inference_from_experts: the layer has no %s weight (its config does not use one)" % name)
            C.memmove(p, a.ctypes.data, 4 * n.value)
        if callable(experts):
            src = (experts(e) for e in range(E))
        else:
            src = iter(experts)
        for e in range(E):
            try:
                gu, dn = next(src)
            except StopIteration:
                raise Error(1, "inference_from_experts: experts gave %d experts, the layer has %d" % (e, E)) from None
            gu = _f32_any(gu, "expert %d gate_up" % e, (H, F if ungated else 2 * F))
            dn = _f32_any(dn, "expert %d down" % e, (F, H))
            _check(_layer_put_expert(obj._h, 0, e, _ptr(gu), _ptr(dn)))
            del gu, dn
            if progress is not None:
                progress(e + 1, E)
        if not callable(experts):
            for _ in src:
                raise Error(1, "inference_from_experts: experts gave more than the layer's %d experts" % E)
        if Fs:
            if shared is None:
                raise Error(1, "inference_from_experts: shared_ffn = %d needs shared=(gate_up, down)" % Fs)
            gu = _f32_any(shared[0], "shared gate_up", (D, Fs if ungated and not cfg.product_keys else 2 * Fs))  # Doge's: a SwiGLU
            dn = _f32_any(shared[1], "shared down", (Fs, D))
            _check(_layer_put_expert(obj._h, 1, 0, _ptr(gu), _ptr(dn)))
            del gu, dn
        elif shared is not None:
            raise Error(1, "inference_from_experts: shared= given but the config has no shared expert (shared_ffn = 0)")
        _check(_layer_finish_load(obj._h))
        obj._prepared = True
        return obj

    def __del__(self):
        if getattr(self, "_h", None):
            _layer_destroy(self._h)
            self._h = None

    def describe(self):
        return _layer_describe(self._h).decode()

    def _shape(self, name):
        E, D, F, Fs = self.num_experts, self.hidden, self.ffn, self.shared_ffn
        H = self.latent or D  # the routed experts' width
        Er = E + self.zero_experts + self.skip_experts  # the router's classes
        R = self.router_mlp  # Zaya's MLP router's width
        Rw = 2 * math.isqrt(E) if self.product_keys else Er  # a product-key router's 2 x N keys
        return {"router": (R or D, Rw), "gate": (E, H, F), "up": (E, H, F), "down": (E, F, H), "bias": (Er,), "shared_gate": (D, Fs),
                "shared_up": (D, Fs), "shared_down": (Fs, D), "shared_gate_w": (D,), "router_bias": (Er,),
                "gate_up_bias": (E, 2 * F if self.act not in ("relu", "relu2") else F),
                "down_bias": (E, D), "out_bias": (D,), "router_scale": (D,), "expert_scale": (E,), "in_norm": (D,),
                "out_norm": (D,), "latent_in": (D, H), "latent_out": (H, D), "latent_norm": (H,), "expert_out_norm": (H,),
                "router_down": (D, R), "router_down_bias": (R,), "router_state_scale": (R,), "router_mlp_norm": (R,), "router_fc1": (R, R),
                "router_fc1_bias": (R,), "router_fc2": (R, R), "router_fc2_bias": (R,)}[name]

    def weight(self, name):
        """The f32 master weight `name` (router [D, E], gate/up [E, D, F],
        down [E, F, D], bias [E], shared_gate/shared_up [D, Fs],
        shared_down [Fs, D], shared_gate_w [D]) as a numpy view of the
        layer's memory: no copy; writes go to the layer."""
        n = C.c_size_t(0)
        p = _layer_weight(self._h, _WEIGHTS[name], C.byref(n))
        if not p:
            raise Error(1, "layer has no %s weight (inference layers hold no expert masters)" % name)
        shape = self._shape(name)
        # The view's buffer holds a reference to this layer, so the layer's
        # memory lives as long as any view of it (or tensor made from one).
        buf = (C.c_float * n.value).from_address(C.addressof(p.contents))
        buf._layer = self
        self._views_out = True  # writes through a view reach the next forward
        self._prepared = False
        return np.frombuffer(buf, dtype=np.float32).reshape(shape)

    def _prepared_spec(self):
        """(qtype, tile) of the prepared expert codes, or None when the
        experts are not pre-quantized f8e4m3 / i8 codes."""
        p = _Prepared()
        if _layer_prepared(self._h, C.byref(p)) != 0:
            return None
        names = {v: k for k, v in DTYPES.items()}
        return names[p.dtype], int(p.tile)

    def _load_codes(self, qtype, tile):
        """Makes the expert weights pre-quantized codes of (qtype, tile), as a
        load from an FP8 / int8 file does (moe8_layer_load_prepared), with
        the codes of the current masters; the masters become their values."""
        gu = np.concatenate([self.weight("gate"), self.weight("up")], axis=2)
        g = "channel_tile" if tile else "channel"
        qgu, sgu = quantize(gu, qtype, g, tile)
        qd, sd = quantize(self.weight("down"), qtype, g, tile)
        p = _Prepared(DTYPES[qtype], tile, _ptr(qgu), _ptr(sgu), _ptr(qd), _ptr(sd))
        _check(_layer_load_prepared(self._h, C.byref(p)))
        self._prepared = False

    def rule_json(self):
        """The rule the layer runs under, as rule-set JSON text matching any
        path (what its load or creation chose: the rules given, or without
        them a checkpoint's own), or None when it has none.  A layer made
        from this text quantizes as this one does."""
        r = _layer_rule(self._h)
        return None if not r else json.dumps({"rules": [_rule_dict(r.contents, ".*")]})

    def weight_copy(self, name):
        """A copy of the f32 master `name` (shaped as weight() gives it),
        read without marking the layer changed; None when it has none."""
        n = C.c_size_t(0)
        p = _layer_weight_read(self._h, _WEIGHTS[name], C.byref(n))
        if not p:
            return None
        return np.ctypeslib.as_array(p, shape=(n.value,)).copy().reshape(self._shape(name))

    def weights_changed(self):
        """Says the masters were written (weight() views do it for you):
        the next forward re-quantizes them."""
        _layer_weights_changed(self._h)

    def init_random(self, seed=0):
        _check(_layer_init_random(self._h, seed))

    def prepare(self):
        """Quantize and pack the weights once for forward(fused=True) and
        experts() (again after writing weights through weight() views)."""
        _check(_layer_prepare(self._h))
        self._prepared = True

    def _workspace(self, T):
        """This thread's default workspace (threads never share one)."""
        n = _layer_ws(self._h, T)
        ws = getattr(self._tls, "ws", None)
        if ws is None or ws.n < n:
            ws = self._tls.ws = _Workspace(max(n, 64))
        return ws

    def new_workspace(self, T):
        """A private workspace for T tokens (to keep several forwards'
        saved state for their backwards, as an autograd graph does)."""
        return _Workspace(max(_layer_ws(self._h, T), 64))

    def set_hash_table(self, tid2eid):
        """The table of a hash-routed layer (hash_routing=True, DeepSeek-V4's
        hash layers): tid2eid [vocab, top_k] of expert ids in [0,
        num_experts), copied; a token t's experts are tid2eid[token_ids[t]]."""
        t = np.asarray(tid2eid)
        if t.ndim != 2 or t.shape[1] != self.top_k or t.dtype.kind not in "iu":
            raise Error(2, "tid2eid must be an integer array [vocab, top_k = %d], got %s %s" % (self.top_k, t.dtype, list(t.shape)))
        if t.size and (t.min() < 0 or t.max() >= self.num_experts):
            i = int(np.argwhere((t < 0) | (t >= self.num_experts))[0][0])
            raise Error(1, "tid2eid row %d holds %s: expert ids must be in [0, %d)" % (i, t[i].tolist(), self.num_experts))
        t = np.ascontiguousarray(t, dtype=np.int32)
        _check(_layer_set_hash_table(self._h, _ptr(t), t.shape[0]))

    def hash_table(self):
        """A copy of the layer's hash table [vocab, top_k] (int32), or None."""
        v = _i64(0)
        p = _layer_hash_table(self._h, C.byref(v))
        if not p or v.value == 0:
            return None
        return np.ctypeslib.as_array(p, shape=(v.value * self.top_k,)).copy().reshape(v.value, self.top_k)

    def _token_ids(self, token_ids, T):
        """token_ids as a C-contiguous int32 [T] array (None stays None)."""
        if token_ids is None:
            return None
        ids = np.asarray(token_ids)
        if ids.dtype.kind not in "iu" or ids.reshape(-1).shape != (T,) or ids.ndim > 2:
            raise Error(2, "token_ids must be an integer array of %d ids (one per row of x), got %s %s" % (T, ids.dtype, list(ids.shape)))
        ids = ids.reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= 2 ** 31):
            t = int(np.argwhere((ids < 0) | (ids >= 2 ** 31))[0][0])
            raise Error(1, "token_ids[%d] = %d is not a token id" % (t, int(ids[t])))
        return np.ascontiguousarray(ids, dtype=np.int32)

    def forward(self, x, out=None, fused=False, workspace=None, token_ids=None, seq_len=None, router_state=None):
        """out[T, D] = the layer on x[T, D]; returns (out, aux_loss), or out
        alone when fused (the prepared inference path).  The backward needs
        the same workspace (by default the layer's own, reused by the next
        forward).  token_ids [T] (integers): the tokens' ids, which a
        hash-routed layer needs (others do not read them).  seq_len: the rows
        are sequences of seq_len tokens (T a multiple of it; None: one
        sequence of T), over which a layer with expert_capacity
        (SwitchTransformers') counts it; other layers do not read it.

        A layer with Zaya's MLP router (router_mlp > 0) also returns its
        router state [T, router_mlp], for the next layer: (out, aux_loss,
        state), or (out, state) when fused.  router_state: the previous
        layer's state [T, router_mlp], which a layer with router_state
        (Zaya's layers after the first) requires and any other refuses."""
        x = _f32(x, "x", 2, (None, self.hidden))
        T = x.shape[0]
        if self.router_mlp:
            return self._forward_state(x, T, out, fused, workspace, router_state)
        if router_state is not None:
            raise Error(1, "router_state: layer %s has no MLP router (router_mlp = 0): it takes no router state" % self.module_path)
        tok = self._token_ids(token_ids, T)
        seq = 0 if seq_len is None else _int_arg(seq_len, "seq_len", 1)
        out = np.empty((T, self.hidden), dtype=np.float32) if out is None else _out(out, (T, self.hidden))
        if self._views_out and not fused:
            _layer_weights_changed(self._h)  # fused runs what prepare() made: call it again after writing weights
        ws = workspace or self._workspace(T)
        if fused:
            _check(_layer_forward_fused_seq(self._h, _ptr(x), T, _ptr(tok), seq, _ptr(out), ws.ptr, ws.n))
            return out
        aux = C.c_float(0)
        _check(_layer_forward_seq(self._h, _ptr(x), T, _ptr(tok), seq, _ptr(out), C.byref(aux), ws.ptr, ws.n))
        self._tls.saved = ws
        return out, aux.value

    def _forward_state(self, x, T, out, fused, workspace, router_state):
        """forward() of a layer with Zaya's MLP router: the state in, the state out."""
        R = self.router_mlp
        if router_state is None and self.router_state:
            raise Error(1, "layer %s: its router adds the previous layer's router state (Zaya's layers after the first): pass that "
                        "layer's state [%d, %d] as forward(router_state=...)" % (self.module_path, T, R))
        if router_state is not None and not self.router_state:
            raise Error(1, "router_state: layer %s takes no router state (its router reads x alone: Zaya's first layer)"
                        % self.module_path)
        rs = None if router_state is None else _f32_any(router_state, "router_state", (T, R))
        state = np.empty((T, R), dtype=np.float32)
        out = np.empty((T, self.hidden), dtype=np.float32) if out is None else _out(out, (T, self.hidden))
        if self._views_out and not fused:
            _layer_weights_changed(self._h)
        ws = workspace or self._workspace(T)
        if fused:
            _check(_layer_forward_fused_state(self._h, _ptr(x), T, _ptr(rs), _ptr(state), _ptr(out), ws.ptr, ws.n))
            return out, state
        aux = C.c_float(0)
        _check(_layer_forward_state(self._h, _ptr(x), T, _ptr(rs), _ptr(state), _ptr(out), C.byref(aux), ws.ptr, ws.n))
        self._tls.saved = ws
        return out, aux.value, state

    def experts(self, x, topk_ids, topk_weights, out=None, workspace=None):
        """The serving op: the layer's experts on tokens the caller routed.
        x [T, hidden] float32, topk_ids [T, top_k] (int32; ids < 0 are
        skipped), topk_weights [T, top_k] float32 used as given; returns
        out [T, hidden], the same bytes as forward() given the same routing
        (docs/integration.md)."""
        x = _f32(x, "x", 2, (None, self.hidden))
        T = x.shape[0]
        ids = np.asarray(topk_ids)
        if ids.shape != (T, self.top_k) or ids.dtype.kind not in "iu":
            raise Error(2, "topk_ids must be an integer array of shape %s, got %s %s" % ((T, self.top_k), ids.dtype, list(ids.shape)))
        if ids.size:
            bad = ids >= self.num_experts + self.zero_experts
            if ids.dtype.kind == "i" and ids.dtype.itemsize > 4:
                bad |= ids < -(2 ** 31)  # would not survive the conversion to int32
            if bad.any():
                t, j = (int(i) for i in np.argwhere(bad)[0])
                raise Error(2, "topk_ids[%d, %d] = %d: ids must be in [-2^31, num_experts + zero_experts = %d) (ids < 0 are skipped)"
                            % (t, j, int(ids[t, j]), self.num_experts + self.zero_experts))
        ids = np.require(ids.astype(np.int32, copy=False), requirements=["C", "A"])
        w = _f32(topk_weights, "topk_weights", 2, (T, self.top_k))
        out = np.empty((T, self.hidden), dtype=np.float32) if out is None else _out(out, (T, self.hidden))
        if self._views_out and not self._prepared:
            _layer_weights_changed(self._h)
        ws = workspace or self._workspace(T)
        _check(_layer_experts(self._h, _ptr(x), T, _ptr(ids), _ptr(w), _ptr(out), ws.ptr, ws.n))
        return out

    def backward(self, x, dout, workspace=None):
        """Gradients of sum(dout * out) + aux_loss at the last forward (same
        x): a dict of dx, router, gate, up, down and, with a shared expert,
        shared_gate, shared_up, shared_down (and shared_gate_w); with biases
        router_bias, gate_up_bias, down_bias; with latent experts latent_in,
        latent_out (and latent_norm), with expert_out_norm its scale's."""
        x = _f32(x, "x", 2, (None, self.hidden))
        T = x.shape[0]
        dout = _f32(dout, "dout", 2, (T, self.hidden))
        ws = workspace or getattr(self._tls, "saved", None) or self._workspace(T)
        E, D, F, Fs = self.num_experts, self.hidden, self.ffn, self.shared_ffn
        H = self.latent or D  # the routed experts' width
        Er = E + self.zero_experts  # the router's experts
        g = {"dx": np.empty((T, D), np.float32), "router": np.empty((D, Er), np.float32), "gate": np.empty((E, H, F), np.float32),
             "up": np.empty((E, H, F), np.float32), "down": np.empty((E, F, H), np.float32)}
        if self.latent:
            g.update({"latent_in": np.empty((D, H), np.float32), "latent_out": np.empty((H, D), np.float32)})
        if self.latent_norm:
            g["latent_norm"] = np.empty((H,), np.float32)
        if self.expert_out_norm:
            g["expert_out_norm"] = np.empty((H,), np.float32)
        if Fs:
            g.update({"shared_gate": np.empty((D, Fs), np.float32), "shared_up": np.empty((D, Fs), np.float32),
                      "shared_down": np.empty((Fs, D), np.float32)})
            if self.shared_gate:
                g["shared_gate_w"] = np.empty((D,), np.float32)
        if self.act in UNGATED:  # no gate weight, no gradient
            g.pop("gate")
            g.pop("shared_gate", None)
        if self.router_bias:
            g["router_bias"] = np.empty((Er,), np.float32)
        if self.expert_bias:
            g["gate_up_bias"] = np.empty((E, 2 * F), np.float32)
            g["down_bias"] = np.empty((E, D), np.float32)
        if self.out_bias:
            g["out_bias"] = np.empty((D,), np.float32)
        for n, on, size in (("router_scale", self.router_norm, D), ("expert_scale", self.expert_scale, E), ("in_norm", self.in_norm, D),
                            ("out_norm", self.out_norm, D)):
            if on:
                g[n] = np.empty((size,), np.float32)
        cg = _Grads(*[_ptr(g.get(k)) for k in ("dx", "router", "gate", "up", "down", "shared_gate", "shared_up", "shared_down",
                                                  "shared_gate_w", "router_bias", "gate_up_bias", "down_bias",
                                                  "out_bias", "router_scale", "expert_scale", "in_norm", "out_norm",
                                                  "latent_in", "latent_out", "latent_norm", "expert_out_norm")])
        _check(_layer_backward(self._h, _ptr(x), T, _ptr(dout), ws.ptr, ws.n, C.byref(cg)))
        return g
