/*
** gmm_x86_vnni.c — the vpdpbusd microkernels and the small-M kernel on packed i8
** weights (the avx512_vnni family).
*/
#include "gmm_x86.h"

VNNI_TARGET INLINE void ukr_i8(const int mr, const uint32_t *A, int64_t lda, const uint32_t *B, int64_t kq, int32_t *S) {
  __m512i c[MR][2];
  for (int i = 0; i < mr; i++) { c[i][0] = _mm512_loadu_si512(S + i * NT); c[i][1] = _mm512_loadu_si512(S + i * NT + 16); }
  for (int64_t k = 0; k < kq; k++) {
    const __m512i b0 = _mm512_loadu_si512(B + k * NT), b1 = _mm512_loadu_si512(B + k * NT + 16);
    for (int i = 0; i < mr; i++) {
      const __m512i a = _mm512_set1_epi32((int)A[i * lda + k]);
      c[i][0] = moe8__dpbusd(c[i][0], a, b0);
      c[i][1] = moe8__dpbusd(c[i][1], a, b1);
    }
  }
  for (int i = 0; i < mr; i++) { _mm512_storeu_si512(S + i * NT, c[i][0]); _mm512_storeu_si512(S + i * NT + 16, c[i][1]); }
}

VNNI_TARGET INLINE void ukr_i8_prom(const int mr, const uint32_t *A, int64_t lda, const uint32_t *B, int64_t kq,
                                    const float *Ci, float *Co, int64_t ldo, __mmask16 m0, __mmask16 m1,
                                    const float *ls, const float *rs, const int32_t *colsum) {
  __m512i c[MR][2];
  for (int i = 0; i < mr; i++) c[i][0] = c[i][1] = _mm512_setzero_si512();
  for (int64_t k = 0; k < kq; k++) {
    const __m512i b0 = _mm512_loadu_si512(B + k * NT), b1 = _mm512_loadu_si512(B + k * NT + 16);
    for (int i = 0; i < mr; i++) {
      const __m512i a = _mm512_set1_epi32((int)A[i * lda + k]);
      c[i][0] = moe8__dpbusd(c[i][0], a, b0);
      c[i][1] = moe8__dpbusd(c[i][1], a, b1);
    }
  }
  const __m512i k0 = _mm512_slli_epi32(_mm512_loadu_si512(colsum), 7), k1 = _mm512_slli_epi32(_mm512_loadu_si512(colsum + 16), 7);
  __m512 f[MR][2];
#pragma GCC unroll 8
  for (int i = 0; i < mr; i++) {
    f[i][0] = _mm512_cvtepi32_ps(_mm512_sub_epi32(c[i][0], k0));
    f[i][1] = _mm512_cvtepi32_ps(_mm512_sub_epi32(c[i][1], k1));
  }
  prom_store(mr, f, Ci, Co, ldo, m0, m1, ls, rs);
}

VNNI_TARGET void ukr_i8_any(int mr, const uint32_t *A, int64_t lda, const uint32_t *B, int64_t kq, int32_t *S) {
  BY_ROWS(mr, ukr_i8, A, lda, B, kq, S)
}

VNNI_TARGET void ukr_i8_prom_any(int mr, const uint32_t *A, int64_t lda, const uint32_t *B, int64_t kq, const float *Ci,
                                        float *Co, int64_t ldo, __mmask16 m0, __mmask16 m1, const float *ls, const float *rs,
                                        const int32_t *cs) {
  BY_ROWS(mr, ukr_i8_prom, A, lda, B, kq, Ci, Co, ldo, m0, m1, ls, rs, cs)
}

