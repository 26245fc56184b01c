/*
** comm.c — the single-process communicator (P = 1: every collective is a
** copy), the public accessors of moe8_comm, and the opening of the MPI
** module (comm.h).
*/
#define _GNU_SOURCE 1 /* dladdr */
#include "comm.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* ---- the MPI module ----------------------------------------------------
** Looked for, in order: $MOE8_MPI_MODULE; libmoe8_mpi.so beside the file
** that holds this code (libmoe8.so, or the program linking libmoe8.a), and
** in its moe8/ directory (the installed layout); the build tree's. */
static const moe8__comm_host g_host = {MOE8__COMM_ABI, sizeof(moe8_comm), moe8__fail};
static moe8__mpi_entry g_entry;
static char g_why[PATH_MAX + 256];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void *try_open(const char *path) {
  if (!path || !*path) return NULL;
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h && access(path, F_OK) == 0) {
    const char *e = dlerror();
    snprintf(g_why, sizeof g_why, "%s could not be opened: %s", path, e ? e : "?");
  }
  return h;
}

static void load_module(void) {
  snprintf(g_why, sizeof g_why, "the MPI module libmoe8_mpi.so was not found beside libmoe8 (this build found no MPI: "
           "apt-get install libopenmpi-dev and rebuild, or set MOE8_MPI_MODULE to the module's path)");
  void *h = try_open(getenv("MOE8_MPI_MODULE"));
  Dl_info info;
  char dir[PATH_MAX], path[PATH_MAX + 64];
  if (!h && dladdr((void *)&load_module, &info) && info.dli_fname && strlen(info.dli_fname) < sizeof dir) {
    strcpy(dir, info.dli_fname);
    char *slash = strrchr(dir, '/');
    if (slash) {
      *slash = 0;
      snprintf(path, sizeof path, "%s/libmoe8_mpi.so", dir);
      h = try_open(path);
      if (!h) { snprintf(path, sizeof path, "%s/moe8/libmoe8_mpi.so", dir); h = try_open(path); }
    }
  }
#ifdef MOE8_MPI_MODULE_INSTALLED
  if (!h) h = try_open(MOE8_MPI_MODULE_INSTALLED);
#endif
#ifdef MOE8_MPI_MODULE_BUILT
  if (!h) h = try_open(MOE8_MPI_MODULE_BUILT);
#endif
  if (!h) return;
  *(void **)&g_entry = dlsym(h, MOE8__MPI_ENTRY);
  if (!g_entry) snprintf(g_why, sizeof g_why, "the MPI module has no %s: it is not moe8's", MOE8__MPI_ENTRY);
}

bool moe8_has_mpi(void) {
  pthread_once(&g_once, load_module);
  return g_entry != NULL;
}

moe8_status moe8_comm_create_mpi(const void *mpi_comm, moe8_comm **out) {
  if (out) *out = NULL;
  if (!moe8_has_mpi()) return moe8__fail(MOE8_ERR_UNSUPPORTED, "comm: %s", g_why);
  moe8_clear_error();
  const moe8_status st = g_entry(&g_host, mpi_comm, out);
  return st == MOE8_ERR_INTERNAL && !*moe8_last_error() ? moe8__fail(st, "comm: the MPI module was built for another moe8") : st;
}
