/*
** gmm.h — the contract between the grouped-matmul driver (kernels/gmm.c)
** and the per-ISA block kernels of the kernel table.
**
** The driver validates the call, zeroes rows outside the local groups, and
** cuts the work into tasks of (group, row range, column range); K is never
** split.  A block kernel computes out[m0:m1, n0:n1] of one group:
**
**   for each scale block b along K (length kb; the last may be partial):
**     bsum[m, n] = Σ_{k in b} lhs[m, k] · rhs[k, n]    (i32 for i8·i8, else f32)
**     acc[m, n]  = acc[m, n] + (float)bsum[m, n] · (ls(m, b) · rs(b, n))
**   out[m, n] = acc (f32) or round-to-nearest-even(acc) (bf16)
**
** acc starts at 0.  The scale product is an f32 product and the update is a
** multiply then an add, never fused, so integer paths agree bit for bit
** across ISAs.  Within a block the order of the float sum is the canonical
** one (below) when b->canon, else the kernel's own; it depends only on k,
** never on m0, m1, n0, n1: a row's result is the same in any task.  Kernels may use a per-thread scratch of
** MOE8__GMM_SCRATCH bytes; they never read lhs/rhs outside the given rows,
** columns and K, and never write outside out[m0:m1, n0:n1].
**
** A table may also pack the lhs (gmm_pack_size/gmm_pack): the driver then
** gives every block the packed rows in lhs_packed, either the whole call's
** rows packed once (small calls) or, at prefill, the rows of the block's
** row tile packed by the thread that runs it into its own workspace slice
** (pk_row0 says which row is first), so they stay in that core's L2.
*/
#ifndef MOE8_GMM_H
#define MOE8_GMM_H

#include "../core/internal.h"

#define MOE8__GMM_SCRATCH ((size_t)2 << 20)
#define MOE8__GMM_MT 1024  /* rows of one task                  */
#define MOE8__GMM_NT 128   /* columns of one task               */
/* An output of this many bytes or more is written past the caches: it
** does not fit in a core's L2, and reading each line before writing it
** (what a plain store does) costs a third of an int8 prefill matmul on
** AMX (docs/kernels.md "Output"). */
#define MOE8__GMM_STREAM_BYTES ((size_t)4 << 20)

typedef enum { MOE8__SC_NONE = 0, MOE8__SC_TENSOR, MOE8__SC_ROW, MOE8__SC_TILE } moe8__sc_kind;

typedef struct moe8__gmm_block {
  int64_t       K, N;       /* lhs row stride K, out/rhs row stride N       */
  int64_t       m0, m1, n0, n1;
  int64_t       kb;         /* scale block length along K (K when none)     */
  moe8_dtype    lt, rt, ot;
  const void   *lhs;        /* [M, K] base                                  */
  const void   *rhs;        /* this group's [K, N] (or [N, K] if rhs_t)     */
  bool          rhs_t;
  const float  *ls;         /* lhs scale base                               */
  moe8__sc_kind lk;         /* TENSOR [1], ROW [M], TILE [M, nbk]           */
  const float  *rs;         /* this group's rhs scale base                  */
  moe8__sc_kind rk;         /* TENSOR [1], ROW = per-channel [N], TILE [nbk, N] */
  int64_t       nbk;        /* number of K blocks                           */
  void         *out;        /* [M, N] base                                  */
  void         *scratch;    /* MOE8__GMM_SCRATCH bytes, 64-byte aligned     */
  const void   *lhs_packed; /* the lhs as the table's gmm_pack wrote it, or NULL */
  int64_t       pk_row0;    /* the call's row whose packed copy is at lhs_packed (0: the
                            ** whole call's rows; the driver may pack a row tile's rows per
                            ** thread, then its first row); gmm_pack writes row m at
                            ** dst + (m - pk_row0) rows                                    */
  const uint8_t *rhs_pk;    /* this group's packed FP8 or i8 rhs (rhs is then NULL) */
  bool          canon;      /* the canonical order (below): lhs bf16 or FP8   */
  const uint8_t *pk_next;   /* the packed tile of this thread's next task (a prefetch hint), or NULL */
  size_t        pk_next_bytes;
  bool          out_stream; /* the call's output is large (MOE8__GMM_STREAM_BYTES or more): a
                            ** kernel may write it with streaming stores, and then ends its
                            ** block with a store fence */
} moe8__gmm_block;

