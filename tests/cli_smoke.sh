#!/bin/sh
# The moe8 command: help and exit codes of every subcommand, and a demo run
# whose table has every format and granularity.
set -u
moe8="$1"
fail() { echo "FAIL: $*"; exit 1; }
"$moe8" --help >/dev/null || fail "--help exits non-zero"
"$moe8" >/dev/null 2>&1; [ $? -eq 2 ] || fail "no command must exit 2"
"$moe8" frobnicate >/dev/null 2>&1; [ $? -eq 2 ] || fail "unknown command must exit 2"
for c in demo bench train init quantize run info check; do
  "$moe8" $c --help >/dev/null || fail "$c --help exits non-zero"
done
"$moe8" demo --bogus >/dev/null 2>&1; [ $? -eq 2 ] || fail "demo --bogus must exit 2"
"$moe8" bench nope >/dev/null 2>&1; [ $? -eq 2 ] || fail "bench nope must exit 2"
out=$("$moe8" demo) || fail "demo exits non-zero"
n=$(printf '%s\n' "$out" | grep -cE '^(f8e4m3|f8e5m2|i8) ')
[ "$n" -eq 18 ] || fail "demo printed $n result rows, want 18"
printf '%s\n' "$out" | grep -qi nan && fail "demo printed NaN"
# Beside PyTorch (where Debian's python3-torch is): the same layer's f32
# output equals moe8's to f32 rounding.
if /usr/bin/python3 -c 'import torch, numpy' >/dev/null 2>&1; then
  e=$(printf '%s\n' "$out" | sed -n 's/.*PyTorch eager, f32 .*rel err \([0-9.e+-]*\).*/\1/p')
  [ -n "$e" ] || fail "demo printed no PyTorch row: $(printf '%s\n' "$out" | grep -A3 'in PyTorch')"
  awk -v e="$e" 'BEGIN { exit !(e < 1e-5) }' || fail "demo: PyTorch f32 differs from moe8 by $e"
  printf '%s\n' "$out" | grep -q "moe8, FP8 checkpoint .*x PyTorch bf16" || fail "demo printed no FP8 row against PyTorch"
else
  echo "notice: no python3-torch: the demo's PyTorch rows are not checked"
fi
# moe8 train: 200 steps take the loss below 25% (f32) and 35% (FP8) of the first.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for mode in f32 fp8; do
  flag=""; limit=25
  [ "$mode" = fp8 ] && { flag="--fp8"; limit=35; }
  line=$("$moe8" train --steps 200 --quiet $flag --csv "$tmp/$mode.csv") || fail "train $mode exits non-zero"
  pct=$(printf '%s\n' "$line" | sed -n 's/.*(\([0-9.]*\)% of first).*/\1/p')
  [ -n "$pct" ] || fail "train $mode: no summary line: $line"
  awk -v p="$pct" -v l="$limit" 'BEGIN { exit !(p < l) }' || fail "train $mode: loss at $pct% of first, want < $limit%"
  [ "$(wc -l < "$tmp/$mode.csv")" -eq 201 ] || fail "train $mode: CSV does not have 200 rows"
  echo "train $mode: loss at $pct% of first"
