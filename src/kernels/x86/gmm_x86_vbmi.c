/*
** gmm_x86_vbmi.c — the FP8 kernels on AVX512_VBMI byte tables: the small-M kernels
** on plain and packed weights, and the packed-FP8 panel converter.
*/
#include "gmm_x86.h"

/* ---- the small-M FP8 kernel with byte tables (AVX512_VBMI) ------------ */
/* 64 codes at a time: vpermi2b looks up the low and the high byte of each
** code's bf16 word in two 128-entry byte tables (the magnitude indexes,
** the sign is ORed into the high byte), and in-lane unpacks build the
** k-pairs.  The unpacks leave the columns in a fixed order inside each
** 128-bit lane — pair vector q holds columns 16L + 4q + i (lane L, i < 4) —
** which the store undoes with a 4 x 4 transpose of 128-bit chunks.  Each
** column's sum runs over the same pairs in the same order as every other
** path, so the bytes are the same. */

static uint8_t g_bf16_bytes[2][2][128]; /* [format][lo, hi][magnitude] */
static pthread_once_t g_bytes_once = PTHREAD_ONCE_INIT;

static void fill_bytes(void) {
  for (int f = 0; f < 2; f++) {
    const uint16_t *w = bf16_lut(f ? MOE8_DTYPE_F8E5M2 : MOE8_DTYPE_F8E4M3);
    for (int c = 0; c < 128; c++) {
      g_bf16_bytes[f][0][c] = (uint8_t)(w[c] & 0xFF);
      g_bf16_bytes[f][1][c] = (uint8_t)(w[c] >> 8);
    }
  }
}

/* The low and the high byte of the bf16 word of each of 64 FP8 codes:
** two vpermi2b lookups in 128-entry byte tables (they read the index's low
** seven bits, the magnitude), the sign ORed into the high byte. */
VBMI_TARGET INLINE void bf16_bytes(__m512i x, const __m512i *tab, __m512i *lo, __m512i *hi) {
  *lo = _mm512_permutex2var_epi8(tab[0], x, tab[1]);
  *hi = _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(tab[2], x, tab[3]), x, _mm512_set1_epi8((char)0x80),
                                  0xF8); /* a | (b & c) */
}

VBMI_TARGET INLINE void byte_tables(moe8_dtype t, __m512i *tab) {
  pthread_once(&g_bytes_once, fill_bytes);
  const uint8_t (*b)[128] = g_bf16_bytes[t == MOE8_DTYPE_F8E5M2];
  tab[0] = _mm512_loadu_si512(b[0]);
  tab[1] = _mm512_loadu_si512(b[0] + 64);
  tab[2] = _mm512_loadu_si512(b[1]);
  tab[3] = _mm512_loadu_si512(b[1] + 64);
}

/* 64 packed codes -> the bf16 pair vectors of strip columns 0-15 and
** 16-31: the byte lookups, then two in-lane unpacks. */
VBMI_TARGET INLINE void pk_strip(const uint8_t *src, const __m512i *tab, __m512i *b0, __m512i *b1) {
  __m512i lo, hi;
  bf16_bytes(_mm512_loadu_si512(src), tab, &lo, &hi);
  *b0 = _mm512_unpacklo_epi8(lo, hi);
  *b1 = _mm512_unpackhi_epi8(lo, hi);
}

/* 4 x 4 transpose of 128-bit chunks: out[L] = (a[L], b[L], c[L], d[L]). */
INLINE void transpose_chunks(__m512 a, __m512 b, __m512 c, __m512 d, __m512 *o) {
  const __m512 ab_lo = _mm512_shuffle_f32x4(a, b, 0x44), ab_hi = _mm512_shuffle_f32x4(a, b, 0xEE);
  const __m512 cd_lo = _mm512_shuffle_f32x4(c, d, 0x44), cd_hi = _mm512_shuffle_f32x4(c, d, 0xEE);
  o[0] = _mm512_shuffle_f32x4(ab_lo, cd_lo, 0x88);
  o[1] = _mm512_shuffle_f32x4(ab_lo, cd_lo, 0xDD);
  o[2] = _mm512_shuffle_f32x4(ab_hi, cd_hi, 0x88);
  o[3] = _mm512_shuffle_f32x4(ab_hi, cd_hi, 0xDD);
}

/* n FP8 codes -> their bf16 words in order, 64 at a time: a vpermb puts
** codes 8L..8L+7 and 32+8L..32+8L+7 in the low and high halves of lane L,
** so that after the byte lookups the two in-lane unpacks give words 0-31
** and 32-63 in order: the same words as the word-table converter
** (fp8_rows_to_bf16) with fewer shuffles; a 512-row FP8 prefill task's
** packing and matmul 0.470 -> 0.449 ms on an AMX Xeon. */
VBMI_TARGET void fp8_rows_to_bf16_vbmi(uint16_t *dst, const uint8_t *src, size_t n, moe8_dtype type) {
  static const uint8_t order[64] = {
    0,  1,  2,  3,  4,  5,  6,  7,  32, 33, 34, 35, 36, 37, 38, 39, 8,  9,  10, 11, 12, 13, 14, 15, 40, 41, 42, 43, 44, 45, 46, 47,
    16, 17, 18, 19, 20, 21, 22, 23, 48, 49, 50, 51, 52, 53, 54, 55, 24, 25, 26, 27, 28, 29, 30, 31, 56, 57, 58, 59, 60, 61, 62, 63};
  __m512i tab[4];
  byte_tables(type, tab);
  const __m512i ix = _mm512_loadu_si512(order);
  for (size_t i = 0; i < n; i += 64) {
    const size_t left = n - i;
    const __mmask64 m = left >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << left) - 1);
    __m512i lo, hi;
    bf16_bytes(_mm512_permutexvar_epi8(ix, _mm512_maskz_loadu_epi8(m, src + i)), tab, &lo, &hi);
    const __m512i w0 = _mm512_unpacklo_epi8(lo, hi), w1 = _mm512_unpackhi_epi8(lo, hi);
    if (left >= 64) {
      _mm512_storeu_si512(dst + i, w0);
      _mm512_storeu_si512(dst + i + 32, w1);
    } else {
      _mm512_mask_storeu_epi16(dst + i, left >= 32 ? ~(__mmask32)0 : (((__mmask32)1 << left) - 1), w0);
      if (left > 32) _mm512_mask_storeu_epi16(dst + i + 32, ((__mmask32)1 << (left - 32)) - 1, w1);
    }
  }
}

