/*
** fp8_format.h — the two FP8 formats as the f32 -> FP8 conversions see
** them: f32 bit patterns of the thresholds, and the codes for max and
** overflow.  One definition, used by the reference conversion
** (formats.c) and the AVX-512 one (kernels/x86/quant_avx512.c).
*/
#ifndef MOE8_FP8_FORMAT_H
#define MOE8_FP8_FORMAT_H

#include <stdint.h>

/* Parameters of one FP8 format, as f32 bit patterns. */
typedef struct fp8_format {
  int32_t  mbits;       /* mantissa bits                                   */
  int32_t  bias;
  uint32_t half_min;    /* |x| <= this rounds to zero: min subnormal / 2   */
  uint32_t overflow;    /* |x| >  this overflows                           */
  uint32_t min_normal;
  uint8_t  max_code, overflow_code;
} fp8_format;

/* e4m3: max 448 = 0x1.Cp8; 464 = midpoint to the (non-existent) 480 rounds
** to even = 448, so only |x| > 464 overflows.  e5m2: max 57344 = 0x1.Cp15;
** the midpoint 61440 rounds to even = 65536, so |x| >= 61440 overflows. */
static const fp8_format moe8__e4m3 = {3, 7, 0x3A800000u, 0x43E80000u, 0x3C800000u, 0x7E, 0x7F};
static const fp8_format moe8__e5m2 = {2, 15, 0x37000000u, 0x476FFFFFu, 0x38800000u, 0x7B, 0x7C};

#endif
