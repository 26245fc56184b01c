/*
** ep_a2a.c — expert parallelism by all-to-all dispatch (docs/parallelism.md).
**
** Forward on rank r of P (E_loc = E/P experts from g0 = r·E_loc):
**   1. agree on valid input; all-gather the token counts (global token
**      order is rank order, as in the ring);
**   2. route the local tokens;
**   3. the dispatch plan: token t goes to rank q when one of its top-k
**      experts lives on q — once per rank, however many of its experts q
**      holds; rows to q in local token order;
**   4. the wire rows (wire format below), quantized per token first when the
**      rule quantizes activations before the exchange; a count exchange,
**      then MPI_Alltoallv of the rows;
**   5. the received rows arrive grouped by source rank in rank order, each
**      group in its source's token order: global token order.  Their
**      assignments to this rank's experts are sorted stably by expert (so
**      within an expert, by global token — the single-process order), with
**      the single-process capacity ceil(T·k/E · c) from the global T;
**   6. the experts run (the layer's own phase); each (token, local slot)
**      output row returns to the token's owner with a kept flag (MPI
**      Alltoallv), and the owner combines its slots in order j = 0, 1, ...
**      exactly as the single-process layer (moe8_combine);
**   7. the shared expert on the owner's rows; the aux loss from the global
**      expert counts (all-gathered integers) and the scores' per-expert sums
**      relayed over the ranks in order (one chain in global token order).
** Backward mirrors it: dout rows and the tokens' routing weights go out by
** the same plan; each rank differentiates its experts' rows; the
** input-gradient rows and the routing-weight gradients return to the
** owners; the router backward, the dWr relay and the shared expert are the
** ring's.
**
** Wire format of a dispatched row (4-byte aligned): int32 expert ids[k],
** for Llama-4's input scaling f32 routing weights[k], then either f32
** scales[nb] and the quantized codes[D] padded to 4 bytes (quantized
** before the exchange; never for Llama-4, whose rows are scaled first) or
** f32 x[D].  A returned row: f32 y[D]
** and f32 kept (1 or 0).  A backward row out: f32 weights[k], f32 dout[D];
** back: f32 dx[D], f32 dweight.
*/
#include "ep_internal.h"
#include "../kernels/gmm.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct a2a_state {
  int64_t  T, T0, Tl;
  int32_t *ids;              /* [Tl·K] local routing                               */
  float   *w, *scores;       /* [Tl·K], [Tl·E]                                     */
  size_t  *scnt, *rcnt;      /* dispatch rows to / from each peer [P]              */
  size_t  *bcnt, *brcnt;     /* return rows to / from each peer [P]                */
  int64_t  nsend, nrecv, nback, nbrecv;
  int32_t *rids;             /* [nrecv·K] the received rows' expert ids            */
  int64_t  rows;             /* kept assignments on this rank                      */
  int32_t *gsz;              /* [E_loc]                                            */
  int32_t *tok_of, *slot_of; /* [rows] received row and slot of each sorted row   */
  int32_t *pos;              /* [nrecv·K] sorted row, or -1 (dropped, not local)   */
  int32_t *recvrow;          /* [Tl·K] owner: return row of each slot, or -1       */
  int32_t *send_tok;         /* [nsend] the local token of each dispatched row, rows to
                             ** rank 0 first, each rank's in token order (the plan) */
  int32_t *ret_asg;          /* [nback] the received assignment (row·K + slot) of each
                             ** returned row, in received order                      */
  float   *xs, *sxs, *gu, *h, *sh, *y;
  uint8_t *xsq, *hq;
  double   f[MOE8_MAX_EXPERTS];
};

void moe8__a2a_free(moe8_ep *ep) {
  a2a_state *s = ep->a2a;
  if (!s) return;
  void *p[] = {s->ids, s->w, s->scores, s->scnt, s->rcnt, s->bcnt, s->brcnt, s->rids, s->gsz, s->tok_of, s->slot_of, s->pos,
               s->recvrow, s->send_tok, s->ret_asg, s->xs, s->sxs, s->gu, s->h, s->sh, s->y, s->xsq, s->hq};
  for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) free(p[i]);
  free(s);
  ep->a2a = NULL;
  ep->have_forward = false;
}


