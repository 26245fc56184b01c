/*
** comm.c — the single-process communicator (P = 1: every collective is a
** copy) and the public accessors of moe8_comm.
*/
#include "comm.h"

#include <stdlib.h>
#include <string.h>

static moe8_status s_allgatherv(moe8_comm *c, const void *send, size_t n, void *recv, const size_t *rb) {
  (void)c;
  if (rb[0] != n) return moe8__fail(MOE8_ERR_INTERNAL, "comm: allgatherv size mismatch");
  if (n) memmove(recv, send, n);
  return MOE8_OK;
}

static moe8_status s_alltoallv(moe8_comm *c, const void *send, const size_t *sb, void *recv, const size_t *rb) {
  (void)c;
  if (sb[0] != rb[0]) return moe8__fail(MOE8_ERR_INTERNAL, "comm: alltoallv size mismatch");
  if (sb[0]) memmove(recv, send, sb[0]);
  return MOE8_OK;
}

static moe8_status s_p2p(moe8_comm *c, int peer, const void *buf, size_t n) {
  (void)c; (void)peer; (void)buf; (void)n;
  return moe8__fail(MOE8_ERR_INTERNAL, "comm: point-to-point on a single process");
}

static moe8_status s_recv(moe8_comm *c, int peer, void *buf, size_t n) { return s_p2p(c, peer, buf, n); }

static moe8_status s_bcast(moe8_comm *c, int root, void *buf, size_t n) {
  (void)c; (void)root; (void)buf; (void)n;
  return MOE8_OK;
}

static void s_destroy(moe8_comm *c) { free(c); }

moe8_status moe8_comm_create_single(moe8_comm **out) {
  if (!out) return moe8__fail(MOE8_ERR_INVALID_ARG, "comm: NULL argument");
  moe8_comm *c = calloc(1, sizeof *c);
  if (!c) return moe8__fail(MOE8_ERR_NOMEM, "comm: out of memory");
  *c = (moe8_comm){.rank = 0, .size = 1, .allgatherv = s_allgatherv, .alltoallv = s_alltoallv, .send = s_p2p, .recv = s_recv, .bcast = s_bcast, .destroy = s_destroy};
  *out = c;
  return MOE8_OK;
}

int  moe8_comm_rank(const moe8_comm *c) { return c ? c->rank : 0; }
int  moe8_comm_size(const moe8_comm *c) { return c ? c->size : 1; }
bool moe8_comm_broken(const moe8_comm *c) { return c && c->broken; }
void moe8_comm_destroy(moe8_comm *c) { if (c) c->destroy(c); }

#ifndef MOE8_HAVE_MPI
bool moe8_has_mpi(void) { return false; }
moe8_status moe8_comm_create_mpi(const void *mpi_comm, moe8_comm **out) {
  (void)mpi_comm;
  if (out) *out = NULL;
  return moe8__fail(MOE8_ERR_UNSUPPORTED, "comm: this build of moe8 has no MPI (install libopenmpi-dev and rebuild)");
}
#endif
