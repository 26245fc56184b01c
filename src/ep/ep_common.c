/*
** ep_common.c — what the two expert-parallel modes share (docs/parallelism.md):
** the status vote, the clock, the token counts and row all-gathers, the
** checks that open a forward and a backward, the router's tail of the
** backward (the dWr relay in rank order and the router's part of dx) and
** the shared expert.  The modes (ep_ring.c, the ring of experts; ep_a2a.c,
** the all-to-all dispatch) call this file; it calls neither mode, and the
** object that picks a mode is ep.c, above them all.
*/
#include "ep_internal.h"
#include "../kernels/gmm.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double moe8__ep_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Every rank learns every rank's status; the first failure is returned on
** all of them, with its rank and message. */
moe8_status moe8__ep_agree(moe8_ep *ep, moe8_status st) {
  typedef struct { int32_t st; char msg[400]; } vote;
  vote mine = {(int32_t)st, ""};
  if (st != MOE8_OK) snprintf(mine.msg, sizeof mine.msg, "%s", moe8_last_error());
  vote *all = malloc(sizeof(vote) * (size_t)ep->P);
  size_t *rb = malloc(sizeof(size_t) * (size_t)ep->P);
  if (!all || !rb) { free(all); free(rb); return moe8__fail(MOE8_ERR_NOMEM, "ep: out of memory"); }
  for (int i = 0; i < ep->P; i++) rb[i] = sizeof(vote);
  moe8_status cs = ep->c->allgatherv(ep->c, &mine, sizeof mine, all, rb);
  moe8_status out = cs;
  for (int i = 0; i < ep->P && cs == MOE8_OK; i++)
    if (all[i].st != MOE8_OK) {
      out = moe8__fail((moe8_status)all[i].st, "rank %d: %s", i, all[i].msg);
      break;
    }
  free(all);
  free(rb);
  return out;
}

/* ---- helpers ----------------------------------------------------------------- */
moe8_status moe8__ep_allgather_rows(moe8_ep *ep, const void *send, size_t row_bytes, void *recv) {
  size_t *rb = malloc(sizeof(size_t) * (size_t)ep->P);
  if (!rb) return moe8__fail(MOE8_ERR_NOMEM, "ep: out of memory");
  for (int q = 0; q < ep->P; q++) rb[q] = (size_t)(ep->Toff[q + 1] - ep->Toff[q]) * row_bytes;
  moe8_status st = ep->c->allgatherv(ep->c, send, (size_t)ep->Tl * row_bytes, recv, rb);
  free(rb);
  return st;
}

/* The shared expert on T tokens of x: forward, then (dout non-NULL) its
** backward adding to dx[T, D] and the grads; else out += its output. */
moe8_status moe8__ep_shared_run(moe8_ep *ep, const float *x, int64_t T, float *out, const float *dout, float *dx,
                              const moe8_layer_grads *gr) {
  moe8_layer *L = ep->L;
  const int64_t D = L->cfg.hidden, nbD = L->aq ? moe8__cdiv(D, L->aspec.tile ? L->aspec.tile : D) : 0;
  const size_t bsz = moe8__shared_buf_size(L, T), ssz = moe8__gmm_ws_size(T, D > L->cfg.shared_ffn ? D : L->cfg.shared_ffn);
  void *buf = NULL, *scratch = NULL;
  uint8_t *xq = L->aq ? malloc((size_t)(T * D) + 1) : NULL;
  float *sx = L->aq ? malloc(sizeof(float) * (size_t)(T * nbD) + 4) : NULL;
  moe8_status st = MOE8_OK;
  if (posix_memalign(&buf, 64, bsz + 64) != 0) buf = NULL;
  if (posix_memalign(&scratch, 64, ssz + 64) != 0) scratch = NULL;
  if (!buf || !scratch || (L->aq && (!xq || !sx))) st = moe8__fail(MOE8_ERR_NOMEM, "ep: out of memory for the shared expert");
  moe8__shared_buf b;
  if (st == MOE8_OK) {
    moe8__shared_buf_carve(L, T, buf, &b);
    if (L->aq) st = moe8_quantize(&L->aspec, x, 1, T, D, xq, sx, NULL);
  }
  if (st == MOE8_OK) st = moe8__shared_forward(L, moe8__layer_order_now(L), x, xq, sx, T, &b, scratch, ssz);
  if (st == MOE8_OK && !dout) moe8__shared_add(L, T, &b, out);
  if (st == MOE8_OK && dout) st = moe8__shared_backward(L, x, xq, sx, T, dout, &b, dx, gr);
  free(buf); free(scratch); free(xq); free(sx);
  return st;
}

