/*
** ep.c — the expert-parallel object and what its two modes share
** (docs/parallelism.md): creation (the ranks agree on the layer), the
** status vote, the token counts and row all-gathers, the checks that open a
** forward and a backward, the router's tail of the backward (the dWr relay
** in rank order and the router's part of dx) and the shared expert; the
** modes themselves are ep_ring.c (the ring of experts) and ep_a2a.c (the
** all-to-all dispatch), which call this file and never each other.
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

void moe8_ep_destroy(moe8_ep *ep) {
  if (!ep) return;
  moe8__ring_free(ep);
  moe8__a2a_free(ep);
  free(ep->Toff);
  free(ep);
}

const moe8_ep_stats *moe8_ep_get_stats(const moe8_ep *ep) { return ep ? &ep->st : NULL; }

/* ---- create: the ranks must agree ---------------------------------------- */
#define NFP 29
typedef struct fingerprint {
  int64_t v[NFP];
} fingerprint;

static const char *const k_fp_names[NFP] = {
  "num_experts", "top_k", "hidden", "ffn", "score function", "norm_topk_prob", "routed_scaling_factor",
  "selection bias", "capacity_factor", "aux_loss_weight", "weight quantization", "weight qtype", "weight tile",
  "activation quantization", "activation qtype", "activation tile", "bwd_qtype", "quantize_before_ep_all_gather",
  "number of ranks", "n_group", "topk_group", "shared_ffn", "shared_gate", "group score", "expert form (activation, biases, input scaling)",
  "activation alpha and limit", "expert-parallel mode",
  "summation order", "weights (checksum)"};

/* The summation order as the fingerprint holds it: 1 canonical (the same
** bytes on every table), else 2 + 2·table + has_bf16 (one table's own). */
static int64_t order_code(const moe8_layer *L) {
  if (moe8_order_effective(moe8__layer_order_now(L)) == MOE8_ORDER_CANONICAL) return 1;
  const moe8__ktable *kt = moe8__kernels();
  return 2 + 2 * (int64_t)kt->isa + kt->has_bf16;
}

static void order_text(int64_t code, char *buf, size_t n) {
  if (code == 1) snprintf(buf, n, "the canonical order");
  else snprintf(buf, n, "the native order of the %s table%s", moe8_isa_name((moe8_isa)((code - 2) / 2)),
                (code - 2) % 2 ? "" : " without vdpbf16ps");
}

static uint64_t checksum(const float *p, size_t n, uint64_t h) {
  for (size_t i = 0; i < n; i++) h = (h ^ moe8__f32_bits(p[i])) * 0x100000001B3ULL;
  return h;
}

static fingerprint make_fp(const moe8_ep *ep) {
  const moe8_layer *L = ep->L;
  const moe8_layer_config *c = &L->cfg;
  fingerprint f = {{c->num_experts, c->top_k, c->hidden, c->ffn, c->score, c->norm_topk_prob,
                    moe8__f32_bits(c->routed_scaling_factor), c->use_selection_bias, moe8__f32_bits(c->capacity_factor),
                    moe8__f32_bits(c->aux_loss_weight), L->wq, L->wq ? L->wspec.qtype : 0, L->wq ? L->wspec.tile : 0, L->aq,
                    L->aq ? L->aspec.qtype : 0, L->aq ? L->aspec.tile : 0, L->has_rule ? L->rule.bwd_qtype : 0, L->before_sort,
                    ep->P, c->n_group, c->topk_group, c->shared_ffn, c->shared_gate, c->group_score,
                    c->act + 2 * c->router_bias + 4 * c->expert_bias + 8 * c->weight_input,
                    (int64_t)(((uint64_t)moe8__f32_bits(c->act_alpha) << 31) ^ moe8__f32_bits(c->act_limit)), ep->mode, order_code(L), 0}};
  uint64_t h = 0xCBF29CE484222325ULL;
  for (int i = 0; i < MOE8_W_COUNT; i++)
    if (L->n[i]) h = checksum(L->w[i], L->n[i], h);
  /* Inference layers have no expert masters: their scales stand in. */
  const int64_t D = c->hidden;
  for (int s = 0; s < L->nsets && L->inference && L->wq; s++) {
    const moe8__xset *X = &L->xs[s];
    const int64_t tk = L->wspec.tile;
    h = checksum(X->wgu_s, (size_t)(X->E * (tk ? moe8__cdiv(D, tk) : 1) * 2 * X->F), h);
    h = checksum(X->wd_s, (size_t)(X->E * (tk ? moe8__cdiv(X->F, tk) : 1) * D), h);
  }
  f.v[NFP - 1] = (int64_t)(h >> 1);
  return f;
}

