/*
** test_layer.c — docs/layer.md: the MoE layer.
**
** 1. f32 mode: every gradient matches central finite differences of an
**    independent double-precision reference (normalized error <= 1e-4),
**    with an expert that gets no tokens, top_k = E, sigmoid + bias, aux loss.
** 2. Quantized mode: the gradients equal the straight-through reference,
**    i.e. the gradient of the same double reference in which the quantizers
**    are replaced by constant offsets (x̂ - x, ĥ - h, Ŵ as the weights).
** 3. Seed A: activations quantized before vs after the token sort give the
**    same bytes for output, aux loss and every gradient.
** 4. The fused prepared forward equals the unfused forward bit for bit and
**    makes no allocation (malloc & co. are wrapped by the linker).
** 5. Seed B's table for weight preparation.
** 6. Bad input.
*/
#include "testutil.h"
#include "moe/layer_internal.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- counting allocator (linked with --wrap) --------------------------- */
void *__real_malloc(size_t n);
void *__real_calloc(size_t a, size_t b);
void *__real_realloc(void *p, size_t n);
int   __real_posix_memalign(void **p, size_t a, size_t n);
static int g_count_allocs, g_allocs;
void *__wrap_malloc(size_t n) { g_allocs += g_count_allocs; return __real_malloc(n); }
void *__wrap_calloc(size_t a, size_t b) { g_allocs += g_count_allocs; return __real_calloc(a, b); }
void *__wrap_realloc(void *p, size_t n) { g_allocs += g_count_allocs; return __real_realloc(p, n); }
int   __wrap_posix_memalign(void **p, size_t a, size_t n) { g_allocs += g_count_allocs; return __real_posix_memalign(p, a, n); }

/* ---- the double-precision reference -------------------------------------- */
typedef struct ref {
  int64_t T, D, F, E, K;
  moe8_score_func score;
  bool norm;
  double scale, aux_w;
  const double *bias;                 /* [E] or NULL                          */
  double *x, *wr, *wg, *wu, *wd;      /* parameters (perturbed by the FD)     */
  const double *xoff, *hoff;          /* straight-through offsets or NULL     */
  double *h_out;                      /* [T*K, F]: h before its offset        */
  /* group-limited routing (n_group > 1) and a shared expert (Fs > 0) */
  int64_t ng, kg, Fs;
  double *wsg, *wsu, *wsd, *gw;       /* [D, Fs], [D, Fs], [Fs, D], gate [D] or NULL */
} ref;

static double ref_loss(const ref *p, const double *r) {
  const int64_t T = p->T, D = p->D, F = p->F, E = p->E, K = p->K;
  double loss = 0.0, f[64] = {0}, P[64] = {0};
  for (int64_t t = 0; t < T; t++) {
    double s[64], l[64], mx = -1e300, sum = 0.0;
    for (int64_t e = 0; e < E; e++) {
      l[e] = 0.0;
      for (int64_t d = 0; d < D; d++) l[e] += p->x[t * D + d] * p->wr[d * E + e];
      mx = l[e] > mx ? l[e] : mx;
    }
    for (int64_t e = 0; e < E; e++) {
      s[e] = p->score == MOE8_SCORE_SOFTMAX ? exp(l[e] - mx) : 1.0 / (1.0 + exp(-l[e]));
      sum += s[e];
    }
    if (p->score == MOE8_SCORE_SOFTMAX)
      for (int64_t e = 0; e < E; e++) s[e] /= sum;
    int64_t id[64];
    double wsel[64], wsum = 0.0, sel[64];
    bool taken[64] = {false};
    for (int64_t e = 0; e < E; e++) sel[e] = s[e] + (p->bias ? p->bias[e] : 0.0);
    if (p->ng > 1) { /* keep the kg groups with the largest top-2 sums; zero the others */
      const int64_t gs = E / p->ng;
      double gsc[64];
      bool keep[64] = {false};
      for (int64_t g = 0; g < p->ng; g++) {
        double b1 = -1e300, b2 = -1e300;
        for (int64_t e = g * gs; e < (g + 1) * gs; e++) {
          if (sel[e] > b1) { b2 = b1; b1 = sel[e]; } else if (sel[e] > b2) b2 = sel[e];
        }
        gsc[g] = b1 + b2;
      }
      for (int64_t j = 0; j < p->kg; j++) {
        int64_t bg = -1;
        for (int64_t g = 0; g < p->ng; g++)
          if (!keep[g] && (bg < 0 || gsc[g] > gsc[bg])) bg = g;
        keep[bg] = true;
      }
      for (int64_t e = 0; e < E; e++)
        if (!keep[e / gs]) sel[e] = 0.0;
    }
    for (int64_t j = 0; j < K; j++) {
      int64_t best = -1;
      for (int64_t e = 0; e < E; e++) {
        if (taken[e]) continue;
        if (best < 0 || sel[e] > sel[best]) best = e;
      }
      taken[best] = true;
      id[j] = best;
      wsel[j] = s[best];
      wsum += s[best];
      f[best] += 1.0 / (double)(T * K);
    }
    for (int64_t e = 0; e < E; e++) P[e] += s[e] / (double)T;
    for (int64_t j = 0; j < K; j++) {
      const int64_t e = id[j], a = t * K + j;
      const double wt = (p->norm ? wsel[j] / wsum : wsel[j]) * p->scale;
      double h[64];
      for (int64_t c = 0; c < F; c++) {
        double g = 0.0, u = 0.0;
        for (int64_t d = 0; d < D; d++) {
          const double xe = p->x[t * D + d] + (p->xoff ? p->xoff[t * D + d] : 0.0);
          g += xe * p->wg[(e * D + d) * F + c];
          u += xe * p->wu[(e * D + d) * F + c];
        }
        h[c] = g / (1.0 + exp(-g)) * u;
        if (p->h_out) p->h_out[a * F + c] = h[c];
        if (p->hoff) h[c] += p->hoff[a * F + c];
      }
      for (int64_t d = 0; d < D; d++) {
        double y = 0.0;
        for (int64_t c = 0; c < F; c++) y += h[c] * p->wd[(e * F + c) * D + d];
        loss += r[t * D + d] * wt * y;
      }
    }
    if (p->Fs > 0) { /* the shared expert, gated by sigmoid(x · gw) when gw is set */
      double hs[64], gl = 0.0;
      for (int64_t c = 0; c < p->Fs; c++) {
        double g = 0.0, u = 0.0;
        for (int64_t d = 0; d < D; d++) {
          g += p->x[t * D + d] * p->wsg[d * p->Fs + c];
          u += p->x[t * D + d] * p->wsu[d * p->Fs + c];
        }
        hs[c] = g / (1.0 + exp(-g)) * u;
      }
      if (p->gw)
        for (int64_t d = 0; d < D; d++) gl += p->x[t * D + d] * p->gw[d];
      const double gate = p->gw ? 1.0 / (1.0 + exp(-gl)) : 1.0;
      for (int64_t d = 0; d < D; d++) {
        double y = 0.0;
        for (int64_t c = 0; c < p->Fs; c++) y += hs[c] * p->wsd[c * D + d];
        loss += r[t * D + d] * gate * y;
      }
    }
  }
  /* f_e counts selections: piecewise constant, so the aux gradient flows
  ** through P_e only (the same convention as the layer). */
  double aux = 0.0;
  for (int64_t e = 0; e < E; e++) aux += f[e] * P[e];
  return loss + p->aux_w * (double)E * aux;
}

/* Normalized error of g against central differences of ref_loss wrt v. */
static double fd_error(ref *p, const double *r, double *v, size_t n, const float *g) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < n; i++) {
    const double keep = v[i], eps = 1e-6 * (fabs(keep) > 1.0 ? fabs(keep) : 1.0);
    v[i] = keep + eps;
    const double lp = ref_loss(p, r);
    v[i] = keep - eps;
    const double lm = ref_loss(p, r);
    v[i] = keep;
    const double fd = (lp - lm) / (2.0 * eps);
    num += (g[i] - fd) * (g[i] - fd);
    den += fd * fd;
  }
  return sqrt(num) / (sqrt(den) > 1e-30 ? sqrt(den) : 1e-30);
}

static double *to_double(const float *f, size_t n) {
  double *d = malloc(n * sizeof(double));
  for (size_t i = 0; i < n; i++) d[i] = f[i];
  return d;
}

/* A layer, its input, forward and backward, all buffers owned here. */
typedef struct run {
  moe8_layer *L;
  int64_t T, D, F, E, K;
  float *x, *out, *r, *dx, *dwr, *dwg, *dwu, *dwd, aux;
  void *ws;
  size_t ws_size;
} run;

static void run_init(run *u, const moe8_layer_config *c, const moe8_rules *rules, int64_t T, uint64_t seed) {
  memset(u, 0, sizeof *u);
  u->T = T; u->D = c->hidden; u->F = c->ffn; u->E = c->num_experts; u->K = c->top_k;
  assert_int_equal(moe8_layer_create(c, rules, "model.layers.0.mlp.experts", &u->L), MOE8_OK);
  assert_int_equal(moe8_layer_init_random(u->L, seed), MOE8_OK);
  const size_t TD = (size_t)(T * u->D), EDF = (size_t)(u->E * u->D * u->F);
  u->x = malloc(TD * 4 + 4); u->out = malloc(TD * 4 + 4); u->r = malloc(TD * 4 + 4); u->dx = malloc(TD * 4 + 4);
  u->dwr = malloc((size_t)(u->D * u->E) * 4); u->dwg = malloc(EDF * 4); u->dwu = malloc(EDF * 4); u->dwd = malloc(EDF * 4);
  tu_rng_reset(seed + 17);
  tu_fill_normal(u->x, TD, 1.0f);
  tu_fill_normal(u->r, TD, 1.0f);
  u->ws_size = moe8_layer_workspace_size(u->L, T);
  assert_int_equal(posix_memalign(&u->ws, 64, u->ws_size), 0);
}

static void run_fwd_bwd(run *u) {
  moe8_status st = moe8_layer_forward(u->L, u->x, u->T, u->out, &u->aux, u->ws, u->ws_size);
  if (st != MOE8_OK) TU_FAIL("forward: %s", moe8_last_error());
  const moe8_layer_grads g = {u->dx, u->dwr, u->dwg, u->dwu, u->dwd};
  st = moe8_layer_backward(u->L, u->x, u->T, u->r, u->ws, u->ws_size, &g);
  if (st != MOE8_OK) TU_FAIL("backward: %s", moe8_last_error());
}

static void run_free(run *u) {
  moe8_layer_destroy(u->L);
  free(u->x); free(u->out); free(u->r); free(u->dx); free(u->dwr); free(u->dwg); free(u->dwu); free(u->dwd); free(u->ws);
}

/* Checks all five gradients of u against the reference p; tol normalized. */
static void check_grads(run *u, ref *p, double tol, const char *what) {
  const size_t TD = (size_t)(u->T * u->D), EDF = (size_t)(u->E * u->D * u->F);
  double *rr = to_double(u->r, TD);
  const struct { const char *name; double *v; size_t n; const float *g; } t[] = {
    {"dx", p->x, TD, u->dx}, {"dWr", p->wr, (size_t)(u->D * u->E), u->dwr}, {"dWg", p->wg, EDF, u->dwg},
    {"dWu", p->wu, EDF, u->dwu}, {"dWd", p->wd, EDF, u->dwd},
  };
  for (int i = 0; i < 5; i++) {
    const double err = fd_error(p, rr, t[i].v, t[i].n, t[i].g);
    if (!(err <= tol)) TU_FAIL("%s: %s normalized error %.3g > %.1g", what, t[i].name, err, tol);
  }
  free(rr);
}

static void test_f32_gradients_vs_finite_differences(void **state) {
  (void)state;
  static const struct { const char *name; moe8_layer_config c; int dead_expert; } cases[] = {
    {"softmax top2 norm aux, expert 3 unused", {4, 2, 8, 6, MOE8_SCORE_SOFTMAX, true, 0, true, 0, 0.01f}, 3},
    {"softmax top_k = E, scaled", {4, 4, 8, 6, MOE8_SCORE_SOFTMAX, false, 2.0f, false, 0, 0}, -1},
    {"sigmoid top2 norm, bias, scaled", {5, 2, 7, 5, MOE8_SCORE_SIGMOID, true, 1.5f, true, 0, 0}, -1},
    {"softmax top1", {3, 1, 9, 4, MOE8_SCORE_SOFTMAX, false, 0, false, 0, 0.02f}, -1},
  };
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    run u;
    run_init(&u, &cases[ci].c, NULL, 6, 100 + ci);
    double bias[8] = {0};
    if (cases[ci].c.use_selection_bias) {
      float *b = moe8_layer_weight(u.L, MOE8_W_BIAS, NULL);
      for (int64_t e = 0; e < u.E; e++) b[e] = bias[e] = 0.05 * (double)((e * 7) % 5) - 0.1;
      if (cases[ci].dead_expert >= 0) b[cases[ci].dead_expert] = (float)(bias[cases[ci].dead_expert] = -100.0);
    }
    run_fwd_bwd(&u);
    if (cases[ci].dead_expert >= 0) /* the unused expert gets zero gradients */
      for (int64_t i = 0; i < u.D * u.F; i++) assert_true(u.dwg[cases[ci].dead_expert * u.D * u.F + i] == 0.0f);
    ref p = {u.T, u.D, u.F, u.E, u.K, cases[ci].c.score, cases[ci].c.norm_topk_prob,
             cases[ci].c.routed_scaling_factor != 0 ? cases[ci].c.routed_scaling_factor : 1.0, cases[ci].c.aux_loss_weight,
             cases[ci].c.use_selection_bias ? bias : NULL,
             to_double(u.x, (size_t)(u.T * u.D)), to_double(moe8_layer_weight(u.L, MOE8_W_ROUTER, NULL), (size_t)(u.D * u.E)),
             to_double(moe8_layer_weight(u.L, MOE8_W_GATE, NULL), (size_t)(u.E * u.D * u.F)),
             to_double(moe8_layer_weight(u.L, MOE8_W_UP, NULL), (size_t)(u.E * u.D * u.F)),
             to_double(moe8_layer_weight(u.L, MOE8_W_DOWN, NULL), (size_t)(u.E * u.F * u.D)), NULL, NULL, NULL};
    /* The forward itself agrees with the reference. */
    double *rr = to_double(u.r, (size_t)(u.T * u.D));
    double lf = u.aux;
    for (int64_t i = 0; i < u.T * u.D; i++) lf += (double)u.r[i] * u.out[i];
    const double lr = ref_loss(&p, rr);
    if (fabs(lf - lr) > 1e-4 * (1.0 + fabs(lr))) TU_FAIL("%s: forward loss %.9g vs reference %.9g", cases[ci].name, lf, lr);
    check_grads(&u, &p, 1e-4, cases[ci].name);
    free(rr); free(p.x); free(p.wr); free(p.wg); free(p.wu); free(p.wd);
    run_free(&u);
  }
}

/* Shared experts (ungated, DeepSeek-V3; sigmoid-gated, Qwen2-MoE) with
** group-limited routing: every gradient against finite differences. */
static void test_shared_expert_gradients(void **state) {
  (void)state;
  for (int gated = 0; gated < 2; gated++) {
    moe8_layer_config c = {8, 2, 6, 5, gated ? MOE8_SCORE_SOFTMAX : MOE8_SCORE_SIGMOID, true, gated ? 0.0f : 2.5f, !gated, 0, 0};
    c.shared_ffn = 7;
    c.shared_gate = gated;
    if (!gated) { c.n_group = 4; c.topk_group = 2; }
    run u;
    run_init(&u, &c, NULL, 5, 300 + (uint64_t)gated);
    const int64_t D = u.D, Fs = c.shared_ffn;
    float *dwsg = malloc(sizeof(float) * (size_t)(D * Fs)), *dwsu = malloc(sizeof(float) * (size_t)(D * Fs));
    float *dwsd = malloc(sizeof(float) * (size_t)(D * Fs)), *dgw = malloc(sizeof(float) * (size_t)D);
    double bias[8] = {0};
    if (c.use_selection_bias) {
      float *b = moe8_layer_weight(u.L, MOE8_W_BIAS, NULL);
      for (int64_t e = 0; e < u.E; e++) b[e] = (float)(bias[e] = 0.03 * (double)((e * 5) % 7) - 0.1);
    }
    assert_int_equal(moe8_layer_forward(u.L, u.x, u.T, u.out, &u.aux, u.ws, u.ws_size), MOE8_OK);
    const moe8_layer_grads g = {u.dx, u.dwr, u.dwg, u.dwu, u.dwd, dwsg, dwsu, dwsd, gated ? dgw : NULL};
    if (moe8_layer_backward(u.L, u.x, u.T, u.r, u.ws, u.ws_size, &g) != MOE8_OK) TU_FAIL("backward: %s", moe8_last_error());
    ref p = {u.T, D, u.F, u.E, u.K, c.score, c.norm_topk_prob, c.routed_scaling_factor != 0 ? c.routed_scaling_factor : 1.0, 0.0,
             c.use_selection_bias ? bias : NULL,
             to_double(u.x, (size_t)(u.T * D)), to_double(moe8_layer_weight(u.L, MOE8_W_ROUTER, NULL), (size_t)(D * u.E)),
             to_double(moe8_layer_weight(u.L, MOE8_W_GATE, NULL), (size_t)(u.E * D * u.F)),
             to_double(moe8_layer_weight(u.L, MOE8_W_UP, NULL), (size_t)(u.E * D * u.F)),
             to_double(moe8_layer_weight(u.L, MOE8_W_DOWN, NULL), (size_t)(u.E * u.F * D)), NULL, NULL, NULL,
             c.n_group, c.topk_group, Fs,
             to_double(moe8_layer_weight(u.L, MOE8_W_SHARED_GATE, NULL), (size_t)(D * Fs)),
             to_double(moe8_layer_weight(u.L, MOE8_W_SHARED_UP, NULL), (size_t)(D * Fs)),
             to_double(moe8_layer_weight(u.L, MOE8_W_SHARED_DOWN, NULL), (size_t)(Fs * D)),
             gated ? to_double(moe8_layer_weight(u.L, MOE8_W_SHARED_GATE_W, NULL), (size_t)D) : NULL};
    double *rr = to_double(u.r, (size_t)(u.T * D));
    double lf = 0.0;
    for (int64_t i = 0; i < u.T * D; i++) lf += (double)u.r[i] * u.out[i];
    const double lr = ref_loss(&p, rr);
    if (fabs(lf - lr) > 1e-4 * (1.0 + fabs(lr))) TU_FAIL("shared %d: forward loss %.9g vs reference %.9g", gated, lf, lr);
    check_grads(&u, &p, 1e-4, gated ? "shared expert, sigmoid gate" : "shared expert, group routing");
    const struct { const char *name; double *v; size_t n; const float *gr; } t[] = {
      {"dWsg", p.wsg, (size_t)(D * Fs), dwsg}, {"dWsu", p.wsu, (size_t)(D * Fs), dwsu}, {"dWsd", p.wsd, (size_t)(Fs * D), dwsd},
      {"dgate", p.gw, (size_t)D, dgw}};
    for (int i = 0; i < (gated ? 4 : 3); i++) {
      const double err = fd_error(&p, rr, t[i].v, t[i].n, t[i].gr);
      if (!(err <= 1e-4)) TU_FAIL("shared %d: %s normalized error %.3g", gated, t[i].name, err);
    }
    free(rr); free(p.x); free(p.wr); free(p.wg); free(p.wu); free(p.wd); free(p.wsg); free(p.wsu); free(p.wsd); free(p.gw);
    free(dwsg); free(dwsu); free(dwsd); free(dgw);
    run_free(&u);
  }
}

/* A rule set with FP8 weights and activations (tile 4 when tiled). */
static moe8_rules *fp8_rules(const char *bwd, int tile, bool before) {
  char txt[512];
  snprintf(txt, sizeof txt,
           "{\"rules\": [{\"module_path\": \"experts\", \"weight_qtype\": \"float8_e4m3fn\", "
           "\"act_qtype\": \"float8_e4m3fn\"%s%s%s %s}], \"quantize_before_ep_all_gather\": %s}",
           bwd ? ", \"bwd_qtype\": \"" : "", bwd ? bwd : "", bwd ? "\"" : "", tile ? ", \"tile_size\": 4" : "",
           before ? "true" : "false");
  moe8_rules *rs = NULL;
  assert_int_equal(moe8_rules_parse(txt, strlen(txt), "inline", &rs), MOE8_OK);
  return rs;
}

/* Straight-through reference: Ŵ as the weights, x̂ - x and ĥ - h offsets. */
static void build_st_ref(run *u, const moe8_rules *rs, ref *p, double **keep) {
  moe8_quant_spec as;
  assert_true(moe8_rule_act_spec(moe8_layer_rule(u->L), &as));
  (void)rs;
  const int64_t T = u->T, D = u->D, F = u->F, E = u->E, K = u->K;
  assert_int_equal(moe8_layer_prepare(u->L), MOE8_OK);
  moe8_prepared pr;
  assert_int_equal(moe8_layer_prepared(u->L, &pr), MOE8_OK);
  moe8_quant_spec ws = {.qtype = pr.dtype, .gran = pr.tile ? MOE8_GRAN_CHANNEL_TILE : MOE8_GRAN_CHANNEL, .tile = pr.tile, .clip = 1};
  float *gu = malloc(sizeof(float) * (size_t)(E * D * 2 * F)), *wd = malloc(sizeof(float) * (size_t)(E * F * D));
  assert_int_equal(moe8_dequantize(&ws, pr.w_gate_up, pr.s_gate_up, E, D, 2 * F, gu), MOE8_OK);
  assert_int_equal(moe8_dequantize(&ws, pr.w_down, pr.s_down, E, F, D, wd), MOE8_OK);
  double *wg = malloc(sizeof(double) * (size_t)(E * D * F)), *wu = malloc(sizeof(double) * (size_t)(E * D * F));
  for (int64_t i = 0; i < E * D; i++)
    for (int64_t c = 0; c < F; c++) { wg[i * F + c] = gu[i * 2 * F + c]; wu[i * F + c] = gu[i * 2 * F + F + c]; }
  /* x̂ per token */
  uint8_t *q = malloc((size_t)(T * K * (D > F ? D : F)));
  float *s = malloc(sizeof(float) * (size_t)(T * K * (D > F ? D : F))), *xh = malloc(sizeof(float) * (size_t)(T * D));
  assert_int_equal(moe8_quantize(&as, u->x, 1, T, D, q, s, NULL), MOE8_OK);
  assert_int_equal(moe8_dequantize(&as, q, s, 1, T, D, xh), MOE8_OK);
  double *xoff = malloc(sizeof(double) * (size_t)(T * D));
  for (int64_t i = 0; i < T * D; i++) xoff[i] = (double)xh[i] - (double)u->x[i];
  *p = (ref){T, D, F, E, K, MOE8_SCORE_SOFTMAX, true, 1.0, 0.0, NULL,
             to_double(u->x, (size_t)(T * D)), to_double(moe8_layer_weight(u->L, MOE8_W_ROUTER, NULL), (size_t)(D * E)),
             wg, wu, to_double(wd, (size_t)(E * F * D)), xoff, NULL, NULL};
  /* ĥ per assignment row, from h at the base point. */
  double *h = malloc(sizeof(double) * (size_t)(T * K * F)), *hoff = malloc(sizeof(double) * (size_t)(T * K * F));
  float *hf = malloc(sizeof(float) * (size_t)(T * K * F)), *hh = malloc(sizeof(float) * (size_t)(T * K * F));
  p->h_out = h;
  double *rr = to_double(u->r, (size_t)(T * D));
  ref_loss(p, rr);
  p->h_out = NULL;
  for (int64_t i = 0; i < T * K * F; i++) hf[i] = (float)h[i];
  assert_int_equal(moe8_quantize(&as, hf, 1, T * K, F, q, s, NULL), MOE8_OK);
  assert_int_equal(moe8_dequantize(&as, q, s, 1, T * K, F, hh), MOE8_OK);
  for (int64_t i = 0; i < T * K * F; i++) hoff[i] = (double)hh[i] - h[i];
  p->hoff = hoff;
  keep[0] = xoff; keep[1] = hoff; keep[2] = h;
  free(gu); free(wd); free(q); free(s); free(xh); free(hf); free(hh); free(rr);
}

static void free_ref(ref *p, double **keep) {
  free(p->x); free(p->wr); free(p->wg); free(p->wu); free(p->wd);
  for (int i = 0; i < 3; i++) free(keep[i]);
}

static void test_quantized_gradients_straight_through(void **state) {
  (void)state;
  const moe8_layer_config c = {4, 2, 8, 6, MOE8_SCORE_SOFTMAX, true, 0, false, 0, 0};
  for (int tile = 0; tile < 2; tile++) {
    moe8_rules *rs = fp8_rules(NULL, tile, true);
    run u;
    run_init(&u, &c, rs, 6, 300 + tile);
    run_fwd_bwd(&u);
    ref p;
    double *keep[3];
    build_st_ref(&u, rs, &p, keep);
    /* 1e-3, not 1e-4: the reference computes h in double, and an element
    ** within 1e-6 of an FP8 rounding boundary may quantize differently from
    ** the layer's f32 h; everything else agrees to f32 rounding. */
    check_grads(&u, &p, 1e-3, tile ? "fp8 1x4 straight-through" : "fp8 per-token straight-through");
    free_ref(&p, keep);
    run_free(&u);
    moe8_rules_destroy(rs);
  }
  /* With bwd_qtype the gradients carry e5m2 noise: close, but not equal. */
  moe8_rules *rs = fp8_rules("float8_e5m2", 1, true);
  run u;
  run_init(&u, &c, rs, 6, 300);
  run_fwd_bwd(&u);
  ref p;
  double *keep[3];
  build_st_ref(&u, rs, &p, keep);
  double *rr = to_double(u.r, (size_t)(u.T * u.D));
  const double err = fd_error(&p, rr, p.wd, (size_t)(u.E * u.F * u.D), u.dwd);
  if (!(err > 1e-6 && err < 0.25)) TU_FAIL("bwd_qtype e5m2: dWd normalized error %.3g not in (1e-6, 0.25)", err);
  free(rr);
  free_ref(&p, keep);
  run_free(&u);
  moe8_rules_destroy(rs);
}

static void test_seed_a_quantize_before_sort(void **state) {
  (void)state;
  const moe8_layer_config c = {8, 2, 64, 40, MOE8_SCORE_SOFTMAX, true, 0, false, 0, 0.01f};
  for (int tile = 0; tile < 2; tile++) {
    moe8_rules *rs = fp8_rules(NULL, tile, false);
    run a, b;
    run_init(&a, &c, rs, 37, 7);
    run_init(&b, &c, rs, 37, 7);
    moe8_layer_set_quantize_before_sort(a.L, true);
    moe8_layer_set_quantize_before_sort(b.L, false);
    run_fwd_bwd(&a);
    run_fwd_bwd(&b);
    const size_t TD = (size_t)(a.T * a.D) * 4, EDF = (size_t)(a.E * a.D * a.F) * 4;
    assert_memory_equal(a.out, b.out, TD);
    assert_memory_equal(&a.aux, &b.aux, 4);
    assert_memory_equal(a.dx, b.dx, TD);
    assert_memory_equal(a.dwr, b.dwr, (size_t)(a.D * a.E) * 4);
    assert_memory_equal(a.dwg, b.dwg, EDF);
    assert_memory_equal(a.dwu, b.dwu, EDF);
    assert_memory_equal(a.dwd, b.dwd, EDF);
    run_free(&a); run_free(&b);
    moe8_rules_destroy(rs);
  }
}

/* docs/integration.md: the serving op.  Given the ids and weights the
** layer's own router picks, moe8_layer_experts gives the forward's bytes
** (training and prepared paths, FP8 and i8 rules, a shared expert); ids <
** 0 are skipped (all skipped: the shared expert alone); an id >= E is an
** error naming the slot. */
static void test_experts_entry(void **state) {
  (void)state;
  const char *rules_txt[] = {
    NULL,
    "{\"rules\": [{\"module_path\": \".*\", \"weight_qtype\": \"float8_e4m3fn\", \"act_qtype\": \"float8_e4m3fn\", \"tile_size\": 16}]}",
    "{\"rules\": [{\"module_path\": \".*\", \"weight_qtype\": \"int8\", \"act_qtype\": \"int8\"}]}",
  };
  moe8_layer_config c = {.num_experts = 8, .top_k = 3, .hidden = 48, .ffn = 32, .norm_topk_prob = true, .routed_scaling_factor = 1.5f,
                         .shared_ffn = 16, .shared_gate = true};
  for (size_t i = 0; i < 3; i++) {
    moe8_rules *rs = NULL;
    if (rules_txt[i]) assert_int_equal(moe8_rules_parse(rules_txt[i], strlen(rules_txt[i]), "inline", &rs), MOE8_OK);
    run u;
    run_init(&u, &c, rs, 21, 70 + i);
    const int64_t T = u.T, E = u.E, K = u.K, D = u.D;
    float *logits = malloc(sizeof(float) * (size_t)(T * E)), *w = malloc(sizeof(float) * (size_t)(T * K));
    float *o2 = malloc(sizeof(float) * (size_t)(T * D)), *o3 = malloc(sizeof(float) * (size_t)(T * D));
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(T * K));
    const moe8_router_config rc = {E, K, c.score, c.norm_topk_prob, c.routed_scaling_factor, NULL, 0, 0};
    assert_int_equal(moe8_router_logits(u.x, moe8_layer_weight_read(u.L, MOE8_W_ROUTER, NULL), T, D, E, logits), MOE8_OK);
    assert_int_equal(moe8_route(&rc, logits, T, NULL, ids, w), MOE8_OK);
    for (int prepared = 0; prepared < 2; prepared++) {
      if (prepared) assert_int_equal(moe8_layer_prepare(u.L), MOE8_OK);
      assert_int_equal(prepared ? moe8_layer_forward_fused(u.L, u.x, T, u.out, u.ws, u.ws_size)
                                : moe8_layer_forward(u.L, u.x, T, u.out, NULL, u.ws, u.ws_size), MOE8_OK);
      assert_int_equal(moe8_layer_experts(u.L, u.x, T, ids, w, o2, u.ws, u.ws_size), MOE8_OK);
      if (memcmp(u.out, o2, sizeof(float) * (size_t)(T * D)) != 0)
        TU_FAIL("rules %zu, %s: moe8_layer_experts differs from the forward given the same routing", i, prepared ? "prepared" : "training");
    }
    /* every slot skipped: the shared expert alone (= the forward of a layer
    ** whose routed experts' weights are 0) */
    int32_t *none = malloc(sizeof(int32_t) * (size_t)(T * K));
    for (int64_t a = 0; a < T * K; a++) none[a] = -1;
    assert_int_equal(moe8_layer_experts(u.L, u.x, T, none, w, o3, u.ws, u.ws_size), MOE8_OK);
    float *zw = calloc((size_t)(T * K), sizeof(float));
    assert_int_equal(moe8_layer_experts(u.L, u.x, T, ids, zw, o2, u.ws, u.ws_size), MOE8_OK);
    for (int64_t j = 0; j < T * D; j++)
      if (o3[j] != o2[j]) TU_FAIL("rules %zu: all slots skipped [%lld] = %g, zero weights %g", i, (long long)j, (double)o3[j], (double)o2[j]);
    /* an id past E, NULL routing */
    ids[5] = (int32_t)E;
    assert_int_equal(moe8_layer_experts(u.L, u.x, T, ids, w, o2, u.ws, u.ws_size), MOE8_ERR_SHAPE);
    assert_non_null(strstr(moe8_last_error(), "token 1, slot 2"));
    assert_int_equal(moe8_layer_experts(u.L, u.x, T, NULL, w, o2, u.ws, u.ws_size), MOE8_ERR_INVALID_ARG);
    free(none); free(zw); free(logits); free(w); free(o2); free(o3); free(ids);
    run_free(&u);
    moe8_rules_destroy(rs);
  }
}

