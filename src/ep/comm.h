/*
** comm.h — the communicator behind moe8_comm: a table of collectives with
** two implementations, single process (comm.c) and MPI (comm_mpi.c).
** Sizes are bytes; displacements are prefix sums of the per-rank sizes.
** Every call is collective unless it says otherwise.
**
** The MPI one is a module of its own, libmoe8_mpi.so, built when MPI is
** found and opened by moe8_comm_create_mpi() on first use, so that
** libmoe8 and its users never link MPI.  The module sees none of the
** library's internals: it gets what it calls through moe8__comm_host.
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

/* What the library hands the MPI module (comm_mpi.c). */
#define MOE8__COMM_ABI 1
typedef struct moe8__comm_host {
  int    abi;          /* MOE8__COMM_ABI */
  size_t comm_size;    /* sizeof(moe8_comm) */
  moe8_status (*fail)(moe8_status status, const char *fmt, ...) MOE8__PRINTF(2, 3);
} moe8__comm_host;

/* The module's one export. */
#define MOE8__MPI_ENTRY "moe8_mpi_module_create"
typedef moe8_status (*moe8__mpi_entry)(const moe8__comm_host *host, const void *mpi_comm, moe8_comm **out);

#endif