/* mr rows x 64·ng columns starting at column j (j + 64·ng <= ntp), one
** pass over the weight rows. */
VBMI_TARGET INLINE void direct_fp8_vbmi(const int mr, const int ng, const moe8__gmm_block *b, const uint32_t *A, int64_t words,
                                        int64_t blk, int64_t j, const __m512i *tab, float *S) {
  const int64_t nt = b->n1 - b->n0, k0 = blk * b->kb, k1 = k0 + b->kb < b->K ? k0 + b->kb : b->K, kp = (k1 - k0 + 1) / 2;
  const int64_t w0 = block_word(b, PATH_BF16, blk);
  __mmask64 m[2];
  for (int g = 0; g < ng; g++) {
    const int64_t jg = j + 64 * g;
    m[g] = jg + 64 <= nt ? ~(__mmask64)0 : jg < nt ? (((__mmask64)1 << (nt - jg)) - 1) : 0;
  }
  __m512 c[4][2][4];
  for (int i = 0; i < mr; i++)
    for (int g = 0; g < ng; g++)
      for (int q = 0; q < 4; q++) c[i][g][q] = _mm512_setzero_ps();
  const uint8_t *base = (const uint8_t *)b->rhs + b->n0 + j;
  const size_t row = (size_t)b->N;
  for (int64_t p = 0; p < kp; p++) {
    const int64_t k = k0 + 2 * p;
    const uint8_t *r0p = base + (size_t)k * row;
    if (k + 2 * PF + 1 < k1)
      for (int g = 0; g < ng; g++) {
        _mm_prefetch((const char *)(r0p + 2 * PF * row + 64 * g), _MM_HINT_T0);
        _mm_prefetch((const char *)(r0p + (2 * PF + 1) * row + 64 * g), _MM_HINT_T0);
      }
    for (int g = 0; g < ng; g++) {
      const __m512i x0 = _mm512_maskz_loadu_epi8(m[g], r0p + 64 * g);
      const __m512i x1 = k + 1 < k1 ? _mm512_maskz_loadu_epi8(m[g], r0p + row + 64 * g) : _mm512_setzero_si512();
      __m512i lo0, hi0, lo1, hi1;
      bf16_bytes(x0, tab, &lo0, &hi0);
      bf16_bytes(x1, tab, &lo1, &hi1);
      const __m512i w0l = _mm512_unpacklo_epi8(lo0, hi0), w0h = _mm512_unpackhi_epi8(lo0, hi0);
      const __m512i w1l = _mm512_unpacklo_epi8(lo1, hi1), w1h = _mm512_unpackhi_epi8(lo1, hi1);
      const __m512i pq[4] = {_mm512_unpacklo_epi16(w0l, w1l), _mm512_unpackhi_epi16(w0l, w1l),
                             _mm512_unpacklo_epi16(w0h, w1h), _mm512_unpackhi_epi16(w0h, w1h)};
      for (int i = 0; i < mr; i++) {
        const __m512i a = _mm512_set1_epi32((int)A[i * words + w0 + p]);
        for (int q = 0; q < 4; q++) c[i][g][q] = moe8__dpbf16(c[i][g][q], (__m512bh)a, (__m512bh)pq[q]);
      }
    }
  }
  for (int i = 0; i < mr; i++)
    for (int g = 0; g < ng; g++) {
      __m512 o[4];
      transpose_chunks(c[i][g][0], c[i][g][1], c[i][g][2], c[i][g][3], o);
      for (int L = 0; L < 4; L++) _mm512_storeu_ps(S + i * NT + j + 64 * g + 16 * L, o[L]);
    }
}

/* The B panel of kp pairs from pair c0 / 2 of a packed rhs. */
VBMI_TARGET void pack_b_pk_vbmi(const moe8__gmm_block *b, int64_t c0, int64_t kp, int64_t ntp, uint32_t *Bp, int64_t ps, int64_t ss,
                                int64_t pf) {
  __m512i tab[4];
  byte_tables(b->rt, tab);
  const int64_t nst = ntp / 32;
  const uint8_t *r = pk_at(b, c0 / 2);
  /* pf > 0: the stream pf pairs ahead into L2, a line per line
  ** converted, so the next chunks' lines arrive while this one converts
  ** (the AMX kernel's few-row tasks: a burst of next-chunk prefetches per
  ** tile step stalled them, 31% of their time; measured). */
  for (int64_t p = 0; p < kp; p++, r += nst * 64)
    for (int64_t s = 0; s < nst; s++) {
      __m512i v0, v1;
      if (pf) _mm_prefetch((const char *)(r + pf * nst * 64 + 64 * s), _MM_HINT_T1);
      pk_strip(r + 64 * s, tab, &v0, &v1);
      _mm512_storeu_si512(Bp + p * ps + s * ss, v0);
      _mm512_storeu_si512(Bp + p * ps + s * ss + 16, v1);
    }
}

/* Two rows (the only case where the byte tables measured faster): both
** 64-column groups of the task in one pass, 16 accumulators. */
VBMI_TARGET void direct_fp8_vbmi_2rows(int ng, const moe8__gmm_block *b, const uint32_t *A, int64_t words, int64_t blk,
                                              float *S) {
  __m512i tab[4];
  byte_tables(b->rt, tab);
  if (ng == 2) direct_fp8_vbmi(2, 2, b, A, words, blk, 0, tab, S);
  else direct_fp8_vbmi(2, 1, b, A, words, blk, 0, tab, S);
}

/* ---- the small-M kernel on packed FP8 weights (AVX512_VBMI) ----------- */
/* C[i][32 (s0 + s) ..] += S · (ls · rs) for mr rows and ns strips of
** block sums S (the promotion of ukr_bf16_prom, in registers). */
VBMI_TARGET INLINE void pk_promote(const int mr, const int ns, __m512 (*c)[4][2], int64_t s0, float *C, const float *ls,
                                   const float *rsv) {
#pragma GCC unroll 4
  for (int s = 0; s < ns; s++) {
    const int64_t j = 32 * (s0 + s);
    const __m512 r0 = _mm512_loadu_ps(rsv + j), r1 = _mm512_loadu_ps(rsv + j + 16);
#pragma GCC unroll 8
    for (int i = 0; i < mr; i++) {
      const __m512 l = _mm512_set1_ps(ls[i]);
      _mm512_storeu_ps(C + i * NT + j, _mm512_add_ps(_mm512_loadu_ps(C + i * NT + j), _mm512_mul_ps(c[i][s][0], _mm512_mul_ps(l, r0))));
      _mm512_storeu_ps(C + i * NT + j + 16,
                       _mm512_add_ps(_mm512_loadu_ps(C + i * NT + j + 16), _mm512_mul_ps(c[i][s][1], _mm512_mul_ps(l, r1))));
    }
  }
}

