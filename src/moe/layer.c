/*
** layer.c — the MoE layer: forward, backward, prepare and the fused forward
** (docs/layer.md).
**
** Forward, in order, each step into the caller's workspace:
**   1. logits = x · Wr, scores, top-k, weights (router.c);
**   2. the stable dispatch sort (dispatch.c);
**   3. the expert input rows: x gathered by token_of and, when the rule
**      quantizes activations, quantized per token (or 1×tile) either before
**      the gather (quantize x[T, D], gather q and scale rows) or after it
**      (gather f32 rows, quantize) — byte-identical by docs/numerics.md;
**   4. gu = xs · [Wg | Wu] ([E, D, 2F], one gmm), h = silu(g) ⊙ u in f32,
**      h quantized per row for the down matmul when activations are;
**   5. y = h · Wd, then the combine into out.
** The unfused forward quantizes the weights from the f32 masters on every
** call (training); prepare() does it once and forward_fused() reuses it.
** Both then run the same code, so they agree bit for bit, and neither
** allocates: gmm scratch is a slice of the workspace.
**
** The phases that every parallel mode runs on its rows (the expert sets'
** forward and backward, the shared expert, the router backward, the aux
** loss, the output check) are in phases.c.
**
** Backward reads what forward saved (routing, rows, gu, h, y) and follows
** the straight-through rule: every quantizer is the identity for gradients,
** and the matmuls of the backward use the dequantized values the forward
** consumed.  Its temporaries are allocated per call.
**
** When a rule quantizes activations but the pair (activation type, weight
** type) has no kernel (e.g. f8 activations with i8 or f32 weights), the
** activations are quantized and dequantized ("fake quantization") and the
** matmul runs on f32 activations: the numbers are those of the quantized
** matmul up to f32 summation order.
*/
#include "../core/internal.h"
#include "../kernels/gmm.h"
#include "layer_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>



/* ---- create / destroy ------------------------------------------------------ */
/* a·b·c·d for sizes already known to be positive, or -1 past 2^62. */
static int64_t mul4(int64_t a, int64_t b, int64_t c, int64_t d) {
  int64_t r = 1;
  const int64_t v[4] = {a, b, c, d};
  for (int i = 0; i < 4; i++) {
    if (v[i] != 0 && r > ((int64_t)1 << 62) / v[i]) return -1;
    r *= v[i];
  }
  return r;
}

static void set_describe(moe8_layer *L, const char *how) {
  const moe8_rule *r = L->has_rule ? &L->rule : NULL;
  snprintf(L->describe, sizeof L->describe, "weights %s%s%s, activations %s%s%s%s",
           L->wq ? moe8_dtype_info(L->wspec.qtype)->name : "f32",
           L->wq ? (L->wspec.tile ? " [E,K/tile,1,N]" : " [E,1,1,N]") : "", how,
           L->aq ? moe8_dtype_info(L->aspec.qtype)->name : "f32",
           L->aq ? (L->aspec.tile ? " 1xtile" : " per-token") : "",
           r && r->bwd_qtype ? ", gradients " : "", r && r->bwd_qtype ? moe8_dtype_info(r->bwd_qtype)->name : "");
  if (L->cfg.shared_ffn > 0)
    snprintf(L->describe + strlen(L->describe), sizeof L->describe - strlen(L->describe), ", shared expert %lld%s",
             (long long)L->cfg.shared_ffn, L->cfg.shared_gate ? " (sigmoid gate)" : "");
}

/* The describe text of a layer with MXFP4 experts: the weights (how they
** came), then the activations. */
static void mx4_describe(moe8_layer *L, const char *how) {
  char acts[48] = "f32";
  if (L->aq && L->aspec.tile) snprintf(acts, sizeof acts, "int8 1x%lld", (long long)L->aspec.tile);
  else if (L->aq) snprintf(acts, sizeof acts, "int8 per-token");
  snprintf(L->describe, sizeof L->describe, "weights mxfp4 [E,N,K/32] (%s, OCP MX: E2M1 codes, E8M0 scale per 32 along K), activations %s", how,
           acts);
}

