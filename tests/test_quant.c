/*
** test_quant.c — docs/numerics.md: scales, quantize/dequantize at every granularity.
**
** Proven here: the round-trip error bound per type and block; all-zero and
** tiny blocks give scale 1 and zeros; partial last tiles; power-of-two and
** clipped scales; non-finite input is reported with a count; every ISA's
** quantizer equals the reference byte for byte on random and adversarial
** data; every ISA's dequantize equals value(q) · s element by element
** (NaN codes included); and quantizing then gathering rows equals gathering then
** quantizing, byte for byte, for per-token and per-token-tiled scales.
*/
#include "testutil.h"
#include "core/internal.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Tolerance table: the largest |x - dequant(quant(x))| as a fraction of its
** block's max|x|.  FP8 keeps 3 (e4m3) or 2 (e5m2) mantissa bits, so the
** relative rounding error is at most 2^-4 / 2^-3 of the value; i8 rounds
** to half a step of bmax/127.  The extra 2^-20 covers the f32 division and
** the product in dequantize. */
static double bound_frac(moe8_dtype t) {
  switch (t) {
    case MOE8_DTYPE_F8E4M3: return 1.0 / 16;
    case MOE8_DTYPE_F8E5M2: return 1.0 / 8;
    default: return 1.0 / 254;
  }
}

/* Independent block index: which scale element covers x[e, r, c]. */
static size_t block_of(const moe8_quant_spec *s, int64_t R, int64_t C, int64_t e, int64_t r, int64_t c) {
  switch (s->gran) {
    case MOE8_GRAN_TENSOR: return 0;
    case MOE8_GRAN_ROW: return (size_t)r;
    case MOE8_GRAN_ROW_TILE: return (size_t)(r * ((C + s->tile - 1) / s->tile) + c / s->tile);
    case MOE8_GRAN_CHANNEL: return (size_t)(e * C + c);
    case MOE8_GRAN_CHANNEL_TILE: return (size_t)((e * ((R + s->tile - 1) / s->tile) + r / s->tile) * C + c);
    default: {
      const int64_t nbc = (C + s->tile - 1) / s->tile;
      return (size_t)((e * ((R + s->block_n - 1) / s->block_n) + r / s->block_n) * nbc + c / s->tile);
    }
  }
}

typedef struct shape { int64_t E, R, C; } shape;

static shape shape_for(moe8_granularity g, int64_t a, int64_t b) {
  shape s = {1, a, b};
  if (g == MOE8_GRAN_CHANNEL || g == MOE8_GRAN_CHANNEL_TILE || g == MOE8_GRAN_BLOCK2D) s.E = 3;
  return s;
}

static const moe8_granularity k_grans[] = {MOE8_GRAN_TENSOR, MOE8_GRAN_ROW, MOE8_GRAN_ROW_TILE,
                                           MOE8_GRAN_CHANNEL, MOE8_GRAN_CHANNEL_TILE, MOE8_GRAN_BLOCK2D};
static const moe8_dtype k_types[] = {MOE8_DTYPE_F8E4M3, MOE8_DTYPE_F8E5M2, MOE8_DTYPE_I8};

static void test_error_bounds(void **state) {
  (void)state;
  const int64_t sizes[] = {1, 7, 130, 257};
  const int64_t tiles[] = {16, 128};
  tu_rng_reset(11);
  for (size_t ti = 0; ti < 3; ti++)
    for (size_t gi = 0; gi < 6; gi++)
      for (size_t a = 0; a < 4; a++)
        for (size_t b = 0; b < 4; b++)
          for (size_t tl = 0; tl < 2; tl++) {
            const moe8_quant_spec spec = {.qtype = k_types[ti], .gran = k_grans[gi], .tile = tiles[tl],
                                          .block_n = tiles[1 - tl] + 3, .clip = 1.0f};
            const shape sh = shape_for(spec.gran, sizes[a], sizes[b]);
            const size_t n = (size_t)(sh.E * sh.R * sh.C);
            moe8_status st;
            const size_t ns = moe8_quant_scale_count(&spec, sh.E, sh.R, sh.C, &st);
            assert_int_equal(st, MOE8_OK);
            float *x = malloc(n * 4), *y = malloc(n * 4), *bmax = calloc(ns, 4);
            uint8_t *q = tu_alloc(n);
            float *s = tu_alloc(ns * 4);
            /* Wide dynamic range: magnitudes 2^-20 .. 2^20 by block. */
            for (size_t i = 0; i < n; i++) x[i] = tu_normal() * ldexpf(1.0f, (int)(tu_u64() % 41) - 20);
            for (int64_t e = 0; e < sh.E; e++)
              for (int64_t r = 0; r < sh.R; r++)
                for (int64_t c = 0; c < sh.C; c++) {
                  const size_t bi = block_of(&spec, sh.R, sh.C, e, r, c);
                  const float v = fabsf(x[(e * sh.R + r) * sh.C + c]);
                  if (v > bmax[bi]) bmax[bi] = v;
                }
            assert_int_equal(moe8_quantize(&spec, x, sh.E, sh.R, sh.C, q, s, NULL), MOE8_OK);
            assert_true(tu_guard_ok(q, n));
            assert_true(tu_guard_ok(s, ns * 4));
            for (size_t i = 0; i < ns; i++) {
              /* The scale is exactly absmax / qmax, or 1 for a zero block. */
              const float want = bmax[i] / moe8_dtype_info(spec.qtype)->finite_max;
              if (s[i] != (want >= 0x1p-126f ? want : 1.0f))
                TU_FAIL("%s gran %d [%lld,%lld,%lld]: scale %zu = %g, want %g", moe8_dtype_info(spec.qtype)->name,
                        spec.gran, (long long)sh.E, (long long)sh.R, (long long)sh.C, i, (double)s[i], (double)want);
            }
            assert_int_equal(moe8_dequantize(&spec, q, s, sh.E, sh.R, sh.C, y), MOE8_OK);
            for (int64_t e = 0; e < sh.E; e++)
              for (int64_t r = 0; r < sh.R; r++)
                for (int64_t c = 0; c < sh.C; c++) {
                  const size_t i = (size_t)((e * sh.R + r) * sh.C + c);
                  const double bm = bmax[block_of(&spec, sh.R, sh.C, e, r, c)];
                  const double err = fabs((double)x[i] - (double)y[i]);
                  if (!(err <= bm * bound_frac(spec.qtype) * (1 + 0x1p-20) + DBL_MIN))
                    TU_FAIL("%s gran %d [%lld,%lld,%lld] tile %lld: |x-x^| = %g > bound at [%lld,%lld,%lld] (bmax %g)",
                            moe8_dtype_info(spec.qtype)->name, spec.gran, (long long)sh.E, (long long)sh.R,
                            (long long)sh.C, (long long)spec.tile, err, (long long)e, (long long)r, (long long)c, bm);
                }
            free(x); free(y); free(bmax); free(q); free(s);
          }
}

