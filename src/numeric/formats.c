/*
** formats.c — the number formats of docs/numerics.md: traits, the scalar
** conversions that are the ground truth for every kernel, and the bulk
** moe8_convert() entry point.
**
** f32 -> FP8 works on the f32 bit pattern, in the manner of CUDA's
** __nv_cvt_float_to_fp8: classify (NaN, underflow, overflow, normal,
** subnormal), truncate the mantissa, then round to nearest even from the
** discarded bits.  Every f32 is exactly a double, so working on f32 bits is
** the same function CUDA computes on doubles.  One deliberate difference
** from CUDA: a NaN input becomes 0x7F for both formats, sign dropped
** (docs/numerics.md); CUDA keeps the sign, and for e5m2 keeps the top mantissa bits.
**
** moe8_convert() goes through f32 in chunks: every source type converts to
** f32 exactly, so a conversion to the destination type is still one rounding
** of the exact source value.
*/
#include "../kernels/ref/ref.h"

#include <math.h>
#include <string.h>

static const moe8_dtype_traits g_traits[MOE8_DTYPE_COUNT] = {
  [MOE8_DTYPE_F32]    = {"f32", 32, true, 3.40282347e38f},
  [MOE8_DTYPE_BF16]   = {"bf16", 16, true, 3.38953139e38f},
  [MOE8_DTYPE_F8E4M3] = {"f8e4m3", 8, true, 448.0f},
  [MOE8_DTYPE_F8E5M2] = {"f8e5m2", 8, true, 57344.0f},
  [MOE8_DTYPE_I8]     = {"i8", 8, false, 127.0f},
};

const moe8_dtype_traits *moe8_dtype_info(moe8_dtype dtype) {
  if (dtype <= MOE8_DTYPE_NONE || dtype >= MOE8_DTYPE_COUNT) return NULL;
  return &g_traits[dtype];
}

moe8_dtype moe8_dtype_from_name(const char *name) {
  static const struct { const char *name; moe8_dtype t; } names[] = {
    {"f32", MOE8_DTYPE_F32},       {"float32", MOE8_DTYPE_F32},
    {"bf16", MOE8_DTYPE_BF16},     {"bfloat16", MOE8_DTYPE_BF16},
    {"f8e4m3", MOE8_DTYPE_F8E4M3}, {"float8_e4m3fn", MOE8_DTYPE_F8E4M3},
    {"e4m3", MOE8_DTYPE_F8E4M3},
    {"f8e5m2", MOE8_DTYPE_F8E5M2}, {"float8_e5m2", MOE8_DTYPE_F8E5M2},
    {"e5m2", MOE8_DTYPE_F8E5M2},
    {"i8", MOE8_DTYPE_I8},         {"int8", MOE8_DTYPE_I8},
  };
  if (!name) return MOE8_DTYPE_NONE;
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (strcmp(name, names[i].name) == 0) return names[i].t;
  return MOE8_DTYPE_NONE;
}

#include "fp8_format.h"

static inline uint8_t f32_to_fp8(float x, const fp8_format *f, bool sat) {
  const uint32_t u = moe8__f32_bits(x);
  const uint32_t a = u & 0x7FFFFFFFu;
  const uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
  if (a > 0x7F800000u) return 0x7F;                      /* NaN            */
  if (a <= f->half_min) return sign;                     /* (signed) zero  */
  if (a > f->overflow) return sign | (sat ? f->max_code : f->overflow_code);
  const int32_t exp8 = (int32_t)(a >> 23) - 127 + f->bias;
  const uint32_t drop = 23 - f->mbits;                   /* discarded bits */
  uint32_t res, rem, half;
  if (a >= f->min_normal) {
    res = ((uint32_t)exp8 << f->mbits) | ((a >> drop) & ((1u << f->mbits) - 1));
    rem = a & ((1u << drop) - 1);
    half = 1u << (drop - 1);
  } else {
    /* Subnormal in the target: shift the full significand further right. */
    const uint32_t s = drop + (uint32_t)(1 - exp8);
    const uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
    res = m >> s;
    rem = m & ((1u << s) - 1);
    half = 1u << (s - 1);
  }
  if (rem > half || (rem == half && (res & 1))) res++;
  return sign | (uint8_t)res;
}

