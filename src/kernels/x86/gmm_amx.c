/*
** gmm_amx.c — the AMX grouped-matmul block kernels (contract in
** kernels/gmm.h), built twice: over the real tile instructions (the "amx"
** table) and, with MOE8_AMX_EMU, over the C model of kernels/amx_model.h
** (the "amx_emu" table), so that the packing, the tails, the tile shapes
** and the promotion are tested on every CPU.
**
**   bf16 / FP8 lhs  tdpbf16ps: the canonical order by construction.  The
**                   lhs is the canonical packed rows (bf16 pairs, blocks
**                   padded to pieces of 32); the weights stay FP8 in
**                   memory and are converted once per chunk of K into a
**                   panel of bf16 pairs, whose rows are the B tiles, and
**                   that every row tile of the task reuses.  Tasks of
**                   fewer than moe8__amx_min_rows() rows run the AVX-512
**                   canonical kernel instead: the same bytes.
**   i8 · i8         tdpbssd on the signed bytes (no +128 offset): exact
**                   wrapping i32 sums, so the bytes are the VNNI path's;
**                   packed tasks of fewer than moe8__amx_min_rows_i8()
**                   rows run that VNNI kernel.
**   anything else   the AVX-512 table this one is built over.
**
** A task walks K in chunks (amx_task): one stretch of a long scale block,
** or several short blocks at once.  Per chunk FP8 and bf16 weights become
** strips of 32 columns whose tile rows are consecutive lines (to_strips,
** or the packed FP8 converter straight into them, for tasks of up to 256
** rows during the last chunk's tile steps; packed i8 weights are read in
** place); then for each 32 rows, for each strip, four C tiles run
** through each block's pieces (two A and two B tile loads, four dot
** products a piece) and are stored to the block sums S (a block that goes
** on in the next chunk) or to a small buffer that is promoted into the
** f32 accumulator, or for the last block of an f32 output into the output
** rows, one step later (acc + S · (ls · rs), a multiply then an add, as
** the reference) while the tile unit works on the next tiles.
** Packed lhs rows and strips are padded so that 16 tile rows never share
** an L1 set.  A row tile past the task's last row is loaded from a
** zero-padded copy of the rows.  Every tile is 16 rows × 64 bytes; the
** configuration is loaded at the start of each task on the thread that
** runs it and released at its end.
*/
#include "gmm_x86.h" /* the AVX-512 panels, scales and output it shares */

#include <string.h>

#ifdef MOE8_AMX_EMU
#include "../amx_model.h"
static _Thread_local moe8__amx_state g_tiles;
#define T_CFG(c)          moe8__amx_loadconfig(&g_tiles, (const uint8_t *)(c))
#define T_RELEASE()       ((void)0)
#define T_LOAD(t, p, s)   moe8__amx_loadd(&g_tiles, t, p, s)
#define T_STORE(t, p, s)  moe8__amx_stored(&g_tiles, t, p, s)
#define T_ZERO(t)         moe8__amx_zero(&g_tiles, t)
#define T_BF16(c, a, b)   moe8__amx_dpbf16ps(&g_tiles, c, a, b)
#define T_SSD(c, a, b)    moe8__amx_dpb(&g_tiles, c, a, b, 1, 1)
#define AMX_NAME(x)       x##_emu
#else
#include <immintrin.h>
#define T_CFG(c)          _tile_loadconfig(c)
#define T_RELEASE()       _tile_release()
#define T_LOAD(t, p, s)   _tile_loadd(t, p, s)
#define T_STORE(t, p, s)  _tile_stored(t, p, s)
#define T_ZERO(t)         _tile_zero(t)
#define T_BF16(c, a, b)   _tile_dpbf16ps(c, a, b)
#define T_SSD(c, a, b)    _tile_dpbssd(c, a, b)
#define AMX_NAME(x)       x##_hw
#endif

enum { MT = MOE8__GMM_MT }; /* NT, KC: gmm_x86.h */

/* The base table's entries, for what the tiles do not take. */
static void (*AMX_NAME(g_base_block))(const moe8__gmm_block *b);
static size_t (*AMX_NAME(g_base_pack_size))(const moe8__gmm_block *b);
static void (*AMX_NAME(g_base_pack))(const moe8__gmm_block *b, int64_t m0, int64_t m1, void *dst);

static bool is_i8(const moe8__gmm_block *b) {
  return b->lt == MOE8_DTYPE_I8 && b->rt == MOE8_DTYPE_I8 && moe8__canon_packs(b);
}

