/*
** ep_ring.c — expert parallelism: the ring of experts of docs/parallelism.md
**
** Forward on rank r of P (E_loc = E/P experts, the first g0 = r·E_loc):
**   1. agree that every rank's input is valid (else all fail alike);
**   2. all-gather the token counts: shard q holds global tokens
**      [Toff[q], Toff[q+1]), so global token order is rank order;
**   3. route the local tokens (logits, scores, top-k, weights);
**   4. all-gather the token rows: quantized per token first (q and scale
**      rows) when the rule quantizes activations and the layer says
**      quantize-before, else the f32 rows;
**   5. all-gather the routing: ids and weights [K], scores [E] per token;
**   6. sort all T·K assignments (the same stable sort on every rank) and
**      take the rows of experts g0 .. g0+E_loc-1, a contiguous range;
**   7. run those experts (the single-process layer's own phase function);
**   8. all-to-all each output row to its token's owner, which combines the
**      slots in order j = 0, 1, ... exactly as the single-process layer.
** Backward mirrors it: all-gather dout; each rank differentiates its own
** experts' rows; all-to-all the input-gradient rows and the routing-weight
** gradients back to the owners; the owners run the router backward; the
** router weight gradient is a relay over the ranks in order (each element
** one chain over the tokens in global order), then a broadcast.
**
** Why the bytes equal the single-process layer's: every row of every
** matmul is computed by the same kernel in the same order (the gmm is
** batch-invariant), every per-token sum runs in slot order, and the sums
** over tokens (aux loss, dWr) run in global token order.
*/
#include "ep_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The ring's saved forward. */
struct ring_state {
  int64_t  rows, P0, nrecv;     /* this rank's expert rows, the first one's sorted index, rows coming back */
  float   *scores_g, *w_g;      /* every token's scores [T, E] and routing weights [T, K] */
  int32_t *ids_g, *token_of, *slot_of, *pos_of, *gsz;
  int64_t *offs;
  float   *xs, *sxs, *gu, *h, *sh, *y;
  uint8_t *xsq, *hq;
  int32_t *dest, *recvrow;
  size_t  *sendcnt, *recvcnt;   /* rows per peer */
  double   f[MOE8_MAX_EXPERTS];
};

void moe8__ring_free(moe8_ep *ep) {
  ring_state *s = ep->ring;
  if (!s) return;
  void *p[] = {s->scores_g, s->w_g, s->ids_g, s->token_of, s->slot_of, s->pos_of, s->gsz, s->offs, s->xs, s->sxs, s->gu, s->h, s->sh,
               s->y, s->xsq, s->hq, s->dest, s->recvrow, s->sendcnt, s->recvcnt};
  for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) free(p[i]);
  free(s);
  ep->ring = NULL;
  ep->have_forward = false;
}

static int owner_of(const moe8_ep *ep, int64_t t) {
  int lo = 0, hi = ep->P - 1; /* Toff[lo] <= t < Toff[hi + 1] */
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (ep->Toff[mid] <= t) lo = mid; else hi = mid - 1;
  }
  return lo;
}

/* Sends each local row (width floats) to its token's owner, rows in local
** order per peer; returns the received rows, [nrecv, width]. */
static moe8_status exchange(moe8_ep *ep, const float *rows, int64_t width, float **recv_out, uint64_t *bytes, uint64_t *sent_other,
                            uint64_t *recv_other) {
  const ring_state *s = ep->ring;
  const int P = ep->P;
  const size_t rb = sizeof(float) * (size_t)width;
  float *send = malloc(rb * (size_t)s->rows + 4), *recv = malloc(rb * (size_t)s->nrecv + 4);
  size_t *sb = malloc(sizeof(size_t) * 3 * (size_t)P);
  if (!send || !recv || !sb) { free(send); free(recv); free(sb); return moe8__fail(MOE8_ERR_NOMEM, "ep: out of memory"); }
  size_t *rbytes = sb + P, *cur = sb + 2 * P;
  size_t off = 0;
  for (int q = 0; q < P; q++) { sb[q] = s->sendcnt[q] * rb; rbytes[q] = s->recvcnt[q] * rb; cur[q] = off; off += s->sendcnt[q]; }
  for (int64_t i = 0; i < s->rows; i++) memcpy(send + (cur[s->dest[i]]++) * (size_t)width, rows + i * width, rb);
  for (int q = 0; q < P; q++)
    if (q != ep->r) { *sent_other += sb[q]; *recv_other += rbytes[q]; }
  *bytes = (uint64_t)(rb * (size_t)s->nrecv);
  moe8_status st = ep->c->alltoallv(ep->c, send, sb, recv, rbytes);
  free(send);
  free(sb);
  if (st != MOE8_OK) { free(recv); return st; }
  *recv_out = recv;
  return MOE8_OK;
}

