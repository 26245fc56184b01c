/*
** act_avx512.c — AVX-512 SwiGLU and router logits.  Each lane does the
** reference's operations in the reference's order (kernels/ref/act_ref.c):
** the same multiplies, adds and IEEE divisions, no FMA, so the bytes are
** the reference's for every input.
*/
#include "../ref/ref.h"

#include <immintrin.h>

#include "dot_avx512.h"
/* The MXFP4 decode kernels' prefetch, by vendor as the packed FP8 ones
** (gmm_x86.h): on Intel further ahead into L2 (measured), on AMD Zen the
** nearer prefetch into L1 it was tuned with. */
static inline bool mx_far(void) { return (moe8__cpu_features() & MOE8__CPU_INTEL) != 0; }
static inline __attribute__((always_inline)) void mx_prefetch(const void *p, bool far) {
  if (far) _mm_prefetch((const char *)p, _MM_HINT_T1);
  else _mm_prefetch((const char *)p, _MM_HINT_T0);
}

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

static inline __m512 silu16(__m512 g) {
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 neg = _mm512_xor_ps(g, _mm512_set1_ps(-0.0f));
  return _mm512_div_ps(g, _mm512_add_ps(one, expf16(neg)));
}

static inline __m512 swiglu16(__m512 g, __m512 u) { return _mm512_mul_ps(silu16(g), u); }

static void swiglu(float *h, const float *g, const float *u, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(h + i, swiglu16(_mm512_loadu_ps(g + i), _mm512_loadu_ps(u + i)));
  if (i < n) {
    const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(h + i, m, swiglu16(_mm512_maskz_loadu_ps(m, g + i), _mm512_maskz_loadu_ps(m, u + i)));
  }
}

/* The reference's clamps by compare and blend (a NaN g or u kept: an
** ordered compare is false on NaN, so the lane keeps its input, as the
** scalar comparisons and torch.clamp do). */
static inline void clamp_gu(__m512 *g, __m512 *u, __m512 limit) {
  const __m512 nl = _mm512_xor_ps(limit, _mm512_set1_ps(-0.0f));
  *g = _mm512_mask_mov_ps(*g, _mm512_cmp_ps_mask(*g, limit, _CMP_GT_OQ), limit);
  const __m512 u0 = *u;
  *u = _mm512_mask_mov_ps(u0, _mm512_cmp_ps_mask(u0, limit, _CMP_GT_OQ), limit);
  *u = _mm512_mask_mov_ps(*u, _mm512_cmp_ps_mask(u0, nl, _CMP_LT_OQ), nl);
}

/* The clamps, then the reference's operations. */
static inline __m512 swiglu_clamp16(__m512 g, __m512 u, __m512 alpha, __m512 limit) {
  const __m512 one = _mm512_set1_ps(1.0f);
  clamp_gu(&g, &u, limit);
  const __m512 e = expf16(_mm512_mul_ps(_mm512_xor_ps(alpha, _mm512_set1_ps(-0.0f)), g));
  return _mm512_mul_ps(_mm512_mul_ps(g, _mm512_div_ps(one, _mm512_add_ps(one, e))), _mm512_add_ps(u, one));
}

/* The same clamps, then swiglu16: the reference's swiglu_limit. */
static inline __m512 swiglu_limit16(__m512 g, __m512 u, __m512 limit) {
  clamp_gu(&g, &u, limit);
  return swiglu16(g, u);
}

static void swiglu_limit(float *h, const float *g, const float *u, size_t n, float limit) {
  const __m512 l = _mm512_set1_ps(limit);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(h + i, swiglu_limit16(_mm512_loadu_ps(g + i), _mm512_loadu_ps(u + i), l));
  if (i < n) {
    const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(h + i, m, swiglu_limit16(_mm512_maskz_loadu_ps(m, g + i), _mm512_maskz_loadu_ps(m, u + i), l));
  }
}

/* silu first, then the same clamps on silu(g) and u: the reference's swiglu_post. */
static inline __m512 swiglu_post16(__m512 g, __m512 u, __m512 limit) {
  __m512 s = silu16(g);
  clamp_gu(&s, &u, limit);
  return _mm512_mul_ps(s, u);
}

