/*
** info.c — 'moe8 info DIR': what a model directory holds.
*/
#include "cli.h"

#include <string.h>

int cmd_info(int argc, char **argv) {
  const char *dir = NULL, *arch = NULL;
  int tensors = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--arch") && i + 1 < argc) { arch = argv[++i]; continue; }
    if (!strcmp(argv[i], "--tensors")) { tensors = 1; continue; }
    if (cli_is_help(argv[i])) {
      printf("usage: moe8 info MODEL_DIR [--arch FAMILY] [--tensors]\n\nPrints the detected architecture, the MoE sizes from config.json,\n"
             "the routing, the shared expert, the MoE layers and the expert-weight quantization; with --tensors\n"
             "also every tensor (name, dtype, shape, bytes).\nexit codes: 0 ok, 1 failure, 2 usage\n");
      return EXIT_OK;
    }
    if (dir || argv[i][0] == '-') { fprintf(stderr, "moe8 info: bad argument '%s'\n", argv[i]); return EXIT_USAGE; }
    dir = argv[i];
  }
  if (!dir) { fprintf(stderr, "usage: moe8 info MODEL_DIR\n"); return EXIT_USAGE; }
  moe8_model *m;
  moe8_status st = moe8_model_open_as(dir, arch, &m);
  if (st != MOE8_OK) return cli_report(st, "info");
  const moe8_hf_config *c = moe8_model_config(m);
  size_t total = 0;
  for (size_t i = 0; i < moe8_model_tensor_count(m); i++) total += moe8_model_tensor_at(m, i)->nbytes;
  printf("architecture: %s (model_type \"%s\"), %lld layer(s)\n", moe8_arch_name(c->arch), c->model_type, (long long)c->num_layers);
  printf("moe: experts %lld, top_k %lld, hidden %lld, expert ffn %lld, score %s, norm_topk_prob %s, routed_scaling_factor %g%s\n",
         (long long)c->layer.num_experts, (long long)c->layer.top_k, (long long)c->layer.hidden, (long long)c->layer.ffn,
         c->layer.score == MOE8_SCORE_SIGMOID ? "sigmoid" : c->layer.score == MOE8_SCORE_SQRTSOFTPLUS ? "sqrtsoftplus"
         : c->layer.score == MOE8_SCORE_SPARSEMIXER ? "sparsemixer" : "softmax",
         c->layer.norm_topk_prob ? "true" : "false",
         c->layer.routed_scaling_factor ? (double)c->layer.routed_scaling_factor : 1.0, c->has_bias ? ", selection bias" : "");
  if (c->layer.n_group > 1)
    printf("routing: group-limited top-%lld: %lld groups of %lld experts, the best %lld kept (group score: %s)\n", (long long)c->layer.top_k,
           (long long)c->layer.n_group, (long long)(c->layer.num_experts / c->layer.n_group), (long long)c->layer.topk_group,
           c->layer.group_score == MOE8_GROUP_MAX ? "its best softmax score, DeepSeek-V2's group_limited_greedy"
                                                  : "sum of its top-2 scores + bias, DeepSeek-V3's noaux_tc");
  else if (c->layer.weight_input)
    printf("routing: top-%lld of %lld logits, sigmoid of each chosen logit scaling that expert's input (Llama-4), outputs summed\n",
           (long long)c->layer.top_k, (long long)c->layer.num_experts);
  else if (c->layer.score == MOE8_SCORE_SPARSEMIXER)
    printf("routing: sparsemixer (PhiMoE), 2 of %lld: the top logit, then the top of the others, each weighted by its softmax over the "
           "experts within 2 x %g (router_jitter_noise) of it, relative to max(|logit|, top)\n", (long long)c->layer.num_experts,
           (double)c->layer.router_jitter);
  else if (c->layer.product_keys) {
    long long n = 1;
    while ((n + 1) * (n + 1) <= (long long)c->layer.num_experts) n++;
    printf("routing: product keys (Doge): router_gate's 2 x %lld keys, the logits read as transformers' view(2, tokens, %lld) (for "
           "several tokens a token's two halves are other tokens' logits: its output depends on the tokens of the call; one token "
           "alone is its own), each half sorted, the top-%lld of the %lld sums (expert a x %lld + b), softmax over them%s\n", n, n,
           (long long)c->layer.top_k, n * n, n, c->layer.norm_topk_prob ? ", / their sum" : "");
  } else if (c->nllb) {
    char capb[96];
    if (c->layer.capacity_fraction > 0.0) snprintf(capb, sizeof capb, "ceil(%g x T) (moe_eval_capacity_token_fraction)", c->layer.capacity_fraction);
    else snprintf(capb, sizeof capb, "%lld (expert_capacity)", (long long)c->layer.expert_capacity);
    printf("routing: top-2 of %lld (softmax over all experts in f32%s); expert capacity %s over all T rows of a forward: every "
           "token's first choice queued in token order, then the second ones, a choice past the capacity dropped; the kept pair "
           "renormalized (/ max(sum, eps)), times %g (1 - moe_token_dropout)\n", (long long)c->layer.num_experts,
           c->layer.router_bias ? ", the router's bias added" : "", capb, (double)c->layer.routed_scaling_factor);
  } else if (c->encdec)
    printf("routing: top-1 of %lld (softmax over all experts in f32%s), weighted by its probability; expert capacity %lld: in each "
           "sequence (moe8 run --seq-len), a token past the first %lld that chose its expert is dropped (its output 0)\n",
           (long long)c->layer.num_experts, c->layer.router_bias ? ", the router's bias added" : "", (long long)c->layer.expert_capacity,
           (long long)c->layer.expert_capacity);
  else if (c->layer.router_mlp > 0)
    printf("routing: an MLP router (Zaya's) of width %lld: s = down_proj(x) (+ the previous layer's router state x "
           "router_states_scale, after the first layer), then RMSNorm (eps %g), fc1 + GELU, fc2 + GELU, out_proj to %lld + %lld skip "
           "class(es); top-%lld of the softmax + balancing_biases, weighted by the softmax (no renormalization); a skip class adds "
           "nothing; the state s goes to the next layer (moe8 run --router-state-in / --router-state-out)\n",
           (long long)c->layer.router_mlp, (double)c->layer.rms_eps, (long long)c->layer.num_experts, (long long)c->layer.skip_experts,
           (long long)c->layer.top_k);
  else if (c->layer.zero_experts)
    printf("routing: top-%lld of %lld + %lld identity experts (softmax over all, chosen by score + correction bias), weights the "
           "scores x %g; an identity expert adds its weight x the input (LongCat-Flash's zero-computation experts)\n",
           (long long)c->layer.top_k, (long long)c->layer.num_experts, (long long)c->layer.zero_experts,
           c->layer.routed_scaling_factor ? (double)c->layer.routed_scaling_factor : 1.0);
  else if (c->arch == MOE8_ARCH_GPT_OSS)
    printf("routing: logits + router bias, top-%lld of %lld, softmax over the %lld chosen logits\n", (long long)c->layer.top_k,
           (long long)c->layer.num_experts, (long long)c->layer.top_k);
  else if (c->layer.scored_shared > 0) {
    const long long S = (long long)c->layer.scored_shared;
    printf("routing: top-%lld of the %lld routed experts (sigmoid scores + correction bias), and the %lld shared experts (the last "
           "%lld), all %lld weighted by their sigmoid scores over their sum (Inkling)\n", (long long)c->layer.top_k - S,
           (long long)c->layer.num_experts - S, S, S, (long long)c->layer.top_k);
  } else
    printf("routing: top-%lld of %lld (%s)%s\n", (long long)c->layer.top_k, (long long)c->layer.num_experts,
           c->layer.score == MOE8_SCORE_SIGMOID ? "sigmoid scores"
           : c->layer.score == MOE8_SCORE_SQRTSOFTPLUS ? "sqrt(softplus(logit)) scores" : "softmax over all experts",
           c->has_bias ? ", chosen by score + correction bias, weighted by the scores" : "");
  if (c->top_layers && c->layer.scored_shared == 0) {
    /* DeepSeek-V4: the hash layers, runs of consecutive indices */
    int64_t nh = 0;
    for (int64_t l = 0; l < c->num_layers && l < MOE8_MAX_MLP_ONLY; l++) nh += c->hash_moe[l];
    printf("weights: the chosen scores / (their sum + %g), x %g\n", (double)c->layer.norm_eps,
           c->layer.routed_scaling_factor ? (double)c->layer.routed_scaling_factor : 1.0);
    printf("hash routing:%s", nh ? " layer(s)" : " none");
    for (int64_t l = 0, r0 = -1; l <= c->num_layers && l <= MOE8_MAX_MLP_ONLY; l++) {
      const bool h = l < c->num_layers && l < MOE8_MAX_MLP_ONLY && c->hash_moe[l];
      if (h && r0 < 0) r0 = l;
      if (!h && r0 >= 0) {
        printf(" %lld", (long long)r0);
        if (l - 1 > r0) printf("-%lld", (long long)(l - 1));
        r0 = -1;
      }
    }
    if (nh)
      printf(" (%lld of %lld, mlp_layer_types \"hash_moe\"): a token's experts are gate.tid2eid[token id] (%lld rows: vocab_size), "
             "weighted by their scores, no bias; moe8 run needs --token-ids there", (long long)nh, (long long)c->num_layers,
             (long long)c->vocab_size);
    printf("\n");
  }
  if (c->layer.act == MOE8_ACT_SWIGLU_CLAMP)
    printf("experts: clamped SwiGLU (gate <= %g, |up| <= %g, alpha %g, (up + 1) * gate * sigmoid(alpha gate))%s\n", (double)c->layer.act_limit,
           (double)c->layer.act_limit, (double)c->layer.act_alpha, c->layer.expert_bias ? ", gate/up and down biases" : "");
  else if (c->layer.act == MOE8_ACT_SWIGLU_LIMIT)
    printf("experts: limited SwiGLU, down(silu(min(gate(x), %g)) * clamp(up(x), -%g, %g))%s\n", (double)c->layer.act_limit,
           (double)c->layer.act_limit, (double)c->layer.act_limit,
           c->layer.shared_ffn > 0 ? (c->layer.shared_plain_act ? "; the shared expert unclamped" : "; the shared expert too") : "");
  else if (c->layer.act == MOE8_ACT_SWIGLU_POST) {
    int64_t nl = 0;
    for (int64_t l = 0; c->per_layer_limits && l < c->num_layers && l < MOE8_MAX_MLP_ONLY; l++)
      nl += c->act_limits[l] > 0 || c->shared_act_limits[l] > 0;
    printf("experts: SwiGLU clamped after the activation, down(min(silu(gate(x)), L) * clamp(up(x), -L, L)), L per layer "
           "(swiglu_limits, swiglu_limits_shared): %lld layer(s) clamped\n", (long long)nl);
  } else if (c->layer.act == MOE8_ACT_SILU)
    printf("experts: single neurons, silu(x . down_embed[e]) x weight x up_embed[e] (down_embed, up_embed [%lld, %lld])\n",
           (long long)c->layer.num_experts, (long long)c->layer.hidden);
  else if (c->layer.act == MOE8_ACT_RELU2 || c->layer.act == MOE8_ACT_RELU)
    printf("experts: ungated, down(%s(up(x))%s) (no gate projection)%s\n", "relu", c->layer.act == MOE8_ACT_RELU2 ? "^2" : "",
           c->layer.shared_ffn > 0 ? "; the shared expert too" : "");
  else if (c->layer.act == MOE8_ACT_SWIGLU_SOFTCAP)
    printf("experts: softcapped SwiGLU, down(%g tanh(gate(x) / %g) * sigmoid(gate(x)) * %g tanh(up(x) / %g))\n", (double)c->layer.act_alpha,
           (double)c->layer.act_alpha, (double)c->layer.act_limit, (double)c->layer.act_limit);
  else if (c->layer.act == MOE8_ACT_GEGLU)
    printf("experts: GeGLU, down(gelu_tanh(gate(x)) * up(x)) (gelu_pytorch_tanh)\n");
  else
    printf("experts: SwiGLU, down(silu(gate(x)) * up(x))\n");
  if (c->layer.shared_ffn > 0 && c->layer.product_keys)
    printf("shared expert: the dense SwiGLU of width %lld (gate_proj, up_proj, down_proj), added\n", (long long)c->layer.shared_ffn);
  else if (c->layer.shared_ffn > 0)
    printf("shared expert: width %lld, %s\n", (long long)c->layer.shared_ffn,
           c->layer.shared_gate ? "scaled by sigmoid(x . shared_expert_gate)" : "added ungated");
  else if (c->layer.scored_shared > 0)
    printf("shared experts: %lld of the experts' width, routed by their scores (above); x each layer's gate.global_scale\n",
           (long long)c->layer.scored_shared);
  else
    printf("shared expert: none\n");
  if (c->layer.shared_ffn > 0 && c->layer.shared_scale != 0.0f && c->layer.shared_scale != 1.0f)
    printf("combination: routed sum x %g + shared expert x %g\n", (double)c->layer.routed_scaling_factor, (double)c->layer.shared_scale);
  if (c->layer.out_bias) printf("output bias: the block's bias [%lld] added to its output\n", (long long)c->layer.hidden);
  if (c->layer.router_norm || c->layer.in_norm || c->layer.out_norm || c->layer.expert_scale)
    printf("norms (Gemma-4's routed branch, eps %g): the router reads RMSNorm(h) * router.scale * %g; weights x "
           "router.per_expert_scale; the experts read pre_feedforward_layernorm_2(h); the output is post_feedforward_layernorm_2 "
           "of the routed sum\n", (double)c->layer.rms_eps, (double)c->layer.router_norm_scale);
  if (c->layer.latent > 0)
    printf("latent experts: width %lld between x . P (%s) and the weighted sum . Q (%s)%s; the router and the shared expert read x\n",
           (long long)c->layer.latent, c->layer.latent_norm ? "pre_expert_proj, then pre_expert_norm's (1 + w)" : "fc1_latent_proj",
           c->layer.latent_norm ? "post_expert_proj" : "fc2_latent_proj",
           c->layer.expert_out_norm ? "; each expert's output scaled by post_expert_norm's (1 + w), then RMS-normalized" : "");
  if (c->router_logit_scale != 0.0f && c->router_logit_scale != 1.0f)
    printf("router: logits x %g (output_multiplier)\n", (double)c->router_logit_scale);
  if (c->nllb) /* NLLB-MoE: one numbering over both stacks */
    printf("layers (an encoder-decoder): 0-%lld the encoder's layers 0-%lld (model.encoder.layers.i.ffn.), %lld-%lld the decoder's "
           "layers 0-%lld (model.decoder.layers.i.ffn.); --layer L numbers them so\n", (long long)c->enc_layers - 1,
           (long long)c->enc_layers - 1, (long long)c->enc_layers, (long long)c->num_layers - 1,
           (long long)(c->num_layers - c->enc_layers) - 1);
  else if (c->encdec) /* SwitchTransformers: one numbering over both stacks */
    printf("layers (an encoder-decoder): 0-%lld the encoder's blocks 0-%lld (encoder.block.i.layer.1.mlp.), %lld-%lld the decoder's "
           "blocks 0-%lld (decoder.block.i.layer.2.mlp.); --layer L numbers them so\n", (long long)c->enc_layers - 1,
           (long long)c->enc_layers - 1, (long long)c->enc_layers, (long long)c->num_layers - 1,
           (long long)(c->num_layers - c->enc_layers) - 1);
  /* Which layers are MoE: runs of consecutive indices. */
  printf("moe layers:");
  int64_t nmoe = 0, run0 = -1;
  for (int64_t l = 0; l <= c->num_layers; l++) {
    const int moe = l < c->num_layers && moe8_hf_config_check_moe_layer(c, l) == MOE8_OK;
    if (moe && run0 < 0) run0 = l;
    if (!moe && run0 >= 0) {
      printf(" %lld", (long long)run0);
      if (l - 1 > run0) printf("-%lld", (long long)(l - 1));
      nmoe += l - run0;
      run0 = -1;
    }
  }
  moe8_clear_error();
  if (nmoe == 0) printf(" none (every layer is a dense MLP layer)\n");
  else if (nmoe == c->num_layers) printf(" (all %lld layers)\n", (long long)nmoe);
  else printf(" (%lld of %lld; the others are dense MLP layers)\n", (long long)nmoe, (long long)c->num_layers);
  const int64_t l0 = moe8_hf_config_first_moe_layer(c);
  printf("quantization: layer %lld experts %s%s\n", (long long)(l0 < 0 ? 0 : l0), moe8_model_format(m, l0 < 0 ? 0 : l0),
         c->fp8 ? " (config: quant_method fp8)" : "");
  if (strstr(moe8_model_format(m, l0 < 0 ? 0 : l0), "mxfp4"))
    printf("mxfp4 runs: kept as 4.25-bit codes for inference; activations f32 without rules (the exact product), or int8 under a rule\n"
           "  such as {\"act_qtype\": \"int8\", \"tile_size\": 32} (the int8 MXFP4 kernels: the fast decode, docs/numerics.md)\n");
  printf("tensors: %zu, total %zu bytes (%.2f MiB)%s\n", moe8_model_tensor_count(m), total, (double)total / 1048576.0,
         tensors ? "" : " (--tensors lists them)");
  for (size_t i = 0; tensors && i < moe8_model_tensor_count(m); i++) {
    const moe8_tensor_view *t = moe8_model_tensor_at(m, i);
    char shape[128] = "";
    for (int d = 0; d < t->ndim; d++) snprintf(shape + strlen(shape), sizeof shape - strlen(shape), "%s%lld", d ? ", " : "", (long long)t->shape[d]);
    printf("  %-64s %-8s [%s] %zu bytes\n", t->name, moe8_file_dtype_name(t->dtype), shape, t->nbytes);
  }
  moe8_model_close(m);
  return EXIT_OK;
}