/* The packed tile is one front-to-back stream: per k pair, nst strips of
** 64 codes.  A strip is two vpermi2b byte-table lookups (low and high byte
** of each code's bf16 word; the index's bit 7, the sign, is ignored and
** ORed into the high byte), then two in-lane unpacks give the pair vectors
** of columns 0-15 and 16-31 in order.  mr rows x ns strips, starting at
** strip s0; the block's sums never leave the registers and are promoted
** into C as ukr_bf16_prom does, so the bytes are the panel path's.  pf:
** prefetch the stream, PKPF_FAR pairs ahead (far) or PKPF_NEAR (the
** caller's choice, gmm_block_pk_small). */
VBMI_TARGET INLINE void pk_vbmi(const int mr, const int ns, const moe8__gmm_block *b, const uint32_t *A, int64_t words,
                                int64_t blk, int64_t s0, int64_t nst, const __m512i *tab, float *C, const float *ls,
                                const float *rsv, const bool pf, bool far) {
  const int64_t k0 = blk * b->kb, k1 = k0 + b->kb < b->K ? k0 + b->kb : b->K, kp = (k1 - k0 + 1) / 2;
  const int64_t w0 = block_word(b, PATH_BF16, blk);
  const uint8_t *r = pk_at(b, k0 / 2) + (size_t)s0 * 64;
  const size_t step = (size_t)nst * 64;
  __m512 c[4][4][2];
#pragma GCC unroll 4
  for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
    for (int s = 0; s < ns; s++) c[i][s][0] = c[i][s][1] = _mm512_setzero_ps();
  /* The tile's stream from memory: its lines PKPF_NEAR / _FAR pairs
  ** ahead (a task starts cold on a new stream, which the prefetchers pick
  ** up late; a prefetch past the end does not fault). */
  const size_t pfd = far ? PKPF_FAR : PKPF_NEAR;
  for (int64_t p = 0; p < kp; p++, r += step) {
    __m512i a[4];
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++) a[i] = _mm512_set1_epi32((int)A[i * words + w0 + p]);
    /* The prefetches: on Intel each right before its strip (pk_prefetch). */
#pragma GCC unroll 4
    for (int s = 0; s < ns; s++)
      if (pf && !far) pk_prefetch(r + pfd * step + 64 * s, far);
#pragma GCC unroll 4
    for (int s = 0; s < ns; s++) {
      __m512i b0, b1;
      if (pf && far) pk_prefetch_far(r + 64 * s, step);
      pk_strip(r + 64 * s, tab, &b0, &b1);
#pragma GCC unroll 4
      for (int i = 0; i < mr; i++) {
        c[i][s][0] = moe8__dpbf16(c[i][s][0], (__m512bh)a[i], (__m512bh)b0);
        c[i][s][1] = moe8__dpbf16(c[i][s][1], (__m512bh)a[i], (__m512bh)b1);
      }
    }
  }
  pk_promote(mr, ns, c, s0, C, ls, rsv);
}

/* Three to six rows over a tile of three or four strips, each strip's
** codes converted once (the row pairs of pk_vbmi convert them once per
** pair).  Four rows by four strips are 32 sums, more than the registers
** hold beside the tables; and a pass over half of each pair row's strips
** reads the stream in pieces, which on an AMD Zen 4 ran at a third of its
** speed from memory (its prefetchers follow whole rows).  So per chunk of
** up to PKH_CH pairs: pass A sums strips 0-1 and asks for the row's other
** lines into L1; pass B sums strips 2.. from L1.  Both passes ask for the
** next chunk's lines (contiguous: this block's next chunk or the next
** block) into L2, half a pair row at each pair, so the memory streams the
** next chunk all the while the passes work on this one (all of it asked
** for in pass B left pass A waiting).  The chains, their order and the
** promotion are pk_vbmi's: the same bytes.  A block longer than a chunk
** keeps its sums in Sm between chunks.  Five or six rows by two strips
** are 20 or 24 sums: there each row's pair word is read by vdpbf16ps
** itself from memory ({1to16}, moe8__dpbf16_b) instead of a broadcast
** register, so the sums, the four tables and the strip's vectors fit the
** 32 registers.  Same-process A/B on an AMD Zen 4 (docs/performance.md),
** one thread: against the row pairs 1.20-1.23x at 3 rows an expert,
** 1.46-1.49x at 4; the prefetch in both passes against pass B alone
** 1.38-1.40x more at 3 rows, 1.09-1.38x at 4, 1.12-1.23x at 5; five and
** six rows in one group against four and one, three and three 1.30x and
** 1.33x. */
enum { PKH_CH = 64, PKH_R = 6 }; /* pairs a chunk; rows at most */

/* The sums of mr rows x ns strips: from Sm (a chunk after the first) or zero. */
VBMI_TARGET INLINE void pkh_start(const int mr, const int ns, __m512 (*c)[4][2], const float *sm, bool load) {
#pragma GCC unroll 8
  for (int i = 0; i < mr; i++)
#pragma GCC unroll 2
    for (int s = 0; s < ns; s++)
#pragma GCC unroll 2
      for (int h = 0; h < 2; h++) c[i][s][h] = load ? _mm512_loadu_ps(sm + 32 * (2 * i + s) + 16 * h) : _mm512_setzero_ps();
}

/* The chunk's sums into Sm (the block goes on) or promoted into C as
** pk_vbmi's, strips s0.. of the tile. */
VBMI_TARGET INLINE void pkh_end(const int mr, const int ns, __m512 (*c)[4][2], float *sm, bool last, int64_t s0, float *C,
                                const float *ls, const float *rsv) {
  if (!last) {
#pragma GCC unroll 8
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 2
      for (int s = 0; s < ns; s++)
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) _mm512_storeu_ps(sm + 32 * (2 * i + s) + 16 * h, c[i][s][h]);
    return;
  }
  pk_promote(mr, ns, c, s0, C, ls, rsv);
}

/* mr rows of one pair against strips s0 .. s0 + ns - 1 of the pair row at r. */
VBMI_TARGET INLINE void pkh_pair(const int mr, const int ns, __m512 (*c)[4][2], const uint32_t *A, int64_t words, int64_t w,
                                 const uint8_t *r, const __m512i *tab) {
  /* Five rows or more (16-24 sums): each row's pair word read by
  ** vdpbf16ps itself from memory, no broadcast register. */
  __m512i a[4];
  if (mr <= 4)
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++) a[i] = _mm512_set1_epi32((int)A[i * words + w]);
#pragma GCC unroll 2
  for (int s = 0; s < ns; s++) {
    __m512i b0, b1;
    pk_strip(r + 64 * s, tab, &b0, &b1);
#pragma GCC unroll 8
    for (int i = 0; i < mr; i++) {
      if (mr > 4) {
        c[i][s][0] = moe8__dpbf16_b(c[i][s][0], b0, A + i * words + w);
        c[i][s][1] = moe8__dpbf16_b(c[i][s][1], b1, A + i * words + w);
      } else {
        /* i < 4 here (i & 3 keeps the unused instances' code in bounds) */
        c[i][s][0] = moe8__dpbf16(c[i][s][0], (__m512bh)a[i & 3], (__m512bh)b0);
        c[i][s][1] = moe8__dpbf16(c[i][s][1], (__m512bh)a[i & 3], (__m512bh)b1);
      }
    }
  }
}

