/*
** gmm_x86.h — what the AVX-512 grouped-matmul family files share
** (docs/kernels.md "Adding a family"): the task and panel constants, the
** target attributes, the lhs packing paths and their word offsets, the
** small vector helpers, and the functions one family file calls in another.
**
**   gmm_x86_pack.c   lhs rows, B panels (f32, bf16 pairs, i8 quads), the FP8
**                    word tables, promotion and output
**   gmm_x86_f32.c    the f32 microkernel (avx512)
**   gmm_x86_bf16.c   vdpbf16ps microkernels and the small-M bf16 kernel (avx512_bf16)
**   gmm_x86_vnni.c   vpdpbusd microkernels and the small-M packed-i8 kernel (avx512_vnni)
**   gmm_x86_vbmi.c   the byte-table FP8 kernels (AVX512_VBMI)
**   gmm_x86_canon.c  the canonical order (any AVX-512 F table; the AMX tables' small-M path)
**   gmm_avx512.c     the panel block kernel over them, and the tables' entries
**   gmm_amx.c        the AMX family (tiles, or their model)
*/
#ifndef MOE8_GMM_X86_H
#define MOE8_GMM_X86_H

#include "../gmm.h"
#include "dot_avx512.h"
#include "fp8_avx512.h"

#include <immintrin.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

enum { NT = MOE8__GMM_NT, KC = 256, MR = 8, NR = 32, PF = 8 /* pairs of rows prefetched ahead */ };
/* How far ahead the packed decode kernels prefetch their stream, by
** vendor (moe8__cpu_features): on Intel 128 pairs (32 KiB of a 4-strip
** tile) into L2 took FP8 decode T=1 from 8.5 to 11.0 GB/s on one core of
** an AMX Xeon (65% to 84% of its read bandwidth) against 32 pairs into
** L1, whose fill buffers the prefetches held; on AMD Zen 32 pairs into L1
** is the tuned one (docs/performance.md; the far one is unmeasured there)
** and stays.  pk_prefetch issues either.  On Intel each line's prefetch
** goes right before the strip that reads the line 128 pairs back, not
** grouped per pair before the pair's strips: a loop of the one-row
** kernel's operations streamed 14 GB/s against 11 grouped, and the FP8
** kernels ran 4-9% faster (docs/performance.md). */
/* With the far prefetch, the line PKPF_L1 pairs ahead also goes into L1
** right before its strip (pk_prefetch_far): the strip's loads then find
** it there or on its way, and FP8 decode streamed 8-14% faster at 1-3 rows
** an expert on an AMX Xeon (docs/performance.md; 0 pairs ahead gave most
** of it, a no-op instruction in its place none). */
enum { PKPF_NEAR = 32, PKPF_FAR = 128, PKPF_L1 = 4 };
static inline bool pk_far(void) { return (moe8__cpu_features() & MOE8__CPU_INTEL) != 0; }
static inline __attribute__((always_inline)) void pk_prefetch(const void *p, bool far) {
  if (far) _mm_prefetch((const char *)p, _MM_HINT_T1);
  else _mm_prefetch((const char *)p, _MM_HINT_T0);
}
/* Intel's pair for the strip at r of a stream whose pair rows are step
** bytes apart: PKPF_FAR pairs ahead into L2, PKPF_L1 into L1. */
static inline __attribute__((always_inline)) void pk_prefetch_far(const uint8_t *r, size_t step) {
  _mm_prefetch((const char *)(r + PKPF_FAR * step), _MM_HINT_T1);
  _mm_prefetch((const char *)(r + PKPF_L1 * step), _MM_HINT_T0);
}

#define INLINE static inline __attribute__((always_inline))
/* The rows of the next group of a many-row kernel that walks a task's
** rows in groups of at most g (g >= 6): never a last group of one or two
** rows, whose 2-4 accumulator chains leave the dot unit idle on their
** latency (44% and 72% of the peak against 98% at 3-6 rows, vdpbf16ps on
** an AMD Zen 4), so 7 and 8 remaining rows go as 4 + 3 and 4 + 4. */
static inline int rows_next(int64_t left, int g) {
  return left > g + 2 ? g : left > g ? (int)(left - left / 2) : (int)left;
}
#define BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
#define VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))
#define VBMI_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx512vbmi")))

