/*
** phases.c — the phases of the MoE layer that every way of running it calls
** on its rows: the single-process layer (layer.c), the ring of experts
** (ep/ep.c) and the all-to-all dispatch (ep/ep_a2a.c).  Each runs these
** functions on the same rows in the same order, which is what makes every
** mode give the single-process bytes (docs/determinism.md):
**   moe8__experts_forward / _backward   one expert set's rows: gmm, SwiGLU
**                                       (and h's quantization), gmm; the
**                                       straight-through backward;
**   moe8__shared_forward / _add / _backward   the shared expert and its gate;
**   moe8__dy_dw, moe8__router_backward, moe8__router_wgrad, moe8__aux_loss;
**   moe8__check_output                  no silent NaN/inf.
*/
#include "../core/internal.h"
#include "../kernels/gmm.h"
#include "layer_internal.h"

#include <float.h>
#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Inf and NaN are the floats whose exponent bits are all ones: tested on
** the bits, the loop vectorizes (isfinite on the floats did not, and the
** layer scans its input and its output on every forward). */
size_t moe8__count_nonfinite(const float *x, size_t n) {
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t u;
    memcpy(&u, x + i, sizeof u);
    bad += (u & 0x7F800000u) == 0x7F800000u;
  }
  return bad;
}

/* The same count over a large tensor, on the layer's threads. */
size_t moe8__count_nonfinite_par(const float *x, size_t n) {
  const size_t chunk = 1u << 16, nc = (n + chunk - 1) / chunk;
  size_t bad = 0;
  #pragma omp parallel for num_threads(moe8__nt((double)n)) schedule(static) reduction(+ : bad)
  for (size_t c = 0; c < nc; c++) bad += moe8__count_nonfinite(x + c * chunk, c + 1 < nc ? chunk : n - c * chunk);
  return bad;
}

static moe8_operand weight_operand(const moe8_layer *L, int s, bool down, int64_t g0) {
  const moe8__xset *X = &L->xs[s];
  const int64_t D = X->D, F = X->F, N1 = X->N1;
  const int64_t per = down ? F * D : D * N1; /* elements of one expert */
  if (!L->wq)
    return (moe8_operand){MOE8_DTYPE_F32, (down ? X->wd_f32 : X->wgu_f32) + g0 * per, NULL, MOE8_GRAN_TENSOR, 0};
  const int64_t nb = moe8__nblocks(down ? F : D, L->wspec.tile), N = down ? D : N1;
  const uint8_t *q = down ? X->wd_q : X->wgu_q;
  return (moe8_operand){L->wspec.qtype, q ? q + g0 * per : NULL, (down ? X->wd_s : X->wgu_s) + g0 * nb * N,
                        L->wspec.tile ? MOE8_GRAN_CHANNEL_TILE : MOE8_GRAN_CHANNEL, L->wspec.tile};
}

/* The activation operand of a gmm: quantized rows (q, s) when the pair has
** a kernel, else the f32 rows, dequantized in place when quantized. */
static moe8_status act_operand(const moe8_layer *L, float *f, const uint8_t *q, const float *s, int64_t rows,
                               int64_t cols, moe8_operand *op) {
  const moe8_dtype wt = L->wq ? L->wspec.qtype : MOE8_DTYPE_F32;
  if (L->aq && moe8__kernel_pair(L->aspec.qtype, wt)) {
    *op = (moe8_operand){L->aspec.qtype, q, s, L->aspec.tile ? MOE8_GRAN_ROW_TILE : MOE8_GRAN_ROW, L->aspec.tile};
    return MOE8_OK;
  }
  if (L->aq) {
    moe8_status st = moe8_dequantize(&L->aspec, q, s, 1, rows, cols, f);
    if (st != MOE8_OK) return st;
  }
  *op = (moe8_operand){MOE8_DTYPE_F32, f, NULL, MOE8_GRAN_TENSOR, 0};
  return MOE8_OK;
}

moe8_router_config moe8__router_config(const moe8_layer *L, const int32_t *token_ids) {
  const moe8_layer_config *c = &L->cfg;
  return (moe8_router_config){moe8__router_width(L), c->top_k, c->score, c->norm_topk_prob, c->routed_scaling_factor,
                              c->use_selection_bias ? L->w[MOE8_W_BIAS] : NULL, c->n_group, c->topk_group, c->group_score,
                              c->norm_min, c->norm_eps, c->select_logits, c->norm_p,
                              c->hash_routing ? L->tid2eid : NULL, c->hash_routing ? L->hash_vocab : 0,
                              c->hash_routing ? token_ids : NULL, c->group_mask_zero, c->scored_shared, c->router_jitter};
}

moe8_status moe8__check_tokens(const moe8_layer *L, const int32_t *token_ids, int64_t T, const char *what) {
  if (!L->cfg.hash_routing || T == 0) return MOE8_OK;
  if (!L->tid2eid)
    return moe8__fail(MOE8_ERR_INVALID_ARG, "%s: layer %s routes by token id (hash routing) but has no table (moe8_layer_set_hash_table)",
                      what, L->module_path);
  if (!token_ids)
    return moe8__fail(MOE8_ERR_INVALID_ARG, "%s: layer %s routes by token id (hash routing): its forward needs the tokens' ids "
                      "(moe8_layer_forward_tokens, moe8_layer_forward_fused_tokens, moe8_ep_forward_tokens)", what, L->module_path);
  for (int64_t t = 0; t < T; t++)
    if (token_ids[t] < 0 || token_ids[t] >= L->hash_vocab)
      return moe8__fail(MOE8_ERR_INVALID_ARG, "%s: layer %s: token %lld has id %d, outside its hash table's [0, %lld) (tid2eid rows)", what,
                        L->module_path, (long long)t, (int)token_ids[t], (long long)L->hash_vocab);
  return MOE8_OK;
}

moe8_status moe8__router_logits(const moe8_layer *L, const float *x, int64_t T, float *logits) {
  const int64_t D = L->cfg.hidden, E = moe8__router_width(L);
  moe8_status st = moe8_router_logits(x, L->w[MOE8_W_ROUTER], T, D, E, logits);
  const float *b = L->cfg.router_bias ? L->w[MOE8_W_ROUTER_BIAS] : NULL;
  if (st == MOE8_OK && b)
    for (int64_t t = 0; t < T; t++)
      for (int64_t e = 0; e < E; e++) logits[t * E + e] += b[e];
  return st;
}

/* Each step is a chain in f32 of a fixed order per element (the matmuls
** are moe8_router_logits': d in order), so a token's routing depends on
** its own row alone.  The biases are added after the sums, as torch's
** Linear does; GELU is torch's exact one, z/2 · (1 + erf(z/√2)). */
moe8_status moe8__router_mlp(const moe8_layer *L, const float *x, int64_t T, const float *p, float *s, float *u, float *v,
                             float *logits) {
  const int64_t D = L->cfg.hidden, R = L->cfg.router_mlp, E = moe8__router_width(L);
  const float *a = L->w[MOE8_W_ROUTER_DOWN_BIAS], *c = L->w[MOE8_W_ROUTER_STATE_SCALE];
  const float *b1 = L->w[MOE8_W_ROUTER_FC1_BIAS], *b2 = L->w[MOE8_W_ROUTER_FC2_BIAS];
  moe8_status st = moe8_router_logits(x, L->w[MOE8_W_ROUTER_DOWN], T, D, R, s);
  if (st != MOE8_OK) return st;
  #pragma omp parallel for num_threads(moe8__nt(4.0 * (double)T * (double)R)) schedule(static)
  for (int64_t t = 0; t < T; t++)
    for (int64_t r = 0; r < R; r++) {
      float z = s[t * R + r] + a[r];
      if (p) z = z + p[t * R + r] * c[r];
      s[t * R + r] = z;
    }
  moe8__rms_norm_rows(s, T, R, L->cfg.rms_eps, L->w[MOE8_W_ROUTER_MLP_NORM], 1.0f, u);
  for (int i = 0; i < 2 && st == MOE8_OK; i++) {
    const float *in = i ? v : u, *b = i ? b2 : b1;
    float *o = i ? u : v;
    st = moe8_router_logits(in, L->w[i ? MOE8_W_ROUTER_FC2 : MOE8_W_ROUTER_FC1], T, R, R, o);
    #pragma omp parallel for num_threads(moe8__nt(20.0 * (double)T * (double)R)) schedule(static)
    for (int64_t t = 0; t < T; t++)
      for (int64_t r = 0; r < R; r++) {
        const float z = o[t * R + r] + b[r];
        o[t * R + r] = 0.5f * z * (1.0f + erff(z * 0.70710678118654752f));
      }
  }
  if (st == MOE8_OK) st = moe8_router_logits(u, L->w[MOE8_W_ROUTER], T, R, E, logits);
  const float *rb = L->cfg.router_bias ? L->w[MOE8_W_ROUTER_BIAS] : NULL;
  if (st == MOE8_OK && rb)
    for (int64_t t = 0; t < T; t++)
      for (int64_t e = 0; e < E; e++) logits[t * E + e] += rb[e];
  return st;
}

