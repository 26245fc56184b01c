/*
** test_moe_ops.c — docs/layer.md: router, dispatch sort, gathers and
** combine, with the MoE edges: an expert with no tokens, all tokens on one
** expert, T = 0, T = 1, k = 1 and k = E.  The SwiGLU and router-logit
** kernels of every ISA give the reference's bytes.
*/
#include "testutil.h"
#include "core/internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

static void test_router_ties_and_options(void **state) {
  (void)state;
  /* Equal logits: softmax ties, lower index wins. */
  float logits[2 * 4] = {1, 1, 1, 1, 0, 3, 3, 1};
  int32_t ids[8];
  float w[8], sc[8];
  moe8_router_config cfg = {.num_experts = 4, .top_k = 2};
  assert_int_equal(moe8_route(&cfg, logits, 2, sc, ids, w), MOE8_OK);
  assert_int_equal(ids[0], 0); assert_int_equal(ids[1], 1);
  assert_int_equal(ids[2], 1); assert_int_equal(ids[3], 2);
  assert_true(fabsf(w[0] - 0.25f) < 1e-7f);
  float s = 0;
  for (int e = 0; e < 4; e++) s += sc[4 + e];
  assert_true(fabsf(s - 1.0f) < 1e-6f);
  /* Renormalization and scaling factor. */
  cfg.norm_topk_prob = true;
  cfg.routed_scaling_factor = 2.5f;
  assert_int_equal(moe8_route(&cfg, logits, 2, NULL, ids, w), MOE8_OK);
  assert_true(fabsf(w[0] + w[1] - 2.5f) < 1e-6f);
  assert_true(fabsf(w[2] - 1.25f) < 1e-6f);
  /* Sigmoid with a selection bias: the bias picks, the weight ignores it. */
  float bias[4] = {0, 0, 0, 10};
  moe8_router_config sg = {.num_experts = 4, .top_k = 1, .score = MOE8_SCORE_SIGMOID, .selection_bias = bias};
  assert_int_equal(moe8_route(&sg, logits, 2, NULL, ids, w), MOE8_OK);
  assert_int_equal(ids[0], 3);
  assert_true(w[0] == 1.0f / (1.0f + expf(-1.0f)));
  assert_int_equal(ids[1], 3);
  /* k = E selects every expert once, in decreasing score. */
  moe8_router_config all = {.num_experts = 4, .top_k = 4, .norm_topk_prob = true};
  assert_int_equal(moe8_route(&all, logits, 2, NULL, ids, w), MOE8_OK);
  int seen = 0;
  for (int j = 0; j < 4; j++) seen |= 1 << ids[4 + j];
  assert_int_equal(seen, 15);
  assert_int_equal(ids[4], 1); assert_int_equal(ids[5], 2); assert_int_equal(ids[6], 3); assert_int_equal(ids[7], 0);
  /* T = 0 is fine; bad configs are errors naming the value. */
  assert_int_equal(moe8_route(&cfg, NULL, 0, NULL, NULL, NULL), MOE8_OK);
  moe8_router_config bad = {.num_experts = 4, .top_k = 5};
  assert_int_equal(moe8_route(&bad, logits, 2, NULL, ids, w), MOE8_ERR_SHAPE);
  assert_non_null(strstr(moe8_last_error(), "top_k 5"));
  bad.top_k = 0;
  assert_int_equal(moe8_route(&bad, logits, 2, NULL, ids, w), MOE8_ERR_SHAPE);
  logits[3] = NAN;
  assert_int_equal(moe8_route(&cfg, logits, 2, NULL, ids, w), MOE8_ERR_NONFINITE);
  assert_non_null(strstr(moe8_last_error(), "1 non-finite"));
}

/* DeepSeek-V4's router: sqrt-softplus scores (torch's softplus: the logit
** itself above 20), the top-k of score + bias, the weights / (sum + 1e-20)
** times the scaling factor; and its hash routing: each token's experts are
** the table's row for its id (a repeated expert counts twice), weighted by
** their scores.  Bytes against a scalar reference written here, the
** scores also against float64, the epsilon visible where every chosen
** score is tiny; bad token ids and tables refused, naming them. */
static float ref_sqrt_softplus(float l) { return sqrtf(l > 20.0f ? l : log1pf(expf(l))); }

