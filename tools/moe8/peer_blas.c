/*
** peer_blas.c — OpenBLAS as a peer of 'moe8 bench gmm': a per-expert
** cblas_sgemm loop.  Part of the peers module (libmoe8_peers.so), which the
** bench loads when it runs: the moe8 command itself links no BLAS.
*/
#include "peer.h"

#include <cblas.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int peer_blas_available(void) { return 1; }

double peer_blas_gmm(const float *x, const float *w, float *out, const int32_t *gs, int64_t E, int64_t D, int64_t F, int threads,
                     int runs, double *median) {
  openblas_set_num_threads(threads);
  double t[64];
  if (runs > 64) runs = 64;
  for (int r = 0; r < runs; r++) {
    const double t0 = now();
    int64_t row = 0;
    for (int64_t e = 0; e < E; e++) {
      if (gs[e])
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, gs[e], (int)F, (int)D, 1.0f, x + row * D, (int)D, w + e * D * F, (int)F,
                    0.0f, out + row * F, (int)F);
      row += gs[e];
    }
    t[r] = now() - t0;
  }
  qsort(t, (size_t)runs, sizeof t[0], cmp);
  if (median) *median = t[runs / 2];
  return t[0];
}
