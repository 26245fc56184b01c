/*
** pkeys.c — product-key experts (moe8_layer_config.product_keys; Doge's
** DogeCDMoE, docs/layer.md): the routing over two halves of N keys and the
** single-neuron experts, both per token.
**
** Routing (moe8__pk_route).  The router's logits are [T, 2N] (x · Wr, N =
** floor(sqrt(E))).  transformers reads that buffer as view(2, T, N): the
** first T·N floats are the T tokens' first key halves, the rest their
** second ones, so token t's halves are flat[t·N ..] and flat[(T + t)·N ..]
** (rows t/2 and (T + t)/2 of the logits for T > 1: the routing of a token
** depends on the other tokens of the call; for T = 1 they are its own).
** Each half is sorted descending (ties to the lower index); the candidate
** (a, b) scores sx[a] + sy[b] in f32 and is expert ia[a]·N + ib[b].  The
** sum is non-increasing along a and along b (f32 addition is monotone in
** each operand), so the candidates in order (score descending, then a·N +
** b ascending: transformers' topk of the flattened [N, N] with ties to the
** lower position) are a merge of the N rows a, each already in order: a
** heap of the rows' fronts gives the top_k in O((N + k) log N), never the
** N² candidates.  Weights: the softmax of the k scores in f32 (the first is
** the largest), divided by their sum with norm_topk_prob, times
** routed_scaling_factor.
**
** Experts (moe8__pk_experts).  Slot j of token t (expert e, weight w)
** adds c · v_e, c = w · act(x_t · k_e), to out_t, slots in order from zero
** (transformers: act(down_embed · x) · routing_weights, then a [1, k] ·
** [k, D] product).  The key product runs in 16 partial sums (lane l takes
** the elements d ≡ l mod 16 in increasing d), added as ((p0 + p1) + (p2 +
** p3)) ... pairwise; quantized keys and activations (a rule) take it per
** scale block, the block's sum times (activation scale · key scale) added
** to u in block order.  One token's row is computed by one thread, in an
** order that depends on nothing else: the bytes do not depend on the
** thread count.
*/
#include "../core/internal.h"
#include "layer_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { PK_MAX_KEYS = 1024 }; /* floor(sqrt(MOE8_MAX_PK_EXPERTS)) */

typedef struct pk_key {
  float   v;
  int32_t i;
} pk_key;

/* Descending value, then ascending index. */
static int pk_cmp(const void *pa, const void *pb) {
  const pk_key *a = pa, *b = pb;
  if (a->v != b->v) return a->v > b->v ? -1 : 1;
  return (a->i > b->i) - (a->i < b->i);
}

/* A candidate (a, b) of the merge: its score and position a·N + b. */
typedef struct pk_cand {
  float   s;
  int32_t a, b;
} pk_cand;

/* c ranks before d: the larger score, then the lower position (rows a of
** the same score: the lower a, since b < N). */
static inline bool pk_before(const pk_cand *c, const pk_cand *d) {
  return c->s > d->s || (c->s == d->s && (c->a < d->a || (c->a == d->a && c->b < d->b)));
}

static void pk_sift_down(pk_cand *h, int64_t n, int64_t i) {
  for (;;) {
    int64_t l = 2 * i + 1, r = l + 1, m = i;
    if (l < n && pk_before(&h[l], &h[m])) m = l;
    if (r < n && pk_before(&h[r], &h[m])) m = r;
    if (m == i) return;
    const pk_cand t = h[i];
    h[i] = h[m];
    h[m] = t;
    i = m;
  }
}