static size_t r4(size_t n) { return (n + 3) & ~(size_t)3; }

/* Bytes of a dispatched row's ids (and weights), and of the whole row. */
static size_t wire_head(const moe8_layer *L) { return 4 * (size_t)L->cfg.top_k * (L->cfg.weight_input ? 2 : 1); }

static size_t wire_row(const moe8_layer *L, bool quant) {
  const int64_t D = L->cfg.hidden, nbD = L->aq ? moe8__cdiv(D, L->aspec.tile ? L->aspec.tile : D) : 0;
  return wire_head(L) + (quant ? 4 * (size_t)nbD + r4((size_t)D) : 4 * (size_t)D);
}

/* One Alltoallv of rows: cnt[q] rows of row_bytes to q, rcnt[q] from q;
** the bytes to and from other ranks are added to *sent / *got. */
static moe8_status a2a_rows(moe8_ep *ep, const void *send, const size_t *cnt, void *recv, const size_t *rcnt, size_t row_bytes,
                            uint64_t *sent, uint64_t *got) {
  const int P = ep->P;
  size_t *sb = malloc(sizeof(size_t) * 2 * (size_t)P);
  if (!sb) return moe8__fail(MOE8_ERR_NOMEM, "ep: out of memory");
  for (int q = 0; q < P; q++) {
    sb[q] = cnt[q] * row_bytes;
    sb[P + q] = rcnt[q] * row_bytes;
    if (q != ep->r) { *sent += sb[q]; *got += sb[P + q]; }
  }
  moe8_status st = ep->c->alltoallv(ep->c, send, sb, recv, sb + P);
  free(sb);
  return st;
}

/* The aux loss and f_e from every rank's routing: expert counts (integers,
** summed exactly) and each expert's score sum as one chain over the global
** token order (relayed rank to rank), then the single-process formula. */
static moe8_status aux_loss(moe8_ep *ep, a2a_state *s, bool want_aux, float *aux) {
  moe8_layer *L = ep->L;
  const int64_t E = moe8__router_width(L), K = L->cfg.top_k, T = s->T, A = T * K; /* the router's experts */
  const int P = ep->P;
  int64_t *cnt = calloc((size_t)(E * (P + 1)), sizeof(int64_t));
  double *Pe = calloc((size_t)E + 1, sizeof(double));
  size_t *rb = malloc(sizeof(size_t) * (size_t)P);
  moe8_status st = cnt && Pe && rb ? MOE8_OK : moe8__fail(MOE8_ERR_NOMEM, "ep: out of memory");
  if (st == MOE8_OK) {
    for (int64_t a = 0; a < s->Tl * K; a++) cnt[s->ids[a]]++;
    for (int q = 0; q < P; q++) rb[q] = sizeof(int64_t) * (size_t)E;
    st = ep->c->allgatherv(ep->c, cnt, sizeof(int64_t) * (size_t)E, cnt + E, rb);
  }
  if (st == MOE8_OK)
    for (int64_t e = 0; e < E; e++) {
      int64_t n = 0;
      for (int q = 0; q < P; q++) n += cnt[E + q * E + e];
      s->f[e] = A ? (double)n / (double)A : 0.0;
    }
  if (st == MOE8_OK && want_aux) {
    if (ep->r > 0) st = ep->c->recv(ep->c, ep->r - 1, Pe, sizeof(double) * (size_t)E);
    for (int64_t e = 0; st == MOE8_OK && e < E; e++)
      for (int64_t t = 0; t < s->Tl; t++) Pe[e] += s->scores[t * E + e];
    if (st == MOE8_OK && ep->r < P - 1) st = ep->c->send(ep->c, ep->r + 1, Pe, sizeof(double) * (size_t)E);
    if (st == MOE8_OK) st = ep->c->bcast(ep->c, P - 1, Pe, sizeof(double) * (size_t)E);
    double sum = 0.0;
    for (int64_t e = 0; e < E; e++) sum += s->f[e] * (T ? Pe[e] / (double)T : 0.0);
    if (st == MOE8_OK) *aux = (float)(L->cfg.aux_loss_weight * (double)E * sum);
  }
  free(cnt); free(Pe); free(rb);
  return st;
}