/* ---- the small-M kernel on packed i8 weights (AVX512_VNNI) ------------ */
/* The packed tile is one stream of quads: per quad, nv vectors of 16
** columns' words, read by vpdpbusd as they are (no conversion); the column
** sums for the +128 compensation come from vpdpbusd against ones, made by
** the block's first row pair and kept for the others.  mr (1 or 2) rows x
** nvv vectors from vector v0; at the block's end S = Σ(a+128)b - 128Σb,
** exact, and C += S · (ls · rs) as the panel path does: the same bytes.
** Rows go in pairs over all the tile's vectors at once, so each pass reads
** the tile front to back (the first from memory, the next from L2):
** four rows over half the vectors read every 512-byte quad row in halves,
** 1.4x slower at 4 rows per expert (measured). */
VNNI_TARGET INLINE void pk_i8(const int mr, const int nvv, const bool sums, const moe8__gmm_block *b, const uint32_t *A,
                              int64_t words, int64_t w0, uint32_t flip, int64_t blk, int64_t v0, int64_t nv, float *C,
                              const float *ls, const float *rsv, int32_t *cst) {
  const int64_t k0 = blk * b->kb, k1 = k0 + b->kb < b->K ? k0 + b->kb : b->K, kq = (k1 - k0 + 3) / 4;
  const uint8_t *r = pk_at(b, k0 / 4) + (size_t)v0 * 64;
  const size_t step = (size_t)nv * 64;
  const __m512i ones = _mm512_set1_epi8(1);
  __m512i c[2][8], cs[8];
#pragma GCC unroll 8
  for (int v = 0; v < nvv; v++) {
    cs[v] = _mm512_setzero_si512();
#pragma GCC unroll 2
    for (int i = 0; i < mr; i++) c[i][v] = _mm512_setzero_si512();
  }
  for (int64_t q = 0; q < kq; q++, r += step) {
    __m512i a[2];
#pragma GCC unroll 2
    for (int i = 0; i < mr; i++) a[i] = _mm512_set1_epi32((int)(A[i * words + w0 + q] ^ flip));
#pragma GCC unroll 8
    for (int v = 0; v < nvv; v++) {
      const __m512i x = _mm512_loadu_si512(r + 64 * v);
      if (sums) cs[v] = moe8__dpbusd(cs[v], ones, x);
#pragma GCC unroll 2
      for (int i = 0; i < mr; i++) c[i][v] = moe8__dpbusd(c[i][v], a[i], x);
    }
  }
#pragma GCC unroll 8
  for (int v = 0; v < nvv; v++) {
    const int64_t j = 16 * (v0 + v);
    if (sums) _mm512_storeu_si512(cst + j, cs[v]);
    else cs[v] = _mm512_loadu_si512(cst + j);
    const __m512 rs = _mm512_loadu_ps(rsv + j);
    const __m512i k = _mm512_slli_epi32(cs[v], 7);
#pragma GCC unroll 2
    for (int i = 0; i < mr; i++) {
      const __m512 s = _mm512_cvtepi32_ps(_mm512_sub_epi32(c[i][v], k));
      _mm512_storeu_ps(C + i * NT + j, _mm512_add_ps(_mm512_loadu_ps(C + i * NT + j), _mm512_mul_ps(s, _mm512_mul_ps(_mm512_set1_ps(ls[i]), rs))));
    }
  }
}

/* kern(mr, nvv, ...) with nvv (8, 4, 2 or 1 vectors) known at compile time. */
#define BY_NV(kern, mr, ...)                               \
  switch (nvv) {                                           \
    case 8: kern(mr, 8, __VA_ARGS__); break;               \
    case 4: kern(mr, 4, __VA_ARGS__); break;               \
    case 2: kern(mr, 2, __VA_ARGS__); break;               \
    default: kern(mr, 1, __VA_ARGS__); break;              \
  }
#define PK_NV(mr, ...) BY_NV(pk_i8, mr, __VA_ARGS__)

VNNI_TARGET static void pk_i8_any(int mr, int nvv, bool sums, const moe8__gmm_block *b, const uint32_t *A, int64_t words,
                                  int64_t w0, uint32_t flip, int64_t blk, int64_t v0, int64_t nv, float *C, const float *ls,
                                  const float *rsv, int32_t *cst) {
  if (mr == 2 && sums) PK_NV(2, true, b, A, words, w0, flip, blk, v0, nv, C, ls, rsv, cst)
  else if (mr == 2) PK_NV(2, false, b, A, words, w0, flip, blk, v0, nv, C, ls, rsv, cst)
  else if (sums) PK_NV(1, true, b, A, words, w0, flip, blk, v0, nv, C, ls, rsv, cst)
  else PK_NV(1, false, b, A, words, w0, flip, blk, v0, nv, C, ls, rsv, cst)
}

