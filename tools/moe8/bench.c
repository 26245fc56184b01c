/*
** bench.c — 'moe8 bench': measured, not estimated.
**
**   moe8 bench quant   f32 -> f8e4m3 per-token 1x128 quantization of 64 MiB,
**                      in GB/s, against the machine's measured memory read
**                      bandwidth (one pass of glibc memchr over 512 MiB, a
**                      pure streaming read), for 1 and 2 threads.
**   moe8 bench gmm     the grouped matmul x[T·k, D] · Wg[E, D, F] per dtype
**                      (f32, bf16, f8e4m3 1x128/128-tile, i8 1x128/128-tile)
**                      at a prefill and a decode shape, 1 and 2 threads, in
**                      GFLOP/s, % of the measured peak, and against a
**                      per-expert OpenBLAS cblas_sgemm loop when present.
**
** Each figure is the min and median of several runs over buffers larger
** than the caches.
*/
#include "cli.h"
#include "core/internal.h"
#include "peak.h"
#include "peer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef MOE8_HAVE_OPENBLAS
#endif

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static void set_threads(int n) {
  moe8_set_num_threads(n);
#ifdef _OPENMP
  omp_set_num_threads(n); /* the peers' OpenMP */
#else
  (void)n;
#endif
}

static int max_threads(void) {
#ifdef _OPENMP
  return omp_get_num_procs();
#else
  return 1;
#endif
}

/* Memory read bandwidth in GB/s with nth threads: best of 5 passes of
** glibc memchr over 512 MiB (a pure streaming read), the buffer split
** between the threads, the time of the slowest. */
static double read_bandwidth(int nth) {
  const size_t n = (size_t)512 << 20;
  /* Huge pages where the kernel gives them, as the packed weights get
  ** (moe8__alloc_weights): the peak is the memory's, not the TLB's. */
  unsigned char *buf = moe8__alloc_weights(n);
  if (!buf) return 0;
  memset(buf, 2, n); /* not zero: a zero fill may become calloc and map the zero page */
  double best = 1e30;
  int found = 0;
  for (int i = 0; i < 5; i++) {
    const double t0 = cli_now();
    #pragma omp parallel for num_threads(nth) schedule(static) reduction(+ : found)
    for (int t = 0; t < nth; t++) found += memchr(buf + n / (size_t)nth * (size_t)t, 1, n / (size_t)nth) != NULL;
    const double t = cli_now() - t0;
    if (t < best) best = t;
  }
  free(buf);
  if (found) best = 1e30; /* keeps the calls from being optimized away */
  return (double)n / best / 1e9;
}

static int bench_quant(double bw, double bw2) {
  const int64_t T = 4096, K = 4096, tile = 128;
  const size_t n = (size_t)(T * K);
  /* Two input buffers, alternated, so each run reads from memory. */
  float *x[2] = {malloc(n * 4), malloc(n * 4)};
  uint8_t *q = malloc(n);
  float *s = malloc(sizeof(float) * (size_t)(T * (K / tile)));
  if (!x[0] || !x[1] || !q || !s) { fprintf(stderr, "moe8 bench: out of memory\n"); return EXIT_FAIL; }
  for (size_t i = 0; i < n; i++) x[0][i] = x[1][i] = (float)((int)(i * 2654435761u % 2001) - 1000) * 0.01f;
  memset(q, 0, n);
  printf("\nmoe8 bench quant: quantize f32 -> f8e4m3 per-token 1x128, x[%lld, %lld] = 64 MiB, kernels %s\n",
         (long long)T, (long long)K, moe8_isa_name(moe8_isa_active()));
  printf("%8s %10s %10s %14s %12s\n", "threads", "min ms", "median ms", "input GB/s", "% of read bw");
  const moe8_quant_spec spec = {.qtype = MOE8_DTYPE_F8E4M3, .gran = MOE8_GRAN_ROW_TILE, .tile = tile, .clip = 1.0f};
  for (int th = 1; th <= (max_threads() < 2 ? 1 : 2); th++) {
    set_threads(th);
    enum { RUNS = 9 };
    double t[RUNS];
    for (int r = 0; r < RUNS; r++) {
      const double t0 = cli_now();
      moe8_status st = moe8_quantize(&spec, x[r & 1], 1, T, K, q, s, NULL);
      t[r] = cli_now() - t0;
      if (st != MOE8_OK) return cli_report(st, "bench quant");
    }
    qsort(t, RUNS, sizeof t[0], cmp_double);
    const double gbs = (double)(n * 4) / t[0] / 1e9;
    printf("%8d %10.2f %10.2f %14.1f %11.0f%%\n", th, t[0] * 1e3, t[RUNS / 2] * 1e3, gbs, 100.0 * gbs / (th == 1 || bw2 <= 0 ? bw : bw2));
  }
  set_threads(max_threads());
  free(x[0]); free(x[1]); free(q); free(s);
  return EXIT_OK;
}


/* ---- moe8 bench gmm ------------------------------------------------------ */
typedef struct gmm_case {
  const char *name;
  moe8_dtype  t;
  peak_kind   peak;
  bool        packed; /* FP8 weights through moe8_gmm_pack_rhs, as a prepared layer runs them */
  moe8_order  order;  /* the summation order (docs/determinism.md)                        */
} gmm_case;

enum { MAXROT = 16 };

/* Copies of the weights a decode run rotates through so that together
** they are at least twice the last-level cache the OS reports (at least
** 4): each run then reads its weights from memory. */
static int rotations(double bytes_per_copy) {
  long llc = 0;
  FILE *f = fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "r");
  if (f) {
    char unit = 0;
    if (fscanf(f, "%ld%c", &llc, &unit) >= 1) llc *= unit == 'K' ? 1024 : unit == 'M' ? 1048576 : 1;
    fclose(f);
  }
  int n = 4;
  while (n < MAXROT && (double)n * bytes_per_copy < 2.0 * (double)llc) n++;
  return n;
}

static uint64_t g_rng = 88172645463325252ULL;
static uint64_t rnd(void) { g_rng ^= g_rng << 13; g_rng ^= g_rng >> 7; g_rng ^= g_rng << 17; return g_rng; }

/* Expert group sizes for T tokens routed top-k to E experts uniformly. */
static void route_sizes(int64_t T, int64_t k, int64_t E, int32_t *gs) {
  for (int64_t e = 0; e < E; e++) gs[e] = 0;
  for (int64_t t = 0; t < T; t++) {
    uint64_t used = 0;
    for (int64_t j = 0; j < k; j++) {
      int64_t e;
      do e = (int64_t)(rnd() % (uint64_t)E); while (used >> e & 1);
      used |= 1ull << e;
      gs[e]++;
    }
  }
}

static void fill_rand(float *x, size_t n, float scale) {
  for (size_t i = 0; i < n; i++) x[i] = ((float)(rnd() >> 40) * 0x1p-24f - 0.5f) * scale;
}

/* Operands of one dtype made from f32 data; nrot copies of the weights. */
typedef struct gmm_ops {
  void  *lhs, *rhs[MAXROT];
  float *ls, *rs[MAXROT];
  moe8_operand l, r;
} gmm_ops;

static moe8_status make_ops(gmm_ops *o, moe8_dtype t, const float *x, const float *w, int64_t M, int64_t D, int64_t E,
                            int64_t F, int nrot) {
  memset(o, 0, sizeof *o);
  const size_t es = t == MOE8_DTYPE_F32 ? 4 : t == MOE8_DTYPE_BF16 ? 2 : 1;
  const bool q = t != MOE8_DTYPE_F32 && t != MOE8_DTYPE_BF16;
  /* f8e4m3: 1x128 activation and 128-block weight scales (DeepSeek-style);
  ** i8: per-token and per-channel scales (one block along K, the usual
  ** int8 recipe). */
  const int64_t tile = t == MOE8_DTYPE_I8 ? 0 : 128;
  const moe8_quant_spec ls = {.qtype = t, .gran = tile ? MOE8_GRAN_ROW_TILE : MOE8_GRAN_ROW, .tile = tile, .clip = 1.0f};
  const moe8_quant_spec ws = {.qtype = t, .gran = tile ? MOE8_GRAN_CHANNEL_TILE : MOE8_GRAN_CHANNEL, .tile = tile, .clip = 1.0f};
  o->lhs = malloc((size_t)(M * D) * es + 64);
  if (!o->lhs) return MOE8_ERR_NOMEM;
  moe8_status st = q ? (o->ls = malloc(sizeof(float) * (size_t)(M * (D / 128 + 1))),
                        moe8_quantize(&ls, x, 1, M, D, o->lhs, o->ls, NULL))
                     : moe8_convert(o->lhs, t, x, MOE8_DTYPE_F32, (size_t)(M * D), 0);
  for (int r = 0; r < nrot && st == MOE8_OK; r++) {
    o->rhs[r] = malloc((size_t)(E * D * F) * es + 64);
    if (!o->rhs[r]) return MOE8_ERR_NOMEM;
    if (q) {
      o->rs[r] = malloc(sizeof(float) * (size_t)(E * (D / 128 + 1) * F));
      st = moe8_quantize(&ws, w, E, D, F, o->rhs[r], o->rs[r], NULL);
    } else {
      st = moe8_convert(o->rhs[r], t, w, MOE8_DTYPE_F32, (size_t)(E * D * F), 0);
    }
  }
  o->l = (moe8_operand){t, o->lhs, o->ls, q ? ls.gran : MOE8_GRAN_TENSOR, q ? tile : 0};
  o->r = (moe8_operand){t, NULL, NULL, q ? ws.gran : MOE8_GRAN_TENSOR, q ? tile : 0};
  return st;
}

