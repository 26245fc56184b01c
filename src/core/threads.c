/*
** threads.c — how many OpenMP threads a parallel loop runs on.
**
** moe8_set_num_threads() sets the count for large loops (0: OpenMP's own).
** Every parallel loop asks moe8__nt(work), work being about the scalar
** operations the loop does; below MOE8__PAR_MIN it runs on the calling
** thread alone.  A team's loop ends with every member waiting for the
** slowest: on an idle machine that is a microsecond, on a host whose cores
** other processes keep busy it is a scheduler time slice (milliseconds) for
** whichever member was preempted.  A loop of a few microseconds is then
** thousands of times slower on two threads than on one; a loop of
** milliseconds hardly notices.  Results never depend on the count: every
** loop's iterations are independent (reductions are integer counts).
*/
#include "internal.h"

#include <stdatomic.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* About 50 µs of scalar work on one core: a team wait on an idle machine
** is a few per cent of it. */
#define MOE8__PAR_MIN 1.0e6

static _Atomic int g_threads; /* 0: OpenMP's count */
static _Atomic double g_par_min = MOE8__PAR_MIN;

void moe8__set_par_min(double work) { atomic_store(&g_par_min, work); }

moe8_status moe8_set_num_threads(int n) {
  if (n < 0 || n > 4096) return moe8__fail(MOE8_ERR_INVALID_ARG, "threads: %d is not a thread count (0 = OpenMP's, 1..4096)", n);
  atomic_store(&g_threads, n);
  return MOE8_OK;
}

int moe8_get_num_threads(void) {
  const int n = atomic_load(&g_threads);
  if (n > 0) return n;
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

int moe8__nt(double work) { return work < atomic_load(&g_par_min) ? 1 : moe8_get_num_threads(); }
