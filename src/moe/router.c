/*
** router.c — the router of docs/layer.md: logits, scores, top-k, weights.
**
** Every sum runs in a fixed order (d = 0..D-1 for a logit, e = 0..E-1 for
** the softmax denominator, j = 0..k-1 for renormalization), so a token's
** routing never depends on the other tokens of the batch or on threads.
*/
#include "../core/internal.h"

#include <math.h>
#include <string.h>

moe8_status moe8_router_logits(const float *x, const float *wr, int64_t T, int64_t D, int64_t E,
                               float *logits) {
  if (T < 0 || D < 0 || E <= 0)
    return moe8__fail(MOE8_ERR_SHAPE, "router: bad sizes T=%lld D=%lld E=%lld", (long long)T, (long long)D,
                      (long long)E);
  if (T > 0 && (!x || !wr || !logits)) return moe8__fail(MOE8_ERR_INVALID_ARG, "router: NULL buffer");
  /* Chunks of 64 tokens; each (t, e) is one chain in d whatever the chunk. */
  const moe8__ktable *kt = moe8__kernels();
  #pragma omp parallel for num_threads(moe8__nt(2.0 * (double)T * (double)D * (double)E)) schedule(static)
  for (int64_t t = 0; t < T; t += 64)
    kt->router_logits(logits + t * E, x + t * D, wr, T - t < 64 ? T - t : 64, D, E);
  return MOE8_OK;
}

/* PhiMoE's sparsemixer in inference, for one token's logits l[E]
** (transformers' sparsemixer, training false).  Choice c's top logit m
** (the first: over all; the second: over all but the first), ties to the
** lower index as torch's max; the experts with (m - l) / max(|l|, m) >
** thr are masked (-inf: exp gives 0), the first choice always is for the
** second; the weight is the chosen expert's softmax over the rest,
** exp(0) / Σ = 1 / Σ, the sum in e order.  max(|l|, m) is 0 only where
** l = m = 0: torch's 0 / 0 is NaN, which is not > thr (not masked).
** sc[E] gets the first choice's masked softmax. */
static void sparsemixer(const float *l, int64_t E, float thr, float *sc, int32_t *ids, float *w) {
  int64_t first = 0;
  for (int64_t c = 0; c < 2; c++) {
    int64_t best = -1;
    for (int64_t e = 0; e < E; e++)
      if ((c == 0 || e != first) && (best < 0 || l[e] > l[best])) best = e;
    const float m = l[best];
    float sum = 0.0f;
    for (int64_t e = 0; e < E; e++) {
      const float a = fabsf(l[e]), f = a < m ? m : a; /* clamp(|l|, min=m) */
      const bool masked = (c == 1 && e == first) || (f != 0.0f && (m - l[e]) / f > thr);
      const float p = masked ? 0.0f : expf(l[e] - m);
      if (c == 0) sc[e] = p;
      sum += p;
    }
    ids[c] = (int32_t)best;
    w[c] = 1.0f / sum;
    if (c == 0) {
      for (int64_t e = 0; e < E; e++) sc[e] /= sum;
      first = best;
    }
  }
}

