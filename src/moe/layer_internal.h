/*
** layer_internal.h — the layer object and the phases of its forward and
** backward, shared by the single-process layer (layer.c) and the
** expert-parallel layer (ep/ep.c).  Both run exactly these functions on the
** same rows in the same order, which is what makes expert parallelism give
** the single-process bytes.
*/
#ifndef MOE8_LAYER_INTERNAL_H
#define MOE8_LAYER_INTERNAL_H

#include "../core/internal.h"

struct moe8_layer {
  moe8_layer_config cfg;
  moe8_rule         rule;           /* a copy; has_rule says if valid          */
  bool              has_rule;
  char              module_path[256];
  moe8_quant_spec   wspec, aspec;   /* weight / activation specs               */
  bool              wq, aq;         /* weights / activations quantized         */
  bool              before_sort;
  bool              prepared;
  char              describe[256];
  /* f32 masters */
  float *w[MOE8_W_COUNT];
  size_t n[MOE8_W_COUNT];
  /* expert weights as the kernels consume them */
  float   *wgu_f32;                 /* [E, D, 2F] fused masters               */
  uint8_t *wgu_q, *wd_q;            /* quantized values                        */
  float   *wgu_s, *wd_s;            /* [E, nb, 1, N] scales                    */
  uint8_t *wgu_pk, *wd_pk;          /* FP8 values packed at prepare (moe8_gmm_pack_rhs), or NULL */
};

/* Expert part of the forward for the G groups starting at expert g0, whose
** rows (gsz[G] of them, consecutive) are the inputs xs (f32) and, when the
** rule quantizes activations, xsq/sxs.  Writes gu [rows, 2F], h [rows, F],
** hq/sh (quantized h) and y [rows, D]. */
moe8_status moe8__experts_forward(const moe8_layer *L, int64_t rows, const int32_t *gsz, int64_t g0, int64_t G, float *xs,
                                  const uint8_t *xsq, const float *sxs, float *gu, float *h, uint8_t *hq, float *sh, float *y,
                                  void *scratch, size_t scratch_bytes);

/* dy[p] = w[t,j] · dout[t] and dwrow[p] = dout[t] · y[p] for rows p, with
** t = token_of[p] and j = slot_of[p] (w indexed t·K + j, dout by t). */
void moe8__dy_dw(int64_t rows, const int32_t *token_of, const int32_t *slot_of, const float *w, int64_t K,
                 const float *dout, const float *y, int64_t D, float *dy, float *dwrow);

/* Expert part of the backward for groups [g0, g0 + G): from dy [rows, D]
** and the saved xsq/sxs or xs, hq/sh or h, gu, writes dxs [rows, D] and
** the groups' slices of dwg, dwu, dwd (full-size arrays; may be NULL). */
moe8_status moe8__experts_backward(const moe8_layer *L, int64_t rows, const int32_t *gsz, int64_t g0, int64_t G, float *dy,
                                   const float *xs, const uint8_t *xsq, const float *sxs, const float *h, const uint8_t *hq,
                                   const float *sh, const float *gu, float *dxs, float *dwg, float *dwu, float *dwd);

/* The aux loss from all T tokens' ids [T·K] and scores [T, E]; f[E] gets
** the fractions f_e (for the backward).  Sums run in token order. */
float moe8__aux_loss(const moe8_layer *L, int64_t T, const int32_t *ids, const float *scores, double *f);

/* d logits [T, E] of the local tokens from dw [T·K] (d loss / d weight),
** their scores and ids, and the aux term α·E·f_e / T_total. */
void moe8__router_backward(const moe8_layer *L, int64_t T, const float *scores, const int32_t *ids, const float *dw,
                           const double *f, int64_t T_total, float *dl);

/* acc[D, E] += Σ_t x[t]ᵀ · dl[t], each element one chain in t order, so a
** relay over token shards in order gives the single-process bytes. */
void moe8__router_wgrad(float *acc, const float *x, const float *dl, int64_t T, int64_t D, int64_t E);

/* Quantizes the expert weights from the masters (unless prepared). */
moe8_status moe8__layer_quantize_weights(moe8_layer *L);

#endif
