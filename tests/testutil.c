/*
** testutil.c — shared test helpers; see testutil.h.
*/
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/internal.h"

/* Every test runs its loops on the whole thread team, however small the
** problem: the thread-count tests compare 1 and 2 threads on small
** shapes (test_moe_ops checks that the small-work rule keeps the bytes). */
__attribute__((constructor)) static void tu_threads_always(void) { moe8__set_par_min(0.0); }

static uint64_t g_seed, g_state;
static int      g_seeded;

uint64_t tu_seed(void) {
  if (!g_seeded) {
    const char *e = getenv("MOE8_TEST_SEED");
    g_seed = e && *e ? strtoull(e, NULL, 0) : 0x5EED0123456789ULL;
    g_state = g_seed ? g_seed : 1;
    g_seeded = 1;
    fprintf(stderr, "test seed: MOE8_TEST_SEED=%llu\n", (unsigned long long)g_seed);
  }
  return g_seed;
}

void tu_rng_reset(uint64_t salt) {
  g_state = (tu_seed() ^ (salt * 0x9E3779B97F4A7C15ULL)) | 1;
}

uint64_t tu_u64(void) {
  tu_seed();
  g_state ^= g_state >> 12;
  g_state ^= g_state << 25;
  g_state ^= g_state >> 27;
  return g_state * 0x2545F4914F6CDD1DULL;
}

float tu_uniform(float lo, float hi) {
  return lo + (hi - lo) * (float)((tu_u64() >> 40) * 0x1p-24);
}

float tu_normal(void) {
  const double u1 = ((tu_u64() >> 11) + 1) * 0x1p-53, u2 = (tu_u64() >> 11) * 0x1p-53;
  return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

void tu_fill_normal(float *x, size_t n, float scale) {
  for (size_t i = 0; i < n; i++) x[i] = tu_normal() * scale;
}

void *tu_alloc(size_t n) {
  unsigned char *p = malloc(n + 64);
  if (!p) return NULL;
  memset(p + n, 0xA5, 64);
  return p;
}

int tu_guard_ok(const void *p, size_t n) {
  const unsigned char *g = (const unsigned char *)p + n;
  for (int i = 0; i < 64; i++)
    if (g[i] != 0xA5) return 0;
  return 1;
}

void tu_fill_nan(float *p, size_t n) {
  for (size_t i = 0; i < n; i++) p[i] = NAN;
}

moe8_isa tu_isa_best(void) {
  static int best = -1;
  if (best < 0) best = (int)moe8_isa_active();
  return (moe8_isa)best;
}

int tu_isas(moe8_isa out[MOE8_ISA_COUNT]) {
  tu_isa_best(); /* remember the table the process chose, before any test sets one */
  int n = 0;
  for (int i = 0; i < MOE8_ISA_COUNT; i++)
    if (moe8_isa_supported((moe8_isa)i)) out[n++] = (moe8_isa)i;
  return n;
}

static double tu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void tu_progress_start(tu_progress *p, const char *what, int64_t total) {
  p->what = what;
  p->total = total;
  atomic_store(&p->done, 0);
  p->t0 = tu_now();
  fprintf(stderr, "%s: %lld steps\n", what, (long long)total);
}

void tu_progress_tick(tu_progress *p) {
  const int64_t d = atomic_fetch_add(&p->done, 1) + 1, step = p->total / 8 > 0 ? p->total / 8 : 1;
  if (d % step == 0 || d == p->total)
    fprintf(stderr, "%s: %3.0f%% (%.0f s)\n", p->what, 100.0 * (double)d / (double)p->total, tu_now() - p->t0);
}

int tu_exhaustive(void) {
  const char *e = getenv("MOE8_TEST_EXHAUSTIVE");
  return !(e && strcmp(e, "0") == 0);
}
