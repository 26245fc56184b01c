/*
** quant.c — quantization and dequantization for every granularity of
** docs/numerics.md, and the reference kernels they are built from.
**
** Order of work in moe8_quantize(): validate the spec and sizes; for each
** scale block, take the absolute maximum over its finite values (counting
** the non-finite ones); if any value was non-finite, fail with the count and
** the first position; else turn each block maximum into a scale
** (moe8_scale_from_absmax) and write q = convert(x / s).  The block loops
** live here; the inner loops are kernel-table entries (absmax, absmax_acc,
** quant_div), so the AVX-512 quantizer is the same algorithm with a wider
** inner loop, and equal to this one byte for byte.
*/
#include "../kernels/ref/ref.h"

#include <math.h>
#include <string.h>

/* ---- reference inner loops ------------------------------------------- */
float moe8__ref_absmax(const float *x, size_t n, size_t *nonfinite) {
  float m = 0.0f;
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) {
    const float a = fabsf(x[i]);
    if (!(a <= 3.40282347e38f)) { bad++; continue; }
    if (a > m) m = a;
  }
  *nonfinite += bad;
  return m;
}

size_t moe8__ref_absmax_acc(float *amax, const float *x, size_t n) {
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) {
    const float a = fabsf(x[i]);
    if (!(a <= 3.40282347e38f)) { bad++; continue; }
    if (a > amax[i]) amax[i] = a;
  }
  return bad;
}

void moe8__ref_quant_div(void *q, const float *x, const float *s, size_t s_step, size_t n,
                         moe8_dtype qtype) {
  if (qtype == MOE8_DTYPE_I8) {
    int8_t *o = q;
    for (size_t i = 0; i < n; i++) o[i] = moe8__f32_to_i8(x[i] / s[i * s_step]);
  } else if (qtype == MOE8_DTYPE_F8E4M3) {
    uint8_t *o = q;
    for (size_t i = 0; i < n; i++) o[i] = moe8_f32_to_f8e4m3(x[i] / s[i * s_step], true);
  } else {
    uint8_t *o = q;
    for (size_t i = 0; i < n; i++) o[i] = moe8_f32_to_f8e5m2(x[i] / s[i * s_step], true);
  }
}

void moe8__ref_dequant(float *y, const void *q, const float *s, size_t s_step, size_t n, moe8_dtype qtype) {
  const uint8_t *v = q;
  for (size_t i = 0; i < n; i++) {
    const float c = qtype == MOE8_DTYPE_F8E4M3 ? moe8_f8e4m3_to_f32(v[i])
                  : qtype == MOE8_DTYPE_F8E5M2 ? moe8_f8e5m2_to_f32(v[i]) : (float)(int8_t)v[i];
    y[i] = c * s[i * s_step];
  }
}

/* ---- scales ---------------------------------------------------------- */
float moe8_scale_from_absmax(float absmax, moe8_dtype qtype, float clip, bool pow2) {
  const moe8_dtype_traits *t = moe8_dtype_info(qtype);
  const float qmax = t ? t->finite_max : 1.0f;
  if (clip > 0.0f && clip != 1.0f) absmax *= clip;
  float s = absmax / qmax;
  if (!(s >= 0x1p-126f) || !(s <= 3.40282347e38f)) return 1.0f;
  if (pow2) {
    int e;
    const float m = frexpf(s, &e); /* s = m · 2^e, m in [0.5, 1) */
    if (m != 0.5f) s = ldexpf(1.0f, e);
  }
  return s;
}

/* qwix's int8 (MOE8_CALIB_QWIX): s = absmax / 127.5 (1 below 2^-63 or
** past the f32 range), q = clamp(round-half-even(x / s), -128, 127). */
static float scale_qwix(float absmax, float clip) {
  if (clip > 0.0f && clip != 1.0f) absmax *= clip;
  const float s = absmax / 127.5f;
  return s >= 0x1p-63f && s <= 3.40282347e38f ? s : 1.0f;
}

/* OCP MX's FP8 scale: 2^(floor(log2 amax) - emax), the exponent in [-127, 127]. */
static float scale_mx(float absmax, moe8_dtype qt) {
  if (!(absmax > 0.0f) || !(absmax <= 3.40282347e38f)) return 1.0f;
  int e;
  (void)frexpf(absmax, &e); /* floor(log2 amax) = e - 1 */
  int x = e - 1 - (qt == MOE8_DTYPE_F8E5M2 ? 15 : 8);
  x = x < -127 ? -127 : x > 127 ? 127 : x;
  return ldexpf(1.0f, x);
}

