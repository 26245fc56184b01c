#!/usr/bin/env python3
"""A DeepSeek-V3-sized MoE layer on this machine: writes one layer as a
DeepSeek-format FP8 checkpoint (E=256, top-8, hidden 7168, expert width
2048, n_group 8, topk_group 4, one shared expert; random codes and block
scales; about 11.3 GB), then runs `moe8 run` on it for a few token counts
and prints peak RSS, load time and time per token.  Not part of the test
command (it writes 11 GB).

usage: scripts/deepseek_v3_layer.py MOE8_BINARY WORK_DIR [--keep]"""
import json
import os
import re
import struct
import subprocess
import sys
import time

import numpy as np

E, K, D, F, NG, KG = 256, 8, 7168, 2048, 8, 4


def tensors():
    """(name, dtype, shape, generator) in file order."""
    p = "model.layers.3.mlp."
    out = [(p + "gate.weight", "BF16", (E, D)), (p + "gate.e_score_correction_bias", "F32", (E,))]
    for base in ["%sexperts.%d." % (p, e) for e in range(E)] + [p + "shared_experts."]:
        for nm, (n, k) in (("gate_proj", (F, D)), ("up_proj", (F, D)), ("down_proj", (D, F))):
            out.append((base + nm + ".weight", "F8_E4M3", (n, k)))
            out.append((base + nm + ".weight_scale_inv", "F32", ((n + 127) // 128, (k + 127) // 128)))
    return out


SIZE = {"BF16": 2, "F32": 4, "F8_E4M3": 1}


def write(d, rng):
    os.makedirs(d, exist_ok=True)
    cfg = {"model_type": "deepseek_v3", "n_routed_experts": E, "num_experts_per_tok": K, "hidden_size": D,
           "moe_intermediate_size": F, "num_hidden_layers": 4, "first_k_dense_replace": 3, "n_group": NG, "topk_group": KG,
           "n_shared_experts": 1, "routed_scaling_factor": 2.5, "norm_topk_prob": True, "hidden_act": "silu",
           "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    ts = tensors()
    header, off = {}, 0
    for name, dt, shape in ts:
        n = SIZE[dt] * int(np.prod(shape))
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    path = os.path.join(d, "model.safetensors")
    t0 = time.time()
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for i, (name, dt, shape) in enumerate(ts):
            if dt == "F8_E4M3":  # codes of magnitude < 2 (no NaN code), random signs
                a = rng.integers(0, 0x40, size=shape, dtype=np.uint8) | (rng.integers(0, 2, size=shape, dtype=np.uint8) << 7)
            elif name.endswith("weight_scale_inv"):
                a = np.full(shape, 2e-3, dtype=np.float32)
            elif dt == "BF16":
                a = (rng.standard_normal(shape, dtype=np.float32) * 0.02).view(np.uint32) >> 16
                a = a.astype(np.uint16)
            else:
                a = np.zeros(shape, dtype=np.float32)
            f.write(a.tobytes())
            if i % 200 == 0:
                print("write: %d/%d tensors, %.1f GB, %.0f s" % (i, len(ts), f.tell() / 1e9, time.time() - t0), flush=True)
    os.rename(path + ".tmp", path)
    return off


def measured(args):
    pid = os.fork()
    if pid == 0:
        os.execv(args[0], args)
    _, status, ru = os.wait4(pid, 0)
    return os.waitstatus_to_exitcode(status), ru.ru_maxrss * 1024


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        sys.exit(2)
    moe8, work = sys.argv[1], sys.argv[2]
    rng = np.random.default_rng(3)
    d = os.path.join(work, "deepseek_v3_layer")
    if not os.path.exists(os.path.join(d, "model.safetensors")):
        write(d, rng)
    size = os.path.getsize(os.path.join(d, "model.safetensors"))
    print("checkpoint: %.2f GB (%s)" % (size / 1e9, d))
    for T in (1, 8, 32):
        x = os.path.join(work, "x%d.npy" % T)
        np.save(x, rng.standard_normal((T, D)).astype(np.float32))
        log = os.path.join(work, "run%d.log" % T)
        t0 = time.time()
        with open(log, "w") as lf:
            pid = os.fork()
            if pid == 0:
                os.dup2(lf.fileno(), 1)
                os.dup2(lf.fileno(), 2)
                os.execv(moe8, [moe8, "run", "--model", d, "--input", x, "--output", os.path.join(work, "y.npy"), "--repeat", "5"])
            _, status, ru = os.wait4(pid, 0)
        wall = time.time() - t0
        text = open(log).read()
        m = re.search(r": ([0-9.]+) ms ->", text)
        ms = float(m.group(1)) if m else float("nan")
        ld = re.search(r"ready in ([0-9.]+) s", text)
        print("T=%-3d exit %d  peak RSS %.2f GB (%.3fx the file)  load %s s  forward (best of 5) %.1f ms (%.2f ms/token)  wall %.1f s" %
              (T, os.waitstatus_to_exitcode(status), ru.ru_maxrss * 1024 / 1e9, ru.ru_maxrss * 1024 / size,
               ld.group(1) if ld else "<2", ms, ms / T, wall))
        if os.waitstatus_to_exitcode(status) != 0:
            print(text)
    if "--keep" not in sys.argv:
        os.remove(os.path.join(d, "model.safetensors"))


if __name__ == "__main__":
    main()
