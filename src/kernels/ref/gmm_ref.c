/*
** gmm_ref.c — the reference grouped-matmul block kernel: the definition of
** moe8__gmm_block (kernels/gmm.h) written as plainly as possible, sums in
** increasing k, or in the canonical order (gmm.h) when the block asks for
** it.  Every ISA's kernel is tested against it.
*/
#include "../gmm.h"
#include "../amx_model.h"

/* The canonical block sum of (m, n) over [k0, k1) (gmm.h). */
static float canon_sum(const moe8__gmm_block *b, int64_t m, int64_t n, int64_t k0, int64_t k1) {
  float s = 0.0f;
  for (int64_t p0 = k0; p0 < k1; p0 += 32) {
    float even = 0.0f, odd = 0.0f;
    for (int64_t k = p0; k < p0 + 32 && k < k1; k++) {
      const float a = moe8__ftz(moe8__gmm_ld(b->lhs, b->lt, m * b->K + k)), w = moe8__ftz(moe8__gmm_rhs_at(b, k, n));
      const float p = moe8__ftz(a * w);
      if ((k - p0) % 2 == 0) even = moe8__ftz(even + p);
      else odd = moe8__ftz(odd + p);
    }
    s = moe8__ftz(s + moe8__ftz(even + odd));
  }
  return s;
}

void moe8__gmm_block_ref(const moe8__gmm_block *b) {
  const bool ints = b->lt == MOE8_DTYPE_I8 && b->rt == MOE8_DTYPE_I8;
  for (int64_t m = b->m0; m < b->m1; m++)
    for (int64_t n = b->n0; n < b->n1; n++) {
      float acc = 0.0f;
      for (int64_t blk = 0; blk < b->nbk; blk++) {
        const int64_t k0 = blk * b->kb, k1 = k0 + b->kb < b->K ? k0 + b->kb : b->K;
        float bsum;
        if (b->canon) {
          bsum = canon_sum(b, m, n, k0, k1);
        } else if (ints) {
          const int8_t *a = (const int8_t *)b->lhs + m * b->K;
          int32_t s = 0;
          for (int64_t k = k0; k < k1; k++)
            s += (int32_t)a[k] * (int32_t)moe8__gmm_rhs_at(b, k, n); /* an i8 value, exact in f32 */
          bsum = (float)s;
        } else {
          float s = 0.0f;
          for (int64_t k = k0; k < k1; k++) {
            s += moe8__gmm_ld(b->lhs, b->lt, m * b->K + k) * moe8__gmm_rhs_at(b, k, n);
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
