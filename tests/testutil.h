/*
** testutil.h — what every moe8 test shares: a seeded generator (the seed
** is printed at start and on failure, and MOE8_TEST_SEED overrides it),
** buffers with guard bytes, the ISAs to sweep, and the tolerance table.
*/
#ifndef MOE8_TESTUTIL_H
#define MOE8_TESTUTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <stdint.h>
#include <cmocka.h>

#include "moe8.h"

/* ---- random numbers (xorshift64*, reproducible) --------------------- */
uint64_t tu_seed(void);                 /* the run's seed                  */
void     tu_rng_reset(uint64_t salt);   /* restart the stream: seed ^ salt */
uint64_t tu_u64(void);
float    tu_uniform(float lo, float hi);
float    tu_normal(void);
void     tu_fill_normal(float *x, size_t n, float scale);

/* ---- guarded buffers -------------------------------------------------- */
/* malloc(n bytes + 64 guard bytes); the guard is filled with 0xA5.
** tu_guard_ok() is true when the guard is intact; free() releases. */
void *tu_alloc(size_t n);
int   tu_guard_ok(const void *p, size_t n);
void  tu_fill_nan(float *p, size_t n);

/* ---- ISA sweep -------------------------------------------------------- */
/* The ISAs this host supports, in increasing order; returns the count. */
int tu_isas(moe8_isa out[MOE8_ISA_COUNT]);
/* The table the process chose by itself (restored after a test that sets others). */
moe8_isa tu_isa_best(void);

/* True when the long exhaustive loops should run (default); the sanitizer
** pass sets MOE8_TEST_EXHAUSTIVE=0 and the tests then take a strided sample. */
int tu_exhaustive(void);

/* Progress of a long loop on stderr: a line at every eighth of total ticks
** (any thread may tick), so a sweep of minutes is never silent. */
typedef struct tu_progress {
  const char      *what;
  int64_t          total;
  _Atomic int64_t  done;
  double           t0;
} tu_progress;
void tu_progress_start(tu_progress *p, const char *what, int64_t total);
void tu_progress_tick(tu_progress *p);

/* Prints "seed=... " context with a failing message, then fails. */
#define TU_FAIL(...) do { print_error("seed=%llu: ", (unsigned long long)tu_seed()); \
                          print_error(__VA_ARGS__); print_error("\n"); fail(); } while (0)

#endif
