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

/* ---- MXFP4 rows (the contract in core/internal.h; the order is
** moe8__ref_mx4_rows's) ---------------------------------------------------- */
static inline float fold16(__m512 v) {
  __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  b = _mm_add_ps(b, _mm_movehl_ps(b, b));
  b = _mm_add_ss(b, _mm_shuffle_ps(b, b, 1));
  return _mm_cvtss_f32(b);
}

/* The 32 weights of one block, code x scale, as two vectors (k 0..15, 16..31). */
static inline void mx4_block(const uint8_t *q, uint8_t s, __m512 lut, __m512 *w0, __m512 *w1) {
  const __m128i b = _mm_loadu_si128((const __m128i *)q), m = _mm_set1_epi8(15);
  const __m128i lo = _mm_and_si128(b, m), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
  const __m512 sv = _mm512_set1_ps(moe8__e8m0(s));
  *w0 = _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)), lut), sv);
  *w1 = _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_unpackhi_epi8(lo, hi)), lut), sv);
}

static void mx4_rows(const float *x, int64_t rows, int64_t ldx, int64_t K, const uint8_t *blk, const uint8_t *sc, int64_t n0, int64_t n1,
                     float *out, int64_t ldo, int64_t split) {
  const int64_t nb = K / 32;
  const __m512 lut = _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f);
  enum { NC = 4, RC = 2 }; /* columns x rows per tile: 8 accumulators */
  for (int64_t p0 = 0; p0 < rows; p0 += RC) {
    const int rr = rows - p0 < RC ? (int)(rows - p0) : RC;
    int64_t n = n0;
    for (; n < n1; n += NC) {
      const int nc = n1 - n < NC ? (int)(n1 - n) : NC;
      __m512 acc[NC][RC];
      for (int c = 0; c < NC; c++)
        for (int r = 0; r < RC; r++) acc[c][r] = _mm512_setzero_ps();
      for (int64_t b = 0; b < nb; b++) {
        __m512 xa[RC], xb[RC];
        for (int r = 0; r < rr; r++) {
          xa[r] = _mm512_loadu_ps(x + (p0 + r) * ldx + b * 32);
          xb[r] = _mm512_loadu_ps(x + (p0 + r) * ldx + b * 32 + 16);
        }
        for (int c = 0; c < nc; c++) {
          __m512 w0, w1;
          mx4_block(blk + ((n + c) * nb + b) * 16, sc[(n + c) * nb + b], lut, &w0, &w1);
          for (int r = 0; r < rr; r++) {
            acc[c][r] = _mm512_fmadd_ps(w0, xa[r], acc[c][r]);
            acc[c][r] = _mm512_fmadd_ps(w1, xb[r], acc[c][r]);
          }
        }
      }
      for (int c = 0; c < nc; c++) {
        const int64_t nn = n + c, col = split > 0 ? nn / 2 + ((nn & 1) ? split : 0) : nn;
        for (int r = 0; r < rr; r++) out[(p0 + r) * ldo + col] = fold16(acc[c][r]);
      }
    }
  }
}

void moe8__act_init_avx512(moe8__ktable *k) {
  k->mx4_rows      = mx4_rows;
  k->swiglu        = swiglu;
  k->router_logits = router_logits;
}