static moe8_status shared_local(moe8_ep *ep, const float *x, int64_t Tl, float *out) {
  return moe8__ep_shared_run(ep, x, Tl, out, NULL, NULL, NULL);
}


/* ---- forward -------------------------------------------------------------------- */
moe8_status moe8__ring_forward(moe8_ep *ep, const float *x, int64_t Tl, const int32_t *token_ids, float *out, float *aux) {
  moe8_layer *L = ep->L;
  /* E: the routed experts (the sort's groups); ER: the router's, with
  ** LongCat-Flash's identity experts (logits, scores) */
  const int64_t E = L->cfg.num_experts, ER = moe8__router_width(L), K = L->cfg.top_k, D = L->cfg.hidden, F = L->cfg.ffn;
  const int P = ep->P;
  /* 1, 2. the input checked on every rank, the token counts */
  moe8_status st = moe8__ep_begin_forward(ep, x, Tl, token_ids, out);
  if (st != MOE8_OK) return st;
  moe8__ring_free(ep);
  ring_state *s = ep->ring = calloc(1, sizeof *s);
  if ((st = moe8__ep_agree(ep, s ? MOE8_OK : moe8__fail(MOE8_ERR_NOMEM, "ep: out of memory"))) != MOE8_OK) return st;
  const int64_t T = ep->T, A = T * K, T0 = ep->Toff[ep->r];
  if (aux) *aux = 0.0f;
  if (T == 0) { ep->have_forward = true; return MOE8_OK; }
  const int64_t nbD = L->aq ? moe8__cdiv(D, L->aspec.tile ? L->aspec.tile : D) : 1;
  const size_t qrow = (size_t)D + sizeof(float) * (size_t)nbD; /* a quantized token row on the wire */
  bool ok = true;
  float *logits, *route_l, *route_g, *xg;
  uint8_t *xq_l = NULL;
  ALLOC(logits, Tl * ER); ALLOC(route_l, Tl * (2 * K + ER)); ALLOC(route_g, T * (2 * K + ER));
  ALLOC(s->scores_g, T * ER); ALLOC(s->w_g, A); ALLOC(s->ids_g, A);
  ALLOC(s->token_of, A); ALLOC(s->slot_of, A); ALLOC(s->pos_of, A); ALLOC(s->gsz, E); ALLOC(s->offs, E + 1);
  /* Llama-4's rows are scaled before they are quantized: f32 on the wire */
  const bool before = L->aq && L->before_sort && !L->cfg.weight_input, wi = L->cfg.weight_input;
  ALLOC(xg, before ? (T * (int64_t)qrow + 3) / 4 : T * D);
  if (before) ALLOC(xq_l, Tl * (int64_t)qrow);
  if (!ok) { free(logits); free(route_l); free(route_g); free(xg); free(xq_l); return moe8__fail(MOE8_ERR_NOMEM, "ep: out of memory"); }
  /* Gemma-4: the router reads n(x) ⊙ s · c, the experts n(x) ⊙ w_in (x without the norms) */
  const float *xr = x, *xe = x;
  st = moe8__ep_norms_in(ep, x, Tl, &xr, &xe);
  /* 3. local routing, packed per token as ids[K] | weights[K] | scores[ER] */
  const moe8_router_config rc = moe8__router_config(L, token_ids);
  float *sc_l = malloc(sizeof(float) * (size_t)(Tl * ER + 1)), *w_l = malloc(sizeof(float) * (size_t)(Tl * K + 1));
  int32_t *id_l = malloc(sizeof(int32_t) * (size_t)(Tl * K + 1));
  if (!sc_l || !w_l || !id_l) st = moe8__fail(MOE8_ERR_NOMEM, "ep: out of memory");
  if (st == MOE8_OK) st = moe8__router_logits(L, xr, Tl, logits);
  if (st == MOE8_OK) st = moe8_route(&rc, logits, Tl, sc_l, id_l, w_l);
  if (st == MOE8_OK) st = moe8__ep_scale_weights(ep, Tl, id_l, w_l);
  if (st == MOE8_OK)
    for (int64_t t = 0; t < Tl; t++) {
      float *row = route_l + t * (2 * K + ER);
      memcpy(row, id_l + t * K, sizeof(float) * (size_t)K);
      memcpy(row + K, w_l + t * K, sizeof(float) * (size_t)K);
      memcpy(row + 2 * K, sc_l + t * ER, sizeof(float) * (size_t)ER);
    }
  /* 4. local token rows, quantized first when asked */
  if (st == MOE8_OK && before) {
    uint8_t *q = malloc((size_t)(Tl * D) + 1);
    float *qs = malloc(sizeof(float) * (size_t)(Tl * nbD) + 4);
    if (!q || !qs) st = moe8__fail(MOE8_ERR_NOMEM, "ep: out of memory");
    else st = moe8_quantize(&L->aspec, xe, 1, Tl, D, q, qs, NULL);
    for (int64_t t = 0; st == MOE8_OK && t < Tl; t++) {
      memcpy(xq_l + (size_t)t * qrow, q + t * D, (size_t)D);
      memcpy(xq_l + (size_t)t * qrow + D, qs + t * nbD, sizeof(float) * (size_t)nbD);
    }
    free(q); free(qs);
  }
  free(sc_l); free(w_l); free(id_l); free(logits);
  if ((st = moe8__ep_agree(ep, st)) != MOE8_OK) { free(route_l); free(route_g); free(xg); free(xq_l); return st; }
  double t0 = moe8__ep_now();
  st = before ? moe8__ep_allgather_rows(ep, xq_l, qrow, xg) : moe8__ep_allgather_rows(ep, xe, sizeof(float) * (size_t)D, xg);
  ep->st.tokens_s = moe8__ep_now() - t0;
  ep->st.tokens_bytes = (uint64_t)T * (before ? qrow : sizeof(float) * (size_t)D);
  free(xq_l);
  t0 = moe8__ep_now();
  if (st == MOE8_OK) st = moe8__ep_allgather_rows(ep, route_l, sizeof(float) * (size_t)(2 * K + ER), route_g);
  ep->st.routing_s = moe8__ep_now() - t0;
  ep->st.routing_bytes = (uint64_t)T * sizeof(float) * (uint64_t)(2 * K + ER);
  {
    const uint64_t row = (before ? qrow : sizeof(float) * (size_t)D) + sizeof(float) * (size_t)(2 * K + ER);
    ep->st.fwd_sent_bytes += (uint64_t)Tl * row * (uint64_t)(P - 1);
    ep->st.fwd_recv_bytes += (uint64_t)(T - Tl) * row;
  }
  free(route_l);
  if (st != MOE8_OK) { free(route_g); free(xg); return st; }
  for (int64_t t = 0; t < T; t++) {
    const float *row = route_g + t * (2 * K + ER);
    memcpy(s->ids_g + t * K, row, sizeof(float) * (size_t)K);
    memcpy(s->w_g + t * K, row + K, sizeof(float) * (size_t)K);
    memcpy(s->scores_g + t * ER, row + 2 * K, sizeof(float) * (size_t)ER);
  }
  free(route_g);
  /* 6. the global sort; this rank's rows */
  moe8_dispatch d = {s->token_of, s->slot_of, s->gsz, s->offs, s->pos_of, 0};
  st = moe8__dispatch_sort(s->ids_g, T, K, E, L->cfg.zero_experts, L->cfg.capacity_factor, false, &d); /* identity slots: no rows */
  if (st != MOE8_OK) { free(xg); return st; }
  s->P0 = s->offs[ep->g0];
  const int64_t rows = s->rows = s->offs[ep->g0 + ep->Eloc] - s->P0;
  ALLOC(s->xs, rows * D); ALLOC(s->gu, rows * 2 * F); ALLOC(s->h, rows * F); ALLOC(s->y, rows * D);
  if (L->aq) { ALLOC(s->xsq, rows * D); ALLOC(s->sxs, rows * nbD); ALLOC(s->hq, rows * F); ALLOC(s->sh, rows * moe8__cdiv(F, L->aspec.tile ? L->aspec.tile : F)); }
  ALLOC(s->dest, rows); ALLOC(s->recvrow, Tl * K); ALLOC(s->sendcnt, P); ALLOC(s->recvcnt, P);
  if (!ok) { free(xg); return moe8__fail(MOE8_ERR_NOMEM, "ep: out of memory"); }
  const int32_t *tok = s->token_of + s->P0;
  if (before) {
    const uint8_t *xb = (const uint8_t *)xg;
    for (int64_t i = 0; i < rows; i++) {
      memcpy(s->xsq + i * D, xb + (size_t)tok[i] * qrow, (size_t)D);
      memcpy(s->sxs + i * nbD, xb + (size_t)tok[i] * qrow + D, sizeof(float) * (size_t)nbD);
    }
  } else {
    st = moe8_gather_rows(s->xs, xg, sizeof(float) * (size_t)D, tok, rows, T);
    if (st == MOE8_OK && wi) moe8__scale_rows(s->xs, rows, D, tok, s->slot_of + s->P0, s->w_g, K);
    if (st == MOE8_OK && L->aq) st = moe8_quantize(&L->aspec, s->xs, 1, rows, D, s->xsq, s->sxs, NULL);
  }
  free(xg);
  /* 7. this rank's experts */
  if (st == MOE8_OK)
    st = moe8__experts_forward(L, moe8__layer_order_now(L), 0, rows, s->gsz + ep->g0, ep->g0, ep->Eloc, s->xs, s->xsq, s->sxs, s->gu,
                               s->h, s->hq, s->sh, s->y, NULL, 0);
  /* 8. routes of the exchange: where each local row goes, where each of my
  ** slots' rows arrives (rows from one peer come in increasing row order) */
  if (st == MOE8_OK) {
    for (int q = 0; q < P; q++) s->sendcnt[q] = s->recvcnt[q] = 0;
    for (int64_t i = 0; i < rows; i++) s->sendcnt[s->dest[i] = owner_of(ep, tok[i])]++;
    const int64_t nrows = s->offs[E];
    for (int64_t p = 0; p < nrows; p++) {
      const int64_t t = s->token_of[p];
      if (owner_of(ep, t) == ep->r) s->recvcnt[s->ids_g[t * K + s->slot_of[p]] / ep->Eloc]++; /* the expert's rank */
    }
    int64_t *base = malloc(sizeof(int64_t) * (size_t)P), *cnt = malloc(sizeof(int64_t) * (size_t)P);
    if (!base || !cnt) st = moe8__fail(MOE8_ERR_NOMEM, "ep: out of memory");
    else {
      int64_t b = 0;
      for (int q = 0; q < P; q++) { base[q] = b; b += (int64_t)s->recvcnt[q]; cnt[q] = 0; }
      s->nrecv = b;
      for (int64_t a = 0; a < Tl * K; a++) s->recvrow[a] = -1;
      for (int64_t p = 0; p < nrows; p++) {
        const int64_t t = s->token_of[p];
        if (owner_of(ep, t) != ep->r) continue;
        const int src = (int)(s->ids_g[t * K + s->slot_of[p]] / ep->Eloc);
        s->recvrow[(t - T0) * K + s->slot_of[p]] = (int32_t)(base[src] + cnt[src]++);
      }
    }
    free(base);
    free(cnt);
  }
  if ((st = moe8__ep_agree(ep, st)) != MOE8_OK) return st;
  float *recv = NULL;
  t0 = moe8__ep_now();
  st = exchange(ep, s->y, D, &recv, &ep->st.combine_bytes, &ep->st.fwd_sent_bytes, &ep->st.fwd_recv_bytes);
  ep->st.combine_s = moe8__ep_now() - t0;
  /* LongCat-Flash's identity slots on the owner, as the single process
  ** sums them (before the combine writes out) */
  float *idn = L->cfg.zero_experts && st == MOE8_OK ? malloc(sizeof(float) * (size_t)(Tl * D) + 4) : NULL;
  if (L->cfg.zero_experts && st == MOE8_OK && !idn) st = moe8__fail(MOE8_ERR_NOMEM, "ep: out of memory");
  if (idn) moe8__identity_rows(L, x, Tl, s->ids_g + T0 * K, s->w_g + T0 * K, idn);
  /* Llama-4: the outputs summed unweighted */
  if (st == MOE8_OK) st = moe8_combine(recv, s->nrecv, s->recvrow, wi ? NULL : s->w_g + T0 * K, Tl, K, D, out);
  if (st == MOE8_OK && idn)
    for (int64_t i = 0; i < Tl * D; i++) out[i] = out[i] + idn[i];
  free(idn);
  free(recv);
  /* The shared expert: the owner's tokens, on the owner (rows are
  ** independent, so the bytes are the single-process layer's). */
  if (st == MOE8_OK && L->cfg.shared_ffn > 0 && Tl > 0) st = shared_local(ep, xe, Tl, out);
  if (st == MOE8_OK) moe8__out_bias_add(L, Tl, out); /* JetMoE: after the shared expert, as the single process */
  if (st == MOE8_OK) st = moe8__ep_norm_out(ep, Tl, out); /* Gemma-4: the output's norm, last */
  if (st == MOE8_OK) st = moe8__check_output(L, out, Tl);
  if (st == MOE8_OK) {
    const float a = moe8__aux_loss(L, T, s->ids_g, s->scores_g, s->f);
    if (aux && L->cfg.aux_loss_weight != 0.0f) *aux = a;
    ep->have_forward = true;
  }
  return moe8__ep_agree(ep, st);
}