static void quant_div_qwix(void *q, const float *x, const float *s, size_t s_step, size_t n, moe8_dtype qtype) {
  (void)qtype;
  int8_t *o = q;
  for (size_t i = 0; i < n; i++) {
    const float v = rintf(x[i] / s[i * s_step]);
    o[i] = (int8_t)(v >= 127.0f ? 127 : v <= -128.0f ? -128 : (int)v);
  }
}

/* ---- spec validation ------------------------------------------------- */
static moe8_status check_spec(const moe8_quant_spec *spec, int64_t E, int64_t R, int64_t C) {
  if (!spec) return moe8__fail(MOE8_ERR_INVALID_ARG, "quantize: NULL spec");
  if (!moe8__is_qtype(spec->qtype))
    return moe8__fail(MOE8_ERR_DTYPE, "quantize: qtype %s is not f8e4m3, f8e5m2 or i8",
                      moe8_dtype_info(spec->qtype) ? moe8_dtype_info(spec->qtype)->name : "(none)");
  if (E < 0 || R < 0 || C < 0)
    return moe8__fail(MOE8_ERR_SHAPE, "quantize: negative size [%lld, %lld, %lld]",
                      (long long)E, (long long)R, (long long)C);
  if (!(spec->clip >= 0.0f && spec->clip <= 1e30f))
    return moe8__fail(MOE8_ERR_INVALID_ARG, "quantize: clip %g is not in (0, 1e30]", (double)spec->clip);
  if (spec->calib != MOE8_CALIB_ABSMAX && spec->calib != MOE8_CALIB_QWIX && spec->calib != MOE8_CALIB_MX)
    return moe8__fail(MOE8_ERR_INVALID_ARG, "quantize: calibration %d is not one (absmax 0, qwix 1, mx 2)", (int)spec->calib);
  if (spec->calib == MOE8_CALIB_MX && (spec->qtype == MOE8_DTYPE_I8 || spec->pow2 || (spec->clip != 0.0f && spec->clip != 1.0f)))
    return moe8__fail(MOE8_ERR_INVALID_ARG, "quantize: the mx calibration is for FP8 (MXFP8), without clip or pow2");
  if (spec->calib == MOE8_CALIB_QWIX && spec->pow2)
    return moe8__fail(MOE8_ERR_INVALID_ARG, "quantize: the qwix calibration has no power-of-two scales");
  switch (spec->gran) {
    case MOE8_GRAN_TENSOR: case MOE8_GRAN_CHANNEL: break;
    case MOE8_GRAN_ROW:
      if (E != 1) return moe8__fail(MOE8_ERR_SHAPE, "quantize: per-row activation must have E = 1, got %lld", (long long)E);
      break;
    case MOE8_GRAN_ROW_TILE:
      if (E != 1) return moe8__fail(MOE8_ERR_SHAPE, "quantize: per-row activation must have E = 1, got %lld", (long long)E);
      /* fallthrough */
    case MOE8_GRAN_CHANNEL_TILE:
      if (spec->tile <= 0) return moe8__fail(MOE8_ERR_INVALID_ARG, "quantize: tile %lld must be > 0", (long long)spec->tile);
      break;
    case MOE8_GRAN_BLOCK2D:
      if (spec->tile <= 0 || spec->block_n <= 0)
        return moe8__fail(MOE8_ERR_INVALID_ARG, "quantize: 2-D block %lldx%lld must be positive",
                          (long long)spec->block_n, (long long)spec->tile);
      break;
    default:
      return moe8__fail(MOE8_ERR_INVALID_ARG, "quantize: unknown granularity %d", (int)spec->gran);
  }
  return MOE8_OK;
}