/* ---- what both modes' forwards share --------------------------------------------------- */
static moe8_status token_counts(moe8_ep *ep, int64_t Tl);

moe8_status moe8__ep_begin_forward(moe8_ep *ep, const float *x, int64_t Tl, const int32_t *tok, const float *out) {
  moe8_layer *L = ep->L;
  const int64_t D = L->cfg.hidden;
  ep->have_forward = false; /* a new forward replaces the last one, also when it fails */
  moe8_status st = MOE8_OK;
  if (Tl < 0) st = moe8__fail(MOE8_ERR_SHAPE, "ep forward: T_local = %lld", (long long)Tl);
  else if (Tl > 0 && (!x || !out)) st = moe8__fail(MOE8_ERR_INVALID_ARG, "ep forward: NULL x or out");
  else {
    size_t bad = 0;
    for (int64_t i = 0; i < Tl * D; i++) bad += !isfinite(x[i]);
    if (bad) st = moe8__fail(MOE8_ERR_NONFINITE, "ep forward: input x [%lld, %lld] has %zu non-finite value(s)", (long long)Tl, (long long)D, bad);
  }
  if (st == MOE8_OK) st = moe8__check_tokens(L, tok, Tl, "ep forward");
  if (st == MOE8_OK) st = moe8__layer_quantize_weights(L);
  if ((st = moe8__ep_agree(ep, st)) != MOE8_OK) return st;
  memset(&ep->st, 0, sizeof ep->st);
  return token_counts(ep, Tl);
}

static moe8_status token_counts(moe8_ep *ep, int64_t Tl) {
  const int P = ep->P;
  free(ep->Toff);
  ep->Toff = malloc(sizeof(int64_t) * (size_t)(P + 1));
  int64_t *Tsz = malloc(sizeof(int64_t) * (size_t)P);
  size_t *rb = malloc(sizeof(size_t) * (size_t)P);
  if (!ep->Toff || !Tsz || !rb) { free(Tsz); free(rb); return moe8__ep_agree(ep, moe8__fail(MOE8_ERR_NOMEM, "ep: out of memory")); }
  for (int q = 0; q < P; q++) rb[q] = sizeof(int64_t);
  moe8_status st = ep->c->allgatherv(ep->c, &Tl, sizeof Tl, Tsz, rb);
  free(rb);
  if (st == MOE8_OK) {
    ep->Toff[0] = 0;
    for (int q = 0; q < P; q++) ep->Toff[q + 1] = ep->Toff[q] + Tsz[q];
    ep->T = ep->Toff[P];
    ep->Tl = Tl;
  }
  free(Tsz);
  return st;
}

/* ---- what both modes' backwards share ------------------------------------------------ */