uint8_t moe8_f32_to_f8e4m3(float x, bool saturate) { return f32_to_fp8(x, &moe8__e4m3, saturate); }
uint8_t moe8_f32_to_f8e5m2(float x, bool saturate) { return f32_to_fp8(x, &moe8__e5m2, saturate); }

float moe8_f8e4m3_to_f32(uint8_t x) {
  const uint32_t sign = (uint32_t)(x & 0x80) << 24;
  const uint32_t e = (x >> 3) & 0xF, m = x & 7;
  if (e == 15 && m == 7) return moe8__bits_f32(sign | 0x7FC00000u);
  if (e == 0) return moe8__bits_f32(sign | moe8__f32_bits((float)m * 0x1p-9f));
  return moe8__bits_f32(sign | ((e + 120) << 23) | (m << 20));
}

float moe8_f8e5m2_to_f32(uint8_t x) {
  const uint32_t sign = (uint32_t)(x & 0x80) << 24;
  const uint32_t e = (x >> 2) & 0x1F, m = x & 3;
  if (e == 31) return moe8__bits_f32(sign | (m ? 0x7FC00000u : 0x7F800000u));
  if (e == 0) return moe8__bits_f32(sign | moe8__f32_bits((float)m * 0x1p-16f));
  return moe8__bits_f32(sign | ((e + 112) << 23) | (m << 21));
}

uint16_t moe8_f32_to_bf16(float x) {
  const uint32_t u = moe8__f32_bits(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x0040u);
  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1)) >> 16);
}

float moe8_bf16_to_f32(uint16_t x) { return moe8__bits_f32((uint32_t)x << 16); }

int8_t moe8__f32_to_i8(float x) {
  if (x != x) return 0;
  /* nearbyintf rounds half to even in the default rounding mode. */
  if (x >= 127.0f) return 127;
  if (x <= -127.0f) return -127;
  return (int8_t)nearbyintf(x);
}

/* ---- reference bulk kernels (the ref entries of the kernel table) ---- */
void moe8__ref_cvt_f32_f8(uint8_t *dst, const float *src, size_t n, moe8_dtype type, bool sat) {
  const fp8_format *f = type == MOE8_DTYPE_F8E4M3 ? &moe8__e4m3 : &moe8__e5m2;
  for (size_t i = 0; i < n; i++) dst[i] = f32_to_fp8(src[i], f, sat);
}

void moe8__ref_cvt_f8_f32(float *dst, const uint8_t *src, size_t n, moe8_dtype type) {
  if (type == MOE8_DTYPE_F8E4M3)
    for (size_t i = 0; i < n; i++) dst[i] = moe8_f8e4m3_to_f32(src[i]);
  else
    for (size_t i = 0; i < n; i++) dst[i] = moe8_f8e5m2_to_f32(src[i]);
}

void moe8__ref_cvt_f8_bf16(uint16_t *dst, const uint8_t *src, size_t n, moe8_dtype type) {
  for (size_t i = 0; i < n; i++)
    dst[i] = moe8_f32_to_bf16(type == MOE8_DTYPE_F8E4M3 ? moe8_f8e4m3_to_f32(src[i]) : moe8_f8e5m2_to_f32(src[i]));
}

void moe8__ref_cvt_f32_bf16(uint16_t *dst, const float *src, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = moe8_f32_to_bf16(src[i]);
}

void moe8__ref_cvt_bf16_f32(float *dst, const uint16_t *src, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = moe8_bf16_to_f32(src[i]);
}

size_t moe8__ref_cvt_f32_i8(int8_t *dst, const float *src, size_t n) {
  size_t nan = 0;
  for (size_t i = 0; i < n; i++) {
    nan += src[i] != src[i];
    dst[i] = moe8__f32_to_i8(src[i]);
  }
  return nan;
}