size_t moe8_quant_scale_count(const moe8_quant_spec *spec, int64_t E, int64_t R, int64_t C,
                              moe8_status *status) {
  moe8_status st = check_spec(spec, E, R, C);
  if (status) *status = st;
  if (st != MOE8_OK) return 0;
  switch (spec->gran) {
    case MOE8_GRAN_TENSOR:       return 1;
    case MOE8_GRAN_ROW:          return (size_t)R;
    case MOE8_GRAN_ROW_TILE:     return (size_t)(R * moe8__cdiv(C, spec->tile));
    case MOE8_GRAN_CHANNEL:      return (size_t)(E * C);
    case MOE8_GRAN_CHANNEL_TILE: return (size_t)(E * moe8__cdiv(R, spec->tile) * C);
    case MOE8_GRAN_BLOCK2D:      return (size_t)(E * moe8__cdiv(R, spec->block_n) * moe8__cdiv(C, spec->tile));
  }
  return 0;
}

/* On the error path only: where is the first non-finite value? */
static moe8_status nonfinite_error(const float *x, int64_t E, int64_t R, int64_t C, size_t count,
                                   size_t *nonfinite) {
  if (nonfinite) *nonfinite = count;
  const size_t n = (size_t)(E * R * C);
  size_t i = 0;
  while (i < n && isfinite(x[i])) i++;
  const size_t e = i / (size_t)(R * C), r = (i / (size_t)C) % (size_t)R, c = i % (size_t)C;
  return moe8__fail(MOE8_ERR_NONFINITE,
                    "quantize: %zu non-finite value(s) in input [%lld, %lld, %lld], first at [%zu, %zu, %zu] (%g)",
                    count, (long long)E, (long long)R, (long long)C, e, r, c, (double)x[i < n ? i : 0]);
}