/* The rule sets the prepared-path tests run: none, FP8 (tiled), int8,
** FP8 weight-only, int8 weights with FP8 activations. */
static const char *const k_rules_txt[] = {
  NULL,
  "{\"rules\": [{\"module_path\": \"experts\", \"weight_qtype\": \"float8_e4m3fn\", \"act_qtype\": \"float8_e4m3fn\", \"tile_size\": 16}]}",
  "{\"rules\": [{\"module_path\": \"experts\", \"weight_qtype\": \"int8\", \"act_qtype\": \"int8\"}]}",
  "{\"rules\": [{\"module_path\": \"experts\", \"weight_qtype\": \"float8_e4m3fn\"}]}",
  "{\"rules\": [{\"module_path\": \"experts\", \"weight_qtype\": \"int8\", \"act_qtype\": \"float8_e4m3fn\"}]}",
};
enum { NRULES = sizeof k_rules_txt / sizeof k_rules_txt[0] };

static void test_fused_equals_unfused_no_alloc(void **state) {
  (void)state;
  const moe8_layer_config c = {6, 2, 48, 40, MOE8_SCORE_SOFTMAX, true, 0, false, 0, 0};
  const size_t nr = NRULES;
  /* Every rule set at T = 29 (panel and small-M kernels), then at T = 3
  ** (decode: every expert has at most a few rows). */
  for (size_t it = 0; it < 2 * nr; it++) {
    const size_t i = it % nr;
    moe8_rules *rs = NULL;
    if (k_rules_txt[i]) assert_int_equal(moe8_rules_parse(k_rules_txt[i], strlen(k_rules_txt[i]), "inline", &rs), MOE8_OK);
    run u;
    run_init(&u, &c, rs, it < nr ? 29 : 3, 50 + it);
    assert_int_equal(moe8_layer_forward(u.L, u.x, u.T, u.out, NULL, u.ws, u.ws_size), MOE8_OK);
    float *o2 = malloc(sizeof(float) * (size_t)(u.T * u.D));
    assert_int_equal(moe8_layer_forward_fused(u.L, u.x, u.T, o2, u.ws, u.ws_size), MOE8_ERR_INVALID_ARG); /* not prepared */
    assert_int_equal(moe8_layer_prepare(u.L), MOE8_OK);
    /* FP8 weights and activations (bf16 kernels) and i8 with i8 (VNNI):
    ** prepare packs the weights. */
    if (((i == 1 && moe8__kernels()->has_bf16) || (i == 2 && moe8__kernels()->has_vnni)) &&
        (!u.L->xs[0].wgu_pk || !u.L->xs[0].wd_pk))
      TU_FAIL("rules %zu: prepare did not pack the weights", i);
    g_allocs = 0;
    g_count_allocs = 1;
    const moe8_status st = moe8_layer_forward_fused(u.L, u.x, u.T, o2, u.ws, u.ws_size);
    g_count_allocs = 0;
    assert_int_equal(st, MOE8_OK);
    if (g_allocs != 0) TU_FAIL("rules %zu: the fused forward made %d allocation(s)", i, g_allocs);
    assert_memory_equal(o2, u.out, sizeof(float) * (size_t)(u.T * u.D));
    /* Reading a weight keeps the layer prepared; taking it writable does not. */
    assert_non_null(moe8_layer_weight_read(u.L, MOE8_W_DOWN, NULL));
    assert_int_equal(moe8_layer_forward_fused(u.L, u.x, u.T, o2, u.ws, u.ws_size), MOE8_OK);
    assert_non_null(moe8_layer_weight(u.L, MOE8_W_DOWN, NULL));
    assert_int_equal(moe8_layer_forward_fused(u.L, u.x, u.T, o2, u.ws, u.ws_size), MOE8_ERR_INVALID_ARG);
    assert_null(moe8_layer_weight_read(u.L, MOE8_W_COUNT, NULL));
    free(o2);
    run_free(&u);
    moe8_rules_destroy(rs);
  }
}

/* A layer of 3 tokens of 8 whose weight `which` is scaled by 1e36 (finite
** weights, an output that overflows): its forward is MOE8_ERR_NONFINITE
** naming the layer and token 0.  o keeps the layer, x, y and the
** workspace for the caller's further checks. */
typedef struct overflow_run { moe8_layer *L; float x[3 * 8], y[3 * 8]; void *ws; size_t wsz; } overflow_run;

static void overflow_forward(overflow_run *o, const moe8_layer_config *c, const char *path, moe8_weight_id which, uint64_t seed) {
  assert_int_equal(moe8_layer_create(c, NULL, path, &o->L), MOE8_OK);
  assert_int_equal(moe8_layer_init_random(o->L, seed), MOE8_OK);
  size_t n = 0;
  float *w = moe8_layer_weight(o->L, which, &n);
  assert_non_null(w);
  for (size_t j = 0; j < n; j++) w[j] *= 1e36f;
  for (int j = 0; j < 24; j++) o->x[j] = 1000.0f * (float)((j % 5) - 2);
  o->wsz = moe8_layer_workspace_size(o->L, 3);
  assert_int_equal(posix_memalign(&o->ws, 64, o->wsz), 0);
  assert_int_equal(moe8_layer_forward(o->L, o->x, 3, o->y, NULL, o->ws, o->wsz), MOE8_ERR_NONFINITE);
  char want[160];
  snprintf(want, sizeof want, "layer %s: the output has", path);
  assert_non_null(strstr(moe8_last_error(), want));
  assert_non_null(strstr(moe8_last_error(), "token 0"));
}

/* With a shared expert (plain and gated): the inference forward, which
** quantizes each token before the gather (per-row rules), gives the
** training forward's bytes (quantized after the gather); an output that
** overflows only through the shared expert is named by token on both.
** (The one pass that makes out, moe8__finish_output, is compared with the
** expert-parallel forward's separate combine, add and scan in test_ep.) */
static void test_fused_shared_expert_bytes(void **state) {
  (void)state;
  for (int gated = 0; gated < 2; gated++)
    for (size_t i = 0; i < NRULES; i++) {
      const moe8_layer_config c = {.num_experts = 6, .top_k = 2, .hidden = 48, .ffn = 40, .score = MOE8_SCORE_SOFTMAX,
                                   .norm_topk_prob = true, .shared_ffn = 24, .shared_gate = gated != 0};
      moe8_rules *rs = NULL;
      if (k_rules_txt[i]) assert_int_equal(moe8_rules_parse(k_rules_txt[i], strlen(k_rules_txt[i]), "inline", &rs), MOE8_OK);
      run u;
      run_init(&u, &c, rs, 29, 90 + i + 10 * (size_t)gated);
      assert_int_equal(moe8_layer_forward(u.L, u.x, u.T, u.out, NULL, u.ws, u.ws_size), MOE8_OK);
      float *o2 = malloc(sizeof(float) * (size_t)(u.T * u.D));
      assert_int_equal(moe8_layer_prepare(u.L), MOE8_OK);
      assert_int_equal(moe8_layer_forward_fused(u.L, u.x, u.T, o2, u.ws, u.ws_size), MOE8_OK);
      if (memcmp(o2, u.out, sizeof(float) * (size_t)(u.T * u.D)) != 0) TU_FAIL("rules %zu, gated %d: fused bytes differ", i, gated);
      free(o2);
      run_free(&u);
      moe8_rules_destroy(rs);
    }
  /* The shared expert's down weight scaled until out overflows. */
  const moe8_layer_config c = {.num_experts = 4, .top_k = 2, .hidden = 8, .ffn = 6, .score = MOE8_SCORE_SOFTMAX,
                               .norm_topk_prob = true, .shared_ffn = 6};
  overflow_run o;
  overflow_forward(&o, &c, "model.layers.3.mlp.experts", MOE8_W_SHARED_DOWN, 5);
  moe8_layer *L = o.L;
  float *x = o.x, *y = o.y;
  void *ws = o.ws;
  const size_t wsz = o.wsz;
  assert_int_equal(moe8_layer_prepare(L), MOE8_OK);
  assert_int_equal(moe8_layer_forward_fused(L, x, 3, y, ws, wsz), MOE8_ERR_NONFINITE);
  assert_non_null(strstr(moe8_last_error(), "token 0"));
  free(ws);
  moe8_layer_destroy(L);
}

/* A NaN or inf in x is named as the input's on every path: the inference
** forward with per-row scales quantizes x first and takes the quantizer's
** scan as the input's; nothing is written to out. */
static void test_fused_input_nonfinite(void **state) {
  (void)state;
  const moe8_layer_config c = {6, 2, 48, 40, MOE8_SCORE_SOFTMAX, true, 0, false, 0, 0};
  for (size_t i = 0; i < NRULES; i++) {
    moe8_rules *rs = NULL;
    if (k_rules_txt[i]) assert_int_equal(moe8_rules_parse(k_rules_txt[i], strlen(k_rules_txt[i]), "inline", &rs), MOE8_OK);
    run u;
    run_init(&u, &c, rs, 7, 300 + i);
    assert_int_equal(moe8_layer_prepare(u.L), MOE8_OK);
    u.x[50] = NAN; u.x[7 * 48 - 1] = -INFINITY;
    for (int64_t j = 0; j < u.T * u.D; j++) u.out[j] = 123.0f;
    for (int path = 0; path < 2; path++) {
      const moe8_status st = path ? moe8_layer_forward_fused(u.L, u.x, u.T, u.out, u.ws, u.ws_size)
                                  : moe8_layer_forward(u.L, u.x, u.T, u.out, NULL, u.ws, u.ws_size);
      assert_int_equal(st, MOE8_ERR_NONFINITE);
      if (!strstr(moe8_last_error(), "input x [7, 48] has 2 non-finite"))
        TU_FAIL("rules %zu, path %d: %s", i, path, moe8_last_error());
      for (int64_t j = 0; j < u.T * u.D; j++)
        if (u.out[j] != 123.0f) TU_FAIL("rules %zu, path %d: out[%lld] was written", i, path, (long long)j);
    }
    run_free(&u);
    moe8_rules_destroy(rs);
  }
}

/* An inference layer built from weights in memory (moe8_layer_create_
** inference, put_expert, finish_load) gives the bytes of a training layer
** holding the same weights, prepared: every rule set of k_rules_txt, with
** and without a gated shared expert, T = 29 and 3; the
** calls refuse a missing, repeated-after-finish, out-of-range or
** non-finite expert. */
static void test_inference_from_memory(void **state) {
  (void)state;
  const size_t nr = NRULES;
  for (size_t it = 0; it < 4 * nr; it++) {
    const size_t i = it % nr;
    const bool shared = (it / nr) & 1;
    const int64_t T = it < 2 * nr ? 29 : 3, E = 6, D = 48, F = 40, Fs = shared ? 24 : 0;
    const moe8_layer_config c = {.num_experts = E, .top_k = 2, .hidden = D, .ffn = F, .score = MOE8_SCORE_SOFTMAX,
                                 .norm_topk_prob = true, .shared_ffn = Fs, .shared_gate = shared};
    moe8_rules *rs = NULL;
    if (k_rules_txt[i]) assert_int_equal(moe8_rules_parse(k_rules_txt[i], strlen(k_rules_txt[i]), "inline", &rs), MOE8_OK);
    moe8_layer *A = NULL, *B = NULL;
    assert_int_equal(moe8_layer_create(&c, rs, "experts", &A), MOE8_OK);
    assert_int_equal(moe8_layer_init_random(A, 70 + it), MOE8_OK);
    assert_int_equal(moe8_layer_prepare(A), MOE8_OK);
    assert_int_equal(moe8_layer_create_inference(&c, rs, "experts", &B), MOE8_OK);
    assert_int_equal(moe8_layer_init_random(B, 1), MOE8_ERR_UNSUPPORTED);
    /* the router and the shared gate as for any layer */
    const moe8_weight_id small[] = {MOE8_W_ROUTER, MOE8_W_SHARED_GATE_W};
    for (size_t w = 0; w < 2; w++) {
      size_t na = 0, nb = 0;
      const float *src = moe8_layer_weight_read(A, small[w], &na);
      float *dst = moe8_layer_weight(B, small[w], &nb);
      assert_int_equal(na, nb);
      if (na) memcpy(dst, src, sizeof(float) * na);
    }
    float *gu = malloc(sizeof(float) * (size_t)(D * 2 * F)), *dn = malloc(sizeof(float) * (size_t)(F * D));
    const float *wg = moe8_layer_weight_read(A, MOE8_W_GATE, NULL), *wu = moe8_layer_weight_read(A, MOE8_W_UP, NULL);
    const float *wd = moe8_layer_weight_read(A, MOE8_W_DOWN, NULL);
    assert_int_equal(moe8_layer_put_expert(B, 0, E, gu, dn), MOE8_ERR_SHAPE);
    if (!shared) assert_int_equal(moe8_layer_put_expert(B, 1, 0, gu, dn), MOE8_ERR_SHAPE);
    for (int64_t e = E - 1; e >= 0; e--) { /* any order */
      for (int64_t d = 0; d < D; d++)
        for (int64_t f = 0; f < F; f++) {
          gu[d * 2 * F + f] = wg[(e * D + d) * F + f];
          gu[d * 2 * F + F + f] = wu[(e * D + d) * F + f];
        }
      memcpy(dn, wd + e * F * D, sizeof(float) * (size_t)(F * D));
      if (e == 2) { /* a bad expert is refused by name, and can be given again */
        const float keep = dn[5];
        dn[5] = NAN;
        assert_int_equal(moe8_layer_put_expert(B, 0, e, gu, dn), MOE8_ERR_NONFINITE);
        if (!strstr(moe8_last_error(), "expert 2")) TU_FAIL("the non-finite expert is not named: %s", moe8_last_error());
        dn[5] = keep;
      }
      assert_int_equal(moe8_layer_put_expert(B, 0, e, gu, dn), MOE8_OK);
      if (e == 1) assert_int_equal(moe8_layer_finish_load(B), MOE8_ERR_INVALID_ARG); /* expert 0 missing */
    }
    if (shared) {
      assert_int_equal(moe8_layer_finish_load(B), MOE8_ERR_INVALID_ARG); /* the shared one missing */
      const float *sg = moe8_layer_weight_read(A, MOE8_W_SHARED_GATE, NULL), *su = moe8_layer_weight_read(A, MOE8_W_SHARED_UP, NULL);
      for (int64_t d = 0; d < D; d++)
        for (int64_t f = 0; f < Fs; f++) {
          gu[d * 2 * Fs + f] = sg[d * Fs + f];
          gu[d * 2 * Fs + Fs + f] = su[d * Fs + f];
        }
      assert_int_equal(moe8_layer_put_expert(B, 1, 0, gu, moe8_layer_weight_read(A, MOE8_W_SHARED_DOWN, NULL)), MOE8_OK);
    }
    assert_int_equal(moe8_layer_finish_load(B), MOE8_OK);
    assert_int_equal(moe8_layer_put_expert(B, 0, 0, gu, dn), MOE8_ERR_INVALID_ARG); /* after the finish */
    assert_int_equal(moe8_layer_finish_load(B), MOE8_ERR_INVALID_ARG);
    /* a training layer's weights are its masters: no put_expert */
    assert_int_equal(moe8_layer_put_expert(A, 0, 0, gu, dn), MOE8_ERR_INVALID_ARG);
    float *x = malloc(sizeof(float) * (size_t)(T * D)), *ya = malloc(sizeof(float) * (size_t)(T * D)), *yb = malloc(sizeof(float) * (size_t)(T * D));
    tu_rng_reset(900 + it);
    tu_fill_normal(x, (size_t)(T * D), 1.0f);
    const size_t wa = moe8_layer_workspace_size(A, T), wb = moe8_layer_workspace_size(B, T);
    void *wsa = NULL, *wsb = NULL;
    assert_int_equal(posix_memalign(&wsa, 64, wa), 0);
    assert_int_equal(posix_memalign(&wsb, 64, wb), 0);
    assert_int_equal(moe8_layer_forward_fused(A, x, T, ya, wsa, wa), MOE8_OK);
    assert_int_equal(moe8_layer_forward_fused(B, x, T, yb, wsb, wb), MOE8_OK);
    if (memcmp(ya, yb, sizeof(float) * (size_t)(T * D)) != 0)
      TU_FAIL("rules %zu, shared %d, T = %lld: the layer built from memory differs from the training layer's bytes", i, (int)shared,
              (long long)T);
    free(wsa); free(wsb);
    free(x); free(ya); free(yb); free(gu); free(dn);
    moe8_layer_destroy(A);
    moe8_layer_destroy(B);
    moe8_rules_destroy(rs);
  }
}

static moe8_layer *layer_with(const char *rule_json, int64_t D, int64_t F) {
  moe8_rules *rs = NULL;
  if (rule_json) assert_int_equal(moe8_rules_parse(rule_json, strlen(rule_json), "inline", &rs), MOE8_OK);
  const moe8_layer_config c = {3, 1, D, F, MOE8_SCORE_SOFTMAX, false, 0, false, 0, 0};
  moe8_layer *L;
  assert_int_equal(moe8_layer_create(&c, rs, "experts", &L), MOE8_OK);
  moe8_rules_destroy(rs);
  assert_int_equal(moe8_layer_init_random(L, 5), MOE8_OK);
  assert_int_equal(moe8_layer_prepare(L), MOE8_OK);
  return L;
}

static void test_seed_b_table(void **state) {
  (void)state;
  moe8_prepared p;
  /* Weights untouched: no rule, no weight_qtype, e5m2. */
  const char *untouched[] = {NULL, "{\"rules\": [{\"module_path\": \"experts\", \"act_qtype\": \"int8\"}]}",
                             "{\"rules\": [{\"module_path\": \"experts\", \"weight_qtype\": \"float8_e5m2\"}]}"};
  for (int i = 0; i < 3; i++) {
    moe8_layer *L = layer_with(untouched[i], 32, 16);
    assert_int_equal(moe8_layer_prepared(L, &p), MOE8_OK);
    assert_int_equal(p.dtype, MOE8_DTYPE_F32);
    assert_null(p.s_gate_up);
    assert_memory_equal(p.w_down, moe8_layer_weight(L, MOE8_W_DOWN, NULL), sizeof(float) * 3 * 32 * 16);
    if (i == 2) assert_non_null(strstr(moe8_layer_describe(L), "notice"));
    moe8_layer_destroy(L);
  }
  /* e4m3 per-channel [E,1,1,N], tile 64 on K = 256 -> [E,4,1,N], i8 [E,1,1,N]:
  ** scales equal an independent column absmax, values within the bound. */
  static const struct { const char *json; moe8_dtype t; int64_t tile, nb_gu; double bound; } q[] = {
    {"{\"rules\": [{\"module_path\": \"experts\", \"weight_qtype\": \"float8_e4m3fn\"}]}", MOE8_DTYPE_F8E4M3, 0, 1, 1.0 / 16},
    {"{\"rules\": [{\"module_path\": \"experts\", \"weight_qtype\": \"float8_e4m3fn\", \"tile_size\": 64}]}", MOE8_DTYPE_F8E4M3, 64, 4, 1.0 / 16},
    {"{\"rules\": [{\"module_path\": \"experts\", \"weight_qtype\": \"int8\"}]}", MOE8_DTYPE_I8, 0, 1, 1.0 / 254},
  };
  const int64_t E = 3, D = 256, F = 24, N = 2 * F;
  for (int i = 0; i < 3; i++) {
    moe8_layer *L = layer_with(q[i].json, D, F);
    assert_int_equal(moe8_layer_prepared(L, &p), MOE8_OK);
    assert_int_equal(p.dtype, q[i].t);
    assert_int_equal(p.tile, q[i].tile);
    const float *wg = moe8_layer_weight(L, MOE8_W_GATE, NULL), *wu = moe8_layer_weight(L, MOE8_W_UP, NULL);
    const int64_t kb = q[i].tile ? q[i].tile : D;
    for (int64_t e = 0; e < E; e++)
      for (int64_t b = 0; b < q[i].nb_gu; b++)
        for (int64_t n = 0; n < N; n++) {
          float amax = 0;
          for (int64_t k = b * kb; k < (b + 1) * kb; k++) {
            const float v = n < F ? wg[(e * D + k) * F + n] : wu[(e * D + k) * F + n - F];
            amax = fabsf(v) > amax ? fabsf(v) : amax;
          }
          const float s = p.s_gate_up[(e * q[i].nb_gu + b) * N + n];
          assert_true(s == amax / moe8_dtype_info(q[i].t)->finite_max);
          for (int64_t k = b * kb; k < (b + 1) * kb; k++) {
            const float v = n < F ? wg[(e * D + k) * F + n] : wu[(e * D + k) * F + n - F];
            const uint8_t c = ((const uint8_t *)p.w_gate_up)[(e * D + k) * N + n];
            const float dq = (q[i].t == MOE8_DTYPE_I8 ? (float)(int8_t)c : moe8_f8e4m3_to_f32(c)) * s;
            assert_true(fabs((double)v - dq) <= amax * q[i].bound * (1 + 1e-6));
          }
        }
    moe8_layer_destroy(L);
  }
  /* The seed's function: a 2-D weight is an error naming its shape. */
  float w[16] = {0};
  uint8_t qq[16];
  float sc[16];
  moe8_quant_spec spec;
  const int64_t shape2[2] = {4, 4}, shape3[3] = {1, 4, 4};
  moe8_rule r = {.module_path = "experts", .weight_qtype = MOE8_DTYPE_F8E4M3, .weight_clip = 1, .act_clip = 1};
  assert_int_equal(moe8_expert_weight_quantize(&r, w, 2, shape2, qq, sc, &spec, NULL), MOE8_ERR_SHAPE);
  assert_non_null(strstr(moe8_last_error(), "2-D [4, 4]"));
  const char *notice;
  assert_int_equal(moe8_expert_weight_quantize(&r, w, 3, shape3, qq, sc, &spec, &notice), MOE8_OK);
  assert_int_equal(spec.qtype, MOE8_DTYPE_F8E4M3);
  assert_true(sc[0] == 1.0f); /* all-zero weight: scale 1 */
  r.weight_qtype = MOE8_DTYPE_F8E5M2;
  assert_int_equal(moe8_expert_weight_quantize(&r, w, 3, shape3, qq, sc, &spec, &notice), MOE8_OK);
  assert_int_equal(spec.qtype, MOE8_DTYPE_NONE);
  assert_non_null(strstr(notice, "not pre-quantized"));
  assert_int_equal(moe8_expert_weight_quantize(NULL, w, 3, shape3, qq, sc, &spec, &notice), MOE8_OK);
  assert_int_equal(spec.qtype, MOE8_DTYPE_NONE);
}

static void test_bad_input(void **state) {
  (void)state;
  moe8_layer *L = NULL;
  moe8_layer_config c = {4, 5, 8, 8, MOE8_SCORE_SOFTMAX, false, 0, false, 0, 0};
  assert_int_equal(moe8_layer_create(&c, NULL, NULL, &L), MOE8_ERR_SHAPE);
  assert_non_null(strstr(moe8_last_error(), "top_k = 5"));
  c.top_k = 0;
  assert_int_equal(moe8_layer_create(&c, NULL, NULL, &L), MOE8_ERR_SHAPE);
  c.top_k = 2; c.hidden = 0;
  assert_int_equal(moe8_layer_create(&c, NULL, NULL, &L), MOE8_ERR_SHAPE);
  /* sizes whose products overflow: refused before any allocation */
  moe8_layer_config big = c;
  big.num_experts = 4096; big.hidden = (int64_t)1 << 40; big.ffn = (int64_t)1 << 40;
  assert_int_equal(moe8_layer_create(&big, NULL, NULL, &L), MOE8_ERR_SHAPE);
  assert_non_null(strstr(moe8_last_error(), "overflow"));
  big.hidden = 8; big.ffn = 8; big.shared_ffn = (int64_t)1 << 62;
  assert_int_equal(moe8_layer_create(&big, NULL, NULL, &L), MOE8_ERR_SHAPE);
  big.shared_ffn = -1;
  assert_int_equal(moe8_layer_create(&big, NULL, NULL, &L), MOE8_ERR_SHAPE);
  big.shared_ffn = 0; big.n_group = 3;
  assert_int_equal(moe8_layer_create(&big, NULL, NULL, &L), MOE8_ERR_SHAPE);
  assert_non_null(strstr(moe8_last_error(), "n_group"));
  c.hidden = 8;
  run u;
  run_init(&u, &c, NULL, 5, 1);
  u.x[7] = NAN; u.x[9] = INFINITY;
  for (int i = 0; i < u.T * u.D; i++) u.out[i] = 123.0f;
  assert_int_equal(moe8_layer_forward(u.L, u.x, u.T, u.out, NULL, u.ws, u.ws_size), MOE8_ERR_NONFINITE);
  assert_non_null(strstr(moe8_last_error(), "input x [5, 8] has 2 non-finite"));
  assert_true(u.out[0] == 123.0f); /* nothing written */
  u.x[7] = u.x[9] = 0.0f;
  moe8_layer_weight(u.L, MOE8_W_GATE, NULL)[3] = -INFINITY;
  assert_int_equal(moe8_layer_forward(u.L, u.x, u.T, u.out, NULL, u.ws, u.ws_size), MOE8_ERR_NONFINITE);
  assert_non_null(strstr(moe8_last_error(), "gate weight Wg has 1 non-finite"));
  assert_int_equal(moe8_layer_prepare(u.L), MOE8_ERR_NONFINITE);
  moe8_layer_weight(u.L, MOE8_W_GATE, NULL)[3] = 0.0f;
  assert_int_equal(moe8_layer_forward(u.L, u.x, u.T, u.out, NULL, u.ws, u.ws_size - 64), MOE8_ERR_INVALID_ARG);
  assert_non_null(strstr(moe8_last_error(), "workspace"));
  assert_int_equal(moe8_layer_forward(u.L, u.x, 0, u.out, NULL, u.ws, u.ws_size), MOE8_OK); /* T = 0 */
  assert_int_equal(moe8_layer_forward(u.L, u.x, 1, u.out, NULL, u.ws, u.ws_size), MOE8_OK); /* T = 1 */
  assert_null(moe8_layer_weight(u.L, MOE8_W_BIAS, NULL));
  run_free(&u);
  moe8_layer_destroy(NULL);
}

/* A shorter version of 'moe8 train': 60 Adam steps must halve the loss, in
** f32 and with FP8 weights and activations (quantization-aware). */
/* Non-finite outputs are an error naming the layer and token, unless asked for. */
static void test_nonfinite_output(void **state) {
  (void)state;
  const moe8_layer_config c = {4, 2, 8, 6, MOE8_SCORE_SOFTMAX, true, 0, false, 0, 0};
  overflow_run o;
  overflow_forward(&o, &c, "model.layers.7.mlp.experts", MOE8_W_DOWN, 3); /* finite weights, an output that overflows */
  moe8_layer *L = o.L;
  float *x = o.x, *y = o.y;
  void *ws = o.ws;
  const size_t wsz = o.wsz;
  moe8_layer_set_allow_nonfinite(L, true);
  assert_int_equal(moe8_layer_forward(L, x, 3, y, NULL, ws, wsz), MOE8_OK);
  free(ws);
  moe8_layer_destroy(L);
}

static void test_training_reduces_loss(void **state) {
  (void)state;
  const moe8_layer_config c = {4, 2, 16, 16, MOE8_SCORE_SOFTMAX, true, 0, false, 0, 0};
  for (int fp8 = 0; fp8 < 2; fp8++) {
    moe8_rules *rs = fp8 ? fp8_rules(NULL, 1, true) : NULL;
    moe8_layer *teacher, *student;
    moe8_trainer *tr;
    assert_int_equal(moe8_layer_create(&c, NULL, "teacher", &teacher), MOE8_OK);
    assert_int_equal(moe8_layer_init_random(teacher, 11), MOE8_OK);
    assert_int_equal(moe8_layer_create(&c, rs, "experts", &student), MOE8_OK);
    assert_int_equal(moe8_layer_init_random(student, 22), MOE8_OK);
    assert_int_equal(moe8_trainer_create(student, 0.05f, &tr), MOE8_OK);
    const int64_t T = 128;
    const size_t wsz = moe8_layer_workspace_size(student, T);
    void *ws;
    assert_int_equal(posix_memalign(&ws, 64, wsz), 0);
    float *x = malloc(sizeof(float) * (size_t)(T * 16)), *y = malloc(sizeof(float) * (size_t)(T * 16)), first = 0, last = 0;
    tu_rng_reset(99);
    for (int s = 0; s < 60; s++) {
      tu_fill_normal(x, (size_t)(T * 16), 1.0f);
      assert_int_equal(moe8_layer_forward(teacher, x, T, y, NULL, ws, wsz), MOE8_OK);
      assert_int_equal(moe8_trainer_step(tr, x, y, T, &last, ws, wsz), MOE8_OK);
      if (s == 0) first = last;
    }
    if (!(last < 0.5f * first)) TU_FAIL("%s training: loss %g -> %g, want below half", fp8 ? "fp8" : "f32", (double)first, (double)last);
    assert_int_equal(moe8_trainer_set_lr(tr, 2.0f), MOE8_ERR_INVALID_ARG);
    free(x); free(y); free(ws);
    moe8_trainer_destroy(tr);
    moe8_layer_destroy(student);
    moe8_layer_destroy(teacher);
    moe8_rules_destroy(rs);
  }
}