/* ---- backward ------------------------------------------------------------------- */
moe8_status moe8__ring_backward(moe8_ep *ep, const float *x, int64_t Tl, const float *dout, const moe8_layer_grads *gr) {
  moe8_layer *L = ep->L;
  const int64_t E = moe8__router_width(L), K = L->cfg.top_k, D = L->cfg.hidden; /* E: the router's experts here */
  moe8_status st = moe8__ep_begin_backward(ep, x, Tl, dout, gr);
  if (st != MOE8_OK) return st;
  const ring_state *s = ep->ring;
  const int64_t T = ep->T, T0 = ep->Toff[ep->r], rows = s->rows;
  if (T == 0) return MOE8_OK;
  const bool wi = L->cfg.weight_input;
  bool ok = true;
  float *Dg, *dy, *dwrow, *dxs, *packed, *dw_l, *dl;
  /* Gemma-4's norms: dz the gradient before the output norm, the experts'
  ** and the router's input gradients apart (dxe, dxr), as the single process */
  float *dwp = NULL;
  moe8__ep_norm_grads ng;
  const moe8_status sn = moe8__ep_norm_grads_open(ep, x, Tl, dout, gr, &ng);
  float *dxe = ng.dxe, *dxr = ng.dxr;
  const float *xe = ng.xe, *xr = ng.xr, *dzz = ng.dz ? ng.dz : dout;
  ALLOC(Dg, T * D); ALLOC(dy, rows * D); ALLOC(dwrow, rows); ALLOC(dxs, rows * D); ALLOC(packed, rows * (D + 1));
  ALLOC(dw_l, Tl * K); ALLOC(dl, Tl * E);
  st = !ok ? moe8__fail(MOE8_ERR_NOMEM, "ep backward: out of memory") : sn;
  if ((st = moe8__ep_agree(ep, st)) != MOE8_OK) goto done;
  double t0 = moe8__ep_now();
  st = moe8__ep_allgather_rows(ep, dzz, sizeof(float) * (size_t)D, Dg);
  ep->st.dout_s = moe8__ep_now() - t0;
  ep->st.dout_bytes = (uint64_t)(T * D) * sizeof(float);
  ep->st.bwd_sent_bytes = (uint64_t)(Tl * D) * sizeof(float) * (uint64_t)(ep->P - 1);
  ep->st.bwd_recv_bytes = (uint64_t)((T - Tl) * D) * sizeof(float);
  if (st != MOE8_OK) goto done;
  /* this rank's experts (Llama-4: dy is dout, the combine's weights are 1) */
  moe8__dy_dw(rows, s->token_of + s->P0, s->slot_of + s->P0, wi ? NULL : s->w_g, K, Dg, s->y, D, dy, dwrow);
  st = moe8__experts_backward(L, 0, rows, s->gsz + ep->g0, ep->g0, ep->Eloc, dy, s->xs, s->xsq, s->sxs, s->h, s->hq, s->sh,
                              s->gu, dxs, gr->dwg, gr->dwu, gr->dwd,
                              L->cfg.expert_bias ? gr->dwgub : NULL, L->cfg.expert_bias ? gr->dwdb : NULL);
  for (int64_t i = 0; st == MOE8_OK && i < rows; i++) {
    memcpy(packed + i * (D + 1), dxs + i * D, sizeof(float) * (size_t)D);
    packed[i * (D + 1) + D] = dwrow[i];
  }
  if ((st = moe8__ep_agree(ep, st)) != MOE8_OK) goto done;
  /* rows back to the owners */
  float *recv = NULL;
  t0 = moe8__ep_now();
  st = exchange(ep, packed, D + 1, &recv, &ep->st.dx_bytes, &ep->st.bwd_sent_bytes, &ep->st.bwd_recv_bytes);
  ep->st.dx_s = moe8__ep_now() - t0;
  if (st != MOE8_OK) goto done;
  float *rx = malloc(sizeof(float) * (size_t)(s->nrecv * D) + 4);
  if (!rx) { free(recv); st = moe8__fail(MOE8_ERR_NOMEM, "ep backward: out of memory"); goto agreed; }
  for (int64_t i = 0; i < s->nrecv; i++) memcpy(rx + i * D, recv + i * (D + 1), sizeof(float) * (size_t)D);
  for (int64_t a = 0; a < Tl * K; a++) dw_l[a] = s->recvrow[a] >= 0 ? recv[(int64_t)s->recvrow[a] * (D + 1) + D] : 0.0f;
  free(recv);
  if (wi) {
    const float c = L->cfg.routed_scaling_factor != 0.0f ? L->cfg.routed_scaling_factor : 1.0f;
    moe8__input_weight_backward(Tl, K, D, E, s->recvrow, rx, xe, s->scores_g + T0 * E, s->ids_g + T0 * K, c, dxe, dw_l);
  } else if (dxe) st = moe8_combine(rx, s->nrecv, s->recvrow, NULL, Tl, K, D, dxe);
  free(rx);
  /* LongCat-Flash's identity slots, after the combine as in the single process (not with Gemma-4's norms: refused) */
  if (st == MOE8_OK && L->cfg.zero_experts) moe8__identity_backward(L, xe, Tl, s->ids_g + T0 * K, s->w_g + T0 * K, dout, dxe, dw_l);
  /* router (Gemma-4: the weight gradients through the per-expert scale first) */
  if (st == MOE8_OK) st = moe8__ep_scale_dw(ep, Tl, s->ids_g + T0 * K, dw_l, &dwp);
  if (st == MOE8_OK) moe8__router_backward(L, Tl, s->scores_g + T0 * E, s->ids_g + T0 * K, dw_l, s->f, T, dl);
agreed:
  if ((st = moe8__ep_agree(ep, st)) != MOE8_OK) goto done;
  st = moe8__ep_router_tail(ep, xr, Tl, dl, dzz, dxr, gr);
  if ((st = moe8__ep_agree(ep, st)) == MOE8_OK) st = moe8__ep_shared_backward(ep, xe, Tl, dzz, Dg, dxe, gr);
  if ((st = moe8__ep_agree(ep, st)) == MOE8_OK) st = moe8__ep_norms_tail(ep, x, Tl, dout, s->ids_g + T0 * K, dwp, ng.dxe_b, ng.dxr_b, gr);
  st = moe8__ep_agree(ep, st);
done:
  free(Dg); free(dy); free(dwrow); free(dxs); free(packed); free(dw_l); free(dl);
  free(dwp);
  moe8__ep_norm_grads_close(&ng);
  return st;
}
