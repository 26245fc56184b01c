/*
** quant_avx512.c — AVX-512 (F/BW/VL/DQ) conversions and quantizer inner
** loops.  Built with its own ISA flags and reached only through the kernel
** table, so a portable binary never executes it on a CPU without AVX-512.
**
** Each kernel is the reference algorithm sixteen lanes wide: f32 -> FP8
** without saturation classifies and rounds to nearest even from the
** discarded bits exactly as formats.c does, with a per-lane variable shift
** for target subnormals; with saturation (the quantizer's case) it rounds
** by float arithmetic to the same codes (f32_to_fp8_sat_16).  Tails use masked loads and stores;
** nothing is read or written past n.  The tests compare every kernel here
** with the reference byte for byte, exhaustively for the conversions.
*/
#include "../ref/ref.h"
#include "fp8_avx512.h"
#include "../../numeric/fp8_format.h"

#include <immintrin.h>

/* 16 f32 -> 16 FP8 codes in the low byte of each 32-bit lane. */
static inline __attribute__((always_inline)) __m512i f32_to_fp8_16(__m512 x, const fp8_format *p, bool sat) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i a = _mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF));
  const __m512i sign = _mm512_and_si512(_mm512_srli_epi32(u, 24), _mm512_set1_epi32(0x80));
  const int drop = 23 - p->mbits;
  const __m512i one = _mm512_set1_epi32(1);

  /* Normal target: add (half - 1) plus the kept LSB, then shift: round to
  ** nearest even with the carry running into the exponent. */
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(a, drop), one);
  const __m512i rn = _mm512_add_epi32(_mm512_add_epi32(a, _mm512_set1_epi32((1 << (drop - 1)) - 1)), lsb);
  const __m512i res_n = _mm512_sub_epi32(_mm512_srli_epi32(rn, drop), _mm512_set1_epi32((127 - p->bias) << p->mbits));

  /* Subnormal target: shift the full significand by drop + 1 - exp8. */
  const __m512i exp8 = _mm512_sub_epi32(_mm512_srli_epi32(a, 23), _mm512_set1_epi32(127 - p->bias));
  __m512i s = _mm512_sub_epi32(_mm512_set1_epi32(drop + 1), exp8);
  s = _mm512_min_epi32(s, _mm512_set1_epi32(31));
  const __m512i m = _mm512_or_si512(_mm512_and_si512(a, _mm512_set1_epi32(0x7FFFFF)), _mm512_set1_epi32(0x800000));
  __m512i res_s = _mm512_srlv_epi32(m, s);
  const __m512i half = _mm512_sllv_epi32(one, _mm512_sub_epi32(s, one));
  const __m512i rem = _mm512_and_si512(m, _mm512_sub_epi32(_mm512_sllv_epi32(one, s), one));
  const __mmask16 up = _mm512_cmpgt_epu32_mask(rem, half) |
                       (_mm512_cmpeq_epi32_mask(rem, half) & _mm512_test_epi32_mask(res_s, one));
  res_s = _mm512_mask_add_epi32(res_s, up, res_s, one);

  const __mmask16 normal = _mm512_cmpge_epu32_mask(a, _mm512_set1_epi32((int)p->min_normal));
  __m512i r = _mm512_mask_blend_epi32(normal, res_s, res_n);
  r = _mm512_mask_mov_epi32(r, _mm512_cmple_epu32_mask(a, _mm512_set1_epi32((int)p->half_min)), _mm512_setzero_si512());
  r = _mm512_mask_mov_epi32(r, _mm512_cmpgt_epu32_mask(a, _mm512_set1_epi32((int)p->overflow)),
                            _mm512_set1_epi32((int)(sat ? p->max_code : p->overflow_code)));
  r = _mm512_or_si512(r, sign);
  return _mm512_mask_mov_epi32(r, _mm512_cmpgt_epu32_mask(a, _mm512_set1_epi32(0x7F800000)), _mm512_set1_epi32(0x7F));
}

