/*
** test_gmm.c — docs/layer.md, docs/determinism.md: the grouped matmul and its transpose.
**
** Every ISA's kernel is compared with the reference kernel over a sweep of
** shapes: rows per group 0, 1, 2, 7, 8, 9 (micro-tile ± 1), 193 (task tile
** + 1) and 255; K and N in {1, 15, 16, 17, 127, 128, 129, 1000}; empty
** groups; all rows in one group; group_offset at the first and the last
** group.  Outputs are prefilled with NaN and followed by guard bytes.  The
** reference itself is checked against a double-precision evaluation of the
** definition.  Integer paths must match exactly; float paths within the
** normalized bound of tol_float() below.  Then determinism: 1 vs 2 threads,
** and a row alone vs in its full batch vs among other rows, all bitwise.
*/
#include "testutil.h"
#include "core/internal.h"
#include "kernels/gmm.h"

#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <omp.h>

typedef struct cfg {
  const char      *name;
  moe8_dtype       lt, rt, ot;
  moe8_granularity lg, rg;
  int64_t          tile;
  bool             rhs_t;
} cfg;

static const cfg k_cfgs[] = {
  {"f32*f32",            MOE8_DTYPE_F32,    MOE8_DTYPE_F32,    MOE8_DTYPE_F32,  0, 0, 0, false},
  {"bf16*bf16->bf16",    MOE8_DTYPE_BF16,   MOE8_DTYPE_BF16,   MOE8_DTYPE_BF16, 0, 0, 0, false},
  {"e4m3*e4m3 1x128",    MOE8_DTYPE_F8E4M3, MOE8_DTYPE_F8E4M3, MOE8_DTYPE_F32,  MOE8_GRAN_ROW_TILE, MOE8_GRAN_CHANNEL_TILE, 128, false},
  {"e5m2*e4m3 row/chan", MOE8_DTYPE_F8E5M2, MOE8_DTYPE_F8E4M3, MOE8_DTYPE_F32,  MOE8_GRAN_ROW, MOE8_GRAN_CHANNEL, 0, false},
  {"e4m3*e4m3 tensor",   MOE8_DTYPE_F8E4M3, MOE8_DTYPE_F8E4M3, MOE8_DTYPE_BF16, MOE8_GRAN_TENSOR, MOE8_GRAN_TENSOR, 0, false},
  {"i8*i8 tile16",       MOE8_DTYPE_I8,     MOE8_DTYPE_I8,     MOE8_DTYPE_F32,  MOE8_GRAN_ROW_TILE, MOE8_GRAN_CHANNEL_TILE, 16, false},
  {"i8*i8 row/tensor",   MOE8_DTYPE_I8,     MOE8_DTYPE_I8,     MOE8_DTYPE_F32,  MOE8_GRAN_ROW, MOE8_GRAN_TENSOR, 0, false},
  {"f32*e4m3 w-only",    MOE8_DTYPE_F32,    MOE8_DTYPE_F8E4M3, MOE8_DTYPE_F32,  0, MOE8_GRAN_CHANNEL_TILE, 128, false},
  {"bf16*i8 w-only",     MOE8_DTYPE_BF16,   MOE8_DTYPE_I8,     MOE8_DTYPE_F32,  0, MOE8_GRAN_CHANNEL, 0, false},
  {"bf16*e5m2 w-only",   MOE8_DTYPE_BF16,   MOE8_DTYPE_F8E5M2, MOE8_DTYPE_F32,  0, MOE8_GRAN_CHANNEL_TILE, 16, false},
  {"f32*f32^T",          MOE8_DTYPE_F32,    MOE8_DTYPE_F32,    MOE8_DTYPE_F32,  0, 0, 0, true},
  {"bf16*bf16^T",        MOE8_DTYPE_BF16,   MOE8_DTYPE_BF16,   MOE8_DTYPE_F32,  0, 0, 0, true},
};
enum { NCFG = sizeof k_cfgs / sizeof k_cfgs[0] };

/* A test problem: operands made by quantizing random f32 data. */
typedef struct prob {
  int64_t M, K, N, E, off, G;
  int32_t gs[8];
  void   *lhs, *rhs;
  float  *ls, *rs;
  moe8_gmm_args a;
} prob;

static void make_operand(moe8_dtype t, moe8_granularity g, int64_t tile, bool is_lhs, int64_t E, int64_t R,
                         int64_t C, void **data, float **scale) {
  const size_t n = (size_t)(E * R * C);
  float *x = malloc(n * 4 + 4);
  tu_fill_normal(x, n, is_lhs ? 2.0f : 0.05f);
  *scale = NULL;
  if (t == MOE8_DTYPE_F32) { *data = x; return; }
  *data = malloc(n * moe8__dtype_size(t) + 4);
  if (t == MOE8_DTYPE_BF16) {
    assert_int_equal(moe8_convert(*data, t, x, MOE8_DTYPE_F32, n, 0), MOE8_OK);
  } else {
    const moe8_quant_spec s = {.qtype = t, .gran = g, .tile = tile, .clip = 1.0f};
    const size_t ns = moe8_quant_scale_count(&s, E, R, C, NULL);
    *scale = malloc(ns * 4 + 4);
    assert_int_equal(moe8_quantize(&s, x, E, R, C, *data, *scale, NULL), MOE8_OK);
  }
  free(x);
}

static void prob_init(prob *p, const cfg *c, int64_t K, int64_t N, const int32_t *gs, int64_t E, int64_t off,
                      int64_t G, int64_t extra_rows) {
  memset(p, 0, sizeof *p);
  p->K = K; p->N = N; p->E = E; p->off = off; p->G = G;
  for (int64_t g = 0; g < E; g++) { p->gs[g] = gs[g]; p->M += gs[g]; }
  p->M += extra_rows; /* rows past the last group: must come out zero */
  make_operand(c->lt, c->lg, c->tile, true, 1, p->M, K, &p->lhs, &p->ls);
  if (c->rhs_t) make_operand(c->rt, c->rg, c->tile, false, G, N, K, &p->rhs, &p->rs);
  else make_operand(c->rt, c->rg, c->tile, false, G, K, N, &p->rhs, &p->rs);
  p->a = (moe8_gmm_args){
    .M = p->M, .K = K, .N = N, .num_groups = E, .group_sizes = p->gs, .group_offset = off, .num_local = G,
    .lhs = {c->lt, p->lhs, p->ls, c->lg, c->tile}, .rhs = {c->rt, p->rhs, p->rs, c->rg, c->tile},
    .rhs_transposed = c->rhs_t, .out_dtype = c->ot,
  };
}

static void prob_free(prob *p) { free(p->lhs); free(p->rhs); free(p->ls); free(p->rs); }

/* The order the sweep runs in (docs/determinism.md). */
static moe8_order g_order = MOE8_ORDER_NATIVE;

static bool canon_cfg(const cfg *c) {
  return c->lt == MOE8_DTYPE_BF16 || c->lt == MOE8_DTYPE_F8E4M3 || c->lt == MOE8_DTYPE_F8E5M2;
}