static void swiglu_post(float *h, const float *g, const float *u, size_t n, float limit) {
  const __m512 l = _mm512_set1_ps(limit);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(h + i, swiglu_post16(_mm512_loadu_ps(g + i), _mm512_loadu_ps(u + i), l));
  if (i < n) {
    const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(h + i, m, swiglu_post16(_mm512_maskz_loadu_ps(m, g + i), _mm512_maskz_loadu_ps(m, u + i), l));
  }
}

/* moe8__tanhf, 16 lanes: both sides computed, blended where |y| < 0.5
** (ordered: a NaN takes the exp side, as the scalar select does). */
static inline __m512 tanh16(__m512 y) {
  const __m512 sign = _mm512_set1_ps(-0.0f);
  const __m512 a = _mm512_andnot_ps(sign, y), s = _mm512_mul_ps(a, a);
  __m512 p = _mm512_set1_ps(5.90027440e-4f);
  p = _mm512_add_ps(_mm512_mul_ps(p, s), _mm512_set1_ps(-1.45583438e-3f));
  p = _mm512_add_ps(_mm512_mul_ps(p, s), _mm512_set1_ps(3.59212803e-3f));
  p = _mm512_add_ps(_mm512_mul_ps(p, s), _mm512_set1_ps(-8.86323552e-3f));
  p = _mm512_add_ps(_mm512_mul_ps(p, s), _mm512_set1_ps(2.18694885e-2f));
  p = _mm512_add_ps(_mm512_mul_ps(p, s), _mm512_set1_ps(-5.39682540e-2f));
  p = _mm512_add_ps(_mm512_mul_ps(p, s), _mm512_set1_ps(1.33333333e-1f));
  p = _mm512_add_ps(_mm512_mul_ps(p, s), _mm512_set1_ps(-3.33333333e-1f));
  const __m512 small = _mm512_add_ps(a, _mm512_mul_ps(a, _mm512_mul_ps(s, p)));
  const __m512 one = _mm512_set1_ps(1.0f), two = _mm512_set1_ps(2.0f);
  const __m512 big = _mm512_sub_ps(one, _mm512_div_ps(two, _mm512_add_ps(expf16(_mm512_mul_ps(two, a)), one)));
  const __m512 t = _mm512_mask_mov_ps(big, _mm512_cmp_ps_mask(a, _mm512_set1_ps(0.5f), _CMP_LT_OQ), small);
  return _mm512_or_ps(_mm512_andnot_ps(sign, t), _mm512_and_ps(sign, y));
}

static inline __m512 swiglu_softcap16(__m512 g, __m512 u, __m512 cg, __m512 cu) {
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 tg = _mm512_mul_ps(tanh16(_mm512_div_ps(g, cg)), cg), tu = _mm512_mul_ps(tanh16(_mm512_div_ps(u, cu)), cu);
  const __m512 sg = _mm512_div_ps(one, _mm512_add_ps(one, expf16(_mm512_xor_ps(g, _mm512_set1_ps(-0.0f)))));
  return _mm512_mul_ps(_mm512_mul_ps(tg, sg), tu);
}

static void swiglu_softcap(float *h, const float *g, const float *u, size_t n, float cg, float cu) {
  const __m512 a = _mm512_set1_ps(cg), b = _mm512_set1_ps(cu);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(h + i, swiglu_softcap16(_mm512_loadu_ps(g + i), _mm512_loadu_ps(u + i), a, b));
  if (i < n) {
    const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(h + i, m, swiglu_softcap16(_mm512_maskz_loadu_ps(m, g + i), _mm512_maskz_loadu_ps(m, u + i), a, b));
  }
}

/* Gemma-4's GeGLU, the reference's operations per lane. */
static inline __m512 geglu16(__m512 g, __m512 u) {
  const __m512 c = _mm512_mul_ps(_mm512_set1_ps(0.7978845608f),
                                 _mm512_add_ps(g, _mm512_mul_ps(_mm512_set1_ps(0.044715f), _mm512_mul_ps(_mm512_mul_ps(g, g), g))));
  const __m512 half = _mm512_mul_ps(_mm512_set1_ps(0.5f), g);
  return _mm512_mul_ps(_mm512_mul_ps(half, _mm512_add_ps(_mm512_set1_ps(1.0f), tanh16(c))), u);
}

