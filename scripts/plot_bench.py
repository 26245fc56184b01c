#!/usr/bin/env python3
"""Draws `moe8 bench --json FILE` results (`moe8 bench --plot PNG` runs it):
for each shape and thread count, how many times faster each moe8 kernel
(grouped matmul) and each moe8 layer mode is than a peer measured in the
same run (OpenBLAS f32 for the matmul, PyTorch eager bf16 for the layer).
One panel per section, ratios on a log axis (one outlier does not flatten
the rest), one colour per system throughout; a bar is the best run, its
whisker reaches the median run (the spread).  The CPU the figures come
from is in the title.  Needs python3-matplotlib.

usage: scripts/plot_bench.py bench.json docs/bench.png"""
import json
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# Every system the bench measures: (label in words, colour).  A series the
# run lacks is left out; one colour is never used for two systems.
SYSTEMS = {
    "moe8_f32": ("moe8, f32", "#7f7f7f"),
    "moe8_bf16": ("moe8, bf16", "#8c564b"),
    "moe8_bf16_canon": ("moe8, bf16, canonical order", "#c49c94"),
    "moe8_f8e4m3": ("moe8, FP8 E4M3", "#1f77b4"),
    "moe8_f8e4m3_canon": ("moe8, FP8 E4M3, canonical order", "#aec7e8"),
    "moe8_f8e4m3_packed": ("moe8, FP8 E4M3, packed weights", "#2ca02c"),
    "moe8_f8e4m3_packed_canon": ("moe8, FP8 E4M3, packed, canonical order", "#98df8a"),
    "moe8_i8": ("moe8, INT8", "#d62728"),
    "moe8_i8_packed": ("moe8, INT8, packed weights", "#ff9896"),
    "onednn_bf16": ("oneDNN, bf16", "#9467bd"),
    "onednn_s8": ("oneDNN, INT8", "#c5b0d5"),
    "layer f32": ("moe8 layer, f32", "#7f7f7f"),
    "layer f8e4m3": ("moe8 layer, FP8 E4M3", "#1f77b4"),
    "layer i8": ("moe8 layer, INT8", "#d62728"),
    "torch_f32": ("PyTorch eager, f32", "#ff7f0e"),
    "layer kt_bf16": ("kt-kernel layer, AMX bf16", "#e377c2"),
    "layer kt_int8": ("kt-kernel layer, AMX INT8", "#bcbd22"),
}
BASES = {"openblas_f32": "OpenBLAS f32 (one sgemm per expert)", "torch_bf16": "PyTorch eager bf16"}


def label(impl):
    return SYSTEMS.get(impl, (impl.replace("_", " "), None))[0]


def colour(impl, spare=iter(["#17becf", "#393b79", "#637939", "#8c6d31", "#843c39"])):
    c = SYSTEMS.get(impl, (None, None))[1]
    if c is None:
        c = SYSTEMS.setdefault(impl, (impl.replace("_", " "), next(spare, "#000000")))[1]
    return c


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        sys.exit(2)
    rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
    machine = next((r for r in rows if r.get("bench") == "machine"), {})
    peaks = next((r for r in rows if r.get("bench") == "peaks"), {})
    gmm = defaultdict(dict)
    spread = defaultdict(lambda: defaultdict(dict))  # section -> key -> impl -> median ms
    for r in rows:
        if r.get("bench") == "gmm":
            k = ("%s\n%d token%s, %d experts" % (r["shape"], r["T"], "" if r["T"] == 1 else "s", r["E"]), r["threads"])
            gmm[k][r["impl"]] = r["min_ms"]
            if r.get("median_ms"):
                spread[id(gmm)][k][r["impl"]] = r["median_ms"]
    layer = defaultdict(dict)
    for r in rows:
        if r.get("bench") == "layer":
            k = ("%s layer" % r["shape"], r["threads"])
            layer[k]["layer " + r["mode"]] = r["min_ms"]
            if r.get("median_ms"):
                spread[id(layer)][k]["layer " + r["mode"]] = r["median_ms"]
            for peer in ("torch_f32", "torch_bf16"):
                if r.get(peer + "_ms", -1) > 0:
                    layer[k][peer] = r[peer + "_ms"]
    panels = [("Grouped matmul: times faster than OpenBLAS f32", gmm, "openblas_f32"),
              ("Whole MoE layer: times faster than PyTorch eager bf16", layer, "torch_bf16")]
    panels = [p for p in panels if p[1] and any(p[2] in v for v in p[1].values())]
    if not panels:
        print("plot_bench: no gmm or layer results with their peers in %s" % sys.argv[1])
        sys.exit(1)
    fig, axes = plt.subplots(len(panels), 1, figsize=(16, 5.2 * len(panels)), squeeze=False)
    for ax, (title, data, base) in zip(axes[:, 0], panels):
        keys = sorted(k for k in data if base in data[k])
        impls = [i for i in SYSTEMS if any(i in data[k] for k in keys)]
        impls += sorted({i for k in keys for i in data[k]} - set(impls) - {base})
        width = 0.8 / max(len(impls), 1)
        for j, impl in enumerate(impls):
            xs, ys, lo = [], [], []
            for i, k in enumerate(keys):
                if impl in data[k]:
                    xs.append(i + j * width)
                    ys.append(data[k][base] / data[k][impl])
                    med = spread[id(data)][k].get(impl)
                    lo.append(ys[-1] - data[k][base] / med if med and med >= data[k][impl] else 0.0)
            ax.bar(xs, ys, width, label=label(impl), color=colour(impl))
            ax.errorbar(xs, ys, yerr=[lo, [0.0] * len(lo)], fmt="none", ecolor="black", elinewidth=0.6, capsize=1.5)
            for x, y in zip(xs, ys):
                ax.text(x, y, "%.2f" % y, ha="center", va="bottom", fontsize=6, rotation=90)
        ax.set_yscale("log")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(keys))])
        ax.set_xticklabels(["%s\n%d thread%s" % (s, t, "s" if t > 1 else "") for s, t in keys], fontsize=7)
        ax.set_ylabel("times faster than %s\n(log scale; 1.0 = the same speed)" % BASES[base], fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.005, 1.0))  # beside the bars, not over them
    cpu = machine.get("cpu", "CPU not recorded")
    amx = "" if not machine else (", AMX tiles" if machine.get("amx") else ", no AMX")
    head = "moe8 %s on %s (%s CPUs%s), every peer measured in the same run" % (machine.get("version", ""), cpu, machine.get("cpus", "?"), amx)
    if peaks:
        head += "\nmeasured peaks: f32 FMA %.0f GFLOP/s, bf16 dot %.0f GFLOP/s, int8 dot %.0f GOP/s, memory read %.1f GB/s" % (
            peaks.get("f32_gflops", 0), peaks.get("bf16_gflops", 0), peaks.get("i8_gops", 0), peaks.get("read_gbs", 0))
        if peaks.get("amx_bf16_gflops", 0) > 0:
            head += ", AMX bf16 %.0f GFLOP/s" % peaks["amx_bf16_gflops"]
    fig.suptitle(head, fontsize=10)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)
    print("plot_bench: %s" % sys.argv[2])


if __name__ == "__main__":
    main()
