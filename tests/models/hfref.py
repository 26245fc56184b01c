"""Float64 implementations of the Hugging Face MoE blocks moe8 runs, and a
tiny safetensors / .npy toolkit, for the family tests.  Nothing here is
moe8's code: every formula is written from the reference implementations
(Qwen2MoeSparseMoeBlock, Qwen3MoeSparseMoeBlock, MixtralSparseMoeBlock,
DeepseekV3MoE with its TopkRouter, DeepseekV4SparseMoeBlock with its
TopKRouter and HashRouter, NemotronHMoE, PhimoeSparseMoeBlock's sparsemixer,
LongcatFlashMoE's identity experts, ...)."""
import json
import math
import struct

import numpy as np

# ---- files -------------------------------------------------------------------------
_ST = {"F32": (np.float32, 4), "F16": (np.float16, 2), "BF16": (None, 2), "F8_E4M3": (np.uint8, 1), "U8": (np.uint8, 1),
       "I32": (np.int32, 4), "I64": (np.int64, 8)}


def bf16_bytes(a):
    """Round-to-nearest-even f32 -> bf16, as uint16."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return r


def bf16_values(a):
    return (bf16_bytes(a).astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def write_safetensors(path, tensors):
    """tensors: name -> (dtype string, numpy array of the stored values/bytes)."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        dt, arr = tensors[name]
        if dt == "BF16":
            raw = bf16_bytes(arr).tobytes()
        elif dt == "F8_E4M3":
            raw = np.ascontiguousarray(arr, dtype=np.uint8).tobytes()
        else:
            raw = np.ascontiguousarray(arr, dtype=_ST[dt][0]).tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def write_npy(path, a):
    np.save(path, np.ascontiguousarray(a, dtype=np.float32))


# ---- FP8 e4m3fn ----------------------------------------------------------------------
E4M3_VALUES = np.zeros(256)
for _c in range(256):
    _s, _e, _m = _c >> 7, (_c >> 3) & 15, _c & 7
    _v = (_m / 8.0) * 2.0 ** -6 if _e == 0 else (1 + _m / 8.0) * 2.0 ** (_e - 7)
    E4M3_VALUES[_c] = np.nan if (_c & 0x7F) == 0x7F else (-_v if _s else _v)


def e4m3_round(v):
    """Round to nearest even on the e4m3fn grid, saturating at 448."""
    v = np.asarray(v, dtype=np.float64)
    a = np.abs(v)
    e = np.floor(np.log2(np.maximum(a, 2.0 ** -10)))
    e = np.maximum(e, -6.0)
    step = 2.0 ** (e - 3)
    q = np.minimum(np.round(a / step) * step, 448.0)
    return np.sign(v) * q


def e4m3_encode(q):
    """Codes of values already on the grid."""
    q = np.asarray(q, dtype=np.float64)
    a = np.abs(q)
    sign = (q < 0).astype(np.uint8) << 7
    e = np.floor(np.log2(np.maximum(a, 2.0 ** -10)))
    normal = a >= 2.0 ** -6
    en = np.where(normal, e, -7)
    mant = np.where(normal, np.round((a / 2.0 ** en - 1) * 8), np.round(a / 2.0 ** -9))
    code = np.where(normal, ((en + 7).astype(np.int64) << 3) | mant.astype(np.int64), mant.astype(np.int64))
    return (sign | code.astype(np.uint8)).astype(np.uint8)


def scale_from_absmax(am):
    """moe8's scale: absmax / 448 in f32, 1 for zero (or tiny) blocks."""
    s = np.asarray(am, dtype=np.float32) / np.float32(448.0)
    return np.where(s >= np.float32(2.0 ** -126), s, np.float32(1.0)).astype(np.float32)


def quant_rows(x, tile):
    """Per-row (per token), per K tile of `tile`, e4m3 with f32 scales and
    an f32 division, as moe8 quantizes activations; returns the
    dequantized values in f64."""
    x32 = np.asarray(x, dtype=np.float32)
    out = np.empty(x32.shape, dtype=np.float64)
    K = x32.shape[-1]
    for k0 in range(0, K, tile):
        blk = x32[..., k0:k0 + tile]
        s = scale_from_absmax(np.max(np.abs(blk), axis=-1, keepdims=True))
        out[..., k0:k0 + tile] = e4m3_round((blk / s).astype(np.float32)) * s.astype(np.float64)
    return out