static float *run(prob *p, moe8_isa isa) {
  p->a.order = g_order;
  const size_t osz = moe8__dtype_size(p->a.out_dtype), n = (size_t)(p->M * p->N);
  void *out = tu_alloc(n * osz);
  memset(out, 0xFF, n * osz); /* NaN in f32 and bf16 */
  assert_int_equal(moe8_isa_set(isa), MOE8_OK);
  p->a.out = out;
  const moe8_status st = moe8_gmm(&p->a);
  if (st != MOE8_OK) TU_FAIL("gmm: %s: %s", moe8_status_str(st), moe8_last_error());
  assert_true(tu_guard_ok(out, n * osz));
  /* FP8 and i8 weights packed once (moe8_gmm_pack_rhs) give the same bytes. */
  const int64_t kb = p->a.lhs.tile ? p->a.lhs.tile : p->a.rhs.tile ? p->a.rhs.tile : p->K;
  const moe8_dtype rt = p->a.rhs.dtype;
  if ((rt == MOE8_DTYPE_F8E4M3 || rt == MOE8_DTYPE_F8E5M2 || rt == MOE8_DTYPE_I8) && !p->a.rhs_transposed &&
      (kb % (rt == MOE8_DTYPE_I8 ? 4 : 2) == 0 || kb >= p->K)) {
    const size_t pb = moe8_gmm_packed_size(p->a.rhs.dtype, p->G, p->K, p->N);
    void *pk = malloc(pb + 64), *out2 = tu_alloc(n * osz);
    memset(pk, 0xA5, pb + 64);
    assert_int_equal(moe8_gmm_pack_rhs(p->a.rhs.dtype, p->rhs, p->G, p->K, p->N, pk), MOE8_OK);
    memset(out2, 0xFF, n * osz);
    moe8_gmm_args a = p->a;
    a.rhs.data = NULL;
    a.rhs_packed = pk;
    a.out = out2;
    if (moe8_gmm(&a) != MOE8_OK) TU_FAIL("gmm packed: %s", moe8_last_error());
    assert_true(tu_guard_ok(out2, n * osz));
    if (memcmp(out, out2, n * osz) != 0)
      TU_FAIL("%s: packed rhs differs from the plain rhs (K=%lld N=%lld M=%lld)", moe8_isa_name(isa), (long long)p->K,
              (long long)p->N, (long long)p->M);
    free(out2);
    free(pk);
  }
  float *f = malloc(n * 4 + 4);
  if (osz == 4) memcpy(f, out, n * 4);
  else moe8_convert(f, MOE8_DTYPE_F32, out, MOE8_DTYPE_BF16, n, 0);
  free(out);
  return f;
}

/* Value of operand element i (dequantized by hand, independently). */
static double val(moe8_dtype t, const void *d, int64_t i) {
  switch (t) {
    case MOE8_DTYPE_F32: return ((const float *)d)[i];
    case MOE8_DTYPE_BF16: return moe8_bf16_to_f32(((const uint16_t *)d)[i]);
    case MOE8_DTYPE_F8E4M3: return moe8_f8e4m3_to_f32(((const uint8_t *)d)[i]);
    case MOE8_DTYPE_F8E5M2: return moe8_f8e5m2_to_f32(((const uint8_t *)d)[i]);
    default: return ((const int8_t *)d)[i];
  }
}

static double lscale(const prob *p, const cfg *c, int64_t m, int64_t k) {
  if (!p->ls) return 1;
  if (c->lg == MOE8_GRAN_TENSOR) return p->ls[0];
  if (c->lg == MOE8_GRAN_ROW) return p->ls[m];
  return p->ls[m * ((p->K + c->tile - 1) / c->tile) + k / c->tile];
}

static double rscale(const prob *p, const cfg *c, int64_t g, int64_t k, int64_t n) {
  if (!p->rs) return 1;
  if (c->rg == MOE8_GRAN_TENSOR) return p->rs[0];
  if (c->rg == MOE8_GRAN_CHANNEL) return p->rs[g * p->N + n];
  return p->rs[(g * ((p->K + c->tile - 1) / c->tile) + k / c->tile) * p->N + n];
}

/* Float tolerance, normalized by Σ|a·b·s|: each f32 addition rounds once
** (2^-24 relative), a block of kb terms at most kb times, plus the
** promotion; the pairwise vdpbf16ps order and FMA change only which
** roundings happen, not how many.  A bf16 output adds one bf16 rounding of
** each side (2^-8 of |out|). */
static double tol_float(const prob *p, const cfg *c) {
  const int64_t kb = c->tile ? c->tile : p->K;
  return ldexp(1.0, -24) * (double)(kb + (p->K + kb - 1) / kb + 4) * 2.0;
}

static void compare(const prob *p, const cfg *c, const float *want, const float *got, const char *what, bool exact,
                    bool vs_math) {
  const bool ints = c->lt == MOE8_DTYPE_I8 && c->rt == MOE8_DTYPE_I8;
  int64_t lo = 0;
  for (int64_t g = 0; g < p->off; g++) lo += p->gs[g];
  int64_t hi = lo;
  for (int64_t g = p->off; g < p->off + p->G; g++) hi += p->gs[g];
  for (int64_t m = 0; m < p->M; m++) {
    int64_t g = 0, acc = 0;
    while (g < p->E && m >= acc + p->gs[g]) acc += p->gs[g++];
    const bool local = m >= lo && m < hi;
    for (int64_t n = 0; n < p->N; n++) {
      const float gv = got[m * p->N + n];
      if (!local) {
        if (gv != 0.0f) TU_FAIL("%s %s: row %lld outside the local groups is %g, not 0", c->name, what, (long long)m, (double)gv);
        continue;
      }
      if (exact && ints && !vs_math) {
        if (moe8__f32_bits(gv) != moe8__f32_bits(want[m * p->N + n]))
          TU_FAIL("%s %s: [%lld,%lld] = %.9g, want exactly %.9g (K=%lld N=%lld M=%lld)", c->name, what, (long long)m,
                  (long long)n, (double)gv, (double)want[m * p->N + n], (long long)p->K, (long long)p->N, (long long)p->M);
        continue;
      }
      double mag = 0, exactv = 0;
      const int64_t rg = g - p->off;
      for (int64_t k = 0; k < p->K; k++) {
        const int64_t ri = c->rhs_t ? (rg * p->N + n) * p->K + k : (rg * p->K + k) * p->N + n;
        const double t = val(c->lt, p->lhs, m * p->K + k) * val(c->rt, p->rhs, ri) * lscale(p, c, m, k) *
                         rscale(p, c, rg, k, n);
        mag += fabs(t);
        exactv += t;
      }
      const double ref = vs_math ? exactv : want[m * p->N + n];
      double tol = tol_float(p, c) * mag + 1e-30;
      if (c->ot == MOE8_DTYPE_BF16) tol += ldexp(fabs(ref), -7);
      if (!(fabs((double)gv - ref) <= tol))
        TU_FAIL("%s %s: [%lld,%lld] = %.9g, want %.9g ± %.3g (K=%lld N=%lld M=%lld)", c->name, what, (long long)m,
                (long long)n, (double)gv, ref, tol, (long long)p->K, (long long)p->N, (long long)p->M);
    }
  }
}

