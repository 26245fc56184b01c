#!/usr/bin/env python3
"""What moe8's FP8 experts do to a model's next-token choice: small random
transformers models (Qwen3-MoE, Mixtral, DeepSeek-V3) in f32, eval mode, the
logits of transformers' own model against the same model after
moe8.torch.patch with an FP8 rule (e4m3 weights and activations, 1x128
tiles); prints, per family, the share of positions whose argmax agrees and
the logits' relative error.  `moe8 demo` quotes these figures.

Needs transformers >= 5 and a torch it supports (a venv: pip install torch
transformers); the library from MOE8_LIBRARY or the installed package.
  python3 scripts/fp8_argmax.py [--layers 4] [--batch 4] [--seq 64]"""
import argparse

import torch
import transformers

from moe8.torch import patch

RULES = {"rules": [{"module_path": ".*", "weight_qtype": "float8_e4m3fn", "act_qtype": "float8_e4m3fn", "tile_size": 128}]}


def configs(L):
    common = dict(vocab_size=2048, hidden_size=256, num_hidden_layers=L, num_attention_heads=4, num_key_value_heads=2)
    return {
        "qwen3_moe": transformers.Qwen3MoeConfig(intermediate_size=512, moe_intermediate_size=256, num_experts=16,
                                                 num_experts_per_tok=4, norm_topk_prob=True, **common),
        "mixtral": transformers.MixtralConfig(intermediate_size=256, num_local_experts=8, num_experts_per_tok=2, **common),
        "deepseek_v3": transformers.DeepseekV3Config(intermediate_size=512, moe_intermediate_size=256, n_routed_experts=16,
                                                     num_experts_per_tok=4, n_group=4, topk_group=2, n_shared_experts=1,
                                                     first_k_dense_replace=1, q_lora_rank=64, kv_lora_rank=64,
                                                     qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=32,
                                                     **dict(common, num_key_value_heads=4)),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    a = ap.parse_args()
    torch.manual_seed(0)
    print("%-12s %10s %14s %12s" % ("family", "positions", "argmax agrees", "logits err"))
    for name, cfg in configs(a.layers).items():
        model = getattr(transformers, {"qwen3_moe": "Qwen3MoeForCausalLM", "mixtral": "MixtralForCausalLM",
                                       "deepseek_v3": "DeepseekV3ForCausalLM"}[name])(cfg).eval()
        ids = torch.randint(0, cfg.vocab_size, (a.batch, a.seq))
        with torch.no_grad():
            want = model(ids).logits
            n = patch(model, RULES)
            got = model(ids).logits
        agree = (want.argmax(-1) == got.argmax(-1)).float().mean().item()
        err = ((got - want).norm() / want.norm()).item()
        print("%-12s %10d %13.1f%% %12.2e   (%d blocks patched)" % (name, want.shape[0] * want.shape[1], 100 * agree, err, n))


if __name__ == "__main__":
    main()
