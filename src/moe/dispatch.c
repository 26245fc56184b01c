/*
** dispatch.c — the ragged sort, row gathers and the combine of docs/layer.md
**
** The sort is a stable counting sort: row p of expert e's group holds the
** assignments of e in increasing assignment order a = t·K_top + j, so
** token_of and slot_of are determined by the routing alone.  The combine
** sums each token's slots in order j = 0, 1, ... and partitions work by
** token rows only (at least one row per partition, whatever the thread
** count), so it is bitwise independent of threads.
*/
#include "../core/internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

moe8_status moe8_dispatch_sort(const int32_t *ids, int64_t T, int64_t K, int64_t E, float capacity_factor,
                               moe8_dispatch *d) {
  return moe8__dispatch_sort(ids, T, K, E, 0, capacity_factor, false, d);
}

moe8_status moe8__dispatch_sort(const int32_t *ids, int64_t T, int64_t K, int64_t E, int64_t zero, float capacity_factor,
                                bool skip_negative, moe8_dispatch *d) {
  if (!d) return moe8__fail(MOE8_ERR_INVALID_ARG, "dispatch: NULL output");
  if (T < 0 || K <= 0 || E <= 0 || zero < 0 || K > E + zero || T * K > INT32_MAX)
    return moe8__fail(MOE8_ERR_SHAPE, "dispatch: bad sizes T=%lld top_k=%lld E=%lld", (long long)T, (long long)K,
                      (long long)E);
  const int64_t A = T * K;
  if ((A > 0 && (!ids || !d->token_of || !d->slot_of || !d->pos_of)) || !d->group_sizes || !d->offsets)
    return moe8__fail(MOE8_ERR_INVALID_ARG, "dispatch: NULL buffer");
  for (int64_t a = 0; a < A; a++)
    if ((ids[a] < 0 && !skip_negative) || ids[a] >= E + zero)
      return moe8__fail(MOE8_ERR_SHAPE, "dispatch: expert_ids[%lld] (token %lld, slot %lld) = %d is outside [0, %lld)%s",
                        (long long)a, (long long)(a / K), (long long)(a % K), ids[a], (long long)(E + zero),
                        skip_negative ? " (negative ids are skipped)" : "");
  int64_t cap = INT64_MAX;
  if (capacity_factor > 0.0f) cap = (int64_t)ceil((double)A / (double)E * (double)capacity_factor);
  for (int64_t e = 0; e < E; e++) d->group_sizes[e] = 0;
  for (int64_t a = 0; a < A; a++)
    if (ids[a] >= 0 && ids[a] < E && d->group_sizes[ids[a]] < cap) d->group_sizes[ids[a]]++;
  d->offsets[0] = 0;
  for (int64_t e = 0; e < E; e++) d->offsets[e + 1] = d->offsets[e] + d->group_sizes[e];
  d->num_rows = d->offsets[E];
  /* Second pass: place in order; group_sizes doubles as the fill counter
  ** (no allocation) and ends equal to the kept counts again. */
  for (int64_t e = 0; e < E; e++) d->group_sizes[e] = 0;
  for (int64_t a = 0; a < A; a++) {
    const int32_t e = ids[a];
    if (e < 0 || e >= E) { d->pos_of[a] = -1; continue; } /* skipped by the caller, or an identity expert's */
    const int64_t p = d->offsets[e] + d->group_sizes[e];
    if (p < d->offsets[e + 1]) {
      d->group_sizes[e]++;
      d->token_of[p] = (int32_t)(a / K);
      d->slot_of[p] = (int32_t)(a % K);
      d->pos_of[a] = (int32_t)p;
    } else {
      d->pos_of[a] = -1;
    }
  }
  return MOE8_OK;
}