/* The sweep in one order; canonical: every table's bytes equal the
** reference's for the bf16 and FP8 pairs (the AMX tables always sum in
** it, so they are compared with the canonical reference in both runs). */
static void sweep(moe8_order order) {
  static const int64_t dims[] = {1, 15, 16, 17, 127, 128, 129, 1000};
  static const int32_t rows[] = {0, 1, 15, 16, 17, 31, 32, 33, 7, 9, 193, 255};
  moe8_isa isas[MOE8_ISA_COUNT];
  const int nisa = tu_isas(isas);
  int iter = 0;
  for (size_t ci = 0; ci < NCFG; ci++) {
    const cfg *c = &k_cfgs[ci];
    for (int ki = 0; ki < 8; ki++)
      for (int ni = 0; ni < 8; ni++, iter++) {
        const int64_t K = dims[ki], N = dims[ni];
        /* Large K·N gets fewer rows to keep the reference quick. */
        int32_t r = rows[(iter * 3 + ki) % 12];
        if (K * N > 20000 && r > 33) r = 17;
        int32_t gs[4] = {r, 0, 1, (int32_t)(K * N <= 20000 ? rows[(iter + ni) % 12] : 2)};
        int64_t off = 0, G = 4;
        switch (iter % 4) {
          case 1: off = 0; G = 1; break;       /* first group only */
          case 2: off = 3; G = 1; break;       /* last group only  */
          case 3: gs[0] = gs[1] = gs[2] = 0; break; /* all rows in one group */
          default: break;
        }
        tu_rng_reset((uint64_t)iter);
        prob p;
        prob_init(&p, c, K, N, gs, 4, off, G, iter % 3 == 0 ? 3 : 0);
        g_order = order;
        float *want = run(&p, MOE8_ISA_REF), *wcanon = NULL;
        if (iter % 5 == 0 || K * N <= 2048) compare(&p, c, NULL, want, "ref vs math", false, true);
        if (canon_cfg(c)) {
          g_order = MOE8_ORDER_CANONICAL;
          wcanon = run(&p, MOE8_ISA_REF);
          if (order == MOE8_ORDER_NATIVE && (iter % 5 == 0 || K * N <= 2048)) compare(&p, c, NULL, wcanon, "canonical ref vs math", false, true);
          g_order = order;
        }
        for (int t = 1; t < nisa; t++) {
          float *got = run(&p, isas[t]);
          const bool tiles = moe8__kernels_for(isas[t])->has_tiles;
          if (wcanon && (order == MOE8_ORDER_CANONICAL || tiles)) {
            const size_t nb = (size_t)(p.M * p.N) * 4;
            if (memcmp(wcanon, got, nb) != 0) {
              for (size_t e = 0; e < nb / 4; e++)
                if (memcmp(wcanon + e, got + e, 4) != 0)
                  TU_FAIL("%s on %s, canonical order: element %zu = %a, the reference's %a (K=%lld N=%lld M=%lld)", c->name,
                          moe8_isa_name(isas[t]), e, (double)got[e], (double)wcanon[e], (long long)K, (long long)N, (long long)p.M);
            }
          } else {
            compare(&p, c, want, got, moe8_isa_name(isas[t]), true, false);
          }
          free(got);
        }
        free(want);
        free(wcanon);
        prob_free(&p);
      }
  }
  g_order = MOE8_ORDER_NATIVE;
  moe8_isa_set(tu_isa_best());
}

static void test_gmm_sweep(void **state) {
  (void)state;
  sweep(MOE8_ORDER_NATIVE);
}

static void test_gmm_sweep_canonical(void **state) {
  (void)state;
  sweep(MOE8_ORDER_CANONICAL);
}

/* Every table after the reference (isas[1..]) gives want's bytes (the
** output's: f32 or bf16), packed and plain (run). */
static void expect_tables_equal(prob *p, const cfg *c, const float *want, const moe8_isa *isas, int nisa) {
  const size_t es = moe8__dtype_size(c->ot), nb = (size_t)(p->M * p->N) * es;
  for (int t = 1; t < nisa; t++) {
    float *got = run(p, isas[t]);
    for (size_t e = 0; e < nb / es && memcmp(want, got, nb) != 0; e++)
      if (memcmp((const char *)want + e * es, (const char *)got + e * es, es) != 0)
        TU_FAIL("%s on %s: element %zu differs from the canonical reference's (K=%lld N=%lld M=%lld)", c->name,
                moe8_isa_name(isas[t]), e, (long long)p->K, (long long)p->N, (long long)p->M);
    free(got);
  }
}

/* The tile kernels walk K in chunks: a long block in several stretches,
** several short blocks in one, a partial last block, row tiles with a
** zero-padded tail.  K past the sweep's sizes: every table, packed and
** plain, gives the canonical reference's bytes (i8: the exact sums). */
static void test_gmm_chunks(void **state) {
  (void)state;
  static const cfg cs[] = {
    {"i8*i8 row/chan",  MOE8_DTYPE_I8,     MOE8_DTYPE_I8,     MOE8_DTYPE_F32, MOE8_GRAN_ROW, MOE8_GRAN_CHANNEL, 0, false},
    {"i8*i8 tile64",    MOE8_DTYPE_I8,     MOE8_DTYPE_I8,     MOE8_DTYPE_F32, MOE8_GRAN_ROW_TILE, MOE8_GRAN_CHANNEL_TILE, 64, false},
    {"i8*i8 tile1536",  MOE8_DTYPE_I8,     MOE8_DTYPE_I8,     MOE8_DTYPE_F32, MOE8_GRAN_ROW_TILE, MOE8_GRAN_CHANNEL_TILE, 1536, false},
    {"e4m3 1x32",       MOE8_DTYPE_F8E4M3, MOE8_DTYPE_F8E4M3, MOE8_DTYPE_F32, MOE8_GRAN_ROW_TILE, MOE8_GRAN_CHANNEL_TILE, 32, false},
    {"e4m3 1x128",      MOE8_DTYPE_F8E4M3, MOE8_DTYPE_F8E4M3, MOE8_DTYPE_F32, MOE8_GRAN_ROW_TILE, MOE8_GRAN_CHANNEL_TILE, 128, false},
    {"e4m3 1x768",      MOE8_DTYPE_F8E4M3, MOE8_DTYPE_F8E4M3, MOE8_DTYPE_F32, MOE8_GRAN_ROW_TILE, MOE8_GRAN_CHANNEL_TILE, 768, false},
    {"bf16*bf16",       MOE8_DTYPE_BF16,   MOE8_DTYPE_BF16,   MOE8_DTYPE_F32, 0, 0, 0, false},
  };
  static const int64_t Ks[] = {2200, 3072, 1000};
  static const int32_t rows[][2] = {{1, 33}, {17, 16}, {64, 47}};
  moe8_isa isas[MOE8_ISA_COUNT];
  const int nisa = tu_isas(isas);
  for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++)
    for (int ki = 0; ki < 3; ki++) {
      const cfg *c = &cs[ci];
      const int64_t K = Ks[ki], N = ki == 1 ? 40 : 129;
      const int32_t gs[2] = {rows[ki][0], rows[ki][1]};
      tu_rng_reset((uint64_t)(100 + ci * 3 + ki));
      prob p;
      prob_init(&p, c, K, N, gs, 2, 0, 2, 1);
      g_order = MOE8_ORDER_CANONICAL;
      float *want = run(&p, MOE8_ISA_REF);
      compare(&p, c, NULL, want, "ref vs math", false, true);
      expect_tables_equal(&p, c, want, isas, nisa);
      free(want);
      prob_free(&p);
    }
  g_order = MOE8_ORDER_NATIVE;
  moe8_isa_set(tu_isa_best());
}