void moe8__skip_slots(const moe8_layer *L, int64_t T, int32_t *ids, float *w) {
  const int64_t K = L->cfg.top_k, first = L->cfg.num_experts + L->cfg.zero_experts;
  for (int64_t a = 0; a < T * K; a++)
    if (ids[a] >= first) { ids[a] = -1; w[a] = 0.0f; }
}

/* NLLB-MoE's rule (capacity_ranked, its Top2Router in eval): the
** capacity over all T rows, ceil(capacity_fraction · T) in double as
** Python's math.ceil takes it (else expert_capacity); rank j's slots of
** every token queue after all of rank j - 1's (transformers' locations2 +=
** the first choices' counts, dropped ones included), then each token's
** kept weights over max(Σ, FLT_EPSILON) (torch.clamp(min=finfo.eps)),
** times routed_scaling_factor (1 - moe_token_dropout). */
static void capacity_ranked(const moe8_layer *L, int64_t T, int32_t *ids, float *w) {
  const int64_t K = L->cfg.top_k, E = L->cfg.num_experts;
  const double frac = L->cfg.capacity_fraction;
  const int64_t cap = frac > 0.0 ? (int64_t)ceil(frac * (double)T) : L->cfg.expert_capacity;
  const float scale = L->cfg.routed_scaling_factor != 0.0f ? L->cfg.routed_scaling_factor : 1.0f;
  int64_t n[MOE8_MAX_EXPERTS] = {0};
  for (int64_t j = 0; j < K; j++)
    for (int64_t t = 0; t < T; t++) {
      const int32_t e = ids[t * K + j];
      if (e < 0 || e >= E) continue;
      if (++n[e] > cap) { ids[t * K + j] = -1; w[t * K + j] = 0.0f; }
    }
  for (int64_t t = 0; t < T; t++) {
    float s = 0.0f;
    for (int64_t j = 0; j < K; j++) s += w[t * K + j];
    if (s < FLT_EPSILON) s = FLT_EPSILON;
    for (int64_t j = 0; j < K; j++) w[t * K + j] = w[t * K + j] / s * scale;
  }
}

void moe8__apply_capacity(const moe8_layer *L, int64_t T, int64_t seq, int32_t *ids, float *w) {
  if (L->cfg.capacity_ranked) { capacity_ranked(L, T, ids, w); return; }
  const int64_t K = L->cfg.top_k, E = L->cfg.num_experts, cap = L->cfg.expert_capacity, S = seq > 0 ? seq : T;
  int64_t n[MOE8_MAX_EXPERTS];
  for (int64_t t = 0; t < T; t++) {
    if (t % S == 0)
      for (int64_t e = 0; e < E; e++) n[e] = 0;
    for (int64_t j = 0; j < K; j++) {
      const int32_t e = ids[t * K + j];
      if (e < 0 || e >= E) continue;
      if (++n[e] > cap) { ids[t * K + j] = -1; w[t * K + j] = 0.0f; }
    }
  }
}

moe8_status moe8__check_backward_form(const moe8_layer *L, const char *what) {
  const moe8_layer_config *c = &L->cfg;
  /* Zaya's router: the MLP's gradients (and the state's, which crosses
  ** layers) are not written. */
  if (c->router_mlp > 0 || c->skip_experts > 0)
    return moe8__fail(MOE8_ERR_UNSUPPORTED, "%s: layer %s has %s (Zaya's): its backward is not implemented (inference only)", what,
                      L->module_path, c->router_mlp > 0 ? "an MLP router (router_mlp) carrying a router state" : "skip experts (skip_experts)");
  /* SwitchTransformers' capacity: the dropped slots' backward is not
  ** written (nothing checks it yet). */
  if (moe8__capacity_on(c))
    return moe8__fail(MOE8_ERR_UNSUPPORTED, "%s: layer %s drops tokens past %s: its backward is not implemented (inference only)", what,
                      L->module_path, c->capacity_ranked ? "its capacity (capacity_ranked, NLLB-MoE's)" : "expert_capacity (SwitchTransformers')");
  /* Ungated experts with biases (NLLB-MoE's fc1 / fc2): the biases'
  ** gradients are written for the gated form only. */
  if (c->expert_bias && !moe8__act_gated(c->act))
    return moe8__fail(MOE8_ERR_UNSUPPORTED, "%s: layer %s has ungated experts with biases (expert_bias): their backward is not "
                      "implemented (inference only)", what, L->module_path);
  /* Doge's product keys: the routing's gradient (through the sorted key
  ** halves, mixed across tokens as transformers' view mixes them) is not
  ** written. */
  if (c->product_keys)
    return moe8__fail(MOE8_ERR_UNSUPPORTED, "%s: layer %s has product-key experts (Doge's): their backward is not implemented (inference "
                      "only)", what, L->module_path);
  /* The layer's backward (single process and expert parallel) and the
  ** trainer have every form but one: a Llama-4 layer's backward needs its
  ** weights unnormalized (the routing weight is its expert's sigmoid
  ** score). */
  if (c->weight_input && c->norm_topk_prob)
    return moe8__fail(MOE8_ERR_UNSUPPORTED, "%s: layer %s scales the expert input by renormalized weights: that backward is not "
                      "implemented (Llama-4's are its sigmoid scores, norm_topk_prob false)", what, L->module_path);
  /* PhiMoE's router: transformers trains it by sampling the choice
  ** (Gumbel) with its own gradient estimator, which is not the
  ** deterministic rule moe8 computes; the rule's own gradient would train
  ** something else. */
  if (c->score == MOE8_SCORE_SPARSEMIXER)
    return moe8__fail(MOE8_ERR_UNSUPPORTED, "%s: layer %s routes by sparsemixer (PhiMoE): moe8 computes its inference rule, while "
                      "training samples the choice (Gumbel) with its own gradient estimator; no backward", what, L->module_path);
  return MOE8_OK;
}

/* The expert biases of rows [0, rows) grouped by gsz (groups g0..g0+G-1):
** v[p, :n] += b[g, :n]. */
static void add_group_bias(float *v, int64_t n, const int32_t *gsz, int64_t g0, int64_t G, const float *b) {
  int64_t p = 0;
  for (int64_t g = 0; g < G; g++) {
    const float *bg = b + (g0 + g) * n;
    for (int64_t r = 0; r < gsz[g]; r++, p++)
      for (int64_t c = 0; c < n; c++) v[p * n + c] += bg[c];
  }
}

/* out[rows, ldo] = x[rows, K] · W per group, W MXFP4 (blk, sc for all
** groups from g0).  x is f32, or (xq non-NULL: an int8 rule, the weights
** in moe8__mx4_to_cols's layout) int8 codes with their scales (sq),
** packed first (moe8__mx4_xpack) in the scratch when it is large enough.
** Tasks of 64 output columns; each thread takes one contiguous run of
** them, of about equal cost (a task of a group with r rows costs r + 1:
** its codes, then its rows).  Contiguous runs let the kernel's prefetch of
** the next columns serve the same thread, which is what decode, reading
** each weight once from memory, is bound by. */
static moe8_status mx4_grouped(const moe8_layer *L, const float *x, const uint8_t *xq, const float *sq, int64_t rows, const int32_t *gsz,
                               int64_t g0, int64_t G, int64_t K, int64_t N, const uint8_t *blk, const uint8_t *sc, float *out, int64_t ldo,
                               int64_t split, void *scratch, size_t scratch_bytes) {
  const moe8__ktable *kt = moe8__kernels();
  enum { NT = 64 };
  const int64_t nct = moe8__cdiv(N, NT), pb = moe8__mx4_xpack_bytes(K);
  uint8_t *xp = NULL;
  void *owned = NULL;
  if (xq) {
    const size_t need = (size_t)rows * (size_t)pb;
    if (scratch && scratch_bytes >= need) xp = scratch;
    else if (posix_memalign(&owned, 64, need ? need : 64) != 0) return moe8__fail(MOE8_ERR_NOMEM, "layer %s: out of memory", L->module_path);
    else xp = owned;
    const int64_t nbs = moe8__nblocks(K, L->aspec.tile), sbl = L->aspec.tile ? L->aspec.tile / 32 : K / 32;
    #pragma omp parallel for num_threads(moe8__nt(8.0 * (double)rows * (double)K)) schedule(static)
    for (int64_t p = 0; p < rows; p++) moe8__mx4_xpack(xp + p * pb, (const int8_t *)xq + p * K, sq + p * nbs, sbl, K);
  }
  int64_t row0[MOE8_MAX_EXPERTS + 1], cost0[MOE8_MAX_EXPERTS + 1];
  row0[0] = cost0[0] = 0;
  for (int64_t g = 0; g < G; g++) {
    row0[g + 1] = row0[g] + gsz[g];
    cost0[g + 1] = cost0[g] + (gsz[g] ? (gsz[g] + 1) * nct : 0);
  }
  const int64_t ntask = G * nct, total = cost0[G];
  #pragma omp parallel num_threads(moe8__nt(2.0 * (double)rows * (double)N * (double)K))
  {
#ifdef _OPENMP
    const int64_t nth = omp_get_num_threads(), id = omp_get_thread_num();
#else
    const int64_t nth = 1, id = 0;
#endif
    const int64_t lo = total * id / nth, hi = total * (id + 1) / nth;
    for (int64_t t = 0; t < ntask; t++) {
      const int64_t g = t / nct, c = t % nct;
      if (!gsz[g]) { t = (g + 1) * nct - 1; continue; }
      const int64_t at = cost0[g] + c * (gsz[g] + 1); /* this task's cost starts here */
      if (at < lo) continue;
      if (at >= hi) break;
      const int64_t n0 = c * NT, n1 = n0 + NT < N ? n0 + NT : N, e = g0 + g;
      const uint8_t *be = blk + (size_t)(e * moe8__mx4_bytes(N, K, xp != NULL)), *se = sc + (size_t)(e * N * (K / 32));
      if (xp) kt->mx4_rows_i8(xp + row0[g] * pb, gsz[g], pb, K, be, se, n0, n1, out + row0[g] * ldo, ldo, split);
      else kt->mx4_rows(x + row0[g] * K, gsz[g], K, K, be, se, n0, n1, out + row0[g] * ldo, ldo, split);
    }
  }
  free(owned);
  return MOE8_OK;
}