done
"$moe8" train --steps 0 >/dev/null 2>&1; [ $? -eq 2 ] || fail "train --steps 0 must exit 2"
# moe8 init writes each family's own tensor names and keys: moe8 run loads
# its output (E = 8, top-2, hidden 64, experts 32 wide; one MoE layer).
x="$(dirname "$0")/data/x_2x64.npy"
k='"hidden_size": 64, "num_hidden_layers": 1, "num_experts_per_tok": 2'
for fam in \
  "qwen2_moe:\"num_experts\": 8, \"moe_intermediate_size\": 32, \"shared_expert_intermediate_size\": 32" \
  "qwen3_moe:\"num_experts\": 8, \"moe_intermediate_size\": 32" \
  "qwen3_next:\"num_experts\": 8, \"moe_intermediate_size\": 32, \"shared_expert_intermediate_size\": 32" \
  "mixtral:\"num_local_experts\": 8, \"intermediate_size\": 32" \
  "minimax:\"num_local_experts\": 8, \"intermediate_size\": 32" \
  "minimax_m2:\"num_local_experts\": 8, \"intermediate_size\": 32" \
  "deepseek_v2:\"n_routed_experts\": 8, \"moe_intermediate_size\": 32, \"n_shared_experts\": 1" \
  "deepseek_v3:\"n_routed_experts\": 8, \"moe_intermediate_size\": 32, \"n_shared_experts\": 1, \"n_group\": 2, \"topk_group\": 1, \"first_k_dense_replace\": 0" \
  "kimi_k2:\"n_routed_experts\": 8, \"moe_intermediate_size\": 32, \"n_shared_experts\": 1, \"n_group\": 1, \"topk_group\": 1, \"first_k_dense_replace\": 0" \
  "dots1:\"n_routed_experts\": 8, \"moe_intermediate_size\": 32, \"n_shared_experts\": 1, \"first_k_dense_replace\": 0" \
  "glm4_moe:\"n_routed_experts\": 8, \"moe_intermediate_size\": 32, \"n_shared_experts\": 1, \"first_k_dense_replace\": 0" \
  "olmoe:\"num_experts\": 8, \"intermediate_size\": 32" \
  "gpt_oss:\"num_local_experts\": 8, \"intermediate_size\": 32" \
  "llama4_text:\"num_local_experts\": 8, \"intermediate_size\": 32, \"interleave_moe_layer_step\": 1" \
  "jamba:\"num_experts\": 8, \"intermediate_size\": 32, \"expert_layer_period\": 1, \"expert_layer_offset\": 0" \
  "jetmoe:\"num_local_experts\": 8, \"intermediate_size\": 32" \
  "inkling_text:\"n_routed_experts\": 8, \"moe_intermediate_size\": 32, \"n_shared_experts\": 1" \
  "aria_text:\"moe_num_experts\": 8, \"intermediate_size\": 32, \"moe_topk\": 2, \"moe_num_shared_experts\": 1" \
  "gemma4_text:\"enable_moe_block\": true, \"num_experts\": 8, \"top_k_experts\": 2, \"moe_intermediate_size\": 32" \
  "phimoe:\"num_local_experts\": 8, \"intermediate_size\": 32" \
  "axk1:\"n_routed_experts\": 8, \"moe_intermediate_size\": 32, \"n_group\": 2, \"topk_group\": 1, \"first_k_dense_replace\": 0" \
  "longcat_flash:\"n_routed_experts\": 8, \"zero_expert_num\": 4, \"expert_ffn_hidden_size\": 32" \
  "switch_transformers:\"num_experts\": 8, \"d_ff\": 32, \"num_sparse_encoder_layers\": 1, \"num_sparse_decoder_layers\": 1, \"expert_capacity\": 1" \
  "nllb-moe:\"num_experts\": 8, \"encoder_ffn_dim\": 32, \"decoder_ffn_dim\": 32, \"encoder_layers\": 1, \"decoder_layers\": 1, \"encoder_sparse_step\": 1, \"decoder_sparse_step\": 1" \
  "doge:\"is_moe\": true, \"num_experts\": 20, \"intermediate_size\": 32" \
  "mistral_large4_text:\"n_routed_experts\": 8, \"moe_intermediate_size\": 32, \"n_shared_experts\": 1, \"first_k_dense_replace\": 0" \
  "nemotron_h:\"n_routed_experts\": 8, \"moe_intermediate_size\": 32, \"moe_shared_expert_intermediate_size\": 48, \"hybrid_override_pattern\": \"MEM*E-\"" \
  "nemotron_h:\"n_routed_experts\": 8, \"moe_intermediate_size\": 32, \"moe_shared_expert_intermediate_size\": 48, \"moe_latent_size\": 40, \"hybrid_override_pattern\": \"E\"" \
  "muse_spark_text:\"num_local_experts\": 8, \"moe_intermediate_size\": 32, \"moe_hidden_size\": 48" \
  "flint:\"num_experts\": 8, \"moe_intermediate_size\": 32, \"shared_expert_intermediate_size\": 32, \"mlp_only_layers\": []" \
  "zaya:\"num_experts\": 8, \"moe_intermediate_size\": 32, \"router_hidden_size\": 16"; do
  name=${fam%%:*}
  kf="$k" # LongCat-Flash counts its layers as num_layers (num_hidden_layers is twice it)
  [ "$name" = longcat_flash ] && kf='"hidden_size": 64, "num_layers": 1, "num_experts_per_tok": 2'
  [ "$name" = zaya ] && kf='"hidden_size": 64, "num_hidden_layers": 1, "num_experts_per_tok": 1' # Zaya's router takes 1
  printf '{"model_type": "%s", %s, %s}\n' "$name" "$kf" "${fam#*:}" > "$tmp/$name.json"
  "$moe8" init --config "$tmp/$name.json" --out "$tmp/init-$name" >/dev/null 2>"$tmp/err" || fail "init $name: $(cat "$tmp/err")"
  "$moe8" run --model "$tmp/init-$name" --input "$x" --output "$tmp/y-$name.npy" >/dev/null 2>"$tmp/err" ||
    fail "run on init's $name model: $(cat "$tmp/err")"