static void test_router_sqrt_softplus_and_hash(void **state) {
  (void)state;
  enum { T = 40, E = 16, K = 3, V = 7 };
  static float logits[T * E], sc[T * E], w[T * K], bias[E];
  static int32_t ids[T * K];
  tu_rng_reset(123);
  tu_fill_normal(logits, T * E, 4.0f);
  /* the edges: past torch's threshold and just below it, large negative (tiny scores), 0 */
  const float edge[12] = {20.0f, 20.0001f, 19.9999f, 25.0f, 88.0f, 300.0f, -20.0f, -60.0f, -103.0f, -120.0f, 0.0f, 1e-8f};
  memcpy(logits, edge, sizeof edge);
  for (int e = 0; e < E; e++) logits[E + e] = -100.0f - (float)e; /* token 1: every score below 1e-21 */
  tu_fill_normal(bias, E, 0.3f);
  moe8_router_config cfg = {.num_experts = E, .top_k = K, .score = MOE8_SCORE_SQRTSOFTPLUS, .norm_topk_prob = true,
                            .routed_scaling_factor = 1.5f, .selection_bias = bias, .norm_eps = 1e-20f};
  assert_int_equal(moe8_route(&cfg, logits, T, sc, ids, w), MOE8_OK);
  for (int i = 0; i < T * E; i++) {
    const float r = ref_sqrt_softplus(logits[i]);
    if (memcmp(&r, &sc[i], 4)) TU_FAIL("score of logit %g: %a, the reference %a", (double)logits[i], (double)sc[i], (double)r);
    const double l = logits[i], d = sqrt(l > 20.0 ? l : log1p(exp(l)));
    /* below -87 exp(l) is a subnormal float (torch's f32 softplus loses the same digits) */
    if (l > -87.0 && fabs(sc[i] - d) > 4e-7 * d) TU_FAIL("score of logit %g: %g, float64 %g", (double)logits[i], (double)sc[i], d);
  }
  assert_true(sc[3] == sqrtf(25.0f) && sc[0] == sqrtf(log1pf(expf(20.0f))));
  for (int t = 0; t < T; t++) {
    bool taken[E] = {false};
    int32_t rid[K];
    float sum = 0.0f;
    for (int j = 0; j < K; j++) {
      int be = -1;
      for (int e = 0; e < E; e++)
        if (!taken[e] && (be < 0 || sc[t * E + e] + bias[e] > sc[t * E + be] + bias[be])) be = e;
      taken[be] = true;
      rid[j] = be;
      sum += sc[t * E + be];
    }
    sum += 1e-20f;
    for (int j = 0; j < K; j++) {
      const float rw = sc[t * E + rid[j]] / sum * 1.5f;
      if (ids[t * K + j] != rid[j]) TU_FAIL("token %d slot %d: expert %d, the reference %d", t, j, ids[t * K + j], rid[j]);
      if (memcmp(&rw, &w[t * K + j], 4)) TU_FAIL("token %d slot %d: weight %a, the reference %a", t, j, (double)w[t * K + j], (double)rw);
    }
  }
  /* the epsilon: token 1's scores sum to about 1e-21, so its weights sum well below the scaling factor */
  assert_true(w[K] + w[K + 1] + w[K + 2] < 0.5f);
  /* hash routing: the table's rows, in order, repeats kept */
  static int32_t table[V * K], tok[T];
  for (int i = 0; i < V * K; i++) table[i] = (int32_t)(tu_u64() % E);
  table[1] = table[0];                /* row 0: an expert twice */
  table[V * K - 1] = E - 1;           /* the last expert, in the last row */
  for (int t = 0; t < T; t++) tok[t] = (int32_t)(tu_u64() % V);
  tok[0] = 0; tok[2] = V - 1; tok[1] = 0;
  moe8_router_config h = {.num_experts = E, .top_k = K, .score = MOE8_SCORE_SQRTSOFTPLUS, .norm_topk_prob = true,
                          .routed_scaling_factor = 1.5f, .norm_eps = 1e-20f, .hash_table = table, .hash_vocab = V, .token_ids = tok};
  assert_int_equal(moe8_route(&h, logits, T, sc, ids, w), MOE8_OK);
  for (int t = 0; t < T; t++) {
    float sum = 0.0f;
    for (int j = 0; j < K; j++) sum += sc[t * E + table[tok[t] * K + j]];
    sum += 1e-20f;
    for (int j = 0; j < K; j++) {
      const int32_t e = table[tok[t] * K + j];
      const float rw = sc[t * E + e] / sum * 1.5f;
      if (ids[t * K + j] != e) TU_FAIL("hash token %d slot %d: expert %d, the table's %d", t, j, ids[t * K + j], e);
      if (memcmp(&rw, &w[t * K + j], 4)) TU_FAIL("hash token %d slot %d: weight %a, the reference %a", t, j, (double)w[t * K + j], (double)rw);
    }
  }
  assert_int_equal(ids[0], ids[1]);
  /* the same with sigmoid scores (scoring_func sigmoid) */
  h.score = MOE8_SCORE_SIGMOID;
  assert_int_equal(moe8_route(&h, logits, T, sc, ids, w), MOE8_OK);
  assert_true(sc[5] == 1.0f / (1.0f + expf(-logits[5])));
  h.score = MOE8_SCORE_SQRTSOFTPLUS;
  /* refusals, naming the token, the element or the combination */
  tok[2] = V;
  assert_int_equal(moe8_route(&h, logits, T, sc, ids, w), MOE8_ERR_INVALID_ARG);
  assert_non_null(strstr(moe8_last_error(), "token 2 has id 7, outside the hash table's [0, 7)"));
  tok[2] = -1;
  assert_int_equal(moe8_route(&h, logits, T, sc, ids, w), MOE8_ERR_INVALID_ARG);
  assert_non_null(strstr(moe8_last_error(), "token 2 has id -1"));
  tok[2] = 1;
  table[1 * K + 2] = E;
  assert_int_equal(moe8_route(&h, logits, T, sc, ids, w), MOE8_ERR_INVALID_ARG);
  assert_non_null(strstr(moe8_last_error(), "hash table [1, 2] = 16 is not an expert id"));
  table[1 * K + 2] = 0;
  h.token_ids = NULL;
  assert_int_equal(moe8_route(&h, logits, T, sc, ids, w), MOE8_ERR_INVALID_ARG);
  assert_non_null(strstr(moe8_last_error(), "token ids"));
  h.token_ids = tok;
  h.selection_bias = bias;
  assert_int_equal(moe8_route(&h, logits, T, sc, ids, w), MOE8_ERR_INVALID_ARG);
  assert_non_null(strstr(moe8_last_error(), "no selection bias"));
  h.selection_bias = NULL;
  assert_int_equal(moe8_route(&h, logits, T, sc, ids, w), MOE8_OK);
  moe8_router_config bad = cfg;
  bad.score = (moe8_score_func)4;
  assert_int_equal(moe8_route(&bad, logits, T, sc, ids, w), MOE8_ERR_INVALID_ARG);
  assert_non_null(strstr(moe8_last_error(), "unknown score function 4"));
}

/* DeepSeek-V3's group-limited top-k: E = 64 in 8 groups, the best 4
** groups by the sum of their two best (score + bias), then the top 8 of
** those (the dropped groups' selection values are -inf, as DeepSeek's own
** inference code and transformers do).  Checked against a direct
** implementation here, with small biases and with realistic negative ones
** (-1.5 ± 0.2: score + bias < 0, where masking with 0.0 would pick
** experts of dropped groups), and it must pick other experts than plain
** top-k for most tokens (else the test proves nothing). */
static void test_router_group_limited(void **state) {
  (void)state;
  enum { T = 64, E = 64, NG = 8, KG = 4, K = 8, GS = E / NG };
  float *logits = malloc(sizeof(float) * T * E), bias[E], w[T * K], wp[T * K], sc[T * E];
  int32_t ids[T * K], idp[T * K];
  moe8_router_config cfg = {.num_experts = E, .top_k = K, .score = MOE8_SCORE_SIGMOID, .norm_topk_prob = true,
                            .routed_scaling_factor = 2.5f, .selection_bias = bias, .n_group = NG, .topk_group = KG};
  for (int bias_kind = 0; bias_kind < 2; bias_kind++) {
  tu_rng_reset(99);
  tu_fill_normal(logits, (size_t)(T * E), 1.5f);
  tu_fill_normal(bias, E, bias_kind ? 0.2f : 0.1f);
  if (bias_kind)
    for (int e = 0; e < E; e++) bias[e] -= 1.5f;
  assert_int_equal(moe8_route(&cfg, logits, T, sc, ids, w), MOE8_OK);
  moe8_router_config plain = cfg;
  plain.n_group = 0;
  assert_int_equal(moe8_route(&plain, logits, T, NULL, idp, wp), MOE8_OK);
  int differ = 0;
  for (int t = 0; t < T; t++) {
    /* the reference */
    float sel[E], gsc[NG];
    bool keep[NG] = {false}, taken[E] = {false};
    for (int e = 0; e < E; e++) sel[e] = sc[t * E + e] + bias[e];
    for (int g = 0; g < NG; g++) {
      float b1 = -INFINITY, b2 = -INFINITY;
      for (int e = g * GS; e < (g + 1) * GS; e++) {
        if (sel[e] > b1) { b2 = b1; b1 = sel[e]; } else if (sel[e] > b2) b2 = sel[e];
      }
      gsc[g] = b1 + b2;
    }
    for (int j = 0; j < KG; j++) {
      int bg = -1;
      for (int g = 0; g < NG; g++) if (!keep[g] && (bg < 0 || gsc[g] > gsc[bg])) bg = g;
      keep[bg] = true;
    }
    float sum = 0.0f;
    int32_t rid[K];
    for (int j = 0; j < K; j++) {
      int be = -1;
      for (int e = 0; e < E; e++) {
        const float v = keep[e / GS] ? sel[e] : -INFINITY;
        if (!taken[e] && (be < 0 || v > (keep[be / GS] ? sel[be] : -INFINITY))) be = e;
      }
      taken[be] = true;
      rid[j] = be;
      sum += sc[t * E + be];
    }
    for (int j = 0; j < K; j++) {
      if (ids[t * K + j] != rid[j]) TU_FAIL("token %d slot %d: expert %d, the reference picks %d", t, j, ids[t * K + j], rid[j]);
      const float ref = sc[t * E + rid[j]] / sum * 2.5f;
      if (fabsf(w[t * K + j] - ref) > 1e-6f * ref) TU_FAIL("token %d slot %d: weight %g vs %g", t, j, (double)w[t * K + j], (double)ref);
      if (!keep[ids[t * K + j] / GS]) TU_FAIL("token %d: expert %d from a dropped group", t, ids[t * K + j]);
    }
    uint64_t a = 0, b = 0;
    for (int j = 0; j < K; j++) { a |= 1ull << ids[t * K + j]; b |= 1ull << idp[t * K + j]; }
    differ += a != b;
  }
  if (differ < T / 2) TU_FAIL("group-limited and plain top-k differ for only %d of %d tokens", differ, T);
  }
  /* Bad group configs name the key. */
  moe8_router_config bad = cfg;
  bad.n_group = 5;
  assert_int_equal(moe8_route(&bad, logits, T, NULL, ids, w), MOE8_ERR_SHAPE);
  assert_non_null(strstr(moe8_last_error(), "n_group"));
  bad = cfg;
  bad.topk_group = 1;
  bad.top_k = 9;
  assert_int_equal(moe8_route(&bad, logits, T, NULL, ids, w), MOE8_ERR_SHAPE);
  assert_non_null(strstr(moe8_last_error(), "top_k"));
  free(logits);
}