moe8_status moe8__experts_forward(const moe8_layer *L, moe8_order order, int set, int64_t rows, const int32_t *gsz, int64_t g0,
                                  int64_t G, float *xs, const uint8_t *xsq, const float *sxs, float *gu, float *h, uint8_t *hq,
                                  float *sh, float *y, void *scratch, size_t scratch_bytes) {
  const moe8__xset *X = &L->xs[set];
  const int64_t D = X->D, F = X->F, N1 = X->N1;
  /* Packed weights only while prepared (training re-quantizes per call). */
  const bool pk = L->prepared && X->wgu_pk;
  moe8_gmm_args g = {.M = rows, .K = D, .N = N1, .num_groups = G, .group_sizes = gsz, .num_local = G,
                     .rhs = X->mx_gu_b ? (moe8_operand){0} : weight_operand(L, set, false, g0), .out_dtype = MOE8_DTYPE_F32,
                     .out = gu, .order = order,
                     .rhs_packed = pk ? X->wgu_pk + (size_t)g0 * moe8_gmm_packed_size(L->wspec.qtype, 1, D, N1) : NULL};
  /* MXFP4 weights (f32 activations, or int8 ones under a rule) run their
  ** own kernels; everything between the two matmuls is shared. */
  moe8_status st = MOE8_OK;
  if (X->mx_gu_b)
    st = mx4_grouped(L, xs, X->mx_cols ? xsq : NULL, sxs, rows, gsz, g0, G, D, N1, X->mx_gu_b, X->mx_gu_s, gu, N1, X->mx_split, scratch,
                     scratch_bytes);
  else if ((st = act_operand(L, xs, xsq, sxs, rows, D, &g.lhs)) == MOE8_OK) st = moe8__gmm(&g, scratch, scratch_bytes);
  if (st != MOE8_OK) return st;
  const bool xb = set == 0 && L->cfg.expert_bias;
  const moe8_expert_act act = moe8__set_act(L, set);
  if (xb) add_group_bias(gu, N1, gsz, g0, G, L->w[MOE8_W_GU_BIAS]);
  /* h = silu(g)·u (or act(u), ungated), and (per-row scales) its
  ** quantization, a few rows at a time while they are in cache; a per-row
  ** quantizer gives the same bytes on any chunk of rows. */
  const moe8__ktable *kt = moe8__kernels();
  const float plim = moe8__set_post_limit(L, set);
  const bool fuse = L->aq && (L->aspec.gran == MOE8_GRAN_ROW || L->aspec.gran == MOE8_GRAN_ROW_TILE);
  const int64_t nbh = L->aq && L->aspec.gran == MOE8_GRAN_ROW_TILE ? moe8__nblocks(F, L->aspec.tile) : 1;
  bool qbad = false;
  #pragma omp parallel for num_threads(moe8__nt(8.0 * (double)rows * (double)F)) schedule(static) reduction(|| : qbad)
  for (int64_t p0 = 0; p0 < rows; p0 += 8) {
    const int64_t p1 = p0 + 8 < rows ? p0 + 8 : rows;
    for (int64_t p = p0; p < p1; p++)
      if (act == MOE8_ACT_RELU2) kt->relu2(h + p * F, gu + p * N1, (size_t)F);
      else if (act == MOE8_ACT_RELU) kt->relu(h + p * F, gu + p * N1, (size_t)F);
      else if (act == MOE8_ACT_SWIGLU_CLAMP) kt->swiglu_clamp(h + p * F, gu + p * 2 * F, gu + p * 2 * F + F, (size_t)F, L->cfg.act_alpha, L->cfg.act_limit);
      else if (act == MOE8_ACT_SWIGLU_LIMIT) kt->swiglu_limit(h + p * F, gu + p * 2 * F, gu + p * 2 * F + F, (size_t)F, L->cfg.act_limit);
      else if (act == MOE8_ACT_SWIGLU_POST) kt->swiglu_post(h + p * F, gu + p * 2 * F, gu + p * 2 * F + F, (size_t)F, plim);
      else if (act == MOE8_ACT_SWIGLU_SOFTCAP)
        kt->swiglu_softcap(h + p * F, gu + p * 2 * F, gu + p * 2 * F + F, (size_t)F, L->cfg.act_alpha, L->cfg.act_limit);
      else if (act == MOE8_ACT_GEGLU) kt->geglu(h + p * F, gu + p * 2 * F, gu + p * 2 * F + F, (size_t)F);
      else kt->swiglu(h + p * F, gu + p * 2 * F, gu + p * 2 * F + F, (size_t)F);
    if (fuse && moe8_quantize(&L->aspec, h + p0 * F, 1, p1 - p0, F, hq + p0 * F, sh + p0 * nbh, NULL) != MOE8_OK) qbad = true;
  }
  /* Unfused specs, or an error (then the whole-tensor call names the place). */
  if (L->aq && (!fuse || qbad) && (st = moe8_quantize(&L->aspec, h, 1, rows, F, hq, sh, NULL)) != MOE8_OK) {
    if (st == MOE8_ERR_NONFINITE)
      return moe8__fail(st, "layer %s: the %s expert hidden activations h = %s [%lld, %lld] are not finite "
                        "(the gate/up weights or their scales are too large or hold NaN/inf codes, or the input is too large)",
                        L->module_path, set ? "shared" : "routed", moe8__act_gated(act) ? "silu(x Wg) * (x Wu)" : "act(x Wu)",
                        (long long)rows, (long long)F);
    return st;
  }
  moe8_gmm_args g2 = {.M = rows, .K = F, .N = D, .num_groups = G, .group_sizes = gsz, .num_local = G,
                      .rhs = X->mx_gu_b ? (moe8_operand){0} : weight_operand(L, set, true, g0), .out_dtype = MOE8_DTYPE_F32,
                      .out = y, .order = order,
                      .rhs_packed = pk ? X->wd_pk + (size_t)g0 * moe8_gmm_packed_size(L->wspec.qtype, 1, F, D) : NULL};
  if (X->mx_gu_b) st = mx4_grouped(L, h, X->mx_cols ? hq : NULL, sh, rows, gsz, g0, G, F, D, X->mx_dn_b, X->mx_dn_s, y, D, 0, scratch, scratch_bytes);
  else if ((st = act_operand(L, h, hq, sh, rows, F, &g2.lhs)) == MOE8_OK) st = moe8__gmm(&g2, scratch, scratch_bytes);
  if (st == MOE8_OK && xb) add_group_bias(y, D, gsz, g0, G, L->w[MOE8_W_DOWN_BIAS]);
  return st;
}

/* The scale first, then the RMS over the scaled row (MuSE-Spark's
** post_expert_norm, "input scaled"); the sum of squares in double, as
** moe8__rms_norm_rows takes it. */
void moe8__expert_out_norm_rows(float *y, int64_t rows, int64_t D, float eps, const float *s) {
  #pragma omp parallel for num_threads(moe8__nt(4.0 * (double)rows * (double)D)) schedule(static)
  for (int64_t p = 0; p < rows; p++) {
    float *yp = y + p * D;
    double ss = 0.0;
    for (int64_t d = 0; d < D; d++) {
      yp[d] = yp[d] * s[d];
      ss += (double)yp[d] * (double)yp[d];
    }
    const float r = (float)(1.0 / sqrt(ss / (double)D + (double)eps));
    for (int64_t d = 0; d < D; d++) yp[d] = yp[d] * r;
  }
}