moe8_status moe8_route(const moe8_router_config *cfg, const float *logits, int64_t T, float *scores,
                       int32_t *expert_ids, float *weights) {
  if (!cfg) return moe8__fail(MOE8_ERR_INVALID_ARG, "route: NULL config");
  const int64_t E = cfg->num_experts, K = cfg->top_k;
  if (E <= 0 || E > MOE8_MAX_EXPERTS)
    return moe8__fail(MOE8_ERR_SHAPE, "route: num_experts %lld must be in [1, %d]", (long long)E, MOE8_MAX_EXPERTS);
  if (K <= 0 || K > E)
    return moe8__fail(MOE8_ERR_SHAPE, "route: top_k %lld must be in [1, num_experts = %lld]", (long long)K, (long long)E);
  if (cfg->score != MOE8_SCORE_SOFTMAX && cfg->score != MOE8_SCORE_SIGMOID && cfg->score != MOE8_SCORE_SQRTSOFTPLUS &&
      cfg->score != MOE8_SCORE_SPARSEMIXER)
    return moe8__fail(MOE8_ERR_INVALID_ARG, "route: unknown score function %d", (int)cfg->score);
  const bool hash = cfg->hash_table != NULL, smix = cfg->score == MOE8_SCORE_SPARSEMIXER;
  if (smix && (K != 2 || cfg->selection_bias || cfg->n_group > 1 || cfg->select_logits || hash || cfg->norm_topk_prob))
    return moe8__fail(MOE8_ERR_INVALID_ARG, "route: the sparsemixer router chooses 2 experts (top_k %lld) by its own rule: no selection "
                      "bias, groups, select_logits, hash table or norm_topk_prob with it", (long long)K);
  if (smix && !(cfg->jitter_eps >= 0.0f && cfg->jitter_eps < 1e30f))
    return moe8__fail(MOE8_ERR_INVALID_ARG, "route: the sparsemixer's jitter_eps %g must be finite and >= 0", (double)cfg->jitter_eps);
  if (hash && (cfg->hash_vocab <= 0 || (T > 0 && !cfg->token_ids)))
    return moe8__fail(MOE8_ERR_INVALID_ARG, "route: hash routing needs hash_vocab > 0 (not %lld) and the token ids", (long long)cfg->hash_vocab);
  if (hash && (cfg->selection_bias || cfg->n_group > 1 || cfg->select_logits))
    return moe8__fail(MOE8_ERR_INVALID_ARG, "route: hash routing takes its experts from the table: no selection bias, groups or "
                      "select_logits");
  if (!(cfg->norm_min >= 0.0f && cfg->norm_min < 1e30f) || !(cfg->norm_eps >= 0.0f && cfg->norm_eps < 1e30f))
    return moe8__fail(MOE8_ERR_INVALID_ARG, "route: norm_min %g and norm_eps %g must be in [0, 1e30)", (double)cfg->norm_min,
                      (double)cfg->norm_eps);
  const bool pnorm = cfg->norm_p != 0.0f && cfg->norm_p != 1.0f;
  if (pnorm && !(cfg->norm_p > 0.0f && cfg->norm_p < 1e30f))
    return moe8__fail(MOE8_ERR_INVALID_ARG, "route: norm_p %g must be 0 (the sum) or a positive finite p", (double)cfg->norm_p);
  if (pnorm && (cfg->norm_min != 0.0f || cfg->norm_eps != 0.0f))
    return moe8__fail(MOE8_ERR_INVALID_ARG, "route: norm_p %g with norm_min or norm_eps: the p-norm takes neither", (double)cfg->norm_p);
  if (T < 0) return moe8__fail(MOE8_ERR_SHAPE, "route: T = %lld", (long long)T);
  if (T > 0 && (!logits || !expert_ids || !weights)) return moe8__fail(MOE8_ERR_INVALID_ARG, "route: NULL buffer");
  size_t bad = 0;
  for (int64_t i = 0; i < T * E; i++) bad += !isfinite(logits[i]);
  if (bad) return moe8__fail(MOE8_ERR_NONFINITE, "route: %zu non-finite router logit(s) in [%lld, %lld]", bad,
                             (long long)T, (long long)E);
  if (cfg->selection_bias)
    for (int64_t e = 0; e < E; e++)
      if (!isfinite(cfg->selection_bias[e]))
        return moe8__fail(MOE8_ERR_NONFINITE, "route: selection_bias[%lld] is not finite", (long long)e);
  for (int64_t t = 0; hash && t < T; t++) {
    const int32_t id = cfg->token_ids[t];
    if (id < 0 || id >= cfg->hash_vocab)
      return moe8__fail(MOE8_ERR_INVALID_ARG, "route: token %lld has id %d, outside the hash table's [0, %lld)", (long long)t, (int)id,
                        (long long)cfg->hash_vocab);
    for (int64_t j = 0; j < K; j++) {
      const int32_t e = cfg->hash_table[(int64_t)id * K + j];
      if (e < 0 || e >= E)
        return moe8__fail(MOE8_ERR_INVALID_ARG, "route: hash table [%d, %lld] = %d is not an expert id in [0, %lld)", (int)id, (long long)j,
                          (int)e, (long long)E);
    }
  }
  const int64_t S = cfg->scored_shared; /* Inkling's router-scored shared experts: the last S */
  if (S < 0 || (S > 0 && (S >= K || cfg->n_group > 1 || hash)))
    return moe8__fail(MOE8_ERR_INVALID_ARG, "route: scored_shared = %lld must be 0, or in [1, top_k = %lld) without groups or hash routing",
                      (long long)S, (long long)K);
  const int64_t NG = cfg->n_group > 1 ? cfg->n_group : 1, KG = NG > 1 ? cfg->topk_group : 1;
  if (NG > 1 && (E % NG != 0 || E / NG < 2))
    return moe8__fail(MOE8_ERR_SHAPE, "route: n_group = %lld must divide num_experts = %lld into groups of at least 2", (long long)NG,
                      (long long)E);
  if (NG > 1 && (KG < 1 || KG > NG))
    return moe8__fail(MOE8_ERR_SHAPE, "route: topk_group = %lld must be in [1, n_group = %lld]", (long long)KG, (long long)NG);
  if (NG > 1 && K > KG * (E / NG))
    return moe8__fail(MOE8_ERR_SHAPE, "route: top_k = %lld exceeds the %lld experts of topk_group = %lld groups", (long long)K,
                      (long long)(KG * (E / NG)), (long long)KG);
  if (cfg->group_score != MOE8_GROUP_TOP2_SUM && cfg->group_score != MOE8_GROUP_MAX)
    return moe8__fail(MOE8_ERR_INVALID_ARG, "route: group_score %d is not a group score (top-2 sum 0, max 1)", (int)cfg->group_score);
  const float scale = cfg->routed_scaling_factor != 0.0f ? cfg->routed_scaling_factor : 1.0f;
  /* Per-token scratch lives on the stack: E is capped at MOE8_MAX_EXPERTS,
  ** so routing never allocates (the fused forward relies on that). */
  #pragma omp parallel for num_threads(moe8__nt(8.0 * (double)T * (double)E)) schedule(static)
  for (int64_t t = 0; t < T; t++) {
    float sbuf[MOE8_MAX_EXPERTS], sel[MOE8_MAX_EXPERTS];
    uint64_t taken[MOE8_MAX_EXPERTS / 64];
    const float *l = logits + t * E;
    float *sc = scores ? scores + t * E : sbuf;
    if (smix) { /* PhiMoE: its own choice and weights, then the scaling below */
      sparsemixer(l, E, 2.0f * cfg->jitter_eps, sc, expert_ids + t * K, weights + t * K);
      goto normalize;
    }
    if (cfg->score == MOE8_SCORE_SOFTMAX) {
      float m = l[0], sum = 0.0f;
      for (int64_t e = 1; e < E; e++) m = l[e] > m ? l[e] : m;
      for (int64_t e = 0; e < E; e++) { sc[e] = expf(l[e] - m); sum += sc[e]; }
      for (int64_t e = 0; e < E; e++) sc[e] /= sum;
    } else if (cfg->score == MOE8_SCORE_SQRTSOFTPLUS) {
      for (int64_t e = 0; e < E; e++) sc[e] = moe8__sqrt_softplus(l[e]);
    } else {
      for (int64_t e = 0; e < E; e++) sc[e] = 1.0f / (1.0f + expf(-l[e]));
    }
    if (hash) { /* DeepSeek-V4's hash layers: the table's row for the token, in order */
      const int32_t *row = cfg->hash_table + (int64_t)cfg->token_ids[t] * K;
      for (int64_t j = 0; j < K; j++) {
        expert_ids[t * K + j] = row[j];
        weights[t * K + j] = sc[row[j]];
      }
      goto normalize;
    }
    const float *sv = cfg->select_logits ? l : sc; /* Kolibri-1 selects by logit + bias */
    for (int64_t e = 0; e < E; e++) sel[e] = sv[e] + (cfg->selection_bias ? cfg->selection_bias[e] : 0.0f);
    if (NG > 1) {
      /* Group score: its best selection value plus its second best (or
      ** the best alone, MOE8_GROUP_MAX); the KG best groups stay, ties to
      ** the lower group; the others' experts get a selection value of -inf
      ** (0.0 with group_mask_zero, AXK2's). */
      const int64_t gs = E / NG;
      float gsc[MOE8_MAX_EXPERTS / 2];
      uint64_t keep[MOE8_MAX_EXPERTS / 128 + 1];
      for (int64_t g = 0; g < NG; g++) {
        float b1 = sel[g * gs], b2 = sel[g * gs + 1];
        if (b2 > b1) { const float tmp = b1; b1 = b2; b2 = tmp; }
        for (int64_t e = g * gs + 2; e < (g + 1) * gs; e++) {
          if (sel[e] > b1) { b2 = b1; b1 = sel[e]; }
          else if (sel[e] > b2) b2 = sel[e];
        }
        gsc[g] = cfg->group_score == MOE8_GROUP_MAX ? b1 : b1 + b2;
      }
      memset(keep, 0, sizeof keep);
      for (int64_t j = 0; j < KG; j++) {
        int64_t bg = -1;
        for (int64_t g = 0; g < NG; g++)
          if (!(keep[g >> 6] >> (g & 63) & 1) && (bg < 0 || gsc[g] > gsc[bg])) bg = g;
        keep[bg >> 6] |= 1ull << (bg & 63);
      }
      for (int64_t g = 0; g < NG; g++)
        if (!(keep[g >> 6] >> (g & 63) & 1))
          for (int64_t e = g * gs; e < (g + 1) * gs; e++) sel[e] = cfg->group_mask_zero ? 0.0f : -INFINITY; /* as DeepSeek's code and transformers */
    }
    memset(taken, 0, sizeof(uint64_t) * (size_t)((E + 63) / 64));
    for (int64_t j = K - S; j < K; j++) { /* the shared experts, in order, after the chosen ones */
      expert_ids[t * K + j] = (int32_t)(E - S + (j - (K - S)));
      weights[t * K + j] = sc[E - S + (j - (K - S))];
    }
    for (int64_t j = 0; j < K - S; j++) {
      int64_t best = -1;
      float bv = 0.0f;
      for (int64_t e = 0; e < E - S; e++) {
        if (taken[e >> 6] >> (e & 63) & 1) continue;
        const float v = sel[e];
        if (best < 0 || v > bv) { best = e; bv = v; } /* strict: ties keep the lower index */
      }
      taken[best >> 6] |= 1ull << (best & 63);
      expert_ids[t * K + j] = (int32_t)best;
      weights[t * K + j] = sc[best];
    }
  normalize:
    if (cfg->norm_topk_prob && pnorm) { /* DBRX: the p-norm (Σ w^p)^(1/p), j in order */
      float sp = 0.0f;
      for (int64_t j = 0; j < K; j++) sp += powf(weights[t * K + j], cfg->norm_p);
      const float nrm = powf(sp, 1.0f / cfg->norm_p);
      if (nrm > 0.0f)
        for (int64_t j = 0; j < K; j++) weights[t * K + j] /= nrm;
    } else if (cfg->norm_topk_prob) {
      float sum = 0.0f;
      for (int64_t j = 0; j < K; j++) sum += weights[t * K + j];
      sum += cfg->norm_eps;                         /* LFM2-MoE: Σ + 1e-6 */
      if (sum < cfg->norm_min) sum = cfg->norm_min; /* ERNIE-4.5: torch.clamp(min=norm_min) */
      if (sum > 0.0f)
        for (int64_t j = 0; j < K; j++) weights[t * K + j] /= sum;
    }
    if (scale != 1.0f)
      for (int64_t j = 0; j < K; j++) weights[t * K + j] *= scale;
  }
  return MOE8_OK;
}