/* The same codes as f32_to_fp8_16(x, p, true), by float arithmetic: |x|
** clamped to the largest finite value (what saturation gives), then
** rounded to the FP8 grid by (|x| + c) - c, where c is 2^23 grid steps of
** |x|'s binade (or of the subnormal range), so the add rounds to nearest
** even on the grid; the add carries its rounding mode (nearest even,
** whatever MXCSR says) and the subtraction is exact.  A grid value is then
** re-encoded: normal ones from their f32 bits, subnormal ones as the count
** of steps.  No operation produces an f32 subnormal, so FTZ/DAZ do not
** change the result (an f32 subnormal input rounds to zero either way). */
static inline __attribute__((always_inline)) __m512i f32_to_fp8_sat_16(__m512 x, const fp8_format *p) {
  const int drop = 23 - p->mbits, emin = 1 - p->bias;
  const uint32_t maxbits = (uint32_t)(((p->max_code >> p->mbits) + 127 - p->bias) << 23) |
                           (uint32_t)((p->max_code & ((1 << p->mbits) - 1)) << drop);
  const __m512i u = _mm512_castps_si512(x);
  const __m512i ab = _mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF));
  const __m512i sign = _mm512_and_si512(_mm512_srli_epi32(u, 24), _mm512_set1_epi32(0x80));
  /* min returns its second operand for NaN: NaN lanes are fixed at the end. */
  const __m512 a = _mm512_min_ps(_mm512_castsi512_ps(ab), _mm512_castsi512_ps(_mm512_set1_epi32((int)maxbits)));
  const __m512i cb = _mm512_max_epu32(
      _mm512_add_epi32(_mm512_and_si512(_mm512_castps_si512(a), _mm512_set1_epi32(0x7F800000)), _mm512_set1_epi32(drop << 23)),
      _mm512_set1_epi32((emin - p->mbits + 23 + 127) << 23));
  const __m512 c = _mm512_castsi512_ps(cb);
  const __m512 r = _mm512_sub_ps(_mm512_add_round_ps(a, c, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), c);
  const __mmask16 normal = _mm512_cmp_ps_mask(r, _mm512_castsi512_ps(_mm512_set1_epi32((int)p->min_normal)), _CMP_GE_OQ);
  const __m512i code_n = _mm512_sub_epi32(_mm512_srli_epi32(_mm512_castps_si512(r), drop), _mm512_set1_epi32((127 - p->bias) << p->mbits));
  const __m512i code_s = _mm512_cvttps_epi32(_mm512_mul_ps(r, _mm512_castsi512_ps(_mm512_set1_epi32((p->mbits - emin + 127) << 23))));
  const __m512i code = _mm512_or_si512(_mm512_mask_blend_epi32(normal, code_s, code_n), sign);
  return _mm512_mask_mov_epi32(code, _mm512_cmpgt_epu32_mask(ab, _mm512_set1_epi32(0x7F800000)), _mm512_set1_epi32(0x7F));
}

static inline __attribute__((always_inline)) __m512i f32_to_fp8_any_16(__m512 x, const fp8_format *p, bool sat) {
  return sat ? f32_to_fp8_sat_16(x, p) : f32_to_fp8_16(x, p, false);
}

static void cvt_f32_f8(uint8_t *dst, const float *src, size_t n, moe8_dtype type, bool sat) {
  const fp8_format *p = type == MOE8_DTYPE_F8E4M3 ? &moe8__e4m3 : &moe8__e5m2;
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm_storeu_si128((__m128i *)(dst + i), _mm512_cvtepi32_epi8(f32_to_fp8_any_16(_mm512_loadu_ps(src + i), p, sat)));
  if (i < n) {
    const __mmask16 k = (__mmask16)((1u << (n - i)) - 1);
    _mm_mask_storeu_epi8(dst + i, k, _mm512_cvtepi32_epi8(f32_to_fp8_any_16(_mm512_maskz_loadu_ps(k, src + i), p, sat)));
  }
}

static void cvt_f8_f32(float *dst, const uint8_t *src, size_t n, moe8_dtype type) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(dst + i, moe8__fp8_to_f32_16(_mm_loadu_si128((const __m128i *)(src + i)), type));
  if (i < n) {
    const __mmask16 k = (__mmask16)((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(dst + i, k, moe8__fp8_to_f32_16(_mm_maskz_loadu_epi8(k, src + i), type));
  }
}

static inline __m256i f32_to_bf16_16(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb), 16);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)),
                                                _mm512_set1_epi32(0x7F800000));
  r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
  return _mm512_cvtepi32_epi16(r);
}

static void cvt_f32_bf16(uint16_t *dst, const float *src, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) _mm256_storeu_si256((__m256i *)(dst + i), f32_to_bf16_16(_mm512_loadu_ps(src + i)));
  if (i < n) {
    const __mmask16 k = (__mmask16)((1u << (n - i)) - 1);
    _mm256_mask_storeu_epi16(dst + i, k, f32_to_bf16_16(_mm512_maskz_loadu_ps(k, src + i)));
  }
}

static void cvt_bf16_f32(float *dst, const uint16_t *src, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_si512(dst + i, _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(src + i))), 16));
  if (i < n) {
    const __mmask16 k = (__mmask16)((1u << (n - i)) - 1);
    _mm512_mask_storeu_epi32(dst + i, k, _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, src + i)), 16));
  }
}

static inline __m512i f32_to_i8_16(__m512 x) {
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  __m512 r = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  r = _mm512_min_ps(_mm512_max_ps(r, _mm512_set1_ps(-127.0f)), _mm512_set1_ps(127.0f));
  r = _mm512_mask_mov_ps(r, nan, _mm512_setzero_ps());
  return _mm512_cvtps_epi32(r);
}