/* Its backward on rows p: with u = o ⊙ s, r = (mean(u²) + eps)^(-1/2) and
** y = u·r (the normalized rows), dy [rows, D] (the gradient at y) becomes
** the gradient at o, du ⊙ s with du = r·(dy - y·(dy · y)/D); ds[d] +=
** du[d]·o[d] over the rows in order (ds may be NULL). */
moe8_status moe8__expert_out_norm_backward(const float *o, const float *y, int64_t rows, int64_t D, float eps, const float *s, float *dy,
                                           float *ds) {
  double *r = malloc(sizeof(double) * (size_t)(rows + 1));
  float *du = malloc(sizeof(float) * (size_t)(rows * D + 1));
  if (!r || !du) { free(r); free(du); return moe8__fail(MOE8_ERR_NOMEM, "layer backward: out of memory"); }
  #pragma omp parallel for num_threads(moe8__nt(6.0 * (double)rows * (double)D)) schedule(static)
  for (int64_t p = 0; p < rows; p++) {
    double ss = 0.0, dot = 0.0;
    for (int64_t d = 0; d < D; d++) {
      const float u = o[p * D + d] * s[d];
      ss += (double)u * (double)u;
      dot += (double)dy[p * D + d] * (double)y[p * D + d];
    }
    const double rp = 1.0 / sqrt(ss / (double)D + (double)eps);
    r[p] = rp;
    for (int64_t d = 0; d < D; d++) {
      const float g = (float)(rp * ((double)dy[p * D + d] - (double)y[p * D + d] * dot / (double)D));
      du[p * D + d] = g;
      dy[p * D + d] = g * s[d];
    }
  }
  if (ds) {
    #pragma omp parallel for num_threads(moe8__nt(2.0 * (double)rows * (double)D)) schedule(static)
    for (int64_t d = 0; d < D; d++)
      for (int64_t p = 0; p < rows; p++) ds[d] += du[p * D + d] * o[p * D + d];
  }
  free(r); free(du);
  return MOE8_OK;
}

moe8_status moe8__latent_in(const moe8_layer *L, const float *x, int64_t T, float *z) {
  const int64_t D = L->cfg.hidden, H = L->cfg.latent;
  moe8_status st = moe8_router_logits(x, L->w[MOE8_W_LATENT_IN], T, D, H, z);
  if (st == MOE8_OK && L->cfg.latent_norm) moe8__rms_norm_rows(z, T, H, L->cfg.rms_eps, L->w[MOE8_W_LATENT_NORM], 1.0f, z);
  return st;
}

moe8_status moe8__latent_out(const moe8_layer *L, const float *c, int64_t T, float *out) {
  return moe8_router_logits(c, L->w[MOE8_W_LATENT_OUT], T, L->cfg.latent, L->cfg.hidden, out);
}

void moe8__latent_out_backward(const moe8_layer *L, const float *dout, const float *c, int64_t T, float *dc, float *dq) {
  const int64_t D = L->cfg.hidden, H = L->cfg.latent;
  const float *Q = L->w[MOE8_W_LATENT_OUT];
  #pragma omp parallel for num_threads(moe8__nt(2.0 * (double)T * (double)D * (double)H)) schedule(static)
  for (int64_t t = 0; t < T; t++)
    for (int64_t h = 0; h < H; h++) {
      float s = 0.0f;
      for (int64_t d = 0; d < D; d++) s += dout[t * D + d] * Q[h * D + d];
      dc[t * H + h] = s;
    }
  if (dq) moe8__router_wgrad(dq, c, dout, T, H, D);
}

moe8_status moe8__latent_in_backward(const moe8_layer *L, const float *x, int64_t T, const float *dz, float *dx, const moe8_layer_grads *gr) {
  const int64_t D = L->cfg.hidden, H = L->cfg.latent;
  const float *P = L->w[MOE8_W_LATENT_IN];
  float *z0 = NULL, *dz0 = NULL;
  if (L->cfg.latent_norm) { /* z = n(z0) ⊙ v: z0 = x · P again (the forward's bytes), then the norm's backward */
    z0 = malloc(sizeof(float) * (size_t)(T * H) + 4);
    dz0 = calloc((size_t)(T * H) + 1, sizeof(float));
    moe8_status st = z0 && dz0 ? moe8_router_logits(x, P, T, D, H, z0) : moe8__fail(MOE8_ERR_NOMEM, "layer backward: out of memory");
    if (st == MOE8_OK) st = moe8__rms_norm_backward(z0, T, H, L->cfg.rms_eps, L->w[MOE8_W_LATENT_NORM], 1.0f, dz, dz0, gr->dwln);
    if (st != MOE8_OK) { free(z0); free(dz0); return st; }
    dz = dz0;
  }
  if (gr->dwli) moe8__router_wgrad(gr->dwli, x, dz, T, D, H);
  if (dx) {
    #pragma omp parallel for num_threads(moe8__nt(2.0 * (double)T * (double)D * (double)H)) schedule(static)
    for (int64_t t = 0; t < T; t++)
      for (int64_t d = 0; d < D; d++) {
        float s = 0.0f;
        for (int64_t h = 0; h < H; h++) s += dz[t * H + h] * P[d * H + h];
        dx[t * D + d] += s;
      }
  }
  free(z0); free(dz0);
  return MOE8_OK;
}

/* ---- the shared expert -------------------------------------------------------- */
moe8_status moe8__shared_forward(const moe8_layer *L, moe8_order order, const float *x, const uint8_t *xq, const float *sx,
                                 int64_t T, moe8__shared_buf *b, void *scratch, size_t scratch_bytes) {
  const int64_t D = L->cfg.hidden;
  if (L->cfg.shared_ffn <= 0 || T == 0) return MOE8_OK;
  if (T > INT32_MAX) return moe8__fail(MOE8_ERR_SHAPE, "layer: %lld tokens exceed the shared expert's group size", (long long)T);
  memcpy(b->x, x, sizeof(float) * (size_t)(T * D));
  const int32_t one[1] = {(int32_t)T};
  moe8_status st = moe8__experts_forward(L, order, 1, T, one, 0, 1, b->x, xq, sx, b->gu, b->h, b->hq, b->sh, b->y, scratch, scratch_bytes);
  if (st != MOE8_OK || !L->cfg.shared_gate) return st;
  const float *wsg = L->w[MOE8_W_SHARED_GATE_W];
  #pragma omp parallel for num_threads(moe8__nt(2.0 * (double)T * (double)D)) schedule(static)
  for (int64_t t = 0; t < T; t++) {
    float l = 0.0f;
    for (int64_t d = 0; d < D; d++) l += x[t * D + d] * wsg[d];
    b->g[t] = 1.0f / (1.0f + moe8__expf(-l));
  }
  return MOE8_OK;
}

/* Token t's row of out plus the shared expert's row (times its gate). */
static void shared_add_row(const moe8_layer *L, const moe8__shared_buf *b, int64_t t, float *o) {
  const int64_t D = L->cfg.hidden;
  const float *ys = b->y + t * D, s = L->cfg.shared_scale;
  if (L->cfg.shared_gate) {
    const float g = b->g[t];
    for (int64_t d = 0; d < D; d++) o[d] = o[d] + g * ys[d];
  } else if (s != 0.0f && s != 1.0f)
    for (int64_t d = 0; d < D; d++) o[d] = o[d] + s * ys[d];
  else
    for (int64_t d = 0; d < D; d++) o[d] = o[d] + ys[d];
}

void moe8__shared_add(const moe8_layer *L, int64_t T, const moe8__shared_buf *b, float *out) {
  const int64_t D = L->cfg.hidden;
  if (L->cfg.shared_ffn <= 0) return;
  #pragma omp parallel for num_threads(moe8__nt((double)T * (double)D)) schedule(static)
  for (int64_t t = 0; t < T; t++) shared_add_row(L, b, t, out + t * D);
}

/* out = the combine of the expert rows y (slot weights w, NULL: 1), plus
** the shared expert's rows (b, when the layer has one), then the output
** scan: one pass over out instead of three.  The same operations in the
** same order as moe8_combine, moe8__shared_add and moe8__check_output. */
moe8_status moe8__finish_output(const moe8_layer *L, int64_t T, const float *y, const int32_t *pos_of, const float *w,
                                const float *idn, const moe8__shared_buf *b, float *out) {
  const int64_t D = L->cfg.hidden, K = L->cfg.top_k;
  const bool shared = L->cfg.shared_ffn > 0 && b && b->y, scan = !L->allow_nonfinite;
  const float *ob = L->cfg.out_bias ? L->w[MOE8_W_OUT_BIAS] : NULL;
  size_t bad = 0;
  #pragma omp parallel for num_threads(moe8__nt(2.0 * (double)T * (double)K * (double)D)) schedule(static) reduction(+ : bad)
  for (int64_t t = 0; t < T; t++) {
    float *o = out + t * D;
    if (y) moe8__combine_row(o, y, pos_of + t * K, w ? w + t * K : NULL, K, D);
    if (idn)
      for (int64_t d = 0; d < D; d++) o[d] = o[d] + idn[t * D + d];
    if (shared) shared_add_row(L, b, t, o);
    if (ob)
      for (int64_t d = 0; d < D; d++) o[d] = o[d] + ob[d];
    if (scan) bad += moe8__count_nonfinite(o, (size_t)D);
  }
  return bad ? moe8__check_output(L, out, T) : MOE8_OK;
}