static void test_router_logits(void **state) {
  (void)state;
  const int64_t T = 5, D = 37, E = 6;
  float x[5 * 37], wr[37 * 6], l[30], l1[6];
  tu_rng_reset(8);
  tu_fill_normal(x, T * D, 1);
  tu_fill_normal(wr, D * E, 1);
  assert_int_equal(moe8_router_logits(x, wr, T, D, E, l), MOE8_OK);
  for (int64_t t = 0; t < T; t++)
    for (int64_t e = 0; e < E; e++) {
      double s = 0;
      for (int64_t d = 0; d < D; d++) s += (double)x[t * D + d] * wr[d * E + e];
      assert_true(fabs(l[t * E + e] - s) < 1e-5);
    }
  /* Batch invariance: token 3 alone gives the same bytes. */
  assert_int_equal(moe8_router_logits(x + 3 * D, wr, 1, D, E, l1), MOE8_OK);
  assert_memory_equal(l1, l + 3 * E, E * 4);
}

/* Router logits on every ISA: the reference's bytes for E around the
** vector width, T around the token block, odd D. */
static void test_router_logits_isas(void **state) {
  (void)state;
  static const int64_t Es[] = {1, 7, 8, 15, 16, 17, 64}, Ts[] = {0, 1, 7, 8, 9, 70}, Ds[] = {1, 33, 200};
  moe8_isa isas[MOE8_ISA_COUNT];
  const int nisa = tu_isas(isas);
  for (size_t ei = 0; ei < sizeof Es / sizeof Es[0]; ei++)
    for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++)
      for (size_t di = 0; di < sizeof Ds / sizeof Ds[0]; di++) {
        const int64_t E = Es[ei], T = Ts[ti], D = Ds[di];
        float *x = malloc(sizeof(float) * (size_t)(T * D + 1)), *wr = malloc(sizeof(float) * (size_t)(D * E));
        float *want = malloc(sizeof(float) * (size_t)(T * E + 1)), *got = malloc(sizeof(float) * (size_t)(T * E + 1));
        tu_rng_reset((uint64_t)(E * 1000 + T * 10 + D));
        tu_fill_normal(x, (size_t)(T * D), 3);
        tu_fill_normal(wr, (size_t)(D * E), 0.5f);
        assert_int_equal(moe8_isa_set(MOE8_ISA_REF), MOE8_OK);
        assert_int_equal(moe8_router_logits(x, wr, T, D, E, want), MOE8_OK);
        for (int i = 1; i < nisa; i++) {
          assert_int_equal(moe8_isa_set(isas[i]), MOE8_OK);
          memset(got, 0xFF, sizeof(float) * (size_t)(T * E));
          assert_int_equal(moe8_router_logits(x, wr, T, D, E, got), MOE8_OK);
          if (memcmp(got, want, sizeof(float) * (size_t)(T * E)) != 0)
            TU_FAIL("router logits on %s differ from ref (T=%lld D=%lld E=%lld)", moe8_isa_name(isas[i]), (long long)T,
                    (long long)D, (long long)E);
        }
        free(x); free(wr); free(want); free(got);
      }
  moe8_isa_set(tu_isa_best());
}