/* The i8 lhs for tdpbssd: signed bytes, each scale block padded with
** zeros to whole pieces of 64. */
static int64_t i8_block_bytes(const moe8__gmm_block *b) { return moe8__cdiv(b->kb, 64) * 64; }
static int64_t i8_row_bytes(const moe8__gmm_block *b) {
  const int64_t full = b->K / b->kb, last = b->K - full * b->kb;
  const int64_t n = full * i8_block_bytes(b) + moe8__cdiv(last, 64) * 64;
  return n % 1024 ? n : n + 64; /* as moe8__canon_row_words: off the L1 sets */
}

static void pack_i8(const moe8__gmm_block *b, int64_t m0, int64_t m1, void *dst) {
  const int64_t rb = i8_row_bytes(b), bb = i8_block_bytes(b);
  for (int64_t m = m0; m < m1; m++) {
    uint8_t *d = (uint8_t *)dst + (m - b->pk_row0) * rb;
    const uint8_t *s = (const uint8_t *)b->lhs + m * b->K;
    memset(d, 0, (size_t)rb);
    for (int64_t blk = 0; blk < b->nbk; blk++) {
      const int64_t k0 = blk * b->kb, len = k0 + b->kb < b->K ? b->kb : b->K - k0;
      memcpy(d + blk * bb, s + k0, (size_t)len);
    }
  }
}

typedef struct amx_cfg {
  uint8_t  palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t  rows[16];
} amx_cfg;

/* K per chunk: one 1×128 FP8 block (or 512 i8), so a chunk's B strips
** for the task's 128 columns (32 KiB, 64 KiB of packed i8 read in place)
** and a row tile pair's A rows stay in L1 together while the row tiles
** run over every strip (docs/kernels.md, "AMX"). */
enum { KCB = 128 /* bf16 pairs: 64 */, KCI = 512 /* i8 quads: 128 */ };

/* The chunk's B as strips of 32 columns: rows (pairs or quads) of 128
** bytes, one strip after the other, so a tile's 16 rows are consecutive
** lines (a panel row NT words long would put them in a few L1 sets).
** src: row r of strip s at src + r·stride + 128·s, 64·nv bytes wide;
** rows past have and the half past nv vectors are zero. */
static void to_strips(const uint8_t *src, int64_t stride, int64_t have, int64_t rows, int64_t nv, uint8_t *dst) {
  const __m512i z = _mm512_setzero_si512();
  const int64_t ns = moe8__cdiv(nv, 2), sb = rows * 128;
  /* Row by row, so the source (weights in memory) is read front to back. */
  for (int64_t k = 0; k < have; k++, src += stride) {
    int64_t s = 0;
    for (; 2 * s + 1 < nv; s++) {
      _mm512_store_si512(dst + s * sb + k * 128, _mm512_loadu_si512(src + 128 * s));
      _mm512_store_si512(dst + s * sb + k * 128 + 64, _mm512_loadu_si512(src + 128 * s + 64));
    }
    if (s < ns) { _mm512_store_si512(dst + s * sb + k * 128, _mm512_loadu_si512(src + 128 * s)); _mm512_store_si512(dst + s * sb + k * 128 + 64, z); }
  }
  for (int64_t s = 0; s < ns; s++)
    for (int64_t k = have; k < rows; k++) { _mm512_store_si512(dst + s * sb + k * 128, z); _mm512_store_si512(dst + s * sb + k * 128 + 64, z); }
}

/* A stored 32 × 32 tile of block sums t (i32 for i8) into the task's
** accumulator rows: o = o + t · (ls · rs), a multiply then an add, as the
** reference.  Deferred by one tile step, so it runs while the tile unit
** works on the next tiles. */
typedef struct pending { bool on, first, fin; int64_t i, ct, rows, cols; const float *ls, *rs, *t; } pending;