/* Three rows or more: the weights are made the unsigned side of
** vpdpbusd, b + 128 (one vpxord per vector, off the dot-product pipes),
** and the activations the signed one, so the +128 compensation is per
** row, 128 · Σa over the block, made once from the packed row, instead of
** per column (a vpdpbusd against ones for every vector, which left the
** few-row passes bound by dot products).  S = Σ(b+128)a - 128Σa = Σab,
** the same integer as pk_i8's Σ(a+128)b - 128Σb (i32 wraps alike and the
** sum fits), promoted as pk_i8 promotes: the same bytes.  Rows go in
** threes over all the tile's vectors (24 sums), so one pass serves three
** rows.  For one or two rows pk_i8 stays: there the pass waits on memory,
** and this loop streamed at 0.75x its speed on an AMD Zen 4 (same-process
** A/B; the cause was not found: not the prefetches, which made both
** slower). */
VNNI_TARGET INLINE void pk_i8x(const int mr, const int nvv, const moe8__gmm_block *b, const uint32_t *A, int64_t words,
                               int64_t w0, uint32_t sflip, int64_t blk, int64_t kq, int64_t v0, int64_t nv, float *C,
                               const float *ls, const float *rsv, const int32_t *asum) {
  const uint8_t *r = pk_at(b, blk * b->kb / 4) + (size_t)v0 * 64;
  const size_t step = (size_t)nv * 64;
  const __m512i top = _mm512_set1_epi8((char)0x80);
  __m512i c[3][8];
#pragma GCC unroll 8
  for (int v = 0; v < nvv; v++)
#pragma GCC unroll 3
    for (int i = 0; i < mr; i++) c[i][v] = _mm512_setzero_si512();
  for (int64_t q = 0; q < kq; q++, r += step) {
    __m512i a[3];
#pragma GCC unroll 3
    for (int i = 0; i < mr; i++) a[i] = _mm512_set1_epi32((int)(A[i * words + w0 + q] ^ sflip));
#pragma GCC unroll 8
    for (int v = 0; v < nvv; v++) {
      __m512i x = _mm512_loadu_si512(r + 64 * v);
      __asm__("" : "+v"(x)); /* a plain load, not folded into the vpxord (measured a little faster) */
      x = _mm512_xor_si512(x, top);
#pragma GCC unroll 3
      for (int i = 0; i < mr; i++) c[i][v] = moe8__dpbusd(c[i][v], x, a[i]);
    }
  }
#pragma GCC unroll 3
  for (int i = 0; i < mr; i++) {
    const __m512i k = _mm512_set1_epi32((int)((uint32_t)asum[i] << 7));
    const __m512 l = _mm512_set1_ps(ls[i]);
#pragma GCC unroll 8
    for (int v = 0; v < nvv; v++) {
      const int64_t j = 16 * (v0 + v);
      const __m512 s = _mm512_cvtepi32_ps(_mm512_sub_epi32(c[i][v], k));
      _mm512_storeu_ps(C + i * NT + j,
                       _mm512_add_ps(_mm512_loadu_ps(C + i * NT + j), _mm512_mul_ps(s, _mm512_mul_ps(l, _mm512_loadu_ps(rsv + j)))));
    }
  }
}

#define PKX_NV(mr, ...) BY_NV(pk_i8x, mr, __VA_ARGS__)

/* sflip: what turns a packed lhs word into the signed bytes of a; kq: the
** block's quads (both made once per block by i8pk_block_threes). */
VNNI_TARGET static void pk_i8x_any(int mr, int nvv, const moe8__gmm_block *b, const uint32_t *A, int64_t words, int64_t w0,
                                   uint32_t sflip, int64_t blk, int64_t kq, int64_t v0, int64_t nv, float *C,
                                   const float *ls, const float *rsv, const int32_t *asum) {
  if (mr == 3) PKX_NV(3, b, A, words, w0, sflip, blk, kq, v0, nv, C, ls, rsv, asum)
  else if (mr == 2) PKX_NV(2, b, A, words, w0, sflip, blk, kq, v0, nv, C, ls, rsv, asum)
  else PKX_NV(1, b, A, words, w0, sflip, blk, kq, v0, nv, C, ls, rsv, asum)
}