moe8_status moe8__a2a_forward(moe8_ep *ep, const float *x, int64_t Tl, const int32_t *tok, float *out, float *aux) {
  moe8_layer *L = ep->L;
  const int64_t E = L->cfg.num_experts, K = L->cfg.top_k, D = L->cfg.hidden, F = L->cfg.ffn, Eloc = ep->Eloc, g0 = ep->g0;
  const int64_t ER = moe8__router_width(L); /* with LongCat-Flash's identity experts (ids >= E: no rank, no rows) */
  const int P = ep->P;
  /* 1. the input checked on every rank, the token counts */
  moe8_status st = moe8__ep_begin_forward(ep, x, Tl, tok, out);
  if (st != MOE8_OK) return st;
  moe8__a2a_free(ep);
  a2a_state *s = ep->a2a = calloc(1, sizeof *s);
  if ((st = moe8__ep_agree(ep, s ? MOE8_OK : moe8__fail(MOE8_ERR_NOMEM, "ep: out of memory"))) != MOE8_OK) return st;
  s->Tl = Tl;
  s->T = ep->T;
  s->T0 = ep->Toff[ep->r];
  if (aux) *aux = 0.0f;
  bool ok = true;
  /* 2. local routing */
  float *logits;
  ALLOC(logits, Tl * ER); ALLOC(s->ids, Tl * K); ALLOC(s->w, Tl * K); ALLOC(s->scores, Tl * ER);
  ALLOC(s->scnt, P); ALLOC(s->rcnt, P); ALLOC(s->bcnt, P); ALLOC(s->brcnt, P); ALLOC(s->recvrow, Tl * K);
  if (!ok) { free(logits); return moe8__ep_agree(ep, moe8__fail(MOE8_ERR_NOMEM, "ep: out of memory")); }
  const moe8_router_config rc = moe8__router_config(L, tok);
  /* Gemma-4: the router reads n(x) ⊙ s · c, the experts n(x) ⊙ w_in (x without the norms) */
  const float *xr = x, *xe = x;
  st = moe8__ep_norms_in(ep, x, Tl, &xr, &xe);
  if (st == MOE8_OK) st = moe8__router_logits(L, xr, Tl, logits);
  if (st == MOE8_OK) st = moe8_route(&rc, logits, Tl, s->scores, s->ids, s->w);
  if (st == MOE8_OK) st = moe8__ep_scale_weights(ep, Tl, s->ids, s->w);
  free(logits);
  /* 3. the dispatch plan (each token once to each rank among its experts'
  ** ranks), and the owner's count of rows coming back from each rank */
  for (int q = 0; q < P; q++) s->scnt[q] = s->brcnt[q] = 0;
  ALLOC(s->send_tok, Tl * K);
  if (!ok) return moe8__ep_agree(ep, moe8__fail(MOE8_ERR_NOMEM, "ep: out of memory"));
  for (int64_t t = 0; st == MOE8_OK && t < Tl; t++)
    for (int64_t j = 0; j < K; j++) {
      if (s->ids[t * K + j] >= E) continue; /* an identity expert's slot: computed here */
      const int64_t q = s->ids[t * K + j] / Eloc;
      bool first = true; /* the first of this token's slots on rank q */
      for (int64_t i = 0; i < j && first; i++) first = s->ids[t * K + i] / Eloc != q;
      s->brcnt[q]++;
      s->scnt[q] += first;
    }
  s->nsend = 0;
  int64_t *at = malloc(sizeof(int64_t) * (size_t)P);
  if (!at) return moe8__ep_agree(ep, moe8__fail(MOE8_ERR_NOMEM, "ep: out of memory"));
  for (int q = 0; q < P; q++) { at[q] = s->nsend; s->nsend += (int64_t)s->scnt[q]; }
  for (int64_t t = 0; st == MOE8_OK && t < Tl; t++) /* (after a routing failure the ids are not read: it is agreed below) */
    for (int64_t j = 0; j < K; j++) {
      if (s->ids[t * K + j] >= E) continue;
      const int64_t q = s->ids[t * K + j] / Eloc;
      bool first = true;
      for (int64_t i = 0; i < j && first; i++) first = s->ids[t * K + i] / Eloc != q;
      if (first) s->send_tok[at[q]++] = (int32_t)t;
    }
  free(at);
  /* 4. counts, then rows */
  const bool wi = L->cfg.weight_input, quant = L->aq && L->before_sort && !wi;
  const size_t row = wire_row(L, quant), hd = wire_head(L);
  const int64_t nbD = L->aq ? moe8__cdiv(D, L->aspec.tile ? L->aspec.tile : D) : 0;
  if ((st = moe8__ep_agree(ep, st)) != MOE8_OK) return st;
  size_t *cb = malloc(sizeof(size_t) * 2 * (size_t)P);
  if (!cb) return moe8__ep_agree(ep, moe8__fail(MOE8_ERR_NOMEM, "ep: out of memory"));
  for (int q = 0; q < P; q++) cb[q] = cb[P + q] = sizeof(size_t);
  st = ep->c->alltoallv(ep->c, s->scnt, cb, s->rcnt, cb + P);
  free(cb);
  if (st != MOE8_OK) return st;
  s->nrecv = 0;
  for (int q = 0; q < P; q++) s->nrecv += (int64_t)s->rcnt[q];
  uint8_t *sendb = malloc(row * (size_t)s->nsend + 64), *recvb = malloc(row * (size_t)s->nrecv + 64), *xq = NULL;
  float *sx = NULL;
  if (quant) { xq = malloc((size_t)(Tl * D) + 1); sx = malloc(sizeof(float) * (size_t)(Tl * nbD) + 4); }
  if (!sendb || !recvb || (quant && (!xq || !sx))) st = moe8__fail(MOE8_ERR_NOMEM, "ep: out of memory");
  if (st == MOE8_OK && quant) st = moe8_quantize(&L->aspec, xe, 1, Tl, D, xq, sx, NULL);
  for (int64_t n = 0; st == MOE8_OK && n < s->nsend; n++) {
    const int64_t t = s->send_tok[n];
    uint8_t *o = sendb + (size_t)n * row;
    memcpy(o, s->ids + t * K, 4 * (size_t)K);
    if (wi) memcpy(o + 4 * K, s->w + t * K, 4 * (size_t)K);
    if (quant) {
      memcpy(o + hd, sx + t * nbD, 4 * (size_t)nbD);
      memset(o + hd + 4 * nbD, 0, r4((size_t)D));
      memcpy(o + hd + 4 * nbD, xq + t * D, (size_t)D);
    } else {
      memcpy(o + hd, xe + t * D, 4 * (size_t)D);
    }
  }
  free(xq); free(sx);
  if ((st = moe8__ep_agree(ep, st)) != MOE8_OK) { free(sendb); free(recvb); return st; }
  double t0 = moe8__ep_now();
  st = a2a_rows(ep, sendb, s->scnt, recvb, s->rcnt, row, &ep->st.fwd_sent_bytes, &ep->st.fwd_recv_bytes);
  ep->st.tokens_s = moe8__ep_now() - t0;
  ep->st.tokens_bytes = (uint64_t)s->nrecv * row;
  for (int q = 0; q < P; q++)
    if (q != ep->r) { ep->st.dispatch_rows_sent += s->scnt[q]; ep->st.dispatch_rows_recv += s->rcnt[q]; }
  free(sendb);
  if (st != MOE8_OK) { free(recvb); return st; }
  /* 5. this rank's assignments, sorted by expert, with the global capacity */
  const int64_t NR = s->nrecv;
  ALLOC(s->rids, NR * K); ALLOC(s->pos, NR * K); ALLOC(s->gsz, Eloc);
  int64_t *off = malloc(sizeof(int64_t) * (size_t)(Eloc + 1));
  if (!ok || !off) { free(recvb); free(off); return moe8__ep_agree(ep, moe8__fail(MOE8_ERR_NOMEM, "ep: out of memory")); }
  for (int64_t i = 0; i < NR; i++) memcpy(s->rids + i * K, recvb + (size_t)i * row, 4 * (size_t)K);
  const int64_t cap = L->cfg.capacity_factor > 0.0f ? (int64_t)ceil((double)(s->T * K) / (double)E * (double)L->cfg.capacity_factor)
                                                    : INT64_MAX;
  for (int64_t g = 0; g < Eloc; g++) s->gsz[g] = 0;
  for (int64_t a = 0; a < NR * K; a++) {
    const int64_t g = s->rids[a] - g0;
    if (g >= 0 && g < Eloc && s->gsz[g] < cap) s->gsz[g]++;
  }
  off[0] = 0;
  for (int64_t g = 0; g < Eloc; g++) off[g + 1] = off[g] + s->gsz[g];
  const int64_t rows = s->rows = off[Eloc];
  ALLOC(s->tok_of, rows); ALLOC(s->slot_of, rows);
  ALLOC(s->xs, rows * D); ALLOC(s->gu, rows * 2 * F); ALLOC(s->h, rows * F); ALLOC(s->y, rows * D);
  if (L->aq) {
    ALLOC(s->xsq, rows * D); ALLOC(s->sxs, rows * nbD); ALLOC(s->hq, rows * F);
    ALLOC(s->sh, rows * moe8__cdiv(F, L->aspec.tile ? L->aspec.tile : F));
  }
  if (!ok) { free(recvb); free(off); return moe8__ep_agree(ep, moe8__fail(MOE8_ERR_NOMEM, "ep: out of memory")); }
  int64_t *fill = calloc((size_t)Eloc + 1, sizeof(int64_t));
  for (int64_t a = 0; fill && a < NR * K; a++) {
    const int64_t g = s->rids[a] - g0;
    s->pos[a] = -1;
    if (g < 0 || g >= Eloc || fill[g] >= s->gsz[g]) continue;
    const int64_t p = off[g] + fill[g]++;
    s->pos[a] = (int32_t)p;
    s->tok_of[p] = (int32_t)(a / K);
    s->slot_of[p] = (int32_t)(a % K);
  }
  if (!fill) st = moe8__fail(MOE8_ERR_NOMEM, "ep: out of memory");
  free(fill); free(off);
  /* the expert input rows (Llama-4's scaled by their slots' weights) */
  float *rw = wi ? malloc(sizeof(float) * (size_t)(NR * K) + 4) : NULL;
  if (wi && !rw) st = moe8__fail(MOE8_ERR_NOMEM, "ep: out of memory");
  for (int64_t i = 0; st == MOE8_OK && wi && i < NR; i++) memcpy(rw + i * K, recvb + (size_t)i * row + 4 * K, 4 * (size_t)K);
  for (int64_t p = 0; st == MOE8_OK && p < rows; p++) {
    const uint8_t *src = recvb + (size_t)s->tok_of[p] * row + hd;
    if (quant) {
      memcpy(s->sxs + p * nbD, src, 4 * (size_t)nbD);
      memcpy(s->xsq + p * D, src + 4 * nbD, (size_t)D);
    } else {
      memcpy(s->xs + p * D, src, 4 * (size_t)D);
    }
  }
  free(recvb);
  if (st == MOE8_OK && wi) moe8__scale_rows(s->xs, rows, D, s->tok_of, s->slot_of, rw, K);
  free(rw);
  if (st == MOE8_OK && L->aq && !quant) st = moe8_quantize(&L->aspec, s->xs, 1, rows, D, s->xsq, s->sxs, NULL);
  /* 6. the experts, and their rows back to the owners */
  if (st == MOE8_OK)
    st = moe8__experts_forward(L, moe8__layer_order_now(L), 0, rows, s->gsz, g0, Eloc, s->xs, s->xsq, s->sxs, s->gu, s->h, s->hq,
                               s->sh, s->y, NULL, 0);
  if ((st = moe8__ep_agree(ep, st)) != MOE8_OK) return st;
  /* the return plan: one row per received assignment to a local expert,
  ** in received order (grouped by source rank) */
  s->nback = s->nbrecv = 0;
  ALLOC(s->ret_asg, NR * K);
  if (!ok) return moe8__ep_agree(ep, moe8__fail(MOE8_ERR_NOMEM, "ep: out of memory"));
  for (int q = 0, i0 = 0; q < P; q++) {
    s->bcnt[q] = 0;
    for (int64_t a = i0 * K; a < (i0 + (int64_t)s->rcnt[q]) * K; a++)
      if (s->rids[a] / Eloc == ep->r) { s->ret_asg[s->nback++] = (int32_t)a; s->bcnt[q]++; }
    i0 += (int)s->rcnt[q];
    s->nbrecv += (int64_t)s->brcnt[q];
  }
  const size_t brow = sizeof(float) * (size_t)(D + 1);
  float *bsend = malloc(brow * (size_t)s->nback + 4), *brecv = malloc(brow * (size_t)s->nbrecv + 4);
  float *rx = malloc(sizeof(float) * (size_t)(s->nbrecv * D) + 4);
  if (!bsend || !brecv || !rx) st = moe8__fail(MOE8_ERR_NOMEM, "ep: out of memory");
  for (int64_t n = 0; st == MOE8_OK && n < s->nback; n++) {
    float *o = bsend + (size_t)n * (size_t)(D + 1);
    const int32_t p = s->pos[s->ret_asg[n]];
    if (p >= 0) memcpy(o, s->y + (int64_t)p * D, sizeof(float) * (size_t)D);
    else memset(o, 0, sizeof(float) * (size_t)D);
    o[D] = p >= 0 ? 1.0f : 0.0f;
  }
  if ((st = moe8__ep_agree(ep, st)) != MOE8_OK) { free(bsend); free(brecv); free(rx); return st; }
  t0 = moe8__ep_now();
  st = a2a_rows(ep, bsend, s->bcnt, brecv, s->brcnt, brow, &ep->st.fwd_sent_bytes, &ep->st.fwd_recv_bytes);
  ep->st.combine_s = moe8__ep_now() - t0;
  ep->st.combine_bytes = (uint64_t)s->nbrecv * brow;
  free(bsend);
  if (st == MOE8_OK) {
    /* the owner's slots: rows from rank q in (token, slot) order */
    int64_t *base = malloc(sizeof(int64_t) * (size_t)(P + 1));
    if (!base) st = moe8__fail(MOE8_ERR_NOMEM, "ep: out of memory");
    else {
      base[0] = 0;
      for (int q = 0; q < P; q++) base[q + 1] = base[q] + (int64_t)s->brcnt[q];
      for (int64_t t = 0; t < Tl; t++)
        for (int64_t j = 0; j < K; j++) {
          if (s->ids[t * K + j] >= E) { s->recvrow[t * K + j] = -1; continue; } /* an identity expert's slot */
          const int q = (int)(s->ids[t * K + j] / Eloc);
          const int64_t i = base[q]++;
          s->recvrow[t * K + j] = brecv[i * (D + 1) + D] != 0.0f ? (int32_t)i : -1;
        }
      for (int64_t i = 0; i < s->nbrecv; i++) memcpy(rx + i * D, brecv + i * (D + 1), sizeof(float) * (size_t)D);
      free(base);
    }
  }
  free(brecv);
  /* LongCat-Flash's identity slots on the owner, as the single process
  ** sums them (before the combine writes out) */
  float *idn = L->cfg.zero_experts && st == MOE8_OK ? malloc(sizeof(float) * (size_t)(Tl * D) + 4) : NULL;
  if (L->cfg.zero_experts && st == MOE8_OK && !idn) st = moe8__fail(MOE8_ERR_NOMEM, "ep: out of memory");
  if (idn) moe8__identity_rows(L, x, Tl, s->ids, s->w, idn);
  /* Llama-4: the outputs summed unweighted */
  if (st == MOE8_OK) st = moe8_combine(rx, s->nbrecv, s->recvrow, wi ? NULL : s->w, Tl, K, D, out);
  if (st == MOE8_OK && idn)
    for (int64_t i = 0; i < Tl * D; i++) out[i] = out[i] + idn[i];
  free(idn);
  free(rx);
  /* 7. the shared expert, the output check, the aux loss */
  if (st == MOE8_OK && L->cfg.shared_ffn > 0 && Tl > 0) st = moe8__ep_shared_run(ep, xe, Tl, out, NULL, NULL, NULL);
  if (st == MOE8_OK) moe8__out_bias_add(L, Tl, out); /* JetMoE: after the shared expert, as the single process */
  if (st == MOE8_OK) st = moe8__ep_norm_out(ep, Tl, out); /* Gemma-4: the output's norm, last */
  if (st == MOE8_OK) st = moe8__check_output(L, out, Tl);
  if ((st = moe8__ep_agree(ep, st)) != MOE8_OK) return st;
  float a = 0.0f;
  st = aux_loss(ep, s, aux && L->cfg.aux_loss_weight != 0.0f, &a);
  if (st == MOE8_OK && aux) *aux = a;
  if (st == MOE8_OK) ep->have_forward = true;
  return moe8__ep_agree(ep, st);
}

