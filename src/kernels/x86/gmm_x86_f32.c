/*
** gmm_x86_f32.c — the f32 FMA microkernel of the panel path (the avx512 family).
*/
#include "gmm_x86.h"

/* ---- microkernels: MR rows x 32 columns, S loaded and stored ---------- */
INLINE void ukr_f32(const int mr, const float *A, int64_t lda, const float *B, int64_t kc, float *S) {
  __m512 c[MR][2];
  for (int i = 0; i < mr; i++) { c[i][0] = _mm512_loadu_ps(S + i * NT); c[i][1] = _mm512_loadu_ps(S + i * NT + 16); }
  for (int64_t k = 0; k < kc; k++) {
    const __m512 b0 = _mm512_loadu_ps(B + k * NT), b1 = _mm512_loadu_ps(B + k * NT + 16);
    for (int i = 0; i < mr; i++) {
      const __m512 a = _mm512_set1_ps(A[i * lda + k]);
      c[i][0] = _mm512_fmadd_ps(a, b0, c[i][0]);
      c[i][1] = _mm512_fmadd_ps(a, b1, c[i][1]);
    }
  }
  for (int i = 0; i < mr; i++) { _mm512_storeu_ps(S + i * NT, c[i][0]); _mm512_storeu_ps(S + i * NT + 16, c[i][1]); }
}

void ukr_f32_any(int mr, const float *A, int64_t lda, const float *B, int64_t k, float *S) {
  BY_ROWS(mr, ukr_f32, A, lda, B, k, S)
}