/* The promotion's rows, specialized on what is fixed for a tile (int8
** sums, the first block, a second vector, where the rows go: the acc rows
** NT apart, or the output masked or streamed), everything in locals: the
** general loop reloaded the block's fields after every store (they might
** alias) and took five branches a row, and with the tile unit this busy
** it was instruction-bound.  The operations per element are the
** reference's: o = a + t · (l · r). */
enum { TO_ACC, TO_OUT, TO_STREAM, TO_SHIFT };
static inline __attribute__((always_inline)) void prom_rows(int64_t rows, const float *ls, const float *t, float *o, float *d, int64_t ldd,
                                                            __m512 r0, __m512 r1, __mmask16 k0, __mmask16 k1, const bool i8, const bool first,
                                                            const bool two, const int to, const moe8__shifted *sh, float *carry) {
  for (int64_t r = 0; r < rows; r++, t += 32, o += NT, d += ldd) {
    const __m512 l = _mm512_set1_ps(ls[r]);
    const __m512 t0 = i8 ? _mm512_cvtepi32_ps(_mm512_loadu_si512(t)) : _mm512_loadu_ps(t);
    const __m512 v0 = _mm512_add_ps(first ? _mm512_setzero_ps() : _mm512_loadu_ps(o), _mm512_mul_ps(t0, _mm512_mul_ps(l, r0)));
    __m512 v1 = v0;
    if (two) {
      const __m512 t1 = i8 ? _mm512_cvtepi32_ps(_mm512_loadu_si512(t + 16)) : _mm512_loadu_ps(t + 16);
      v1 = _mm512_add_ps(first ? _mm512_setzero_ps() : _mm512_loadu_ps(o + 16), _mm512_mul_ps(t1, _mm512_mul_ps(l, r1)));
    }
    if (to == TO_SHIFT) { shifted_put(sh, d, carry + 16 * r, v0, v1, two); continue; }
    if (to == TO_ACC) _mm512_storeu_ps(o, v0);
    else if (to == TO_STREAM) _mm512_stream_ps(d, v0);
    else _mm512_mask_storeu_ps(d, k0, v0);
    if (two) {
      if (to == TO_ACC) _mm512_storeu_ps(o + 16, v1);
      else if (to == TO_STREAM) _mm512_stream_ps(d + 16, v1);
      else _mm512_mask_storeu_ps(d + 16, k1, v1);
    }
  }
}

#define PROM_TO(i8, first, two)                                                                            \
  do {                                                                                                   \
    if (to == TO_ACC) prom_rows(rows, ls, t, o, o, NT, r0, r1, k0, k1, i8, first, two, TO_ACC, &sh, carry);          \
    else if (to == TO_STREAM) prom_rows(rows, ls, t, o, d, ldd, r0, r1, k0, k1, i8, first, two, TO_STREAM, &sh, carry); \
    else if (to == TO_SHIFT) prom_rows(rows, ls, t, o, d, ldd, r0, r1, k0, k1, i8, first, two, TO_SHIFT, &sh, carry); \
    else prom_rows(rows, ls, t, o, d, ldd, r0, r1, k0, k1, i8, first, two, TO_OUT, &sh, carry);                      \
  } while (0)

/* first: the block is K's first, so acc is still zero (it is never
** cleared: 0 + x is added as the reference adds it, so -0 becomes +0).
** fin: the last block with an f32 output: the sums go straight to the
** output rows (columns past the task's last masked off), and the task
** writes no acc copy of them. */
static void promote_tile(const moe8__gmm_block *b, float *acc, float *carry, const pending *p, bool i8) {
  const __m512 r0 = _mm512_loadu_ps(p->rs + 16 * p->ct), r1 = _mm512_loadu_ps(p->rs + 16 * p->ct + (p->cols > 16 ? 16 : 0));
  const int64_t nt = b->n1 - b->n0, c0 = 16 * p->ct, left = nt - c0, rows = p->rows, ldd = b->N;
  const __mmask16 k0 = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
  const __mmask16 k1 = left >= 32 ? (__mmask16)0xFFFF : left > 16 ? (__mmask16)((1u << (left - 16)) - 1) : 0;
  const bool two = p->cols > 16, first = p->first;
  const float *ls = p->ls + p->i, *t = p->t;
  float *o = acc + p->i * NT + c0;
  float *d = p->fin ? (float *)b->out + (b->m0 + p->i) * b->N + b->n0 + c0 : o;
  /* The last block's sums to a large output: streamed, realigned first
  ** where the rows are off the lines (out_how, gmm_x86.h). */
  moe8__shifted sh = {0};
  const int how = p->fin ? out_how(b, d, ldd, k0, two ? k1 : 0, c0, rows, carry, &sh) : OUT_PLAIN;
  const int to = !p->fin ? TO_ACC : how == OUT_STREAM ? TO_STREAM : how == OUT_SHIFT ? TO_SHIFT : TO_OUT;
  if (i8) {
    if (first) { if (two) PROM_TO(true, true, true); else PROM_TO(true, true, false); }
    else { if (two) PROM_TO(true, false, true); else PROM_TO(true, false, false); }
  } else {
    if (first) { if (two) PROM_TO(false, true, true); else PROM_TO(false, true, false); }
    else { if (two) PROM_TO(false, false, true); else PROM_TO(false, false, false); }
  }
}
#undef PROM_TO

