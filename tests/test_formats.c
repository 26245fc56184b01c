/*
** test_formats.c — docs/numerics.md: the number formats.
**
** The f32 -> FP8 conversions are checked on every one of the 2^32 inputs
** against an independent reference: the nearest point of the enumerated
** FP8 grid (decoded with ldexp, in double), ties to the even code, with a
** virtual point one step past the largest finite value to decide overflow.
** Each ISA's bulk kernel is compared with the scalar conversion on the same
** 2^32 inputs, byte for byte.  With MOE8_TEST_EXHAUSTIVE=0 (the sanitizer
** pass) a strided sample plus the special values is used instead.
*/
#include "testutil.h"
#include "core/internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- the independent grid reference ---------------------------------- */
typedef struct grid {
  double  v[132];
  uint8_t code[132];
  int     n;           /* points including the virtual overflow point */
  uint8_t max_code, nosat_code;
} grid;

static void grid_build(grid *g, int ebits, int mbits) {
  const int bias = (1 << (ebits - 1)) - 1;
  g->n = 0;
  const int ncodes = ebits == 4 ? 0x7F : 0x7C; /* first non-finite code */
  for (int c = 0; c <= ncodes; c++) {
    const int e = c >> mbits, m = c & ((1 << mbits) - 1);
    double v = e == 0 ? ldexp((double)m, 1 - bias - mbits) : ldexp(1.0 + ldexp((double)m, -mbits), e - bias);
    g->v[g->n] = v;
    g->code[g->n] = (uint8_t)c; /* the last one is the virtual point */
    g->n++;
  }
  g->max_code = (uint8_t)(ncodes - 1);
  g->nosat_code = ebits == 4 ? 0x7F : 0x7C;
}

static uint8_t grid_ref(const grid *g, float x, int sat) {
  if (isnan(x)) return 0x7F;
  const uint8_t sign = signbit(x) ? 0x80 : 0;
  const double ax = fabs((double)x);
  int chosen;
  if (isinf(ax) || ax >= g->v[g->n - 1]) {
    chosen = g->n - 1;
  } else {
    int lo = 0, hi = g->n - 1; /* v[lo] <= ax < v[hi] */
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      if (g->v[mid] <= ax) lo = mid; else hi = mid;
    }
    const double dl = ax - g->v[lo], dh = g->v[hi] - ax;
    if (dl < dh) chosen = lo;
    else if (dh < dl) chosen = hi;
    else chosen = (g->code[lo] & 1) ? hi : lo;
  }
  if (chosen == g->n - 1) return sign | (sat ? g->max_code : g->nosat_code);
  return sign | g->code[chosen];
}

/* ---- exhaustive sweep -------------------------------------------------- */
typedef struct sweep_result {
  uint64_t bad_ref, bad_isa;
  uint32_t first_ref, first_isa;
  int      first_isa_which;
} sweep_result;

enum { CHUNK = 1 << 16 };