static size_t cvt_f32_i8(int8_t *dst, const float *src, size_t n) {
  size_t i = 0, nan = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(src + i);
    nan += (size_t)__builtin_popcount(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q));
    _mm_storeu_si128((__m128i *)(dst + i), _mm512_cvtepi32_epi8(f32_to_i8_16(x)));
  }
  if (i < n) {
    const __mmask16 k = (__mmask16)((1u << (n - i)) - 1);
    const __m512 x = _mm512_maskz_loadu_ps(k, src + i);
    nan += (size_t)__builtin_popcount(_mm512_mask_cmp_ps_mask(k, x, x, _CMP_UNORD_Q));
    _mm_mask_storeu_epi8(dst + i, k, _mm512_cvtepi32_epi8(f32_to_i8_16(x)));
  }
  return nan;
}

/* The quantizers' input streams: each line asked into L2 32 KiB ahead and
** into L1 2 KiB ahead (QPF1, QPF0 floats), from absmax, absmax_acc and
** quant_div.  Each block is read by absmax (or absmax_acc) and then by
** quant_div, with the division and the conversion between, so without
** them the stream waited on each block's lines in turn; the hardware
** prefetchers alone, or an L1 prefetch alone (its misses are limited by
** the line fill buffers), keep fewer lines in flight.  Measured on one
** core of an AMX Xeon (docs/performance.md), before -> after:
**   per-token 1x128 FP8, [4096, 4096] f32   15.4-16.7 ->  7.8-8.6 ms
**   per-token int8, the same                11.9-12.7 ->  9.1-9.9 ms
**   1x128-block FP8 weights [8, 2048, 2816]    59-64 ->   37-38 ms
**   per-channel int8 weights, the same          47-52 ->   33-34 ms
** The division and the conversion are not the limit: taking x · (1/s)
** where that provably rounds as x / s did not help.  A prefetch never
** faults, so reading ahead past the end is harmless (the address is
** formed as an integer: no pointer past the array).  Written in asm: GCC
** 12's dead-code pass dropped `_mm_prefetch` from quant_div's loop. */
enum { QPF0 = 512, QPF1 = 8192 };
static inline void ahead(const float *p) {
  const uintptr_t a = (uintptr_t)p;
  __asm__ volatile("prefetcht0 %0\n\tprefetcht1 %1"
                   :
                   : "m"(*(const char *)(a + sizeof(float) * QPF0)), "m"(*(const char *)(a + sizeof(float) * QPF1)));
}

/* |x| as integers: finite iff the bits are <= 0x7F7FFFFF, and for
** non-negative floats integer order is float order, so max stays exact.
** The loop takes the max over every lane; only when that max is not
** finite (an inf or NaN in x, the error path) does the second loop count
** them and take the max over the finite ones. */
static float absmax_count(const float *x, size_t n, size_t *nonfinite) {
  __m512i m = _mm512_setzero_si512();
  const __m512i absmask = _mm512_set1_epi32(0x7FFFFFFF), fmax = _mm512_set1_epi32(0x7F7FFFFF);
  size_t bad = 0;
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 k = n - i >= 16 ? 0xFFFF : (__mmask16)((1u << (n - i)) - 1);
    const __m512i a = _mm512_and_si512(_mm512_maskz_loadu_epi32(k, x + i), absmask);
    const __mmask16 fin = _mm512_mask_cmple_epu32_mask(k, a, fmax);
    bad += (size_t)__builtin_popcount(k) - (size_t)__builtin_popcount(fin);
    m = _mm512_mask_max_epu32(m, fin, m, a);
  }
  *nonfinite += bad;
  return moe8__bits_f32(_mm512_reduce_max_epu32(m));
}
static float absmax(const float *x, size_t n, size_t *nonfinite) {
  __m512i m = _mm512_setzero_si512();
  const __m512i absmask = _mm512_set1_epi32(0x7FFFFFFF);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    ahead(x + i);
    m = _mm512_max_epu32(m, _mm512_and_si512(_mm512_loadu_si512(x + i), absmask));
  }
  if (i < n) m = _mm512_max_epu32(m, _mm512_and_si512(_mm512_maskz_loadu_epi32((__mmask16)((1u << (n - i)) - 1), x + i), absmask));
  const uint32_t mx = _mm512_reduce_max_epu32(m);
  return mx <= 0x7F7FFFFFu ? moe8__bits_f32(mx) : absmax_count(x, n, nonfinite);
}
static size_t absmax_acc(float *amax, const float *x, size_t n) {
  const __m512i absmask = _mm512_set1_epi32(0x7FFFFFFF), fmax = _mm512_set1_epi32(0x7F7FFFFF);
  size_t bad = 0;
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 k = n - i >= 16 ? 0xFFFF : (__mmask16)((1u << (n - i)) - 1);
    ahead(x + i);
    const __m512i a = _mm512_and_si512(_mm512_maskz_loadu_epi32(k, x + i), absmask);
    const __mmask16 fin = _mm512_mask_cmple_epu32_mask(k, a, fmax);
    bad += (size_t)__builtin_popcount(k) - (size_t)__builtin_popcount(fin);
    const __m512i cur = _mm512_maskz_loadu_epi32(k, amax + i);
    _mm512_mask_storeu_epi32(amax + i, k, _mm512_mask_max_epu32(cur, fin, cur, a));
  }
  return bad;
}