/* SwiGLU on every ISA: the reference's bytes for g over a stride through
** all 2^32 bit patterns (every exponent, ±0, subnormals, ±inf, the
** clamp region of exp) and u = 1, then random g and u with tails; the
** clamped form (GPT-OSS) on the same g with u over the bit patterns. */
static void test_swiglu_isas(void **state) {
  (void)state;
  moe8_isa isas[MOE8_ISA_COUNT];
  const int nisa = tu_isas(isas);
  enum { N = 1 << 16 };
  float *g = malloc(sizeof(float) * N), *u = malloc(sizeof(float) * N), *want = malloc(sizeof(float) * N),
        *got = malloc(sizeof(float) * N);
  const moe8__ktable *ref = moe8__kernels_for(MOE8_ISA_REF);
  const uint64_t stride = tu_exhaustive() ? 61 : 6007;
  uint64_t bits = 0;
  for (int round = 0; bits < ((uint64_t)1 << 32); round++) {
    size_t n = 0;
    for (; n < N && bits < ((uint64_t)1 << 32); n++, bits += stride) {
      g[n] = moe8__bits_f32((uint32_t)bits); /* NaN is not an input of the layer's SwiGLU (inputs are checked) */
      if (isnan(g[n])) g[n] = 0.0f;
      u[n] = 1.0f;
    }
    if (round % 7 == 0) /* random operands, any length (tails) */
      for (size_t i = 0; i < n; i++) { g[i] = tu_normal() * 6.0f; u[i] = tu_normal(); }
    ref->swiglu(want, g, u, n);
    for (int i = 1; i < nisa; i++) {
      const size_t len = round % 3 == 0 ? n - (size_t)(round % 16) : n;
      memset(got, 0, sizeof(float) * N);
      moe8__kernels_for(isas[i])->swiglu(got, g, u, len);
      for (size_t j = 0; j < len; j++)
        if (moe8__f32_bits(got[j]) != moe8__f32_bits(want[j]))
          TU_FAIL("swiglu on %s: g = %a (0x%08x), u = %a: %a, want %a", moe8_isa_name(isas[i]), (double)g[j],
                  moe8__f32_bits(g[j]), (double)u[j], (double)got[j], (double)want[j]);
    }
    /* GPT-OSS's clamped form, g and u over the bit patterns (NaN and inf
    ** included: an overflowing gate product is a NaN g).  The clamps are
    ** torch.clamp's: a NaN g or u gives a NaN h, never the limit's value;
    ** every ISA gives the reference's bytes (a NaN where it gives a NaN). */
    for (size_t j = 0; j < n; j++) u[j] = moe8__bits_f32((uint32_t)(j * 2654435761u + (uint32_t)round * 40503u));
    if (round % 7 != 0)
      for (size_t j = 0; j < n; j++) g[j] = moe8__bits_f32((uint32_t)(bits - (n - j) * stride));
    if (round % 5 == 1) g[0] = NAN;
    if (round % 5 == 2) for (size_t j = 0; j < n; j += 3) g[j] = (float)INFINITY - (float)INFINITY; /* +inf + -inf */
    const float limit = round % 2 ? 7.0f : 1.5f;
    ref->swiglu_clamp(want, g, u, n, 1.702f, limit);
    for (size_t j = 0; j < n; j++)
      if ((isnan(g[j]) || isnan(u[j])) && !isnan(want[j]))
        TU_FAIL("swiglu_clamp (reference): g = %a (0x%08x), u = %a: %a, want NaN", (double)g[j], moe8__f32_bits(g[j]), (double)u[j],
                (double)want[j]);
    for (int i = 1; i < nisa; i++) {
      const size_t len = round % 3 == 0 ? n - (size_t)(round % 16) : n;
      memset(got, 0, sizeof(float) * N);
      moe8__kernels_for(isas[i])->swiglu_clamp(got, g, u, len, 1.702f, limit);
      for (size_t j = 0; j < len; j++)
        if (moe8__f32_bits(got[j]) != moe8__f32_bits(want[j]) && !(isnan(got[j]) && isnan(want[j])))
          TU_FAIL("swiglu_clamp on %s: g = %a (0x%08x), u = %a (0x%08x): %a (0x%08x), want %a (0x%08x)", moe8_isa_name(isas[i]),
                  (double)g[j], moe8__f32_bits(g[j]), (double)u[j], moe8__f32_bits(u[j]), (double)got[j], moe8__f32_bits(got[j]),
                  (double)want[j], moe8__f32_bits(want[j]));
    }
    /* The limited form (GLM-5, HY-V4) on the same operands: the reference
    ** is the plain SwiGLU of the clamped g and u, byte for byte (a NaN kept
    ** as above), and every ISA gives the reference's bytes.  Where g and u
    ** are both NaN, which one's payload the product keeps is the
    ** compiler's operand order: any NaN is the answer there (and above). */
    ref->swiglu_limit(want, g, u, n, limit);
    for (size_t j = 0; j < n; j++) {
      const float gc = g[j] > limit ? limit : g[j], uc = u[j] < -limit ? -limit : u[j] > limit ? limit : u[j];
      float plain;
      ref->swiglu(&plain, &gc, &uc, 1);
      if ((isnan(g[j]) || isnan(u[j])) ? !isnan(want[j]) : moe8__f32_bits(want[j]) != moe8__f32_bits(plain))
        TU_FAIL("swiglu_limit (reference): g = %a (0x%08x), u = %a: %a, want %a", (double)g[j], moe8__f32_bits(g[j]), (double)u[j],
                (double)want[j], (double)plain);
    }
    for (int i = 1; i < nisa; i++) {
      const size_t len = round % 3 == 0 ? n - (size_t)(round % 16) : n;
      memset(got, 0, sizeof(float) * N);
      moe8__kernels_for(isas[i])->swiglu_limit(got, g, u, len, limit);
      for (size_t j = 0; j < len; j++)
        if (moe8__f32_bits(got[j]) != moe8__f32_bits(want[j]) && !(isnan(got[j]) && isnan(want[j])))
          TU_FAIL("swiglu_limit on %s: g = %a (0x%08x), u = %a (0x%08x): %a (0x%08x), want %a (0x%08x)", moe8_isa_name(isas[i]),
                  (double)g[j], moe8__f32_bits(g[j]), (double)u[j], moe8__f32_bits(u[j]), (double)got[j], moe8__f32_bits(got[j]),
                  (double)want[j], moe8__f32_bits(want[j]));
    }
    /* Clamped after the activation (Step): the reference is min(silu(g),
    ** L) · clamp(u, ±L) with the plain SwiGLU's silu (its bytes at u = 1),
    ** a NaN kept; at L = +inf it is the plain SwiGLU's bytes; every ISA
    ** gives the reference's bytes. */
    for (int inf = 0; inf < 2; inf++) {
      const float pl = inf ? (float)INFINITY : limit;
      ref->swiglu_post(want, g, u, n, pl);
      for (size_t j = 0; j < n; j++) {
        const float one = 1.0f;
        float sv, plain;
        ref->swiglu(&sv, &g[j], &one, 1);
        const float sc = sv > pl ? pl : sv, uc = u[j] < -pl ? -pl : u[j] > pl ? pl : u[j], expect = sc * uc;
        ref->swiglu(&plain, &g[j], &u[j], 1);
        if ((isnan(g[j]) || isnan(u[j])) ? !isnan(want[j]) : moe8__f32_bits(want[j]) != moe8__f32_bits(inf ? plain : expect))
          TU_FAIL("swiglu_post (reference, limit %g): g = %a (0x%08x), u = %a: %a, want %a", (double)pl, (double)g[j],
                  moe8__f32_bits(g[j]), (double)u[j], (double)want[j], (double)(inf ? plain : expect));
      }
      for (int i = 1; i < nisa; i++) {
        const size_t len = round % 3 == 0 ? n - (size_t)(round % 16) : n;
        memset(got, 0, sizeof(float) * N);
        moe8__kernels_for(isas[i])->swiglu_post(got, g, u, len, pl);
        for (size_t j = 0; j < len; j++)
          if (moe8__f32_bits(got[j]) != moe8__f32_bits(want[j]) && !(isnan(got[j]) && isnan(want[j])))
            TU_FAIL("swiglu_post on %s (limit %g): g = %a (0x%08x), u = %a (0x%08x): %a (0x%08x), want %a (0x%08x)",
                    moe8_isa_name(isas[i]), (double)pl, (double)g[j], moe8__f32_bits(g[j]), (double)u[j], moe8__f32_bits(u[j]),
                    (double)got[j], moe8__f32_bits(got[j]), (double)want[j], moe8__f32_bits(want[j]));
      }
    }
  }
  free(g); free(u); free(want); free(got);
}