/* ---- moe8_convert ---------------------------------------------------- */
static bool is_convertible(moe8_dtype t) {
  return t == MOE8_DTYPE_F32 || t == MOE8_DTYPE_BF16 || t == MOE8_DTYPE_F8E4M3 ||
         t == MOE8_DTYPE_F8E5M2 || t == MOE8_DTYPE_I8;
}

static void to_f32(const moe8__ktable *k, float *dst, const void *src, moe8_dtype t, size_t n) {
  switch (t) {
    case MOE8_DTYPE_F32: memmove(dst, src, n * 4); break;
    case MOE8_DTYPE_BF16: k->cvt_bf16_f32(dst, src, n); break;
    case MOE8_DTYPE_F8E4M3: case MOE8_DTYPE_F8E5M2: k->cvt_f8_f32(dst, src, n, t); break;
    case MOE8_DTYPE_I8: {
      const int8_t *s = src;
      for (size_t i = 0; i < n; i++) dst[i] = (float)s[i];
      break;
    }
    default: break;
  }
}

static size_t from_f32(const moe8__ktable *k, void *dst, const float *src, moe8_dtype t,
                       size_t n, bool sat) {
  switch (t) {
    case MOE8_DTYPE_F32: memmove(dst, src, n * 4); return 0;
    case MOE8_DTYPE_BF16: k->cvt_f32_bf16(dst, src, n); return 0;
    case MOE8_DTYPE_F8E4M3: case MOE8_DTYPE_F8E5M2: k->cvt_f32_f8(dst, src, n, t, sat); return 0;
    case MOE8_DTYPE_I8: return k->cvt_f32_i8(dst, src, n);
    default: return 0;
  }
}

moe8_status moe8_convert(void *dst, moe8_dtype dst_type, const void *src, moe8_dtype src_type,
                         size_t count, unsigned flags) {
  if (!is_convertible(dst_type) || !is_convertible(src_type))
    return moe8__fail(MOE8_ERR_DTYPE, "moe8_convert: cannot convert %s to %s",
                      moe8_dtype_info(src_type) ? moe8_dtype_info(src_type)->name : "(invalid)",
                      moe8_dtype_info(dst_type) ? moe8_dtype_info(dst_type)->name : "(invalid)");
  if (flags & ~MOE8_CONVERT_NOSAT)
    return moe8__fail(MOE8_ERR_INVALID_ARG, "moe8_convert: unknown flags 0x%x", flags);
  if (count == 0) return MOE8_OK;
  if (!dst || !src) return moe8__fail(MOE8_ERR_INVALID_ARG, "moe8_convert: NULL buffer");
  const moe8__ktable *k = moe8__kernels();
  const bool sat = !(flags & MOE8_CONVERT_NOSAT);
  const size_t ds = moe8__dtype_size(dst_type), ss = moe8__dtype_size(src_type);
  size_t nan = 0;
  if (src_type == MOE8_DTYPE_F32) {
    nan = from_f32(k, dst, src, dst_type, count, sat);
  } else if (dst_type == MOE8_DTYPE_BF16 && (src_type == MOE8_DTYPE_F8E4M3 || src_type == MOE8_DTYPE_F8E5M2)) {
    k->cvt_f8_bf16(dst, src, count, src_type); /* exact, no f32 detour */
  } else if (dst_type == MOE8_DTYPE_F32) {
    to_f32(k, dst, src, src_type, count);
  } else {
    /* Chunks through an f32 buffer on the stack; a chunk is converted fully
    ** before its destination is written, so dst == src is safe when the
    ** element sizes match. */
    float buf[1024];
    for (size_t i = 0; i < count; i += 1024) {
      const size_t n = count - i < 1024 ? count - i : 1024;
      to_f32(k, buf, (const char *)src + i * ss, src_type, n);
      nan += from_f32(k, (char *)dst + i * ds, buf, dst_type, n, sat);
    }
  }
  if (nan)
    return moe8__fail(MOE8_ERR_NONFINITE, "moe8_convert: %zu NaN value(s) converted to i8 zero", nan);
  return MOE8_OK;
}