def quant_rows_i8(x, tile):
    """Per-row, per K tile of `tile`, moe8's default int8: s = absmax / 127
    in f32 (1 for a zero or tiny block), q = x / s in f32 rounded half to
    even and clamped to [-127, 127]; returns q * s in f64."""
    x32 = np.asarray(x, dtype=np.float32)
    out = np.empty(x32.shape, dtype=np.float64)
    K = x32.shape[-1]
    for k0 in range(0, K, tile):
        blk = x32[..., k0:k0 + tile]
        s = (np.max(np.abs(blk), axis=-1, keepdims=True) / np.float32(127)).astype(np.float32)
        s = np.where((s >= np.float32(2.0 ** -126)) & np.isfinite(s), s, np.float32(1))
        q = np.clip(np.rint((blk / s).astype(np.float32)), -127, 127)
        out[..., k0:k0 + tile] = q.astype(np.float64) * s.astype(np.float64)
    return out


def quant_cols(w, tile):
    """A weight [K, N] quantized per column per K tile (moe8's
    [E, K/tile, 1, N] layout for one expert), dequantized, f64."""
    return quant_rows(np.asarray(w, dtype=np.float32).T, tile).T


# ---- blocks --------------------------------------------------------------------------
def silu(v):
    return v / (1.0 + np.exp(-v))


def mlp(x, wg, wu, wd, act_q=None, limit=None, post=False, softcap=None, oss=None):
    """SwiGLU MLP with HF Linear weights (out x in): down(silu(gate x) * up x).
    act_q: optional activation quantizer applied to x and h.  limit: the
    limited SwiGLU (GLM-5, HY-V4): silu(min(g, limit)) * clip(u, ±limit);
    with post (Step-3.5/3.7) the clamp after the activation:
    min(silu(g), limit) * clip(u, ±limit).  softcap = (cg, cu): Inkling-2's
    cg tanh(g / cg) * sigmoid(g) * cu tanh(u / cu)."""
    xa = act_q(x) if act_q else x
    g, u = xa @ wg.T, xa @ wu.T
    if oss is not None:  # GPT-OSS's clamped SwiGLU on gate and up halves (MiniMax-M3): oss = (alpha, limit)
        al, lim = oss
        gc, uc = np.minimum(g, lim), np.clip(u, -lim, lim)
        h = (uc + 1.0) * gc / (1.0 + np.exp(-al * gc))
    elif softcap is not None:
        cg, cu = softcap
        h = cg * np.tanh(g / cg) / (1.0 + np.exp(-g)) * cu * np.tanh(u / cu)
    elif limit is not None and post:
        h = np.minimum(silu(g), limit) * np.clip(u, -limit, limit)
    else:
        if limit is not None:
            g, u = np.minimum(g, limit), np.clip(u, -limit, limit)
        h = silu(g) * u
    if act_q:
        h = act_q(h)
    return h @ wd.T


def ungated_block(x, routing, experts, shared=None, act="relu2"):
    """NemotronHMoE (no latent projection): experts[e] = (wu [F, D], wd [D, F]),
    HF Linear weights; each chosen expert down(act(up x)) with act relu2
    (ReLUSquaredActivation: relu(v)^2) or relu, weighted and summed; shared =
    (wu, wd) of the same form (NemotronHMLP) added on every token."""
    a = (lambda v: np.maximum(v, 0.0) ** 2) if act == "relu2" else (lambda v: np.maximum(v, 0.0))
    ids, w = routing
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            wu, wd = experts[ids[t, j]]
            out[t] += w[t, j] * (a(x[t] @ wu.T) @ wd.T)
    if shared is not None:
        out = out + a(x @ shared[0].T) @ shared[1].T
    return out


def softmax(l):
    m = l.max(axis=-1, keepdims=True)
    p = np.exp(l - m)
    return p / p.sum(axis=-1, keepdims=True)


def topk_idx(v, k):
    """Indices of the k largest, decreasing; ties to the lower index."""
    return np.argsort(-v, kind="stable")[:k]