static inline size_t esize(moe8_dtype t) { return moe8__dtype_size(t); }

/* ---- the paths and their lhs packing ---------------------------------- */
typedef enum { PATH_F32, PATH_BF16, PATH_I8 } gmm_path;

/* bf16: the table may use vdpbf16ps. */
static inline gmm_path path_of(const moe8__gmm_block *b, bool bf16) {
  if (b->lt == MOE8_DTYPE_I8) return PATH_I8; /* needs VNNI; the caller checks */
  if (bf16 && b->lt != MOE8_DTYPE_F32 && b->rt != MOE8_DTYPE_F32) return PATH_BF16;
  return PATH_F32;
}

/* Packed lhs row length in 32-bit words: each scale block padded to a
** whole pair (bf16) or quad (i8). */
static inline int64_t packed_words(const moe8__gmm_block *b, gmm_path p) {
  if (p == PATH_F32) return b->K;
  if (p == PATH_BF16 && b->canon) return moe8__canon_row_words(b);
  const int64_t per = p == PATH_BF16 ? 2 : 4, full = b->K / b->kb, last = b->K - full * b->kb;
  return full * moe8__cdiv(b->kb, per) + moe8__cdiv(last, per);
}

/* Word offset of block blk in a packed row. */
static inline int64_t block_word(const moe8__gmm_block *b, gmm_path p, int64_t blk) {
  if (p == PATH_F32) return blk * b->kb;
  if (p == PATH_BF16 && b->canon) return blk * moe8__canon_block_words(b);
  return blk * moe8__cdiv(b->kb, p == PATH_BF16 ? 2 : 4);
}


/* ---- what the family files share (definitions in the file named) ------ */
/* The private names below are this folder's; each is a moe8__x86_ symbol. */
#define fp8_rows_to_bf16 moe8__x86_fp8_rows_to_bf16
#define pack_row moe8__x86_pack_row
#define rhs_scales moe8__x86_rhs_scales
#define rhs_scales_all moe8__x86_rhs_scales_all
#define rhs_scales_bytes moe8__x86_rhs_scales_bytes
#define promote moe8__x86_promote
#define write_out moe8__x86_write_out
#define pack_b_f32 moe8__x86_pack_b_f32
#define pack_b_bf16 moe8__x86_pack_b_bf16
#define pack_b_i8 moe8__x86_pack_b_i8
#define pack_b_pk_vbmi moe8__x86_pack_b_pk_vbmi
#define fp8_rows_to_bf16_vbmi moe8__x86_fp8_rows_to_bf16_vbmi
#define ukr_f32_any moe8__x86_ukr_f32_any
#define ukr_bf16_any moe8__x86_ukr_bf16_any
#define ukr_i8_any moe8__x86_ukr_i8_any
#define ukr_bf16_prom_any moe8__x86_ukr_bf16_prom_any
#define ukr_i8_prom_any moe8__x86_ukr_i8_prom_any
#define gmm_block_pk_small moe8__x86_gmm_block_pk_small
#define gmm_block_bf16_small moe8__x86_gmm_block_bf16_small
#define gmm_block_i8pk_small moe8__x86_gmm_block_i8pk_small
#define gmm_block_i8pk_small_rows moe8__x86_gmm_block_i8pk_small_rows
#define gmm_block_pk_canon moe8__x86_gmm_block_pk_canon
#define gmm_block_i8pk_rows moe8__x86_gmm_block_i8pk_rows
#define gmm_block_pk_rows moe8__x86_gmm_block_pk_rows
#define gmm_pk_rows_fits moe8__x86_gmm_pk_rows_fits
#define gmm_pk_canon_fits moe8__x86_gmm_pk_canon_fits
#define gmm_i8pk_rows_fits moe8__x86_gmm_i8pk_rows_fits
#define direct_fp8_vbmi_2rows moe8__x86_direct_fp8_vbmi_2rows
#define bf16_lut moe8__x86_bf16_lut

