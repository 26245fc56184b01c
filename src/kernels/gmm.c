/*
** gmm.c — the grouped-matmul and transposed grouped-matmul drivers.
**
** moe8_gmm: validate; zero the rows outside the local groups; cut each
** local group into tasks of at most MT rows × NT columns; run the tasks on
** OpenMP threads with the active table's block kernel.  K is never split,
** so every output element is computed by one kernel call in one order: the
** result does not depend on threads or on the other rows of the call.
**
** moe8_tgmm: dW[g] = lhs_gᵀ · dy_g as a one-group gmm over the transposed
** rows of the group, so it runs on the same per-ISA kernels.
*/
#include "gmm.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

enum { MT = MOE8__GMM_MT, NT = MOE8__GMM_NT };

static bool is_op_dtype(moe8_dtype t) {
  return t == MOE8_DTYPE_F32 || t == MOE8_DTYPE_BF16 || moe8__is_qtype(t);
}

static bool pair_ok(moe8_dtype l, moe8_dtype r) {
  const bool lf = l == MOE8_DTYPE_F32 || l == MOE8_DTYPE_BF16;
  const bool l8 = l == MOE8_DTYPE_F8E4M3 || l == MOE8_DTYPE_F8E5M2;
  const bool r8 = r == MOE8_DTYPE_F8E4M3 || r == MOE8_DTYPE_F8E5M2;
  if (l == MOE8_DTYPE_F32 && r == MOE8_DTYPE_F32) return true;
  if (l == MOE8_DTYPE_BF16 && r == MOE8_DTYPE_BF16) return true;
  if (l8 && r8) return true;
  if (l == MOE8_DTYPE_I8 && r == MOE8_DTYPE_I8) return true;
  return lf && (r8 || r == MOE8_DTYPE_I8); /* weight-only */
}

static const char *dn(moe8_dtype t) {
  const moe8_dtype_traits *i = moe8_dtype_info(t);
  return i ? i->name : "(invalid)";
}

/* Checks one operand's scale description; *kind and *tile out. */
static moe8_status check_scale(const moe8_operand *op, const char *name, bool is_lhs, moe8__sc_kind *kind,
                               int64_t *tile) {
  *tile = 0;
  if (!moe8__is_qtype(op->dtype)) {
    if (op->scale) return moe8__fail(MOE8_ERR_INVALID_ARG, "gmm: %s is %s and takes no scale", name, dn(op->dtype));
    *kind = MOE8__SC_NONE;
    return MOE8_OK;
  }
  if (!op->scale) return moe8__fail(MOE8_ERR_INVALID_ARG, "gmm: %s is %s but has no scale", name, dn(op->dtype));
  switch (op->gran) {
    case MOE8_GRAN_TENSOR: *kind = MOE8__SC_TENSOR; return MOE8_OK;
    case MOE8_GRAN_ROW: if (!is_lhs) break; *kind = MOE8__SC_ROW; return MOE8_OK;
    case MOE8_GRAN_CHANNEL: if (is_lhs) break; *kind = MOE8__SC_ROW; return MOE8_OK;
    case MOE8_GRAN_ROW_TILE:
    case MOE8_GRAN_CHANNEL_TILE:
      if ((op->gran == MOE8_GRAN_ROW_TILE) != is_lhs) break;
      if (op->tile <= 0) return moe8__fail(MOE8_ERR_INVALID_ARG, "gmm: %s scale tile %lld must be > 0", name, (long long)op->tile);
      *kind = MOE8__SC_TILE;
      *tile = op->tile;
      return MOE8_OK;
    default: break;
  }
  return moe8__fail(MOE8_ERR_SHAPE, "gmm: %s scale granularity %d is not valid for a %s operand", name, (int)op->gran,
                    is_lhs ? "lhs [M, K]" : "rhs [G, K, N]");
}

moe8_status moe8_gmm(const moe8_gmm_args *a) { return moe8__gmm(a, NULL, 0); }