static void sweep_fp8(moe8_dtype type, uint64_t stride, sweep_result *res) {
  grid g;
  grid_build(&g, type == MOE8_DTYPE_F8E4M3 ? 4 : 5, type == MOE8_DTYPE_F8E4M3 ? 3 : 2);
  moe8_isa isas[MOE8_ISA_COUNT];
  const int nisa = tu_isas(isas);
  const moe8__ktable *tab[MOE8_ISA_COUNT];
  for (int i = 0; i < nisa; i++) tab[i] = moe8__kernels_for(isas[i]);
  const uint64_t total = 1ULL << 32;
  const int64_t nchunks = (int64_t)(total / ((uint64_t)CHUNK * stride));
  uint64_t bad_ref = 0, bad_isa = 0;
  uint32_t first_ref = 0, first_isa = 0;
  int first_which = 0;
  static tu_progress pr;
  tu_progress_start(&pr, type == MOE8_DTYPE_F8E4M3 ? "f32 -> f8e4m3 sweep" : "f32 -> f8e5m2 sweep", nchunks);
  #pragma omp parallel for schedule(dynamic, 16) reduction(+ : bad_ref, bad_isa)
  for (int64_t c = 0; c < nchunks; c++) {
    float *src = malloc(CHUNK * sizeof(float));
    uint8_t *want[2], *got = malloc(CHUNK);
    want[0] = malloc(CHUNK); want[1] = malloc(CHUNK);
    for (uint32_t i = 0; i < CHUNK; i++)
      src[i] = moe8__bits_f32((uint32_t)(((uint64_t)c * CHUNK + i) * stride + (stride > 1 ? (uint64_t)c % stride : 0)));
    for (int sat = 0; sat < 2; sat++) {
      for (uint32_t i = 0; i < CHUNK; i++) {
        const uint8_t s = type == MOE8_DTYPE_F8E4M3 ? moe8_f32_to_f8e4m3(src[i], sat) : moe8_f32_to_f8e5m2(src[i], sat);
        want[sat][i] = s;
        if (s != grid_ref(&g, src[i], sat)) {
          if (!bad_ref) first_ref = moe8__f32_bits(src[i]);
          bad_ref++;
        }
      }
      for (int t = 0; t < nisa; t++) {
        tab[t]->cvt_f32_f8(got, src, CHUNK, type, sat);
        if (memcmp(got, want[sat], CHUNK) != 0) {
          for (uint32_t i = 0; i < CHUNK; i++)
            if (got[i] != want[sat][i]) { first_isa = moe8__f32_bits(src[i]); first_which = isas[t]; break; }
          bad_isa++;
        }
      }
    }
    free(src); free(got); free(want[0]); free(want[1]);
    tu_progress_tick(&pr);
  }
  res->bad_ref = bad_ref; res->bad_isa = bad_isa;
  res->first_ref = first_ref; res->first_isa = first_isa; res->first_isa_which = first_which;
}

static void check_sweep(moe8_dtype type) {
  sweep_result r;
  sweep_fp8(type, tu_exhaustive() ? 1 : 4099, &r);
  if (r.bad_ref) TU_FAIL("%s: %llu inputs differ from the grid reference, e.g. 0x%08x",
                         moe8_dtype_info(type)->name, (unsigned long long)r.bad_ref, r.first_ref);
  if (r.bad_isa) TU_FAIL("%s: %llu chunks differ on ISA %s, e.g. input 0x%08x", moe8_dtype_info(type)->name,
                         (unsigned long long)r.bad_isa, moe8_isa_name((moe8_isa)r.first_isa_which), r.first_isa);
}

static void test_f32_to_e4m3_all_inputs(void **state) { (void)state; check_sweep(MOE8_DTYPE_F8E4M3); }
static void test_f32_to_e5m2_all_inputs(void **state) { (void)state; check_sweep(MOE8_DTYPE_F8E5M2); }

/* Known values from docs/numerics.md, independent of any formula. */
static void test_fp8_spot_values(void **state) {
  (void)state;
  assert_int_equal(moe8_f32_to_f8e4m3(448.0f, true), 0x7E);
  assert_int_equal(moe8_f32_to_f8e4m3(464.0f, true), 0x7E);   /* tie -> even 448 */
  assert_int_equal(moe8_f32_to_f8e4m3(464.0f, false), 0x7E);
  assert_int_equal(moe8_f32_to_f8e4m3(464.1f, false), 0x7F);  /* NaN             */
  assert_int_equal(moe8_f32_to_f8e4m3(-1e9f, true), 0xFE);
  assert_int_equal(moe8_f32_to_f8e4m3(INFINITY, true), 0x7E);
  assert_int_equal(moe8_f32_to_f8e4m3(-INFINITY, false), 0xFF);
  assert_int_equal(moe8_f32_to_f8e4m3(-NAN, true), 0x7F);     /* sign dropped    */
  assert_int_equal(moe8_f32_to_f8e4m3(0x1p-9f, true), 0x01);  /* min subnormal   */
  assert_int_equal(moe8_f32_to_f8e4m3(0x1p-10f, true), 0x00); /* tie -> even 0   */
  assert_int_equal(moe8_f32_to_f8e4m3(0x1.8p-9f, true), 0x02);/* tie -> even 2   */
  assert_int_equal(moe8_f32_to_f8e4m3(1.0f, true), 0x38);
  assert_int_equal(moe8_f32_to_f8e4m3(-0.0f, true), 0x80);
  assert_int_equal(moe8_f32_to_f8e5m2(57344.0f, true), 0x7B);
  assert_int_equal(moe8_f32_to_f8e5m2(61439.0f, false), 0x7B);
  assert_int_equal(moe8_f32_to_f8e5m2(61440.0f, false), 0x7C);/* tie -> even inf */
  assert_int_equal(moe8_f32_to_f8e5m2(61440.0f, true), 0x7B);
  assert_int_equal(moe8_f32_to_f8e5m2(-INFINITY, false), 0xFC);
  assert_int_equal(moe8_f32_to_f8e5m2(-INFINITY, true), 0xFB);
  assert_int_equal(moe8_f32_to_f8e5m2(NAN, false), 0x7F);
  assert_int_equal(moe8_f32_to_f8e5m2(0x1p-16f, true), 0x01);
  assert_int_equal(moe8_f32_to_f8e5m2(1.0f, true), 0x3C);
}