/* Four or five rows over a whole tile's eight vectors in one stream from
** memory.  Rows in threes read the tile once per three rows, the second
** pass from L2 taking about a third of the first's time (4 rows an expert
** streamed at 0.75x the speed of 3).  Here one loop sums the mr rows
** against the vectors in vm (28 or 30 accumulators; the activation words
** are read by vpdpbusd itself, from signed copies, and the +128 from
** memory, so no register holds a broadcast), touching every 128-byte pair
** of each 512-byte quad row, and a second loop then sums the vectors in
** vs, whose lines came into L2 beside their pair with the first loop's
** stream (a first loop that skips pairs, the even vectors then the odd
** ones, ran at 0.5-0.6x: those lines then came from memory one by one).
** In chunks of WQ quads, the sums kept in scratch between them (integer
** sums: any order gives the same value), so the second loop finds its
** lines in L2 whatever K.  Promoted as pk_i8x: the same bytes.  On an AMD
** Zen 4 (same-process A/B, 16 experts from memory): 4 rows 1.14x, 5 rows
** 1.06x, 7 as 5 + 2 1.10x, 8 as 5 + 3 1.03x against threes; 6 rows at
** once (30 accumulators over 5 vectors, then 3) was level with two
** threes, 4 + 2 and 5 + 1 slower, so six stay in threes
** (docs/performance.md). */
enum { WQ = 256, WROW = 8 * 64 /* a whole tile's quad row: 8 vectors */ };
static const int32_t g_top = (int32_t)0x80808080u;
VNNI_TARGET INLINE void pk_i8w_loop(const int mr, const int nvs, const int *vl, const uint8_t *r, const uint32_t *As, int64_t kw,
                                    int64_t q0, int64_t q1, int32_t *acc) {
  __m512i c[5][7];
#pragma GCC unroll 7
  for (int v = 0; v < nvs; v++)
#pragma GCC unroll 6
    for (int i = 0; i < mr; i++) c[i][v] = q0 ? _mm512_loadu_si512(acc + i * NT + 16 * vl[v]) : _mm512_setzero_si512();
  r += (size_t)q0 * WROW;
  for (int64_t q = q0; q < q1; q++, r += WROW) {
#pragma GCC unroll 7
    for (int v = 0; v < nvs; v++) {
      __m512i x = _mm512_loadu_si512(r + 64 * vl[v]);
      __asm__("vpxord %1%{1to16%}, %0, %0" : "+v"(x) : "m"(g_top)); /* b + 128 */
#pragma GCC unroll 6
      for (int i = 0; i < mr; i++) c[i][v] = moe8__dpbusd_b(c[i][v], x, As + i * kw + q);
    }
  }
#pragma GCC unroll 7
  for (int v = 0; v < nvs; v++)
#pragma GCC unroll 6
    for (int i = 0; i < mr; i++) _mm512_storeu_si512(acc + i * NT + 16 * vl[v], c[i][v]);
}

VNNI_TARGET INLINE void pk_i8w(const int mr, const moe8__gmm_block *b, const uint32_t *As, int64_t kw, int64_t blk, int64_t kq,
                               int32_t *acc) {
  static const int vm[2][7] = {{0, 1, 2, 3, 4, 5, 6}, {0, 1, 2, 3, 4, 6}};
  static const int vs[2][2] = {{7}, {5, 7}};
  const int nm = mr == 4 ? 7 : 6;
  const uint8_t *r = pk_at(b, blk * b->kb / 4);
  for (int64_t q0 = 0; q0 < kq; q0 += WQ) {
    const int64_t q1 = q0 + WQ < kq ? q0 + WQ : kq;
    pk_i8w_loop(mr, nm, vm[mr - 4], r, As, kw, q0, q1, acc);
    pk_i8w_loop(mr, 8 - nm, vs[mr - 4], r, As, kw, q0, q1, acc);
  }
}

VNNI_TARGET static void pk_i8w_any(int mr, const moe8__gmm_block *b, const uint32_t *As, int64_t kw, int64_t blk, int64_t kq,
                                   int32_t *acc) {
  if (mr == 4) pk_i8w(4, b, As, kw, blk, kq, acc);
  else pk_i8w(5, b, As, kw, blk, kq, acc);
}

/* Σ of the signed bytes of n packed words (bytewise word ^ sflip). */
VNNI_TARGET static int32_t packed_sum(const uint32_t *w, int64_t n, uint32_t sflip) {
  const __m512i ones = _mm512_set1_epi8(1), f = _mm512_set1_epi32((int)sflip);
  __m512i s = _mm512_setzero_si512();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? 0xFFFF : (__mmask16)((1u << (n - i)) - 1);
    s = moe8__dpbusd(s, ones, _mm512_maskz_xor_epi32(m, _mm512_maskz_loadu_epi32(m, w + i), f));
  }
  return _mm512_reduce_add_epi32(s);
}

