/*
** peer.h — peers run in the same process as moe8's benchmarks.
*/
#ifndef MOE8_PEER_H
#define MOE8_PEER_H

#include <stdint.h>

/* oneDNN per-expert matmul loop (peer_dnnl.c, or peer_none.c without it). */
int    peer_dnnl_available(void);
double peer_dnnl_gmm(int int8, const int32_t *rows, int64_t E, int64_t K, int64_t N, int reps);

#endif