moe8_status moe8__pk_route(const moe8_layer *L, const float *logits, int64_t T, int32_t *ids, float *w) {
  const int64_t E = L->cfg.num_experts, N = moe8__pk_keys(E), K = L->cfg.top_k;
  const float rsf = L->cfg.routed_scaling_factor != 0.0f ? L->cfg.routed_scaling_factor : 1.0f;
  if (moe8__count_nonfinite_par(logits, (size_t)(T * 2 * N))) {
    int64_t i = 0;
    while (isfinite(logits[i])) i++;
    return moe8__fail(MOE8_ERR_NONFINITE, "layer %s: the router's logit [%lld, %lld] (x · router_gate) is not finite", L->module_path,
                      (long long)(i / (2 * N)), (long long)(i % (2 * N)));
  }
  #pragma omp parallel for num_threads(moe8__nt(16.0 * (double)T * (double)(N + K))) schedule(static)
  for (int64_t t = 0; t < T; t++) {
    pk_key kx[PK_MAX_KEYS], ky[PK_MAX_KEYS];
    pk_cand h[PK_MAX_KEYS];
    const float *sx = logits + t * N, *sy = logits + (T + t) * N; /* view(2, T, N) of the flat [T, 2N] */
    for (int64_t i = 0; i < N; i++) {
      kx[i] = (pk_key){sx[i], (int32_t)i};
      ky[i] = (pk_key){sy[i], (int32_t)i};
    }
    qsort(kx, (size_t)N, sizeof *kx, pk_cmp);
    qsort(ky, (size_t)N, sizeof *ky, pk_cmp);
    /* the rows' fronts: a candidate past row min(N, K) - 1 has K before it */
    int64_t n = N < K ? N : K;
    for (int64_t a = 0; a < n; a++) h[a] = (pk_cand){kx[a].v + ky[0].v, (int32_t)a, 0};
    for (int64_t i = n / 2 - 1; i >= 0; i--) pk_sift_down(h, n, i);
    int32_t *it = ids + t * K;
    float *wt = w + t * K;
    for (int64_t j = 0; j < K; j++) {
      const pk_cand c = h[0];
      it[j] = (int32_t)(kx[c.a].i * N + ky[c.b].i);
      wt[j] = c.s; /* the score, for now */
      if (c.b + 1 < N) h[0] = (pk_cand){kx[c.a].v + ky[c.b + 1].v, c.a, c.b + 1};
      else h[0] = h[--n];
      pk_sift_down(h, n, 0);
    }
    /* softmax over the k scores (wt[0] the largest), in slot order */
    const float m = wt[0];
    float sum = 0.0f;
    for (int64_t j = 0; j < K; j++) {
      wt[j] = expf(wt[j] - m);
      sum += wt[j];
    }
    for (int64_t j = 0; j < K; j++) wt[j] = wt[j] / sum;
    if (L->cfg.norm_topk_prob) {
      float s2 = 0.0f;
      for (int64_t j = 0; j < K; j++) s2 += wt[j];
      for (int64_t j = 0; j < K; j++) wt[j] = wt[j] / s2;
    }
    if (rsf != 1.0f)
      for (int64_t j = 0; j < K; j++) wt[j] = wt[j] * rsf;
  }
  return MOE8_OK;
}

/* Σ a[d]·b[d] over n values in the 16 lanes' order (the file's comment). */
static float pk_dot(const float *a, const float *b, int64_t n) {
  float p[16] = {0};
  int64_t d = 0;
  for (; d + 16 <= n; d += 16)
    for (int l = 0; l < 16; l++) p[l] += a[d + l] * b[d + l];
  for (int l = 0; d < n; d++, l++) p[l] += a[d] * b[d];
  for (int s = 8; s >= 1; s /= 2)
    for (int l = 0; l < s; l++) p[l] = p[2 * l] + p[2 * l + 1];
  return p[0];
}

/* The same with the second operand's codes decoded by table tb. */
static float pk_dot_codes(const float *a, const uint8_t *q, const float *tb, int64_t n) {
  float p[16] = {0};
  int64_t d = 0;
  for (; d + 16 <= n; d += 16)
    for (int l = 0; l < 16; l++) p[l] += a[d + l] * tb[q[d + l]];
  for (int l = 0; d < n; d++, l++) p[l] += a[d] * tb[q[d]];
  for (int s = 8; s >= 1; s /= 2)
    for (int l = 0; l < s; l++) p[l] = p[2 * l] + p[2 * l + 1];
  return p[0];
}

/* Both operands codes: FP8 products (exact in f32) in the lanes, or i8
** products summed exactly in i32. */
static float pk_dot_qq(const uint8_t *qa, const float *ta, const uint8_t *qb, const float *tb, bool i8, int64_t n) {
  if (i8) {
    int32_t s = 0;
    for (int64_t d = 0; d < n; d++) s += (int32_t)(int8_t)qa[d] * (int32_t)(int8_t)qb[d];
    return (float)s;
  }
  float p[16] = {0};
  int64_t d = 0;
  for (; d + 16 <= n; d += 16)
    for (int l = 0; l < 16; l++) p[l] += ta[qa[d + l]] * tb[qb[d + l]];
  for (int l = 0; d < n; d++, l++) p[l] += ta[qa[d]] * tb[qb[d]];
  for (int s = 8; s >= 1; s /= 2)
    for (int l = 0; l < s; l++) p[l] = p[2 * l] + p[2 * l + 1];
  return p[0];
}