VBMI_TARGET INLINE void pk_vbmi_h(const int mr, const int nb2, const moe8__gmm_block *b, const uint32_t *A, int64_t words,
                                  int64_t blk, const __m512i *tab, float *C, const float *ls, const float *rsv, float *Sm,
                                  __m512 (*c)[4][2]) {
  const int64_t k0 = blk * b->kb, k1 = k0 + b->kb < b->K ? k0 + b->kb : b->K, kp = (k1 - k0 + 1) / 2;
  const int64_t w0 = block_word(b, PATH_BF16, blk);
  const size_t step = (size_t)(2 + nb2) * 64, half = step / 2;
  const uint8_t *r0 = pk_at(b, k0 / 2);
  for (int64_t q0 = 0; q0 < kp; q0 += PKH_CH) {
    const int64_t q1 = q0 + PKH_CH < kp ? q0 + PKH_CH : kp;
    pkh_start(mr, 2, c, Sm, q0 > 0);
    const uint8_t *r = r0 + (size_t)q0 * step;
    const uint8_t *nx = r0 + (size_t)q1 * step; /* the next chunk, half a pair row a pair in each pass */
    for (int64_t p = q0; p < q1; p++, r += step, nx += half) {
#pragma GCC unroll 2
      for (int s = 0; s < nb2; s++) _mm_prefetch((const char *)(r + 64 * (2 + s)), _MM_HINT_T0);
      for (size_t l = 0; l < half; l += 64) _mm_prefetch((const char *)(nx + l), _MM_HINT_T1);
      pkh_pair(mr, 2, c, A, words, w0 + p, r, tab);
    }
    pkh_end(mr, 2, c, Sm, q1 == kp, 0, C, ls, rsv);
    pkh_start(mr, nb2, c, Sm + PKH_R * 64, q0 > 0);
    r = r0 + (size_t)q0 * step;
    for (int64_t p = q0; p < q1; p++, r += step, nx += step - half) {
      for (size_t l = 0; l < step - half; l += 64) _mm_prefetch((const char *)(nx + l), _MM_HINT_T1);
      pkh_pair(mr, nb2, c, A, words, w0 + p, r + 128, tab);
    }
    pkh_end(mr, nb2, c, Sm + PKH_R * 64, q1 == kp, 2, C, ls, rsv);
  }
}

/* Seven or eight rows over a tile of three or four strips: pk_vbmi_h's
** order of work with one strip a pass (16 sums; each row's pair word read
** from memory): per chunk, the first pass reads whole pair rows and asks
** for the row's other lines into L1, the others read their strip from L1;
** each pass asks for a quarter of the next chunk into L2. */
VBMI_TARGET INLINE void pk_vbmi_q(const int mr, const moe8__gmm_block *b, const uint32_t *A, int64_t words, int64_t blk, int64_t nst,
                                  const __m512i *tab, float *C, const float *ls, const float *rsv, float *Sm, __m512 (*c)[4][2]) {
  const int64_t k0 = blk * b->kb, k1 = k0 + b->kb < b->K ? k0 + b->kb : b->K, kp = (k1 - k0 + 1) / 2;
  const int64_t w0 = block_word(b, PATH_BF16, blk);
  const size_t step = (size_t)nst * 64;
  const uint8_t *r0 = pk_at(b, k0 / 2);
  for (int64_t q0 = 0; q0 < kp; q0 += PKH_CH) {
    const int64_t q1 = q0 + PKH_CH < kp ? q0 + PKH_CH : kp;
    const uint8_t *nx = r0 + (size_t)q1 * step; /* the next chunk, 64 bytes a pair in each pass */
    for (int64_t s = 0; s < nst; s++) {
      float *sm = Sm + s * MR * 64; /* a pass's sums between chunks: MR rows x 64 (pkh_end's layout) */
      pkh_start(mr, 1, c, sm, q0 > 0);
      const uint8_t *r = r0 + (size_t)q0 * step;
      for (int64_t p = q0; p < q1; p++, r += step, nx += 64) {
        if (s == 0)
          for (int64_t t = 1; t < nst; t++) _mm_prefetch((const char *)(r + 64 * t), _MM_HINT_T0);
        _mm_prefetch((const char *)nx, _MM_HINT_T1);
        pkh_pair(mr, 1, c, A, words, w0 + p, r + 64 * s, tab);
      }
      pkh_end(mr, 1, c, sm, q1 == kp, s, C, ls, rsv);
    }
  }
}

VBMI_TARGET __attribute__((noinline)) static void pk_vbmi_q_any(int mr, const moe8__gmm_block *b, const uint32_t *A, int64_t words, int64_t blk,
                                                                int64_t nst, const __m512i *tab, float *C, const float *ls, const float *rsv,
                                                                float *Sm) {
  __m512 c[MR][4][2]; /* a chunk's sums (registers) */
  if (mr == 8) pk_vbmi_q(8, b, A, words, blk, nst, tab, C, ls, rsv, Sm, c);
  else pk_vbmi_q(7, b, A, words, blk, nst, tab, C, ls, rsv, Sm, c);
}

/* Five or six rows, with their own six-row array of sums. */
VBMI_TARGET __attribute__((noinline)) static void pk_vbmi_h56_any(int mr, int nb2, const moe8__gmm_block *b, const uint32_t *A, int64_t words,
                                                                  int64_t blk, const __m512i *tab, float *C, const float *ls, const float *rsv,
                                                                  float *Sm) {
  __m512 c[PKH_R][4][2]; /* a chunk's sums (registers) */
  if (mr == 6 && nb2 == 2) pk_vbmi_h(6, 2, b, A, words, blk, tab, C, ls, rsv, Sm, c);
  else if (mr == 6) pk_vbmi_h(6, 1, b, A, words, blk, tab, C, ls, rsv, Sm, c);
  else if (nb2 == 2) pk_vbmi_h(5, 2, b, A, words, blk, tab, C, ls, rsv, Sm, c);
  else pk_vbmi_h(5, 1, b, A, words, blk, tab, C, ls, rsv, Sm, c);
}

VBMI_TARGET static void pk_vbmi_h_any(int mr, int nb2, const moe8__gmm_block *b, const uint32_t *A, int64_t words, int64_t blk,
                                      const __m512i *tab, float *C, const float *ls, const float *rsv, float *Sm) {
  __m512 c[4][4][2]; /* a chunk's sums, in registers (an array for six rows here made three and four rows 3% slower) */
  if (mr > 4) pk_vbmi_h56_any(mr, nb2, b, A, words, blk, tab, C, ls, rsv, Sm);
  else if (mr == 4 && nb2 == 2) pk_vbmi_h(4, 2, b, A, words, blk, tab, C, ls, rsv, Sm, c);
  else if (mr == 4) pk_vbmi_h(4, 1, b, A, words, blk, tab, C, ls, rsv, Sm, c);
  else if (nb2 == 2) pk_vbmi_h(3, 2, b, A, words, blk, tab, C, ls, rsv, Sm, c);
  else pk_vbmi_h(3, 1, b, A, words, blk, tab, C, ls, rsv, Sm, c);
}