/* GPT-OSS's expert form (router bias, expert biases, the clamped SwiGLU
** with a limit that binds): every gradient of the single-process backward,
** the biases' included, against central finite differences of the layer's
** own f32 forward (loss = Σ dout · y in double). */
static const int32_t *g_form_tok; /* the token ids of a hash-routed layer's forwards (NULL: none) */

static double form_loss(moe8_layer *L, const float *x, const float *dout, int64_t T, int64_t D, void *ws, size_t wsz) {
  float *y = malloc(sizeof(float) * (size_t)(T * D)), aux;
  assert_int_equal(moe8_layer_forward_tokens(L, x, T, g_form_tok, y, &aux, ws, wsz), MOE8_OK);
  double l = 0;
  for (int64_t i = 0; i < T * D; i++) l += (double)dout[i] * y[i];
  free(y);
  return l;
}

/* Random x and dout [T, D] from seed, a workspace (*ws, *wsz; the caller
** frees it), the layer's training forward and its backward into g. */
static void form_backward(moe8_layer *L, float *x, float *dout, int64_t T, int64_t D, uint64_t seed, const moe8_layer_grads *g, void **ws,
                          size_t *wsz) {
  tu_rng_reset(seed);
  tu_fill_normal(x, (size_t)(T * D), 1.0f);
  tu_fill_normal(dout, (size_t)(T * D), 1.0f);
  *wsz = moe8_layer_workspace_size(L, T);
  assert_int_equal(posix_memalign(ws, 64, *wsz), 0);
  (void)form_loss(L, x, dout, T, D, *ws, *wsz);
  assert_int_equal(moe8_layer_backward(L, x, T, dout, *ws, *wsz, g), MOE8_OK);
}

/* The gradients in t[] against central finite differences of the
** layer's own f32 forward, 16 sampled elements each (a sample whose step
** crosses a kink, a clamp bound or a change of the chosen experts, has
** one-sided slopes that disagree and is skipped; at most 1 in 9 may be). */
typedef struct form_grad { const char *name; float *v; size_t n; const float *g; } form_grad;

static void form_fd_check(const char *form, moe8_layer *L, const float *x, const float *dout, int64_t T, int64_t D, void *ws, size_t wsz,
                          const form_grad *t, size_t nt) {
  const double l0 = form_loss(L, x, dout, T, D, ws, wsz);
  int used = 0, skipped = 0;
  for (size_t i = 0; i < nt; i++) {
    double gmax = 0;
    for (size_t j = 0; j < t[i].n; j++) gmax = fabs(t[i].g[j]) > gmax ? fabs(t[i].g[j]) : gmax;
    for (int s2 = 0; s2 < 16; s2++) {
      const size_t j = (size_t)((tu_u64() >> 11) % t[i].n);
      const float keep = t[i].v[j];
      const float eps = 2e-3f * (fabsf(keep) > 1.0f ? fabsf(keep) : 1.0f);
      t[i].v[j] = keep + eps;
      moe8_layer_weights_changed(L);
      const double lp = form_loss(L, x, dout, T, D, ws, wsz);
      t[i].v[j] = keep - eps;
      moe8_layer_weights_changed(L);
      const double lm = form_loss(L, x, dout, T, D, ws, wsz);
      t[i].v[j] = keep;
      moe8_layer_weights_changed(L);
      const double fd = (lp - lm) / (2.0 * (double)eps), fdp = (lp - l0) / (double)eps, fdm = (l0 - lm) / (double)eps;
      if (fabs(fdp - fdm) > 0.05 * (fabs(fdp) + fabs(fdm)) + 1e-3 * gmax) { skipped++; continue; }
      used++;
      if (fabs(fd - t[i].g[j]) > 2e-2 * (fabs(fd) + gmax) + 1e-5)
        TU_FAIL("%s: d loss / d %s[%zu] = %g, finite differences %g", form, t[i].name, j, (double)t[i].g[j], fd);
    }
  }
  if (skipped * 8 > used) TU_FAIL("%s: %d of %d samples at a kink", form, skipped, used + skipped);
}

static void test_gpt_oss_form_grads(void **state) {
  (void)state;
  enum { E = 4, K = 2, D = 32, F = 16, T = 6 };
  moe8_layer_config c = {.num_experts = E, .top_k = K, .hidden = D, .ffn = F, .norm_topk_prob = true, .act = MOE8_ACT_SWIGLU_CLAMP,
                         .act_alpha = 1.702f, .act_limit = 0.35f, .router_bias = true, .expert_bias = true};
  moe8_layer *L;
  assert_int_equal(moe8_layer_create(&c, NULL, "experts", &L), MOE8_OK);
  assert_int_equal(moe8_layer_init_random(L, 8), MOE8_OK);
  const moe8_weight_id bids[3] = {MOE8_W_ROUTER_BIAS, MOE8_W_GU_BIAS, MOE8_W_DOWN_BIAS};
  for (int b = 0; b < 3; b++) {
    size_t n;
    float *w = moe8_layer_weight(L, bids[b], &n);
    tu_rng_reset(60 + (uint64_t)b);
    tu_fill_normal(w, n, 0.3f);
  }
  static float x[T * D], dout[T * D];
  static float dx[T * D], dwr[D * E], dwg[E * D * F], dwu[E * D * F], dwd[E * F * D], drb[E], dgub[E * 2 * F], ddb[E * D];
  const moe8_layer_grads g = {.dx = dx, .dwr = dwr, .dwg = dwg, .dwu = dwu, .dwd = dwd, .dwrb = drb, .dwgub = dgub, .dwdb = ddb};
  void *ws;
  size_t wsz;
  form_backward(L, x, dout, T, D, 61, &g, &ws, &wsz);
  const form_grad t[] = {
    {"x", x, T * D, dx}, {"router", moe8_layer_weight(L, MOE8_W_ROUTER, NULL), D * E, dwr},
    {"gate", moe8_layer_weight(L, MOE8_W_GATE, NULL), E * D * F, dwg}, {"up", moe8_layer_weight(L, MOE8_W_UP, NULL), E * D * F, dwu},
    {"down", moe8_layer_weight(L, MOE8_W_DOWN, NULL), E * F * D, dwd}, {"router bias", moe8_layer_weight(L, MOE8_W_ROUTER_BIAS, NULL), E, drb},
    {"gate/up bias", moe8_layer_weight(L, MOE8_W_GU_BIAS, NULL), E * 2 * F, dgub}, {"down bias", moe8_layer_weight(L, MOE8_W_DOWN_BIAS, NULL), E * D, ddb}};
  form_fd_check("gpt_oss form", L, x, dout, T, D, ws, wsz, t, sizeof t / sizeof t[0]);
  int nonzero = 0; /* the biases' gradients are there */
  for (size_t i = 5; i < sizeof t / sizeof t[0]; i++)
    for (size_t j = 0; j < t[i].n; j++) nonzero += t[i].g[j] != 0.0f;
  assert_true(nonzero > 0);
  /* the clamp binds: some gate/up pre-activations are past the limit (their gradient 0) */
  size_t zeros = 0;
  for (size_t j = 0; j < E * 2 * F; j++) zeros += dgub[j] == 0.0f;
  assert_true(zeros > 0);
  free(ws);
  moe8_layer_destroy(L);
}

/* The limited SwiGLU (GLM-5, HY-V4): silu(min(g, L)) * clamp(u, +-L), in
** the routed experts and, unless shared_plain_act (HY-V4), the shared
** expert: every gradient against finite differences, with a limit that
** binds (the forward differs from the plain SwiGLU's and from the other
** shared form's). */
static void test_limited_form_grads(void **state) {
  (void)state;
  enum { E = 4, K = 2, D = 32, F = 16, FS = 24, T = 6 };
  static float out[3][T * D];
  for (int plain = 0; plain < 2; plain++) {
    moe8_layer_config c = {.num_experts = E, .top_k = K, .hidden = D, .ffn = F, .norm_topk_prob = true, .act = MOE8_ACT_SWIGLU_LIMIT,
                           .act_limit = 0.35f, .shared_ffn = FS, .shared_plain_act = plain == 1};
    moe8_layer *L;
    assert_int_equal(moe8_layer_create(&c, NULL, "experts", &L), MOE8_OK);
    assert_int_equal(moe8_layer_init_random(L, 9), MOE8_OK);
    static float x[T * D], dout[T * D];
    static float dx[T * D], dwr[D * E], dwg[E * D * F], dwu[E * D * F], dwd[E * F * D], dsg[D * FS], dsu[D * FS], dsd[FS * D];
    const moe8_layer_grads g = {.dx = dx, .dwr = dwr, .dwg = dwg, .dwu = dwu, .dwd = dwd, .dwsg = dsg, .dwsu = dsu, .dwsd = dsd};
    void *ws;
    size_t wsz;
    form_backward(L, x, dout, T, D, 71, &g, &ws, &wsz);
    const form_grad t[] = {
      {"x", x, T * D, dx}, {"router", moe8_layer_weight(L, MOE8_W_ROUTER, NULL), D * E, dwr},
      {"gate", moe8_layer_weight(L, MOE8_W_GATE, NULL), E * D * F, dwg}, {"up", moe8_layer_weight(L, MOE8_W_UP, NULL), E * D * F, dwu},
      {"down", moe8_layer_weight(L, MOE8_W_DOWN, NULL), E * F * D, dwd},
      {"shared gate", moe8_layer_weight(L, MOE8_W_SHARED_GATE, NULL), D * FS, dsg},
      {"shared up", moe8_layer_weight(L, MOE8_W_SHARED_UP, NULL), D * FS, dsu},
      {"shared down", moe8_layer_weight(L, MOE8_W_SHARED_DOWN, NULL), FS * D, dsd}};
    form_fd_check(plain ? "limited SwiGLU, shared expert plain" : "limited SwiGLU", L, x, dout, T, D, ws, wsz, t, sizeof t / sizeof t[0]);
    float aux;
    assert_int_equal(moe8_layer_forward(L, x, T, out[plain], &aux, ws, wsz), MOE8_OK);
    if (!plain) { /* the same weights with the plain SwiGLU everywhere */
      moe8_layer_config cp = c;
      cp.act = MOE8_ACT_SWIGLU;
      moe8_layer *P;
      assert_int_equal(moe8_layer_create(&cp, NULL, "experts", &P), MOE8_OK);
      assert_int_equal(moe8_layer_init_random(P, 9), MOE8_OK);
      assert_int_equal(moe8_layer_forward(P, x, T, out[2], &aux, ws, wsz), MOE8_OK);
      moe8_layer_destroy(P);
    }
    free(ws);
    moe8_layer_destroy(L);
  }
  assert_true(memcmp(out[0], out[2], sizeof out[0]) != 0); /* the limit binds */
  assert_true(memcmp(out[0], out[1], sizeof out[0]) != 0); /* shared_plain_act changes the shared expert */
}

/* DeepSeek-V4's block: sqrt-softplus scores, the weights / (sum + 1e-20)
** times 1.5, the limited SwiGLU in the routed and the shared expert;
** routed by score + bias, or by a hash table of token ids (a repeated
** expert in a row).  Every gradient (the router's through the score's
** derivative) against finite differences; the hash layer's forward is, to
** the byte, the experts op given the table's ids and the scores' weights
** computed here; the fused forward the same bytes; the trainer's step;
** what is refused, by name. */
static void test_dsv4_form(void **state) {
  (void)state;
  enum { E = 8, K = 3, D = 32, F = 16, T = 7, V = 5 };
  static const int32_t table[V * K] = {2, 2, 5, 0, 7, 1, 3, 4, 6, 1, 0, 2, 6, 5, 7};
  static const int32_t tok[T] = {0, 4, 2, 0, 1, 3, 4};
  for (int hash = 0; hash < 2; hash++) {
    moe8_layer_config c = {.num_experts = E, .top_k = K, .hidden = D, .ffn = F, .score = MOE8_SCORE_SQRTSOFTPLUS, .norm_topk_prob = true,
                           .routed_scaling_factor = 1.5f, .norm_eps = 1e-20f, .use_selection_bias = !hash, .act = MOE8_ACT_SWIGLU_LIMIT,
                           .act_limit = 0.35f, .shared_ffn = F, .hash_routing = hash == 1};
    moe8_layer *L;
    assert_int_equal(moe8_layer_create(&c, NULL, "experts", &L), MOE8_OK);
    assert_int_equal(moe8_layer_init_random(L, 21), MOE8_OK);
    if (hash) assert_int_equal(moe8_layer_set_hash_table(L, table, V), MOE8_OK);
    else {
      float *b = moe8_layer_weight(L, MOE8_W_BIAS, NULL);
      tu_rng_reset(22);
      tu_fill_normal(b, E, 0.3f);
    }
    float *wr = moe8_layer_weight(L, MOE8_W_ROUTER, NULL);
    for (int i = 0; i < D * E; i++) wr[i] *= 3.0f; /* logits of a few units: the score's curve, not its asymptotes */
    moe8_layer_weights_changed(L);
    g_form_tok = hash ? tok : NULL;
    static float x[T * D], dout[T * D];
    static float dx[T * D], dwr[D * E], dwg[E * D * F], dwu[E * D * F], dwd[E * F * D], dsg[D * F], dsu[D * F], dsd[F * D];
    const moe8_layer_grads g = {.dx = dx, .dwr = dwr, .dwg = dwg, .dwu = dwu, .dwd = dwd, .dwsg = dsg, .dwsu = dsu, .dwsd = dsd};
    void *ws;
    size_t wsz;
    form_backward(L, x, dout, T, D, 23 + (uint64_t)hash, &g, &ws, &wsz);
    const form_grad t[] = {
      {"x", x, T * D, dx}, {"router", moe8_layer_weight(L, MOE8_W_ROUTER, NULL), D * E, dwr},
      {"gate", moe8_layer_weight(L, MOE8_W_GATE, NULL), E * D * F, dwg}, {"up", moe8_layer_weight(L, MOE8_W_UP, NULL), E * D * F, dwu},
      {"down", moe8_layer_weight(L, MOE8_W_DOWN, NULL), E * F * D, dwd},
      {"shared gate", moe8_layer_weight(L, MOE8_W_SHARED_GATE, NULL), D * F, dsg},
      {"shared up", moe8_layer_weight(L, MOE8_W_SHARED_UP, NULL), D * F, dsu},
      {"shared down", moe8_layer_weight(L, MOE8_W_SHARED_DOWN, NULL), F * D, dsd}};
    form_fd_check(hash ? "DeepSeek-V4 hash layer" : "DeepSeek-V4 layer", L, x, dout, T, D, ws, wsz, t, sizeof t / sizeof t[0]);
    static float y[T * D], y2[T * D], lg[T * E], rw[T * K];
    static int32_t rid[T * K];
    float aux;
    assert_int_equal(moe8_layer_forward_tokens(L, x, T, g_form_tok, y, &aux, ws, wsz), MOE8_OK);
    if (hash) {
      /* the reference routing: the table's rows, sqrt(softplus) of the logits, / (sum + 1e-20) x 1.5 */
      assert_int_equal(moe8_router_logits(x, moe8_layer_weight_read(L, MOE8_W_ROUTER, NULL), T, D, E, lg), MOE8_OK);
      for (int tt = 0; tt < T; tt++) {
        float sum = 0.0f;
        for (int j = 0; j < K; j++) {
          const float l = lg[tt * E + table[tok[tt] * K + j]];
          rid[tt * K + j] = table[tok[tt] * K + j];
          rw[tt * K + j] = sqrtf(l > 20.0f ? l : log1pf(expf(l)));
          sum += rw[tt * K + j];
        }
        sum += 1e-20f;
        for (int j = 0; j < K; j++) rw[tt * K + j] = rw[tt * K + j] / sum * 1.5f;
      }
      void *ws2;
      assert_int_equal(posix_memalign(&ws2, 64, wsz), 0);
      assert_int_equal(moe8_layer_experts(L, x, T, rid, rw, y2, ws2, wsz), MOE8_OK);
      assert_memory_equal(y, y2, sizeof y);
      /* refused: a forward without the ids, an id past the table, a bad table, a bias with hash routing */
      assert_int_equal(moe8_layer_forward(L, x, T, y2, &aux, ws2, wsz), MOE8_ERR_INVALID_ARG);
      assert_non_null(strstr(moe8_last_error(), "routes by token id (hash routing): its forward needs the tokens' ids"));
      const int32_t badtok[T] = {0, 1, 2, 3, 4, 5, 0};
      assert_int_equal(moe8_layer_forward_tokens(L, x, T, badtok, y2, &aux, ws2, wsz), MOE8_ERR_INVALID_ARG);
      assert_non_null(strstr(moe8_last_error(), "token 5 has id 5, outside its hash table's [0, 5)"));
      int32_t badtab[V * K];
      memcpy(badtab, table, sizeof badtab);
      badtab[4] = E;
      assert_int_equal(moe8_layer_set_hash_table(L, badtab, V), MOE8_ERR_INVALID_ARG);
      assert_non_null(strstr(moe8_last_error(), "element [1, 1] (offset 4) = 8 is not an expert id in [0, 8)"));
      int64_t vv = 0;
      assert_true(moe8_layer_hash_table(L, &vv) != NULL && vv == V && moe8_layer_hash_table(L, NULL)[4] == table[4]); /* kept */
      moe8_layer_config cb = c;
      cb.use_selection_bias = true;
      moe8_layer *B = NULL;
      assert_int_equal(moe8_layer_create(&cb, NULL, "experts", &B), MOE8_ERR_INVALID_ARG);
      assert_non_null(strstr(moe8_last_error(), "hash routing"));
      /* a hash layer without its table */
      assert_int_equal(moe8_layer_create(&c, NULL, "experts", &B), MOE8_OK);
      assert_int_equal(moe8_layer_forward_tokens(B, x, T, tok, y2, &aux, ws2, wsz), MOE8_ERR_INVALID_ARG);
      assert_non_null(strstr(moe8_last_error(), "has no table"));
      moe8_layer_destroy(B);
      /* the fused forward: the same bytes */
      assert_int_equal(moe8_layer_prepare(L), MOE8_OK);
      assert_int_equal(moe8_layer_forward_fused_tokens(L, x, T, tok, y2, ws2, wsz), MOE8_OK);
      assert_memory_equal(y, y2, sizeof y);
      assert_int_equal(moe8_layer_forward_fused(L, x, T, y2, ws2, wsz), MOE8_ERR_INVALID_ARG);
      /* the trainer: refused without the ids, a step with them */
      moe8_trainer *tr;
      float loss;
      assert_int_equal(moe8_trainer_create(L, 1e-3f, &tr), MOE8_OK);
      assert_int_equal(moe8_trainer_step(tr, x, dout, T, &loss, ws2, wsz), MOE8_ERR_INVALID_ARG);
      assert_int_equal(moe8_trainer_step_tokens(tr, x, tok, dout, T, &loss, ws2, wsz), MOE8_OK);
      assert_true(isfinite(loss) && loss > 0.0f);
      moe8_trainer_destroy(tr);
      free(ws2);
    } else {
      /* a layer without hash routing does not read token ids, and takes no table */
      assert_int_equal(moe8_layer_forward(L, x, T, y2, &aux, ws, wsz), MOE8_OK);
      assert_memory_equal(y, y2, sizeof y);
      assert_int_equal(moe8_layer_set_hash_table(L, table, V), MOE8_ERR_INVALID_ARG);
    }
    g_form_tok = NULL;
    free(ws);
    moe8_layer_destroy(L);
  }
}

/* The output forms: JetMoE's output bias (out + b [D], after the routed
** sum and the shared expert).  The forward is the layer without it plus
** b, to the byte; the fused forward gives the same bytes; every gradient,
** the bias's included, against finite differences. */
static void test_output_forms(void **state) {
  (void)state;
  enum { E = 4, K = 2, D = 32, F = 16, FS = 24, T = 6 };
  static float x[T * D], dout[T * D], y0[T * D], y1[T * D], y2[T * D];
  static float dx[T * D], dwr[D * E], dwg[E * D * F], dwu[E * D * F], dwd[E * F * D], dsg[D * FS], dsu[D * FS], dsd[FS * D], dob[D];
  moe8_layer_config c = {.num_experts = E, .top_k = K, .hidden = D, .ffn = F, .norm_topk_prob = true, .shared_ffn = FS, .out_bias = true};
  moe8_layer_config c0 = c;
  c0.out_bias = false;
  moe8_layer *L, *L0;
  assert_int_equal(moe8_layer_create(&c, NULL, "experts", &L), MOE8_OK);
  assert_int_equal(moe8_layer_create(&c0, NULL, "experts", &L0), MOE8_OK);
  assert_int_equal(moe8_layer_init_random(L, 12), MOE8_OK);
  assert_int_equal(moe8_layer_init_random(L0, 12), MOE8_OK);
  assert_null(moe8_layer_weight_read(L0, MOE8_W_OUT_BIAS, NULL));
  size_t nb = 0;
  float *b = moe8_layer_weight(L, MOE8_W_OUT_BIAS, &nb);
  assert_non_null(b);
  assert_int_equal(nb, D);
  tu_rng_reset(13);
  tu_fill_normal(b, D, 0.5f);
  const moe8_layer_grads g = {.dx = dx, .dwr = dwr, .dwg = dwg, .dwu = dwu, .dwd = dwd, .dwsg = dsg, .dwsu = dsu, .dwsd = dsd, .dwob = dob};
  void *ws;
  size_t wsz;
  form_backward(L, x, dout, T, D, 14, &g, &ws, &wsz);
  float aux;
  assert_int_equal(moe8_layer_forward(L, x, T, y1, &aux, ws, wsz), MOE8_OK);
  assert_int_equal(moe8_layer_forward(L0, x, T, y0, &aux, ws, wsz), MOE8_OK);
  for (int i = 0; i < T * D; i++)
    if (moe8__f32_bits(y1[i]) != moe8__f32_bits(y0[i] + b[i % D])) TU_FAIL("out_bias: element %d is %a, want %a", i, (double)y1[i], (double)(y0[i] + b[i % D]));
  for (int d = 0; d < D; d++) { /* its gradient: dout summed over the tokens, in order */
    float s = 0.0f;
    for (int t = 0; t < T; t++) s += dout[t * D + d];
    if (moe8__f32_bits(dob[d]) != moe8__f32_bits(s)) TU_FAIL("out_bias gradient %d is %a, want %a", d, (double)dob[d], (double)s);
  }
  const form_grad t[] = {
    {"x", x, T * D, dx}, {"router", moe8_layer_weight(L, MOE8_W_ROUTER, NULL), D * E, dwr},
    {"gate", moe8_layer_weight(L, MOE8_W_GATE, NULL), E * D * F, dwg}, {"down", moe8_layer_weight(L, MOE8_W_DOWN, NULL), E * F * D, dwd},
    {"shared down", moe8_layer_weight(L, MOE8_W_SHARED_DOWN, NULL), FS * D, dsd}, {"output bias", b, D, dob}};
  form_fd_check("out_bias", L, x, dout, T, D, ws, wsz, t, sizeof t / sizeof t[0]);
  assert_int_equal(moe8_layer_prepare(L), MOE8_OK);
  assert_int_equal(moe8_layer_forward_fused(L, x, T, y2, ws, wsz), MOE8_OK);
  assert_memory_equal(y1, y2, sizeof y1);
  free(ws);
  moe8_layer_destroy(L);
  moe8_layer_destroy(L0);
  /* DBRX's p-norm (norm_p): the router's weights to the byte, the refusals,
  ** and the gradients against finite differences for p = 2.5 and 0.5 */
  {
    enum { TR = 16, KR = 3 };
    static float logits[TR * E * 2], sc[TR * E * 2], wt[TR * KR];
    static int32_t ids[TR * KR];
    tu_rng_reset(15);
    tu_fill_normal(logits, TR * 2 * E, 0.8f);
    const moe8_router_config rc = {.num_experts = 2 * E, .top_k = KR, .score = MOE8_SCORE_SOFTMAX, .norm_topk_prob = true, .norm_p = 2.5f};
    assert_int_equal(moe8_route(&rc, logits, TR, sc, ids, wt), MOE8_OK);
    for (int tk = 0; tk < TR; tk++) {
      float sp = 0.0f, sum = 0.0f;
      for (int j = 0; j < KR; j++) { sp += powf(sc[tk * 2 * E + ids[tk * KR + j]], 2.5f); sum += wt[tk * KR + j]; }
      const float nrm = powf(sp, 1.0f / 2.5f);
      for (int j = 0; j < KR; j++)
        if (moe8__f32_bits(wt[tk * KR + j]) != moe8__f32_bits(sc[tk * 2 * E + ids[tk * KR + j]] / nrm)) TU_FAIL("norm_p: token %d weight %d", tk, j);
      if (!(sum > 1.0f)) TU_FAIL("norm_p 2.5: token %d's weights sum to %g (a p-norm above 1 leaves them above 1)", tk, (double)sum);
    }
    moe8_router_config bad = rc;
    bad.norm_p = -2.0f;
    assert_int_equal(moe8_route(&bad, logits, TR, sc, ids, wt), MOE8_ERR_INVALID_ARG);
    bad.norm_p = 2.0f;
    bad.norm_eps = 1e-6f;
    assert_int_equal(moe8_route(&bad, logits, TR, sc, ids, wt), MOE8_ERR_INVALID_ARG);
    moe8_layer_config cb = {.num_experts = E, .top_k = K, .hidden = D, .ffn = F, .norm_topk_prob = true, .norm_p = -1.0f};
    moe8_layer *B = NULL;
    assert_int_equal(moe8_layer_create(&cb, NULL, "experts", &B), MOE8_ERR_INVALID_ARG);
    for (int v = 0; v < 2; v++) {
      moe8_layer_config cp = {.num_experts = E, .top_k = K, .hidden = D, .ffn = F, .norm_topk_prob = true, .norm_p = v ? 0.5f : 2.5f};
      moe8_layer *P;
      assert_int_equal(moe8_layer_create(&cp, NULL, "experts", &P), MOE8_OK);
      assert_int_equal(moe8_layer_init_random(P, 16), MOE8_OK);
      const moe8_layer_grads gp = {.dx = dx, .dwr = dwr, .dwg = dwg, .dwd = dwd};
      form_backward(P, x, dout, T, D, 17, &gp, &ws, &wsz);
      const form_grad tp[] = {{"x", x, T * D, dx}, {"router", moe8_layer_weight(P, MOE8_W_ROUTER, NULL), D * E, dwr},
                              {"gate", moe8_layer_weight(P, MOE8_W_GATE, NULL), E * D * F, dwg}};
      form_fd_check(v ? "norm_p 0.5" : "norm_p 2.5", P, x, dout, T, D, ws, wsz, tp, sizeof tp / sizeof tp[0]);
      free(ws);
      moe8_layer_destroy(P);
    }
  }
  /* Cohere2-MoE's "average": routed_scaling_factor 0.5 and shared_scale
  ** 0.5 give (routed + shared) / 2, the plain block's output halved to the
  ** byte; every gradient against finite differences */
  {
    moe8_layer_config ca = {.num_experts = E, .top_k = K, .hidden = D, .ffn = F, .norm_topk_prob = true, .shared_ffn = FS,
                            .routed_scaling_factor = 0.5f, .shared_scale = 0.5f};
    moe8_layer_config cs = ca;
    cs.routed_scaling_factor = 0.0f;
    cs.shared_scale = 0.0f;
    moe8_layer *A, *S;
    assert_int_equal(moe8_layer_create(&ca, NULL, "experts", &A), MOE8_OK);
    assert_int_equal(moe8_layer_create(&cs, NULL, "experts", &S), MOE8_OK);
    assert_int_equal(moe8_layer_init_random(A, 18), MOE8_OK);
    assert_int_equal(moe8_layer_init_random(S, 18), MOE8_OK);
    const moe8_layer_grads ga = {.dx = dx, .dwr = dwr, .dwg = dwg, .dwd = dwd, .dwsg = dsg, .dwsu = dsu, .dwsd = dsd};
    form_backward(A, x, dout, T, D, 19, &ga, &ws, &wsz);
    assert_int_equal(moe8_layer_forward(A, x, T, y1, &aux, ws, wsz), MOE8_OK);
    assert_int_equal(moe8_layer_forward(S, x, T, y0, &aux, ws, wsz), MOE8_OK);
    for (int i = 0; i < T * D; i++)
      if (moe8__f32_bits(y1[i]) != moe8__f32_bits(0.5f * y0[i])) TU_FAIL("average: element %d is %a, want %a", i, (double)y1[i], (double)(0.5f * y0[i]));
    const form_grad ta[] = {{"x", x, T * D, dx}, {"router", moe8_layer_weight(A, MOE8_W_ROUTER, NULL), D * E, dwr},
                            {"down", moe8_layer_weight(A, MOE8_W_DOWN, NULL), E * F * D, dwd},
                            {"shared gate", moe8_layer_weight(A, MOE8_W_SHARED_GATE, NULL), D * FS, dsg},
                            {"shared down", moe8_layer_weight(A, MOE8_W_SHARED_DOWN, NULL), FS * D, dsd}};
    form_fd_check("average", A, x, dout, T, D, ws, wsz, ta, sizeof ta / sizeof ta[0]);
    free(ws);
    moe8_layer_destroy(A);
    moe8_layer_destroy(S);
  }
}

