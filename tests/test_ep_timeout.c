/*
** test_ep_timeout.c — the collective deadline, run by tests/ep_timeout.sh
** under mpirun -n 2 with MOE8_EP_TIMEOUT set: rank 1 stops itself
** (SIGSTOP, as a stuck node would) before the forward; rank 0 must return
** an error naming the collective and rank 1 within the deadline, and end
** the job with MPI_Abort (exit non-zero).  Exits 0 only if rank 0 was left
** waiting past twice the deadline — the failure the script looks for.
*/
#include "moe8.h"

#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm world = MPI_COMM_WORLD;
  moe8_comm *c = NULL;
  moe8_layer *L = NULL;
  moe8_ep *ep = NULL;
  const moe8_layer_config cfg = {.num_experts = 4, .top_k = 2, .hidden = 16, .ffn = 8};
  if (moe8_comm_create_mpi(&world, &c) != MOE8_OK || moe8_layer_create(&cfg, NULL, "experts", &L) != MOE8_OK ||
      moe8_layer_init_random(L, 1) != MOE8_OK || moe8_ep_create(L, c, &ep) != MOE8_OK) {
    fprintf(stderr, "setup failed: %s\n", moe8_last_error());
    MPI_Abort(MPI_COMM_WORLD, 3);
  }
  float x[4 * 16], y[4 * 16];
  for (int i = 0; i < 4 * 16; i++) x[i] = (float)(i % 7) * 0.1f;
  if (moe8_comm_rank(c) == 1) raise(SIGSTOP);
  const double t0 = MPI_Wtime();
  const moe8_status st = moe8_ep_forward(ep, x, 4, y, NULL);
  fprintf(stderr, "rank %d: forward returned after %.1f s: %s: %s\n", moe8_comm_rank(c), MPI_Wtime() - t0, moe8_status_str(st),
          moe8_last_error());
  if (st != MOE8_OK && moe8_comm_broken(c)) MPI_Abort(MPI_COMM_WORLD, 1);
  MPI_Finalize();
  return 0;
}