/* n pieces into C tiles 0-3 from the row tiles at a0 and a1 (rows sa
** bytes apart) and the B tile pairs at b, b + 16·sb, ... (rows sb apart).
** Its own function, so that the loop keeps its few pointers in
** registers; each tile load is issued right before the first product
** that reads it, between the products (the tiles are not renamed: a load
** waits for the products that read the register's last contents; with
** the second B and A loads after the first and second products the
** layers measured 2-5% faster than with the four loads first).  Before
** piece q, lines q·pfd .. (q + 1)·pfd - 1 (below pfn) from pf are asked
** into L2: the task's share of the next chunk's weights, spread. */
#define PIECES(name, DP)                                                                                    \
  static __attribute__((noinline)) void name(const uint8_t *a0, int64_t sa0, const uint8_t *a1, int64_t sa1,    \
                                             const uint8_t *b, int64_t sb, int64_t n, const char *pf,           \
                                             int64_t pfn, int64_t pfd) {                                         \
    for (int64_t q = 0; q < n; q++, a0 += 64, a1 += 64, b += 16 * sb) {                                     \
      for (int64_t j = q * pfd; j < (q + 1) * pfd && j < pfn; j++) _mm_prefetch(pf + 64 * j, _MM_HINT_T1);      \
      T_LOAD(4, a0, sa0);                                                                                   \
      T_LOAD(6, b, sb);                                                                                     \
      DP(0, 4, 6);                                                                                          \
      T_LOAD(7, b + 64, sb);                                                                                \
      DP(1, 4, 7);                                                                                          \
      T_LOAD(5, a1, sa1);                                                                                   \
      DP(2, 5, 6);                                                                                          \
      DP(3, 5, 7);                                                                                          \
    }                                                                                                       \
  }
PIECES(AMX_NAME(pieces_bf16), T_BF16)
PIECES(AMX_NAME(pieces_ssd), T_SSD)

/* The task: C tiles 0-3 (rows r, columns c: 2r + c), A tiles 4-5, B 6-7.
**
** K is walked in chunks: a chunk is a stretch of one scale block (blocks
** longer than KCB / KCI), or up to GB whole blocks (shorter blocks that
** are whole pieces), so the panel work and the loops are per enough k.
** Per chunk the row tiles run outside the column strips, so a pair of
** row tiles is read from L1 by every strip and the chunk's strips stay in
** L1 for the next pair; a step (32 rows × 32 columns)
** runs each block of the chunk with its C tiles live from the block's
** first piece to its last (or the chunk's end: then S holds them).  A
** block's sums are stored to one of two small buffers and promoted one
** step later, while the tile unit works on the next block's tiles. */
enum { GB = 8, PF_BURST = 8 };

/* Step step's block sums in S: rows 32·(step / nci), columns 32·(step mod
** nci) (the steps walk the column pairs inside the row pairs). */
static inline float *step_sums(float *S, int64_t step, int64_t nci) { return S + 32 * (step / nci) * NT + 32 * (step % nci); }

/* A chunk of K: [c0, c1), blocks blk0 .. blk1 - 1 (gb at a time when they
** are short, else a stretch of at most kcm of one block). */
typedef struct chunk { int64_t c0, c1, blk0, blk1, kc, npc; bool first, last; } chunk;
static chunk chunk_at(const moe8__gmm_block *b, int64_t c0, int64_t gb, int64_t kcm, int64_t piece) {
  const int64_t kb = b->kb, blk0 = c0 / kb, blk1 = blk0 + gb < b->nbk ? blk0 + gb : b->nbk;
  const int64_t kend = gb > 1 ? (blk1 * kb < b->K ? blk1 * kb : b->K) : (blk0 * kb + kb < b->K ? blk0 * kb + kb : b->K);
  const int64_t c1 = gb > 1 ? kend : (c0 + kcm < kend ? c0 + kcm : kend);
  return (chunk){c0, c1, blk0, blk1, c1 - c0, moe8__cdiv(c1 - c0, piece), c0 == blk0 * kb, c1 == kend};
}

/* Pairs [p0, p1) of chunk ch's packed FP8 weights converted into the
** strips at dst (rows of 128 bytes, strips 16·npc rows apart); pf: the
** converter's prefetch distance (pack_b_pk_vbmi), or 0. */
static void conv_pairs(const moe8__gmm_block *b, const chunk *ch, int64_t ntp, uint8_t *dst, int64_t p0, int64_t p1, int64_t pf) {
  if (p1 > p0) pack_b_pk_vbmi(b, ch->c0 + 2 * p0, p1 - p0, ntp, (uint32_t *)dst + p0 * 32, 32, 16 * ch->npc * 32, pf);
}
/* The strips' rows past the chunk's pairs, zero. */
static void conv_zero(const chunk *ch, int64_t ntp, uint8_t *dst) {
  const int64_t kp = moe8__cdiv(ch->kc, 2), rows = 16 * ch->npc;
  if (kp < rows)
    for (int64_t s = 0; s < ntp / 32; s++) memset(dst + (s * rows + kp) * 128, 0, (size_t)((rows - kp) * 128));
}