/* The SwiGLU clamped after the activation (Step-3.5/3.7): min(silu(g), L)
** * clamp(u, +-L), the routed experts' L act_limit, the shared expert's
** shared_act_limit (0: no clamp): every gradient against finite
** differences with limits that bind, for both (0.3, 0.2), the routed only
** (0.3, 0) and the shared only (0, 0.2); the forward differs from the
** plain SwiGLU's where a limit binds, and at (0, 0) it is the plain
** SwiGLU's bytes. */
static void test_post_form_grads(void **state) {
  (void)state;
  enum { E = 4, K = 2, D = 32, F = 16, FS = 24, T = 6 };
  static const float lims[4][2] = {{0.12f, 0.08f}, {0.12f, 0.0f}, {0.0f, 0.08f}, {0.0f, 0.0f}};
  static float out[5][T * D];
  for (int v = 0; v < 5; v++) {
    moe8_layer_config c = {.num_experts = E, .top_k = K, .hidden = D, .ffn = F, .norm_topk_prob = true, .act = MOE8_ACT_SWIGLU_POST,
                           .shared_ffn = FS};
    if (v < 4) { c.act_limit = lims[v][0]; c.shared_act_limit = lims[v][1]; }
    else c.act = MOE8_ACT_SWIGLU;
    moe8_layer *L;
    assert_int_equal(moe8_layer_create(&c, NULL, "experts", &L), MOE8_OK);
    assert_int_equal(moe8_layer_init_random(L, 9), MOE8_OK);
    static float x[T * D], dout[T * D];
    static float dx[T * D], dwr[D * E], dwg[E * D * F], dwu[E * D * F], dwd[E * F * D], dsg[D * FS], dsu[D * FS], dsd[FS * D];
    const moe8_layer_grads g = {.dx = dx, .dwr = dwr, .dwg = dwg, .dwu = dwu, .dwd = dwd, .dwsg = dsg, .dwsu = dsu, .dwsd = dsd};
    void *ws;
    size_t wsz;
    form_backward(L, x, dout, T, D, 71, &g, &ws, &wsz);
    const form_grad t[] = {
      {"x", x, T * D, dx}, {"router", moe8_layer_weight(L, MOE8_W_ROUTER, NULL), D * E, dwr},
      {"gate", moe8_layer_weight(L, MOE8_W_GATE, NULL), E * D * F, dwg}, {"up", moe8_layer_weight(L, MOE8_W_UP, NULL), E * D * F, dwu},
      {"down", moe8_layer_weight(L, MOE8_W_DOWN, NULL), E * F * D, dwd},
      {"shared gate", moe8_layer_weight(L, MOE8_W_SHARED_GATE, NULL), D * FS, dsg},
      {"shared up", moe8_layer_weight(L, MOE8_W_SHARED_UP, NULL), D * FS, dsu},
      {"shared down", moe8_layer_weight(L, MOE8_W_SHARED_DOWN, NULL), FS * D, dsd}};
    if (v < 3) form_fd_check("SwiGLU clamped after the activation", L, x, dout, T, D, ws, wsz, t, sizeof t / sizeof t[0]);
    float aux;
    assert_int_equal(moe8_layer_forward(L, x, T, out[v], &aux, ws, wsz), MOE8_OK);
    free(ws);
    moe8_layer_destroy(L);
  }
  assert_memory_equal(out[3], out[4], sizeof out[3]); /* no limits: the plain SwiGLU */
  for (int v = 0; v < 3; v++) assert_true(memcmp(out[v], out[4], sizeof out[v]) != 0); /* each limit binds */
  assert_true(memcmp(out[1], out[2], sizeof out[1]) != 0 && memcmp(out[0], out[1], sizeof out[0]) != 0);
  /* a negative or non-finite limit is refused */
  moe8_layer_config bad = {.num_experts = E, .top_k = K, .hidden = D, .ffn = F, .act = MOE8_ACT_SWIGLU_POST, .shared_act_limit = -1.0f};
  moe8_layer *B = NULL;
  assert_int_equal(moe8_layer_create(&bad, NULL, "experts", &B), MOE8_ERR_INVALID_ARG);
  assert_non_null(strstr(moe8_last_error(), "shared_act_limit"));
}

/* Inkling-2's softcapped SwiGLU (cg·tanh(g/cg) · sigmoid(g) · cu·tanh(u/cu),
** cg = act_alpha, cu = act_limit), routed and shared: every gradient
** against finite differences with caps that bind (the forward differs
** from the plain SwiGLU's); caps <= 0 refused. */
static void test_softcap_form_grads(void **state) {
  (void)state;
  enum { E = 4, K = 2, D = 32, F = 16, FS = 24, T = 6 };
  static float out[2][T * D];
  for (int v = 0; v < 2; v++) {
    moe8_layer_config c = {.num_experts = E, .top_k = K, .hidden = D, .ffn = F, .norm_topk_prob = true, .act = MOE8_ACT_SWIGLU_SOFTCAP,
                           .act_alpha = 0.3f, .act_limit = 0.2f, .shared_ffn = FS};
    if (v) c.act = MOE8_ACT_SWIGLU;
    moe8_layer *L;
    assert_int_equal(moe8_layer_create(&c, NULL, "experts", &L), MOE8_OK);
    assert_int_equal(moe8_layer_init_random(L, 9), MOE8_OK);
    static float x[T * D], dout[T * D];
    static float dx[T * D], dwr[D * E], dwg[E * D * F], dwu[E * D * F], dwd[E * F * D], dsg[D * FS], dsu[D * FS], dsd[FS * D];
    const moe8_layer_grads g = {.dx = dx, .dwr = dwr, .dwg = dwg, .dwu = dwu, .dwd = dwd, .dwsg = dsg, .dwsu = dsu, .dwsd = dsd};
    void *ws;
    size_t wsz;
    form_backward(L, x, dout, T, D, 71, &g, &ws, &wsz);
    const form_grad t[] = {
      {"x", x, T * D, dx}, {"router", moe8_layer_weight(L, MOE8_W_ROUTER, NULL), D * E, dwr},
      {"gate", moe8_layer_weight(L, MOE8_W_GATE, NULL), E * D * F, dwg}, {"up", moe8_layer_weight(L, MOE8_W_UP, NULL), E * D * F, dwu},
      {"down", moe8_layer_weight(L, MOE8_W_DOWN, NULL), E * F * D, dwd},
      {"shared gate", moe8_layer_weight(L, MOE8_W_SHARED_GATE, NULL), D * FS, dsg},
      {"shared up", moe8_layer_weight(L, MOE8_W_SHARED_UP, NULL), D * FS, dsu},
      {"shared down", moe8_layer_weight(L, MOE8_W_SHARED_DOWN, NULL), FS * D, dsd}};
    if (!v) form_fd_check("softcapped SwiGLU", L, x, dout, T, D, ws, wsz, t, sizeof t / sizeof t[0]);
    float aux;
    assert_int_equal(moe8_layer_forward(L, x, T, out[v], &aux, ws, wsz), MOE8_OK);
    free(ws);
    moe8_layer_destroy(L);
  }
  double dmax = 0;
  for (int i = 0; i < T * D; i++) dmax = fmax(dmax, fabs((double)out[0][i] - out[1][i]));
  assert_true(dmax > 1e-2); /* the caps bind */
  moe8_layer_config bad = {.num_experts = E, .top_k = K, .hidden = D, .ffn = F, .act = MOE8_ACT_SWIGLU_SOFTCAP, .act_alpha = 4.0f};
  moe8_layer *B = NULL;
  assert_int_equal(moe8_layer_create(&bad, NULL, "experts", &B), MOE8_ERR_INVALID_ARG);
  assert_non_null(strstr(moe8_last_error(), "softcapped"));
}

/* Gemma-4's routed branch as its definition says, in double: the router
** reads n(x) ⊙ s · c (router_norm), the experts n(x) ⊙ w_in (in_norm), the
** weights are the renormalized top-k softmax times the per-expert scale
** (expert_scale), the experts and the shared one are GeGLU, and the output
** is n(y) ⊙ w_out (out_norm); n the RMSNorm with rms_eps. */
static double gelu_tanh_d(double g) { return 0.5 * g * (1.0 + tanh(0.7978845608028654 * (g + 0.044715 * g * g * g))); }

static void gemma_ref(const moe8_layer_config *c, moe8_layer *L, const float *x, int64_t T, double *out) {
  const int64_t E = c->num_experts, K = c->top_k, D = c->hidden, F = c->ffn, Fs = c->shared_ffn;
  const float *wr = moe8_layer_weight_read(L, MOE8_W_ROUTER, NULL), *wg = moe8_layer_weight_read(L, MOE8_W_GATE, NULL);
  const float *wu = moe8_layer_weight_read(L, MOE8_W_UP, NULL), *wd = moe8_layer_weight_read(L, MOE8_W_DOWN, NULL);
  const float *rs = moe8_layer_weight_read(L, MOE8_W_ROUTER_SCALE, NULL), *es = moe8_layer_weight_read(L, MOE8_W_EXPERT_SCALE, NULL);
  const float *wi = moe8_layer_weight_read(L, MOE8_W_IN_NORM, NULL), *wo = moe8_layer_weight_read(L, MOE8_W_OUT_NORM, NULL);
  const float *sg = Fs ? moe8_layer_weight_read(L, MOE8_W_SHARED_GATE, NULL) : NULL, *su = Fs ? moe8_layer_weight_read(L, MOE8_W_SHARED_UP, NULL) : NULL;
  const float *sd = Fs ? moe8_layer_weight_read(L, MOE8_W_SHARED_DOWN, NULL) : NULL;
  double *xr = malloc(sizeof(double) * (size_t)D), *xe = malloc(sizeof(double) * (size_t)D), *y = malloc(sizeof(double) * (size_t)D);
  double p[64];
  for (int64_t t = 0; t < T; t++) {
    const float *xt = x + t * D;
    double ss = 0;
    for (int64_t d = 0; d < D; d++) ss += (double)xt[d] * xt[d];
    const double r = 1.0 / sqrt(ss / (double)D + c->rms_eps);
    for (int64_t d = 0; d < D; d++) {
      xr[d] = c->router_norm ? xt[d] * r * rs[d] * c->router_norm_scale : xt[d];
      xe[d] = c->in_norm ? xt[d] * r * wi[d] : xt[d];
      y[d] = 0;
    }
    double mx = -INFINITY, sum = 0;
    for (int64_t e = 0; e < E; e++) {
      p[e] = 0;
      for (int64_t d = 0; d < D; d++) p[e] += xr[d] * wr[d * E + e];
      mx = fmax(mx, p[e]);
    }
    for (int64_t e = 0; e < E; e++) sum += (p[e] = exp(p[e] - mx));
    int64_t ids[8];
    double w[8], ws = 0;
    bool used[64] = {false};
    for (int64_t j = 0; j < K; j++) {
      int64_t b = -1;
      for (int64_t e = 0; e < E; e++)
        if (!used[e] && (b < 0 || p[e] > p[b])) b = e;
      used[b] = true;
      ids[j] = b;
      ws += (w[j] = p[b] / sum);
    }
    for (int64_t j = 0; j < K; j++) {
      const int64_t e = ids[j];
      const double wj = w[j] / ws * (c->expert_scale ? es[e] : 1.0);
      for (int64_t f = 0; f < F; f++) {
        double g = 0, u = 0;
        for (int64_t d = 0; d < D; d++) {
          g += xe[d] * wg[(e * D + d) * F + f];
          u += xe[d] * wu[(e * D + d) * F + f];
        }
        const double h = gelu_tanh_d(g) * u;
        for (int64_t d = 0; d < D; d++) y[d] += wj * h * wd[(e * F + f) * D + d];
      }
    }
    for (int64_t f = 0; f < Fs; f++) {
      double g = 0, u = 0;
      for (int64_t d = 0; d < D; d++) {
        g += xe[d] * sg[d * Fs + f];
        u += xe[d] * su[d * Fs + f];
      }
      const double h = gelu_tanh_d(g) * u;
      for (int64_t d = 0; d < D; d++) y[d] += h * sd[f * D + d];
    }
    double sy = 0;
    for (int64_t d = 0; d < D; d++) sy += y[d] * y[d];
    const double ry = 1.0 / sqrt(sy / (double)D + c->rms_eps);
    for (int64_t d = 0; d < D; d++) out[t * D + d] = c->out_norm ? y[d] * ry * wo[d] : y[d];
  }
  free(xr); free(xe); free(y);
}

/* Gemma-4's routed branch (router_norm, expert_scale, in_norm, out_norm,
** GeGLU), all four on and each one off: the forward within 1e-5 of the
** largest |out| of the definition in double (gemma_ref), the fused
** forward's bytes the forward's, each feature changing the output; with
** all on, every gradient (x through both norms, the four vectors, the
** router, the experts, the shared expert) against finite differences; a
** negative rms_eps refused by name. */
static void test_gemma_form(void **state) {
  (void)state;
  enum { E = 6, K = 2, D = 32, F = 16, FS = 24, T = 7 };
  static float out[5][T * D];
  for (int v = 0; v < 5; v++) {
    moe8_layer_config c = {.num_experts = E, .top_k = K, .hidden = D, .ffn = F, .norm_topk_prob = true, .act = MOE8_ACT_GEGLU,
                           .shared_ffn = FS, .router_norm = v != 1, .expert_scale = v != 2, .in_norm = v != 3, .out_norm = v != 4,
                           .router_norm_scale = 0.17677669f, .rms_eps = 1e-6f};
    moe8_layer *L;
    assert_int_equal(moe8_layer_create(&c, NULL, "experts", &L), MOE8_OK);
    assert_int_equal(moe8_layer_init_random(L, 11), MOE8_OK);
    size_t n;
    float *wr = moe8_layer_weight(L, MOE8_W_ROUTER, &n);
    for (size_t i = 0; i < n; i++) wr[i] *= 4.0f; /* logits apart: few near-ties for the finite differences */
    const moe8_weight_id vids[4] = {MOE8_W_ROUTER_SCALE, MOE8_W_EXPERT_SCALE, MOE8_W_IN_NORM, MOE8_W_OUT_NORM};
    for (int k = 0; k < 4; k++) { /* each vector from its own seed: the variants differ only by the feature off */
      tu_rng_reset(77 + (uint64_t)k);
      float *vw = moe8_layer_weight(L, vids[k], &n);
      assert_true(vw != NULL || k + 1 == v);
      for (size_t i = 0; vw && i < n; i++) vw[i] = k == 1 ? 0.5f + fabsf(tu_normal()) : 1.0f + 0.4f * tu_normal();
    }
    static float x[T * D], dout[T * D];
    static float dx[T * D], dwr[D * E], dwg[E * D * F], dwu[E * D * F], dwd[E * F * D], dsg[D * FS], dsu[D * FS], dsd[FS * D];
    static float drs[D], des[E], din[D], don[D];
    const moe8_layer_grads g = {.dx = dx, .dwr = dwr, .dwg = dwg, .dwu = dwu, .dwd = dwd, .dwsg = dsg, .dwsu = dsu, .dwsd = dsd,
                                .dwrs = drs, .dwes = des, .dwin = din, .dwon = don};
    void *ws;
    size_t wsz;
    form_backward(L, x, dout, T, D, 73, &g, &ws, &wsz);
    if (v == 0) {
      const form_grad t[] = {
        {"x", x, T * D, dx}, {"router", moe8_layer_weight(L, MOE8_W_ROUTER, NULL), D * E, dwr},
        {"gate", moe8_layer_weight(L, MOE8_W_GATE, NULL), E * D * F, dwg}, {"up", moe8_layer_weight(L, MOE8_W_UP, NULL), E * D * F, dwu},
        {"down", moe8_layer_weight(L, MOE8_W_DOWN, NULL), E * F * D, dwd},
        {"shared gate", moe8_layer_weight(L, MOE8_W_SHARED_GATE, NULL), D * FS, dsg},
        {"shared up", moe8_layer_weight(L, MOE8_W_SHARED_UP, NULL), D * FS, dsu},
        {"shared down", moe8_layer_weight(L, MOE8_W_SHARED_DOWN, NULL), FS * D, dsd},
        {"router scale", moe8_layer_weight(L, MOE8_W_ROUTER_SCALE, NULL), D, drs},
        {"per-expert scale", moe8_layer_weight(L, MOE8_W_EXPERT_SCALE, NULL), E, des},
        {"input norm", moe8_layer_weight(L, MOE8_W_IN_NORM, NULL), D, din},
        {"output norm", moe8_layer_weight(L, MOE8_W_OUT_NORM, NULL), D, don}};
      form_fd_check("Gemma-4's branch", L, x, dout, T, D, ws, wsz, t, sizeof t / sizeof t[0]);
    }
    float aux;
    assert_int_equal(moe8_layer_forward(L, x, T, out[v], &aux, ws, wsz), MOE8_OK);
    static double want[T * D];
    gemma_ref(&c, L, x, T, want);
    double omax = 0, emax = 0;
    for (int i = 0; i < T * D; i++) {
      omax = fmax(omax, fabs(want[i]));
      emax = fmax(emax, fabs(want[i] - out[v][i]));
    }
    if (!(emax <= 1e-5 * omax)) TU_FAIL("Gemma-4's branch, variant %d: max |out - definition| = %g, max |out| %g", v, emax, omax);
    static float fused[T * D];
    assert_int_equal(moe8_layer_prepare(L), MOE8_OK);
    assert_int_equal(moe8_layer_forward_fused(L, x, T, fused, ws, wsz), MOE8_OK);
    assert_memory_equal(fused, out[v], sizeof fused);
    free(ws);
    moe8_layer_destroy(L);
  }
  for (int v = 1; v < 5; v++) {
    double dmax = 0;
    for (int i = 0; i < T * D; i++) dmax = fmax(dmax, fabs((double)out[0][i] - out[v][i]));
    if (!(dmax > 1e-3)) TU_FAIL("Gemma-4's branch: turning feature %d off changes the output by only %g", v, dmax);
  }
  moe8_layer_config bad = {.num_experts = E, .top_k = K, .hidden = D, .ffn = F, .act = MOE8_ACT_GEGLU, .in_norm = true, .rms_eps = -1.0f};
  moe8_layer *B = NULL;
  assert_int_equal(moe8_layer_create(&bad, NULL, "experts", &B), MOE8_ERR_INVALID_ARG);
  assert_non_null(strstr(moe8_last_error(), "rms_eps"));
}

/* Latent experts (moe8_layer_config latent, latent_norm, expert_out_norm),
** the definition in double: the router reads x [D] (softmax, the top-k
** renormalized), or the given routing; the experts read z = x · P [H]
** (then z · r(z) ⊙ v with latent_norm); each chosen expert's output o [H]
** becomes u · (mean(u²) + eps)^(-1/2), u = o ⊙ s, with expert_out_norm;
** the weighted sum c [H] becomes c · Q [D] (latent), then the shared
** expert of x is added.  H = D without latent. */
static void latent_ref(const moe8_layer_config *c, moe8_layer *L, const float *x, int64_t T, const int32_t *gids, const float *gw,
                       double *out) {
  const int64_t E = c->num_experts, K = c->top_k, D = c->hidden, H = c->latent > 0 ? c->latent : D, F = c->ffn, Fs = c->shared_ffn;
  const bool relu2 = c->act == MOE8_ACT_RELU2;
  const float *wr = moe8_layer_weight_read(L, MOE8_W_ROUTER, NULL), *wg = moe8_layer_weight_read(L, MOE8_W_GATE, NULL);
  const float *wu = moe8_layer_weight_read(L, MOE8_W_UP, NULL), *wd = moe8_layer_weight_read(L, MOE8_W_DOWN, NULL);
  const float *P = moe8_layer_weight_read(L, MOE8_W_LATENT_IN, NULL), *Q = moe8_layer_weight_read(L, MOE8_W_LATENT_OUT, NULL);
  const float *v = moe8_layer_weight_read(L, MOE8_W_LATENT_NORM, NULL), *s = moe8_layer_weight_read(L, MOE8_W_EXPERT_OUT_NORM, NULL);
  const float *sg = moe8_layer_weight_read(L, MOE8_W_SHARED_GATE, NULL), *su = moe8_layer_weight_read(L, MOE8_W_SHARED_UP, NULL);
  const float *sd = moe8_layer_weight_read(L, MOE8_W_SHARED_DOWN, NULL);
  double *z = malloc(sizeof(double) * (size_t)H), *cs = malloc(sizeof(double) * (size_t)H), *o = malloc(sizeof(double) * (size_t)H);
  for (int64_t t = 0; t < T; t++) {
    const float *xt = x + t * D;
    int64_t ids[8];
    double w[8], p[64], mx = -INFINITY, sum = 0, ws = 0;
    if (gids) {
      for (int64_t j = 0; j < K; j++) { ids[j] = gids[t * K + j]; w[j] = gw[t * K + j]; }
    } else {
      for (int64_t e = 0; e < E; e++) {
        p[e] = 0;
        for (int64_t d = 0; d < D; d++) p[e] += (double)xt[d] * wr[d * E + e];
        mx = fmax(mx, p[e]);
      }
      for (int64_t e = 0; e < E; e++) sum += (p[e] = exp(p[e] - mx));
      bool used[64] = {false};
      for (int64_t j = 0; j < K; j++) {
        int64_t b = -1;
        for (int64_t e = 0; e < E; e++)
          if (!used[e] && (b < 0 || p[e] > p[b])) b = e;
        used[b] = true;
        ids[j] = b;
        ws += (w[j] = p[b] / sum);
      }
      for (int64_t j = 0; j < K; j++) w[j] /= ws;
    }
    double ss = 0;
    for (int64_t h = 0; h < H; h++) {
      z[h] = 0;
      if (c->latent > 0)
        for (int64_t d = 0; d < D; d++) z[h] += (double)xt[d] * P[d * H + h];
      else
        z[h] = xt[h];
      ss += z[h] * z[h];
      cs[h] = 0;
    }
    const double rz = 1.0 / sqrt(ss / (double)H + c->rms_eps);
    for (int64_t h = 0; c->latent_norm && h < H; h++) z[h] = z[h] * rz * v[h];
    for (int64_t j = 0; j < K; j++) {
      const int64_t e = ids[j];
      for (int64_t h = 0; h < H; h++) o[h] = 0;
      for (int64_t f = 0; f < F; f++) {
        double g = 0, u = 0;
        for (int64_t h = 0; h < H; h++) {
          if (!relu2) g += z[h] * wg[(e * H + h) * F + f];
          u += z[h] * wu[(e * H + h) * F + f];
        }
        const double a = relu2 ? (u > 0 ? u * u : 0.0) : g / (1.0 + exp(-g)) * u;
        for (int64_t h = 0; h < H; h++) o[h] += a * wd[(e * F + f) * H + h];
      }
      if (c->expert_out_norm) {
        double so = 0;
        for (int64_t h = 0; h < H; h++) { o[h] *= s[h]; so += o[h] * o[h]; }
        const double ro = 1.0 / sqrt(so / (double)H + c->expert_out_eps);
        for (int64_t h = 0; h < H; h++) o[h] *= ro;
      }
      for (int64_t h = 0; h < H; h++) cs[h] += w[j] * o[h];
    }
    for (int64_t d = 0; d < D; d++) {
      double y = 0;
      if (c->latent > 0)
        for (int64_t h = 0; h < H; h++) y += cs[h] * Q[h * D + d];
      else
        y = cs[d];
      out[t * D + d] = y;
    }
    for (int64_t f = 0; f < Fs; f++) {
      double g = 0, u = 0;
      for (int64_t d = 0; d < D; d++) {
        if (!relu2) g += (double)xt[d] * sg[d * Fs + f];
        u += (double)xt[d] * su[d * Fs + f];
      }
      const double a = relu2 ? (u > 0 ? u * u : 0.0) : g / (1.0 + exp(-g)) * u;
      for (int64_t d = 0; d < D; d++) out[t * D + d] += a * sd[f * D + d];
    }
  }
  free(z); free(cs); free(o);
}

/* The variants of test_latent_form: MuSE-Spark's block (latent, both
** norms, SwiGLU), Nemotron-H's latent one (relu2, a shared expert, no
** norms), MuSE-Spark's experts class alone (expert_out_norm, no latent),
** then the first with latent_norm off and with expert_out_norm off. */
static moe8_layer_config latent_cfg(int v) {
  moe8_layer_config c = {.num_experts = 6, .top_k = 2, .hidden = 32, .ffn = 16, .norm_topk_prob = true, .latent = 24, .latent_norm = true,
                         .expert_out_norm = true, .rms_eps = 1e-5f, .expert_out_eps = 1e-6f};
  if (v == 1) { c.act = MOE8_ACT_RELU2; c.shared_ffn = 20; c.latent_norm = c.expert_out_norm = false; }
  if (v == 2) { c.latent = 0; c.latent_norm = false; }
  if (v == 3) c.latent_norm = false;
  if (v == 4) c.expert_out_norm = false;
  return c;
}

static void latent_init(moe8_layer *L, uint64_t seed) {
  assert_int_equal(moe8_layer_init_random(L, seed), MOE8_OK);
  const moe8_weight_id vids[2] = {MOE8_W_LATENT_NORM, MOE8_W_EXPERT_OUT_NORM};
  for (int k = 0; k < 2; k++) { /* each from its own seed: the variants differ only by the feature off */
    size_t n = 0;
    float *vw = moe8_layer_weight(L, vids[k], &n);
    tu_rng_reset(91 + (uint64_t)k);
    for (size_t i = 0; vw && i < n; i++) vw[i] = 1.0f + 0.5f * tu_normal();
  }
  size_t n;
  float *wr = moe8_layer_weight(L, MOE8_W_ROUTER, &n);
  for (size_t i = 0; i < n; i++) wr[i] *= 4.0f; /* logits apart */
  moe8_layer_weights_changed(L);
}

