/*
** bench.c — 'moe8 bench': measured, not estimated.
**
**   moe8 bench quant   f32 -> f8e4m3 per-token 1x128 quantization of 64 MiB,
**                      in GB/s, against the machine's measured memory read
**                      bandwidth (one pass of glibc memchr over 512 MiB, a
**                      pure streaming read), for 1 and 2 threads.
**
** Each figure is the min and median of several runs over buffers larger
** than the caches.
*/
#include "cli.h"

#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static void set_threads(int n) {
#ifdef _OPENMP
  omp_set_num_threads(n);
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

/* Memory read bandwidth in GB/s: best of 5 memchr passes over 512 MiB. */
static double read_bandwidth(void) {
  const size_t n = (size_t)512 << 20;
  unsigned char *buf = malloc(n);
  if (!buf) return 0;
  memset(buf, 2, n); /* not zero: a zero fill may become calloc and map the zero page */
  double best = 1e30;
  for (int i = 0; i < 5; i++) {
    const double t0 = cli_now();
    const void *p = memchr(buf, 1, n);
    const double t = cli_now() - t0;
    if (p) best = 0; /* keeps the call from being optimized away */
    if (t < best) best = t;
  }
  free(buf);
  return (double)n / best / 1e9;
}

static int bench_quant(void) {
  const int64_t T = 4096, K = 4096, tile = 128;
  const size_t n = (size_t)(T * K);
  /* Two input buffers, alternated, so each run reads from memory. */
  float *x[2] = {malloc(n * 4), malloc(n * 4)};
  uint8_t *q = malloc(n);
  float *s = malloc(sizeof(float) * (size_t)(T * (K / tile)));
  if (!x[0] || !x[1] || !q || !s) { fprintf(stderr, "moe8 bench: out of memory\n"); return EXIT_FAIL; }
  for (size_t i = 0; i < n; i++) x[0][i] = x[1][i] = (float)((int)(i * 2654435761u % 2001) - 1000) * 0.01f;
  memset(q, 0, n);
  const double bw = read_bandwidth();
  printf("memory read bandwidth (memchr, 512 MiB, best of 5): %.1f GB/s\n", bw);
  printf("quantize f32 -> f8e4m3 per-token 1x128, x[%lld, %lld] = 64 MiB, kernels %s\n",
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
    printf("%8d %10.2f %10.2f %14.1f %11.0f%%\n", th, t[0] * 1e3, t[RUNS / 2] * 1e3, gbs, 100.0 * gbs / bw);
  }
  set_threads(max_threads());
  free(x[0]); free(x[1]); free(q); free(s);
  return EXIT_OK;
}

int cmd_bench(int argc, char **argv) {
  if (argc < 2 || cli_is_help(argv[1])) {
    printf("usage: moe8 bench quant\n\n"
           "  quant   f32 -> f8e4m3 per-token 1x128 quantizer throughput on 64 MiB, as GB/s and\n"
           "          percent of the measured memory read bandwidth, 1 and 2 threads\n");
    return argc < 2 ? EXIT_USAGE : EXIT_OK;
  }
  if (strcmp(argv[1], "quant") == 0) return bench_quant();
  fprintf(stderr, "moe8 bench: unknown benchmark '%s' (try 'moe8 bench --help')\n", argv[1]);
  return EXIT_USAGE;
}