/* An output of MOE8__GMM_STREAM_BYTES or more is written with streaming
** stores where a kernel can (whole aligned vectors; the others masked):
** rows of aligned and unaligned length, rows past the groups zero, the
** same bytes as the reference on every table, packed and plain. */
static void test_gmm_large_output(void **state) {
  (void)state;
  static const cfg cs[] = {
    {"i8*i8 row/chan",  MOE8_DTYPE_I8,     MOE8_DTYPE_I8,     MOE8_DTYPE_F32,  MOE8_GRAN_ROW, MOE8_GRAN_CHANNEL, 0, false},
    {"e4m3 1x128",      MOE8_DTYPE_F8E4M3, MOE8_DTYPE_F8E4M3, MOE8_DTYPE_F32,  MOE8_GRAN_ROW_TILE, MOE8_GRAN_CHANNEL_TILE, 128, false},
    {"e4m3 1x128 bf16", MOE8_DTYPE_F8E4M3, MOE8_DTYPE_F8E4M3, MOE8_DTYPE_BF16, MOE8_GRAN_ROW_TILE, MOE8_GRAN_CHANNEL_TILE, 128, false},
  };
  static const int64_t Ns[] = {1040, 1037};
  moe8_isa isas[MOE8_ISA_COUNT];
  const int nisa = tu_isas(isas);
  for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++)
    for (int ni = 0; ni < 2; ni++) {
      const cfg *c = &cs[ci];
      const int64_t K = 256, N = Ns[ni];
      const int32_t gs[2] = {700, 400};
      tu_rng_reset((uint64_t)(300 + ci * 2 + ni));
      prob p;
      prob_init(&p, c, K, N, gs, 2, 0, 2, 3);
      assert_true((size_t)(p.M * N) * 4 >= MOE8__GMM_STREAM_BYTES);
      g_order = MOE8_ORDER_CANONICAL;
      float *want = run(&p, MOE8_ISA_REF);
      compare(&p, c, NULL, want, "ref vs math", false, true);
      expect_tables_equal(&p, c, want, isas, nisa);
      free(want);
      prob_free(&p);
    }
  g_order = MOE8_ORDER_NATIVE;
  moe8_isa_set(tu_isa_best());
}

/* A large output whose rows are off the 64-byte lines (a malloc'd
** buffer, or one at any 4-byte offset): the kernels realign the rows in
** registers to stream them (gmm_x86.h, out_how).  Every table gives the
** reference's bytes at every offset, and the bytes before and after the
** output are not touched. */
static void test_gmm_output_offsets(void **state) {
  (void)state;
  static const cfg cs[] = {
    {"i8*i8 row/chan", MOE8_DTYPE_I8,     MOE8_DTYPE_I8,     MOE8_DTYPE_F32, MOE8_GRAN_ROW, MOE8_GRAN_CHANNEL, 0, false},
    {"e4m3 1x128",     MOE8_DTYPE_F8E4M3, MOE8_DTYPE_F8E4M3, MOE8_DTYPE_F32, MOE8_GRAN_ROW_TILE, MOE8_GRAN_CHANNEL_TILE, 128, false},
  };
  /* 1040: a last task of 16 columns; 1037: a masked last vector. */
  static const int64_t Ns[] = {1040, 1037};
  static const size_t offs[] = {20, 0, 4, 60};
  moe8_isa isas[MOE8_ISA_COUNT];
  const int nisa = tu_isas(isas);
  for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++)
    for (size_t ni = 0; ni < sizeof Ns / sizeof Ns[0]; ni++) {
      const cfg *c = &cs[ci];
      const int64_t K = 256, N = Ns[ni];
      const int32_t gs[2] = {700, 401};
      tu_rng_reset((uint64_t)(400 + ci * 4 + ni));
      prob p;
      prob_init(&p, c, K, N, gs, 2, 0, 2, 3);
      const size_t nb = (size_t)(p.M * N) * 4;
      assert_true(nb >= MOE8__GMM_STREAM_BYTES);
      g_order = MOE8_ORDER_CANONICAL;
      float *want = run(&p, MOE8_ISA_REF);
      unsigned char *buf = NULL;
      assert_int_equal(posix_memalign((void **)&buf, 64, nb + 192), 0);
      /* Plain and packed weights (the packed prefill kernels write the
      ** output themselves). */
      void *pk = malloc(moe8_gmm_packed_size(c->rt, 2, K, N));
      assert_int_equal(moe8_gmm_pack_rhs(c->rt, p.rhs, 2, K, N, pk), MOE8_OK);
      for (int t = 1; t < nisa; t++)
        for (size_t oi = 0; oi < 2 * (sizeof offs / sizeof offs[0]); oi++) {
          if (isas[t] == MOE8_ISA_AMX_EMU && oi >= 2) break; /* the model is slow: one offset, plain and packed */
          memset(buf, 0xA5, nb + 192);
          void *out = buf + 64 + offs[oi / 2];
          assert_int_equal(moe8_isa_set(isas[t]), MOE8_OK);
          moe8_gmm_args a = p.a;
          if (oi % 2) { a.rhs.data = NULL; a.rhs_packed = pk; }
          a.out = out;
          if (moe8_gmm(&a) != MOE8_OK) TU_FAIL("gmm: %s", moe8_last_error());
          for (size_t x = 0; x < 64 + offs[oi / 2]; x++)
            if (buf[x] != 0xA5) TU_FAIL("%s on %s, offset %zu: byte %zu before the output written", c->name, moe8_isa_name(isas[t]), offs[oi / 2], x);
          for (size_t x = 64 + offs[oi / 2] + nb; x < nb + 192; x++)
            if (buf[x] != 0xA5) TU_FAIL("%s on %s, offset %zu: byte %zu past the output written", c->name, moe8_isa_name(isas[t]), offs[oi / 2], x);
          if (memcmp(out, want, nb) != 0)
            for (size_t e = 0; e < nb / 4; e++)
              if (memcmp((const char *)out + 4 * e, (const char *)want + 4 * e, 4) != 0)
                TU_FAIL("%s on %s (%s weights), N=%lld, output at offset %zu: element %zu (row %zu, column %zu) differs from the "
                        "reference's", c->name, moe8_isa_name(isas[t]), oi % 2 ? "packed" : "plain", (long long)N, offs[oi / 2], e,
                        e / (size_t)N, e % (size_t)N);
        }
      free(pk);
      free(buf);
      free(want);
      prob_free(&p);
    }
  g_order = MOE8_ORDER_NATIVE;
  moe8_isa_set(tu_isa_best());
}