static void pk_table(moe8_dtype t, float *tb) {
  for (int c = 0; c < 256; c++)
    tb[c] = t == MOE8_DTYPE_F8E4M3 ? moe8_f8e4m3_to_f32((uint8_t)c) : t == MOE8_DTYPE_F8E5M2 ? moe8_f8e5m2_to_f32((uint8_t)c)
                                                                                            : (float)(int8_t)(uint8_t)c;
}

moe8_status moe8__pk_experts(const moe8_layer *L, const float *x, const uint8_t *xq, const float *sx, int64_t T, const int32_t *ids,
                             const float *w, float *out) {
  const moe8__xset *X = &L->xs[0];
  const int64_t E = L->cfg.num_experts, K = L->cfg.top_k, D = L->cfg.hidden;
  for (int64_t a = 0; a < T * K; a++)
    if (ids[a] >= E)
      return moe8__fail(MOE8_ERR_INVALID_ARG, "layer %s: topk_ids[%lld, %lld] = %d is not an expert id in [0, %lld) (or < 0: skipped)",
                        L->module_path, (long long)(a / K), (long long)(a % K), (int)ids[a], (long long)E);
  const bool wq = L->wq, aq = xq != NULL;
  const int64_t wt = wq ? L->wspec.tile : 0, at = aq ? L->aspec.tile : 0;
  const int64_t nbw = moe8__nblocks(D, wt), nba = aq ? moe8__nblocks(D, at) : 1;
  /* the key product's blocks: the tiled operand's (both tiled: the rule's
  ** one tile; a file's codes of another tile are refused at load) */
  const int64_t B = at && wt ? (at < wt ? at : wt) : at ? at : wt ? wt : D;
  float tw[256], ta[256];
  if (wq) pk_table(L->wspec.qtype, tw);
  if (aq) pk_table(L->aspec.qtype, ta);
  const bool i8 = aq && wq && L->aspec.qtype == MOE8_DTYPE_I8;
  const moe8_granularity ag = aq ? L->aspec.gran : MOE8_GRAN_TENSOR;
  #pragma omp parallel for num_threads(moe8__nt(4.0 * (double)T * (double)K * (double)D)) schedule(static)
  for (int64_t t = 0; t < T; t++) {
    float *o = out + t * D;
    memset(o, 0, sizeof(float) * (size_t)D);
    for (int64_t j = 0; j < K; j++) {
      const int32_t e = ids[t * K + j];
      if (e < 0) continue;
      float u = 0.0f;
      if (!wq) {
        u = pk_dot(x + t * D, X->wgu_f32 + (size_t)e * (size_t)D, D);
      } else {
        const uint8_t *kq = X->wgu_q + (size_t)e * (size_t)D;
        const float *ks = X->wgu_s + e * nbw;
        for (int64_t d0 = 0; d0 < D; d0 += B) {
          const int64_t n = d0 + B < D ? B : D - d0;
          const float swb = ks[wt ? d0 / wt : 0];
          if (aq) {
            const float sab = ag == MOE8_GRAN_TENSOR ? sx[0] : ag == MOE8_GRAN_ROW ? sx[t] : sx[t * nba + (at ? d0 / at : 0)];
            u += pk_dot_qq(xq + t * D + d0, ta, kq + d0, tw, i8, n) * (sab * swb);
          } else
            u += pk_dot_codes(x + t * D + d0, kq + d0, tw, n) * swb;
        }
      }
      const float c = w[t * K + j] * (u / (1.0f + moe8__expf(-u))); /* w · silu(u) */
      if (!wq) {
        const float *v = X->wd_f32 + (size_t)e * (size_t)D;
        for (int64_t d = 0; d < D; d++) o[d] += c * v[d];
      } else {
        const uint8_t *vq = X->wd_q + (size_t)e * (size_t)D;
        const float *vs = X->wd_s + e * nbw;
        for (int64_t d0 = 0, b = 0; d0 < D; d0 += wt ? wt : D, b++) {
          const int64_t d1 = wt && d0 + wt < D ? d0 + wt : D;
          const float s = vs[b];
          for (int64_t d = d0; d < d1; d++) o[d] += c * (tw[vq[d]] * s); /* the dequantized value, as moe8_dequantize gives it */
        }
      }
    }
  }
  return MOE8_OK;
}
