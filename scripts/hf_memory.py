#!/usr/bin/env python3
"""Memory and time of loading a transformers MoE model with moe8 experts,
against transformers' own load and against the ideal (docs/performance.md,
"Loading a transformers model").

Makes a bf16 checkpoint of a Qwen3-MoE-shaped model (random weights; the
shape is set by the options) once, then loads it in a fresh process per
way of loading:
  transformers   from_pretrained(dir, dtype=bfloat16): transformers alone
  moe8-quantizer from_pretrained(dir, quantization_config=moe8.torch.Moe8Config(rules))
  moe8-files     moe8.torch.from_pretrained(dir, rules): moe8's loader reads the experts from the files
  moe8-files-fp8 the same on moe8's FP8 file of the checkpoint (moe8.quantize_model, made once)
  moe8-patch     from_pretrained(dir) then moe8.torch.patch(model, rules)
and prints, per way: the load's wall time, the resident bytes it added
(after the load, garbage collected) and its peak (VmHWM, reset before the
load), each against the ideal = the non-expert parameters' bytes + the
expert bytes as moe8 holds them under the rule (codes and scales), and
against the checkpoint's bytes; then whether any float expert tensor is
left, and the logits' difference from transformers' own model.

Needs transformers >= 5 and a torch it supports (a venv: pip install torch
transformers); the library from MOE8_LIBRARY or the installed package.
  python3 scripts/hf_memory.py [--hidden 1024 --layers 4 --experts 64 --top-k 8 --ffn 512] [--dir DIR]"""
import argparse
import gc
import json
import os
import subprocess
import sys
import time

RULES = {"rules": [{"module_path": r"layers\.[0-9]+\.mlp\.experts", "weight_qtype": "float8_e4m3fn",
                    "act_qtype": "float8_e4m3fn", "tile_size": 128}]}


def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def make(args):
    import torch
    import transformers
    cfg = transformers.Qwen3MoeConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=4 * args.hidden,
                                      moe_intermediate_size=args.ffn, num_hidden_layers=args.layers, num_attention_heads=16,
                                      num_key_value_heads=4, head_dim=args.hidden // 16, num_experts=args.experts,
                                      num_experts_per_tok=args.top_k, norm_topk_prob=True, tie_word_embeddings=False)
    torch.manual_seed(0)
    with torch.device("cpu"):
        model = transformers.Qwen3MoeForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(args.dir)