/* gmm_x86_pack.c */
const uint16_t *bf16_lut(moe8_dtype t); /* bf16 words of the 128 magnitudes */
void fp8_rows_to_bf16(uint16_t *dst, const uint8_t *src, size_t n, moe8_dtype type);
void pack_row(const moe8__gmm_block *b, gmm_path p, int64_t m, uint32_t *dst, float *tmp);
void rhs_scales(const moe8__gmm_block *b, int64_t blk, int64_t ntp, float *rsv);
const float *rhs_scales_all(const moe8__gmm_block *b, int64_t ntp, float *dst);
size_t rhs_scales_bytes(const moe8__gmm_block *b, int64_t ntp);
/* Block blk's column scales for ntp columns: its row of all (what
** rhs_scales_all returned), or, where that is NULL, read into rsv now. */
static inline const float *rhs_scales_at(const moe8__gmm_block *b, const float *all, int64_t blk, int64_t ntp, float *rsv) {
  if (all) return all + blk * ntp;
  rhs_scales(b, blk, ntp, rsv);
  return rsv;
}
void promote(const moe8__gmm_block *b, int64_t blk, float *C, const float *S, int64_t mt, int64_t ntp, float *rsv);
void write_out(const moe8__gmm_block *b, const float *C, int64_t mt);
void pack_b_f32(const moe8__gmm_block *b, int64_t c0, int64_t kc, int64_t ntp, float *Bp);
void pack_b_bf16(const moe8__gmm_block *b, int64_t c0, int64_t kc, int64_t ntp, uint32_t *Bp, float *tmp);
VNNI_TARGET void pack_b_i8(const moe8__gmm_block *b, int64_t c0, int64_t kc, int64_t ntp, uint32_t *Bp, int32_t *colsum);
/* gmm_x86_f32.c, gmm_x86_bf16.c, gmm_x86_vnni.c: the panel microkernels */
void ukr_f32_any(int mr, const float *A, int64_t lda, const float *B, int64_t k, float *S);
BF16_TARGET void ukr_bf16_any(int mr, const uint32_t *A, int64_t lda, const uint32_t *B, int64_t kp, float *S);
VNNI_TARGET void ukr_i8_any(int mr, const uint32_t *A, int64_t lda, const uint32_t *B, int64_t kq, int32_t *S);
BF16_TARGET void ukr_bf16_prom_any(int mr, const uint32_t *A, int64_t lda, const uint32_t *B, int64_t kp, const float *Ci, float *Co,
                                   int64_t ldo, __mmask16 m0, __mmask16 m1, const float *ls, const float *rs);
VNNI_TARGET void ukr_i8_prom_any(int mr, const uint32_t *A, int64_t lda, const uint32_t *B, int64_t kq, const float *Ci, float *Co,
                                 int64_t ldo, __mmask16 m0, __mmask16 m1, const float *ls, const float *rs, const int32_t *cs);