/* ns strips per pass (four, or the tile's last ones), one or two rows:
** the accumulators stay in registers. */
#define PK_NS(mr, pf, ...)                                 \
  switch (ns) {                                            \
    case 4: pk_vbmi(mr, 4, __VA_ARGS__, pf, far); break;   \
    case 2: pk_vbmi(mr, 2, __VA_ARGS__, pf, far); break;   \
    default: pk_vbmi(mr, 1, __VA_ARGS__, pf, far); break;  \
  }

VBMI_TARGET static void pk_vbmi_any(int mr, int ns, const moe8__gmm_block *b, const uint32_t *A, int64_t words, int64_t blk,
                                    int64_t s0, int64_t nst, const __m512i *tab, float *C, const float *ls, const float *rsv,
                                    bool pf, bool far) {
  if (mr == 4 && ns == 2) pk_vbmi(4, 2, b, A, words, blk, s0, nst, tab, C, ls, rsv, pf, far);
  else if (mr == 4) pk_vbmi(4, 1, b, A, words, blk, s0, nst, tab, C, ls, rsv, pf, far);
  else if (mr == 3 && ns == 2) pk_vbmi(3, 2, b, A, words, blk, s0, nst, tab, C, ls, rsv, pf, far);
  else if (mr == 3) pk_vbmi(3, 1, b, A, words, blk, s0, nst, tab, C, ls, rsv, pf, far);
  else if (mr == 2) PK_NS(2, true, b, A, words, blk, s0, nst, tab, C, ls, rsv) /* two rows always prefetch (pf) */
  else if (pf) PK_NS(1, true, b, A, words, blk, s0, nst, tab, C, ls, rsv)
  else PK_NS(1, false, b, A, words, blk, s0, nst, tab, C, ls, rsv)
}

/* One row against a whole tile (four strips) on AMD: every block in one
** loop, the block's sums promoted into the output in registers (c =
** c + S · (ls · rs) from zero, as pk_promote adds into the zeroed C: the
** same bytes), stored once at the end.  Per block, pk_vbmi's call and its
** promotion through C left the one-row stream from memory 13% slower at
** 128-blocks than with one block, 41% at 256-blocks (AMD Zen 4, 64
** experts x K 2048 x N 768); this loop: docs/performance.md. */
VBMI_TARGET static void pk_vbmi_row(const moe8__gmm_block *b, const uint32_t *A, const __m512i *tab, float *C, const float *all,
                                    float *rsall) {
  const size_t step = 4 * 64;
  const uint8_t *r = pk_at(b, 0);
  __m512 c[4][2];
#pragma GCC unroll 4
  for (int s = 0; s < 4; s++) c[s][0] = c[s][1] = _mm512_setzero_ps();
  for (int64_t blk = 0; blk < b->nbk; blk++) {
    const int64_t k0 = blk * b->kb, k1 = k0 + b->kb < b->K ? k0 + b->kb : b->K, kp = (k1 - k0 + 1) / 2;
    const uint32_t *Ab = A + block_word(b, PATH_BF16, blk);
    __m512 acc[4][2];
#pragma GCC unroll 4
    for (int s = 0; s < 4; s++) acc[s][0] = acc[s][1] = _mm512_setzero_ps();
    for (int64_t p = 0; p < kp; p++, r += step) {
      const __m512i a = _mm512_set1_epi32((int)Ab[p]);
#pragma GCC unroll 4
      for (int s = 0; s < 4; s++) {
        __m512i b0, b1;
        pk_strip(r + 64 * s, tab, &b0, &b1);
        acc[s][0] = moe8__dpbf16(acc[s][0], (__m512bh)a, (__m512bh)b0);
        acc[s][1] = moe8__dpbf16(acc[s][1], (__m512bh)a, (__m512bh)b1);
      }
    }
    const float *rsv = rhs_scales_at(b, all, blk, 128, rsall);
    const __m512 l = _mm512_set1_ps(moe8__gmm_ls(b, b->m0, blk));
#pragma GCC unroll 4
    for (int s = 0; s < 4; s++) {
      c[s][0] = _mm512_add_ps(c[s][0], _mm512_mul_ps(acc[s][0], _mm512_mul_ps(l, _mm512_loadu_ps(rsv + 32 * s))));
      c[s][1] = _mm512_add_ps(c[s][1], _mm512_mul_ps(acc[s][1], _mm512_mul_ps(l, _mm512_loadu_ps(rsv + 32 * s + 16))));
    }
  }
#pragma GCC unroll 4
  for (int s = 0; s < 4; s++) {
    _mm512_storeu_ps(C + 32 * s, c[s][0]);
    _mm512_storeu_ps(C + 32 * s + 16, c[s][1]);
  }
}

VBMI_TARGET void gmm_block_pk_small(const moe8__gmm_block *b) {
  const int64_t mt = b->m1 - b->m0, nt = b->n1 - b->n0, nst = moe8__cdiv(nt, 32);
  /* Software prefetch of the stream: on Intel always (PKPF_FAR into L2);
  ** on AMD from two rows.  One row (one pass, from memory) streamed faster
  ** on the hardware prefetchers alone on an AMD Zen 4 (1.13x against
  ** PKPF_NEAR into L1, about 1.2x against PKPF_FAR).  Two rows, bound by
  ** the conversion and the dot products in cache, take the far prefetch
  ** (pk_vbmi: 1.05x / 1.05-1.08x at 2 rows an expert on 1 / 2 threads,
  ** 1.22x on the down projection's shape, the layer at T=16 1.02x;
  ** same-process A/B), where the near one had cost 8%.  Three or more go
  ** through pk_vbmi_h's own prefetch, or in a tile of one or two strips
  ** pk_vbmi's near one (prefetching only in the later passes cost 10-17%
  ** at 3-6 rows). */
  const bool pf = pk_far() || mt >= 2, far = pk_far() || mt == 2;
  /* On AMD three to eight rows go together (pk_vbmi_h, pk_vbmi_q); Intel keeps the
  ** row pairs it was tuned with (its far prefetch, not measured there
  ** with pk_vbmi_h). */
  const bool rows4 = !pk_far();
  float *C = b->scratch, *rsall = C + MOE8__GMM_MT * NT;
  float *Sm = C + MR * NT; /* pk_vbmi_h's sums between chunks, after the task's rows of C */
  const int64_t words = packed_words(b, PATH_BF16);
  const uint32_t *A = (const uint32_t *)b->lhs_packed + (b->m0 - b->pk_row0) * words;
  __m512i tab[4];
  byte_tables(b->rt, tab);
  memset(C, 0, sizeof(float) * (size_t)(mt * NT));
  /* Every block's scales before the stream (rhs_scales_all), after C. */
  const float *all = rhs_scales_all(b, nst * 32, rsall);
  if (mt == 1 && rows4 && nst == 4 && b->kb >= 256) { /* one row, a whole tile, AMD, long blocks (pk_vbmi_row) */
    pk_vbmi_row(b, A, tab, C, all, rsall);
    write_out(b, C, mt);
    return;
  }
  for (int64_t blk = 0; blk < b->nbk; blk++) {
    const float *rsv = rhs_scales_at(b, all, blk, nst * 32, rsall);
    /* Rows in pairs over all the tile's strips, each pass reading the tile
    ** front to back (four rows over half the strips in two passes read
    ** every pair row in halves: 8% slower at 4 rows per expert, measured);
    ** on AMD three to eight rows at a time (pk_vbmi_h, pk_vbmi_q, or one
    ** pass where the tile has one or two strips): five to eight rows in
    ** one group over a tile of three or four strips (each strip converted
    ** once; against four and one, three and three, four and three, four
    ** and four: 1.30x, 1.33x, 1.17x, 1.05x, measured).  With one or two
    ** strips five rows go as four and one, six as three and three (1.20x
    ** and 1.11x against three and two, four and two, measured).  A row's
    ** sums are the same chains in any group. */
    for (int64_t i = 0; i < mt;) {
      const int64_t left = mt - i;
      const int mr = !rows4 || left < 3 ? (left < 2 ? (int)left : 2)
                     : left >= 5 && left <= 8 && nst > 2 ? (int)left
                     : left == 3 || left == 6 ? 3 : 4;
      float ls[MR];
      for (int r = 0; r < mr; r++) ls[r] = moe8__gmm_ls(b, b->m0 + i + r, blk);
      if (mr > 6) pk_vbmi_q_any(mr, b, A + i * words, words, blk, nst, tab, C + i * NT, ls, rsv, Sm);
      else if (mr > 2 && nst > 2) pk_vbmi_h_any(mr, (int)nst - 2, b, A + i * words, words, blk, tab, C + i * NT, ls, rsv, Sm);
      else if (mr > 2) pk_vbmi_any(mr, (int)nst, b, A + i * words, words, blk, 0, nst, tab, C + i * NT, ls, rsv, pf, far);
      else
        for (int64_t s0 = 0; s0 < nst;) {
          const int ns = nst - s0 >= 4 ? 4 : nst - s0 >= 2 ? 2 : 1;
          pk_vbmi_any(mr, ns, b, A + i * words, words, blk, s0, nst, tab, C + i * NT, ls, rsv, pf, far);
          s0 += ns;
        }
      i += mr;
    }
  }
  write_out(b, C, mt);
}