static void geglu(float *h, const float *g, const float *u, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(h + i, geglu16(_mm512_loadu_ps(g + i), _mm512_loadu_ps(u + i)));
  if (i < n) {
    const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(h + i, m, geglu16(_mm512_maskz_loadu_ps(m, g + i), _mm512_maskz_loadu_ps(m, u + i)));
  }
}

/* The reference's relu: u where u < 0 is false (a NaN and -0 kept), else 0. */
static inline __m512 relu16(__m512 u) {
  const __m512 z = _mm512_setzero_ps();
  return _mm512_mask_mov_ps(u, _mm512_cmp_ps_mask(u, z, _CMP_LT_OQ), z);
}

static void relu2(float *h, const float *u, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 r = relu16(_mm512_loadu_ps(u + i));
    _mm512_storeu_ps(h + i, _mm512_mul_ps(r, r));
  }
  if (i < n) {
    const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
    const __m512 r = relu16(_mm512_maskz_loadu_ps(m, u + i));
    _mm512_mask_storeu_ps(h + i, m, _mm512_mul_ps(r, r));
  }
}

static void relu(float *h, const float *u, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(h + i, relu16(_mm512_loadu_ps(u + i)));
  if (i < n) {
    const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(h + i, m, relu16(_mm512_maskz_loadu_ps(m, u + i)));
  }
}

static void swiglu_clamp(float *h, const float *g, const float *u, size_t n, float alpha, float limit) {
  const __m512 a = _mm512_set1_ps(alpha), l = _mm512_set1_ps(limit);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(h + i, swiglu_clamp16(_mm512_loadu_ps(g + i), _mm512_loadu_ps(u + i), a, l));
  if (i < n) {
    const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(h + i, m, swiglu_clamp16(_mm512_maskz_loadu_ps(m, g + i), _mm512_maskz_loadu_ps(m, u + i), a, l));
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

/* The f32 values of 8 E8M0 scale bytes (moe8__e8m0). */
static inline void e8m0_8(float *dst, const uint8_t *src) {
  const __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)src));
  const __m256i f = _mm256_mask_mov_epi32(_mm256_slli_epi32(e, 23), _mm256_cmpeq_epi32_mask(e, _mm256_setzero_si256()),
                                          _mm256_set1_epi32(0x00400000));
  _mm256_storeu_ps(dst, _mm256_castsi256_ps(f));
}

enum { MX_NC = 4, MX_NR = 2 }; /* a tile: up to 4 columns x 2 rows (16 chains) */

