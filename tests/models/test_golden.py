"""The fifteen families moe8 ran before families became rows of data
(qwen2_moe, qwen3_moe, mixtral, deepseek_v3, olmoe, deepseek_v2, qwen3_next,
gpt_oss, llama4_text, llama4, glm4_moe, dots1, minimax, minimax_m2, kimi_k2)
give the bytes they gave then.

Each case writes a small checkpoint in the family's own names and keys from
a fixed integer sequence (no random generator whose stream could change),
runs `moe8 run` with the reference kernel table in the canonical summation
order (bytes that do not depend on the CPU: docs/determinism.md), and
compares the SHA-256 of the output's bytes with tests/data/golden_families.json.
Those digests were recorded by the build of 011a8f1, the last commit before
the move (`--record` writes them; docs/models.md, "Adding a family").

Usage: test_golden.py MOE8_BINARY [--record] [--golden FILE] [--isa NAME]
(--isa runs another kernel table, for a comparison by hand between two
builds on one machine: only the reference table's bytes are CPU-free.)"""
import hashlib
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hfref as R  # noqa: E402
from test_families import fp8_blocks  # noqa: E402  (DeepSeek's FP8 blocks, as the family tests write them)

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(HERE, "..", "data", "golden_families.json")


class Seq:
    """Values from a fixed integer sequence: multiples of 2^-12 in (-1, 1),
    exact in f32 and bf16, the same on every machine and numpy."""

    def __init__(self, seed):
        self.state = seed

    def __call__(self, *shape, scale=1.0, offset=0.0):
        n = int(np.prod(shape))
        i = np.arange(self.state, self.state + n, dtype=np.uint64)
        self.state += n
        h = (i * np.uint64(2654435761) + np.uint64(97)) % np.uint64(1 << 32)
        h = (h ^ (h >> np.uint64(15))) * np.uint64(2246822519) % np.uint64(1 << 32)
        v = ((h >> np.uint64(19)).astype(np.int64) - 4096) / 4096.0  # [-1, 1) in steps of 2^-12
        return (v * scale + offset).reshape(shape).astype(np.float32)


def experts(s, E, D, F):
    return [(s(F, D, scale=2.0 * D ** -0.5), s(F, D, scale=2.0 * D ** -0.5), s(D, F, scale=2.0 * F ** -0.5)) for _ in range(E)]


def put_per_expert(t, p, ex, names):
    for e, ws in enumerate(ex):
        for nm, w in zip(names, ws):
            t["%sexperts.%d.%s.weight" % (p, e, nm)] = ("F32", w)


def put_fused(t, p, ex):
    t[p + "experts.gate_up_proj"] = ("F32", np.stack([np.concatenate([g, u], axis=0) for g, u, _ in ex]))
    t[p + "experts.down_proj"] = ("F32", np.stack([dn for _, _, dn in ex]))


def put_mlp(t, p, ws):
    for nm, w in zip(("gate_proj", "up_proj", "down_proj"), ws):
        t[p + "%s.weight" % nm] = ("F32", w)


def qwen(s, fam):
    E, k, D, F = 16, 4, 256, 192
    cfg = {"model_type": fam, "num_experts": E, "num_experts_per_tok": k, "hidden_size": D, "moe_intermediate_size": F,
           "num_hidden_layers": 1}
    if fam == "qwen3_moe":
        cfg["norm_topk_prob"] = True
    p = "model.layers.0.mlp."
    t = {p + "gate.weight": ("F32", s(E, D, scale=0.5))}
    put_per_expert(t, p, experts(s, E, D, F), ("gate_proj", "up_proj", "down_proj"))
    if fam in ("qwen2_moe", "qwen3_next"):
        cfg["shared_expert_intermediate_size"] = 256
        put_mlp(t, p + "shared_expert.", experts(s, 1, D, 256)[0])
        t[p + "shared_expert_gate.weight"] = ("F32", s(1, D, scale=D ** -0.5))
    if fam == "qwen3_next":
        cfg["num_local_experts"] = cfg.pop("num_experts")
    return cfg, t, D


