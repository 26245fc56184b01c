/*
** ep.c — expert parallelism: the ring of experts of docs/parallelism.md
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

static void free_state(moe8_ep *ep) {
  void *p[] = {ep->Toff, ep->scores_g, ep->w_g, ep->ids_g, ep->token_of, ep->slot_of, ep->pos_of, ep->gsz, ep->offs,
               ep->xs, ep->sxs, ep->gu, ep->h, ep->sh, ep->y, ep->xsq, ep->hq, ep->dest, ep->recvrow, ep->sendcnt, ep->recvcnt};
  for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) free(p[i]);
  ep->Toff = NULL; ep->scores_g = ep->w_g = NULL; ep->ids_g = ep->token_of = ep->slot_of = ep->pos_of = ep->gsz = NULL;
  ep->offs = NULL; ep->xs = ep->sxs = ep->gu = ep->h = ep->sh = ep->y = NULL; ep->xsq = ep->hq = NULL;
  ep->dest = ep->recvrow = NULL; ep->sendcnt = ep->recvcnt = NULL;
  ep->have_forward = false;
}

void moe8_ep_destroy(moe8_ep *ep) {
  if (!ep) return;
  free_state(ep);
  moe8__a2a_free(ep);
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
  if (moe8_order_effective(L->order) == MOE8_ORDER_CANONICAL) return 1;
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
  const int P = ep->P;
  const size_t rb = sizeof(float) * (size_t)width;
  float *send = malloc(rb * (size_t)ep->rows + 4), *recv = malloc(rb * (size_t)ep->nrecv + 4);
  size_t *sb = malloc(sizeof(size_t) * 3 * (size_t)P);
  if (!send || !recv || !sb) { free(send); free(recv); free(sb); return moe8__fail(MOE8_ERR_NOMEM, "ep: out of memory"); }
  size_t *rbytes = sb + P, *cur = sb + 2 * P;
  size_t off = 0;
  for (int q = 0; q < P; q++) { sb[q] = ep->sendcnt[q] * rb; rbytes[q] = ep->recvcnt[q] * rb; cur[q] = off; off += ep->sendcnt[q]; }
  for (int64_t i = 0; i < ep->rows; i++) memcpy(send + (cur[ep->dest[i]]++) * (size_t)width, rows + i * width, rb);
  for (int q = 0; q < P; q++)
    if (q != ep->r) { *sent_other += sb[q]; *recv_other += rbytes[q]; }
  *bytes = (uint64_t)(rb * (size_t)ep->nrecv);
  moe8_status st = ep->c->alltoallv(ep->c, send, sb, recv, rbytes);
  free(send);
  free(sb);
  if (st != MOE8_OK) { free(recv); return st; }
  *recv_out = recv;
  return MOE8_OK;
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
  if (st == MOE8_OK) st = moe8__shared_forward(L, x, xq, sx, T, &b, scratch, ssz);
  if (st == MOE8_OK && !dout) moe8__shared_add(L, T, &b, out);
  if (st == MOE8_OK && dout) st = moe8__shared_backward(L, x, xq, sx, T, dout, &b, dx, gr);
  free(buf); free(scratch); free(xq); free(sx);
  return st;
}

static moe8_status shared_local(moe8_ep *ep, const float *x, int64_t Tl, float *out) {
  return moe8__ep_shared_run(ep, x, Tl, out, NULL, NULL, NULL);
}


/* ---- forward -------------------------------------------------------------------- */
static moe8_status ring_forward(moe8_ep *ep, const float *x, int64_t Tl, float *out, float *aux) {
  moe8_layer *L = ep->L;
  const int64_t E = L->cfg.num_experts, K = L->cfg.top_k, D = L->cfg.hidden, F = L->cfg.ffn;
  const int P = ep->P;
  moe8_status st = moe8__ep_begin_forward(ep, x, Tl, out);
  if (st != MOE8_OK) return st;
  free_state(ep);
  memset(&ep->st, 0, sizeof ep->st);
  ep->Tl = Tl;
  /* 2. token counts */
  if ((st = moe8__ep_token_counts(ep, Tl)) != MOE8_OK) return st;
  const int64_t T = ep->T = ep->Toff[P], A = T * K, T0 = ep->Toff[ep->r];
  if (aux) *aux = 0.0f;
  if (T == 0) { ep->have_forward = true; return MOE8_OK; }
  const int64_t nbD = L->aq ? moe8__cdiv(D, L->aspec.tile ? L->aspec.tile : D) : 1;
  const size_t qrow = (size_t)D + sizeof(float) * (size_t)nbD; /* a quantized token row on the wire */
  bool ok = true;
  float *logits, *route_l, *route_g, *xg;
  uint8_t *xq_l = NULL;
  ALLOC(logits, Tl * E); ALLOC(route_l, Tl * (2 * K + E)); ALLOC(route_g, T * (2 * K + E));
  ALLOC(ep->scores_g, T * E); ALLOC(ep->w_g, A); ALLOC(ep->ids_g, A);
  ALLOC(ep->token_of, A); ALLOC(ep->slot_of, A); ALLOC(ep->pos_of, A); ALLOC(ep->gsz, E); ALLOC(ep->offs, E + 1);
  /* Llama-4's rows are scaled before they are quantized: f32 on the wire */
  const bool before = L->aq && L->before_sort && !L->cfg.weight_input, wi = L->cfg.weight_input;
  ALLOC(xg, before ? (T * (int64_t)qrow + 3) / 4 : T * D);
  if (before) ALLOC(xq_l, Tl * (int64_t)qrow);
  if (!ok) { free(logits); free(route_l); free(route_g); free(xg); free(xq_l); return moe8__fail(MOE8_ERR_NOMEM, "ep: out of memory"); }
  /* 3. local routing, packed per token as ids[K] | weights[K] | scores[E] */
  const moe8_router_config rc = moe8__router_config(L);
  float *sc_l = malloc(sizeof(float) * (size_t)(Tl * E + 1)), *w_l = malloc(sizeof(float) * (size_t)(Tl * K + 1));
  int32_t *id_l = malloc(sizeof(int32_t) * (size_t)(Tl * K + 1));
  if (!sc_l || !w_l || !id_l) st = moe8__fail(MOE8_ERR_NOMEM, "ep: out of memory");
  if (st == MOE8_OK) st = moe8__router_logits(L, x, Tl, logits);
  if (st == MOE8_OK) st = moe8_route(&rc, logits, Tl, sc_l, id_l, w_l);
  if (st == MOE8_OK)
    for (int64_t t = 0; t < Tl; t++) {
      float *row = route_l + t * (2 * K + E);
      memcpy(row, id_l + t * K, sizeof(float) * (size_t)K);
      memcpy(row + K, w_l + t * K, sizeof(float) * (size_t)K);
      memcpy(row + 2 * K, sc_l + t * E, sizeof(float) * (size_t)E);
    }
  /* 4. local token rows, quantized first when asked */
  if (st == MOE8_OK && before) {
    uint8_t *q = malloc((size_t)(Tl * D) + 1);
    float *s = malloc(sizeof(float) * (size_t)(Tl * nbD) + 4);
    if (!q || !s) st = moe8__fail(MOE8_ERR_NOMEM, "ep: out of memory");
    else st = moe8_quantize(&L->aspec, x, 1, Tl, D, q, s, NULL);
    for (int64_t t = 0; st == MOE8_OK && t < Tl; t++) {
      memcpy(xq_l + (size_t)t * qrow, q + t * D, (size_t)D);
      memcpy(xq_l + (size_t)t * qrow + D, s + t * nbD, sizeof(float) * (size_t)nbD);
    }
    free(q); free(s);
  }
  free(sc_l); free(w_l); free(id_l); free(logits);
  if ((st = moe8__ep_agree(ep, st)) != MOE8_OK) { free(route_l); free(route_g); free(xg); free(xq_l); return st; }
  double t0 = moe8__ep_now();
  st = before ? moe8__ep_allgather_rows(ep, xq_l, qrow, xg) : moe8__ep_allgather_rows(ep, x, sizeof(float) * (size_t)D, xg);
  ep->st.tokens_s = moe8__ep_now() - t0;
  ep->st.tokens_bytes = (uint64_t)T * (before ? qrow : sizeof(float) * (size_t)D);
  free(xq_l);
  t0 = moe8__ep_now();
  if (st == MOE8_OK) st = moe8__ep_allgather_rows(ep, route_l, sizeof(float) * (size_t)(2 * K + E), route_g);
  ep->st.routing_s = moe8__ep_now() - t0;
  ep->st.routing_bytes = (uint64_t)T * sizeof(float) * (uint64_t)(2 * K + E);
  {
    const uint64_t row = (before ? qrow : sizeof(float) * (size_t)D) + sizeof(float) * (size_t)(2 * K + E);
    ep->st.fwd_sent_bytes += (uint64_t)Tl * row * (uint64_t)(P - 1);
    ep->st.fwd_recv_bytes += (uint64_t)(T - Tl) * row;
  }
  free(route_l);
  if (st != MOE8_OK) { free(route_g); free(xg); return st; }
  for (int64_t t = 0; t < T; t++) {
    const float *row = route_g + t * (2 * K + E);
    memcpy(ep->ids_g + t * K, row, sizeof(float) * (size_t)K);
    memcpy(ep->w_g + t * K, row + K, sizeof(float) * (size_t)K);
    memcpy(ep->scores_g + t * E, row + 2 * K, sizeof(float) * (size_t)E);
  }
  free(route_g);
  /* 6. the global sort; this rank's rows */
  moe8_dispatch d = {ep->token_of, ep->slot_of, ep->gsz, ep->offs, ep->pos_of, 0};
  st = moe8_dispatch_sort(ep->ids_g, T, K, E, L->cfg.capacity_factor, &d);
  if (st != MOE8_OK) { free(xg); return st; }
  ep->P0 = ep->offs[ep->g0];
  const int64_t rows = ep->rows = ep->offs[ep->g0 + ep->Eloc] - ep->P0;
  ALLOC(ep->xs, rows * D); ALLOC(ep->gu, rows * 2 * F); ALLOC(ep->h, rows * F); ALLOC(ep->y, rows * D);
  if (L->aq) { ALLOC(ep->xsq, rows * D); ALLOC(ep->sxs, rows * nbD); ALLOC(ep->hq, rows * F); ALLOC(ep->sh, rows * moe8__cdiv(F, L->aspec.tile ? L->aspec.tile : F)); }
  ALLOC(ep->dest, rows); ALLOC(ep->recvrow, Tl * K); ALLOC(ep->sendcnt, P); ALLOC(ep->recvcnt, P);
  if (!ok) { free(xg); return moe8__fail(MOE8_ERR_NOMEM, "ep: out of memory"); }
  const int32_t *tok = ep->token_of + ep->P0;
  if (before) {
    const uint8_t *xb = (const uint8_t *)xg;
    for (int64_t i = 0; i < rows; i++) {
      memcpy(ep->xsq + i * D, xb + (size_t)tok[i] * qrow, (size_t)D);
      memcpy(ep->sxs + i * nbD, xb + (size_t)tok[i] * qrow + D, sizeof(float) * (size_t)nbD);
    }
  } else {
    st = moe8_gather_rows(ep->xs, xg, sizeof(float) * (size_t)D, tok, rows, T);
    if (st == MOE8_OK && wi) moe8__scale_rows(ep->xs, rows, D, tok, ep->slot_of + ep->P0, ep->w_g, K);
    if (st == MOE8_OK && L->aq) st = moe8_quantize(&L->aspec, ep->xs, 1, rows, D, ep->xsq, ep->sxs, NULL);
  }
  free(xg);
  /* 7. this rank's experts */
  if (st == MOE8_OK)
    st = moe8__experts_forward(L, 0, rows, ep->gsz + ep->g0, ep->g0, ep->Eloc, ep->xs, ep->xsq, ep->sxs, ep->gu, ep->h, ep->hq,
                               ep->sh, ep->y, NULL, 0);
  /* 8. routes of the exchange: where each local row goes, where each of my
  ** slots' rows arrives (rows from one peer come in increasing row order) */
  if (st == MOE8_OK) {
    for (int q = 0; q < P; q++) ep->sendcnt[q] = ep->recvcnt[q] = 0;
    for (int64_t i = 0; i < rows; i++) ep->sendcnt[ep->dest[i] = owner_of(ep, tok[i])]++;
    const int64_t nrows = ep->offs[E];
    for (int64_t p = 0; p < nrows; p++) {
      const int64_t t = ep->token_of[p];
      if (owner_of(ep, t) == ep->r) ep->recvcnt[ep->ids_g[t * K + ep->slot_of[p]] / ep->Eloc]++; /* the expert's rank */
    }
    int64_t *base = malloc(sizeof(int64_t) * (size_t)P), *cnt = malloc(sizeof(int64_t) * (size_t)P);
    if (!base || !cnt) st = moe8__fail(MOE8_ERR_NOMEM, "ep: out of memory");
    else {
      int64_t b = 0;
      for (int q = 0; q < P; q++) { base[q] = b; b += (int64_t)ep->recvcnt[q]; cnt[q] = 0; }
      ep->nrecv = b;
      for (int64_t a = 0; a < Tl * K; a++) ep->recvrow[a] = -1;
      for (int64_t p = 0; p < nrows; p++) {
        const int64_t t = ep->token_of[p];
        if (owner_of(ep, t) != ep->r) continue;
        const int src = (int)(ep->ids_g[t * K + ep->slot_of[p]] / ep->Eloc);
        ep->recvrow[(t - T0) * K + ep->slot_of[p]] = (int32_t)(base[src] + cnt[src]++);
      }
    }
    free(base);
    free(cnt);
  }
  if ((st = moe8__ep_agree(ep, st)) != MOE8_OK) return st;
  float *recv = NULL;
  t0 = moe8__ep_now();
  st = exchange(ep, ep->y, D, &recv, &ep->st.combine_bytes, &ep->st.fwd_sent_bytes, &ep->st.fwd_recv_bytes);
  ep->st.combine_s = moe8__ep_now() - t0;
  float *ones = wi ? malloc(sizeof(float) * (size_t)(Tl * K + 1)) : NULL; /* Llama-4: the outputs summed unweighted */
  if (st == MOE8_OK && wi && !ones) st = moe8__fail(MOE8_ERR_NOMEM, "ep: out of memory");
  for (int64_t a = 0; st == MOE8_OK && wi && a < Tl * K; a++) ones[a] = 1.0f;
  if (st == MOE8_OK) st = moe8_combine(recv, ep->nrecv, ep->recvrow, wi ? ones : ep->w_g + T0 * K, Tl, K, D, out);
  free(recv);
  free(ones);
  /* The shared expert: the owner's tokens, on the owner (rows are
  ** independent, so the bytes are the single-process layer's). */
  if (st == MOE8_OK && L->cfg.shared_ffn > 0 && Tl > 0) st = shared_local(ep, x, Tl, out);
  if (st == MOE8_OK) st = moe8__check_output(L, out, Tl);
  if (st == MOE8_OK) {
    const float a = moe8__aux_loss(L, T, ep->ids_g, ep->scores_g, ep->f);
    if (aux && L->cfg.aux_loss_weight != 0.0f) *aux = a;
    ep->have_forward = true;
  }
  return moe8__ep_agree(ep, st);
}

