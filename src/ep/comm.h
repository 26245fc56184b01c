/*
** comm.h — the communicator behind moe8_comm: a table of collectives with
** two implementations, single process (comm.c) and MPI (comm_mpi.c, built
** when MPI is found).  Sizes are bytes; displacements are prefix sums of
** the per-rank sizes.  Every call is collective unless it says otherwise.
*/
#ifndef MOE8_COMM_H
#define MOE8_COMM_H

#include "../core/internal.h"

struct moe8_comm {
  int   rank, size;
  bool  broken;   /* a collective missed its deadline */
  void *impl;
  /* recv gets every rank's send, in rank order; recv_bytes[P]. */
  moe8_status (*allgatherv)(moe8_comm *c, const void *send, size_t send_bytes, void *recv, const size_t *recv_bytes);
  /* send_bytes[P] to each rank, recv_bytes[P] from each rank. */
  moe8_status (*alltoallv)(moe8_comm *c, const void *send, const size_t *send_bytes, void *recv, const size_t *recv_bytes);
  /* Point to point (not collective). */
  moe8_status (*send)(moe8_comm *c, int dest, const void *buf, size_t bytes);
  moe8_status (*recv)(moe8_comm *c, int src, void *buf, size_t bytes);
  moe8_status (*bcast)(moe8_comm *c, int root, void *buf, size_t bytes);
  void (*destroy)(moe8_comm *c);
};

#endif