moe8_status moe8_quantize(const moe8_quant_spec *spec, const float *x, int64_t E, int64_t R,
                          int64_t C, void *q, float *scale, size_t *nonfinite) {
  moe8_status st = check_spec(spec, E, R, C);
  if (st != MOE8_OK) return st;
  if (nonfinite) *nonfinite = 0;
  const size_t n = (size_t)(E * R * C);
  if ((n && (!x || !q)) || !scale) return moe8__fail(MOE8_ERR_INVALID_ARG, "quantize: NULL buffer");
  const moe8__ktable *k = moe8__kernels();
  const moe8_dtype qt = spec->qtype;
  const float clip = spec->clip;
  const bool p2 = spec->pow2;
  /* qwix's FP8 is moe8's, byte for byte; its int8 has its own bound. */
  const bool qw = spec->calib == MOE8_CALIB_QWIX && qt == MOE8_DTYPE_I8;
  void (*const quant_div)(void *, const float *, const float *, size_t, size_t, moe8_dtype) = qw ? quant_div_qwix : k->quant_div;
  const bool mx = spec->calib == MOE8_CALIB_MX;
#define SCALE_OF(amax) (qw ? scale_qwix((amax), clip) : mx ? scale_mx((amax), qt) : moe8_scale_from_absmax((amax), qt, clip, p2))
  uint8_t *qb = q;
  size_t bad = 0;

  switch (spec->gran) {
    case MOE8_GRAN_TENSOR: {
      const float amax = k->absmax(x, n, &bad);
      if (bad) return nonfinite_error(x, E, R, C, bad, nonfinite);
      scale[0] = SCALE_OF(amax);
      quant_div(q, x, scale, 0, n, qt);
      return MOE8_OK;
    }
    case MOE8_GRAN_ROW:
    case MOE8_GRAN_ROW_TILE: {
      const int64_t tile = spec->gran == MOE8_GRAN_ROW ? (C > 0 ? C : 1) : spec->tile;
      const int64_t nt = moe8__cdiv(C, tile);
      const int64_t ns = spec->gran == MOE8_GRAN_ROW ? 1 : nt;
      /* One pass per row: its scales, then its values while it is in cache. */
      #pragma omp parallel for num_threads(moe8__nt(4.0 * (double)R * (double)C)) reduction(+ : bad) schedule(static)
      for (int64_t r = 0; r < R; r++) {
        if (C == 0) { scale[r] = 1.0f; continue; }
        for (int64_t j = 0; j < nt; j++) {
          const int64_t c0 = j * tile, len = C - c0 < tile ? C - c0 : tile;
          size_t b = 0;
          const float amax = k->absmax(x + r * C + c0, (size_t)len, &b);
          bad += b;
          scale[r * ns + j] = SCALE_OF(amax);
          quant_div(qb + r * C + c0, x + r * C + c0, &scale[r * ns + j], 0, (size_t)len, qt);
        }
      }
      if (bad) return nonfinite_error(x, E, R, C, bad, nonfinite);
      return MOE8_OK;
    }
    case MOE8_GRAN_CHANNEL:
    case MOE8_GRAN_CHANNEL_TILE: {
      /* w[E, K=R, N=C]; the scale row of block kb is scale[e, kb, :]. */
      const int64_t tile = spec->gran == MOE8_GRAN_CHANNEL ? (R > 0 ? R : 1) : spec->tile;
      const int64_t nb = spec->gran == MOE8_GRAN_CHANNEL ? 1 : moe8__cdiv(R, tile);
      #pragma omp parallel for collapse(2) num_threads(moe8__nt(2.0 * (double)E * (double)R * (double)C)) reduction(+ : bad) schedule(static)
      for (int64_t e = 0; e < E; e++)
        for (int64_t b = 0; b < nb; b++) {
          float *s = scale + (e * nb + b) * C;
          for (int64_t c = 0; c < C; c++) s[c] = 0.0f;
          const int64_t k1 = (b + 1) * tile < R ? (b + 1) * tile : R;
          for (int64_t kk = b * tile; kk < k1; kk++) bad += k->absmax_acc(s, x + (e * R + kk) * C, (size_t)C);
          for (int64_t c = 0; c < C; c++) s[c] = SCALE_OF(s[c]);
        }
      if (bad) return nonfinite_error(x, E, R, C, bad, nonfinite);
      #pragma omp parallel for collapse(2) num_threads(moe8__nt(4.0 * (double)E * (double)R * (double)C)) schedule(static)
      for (int64_t e = 0; e < E; e++)
        for (int64_t kk = 0; kk < R; kk++)
          quant_div(qb + (e * R + kk) * C, x + (e * R + kk) * C, scale + (e * nb + kk / tile) * C, 1,
                       (size_t)C, qt);
      return MOE8_OK;
    }
    case MOE8_GRAN_BLOCK2D: {
      /* w[E, N=R, K=C]; scale[e, R/bn, C/bk]. */
      const int64_t bn = spec->block_n, bk = spec->tile;
      const int64_t nbr = moe8__cdiv(R, bn), nbc = moe8__cdiv(C, bk);
      #pragma omp parallel for collapse(2) num_threads(moe8__nt(2.0 * (double)E * (double)R * (double)C)) reduction(+ : bad) schedule(static)
      for (int64_t e = 0; e < E; e++)
        for (int64_t br = 0; br < nbr; br++)
          for (int64_t bc = 0; bc < nbc; bc++) {
            const int64_t r1 = (br + 1) * bn < R ? (br + 1) * bn : R;
            const int64_t c0 = bc * bk, len = C - c0 < bk ? C - c0 : bk;
            float amax = 0.0f;
            size_t b = 0;
            for (int64_t r = br * bn; r < r1; r++) {
              const float m = k->absmax(x + (e * R + r) * C + c0, (size_t)len, &b);
              if (m > amax) amax = m;
            }
            bad += b;
            scale[(e * nbr + br) * nbc + bc] = SCALE_OF(amax);
          }
      if (bad) return nonfinite_error(x, E, R, C, bad, nonfinite);
      #pragma omp parallel for collapse(2) num_threads(moe8__nt(4.0 * (double)E * (double)R * (double)C)) schedule(static)
      for (int64_t e = 0; e < E; e++)
        for (int64_t r = 0; r < R; r++)
          for (int64_t bc = 0; bc < nbc; bc++) {
            const int64_t c0 = bc * bk, len = C - c0 < bk ? C - c0 : bk;
            const size_t off = (size_t)((e * R + r) * C + c0);
            quant_div(qb + off, x + off, &scale[(e * nbr + r / bn) * nbc + bc], 0, (size_t)len, qt);
          }
      return MOE8_OK;
    }
  }
  #undef SCALE_OF
  return moe8__fail(MOE8_ERR_INTERNAL, "quantize: unreachable granularity");
}