/* ---- the canonical order on packed FP8 weights, few rows ---------------- */
/* The canonical order (gmm.h) straight from the packed tile, as pk_vbmi
** streams it: per piece of 16 pairs each row and strip keeps an even and
** an odd f32 chain from zero (the pair words split by a shift and a mask),
** FMAs as ukr_canon's (FP8 products are exact), then the block sum adds
** even + odd; no panel is written, so the weights are read once.  The
** chains, their order and the promotion are ukr_canon's and promote's, so
** the bytes are moe8__gmm_canon_avx512's.  One call sums the block's pairs
** [q0, q1) (whole pieces); a block that several calls share keeps its sums
** in Sm between them (rows NT apart, the strip's columns) and the last one
** promotes: s + (e + o) per piece in the same order either way. */
VBMI_TARGET INLINE void pk_canon(const int mr, const int ns, const moe8__gmm_block *b, int64_t blk, int64_t s0, int64_t nst,
                                 const __m512i *tab, float *C, const float *ls, const float *rsv, const float *ax, int64_t q0,
                                 int64_t q1, float *Sm) {
  const int64_t k0 = blk * b->kb, k1 = k0 + b->kb < b->K ? k0 + b->kb : b->K, kp = (k1 - k0 + 1) / 2;
  const uint8_t *r = pk_at(b, k0 / 2 + q0) + (size_t)s0 * 64;
  const size_t step = (size_t)nst * 64;
  const __m512i hi = _mm512_set1_epi32((int)0xFFFF0000u);
  const bool far = pk_far();
  const size_t pfd = far ? PKPF_FAR : PKPF_NEAR;
  __m512 s[4][4][2];
#pragma GCC unroll 4
  for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
    for (int t = 0; t < ns; t++) {
      const float *sm = Sm + i * NT + 32 * (s0 + t);
      s[i][t][0] = q0 > 0 ? _mm512_loadu_ps(sm) : _mm512_setzero_ps();
      s[i][t][1] = q0 > 0 ? _mm512_loadu_ps(sm + 16) : _mm512_setzero_ps();
    }
  for (int64_t p0 = q0; p0 < q1; p0 += 16) {
    __m512 e[4][4][2], o[4][4][2];
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
      for (int t = 0; t < ns; t++) e[i][t][0] = e[i][t][1] = o[i][t][0] = o[i][t][1] = _mm512_setzero_ps();
    const int64_t pe = p0 + 16 < q1 ? p0 + 16 : q1;
    for (int64_t p = p0; p < pe; p++, r += step) {
      __m512 ae[4], ao[4];
#pragma GCC unroll 4
      for (int i = 0; i < mr; i++) { /* split once for every strip group (gmm_block_pk_canon) */
        ae[i] = _mm512_set1_ps(ax[2 * (i * kp + p)]);
        ao[i] = _mm512_set1_ps(ax[2 * (i * kp + p) + 1]);
      }
#pragma GCC unroll 4
      for (int t = 0; t < ns; t++)
        if (!far) pk_prefetch(r + pfd * step + 64 * t, far);
#pragma GCC unroll 4
      for (int t = 0; t < ns; t++) {
        __m512i b0, b1;
        if (far) pk_prefetch_far(r + 64 * t, step); /* right before its strip (pk_prefetch) */
        pk_strip(r + 64 * t, tab, &b0, &b1);
        const __m512 be0 = _mm512_castsi512_ps(_mm512_slli_epi32(b0, 16)), bo0 = _mm512_castsi512_ps(_mm512_and_si512(b0, hi));
        const __m512 be1 = _mm512_castsi512_ps(_mm512_slli_epi32(b1, 16)), bo1 = _mm512_castsi512_ps(_mm512_and_si512(b1, hi));
#pragma GCC unroll 4
        for (int i = 0; i < mr; i++) {
          e[i][t][0] = _mm512_fmadd_ps(ae[i], be0, e[i][t][0]); e[i][t][1] = _mm512_fmadd_ps(ae[i], be1, e[i][t][1]);
          o[i][t][0] = _mm512_fmadd_ps(ao[i], bo0, o[i][t][0]); o[i][t][1] = _mm512_fmadd_ps(ao[i], bo1, o[i][t][1]);
        }
      }
    }
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
      for (int t = 0; t < ns; t++) {
        s[i][t][0] = _mm512_add_ps(s[i][t][0], _mm512_add_ps(e[i][t][0], o[i][t][0]));
        s[i][t][1] = _mm512_add_ps(s[i][t][1], _mm512_add_ps(e[i][t][1], o[i][t][1]));
      }
  }
  if (q1 < kp) { /* the block goes on in the next call */
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
      for (int t = 0; t < ns; t++) {
        _mm512_storeu_ps(Sm + i * NT + 32 * (s0 + t), s[i][t][0]);
        _mm512_storeu_ps(Sm + i * NT + 32 * (s0 + t) + 16, s[i][t][1]);
      }
    return;
  }
  pk_promote(mr, ns, s, s0, C, ls, rsv);
}

