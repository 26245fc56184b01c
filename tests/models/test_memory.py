"""Peak resident memory of `moe8 run` on FP8 checkpoints of >= 200 MB, in
the DeepSeek format (F8_E4M3 blocks + weight_scale_inv) and in moe8's own
packed format (mapped in place): it must stay within
    1.15 x (the layer's quantized bytes: codes + scales) + activations,
where activations are the input, the output, the layer's workspace and the
process's baseline (the peak RSS of `moe8 --help`).  Measured with wait4's
rusage of the child.

Usage: test_memory.py MOE8_BINARY"""
import json
import os
import subprocess
import sys
import tempfile

# The runs are forked from a small launcher started now, before numpy and
# the test's arrays: a child forked from this process would inherit its
# resident size at the fork into its ru_maxrss (Linux keeps the high-water
# mark across exec), so the measure would depend on how much memory the
# test itself held at the time.
_LAUNCHER = r"""
import os, sys
for line in sys.stdin:
    args = line.rstrip("\n").split("\0")
    pid = os.fork()
    if pid == 0:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, 1)
        try:
            os.execv(args[0], args)
        finally:
            os._exit(127)
    _, status, ru = os.wait4(pid, 0)
    sys.stdout.write("%d %d\n" % (os.waitstatus_to_exitcode(status), ru.ru_maxrss * 1024))
    sys.stdout.flush()
"""
_launcher = subprocess.Popen([sys.executable, "-S", "-c", _LAUNCHER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hfref as R  # noqa: E402

MOE8 = sys.argv[1]
E, K, D, F, T = 32, 8, 2048, 1024, 16


def run_measured(args):
    """(exit code, peak RSS in bytes) of args run as a child of the launcher:
    wait4's rusage of exactly that child."""
    _launcher.stdin.write("\0".join(args) + "\n")
    _launcher.stdin.flush()
    rc, rss = _launcher.stdout.readline().split()
    return int(rc), int(rss)


def write_deepseek(d, rng):
    os.makedirs(d)
    cfg = {"model_type": "deepseek_v3", "n_routed_experts": E, "num_experts_per_tok": K, "hidden_size": D, "moe_intermediate_size": F,
           "num_hidden_layers": 1, "first_k_dense_replace": 0, "n_group": 4, "topk_group": 2, "n_shared_experts": 1,
           "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    p = "model.layers.0.mlp."
    t = {p + "gate.weight": ("F32", rng.standard_normal((E, D)).astype(np.float32) * 0.05),
         p + "gate.e_score_correction_bias": ("F32", np.zeros(E, dtype=np.float32))}
    # random codes of moderate magnitude (no NaN code): 0x00..0x3F and the same negated
    qbytes = 0
    names = ["%sexperts.%d." % (p, e) for e in range(E)] + [p + "shared_experts."]
    for base in names:
        for nm, (N, Kk) in (("gate_proj", (F, D)), ("up_proj", (F, D)), ("down_proj", (D, F))):
            codes = rng.integers(0, 0x40, size=(N, Kk), dtype=np.uint8) | (rng.integers(0, 2, size=(N, Kk), dtype=np.uint8) << 7)
            t[base + nm + ".weight"] = ("F8_E4M3", codes)
            t[base + nm + ".weight_scale_inv"] = ("F32", np.full(((N + 127) // 128, (Kk + 127) // 128), 1e-3, dtype=np.float32))
            qbytes += N * Kk
    R.write_safetensors(os.path.join(d, "model.safetensors"), t)
    return qbytes


def write_bf16(d, rng):
    os.makedirs(d)
    cfg = {"model_type": "qwen3_moe", "num_experts": E, "num_experts_per_tok": K, "hidden_size": D, "moe_intermediate_size": F,
           "num_hidden_layers": 1}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    p = "model.layers.0.mlp."
    t = {p + "gate.weight": ("F32", rng.standard_normal((E, D)).astype(np.float32) * 0.05)}
    for e in range(E):
        for nm, (N, Kk) in (("gate_proj", (F, D)), ("up_proj", (F, D)), ("down_proj", (D, F))):
            t["%sexperts.%d.%s.weight" % (p, e, nm)] = ("BF16", rng.standard_normal((N, Kk), dtype=np.float32) * 0.02)
    R.write_safetensors(os.path.join(d, "model.safetensors"), t)


def main():
    rng = np.random.default_rng(7)
    fails = []
    with tempfile.TemporaryDirectory() as tmp:
        _, base = run_measured([MOE8, "--help"])
        x = os.path.join(tmp, "x.npy")
        R.write_npy(x, rng.standard_normal((T, D)))
        act = base + 2 * T * D * 4 + T * K * (D * 4 * 3 + F * 4 * 4) + (8 << 20)
        cases = []
        ds = os.path.join(tmp, "ds")
        q = write_deepseek(ds, rng)
        nbk = lambda n: (n + 127) // 128
        scales = 4 * ((E + 1) * (nbk(D) * 2 * F + nbk(F) * D))  # [E, nb, 1, N] per column, f32
        cases.append(("deepseek FP8 blocks", ds, q + scales))
        bf = os.path.join(tmp, "bf16")
        write_bf16(bf, rng)
        rules = os.path.join(tmp, "rules.json")
        with open(rules, "w") as f:
            json.dump({"rules": [{"module_path": ".*", "weight_qtype": "float8_e4m3fn", "act_qtype": "float8_e4m3fn", "tile_size": 128}]}, f)
        m8 = os.path.join(tmp, "moe8fmt")
        r = subprocess.run([MOE8, "quantize", bf, m8, "--rules", rules], capture_output=True, text=True)
        if r.returncode != 0:
            print("quantize failed: " + r.stderr)
            sys.exit(1)
        os.remove(os.path.join(bf, "model.safetensors"))
        cases.append(("moe8 packed", m8, E * 3 * D * F + 4 * E * (nbk(D) * 2 * F + nbk(F) * D)))
        for name, d, qb in cases:
            size = os.path.getsize(os.path.join(d, "model.safetensors"))
            rc, rss = run_measured([MOE8, "run", "--model", d, "--input", x, "--output", os.path.join(tmp, "y.npy")])
            budget = 1.15 * qb + act
            ok = rc == 0 and rss <= budget
            print("%-22s file %6.1f MB, quantized %6.1f MB: peak RSS %6.1f MB, budget %6.1f MB (1.15 x quantized + %.1f MB "
                  "activations and baseline) %s" % (name, size / 1e6, qb / 1e6, rss / 1e6, budget / 1e6, act / 1e6,
                                                    "ok" if ok else "FAIL (exit %d)" % rc))
            if not ok:
                fails.append(name)
            if size < 200e6:
                fails.append(name + " (file under 200 MB)")
    if fails:
        print("FAILED: " + ", ".join(fails))
        sys.exit(1)
    print("memory: ok")


if __name__ == "__main__":
    main()