void moe8__identity_rows(const moe8_layer *L, const float *x, int64_t T, const int32_t *ids, const float *w, float *idn) {
  const int64_t D = L->cfg.hidden, K = L->cfg.top_k, E = L->cfg.num_experts;
  #pragma omp parallel for num_threads(moe8__nt(2.0 * (double)T * (double)K * (double)D)) schedule(static)
  for (int64_t t = 0; t < T; t++) {
    float *o = idn + t * D;
    for (int64_t d = 0; d < D; d++) o[d] = 0.0f;
    for (int64_t j = 0; j < K; j++) {
      if (ids[t * K + j] < E) continue;
      const float wj = w[t * K + j];
      for (int64_t d = 0; d < D; d++) o[d] += wj * x[t * D + d];
    }
  }
}

void moe8__identity_backward(const moe8_layer *L, const float *x, int64_t T, const int32_t *ids, const float *w, const float *dout,
                             float *dx, float *dw) {
  const int64_t D = L->cfg.hidden, K = L->cfg.top_k, E = L->cfg.num_experts;
  #pragma omp parallel for num_threads(moe8__nt(4.0 * (double)T * (double)K * (double)D)) schedule(static)
  for (int64_t t = 0; t < T; t++)
    for (int64_t j = 0; j < K; j++) {
      if (ids[t * K + j] < E) continue;
      const float *g = dout + t * D, *xt = x + t * D, wj = w[t * K + j];
      float s = 0.0f;
      for (int64_t d = 0; d < D; d++) s += g[d] * xt[d];
      dw[t * K + j] = s;
      if (dx)
        for (int64_t d = 0; d < D; d++) dx[t * D + d] += wj * g[d];
    }
}

/* JetMoE's output bias on rows already combined (the expert-parallel
** owners): out[t, :] += b, as moe8__finish_output adds it. */
void moe8__out_bias_add(const moe8_layer *L, int64_t T, float *out) {
  const int64_t D = L->cfg.hidden;
  if (!L->cfg.out_bias) return;
  const float *ob = L->w[MOE8_W_OUT_BIAS];
  #pragma omp parallel for num_threads(moe8__nt((double)T * (double)D)) schedule(static)
  for (int64_t t = 0; t < T; t++)
    for (int64_t d = 0; d < D; d++) out[t * D + d] = out[t * D + d] + ob[d];
}

/* Its gradient: acc[d] += dout[t, d] over the tokens in order. */
void moe8__out_bias_grad(const moe8_layer *L, const float *dout, int64_t T, float *acc) {
  const int64_t D = L->cfg.hidden;
  #pragma omp parallel for num_threads(moe8__nt((double)T * (double)D)) schedule(static)
  for (int64_t d = 0; d < D; d++)
    for (int64_t t = 0; t < T; t++) acc[d] += dout[t * D + d];
}

float moe8__aux_loss(const moe8_layer *L, int64_t T, const int32_t *ids, const float *scores, double *f) {
  const int64_t E = moe8__router_width(L), A = T * L->cfg.top_k;
  double s = 0.0;
  for (int64_t e = 0; e < E; e++) f[e] = 0.0;
  for (int64_t a = 0; a < A; a++) f[ids[a]] += 1.0;
  for (int64_t e = 0; e < E; e++) {
    double P = 0.0;
    for (int64_t t = 0; t < T; t++) P += scores[t * E + e];
    f[e] = A ? f[e] / (double)A : 0.0;
    s += f[e] * (T ? P / (double)T : 0.0);
  }
  return (float)(L->cfg.aux_loss_weight * (double)E * s);
}


moe8_status moe8__check_output(const moe8_layer *L, const float *out, int64_t T) {
  const int64_t D = L->cfg.hidden;
  if (L->allow_nonfinite) return MOE8_OK;
  const size_t bad = moe8__count_nonfinite(out, (size_t)(T * D)); /* one vectorized pass; the place only when needed */
  for (int64_t i = 0; bad && i < T * D; i++)
    if (!isfinite(out[i])) {
      return moe8__fail(MOE8_ERR_NONFINITE, "layer %s: the output has %zu non-finite value(s), the first at token %lld, column %lld "
                        "(weights or scales too large for the input, or NaN/inf codes in a weight)",
                        L->module_path, bad, (long long)(i / D), (long long)(i % D));
    }
  return MOE8_OK;
}


/* Fake quantization for bwd_qtype, in place: per row (tiled by the rule's
** tile) when groups is NULL, else per column within each group's rows (the
** operand of that group's weight-gradient matmul). */
static moe8_status fake_quant(const moe8_layer *L, float *v, int64_t rows, int64_t cols, const int32_t *gsz, int64_t G) {
  const moe8_dtype bt = L->has_rule ? L->rule.bwd_qtype : MOE8_DTYPE_NONE;
  if (!moe8__is_qtype(bt) || rows == 0 || cols == 0) return MOE8_OK;
  moe8_quant_spec s = {.qtype = bt, .clip = 1.0f};
  if (gsz) s.gran = MOE8_GRAN_CHANNEL;
  else if (L->rule.tile_size > 0) { s.gran = MOE8_GRAN_ROW_TILE; s.tile = L->rule.tile_size; }
  else s.gran = MOE8_GRAN_ROW;
  uint8_t *q = malloc((size_t)(rows * cols));
  float *sc = malloc(sizeof(float) * (size_t)(rows * cols + 1));
  moe8_status st = q && sc ? MOE8_OK : moe8__fail(MOE8_ERR_NOMEM, "layer backward: out of memory");
  if (!gsz) {
    if (st == MOE8_OK) st = moe8_quantize(&s, v, 1, rows, cols, q, sc, NULL);
    if (st == MOE8_OK) st = moe8_dequantize(&s, q, sc, 1, rows, cols, v);
  } else {
    int64_t r0 = 0;
    for (int64_t g = 0; g < G && st == MOE8_OK; g++) {
      float *vg = v + r0 * cols;
      st = moe8_quantize(&s, vg, 1, gsz[g], cols, q, sc, NULL);
      if (st == MOE8_OK) st = moe8_dequantize(&s, q, sc, 1, gsz[g], cols, vg);
      r0 += gsz[g];
    }
  }
  free(q); free(sc);
  return st;
}

/* Gemma-4's RMSNorm of T rows of D: out[t] = ((x[t] · r_t) ⊙ w) · c with
** r_t = (mean_d x[t, d]² + eps)^(-1/2), the mean summed in double in d
** order (torch sums in f32 in its own order: within an ulp or two of r);
** c = 1 is not multiplied.  out may not be x. */
void moe8__rms_norm_rows(const float *x, int64_t T, int64_t D, float eps, const float *w, float c, float *out) {
  #pragma omp parallel for num_threads(moe8__nt(3.0 * (double)T * (double)D)) schedule(static)
  for (int64_t t = 0; t < T; t++) {
    const float *xt = x + t * D;
    double ss = 0.0;
    for (int64_t d = 0; d < D; d++) ss += (double)xt[d] * (double)xt[d];
    const float r = (float)(1.0 / sqrt(ss / (double)D + (double)eps));
    float *o = out + t * D;
    for (int64_t d = 0; d < D; d++) o[d] = xt[d] * r * w[d];
    if (c != 1.0f)
      for (int64_t d = 0; d < D; d++) o[d] = o[d] * c;
  }
}

/* Its backward from dy [T, D]: with g = c·w ⊙ dy, dx[t] += r·g - x[t]·r³·(g
** · x[t]) / D (dx may be NULL), and dw[d] += c·dy[t, d]·x[t, d]·r_t (each
** term in double, rounded) one token at a time in token order, an f32
** chain per element that expert parallelism relays over the ranks in
** order for the same bytes (dw may be NULL). */
moe8_status moe8__rms_norm_backward(const float *x, int64_t T, int64_t D, float eps, const float *w, float c, const float *dy,
                                    float *dx, float *dw) {
  double *r = malloc(sizeof(double) * (size_t)(T + 1));
  if (!r) return moe8__fail(MOE8_ERR_NOMEM, "layer backward: out of memory");
  #pragma omp parallel for num_threads(moe8__nt(6.0 * (double)T * (double)D)) schedule(static)
  for (int64_t t = 0; t < T; t++) {
    const float *xt = x + t * D;
    double ss = 0.0, gx = 0.0;
    for (int64_t d = 0; d < D; d++) ss += (double)xt[d] * (double)xt[d];
    const double rt = 1.0 / sqrt(ss / (double)D + (double)eps);
    r[t] = rt;
    for (int64_t d = 0; d < D; d++) gx += (double)c * w[d] * dy[t * D + d] * xt[d];
    if (dx)
      for (int64_t d = 0; d < D; d++) dx[t * D + d] += (float)(rt * c * w[d] * dy[t * D + d] - xt[d] * rt * rt * rt * gx / (double)D);
  }
  if (dw) {
    #pragma omp parallel for num_threads(moe8__nt(2.0 * (double)T * (double)D)) schedule(static)
    for (int64_t d = 0; d < D; d++)
      for (int64_t t = 0; t < T; t++) dw[d] += (float)((double)c * dy[t * D + d] * x[t * D + d] * r[t]);
  }
  free(r);
  return MOE8_OK;
}