def route_softmax(x, wr, k, norm):
    p = softmax(x @ wr.T)
    ids = np.array([topk_idx(r, k) for r in p])
    w = np.take_along_axis(p, ids, axis=1)
    if norm:
        w = w / w.sum(axis=1, keepdims=True)
    return ids, w


def route_pnorm(x, wr, k, p):
    """DBRX's router: softmax over all, top-k, the weights divided by their
    p-norm (p None: not divided; 1: the sum)."""
    s = softmax(x @ wr.T)
    ids = np.array([topk_idx(r, k) for r in s])
    w = np.take_along_axis(s, ids, axis=1)
    if p is not None:
        w = w / (np.abs(w) ** p).sum(axis=1, keepdims=True) ** (1.0 / p)
    return ids, w


def route_sigmoid(x, wr, k, norm):
    """Flint's router: top-k of the sigmoid scores (no bias), divided by
    their sum when norm."""
    s = 1.0 / (1.0 + np.exp(-(x @ wr.T)))
    ids = np.array([topk_idx(r, k) for r in s])
    w = np.take_along_axis(s, ids, axis=1)
    if norm:
        w = w / w.sum(axis=1, keepdims=True)
    return ids, w


def route_logits_bias(x, wr, bias, k, norm):
    """Kolibri-1's router: the top-k of logit + bias, weighted by the sigmoid
    of the chosen logits, divided by their sum iff norm."""
    lg = x @ wr.T
    ids = np.array([topk_idx(r, k) for r in lg + bias[None, :]])
    w = 1.0 / (1.0 + np.exp(-np.take_along_axis(lg, ids, axis=1)))
    if norm:
        w = w / w.sum(axis=1, keepdims=True)
    return ids, w


