"""PyTorch eager MoE layer, the peer of 'moe8 bench layer'.

A per-expert loop as in the common Hugging Face MoE blocks (Qwen2-MoE,
Mixtral): router linear, softmax, top-k, renormalize, then for each expert
gather its tokens, SwiGLU, down projection, scale, index_add.  Prints one
JSON line: {"min_ms": ..., "median_ms": ...}.

usage: python3 torch_moe.py T E K D F f32|bf16 THREADS REPS
       python3 torch_moe.py --model DIR --input X.npy --output Y.npy f32|bf16 THREADS REPS

The second form ('moe8 demo') runs layer 0 of a Qwen3-MoE or Qwen2-MoE
style checkpoint directory (config.json, model.safetensors with per-expert
gate_proj / up_proj / down_proj in F32 or BF16; no shared expert) on the
tokens of X.npy and writes the output as f32 to Y.npy.
"""
import json
import os
import struct
import sys

import torch

from peer_timing import time_ms


def read_safetensors(path):
    """The tensors of a safetensors file as float32 numpy arrays (F32, BF16)."""
    import numpy as np
    with open(path, "rb") as f:
        blob = f.read()
    n = struct.unpack("<Q", blob[:8])[0]
    head = json.loads(blob[8:8 + n])
    out = {}
    for name, t in head.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        raw = blob[8 + n + a:8 + n + b]
        if t["dtype"] == "F32":
            v = np.frombuffer(raw, dtype="<f4")
        elif t["dtype"] == "BF16":
            v = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            continue
        out[name] = v.reshape(t["shape"])
    return out


def checkpoint(args):
    """Layer 0 of the checkpoint directory, its config's routing, X's tokens."""
    import numpy as np
    d = args[args.index("--model") + 1]
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    w = read_safetensors(os.path.join(d, "model.safetensors"))
    p = "model.layers.0.mlp."
    E = cfg.get("num_experts", cfg.get("num_local_experts"))
    t = lambda name: torch.from_numpy(np.ascontiguousarray(w[p + name]))
    x = torch.from_numpy(np.load(args[args.index("--input") + 1]).astype(np.float32))
    experts = [tuple(t("experts.%d.%s.weight" % (e, n)) for n in ("gate_proj", "up_proj", "down_proj")) for e in range(E)]
    return x, t("gate.weight"), experts, cfg["num_experts_per_tok"], cfg.get("norm_topk_prob", False)


def main():
    args = sys.argv[1:]
    if "--model" in args:
        x, wr, ex, K, norm = checkpoint(args)
        rest = [a for i, a in enumerate(args) if a not in ("--model", "--input", "--output") and
                (i == 0 or args[i - 1] not in ("--model", "--input", "--output"))]
        dt = {"f32": torch.float32, "bf16": torch.bfloat16}[rest[0]]
        threads, reps = int(rest[1]), int(rest[2])
        E = len(ex)
        x, wr = x.to(dt), wr.to(dt)
        wg, wu, wd = ([e[i].to(dt) for e in ex] for i in range(3))
    else:
        T, E, K, D, F = (int(v) for v in args[0:5])
        dt = {"f32": torch.float32, "bf16": torch.bfloat16}[args[5]]
        threads, reps = int(args[6]), int(args[7])
        norm = True
        torch.manual_seed(0)
        x = torch.randn(T, D, dtype=dt)
        wr = (torch.randn(E, D) * D ** -0.5).to(dt)
        wg = [(torch.randn(F, D) * D ** -0.5).to(dt) for _ in range(E)]
        wu = [(torch.randn(F, D) * D ** -0.5).to(dt) for _ in range(E)]
        wd = [(torch.randn(D, F) * F ** -0.5).to(dt) for _ in range(E)]
    torch.set_num_threads(threads)
    lin = torch.nn.functional.linear

    def forward(h):
        probs = torch.softmax(lin(h, wr).float(), dim=-1)
        w, ids = torch.topk(probs, K, dim=-1)
        w = (w / w.sum(dim=-1, keepdim=True) if norm else w).to(dt)
        out = torch.zeros_like(h)
        mask = torch.nn.functional.one_hot(ids, E).permute(2, 1, 0)
        for e in range(E):
            slot, tok = torch.where(mask[e])
            if tok.numel() == 0:
                continue
            xs = h[tok]
            y = lin(torch.nn.functional.silu(lin(xs, wg[e])) * lin(xs, wu[e]), wd[e])
            out.index_add_(0, tok, y * w[tok, slot, None])
        return out

    with torch.inference_mode():
        min_ms, median_ms = time_ms(forward, x, reps, warm=2)
        y = forward(x)
    if "--output" in args:
        import numpy as np
        np.save(args[args.index("--output") + 1], y.float().numpy())
    print(json.dumps({"min_ms": min_ms, "median_ms": median_ms,
                      "threads": torch.get_num_threads(), "torch": torch.__version__}))


if __name__ == "__main__":
    main()