/* Inkling-2's softcapped SwiGLU: moe8__tanhf within 4 ulp-ish of tanh
** (relative 1e-6, both sides of its 0.5 switch, the sign, saturation, a
** NaN kept); the reference is (cg·tanh(g/cg))·sigmoid(g)·(cu·tanh(u/cu))
** of it, within 2e-6 of the double formula where finite; every ISA gives
** the reference's bytes, tails included. */
static void test_swiglu_softcap(void **state) {
  (void)state;
  for (int i = -200000; i <= 200000; i++) {
    const float y = (float)i * 1e-4f * (i % 3 == 0 ? 1.0f : 0.37f);
    const double w = tanh((double)y), t = moe8__tanhf(y);
    if (fabs(t - w) > 1e-6 * fabs(w) + 1e-30)
      TU_FAIL("moe8__tanhf(%a) = %a, tanh %a", (double)y, t, w);
  }
  assert_true(moe8__tanhf(1e30f) == 1.0f && moe8__tanhf(-1e30f) == -1.0f && isnan(moe8__tanhf(NAN)));
  assert_true(moe8__f32_bits(moe8__tanhf(-0.0f)) == 0x80000000u && moe8__tanhf(0.0f) == 0.0f);
  enum { N = 1000 };
  static float g[N], u[N], want[N], got[N];
  const moe8__ktable *ref = moe8__kernels_for(MOE8_ISA_REF);
  moe8_isa isas[MOE8_ISA_COUNT];
  const int nisa = tu_isas(isas);
  for (int round = 0; round < 8; round++) {
    tu_rng_reset(500 + (uint64_t)round);
    tu_fill_normal(g, N, round < 4 ? 3.0f : 40.0f);
    tu_fill_normal(u, N, round < 4 ? 10.0f : 200.0f);
    if (round == 5) { g[3] = NAN; u[7] = NAN; g[9] = (float)INFINITY; u[11] = -(float)INFINITY; }
    const float cg = round % 2 ? 4.0f : 1.5f, cu = round % 2 ? 25.0f : 3.0f;
    ref->swiglu_softcap(want, g, u, N, cg, cu);
    for (int j = 0; j < N; j++) {
      const double sg = 1.0 / (1.0 + exp(-(double)g[j]));
      const double e = cg * tanh((double)g[j] / cg) * sg * cu * tanh((double)u[j] / cu);
      if (isnan(g[j]) || isnan(u[j])) { if (!isnan(want[j])) TU_FAIL("swiglu_softcap: NaN input, %a", (double)want[j]); continue; }
      if (!(fabs(want[j] - e) <= 2e-6 * (fabs(e) + 1e-3 * cg * cu)))
        TU_FAIL("swiglu_softcap (reference): g = %a, u = %a: %a, want %a", (double)g[j], (double)u[j], (double)want[j], e);
    }
    for (int i = 1; i < nisa; i++) {
      const size_t len = N - (size_t)(round * 3);
      memset(got, 0, sizeof got);
      moe8__kernels_for(isas[i])->swiglu_softcap(got, g, u, len, cg, cu);
      for (size_t j = 0; j < len; j++)
        if (moe8__f32_bits(got[j]) != moe8__f32_bits(want[j]) && !(isnan(got[j]) && isnan(want[j])))
          TU_FAIL("swiglu_softcap on %s: g = %a, u = %a: %a (0x%08x), want %a (0x%08x)", moe8_isa_name(isas[i]), (double)g[j],
                  (double)u[j], (double)got[j], moe8__f32_bits(got[j]), (double)want[j], moe8__f32_bits(want[j]));
      for (size_t j = len; j < N; j++) assert_true(got[j] == 0.0f); /* nothing past n */
    }
  }
}

/* Gemma-4's GeGLU (gelu_pytorch_tanh(g) · u): the reference within 2e-6
** (relative) of the double formula, plus 1e-6 · |g·u| where 1 + tanh
** cancels, a NaN kept; every ISA gives the reference's bytes, tails
** included. */
static void test_geglu(void **state) {
  (void)state;
  enum { N = 1000 };
  static float g[N], u[N], want[N], got[N];
  const moe8__ktable *ref = moe8__kernels_for(MOE8_ISA_REF);
  moe8_isa isas[MOE8_ISA_COUNT];
  const int nisa = tu_isas(isas);
  for (int round = 0; round < 8; round++) {
    tu_rng_reset(600 + (uint64_t)round);
    tu_fill_normal(g, N, round < 4 ? 2.0f : 30.0f);
    tu_fill_normal(u, N, round < 4 ? 1.0f : 100.0f);
    if (round == 5) { g[3] = NAN; u[7] = NAN; g[9] = 1e30f; g[10] = -1e30f; }
    ref->geglu(want, g, u, N);
    for (int j = 0; j < N; j++) {
      const double x = g[j], e = 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))) * (double)u[j];
      if (isnan(g[j]) || isnan(u[j])) { if (!isnan(want[j])) TU_FAIL("geglu: NaN input, %a", (double)want[j]); continue; }
      if (fabs(x) > 1e10) continue; /* g³ overflows f32: the reference's h is ±inf or NaN there, as torch's f32 is */
      /* near g << 0, 1 + tanh cancels: tanh's few ulp become an absolute error of about |g·u| · 1e-7 */
      if (!(fabs(want[j] - e) <= 2e-6 * fabs(e) + 1e-6 * fabs(x * (double)u[j])))
        TU_FAIL("geglu (reference): g = %a, u = %a: %a, want %a", (double)g[j], (double)u[j], (double)want[j], e);
    }
    for (int i = 1; i < nisa; i++) {
      const size_t len = N - (size_t)(round * 3);
      memset(got, 0, sizeof got);
      moe8__kernels_for(isas[i])->geglu(got, g, u, len);
      for (size_t j = 0; j < len; j++)
        if (moe8__f32_bits(got[j]) != moe8__f32_bits(want[j]) && !(isnan(got[j]) && isnan(want[j])))
          TU_FAIL("geglu on %s: g = %a, u = %a: %a (0x%08x), want %a (0x%08x)", moe8_isa_name(isas[i]), (double)g[j], (double)u[j],
                  (double)got[j], moe8__f32_bits(got[j]), (double)want[j], moe8__f32_bits(want[j]));
      for (size_t j = len; j < N; j++) assert_true(got[j] == 0.0f); /* nothing past n */
    }
  }
}

/* The ungated experts' activations (Nemotron-H's relu2, and relu): the
** reference is r = u < 0 ? 0 : u (a NaN and -0 kept, as torch.relu keeps
** them), h = r·r or r, exactly; every ISA gives its bytes, tails included. */
static void test_relu_acts(void **state) {
  (void)state;
  enum { N = 1000 };
  static float u[N], want[N], got[N];
  const moe8__ktable *ref = moe8__kernels_for(MOE8_ISA_REF);
  moe8_isa isas[MOE8_ISA_COUNT];
  const int nisa = tu_isas(isas);
  for (int sq = 0; sq < 2; sq++)
    for (int round = 0; round < 6; round++) {
      tu_rng_reset(900 + (uint64_t)round);
      tu_fill_normal(u, N, round < 3 ? 3.0f : 1e19f);
      u[5] = NAN; u[6] = -0.0f; u[7] = 0.0f; u[8] = (float)INFINITY; u[9] = -(float)INFINITY; u[10] = 0x1p-149f; u[11] = -0x1p-149f;
      (sq ? ref->relu2 : ref->relu)(want, u, N);
      for (int j = 0; j < N; j++) {
        const double r = u[j] < 0 ? 0.0 : (double)u[j], e = sq ? (double)(float)(r * r) : r;
        if (isnan(u[j])) { if (!isnan(want[j])) TU_FAIL("relu%s: NaN input gave %a", sq ? "2" : "", (double)want[j]); continue; }
        if (moe8__f32_bits(want[j]) != moe8__f32_bits((float)e))
          TU_FAIL("relu%s (reference): u = %a: %a, want %a", sq ? "2" : "", (double)u[j], (double)want[j], e);
      }
      assert_true(moe8__f32_bits(want[6]) == (sq ? 0u : 0x80000000u)); /* relu(-0) = -0, squared +0 */
      for (int i = 1; i < nisa; i++) {
        const size_t len = N - (size_t)(round * 3 + sq);
        memset(got, 0, sizeof got);
        (sq ? moe8__kernels_for(isas[i])->relu2 : moe8__kernels_for(isas[i])->relu)(got, u, len);
        for (size_t j = 0; j < len; j++)
          if (moe8__f32_bits(got[j]) != moe8__f32_bits(want[j]) && !(isnan(got[j]) && isnan(want[j])))
            TU_FAIL("relu%s on %s: u = %a: %a (0x%08x), want %a (0x%08x)", sq ? "2" : "", moe8_isa_name(isas[i]), (double)u[j],
                    (double)got[j], moe8__f32_bits(got[j]), (double)want[j], moe8__f32_bits(want[j]));
        for (size_t j = len; j < N; j++) assert_true(got[j] == 0.0f); /* nothing past n */
      }
    }
}

