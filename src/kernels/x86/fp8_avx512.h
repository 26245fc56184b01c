/*
** fp8_avx512.h — the sixteen-lane FP8 -> f32 decode shared by the AVX-512
** conversion kernels and the grouped-matmul packers (exact: every FP8 value
** is an f32 value; NaN codes give a quiet NaN with the sign kept).
** Include only from files compiled with AVX-512 F/BW/VL/DQ.
*/
#ifndef MOE8_FP8_AVX512_H
#define MOE8_FP8_AVX512_H

#include <immintrin.h>

#include "moe8.h"

static inline __m512 moe8__fp8_to_f32_16(__m128i bytes, moe8_dtype type) {
  const __m512i x = _mm512_cvtepu8_epi32(bytes);
  const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(x, _mm512_set1_epi32(0x80)), 24);
  const bool e4 = type == MOE8_DTYPE_F8E4M3;
  const int mb = e4 ? 3 : 2;
  const __m512i e = _mm512_and_si512(_mm512_srli_epi32(x, mb), _mm512_set1_epi32(e4 ? 15 : 31));
  const __m512i m = _mm512_and_si512(x, _mm512_set1_epi32(e4 ? 7 : 3));
  __m512i r = _mm512_or_si512(_mm512_slli_epi32(_mm512_add_epi32(e, _mm512_set1_epi32(e4 ? 120 : 112)), 23),
                              _mm512_slli_epi32(m, 23 - mb));
  const __m512 sub = _mm512_mul_ps(_mm512_cvtepi32_ps(m), _mm512_set1_ps(e4 ? 0x1p-9f : 0x1p-16f));
  r = _mm512_mask_mov_epi32(r, _mm512_testn_epi32_mask(e, e), _mm512_castps_si512(sub));
  if (e4) {
    const __mmask16 nan = _mm512_cmpeq_epi32_mask(_mm512_and_si512(x, _mm512_set1_epi32(0x7F)), _mm512_set1_epi32(0x7F));
    r = _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7FC00000));
  } else {
    const __mmask16 special = _mm512_cmpeq_epi32_mask(e, _mm512_set1_epi32(31));
    const __mmask16 nan = special & _mm512_test_epi32_mask(m, m);
    r = _mm512_mask_mov_epi32(r, special, _mm512_set1_epi32(0x7F800000));
    r = _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7FC00000));
  }
  return _mm512_castsi512_ps(_mm512_or_si512(r, sign));
}

#endif