/* One loop per target type, so the format's constants fold into the code. */
static inline __attribute__((always_inline)) void quant_div_t(int8_t *o, const float *x, const float *s, size_t s_step,
                                                               size_t n, moe8_dtype qtype) {
  const __m512 s0 = n && !s_step ? _mm512_set1_ps(s[0]) : _mm512_set1_ps(1.0f); /* s is read only where q is written */
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 k = n - i >= 16 ? 0xFFFF : (__mmask16)((1u << (n - i)) - 1);
    ahead(x + i);
    const __m512 v = _mm512_maskz_loadu_ps(k, x + i);
    /* Masked-off lanes divide 0 by 1, never by an unloaded 0. */
    const __m512 sv = s_step ? _mm512_mask_loadu_ps(_mm512_set1_ps(1.0f), k, s + i) : s0;
    const __m512 y = _mm512_div_ps(v, sv);
    const __m512i r = qtype == MOE8_DTYPE_I8 ? f32_to_i8_16(y)
                    : f32_to_fp8_sat_16(y, qtype == MOE8_DTYPE_F8E4M3 ? &moe8__e4m3 : &moe8__e5m2);
    /* Narrow in a register, then a plain or byte-masked store. */
    const __m128i b8 = _mm512_cvtepi32_epi8(r);
    if (k == 0xFFFF) _mm_storeu_si128((__m128i *)(o + i), b8);
    else _mm_mask_storeu_epi8(o + i, k, b8);
  }
}

static void quant_div(void *q, const float *x, const float *s, size_t s_step, size_t n, moe8_dtype qtype) {
  if (qtype == MOE8_DTYPE_F8E4M3) quant_div_t(q, x, s, s_step, n, MOE8_DTYPE_F8E4M3);
  else if (qtype == MOE8_DTYPE_F8E5M2) quant_div_t(q, x, s, s_step, n, MOE8_DTYPE_F8E5M2);
  else quant_div_t(q, x, s, s_step, n, MOE8_DTYPE_I8);
}

/* y = value(q) · s sixteen lanes wide: the FP8 decode of cvt_f8_f32 (or
** the i8 integers), then one multiply per lane, as the reference. */
static inline __attribute__((always_inline)) void dequant_t(float *y, const uint8_t *q, const float *s, size_t s_step, size_t n,
                                                             moe8_dtype qtype) {
  const __m512 s0 = n && !s_step ? _mm512_set1_ps(s[0]) : _mm512_setzero_ps(); /* s is read only where y is written */
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 k = n - i >= 16 ? 0xFFFF : (__mmask16)((1u << (n - i)) - 1);
    const __m128i b = _mm_maskz_loadu_epi8(k, q + i);
    const __m512 v = qtype == MOE8_DTYPE_I8 ? _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)) : moe8__fp8_to_f32_16(b, qtype);
    const __m512 sv = s_step ? _mm512_maskz_loadu_ps(k, s + i) : s0;
    _mm512_mask_storeu_ps(y + i, k, _mm512_mul_ps(v, sv));
  }
}
static void dequant(float *y, const void *q, const float *s, size_t s_step, size_t n, moe8_dtype qtype) {
  if (qtype == MOE8_DTYPE_F8E4M3) dequant_t(y, q, s, s_step, n, MOE8_DTYPE_F8E4M3);
  else if (qtype == MOE8_DTYPE_F8E5M2) dequant_t(y, q, s, s_step, n, MOE8_DTYPE_F8E5M2);
  else dequant_t(y, q, s, s_step, n, MOE8_DTYPE_I8);
}

void moe8__kernels_init_avx512(moe8__ktable *k) {
  k->cvt_f32_f8   = cvt_f32_f8;
  k->cvt_f8_f32   = cvt_f8_f32;
  k->cvt_f32_bf16 = cvt_f32_bf16;
  k->cvt_bf16_f32 = cvt_bf16_f32;
  k->cvt_f32_i8   = cvt_f32_i8;
  k->absmax       = absmax;
  k->absmax_acc   = absmax_acc;
  k->quant_div    = quant_div;
  k->dequant      = dequant;
}