static void test_dispatch_sort(void **state) {
  (void)state;
  /* T = 4, k = 2, E = 4; expert 2 gets nothing. */
  const int32_t ids[8] = {3, 0, 0, 1, 3, 0, 1, 3};
  int32_t tok[8], slot[8], gsz[4], pos[8];
  int64_t offs[5];
  moe8_dispatch d = {tok, slot, gsz, offs, pos, 0};
  assert_int_equal(moe8_dispatch_sort(ids, 4, 2, 4, 0.0f, &d), MOE8_OK);
  const int32_t want_gs[4] = {3, 2, 0, 3};
  assert_memory_equal(gsz, want_gs, sizeof want_gs);
  assert_int_equal(d.num_rows, 8);
  /* Stable: expert 0 rows are assignments 1, 2, 5 in that order. */
  const int32_t want_tok[8] = {0, 1, 2, 1, 3, 0, 2, 3};
  const int32_t want_slot[8] = {1, 0, 1, 1, 0, 0, 0, 1};
  assert_memory_equal(tok, want_tok, sizeof want_tok);
  assert_memory_equal(slot, want_slot, sizeof want_slot);
  for (int a = 0; a < 8; a++) {
    assert_int_equal(tok[pos[a]], a / 2);
    assert_int_equal(slot[pos[a]], a % 2);
  }
  assert_int_equal(offs[4], 8);
  /* Capacity 1.0: cap = ceil(8/4) = 2 per expert; the third of expert 0 and 3 drop. */
  assert_int_equal(moe8_dispatch_sort(ids, 4, 2, 4, 1.0f, &d), MOE8_OK);
  assert_int_equal(d.num_rows, 6);
  assert_int_equal(pos[5], -1); /* third assignment to expert 0 */
  assert_int_equal(pos[7], -1); /* third assignment to expert 3 */
  assert_true(pos[0] >= 0 && pos[1] >= 0);
  /* All tokens on one expert; T = 1; T = 0. */
  const int32_t one[6] = {2, 2, 2, 2, 2, 2};
  assert_int_equal(moe8_dispatch_sort(one, 6, 1, 4, 0.0f, &d), MOE8_OK);
  assert_int_equal(gsz[2], 6);
  assert_int_equal(offs[2], 0);
  assert_int_equal(offs[3], 6);
  assert_int_equal(moe8_dispatch_sort(one, 1, 1, 4, 0.0f, &d), MOE8_OK);
  assert_int_equal(d.num_rows, 1);
  assert_int_equal(moe8_dispatch_sort(NULL, 0, 2, 4, 0.0f, &d), MOE8_OK);
  assert_int_equal(d.num_rows, 0);
  /* An id out of range names the assignment. */
  const int32_t badids[2] = {1, 7};
  assert_int_equal(moe8_dispatch_sort(badids, 1, 2, 4, 0.0f, &d), MOE8_ERR_SHAPE);
  assert_non_null(strstr(moe8_last_error(), "expert_ids[1]"));
  /* A random large case: stability and inverse map. */
  enum { T = 1000, K = 3, E = 16 };
  int32_t *r = malloc(T * K * 4), *t2 = malloc(T * K * 4), *s2 = malloc(T * K * 4), *p2 = malloc(T * K * 4);
  int32_t g2[E];
  int64_t o2[E + 1];
  tu_rng_reset(12);
  for (int a = 0; a < T * K; a++) r[a] = (int32_t)(tu_u64() % E);
  moe8_dispatch d2 = {t2, s2, g2, o2, p2, 0};
  assert_int_equal(moe8_dispatch_sort(r, T, K, E, 0.0f, &d2), MOE8_OK);
  for (int e = 0; e < E; e++)
    for (int64_t p = o2[e]; p < o2[e + 1]; p++) {
      const int a = t2[p] * K + s2[p];
      assert_int_equal(r[a], e);
      assert_int_equal(p2[a], p);
      if (p > o2[e]) assert_true(t2[p - 1] * K + s2[p - 1] < a); /* stable */
    }
  free(r); free(t2); free(s2); free(p2);
}

static void test_gather_scale_rule(void **state) {
  (void)state;
  enum { T = 6, K = 10 };
  uint8_t q[T * K], gq[4 * K];
  float s_row[T], s_tile[T * 3], s_tensor[1] = {0.5f}, s_chan[K], gs[4 * K];
  for (int i = 0; i < T * K; i++) q[i] = (uint8_t)i;
  for (int i = 0; i < T; i++) s_row[i] = (float)i;
  for (int i = 0; i < T * 3; i++) s_tile[i] = (float)(100 + i);
  for (int i = 0; i < K; i++) s_chan[i] = (float)(200 + i);
  const int32_t idx[4] = {5, 0, 5, 2};
  bool gathered;
  /* per-token */
  assert_int_equal(moe8_gather_qrows(gq, gs, &gathered, q, s_row, T, K, T, 1, idx, 4), MOE8_OK);
  assert_true(gathered);
  for (int p = 0; p < 4; p++) {
    assert_memory_equal(gq + p * K, q + idx[p] * K, K);
    assert_true(gs[p] == s_row[idx[p]]);
  }
  /* per-token tiled */
  assert_int_equal(moe8_gather_qrows(gq, gs, &gathered, q, s_tile, T, K, T, 3, idx, 4), MOE8_OK);
  assert_true(gathered);
  for (int p = 0; p < 4; p++) assert_memory_equal(gs + p * 3, s_tile + idx[p] * 3, 12);
  /* per-tensor passes through */
  assert_int_equal(moe8_gather_qrows(gq, gs, &gathered, q, s_tensor, T, K, 1, 1, idx, 4), MOE8_OK);
  assert_false(gathered);
  assert_true(gs[0] == 0.5f);
  /* per-channel passes through */
  assert_int_equal(moe8_gather_qrows(gq, gs, &gathered, q, s_chan, T, K, 1, K, idx, 4), MOE8_OK);
  assert_false(gathered);
  assert_memory_equal(gs, s_chan, K * 4);
  /* anything else is an error, not a crash */
  assert_int_equal(moe8_gather_qrows(gq, gs, &gathered, q, s_tile, T, K, 3, 3, idx, 4), MOE8_ERR_SHAPE);
  assert_non_null(strstr(moe8_last_error(), "scale shape [3, 3]"));
  const int32_t bad[1] = {6};
  assert_int_equal(moe8_gather_rows(gq, q, K, bad, 1, T), MOE8_ERR_SHAPE);
  assert_non_null(strstr(moe8_last_error(), "index[0] = 6"));
}

/* moe8_set_num_threads and the small-work rule (threads.c): the count is
** checked and reported, a small loop runs on one thread, a large one on
** the set count, and the bytes of a layer forward (FP8, backward too) are
** the same under the rule, without it, and on one thread. */
static void run_layer(moe8_layer *L, const float *x, int64_t T, float *y, float *dx) {
  const size_t wsz = moe8_layer_workspace_size(L, T);
  void *ws = NULL;
  assert_int_equal(posix_memalign(&ws, 64, wsz), 0);
  float aux;
  assert_int_equal(moe8_layer_forward(L, x, T, y, &aux, ws, wsz), MOE8_OK);
  const moe8_layer_grads g = {.dx = dx};
  assert_int_equal(moe8_layer_backward(L, x, T, y, ws, wsz, &g), MOE8_OK);
  free(ws);
}

