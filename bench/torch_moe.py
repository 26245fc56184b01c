"""PyTorch eager MoE layer, the peer of 'moe8 bench layer'.

A per-expert loop as in the common Hugging Face MoE blocks (Qwen2-MoE,
Mixtral): router linear, softmax, top-k, renormalize, then for each expert
gather its tokens, SwiGLU, down projection, scale, index_add.  Prints one
JSON line: {"min_ms": ..., "median_ms": ...}.

usage: python3 torch_moe.py T E K D F f32|bf16 THREADS REPS
"""
import json
import sys
import time

import torch


def main():
    T, E, K, D, F = (int(v) for v in sys.argv[1:6])
    dt = {"f32": torch.float32, "bf16": torch.bfloat16}[sys.argv[6]]
    threads, reps = int(sys.argv[7]), int(sys.argv[8])
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    x = torch.randn(T, D, dtype=dt)
    wr = (torch.randn(E, D) * D ** -0.5).to(dt)
    wg = [(torch.randn(F, D) * D ** -0.5).to(dt) for _ in range(E)]
    wu = [(torch.randn(F, D) * D ** -0.5).to(dt) for _ in range(E)]
    wd = [(torch.randn(D, F) * F ** -0.5).to(dt) for _ in range(E)]
    lin = torch.nn.functional.linear

    def forward(h):
        probs = torch.softmax(lin(h, wr).float(), dim=-1)
        w, ids = torch.topk(probs, K, dim=-1)
        w = (w / w.sum(dim=-1, keepdim=True)).to(dt)
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
        for _ in range(2):
            forward(x)
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            forward(x)
            times.append(time.perf_counter() - t0)
    times.sort()
    print(json.dumps({"min_ms": times[0] * 1e3, "median_ms": times[len(times) // 2] * 1e3,
                      "threads": torch.get_num_threads(), "torch": torch.__version__}))


if __name__ == "__main__":
    main()