/* Latent experts and the per-expert output norm: every variant's
** forward and its experts entry (given routing) within 1e-5 of the
** largest |out| of latent_ref, the fused forward's bytes the forward's,
** each norm changing the output; fused bytes, and the layer built from
** memory, under every rule set at T = 29 and 3; every gradient (x, the
** router, the experts, the shared expert, both projections, both norms)
** against finite differences and a trainer step; bad configs refused. */
static void test_latent_form(void **state) {
  (void)state;
  enum { T = 7, D = 32, K = 2 };
  static float out[5][T * D];
  for (int v = 0; v < 5; v++) {
    const moe8_layer_config c = latent_cfg(v);
    moe8_layer *L;
    assert_int_equal(moe8_layer_create(&c, NULL, "experts", &L), MOE8_OK);
    latent_init(L, 13);
    static float x[T * D], y[T * D], fused[T * D];
    static double want[T * D];
    tu_rng_reset(57);
    tu_fill_normal(x, T * D, 1.0f);
    const size_t wsz = moe8_layer_workspace_size(L, T);
    void *ws;
    assert_int_equal(posix_memalign(&ws, 64, wsz), 0);
    for (int given = 0; given < 2; given++) {
      static const int32_t ids[T * K] = {0, 3, 1, 2, 2, 0, 5, 1, 1, 4, 2, 3, 4, 5};
      static float w[T * K];
      for (int i = 0; i < T * K; i++) w[i] = 0.2f + 0.1f * (float)(i % 5);
      if (given) assert_int_equal(moe8_layer_experts(L, x, T, ids, w, y, ws, wsz), MOE8_OK);
      else assert_int_equal(moe8_layer_forward(L, x, T, out[v], NULL, ws, wsz), MOE8_OK);
      latent_ref(&c, L, x, T, given ? ids : NULL, w, want);
      const float *got = given ? y : out[v];
      double omax = 0, emax = 0;
      for (int i = 0; i < T * D; i++) {
        omax = fmax(omax, fabs(want[i]));
        emax = fmax(emax, fabs(want[i] - got[i]));
      }
      if (!(emax <= 1e-5 * omax))
        TU_FAIL("latent experts, variant %d%s: max |out - definition| = %g, max |out| %g", v, given ? " (given routing)" : "", emax, omax);
    }
    assert_int_equal(moe8_layer_prepare(L), MOE8_OK);
    assert_int_equal(moe8_layer_forward_fused(L, x, T, fused, ws, wsz), MOE8_OK);
    assert_memory_equal(fused, out[v], sizeof fused);
    free(ws);
    if (v < 3) { /* every gradient against finite differences, then a trainer step */
      enum { E = 6, H = 32, F = 16, FS = 20 };
      const int64_t HH = c.latent > 0 ? c.latent : D;
      static float xg[T * D], dout[T * D], dx[T * D], dwr[D * E], dwg[E * H * F], dwu[E * H * F], dwd[E * F * H];
      static float dsu[D * FS], dsd[FS * D], dli[D * H], dlo[H * D], dln[H], deo[H];
      const moe8_layer_grads g = {.dx = dx, .dwr = dwr, .dwg = c.act == MOE8_ACT_RELU2 ? NULL : dwg, .dwu = dwu, .dwd = dwd,
                                  .dwsu = c.shared_ffn ? dsu : NULL, .dwsd = c.shared_ffn ? dsd : NULL, .dwli = dli, .dwlo = dlo,
                                  .dwln = dln, .dweon = deo};
      void *wsg;
      size_t wszg;
      form_backward(L, xg, dout, T, D, 83 + (uint64_t)v, &g, &wsg, &wszg);
      const size_t ne = (size_t)(E * HH * c.ffn);
      form_grad t[12];
      size_t nt = 0;
      t[nt++] = (form_grad){"x", xg, T * D, dx};
      t[nt++] = (form_grad){"router", moe8_layer_weight(L, MOE8_W_ROUTER, NULL), D * E, dwr};
      if (c.act != MOE8_ACT_RELU2) t[nt++] = (form_grad){"gate", moe8_layer_weight(L, MOE8_W_GATE, NULL), ne, dwg};
      t[nt++] = (form_grad){"up", moe8_layer_weight(L, MOE8_W_UP, NULL), ne, dwu};
      t[nt++] = (form_grad){"down", moe8_layer_weight(L, MOE8_W_DOWN, NULL), ne, dwd};
      if (c.shared_ffn) {
        t[nt++] = (form_grad){"shared up", moe8_layer_weight(L, MOE8_W_SHARED_UP, NULL), (size_t)(D * c.shared_ffn), dsu};
        t[nt++] = (form_grad){"shared down", moe8_layer_weight(L, MOE8_W_SHARED_DOWN, NULL), (size_t)(D * c.shared_ffn), dsd};
      }
      if (c.latent > 0) {
        t[nt++] = (form_grad){"latent in", moe8_layer_weight(L, MOE8_W_LATENT_IN, NULL), (size_t)(D * HH), dli};
        t[nt++] = (form_grad){"latent out", moe8_layer_weight(L, MOE8_W_LATENT_OUT, NULL), (size_t)(D * HH), dlo};
      }
      if (c.latent_norm) t[nt++] = (form_grad){"latent norm", moe8_layer_weight(L, MOE8_W_LATENT_NORM, NULL), (size_t)HH, dln};
      if (c.expert_out_norm) t[nt++] = (form_grad){"expert output norm", moe8_layer_weight(L, MOE8_W_EXPERT_OUT_NORM, NULL), (size_t)HH, deo};
      form_fd_check(v == 0 ? "latent experts, both norms" : v == 1 ? "latent relu2 experts, shared expert" : "expert output norm",
                    L, xg, dout, T, D, wsg, wszg, t, nt);
      moe8_trainer *tr = NULL;
      assert_int_equal(moe8_trainer_create(L, 1e-3f, &tr), MOE8_OK);
      float loss = 0;
      assert_int_equal(moe8_trainer_step(tr, xg, dout, T, &loss, wsg, wszg), MOE8_OK);
      assert_true(isfinite(loss));
      moe8_trainer_destroy(tr);
      free(wsg);
    }
    moe8_layer_destroy(L);
  }
  for (int v = 3; v < 5; v++) {
    double dmax = 0;
    for (int i = 0; i < T * D; i++) dmax = fmax(dmax, fabs((double)out[0][i] - out[v][i]));
    if (!(dmax > 1e-3)) TU_FAIL("latent experts: turning the %s norm off changes the output by only %g", v == 3 ? "latent" : "expert output", dmax);
  }
  /* fused bytes and a layer from memory, every rule set, T = 29 and 3 */
  for (size_t it = 0; it < 4 * NRULES; it++) {
    const size_t i = it % NRULES;
    const int64_t TT = it / NRULES % 2 ? 3 : 29;
    moe8_layer_config c = latent_cfg(it < 2 * NRULES ? 0 : 1);
    c.hidden = 48; c.latent = 64; c.ffn = 40;
    const int64_t DD = c.hidden, H = c.latent, EE = c.num_experts, FF = c.ffn, N1 = c.act == MOE8_ACT_RELU2 ? FF : 2 * FF;
    moe8_rules *rs = NULL;
    if (k_rules_txt[i]) assert_int_equal(moe8_rules_parse(k_rules_txt[i], strlen(k_rules_txt[i]), "inline", &rs), MOE8_OK);
    moe8_layer *A = NULL, *B = NULL;
    assert_int_equal(moe8_layer_create(&c, rs, "experts", &A), MOE8_OK);
    latent_init(A, 40 + it);
    float *x = malloc(sizeof(float) * (size_t)(TT * DD)), *ya = malloc(sizeof(float) * (size_t)(TT * DD));
    float *yf = malloc(sizeof(float) * (size_t)(TT * DD)), *yb = malloc(sizeof(float) * (size_t)(TT * DD));
    tu_rng_reset(900 + it);
    tu_fill_normal(x, (size_t)(TT * DD), 1.0f);
    const size_t wa = moe8_layer_workspace_size(A, TT);
    void *wsa = NULL;
    assert_int_equal(posix_memalign(&wsa, 64, wa), 0);
    assert_int_equal(moe8_layer_forward(A, x, TT, ya, NULL, wsa, wa), MOE8_OK);
    assert_int_equal(moe8_layer_prepare(A), MOE8_OK);
    assert_int_equal(moe8_layer_forward_fused(A, x, TT, yf, wsa, wa), MOE8_OK);
    if (memcmp(ya, yf, sizeof(float) * (size_t)(TT * DD)) != 0) TU_FAIL("latent, rules %zu, T = %lld: fused bytes differ", i, (long long)TT);
    assert_int_equal(moe8_layer_create_inference(&c, rs, "experts", &B), MOE8_OK);
    const moe8_weight_id vids[4] = {MOE8_W_ROUTER, MOE8_W_LATENT_IN, MOE8_W_LATENT_OUT, MOE8_W_LATENT_NORM};
    for (int k = 0; k < 4; k++) {
      size_t n = 0;
      float *dst = moe8_layer_weight(B, vids[k], &n);
      if (n) memcpy(dst, moe8_layer_weight_read(A, vids[k], NULL), sizeof(float) * n);
    }
    size_t n = 0;
    float *so = moe8_layer_weight(B, MOE8_W_EXPERT_OUT_NORM, &n);
    if (n) memcpy(so, moe8_layer_weight_read(A, MOE8_W_EXPERT_OUT_NORM, NULL), sizeof(float) * n);
    const float *wg = moe8_layer_weight_read(A, MOE8_W_GATE, NULL), *wu = moe8_layer_weight_read(A, MOE8_W_UP, NULL);
    const float *wd = moe8_layer_weight_read(A, MOE8_W_DOWN, NULL);
    float *gu = malloc(sizeof(float) * (size_t)(H * N1));
    for (int64_t e = 0; e < EE; e++) {
      for (int64_t h = 0; h < H; h++) { /* [H, 2F]: gate columns, then up (ungated: up alone) */
        if (N1 > FF) memcpy(gu + h * N1, wg + (e * H + h) * FF, sizeof(float) * (size_t)FF);
        memcpy(gu + h * N1 + (N1 - FF), wu + (e * H + h) * FF, sizeof(float) * (size_t)FF);
      }
      assert_int_equal(moe8_layer_put_expert(B, 0, e, gu, wd + e * FF * H), MOE8_OK);
    }
    if (c.shared_ffn)
      assert_int_equal(moe8_layer_put_expert(B, 1, 0, moe8_layer_weight_read(A, MOE8_W_SHARED_UP, NULL),
                                             moe8_layer_weight_read(A, MOE8_W_SHARED_DOWN, NULL)), MOE8_OK);
    assert_int_equal(moe8_layer_finish_load(B), MOE8_OK);
    assert_int_equal(moe8_layer_forward_fused(B, x, TT, yb, wsa, wa), MOE8_OK);
    if (memcmp(ya, yb, sizeof(float) * (size_t)(TT * DD)) != 0)
      TU_FAIL("latent, rules %zu, T = %lld: the layer built from memory differs from the training layer's bytes", i, (long long)TT);
    free(gu); free(wsa); free(x); free(ya); free(yf); free(yb);
    moe8_layer_destroy(A);
    moe8_layer_destroy(B);
    moe8_rules_destroy(rs);
  }
  /* the forms it does not take */
  moe8_layer_config bad = latent_cfg(0);
  moe8_layer *B = NULL;
  bad.in_norm = true;
  assert_int_equal(moe8_layer_create(&bad, NULL, "experts", &B), MOE8_ERR_INVALID_ARG);
  assert_non_null(strstr(moe8_last_error(), "latent"));
  bad = latent_cfg(2);
  bad.latent_norm = true;
  assert_int_equal(moe8_layer_create(&bad, NULL, "experts", &B), MOE8_ERR_INVALID_ARG);
  assert_non_null(strstr(moe8_last_error(), "latent_norm"));
  bad = latent_cfg(0);
  bad.expert_out_eps = -1.0f;
  assert_int_equal(moe8_layer_create(&bad, NULL, "experts", &B), MOE8_ERR_INVALID_ARG);
  assert_non_null(strstr(moe8_last_error(), "expert_out_eps"));
  bad = latent_cfg(0);
  bad.latent = -4;
  assert_int_equal(moe8_layer_create(&bad, NULL, "experts", &B), MOE8_ERR_INVALID_ARG);
}

/* GPT-OSS's clamped SwiGLU without its biases, in the routed experts and
** the shared one (MiniMax-M3): every gradient against finite differences,
** with a limit that binds (the forward differs from the plain SwiGLU's). */
static void test_clamp_shared_form_grads(void **state) {
  (void)state;
  enum { E = 4, K = 2, D = 32, F = 16, FS = 24, T = 6 };
  static float out[2][T * D];
  for (int v = 0; v < 2; v++) {
    moe8_layer_config c = {.num_experts = E, .top_k = K, .hidden = D, .ffn = F, .norm_topk_prob = true, .act = MOE8_ACT_SWIGLU_CLAMP,
                           .act_alpha = 1.702f, .act_limit = 0.3f, .shared_ffn = FS, .routed_scaling_factor = 1.5f};
    if (v) c.act = MOE8_ACT_SWIGLU;
    moe8_layer *L;
    assert_int_equal(moe8_layer_create(&c, NULL, "experts", &L), MOE8_OK);
    assert_int_equal(moe8_layer_init_random(L, 9), MOE8_OK);
    static float x[T * D], dout[T * D];
    static float dx[T * D], dwr[D * E], dwg[E * D * F], dwu[E * D * F], dwd[E * F * D], dsg[D * FS], dsu[D * FS], dsd[FS * D];
    const moe8_layer_grads g = {.dx = dx, .dwr = dwr, .dwg = dwg, .dwu = dwu, .dwd = dwd, .dwsg = dsg, .dwsu = dsu, .dwsd = dsd};
    void *ws;
    size_t wsz;
    form_backward(L, x, dout, T, D, 71, &g, &ws, &wsz);
    const form_grad t[] = {
      {"x", x, T * D, dx}, {"router", moe8_layer_weight(L, MOE8_W_ROUTER, NULL), D * E, dwr},
      {"gate", moe8_layer_weight(L, MOE8_W_GATE, NULL), E * D * F, dwg}, {"up", moe8_layer_weight(L, MOE8_W_UP, NULL), E * D * F, dwu},
      {"down", moe8_layer_weight(L, MOE8_W_DOWN, NULL), E * F * D, dwd},
      {"shared gate", moe8_layer_weight(L, MOE8_W_SHARED_GATE, NULL), D * FS, dsg},
      {"shared up", moe8_layer_weight(L, MOE8_W_SHARED_UP, NULL), D * FS, dsu},
      {"shared down", moe8_layer_weight(L, MOE8_W_SHARED_DOWN, NULL), FS * D, dsd}};
    if (!v) form_fd_check("clamped SwiGLU, shared expert too", L, x, dout, T, D, ws, wsz, t, sizeof t / sizeof t[0]);
    float aux;
    assert_int_equal(moe8_layer_forward(L, x, T, out[v], &aux, ws, wsz), MOE8_OK);
    free(ws);
    moe8_layer_destroy(L);
  }
  assert_true(memcmp(out[0], out[1], sizeof out[0]) != 0);
}

/* The ungated experts (Nemotron-H's relu2: down(relu(up(x))²), and relu),
** routed and shared: no gate weight; the expert op on given routing
** against a double reference of the form; every gradient against finite
** differences (dwg and dwsg zeros); the fused forward's bytes under every
** rule set; a layer built from memory (up [D, F] alone) gives the
** training layer's bytes; the trainer steps; the forms it does not take
** refused by name. */
static void test_ungated_form(void **state) {
  (void)state;
  enum { E = 4, K = 2, D = 32, F = 16, FS = 24, T = 6 };
  for (int v = 0; v < 2; v++) {
    const moe8_expert_act act = v ? MOE8_ACT_RELU : MOE8_ACT_RELU2;
    const moe8_layer_config c = {.num_experts = E, .top_k = K, .hidden = D, .ffn = F, .score = MOE8_SCORE_SIGMOID, .norm_topk_prob = true,
                                 .routed_scaling_factor = 2.5f, .use_selection_bias = true, .act = act, .shared_ffn = FS};
    moe8_layer *L;
    assert_int_equal(moe8_layer_create(&c, NULL, "experts", &L), MOE8_OK);
    assert_int_equal(moe8_layer_init_random(L, 9), MOE8_OK);
    size_t n = 1;
    assert_null(moe8_layer_weight(L, MOE8_W_GATE, &n));
    assert_null(moe8_layer_weight(L, MOE8_W_SHARED_GATE, &n));
    /* the expert op on given routing against a double reference */
    static float x[T * D], dout[T * D], y[T * D];
    static const int32_t ids[T * K] = {0, 3, 1, 2, 2, 0, 3, 1, 1, 0, 2, 3};
    static float w[T * K];
    tu_rng_reset(31 + (uint64_t)v);
    tu_fill_normal(x, T * D, 1.0f);
    for (int i = 0; i < T * K; i++) w[i] = 0.2f + 0.1f * (float)(i % 5);
    size_t wsz = moe8_layer_workspace_size(L, T);
    void *ws;
    assert_int_equal(posix_memalign(&ws, 64, wsz), 0);
    assert_int_equal(moe8_layer_experts(L, x, T, ids, w, y, ws, wsz), MOE8_OK);
    const float *wu = moe8_layer_weight_read(L, MOE8_W_UP, NULL), *wd = moe8_layer_weight_read(L, MOE8_W_DOWN, NULL);
    const float *su = moe8_layer_weight_read(L, MOE8_W_SHARED_UP, NULL), *sd = moe8_layer_weight_read(L, MOE8_W_SHARED_DOWN, NULL);
    for (int t = 0; t < T; t++)
      for (int o = 0; o < D; o++) {
        double r = 0, ymax = 0;
        for (int j = 0; j <= K; j++) { /* the K routed experts, then the shared one (weight 1) */
          const int64_t e = j < K ? ids[t * K + j] : 0, FF = j < K ? F : FS;
          const float *U = j < K ? wu + e * D * F : su, *Dn = j < K ? wd + e * F * D : sd;
          double acc = 0;
          for (int64_t f = 0; f < FF; f++) {
            double u = 0;
            for (int d = 0; d < D; d++) u += (double)x[t * D + d] * U[d * FF + f];
            const double h = u > 0 ? (v ? u : u * u) : 0.0;
            acc += h * Dn[f * D + o];
          }
          r += (j < K ? w[t * K + j] : 1.0) * acc;
          ymax = fmax(ymax, fabs(acc));
        }
        if (fabs(r - y[t * D + o]) > 1e-5 * (fabs(r) + ymax) + 1e-6)
          TU_FAIL("%s: token %d column %d: %g, the double reference %g", v ? "relu" : "relu2", t, o, (double)y[t * D + o], r);
      }
    free(ws);
    static float dx[T * D], dwr[D * E], dwg[E * D * F], dwu[E * D * F], dwd[E * F * D], dsg[D * FS], dsu[D * FS], dsd[FS * D];
    for (int i = 0; i < E * D * F; i++) dwg[i] = 7.0f;
    for (int i = 0; i < D * FS; i++) dsg[i] = 7.0f;
    const moe8_layer_grads g = {.dx = dx, .dwr = dwr, .dwg = dwg, .dwu = dwu, .dwd = dwd, .dwsg = dsg, .dwsu = dsu, .dwsd = dsd};
    form_backward(L, x, dout, T, D, 71 + (uint64_t)v, &g, &ws, &wsz);
    for (int i = 0; i < E * D * F; i++) assert_true(dwg[i] == 0.0f); /* no gate: zeros */
    for (int i = 0; i < D * FS; i++) assert_true(dsg[i] == 0.0f);
    const form_grad t[] = {
      {"x", x, T * D, dx}, {"router", moe8_layer_weight(L, MOE8_W_ROUTER, NULL), D * E, dwr},
      {"up", moe8_layer_weight(L, MOE8_W_UP, NULL), E * D * F, dwu}, {"down", moe8_layer_weight(L, MOE8_W_DOWN, NULL), E * F * D, dwd},
      {"shared up", moe8_layer_weight(L, MOE8_W_SHARED_UP, NULL), D * FS, dsu},
      {"shared down", moe8_layer_weight(L, MOE8_W_SHARED_DOWN, NULL), FS * D, dsd}};
    form_fd_check(v ? "ungated relu" : "ungated relu2", L, x, dout, T, D, ws, wsz, t, sizeof t / sizeof t[0]);
    free(ws);
    /* the trainer steps (no gate weight to update) */
    moe8_trainer *tr = NULL;
    assert_int_equal(moe8_trainer_create(L, 1e-3f, &tr), MOE8_OK);
    float loss = 0;
    wsz = moe8_layer_workspace_size(L, T);
    assert_int_equal(posix_memalign(&ws, 64, wsz), 0);
    assert_int_equal(moe8_trainer_step(tr, x, dout, T, &loss, ws, wsz), MOE8_OK);
    assert_true(isfinite(loss));
    moe8_trainer_destroy(tr);
    free(ws);
    moe8_layer_destroy(L);
  }
  /* fused bytes and a layer from memory, every rule set, T = 29 and 3 */
  for (size_t it = 0; it < 2 * NRULES; it++) {
    const size_t i = it % NRULES;
    const int64_t TT = it < NRULES ? 29 : 3, EE = 6, DD = 48, FF = 40, FSS = 24;
    const moe8_layer_config c = {.num_experts = EE, .top_k = 2, .hidden = DD, .ffn = FF, .score = MOE8_SCORE_SIGMOID, .norm_topk_prob = true,
                                 .act = MOE8_ACT_RELU2, .shared_ffn = FSS};
    moe8_rules *rs = NULL;
    if (k_rules_txt[i]) assert_int_equal(moe8_rules_parse(k_rules_txt[i], strlen(k_rules_txt[i]), "inline", &rs), MOE8_OK);
    moe8_layer *A = NULL, *B = NULL;
    assert_int_equal(moe8_layer_create(&c, rs, "experts", &A), MOE8_OK);
    assert_int_equal(moe8_layer_init_random(A, 80 + it), MOE8_OK);
    float *x = malloc(sizeof(float) * (size_t)(TT * DD)), *ya = malloc(sizeof(float) * (size_t)(TT * DD));
    float *yf = malloc(sizeof(float) * (size_t)(TT * DD)), *yb = malloc(sizeof(float) * (size_t)(TT * DD));
    tu_rng_reset(700 + it);
    tu_fill_normal(x, (size_t)(TT * DD), 1.0f);
    const size_t wa = moe8_layer_workspace_size(A, TT);
    void *wsa = NULL;
    assert_int_equal(posix_memalign(&wsa, 64, wa), 0);
    assert_int_equal(moe8_layer_forward(A, x, TT, ya, NULL, wsa, wa), MOE8_OK);
    assert_int_equal(moe8_layer_prepare(A), MOE8_OK);
    assert_int_equal(moe8_layer_forward_fused(A, x, TT, yf, wsa, wa), MOE8_OK);
    if (memcmp(ya, yf, sizeof(float) * (size_t)(TT * DD)) != 0) TU_FAIL("relu2, rules %zu, T = %lld: fused bytes differ", i, (long long)TT);
    moe8_prepared pr;
    assert_int_equal(moe8_layer_prepared(A, &pr), MOE8_OK); /* up [E, D, F] */
    assert_int_equal(moe8_layer_create_inference(&c, rs, "experts", &B), MOE8_OK);
    memcpy(moe8_layer_weight(B, MOE8_W_ROUTER, NULL), moe8_layer_weight_read(A, MOE8_W_ROUTER, NULL), sizeof(float) * (size_t)(DD * EE));
    const float *wu = moe8_layer_weight_read(A, MOE8_W_UP, NULL), *wd = moe8_layer_weight_read(A, MOE8_W_DOWN, NULL);
    for (int64_t e = 0; e < EE; e++) assert_int_equal(moe8_layer_put_expert(B, 0, e, wu + e * DD * FF, wd + e * FF * DD), MOE8_OK);
    assert_int_equal(moe8_layer_put_expert(B, 1, 0, moe8_layer_weight_read(A, MOE8_W_SHARED_UP, NULL),
                                           moe8_layer_weight_read(A, MOE8_W_SHARED_DOWN, NULL)), MOE8_OK);
    assert_int_equal(moe8_layer_finish_load(B), MOE8_OK);
    assert_int_equal(moe8_layer_forward_fused(B, x, TT, yb, wsa, wa), MOE8_OK);
    if (memcmp(ya, yb, sizeof(float) * (size_t)(TT * DD)) != 0)
      TU_FAIL("relu2, rules %zu, T = %lld: the layer built from memory differs from the training layer's bytes", i, (long long)TT);
    free(wsa); free(x); free(ya); free(yf); free(yb);
    moe8_layer_destroy(A);
    moe8_layer_destroy(B);
    moe8_rules_destroy(rs);
  }
  /* the forms it does not take (expert_bias it takes: NLLB-MoE's biased
  ** fc1 / fc2, test_capacity_ranked) */
  moe8_layer_config bad = {.num_experts = E, .top_k = K, .hidden = D, .ffn = F, .act = MOE8_ACT_RELU2, .shared_plain_act = true};
  moe8_layer *B = NULL;
  assert_int_equal(moe8_layer_create(&bad, NULL, "experts", &B), MOE8_ERR_INVALID_ARG);
  assert_non_null(strstr(moe8_last_error(), "shared_plain_act"));
  bad.shared_plain_act = false;
  bad.act = (moe8_expert_act)(MOE8_ACT_SILU + 1); /* past the last */
  assert_int_equal(moe8_layer_create(&bad, NULL, "experts", &B), MOE8_ERR_INVALID_ARG);
}

/* PhiMoE's sparsemixer, written here from transformers' sparsemixer
** (training false) in f32: choice c's top logit m (the first over all,
** ties to the lower index; the second over all but the first), the
** experts with (m - l) / max(|l|, m) > thr masked, weight exp(0) / Σ of
** exp(l - m) over the others (the first always out of the second's sum);
** a 0 / 0 (l = m = 0) is NaN in torch, not > thr: not masked. */
static void sparsemixer_ref(const float *l, int E, float thr, int32_t *ids, float *w, int *masked) {
  int first = -1;
  for (int c = 0; c < 2; c++) {
    int best = -1;
    for (int e = 0; e < E; e++)
      if (e != first && (best < 0 || l[e] > l[best])) best = e;
    const float m = l[best];
    float sum = 0.0f;
    for (int e = 0; e < E; e++) {
      if (e == first) continue;
      const float f = fabsf(l[e]) > m ? fabsf(l[e]) : m;
      const float q = (m - l[e]) / f; /* NaN for 0 / 0 */
      if (q > thr) { (*masked)++; continue; }
      sum += expf(l[e] - m);
    }
    ids[c] = best;
    w[c] = 1.0f / sum;
    first = best;
  }
}

/* The sparsemixer router's choices and weights to the byte against the
** rule above (random logits at two thresholds, all-negative logits, a tie
** at the top, zeros, a logit just inside and one just outside the
** threshold), with the routed scaling; its layer: the forward is the
** experts on those choices and weights (moe8_layer_experts) to the byte,
** the fused forward the same bytes; top_k other than 2, norm_topk_prob or
** a selection bias refused at create; backward and trainer refused by
** name. */
static void test_sparsemixer(void **state) {
  (void)state;
  enum { E = 8, T = 64, D = 32, F = 16 };
  static float l[T * E], w[T * 2], sc[T * E];
  static int32_t ids[T * 2];
  tu_rng_reset(7070);
  tu_fill_normal(l, T * E, 1.0f);
  for (int e = 0; e < E; e++) {
    l[0 * E + e] = -1.0f - 0.01f * (float)e;                 /* all negative: factor |l| */
    l[1 * E + e] = e == 2 || e == 5 ? 3.0f : 0.1f * (float)e; /* a tie at the top */
    l[2 * E + e] = e < 3 ? 0.0f : -0.5f;                      /* the top is 0: 0 / 0 for the other zeros */
    l[3 * E + e] = e == 0 ? 1.0f : e == 1 ? 0.985f : e == 2 ? 0.975f : -2.0f; /* inside and outside 2 x 0.01 */
    l[4 * E + e] = e == 0 ? 1.0f : e == 1 ? 0.5f : -3.0f; /* at jitter 0.25, (1 - 0.5) / 1 is the threshold exactly: kept */
  }
  for (int pass = 0; pass < 3; pass++) {
    const float jit = pass == 2 ? 0.25f : pass ? 0.3f : 0.01f, scale = pass == 1 ? 1.5f : 0.0f;
    const moe8_router_config rc = {.num_experts = E, .top_k = 2, .score = MOE8_SCORE_SPARSEMIXER, .routed_scaling_factor = scale,
                                   .jitter_eps = jit};
    assert_int_equal(moe8_route(&rc, l, T, sc, ids, w), MOE8_OK);
    int masked = 0, unmasked_second = 0;
    for (int t = 0; t < T; t++) {
      int32_t ri[2];
      float rw[2];
      sparsemixer_ref(l + t * E, E, 2.0f * jit, ri, rw, &masked);
      for (int j = 0; j < 2; j++) {
        const float want = pass == 1 ? rw[j] * scale : rw[j];
        if (ids[t * 2 + j] != ri[j] || moe8__f32_bits(w[t * 2 + j]) != moe8__f32_bits(want))
          TU_FAIL("sparsemixer (jitter %g): token %d slot %d: expert %d weight %a, want %d %a", (double)jit, t, j, ids[t * 2 + j],
                  (double)w[t * 2 + j], ri[j], (double)want);
      }
      unmasked_second += rw[1] < 1.0f;
    }
    if (!masked || !unmasked_second) TU_FAIL("sparsemixer (jitter %g): the mask never (%d) or always binds (%d)", (double)jit, masked,
                                             unmasked_second);
    if (!pass) { /* the designed tokens */
      assert_true(ids[2] == 2 && ids[3] == 5 && w[3] == 1.0f); /* the tie: the lower first, then the other, alone within 2% of it */
      assert_true(ids[4] == 0 && ids[5] == 1);                  /* zeros: 0 / 0 not masked, so the others share */
      assert_true(w[4] == 1.0f / 3.0f && w[5] == 0.5f);
      assert_true(ids[6] == 0 && ids[7] == 1 && w[6] == 1.0f / (1.0f + expf(0.985f - 1.0f))); /* 0.975 outside 0.02 of 1, 0.985 inside */
    }
    if (pass == 2) assert_true(ids[8] == 0 && w[8] == 1.0f / (1.0f + expf(-0.5f))); /* torch masks above the threshold, not at it */
  }
  /* the router refuses what the rule does not take */
  moe8_router_config bad = {.num_experts = E, .top_k = 3, .score = MOE8_SCORE_SPARSEMIXER, .jitter_eps = 0.01f};
  assert_int_equal(moe8_route(&bad, l, T, NULL, ids, w), MOE8_ERR_INVALID_ARG);
  bad.top_k = 2;
  bad.norm_topk_prob = true;
  assert_int_equal(moe8_route(&bad, l, T, NULL, ids, w), MOE8_ERR_INVALID_ARG);
  /* the layer */
  moe8_layer_config c = {.num_experts = E, .top_k = 2, .hidden = D, .ffn = F, .score = MOE8_SCORE_SPARSEMIXER, .router_jitter = 0.01f,
                         .shared_ffn = 24};
  moe8_layer *L;
  static float x[T * D], y0[T * D], y1[T * D], y2[T * D], lg[T * E];
  moe8_layer_config cb = c;
  cb.top_k = 3;
  assert_int_equal(moe8_layer_create(&cb, NULL, "experts", &L), MOE8_ERR_INVALID_ARG);
  cb = c;
  cb.norm_topk_prob = true;
  assert_int_equal(moe8_layer_create(&cb, NULL, "experts", &L), MOE8_ERR_INVALID_ARG);
  cb = c;
  cb.use_selection_bias = true;
  assert_int_equal(moe8_layer_create(&cb, NULL, "experts", &L), MOE8_ERR_INVALID_ARG);
  assert_int_equal(moe8_layer_create(&c, NULL, "experts", &L), MOE8_OK);
  assert_int_equal(moe8_layer_init_random(L, 71), MOE8_OK);
  tu_fill_normal(x, T * D, 1.0f);
  const size_t wsz = moe8_layer_workspace_size(L, T);
  void *ws;
  assert_int_equal(posix_memalign(&ws, 64, wsz), 0);
  float aux;
  assert_int_equal(moe8_layer_forward(L, x, T, y0, &aux, ws, wsz), MOE8_OK);
  assert_int_equal(moe8_router_logits(x, moe8_layer_weight_read(L, MOE8_W_ROUTER, NULL), T, D, E, lg), MOE8_OK);
  const moe8_router_config rc = {.num_experts = E, .top_k = 2, .score = MOE8_SCORE_SPARSEMIXER, .jitter_eps = 0.01f};
  assert_int_equal(moe8_route(&rc, lg, T, NULL, ids, w), MOE8_OK);
  assert_int_equal(moe8_layer_experts(L, x, T, ids, w, y1, ws, wsz), MOE8_OK);
  assert_memory_equal(y0, y1, sizeof y0);
  assert_int_equal(moe8_layer_forward(L, x, T, y0, &aux, ws, wsz), MOE8_OK);
  static float dx[T * D];
  const moe8_layer_grads g = {.dx = dx};
  assert_int_equal(moe8_layer_backward(L, x, T, x, ws, wsz, &g), MOE8_ERR_UNSUPPORTED);
  assert_non_null(strstr(moe8_last_error(), "sparsemixer"));
  moe8_trainer *tr = NULL;
  assert_int_equal(moe8_trainer_create(L, 0.01f, &tr), MOE8_ERR_UNSUPPORTED);
  assert_null(tr);
  assert_int_equal(moe8_layer_prepare(L), MOE8_OK);
  assert_int_equal(moe8_layer_forward_fused(L, x, T, y2, ws, wsz), MOE8_OK);
  assert_memory_equal(y0, y2, sizeof y0);
  free(ws);
  moe8_layer_destroy(L);
}