/* ---- backward ------------------------------------------------------------------- */
static moe8_status ring_backward(moe8_ep *ep, const float *x, int64_t Tl, const float *dout, const moe8_layer_grads *gr) {
  moe8_layer *L = ep->L;
  const int64_t E = L->cfg.num_experts, K = L->cfg.top_k, D = L->cfg.hidden;
  moe8_status st = moe8__ep_begin_backward(ep, x, Tl, dout, gr);
  if (st != MOE8_OK) return st;
  const int64_t T = ep->T, T0 = ep->Toff[ep->r], rows = ep->rows;
  if (T == 0) return MOE8_OK;
  const bool wi = L->cfg.weight_input;
  bool ok = true;
  float *Dg, *dy, *dwrow, *dxs, *packed, *dw_l, *dl, *ones, *ones_g = NULL;
  ALLOC(Dg, T * D); ALLOC(dy, rows * D); ALLOC(dwrow, rows); ALLOC(dxs, rows * D); ALLOC(packed, rows * (D + 1));
  ALLOC(dw_l, Tl * K); ALLOC(dl, Tl * E); ALLOC(ones, Tl * K);
  if (wi) ALLOC(ones_g, T * K); /* Llama-4: dy is dout (the combine's weights are 1) */
  for (int64_t a = 0; ok && wi && a < T * K; a++) ones_g[a] = 1.0f;
  if (!ok) st = moe8__fail(MOE8_ERR_NOMEM, "ep backward: out of memory");
  if ((st = moe8__ep_agree(ep, st)) != MOE8_OK) goto done;
  double t0 = moe8__ep_now();
  st = moe8__ep_allgather_rows(ep, dout, sizeof(float) * (size_t)D, Dg);
  ep->st.dout_s = moe8__ep_now() - t0;
  ep->st.dout_bytes = (uint64_t)(T * D) * sizeof(float);
  ep->st.bwd_sent_bytes = (uint64_t)(Tl * D) * sizeof(float) * (uint64_t)(ep->P - 1);
  ep->st.bwd_recv_bytes = (uint64_t)((T - Tl) * D) * sizeof(float);
  if (st != MOE8_OK) goto done;
  /* this rank's experts */
  moe8__dy_dw(rows, ep->token_of + ep->P0, ep->slot_of + ep->P0, wi ? ones_g : ep->w_g, K, Dg, ep->y, D, dy, dwrow);
  st = moe8__experts_backward(L, 0, rows, ep->gsz + ep->g0, ep->g0, ep->Eloc, dy, ep->xs, ep->xsq, ep->sxs, ep->h, ep->hq, ep->sh,
                              ep->gu, dxs, gr->dwg, gr->dwu, gr->dwd,
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
  float *rx = malloc(sizeof(float) * (size_t)(ep->nrecv * D) + 4);
  if (!rx) { free(recv); st = moe8__fail(MOE8_ERR_NOMEM, "ep backward: out of memory"); goto agreed; }
  for (int64_t i = 0; i < ep->nrecv; i++) memcpy(rx + i * D, recv + i * (D + 1), sizeof(float) * (size_t)D);
  for (int64_t a = 0; a < Tl * K; a++) {
    dw_l[a] = ep->recvrow[a] >= 0 ? recv[(int64_t)ep->recvrow[a] * (D + 1) + D] : 0.0f;
    ones[a] = 1.0f;
  }
  free(recv);
  if (wi) {
    const float c = L->cfg.routed_scaling_factor != 0.0f ? L->cfg.routed_scaling_factor : 1.0f;
    moe8__input_weight_backward(Tl, K, D, E, ep->recvrow, rx, x, ep->scores_g + T0 * E, ep->ids_g + T0 * K, c, gr->dx, dw_l);
  } else if (gr->dx) st = moe8_combine(rx, ep->nrecv, ep->recvrow, ones, Tl, K, D, gr->dx);
  free(rx);
  /* router */
  if (st == MOE8_OK) moe8__router_backward(L, Tl, ep->scores_g + T0 * E, ep->ids_g + T0 * K, dw_l, ep->f, T, dl);
agreed:
  if ((st = moe8__ep_agree(ep, st)) != MOE8_OK) goto done;
  st = moe8__ep_router_tail(ep, x, Tl, dl, gr);
  if ((st = moe8__ep_agree(ep, st)) == MOE8_OK) st = moe8__ep_shared_backward(ep, x, Tl, dout, Dg, gr);
  st = moe8__ep_agree(ep, st);
done:
  free(Dg); free(dy); free(dwrow); free(dxs); free(packed); free(dw_l); free(dl); free(ones); free(ones_g);
  return st;
}



/* ---- what both modes' forwards share --------------------------------------------------- */
moe8_status moe8__ep_begin_forward(moe8_ep *ep, const float *x, int64_t Tl, const float *out) {
  moe8_layer *L = ep->L;
  const int64_t D = L->cfg.hidden;
  moe8_status st = MOE8_OK;
  if (Tl < 0) st = moe8__fail(MOE8_ERR_SHAPE, "ep forward: T_local = %lld", (long long)Tl);
  else if (Tl > 0 && (!x || !out)) st = moe8__fail(MOE8_ERR_INVALID_ARG, "ep forward: NULL x or out");
  else {
    size_t bad = 0;
    for (int64_t i = 0; i < Tl * D; i++) bad += !isfinite(x[i]);
    if (bad) st = moe8__fail(MOE8_ERR_NONFINITE, "ep forward: input x [%lld, %lld] has %zu non-finite value(s)", (long long)Tl, (long long)D, bad);
  }
  if (st == MOE8_OK) st = moe8__layer_quantize_weights(L);
  return moe8__ep_agree(ep, st);
}

moe8_status moe8__ep_token_counts(moe8_ep *ep, int64_t Tl) {
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
static void zero_grads(const moe8_layer *L, int64_t Tl, const moe8_layer_grads *gr);

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
  zero_grads(L, Tl, gr);
  ep->st.bwd_sent_bytes = ep->st.bwd_recv_bytes = 0;
  return MOE8_OK;
}

static void zero_grads(const moe8_layer *L, int64_t Tl, const moe8_layer_grads *gr) {
  const int64_t E = L->cfg.num_experts, D = L->cfg.hidden, F = L->cfg.ffn, Fs = L->cfg.shared_ffn;
  if (gr->dx) memset(gr->dx, 0, sizeof(float) * (size_t)(Tl * D));
  if (gr->dwg) memset(gr->dwg, 0, sizeof(float) * (size_t)(E * D * F));
  if (gr->dwu) memset(gr->dwu, 0, sizeof(float) * (size_t)(E * D * F));
  if (gr->dwd) memset(gr->dwd, 0, sizeof(float) * (size_t)(E * F * D));
  if (gr->dwr) memset(gr->dwr, 0, sizeof(float) * (size_t)(D * E));
  if (gr->dwsg && Fs > 0) memset(gr->dwsg, 0, sizeof(float) * (size_t)(D * Fs));
  if (gr->dwsu && Fs > 0) memset(gr->dwsu, 0, sizeof(float) * (size_t)(D * Fs));
  if (gr->dwsd && Fs > 0) memset(gr->dwsd, 0, sizeof(float) * (size_t)(Fs * D));
  if (gr->dwsgate && Fs > 0 && L->cfg.shared_gate) memset(gr->dwsgate, 0, sizeof(float) * (size_t)D);
  if (gr->dwrb && L->cfg.router_bias) memset(gr->dwrb, 0, sizeof(float) * (size_t)E);
  if (gr->dwgub && L->cfg.expert_bias) memset(gr->dwgub, 0, sizeof(float) * (size_t)(E * 2 * F));
  if (gr->dwdb && L->cfg.expert_bias) memset(gr->dwdb, 0, sizeof(float) * (size_t)(E * D));
}

moe8_status moe8__ep_router_tail(moe8_ep *ep, const float *x, int64_t Tl, const float *dl, const moe8_layer_grads *gr) {
  moe8_layer *L = ep->L;
  const int64_t D = L->cfg.hidden, E = L->cfg.num_experts;
  /* dWr [D, E], and the router bias's [E] after it when the layer has one */
  const int64_t nb = L->cfg.router_bias ? E : 0, na = D * E + nb;
  float *acc = calloc((size_t)na + 1, sizeof(float)), *tmp = malloc(sizeof(float) * (size_t)(Tl * D) + 4);
  moe8_status st = acc && tmp ? MOE8_OK : moe8__fail(MOE8_ERR_NOMEM, "ep backward: out of memory");
  if ((st = moe8__ep_agree(ep, st)) != MOE8_OK) { free(acc); free(tmp); return st; }
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
  if (st == MOE8_OK && gr->dx && Tl > 0) {
    const int32_t one[1] = {(int32_t)Tl};
    const moe8_gmm_args a = {.M = Tl, .K = E, .N = D, .num_groups = 1, .group_sizes = one, .num_local = 1,
                             .lhs = {MOE8_DTYPE_F32, dl, NULL, 0, 0}, .rhs = {MOE8_DTYPE_F32, L->w[MOE8_W_ROUTER], NULL, 0, 0},
                             .rhs_transposed = true, .out_dtype = MOE8_DTYPE_F32, .out = tmp};
    st = moe8_gmm(&a);
    for (int64_t i = 0; st == MOE8_OK && i < Tl * D; i++) gr->dx[i] += tmp[i];
  }
  free(acc); free(tmp);
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
  return ep->mode == MOE8_EP_ALLTOALL ? moe8__a2a_forward(ep, x, Tl, out, aux) : ring_forward(ep, x, Tl, out, aux);
}

moe8_status moe8_ep_backward(moe8_ep *ep, const float *x, int64_t Tl, const float *dout, const moe8_layer_grads *gr) {
  if (!ep || !gr) return moe8__fail(MOE8_ERR_INVALID_ARG, "ep backward: NULL argument");
  const moe8_status fst = moe8__check_backward_form(ep->L, "ep backward", false);
  if (fst != MOE8_OK) return fst;
  return ep->mode == MOE8_EP_ALLTOALL ? moe8__a2a_backward(ep, x, Tl, dout, gr) : ring_backward(ep, x, Tl, dout, gr);
}

moe8_ep_mode moe8_ep_get_mode(const moe8_ep *ep) { return ep ? ep->mode : MOE8_EP_RING; }