moe8_status moe8__layer_create(const moe8_layer_config *cfg, const moe8_rules *rules, const char *module_path, bool inference,
                               moe8_layer **out) {
  if (!cfg || !out) return moe8__fail(MOE8_ERR_INVALID_ARG, "layer: NULL argument");
  *out = NULL;
  const int64_t E = cfg->num_experts, K = cfg->top_k, D = cfg->hidden, F = cfg->ffn, Fs = cfg->shared_ffn, Z = cfg->zero_experts;
  const int64_t R = cfg->router_mlp, S = cfg->skip_experts;
  const int64_t maxE = cfg->product_keys ? MOE8_MAX_PK_EXPERTS : MOE8_MAX_EXPERTS;
  if (E <= 0 || E > maxE)
    return moe8__fail(MOE8_ERR_SHAPE, "layer: num_experts = %lld must be in [1, %lld]%s", (long long)E, (long long)maxE,
                      cfg->product_keys ? " (product-key experts)" : "");
  if (Z < 0 || (Z > 0 && Z > MOE8_MAX_EXPERTS - E))
    return moe8__fail(MOE8_ERR_SHAPE, "layer: zero_experts = %lld must be in [0, %lld] (num_experts + zero_experts at most %d)", (long long)Z,
                      (long long)(MOE8_MAX_EXPERTS - E), MOE8_MAX_EXPERTS);
  if (S < 0 || (S > 0 && S > MOE8_MAX_EXPERTS - E - Z))
    return moe8__fail(MOE8_ERR_SHAPE, "layer: skip_experts = %lld must be in [0, %lld] (the router's classes at most %d)", (long long)S,
                      (long long)(MOE8_MAX_EXPERTS - E - Z), MOE8_MAX_EXPERTS);
  if (K <= 0 || K > E + Z + S)
    return moe8__fail(MOE8_ERR_SHAPE, "layer: top_k = %lld must be in [1, num_experts + zero_experts + skip_experts = %lld]", (long long)K,
                      (long long)(E + Z + S));
  if (R < 0 || R > ((int64_t)1 << 24) || (cfg->router_state && R == 0))
    return moe8__fail(MOE8_ERR_INVALID_ARG, "layer: router_mlp = %lld must be 0 (a linear router) or the MLP router's width in [1, 2^24]%s",
                      (long long)R, cfg->router_state && R == 0 ? ", and router_state (the previous layer's router state) needs it" : "");
  if ((R > 0 || S > 0) && (Z > 0 || cfg->capacity_factor > 0.0f || cfg->expert_capacity != 0 || cfg->capacity_ranked || cfg->aux_loss_weight != 0.0f ||
                           cfg->n_group > 1 || cfg->hash_routing || cfg->score == MOE8_SCORE_SPARSEMIXER || cfg->scored_shared ||
                           cfg->weight_input || (R > 0 && cfg->router_norm)))
    return moe8__fail(MOE8_ERR_UNSUPPORTED, "layer: %s (Zaya's) with zero_experts, a capacity factor, expert_capacity, an aux loss, "
                      "groups, hash routing, the sparsemixer router, scored_shared, weight_input or router_norm: not implemented",
                      R > 0 ? "the MLP router (router_mlp)" : "skip_experts");
  if (cfg->act == MOE8_ACT_SILU && !cfg->product_keys)
    return moe8__fail(MOE8_ERR_UNSUPPORTED, "layer: act silu (ungated, h = silu(x Wu)) is the product-key experts' (product_keys); other "
                      "experts take silu gated (swiglu)");
  if (cfg->product_keys) {
    /* Doge's block: product-key routing over single-neuron silu experts,
    ** and nothing else of the routing or expert forms (pkeys.c) */
    const int64_t N = moe8__pk_keys(E);
    if (K > N * N || K > MOE8_MAX_EXPERTS)
      return moe8__fail(MOE8_ERR_SHAPE, "layer: product keys: top_k = %lld must be at most floor(sqrt(num_experts))^2 = %lld (the "
                        "candidates) and %d", (long long)K, (long long)(N * N), MOE8_MAX_EXPERTS);
    if (cfg->act != MOE8_ACT_SILU || F != 1)
      return moe8__fail(MOE8_ERR_UNSUPPORTED, "layer: product-key experts are single silu neurons: act must be silu (%d, not %d) and ffn 1 "
                        "(not %lld)", (int)MOE8_ACT_SILU, (int)cfg->act, (long long)F);
    const char *other = cfg->score != MOE8_SCORE_SOFTMAX ? "a score function (their weights are the softmax of the k candidates)"
                        : cfg->use_selection_bias ? "a selection bias" : cfg->n_group > 1 ? "groups" : cfg->router_bias ? "a router bias"
                        : cfg->expert_bias ? "expert biases" : Z > 0 ? "zero_experts" : cfg->hash_routing ? "hash routing"
                        : cfg->scored_shared ? "scored_shared" : cfg->weight_input ? "weight_input"
                        : cfg->capacity_factor > 0.0f ? "a capacity factor" : cfg->expert_capacity ? "expert_capacity"
                        : cfg->aux_loss_weight != 0.0f ? "an aux loss" : cfg->latent || cfg->latent_norm ? "latent experts"
                        : cfg->expert_out_norm ? "a per-expert output norm"
                        : cfg->router_norm || cfg->expert_scale || cfg->in_norm || cfg->out_norm ? "Gemma-4's norms and scales"
                        : cfg->select_logits ? "select_logits" : cfg->norm_p != 0.0f && cfg->norm_p != 1.0f ? "a p-norm"
                        : cfg->norm_min != 0.0f || cfg->norm_eps != 0.0f ? "norm_min or norm_eps"
                        : R > 0 || S > 0 ? "Zaya's MLP router or skip experts" : NULL;
    if (other)
      return moe8__fail(MOE8_ERR_UNSUPPORTED, "layer: product-key experts (Doge's) with %s: not implemented", other);
  }
  if (Z > 0 && (cfg->capacity_factor > 0.0f || cfg->aux_loss_weight != 0.0f || cfg->n_group > 1 || cfg->weight_input || cfg->hash_routing ||
                cfg->score == MOE8_SCORE_SPARSEMIXER || cfg->router_norm || cfg->expert_scale || cfg->in_norm || cfg->out_norm ||
                cfg->scored_shared))
    return moe8__fail(MOE8_ERR_UNSUPPORTED, "layer: zero_experts (identity experts, LongCat-Flash's) with a capacity factor, an aux loss, "
                      "groups, weight_input, hash routing, the sparsemixer router, Gemma-4's norms and scales or scored_shared: not "
                      "implemented");
  if (cfg->capacity_ranked && (!(cfg->capacity_fraction >= 0.0 && cfg->capacity_fraction < 1e30) ||
                               (cfg->capacity_fraction == 0.0 && cfg->expert_capacity <= 0) || cfg->norm_topk_prob))
    return moe8__fail(MOE8_ERR_INVALID_ARG, "layer: capacity_ranked (NLLB-MoE's capacity) needs capacity_fraction (%g) in [0, 1e30), a "
                      "positive expert_capacity (%lld) when it is 0, and no norm_topk_prob (it renormalizes after the drop)",
                      cfg->capacity_fraction, (long long)cfg->expert_capacity);
  if (cfg->expert_capacity < 0 || (moe8__capacity_on(cfg) && (Z > 0 || cfg->hash_routing || cfg->scored_shared || cfg->weight_input ||
                                                                  cfg->capacity_factor > 0.0f || cfg->aux_loss_weight != 0.0f ||
                                                                  cfg->latent > 0 || cfg->expert_out_norm)))
    return moe8__fail(MOE8_ERR_UNSUPPORTED, "layer: expert_capacity = %lld must be >= 0, and a capacity (SwitchTransformers') goes with no "
                      "zero_experts, hash routing, scored_shared, weight_input, capacity factor, aux loss, latent experts or per-expert "
                      "output norm: not implemented",
                      (long long)cfg->expert_capacity);
  if (D <= 0 || F <= 0 || Fs < 0)
    return moe8__fail(MOE8_ERR_SHAPE, "layer: hidden = %lld, ffn = %lld must be positive and shared_ffn = %lld non-negative",
                      (long long)D, (long long)F, (long long)Fs);
  if (cfg->latent < 0 || cfg->latent > ((int64_t)1 << 40) ||
      (cfg->latent > 0 && (cfg->expert_bias || cfg->in_norm || cfg->weight_input || Z > 0)) || (cfg->latent_norm && cfg->latent <= 0))
    return moe8__fail(MOE8_ERR_INVALID_ARG, "layer: latent = %lld must be 0 or a positive width, without expert_bias, in_norm, "
                      "weight_input or zero_experts, and latent_norm needs it", (long long)cfg->latent);
  if (!(cfg->expert_out_eps >= 0.0f && cfg->expert_out_eps < 1e30f))
    return moe8__fail(MOE8_ERR_INVALID_ARG, "layer: expert_out_eps %g must be in [0, 1e30)", (double)cfg->expert_out_eps);
  if (mul4(E, D, 2 * F, 4) < 0 || mul4(E, cfg->latent, 2 * F, 4) < 0 || mul4(D, cfg->latent, 4, 1) < 0 || mul4(Fs, D, 2, 4) < 0 || mul4(D, E, 4, 1) < 0 ||
      mul4(D + R, R + E + S, 4, 1) < 0)
    return moe8__fail(MOE8_ERR_SHAPE, "layer: sizes E = %lld, hidden = %lld, ffn = %lld, shared_ffn = %lld overflow 64-bit byte counts",
                      (long long)E, (long long)D, (long long)F, (long long)Fs);
  if (cfg->score != MOE8_SCORE_SOFTMAX && cfg->score != MOE8_SCORE_SIGMOID && cfg->score != MOE8_SCORE_SQRTSOFTPLUS &&
      cfg->score != MOE8_SCORE_SPARSEMIXER)
    return moe8__fail(MOE8_ERR_INVALID_ARG, "layer: unknown score function %d (softmax 0, sigmoid 1, sqrtsoftplus 2, sparsemixer 3)",
                      (int)cfg->score);
  if (cfg->score == MOE8_SCORE_SPARSEMIXER &&
      (K != 2 || cfg->use_selection_bias || cfg->n_group > 1 || cfg->select_logits || cfg->hash_routing || cfg->norm_topk_prob ||
       cfg->weight_input || !(cfg->router_jitter >= 0.0f && cfg->router_jitter < 1e30f)))
    return moe8__fail(MOE8_ERR_INVALID_ARG, "layer: the sparsemixer router (PhiMoE) chooses 2 experts (top_k %lld) by its own rule: no "
                      "selection bias, groups, select_logits, hash routing, norm_topk_prob or weight_input with it, and router_jitter "
                      "(%g) finite and >= 0", (long long)K, (double)cfg->router_jitter);
  if (cfg->hash_routing && (cfg->use_selection_bias || cfg->n_group > 1 || cfg->select_logits || cfg->weight_input))
    return moe8__fail(MOE8_ERR_INVALID_ARG, "layer: hash routing takes each token's experts from its table: no selection bias, groups, "
                      "select_logits or weight_input with it");
  if (cfg->scored_shared < 0 ||
      (cfg->scored_shared > 0 && (cfg->scored_shared >= K || cfg->n_group > 1 || cfg->hash_routing || cfg->score == MOE8_SCORE_SPARSEMIXER)))
    return moe8__fail(MOE8_ERR_INVALID_ARG, "layer: scored_shared = %lld must be 0, or in [1, top_k = %lld) without groups, hash routing or the sparsemixer router",
                      (long long)cfg->scored_shared, (long long)K);
  if (!(cfg->norm_min >= 0.0f && cfg->norm_min < 1e30f) || !(cfg->norm_eps >= 0.0f && cfg->norm_eps < 1e30f))
    return moe8__fail(MOE8_ERR_INVALID_ARG, "layer: norm_min %g and norm_eps %g must be in [0, 1e30)", (double)cfg->norm_min,
                      (double)cfg->norm_eps);
  if (cfg->norm_p != 0.0f && cfg->norm_p != 1.0f &&
      (!(cfg->norm_p > 0.0f && cfg->norm_p < 1e30f) || cfg->norm_min != 0.0f || cfg->norm_eps != 0.0f))
    return moe8__fail(MOE8_ERR_INVALID_ARG, "layer: norm_p %g must be 0 (the sum) or a positive finite p, with norm_min and norm_eps 0",
                      (double)cfg->norm_p);
  if (!isfinite(cfg->shared_scale) || (cfg->shared_scale != 0.0f && cfg->shared_gate))
    return moe8__fail(MOE8_ERR_INVALID_ARG, "layer: shared_scale %g must be finite, and 0 with shared_gate", (double)cfg->shared_scale);
  if (!isfinite(cfg->aux_loss_weight) || !isfinite(cfg->capacity_factor) || !isfinite(cfg->routed_scaling_factor))
    return moe8__fail(MOE8_ERR_INVALID_ARG, "layer: aux_loss_weight, capacity_factor and routed_scaling_factor must be finite");
  if (cfg->act != MOE8_ACT_SWIGLU && cfg->act != MOE8_ACT_SWIGLU_CLAMP && cfg->act != MOE8_ACT_SWIGLU_LIMIT &&
      cfg->act != MOE8_ACT_SWIGLU_POST && cfg->act != MOE8_ACT_SWIGLU_SOFTCAP && cfg->act != MOE8_ACT_GEGLU && cfg->act != MOE8_ACT_RELU2 &&
      cfg->act != MOE8_ACT_RELU && cfg->act != MOE8_ACT_SILU)
    return moe8__fail(MOE8_ERR_INVALID_ARG, "layer: act %d is not an expert activation (swiglu 0, swiglu_clamp 1, swiglu_limit 2, "
                      "swiglu_post 3, swiglu_softcap 4, geglu 5, relu2 6, relu 7, silu 8)", (int)cfg->act);
  if (!(cfg->rms_eps >= 0.0f && cfg->rms_eps < 1e30f) || !isfinite(cfg->router_norm_scale))
    return moe8__fail(MOE8_ERR_INVALID_ARG, "layer: rms_eps %g must be in [0, 1e30) and router_norm_scale %g finite", (double)cfg->rms_eps,
                      (double)cfg->router_norm_scale);
  if (!moe8__act_gated(cfg->act) && cfg->shared_plain_act && !cfg->product_keys)
    return moe8__fail(MOE8_ERR_INVALID_ARG, "layer: the ungated experts (act %s) take no shared_plain_act (their shared expert is ungated "
                      "too)", cfg->act == MOE8_ACT_RELU2 ? "relu2" : "relu");
  if (cfg->act == MOE8_ACT_SWIGLU_SOFTCAP && !(cfg->act_alpha > 0.0f && cfg->act_alpha < 1e30f && cfg->act_limit > 0.0f &&
                                               cfg->act_limit < 1e30f))
    return moe8__fail(MOE8_ERR_INVALID_ARG, "layer: the softcapped SwiGLU needs its caps act_alpha (gate) and act_limit (up) in "
                      "(0, 1e30), not %g and %g", (double)cfg->act_alpha, (double)cfg->act_limit);
  if (cfg->act == MOE8_ACT_SWIGLU_POST && !(cfg->act_limit >= 0.0f && cfg->act_limit < 1e30f && cfg->shared_act_limit >= 0.0f &&
                                            cfg->shared_act_limit < 1e30f))
    return moe8__fail(MOE8_ERR_INVALID_ARG, "layer: the SwiGLU clamped after the activation needs act_limit and shared_act_limit in "
                      "[0, 1e30) (0: no clamp), not %g and %g", (double)cfg->act_limit, (double)cfg->shared_act_limit);
  if (cfg->act == MOE8_ACT_SWIGLU_LIMIT && !(cfg->act_limit > 0.0f && cfg->act_limit < 1e30f))
    return moe8__fail(MOE8_ERR_INVALID_ARG, "layer: the limited SwiGLU needs act_limit in (0, 1e30), not %g", (double)cfg->act_limit);
  if (cfg->act == MOE8_ACT_SWIGLU_CLAMP && !(cfg->act_alpha > 0.0f && cfg->act_alpha < 1e6f && cfg->act_limit > 0.0f && cfg->act_limit < 1e30f))
    return moe8__fail(MOE8_ERR_INVALID_ARG, "layer: the clamped SwiGLU needs act_alpha in (0, 1e6) and act_limit in (0, 1e30), not %g and %g",
                      (double)cfg->act_alpha, (double)cfg->act_limit);
  if (cfg->group_score != MOE8_GROUP_TOP2_SUM && cfg->group_score != MOE8_GROUP_MAX)
    return moe8__fail(MOE8_ERR_INVALID_ARG, "layer: group_score %d is not a group score (top-2 sum 0, max 1)", (int)cfg->group_score);
  if (cfg->n_group > 1) {
    const int64_t G = cfg->n_group, KG = cfg->topk_group;
    if (E % G || E / G < 2 || KG < 1 || KG > G || K > KG * (E / G))
      return moe8__fail(MOE8_ERR_SHAPE, "layer: group-limited routing needs n_group = %lld to divide num_experts = %lld in groups of >= 2, "
                        "topk_group = %lld in [1, n_group] and top_k = %lld <= topk_group * experts per group",
                        (long long)G, (long long)E, (long long)KG, (long long)K);
  }
  moe8_layer *L = calloc(1, sizeof *L);
  if (!L) return moe8__fail(MOE8_ERR_NOMEM, "layer: out of memory");
  if (pthread_rwlock_init(&L->lock, NULL) != 0) { free(L); return moe8__fail(MOE8_ERR_NOMEM, "layer: cannot make its lock"); }
  if (!(L->pool = malloc(sizeof *L->pool))) {
    pthread_rwlock_destroy(&L->lock);
    free(L);
    return moe8__fail(MOE8_ERR_NOMEM, "layer: out of memory");
  }
  moe8__pool_init(L->pool);
  atomic_init(&L->gen, 1);
  L->cfg = *cfg;
  L->inference = inference;
  snprintf(L->module_path, sizeof L->module_path, "%s", module_path ? module_path : "experts");
  const moe8_rule *r = rules ? moe8_rules_match(rules, L->module_path) : NULL;
  if (r) { L->rule = *r; L->has_rule = true; L->rule.module_path = NULL; }
  L->before_sort = moe8_rules_quantize_before_ep_all_gather(rules);
  /* Weights: f8e4m3 and i8 are pre-quantized (seed B); f8e5m2 weights are
  ** left as they are, with a notice. */
  const char *notice = "";
  if (r && (r->weight_qtype == MOE8_DTYPE_F8E4M3 || r->weight_qtype == MOE8_DTYPE_I8)) {
    L->wq = moe8_rule_weight_spec(r, &L->wspec);
  } else if (r && r->weight_qtype == MOE8_DTYPE_F8E5M2) {
    notice = "; notice: weight_qtype f8e5m2 is not pre-quantized, weights stay f32";
  }
  L->aq = r && moe8_rule_act_spec(r, &L->aspec);
  if (r && r->weight_mxfp4) {
    const char *why = !inference ? "layers loaded for inference only (training layers keep f32 weights: load with MOE8_LOAD_INFERENCE)"
                      : !moe8__mx4_acts_ok(L) ? "f32 or int8 activations (act_qtype null, or int8 per token or per 1 x tile, "
                                                "the tile a multiple of 32)"
                      : D % 32 || F % 32 || Fs % 32 || cfg->latent % 32 ? "hidden, latent and FFN widths that are multiples of 32" : NULL;
    if (why) {
      moe8_layer_destroy(L); /* nothing else is held yet */
      return moe8__fail(MOE8_ERR_UNSUPPORTED, "layer %s: weight_qtype mxfp4 is for %s", module_path ? module_path : "experts", why);
    }
    L->wmx = true;
  }
  set_describe(L, "");
  strncat(L->describe, notice, sizeof L->describe - strlen(L->describe) - 1);

  L->nsets = Fs > 0 ? 2 : 1;
  L->xs[0] = (moe8__xset){.E = E, .F = F, .D = cfg->latent > 0 ? cfg->latent : D, .N1 = moe8__act_gated(moe8__set_act(L, 0)) ? 2 * F : F, .wg = MOE8_W_GATE, .wu = MOE8_W_UP,
                          .wd = MOE8_W_DOWN};
  L->xs[1] = (moe8__xset){.E = 1, .F = Fs, .D = D, .N1 = moe8__act_gated(moe8__set_act(L, 1)) ? 2 * Fs : Fs, .wg = MOE8_W_SHARED_GATE,
                          .wu = MOE8_W_SHARED_UP, .wd = MOE8_W_SHARED_DOWN};
  /* [D, E + Z + S] (Zaya's MLP router: [R, E + S]), or a product-key layer's [D, 2N] */
  L->n[MOE8_W_ROUTER] = (size_t)((R > 0 ? R : D) * moe8__router_width(L));
  L->n[MOE8_W_BIAS] = cfg->use_selection_bias ? (size_t)(E + Z + S) : 0;
  L->n[MOE8_W_SHARED_GATE_W] = Fs > 0 && cfg->shared_gate ? (size_t)D : 0;
  L->n[MOE8_W_ROUTER_BIAS] = cfg->router_bias ? (size_t)(E + Z + S) : 0;
  L->n[MOE8_W_GU_BIAS] = cfg->expert_bias ? (size_t)(E * L->xs[0].N1) : 0; /* ungated: up's [E, F] */
  L->n[MOE8_W_DOWN_BIAS] = cfg->expert_bias ? (size_t)(E * D) : 0;
  L->n[MOE8_W_OUT_BIAS] = cfg->out_bias ? (size_t)D : 0;
  L->n[MOE8_W_ROUTER_SCALE] = cfg->router_norm ? (size_t)D : 0;
  L->n[MOE8_W_EXPERT_SCALE] = cfg->expert_scale ? (size_t)E : 0;
  L->n[MOE8_W_IN_NORM] = cfg->in_norm ? (size_t)D : 0;
  L->n[MOE8_W_OUT_NORM] = cfg->out_norm ? (size_t)D : 0;
  L->n[MOE8_W_LATENT_IN] = L->n[MOE8_W_LATENT_OUT] = (size_t)(D * cfg->latent);
  L->n[MOE8_W_LATENT_NORM] = cfg->latent_norm ? (size_t)cfg->latent : 0;
  L->n[MOE8_W_EXPERT_OUT_NORM] = cfg->expert_out_norm ? (size_t)L->xs[0].D : 0;
  L->n[MOE8_W_ROUTER_DOWN] = (size_t)(D * R);
  L->n[MOE8_W_ROUTER_FC1] = L->n[MOE8_W_ROUTER_FC2] = (size_t)(R * R);
  L->n[MOE8_W_ROUTER_DOWN_BIAS] = L->n[MOE8_W_ROUTER_MLP_NORM] = L->n[MOE8_W_ROUTER_FC1_BIAS] = L->n[MOE8_W_ROUTER_FC2_BIAS] = (size_t)R;
  L->n[MOE8_W_ROUTER_STATE_SCALE] = cfg->router_state ? (size_t)R : 0;
  if (!inference)
    for (int s = 0; s < L->nsets; s++) {
      const moe8__xset *X = &L->xs[s];
      L->n[X->wg] = L->n[X->wu] = L->n[X->wd] = (size_t)(X->E * X->D * X->F);
      if (X->N1 == X->F) L->n[X->wg] = 0; /* ungated: no gate weight */
    }
  bool ok = true;
  for (int i = 0; i < MOE8_W_COUNT; i++)
    if (L->n[i]) ok &= (L->w[i] = calloc(L->n[i], sizeof(float))) != NULL;
  for (int s = 0; s < L->nsets && !inference; s++) {
    moe8__xset *X = &L->xs[s];
    const int64_t XF = X->F, XE = X->E, N1 = X->N1, XD = X->D;
    X->wd_f32 = L->w[X->wd];
    ok &= (X->wgu_f32 = malloc(sizeof(float) * (size_t)(XE * XD * N1))) != NULL;
    if (L->wq) {
      ok &= (X->wgu_q = malloc((size_t)(XE * XD * N1))) != NULL;
      ok &= (X->wd_q = malloc((size_t)(XE * XF * XD))) != NULL;
      ok &= (X->wgu_s = malloc(sizeof(float) * (size_t)(XE * moe8__nblocks(XD, L->wspec.tile) * N1))) != NULL;
      int64_t dk, dn;
      moe8__down_kn(L, s, &dk, &dn);
      ok &= (X->wd_s = malloc(sizeof(float) * (size_t)(XE * moe8__nblocks(dk, L->wspec.tile) * dn))) != NULL;
    }
  }
  if (!ok) { moe8_layer_destroy(L); return moe8__fail(MOE8_ERR_NOMEM, "layer: out of memory for weights"); }
  *out = L;
  return MOE8_OK;
}

