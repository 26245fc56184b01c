#!/usr/bin/env python3
"""A GPT-OSS-20B-shaped model generating through transformers, with moe8's
MXFP4 experts and with transformers alone (docs/performance.md, "A
GPT-OSS-20B-shaped model through transformers").

  python3 scripts/gpt_oss_run.py make DIR [--layers 24]
      writes the released GPT-OSS-20B config.json (hidden 2880, 24 layers,
      32 experts, top-4, width 2880, vocabulary 201088, MXFP4 experts) and
      random weights in its released layout: the experts as MXFP4 blocks
      and scales (about 12 GB), the rest bf16 (about 3.6 GB).
  python3 scripts/gpt_oss_run.py run DIR [--way moe8|moe8-int8|transformers] [--prompt 32 --new 32]
      in a fresh process per way: loads the model (moe8: moe8.torch.
      from_pretrained, the MXFP4 codes kept, f32 activations, the exact
      product; moe8-int8: the same under the rule act_qtype int8 per 1x32,
      the int8 MXFP4 kernels; transformers: its own load, which dequantizes
      the experts to bf16 on a CPU), then runs a prompt of --prompt tokens
      and --new greedy tokens one at a time through the KV cache, and
      prints the load time, the resident and peak bytes against the ideal
      (the checkpoint's bytes), and prefill and decode tokens/s.  The
      transformers way runs under an address-space limit of the machine's
      memory (so that running out is an error, not the kernel's OOM kill).

Needs transformers >= 5, a torch it supports and safetensors (a venv: pip
install torch transformers); the library from MOE8_LIBRARY or the
installed package.  Not part of the test command."""
import argparse
import json
import os
import resource
import subprocess
import sys
import time

CONFIG = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "attention_bias": True, "attention_dropout": 0.0,
    "eos_token_id": 200002, "pad_token_id": 199999, "experts_per_token": 4, "num_experts_per_tok": 4, "head_dim": 64,
    "hidden_act": "silu", "hidden_size": 2880, "initial_context_length": 4096, "initializer_range": 0.02,
    "intermediate_size": 2880, "max_position_embeddings": 131072, "num_attention_heads": 64, "num_hidden_layers": 24,
    "num_key_value_heads": 8, "num_local_experts": 32, "output_router_logits": False, "rms_norm_eps": 1e-05,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
                     "rope_type": "yarn", "truncate": False},
    "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128, "swiglu_limit": 7.0,
    "tie_word_embeddings": False, "use_cache": True, "vocab_size": 201088,
    "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]},
}