def olmoe(s):
    E, k, D, F = 16, 4, 256, 192
    cfg = {"model_type": "olmoe", "num_experts": E, "num_experts_per_tok": k, "hidden_size": D, "intermediate_size": F,
           "num_hidden_layers": 1}
    p = "model.layers.0.mlp."
    t = {p + "gate.weight": ("F32", s(E, D, scale=0.5))}
    put_per_expert(t, p, experts(s, E, D, F), ("gate_proj", "up_proj", "down_proj"))
    return cfg, t, D


def mixtral(s, fam, fused, sigmoid=False):
    E, D, F = 8 if fam == "mixtral" else 16, 256, 160
    cfg = {"model_type": fam, "hidden_size": D, "intermediate_size": F, "num_hidden_layers": 1}
    cfg["num_local_experts" if fam == "mixtral" else "num_experts"] = E
    if fam != "minimax_m2":
        cfg["num_experts_per_tok"] = 2 if fam == "mixtral" else 3
    p = "model.layers.0.mlp." if fused else "model.layers.0.block_sparse_moe."
    t = {p + "gate.weight": ("F32", s(E, D, scale=0.5))}
    if sigmoid:
        cfg["scoring_func"] = "sigmoid"
        t[p + "e_score_correction_bias"] = ("F32", s(E, scale=1.0, offset=-1.0))
    ex = experts(s, E, D, F)
    if fused:
        put_fused(t, p, ex)
    else:
        put_per_expert(t, p, ex, ("w1", "w3", "w2"))
    return cfg, t, D


def deepseek(s, keys, fp8=False, drop=()):
    E, k, D, F = 32, 4, 256, 192
    cfg = {"model_type": "deepseek_v3", "n_routed_experts": E, "num_experts_per_tok": k, "hidden_size": D, "moe_intermediate_size": F,
           "num_hidden_layers": 2, "first_k_dense_replace": 1, "n_group": 4, "topk_group": 2, "n_shared_experts": 2}
    cfg.update(keys)
    for key in drop:
        del cfg[key]
    L = 1 if cfg.get("first_k_dense_replace", 0) >= 1 else 0
    p = "model.layers.%d.mlp." % L
    t = {"model.layers.0.mlp.gate_proj.weight": ("F32", np.zeros((8, D), dtype=np.float32))}
    t[p + "gate.weight"] = ("F32", s(E, D, scale=0.5))
    t[p + "gate.e_score_correction_bias"] = ("F32", s(E, scale=0.2, offset=-1.5))
    ws = experts(s, E, D, F)
    sh = experts(s, 1, D, F * (cfg.get("n_shared_experts") or 1))[0]
    names = ("gate_proj", "up_proj", "down_proj")
    for e, ex in enumerate(ws):
        for nm, w in zip(names, ex):
            if fp8:
                fp8_blocks(t, "%sexperts.%d.%s" % (p, e, nm), w)
            else:
                t["%sexperts.%d.%s.weight" % (p, e, nm)] = ("F32", w)
    for nm, w in zip(names, sh):
        if fp8:
            fp8_blocks(t, "%sshared_experts.%s" % (p, nm), w)
        else:
            t["%sshared_experts.%s.weight" % (p, nm)] = ("F32", w)
    if fp8:
        cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}
    return cfg, t, D


def deepseek_v2(s, keys, router_scale=0.5):
    E, k, D, F = 32, 4, 256, 160
    cfg = {"model_type": "deepseek_v2", "n_routed_experts": E, "num_experts_per_tok": k, "hidden_size": D, "moe_intermediate_size": F,
           "num_hidden_layers": 1, "n_shared_experts": 2}
    cfg.update(keys)
    p = "model.layers.0.mlp."
    t = {p + "gate.weight": ("F32", s(E, D, scale=router_scale))}
    put_per_expert(t, p, experts(s, E, D, F), ("gate_proj", "up_proj", "down_proj"))
    put_mlp(t, p + "shared_experts.", experts(s, 1, D, 2 * F)[0])
    return cfg, t, D