def route_deepseek(x, wr, bias, k, n_group, topk_group, norm, scale, softmax_scores=False, zero_mask=False, eps=1e-20):
    """DeepSeek-V3's router; softmax_scores, no bias and zero_mask: Mistral-4's
    (softmax scores, the dropped groups' scores set to 0.0)."""
    s = softmax(x @ wr.T) if softmax_scores else 1.0 / (1.0 + np.exp(-(x @ wr.T)))
    sel = s + (bias[None, :] if bias is not None else 0.0)
    T, E = sel.shape
    if n_group > 1 and zero_mask:
        g = sel.reshape(T, n_group, E // n_group)
        gs = np.sort(g, axis=2)[:, :, -2:].sum(axis=2)
        mask = np.zeros((T, n_group), dtype=bool)
        for t in range(T):
            mask[t, topk_idx(gs[t], topk_group)] = True
        sel = np.where(np.repeat(mask, E // n_group, axis=1), sel, 0.0)
    elif n_group > 1:
        g = sel.reshape(T, n_group, E // n_group)
        gs = np.sort(g, axis=2)[:, :, -2:].sum(axis=2)
        mask = np.zeros((T, n_group), dtype=bool)
        for t in range(T):
            mask[t, topk_idx(gs[t], topk_group)] = True
        sel = np.where(np.repeat(mask, E // n_group, axis=1), sel, -np.inf)  # DeepSeek's code and transformers 5: -inf
    ids = np.array([topk_idx(r, k) for r in sel])
    w = np.take_along_axis(s, ids, axis=1)
    if norm:
        w = w / (w.sum(axis=1, keepdims=True) + eps)
    return ids, w * scale


def route_inkling(x, wr, bias, k, S, scale):
    """Inkling's router (InklingTopkRouter): logits over the E routed and
    the S shared experts (wr [E + S, D]); the top-k of sigmoid + bias over
    the routed ones, then the S shared ones; all k + S weighted by
    exp(logsigmoid(l) - logsumexp(logsigmoid)) = sigma(l) / sum sigma,
    times scale (route_scale x global_scale)."""
    lg = x @ wr.T
    s = 1.0 / (1.0 + np.exp(-lg))
    E = lg.shape[1] - S
    ids = np.array([np.concatenate([topk_idx(r[:E] + bias, k), np.arange(E, E + S)]) for r in s])
    w = np.take_along_axis(s, ids, axis=1)
    return ids, w / w.sum(axis=1, keepdims=True) * scale


def sqrt_softplus(l):
    """DeepSeek-V4's score: sqrt(softplus(l)), softplus as torch's (beta 1,
    threshold 20: l itself above)."""
    l = np.asarray(l, dtype=np.float64)
    return np.sqrt(np.where(l > 20.0, l, np.log1p(np.exp(np.minimum(l, 20.0)))))


def route_deepseek_v4(x, wr, bias, k, scale, scoring="sqrtsoftplus", tid2eid=None, token_ids=None):
    """DeepSeek-V4's routers: scores sqrt(softplus(x Wr^T)) (scoring_func
    sqrtsoftplus) or sigmoid; DeepseekV4TopKRouter: the top-k of score +
    bias; DeepseekV4HashRouter (tid2eid given): the experts
    tid2eid[token_ids] in the table's order, no bias; both: the chosen
    scores / (their sum + 1e-20) * scale."""
    lg = x @ wr.T
    s = sqrt_softplus(lg) if scoring == "sqrtsoftplus" else 1.0 / (1.0 + np.exp(-lg))
    if tid2eid is not None:
        ids = np.asarray(tid2eid)[np.asarray(token_ids)]
    else:
        ids = np.array([topk_idx(r, k) for r in s + bias[None, :]])
    w = np.take_along_axis(s, ids, axis=1)
    return ids, w / (w.sum(axis=1, keepdims=True) + 1e-20) * scale


def route_sparsemixer(x, wr, jitter):
    """PhiMoE's router in inference (PhimoeTopKRouter, sparsemixer with
    training False): always 2 experts.  Choice c's top logit m (the first
    over all, the second over all but the first; ties to the lower index, as
    torch's max); the experts with (m - l) / max(|l|, m) > 2 * jitter are
    masked (-inf), the first always for the second; the weight is the chosen
    expert's softmax over the others, exp(0) / sum; not renormalized.  A
    0 / 0 (l = m = 0) is NaN, which is not > the threshold: not masked."""
    lg = x @ wr.T
    T, E = lg.shape
    ids, w = np.zeros((T, 2), dtype=np.int64), np.zeros((T, 2))
    for t in range(T):
        r, first = lg[t], -1
        for c in range(2):
            best = min((e for e in range(E) if e != first), key=lambda e: (-r[e], e))
            m = r[best]
            with np.errstate(invalid="ignore", divide="ignore"):
                q = (m - r) / np.maximum(np.abs(r), m)
            keep = ~(q > 2 * jitter)
            if first >= 0:
                keep[first] = False
            ids[t, c], w[t, c] = best, 1.0 / np.exp(r[keep] - m).sum()
            first = best
    return ids, w


def route_deepseek_v2(x, wr, k, n_group, topk_group, scale, grouped):
    """DeepSeek-V2's gate (norm_topk_prob false): softmax scores; greedy
    top-k, or group_limited_greedy (a group's score is its best expert's
    score; the topk_group best groups stay, the others' scores become 0,
    every kept score being > 0); weights = selected scores * scale."""
    s = softmax(x @ wr.T)
    sel = s
    T, E = s.shape
    if grouped and n_group > 1:
        gs = s.reshape(T, n_group, E // n_group).max(axis=2)
        mask = np.zeros((T, n_group), dtype=bool)
        for t in range(T):
            mask[t, topk_idx(gs[t], topk_group)] = True
        sel = np.where(np.repeat(mask, E // n_group, axis=1), s, 0.0)
    ids = np.array([topk_idx(r, k) for r in sel])
    return ids, np.take_along_axis(s, ids, axis=1) * scale


def moe_block(x, routing, experts, shared=None, shared_gate=None, act_q=None, limit=None, shared_limit=None, post=False, softcap=None,
              oss=None, out_bias=None, average=False):
    """routing: (ids [T, k], weights [T, k]); experts[e] = (wg, wu, wd), or
    None for an identity expert (LongCat-Flash's zero-computation experts:
    its slot adds w * x);
    shared = (wg, wu, wd) or None; shared_gate: [1, D] (Qwen2) or None;
    limit / shared_limit: the routed / shared experts' SwiGLU limit (mlp);
    out_bias: [D] added to the block's output (JetMoeMoE's bias) or None;
    average: (routed + shared) / 2 (Cohere2-MoE's "average") instead of the sum."""
    ids, w = routing
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            if experts[ids[t, j]] is None:
                out[t] += w[t, j] * x[t]
                continue
            wg, wu, wd = experts[ids[t, j]]
            out[t] += w[t, j] * mlp(x[t:t + 1], wg, wu, wd, act_q, limit, post, softcap, oss)[0]
    if shared is not None:
        y = mlp(x, *shared, act_q, shared_limit, post, softcap, oss)
        if shared_gate is not None:
            y = y / (1.0 + np.exp(-(x @ shared_gate.T)))
        out = (out + y) / 2 if average else out + y
    if out_bias is not None:
        out = out + out_bias
    return out


E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def mxfp4_decode(blocks, scales):
    """OCP MXFP4 as GPT-OSS stores it: blocks [..., N, K/32, 16] bytes (the
    low nibble is the even element), scales [..., N, K/32] E8M0 (2^(s-127));
    returns [..., N, K] in float64."""
    lo = E2M1[blocks & 15]
    hi = E2M1[blocks >> 4]
    v = np.stack([lo, hi], axis=-1).reshape(*blocks.shape[:-1], 32)
    v = v * np.exp2(scales.astype(np.float64) - 127.0)[..., None]
    return v.reshape(*blocks.shape[:-2], blocks.shape[-2] * 32)


def gpt_oss_block(x, wr, br, gu, gub, dn, dnb, k, alpha=1.702, limit=7.0):
    """transformers' GptOssMLP: logits = x Wr^T + b; top-k logits, softmax
    over them; per expert gate_up = x @ gu[e] + gub[e] (gate even columns,
    up odd), gate <= limit, |up| <= limit, glu = gate * sigmoid(alpha gate),
    out = ((up + 1) * glu) @ dn[e] + dnb[e], weighted and summed."""
    logits = x @ wr.T + br
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        ids = topk_idx(logits[t], k)
        w = softmax(logits[t, ids])
        for j, e in enumerate(ids):
            h = x[t] @ gu[e] + gub[e]
            g, u = np.minimum(h[0::2], limit), np.clip(h[1::2], -limit, limit)
            glu = g / (1.0 + np.exp(-alpha * g))
            out[t] += w[j] * (((u + 1.0) * glu) @ dn[e] + dnb[e])
    return out


def llama4_block(x, wr, gu, dn, shared, k):
    """transformers' Llama4TextMoe: logits = x Wr^T; the top-k logits'
    sigmoids scale the input of their experts (the others get 0, which
    gives 0); gate_up [E, D, 2F] in x @ W layout, gate the first half;
    out = shared(x) + sum of the experts' outputs."""
    logits = x @ wr.T
    out = mlp(x, *shared)
    F = gu.shape[2] // 2
    for t in range(x.shape[0]):
        for e in topk_idx(logits[t], k):
            xi = x[t] / (1.0 + np.exp(-logits[t, e]))
            h = xi @ gu[e]
            out[t] += (h[:F] / (1.0 + np.exp(-h[:F])) * h[F:]) @ dn[e]
    return out


def mxfp4_quant(w):
    """OCP MXFP4 of an [N, K] weight (out x in), blocks of 32 along K: X =
    2^(floor(log2 amax) - 2) (E8M0 byte clamped to [0, 254], 0 for a zero
    block), v / X rounded to the nearest E2M1 value, ties to the even code,
    saturating at 6; returns the dequantized values in float64."""
    w = np.asarray(w, dtype=np.float32).astype(np.float64)
    N, K = w.shape
    b = w.reshape(N, K // 32, 32)
    amax = np.abs(b).max(axis=2)
    e = np.where(amax > 0, np.frexp(amax)[1] - 1 - 2 + 127, 0)
    e = np.clip(e, 0, 254)
    X = np.exp2(e.astype(np.float64) - 127)[..., None]
    a = np.abs(b / X)
    m = np.select([a <= 0.25, a < 0.75, a <= 1.25, a < 1.75, a <= 2.5, a < 3.5, a <= 5.0], [0, 0.5, 1, 1.5, 2, 3, 4], 6)
    return (np.sign(b) * m * X).reshape(N, K)


def mxfp8_quant(w):
    """OCP MXFP8 (E4M3) of an [N, K] weight (out x in), blocks of 32 along
    K: s = 2^(floor(log2 amax) - 8) (1 for a zero block), codes w / s on
    the e4m3 grid, saturating; the dequantized values in float64."""
    w = np.asarray(w, dtype=np.float32)
    N, K = w.shape
    b = w.reshape(N, K // 32, 32).astype(np.float64)
    amax = np.abs(b).max(axis=2)
    ex = np.where(amax > 0, np.frexp(amax)[1] - 1 - 8, 0)
    s = np.where(amax > 0, np.exp2(np.clip(ex, -127, 127).astype(np.float64)), 1.0)[..., None]
    return (e4m3_round(b / s) * s).reshape(N, K)


def rms_norm(x, w=None, eps=1e-6):
    """Gemma-4's RMSNorm (Gemma4RMSNorm): x * (mean(x^2) + eps)^-1/2, times
    its weight (not 1 + weight) when it has one."""
    y = x * (np.mean(x * x, axis=-1, keepdims=True) + eps) ** -0.5
    return y if w is None else y * w


def gelu_tanh(v):
    """gelu_pytorch_tanh: 0.5 v (1 + tanh(sqrt(2/pi) (v + 0.044715 v^3)))."""
    return 0.5 * v * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (v + 0.044715 * v ** 3)))


def gemma4_branch(h, wr, scale, per_expert_scale, gu, dn, w_pre, w_post, k, eps=1e-6):
    """Gemma4TextDecoderLayer's routed branch on the residual stream h [T, D]:
    Gemma4TextRouter (RMSNorm(h) without weight, * scale * D^-1/2, proj,
    softmax, top-k, divided by their sum, * per_expert_scale[idx]),
    Gemma4TextExperts on pre_feedforward_layernorm_2(h) (gate_up_proj [E, 2F, D]
    gate rows first, down_proj [E, D, F], gelu_pytorch_tanh(gate) * up), then
    post_feedforward_layernorm_2 of the weighted sum."""
    D = h.shape[1]
    p = softmax((rms_norm(h, None, eps) * scale * D ** -0.5) @ wr.T)
    ids = np.array([topk_idx(r, k) for r in p])
    w = np.take_along_axis(p, ids, axis=1)
    w = w / w.sum(axis=1, keepdims=True) * per_expert_scale[ids]
    x = rms_norm(h, w_pre, eps)
    F = gu.shape[1] // 2
    y = np.zeros_like(h)
    for t in range(h.shape[0]):
        for j in range(k):
            e = ids[t, j]
            a = gu[e] @ x[t]
            y[t] += w[t, j] * (dn[e] @ (gelu_tanh(a[:F]) * a[F:]))
    return rms_norm(y, w_post, eps)


def nemotron_latent_block(x, routing, experts, fc1, fc2, shared=None, act="relu2"):
    """NemotronHMoE with moe_latent_size: the chosen experts (ungated, in the
    latent width: wu [F, H], wd [H, F]) read fc1_latent_proj(x) (fc1 [H, D]),
    their weighted sum goes through fc2_latent_proj (fc2 [D, H]); the shared
    expert reads x and is added after."""
    out = ungated_block(x @ fc1.T, routing, experts, None, act) @ fc2.T
    if shared is not None:
        a = (lambda v: np.maximum(v, 0.0) ** 2) if act == "relu2" else (lambda v: np.maximum(v, 0.0))
        out = out + a(x @ shared[0].T) @ shared[1].T
    return out


def route_muse_spark(x, wr, bias, k, mult, scale):
    """MuseSparkTopkRouter: logits x output_multiplier, sigmoid, the top-k of
    s + e_score_correction_bias, the chosen s / (sum + 1e-15), x
    routed_scaling_factor."""
    s = 1.0 / (1.0 + np.exp(-((x @ wr.T) * mult)))
    ids = np.array([topk_idx(r, k) for r in s + bias[None, :]])
    w = np.take_along_axis(s, ids, axis=1)
    return ids, w / (w.sum(axis=1, keepdims=True) + 1e-15) * scale


def muse_spark_block(x, routing, gu, dn, pre, pre_w, post, post_w, eps, post_eps):
    """MuseSparkMoE: z = MuseSparkTextCenteredRMSNorm(pre_expert_proj(x))
    (normalize, then x (1 + w)); SwiGLU experts in the latent width
    (gate_up_proj [E, 2F, H] gate rows first, down_proj [E, H, F]), each
    output through MuseSparkTextInputScaledRMSNorm (x (1 + w) first, then
    normalize; eps post_norm_eps) before its weight; post_expert_proj of
    the sum."""
    z = rms_norm(x @ pre.T, None, eps) * (1.0 + pre_w)
    ids, w = routing
    F = gu.shape[1] // 2
    c = np.zeros((x.shape[0], pre.shape[0]))
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = ids[t, j]
            a = gu[e] @ z[t]
            o = dn[e] @ (silu(a[:F]) * a[F:])
            c[t] += w[t, j] * rms_norm(o * (1.0 + post_w), None, post_eps)
    return c @ post.T


def gelu_erf(v):
    """torch's exact GELU (nn.GELU()): 0.5 v (1 + erf(v / sqrt(2)))."""
    return 0.5 * v * (1.0 + np.vectorize(math.erf)(v / math.sqrt(2.0)))


def zaya_block(x, g, gu, dn, state=None, eps=1e-5, act_q=None, mutate=None):
    """ZayaSparseMoeBlock on x [T, D], written from transformers' ZayaRouter,
    ZayaRouterMLP and ZayaExperts.  g: the router's tensors as the files
    hold them (out x in): down_w [R, D], down_b [R], scale [R] (layers after
    the first: router_states_scale), norm [R], fc1_w/fc2_w [R, R], fc1_b/fc2_b
    [R], out_w [E + 1, R], bias [E + 1] (balancing_biases).  The router
    state s = down_w x + down_b (+ state * scale when the layer has a scale
    and a state is given); RMSNorm(s) (eps) * norm; GELU(fc1), GELU(fc2);
    logits out_w w; p = softmax; the top-1 of p + bias (ties to the lower
    index), weighted by p (no renormalization); the class E (the skip
    expert) adds nothing.  gu [E, 2F, D] (gate rows, then up), dn [E, D, F]:
    SwiGLU experts.  act_q: the activation quantizer of the experts' x and h.
    mutate: "no_state" (the state not added), "renorm" (weight 1): rules
    that are not the model's.  Returns (y, s, chosen classes)."""
    s = x @ g["down_w"].T + g["down_b"]
    if state is not None and "scale" in g and mutate != "no_state":
        s = s + state * g["scale"]
    u = rms_norm(s, g["norm"], eps)
    v = gelu_erf(u @ g["fc1_w"].T + g["fc1_b"])
    w = gelu_erf(v @ g["fc2_w"].T + g["fc2_b"])
    p = softmax(w @ g["out_w"].T)
    E = gu.shape[0]
    idx = np.array([topk_idx(r, 1)[0] for r in p + g["bias"]])
    y = np.zeros_like(x)
    for t in range(x.shape[0]):
        e = idx[t]
        if e == E:
            continue
        F = dn.shape[2]
        wt = 1.0 if mutate == "renorm" else p[t, e]
        y[t] = wt * mlp(x[t:t + 1], gu[e][:F], gu[e][F:], dn[e], act_q)[0]
    return y, s, idx


def doge_block(x, wr, down_embed, up_embed, k, norm, dense, act_q=None, per_token=False):
    """DogeCDMoE (transformers' modeling_doge.py): router_logits =
    router_gate(x).view(2, T, N) over the call's T = batch * seq tokens (the
    [T, 2N] buffer split along the token axis: token t's halves are flat[t N
    ..] and flat[(T + t) N ..], not its own row, for T > 1), each half's
    topk(N) (sorted, ties to the lower index), all_scores = sx[:, None] +
    sy[None, :], all_indices = ix[:, None] * N + iy[None, :], flattened,
    topk(k) (ties to the lower position), softmax over the k, / their sum
    with norm_topk_prob; out = sum_j silu(x . down_embed[e_j]) * w_j *
    up_embed[e_j] + down_proj(silu(gate_proj x) * up_proj x), dense = (wg,
    wu, wd) HF Linear weights.  act_q: the experts' (and the dense MLP's)
    activation quantizer; the router reads x as it is.  per_token: each
    token's own row split in two halves (not transformers' view: the
    mutation the test must tell apart).  Returns (out, ids)."""
    T, D = x.shape
    N = int(np.floor(np.sqrt(down_embed.shape[0])))
    lg = x @ wr.T  # [T, 2N]
    flat = lg.reshape(-1)
    xe = act_q(x) if act_q else x
    out = np.zeros_like(x)
    ids_all = np.zeros((T, k), dtype=np.int64)
    for t in range(T):
        sx, sy = (lg[t, :N], lg[t, N:]) if per_token else (flat[t * N:(t + 1) * N], flat[(T + t) * N:(T + t + 1) * N])
        ix, iy = topk_idx(sx, N), topk_idx(sy, N)
        allsc = (sx[ix][:, None] + sy[iy][None, :]).reshape(-1)
        alli = (ix[:, None] * N + iy[None, :]).reshape(-1)
        pos = topk_idx(allsc, k)
        w = softmax(allsc[pos])
        if norm:
            w = w / w.sum()
        ids = alli[pos]
        ids_all[t] = ids
        u = down_embed[ids] @ xe[t]
        out[t] = (silu(u) * w) @ up_embed[ids]
    return out + mlp(x, *dense, act_q=act_q), ids_all
F32_EPS = float(np.finfo(np.float32).eps)


def nllb_moe_block(x, wr, br, experts, frac, drop, cap=None, act="relu", mutate=None):
    """NllbMoeSparseMLP in eval mode, written from transformers 4.x's code
    (NllbMoeTop2Router.route_tokens and NllbMoeDenseActDense; 5.24's block
    runs only experts 0 and 1): x [T, D] is all the tokens of the call
    (batch x seq flattened), no padding.  Logits x Wr^T (+ b), softmax; the
    first expert the argmax of the probabilities, the second the argmax of
    the logits with the first masked to -inf; locations1 = cumsum(one_hot1)
    - 1, locations2 = cumsum(one_hot2) - 1 + the first choices' count per
    expert (all tokens); capacity ceil(frac * T) (frac <= 0: cap); a choice
    kept where its location < capacity; then p1, p2 of the kept choices over
    max(p1 + p2, eps(f32)); experts[e] = (fc1 [F, D], b1 [F], fc2 [D, F],
    b2 [D]): fc2(act(fc1 x + b1)) + b2, times 1 - drop, times the weight.
    mutate: "interleaved" counts both choices in token order (not NLLB's
    queue), "before" renormalizes before the drop (the other flag).
    Returns (y, number of dropped choices)."""
    a = (lambda v: np.maximum(v, 0.0) ** 2) if act == "relu2" else (lambda v: np.maximum(v, 0.0))
    T, E = x.shape[0], wr.shape[0]
    logits = x @ wr.T + (0.0 if br is None else br)
    p = softmax(logits)
    i1 = p.argmax(-1)
    l2 = logits.copy()
    l2[np.arange(T), i1] = -np.inf
    i2 = l2.argmax(-1)
    C = math.ceil(frac * T) if frac > 0 else cap
    keep1, keep2 = np.ones(T, bool), np.ones(T, bool)
    if mutate == "interleaved":
        n = np.zeros(E, np.int64)
        for t in range(T):
            for i, k in ((i1, keep1), (i2, keep2)):
                n[i[t]] += 1
                k[t] = n[i[t]] <= C
    else:
        n1 = np.zeros(E, np.int64)
        for t in range(T):
            n1[i1[t]] += 1
            keep1[t] = n1[i1[t]] - 1 < C
        n2 = np.bincount(i1, minlength=E).astype(np.int64)
        for t in range(T):
            n2[i2[t]] += 1
            keep2[t] = n2[i2[t]] - 1 < C
    p1, p2 = p[np.arange(T), i1], p[np.arange(T), i2]
    if mutate == "before":
        den = np.maximum(p1 + p2, F32_EPS)
        g1, g2 = p1 / den * keep1, p2 / den * keep2
    else:
        den = np.maximum(p1 * keep1 + p2 * keep2, F32_EPS)
        g1, g2 = p1 * keep1 / den, p2 * keep2 / den
    out = np.zeros_like(x)
    for t in range(T):
        for e, g, k in ((i1[t], g1[t], keep1[t]), (i2[t], g2[t], keep2[t])):
            if not k:
                continue
            w1, b1, w2, b2 = experts[e]
            out[t] += g * ((a(x[t] @ w1.T + b1) @ w2.T + b2) * (1.0 - drop))
    return out, int((~keep1).sum() + (~keep2).sum())
