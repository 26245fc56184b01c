/*
** ep_internal.h — the expert-parallel object and what its two modes share
** (docs/parallelism.md), in ep_common.c: the ring of experts (ep_ring.c) and
** the all-to-all dispatch (ep_a2a.c) call it, never ep.c (the object, which
** picks the mode) and never each other.  Both call the layer's own phases
** (moe/layer_internal.h) on the same rows in the same order as the single
** process, which is what makes their bytes equal to it.
*/
#ifndef MOE8_EP_INTERNAL_H
#define MOE8_EP_INTERNAL_H

#include "comm.h"
#include "../moe/layer_internal.h"

typedef struct ring_state ring_state;
typedef struct a2a_state a2a_state;

/* p = malloc(n elements, with slack); clears the caller's `ok` on failure. */
#define ALLOC(p, n) do { (p) = malloc(sizeof(*(p)) * (size_t)(n) + 64); if (!(p)) ok = false; } while (0)

struct moe8_ep {
  moe8_layer   *L;
  moe8_comm    *c;
  moe8_ep_mode  mode;
  ring_state   *ring;          /* the ring's saved forward (ep_ring.c) */
  a2a_state    *a2a;           /* the all-to-all mode's (ep_a2a.c) */
  int           P, r;
  int64_t       Eloc, g0;
  moe8_ep_stats st;
  int64_t       Tl, T;         /* this rank's and all ranks' tokens of the last forward */
  int64_t      *Toff;          /* [P + 1]: rank q holds global tokens [Toff[q], Toff[q + 1]) */
  bool          have_forward;
  /* Gemma-4's norms (moe8_layer_config router_norm, expert_scale, in_norm,
  ** out_norm) on this rank's tokens, kept by the forward for the backward:
  ** the router's and the experts' inputs [Tl, D], the output before its
  ** norm [Tl, D], the routing weights before the per-expert scale [Tl, K]
  ** (NULL: the layer has no such norm). */
  float        *nxr, *nxe, *nyb, *nwn;
};


double      moe8__ep_now(void);
/* Every rank learns every rank's status; the first failure is returned on
** all of them with its rank and message. */
moe8_status moe8__ep_agree(moe8_ep *ep, moe8_status st);
/* All-gather of each rank's Tl rows of row_bytes (Toff must be set). */
moe8_status moe8__ep_allgather_rows(moe8_ep *ep, const void *send, size_t row_bytes, void *recv);
/* The shared expert on T tokens of x: forward, then (dout non-NULL) its
** backward adding to dx[T, D] and the grads; else out += its output. */
moe8_status moe8__ep_shared_run(moe8_ep *ep, const float *x, int64_t T, float *out, const float *dout, float *dx,
                                const moe8_layer_grads *gr);
/* The opening of both modes' forwards: every rank checks its input (and
** has the layer's weights quantized) and agrees; the stats cleared; the
** token counts all-gathered into Toff (global token order is rank order),
** T and Tl.  The last forward is gone from here on, even on failure. */
moe8_status moe8__ep_begin_forward(moe8_ep *ep, const float *x, int64_t Tl, const int32_t *tok, const float *out);
/* Backward pieces both modes run, in this order: check the input, agree
** and zero the grads; after
** the router backward (dl [Tl, E]), the dWr relay in rank order and the
** router's part of dx; then the shared expert (all token rows gathered,
** and dout's when Dg is NULL; the single-process shared backward on
** them; this rank's dx rows added). */
moe8_status moe8__ep_begin_backward(moe8_ep *ep, const float *x, int64_t Tl, const float *dout, const moe8_layer_grads *gr);
/* x: the router's input, dout: the gradient at the block's output before
** Gemma-4's output norm, dx: where the router's part of the input gradient
** goes (NULL: nowhere). */
moe8_status moe8__ep_router_tail(moe8_ep *ep, const float *x, int64_t Tl, const float *dl, const float *dout, float *dx,
                                 const moe8_layer_grads *gr);
