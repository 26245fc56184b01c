#!/usr/bin/env python3
"""Draws `moe8 bench --json FILE` results: for each shape and thread count,
how much faster each moe8 kernel (gmm) and each moe8 layer mode is than
the peers measured in the same run (OpenBLAS f32 and oneDNN for the gmm,
PyTorch eager f32 and bf16 for the layer).  Needs python3-matplotlib.

usage: scripts/plot_bench.py bench.json docs/bench.png"""
import json
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        sys.exit(2)
    rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
    peaks = next((r for r in rows if r.get("bench") == "peaks"), {})
    gmm = defaultdict(dict)
    for r in rows:
        if r.get("bench") == "gmm":
            gmm[("%s T=%d E=%d" % (r["shape"], r["T"], r["E"]), r["threads"])][r["impl"]] = r["min_ms"]
    layer = defaultdict(dict)
    for r in rows:
        if r.get("bench") == "layer":
            k = (r["shape"], r["threads"])
            layer[k]["moe8 " + r["mode"]] = r["min_ms"]
            for peer in ("torch_f32", "torch_bf16"):
                if r.get(peer + "_ms", -1) > 0:
                    layer[k][peer] = r[peer + "_ms"]
    panels = [("grouped matmul: speedup over OpenBLAS f32 (same run)", gmm, "openblas_f32"),
              ("whole layer: speedup over PyTorch eager bf16 (same run)", layer, "torch_bf16")]
    panels = [p for p in panels if p[1]]
    if not panels:
        print("plot_bench: no gmm or layer results in %s" % sys.argv[1])
        sys.exit(1)
    fig, axes = plt.subplots(len(panels), 1, figsize=(16, 4.6 * len(panels)), squeeze=False)
    for ax, (title, data, base) in zip(axes[:, 0], panels):
        keys = sorted(data)
        impls = sorted({i for k in keys for i in data[k] if i != base})
        width = 0.8 / max(len(impls), 1)
        for j, impl in enumerate(impls):
            xs, ys = [], []
            for i, k in enumerate(keys):
                if impl in data[k] and base in data[k]:
                    xs.append(i + j * width)
                    ys.append(data[k][base] / data[k][impl])
            bars = ax.bar(xs, ys, width, label=impl)
            for x, y in zip(xs, ys):
                ax.text(x, y, "%.2f" % y, ha="center", va="bottom", fontsize=6, rotation=90)
            del bars
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(keys))])
        ax.set_xticklabels(["%s\n%d thread%s" % (s, t, "s" if t > 1 else "") for s, t in keys], fontsize=7)
        ax.set_ylabel("x faster than " + base)
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7, ncol=4)
    sub = ""
    if peaks:
        sub = "peaks measured in the run: f32 FMA %.0f GFLOP/s, vdpbf16ps %.0f GFLOP/s, vpdpbusd %.0f GOP/s, read %.1f GB/s" % (
            peaks.get("f32_gflops", 0), peaks.get("bf16_gflops", 0), peaks.get("i8_gops", 0), peaks.get("read_gbs", 0))
    fig.suptitle("moe8 bench (%s)" % sub, fontsize=9)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)
    print("plot_bench: %s" % sys.argv[2])


if __name__ == "__main__":
    main()