VBMI_TARGET static void pk_canon_any(int mr, int ns, const moe8__gmm_block *b, int64_t blk, int64_t s0, int64_t nst,
                                     const __m512i *tab, float *C, const float *ls, const float *rsv, const float *ax, int64_t q0,
                                     int64_t q1, float *Sm) {
  /* ns: 4 strips for one row, 2 for two, 1 for three or four (the chains
  ** stay in registers). */
  if (mr == 1 && ns == 4) pk_canon(1, 4, b, blk, s0, nst, tab, C, ls, rsv, ax, q0, q1, Sm);
  else if (mr == 1 && ns == 2) pk_canon(1, 2, b, blk, s0, nst, tab, C, ls, rsv, ax, q0, q1, Sm);
  else if (mr == 1) pk_canon(1, 1, b, blk, s0, nst, tab, C, ls, rsv, ax, q0, q1, Sm);
  else if (mr == 2 && ns == 2) pk_canon(2, 2, b, blk, s0, nst, tab, C, ls, rsv, ax, q0, q1, Sm);
  else if (mr == 2) pk_canon(2, 1, b, blk, s0, nst, tab, C, ls, rsv, ax, q0, q1, Sm);
  else if (mr == 3) pk_canon(3, 1, b, blk, s0, nst, tab, C, ls, rsv, ax, q0, q1, Sm);
  else pk_canon(4, 1, b, blk, s0, nst, tab, C, ls, rsv, ax, q0, q1, Sm);
}

/* Scratch: C, four rows of a block's pairs split into f32 (ax), every
** block's column scales (rhs_scales_all), and four rows of block sums (Sm). */
static size_t pk_canon_ax_floats(const moe8__gmm_block *b) { return (size_t)moe8__cdiv(8 * moe8__cdiv(b->kb, 2), 16) * 16; }
bool gmm_pk_canon_fits(const moe8__gmm_block *b) {
  return sizeof(float) * ((size_t)(MOE8__GMM_MT * NT + 4 * NT) + pk_canon_ax_floats(b)) + rhs_scales_bytes(b, NT) <= MOE8__GMM_SCRATCH;
}

/* FP8 x packed FP8 in the canonical order, a task of any rows (four at a
** time); the caller checks the operands and gmm_pk_canon_fits
** (moe8__gmm_canon_avx512).  Each block's activation pairs are split into
** their even and odd f32 once per row group (ax) instead of once per strip
** group: two ALU operations a row and pair less for every strip group
** after the first. */
VBMI_TARGET void gmm_block_pk_canon(const moe8__gmm_block *b) {
  const int64_t mt = b->m1 - b->m0, nt = b->n1 - b->n0, nst = moe8__cdiv(nt, 32);
  float *C = b->scratch, *ax = C + MOE8__GMM_MT * NT, *rsall = ax + pk_canon_ax_floats(b);
  float *Sm = rsall + rhs_scales_bytes(b, nst * 32) / sizeof(float);
  const int64_t words = moe8__canon_row_words(b);
  const uint32_t *A = (const uint32_t *)b->lhs_packed + (b->m0 - b->pk_row0) * words;
  __m512i tab[4];
  byte_tables(b->rt, tab);
  memset(C, 0, sizeof(float) * (size_t)(mt * NT));
  rhs_scales_all(b, nst * 32, rsall); /* before the stream (rhs_scales_all) */
  for (int64_t blk = 0; blk < b->nbk; blk++) {
    const float *rsv = rsall + blk * nst * 32;
    for (int64_t i = 0; i < mt; i += 4) {
      const int mr = mt - i < 4 ? (int)(mt - i) : 4, nsmax = mr == 1 ? 4 : mr == 2 ? 2 : 1;
      float ls[4];
      for (int r = 0; r < mr; r++) ls[r] = moe8__gmm_ls(b, b->m0 + i + r, blk);
      const int64_t k0 = blk * b->kb, kp = ((k0 + b->kb < b->K ? k0 + b->kb : b->K) - k0 + 1) / 2;
      const int64_t w0 = moe8__canon_block_words(b) * blk;
      for (int r = 0; r < mr; r++)
        for (int64_t p = 0; p < kp; p++) {
          const uint32_t w = A[(i + r) * words + w0 + p], e = w << 16, o = w & 0xFFFF0000u;
          memcpy(ax + 2 * (r * kp + p), &e, 4);
          memcpy(ax + 2 * (r * kp + p) + 1, &o, 4);
        }
      /* One pass over the strips: the whole block in one call.  Several
      ** passes: all of them over a piece of 16 pairs before the next
      ** piece, so they read the same 16 pair rows close together; the
      ** block's sums wait in Sm (3 rows an expert 0.92-0.96x the time, 2
      ** rows the same, same-process A/B on an AMX Xeon,
      ** docs/performance.md). */
      const bool one = nsmax >= nst;
      for (int64_t q0 = 0; q0 < kp; q0 += one ? kp : 16) {
        const int64_t q1 = one || q0 + 16 > kp ? kp : q0 + 16;
        for (int64_t s0 = 0; s0 < nst;) {
          const int ns = nst - s0 >= nsmax ? nsmax : nst - s0 >= 2 && nsmax >= 2 ? 2 : 1;
          pk_canon_any(mr, ns, b, blk, s0, nst, tab, C + i * NT, ls, rsv, ax, q0, q1, Sm);
          s0 += ns;
        }
      }
    }
  }
  write_out(b, C, mt);
}

/* ---- the many-row kernel on packed FP8 weights (prefill) ---------------- */
/* The task's whole tile is converted once to bf16 pairs, strip by strip
** (a strip's K/2 pairs of 128 bytes contiguous), then rows in sixes walk
** each strip over every block with the output in registers: per block 12
** sums from zero (vdpbf16ps, pairs in K order, as every native path),
** then C += S · (ls · rs) in registers, so nothing is stored between
** blocks and the row group's output is written once.  The strip (K · 64
** bytes) stays in L2 while the row groups pass over it.  Same sums and
** promotion as ukr_bf16_prom and pk_vbmi: the same bytes.  As the int8
** kernel does, each pass prefetches lines of the thread's next tile (its
** FP8 codes, which the next task converts) and a large output is
** streamed: 5% on both prefill shapes, same-process A/B. */
enum { RF = 6 }; /* 12 sums + 12 outputs + 2 weight vectors + a broadcast */