static void free_ops(gmm_ops *o) {
  free(o->lhs); free(o->ls);
  for (int r = 0; r < MAXROT; r++) { free(o->rhs[r]); free(o->rs[r]); }
}

/* bw: one core's read bandwidth; bw2: two threads' (the machine's, here). */
typedef struct peaks { double f32, bf16, i8, bw, bw2; bool have; double amx_bf16, amx_i8; } peaks;

/* The peak of the units that run i8 (else bf16 / FP8) dot products: the
** tiles on the amx table, vpdpbusd / vdpbf16ps elsewhere. */
static double dot_peak(const peaks *pk, bool i8) {
  const bool tiles = moe8_isa_active() == MOE8_ISA_AMX && pk->amx_bf16 > 0;
  return i8 ? (tiles ? pk->amx_i8 : pk->i8) : (tiles ? pk->amx_bf16 : pk->bf16);
}

static peaks measure_peaks(void) {
  peaks p = {0, 0, 0, read_bandwidth(1), max_threads() >= 2 ? read_bandwidth(2) : 0,
             moe8_isa_supported(MOE8_ISA_AVX512_VNNI)};
  if (p.have) {
    p.f32 = peak_gops(PEAK_F32_FMA);
    p.i8 = peak_gops(PEAK_I8_DP);
    if (moe8_isa_supported(MOE8_ISA_AVX512_BF16)) p.bf16 = peak_gops(PEAK_BF16_DP); /* VNNI-only CPUs lack vdpbf16ps */
    if (moe8_isa_supported(MOE8_ISA_AMX)) { p.amx_bf16 = peak_gops(PEAK_AMX_BF16); p.amx_i8 = peak_gops(PEAK_AMX_I8); }
  }
  printf("measured single-core peaks: f32 FMA %.0f GFLOP/s, vdpbf16ps %.0f GFLOP/s, vpdpbusd %.0f GOP/s", p.f32, p.bf16, p.i8);
  if (p.amx_bf16 > 0) printf(", tdpbf16ps %.0f GFLOP/s, tdpbssd %.0f GOP/s", p.amx_bf16, p.amx_i8);
  else printf(" (no AMX: %s)", moe8__amx_unavailable() ? moe8__amx_unavailable() : "not supported");
  printf("; memory read %.1f GB/s", p.bw);
  if (p.bw2 > 0) printf(" (%.1f GB/s with 2 threads)", p.bw2);
  printf("\n");
  return p;
}

static FILE *g_json;
static moe8_isa g_isas[MOE8_ISA_COUNT]; /* --isa: the tables to run, in order */
static int g_nisa;
static const char *g_shapes; /* "prefill", "decode" or NULL (both) */

static bool shape_wanted(const char *name) { return !g_shapes || !strcmp(g_shapes, name); }

static int bench_gmm(const peaks *pk) {
  static const struct { const char *name; int64_t T, E, k, D, F; bool decode; } shapes[] = {
    {"prefill", 2048, 8, 2, 2048, 1408, false}, {"prefill", 1024, 64, 8, 2048, 768, false},
    {"decode", 1, 64, 8, 2048, 768, true}, {"decode", 8, 64, 8, 2048, 768, true}, {"decode", 32, 64, 8, 2048, 768, true},
  };
  const int nth = max_threads() < 2 ? 1 : 2;
  printf("\nmoe8 bench gmm: the gate projection x[T·k, D] . W[E, D, F] per dtype, kernels %s\n", moe8_isa_name(moe8_isa_active()));
  printf("(f8e4m3: 1x128 activation and 128-block weight scales; i8: per-token and per-channel scales;\n"
         " %% peak = of the measured peak x threads; decode GB/s = bytes of the touched experts' weights / time,\n"
         " %% bw = of the read bandwidth measured with the same thread count; moe8 runs rotate 4 copies of the\n"
         " weights so each reads them from memory, and so does oneDNN (OpenBLAS reuses one f32 copy);\n"
         " OPENBLAS_CORETYPE=%s%s)\n", getenv("OPENBLAS_CORETYPE") ? getenv("OPENBLAS_CORETYPE") : "(unset)",
         peers_load()->dnnl_gmm ? "" : peers_load()->why ? "; oneDNN and OpenBLAS skipped: the peers module is missing"
                                                          : "; oneDNN skipped: apt-get install libdnnl-dev and rebuild");
  if (!peers_load()->blas_gmm) printf("(OpenBLAS skipped: %s)\n", peers_load()->why ? peers_load()->why : "apt-get install libopenblas-dev and rebuild");
  /* Native and canonical order side by side for the bf16 and FP8 pairs
  ** (a table with tiles sums in the canonical order either way). */
  const gmm_case cases[] = {{"f32", MOE8_DTYPE_F32, PEAK_F32_FMA, false, 0},
                            {"bf16", MOE8_DTYPE_BF16, PEAK_BF16_DP, false, MOE8_ORDER_NATIVE},
                            {"bf16 canon", MOE8_DTYPE_BF16, PEAK_BF16_DP, false, MOE8_ORDER_CANONICAL},
                            {"f8e4m3", MOE8_DTYPE_F8E4M3, PEAK_BF16_DP, false, MOE8_ORDER_NATIVE},
                            {"f8e4m3 canon", MOE8_DTYPE_F8E4M3, PEAK_BF16_DP, false, MOE8_ORDER_CANONICAL},
                            {"f8e4m3 pk", MOE8_DTYPE_F8E4M3, PEAK_BF16_DP, true, MOE8_ORDER_NATIVE},
                            {"f8 pk canon", MOE8_DTYPE_F8E4M3, PEAK_BF16_DP, true, MOE8_ORDER_CANONICAL},
                            {"i8", MOE8_DTYPE_I8, PEAK_I8_DP, false, 0},
                            {"i8 pk", MOE8_DTYPE_I8, PEAK_I8_DP, true, 0}};
  for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
    if (!shape_wanted(shapes[si].name)) continue;
    const int64_t T = shapes[si].T, E = shapes[si].E, k = shapes[si].k, D = shapes[si].D, F = shapes[si].F, M = T * k;
    int32_t gs[64];
    route_sizes(T, k, E, gs);
    int64_t touched = 0;
    for (int64_t e = 0; e < E; e++) touched += gs[e] > 0;
    float *x = malloc(sizeof(float) * (size_t)(M * D)), *w = malloc(sizeof(float) * (size_t)(E * D * F));
    float *out = malloc(sizeof(float) * (size_t)(M * F));
    if (!x || !w || !out) { fprintf(stderr, "moe8 bench: out of memory\n"); return EXIT_FAIL; }
    fill_rand(x, (size_t)(M * D), 4.0f);
    fill_rand(w, (size_t)(E * D * F), 0.1f);
    const double flop = 2.0 * (double)M * (double)D * (double)F;
    const bool dec = shapes[si].decode;
    const int runs = dec ? 30 : 5;
    printf("\n%s: T=%lld top_k=%lld E=%lld D=%lld F=%lld (%lld experts touched), %.3f GFLOP\n", shapes[si].name, (long long)T,
           (long long)k, (long long)E, (long long)D, (long long)F, (long long)touched, flop / 1e9);
    printf("%-14s %3s %9s %9s %9s %7s %9s %7s %8s\n", "", "thr", "min ms", "median", "GFLOP/s", "% peak", dec ? "GB/s" : "vs BLAS",
           dec ? "% bw" : "", dec ? "vs bf16" : "");
    for (int th = 1; th <= nth; th++) {
      set_threads(th);
      double blas = 0, bf16_ms = 0, native_ms = 0;
      if (peers_load()->blas_gmm) {
        double med = 0;
        blas = peers_load()->blas_gmm(x, w, out, gs, E, D, F, th, runs, &med);
        printf("%-14s %3d %9.3f %9.3f %9.1f %6.0f%% %9s\n", "OpenBLAS f32", th, blas * 1e3, med * 1e3, flop / blas / 1e9,
               pk->have ? 100.0 * flop / blas / 1e9 / (pk->f32 * th) : 0.0, dec ? "" : "1.00x");
        if (g_json)
          fprintf(g_json, "{\"bench\":\"gmm\",\"shape\":\"%s\",\"T\":%lld,\"E\":%lld,\"impl\":\"openblas_f32\",\"threads\":%d,\"min_ms\":%.4f}\n",
                  shapes[si].name, (long long)T, (long long)E, th, blas * 1e3);
      }
      for (int i8 = 0; i8 < 2 && peers_load()->dnnl_gmm; i8++) {
        /* Rotated copies as moe8's rows read (at decode: at least twice the
        ** LLC), so neither reads its weights from the last run's cache. */
        const int nrot = dec ? rotations((double)(touched * D * F) * (i8 ? 1.0 : 2.0)) : 4;
        const double t = peers_load()->dnnl_gmm(i8, gs, E, D, F, runs, nrot);
        if (t <= 0) continue;
        char ratio[16] = "";
        if (!dec && blas > 0) snprintf(ratio, sizeof ratio, "%.2fx", blas / t);
        /* oneDNN runs on the tiles where the CPU has them, as the amx table does. */
        const bool tiles = moe8_isa_supported(MOE8_ISA_AMX) && pk->amx_bf16 > 0;
        const double unit = i8 ? (tiles ? pk->amx_i8 : pk->i8) : (tiles ? pk->amx_bf16 : pk->bf16);
        printf("%-14s %3d %9.3f %9s %9.1f %6.0f%% %9s\n", i8 ? "oneDNN s8" : "oneDNN bf16", th, t * 1e3, "", flop / t / 1e9,
               pk->have && unit > 0 ? 100.0 * flop / t / 1e9 / (unit * th) : 0.0, ratio);
        if (g_json)
          fprintf(g_json, "{\"bench\":\"gmm\",\"shape\":\"%s\",\"T\":%lld,\"E\":%lld,\"impl\":\"onednn_%s\",\"threads\":%d,\"min_ms\":%.4f}\n",
                  shapes[si].name, (long long)T, (long long)E, i8 ? "s8" : "bf16", th, t * 1e3);
      }
      for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        gmm_ops o;
        /* Four copies of the weights, used in turn, so each run reads them
        ** from memory, not from the last run's L3 (decode reads little
        ** else than weights). */
        const int nrot = dec ? rotations((double)(touched * D * F) * (double)moe8_dtype_info(cases[ci].t)->bits / 8.0) : 4;
        moe8_status st = make_ops(&o, cases[ci].t, x, w, M, D, E, F, nrot);
        if (st != MOE8_OK) return cli_report(st, "bench gmm");
        moe8_gmm_args a = {.M = M, .K = D, .N = F, .num_groups = E, .group_sizes = gs, .num_local = E,
                           .lhs = o.l, .rhs = o.r, .out_dtype = MOE8_DTYPE_F32, .out = out, .order = cases[ci].order};
        void *pkd[MAXROT] = {NULL};
        for (int r = 0; r < nrot && cases[ci].packed; r++) {
          if (!(pkd[r] = moe8__alloc_weights(moe8_gmm_packed_size(cases[ci].t, E, D, F)))) return cli_report(MOE8_ERR_NOMEM, "bench gmm");
          if ((st = moe8_gmm_pack_rhs(cases[ci].t, o.rhs[r], E, D, F, pkd[r])) != MOE8_OK) return cli_report(st, "bench gmm");
        }
        double t[64];
        for (int r = 0; r < runs + 1; r++) {
          a.rhs.data = o.rhs[r % nrot];
          a.rhs.scale = o.rs[r % nrot];
          a.rhs_packed = pkd[r % nrot];
          const double t0 = cli_now();
          st = moe8_gmm(&a);
          if (r) t[r - 1] = cli_now() - t0; /* the first run warms up */
          if (st != MOE8_OK) return cli_report(st, "bench gmm");
        }
        qsort(t, (size_t)runs, sizeof t[0], cmp_double);
        const double unit = cases[ci].peak == PEAK_F32_FMA ? pk->f32 : dot_peak(pk, cases[ci].peak != PEAK_BF16_DP);
        const double gf = flop / t[0] / 1e9, pct = pk->have && unit > 0 ? 100.0 * gf / (unit * th) : 0.0;
        char c1[32] = "", c2[32] = "", c3[32] = "", name[32];
        if (cases[ci].order == MOE8_ORDER_NATIVE) native_ms = t[0];
        if (cases[ci].order == MOE8_ORDER_CANONICAL && native_ms > 0) snprintf(c3, sizeof c3, "c %.2fx", t[0] / native_ms);
        if (cases[ci].t == MOE8_DTYPE_BF16 && cases[ci].order == MOE8_ORDER_NATIVE) bf16_ms = t[0];
        else if (dec && bf16_ms > 0 && cases[ci].order != MOE8_ORDER_CANONICAL && (cases[ci].t == MOE8_DTYPE_F8E4M3 || cases[ci].t == MOE8_DTYPE_I8)) snprintf(c3, sizeof c3, "%.2fx", bf16_ms / t[0]);
        const double wbytes = (double)(touched * D * F) * (double)moe8_dtype_info(cases[ci].t)->bits / 8.0;
        if (dec) { snprintf(c1, sizeof c1, "%.1f", wbytes / t[0] / 1e9); snprintf(c2, sizeof c2, "%.0f%%", 100.0 * wbytes / t[0] / 1e9 / (th == 1 || pk->bw2 <= 0 ? pk->bw : pk->bw2)); }
        else if (blas > 0) snprintf(c1, sizeof c1, "%.2fx", blas / t[0]);
        snprintf(name, sizeof name, "moe8 %s", cases[ci].name);
        printf("%-14s %3d %9.3f %9.3f %9.1f %6.0f%% %9s %7s %8s\n", name, th, t[0] * 1e3, t[runs / 2] * 1e3, gf, pct, c1, c2, c3);
        if (g_json)
          fprintf(g_json, "{\"bench\":\"gmm\",\"shape\":\"%s\",\"T\":%lld,\"E\":%lld,\"impl\":\"moe8_%s\",\"threads\":%d,\"min_ms\":%.4f,"
                          "\"median_ms\":%.4f,\"gflops\":%.2f,\"pct_peak\":%.1f,\"weight_gbs\":%.2f,\"order\":\"%s\",\"kernels\":\"%s\"}\n",
                  shapes[si].name, (long long)T, (long long)E, cases[ci].order == MOE8_ORDER_CANONICAL ? (cases[ci].packed ? "f8e4m3_packed_canon" : cases[ci].t == MOE8_DTYPE_BF16 ? "bf16_canon" : "f8e4m3_canon")
                  : cases[ci].packed ? (cases[ci].t == MOE8_DTYPE_I8 ? "i8_packed" : "f8e4m3_packed") : cases[ci].name, th, t[0] * 1e3,
                  t[runs / 2] * 1e3, gf, pct, wbytes / t[0] / 1e9, moe8_order_name(moe8_order_effective(cases[ci].order)),
                  moe8_isa_name(moe8_isa_active()));
        for (int r = 0; r < MAXROT; r++) free(pkd[r]);
        free_ops(&o);
      }
    }
    free(x); free(w); free(out);
  }
  set_threads(max_threads());
  return EXIT_OK;
}