/* the small-M kernels (gmm_x86_bf16.c, gmm_x86_vbmi.c, gmm_x86_vnni.c) */
BF16_TARGET void gmm_block_bf16_small(const moe8__gmm_block *b);
VBMI_TARGET void gmm_block_pk_small(const moe8__gmm_block *b);
VNNI_TARGET void gmm_block_i8pk_small(const moe8__gmm_block *b);
VNNI_TARGET void gmm_block_i8pk_small_rows(const moe8__gmm_block *b, int64_t words, int64_t bw, uint32_t flip);
VNNI_TARGET void gmm_block_i8pk_rows(const moe8__gmm_block *b); /* packed i8, any rows (prefill) */
bool gmm_i8pk_rows_fits(const moe8__gmm_block *b);              /* its per-task tables fit the scratch */
VBMI_TARGET void gmm_block_pk_rows(const moe8__gmm_block *b);   /* packed FP8, any rows (prefill) */
bool gmm_pk_rows_fits(const moe8__gmm_block *b);                /* its converted tile fits the scratch */
VBMI_TARGET void gmm_block_pk_canon(const moe8__gmm_block *b); /* FP8 x packed FP8, canonical order */
bool gmm_pk_canon_fits(const moe8__gmm_block *b);               /* a block's split pairs fit the scratch */
VBMI_TARGET void direct_fp8_vbmi_2rows(int ng, const moe8__gmm_block *b, const uint32_t *A, int64_t words, int64_t blk, float *S);
/* n FP8 codes as their bf16 words (the AVX-512 table's cvt_f8_bf16 where the CPU has VBMI). */
VBMI_TARGET void fp8_rows_to_bf16_vbmi(uint16_t *dst, const uint8_t *src, size_t n, moe8_dtype type);
/* Packed FP8 pairs k = c0 .. c0 + 2·kp as bf16 pair words: pair p, strip s
** (32 columns) at Bp + p·ps + s·ss words (the panel: ps = NT, ss = 32). */
VBMI_TARGET void pack_b_pk_vbmi(const moe8__gmm_block *b, int64_t c0, int64_t kp, int64_t ntp, uint32_t *Bp, int64_t ps, int64_t ss,
                                int64_t pf);

/* The bf16 pair panel [kc/2][NT] of k = c0 .. c0 + kc for the block
** kernels: packed FP8 through the VBMI family's converter where the CPU
** has it, else the packer's own (the same words).  Which family runs is
** chosen here, by the kernels, not by the packer. */
static inline void panel_bf16(const moe8__gmm_block *b, int64_t c0, int64_t kc, int64_t ntp, uint32_t *Bp, float *tmp) {
  if (b->rhs_pk && b->rt != MOE8_DTYPE_I8 && moe8__cpu_has_vbmi()) pack_b_pk_vbmi(b, c0, (kc + 1) / 2, ntp, Bp, NT, 32, 0);
  else pack_b_bf16(b, c0, kc, ntp, Bp, tmp);
}

/* Streaming an output whose rows do not start on a 64-byte line (a
** malloc'd buffer is 16 bytes past one): s floats past the line, each
** row's vectors are realigned in registers (vpermt2ps) so that every
** whole line is written with one streaming store.  A row segment's tiles
** are written in column order; the last vector of one waits in carry (16
** floats a row) for the next one's first.  The segment's first and last
** partial lines, which it shares with its neighbours, are masked stores
** at the line's own address: a masked store that spans a line being
** streamed costs more than the rest of the kernel (the int8 prefill
** matmul 11.6 → 26.9 ms on an AMX Xeon).  Measured there (E=8, 512 rows
** an expert, one thread): a row 16 bytes off the lines 16-18 ms with
** masked stores, 13.4-14.5 ms so, 11.4-11.9 ms on lines; the two partial
** lines a task's row ends on cost the difference (prefetching them for
** writing did not help).  s = 0: the rows are on lines (plain
** streaming); s < 0: not even 4-byte aligned (no streaming). */
typedef struct moe8__shifted {
  int       s;
  bool      head, tail; /* the segment's first tile / last tile */
  __mmask16 lo;         /* lanes 0 .. s-1 of a line                    */
  __m512i   idx;        /* lane j of a line: j + 16 - s of (prev : next) */
} moe8__shifted;

static inline moe8__shifted shifted_at(const float *d, bool head, bool tail) {
  moe8__shifted sh = {.s = (uintptr_t)d & 3 ? -1 : (int)(((uintptr_t)d >> 2) & 15), .head = head, .tail = tail};
  if (sh.s > 0) {
    sh.lo = (__mmask16)((1u << sh.s) - 1);
    sh.idx = _mm512_add_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), _mm512_set1_epi32(16 - sh.s));
  }
  return sh;
}