/* docs/determinism.md: 1 vs 2 threads, and a row alone / in full batch / among others. */
static void test_gmm_determinism(void **state) {
  (void)state;
  moe8_isa isas[MOE8_ISA_COUNT];
  const int nisa = tu_isas(isas);
  for (size_t ci = 0; ci < NCFG; ci++) {
    const cfg *c = &k_cfgs[ci];
    for (int t = 0; t < nisa; t++) {
      const int32_t gs[3] = {200, 37, 150};
      tu_rng_reset(900 + ci);
      prob p;
      prob_init(&p, c, 300, 257, gs, 3, 0, 3, 0);
      omp_set_num_threads(1);
      float *one = run(&p, isas[t]);
      omp_set_num_threads(2);
      float *two = run(&p, isas[t]);
      if (memcmp(one, two, (size_t)(p.M * p.N) * 4) != 0)
        TU_FAIL("%s on %s: 1 and 2 threads differ", c->name, moe8_isa_name(isas[t]));
      /* Row 210 (group 1) alone: a one-row problem with the same operands. */
      const int64_t row = 210, K = p.K, N = p.N;
      const size_t lsz = moe8__dtype_size(c->lt);
      moe8_gmm_args a1 = p.a;
      int32_t gs1[3] = {0, 1, 0};
      float ls1[8];
      a1.M = 1; a1.group_sizes = gs1;
      a1.lhs.data = (const char *)p.lhs + (size_t)(row * K) * lsz;
      if (p.ls && c->lg == MOE8_GRAN_ROW) { ls1[0] = p.ls[row]; a1.lhs.scale = ls1; }
      if (p.ls && c->lg == MOE8_GRAN_ROW_TILE) a1.lhs.scale = p.ls + row * ((K + c->tile - 1) / c->tile);
      void *o1 = malloc((size_t)N * 4);
      a1.out = o1;
      assert_int_equal(moe8_gmm(&a1), MOE8_OK);
      float f1[512];
      if (c->ot == MOE8_DTYPE_F32) memcpy(f1, o1, (size_t)N * 4);
      else moe8_convert(f1, MOE8_DTYPE_F32, o1, MOE8_DTYPE_BF16, (size_t)N, 0);
      if (memcmp(f1, two + row * N, (size_t)N * 4) != 0)
        TU_FAIL("%s on %s: row %lld alone differs from the batch", c->name, moe8_isa_name(isas[t]), (long long)row);
      /* Among other rows: only rows 205..215 in group 1, the rest dropped. */
      moe8_gmm_args a2 = p.a;
      int32_t gs2[3] = {0, 11, 0};
      a2.M = 11; a2.group_sizes = gs2;
      a2.lhs.data = (const char *)p.lhs + (size_t)(205 * K) * lsz;
      if (p.ls && c->lg == MOE8_GRAN_ROW) a2.lhs.scale = p.ls + 205;
      if (p.ls && c->lg == MOE8_GRAN_ROW_TILE) a2.lhs.scale = p.ls + 205 * ((K + c->tile - 1) / c->tile);
      void *o2 = malloc((size_t)(11 * N) * 4);
      a2.out = o2;
      assert_int_equal(moe8_gmm(&a2), MOE8_OK);
      float f2[512];
      if (c->ot == MOE8_DTYPE_F32) memcpy(f2, (float *)o2 + 5 * N, (size_t)N * 4);
      else moe8_convert(f2, MOE8_DTYPE_F32, (uint16_t *)o2 + 5 * N, MOE8_DTYPE_BF16, (size_t)N, 0);
      if (memcmp(f2, two + row * N, (size_t)N * 4) != 0)
        TU_FAIL("%s on %s: row %lld among other rows differs", c->name, moe8_isa_name(isas[t]), (long long)row);
      /* Two rows (the small-M kernels have a two-row path of their own). */
      moe8_gmm_args a3 = a2;
      int32_t gs3[3] = {0, 2, 0};
      a3.M = 2; a3.group_sizes = gs3;
      a3.lhs.data = (const char *)p.lhs + (size_t)(row * K) * lsz;
      a3.lhs.scale = a1.lhs.scale;
      float ls2[2];
      if (p.ls && c->lg == MOE8_GRAN_ROW) { ls2[0] = p.ls[row]; ls2[1] = p.ls[row + 1]; a3.lhs.scale = ls2; }
      void *o3 = malloc((size_t)(2 * N) * 4);
      a3.out = o3;
      assert_int_equal(moe8_gmm(&a3), MOE8_OK);
      float f3[1024];
      if (c->ot == MOE8_DTYPE_F32) memcpy(f3, o3, (size_t)(2 * N) * 4);
      else moe8_convert(f3, MOE8_DTYPE_F32, o3, MOE8_DTYPE_BF16, (size_t)(2 * N), 0);
      if (memcmp(f3, two + row * N, (size_t)(2 * N) * 4) != 0)
        TU_FAIL("%s on %s: rows %lld-%lld as a two-row call differ from the batch", c->name, moe8_isa_name(isas[t]), (long long)row,
                (long long)row + 1);
      free(o3);
      free(o1); free(o2); free(one); free(two);
      prob_free(&p);
    }
  }
  omp_set_num_threads(omp_get_num_procs());
  moe8_isa_set(tu_isa_best());
}

/* Packed i8 and e4m3 weights with 3 to 9 rows an expert (the small-M
** kernels' row groups: pairs, threes, fours, i8's four or five rows in one
** stream with the rest in threes, and their tails) and extreme
** codes on both sides (i8: -128 and 127, so the compensation of either
** operand is exercised at its limits; e4m3: ±448 and subnormals): every
** table's bytes equal the reference's (FP8: in the canonical order), on
** the plain and on the packed weights, and FP8's packed weights give the
** plain weights' bytes in the native order.  K 4, 260 and 2048 with a single block (per-channel; 2048: i8's
** stream of more than one chunk) and with 64-blocks (row-tile x channel-tile); N with a masked last vector and
** with whole tiles of 128 columns. */
static int8_t few_code(moe8_dtype dt, int64_t i) {
  const uint32_t u = (uint32_t)tu_u64();
  if (dt == MOE8_DTYPE_I8) return (int8_t)(u % 4 == 0 ? (i & 1 ? -128 : 127) : (int)(u >> 8) % 256 - 128);
  static const uint8_t edge[4] = {0x7E, 0xFE, 0x01, 0x81}; /* ±448, ±2^-9 */
  const uint8_t c = u % 4 == 0 ? edge[(u >> 4) & 3] : (uint8_t)(u >> 8);
  return (int8_t)((c & 0x7F) == 0x7F ? c ^ 1 : c); /* no NaN */
}