/* ---- moe8 bench layer ----------------------------------------------------- */
/* The PyTorch eager layer (bench/torch_moe.py under Debian's python3);
** milliseconds (min), or a negative number when it is not available. */
static double torch_ms(int64_t T, int64_t E, int64_t K, int64_t D, int64_t F, const char *dt, int threads, int reps) {
  char cmd[1024];
  /* Debian's torch runs its BLAS on OpenBLAS threads, which
  ** torch.set_num_threads does not cap: set every pool's size. */
  snprintf(cmd, sizeof cmd,
           "OMP_NUM_THREADS=%d OPENBLAS_NUM_THREADS=%d MKL_NUM_THREADS=%d /usr/bin/python3 '%s/torch_moe.py' %lld %lld %lld %lld %lld %s %d %d 2>/dev/null",
           threads, threads, threads, MOE8_BENCH_DIR, (long long)T, (long long)E, (long long)K, (long long)D, (long long)F, dt, threads, reps);
  return cli_torch_min_ms(cmd);
}

/* KTransformers' CPU MoE kernels (the optional peer kt-kernel, a PyPI
** package that pins its own torch, so usually in a virtualenv): the
** python MOE8_KT_PYTHON names, else python3 on PATH, when it imports
** kt_kernel; NULL (the peer skipped with a notice) otherwise. */
static const char *kt_python(void) {
  static char py[512];
  static int state = -1;
  if (state < 0) {
    const char *e = getenv("MOE8_KT_PYTHON");
    snprintf(py, sizeof py, "%s", e && *e ? e : "python3");
    char cmd[700];
    snprintf(cmd, sizeof cmd, "'%s' -c 'import kt_kernel' >/dev/null 2>&1", py);
    state = strchr(py, '\'') == NULL && system(cmd) == 0;
  }
  return state ? py : NULL;
}

/* kt-kernel's AMX layer (bench/kt_moe.py; dt "bf16" or "int8"), or -1. */
static double kt_ms(int64_t T, int64_t E, int64_t K, int64_t D, int64_t F, const char *dt, int threads, int reps) {
  const char *py = kt_python();
  if (!py) return -1;
  char cmd[1200];
  snprintf(cmd, sizeof cmd, "OMP_NUM_THREADS=%d '%s' '%s/kt_moe.py' %lld %lld %lld %lld %lld %s %d %d 2>/dev/null", threads, py, MOE8_BENCH_DIR,
           (long long)T, (long long)E, (long long)K, (long long)D, (long long)F, dt, threads, reps);
  return cli_torch_min_ms(cmd);
}