moe8_status moe8_layer_create(const moe8_layer_config *cfg, const moe8_rules *rules, const char *module_path,
                              moe8_layer **out) {
  return moe8__layer_create(cfg, rules, module_path, false, out);
}

static void free_set(moe8__xset *X) {
  free(X->wgu_f32);
  if (X->own_wd) free(X->wd_f32);
  free(X->wgu_q); free(X->wd_q); free(X->wgu_s); free(X->wd_s);
  free(X->mx_gu_b); free(X->mx_gu_s); free(X->mx_dn_b); free(X->mx_dn_s);
  X->mx_gu_b = X->mx_gu_s = X->mx_dn_b = X->mx_dn_s = NULL;
  X->mx_cols = false;
  if (!X->pk_borrowed) { free(X->wgu_pk); free(X->wd_pk); }
  X->pk_borrowed = false;
  X->wgu_f32 = X->wd_f32 = X->wgu_s = X->wd_s = NULL;
  X->wgu_q = X->wd_q = X->wgu_pk = X->wd_pk = NULL;
  X->own_wd = false;
}

void moe8_layer_destroy(moe8_layer *L) {
  if (!L) return;
  for (int s = 0; s < 2; s++) free_set(&L->xs[s]);
  for (int i = 0; i < MOE8_W_COUNT; i++) free(L->w[i]);
  if (L->release) L->release(L->keep);
  free(L->given);
  free(L->tid2eid);
  pthread_rwlock_destroy(&L->lock);
  if (L->pool) moe8__pool_destroy(L->pool), free(L->pool);
  free(L);
}

const float *moe8_layer_weight_read(const moe8_layer *L, moe8_weight_id id, size_t *count) {
  if (!L || (unsigned)id >= MOE8_W_COUNT || !L->n[id]) return NULL;
  if (count) *count = L->n[id];
  return L->w[id];
}

float *moe8_layer_weight(moe8_layer *L, moe8_weight_id id, size_t *count) {
  if (!moe8_layer_weight_read(L, id, count)) return NULL;
  /* An inference layer's kernels hold the expert weights; its router,
  ** bias and gate may change without a re-preparation. */
  moe8_layer_weights_changed(L);
  return L->w[id];
}

void moe8_layer_weights_changed(moe8_layer *L) {
  if (!L) return;
  atomic_fetch_add(&L->gen, 1);
  /* An inference layer's kernels hold the expert weights; its router,
  ** bias and gate may change without a re-preparation. */
  if (!L->inference) L->prepared = false;
}

/* The kernels' buffers from the masters, once per generation of them,
** under the write lock: concurrent forwards never see a half-written
** buffer and never quantize the same weights twice. */
static moe8_status quantize_weights(moe8_layer *L);
static moe8_status ensure_quantized(moe8_layer *L) {
  if (L->inference) return MOE8_OK;
  pthread_rwlock_rdlock(&L->lock);
  const bool fresh = L->qgen == atomic_load(&L->gen) + 1;
  pthread_rwlock_unlock(&L->lock);
  if (fresh) return MOE8_OK;
  pthread_rwlock_wrlock(&L->lock);
  const uint64_t g = atomic_load(&L->gen);
  moe8_status st = MOE8_OK;
  if (L->qgen != g + 1 && (st = quantize_weights(L)) == MOE8_OK) L->qgen = g + 1;
  pthread_rwlock_unlock(&L->lock);
  return st;
}

moe8_status moe8_layer_init_random(moe8_layer *L, uint64_t seed) {
  if (!L) return moe8__fail(MOE8_ERR_INVALID_ARG, "layer: NULL");
  if (L->inference) return moe8__fail(MOE8_ERR_UNSUPPORTED, "layer: loaded for inference (no f32 masters): nothing to initialize");
  uint64_t s = seed * 0x9E3779B97F4A7C15ULL + 0x632BE59BD9B4E019ULL;
  const float D = (float)L->cfg.hidden, F = (float)L->cfg.ffn, Fs = (float)L->cfg.shared_ffn;
  const float H = (float)moe8__routed_width(L);
  const float R = (float)L->cfg.router_mlp, RK = R > 0.0f ? R : D; /* the router's fan-in: x's, or the MLP's width */
  const float fan[MOE8_W_COUNT] = {RK, H, H, F, 1.0f, D, D, Fs, D, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, D, H, 1.0f, 1.0f,
                                   D, 1.0f, 1.0f, 1.0f, R, 1.0f, R, 1.0f};
  for (int i = 0; i < MOE8_W_COUNT; i++) {
    if (i == MOE8_W_ROUTER_SCALE || i == MOE8_W_EXPERT_SCALE || i == MOE8_W_IN_NORM || i == MOE8_W_OUT_NORM || i == MOE8_W_LATENT_NORM ||
        i == MOE8_W_EXPERT_OUT_NORM || i == MOE8_W_ROUTER_STATE_SCALE || i == MOE8_W_ROUTER_MLP_NORM) {
      for (size_t j = 0; j < L->n[i]; j++) L->w[i][j] = 1.0f; /* norm weights and scales start at 1 */
      continue;
    }
    if (i == MOE8_W_BIAS || i == MOE8_W_ROUTER_BIAS || i == MOE8_W_GU_BIAS || i == MOE8_W_DOWN_BIAS || i == MOE8_W_OUT_BIAS ||
        i == MOE8_W_ROUTER_DOWN_BIAS || i == MOE8_W_ROUTER_FC1_BIAS || i == MOE8_W_ROUTER_FC2_BIAS)
      continue; /* biases start at 0 */
    const float sd = 1.0f / sqrtf(fan[i]);
    for (size_t j = 0; j < L->n[i]; j++) {
      /* Box-Muller on a splitmix64 stream. */
      double u[2];
      for (int k = 0; k < 2; k++) {
        uint64_t z = (s += 0x9E3779B97F4A7C15ULL);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
        u[k] = (double)((z ^ (z >> 31)) >> 11) * 0x1p-53;
      }
      L->w[i][j] = sd * (float)(sqrt(-2.0 * log(u[0] + 0x1p-60)) * cos(6.283185307179586 * u[1]));
    }
  }
  moe8_layer_weights_changed(L);
  return MOE8_OK;
}

void moe8_layer_set_quantize_before_sort(moe8_layer *L, bool before) { if (L) L->before_sort = before; }
void moe8_layer_set_allow_nonfinite(moe8_layer *L, bool allow) { if (L) L->allow_nonfinite = allow; }

moe8_status moe8_layer_set_order(moe8_layer *L, moe8_order order) {
  if (!L) return moe8__fail(MOE8_ERR_INVALID_ARG, "layer_set_order: NULL layer");
  if (order != MOE8_ORDER_DEFAULT && order != MOE8_ORDER_CANONICAL && order != MOE8_ORDER_NATIVE)
    return moe8__fail(MOE8_ERR_INVALID_ARG, "layer_set_order: %d is not an order (default, canonical, native)", (int)order);
  atomic_store_explicit(&L->order, order, memory_order_relaxed);
  return MOE8_OK;
}

moe8_order moe8_layer_order(const moe8_layer *L) { return moe8_order_effective(L ? moe8__layer_order_now(L) : MOE8_ORDER_DEFAULT); }
const moe8_rule *moe8_layer_rule(const moe8_layer *L) { return L && L->has_rule ? &L->rule : NULL; }
const char *moe8_layer_describe(const moe8_layer *L) { return L ? L->describe : ""; }
const moe8_layer_config *moe8_layer_get_config(const moe8_layer *L) { return L ? &L->cfg : NULL; }

/* ---- workspace ---------------------------------------------------------------- */
typedef struct ws_layout {
  float   *logits, *scores, *w, *xs, *gu, *h, *y, *sx, *sxs, *sh, *idn;
  float   *xr, *xe, *yb, *wn;           /* Gemma-4's norms: router input, experts' input, output before its norm, weights before the per-expert scale */
  float   *z, *sz, *c;                  /* latent: the experts' input rows [T, latent], their scales, the weighted sum */
  float   *yo;                          /* expert_out_norm: the expert rows before their norm (for the backward) */
  float   *rs, *ra, *rb;                /* router_mlp: the router state [T, R] and the MLP's two hidden rows */
  uint8_t *zq;
  int32_t *ids, *token_of, *slot_of, *pos_of, *gsz;
  int64_t *offs;
  uint8_t *xq, *xsq, *hq;
  void    *shared;                  /* moe8__shared_buf_size(T) bytes */
  void    *scratch;
  size_t   scratch_bytes, total;
} ws_layout;

/* The workspace's first WS_HEAD bytes say which forward it holds (the
** layer, T, and whether it was a training or a fused forward), so that a
** backward can refuse a workspace that does not hold its forward. */
enum { WS_HEAD = 64, WS_NONE = 0, WS_TRAINING = 1, WS_FUSED = 2 };
#define WS_MAGIC 0x6d6f6538776b7370ULL
typedef struct ws_head {
  uint64_t          magic;
  const moe8_layer *layer;
  int64_t           T;
  uint64_t          kind;
} ws_head;

static void ws_mark(void *ws, const moe8_layer *L, int64_t T, uint64_t kind) {
  const ws_head h = {WS_MAGIC, L, T, kind};
  memcpy(ws, &h, sizeof h);
}

/* The most tokens one call takes: every size of the workspace (the largest
** is about T·top_k·(E + D + F + Fs) floats several times over) stays far
** from 64-bit overflow. */
static int64_t max_tokens(const moe8_layer *L) {
  const int64_t per = 64 * L->cfg.top_k * (moe8__router_width(L) + L->cfg.hidden + L->cfg.latent + L->cfg.ffn + L->cfg.shared_ffn +
                                           3 * L->cfg.router_mlp + 64);
  return ((int64_t)1 << 62) / per;
}

static void layout(const moe8_layer *L, int64_t T, char *base, ws_layout *o) {
  /* Product-key experts (pkeys.c) move no rows: no dispatch, no expert
  ** rows; xs holds x (or its dequantized codes) [T, D], read per token. */
  const bool pk = L->cfg.product_keys;
  const int64_t E = pk ? 0 : L->cfg.num_experts, K = L->cfg.top_k, D = L->cfg.hidden, F = L->cfg.ffn, A = pk ? 0 : T * K;
  const int64_t AK = T * K; /* the routing's slots */
  const int64_t DX = moe8__routed_width(L), lat = L->cfg.latent > 0 ? T * DX : 0; /* the routed rows' width */
  const int64_t nbD = L->aq ? moe8__nblocks(D, L->aspec.tile) : 0, nbF = L->aq ? moe8__nblocks(F, L->aspec.tile) : 0;
  const int64_t nbX = L->aq ? moe8__nblocks(DX, L->aspec.tile) : 0;
  const int64_t Fs = L->cfg.shared_ffn;
  size_t off = WS_HEAD;
#define TAKE(field, type, count) do { o->field = (type *)(base ? base + off : NULL); off += moe8__al64(sizeof(type) * (size_t)(count)); } while (0)
  TAKE(logits, float, T * moe8__router_width(L));
  TAKE(scores, float, T * moe8__router_width(L));
  TAKE(ids, int32_t, AK);
  TAKE(w, float, AK);
  TAKE(token_of, int32_t, A);
  TAKE(slot_of, int32_t, A);
  TAKE(pos_of, int32_t, A);
  TAKE(gsz, int32_t, E);
  TAKE(offs, int64_t, E + 1);
  TAKE(xs, float, pk ? T * D : A * DX);
  TAKE(xq, uint8_t, L->aq ? T * D : 0);
  TAKE(sx, float, T * nbD);
  TAKE(xsq, uint8_t, L->aq ? A * DX : 0);
  TAKE(sxs, float, A * nbX);
  TAKE(gu, float, A * L->xs[0].N1);
  TAKE(h, float, A * F);
  TAKE(hq, uint8_t, L->aq ? A * F : 0);
  TAKE(sh, float, A * nbF);
  TAKE(y, float, A * DX);
  TAKE(z, float, lat);
  TAKE(zq, uint8_t, L->aq ? lat : 0);
  TAKE(sz, float, lat ? T * nbX : 0);
  TAKE(c, float, lat);
  TAKE(yo, float, L->cfg.expert_out_norm ? A * DX : 0);
  TAKE(xr, float, L->cfg.router_norm ? T * D : 0);
  TAKE(xe, float, L->cfg.in_norm ? T * D : 0);
  TAKE(yb, float, L->cfg.out_norm ? T * D : 0);
  TAKE(wn, float, L->cfg.expert_scale ? AK : 0);
  TAKE(idn, float, L->cfg.zero_experts ? T * D : 0);
  TAKE(rs, float, T * L->cfg.router_mlp);
  TAKE(ra, float, T * L->cfg.router_mlp);
  TAKE(rb, float, T * L->cfg.router_mlp);
#undef TAKE
  o->shared = base ? base + off : NULL;
  off += moe8__shared_buf_size(L, T);
  const int64_t w1 = D > F ? (D > Fs ? D : Fs) : (F > Fs ? F : Fs), wide = w1 > DX ? w1 : DX;
  o->scratch_bytes = moe8__gmm_ws_size(A > T ? A : T, wide);
  o->scratch = base ? base + off : NULL;
  off += o->scratch_bytes;
  o->total = off;
}