static void test_fp8_decode_all_codes(void **state) {
  (void)state;
  for (int c = 0; c < 256; c++) {
    const int s = c >> 7;
    /* e4m3 */
    {
      const int e = (c >> 3) & 15, m = c & 7;
      const float got = moe8_f8e4m3_to_f32((uint8_t)c);
      if (e == 15 && m == 7) {
        assert_true(isnan(got));
      } else {
        const double v = (e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10)) * (s ? -1 : 1);
        assert_true((double)got == v);
        assert_int_equal(!!signbit(got), s);
        /* Exact in bf16 and round-trips to the same code. */
        assert_int_equal((uint32_t)moe8_f32_to_bf16(got) << 16, moe8__f32_bits(got));
        assert_int_equal(moe8_f32_to_f8e4m3(got, true), c);
      }
    }
    /* e5m2 */
    {
      const int e = (c >> 2) & 31, m = c & 3;
      const float got = moe8_f8e5m2_to_f32((uint8_t)c);
      if (e == 31 && m) {
        assert_true(isnan(got));
      } else if (e == 31) {
        assert_true(isinf(got));
        assert_int_equal(!!signbit(got), s);
        assert_int_equal(moe8_f32_to_f8e5m2(got, false), c);
      } else {
        const double v = (e == 0 ? ldexp(m, -16) : ldexp(4 + m, e - 17)) * (s ? -1 : 1);
        assert_true((double)got == v);
        assert_int_equal((uint32_t)moe8_f32_to_bf16(got) << 16, moe8__f32_bits(got));
        assert_int_equal(moe8_f32_to_f8e5m2(got, true), c);
      }
    }
  }
  /* The bulk decoders and moe8_convert to bf16 agree with the scalar ones on every ISA. */
  uint8_t codes[256];
  for (int c = 0; c < 256; c++) codes[c] = (uint8_t)c;
  moe8_isa isas[MOE8_ISA_COUNT];
  const int nisa = tu_isas(isas);
  for (int t = 0; t < 2; t++) {
    const moe8_dtype type = t ? MOE8_DTYPE_F8E5M2 : MOE8_DTYPE_F8E4M3;
    for (int i = 0; i < nisa; i++) {
      for (size_t n = 0; n <= 256; n += (n < 40 ? 1 : 37)) {
        float *out = tu_alloc(n * 4);
        moe8__kernels_for(isas[i])->cvt_f8_f32(out, codes + (256 - n), n, type);
        for (size_t j = 0; j < n; j++) {
          const float want = t ? moe8_f8e5m2_to_f32(codes[256 - n + j]) : moe8_f8e4m3_to_f32(codes[256 - n + j]);
          if (moe8__f32_bits(out[j]) != moe8__f32_bits(want))
            TU_FAIL("%s decode on %s: code 0x%02x gives 0x%08x, want 0x%08x", moe8_dtype_info(type)->name,
                    moe8_isa_name(isas[i]), codes[256 - n + j], moe8__f32_bits(out[j]), moe8__f32_bits(want));
        }
        assert_true(tu_guard_ok(out, n * 4));
        free(out);
        /* FP8 -> bf16 in bulk: every code, exact, with tails. */
        uint16_t *bo = tu_alloc(n * 2);
        moe8__kernels_for(isas[i])->cvt_f8_bf16(bo, codes + (256 - n), n, type);
        for (size_t j = 0; j < n; j++) {
          const uint8_t c = codes[256 - n + j];
          const uint16_t want = moe8_f32_to_bf16(t ? moe8_f8e5m2_to_f32(c) : moe8_f8e4m3_to_f32(c));
          if (bo[j] != want)
            TU_FAIL("%s -> bf16 on %s: code 0x%02x gives 0x%04x, want 0x%04x", moe8_dtype_info(type)->name,
                    moe8_isa_name(isas[i]), c, bo[j], want);
        }
        assert_true(tu_guard_ok(bo, n * 2));
        free(bo);
      }
      assert_int_equal(moe8_isa_set(isas[i]), MOE8_OK);
      uint16_t bf[256];
      assert_int_equal(moe8_convert(bf, MOE8_DTYPE_BF16, codes, type, 256, 0), MOE8_OK);
      for (int c = 0; c < 256; c++) {
        const float want = t ? moe8_f8e5m2_to_f32((uint8_t)c) : moe8_f8e4m3_to_f32((uint8_t)c);
        if (isnan(want)) assert_true((bf[c] & 0x7FFF) > 0x7F80);
        else assert_int_equal((uint32_t)bf[c] << 16, moe8__f32_bits(want));
      }
    }
  }
  moe8_isa_set(tu_isa_best());
}