done
# llama4 (multimodal): the text model's keys in text_config, its layers under language_model.
printf '{"model_type": "llama4", "text_config": {"model_type": "llama4_text", %s, "num_local_experts": 8, "intermediate_size": 32, "interleave_moe_layer_step": 1}}\n' "$k" > "$tmp/llama4.json"
"$moe8" init --config "$tmp/llama4.json" --out "$tmp/init-llama4" --layers 2 >/dev/null 2>"$tmp/err" || fail "init llama4: $(cat "$tmp/err")"
"$moe8" run --model "$tmp/init-llama4" --input "$x" --output "$tmp/y-llama4.npy" --layer 1 >/dev/null 2>"$tmp/err" ||
  fail "run on init's llama4 model: $(cat "$tmp/err")"
# the other multimodal wrappers: text_config, layers under model.language_model. (Nemotron-H's: their files' roots)
for w in "qwen3_vl_moe:qwen3_vl_moe_text:\"num_experts\": 8, \"moe_intermediate_size\": 32" \
         "qwen3_5_moe:qwen3_5_moe_text:\"num_experts\": 8, \"moe_intermediate_size\": 32, \"shared_expert_intermediate_size\": 32" \
         "glm4v_moe:glm4v_moe_text:\"n_routed_experts\": 8, \"moe_intermediate_size\": 32, \"n_shared_experts\": 1, \"first_k_dense_replace\": 0" \
         "ernie4_5_vl_moe:ernie4_5_vl_moe_text:\"moe_num_experts\": 8, \"moe_intermediate_size\": [32, 16], \"mlp_layer_types\": [\"sparse\"]" \
         "gemma4:gemma4_text:\"enable_moe_block\": true, \"num_experts\": 8, \"top_k_experts\": 2, \"moe_intermediate_size\": 32" \
         "nemotron_h_omni:nemotron_h:\"n_routed_experts\": 8, \"moe_intermediate_size\": 32, \"hybrid_override_pattern\": \"ME\"" \
         "nemo_speechlm:nemotron_h:\"n_routed_experts\": 8, \"moe_intermediate_size\": 32, \"hybrid_override_pattern\": \"MEM*E\""; do
  outer=${w%%:*}; rest=${w#*:}; inner=${rest%%:*}
  printf '{"model_type": "%s", "text_config": {"model_type": "%s", %s, %s}}\n' "$outer" "$inner" "$k" "${rest#*:}" > "$tmp/$outer.json"
  "$moe8" init --config "$tmp/$outer.json" --out "$tmp/init-$outer" >/dev/null 2>"$tmp/err" || fail "init $outer: $(cat "$tmp/err")"
  "$moe8" run --model "$tmp/init-$outer" --input "$x" --output "$tmp/y-$outer.npy" >/dev/null 2>"$tmp/err" ||
    fail "run on init's $outer model: $(cat "$tmp/err")"
done
# Zaya: the router state from layer 0 into layer 1; layer 1 without it refused, naming the layer
"$moe8" init --config "$tmp/zaya.json" --out "$tmp/init-zaya2" --layers 2 >/dev/null 2>"$tmp/err" || fail "init zaya, 2 layers: $(cat "$tmp/err")"
"$moe8" run --model "$tmp/init-zaya2" --input "$x" --output "$tmp/y-zaya.npy" --router-state-out "$tmp/s-zaya.npy" >/dev/null 2>"$tmp/err" ||
  fail "zaya layer 0 with --router-state-out: $(cat "$tmp/err")"
"$moe8" run --model "$tmp/init-zaya2" --layer 1 --input "$x" --output "$tmp/y-zaya.npy" --router-state-in "$tmp/s-zaya.npy" \
  >/dev/null 2>"$tmp/err" || fail "zaya layer 1 with --router-state-in: $(cat "$tmp/err")"
"$moe8" run --model "$tmp/init-zaya2" --layer 1 --input "$x" --output "$tmp/y-zaya.npy" >/dev/null 2>"$tmp/err"
[ $? -eq 1 ] && grep -q "layer 1 .*--router-state-in" "$tmp/err" || fail "zaya layer 1 without a router state: $(cat "$tmp/err")"
# NLLB-MoE: info names the family and both stacks' sparse layers (the decoder's is layer 1), which runs;
# moe8 quantize keeps the experts' biases: its file's run is the bytes of init's model run under the rules
"$moe8" info "$tmp/init-nllb-moe" >"$tmp/out" 2>"$tmp/err" && grep -q 'model_type "nllb-moe"' "$tmp/out" &&
  grep -q "moe layers: 0-1 " "$tmp/out" || fail "info on init's nllb-moe model: $(cat "$tmp/err" "$tmp/out")"
"$moe8" run --model "$tmp/init-nllb-moe" --layer 1 --input "$x" --output "$tmp/y-nllb.npy" --rules "$(dirname "$0")/../examples/rules/fp8.json" \
  >/dev/null 2>"$tmp/err" || fail "run on init's nllb-moe decoder layer: $(cat "$tmp/err")"
"$moe8" quantize "$tmp/init-nllb-moe" "$tmp/q-nllb-moe" --rules "$(dirname "$0")/../examples/rules/fp8.json" >/dev/null 2>"$tmp/err" ||
  fail "quantize init's nllb-moe model: $(cat "$tmp/err")"
"$moe8" run --model "$tmp/q-nllb-moe" --layer 1 --input "$x" --output "$tmp/yq-nllb.npy" >/dev/null 2>"$tmp/err" ||
  fail "run on the quantized nllb-moe model: $(cat "$tmp/err")"
cmp -s "$tmp/y-nllb.npy" "$tmp/yq-nllb.npy" || fail "nllb-moe: the quantized file's run differs from the input's run under the rules"
echo "init then run: every family ok"
# examples/: every tiny config through init then run under every rules
# file; the released-size configs with their widths and expert counts
# shrunk (every other key as released) the same way.
ex="$(dirname "$0")/../examples"
for r in "$ex"/rules/*.json; do
  for c in "$ex"/configs/*_tiny.json; do
    n=$(basename "$c" .json)
    [ -d "$tmp/ex-$n" ] || "$moe8" init --config "$c" --out "$tmp/ex-$n" >/dev/null 2>"$tmp/err" || fail "init $c: $(cat "$tmp/err")"
    "$moe8" run --model "$tmp/ex-$n" --input "$x" --output "$tmp/y.npy" --rules "$r" >/dev/null 2>"$tmp/err" ||
      fail "run on $c under $r: $(cat "$tmp/err")"
  done
done
for c in "$ex"/configs/*.json; do
  case "$c" in *_tiny.json) continue ;; esac
  n=$(basename "$c" .json)
  python3 - "$c" "$tmp/$n.json" <<'PY' || fail "shrink $c"
import json, sys
c = json.load(open(sys.argv[1]))
c.update({k: v for k, v in {"hidden_size": 64, "intermediate_size": 32, "moe_intermediate_size": 32}.items() if k in c})
for k in ("num_experts", "num_local_experts", "n_routed_experts"):
    if k in c:
        c[k] = 16 if c.get("n_group", 1) > 1 else 8
c["num_hidden_layers"] = c.get("first_k_dense_replace", 0) + 1
json.dump(c, open(sys.argv[2], "w"))
PY
  "$moe8" init --config "$tmp/$n.json" --out "$tmp/ex-$n" >/dev/null 2>"$tmp/err" || fail "init $c (shrunk): $(cat "$tmp/err")"
  "$moe8" run --model "$tmp/ex-$n" --input "$x" --output "$tmp/y.npy" --rules "$ex/rules/fp8.json" >/dev/null 2>"$tmp/err" ||
    fail "run on $c (shrunk): $(cat "$tmp/err")"
done
echo "examples: every config and rules file ok"
echo "cli smoke: ok"