moe8_status moe8_dequantize(const moe8_quant_spec *spec, const void *q, const float *scale,
                            int64_t E, int64_t R, int64_t C, float *y) {
  moe8_status st = check_spec(spec, E, R, C);
  if (st != MOE8_OK) return st;
  const size_t n = (size_t)(E * R * C);
  if (n && (!q || !scale || !y)) return moe8__fail(MOE8_ERR_INVALID_ARG, "dequantize: NULL buffer");
  if (n == 0) return MOE8_OK; /* nothing to read: the buffers may be NULL */
  const moe8__ktable *k = moe8__kernels();
  const moe8_dtype t = spec->qtype;
  const moe8_granularity g = spec->gran;
  /* Row by row, each a run of stretches that share a scale (s_step 0) or
  ** a row of column scales (s_step 1). */
  const int64_t tile = spec->tile > 0 ? spec->tile : 1, bn = spec->block_n > 0 ? spec->block_n : 1;
  const int64_t nbc = moe8__cdiv(C, tile);
  #pragma omp parallel for collapse(2) num_threads(moe8__nt(2.0 * (double)E * (double)R * (double)C)) schedule(static)
  for (int64_t e = 0; e < E; e++)
    for (int64_t r = 0; r < R; r++) {
      const size_t o = (size_t)((e * R + r) * C);
      const uint8_t *qr = (const uint8_t *)q + o;
      float *yr = y + o;
      switch (g) {
        case MOE8_GRAN_TENSOR: k->dequant(yr, qr, scale, 0, (size_t)C, t); break;
        case MOE8_GRAN_ROW: k->dequant(yr, qr, scale + r, 0, (size_t)C, t); break;
        case MOE8_GRAN_CHANNEL: k->dequant(yr, qr, scale + e * C, 1, (size_t)C, t); break;
        case MOE8_GRAN_CHANNEL_TILE: k->dequant(yr, qr, scale + (e * moe8__cdiv(R, tile) + r / tile) * C, 1, (size_t)C, t); break;
        case MOE8_GRAN_ROW_TILE:
        case MOE8_GRAN_BLOCK2D: {
          const float *sr = g == MOE8_GRAN_ROW_TILE ? scale + r * nbc : scale + (e * moe8__cdiv(R, bn) + r / bn) * nbc;
          for (int64_t j = 0; j < nbc; j++) {
            const int64_t c0 = j * tile, len = C - c0 < tile ? C - c0 : tile;
            k->dequant(yr + c0, qr + c0, sr + j, 0, (size_t)len, t);
          }
          break;
        }
      }
    }
  return MOE8_OK;
}

/* ---- MXFP4 ----------------------------------------------------------------- */
uint8_t moe8__e2m1_code(float v) {
  const uint8_t sign = signbit(v) ? 8 : 0;
  const float a = fabsf(v);
  /* the magnitudes 0 .5 1 1.5 2 3 4 6 (codes 0..7); at a midpoint the even
  ** code (last bit 0): 0.25 -> 0, 0.75 -> 1.0, 1.25 -> 1.0, 1.75 -> 2.0,
  ** 2.5 -> 2, 3.5 -> 4, 5 -> 4 */
  uint8_t m;
  if (a <= 0.25f) m = 0;
  else if (a < 0.75f) m = 1;
  else if (a <= 1.25f) m = 2;
  else if (a < 1.75f) m = 3;
  else if (a <= 2.5f) m = 4;
  else if (a < 3.5f) m = 5;
  else if (a <= 5.0f) m = 6;
  else m = 7;
  return sign | m;
}

void moe8__mx4_quantize(const float *w, int64_t K, int64_t N, uint8_t *blk, uint8_t *sc) {
  const int64_t nb = K / 32;
  #pragma omp parallel for num_threads(moe8__nt(8.0 * (double)K * (double)N)) schedule(static)
  for (int64_t n = 0; n < N; n++)
    for (int64_t b = 0; b < nb; b++) {
      float amax = 0.0f;
      for (int64_t k = b * 32; k < b * 32 + 32; k++) amax = fabsf(w[k * N + n]) > amax ? fabsf(w[k * N + n]) : amax;
      int e = 0;
      if (amax > 0.0f) (void)frexpf(amax, &e); /* amax = m 2^e, m in [0.5, 1): floor(log2 amax) = e - 1 */
      int s = amax > 0.0f ? e - 1 - 2 + 127 : 0;
      s = s < 0 ? 0 : s > 254 ? 254 : s;
      sc[n * nb + b] = (uint8_t)s;
      const float inv = ldexpf(1.0f, 127 - s); /* 1 / X, exact: X is a power of two */
      uint8_t *q = blk + (n * nb + b) * 16;
      for (int j = 0; j < 16; j++) {
        const int64_t k = b * 32 + 2 * j;
        q[j] = (uint8_t)(moe8__e2m1_code(w[k * N + n] * inv) | moe8__e2m1_code(w[(k + 1) * N + n] * inv) << 4);
      }
    }
}