/* a on kernel table isa into got (ob bytes, filled with NaN first), from
** the plain weights or from their packed copy pk. */
static void run_on_table(const moe8_gmm_args *a, moe8_isa isa, bool packed, const void *pk, float *got, size_t ob) {
  assert_int_equal(moe8_isa_set(isa), MOE8_OK);
  moe8_gmm_args b = *a;
  if (packed) { b.rhs.data = NULL; b.rhs_packed = pk; }
  memset(got, 0xFF, ob);
  b.out = got;
  assert_int_equal(moe8_gmm(&b), MOE8_OK);
}

/* a on every table, plain and packed (pk), in the canonical order (or
** the default one where !fp8) against the reference and, for FP8, in the
** native order each packed run against its plain run.  false with the
** first difference described in why. */
static bool tables_agree(moe8_gmm_args *a, const moe8_isa *isas, int nisa, const void *pk, size_t ob, bool fp8, char *why, size_t nwhy) {
  float *want = malloc(ob), *got = malloc(ob), *plain = malloc(ob);
  bool ok = true;
  for (int ord = 0; ok && ord < (fp8 ? 2 : 1); ord++) {
    a->order = ord ? MOE8_ORDER_NATIVE : fp8 ? MOE8_ORDER_CANONICAL : MOE8_ORDER_DEFAULT;
    if (!ord) run_on_table(a, MOE8_ISA_REF, false, NULL, want, ob); /* native: each table's plain run instead */
    for (int t = 1; ok && t < nisa; t++)
      for (int packed = 0; ok && packed < 2; packed++) {
        run_on_table(a, isas[t], packed, pk, got, ob);
        if (ord && !packed) memcpy(plain, got, ob);
        else if (memcmp(ord ? plain : want, got, ob) != 0) {
          snprintf(why, nwhy, "on %s (%s, %s order): differs from %s", moe8_isa_name(isas[t]), packed ? "packed" : "plain",
                   ord ? "native" : fp8 ? "canonical" : "default", ord ? "the plain weights" : "the reference");
          ok = false;
        }
      }
  }
  free(want); free(got); free(plain);
  return ok;
}

static void test_gmm_few_rows(void **state) {
  (void)state;
  static const int64_t Ks[] = {4, 260, 2048}, Ns[] = {16, 130, 200, 257}; /* column tiles of 1, 2, 3 and 4 strips */
  moe8_isa isas[MOE8_ISA_COUNT];
  const int nisa = tu_isas(isas);
  for (int di = 0; di < 2; di++)
  for (int tiled = 0; tiled < 2; tiled++)
    for (size_t ki = 0; ki < 3; ki++)
      for (size_t ni = 0; ni < 4; ni++) {
        const int64_t K = Ks[ki], N = Ns[ni], tile = tiled ? 64 : 0;
        if (tiled && K % 64) continue;
        const int32_t gs[7] = {3, 4, 5, 6, 7, 8, 9};
        int64_t M = 0;
        for (int g = 0; g < 7; g++) M += gs[g];
        const moe8_dtype dt = di ? MOE8_DTYPE_F8E4M3 : MOE8_DTYPE_I8;
        tu_rng_reset((uint64_t)(900 + di * 64 + tiled * 16 + ki * 4 + ni));
        int8_t *x = malloc((size_t)(M * K)), *w = malloc((size_t)(7 * K * N));
        for (int64_t i = 0; i < M * K; i++) x[i] = few_code(dt, i);
        for (int64_t i = 0; i < 7 * K * N; i++) w[i] = few_code(dt, i >> 1);
        const int64_t nb = tiled ? K / 64 : 1;
        float *xs = malloc(sizeof(float) * (size_t)(M * nb)), *ws = malloc(sizeof(float) * (size_t)(7 * nb * N));
        for (int64_t i = 0; i < M * nb; i++) xs[i] = 0.5f + (float)(i % 7) * 0.125f;
        for (int64_t i = 0; i < 7 * nb * N; i++) ws[i] = 0.001f * (float)(1 + i % 5);
        moe8_gmm_args a = {.M = M, .K = K, .N = N, .num_groups = 7, .group_sizes = gs, .num_local = 7,
                           .lhs = {dt, x, xs, tiled ? MOE8_GRAN_ROW_TILE : MOE8_GRAN_ROW, tile},
                           .rhs = {dt, w, ws, tiled ? MOE8_GRAN_CHANNEL_TILE : MOE8_GRAN_CHANNEL, tile},
                           .out_dtype = MOE8_DTYPE_F32};
        const size_t ob = sizeof(float) * (size_t)(M * N);
        void *pk = malloc(moe8_gmm_packed_size(dt, 7, K, N));
        assert_int_equal(moe8_gmm_pack_rhs(dt, w, 7, K, N, pk), MOE8_OK);
        /* i8 sums are exact in any order: every table gives the
        ** reference's bytes.  FP8 does in the canonical order; in the
        ** native one each table's packed run gives its plain run's bytes. */
        char why[160];
        if (!tables_agree(&a, isas, nisa, pk, ob, di != 0, why, sizeof why))
          TU_FAIL("%s few rows (K=%lld N=%lld, %s) %s", di ? "e4m3" : "i8", (long long)K, (long long)N,
                  tiled ? "64-blocks" : "per channel", why);
        free(x); free(w); free(xs); free(ws); free(pk);
      }
  moe8_isa_set(tu_isa_best());
}

/* One row an expert on packed e4m3 weights with long scale blocks (256
** and 512 columns of K: on AMD one loop over every block, pk_vbmi_row),
** beside 128-blocks and per channel, whole column tiles and a masked last
** one: every table's packed run gives its plain run's bytes (native
** order) and the reference's (canonical order). */
static void test_gmm_one_row_blocks(void **state) {
  (void)state;
  static const int64_t tiles[] = {0, 128, 256, 512}, Ns[] = {256, 300};
  const int64_t K = 1024, E = 5;
  const int32_t gs[5] = {1, 2, 1, 0, 1};
  const int64_t M = 5;
  moe8_isa isas[MOE8_ISA_COUNT];
  const int nisa = tu_isas(isas);
  const moe8_dtype dt = MOE8_DTYPE_F8E4M3;
  for (size_t ti = 0; ti < 4; ti++)
    for (size_t ni = 0; ni < 2; ni++) {
      const int64_t tile = tiles[ti], N = Ns[ni], nb = tile ? K / tile : 1;
      tu_rng_reset((uint64_t)(1300 + ti * 4 + ni));
      int8_t *x = malloc((size_t)(M * K)), *w = malloc((size_t)(E * K * N));
      for (int64_t i = 0; i < M * K; i++) x[i] = few_code(dt, i);
      for (int64_t i = 0; i < E * K * N; i++) w[i] = few_code(dt, i >> 1);
      float *xs = malloc(sizeof(float) * (size_t)(M * nb)), *ws = malloc(sizeof(float) * (size_t)(E * nb * N));
      for (int64_t i = 0; i < M * nb; i++) xs[i] = 0.5f + (float)(i % 7) * 0.125f;
      for (int64_t i = 0; i < E * nb * N; i++) ws[i] = 0.001f * (float)(1 + i % 5);
      moe8_gmm_args a = {.M = M, .K = K, .N = N, .num_groups = E, .group_sizes = gs, .num_local = E,
                         .lhs = {dt, x, xs, tile ? MOE8_GRAN_ROW_TILE : MOE8_GRAN_ROW, tile},
                         .rhs = {dt, w, ws, tile ? MOE8_GRAN_CHANNEL_TILE : MOE8_GRAN_CHANNEL, tile},
                         .out_dtype = MOE8_DTYPE_F32};
      const size_t ob = sizeof(float) * (size_t)(M * N);
      void *pk = malloc(moe8_gmm_packed_size(dt, E, K, N));
      assert_int_equal(moe8_gmm_pack_rhs(dt, w, E, K, N, pk), MOE8_OK);
      char why[160];
      if (!tables_agree(&a, isas, nisa, pk, ob, true, why, sizeof why))
        TU_FAIL("e4m3 one row (N=%lld, blocks of %lld) %s", (long long)N, (long long)(tile ? tile : K), why);
      free(x); free(w); free(xs); free(ws); free(pk);
    }
  moe8_isa_set(tu_isa_best());
}