moe8_status moe8__a2a_backward(moe8_ep *ep, const float *x, int64_t Tl, const float *dout, const moe8_layer_grads *gr) {
  moe8_layer *L = ep->L;
  const int64_t E = moe8__router_width(L), K = L->cfg.top_k, D = L->cfg.hidden, Eloc = ep->Eloc, g0 = ep->g0; /* E: the router's here */
  a2a_state *s = ep->a2a;
  moe8_status st = moe8__ep_begin_backward(ep, x, Tl, dout, gr);
  if (st != MOE8_OK) return st;
  if (s->T == 0) return MOE8_OK;
  const int64_t NR = s->nrecv, rows = s->rows;
  /* dout rows and the tokens' weights out, by the dispatch plan */
  const size_t orow = sizeof(float) * (size_t)(K + D), brow = sizeof(float) * (size_t)(D + 1);
  bool ok = true;
  float *osend, *orecv, *wr, *dr, *dy, *dwrow, *dxs, *bsend, *brecv, *rx, *dw_l, *dl;
  ALLOC(osend, s->nsend * (K + D)); ALLOC(orecv, NR * (K + D)); ALLOC(wr, NR * K); ALLOC(dr, NR * D);
  ALLOC(dy, rows * D); ALLOC(dwrow, rows); ALLOC(dxs, rows * D); ALLOC(bsend, s->nback * (D + 1)); ALLOC(brecv, s->nbrecv * (D + 1));
  ALLOC(rx, s->nbrecv * D); ALLOC(dw_l, Tl * K); ALLOC(dl, Tl * E);
  /* Gemma-4's norms: dz the gradient before the output norm, the experts'
  ** and the router's input gradients apart (dxe, dxr), as the single process */
  float *dwp = NULL;
  moe8__ep_norm_grads ng;
  moe8_status sn = moe8__ep_norm_grads_open(ep, x, Tl, dout, gr, &ng);
  if (!ok) st = moe8__fail(MOE8_ERR_NOMEM, "ep backward: out of memory");
  else st = sn;
  float *dxe = ng.dxe, *dxr = ng.dxr;
  const float *xe = ng.xe, *xr = ng.xr, *dzz = ng.dz ? ng.dz : dout;
  for (int64_t n = 0; st == MOE8_OK && n < s->nsend; n++) { /* the forward's dispatch plan */
    const int64_t t = s->send_tok[n];
    float *o = osend + (size_t)n * (size_t)(K + D);
    memcpy(o, s->w + t * K, sizeof(float) * (size_t)K);
    memcpy(o + K, dzz + t * D, sizeof(float) * (size_t)D);
  }
  if ((st = moe8__ep_agree(ep, st)) != MOE8_OK) goto done;
  double t0 = moe8__ep_now();
  st = a2a_rows(ep, osend, s->scnt, orecv, s->rcnt, orow, &ep->st.bwd_sent_bytes, &ep->st.bwd_recv_bytes);
  ep->st.dout_s = moe8__ep_now() - t0;
  ep->st.dout_bytes = (uint64_t)NR * orow;
  if (st != MOE8_OK) goto done;
  for (int64_t i = 0; i < NR; i++) {
    memcpy(wr + i * K, orecv + i * (K + D), sizeof(float) * (size_t)K);
    memcpy(dr + i * D, orecv + i * (K + D) + K, sizeof(float) * (size_t)D);
  }
  /* this rank's experts (Llama-4: dy is dout, the combine's weights are 1) */
  moe8__dy_dw(rows, s->tok_of, s->slot_of, L->cfg.weight_input ? NULL : wr, K, dr, s->y, D, dy, dwrow);
  st = moe8__experts_backward(L, 0, rows, s->gsz, g0, Eloc, dy, s->xs, s->xsq, s->sxs, s->h, s->hq, s->sh, s->gu, dxs, gr->dwg, gr->dwu,
                              gr->dwd,
                              L->cfg.expert_bias ? gr->dwgub : NULL, L->cfg.expert_bias ? gr->dwdb : NULL);
  for (int64_t n = 0; st == MOE8_OK && n < s->nback; n++) { /* the forward's return plan */
    float *o = bsend + (size_t)n * (size_t)(D + 1);
    const int32_t p = s->pos[s->ret_asg[n]];
    if (p >= 0) { memcpy(o, dxs + (int64_t)p * D, sizeof(float) * (size_t)D); o[D] = dwrow[p]; }
    else memset(o, 0, brow);
  }
  if ((st = moe8__ep_agree(ep, st)) != MOE8_OK) goto done;
  t0 = moe8__ep_now();
  st = a2a_rows(ep, bsend, s->bcnt, brecv, s->brcnt, brow, &ep->st.bwd_sent_bytes, &ep->st.bwd_recv_bytes);
  ep->st.dx_s = moe8__ep_now() - t0;
  ep->st.dx_bytes = (uint64_t)s->nbrecv * brow;
  if (st == MOE8_OK) {
    for (int64_t i = 0; i < s->nbrecv; i++) memcpy(rx + i * D, brecv + i * (D + 1), sizeof(float) * (size_t)D);
    for (int64_t a = 0; a < Tl * K; a++) dw_l[a] = s->recvrow[a] >= 0 ? brecv[(int64_t)s->recvrow[a] * (D + 1) + D] : 0.0f;
    if (L->cfg.weight_input) {
      const float c = L->cfg.routed_scaling_factor != 0.0f ? L->cfg.routed_scaling_factor : 1.0f;
      moe8__input_weight_backward(Tl, K, D, E, s->recvrow, rx, xe, s->scores, s->ids, c, dxe, dw_l);
    } else if (dxe) st = moe8_combine(rx, s->nbrecv, s->recvrow, NULL, Tl, K, D, dxe);
    /* LongCat-Flash's identity slots, after the combine as in the single process (not with Gemma-4's norms: refused) */
    if (st == MOE8_OK && L->cfg.zero_experts) moe8__identity_backward(L, xe, Tl, s->ids, s->w, dout, dxe, dw_l);
    /* Gemma-4: the weight gradients through the per-expert scale first */
    if (st == MOE8_OK) st = moe8__ep_scale_dw(ep, Tl, s->ids, dw_l, &dwp);
    if (st == MOE8_OK) moe8__router_backward(L, Tl, s->scores, s->ids, dw_l, s->f, s->T, dl);
  }
  if ((st = moe8__ep_agree(ep, st)) != MOE8_OK) goto done;
  st = moe8__ep_router_tail(ep, xr, Tl, dl, dzz, dxr, gr);
  if ((st = moe8__ep_agree(ep, st)) == MOE8_OK) st = moe8__ep_shared_backward(ep, xe, Tl, dzz, NULL, dxe, gr);
  if ((st = moe8__ep_agree(ep, st)) == MOE8_OK) st = moe8__ep_norms_tail(ep, x, Tl, dout, s->ids, dwp, ng.dxe_b, ng.dxr_b, gr);
  st = moe8__ep_agree(ep, st);
done:
  free(osend); free(orecv); free(wr); free(dr); free(dy); free(dwrow); free(dxs); free(bsend); free(brecv); free(rx);
  free(dw_l); free(dl); free(dwp);
  moe8__ep_norm_grads_close(&ng);
  return st;
}