def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def make(args):
    import torch
    import transformers
    from safetensors.torch import save_file
    cfg = dict(CONFIG, num_hidden_layers=args.layers, layer_types=["sliding_attention", "full_attention"] * (args.layers // 2))
    os.makedirs(args.dir, exist_ok=True)
    conf = transformers.GptOssConfig(**{k: v for k, v in cfg.items() if k != "quantization_config"})
    with torch.device("meta"):
        shapes = {n: p.shape for n, p in transformers.GptOssForCausalLM(conf).state_dict().items() if ".mlp.experts." not in n}
    g = torch.Generator().manual_seed(0)
    E, D, F = cfg["num_local_experts"], cfg["hidden_size"], cfg["intermediate_size"]
    index, shard = {}, {}

    def flush(name):
        if shard:
            save_file(shard, os.path.join(args.dir, name), metadata={"format": "pt"})
            for k in shard:
                index[k] = name
            shard.clear()

    def rand(shape, scale):
        return (torch.randn(shape, generator=g) * scale).to(torch.bfloat16)
    per = 4  # layers a shard
    for layer in range(args.layers):
        pre = "model.layers.%d." % layer
        for n, s in shapes.items():
            if n.startswith(pre):
                shard[n] = torch.ones(s, dtype=torch.bfloat16) if "norm" in n else rand(s, 0.02)
        for proj, n_out, k in (("gate_up_proj", 2 * F, D), ("down_proj", D, F)):
            shard[pre + "mlp.experts.%s_blocks" % proj] = torch.randint(0, 256, (E, n_out, k // 32, 16), generator=g, dtype=torch.uint8)
            shard[pre + "mlp.experts.%s_scales" % proj] = torch.randint(118, 122, (E, n_out, k // 32), generator=g, dtype=torch.uint8)
            shard[pre + "mlp.experts.%s_bias" % proj] = rand((E, n_out), 0.02)
        if layer % per == per - 1 or layer == args.layers - 1:
            flush("model-%05d.safetensors" % (layer // per))
            print("layers to %d written" % layer, flush=True)
    for n, s in shapes.items():
        if not n.startswith("model.layers."):
            shard[n] = torch.ones(s, dtype=torch.bfloat16) if "norm" in n else rand(s, 0.02)
    flush("model-rest.safetensors")
    with open(os.path.join(args.dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": index}, f)
    with open(os.path.join(args.dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    print("wrote", args.dir)


def child(args):
    if args.way == "transformers":  # running out of memory is then an error here, not an OOM kill of the machine
        lim = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
    import torch
    import transformers
    import moe8.torch as mt
    torch.set_num_threads(os.cpu_count() or 1)
    files = sum(os.path.getsize(os.path.join(args.dir, f)) for f in os.listdir(args.dir) if f.endswith(".safetensors"))
    base = status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    t0 = time.perf_counter()
    res = {"way": args.way, "file_bytes": files}
    try:
        if args.way == "transformers":
            model = transformers.AutoModelForCausalLM.from_pretrained(
                args.dir, dtype=torch.bfloat16, quantization_config=transformers.Mxfp4Config(dequantize=True))
        else:
            rules = None
            if args.way == "moe8-int8":
                rules = {"rules": [{"module_path": ".*", "weight_qtype": "mxfp4", "act_qtype": "int8", "tile_size": 32}]}
            model = mt.from_pretrained(args.dir, rules=rules, dtype=torch.bfloat16)
    except (MemoryError, RuntimeError) as e:
        res.update(error="%s: %s" % (type(e).__name__, str(e).splitlines()[0][:300]), seconds=time.perf_counter() - t0,
                   peak=status("VmHWM"))
        print(json.dumps(res))
        return
    model.eval()
    res.update(load_s=time.perf_counter() - t0, rss=status("VmRSS") - base, peak=status("VmHWM"))
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 200000, (1, args.prompt), generator=g)
    with torch.no_grad():
        t0 = time.perf_counter()
        out = model(ids, use_cache=True)
        res["prefill_s"] = time.perf_counter() - t0
        pkv, tok, toks = out.past_key_values, out.logits[:, -1:].argmax(-1), []
        t0 = time.perf_counter()
        for _ in range(args.new):
            out = model(tok, past_key_values=pkv, use_cache=True)
            pkv, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
            toks.append(int(tok))
        res["decode_s"] = time.perf_counter() - t0
    res.update(prefill_tok_s=args.prompt / res["prefill_s"], decode_tok_s=args.new / res["decode_s"], tokens=toks,
               peak_after=status("VmHWM"), rss_after=status("VmRSS") - base)
    print(json.dumps(res))


def run(args):
    gb = 1e9
    for way in args.way.split(","):
        p = subprocess.run([sys.executable, os.path.abspath(__file__), "child", args.dir, "--way", way, "--prompt",
                            str(args.prompt), "--new", str(args.new)], capture_output=True, text=True)
        line = [x for x in p.stdout.splitlines() if x.startswith("{")]
        if not line:
            print("%s: exit %d\n%s" % (way, p.returncode, p.stderr[-2000:]))
            continue
        r = json.loads(line[-1])
        if "error" in r:
            print("%-13s failed after %.1f s, peak %.1f GB (%.2fx the checkpoint): %s"
                  % (way, r["seconds"], r["peak"] / gb, r["peak"] / r["file_bytes"], r["error"]))
            continue
        print("%-13s load %.1f s; resident after load %.1f GB, after the run %.1f GB (%.2fx the checkpoint's %.1f GB), "
              "peak %.1f GB (%.2fx); prefill %d tokens %.2f tok/s; decode %.2f tok/s; first tokens %s"
              % (way, r["load_s"], r["rss"] / gb, r["rss_after"] / gb, r["rss_after"] / r["file_bytes"], r["file_bytes"] / gb,
                 r["peak_after"] / gb, r["peak_after"] / r["file_bytes"], args.prompt, r["prefill_tok_s"], r["decode_tok_s"],
                 r["tokens"][:8]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cmd", choices=("make", "run", "child"))
    ap.add_argument("dir")
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--way", default="moe8,moe8-int8,transformers")
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--new", type=int, default=32)
    args = ap.parse_args()
    {"make": make, "run": run, "child": child}[args.cmd](args)


if __name__ == "__main__":
    main()