moe8_status moe8__ep_begin_backward(moe8_ep *ep, const float *x, int64_t Tl, const float *dout, const moe8_layer_grads *gr) {
  moe8_layer *L = ep->L;
  const int64_t D = L->cfg.hidden;
  moe8_status st = MOE8_OK;
  if (!ep->have_forward) st = moe8__fail(MOE8_ERR_INVALID_ARG, "ep backward: no forward to differentiate");
  else if (L->inference) st = moe8__fail(MOE8_ERR_UNSUPPORTED, "ep backward: the layer was loaded for inference (no f32 masters)");
  else if (Tl != ep->Tl) st = moe8__fail(MOE8_ERR_SHAPE, "ep backward: T_local = %lld, the forward had %lld", (long long)Tl, (long long)ep->Tl);
  else if (Tl > 0 && (!x || !dout)) st = moe8__fail(MOE8_ERR_INVALID_ARG, "ep backward: NULL x or dout");
  else {
    size_t bad = 0;
    for (int64_t i = 0; i < Tl * D; i++) bad += !isfinite(dout[i]);
    if (bad) st = moe8__fail(MOE8_ERR_NONFINITE, "ep backward: dout [%lld, %lld] has %zu non-finite value(s)", (long long)Tl, (long long)D, bad);
  }
  if ((st = moe8__ep_agree(ep, st)) != MOE8_OK) return st;
  moe8__zero_grads(L, Tl, gr);
  ep->st.bwd_sent_bytes = ep->st.bwd_recv_bytes = 0;
  return MOE8_OK;
}

moe8_status moe8__ep_router_tail(moe8_ep *ep, const float *x, int64_t Tl, const float *dl, const float *dout, float *dx,
                                 const moe8_layer_grads *gr) {
  moe8_layer *L = ep->L;
  const int64_t D = L->cfg.hidden, E = moe8__router_width(L); /* with LongCat-Flash's identity experts */
  /* dWr [D, E], the router bias's [E] after it when the layer has one, and
  ** JetMoE's output bias's [D] last (the same relay: one chain per element
  ** over the global token order, as the single process sums it) */
  const int64_t nb = L->cfg.router_bias ? E : 0, no = L->cfg.out_bias ? D : 0, na = D * E + nb + no;
  float *acc = calloc((size_t)na + 1, sizeof(float));
  moe8_status st = acc ? MOE8_OK : moe8__fail(MOE8_ERR_NOMEM, "ep backward: out of memory");
  if ((st = moe8__ep_agree(ep, st)) != MOE8_OK) { free(acc); return st; }
  /* dWr: a relay in rank order (one chain per element over the global
  ** token order), then a broadcast from the last rank. */
  const double t0 = moe8__ep_now();
  if (ep->r > 0) st = ep->c->recv(ep->c, ep->r - 1, acc, sizeof(float) * (size_t)na);
  if (st == MOE8_OK) moe8__router_wgrad(acc, x, dl, Tl, D, E);
  for (int64_t t = 0; st == MOE8_OK && nb && t < Tl; t++)
    for (int64_t e = 0; e < E; e++) acc[D * E + e] += dl[t * E + e];
  if (st == MOE8_OK && no) moe8__out_bias_grad(L, dout, Tl, acc + D * E + nb);
  if (st == MOE8_OK && ep->r < ep->P - 1) st = ep->c->send(ep->c, ep->r + 1, acc, sizeof(float) * (size_t)na);
  if (st == MOE8_OK) st = ep->c->bcast(ep->c, ep->P - 1, acc, sizeof(float) * (size_t)na);
  ep->st.router_s = moe8__ep_now() - t0;
  ep->st.router_bytes = (uint64_t)na * sizeof(float) * (ep->P > 1 ? 2u : 0u);
  if (st == MOE8_OK && gr->dwr) memcpy(gr->dwr, acc, sizeof(float) * (size_t)(D * E));
  if (st == MOE8_OK && nb && gr->dwrb) memcpy(gr->dwrb, acc + D * E, sizeof(float) * (size_t)E);
  if (st == MOE8_OK && no && gr->dwob) memcpy(gr->dwob, acc + D * E + nb, sizeof(float) * (size_t)D);
  if (st == MOE8_OK && dx) st = moe8__router_dx(L, dl, Tl, dx);
  free(acc);
  return st;
}