/* The first rows of a whole tile in one stream (pk_i8w): 4 or 5 rows
** alone, 5 of 7 or 8 (the rest then in threes), where the signed words
** and the sums fit in the scratch ws of wsb bytes.  Returns the rows done
** (0: all in threes). */
VNNI_TARGET static int64_t i8pk_block_wide(const moe8__gmm_block *b, const uint32_t *A, int64_t words, int64_t bw, uint32_t sflip,
                                           int64_t blk, int64_t kq, int64_t nv, float *C, const float *rsv, void *ws, size_t wsb) {
  const int64_t mt = b->m1 - b->m0, w = mt == 4 ? 4 : 5;
  int32_t *acc = ws, asum[5];
  uint32_t *As = (uint32_t *)(acc + 5 * NT);
  if (nv != 8 || mt < 4 || mt == 6 || sizeof(int32_t) * (size_t)(5 * NT + (sflip ? w * kq : 0)) > wsb) return 0;
  const uint32_t *src = A + blk * bw;
  int64_t kw = words;
  if (sflip) { /* the words as signed bytes, each row's block together */
    const __m512i f = _mm512_set1_epi32((int)sflip);
    for (int64_t r = 0; r < w; r++)
      for (int64_t q = 0; q < kq; q += 16) {
        const __mmask16 m = kq - q >= 16 ? 0xFFFF : (__mmask16)((1u << (kq - q)) - 1);
        _mm512_mask_storeu_epi32(As + r * kq + q, m, _mm512_xor_si512(_mm512_maskz_loadu_epi32(m, src + r * words + q), f));
      }
    src = As;
    kw = kq;
  }
  for (int r = 0; r < w; r++) asum[r] = packed_sum(A + r * words + blk * bw, kq, sflip);
  pk_i8w_any((int)w, b, src, kw, blk, kq, acc);
  for (int r = 0; r < w; r++) {
    const __m512i k = _mm512_set1_epi32((int)((uint32_t)asum[r] << 7));
    const __m512 l = _mm512_set1_ps(moe8__gmm_ls(b, b->m0 + r, blk));
    for (int v = 0; v < 8; v++) {
      const __m512 s = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_loadu_si512(acc + r * NT + 16 * v), k));
      float *c = C + r * NT + 16 * v;
      _mm512_storeu_ps(c, _mm512_add_ps(_mm512_loadu_ps(c), _mm512_mul_ps(s, _mm512_mul_ps(l, _mm512_loadu_ps(rsv + 16 * v)))));
    }
  }
  return w;
}

/* One block of three rows or more: the first four or five at once where
** the tile is whole (i8pk_block_wide), the rest in threes. */
VNNI_TARGET static void i8pk_block_threes(const moe8__gmm_block *b, const uint32_t *A, int64_t words, int64_t bw, uint32_t flip,
                                          int64_t blk, int64_t nv, float *C, const float *rsv, void *ws, size_t wsb) {
  const int64_t mt = b->m1 - b->m0, k0 = blk * b->kb, kq = ((k0 + b->kb < b->K ? k0 + b->kb : b->K) - k0 + 3) / 4;
  const uint32_t sflip = flip ^ 0x80808080u; /* packed word -> signed bytes a */
  for (int64_t i = i8pk_block_wide(b, A, words, bw, sflip, blk, kq, nv, C, rsv, ws, wsb); i < mt;) {
    const int mr = mt - i < 3 ? (int)(mt - i) : 3; /* a partial tile's four rows: 3 + 1 (2 + 2 measured 7% slower) */
    float ls[3];
    int32_t asum[3];
    for (int r = 0; r < mr; r++) {
      ls[r] = moe8__gmm_ls(b, b->m0 + i + r, blk);
      asum[r] = packed_sum(A + (i + r) * words + blk * bw, kq, sflip);
    }
    for (int64_t v0 = 0; v0 < nv;) {
      const int64_t left = nv - v0;
      const int nvv = left >= 8 ? 8 : left >= 4 ? 4 : left >= 2 ? 2 : 1;
      pk_i8x_any(mr, nvv, b, A + i * words, words, blk * bw, sflip, blk, kq, v0, nv, C + i * NT, ls, rsv, asum);
      v0 += nvv;
    }
    i += mr;
  }
}