void moe8__zero_grads(const moe8_layer *L, int64_t T, const moe8_layer_grads *gr) {
  const int64_t E = L->cfg.num_experts, D = L->cfg.hidden, F = L->cfg.ffn, Fs = L->cfg.shared_ffn, H = moe8__routed_width(L);
  if (gr->dwli && L->cfg.latent > 0) memset(gr->dwli, 0, sizeof(float) * (size_t)(D * H));
  if (gr->dwlo && L->cfg.latent > 0) memset(gr->dwlo, 0, sizeof(float) * (size_t)(H * D));
  if (gr->dwln && L->cfg.latent_norm) memset(gr->dwln, 0, sizeof(float) * (size_t)H);
  if (gr->dweon && L->cfg.expert_out_norm) memset(gr->dweon, 0, sizeof(float) * (size_t)H);
  if (gr->dwrs && L->cfg.router_norm) memset(gr->dwrs, 0, sizeof(float) * (size_t)D);
  if (gr->dwes && L->cfg.expert_scale) memset(gr->dwes, 0, sizeof(float) * (size_t)E);
  if (gr->dwin && L->cfg.in_norm) memset(gr->dwin, 0, sizeof(float) * (size_t)D);
  if (gr->dwon && L->cfg.out_norm) memset(gr->dwon, 0, sizeof(float) * (size_t)D);
  if (gr->dx) memset(gr->dx, 0, sizeof(float) * (size_t)(T * D));
  if (gr->dwr) memset(gr->dwr, 0, sizeof(float) * (size_t)(D * moe8__router_width(L)));
  if (gr->dwg) memset(gr->dwg, 0, sizeof(float) * (size_t)(E * H * F));
  if (gr->dwu) memset(gr->dwu, 0, sizeof(float) * (size_t)(E * H * F));
  if (gr->dwd) memset(gr->dwd, 0, sizeof(float) * (size_t)(E * F * H));
  if (gr->dwsg && Fs > 0) memset(gr->dwsg, 0, sizeof(float) * (size_t)(D * Fs));
  if (gr->dwsu && Fs > 0) memset(gr->dwsu, 0, sizeof(float) * (size_t)(D * Fs));
  if (gr->dwsd && Fs > 0) memset(gr->dwsd, 0, sizeof(float) * (size_t)(Fs * D));
  if (gr->dwsgate && Fs > 0 && L->cfg.shared_gate) memset(gr->dwsgate, 0, sizeof(float) * (size_t)D);
  if (gr->dwrb && L->cfg.router_bias) memset(gr->dwrb, 0, sizeof(float) * (size_t)moe8__router_width(L));
  if (gr->dwgub && L->cfg.expert_bias) memset(gr->dwgub, 0, sizeof(float) * (size_t)(E * 2 * F));
  if (gr->dwdb && L->cfg.expert_bias) memset(gr->dwdb, 0, sizeof(float) * (size_t)(E * D));
  if (gr->dwob && L->cfg.out_bias) memset(gr->dwob, 0, sizeof(float) * (size_t)D);
}

moe8_status moe8__router_dx(const moe8_layer *L, const float *dl, int64_t T, float *dx) {
  const int64_t E = moe8__router_width(L), D = L->cfg.hidden;
  if (T <= 0) return MOE8_OK;
  float *tmp = malloc(sizeof(float) * (size_t)(T * D) + 4);
  if (!tmp) return moe8__fail(MOE8_ERR_NOMEM, "backward: out of memory");
  const int32_t one[1] = {(int32_t)T};
  const moe8_gmm_args a = {.M = T, .K = E, .N = D, .num_groups = 1, .group_sizes = one, .num_local = 1,
                           .lhs = {MOE8_DTYPE_F32, dl, NULL, 0, 0}, .rhs = {MOE8_DTYPE_F32, L->w[MOE8_W_ROUTER], NULL, 0, 0},
                           .rhs_transposed = true, .out_dtype = MOE8_DTYPE_F32, .out = tmp};
  const moe8_status st = moe8_gmm(&a);
  for (int64_t i = 0; st == MOE8_OK && i < T * D; i++) dx[i] += tmp[i];
  free(tmp);
  return st;
}

void moe8__scale_rows(float *xs, int64_t rows, int64_t D, const int32_t *tok, const int32_t *slot, const float *w, int64_t K) {
  for (int64_t p = 0; p < rows; p++) {
    const float s = w[(int64_t)tok[p] * K + slot[p]];
    for (int64_t c = 0; c < D; c++) xs[p * D + c] *= s;
  }
}

void moe8__input_weight_backward(int64_t T, int64_t K, int64_t D, int64_t E, const int32_t *pos, const float *rows, const float *x,
                                 const float *scores, const int32_t *ids, float c, float *dx, float *dw) {
  for (int64_t t = 0; t < T; t++) {
    if (dx)
      for (int64_t d = 0; d < D; d++) dx[t * D + d] = 0.0f;
    for (int64_t j = 0; j < K; j++) {
      const int32_t p = pos[t * K + j];
      dw[t * K + j] = 0.0f;
      if (p < 0) continue;
      const float *row = rows + (int64_t)p * D, sw = scores[t * E + ids[t * K + j]] * c;
      if (dx)
        for (int64_t d = 0; d < D; d++) dx[t * D + d] += sw * row[d];
      float sdot = 0.0f;
      for (int64_t d = 0; d < D; d++) sdot += row[d] * x[t * D + d];
      dw[t * K + j] = sdot;
    }
  }
}

void moe8__dy_dw(int64_t rows, const int32_t *token_of, const int32_t *slot_of, const float *w, int64_t K,
                 const float *dout, const float *y, int64_t D, float *dy, float *dwrow) {
  #pragma omp parallel for num_threads(moe8__nt(2.0 * (double)rows * (double)D)) schedule(static)
  for (int64_t p = 0; p < rows; p++) {
    const int64_t t = token_of[p], j = slot_of[p];
    const float wt = w ? w[t * K + j] : 1.0f;
    float s = 0.0f;
    for (int64_t c = 0; c < D; c++) {
      dy[p * D + c] = wt * dout[t * D + c];
      s += dout[t * D + c] * y[p * D + c];
    }
    dwrow[p] = s;
  }
}