/* f32 -> bf16: nearest of the two bf16 neighbours, computed in double. */
static uint16_t bf16_ref(uint32_t u) {
  if ((u & 0x7FFFFFFF) > 0x7F800000) return (uint16_t)((u >> 16) | 0x40);
  const uint32_t lo = u & 0xFFFF0000u;
  if (lo == u) return (uint16_t)(u >> 16);
  const double x = fabs((double)moe8__bits_f32(u));
  const double vlo = fabs((double)moe8__bits_f32(lo));
  const uint32_t hib = (lo & 0x7FFFFFFF) + 0x10000;
  const double vhi = hib == 0x7F800000 ? ldexp(1.0, 128) : (double)moe8__bits_f32(hib);
  const double dl = x - vlo, dh = vhi - x;
  const int up = dh < dl || (dh == dl && ((lo >> 16) & 1));
  return (uint16_t)((up ? (lo & 0x80000000u) | hib : lo) >> 16);
}

static void test_f32_to_bf16_all_inputs(void **state) {
  (void)state;
  const uint64_t stride = tu_exhaustive() ? 1 : 4099;
  moe8_isa isas[MOE8_ISA_COUNT];
  const int nisa = tu_isas(isas);
  uint64_t bad = 0, bad_isa = 0;
  uint32_t first = 0;
  const int64_t nchunks = (int64_t)((1ULL << 32) / ((uint64_t)CHUNK * stride));
  static tu_progress pr;
  tu_progress_start(&pr, "f32 -> bf16 sweep", nchunks);
  #pragma omp parallel for schedule(dynamic, 16) reduction(+ : bad, bad_isa)
  for (int64_t c = 0; c < nchunks; c++) {
    float *src = malloc(CHUNK * 4);
    uint16_t *want = malloc(CHUNK * 2), *got = malloc(CHUNK * 2);
    for (uint32_t i = 0; i < CHUNK; i++) {
      const uint32_t u = (uint32_t)(((uint64_t)c * CHUNK + i) * stride);
      src[i] = moe8__bits_f32(u);
      want[i] = moe8_f32_to_bf16(src[i]);
      if (want[i] != bf16_ref(u)) { if (!bad) first = u; bad++; }
    }
    for (int t = 0; t < nisa; t++) {
      moe8__kernels_for(isas[t])->cvt_f32_bf16(got, src, CHUNK);
      bad_isa += memcmp(got, want, CHUNK * 2) != 0;
    }
    free(src); free(want); free(got);
    tu_progress_tick(&pr);
  }
  if (bad) TU_FAIL("f32->bf16: %llu inputs differ from the reference, e.g. 0x%08x", (unsigned long long)bad, first);
  if (bad_isa) TU_FAIL("f32->bf16: %llu chunks differ between ISAs", (unsigned long long)bad_isa);
  assert_int_equal(moe8_f32_to_bf16(NAN) & 0x7FC0, 0x7FC0);
  assert_int_equal(moe8_f32_to_bf16(moe8__bits_f32(0x7F800001u)), 0x7FC0); /* signalling -> quiet */
  assert_int_equal(moe8_f32_to_bf16(moe8__bits_f32(0x3F808000u)), 0x3F80); /* tie -> even        */
  assert_int_equal(moe8_f32_to_bf16(moe8__bits_f32(0x3F818000u)), 0x3F82); /* tie -> even (up)   */
  assert_int_equal(moe8_f32_to_bf16(3.4028235e38f), 0x7F80);               /* rounds to inf      */
}