static int bench_layer(FILE *json, const peaks *pk) {
  static const struct { const char *name; int64_t T, E, K, D, F; } shapes[] = {
    {"prefill", 2048, 8, 2, 2048, 1408}, {"decode", 8, 64, 8, 2048, 768},
  };
  static const struct { const char *name, *rule; } modes[] = {
    {"f32", NULL},
    {"f8e4m3", "{\"rules\": [{\"module_path\": \"experts\", \"weight_qtype\": \"float8_e4m3fn\", \"act_qtype\": \"float8_e4m3fn\", \"tile_size\": 128}]}"},
    {"i8", "{\"rules\": [{\"module_path\": \"experts\", \"weight_qtype\": \"int8\", \"act_qtype\": \"int8\"}]}"},
  };
  const int nth = max_threads() < 2 ? 1 : 2;
  const int have_torch = system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") == 0;
  printf("moe8 bench layer: the whole MoE layer (route, dispatch, gmm, SwiGLU, gmm, combine), fused path\n");
  if (!have_torch) printf("(PyTorch peer skipped: apt-get install python3-torch; it runs under /usr/bin/python3)\n");
  if (!kt_python())
    printf("(kt-kernel peer skipped: no python with kt_kernel; pip install kt-kernel in a virtualenv and set MOE8_KT_PYTHON to its python)\n");
  else
    printf("(kt-kernel's runs keep one more core busy than their thread count: its task thread spins through each forward)\n");
  for (size_t si = 0; si < 2; si++) {
    if (!shape_wanted(shapes[si].name)) continue;
    const int64_t T = shapes[si].T, E = shapes[si].E, K = shapes[si].K, D = shapes[si].D, F = shapes[si].F;
    printf("\n%s: T=%lld E=%lld top_k=%lld D=%lld F=%lld\n", shapes[si].name, (long long)T, (long long)E, (long long)K, (long long)D, (long long)F);
    const bool dec = si == 1;
    printf("%-22s %3s %10s %10s %12s %12s %8s %8s\n", "layer", "thr", "min ms", "median ms", "vs torch f32", "vs torch bf16",
           dec ? "% bw" : "% peak", "vs kt");
    /* The three matmuls' operations (prefill: against the dtype's dot
    ** peak x threads), or the bytes of the experts the tokens touch
    ** (decode: against the read bandwidth with the same threads). */
    const double ops = 6.0 * (double)(T * K) * (double)D * (double)F;
    float *x = malloc(sizeof(float) * (size_t)(T * D)), *y = malloc(sizeof(float) * (size_t)(T * D));
    if (!x || !y) return EXIT_FAIL;
    fill_rand(x, (size_t)(T * D), 4.0f);
    /* The experts the tokens touch: every mode's layer has the same
    ** router (init_random with one seed), so route x once. */
    int64_t touched = 0;
    {
      moe8_layer *L = NULL;
      const moe8_layer_config cfg = {E, K, D, F, MOE8_SCORE_SOFTMAX, true, 0, false, 0, 0};
      float *lg = malloc(sizeof(float) * (size_t)(T * E)), *w = malloc(sizeof(float) * (size_t)(T * K));
      int32_t *ids = malloc(sizeof(int32_t) * (size_t)(T * K));
      const moe8_router_config rc = {.num_experts = E, .top_k = K, .score = MOE8_SCORE_SOFTMAX, .norm_topk_prob = true};
      moe8_status st = lg && w && ids ? moe8_layer_create(&cfg, NULL, "experts", &L) : MOE8_ERR_NOMEM;
      if (st == MOE8_OK) st = moe8_layer_init_random(L, 9);
      const float *wr = st == MOE8_OK ? moe8_layer_weight_read(L, MOE8_W_ROUTER, NULL) : NULL;
      if (wr && moe8_router_logits(x, wr, T, D, E, lg) == MOE8_OK && moe8_route(&rc, lg, T, NULL, ids, w) == MOE8_OK) {
        uint64_t used[2] = {0, 0};
        for (int64_t i = 0; i < T * K; i++) used[ids[i] >> 6] |= 1ull << (ids[i] & 63);
        touched = __builtin_popcountll(used[0]) + __builtin_popcountll(used[1]);
      }
      moe8_layer_destroy(L);
      free(lg); free(w); free(ids);
    }
    for (int th = 1; th <= nth; th++) {
      set_threads(th);
      const int reps = si == 0 ? 5 : 30;
      const double tf = have_torch ? torch_ms(T, E, K, D, F, "f32", th, reps) : -1;
      const double tb = have_torch ? torch_ms(T, E, K, D, F, "bf16", th, reps) : -1;
      if (tf > 0) printf("%-22s %3d %10.2f %10s %12s %12s %8s\n", "torch eager f32", th, tf, "", "1.00x", "", "");
      if (tb > 0) printf("%-22s %3d %10.2f %10s %12s %12s %8s\n", "torch eager bf16", th, tb, "", "", "1.00x", "");
      /* kt-kernel's AMX bf16 and int8 layers: the peers of moe8's FP8 and
      ** i8 layers (on a CPU without AMX its own fallback kernels). */
      const double kb = kt_ms(T, E, K, D, F, "bf16", th, reps), ki = kt_ms(T, E, K, D, F, "int8", th, reps);
      if (kb > 0) printf("%-22s %3d %10.2f %10s %12s %12s %8s %8s\n", "kt-kernel bf16", th, kb, "", "", "", "", "1.00x");
      if (ki > 0) printf("%-22s %3d %10.2f %10s %12s %12s %8s %8s\n", "kt-kernel int8", th, ki, "", "", "", "", "1.00x");
      if (json && kb > 0)
        fprintf(json, "{\"bench\": \"layer\", \"shape\": \"%s\", \"mode\": \"kt_bf16\", \"threads\": %d, \"min_ms\": %.4f}\n", shapes[si].name, th, kb);
      if (json && ki > 0)
        fprintf(json, "{\"bench\": \"layer\", \"shape\": \"%s\", \"mode\": \"kt_int8\", \"threads\": %d, \"min_ms\": %.4f}\n", shapes[si].name, th, ki);
      for (size_t mi = 0; mi < 3; mi++) {
        moe8_rules *rules = NULL;
        moe8_layer *L = NULL;
        const moe8_layer_config cfg = {E, K, D, F, MOE8_SCORE_SOFTMAX, true, 0, false, 0, 0};
        moe8_status st = modes[mi].rule ? moe8_rules_parse(modes[mi].rule, strlen(modes[mi].rule), "bench", &rules) : MOE8_OK;
        if (st == MOE8_OK) st = moe8_layer_create(&cfg, rules, "experts", &L);
        if (st == MOE8_OK) st = moe8_layer_init_random(L, 9);
        if (st == MOE8_OK) st = moe8_layer_prepare(L);
        const size_t wsz = moe8_layer_workspace_size(L, T);
        void *ws = NULL;
        if (st == MOE8_OK && posix_memalign(&ws, 64, wsz) != 0) st = MOE8_ERR_NOMEM;
        double t[64];
        for (int r = 0; r < reps + 1 && st == MOE8_OK; r++) {
          const double t0 = cli_now();
          st = moe8_layer_forward_fused(L, x, T, y, ws, wsz);
          if (r > 0) t[r - 1] = cli_now() - t0; /* the first run warms up */
        }
        free(ws);
        moe8_layer_destroy(L);
        moe8_rules_destroy(rules);
        if (st != MOE8_OK) return cli_report(st, "bench layer");
        qsort(t, (size_t)reps, sizeof t[0], cmp_double);
        char rf[32] = "-", rb[32] = "-", rk[32] = "", name[64];
        const double kt = mi == 1 ? kb : mi == 2 ? ki : -1;
        if (kt > 0) snprintf(rk, sizeof rk, "%.2fx", kt / (t[0] * 1e3));
        if (tf > 0) snprintf(rf, sizeof rf, "%.2fx", tf / (t[0] * 1e3));
        if (tb > 0) snprintf(rb, sizeof rb, "%.2fx", tb / (t[0] * 1e3));
        snprintf(name, sizeof name, "moe8 %s", modes[mi].name);
        /* i8 and FP8 on their dot units (dot_peak), f32 on FMAs; FP8 and i8
        ** weights are a byte an element, f32 four. */
        const double unit = mi == 0 ? pk->f32 : dot_peak(pk, mi == 2);
        const double esz = mi == 0 ? 4.0 : 1.0;
        const double bw = th == 1 || pk->bw2 <= 0 ? pk->bw : pk->bw2;
        char pct[16] = "-";
        if (!dec && unit > 0) snprintf(pct, sizeof pct, "%.0f%%", 100.0 * ops / t[0] / 1e9 / (unit * th));
        if (dec && bw > 0 && touched > 0) snprintf(pct, sizeof pct, "%.0f%%", 100.0 * (double)touched * 3.0 * (double)(D * F) * esz / t[0] / 1e9 / bw);
        printf("%-22s %3d %10.2f %10.2f %12s %12s %8s %8s\n", name, th, t[0] * 1e3, t[reps / 2] * 1e3, rf, rb, pct, rk);
        if (json)
          fprintf(json, "{\"bench\": \"layer\", \"shape\": \"%s\", \"mode\": \"%s\", \"threads\": %d, \"min_ms\": %.4f, \"median_ms\": %.4f, "
                        "\"torch_f32_ms\": %.4f, \"torch_bf16_ms\": %.4f, \"kt_ms\": %.4f}\n",
                  shapes[si].name, modes[mi].name, th, t[0] * 1e3, t[reps / 2] * 1e3, tf, tb, kt);
      }
    }
    free(x); free(y);
  }
  set_threads(max_threads());
  return EXIT_OK;
}

/* ---- moe8 bench ep ------------------------------------------------------ */
/* Under mpirun: the real expert-parallel layer, both modes, forward and
** backward, on E = 64 experts, top-8, D = 2048, F = 512, 64 tokens a rank,
** FP8 1x128 activations quantized before the exchange; uniform routing
** (a random router) and skewed routing (a selection bias sends most
** tokens to the experts of ranks 0 and 1).  Per rank: bytes sent and
** received, time (best of 5, slowest rank), and the dispatch rows of the
** all-to-all mode against the formula evaluated on the routing used. */
enum { EP_E = 64, EP_K = 8, EP_D = 2048, EP_F = 512, EP_TL = 64 };