/* One tile: columns 0 .. nc - 1 of q (rs bytes a column, moe8__mx4_repack's
** layout) and sc (nb a column) against rows 0 .. rr - 1 of x.  Chains
** a[c][r] (k mod 32 < 16) and b[c][r] (the rest) take one block at a
** time in increasing k.  A group of 8 blocks is two 64-byte loads a
** column: word L of each holds lane L's code for the 8 blocks, nibble j
** for block j, so the code is a shift away and vpermps (which reads 4
** index bits) looks it up in the block's scaled table.  No weight is
** moved between lanes and x is read as it is. */
static inline __attribute__((always_inline)) void mx4_tile(const float *x, int64_t ldx, int rr, int nc, const uint8_t *q,
                                                           int64_t rs, const uint8_t *sc, int64_t nb, __m512 lut, float *res) {
  __m512 a[MX_NC][MX_NR], b[MX_NC][MX_NR];
#pragma GCC unroll 8
  for (int c = 0; c < nc; c++)
#pragma GCC unroll 4
    for (int r = 0; r < rr; r++) {
      a[c][r] = _mm512_setzero_ps();
      b[c][r] = _mm512_setzero_ps();
    }
  const int64_t ng = nb / 8;
  const bool far = mx_far();
  const int64_t pfc = far ? 16 : 4;
  float fs[MX_NC][8];
  for (int64_t g = 0; g < ng; g++) {
#pragma GCC unroll 8
    for (int c = 0; c < nc; c++) {
      e8m0_8(fs[c], sc + c * nb + g * 8);
      /* the lines 16 tiles ahead into L2 (Intel; one before each block
      ** below) or 4 into L1 (decode streams from memory) */
      if (!far) {
        mx_prefetch(q + (c + pfc * nc) * rs + g * 128, far);
        mx_prefetch(q + (c + pfc * nc) * rs + g * 128 + 64, far);
      }
    }
    /* The group's codes stay in registers when they fit beside the
    ** accumulators and one block's x; else they are read from L1 at each
    ** use.  The barrier keeps the compiler from holding more (x of the
    ** whole group, the codes anyway), which would spill the accumulators. */
    const bool hold = nc * (2 + 2 * rr) + 2 * rr <= 26;
    __m512i ua[MX_NC], ub[MX_NC];
#pragma GCC unroll 8
    for (int c = 0; c < MX_NC; c++) {
      ua[c] = hold && c < nc ? _mm512_loadu_si512(q + c * rs + g * 128) : _mm512_setzero_si512();
      ub[c] = hold && c < nc ? _mm512_loadu_si512(q + c * rs + g * 128 + 64) : _mm512_setzero_si512();
    }
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) {
      __asm__ volatile("" ::: "memory");
      if (far && j < 2 * nc) mx_prefetch(q + (j / 2 + pfc * nc) * rs + g * 128 + 64 * (j % 2), far);
      const float *xb = x + (g * 8 + j) * 32;
      __m512 xa[MX_NR], xh[MX_NR];
#pragma GCC unroll 4
      for (int r = 0; r < MX_NR; r++) {
        xa[r] = r < rr ? _mm512_loadu_ps(xb + r * ldx) : _mm512_setzero_ps();
        xh[r] = r < rr ? _mm512_loadu_ps(xb + r * ldx + 16) : _mm512_setzero_ps();
      }
#pragma GCC unroll 8
      for (int c = 0; c < nc; c++) {
        const uint8_t *qc = q + c * rs + g * 128;
        const __m512 ls = _mm512_mul_ps(lut, _mm512_set1_ps(fs[c][j]));
        const __m512i va = hold ? ua[c] : _mm512_loadu_si512(qc), vb = hold ? ub[c] : _mm512_loadu_si512(qc + 64);
        const __m512 wa = _mm512_permutexvar_ps(_mm512_srli_epi32(va, 4 * j), ls);
        const __m512 wb = _mm512_permutexvar_ps(_mm512_srli_epi32(vb, 4 * j), ls);
#pragma GCC unroll 4
        for (int r = 0; r < rr; r++) {
          a[c][r] = _mm512_fmadd_ps(wa, xa[r], a[c][r]);
          b[c][r] = _mm512_fmadd_ps(wb, xh[r], b[c][r]);
        }
      }
    }
  }
  for (int64_t k = ng * 8; k < nb; k++) { /* the blocks after the last group: byte L holds lane L's two codes */
    const float *xb = x + k * 32;
#pragma GCC unroll 8
    for (int c = 0; c < nc; c++) {
      const __m512 ls = _mm512_mul_ps(lut, _mm512_set1_ps(moe8__e8m0(sc[c * nb + k])));
      const __m512i u = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(q + c * rs + k * 16)));
      const __m512 wa = _mm512_permutexvar_ps(u, ls), wb = _mm512_permutexvar_ps(_mm512_srli_epi32(u, 4), ls);
#pragma GCC unroll 4
      for (int r = 0; r < rr; r++) {
        a[c][r] = _mm512_fmadd_ps(wa, _mm512_loadu_ps(xb + r * ldx), a[c][r]);
        b[c][r] = _mm512_fmadd_ps(wb, _mm512_loadu_ps(xb + r * ldx + 16), b[c][r]);
      }
    }
  }
#pragma GCC unroll 8
  for (int c = 0; c < nc; c++)
#pragma GCC unroll 4
    for (int r = 0; r < rr; r++) res[c * MX_NR + r] = fold16(_mm512_add_ps(a[c][r], b[c][r]));
}

