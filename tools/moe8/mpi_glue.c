/*
** mpi_glue.c — how the moe8 command meets MPI.  When the process runs
** under mpirun (OMPI_COMM_WORLD_SIZE or PMI_SIZE in the environment) and
** the build has MPI, MPI is initialized and the communicator spans
** MPI_COMM_WORLD; otherwise it is the single-process communicator.
*/
#include "cli.h"
#include "ep/comm.h"

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef MOE8_HAVE_MPI
#include <mpi.h>
#endif

#ifdef MOE8_HAVE_MPI
static int g_inited;

/* The deadline covers MPI's own start-up too: a rank stopped before
** MPI_Init completes would leave the others inside MPI_Init (or the
** communicator's duplication), where no moe8 deadline reaches.  A watchdog
** thread ends this process (exit 1, which makes mpirun end the job) when
** start-up has not finished within MOE8_EP_TIMEOUT seconds. */
static atomic_int g_started;

static void *startup_watchdog(void *arg) {
  const double limit = *(const double *)arg;
  free(arg);
  for (double waited = 0; waited < limit; waited += 0.1) {
    if (atomic_load(&g_started)) return NULL;
    const struct timespec ts = {0, 100000000};
    nanosleep(&ts, NULL);
  }
  if (atomic_load(&g_started)) return NULL;
  const char *rank = getenv("OMPI_COMM_WORLD_RANK");
  fprintf(stderr, "moe8: rank %s: MPI start-up did not complete within %g s (MOE8_EP_TIMEOUT): a rank did not arrive; ending the job\n",
          rank ? rank : "?", limit);
  fflush(stderr);
  _exit(1);
}
#endif

int cli_under_mpirun(void) { return getenv("OMPI_COMM_WORLD_SIZE") != NULL || getenv("PMI_SIZE") != NULL; }

moe8_status cli_comm_open(moe8_comm **out) {
#ifdef MOE8_HAVE_MPI
  if (cli_under_mpirun()) {
    /* The command's collective deadline: 600 s unless MOE8_EP_TIMEOUT says otherwise. */
    if (!getenv("MOE8_EP_TIMEOUT")) setenv("MOE8_EP_TIMEOUT", "600", 0);
    const double limit = strtod(getenv("MOE8_EP_TIMEOUT"), NULL);
    double *arg = malloc(sizeof *arg);
    pthread_t th;
    if (arg && limit > 0) {
      *arg = limit;
      if (pthread_create(&th, NULL, startup_watchdog, arg) == 0) pthread_detach(th);
      else free(arg);
    } else {
      free(arg);
    }
    if (!g_inited) {
      int argc = 0;
      char **argv = NULL;
      MPI_Init(&argc, &argv);
      g_inited = 1;
    }
    MPI_Comm world = MPI_COMM_WORLD;
    const moe8_status st = moe8_comm_create_mpi(&world, out);
    atomic_store(&g_started, 1);
    return st;
  }
#endif
  return moe8_comm_create_single(out);
}

void cli_comm_close(moe8_comm *c) {
#ifdef MOE8_HAVE_MPI
  if (g_inited && moe8_comm_broken(c)) {
    /* A rank missed a deadline: it cannot finish any collective, so the
    ** job ends here, non-zero (the message was printed by the caller). */
    fflush(stdout);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
#endif
  moe8_comm_destroy(c);
#ifdef MOE8_HAVE_MPI
  if (g_inited) { MPI_Finalize(); g_inited = 0; }
#endif
}

/* Sum over ranks of v[n] in place. */
void cli_allreduce_sum(moe8_comm *c, double *v, int n) {
#ifdef MOE8_HAVE_MPI
  if (g_inited && moe8_comm_size(c) > 1) MPI_Allreduce(MPI_IN_PLACE, v, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
#else
  (void)c; (void)v; (void)n;
#endif
}

/* Max over ranks of v (a flag or a difference); v itself on one process.
** Through the communicator's all-gather, so the collective deadline holds;
** on a failure (a missed deadline: the communicator is then broken, and
** cli_comm_close ends the job) v itself is returned. */
double cli_allreduce_max(moe8_comm *c, double v) {
  const int P = moe8_comm_size(c);
  if (P <= 1) return v;
  double *all = malloc(sizeof(double) * (size_t)P);
  size_t *rb = malloc(sizeof(size_t) * (size_t)P);
  double r = v;
  if (all && rb) {
    for (int q = 0; q < P; q++) rb[q] = sizeof(double);
    if (c->allgatherv(c, &v, sizeof v, all, rb) == MOE8_OK)
      for (int q = 0; q < P; q++) r = all[q] > r ? all[q] : r;
    else fprintf(stderr, "moe8: rank %d: %s\n", moe8_comm_rank(c), moe8_last_error());
  }
  free(all); free(rb);
  return r;
}

/* A raw all-gather of n bytes per rank (bench); seconds, or -1 without MPI. */
double cli_time_allgather(moe8_comm *c, const void *send, size_t n, void *recv, int reps) {
#ifdef MOE8_HAVE_MPI
  if (g_inited) {
    double best = 1e30;
    for (int i = 0; i < reps; i++) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      MPI_Allgather(send, (int)n, MPI_BYTE, recv, (int)n, MPI_BYTE, MPI_COMM_WORLD);
      double t = MPI_Wtime() - t0, tmax = t;
      MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      if (tmax < best) best = tmax;
    }
    return best;
  }
#endif
  (void)c; (void)send; (void)n; (void)recv; (void)reps;
  return -1.0;
}

/* Rank 0 receives every rank's rows (row_floats each), in rank order
** (every rank does: an all-gather through the communicator, so the
** collective deadline holds). */
moe8_status cli_gather_rows(moe8_comm *c, const float *send, int64_t rows, int64_t row_floats, float *recv) {
  const int P = moe8_comm_size(c);
  if (P <= 1) {
    if (rows > 0) memcpy(recv, send, sizeof(float) * (size_t)(rows * row_floats));
    return MOE8_OK;
  }
  int64_t *cnt = malloc(sizeof(int64_t) * (size_t)P);
  size_t *rb = malloc(sizeof(size_t) * (size_t)P);
  moe8_status st = cnt && rb ? MOE8_OK : MOE8_ERR_NOMEM;
  if (st == MOE8_OK) {
    for (int q = 0; q < P; q++) rb[q] = sizeof(int64_t);
    st = c->allgatherv(c, &rows, sizeof rows, cnt, rb);
  }
  if (st == MOE8_OK) {
    for (int q = 0; q < P; q++) rb[q] = sizeof(float) * (size_t)(cnt[q] * row_floats);
    st = c->allgatherv(c, send, sizeof(float) * (size_t)(rows * row_floats), recv, rb);
  }
  free(cnt); free(rb);
  return st;
}
