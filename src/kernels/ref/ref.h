/*
** ref.h — the reference kernels: scalar C, the ground truth every ISA's
** kernels are tested against.  Their contracts are those of the kernel
** table entries in core/internal.h.
*/
#ifndef MOE8_REF_H
#define MOE8_REF_H

#include <string.h>
#include "../../core/internal.h"

void   moe8__ref_cvt_f32_f8(uint8_t *dst, const float *src, size_t n, moe8_dtype type, bool sat);
void   moe8__ref_cvt_f8_f32(float *dst, const uint8_t *src, size_t n, moe8_dtype type);
void   moe8__ref_cvt_f8_bf16(uint16_t *dst, const uint8_t *src, size_t n, moe8_dtype type);
void   moe8__ref_cvt_f32_bf16(uint16_t *dst, const float *src, size_t n);
void   moe8__ref_cvt_bf16_f32(float *dst, const uint16_t *src, size_t n);
size_t moe8__ref_cvt_f32_i8(int8_t *dst, const float *src, size_t n);
float  moe8__ref_absmax(const float *x, size_t n, size_t *nonfinite);
size_t moe8__ref_absmax_acc(float *amax, const float *x, size_t n);
void   moe8__ref_quant_div(void *q, const float *x, const float *s, size_t s_step, size_t n,
                           moe8_dtype qtype);
void   moe8__ref_dequant(float *y, const void *q, const float *s, size_t s_step, size_t n, moe8_dtype qtype);
void   moe8__ref_swiglu(float *h, const float *g, const float *u, size_t n);
void   moe8__ref_swiglu_clamp(float *h, const float *g, const float *u, size_t n, float alpha, float limit);
void   moe8__ref_swiglu_limit(float *h, const float *g, const float *u, size_t n, float limit);
void   moe8__ref_swiglu_post(float *h, const float *g, const float *u, size_t n, float limit);
void   moe8__ref_swiglu_softcap(float *h, const float *g, const float *u, size_t n, float cg, float cu);
void   moe8__ref_geglu(float *h, const float *g, const float *u, size_t n);
void   moe8__ref_relu2(float *h, const float *u, size_t n);
void   moe8__ref_relu(float *h, const float *u, size_t n);
void   moe8__ref_mx4_rows(const float *x, int64_t rows, int64_t ldx, int64_t K, const uint8_t *blk, const uint8_t *sc, int64_t n0,
                          int64_t n1, float *out, int64_t ldo, int64_t split);
void   moe8__ref_mx4_rows_i8(const uint8_t *xp, int64_t rows, int64_t ldxp, int64_t K, const uint8_t *blk, const uint8_t *sc, int64_t n0,
                             int64_t n1, float *out, int64_t ldo, int64_t split);
/* 2^(s - 127) as f32 (the E8M0 scale byte s < 255; s = 0 is the
** subnormal 2^-127). */
static inline float moe8__e8m0(uint8_t s) {
  const uint32_t b = s ? (uint32_t)s << 23 : 0x00400000u;
  float f;
  memcpy(&f, &b, 4);
  return f;
}
void   moe8__ref_router_logits(float *logits, const float *x, const float *wr, int64_t T, int64_t D, int64_t E);

#endif
