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
moe8_status moe8__ep_router_tail(moe8_ep *ep, const float *x, int64_t Tl, const float *dl, const float *dout, const moe8_layer_grads *gr);
moe8_status moe8__ep_shared_backward(moe8_ep *ep, const float *x, int64_t Tl, const float *dout, const float *Dg,
                                     const moe8_layer_grads *gr);
/* The ring of experts (ep_ring.c). */
moe8_status moe8__ring_forward(moe8_ep *ep, const float *x, int64_t Tl, const int32_t *tok, float *out, float *aux);
moe8_status moe8__ring_backward(moe8_ep *ep, const float *x, int64_t Tl, const float *dout, const moe8_layer_grads *gr);
void        moe8__ring_free(moe8_ep *ep);
/* The all-to-all mode (ep_a2a.c). */
moe8_status moe8__a2a_forward(moe8_ep *ep, const float *x, int64_t Tl, const int32_t *tok, float *out, float *aux);
moe8_status moe8__a2a_backward(moe8_ep *ep, const float *x, int64_t Tl, const float *dout, const moe8_layer_grads *gr);
void        moe8__a2a_free(moe8_ep *ep);

#endif
