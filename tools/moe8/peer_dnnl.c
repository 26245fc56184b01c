/*
** peer_dnnl.c — oneDNN as a peer of 'moe8 bench gmm': a matmul primitive
** per expert (bf16 x bf16 -> f32, or s8 x s8 -> s32), weights reordered
** once into oneDNN's preferred layout outside the timing, as a user who
** pre-packs would do; nrot copies of them, used in turn, so that at decode
** each run reads its weights from memory as moe8's runs do.  Built when
** libdnnl is found.
*/
#include "peer.h"

#include <oneapi/dnnl/dnnl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int peer_dnnl_available(void) { return 1; }

/* Times the per-expert loop: rows[e] rows of x (K wide) times w_e [K, N],
** run r on weight copy r mod nrot (nrot <= PEER_MAXROT).  Returns the best
** of reps in seconds, or -1 on any oneDNN error. */
double peer_dnnl_gmm(int int8, const int32_t *rows, int64_t E, int64_t K, int64_t N, int reps, int nrot) {
  if (nrot < 1) nrot = 1;
  if (nrot > PEER_MAXROT) nrot = PEER_MAXROT;
  dnnl_engine_t eng = NULL;
  dnnl_stream_t str = NULL;
  if (dnnl_engine_create(&eng, dnnl_cpu, 0) != dnnl_success) return -1;
  if (dnnl_stream_create(&str, eng, dnnl_stream_default_flags) != dnnl_success) { dnnl_engine_destroy(eng); return -1; }
  const dnnl_data_type_t in = int8 ? dnnl_s8 : dnnl_bf16, out = int8 ? dnnl_s32 : dnnl_f32;
  const size_t es = int8 ? 1 : 2;
  int64_t M = 0;
  for (int64_t e = 0; e < E; e++) M += rows[e];
  void *x = calloc((size_t)(M * K + 64), es), *y = calloc((size_t)(M * N + 64), 4), *w = calloc((size_t)(K * N), es);
  dnnl_primitive_t *prim = calloc((size_t)E, sizeof *prim);
  dnnl_memory_t *msrc = calloc((size_t)E, sizeof *msrc), *mwei = calloc((size_t)(E * nrot), sizeof *mwei), *mdst = calloc((size_t)E, sizeof *mdst);
  double best = -1;
  int ok = x && y && w && prim && msrc && mwei && mdst;
  for (size_t i = 0; ok && i < (size_t)(K * N) * es; i++) ((unsigned char *)w)[i] = (unsigned char)(i * 7 % 61);
  int64_t off = 0;
  for (int64_t e = 0; ok && e < E; e++) {
    if (!rows[e]) continue;
    dnnl_memory_desc_t a_md, b_md, c_md, b_any;
    dnnl_dims_t ad = {rows[e], K}, bd = {K, N}, cd = {rows[e], N};
    dnnl_matmul_desc_t md;
    dnnl_primitive_desc_t pd = NULL;
    ok = dnnl_memory_desc_init_by_tag(&a_md, 2, ad, in, dnnl_ab) == dnnl_success &&
         dnnl_memory_desc_init_by_tag(&b_md, 2, bd, in, dnnl_ab) == dnnl_success &&
         dnnl_memory_desc_init_by_tag(&b_any, 2, bd, in, dnnl_format_tag_any) == dnnl_success &&
         dnnl_memory_desc_init_by_tag(&c_md, 2, cd, out, dnnl_ab) == dnnl_success &&
         dnnl_matmul_desc_init(&md, &a_md, &b_any, NULL, &c_md) == dnnl_success &&
         dnnl_primitive_desc_create(&pd, &md, NULL, eng, NULL) == dnnl_success &&
         dnnl_primitive_create(&prim[e], pd) == dnnl_success;
    if (ok) {
      /* Weights: plain -> the primitive's layout, once per copy. */
      const dnnl_memory_desc_t *bw = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
      dnnl_memory_t plain = NULL;
      dnnl_primitive_desc_t rpd = NULL;
      dnnl_primitive_t reorder = NULL;
      ok = dnnl_memory_create(&plain, &b_md, eng, w) == dnnl_success &&
           dnnl_reorder_primitive_desc_create(&rpd, &b_md, eng, bw, eng, NULL) == dnnl_success &&
           dnnl_primitive_create(&reorder, rpd) == dnnl_success;
      for (int c = 0; ok && c < nrot; c++) {
        ok = dnnl_memory_create(&mwei[c * E + e], bw, eng, DNNL_MEMORY_ALLOCATE) == dnnl_success;
        dnnl_exec_arg_t ra[2] = {{DNNL_ARG_FROM, plain}, {DNNL_ARG_TO, mwei[c * E + e]}};
        ok = ok && dnnl_primitive_execute(reorder, str, 2, ra) == dnnl_success && dnnl_stream_wait(str) == dnnl_success;
      }
      if (reorder) dnnl_primitive_destroy(reorder);
      if (rpd) dnnl_primitive_desc_destroy(rpd);
      if (plain) dnnl_memory_destroy(plain);
      ok = ok && dnnl_memory_create(&msrc[e], &a_md, eng, (char *)x + (size_t)(off * K) * es) == dnnl_success &&
           dnnl_memory_create(&mdst[e], &c_md, eng, (char *)y + (size_t)(off * N) * 4) == dnnl_success;
    }
    if (pd) dnnl_primitive_desc_destroy(pd);
    off += rows[e];
  }
  for (int r = 0; ok && r < reps + 1; r++) {
    const double t0 = now();
    for (int64_t e = 0; ok && e < E; e++) {
      if (!rows[e]) continue;
      dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, msrc[e]}, {DNNL_ARG_WEIGHTS, mwei[r % nrot * E + e]}, {DNNL_ARG_DST, mdst[e]}};
      ok = dnnl_primitive_execute(prim[e], str, 3, args) == dnnl_success;
    }
    ok = ok && dnnl_stream_wait(str) == dnnl_success;
    const double t = now() - t0;
    if (r > 0 && (best < 0 || t < best)) best = t;
  }
  for (int64_t e = 0; e < E && prim; e++) {
    if (prim[e]) dnnl_primitive_destroy(prim[e]);
    if (msrc && msrc[e]) dnnl_memory_destroy(msrc[e]);
    for (int c = 0; mwei && c < nrot; c++)
      if (mwei[c * E + e]) dnnl_memory_destroy(mwei[c * E + e]);
    if (mdst && mdst[e]) dnnl_memory_destroy(mdst[e]);
  }
  free(prim); free(msrc); free(mwei); free(mdst); free(x); free(y); free(w);
  dnnl_stream_destroy(str);
  dnnl_engine_destroy(eng);
  return ok ? best : -1;
}
