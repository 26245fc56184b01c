/*
** demo.c — 'moe8 demo': the main job of the README.  For random data shaped
** like MoE activations and weights (normal values with a few outlier
** channels), it quantizes with every format and granularity and prints the
** error of the round trip: relative RMS error and the largest error as a
** fraction of its block's maximum.
*/
#include "cli.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t g_rng = 0x9E3779B97F4A7C15ULL;
static float randn(void) {
  double u[2];
  for (int i = 0; i < 2; i++) {
    g_rng ^= g_rng >> 12; g_rng ^= g_rng << 25; g_rng ^= g_rng >> 27;
    u[i] = (double)((g_rng * 0x2545F4914F6CDD1DULL) >> 11) * 0x1p-53;
  }
  return (float)(sqrt(-2.0 * log(u[0] + 0x1p-60)) * cos(6.283185307179586 * u[1]));
}

int cmd_demo(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    if (cli_is_help(argv[i])) {
      printf("usage: moe8 demo\n\nQuantizes random activations x[256, 1024] and expert weights w[4, 1024, 512]\n"
             "with f8e4m3, f8e5m2 and i8 at every granularity and prints the round-trip error.\n");
      return EXIT_OK;
    }
    fprintf(stderr, "moe8 demo: unknown option '%s'\n", argv[i]);
    return EXIT_USAGE;
  }
  const int64_t T = 256, K = 1024, E = 4, N = 512;
  float *x = malloc(sizeof(float) * (size_t)(T * K));
  float *w = malloc(sizeof(float) * (size_t)(E * K * N));
  float *y = malloc(sizeof(float) * (size_t)(E * K * N));
  uint8_t *q = malloc((size_t)(E * K * N));
  float *s = malloc(sizeof(float) * (size_t)(E * K * N));
  if (!x || !w || !y || !q || !s) { fprintf(stderr, "moe8 demo: out of memory\n"); return EXIT_FAIL; }
  for (int64_t i = 0; i < T * K; i++) x[i] = randn() * ((i % K) % 97 == 0 ? 20.0f : 1.0f);
  for (int64_t i = 0; i < E * K * N; i++) w[i] = randn() * 0.02f;

  printf("moe8 %s demo: kernels %s\n\n", MOE8_VERSION_STRING, moe8_isa_name(moe8_isa_active()));
  printf("%-8s %-26s %-10s %12s %14s\n", "format", "granularity", "tensor", "rel RMS err", "max err/bmax");
  const moe8_dtype types[] = {MOE8_DTYPE_F8E4M3, MOE8_DTYPE_F8E5M2, MOE8_DTYPE_I8};
  const struct { moe8_granularity g; const char *name; int weight; int64_t tile, bn; } grans[] = {
    {MOE8_GRAN_TENSOR, "per-tensor", 0, 0, 0},
    {MOE8_GRAN_ROW, "per-token [T,1]", 0, 0, 0},
    {MOE8_GRAN_ROW_TILE, "per-token 1x128 [T,K/128]", 0, 128, 0},
    {MOE8_GRAN_CHANNEL, "per-channel [E,1,1,N]", 1, 0, 0},
    {MOE8_GRAN_CHANNEL_TILE, "K-tiled [E,K/128,1,N]", 1, 128, 0},
    {MOE8_GRAN_BLOCK2D, "2-D 128x128 [E,N/128,K/128]", 1, 128, 128},
  };
  for (size_t t = 0; t < 3; t++)
    for (size_t g = 0; g < sizeof grans / sizeof grans[0]; g++) {
      const moe8_quant_spec spec = {.qtype = types[t], .gran = grans[g].g, .tile = grans[g].tile,
                                    .block_n = grans[g].bn, .clip = 1.0f};
      const float *src = grans[g].weight ? w : x;
      const int64_t e = grans[g].weight ? E : 1, r = grans[g].weight ? K : T, c = grans[g].weight ? N : K;
      moe8_status st = moe8_quantize(&spec, src, e, r, c, q, s, NULL);
      if (st == MOE8_OK) st = moe8_dequantize(&spec, q, s, e, r, c, y);
      if (st != MOE8_OK) return cli_report(st, "demo");
      double num = 0, den = 0, worst = 0, amax = 0;
      const int64_t n = e * r * c;
      for (int64_t i = 0; i < n; i++) amax = fmax(amax, fabs(src[i]));
      for (int64_t i = 0; i < n; i++) {
        const double d = (double)src[i] - y[i];
        num += d * d;
        den += (double)src[i] * src[i];
        worst = fmax(worst, fabs(d));
      }
      printf("%-8s %-26s %-10s %12.3e %14.3e\n", moe8_dtype_info(types[t])->name, grans[g].name,
             grans[g].weight ? "w[4,1024,512]" : "x[256,1024]", sqrt(num / den), worst / amax);
    }
  printf("\n(max err/bmax uses the tensor's max; per block the bound is 1/16 for e4m3,\n"
         " 1/8 for e5m2 and 1/254 for i8 — see docs/numerics.md)\n");
  free(x); free(w); free(y); free(q); free(s);
  return EXIT_OK;
}