static void test_zero_and_tiny_blocks(void **state) {
  (void)state;
  for (size_t ti = 0; ti < 3; ti++) {
    const moe8_quant_spec spec = {.qtype = k_types[ti], .gran = MOE8_GRAN_ROW_TILE, .tile = 4, .clip = 1.0f};
    /* Row 0: zeros; row 1: f32 subnormals; row 2: tiny normals whose scale
    ** would fall below 2^-126; then one ordinary tile. */
    float x[3 * 8] = {0, -0.0f, 0, 0, 0, 0, 0, 0,
                      1e-40f, -3e-41f, 1e-45f, 0, 2e-39f, 0, 0, -1e-39f,
                      1e-37f, -2e-37f, 5e-37f, 1e-38f, 1.0f, -2.0f, 0.5f, 3.0f};
    uint8_t q[24];
    float s[6], y[24];
    assert_int_equal(moe8_quantize(&spec, x, 1, 3, 8, q, s, NULL), MOE8_OK);
    for (int b = 0; b < 5; b++) assert_true(s[b] == 1.0f);
    assert_true(s[5] == 3.0f / moe8_dtype_info(spec.qtype)->finite_max);
    assert_int_equal(moe8_dequantize(&spec, q, s, 1, 3, 8, y), MOE8_OK);
    for (int i = 0; i < 20; i++) {
      assert_false(isnan(y[i]));
      assert_true(y[i] == 0.0f);
    }
  }
}

static void test_partial_tile_and_options(void **state) {
  (void)state;
  enum { T = 3, K = 200 };
  float x[T * K];
  uint8_t q[T * K];
  float s[T * 2];
  tu_rng_reset(3);
  tu_fill_normal(x, T * K, 1.0f);
  x[1 * K + 150] = 9.0f; /* only in the partial tile of row 1 */
  const moe8_quant_spec spec = {.qtype = MOE8_DTYPE_F8E4M3, .gran = MOE8_GRAN_ROW_TILE, .tile = 128, .clip = 1.0f};
  assert_int_equal(moe8_quantize(&spec, x, 1, T, K, q, s, NULL), MOE8_OK);
  for (int r = 0; r < T; r++) {
    float m0 = 0, m1 = 0;
    for (int c = 0; c < 128; c++) m0 = fmaxf(m0, fabsf(x[r * K + c]));
    for (int c = 128; c < K; c++) m1 = fmaxf(m1, fabsf(x[r * K + c]));
    assert_true(s[r * 2] == m0 / 448.0f);
    assert_true(s[r * 2 + 1] == m1 / 448.0f);
  }
  assert_true(s[3] == 9.0f / 448.0f);
  assert_int_equal(q[1 * K + 150], 0x7E); /* the block max is ±max exactly */

  /* Power-of-two scales: s = 2^ceil(log2(absmax/qmax)). */
  moe8_quant_spec p2 = spec;
  p2.pow2 = true;
  assert_int_equal(moe8_quantize(&p2, x, 1, T, K, q, s, NULL), MOE8_OK);
  assert_true(s[3] == 0.03125f); /* 9/448 = 0.0201 -> 2^-5 */
  for (int i = 0; i < T * 2; i++) {
    int e;
    assert_true(frexpf(s[i], &e) == 0.5f);
  }
  assert_true(moe8_scale_from_absmax(448.0f, MOE8_DTYPE_F8E4M3, 1.0f, true) == 1.0f);
  assert_true(moe8_scale_from_absmax(449.0f, MOE8_DTYPE_F8E4M3, 1.0f, true) == 2.0f);

  /* Clip: s = c·absmax/qmax and values beyond saturate to ±qmax. */
  moe8_quant_spec cl = spec;
  cl.clip = 0.5f;
  assert_int_equal(moe8_quantize(&cl, x, 1, T, K, q, s, NULL), MOE8_OK);
  assert_true(s[3] == 4.5f / 448.0f);
  assert_int_equal(q[1 * K + 150], 0x7E);
  cl.qtype = MOE8_DTYPE_I8;
  x[0] = -100.0f;
  assert_int_equal(moe8_quantize(&cl, x, 1, T, K, q, s, NULL), MOE8_OK);
  assert_int_equal((int8_t)q[0], -127);
  assert_true(moe8_scale_from_absmax(0.0f, MOE8_DTYPE_I8, 1.0f, false) == 1.0f);
  assert_true(moe8_scale_from_absmax(1e-37f, MOE8_DTYPE_I8, 1.0f, false) == 1.0f);
}