static int bench_ep_worker(const char *transport) {
  moe8_comm *c;
  moe8_status st = cli_comm_open(&c);
  if (st != MOE8_OK) return cli_report(st, "bench ep");
  const int P = moe8_comm_size(c), r = moe8_comm_rank(c);
  const int64_t E = EP_E, K = EP_K, D = EP_D, F = EP_F, Tl = EP_TL;
  const char *rj = "{\"rules\": [{\"module_path\": \".*\", \"weight_qtype\": \"float8_e4m3fn\", \"act_qtype\": \"float8_e4m3fn\","
                   " \"tile_size\": 128}], \"quantize_before_ep_all_gather\": true}";
  moe8_rules *rules = NULL;
  if ((st = moe8_rules_parse(rj, strlen(rj), "bench", &rules)) != MOE8_OK) { cli_comm_close(c); return cli_report(st, "bench ep"); }
  float *x = malloc(sizeof(float) * (size_t)(Tl * D)), *y = malloc(sizeof(float) * (size_t)(Tl * D)), *dy = malloc(sizeof(float) * (size_t)(Tl * D));
  float *dx = malloc(sizeof(float) * (size_t)(Tl * D)), *lg = malloc(sizeof(float) * (size_t)(Tl * E)), *wt = malloc(sizeof(float) * (size_t)(Tl * K));
  int32_t *ids = malloc(sizeof(int32_t) * (size_t)(Tl * K));
  if (!x || !y || !dy || !dx || !lg || !wt || !ids) { fprintf(stderr, "moe8 bench ep: out of memory\n"); cli_comm_close(c); return EXIT_FAIL; }
  for (int64_t i = 0; i < Tl * D; i++) {
    x[i] = (float)(((uint64_t)(i + r * Tl * D) * 2654435761u) % 2001) * 0.001f - 1.0f;
    dy[i] = (float)(((uint64_t)(i * 7 + r) * 40503u) % 1001) * 0.001f - 0.5f;
  }
  if (r == 0) {
    printf("\nP=%d over %s: E=%d top-%d D=%d F=%d, %d tokens a rank, FP8 1x128 before the exchange (best of 5, slowest rank)\n", P,
           transport, EP_E, EP_K, EP_D, EP_F, EP_TL);
    printf("  %-8s %-11s %12s %12s %12s %12s %9s %9s  %s\n", "routing", "mode", "fwd sent", "fwd recv", "bwd sent", "bwd recv", "fwd ms",
           "bwd ms", "dispatch rows recv: measured / formula");
  }
  int rc = EXIT_OK;
  for (int skew = 0; skew < 2 && st == MOE8_OK; skew++) {
    const moe8_layer_config cfg = {E, K, D, F, MOE8_SCORE_SOFTMAX, true, 0, skew != 0, 0, 0};
    moe8_layer *L = NULL;
    if ((st = moe8_layer_create(&cfg, rules, "model.layers.0.mlp.experts", &L)) != MOE8_OK ||
        (st = moe8_layer_init_random(L, 77)) != MOE8_OK)
      break;
    if (skew) { /* most tokens to ranks 0 and 1 */
      float *bias = moe8_layer_weight(L, MOE8_W_BIAS, NULL);
      for (int64_t e = 0; e < E; e++) bias[e] = e < 2 * (E / P) && e < E / 2 ? 0.5f : 0.0f;
    }
    /* the formula on this routing: rows each rank receives from the others */
    const moe8_router_config rcfg = {E, K, cfg.score, true, 0, skew ? moe8_layer_weight_read(L, MOE8_W_BIAS, NULL) : NULL};
    double *hits = calloc((size_t)P, sizeof(double));
    moe8_router_logits(x, moe8_layer_weight_read(L, MOE8_W_ROUTER, NULL), Tl, D, E, lg);
    moe8_route(&rcfg, lg, Tl, NULL, ids, wt);
    for (int64_t t = 0; t < Tl; t++)
      for (int q = 0; q < P; q++) {
        bool hit = false;
        for (int64_t j = 0; j < K; j++) hit |= ids[t * K + j] / (E / P) == q;
        if (hit && q != r) hits[q] += 1.0;
      }
    cli_allreduce_sum(c, hits, P);
    for (int m = 0; m < 2 && st == MOE8_OK; m++) {
      const moe8_ep_options o = {sizeof o, m ? MOE8_EP_ALLTOALL : MOE8_EP_RING};
      moe8_ep *ep = NULL;
      if ((st = moe8_ep_create_ex(L, c, &o, &ep)) != MOE8_OK) break;
      const moe8_layer_grads g = {.dx = dx};
      double bf = 1e30, bb = 1e30;
      for (int rep = 0; rep < 5 && st == MOE8_OK; rep++) {
        double t0 = cli_now();
        st = moe8_ep_forward(ep, x, Tl, y, NULL);
        const double tf = cli_allreduce_max(c, cli_now() - t0);
        t0 = cli_now();
        if (st == MOE8_OK) st = moe8_ep_backward(ep, x, Tl, dy, &g);
        const double tb = cli_allreduce_max(c, cli_now() - t0);
        if (tf < bf) bf = tf;
        if (tb < bb) bb = tb;
      }
      const moe8_ep_stats *s = moe8_ep_get_stats(ep);
      const double fs = cli_allreduce_max(c, (double)s->fwd_sent_bytes), fr = cli_allreduce_max(c, (double)s->fwd_recv_bytes);
      const double bs = cli_allreduce_max(c, (double)s->bwd_sent_bytes), br = cli_allreduce_max(c, (double)s->bwd_recv_bytes);
      const double mismatch = cli_allreduce_max(c, m && (double)s->dispatch_rows_recv != hits[r] ? 1.0 : 0.0);
      if (mismatch) rc = EXIT_FAIL;
      if (r == 0) {
        char disp[96] = "-";
        if (m) snprintf(disp, sizeof disp, "%llu / %.0f (rank 0)%s", (unsigned long long)s->dispatch_rows_recv, hits[0],
                        mismatch ? "  MISMATCH on some rank" : "  equal on every rank");
        printf("  %-8s %-11s %10.2f MB %10.2f MB %10.2f MB %10.2f MB %9.2f %9.2f  %s\n", skew ? "skewed" : "uniform", m ? "all-to-all" : "ring",
               fs / 1e6, fr / 1e6, bs / 1e6, br / 1e6, bf * 1e3, bb * 1e3, disp);
      }
      moe8_ep_destroy(ep);
    }
    free(hits);
    moe8_layer_destroy(L);
  }
  if (st != MOE8_OK) rc = cli_report(st, "bench ep");
  if (r == 0) printf("  (bytes: the largest over the ranks, to and from other ranks only)\n");
  moe8_rules_destroy(rules);
  free(x); free(y); free(dy); free(dx); free(lg); free(wt); free(ids);
  cli_comm_close(c);
  return rc;
}

/* log C(n, k) */
static double lchoose(double n, double k) { return lgamma(n + 1) - lgamma(k + 1) - lgamma(n - k + 1); }

static int bench_ep(void) {
  const char *tr = getenv("MOE8_BENCH_EP_TRANSPORT");
  if (cli_under_mpirun()) return bench_ep_worker(tr ? tr : "?");
  /* The formula: forward token rows a rank receives from the others, per
  ** token of a shard, with uniformly random distinct top-k experts. */
  printf("moe8 bench ep: the ring of experts and the all-to-all dispatch\n\n"
         "Forward token rows a rank receives from the others, per local token (T_local tokens a rank, uniform routing):\n"
         "  ring: P - 1;  all-to-all: (P - 1) * (1 - C(E - E/P, k) / C(E, k))  [a token reaches a rank when one of its k\n"
         "  distinct experts is there]; bytes per row at D = 7168, FP8 1x128 before: ring %d (codes, scales, ids, weights,\n"
         "  scores of E = 256), all-to-all %d (codes, scales, ids); each expert output row returns as D + 1 floats.\n",
         7168 + 4 * 56 + 4 * (2 * 8 + 256), 7168 + 4 * 56 + 4 * 8);
  printf("  %6s %6s %4s %12s %14s %8s\n", "P", "E", "k", "ring rows", "all-to-all rows", "ratio");
  static const int Ps[] = {2, 4, 8, 16, 32, 64, 128, 256};
  for (size_t i = 0; i < sizeof Ps / sizeof Ps[0]; i++)
    for (int ei = 0; ei < 2; ei++) {
      const double P = Ps[i], E = ei ? 256 : 64, k = 8;
      if (P > E) continue;
      const double a2a = (P - 1) * (1 - exp(lchoose(E - E / P, k) - lchoose(E, k)));
      printf("  %6.0f %6.0f %4.0f %12.2f %14.2f %8.3f\n", P, E, k, P - 1, a2a, a2a / (P - 1));
    }
  if (!moe8_has_mpi()) {
    printf("moe8 bench ep: this build has no MPI (apt-get install libopenmpi-dev openmpi-bin, then rebuild)\n");
    return EXIT_OK;
  }
  if (system("command -v mpirun >/dev/null 2>&1") != 0) {
    printf("moe8 bench ep: mpirun not found (apt-get install openmpi-bin)\n");
    return EXIT_OK;
  }
  printf("\nMeasured (ranks on one machine, oversubscribed where P exceeds the cores: times show the copies and the\n"
         "scheduling, bytes are what would cross a network):\n");
  int rc = EXIT_OK;
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return EXIT_FAIL;
  self[n] = '\0';
  for (int P = 2; P <= 8; P *= 2)
    for (int t = 0; t < 2; t++) {
      char cmd[4400];
      snprintf(cmd, sizeof cmd, "OMP_NUM_THREADS=1 MOE8_BENCH_EP_TRANSPORT=%s mpirun %s--oversubscribe --mca btl %s -n %d '%s' bench ep",
               t ? "tcp" : "shared-memory", geteuid() == 0 ? "--allow-run-as-root " : "", t ? "tcp,self" : "vader,self", P, self);
      fflush(stdout);
      if (system(cmd) != 0) { fprintf(stderr, "moe8 bench ep: '%s' failed\n", cmd); rc = EXIT_FAIL; }
    }
  return rc;
}