/* The kernels' layout (core/internal.h). */
void moe8__mx4_repack(uint8_t *dst, const uint8_t *src, int64_t N, int64_t K) {
  const int64_t nb = K / 32, ng = nb / 8, rb = moe8__mx4_row_bytes(K);
  #pragma omp parallel for num_threads(moe8__nt(4.0 * (double)K * (double)N)) schedule(static)
  for (int64_t n = 0; n < N; n++) {
    const uint8_t *in = src + n * nb * 16;
    uint8_t *q = dst + n * rb;
    memset(q, 0, (size_t)rb);
    for (int64_t g = 0; g < ng; g++)
      for (int j = 0; j < 8; j++)
        for (int k = 0; k < 32; k++) {
          const uint8_t code = (uint8_t)(in[(g * 8 + j) * 16 + k / 2] >> (4 * (k & 1)) & 15);
          q[g * 128 + (k / 16) * 64 + 4 * (k % 16) + j / 2] |= (uint8_t)(code << (4 * (j & 1)));
        }
    for (int64_t b = ng * 8; b < nb; b++)
      for (int L = 0; L < 16; L++) {
        const uint8_t lo = (uint8_t)(in[b * 16 + L / 2] >> (4 * (L & 1)) & 15), hi = (uint8_t)(in[b * 16 + (16 + L) / 2] >> (4 * (L & 1)) & 15);
        q[b * 16 + L] = (uint8_t)(lo | hi << 4);
      }
  }
}

/* Word u of an OCP block (codes k = 8u .. 8u + 7, nibble m = k - 8u) to
** the column-group word: byte t takes nibbles t (low) and 4 + t (high),
** i.e. nibble order 0 4 1 5 2 6 3 7: bytes 1 and 2 swapped, then nibbles
** 1 and 2 of each half. */
static inline uint32_t mx4_cols_word(uint32_t x) {
  uint32_t t = (x ^ (x >> 8)) & 0x0000FF00u;
  x ^= t ^ (t << 8);
  t = (x ^ (x >> 4)) & 0x00F000F0u;
  return x ^ t ^ (t << 4);
}

void moe8__mx4_to_cols(uint8_t *dst_b, uint8_t *dst_s, const uint8_t *src, const uint8_t *sc, int64_t N, int64_t K) {
  const int64_t nb = K / 32, ncg = (N + 15) / 16;
  #pragma omp parallel for num_threads(moe8__nt(2.0 * (double)K * (double)N)) schedule(static)
  for (int64_t c = 0; c < ncg; c++)
    for (int64_t b = 0; b < nb; b++) {
      uint8_t *o = dst_b + (c * nb + b) * 256, *os = dst_s + (c * nb + b) * 16;
      for (int i = 0; i < 16; i++) {
        const int64_t n = 16 * c + i;
        for (int u = 0; u < 4; u++) {
          uint32_t w = 0;
          if (n < N) memcpy(&w, src + (n * nb + b) * 16 + 4 * u, 4);
          w = mx4_cols_word(w);
          memcpy(o + 64 * u + 4 * i, &w, 4);
        }
        os[i] = n < N ? sc[n * nb + b] : 0;
      }
    }
}

void moe8__mx4_xpack(uint8_t *dst, const int8_t *q, const float *s, int64_t sbl, int64_t K) {
  const int64_t nb = K / 32;
  memset(dst, 0, (size_t)moe8__mx4_xpack_bytes(K));
  memcpy(dst, q, (size_t)K);
  for (int64_t b = 0; b < nb; b++) {
    int32_t sum = 0;
    for (int k = 0; k < 32; k++) sum += q[32 * b + k];
    const int32_t nc = -12 * sum;
    const float sh = 0.5f * s[b / sbl];
    memcpy(dst + K + 4 * b, &nc, 4);
    memcpy(dst + K + 4 * nb + 4 * b, &sh, 4);
  }
}