static void AMX_NAME(amx_task)(const moe8__gmm_block *b, bool i8) {
  const int64_t mt = b->m1 - b->m0, nt = b->n1 - b->n0, ntp = moe8__cdiv(nt, 32) * 32, nct = moe8__cdiv(nt, 16);
  const int64_t piece = i8 ? 64 : 32, kcm = i8 ? KCI : KCB, pmax = kcm / piece, kb = b->kb;
  float *acc = b->scratch, *S = acc + MT * NT;
  uint32_t *Bp = (uint32_t *)(S + MT * NT);
  int32_t *colsum = (int32_t *)(Bp + (size_t)16 * pmax * NT);
  float *tmp = (float *)(colsum + NT), *T = tmp + 2 * NT, *rsv = T + 2 * 32 * 32, *lsv = rsv + 2 * GB * NT;
  uint8_t *tail = (uint8_t *)(lsv + 2 * GB * MT), *Bs = tail + 16 * 64 * (pmax + 1); /* strips: 16·pmax·NT words */
  float *carry = (float *)(Bs + (size_t)64 * pmax * NT);                           /* 32 rows × 16 */
  uint8_t *Bs2 = (uint8_t *)(carry + 32 * 16);                                      /* the next chunk's strips */
  /* Every block's column scales, read before the weight stream starts
  ** (rhs_scales_all), after the strips; else each block's into its slot of
  ** rsv (rsb: where block blk's are, in slot blk mod 2·GB). */
  const float *rsall = rhs_scales_all(b, ntp, (float *)(Bs2 + (size_t)64 * pmax * NT)), *rsb[2 * GB];
  const int64_t rowb = i8 ? i8_row_bytes(b) : moe8__canon_row_words(b) * 4;
  const int64_t blkb = i8 ? i8_block_bytes(b) : moe8__canon_block_words(b) * 4;
  const uint8_t *A = (const uint8_t *)b->lhs_packed + (b->m0 - b->pk_row0) * rowb;
  const bool direct = i8 && b->rhs_pk; /* B straight from the packed i8 weights */
  const int64_t nv = moe8__cdiv(nt, 16), kq_all = moe8__cdiv(b->K, 4);
  const int64_t full = mt / 16 * 16; /* rows in whole row tiles */
  /* Blocks per chunk: several when they are short and whole pieces. */
  const int64_t gb = b->nbk > 1 && kb < kcm && kb % piece == 0 ? (kcm / kb < GB ? kcm / kb : GB) : 1;
  amx_cfg cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.palette = 1;
  for (int i = 0; i < 8; i++) { cfg.colsb[i] = 64; cfg.rows[i] = 16; }
  T_CFG(&cfg);
  pending pend = {false};
  int tbuf = 0;
  int64_t tail_ts = -1;
  /* Packed FP8 converted per chunk; with few rows (decode) the converter
  ** prefetches the stream ahead, else each tile step a slice of the next
  ** chunk (spread over many steps: 9% faster at 128 rows an expert). */
  const bool conv = !i8 && b->rhs_pk && b->rt != MOE8_DTYPE_I8 && moe8__cpu_has_vbmi(), few = mt < 32;
  /* pipe: the next chunk is converted a slice per tile step, into the
  ** other strip buffer, so the conversion and the weight stream it reads
  ** run beside the tile products instead of between them.  For tasks of
  ** at most 256 rows, where a chunk's conversion is shared by few steps:
  ** 9-10% faster at 128 rows an expert on one thread, 5% on two; at 512
  ** rows slower (the second buffer's 32 KiB crowd L1; measured on an AMX
  ** Xeon, docs/performance.md). */
  const bool pipe = conv && !few && mt <= 256;
  uint8_t *bufs[2] = {Bs, Bs2};
  int cur = 0;
  for (chunk ch = chunk_at(b, 0, gb, kcm, piece); ch.c0 < b->K; ch = chunk_at(b, ch.c1, gb, kcm, piece), cur ^= 1) {
    const int64_t c0 = ch.c0, c1 = ch.c1, blk0 = ch.blk0, blk1 = ch.blk1, kc = ch.kc, npc = ch.npc;
    const bool first = ch.first, last = ch.last;
    uint8_t *Bc = pipe ? bufs[cur] : Bs;
    const bool nxt = pipe && c1 < b->K;
    const chunk nx = nxt ? chunk_at(b, c1, gb, kcm, piece) : ch;
    const int64_t nkp = moe8__cdiv(nx.kc, 2);
    if (nxt) conv_zero(&nx, ntp, bufs[cur ^ 1]);
    /* The blocks' scales, block blk in slot blk mod 2·GB (a deferred
    ** promotion may still read the last chunk's last block). */
    if (first)
      for (int64_t blk = blk0; blk < blk1; blk++) {
        float *ls = lsv + blk % (2 * GB) * MT;
        rsb[blk % (2 * GB)] = rhs_scales_at(b, rsall, blk, ntp, rsv + blk % (2 * GB) * NT);
        for (int64_t r = 0; r < mt; r++) ls[r] = moe8__gmm_ls(b, b->m0 + r, blk);
      }
    /* B in strips (to_strips): from the packed i8 weights as they lie
    ** (quads of 16 columns, nv · 64 bytes apart), else from the panel
    ** of pairs or quads, NT words apart. */
    const uint8_t *bdir = NULL; /* direct: the chunk's first quad row in the packed weights */
    int64_t qfull = npc;         /* direct: pieces read in place; the rest from Bs */
    if (direct) {
      const int64_t q0 = c0 / 4, kq = moe8__cdiv(kc, 4), have = q0 + kq <= kq_all ? kq : kq_all - q0;
      bdir = pk_at(b, q0);
      qfull = have / 16;
      /* A last piece with fewer than 16 quad rows left in the group is
      ** copied, zero rows after, so no tile reads past the weights. */
      if (qfull < npc) to_strips(bdir + 16 * qfull * nv * 64, nv * 64, have - 16 * qfull, 16, nv, Bs);
    } else if (i8) {
      pack_b_i8(b, c0, kc, ntp, Bp, colsum);
      to_strips((const uint8_t *)Bp, NT * 4, moe8__cdiv(kc, 4), 16 * npc, nct, Bs);
    } else if (pipe && c0 > 0) {
      /* converted during the last chunk */
    } else if (conv) {
      /* Packed FP8: converted straight into the strips, rows past zero. */
      conv_pairs(b, &ch, ntp, Bc, 0, moe8__cdiv(kc, 2), few ? PKPF_FAR : 0);
      conv_zero(&ch, ntp, Bc);
    } else {
      panel_bf16(b, c0, kc, ntp, Bp, tmp);
      to_strips((const uint8_t *)Bp, NT * 4, moe8__cdiv(kc, 2), 16 * npc, nct, Bs);
    }
    /* Byte offset of the chunk in a packed row (blocks are whole pieces
    ** when gb > 1, so the chunk's pieces follow each other). */
    const int64_t ac = blk0 * blkb + (c0 - blk0 * kb) / piece * 64;
    /* The rows past the last whole row tile, zero-padded to 16. */
    const int64_t ts = npc * 64 + 64; /* its row stride, off the L1 sets too */
    if (full < mt) {
      /* Its rows past the task's stay zero from chunk to chunk: cleared
      ** only when the row stride changes (at most twice a task). */
      if (ts != tail_ts) memset(tail, 0, (size_t)(16 * ts)), tail_ts = ts;
      for (int64_t r = full; r < mt; r++) memcpy(tail + (r - full) * ts, A + r * rowb + ac, (size_t)(npc * 64));
    }
    const int64_t nci = (nct + 1) / 2, nri = moe8__cdiv(mt, 32);
    /* The next chunk's packed weights are asked into L2, a slice per step,
    ** so that its tiles (read in place) or its conversion wait less on
    ** memory: 3-7% on int8 prefill at 128 rows an expert (measured). */
    const uint8_t *pf = NULL;
    int64_t pf_lines = 0, pf_per = 0;
    const int64_t pfc = nxt ? nx.c1 : c1; /* pipe: the chunk after the next */
    if (b->rhs_pk && pfc < b->K && !(few && conv)) { /* (few && conv: the converter prefetches) */
      const int64_t per = moe8__pk_per(b->rt), kall = moe8__cdiv(b->K, per);
      const int64_t p1 = pfc / per, p2 = moe8__cdiv(pfc + kcm < b->K ? pfc + kcm : b->K, per);
      pf = pk_at(b, p1);
      pf_lines = (int64_t)(pk_at(b, p2 < kall ? p2 : kall) - pf) / 64;
      pf_per = moe8__cdiv(pf_lines, nci * nri);
    }
    const int64_t nsteps = nci * nri, cper = nxt ? moe8__cdiv(nkp, nsteps) : 0;
    for (int64_t step = 0; step < nsteps; step++) {
      const int64_t ct = 2 * (step % nci), i = 32 * (step / nci);
      const bool two = ct + 1 < nct;
      /* The step's share of them: up front, or, when that is more than
      ** PF_BURST lines, pfd lines before each piece.  A burst of 32-64
      ** prefetches held the int8 tile loads (B read in place) behind it:
      ** spread, int8 ran 0.77-0.84x the time at 64-128 rows an expert,
      ** 0.93-0.96x at 8-32 and 512, and FP8 0.92-0.97x at 64-128 rows;
      ** FP8 at 512 rows (4 lines a step) measured no better spread
      ** (same-process A/B on an AMX Xeon, docs/performance.md). */
      const int64_t pfj0 = step * pf_per < pf_lines ? step * pf_per : pf_lines;
      const int64_t pfn = pfj0 + pf_per < pf_lines ? pf_per : pf_lines - pfj0;
      const bool spread = pfn > PF_BURST;
      const int64_t pfd = spread ? moe8__cdiv(pfn, npc) : 0;
      const char *pfs = pf ? (const char *)pf + 64 * pfj0 : NULL;
      if (!spread)
        for (int64_t j = 0; j < pfn; j++) _mm_prefetch(pfs + 64 * j, _MM_HINT_T1);
      /* A chunk that goes on a block (long blocks: int8 per channel) loads
      ** its C tiles from S (in L2 at 128 rows or more), and the tile unit
      ** waits on that load at every step: the next step's S rows are asked
      ** into L1 during this one (3-6% on the int8 prefill matmuls). */
      if (!first && step + 1 < nsteps) {
        const char *sn = (const char *)step_sums(S, step + 1, nci);
        for (int64_t r = 0; r < 32 && 32 * ((step + 1) / nci) + r < mt; r++)
          _mm_prefetch(sn + r * NT * 4, _MM_HINT_T0), _mm_prefetch(sn + r * NT * 4 + 64, _MM_HINT_T0);
      }
      /* Piece q's two B tiles: bq and bq + 64, rows bstr apart. */
      const uint8_t *bsrc = bdir ? bdir + 64 * ct : Bc + ct / 2 * 16 * npc * 128;
      const int64_t bstr = bdir ? nv * 64 : 128;
      { /* the step's 32 rows */
        const bool down = i + 16 < mt;
        const uint8_t *a0 = i + 16 <= mt ? A + i * rowb + ac : tail, *a1 = i + 32 <= mt ? A + (i + 16) * rowb + ac : tail;
        const int64_t s0 = i + 16 <= mt ? rowb : ts, s1 = i + 32 <= mt ? rowb : ts;
        float *Sij = step_sums(S, step, nci);
        for (int64_t blk = blk0; blk < blk1; blk++) {
          const int64_t qa = gb > 1 ? (blk - blk0) * (kb / piece) : 0;
          const int64_t qb = gb > 1 ? (blk + 1 < blk1 ? qa + kb / piece : npc) : npc;
          if (first) {
            T_ZERO(0); T_ZERO(1); T_ZERO(2); T_ZERO(3);
          } else {
            T_LOAD(0, Sij, NT * 4);
            if (two) T_LOAD(1, Sij + 16, NT * 4);
            if (down) T_LOAD(2, Sij + 16 * NT, NT * 4);
            if (down && two) T_LOAD(3, Sij + 16 * NT + 16, NT * 4);
          }
          /* spread: this block's pieces' share of the step's prefetches */
          const int64_t bj0 = qa * pfd < pfn ? qa * pfd : pfn, bpfn = spread ? (qb * pfd < pfn ? qb * pfd : pfn) - bj0 : 0;
          const char *bpf = bpfn ? pfs + 64 * bj0 : NULL;
          if (two && down && qb <= qfull) {
            /* Four whole tiles, B in place: the tight loop. */
            if (i8) AMX_NAME(pieces_ssd)(a0 + 64 * qa, s0, a1 + 64 * qa, s1, bsrc + 16 * qa * bstr, bstr, qb - qa, bpf, bpfn, pfd);
            else AMX_NAME(pieces_bf16)(a0 + 64 * qa, s0, a1 + 64 * qa, s1, bsrc + 16 * qa * bstr, bstr, qb - qa, bpf, bpfn, pfd);
          } else {
            for (int64_t q = qa; q < qb; q++) {
              for (int64_t j = (q - qa) * pfd; j < (q - qa + 1) * pfd && j < bpfn; j++) _mm_prefetch(bpf + 64 * j, _MM_HINT_T1);
              const bool in = q < qfull;
              const uint8_t *bq = in ? bsrc + 16 * q * bstr : Bc + ct / 2 * 16 * 128;
              const int64_t bs = in ? bstr : 128;
              T_LOAD(4, a0 + 64 * q, s0);
              T_LOAD(6, bq, bs);
              if (two) T_LOAD(7, bq + 64, bs);
              if (down) T_LOAD(5, a1 + 64 * q, s1);
              if (i8) {
                T_SSD(0, 4, 6);
                if (two) T_SSD(1, 4, 7);
                if (down) T_SSD(2, 5, 6);
                if (down && two) T_SSD(3, 5, 7);
              } else {
                T_BF16(0, 4, 6);
                if (two) T_BF16(1, 4, 7);
                if (down) T_BF16(2, 5, 6);
                if (down && two) T_BF16(3, 5, 7);
              }
            }
          }
          if (pend.on) promote_tile(b, acc, carry, &pend, i8), pend.on = false;
          if (nxt && blk == blk0) { /* this step's slice of the next chunk */
            const int64_t p0 = step * cper < nkp ? step * cper : nkp;
            conv_pairs(b, &nx, ntp, bufs[cur ^ 1], p0, p0 + cper < nkp ? p0 + cper : nkp, 0);
          }
          if (!last) {
            T_STORE(0, Sij, NT * 4);
            if (two) T_STORE(1, Sij + 16, NT * 4);
            if (down) T_STORE(2, Sij + 16 * NT, NT * 4);
            if (down && two) T_STORE(3, Sij + 16 * NT + 16, NT * 4);
            continue;
          }
          /* The block's sums (32 × 32 at most), promoted one step later. */
          float *Tc = T + (tbuf ^= 1) * 32 * 32;
          T_STORE(0, Tc, 128);
          if (two) T_STORE(1, Tc + 16, 128);
          if (down) T_STORE(2, Tc + 16 * 32, 128);
          if (down && two) T_STORE(3, Tc + 16 * 32 + 16, 128);
          const int64_t sl = blk % (2 * GB);
          pend = (pending){true, blk == 0, blk == b->nbk - 1 && b->ot == MOE8_DTYPE_F32, i, ct, mt - i < 32 ? mt - i : 32,
                           two ? 32 : 16, lsv + sl * MT, rsb[sl], Tc};
        }
      }
    }
  }
  if (pend.on) promote_tile(b, acc, carry, &pend, i8);
  if (b->out_stream) _mm_sfence(); /* the streamed rows before the driver's barrier */
  T_RELEASE();
  if (b->ot != MOE8_DTYPE_F32) write_out(b, acc, mt);
}