VBMI_TARGET INLINE void rows_f8_strip(const int mr, const moe8__gmm_block *b, const uint32_t *A, int64_t words,
                                      const uint32_t *Bs, const float *rsv, int64_t ntp, int64_t i, int64_t j, const uint8_t *pfb,
                                      float *carry) {
  __m512 c[RF][2];
#pragma GCC unroll 6
  for (int r = 0; r < mr; r++) c[r][0] = c[r][1] = _mm512_setzero_ps();
  for (int64_t blk = 0; blk < b->nbk; blk++) {
    const int64_t k0 = blk * b->kb, k1 = k0 + b->kb < b->K ? k0 + b->kb : b->K, kp = (k1 - k0 + 1) / 2;
    const uint32_t *Ab = A + block_word(b, PATH_BF16, blk), *Bb = Bs + (k0 / 2) * 32;
    __m512 s[RF][2];
#pragma GCC unroll 6
    for (int r = 0; r < mr; r++) s[r][0] = s[r][1] = _mm512_setzero_ps();
    for (int64_t p = 0; p < kp; p++, Bb += 32) {
      if (pfb && !(p & 7)) _mm_prefetch((const char *)(pfb + (k0 / 16 + p / 8) * 64), _MM_HINT_T0);
      const __m512i b0 = _mm512_loadu_si512(Bb), b1 = _mm512_loadu_si512(Bb + 16);
#pragma GCC unroll 6
      for (int r = 0; r < mr; r++) {
        const __m512i a = _mm512_set1_epi32((int)Ab[r * words + p]);
        s[r][0] = moe8__dpbf16(s[r][0], a, b0);
        s[r][1] = moe8__dpbf16(s[r][1], a, b1);
      }
    }
    const __m512 r0 = _mm512_loadu_ps(rsv + blk * ntp + j), r1 = _mm512_loadu_ps(rsv + blk * ntp + j + 16);
#pragma GCC unroll 6
    for (int r = 0; r < mr; r++) {
      const __m512 l = _mm512_set1_ps(moe8__gmm_ls(b, b->m0 + i + r, blk));
      c[r][0] = _mm512_add_ps(c[r][0], _mm512_mul_ps(s[r][0], _mm512_mul_ps(l, r0)));
      c[r][1] = _mm512_add_ps(c[r][1], _mm512_mul_ps(s[r][1], _mm512_mul_ps(l, r1)));
    }
  }
  const int64_t nt = b->n1 - b->n0, w0 = nt - j, w1 = nt - j - 16;
  const __mmask16 m0 = w0 >= 16 ? 0xFFFF : (__mmask16)((1u << w0) - 1);
  const __mmask16 m1 = w1 >= 16 ? 0xFFFF : w1 > 0 ? (__mmask16)((1u << w1) - 1) : 0;
  if (b->ot == MOE8_DTYPE_F32) {
    float *o = (float *)b->out + (b->m0 + i) * b->N + b->n0 + j;
    moe8__shifted sh;
    const int how = out_how(b, o, b->N, m0, m1, j, mr, carry, &sh);
    if (how == OUT_STREAM) {
#pragma GCC unroll 6
      for (int r = 0; r < mr; r++) {
        _mm512_stream_ps(o + r * b->N, c[r][0]);
        _mm512_stream_ps(o + r * b->N + 16, c[r][1]);
      }
      return;
    }
    if (how == OUT_SHIFT) {
#pragma GCC unroll 6
      for (int r = 0; r < mr; r++) shifted_put(&sh, o + r * b->N, carry + 16 * r, c[r][0], c[r][1], m1 != 0);
      return;
    }
#pragma GCC unroll 6
    for (int r = 0; r < mr; r++) {
      _mm512_mask_storeu_ps(o + r * b->N, m0, c[r][0]);
      _mm512_mask_storeu_ps(o + r * b->N + 16, m1, c[r][1]);
    }
  } else {
    float t[RF][32];
    uint16_t *o = (uint16_t *)b->out + (b->m0 + i) * b->N + b->n0 + j;
    const int64_t w = w0 < 32 ? w0 : 32;
    for (int r = 0; r < mr; r++) {
      _mm512_storeu_ps(t[r], c[r][0]);
      _mm512_storeu_ps(t[r] + 16, c[r][1]);
      for (int64_t x = 0; x < w; x++) o[r * b->N + x] = moe8_f32_to_bf16(t[r][x]);
    }
  }
}

VBMI_TARGET static void rows_f8_strip_any(int mr, const moe8__gmm_block *b, const uint32_t *A, int64_t words, const uint32_t *Bs,
                                          const float *rsv, int64_t ntp, int64_t i, int64_t j, const uint8_t *pfb, float *carry) {
  switch (mr) {
    case 6: rows_f8_strip(6, b, A, words, Bs, rsv, ntp, i, j, pfb, carry); break;
    case 5: rows_f8_strip(5, b, A, words, Bs, rsv, ntp, i, j, pfb, carry); break;
    case 4: rows_f8_strip(4, b, A, words, Bs, rsv, ntp, i, j, pfb, carry); break;
    case 3: rows_f8_strip(3, b, A, words, Bs, rsv, ntp, i, j, pfb, carry); break;
    case 2: rows_f8_strip(2, b, A, words, Bs, rsv, ntp, i, j, pfb, carry); break;
    default: rows_f8_strip(1, b, A, words, Bs, rsv, ntp, i, j, pfb, carry); break;
  }
}

/* Scratch: the converted tile (K/2 pairs x ntp columns of words) and the
** weight scales of every block. */
bool gmm_pk_rows_fits(const moe8__gmm_block *b) {
  const int64_t ntp = moe8__cdiv(b->n1 - b->n0, 32) * 32, kp = (b->K + 1) / 2;
  return (size_t)(kp * ntp) * 4 + (size_t)(b->nbk * ntp) * 4 + sizeof(float) * RF * 16 <= MOE8__GMM_SCRATCH;
}

VBMI_TARGET void gmm_block_pk_rows(const moe8__gmm_block *b) {
  const int64_t mt = b->m1 - b->m0, nst = moe8__cdiv(b->n1 - b->n0, 32), ntp = nst * 32, kp = (b->K + 1) / 2;
  uint32_t *Bp = b->scratch;
  float *rsv = (float *)(Bp + kp * ntp), *carry = rsv + b->nbk * ntp; /* RF rows × 16 (out_how) */
  const int64_t words = packed_words(b, PATH_BF16);
  const uint32_t *A = (const uint32_t *)b->lhs_packed + (b->m0 - b->pk_row0) * words;
  pack_b_pk_vbmi(b, 0, kp, ntp, Bp, 32, kp * 32, 0);
  rhs_scales_all(b, ntp, rsv);
  const uint8_t *pf = b->pk_next, *pf_end = b->pk_next ? b->pk_next + b->pk_next_bytes : NULL;
  for (int64_t i = 0, mr; i < mt; i += mr) {
    mr = rows_next(mt - i, RF);
    for (int64_t s = 0; s < nst; s++) {
      const uint8_t *pfb = pf < pf_end ? pf : NULL;
      pf += (size_t)(kp + 7) / 8 * 64;
      rows_f8_strip_any(mr, b, A + i * words, words, Bp + s * kp * 32, rsv, ntp, i, 32 * s, pfb, carry);
    }
  }
  if (b->out_stream) _mm_sfence(); /* the streamed rows before the driver's barrier */
}
