/*
** act_avx512.c — AVX-512 SwiGLU and router logits.  Each lane does the
** reference's operations in the reference's order (kernels/ref/act_ref.c):
** the same multiplies, adds and IEEE divisions, no FMA, so the bytes are
** the reference's for every input.
*/
#include "../ref/ref.h"

#include <immintrin.h>

/* moe8__expf, 16 lanes.  The clamp keeps NaN as the scalar code does
** (max/min return their second operand when one is NaN). */
static inline __m512 expf16(__m512 x) {
  x = _mm512_min_ps(_mm512_set1_ps(88.7f), _mm512_max_ps(_mm512_set1_ps(-87.3f), x));
  const __m512 big = _mm512_set1_ps(12582912.0f);
  const __m512 n = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)), big), big);
  const __m512 r = _mm512_sub_ps(_mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(0.693359375f))),
                                 _mm512_mul_ps(n, _mm512_set1_ps(-2.12194440e-4f)));
  __m512 p = _mm512_set1_ps(1.98412698e-4f);
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.38888889e-3f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(8.33333333e-3f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(4.16666667e-2f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.66666667e-1f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(0.5f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.0f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.0f));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

static inline __m512 swiglu16(__m512 g, __m512 u) {
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 neg = _mm512_xor_ps(g, _mm512_set1_ps(-0.0f));
  return _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(one, expf16(neg))), u);
}

static void swiglu(float *h, const float *g, const float *u, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(h + i, swiglu16(_mm512_loadu_ps(g + i), _mm512_loadu_ps(u + i)));
  if (i < n) {
    const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(h + i, m, swiglu16(_mm512_maskz_loadu_ps(m, g + i), _mm512_maskz_loadu_ps(m, u + i)));
  }
}

/* Eight tokens at a time (eight independent chains per weight load), 16
** experts per vector; each (t, e) is one chain in increasing d. */
static void router_logits(float *logits, const float *x, const float *wr, int64_t T, int64_t D, int64_t E) {
  enum { TB = 8 };
  for (int64_t e0 = 0; e0 < E; e0 += 16) {
    const __mmask16 m = E - e0 >= 16 ? 0xFFFF : (__mmask16)((1u << (E - e0)) - 1);
    int64_t t = 0;
    for (; t + TB <= T; t += TB) {
      __m512 acc[TB];
      for (int i = 0; i < TB; i++) acc[i] = _mm512_setzero_ps();
      for (int64_t d = 0; d < D; d++) {
        const __m512 w = _mm512_maskz_loadu_ps(m, wr + d * E + e0);
        for (int i = 0; i < TB; i++) acc[i] = _mm512_add_ps(acc[i], _mm512_mul_ps(_mm512_set1_ps(x[(t + i) * D + d]), w));
      }
      for (int i = 0; i < TB; i++) _mm512_mask_storeu_ps(logits + (t + i) * E + e0, m, acc[i]);
    }
    for (; t < T; t++) {
      __m512 acc = _mm512_setzero_ps();
      for (int64_t d = 0; d < D; d++)
        acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_set1_ps(x[t * D + d]), _mm512_maskz_loadu_ps(m, wr + d * E + e0)));
      _mm512_mask_storeu_ps(logits + t * E + e0, m, acc);
    }
  }
}

void moe8__act_init_avx512(moe8__ktable *k) {
  k->swiglu        = swiglu;
  k->router_logits = router_logits;
}