/* One row's 16 or 32 columns (v0, v1 when two) at d. */
INLINE void shifted_put(const moe8__shifted *sh, float *d, float *cr, __m512 v0, __m512 v1, const bool two) {
  float *line = d - sh->s;
  if (sh->head) _mm512_mask_storeu_ps(line, (__mmask16)~sh->lo, _mm512_permutex2var_ps(v0, sh->idx, v0));
  else _mm512_stream_ps(line, _mm512_permutex2var_ps(_mm512_load_ps(cr), sh->idx, v0));
  __m512 last = v0;
  if (two) { _mm512_stream_ps(line + 16, _mm512_permutex2var_ps(v0, sh->idx, v1)); last = v1; line += 16; }
  if (sh->tail) _mm512_mask_storeu_ps(line + 16, sh->lo, _mm512_permutex2var_ps(last, sh->idx, last));
  else _mm512_store_ps(cr, last);
}

/* The carried vector's lanes into their partial line before d, when the
** tile at d is written otherwise (a masked tail). */
INLINE void shifted_flush(const moe8__shifted *sh, float *d, const float *cr) {
  const __m512 c = _mm512_load_ps(cr);
  _mm512_mask_storeu_ps(d - sh->s, sh->lo, _mm512_permutex2var_ps(c, sh->idx, c));
}

/* Co[i] = Ci[i] + c[i] · (ls[i] · rs) for the rows of a microkernel (Ci
** NULL: + 0.0), both 16-column halves; unrolled so the sums stay in
** registers.  stream: full masks and 64-byte aligned rows, written past
** the caches (a large output, moe8__gmm_block.out_stream; the kernel
** fences at its end). */
INLINE void prom_store_to(const int mr, __m512 c[MR][2], const float *Ci, float *Co, int64_t ldo, __mmask16 m0, __mmask16 m1,
                          const float *ls, const float *rs, const bool stream, const moe8__shifted *sh, float *carry) {
  const __m512 r0 = _mm512_loadu_ps(rs), r1 = _mm512_loadu_ps(rs + 16);
#pragma GCC unroll 8
  for (int i = 0; i < mr; i++) {
    const __m512 l = _mm512_set1_ps(ls[i]);
    const __m512 a0 = Ci ? _mm512_loadu_ps(Ci + i * NT) : _mm512_setzero_ps();
    const __m512 a1 = Ci ? _mm512_loadu_ps(Ci + i * NT + 16) : _mm512_setzero_ps();
    const __m512 v0 = _mm512_add_ps(a0, _mm512_mul_ps(c[i][0], _mm512_mul_ps(l, r0)));
    const __m512 v1 = _mm512_add_ps(a1, _mm512_mul_ps(c[i][1], _mm512_mul_ps(l, r1)));
    if (sh) shifted_put(sh, Co + i * ldo, carry + 16 * i, v0, v1, m1 != 0);
    else if (stream) {
      _mm512_stream_ps(Co + i * ldo, v0);
      _mm512_stream_ps(Co + i * ldo + 16, v1);
    } else {
      _mm512_mask_storeu_ps(Co + i * ldo, m0, v0);
      _mm512_mask_storeu_ps(Co + i * ldo + 16, m1, v1);
    }
  }
}

INLINE void prom_store(const int mr, __m512 c[MR][2], const float *Ci, float *Co, int64_t ldo, __mmask16 m0, __mmask16 m1,
                       const float *ls, const float *rs) {
  prom_store_to(mr, c, Ci, Co, ldo, m0, m1, ls, rs, false, NULL, NULL);
}

