/* peer_none.c — built without oneDNN: the peer is skipped with a notice. */
#include "peer.h"

int peer_dnnl_available(void) { return 0; }

double peer_dnnl_gmm(int int8, const int32_t *rows, int64_t E, int64_t K, int64_t N, int reps, int nrot) {
  (void)int8; (void)rows; (void)E; (void)K; (void)N; (void)reps; (void)nrot;
  return -1;
}
