"""Each supported family's MoE block, run by `moe8 run` on a small random
checkpoint written in the family's own tensor names and config keys, against
a float64 implementation of the Hugging Face block (hfref.py).

Usage: test_families.py MOE8_BINARY
f32 checkpoints: relative error <= 1e-5.  FP8 (DeepSeek's F8_E4M3 blocks, or
an f32 checkpoint run with FP8 rules): the same reference with moe8's
quantizers emulated (per-token 1x128 activations, per-column 128-blocks of
weights), relative error <= 1e-4 (f32 against f64 summation only)."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hfref as R  # noqa: E402

MOE8 = sys.argv[1] if len(sys.argv) > 1 else "moe8"
FAILS = []


def rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def run(dirpath, x, extra=()):
    xp, yp = os.path.join(dirpath, "x.npy"), os.path.join(dirpath, "y.npy")
    R.write_npy(xp, x)
    p = subprocess.run([MOE8, "run", "--model", dirpath, "--input", xp, "--output", yp, *extra], capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError("moe8 run failed (%d): %s" % (p.returncode, p.stderr.strip()))
    return np.load(yp).astype(np.float64), p.stdout


def run_rc(dirpath, x, extra=()):
    """moe8 run's exit code and its messages (for the refusals)."""
    xp, yp = os.path.join(dirpath, "x.npy"), os.path.join(dirpath, "y.npy")
    R.write_npy(xp, x)
    p = subprocess.run([MOE8, "run", "--model", dirpath, "--input", xp, "--output", yp, *extra], capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def check(name, got, ref, tol):
    e = rel(got, ref)
    ok = e <= tol
    print("%-58s rel err %.2e (tol %.0e) %s" % (name, e, tol, "ok" if ok else "FAIL"))
    if not ok:
        FAILS.append(name)


def rnd(rng, *shape, scale=1.0):
    return rng.standard_normal(shape) * scale


def make_experts(rng, E, D, F):
    return [(rnd(rng, F, D, scale=D ** -0.5), rnd(rng, F, D, scale=D ** -0.5), rnd(rng, D, F, scale=F ** -0.5)) for _ in range(E)]


def store(arr, dt):
    """The values a file of dtype dt holds for arr (what the reference must use)."""
    return R.bf16_values(arr) if dt == "BF16" else np.asarray(arr, dtype=np.float32).astype(np.float64)


def write_model(d, config, tensors):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f)
    R.write_safetensors(os.path.join(d, "model.safetensors"), tensors)


def per_expert(tensors, prefix, experts, names, dt):
    out = []
    for e, (wg, wu, wd) in enumerate(experts):
        vals = []
        for nm, w in zip(names, (wg, wu, wd)):
            tensors["%sexperts.%d.%s.weight" % (prefix, e, nm)] = (dt, w.astype(np.float32))
            vals.append(store(w, dt))
        out.append(tuple(vals))
    return out


RULES_FP8 = {"rules": [{"module_path": ".*", "weight_qtype": "float8_e4m3fn", "act_qtype": "float8_e4m3fn", "tile_size": 128}]}


def fp8_emulated(experts, shared):
    """The weights as moe8's FP8 rule quantizes them (per column, 128-blocks along K)."""
    q = lambda w: R.quant_cols(w.T, 128).T  # HF [out, in] -> [in, out] = [K, N] per column
    ex = [tuple(q(w) for w in e) for e in experts]
    sh = tuple(q(w) for w in shared) if shared is not None else None
    return ex, sh


def fam_qwen(tmp, rng, qtype, keys, dt="F32", T=24):
    E, k, D, F, Fs = 16, 4, 256, 192, 320
    cfg = {"model_type": qtype, "num_experts": E, "num_experts_per_tok": k, "hidden_size": D, "moe_intermediate_size": F,
           "num_hidden_layers": 1}
    cfg.update(keys)
    p = "model.layers.0.mlp."
    t = {}
    wr = rnd(rng, E, D, scale=0.5)
    t[p + "gate.weight"] = (dt, wr.astype(np.float32))
    experts = per_expert(t, p, make_experts(rng, E, D, F), ("gate_proj", "up_proj", "down_proj"), dt)
    shared = sgate = None
    if qtype == "qwen2_moe":
        Fs = cfg.get("shared_expert_intermediate_size", 5632)
        sw = make_experts(rng, 1, D, Fs)[0]
        shared = []
        for nm, w in zip(("gate_proj", "up_proj", "down_proj"), sw):
            t[p + "shared_expert.%s.weight" % nm] = (dt, w.astype(np.float32))
            shared.append(store(w, dt))
        g = rnd(rng, 1, D, scale=D ** -0.5)
        t[p + "shared_expert_gate.weight"] = (dt, g.astype(np.float32))
        sgate = store(g, dt)
    d = os.path.join(tmp, "%s_%d" % (qtype, len(os.listdir(tmp))))
    write_model(d, cfg, t)
    x = rnd(rng, T, D).astype(np.float32).astype(np.float64)
    norm = cfg.get("norm_topk_prob", False)
    routing = R.route_softmax(x, store(wr, dt), k, norm)
    return d, x, routing, experts, shared, sgate


