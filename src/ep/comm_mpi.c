/*
** comm_mpi.c — the MPI communicator: MPI_Allgatherv, MPI_Alltoallv,
** MPI_Send/Recv and MPI_Bcast on a duplicate of the caller's communicator,
** byte-typed.  MPI counts are int: a message of 2 GiB or more is refused
** with a clear error rather than truncated.
**
** The deadline (MOE8_EP_TIMEOUT seconds in the environment when the
** communicator is created; off when unset or 0): before each collective
** every rank tells every other that it has arrived (one small message per
** peer, tagged with the collective's sequence number) and waits for their
** word, polling with short sleeps, so a rank that has stopped (a stuck
** node, SIGSTOP) is named in an error instead of a hang.  The
** communicator is then broken (moe8_comm_broken): the caller ends the job
** (MPI_Abort), since the stopped rank can never finish the collective.
**
** Built as the module libmoe8_mpi.so (comm.h): its errors go through the
** host's fail(), so moe8_last_error() has them.
*/
#define _DEFAULT_SOURCE 1 /* nanosleep */
#include "comm.h"

#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const moe8__comm_host *g_host;
#define moe8__fail g_host->fail

typedef struct impl {
  MPI_Comm comm;
  double   timeout;   /* seconds; 0: wait forever */
  unsigned seq;
} impl;

static MPI_Comm mc(moe8_comm *c) { return ((impl *)c->impl)->comm; }

/* Every peer's arrival at collective `what`, within the deadline. */
static moe8_status arrive(moe8_comm *c, const char *what) {
  impl *m = c->impl;
  if (m->timeout <= 0 || c->size == 1) return MOE8_OK;
  if (c->broken) return moe8__fail(MOE8_ERR_IO, "comm: %s: the communicator is broken by an earlier missed deadline", what);
  const int P = c->size, tag = 20000 + (int)(++m->seq % 10000u);
  MPI_Request *rq = malloc(sizeof(MPI_Request) * 2 * (size_t)P);
  unsigned *got = malloc(sizeof(unsigned) * (size_t)P);
  int *done = calloc((size_t)P, sizeof(int));
  if (!rq || !got || !done) { free(rq); free(got); free(done); return moe8__fail(MOE8_ERR_NOMEM, "comm: out of memory"); }
  for (int q = 0; q < P; q++) {
    rq[q] = rq[P + q] = MPI_REQUEST_NULL;
    if (q == c->rank) { done[q] = 1; continue; }
    MPI_Irecv(&got[q], 1, MPI_UNSIGNED, q, tag, m->comm, &rq[q]);
    MPI_Isend(&m->seq, 1, MPI_UNSIGNED, q, tag, m->comm, &rq[P + q]);
  }
  const double t0 = MPI_Wtime();
  int left = P - 1;
  while (left > 0) {
    for (int q = 0; q < P; q++) {
      if (done[q]) continue;
      int flag = 0;
      MPI_Test(&rq[q], &flag, MPI_STATUS_IGNORE);
      if (flag) { done[q] = 1; left--; }
    }
    if (left == 0 || MPI_Wtime() - t0 > m->timeout) break;
    const struct timespec ts = {0, 200000}; /* 0.2 ms: waiting ranks do not spin a core */
    nanosleep(&ts, NULL);
  }
  moe8_status st = MOE8_OK;
  if (left > 0) {
    char list[256] = "";
    for (int q = 0, n = 0; q < P; q++)
      if (!done[q] && strlen(list) < sizeof list - 16) snprintf(list + strlen(list), sizeof list - strlen(list), "%s%d", n++ ? ", " : "", q);
    c->broken = true;
    st = moe8__fail(MOE8_ERR_IO, "comm: %s on rank %d: rank%s %s did not arrive within %g s (MOE8_EP_TIMEOUT)", what, c->rank,
                    left > 1 ? "s" : "", list, m->timeout);
    /* The requests to and from the missing ranks stay pending; the job is ending. */
  } else {
    MPI_Waitall(P, rq + P, MPI_STATUSES_IGNORE);
  }
  free(rq); free(got); free(done);
  return st;
}

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
  if (st == MOE8_OK) st = arrive(c, "MPI_Allgatherv");
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
  if (st == MOE8_OK) st = arrive(c, "MPI_Alltoallv");
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
  const impl *m = c->impl;
  if (m->timeout <= 0) return check(MPI_Recv(buf, (int)n, MPI_BYTE, src, 77, mc(c), MPI_STATUS_IGNORE), "MPI_Recv");
  MPI_Request r;
  moe8_status st = check(MPI_Irecv(buf, (int)n, MPI_BYTE, src, 77, mc(c), &r), "MPI_Irecv");
  const double t0 = MPI_Wtime();
  for (int flag = 0; st == MOE8_OK && !flag;) {
    MPI_Test(&r, &flag, MPI_STATUS_IGNORE);
    if (flag) break;
    if (MPI_Wtime() - t0 > m->timeout) {
      c->broken = true;
      return moe8__fail(MOE8_ERR_IO, "comm: MPI_Recv on rank %d: rank %d did not send within %g s (MOE8_EP_TIMEOUT)", c->rank, src, m->timeout);
    }
    const struct timespec ts = {0, 200000};
    nanosleep(&ts, NULL);
  }
  return st;
}

