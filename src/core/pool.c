/*
** pool.c — large scratch buffers kept for the next call (a training
** layer's backward).
**
** The backward of a layer needs buffers as large as its weights (the
** dequantized weights of the straight-through estimator, their gradient
** in the kernels' layout) and as its routed rows.  malloc gives blocks
** this large fresh pages from the kernel at every call, which the kernel
** clears page by page and, with several threads, unmaps with a shootdown
** of every core's TLB: a third of a training step's time (measured,
** docs/performance.md).  A pool keeps the blocks a call gave back and
** hands them to the next call of about the same size.  It is shared by
** the threads that use the layer (a mutex around its list); a block is
** reused when it is at least the size asked for and at most twice that
** plus 1 MiB, and the pool keeps at most POOL_KEEP blocks, dropping the
** smallest when it would keep more.  Everything is freed with the pool.
*/
#include "internal.h"

#include <stdlib.h>

enum { POOL_KEEP = 24, POOL_HEAD = 64 };

typedef struct pool_blk {
  size_t           size; /* usable bytes after the header */
  struct pool_blk *next;
} pool_blk;

void moe8__pool_init(moe8__pool *p) {
  pthread_mutex_init(&p->mu, NULL);
  p->free = NULL;
  p->n = 0;
}

void moe8__pool_destroy(moe8__pool *p) {
  for (pool_blk *b = p->free, *nx; b; b = nx) nx = b->next, free(b);
  p->free = NULL;
  p->n = 0;
  pthread_mutex_destroy(&p->mu);
}

void *moe8__pool_get(moe8__pool *p, size_t bytes) {
  pool_blk *best = NULL, **bestp = NULL;
  pthread_mutex_lock(&p->mu);
  for (pool_blk **q = (pool_blk **)&p->free; *q; q = &(*q)->next)
    if ((*q)->size >= bytes && (*q)->size <= 2 * bytes + ((size_t)1 << 20) && (!best || (*q)->size < best->size)) best = *q, bestp = q;
  if (best) *bestp = best->next, p->n--;
  pthread_mutex_unlock(&p->mu);
  if (!best) {
    if (bytes > SIZE_MAX - POOL_HEAD) return NULL;
    best = moe8__alloc_weights(bytes + POOL_HEAD);
    if (!best) return NULL;
    best->size = bytes;
  }
  return (char *)best + POOL_HEAD;
}

void moe8__pool_put(moe8__pool *p, void *q) {
  if (!q) return;
  pool_blk *b = (pool_blk *)((char *)q - POOL_HEAD), *drop = NULL;
  pthread_mutex_lock(&p->mu);
  b->next = p->free;
  p->free = b;
  if (++p->n > POOL_KEEP) {
    pool_blk **dp = NULL;
    for (pool_blk **s = (pool_blk **)&p->free; *s; s = &(*s)->next)
      if (!dp || (*s)->size < (*dp)->size) dp = s;
    drop = *dp, *dp = drop->next, p->n--;
  }
  pthread_mutex_unlock(&p->mu);
  free(drop);
}