moe8_status moe8__ep_shared_backward(moe8_ep *ep, const float *x, int64_t Tl, const float *dout, const float *Dg, float *dx,
                                     const moe8_layer_grads *gr) {
  moe8_layer *L = ep->L;
  if (L->cfg.shared_ffn <= 0) return MOE8_OK;
  const int64_t D = L->cfg.hidden, T = ep->T, T0 = ep->Toff[ep->r];
  const int P = ep->P;
  float *Xg = malloc(sizeof(float) * (size_t)(T * D) + 4), *Dx = dx ? calloc((size_t)(T * D) + 1, sizeof(float)) : NULL;
  float *Dgo = Dg ? NULL : malloc(sizeof(float) * (size_t)(T * D) + 4);
  moe8_status st = Xg && (!dx || Dx) && (Dg || Dgo) ? MOE8_OK : moe8__fail(MOE8_ERR_NOMEM, "ep backward: out of memory");
  const double t0 = moe8__ep_now();
  if (st == MOE8_OK) st = moe8__ep_allgather_rows(ep, x, sizeof(float) * (size_t)D, Xg);
  if (st == MOE8_OK && !Dg) st = moe8__ep_allgather_rows(ep, dout, sizeof(float) * (size_t)D, Dgo);
  const uint64_t rows = Dg ? 1 : 2; /* x rows, and dout rows when not gathered already */
  ep->st.shared_s = moe8__ep_now() - t0;
  ep->st.shared_bytes = rows * (uint64_t)(T * D) * sizeof(float);
  ep->st.bwd_sent_bytes += rows * (uint64_t)(Tl * D) * sizeof(float) * (uint64_t)(P - 1);
  ep->st.bwd_recv_bytes += rows * (uint64_t)((T - Tl) * D) * sizeof(float);
  if (st == MOE8_OK && Dx) memcpy(Dx + T0 * D, dx, sizeof(float) * (size_t)(Tl * D));
  if (st == MOE8_OK) st = moe8__ep_shared_run(ep, Xg, T, NULL, Dg ? Dg : Dgo, Dx, gr);
  if (st == MOE8_OK && Dx) memcpy(dx, Dx + T0 * D, sizeof(float) * (size_t)(Tl * D));
  free(Xg); free(Dx); free(Dgo);
  return st;
}

/* ---- Gemma-4's norms ------------------------------------------------------------------ */
static float router_norm_scale(const moe8_layer *L) {
  return L->cfg.router_norm_scale != 0.0f ? L->cfg.router_norm_scale : 1.0f;
}

void moe8__ep_norms_free(moe8_ep *ep) {
  free(ep->nxr); free(ep->nxe); free(ep->nyb); free(ep->nwn);
  ep->nxr = ep->nxe = ep->nyb = ep->nwn = NULL;
}

moe8_status moe8__ep_norms_in(moe8_ep *ep, const float *x, int64_t Tl, const float **xr, const float **xe) {
  const moe8_layer *L = ep->L;
  const moe8_layer_config *c = &L->cfg;
  const int64_t D = c->hidden;
  moe8__ep_norms_free(ep);
  *xr = *xe = x;
  if (c->router_norm && !(ep->nxr = malloc(sizeof(float) * (size_t)(Tl * D) + 4))) return moe8__fail(MOE8_ERR_NOMEM, "ep: out of memory");
  if (c->in_norm && !(ep->nxe = malloc(sizeof(float) * (size_t)(Tl * D) + 4))) return moe8__fail(MOE8_ERR_NOMEM, "ep: out of memory");
  if (c->router_norm) {
    moe8__rms_norm_rows(x, Tl, D, c->rms_eps, L->w[MOE8_W_ROUTER_SCALE], router_norm_scale(L), ep->nxr);
    *xr = ep->nxr;
  }
  if (c->in_norm) {
    moe8__rms_norm_rows(x, Tl, D, c->rms_eps, L->w[MOE8_W_IN_NORM], 1.0f, ep->nxe);
    *xe = ep->nxe;
  }
  return MOE8_OK;
}