static moe8_status m_bcast(moe8_comm *c, int root, void *buf, size_t n) {
  if (n > INT_MAX) return moe8__fail(MOE8_ERR_UNSUPPORTED, "comm: a message of 2 GiB or more");
  moe8_status st = arrive(c, "MPI_Bcast");
  return st == MOE8_OK ? check(MPI_Bcast(buf, (int)n, MPI_BYTE, root, mc(c)), "MPI_Bcast") : st;
}

static void m_destroy(moe8_comm *c) {
  if (!c->broken) MPI_Comm_free(&((impl *)c->impl)->comm); /* freeing is collective: not with a stopped rank */
  free(c->impl);
  free(c);
}

__attribute__((visibility("default"))) moe8_status moe8_mpi_module_create(const moe8__comm_host *host, const void *mpi_comm,
                                                                      moe8_comm **out);
moe8_status moe8_mpi_module_create(const moe8__comm_host *host, const void *mpi_comm, moe8_comm **out) {
  if (!host || host->abi != MOE8__COMM_ABI || host->comm_size != sizeof(moe8_comm)) return MOE8_ERR_INTERNAL;
  g_host = host;
  if (!mpi_comm || !out) return moe8__fail(MOE8_ERR_INVALID_ARG, "comm: NULL argument");
  *out = NULL;
  int init = 0;
  MPI_Initialized(&init);
  if (!init) return moe8__fail(MOE8_ERR_INVALID_ARG, "comm: MPI is not initialized (call MPI_Init first)");
  const char *tv = getenv("MOE8_EP_TIMEOUT");
  double timeout = 0.0;
  if (tv && *tv) {
    char *end;
    timeout = strtod(tv, &end);
    if (*end || !(timeout >= 0.0 && timeout <= 1e7))
      return moe8__fail(MOE8_ERR_INVALID_ARG, "comm: MOE8_EP_TIMEOUT = \"%.40s\" must be a number of seconds in [0, 1e7]", tv);
  }
  moe8_comm *c = calloc(1, sizeof *c);
  impl *m = calloc(1, sizeof *m);
  if (!c || !m) { free(c); free(m); return moe8__fail(MOE8_ERR_NOMEM, "comm: out of memory"); }
  if (MPI_Comm_dup(*(const MPI_Comm *)mpi_comm, &m->comm) != MPI_SUCCESS) { free(c); free(m); return moe8__fail(MOE8_ERR_IO, "comm: MPI_Comm_dup failed"); }
  m->timeout = timeout;
  MPI_Comm_rank(m->comm, &c->rank);
  MPI_Comm_size(m->comm, &c->size);
  c->impl = m;
  c->allgatherv = m_allgatherv;
  c->alltoallv = m_alltoallv;
  c->send = m_send;
  c->recv = m_recv;
  c->bcast = m_bcast;
  c->destroy = m_destroy;
  *out = c;
  return MOE8_OK;
}