/* The small-M kernel over packed lhs rows of `words` words whose scale
** blocks start bw words apart: the VNNI packing ((a + 128) quads, flip 0)
** or the AMX tables' signed bytes with blocks padded to 64 (flip
** 0x80808080: a ^ 0x80 is a + 128, and a zero pad byte becomes the 0x80
** pad of the VNNI packing), so both give the same bytes. */
VNNI_TARGET void gmm_block_i8pk_small_rows(const moe8__gmm_block *b, int64_t words, int64_t bw, uint32_t flip) {
  const int64_t mt = b->m1 - b->m0, nt = b->n1 - b->n0, nv = moe8__cdiv(nt, 16);
  float *C = b->scratch;
  int32_t *cst = (int32_t *)(C + MOE8__GMM_MT * NT);
  float *rsall = (float *)(cst + NT);
  const uint32_t *A = (const uint32_t *)b->lhs_packed + (b->m0 - b->pk_row0) * words;
  memset(C, 0, sizeof(float) * (size_t)(mt * NT));
  /* Every block's scales before the stream (rhs_scales_all), after C. */
  const float *all = rhs_scales_all(b, nv * 16, rsall);
  /* the wide kernel's scratch: after the scales (or the one row of them) */
  char *ws = (char *)(rsall + (all ? b->nbk : 1) * nv * 16);
  ws += (64 - (uintptr_t)ws % 64) % 64;
  const ptrdiff_t wleft = (char *)b->scratch + MOE8__GMM_SCRATCH - ws;
  const size_t wsb = wleft > 0 ? (size_t)wleft : 0;
  for (int64_t blk = 0; blk < b->nbk; blk++) {
    const float *rsv = rhs_scales_at(b, all, blk, nv * 16, rsall);
    if (mt > 2) {
      i8pk_block_threes(b, A, words, bw, flip, blk, nv, C, rsv, ws, wsb);
      continue;
    }
    /* Rows in pairs (each row's sums are the same in any group of rows). */
    for (int64_t i = 0; i < mt; i += 2) {
      const int mr = mt - i < 2 ? (int)(mt - i) : 2;
      float ls[2];
      for (int r = 0; r < mr; r++) ls[r] = moe8__gmm_ls(b, b->m0 + i + r, blk);
      for (int64_t v0 = 0; v0 < nv;) {
        const int64_t left = nv - v0;
        const int nvv = left >= 8 ? 8 : left >= 4 ? 4 : left >= 2 ? 2 : 1;
        pk_i8_any(mr, nvv, i == 0, b, A + i * words, words, blk * bw, flip, blk, v0, nv, C + i * NT, ls, rsv, cst);
        v0 += nvv;
      }
    }
  }
  write_out(b, C, mt);
}

VNNI_TARGET void gmm_block_i8pk_small(const moe8__gmm_block *b) {
  gmm_block_i8pk_small_rows(b, packed_words(b, PATH_I8), block_word(b, PATH_I8, 1), 0);
}


/* ---- the many-row kernel on packed i8 weights (prefill) ----------------- */
/* Rows in sixes, and per six rows the tile's vectors in fours (64
** columns): a block's quads are summed in 24 registers straight from the
** packed tile (its vectors nv·64 bytes apart per quad: 256 bytes of each
** 512-byte quad row, which the prefetchers follow), with nothing stored
** between quads, then promoted once per block.  A group's whole block
** stays in registers, so a per-channel int8 layer (one block along K)
** stores its sums once; the tile (K/4 · 512 bytes) stays in L2 while the
** row groups pass over it.  Six rows by four vectors (24 sums, 4 weight
** vectors, a broadcast) ran 7-10% faster than eight by two in a bare loop
** on an AMX Xeon's AVX-512 units, the B lines from L2 (docs/performance.md).
** The column sums of the +128 compensation and the weight scales of
** every block are made once per task.  Same sums and promotion as the
** other i8 paths, so the same bytes.  While a task runs it prefetches the
** tile of its thread's next task (moe8__gmm_block.pk_next: 10% on E=64
** with 128 rows an expert, where each tile's first pass waited on
** memory), and a large output is written with streaming stores (2–5%). */
#ifndef BPF
#define BPF 16 /* quads of the tile prefetched ahead on its first pass */
#endif
enum { RI = 6, VG = 4 }; /* rows and vectors of the many-row kernel (RI <= MR) */

VNNI_TARGET INLINE void rows_i8(const int mr, const int nvv, const bool sums, const uint32_t *A, int64_t words, const uint8_t *B,
                                size_t step, int64_t kq, __m512i c[RI][VG], int32_t *cs, const uint8_t *pfb, int pfm) {
  const __m512i ones = _mm512_set1_epi8(1);
  __m512i s[VG];
#pragma GCC unroll 4
  for (int v = 0; v < nvv; v++) s[v] = _mm512_setzero_si512();
#pragma GCC unroll 8
  for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
    for (int v = 0; v < nvv; v++) c[i][v] = _mm512_setzero_si512();
  for (int64_t q = 0; q < kq; q++, B += step) {
    /* A line of the next task's tile every pfm + 1 quads (rows_i8_group). */
    if (pfb && !(q & pfm)) _mm_prefetch((const char *)pfb, _MM_HINT_T0), pfb += 64;
    __m512i b[VG];
#pragma GCC unroll 4
    for (int v = 0; v < nvv; v++) b[v] = _mm512_loadu_si512(B + 64 * v);
    if (sums) {
      /* The first pass over the tile reads it from memory: ask ahead. */
#pragma GCC unroll 4
      for (int v = 0; v < nvv; v++) {
        _mm_prefetch((const char *)(B + BPF * step + 64 * v), _MM_HINT_T0);
        s[v] = moe8__dpbusd(s[v], ones, b[v]);
      }
    }
#pragma GCC unroll 8
    for (int i = 0; i < mr; i++) {
      const __m512i a = _mm512_set1_epi32((int)A[i * words + q]);
#pragma GCC unroll 4
      for (int v = 0; v < nvv; v++) c[i][v] = moe8__dpbusd(c[i][v], a, b[v]);
    }
  }
  if (sums)
#pragma GCC unroll 4
    for (int v = 0; v < nvv; v++) _mm512_storeu_si512(cs + 16 * v, s[v]);
}

