/*
** gmm_ref.c — the reference grouped-matmul block kernel: the definition of
** moe8__gmm_block (kernels/gmm.h) written as plainly as possible, sums in
** increasing k.  Every ISA's kernel is tested against it.
*/
#include "../gmm.h"

static inline float ldf(const void *p, moe8_dtype t, int64_t i) {
  switch (t) {
    case MOE8_DTYPE_F32: return ((const float *)p)[i];
    case MOE8_DTYPE_BF16: return moe8_bf16_to_f32(((const uint16_t *)p)[i]);
    case MOE8_DTYPE_F8E4M3: return moe8_f8e4m3_to_f32(((const uint8_t *)p)[i]);
    case MOE8_DTYPE_F8E5M2: return moe8_f8e5m2_to_f32(((const uint8_t *)p)[i]);
    default: return (float)((const int8_t *)p)[i];
  }
}

void moe8__gmm_block_ref(const moe8__gmm_block *b) {
  const bool ints = b->lt == MOE8_DTYPE_I8 && b->rt == MOE8_DTYPE_I8;
  for (int64_t m = b->m0; m < b->m1; m++)
    for (int64_t n = b->n0; n < b->n1; n++) {
      float acc = 0.0f;
      for (int64_t blk = 0; blk < b->nbk; blk++) {
        const int64_t k0 = blk * b->kb, k1 = k0 + b->kb < b->K ? k0 + b->kb : b->K;
        float bsum;
        if (ints) {
          const int8_t *a = (const int8_t *)b->lhs + m * b->K, *w = b->rhs;
          int32_t s = 0;
          for (int64_t k = k0; k < k1; k++)
            s += (int32_t)a[k] * (int32_t)(b->rhs_pk ? (int8_t)b->rhs_pk[moe8__pk_offset_i8(b->K, b->N, k, n)] : w[k * b->N + n]);
          bsum = (float)s;
        } else {
          float s = 0.0f;
          for (int64_t k = k0; k < k1; k++) {
            s += ldf(b->lhs, b->lt, m * b->K + k) * moe8__gmm_rhs_at(b, k, n);
          }
          bsum = s;
        }
        const float sc = moe8__gmm_ls(b, m, blk) * moe8__gmm_rs(b, blk, n);
        acc = acc + bsum * sc;
      }
      if (b->ot == MOE8_DTYPE_F32) ((float *)b->out)[m * b->N + n] = acc;
      else ((uint16_t *)b->out)[m * b->N + n] = moe8_f32_to_bf16(acc);
    }
}
