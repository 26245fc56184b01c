/*
** peer_load.c — opens the bench's peers module (peer.h) on first use.
*/
#define _GNU_SOURCE 1
#include "peer.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static peers g_peers;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void *try_open(const char *path) { return path && *path ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : NULL; }

static void load(void) {
  void *h = try_open(getenv("MOE8_PEERS"));
  char exe[PATH_MAX], path[PATH_MAX + 64];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (!h && n > 0) {
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) {
      *slash = 0;
      snprintf(path, sizeof path, "%s/../lib/moe8/libmoe8_peers.so", exe);
      h = try_open(path);
      if (!h) { snprintf(path, sizeof path, "%s/libmoe8_peers.so", exe); h = try_open(path); }
    }
  }
#ifdef MOE8_PEERS_PATH
  if (!h) h = try_open(MOE8_PEERS_PATH);
#endif
  if (!h) { g_peers.why = "the peers module libmoe8_peers.so was not found (set MOE8_PEERS)"; return; }
  int (*dnnl_ok)(void) = (int (*)(void))dlsym(h, "peer_dnnl_available");
  int (*blas_ok)(void) = (int (*)(void))dlsym(h, "peer_blas_available");
  if (dnnl_ok && dnnl_ok()) *(void **)&g_peers.dnnl_gmm = dlsym(h, "peer_dnnl_gmm");
  if (blas_ok && blas_ok()) *(void **)&g_peers.blas_gmm = dlsym(h, "peer_blas_gmm");
}

const peers *peers_load(void) {
  pthread_once(&g_once, load);
  return &g_peers;
}