def child(args):
    import torch
    import transformers
    import moe8.torch as mt
    assert mt.register_transformers()
    torch.set_num_threads(os.cpu_count() or 1)
    gc.collect()
    base, base_anon, base_file = status("VmRSS"), status("RssAnon"), status("RssFile")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    # The anonymous (not file-backed) bytes' peak, sampled: VmHWM counts the
    # checkpoint's mapped pages too.
    import threading
    top, done = [0], threading.Event()

    def sample():
        while not done.is_set():
            top[0] = max(top[0], status("RssAnon"))
            time.sleep(0.002)
    th = threading.Thread(target=sample, daemon=True)
    th.start()
    t0 = time.perf_counter()
    if args.child == "transformers":
        model = transformers.AutoModelForCausalLM.from_pretrained(args.dir, dtype=torch.bfloat16)
    elif args.child == "moe8-quantizer":
        model = transformers.AutoModelForCausalLM.from_pretrained(args.dir, dtype=torch.bfloat16,
                                                                  quantization_config=mt.Moe8Config(rules=RULES))
    elif args.child == "moe8-files":
        model = mt.from_pretrained(args.dir, rules=RULES, dtype=torch.bfloat16)
    elif args.child == "moe8-files-fp8":
        model = mt.from_pretrained(args.dir + "-fp8", dtype=torch.bfloat16)
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(args.dir, dtype=torch.bfloat16)
        mt.patch(model, RULES)
    t = time.perf_counter() - t0
    gc.collect()
    done.set()
    th.join()
    anon_peak = max(top[0], status("RssAnon")) - base_anon
    rss, peak = status("VmRSS") - base, status("VmHWM") - base
    anon, mapped = status("RssAnon") - base_anon, status("RssFile") - base_file
    float_experts = sum(p.numel() * p.element_size() for n, p in list(model.named_parameters()) + list(model.named_buffers())
                        if ".experts." in n and p.is_floating_point() and p.numel() > 0)
    torch.manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (1, 32))
    with torch.no_grad():
        logits = model(ids).logits.float()
    torch.save(logits, os.path.join(args.dir, "logits-%s.pt" % args.child))
    print(json.dumps({"way": args.child, "load_s": t, "rss": rss, "peak": peak, "float_expert_bytes": float_experts,
                      "anon": anon, "file": mapped, "anon_peak": anon_peak}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--ffn", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--dir", default=None, help="where the checkpoint is made (default: a directory under the system's temp dir)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.dir is None:
        import tempfile
        args.dir = os.path.join(tempfile.gettempdir(), "moe8-hf-memory-%d-%d-%d-%d-%d" % (args.hidden, args.layers, args.experts,
                                                                                       args.top_k, args.ffn))
    if args.child:
        return child(args)
    if not os.path.exists(os.path.join(args.dir, "config.json")):
        print("making the checkpoint in %s ..." % args.dir, flush=True)
        make(args)
    import torch
    from safetensors import safe_open
    expert_file = other = 0
    for name in sorted(os.listdir(args.dir)):
        if name.endswith(".safetensors"):
            with safe_open(os.path.join(args.dir, name), "pt") as f:
                for k in f.keys():
                    sl = f.get_slice(k)
                    n = 2
                    for s in sl.get_shape():
                        n *= s
                    if ".experts." in k:
                        expert_file += n
                    else:
                        other += n
    # moe8's bytes of the experts under the rule: one FP8 code per weight and
    # one f32 scale per 1 x 128 block of each column (docs/formats.md)
    E, D, F, L = args.experts, args.hidden, args.ffn, args.layers
    codes = L * E * 3 * D * F
    scales = L * E * 4 * (2 * F * ((D + 127) // 128) + D * ((F + 127) // 128))
    ideal = other + codes + scales
    print("checkpoint: %.1f MB (experts %.1f MB bf16, the rest %.1f MB); ideal with FP8 experts: %.1f MB"
          % ((expert_file + other) / 1e6, expert_file / 1e6, other / 1e6, ideal / 1e6))
    rows = []
    if not os.path.exists(os.path.join(args.dir + "-fp8", "config.json")):
        import moe8
        moe8.quantize_model(args.dir, args.dir + "-fp8", RULES)  # moe8's FP8 file of the same checkpoint
    for way in ("transformers", "moe8-quantizer", "moe8-files", "moe8-files-fp8", "moe8-patch"):
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--dir", args.dir, "--child", way], capture_output=True,
                             text=True)
        line = [x for x in out.stdout.splitlines() if x.startswith("{")]
        if out.returncode or not line:
            print("%s failed:\n%s" % (way, out.stderr[-3000:]))
            return 1
        rows.append(json.loads(line[-1]))
    want = torch.load(os.path.join(args.dir, "logits-transformers.pt"))
    print("after / peak: resident bytes the load added, all / anonymous only (file-backed pages are the checkpoint's,"
          " mapped in place)")
    print("%-16s %8s %18s %18s %14s %14s %14s %10s" % ("way", "load s", "after MB all/anon", "peak MB all/anon", "after/ideal",
                                                         "peak/ideal", "float experts", "logits"))
    for r in rows:
        got = torch.load(os.path.join(args.dir, "logits-%s.pt" % r["way"]))
        err = float((got - want).abs().max() / want.abs().max())
        print("%-16s %8.2f %9.1f /%7.1f %9.1f /%7.1f %6.2f /%6.2f %6.2f /%6.2f %11.1f MB %10.2e" % (
            r["way"], r["load_s"], r["rss"] / 1e6, r["anon"] / 1e6, r["peak"] / 1e6, r["anon_peak"] / 1e6, r["rss"] / ideal,
            r["anon"] / ideal, r["peak"] / ideal, r["anon_peak"] / ideal, r["float_expert_bytes"] / 1e6, err))
    return 0


if __name__ == "__main__":
    sys.exit(main())
