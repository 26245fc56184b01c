/*
** act_ref.c — reference kernels of the layer's elementwise and router
** passes: SwiGLU and the router logits.  Plain C with the roundings spelled
** out (no contraction: the build passes -ffp-contract=off); every ISA's
** version must give these bytes.
*/
#include "ref.h"

static inline float silu(float g) { return g / (1.0f + moe8__expf(-g)); }

void moe8__ref_swiglu(float *h, const float *g, const float *u, size_t n) {
  for (size_t i = 0; i < n; i++) h[i] = silu(g[i]) * u[i];
}

void moe8__ref_router_logits(float *logits, const float *x, const float *wr, int64_t T, int64_t D, int64_t E) {
  for (int64_t t = 0; t < T; t++) {
    float *l = logits + t * E;
    for (int64_t e = 0; e < E; e++) l[e] = 0.0f;
    for (int64_t d = 0; d < D; d++) {
      const float xv = x[t * D + d];
      const float *w = wr + d * E;
      for (int64_t e = 0; e < E; e++) l[e] += xv * w[e];
    }
  }
}