static void test_f32_to_i8(void **state) {
  (void)state;
  const float in[] = {0.5f, 1.5f, 2.5f, -0.5f, -1.5f, 126.5f, 127.4f, 200.0f, -300.0f, INFINITY, -INFINITY, 3.49f, -0.0f};
  const int8_t want[] = {0, 2, 2, 0, -2, 126, 127, 127, -127, 127, -127, 3, 0};
  const size_t n = sizeof in / sizeof in[0];
  moe8_isa isas[MOE8_ISA_COUNT];
  const int nisa = tu_isas(isas);
  for (int t = 0; t < nisa; t++) {
    assert_int_equal(moe8_isa_set(isas[t]), MOE8_OK);
    int8_t out[16];
    assert_int_equal(moe8_convert(out, MOE8_DTYPE_I8, in, MOE8_DTYPE_F32, n, 0), MOE8_OK);
    assert_memory_equal(out, want, n);
    const float withnan[3] = {1.0f, NAN, -2.0f};
    assert_int_equal(moe8_convert(out, MOE8_DTYPE_I8, withnan, MOE8_DTYPE_F32, 3, 0), MOE8_ERR_NONFINITE);
    assert_non_null(strstr(moe8_last_error(), "1 NaN"));
    assert_int_equal(out[0], 1);
    assert_int_equal(out[1], 0);
    assert_int_equal(out[2], -2);
    /* Random data through the bulk kernel equals the scalar rule. */
    tu_rng_reset(77);
    for (size_t len = 0; len < 70; len++) {
      float x[70];
      int8_t q[70 + 16];
      for (size_t i = 0; i < len; i++) x[i] = tu_uniform(-140.0f, 140.0f);
      if (len > 3) x[len / 2] = 0.5f + (float)(len % 7); /* exact halves */
      memset(q, 0x55, sizeof q);
      assert_int_equal(moe8__kernels_for(isas[t])->cvt_f32_i8(q, x, len), 0);
      for (size_t i = 0; i < len; i++) assert_int_equal(q[i], moe8__f32_to_i8(x[i]));
      assert_int_equal((uint8_t)q[len], 0x55);
    }
  }
  moe8_isa_set(tu_isa_best());
}