/* The canonical order (docs/determinism.md), for a bf16 or FP8 lhs (rhs
** bf16, FP8 or i8): within a scale block, K is taken in pieces of 32 from
** the block's start (16 pairs k0 + 2j, k0 + 2j + 1); a piece is an even and
** an odd f32 sum, each from zero, of exact products, then even + odd; the
** block sum adds the pieces in K order; subnormal inputs, products and
** sums are flushed to zero.  That is tdpbf16ps's arithmetic
** (kernels/amx_model.h), so the reference, the AVX-512 and the AMX kernels
** give the same bytes.  The tables' packed lhs for it: bf16 pairs, each
** scale block padded with zero pairs to whole pieces. */
static inline int64_t moe8__canon_block_words(const moe8__gmm_block *b) { return moe8__cdiv(moe8__cdiv(b->kb, 2), 16) * 16; }
/* A row whose length is a multiple of 1 KiB gets one more piece of
** padding: 16 rows a power of two apart would fall in one L1 set. */
static inline int64_t moe8__canon_row_words(const moe8__gmm_block *b) {
  const int64_t full = b->K / b->kb, last = b->K - full * b->kb;
  const int64_t w = full * moe8__canon_block_words(b) + moe8__cdiv(moe8__cdiv(last, 2), 16) * 16;
  return w % 256 ? w : w + 16;
}

/* The tables pack the lhs for the canonical order (and the AMX tables
** their i8 rows) when the scale blocks are at least 16 long or there is
** one: a row is then at most K + 16 words (moe8__gmm_ws_size).  Shorter
** blocks run on the reference kernel. */
static inline bool moe8__canon_packs(const moe8__gmm_block *b) { return b->nbk <= 1 || b->kb >= 16; }

/* Rows per task from which a table with tiles uses them for the canonical
** order (fewer rows: its AVX-512 kernel, same bytes): bf16 and FP8, and
** packed i8 (fewer rows: the VNNI kernel).  MOE8_AMX_MIN_ROWS sets both;
** read once. */
int64_t moe8__amx_min_rows(void);
int64_t moe8__amx_min_rows_i8(void);

/* The packed FP8 rhs (moe8_gmm_pack_rhs), per group: the columns in tiles
** of NT, each tile's columns in strips of 32 (the last tile and strip
** padded with zero codes); within a tile of nst strips, k pair p (k = 2p,
** 2p + 1; a missing k + 1 is a zero code) and strip s hold 64 bytes at
** (p·nst + s)·64, the code of strip column c and kk = k & 1 at
** moe8__pk_pos(c, kk).  That order is what two in-lane byte unpacks of a
** 64-byte load turn into bf16 pairs for columns 0–15 and 16–31, so a
** kernel streams each tile front to back.  Pairs are global along K, so a
** scale block along K must have even length (or be the only one). */
static inline int moe8__pk_pos(int c, int kk) {
  const int p = 2 * (c & 15) + kk;
  return 16 * (p >> 3) + 8 * (c >> 4) + (p & 7);
}

/* The packed i8 rhs: the same column tiles, each in vectors of 16 columns
** (nv = ceil(cols / 16)); quad q (k = 4q .. 4q + 3, missing k zero) and
** vector v hold 64 bytes at (q·nv + v)·64, the byte of (k, vector lane c)
** at 4c + (k & 3): the words vpdpbusd reads, as they are.  Scale blocks
** along K must be whole quads (or the only block).
**
** Both layouts are "groups of per k (2 or 4) by runs of width columns (32
** or 16), 64 bytes each"; these three functions are their one definition. */
static inline int64_t moe8__pk_per(moe8_dtype t) { return t == MOE8_DTYPE_I8 ? 4 : 2; }
static inline int64_t moe8__pk_width(moe8_dtype t) { return t == MOE8_DTYPE_I8 ? 16 : 32; }

static inline size_t moe8__pk_group_bytes(moe8_dtype t, int64_t K, int64_t N) {
  const int64_t per = moe8__pk_per(t), w = moe8__pk_width(t);
  return (size_t)((K + per - 1) / per) * (size_t)((N + w - 1) / w) * 64;
}