/* ---- moe8 bench mxfp4 -------------------------------------------------------- */
/* Resident and peak-resident bytes of the process (/proc/self/status). */
static double status_kb(const char *key) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  double v = -1;
  const size_t n = strlen(key);
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, key, n)) { v = atof(line + n + 1); break; }
  if (f) fclose(f);
  return v;
}


/* One pass of the read-bandwidth probe (read_bandwidth's loop) over a
** buffer far larger than the caches, on the threads the layer uses. */
static double probe_bw(const unsigned char *buf, size_t n, int nth) {
  int found = 0;
  const double t0 = cli_now();
  #pragma omp parallel for num_threads(nth) schedule(static) reduction(+ : found)
  for (int t = 0; t < nth; t++) found += memchr(buf + n / (size_t)nth * (size_t)t, 1, n / (size_t)nth) != NULL;
  const double t = cli_now() - t0;
  return found ? 0 : (double)n / t / 1e9;
}

/* Decode T = 1, 2, 4, 8 of a layer, each forward on other tokens (so other
** experts): the fastest of reps, and the expert bytes it read.  A probe
** pass runs before every third forward (probe, nth threads): bwm[i] is the
** best read bandwidth of the probes beside T's forwards, so the ratio
** compares the two in the same minutes (this machine's bandwidth changes
** from one second to the next). */
static void decode_times(moe8_layer *L, int64_t D, int64_t E, int64_t K, double bytes_per_expert, int reps, double *ms, double *gbs, int64_t *Ts,
                         int nT, const unsigned char *probe, size_t probe_n, int nth, double *bwm) {
  float *x = malloc(sizeof(float) * (size_t)(8 * D * reps)), *y = malloc(sizeof(float) * (size_t)(8 * D));
  const size_t wsz = moe8_layer_workspace_size(L, 8);
  void *ws = NULL;
  if (!x || !y || posix_memalign(&ws, 64, wsz) != 0) { free(x); free(y); return; }
  for (int64_t i = 0; i < 8 * D * reps; i++) x[i] = (float)((int64_t)(rnd() % 2001) - 1000) * 1e-3f;
  const float *wr = moe8_layer_weight_read(L, MOE8_W_ROUTER, NULL);
  for (int ti = 0; ti < nT; ti++) {
    const int64_t T = Ts[ti];
    double best = 1e30, best_bytes = 0;
    bwm[ti] = 0;
    for (int r = 0; r < reps; r++) {
      if (probe && r % 3 == 0) {
        const double b = probe_bw(probe, probe_n, nth);
        if (b > bwm[ti]) bwm[ti] = b;
      }
      const float *xr = x + (size_t)r * 8 * D;
      const double t0 = cli_now();
      if (moe8_layer_forward_fused(L, xr, T, y, ws, wsz) != MOE8_OK) break;
      const double dt = cli_now() - t0;
      /* the experts this forward touched: top-K of the router logits */
      bool hit[MOE8_MAX_EXPERTS] = {false};
      int64_t nhit = 0;
      for (int64_t t = 0; t < T; t++) {
        float lg[MOE8_MAX_EXPERTS];
        for (int64_t e = 0; e < E; e++) {
          float a = 0;
          for (int64_t d = 0; d < D; d++) a += xr[t * D + d] * wr[d * E + e];
          lg[e] = a;
        }
        for (int64_t j = 0; j < K; j++) {
          int64_t b = -1;
          for (int64_t e = 0; e < E; e++)
            if (lg[e] > -1e30f && (b < 0 || lg[e] > lg[b])) b = e;
          lg[b] = -1e38f;
          if (!hit[b]) { hit[b] = true; nhit++; }
        }
      }
      if (dt < best) { best = dt; best_bytes = (double)nhit * bytes_per_expert; }
    }
    ms[ti] = best * 1e3;
    gbs[ti] = best_bytes / best / 1e9;
  }
  free(x); free(y); free(ws);
}

/* One inference load of the model in dir under rules_json (NULL: none),
** its time, resident and peak-resident bytes (VmHWM reset first by
** clear_refs 5) printed against the file's size. */
static moe8_status load_measured(const char *dir, const char *rules_json, const char *what, double file_mb, moe8_layer **out) {
  FILE *cr = fopen("/proc/self/clear_refs", "w");
  if (cr) { fputs("5", cr); fclose(cr); }
  const double rss0 = status_kb("VmRSS:") * 1e3, t0 = cli_now();
  moe8_rules *rules = NULL;
  moe8_model *m = NULL;
  const moe8_load_options o = {sizeof o, MOE8_LOAD_INFERENCE, NULL, NULL};
  moe8_status st = rules_json ? moe8_rules_parse(rules_json, strlen(rules_json), "inline", &rules) : MOE8_OK;
  if (st == MOE8_OK) st = moe8_model_open(dir, &m);
  if (st == MOE8_OK) st = moe8_model_load_layer_ex(m, 0, rules, &o, out);
  moe8_model_close(m);
  moe8_rules_destroy(rules);
  const double tl = cli_now() - t0;
  if (st != MOE8_OK) return st;
  const double rss = status_kb("VmRSS:") * 1e3 - rss0, hwm = status_kb("VmHWM:") * 1e3 - rss0;
  printf("load, %s: %.2f s; resident after it +%.1f MB (%.3fx the file), peak during it +%.1f MB (%.3fx)\n%s\n", what, tl, rss / 1e6,
         rss / 1e6 / file_mb, hwm / 1e6, hwm / 1e6 / file_mb, moe8_layer_describe(*out));
  if (g_json)
    fprintf(g_json, "{\"bench\":\"mxfp4_load\",\"layout\":\"%s\",\"file_mb\":%.1f,\"rss_mb\":%.1f,\"peak_mb\":%.1f,\"load_s\":%.2f}\n",
            rules_json ? "int8" : "f32", file_mb, rss / 1e6, hwm / 1e6, tl);
  return MOE8_OK;
}