/* Tiles of 4 columns (4 streams of codes suit the memory best: 8 were
** slower from memory though faster in cache) by 2 rows, the shapes known
** at compile time.  More rows go in pairs over the same columns, whose
** codes the first pair left in L2: wider row tiles were slower (the x
** loads and the accumulators no longer fit beside the decode). */
static void mx4_rows(const float *x, int64_t rows, int64_t ldx, int64_t K, const uint8_t *blk, const uint8_t *sc, int64_t n0, int64_t n1,
                     float *out, int64_t ldo, int64_t split) {
  const int64_t nb = K / 32, rs = moe8__mx4_row_bytes(K);
  const __m512 lut = _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f);
  float res[MX_NC * MX_NR];
  for (int64_t p0 = 0; p0 < rows; p0 += MX_NR) {
    const int rr = rows - p0 < MX_NR ? (int)(rows - p0) : MX_NR, ncw = 4;
    const float *xp = x + p0 * ldx;
    for (int64_t n = n0; n < n1; n += ncw) {
      const int nc = n1 - n < ncw ? (int)(n1 - n) : ncw;
      const uint8_t *q = blk + n * rs, *s = sc + n * nb;
      if (nc == 4 && rr == 1) mx4_tile(xp, ldx, 1, 4, q, rs, s, nb, lut, res);
      else if (nc == 4 && rr == 2) mx4_tile(xp, ldx, 2, 4, q, rs, s, nb, lut, res);
      else mx4_tile(xp, ldx, rr, nc, q, rs, s, nb, lut, res);
      for (int c = 0; c < nc; c++) {
        const int64_t nn = n + c, col = split > 0 ? nn / 2 + ((nn & 1) ? split : 0) : nn;
        for (int r = 0; r < rr; r++) out[(p0 + r) * ldo + col] = res[c * MX_NR + r];
      }
    }
  }
}

/* ---- MXFP4 rows against int8 activations (vpdpbusd; the order is
** moe8__ref_mx4_rows_i8's) ------------------------------------------------ */
#define MX_VNNI __attribute__((target("avx512vnni,fma")))

enum { MXI_NR = 8 }; /* a tile: one column group (16 columns) x up to 8 rows */

/* One tile: the column group at q, sc (moe8__mx4_to_cols's layout, nb
** blocks) against rows 0 .. rr - 1 of xp.  Per block: the 16 scale bytes
** widened to their f32 values (moe8__e8m0), four 64-byte loads split into
** low and high nibbles and turned by vpshufb into 2 · E2M1 + 12
** (unsigned); per row the block's int32 starts from the pack's correction
** -12 · Σ q, takes 8 vpdpbusd against broadcast dwords of q (so each
** lane's sum is the exact Σ w2 · q of its column), and goes into the
** column's chain as fma(I, 2^(e - 127) · sh, chain).  The codes are one
** sequential stream (a task's groups follow each other), prefetched 16 KiB
** ahead into L2 on Intel (84-88% of the read bandwidth at decode became
** 86-98% against 4 KiB into L1, measured on an AMX Xeon), 4 KiB into L1 on
** AMD Zen: two column groups at a time (two streams) were slower from
** memory though faster in cache.  On AMD, tiles of two to four rows also
** ask for the line 16 KiB ahead into L2: the codes then stream while the
** rows' dot products keep the core busy (from memory, 2 rows 1.23-1.31x,
** 3 rows 1.16-1.18x, 4 rows 1.06-1.10x on an AMD Zen 4; one row 0.83-0.91x
** and eight level, so those keep the one prefetch; docs/performance.md). */
MX_VNNI static inline __attribute__((always_inline)) void mx4_tile_i8(const uint8_t *xp, int64_t ldxp, int rr, const uint8_t *q,
                                                                     const uint8_t *sc, int64_t K, __m512 res[MXI_NR]) {
  const int64_t nb = K / 32;
  const bool far = mx_far();
  enum { MX_NEAR = 4096, MX_FAR = 16384 }; /* bytes ahead: into L1, into L2 */
  const int64_t pfb = far ? MX_FAR : MX_NEAR;
  const bool l2 = !far && rr >= 2 && rr <= 4; /* AMD's second, far prefetch */
  const __m512i lut = _mm512_broadcast_i32x4(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  __m512 f[MXI_NR];
#pragma GCC unroll 8
  for (int r = 0; r < MXI_NR; r++) f[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; b++) {
    const uint8_t *qb = q + b * 256;
#pragma GCC unroll 4
    for (int u = 0; u < 4; u++) {
      if (!far) mx_prefetch(qb + pfb + 64 * u, far);
      if (l2) mx_prefetch(qb + MX_FAR + 64 * u, true);
    }
    const __m512i e = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(sc + b * 16)));
    const __m512 sw = _mm512_castsi512_ps(_mm512_mask_mov_epi32(_mm512_slli_epi32(e, 23), _mm512_cmpeq_epi32_mask(e, _mm512_setzero_si512()),
                                                                _mm512_set1_epi32(0x00400000)));
    __m512i lo[4], hi[4];
#pragma GCC unroll 4
    for (int u = 0; u < 4; u++) {
      if (far) mx_prefetch(qb + pfb + 64 * u, far); /* Intel: each right before its line */
      const __m512i v = _mm512_loadu_si512(qb + 64 * u);
      lo[u] = _mm512_shuffle_epi8(lut, _mm512_and_si512(v, m4));
      hi[u] = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(v, 4), m4));
    }