moe8_status moe8_ep_create(moe8_layer *layer, moe8_comm *comm, moe8_ep **out) {
  return moe8_ep_create_ex(layer, comm, NULL, out);
}

moe8_status moe8_ep_create_ex(moe8_layer *layer, moe8_comm *comm, const moe8_ep_options *opt, moe8_ep **out) {
  if (!layer || !comm || !out) return moe8__fail(MOE8_ERR_INVALID_ARG, "ep: NULL argument");
  *out = NULL;
  moe8_ep_options o = {sizeof o, MOE8_EP_RING};
  if (opt) {
    if (opt->size < sizeof(size_t) + sizeof(moe8_ep_mode) || opt->size > ((size_t)1 << 16))
      return moe8__fail(MOE8_ERR_INVALID_ARG, "ep: moe8_ep_options.size = %zu is not a size this library knows", opt->size);
    memcpy(&o, opt, opt->size < sizeof o ? opt->size : sizeof o);
  }
  if (o.mode != MOE8_EP_RING && o.mode != MOE8_EP_ALLTOALL)
    return moe8__fail(MOE8_ERR_INVALID_ARG, "ep: unknown expert-parallel mode %d", (int)o.mode);
  moe8_ep *ep = calloc(1, sizeof *ep);
  if (!ep) return moe8__fail(MOE8_ERR_NOMEM, "ep: out of memory");
  ep->mode = o.mode;
  ep->L = layer;
  ep->c = comm;
  ep->P = comm->size;
  ep->r = comm->rank;
  /* Every rank compares every rank's fingerprint with rank 0's, so all
  ** reach the same verdict and the same message. */
  const fingerprint mine = make_fp(ep);
  fingerprint *all = malloc(sizeof(fingerprint) * (size_t)ep->P);
  size_t *rb = malloc(sizeof(size_t) * (size_t)ep->P);
  moe8_status st = all && rb ? MOE8_OK : moe8__fail(MOE8_ERR_NOMEM, "ep: out of memory");
  if (st == MOE8_OK) {
    for (int i = 0; i < ep->P; i++) rb[i] = sizeof(fingerprint);
    st = comm->allgatherv(comm, &mine, sizeof mine, all, rb);
  }
  for (int i = 1; i < ep->P && st == MOE8_OK; i++)
    for (int k = 0; k < NFP; k++)
      if (all[i].v[k] != all[0].v[k]) {
        if (k == NFP - 2) {
          char a[96], b[96];
          order_text(all[i].v[k], a, sizeof a);
          order_text(all[0].v[k], b, sizeof b);
          st = moe8__fail(MOE8_ERR_INVALID_ARG, "ep: ranks disagree on the summation order: rank %d sums in %s, rank 0 in %s "
                          "(set MOE8_ORDER=canonical on every rank, or moe8_layer_set_order)", i, a, b);
          break;
        }
        st = k == NFP - 1 ? moe8__fail(MOE8_ERR_INVALID_ARG, "ep: ranks disagree on the layer: rank %d's weights differ from rank 0's", i)
                     : moe8__fail(MOE8_ERR_INVALID_ARG, "ep: ranks disagree on the layer config: rank %d has %s = %lld, rank 0 has %lld",
                                  i, k_fp_names[k], (long long)all[i].v[k], (long long)all[0].v[k]);
        break;
      }
  free(all);
  free(rb);
  const int64_t E = layer->cfg.num_experts;
  if (st == MOE8_OK && E % ep->P != 0)
    st = moe8__fail(MOE8_ERR_SHAPE, "ep: %lld experts cannot be split evenly over %d ranks (E %% P = %lld)", (long long)E, ep->P,
                    (long long)(E % ep->P));
  if (st != MOE8_OK) { free(ep); return st; }
  ep->Eloc = E / ep->P;
  ep->g0 = ep->r * ep->Eloc;
  *out = ep;
  return MOE8_OK;
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

moe8_status moe8__ep_begin_forward(moe8_ep *ep, const float *x, int64_t Tl, const float *out) {
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

moe8_status moe8__ep_router_tail(moe8_ep *ep, const float *x, int64_t Tl, const float *dl, const moe8_layer_grads *gr) {
  moe8_layer *L = ep->L;
  const int64_t D = L->cfg.hidden, E = L->cfg.num_experts;
  /* dWr [D, E], and the router bias's [E] after it when the layer has one */
  const int64_t nb = L->cfg.router_bias ? E : 0, na = D * E + nb;
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
  if (st == MOE8_OK && ep->r < ep->P - 1) st = ep->c->send(ep->c, ep->r + 1, acc, sizeof(float) * (size_t)na);
  if (st == MOE8_OK) st = ep->c->bcast(ep->c, ep->P - 1, acc, sizeof(float) * (size_t)na);
  ep->st.router_s = moe8__ep_now() - t0;
  ep->st.router_bytes = (uint64_t)na * sizeof(float) * (ep->P > 1 ? 2u : 0u);
  if (st == MOE8_OK && gr->dwr) memcpy(gr->dwr, acc, sizeof(float) * (size_t)(D * E));
  if (st == MOE8_OK && nb && gr->dwrb) memcpy(gr->dwrb, acc + D * E, sizeof(float) * (size_t)E);
  if (st == MOE8_OK && gr->dx) st = moe8__router_dx(L, dl, Tl, gr->dx);
  free(acc);
  return st;
}

moe8_status moe8__ep_shared_backward(moe8_ep *ep, const float *x, int64_t Tl, const float *dout, const float *Dg,
                                     const moe8_layer_grads *gr) {
  moe8_layer *L = ep->L;
  if (L->cfg.shared_ffn <= 0) return MOE8_OK;
  const int64_t D = L->cfg.hidden, T = ep->T, T0 = ep->Toff[ep->r];
  const int P = ep->P;
  float *Xg = malloc(sizeof(float) * (size_t)(T * D) + 4), *Dx = gr->dx ? calloc((size_t)(T * D) + 1, sizeof(float)) : NULL;
  float *Dgo = Dg ? NULL : malloc(sizeof(float) * (size_t)(T * D) + 4);
  moe8_status st = Xg && (!gr->dx || Dx) && (Dg || Dgo) ? MOE8_OK : moe8__fail(MOE8_ERR_NOMEM, "ep backward: out of memory");
  const double t0 = moe8__ep_now();
  if (st == MOE8_OK) st = moe8__ep_allgather_rows(ep, x, sizeof(float) * (size_t)D, Xg);
  if (st == MOE8_OK && !Dg) st = moe8__ep_allgather_rows(ep, dout, sizeof(float) * (size_t)D, Dgo);
  const uint64_t rows = Dg ? 1 : 2; /* x rows, and dout rows when not gathered already */
  ep->st.shared_s = moe8__ep_now() - t0;
  ep->st.shared_bytes = rows * (uint64_t)(T * D) * sizeof(float);
  ep->st.bwd_sent_bytes += rows * (uint64_t)(Tl * D) * sizeof(float) * (uint64_t)(P - 1);
  ep->st.bwd_recv_bytes += rows * (uint64_t)((T - Tl) * D) * sizeof(float);
  if (st == MOE8_OK && Dx) memcpy(Dx + T0 * D, gr->dx, sizeof(float) * (size_t)(Tl * D));
  if (st == MOE8_OK) st = moe8__ep_shared_run(ep, Xg, T, NULL, Dg ? Dg : Dgo, Dx, gr);
  if (st == MOE8_OK && Dx) memcpy(gr->dx, Dx + T0 * D, sizeof(float) * (size_t)(Tl * D));
  free(Xg); free(Dx); free(Dgo);
  return st;
}

/* ---- the modes ------------------------------------------------------------------ */
moe8_status moe8_ep_forward(moe8_ep *ep, const float *x, int64_t Tl, float *out, float *aux) {
  if (!ep) return moe8__fail(MOE8_ERR_INVALID_ARG, "ep: NULL");
  return ep->mode == MOE8_EP_ALLTOALL ? moe8__a2a_forward(ep, x, Tl, out, aux) : moe8__ring_forward(ep, x, Tl, out, aux);
}

moe8_status moe8_ep_backward(moe8_ep *ep, const float *x, int64_t Tl, const float *dout, const moe8_layer_grads *gr) {
  if (!ep || !gr) return moe8__fail(MOE8_ERR_INVALID_ARG, "ep backward: NULL argument");
  const moe8_status fst = moe8__check_backward_form(ep->L, "ep backward");
  if (fst != MOE8_OK) return fst;
  return ep->mode == MOE8_EP_ALLTOALL ? moe8__a2a_backward(ep, x, Tl, dout, gr) : moe8__ring_backward(ep, x, Tl, dout, gr);
}

moe8_ep_mode moe8_ep_get_mode(const moe8_ep *ep) { return ep ? ep->mode : MOE8_EP_RING; }