size_t moe8_layer_workspace_size(const moe8_layer *L, int64_t T) {
  if (!L || T < 0 || T > max_tokens(L)) return 0;
  ws_layout o;
  layout(L, T, NULL, &o);
  return o.total;
}

size_t moe8__shared_buf_size(const moe8_layer *L, int64_t T) {
  moe8__shared_buf b;
  if (L->cfg.shared_ffn <= 0) return 0;
  const int64_t Fs = L->cfg.shared_ffn, D = L->cfg.hidden, nbF = L->aq ? moe8__nblocks(Fs, L->aspec.tile) : 0;
  const size_t n[7] = {sizeof(float) * (size_t)(T * D), sizeof(float) * (size_t)(T * 2 * Fs), sizeof(float) * (size_t)(T * Fs),
                       L->aq ? (size_t)(T * Fs) : 0, sizeof(float) * (size_t)(T * nbF), sizeof(float) * (size_t)(T * D),
                       sizeof(float) * (size_t)T};
  size_t total = 0;
  for (int i = 0; i < 7; i++) total += moe8__al64(n[i]);
  (void)b;
  return total;
}

void moe8__shared_buf_carve(const moe8_layer *L, int64_t T, void *base, moe8__shared_buf *b) {
  memset(b, 0, sizeof *b);
  if (L->cfg.shared_ffn <= 0 || !base) return;
  const int64_t Fs = L->cfg.shared_ffn, D = L->cfg.hidden, nbF = L->aq ? moe8__nblocks(Fs, L->aspec.tile) : 0;
  char *p = base;
  b->x = (float *)p; p += moe8__al64(sizeof(float) * (size_t)(T * D));
  b->gu = (float *)p; p += moe8__al64(sizeof(float) * (size_t)(T * 2 * Fs));
  b->h = (float *)p; p += moe8__al64(sizeof(float) * (size_t)(T * Fs));
  b->hq = (uint8_t *)p; p += moe8__al64(L->aq ? (size_t)(T * Fs) : 0);
  b->sh = (float *)p; p += moe8__al64(sizeof(float) * (size_t)(T * nbF));
  b->y = (float *)p; p += moe8__al64(sizeof(float) * (size_t)(T * D));
  b->g = (float *)p;
}

/* ---- weights as the kernels consume them ---------------------------------------- */
moe8_status moe8_expert_weight_quantize(const moe8_rule *rule, const float *w, int ndim, const int64_t *shape,
                                        void *q, float *scale, moe8_quant_spec *spec, const char **notice) {
  if (!spec || (ndim > 0 && !shape)) return moe8__fail(MOE8_ERR_INVALID_ARG, "expert weight: NULL argument");
  memset(spec, 0, sizeof *spec);
  if (notice) *notice = "";
  if (ndim != 3) {
    char dims[96] = "";
    for (int i = 0; i < ndim && i < 6; i++)
      snprintf(dims + strlen(dims), sizeof dims - strlen(dims), "%s%lld", i ? ", " : "", (long long)shape[i]);
    return moe8__fail(MOE8_ERR_SHAPE, "expert weight: must be 3-D [E, K, N], got %d-D [%s]", ndim, dims);
  }
  if (!rule || rule->weight_qtype == MOE8_DTYPE_NONE) {
    if (notice) *notice = rule ? "rule has no weight_qtype: weights left unquantized" : "no rule: weights left unquantized";
    return MOE8_OK;
  }
  if (rule->weight_qtype != MOE8_DTYPE_F8E4M3 && rule->weight_qtype != MOE8_DTYPE_I8) {
    if (notice) *notice = "weight_qtype is not pre-quantized (only f8e4m3 and i8 are): weights left unquantized";
    return MOE8_OK;
  }
  moe8_quant_spec s;
  moe8_rule_weight_spec(rule, &s);
  const moe8_status st = moe8_quantize(&s, w, shape[0], shape[1], shape[2], q, scale, NULL);
  if (st == MOE8_OK) *spec = s;
  return st;
}

static moe8_status check_weights(const moe8_layer *L) {
  static const char *const names[MOE8_W_COUNT] = {"router weight Wr", "gate weight Wg", "up weight Wu", "down weight Wd",
                                                  "selection bias", "shared expert gate weight", "shared expert up weight",
                                                  "shared expert down weight", "shared expert gate", "router bias",
                                                  "expert gate/up bias", "expert down bias", "output bias",
                                                  "router norm scale", "per-expert scale", "expert input norm weight",
                                                  "output norm weight", "latent input projection", "latent output projection",
                                                  "latent norm weight", "expert output norm weight",
                                                  "router state projection (router_mlp's down_proj)", "router state projection bias",
                                                  "router state scale", "router MLP norm weight", "router MLP fc1 weight",
                                                  "router MLP fc1 bias", "router MLP fc2 weight", "router MLP fc2 bias"};
  for (int i = 0; i < MOE8_W_COUNT; i++) {
    const size_t bad = L->n[i] ? moe8__count_nonfinite(L->w[i], L->n[i]) : 0;
    if (bad) return moe8__fail(MOE8_ERR_NONFINITE, "layer %s: %s has %zu non-finite value(s)", L->module_path, names[i], bad);
  }
  return MOE8_OK;
}

/* [Wg | Wu] rows (E·D of them, F wide each) from the separate masters, and
** back; per-column scales make quantizing the joined rows equal to
** quantizing the two separately.  Ungated (wg NULL): the rows are Wu's. */
static void gate_up_join(float *gu, const float *wg, const float *wu, int64_t rows, int64_t F) {
  if (!wg) { memcpy(gu, wu, sizeof(float) * (size_t)(rows * F)); return; }
  #pragma omp parallel for num_threads(moe8__nt(2.0 * (double)rows * (double)F)) schedule(static)
  for (int64_t i = 0; i < rows; i++) {
    memcpy(gu + i * 2 * F, wg + i * F, sizeof(float) * (size_t)F);
    memcpy(gu + i * 2 * F + F, wu + i * F, sizeof(float) * (size_t)F);
  }
}

static void gate_up_split(float *wg, float *wu, const float *gu, int64_t rows, int64_t F) {
  if (!wg) { memcpy(wu, gu, sizeof(float) * (size_t)(rows * F)); return; }
  #pragma omp parallel for num_threads(moe8__nt(2.0 * (double)rows * (double)F)) schedule(static)
  for (int64_t i = 0; i < rows; i++) {
    memcpy(wg + i * F, gu + i * 2 * F, sizeof(float) * (size_t)F);
    memcpy(wu + i * F, gu + i * 2 * F + F, sizeof(float) * (size_t)F);
  }
}

/* One training set's kernel weights from its masters. */
static moe8_status quantize_set(moe8_layer *L, moe8__xset *X) {
  const int64_t D = X->D, E = X->E, F = X->F;
  gate_up_join(X->wgu_f32, L->w[X->wg], L->w[X->wu], E * D, F);
  if (!L->wq) return MOE8_OK;
  int64_t dk, dn;
  moe8__down_kn(L, (int)(X - L->xs), &dk, &dn);
  moe8_status st = moe8_quantize(&L->wspec, X->wgu_f32, E, D, X->N1, X->wgu_q, X->wgu_s, NULL);
  return st == MOE8_OK ? moe8_quantize(&L->wspec, X->wd_f32, E, dk, dn, X->wd_q, X->wd_s, NULL) : st;
}

static moe8_status quantize_weights(moe8_layer *L) {
  if (L->inference) return MOE8_OK; /* filled once at load */
  moe8_status st = check_weights(L);
  for (int s = 0; s < L->nsets && st == MOE8_OK; s++) st = quantize_set(L, &L->xs[s]);
  return st;
}

/* Scale block along K of a gmm whose lhs is the quantized activations. */
static int64_t gmm_block_len(const moe8_layer *L, int64_t K) {
  return L->aspec.tile ? L->aspec.tile : L->wspec.tile ? L->wspec.tile : K;
}

bool moe8__layer_packable(const moe8_layer *L, int s) {
  const moe8_dtype wt = L->wspec.qtype;
  if (!L->wq || (wt != MOE8_DTYPE_F8E4M3 && wt != MOE8_DTYPE_F8E5M2 && wt != MOE8_DTYPE_I8)) return false;
  if (s == 0 && L->cfg.product_keys) return false; /* read row by row as codes (pkeys.c), never by the gmm */
  const int64_t D = L->xs[s].D, F = L->xs[s].F, per = moe8__pk_per(wt);
  const int64_t bg = gmm_block_len(L, D), bd = gmm_block_len(L, F);
  return !((bg < D && bg % per) || (bd < F && bd % per));
}

/* FP8 weights met by FP8 activations (the bf16 kernels) and i8 weights
** met by i8 activations (the VNNI kernels) stream weights packed once
** (moe8_gmm_pack_rhs): same bytes, faster decode.  Training layers make
** the packed copies here, at prepare, when the kernels can use them (the
** active ISA has the path; each K block is a whole pair or quad, or the
** only block).  Inference layers pack at load. */
static moe8_status pack_weights(moe8_layer *L) {
  if (L->inference) return MOE8_OK;
  const moe8_dtype wt = L->wspec.qtype;
  const bool i8 = wt == MOE8_DTYPE_I8;
  for (int s = 0; s < L->nsets; s++) {
    moe8__xset *X = &L->xs[s];
    const int64_t E = X->E, F = X->F, N1 = X->N1, D = X->D;
    free(X->wgu_pk); free(X->wd_pk);
    X->wgu_pk = X->wd_pk = NULL;
    if (!L->wq || !L->aq || !moe8__kernel_pair(L->aspec.qtype, wt) ||
        !(i8 ? moe8__kernels()->has_vnni : moe8__kernels()->has_bf16) || !moe8__layer_packable(L, s))
      continue;
    X->wgu_pk = moe8__alloc_weights(moe8_gmm_packed_size(wt, E, D, N1));
    X->wd_pk = moe8__alloc_weights(moe8_gmm_packed_size(wt, E, F, D));
    if (!X->wgu_pk || !X->wd_pk) {
      free(X->wgu_pk); free(X->wd_pk);
      X->wgu_pk = X->wd_pk = NULL;
      return moe8__fail(MOE8_ERR_NOMEM, "layer: out of memory for the packed expert weights");
    }
    moe8_status st = moe8_gmm_pack_rhs(wt, X->wgu_q, E, D, N1, X->wgu_pk);
    if (st == MOE8_OK) st = moe8_gmm_pack_rhs(wt, X->wd_q, E, F, D, X->wd_pk);
    if (st != MOE8_OK) return st;
  }
  return MOE8_OK;
}

moe8_status moe8_layer_prepare(moe8_layer *L) {
  if (!L) return moe8__fail(MOE8_ERR_INVALID_ARG, "layer: NULL");
  if (L->inference) return L->prepared ? MOE8_OK : moe8__fail(MOE8_ERR_INVALID_ARG, "layer: an inference layer whose load did not finish");
  pthread_rwlock_wrlock(&L->lock);
  const uint64_t g = atomic_load(&L->gen);
  moe8_status st = quantize_weights(L);
  if (st == MOE8_OK) st = pack_weights(L);
  L->prepared = st == MOE8_OK;
  L->qgen = st == MOE8_OK ? g + 1 : 0;
  pthread_rwlock_unlock(&L->lock);
  return st;
}

moe8_status moe8_layer_prepared(const moe8_layer *L, moe8_prepared *o) {
  if (!L || !o) return moe8__fail(MOE8_ERR_INVALID_ARG, "layer: NULL");
  if (!L->prepared) return moe8__fail(MOE8_ERR_INVALID_ARG, "layer: not prepared (call moe8_layer_prepare)");
  const moe8__xset *X = &L->xs[0];
  if (L->wq && !X->wgu_q)
    return moe8__fail(MOE8_ERR_UNSUPPORTED, "layer: an inference layer holds its weights packed only (moe8_gmm_pack_rhs layout)");
  o->dtype = L->wq ? L->wspec.qtype : MOE8_DTYPE_F32;
  o->tile = L->wq ? L->wspec.tile : 0;
  o->w_gate_up = L->wq ? (const void *)X->wgu_q : (const void *)X->wgu_f32;
  o->s_gate_up = L->wq ? X->wgu_s : NULL;
  o->w_down = L->wq ? (const void *)X->wd_q : (const void *)X->wd_f32;
  o->s_down = L->wq ? X->wd_s : NULL;
  return MOE8_OK;
}

