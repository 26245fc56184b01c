/*
** peer.h — peers run in the same process as moe8's benchmarks.
**
** They live in a module of their own, libmoe8_peers.so (peer_blas.c with
** OpenBLAS, peer_dnnl.c with oneDNN, each built when its library is found),
** which the bench opens when it runs (peer_load.c): the moe8 command links
** neither library, so run, quantize and info never start a BLAS thread
** pool.  The module is looked for in MOE8_PEERS, beside the command's
** ../lib/moe8/, and in the build tree.
*/
#ifndef MOE8_PEER_H
#define MOE8_PEER_H

#include <stdint.h>

/* In the module. */
int    peer_dnnl_available(void);
enum { PEER_MAXROT = 16 };
double peer_dnnl_gmm(int int8, const int32_t *rows, int64_t E, int64_t K, int64_t N, int reps, int nrot);
int    peer_blas_available(void);
/* Best (and median) seconds of runs of the per-expert sgemm loop. */
double peer_blas_gmm(const float *x, const float *w, float *out, const int32_t *gs, int64_t E, int64_t D, int64_t F, int threads,
                     int runs, double *median);

/* In the command: the module's entries, or NULL where it (or a peer) is missing. */
typedef struct peers {
  double (*dnnl_gmm)(int int8, const int32_t *rows, int64_t E, int64_t K, int64_t N, int reps, int nrot);
  double (*blas_gmm)(const float *x, const float *w, float *out, const int32_t *gs, int64_t E, int64_t D, int64_t F, int threads,
                     int runs, double *median);
  const char *why; /* why the module is not there (NULL when it is) */
} peers;

const peers *peers_load(void);

#endif