/* Byte offset in a group of the start of k group p (k = per·p ...) of the
** column tile starting at c0. */
static inline size_t moe8__pk_row(moe8_dtype t, int64_t K, int64_t N, int64_t p, int64_t c0) {
  const int64_t per = moe8__pk_per(t), w = moe8__pk_width(t), kp = (K + per - 1) / per;
  const int64_t cols = N - c0 < MOE8__GMM_NT ? N - c0 : MOE8__GMM_NT, nv = (cols + w - 1) / w;
  return (size_t)(c0 / w * kp * 64 + p * nv * 64);
}

/* Byte offset, from the start of its k group's row, of column c of the
** tile (0 <= c < 128) and kk = k mod per. */
static inline size_t moe8__pk_col(moe8_dtype t, int64_t c, int64_t kk) {
  if (t == MOE8_DTYPE_I8) return (size_t)((c / 16) * 64 + 4 * (c & 15) + kk);
  return (size_t)((c / 32) * 64 + moe8__pk_pos((int)(c & 31), (int)kk));
}

/* Byte offset in a group of the code of (k, n). */
static inline size_t moe8__pk_offset(moe8_dtype t, int64_t K, int64_t N, int64_t k, int64_t n) {
  const int64_t per = moe8__pk_per(t), c0 = n / MOE8__GMM_NT * MOE8__GMM_NT;
  return moe8__pk_row(t, K, N, k / per, c0) + moe8__pk_col(t, n - c0, k % per);
}

/* Element i of an operand of type t, as f32 (exact for every type). */
static inline float moe8__gmm_ld(const void *p, moe8_dtype t, int64_t i) {
  switch (t) {
    case MOE8_DTYPE_F32: return ((const float *)p)[i];
    case MOE8_DTYPE_BF16: return moe8_bf16_to_f32(((const uint16_t *)p)[i]);
    case MOE8_DTYPE_F8E4M3: return moe8_f8e4m3_to_f32(((const uint8_t *)p)[i]);
    case MOE8_DTYPE_F8E5M2: return moe8_f8e5m2_to_f32(((const uint8_t *)p)[i]);
    default: return (float)((const int8_t *)p)[i];
  }
}

/* Value of rhs element (k, n) of a block: f32 exactly, from the plain or
** the packed rhs (for the reference kernel and the slow paths). */
static inline float moe8__gmm_rhs_at(const moe8__gmm_block *b, int64_t k, int64_t n) {
  if (b->rhs_pk) return moe8__gmm_ld(b->rhs_pk, b->rt, (int64_t)moe8__pk_offset(b->rt, b->K, b->N, k, n));
  return moe8__gmm_ld(b->rhs, b->rt, b->rhs_t ? n * b->K + k : k * b->N + n);
}

static inline float moe8__gmm_ls(const moe8__gmm_block *b, int64_t m, int64_t blk) {
  switch (b->lk) {
    case MOE8__SC_TENSOR: return b->ls[0];
    case MOE8__SC_ROW: return b->ls[m];
    case MOE8__SC_TILE: return b->ls[m * b->nbk + blk];
    default: return 1.0f;
  }
}

static inline float moe8__gmm_rs(const moe8__gmm_block *b, int64_t blk, int64_t n) {
  switch (b->rk) {
    case MOE8__SC_TENSOR: return b->rs[0];
    case MOE8__SC_ROW: return b->rs[n];
    case MOE8__SC_TILE: return b->rs[blk * b->N + n];
    default: return 1.0f;
  }
}

void moe8__gmm_block_ref(const moe8__gmm_block *b);

/* The canonical-order kernel on AVX-512 and its lhs packing
** (kernels/x86/gmm_x86_canon.c); the AMX tables run it for few rows. */
void   moe8__gmm_canon_avx512(const moe8__gmm_block *b);
void   moe8__gmm_canon_pack(const moe8__gmm_block *b, int64_t m0, int64_t m1, void *dst);

/* moe8_gmm with caller scratch: ws holds ws_bytes (64-byte aligned): first
** the packed lhs (see moe8__gmm_ws_size), then MOE8__GMM_SCRATCH per thread;
** threads are capped at the slices that fit.  With ws == NULL the call
** allocates what it needs (the public moe8_gmm). */
moe8_status moe8__gmm(const moe8_gmm_args *a, void *ws, size_t ws_bytes);

/* Workspace bytes moe8__gmm needs for M rows of K (any dtype, any tile)
** and the current thread count: an upper bound. */
size_t      moe8__gmm_ws_size(int64_t M, int64_t K);

#endif