size_t moe8_gmm_packed_size(moe8_dtype t, int64_t G, int64_t K, int64_t N) {
  if (G <= 0 || K <= 0 || N <= 0) return 0;
  return (size_t)G * moe8__pk_group_bytes(t, K, N);
}

moe8_status moe8_gmm_pack_rhs(moe8_dtype t, const void *rhs, int64_t G, int64_t K, int64_t N, void *dst) {
  if (t != MOE8_DTYPE_F8E4M3 && t != MOE8_DTYPE_F8E5M2 && t != MOE8_DTYPE_I8)
    return moe8__fail(MOE8_ERR_DTYPE, "gmm_pack_rhs: packing is for f8e4m3, f8e5m2 or i8 weights, not %s", dn(t));
  if (G < 0 || K < 0 || N < 0)
    return moe8__fail(MOE8_ERR_SHAPE, "gmm_pack_rhs: bad sizes G=%lld K=%lld N=%lld", (long long)G, (long long)K, (long long)N);
  const size_t gb = G && K && N ? moe8__pk_group_bytes(t, K, N) : 0;
  if (!gb) return MOE8_OK;
  if (!rhs || !dst) return moe8__fail(MOE8_ERR_INVALID_ARG, "gmm_pack_rhs: NULL rhs or dst");
  /* One (group, k group) row of output at a time: zero codes for the
  ** padding, then every (k, n) of it at its place (gmm.h). */
  const int64_t per = moe8__pk_per(t), w = moe8__pk_width(t), kp = (K + per - 1) / per;
  #pragma omp parallel for collapse(2) num_threads(moe8__nt((double)G * (double)K * (double)N)) schedule(static)
  for (int64_t g = 0; g < G; g++)
    for (int64_t p = 0; p < kp; p++) {
      const uint8_t *src = (const uint8_t *)rhs + (size_t)(g * K * N);
      uint8_t *d = (uint8_t *)dst + (size_t)g * gb;
      for (int64_t c0 = 0; c0 < N; c0 += NT) {
        const int64_t cols = N - c0 < NT ? N - c0 : NT;
        uint8_t *row = d + moe8__pk_row(t, K, N, p, c0);
        memset(row, 0, (size_t)((cols + w - 1) / w * 64));
        for (int64_t kk = 0; kk < per && per * p + kk < K; kk++) {
          const uint8_t *s = src + (size_t)((per * p + kk) * N + c0);
          for (int64_t c = 0; c < cols; c++) row[moe8__pk_col(t, c, kk)] = s[c];
        }
      }
    }
  return MOE8_OK;
}

static size_t al64(size_t n) { return (n + 63) & ~(size_t)63; }

/* moe8_gmm's workspace (the packed rows and the threads' scratch) is kept
** between calls: a fresh block of megabytes costs its page faults on
** every call (1 ms for 2 MiB here, a third of a 1024-row matmul).  One
** block is kept, up to WS_KEEP bytes; a call takes it (or makes a larger
** one) and gives it back, and calls that run at once each get their own
** (the exchange is atomic).  A block larger than WS_KEEP is freed.  docs/kernels.md "Workspace". */
enum { WS_KEEP = 64 << 20, WS_HDR = 64 };
typedef struct ws_block { size_t bytes; } ws_block;
static _Atomic(ws_block *) g_ws_kept;

static void *ws_data(ws_block *w) { return (char *)w + WS_HDR; }

static ws_block *ws_take(size_t need) {
  ws_block *w = atomic_exchange(&g_ws_kept, NULL);
  if (w && w->bytes >= need) return w;
  free(w);
  /* On huge pages where large: a tile of the packed rows spans 16 of
  ** them 4 KiB pages apart, the accumulator rows 512 bytes apart. */
  if (!(w = moe8__alloc_weights(WS_HDR + (need ? need : 64)))) return NULL;
  w->bytes = need;
  return w;
}

static void ws_give(ws_block *w) {
  if (!w) return;
  if (w->bytes > WS_KEEP) { free(w); return; }
  free(atomic_exchange(&g_ws_kept, w));
}