static void test_nonfinite_reported(void **state) {
  (void)state;
  float x[4 * 10];
  uint8_t q[40];
  float s[40];
  for (int i = 0; i < 40; i++) x[i] = (float)i;
  x[23] = NAN; x[31] = INFINITY; x[39] = -INFINITY;
  for (size_t gi = 0; gi < 6; gi++) {
    const moe8_quant_spec spec = {.qtype = MOE8_DTYPE_F8E4M3, .gran = k_grans[gi], .tile = 3, .block_n = 3, .clip = 1};
    size_t nf = 0;
    assert_int_equal(moe8_quantize(&spec, x, 1, 4, 10, q, s, &nf), MOE8_ERR_NONFINITE);
    assert_int_equal(nf, 3);
    assert_non_null(strstr(moe8_last_error(), "3 non-finite"));
    assert_non_null(strstr(moe8_last_error(), "first at [0, 2, 3]"));
  }
}

/* Adversarial values: FP8 midpoints (ties), the overflow edges, subnormal
** targets, f32 subnormals, signed zeros, and huge magnitudes. */
static void fill_adversarial(float *x, size_t n, uint64_t salt) {
  tu_rng_reset(salt);
  for (size_t i = 0; i < n; i++) {
    switch (tu_u64() % 8) {
      case 0: x[i] = ldexpf(1.0f + (float)(2 * (tu_u64() % 8) + 1) / 16.0f, (int)(tu_u64() % 16) - 8); break;
      case 1: x[i] = 448.0f * (tu_u64() & 1 ? 1 : -1); break;
      case 2: x[i] = ldexpf((float)(tu_u64() % 16) + 0.5f, -10); break;
      case 3: x[i] = moe8__bits_f32((uint32_t)(tu_u64() % 0x800000)); break;
      case 4: x[i] = tu_u64() & 1 ? 0.0f : -0.0f; break;
      case 5: x[i] = tu_normal() * 1e30f; break;
      case 6: x[i] = (float)((int64_t)(tu_u64() % 255) - 127) + 0.5f; break;
      default: x[i] = tu_normal(); break;
    }
  }
}