/* x: the experts' input, dout and Dg as the router tail's, dx: where the
** shared expert's part of the input gradient is added (NULL: nowhere). */
moe8_status moe8__ep_shared_backward(moe8_ep *ep, const float *x, int64_t Tl, const float *dout, const float *Dg, float *dx,
                                     const moe8_layer_grads *gr);
/* Gemma-4's norms under expert parallelism, the single process's functions
** on this rank's rows (each a no-op for a layer without them):
** norms_in: the router's and the experts' inputs (x itself without the
** norms), kept in ep; scale_weights: the routing weights w [Tl, K] of ids
** times the per-expert scale (the weights before it kept); norm_out: the
** output's norm on out [Tl, D] (what it normed kept); norm_dout: *dz the
** gradient before the output norm (NULL without it; the caller frees it);
** scale_dw: the weight gradients dw [Tl, K] times the per-expert scale,
** *dwp the gradients before it (NULL without it; the caller frees it);
** norms_tail: the four vectors' gradients, one f32 chain per element over
** the global token order relayed over the ranks in order, and the input
** gradients dxe (the experts') and dxr (the router's, either NULL) through
** their norms into gr->dx.
** norm_grads_open: a backward's buffers for the norms (both modes): dz
** (norm_dout's), the experts' and the router's input gradients apart
** (dxe, dxr: own zeroed buffers with the input norms, else gr->dx) and
** the inputs they saw (xe, xr: the normed rows, else x); *g is set even on
** failure, and norm_grads_close frees what it holds. */
typedef struct moe8__ep_norm_grads {
  float       *dz, *dxe_b, *dxr_b; /* owned (NULL when the layer has no such norm) */
  float       *dxe, *dxr;
  const float *xe, *xr;
} moe8__ep_norm_grads;
moe8_status moe8__ep_norm_grads_open(moe8_ep *ep, const float *x, int64_t Tl, const float *dout, const moe8_layer_grads *gr,
                                     moe8__ep_norm_grads *g);
void        moe8__ep_norm_grads_close(moe8__ep_norm_grads *g);
moe8_status moe8__ep_norms_in(moe8_ep *ep, const float *x, int64_t Tl, const float **xr, const float **xe);
moe8_status moe8__ep_scale_weights(moe8_ep *ep, int64_t Tl, const int32_t *ids, float *w);
moe8_status moe8__ep_norm_out(moe8_ep *ep, int64_t Tl, float *out);
moe8_status moe8__ep_norm_dout(moe8_ep *ep, int64_t Tl, const float *dout, float **dz);
moe8_status moe8__ep_scale_dw(moe8_ep *ep, int64_t Tl, const int32_t *ids, float *dw, float **dwp);
moe8_status moe8__ep_norms_tail(moe8_ep *ep, const float *x, int64_t Tl, const float *dout, const int32_t *ids, const float *dwp,
                                const float *dxe, const float *dxr, const moe8_layer_grads *gr);
void        moe8__ep_norms_free(moe8_ep *ep);
/* The ring of experts (ep_ring.c). */
moe8_status moe8__ring_forward(moe8_ep *ep, const float *x, int64_t Tl, const int32_t *tok, float *out, float *aux);
moe8_status moe8__ring_backward(moe8_ep *ep, const float *x, int64_t Tl, const float *dout, const moe8_layer_grads *gr);
void        moe8__ring_free(moe8_ep *ep);
/* The all-to-all mode (ep_a2a.c). */
moe8_status moe8__a2a_forward(moe8_ep *ep, const float *x, int64_t Tl, const int32_t *tok, float *out, float *aux);
moe8_status moe8__a2a_backward(moe8_ep *ep, const float *x, int64_t Tl, const float *dout, const moe8_layer_grads *gr);
void        moe8__a2a_free(moe8_ep *ep);

#endif