/* ---- loading ------------------------------------------------------------------ */
moe8_status moe8__layer_begin_load(moe8_layer *L, moe8_dtype qt, int64_t tile) {
  if (L->wmx && qt != MOE8_DTYPE_NONE)
    return moe8__fail(MOE8_ERR_UNSUPPORTED, "layer %s: the checkpoint's experts are already quantized (%s); weight_qtype mxfp4 takes float "
                      "checkpoints", L->module_path, moe8_dtype_info(qt)->name);
  if (qt != MOE8_DTYPE_NONE) {
    if (qt != MOE8_DTYPE_F8E4M3 && qt != MOE8_DTYPE_I8)
      return moe8__fail(MOE8_ERR_DTYPE, "layer: prepared weights must be f8e4m3 or i8");
    if (tile < 0) return moe8__fail(MOE8_ERR_INVALID_ARG, "layer: prepared tile %lld", (long long)tile);
    if (L->aq && L->aspec.tile && tile && L->aspec.tile != tile)
      return moe8__fail(MOE8_ERR_SHAPE, "layer: the activation tile %lld does not match the weights' block %lld along K",
                        (long long)L->aspec.tile, (long long)tile);
    L->wq = true;
    L->wspec = (moe8_quant_spec){.qtype = qt, .gran = tile ? MOE8_GRAN_CHANNEL_TILE : MOE8_GRAN_CHANNEL, .tile = tile, .clip = 1.0f};
  }
  moe8_layer_weights_changed(L);
  L->prepared = false;
  L->from_codes = qt != MOE8_DTYPE_NONE;
  for (int s = 0; s < L->nsets; s++) L->xs[s].coded = false;
  for (int s = 0; s < L->nsets; s++) {
    moe8__xset *X = &L->xs[s];
    const int64_t E = X->E, F = X->F, N1 = X->N1, D = X->D;
    if (!L->inference) {
      if (qt == MOE8_DTYPE_NONE) continue; /* the masters take the values */
      free(X->wgu_q); free(X->wd_q); free(X->wgu_s); free(X->wd_s);
      X->wgu_q = malloc((size_t)(E * D * N1));
      X->wd_q = malloc((size_t)(E * F * D));
    } else {
      free_set(X);
      if (L->wmx) { /* MXFP4 blocks and scales, filled expert by expert (moe8__layer_put_expert) */
        X->mx_cols = L->aq;
        X->mx_gu_b = moe8__alloc_weights((size_t)(E * moe8__mx4_bytes(N1, D, X->mx_cols)));
        X->mx_gu_s = moe8__alloc_weights((size_t)(E * N1 * (D / 32)));
        X->mx_dn_b = moe8__alloc_weights((size_t)(E * moe8__mx4_bytes(D, F, X->mx_cols)));
        X->mx_dn_s = moe8__alloc_weights((size_t)(E * D * (F / 32)));
        X->mx_split = 0;
        if (!X->mx_gu_b || !X->mx_gu_s || !X->mx_dn_b || !X->mx_dn_s) return moe8__fail(MOE8_ERR_NOMEM, "layer: out of memory for the expert weights");
        continue;
      }
      if (!L->wq) {
        X->wgu_f32 = malloc(sizeof(float) * (size_t)(E * D * N1));
        X->wd_f32 = malloc(sizeof(float) * (size_t)(E * F * D));
        X->own_wd = true;
        if (!X->wgu_f32 || !X->wd_f32) return moe8__fail(MOE8_ERR_NOMEM, "layer: out of memory for the expert weights");
        continue;
      }
      if (moe8__layer_packable(L, s)) {
        X->wgu_pk = moe8__alloc_weights(moe8_gmm_packed_size(L->wspec.qtype, E, D, N1));
        X->wd_pk = moe8__alloc_weights(moe8_gmm_packed_size(L->wspec.qtype, E, F, D));
      } else {
        X->wgu_q = malloc((size_t)(E * D * N1));
        X->wd_q = malloc((size_t)(E * F * D));
      }
    }
    X->wgu_s = malloc(sizeof(float) * (size_t)(E * moe8__nblocks(D, L->wspec.tile) * N1));
    int64_t dk, dn;
    moe8__down_kn(L, s, &dk, &dn);
    X->wd_s = malloc(sizeof(float) * (size_t)(E * moe8__nblocks(dk, L->wspec.tile) * dn));
    if (!(X->wgu_q || X->wgu_pk) || !(X->wd_q || X->wd_pk) || !X->wgu_s || !X->wd_s)
      return moe8__fail(MOE8_ERR_NOMEM, "layer: out of memory for the expert weights");
  }
  return MOE8_OK;
}

static moe8_status put_codes(moe8_layer *L, moe8__xset *X, bool down, int64_t e, const uint8_t *q, const float *sc) {
  int64_t dk, dn;
  moe8__down_kn(L, (int)(X - L->xs), &dk, &dn);
  const int64_t D = X->D, K = down ? dk : D, N = down ? dn : X->N1;
  const moe8_dtype wt = L->wspec.qtype;
  const size_t nsc = (size_t)(moe8__nblocks(K, L->wspec.tile) * N);
  uint8_t *pk = down ? X->wd_pk : X->wgu_pk, *qq = down ? X->wd_q : X->wgu_q;
  memcpy((down ? X->wd_s : X->wgu_s) + (size_t)e * nsc, sc, sizeof(float) * nsc);
  X->coded = true;
  if (pk) return moe8_gmm_pack_rhs(wt, q, 1, K, N, pk + (size_t)e * moe8_gmm_packed_size(wt, 1, K, N));
  memcpy(qq + (size_t)(e * K * N), q, (size_t)(K * N));
  return MOE8_OK;
}

moe8_status moe8__layer_put_expert(moe8_layer *L, int s, int64_t e, const float *gu, const float *dn, const uint8_t *gq,
                                   const float *gs, const uint8_t *dq, const float *ds) {
  moe8__xset *X = &L->xs[s];
  const int64_t D = X->D, F = X->F, N1 = X->N1;
  if (gq) { /* codes as the file has them */
    moe8_status st = put_codes(L, X, false, e, gq, gs);
    return st == MOE8_OK ? put_codes(L, X, true, e, dq, ds) : st;
  }
  if (!L->inference) { /* f32 values into the masters */
    gate_up_split(L->w[X->wg] ? L->w[X->wg] + e * D * F : NULL, L->w[X->wu] + e * D * F, gu, D, F);
    memcpy(L->w[X->wd] + e * F * D, dn, sizeof(float) * (size_t)(F * D));
    return MOE8_OK;
  }
  size_t bad = moe8__count_nonfinite(gu, (size_t)(D * N1)) + moe8__count_nonfinite(dn, (size_t)(F * D));
  if (bad) return moe8__fail(MOE8_ERR_NONFINITE, "layer %s: %s expert %lld has %zu non-finite weight(s)", L->module_path,
                             s ? "shared" : "routed", (long long)e, bad);
  if (L->wmx) {
    /* the OCP layout, then the kernels' */
    const size_t ngs = (size_t)(N1 * (D / 32)), nds = (size_t)(D * (F / 32));
    uint8_t *ocp = malloc((size_t)((N1 * D + F * D) / 2) + ngs + nds), *os = ocp + (N1 * D + F * D) / 2;
    if (!ocp) return moe8__fail(MOE8_ERR_NOMEM, "layer: out of memory");
    uint8_t *gsc = X->mx_gu_s + (size_t)e * ngs, *dsc = X->mx_dn_s + (size_t)e * nds, *ocd = ocp + N1 * D / 2;
    moe8__mx4_quantize(gu, D, N1, ocp, X->mx_cols ? os : gsc);
    moe8__mx4_quantize(dn, F, D, ocd, X->mx_cols ? os + ngs : dsc);
    uint8_t *gb = X->mx_gu_b + (size_t)(e * moe8__mx4_bytes(N1, D, X->mx_cols)), *db = X->mx_dn_b + (size_t)(e * moe8__mx4_bytes(D, F, X->mx_cols));
    if (X->mx_cols) {
      moe8__mx4_to_cols(gb, gsc, ocp, os, N1, D);
      moe8__mx4_to_cols(db, dsc, ocd, os + ngs, D, F);
    } else {
      moe8__mx4_repack(gb, ocp, N1, D);
      moe8__mx4_repack(db, ocd, D, F);
    }
    free(ocp);
    return MOE8_OK;
  }
  if (!L->wq) {
    memcpy(X->wgu_f32 + e * D * N1, gu, sizeof(float) * (size_t)(D * N1));
    memcpy(X->wd_f32 + e * F * D, dn, sizeof(float) * (size_t)(F * D));
    return MOE8_OK;
  }
  /* Quantized one expert at a time: the same bytes as the whole tensor
  ** (every scale belongs to one expert). */
  int64_t dk, dnn;
  moe8__down_kn(L, s, &dk, &dnn);
  const int64_t nq = D * N1 > F * D ? D * N1 : F * D, ng = moe8__nblocks(D, L->wspec.tile) * N1, nd = moe8__nblocks(dk, L->wspec.tile) * dnn;
  uint8_t *q = malloc((size_t)nq + 64);
  float *sc = malloc(sizeof(float) * (size_t)(ng > nd ? ng : nd) + 64);
  moe8_status st = q && sc ? MOE8_OK : moe8__fail(MOE8_ERR_NOMEM, "layer: out of memory");
  if (st == MOE8_OK) st = moe8_quantize(&L->wspec, gu, 1, D, N1, q, sc, NULL);
  if (st == MOE8_OK) st = put_codes(L, X, false, e, q, sc);
  if (st == MOE8_OK) st = moe8_quantize(&L->wspec, dn, 1, dk, dnn, q, sc, NULL);
  if (st == MOE8_OK) st = put_codes(L, X, true, e, q, sc);
  free(q); free(sc);
  return st;
}

moe8_status moe8__layer_put_packed(moe8_layer *L, int s, const uint8_t *gu_pk, const float *gs, const uint8_t *dn_pk,
                                   const float *ds) {
  moe8__xset *X = &L->xs[s];
  const int64_t D = X->D, E = X->E;
  if (L->wmx)
    return moe8__fail(MOE8_ERR_UNSUPPORTED, "layer %s: the checkpoint's experts are already quantized (moe8 packed); weight_qtype mxfp4 "
                      "takes float checkpoints", L->module_path);
  if (!L->inference || !L->wq || !X->wgu_pk || !moe8__layer_packable(L, s))
    return moe8__fail(MOE8_ERR_INTERNAL, "layer: packed weights need an inference layer with a packable layout");
  free(X->wgu_pk); free(X->wd_pk);
  X->wgu_pk = (uint8_t *)gu_pk;
  X->wd_pk = (uint8_t *)dn_pk;
  X->pk_borrowed = true;
  memcpy(X->wgu_s, gs, sizeof(float) * (size_t)(E * moe8__nblocks(D, L->wspec.tile) * X->N1));
  int64_t dk, dn;
  moe8__down_kn(L, s, &dk, &dn);
  memcpy(X->wd_s, ds, sizeof(float) * (size_t)(E * moe8__nblocks(dk, L->wspec.tile) * dn));
  return MOE8_OK;
}

static moe8_status check_scales(const moe8_layer *L) {
  for (int s = 0; s < L->nsets; s++) {
    const moe8__xset *X = &L->xs[s];
    const int64_t D = X->D;
    if (!L->inference && !X->coded) continue; /* quantized from its masters at the end of the load */
    int64_t dk, dn;
    moe8__down_kn(L, s, &dk, &dn);
    const size_t n[2] = {(size_t)(X->E * moe8__nblocks(D, L->wspec.tile) * X->N1), (size_t)(X->E * moe8__nblocks(dk, L->wspec.tile) * dn)};
    const float *p[2] = {X->wgu_s, X->wd_s};
    for (int w = 0; w < 2; w++)
      for (size_t i = 0; i < n[w]; i++)
        if (!(p[w][i] > 0.0f) || !isfinite(p[w][i]))
          return moe8__fail(MOE8_ERR_NONFINITE, "layer %s: %s expert %lld %s scale [%zu] is %g (scales must be positive and finite)",
                            L->module_path, s ? "shared" : "routed", (long long)(i / (n[w] / (size_t)X->E)),
                            w ? "down" : "gate|up", i % (n[w] / (size_t)X->E), (double)p[w][i]);
  }
  return MOE8_OK;
}

/* Training layers whose codes came from a file: the masters become the
** codes' values (a set with no codes, e.g. the shared expert under
** moe8_layer_load_prepared, is quantized from its masters instead). */
static moe8_status finish_training(moe8_layer *L) {
  moe8_status st = MOE8_OK;
  for (int s = 0; s < L->nsets && st == MOE8_OK; s++) {
    moe8__xset *X = &L->xs[s];
    const int64_t E = X->E, F = X->F, D = X->D;
    if (!X->coded) {
      st = quantize_set(L, X);
      continue;
    }
    int64_t dk, dn;
    moe8__down_kn(L, s, &dk, &dn);
    st = moe8_dequantize(&L->wspec, X->wgu_q, X->wgu_s, E, D, X->N1, X->wgu_f32);
    if (st == MOE8_OK) st = moe8_dequantize(&L->wspec, X->wd_q, X->wd_s, E, dk, dn, X->wd_f32);
    if (st == MOE8_OK) gate_up_split(L->w[X->wg], L->w[X->wu], X->wgu_f32, E * D, F);
  }
  if (st == MOE8_OK) st = pack_weights(L);
  if (st != MOE8_OK) return st;
  set_describe(L, " (loaded pre-quantized)");
  L->prepared = true;
  return MOE8_OK;
}

moe8_status moe8__layer_end_load(moe8_layer *L) {
  moe8_status st = MOE8_OK;
  if (L->wq && (L->inference || L->from_codes) && (st = check_scales(L)) != MOE8_OK) return st;
  if (!L->inference) return L->from_codes ? finish_training(L) : MOE8_OK;
  if ((st = check_weights(L)) != MOE8_OK) return st;
  set_describe(L, L->xs[0].wgu_pk ? " (loaded for inference, packed)" : " (loaded for inference)");
  if (L->wmx)
    mx4_describe(L, !L->wmx_file ? "quantized at load" : L->nsets > 1 ? "as the file holds them; the shared expert quantized at load"
                                                                     : "as the file holds them");
  L->prepared = true;
  return MOE8_OK;
}