/* qwix's int8 (MOE8_CALIB_QWIX), against the algorithm written here:
** s = absmax / 127.5 in f32 (1 below 2^-63), q = clamp(rint(x / s), -128,
** 127); every granularity, every ISA, rows that reach -128, tiny rows;
** FP8 under the qwix calibration is the absmax bytes. */
static void test_qwix_int8(void **state) {
  (void)state;
  enum { R = 9, C = 70 };
  static float x[R * C];
  tu_rng_reset(4242);
  tu_fill_normal(x, R * C, 1.0f);
  for (int c = 0; c < C; c++) x[3 * C + c] = 1e-22f * (float)(c - 35); /* absmax/127.5 < 2^-63: scale 1 */
  x[4 * C + 5] = -7.0f;                                                 /* this row's -absmax: code -128 */
  for (int c = 0; c < C; c++) x[5 * C + c] = 0.0f;
  moe8_isa isas[MOE8_ISA_COUNT];
  const int nisa = tu_isas(isas);
  const moe8_granularity grans[3] = {MOE8_GRAN_ROW, MOE8_GRAN_ROW_TILE, MOE8_GRAN_TENSOR};
  for (int t = 0; t < nisa; t++) {
    moe8_isa_set(isas[t]);
    for (int gi = 0; gi < 3; gi++) {
      const int64_t tile = grans[gi] == MOE8_GRAN_ROW_TILE ? 32 : 0;
      const moe8_quant_spec sp = {.qtype = MOE8_DTYPE_I8, .gran = grans[gi], .tile = tile, .clip = 1.0f, .calib = MOE8_CALIB_QWIX};
      int8_t q[R * C], want[R * C];
      float sc[R * 3], wsc[R * 3];
      assert_int_equal(moe8_quantize(&sp, x, 1, R, C, q, sc, NULL), MOE8_OK);
      int hits = 0;
      for (int r = 0; r < R; r++) {
        const int64_t tl = grans[gi] == MOE8_GRAN_TENSOR ? R * C : tile ? tile : C;
        for (int64_t c0 = 0; c0 < (grans[gi] == MOE8_GRAN_TENSOR ? 1 : C); c0 += tl) {
          const float *blk = grans[gi] == MOE8_GRAN_TENSOR ? x : x + r * C + c0;
          const int64_t len = grans[gi] == MOE8_GRAN_TENSOR ? R * C : (C - c0 < tl ? C - c0 : tl);
          float amax = 0.0f;
          for (int64_t i = 0; i < len; i++) amax = fabsf(blk[i]) > amax ? fabsf(blk[i]) : amax;
          float s = amax / 127.5f;
          if (!(s >= 0x1p-63f)) s = 1.0f;
          const size_t si = grans[gi] == MOE8_GRAN_TENSOR ? 0 : (size_t)(r * (tile ? 3 : 1) + c0 / (tile ? tile : C));
          wsc[si] = s;
          for (int64_t i = 0; i < len; i++) {
            float v = rintf(blk[i] / s);
            v = v > 127.0f ? 127.0f : v < -128.0f ? -128.0f : v;
            int8_t *dst = grans[gi] == MOE8_GRAN_TENSOR ? want : want + r * C + c0;
            dst[i] = (int8_t)v;
            hits += dst[i] == -128;
          }
        }
        if (grans[gi] == MOE8_GRAN_TENSOR) break;
      }
      const size_t ns = grans[gi] == MOE8_GRAN_TENSOR ? 1 : (size_t)R * (tile ? 3 : 1);
      assert_memory_equal(q, want, sizeof q);
      assert_memory_equal(sc, wsc, ns * 4);
      if (grans[gi] == MOE8_GRAN_ROW) {
        assert_true(hits >= 1);                 /* -128 is reached */
        assert_true(sc[3] == 1.0f && sc[5] == 1.0f);
        /* moe8's own int8 differs: bound 127, codes in [-127, 127] */
        const moe8_quant_spec own = {.qtype = MOE8_DTYPE_I8, .gran = MOE8_GRAN_ROW, .clip = 1.0f};
        int8_t q2[R * C];
        float s2[R];
        assert_int_equal(moe8_quantize(&own, x, 1, R, C, q2, s2, NULL), MOE8_OK);
        assert_true(memcmp(q, q2, sizeof q) != 0);
      }
    }
    /* FP8 under qwix: the absmax bytes */
    const moe8_quant_spec f1 = {.qtype = MOE8_DTYPE_F8E4M3, .gran = MOE8_GRAN_ROW, .clip = 1.0f, .calib = MOE8_CALIB_QWIX};
    const moe8_quant_spec f0 = {.qtype = MOE8_DTYPE_F8E4M3, .gran = MOE8_GRAN_ROW, .clip = 1.0f};
    uint8_t a[R * C], b[R * C];
    float sa[R], sb[R];
    assert_int_equal(moe8_quantize(&f1, x, 1, R, C, a, sa, NULL), MOE8_OK);
    assert_int_equal(moe8_quantize(&f0, x, 1, R, C, b, sb, NULL), MOE8_OK);
    assert_memory_equal(a, b, sizeof a);
    assert_memory_equal(sa, sb, sizeof sa);
  }
  moe8_isa_set(tu_isa_best());
  const moe8_quant_spec bad = {.qtype = MOE8_DTYPE_I8, .gran = MOE8_GRAN_ROW, .clip = 1.0f, .calib = MOE8_CALIB_QWIX, .pow2 = true};
  int8_t q[R * C];
  float sc[R];
  assert_int_equal(moe8_quantize(&bad, x, 1, R, C, q, sc, NULL), MOE8_ERR_INVALID_ARG);
  /* The rule option. */
  const char *rj = "{\"rules\": [{\"module_path\": \".*\", \"weight_qtype\": \"int8\", \"act_qtype\": \"int8\", "
                   "\"weight_calibration_method\": \"qwix\", \"act_calibration_method\": \"qwix,0.9\"}]}";
  moe8_rules *rs = NULL;
  assert_int_equal(moe8_rules_parse(rj, strlen(rj), "inline", &rs), MOE8_OK);
  const moe8_rule *r = moe8_rules_match(rs, "experts");
  assert_true(r && r->weight_calib == MOE8_CALIB_QWIX && r->act_calib == MOE8_CALIB_QWIX && r->act_clip == 0.9f && r->weight_clip == 1.0f);
  /* ... reaches the layer: its prepared down codes are qwix's of its masters. */
  const moe8_layer_config lc = {.num_experts = 4, .top_k = 2, .hidden = 48, .ffn = 40};
  moe8_layer *L = NULL;
  assert_int_equal(moe8_layer_create(&lc, rs, "experts", &L), MOE8_OK);
  assert_int_equal(moe8_layer_init_random(L, 9), MOE8_OK);
  assert_int_equal(moe8_layer_prepare(L), MOE8_OK);
  moe8_prepared pr;
  assert_int_equal(moe8_layer_prepared(L, &pr), MOE8_OK);
  const moe8_quant_spec ws = {.qtype = MOE8_DTYPE_I8, .gran = MOE8_GRAN_CHANNEL, .clip = 1.0f, .calib = MOE8_CALIB_QWIX};
  static int8_t dq[4 * 40 * 48];
  static float ds[4 * 48];
  assert_int_equal(moe8_quantize(&ws, moe8_layer_weight_read(L, MOE8_W_DOWN, NULL), 4, 40, 48, dq, ds, NULL), MOE8_OK);
  assert_memory_equal(pr.w_down, dq, sizeof dq);
  assert_memory_equal(pr.s_down, ds, sizeof ds);
  moe8_layer_destroy(L);
  moe8_rules_destroy(rs);
}