moe8_status moe8__ep_scale_weights(moe8_ep *ep, int64_t Tl, const int32_t *ids, float *w) {
  const moe8_layer *L = ep->L;
  const int64_t A = Tl * L->cfg.top_k;
  if (!L->cfg.expert_scale) return MOE8_OK;
  if (!(ep->nwn = malloc(sizeof(float) * (size_t)A + 4))) return moe8__fail(MOE8_ERR_NOMEM, "ep: out of memory");
  const float *c = L->w[MOE8_W_EXPERT_SCALE];
  for (int64_t a = 0; a < A; a++) {
    ep->nwn[a] = w[a];
    if (ids[a] >= 0) w[a] = w[a] * c[ids[a]];
  }
  return MOE8_OK;
}

moe8_status moe8__ep_norm_out(moe8_ep *ep, int64_t Tl, float *out) {
  const moe8_layer *L = ep->L;
  const int64_t D = L->cfg.hidden;
  if (!L->cfg.out_norm) return MOE8_OK;
  if (!(ep->nyb = malloc(sizeof(float) * (size_t)(Tl * D) + 4))) return moe8__fail(MOE8_ERR_NOMEM, "ep: out of memory");
  if (Tl > 0) memcpy(ep->nyb, out, sizeof(float) * (size_t)(Tl * D));
  moe8__rms_norm_rows(ep->nyb, Tl, D, L->cfg.rms_eps, L->w[MOE8_W_OUT_NORM], 1.0f, out);
  return MOE8_OK;
}

moe8_status moe8__ep_norm_dout(moe8_ep *ep, int64_t Tl, const float *dout, float **dz) {
  const moe8_layer *L = ep->L;
  const int64_t D = L->cfg.hidden;
  *dz = NULL;
  if (!L->cfg.out_norm) return MOE8_OK;
  if (!(*dz = calloc((size_t)(Tl * D) + 1, sizeof(float)))) return moe8__fail(MOE8_ERR_NOMEM, "ep backward: out of memory");
  return moe8__rms_norm_backward(ep->nyb, Tl, D, L->cfg.rms_eps, L->w[MOE8_W_OUT_NORM], 1.0f, dout, *dz, NULL);
}

moe8_status moe8__ep_norm_grads_open(moe8_ep *ep, const float *x, int64_t Tl, const float *dout, const moe8_layer_grads *gr,
                                     moe8__ep_norm_grads *g) {
  const moe8_layer_config *lc = &ep->L->cfg;
  const int64_t D = lc->hidden;
  *g = (moe8__ep_norm_grads){0};
  g->dxe_b = lc->in_norm && (gr->dx || gr->dwin) ? calloc((size_t)(Tl * D) + 1, sizeof(float)) : NULL;
  g->dxr_b = lc->router_norm && (gr->dx || gr->dwrs) ? calloc((size_t)(Tl * D) + 1, sizeof(float)) : NULL;
  g->dxe = lc->in_norm ? g->dxe_b : gr->dx;
  g->dxr = lc->router_norm ? g->dxr_b : gr->dx;
  g->xe = lc->in_norm ? ep->nxe : x;
  g->xr = lc->router_norm ? ep->nxr : x;
  if ((lc->in_norm && (gr->dx || gr->dwin) && !g->dxe_b) || (lc->router_norm && (gr->dx || gr->dwrs) && !g->dxr_b))
    return moe8__fail(MOE8_ERR_NOMEM, "ep backward: out of memory");
  return moe8__ep_norm_dout(ep, Tl, dout, &g->dz);
}

void moe8__ep_norm_grads_close(moe8__ep_norm_grads *g) {
  free(g->dz);
  free(g->dxe_b);
  free(g->dxr_b);
  *g = (moe8__ep_norm_grads){0};
}