bool moe8__layer_keep_mx4(moe8_layer *L) {
  const int64_t D = L->cfg.hidden, F = L->cfg.ffn, Fs = L->cfg.shared_ffn;
  if (!L->wmx && L->inference && !L->wq && moe8__mx4_acts_ok(L) && !(L->has_rule && L->rule.weight_qtype != MOE8_DTYPE_NONE) &&
      L->cfg.latent % 32 == 0 && D % 32 == 0 && F % 32 == 0 && Fs % 32 == 0) {
    L->wmx = true;
    set_describe(L, "");
  }
  return L->wmx;
}

moe8_status moe8__layer_put_mx4(moe8_layer *L, uint8_t *gu_b, uint8_t *gu_s, uint8_t *dn_b, uint8_t *dn_s) {
  moe8__xset *X = &L->xs[0];
  if (!L->inference || !L->wmx || !X->mx_gu_b) {
    free(gu_b); free(gu_s); free(dn_b); free(dn_s);
    return moe8__fail(MOE8_ERR_INTERNAL, "layer: MXFP4 experts need an inference layer under weight_qtype mxfp4, inside its load");
  }
  free(X->mx_gu_b); free(X->mx_gu_s); free(X->mx_dn_b); free(X->mx_dn_s);
  X->mx_gu_b = gu_b; X->mx_gu_s = gu_s; X->mx_dn_b = dn_b; X->mx_dn_s = dn_s;
  X->mx_split = 0;
  X->mx_cols = L->aq;
  L->wmx_file = true;
  return MOE8_OK;
}

moe8_status moe8__layer_load_mx4(moe8_layer *L, uint8_t *gu_b, uint8_t *gu_s, uint8_t *dn_b, uint8_t *dn_s) {
  if (!L->inference || L->wq || !moe8__mx4_acts_ok(L) || L->nsets != 1 || L->xs[0].D % 32 || L->cfg.ffn % 32) {
    free(gu_b); free(gu_s); free(dn_b); free(dn_s);
    return moe8__fail(MOE8_ERR_INTERNAL, "layer: MXFP4 weights need an inference layer without weight rules or a shared expert, f32 or "
                      "int8 activations, D and F multiples of 32");
  }
  moe8__xset *X = &L->xs[0];
  free_set(X);
  X->mx_gu_b = gu_b; X->mx_gu_s = gu_s; X->mx_dn_b = dn_b; X->mx_dn_s = dn_s;
  X->mx_split = X->F;
  X->mx_cols = L->aq;
  moe8_layer_weights_changed(L);
  L->from_codes = false;
  moe8_status st = check_weights(L);
  if (st != MOE8_OK) return st;
  mx4_describe(L, "loaded for inference, as the file holds them");
  L->prepared = true;
  return MOE8_OK;
}

/* ---- an inference layer from weights in memory (moe8.h) --------------------- */
/* What the inference load of a model directory does, with the caller as
** the file: the layer is made for inference, each expert comes in f32 and
** is kept only as the rule makes it (moe8__layer_put_expert), and the
** load ends once every expert has come. */
moe8_status moe8_layer_create_inference(const moe8_layer_config *cfg, const moe8_rules *rules, const char *module_path,
                                        moe8_layer **out) {
  if (!out) return moe8__fail(MOE8_ERR_INVALID_ARG, "layer_create_inference: NULL out");
  *out = NULL;
  moe8_layer *L = NULL;
  moe8_status st = moe8__layer_create(cfg, rules, module_path, true, &L);
  if (st == MOE8_OK && !(L->given = calloc((size_t)(cfg->num_experts + 1), 1))) st = moe8__fail(MOE8_ERR_NOMEM, "layer: out of memory");
  if (st == MOE8_OK) st = moe8__layer_begin_load(L, MOE8_DTYPE_NONE, 0);
  if (st != MOE8_OK) { moe8_layer_destroy(L); return st; }
  *out = L;
  return MOE8_OK;
}

moe8_status moe8_layer_put_expert(moe8_layer *L, int set, int64_t e, const float *gate_up, const float *down) {
  if (!L || !gate_up || !down) return moe8__fail(MOE8_ERR_INVALID_ARG, "layer_put_expert: NULL argument");
  if (!L->given)
    return moe8__fail(MOE8_ERR_INVALID_ARG, "layer %s: put_expert is for a layer made by moe8_layer_create_inference, before "
                      "moe8_layer_finish_load", L->module_path);
  if (set < 0 || set >= L->nsets)
    return moe8__fail(MOE8_ERR_SHAPE, "layer %s: expert set %d is not 0 (routed)%s", L->module_path, set,
                      L->nsets > 1 ? " or 1 (the shared expert)" : " (the layer has no shared expert)");
  if (e < 0 || e >= L->xs[set].E)
    return moe8__fail(MOE8_ERR_SHAPE, "layer %s: %s expert %lld is not in [0, %lld)", L->module_path, set ? "shared" : "routed",
                      (long long)e, (long long)L->xs[set].E);
  const moe8_status st = moe8__layer_put_expert(L, set, e, gate_up, down, NULL, NULL, NULL, NULL);
  if (st == MOE8_OK) L->given[set ? L->cfg.num_experts : e] = 1;
  return st;
}

moe8_status moe8_layer_finish_load(moe8_layer *L) {
  if (!L) return moe8__fail(MOE8_ERR_INVALID_ARG, "layer_finish_load: NULL layer");
  if (!L->given)
    return moe8__fail(MOE8_ERR_INVALID_ARG, "layer %s: finish_load is for a layer made by moe8_layer_create_inference, once",
                      L->module_path);
  const int64_t E = L->cfg.num_experts;
  for (int64_t e = 0; e <= E; e++)
    if (!L->given[e] && (e < E || L->nsets > 1))
      return moe8__fail(MOE8_ERR_INVALID_ARG, "layer %s: %s expert %lld was not given (moe8_layer_put_expert)", L->module_path,
                        e < E ? "routed" : "shared", (long long)(e < E ? e : 0));
  const moe8_status st = moe8__layer_end_load(L);
  if (st == MOE8_OK) { free(L->given); L->given = NULL; }
  return st;
}

moe8_status moe8_layer_load_prepared(moe8_layer *L, const moe8_prepared *p) {
  if (!L || !p) return moe8__fail(MOE8_ERR_INVALID_ARG, "layer: NULL argument");
  if (L->inference) return moe8__fail(MOE8_ERR_UNSUPPORTED, "layer: load_prepared on an inference layer");
  if (p->dtype != MOE8_DTYPE_F8E4M3 && p->dtype != MOE8_DTYPE_I8)
    return moe8__fail(MOE8_ERR_DTYPE, "layer load_prepared: dtype %d: prepared weights must be f8e4m3 or i8 codes", (int)p->dtype);
  if (!p->w_gate_up || !p->s_gate_up || !p->w_down || !p->s_down)
    return moe8__fail(MOE8_ERR_INVALID_ARG, "layer load_prepared: NULL %s", !p->w_gate_up ? "w_gate_up" : !p->s_gate_up ? "s_gate_up"
                      : !p->w_down ? "w_down" : "s_down");
  const int64_t E = L->cfg.num_experts, D = L->xs[0].D, F = L->cfg.ffn;
  if (p->tile < 0 || p->tile > D + F)
    return moe8__fail(MOE8_ERR_SHAPE, "layer load_prepared: tile %lld is not a block length along K", (long long)p->tile);
  moe8_status st = moe8__layer_begin_load(L, p->dtype, p->tile);
  if (st != MOE8_OK) return st;
  moe8__xset *X = &L->xs[0];
  int64_t dk, dn;
  moe8__down_kn(L, 0, &dk, &dn);
  const size_t ngu = (size_t)(E * moe8__nblocks(D, p->tile) * X->N1), nd = (size_t)(E * moe8__nblocks(dk, p->tile) * dn);
  memcpy(X->wgu_q, p->w_gate_up, (size_t)(E * D * X->N1));
  memcpy(X->wd_q, p->w_down, (size_t)(E * F * D));
  memcpy(X->wgu_s, p->s_gate_up, ngu * sizeof(float));
  memcpy(X->wd_s, p->s_down, nd * sizeof(float));
  X->coded = true;
  return moe8__layer_end_load(L);
}