def gpt_oss(s, mxfp4=False):
    E, k, D, F = 16, 4, 128, 96
    cfg = {"model_type": "gpt_oss", "num_local_experts": E, "num_experts_per_tok": k, "hidden_size": D, "intermediate_size": F,
           "num_hidden_layers": 1, "swiglu_limit": 7.0}
    p = "model.layers.0.mlp."
    t = {p + "router.weight": ("F32", s(E, D, scale=D ** -0.5)), p + "router.bias": ("F32", s(E, scale=0.5)),
         p + "experts.gate_up_proj_bias": ("F32", s(E, 2 * F, scale=0.5)), p + "experts.down_proj_bias": ("F32", s(E, D, scale=0.2))}
    if mxfp4:
        cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": ["router"]}
        for name, N, K in (("gate_up_proj", 2 * F, D), ("down_proj", D, F)):
            codes = s(E, N, K // 32, 16)
            t[p + "experts.%s_blocks" % name] = ("U8", ((codes + 1.0) * 128).astype(np.int64).clip(0, 255).astype(np.uint8))
            sc = s(E, N, K // 32)
            t[p + "experts.%s_scales" % name] = ("U8", (122 + (sc + 1.0) * 3).astype(np.int64).clip(122, 127).astype(np.uint8))
    else:
        t[p + "experts.gate_up_proj"] = ("F32", s(E, D, 2 * F, scale=3.0 * D ** -0.5))
        t[p + "experts.down_proj"] = ("F32", s(E, F, D, scale=2.0 * F ** -0.5))
    return cfg, t, D


def llama4(s, wrapper=False):
    E, D, F = 8, 128, 96
    cfg = {"model_type": "llama4_text", "num_local_experts": E, "hidden_size": D, "intermediate_size": F, "num_hidden_layers": 2,
           "intermediate_size_mlp": 256, "hidden_act": "silu", "num_experts_per_tok": 2, "interleave_moe_layer_step": 2}
    p = "model.layers.1.feed_forward."
    t = {p + "router.weight": ("F32", s(E, D, scale=2.0 * D ** -0.5)), p + "experts.gate_up_proj": ("F32", s(E, D, 2 * F, scale=2.0 * D ** -0.5)),
         p + "experts.down_proj": ("F32", s(E, F, D, scale=2.0 * F ** -0.5))}
    put_mlp(t, p + "shared_expert.", experts(s, 1, D, F)[0])
    if wrapper:
        cfg = {"model_type": "llama4", "text_config": cfg, "vision_config": {"model_type": "llama4_vision_model", "hidden_size": 16}}
        t = {k.replace("model.layers.", "language_model.model.layers.", 1): v for k, v in t.items()}
        t["vision_model.patch_embedding.linear.weight"] = ("F32", s(4, 4))
    return cfg, t, D


RULES = {
    "fp8": {"weight_qtype": "float8_e4m3fn", "act_qtype": "float8_e4m3fn", "tile_size": 128},
    "i8": {"weight_qtype": "int8", "act_qtype": "int8", "tile_size": 128},
}


def cases():
    """(name, builder, the rules runs): every case also runs without rules."""
    ds = {"routed_scaling_factor": 2.5, "norm_topk_prob": True, "scoring_func": "sigmoid", "topk_method": "noaux_tc"}
    return [
        ("qwen2_moe", lambda s: qwen(s, "qwen2_moe"), ("fp8", "i8")),
        ("qwen3_moe", lambda s: qwen(s, "qwen3_moe"), ("fp8", "i8")),
        ("qwen3_next", lambda s: qwen(s, "qwen3_next"), ("fp8",)),
        ("olmoe", olmoe, ("fp8",)),
        ("mixtral block_sparse_moe", lambda s: mixtral(s, "mixtral", False), ("fp8", "i8")),
        ("mixtral fused 3-D", lambda s: mixtral(s, "mixtral", True), ("fp8",)),
        ("minimax", lambda s: mixtral(s, "minimax", False), ("fp8",)),
        ("minimax_m2", lambda s: mixtral(s, "minimax_m2", True, sigmoid=True), ("fp8",)),
        ("deepseek_v3", lambda s: deepseek(s, ds), ("fp8", "i8")),
        ("deepseek_v3 keys absent", lambda s: deepseek(s, {}), ()),
        ("deepseek_v3 FP8 file", lambda s: deepseek(s, {}, fp8=True), ()),
        ("glm4_moe", lambda s: deepseek(s, {"model_type": "glm4_moe"}), ("fp8",)),
        ("kimi_k2", lambda s: deepseek(s, {"model_type": "kimi_k2", "routed_scaling_factor": 2.827, "n_group": 1, "topk_group": 1}), ("fp8",)),
        ("dots1", lambda s: deepseek(s, {"model_type": "dots1"}, drop=("n_group", "topk_group", "first_k_dense_replace")), ("fp8",)),
        ("deepseek_v2 greedy", lambda s: deepseek_v2(s, {}), ("fp8",)),
        ("deepseek_v2 group_limited_greedy", lambda s: deepseek_v2(s, {"topk_method": "group_limited_greedy", "n_group": 4, "topk_group": 1,
                                                                        "routed_scaling_factor": 16.0}, router_scale=0.03), ("fp8",)),
        ("gpt_oss", gpt_oss, ("fp8",)),
        ("gpt_oss MXFP4 file", lambda s: gpt_oss(s, mxfp4=True), ()),
        ("llama4_text", llama4, ("fp8",)),
        ("llama4", lambda s: llama4(s, wrapper=True), ()),
    ]


def digest(path):
    a = np.load(path)
    return hashlib.sha256(np.ascontiguousarray(a, dtype=np.float32).tobytes()).hexdigest()


def main():
    moe8 = sys.argv[1] if len(sys.argv) > 1 else "moe8"
    args = sys.argv[2:]
    record = "--record" in args
    opt = lambda name, default: args[args.index(name) + 1] if name in args else default
    golden = opt("--golden", GOLDEN)
    env = dict(os.environ, MOE8_ISA=opt("--isa", "ref"), MOE8_ORDER="canonical")
    got = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, build, rules) in enumerate(cases()):
            s = Seq(1000003 * (i + 1))
            cfg, t, D = build(s)
            d = os.path.join(tmp, "m%d" % i)
            os.makedirs(d)
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump(cfg, f)
            R.write_safetensors(os.path.join(d, "model.safetensors"), t)
            xp = os.path.join(d, "x.npy")
            R.write_npy(xp, s(37, D, scale=2.0))
            for rule in ("",) + tuple(rules):
                extra = []
                if rule:
                    rp = os.path.join(tmp, "rules_%s.json" % rule)
                    with open(rp, "w") as f:
                        json.dump({"rules": [dict({"module_path": ".*"}, **RULES[rule])]}, f)
                    extra = ["--rules", rp]
                yp = os.path.join(d, "y%s.npy" % rule)
                p = subprocess.run([moe8, "run", "--model", d, "--input", xp, "--output", yp] + extra, capture_output=True, text=True, env=env)
                key = name + (" " + rule if rule else "")
                if p.returncode != 0:
                    got[key] = "failed: " + p.stderr.strip()[-200:]
                    continue
                y = np.load(yp)
                # a case whose output is not finite or all zero would pin nothing
                got[key] = digest(yp) if np.isfinite(y).all() and np.abs(y).max() > 0 else "not finite or zero"
    if record:
        with open(golden, "w") as f:
            json.dump(got, f, indent=1, sort_keys=True)
            f.write("\n")
        print("recorded %d digests in %s" % (len(got), golden))
        return 0
    with open(golden) as f:
        want = json.load(f)
    fails = 0
    if len(set(got.values())) != len(got):
        print("FAIL: two cases give the same bytes (a case that pins nothing)")
        fails += 1
    for key in sorted(set(want) | set(got)):
        ok = key in want and key in got and want[key] == got[key] and not want[key].startswith("failed")
        print("%-48s %s" % (key, "the recorded bytes" if ok else "FAIL: %s, recorded %s" % (got.get(key, "not run"), want.get(key, "none"))))
        fails += not ok
    if fails:
        print("%d of %d cases differ from the bytes recorded before the move" % (fails, len(want)))
        return 1
    print("all %d cases give the bytes recorded before the move" % len(want))
    return 0


if __name__ == "__main__":
    sys.exit(main())