/* Thousands of scale blocks: a task's rows of column scales (4096 blocks ×
** 128 columns, 2 MiB) do not fit the scratch, so every kernel that reads
** them all before its weight stream (rhs_scales_all) reads them a block at
** a time instead; the bytes are the reference's all the same.  Rows per
** expert 1, 3 and 20 (the few-row kernels and, with AMX, the tiles);
** i8 and FP8 (canonical order), plain and packed weights. */
static void test_gmm_many_blocks(void **state) {
  (void)state;
  const int64_t K = 16384, N = 130, tile = 4, nb = K / tile;
  const int32_t gs[3] = {1, 3, 20};
  const int64_t M = 24;
  moe8_isa isas[MOE8_ISA_COUNT];
  const int nisa = tu_isas(isas);
  for (int di = 0; di < 2; di++) {
    const moe8_dtype dt = di ? MOE8_DTYPE_F8E4M3 : MOE8_DTYPE_I8;
    tu_rng_reset((uint64_t)(1700 + di));
    int8_t *x = malloc((size_t)(M * K)), *w = malloc((size_t)(3 * K * N));
    float *xs = malloc(sizeof(float) * (size_t)(M * nb)), *ws = malloc(sizeof(float) * (size_t)(3 * nb * N));
    for (int64_t i = 0; i < M * K; i++) x[i] = few_code(dt, i);
    for (int64_t i = 0; i < 3 * K * N; i++) w[i] = few_code(dt, i >> 1);
    for (int64_t i = 0; i < M * nb; i++) xs[i] = 0.5f + (float)(i % 7) * 0.125f;
    for (int64_t i = 0; i < 3 * nb * N; i++) ws[i] = 0.001f * (float)(1 + i % 7); /* a block's row differs from the last's */
    moe8_gmm_args a = {.M = M, .K = K, .N = N, .num_groups = 3, .group_sizes = gs, .num_local = 3,
                       .lhs = {dt, x, xs, MOE8_GRAN_ROW_TILE, tile}, .rhs = {dt, w, ws, MOE8_GRAN_CHANNEL_TILE, tile},
                       .out_dtype = MOE8_DTYPE_F32, .order = di ? MOE8_ORDER_CANONICAL : MOE8_ORDER_DEFAULT};
    const size_t ob = sizeof(float) * (size_t)(M * N);
    float *want = malloc(ob), *got = malloc(ob);
    void *pk = malloc(moe8_gmm_packed_size(dt, 3, K, N));
    assert_int_equal(moe8_gmm_pack_rhs(dt, w, 3, K, N, pk), MOE8_OK);
    run_on_table(&a, MOE8_ISA_REF, false, NULL, want, ob);
    for (int t = 1; t < nisa; t++)
      for (int packed = 0; packed < 2; packed++) {
        run_on_table(&a, isas[t], packed, pk, got, ob);
        if (memcmp(want, got, ob) != 0)
          TU_FAIL("%s with %lld blocks of %lld on %s (%s): differs from the reference", di ? "e4m3" : "i8", (long long)nb,
                  (long long)tile, moe8_isa_name(isas[t]), packed ? "packed" : "plain");
      }
    free(x); free(w); free(xs); free(ws); free(want); free(got); free(pk);
  }
  moe8_isa_set(tu_isa_best());
}