moe8_status moe8__experts_backward(const moe8_layer *L, int set, int64_t rows, const int32_t *gsz, int64_t g0, int64_t G, float *dy,
                                   const float *xs, const uint8_t *xsq, const float *sxs, const float *h, const uint8_t *hq,
                                   const float *sh, const float *gu, float *dxs, float *dwg, float *dwu, float *dwd, float *dbgu,
                                   float *dbd) {
  const int64_t D = L->xs[set].D, F = L->xs[set].F, N1 = L->xs[set].N1;
  const size_t RD = (size_t)(rows * D), RF = (size_t)(rows * F);
  const int64_t nw = G * D * N1, nd = G * F * D;
  /* From the layer's pool (pool.c): weight-sized and row-sized buffers
  ** that fresh pages at every call made a third of a training step. */
  moe8__pool *pl = L->pool;
  float *dyr = moe8__pool_get(pl, sizeof(float) * (RD + 1)), *dh = moe8__pool_get(pl, sizeof(float) * (RF + 1));
  float *hh = moe8__pool_get(pl, sizeof(float) * (RF + 1)), *dgu = moe8__pool_get(pl, sizeof(float) * (2 * RF + 1));
  float *dgur = moe8__pool_get(pl, sizeof(float) * (2 * RF + 1)), *xh = moe8__pool_get(pl, sizeof(float) * (RD + 1));
  float *wgu = moe8__pool_get(pl, sizeof(float) * (size_t)(nw + 1)), *wd = moe8__pool_get(pl, sizeof(float) * (size_t)(nd + 1));
  float *dwgu = moe8__pool_get(pl, sizeof(float) * (size_t)(nw + 1));
  moe8_status st = MOE8_OK;
  if (!dyr || !dh || !hh || !dgu || !dgur || !xh || !wgu || !wd || !dwgu) {
    st = moe8__fail(MOE8_ERR_NOMEM, "layer backward: out of memory");
    goto done;
  }
  /* Straight-through: the dequantized weights and activations the forward used. */
  {
    const moe8_operand gw = weight_operand(L, set, false, g0), dw = weight_operand(L, set, true, g0);
    if (L->wq) {
      st = moe8_dequantize(&L->wspec, gw.data, gw.scale, G, D, N1, wgu);
      if (st == MOE8_OK) st = moe8_dequantize(&L->wspec, dw.data, dw.scale, G, F, D, wd);
      if (st != MOE8_OK) goto done;
    } else {
      memcpy(wgu, gw.data, sizeof(float) * (size_t)nw);
      memcpy(wd, dw.data, sizeof(float) * (size_t)nd);
    }
  }
  if (L->aq) {
    st = moe8_dequantize(&L->aspec, xsq, sxs, 1, rows, D, xh);
    if (st == MOE8_OK) st = moe8_dequantize(&L->aspec, hq, sh, 1, rows, F, hh);
    if (st != MOE8_OK) goto done;
  } else {
    memcpy(xh, xs, sizeof(float) * RD);
    memcpy(hh, h, sizeof(float) * RF);
  }
  memcpy(dyr, dy, sizeof(float) * RD);
  if ((st = fake_quant(L, dy, rows, D, NULL, 0)) != MOE8_OK) goto done;
  if ((st = fake_quant(L, dyr, rows, D, gsz, G)) != MOE8_OK) goto done;
  /* dh = dy · Ŵdᵀ; dWd = ĥᵀ · dy */
  {
    const moe8_gmm_args a = {.M = rows, .K = D, .N = F, .num_groups = G, .group_sizes = gsz, .num_local = G,
                             .lhs = {MOE8_DTYPE_F32, dy, NULL, 0, 0}, .rhs = {MOE8_DTYPE_F32, wd, NULL, 0, 0},
                             .rhs_transposed = true, .out_dtype = MOE8_DTYPE_F32, .out = dh};
    if ((st = moe8_gmm(&a)) != MOE8_OK) goto done;
    if (dwd) {
      const moe8_operand l = {MOE8_DTYPE_F32, hh, NULL, 0, 0}, r = {MOE8_DTYPE_F32, dyr, NULL, 0, 0};
      if ((st = moe8_tgmm(&l, &r, rows, F, D, G, gsz, 0, G, dwd + g0 * F * D)) != MOE8_OK) goto done;
    }
  }
  /* SwiGLU: h = silu(g)·u -> dg = dh·u·σ(g)(1 + g(1-σ(g))), du = dh·silu(g).
  ** Clamped (GPT-OSS): h = g'·σ(αg')·(u'+1), g' = min(g, L), u' = clamp(u, ±L)
  ** (a NaN kept, as in the forward):
  ** dg = dh·(u'+1)·σ(αg')(1 + αg'(1-σ(αg'))) where g <= L, du = dh·g'σ(αg')
  ** where |u| <= L (torch.clamp's gradient: 1 inside the bounds, ends included).
  ** Limited (GLM-5, HY-V4): h = silu(g')·u', the plain SwiGLU's gradients at
  ** g', u', each zero where its clamp holds the value (the same ends).
  ** Clamped after the activation (Step): h = min(silu(g), L)·u', dg =
  ** dh·u'·σ(g)(1 + g(1-σ(g))) where silu(g) <= L, du = dh·min(silu(g), L)
  ** where |u| <= L (L the set's own, +inf for none).
  ** Softcapped (Inkling-2): h = A(g)·B(u), A = cg·tanh(g/cg)·σ(g), B =
  ** cu·tanh(u/cu): dg = dh·B·((1 - tanh²(g/cg))·σ(g) + cg·tanh(g/cg)·σ(g)(1-σ(g))),
  ** du = dh·A·(1 - tanh²(u/cu)).
  ** GeGLU (Gemma-4): h = G(g)·u, G(g) = 0.5·g·(1 + t), t = tanh(c), c =
  ** k0·(g + k1·g³): dg = dh·u·(0.5·(1 + t) + 0.5·g·(1 - t²)·k0·(1 +
  ** 3·k1·g²)), du = dh·G(g). */
  /* Ungated: h = relu(u)² -> du = dh·2·relu(u); h = relu(u) -> du = dh
  ** where u > 0, else 0 (torch's: 0 at u = 0). */
  const moe8_expert_act act = moe8__set_act(L, set);
  if (!moe8__act_gated(act)) {
    #pragma omp parallel for num_threads(moe8__nt(2.0 * (double)rows * (double)F)) schedule(static)
    for (int64_t p = 0; p < rows; p++)
      for (int64_t f = 0; f < F; f++) {
        const float uv = gu[p * N1 + f], d = dh[p * F + f];
        dgu[p * N1 + f] = act == MOE8_ACT_RELU2 ? (uv > 0.0f ? d * (2.0f * uv) : 0.0f) : (uv > 0.0f ? d : 0.0f);
      }
  }
  const bool clampd = act == MOE8_ACT_SWIGLU_CLAMP, limd = act == MOE8_ACT_SWIGLU_LIMIT, postd = act == MOE8_ACT_SWIGLU_POST;
  const float al = L->cfg.act_alpha, lim = postd ? moe8__set_post_limit(L, set) : L->cfg.act_limit;
  #pragma omp parallel for num_threads(moe8__nt(10.0 * (double)rows * (double)F)) schedule(static)
  for (int64_t p = 0; p < (moe8__act_gated(act) ? rows : 0); p++)
    for (int64_t f = 0; f < F; f++) {
      const float gv = gu[p * 2 * F + f], uv = gu[p * 2 * F + F + f], d = dh[p * F + f];
      if (clampd) {
        const float gc = gv > lim ? lim : gv, uc = uv < -lim ? -lim : uv > lim ? lim : uv;
        const float sg = 1.0f / (1.0f + moe8__expf(-al * gc));
        dgu[p * 2 * F + f] = gv <= lim ? d * (uc + 1.0f) * sg * (1.0f + al * gc * (1.0f - sg)) : 0.0f;
        dgu[p * 2 * F + F + f] = uv >= -lim && uv <= lim ? d * gc * sg : 0.0f;
        continue;
      }
      if (act == MOE8_ACT_GEGLU) {
        const float k0 = 0.7978845608f, k1 = 0.044715f, t = moe8__tanhf(k0 * (gv + k1 * (gv * gv * gv)));
        dgu[p * 2 * F + f] = d * uv * (0.5f * (1.0f + t) + 0.5f * gv * (1.0f - t * t) * k0 * (1.0f + 3.0f * k1 * gv * gv));
        dgu[p * 2 * F + F + f] = d * (0.5f * gv * (1.0f + t));
        continue;
      }
      if (act == MOE8_ACT_SWIGLU_SOFTCAP) {
        const float cg = al, cu = L->cfg.act_limit;
        const float tg = moe8__tanhf(gv / cg), tu = moe8__tanhf(uv / cu), sg = 1.0f / (1.0f + moe8__expf(-gv));
        const float A = cg * tg * sg, B = cu * tu;
        dgu[p * 2 * F + f] = d * B * ((1.0f - tg * tg) * sg + cg * tg * sg * (1.0f - sg));
        dgu[p * 2 * F + F + f] = d * A * (1.0f - tu * tu);
        continue;
      }
      if (postd) {
        const float sg = 1.0f / (1.0f + moe8__expf(-gv)), sv = gv * sg;
        const float sc = sv > lim ? lim : sv, uc = uv < -lim ? -lim : uv > lim ? lim : uv;
        dgu[p * 2 * F + f] = sv <= lim ? d * uc * sg * (1.0f + gv * (1.0f - sg)) : 0.0f;
        dgu[p * 2 * F + F + f] = uv >= -lim && uv <= lim ? d * sc : 0.0f;
        continue;
      }
      /* the plain SwiGLU's gradients, at the clamped g and u when limited */
      const float gc = limd && gv > lim ? lim : gv, uc = limd ? (uv < -lim ? -lim : uv > lim ? lim : uv) : uv;
      const bool gin = !limd || gv <= lim, uin = !limd || (uv >= -lim && uv <= lim);
      const float sg = 1.0f / (1.0f + moe8__expf(-gc));
      dgu[p * 2 * F + f] = gin ? d * uc * sg * (1.0f + gc * (1.0f - sg)) : 0.0f;
      dgu[p * 2 * F + F + f] = uin ? d * gc * sg : 0.0f;
    }
  /* the biases' gradients: their rows summed per expert, in row order */
  if (dbgu || dbd) {
    int64_t p = 0;
    for (int64_t g = 0; g < G; g++)
      for (int64_t r = 0; r < gsz[g]; r++, p++) {
        if (dbgu)
          for (int64_t c = 0; c < N1; c++) dbgu[(g0 + g) * N1 + c] += dgu[p * N1 + c];
        if (dbd)
          for (int64_t c = 0; c < D; c++) dbd[(g0 + g) * D + c] += dyr[p * D + c];
      }
  }
  memcpy(dgur, dgu, sizeof(float) * (size_t)(rows * N1));
  if ((st = fake_quant(L, dgu, rows, N1, NULL, 0)) != MOE8_OK) goto done;
  if ((st = fake_quant(L, dgur, rows, N1, gsz, G)) != MOE8_OK) goto done;
  /* dxs = dgu · Ŵguᵀ; dWgu = x̂sᵀ · dgu */
  {
    const moe8_gmm_args a = {.M = rows, .K = N1, .N = D, .num_groups = G, .group_sizes = gsz, .num_local = G,
                             .lhs = {MOE8_DTYPE_F32, dgu, NULL, 0, 0}, .rhs = {MOE8_DTYPE_F32, wgu, NULL, 0, 0},
                             .rhs_transposed = true, .out_dtype = MOE8_DTYPE_F32, .out = dxs};
    if ((st = moe8_gmm(&a)) != MOE8_OK) goto done;
    if (dwg || dwu) {
      const moe8_operand l = {MOE8_DTYPE_F32, xh, NULL, 0, 0}, r = {MOE8_DTYPE_F32, dgur, NULL, 0, 0};
      if ((st = moe8_tgmm(&l, &r, rows, D, N1, G, gsz, 0, G, dwgu)) != MOE8_OK) goto done;
      const bool gated = moe8__act_gated(act); /* ungated: the rows are up's alone, dwg stays zero */
      #pragma omp parallel for collapse(2) num_threads(moe8__nt(2.0 * (double)G * (double)D * (double)F)) schedule(static)
      for (int64_t e = 0; e < G; e++)
        for (int64_t d = 0; d < D; d++) {
          const float *src = dwgu + (e * D + d) * N1;
          if (dwg && gated) memcpy(dwg + ((g0 + e) * D + d) * F, src, sizeof(float) * (size_t)F);
          if (dwu) memcpy(dwu + ((g0 + e) * D + d) * F, gated ? src + F : src, sizeof(float) * (size_t)F);
        }
    }
  }
done: { /* a block: C11 allows no declaration right after a label */
  float *const bufs[] = {dyr, dh, hh, dgu, dgur, xh, wgu, wd, dwgu};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) moe8__pool_put(pl, bufs[i]);
  }
  return st;
}