moe8_status moe8__ep_scale_dw(moe8_ep *ep, int64_t Tl, const int32_t *ids, float *dw, float **dwp) {
  const moe8_layer *L = ep->L;
  const int64_t A = Tl * L->cfg.top_k;
  *dwp = NULL;
  if (!L->cfg.expert_scale) return MOE8_OK;
  if (!(*dwp = malloc(sizeof(float) * (size_t)A + 4))) return moe8__fail(MOE8_ERR_NOMEM, "ep backward: out of memory");
  const float *c = L->w[MOE8_W_EXPERT_SCALE];
  for (int64_t a = 0; a < A; a++) {
    (*dwp)[a] = dw[a];
    if (ids[a] >= 0) dw[a] = dw[a] * c[ids[a]];
  }
  return MOE8_OK;
}

moe8_status moe8__ep_norms_tail(moe8_ep *ep, const float *x, int64_t Tl, const float *dout, const int32_t *ids, const float *dwp,
                                const float *dxe, const float *dxr, const moe8_layer_grads *gr) {
  const moe8_layer *L = ep->L;
  const moe8_layer_config *c = &L->cfg;
  const int64_t D = c->hidden, E = c->num_experts, K = c->top_k;
  if (!c->router_norm && !c->expert_scale && !c->in_norm && !c->out_norm) return MOE8_OK;
  /* [dwes E][dwon D][dwin D][dwrs D], the single process's chains in its order */
  const int64_t oe = 0, oo = c->expert_scale ? E : 0, oi = oo + (c->out_norm ? D : 0), orr = oi + (c->in_norm ? D : 0);
  const int64_t na = orr + (c->router_norm ? D : 0);
  float *acc = calloc((size_t)na + 1, sizeof(float));
  moe8_status st = acc ? MOE8_OK : moe8__fail(MOE8_ERR_NOMEM, "ep backward: out of memory");
  if ((st = moe8__ep_agree(ep, st)) != MOE8_OK) { free(acc); return st; }
  if (ep->r > 0) st = ep->c->recv(ep->c, ep->r - 1, acc, sizeof(float) * (size_t)na);
  for (int64_t a = 0; st == MOE8_OK && c->expert_scale && a < Tl * K; a++)
    if (ids[a] >= 0) acc[oe + ids[a]] += dwp[a] * ep->nwn[a];
  if (st == MOE8_OK && c->out_norm)
    st = moe8__rms_norm_backward(ep->nyb, Tl, D, c->rms_eps, L->w[MOE8_W_OUT_NORM], 1.0f, dout, NULL, acc + oo);
  if (st == MOE8_OK && dxe) st = moe8__rms_norm_backward(x, Tl, D, c->rms_eps, L->w[MOE8_W_IN_NORM], 1.0f, dxe, gr->dx, acc + oi);
  if (st == MOE8_OK && dxr)
    st = moe8__rms_norm_backward(x, Tl, D, c->rms_eps, L->w[MOE8_W_ROUTER_SCALE], router_norm_scale(L), dxr, gr->dx, acc + orr);
  if (st == MOE8_OK && ep->r < ep->P - 1) st = ep->c->send(ep->c, ep->r + 1, acc, sizeof(float) * (size_t)na);
  if (st == MOE8_OK) st = ep->c->bcast(ep->c, ep->P - 1, acc, sizeof(float) * (size_t)na);
  if (st == MOE8_OK && c->expert_scale && gr->dwes) memcpy(gr->dwes, acc + oe, sizeof(float) * (size_t)E);
  if (st == MOE8_OK && c->out_norm && gr->dwon) memcpy(gr->dwon, acc + oo, sizeof(float) * (size_t)D);
  if (st == MOE8_OK && c->in_norm && gr->dwin) memcpy(gr->dwin, acc + oi, sizeof(float) * (size_t)D);
  if (st == MOE8_OK && c->router_norm && gr->dwrs) memcpy(gr->dwrs, acc + orr, sizeof(float) * (size_t)D);
  free(acc);
  return st;
}