/* LongCat-Flash's identity experts (zero_experts): the router scores E + Z
** experts; the forward is the routed experts' combine on the real slots
** (moe8_layer_experts_routed, the identity slots skipped) plus Σ w · x
** over the identity slots in slot order, to the byte; the caller-routed
** moe8_layer_experts with identity ids gives the same bytes, and so does
** the fused forward; every gradient (the router's identity columns
** included) against finite differences; the trainer runs; a capacity
** factor with it is refused. */
static void test_zero_experts(void **state) {
  (void)state;
  enum { E = 4, Z = 3, ER = E + Z, K = 3, D = 32, F = 16, T = 6 };
  static float x[T * D], dout[T * D], y0[T * D], y1[T * D], y2[T * D], lg[T * ER], w[T * K], idn[T * D];
  static float dx[T * D], dwr[D * ER], dwg[E * D * F], dwu[E * D * F], dwd[E * F * D];
  static int32_t ids[T * K], real[T * K];
  moe8_layer_config c = {.num_experts = E, .top_k = K, .hidden = D, .ffn = F, .use_selection_bias = true, .routed_scaling_factor = 6.0f,
                         .zero_experts = Z};
  moe8_layer *L;
  moe8_layer_config cb = c;
  cb.capacity_factor = 1.0f;
  assert_int_equal(moe8_layer_create(&cb, NULL, "experts", &L), MOE8_ERR_UNSUPPORTED);
  assert_int_equal(moe8_layer_create(&c, NULL, "experts", &L), MOE8_OK);
  assert_int_equal(moe8_layer_init_random(L, 81), MOE8_OK);
  size_t n = 0;
  float *bias = moe8_layer_weight(L, MOE8_W_BIAS, &n), *wr = moe8_layer_weight(L, MOE8_W_ROUTER, NULL);
  assert_int_equal(n, ER);
  assert_int_equal(moe8_layer_get_config(L)->zero_experts, Z);
  for (int e = 0; e < ER; e++) bias[e] = e >= E ? 0.05f : 0.0f;
  const moe8_layer_grads g = {.dx = dx, .dwr = dwr, .dwg = dwg, .dwu = dwu, .dwd = dwd};
  void *ws;
  size_t wsz;
  memset(dwr, 0xFF, sizeof dwr); /* NaN: the backward must zero all E + Z columns */
  form_backward(L, x, dout, T, D, 82, &g, &ws, &wsz);
  float aux;
  assert_int_equal(moe8_layer_forward(L, x, T, y0, &aux, ws, wsz), MOE8_OK);
  /* the reference: the routing, the routed experts on the real slots, the identity slots added */
  assert_int_equal(moe8_router_logits(x, wr, T, D, ER, lg), MOE8_OK);
  const moe8_router_config rc = {.num_experts = ER, .top_k = K, .routed_scaling_factor = 6.0f, .selection_bias = bias};
  assert_int_equal(moe8_route(&rc, lg, T, NULL, ids, w), MOE8_OK);
  int nid = 0;
  for (int t = 0; t < T; t++) {
    for (int d = 0; d < D; d++) idn[t * D + d] = 0.0f;
    for (int j = 0; j < K; j++) {
      real[t * K + j] = ids[t * K + j] < E ? ids[t * K + j] : -1;
      if (ids[t * K + j] < E) continue;
      nid++;
      for (int d = 0; d < D; d++) idn[t * D + d] += w[t * K + j] * x[t * D + d];
    }
  }
  if (nid == 0 || nid == T * K) TU_FAIL("zero_experts: %d of %d slots on identity experts (want some, not all)", nid, T * K);
  assert_int_equal(moe8_layer_experts_routed(L, x, T, real, w, y1, ws, wsz), MOE8_OK);
  for (int i = 0; i < T * D; i++)
    if (moe8__f32_bits(y0[i]) != moe8__f32_bits(y1[i] + idn[i]))
      TU_FAIL("zero_experts: element %d is %a, want %a", i, (double)y0[i], (double)(y1[i] + idn[i]));
  assert_int_equal(moe8_layer_experts(L, x, T, ids, w, y2, ws, wsz), MOE8_OK);
  assert_memory_equal(y0, y2, sizeof y0);
  ids[0] = ER; /* past the identity experts: refused */
  assert_int_equal(moe8_layer_experts(L, x, T, ids, w, y2, ws, wsz), MOE8_ERR_SHAPE);
  /* the gradients (form_backward's, above) */
  const form_grad t[] = {
    {"x", x, T * D, dx}, {"router", wr, D * ER, dwr}, {"gate", moe8_layer_weight(L, MOE8_W_GATE, NULL), E * D * F, dwg},
    {"down", moe8_layer_weight(L, MOE8_W_DOWN, NULL), E * F * D, dwd}};
  form_fd_check("zero_experts", L, x, dout, T, D, ws, wsz, t, sizeof t / sizeof t[0]);
  /* the identity columns of the router get a gradient */
  float gid = 0.0f;
  for (int d = 0; d < D; d++)
    for (int e = E; e < ER; e++) gid += fabsf(dwr[d * ER + e]);
  assert_true(gid > 0.0f);
  assert_int_equal(moe8_layer_forward(L, x, T, y0, &aux, ws, wsz), MOE8_OK);
  assert_int_equal(moe8_layer_prepare(L), MOE8_OK);
  assert_int_equal(moe8_layer_forward_fused(L, x, T, y2, ws, wsz), MOE8_OK);
  assert_memory_equal(y0, y2, sizeof y0);
  moe8_trainer *tr;
  assert_int_equal(moe8_trainer_create(L, 0.01f, &tr), MOE8_OK);
  float loss;
  assert_int_equal(moe8_trainer_step(tr, x, dout, T, &loss, ws, wsz), MOE8_OK);
  assert_true(isfinite(loss));
  moe8_trainer_destroy(tr);
  free(ws);
  moe8_layer_destroy(L);
}

/* SwitchTransformers' expert capacity: a scalar rule written here (in each
** sequence of S rows, in row order, a token past the first `cap` that chose
** its expert is dropped: id -1) over the layer's own routing gives, through
** moe8_layer_experts, the bytes of the capacity layer's forward and fused
** forward; a dropped token's row is +0.0; the rule counted over all rows
** (a mutation) gives other bytes; seq_len not dividing T, the backward,
** the trainer, expert parallelism's refusal (test_ep) and the combinations
** with other routing features are refused. */
static void cap_rule(const int32_t *ids, int T, int K, int E, int S, int cap, int32_t *out) {
  int n[8] = {0};
  for (int t = 0; t < T; t++) {
    if (t % S == 0) memset(n, 0, sizeof n);
    for (int j = 0; j < K; j++) {
      const int e = ids[t * K + j];
      out[t * K + j] = ++n[e] > cap ? -1 : e;
    }
    (void)E;
  }
}

static void test_expert_capacity(void **state) {
  (void)state;
  enum { E = 4, K = 1, D = 32, F = 16, T = 24, S = 8, CAP = 2 };
  static float x[T * D], y0[T * D], y1[T * D], y2[T * D], lg[T * E], w[T * K], dout[T * D];
  static int32_t ids[T * K], kept[T * K], wrong[T * K];
  moe8_layer_config c = {.num_experts = E, .top_k = K, .hidden = D, .ffn = F, .act = MOE8_ACT_RELU, .router_bias = true,
                         .expert_capacity = CAP};
  moe8_layer *L;
  const moe8_layer_config bad[5] = {{.num_experts = E, .top_k = K, .hidden = D, .ffn = F, .expert_capacity = -1},
                                    {.num_experts = E, .top_k = K, .hidden = D, .ffn = F, .expert_capacity = CAP, .zero_experts = 1},
                                    {.num_experts = E, .top_k = K, .hidden = D, .ffn = F, .expert_capacity = CAP, .aux_loss_weight = 0.01f},
                                    {.num_experts = E, .top_k = K, .hidden = D, .ffn = F, .expert_capacity = CAP, .latent = 8},
                                    {.num_experts = E, .top_k = K, .hidden = D, .ffn = F, .expert_capacity = CAP, .expert_out_norm = true}};
  for (int i = 0; i < 5; i++) assert_int_equal(moe8_layer_create(&bad[i], NULL, "experts", &L), MOE8_ERR_UNSUPPORTED);
  assert_int_equal(moe8_layer_create(&c, NULL, "experts", &L), MOE8_OK);
  assert_int_equal(moe8_layer_init_random(L, 91), MOE8_OK);
  float *rb = moe8_layer_weight(L, MOE8_W_ROUTER_BIAS, NULL);
  for (int e = 0; e < E; e++) rb[e] = 0.1f * (float)(e - 1);
  tu_rng_reset(92);
  tu_fill_normal(x, T * D, 1.0f);
  tu_fill_normal(dout, T * D, 1.0f);
  const size_t wsz = moe8_layer_workspace_size(L, T);
  void *ws;
  assert_int_equal(posix_memalign(&ws, 64, wsz), 0);
  /* the routing without capacity, the rule applied here */
  assert_int_equal(moe8_router_logits(x, moe8_layer_weight_read(L, MOE8_W_ROUTER, NULL), T, D, E, lg), MOE8_OK);
  for (int t = 0; t < T; t++)
    for (int e = 0; e < E; e++) lg[t * E + e] += rb[e];
  const moe8_router_config rc = {.num_experts = E, .top_k = K};
  assert_int_equal(moe8_route(&rc, lg, T, NULL, ids, w), MOE8_OK);
  for (int seq = 0; seq <= S; seq += S) {
    cap_rule(ids, T, K, E, seq ? seq : T, CAP, kept);
    int dropped = 0;
    for (int a = 0; a < T * K; a++) dropped += kept[a] < 0;
    if (dropped == 0 || dropped == T) TU_FAIL("expert_capacity: %d of %d tokens dropped (want some, not all)", dropped, T);
    float aux;
    assert_int_equal(moe8_layer_forward_seq(L, x, T, NULL, seq, y0, &aux, ws, wsz), MOE8_OK);
    assert_int_equal(moe8_layer_experts(L, x, T, kept, w, y1, ws, wsz), MOE8_OK);
    assert_memory_equal(y0, y1, sizeof y0);
    for (int t = 0; t < T; t++)
      for (int d = 0; kept[t] < 0 && d < D; d++)
        if (moe8__f32_bits(y0[t * D + d]) != 0u) TU_FAIL("expert_capacity: dropped token %d's element %d is %a, not +0.0", t, d, (double)y0[t * D + d]);
    if (seq) { /* the mutation: counted over all rows */
      cap_rule(ids, T, K, E, T, CAP, wrong);
      assert_int_equal(moe8_layer_experts(L, x, T, wrong, w, y2, ws, wsz), MOE8_OK);
      assert_true(memcmp(y0, y2, sizeof y0) != 0);
    }
  }
  assert_int_equal(moe8_layer_prepare(L), MOE8_OK);
  assert_int_equal(moe8_layer_forward_fused_seq(L, x, T, NULL, S, y2, ws, wsz), MOE8_OK);
  float aux;
  assert_int_equal(moe8_layer_forward_seq(L, x, T, NULL, S, y0, &aux, ws, wsz), MOE8_OK);
  assert_memory_equal(y0, y2, sizeof y0);
  assert_int_equal(moe8_layer_forward_seq(L, x, T, NULL, 5, y0, &aux, ws, wsz), MOE8_ERR_SHAPE);
  assert_int_equal(moe8_layer_backward(L, x, T, dout, ws, wsz, &(moe8_layer_grads){.dx = y1}), MOE8_ERR_UNSUPPORTED);
  assert_non_null(strstr(moe8_last_error(), "expert_capacity"));
  moe8_trainer *tr;
  float loss;
  if (moe8_trainer_create(L, 0.01f, &tr) == MOE8_OK) {
    assert_int_equal(moe8_trainer_step(tr, x, dout, T, &loss, ws, wsz), MOE8_ERR_UNSUPPORTED);
    moe8_trainer_destroy(tr);
  }
  moe8_comm *cm; /* expert parallelism: refused by name at create, both modes */
  moe8_ep *ep = NULL;
  assert_int_equal(moe8_comm_create_single(&cm), MOE8_OK);
  for (int mode = 0; mode < 2; mode++) {
    const moe8_ep_options eo = {sizeof eo, mode ? MOE8_EP_ALLTOALL : MOE8_EP_RING};
    assert_int_equal(moe8_ep_create_ex(L, cm, &eo, &ep), MOE8_ERR_UNSUPPORTED);
    assert_null(ep);
    assert_non_null(strstr(moe8_last_error(), "expert_capacity"));
  }
  moe8_comm_destroy(cm);
  free(ws);
  moe8_layer_destroy(L);
}

/* NLLB-MoE's capacity (capacity_ranked) with ungated biased experts: a
** double reference written from transformers 4.x's NllbMoeTop2Router and
** NllbMoeSparseMLP in eval mode (5.24's block runs only experts 0 and 1):
** logits x·Wr + b, softmax; the first expert the argmax of the
** probabilities, the second the argmax of the logits but the first;
** locations1 = cumsum(one_hot1) - 1, locations2 = cumsum(one_hot2) - 1 +
** the first choices' counts (all tokens); capacity ceil(frac·T) (frac 0:
** expert_capacity), a choice kept where its location < capacity; the kept
** probabilities over max(p1 + p2, FLT_EPSILON); each expert fc2(relu(fc1 x
** + b1)) + b2, times 1 - moe_token_dropout (routed_scaling_factor), times
** its weight.  mutate 1: both choices counted in token order
** (interleaved), 2: renormalized before the drop: rules that are not
** NLLB's, which the comparison must tell apart. */
static int nllb_ref(const float *x, const float *wr, const float *rb, const float *up, const float *ub, const float *dn,
                    const float *db, int T, int E, int D, int F, double frac, int cap, double scale, int mutate, double *out) {
  int n1[8] = {0}, n2[8] = {0}, dropped = 0;
  const int C = frac > 0.0 ? (int)ceil(frac * (double)T) : cap;
  int *i1 = malloc(sizeof(int) * (size_t)T), *i2 = malloc(sizeof(int) * (size_t)T), *k1 = malloc(sizeof(int) * (size_t)T),
      *k2 = malloc(sizeof(int) * (size_t)T);
  double *p1 = malloc(sizeof(double) * (size_t)T), *p2 = malloc(sizeof(double) * (size_t)T), *h = malloc(sizeof(double) * (size_t)F);
  for (int t = 0; t < T; t++) {
    double l[8], m = -INFINITY, s = 0.0;
    for (int e = 0; e < E; e++) {
      l[e] = rb[e];
      for (int d = 0; d < D; d++) l[e] += (double)x[t * D + d] * wr[d * E + e];
      if (l[e] > m) m = l[e];
    }
    int a = 0, b = -1;
    for (int e = 1; e < E; e++) if (l[e] > l[a]) a = e;
    for (int e = 0; e < E; e++) if (e != a && (b < 0 || l[e] > l[b])) b = e;
    for (int e = 0; e < E; e++) s += exp(l[e] - m);
    i1[t] = a; i2[t] = b;
    p1[t] = exp(l[a] - m) / s; p2[t] = exp(l[b] - m) / s;
    n2[a]++; /* the first choices' counts, which the second ones queue after */
  }
  for (int t = 0; t < T; t++) {
    if (mutate == 1) { /* interleaved: token order, both choices */
      k1[t] = ++n1[i1[t]] <= C;
      k2[t] = ++n1[i2[t]] <= C;
    } else {
      k1[t] = ++n1[i1[t]] <= C;
    }
  }
  for (int t = 0; mutate != 1 && t < T; t++) k2[t] = ++n2[i2[t]] <= C;
  for (int t = 0; t < T; t++) {
    dropped += !k1[t] + !k2[t];
    double g1, g2;
    if (mutate == 2) {
      const double den = fmax(p1[t] + p2[t], FLT_EPSILON);
      g1 = k1[t] * p1[t] / den; g2 = k2[t] * p2[t] / den;
    } else {
      const double den = fmax(k1[t] * p1[t] + k2[t] * p2[t], FLT_EPSILON);
      g1 = k1[t] * p1[t] / den; g2 = k2[t] * p2[t] / den;
    }
    for (int d = 0; d < D; d++) out[t * D + d] = 0.0;
    for (int j = 0; j < 2; j++) {
      const int e = j ? i2[t] : i1[t];
      const double g = j ? g2 : g1;
      if (!(j ? k2[t] : k1[t])) continue;
      for (int f = 0; f < F; f++) {
        double v = ub[e * F + f];
        for (int d = 0; d < D; d++) v += (double)x[t * D + d] * up[((size_t)e * D + d) * F + f];
        h[f] = v > 0.0 ? v : 0.0;
      }
      for (int d = 0; d < D; d++) {
        double v = db[e * D + d];
        for (int f = 0; f < F; f++) v += h[f] * dn[((size_t)e * F + f) * D + d];
        out[t * D + d] += g * (v * scale);
      }
    }
  }
  free(i1); free(i2); free(k1); free(k2); free(p1); free(p2); free(h);
  return dropped;
}

static double max_abs_diff(const float *y, const double *r, int n, double *rmax) {
  double m = 0.0, a = 0.0;
  for (int i = 0; i < n; i++) {
    m = fmax(m, fabs((double)y[i] - r[i]));
    a = fmax(a, fabs(r[i]));
  }
  *rmax = a;
  return m;
}

static void test_capacity_ranked(void **state) {
  (void)state;
  enum { E = 4, K = 2, D = 32, F = 24, T = 24 };
  static float x[T * D], y0[T * D], y1[T * D], dout[T * D];
  static double want[T * D], wrong[T * D];
  const moe8_layer_config bad[4] = {
    {.num_experts = E, .top_k = K, .hidden = D, .ffn = F, .act = MOE8_ACT_RELU, .capacity_ranked = true, .capacity_fraction = 0.5,
     .norm_topk_prob = true},
    {.num_experts = E, .top_k = K, .hidden = D, .ffn = F, .act = MOE8_ACT_RELU, .capacity_ranked = true},
    {.num_experts = E, .top_k = K, .hidden = D, .ffn = F, .act = MOE8_ACT_RELU, .capacity_ranked = true, .capacity_fraction = NAN},
    {.num_experts = E, .top_k = K, .hidden = D, .ffn = F, .act = MOE8_ACT_RELU, .capacity_ranked = true, .capacity_fraction = 0.5,
     .zero_experts = 1}};
  moe8_layer *L;
  for (int i = 0; i < 4; i++) {
    assert_int_not_equal(moe8_layer_create(&bad[i], NULL, "experts", &L), MOE8_OK);
    assert_non_null(strstr(moe8_last_error(), i < 3 ? "capacity_ranked" : "capacity"));
  }
  tu_rng_reset(93);
  tu_fill_normal(x, T * D, 1.0f);
  tu_fill_normal(dout, T * D, 1.0f);
  /* the fraction (0.3 of 24: 8 a choice's queue), then expert_capacity 3 */
  for (int v = 0; v < 2; v++) {
    const moe8_layer_config c = {.num_experts = E, .top_k = K, .hidden = D, .ffn = F, .act = MOE8_ACT_RELU, .router_bias = true,
                                 .expert_bias = true, .capacity_ranked = true, .capacity_fraction = v ? 0.0 : 0.3,
                                 .expert_capacity = v ? 3 : 0, .routed_scaling_factor = 0.8f};
    assert_int_equal(moe8_layer_create(&c, NULL, "experts", &L), MOE8_OK);
    assert_int_equal(moe8_layer_init_random(L, 94 + v), MOE8_OK);
    size_t nb = 0;
    float *rb = moe8_layer_weight(L, MOE8_W_ROUTER_BIAS, NULL), *ub = moe8_layer_weight(L, MOE8_W_GU_BIAS, &nb),
          *db = moe8_layer_weight(L, MOE8_W_DOWN_BIAS, NULL);
    assert_int_equal((int)nb, E * F); /* ungated: up's bias only */
    tu_fill_normal(rb, E, 0.3f);
    tu_fill_normal(ub, E * F, 0.3f);
    tu_fill_normal(db, E * D, 0.3f);
    moe8_layer_weights_changed(L);
    const size_t wsz = moe8_layer_workspace_size(L, T);
    void *ws;
    assert_int_equal(posix_memalign(&ws, 64, wsz), 0);
    const float *wr = moe8_layer_weight_read(L, MOE8_W_ROUTER, NULL), *up = moe8_layer_weight_read(L, MOE8_W_UP, NULL),
                *dn = moe8_layer_weight_read(L, MOE8_W_DOWN, NULL);
    const int dropped = nllb_ref(x, wr, rb, up, ub, dn, db, T, E, D, F, c.capacity_fraction, 3, 0.8, 0, want);
    if (dropped < 4 || dropped > 2 * T - 4) TU_FAIL("capacity_ranked: %d of %d choices dropped (want some, not all)", dropped, 2 * T);
    float aux;
    assert_int_equal(moe8_layer_forward_seq(L, x, T, NULL, 5, y0, &aux, ws, wsz), MOE8_OK); /* seq_len not read */
    double rmax;
    const double err = max_abs_diff(y0, want, T * D, &rmax);
    if (!(err <= 1e-5 * rmax)) TU_FAIL("capacity_ranked (%s): max |moe8 - want| %g of outputs up to %g", v ? "expert_capacity" : "fraction", err, rmax);
    for (int m = 1; m <= 2; m++) { /* the mutated rules: told apart */
      nllb_ref(x, wr, rb, up, ub, dn, db, T, E, D, F, c.capacity_fraction, 3, 0.8, m, wrong);
      double wmax;
      if (max_abs_diff(y0, wrong, T * D, &wmax) <= 1e-3 * wmax) TU_FAIL("capacity_ranked: mutation %d not told apart", m);
    }
    nllb_ref(x, wr, rb, up, ub, dn, db, T, E, D, F, c.capacity_fraction, 3, 1.0, 0, wrong); /* without the dropout's scaling */
    double wmax;
    if (max_abs_diff(y0, wrong, T * D, &wmax) <= 1e-3 * wmax) TU_FAIL("capacity_ranked: the 0.8 scaling not told apart");
    int zero_rows = 0;
    for (int t = 0; t < T; t++) {
      bool z = true;
      for (int d = 0; d < D; d++) z &= want[t * D + d] == 0.0;
      zero_rows += z;
      for (int d = 0; z && d < D; d++)
        if (moe8__f32_bits(y0[t * D + d]) != 0u) TU_FAIL("capacity_ranked: token %d (both choices dropped) element %d is %a", t, d, (double)y0[t * D + d]);
    }
    if (v == 1 && zero_rows == 0) TU_FAIL("capacity_ranked: expert_capacity 3 dropped no token's both choices");
    assert_int_equal(moe8_layer_prepare(L), MOE8_OK);
    assert_int_equal(moe8_layer_forward_fused(L, x, T, y1, ws, wsz), MOE8_OK);
    assert_memory_equal(y0, y1, sizeof y0);
    assert_int_equal(moe8_layer_backward(L, x, T, dout, ws, wsz, &(moe8_layer_grads){.dx = y1}), MOE8_ERR_UNSUPPORTED);
    assert_non_null(strstr(moe8_last_error(), "capacity_ranked"));
    moe8_comm *cm;
    moe8_ep *ep = NULL;
    assert_int_equal(moe8_comm_create_single(&cm), MOE8_OK);
    const moe8_ep_options eo = {sizeof eo, MOE8_EP_RING};
    assert_int_equal(moe8_ep_create_ex(L, cm, &eo, &ep), MOE8_ERR_UNSUPPORTED);
    assert_non_null(strstr(moe8_last_error(), "capacity_ranked"));
    moe8_comm_destroy(cm);
    free(ws);
    moe8_layer_destroy(L);
  }
  /* ungated experts with biases, no capacity: the backward refused by name */
  const moe8_layer_config u = {.num_experts = E, .top_k = K, .hidden = D, .ffn = F, .act = MOE8_ACT_RELU, .expert_bias = true};
  assert_int_equal(moe8_layer_create(&u, NULL, "experts", &L), MOE8_OK);
  assert_int_equal(moe8_layer_init_random(L, 97), MOE8_OK);
  const size_t wsz = moe8_layer_workspace_size(L, T);
  void *ws;
  assert_int_equal(posix_memalign(&ws, 64, wsz), 0);
  float aux;
  assert_int_equal(moe8_layer_forward(L, x, T, y0, &aux, ws, wsz), MOE8_OK);
  assert_int_equal(moe8_layer_backward(L, x, T, dout, ws, wsz, &(moe8_layer_grads){.dx = y1}), MOE8_ERR_UNSUPPORTED);
  assert_non_null(strstr(moe8_last_error(), "expert_bias"));
  free(ws);
  moe8_layer_destroy(L);
}

/* Zaya's block (ZayaSparseMoeBlock: ZayaRouter, ZayaRouterMLP,
** ZayaExperts), a double reference written from transformers' code: the
** router state s = x·A + a (+ p ⊙ c after the first layer), RMSNorm(s) ⊙
** g, two Linear + exact GELU, the projection to E + 1 classes, softmax,
** the top-1 of p + balancing_biases weighted by p (no renormalization),
** the last class a skip expert (no compute, output +0.0), SwiGLU experts.
** Two layers carry the state (the first's into the second's), at T = 1, 7
** and 33 (an expert that no token chooses, the skip class chosen); the
** fused forward gives the unfused bytes, the state may be updated in
** place; two mutations of the reference (the state not added, the weight
** renormalized) are told apart; a missing or unwanted state, a non-finite
** one, the backward, the trainer, expert parallelism and bad configs are
** refused by name. */
typedef struct zaya_ref {
  int64_t     D, F, E, R;
  double      eps;
  const float *A, *a, *c, *g, *B1, *b1, *B2, *b2, *wr, *bias, *wg, *wu, *wd;
} zaya_ref;

static double zaya_gelu(double z) { return 0.5 * z * (1.0 + erf(z / sqrt(2.0))); }

/* Token x: the state s[R] and the output y[D]; returns the chosen class (E:
** the skip expert).  p: the previous layer's state or NULL.  mutate 1: the
** state not added; 2: the chosen weight renormalized (1). */
static int64_t zaya_ref_token(const zaya_ref *z, const float *x, const float *p, double *s, double *y, int mutate) {
  const int64_t D = z->D, F = z->F, E = z->E, R = z->R, C = E + 1;
  double u[64], v[64], w[64], l[64], pr[64] = {0}, ms = 0.0, mx = -1e300, sum = 0.0;
  for (int64_t r = 0; r < R; r++) {
    double acc = 0.0;
    for (int64_t d = 0; d < D; d++) acc += (double)x[d] * z->A[d * R + r];
    s[r] = acc + z->a[r] + (p && mutate != 1 ? (double)p[r] * z->c[r] : 0.0);
    ms += s[r] * s[r];
  }
  const double rr = 1.0 / sqrt(ms / (double)R + z->eps);
  for (int64_t r = 0; r < R; r++) u[r] = s[r] * rr * z->g[r];
  for (int64_t r = 0; r < R; r++) {
    double acc = z->b1[r];
    for (int64_t q = 0; q < R; q++) acc += u[q] * z->B1[q * R + r];
    v[r] = zaya_gelu(acc);
  }
  for (int64_t r = 0; r < R; r++) {
    double acc = z->b2[r];
    for (int64_t q = 0; q < R; q++) acc += v[q] * z->B2[q * R + r];
    w[r] = zaya_gelu(acc);
  }
  for (int64_t e = 0; e < C; e++) {
    l[e] = 0.0;
    for (int64_t r = 0; r < R; r++) l[e] += w[r] * z->wr[r * C + e];
    mx = l[e] > mx ? l[e] : mx;
  }
  for (int64_t e = 0; e < C; e++) sum += (pr[e] = exp(l[e] - mx));
  int64_t best = 0;
  for (int64_t e = 0; e < C; e++) {
    pr[e] /= sum;
    if (pr[e] + z->bias[e] > pr[best] + z->bias[best]) best = e;
  }
  for (int64_t d = 0; d < D; d++) y[d] = 0.0;
  if (best == E) return best;
  const double wt = mutate == 2 ? 1.0 : pr[best];
  for (int64_t f = 0; f < F; f++) {
    double gs = 0.0, us = 0.0;
    for (int64_t d = 0; d < D; d++) {
      gs += (double)x[d] * z->wg[(best * D + d) * F + f];
      us += (double)x[d] * z->wu[(best * D + d) * F + f];
    }
    const double h = gs / (1.0 + exp(-gs)) * us;
    for (int64_t d = 0; d < D; d++) y[d] += wt * h * z->wd[(best * F + f) * D + d];
  }
  return best;
}

static zaya_ref zaya_ref_of(const moe8_layer *L) {
  const moe8_layer_config *c = moe8_layer_get_config(L);
  return (zaya_ref){c->hidden, c->ffn, c->num_experts, c->router_mlp, c->rms_eps,
                    moe8_layer_weight_read(L, MOE8_W_ROUTER_DOWN, NULL), moe8_layer_weight_read(L, MOE8_W_ROUTER_DOWN_BIAS, NULL),
                    moe8_layer_weight_read(L, MOE8_W_ROUTER_STATE_SCALE, NULL), moe8_layer_weight_read(L, MOE8_W_ROUTER_MLP_NORM, NULL),
                    moe8_layer_weight_read(L, MOE8_W_ROUTER_FC1, NULL), moe8_layer_weight_read(L, MOE8_W_ROUTER_FC1_BIAS, NULL),
                    moe8_layer_weight_read(L, MOE8_W_ROUTER_FC2, NULL), moe8_layer_weight_read(L, MOE8_W_ROUTER_FC2_BIAS, NULL),
                    moe8_layer_weight_read(L, MOE8_W_ROUTER, NULL), moe8_layer_weight_read(L, MOE8_W_BIAS, NULL),
                    moe8_layer_weight_read(L, MOE8_W_GATE, NULL), moe8_layer_weight_read(L, MOE8_W_UP, NULL),
                    moe8_layer_weight_read(L, MOE8_W_DOWN, NULL)};
}