/* MXFP4 quantization (moe8__mx4_quantize): the E2M1 rounding at every
** grid point and midpoint (ties to the even code), saturation, sign; the
** block scale 2^(floor(log2 amax) - 2) with its clamps; each code the
** nearest grid value; and moe8__mx4_repack moves every code to the place
** its layout names, as a permutation of the row's bytes' nibbles. */
static void test_mxfp4_quantize(void **state) {
  (void)state;
  static const struct { float v; uint8_t code; } cases[] = {
    {0.0f, 0}, {0.2f, 0}, {0.25f, 0}, {0.26f, 1}, {0.5f, 1}, {0.75f, 2}, {0.74f, 1}, {1.0f, 2}, {1.25f, 2}, {1.26f, 3}, {1.5f, 3},
    {1.75f, 4}, {2.0f, 4}, {2.5f, 4}, {2.51f, 5}, {3.0f, 5}, {3.5f, 6}, {3.49f, 5}, {4.0f, 6}, {5.0f, 6}, {5.01f, 7}, {6.0f, 7},
    {7.9f, 7}, {1e9f, 7}, {-0.5f, 9}, {-6.0f, 15}, {-2.5f, 12}, {-0.25f, 8}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    if (moe8__e2m1_code(cases[i].v) != cases[i].code)
      TU_FAIL("e2m1(%g) = %u, want %u", (double)cases[i].v, moe8__e2m1_code(cases[i].v), cases[i].code);
  enum { K = 64, N = 3 };
  static float w[K * N];
  tu_rng_reset(31);
  tu_fill_normal(w, K * N, 1.0f);
  for (int k = 0; k < 32; k++) w[k * N + 1] = 0.0f;          /* column 1, block 0: all zero -> scale byte 0 */
  w[40 * N + 2] = 12.0f;                                       /* column 2, block 1: amax 12 -> X = 2^(3 - 2) */
  uint8_t blk[N * 2 * 16], sc[N * 2];
  moe8__mx4_quantize(w, K, N, blk, sc);
  assert_int_equal(sc[1 * 2 + 0], 0);
  assert_int_equal(sc[2 * 2 + 1], 127 + 1);
  static const float e2m1[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  for (int n = 0; n < N; n++)
    for (int b = 0; b < 2; b++) {
      float amax = 0;
      for (int k = b * 32; k < b * 32 + 32; k++) amax = fabsf(w[k * N + n]) > amax ? fabsf(w[k * N + n]) : amax;
      const int want_s = amax > 0 ? (int)floor(log2((double)amax)) - 2 + 127 : 0;
      assert_int_equal(sc[n * 2 + b], want_s);
      for (int k = b * 32; k < b * 32 + 32; k++) {
        const uint8_t byte = blk[(n * 2 + b) * 16 + (k % 32) / 2], code = (k & 1) ? byte >> 4 : byte & 15;
        assert_int_equal(code, moe8__e2m1_code(w[k * N + n] / ldexpf(1.0f, want_s - 127)));
        /* the nearest grid value: no other code is closer */
        const float v = fabsf(w[k * N + n]) / ldexpf(1.0f, want_s - 127), got = fabsf(e2m1[code]);
        for (int c = 0; c < 8; c++) assert_true(fabsf(v - got) <= fabsf(v - e2m1[c]) || v > 6.0f);
      }
    }
  /* the kernels' layout, for rows of 1, 8, 9, 10 and 23 blocks (whole
  ** groups of 8 and the blocks after them), rows 64-byte aligned */
  static const int64_t nbs[5] = {1, 8, 9, 10, 23};
  for (int t = 0; t < 5; t++) {
    const int64_t nb = nbs[t], NN = 3;
    const int64_t rb = moe8__mx4_row_bytes(nb * 32);
    assert_true(rb % 64 == 0 && rb >= nb * 16 && rb < nb * 16 + 64);
    uint8_t *o = malloc((size_t)(NN * nb * 16)), *r = malloc((size_t)(NN * rb));
    for (int64_t i = 0; i < NN * nb * 16; i++) o[i] = (uint8_t)(tu_u64() >> 56);
    memset(r, 0xA5, (size_t)(NN * rb));
    moe8__mx4_repack(r, o, NN, nb * 32);
    for (int64_t n = 0; n < NN; n++)
      for (int64_t k = 0; k < nb * 32; k++) {
        const int64_t b = k / 32, pos = k % 32, h = pos / 16, L = pos % 16;
        const uint8_t want = (uint8_t)(o[(n * nb + b) * 16 + pos / 2] >> (4 * (pos & 1)) & 15);
        const uint8_t *row = r + n * rb;
        const uint8_t got = b < nb / 8 * 8 ? (uint8_t)(row[b / 8 * 128 + h * 64 + 4 * L + (b % 8) / 2] >> (4 * (b % 2)) & 15)
                                           : (uint8_t)(row[b * 16 + L] >> (4 * h) & 15);
        if (got != want) TU_FAIL("mx4 repack nb=%lld row %lld k %lld: code %u, want %u", (long long)nb, (long long)n, (long long)k, got, want);
      }
    for (int64_t n = 0; n < NN; n++) /* the padding is zero */
      for (int64_t i = nb * 16; i < rb; i++)
        if (r[n * rb + i]) TU_FAIL("mx4 repack nb=%lld row %lld: padding byte %lld is %u", (long long)nb, (long long)n, (long long)i, r[n * rb + i]);
    free(o); free(r);
  }
}

/* OCP MX calibration for FP8 (MXFP8 with 32 along K): the scale is
** 2^(floor(log2 amax) - emax) (8 for e4m3, 15 for e5m2), codes saturate;
** the "mxfp8" rule sets e4m3, the calibration and tile 32. */
static void test_mx_calibration(void **state) {
  (void)state;
  enum { K = 96, N = 5 };
  static float w[K * N];
  tu_rng_reset(91);
  tu_fill_normal(w, K * N, 3.0f);
  for (int k = 0; k < 32; k++) w[k * N + 2] = 0.0f;
  for (int t = 0; t < 2; t++) {
    const moe8_dtype qt = t ? MOE8_DTYPE_F8E5M2 : MOE8_DTYPE_F8E4M3;
    const moe8_quant_spec sp = {.qtype = qt, .gran = MOE8_GRAN_CHANNEL_TILE, .tile = 32, .clip = 1.0f, .calib = MOE8_CALIB_MX};
    uint8_t q[K * N];
    float sc[3 * N];
    assert_int_equal(moe8_quantize(&sp, w, 1, K, N, q, sc, NULL), MOE8_OK);
    for (int b = 0; b < 3; b++)
      for (int n = 0; n < N; n++) {
        float amax = 0;
        for (int k = b * 32; k < b * 32 + 32; k++) amax = fabsf(w[k * N + n]) > amax ? fabsf(w[k * N + n]) : amax;
        const float want = amax > 0 ? ldexpf(1.0f, (int)floor(log2((double)amax)) - (t ? 15 : 8)) : 1.0f;
        if (sc[b * N + n] != want) TU_FAIL("mx scale %s block %d col %d: %g, want %g", t ? "e5m2" : "e4m3", b, n, (double)sc[b * N + n], (double)want);
        for (int k = b * 32; k < b * 32 + 32; k++) {
          const uint8_t c = t ? moe8_f32_to_f8e5m2(w[k * N + n] / want, true) : moe8_f32_to_f8e4m3(w[k * N + n] / want, true);
          assert_int_equal(q[k * N + n], c);
        }
      }
  }
  const moe8_quant_spec bad = {.qtype = MOE8_DTYPE_I8, .gran = MOE8_GRAN_ROW, .clip = 1.0f, .calib = MOE8_CALIB_MX};
  uint8_t q[K * N];
  float sc[K];
  assert_int_equal(moe8_quantize(&bad, w, 1, K, N, q, sc, NULL), MOE8_ERR_INVALID_ARG);
  const char *rj = "{\"rules\": [{\"module_path\": \".*\", \"weight_qtype\": \"mxfp8\"}]}";
  moe8_rules *rs = NULL;
  assert_int_equal(moe8_rules_parse(rj, strlen(rj), "inline", &rs), MOE8_OK);
  const moe8_rule *r = moe8_rules_match(rs, "experts");
  assert_true(r && r->weight_qtype == MOE8_DTYPE_F8E4M3 && r->weight_calib == MOE8_CALIB_MX && r->tile_size == 32 && r->weight_mx8);
  moe8_rules_destroy(rs);
  const char *bad1 = "{\"rules\": [{\"module_path\": \".*\", \"weight_qtype\": \"mxfp8\", \"tile_size\": 16}]}";
  assert_int_not_equal(moe8_rules_parse(bad1, strlen(bad1), "inline", &rs), MOE8_OK);
  assert_non_null(strstr(moe8_last_error(), "tile_size must be 32"));
  const char *bad2 = "{\"rules\": [{\"module_path\": \".*\", \"act_qtype\": \"mxfp8\"}]}";
  assert_int_not_equal(moe8_rules_parse(bad2, strlen(bad2), "inline", &rs), MOE8_OK);
}

static void test_isas_equal_reference(void **state) {
  (void)state;
  moe8_isa isas[MOE8_ISA_COUNT];
  const int nisa = tu_isas(isas);
  const int64_t shapes[][2] = {{1, 1}, {3, 17}, {5, 128}, {2, 129}, {33, 250}, {4, 1000}};
  for (size_t ti = 0; ti < 3; ti++)
    for (size_t gi = 0; gi < 6; gi++)
      for (size_t si = 0; si < 6; si++)
        for (int adv = 0; adv < 2; adv++)
          for (int p2 = 0; p2 < 2; p2++) {
            const moe8_quant_spec spec = {.qtype = k_types[ti], .gran = k_grans[gi], .tile = 32, .block_n = 5,
                                          .clip = p2 ? 0.9f : 1.0f, .pow2 = p2};
            const shape sh = shape_for(spec.gran, shapes[si][0], shapes[si][1]);
            const size_t n = (size_t)(sh.E * sh.R * sh.C);
            const size_t ns = moe8_quant_scale_count(&spec, sh.E, sh.R, sh.C, NULL);
            float *x = malloc(n * 4);
            if (adv) fill_adversarial(x, n, si * 100 + gi);
            else { tu_rng_reset(si * 7 + gi); tu_fill_normal(x, n, 3.0f); }
            uint8_t *q0 = malloc(n), *q1 = tu_alloc(n);
            float *s0 = malloc(ns * 4), *s1 = tu_alloc(ns * 4);
            assert_int_equal(moe8_isa_set(MOE8_ISA_REF), MOE8_OK);
            assert_int_equal(moe8_quantize(&spec, x, sh.E, sh.R, sh.C, q0, s0, NULL), MOE8_OK);
            for (int t = 1; t < nisa; t++) {
              assert_int_equal(moe8_isa_set(isas[t]), MOE8_OK);
              memset(q1, 0x5A, n);
              assert_int_equal(moe8_quantize(&spec, x, sh.E, sh.R, sh.C, q1, s1, NULL), MOE8_OK);
              if (memcmp(q0, q1, n) != 0 || memcmp(s0, s1, ns * 4) != 0)
                TU_FAIL("ISA %s differs from ref: %s gran %d [%lld,%lld,%lld] adversarial=%d",
                        moe8_isa_name(isas[t]), moe8_dtype_info(spec.qtype)->name, spec.gran, (long long)sh.E,
                        (long long)sh.R, (long long)sh.C, adv);
              assert_true(tu_guard_ok(q1, n));
              assert_true(tu_guard_ok(s1, ns * 4));
            }
            free(x); free(q0); free(q1); free(s0); free(s1);
          }
  moe8_isa_set(tu_isa_best());
}

/* moe8_dequantize on every ISA against y = value(q) · s computed here,
** element by element with the independent block_of: every code (FP8 NaN
** codes included), scales over a wide range, every granularity with
** several blocks along both axes (tiles of 4, 2-D blocks of 3 rows), tails
** (C not a multiple of 16 or of the tile). */
static void test_dequant_isas_equal_reference(void **state) {
  (void)state;
  moe8_isa isas[MOE8_ISA_COUNT];
  const int nisa = tu_isas(isas);
  const int64_t shapes[][2] = {{1, 1}, {3, 17}, {5, 128}, {2, 129}, {7, 250}, {4, 1000}};
  for (size_t ti = 0; ti < 3; ti++)
    for (size_t gi = 0; gi < 6; gi++)
      for (size_t si = 0; si < 6; si++) {
        const moe8_quant_spec spec = {.qtype = k_types[ti], .gran = k_grans[gi], .tile = 4, .block_n = 3};
        const shape sh = shape_for(spec.gran, shapes[si][0], shapes[si][1]);
        const size_t n = (size_t)(sh.E * sh.R * sh.C);
        const size_t ns = moe8_quant_scale_count(&spec, sh.E, sh.R, sh.C, NULL);
        uint8_t *q = malloc(n);
        float *s = malloc(ns * 4), *want = malloc(n * 4), *y = tu_alloc(n * 4);
        tu_rng_reset(ti * 100 + gi * 10 + si);
        for (size_t i = 0; i < n; i++) q[i] = (uint8_t)((i * 37 + si) & 0xFF);
        for (size_t i = 0; i < ns; i++) s[i] = ldexpf(tu_uniform(0.5f, 1.0f), (int)tu_uniform(-40.0f, 40.0f));
        for (int64_t e = 0; e < sh.E; e++)
          for (int64_t r = 0; r < sh.R; r++)
            for (int64_t c = 0; c < sh.C; c++) {
              const size_t i = (size_t)((e * sh.R + r) * sh.C + c);
              const float v = spec.qtype == MOE8_DTYPE_F8E4M3 ? moe8_f8e4m3_to_f32(q[i])
                            : spec.qtype == MOE8_DTYPE_F8E5M2 ? moe8_f8e5m2_to_f32(q[i]) : (float)(int8_t)q[i];
              want[i] = v * s[block_of(&spec, sh.R, sh.C, e, r, c)];
            }
        for (int t = 0; t < nisa; t++) {
          assert_int_equal(moe8_isa_set(isas[t]), MOE8_OK);
          memset(y, 0x5A, n * 4);
          assert_int_equal(moe8_dequantize(&spec, q, s, sh.E, sh.R, sh.C, y), MOE8_OK);
          if (memcmp(y, want, n * 4) != 0)
            TU_FAIL("dequantize on ISA %s differs from value(q) * s: %s gran %d [%lld,%lld,%lld]", moe8_isa_name(isas[t]),
                    moe8_dtype_info(spec.qtype)->name, spec.gran, (long long)sh.E, (long long)sh.R, (long long)sh.C);
          assert_true(tu_guard_ok(y, n * 4));
        }
        free(q); free(s); free(want); free(y);
      }
  /* Empty inputs read nothing, so their buffers may be NULL. */
  for (int t = 0; t < nisa; t++) {
    assert_int_equal(moe8_isa_set(isas[t]), MOE8_OK);
    for (size_t gi = 0; gi < 6; gi++) {
      const moe8_quant_spec spec = {.qtype = MOE8_DTYPE_F8E4M3, .gran = k_grans[gi], .tile = 4, .block_n = 3};
      const shape sh = shape_for(spec.gran, 3, 0);
      assert_int_equal(moe8_dequantize(&spec, NULL, NULL, sh.E, sh.R, sh.C, NULL), MOE8_OK);
    }
  }
  moe8_isa_set(tu_isa_best());
}

/* docs/numerics.md: row-wise scales commute with selection, repetition and
** permutation of rows. */
static void test_gather_commutes(void **state) {
  (void)state;
  enum { T = 37, K = 300, M = 80 };
  float *x = malloc(T * K * 4), *xg = malloc(M * K * 4);
  uint8_t *q = malloc(T * K), *qg = malloc(M * K), *qx = malloc(M * K);
  float *s = malloc(T * 3 * 4), *sg = malloc(M * 3 * 4), *sx = malloc(M * 3 * 4);
  for (int trial = 0; trial < 40; trial++) {
    tu_rng_reset(1000 + trial);
    tu_fill_normal(x, T * K, trial % 2 ? 1e-3f : 50.0f);
    int idx[M];
    const int m = trial % 3 == 0 ? T : (int)(tu_u64() % M) + 1;
    if (trial % 3 == 0) { /* a permutation */
      for (int i = 0; i < T; i++) idx[i] = i;
      for (int i = T - 1; i > 0; i--) { int j = (int)(tu_u64() % (uint64_t)(i + 1)), t = idx[i]; idx[i] = idx[j]; idx[j] = t; }
    } else { /* selection with repetition */
      for (int i = 0; i < m; i++) idx[i] = (int)(tu_u64() % T);
    }
    for (int gi = 0; gi < 2; gi++)
      for (size_t ti = 0; ti < 3; ti++) {
        const moe8_quant_spec spec = {.qtype = k_types[ti], .gran = gi ? MOE8_GRAN_ROW_TILE : MOE8_GRAN_ROW,
                                      .tile = 128, .clip = 1.0f};
        const int ns = gi ? 3 : 1;
        assert_int_equal(moe8_quantize(&spec, x, 1, T, K, q, s, NULL), MOE8_OK);
        for (int i = 0; i < m; i++) {
          memcpy(qg + i * K, q + idx[i] * K, K);
          memcpy(sg + i * ns, s + idx[i] * ns, ns * 4);
          memcpy(xg + i * K, x + idx[i] * K, K * 4);
        }
        assert_int_equal(moe8_quantize(&spec, xg, 1, m, K, qx, sx, NULL), MOE8_OK);
        if (memcmp(qg, qx, (size_t)m * K) != 0 || memcmp(sg, sx, (size_t)(m * ns) * 4) != 0)
          TU_FAIL("trial %d: quantize-then-gather differs from gather-then-quantize (%s, %s)", trial,
                  moe8_dtype_info(spec.qtype)->name, gi ? "1x128" : "per-token");
      }
  }
  free(x); free(xg); free(q); free(qg); free(qx); free(s); free(sg); free(sx);
}

static void test_bad_specs(void **state) {
  (void)state;
  float x[4] = {1, 2, 3, 4}, s[4];
  uint8_t q[4];
  moe8_quant_spec spec = {.qtype = MOE8_DTYPE_F32, .gran = MOE8_GRAN_ROW, .clip = 1};
  assert_int_equal(moe8_quantize(&spec, x, 1, 2, 2, q, s, NULL), MOE8_ERR_DTYPE);
  spec.qtype = MOE8_DTYPE_I8;
  assert_int_equal(moe8_quantize(&spec, x, 2, 1, 2, q, s, NULL), MOE8_ERR_SHAPE);
  assert_int_equal(moe8_quantize(&spec, x, 1, -1, 2, q, s, NULL), MOE8_ERR_SHAPE);
  spec.gran = MOE8_GRAN_ROW_TILE;
  assert_int_equal(moe8_quantize(&spec, x, 1, 2, 2, q, s, NULL), MOE8_ERR_INVALID_ARG);
  assert_non_null(strstr(moe8_last_error(), "tile"));
  spec.gran = (moe8_granularity)77;
  assert_int_equal(moe8_quantize(&spec, x, 1, 2, 2, q, s, NULL), MOE8_ERR_INVALID_ARG);
  spec.gran = MOE8_GRAN_TENSOR;
  assert_int_equal(moe8_quantize(NULL, x, 1, 2, 2, q, s, NULL), MOE8_ERR_INVALID_ARG);
  assert_int_equal(moe8_quantize(&spec, NULL, 1, 2, 2, q, s, NULL), MOE8_ERR_INVALID_ARG);
  spec.clip = -1;
  assert_int_equal(moe8_quantize(&spec, x, 1, 2, 2, q, s, NULL), MOE8_ERR_INVALID_ARG);
  /* Zero rows are fine: nothing to write. */
  spec.clip = 1;
  spec.gran = MOE8_GRAN_ROW;
  assert_int_equal(moe8_quantize(&spec, x, 1, 0, 2, q, s, NULL), MOE8_OK);
  /* Scale counts per granularity. */
  moe8_quant_spec c = {.qtype = MOE8_DTYPE_F8E4M3, .tile = 64, .block_n = 128, .clip = 1};
  c.gran = MOE8_GRAN_TENSOR;       assert_int_equal(moe8_quant_scale_count(&c, 1, 10, 256, NULL), 1);
  c.gran = MOE8_GRAN_ROW;          assert_int_equal(moe8_quant_scale_count(&c, 1, 10, 256, NULL), 10);
  c.gran = MOE8_GRAN_ROW_TILE;     assert_int_equal(moe8_quant_scale_count(&c, 1, 10, 257, NULL), 50);
  c.gran = MOE8_GRAN_CHANNEL;      assert_int_equal(moe8_quant_scale_count(&c, 4, 256, 96, NULL), 4 * 96);
  c.gran = MOE8_GRAN_CHANNEL_TILE; assert_int_equal(moe8_quant_scale_count(&c, 4, 256, 96, NULL), 4 * 4 * 96);
  c.gran = MOE8_GRAN_BLOCK2D;      assert_int_equal(moe8_quant_scale_count(&c, 2, 300, 130, NULL), 2 * 3 * 3);
}

int main(void) {
  tu_seed();
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_bad_specs),
    cmocka_unit_test(test_zero_and_tiny_blocks),
    cmocka_unit_test(test_partial_tile_and_options),
    cmocka_unit_test(test_nonfinite_reported),
    cmocka_unit_test(test_error_bounds),
    cmocka_unit_test(test_isas_equal_reference),
    cmocka_unit_test(test_dequant_isas_equal_reference),
    cmocka_unit_test(test_gather_commutes),
    cmocka_unit_test(test_qwix_int8),
    cmocka_unit_test(test_mxfp4_quantize),
    cmocka_unit_test(test_mx_calibration),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