def test_qwen(tmp, rng):
    for qtype, keys, label in [("qwen2_moe", {"shared_expert_intermediate_size": 320, "norm_topk_prob": False, "hidden_act": "silu",
                                              "decoder_sparse_step": 1, "mlp_only_layers": []}, "all keys"),
                               ("qwen2_moe", {"shared_expert_intermediate_size": 320}, "optional keys absent"),
                               ("qwen3_moe", {"norm_topk_prob": True}, "norm_topk_prob true"),
                               ("qwen3_moe", {}, "optional keys absent (norm_topk_prob false)")]:
        d, x, routing, ex, sh, sg = fam_qwen(tmp, rng, qtype, keys)
        got, _ = run(d, x)
        check("%s f32, %s" % (qtype, label), got, R.moe_block(x, routing, ex, sh, sg), 1e-5)
    # bf16 checkpoint
    d, x, routing, ex, sh, sg = fam_qwen(tmp, rng, "qwen2_moe", {"shared_expert_intermediate_size": 320}, dt="BF16")
    got, _ = run(d, x)
    check("qwen2_moe bf16 checkpoint", got, R.moe_block(x, routing, ex, sh, sg), 1e-5)
    # FP8 by rules, quantizers emulated
    rp = os.path.join(tmp, "fp8_rules.json")
    with open(rp, "w") as f:
        json.dump(RULES_FP8, f)
    for qtype, keys in [("qwen2_moe", {"shared_expert_intermediate_size": 320}), ("qwen3_moe", {})]:
        d, x, routing, ex, sh, sg = fam_qwen(tmp, rng, qtype, keys)
        got, _ = run(d, x, ("--rules", rp))
        qex, qsh = fp8_emulated(ex, sh)
        check("%s FP8 rules (quantizers emulated)" % qtype, got,
              R.moe_block(x, routing, qex, qsh, sg, act_q=lambda v: R.quant_rows(v, 128)), 1e-4)
        # moe8's own format (packed codes, mapped in place): the same bytes
        q = d + "_moe8"
        r = subprocess.run([MOE8, "quantize", d, q, "--rules", rp], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError("moe8 quantize failed: " + r.stderr)
        got2, out2 = run(q, x)
        same = np.array_equal(got, got2) and "packed" in out2
        print("%-58s %s" % ("%s moe8 packed format == f32 file + FP8 rules" % qtype, "ok" if same else "FAIL: " + out2))
        if not same:
            FAILS.append("%s moe8 format" % qtype)
        got3, _ = run(q, x, ("--training-load",))
        if not np.array_equal(got2, got3):
            FAILS.append("%s training load" % qtype)
            print("%s: --training-load differs from the inference load" % qtype)


def test_olmoe(tmp, rng):
    """OLMoE: softmax over all experts, top-k, renormalized only when
    norm_topk_prob (default false); the experts' width is intermediate_size;
    transformers 5 writes num_experts as num_local_experts."""
    E, k, D, F, T = 16, 4, 256, 192, 24
    for keys, label in [({"num_experts": E}, "optional keys absent"), ({"num_local_experts": E, "norm_topk_prob": True}, "alias, norm_topk_prob")]:
        cfg = {"model_type": "olmoe", "num_experts_per_tok": k, "hidden_size": D, "intermediate_size": F, "num_hidden_layers": 1}
        cfg.update(keys)
        p = "model.layers.0.mlp."
        t = {}
        wr = rnd(rng, E, D, scale=0.5)
        t[p + "gate.weight"] = ("F32", wr.astype(np.float32))
        experts = per_expert(t, p, make_experts(rng, E, D, F), ("gate_proj", "up_proj", "down_proj"), "F32")
        d = os.path.join(tmp, "olmoe_%d" % len(os.listdir(tmp)))
        write_model(d, cfg, t)
        x = rnd(rng, T, D).astype(np.float32).astype(np.float64)
        routing = R.route_softmax(x, store(wr, "F32"), k, cfg.get("norm_topk_prob", False))
        got, _ = run(d, x)
        check("olmoe f32, %s" % label, got, R.moe_block(x, routing, experts), 1e-5)


def test_mixtral(tmp, rng):
    E, k, D, F, T = 8, 2, 256, 160, 20
    for variant in ("block_sparse_moe", "fused 3-D"):
        cfg = {"model_type": "mixtral", "num_local_experts": E, "num_experts_per_tok": k, "hidden_size": D, "intermediate_size": F,
               "num_hidden_layers": 1}
        t = {}
        wr = rnd(rng, E, D, scale=0.5)
        ex = make_experts(rng, E, D, F)
        if variant == "block_sparse_moe":
            p = "model.layers.0.block_sparse_moe."
            t[p + "gate.weight"] = ("F32", wr)
            experts = per_expert(t, p, ex, ("w1", "w3", "w2"), "F32")
        else:
            p = "model.layers.0.mlp."
            t[p + "gate.weight"] = ("F32", wr)
            t[p + "experts.gate_up_proj"] = ("F32", np.stack([np.concatenate([g, u], axis=0) for g, u, _ in ex]))
            t[p + "experts.down_proj"] = ("F32", np.stack([dn for _, _, dn in ex]))
            experts = [tuple(store(w, "F32") for w in e) for e in ex]
        d = os.path.join(tmp, "mixtral_%d" % len(os.listdir(tmp)))
        write_model(d, cfg, t)
        x = rnd(rng, T, D).astype(np.float32).astype(np.float64)
        routing = R.route_softmax(x, store(wr, "F32"), k, True)
        got, _ = run(d, x)
        check("mixtral f32, %s" % variant, got, R.moe_block(x, routing, experts), 1e-5)


def fp8_blocks(t, name, w, scale_dt="F32"):
    """w [N, K] as DeepSeek's FP8 file holds it (name.weight F8_E4M3 with
    128x128 name.weight_scale_inv); the values a reader gets back."""
    N, K = w.shape
    q = np.zeros((N, K))
    s = np.zeros(((N + 127) // 128, (K + 127) // 128), dtype=np.float32)
    for i in range(s.shape[0]):
        for j in range(s.shape[1]):
            blk = np.asarray(w[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128], dtype=np.float32)
            s[i, j] = R.scale_from_absmax(np.max(np.abs(blk)))
            q[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128] = R.e4m3_round((blk / s[i, j]).astype(np.float32))
    t[name + ".weight"] = ("F8_E4M3", R.e4m3_encode(q))
    sv = store(s, scale_dt)
    t[name + ".weight_scale_inv"] = (scale_dt, s)
    return q * np.repeat(np.repeat(sv, 128, axis=0), 128, axis=1)[:N, :K]


def ds_config(E, k, D, F, keys, drop=()):
    cfg = {"model_type": "deepseek_v3", "n_routed_experts": E, "num_experts_per_tok": k, "hidden_size": D, "moe_intermediate_size": F,
           "num_hidden_layers": 2, "first_k_dense_replace": 1, "n_group": 4, "topk_group": 2, "n_shared_experts": 2}
    cfg.update(keys)
    for key in drop:
        del cfg[key]
    return cfg


def deepseek_case(tmp, rng, keys, fp8=False, scale_dt="F32", T=32, scale_default=2.5, drop=(), norm_default=True, groups_default=(1, 1)):
    E, k, D, F = 32, 4, 256, 192
    cfg = ds_config(E, k, D, F, keys, drop)
    L = 1 if cfg.get("first_k_dense_replace", 0) >= 1 else 0  # layer 0 dense with first_k_dense_replace = 1
    p = "model.layers.%d.mlp." % L
    t = {"model.layers.0.mlp.gate_proj.weight": ("F32", np.zeros((8, D))), }
    wr = rnd(rng, E, D, scale=0.5)
    bias = rnd(rng, E, scale=0.2) - 1.5  # realistic: DeepSeek-V3/R1's correction biases are not small, score + bias < 0
    t[p + "gate.weight"] = ("F32", wr)
    t[p + "gate.e_score_correction_bias"] = ("F32", bias)
    Fs = F * cfg.get("n_shared_experts", 1)
    raw = make_experts(rng, E, D, F)
    rawsh = make_experts(rng, 1, D, Fs)[0]

    def put(name, w):
        if not fp8:
            t[name + ".weight"] = ("F32", w)
            return store(w, "F32")
        return fp8_blocks(t, name, w, scale_dt)

    experts = [tuple(put("%sexperts.%d.%s" % (p, e, nm), w) for nm, w in zip(("gate_proj", "up_proj", "down_proj"), ex))
               for e, ex in enumerate(raw)]
    shared = tuple(put("%sshared_experts.%s" % (p, nm), w) for nm, w in zip(("gate_proj", "up_proj", "down_proj"), rawsh))
    if fp8:
        cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}
    d = os.path.join(tmp, "deepseek_%d" % len(os.listdir(tmp)))
    write_model(d, cfg, t)
    x = rnd(rng, T, D).astype(np.float32).astype(np.float64)
    scale = cfg.get("routed_scaling_factor", scale_default)
    routing = R.route_deepseek(x, wr.astype(np.float32).astype(np.float64), bias.astype(np.float32).astype(np.float64), k,
                               cfg.get("n_group", groups_default[0]), cfg.get("topk_group", groups_default[1]),
                               cfg.get("norm_topk_prob", norm_default), scale)
    return d, x, routing, experts, shared


def test_deepseek(tmp, rng):
    d, x, routing, ex, sh = deepseek_case(tmp, rng, {"routed_scaling_factor": 2.5, "norm_topk_prob": True, "scoring_func": "sigmoid",
                                                     "topk_method": "noaux_tc"})
    got, _ = run(d, x)
    check("deepseek_v3 f32, all keys", got, R.moe_block(x, routing, ex, sh), 1e-5)
    d, x, routing, ex, sh = deepseek_case(tmp, rng, {})
    got, _ = run(d, x)
    check("deepseek_v3 f32, optional keys absent (scaling 2.5)", got, R.moe_block(x, routing, ex, sh), 1e-5)
    # the group-limited routing matters here: plain top-k differs for most tokens
    plain = R.route_deepseek(x, *_router_of(d), 4, 1, 1, True, 2.5)
    differ = sum(set(a) != set(b) for a, b in zip(plain[0], routing[0]))
    print("deepseek_v3 routing: %d of %d tokens pick other experts without group limits" % (differ, len(x)))
    if differ < len(x) // 2:
        FAILS.append("group routing does not matter in this case")
    # GLM-4.5 (glm4_moe): DeepSeek-V3's block with Glm4MoeConfig's defaults
    # (routed_scaling_factor 1.0 when absent); group-limited here, with the
    # realistic negative biases of deepseek_case
    d, x, routing, ex, sh = deepseek_case(tmp, rng, {"model_type": "glm4_moe"}, scale_default=1.0)
    got, _ = run(d, x)
    check("glm4_moe f32 (scaling absent: 1.0, groups 4/2)", got, R.moe_block(x, routing, ex, sh), 1e-5)
    # Kimi-K2: the DeepSeek-V3 architecture under its own model_type
    d, x, routing, ex, sh = deepseek_case(tmp, rng, {"model_type": "kimi_k2", "routed_scaling_factor": 2.827, "n_group": 1, "topk_group": 1})
    got, _ = run(d, x)
    check("kimi_k2 f32 (DeepSeek-V3 architecture, no group limit)", got, R.moe_block(x, routing, ex, sh), 1e-5)
    for scale_dt in ("F32", "BF16"):
        d, x, routing, ex, sh = deepseek_case(tmp, rng, {}, fp8=True, scale_dt=scale_dt)
        got, _ = run(d, x)
        check("deepseek_v3 FP8 128x128 blocks, %s scale_inv" % scale_dt, got,
              R.moe_block(x, routing, ex, sh, act_q=lambda v: R.quant_rows(v, 128)), 1e-4)
        got2, _ = run(d, x, ("--training-load",))
        if not np.array_equal(got, got2):
            FAILS.append("deepseek fp8 training load")
            print("deepseek_v3 FP8: --training-load differs from the inference load")


def info(d):
    p = subprocess.run([MOE8, "info", d], capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def test_dots1(tmp, rng):
    """dots.llm1 (model_type dots1): DeepSeek-V3's block under Dots1Config's
    defaults (no renormalization, scaling 1.0, one group, no dense first
    layer), and with the keys its released configs write."""
    drop = ("n_group", "topk_group", "first_k_dense_replace")
    d, x, routing, ex, sh = deepseek_case(tmp, rng, {"model_type": "dots1"}, scale_default=1.0, drop=drop, norm_default=False)
    got, _ = run(d, x)
    check("dots1 f32, optional keys absent (no renorm, scaling 1)", got, R.moe_block(x, routing, ex, sh), 1e-5)
    rc, out = info(d)
    if rc != 0 or "dots1" not in out or "sigmoid" not in out:
        FAILS.append("dots1 info")
        print("dots1 info (%d): %s" % (rc, out))
    # the correction bias decides: the sigmoid scores' own top-k differs
    wr, bias = _router_of(d)
    plain = R.route_deepseek(x, wr, 0.0 * bias, 4, 1, 1, False, 1.0)
    differ = sum(set(a) != set(b) for a, b in zip(plain[0], routing[0]))
    print("dots1 routing: %d of %d tokens pick other experts without the correction bias" % (differ, len(x)))
    if differ < len(x) // 2:
        FAILS.append("dots1: the correction bias does not matter in this case")
    d, x, routing, ex, sh = deepseek_case(tmp, rng, {"model_type": "dots1", "norm_topk_prob": True, "routed_scaling_factor": 2.5,
                                                     "scoring_func": "noaux_tc", "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1})
    got, _ = run(d, x)
    check("dots1 f32, released keys (renorm, scaling 2.5)", got, R.moe_block(x, routing, ex, sh), 1e-5)
    for key in ("n_routed_experts", "num_experts_per_tok", "n_shared_experts"):
        cfg = json.load(open(os.path.join(d, "config.json")))
        del cfg[key]
        d2 = d + "_no_" + key
        os.makedirs(d2, exist_ok=True)
        json.dump(cfg, open(os.path.join(d2, "config.json"), "w"))
        rc, out = info(d2)
        if rc == 0 or key not in out:
            FAILS.append("dots1 without " + key)
            print("dots1 without %s (%d): %s" % (key, rc, out))


def test_minimax(tmp, rng):
    """MiniMax-Text-01 (minimax): Mixtral's block, num_experts the alias.
    MiniMax-M2 (minimax_m2): Mixtral's block routed by sigmoid scores, the
    choice by score + the block's e_score_correction_bias, the chosen
    scores renormalized; both the original (block_sparse_moe, w1/w3/w2)
    and transformers 5's (mlp, fused 3-D) names."""
    E, D, F, T = 16, 256, 160, 24
    for fam in ("minimax", "minimax_m2"):
        for variant in ("block_sparse_moe", "fused 3-D"):
            cfg = {"model_type": fam, "num_experts": E, "hidden_size": D, "intermediate_size": F, "num_hidden_layers": 1}
            if fam == "minimax":
                cfg["num_experts_per_tok"] = 3
            k = 3 if fam == "minimax" else 8  # MiniMaxM2Config's default top-k: 8
            t = {}
            wr = rnd(rng, E, D, scale=0.5)
            bias = rnd(rng, E, scale=1.0) - 1.0
            ex = make_experts(rng, E, D, F)
            p = "model.layers.0.block_sparse_moe." if variant == "block_sparse_moe" else "model.layers.0.mlp."
            t[p + "gate.weight"] = ("F32", wr)
            if fam == "minimax_m2":
                t[p + "e_score_correction_bias"] = ("F32", bias)
                cfg["scoring_func"] = "sigmoid"
            if variant == "block_sparse_moe":
                experts = per_expert(t, p, ex, ("w1", "w3", "w2"), "F32")
            else:
                t[p + "experts.gate_up_proj"] = ("F32", np.stack([np.concatenate([g, u], axis=0) for g, u, _ in ex]))
                t[p + "experts.down_proj"] = ("F32", np.stack([dn for _, _, dn in ex]))
                experts = [tuple(store(w, "F32") for w in e) for e in ex]
            d = os.path.join(tmp, "%s_%d" % (fam, len(os.listdir(tmp))))
            write_model(d, cfg, t)
            x = rnd(rng, T, D).astype(np.float32).astype(np.float64)
            w32 = store(wr, "F32")
            if fam == "minimax":
                routing = R.route_softmax(x, w32, k, True)
            else:
                routing = R.route_deepseek(x, w32, store(bias, "F32"), k, 1, 1, True, 1.0)
                plain = R.route_deepseek(x, w32, 0.0 * bias, k, 1, 1, True, 1.0)
                differ = sum(set(a) != set(b) for a, b in zip(plain[0], routing[0]))
                print("minimax_m2 routing: %d of %d tokens pick other experts without the correction bias" % (differ, len(x)))
                if differ < len(x) // 2:
                    FAILS.append("minimax_m2: the correction bias does not matter in this case")
            got, _ = run(d, x)
            check("%s f32, %s" % (fam, variant), got, R.moe_block(x, routing, experts), 1e-5)
            if fam == "minimax_m2" and variant == "block_sparse_moe":
                # the released FP8 checkpoint's form: w1/w3/w2 F8_E4M3 with 128x128 weight_scale_inv,
                # quantization_config fmt "float8_e4m3fn", the router and the bias F32
                t8 = {k: v for k, v in t.items() if ".experts." not in k}
                ex8 = [tuple(fp8_blocks(t8, "%sexperts.%d.%s" % (p, e, nm), w) for nm, w in zip(("w1", "w3", "w2"), xe))
                       for e, xe in enumerate(ex)]
                cfg8 = dict(cfg, quantization_config={"activation_scheme": "dynamic", "fmt": "float8_e4m3fn", "quant_method": "fp8",
                                                      "weight_block_size": [128, 128],
                                                      "modules_to_not_convert": ["gate", "e_score_correction_bias", "lm_head"]})
                d8 = d + "_fp8"
                write_model(d8, cfg8, t8)
                got8, _ = run(d8, x)
                check("minimax_m2 FP8 as released (fmt float8_e4m3fn, emulated)", got8,
                      R.moe_block(x, routing, ex8, act_q=lambda v: R.quant_rows(v, 128)), 1e-4)
            rc, out = info(d)
            if rc != 0 or fam not in out or (fam == "minimax_m2" and "sigmoid" not in out):
                FAILS.append(fam + " info")
                print("%s info (%d): %s" % (fam, rc, out))


def deepseek_v2_case(tmp, rng, keys, T=48, router_scale=0.5):
    """A DeepSeek-V2 block: softmax routing, shared experts (ungated)."""
    E, k, D, F = 32, 4, 256, 160
    cfg = {"model_type": "deepseek_v2", "n_routed_experts": E, "num_experts_per_tok": k, "hidden_size": D, "moe_intermediate_size": F,
           "num_hidden_layers": 1, "n_shared_experts": 2}
    cfg.update(keys)
    p = "model.layers.0.mlp."
    t = {}
    wr = rnd(rng, E, D, scale=router_scale)
    t[p + "gate.weight"] = ("F32", wr.astype(np.float32))
    experts = per_expert(t, p, make_experts(rng, E, D, F), ("gate_proj", "up_proj", "down_proj"), "F32")
    nsh = cfg.get("n_shared_experts", 2) or 0
    shared = None
    if nsh:
        shared = []
        for nm, w in zip(("gate_proj", "up_proj", "down_proj"), make_experts(rng, 1, D, F * nsh)[0]):
            t[p + "shared_experts.%s.weight" % nm] = ("F32", w.astype(np.float32))
            shared.append(store(w, "F32"))
    d = os.path.join(tmp, "deepseek_v2_%d" % len(os.listdir(tmp)))
    write_model(d, cfg, t)
    x = rnd(rng, T, D).astype(np.float32).astype(np.float64)
    grouped = cfg.get("topk_method") == "group_limited_greedy"
    routing = R.route_deepseek_v2(x, store(wr, "F32"), k, cfg.get("n_group", 1), cfg.get("topk_group", 1),
                                  cfg.get("routed_scaling_factor", 1.0), grouped)
    return d, x, routing, experts, shared, store(wr, "F32")


def test_deepseek_v2(tmp, rng):
    d, x, routing, ex, sh, _ = deepseek_v2_case(tmp, rng, {})
    got, _ = run(d, x)
    check("deepseek_v2 f32, greedy (optional keys absent)", got, R.moe_block(x, routing, ex, sh), 1e-5)
    # small router weights: scores close together, so a group's best score
    # and its top-2 sum (DeepSeek-V3's group score) keep different groups
    d, x, routing, ex, sh, wr = deepseek_v2_case(tmp, rng, {"topk_method": "group_limited_greedy", "n_group": 4, "topk_group": 1,
                                                            "routed_scaling_factor": 16.0, "norm_topk_prob": False, "scoring_func": "softmax"},
                                                 router_scale=0.03)
    got, out = run(d, x)
    check("deepseek_v2 f32, group_limited_greedy 4/1, scaling 16", got, R.moe_block(x, routing, ex, sh), 1e-5)
    greedy = R.route_deepseek_v2(x, wr, 4, 4, 1, 16.0, False)
    differ = sum(set(a) != set(b) for a, b in zip(greedy[0], routing[0]))
    s = R.softmax(x @ wr.T)
    top2 = np.sort(s.reshape(len(x), 4, 8), axis=2)[:, :, -2:].sum(axis=2).argmax(axis=1)
    other = int((top2 != s.reshape(len(x), 4, 8).max(axis=2).argmax(axis=1)).sum())
    print("deepseek_v2 routing: %d of %d tokens pick other experts without group limits, %d keep another group by the top-2 sum"
          % (differ, len(x), other))
    if differ < len(x) // 2 or other < len(x) // 8:
        FAILS.append("deepseek_v2 group routing does not matter in this case")
    d, x, routing, ex, sh, _ = deepseek_v2_case(tmp, rng, {"n_shared_experts": None, "routed_scaling_factor": 1.5})
    got, _ = run(d, x)
    check("deepseek_v2 f32, no shared experts (null), scaling 1.5", got, R.moe_block(x, routing, ex, sh), 1e-5)
    d, x, routing, ex, sh, _ = deepseek_v2_case(tmp, rng, {"topk_method": "group_limited_greedy", "n_group": 4, "topk_group": 1})
    got, _ = run(d, x, ("--rules", _rules_file(tmp)))
    exq, shq = fp8_emulated(ex, sh)
    check("deepseek_v2 FP8 by rules (quantizers emulated)", got, R.moe_block(x, routing, exq, shq, act_q=lambda v: R.quant_rows(v, 128)),
          1e-4)


def test_qwen3_next(tmp, rng):
    """Qwen3-Next's block is Qwen2-MoE's (softmax top-k, sigmoid-gated shared
    expert) with Qwen3NextConfig's defaults: renormalized top-k."""
    d, x, routing, ex, sh, sg = fam_qwen(tmp, rng, "qwen2_moe", {"shared_expert_intermediate_size": 256})
    cfgp = os.path.join(d, "config.json")
    cfg = json.load(open(cfgp))
    cfg["model_type"] = "qwen3_next"
    cfg.pop("norm_topk_prob", None)
    cfg["num_local_experts"] = cfg.pop("num_experts")  # as transformers 5 writes it
    json.dump(cfg, open(cfgp, "w"))
    ids, _ = routing
    wr = _read(d, "model.layers.0.mlp.gate.weight")
    routing = R.route_softmax(x, wr, ids.shape[1], True)
    got, out = run(d, x)
    check("qwen3_next f32 (norm_topk_prob absent: true, alias)", got, R.moe_block(x, routing, ex, sh, sg), 1e-5)


def gpt_oss_case(tmp, rng, keys, mxfp4=False, dt="F32", T=40):
    """A GPT-OSS block in transformers' names: router weight and bias,
    gate_up_proj [E, D, 2F] (gate and up in alternate columns) with its
    bias, down_proj [E, F, D] with its bias; the weights as floats or MXFP4
    blocks and scales."""
    E, k, D, F = 16, 4, 128, 96
    cfg = {"model_type": "gpt_oss", "num_local_experts": E, "num_experts_per_tok": k, "hidden_size": D, "intermediate_size": F,
           "num_hidden_layers": 1}
    cfg.update(keys)
    p = "model.layers.0.mlp."
    t = {}
    wr = rnd(rng, E, D, scale=D ** -0.5)
    br = rnd(rng, E, scale=0.5)
    gub = rnd(rng, E, 2 * F, scale=0.5)
    dnb = rnd(rng, E, D, scale=0.2)
    for name, arr in (("router.weight", wr), ("router.bias", br), ("experts.gate_up_proj_bias", gub), ("experts.down_proj_bias", dnb)):
        t[p + name] = (dt, arr.astype(np.float32))
    if mxfp4:
        cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": ["router"]}
        ws = []
        for name, N, K in (("gate_up_proj", 2 * F, D), ("down_proj", D, F)):
            blocks = rng.integers(0, 256, size=(E, N, K // 32, 16), dtype=np.uint8)
            scales = rng.integers(122, 128, size=(E, N, K // 32), dtype=np.uint8)  # values up to 6 * 2^0
            t[p + "experts.%s_blocks" % name] = ("U8", blocks)
            t[p + "experts.%s_scales" % name] = ("U8", scales)
            ws.append(np.transpose(R.mxfp4_decode(blocks, scales), (0, 2, 1)))  # [E, K, N]
        gu, dn = ws
    else:
        gu = rnd(rng, E, D, 2 * F, scale=D ** -0.5 * 3)
        dn = rnd(rng, E, F, D, scale=F ** -0.5)
        t[p + "experts.gate_up_proj"] = (dt, gu.astype(np.float32))
        t[p + "experts.down_proj"] = (dt, dn.astype(np.float32))
        gu, dn = store(gu, dt), store(dn, dt)
    d = os.path.join(tmp, "gpt_oss_%d" % len(os.listdir(tmp)))
    write_model(d, cfg, t)
    x = rnd(rng, T, D).astype(np.float32).astype(np.float64)
    ref = R.gpt_oss_block(x, store(wr, dt), store(br, dt), gu, store(gub, dt), dn, store(dnb, dt), k, alpha=cfg.get("swiglu_alpha", 1.702),
                          limit=cfg.get("swiglu_limit", 7.0))
    return d, x, ref, (store(wr, dt), store(br, dt), gu, store(gub, dt), dn, store(dnb, dt))


def test_gpt_oss_alpha(tmp):
    """GptOssConfig's swiglu_alpha (default 1.702) is the sigmoid's gain in
    the clamped SwiGLU: a file with 1.0 runs with 1.0 (the 1.702 answer is
    far from it), one without the key with 1.702; moe8 info prints the
    value read; a non-positive, non-finite or non-number alpha is refused
    naming the key and the file."""
    rng = np.random.default_rng(1702)  # its own stream: the other tests' draws stay as they were
    d, x, ref, w = gpt_oss_case(tmp, rng, {"swiglu_alpha": 1.0})
    got, _ = run(d, x)
    check("gpt_oss swiglu_alpha 1.0", got, ref, 1e-5)
    other = R.gpt_oss_block(x, *w, 4, alpha=1.702, limit=7.0)
    if rel(other, ref) < 1e-2:
        FAILS.append("gpt_oss swiglu_alpha: 1.0 and 1.702 give outputs too close to tell apart")
    rc, out = info(d)
    if rc != 0 or "alpha 1," not in out:
        FAILS.append("gpt_oss swiglu_alpha 1.0: moe8 info does not print alpha 1: " + out.strip()[-300:])
    d, x, ref, _ = gpt_oss_case(tmp, rng, {})
    got, _ = run(d, x)
    check("gpt_oss swiglu_alpha absent (1.702)", got, ref, 1e-5)
    rc, out = info(d)
    if rc != 0 or "alpha 1.702," not in out:
        FAILS.append("gpt_oss swiglu_alpha absent: moe8 info does not print alpha 1.702: " + out.strip()[-300:])
    cfgp = os.path.join(d, "config.json")
    with open(cfgp) as f:
        base = json.load(f)
    for bad in ("0", "-1.0", "1e999", "\"1.0\"", "true"):
        with open(cfgp, "w") as f:
            f.write(json.dumps(base)[:-1] + ", \"swiglu_alpha\": " + bad + "}")
        rc, out = info(d)
        ok = rc != 0 and "swiglu_alpha" in out and "config.json" in out
        print("gpt_oss swiglu_alpha %-6s refused naming the key and file: %s" % (bad, "ok" if ok else "FAIL " + out.strip()[-200:]))
        if not ok:
            FAILS.append("gpt_oss swiglu_alpha " + bad + " not refused")


def test_gpt_oss(tmp, rng):
    d, x, ref, _ = gpt_oss_case(tmp, rng, {"swiglu_limit": 7.0, "hidden_act": "silu"})
    got, out = run(d, x)
    check("gpt_oss f32 (router bias, expert biases, clamped SwiGLU)", got, ref, 1e-5)
    d, x, ref, w = gpt_oss_case(tmp, rng, {"swiglu_limit": 1.5})
    got, _ = run(d, x)
    check("gpt_oss f32, swiglu_limit 1.5 (the clamp binds)", got, ref, 1e-5)
    h = x @ w[2][0] + w[3][0]
    clamped = float(np.mean(np.abs(h) > 1.5))
    print("gpt_oss: %.0f%% of expert 0's pre-activations are past the limit 1.5" % (100 * clamped))
    if clamped < 0.1:
        FAILS.append("gpt_oss clamp does not bind")
    d, x, ref, _ = gpt_oss_case(tmp, rng, {}, dt="BF16")
    got, _ = run(d, x)
    check("gpt_oss bf16 checkpoint, optional keys absent", got, ref, 1e-5)
    d, x, ref, w = gpt_oss_case(tmp, rng, {}, mxfp4=True)
    got, out = run(d, x)
    check("gpt_oss MXFP4 experts (kept as MXFP4, the kernels decode)", got, ref, 1e-5)
    if "weights mxfp4" not in out:
        FAILS.append("gpt_oss MXFP4 inference load is not MXFP4: " + out.strip())
    got_t, _ = run(d, x, ("--training-load",))
    check("gpt_oss MXFP4 experts, training load (decoded to f32 at load)", got_t, ref, 1e-5)
    mpirun = shutil.which("mpirun")
    if mpirun:
        # (Open MPI's runtime keeps allocations at exit: no leak check on the ranks, as in test_ep)
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1",
                   OMPI_MCA_btl_vader_single_copy_mechanism="none", OMP_NUM_THREADS="1", ASAN_OPTIONS="detect_leaks=0")
        for mode in ("ring", "alltoall"):
            yp = os.path.join(d, "y_ep.npy")
            p = subprocess.run([mpirun, "-n", "2", "--oversubscribe", MOE8, "run", "--model", d, "--input", os.path.join(d, "x.npy"),
                                "--output", yp, "--ep-mode", mode], capture_output=True, text=True, env=env)
            same = p.returncode == 0 and np.load(yp).astype(np.float64).tobytes() == got.tobytes()
            print("gpt_oss MXFP4 under mpirun -n 2 (%s): %s" % (mode, "the single-process bytes" if same else "FAIL " + p.stderr[-300:]))
            if not same:
                FAILS.append("gpt_oss MXFP4 expert parallel " + mode)
    else:
        print("notice: no mpirun: the expert-parallel GPT-OSS check is skipped")
    # FP8 by rules on the decoded weights: quantizers emulated
    wr, br, gu, gub, dn, dnb = w
    q = lambda a: np.stack([R.quant_cols(a[e], 128) for e in range(a.shape[0])])  # [E, K, N], per column, 128-blocks along K
    aq = lambda v: R.quant_rows(v, 128)
    got, _ = run(d, x, ("--rules", _rules_file(tmp)))
    refq = _gpt_oss_quant_ref(x, wr, br, q(gu), gub, q(dn), dnb, 4, aq)
    check("gpt_oss MXFP4 experts run with FP8 rules (quantizers emulated)", got, refq, 1e-4)
    # int8 activations 1 x 32: the MXFP4 experts stay packed (mx4_rows_i8)
    ri = _rule_file(tmp, "i8_act", act_qtype="int8", tile_size=32)
    got, out = run(d, x, ("--rules", ri))
    refq = _gpt_oss_quant_ref(x, wr, br, gu, gub, dn, dnb, 4, lambda v: R.quant_rows_i8(v, 32))
    check("gpt_oss MXFP4 experts, int8 activations 1x32 (emulated)", got, refq, 1e-4)
    if "weights mxfp4" not in out or "activations int8 1x32" not in out:
        FAILS.append("gpt_oss MXFP4 with int8 activations is not the MXFP4 int8 path: " + out.strip())
    rt = _rule_file(tmp, "i8_token", act_qtype="int8")
    got_t, out_t = run(d, x, ("--rules", rt))
    check("gpt_oss MXFP4 experts, int8 activations per token (emulated)", got_t,
          _gpt_oss_quant_ref(x, wr, br, gu, gub, dn, dnb, 4, lambda v: R.quant_rows_i8(v, v.shape[-1])), 1e-4)
    if "activations int8 per-token" not in out_t:
        FAILS.append("gpt_oss MXFP4 with per-token int8 activations: " + out_t.strip())
    if mpirun:
        for mode in ("ring", "alltoall"):
            yp = os.path.join(d, "y_ep_i8.npy")
            p = subprocess.run([mpirun, "-n", "2", "--oversubscribe", MOE8, "run", "--model", d, "--input", os.path.join(d, "x.npy"),
                                "--output", yp, "--ep-mode", mode, "--rules", ri], capture_output=True, text=True, env=env)
            same = p.returncode == 0 and np.load(yp).astype(np.float64).tobytes() == got.tobytes()
            print("gpt_oss MXFP4, int8 activations, mpirun -n 2 (%s): %s" % (mode, "the single-process bytes" if same else "FAIL " + p.stderr[-300:]))
            if not same:
                FAILS.append("gpt_oss MXFP4 int8 expert parallel " + mode)


def test_llama4(tmp, rng):
    for k, label, keys in ((1, "top-1 (the default)", {}), (2, "top-2, every second layer MoE", {"interleave_moe_layer_step": 2})):
        E, D, F = 8, 128, 96
        cfg = {"model_type": "llama4_text", "num_local_experts": E, "hidden_size": D, "intermediate_size": F, "num_hidden_layers": 2,
               "intermediate_size_mlp": 256, "hidden_act": "silu"}
        if k != 1:
            cfg["num_experts_per_tok"] = k
        cfg.update(keys)
        layer = 1 if keys else 0
        p = "model.layers.%d.feed_forward." % layer
        wr = rnd(rng, E, D, scale=D ** -0.5 * 2)
        gu = rnd(rng, E, D, 2 * F, scale=D ** -0.5)
        dn = rnd(rng, E, F, D, scale=F ** -0.5)
        sh = make_experts(rng, 1, D, F)[0]
        t = {p + "router.weight": ("F32", wr), p + "experts.gate_up_proj": ("F32", gu), p + "experts.down_proj": ("F32", dn)}
        for nm, w in zip(("gate_proj", "up_proj", "down_proj"), sh):
            t[p + "shared_expert.%s.weight" % nm] = ("F32", w)
        d = os.path.join(tmp, "llama4_%d" % len(os.listdir(tmp)))
        write_model(d, cfg, t)
        x = rnd(rng, 32, D).astype(np.float32).astype(np.float64)
        f = lambda a: a.astype(np.float32).astype(np.float64)
        ref = R.llama4_block(x, f(wr), f(gu), f(dn), tuple(f(w) for w in sh), k)
        got, out = run(d, x)
        check("llama4_text f32, %s" % label, got, ref, 1e-5)
        if k == 2:
            # FP8 rules: weights per column in 128-blocks, the scaled rows quantized after the scaling
            got, _ = run(d, x, ("--rules", _rules_file(tmp)))
            qc = lambda a: R.quant_cols(a, 128)
            aq = lambda v: R.quant_rows(v, 128)
            logits = x @ f(wr).T
            shq = tuple(qc(f(w).T).T for w in sh)
            refq = R.mlp(x, *shq, aq)
            for tt in range(len(x)):
                for e in R.topk_idx(logits[tt], k):
                    xi = aq((x[tt] / (1.0 + np.exp(-logits[tt, e])))[None, :])
                    h = xi @ qc(f(gu[e]))
                    hh = aq(h[:, :F] / (1.0 + np.exp(-h[:, :F])) * h[:, F:])
                    refq[tt] += (hh @ qc(f(dn[e])))[0]
            check("llama4_text FP8 by rules (quantized after the input scaling, emulated)", got, refq, 1e-4)
            # moe8's own files of it (FP8 packed, and MXFP4): a run without rules = the input's run under the rule
            for rules, name in ((_rules_file(tmp), "FP8"), (_weight_rule(tmp, "mxfp4"), "MXFP4")):
                want, _ = run(d, x, ("--rules", rules))
                q = d + "_q%s" % name
                p = subprocess.run([MOE8, "quantize", d, q, "--rules", rules], capture_output=True, text=True)
                if p.returncode != 0:
                    FAILS.append("llama4 quantize %s: %s" % (name, p.stderr.strip()))
                    continue
                got2, _ = run(q, x)
                same = np.array_equal(got2, want)
                print("llama4_text moe8 %s file: a run without rules %s the input's run under the rules" % (name, "equals" if same else "DIFFERS FROM"))
                if not same:
                    FAILS.append("llama4 %s file run" % name)
                got3, _ = run(q, x, ("--training-load",))
                check("llama4_text moe8 %s file, training load" % name, got3, want, 1e-3 if name == "FP8" else 1e-5)
        if k == 1:
            # Llama-4 as released: the multimodal config (text_config) and its language model's tensor names,
            # as the hub's files (language_model.model.layers.) and transformers 5 (model.language_model.layers.) write them
            for root in ("language_model.model.layers.", "model.language_model.layers."):
                cfgm = {"model_type": "llama4", "text_config": dict(cfg, model_type="llama4_text", num_hidden_layers=1),
                        "vision_config": {"model_type": "llama4_vision_model", "hidden_size": 16}}
                tm = {k2.replace("model.layers.", root, 1): v for k2, v in t.items()}
                tm["vision_model.patch_embedding.linear.weight"] = ("F32", rnd(rng, 4, 4))
                dm = d + "_mm%d" % len(root)
                write_model(dm, cfgm, tm)
                gotm, outm = run(dm, x)
                check("llama4 multimodal config, %s tensors" % root, gotm, ref, 1e-5)
                if root.startswith("language_model"):
                    q = dm + "_q"
                    pq = subprocess.run([MOE8, "quantize", dm, q, "--rules", _rules_file(tmp)], capture_output=True, text=True)
                    wantq, _ = run(dm, x, ("--rules", _rules_file(tmp)))
                    gotq, _ = run(q, x) if pq.returncode == 0 else (None, "")
                    if pq.returncode != 0 or not np.array_equal(gotq, wantq):
                        FAILS.append("llama4 multimodal quantize: " + pq.stderr.strip())
                    print("llama4 multimodal: moe8 FP8 file run %s the input's run under the rules" %
                          ("equals" if pq.returncode == 0 and np.array_equal(gotq, wantq) else "DIFFERS FROM"))
            # the point of the form: weighting the output instead differs
            logits = x @ f(wr).T
            outw = R.mlp(x, *(f(w) for w in sh))
            for tt in range(len(x)):
                e = R.topk_idx(logits[tt], 1)[0]
                outw[tt] += R.mlp(x[tt:tt + 1], f(gu[e][:, :F]).T, f(gu[e][:, F:]).T, f(dn[e]).T)[0] / (1.0 + np.exp(-logits[tt, e]))
            print("llama4_text: weighting the output instead of the input: rel err %.2e" % rel(outw, ref))
            if rel(outw, ref) < 1e-3:
                FAILS.append("llama4 input scaling does not matter in this case")


def _rule_file(tmp, name, **rule):
    """A rules file of one rule for every layer (module_path ".*")."""
    path = os.path.join(tmp, "rules_%s.json" % name)
    with open(path, "w") as f:
        json.dump({"rules": [dict({"module_path": ".*"}, **rule)]}, f)
    return path


def _weight_rule(tmp, qtype):
    """A rule file quantizing every layer's expert weights to qtype."""
    return _rule_file(tmp, qtype, weight_qtype=qtype)


def _qwen2_with_weight_rule(tmp, rng, rules, quant, label):
    """A Qwen2-MoE block (shared expert too) run with a weight rule, against
    the reference on the weights as `quant` gives them; the run's stdout."""
    d, x, routing, ex, sh, sg = fam_qwen(tmp, rng, "qwen2_moe", {"shared_expert_intermediate_size": 256})
    got, out = run(d, x, ("--rules", rules))
    check(label, got, R.moe_block(x, routing, [tuple(quant(w) for w in e) for e in ex], tuple(quant(w) for w in sh), sg), 1e-5)
    return out


def test_mxfp4_rule(tmp, rng):
    """weight_qtype mxfp4: float checkpoints quantized to MXFP4 at an
    inference load (f32 activations), against the OCP quantizer written
    here; a Qwen2-MoE block (shared expert quantized too) and GPT-OSS's
    float experts."""
    rules = _weight_rule(tmp, "mxfp4")
    q = R.mxfp4_quant
    out = _qwen2_with_weight_rule(tmp, rng, rules, q, "qwen2_moe f32 with mxfp4 weights (OCP quantizer emulated)")
    if "weights mxfp4" not in out:
        FAILS.append("mxfp4 rule did not give mxfp4 weights: " + out.strip())
    d, x, _, w = gpt_oss_case(tmp, rng, {})
    wr, br, gu, gub, dn, dnb = w
    guq = np.stack([q(gu[e].T).T for e in range(gu.shape[0])])
    dnq = np.stack([q(dn[e].T).T for e in range(dn.shape[0])])
    got, _ = run(d, x, ("--rules", rules))
    check("gpt_oss f32 with mxfp4 weights by rule (emulated)", got, R.gpt_oss_block(x, wr, br, guq, gub, dnq, dnb, 4), 1e-5)
    # with int8 activations 1 x 32 the routed experts and the shared one (both MXFP4 at load) run mx4_rows_i8
    ri = _rule_file(tmp, "mx4_i8", weight_qtype="mxfp4", act_qtype="int8", tile_size=32)
    dq, xq, routing, ex, sh, sg = fam_qwen(tmp, rng, "qwen2_moe", {"shared_expert_intermediate_size": 256})
    got, out = run(dq, xq, ("--rules", ri))
    ref = R.moe_block(xq, routing, [tuple(q(w) for w in e) for e in ex], tuple(q(w) for w in sh), sg, act_q=lambda v: R.quant_rows_i8(v, 32))
    check("qwen2_moe mxfp4 weights, int8 activations 1x32 (emulated)", got, ref, 1e-4)
    if "activations int8 1x32" not in out:
        FAILS.append("mxfp4 rule with int8 activations: " + out.strip())
    # MXFP8: e4m3 codes with OCP MX scales per 32 along K (weights only here)
    _qwen2_with_weight_rule(tmp, rng, _weight_rule(tmp, "mxfp8"), R.mxfp8_quant, "qwen2_moe f32 with mxfp8 weights (OCP MX emulated)")
    p = subprocess.run([MOE8, "run", "--model", d, "--input", os.path.join(d, "x.npy"), "--output", os.path.join(d, "y.npy"), "--rules", rules,
                        "--training-load"], capture_output=True, text=True)
    if p.returncode == 0 or "inference" not in p.stderr:
        FAILS.append("mxfp4 rule on a training load was not refused: " + p.stderr)
    print("mxfp4 rule with --training-load: refused (%s)" % p.stderr.strip().split(": ")[-1][:80])


def test_mxfp4_file(tmp, rng):
    """moe8 quantize with weight_qtype mxfp4: moe8's own MXFP4 file (OCP
    blocks and E8M0 scales, 4.25 bits a weight). Run without rules it gives
    the bytes of the input run under the rule; a training load decodes it
    exactly; moe8 info names it; mixed formats are refused."""
    rules = _weight_rule(tmp, "mxfp4")
    d, x, routing, ex, sh, sg = fam_qwen(tmp, rng, "qwen2_moe", {"shared_expert_intermediate_size": 256}, dt="BF16")
    want, _ = run(d, x, ("--rules", rules))
    out = d + "_mx4"
    p = subprocess.run([MOE8, "quantize", d, out, "--rules", rules], capture_output=True, text=True)
    if p.returncode != 0:
        FAILS.append("quantize mxfp4: " + p.stderr.strip())
        print("quantize mxfp4 failed: " + p.stderr.strip())
        return
    got, runout = run(out, x)
    same = np.array_equal(got, want)
    print("mxfp4 file: a run without rules %s the input's run under the rule, byte for byte" % ("equals" if same else "DIFFERS FROM"))
    if "as the file holds them" not in runout:
        FAILS.append("mxfp4 file not kept as the file holds it: " + runout.strip())
    if not same:
        FAILS.append("mxfp4 file run")
    q = R.mxfp4_quant
    ref = R.moe_block(x, routing, [tuple(q(w) for w in e) for e in ex], tuple(q(w) for w in sh), sg)
    check("qwen2_moe mxfp4 file, no rules (OCP quantizer emulated)", got, ref, 1e-5)
    # a training load decodes the codes exactly, and gives the (float) shared expert its MXFP4 values, as an inference load
    got_t, _ = run(out, x, ("--training-load",))
    check("qwen2_moe mxfp4 file, training load (decoded)", got_t, ref, 1e-5)
    # the file under an int8-activation rule: the codes move to mx4_rows_i8's layout, the same bytes as the input under both rules
    ri = _rule_file(tmp, "i8_act", act_qtype="int8", tile_size=32)
    rb = _rule_file(tmp, "mx4_i8", weight_qtype="mxfp4", act_qtype="int8", tile_size=32)
    got_i, out_i = run(out, x, ("--rules", ri))
    want_i, _ = run(d, x, ("--rules", rb))
    same = np.array_equal(got_i, want_i)
    print("mxfp4 file, int8 activations: %s the input's run under mxfp4 + int8 rules, byte for byte" % ("equals" if same else "DIFFERS FROM"))
    if not same or "activations int8 1x32" not in out_i:
        FAILS.append("mxfp4 file with int8 activations: " + out_i.strip())
    rc, txt = info(out)
    if rc != 0 or "moe8 mxfp4" not in txt:
        FAILS.append("mxfp4 file info")
        print("mxfp4 file info (%d): %s" % (rc, txt))
    import struct as S
    with open(os.path.join(out, "model.safetensors"), "rb") as f:
        h = json.loads(f.read(S.unpack("<Q", f.read(8))[0]))
    nbytes = sum(v["data_offsets"][1] - v["data_offsets"][0] for k, v in h.items() if ".experts." in k)
    E, D, F = len(ex), ex[0][0].shape[1], ex[0][0].shape[0]
    bits = nbytes * 8.0 / (E * 3 * D * F)
    print("mxfp4 file: routed experts %d bytes, %.3f bits a weight" % (nbytes, bits))
    if abs(bits - 4.25) > 1e-9:
        FAILS.append("mxfp4 file size")
    # a scale byte of 255 (the E8M0 NaN) in the file: refused by name, for both loads, no output
    bad = out + "_nan"
    shutil.copytree(out, bad)
    with open(os.path.join(bad, "model.safetensors"), "r+b") as f:
        n = S.unpack("<Q", f.read(8))[0]
        hb = json.loads(f.read(n))
        m = hb["model.layers.0.mlp.experts.down_proj_scales"]
        f.seek(8 + n + m["data_offsets"][0] + 7)
        f.write(b"\xff")
    for extra in ((), ("--training-load",)):
        yp = os.path.join(bad, "y.npy")
        if os.path.exists(yp):
            os.remove(yp)  # copied with the model: a refused run must write none
        R.write_npy(os.path.join(bad, "x.npy"), x)
        p = subprocess.run([MOE8, "run", "--model", bad, "--input", os.path.join(bad, "x.npy"), "--output", yp, *extra], capture_output=True,
                           text=True)
        if p.returncode != 1 or "down_proj_scales" not in p.stderr or "255" not in p.stderr or os.path.exists(yp):
            FAILS.append("mxfp4 file with a NaN scale %s: rc %d, %s" % (extra, p.returncode, p.stderr.strip()))
    print("mxfp4 file with a 255 scale: refused (%s)" % p.stderr.strip().split("\n")[-1][:100])
    # quantizing it again, or mixing mxfp4 with another format, is refused
    p = subprocess.run([MOE8, "quantize", out, out + "_again", "--rules", rules], capture_output=True, text=True)
    if p.returncode == 0 or "already quantized" not in p.stderr:
        FAILS.append("mxfp4 file quantized twice: " + p.stderr)


def _gpt_oss_quant_ref(x, wr, br, gu, gub, dn, dnb, k, aq, alpha=1.702, limit=7.0):
    logits = x @ wr.T + br
    xq = aq(x)
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        ids = R.topk_idx(logits[t], k)
        w = R.softmax(logits[t, ids])
        for j, e in enumerate(ids):
            hh = xq[t] @ gu[e] + gub[e]
            g, u = np.minimum(hh[0::2], limit), np.clip(hh[1::2], -limit, limit)
            hq = aq((((u + 1.0) * (g / (1.0 + np.exp(-alpha * g)))))[None, :])[0]
            out[t] += w[j] * (hq @ dn[e] + dnb[e])
    return out


def _rules_file(tmp):
    p = os.path.join(tmp, "rules_fp8.json")
    with open(p, "w") as f:
        json.dump(RULES_FP8, f)
    return p


def _read(d, name):
    import struct as S
    with open(os.path.join(d, "model.safetensors"), "rb") as f:
        n = S.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
        m = h[name]
        f.seek(8 + n + m["data_offsets"][0])
        return np.frombuffer(f.read(m["data_offsets"][1] - m["data_offsets"][0]), dtype=np.float32).reshape(m["shape"]).astype(np.float64)


def _router_of(d):
    import struct as S
    with open(os.path.join(d, "model.safetensors"), "rb") as f:
        n = S.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
        base = 8 + n

        def get(name):
            m = h[name]
            f.seek(base + m["data_offsets"][0])
            return np.frombuffer(f.read(m["data_offsets"][1] - m["data_offsets"][0]), dtype=np.float32).reshape(m["shape"]).astype(np.float64)
        w = [n for n in h if n.endswith("mlp.gate.e_score_correction_bias")][0]
        return get(w.replace("e_score_correction_bias", "weight")), get(w)


# Families whose block is one moe8 computes, each a row of data in
# src/io/hfconfig.c: the keys and defaults of its configuration class and
# the tensor names its files have.  block: qwen3 (softmax top-k), qwen2
# (softmax top-k + sigmoid-gated shared expert), ds3 (DeepSeek-V3), ds2
# (DeepSeek-V2); keys: the names the class writes; place: how a dense layer
# is written ("types": mlp_layer_types, "fk": first_k_dense_replace,
# "qwen": mlp_only_layers, "all": every layer MoE) and the key its refusal
# names; defaults: what the reference uses when the optional keys are left out.
ROWS = [
    dict(mt="qwen3_vl_moe_text", block="qwen3", ekey="num_local_experts", fkey="moe_intermediate_size", norm=(None, True),
         place="qwen", layouts=("per", "fused", "fused_xw")),
    dict(mt="qwen3_vl_moe", wrap="qwen3_vl_moe_text", block="qwen3", ekey="num_local_experts", fkey="moe_intermediate_size",
         norm=(None, True), place="qwen", layouts=("fused_xw",)),
    dict(mt="qwen3_omni_moe_text", block="qwen3", ekey="num_experts", fkey="moe_intermediate_size", norm=("norm_topk_prob", True),
         place="qwen", layouts=("per", "fused")),
    dict(mt="qwen3_5_moe_text", block="qwen2", ekey="num_experts", fkey="moe_intermediate_size", norm=(None, True), place="all",
         layouts=("per", "fused")),
    dict(mt="qwen3_5_moe", wrap="qwen3_5_moe_text", block="qwen2", ekey="num_experts", fkey="moe_intermediate_size", norm=(None, True),
         place="all", layouts=("per",)),
    dict(mt="glm4_moe_lite", block="ds3", ekey="n_routed_experts", norm=("norm_topk_prob", True), scale=("routed_scaling_factor", 1.8),
         shared=("n_shared_experts", 1), place="types", layouts=("per", "fused")),
    dict(mt="glm4v_moe_text", block="ds3", ekey="n_routed_experts", norm=("norm_topk_prob", True), scale=("routed_scaling_factor", 1.0),
         shared=("n_shared_experts", 1), place="fk", layouts=("per", "fused")),
    dict(mt="glm4v_moe", wrap="glm4v_moe_text", block="ds3", ekey="n_routed_experts", norm=("norm_topk_prob", True),
         scale=("routed_scaling_factor", 1.0), shared=("n_shared_experts", 1), place="fk", layouts=("per",)),
    # Kimi K2.5 / K2.6 (kimi_k25): DeepSeek-V3's text model (text_config deepseek_v3, or kimi_k2 as released) under
    # language_model.model.layers.
    dict(mt="kimi_k25", wrap="deepseek_v3", root="language_model.model.layers.", block="ds3", ekey="n_routed_experts",
         norm=("norm_topk_prob", True), scale=("routed_scaling_factor", 2.5), shared=("n_shared_experts", 1), place="fk", dense=3,
         groups_default=(8, 4), layouts=("per",)),
    # (transformers 5.24's save_pretrained writes its layers as language_model.model.blocks.)
    dict(mt="kimi_k25", wrap="kimi_k2", root="language_model.model.blocks.", block="ds3", ekey="n_routed_experts",
         norm=("norm_topk_prob", True), scale=("routed_scaling_factor", 2.5), shared=("n_shared_experts", 1), place="fk", dense=3,
         groups_default=(8, 4), layouts=("per",)),
    dict(mt="glm_moe_dsa", block="ds3", ekey="n_routed_experts", norm=("norm_topk_prob", True), scale=("routed_scaling_factor", 2.5),
         shared=("n_shared_experts", 1), place="types", dense=3, layouts=("per", "fused")),
    dict(mt="mimo_v2_flash", block="ds3", ekey="n_routed_experts", norm=("norm_topk_prob", True), scale=("routed_scaling_factor", 1.0),
         shared=None, place="types", layouts=("per", "fused")),
    dict(mt="solar_open", block="ds3", ekey="n_routed_experts", norm=("norm_topk_prob", True), scale=("routed_scaling_factor", 1.0),
         shared=("n_shared_experts", 1), place="all", layouts=("per", "fused")),
    dict(mt="sarvam_moe", block="ds3", ekey="num_experts", norm=("norm_topk_prob", True), scale=("routed_scaling_factor", 2.5),
         shared=("num_shared_experts", 1), place="fk", bias="gate.expert_bias", layouts=("per",)),
    dict(mt="sarvam_mla", block="ds3", ekey="n_routed_experts", norm=("norm_topk_prob", True), scale=("routed_scaling_factor", 2.5),
         shared=("n_shared_experts", 1), place="fk", layouts=("per", "fused")),
    dict(mt="exaone_moe", block="ds3", ekey="num_experts", norm=("norm_topk_prob", True), scale=("routed_scaling_factor", 2.5),
         shared=("num_shared_experts", 1), place="types", bias="e_score_correction_bias", layouts=("per", "fused")),
    dict(mt="kimi_linear", block="ds3", ekey="num_experts", kkey="num_experts_per_token", norm=("moe_renormalize", True),
         scale=("routed_scaling_factor", 2.446), shared=("num_shared_experts", 1), group="num_expert_group", place="types",
         prefix="block_sparse_moe.", names=("w1", "w3", "w2"), layouts=("per", "fused")),
    dict(mt="flex_olmo", block="qwen3", ekey="num_experts", fkey="intermediate_size", norm=("norm_topk_prob", False), place="all",
         layouts=("per", "fused")),
    dict(mt="mellum", block="qwen3", ekey="num_local_experts", fkey="moe_intermediate_size", norm=("norm_topk_prob", True), place="types",
         layouts=("per", "fused")),
    dict(mt="unlimited_ocr_text", block="ds2", ekey="n_routed_experts", scale=("routed_scaling_factor", 1.0), shared=("n_shared_experts", 2),
         place="types", layouts=("per", "fused")),
    dict(mt="bailing_hybrid", block="ds3", ekey="num_experts", kkey="num_experts_per_token", norm=("moe_renormalize", True),
         scale=("routed_scaling_factor", 2.5), shared=("num_shared_experts", 1), group="num_expert_group", place="types", dense=2,
         bias="gate.expert_bias", groups_default=(8, 4), layouts=("per", "fused")),
    dict(mt="beam", block="ds3", ekey="num_experts", norm=("norm_topk_prob", True), scale=("routed_scaling_factor", 2.5), shared=None,
         place="types", dense=3, groups_default=(8, 4), layouts=("per", "fused")),
    dict(mt="dots3_note_text", block="ds3", ekey="n_routed_experts", norm=("norm_topk_prob", True), scale=("routed_scaling_factor", 1.0),
         shared=("n_shared_experts", 2), shared_width=("shared_experts_intermediate_size", 40), place="types", layouts=("per", "fused")),
    dict(mt="afmoe", block="ds3", ekey="num_experts", norm=(None, True), scale=("route_scale", 1.0), shared=("num_shared_experts", 2),
         group="", place="first", router="router.gate.weight", bias="expert_bias", layouts=("per", "fused")),
    dict(mt="hy_v3", block="ds3", ekey="num_experts", norm=(None, True), scale=("router_scaling_factor", 2.826),
         shared=("num_shared_experts", 1), group="", place="types", router="router.gate.weight", bias="expert_bias",
         shared_name="shared_mlp.", layouts=("per", "fused")),
    dict(mt="qwen4_exp_text", block="qwen2", ekey="num_experts", fkey="moe_intermediate_size", norm=("norm_topk_prob", True), place="all",
         layouts=("per", "fused")),
    dict(mt="lara_mini", block="qwen2", ekey="num_experts", fkey="moe_intermediate_size", norm=("norm_topk_prob", True), place="all",
         ungated=True, layouts=("fused", "per")),
    dict(mt="hunyuan_v1_moe", block="qwen2", ekey="num_experts", kkey="moe_topk", fkey="intermediate_size", norm=(None, True), place="all",
         ungated=True, shared_same_width=True, router="gate.wg.weight", shared_name="shared_mlp.", layouts=("per", "fused")),
    dict(mt="deepseek_ocr2_text", block="ds2", ekey="n_routed_experts", scale=("routed_scaling_factor", 1.0), shared=("n_shared_experts", 2),
         place="types", types_required=True, layouts=("fused", "per")),
    dict(mt="unlimited_ocr", wrap="unlimited_ocr_text", block="ds2", ekey="n_routed_experts", scale=("routed_scaling_factor", 1.0),
         shared=("n_shared_experts", 2), place="types", layouts=("per",)),
    dict(mt="flint", block="qwen2", ekey="num_experts", fkey="moe_intermediate_size", norm=("norm_topk_prob", True), place="qwen",
         dense=2, ungated=True, sigmoid=True, layouts=("per", "fused")),
    # AXK2 (A.X-K2): DeepSeek-V3's block, groups optional (null: none), the dropped groups' selection values 0.0 (the test's
    # bias makes the kept experts' values negative, so dropped experts are chosen, ties to the lower index)
    dict(mt="axk2", block="ds3", ekey="n_routed_experts", norm=("norm_topk_prob", True), scale=("routed_scaling_factor", 2.5),
         shared=("n_shared_experts", 1), place="types", zero_mask=True, layouts=("per", "fused")),
    # Mistral-4: DeepSeek-V3's groups on softmax scores, no bias
    dict(mt="mistral4", block="ds3", ekey="n_routed_experts", norm=("norm_topk_prob", True), scale=("routed_scaling_factor", 1.0),
         shared=("n_shared_experts", 1), place="fk", dense=0, softmax=True, layouts=("per", "fused")),
    # ERNIE-4.5: softmax scores, the top-k of score + bias [1, E], always renormalized (max(sum, moe_norm_min))
    dict(mt="ernie4_5_moe", block="ds3", ekey="moe_num_experts", kkey="moe_k", norm=(None, True), shared=("moe_num_shared_experts", 1),
         group="", place="interval", softmax=True, bias="moe_statics.e_score_correction_bias", bias_2d=True, layouts=("per", "fused")),
    # Granite: the block under block_sparse_moe., fused experts input_linear / output_linear, router router.layer.weight; the
    # shared variants' MLP beside the block (shared_mlp.input_linear [2Fs, D] / output_linear [D, Fs])
    dict(mt="granitemoe", block="qwen3", ekey="num_local_experts", fkey="intermediate_size", norm=(None, True), place="all",
         prefix="block_sparse_moe.", router="router.layer.weight", fused_names=("input_linear.weight", "output_linear.weight"),
         layouts=("fused",)),
    dict(mt="granitemoeshared", block="qwen2", ekey="num_local_experts", fkey="intermediate_size", norm=(None, True), place="all",
         prefix="block_sparse_moe.", router="router.layer.weight", fused_names=("input_linear.weight", "output_linear.weight"),
         ungated=True, shared_key="shared_intermediate_size", shared_beside="shared_mlp.", layouts=("fused",)),
    dict(mt="granitemoehybrid", block="qwen2", ekey="num_local_experts", fkey="intermediate_size", norm=(None, True), place="all",
         prefix="block_sparse_moe.", router="router.layer.weight", fused_names=("input_linear.weight", "output_linear.weight"),
         ungated=True, shared_key="shared_intermediate_size", shared_beside="shared_mlp.", layouts=("fused",)),
    dict(mt="granitemoe_swa", block="qwen2", ekey="num_local_experts", fkey="intermediate_size", norm=(None, True), place="all",
         prefix="block_sparse_moe.", router="router.weight", ungated=True, shared_key="shared_intermediate_size", shared_beside="shared_mlp.",
         layouts=("fused",)),
    # LFM2-MoE: DeepSeek-V3's block under feed_forward. (w1/w3/w2, bias feed_forward.expert_bias), weights / (sum + 1e-6)
    dict(mt="lfm2_moe", block="ds3", ekey="num_experts", norm=("norm_topk_prob", True), scale=("routed_scaling_factor", 1.0), shared=None,
         group="", place="first", dense=2, prefix="feed_forward.", names=("w1", "w3", "w2"), bias="expert_bias", norm_eps=1e-6,
         layouts=("per", "fused")),
    # Laguna: one ungated shared expert (no count key) of width shared_expert_intermediate_size, bias as its files name it
    dict(mt="laguna", block="ds3", ekey="num_experts", norm=(None, True), scale=("moe_routed_scaling_factor", 1.0), shared=("", 1),
         shared_width=("shared_expert_intermediate_size", 40), group="", place="types", bias="experts.e_score_correction_bias",
         shared_name="shared_expert.", layouts=("per", "fused")),
    # Kolibri-1: the top-k of logit + bias (the bias beside the block, moe.router.expert_bias), sigmoid weights
    dict(mt="kolibri1", block="qwen2", ekey="num_local_experts", fkey="moe_intermediate_size", norm=("norm_topk_prob", False), place="all",
         ungated=True, sigmoid=True, logits_bias="moe.router.expert_bias", shared_name="shared_experts.", layouts=("per", "fused")),
    # the limited SwiGLU: swiglu_limit (written small, so that it clamps), HY-V4's shared experts unclamped
    dict(mt="glm5_next_text", block="ds3", ekey="n_routed_experts", norm=("norm_topk_prob", True), scale=("routed_scaling_factor", 2.5),
         shared=("n_shared_experts", 1), place="types", dense=3, limit=("swiglu_limit", 10.0), layouts=("per", "fused")),
    dict(mt="glm5_next", wrap="glm5_next_text", block="ds3", ekey="n_routed_experts", norm=("norm_topk_prob", True),
         scale=("routed_scaling_factor", 2.5), shared=("n_shared_experts", 1), place="types", dense=3, limit=("swiglu_limit", 10.0),
         layouts=("fused",)),
    dict(mt="hy_v4", block="ds3", ekey="n_routed_experts", norm=("norm_topk_prob", True), scale=("routed_scaling_factor", 2.827),
         shared=("n_shared_experts", 1), place="types", limit=("swiglu_limit", 10.0), shared_plain=True, layouts=("per", "fused"),
         shared_names=("linear_gate", "up_proj", "down_proj")),  # as transformers saves HY-V4's shared experts
    dict(mt="hy_v4_vl", wrap="hy_v4_vl_text", block="ds3", ekey="n_routed_experts", norm=("norm_topk_prob", True),
         scale=("routed_scaling_factor", 2.827), shared=("n_shared_experts", 1), place="types", limit=("swiglu_limit", 10.0),
         shared_plain=True, layouts=("fused",)),
    # Step-3.5/3.7: the SwiGLU clamped after the activation, per layer (swiglu_limits, swiglu_limits_shared; 0 / null: none),
    # one ungated shared expert of width share_expert_dim, the routed sum times moe_router_scaling_factor, MoE from layer 3 by default
    dict(mt="step3p5", block="ds3", ekey="n_routed_experts", norm=(None, True), scale=("moe_router_scaling_factor", 1.0), shared=("", 1),
         shared_width=("share_expert_dim", 40), group="", place="types", dense=3, post=True, layouts=("fused", "per")),
    dict(mt="step3p7", wrap="step3p5", block="ds3", ekey="moe_num_experts", kkey="moe_top_k", norm=(None, True),
         scale=("moe_router_scaling_factor", 1.0), shared=("", 1), shared_width=("share_expert_dim", 40), group="", place="types", dense=3,
         post=True, layouts=("fused",)),
    # Step-3.7's released names (as transformers' save_pretrained of Step3p7ForConditionalGeneration writes them): the block under
    # moe., its experts stacked per projection, the bias moe.router_bias, the shared expert share_expert.* in the decoder layer
    dict(mt="step3p7", wrap="step3p5", root="model.layers.", prefix="moe.", bias="router_bias", shared_layer="share_expert.",
         block="ds3", ekey="n_routed_experts", norm=(None, True), scale=("moe_router_scaling_factor", 1.0), shared=("", 1),
         shared_width=("share_expert_dim", 40), group="", place="types", dense=3, post=True, layouts=("stacked",)),
    # MiniMax-M3: GPT-OSS's clamped SwiGLU (swiglu_alpha, swiglu_limit) in halves layout, in the shared expert too, an ungated shared
    # expert of width shared_intermediate_size (transformers' text model: fused shared_experts.gate_up_proj), the routed sum scaled;
    # the multimodal model's files (as save_pretrained writes them): language_model.model.layers.L.block_sparse_moe., w1/w3/w2
    dict(mt="minimax_m3_vl_text", block="ds3", ekey="num_local_experts", fkey="intermediate_size", norm=(None, True),
         scale=("routed_scaling_factor", 2.0), shared=("", 1), shared_width=("shared_intermediate_size", 40), group="", place="types",
         dense=0, oss=(1.702, 7.0), shared_fused=True, layouts=("fused",)),
    dict(mt="minimax_m3_vl", wrap="minimax_m3_vl_text", root="language_model.model.layers.", prefix="block_sparse_moe.",
         names=("w1", "w3", "w2"), bias="e_score_correction_bias", block="ds3", ekey="num_local_experts", fkey="intermediate_size",
         norm=(None, True), scale=("routed_scaling_factor", 2.0), shared=("", 1), shared_width=("shared_intermediate_size", 40), group="",
         place="types", dense=0, oss=(1.702, 7.0), layouts=("per",)),
    # Inkling-2: the softcapped SwiGLU (mlp_gate_softcap, mlp_up_softcap), f32 sigmoid routing with the bias its files name
    # gate.bias, weights / (sum + 1e-20) times route_scale, no shared experts, every layer MoE; its files' experts w13_weight
    # (gate and up rows alternating) and w2_weight (as transformers' save_pretrained writes them), or gate_up_proj (halves)
    dict(mt="inkling2_text", block="ds3", ekey="n_routed_experts", norm=(None, True), scale=("route_scale", 8.0), shared=None, group="",
         place="all", softcap=(4.0, 25.0), bias="gate.bias", fused_names=("experts.w13_weight", "experts.w2_weight"), interleave=True,
         layouts=("fused", "fused_halves")),
    dict(mt="inkling2_loop_text", block="ds3", ekey="n_routed_experts", norm=(None, True), scale=("route_scale", 8.0), shared=None,
         group="", place="all", softcap=(4.0, 25.0), bias="gate.bias", fused_names=("experts.w13_weight", "experts.w2_weight"),
         interleave=True, layouts=("fused",)),
    dict(mt="inkling2", wrap="inkling2_text", root="model.llm.layers.", block="ds3", ekey="n_routed_experts", norm=(None, True),
         scale=("route_scale", 8.0), shared=None, group="", place="all", softcap=(4.0, 25.0), bias="gate.bias",
         fused_names=("experts.w13_weight", "experts.w2_weight"), interleave=True, layouts=("fused",)),
    # Mistral-Large-4: Mistral-4's block, always renormalized, in Mistral's own names (layers.L.gate.weight,
    # layers.L.experts.N.w1/w3/w2, layers.L.shared_experts.w1/w3/w2: as its files and transformers' save_pretrained write them)
    dict(mt="mistral_large4_text", block="ds3", ekey="n_routed_experts", norm=(None, True), scale=("routed_scaling_factor", 1.0),
         shared=("n_shared_experts", 1), place="fk", softmax=True, root="layers.", prefix="", names=("w1", "w3", "w2"),
         shared_names=("w1", "w3", "w2"), shared_name="shared_experts.", layouts=("per", "fused")),
    dict(mt="mistral_large4", wrap="mistral_large4_text", block="ds3", ekey="n_routed_experts", norm=(None, True),
         scale=("routed_scaling_factor", 1.0), shared=("n_shared_experts", 2), place="types", softmax=True, root="layers.", prefix="",
         names=("w1", "w3", "w2"), shared_name="shared_experts.", layouts=("per",)),
    # JetMoE: Mixtral's routing, experts fused as mlp.input_linear / output_linear, router mlp.router.layer.weight, and the
    # block's output bias mlp.bias [D] (as transformers' save_pretrained writes them)
    dict(mt="jetmoe", block="qwen3", ekey="num_local_experts", fkey="intermediate_size", norm=(None, True), place="all",
         router="router.layer.weight", fused_names=("input_linear.weight", "output_linear.weight"), out_bias="bias", layouts=("fused",)),
    dict(mt="jamba", block="qwen3", ekey="num_experts", fkey="intermediate_size", norm=(None, False), place="period",
         prefix="feed_forward.", router="router.weight", layouts=("per", "fused")),
    # DeepSeek-V4: sqrt-softplus scores (or scoring_func sigmoid), the top-k of score + gate.bias, or in its hash layers
    # (mlp_layer_types "hash_moe"; default the first 3) the experts gate.tid2eid[token id]; weights / (sum + 1e-20) times
    # routed_scaling_factor; the limited SwiGLU in the routed and the one shared expert (of the experts' width); as
    # transformers' save_pretrained writes it (model.layers.L.ffn., w1/w3/w2) and as its released files hold it (layers.L.ffn.)
    dict(mt="deepseek_v4", block="ds3", ekey="n_routed_experts", norm=(None, True), scale=("routed_scaling_factor", 1.5), shared=("", 1),
         group="", place="all", dsv4=True, limit=("swiglu_limit", 10.0), prefix="ffn.", names=("w1", "w3", "w2"),
         shared_names=("w1", "w3", "w2"), bias="gate.bias", layouts=("per",)),
    dict(mt="deepseek_v4", block="ds3", ekey="n_routed_experts", norm=(None, True), scale=("routed_scaling_factor", 1.5), shared=("", 1),
         group="", place="all", dsv4=True, scoring="sigmoid", limit=("swiglu_limit", 10.0), prefix="ffn.", names=("w1", "w3", "w2"),
         shared_names=("w1", "w3", "w2"), bias="gate.bias", root="layers.", layouts=("per",)),
    # Nemotron-H: DeepSeek-V3's block with ungated experts down(relu(up x)^2) (mlp_hidden_act relu2; relu) and one shared
    # expert of that form (moe_shared_expert_intermediate_size); a layer MoE where hybrid_override_pattern has E (or
    # layers_block_type "moe"; neither: the class's list, layer 1 of 4); the block under backbone.layers.L.mixer. (its
    # files) or model.layers.L.mixer. (transformers' own names), experts per expert or fused experts.up_proj [E, F, D]
    dict(mt="nemotron_h", block="ds3", ekey="n_routed_experts", norm=("norm_topk_prob", True), scale=("routed_scaling_factor", 1.0),
         shared=("", 1), shared_width=("moe_shared_expert_intermediate_size", 40), place="pattern", relu2="relu2",
         root="backbone.layers.", prefix="mixer.", layouts=("per", "fused")),
    dict(mt="nemotron_h", block="ds3", ekey="num_local_experts", norm=("norm_topk_prob", True), scale=("routed_scaling_factor", 1.0),
         shared=("", 1), shared_width=("moe_shared_expert_intermediate_size", 40), place="blocktypes", relu2="relu",
         root="model.layers.", prefix="mixer.", layouts=("fused", "per")),
    # the multimodal models whose decoder is Nemotron-H: Nemotron-3 Nano Omni (nemotron_h_omni; its text model under
    # text_config, or llm_config as released) under language_model.backbone.layers. (its files and transformers'
    # save_pretrained) or language_model.model.layers. (transformers' own names); Nemotron-3.5 Transcribe (nemo_speechlm)
    # under llm.model.layers. (NeMo's names, which save_pretrained writes too) or model.language_model.layers.
    dict(mt="nemotron_h_omni", wrap="nemotron_h", text_key="llm_config", block="ds3", ekey="n_routed_experts",
         norm=("norm_topk_prob", True), scale=("routed_scaling_factor", 1.0), shared=("", 1),
         shared_width=("moe_shared_expert_intermediate_size", 40), place="pattern", relu2="relu2", root="language_model.backbone.layers.",
         prefix="mixer.", layouts=("per", "fused"), multimodal=True),
    dict(mt="nemotron_h_omni", wrap="nemotron_h", block="ds3", ekey="n_routed_experts", norm=("norm_topk_prob", True),
         scale=("routed_scaling_factor", 1.0), shared=("", 1), shared_width=("moe_shared_expert_intermediate_size", 40),
         place="blocktypes", relu2="relu", root="language_model.model.layers.", prefix="mixer.", layouts=("fused",), multimodal=True),
    dict(mt="nemo_speechlm", wrap="nemotron_h", block="ds3", ekey="n_routed_experts", norm=("norm_topk_prob", True),
         scale=("routed_scaling_factor", 1.0), shared=("", 1), shared_width=("moe_shared_expert_intermediate_size", 40),
         place="pattern", relu2="relu2", root="llm.model.layers.", prefix="mixer.", layouts=("per", "fused"), multimodal=True),
    dict(mt="nemo_speechlm", wrap="nemotron_h", block="ds3", ekey="num_local_experts", norm=("norm_topk_prob", True),
         scale=("routed_scaling_factor", 1.0), shared=("", 1), shared_width=("moe_shared_expert_intermediate_size", 40),
         place="blocktypes", relu2="relu2", root="model.language_model.layers.", prefix="mixer.", layouts=("per",), multimodal=True),
    # PhiMoE: Mixtral's experts routed by sparsemixer (2 experts whatever num_experts_per_tok says: the test's is 4;
    # router_jitter_noise, default 0.01), as save_pretrained writes them (block_sparse_moe., w1/w3/w2, gate.weight) and
    # in transformers' own names (mlp., fused, router.weight)
    dict(mt="phimoe", block="qwen3", ekey="num_local_experts", fkey="intermediate_size", place="all", sparsemixer=True,
         prefix="block_sparse_moe.", names=("w1", "w3", "w2"), layouts=("per",)),
    dict(mt="phimoe", block="qwen3", ekey="num_local_experts", fkey="intermediate_size", place="all", sparsemixer=True,
         router="router.weight", layouts=("fused",)),
]
PLACE_KEY = {"types": "mlp_layer_types", "fk": "first_k_dense_replace", "qwen": "mlp_only_layers", "first": "num_dense_layers",
             "period": "expert_layer_period", "interval": "moe_layer_interval", "pattern": "hybrid_override_pattern",
             "blocktypes": "layers_block_type"}


def row_case(tmp, rng, row, layout, absent=False, T=24):
    """A checkpoint of 3 layers in the family's names (bf16): layer 0 dense
    (but where every layer is MoE), the others MoE; each MoE layer's
    reference.  absent: the optional keys (norm, scaling, placement) left
    out, the reference taking the class's defaults."""
    E, k, D, F = 16, 4, 128, 96
    if absent and row.get("groups_default", (1, 1))[0] > 1:
        E = 32  # the class's 8 groups need at least 2 experts each
    place = row["place"]
    dflt = row.get("dense", 0 if place in ("qwen", "all") or row["mt"] == "mellum" else 1)  # the class's dense layers by default
    L = dflt + 2 if absent else 3
    blk = row["block"]
    cfg = {"model_type": row.get("wrap") or row["mt"], row["ekey"]: E, row.get("kkey", "num_experts_per_tok"): k, "hidden_size": D,
           row.get("fkey", "moe_intermediate_size"): F, "num_hidden_layers": L}
    if not absent or row.get("types_required"):
        if place == "types":
            cfg["mlp_layer_types"] = ["dense", "sparse", "sparse"]
        elif place == "first":
            cfg["num_dense_layers"] = 1
        elif place == "fk":
            cfg["first_k_dense_replace"] = 1
        elif place == "qwen":
            cfg["mlp_only_layers"] = [0]
            cfg["decoder_sparse_step"] = 1
        elif place == "interval":  # MoE where (layer + 1) % interval == 0 and start <= layer <= end
            cfg.update(moe_layer_interval=1, moe_layer_start_index=1, moe_layer_end_index=-1)
        elif place == "period":  # MoE where layer % period == offset (the class's defaults: 2, 1)
            cfg["expert_layer_period"] = 3
            cfg["expert_layer_offset"] = 1
        elif place == "pattern":  # Nemotron-H: a mamba layer, then two MoE ones
            cfg["hybrid_override_pattern"] = "MEE"
        elif place == "blocktypes":
            cfg["layers_block_type"] = ["mlp", "moe", "moe"]
    if row.get("types_required"):  # written in both cases: layer 0 dense
        L, dflt = 3, 1
    V, hash_layers = 40, set()  # DeepSeek-V4: its vocabulary (the hash tables' rows), the layers routed by token id
    if row.get("dsv4"):
        cfg["vocab_size"] = V
        if row.get("scoring") or not absent:
            cfg["scoring_func"] = row.get("scoring", "sqrtsoftplus")
        if not absent:
            cfg["mlp_layer_types"] = ["hash_moe", "moe", "hash_moe"]
        hash_layers = {0, 2} if not absent else set(range(min(L, 3)))  # the class's default: the first num_hash_layers (3)
    moe_layers = list(range(dflt, L)) if absent else [0, 1, 2] if place == "all" else [1, 2]
    if place == "period":
        period, offset = (2, 1) if absent else (3, 1)
        moe_layers = [l for l in range(L) if l % period == offset]
    if place in ("pattern", "blocktypes") and absent:  # NemotronHConfig's default list: layer 1 of 4 MoE
        moe_layers = [1]
    act = row.get("relu2")  # Nemotron-H's ungated experts: mlp_hidden_act (relu2 is the class's default)
    if act and (act != "relu2" or not absent):
        cfg["mlp_hidden_act"] = act
    norm_key, norm = row.get("norm", (None, False))
    scale_key, scale = row.get("scale", (None, 1.0))
    if not absent:
        if norm_key:
            norm = not norm if blk in ("qwen3", "qwen2") else norm  # the other value than the default, where it is a key
            cfg[norm_key] = norm
        if scale_key and blk == "ds3":
            scale = 1.75
            cfg[scale_key] = scale
    sh_key, nsh = row.get("shared") or (None, 0)
    if sh_key:
        cfg[sh_key] = nsh
    limit = None
    if row.get("limit"):
        limit = row["limit"][1]
        if not absent:
            limit = cfg[row["limit"][0]] = 0.05  # small enough to clamp many of the test's pre-activations
    oss = row.get("oss")
    if oss and not absent:
        oss = (1.5, 0.05)  # a limit small enough to clamp many of the test's pre-activations
        cfg["swiglu_alpha"], cfg["swiglu_limit"] = oss
    softcap = row.get("softcap")
    if softcap and not absent:
        softcap = (1.5, 2.0)  # small enough to bind on the test's pre-activations
        cfg["mlp_gate_softcap"], cfg["mlp_up_softcap"] = softcap
    jitter = 0.01  # PhiMoE's router_jitter_noise (the class's default)
    if row.get("sparsemixer") and not absent:
        jitter = cfg["router_jitter_noise"] = 0.1  # a threshold of 0.2: the test's logits are masked and kept
    post = {}  # Step's per-layer limits (routed, shared) by layer
    if row.get("post") and not absent:
        cfg["swiglu_limits"] = [0.0, 0.05, None]  # layer 1 clamped, layer 2 not (null), as the class reads them
        cfg["swiglu_limits_shared"] = [None, 0.03, 0.04]
        post = {1: (0.05, 0.03), 2: (None, 0.04)}
    n_group = row.get("groups_default", (1, 1))
    if blk == "ds3" and row.get("group", "n_group"):
        if absent:
            cfg.pop(row.get("group", "n_group"), None)
        else:
            cfg[row.get("group", "n_group")] = 2
            cfg["topk_group"] = 1
            n_group = (2, 1)
    width = F
    if row.get("shared_width"):
        cfg[row["shared_width"][0]] = width = row["shared_width"][1]
    Fs = (F if row.get("shared_same_width") else 64) if blk == "qwen2" else width * nsh
    if blk == "qwen2" and not row.get("shared_same_width"):
        cfg[row.get("shared_key", "shared_expert_intermediate_size")] = Fs
    if row.get("wrap"):
        text = dict(cfg, model_type=row["wrap"])
        cfg = {"model_type": row["mt"], row.get("text_key", "text_config"): text, "vision_config": {"hidden_size": 8}}
    root = row.get("root") or ("model.language_model.layers." if row.get("wrap") else "model.layers.")
    pre = row.get("prefix", "mlp.")
    names = row.get("names", ("gate_proj", "up_proj", "down_proj"))
    t, refs = {}, {}
    x = rnd(rng, T, D).astype(np.float32).astype(np.float64)
    tok = rng.integers(0, V, T)
    tok[:3] = [0, V - 1, 0]  # the first and the last row of the tables, a token twice
    if 0 not in moe_layers:
        t[root + "0.mlp.gate_proj.weight"] = ("BF16", rnd(rng, 32, D).astype(np.float32))
    for l in moe_layers:
        p = "%s%d.%s" % (root, l, pre)
        wr = rnd(rng, E, D, scale=0.5)
        t[p + row.get("router", "gate.weight")] = ("BF16", wr.astype(np.float32))
        wr = store(wr, "BF16")
        ex = make_experts(rng, E, D, F)
        if act and layout == "per":  # ungated: up and down only
            for e, (_, wu, wd) in enumerate(ex):
                t["%sexperts.%d.up_proj.weight" % (p, e)] = ("BF16", wu.astype(np.float32))
                t["%sexperts.%d.down_proj.weight" % (p, e)] = ("BF16", wd.astype(np.float32))
            experts = [(store(wu, "BF16"), store(wd, "BF16")) for _, wu, wd in ex]
        elif act:  # transformers' NemotronHExperts: up_proj [E, F, D], down_proj [E, D, F]
            t[p + "experts.up_proj"] = ("BF16", np.stack([wu for _, wu, _ in ex]).astype(np.float32))
            t[p + "experts.down_proj"] = ("BF16", np.stack([wd for _, _, wd in ex]).astype(np.float32))
            experts = [(store(wu, "BF16"), store(wd, "BF16")) for _, wu, wd in ex]
        elif layout == "per":
            experts = per_expert(t, p, ex, names, "BF16")
        elif layout == "stacked":  # one 3-D tensor per projection (Step-3.7's files)
            for i, nm in enumerate(names):
                t[p + nm + ".weight"] = ("BF16", np.stack([e[i] for e in ex]).astype(np.float32))
            experts = [tuple(store(w, "BF16") for w in e) for e in ex]
        else:
            gu = np.stack([np.concatenate([g, u], axis=0) for g, u, _ in ex])
            if row.get("interleave") and layout == "fused":  # row 2f gate f, 2f + 1 up f
                gu = np.stack([np.stack([g, u], axis=1).reshape(2 * F, D) for g, u, _ in ex])
            dn = np.stack([w for _, _, w in ex])
            if layout == "fused_xw":  # Qwen3-VL-MoE's released files: x . W
                gu, dn = gu.transpose(0, 2, 1), dn.transpose(0, 2, 1)
            fgu, fdn = row.get("fused_names", ("experts.gate_up_proj", "experts.down_proj"))
            if layout == "fused_halves":  # transformers' own names: gate_up_proj in halves
                fgu, fdn = "experts.gate_up_proj", "experts.down_proj"
            t[p + fgu] = ("BF16", gu.astype(np.float32))
            t[p + fdn] = ("BF16", dn.astype(np.float32))
            experts = [tuple(store(w, "BF16") for w in e) for e in ex]
        shared = sgate = None
        if Fs:
            sw = make_experts(rng, 1, D, Fs)[0]
            sp = p + row.get("shared_name", "shared_expert." if blk == "qwen2" else "shared_experts.")
            if row.get("shared_layer"):  # per projection, in the decoder layer
                sp = "%s%d.%s" % (root, l, row["shared_layer"])
            shared = []
            if row.get("shared_fused"):  # one fused pair in the block (gate rows, then up)
                t[sp + "gate_up_proj.weight"] = ("BF16", np.concatenate([sw[0], sw[1]], axis=0).astype(np.float32))
                t[sp + "down_proj.weight"] = ("BF16", sw[2].astype(np.float32))
                shared = [store(w, "BF16") for w in sw]
            if row.get("shared_beside"):  # one fused pair beside the block, in the decoder layer
                sb = "%s%d.%s" % (root, l, row["shared_beside"])
                t[sb + "input_linear.weight"] = ("BF16", np.concatenate([sw[0], sw[1]], axis=0).astype(np.float32))
                t[sb + "output_linear.weight"] = ("BF16", sw[2].astype(np.float32))
                shared = [store(w, "BF16") for w in sw]
            if act:  # ungated: up and down
                sw = sw[1:]
            for nm, w in zip(row.get("shared_names", ("up_proj", "down_proj") if act else ("gate_proj", "up_proj", "down_proj")),
                             sw if not (row.get("shared_beside") or row.get("shared_fused")) else ()):
                t[sp + nm + ".weight"] = ("BF16", w.astype(np.float32))
                shared.append(store(w, "BF16"))
            if blk == "qwen2" and not row.get("ungated"):
                g = rnd(rng, 1, D, scale=D ** -0.5)
                t[p + "shared_expert_gate.weight"] = ("BF16", g.astype(np.float32))
                sgate = store(g, "BF16")
        if row.get("dsv4") and l in hash_layers:
            tid2eid = rng.integers(0, E, (V, k))
            tid2eid[0, 1] = tid2eid[0, 0]  # an expert twice in a row: both slots count, as in transformers
            t[p + "gate.tid2eid"] = ("I64", tid2eid)
            routing = R.route_deepseek_v4(x, wr, None, k, scale, row.get("scoring", "sqrtsoftplus"), tid2eid, tok)
        elif row.get("dsv4"):
            bias = rnd(rng, E, scale=0.2) - 0.5
            t[p + row["bias"]] = ("F32", bias)
            routing = R.route_deepseek_v4(x, wr, store(bias, "F32"), k, scale, row.get("scoring", "sqrtsoftplus"))
        elif row.get("logits_bias"):
            bias = rnd(rng, E, scale=0.5)
            t["%s%d.%s" % (root, l, row["logits_bias"])] = ("F32", bias)
            routing = R.route_logits_bias(x, wr, store(bias, "F32"), k, norm)
        elif row.get("sparsemixer"):
            routing = R.route_sparsemixer(x, wr, jitter)
        elif row.get("sigmoid"):
            routing = R.route_sigmoid(x, wr, k, norm)
        elif blk in ("qwen3", "qwen2"):
            routing = R.route_softmax(x, wr, k, norm)
        elif blk == "ds2":
            routing = R.route_deepseek_v2(x, wr, k, 1, 1, scale, False)
        elif row.get("softmax") and row.get("bias"):
            bias = rnd(rng, E, scale=0.05)
            t[p + row["bias"]] = ("F32", bias.reshape(1, E) if row.get("bias_2d") else bias)
            routing = R.route_deepseek(x, wr, store(bias, "F32"), k, n_group[0], n_group[1], norm, scale, softmax_scores=True)
        elif row.get("softmax"):
            routing = R.route_deepseek(x, wr, None, k, n_group[0], n_group[1], norm, scale, softmax_scores=True, zero_mask=True)
        else:
            bias = rnd(rng, E, scale=0.2) - 1.0
            t[p + row.get("bias", "gate.e_score_correction_bias")] = ("F32", bias)
            routing = R.route_deepseek(x, wr, store(bias, "F32"), k, n_group[0], n_group[1], norm, scale, eps=row.get("norm_eps", 1e-20),
                                       zero_mask=row.get("zero_mask", False))
        ob = None
        if row.get("out_bias"):  # JetMoE: the block's output bias [D]
            ob = rnd(rng, D, scale=0.5)
            t[p + row["out_bias"]] = ("BF16", ob.astype(np.float32))
            ob = store(ob, "BF16")
        if act:
            refs[l] = R.ungated_block(x, routing, experts, shared, act)
        elif row.get("oss"):
            refs[l] = R.moe_block(x, routing, experts, shared, sgate, oss=oss)
            if not absent and rel(R.moe_block(x, routing, experts, shared, sgate, oss=(oss[0], 1e9)), refs[l]) < 1e-2:
                FAILS.append("%s: swiglu_limit does not clamp the test's values" % row["mt"])
        elif row.get("softcap"):
            refs[l] = R.moe_block(x, routing, experts, shared, sgate, softcap=softcap)
            if not absent and rel(R.moe_block(x, routing, experts, shared, sgate), refs[l]) < 1e-2:
                FAILS.append("%s: the softcaps do not bind on the test's values" % row["mt"])
        elif row.get("post"):
            lim, slim = post.get(l, (None, None))
            refs[l] = R.moe_block(x, routing, experts, shared, sgate, limit=lim, shared_limit=slim, post=True)
            if post and rel(R.moe_block(x, routing, experts, shared, sgate), refs[l]) < 1e-2:
                FAILS.append("%s: swiglu_limits do not clamp the test's values at layer %d" % (row["mt"], l))
        else:
            refs[l] = R.moe_block(x, routing, experts, shared, sgate, limit=limit, shared_limit=None if row.get("shared_plain") else limit,
                                  out_bias=ob)
        if limit is not None and not absent:  # the clamp must be doing something in this case
            plain = R.moe_block(x, routing, experts, shared, sgate)
            if rel(plain, refs[l]) < 1e-2:
                FAILS.append("%s: swiglu_limit %g does not clamp the test's values" % (row["mt"], limit))
    d = os.path.join(tmp, "%s_%d" % (row["mt"], len(os.listdir(tmp))))
    write_model(d, cfg, t)
    np.save(os.path.join(d, "ids.npy"), tok)  # the tokens' ids (int64), for the layers routed by token id
    return d, x, refs


def test_dbrx(tmp, rng):
    """DBRX: the keys under ffn_config, d_model and n_layers at the top, the
    layers at transformer.blocks.L.ffn., the experts stacked 2-D (w1 gate and
    v1 up [E*F, D] out x in, w2 [E*F, D] used as h . w2_e), weights divided
    by their p-norm (moe_normalize_expert_weights; null: none)."""
    E, k, D, F, T = 16, 4, 128, 96, 24
    for p in (1.0, None, 2.5, 0.5, "absent"):
        fc = {"moe_num_experts": E, "moe_top_k": k, "ffn_hidden_size": F, "ffn_act_fn": {"name": "silu"}}
        if p != "absent":
            fc["moe_normalize_expert_weights"] = p
        cfg = {"model_type": "dbrx", "d_model": D, "n_layers": 2, "ffn_config": fc}
        t, refs = {}, {}
        x = rnd(rng, T, D).astype(np.float32).astype(np.float64)
        for l in range(2):
            pre = "transformer.blocks.%d.ffn." % l
            wr = rnd(rng, E, D, scale=0.5)
            t[pre + "router.layer.weight"] = ("BF16", wr.astype(np.float32))
            ex = make_experts(rng, E, D, F)
            t[pre + "experts.mlp.w1"] = ("BF16", np.concatenate([g for g, _, _ in ex]).astype(np.float32))
            t[pre + "experts.mlp.v1"] = ("BF16", np.concatenate([u for _, u, _ in ex]).astype(np.float32))
            t[pre + "experts.mlp.w2"] = ("BF16", np.concatenate([d.T for _, _, d in ex]).astype(np.float32))
            experts = [tuple(store(w, "BF16") for w in e) for e in ex]
            routing = R.route_pnorm(x, store(wr, "BF16"), k, 1.0 if p == "absent" else p)
            refs[l] = R.moe_block(x, routing, experts)
        d = os.path.join(tmp, "dbrx_%s" % p)
        write_model(d, cfg, t)
        for l, ref in refs.items():
            got, _ = run(d, x, ("--layer", str(l)))
            check("dbrx bf16 stacked, moe_normalize_expert_weights %s, layer %d" % (p, l), got, ref, 1e-5)
    for key, val in (("moe_normalize_expert_weights", -1.0), ("ffn_act_fn", {"name": "gelu"})):
        fc2 = dict(fc, **{key: val})
        json.dump(dict(cfg, ffn_config=fc2), open(os.path.join(d, "config.json"), "w"))
        rc, out = info(d)
        if rc == 0 or key.split(".")[0] not in out:
            FAILS.append("dbrx %s %r" % (key, val))
            print("dbrx with %s %r (%d): %s" % (key, val, rc, out))


def test_ernie4_5_vl_moe(tmp, rng):
    """ERNIE-4.5-VL's text part (ernie4_5_vl_moe, text_config
    ernie4_5_vl_moe_text) in the names its files and transformers'
    save_pretrained write: the text router gate.weight [D, E] (in x out)
    beside the vision one (gate.weight_1), the selection bias
    moe_statics.e_score_correction_bias [2, E] (text row, vision row),
    experts.0..E-1 the text experts of width moe_intermediate_size[0] and
    experts.E..2E-1 the vision ones of width [1] (not read); the shared
    experts of width [0] x moe_num_shared_experts.  The text block is what
    transformers computes on text tokens: ERNIE-4.5's (softmax scores, the
    top-k of score + bias, weights / max(sum, moe_norm_min))."""
    E, k, D, F, Fv, T = 16, 4, 128, 96, 48, 24
    for absent in (False, True):
        nsh = 1 if not absent else 2
        text = {"model_type": "ernie4_5_vl_moe_text", "hidden_size": D, "num_hidden_layers": 3, "moe_num_experts": E, "moe_k": k,
                "moe_intermediate_size": [F, Fv]}
        if not absent:
            text.update(mlp_layer_types=["dense", "sparse", "sparse"], moe_num_shared_experts=nsh, moe_norm_min=1e-12)
        cfg = {"model_type": "ernie4_5_vl_moe", "text_config": text, "vision_config": {"hidden_size": 8}}
        t, refs = {}, {}
        x = rnd(rng, T, D).astype(np.float32).astype(np.float64)
        t["model.layers.0.mlp.gate_proj.weight"] = ("BF16", rnd(rng, 32, D).astype(np.float32))
        for l in (1, 2):
            p = "model.layers.%d.mlp." % l
            wr, wv = rnd(rng, E, D, scale=0.5), rnd(rng, E, D, scale=0.5)
            t[p + "gate.weight"] = ("BF16", wr.T.astype(np.float32))
            t[p + "gate.weight_1"] = ("BF16", wv.T.astype(np.float32))
            bias = rnd(rng, 2, E, scale=0.05)
            t[p + "moe_statics.e_score_correction_bias"] = ("F32", bias)
            experts = per_expert(t, p, make_experts(rng, E, D, F), ("gate_proj", "up_proj", "down_proj"), "BF16")
            for e, (g, u, dn) in enumerate(make_experts(rng, E, D, Fv)):  # the vision experts
                for nm, w in zip(("gate_proj", "up_proj", "down_proj"), (g, u, dn)):
                    t["%sexperts.%d.%s.weight" % (p, E + e, nm)] = ("BF16", w.astype(np.float32))
            sw = make_experts(rng, 1, D, F * nsh)[0]
            for nm, w in zip(("gate_proj", "up_proj", "down_proj"), sw):
                t[p + "shared_experts." + nm + ".weight"] = ("BF16", w.astype(np.float32))
            routing = R.route_deepseek(x, store(wr, "BF16"), store(bias[0], "F32"), k, 1, 1, True, 1.0, softmax_scores=True)
            refs[l] = R.moe_block(x, routing, experts, [store(w, "BF16") for w in sw], None)
            wrong = R.route_deepseek(x, store(wr, "BF16"), store(bias[1], "F32"), k, 1, 1, True, 1.0, softmax_scores=True)
            if rel(R.moe_block(x, wrong, experts, [store(w, "BF16") for w in sw], None), refs[l]) < 1e-3:
                FAILS.append("ernie4_5_vl_moe: the vision bias row chooses as the text one in the test's data")
        d = os.path.join(tmp, "ernie_vl_%d" % absent)
        write_model(d, cfg, t)
        for l, ref in refs.items():
            got, _ = run(d, x, ("--layer", str(l)))
            check("ernie4_5_vl_moe text bf16 per-expert%s, layer %d" % (" (defaults)" if absent else "", l), got, ref, 1e-5)
        rc, out = run_rc(d, x, ("--layer", "0"))
        if rc == 0 or "mlp_layer_types" not in out:
            FAILS.append("ernie4_5_vl_moe: dense layer 0 not refused by its key")
            print("ernie4_5_vl_moe layer 0 (%d): %s" % (rc, out))
    # moe_intermediate_size must be the [text, vision] list
    json.dump(dict(cfg, text_config=dict(text, moe_intermediate_size=F)), open(os.path.join(d, "config.json"), "w"))
    rc, out = info(d)
    if rc == 0 or "moe_intermediate_size" not in out:
        FAILS.append("ernie4_5_vl_moe: a scalar moe_intermediate_size not refused")
        print("ernie4_5_vl_moe scalar width (%d): %s" % (rc, out))


def test_inkling(tmp, rng):
    """Inkling (inkling_text; multimodal inkling_mm_model): the router
    scores the routed and the shared experts (gate.weight [E + S, D]),
    chooses the top-k of the routed by sigmoid + bias (bias [E]), and
    weights the k chosen and the S shared experts together, sigma over
    their sum, times route_scale x the layer's gate.global_scale; the
    routed experts fused (experts.gate_up_proj [E, 2F, D], down_proj),
    the shared ones stacked (shared_experts.gate_proj / up_proj [S, F, D],
    down_proj [S, D, F]), as InklingForCausalLM (model.layers.) and
    InklingTextModel (layers.) save them; the class's defaults (2 shared,
    route_scale 8, dense_mlp_idx 0)."""
    E, k, D, F, T = 16, 3, 96, 40, 24
    cases = (("model.layers.", False, None), ("layers.", True, None), ("model.language_model.layers.", False, "inkling_mm_model"))
    for root, absent, wrap in cases:
        S = 2 if absent else 3
        text = {"model_type": "inkling_text", "hidden_size": D, "num_hidden_layers": 3, "n_routed_experts": E, "num_experts_per_tok": k,
                "moe_intermediate_size": F}
        if not absent:
            text.update(n_shared_experts=S, route_scale=2.5, dense_mlp_idx=1)
        moe_layers = [0, 1, 2] if absent else [1, 2]
        cfg = {"model_type": wrap, "text_config": text} if wrap else text
        t, refs = {}, {}
        x = rnd(rng, T, D).astype(np.float32).astype(np.float64)
        for l in moe_layers:
            p = "%s%d.mlp." % (root, l)
            wr = rnd(rng, E + S, D, scale=0.3)
            bias = rnd(rng, E, scale=0.3)
            gscale = 0.625 + 0.25 * l
            t[p + "gate.weight"] = ("BF16", wr.astype(np.float32))
            t[p + "gate.e_score_correction_bias"] = ("F32", bias)
            t[p + "gate.global_scale"] = ("F32", np.array([gscale]))
            ex = make_experts(rng, E, D, F)
            t[p + "experts.gate_up_proj"] = ("BF16", np.stack([np.concatenate([g, u]) for g, u, _ in ex]).astype(np.float32))
            t[p + "experts.down_proj"] = ("BF16", np.stack([d for _, _, d in ex]).astype(np.float32))
            sh = make_experts(rng, S, D, F)
            for i, nm in enumerate(("gate_proj", "up_proj", "down_proj")):
                t[p + "shared_experts." + nm] = ("BF16", np.stack([e[i] for e in sh]).astype(np.float32))
            experts = [tuple(store(w, "BF16") for w in e) for e in ex + sh]
            routing = R.route_inkling(x, store(wr, "BF16"), store(bias, "F32"), k, S, (8.0 if absent else 2.5) * gscale)
            refs[l] = R.moe_block(x, routing, experts)
        d = os.path.join(tmp, "inkling_%s%d" % (wrap or "", absent))
        write_model(d, cfg, t)
        for l, ref in refs.items():
            got, _ = run(d, x, ("--layer", str(l)))
            check("inkling %s%sbf16, layer %d" % (wrap + " " if wrap else "", "defaults, " if absent else "", l), got, ref, 1e-5)
        if not absent and not wrap:
            rc, out = run_rc(d, x, ("--layer", "0"))
            if rc == 0 or "dense_mlp_idx" not in out:
                FAILS.append("inkling: dense layer 0 not refused naming dense_mlp_idx")
                print("inkling layer 0 (%d): %s" % (rc, out))
            json.dump(dict(text, n_shared_experts=0), open(os.path.join(d, "config.json"), "w"))
            rc, out = info(d)
            if rc == 0 or "n_shared_experts" not in out:
                FAILS.append("inkling: n_shared_experts 0 not refused")
                print("inkling n_shared_experts 0 (%d): %s" % (rc, out))


def test_aria(tmp, rng):
    """Aria (aria_text; multimodal aria): the top-k of the router's logits
    weighted by their softmax (Mixtral's routing), the experts fused x . W
    as experts.fc1.weight [E, D, 2F] (gate, then up) and fc2.weight
    [E, F, D], router.weight, and moe_num_shared_experts ungated shared
    experts of the experts' width as one MLP shared_experts.* of width
    count x intermediate_size, as AriaTextForCausalLM saves them; every
    layer MoE; the class's defaults (top-2, 2 shared)."""
    E, D, F, T = 8, 96, 40, 24
    for absent, wrap in ((False, None), (True, None), (False, "aria")):
        k, nsh = (2, 2) if absent else (3, 1)
        text = {"model_type": "aria_text", "hidden_size": D, "num_hidden_layers": 2, "moe_num_experts": E, "intermediate_size": F}
        if not absent:
            text.update(moe_topk=k, moe_num_shared_experts=nsh)
        cfg = {"model_type": wrap, "text_config": text} if wrap else text
        root = "model.language_model.layers." if wrap else "model.layers."
        t, refs = {}, {}
        x = rnd(rng, T, D).astype(np.float32).astype(np.float64)
        for l in (0, 1):
            p = "%s%d.mlp." % (root, l)
            wr = rnd(rng, E, D, scale=0.5)
            t[p + "router.weight"] = ("BF16", wr.astype(np.float32))
            ex = make_experts(rng, E, D, F)
            t[p + "experts.fc1.weight"] = ("BF16", np.stack([np.concatenate([g, u]).T for g, u, _ in ex]).astype(np.float32))
            t[p + "experts.fc2.weight"] = ("BF16", np.stack([d.T for _, _, d in ex]).astype(np.float32))
            sw = make_experts(rng, 1, D, F * nsh)[0]
            for nm, w in zip(("gate_proj", "up_proj", "down_proj"), sw):
                t[p + "shared_experts." + nm + ".weight"] = ("BF16", w.astype(np.float32))
            experts = [tuple(store(w, "BF16") for w in e) for e in ex]
            refs[l] = R.moe_block(x, R.route_softmax(x, store(wr, "BF16"), k, True), experts, [store(w, "BF16") for w in sw])
        d = os.path.join(tmp, "aria_%s%d" % (wrap or "", absent))
        write_model(d, cfg, t)
        for l, ref in refs.items():
            got, _ = run(d, x, ("--layer", str(l)))
            check("aria %s%sbf16 fused x.W, layer %d" % (wrap + " " if wrap else "", "defaults, " if absent else "", l), got, ref, 1e-5)
def test_longcat_flash(tmp, rng):
    """LongCat-Flash: softmax over n_routed_experts + zero_expert_num, the
    top-k of score + router.e_score_correction_bias, weights the scores x
    routed_scaling_factor (6.0 when absent), an id past the routed experts an
    identity expert (its slot adds w x); the router mlp.router.classifier.weight
    [E + Z, D]; per expert as save_pretrained writes them (gate_proj/up_proj for
    every id, down_proj for the routed ones) or fused (gate_up_proj [E + Z, 2F, D],
    down_proj [E, D, F]); num_layers its layers."""
    E, Z, k, D, F, T = 16, 8, 4, 128, 96, 24
    for layout in ("per", "fused", "absent"):
        cfg = {"model_type": "longcat_flash", "n_routed_experts": E, "zero_expert_num": Z, "moe_topk": k, "hidden_size": D,
               "expert_ffn_hidden_size": F, "num_layers": 2}
        scale = 6.0
        if layout != "absent":
            scale = cfg["routed_scaling_factor"] = 1.75
        t, refs = {}, {}
        x = rnd(rng, T, D).astype(np.float32).astype(np.float64)
        for l in range(2):
            p = "model.layers.%d.mlp." % l
            wr = rnd(rng, E + Z, D, scale=0.5)
            t[p + "router.classifier.weight"] = ("BF16", wr.astype(np.float32))
            bias = rnd(rng, E + Z, scale=0.05) + np.where(np.arange(E + Z) >= E, 0.03, 0.0)
            t[p + "router.e_score_correction_bias"] = ("F32", bias)
            ex = make_experts(rng, E + Z, D, F)  # the identity ids' gate/up rows are in the files, never used
            if layout == "fused":
                t[p + "experts.gate_up_proj"] = ("BF16", np.stack([np.concatenate([g, u]) for g, u, _ in ex]).astype(np.float32))
                t[p + "experts.down_proj"] = ("BF16", np.stack([w for _, _, w in ex[:E]]).astype(np.float32))
            else:
                for e, (g, u, w) in enumerate(ex):
                    t[p + "experts.%d.gate_proj.weight" % e] = ("BF16", g.astype(np.float32))
                    t[p + "experts.%d.up_proj.weight" % e] = ("BF16", u.astype(np.float32))
                    if e < E:
                        t[p + "experts.%d.down_proj.weight" % e] = ("BF16", w.astype(np.float32))
            experts = [tuple(store(w, "BF16") for w in e) for e in ex[:E]] + [None] * Z
            routing = R.route_deepseek(x, store(wr, "BF16"), store(bias, "F32"), k, 1, 1, False, scale, softmax_scores=True)
            nid = int((routing[0] >= E).sum())
            if nid == 0 or nid == routing[0].size:
                FAILS.append("longcat_flash: %d of %d slots on identity experts (want some)" % (nid, routing[0].size))
            refs[l] = R.moe_block(x, routing, experts)
        d = os.path.join(tmp, "longcat_%s" % layout)
        write_model(d, cfg, t)
        for l, ref in refs.items():
            got, _ = run(d, x, ("--layer", str(l)))
            check("longcat_flash bf16 %s, layer %d" % (layout, l), got, ref, 1e-5)
    rc, out = info(d)
    if rc != 0 or "longcat_flash" not in out or "identity experts" not in out:
        FAILS.append("longcat_flash info")
        print("longcat_flash info (%d): %s" % (rc, out))
    for key, val in (("router_bias", True), ("num_hidden_layers", 5)):
        json.dump(dict(cfg, **{key: val}), open(os.path.join(d, "config.json"), "w"))
        rc, out = info(d)
        if rc == 0 or key not in out:
            FAILS.append("longcat_flash %s %r" % (key, val))
            print("longcat_flash with %s %r (%d): %s" % (key, val, rc, out))


def switch_ref(x, wr, br, experts, cap, seq, act="relu", act_q=None, wq=None, mutate=None):
    """SwitchTransformersSparseMLP in float64, written from transformers'
    code: x [T, D] is [T / seq, seq, D] (seq None: one sequence); the router
    (SwitchTransformersTop1Router) logits x Wr^T (+ b), softmax, the argmax
    expert, its probability the weight (no renormalization); expert_index =
    one_hot(argmax), token_priority = cumsum over the sequence (inclusive),
    kept where token_priority <= expert_capacity, the others' output 0;
    experts[e] = (wi [F, D], wo [D, F]): wo(act(wi x)).  act_q: the
    activation quantizer (x and h), wq: the weights as quantized.
    mutate: "global" counts over all tokens, "exclusive" an exclusive
    cumsum (capacity rules that are not the model's; the test must tell).
    Returns (y, number of dropped tokens)."""
    a = (lambda v: np.maximum(v, 0.0) ** 2) if act == "relu2" else (lambda v: np.maximum(v, 0.0))
    T = x.shape[0]
    S = T if seq is None or mutate == "global" else seq
    p = R.softmax(x @ wr.T + (0.0 if br is None else br))
    idx, w = p.argmax(-1), p.max(-1)
    out, dropped = np.zeros_like(x), 0
    for b in range(T // S):
        n = np.zeros(wr.shape[0], dtype=np.int64)
        for t in range(b * S, (b + 1) * S):
            e = idx[t]
            n[e] += 1
            if (n[e] - 1 if mutate == "exclusive" else n[e]) > cap:
                dropped += 1
                continue
            wi, wo = (wq or experts)[e]
            xa = act_q(x[t:t + 1]) if act_q else x[t:t + 1]
            h = a(xa @ wi.T)
            if act_q:
                h = act_q(h)
            out[t] = w[t] * (h @ wo.T)[0]
    return out, dropped


def test_switch_transformers(tmp, rng):
    """SwitchTransformers: the encoder's and the decoder's sparse blocks
    (encoder.block.i.layer.1.mlp., decoder.block.i.layer.2.mlp.; moe8's
    layers 0..n-1 then n..n+m-1), block i sparse when i % step == 1 or
    step == 1 (step = layers // sparse layers; num_layers for 0 sparse
    layers, which still makes block 1 sparse), top-1 of the f32 softmax
    weighted by its probability, tokens past expert_capacity in their
    sequence dropped (output +0.0), experts.expert_N.wi / wo, router
    router.classifier.weight (and .bias).  bf16 files; several sequences
    (--seq-len) with the capacity binding; the fused path under FP8 rules;
    the dense blocks, dense_act_fn and router_dtype refused by name."""
    E, D, F, T, cap, S = 4, 128, 96, 48, 3, 12
    cfg = {"model_type": "switch_transformers", "d_model": D, "num_layers": 4, "num_decoder_layers": 3, "num_sparse_encoder_layers": 2,
           "num_sparse_decoder_layers": 0, "num_experts": E, "d_ff": F, "expert_capacity": cap, "router_bias": True}
    # encoder: step 2 -> blocks 1, 3; decoder: 0 sparse layers -> step 3 -> block 1 (transformers' rule)
    sparse = {1: "encoder.block.1.layer.1.mlp.", 3: "encoder.block.3.layer.1.mlp.", 5: "decoder.block.1.layer.2.mlp."}
    t, params = {}, {}
    x = rnd(rng, T, D).astype(np.float32).astype(np.float64)
    for l, p in sparse.items():
        wr = rnd(rng, E, D, scale=0.3)
        br = rnd(rng, E, scale=0.2)
        t[p + "router.classifier.weight"] = ("BF16", wr.astype(np.float32))
        t[p + "router.classifier.bias"] = ("BF16", br.astype(np.float32))
        ex = [(rnd(rng, F, D, scale=D ** -0.5), rnd(rng, D, F, scale=F ** -0.5)) for _ in range(E)]
        for e, (wi, wo) in enumerate(ex):
            t[p + "experts.expert_%d.wi.weight" % e] = ("BF16", wi.astype(np.float32))
            t[p + "experts.expert_%d.wo.weight" % e] = ("BF16", wo.astype(np.float32))
        params[l] = (store(wr, "BF16"), store(br, "BF16"), [tuple(store(w, "BF16") for w in e) for e in ex])
    d = os.path.join(tmp, "switch")
    write_model(d, cfg, t)
    for l, (wr, br, ex) in params.items():
        for seq in (S, None):
            ref, dropped = switch_ref(x, wr, br, ex, cap, seq)
            if dropped == 0 or dropped == T:
                FAILS.append("switch_transformers layer %d: %d of %d tokens dropped (want some)" % (l, dropped, T))
            got, _ = run(d, x, ("--layer", str(l)) + (("--seq-len", str(seq)) if seq else ()))
            check("switch_transformers bf16 layer %d, seq %s, %d dropped" % (l, seq or T, dropped), got, ref, 1e-5)
            zero = np.all(ref == 0.0, axis=1)
            if not (np.all(got[zero] == 0.0) and not np.any(np.signbit(got[zero]))):
                FAILS.append("switch_transformers layer %d: a dropped token's output is not +0.0" % l)
            for m in ("global", "exclusive"):  # the capacity rule mutated: the comparison must see it
                if seq and rel(got, switch_ref(x, wr, br, ex, cap, seq, mutate=m)[0]) <= 1e-5:
                    FAILS.append("switch_transformers layer %d: the %s capacity rule not told apart" % (l, m))
    # the fused path under FP8 rules (quantizers emulated), several sequences
    rp = os.path.join(tmp, "switch_rules.json")
    with open(rp, "w") as f:
        json.dump(RULES_FP8, f)
    wr, br, ex = params[5]
    q = lambda w: R.quant_cols(w.T, 128).T
    ref, _ = switch_ref(x, wr, br, ex, cap, S, act_q=lambda v: R.quant_rows(v, 128), wq=[tuple(q(w) for w in e) for e in ex])
    got, _ = run(d, x, ("--layer", "5", "--seq-len", str(S), "--rules", rp))
    check("switch_transformers FP8 by rules, layer 5 (quantizers emulated)", got, ref, 1e-4)
    rc, out = info(d)
    if rc != 0 or "switch_transformers" not in out or "expert capacity 3" not in out or "moe layers: 1 3 5 " not in out:
        FAILS.append("switch_transformers info")
        print("switch_transformers info (%d): %s" % (rc, out))
    for l, key in ((0, "encoder.block.0.layer.1.mlp.wi.weight"), (4, "decoder.block.0.layer.2.mlp.wi.weight"), (6, "decoder.block.2")):
        rc, out = run_rc(d, x, ("--layer", str(l)))
        if rc == 0 or key not in out:
            FAILS.append("switch_transformers dense layer %d" % l)
            print("switch_transformers dense layer %d (%d): %s" % (l, rc, out))
    rc, out = run_rc(d, x, ("--layer", "1", "--seq-len", "7"))
    if rc == 0 or "seq_len" not in out:
        FAILS.append("switch_transformers --seq-len 7 of 48 rows")
    for key, val in (("dense_act_fn", "gelu"), ("router_dtype", "bfloat16"), ("expert_capacity", 0)):
        json.dump(dict(cfg, **{key: val}), open(os.path.join(d, "config.json"), "w"))
        rc, out = info(d)
        if rc == 0 or key not in out:
            FAILS.append("switch_transformers %s %r" % (key, val))
            print("switch_transformers with %s %r (%d): %s" % (key, val, rc, out))
    json.dump(dict(cfg, router_jitter_noise=0.5), open(os.path.join(d, "config.json"), "w"))  # training-only: runs
    got, _ = run(d, x, ("--layer", "1", "--seq-len", str(S)))
    check("switch_transformers router_jitter_noise 0.5 (training only)", got, switch_ref(x, *params[1], cap, S)[0], 1e-5)


def test_doge(tmp, rng):
    """Doge (DogeConfig with is_moe, DogeCDMoE): product-key routing over
    router_gate's 2 x N keys (N = floor(sqrt(E)); E = 40 is not a square:
    experts 36..39 are never chosen), transformers' view(2, T, N) of the
    call's logits (several tokens: a token's halves are other tokens';
    the per-token split must be told apart), the top-k of the N^2 sums,
    softmax; single silu neurons down_embed / up_embed [E, D] and the
    dense SwiGLU added; every layer MoE.  f32 and bf16 files, T = 1 and
    odd T, norm_topk_prob; FP8 rules (the tables quantized per expert row,
    128-blocks along D; x per token) against the reference with the
    quantizers emulated; moe8 quantize's files of it (doge_quantized);
    is_moe false, hidden_act, mlp_bias, a top-k past the candidates and a
    missing table refused by name."""
    E, k, D, Fs, N = 40, 5, 64, 96, 6
    kept = None  # the f32 file of 9 tokens: its config, tensors and values
    for dt, norm, T in (("F32", False, 9), ("BF16", True, 7), ("F32", False, 1)):
        cfg = {"model_type": "doge", "is_moe": True, "hidden_size": D, "intermediate_size": Fs, "num_hidden_layers": 2,
               "num_experts": E, "num_experts_per_tok": k, "norm_topk_prob": norm, "hidden_act": "silu"}
        t, params = {}, []
        for layer in range(2):
            p = "model.layers.%d.mlp." % layer
            w = {"router_gate": rnd(rng, 2 * N, D, scale=D ** -0.5), "down_embed": rnd(rng, E, D, scale=D ** -0.5),
                 "up_embed": rnd(rng, E, D), "gate_proj": rnd(rng, Fs, D, scale=D ** -0.5), "up_proj": rnd(rng, Fs, D, scale=D ** -0.5),
                 "down_proj": rnd(rng, D, Fs, scale=Fs ** -0.5)}
            for n, a in w.items():
                t[p + n + ".weight"] = (dt, a.astype(np.float32))
            params.append({n: store(a, dt) for n, a in w.items()})
        d = os.path.join(tmp, "doge_%s_%d" % (dt, T))
        write_model(d, cfg, t)
        x = rnd(rng, T, D).astype(np.float32).astype(np.float64)
        for layer, w in enumerate(params):
            dense = (w["gate_proj"], w["up_proj"], w["down_proj"])
            ref, ids = R.doge_block(x, w["router_gate"], w["down_embed"], w["up_embed"], k, norm, dense)
            if ids.max() >= N * N:
                FAILS.append("doge: the reference chose an expert past N^2")
            got, _ = run(d, x, ("--layer", str(layer)))
            check("doge %s layer %d, T %d%s" % (dt.lower(), layer, T, ", norm_topk_prob" if norm else ""), got, ref, 1e-5)
            alt, _ = R.doge_block(x, w["router_gate"], w["down_embed"], w["up_embed"], k, norm, dense, per_token=True)
            if T > 1 and rel(got, alt) <= 1e-5:
                FAILS.append("doge: the per-token split (not transformers' view) not told apart")
        if dt == "F32" and T == 9:
            kept = (d, cfg, t, params[1])
    # FP8 rules on the f32 file of 9 tokens, layer 1
    d, cfg, t, from_file = kept
    x = rnd(rng, 9, D).astype(np.float32).astype(np.float64)
    rp = os.path.join(tmp, "doge_rules.json")
    with open(rp, "w") as f:
        json.dump(RULES_FP8, f)
    q = lambda w: R.quant_cols(w.T, 128).T  # a Linear's [out, in] per output column, 128-blocks along in
    ref, _ = R.doge_block(x, from_file["router_gate"], R.quant_rows(from_file["down_embed"], 128), R.quant_rows(from_file["up_embed"], 128),
                          k, False, tuple(q(from_file[n]) for n in ("gate_proj", "up_proj", "down_proj")),
                          act_q=lambda v: R.quant_rows(v, 128))
    got, _ = run(d, x, ("--layer", "1", "--rules", rp))
    check("doge FP8 by rules, layer 1 (quantizers emulated)", got, ref, 1e-4)
    rc, out = info(d)
    if rc != 0 or "product keys" not in out or "moe layers: 0-1" not in out:
        FAILS.append("doge info")
        print("doge info (%d): %s" % (rc, out))
    doge_quantized(tmp, d, x, E, D)
    for key, val in (("is_moe", False), ("hidden_act", "gelu"), ("mlp_bias", True), ("num_experts_per_tok", 37)):
        json.dump(dict(cfg, **{key: val}), open(os.path.join(d, "config.json"), "w"))
        rc, out = info(d)
        if rc == 0 or key not in out:
            FAILS.append("doge %s %r" % (key, val))
            print("doge with %s %r (%d): %s" % (key, val, rc, out))
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    R.write_safetensors(os.path.join(d, "model.safetensors"), {n: v for n, v in t.items() if "up_embed" not in n})
    rc, out = run_rc(d, x, ("--layer", "0"))
    if rc == 0 or "model.layers.0.mlp.up_embed.weight" not in out:
        FAILS.append("doge: a missing up_embed not named")
        print("doge without up_embed (%d): %s" % (rc, out))


DOGE_RULES = {"fp8": dict(weight_qtype="float8_e4m3fn", act_qtype="float8_e4m3fn", tile_size=128),
              "int8": dict(weight_qtype="int8", act_qtype="int8", tile_size=32),
              # a calibration: the dense SwiGLU, quantized at the file's load, must take it as the input's load does
              "int8 pow2": dict(weight_qtype="int8", act_qtype="int8", tile_size=32, weight_calibration_method="absmax_pow2,0.9")}


def _st_read(path):
    """A safetensors file as (header without __metadata__, __metadata__, name -> bytes)."""
    import struct as S
    with open(path, "rb") as f:
        n = S.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
        data = f.read()
    meta = h.pop("__metadata__", None)
    return h, meta, {k: data[v["data_offsets"][0]:v["data_offsets"][1]] for k, v in h.items()}


def _st_write(path, h, meta, raw):
    """The tensors of raw (name -> bytes) with h's dtypes and shapes (and meta) as a safetensors file."""
    import struct as S
    out, blobs, off = {}, [], 0
    if meta is not None:
        out["__metadata__"] = meta
    for k in sorted(raw):
        out[k] = {"dtype": h[k]["dtype"], "shape": h[k]["shape"], "data_offsets": [off, off + len(raw[k])]}
        blobs.append(raw[k])
        off += len(raw[k])
    hb = json.dumps(out).encode()
    hb += b" " * ((8 - len(hb) % 8) % 8)
    with open(path, "wb") as f:
        f.write(S.pack("<Q", len(hb)) + hb + b"".join(blobs))


def doge_quantized(tmp, d, x, E, D):
    """moe8 quantize of a Doge checkpoint (two layers, E 40, D 64) under
    FP8 and int8 rules: both tables as codes down_embed / up_embed.qweight
    [E, D] with .scale [E, nb, 1, 1] per expert row (nb = ceil(D / tile)),
    no float table left, the router and the dense SwiGLU copied byte for
    byte; a run of each layer without rules gives the bytes of the input's
    run under the rule, the training load too; moe8 info names the family
    and the format.  MXFP4, the deepseek format and a quantized input
    refused naming the reason; a file whose table or scale tensor is
    missing, misshapen, of another dtype, or beside a float table refused
    naming the tensor (and its shape), never a crash."""
    qf = None
    for kind in ("fp8", "int8", "int8 pow2"):
        rule = DOGE_RULES[kind]
        rules = _rule_file(tmp, "doge_" + kind.replace(" ", "_"), **rule)
        q = os.path.join(tmp, "doge_q_" + kind.replace(" ", "_"))
        p = subprocess.run([MOE8, "quantize", d, q, "--rules", rules], capture_output=True, text=True)
        if p.returncode != 0:
            FAILS.append("doge quantize " + kind)
            print("doge: moe8 quantize %s failed (%d): %s" % (kind, p.returncode, p.stderr.strip()))
            continue
        hi, _, ri = _st_read(os.path.join(d, "model.safetensors"))
        ho, meta, ro = _st_read(os.path.join(q, "model.safetensors"))
        nb, cdt = -(-D // rule["tile_size"]), "F8_E4M3" if kind == "fp8" else "I8"
        want = {"model.layers.%d.mlp.%s.%s" % (l, t, w): ([E, D], cdt) if w == "qweight" else ([E, nb, 1, 1], "F32")
                for l in (0, 1) for t in ("down_embed", "up_embed") for w in ("qweight", "scale")}
        codes = all(n in ho and (ho[n]["shape"], ho[n]["dtype"]) == sw for n, sw in want.items())
        others = [n for n in hi if "_embed." not in n]  # router_gate, gate_proj, up_proj, down_proj
        copied = all(n in ho and ro[n] == ri[n] for n in others) and set(ho) == set(want) | set(others)
        if not codes or not copied:
            FAILS.append("doge %s file's tensors" % kind)
            print("doge %s file: codes and scales %s; the rest copied, nothing else: %s; tensors %s" %
                  (kind, codes, copied, sorted((n, ho[n]["dtype"], ho[n]["shape"]) for n in ho if "_embed." in n)))
        for l in (0, 1):
            for extra in ((), ("--training-load",)):
                rc_a, out_a = run_rc(d, x, ("--layer", str(l), "--rules", rules) + extra)
                a = np.load(os.path.join(d, "y.npy")) if rc_a == 0 else None
                rc_b, out_b = run_rc(q, x, ("--layer", str(l)) + extra)
                b = np.load(os.path.join(q, "y.npy")) if rc_b == 0 else None
                same = a is not None and b is not None and a.tobytes() == b.tobytes()
                what = "doge %s file, layer %d%s: the input's bytes under the rule" % (kind, l, ", training load" if extra else "")
                print("%-58s %s" % (what, "ok" if same else "FAIL: %s %s" % (out_a.strip()[-200:], out_b.strip()[-200:])))
                if not same:
                    FAILS.append(what)
        rc, out = info(q)
        fmt = "moe8 %s product-key tables [E,%d,1,1]" % ("f8e4m3" if kind == "fp8" else "i8", nb)
        if rc != 0 or '"doge"' not in out or fmt not in out:
            FAILS.append("doge %s file info" % kind)
            print("doge %s file info (%d): %s" % (kind, rc, out))
        if kind == "fp8":
            qf = q
    for name, rule, fmt, why in (("mxfp4", dict(weight_qtype="mxfp4"), "moe8", "mxfp4"),
                                 ("deepseek", DOGE_RULES["fp8"], "deepseek", "deepseek format")):
        q = os.path.join(tmp, "doge_q_" + name)
        p = subprocess.run([MOE8, "quantize", d, q, "--rules", _rule_file(tmp, "doge_" + name, **rule), "--format", fmt],
                           capture_output=True, text=True)
        if p.returncode in (0, -6, -11) or "product-key" not in p.stderr or why not in p.stderr or os.path.exists(q):
            FAILS.append("doge quantize %s not refused naming the reason" % name)
            print("doge quantize %s (%d): %s" % (name, p.returncode, p.stderr.strip()))
    if qf is None:
        return
    p = subprocess.run([MOE8, "quantize", qf, qf + "_again", "--rules", _rule_file(tmp, "doge_fp8", **DOGE_RULES["fp8"])],
                       capture_output=True, text=True)
    if p.returncode == 0 or "already quantized" not in p.stderr:
        FAILS.append("doge: a quantized file quantized again")
        print("doge quantize of its moe8 file (%d): %s" % (p.returncode, p.stderr.strip()))
    # Bad files: each a copy of the FP8 file with one tensor missing, misshapen, of another dtype or doubled
    h, meta, raw = _st_read(os.path.join(qf, "model.safetensors"))
    P = "model.layers.1.mlp."
    bad = []

    def case(name, edit, *words):
        hh, rr = json.loads(json.dumps(h)), dict(raw)
        edit(hh, rr)
        bd = os.path.join(tmp, "doge_bad_" + name)
        shutil.copytree(qf, bd)
        _st_write(os.path.join(bd, "model.safetensors"), hh, meta, rr)
        rc, out = run_rc(bd, x, ("--layer", "1"))
        if rc <= 0 or not all(w in out for w in words):  # refused (no crash: a signal is a negative code), naming it
            bad.append(name)
            print("doge bad file, %s (%d): %s" % (name, rc, out.strip()))

    def drop(n):
        return lambda hh, rr: rr.pop(n)

    def reshape(n, shape, dt=None, nbytes=None):
        def f(hh, rr):
            hh[n]["shape"] = shape
            hh[n]["dtype"] = dt or hh[n]["dtype"]
            rr[n] = bytes(nbytes) if nbytes is not None else rr[n]
        return f

    def add_float(hh, rr):
        hh[P + "down_embed.weight"] = {"dtype": "F32", "shape": [E, D]}
        rr[P + "down_embed.weight"] = bytes(4 * E * D)

    def zero_scale(hh, rr):
        rr[P + "down_embed.scale"] = bytes(4) + rr[P + "down_embed.scale"][4:]

    case("up_embed.scale missing", drop(P + "up_embed.scale"), P + "up_embed.scale", "[%d, 1, 1, 1]" % E)
    case("up_embed.qweight missing", drop(P + "up_embed.qweight"), P + "up_embed.qweight", "[%d, %d]" % (E, D))
    case("down_embed.scale [E, 2, 1, 1]", reshape(P + "down_embed.scale", [E, 2, 1, 1], nbytes=8 * E), P + "down_embed.scale",
         "[%d, 2, 1, 1]" % E, "[%d, 1, 1, 1]" % E)
    case("down_embed.qweight [E, D/2]", reshape(P + "down_embed.qweight", [E, D // 2], nbytes=E * D // 2), P + "down_embed.qweight",
         "[%d, %d]" % (E, D // 2), "[%d, %d]" % (E, D))
    case("up_embed.scale BF16", reshape(P + "up_embed.scale", [E, 1, 1, 1], "BF16", 2 * E), P + "up_embed.scale", "BF16")
    case("up_embed.qweight I8 beside F8_E4M3", reshape(P + "up_embed.qweight", [E, D], "I8"), P + "up_embed.qweight", "I8")
    case("down_embed.scale zero", zero_scale, P + "down_embed.scale", "positive")
    case("a float down_embed beside the codes", add_float, P + "down_embed.weight", "ambiguous")
    print("%-58s %s" % ("doge quantized files with a bad table or scale: refused by name", "FAIL: " + ", ".join(bad) if bad else "ok"))
    if bad:
        FAILS.append("doge bad files: " + ", ".join(bad))


def test_nllb_moe(tmp, rng):
    """NLLB-MoE as transformers 4.x computes it in eval mode (hfref
    nllb_moe_block; 5.24's block runs only experts 0 and 1): the encoder's
    and the decoder's sparse layers (model.encoder.layers.i.ffn.,
    model.decoder.layers.i.ffn.; moe8's layers 0..n-1 then n..n+m-1), layer
    i sparse when (i + 1) % step == 0; top-2 of the f32 softmax, the
    capacity ceil(moe_eval_capacity_token_fraction x T) over all T rows,
    every first choice queued before the second ones, the kept pair
    renormalized by max(sum, eps), times 1 - moe_token_dropout (0.2 by
    default); experts.expert_N.fc1 / fc2 with biases.  bf16 files; choices
    of both ranks dropped; the capacity from expert_capacity when the
    fraction is 0; moe8 quantize's FP8 and int8 files of it, the experts'
    biases kept (nllb_quantized; MXFP4 refused naming the shape, F being
    48); the dense layers, a missing bias and the keys moe8 does not
    compute refused by name."""
    E, D, F, T = 4, 64, 48, 48
    cfg = {"model_type": "nllb-moe", "d_model": D, "encoder_layers": 4, "decoder_layers": 4, "encoder_sparse_step": 2,
           "decoder_sparse_step": 4, "num_experts": E, "encoder_ffn_dim": F, "decoder_ffn_dim": F, "router_bias": True,
           "moe_eval_capacity_token_fraction": 0.3, "expert_capacity": 64}
    # encoder: layers 1, 3 (moe8 1, 3); decoder: layer 3 (moe8 7)
    sparse = {1: "model.encoder.layers.1.ffn.", 3: "model.encoder.layers.3.ffn.", 7: "model.decoder.layers.3.ffn."}
    t, params = {}, {}
    x = rnd(rng, T, D).astype(np.float32).astype(np.float64)
    for l, p in sparse.items():
        wr = rnd(rng, E, D, scale=0.3)
        br = rnd(rng, E, scale=0.3)
        t[p + "router.classifier.weight"] = ("BF16", wr.astype(np.float32))
        t[p + "router.classifier.bias"] = ("BF16", br.astype(np.float32))
        ex = [(rnd(rng, F, D, scale=D ** -0.5), rnd(rng, F, scale=0.2), rnd(rng, D, F, scale=F ** -0.5), rnd(rng, D, scale=0.2))
              for _ in range(E)]
        for e, ws in enumerate(ex):
            for nm, w in zip(("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"), ws):
                t[p + "experts.expert_%d.%s" % (e, nm)] = ("BF16", w.astype(np.float32))
        params[l] = (store(wr, "BF16"), store(br, "BF16"), [tuple(store(w, "BF16") for w in e) for e in ex])
    d = os.path.join(tmp, "nllb")
    write_model(d, cfg, t)
    for l, (wr, br, ex) in params.items():
        ref, dropped = R.nllb_moe_block(x, wr, br, ex, 0.3, 0.2)
        if not 0 < dropped < T:
            FAILS.append("nllb-moe layer %d: %d of %d choices dropped (want some)" % (l, dropped, 2 * T))
        got, _ = run(d, x, ("--layer", str(l)))
        check("nllb-moe bf16 layer %d, %d choices dropped" % (l, dropped), got, ref, 1e-5)
        for m in ("interleaved", "before"):  # the capacity rule or the normalization mutated: the comparison must see it
            if rel(got, R.nllb_moe_block(x, wr, br, ex, 0.3, 0.2, mutate=m)[0]) <= 1e-5:
                FAILS.append("nllb-moe layer %d: the %s rule not told apart" % (l, m))
        if rel(got, R.nllb_moe_block(x, wr, br, ex, 0.3, 0.0)[0]) <= 1e-5:
            FAILS.append("nllb-moe layer %d: moe_token_dropout's scaling not told apart" % l)
    # moe8 quantize: FP8 and int8 codes with the experts' biases kept as floats beside them; MXFP4 needs
    # F (48 here) a multiple of 32: refused naming the shape (test_nllb_moe_files runs it on F = 64)
    nllb_quantized(tmp, d, x, sorted(sparse), ("fp8", "int8"), "nllb-moe")
    q = d + "_qmxfp4"
    p = subprocess.run([MOE8, "quantize", d, q, "--rules", _weight_rule(tmp, "mxfp4")], capture_output=True, text=True)
    ok = p.returncode != 0 and "multiples of 32" in p.stderr and not os.path.exists(q)
    print("%-58s %s" % ("nllb-moe F = 48, quantize mxfp4: refused naming the shape", "ok" if ok else "FAIL: " + p.stderr.strip()))
    if not ok:
        FAILS.append("nllb-moe mxfp4 with F = 48 not refused")
    # the capacity from expert_capacity (the fraction 0), relu2, no dropout
    wr, br, ex = params[7]
    json.dump(dict(cfg, moe_eval_capacity_token_fraction=0.0, expert_capacity=10, moe_token_dropout=0.0, activation_function="relu2"),
              open(os.path.join(d, "config.json"), "w"))
    ref, dropped = R.nllb_moe_block(x, wr, br, ex, 0.0, 0.0, cap=10, act="relu2")
    got, _ = run(d, x, ("--layer", "7"))
    check("nllb-moe expert_capacity 10, relu2, %d dropped" % dropped, got, ref, 1e-5)
    if dropped < T // 2:
        FAILS.append("nllb-moe expert_capacity 10: %d dropped (want many)" % dropped)
    zero = np.all(ref == 0.0, axis=1)
    if not zero.any() or not (np.all(got[zero] == 0.0) and not np.any(np.signbit(got[zero]))):
        FAILS.append("nllb-moe: a token with both choices dropped is not +0.0 (%d such)" % int(zero.sum()))
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    rc, out = info(d)
    if rc != 0 or "nllb-moe" not in out or "moe layers: 1 3 7 " not in out:
        FAILS.append("nllb-moe info")
        print("nllb-moe info (%d): %s" % (rc, out))
    for l, key in ((0, "model.encoder.layers.0.ffn.fc1.weight"), (4, "model.decoder.layers.0.ffn.fc1.weight"), (6, "decoder_sparse_step")):
        rc, out = run_rc(d, x, ("--layer", str(l)))
        if rc == 0 or key not in out:
            FAILS.append("nllb-moe dense layer %d" % l)
            print("nllb-moe dense layer %d (%d): %s" % (l, rc, out))
    for key, val in (("second_expert_policy", "sampling"), ("normalize_router_prob_before_dropping", True),
                     ("batch_prioritized_routing", True), ("router_dtype", "bfloat16"), ("activation_function", "gelu"),
                     ("decoder_ffn_dim", 2 * F), ("moe_token_dropout", 1.0)):
        json.dump(dict(cfg, **{key: val}), open(os.path.join(d, "config.json"), "w"))
        rc, out = info(d)
        if rc == 0 or key not in out:
            FAILS.append("nllb-moe %s %r" % (key, val))
            print("nllb-moe with %s %r (%d): %s" % (key, val, rc, out))
    json.dump(dict(cfg, moe_eval_capacity_token_fraction=0.0, expert_capacity=None), open(os.path.join(d, "config.json"), "w"))
    rc, out = info(d)
    if rc == 0 or "expert_capacity" not in out:
        FAILS.append("nllb-moe expert_capacity null with the fraction 0")
        print("nllb-moe expert_capacity null (%d): %s" % (rc, out))
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    del t["model.encoder.layers.3.ffn.experts.expert_2.fc1.bias"]
    R.write_safetensors(os.path.join(d, "model.safetensors"), t)
    rc, out = run_rc(d, x, ("--layer", "3"))
    if rc == 0 or "model.encoder.layers.3.ffn.experts.expert_2.fc1.bias" not in out:
        FAILS.append("nllb-moe without an expert's fc1.bias")
        print("nllb-moe without fc1.bias (%d): %s" % (rc, out))


NLLB_RULES = {"fp8": dict(weight_qtype="float8_e4m3fn", act_qtype="float8_e4m3fn", tile_size=32),
              "int8": dict(weight_qtype="int8", act_qtype="int8", tile_size=32), "mxfp4": dict(weight_qtype="mxfp4")}


def nllb_quantized(tmp, d, x, layers, kinds, what, fmt="moe8"):
    """moe8 quantize of an NLLB-MoE checkpoint under each kind's rule: the
    experts' fc1.bias / fc2.bias kept as the input holds them (no expert
    weight left as a float); a run of each sparse layer without rules gives
    the bytes of the input's run under the rule, a training load its values;
    the other tensors copied; moe8 info names the family and the format."""
    for kind in kinds:
        rules = _rule_file(tmp, "nllb_" + kind, **NLLB_RULES[kind])
        q = "%s_q%s_%s" % (d, kind, fmt)
        p = subprocess.run([MOE8, "quantize", d, q, "--rules", rules, "--format", fmt], capture_output=True, text=True)
        if p.returncode != 0:
            FAILS.append("%s quantize %s (%s format)" % (what, kind, fmt))
            print("%s: moe8 quantize %s (%s format) failed: %s" % (what, kind, fmt, p.stderr.strip()))
            continue
        import struct as S
        hs = []
        for dd in (d, q):
            with open(os.path.join(dd, "model.safetensors"), "rb") as f:
                hs.append(json.loads(f.read(S.unpack("<Q", f.read(8))[0])))
        hi, ho = hs
        biases = [n for n in hi if ".experts." in n and n.endswith(".bias")]
        kept = all(n in ho and ho[n]["dtype"] == hi[n]["dtype"] and _raw(q, n) == _raw(d, n) for n in biases)
        floats = [n for n in ho if ".experts." in n and n.endswith(".weight") and ho[n]["dtype"] in ("F32", "BF16")]
        others = [n for n in hi if ".experts." not in n and n != "__metadata__"]  # routers, a dense layer's: copied
        copied = all(n in ho and _raw(q, n) == _raw(d, n) for n in others)
        if not biases or not kept or floats or not copied:
            FAILS.append("%s %s file's tensors" % (what, kind))
            print("%s %s file: %d biases in the input, kept as they are: %s; float expert weights left: %s; the rest copied: %s" %
                  (what, kind, len(biases), kept, floats[:3], copied))
            continue
        if fmt == "deepseek":
            nllb_deepseek(d, q, x, layers, ho, biases, what)
            continue
        for l in layers:
            rc_a, out_a = run_rc(d, x, ("--layer", str(l), "--rules", rules))
            a = np.load(os.path.join(d, "y.npy")) if rc_a == 0 else None
            rc_b, out_b = run_rc(q, x, ("--layer", str(l)))
            b = np.load(os.path.join(q, "y.npy")) if rc_b == 0 else None
            same = a is not None and b is not None and a.tobytes() == b.tobytes()
            print("%-58s %s" % ("%s %s file (%s format), layer %d: the input's bytes under the rule" % (what, kind, fmt, l),
                                "ok" if same else "FAIL: %s %s" % (out_a.strip()[-200:], out_b.strip()[-200:])))
            if not same:
                FAILS.append("%s %s file layer %d" % (what, kind, l))
                continue
            rc_t, out_t = run_rc(q, x, ("--layer", str(l), "--training-load"))
            if rc_t != 0:
                FAILS.append("%s %s file layer %d training load" % (what, kind, l))
                print("%s %s file, training load (%d): %s" % (what, kind, rc_t, out_t.strip()))
            else:
                # the f32 masters of the codes: the same weights; f32 against the kernels' summation order only
                # (the inference load's activations are the rule's, a training load's too)
                check("%s %s file, layer %d, training load" % (what, kind, l), np.load(os.path.join(q, "y.npy")).astype(np.float64),
                      b.astype(np.float64), 1e-5 if kind == "mxfp4" else 1e-3)
        rc, out = info(q)
        want = {"fp8": "f8e4m3", "int8": "i8", "mxfp4": "mxfp4"}[kind] if fmt == "moe8" else "deepseek"
        if rc != 0 or "nllb-moe" not in out or want not in out:
            FAILS.append("%s %s file info" % (what, kind))
            print("%s %s file info (%d): %s" % (what, kind, rc, out))


def nllb_deepseek(d, q, x, layers, ho, biases, what):
    """DeepSeek's FP8 format of an NLLB-MoE checkpoint: fc1 / fc2 .weight
    F8_E4M3 with .weight_scale_inv per 128x128 block, the biases beside
    them; its run (other weight blocks than a rule's, FP8 activations per
    128) near the input's run under FP8 rules of tile 128, and far from it
    with the file's biases zeroed."""
    names = [n for n in ho if ".experts.expert_" in n and (n.endswith("fc1.weight") or n.endswith("fc2.weight"))]
    if not names or any(ho[n]["dtype"] != "F8_E4M3" or n + "_scale_inv" not in ho for n in names):
        FAILS.append(what + " deepseek file's tensors")
        print("%s deepseek file: fc1 / fc2 weights %s" % (what, [(n, ho[n]["dtype"]) for n in names[:2]]))
        return
    import struct as S
    zq = q + "_nobias"
    shutil.copytree(q, zq)
    with open(os.path.join(zq, "model.safetensors"), "r+b") as f:
        n = S.unpack("<Q", f.read(8))[0]
        for b in biases:
            f.seek(8 + n + ho[b]["data_offsets"][0])
            f.write(bytes(ho[b]["data_offsets"][1] - ho[b]["data_offsets"][0]))
    rules = _rules_file(os.path.dirname(d))
    for l in layers:
        want, _ = run(d, x, ("--layer", str(l), "--rules", rules))
        got, _ = run(q, x, ("--layer", str(l)))
        # two FP8 roundings of relu experts (each ~5% off f32 here): near; the biases' absence far past it
        check("%s deepseek FP8 file, layer %d, near the input under the rule" % (what, l), got, want, 1e-1)
        zero, _ = run(zq, x, ("--layer", str(l)))
        if rel(zero, want) <= 2e-1:
            FAILS.append("%s deepseek file layer %d: the biases not told apart" % (what, l))
            print("%s deepseek file layer %d: with the biases zeroed rel err %.2e only" % (what, l, rel(zero, want)))


def _raw(d, name):
    """A tensor's bytes as the file holds them."""
    import struct as S
    with open(os.path.join(d, "model.safetensors"), "rb") as f:
        n = S.unpack("<Q", f.read(8))[0]
        m = json.loads(f.read(n))[name]
        f.seek(8 + n + m["data_offsets"][0])
        return f.read(m["data_offsets"][1] - m["data_offsets"][0])


def test_nllb_moe_files(tmp, rng):
    """NLLB-MoE's files written by moe8: an f32 checkpoint whose widths are
    multiples of 32 (D 64, F 64) quantized to MXFP4, FP8 and int8 codes and
    to DeepSeek's FP8 format, the experts' biases kept beside the codes
    (nllb_quantized); and moe8 init's directory (f32 and bf16: both stacks'
    sparse layers, the router's bias under router_bias, the experts' fc1 /
    fc2 with their biases) read by moe8 info and run, its --layers refused
    naming the config's keys."""
    E, D, F, T = 4, 64, 64, 40
    cfg = {"model_type": "nllb-moe", "d_model": D, "encoder_layers": 2, "decoder_layers": 2, "encoder_sparse_step": 2,
           "decoder_sparse_step": 1, "num_experts": E, "encoder_ffn_dim": F, "decoder_ffn_dim": F, "router_bias": True,
           "moe_eval_capacity_token_fraction": 0.4}
    sparse = {1: "model.encoder.layers.1.ffn.", 2: "model.decoder.layers.0.ffn.", 3: "model.decoder.layers.1.ffn."}
    t = {}
    for l, p in sparse.items():
        t[p + "router.classifier.weight"] = ("F32", rnd(rng, E, D, scale=0.3))
        t[p + "router.classifier.bias"] = ("F32", rnd(rng, E, scale=0.3))
        for e in range(E):
            for nm, w in zip(("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"),
                             (rnd(rng, F, D, scale=D ** -0.5), rnd(rng, F, scale=0.2), rnd(rng, D, F, scale=F ** -0.5), rnd(rng, D, scale=0.2))):
                t[p + "experts.expert_%d.%s" % (e, nm)] = ("F32", w.astype(np.float32))
    t["model.encoder.layers.0.ffn.fc1.weight"] = ("F32", rnd(rng, F, D))  # a dense layer's: copied as it is
    d = os.path.join(tmp, "nllb_files")
    write_model(d, cfg, t)
    x = rnd(rng, T, D).astype(np.float32).astype(np.float64)
    nllb_quantized(tmp, d, x, sorted(sparse), ("mxfp4", "fp8", "int8"), "nllb-moe F 64")
    nllb_quantized(tmp, d, x, [3], ("fp8",), "nllb-moe F 64", fmt="deepseek")
    # moe8 init: the directory the loader reads
    cp = os.path.join(tmp, "nllb_init.json")
    json.dump(dict(cfg, num_experts=8, encoder_ffn_dim=32, decoder_ffn_dim=32), open(cp, "w"))
    for dt in ("f32", "bf16"):
        out = os.path.join(tmp, "nllb_init_" + dt)
        p = subprocess.run([MOE8, "init", "--config", cp, "--out", out, "--dtype", dt], capture_output=True, text=True)
        if p.returncode != 0:
            FAILS.append("nllb-moe init " + dt)
            print("nllb-moe init %s (%d): %s" % (dt, p.returncode, p.stderr.strip()))
            continue
        rc, txt = info(out)
        if rc != 0 or "nllb-moe" not in txt or "moe layers: 1-3 " not in txt:
            FAILS.append("nllb-moe init %s info" % dt)
            print("nllb-moe init %s info (%d): %s" % (dt, rc, txt))
        import struct as S
        with open(os.path.join(out, "model.safetensors"), "rb") as f:
            names = set(json.loads(f.read(S.unpack("<Q", f.read(8))[0])))
        want = {p + n for p in sparse.values() for n in ["router.classifier.weight", "router.classifier.bias"] +
                ["experts.expert_%d.%s" % (e, n2) for e in range(8) for n2 in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")]}
        if names - {"__metadata__"} != want:
            FAILS.append("nllb-moe init %s tensors" % dt)
            print("nllb-moe init %s: tensors not the loader's: extra %s, missing %s" % (dt, sorted(names - want)[:4], sorted(want - names)[:4]))
        ran = 0
        for l in sorted(sparse):
            rc, txt = run_rc(out, x, ("--layer", str(l)))
            y = np.load(os.path.join(out, "y.npy")) if rc == 0 else None
            if rc != 0 or y.shape != x.shape or not np.all(np.isfinite(y)) or not np.any(y):
                FAILS.append("nllb-moe init %s run layer %d" % (dt, l))
                print("nllb-moe init %s run layer %d (%d): %s" % (dt, l, rc, txt.strip()))
            else:
                ran += 1
        print("%-58s %s" % ("nllb-moe init %s: info, %d of %d sparse layers run" % (dt, ran, len(sparse)), "ok" if ran == len(sparse) else "FAIL"))
    p = subprocess.run([MOE8, "init", "--config", cp, "--out", os.path.join(tmp, "nllb_init_l"), "--layers", "2"], capture_output=True, text=True)
    if p.returncode != 2 or "encoder_layers" not in p.stderr or os.path.exists(os.path.join(tmp, "nllb_init_l")):
        FAILS.append("nllb-moe init --layers not refused naming encoder_layers")
        print("nllb-moe init --layers (%d): %s" % (p.returncode, p.stderr.strip()))


def test_axk1(tmp, rng):
    """A.X-K1 (axk1): DeepSeek-V3's block (sigmoid + bias, groups with the
    -inf mask, renormalized, routed_scaling_factor, one shared expert)
    whose output goes through post_mlp_layernorm, an RMSNorm multiplying
    by its weight (eps rms_norm_eps), the weight in the decoder layer
    (layers.L.post_mlp_layernorm.weight) as save_pretrained writes it, or
    in the block (mlp.post_mlp_layernorm.weight, transformers' own name);
    the class's defaults (8 groups, 4 kept, scaling 2.5, eps 1e-6)."""
    E, k, D, F, T = 32, 4, 96, 40, 24
    for absent, inner in ((False, False), (True, True)):
        cfg = {"model_type": "axk1", "hidden_size": D, "num_hidden_layers": 3, "n_routed_experts": E, "num_experts_per_tok": k,
               "moe_intermediate_size": F}
        ng, kg, scale, eps = (8, 4, 2.5, 1e-6) if absent else (4, 2, 1.5, 1e-5)
        if not absent:
            cfg.update(n_group=ng, topk_group=kg, routed_scaling_factor=scale, rms_norm_eps=eps, n_shared_experts=1,
                       first_k_dense_replace=1)
        t, refs = {}, {}
        x = rnd(rng, T, D).astype(np.float32).astype(np.float64)
        t["model.layers.0.mlp.gate_proj.weight"] = ("BF16", rnd(rng, 32, D).astype(np.float32))
        for l in (1, 2):
            p = "model.layers.%d.mlp." % l
            wr = rnd(rng, E, D, scale=0.5)
            bias = rnd(rng, E, scale=0.2)
            t[p + "gate.weight"] = ("BF16", wr.astype(np.float32))
            t[p + "gate.e_score_correction_bias"] = ("F32", bias)
            experts = per_expert(t, p, make_experts(rng, E, D, F), ("gate_proj", "up_proj", "down_proj"), "BF16")
            sw = make_experts(rng, 1, D, F)[0]
            for nm, w in zip(("gate_proj", "up_proj", "down_proj"), sw):
                t[p + "shared_experts." + nm + ".weight"] = ("BF16", w.astype(np.float32))
            wn = 1.0 + rnd(rng, D, scale=0.3)
            t[(p if inner else "model.layers.%d." % l) + "post_mlp_layernorm.weight"] = ("F32", wn)
            routing = R.route_deepseek(x, store(wr, "BF16"), store(bias, "F32"), k, ng, kg, True, scale)
            y = R.moe_block(x, routing, experts, [store(w, "BF16") for w in sw])
            refs[l] = R.rms_norm(y, store(wn, "F32"), eps)
            if rel(y, refs[l]) < 1e-2:
                FAILS.append("axk1: the output norm does not change the test's values")
        d = os.path.join(tmp, "axk1_%d" % absent)
        write_model(d, cfg, t)
        for l, ref in refs.items():
            got, _ = run(d, x, ("--layer", str(l)))
            check("axk1 bf16 per-expert, output norm %s%s, layer %d" % ("in the block" if inner else "in the layer",
                                                                        ", defaults" if absent else "", l), got, ref, 1e-5)


def test_cohere2_moe(tmp, rng):
    """Cohere2-MoE: the top-k of the logits, weighted by their softmax
    ("softmax", norm_topk_prob not read) or their sigmoid, divided by the sum
    iff norm_topk_prob ("sigmoid"); num_shared_experts x intermediate_size
    shared experts, (routed + shared) / 2 ("average") or the sum; layer 0
    dense by mlp_layer_types or first_k_dense_replace."""
    E, k, D, F, T = 16, 4, 128, 96, 24
    cases = (("softmax", "average", False, 2, "types"), ("sigmoid", "average", True, 1, "fk"), ("sigmoid", "sum", False, 2, "types"),
             ("softmax", "sum", True, 1, "fk"), ("sigmoid", "average", False, 0, "types"), (None, None, None, 1, "absent"))
    for sel, strat, norm, nsh, place in cases:
        cfg = {"model_type": "cohere2_moe", "hidden_size": D, "num_hidden_layers": 3, "num_experts": E, "num_experts_per_tok": k,
               "intermediate_size": F, "num_shared_experts": nsh}
        if place == "types":
            cfg["mlp_layer_types"] = ["dense", "sparse", "sparse"]
        elif place == "fk":
            cfg["first_k_dense_replace"] = 1
        for key, v in (("expert_selection_fn", sel), ("shared_expert_combination_strategy", strat), ("norm_topk_prob", norm)):
            if v is not None:
                cfg[key] = v
        t, refs = {}, {}
        x = rnd(rng, T, D).astype(np.float32).astype(np.float64)
        t["model.layers.0.mlp.gate_proj.weight"] = ("BF16", rnd(rng, 32, D).astype(np.float32))
        for l in ((0, 1, 2) if place == "absent" else (1, 2)):
            p = "model.layers.%d.mlp." % l
            wr = rnd(rng, E, D, scale=0.5)
            t[p + "gate.weight"] = ("BF16", wr.astype(np.float32))
            wr = store(wr, "BF16")
            experts = per_expert(t, p, make_experts(rng, E, D, F), ("gate_proj", "up_proj", "down_proj"), "BF16")
            shared = None
            if nsh:
                sw = make_experts(rng, 1, D, F * nsh)[0]
                shared = []
                for nm, w in zip(("gate_proj", "up_proj", "down_proj"), sw):
                    t[p + "shared_experts." + nm + ".weight"] = ("BF16", w.astype(np.float32))
                    shared.append(store(w, "BF16"))
            if sel == "sigmoid":
                routing = R.route_logits_bias(x, wr, np.zeros(E), k, norm)
            else:
                routing = R.route_softmax(x, wr, k, True)
            refs[l] = R.moe_block(x, routing, experts, shared, average=strat != "sum")
        d = os.path.join(tmp, "cohere2_%s_%s_%s_%d" % (sel, strat, norm, nsh))
        write_model(d, cfg, t)
        for l, ref in refs.items():
            got, _ = run(d, x, ("--layer", str(l)))
            check("cohere2_moe bf16 %s %s norm %s shared %d, layer %d" % (sel, strat, norm, nsh, l), got, ref, 1e-5)
        if place != "absent":
            p2 = subprocess.run([MOE8, "run", "--model", d, "--input", os.path.join(d, "x.npy"), "--output", os.path.join(d, "y0.npy"),
                                 "--layer", "0"], capture_output=True, text=True)
            key = "mlp_layer_types" if place == "types" else "first_k_dense_replace"
            if p2.returncode == 0 or key not in p2.stderr:
                FAILS.append("cohere2_moe dense layer 0")
                print("cohere2_moe dense layer 0 not refused by %s: %s" % (key, p2.stderr.strip()))
    for key, val in (("expert_selection_fn", "sparsemixer"), ("shared_expert_combination_strategy", "max")):
        json.dump(dict(cfg, **{key: val}), open(os.path.join(d, "config.json"), "w"))
        rc, out = info(d)
        if rc == 0 or key not in out:
            FAILS.append("cohere2_moe %s %r" % (key, val))
            print("cohere2_moe with %s %r (%d): %s" % (key, val, rc, out))


def test_gemma4(tmp, rng):
    """Gemma-4's routed branch (Gemma4TextDecoderLayer with enable_moe_block,
    hfref.gemma4_branch): the router reading the residual stream through
    its weightless RMSNorm, router.scale and D^-1/2, the weights times
    router.per_expert_scale, GeGLU experts on pre_feedforward_layernorm_2,
    post_feedforward_layernorm_2 of their sum; every layer, bf16, as
    transformers' save_pretrained writes it (fused, under the decoder layer)
    and per expert; the multimodal gemma4 (text_config,
    model.language_model.layers.) and diffusion_gemma (its decoder's layers,
    model.decoder.layers., to which the encoder's are tied; no
    enable_moe_block); the inference and the training loads;
    enable_moe_block false and another hidden_activation refused by name."""
    E, k, D, F, T = 16, 4, 128, 96, 24
    cases = (("gemma4_text", "fused", None), ("gemma4_text", "per", 1e-5), ("diffusion_gemma", "fused", None), ("gemma4", "fused", 1e-6))
    for mt, layout, eps in cases:
        text = {"model_type": "gemma4_text", "hidden_size": D, "num_hidden_layers": 2, "enable_moe_block": True, "num_experts": E,
                "top_k_experts": k, "moe_intermediate_size": F, "intermediate_size": 64, "hidden_activation": "gelu_pytorch_tanh"}
        if eps is not None:
            text["rms_norm_eps"] = eps
        if mt == "diffusion_gemma":
            del text["enable_moe_block"]
            text["model_type"] = "diffusion_gemma_text"
        cfg = text if mt == "gemma4_text" else {"model_type": mt, "text_config": text, "vision_config": {"hidden_size": 8}}
        root = {"gemma4_text": "model.layers.", "gemma4": "model.language_model.layers.", "diffusion_gemma": "model.decoder.layers."}[mt]
        t, refs = {}, {}
        x = (rnd(rng, T, D) * 3.0).astype(np.float32).astype(np.float64)
        for l in (0, 1):
            p = "%s%d." % (root, l)
            t[p + "mlp.gate_proj.weight"] = ("BF16", rnd(rng, 64, D).astype(np.float32))  # the dense MLP beside the branch
            vals = {}
            for name, shape, scale, base in (("router.proj.weight", (E, D), 1.0, 0.0), ("router.scale", (D,), 0.3, 1.0),
                                              ("router.per_expert_scale", (E,), 0.3, 1.0),
                                              ("pre_feedforward_layernorm_2.weight", (D,), 0.3, 1.0),
                                              ("post_feedforward_layernorm_2.weight", (D,), 0.3, 1.0)):
                v = rnd(rng, *shape, scale=scale) + base
                t[p + name] = ("BF16", v.astype(np.float32))
                vals[name] = store(v, "BF16")
            ex = make_experts(rng, E, D, F)
            if layout == "per":
                experts = per_expert(t, p, ex, ("gate_proj", "up_proj", "down_proj"), "BF16")
            else:
                t[p + "experts.gate_up_proj"] = ("BF16", np.stack([np.concatenate([g, u], axis=0) for g, u, _ in ex]).astype(np.float32))
                t[p + "experts.down_proj"] = ("BF16", np.stack([w for _, _, w in ex]).astype(np.float32))
                experts = [tuple(store(w, "BF16") for w in e) for e in ex]
            gu = np.stack([np.concatenate([g, u], axis=0) for g, u, _ in experts])
            dn = np.stack([w for _, _, w in experts])
            args = (x, vals["router.proj.weight"], vals["router.scale"], vals["router.per_expert_scale"], gu, dn,
                    vals["pre_feedforward_layernorm_2.weight"], vals["post_feedforward_layernorm_2.weight"], k)
            refs[l] = R.gemma4_branch(*args, eps=1e-6 if eps is None else eps)
            ones = (x, vals["router.proj.weight"], np.ones(D), np.ones(E), gu, dn, np.ones(D), np.ones(D), k)
            if rel(R.gemma4_branch(*ones), refs[l]) < 1e-2:
                FAILS.append("gemma4: the norm weights and scales do not change the test's output")
        d = os.path.join(tmp, "gemma4_%s_%s_%d" % (mt, layout, len(os.listdir(tmp))))
        write_model(d, cfg, t)
        for l, ref in refs.items():
            got, _ = run(d, x, ("--layer", str(l)))
            check("%s bf16 %s, layer %d" % (mt, layout, l), got, ref, 1e-5)
            got2, _ = run(d, x, ("--layer", str(l), "--training-load"))
            check("%s bf16 %s, layer %d, training load" % (mt, layout, l), got2, ref, 1e-5)
        rc, out = info(d)
        if rc != 0 or "gemma" not in out or "GeGLU" not in out:
            FAILS.append("gemma4 info")
            print("gemma4 info (%d): %s" % (rc, out))
    for key, val, want in (("enable_moe_block", False, "enable_moe_block"), ("hidden_activation", "gelu", "hidden_activation"),
                           ("moe_intermediate_size", None, "moe_intermediate_size")):
        text2 = dict(text)
        text2[key] = val
        json.dump(dict(cfg, text_config=text2), open(os.path.join(d, "config.json"), "w"))
        rc, out = info(d)
        if rc == 0 or want not in out:
            FAILS.append("gemma4 %s %r" % (key, val))
            print("gemma4 with %s %r (%d): %s" % (key, val, rc, out))


def dsv4_refusals(d, x):
    """DeepSeek-V4's hash layers refuse what they cannot route, by name: no
    --token-ids, ids of the wrong length or past the table, a table entry
    that is not an expert (naming the tensor and its offset), and another
    scoring_func."""
    xp = os.path.join(d, "x.npy")
    R.write_npy(xp, x)
    T = x.shape[0]

    def refused(what, args, needle, cfg=None):
        p = subprocess.run([MOE8, "run", "--model", cfg or d, "--input", xp, "--output", os.path.join(d, "yr.npy"), "--layer", "0", *args],
                           capture_output=True, text=True)
        ok = p.returncode == 1 and needle in p.stderr
        print("%-58s %s" % ("deepseek_v4 refuses " + what, "ok" if ok else "FAIL: %d %s" % (p.returncode, p.stderr.strip())))
        if not ok:
            FAILS.append("deepseek_v4 " + what)
    refused("no --token-ids", (), "--token-ids")
    for name, ids, needle in (("ids of the wrong length", np.zeros(T - 1, np.int64), "must be int32 or int64 [%d]" % T),
                              ("an id past the table", np.full(T, 40, np.int32), "token 0 has id 40, outside its hash table's [0, 40)"),
                              ("a negative id", np.full(T, -1, np.int64), "token 0 has id -1"),
                              ("float ids", np.zeros(T, np.float32), "must be int32 or int64")):
        ip = os.path.join(d, "bad_ids.npy")
        np.save(ip, ids)
        refused(name, ("--token-ids", ip), needle)
    # a table entry that is not an expert id, and another scoring_func: refused at load / parse, naming what
    bad = d + "_bad"
    shutil.copytree(d, bad)
    import struct as S
    with open(os.path.join(bad, "model.safetensors"), "r+b") as f:
        n = S.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
        name = [k for k in h if k.endswith("0.ffn.gate.tid2eid")][0]
        shape = h[name]["shape"]
        f.seek(8 + n + h[name]["data_offsets"][0] + 8 * (shape[1] + 1))  # element [1, 1]
        f.write(S.pack("<q", 999))
    refused("a tid2eid entry past the experts", ("--token-ids", os.path.join(d, "ids.npy")), "'%s'[1, 1] = 999" % name, bad)
    cfg = json.load(open(os.path.join(d, "config.json")))
    cfg["scoring_func"] = "softmax"
    json.dump(cfg, open(os.path.join(bad, "config.json"), "w"))
    refused("scoring_func softmax", ("--token-ids", os.path.join(d, "ids.npy")), '"scoring_func" is "softmax"', bad)


def test_nemotron_h_gate(tmp, rng):
    """Nemotron-H's experts are ungated: a file that holds a gate projection
    (another block) is refused naming the tensor, never run without it."""
    E, D, F, Fs = 8, 64, 32, 48
    p = "backbone.layers.1.mixer."
    t = {p + "gate.weight": ("BF16", rnd(rng, E, D).astype(np.float32)), p + "gate.e_score_correction_bias": ("F32", rnd(rng, E)),
         p + "shared_experts.up_proj.weight": ("BF16", rnd(rng, Fs, D).astype(np.float32)),
         p + "shared_experts.down_proj.weight": ("BF16", rnd(rng, D, Fs).astype(np.float32))}
    for e in range(E):
        t[p + "experts.%d.up_proj.weight" % e] = ("BF16", rnd(rng, F, D).astype(np.float32))
        t[p + "experts.%d.down_proj.weight" % e] = ("BF16", rnd(rng, D, F).astype(np.float32))
    cfg = {"model_type": "nemotron_h", "hidden_size": D, "n_routed_experts": E, "moe_intermediate_size": F,
           "moe_shared_expert_intermediate_size": Fs, "hybrid_override_pattern": "ME"}
    x = rnd(rng, 4, D)
    for stray in (None, "experts.0.gate_proj.weight", "shared_experts.gate_proj.weight"):
        d = os.path.join(tmp, "nemotron_h_gate_%s" % stray)
        t2 = dict(t)
        if stray:
            t2[p + stray] = ("BF16", rnd(rng, Fs if "shared" in stray else F, D).astype(np.float32))
        write_model(d, cfg, t2)
        try:
            run(d, x)
            ok = stray is None
        except RuntimeError as err:
            ok = stray is not None and stray in str(err)
        if not ok:
            FAILS.append("nemotron_h with %s" % stray)
            print("nemotron_h with a stray %s: not refused by name (or refused without one)" % stray)


def test_nemotron_h_latent(tmp, rng):
    """Nemotron-H with moe_latent_size (hfref.nemotron_latent_block): the
    router and the shared expert read x, the ungated relu2 (or relu)
    experts fc1_latent_proj(x), their weighted sum through
    fc2_latent_proj; every MoE layer, bf16, per expert (save_pretrained's)
    and transformers' fused up_proj [E, F, H] / down_proj [E, H, F]; the
    inference and the training loads, under FP8 rules the file's run equal
    to the input's (moe8 quantize); a missing projection refused naming it,
    a dense layer naming layers_block_type."""
    E, k, D, F, Fs, H, T = 16, 4, 96, 40, 48, 64, 24
    for layout, act in (("per", "relu2"), ("fused", "relu")):
        cfg = {"model_type": "nemotron_h", "hidden_size": D, "n_routed_experts": E, "num_experts_per_tok": k, "moe_intermediate_size": F,
               "moe_shared_expert_intermediate_size": Fs, "moe_latent_size": H, "n_group": 4, "topk_group": 2, "routed_scaling_factor": 2.0,
               "mlp_hidden_act": act, "layers_block_type": ["mamba", "moe", "attention", "moe"]}
        t, refs = {}, {}
        x = rnd(rng, T, D).astype(np.float32).astype(np.float64)
        for l in (1, 3):
            p = "backbone.layers.%d.mixer." % l
            wr, bias = rnd(rng, E, D, scale=0.5), rnd(rng, E, scale=0.2)
            fc1, fc2 = rnd(rng, H, D, scale=D ** -0.5), rnd(rng, D, H, scale=H ** -0.5)
            t[p + "gate.weight"] = ("BF16", wr.astype(np.float32))
            t[p + "gate.e_score_correction_bias"] = ("F32", bias)
            t[p + "fc1_latent_proj.weight"] = ("BF16", fc1.astype(np.float32))
            t[p + "fc2_latent_proj.weight"] = ("BF16", fc2.astype(np.float32))
            ex = [(rnd(rng, F, H, scale=H ** -0.5), rnd(rng, H, F, scale=F ** -0.5)) for _ in range(E)]
            if layout == "per":
                for e, (wu, wd) in enumerate(ex):
                    t[p + "experts.%d.up_proj.weight" % e] = ("BF16", wu.astype(np.float32))
                    t[p + "experts.%d.down_proj.weight" % e] = ("BF16", wd.astype(np.float32))
            else:
                t[p + "experts.up_proj"] = ("BF16", np.stack([u for u, _ in ex]).astype(np.float32))
                t[p + "experts.down_proj"] = ("BF16", np.stack([w for _, w in ex]).astype(np.float32))
            sh = (rnd(rng, Fs, D, scale=D ** -0.5), rnd(rng, D, Fs, scale=Fs ** -0.5))
            t[p + "shared_experts.up_proj.weight"] = ("BF16", sh[0].astype(np.float32))
            t[p + "shared_experts.down_proj.weight"] = ("BF16", sh[1].astype(np.float32))
            routing = R.route_deepseek(x, store(wr, "BF16"), store(bias, "F32"), k, 4, 2, True, 2.0)
            refs[l] = R.nemotron_latent_block(x, routing, [tuple(store(w, "BF16") for w in e) for e in ex], store(fc1, "BF16"),
                                              store(fc2, "BF16"), tuple(store(w, "BF16") for w in sh), act)
        d = os.path.join(tmp, "nemotron_h_latent_%s" % layout)
        write_model(d, cfg, t)
        for l, ref in refs.items():
            got, _ = run(d, x, ("--layer", str(l)))
            check("nemotron_h latent %s bf16 %s, layer %d" % (act, layout, l), got, ref, 1e-5)
            got2, _ = run(d, x, ("--layer", str(l), "--training-load"))
            check("nemotron_h latent %s bf16 %s, layer %d, training load" % (act, layout, l), got2, ref, 1e-5)
        rc, out = info(d)
        if rc != 0 or "latent experts: width %d" % H not in out:
            FAILS.append("nemotron_h latent info")
            print("nemotron_h latent info (%d): %s" % (rc, out))
        rc, out = run_rc(d, x, ("--layer", "2"))
        if rc == 0 or "layers_block_type" not in out:
            FAILS.append("nemotron_h latent dense layer 2")
            print("nemotron_h latent: dense layer 2 not refused by name (%d): %s" % (rc, out))
    quantized_same(tmp, d, x, 3, "nemotron_h latent")
    del t["backbone.layers.1.mixer.fc2_latent_proj.weight"]
    write_model(d, cfg, t)
    rc, out = run_rc(d, x, ("--layer", "1"))
    if rc == 0 or "fc2_latent_proj" not in out:
        FAILS.append("nemotron_h latent without fc2_latent_proj")
        print("nemotron_h latent without fc2_latent_proj (%d): %s" % (rc, out))


def quantized_same(tmp, d, x, layer, what):
    """moe8 quantize under FP8 rules: the file's run gives the bytes of the
    input's run under the rules."""
    rules = os.path.join(tmp, "latent_fp8.json")
    json.dump({"rules": [{"module_path": ".*", "weight_qtype": "float8_e4m3fn", "act_qtype": "float8_e4m3fn", "tile_size": 32}]},
              open(rules, "w"))
    q = d + "_q"
    p = subprocess.run([MOE8, "quantize", d, q, "--rules", rules], capture_output=True, text=True)
    if p.returncode != 0:
        FAILS.append(what + " quantize")
        print("%s: moe8 quantize failed: %s" % (what, p.stderr.strip()))
        return
    a, _ = run(d, x, ("--layer", str(layer), "--rules", rules))
    b, _ = run(q, x, ("--layer", str(layer)))
    ok = np.array_equal(a, b)
    print("%-58s %s" % (what + ", moe8 quantize FP8: the input's bytes", "ok" if ok else "FAIL"))
    if not ok:
        FAILS.append(what + " quantized bytes")


def test_muse_spark(tmp, rng):
    """MuSE-Spark (hfref.muse_spark_block, route_muse_spark): f32 logits x
    output_multiplier, sigmoid, the top-k of s + bias, / (sum + 1e-15), x
    routed_scaling_factor; pre_expert_proj and pre_expert_norm (1 + w),
    SwiGLU experts in the latent width, post_expert_norm (1 + w, then
    RMS) on each expert's output, post_expert_proj; every sparse layer,
    bf16, fused (save_pretrained's) and per expert; MuseSparkTextModel's
    files (layers.L.) and the muse_spark wrapper's (text_config,
    model.language_model.layers.); the class's defaults; the inference and
    the training loads; a dense layer refused naming mlp_layer_types."""
    E, k, D, F, H, T = 16, 4, 96, 40, 64, 24
    cases = (("muse_spark_text", "fused", False), ("muse_spark_text", "per", True), ("muse_spark", "fused", False))
    for mt, layout, absent in cases:
        text = {"model_type": "muse_spark_text", "hidden_size": D, "num_hidden_layers": 3, "num_local_experts": E,
                "num_experts_per_tok": k, "moe_intermediate_size": F, "moe_hidden_size": H, "mlp_layer_types": ["dense", "sparse", "sparse"]}
        mult, scale, eps, peps = 0.1767766952966369, 1.0, 1e-5, 1e-8
        if not absent:
            mult, scale, eps, peps = 0.37, 2.0, 1e-6, 1e-6
            text.update(output_multiplier=mult, routed_scaling_factor=scale, rms_norm_eps=eps, post_norm_eps=peps)
        cfg = text if mt == "muse_spark_text" else {"model_type": mt, "text_config": text}
        root = "layers." if mt == "muse_spark_text" else "model.language_model.layers."
        t, refs = {}, {}
        x = rnd(rng, T, D).astype(np.float32).astype(np.float64)
        t[root + "0.mlp.gate_proj.weight"] = ("BF16", rnd(rng, 64, D).astype(np.float32))
        for l in (1, 2):
            p = "%s%d.mlp." % (root, l)
            wr, bias = rnd(rng, E, D, scale=2.0), rnd(rng, E, scale=0.1)
            pre, post = rnd(rng, H, D, scale=D ** -0.5), rnd(rng, D, H, scale=H ** -0.5)
            pre_w, post_w = rnd(rng, H, scale=0.3), rnd(rng, H, scale=0.3)
            t[p + "gate.weight"] = ("F32", wr)
            t[p + "gate.e_score_correction_bias"] = ("F32", bias)
            t[p + "pre_expert_proj.weight"] = ("BF16", pre.astype(np.float32))
            t[p + "post_expert_proj.weight"] = ("BF16", post.astype(np.float32))
            t[p + "pre_expert_norm.weight"] = ("BF16", pre_w.astype(np.float32))
            t[p + "experts.post_expert_norm.weight"] = ("BF16", post_w.astype(np.float32))
            ex = make_experts(rng, E, H, F)
            if layout == "per":
                experts = per_expert(t, p, ex, ("gate_proj", "up_proj", "down_proj"), "BF16")
            else:
                t[p + "experts.gate_up_proj"] = ("BF16", np.stack([np.concatenate([g, u], axis=0) for g, u, _ in ex]).astype(np.float32))
                t[p + "experts.down_proj"] = ("BF16", np.stack([w for _, _, w in ex]).astype(np.float32))
                experts = [tuple(store(w, "BF16") for w in e) for e in ex]
            gu = np.stack([np.concatenate([g, u], axis=0) for g, u, _ in experts])
            dn = np.stack([w for _, _, w in experts])
            routing = R.route_muse_spark(x, wr, bias, k, mult, scale)
            args = (store(pre, "BF16"), store(pre_w, "BF16"), store(post, "BF16"), store(post_w, "BF16"))
            refs[l] = R.muse_spark_block(x, routing, gu, dn, *args, eps, peps)
            if rel(R.muse_spark_block(x, routing, gu, dn, args[0], 0.0, args[2], 0.0, eps, peps), refs[l]) < 1e-2:
                FAILS.append("muse_spark: the norm weights do not change the test's output")
        d = os.path.join(tmp, "muse_%s_%s_%d" % (mt, layout, absent))
        write_model(d, cfg, t)
        for l, ref in refs.items():
            got, _ = run(d, x, ("--layer", str(l)))
            check("%s bf16 %s%s, layer %d" % (mt, layout, ", defaults" if absent else "", l), got, ref, 1e-5)
            got2, _ = run(d, x, ("--layer", str(l), "--training-load"))
            check("%s bf16 %s%s, layer %d, training load" % (mt, layout, ", defaults" if absent else "", l), got2, ref, 1e-5)
        rc, out = info(d)
        if rc != 0 or "muse_spark" not in out or "post_expert_norm" not in out:
            FAILS.append("muse_spark info")
            print("muse_spark info (%d): %s" % (rc, out))
        rc, out = run_rc(d, x, ("--layer", "0"))
        if rc == 0 or "mlp_layer_types" not in out:
            FAILS.append("muse_spark dense layer 0")
            print("muse_spark: dense layer 0 not refused by name (%d): %s" % (rc, out))
    quantized_same(tmp, d, x, 2, "muse_spark")
    del t[root + "1.mlp.experts.post_expert_norm.weight"]
    write_model(d, cfg, t)
    rc, out = run_rc(d, x, ("--layer", "1"))
    if rc == 0 or "post_expert_norm" not in out:
        FAILS.append("muse_spark without post_expert_norm")
        print("muse_spark without experts.post_expert_norm (%d): %s" % (rc, out))


def zaya_params(rng, E, D, F, H, layer, skip_bias, dead=None):
    """One Zaya layer's tensors as save_pretrained writes them (matrices
    bf16, the router's vectors f32) and their values for hfref.zaya_block."""
    p = "model.layers.%d.mlp." % layer
    t, g = {}, {}
    spec = [("down_w", "gate.down_proj.weight", (H, D), D ** -0.5, 0.0), ("down_b", "gate.down_proj.bias", (H,), 0.3, 0.0),
            ("norm", "gate.router_mlp.norm.weight", (H,), 0.3, 1.0), ("fc1_w", "gate.router_mlp.fc1.weight", (H, H), H ** -0.5, 0.0),
            ("fc1_b", "gate.router_mlp.fc1.bias", (H,), 0.3, 0.0), ("fc2_w", "gate.router_mlp.fc2.weight", (H, H), H ** -0.5, 0.0),
            ("fc2_b", "gate.router_mlp.fc2.bias", (H,), 0.3, 0.0), ("out_w", "gate.router_mlp.out_proj.weight", (E + 1, H), 3 * H ** -0.5, 0.0)]
    if layer > 0:
        spec.append(("scale", "gate.router_states_scale", (H,), 0.5, 1.0))
    for key, name, shape, sd, mean in spec:
        a = mean + rnd(rng, *shape, scale=sd)
        dt = "BF16" if len(shape) == 2 else "F32"
        t[p + name] = (dt, a.astype(np.float32))
        g[key] = store(a, dt)
    bias = np.zeros(E + 1)
    bias[E] = skip_bias
    if dead is not None:
        bias[dead] = -1.0  # an expert no token chooses
    t[p + "gate.balancing_biases"] = ("F32", bias.astype(np.float32))
    g["bias"] = bias
    ex = make_experts(rng, E, D, F)
    gu = np.stack([np.concatenate([wg, wu]) for wg, wu, _ in ex])
    dn = np.stack([wd for _, _, wd in ex])
    t[p + "experts.gate_up_proj"] = ("BF16", gu.astype(np.float32))
    t[p + "experts.down_proj"] = ("BF16", dn.astype(np.float32))
    return t, g, store(gu, "BF16"), store(dn, "BF16")


def test_zaya(tmp, rng):
    """Zaya (hfref.zaya_block, written from ZayaRouter, ZayaRouterMLP and
    ZayaExperts): the router MLP fed the previous layer's router state
    (router_states_scale after the first layer), the top-1 of softmax +
    balancing_biases weighted by its probability, the skip class adding
    nothing, fused SwiGLU experts; three layers run by `moe8 run` carrying
    the state (--router-state-out into the next --router-state-in); bf16
    matrices, f32 vectors; a layer where an expert gets no token; the
    fused path under FP8 rules (quantizers emulated) and moe8 quantize's
    bytes; the missing state, an unwanted one, a misshapen one, a missing
    tensor and the keys moe8 does not compute refused by name."""
    E, D, F, H, T, NL = 6, 128, 64, 32, 29, 3
    cfg = {"model_type": "zaya", "num_experts": E, "hidden_size": D, "moe_intermediate_size": F, "router_hidden_size": H,
           "num_hidden_layers": NL, "num_experts_per_tok": 1, "rms_norm_eps": 1e-5, "hidden_act": "silu"}
    t, layers = {}, []
    for l in range(NL):
        tl, g, gu, dn = zaya_params(rng, E, D, F, H, l, (0.04, 0.0, 0.08)[l], dead=2 if l == 1 else None)
        t.update(tl)
        layers.append((g, gu, dn))
    d = os.path.join(tmp, "zaya")
    write_model(d, cfg, t)
    xs = [rnd(rng, T, D).astype(np.float32).astype(np.float64) for _ in range(NL)]
    state, ref_state = None, None
    for l, (g, gu, dn) in enumerate(layers):
        sp = os.path.join(d, "s%d.npy" % l)
        extra = ("--layer", str(l), "--router-state-out", sp) + (("--router-state-in", os.path.join(d, "s%d.npy" % (l - 1))) if l else ())
        got, _ = run(d, xs[l], extra)
        st = np.load(sp).astype(np.float64)
        ref, rs, idx = R.zaya_block(xs[l], g, gu, dn, ref_state)
        nskip = int((idx == E).sum())
        if nskip == 0 or nskip == T:
            FAILS.append("zaya layer %d: %d of %d tokens skipped (want some)" % (l, nskip, T))
        if l == 1 and (idx == 2).any():
            FAILS.append("zaya layer 1: expert 2 chosen (want an expert with no token)")
        check("zaya bf16 layer %d (%d skipped), output" % (l, nskip), got, ref, 1e-5)
        check("zaya bf16 layer %d, router state" % l, st, rs, 1e-5)
        if not (np.all(got[idx == E] == 0.0) and not np.signbit(got[idx == E]).any()):
            FAILS.append("zaya layer %d: a skipped token's output is not +0.0" % l)
        for m in ("no_state", "renorm") if l else ("renorm",):  # rules that are not the model's: the comparison must see them
            if rel(got, R.zaya_block(xs[l], g, gu, dn, ref_state, mutate=m)[0]) <= 1e-3:
                FAILS.append("zaya layer %d: the %s rule not told apart" % (l, m))
        state, ref_state = st, rs
    # layer 2 under FP8 rules (the router in f32, the experts' activations and weights quantized), with layer 1's state
    rp = os.path.join(tmp, "zaya_rules.json")
    json.dump(RULES_FP8, open(rp, "w"))
    g, gu, dn = layers[2]
    q = lambda w: R.quant_cols(w.T, 128).T
    guq, dnq = np.stack([q(w) for w in gu]), np.stack([q(w) for w in dn])
    s1 = np.load(os.path.join(d, "s1.npy")).astype(np.float64)
    ref, _, _ = R.zaya_block(xs[2], g, guq, dnq, s1, act_q=lambda v: R.quant_rows(v, 128))
    got, _ = run(d, xs[2], ("--layer", "2", "--router-state-in", os.path.join(d, "s1.npy"), "--rules", rp))
    check("zaya FP8 by rules, layer 2 (quantizers emulated)", got, ref, 1e-4)
    quantized_same(tmp, d, xs[0], 0, "zaya")
    rc, out = info(d)
    if rc != 0 or "zaya" not in out or "MLP router" not in out or "moe layers: 0-2" not in out:
        FAILS.append("zaya info")
        print("zaya info (%d): %s" % (rc, out))
    # the state: missing after the first layer, given to the first, misshapen
    for extra, key in ((("--layer", "1"), "--router-state-in"), (("--layer", "0", "--router-state-in", os.path.join(d, "s0.npy")),
                                                                  "takes no router state"),
                       (("--layer", "2", "--router-state-in", os.path.join(d, "x.npy")), "must be [%d, %d]" % (T, H))):
        rc, out = run_rc(d, xs[0], extra)
        if rc == 0 or key not in out or (extra[1] == "1" and "layer 1" not in out):
            FAILS.append("zaya refusal %s" % key)
            print("zaya %s (%d): %s" % (" ".join(extra), rc, out))
    del t["model.layers.1.mlp.gate.router_states_scale"]
    write_model(d, cfg, t)
    rc, out = run_rc(d, xs[1], ("--layer", "1", "--router-state-in", os.path.join(d, "s0.npy")))
    if rc == 0 or "model.layers.1.mlp.gate.router_states_scale" not in out:
        FAILS.append("zaya without router_states_scale")
        print("zaya without router_states_scale (%d): %s" % (rc, out))
    for key, val in (("num_experts_per_tok", 2), ("hidden_act", "gelu"), ("router_hidden_size", 0)):
        json.dump(dict(cfg, **{key: val}), open(os.path.join(d, "config.json"), "w"))
        rc, out = info(d)
        if rc == 0 or key not in out:
            FAILS.append("zaya %s %r" % (key, val))
            print("zaya with %s %r (%d): %s" % (key, val, rc, out))


def test_rows(tmp, rng):
    for row in ROWS:
        for layout in row["layouts"]:
            d, x, refs = row_case(tmp, rng, row, layout)
            if row.get("dsv4") and not row.get("scoring"):
                dsv4_refusals(d, x)
            tok = ("--token-ids", os.path.join(d, "ids.npy")) if row.get("dsv4") else ()
            for l, ref in refs.items():
                got, _ = run(d, x, ("--layer", str(l), *tok))
                check("%s bf16 %s, layer %d" % (row["mt"], layout, l), got, ref, 1e-5)
            if row["place"] != "all":
                xp = os.path.join(d, "x.npy")
                p = subprocess.run([MOE8, "run", "--model", d, "--input", xp, "--output", os.path.join(d, "y0.npy"), "--layer", "0"],
                                   capture_output=True, text=True)
                key = PLACE_KEY[row["place"]]
                if p.returncode == 0 or key not in p.stderr:
                    FAILS.append("%s dense layer 0: %s" % (row["mt"], p.stderr.strip()))
                    print("%s dense layer 0 not refused by %s: %s" % (row["mt"], key, p.stderr.strip()))
        # the class's defaults: norm, scaling and placement keys left out
        d, x, refs = row_case(tmp, rng, row, row["layouts"][0], absent=True)
        tok = ("--token-ids", os.path.join(d, "ids.npy")) if row.get("dsv4") else ()
        for l, ref in refs.items():
            got, _ = run(d, x, ("--layer", str(l), *tok))
            check("%s bf16, optional keys absent, layer %d" % (row["mt"], l), got, ref, 1e-5)
        rc, out = info(d)
        if rc != 0 or row["mt"] not in out:
            FAILS.append(row["mt"] + " info")
            print("%s info (%d): %s" % (row["mt"], rc, out))
        if row.get("multimodal"):  # an override (--arch) of the multimodal model is refused: run it without one
            for arch in (row["wrap"], row["mt"]):
                rc, out = run_rc(d, x, ("--arch", arch, "--layer", str(min(refs))))
                if rc == 0 or "multimodal" not in out or row["mt"] not in out:
                    FAILS.append("%s --arch %s" % (row["mt"], arch))
                    print("%s run as --arch %s not refused as the multimodal model (%d): %s" % (row["mt"], arch, rc, out))
        if row.get("text_key"):  # text_config and the legacy key both given: text_config is read (as the class does)
            orig_txt = open(os.path.join(d, "config.json")).read()
            cfg = json.loads(orig_txt)
            cfg["text_config"] = cfg[row["text_key"]]
            cfg[row["text_key"]] = dict(cfg["text_config"], **{row["ekey"]: 3})  # fewer experts than top-k: refused if read
            json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
            for l, ref in refs.items():
                got, _ = run(d, x, ("--layer", str(l)))
                check("%s text_config and %s, layer %d" % (row["mt"], row["text_key"], l), got, ref, 1e-5)
            del cfg["text_config"]
            json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
            rc, out = info(d)
            if rc == 0 or row["ekey"] not in out:
                FAILS.append("%s %s read" % (row["mt"], row["text_key"]))
                print("%s: its %s (3 experts, top-4) not read without text_config (%d): %s" % (row["mt"], row["text_key"], rc, out))
            open(os.path.join(d, "config.json"), "w").write(orig_txt)
        if row["place"] == "period":  # JambaConfig refuses an offset not below the period
            cfg = json.load(open(os.path.join(d, "config.json")))
            cfg["expert_layer_period"], cfg["expert_layer_offset"] = 2, 2
            json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
            rc, out = info(d)
            if rc == 0 or "expert_layer_offset" not in out:
                FAILS.append(row["mt"] + " offset >= period")
                print("%s with expert_layer_offset 2 >= period 2 (%d): %s" % (row["mt"], rc, out))
        if row.get("out_bias"):  # JetMoeConfig's activation key: another activation refused naming it
            cfg = json.load(open(os.path.join(d, "config.json")))
            cfg["activation_function"] = "gelu"
            json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
            rc, out = info(d)
            if rc == 0 or "activation_function" not in out:
                FAILS.append(row["mt"] + " activation_function gelu")
                print("%s with activation_function gelu (%d): %s" % (row["mt"], rc, out))
        if row.get("relu2"):  # Nemotron-H: another activation, biases: refused naming the key
            orig = json.load(open(os.path.join(d, "config.json")))
            for key, val in (("mlp_hidden_act", "silu"), ("mlp_bias", True)):
                tk = row.get("text_key", "text_config")  # a multimodal model's: in its text model's keys
                bad = dict(orig, **{tk: dict(orig[tk], **{key: val})}) if row.get("wrap") else dict(orig, **{key: val})
                json.dump(bad, open(os.path.join(d, "config.json"), "w"))
                rc, out = info(d)
                if rc == 0 or key not in out:
                    FAILS.append("%s %s %r" % (row["mt"], key, val))
                    print("%s with %s %r (%d): %s" % (row["mt"], key, val, rc, out))
        if row.get("types_required"):  # the class has no default list: refused naming it
            cfg = json.load(open(os.path.join(d, "config.json")))
            del cfg["mlp_layer_types"]
            json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
            rc, out = info(d)
            if rc == 0 or "mlp_layer_types" not in out:
                FAILS.append(row["mt"] + " without mlp_layer_types")
                print("%s without mlp_layer_types (%d): %s" % (row["mt"], rc, out))


def main():
    rng = np.random.default_rng(20261201)
    with tempfile.TemporaryDirectory() as tmp:
        test_qwen(tmp, rng)
        test_mixtral(tmp, rng)
        test_olmoe(tmp, rng)
        test_deepseek(tmp, rng)
        test_deepseek_v2(tmp, rng)
        test_dots1(tmp, rng)
        test_minimax(tmp, rng)
        test_qwen3_next(tmp, rng)
        test_gpt_oss(tmp, rng)
        test_gpt_oss_alpha(tmp)
        test_llama4(tmp, rng)
        test_mxfp4_rule(tmp, rng)
        test_mxfp4_file(tmp, rng)
        test_rows(tmp, rng)
        test_dbrx(tmp, rng)
        test_cohere2_moe(tmp, rng)
        test_ernie4_5_vl_moe(tmp, rng)
        test_inkling(tmp, rng)
        test_aria(tmp, rng)
        test_gemma4(tmp, rng)
        test_nemotron_h_gate(tmp, rng)
        test_longcat_flash(tmp, rng)
        test_axk1(tmp, rng)
        test_nemotron_h_latent(tmp, rng)
        test_muse_spark(tmp, rng)
        test_switch_transformers(tmp, rng)
        test_zaya(tmp, rng)
        test_doge(tmp, rng)
        test_nllb_moe(tmp, rng)
        test_nllb_moe_files(tmp, rng)
    if FAILS:
        print("FAILED: " + ", ".join(FAILS))
        sys.exit(1)
    print("families: ok")


if __name__ == "__main__":
    main()