/* ---- forward ---------------------------------------------------------------------- */
static moe8_status forward(moe8_layer *L, const float *x, int64_t T, float *out, float *aux, void *ws, size_t ws_size,
                           uint64_t kind, const int32_t *ids_in, const float *w_in, bool with_shared, const int32_t *tok, int64_t seq,
                           const float *rs_in, float *rs_out) {
  if (!L) return moe8__fail(MOE8_ERR_INVALID_ARG, "layer: NULL");
  const int64_t E = L->cfg.num_experts, K = L->cfg.top_k, D = L->cfg.hidden, R = L->cfg.router_mlp;
  if (T < 0 || T > max_tokens(L))
    return moe8__fail(MOE8_ERR_SHAPE, "layer %s: x has T = %lld rows; a call takes 0 to %lld", L->module_path, (long long)T,
                      (long long)max_tokens(L));
  /* Zaya's router state: the previous layer's, never a silent zero one */
  if (!ids_in && L->cfg.router_state && !rs_in)
    return moe8__fail(MOE8_ERR_INVALID_ARG, "layer %s: its router adds the previous layer's router state (router_state: Zaya's layers "
                      "after the first), and none was given: pass the previous layer's router_state_out [T, %lld] as router_state_in "
                      "(moe8_layer_forward_state)", L->module_path, (long long)R);
  if (rs_in && !L->cfg.router_state)
    return moe8__fail(MOE8_ERR_INVALID_ARG, "layer %s takes no router state: %s", L->module_path,
                      R > 0 ? "its router reads x alone (router_state off: Zaya's first layer)" : "its router is not an MLP (router_mlp = 0)");
  if (rs_out && R == 0)
    return moe8__fail(MOE8_ERR_INVALID_ARG, "layer %s has no router state to give (router_mlp = 0: its router is not Zaya's MLP)",
                      L->module_path);
  if (aux) *aux = 0.0f;
  if (T == 0) return MOE8_OK;
  if (rs_in) {
    const size_t bad = moe8__count_nonfinite_par(rs_in, (size_t)(T * R));
    if (bad)
      return moe8__fail(MOE8_ERR_NONFINITE, "layer %s: router_state_in [%lld, %lld] has %zu non-finite value(s)", L->module_path,
                        (long long)T, (long long)R, bad);
  }
  if (!x || !out || !ws) return moe8__fail(MOE8_ERR_INVALID_ARG, "layer: NULL x, out or workspace");
  if (!ids_in) {
    const moe8_status tst = moe8__check_tokens(L, tok, T, "layer forward");
    if (tst != MOE8_OK) return tst;
  }
  if (L->cfg.expert_capacity > 0 && !L->cfg.capacity_ranked && !ids_in && (seq < 0 || (seq > 0 && T % seq)))
    return moe8__fail(MOE8_ERR_SHAPE, "layer %s: seq_len = %lld must be 0 (one sequence) or divide T = %lld (the rows are sequences of "
                      "seq_len tokens; the expert capacity counts per sequence)", L->module_path, (long long)seq, (long long)T);
  ws_layout w;
  layout(L, T, ws, &w);
  if (ws_size < w.total)
    return moe8__fail(MOE8_ERR_INVALID_ARG, "layer: workspace of %zu bytes, need %zu for T = %lld (moe8_layer_workspace_size)",
                      ws_size, w.total, (long long)T);
  if ((uintptr_t)ws & 63) return moe8__fail(MOE8_ERR_INVALID_ARG, "layer: workspace must be 64-byte aligned");
  /* Prefill: the matmuls' packed rows and accumulators on huge pages, as
  ** moe8_gmm's own workspace (int8 at 128 rows an expert, one thread:
  ** 24 -> 20.6 ms measured through moe8_gmm on an AMX Xeon). */
  if (T >= 64) moe8__advise_huge(w.scratch, w.scratch_bytes);
  ws_mark(ws, L, T, WS_NONE); /* holds no forward until this one succeeds */
  /* One order for the whole call, routed and shared experts alike. */
  const moe8_order order = moe8__layer_order_now(L);
  /* Quantized before the gather: as the rule asks (change A), or on an
  ** inference forward whenever the scales are per row (per token or
  ** 1 x tile), where a gathered row's codes and scales are its token's:
  ** the same bytes, each token quantized once and moved as codes.  Then
  ** x is quantized first, and the quantizer's scan for inf and NaN is the
  ** input's (no pass of its own). */
  const bool per_row = L->aq && (L->aspec.gran == MOE8_GRAN_ROW || L->aspec.gran == MOE8_GRAN_ROW_TILE);
  const bool qfirst = L->aq && !L->cfg.weight_input && (L->before_sort || (kind == WS_FUSED && per_row));
  /* Gemma-4: the experts read n(x) ⊙ w_in, the router n(x) ⊙ s · c; x
  ** itself is checked below, and read only by these norms. */
  const float eps = L->cfg.rms_eps, rsc = L->cfg.router_norm_scale != 0.0f ? L->cfg.router_norm_scale : 1.0f;
  const float *xe = x, *xr = x;
  if (L->cfg.in_norm) {
    moe8__rms_norm_rows(x, T, D, eps, L->w[MOE8_W_IN_NORM], 1.0f, w.xe);
    xe = w.xe;
  }
  if (L->cfg.router_norm && !ids_in) {
    moe8__rms_norm_rows(x, T, D, eps, L->w[MOE8_W_ROUTER_SCALE], rsc, w.xr);
    xr = w.xr;
  }
  /* Latent experts: the routed rows are z = x · P (then its norm), DX
  ** wide, quantized into zq/sz; the shared expert reads x (its codes in
  ** xq/sx), and x is scanned on its own. */
  const bool lat = L->cfg.latent > 0;
  const int64_t DX = moe8__routed_width(L);
  const float *xsh = xe;
  uint8_t *rq = w.xq;
  float *rs = w.sx;
  moe8_status st = MOE8_OK;
  if (lat) {
    if ((st = moe8__latent_in(L, x, T, w.z)) != MOE8_OK) return st;
    xe = w.z;
    rq = w.zq;
    rs = w.sz;
  }
  st = qfirst ? moe8_quantize(&L->aspec, xe, 1, T, DX, rq, rs, NULL) : MOE8_OK;
  if (st != MOE8_OK && st != MOE8_ERR_NONFINITE) return st;
  if (!qfirst || lat || st == MOE8_ERR_NONFINITE) {
    const size_t bad = moe8__count_nonfinite_par(x, (size_t)(T * D));
    if (bad || (st != MOE8_OK && !lat))
      return moe8__fail(MOE8_ERR_NONFINITE, "layer: input x [%lld, %lld] has %zu non-finite value(s)", (long long)T, (long long)D, bad);
    if (st != MOE8_OK)
      return moe8__fail(MOE8_ERR_NONFINITE, "layer %s: the latent expert input z = x P [%lld, %lld] is not finite (the projection "
                        "weight too large for the input)", L->module_path, (long long)T, (long long)DX);
  }

  /* 1. router (or the caller's routing: ids < 0 skipped) */
  if (ids_in) {
    memcpy(w.ids, ids_in, sizeof(int32_t) * (size_t)(T * K));
    for (int64_t a = 0; a < T * K; a++) {
      w.w[a] = ids_in[a] < 0 ? 0.0f : w_in[a];
      if (ids_in[a] >= 0 && !isfinite(w_in[a]))
        return moe8__fail(MOE8_ERR_NONFINITE, "layer %s experts: topk_weights[%lld, %lld] = %g is not finite", L->module_path,
                          (long long)(a / K), (long long)(a % K), (double)w_in[a]);
    }
  } else if (L->cfg.product_keys) { /* Doge's: two halves of keys (pkeys.c) */
    st = moe8__router_logits(L, xr, T, w.logits);
    if (st == MOE8_OK) st = moe8__pk_route(L, w.logits, T, w.ids, w.w);
  } else {
    st = R > 0 ? moe8__router_mlp(L, xr, T, rs_in, w.rs, w.ra, w.rb, w.logits) : moe8__router_logits(L, xr, T, w.logits);
    moe8_router_config rc = moe8__router_config(L, tok);
    if (L->cfg.capacity_ranked) rc.routed_scaling_factor = 1.0f; /* NLLB-MoE: scaled after the drop's renormalization */
    if (st == MOE8_OK) st = moe8_route(&rc, w.logits, T, w.scores, w.ids, w.w);
    if (st == MOE8_OK && moe8__capacity_on(&L->cfg)) moe8__apply_capacity(L, T, seq, w.ids, w.w);
    if (st == MOE8_OK && L->cfg.skip_experts > 0) moe8__skip_slots(L, T, w.ids, w.w);
    if (st == MOE8_OK && L->cfg.expert_scale) { /* Gemma-4: each weight times its expert's scale (the backward keeps wn) */
      const float *c = L->w[MOE8_W_EXPERT_SCALE];
      for (int64_t a = 0; a < T * K; a++) {
        w.wn[a] = w.w[a];
        if (w.ids[a] >= 0) w.w[a] = w.w[a] * c[w.ids[a]];
      }
    }
  }
  if (L->cfg.product_keys) {
    /* Doge's experts, per token (pkeys.c), from x's codes when the rule's
    ** pair has a kernel, else from x (dequantized when quantized), copied
    ** (out may be x); the dense SwiGLU (the shared expert) added after */
    const bool pair = L->aq && L->wq && moe8__kernel_pair(L->aspec.qtype, L->wspec.qtype);
    if (st == MOE8_OK && L->aq && !qfirst) st = moe8_quantize(&L->aspec, x, 1, T, D, w.xq, w.sx, NULL);
    moe8__shared_buf sb = {0};
    if (st == MOE8_OK && L->cfg.shared_ffn > 0 && with_shared) {
      moe8__shared_buf_carve(L, T, w.shared, &sb);
      st = moe8__shared_forward(L, order, x, w.xq, w.sx, T, &sb, w.scratch, w.scratch_bytes);
    }
    if (st == MOE8_OK && L->aq && !pair) st = moe8_dequantize(&L->aspec, w.xq, w.sx, 1, T, D, w.xs);
    else if (st == MOE8_OK && !pair) memcpy(w.xs, x, sizeof(float) * (size_t)(T * D));
    if (st == MOE8_OK) st = moe8__pk_experts(L, w.xs, pair ? w.xq : NULL, w.sx, T, w.ids, w.w, out);
    if (st == MOE8_OK) st = moe8__finish_output(L, T, NULL, NULL, NULL, NULL, &sb, out);
    if (st == MOE8_OK) ws_mark(ws, L, T, kind);
    return st;
  }
  /* 2. dispatch */
  moe8_dispatch d = {w.token_of, w.slot_of, w.gsz, w.offs, w.pos_of, 0};
  if (st == MOE8_OK) st = moe8__dispatch_sort(w.ids, T, K, E, L->cfg.zero_experts, L->cfg.capacity_factor,
                                             ids_in != NULL || moe8__capacity_on(&L->cfg) || L->cfg.skip_experts > 0, &d);
  if (st != MOE8_OK) return st;
  /* LongCat-Flash's identity experts, while x is whole (out may be x) */
  if (L->cfg.zero_experts) moe8__identity_rows(L, x, T, w.ids, w.w, w.idn);
  const int64_t rows = d.num_rows;
  if (aux && L->cfg.aux_loss_weight != 0.0f && !ids_in) {
    double f[MOE8_MAX_EXPERTS];
    *aux = moe8__aux_loss(L, T, w.ids, w.scores, f);
  }
  /* 3. expert input rows */
  const int64_t nbD = L->aq ? moe8__nblocks(DX, L->aspec.tile) : 1;
  if (L->cfg.weight_input) {
    /* Llama-4: row p is its token scaled by its slot's weight, quantized
    ** after; the combine then adds the expert outputs unweighted. */
    st = moe8_gather_rows(w.xs, xe, sizeof(float) * (size_t)D, w.token_of, rows, T);
    if (st == MOE8_OK) moe8__scale_rows(w.xs, rows, D, w.token_of, w.slot_of, w.w, K);
    if (st == MOE8_OK && L->aq) st = moe8_quantize(&L->aspec, w.xs, 1, rows, D, w.xsq, w.sxs, NULL);
  } else if (qfirst) {
    bool gathered; /* x quantized at the start */
    st = moe8_gather_qrows(w.xsq, w.sxs, &gathered, rq, rs, T, DX, T, nbD, w.token_of, rows);
  } else {
    st = moe8_gather_rows(w.xs, xe, sizeof(float) * (size_t)DX, w.token_of, rows, T);
    if (st == MOE8_OK && L->aq) st = moe8_quantize(&L->aspec, w.xs, 1, rows, DX, w.xsq, w.sxs, NULL);
  }
  /* 6. the shared expert on every token, computed while x is whole (out
  ** may be x, or overlap it: nothing reads x after the combine writes
  ** out) and added after the combine */
  moe8__shared_buf sb = {0};
  if (st == MOE8_OK && L->cfg.shared_ffn > 0 && with_shared) {
    moe8__shared_buf_carve(L, T, w.shared, &sb);
    if (L->aq && (!qfirst || lat)) st = moe8_quantize(&L->aspec, xsh, 1, T, D, w.xq, w.sx, NULL);
    if (st == MOE8_OK) st = moe8__shared_forward(L, order, xsh, w.xq, w.sx, T, &sb, w.scratch, w.scratch_bytes);
  }
  /* 4, 5. experts, combine */
  if (st == MOE8_OK)
    st = moe8__experts_forward(L, order, 0, rows, w.gsz, 0, E, w.xs, w.xsq, w.sxs, w.gu, w.h, w.hq, w.sh, w.y, w.scratch, w.scratch_bytes);
  if (st == MOE8_OK && L->cfg.expert_out_norm) { /* MuSE-Spark: each expert row's norm (the backward keeps the rows before it) */
    if (kind != WS_FUSED) memcpy(w.yo, w.y, sizeof(float) * (size_t)(rows * DX));
    moe8__expert_out_norm_rows(w.y, rows, DX, L->cfg.expert_out_eps, L->w[MOE8_W_EXPERT_OUT_NORM]);
  }
  if (st == MOE8_OK && lat) { /* the weighted sum in the latent width, then back to D */
    #pragma omp parallel for num_threads(moe8__nt(2.0 * (double)T * (double)K * (double)DX)) schedule(static)
    for (int64_t t = 0; t < T; t++) moe8__combine_row(w.c + t * DX, w.y, w.pos_of + t * K, w.w + t * K, K, DX);
    st = moe8__latent_out(L, w.c, T, out);
  }
  if (st == MOE8_OK)
    st = moe8__finish_output(L, T, lat ? NULL : w.y, w.pos_of, L->cfg.weight_input ? NULL : w.w, L->cfg.zero_experts ? w.idn : NULL,
                             &sb, out);
  if (st == MOE8_OK && L->cfg.out_norm) { /* Gemma-4: the output's RMSNorm (the backward keeps what it normed) */
    memcpy(w.yb, out, sizeof(float) * (size_t)(T * D));
    moe8__rms_norm_rows(w.yb, T, D, eps, L->w[MOE8_W_OUT_NORM], 1.0f, out);
  }
  if (st == MOE8_OK && rs_out) memmove(rs_out, w.rs, sizeof(float) * (size_t)(T * R)); /* may be rs_in: read by now */
  if (st == MOE8_OK) ws_mark(ws, L, T, kind);
  return st;
}

moe8_status moe8__layer_quantize_weights(moe8_layer *L) { return ensure_quantized(L); }

moe8_status moe8_layer_forward_seq(moe8_layer *L, const float *x, int64_t T, const int32_t *tok, int64_t seq, float *out, float *aux_loss,
                                   void *ws, size_t ws_size) {
  if (!L) return moe8__fail(MOE8_ERR_INVALID_ARG, "layer: NULL");
  moe8_status st = ensure_quantized(L); /* inference layers: fixed at load */
  if (st != MOE8_OK) return st;
  pthread_rwlock_rdlock(&L->lock);
  st = forward(L, x, T, out, aux_loss, ws, ws_size, WS_TRAINING, NULL, NULL, true, tok, seq, NULL, NULL);
  pthread_rwlock_unlock(&L->lock);
  return st;
}

moe8_status moe8_layer_forward_tokens(moe8_layer *L, const float *x, int64_t T, const int32_t *tok, float *out, float *aux_loss,
                                      void *ws, size_t ws_size) {
  return moe8_layer_forward_seq(L, x, T, tok, 0, out, aux_loss, ws, ws_size);
}

moe8_status moe8_layer_forward(moe8_layer *L, const float *x, int64_t T, float *out, float *aux_loss, void *ws,
                               size_t ws_size) {
  return moe8_layer_forward_tokens(L, x, T, NULL, out, aux_loss, ws, ws_size);
}

moe8_status moe8_layer_forward_fused_seq(moe8_layer *L, const float *x, int64_t T, const int32_t *tok, int64_t seq, float *out, void *ws,
                                         size_t ws_size) {
  if (!L) return moe8__fail(MOE8_ERR_INVALID_ARG, "layer: NULL");
  pthread_rwlock_rdlock(&L->lock);
  const moe8_status st = !L->prepared ? moe8__fail(MOE8_ERR_INVALID_ARG, "layer: forward_fused before moe8_layer_prepare")
                                      : forward(L, x, T, out, NULL, ws, ws_size, WS_FUSED, NULL, NULL, true, tok, seq, NULL, NULL);
  pthread_rwlock_unlock(&L->lock);
  return st;
}

moe8_status moe8_layer_forward_state(moe8_layer *L, const float *x, int64_t T, const float *rs_in, float *rs_out, float *out,
                                     float *aux_loss, void *ws, size_t ws_size) {
  if (!L) return moe8__fail(MOE8_ERR_INVALID_ARG, "layer: NULL");
  moe8_status st = ensure_quantized(L);
  if (st != MOE8_OK) return st;
  pthread_rwlock_rdlock(&L->lock);
  st = forward(L, x, T, out, aux_loss, ws, ws_size, WS_TRAINING, NULL, NULL, true, NULL, 0, rs_in, rs_out);
  pthread_rwlock_unlock(&L->lock);
  return st;
}

moe8_status moe8_layer_forward_fused_state(moe8_layer *L, const float *x, int64_t T, const float *rs_in, float *rs_out, float *out,
                                           void *ws, size_t ws_size) {
  if (!L) return moe8__fail(MOE8_ERR_INVALID_ARG, "layer: NULL");
  pthread_rwlock_rdlock(&L->lock);
  const moe8_status st = !L->prepared ? moe8__fail(MOE8_ERR_INVALID_ARG, "layer: forward_fused before moe8_layer_prepare")
                                      : forward(L, x, T, out, NULL, ws, ws_size, WS_FUSED, NULL, NULL, true, NULL, 0, rs_in, rs_out);
  pthread_rwlock_unlock(&L->lock);
  return st;
}

moe8_status moe8_layer_forward_fused_tokens(moe8_layer *L, const float *x, int64_t T, const int32_t *tok, float *out, void *ws,
                                            size_t ws_size) {
  return moe8_layer_forward_fused_seq(L, x, T, tok, 0, out, ws, ws_size);
}

moe8_status moe8_layer_forward_fused(moe8_layer *L, const float *x, int64_t T, float *out, void *ws, size_t ws_size) {
  return moe8_layer_forward_fused_tokens(L, x, T, NULL, out, ws, ws_size);
}