static int bench_mxfp4(const peaks *pk) {
  const int64_t E = 32, K = 4, D = 2880, F = 2880;
  char dir[64] = "/tmp/moe8-bench-mxfp4-XXXXXX";
  if (!mkdtemp(dir)) { fprintf(stderr, "moe8 bench mxfp4: cannot create a temporary directory\n"); return EXIT_FAIL; }
  printf("\nmoe8 bench mxfp4: a GPT-OSS-shaped layer (E=%lld, top_k=%lld, D=%lld, F=%lld, MXFP4 experts), loaded for inference\n",
         (long long)E, (long long)K, (long long)D, (long long)F);
  const size_t ngu = (size_t)(E * 2 * F * (D / 32)), ndn = (size_t)(E * D * (F / 32));
  uint8_t *gb = malloc(ngu * 16), *gs = malloc(ngu), *db = malloc(ndn * 16), *ds = malloc(ndn);
  float *rw = malloc(sizeof(float) * (size_t)(E * D)), *rb = calloc((size_t)E, 4), *gub = calloc((size_t)(E * 2 * F), 4),
        *dnb = calloc((size_t)(E * D), 4);
  int rc = EXIT_OK;
  if (!gb || !gs || !db || !ds || !rw || !rb || !gub || !dnb) { rc = EXIT_FAIL; goto done; }
  for (size_t i = 0; i < ngu * 16; i += 8) { const uint64_t r = rnd(); memcpy(gb + i, &r, 8); }
  for (size_t i = 0; i < ndn * 16; i += 8) { const uint64_t r = rnd(); memcpy(db + i, &r, 8); }
  for (size_t i = 0; i < ngu; i++) gs[i] = (uint8_t)(118 + rnd() % 4);
  for (size_t i = 0; i < ndn; i++) ds[i] = (uint8_t)(118 + rnd() % 4);
  for (int64_t i = 0; i < E * D; i++) rw[i] = (float)((int64_t)(rnd() % 2001) - 1000) * 1e-4f;
  char path[128];
  snprintf(path, sizeof path, "%s/config.json", dir);
  FILE *f = fopen(path, "w");
  if (!f) { rc = EXIT_FAIL; goto done; }
  fprintf(f, "{\"model_type\": \"gpt_oss\", \"num_local_experts\": %lld, \"num_experts_per_tok\": %lld, \"hidden_size\": %lld, "
             "\"intermediate_size\": %lld, \"num_hidden_layers\": 1, \"quantization_config\": {\"quant_method\": \"mxfp4\"}}\n",
          (long long)E, (long long)K, (long long)D, (long long)F);
  fclose(f);
  {
    const moe8_tensor_view t[8] = {
      {"model.layers.0.mlp.router.weight", MOE8_FDT_F32, 2, {E, D}, rw, sizeof(float) * (size_t)(E * D), 0},
      {"model.layers.0.mlp.router.bias", MOE8_FDT_F32, 1, {E}, rb, sizeof(float) * (size_t)E, 0},
      {"model.layers.0.mlp.experts.gate_up_proj_blocks", MOE8_FDT_U8, 4, {E, 2 * F, D / 32, 16}, gb, ngu * 16, 0},
      {"model.layers.0.mlp.experts.gate_up_proj_scales", MOE8_FDT_U8, 3, {E, 2 * F, D / 32}, gs, ngu, 0},
      {"model.layers.0.mlp.experts.gate_up_proj_bias", MOE8_FDT_F32, 2, {E, 2 * F}, gub, sizeof(float) * (size_t)(E * 2 * F), 0},
      {"model.layers.0.mlp.experts.down_proj_blocks", MOE8_FDT_U8, 4, {E, D, F / 32, 16}, db, ndn * 16, 0},
      {"model.layers.0.mlp.experts.down_proj_scales", MOE8_FDT_U8, 3, {E, D, F / 32}, ds, ndn, 0},
      {"model.layers.0.mlp.experts.down_proj_bias", MOE8_FDT_F32, 2, {E, D}, dnb, sizeof(float) * (size_t)(E * D), 0},
    };
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (moe8_st_write(path, t, 8) != MOE8_OK) { rc = cli_report(moe8_st_write(path, t, 8), "bench mxfp4"); goto done; }
  }
  free(gb); free(gs); free(db); free(ds);
  gb = gs = db = ds = NULL;
  {
    struct stat sb;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    const double file_mb = stat(path, &sb) == 0 ? (double)sb.st_size / 1e6 : 0;
    printf("file %.1f MB\n", file_mb);
    moe8_layer *L = NULL, *Li = NULL;
    /* the file as it is (f32 activations), then under an int8-activation
    ** rule (1 x 32: one scale per MXFP4 block), the mx4_rows_i8 kernels */
    moe8_status st = load_measured(dir, NULL, "f32 activations (row layout)", file_mb, &L);
    if (st == MOE8_OK)
      st = load_measured(dir, "{\"rules\": [{\"module_path\": \".*\", \"act_qtype\": \"int8\", \"tile_size\": 32}]}",
                         "int8 activations (column-group layout)", file_mb, &Li);
    if (st != MOE8_OK) { rc = cli_report(st, "bench mxfp4"); moe8_layer_destroy(L); goto done; }
    const double per_expert = (double)(2 * F * D + D * F) * (16.0 + 1.0) / 32.0; /* blocks + scales */
    int64_t Ts[4] = {1, 2, 4, 8};
    /* An FP8 layer of the same D, F (8 experts, packed at prepare) for the ratio in the same run. */
    moe8_layer_config fc = {.num_experts = 8, .top_k = K, .hidden = D, .ffn = F, .norm_topk_prob = true};
    const char *rj = "{\"rules\": [{\"module_path\": \".*\", \"weight_qtype\": \"float8_e4m3fn\", \"act_qtype\": \"float8_e4m3fn\", \"tile_size\": 128}]}";
    moe8_rules *rules = NULL;
    moe8_layer *L8 = NULL;
    st = moe8_rules_parse(rj, strlen(rj), "inline", &rules);
    if (st == MOE8_OK) st = moe8_layer_create(&fc, rules, "experts", &L8);
    if (st == MOE8_OK) st = moe8_layer_init_random(L8, 3);
    if (st == MOE8_OK) st = moe8_layer_prepare(L8);
    const double per8 = (double)(2 * F * D + D * F) * (1.0 + 4.0 / 128.0);
    printf("decode   thr | mxfp4, x int8 1x32          | mxfp4, x f32                | f8e4m3, x f8e4m3 1x128 (8 exp.) |\n"
           "             |   ms    GB/s  %% bw  (bw)   |   ms    GB/s  %% bw  (bw)   |   ms    GB/s  %% bw  (bw)   | int8 / f8 GB/s\n");
    /* the probe: 256 MiB, 8x this machine's last-level cache and more */
    const size_t probe_n = (size_t)256 << 20;
    unsigned char *probe = moe8__alloc_weights(probe_n);
    if (probe) memset(probe, 2, probe_n);
    for (int th = 1; th <= max_threads() && th <= 2; th++) {
      set_threads(th);
      double msi[4] = {0}, gbsi[4] = {0}, ms[4] = {0}, gbs[4] = {0}, ms8[4] = {0}, gbs8[4] = {0}, bwi[4] = {0}, bwf[4] = {0}, bw8[4] = {0};
      decode_times(Li, D, E, K, per_expert, 12, msi, gbsi, Ts, 4, probe, probe_n, th, bwi);
      decode_times(L, D, E, K, per_expert, 12, ms, gbs, Ts, 4, probe, probe_n, th, bwf);
      if (st == MOE8_OK) decode_times(L8, D, 8, K, per8, 12, ms8, gbs8, Ts, 4, probe, probe_n, th, bw8);
      for (int i = 0; i < 4; i++) {
        const double pi = bwi[i] > 0 ? 100 * gbsi[i] / bwi[i] : 0, pf = bwf[i] > 0 ? 100 * gbs[i] / bwf[i] : 0,
                     p8 = bw8[i] > 0 ? 100 * gbs8[i] / bw8[i] : 0;
        printf("T=%-5lld %3d | %6.3f %6.1f %5.0f%% %5.1f | %6.3f %6.1f %5.0f%% %5.1f | %6.3f %6.1f %5.0f%% %5.1f | %.2fx\n", (long long)Ts[i], th,
               msi[i], gbsi[i], pi, bwi[i], ms[i], gbs[i], pf, bwf[i], ms8[i], gbs8[i], p8, bw8[i], gbs8[i] > 0 ? gbsi[i] / gbs8[i] : 0);
        if (g_json)
          fprintf(g_json, "{\"bench\":\"mxfp4_decode\",\"T\":%lld,\"threads\":%d,\"mxfp4_i8_ms\":%.4f,\"mxfp4_i8_gbs\":%.2f,\"pct_bw_i8\":%.1f,"
                          "\"bw_i8\":%.2f,\"mxfp4_ms\":%.4f,\"mxfp4_gbs\":%.2f,\"pct_bw\":%.1f,\"bw\":%.2f,\"f8_ms\":%.4f,\"f8_gbs\":%.2f,"
                          "\"f8_pct_bw\":%.1f,\"bw_f8\":%.2f}\n",
                  (long long)Ts[i], th, msi[i], gbsi[i], pi, bwi[i], ms[i], gbs[i], pf, bwf[i], ms8[i], gbs8[i], p8, bw8[i]);
      }
    }
    free(probe);
    set_threads(max_threads());
    printf("(GB/s: the bytes of the experts each forward touched / its time; %% bw: of the read bandwidth (bw, GB/s) the probe measured\n"
           " between the same forwards, with the same threads: this machine's bandwidth can change from one second to the next)\n");
    /* Prefill: T = 256 tokens (1024 rows, 32 an expert), all threads: the
    ** experts' multiply-adds a second against the measured vpdpbusd and
    ** FMA peaks (one core's, times the threads). */
    {
      const int64_t T = 256;
      float *x = malloc(sizeof(float) * (size_t)(T * D)), *y = malloc(sizeof(float) * (size_t)(T * D));
      moe8_layer *Ls[3] = {Li, L, L8};
      double best[3] = {0, 0, 0};
      for (int64_t i = 0; x && i < T * D; i++) x[i] = (float)((int64_t)(rnd() % 2001) - 1000) * 1e-3f;
      for (int li = 0; li < 3 && x && y && Ls[li]; li++) {
        const size_t wsz = moe8_layer_workspace_size(Ls[li], T);
        void *ws = NULL;
        if (posix_memalign(&ws, 64, wsz) != 0) break;
        best[li] = 1e30;
        for (int r = 0; r < 3; r++) {
          const double tp0 = cli_now();
          if (moe8_layer_forward_fused(Ls[li], x, T, y, ws, wsz) != MOE8_OK) break;
          const double dt = cli_now() - tp0;
          if (dt < best[li]) best[li] = dt;
        }
        free(ws);
      }
      const double macs = (double)(T * K) * (double)(2 * F * D + D * F), nth = max_threads();
      printf("prefill T=%lld, %d threads: mxfp4 x int8 %.1f ms (%.0f GOP/s, %.0f%% of vpdpbusd peak) | mxfp4 x f32 %.1f ms (%.0f GFLOP/s, %.0f%% of "
             "FMA peak) | f8e4m3 %.1f ms\n", (long long)T, (int)nth, best[0] * 1e3, 2 * macs / best[0] / 1e9,
             pk->i8 > 0 ? 100 * 2 * macs / best[0] / 1e9 / (pk->i8 * nth) : 0, best[1] * 1e3, 2 * macs / best[1] / 1e9,
             pk->f32 > 0 ? 100 * 2 * macs / best[1] / 1e9 / (pk->f32 * nth) : 0, best[2] * 1e3);
      if (g_json)
        fprintf(g_json, "{\"bench\":\"mxfp4_prefill\",\"T\":%lld,\"threads\":%d,\"mxfp4_i8_ms\":%.3f,\"mxfp4_ms\":%.3f,\"f8_ms\":%.3f}\n",
                (long long)T, (int)nth, best[0] * 1e3, best[1] * 1e3, best[2] * 1e3);
      free(x); free(y);
    }
    moe8_layer_destroy(L8);
    moe8_rules_destroy(rules);
    moe8_layer_destroy(Li);
    moe8_layer_destroy(L);
  }
done:
  free(gb); free(gs); free(db); free(ds); free(rw); free(rb); free(gub); free(dnb);
  {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "moe8 bench: could not remove %s\n", dir);
  }
  return rc;
}