static void test_threads_setting(void **state) {
  (void)state;
  assert_int_equal(moe8_set_num_threads(-1), MOE8_ERR_INVALID_ARG);
  assert_non_null(strstr(moe8_last_error(), "thread count"));
  assert_int_equal(moe8_set_num_threads(4097), MOE8_ERR_INVALID_ARG);
  assert_int_equal(moe8_set_num_threads(3), MOE8_OK);
  assert_int_equal(moe8_get_num_threads(), 3);
  assert_int_equal(moe8_set_num_threads(0), MOE8_OK);
  assert_int_equal(moe8_get_num_threads(), omp_get_max_threads());
  moe8__set_par_min(1.0e6);
  assert_int_equal(moe8_set_num_threads(2), MOE8_OK);
  assert_int_equal(moe8__nt(1000.0), 1);
  assert_int_equal(moe8__nt(1.0e9), 2);

  enum { T = 37, D = 48 };
  moe8_layer_config c = {.num_experts = 6, .top_k = 2, .hidden = D, .ffn = 40, .norm_topk_prob = true};
  const char *rj = "{\"rules\": [{\"module_path\": \".*\", \"weight_qtype\": \"float8_e4m3fn\", \"act_qtype\": \"float8_e4m3fn\", \"tile_size\": 16}]}";
  moe8_rules *rs = NULL;
  assert_int_equal(moe8_rules_parse(rj, strlen(rj), "inline", &rs), MOE8_OK);
  moe8_layer *L;
  assert_int_equal(moe8_layer_create(&c, rs, "experts", &L), MOE8_OK);
  assert_int_equal(moe8_layer_init_random(L, 5), MOE8_OK);
  static float x[T * D], y[3][T * D], dx[3][T * D];
  tu_rng_reset(77);
  tu_fill_normal(x, T * D, 1.0f);
  run_layer(L, x, T, y[0], dx[0]);          /* the rule: these loops are small */
  moe8__set_par_min(0.0);
  run_layer(L, x, T, y[1], dx[1]);          /* every loop on two threads */
  assert_int_equal(moe8_set_num_threads(1), MOE8_OK);
  run_layer(L, x, T, y[2], dx[2]);          /* one thread */
  for (int i = 1; i < 3; i++) {
    assert_memory_equal(y[0], y[i], sizeof y[0]);
    assert_memory_equal(dx[0], dx[i], sizeof dx[0]);
  }
  assert_int_equal(moe8_set_num_threads(0), MOE8_OK);
  moe8_layer_destroy(L);
  moe8_rules_destroy(rs);
}

/* One MXFP4 product case: weights in the OCP layout (ocp, sc) and in the
** kernels' (blk, scc), rows of x as f32 (i8 false) or as int8 codes q
** with scales sx (one per sbl blocks) packed into xp. */
typedef struct mx4_case {
  bool i8;
  int64_t K, N, R, nb, sbl, ns, pb;
  uint8_t *ocp, *sc, *blk, *scc, *xp;
  float *x, *sx;
  int8_t *q;
} mx4_case;

static void mx4_case_make(mx4_case *c, bool i8, int64_t K, int64_t N, int64_t R, int64_t sbl, uint64_t seed) {
  *c = (mx4_case){.i8 = i8, .K = K, .N = N, .R = R, .nb = K / 32, .sbl = sbl, .pb = moe8__mx4_xpack_bytes(K)};
  const int64_t nb = c->nb;
  c->ns = (nb + sbl - 1) / sbl;
  c->ocp = malloc((size_t)(N * nb * 16));
  c->sc = malloc((size_t)(N * nb));
  tu_rng_reset(seed);
  for (int64_t i = 0; i < N * nb * 16; i++) c->ocp[i] = (uint8_t)(tu_u64() >> 56);
  for (int64_t i = 0; i < N * nb; i++) c->sc[i] = (uint8_t)(120 + tu_u64() % 12);
  if (N > 0 && nb > 0) c->sc[0] = 0; /* the subnormal scale 2^-127 */
  if (!i8) {
    c->blk = malloc((size_t)(N * moe8__mx4_row_bytes(K)));
    moe8__mx4_repack(c->blk, c->ocp, N, K);
    c->x = malloc(sizeof(float) * (size_t)(R * K + 1));
    tu_fill_normal(c->x, (size_t)(R * K), 1.0f);
    return;
  }
  c->blk = malloc((size_t)moe8__mx4_cols_bytes(N, K));
  c->scc = malloc((size_t)moe8__mx4_cols_scale_bytes(N, K));
  moe8__mx4_to_cols(c->blk, c->scc, c->ocp, c->sc, N, K);
  c->q = malloc((size_t)(R * K + 1));
  c->sx = malloc(sizeof(float) * (size_t)(R * c->ns + 1));
  c->xp = malloc((size_t)(R * c->pb + 1));
  for (int64_t i = 0; i < R * K; i++) c->q[i] = (int8_t)(tu_u64() >> 56);
  if (R > 0) { c->q[0] = -128; c->q[K - 1] = 127; }
  for (int64_t i = 0; i < R * c->ns; i++) c->sx[i] = (float)ldexp(1.0 + (double)(tu_u64() % 1000) / 1000.0, -7 - (int)(tu_u64() % 4));
  for (int64_t p = 0; p < R; p++) moe8__mx4_xpack(c->xp + p * c->pb, c->q + p * K, c->sx + p * c->ns, sbl, K);
}

static void mx4_case_free(mx4_case *c) {
  free(c->ocp); free(c->sc); free(c->blk); free(c->scc); free(c->xp); free(c->x); free(c->sx); free(c->q);
}

/* Rows [p0, p0 + rows) of the case, columns [n0, n1), through table k. */
static void mx4_case_run(const moe8__ktable *k, const mx4_case *c, int64_t p0, int64_t rows, int64_t n0, int64_t n1, float *out, int64_t sp) {
  if (c->i8) k->mx4_rows_i8(c->xp + p0 * c->pb, rows, c->pb, c->K, c->blk, c->scc, n0, n1, out, c->N, sp);
  else k->mx4_rows(c->x + p0 * c->K, rows, c->K, c->K, c->blk, c->sc, n0, n1, out, c->N, sp);
}