/* How the last block's columns j .. j+31 of a task (masks m0, m1; m1 = 0
** for 16 columns) go to the output rows at co, ldo floats apart, in a
** large output: OUT_STREAM on lines, OUT_SHIFT through the shifted
** writer (*sh filled; the rows' tiles in column order, carry 16 floats a
** row), else OUT_PLAIN masked stores, after the carry that shifted tiles
** before them left (rows mr) is written. */
enum { OUT_PLAIN, OUT_STREAM, OUT_SHIFT };
static inline int out_how(const moe8__gmm_block *b, float *co, int64_t ldo, __mmask16 m0, __mmask16 m1, int64_t j, int64_t mr,
                          const float *carry, moe8__shifted *sh) {
  if (!b->out_stream || (ldo & 15)) return OUT_PLAIN;
  const int64_t nt = b->n1 - b->n0;
  *sh = shifted_at(co, j == 0, j + 32 >= nt);
  if (sh->s < 0) return OUT_PLAIN;
  if (sh->s == 0) return m0 == 0xFFFF && m1 == 0xFFFF ? OUT_STREAM : OUT_PLAIN;
  if (m0 == 0xFFFF && (m1 == 0xFFFF || (m1 == 0 && j + 16 >= nt))) return OUT_SHIFT;
  for (int64_t r = 0; j > 0 && r < mr; r++) shifted_flush(sh, co + r * ldo, carry + 16 * r);
  return OUT_PLAIN;
}

/* BY_ROWS calls kern(literal mr, ...) for mr in 1..8: each tail gets its
** own unrolled kernel, and the sums are the same chains as the full
** MR-row kernel's (docs/determinism.md). */
#define BY_ROWS(mr, kern, ...)                    \
  switch (mr) {                                   \
    case 8: kern(8, __VA_ARGS__); break;          \
    case 7: kern(7, __VA_ARGS__); break;          \
    case 6: kern(6, __VA_ARGS__); break;          \
    case 5: kern(5, __VA_ARGS__); break;          \
    case 4: kern(4, __VA_ARGS__); break;          \
    case 3: kern(3, __VA_ARGS__); break;          \
    case 2: kern(2, __VA_ARGS__); break;          \
    default: kern(1, __VA_ARGS__); break;         \
  }

/* 32 FP8 codes -> 32 bf16 words: two 64-entry word permutes on the
** magnitude, a blend on its bit 6, the sign moved up by 8. */
INLINE __m512i fp8_to_bf16_32(__m256i bytes, const __m512i *lut) {
  const __m512i w = _mm512_cvtepu8_epi16(bytes);
  const __m512i mag = _mm512_and_si512(w, _mm512_set1_epi16(0x7F));
  const __m512i lo = _mm512_permutex2var_epi16(lut[0], mag, lut[1]);
  const __m512i hi = _mm512_permutex2var_epi16(lut[2], mag, lut[3]);
  const __m512i v = _mm512_mask_blend_epi16(_mm512_test_epi16_mask(w, _mm512_set1_epi16(0x40)), lo, hi);
  return _mm512_or_si512(v, _mm512_slli_epi16(_mm512_and_si512(w, _mm512_set1_epi16(0x80)), 8));
}

/* The word LUT of an FP8 format in four registers. */
INLINE void fp8_word_lut(moe8_dtype t, __m512i *lut) {
  const uint16_t *w = bf16_lut(t);
  for (int i = 0; i < 4; i++) lut[i] = _mm512_loadu_si512(w + 32 * i);
}

/* Packed rhs (gmm.h): word index, into the 64 words of one 64-byte strip,
** of pair vector word p: 16·(p/8) + p%8 (+ 8 for the second vector). */
INLINE __m512i pk_word_index(int half) {
  const __m512i p = _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16,
                                     15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  const __m512i hi = _mm512_slli_epi16(_mm512_srli_epi16(p, 3), 4), lo = _mm512_and_si512(p, _mm512_set1_epi16(7));
  return _mm512_add_epi16(_mm512_add_epi16(hi, lo), _mm512_set1_epi16((short)half));
}

/* Start of k group p (a pair for FP8, a quad for i8) of the task's column
** tile in the packed rhs; the group's 64-byte strips or vectors follow. */
static inline const uint8_t *pk_at(const moe8__gmm_block *b, int64_t p) {
  return b->rhs_pk + moe8__pk_row(b->rt, b->K, b->N, p, b->n0);
}

#endif /* MOE8_GMM_X86_H */