/* The CPU's name (/proc/cpuinfo "model name"), for the report and the chart. */
static void cpu_name(char *buf, size_t cap) {
  snprintf(buf, cap, "unknown CPU");
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f) return;
  char line[512];
  while (fgets(line, sizeof line, f))
    if (!strncmp(line, "model name", 10)) {
      const char *v = strchr(line, ':');
      if (v) {
        v++;
        while (*v == ' ' || *v == '\t') v++;
        snprintf(buf, cap, "%s", v);
        buf[strcspn(buf, "\n\"\\")] = 0;
      }
      break;
    }
  fclose(f);
}

int cmd_bench(int argc, char **argv) {
  const char *json = NULL, *plot = NULL;
  char json_tmp[64] = "";
  int want[6] = {0}, any = 0; /* quant gmm layer ep peaks mxfp4 */
  static const char *const names[6] = {"quant", "gmm", "layer", "ep", "peaks", "mxfp4"};
  for (int i = 1; i < argc; i++) {
    if (cli_is_help(argv[i])) {
      printf("usage: moe8 bench [--json FILE] [--plot PNG] [--shapes prefill|decode] [--isa T1,T2,...] [quant] [gmm] [layer] [ep] [mxfp4]\n"
             "       (no section: quant, gmm, layer and ep)\n\n"
             "  measures the machine's peaks first (f32 FMA, vdpbf16ps, vpdpbusd, memory read bandwidth), then:\n"
             "  quant   f32 -> f8e4m3 per-token 1x128 quantizer throughput on 64 MiB vs memory bandwidth\n"
             "  gmm     grouped matmul per dtype (f32, bf16, f8e4m3, i8) at prefill shapes (T=2048 E=8 k=2\n"
             "          D=2048 F=1408; T=1024 E=64 k=8 D=2048 F=768) and decode shapes (T=1, 8, 32, E=64 k=8),\n"
             "          1 and 2 threads, against a per-expert OpenBLAS sgemm loop and oneDNN bf16/s8 matmuls\n"
             "  layer   the whole layer (f32, f8e4m3, i8) against PyTorch eager f32 and bf16 (python3-torch)\n"
             "  ep      expert parallelism, ring vs all-to-all: bytes and time of the real forward and backward,\n"
             "          P = 2, 4, 8, shared memory and TCP; the bytes formula up to P = 256\n"
             "  mxfp4   a GPT-OSS-shaped layer (E=32, k=4, D=F=2880) with MXFP4 experts: load memory against its file,\n"
             "          decode T=1..8 GB/s against the read bandwidth and an FP8 layer of the same width\n"
             "  --json FILE  one JSON object per measurement, written to FILE\n"
             "  --plot PNG   the chart of the run's ratios (scripts/plot_bench.py, python3-matplotlib)\n"
             "  --shapes S   only the prefill or only the decode shapes of gmm and layer\n"
             "  --isa LIST   gmm and layer once per kernel table (ref, avx512, avx512_bf16, avx512_vnni, amx), side by side;\n"
             "               bf16 and FP8 rows are shown in both summation orders (\"c 1.9x\": canonical / native time)\n"
             "peers that are not installed are skipped with a notice.\nexit codes: 0 ok, 1 failure, 2 usage\n");
      return EXIT_OK;
    }
    if (!strcmp(argv[i], "--json") && i + 1 < argc) { json = argv[++i]; continue; }
    if (!strcmp(argv[i], "--plot") && i + 1 < argc) { plot = argv[++i]; continue; }
    if (!strcmp(argv[i], "--isa") && i + 1 < argc) {
      /* The gmm and layer sections once per named kernel table, side by side. */
      char buf[256];
      snprintf(buf, sizeof buf, "%s", argv[++i]);
      for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        int f = -1;
        for (int q = 0; q < MOE8_ISA_COUNT; q++)
          if (!strcmp(tok, moe8_isa_name((moe8_isa)q))) f = q;
        if (f < 0 || !moe8_isa_supported((moe8_isa)f)) {
          fprintf(stderr, "moe8 bench: --isa %s is not a kernel table this build and CPU support\n", tok);
          return EXIT_USAGE;
        }
        if (g_nisa < MOE8_ISA_COUNT) g_isas[g_nisa++] = (moe8_isa)f;
      }
      continue;
    }
    if (!strcmp(argv[i], "--shapes") && i + 1 < argc) {
      g_shapes = argv[++i];
      if (strcmp(g_shapes, "prefill") && strcmp(g_shapes, "decode")) {
        fprintf(stderr, "moe8 bench: --shapes takes prefill or decode, not '%s'\n", g_shapes);
        return EXIT_USAGE;
      }
      continue;
    }
    int found = 0;
    for (int s2 = 0; s2 < 6; s2++)
      if (!strcmp(argv[i], names[s2])) { want[s2] = 1; found = any = 1; }
    if (!found) { fprintf(stderr, "moe8 bench: unknown benchmark '%s' (try 'moe8 bench --help')\n", argv[i]); return EXIT_USAGE; }
  }
  if (!any) for (int s2 = 0; s2 < 4; s2++) want[s2] = 1;
  /* The chart needs matplotlib: say so now, not after the runs. */
  if (plot && system("/usr/bin/python3 -c 'import matplotlib' >/dev/null 2>&1") != 0) {
    fprintf(stderr, "moe8 bench: --plot needs python3 with matplotlib (apt-get install python3-matplotlib); nothing was run\n");
    return EXIT_USAGE;
  }
  if (plot && !json) {
    snprintf(json_tmp, sizeof json_tmp, "/tmp/moe8-bench-XXXXXX");
    const int fd = mkstemp(json_tmp);
    if (fd < 0) { fprintf(stderr, "moe8 bench: cannot create a temporary file for --plot\n"); return EXIT_FAIL; }
    close(fd);
    json = json_tmp;
  }
  if (json && !(g_json = fopen(json, "w"))) { fprintf(stderr, "moe8 bench: cannot write %s\n", json); return EXIT_FAIL; }
  char cpu[256];
  cpu_name(cpu, sizeof cpu);
#ifdef _OPENMP
  const int ncpu = omp_get_num_procs();
#else
  const int ncpu = 1;
#endif
  printf("machine: %s, %d CPUs, kernels %s%s\n", cpu, ncpu, moe8_isa_name(moe8_isa_active()),
         moe8_isa_supported(MOE8_ISA_AMX) ? " (AMX tiles)" : " (no AMX)");
  if (g_json)
    fprintf(g_json, "{\"bench\":\"machine\",\"cpu\":\"%s\",\"cpus\":%d,\"kernels\":\"%s\",\"amx\":%s,\"version\":\"%s\"}\n", cpu, ncpu,
            moe8_isa_name(moe8_isa_active()), moe8_isa_supported(MOE8_ISA_AMX) ? "true" : "false", MOE8_VERSION_STRING);
  int rc = EXIT_OK;
  peaks pk = {0};
  if (want[0] || want[1] || want[2] || want[4] || want[5]) {
    pk = measure_peaks();
    if (g_json) fprintf(g_json, "{\"bench\":\"peaks\",\"f32_gflops\":%.1f,\"bf16_gflops\":%.1f,\"i8_gops\":%.1f,\"read_gbs\":%.2f,\"read_gbs_2t\":%.2f,"
                        "\"amx_bf16_gflops\":%.1f,\"amx_i8_gops\":%.1f}\n", pk.f32, pk.bf16, pk.i8, pk.bw, pk.bw2, pk.amx_bf16, pk.amx_i8);
  }
  if (rc == EXIT_OK && want[0]) rc = bench_quant(pk.bw, pk.bw2);
  if (!g_nisa) g_isas[g_nisa++] = moe8_isa_active();
  for (int q = 0; q < g_nisa && rc == EXIT_OK; q++) {
    moe8_isa_set(g_isas[q]);
    if (rc == EXIT_OK && want[1]) rc = bench_gmm(&pk);
    if (rc == EXIT_OK && want[2]) rc = bench_layer(g_json, &pk);
  }
  if (rc == EXIT_OK && want[3]) rc = bench_ep();
  if (rc == EXIT_OK && want[5]) rc = bench_mxfp4(&pk);
  if (g_json) { fclose(g_json); g_json = NULL; }
  if (rc == EXIT_OK && plot) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 '%s/../scripts/plot_bench.py' '%s' '%s'", MOE8_BENCH_DIR, json, plot);
    if (system(cmd) != 0) { fprintf(stderr, "moe8 bench: the chart was not drawn (python3-matplotlib installed?); the figures are in %s\n", json); rc = EXIT_FAIL; }
  }
  if (json_tmp[0] && rc == EXIT_OK) remove(json_tmp);
  return rc;
}
