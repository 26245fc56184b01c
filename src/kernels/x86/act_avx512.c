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

/* One tile: nc columns (n .. n + nc) x rr rows over all nb blocks; xe/xo
** the rows' even and odd elements; fs the columns' block scales.  A
** block's weights: lut values of the low (even k) and high (odd k)
** nibbles of its 16 bytes, times its scale. */
static inline __attribute__((always_inline)) void mx4_tile(const float *xe, const float *xo, int64_t ldh, int rr, int nc, const uint8_t *blk,
                                                           const float *fs, int64_t nb, __m512 lut, float *res /* [nc][rr] */) {
  __m512 acc[4][2];
  for (int c = 0; c < 4; c++)
    for (int r = 0; r < 2; r++) acc[c][r] = _mm512_setzero_ps();
  const __m512i m15 = _mm512_set1_epi32(15);
  for (int64_t b = 0; b < nb; b++) {
    __m512 ve[2], vo[2];
    for (int r = 0; r < rr; r++) {
      ve[r] = _mm512_loadu_ps(xe + r * ldh + b * 16);
      vo[r] = _mm512_loadu_ps(xo + r * ldh + b * 16);
    }
    if ((b & 3) == 0) /* the tile two ahead, a line per column every four blocks (decode streams from memory) */
      for (int c = 0; c < nc; c++) _mm_prefetch((const char *)(blk + ((int64_t)(c + 8) * nb + b) * 16), _MM_HINT_T0);
    for (int c = 0; c < nc; c++) {
      const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(blk + ((int64_t)c * nb + b) * 16)));
      const __m512 ls = _mm512_mul_ps(lut, _mm512_set1_ps(fs[c * nb + b]));
      const __m512 we = _mm512_permutexvar_ps(_mm512_and_si512(v, m15), ls), wo = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), ls);
      for (int r = 0; r < rr; r++) {
        acc[c][r] = _mm512_fmadd_ps(we, ve[r], acc[c][r]);
        acc[c][r] = _mm512_fmadd_ps(wo, vo[r], acc[c][r]);
      }
    }
  }
  for (int c = 0; c < nc; c++)
    for (int r = 0; r < rr; r++) res[c * 2 + r] = fold16(acc[c][r]);
}

enum { MX_KMAX = 8192 };

static void mx4_rows(const float *x, int64_t rows, int64_t ldx, int64_t K, const uint8_t *blk, const uint8_t *sc, int64_t n0, int64_t n1,
                     float *out, int64_t ldo, int64_t split) {
  if (K > MX_KMAX) { moe8__ref_mx4_rows(x, rows, ldx, K, blk, sc, n0, n1, out, ldo, split); return; }
  const int64_t nb = K / 32;
  const __m512 lut = _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f);
  const __m512i ie = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i io = _mm512_add_epi32(ie, _mm512_set1_epi32(1));
  float xe[2][MX_KMAX / 2], xo[2][MX_KMAX / 2], fs[4 * (MX_KMAX / 32)], res[8];
  for (int64_t p0 = 0; p0 < rows; p0 += 2) {
    const int rr = rows - p0 < 2 ? (int)(rows - p0) : 2;
    for (int r = 0; r < rr; r++) /* even and odd elements of the row */
      for (int64_t k = 0; k < K; k += 32) {
        const __m512 a = _mm512_loadu_ps(x + (p0 + r) * ldx + k), c = _mm512_loadu_ps(x + (p0 + r) * ldx + k + 16);
        _mm512_storeu_ps(&xe[r][k / 2], _mm512_permutex2var_ps(a, ie, c));
        _mm512_storeu_ps(&xo[r][k / 2], _mm512_permutex2var_ps(a, io, c));
      }
    for (int64_t n = n0; n < n1; n += 4) {
      const int nc = n1 - n < 4 ? (int)(n1 - n) : 4;
      for (int c = 0; c < nc; c++)
        for (int64_t b = 0; b < nb; b++) fs[c * nb + b] = moe8__e8m0(sc[(n + c) * nb + b]);
      const uint8_t *bn = blk + n * nb * 16;
      if (nc == 4 && rr == 1) mx4_tile(xe[0], xo[0], MX_KMAX / 2, 1, 4, bn, fs, nb, lut, res);
      else if (nc == 4 && rr == 2) mx4_tile(xe[0], xo[0], MX_KMAX / 2, 2, 4, bn, fs, nb, lut, res);
      else mx4_tile(xe[0], xo[0], MX_KMAX / 2, rr, nc, bn, fs, nb, lut, res);
      for (int c = 0; c < nc; c++) {
        const int64_t nn = n + c, col = split > 0 ? nn / 2 + ((nn & 1) ? split : 0) : nn;
        for (int r = 0; r < rr; r++) out[(p0 + r) * ldo + col] = res[c * 2 + r];
      }
    }
  }
}

void moe8__act_init_avx512(moe8__ktable *k) {
  k->mx4_rows      = mx4_rows;
  k->swiglu        = swiglu;
  k->router_logits = router_logits;
}