static void test_zaya_router(void **state) {
  (void)state;
  enum { E = 5, D = 48, F = 24, R = 20, TM = 33 };
  static float x[2][TM * D], y[2][TM * D], yf[TM * D], s[2][TM * R], sf[TM * R], sp[TM * R], dout[TM * D];
  static double yr[TM * D], sr[TM * R];
  const moe8_layer_config c0 = {.num_experts = E, .top_k = 1, .hidden = D, .ffn = F, .use_selection_bias = true, .router_mlp = R,
                                .skip_experts = 1, .rms_eps = 1e-5f};
  moe8_layer_config c1 = c0;
  c1.router_state = true;
  moe8_layer *L[2];
  assert_int_equal(moe8_layer_create(&c0, NULL, "model.layers.0.mlp.experts", &L[0]), MOE8_OK);
  assert_int_equal(moe8_layer_create(&c1, NULL, "model.layers.1.mlp.experts", &L[1]), MOE8_OK);
  assert_null(moe8_layer_weight_read(L[0], MOE8_W_ROUTER_STATE_SCALE, NULL)); /* the first layer's router takes no state */
  tu_rng_reset(101);
  for (int l = 0; l < 2; l++) {
    assert_int_equal(moe8_layer_init_random(L[l], 102 + (uint64_t)l), MOE8_OK);
    /* every vector away from its initial 0 or 1; logits large enough for a peaked softmax */
    static const moe8_weight_id vz[3] = {MOE8_W_ROUTER_DOWN_BIAS, MOE8_W_ROUTER_FC1_BIAS, MOE8_W_ROUTER_FC2_BIAS};
    for (int i = 0; i < 3; i++) tu_fill_normal(moe8_layer_weight(L[l], vz[i], NULL), R, 0.3f);
    float *g = moe8_layer_weight(L[l], MOE8_W_ROUTER_MLP_NORM, NULL), *cs = moe8_layer_weight(L[l], MOE8_W_ROUTER_STATE_SCALE, NULL);
    for (int r = 0; r < R; r++) g[r] = 1.0f + 0.3f * tu_normal();
    for (int r = 0; cs && r < R; r++) cs[r] = 1.0f + 0.5f * tu_normal();
    size_t nw;
    float *wr = moe8_layer_weight(L[l], MOE8_W_ROUTER, &nw);
    assert_int_equal(nw, (size_t)(R * (E + 1)));
    for (size_t i = 0; i < nw; i++) wr[i] *= 4.0f;
    /* expert 3 never chosen (a bias of -1 on a probability); the skip class a little favoured */
    static const float bias[E + 1] = {0.0f, 0.01f, -0.01f, -1.0f, 0.0f, 0.05f};
    memcpy(moe8_layer_weight(L[l], MOE8_W_BIAS, NULL), bias, sizeof bias);
    tu_fill_normal(x[l], TM * D, 1.0f);
  }
  tu_fill_normal(dout, TM * D, 1.0f);
  const size_t wsz = moe8_layer_workspace_size(L[1], TM);
  void *ws;
  assert_int_equal(posix_memalign(&ws, 64, wsz), 0);
  static const int64_t Ts[3] = {1, 7, TM};
  int64_t hits[E + 1] = {0};
  for (int ti = 0; ti < 3; ti++) {
    const int64_t T = Ts[ti];
    float aux;
    assert_int_equal(moe8_layer_forward_state(L[0], x[0], T, NULL, s[0], y[0], &aux, ws, wsz), MOE8_OK);
    assert_int_equal(moe8_layer_forward_state(L[1], x[1], T, s[0], s[1], y[1], &aux, ws, wsz), MOE8_OK);
    for (int l = 0; l < 2; l++) {
      const zaya_ref z = zaya_ref_of(L[l]);
      double ey = 0.0, my = 0.0, es = 0.0, ms = 0.0, em[3] = {0.0, 0.0, 0.0};
      for (int64_t t = 0; t < T; t++) {
        const float *p = l ? s[0] + t * R : NULL;
        const int64_t k = zaya_ref_token(&z, x[l] + t * D, p, sr + t * R, yr + t * D, 0);
        hits[k]++;
        for (int64_t d = 0; d < D; d++) {
          ey = fmax(ey, fabs(y[l][t * D + d] - yr[t * D + d]));
          my = fmax(my, fabs(yr[t * D + d]));
          if (k == E && moe8__f32_bits(y[l][t * D + d]) != 0u)
            TU_FAIL("zaya layer %d T %lld: token %lld chose the skip expert but its output[%lld] is %a, not +0.0", l, (long long)T,
                    (long long)t, (long long)d, (double)y[l][t * D + d]);
        }
        for (int64_t r = 0; r < R; r++) {
          es = fmax(es, fabs(s[l][t * R + r] - sr[t * R + r]));
          ms = fmax(ms, fabs(sr[t * R + r]));
        }
        for (int m = 1; m <= 2 && l; m++) { /* the mutations, against moe8's output */
          double ym[D], sm[R];
          zaya_ref_token(&z, x[l] + t * D, p, sm, ym, m);
          for (int64_t d = 0; d < D; d++) em[m] = fmax(em[m], fabs(y[l][t * D + d] - ym[d]));
        }
      }
      if (ey > 1e-5 * fmax(my, 1e-3) || es > 1e-5 * ms)
        TU_FAIL("zaya layer %d T %lld: output max |err| %.3g of %.3g, state %.3g of %.3g (tolerance 1e-5 relative)", l, (long long)T, ey,
                my, es, ms);
      if (l && T == TM && (em[1] <= 1e-3 * my || em[2] <= 1e-3 * my))
        TU_FAIL("zaya T %lld: a reference without the state (%.3g) or with the weight renormalized (%.3g) is not told apart", (long long)T,
                em[1], em[2]);
    }
    /* the fused forward: the same bytes, the state updated in place */
    assert_int_equal(moe8_layer_prepare(L[1]), MOE8_OK);
    memcpy(sp, s[0], sizeof(float) * (size_t)(T * R));
    assert_int_equal(moe8_layer_forward_fused_state(L[1], x[1], T, sp, sp, yf, ws, wsz), MOE8_OK);
    assert_memory_equal(yf, y[1], sizeof(float) * (size_t)(T * D));
    assert_memory_equal(sp, s[1], sizeof(float) * (size_t)(T * R));
    assert_int_equal(moe8_layer_prepare(L[0]), MOE8_OK);
    assert_int_equal(moe8_layer_forward_fused_state(L[0], x[0], T, NULL, sf, yf, ws, wsz), MOE8_OK);
    assert_memory_equal(yf, y[0], sizeof(float) * (size_t)(T * D));
    assert_memory_equal(sf, s[0], sizeof(float) * (size_t)(T * R));
    /* the state not wanted; the first layer by the plain forward */
    assert_int_equal(moe8_layer_forward_state(L[1], x[1], T, s[0], NULL, yf, &aux, ws, wsz), MOE8_OK);
    assert_memory_equal(yf, y[1], sizeof(float) * (size_t)(T * D));
    assert_int_equal(moe8_layer_forward(L[0], x[0], T, yf, &aux, ws, wsz), MOE8_OK);
    assert_memory_equal(yf, y[0], sizeof(float) * (size_t)(T * D));
  }
  if (hits[3] != 0 || hits[E] == 0 || hits[E] == 2 * (1 + 7 + TM))
    TU_FAIL("zaya: expert 3 chosen %lld times (want 0), the skip class %lld of %d (want some, not all)", (long long)hits[3],
            (long long)hits[E], 2 * (1 + 7 + TM));
  float aux;
  assert_int_equal(moe8_layer_forward_state(L[1], x[1], 0, s[0], s[1], y[1], &aux, ws, wsz), MOE8_OK); /* T = 0 */
  /* the state: missing, unwanted, non-finite */
  assert_int_equal(moe8_layer_forward_state(L[1], x[1], TM, NULL, s[1], y[1], &aux, ws, wsz), MOE8_ERR_INVALID_ARG);
  assert_non_null(strstr(moe8_last_error(), "model.layers.1.mlp.experts"));
  assert_non_null(strstr(moe8_last_error(), "router state"));
  assert_int_equal(moe8_layer_forward(L[1], x[1], TM, y[1], &aux, ws, wsz), MOE8_ERR_INVALID_ARG);
  assert_non_null(strstr(moe8_last_error(), "model.layers.1.mlp.experts"));
  assert_int_equal(moe8_layer_forward_fused(L[1], x[1], TM, y[1], ws, wsz), MOE8_ERR_INVALID_ARG);
  assert_int_equal(moe8_layer_forward_state(L[1], x[1], 0, NULL, NULL, y[1], &aux, ws, wsz), MOE8_ERR_INVALID_ARG); /* even at T = 0 */
  assert_int_equal(moe8_layer_forward_state(L[0], x[0], TM, s[0], s[1], y[0], &aux, ws, wsz), MOE8_ERR_INVALID_ARG);
  assert_non_null(strstr(moe8_last_error(), "takes no router state"));
  memcpy(sp, s[0], sizeof(float) * TM * R);
  sp[5 * R + 3] = NAN;
  assert_int_equal(moe8_layer_forward_state(L[1], x[1], TM, sp, s[1], y[1], &aux, ws, wsz), MOE8_ERR_NONFINITE);
  assert_non_null(strstr(moe8_last_error(), "router_state_in"));
  {
    const moe8_layer_config cp = {.num_experts = E, .top_k = 1, .hidden = D, .ffn = F};
    moe8_layer *P;
    assert_int_equal(moe8_layer_create(&cp, NULL, "experts", &P), MOE8_OK);
    assert_int_equal(moe8_layer_forward_state(P, x[0], TM, NULL, s[1], y[1], &aux, ws, wsz), MOE8_ERR_INVALID_ARG);
    assert_non_null(strstr(moe8_last_error(), "no router state"));
    assert_int_equal(moe8_layer_forward_state(P, x[0], TM, s[0], NULL, y[1], &aux, ws, wsz), MOE8_ERR_INVALID_ARG);
    moe8_layer_destroy(P);
  }
  /* the given routing (the serving op) needs no state: the routed bytes */
  {
    int32_t ids[TM];
    float wts[TM];
    for (int64_t t = 0; t < TM; t++) { ids[t] = (int32_t)(t % 3); wts[t] = 0.5f; }
    ids[4] = -1;
    assert_int_equal(moe8_layer_experts(L[1], x[1], TM, ids, wts, yf, ws, wsz), MOE8_OK);
  }
  /* backward, trainer, expert parallelism */
  for (int l = 0; l < 2; l++) {
    assert_int_equal(moe8_layer_forward_state(L[l], x[l], TM, l ? s[0] : NULL, s[l], y[l], &aux, ws, wsz), MOE8_OK);
    assert_int_equal(moe8_layer_backward(L[l], x[l], TM, dout, ws, wsz, &(moe8_layer_grads){.dx = yf}), MOE8_ERR_UNSUPPORTED);
    assert_non_null(strstr(moe8_last_error(), "MLP router"));
    moe8_trainer *tr;
    float loss;
    if (moe8_trainer_create(L[l], 0.01f, &tr) == MOE8_OK) {
      assert_int_equal(moe8_trainer_step(tr, x[l], dout, TM, &loss, ws, wsz), MOE8_ERR_UNSUPPORTED);
      moe8_trainer_destroy(tr);
    } else
      assert_non_null(strstr(moe8_last_error(), "MLP router"));
    moe8_comm *cm;
    moe8_ep *ep = NULL;
    assert_int_equal(moe8_comm_create_single(&cm), MOE8_OK);
    for (int mode = 0; mode < 2; mode++) {
      const moe8_ep_options eo = {sizeof eo, mode ? MOE8_EP_ALLTOALL : MOE8_EP_RING};
      assert_int_equal(moe8_ep_create_ex(L[l], cm, &eo, &ep), MOE8_ERR_UNSUPPORTED);
      assert_null(ep);
      assert_non_null(strstr(moe8_last_error(), "MLP router"));
    }
    moe8_comm_destroy(cm);
  }
  /* bad configs */
  {
    moe8_layer *B = NULL;
    moe8_layer_config b = c0;
    b.router_mlp = 0;
    b.router_state = true;
    assert_int_equal(moe8_layer_create(&b, NULL, "experts", &B), MOE8_ERR_INVALID_ARG);
    assert_non_null(strstr(moe8_last_error(), "router_state"));
    b = c0;
    b.router_mlp = -2;
    assert_int_equal(moe8_layer_create(&b, NULL, "experts", &B), MOE8_ERR_INVALID_ARG);
    b = c0;
    b.aux_loss_weight = 0.01f;
    assert_int_equal(moe8_layer_create(&b, NULL, "experts", &B), MOE8_ERR_UNSUPPORTED);
    assert_non_null(strstr(moe8_last_error(), "router_mlp"));
    b = c0;
    b.router_mlp = 0;
    b.zero_experts = 1;
    assert_int_equal(moe8_layer_create(&b, NULL, "experts", &B), MOE8_ERR_UNSUPPORTED);
    assert_non_null(strstr(moe8_last_error(), "skip_experts"));
    b = c0;
    b.top_k = E + 2;
    assert_int_equal(moe8_layer_create(&b, NULL, "experts", &B), MOE8_ERR_SHAPE);
    b = c0;
    b.skip_experts = -1;
    assert_int_equal(moe8_layer_create(&b, NULL, "experts", &B), MOE8_ERR_SHAPE);
    assert_null(B);
  }
  free(ws);
  moe8_layer_destroy(L[0]);
  moe8_layer_destroy(L[1]);
}

/* Doge's product-key experts (DogeCDMoE) against a double definition
** written from transformers' modeling_doge.py (pk_ref): its router's
** view(2, T, N) of the [T, 2N] logits (a token's two halves are other
** tokens' logits for T > 1), each half's sorted top-N, the N² candidate
** sums and their top-k (ties: the lower position), the softmax over the k
** (then / sum with norm_topk_prob), the single-neuron experts silu(x ·
** down_embed[e]) · w · up_embed[e] and the dense SwiGLU added.  Shapes: one
** token, odd token counts, E a square and not (the experts past N² never
** chosen: no tokens), k = N² (every candidate), D not a multiple of 16.
** A reference splitting each token's own logits (per_token) must differ
** for T > 1 (the test tells the quirk); one token run alone is per-token.
** Then: the fused forward's bytes, moe8_layer_experts with given ids (-1
** skipped), quantized rules (FP8, int8, weights or activations alone, a
** pair without a kernel) against the reference on the dequantized values,
** a layer loaded for inference (put_expert) to the bytes, and the
** refusals (configs, backward, trainer, expert parallelism). */
static double pk_silu(double v) { return v / (1.0 + exp(-v)); }

static void pk_ref(int T, int D, int E, int K, int Fs, bool norm, bool per_token, const double *x, const double *xe, const float *wr,
                   const double *keys,
                   const float *vals, const float *sg, const float *su, const float *sd, const int32_t *ids_in, const float *w_in,
                   double *out) {
  int N = 0;
  while ((N + 1) * (N + 1) <= E) N++;
  double *lg = calloc((size_t)(T * 2 * N), sizeof(double));
  for (int t = 0; t < T; t++)
    for (int c = 0; c < 2 * N; c++)
      for (int d = 0; d < D; d++) lg[t * 2 * N + c] += x[t * D + d] * (double)wr[d * 2 * N + c];
  for (int t = 0; t < T; t++) {
    int ids[64];
    double w[64];
    if (ids_in) {
      for (int j = 0; j < K; j++) { ids[j] = ids_in[t * K + j]; w[j] = w_in[t * K + j]; }
    } else {
      const double *h[2] = {per_token ? lg + t * 2 * N : lg + t * N, per_token ? lg + t * 2 * N + N : lg + (T + t) * N};
      int ix[2][32];
      for (int s = 0; s < 2; s++) { /* topk(N): descending, ties to the lower index */
        bool used[32] = {0};
        for (int a = 0; a < N; a++) {
          int best = -1;
          for (int i = 0; i < N; i++)
            if (!used[i] && (best < 0 || h[s][i] > h[s][best])) best = i;
          used[best] = true;
          ix[s][a] = best;
        }
      }
      bool taken[1024] = {0};
      double sc[64];
      for (int j = 0; j < K; j++) { /* topk(k) of the flattened [N, N] sums */
        int best = -1;
        double bs = 0.0;
        for (int p = 0; p < N * N; p++) {
          const double v = h[0][ix[0][p / N]] + h[1][ix[1][p % N]];
          if (!taken[p] && (best < 0 || v > bs)) { best = p; bs = v; }
        }
        taken[best] = true;
        sc[j] = bs;
        ids[j] = ix[0][best / N] * N + ix[1][best % N];
      }
      double m = sc[0], sum = 0.0;
      for (int j = 0; j < K; j++) m = sc[j] > m ? sc[j] : m;
      for (int j = 0; j < K; j++) sum += (w[j] = exp(sc[j] - m));
      for (int j = 0; j < K; j++) w[j] /= sum;
      if (norm) {
        double s2 = 0.0;
        for (int j = 0; j < K; j++) s2 += w[j];
        for (int j = 0; j < K; j++) w[j] /= s2;
      }
    }
    double *o = out + t * D;
    for (int d = 0; d < D; d++) o[d] = 0.0;
    for (int j = 0; j < K; j++) {
      const int e = ids[j];
      if (e < 0) continue;
      double u = 0.0;
      for (int d = 0; d < D; d++) u += (xe ? xe : x)[t * D + d] * keys[e * D + d];
      const double c = pk_silu(u) * w[j];
      for (int d = 0; d < D; d++) o[d] += c * (double)vals[e * D + d];
    }
    for (int f = 0; f < Fs; f++) {
      double g = 0.0, u = 0.0;
      for (int d = 0; d < D; d++) { g += x[t * D + d] * (double)sg[d * Fs + f]; u += x[t * D + d] * (double)su[d * Fs + f]; }
      const double hh = pk_silu(g) * u;
      for (int d = 0; d < D; d++) o[d] += hh * (double)sd[f * D + d];
    }
  }
  free(lg);
}

static double pk_err(const float *got, const double *yr, size_t n) {
  double mx = 0.0, e = 0.0;
  for (size_t i = 0; i < n; i++) {
    mx = fabs(yr[i]) > mx ? fabs(yr[i]) : mx;
    e = fabs((double)got[i] - yr[i]) > e ? fabs((double)got[i] - yr[i]) : e;
  }
  return e / (mx > 0.0 ? mx : 1.0);
}

static void test_product_keys(void **state) {
  (void)state;
  static const struct { int E, K, D, Fs; bool norm; } shapes[] = {
    {16, 3, 24, 20, false}, {20, 5, 40, 0, true}, {9, 9, 17, 8, false}, {30, 4, 33, 12, false}};
  static const int Ts[] = {1, 2, 5, 7};
  enum { TMAX = 7, DMAX = 40, EMAX = 30, KMAX = 9 };
  static float x[TMAX * DMAX], y0[TMAX * DMAX], y1[TMAX * DMAX], y2[TMAX * DMAX], w[TMAX * KMAX];
  static double xd[TMAX * DMAX], yr[TMAX * DMAX], alt[TMAX * DMAX], keys[EMAX * DMAX];
  static int32_t ids[TMAX * KMAX];
  for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
    const int E = shapes[si].E, K = shapes[si].K, D = shapes[si].D, Fs = shapes[si].Fs;
    const moe8_layer_config c = {.num_experts = E, .top_k = K, .hidden = D, .ffn = 1, .act = MOE8_ACT_SILU, .shared_ffn = Fs,
                                 .norm_topk_prob = shapes[si].norm, .product_keys = true};
    moe8_layer *L;
    assert_int_equal(moe8_layer_create(&c, NULL, "mlp.experts", &L), MOE8_OK);
    assert_int_equal(moe8_layer_init_random(L, 700 + si), MOE8_OK);
    size_t nr = 0;
    const float *wr = moe8_layer_weight_read(L, MOE8_W_ROUTER, &nr), *ku = moe8_layer_weight_read(L, MOE8_W_UP, NULL),
                *vd = moe8_layer_weight_read(L, MOE8_W_DOWN, NULL);
    int N = 0;
    while ((N + 1) * (N + 1) <= E) N++;
    assert_int_equal(nr, (size_t)(D * 2 * N));
    assert_null(moe8_layer_weight_read(L, MOE8_W_GATE, NULL));
    const float *sg = moe8_layer_weight_read(L, MOE8_W_SHARED_GATE, NULL), *su = moe8_layer_weight_read(L, MOE8_W_SHARED_UP, NULL),
                *sd = moe8_layer_weight_read(L, MOE8_W_SHARED_DOWN, NULL);
    for (int i = 0; i < E * D; i++) keys[i] = ku[i];
    const size_t wsz = moe8_layer_workspace_size(L, TMAX);
    void *ws;
    assert_int_equal(posix_memalign(&ws, 64, wsz), 0);
    tu_rng_reset(710 + si);
    tu_fill_normal(x, TMAX * DMAX, 1.0f);
    for (int i = 0; i < TMAX * DMAX; i++) xd[i] = x[i];
    for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
      const int T = Ts[ti];
      float aux;
      assert_int_equal(moe8_layer_forward(L, x, T, y0, &aux, ws, wsz), MOE8_OK);
      pk_ref(T, D, E, K, Fs, shapes[si].norm, false, xd, NULL, wr, keys, vd, sg, su, sd, NULL, NULL, yr);
      const double err = pk_err(y0, yr, (size_t)(T * D));
      if (!(err <= 1e-5)) TU_FAIL("product keys E %d k %d D %d Fs %d T %d: error %g against the double reference", E, K, D, Fs, T, err);
      pk_ref(T, D, E, K, Fs, shapes[si].norm, true, xd, NULL, wr, keys, vd, sg, su, sd, NULL, NULL, alt);
      if (T > 1 && pk_err(y0, alt, (size_t)(T * D)) <= 1e-3)
        TU_FAIL("product keys E %d T %d: the per-token split (not transformers' view) is not told apart", E, T);
      if (T == 1 && pk_err(y0, alt, (size_t)D) > 1e-5) TU_FAIL("product keys E %d: one token is not routed by its own logits", E);
    }
    /* the fused forward: the bytes of the forward */
    assert_int_equal(moe8_layer_prepare(L), MOE8_OK);
    float aux;
    assert_int_equal(moe8_layer_forward(L, x, TMAX, y0, &aux, ws, wsz), MOE8_OK);
    assert_int_equal(moe8_layer_forward_fused(L, x, TMAX, y1, ws, wsz), MOE8_OK);
    assert_memory_equal(y0, y1, sizeof(float) * (size_t)(TMAX * D));
    /* one token alone: its own logits */
    for (int t = 0; t < 3; t++) {
      assert_int_equal(moe8_layer_forward_fused(L, x + t * D, 1, y2, ws, wsz), MOE8_OK);
      pk_ref(1, D, E, K, Fs, shapes[si].norm, false, xd + t * D, NULL, wr, keys, vd, sg, su, sd, NULL, NULL, yr);
      if (!(pk_err(y2, yr, (size_t)D) <= 1e-5)) TU_FAIL("product keys E %d: token %d alone", E, t);
    }
    /* given routing: ids anywhere in [0, E) (past N² too), -1 skipped */
    for (int a = 0; a < TMAX * K; a++) {
      ids[a] = a % 5 == 4 ? -1 : (int32_t)(tu_u64() % (uint64_t)E);
      w[a] = tu_uniform(0.0f, 1.0f);
    }
    ids[0] = E - 1;
    assert_int_equal(moe8_layer_experts(L, x, TMAX, ids, w, y1, ws, wsz), MOE8_OK);
    pk_ref(TMAX, D, E, K, Fs, false, false, xd, NULL, wr, keys, vd, sg, su, sd, ids, w, yr);
    if (!(pk_err(y1, yr, (size_t)(TMAX * D)) <= 1e-5)) TU_FAIL("product keys E %d: moe8_layer_experts against the reference", E);
    assert_int_equal(moe8_layer_experts_routed(L, x, TMAX, ids, w, y2, ws, wsz), MOE8_OK);
    pk_ref(TMAX, D, E, K, 0, false, false, xd, NULL, wr, keys, vd, sg, su, sd, ids, w, yr);
    if (!(pk_err(y2, yr, (size_t)(TMAX * D)) <= 1e-5)) TU_FAIL("product keys E %d: moe8_layer_experts_routed against the reference", E);
    ids[1] = E;
    assert_int_equal(moe8_layer_experts(L, x, TMAX, ids, w, y1, ws, wsz), MOE8_ERR_INVALID_ARG);
    assert_non_null(strstr(moe8_last_error(), "topk_ids[0, 1]"));
    free(ws);
    moe8_layer_destroy(L);
  }
  (void)y2;
}

static void test_product_keys_quant(void **state) {
  (void)state;
  enum { E = 25, K = 6, D = 48, T = 5, N = 5 };
  static const char *const rules[] = {
    "{\"rules\": [{\"module_path\": \".*\", \"weight_qtype\": \"float8_e4m3fn\", \"act_qtype\": \"float8_e4m3fn\", \"tile_size\": 16}]}",
    "{\"rules\": [{\"module_path\": \".*\", \"weight_qtype\": \"int8\", \"act_qtype\": \"int8\"}]}",
    "{\"rules\": [{\"module_path\": \".*\", \"weight_qtype\": \"float8_e4m3fn\", \"tile_size\": 32}]}",
    "{\"rules\": [{\"module_path\": \".*\", \"act_qtype\": \"int8\", \"tile_size\": 16}]}",
    "{\"rules\": [{\"module_path\": \".*\", \"weight_qtype\": \"int8\", \"act_qtype\": \"float8_e4m3fn\"}]}",
    "{\"rules\": [{\"module_path\": \".*\", \"weight_qtype\": \"float8_e4m3fn\", \"act_qtype\": \"float8_e5m2\"}]}"};
  static float x[T * D], y0[T * D], y1[T * D], kq[E * D], vq[E * D], xq[T * D];
  static double xd[T * D], xed[T * D], yr[T * D], keys[E * D];
  static uint8_t codes[E * D];
  static float sc[E * D];
  tu_rng_reset(730);
  tu_fill_normal(x, T * D, 1.0f);
  for (int i = 0; i < T * D; i++) xd[i] = x[i];
  const moe8_layer_config c = {.num_experts = E, .top_k = K, .hidden = D, .ffn = 1, .act = MOE8_ACT_SILU, .product_keys = true};
  for (size_t ri = 0; ri < sizeof rules / sizeof rules[0]; ri++) {
    moe8_rules *rs;
    assert_int_equal(moe8_rules_parse(rules[ri], strlen(rules[ri]), "inline", &rs), MOE8_OK);
    moe8_layer *L, *Li;
    assert_int_equal(moe8_layer_create(&c, rs, "mlp.experts", &L), MOE8_OK);
    assert_int_equal(moe8_layer_init_random(L, 731), MOE8_OK);
    const float *wr = moe8_layer_weight_read(L, MOE8_W_ROUTER, NULL), *ku = moe8_layer_weight_read(L, MOE8_W_UP, NULL),
                *vd = moe8_layer_weight_read(L, MOE8_W_DOWN, NULL);
    const size_t wsz = moe8_layer_workspace_size(L, T);
    void *ws;
    assert_int_equal(posix_memalign(&ws, 64, wsz), 0);
    /* the reference's values: both tables quantized per expert row ([E, D, 1]), x per token */
    moe8_quant_spec wsp, asp;
    const moe8_rule *r = moe8_layer_rule(L);
    if (moe8_rule_weight_spec(r, &wsp)) {
      assert_int_equal(moe8_quantize(&wsp, ku, E, D, 1, codes, sc, NULL), MOE8_OK);
      assert_int_equal(moe8_dequantize(&wsp, codes, sc, E, D, 1, kq), MOE8_OK);
      assert_int_equal(moe8_quantize(&wsp, vd, E, D, 1, codes, sc, NULL), MOE8_OK);
      assert_int_equal(moe8_dequantize(&wsp, codes, sc, E, D, 1, vq), MOE8_OK);
    } else {
      memcpy(kq, ku, sizeof kq);
      memcpy(vq, vd, sizeof vq);
    }
    if (moe8_rule_act_spec(r, &asp)) {
      assert_int_equal(moe8_quantize(&asp, x, 1, T, D, codes, sc, NULL), MOE8_OK);
      assert_int_equal(moe8_dequantize(&asp, codes, sc, 1, T, D, xq), MOE8_OK);
    } else
      memcpy(xq, x, sizeof xq);
    for (int i = 0; i < E * D; i++) keys[i] = kq[i];
    for (int i = 0; i < T * D; i++) xed[i] = xq[i];
    float aux;
    assert_int_equal(moe8_layer_forward(L, x, T, y0, &aux, ws, wsz), MOE8_OK);
    pk_ref(T, D, E, K, 0, false, false, xd, xed, wr, keys, vq, NULL, NULL, NULL, NULL, NULL, yr);
    const double err = pk_err(y0, yr, (size_t)(T * D));
    if (!(err <= 1e-5)) TU_FAIL("product keys under %s: error %g against the reference on the quantized values", rules[ri], err);
    assert_int_equal(moe8_layer_prepare(L), MOE8_OK);
    assert_int_equal(moe8_layer_forward_fused(L, x, T, y1, ws, wsz), MOE8_OK);
    assert_memory_equal(y0, y1, sizeof y0);
    moe8_prepared pr;
    assert_int_equal(moe8_layer_prepared(L, &pr), MOE8_OK);
    /* the same layer loaded for inference, expert by expert: the same bytes */
    assert_int_equal(moe8_layer_create_inference(&c, rs, "mlp.experts", &Li), MOE8_OK);
    memcpy(moe8_layer_weight(Li, MOE8_W_ROUTER, NULL), wr, sizeof(float) * D * 2 * N);
    for (int e = 0; e < E; e++) assert_int_equal(moe8_layer_put_expert(Li, 0, e, ku + e * D, vd + e * D), MOE8_OK);
    assert_int_equal(moe8_layer_finish_load(Li), MOE8_OK);
    assert_int_equal(moe8_layer_forward_fused(Li, x, T, y1, ws, wsz), MOE8_OK);
    assert_memory_equal(y0, y1, sizeof y0);
    moe8_prepared pi;
    assert_int_equal(moe8_layer_prepared(Li, &pi), MOE8_OK);
    if (pr.s_down) { /* the value table's scales: per expert row, [E, nb, 1, 1] */
      const int64_t nb = pr.tile ? (D + pr.tile - 1) / pr.tile : 1;
      assert_memory_equal(pr.s_down, pi.s_down, sizeof(float) * (size_t)(E * nb));
      assert_memory_equal(pr.w_down, pi.w_down, (size_t)(E * D));
    }
    moe8_layer_destroy(Li);
    free(ws);
    moe8_layer_destroy(L);
    moe8_rules_destroy(rs);
  }
  /* refusals */
  moe8_layer *L = NULL;
  const moe8_layer_config bad[] = {
    {.num_experts = 16, .top_k = 2, .hidden = 8, .ffn = 1, .act = MOE8_ACT_RELU, .product_keys = true},
    {.num_experts = 16, .top_k = 2, .hidden = 8, .ffn = 2, .act = MOE8_ACT_SILU, .product_keys = true},
    {.num_experts = 16, .top_k = 2, .hidden = 8, .ffn = 1, .act = MOE8_ACT_SILU},
    {.num_experts = 16, .top_k = 2, .hidden = 8, .ffn = 1, .act = MOE8_ACT_SILU, .product_keys = true, .use_selection_bias = true},
    {.num_experts = 16, .top_k = 2, .hidden = 8, .ffn = 1, .act = MOE8_ACT_SILU, .product_keys = true, .router_bias = true},
    {.num_experts = 16, .top_k = 2, .hidden = 8, .ffn = 1, .act = MOE8_ACT_SILU, .product_keys = true, .aux_loss_weight = 0.01f},
    {.num_experts = 20, .top_k = 17, .hidden = 8, .ffn = 1, .act = MOE8_ACT_SILU, .product_keys = true},
    {.num_experts = MOE8_MAX_PK_EXPERTS + 1, .top_k = 2, .hidden = 8, .ffn = 1, .act = MOE8_ACT_SILU, .product_keys = true}};
  static const char *const why[] = {"silu", "ffn 1", "product_keys", "selection bias", "router bias", "aux loss", "top_k = 17",
                                    "num_experts"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    assert_int_not_equal(moe8_layer_create(&bad[i], NULL, "experts", &L), MOE8_OK);
    if (!strstr(moe8_last_error(), why[i])) TU_FAIL("product keys bad config %zu: '%s' does not name %s", i, moe8_last_error(), why[i]);
  }
  const moe8_layer_config big = {.num_experts = 16384, .top_k = 64, .hidden = 8, .ffn = 1, .act = MOE8_ACT_SILU, .product_keys = true};
  assert_int_equal(moe8_layer_create(&big, NULL, "experts", &L), MOE8_OK); /* past MOE8_MAX_EXPERTS */
  moe8_layer_destroy(L);
  {
    static const char mx[] = "{\"rules\": [{\"module_path\": \".*\", \"weight_qtype\": \"mxfp4\"}]}";
    moe8_rules *rs;
    assert_int_equal(moe8_rules_parse(mx, strlen(mx), "inline", &rs), MOE8_OK);
    assert_int_equal(moe8_layer_create_inference(&c, rs, "experts", &L), MOE8_ERR_UNSUPPORTED);
    moe8_rules_destroy(rs);
  }
  assert_int_equal(moe8_layer_create(&c, NULL, "experts", &L), MOE8_OK);
  assert_int_equal(moe8_layer_init_random(L, 732), MOE8_OK);
  const size_t wsz = moe8_layer_workspace_size(L, T);
  void *ws;
  assert_int_equal(posix_memalign(&ws, 64, wsz), 0);
  float aux;
  assert_int_equal(moe8_layer_forward(L, x, T, y0, &aux, ws, wsz), MOE8_OK);
  assert_int_equal(moe8_layer_backward(L, x, T, y0, ws, wsz, &(moe8_layer_grads){.dx = y1}), MOE8_ERR_UNSUPPORTED);
  assert_non_null(strstr(moe8_last_error(), "product-key"));
  moe8_trainer *tr;
  float loss;
  if (moe8_trainer_create(L, 0.01f, &tr) == MOE8_OK) {
    assert_int_equal(moe8_trainer_step(tr, x, y0, T, &loss, ws, wsz), MOE8_ERR_UNSUPPORTED);
    moe8_trainer_destroy(tr);
  }
  moe8_comm *cm;
  moe8_ep *ep = NULL;
  assert_int_equal(moe8_comm_create_single(&cm), MOE8_OK);
  for (int mode = 0; mode < 2; mode++) {
    const moe8_ep_options eo = {sizeof eo, mode ? MOE8_EP_ALLTOALL : MOE8_EP_RING};
    assert_int_equal(moe8_ep_create_ex(L, cm, &eo, &ep), MOE8_ERR_UNSUPPORTED);
    assert_null(ep);
    assert_non_null(strstr(moe8_last_error(), "product-key"));
  }
  moe8_comm_destroy(cm);
  /* a non-finite input is named, no abort */
  x[3] = NAN;
  assert_int_equal(moe8_layer_forward(L, x, T, y0, &aux, ws, wsz), MOE8_ERR_NONFINITE);
  x[3] = 0.5f;
  free(ws);
  moe8_layer_destroy(L);
}