moe8_status moe8_gather_rows(void *dst, const void *src, size_t row_bytes, const int32_t *index, int64_t n,
                             int64_t src_rows) {
  if (n < 0 || src_rows < 0) return moe8__fail(MOE8_ERR_SHAPE, "gather: negative size");
  if (n == 0 || row_bytes == 0) return MOE8_OK;
  if (!dst || !src || !index) return moe8__fail(MOE8_ERR_INVALID_ARG, "gather: NULL buffer");
  for (int64_t p = 0; p < n; p++)
    if (index[p] < 0 || index[p] >= src_rows)
      return moe8__fail(MOE8_ERR_SHAPE, "gather: index[%lld] = %d is outside [0, %lld)", (long long)p, index[p],
                        (long long)src_rows);
  #pragma omp parallel for num_threads(moe8__nt((double)n * (double)row_bytes / 4.0)) schedule(static)
  for (int64_t p = 0; p < n; p++)
    memcpy((char *)dst + (size_t)p * row_bytes, (const char *)src + (size_t)index[p] * row_bytes, row_bytes);
  return MOE8_OK;
}

moe8_status moe8_gather_qrows(void *dst_q, float *dst_scale, bool *scale_gathered, const void *src_q,
                              const float *src_scale, int64_t rows, int64_t cols, int64_t scale_rows,
                              int64_t scale_cols, const int32_t *index, int64_t n) {
  if (rows < 0 || cols < 0 || n < 0 || scale_rows < 1 || scale_cols < 1)
    return moe8__fail(MOE8_ERR_SHAPE, "gather: bad sizes: qvalue [%lld, %lld], scale [%lld, %lld]", (long long)rows,
                      (long long)cols, (long long)scale_rows, (long long)scale_cols);
  if (!dst_scale || !src_scale || !scale_gathered) return moe8__fail(MOE8_ERR_INVALID_ARG, "gather: NULL scale buffer");
  const bool per_row = scale_rows == rows;
  if (!per_row && !(scale_rows == 1 && (scale_cols == 1 || scale_cols == cols)))
    return moe8__fail(MOE8_ERR_SHAPE,
                      "gather: scale shape [%lld, %lld] fits neither one row per token ([%lld, *]) nor a per-tensor "
                      "[1, 1] or per-channel [1, %lld] scale of qvalue [%lld, %lld]",
                      (long long)scale_rows, (long long)scale_cols, (long long)rows, (long long)cols,
                      (long long)rows, (long long)cols);
  moe8_status st = moe8_gather_rows(dst_q, src_q, (size_t)cols, index, n, rows);
  if (st != MOE8_OK) return st;
  *scale_gathered = per_row;
  if (per_row) return moe8_gather_rows(dst_scale, src_scale, (size_t)scale_cols * sizeof(float), index, n, rows);
  memcpy(dst_scale, src_scale, (size_t)(scale_rows * scale_cols) * sizeof(float));
  return MOE8_OK;
}

moe8_status moe8_combine(const float *y, int64_t rows, const int32_t *pos_of, const float *w, int64_t T,
                         int64_t K, int64_t D, float *out) {
  if (T < 0 || K <= 0 || D < 0 || rows < 0)
    return moe8__fail(MOE8_ERR_SHAPE, "combine: bad sizes T=%lld top_k=%lld D=%lld rows=%lld", (long long)T,
                      (long long)K, (long long)D, (long long)rows);
  if (T == 0 || D == 0) return MOE8_OK;
  if (!pos_of || !out || (rows > 0 && !y)) return moe8__fail(MOE8_ERR_INVALID_ARG, "combine: NULL buffer");
  for (int64_t a = 0; a < T * K; a++)
    if (pos_of[a] >= rows)
      return moe8__fail(MOE8_ERR_SHAPE, "combine: pos_of[%lld] = %d is outside [0, %lld)", (long long)a, pos_of[a],
                        (long long)rows);
  #pragma omp parallel for num_threads(moe8__nt(2.0 * (double)T * (double)K * (double)D)) schedule(static)
  for (int64_t t = 0; t < T; t++) moe8__combine_row(out + t * D, y, pos_of + t * K, w ? w + t * K : NULL, K, D);
  return MOE8_OK;
}

void moe8__combine_row(float *o, const float *y, const int32_t *pos, const float *w, int64_t K, int64_t D) {
  for (int64_t d = 0; d < D; d++) o[d] = 0.0f;
  for (int64_t j = 0; j < K; j++) {
    if (pos[j] < 0) continue;
    const float wj = w ? w[j] : 1.0f;
    const float *yr = y + (int64_t)pos[j] * D;
    for (int64_t d = 0; d < D; d++) o[d] += wj * yr[d];
  }
}