static void test_gmm_bad_input(void **state) {
  (void)state;
  float lhs[8] = {0}, rhs[8] = {0}, out[8];
  int32_t gs[2] = {2, 1};
  moe8_gmm_args a = {.M = 2, .K = 2, .N = 2, .num_groups = 2, .group_sizes = gs, .num_local = 2,
                     .lhs = {MOE8_DTYPE_F32, lhs, NULL, 0, 0}, .rhs = {MOE8_DTYPE_F32, rhs, NULL, 0, 0},
                     .out_dtype = MOE8_DTYPE_F32, .out = out};
  assert_int_equal(moe8_gmm(&a), MOE8_ERR_SHAPE); /* 3 rows in groups, M = 2 */
  assert_non_null(strstr(moe8_last_error(), "M = 2"));
  gs[1] = 0;
  a.lhs.dtype = MOE8_DTYPE_I8;
  assert_int_equal(moe8_gmm(&a), MOE8_ERR_DTYPE);
  assert_non_null(strstr(moe8_last_error(), "i8"));
  a.lhs.dtype = MOE8_DTYPE_F8E4M3;
  a.rhs.dtype = MOE8_DTYPE_F8E4M3;
  assert_int_equal(moe8_gmm(&a), MOE8_ERR_INVALID_ARG); /* no scale */
  a.lhs.scale = a.rhs.scale = lhs;
  a.lhs.gran = MOE8_GRAN_CHANNEL;
  assert_int_equal(moe8_gmm(&a), MOE8_ERR_SHAPE);
  a.lhs.gran = MOE8_GRAN_ROW_TILE; a.lhs.tile = 64;
  a.rhs.gran = MOE8_GRAN_CHANNEL_TILE; a.rhs.tile = 32;
  assert_int_equal(moe8_gmm(&a), MOE8_ERR_SHAPE);
  assert_non_null(strstr(moe8_last_error(), "tile"));
  a.rhs.tile = 64;
  a.group_offset = 1; a.num_local = 2;
  assert_int_equal(moe8_gmm(&a), MOE8_ERR_SHAPE);
  a.group_offset = 0;
  a.out_dtype = MOE8_DTYPE_I8;
  assert_int_equal(moe8_gmm(&a), MOE8_ERR_DTYPE);
  assert_int_equal(moe8_gmm(NULL), MOE8_ERR_INVALID_ARG);
  /* Packed weights: FP8 or i8 only, not transposed, blocks of whole pairs
  ** (FP8) or quads (i8) when there is more than one. */
  a.out_dtype = MOE8_DTYPE_F32;
  uint8_t pk[4096];
  assert_int_equal(moe8_gmm_pack_rhs(MOE8_DTYPE_BF16, rhs, 2, 2, 2, pk), MOE8_ERR_DTYPE);
  assert_non_null(strstr(moe8_last_error(), "bf16"));
  assert_int_equal(moe8_gmm_pack_rhs(MOE8_DTYPE_I8, NULL, 2, 2, 2, pk), MOE8_ERR_INVALID_ARG);
  assert_int_equal(moe8_gmm_pack_rhs(MOE8_DTYPE_I8, rhs, -1, 2, 2, pk), MOE8_ERR_SHAPE);
  assert_int_equal(moe8_gmm_pack_rhs(MOE8_DTYPE_I8, rhs, 0, 2, 2, NULL), MOE8_OK); /* nothing to pack */
  assert_true(moe8_gmm_packed_size(MOE8_DTYPE_F8E4M3, 2, 2, 2) <= sizeof pk);
  assert_int_equal(moe8_gmm_pack_rhs(MOE8_DTYPE_F8E4M3, rhs, 2, 2, 2, pk), MOE8_OK);
  a.rhs_packed = pk;
  a.rhs.data = NULL;
  a.lhs.tile = a.rhs.tile = 1; a.K = 2; /* two blocks of one k: not whole pairs */
  assert_int_equal(moe8_gmm(&a), MOE8_ERR_SHAPE);
  assert_non_null(strstr(moe8_last_error(), "multiple of 2"));
  a.lhs.tile = a.rhs.tile = 2;
  assert_int_equal(moe8_gmm(&a), MOE8_OK);
  a.rhs_transposed = true;
  assert_int_equal(moe8_gmm(&a), MOE8_ERR_DTYPE); /* a transposed rhs is f32/bf16 only */
  a.rhs_transposed = false;
  a.lhs.dtype = a.rhs.dtype = MOE8_DTYPE_I8; a.K = 4; /* i8 blocks of 2 are not whole quads */
  assert_int_equal(moe8_gmm(&a), MOE8_ERR_SHAPE);
  assert_non_null(strstr(moe8_last_error(), "multiple of 4"));
}

/* tgmm against a double-precision evaluation; empty groups give zeros. */
static void test_tgmm(void **state) {
  (void)state;
  const int64_t K = 19, N = 33;
  const int32_t gs[4] = {5, 0, 17, 1};
  const int64_t M = 25;
  float *x = malloc(M * K * 4), *dy = malloc(M * N * 4), *out = tu_alloc(4 * K * N * 4);
  tu_rng_reset(4);
  tu_fill_normal(x, (size_t)(M * K), 1);
  tu_fill_normal(dy, (size_t)(M * N), 1);
  for (int bf = 0; bf < 2; bf++) {
    uint16_t *xb = malloc(M * K * 2);
    moe8_convert(xb, MOE8_DTYPE_BF16, x, MOE8_DTYPE_F32, (size_t)(M * K), 0);
    moe8_operand l = {bf ? MOE8_DTYPE_BF16 : MOE8_DTYPE_F32, bf ? (void *)xb : (void *)x, NULL, 0, 0};
    moe8_operand d = {MOE8_DTYPE_F32, dy, NULL, 0, 0};
    tu_fill_nan(out, 4 * K * N);
    assert_int_equal(moe8_tgmm(&l, &d, M, K, N, 4, gs, 1, 3, out), MOE8_OK);
    assert_true(tu_guard_ok(out, 4 * K * N * 4));
    for (int64_t i = 3 * K * N; i < 4 * K * N; i++) assert_true(isnan(out[i])); /* past 3 local groups: untouched */
    int64_t row0 = 5;
    for (int64_t g = 1; g < 4; g++) {
      for (int64_t k = 0; k < K; k++)
        for (int64_t n = 0; n < N; n++) {
          double s = 0, mag = 0;
          for (int64_t m = row0; m < row0 + gs[g]; m++) {
            const double a = bf ? moe8_bf16_to_f32(xb[m * K + k]) : x[m * K + k];
            s += a * dy[m * N + n];
            mag += fabs(a * dy[m * N + n]);
          }
          const float got = out[((g - 1) * K + k) * N + n];
          assert_false(isnan(got));
          if (fabs(got - s) > 1e-6 * mag + 1e-30) TU_FAIL("tgmm g=%lld [%lld,%lld] = %g, want %g", (long long)g, (long long)k, (long long)n, (double)got, s);
        }
      row0 += gs[g];
    }
    free(xb);
  }
  /* Every ISA, 1 and 2 threads: bitwise equal across threads. */
  moe8_isa isas[MOE8_ISA_COUNT];
  const int nisa = tu_isas(isas);
  float *o1 = malloc(4 * K * N * 4), *o2 = malloc(4 * K * N * 4);
  moe8_operand l = {MOE8_DTYPE_F32, x, NULL, 0, 0}, dd = {MOE8_DTYPE_F32, dy, NULL, 0, 0};
  for (int t = 0; t < nisa; t++) {
    moe8_isa_set(isas[t]);
    omp_set_num_threads(1);
    assert_int_equal(moe8_tgmm(&l, &dd, M, K, N, 4, gs, 0, 4, o1), MOE8_OK);
    omp_set_num_threads(2);
    assert_int_equal(moe8_tgmm(&l, &dd, M, K, N, 4, gs, 0, 4, o2), MOE8_OK);
    assert_memory_equal(o1, o2, (size_t)(4 * K * N) * 4);
  }
  moe8_isa_set(tu_isa_best());
  free(o1); free(o2);
  moe8_operand bad = {MOE8_DTYPE_I8, x, NULL, 0, 0}, d = {MOE8_DTYPE_F32, dy, NULL, 0, 0};
  assert_int_equal(moe8_tgmm(&bad, &d, M, K, N, 4, gs, 0, 4, out), MOE8_ERR_DTYPE);
  free(x); free(dy); free(out);
}

/* An argument runs only the tests it matches (cmocka_set_test_filter:
** * and ? wildcards), as the vendor runs of CMakeLists.txt do. */
int main(int argc, char **argv) {
  if (argc > 1) cmocka_set_test_filter(argv[1]);
  tu_seed();
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_gmm_bad_input),
    cmocka_unit_test(test_gmm_few_rows),
      cmocka_unit_test(test_gmm_one_row_blocks),
    cmocka_unit_test(test_gmm_many_blocks),
    cmocka_unit_test(test_tgmm),
    cmocka_unit_test(test_gmm_determinism),
    cmocka_unit_test(test_gmm_sweep),
    cmocka_unit_test(test_gmm_sweep_canonical),
    cmocka_unit_test(test_gmm_chunks),
    cmocka_unit_test(test_gmm_large_output),
    cmocka_unit_test(test_gmm_output_offsets),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