void moe8__router_backward(const moe8_layer *L, int64_t T, const float *scores, const int32_t *ids, const float *dw,
                           const double *f, int64_t T_total, float *dl) {
  const int64_t E = moe8__router_width(L), K = L->cfg.top_k;
  const float c = L->cfg.routed_scaling_factor != 0.0f ? L->cfg.routed_scaling_factor : 1.0f;
  const bool use_aux = L->cfg.aux_loss_weight != 0.0f;
  #pragma omp parallel for num_threads(moe8__nt(4.0 * (double)T * (double)E)) schedule(static)
  for (int64_t t = 0; t < T; t++) {
    const float *s = scores + t * E;
    float *dst = dl + t * E;
    for (int64_t e = 0; e < E; e++) dst[e] = 0.0f;
    const float np = L->cfg.norm_p;
    if (L->cfg.norm_topk_prob && np != 0.0f && np != 1.0f) {
      /* w_j = s_j / N, N = (Σ s^p)^(1/p): dL/ds_i = dw_i / N - (Σ_j dw_j s_j) s_i^(p-1) N^(-1-p) */
      float sp = 0.0f, dot = 0.0f;
      for (int64_t j = 0; j < K; j++) sp += powf(s[ids[t * K + j]], np);
      const float N = powf(sp, 1.0f / np);
      if (N > 0.0f) {
        for (int64_t j = 0; j < K; j++) dot += dw[t * K + j] * s[ids[t * K + j]];
        const float q = dot * powf(N, -1.0f - np);
        for (int64_t j = 0; j < K; j++) {
          const float si = s[ids[t * K + j]];
          dst[ids[t * K + j]] += c * (dw[t * K + j] / N - q * powf(si, np - 1.0f));
        }
      }
    } else if (L->cfg.norm_topk_prob) {
      float S = 0.0f, dot = 0.0f;
      for (int64_t j = 0; j < K; j++) S += s[ids[t * K + j]];
      S += L->cfg.norm_eps;
      if (S < L->cfg.norm_min) { /* the forward divided by norm_min: a constant */
        for (int64_t j = 0; j < K; j++) dst[ids[t * K + j]] += c * (dw[t * K + j] / L->cfg.norm_min);
      } else {
        for (int64_t j = 0; j < K; j++) dot += dw[t * K + j] * s[ids[t * K + j]];
        for (int64_t j = 0; j < K; j++) dst[ids[t * K + j]] += c * (dw[t * K + j] / S - dot / (S * S));
      }
    } else {
      for (int64_t j = 0; j < K; j++) dst[ids[t * K + j]] += c * dw[t * K + j];
    }
    if (use_aux)
      for (int64_t e = 0; e < E; e++)
        dst[e] += (float)((double)L->cfg.aux_loss_weight * (double)E * f[e] / (double)T_total);
    if (L->cfg.score == MOE8_SCORE_SOFTMAX) {
      float dot = 0.0f;
      for (int64_t e = 0; e < E; e++) dot += s[e] * dst[e];
      for (int64_t e = 0; e < E; e++) dst[e] = s[e] * (dst[e] - dot);
    } else if (L->cfg.score == MOE8_SCORE_SQRTSOFTPLUS) {
      for (int64_t e = 0; e < E; e++) dst[e] = dst[e] * moe8__sqrt_softplus_grad(s[e]);
    } else {
      for (int64_t e = 0; e < E; e++) dst[e] = dst[e] * s[e] * (1.0f - s[e]);
    }
  }
}

void moe8__router_wgrad(float *acc, const float *x, const float *dl, int64_t T, int64_t D, int64_t E) {
  #pragma omp parallel for num_threads(moe8__nt(2.0 * (double)D * (double)T * (double)E)) schedule(static)
  for (int64_t d = 0; d < D; d++)
    for (int64_t t = 0; t < T; t++) {
      const float xv = x[t * D + d];
      for (int64_t e = 0; e < E; e++) acc[d * E + e] += xv * dl[t * E + e];
    }
}


moe8_status moe8__shared_backward(const moe8_layer *L, const float *x, const uint8_t *xq, const float *sx, int64_t T,
                                  const float *dout, moe8__shared_buf *b, float *dx, const moe8_layer_grads *gr) {
  const int64_t D = L->cfg.hidden;
  const bool gated = L->cfg.shared_gate;
  const float ss = gated || L->cfg.shared_scale == 0.0f ? 1.0f : L->cfg.shared_scale; /* the forward's o + s * ys */
  if (L->cfg.shared_ffn <= 0 || T == 0) return MOE8_OK;
  float *dys = moe8__pool_get(L->pool, sizeof(float) * (size_t)(T * D) + 4), *dxs = moe8__pool_get(L->pool, sizeof(float) * (size_t)(T * D) + 4);
  float *dgl = malloc(sizeof(float) * (size_t)T + 4);
  moe8_status st = dys && dxs && dgl ? MOE8_OK : moe8__fail(MOE8_ERR_NOMEM, "layer backward: out of memory");
  if (st == MOE8_OK) {
    #pragma omp parallel for num_threads(moe8__nt(2.0 * (double)T * (double)D)) schedule(static)
    for (int64_t t = 0; t < T; t++) {
      float s = 0.0f;
      const float g = gated ? b->g[t] : 1.0f;
      for (int64_t c = 0; c < D; c++) {
        dys[t * D + c] = gated ? g * dout[t * D + c] : ss != 1.0f ? ss * dout[t * D + c] : dout[t * D + c];
        s += dout[t * D + c] * b->y[t * D + c];
      }
      dgl[t] = s * (g * (1.0f - g));
    }
    const int32_t one[1] = {(int32_t)T};
    st = moe8__experts_backward(L, 1, T, one, 0, 1, dys, b->x, xq, sx, b->h, b->hq, b->sh, b->gu, dxs, gr->dwsg, gr->dwsu, gr->dwsd, NULL,
                                NULL);
  }
  if (st == MOE8_OK && dx) {
    const float *wsg = gated ? L->w[MOE8_W_SHARED_GATE_W] : NULL;
    #pragma omp parallel for num_threads(moe8__nt(2.0 * (double)T * (double)D)) schedule(static)
    for (int64_t t = 0; t < T; t++)
      for (int64_t d = 0; d < D; d++) {
        dx[t * D + d] += dxs[t * D + d];
        if (gated) dx[t * D + d] += dgl[t] * wsg[d];
      }
  }
  if (st == MOE8_OK && gated && gr->dwsgate) {
    float *acc = gr->dwsgate;
    #pragma omp parallel for num_threads(moe8__nt(2.0 * (double)T * (double)D)) schedule(static)
    for (int64_t d = 0; d < D; d++)
      for (int64_t t = 0; t < T; t++) acc[d] += x[t * D + d] * dgl[t];
  }
  moe8__pool_put(L->pool, dys), moe8__pool_put(L->pool, dxs);
  free(dgl);
  return st;
}