/* One row group × one group of vectors over every block: C (or the
** output rows, on the last block when direct) += S · (ls · rs), 32
** columns at a time.  Groups of four vectors keep those 32 columns on
** the row's 32-column grid, which the shifted writer of a large output
** needs (groups of three broke it: test_gmm's output tests failed). */
VNNI_TARGET INLINE void rows_i8_group(const int mr, const int nvv, const moe8__gmm_block *b, const uint32_t *A, int64_t words,
                                      int64_t i, int64_t v0, int64_t nv, float *C, int32_t *cs, const float *rsv,
                                      int64_t ntp, bool direct, const uint8_t **pf, const uint8_t *pf_end, int pfm, float *carry) {
  const int64_t nt = b->n1 - b->n0;
  const uint8_t *B = pk_at(b, 0) + (size_t)v0 * 64;
  const size_t step = (size_t)nv * 64;
  for (int64_t blk = 0; blk < b->nbk; blk++) {
    const int64_t k0 = blk * b->kb, k1 = k0 + b->kb < b->K ? k0 + b->kb : b->K, kq = (k1 - k0 + 3) / 4;
    __m512i c[RI][VG];
    /* Each pass asks for the next 64-byte lines of the next task's tile
    ** (one per pfm + 1 quads), so that tile is in this core's caches when
    ** its first row group starts: that pass would otherwise wait on memory. */
    const uint8_t *pfb = *pf < pf_end ? *pf : NULL;
    *pf += (size_t)(kq + pfm) / (size_t)(pfm + 1) * 64;
    /* The first row group sums the weight codes as it goes: the tile's
    ** first read then overlaps the dot products. */
    const int64_t j0 = 16 * v0;
    if (i == 0) rows_i8(mr, nvv, true, A + block_word(b, PATH_I8, blk), words, B + (size_t)(k0 / 4) * step, step, kq, c, cs + blk * ntp + j0, pfb, pfm);
    else rows_i8(mr, nvv, false, A + block_word(b, PATH_I8, blk), words, B + (size_t)(k0 / 4) * step, step, kq, c, NULL, pfb, pfm);
    float ls[RI];
    for (int r = 0; r < mr; r++) ls[r] = moe8__gmm_ls(b, b->m0 + i + r, blk);
    const bool last = direct && blk == b->nbk - 1;
#pragma GCC unroll 2
    for (int h = 0; 2 * h < nvv; h++) {
      const int64_t j = j0 + 32 * h;
      const bool two = 2 * h + 1 < nvv;
      const __m512i k0v = _mm512_slli_epi32(_mm512_loadu_si512(cs + blk * ntp + j), 7);
      const __m512i k1v = two ? _mm512_slli_epi32(_mm512_loadu_si512(cs + blk * ntp + j + 16), 7) : _mm512_setzero_si512();
      __m512 f[MR][2];
#pragma GCC unroll 8
      for (int r = 0; r < mr; r++) {
        f[r][0] = _mm512_cvtepi32_ps(_mm512_sub_epi32(c[r][2 * h], k0v));
        f[r][1] = two ? _mm512_cvtepi32_ps(_mm512_sub_epi32(c[r][2 * h + 1], k1v)) : _mm512_setzero_ps();
      }
      const int64_t w0 = last ? nt - j : 16, w1 = two ? (last ? nt - j - 16 : 16) : 0;
      const __mmask16 m0 = w0 >= 16 ? 0xFFFF : w0 > 0 ? (__mmask16)((1u << w0) - 1) : 0;
      const __mmask16 m1 = w1 >= 16 ? 0xFFFF : w1 > 0 ? (__mmask16)((1u << w1) - 1) : 0;
      float *co = last ? (float *)b->out + (b->m0 + i) * b->N + b->n0 + j : C + i * NT + j;
      const float *ci = blk ? C + i * NT + j : NULL, *rs = rsv + blk * ntp + j;
      moe8__shifted sh;
      const int how = last ? out_how(b, co, b->N, m0, m1, j, mr, carry, &sh) : OUT_PLAIN;
      if (how != OUT_PLAIN) prom_store_to(mr, f, ci, co, b->N, m0, m1, ls, rs, true, how == OUT_SHIFT ? &sh : NULL, carry);
      else prom_store(mr, f, ci, co, last ? b->N : NT, m0, m1, ls, rs);
    }
  }
}

