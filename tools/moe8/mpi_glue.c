/*
** mpi_glue.c — how the moe8 command meets MPI.  When the process runs
** under mpirun (OMPI_COMM_WORLD_SIZE or PMI_SIZE in the environment) and
** the build has MPI, MPI is initialized and the communicator spans
** MPI_COMM_WORLD; otherwise it is the single-process communicator.
*/
#include "cli.h"

#include <stdlib.h>
#include <string.h>
#ifdef MOE8_HAVE_MPI
#include <mpi.h>
#endif

static int g_inited;

int cli_under_mpirun(void) { return getenv("OMPI_COMM_WORLD_SIZE") != NULL || getenv("PMI_SIZE") != NULL; }

moe8_status cli_comm_open(moe8_comm **out) {
#ifdef MOE8_HAVE_MPI
  if (cli_under_mpirun()) {
    if (!g_inited) {
      int argc = 0;
      char **argv = NULL;
      MPI_Init(&argc, &argv);
      g_inited = 1;
    }
    MPI_Comm world = MPI_COMM_WORLD;
    /* The command's collective deadline: 600 s unless MOE8_EP_TIMEOUT says otherwise. */
    if (!getenv("MOE8_EP_TIMEOUT")) setenv("MOE8_EP_TIMEOUT", "600", 0);
    return moe8_comm_create_mpi(&world, out);
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

/* Max over ranks of v (a flag or a difference); v itself on one process. */
double cli_allreduce_max(moe8_comm *c, double v) {
#ifdef MOE8_HAVE_MPI
  if (g_inited && moe8_comm_size(c) > 1) {
    double r = v;
    MPI_Allreduce(&v, &r, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return r;
  }
#endif
  (void)c;
  return v;
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

/* Rank 0 receives every rank's rows (row_floats each), in rank order. */
moe8_status cli_gather_rows(moe8_comm *c, const float *send, int64_t rows, int64_t row_floats, float *recv) {
#ifdef MOE8_HAVE_MPI
  if (g_inited && moe8_comm_size(c) > 1) {
    const int P = moe8_comm_size(c);
    int n = (int)(rows * row_floats), *cnt = malloc(sizeof(int) * 2 * (size_t)P);
    if (!cnt) return MOE8_ERR_NOMEM;
    MPI_Gather(&n, 1, MPI_INT, cnt, 1, MPI_INT, 0, MPI_COMM_WORLD);
    /* Counts and displacements mean something on the root only. */
    if (moe8_comm_rank(c) == 0)
      for (int q = 0, off = 0; q < P; q++) { cnt[P + q] = off; off += cnt[q]; }
    MPI_Gatherv(send, n, MPI_FLOAT, recv, cnt, cnt + P, MPI_FLOAT, 0, MPI_COMM_WORLD);
    free(cnt);
    return MOE8_OK;
  }
#endif
  (void)c;
  memcpy(recv, send, sizeof(float) * (size_t)(rows * row_floats));
  return MOE8_OK;
}
