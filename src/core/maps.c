/*
** maps.c — the library's file mappings and what a SIGBUS in one of them
** means (docs/testing.md, "Mapped files").
**
** A model file is mapped read-only and, for moe8's own packed format,
** its codes are used in place for as long as the layer lives.  If the file
** is truncated (or its storage vanishes) meanwhile, touching a page past
** the new end raises SIGBUS.  The library registers each mapping with its
** path; a SIGBUS handler (installed once, at the first mapping, keeping the
** previous action) looks the faulting address up: in a moe8 mapping it
** writes one message naming the file and the offset and ends the process
** with exit status 1 (the data the layer computes with is gone; nothing
** can be returned); elsewhere it hands the signal to the previous action.
** Only async-signal-safe calls in the handler.
*/
#define _DEFAULT_SOURCE 1
#include "internal.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

enum { MAXMAPS = 1024, PATHLEN = 240 };

typedef struct map_ent {
  _Atomic uintptr_t lo;   /* 0: free */
  uintptr_t         hi;
  char              path[PATHLEN];
} map_ent;

static map_ent          g_maps[MAXMAPS];
static pthread_mutex_t  g_mu = PTHREAD_MUTEX_INITIALIZER;
static struct sigaction g_prev;
static pthread_once_t   g_once = PTHREAD_ONCE_INIT;

static atomic_flag g_dying = ATOMIC_FLAG_INIT;

/* The message is built in one buffer and written at once. */
static void add(char *m, size_t *n, size_t cap, const char *s) {
  while (*s && *n + 1 < cap) m[(*n)++] = *s++;
}

static void add_u(char *m, size_t *n, size_t cap, uintptr_t v) {
  char b[32];
  int i = 31;
  b[i] = 0;
  do { b[--i] = (char)('0' + v % 10); v /= 10; } while (v && i > 0);
  add(m, n, cap, b + i);
}

static void on_sigbus(int sig, siginfo_t *info, void *uc) {
  const uintptr_t a = (uintptr_t)info->si_addr;
  for (int i = 0; i < MAXMAPS; i++) {
    const uintptr_t lo = atomic_load(&g_maps[i].lo);
    if (lo && a >= lo && a < g_maps[i].hi) {
      if (atomic_flag_test_and_set(&g_dying))
        for (;;) pause(); /* another thread is reporting it and ending the process */
      char m[512];
      size_t n = 0;
      add(m, &n, sizeof m, "moe8: the mapped file ");
      add(m, &n, sizeof m, g_maps[i].path);
      add(m, &n, sizeof m, " was truncated or removed while in use (SIGBUS reading byte ");
      add_u(m, &n, sizeof m, a - lo);
      add(m, &n, sizeof m, "); a model file must not change while a layer uses it\n");
      (void)!write(2, m, n);
      _exit(1);
    }
  }
  /* Not ours: the previous action, as if this handler were not there. */
  if (g_prev.sa_flags & SA_SIGINFO) {
    if (g_prev.sa_sigaction) { g_prev.sa_sigaction(sig, info, uc); return; }
  } else if (g_prev.sa_handler != SIG_DFL && g_prev.sa_handler != SIG_IGN && g_prev.sa_handler) {
    g_prev.sa_handler(sig);
    return;
  }
  sigaction(SIGBUS, &g_prev, NULL); /* the fault repeats under the default action */
}

static void install(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_sigbus;
  sa.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGBUS, &sa, &g_prev);
}

void moe8__map_register(const void *p, size_t len, const char *path) {
  if (!p || !len) return;
  pthread_once(&g_once, install);
  pthread_mutex_lock(&g_mu);
  for (int i = 0; i < MAXMAPS; i++)
    if (!atomic_load(&g_maps[i].lo)) {
      g_maps[i].hi = (uintptr_t)p + len;
      const size_t n = strlen(path ? path : "");
      /* keep the end of a long path, which names the file */
      snprintf(g_maps[i].path, PATHLEN, "%s%s", n >= PATHLEN ? "..." : "", path ? path + (n >= PATHLEN ? n - PATHLEN + 4 : 0) : "");
      atomic_store(&g_maps[i].lo, (uintptr_t)p);
      break;
    }
  pthread_mutex_unlock(&g_mu);
}

void moe8__map_unregister(const void *p) {
  if (!p) return;
  pthread_mutex_lock(&g_mu);
  for (int i = 0; i < MAXMAPS; i++)
    if (atomic_load(&g_maps[i].lo) == (uintptr_t)p) atomic_store(&g_maps[i].lo, 0);
  pthread_mutex_unlock(&g_mu);
}