#pragma GCC unroll 8
    for (int r = 0; r < rr; r++) {
      const uint8_t *x = xp + r * ldxp;
      /* the activation words, the correction and the scale broadcast
      ** straight from memory (a load each; through a general register
      ** each was a shuffle as well, which bound the loop on an AMD Zen 4) */
      const uint8_t *xb = x + 32 * b;
      /* two chains of 4 (the low and the high nibbles), then their sum */
      __m512i acc = _mm512_broadcastd_epi32(_mm_loadu_si32(x + K + 4 * b)), acc2 = _mm512_setzero_si512();
#pragma GCC unroll 4
      for (int u = 0; u < 4; u++) {
        acc = moe8__dpbusd(acc, lo[u], _mm512_broadcastd_epi32(_mm_loadu_si32(xb + 8 * u)));
        acc2 = moe8__dpbusd(acc2, hi[u], _mm512_broadcastd_epi32(_mm_loadu_si32(xb + 8 * u + 4)));
      }
      const __m512 sh = _mm512_broadcastss_ps(_mm_castsi128_ps(_mm_loadu_si32(x + K + 4 * nb + 4 * b)));
      f[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(acc, acc2)), _mm512_mul_ps(sw, sh), f[r]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < rr; r++) res[r] = f[r];
}

/* Tiles of one column group by up to 8 rows, the shapes known at compile
** time (8 rows against 4: 1.1x in cache, the prefill of a GPT-OSS-shaped
** layer 1.05x on an AMD Zen 4); more rows go in eights over the same
** columns (their codes then come from L2).  Columns outside [n0, n1) of a
** group are not stored. */
MX_VNNI static void mx4_rows_i8(const uint8_t *xp, int64_t rows, int64_t ldxp, int64_t K, const uint8_t *blk, const uint8_t *sc, int64_t n0,
                                int64_t n1, float *out, int64_t ldo, int64_t split) {
  const int64_t nb = K / 32;
  __m512 res[MXI_NR];
  float lane[16];
  for (int64_t p0 = 0; p0 < rows; p0 += MXI_NR) {
    const int rr = rows - p0 < MXI_NR ? (int)(rows - p0) : MXI_NR;
    const uint8_t *xr = xp + p0 * ldxp;
    for (int64_t c = n0 / 16; c * 16 < n1; c++) {
      const uint8_t *q = blk + c * nb * 256, *s = sc + c * nb * 16;
      if (rr == 1) mx4_tile_i8(xr, ldxp, 1, q, s, K, res);
      else if (rr == 2) mx4_tile_i8(xr, ldxp, 2, q, s, K, res);
      else if (rr == 4) mx4_tile_i8(xr, ldxp, 4, q, s, K, res);
      else if (rr == 8) mx4_tile_i8(xr, ldxp, 8, q, s, K, res);
      else mx4_tile_i8(xr, ldxp, rr, q, s, K, res);
      for (int r = 0; r < rr; r++) {
        _mm512_storeu_ps(lane, res[r]);
        for (int i = 0; i < 16; i++) {
          const int64_t nn = c * 16 + i, col = split > 0 ? nn / 2 + ((nn & 1) ? split : 0) : nn;
          if (nn >= n0 && nn < n1) out[(p0 + r) * ldo + col] = lane[i];
        }
      }
    }
  }
}

void moe8__act_init_avx512(moe8__ktable *k) {
  if (k->has_vnni) k->mx4_rows_i8 = mx4_rows_i8;
  k->mx4_rows      = mx4_rows;
  k->swiglu        = swiglu;
  k->swiglu_clamp  = swiglu_clamp;
  k->swiglu_limit  = swiglu_limit;
  k->swiglu_post   = swiglu_post;
  k->swiglu_softcap = swiglu_softcap;
  k->geglu         = geglu;
  k->relu2         = relu2;
  k->relu          = relu;
  k->router_logits = router_logits;
}