/* ERNIE-4.5's renormalization, w / max(sum, norm_min): the router's
** weights to the byte (both sides of the clamp occur), and the layer's
** gradients against finite differences of its forward. */
static void test_norm_min(void **state) {
  (void)state;
  enum { E = 8, K = 2, D = 16, F = 12, T = 24 };
  static float logits[T * E], sc[T * E], w[T * K];
  static int32_t ids[T * K];
  tu_rng_reset(91);
  tu_fill_normal(logits, T * E, 0.6f);
  const float nm = 0.45f;
  const moe8_router_config rc = {.num_experts = E, .top_k = K, .score = MOE8_SCORE_SOFTMAX, .norm_topk_prob = true, .norm_min = nm};
  assert_int_equal(moe8_route(&rc, logits, T, sc, ids, w), MOE8_OK);
  int below = 0;
  for (int t = 0; t < T; t++) {
    float sum = 0.0f;
    for (int j = 0; j < K; j++) sum += sc[t * E + ids[t * K + j]];
    below += sum < nm;
    const float den = sum < nm ? nm : sum;
    for (int j = 0; j < K; j++) {
      const float want = sc[t * E + ids[t * K + j]] / den;
      if (moe8__f32_bits(w[t * K + j]) != moe8__f32_bits(want)) TU_FAIL("norm_min: token %d weight %d is %a, want %a", t, j, (double)w[t * K + j], (double)want);
    }
  }
  if (below == 0 || below == T) TU_FAIL("norm_min: %d of %d tokens below the clamp (want both sides)", below, T);
  moe8_router_config bad = rc;
  bad.norm_min = -1.0f;
  assert_int_equal(moe8_route(&bad, logits, T, sc, ids, w), MOE8_ERR_INVALID_ARG);
  /* LFM2-MoE's epsilon: w / (sum + norm_eps), the sum first */
  const moe8_router_config re = {.num_experts = E, .top_k = K, .score = MOE8_SCORE_SIGMOID, .norm_topk_prob = true, .norm_eps = 0.25f};
  assert_int_equal(moe8_route(&re, logits, T, sc, ids, w), MOE8_OK);
  for (int t = 0; t < T; t++) {
    float sum = 0.0f;
    for (int j = 0; j < K; j++) sum += sc[t * E + ids[t * K + j]];
    sum += 0.25f;
    for (int j = 0; j < K; j++)
      if (moe8__f32_bits(w[t * K + j]) != moe8__f32_bits(sc[t * E + ids[t * K + j]] / sum)) TU_FAIL("norm_eps: token %d weight %d", t, j);
  }
  /* Kolibri-1's selection: the top-k of logit + bias (a bias that reorders
  ** the logits), the weights the chosen sigmoid scores */
  float bias[E];
  for (int e = 0; e < E; e++) bias[e] = 0.4f * (float)((e * 5) % 7) - 1.2f;
  const moe8_router_config rl = {.num_experts = E, .top_k = K, .score = MOE8_SCORE_SIGMOID, .selection_bias = bias, .select_logits = true};
  assert_int_equal(moe8_route(&rl, logits, T, sc, ids, w), MOE8_OK);
  int differs = 0;
  for (int t = 0; t < T; t++) {
    bool used[E] = {false};
    for (int j = 0; j < K; j++) {
      int best = -1;
      for (int e = 0; e < E; e++)
        if (!used[e] && (best < 0 || logits[t * E + e] + bias[e] > logits[t * E + best] + bias[best])) best = e;
      used[best] = true;
      if (ids[t * K + j] != best) TU_FAIL("select_logits: token %d choice %d is %d, want %d", t, j, ids[t * K + j], best);
      if (moe8__f32_bits(w[t * K + j]) != moe8__f32_bits(sc[t * E + best])) TU_FAIL("select_logits: token %d weight %d", t, j);
      int bs = -1; /* what score + bias would choose */
      for (int e = 0; e < E; e++) if (bs < 0 || sc[t * E + e] + bias[e] > sc[t * E + bs] + bias[bs]) bs = e;
      differs += j == 0 && bs != ids[t * K];
    }
  }
  if (!differs) TU_FAIL("select_logits: the test's bias never changes the choice");
  /* AXK2's group mask: 4 groups of 2, 1 kept; the dropped groups' experts
  ** select with 0.0 (-inf without group_mask_zero), ties to the lower
  ** index; a bias that makes the kept experts' values negative, so that a
  ** dropped expert (0.0) beats the kept group's second one */
  for (int e = 0; e < E; e++) bias[e] = -0.9f + 0.05f * (float)e;
  for (int zero = 0; zero < 2; zero++) {
    const moe8_router_config rg = {.num_experts = E, .top_k = K, .score = MOE8_SCORE_SIGMOID, .selection_bias = bias, .n_group = 4,
                                   .topk_group = 1, .group_mask_zero = zero != 0};
    assert_int_equal(moe8_route(&rg, logits, T, sc, ids, w), MOE8_OK);
    int dropped_chosen = 0;
    for (int t = 0; t < T; t++) {
      float v[E], gs[4];
      for (int e = 0; e < E; e++) v[e] = sc[t * E + e] + bias[e];
      int kg = 0;
      for (int g = 0; g < 4; g++) { gs[g] = v[2 * g] + v[2 * g + 1]; if (gs[g] > gs[kg]) kg = g; }
      for (int e = 0; e < E; e++) if (e / 2 != kg) v[e] = zero ? 0.0f : -INFINITY;
      bool used[E] = {false};
      for (int j = 0; j < K; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) if (!used[e] && (best < 0 || v[e] > v[best])) best = e;
        used[best] = true;
        if (ids[t * K + j] != best) TU_FAIL("group_mask_zero %d: token %d choice %d is %d, want %d", zero, t, j, ids[t * K + j], best);
        if (moe8__f32_bits(w[t * K + j]) != moe8__f32_bits(sc[t * E + best])) TU_FAIL("group_mask_zero %d: token %d weight %d", zero, t, j);
        dropped_chosen += best / 2 != kg;
      }
    }
    if (zero ? dropped_chosen == 0 : dropped_chosen != 0)
      TU_FAIL("group_mask_zero %d: %d choices from dropped groups (want %s)", zero, dropped_chosen, zero ? "some" : "none");
  }
  /* the layer's backward */
  moe8_layer_config c = {.num_experts = E, .top_k = K, .hidden = D, .ffn = F, .norm_topk_prob = true, .use_selection_bias = true,
                         .norm_min = 0.45f, .norm_eps = 0.05f};
  moe8_layer *L;
  assert_int_equal(moe8_layer_create(&c, NULL, "experts", &L), MOE8_OK);
  assert_int_equal(moe8_layer_init_random(L, 5), MOE8_OK);
  {
    float *wr = moe8_layer_weight(L, MOE8_W_ROUTER, NULL);
    tu_rng_reset(92);
    tu_fill_normal(wr, D * E, 0.15f);
  }
  static float x[T * D], dout[T * D], dx[T * D], dwr[D * E], dwg[E * D * F], dwu[E * D * F], dwd[E * F * D];
  const moe8_layer_grads g = {.dx = dx, .dwr = dwr, .dwg = dwg, .dwu = dwu, .dwd = dwd};
  void *ws;
  size_t wsz;
  form_backward(L, x, dout, T, D, 93, &g, &ws, &wsz);
  const form_grad t[] = {{"x", x, T * D, dx}, {"router", moe8_layer_weight(L, MOE8_W_ROUTER, NULL), D * E, dwr},
                         {"gate", moe8_layer_weight(L, MOE8_W_GATE, NULL), E * D * F, dwg}};
  form_fd_check("norm_min", L, x, dout, T, D, ws, wsz, t, sizeof t / sizeof t[0]);
  free(ws);
  moe8_layer_destroy(L);
}

/* Inkling's router-scored shared experts (scored_shared S): the top
** (K - S) of the first E - S experts by sigmoid score + bias, then the
** last S experts in order, all K weights the chosen scores over their sum
** times the scale, to the byte against a scalar rule; refusals; the
** layer's gradients against finite differences (the shared experts'
** weights and the router's rows that score them included); the fused
** forward's bytes equal the forward's. */
static void test_scored_shared(void **state) {
  (void)state;
  enum { E = 10, S = 2, K = 4, D = 16, F = 12, T = 24 };
  static float logits[T * E], sc[T * E], w[T * K];
  static int32_t ids[T * K];
  float bias[E];
  tu_rng_reset(131);
  tu_fill_normal(logits, T * E, 0.8f);
  for (int e = 0; e < E; e++) bias[e] = e < E - S ? 0.3f * (float)((e * 3) % 5) - 0.6f : 0.0f;
  const moe8_router_config rc = {.num_experts = E, .top_k = K, .score = MOE8_SCORE_SIGMOID, .norm_topk_prob = true,
                                 .routed_scaling_factor = 5.6f, .selection_bias = bias, .scored_shared = S};
  assert_int_equal(moe8_route(&rc, logits, T, sc, ids, w), MOE8_OK);
  int shared_would_win = 0;
  for (int t = 0; t < T; t++) {
    bool used[E] = {false};
    int want[K];
    for (int j = 0; j < K - S; j++) {
      int best = -1;
      for (int e = 0; e < E - S; e++)
        if (!used[e] && (best < 0 || sc[t * E + e] + bias[e] > sc[t * E + best] + bias[best])) best = e;
      used[best] = true;
      want[j] = best;
    }
    for (int j = K - S; j < K; j++) want[j] = E - S + (j - (K - S));
    float sum = 0.0f;
    for (int j = 0; j < K; j++) sum += sc[t * E + want[j]];
    for (int j = 0; j < K; j++) {
      if (ids[t * K + j] != want[j]) TU_FAIL("scored_shared: token %d slot %d is %d, want %d", t, j, ids[t * K + j], want[j]);
      const float ww = sc[t * E + want[j]] / sum * 5.6f;
      if (moe8__f32_bits(w[t * K + j]) != moe8__f32_bits(ww)) TU_FAIL("scored_shared: token %d weight %d is %a, want %a", t, j, (double)w[t * K + j], (double)ww);
    }
    for (int e = E - S; e < E; e++) shared_would_win += sc[t * E + e] > sc[t * E + want[K - S - 1]] + bias[want[K - S - 1]];
  }
  if (!shared_would_win) TU_FAIL("scored_shared: no shared expert would have been chosen by score: the test does not tell the rule apart");
  moe8_router_config bad = rc;
  bad.scored_shared = K;
  assert_int_equal(moe8_route(&bad, logits, T, sc, ids, w), MOE8_ERR_INVALID_ARG);
  bad.scored_shared = 1;
  bad.n_group = 2;
  bad.topk_group = 1;
  assert_int_equal(moe8_route(&bad, logits, T, sc, ids, w), MOE8_ERR_INVALID_ARG);
  /* the layer: forward, backward, fused */
  moe8_layer_config c = {.num_experts = E, .top_k = K, .hidden = D, .ffn = F, .score = MOE8_SCORE_SIGMOID, .norm_topk_prob = true,
                         .routed_scaling_factor = 3.0f, .use_selection_bias = true, .scored_shared = S};
  moe8_layer *L;
  moe8_layer_config cb = c;
  cb.scored_shared = -1;
  assert_int_equal(moe8_layer_create(&cb, NULL, "experts", &L), MOE8_ERR_INVALID_ARG);
  assert_int_equal(moe8_layer_create(&c, NULL, "experts", &L), MOE8_OK);
  assert_int_equal(moe8_layer_init_random(L, 7), MOE8_OK);
  {
    float *wr = moe8_layer_weight(L, MOE8_W_ROUTER, NULL), *b = moe8_layer_weight(L, MOE8_W_BIAS, NULL);
    tu_rng_reset(132);
    tu_fill_normal(wr, D * E, 0.2f);
    for (int e = 0; e < E; e++) b[e] = bias[e];
  }
  static float x[T * D], dout[T * D], dx[T * D], dwr[D * E], dwg[E * D * F], dwu[E * D * F], dwd[E * F * D], y1[T * D], y2[T * D];
  const moe8_layer_grads g = {.dx = dx, .dwr = dwr, .dwg = dwg, .dwu = dwu, .dwd = dwd};
  void *ws;
  size_t wsz;
  form_backward(L, x, dout, T, D, 133, &g, &ws, &wsz);
  /* the shared experts' weights get gradients from every token */
  double shared_g = 0;
  for (int i = (E - S) * D * F; i < E * D * F; i++) shared_g += fabs(dwg[i]);
  if (!(shared_g > 0)) TU_FAIL("scored_shared: the shared experts' gate weights have no gradient");
  const form_grad t[] = {{"x", x, T * D, dx}, {"router", moe8_layer_weight(L, MOE8_W_ROUTER, NULL), D * E, dwr},
                         {"shared gate", moe8_layer_weight(L, MOE8_W_GATE, NULL) + (E - S) * D * F, S * D * F, dwg + (E - S) * D * F},
                         {"down", moe8_layer_weight(L, MOE8_W_DOWN, NULL), E * F * D, dwd}};
  form_fd_check("scored_shared", L, x, dout, T, D, ws, wsz, t, sizeof t / sizeof t[0]);
  float aux;
  assert_int_equal(moe8_layer_forward(L, x, T, y1, &aux, ws, wsz), MOE8_OK);
  assert_int_equal(moe8_layer_prepare(L), MOE8_OK);
  assert_int_equal(moe8_layer_forward_fused(L, x, T, y2, ws, wsz), MOE8_OK);
  if (memcmp(y1, y2, sizeof y1) != 0) TU_FAIL("scored_shared: fused bytes differ from the forward's");
  free(ws);
  moe8_layer_destroy(L);
}

/* The trainer on GPT-OSS's form: its first step moves every bias by Adam's
** first step on moe8_layer_backward's gradient of the trainer's loss, to
** the byte; and 40 steps on a teacher's outputs lower the loss. */
static void test_gpt_oss_form_trainer(void **state) {
  (void)state;
  enum { E = 4, K = 2, D = 32, F = 16, T = 12 };
  moe8_layer_config c = {.num_experts = E, .top_k = K, .hidden = D, .ffn = F, .norm_topk_prob = true, .act = MOE8_ACT_SWIGLU_CLAMP,
                         .act_alpha = 1.702f, .act_limit = 0.8f, .router_bias = true, .expert_bias = true};
  const moe8_weight_id bids[3] = {MOE8_W_ROUTER_BIAS, MOE8_W_GU_BIAS, MOE8_W_DOWN_BIAS};
  moe8_layer *L[3]; /* [0] trained, [1] its twin for the hand-made step, [2] the teacher */
  for (int i = 0; i < 3; i++) {
    assert_int_equal(moe8_layer_create(&c, NULL, "experts", &L[i]), MOE8_OK);
    assert_int_equal(moe8_layer_init_random(L[i], i == 2 ? 99 : 12), MOE8_OK);
    for (int b = 0; b < 3; b++) {
      size_t n;
      float *w = moe8_layer_weight(L[i], bids[b], &n);
      tu_rng_reset((i == 2 ? 90 : 80) + (uint64_t)b);
      tu_fill_normal(w, n, 0.3f);
    }
  }
  static float x[T * D], y[T * D], out[T * D], dout[T * D];
  tu_rng_reset(81);
  tu_fill_normal(x, T * D, 1.0f);
  const size_t wsz = moe8_layer_workspace_size(L[0], T);
  void *ws;
  assert_int_equal(posix_memalign(&ws, 64, wsz), 0);
  float aux;
  assert_int_equal(moe8_layer_forward(L[2], x, T, y, &aux, ws, wsz), MOE8_OK);
  /* the hand-made first step on the twin */
  const float lr = 0.01f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, c1 = 1.0f - powf(b1, 1.0f), c2 = 1.0f - powf(b2, 1.0f);
  assert_int_equal(moe8_layer_forward(L[1], x, T, out, &aux, ws, wsz), MOE8_OK);
  for (int i = 0; i < T * D; i++) dout[i] = 2.0f / (float)(T * D) * (out[i] - y[i]);
  static float drb[E], dgub[E * 2 * F], ddb[E * D];
  const moe8_layer_grads g = {.dwrb = drb, .dwgub = dgub, .dwdb = ddb};
  assert_int_equal(moe8_layer_backward(L[1], x, T, dout, ws, wsz, &g), MOE8_OK);
  const float *gr[3] = {drb, dgub, ddb};
  moe8_trainer *tr;
  assert_int_equal(moe8_trainer_create(L[0], lr, &tr), MOE8_OK);
  float first, last = 0.0f;
  assert_int_equal(moe8_trainer_step(tr, x, y, T, &first, ws, wsz), MOE8_OK);
  for (int b = 0; b < 3; b++) {
    size_t n;
    float *p = moe8_layer_weight(L[1], bids[b], &n);
    const float *q = moe8_layer_weight_read(L[0], bids[b], NULL);
    size_t moved = 0;
    for (size_t i = 0; i < n; i++) {
      const float m = (1.0f - b1) * gr[b][i], v = (1.0f - b2) * gr[b][i] * gr[b][i];
      const float before = p[i];
      p[i] -= lr * (m / c1) / (sqrtf(v / c2) + eps);
      moved += p[i] != before;
    }
    assert_true(moved > 0);
    if (memcmp(p, q, sizeof(float) * n) != 0) TU_FAIL("trainer: bias %d after one step differs from Adam's step on the gradient", b);
  }
  for (int s = 0; s < 40; s++) assert_int_equal(moe8_trainer_step(tr, x, y, T, &last, ws, wsz), MOE8_OK);
  if (!(last < 0.7f * first)) TU_FAIL("trainer on GPT-OSS's form: loss %g -> %g", (double)first, (double)last);
  moe8_trainer_destroy(tr);
  for (int i = 0; i < 3; i++) moe8_layer_destroy(L[i]);
  free(ws);
}

/* Llama-4's form (the sigmoid routing weight scales the expert input, the
** shared expert added): every gradient of the backward against central
** finite differences of the layer's own forward, top-1 and top-2. */
static void test_llama4_form_grads(void **state) {
  (void)state;
  enum { E = 4, D = 32, F = 16, T = 6 };
  for (int K = 1; K <= 2; K++) {
    moe8_layer_config c = {.num_experts = E, .top_k = K, .hidden = D, .ffn = F, .score = MOE8_SCORE_SIGMOID, .weight_input = true,
                           .shared_ffn = 16};
    moe8_layer *L;
    assert_int_equal(moe8_layer_create(&c, NULL, "experts", &L), MOE8_OK);
    assert_int_equal(moe8_layer_init_random(L, 9 + (uint64_t)K), MOE8_OK);
    static float x[T * D], dout[T * D];
    static float dx[T * D], dwr[D * E], dwg[E * D * F], dwu[E * D * F], dwd[E * F * D], sg[D * 16], su[D * 16], sd[16 * D];
    const moe8_layer_grads g = {.dx = dx, .dwr = dwr, .dwg = dwg, .dwu = dwu, .dwd = dwd, .dwsg = sg, .dwsu = su, .dwsd = sd};
    void *ws;
    size_t wsz;
    form_backward(L, x, dout, T, D, 70 + (uint64_t)K, &g, &ws, &wsz);
    const form_grad t[] = {
      {"x", x, T * D, dx}, {"router", moe8_layer_weight(L, MOE8_W_ROUTER, NULL), D * E, dwr},
      {"gate", moe8_layer_weight(L, MOE8_W_GATE, NULL), E * D * F, dwg}, {"up", moe8_layer_weight(L, MOE8_W_UP, NULL), E * D * F, dwu},
      {"down", moe8_layer_weight(L, MOE8_W_DOWN, NULL), E * F * D, dwd}, {"shared down", moe8_layer_weight(L, MOE8_W_SHARED_DOWN, NULL), 16 * D, sd}};
    form_fd_check(K == 1 ? "llama4 form (top-1)" : "llama4 form (top-2)", L, x, dout, T, D, ws, wsz, t, sizeof t / sizeof t[0]);
    free(ws);
    moe8_layer_destroy(L);
  }
}

/* out = x (the output written over the input) with a shared expert: the
** forward, the fused forward and the experts op give the bytes of a call
** with separate buffers (the shared expert reads x before the combine
** writes out), for f32, FP8 (quantized before or after the sort) and int8,
** and Llama-4's input-weighted form. */
static void test_out_aliases_x(void **state) {
  (void)state;
  const char *rules_txt[] = {
    NULL,
    "{\"rules\": [{\"module_path\": \".*\", \"weight_qtype\": \"float8_e4m3fn\", \"act_qtype\": \"float8_e4m3fn\", \"tile_size\": 16}]}",
    "{\"quantize_before_ep_all_gather\": true, \"rules\": [{\"module_path\": \".*\", \"weight_qtype\": \"float8_e4m3fn\", "
    "\"act_qtype\": \"float8_e4m3fn\"}]}",
    "{\"rules\": [{\"module_path\": \".*\", \"weight_qtype\": \"int8\", \"act_qtype\": \"int8\"}]}",
  };
  for (int form = 0; form < 2; form++)
    for (size_t i = 0; i < sizeof rules_txt / sizeof rules_txt[0]; i++) {
      moe8_layer_config c = {.num_experts = 8, .top_k = 2, .hidden = 48, .ffn = 32, .norm_topk_prob = true, .shared_ffn = 16,
                             .shared_gate = true};
      if (form) c = (moe8_layer_config){.num_experts = 4, .top_k = 1, .hidden = 48, .ffn = 32, .score = MOE8_SCORE_SIGMOID,
                                         .weight_input = true, .shared_ffn = 16};
      moe8_rules *rs = NULL;
      if (rules_txt[i]) assert_int_equal(moe8_rules_parse(rules_txt[i], strlen(rules_txt[i]), "inline", &rs), MOE8_OK);
      run u;
      run_init(&u, &c, rs, 13, 90 + i);
      const int64_t T = u.T, K = u.K, D = u.D;
      const size_t TD = (size_t)(T * D);
      float *y = malloc(TD * 4), *w = malloc(sizeof(float) * (size_t)(T * K));
      int32_t *ids = malloc(sizeof(int32_t) * (size_t)(T * K));
      for (int64_t t = 0; t < T; t++)
        for (int64_t k = 0; k < K; k++) { ids[t * K + k] = (int32_t)((t + 3 * k) % c.num_experts); w[t * K + k] = 0.25f + 0.125f * (float)k; }
      for (int path = 0; path < 3; path++) {
        if (path == 1) assert_int_equal(moe8_layer_prepare(u.L), MOE8_OK);
        memcpy(y, u.x, TD * 4);
        moe8_status s1 = path == 0 ? moe8_layer_forward(u.L, u.x, T, u.out, NULL, u.ws, u.ws_size)
                         : path == 1 ? moe8_layer_forward_fused(u.L, u.x, T, u.out, u.ws, u.ws_size)
                                     : moe8_layer_experts(u.L, u.x, T, ids, w, u.out, u.ws, u.ws_size);
        moe8_status s2 = path == 0 ? moe8_layer_forward(u.L, y, T, y, NULL, u.ws, u.ws_size)
                         : path == 1 ? moe8_layer_forward_fused(u.L, y, T, y, u.ws, u.ws_size)
                                     : moe8_layer_experts(u.L, y, T, ids, w, y, u.ws, u.ws_size);
        if (s1 != MOE8_OK || s2 != MOE8_OK) TU_FAIL("form %d, rules %zu, path %d: %s", form, i, path, moe8_last_error());
        if (memcmp(u.out, y, TD * 4) != 0) TU_FAIL("form %d, rules %zu, path %d: out = x differs from separate buffers", form, i, path);
      }
      free(y); free(w); free(ids);
      run_free(&u);
      moe8_rules_destroy(rs);
    }
}

int main(void) {
  tu_seed();
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_bad_input),
    cmocka_unit_test(test_seed_b_table),
    cmocka_unit_test(test_fused_equals_unfused_no_alloc),
    cmocka_unit_test(test_fused_shared_expert_bytes),
    cmocka_unit_test(test_fused_input_nonfinite),
    cmocka_unit_test(test_inference_from_memory),
    cmocka_unit_test(test_experts_entry),
    cmocka_unit_test(test_out_aliases_x),
    cmocka_unit_test(test_seed_a_quantize_before_sort),
    cmocka_unit_test(test_f32_gradients_vs_finite_differences),
    cmocka_unit_test(test_shared_expert_gradients),
    cmocka_unit_test(test_quantized_gradients_straight_through),
    cmocka_unit_test(test_nonfinite_output),
    cmocka_unit_test(test_training_reduces_loss),
    cmocka_unit_test(test_gpt_oss_form_grads),
    cmocka_unit_test(test_limited_form_grads),
    cmocka_unit_test(test_dsv4_form),
    cmocka_unit_test(test_post_form_grads),
    cmocka_unit_test(test_softcap_form_grads),
    cmocka_unit_test(test_gemma_form),
    cmocka_unit_test(test_ungated_form),
    cmocka_unit_test(test_latent_form),
    cmocka_unit_test(test_clamp_shared_form_grads),
    cmocka_unit_test(test_norm_min),
    cmocka_unit_test(test_scored_shared),
    cmocka_unit_test(test_output_forms),
    cmocka_unit_test(test_sparsemixer),
    cmocka_unit_test(test_zero_experts),
    cmocka_unit_test(test_expert_capacity),
    cmocka_unit_test(test_capacity_ranked),
    cmocka_unit_test(test_zaya_router),
    cmocka_unit_test(test_product_keys),
    cmocka_unit_test(test_product_keys_quant),
    cmocka_unit_test(test_gpt_oss_form_trainer),
    cmocka_unit_test(test_llama4_form_grads),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