#define RG_NV(mr, ...)                                             \
  do {                                                            \
    if (nvv >= 4) rows_i8_group(mr, 4, __VA_ARGS__);              \
    else if (nvv == 3) rows_i8_group(mr, 3, __VA_ARGS__);         \
    else if (nvv == 2) rows_i8_group(mr, 2, __VA_ARGS__);         \
    else rows_i8_group(mr, 1, __VA_ARGS__);                       \
  } while (0)

VNNI_TARGET static void rows_i8_group_any(int mr, int nvv, const moe8__gmm_block *b, const uint32_t *A, int64_t words,
                                          int64_t i, int64_t v0, int64_t nv, float *C, int32_t *cs, const float *rsv,
                                          int64_t ntp, bool direct, const uint8_t **pf, const uint8_t *pf_end, int pfm, float *carry) {
  switch (mr) {
    case 6: RG_NV(6, b, A, words, i, v0, nv, C, cs, rsv, ntp, direct, pf, pf_end, pfm, carry); break;
    case 5: RG_NV(5, b, A, words, i, v0, nv, C, cs, rsv, ntp, direct, pf, pf_end, pfm, carry); break;
    case 4: RG_NV(4, b, A, words, i, v0, nv, C, cs, rsv, ntp, direct, pf, pf_end, pfm, carry); break;
    case 3: RG_NV(3, b, A, words, i, v0, nv, C, cs, rsv, ntp, direct, pf, pf_end, pfm, carry); break;
    case 2: RG_NV(2, b, A, words, i, v0, nv, C, cs, rsv, ntp, direct, pf, pf_end, pfm, carry); break;
    default: RG_NV(1, b, A, words, i, v0, nv, C, cs, rsv, ntp, direct, pf, pf_end, pfm, carry); break;
  }
}

bool gmm_i8pk_rows_fits(const moe8__gmm_block *b) {
  const int64_t ntp = moe8__cdiv(b->n1 - b->n0, 16) * 16;
  return sizeof(float) * (size_t)(MOE8__GMM_MT * NT) + (size_t)(b->nbk * ntp) * 8 + sizeof(float) * RI * 16 <= MOE8__GMM_SCRATCH;
}

VNNI_TARGET void gmm_block_i8pk_rows(const moe8__gmm_block *b) {
  const int64_t mt = b->m1 - b->m0, nt = b->n1 - b->n0, nv = moe8__cdiv(nt, 16), ntp = nv * 16;
  float *C = b->scratch, *rsv = C + MOE8__GMM_MT * NT;
  int32_t *cs = (int32_t *)(rsv + b->nbk * ntp);
  float *carry = (float *)(cs + b->nbk * ntp); /* RI rows × 16 (out_how) */
  const int64_t words = packed_words(b, PATH_I8);
  const uint32_t *A = (const uint32_t *)b->lhs_packed + (b->m0 - b->pk_row0) * words;
  rhs_scales_all(b, ntp, rsv);
  const bool direct = b->ot == MOE8_DTYPE_F32;
  const uint8_t *pf = b->pk_next, *pf_end = b->pk_next ? b->pk_next + b->pk_next_bytes : NULL;
  /* The next tile's lines spread over the task's passes: one every 8
  ** quads, or every 4, 2, 1 where the passes are fewer than its lines. */
  const int64_t passes = moe8__cdiv(mt, RI) * moe8__cdiv(nv, VG), lines = (int64_t)(b->pk_next_bytes / 64);
  int pfm = 7;
  while (pfm > 0 && passes * moe8__cdiv(b->K, 4) / (pfm + 1) < lines) pfm >>= 1;
  for (int64_t i = 0, mr; i < mt; i += mr) {
    mr = rows_next(mt - i, RI);
    for (int64_t v0 = 0; v0 < nv; v0 += VG)
      rows_i8_group_any(mr, nv - v0 >= VG ? VG : (int)(nv - v0), b, A + i * words, words, i, v0, nv, C, cs, rsv, ntp, direct, &pf, pf_end,
                        pfm, carry);
  }
  if (!direct) write_out(b, C, mt);
  if (direct && b->out_stream) _mm_sfence(); /* the streamed rows before the driver's barrier */
}