moe8_status moe8_layer_set_hash_table(moe8_layer *L, const int32_t *tid2eid, int64_t vocab) {
  if (!L || !tid2eid) return moe8__fail(MOE8_ERR_INVALID_ARG, "layer hash table: NULL argument");
  if (!L->cfg.hash_routing)
    return moe8__fail(MOE8_ERR_INVALID_ARG, "layer %s hash table: the layer does not route by token id (hash_routing false)", L->module_path);
  const int64_t K = L->cfg.top_k, E = L->cfg.num_experts;
  if (vocab <= 0 || vocab > ((int64_t)1 << 31) || vocab > ((int64_t)1 << 40) / K)
    return moe8__fail(MOE8_ERR_SHAPE, "layer %s hash table: %lld rows (token ids) must be in [1, 2^31]", L->module_path, (long long)vocab);
  for (int64_t i = 0; i < vocab * K; i++)
    if (tid2eid[i] < 0 || tid2eid[i] >= E)
      return moe8__fail(MOE8_ERR_INVALID_ARG, "layer %s hash table: element [%lld, %lld] (offset %lld) = %d is not an expert id in [0, %lld)",
                        L->module_path, (long long)(i / K), (long long)(i % K), (long long)i, (int)tid2eid[i], (long long)E);
  int32_t *t = malloc(sizeof(int32_t) * (size_t)(vocab * K));
  if (!t) return moe8__fail(MOE8_ERR_NOMEM, "layer %s hash table: out of memory", L->module_path);
  memcpy(t, tid2eid, sizeof(int32_t) * (size_t)(vocab * K));
  pthread_rwlock_wrlock(&L->lock);
  free(L->tid2eid);
  L->tid2eid = t;
  L->hash_vocab = vocab;
  pthread_rwlock_unlock(&L->lock);
  return MOE8_OK;
}

const int32_t *moe8_layer_hash_table(const moe8_layer *L, int64_t *vocab) {
  if (vocab) *vocab = L && L->tid2eid ? L->hash_vocab : 0;
  return L ? L->tid2eid : NULL;
}

static moe8_status layer_experts(moe8_layer *L, const float *x, int64_t T, const int32_t *topk_ids, const float *topk_weights,
                                 float *out, void *ws, size_t ws_size, bool with_shared) {
  if (!L) return moe8__fail(MOE8_ERR_INVALID_ARG, "layer experts: NULL layer");
  if (T > 0 && (!topk_ids || !topk_weights)) return moe8__fail(MOE8_ERR_INVALID_ARG, "layer experts: NULL topk_ids or topk_weights");
  moe8_status st = ensure_quantized(L);
  if (st != MOE8_OK) return st;
  pthread_rwlock_rdlock(&L->lock);
  /* no backward from here: the workspace is marked as an inference forward's */
  st = forward(L, x, T, out, NULL, ws, ws_size, WS_FUSED, topk_ids, topk_weights, with_shared, NULL, 0, NULL, NULL);
  pthread_rwlock_unlock(&L->lock);
  return st;
}

moe8_status moe8_layer_experts(moe8_layer *L, const float *x, int64_t T, const int32_t *topk_ids, const float *topk_weights, float *out,
                               void *ws, size_t ws_size) {
  return layer_experts(L, x, T, topk_ids, topk_weights, out, ws, ws_size, true);
}

moe8_status moe8_layer_experts_routed(moe8_layer *L, const float *x, int64_t T, const int32_t *topk_ids, const float *topk_weights,
                                      float *out, void *ws, size_t ws_size) {
  return layer_experts(L, x, T, topk_ids, topk_weights, out, ws, ws_size, false);
}

/* ---- backward ------------------------------------------------------------------------ */
static moe8_status backward(moe8_layer *L, const float *x, int64_t T, const float *dout, void *ws, size_t ws_size,
                            const moe8_layer_grads *gr);

moe8_status moe8_layer_backward(moe8_layer *L, const float *x, int64_t T, const float *dout, void *ws, size_t ws_size,
                                const moe8_layer_grads *gr) {
  if (!L || !gr) return moe8__fail(MOE8_ERR_INVALID_ARG, "layer backward: NULL argument");
  pthread_rwlock_rdlock(&L->lock);
  const moe8_status st = backward(L, x, T, dout, ws, ws_size, gr);
  pthread_rwlock_unlock(&L->lock);
  return st;
}

static moe8_status backward(moe8_layer *L, const float *x, int64_t T, const float *dout, void *ws, size_t ws_size,
                            const moe8_layer_grads *gr) {
  if (L->inference)
    return moe8__fail(MOE8_ERR_UNSUPPORTED, "layer backward: the layer was loaded for inference (no f32 masters); load it for training");
  moe8_status fst = moe8__check_backward_form(L, "layer backward");
  if (fst != MOE8_OK) return fst;
  const int64_t E = L->cfg.num_experts, K = L->cfg.top_k, D = L->cfg.hidden, A = T * K, Fs = L->cfg.shared_ffn;
  if (T < 0 || T > max_tokens(L)) return moe8__fail(MOE8_ERR_SHAPE, "layer backward: T = %lld", (long long)T);
  if (T > 0 && (!x || !dout || !ws)) return moe8__fail(MOE8_ERR_INVALID_ARG, "layer backward: NULL x, dout or workspace");
  if (T > 0) {
    /* The workspace must hold this layer's training forward of these T tokens. */
    ws_head h;
    if (ws_size < sizeof h) return moe8__fail(MOE8_ERR_INVALID_ARG, "layer backward: workspace of %zu bytes holds no forward", ws_size);
    memcpy(&h, ws, sizeof h);
    if (h.magic != WS_MAGIC || h.layer != L || h.kind == WS_NONE)
      return moe8__fail(MOE8_ERR_INVALID_ARG, "layer %s backward: the workspace holds no successful forward of this layer "
                        "(run moe8_layer_forward with it first)", L->module_path);
    if (h.kind == WS_FUSED)
      return moe8__fail(MOE8_ERR_INVALID_ARG, "layer %s backward: the workspace holds a fused (inference) forward; "
                        "a backward needs moe8_layer_forward", L->module_path);
    if (h.T != T)
      return moe8__fail(MOE8_ERR_SHAPE, "layer %s backward: T = %lld, but the workspace holds the forward of T = %lld tokens",
                        L->module_path, (long long)T, (long long)h.T);
  }
  moe8__zero_grads(L, T, gr);
  if (T == 0) return MOE8_OK;
  ws_layout w;
  layout(L, T, ws, &w);
  if (ws_size < w.total) return moe8__fail(MOE8_ERR_INVALID_ARG, "layer backward: workspace too small");
  const size_t bad = moe8__count_nonfinite_par(dout, (size_t)(T * D));
  if (bad) return moe8__fail(MOE8_ERR_NONFINITE, "layer backward: dout [%lld, %lld] has %zu non-finite value(s)", (long long)T, (long long)D, bad);
  const int64_t rows = w.offs[E];
  /* Latent experts: the routed rows are H wide; the gradient at their
  ** weighted sum (dc) and at their input z (dzl) apart from dx. */
  const bool lat = L->cfg.latent > 0;
  const int64_t H = moe8__routed_width(L);
  float *dc = lat ? malloc(sizeof(float) * (size_t)(T * H + 1)) : NULL, *dzl = lat ? calloc((size_t)(T * H + 1), sizeof(float)) : NULL;
  float *dy = moe8__pool_get(L->pool, sizeof(float) * (size_t)(rows * H + 1)), *dxs = moe8__pool_get(L->pool, sizeof(float) * (size_t)(rows * H + 1));
  float *dwrow = malloc(sizeof(float) * (size_t)(rows + 1)), *dw = calloc((size_t)A + 1, sizeof(float));
  const int64_t ER = moe8__router_width(L); /* the router's experts: with the identity ones */
  float *dl = malloc(sizeof(float) * (size_t)(T * ER + 1));
  /* Gemma-4's norms: the gradient at the output before its norm (dz), and
  ** the experts' and the router's input gradients apart (dxe, dxr), each
  ** taken back through its norm to dx at the end. */
  const bool gin = L->cfg.in_norm && (gr->dx || gr->dwin), grn = L->cfg.router_norm && (gr->dx || gr->dwrs);
  float *dz = L->cfg.out_norm ? calloc((size_t)(T * D) + 1, sizeof(float)) : NULL;
  float *dxe_b = gin ? calloc((size_t)(T * D) + 1, sizeof(float)) : NULL, *dxr_b = grn ? calloc((size_t)(T * D) + 1, sizeof(float)) : NULL;
  float *dxe = L->cfg.in_norm ? dxe_b : gr->dx, *dxr = L->cfg.router_norm ? dxr_b : gr->dx;
  const float *xe = L->cfg.in_norm ? w.xe : x, *xr = L->cfg.router_norm ? w.xr : x;
  const float eps = L->cfg.rms_eps, rsc = L->cfg.router_norm_scale != 0.0f ? L->cfg.router_norm_scale : 1.0f;
  double f[MOE8_MAX_EXPERTS];
  moe8_status st = MOE8_OK;
  if (!dy || !dxs || !dwrow || !dw || !dl || (L->cfg.out_norm && !dz) || (gin && !dxe_b) || (grn && !dxr_b) || (lat && (!dc || !dzl))) {
    st = moe8__fail(MOE8_ERR_NOMEM, "layer backward: out of memory");
    goto done;
  }
  if (dz && (st = moe8__rms_norm_backward(w.yb, T, D, eps, L->w[MOE8_W_OUT_NORM], 1.0f, dout, dz, gr->dwon)) != MOE8_OK) goto done;
  if (dz) dout = dz;
  if (lat) moe8__latent_out_backward(L, dout, w.c, T, dc, gr->dwlo); /* out = c · Q */
  moe8__dy_dw(rows, w.token_of, w.slot_of, L->cfg.weight_input ? NULL : w.w, K, lat ? dc : dout, w.y, H, dy, dwrow);
  for (int64_t p = 0; p < rows; p++) dw[w.token_of[p] * K + w.slot_of[p]] = dwrow[p];
  if (L->cfg.expert_out_norm && (st = moe8__expert_out_norm_backward(w.yo, w.y, rows, H, L->cfg.expert_out_eps,
                                                                     L->w[MOE8_W_EXPERT_OUT_NORM], dy, gr->dweon)) != MOE8_OK)
    goto done;
  st = moe8__experts_backward(L, 0, rows, w.gsz, 0, E, dy, w.xs, w.xsq, w.sxs, w.h, w.hq, w.sh, w.gu, dxs, gr->dwg, gr->dwu, gr->dwd,
                              L->cfg.expert_bias ? gr->dwgub : NULL, L->cfg.expert_bias ? gr->dwdb : NULL);
  if (st != MOE8_OK) goto done;
  if (L->cfg.weight_input) {
    /* Llama-4: row p = s·x_t went through the expert, s the slot's routing
    ** weight (its sigmoid score times the scaling): dx_t += s·dxs_p and
    ** ds = dxs_p · x_t, each token's slots in slot order. */
    const float c = L->cfg.routed_scaling_factor != 0.0f ? L->cfg.routed_scaling_factor : 1.0f;
    moe8__input_weight_backward(T, K, D, E, w.pos_of, dxs, xe, w.scores, w.ids, c, dxe, dw);
  } else {
    /* dx: the slots' rows summed in slot order (weights 1, exact), then the router's part. */
    if (lat && (st = moe8_combine(dxs, rows, w.pos_of, NULL, T, K, H, dzl)) != MOE8_OK) goto done;
    if (!lat && dxe && (st = moe8_combine(dxs, rows, w.pos_of, NULL, T, K, D, dxe)) != MOE8_OK) goto done;
  }
  if (L->cfg.expert_scale) {
    /* w = wn · c[e]: dc[e] += dw · wn over the slots in order, and dwn = dw · c[e] */
    const float *c = L->w[MOE8_W_EXPERT_SCALE];
    for (int64_t a = 0; a < A; a++) {
      const int32_t e = w.ids[a];
      if (e < 0) continue;
      if (gr->dwes) gr->dwes[e] += dw[a] * w.wn[a];
      dw[a] = dw[a] * c[e];
    }
  }
  /* LongCat-Flash's identity slots: dw = dout · x, dx += w · dout */
  if (L->cfg.zero_experts) moe8__identity_backward(L, x, T, w.ids, w.w, dout, gr->dx, dw);
  moe8__aux_loss(L, T, w.ids, w.scores, f);
  moe8__router_backward(L, T, w.scores, w.ids, dw, f, T, dl);
  if (gr->dwr) moe8__router_wgrad(gr->dwr, xr, dl, T, D, ER);
  if (gr->dwrb && L->cfg.router_bias)
    for (int64_t t = 0; t < T; t++)
      for (int64_t e = 0; e < ER; e++) gr->dwrb[e] += dl[t * ER + e];
  if (dxr && (st = moe8__router_dx(L, dl, T, dxr)) != MOE8_OK) goto done;
  if (Fs > 0) {
    moe8__shared_buf sb;
    moe8__shared_buf_carve(L, T, w.shared, &sb);
    st = moe8__shared_backward(L, xe, w.xq, w.sx, T, dout, &sb, dxe, gr);
  }
  if (st == MOE8_OK && L->cfg.out_bias && gr->dwob) moe8__out_bias_grad(L, dout, T, gr->dwob);
  if (st == MOE8_OK && dxe_b) st = moe8__rms_norm_backward(x, T, D, eps, L->w[MOE8_W_IN_NORM], 1.0f, dxe_b, gr->dx, gr->dwin);
  if (st == MOE8_OK && dxr_b) st = moe8__rms_norm_backward(x, T, D, eps, L->w[MOE8_W_ROUTER_SCALE], rsc, dxr_b, gr->dx, gr->dwrs);
  if (st == MOE8_OK && lat) st = moe8__latent_in_backward(L, x, T, dzl, gr->dx, gr); /* z = x · P (then its norm) */
done:
  free(dc); free(dzl);
  moe8__pool_put(L->pool, dy), moe8__pool_put(L->pool, dxs);
  free(dwrow); free(dw); free(dl); free(dz); free(dxe_b); free(dxr_b);
  return st;
}
