/*
** comm_mpi.c — the MPI communicator: MPI_Allgatherv, MPI_Alltoallv,
** MPI_Send/Recv and MPI_Bcast on a duplicate of the caller's communicator,
** byte-typed.  MPI counts are int: a message of 2 GiB or more is refused
** with a clear error rather than truncated.
*/
#include "comm.h"

#include <limits.h>
#include <mpi.h>
#include <stdlib.h>

bool moe8_has_mpi(void) { return true; }

static MPI_Comm mc(moe8_comm *c) { return *(MPI_Comm *)c->impl; }

static moe8_status counts(const moe8_comm *c, const size_t *bytes, int *cnt, int *dsp) {
  size_t off = 0;
  for (int i = 0; i < c->size; i++) {
    if (bytes[i] > INT_MAX || off > INT_MAX) return moe8__fail(MOE8_ERR_UNSUPPORTED, "comm: a message of 2 GiB or more");
    cnt[i] = (int)bytes[i];
    dsp[i] = (int)off;
    off += bytes[i];
  }
  return MOE8_OK;
}

static moe8_status check(int rc, const char *what) {
  if (rc == MPI_SUCCESS) return MOE8_OK;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  return moe8__fail(MOE8_ERR_IO, "comm: %s failed: %s", what, msg);
}

static moe8_status m_allgatherv(moe8_comm *c, const void *send, size_t n, void *recv, const size_t *rb) {
  int *cnt = malloc(2 * sizeof(int) * (size_t)c->size);
  if (!cnt) return moe8__fail(MOE8_ERR_NOMEM, "comm: out of memory");
  moe8_status st = n > INT_MAX ? moe8__fail(MOE8_ERR_UNSUPPORTED, "comm: a message of 2 GiB or more") : counts(c, rb, cnt, cnt + c->size);
  if (st == MOE8_OK)
    st = check(MPI_Allgatherv(send, (int)n, MPI_BYTE, recv, cnt, cnt + c->size, MPI_BYTE, mc(c)), "MPI_Allgatherv");
  free(cnt);
  return st;
}

static moe8_status m_alltoallv(moe8_comm *c, const void *send, const size_t *sb, void *recv, const size_t *rb) {
  int *cnt = malloc(4 * sizeof(int) * (size_t)c->size);
  if (!cnt) return moe8__fail(MOE8_ERR_NOMEM, "comm: out of memory");
  const int P = c->size;
  moe8_status st = counts(c, sb, cnt, cnt + P);
  if (st == MOE8_OK) st = counts(c, rb, cnt + 2 * P, cnt + 3 * P);
  if (st == MOE8_OK)
    st = check(MPI_Alltoallv(send, cnt, cnt + P, MPI_BYTE, recv, cnt + 2 * P, cnt + 3 * P, MPI_BYTE, mc(c)), "MPI_Alltoallv");
  free(cnt);
  return st;
}

static moe8_status m_send(moe8_comm *c, int dest, const void *buf, size_t n) {
  if (n > INT_MAX) return moe8__fail(MOE8_ERR_UNSUPPORTED, "comm: a message of 2 GiB or more");
  return check(MPI_Send(buf, (int)n, MPI_BYTE, dest, 77, mc(c)), "MPI_Send");
}

static moe8_status m_recv(moe8_comm *c, int src, void *buf, size_t n) {
  if (n > INT_MAX) return moe8__fail(MOE8_ERR_UNSUPPORTED, "comm: a message of 2 GiB or more");
  return check(MPI_Recv(buf, (int)n, MPI_BYTE, src, 77, mc(c), MPI_STATUS_IGNORE), "MPI_Recv");
}

static moe8_status m_bcast(moe8_comm *c, int root, void *buf, size_t n) {
  if (n > INT_MAX) return moe8__fail(MOE8_ERR_UNSUPPORTED, "comm: a message of 2 GiB or more");
  return check(MPI_Bcast(buf, (int)n, MPI_BYTE, root, mc(c)), "MPI_Bcast");
}

static void m_destroy(moe8_comm *c) {
  MPI_Comm_free((MPI_Comm *)c->impl);
  free(c->impl);
  free(c);
}

moe8_status moe8_comm_create_mpi(const void *mpi_comm, moe8_comm **out) {
  if (!mpi_comm || !out) return moe8__fail(MOE8_ERR_INVALID_ARG, "comm: NULL argument");
  *out = NULL;
  int init = 0;
  MPI_Initialized(&init);
  if (!init) return moe8__fail(MOE8_ERR_INVALID_ARG, "comm: MPI is not initialized (call MPI_Init first)");
  moe8_comm *c = calloc(1, sizeof *c);
  MPI_Comm *dup = malloc(sizeof *dup);
  if (!c || !dup) { free(c); free(dup); return moe8__fail(MOE8_ERR_NOMEM, "comm: out of memory"); }
  if (MPI_Comm_dup(*(const MPI_Comm *)mpi_comm, dup) != MPI_SUCCESS) { free(c); free(dup); return moe8__fail(MOE8_ERR_IO, "comm: MPI_Comm_dup failed"); }
  MPI_Comm_rank(*dup, &c->rank);
  MPI_Comm_size(*dup, &c->size);
  c->impl = dup;
  c->allgatherv = m_allgatherv;
  c->alltoallv = m_alltoallv;
  c->send = m_send;
  c->recv = m_recv;
  c->bcast = m_bcast;
  c->destroy = m_destroy;
  *out = c;
  return MOE8_OK;
}