static void AMX_NAME(amx_block)(const moe8__gmm_block *b) {
  if (is_i8(b) && b->rhs_pk && b->m1 - b->m0 < moe8__amx_min_rows_i8())
    gmm_block_i8pk_small_rows(b, i8_row_bytes(b) / 4, i8_block_bytes(b) / 4, 0x80808080u); /* the VNNI kernel, same bytes */
  else if (is_i8(b)) AMX_NAME(amx_task)(b, true);
  else if (!b->canon) AMX_NAME(g_base_block)(b);
  else if (!moe8__canon_packs(b)) moe8__gmm_block_ref(b);
  else if (b->m1 - b->m0 < moe8__amx_min_rows()) moe8__gmm_canon_avx512(b);
  else AMX_NAME(amx_task)(b, false);
}

static size_t AMX_NAME(amx_pack_size)(const moe8__gmm_block *b) {
  if (is_i8(b)) return (size_t)i8_row_bytes(b);
  if (b->canon) return moe8__canon_packs(b) ? (size_t)moe8__canon_row_words(b) * 4 : 0;
  return AMX_NAME(g_base_pack_size)(b);
}

static void AMX_NAME(amx_pack)(const moe8__gmm_block *b, int64_t m0, int64_t m1, void *dst) {
  if (is_i8(b)) pack_i8(b, m0, m1, dst);
  else if (b->canon) moe8__gmm_canon_pack(b, m0, m1, dst);
  else AMX_NAME(g_base_pack)(b, m0, m1, dst);
}

void AMX_NAME(moe8__gmm_init_amx)(moe8__ktable *k) {
  AMX_NAME(g_base_block) = k->gmm_block;
  AMX_NAME(g_base_pack_size) = k->gmm_pack_size;
  AMX_NAME(g_base_pack) = k->gmm_pack;
  k->gmm_block = AMX_NAME(amx_block);
  k->gmm_pack_size = AMX_NAME(amx_pack_size);
  k->gmm_pack = AMX_NAME(amx_pack);
  k->has_tiles = true;
}