/* Σ_k w(n, k) · x(p, k) by the definition (the OCP codes, 2^(s-127), the
** activations' values), in double, and Σ |w · x| in *abs. */
static double mx4_case_dot(const mx4_case *c, int64_t p, int64_t n, double *abs) {
  static const float e2m1[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  const int64_t nb = c->nb;
  double d = 0, a = 0;
  for (int64_t k = 0; k < c->K; k++) {
    const uint8_t byte = c->ocp[(n * nb + k / 32) * 16 + (k % 32) / 2];
    const double w = (double)e2m1[(k & 1) ? byte >> 4 : byte & 15] * ldexp(1.0, (int)c->sc[n * nb + k / 32] - 127);
    const double xv = c->i8 ? (double)c->q[p * c->K + k] * (double)c->sx[p * c->ns + k / 32 / c->sbl] : (double)c->x[p * c->K + k];
    d += w * xv;
    a += fabs(w * xv);
  }
  *abs = a;
  return d;
}

/* MXFP4 rows, against f32 activations (moe8__ktable.mx4_rows, weights in
** moe8__mx4_repack's layout) and against int8 ones (mx4_rows_i8, weights
** moved from the OCP layout by moe8__mx4_to_cols, x packed by
** moe8__mx4_xpack, with scales per block, per 4 blocks and per row and
** codes over the whole int8 range, -128 included): every ISA's bytes equal
** the reference's on rows 0..8 (every row tile and its tails), K of 1 to
** 257 blocks (whole groups of 8 and the blocks after them, K above the old
** 8192 limit), N with tails of every column tile, split (gate/up
** de-interleave) on and off, column ranges and row subsets giving the same
** bytes, the subnormal weight scale included; and the reference equals
** the definition (double sums from the OCP layout) to 1e-5 of the
** absolute sum. */
static void mx4_sweep(bool i8) {
  moe8_isa isas[MOE8_ISA_COUNT];
  const int nisa = tu_isas(isas);
  const int64_t Ks[7] = {32, 64, 96, 256, 320, 2880, 8224}, Ns[7] = {1, 4, 5, 9, 18, 64, 66}, Rs[8] = {0, 1, 2, 3, 4, 5, 7, 8};
  const char *what = i8 ? "mx4 i8" : "mx4";
  for (int ki = 0; ki < 7; ki++)
    for (int ni = 0; ni < 7; ni++)
      for (int ri = 0; ri < 8; ri++) {
        const int64_t K = Ks[ki], N = Ns[ni], R = Rs[ri];
        if (K >= 2880 && (N > 18 || R % 2 == 0)) continue;
        mx4_case c;
        mx4_case_make(&c, i8, K, N, R, ri % 3 == 0 ? 1 : ri % 3 == 1 ? 4 : K / 32, (uint64_t)(ki * 100 + ni * 10 + ri + (i8 ? 7 : 0)));
        float *want = malloc(sizeof(float) * (size_t)(R * N + 1)), *got = malloc(sizeof(float) * (size_t)(R * N + 1));
        for (int split = 0; split < 2; split++) {
          if (split && N % 2) continue;
          const int64_t sp = split ? N / 2 : 0;
          mx4_case_run(moe8__kernels_for(MOE8_ISA_REF), &c, 0, R, 0, N, want, sp);
          for (int64_t p = 0; p < R; p++)
            for (int64_t n = 0; n < N; n++) {
              double a;
              const double d = mx4_case_dot(&c, p, n, &a);
              const float g = want[p * N + (sp ? n / 2 + ((n & 1) ? sp : 0) : n)];
              if (fabs((double)g - d) > 1e-5 * a + 1e-30)
                TU_FAIL("%s ref K=%lld N=%lld row %lld col %lld: %g vs %g", what, (long long)K, (long long)N, (long long)p, (long long)n, g, d);
            }
          for (int t = 0; t < nisa; t++) {
            memset(got, 0xA5, sizeof(float) * (size_t)(R * N + 1));
            const moe8__ktable *k = moe8__kernels_for(isas[t]);
            /* two column ranges, then the second row alone */
            mx4_case_run(k, &c, 0, R, 0, N / 2, got, sp);
            mx4_case_run(k, &c, 0, R, N / 2, N, got, sp);
            if (R && memcmp(got, want, sizeof(float) * (size_t)(R * N)) != 0)
              TU_FAIL("%s %s K=%lld N=%lld rows %lld split %d: bytes differ from the reference", what, moe8_isa_name(isas[t]), (long long)K,
                      (long long)N, (long long)R, split);
            if (R > 1) {
              mx4_case_run(k, &c, 1, 1, 0, N, got, sp);
              if (memcmp(got, want + N, sizeof(float) * (size_t)N) != 0) TU_FAIL("%s %s: row 1 alone differs", what, moe8_isa_name(isas[t]));
            }
          }
        }
        free(want); free(got);
        mx4_case_free(&c);
      }
}

static void test_mx4_rows(void **state) { (void)state; mx4_sweep(false); }
static void test_mx4_rows_i8(void **state) { (void)state; mx4_sweep(true); }

static void test_combine(void **state) {
  (void)state;
  enum { T = 7, K = 3, D = 33, R = 21 };
  float y[R * D], w[T * K], out[T * D], out1[T * D], out2[D];
  int32_t pos[T * K];
  tu_rng_reset(21);
  tu_fill_normal(y, R * D, 1);
  tu_fill_normal(w, T * K, 1);
  for (int a = 0; a < T * K; a++) pos[a] = (int32_t)((a * 5) % R);
  pos[4] = -1; /* a dropped slot */
  omp_set_num_threads(2);
  assert_int_equal(moe8_combine(y, R, pos, w, T, K, D, out), MOE8_OK);
  for (int t = 0; t < T; t++)
    for (int d = 0; d < D; d++) {
      float s = 0.0f; /* slot order j = 0, 1, 2 */
      for (int j = 0; j < K; j++)
        if (pos[t * K + j] >= 0) s += w[t * K + j] * y[pos[t * K + j] * D + d];
      assert_true(out[t * D + d] == s);
    }
  /* 1 thread, and T = 1 with more threads than rows: identical bytes. */
  omp_set_num_threads(1);
  assert_int_equal(moe8_combine(y, R, pos, w, T, K, D, out1), MOE8_OK);
  assert_memory_equal(out, out1, sizeof out);
  omp_set_num_threads(2);
  assert_int_equal(moe8_combine(y, R, pos + 3 * K, w + 3 * K, 1, K, D, out2), MOE8_OK);
  assert_memory_equal(out2, out + 3 * D, D * 4);
  /* NULL weights: every weight 1, the bytes of an array of ones */
  float ones[T * K];
  for (int a = 0; a < T * K; a++) ones[a] = 1.0f;
  assert_int_equal(moe8_combine(y, R, pos, ones, T, K, D, out), MOE8_OK);
  assert_int_equal(moe8_combine(y, R, pos, NULL, T, K, D, out1), MOE8_OK);
  assert_memory_equal(out, out1, sizeof out);
  assert_int_equal(moe8_combine(y, R, pos, w, 0, K, D, out), MOE8_OK);
  pos[0] = R;
  assert_int_equal(moe8_combine(y, R, pos, w, T, K, D, out), MOE8_ERR_SHAPE);
}

int main(void) {
  tu_seed();
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_router_ties_and_options),
    cmocka_unit_test(test_router_group_limited),
    cmocka_unit_test(test_router_sqrt_softplus_and_hash),
    cmocka_unit_test(test_router_logits),
    cmocka_unit_test(test_router_logits_isas),
    cmocka_unit_test(test_swiglu_isas),
    cmocka_unit_test(test_swiglu_softcap),
    cmocka_unit_test(test_geglu),
    cmocka_unit_test(test_relu_acts),
    cmocka_unit_test(test_dispatch_sort),
    cmocka_unit_test(test_gather_scale_rule),
    cmocka_unit_test(test_combine),
    cmocka_unit_test(test_threads_setting),
    cmocka_unit_test(test_mx4_rows),
    cmocka_unit_test(test_mx4_rows_i8),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