size_t moe8__gmm_ws_size(int64_t M, int64_t K) {
  /* A packed lhs row is at most one 32-bit word per element of K, plus
  ** the padding of the last scale block to a piece (gmm.h). */
  return al64((size_t)(M > 0 ? M : 0) * (size_t)(K > 0 ? K + 16 : 0) * 4) + (size_t)moe8_get_num_threads() * MOE8__GMM_SCRATCH;
}

moe8_status moe8__gmm(const moe8_gmm_args *a, void *ws, size_t ws_bytes) {
  if (!a) return moe8__fail(MOE8_ERR_INVALID_ARG, "gmm: NULL args");
  const int64_t M = a->M, K = a->K, N = a->N, E = a->num_groups, G = a->num_local, off = a->group_offset;
  if (M < 0 || K < 0 || N < 0 || E < 0 || G < 0 || off < 0 || off + G > E)
    return moe8__fail(MOE8_ERR_SHAPE, "gmm: bad sizes M=%lld K=%lld N=%lld groups=%lld offset=%lld local=%lld",
                      (long long)M, (long long)K, (long long)N, (long long)E, (long long)off, (long long)G);
  if (!is_op_dtype(a->lhs.dtype) || !is_op_dtype(a->rhs.dtype) || !pair_ok(a->lhs.dtype, a->rhs.dtype))
    return moe8__fail(MOE8_ERR_DTYPE, "gmm: unsupported operand pair lhs %s · rhs %s", dn(a->lhs.dtype), dn(a->rhs.dtype));
  if (a->out_dtype != MOE8_DTYPE_F32 && a->out_dtype != MOE8_DTYPE_BF16)
    return moe8__fail(MOE8_ERR_DTYPE, "gmm: output must be f32 or bf16, not %s", dn(a->out_dtype));
  if (a->rhs_transposed && (a->rhs.scale || moe8__is_qtype(a->rhs.dtype)))
    return moe8__fail(MOE8_ERR_DTYPE, "gmm: a transposed rhs must be f32 or bf16 without scales, not %s", dn(a->rhs.dtype));
  moe8__sc_kind lk, rk;
  int64_t lt, rt;
  moe8_status st = check_scale(&a->lhs, "lhs", true, &lk, &lt);
  if (st == MOE8_OK) st = check_scale(&a->rhs, "rhs", false, &rk, &rt);
  if (st != MOE8_OK) return st;
  if (lt && rt && lt != rt)
    return moe8__fail(MOE8_ERR_SHAPE, "gmm: lhs tile %lld and rhs tile %lld differ", (long long)lt, (long long)rt);
  if (E > 0 && !a->group_sizes) return moe8__fail(MOE8_ERR_INVALID_ARG, "gmm: NULL group_sizes");
  int64_t total = 0;
  for (int64_t g = 0; g < E; g++) {
    if (a->group_sizes[g] < 0)
      return moe8__fail(MOE8_ERR_SHAPE, "gmm: group_sizes[%lld] = %d is negative", (long long)g, a->group_sizes[g]);
    total += a->group_sizes[g];
  }
  if (total > M)
    return moe8__fail(MOE8_ERR_SHAPE, "gmm: group sizes add up to %lld rows but lhs has M = %lld", (long long)total,
                      (long long)M);
  if (M > 0 && N > 0 && !a->out) return moe8__fail(MOE8_ERR_INVALID_ARG, "gmm: NULL out");
  if (M > 0 && K > 0 && !a->lhs.data) return moe8__fail(MOE8_ERR_INVALID_ARG, "gmm: NULL lhs");
  if (G > 0 && K > 0 && N > 0 && !a->rhs.data && !a->rhs_packed) return moe8__fail(MOE8_ERR_INVALID_ARG, "gmm: NULL rhs");
  if (M == 0 || N == 0) return MOE8_OK;

  const int64_t kb = lt ? lt : rt ? rt : (K > 0 ? K : 1);
  const int64_t nbk = K > 0 ? moe8__cdiv(K, kb) : 0;
  if (a->rhs_packed) {
    const bool i8 = a->rhs.dtype == MOE8_DTYPE_I8;
    if (!i8 && a->rhs.dtype != MOE8_DTYPE_F8E4M3 && a->rhs.dtype != MOE8_DTYPE_F8E5M2)
      return moe8__fail(MOE8_ERR_DTYPE, "gmm: a packed rhs holds FP8 or i8 codes; rhs.dtype is %s", dn(a->rhs.dtype));
    if (a->rhs_transposed) return moe8__fail(MOE8_ERR_INVALID_ARG, "gmm: a packed rhs cannot be transposed");
    if (nbk > 1 && kb % (i8 ? 4 : 2))
      return moe8__fail(MOE8_ERR_SHAPE, "gmm: a packed %s rhs needs a scale block along K that is a multiple of %d, not %lld",
                        dn(a->rhs.dtype), i8 ? 4 : 2, (long long)kb);
  }
  const size_t pk_bytes = a->rhs_packed && K > 0 && N > 0 ? moe8__pk_group_bytes(a->rhs.dtype, K, N) : 0;
  const size_t osz = moe8__dtype_size(a->out_dtype), rsz = moe8__dtype_size(a->rhs.dtype);
  int64_t lo = 0;
  for (int64_t g = 0; g < off; g++) lo += a->group_sizes[g];
  int64_t hi = lo;
  for (int64_t g = off; g < off + G; g++) hi += a->group_sizes[g];
  /* Rows outside the local groups are zero (docs/layer.md). */
  memset(a->out, 0, (size_t)(lo * N) * osz);
  memset((char *)a->out + (size_t)(hi * N) * osz, 0, (size_t)((M - hi) * N) * osz);

  const moe8__ktable *kt = moe8__kernels();
  if (a->order != MOE8_ORDER_DEFAULT && a->order != MOE8_ORDER_CANONICAL && a->order != MOE8_ORDER_NATIVE)
    return moe8__fail(MOE8_ERR_INVALID_ARG, "gmm: order %d is not an order (default, canonical, native)", (int)a->order);
  /* The canonical order (gmm.h) for a bf16 or FP8 lhs when asked for, and
  ** always on a table with tiles. */
  const moe8_dtype l0 = a->lhs.dtype;
  const bool canon = (l0 == MOE8_DTYPE_BF16 || l0 == MOE8_DTYPE_F8E4M3 || l0 == MOE8_DTYPE_F8E5M2) &&
                     moe8_order_effective(a->order) == MOE8_ORDER_CANONICAL;
  const bool stream = (size_t)(hi - lo) * (size_t)N * osz >= MOE8__GMM_STREAM_BYTES;
  /* Tasks: (group, row tile, column tile), handed to the threads in chunks
  ** of consecutive column tiles of one row tile, so that a task knows the
  ** tile its thread reads next.  A row tile's columns are split into
  ** several chunks only when there are fewer than two row tiles a thread
  ** (then into at least 8 chunks a thread where the columns allow it): at
  ** prefill each thread that takes a chunk packs the tile's rows again
  ** (5-11% of the call), so 8 experts on two threads measured 3-8%
  ** faster whole (docs/performance.md). */
  const int64_t ncol = moe8__cdiv(N, NT);
  int64_t nrt = 0;
  for (int64_t g = off; g < off + G; g++) nrt += moe8__cdiv(a->group_sizes[g], MT);
  /* The lhs, packed once for the whole call when the table wants it. */
  const moe8__gmm_block proto = {
    .K = K, .N = N, .kb = kb, .nbk = nbk, .lt = a->lhs.dtype, .rt = a->rhs.dtype, .ot = a->out_dtype,
    .lhs = a->lhs.data, .rhs = a->rhs.data, .rhs_t = a->rhs_transposed, .ls = a->lhs.scale, .lk = lk,
    .canon = canon,
  };
  const size_t row_bytes = K > 0 && kt->gmm_pack_size ? kt->gmm_pack_size(&proto) : 0;
  const size_t pack_bytes = al64(row_bytes * (size_t)M);
  int nth = moe8__nt(2.0 * (double)(hi - lo) * (double)N * (double)K);
  /* Packed rows per thread (local): each thread packs the row tile its
  ** chunk is in into its own slice of the workspace, which stays in its
  ** L2 while the tile's column tasks read it, instead of the whole call's
  ** rows into one buffer first (a pass that wrote them to memory and read
  ** them back: 12-16% of the int8 prefill matmul on an AMX Xeon).  Chosen
  ** when the threads' slices are smaller than the whole, i.e. prefill. */
  int64_t rt_max = 0;
  for (int64_t g = off; g < off + G; g++) rt_max = a->group_sizes[g] > rt_max ? a->group_sizes[g] : rt_max;
  const size_t tile_bytes = al64(row_bytes * (size_t)(rt_max < MT ? rt_max : MT));
  const bool local = row_bytes && (size_t)nth * tile_bytes < pack_bytes &&
                     (!ws || ws_bytes >= (size_t)nth * (tile_bytes + MOE8__GMM_SCRATCH));
  ws_block *owned = NULL;
  if (!ws) {
    /* The public call: the packed rows and the threads' scratch in one
    ** block, kept for the next call (ws_take). */
    const size_t need = local ? (size_t)nth * (tile_bytes + MOE8__GMM_SCRATCH) : (row_bytes ? pack_bytes : 0) + (size_t)nth * MOE8__GMM_SCRATCH;
    if (!(owned = ws_take(need))) return moe8__fail(MOE8_ERR_NOMEM, "gmm: out of memory for a %zu-byte workspace", need);
    ws = ws_data(owned);
    ws_bytes = need;
  }
  void *packed = NULL;
  if (row_bytes && !local) {
    if (ws_bytes >= pack_bytes + MOE8__GMM_SCRATCH) packed = ws;
    else return moe8__fail(MOE8_ERR_INVALID_ARG, "gmm: workspace of %zu bytes, need %zu (moe8__gmm_ws_size)", ws_bytes,
                           pack_bytes + MOE8__GMM_SCRATCH); /* a caller's ws only: an owned one has room */
    #pragma omp parallel for num_threads(moe8__nt(2.0 * (double)(hi - lo) * (double)K)) schedule(static)
    for (int64_t m = lo; m < hi; m += 64) kt->gmm_pack(&proto, m, m + 64 < hi ? m + 64 : hi, packed);
    ws = (char *)ws + pack_bytes;
    ws_bytes -= pack_bytes;
  }
  /* One slice per thread (its packed rows when local, then its
  ** MOE8__GMM_SCRATCH), no allocation. */
  const size_t slice = (local ? tile_bytes : 0) + MOE8__GMM_SCRATCH;
  const int fit = (int)(ws_bytes / slice);
  if (fit < 1) {
    ws_give(owned);
    return moe8__fail(MOE8_ERR_INVALID_ARG, "gmm: workspace of %zu bytes is smaller than one thread's scratch", ws_bytes);
  }
  if (nth > fit) nth = fit;
  int64_t per = ncol;
  if (nth > 1 && nrt > 0 && nrt < 2 * nth) per = moe8__cdiv(ncol, moe8__cdiv(8 * nth, nrt));
  if (per < 1) per = 1;
  const int64_t parts = ncol > 0 ? moe8__cdiv(ncol, per) : 1, nchunks = ncol > 0 ? nrt * parts : 0;
  #pragma omp parallel num_threads(nth)
  {
#ifdef _OPENMP
    char *mine = (char *)ws + (size_t)omp_get_thread_num() * slice;
#else
    char *mine = ws;
#endif
    void *scratch = mine + (local ? tile_bytes : 0);
    int64_t held = -1; /* local: the row tile (c / parts) whose rows mine holds */
    #pragma omp for schedule(dynamic, 1)
    for (int64_t c = 0; c < nchunks; c++) {
      /* Find the chunk's group and row tile by walking the local groups. */
      int64_t rem = c / parts, row0 = lo, g = off;
      for (; g < off + G; g++) {
        const int64_t n_r = moe8__cdiv(a->group_sizes[g], MT);
        if (rem < n_r) break;
        rem -= n_r;
        row0 += a->group_sizes[g];
      }
      const int64_t mi = rem, c0 = c % parts * per, c1 = c0 + per < ncol ? c0 + per : ncol;
      const uint8_t *pk = a->rhs_packed ? (const uint8_t *)a->rhs_packed + (size_t)(g - off) * pk_bytes : NULL;
      /* The chunk's row tile: rows r0 .. r1 of the call. */
      const int64_t r0 = row0 + mi * MT, r1 = r0 + MT < row0 + a->group_sizes[g] ? r0 + MT : row0 + a->group_sizes[g];
      const void *lhs_pk = local ? mine : packed;
      if (local && c / parts != held) { /* the tile's rows at mine, pk_row0 = r0 */
        moe8__gmm_block pp = proto;
        pp.pk_row0 = r0;
        for (int64_t m = r0; m < r1; m += 64) kt->gmm_pack(&pp, m, m + 64 < r1 ? m + 64 : r1, mine);
        held = c / parts;
      }
      for (int64_t ni = c0; ni < c1; ni++) {
        moe8__gmm_block b = {
          .K = K, .N = N, .kb = kb, .nbk = nbk,
          .m0 = r0, .m1 = r1, .n0 = ni * NT,
          .lt = a->lhs.dtype, .rt = a->rhs.dtype, .ot = a->out_dtype,
          .lhs = a->lhs.data,
          .rhs = a->rhs_packed ? NULL : (const char *)a->rhs.data + (size_t)((g - off) * K * N) * rsz,
          .rhs_pk = pk,
          .rhs_t = a->rhs_transposed,
          .ls = a->lhs.scale, .lk = lk,
          .rs = rk == MOE8__SC_TENSOR ? a->rhs.scale
                : rk == MOE8__SC_ROW ? a->rhs.scale + (g - off) * N
                : rk == MOE8__SC_TILE ? a->rhs.scale + (g - off) * nbk * N : NULL,
          .rk = rk, .out = a->out, .scratch = scratch, .lhs_packed = lhs_pk, .pk_row0 = local ? r0 : 0, .canon = canon, .out_stream = stream,
        };
        if (pk && ni + 1 < c1) {
          /* The next task's tile follows this one in the packed group. */
          b.pk_next = pk + moe8__pk_row(a->rhs.dtype, K, N, 0, (ni + 1) * NT);
          b.pk_next_bytes = (ni + 2 < ncol ? pk + moe8__pk_row(a->rhs.dtype, K, N, 0, (ni + 2) * NT) : pk + pk_bytes) - b.pk_next;
        }
        b.n1 = b.n0 + NT < N ? b.n0 + NT : N;
        if (K == 0) {
          for (int64_t m = b.m0; m < b.m1; m++) memset((char *)a->out + (size_t)(m * N + b.n0) * osz, 0, (size_t)(b.n1 - b.n0) * osz);
        } else {
          kt->gmm_block(&b);
        }
      }
    }
  }
  ws_give(owned);
  return MOE8_OK;
}

