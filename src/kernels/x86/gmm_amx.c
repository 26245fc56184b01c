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
**                   wrapping i32 sums, so the bytes are the VNNI path's.
**   anything else   the AVX-512 table this one is built over.
**
** A task walks the scale blocks in order; each block in chunks of KC k.
** Per chunk: the panel; then per 32 rows × 32 columns four C tiles (zero
** at the block's start, else loaded from the block sums S), the pieces of
** the chunk (two A and two B tile loads, four dot products per piece),
** and the tiles stored back to S, or at the block's last chunk to a small
** buffer that is promoted into the f32 accumulator right away
** (acc + S · (ls · rs), a multiply then an add, as the reference) while
** the tile unit starts on the next tiles.  A row tile past the task's
** last row is loaded from a zero-padded copy of the rows.  Every tile is
** 16 rows × 64 bytes; the configuration is loaded at the start of each
** task on the thread that runs it and released at its end.
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
  return full * i8_block_bytes(b) + moe8__cdiv(last, 64) * 64;
}

static void pack_i8(const moe8__gmm_block *b, int64_t m0, int64_t m1, void *dst) {
  const int64_t rb = i8_row_bytes(b), bb = i8_block_bytes(b);
  for (int64_t m = m0; m < m1; m++) {
    uint8_t *d = (uint8_t *)dst + m * rb;
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

/* The task: C tiles 0-3 (rows r, columns c: 2r + c), A tiles 4-5, B 6-7. */
static void AMX_NAME(amx_task)(const moe8__gmm_block *b, bool i8) {
  const int64_t mt = b->m1 - b->m0, nt = b->n1 - b->n0, ntp = moe8__cdiv(nt, 32) * 32, nct = moe8__cdiv(nt, 16);
  float *acc = b->scratch, *S = acc + MT * NT;
  uint32_t *Bp = (uint32_t *)(S + MT * NT);
  int32_t *colsum = (int32_t *)(Bp + KC / 2 * NT);
  float *rsv = (float *)(colsum + NT), *tmp = rsv + NT, *T = tmp + 2 * NT;
  uint8_t *tail = (uint8_t *)(T + 32 * 32);
  const int64_t piece = i8 ? 64 : 32;                 /* k per tile row        */
  const int64_t rowb = i8 ? i8_row_bytes(b) : moe8__canon_row_words(b) * 4;
  const int64_t blkb = i8 ? i8_block_bytes(b) : moe8__canon_block_words(b) * 4;
  const uint8_t *A = (const uint8_t *)b->lhs_packed + b->m0 * rowb;
  amx_cfg cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.palette = 1;
  for (int i = 0; i < 8; i++) { cfg.colsb[i] = 64; cfg.rows[i] = 16; }
  T_CFG(&cfg);
  memset(acc, 0, sizeof(float) * (size_t)(mt * NT));
  for (int64_t blk = 0; blk < b->nbk; blk++) {
    const int64_t k0 = blk * b->kb, k1 = k0 + b->kb < b->K ? k0 + b->kb : b->K;
    rhs_scales(b, blk, ntp, rsv);
    for (int64_t c0 = k0; c0 < k1; c0 += KC) {
      const int64_t kc = c0 + KC < k1 ? KC : k1 - c0, npc = moe8__cdiv(kc, piece);
      const bool first = c0 == k0, last = c0 + KC >= k1;
      /* The panel: npc·16 rows of pairs or quads, NT words apart. */
      if (i8) {
        pack_b_i8(b, c0, kc, ntp, Bp, colsum);
        const int64_t kq = moe8__cdiv(kc, 4);
        memset(Bp + kq * NT, 0, sizeof(uint32_t) * (size_t)((16 * npc - kq) * NT));
      } else {
        pack_b_bf16(b, c0, kc, ntp, Bp, tmp);
        const int64_t kp = moe8__cdiv(kc, 2);
        memset(Bp + kp * NT, 0, sizeof(uint32_t) * (size_t)((16 * npc - kp) * NT));
      }
      const int64_t ac = blk * blkb + (c0 - k0) / piece * 64; /* byte offset of the chunk in a row */
      for (int64_t i = 0; i < mt; i += 32) {
        const int64_t r0 = mt - i < 16 ? mt - i : 16, r1 = mt - i - 16 < 16 ? mt - i - 16 : 16;
        const uint8_t *a0 = A + i * rowb + ac, *a1 = A + (i + 16) * rowb + ac;
        int64_t s0 = rowb, s1 = rowb;
        /* A row tile with missing rows comes from a zero-padded copy. */
        if (r0 < 16 || (r1 > 0 && r1 < 16)) {
          const int64_t rp = r0 < 16 ? r0 : r1;
          const uint8_t *src = r0 < 16 ? a0 : a1;
          memset(tail, 0, (size_t)(16 * npc * 64));
          for (int64_t r = 0; r < rp; r++) memcpy(tail + r * npc * 64, src + r * rowb, (size_t)(npc * 64));
          if (r0 < 16) { a0 = tail; s0 = npc * 64; } else { a1 = tail; s1 = npc * 64; }
        }
        for (int64_t ct = 0; ct < nct; ct += 2) {
          const bool two = ct + 1 < nct, down = r1 > 0;
          float *Sij = S + i * NT + 16 * ct;
          if (first) {
            T_ZERO(0); T_ZERO(1); T_ZERO(2); T_ZERO(3);
          } else {
            T_LOAD(0, Sij, NT * 4);
            if (two) T_LOAD(1, Sij + 16, NT * 4);
            if (down) T_LOAD(2, Sij + 16 * NT, NT * 4);
            if (down && two) T_LOAD(3, Sij + 16 * NT + 16, NT * 4);
          }
          for (int64_t q = 0; q < npc; q++) {
            const uint32_t *bq = Bp + 16 * q * NT + 16 * ct;
            T_LOAD(4, a0 + 64 * q, s0);
            T_LOAD(6, bq, NT * 4);
            if (two) T_LOAD(7, bq + 16, NT * 4);
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
          if (!last) {
            T_STORE(0, Sij, NT * 4);
            if (two) T_STORE(1, Sij + 16, NT * 4);
            if (down) T_STORE(2, Sij + 16 * NT, NT * 4);
            if (down && two) T_STORE(3, Sij + 16 * NT + 16, NT * 4);
            continue;
          }
          /* The block's sums: promote them now (32 × 32 at most). */
          T_STORE(0, T, 128);
          if (two) T_STORE(1, T + 16, 128);
          if (down) T_STORE(2, T + 16 * 32, 128);
          if (down && two) T_STORE(3, T + 16 * 32 + 16, 128);
          const int64_t rows = mt - i < 32 ? mt - i : 32, cols = two ? 32 : 16;
          for (int64_t r = 0; r < rows; r++) {
            const float l = moe8__gmm_ls(b, b->m0 + i + r, blk);
            float *o = acc + (i + r) * NT + 16 * ct;
            const float *rs = rsv + 16 * ct;
            if (i8) {
              const int32_t *t = (const int32_t *)T + r * 32;
              for (int64_t c = 0; c < cols; c++) o[c] = o[c] + (float)t[c] * (l * rs[c]);
            } else {
              const float *t = T + r * 32;
              for (int64_t c = 0; c < cols; c++) o[c] = o[c] + t[c] * (l * rs[c]);
            }
          }
        }
      }
    }
  }
  T_RELEASE();
  write_out(b, acc, mt);
}

static void AMX_NAME(amx_block)(const moe8__gmm_block *b) {
  if (is_i8(b)) AMX_NAME(amx_task)(b, true);
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