/* moe8_convert between every pair equals the composition of scalar rules. */
static void test_convert_all_pairs(void **state) {
  (void)state;
  const moe8_dtype types[] = {MOE8_DTYPE_F32, MOE8_DTYPE_BF16, MOE8_DTYPE_F8E4M3, MOE8_DTYPE_F8E5M2, MOE8_DTYPE_I8};
  enum { N = 3001 };
  float *x = malloc(N * 4), *xf = malloc(N * 4);
  unsigned char *src = malloc(N * 4), *dst = malloc(N * 4 + 64);
  tu_rng_reset(5);
  for (int i = 0; i < N; i++) x[i] = tu_normal() * 40.0f;
  for (int a = 0; a < 5; a++)
    for (int b = 0; b < 5; b++)
      for (unsigned flags = 0; flags < 2; flags++) {
        const moe8_dtype st = types[a], dt = types[b];
        /* Make the source from x with the scalar rules, then its exact f32 value. */
        for (int i = 0; i < N; i++) {
          float v = x[i];
          switch (st) {
            case MOE8_DTYPE_F32: memcpy(src + 4 * i, &v, 4); xf[i] = v; break;
            case MOE8_DTYPE_BF16: { uint16_t h = moe8_f32_to_bf16(v); memcpy(src + 2 * i, &h, 2); xf[i] = moe8_bf16_to_f32(h); break; }
            case MOE8_DTYPE_F8E4M3: src[i] = moe8_f32_to_f8e4m3(v, true); xf[i] = moe8_f8e4m3_to_f32(src[i]); break;
            case MOE8_DTYPE_F8E5M2: src[i] = moe8_f32_to_f8e5m2(v, true); xf[i] = moe8_f8e5m2_to_f32(src[i]); break;
            default: { int8_t q = moe8__f32_to_i8(v); src[i] = (unsigned char)q; xf[i] = q; break; }
          }
        }
        memset(dst, 0xA5, N * 4 + 64);
        assert_int_equal(moe8_convert(dst, dt, src, st, N, flags), MOE8_OK);
        const size_t ds = moe8__dtype_size(dt);
        for (int i = 0; i < N; i++) {
          const float v = xf[i];
          uint32_t want = 0, got = 0;
          switch (dt) {
            case MOE8_DTYPE_F32: want = moe8__f32_bits(v); memcpy(&got, dst + 4 * i, 4); break;
            case MOE8_DTYPE_BF16: want = moe8_f32_to_bf16(v); { uint16_t h; memcpy(&h, dst + 2 * i, 2); got = h; } break;
            case MOE8_DTYPE_F8E4M3: want = moe8_f32_to_f8e4m3(v, !flags); got = dst[i]; break;
            case MOE8_DTYPE_F8E5M2: want = moe8_f32_to_f8e5m2(v, !flags); got = dst[i]; break;
            default: want = (uint8_t)moe8__f32_to_i8(v); got = dst[i]; break;
          }
          if (want != got) TU_FAIL("convert %s->%s flags %u: element %d: got 0x%x want 0x%x",
                                   moe8_dtype_info(st)->name, moe8_dtype_info(dt)->name, flags, i, got, want);
        }
        assert_int_equal(dst[N * ds], 0xA5);
      }
  free(x); free(xf); free(src); free(dst);
  /* Bad arguments give a status and a message, never a crash. */
  float f = 1.0f;
  assert_int_equal(moe8_convert(&f, MOE8_DTYPE_NONE, &f, MOE8_DTYPE_F32, 1, 0), MOE8_ERR_DTYPE);
  assert_non_null(strstr(moe8_last_error(), "cannot convert"));
  assert_int_equal(moe8_convert(NULL, MOE8_DTYPE_F32, &f, MOE8_DTYPE_F32, 1, 0), MOE8_ERR_INVALID_ARG);
  assert_int_equal(moe8_convert(&f, MOE8_DTYPE_F32, &f, MOE8_DTYPE_F32, 1, 0x80), MOE8_ERR_INVALID_ARG);
  assert_int_equal(moe8_convert(NULL, MOE8_DTYPE_F32, NULL, MOE8_DTYPE_F32, 0, 0), MOE8_OK);
}

static void test_traits_and_status(void **state) {
  (void)state;
  assert_string_equal(moe8_dtype_info(MOE8_DTYPE_F8E4M3)->name, "f8e4m3");
  assert_true(moe8_dtype_info(MOE8_DTYPE_F8E4M3)->finite_max == 448.0f);
  assert_true(moe8_dtype_info(MOE8_DTYPE_F8E5M2)->finite_max == 57344.0f);
  assert_true(moe8_dtype_info(MOE8_DTYPE_I8)->finite_max == 127.0f);
  assert_int_equal(moe8_dtype_info(MOE8_DTYPE_BF16)->bits, 16);
  assert_null(moe8_dtype_info(MOE8_DTYPE_NONE));
  assert_null(moe8_dtype_info((moe8_dtype)99));
  assert_int_equal(moe8_dtype_from_name("float8_e4m3fn"), MOE8_DTYPE_F8E4M3);
  assert_int_equal(moe8_dtype_from_name("int8"), MOE8_DTYPE_I8);
  assert_int_equal(moe8_dtype_from_name("float8_e4m4"), MOE8_DTYPE_NONE);
  for (int s = 0; s <= MOE8_ERR_INTERNAL; s++) assert_non_null(moe8_status_str((moe8_status)s));
  assert_string_equal(moe8_status_str(MOE8_OK), "ok");
  assert_true(moe8_isa_supported(MOE8_ISA_REF));
  assert_int_equal(moe8_isa_set((moe8_isa)42), MOE8_ERR_INVALID_ARG);
}

int main(void) {
  tu_seed();
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_traits_and_status),
    cmocka_unit_test(test_fp8_spot_values),
    cmocka_unit_test(test_fp8_decode_all_codes),
    cmocka_unit_test(test_f32_to_i8),
    cmocka_unit_test(test_convert_all_pairs),
    cmocka_unit_test(test_f32_to_bf16_all_inputs),
    cmocka_unit_test(test_f32_to_e4m3_all_inputs),
    cmocka_unit_test(test_f32_to_e5m2_all_inputs),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