moe8_status moe8_tgmm(const moe8_operand *lhs, const moe8_operand *dy, int64_t M, int64_t K, int64_t N,
                      int64_t E, const int32_t *group_sizes, int64_t off, int64_t G, float *out) {
  if (!lhs || !dy) return moe8__fail(MOE8_ERR_INVALID_ARG, "tgmm: NULL operand");
  if (M < 0 || K < 0 || N < 0 || E < 0 || G < 0 || off < 0 || off + G > E)
    return moe8__fail(MOE8_ERR_SHAPE, "tgmm: bad sizes M=%lld K=%lld N=%lld groups=%lld offset=%lld local=%lld",
                      (long long)M, (long long)K, (long long)N, (long long)E, (long long)off, (long long)G);
  for (int i = 0; i < 2; i++) {
    const moe8_operand *o = i ? dy : lhs;
    if ((o->dtype != MOE8_DTYPE_F32 && o->dtype != MOE8_DTYPE_BF16) || o->scale)
      return moe8__fail(MOE8_ERR_DTYPE, "tgmm: %s must be f32 or bf16 without scale, not %s", i ? "dy" : "lhs", dn(o->dtype));
  }
  if (E > 0 && !group_sizes) return moe8__fail(MOE8_ERR_INVALID_ARG, "tgmm: NULL group_sizes");
  int64_t total = 0, lo = 0;
  for (int64_t g = 0; g < E; g++) {
    if (group_sizes[g] < 0) return moe8__fail(MOE8_ERR_SHAPE, "tgmm: group_sizes[%lld] is negative", (long long)g);
    total += group_sizes[g];
    if (g < off) lo += group_sizes[g];
  }
  if (total > M) return moe8__fail(MOE8_ERR_SHAPE, "tgmm: group sizes add up to %lld rows but M = %lld", (long long)total, (long long)M);
  if (G * K * N > 0 && !out) return moe8__fail(MOE8_ERR_INVALID_ARG, "tgmm: NULL out");
  /* dW[g] = lhs_gᵀ · dy_g is a one-group gmm whose contraction runs over the
  ** group's rows: transpose lhs_g to [K, rows] and reuse the gmm kernels.
  ** Mixed f32/bf16 operands meet in f32 (bf16 -> f32 is exact). */
  const moe8_dtype ct = lhs->dtype == dy->dtype ? lhs->dtype : MOE8_DTYPE_F32;
  const size_t cs = moe8__dtype_size(ct);
  int64_t maxr = 0;
  for (int64_t g = off; g < off + G; g++) maxr = group_sizes[g] > maxr ? group_sizes[g] : maxr;
  void *lt = malloc((size_t)(K * maxr) * cs + 64), *dc = NULL;
  if (ct != dy->dtype) dc = malloc((size_t)(maxr * N) * cs + 64);
  if (!lt || (ct != dy->dtype && !dc)) { free(lt); free(dc); return moe8__fail(MOE8_ERR_NOMEM, "tgmm: out of memory"); }
  moe8_status st = MOE8_OK;
  int64_t row0 = lo;
  for (int64_t g = off; g < off + G && st == MOE8_OK; g++) {
    const int64_t r = group_sizes[g];
    for (int64_t m = 0; m < r; m++)
      for (int64_t k = 0; k < K; k++) {
        const int64_t si = (row0 + m) * K + k, di = k * r + m;
        if (ct == lhs->dtype) memcpy((char *)lt + (size_t)di * cs, (const char *)lhs->data + (size_t)si * cs, cs);
        else ((float *)lt)[di] = moe8_bf16_to_f32(((const uint16_t *)lhs->data)[si]);
      }
    const void *dyg = (const char *)dy->data + (size_t)(row0 * N) * moe8__dtype_size(dy->dtype);
    if (dc) { st = moe8_convert(dc, ct, dyg, dy->dtype, (size_t)(r * N), 0); dyg = dc; }
    const int32_t gsz[1] = {(int32_t)K};
    const moe8_gmm_args a = {.M = K, .K = r, .N = N, .num_groups = 1, .group_sizes = gsz, .num_local = 1,
                             .lhs = {ct, lt, NULL, MOE8_GRAN_TENSOR, 0}, .rhs = {ct, dyg, NULL, MOE8_GRAN_TENSOR, 0},
                             .out_dtype = MOE8_DTYPE_F32, .out = out + (g - off) * K * N};
    if (st == MOE8_OK) st = moe8_gmm(&a);
    row0 += r;
  }
  free(lt);
  free(dc);
  return st;
}
