/*
** gmm_avx512.c — AVX-512 grouped-matmul block kernels (contract in
** kernels/gmm.h).  Three paths, picked per call by operand types and ISA:
**
**   f32 path   (avx512)       lhs f32, or any float pair on plain AVX-512:
**                             both operands converted exactly to f32,
**                             FMA chains along k.
**   bf16 path  (avx512_bf16)  lhs bf16 or FP8, rhs bf16, FP8 or i8: every
**                             value is exact in bf16; vdpbf16ps sums k pairs.
**   i8 path    (avx512_vnni)  i8·i8: vpdpbusd on (a + 128) and b, exact in
**                             i32, minus 128·Σb per column (the unsigned
**                             offset compensation).
**
** The lhs is packed once per call (the table's gmm_pack, pack_row: f32 rows, bf16 pairs
** or (a+128) quads, each scale block padded to a whole pair or quad), so a
** task reads it in place.  A task is (group, row range of up to MOE8__GMM_MT
** rows, column range of up to NT = 128): it walks the scale blocks along K
** in order, cuts each block into chunks of at most KC k for the caches,
** packs the B panel of a chunk once and runs every row of the task against
** it.  The block sum S of each element lives in scratch between chunks, so
** its order along k is one chain whatever the chunking and whatever the
** task's rows and columns.  At a block's end C += S · (ls · rs) with a
** separate multiply and add, as the reference does.
**
** Scratch (floats): C[mt][NT], S[mt][NT], Sf[mt][NT] (i8), B panel, rows.
** Packed B: f32 [kc][NT]; bf16 pairs [kc/2][NT] (k even in the low half);
** i8 quads [kc/4][NT].  Padding k and padding columns are zero (i8 lhs pads
** with 0x80, i.e. a = 0), so they add exactly nothing.
**
** Tasks of at most MR rows (decode) skip the panel: on plain weights the
** small-M kernels decode the weight rows in registers; on weights packed by
** moe8_gmm_pack_rhs (gmm.h) they stream the packed tile front to back —
** FP8 through byte tables (AVX512_VBMI), i8 straight into vpdpbusd.  Every
** path sums each element's pairs or quads in the same order along k and
** promotes with the same operations, so all give the same bytes.
*/
#include "../gmm.h"
#include "fp8_avx512.h"

#include <immintrin.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

enum { NT = MOE8__GMM_NT, KC = 256, MR = 8, NR = 32, PF = 8 /* pairs of rows prefetched ahead */ };
#ifndef PKPF
#define PKPF 32 /* pairs of a packed tile prefetched ahead */
#endif

#define INLINE static inline __attribute__((always_inline))
#define BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
#define VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))

static size_t esize(moe8_dtype t) { return moe8__dtype_size(t); }

/* ---- conversions of one row to f32 ------------------------------------ */
static void row_to_f32(float *dst, const void *src, moe8_dtype t, int64_t n) {
  int64_t i = 0;
  switch (t) {
    case MOE8_DTYPE_F32: memcpy(dst, src, (size_t)n * 4); return;
    case MOE8_DTYPE_BF16: {
      const uint16_t *s = src;
      for (; i + 16 <= n; i += 16)
        _mm512_storeu_si512(dst + i, _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(s + i))), 16));
      for (; i < n; i++) dst[i] = moe8_bf16_to_f32(s[i]);
      return;
    }
    case MOE8_DTYPE_F8E4M3: case MOE8_DTYPE_F8E5M2: {
      const uint8_t *s = src;
      for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, moe8__fp8_to_f32_16(_mm_loadu_si128((const __m128i *)(s + i)), t));
      if (i < n) {
        const __mmask16 k = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(dst + i, k, moe8__fp8_to_f32_16(_mm_maskz_loadu_epi8(k, s + i), t));
      }
      return;
    }
    default: {
      const int8_t *s = src;
      for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(s + i)))));
      for (; i < n; i++) dst[i] = (float)s[i];
    }
  }
}

/* B row k (columns n0..n0+nt) as f32, from plain or transposed rhs. */
static void b_row_f32(const moe8__gmm_block *b, int64_t k, int64_t n0, int64_t nt, float *dst) {
  if (b->rhs_pk) {
    /* Packed FP8 (a slow path: f32 activations with packed weights). */
    for (int64_t j = 0; j < nt; j++) dst[j] = moe8__gmm_rhs_at(b, k, n0 + j);
  } else if (!b->rhs_t) {
    row_to_f32(dst, (const char *)b->rhs + (size_t)(k * b->N + n0) * esize(b->rt), b->rt, nt);
  } else if (b->rt == MOE8_DTYPE_F32) {
    for (int64_t j = 0; j < nt; j++) dst[j] = ((const float *)b->rhs)[(n0 + j) * b->K + k];
  } else {
    for (int64_t j = 0; j < nt; j++) dst[j] = moe8_bf16_to_f32(((const uint16_t *)b->rhs)[(n0 + j) * b->K + k]);
  }
}

/* ---- the paths and their lhs packing ---------------------------------- */
typedef enum { PATH_F32, PATH_BF16, PATH_I8 } gmm_path;

/* bf16: the table may use vdpbf16ps. */
static gmm_path path_of(const moe8__gmm_block *b, bool bf16) {
  if (b->lt == MOE8_DTYPE_I8) return PATH_I8; /* needs VNNI; the caller checks */
  if (bf16 && b->lt != MOE8_DTYPE_F32 && b->rt != MOE8_DTYPE_F32) return PATH_BF16;
  return PATH_F32;
}

/* Packed lhs row length in 32-bit words: each scale block padded to a
** whole pair (bf16) or quad (i8). */
static int64_t packed_words(const moe8__gmm_block *b, gmm_path p) {
  if (p == PATH_F32) return b->K;
  if (p == PATH_BF16 && b->canon) return moe8__canon_row_words(b);
  const int64_t per = p == PATH_BF16 ? 2 : 4, full = b->K / b->kb, last = b->K - full * b->kb;
  return full * moe8__cdiv(b->kb, per) + moe8__cdiv(last, per);
}

/* Word offset of block blk in a packed row. */
static int64_t block_word(const moe8__gmm_block *b, gmm_path p, int64_t blk) {
  if (p == PATH_F32) return blk * b->kb;
  if (p == PATH_BF16 && b->canon) return blk * moe8__canon_block_words(b);
  return blk * moe8__cdiv(b->kb, p == PATH_BF16 ? 2 : 4);
}

/* 16 f32 (exactly bf16-representable) -> 8 bf16 pairs. */
INLINE __m256i pairs_from_f32(const float *src) {
  const __m512i x = _mm512_loadu_si512(src);
  const __m512i lo = _mm512_srli_epi64(_mm512_and_si512(x, _mm512_set1_epi64(0xFFFFFFFFll)), 16);
  const __m512i hi = _mm512_and_si512(_mm512_srli_epi64(x, 32), _mm512_set1_epi64(0xFFFF0000ll));
  return _mm512_cvtepi64_epi32(_mm512_or_si512(lo, hi));
}

static void cvt_f8_bf16(uint16_t *dst, const uint8_t *src, size_t n, moe8_dtype type);

static void pack_row(const moe8__gmm_block *b, gmm_path p, int64_t m, uint32_t *dst, float *tmp) {
  const char *src = (const char *)b->lhs + (size_t)(m * b->K) * esize(b->lt);
  if (p == PATH_F32) { row_to_f32((float *)dst, src, b->lt, b->K); return; }
  for (int64_t blk = 0; blk < b->nbk; blk++) {
    const int64_t k0 = blk * b->kb, len = k0 + b->kb < b->K ? b->kb : b->K - k0;
    uint32_t *d = dst + block_word(b, p, blk);
    if (p == PATH_I8) {
      uint8_t *db = (uint8_t *)d;
      const uint8_t *s = (const uint8_t *)src + k0;
      for (int64_t k = 0; k < len; k++) db[k] = s[k] ^ 0x80;
      for (int64_t k = len; k < moe8__cdiv(len, 4) * 4; k++) db[k] = 0x80;
    } else if (b->lt == MOE8_DTYPE_BF16) {
      memcpy(d, src + 2 * k0, (size_t)len * 2);
      if (len & 1) ((uint16_t *)d)[len] = 0;
    } else if (b->lt == MOE8_DTYPE_F8E4M3 || b->lt == MOE8_DTYPE_F8E5M2) {
      /* A pair is two consecutive bf16 words: convert the codes in place. */
      cvt_f8_bf16((uint16_t *)d, (const uint8_t *)src + k0, (size_t)len, b->lt);
      if (len & 1) ((uint16_t *)d)[len] = 0;
    } else {
      row_to_f32(tmp, src + k0, b->lt, len);
      const int64_t np = moe8__cdiv(len, 2);
      for (int64_t k = len; k < 2 * np + 16; k++) tmp[k] = 0.0f;
      int64_t k = 0;
      for (; k + 16 <= 2 * np; k += 16) _mm256_storeu_si256((__m256i *)(d + k / 2), pairs_from_f32(tmp + k));
      if (k < 2 * np) {
        uint32_t last[8];
        _mm256_storeu_si256((__m256i *)last, pairs_from_f32(tmp + k));
        memcpy(d + k / 2, last, sizeof(uint32_t) * (size_t)(np - k / 2));
      }
    }
    if (b->canon) {
      /* Whole pieces of 16 pairs: zero pairs up to the next piece. */
      const int64_t np = moe8__cdiv(len, 2);
      memset(d + np, 0, sizeof(uint32_t) * (size_t)(moe8__cdiv(np, 16) * 16 - np));
    }
  }
}

/* ---- promotion and output -------------------------------------------- */
/* rsv[0:ntp] = the rhs scales of block blk for the task's columns, zero past
** nt (one copy of a contiguous row; no per-element dispatch). */
static void rhs_scales(const moe8__gmm_block *b, int64_t blk, int64_t ntp, float *rsv) {
  const int64_t nt = b->n1 - b->n0;
  /* The next block's row of scales is a separate stretch of memory: ask
  ** for it now, so the copy then does not wait on memory. */
  if (b->rk == MOE8__SC_TILE && blk + 1 < b->nbk)
    for (int64_t j = 0; j < nt; j += 16) _mm_prefetch((const char *)(b->rs + (blk + 1) * b->N + b->n0 + j), _MM_HINT_T0);
  switch (b->rk) {
    case MOE8__SC_ROW: memcpy(rsv, b->rs + b->n0, sizeof(float) * (size_t)nt); break;
    case MOE8__SC_TILE: memcpy(rsv, b->rs + blk * b->N + b->n0, sizeof(float) * (size_t)nt); break;
    default: for (int64_t j = 0; j < nt; j++) rsv[j] = moe8__gmm_rs(b, blk, b->n0 + j); break;
  }
  for (int64_t j = nt; j < ntp; j++) rsv[j] = 0.0f;
}

/* C[i][0:ntp] += S[i][0:ntp] · (ls(m0+i) · rs(:)), as in the reference. */
static void promote(const moe8__gmm_block *b, int64_t blk, float *C, const float *S, int64_t mt, int64_t ntp, float *rsv) {
  rhs_scales(b, blk, ntp, rsv);
  for (int64_t i = 0; i < mt; i++) {
    const __m512 ls = _mm512_set1_ps(moe8__gmm_ls(b, b->m0 + i, blk));
    for (int64_t j = 0; j < ntp; j += 16) {
      const __m512 sc = _mm512_mul_ps(ls, _mm512_loadu_ps(rsv + j));
      const __m512 c = _mm512_loadu_ps(C + i * NT + j);
      _mm512_storeu_ps(C + i * NT + j, _mm512_add_ps(c, _mm512_mul_ps(_mm512_loadu_ps(S + i * NT + j), sc)));
    }
  }
}

static void write_out(const moe8__gmm_block *b, const float *C, int64_t mt) {
  const int64_t nt = b->n1 - b->n0;
  for (int64_t i = 0; i < mt; i++) {
    const float *c = C + i * NT;
    if (b->ot == MOE8_DTYPE_F32) memcpy((float *)b->out + (b->m0 + i) * b->N + b->n0, c, (size_t)nt * 4);
    else {
      uint16_t *o = (uint16_t *)b->out + (b->m0 + i) * b->N + b->n0;
      for (int64_t j = 0; j < nt; j++) o[j] = moe8_f32_to_bf16(c[j]);
    }
  }
}

/* ---- microkernels: MR rows x 32 columns, S loaded and stored ---------- */
INLINE void ukr_f32(const int mr, const float *A, int64_t lda, const float *B, int64_t kc, float *S) {
  __m512 c[MR][2];
  for (int i = 0; i < mr; i++) { c[i][0] = _mm512_loadu_ps(S + i * NT); c[i][1] = _mm512_loadu_ps(S + i * NT + 16); }
  for (int64_t k = 0; k < kc; k++) {
    const __m512 b0 = _mm512_loadu_ps(B + k * NT), b1 = _mm512_loadu_ps(B + k * NT + 16);
    for (int i = 0; i < mr; i++) {
      const __m512 a = _mm512_set1_ps(A[i * lda + k]);
      c[i][0] = _mm512_fmadd_ps(a, b0, c[i][0]);
      c[i][1] = _mm512_fmadd_ps(a, b1, c[i][1]);
    }
  }
  for (int i = 0; i < mr; i++) { _mm512_storeu_ps(S + i * NT, c[i][0]); _mm512_storeu_ps(S + i * NT + 16, c[i][1]); }
}

BF16_TARGET INLINE void ukr_bf16(const int mr, const uint32_t *A, int64_t lda, const uint32_t *B, int64_t kp, float *S) {
  __m512 c[MR][2];
  for (int i = 0; i < mr; i++) { c[i][0] = _mm512_loadu_ps(S + i * NT); c[i][1] = _mm512_loadu_ps(S + i * NT + 16); }
  for (int64_t k = 0; k < kp; k++) {
    const __m512i b0 = _mm512_loadu_si512(B + k * NT), b1 = _mm512_loadu_si512(B + k * NT + 16);
    for (int i = 0; i < mr; i++) {
      const __m512i a = _mm512_set1_epi32((int)A[i * lda + k]);
      c[i][0] = _mm512_dpbf16_ps(c[i][0], (__m512bh)a, (__m512bh)b0);
      c[i][1] = _mm512_dpbf16_ps(c[i][1], (__m512bh)a, (__m512bh)b1);
    }
  }
  for (int i = 0; i < mr; i++) { _mm512_storeu_ps(S + i * NT, c[i][0]); _mm512_storeu_ps(S + i * NT + 16, c[i][1]); }
}

VNNI_TARGET INLINE void ukr_i8(const int mr, const uint32_t *A, int64_t lda, const uint32_t *B, int64_t kq, int32_t *S) {
  __m512i c[MR][2];
  for (int i = 0; i < mr; i++) { c[i][0] = _mm512_loadu_si512(S + i * NT); c[i][1] = _mm512_loadu_si512(S + i * NT + 16); }
  for (int64_t k = 0; k < kq; k++) {
    const __m512i b0 = _mm512_loadu_si512(B + k * NT), b1 = _mm512_loadu_si512(B + k * NT + 16);
    for (int i = 0; i < mr; i++) {
      const __m512i a = _mm512_set1_epi32((int)A[i * lda + k]);
      c[i][0] = _mm512_dpbusd_epi32(c[i][0], a, b0);
      c[i][1] = _mm512_dpbusd_epi32(c[i][1], a, b1);
    }
  }
  for (int i = 0; i < mr; i++) { _mm512_storeu_si512(S + i * NT, c[i][0]); _mm512_storeu_si512(S + i * NT + 16, c[i][1]); }
}

/* Co[i] = Ci[i] + c[i] · (ls[i] · rs) for the rows of a microkernel (Ci
** NULL: + 0.0), both 16-column halves; unrolled so the sums stay in
** registers. */
INLINE void prom_store(const int mr, __m512 c[MR][2], const float *Ci, float *Co, int64_t ldo, __mmask16 m0, __mmask16 m1,
                       const float *ls, const float *rs) {
  const __m512 r0 = _mm512_loadu_ps(rs), r1 = _mm512_loadu_ps(rs + 16);
#pragma GCC unroll 8
  for (int i = 0; i < mr; i++) {
    const __m512 l = _mm512_set1_ps(ls[i]);
    const __m512 a0 = Ci ? _mm512_loadu_ps(Ci + i * NT) : _mm512_setzero_ps();
    const __m512 a1 = Ci ? _mm512_loadu_ps(Ci + i * NT + 16) : _mm512_setzero_ps();
    _mm512_mask_storeu_ps(Co + i * ldo, m0, _mm512_add_ps(a0, _mm512_mul_ps(c[i][0], _mm512_mul_ps(l, r0))));
    _mm512_mask_storeu_ps(Co + i * ldo + 16, m1, _mm512_add_ps(a1, _mm512_mul_ps(c[i][1], _mm512_mul_ps(l, r1))));
  }
}

/* Fused promotion: when a scale block is one chunk, its sum never leaves
** the registers: Co = Ci + S · (ls · rs) right after the last k, with the
** same multiplies and add as promote(), so the bytes are the same.  Ci is
** C (row stride NT), or NULL for the first block (the add is then to +0.0,
** as after a zero fill); Co is C, or for the last block the output rows
** themselves (stride ldo, columns masked by m0, m1). */
BF16_TARGET INLINE void ukr_bf16_prom(const int mr, const uint32_t *A, int64_t lda, const uint32_t *B, int64_t kp,
                                      const float *Ci, float *Co, int64_t ldo, __mmask16 m0, __mmask16 m1,
                                      const float *ls, const float *rs) {
  __m512 c[MR][2];
  for (int i = 0; i < mr; i++) c[i][0] = c[i][1] = _mm512_setzero_ps();
  for (int64_t k = 0; k < kp; k++) {
    const __m512i b0 = _mm512_loadu_si512(B + k * NT), b1 = _mm512_loadu_si512(B + k * NT + 16);
    for (int i = 0; i < mr; i++) {
      const __m512i a = _mm512_set1_epi32((int)A[i * lda + k]);
      c[i][0] = _mm512_dpbf16_ps(c[i][0], (__m512bh)a, (__m512bh)b0);
      c[i][1] = _mm512_dpbf16_ps(c[i][1], (__m512bh)a, (__m512bh)b1);
    }
  }
  prom_store(mr, c, Ci, Co, ldo, m0, m1, ls, rs);
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
      c[i][0] = _mm512_dpbusd_epi32(c[i][0], a, b0);
      c[i][1] = _mm512_dpbusd_epi32(c[i][1], a, b1);
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

static void ukr_f32_any(int mr, const float *A, int64_t lda, const float *B, int64_t k, float *S) {
  BY_ROWS(mr, ukr_f32, A, lda, B, k, S)
}

BF16_TARGET static void ukr_bf16_any(int mr, const uint32_t *A, int64_t lda, const uint32_t *B, int64_t kp, float *S) {
  BY_ROWS(mr, ukr_bf16, A, lda, B, kp, S)
}

VNNI_TARGET static void ukr_i8_any(int mr, const uint32_t *A, int64_t lda, const uint32_t *B, int64_t kq, int32_t *S) {
  BY_ROWS(mr, ukr_i8, A, lda, B, kq, S)
}

BF16_TARGET static void ukr_bf16_prom_any(int mr, const uint32_t *A, int64_t lda, const uint32_t *B, int64_t kp, const float *Ci,
                                          float *Co, int64_t ldo, __mmask16 m0, __mmask16 m1, const float *ls, const float *rs) {
  BY_ROWS(mr, ukr_bf16_prom, A, lda, B, kp, Ci, Co, ldo, m0, m1, ls, rs)
}

VNNI_TARGET static void ukr_i8_prom_any(int mr, const uint32_t *A, int64_t lda, const uint32_t *B, int64_t kq, const float *Ci,
                                        float *Co, int64_t ldo, __mmask16 m0, __mmask16 m1, const float *ls, const float *rs,
                                        const int32_t *cs) {
  BY_ROWS(mr, ukr_i8_prom, A, lda, B, kq, Ci, Co, ldo, m0, m1, ls, rs, cs)
}

/* ---- B panels ----------------------------------------------------------------- */
/* f32 [kc][NT] */
static void pack_b_f32(const moe8__gmm_block *b, int64_t c0, int64_t kc, int64_t ntp, float *Bp) {
  const int64_t nt = b->n1 - b->n0;
  for (int64_t k = 0; k < kc; k++) {
    b_row_f32(b, c0 + k, b->n0, nt, Bp + k * NT);
    memset(Bp + k * NT + nt, 0, sizeof(float) * (size_t)(ntp - nt));
  }
}

/* bf16 words of the 128 non-negative codes of each FP8 format (exact:
** every FP8 value is a bf16 value), filled once. */
static uint16_t g_bf16_lut[2][128];
static pthread_once_t g_lut_once = PTHREAD_ONCE_INIT;

static void fill_luts(void) {
  for (int c = 0; c < 128; c++) {
    g_bf16_lut[0][c] = moe8_f32_to_bf16(moe8_f8e4m3_to_f32((uint8_t)c));
    g_bf16_lut[1][c] = moe8_f32_to_bf16(moe8_f8e5m2_to_f32((uint8_t)c));
  }
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

/* Bulk FP8 -> bf16 for the kernel table (and its exhaustive test). */
static void cvt_f8_bf16(uint16_t *dst, const uint8_t *src, size_t n, moe8_dtype type) {
  pthread_once(&g_lut_once, fill_luts);
  const uint16_t *t = g_bf16_lut[type == MOE8_DTYPE_F8E5M2];
  __m512i lut[4];
  for (int i = 0; i < 4; i++) lut[i] = _mm512_loadu_si512(t + 32 * i);
  for (size_t i = 0; i < n; i += 32) {
    const __mmask32 m = n - i >= 32 ? 0xFFFFFFFFu : (__mmask32)((1u << (n - i)) - 1);
    _mm512_mask_storeu_epi16(dst + i, m, fp8_to_bf16_32(_mm256_maskz_loadu_epi8(m, src + i), lut));
  }
}

/* The word LUT of an FP8 format in four registers. */
INLINE void fp8_word_lut(moe8_dtype t, __m512i *lut) {
  pthread_once(&g_lut_once, fill_luts);
  const uint16_t *w = g_bf16_lut[t == MOE8_DTYPE_F8E5M2];
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

/* Words of rows k and k+1 (32 columns each) -> 32 bf16 pairs, two zmm. */
INLINE void store_pairs(uint32_t *dst, __m512i r0, __m512i r1) {
  const __m512i ilo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8,
                                       39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  const __m512i ihi = _mm512_add_epi16(ilo, _mm512_set1_epi16(16));
  _mm512_storeu_si512(dst, _mm512_permutex2var_epi16(r0, ilo, r1));
  _mm512_storeu_si512(dst + 16, _mm512_permutex2var_epi16(r0, ihi, r1));
}

/* bf16 pairs [kc/2][NT] (k even in the low half).  FP8 and bf16 weights
** are read as they are stored, 32 columns at a time; others go through
** f32 rows. */
static void pack_b_pk_vbmi(const moe8__gmm_block *b, int64_t c0, int64_t kp, int64_t ntp, uint32_t *Bp);

static void pack_b_bf16(const moe8__gmm_block *b, int64_t c0, int64_t kc, int64_t ntp, uint32_t *Bp, float *tmp) {
  const int64_t nt = b->n1 - b->n0, kp = (kc + 1) / 2;
  const bool pk8 = b->rhs_pk && b->rt != MOE8_DTYPE_I8; /* packed i8 goes through f32 rows below */
  if (pk8 && moe8__cpu_has_vbmi()) { pack_b_pk_vbmi(b, c0, kp, ntp, Bp); return; }
  if (pk8) {
    /* Packed FP8: each 64-byte strip of a pair is already the two pair
    ** vectors' codes; convert and reorder (the unpacks' order, by words). */
    __m512i lut[4];
    fp8_word_lut(b->rt, lut);
    const __m512i i0 = pk_word_index(0), i1 = pk_word_index(8);
    const int64_t nst = ntp / 32;
    const uint8_t *r = pk_at(b, c0 / 2);
    for (int64_t p = 0; p < kp; p++, r += nst * 64) {
      for (int64_t s = 0; s < nst; s++) {
        const __m512i w0 = fp8_to_bf16_32(_mm256_loadu_si256((const __m256i *)(r + 64 * s)), lut);
        const __m512i w1 = fp8_to_bf16_32(_mm256_loadu_si256((const __m256i *)(r + 64 * s + 32)), lut);
        _mm512_storeu_si512(Bp + p * NT + 32 * s, _mm512_permutex2var_epi16(w0, i0, w1));
        _mm512_storeu_si512(Bp + p * NT + 32 * s + 16, _mm512_permutex2var_epi16(w0, i1, w1));
      }
    }
    return;
  }
  const bool fp8 = !b->rhs_t && (b->rt == MOE8_DTYPE_F8E4M3 || b->rt == MOE8_DTYPE_F8E5M2);
  const bool bf = !b->rhs_t && b->rt == MOE8_DTYPE_BF16;
  if (fp8 || bf) {
    __m512i lut[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
    if (fp8) {
      pthread_once(&g_lut_once, fill_luts);
      const uint16_t *t = g_bf16_lut[b->rt == MOE8_DTYPE_F8E5M2];
      for (int i = 0; i < 4; i++) lut[i] = _mm512_loadu_si512(t + 32 * i);
    }
    for (int64_t p = 0; p < kp; p++) {
      const int64_t k = c0 + 2 * p;
      const bool two = 2 * p + 1 < kc;
      for (int64_t j = 0; j < ntp; j += 32) {
        const __mmask32 m = j + 32 <= nt ? 0xFFFFFFFFu : j < nt ? (__mmask32)((1u << (nt - j)) - 1) : 0;
        __m512i r0, r1 = _mm512_setzero_si512();
        if (fp8) {
          const uint8_t *s0 = (const uint8_t *)b->rhs + k * b->N + b->n0 + j;
          r0 = fp8_to_bf16_32(_mm256_maskz_loadu_epi8(m, s0), lut);
          if (two) r1 = fp8_to_bf16_32(_mm256_maskz_loadu_epi8(m, s0 + b->N), lut);
        } else {
          const uint16_t *s0 = (const uint16_t *)b->rhs + k * b->N + b->n0 + j;
          r0 = _mm512_maskz_loadu_epi16(m, s0);
          if (two) r1 = _mm512_maskz_loadu_epi16(m, s0 + b->N);
        }
        store_pairs(Bp + p * NT + j, r0, r1);
      }
    }
    return;
  }
  float *r0 = tmp, *r1 = tmp + NT;
  for (int64_t p = 0; p < kp; p++) {
    const int64_t k = c0 + 2 * p;
    b_row_f32(b, k, b->n0, nt, r0);
    if (2 * p + 1 < kc) b_row_f32(b, k + 1, b->n0, nt, r1);
    else memset(r1, 0, sizeof(float) * (size_t)nt);
    for (int64_t j = nt; j < ntp; j++) r0[j] = r1[j] = 0.0f;
    for (int64_t j = 0; j < ntp; j += 16) {
      const __m512i lo = _mm512_srli_epi32(_mm512_loadu_si512(r0 + j), 16);
      const __m512i hi = _mm512_and_si512(_mm512_loadu_si512(r1 + j), _mm512_set1_epi32((int)0xFFFF0000u));
      _mm512_storeu_si512(Bp + p * NT + j, _mm512_or_si512(lo, hi));
    }
  }
}

#ifndef PQ
#define PQ 4
#endif
/* i8 quads [kc/4][NT], with the column sums of the block on the way. */
/* Four rows of 64 columns -> the quads of those columns, four vectors of
** 16 columns: byte then word unpacks (in-lane: vector q, lane L holds
** columns 16L + 4q .. 16L + 4q + 3) and a 4 x 4 transpose of 128-bit
** chunks; column sums by vpdpbusd with ones (Σ of the four signed bytes). */
VNNI_TARGET INLINE void quads_64(const int8_t *r0, size_t ld, uint32_t *dst, int32_t *colsum) {
  const __m512i x0 = _mm512_loadu_si512(r0), x1 = _mm512_loadu_si512(r0 + ld);
  const __m512i x2 = _mm512_loadu_si512(r0 + 2 * ld), x3 = _mm512_loadu_si512(r0 + 3 * ld);
  const __m512i t0 = _mm512_unpacklo_epi8(x0, x1), t1 = _mm512_unpackhi_epi8(x0, x1);
  const __m512i t2 = _mm512_unpacklo_epi8(x2, x3), t3 = _mm512_unpackhi_epi8(x2, x3);
  const __m512i q0 = _mm512_unpacklo_epi16(t0, t2), q1 = _mm512_unpackhi_epi16(t0, t2);
  const __m512i q2 = _mm512_unpacklo_epi16(t1, t3), q3 = _mm512_unpackhi_epi16(t1, t3);
  const __m512i a_lo = _mm512_shuffle_i32x4(q0, q1, 0x44), a_hi = _mm512_shuffle_i32x4(q0, q1, 0xEE);
  const __m512i b_lo = _mm512_shuffle_i32x4(q2, q3, 0x44), b_hi = _mm512_shuffle_i32x4(q2, q3, 0xEE);
  const __m512i v[4] = {_mm512_shuffle_i32x4(a_lo, b_lo, 0x88), _mm512_shuffle_i32x4(a_lo, b_lo, 0xDD),
                        _mm512_shuffle_i32x4(a_hi, b_hi, 0x88), _mm512_shuffle_i32x4(a_hi, b_hi, 0xDD)};
  const __m512i ones = _mm512_set1_epi8(1);
  for (int i = 0; i < 4; i++) {
    _mm512_storeu_si512(dst + 16 * i, v[i]);
    _mm512_storeu_si512(colsum + 16 * i, _mm512_dpbusd_epi32(_mm512_loadu_si512(colsum + 16 * i), ones, v[i]));
  }
}

#ifndef PQ
#define PQ 4
#endif
/* i8 quads [kc/4][NT], with the column sums of the block on the way. */
VNNI_TARGET static void pack_b_i8(const moe8__gmm_block *b, int64_t c0, int64_t kc, int64_t ntp, uint32_t *Bp, int32_t *colsum) {
  const int64_t nt = b->n1 - b->n0, kq = (kc + 3) / 4;
  if (b->rhs_pk) {
    /* Packed: the quads are the panel's words already; copy, and sum. */
    const int64_t nv = moe8__cdiv(nt, 16);
    const uint8_t *r = pk_at(b, c0 / 4);
    const __m512i ones = _mm512_set1_epi8(1);
    for (int64_t q = 0; q < kq; q++, r += nv * 64)
      for (int64_t v = 0; v < ntp / 16; v++) {
        const __m512i x = v < nv ? _mm512_loadu_si512(r + 64 * v) : _mm512_setzero_si512();
        _mm512_storeu_si512(Bp + q * NT + 16 * v, x);
        _mm512_storeu_si512(colsum + 16 * v, _mm512_dpbusd_epi32(_mm512_loadu_si512(colsum + 16 * v), ones, x));
      }
    return;
  }
  const int8_t *rhs = b->rhs;
  for (int64_t q = 0; q < kq; q++) {
    int64_t j = 0;
    /* The weight rows are N bytes apart, which the hardware prefetchers
    ** follow poorly: fetch the rows of the quad PQ ahead. */
    if (4 * (q + PQ) + 3 < kc)
      for (int r = 0; r < 4; r++)
        for (int64_t o = 0; o < nt; o += 64) _mm_prefetch((const char *)(rhs + (c0 + 4 * (q + PQ) + r) * b->N + b->n0 + o), _MM_HINT_T0);
    if (4 * q + 4 <= kc) /* whole quads of 64 full columns */
      for (; j + 64 <= nt; j += 64) quads_64(rhs + (c0 + 4 * q) * b->N + b->n0 + j, (size_t)b->N, Bp + q * NT + j, colsum + j);
    for (; j < ntp; j += 16) {
      const __mmask16 m = j + 16 <= nt ? 0xFFFF : j < nt ? (__mmask16)((1u << (nt - j)) - 1) : 0;
      __m512i v = _mm512_setzero_si512(), cs = _mm512_loadu_si512(colsum + j);
      for (int r = 0; r < 4 && 4 * q + r < kc; r++) {
        const __m512i x = _mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, rhs + (c0 + 4 * q + r) * b->N + b->n0 + j));
        cs = _mm512_add_epi32(cs, x);
        v = _mm512_or_si512(v, _mm512_slli_epi32(_mm512_and_si512(x, _mm512_set1_epi32(0xFF)), 8 * r));
      }
      _mm512_storeu_si512(colsum + j, cs);
      _mm512_storeu_si512(Bp + q * NT + j, v);
    }
  }
}

/* ---- the small-M bf16 kernel: weights streamed once, never packed ------ */
/* For at most MR rows (decode), a B panel would be written and read for
** one use: instead each pair of weight rows is decoded in registers and fed
** straight to vdpbf16ps.  The pairs and their order along k are those of
** the panel path, so a row's sums are the same chains (docs/determinism.md). */
BF16_TARGET INLINE void direct_bf16(const int mr, const int ns, const moe8__gmm_block *b, const uint32_t *A, int64_t words,
                                    int64_t blk, int64_t j, const __m512i *lut, bool fp8, float *S) {
  /* ns strips of 32 columns at once, so each weight row's bytes of this
  ** task are read in one visit (a whole line, not half of one). */
  const int64_t nt = b->n1 - b->n0, k0 = blk * b->kb, k1 = k0 + b->kb < b->K ? k0 + b->kb : b->K, kp = (k1 - k0 + 1) / 2;
  const int64_t w0 = block_word(b, PATH_BF16, blk);
  const size_t es = fp8 ? 1 : 2;
  const __m512i ilo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8,
                                       39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  const __m512i ihi = _mm512_add_epi16(ilo, _mm512_set1_epi16(16));
  __mmask32 m[4];
  for (int s = 0; s < ns; s++) {
    const int64_t js = j + 32 * s;
    m[s] = js + 32 <= nt ? 0xFFFFFFFFu : js < nt ? (__mmask32)((1u << (nt - js)) - 1) : 0;
  }
  __m512 c[MR][4][2];
  for (int i = 0; i < mr; i++)
    for (int s = 0; s < ns; s++) c[i][s][0] = c[i][s][1] = _mm512_setzero_ps();
  const char *base = (const char *)b->rhs + (size_t)(b->n0 + j) * es;
  const size_t row = (size_t)b->N * es;
  for (int64_t p = 0; p < kp; p++) {
    const int64_t k = k0 + 2 * p;
    const char *r0p = base + (size_t)k * row, *r1p = r0p + row;
    /* Every line of the two rows PF pairs ahead: the row stride defeats
    ** the hardware prefetchers, and a visit reads ns·32 columns. */
    if (k + 2 * PF + 1 < k1)
      for (int64_t o = 0; o < ns * 32 * (int64_t)es; o += 64) {
        _mm_prefetch(r0p + 2 * PF * row + o, _MM_HINT_T0);
        _mm_prefetch(r0p + (2 * PF + 1) * row + o, _MM_HINT_T0);
      }
    const bool two = k + 1 < k1;
    for (int s = 0; s < ns; s++) {
      __m512i x0, x1 = _mm512_setzero_si512();
      if (fp8) {
        x0 = fp8_to_bf16_32(_mm256_maskz_loadu_epi8(m[s], r0p + 32 * s), lut);
        if (two) x1 = fp8_to_bf16_32(_mm256_maskz_loadu_epi8(m[s], r1p + 32 * s), lut);
      } else {
        x0 = _mm512_maskz_loadu_epi16(m[s], r0p + 64 * s);
        if (two) x1 = _mm512_maskz_loadu_epi16(m[s], r1p + 64 * s);
      }
      const __m512i b0 = _mm512_permutex2var_epi16(x0, ilo, x1), b1 = _mm512_permutex2var_epi16(x0, ihi, x1);
      for (int i = 0; i < mr; i++) {
        const __m512i a = _mm512_set1_epi32((int)A[i * words + w0 + p]);
        c[i][s][0] = _mm512_dpbf16_ps(c[i][s][0], (__m512bh)a, (__m512bh)b0);
        c[i][s][1] = _mm512_dpbf16_ps(c[i][s][1], (__m512bh)a, (__m512bh)b1);
      }
    }
  }
  for (int i = 0; i < mr; i++)
    for (int s = 0; s < ns; s++) {
      _mm512_storeu_ps(S + i * NT + j + 32 * s, c[i][s][0]);
      _mm512_storeu_ps(S + i * NT + j + 32 * s + 16, c[i][s][1]);
    }
}

/* ---- the small-M FP8 kernel with byte tables (AVX512_VBMI) ------------ */
/* 64 codes at a time: vpermi2b looks up the low and the high byte of each
** code's bf16 word in two 128-entry byte tables (the magnitude indexes,
** the sign is ORed into the high byte), and in-lane unpacks build the
** k-pairs.  The unpacks leave the columns in a fixed order inside each
** 128-bit lane — pair vector q holds columns 16L + 4q + i (lane L, i < 4) —
** which the store undoes with a 4 x 4 transpose of 128-bit chunks.  Each
** column's sum runs over the same pairs in the same order as every other
** path, so the bytes are the same. */
#define VBMI_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx512vbmi")))

static uint8_t g_bf16_bytes[2][2][128]; /* [format][lo, hi][magnitude] */
static pthread_once_t g_bytes_once = PTHREAD_ONCE_INIT;

static void fill_bytes(void) {
  pthread_once(&g_lut_once, fill_luts);
  for (int f = 0; f < 2; f++)
    for (int c = 0; c < 128; c++) {
      g_bf16_bytes[f][0][c] = (uint8_t)(g_bf16_lut[f][c] & 0xFF);
      g_bf16_bytes[f][1][c] = (uint8_t)(g_bf16_lut[f][c] >> 8);
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
        for (int q = 0; q < 4; q++) c[i][g][q] = _mm512_dpbf16_ps(c[i][g][q], (__m512bh)a, (__m512bh)pq[q]);
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
VBMI_TARGET static void pack_b_pk_vbmi(const moe8__gmm_block *b, int64_t c0, int64_t kp, int64_t ntp, uint32_t *Bp) {
  __m512i tab[4];
  byte_tables(b->rt, tab);
  const int64_t nst = ntp / 32;
  const uint8_t *r = pk_at(b, c0 / 2);
  for (int64_t p = 0; p < kp; p++, r += nst * 64)
    for (int64_t s = 0; s < nst; s++) {
      __m512i v0, v1;
      pk_strip(r + 64 * s, tab, &v0, &v1);
      _mm512_storeu_si512(Bp + p * NT + 32 * s, v0);
      _mm512_storeu_si512(Bp + p * NT + 32 * s + 16, v1);
    }
}

/* Two rows (the only case where the byte tables measured faster): both
** 64-column groups of the task in one pass, 16 accumulators. */
VBMI_TARGET static void direct_fp8_vbmi_2rows(int ng, const moe8__gmm_block *b, const uint32_t *A, int64_t words, int64_t blk,
                                              float *S) {
  __m512i tab[4];
  byte_tables(b->rt, tab);
  if (ng == 2) direct_fp8_vbmi(2, 2, b, A, words, blk, 0, tab, S);
  else direct_fp8_vbmi(2, 1, b, A, words, blk, 0, tab, S);
}

/* ---- the small-M kernel on packed FP8 weights (AVX512_VBMI) ----------- */
/* The packed tile is one front-to-back stream: per k pair, nst strips of
** 64 codes.  A strip is two vpermi2b byte-table lookups (low and high byte
** of each code's bf16 word; the index's bit 7, the sign, is ignored and
** ORed into the high byte), then two in-lane unpacks give the pair vectors
** of columns 0-15 and 16-31 in order.  mr rows x ns strips, starting at
** strip s0; the block's sums never leave the registers and are promoted
** into C as ukr_bf16_prom does, so the bytes are the panel path's. */
VBMI_TARGET INLINE void pk_vbmi(const int mr, const int ns, const moe8__gmm_block *b, const uint32_t *A, int64_t words,
                                int64_t blk, int64_t s0, int64_t nst, const __m512i *tab, float *C, const float *ls,
                                const float *rsv) {
  const int64_t k0 = blk * b->kb, k1 = k0 + b->kb < b->K ? k0 + b->kb : b->K, kp = (k1 - k0 + 1) / 2;
  const int64_t w0 = block_word(b, PATH_BF16, blk);
  const uint8_t *r = pk_at(b, k0 / 2) + (size_t)s0 * 64;
  const size_t step = (size_t)nst * 64;
  __m512 c[4][4][2];
#pragma GCC unroll 4
  for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
    for (int s = 0; s < ns; s++) c[i][s][0] = c[i][s][1] = _mm512_setzero_ps();
  /* The tile's stream from memory: its lines PKPF pairs ahead (a task
  ** starts cold on a new stream, which the prefetchers pick up late;
  ** a prefetch past the end does not fault). */
  for (int64_t p = 0; p < kp; p++, r += step) {
    __m512i a[4];
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++) a[i] = _mm512_set1_epi32((int)A[i * words + w0 + p]);
#pragma GCC unroll 4
    for (int s = 0; s < ns; s++) _mm_prefetch((const char *)(r + PKPF * step + 64 * s), _MM_HINT_T0);
#pragma GCC unroll 4
    for (int s = 0; s < ns; s++) {
      __m512i b0, b1;
      pk_strip(r + 64 * s, tab, &b0, &b1);
#pragma GCC unroll 4
      for (int i = 0; i < mr; i++) {
        c[i][s][0] = _mm512_dpbf16_ps(c[i][s][0], (__m512bh)a[i], (__m512bh)b0);
        c[i][s][1] = _mm512_dpbf16_ps(c[i][s][1], (__m512bh)a[i], (__m512bh)b1);
      }
    }
  }
#pragma GCC unroll 4
  for (int s = 0; s < ns; s++) {
    const int64_t j = 32 * (s0 + s);
    const __m512 r0 = _mm512_loadu_ps(rsv + j), r1 = _mm512_loadu_ps(rsv + j + 16);
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++) {
      const __m512 l = _mm512_set1_ps(ls[i]);
      _mm512_storeu_ps(C + i * NT + j, _mm512_add_ps(_mm512_loadu_ps(C + i * NT + j), _mm512_mul_ps(c[i][s][0], _mm512_mul_ps(l, r0))));
      _mm512_storeu_ps(C + i * NT + j + 16,
                       _mm512_add_ps(_mm512_loadu_ps(C + i * NT + j + 16), _mm512_mul_ps(c[i][s][1], _mm512_mul_ps(l, r1))));
    }
  }
}

/* ns strips per pass: four for one or two rows, two for three or four
** (the accumulators stay in registers). */
#define PK_NS(mr, ...)                                     \
  switch (ns) {                                            \
    case 4: pk_vbmi(mr, 4, __VA_ARGS__); break;            \
    case 2: pk_vbmi(mr, 2, __VA_ARGS__); break;            \
    default: pk_vbmi(mr, 1, __VA_ARGS__); break;           \
  }

VBMI_TARGET static void pk_vbmi_any(int mr, int ns, const moe8__gmm_block *b, const uint32_t *A, int64_t words, int64_t blk,
                                    int64_t s0, int64_t nst, const __m512i *tab, float *C, const float *ls, const float *rsv) {
  switch (mr) {
    case 4: PK_NS(4, b, A, words, blk, s0, nst, tab, C, ls, rsv) break;
    case 3: PK_NS(3, b, A, words, blk, s0, nst, tab, C, ls, rsv) break;
    case 2: PK_NS(2, b, A, words, blk, s0, nst, tab, C, ls, rsv) break;
    default: PK_NS(1, b, A, words, blk, s0, nst, tab, C, ls, rsv) break;
  }
}

VBMI_TARGET static void gmm_block_pk_small(const moe8__gmm_block *b) {
  const int64_t mt = b->m1 - b->m0, nt = b->n1 - b->n0, nst = moe8__cdiv(nt, 32);
  float *C = b->scratch, *rsv = C + MOE8__GMM_MT * NT;
  const int64_t words = packed_words(b, PATH_BF16);
  const uint32_t *A = (const uint32_t *)b->lhs_packed + b->m0 * words;
  __m512i tab[4];
  byte_tables(b->rt, tab);
  memset(C, 0, sizeof(float) * (size_t)(mt * NT));
  for (int64_t blk = 0; blk < b->nbk; blk++) {
    rhs_scales(b, blk, nst * 32, rsv);
    /* Rows in fours (each row's sums are the same chains in any group). */
    for (int64_t i = 0; i < mt; i += 4) {
      const int mr = mt - i < 4 ? (int)(mt - i) : 4, nsmax = mr <= 2 ? 4 : 2;
      float ls[4];
      for (int r = 0; r < mr; r++) ls[r] = moe8__gmm_ls(b, b->m0 + i + r, blk);
      for (int64_t s0 = 0; s0 < nst;) {
        const int ns = nst - s0 >= nsmax ? nsmax : nst - s0 >= 2 ? 2 : 1;
        pk_vbmi_any(mr, ns, b, A + i * words, words, blk, s0, nst, tab, C + i * NT, ls, rsv);
        s0 += ns;
      }
    }
  }
  write_out(b, C, mt);
}

BF16_TARGET static void gmm_block_bf16_small(const moe8__gmm_block *b) {
  const int64_t mt = b->m1 - b->m0, nt = b->n1 - b->n0, ntp = moe8__cdiv(nt, NR) * NR;
  float *C = b->scratch, *S = C + MOE8__GMM_MT * NT, *rsv = S + MOE8__GMM_MT * NT;
  const int64_t words = packed_words(b, PATH_BF16);
  const uint32_t *A = (const uint32_t *)b->lhs_packed + b->m0 * words;
  const bool fp8 = b->rt != MOE8_DTYPE_BF16;
  __m512i lut[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
  if (fp8) {
    pthread_once(&g_lut_once, fill_luts);
    const uint16_t *t = g_bf16_lut[b->rt == MOE8_DTYPE_F8E5M2];
    for (int i = 0; i < 4; i++) lut[i] = _mm512_loadu_si512(t + 32 * i);
  }
  memset(C, 0, sizeof(float) * (size_t)(mt * NT));
  /* Byte tables pay off for two rows (measured: one row is as fast on the
  ** word table, three and four rows slower). */
  const bool vbmi = fp8 && mt == 2 && moe8__cpu_has_vbmi();
  for (int64_t blk = 0; blk < b->nbk; blk++) {
    if (vbmi) {
      /* 64 columns at a time through the byte tables; a last 32 on the word table. */
      const int ng = (int)(ntp / 64);
      if (ng) direct_fp8_vbmi_2rows(ng, b, A, words, blk, S);
      if (ntp % 64) direct_bf16(2, 1, b, A, words, blk, 64 * (int64_t)ng, lut, fp8, S);
    } else if (mt == 1) {
      /* One row: every strip of the task in one pass over the weights
      ** (literal strip counts keep the accumulators in registers). */
      switch (ntp / NR) {
        case 4: direct_bf16(1, 4, b, A, words, blk, 0, lut, fp8, S); break;
        case 3: direct_bf16(1, 3, b, A, words, blk, 0, lut, fp8, S); break;
        case 2: direct_bf16(1, 2, b, A, words, blk, 0, lut, fp8, S); break;
        default: direct_bf16(1, 1, b, A, words, blk, 0, lut, fp8, S); break;
      }
    } else if (mt == 2) {
      for (int64_t j = 0; j < ntp; j += 2 * NR)
        if (ntp - j >= 2 * NR) direct_bf16(2, 2, b, A, words, blk, j, lut, fp8, S);
        else direct_bf16(2, 1, b, A, words, blk, j, lut, fp8, S);
    } else {
      /* More rows: one strip at a time (registers). */
      for (int64_t j = 0; j < ntp; j += NR) { BY_ROWS(mt, direct_bf16, 1, b, A, words, blk, j, lut, fp8, S) }
    }
    promote(b, blk, C, S, mt, ntp, rsv);
  }
  write_out(b, C, mt);
}

/* ---- the small-M kernel on packed i8 weights (AVX512_VNNI) ------------ */
/* The packed tile is one stream of quads: per quad, nv vectors of 16
** columns' words, read by vpdpbusd as they are (no conversion); the column
** sums for the +128 compensation come from vpdpbusd against ones.  mr rows
** x nvv vectors from vector v0; at the block's end S = Σ(a+128)b - 128Σb,
** exact, and C += S · (ls · rs) as the panel path does: the same bytes. */
VNNI_TARGET INLINE void pk_i8(const int mr, const int nvv, const moe8__gmm_block *b, const uint32_t *A, int64_t words,
                              int64_t blk, int64_t v0, int64_t nv, float *C, const float *ls, const float *rsv) {
  const int64_t k0 = blk * b->kb, k1 = k0 + b->kb < b->K ? k0 + b->kb : b->K, kq = (k1 - k0 + 3) / 4;
  const int64_t w0 = block_word(b, PATH_I8, blk);
  const uint8_t *r = pk_at(b, k0 / 4) + (size_t)v0 * 64;
  const size_t step = (size_t)nv * 64;
  const __m512i ones = _mm512_set1_epi8(1);
  __m512i c[4][8], cs[8];
#pragma GCC unroll 8
  for (int v = 0; v < nvv; v++) {
    cs[v] = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++) c[i][v] = _mm512_setzero_si512();
  }
  for (int64_t q = 0; q < kq; q++, r += step) {
    __m512i a[4];
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++) a[i] = _mm512_set1_epi32((int)A[i * words + w0 + q]);
#pragma GCC unroll 8
    for (int v = 0; v < nvv; v++) {
      const __m512i x = _mm512_loadu_si512(r + 64 * v);
      cs[v] = _mm512_dpbusd_epi32(cs[v], ones, x);
#pragma GCC unroll 4
      for (int i = 0; i < mr; i++) c[i][v] = _mm512_dpbusd_epi32(c[i][v], a[i], x);
    }
  }
#pragma GCC unroll 8
  for (int v = 0; v < nvv; v++) {
    const int64_t j = 16 * (v0 + v);
    const __m512 rs = _mm512_loadu_ps(rsv + j);
    const __m512i k = _mm512_slli_epi32(cs[v], 7);
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++) {
      const __m512 s = _mm512_cvtepi32_ps(_mm512_sub_epi32(c[i][v], k));
      _mm512_storeu_ps(C + i * NT + j, _mm512_add_ps(_mm512_loadu_ps(C + i * NT + j), _mm512_mul_ps(s, _mm512_mul_ps(_mm512_set1_ps(ls[i]), rs))));
    }
  }
}

#define PK_NV(mr, ...)                                     \
  switch (nvv) {                                           \
    case 8: pk_i8(mr, 8, __VA_ARGS__); break;              \
    case 4: pk_i8(mr, 4, __VA_ARGS__); break;              \
    case 2: pk_i8(mr, 2, __VA_ARGS__); break;              \
    default: pk_i8(mr, 1, __VA_ARGS__); break;             \
  }

VNNI_TARGET static void pk_i8_any(int mr, int nvv, const moe8__gmm_block *b, const uint32_t *A, int64_t words, int64_t blk,
                                  int64_t v0, int64_t nv, float *C, const float *ls, const float *rsv) {
  switch (mr) {
    case 4: PK_NV(4, b, A, words, blk, v0, nv, C, ls, rsv) break;
    case 3: PK_NV(3, b, A, words, blk, v0, nv, C, ls, rsv) break;
    case 2: PK_NV(2, b, A, words, blk, v0, nv, C, ls, rsv) break;
    default: PK_NV(1, b, A, words, blk, v0, nv, C, ls, rsv) break;
  }
}

VNNI_TARGET static void gmm_block_i8pk_small(const moe8__gmm_block *b) {
  const int64_t mt = b->m1 - b->m0, nt = b->n1 - b->n0, nv = moe8__cdiv(nt, 16);
  float *C = b->scratch, *rsv = C + MOE8__GMM_MT * NT;
  const int64_t words = packed_words(b, PATH_I8);
  const uint32_t *A = (const uint32_t *)b->lhs_packed + b->m0 * words;
  memset(C, 0, sizeof(float) * (size_t)(mt * NT));
  for (int64_t blk = 0; blk < b->nbk; blk++) {
    rhs_scales(b, blk, nv * 16, rsv);
    /* Rows in fours (each row's sums are the same in any group of rows). */
    for (int64_t i = 0; i < mt; i += 4) {
      const int mr = mt - i < 4 ? (int)(mt - i) : 4, nvmax = mr <= 2 ? 8 : 4;
      float ls[4];
      for (int r = 0; r < mr; r++) ls[r] = moe8__gmm_ls(b, b->m0 + i + r, blk);
      for (int64_t v0 = 0; v0 < nv;) {
        const int64_t left = nv - v0;
        const int nvv = left >= nvmax ? nvmax : left >= 4 ? 4 : left >= 2 ? 2 : 1;
        pk_i8_any(mr, nvv, b, A + i * words, words, blk, v0, nv, C + i * NT, ls, rsv);
        v0 += nvv;
      }
    }
  }
  write_out(b, C, mt);
}

/* ---- the block kernel -------------------------------------------------------- */
static void gmm_block(const moe8__gmm_block *b, gmm_path path) {
  const int64_t mt = b->m1 - b->m0, nt = b->n1 - b->n0, ntp = moe8__cdiv(nt, NR) * NR;
  /* Scratch: C, S, Sf [MOE8__GMM_MT][NT]; B panel KC·NT words; colsum,
  ** rsv and two f32 rows of NT. */
  float *C = b->scratch, *S = C + MOE8__GMM_MT * NT, *Sf = S + MOE8__GMM_MT * NT;
  uint32_t *Bp = (uint32_t *)(Sf + MOE8__GMM_MT * NT);
  int32_t *colsum = (int32_t *)(Bp + KC * NT);
  float *rsv = (float *)(colsum + NT), *tmp = rsv + NT;
  const int64_t words = packed_words(b, path);
  /* The lhs: packed once per call by the driver (NULL for f32 rows). */
  const uint32_t *A = b->lhs_packed ? (const uint32_t *)b->lhs_packed + b->m0 * words : NULL;
  /* When every block is one chunk the first block's promotion starts from
  ** zero (no fill of C) and the last one writes f32 output rows directly. */
  const bool all_prom = path != PATH_F32 && b->kb <= KC, direct = all_prom && b->ot == MOE8_DTYPE_F32;
  if (!all_prom) memset(C, 0, sizeof(float) * (size_t)(mt * NT));
  for (int64_t blk = 0; blk < b->nbk; blk++) {
    const int64_t k0 = blk * b->kb, k1 = k0 + b->kb < b->K ? k0 + b->kb : b->K;
    if (path == PATH_I8) memset(colsum, 0, sizeof(int32_t) * NT);
    if (path != PATH_F32 && k1 - k0 <= KC) {
      const bool first = all_prom && blk == 0, last = direct && blk == b->nbk - 1;
      /* One chunk: promote in registers (ukr_*_prom), S never stored. */
      if (path == PATH_BF16) pack_b_bf16(b, k0, k1 - k0, ntp, Bp, tmp);
      else pack_b_i8(b, k0, k1 - k0, ntp, Bp, colsum);
      rhs_scales(b, blk, ntp, rsv);
      const int64_t w0 = block_word(b, path, blk);
      for (int64_t i = 0; i < mt; i += MR) {
        const int mr = mt - i < MR ? (int)(mt - i) : MR;
        float ls[MR];
        for (int r = 0; r < mr; r++) ls[r] = moe8__gmm_ls(b, b->m0 + i + r, blk);
        for (int64_t j = 0; j < ntp; j += NR) {
          const float *ci = first ? NULL : C + i * NT + j;
          float *co = last ? (float *)b->out + (b->m0 + i) * b->N + b->n0 + j : C + i * NT + j;
          const int64_t ldo = last ? b->N : NT;
          const int64_t v0 = last ? nt - j : 16, v1 = last ? nt - j - 16 : 16;
          const __mmask16 m0 = v0 >= 16 ? 0xFFFF : v0 > 0 ? (__mmask16)((1u << v0) - 1) : 0;
          const __mmask16 m1 = v1 >= 16 ? 0xFFFF : v1 > 0 ? (__mmask16)((1u << v1) - 1) : 0;
          if (path == PATH_BF16)
            ukr_bf16_prom_any(mr, A + i * words + w0, words, Bp + j, (k1 - k0 + 1) / 2, ci, co, ldo, m0, m1, ls, rsv + j);
          else
            ukr_i8_prom_any(mr, A + i * words + w0, words, Bp + j, (k1 - k0 + 3) / 4, ci, co, ldo, m0, m1, ls, rsv + j, colsum + j);
        }
      }
      continue;
    }
    memset(S, 0, sizeof(float) * (size_t)(mt * NT));
    for (int64_t c0 = k0; c0 < k1; c0 += KC) {
      const int64_t kc = c0 + KC < k1 ? KC : k1 - c0;
      if (path == PATH_F32) pack_b_f32(b, c0, kc, ntp, (float *)Bp);
      else if (path == PATH_BF16) pack_b_bf16(b, c0, kc, ntp, Bp, tmp);
      else pack_b_i8(b, c0, kc, ntp, Bp, colsum);
      /* Word offset of this chunk inside a packed row. */
      const int64_t w0 = block_word(b, path, blk) + (path == PATH_F32 ? c0 - k0 : (c0 - k0) / (path == PATH_BF16 ? 2 : 4));
      for (int64_t i = 0; i < mt; i += MR) {
        const int mr = mt - i < MR ? (int)(mt - i) : MR;
        /* The lhs is the caller's f32 rows, or the driver's packed rows. */
        const uint32_t *Ai = A ? A + i * words + w0 : (const uint32_t *)((const float *)b->lhs + (b->m0 + i) * b->K + c0);
        const int64_t lda = A ? words : b->K;
        for (int64_t j = 0; j < ntp; j += NR) {
          if (path == PATH_F32) ukr_f32_any(mr, (const float *)Ai, lda, (const float *)Bp + j, kc, S + i * NT + j);
          else if (path == PATH_BF16) ukr_bf16_any(mr, Ai, lda, Bp + j, (kc + 1) / 2, S + i * NT + j);
          else ukr_i8_any(mr, Ai, lda, Bp + j, (kc + 3) / 4, (int32_t *)S + i * NT + j);
        }
      }
    }
    if (path == PATH_I8) {
      /* Σ(a+128)·b - 128·Σb = Σa·b, exact; then to float for promotion. */
      for (int64_t i = 0; i < mt; i++)
        for (int64_t j = 0; j < ntp; j += 16) {
          const __m512i s = _mm512_sub_epi32(_mm512_loadu_si512((int32_t *)S + i * NT + j),
                                             _mm512_slli_epi32(_mm512_loadu_si512(colsum + j), 7));
          _mm512_storeu_ps(Sf + i * NT + j, _mm512_cvtepi32_ps(s));
        }
      promote(b, blk, C, Sf, mt, ntp, rsv);
    } else {
      promote(b, blk, C, S, mt, ntp, rsv);
    }
  }
  if (!direct) write_out(b, C, mt);
}

/* ---- the canonical order on AVX-512 F (gmm.h) ---------------------------- */
/* mr rows x 32 columns over npc pieces of 16 pairs: per piece an even and
** an odd f32 chain from zero (the bf16 pair words split by a shift and a
** mask), then S += even + odd.  FMA when both operands are FP8 (their
** products are exact and never tiny, so a fused and a separate multiply
** agree); a multiply then an add under DAZ/FTZ otherwise, which is
** tdpbf16ps's arithmetic for every input (the caller sets MXCSR). */
INLINE void ukr_canon(const int mr, const int fused, const uint32_t *A, int64_t lda, const uint32_t *B, int64_t npc, float *S) {
  __m512 s[4][2];
  const __m512i hi = _mm512_set1_epi32((int)0xFFFF0000u);
  for (int i = 0; i < mr; i++) { s[i][0] = _mm512_loadu_ps(S + i * NT); s[i][1] = _mm512_loadu_ps(S + i * NT + 16); }
  for (int64_t q = 0; q < npc; q++) {
    __m512 e[4][2], o[4][2];
    for (int i = 0; i < mr; i++) e[i][0] = e[i][1] = o[i][0] = o[i][1] = _mm512_setzero_ps();
    for (int64_t j = 16 * q; j < 16 * q + 16; j++) {
      const __m512i w0 = _mm512_loadu_si512(B + j * NT), w1 = _mm512_loadu_si512(B + j * NT + 16);
      const __m512 be0 = _mm512_castsi512_ps(_mm512_slli_epi32(w0, 16)), bo0 = _mm512_castsi512_ps(_mm512_and_si512(w0, hi));
      const __m512 be1 = _mm512_castsi512_ps(_mm512_slli_epi32(w1, 16)), bo1 = _mm512_castsi512_ps(_mm512_and_si512(w1, hi));
#pragma GCC unroll 4
      for (int i = 0; i < mr; i++) {
        const __m512i a = _mm512_set1_epi32((int)A[i * lda + j]);
        const __m512 ae = _mm512_castsi512_ps(_mm512_slli_epi32(a, 16)), ao = _mm512_castsi512_ps(_mm512_and_si512(a, hi));
        if (fused) {
          e[i][0] = _mm512_fmadd_ps(ae, be0, e[i][0]); e[i][1] = _mm512_fmadd_ps(ae, be1, e[i][1]);
          o[i][0] = _mm512_fmadd_ps(ao, bo0, o[i][0]); o[i][1] = _mm512_fmadd_ps(ao, bo1, o[i][1]);
        } else {
          e[i][0] = _mm512_add_ps(e[i][0], _mm512_mul_ps(ae, be0)); e[i][1] = _mm512_add_ps(e[i][1], _mm512_mul_ps(ae, be1));
          o[i][0] = _mm512_add_ps(o[i][0], _mm512_mul_ps(ao, bo0)); o[i][1] = _mm512_add_ps(o[i][1], _mm512_mul_ps(ao, bo1));
        }
      }
    }
    for (int i = 0; i < mr; i++) {
      s[i][0] = _mm512_add_ps(s[i][0], _mm512_add_ps(e[i][0], o[i][0]));
      s[i][1] = _mm512_add_ps(s[i][1], _mm512_add_ps(e[i][1], o[i][1]));
    }
  }
  for (int i = 0; i < mr; i++) { _mm512_storeu_ps(S + i * NT, s[i][0]); _mm512_storeu_ps(S + i * NT + 16, s[i][1]); }
}

static void ukr_canon_any(int mr, int fused, const uint32_t *A, int64_t lda, const uint32_t *B, int64_t npc, float *S) {
  if (fused) {
    switch (mr) {
      case 4: ukr_canon(4, 1, A, lda, B, npc, S); break;
      case 3: ukr_canon(3, 1, A, lda, B, npc, S); break;
      case 2: ukr_canon(2, 1, A, lda, B, npc, S); break;
      default: ukr_canon(1, 1, A, lda, B, npc, S); break;
    }
  } else {
    switch (mr) {
      case 4: ukr_canon(4, 0, A, lda, B, npc, S); break;
      case 3: ukr_canon(3, 0, A, lda, B, npc, S); break;
      case 2: ukr_canon(2, 0, A, lda, B, npc, S); break;
      default: ukr_canon(1, 0, A, lda, B, npc, S); break;
    }
  }
}

static bool is_fp8(moe8_dtype t) { return t == MOE8_DTYPE_F8E4M3 || t == MOE8_DTYPE_F8E5M2; }

/* Scratch: C, S [MOE8__GMM_MT][NT]; the pair panel KC/2 x NT words; rsv
** and two f32 rows of NT. */
void moe8__gmm_canon_avx512(const moe8__gmm_block *b) {
  const int64_t mt = b->m1 - b->m0, nt = b->n1 - b->n0, ntp = moe8__cdiv(nt, NR) * NR;
  float *C = b->scratch, *S = C + MOE8__GMM_MT * NT;
  uint32_t *Bp = (uint32_t *)(S + MOE8__GMM_MT * NT);
  float *rsv = (float *)(Bp + KC / 2 * NT), *tmp = rsv + NT;
  const int64_t words = moe8__canon_row_words(b);
  const uint32_t *A = (const uint32_t *)b->lhs_packed + b->m0 * words;
  const int fused = is_fp8(b->lt) && (is_fp8(b->rt) || b->rt == MOE8_DTYPE_I8);
  memset(C, 0, sizeof(float) * (size_t)(mt * NT));
  for (int64_t blk = 0; blk < b->nbk; blk++) {
    const int64_t k0 = blk * b->kb, k1 = k0 + b->kb < b->K ? k0 + b->kb : b->K;
    memset(S, 0, sizeof(float) * (size_t)(mt * NT));
    for (int64_t c0 = k0; c0 < k1; c0 += KC) {
      const int64_t kc = c0 + KC < k1 ? KC : k1 - c0, kp = (kc + 1) / 2, npc = moe8__cdiv(kp, 16);
      pack_b_bf16(b, c0, kc, ntp, Bp, tmp);
      memset(Bp + kp * NT, 0, sizeof(uint32_t) * (size_t)((16 * npc - kp) * NT));
      const int64_t w0 = moe8__canon_block_words(b) * blk + (c0 - k0) / 2;
      const unsigned int csr = _mm_getcsr();
      if (!fused) _mm_setcsr(csr | 0x8040); /* FTZ | DAZ */
      for (int64_t i = 0; i < mt; i += 4) {
        const int mr = mt - i < 4 ? (int)(mt - i) : 4;
        for (int64_t j = 0; j < ntp; j += NR) ukr_canon_any(mr, fused, A + i * words + w0, words, Bp + j, npc, S + i * NT + j);
      }
      if (!fused) _mm_setcsr(csr);
    }
    promote(b, blk, C, S, mt, ntp, rsv);
  }
  write_out(b, C, mt);
}

void moe8__gmm_canon_pack(const moe8__gmm_block *b, int64_t m0, int64_t m1, void *dst) {
  const int64_t words = moe8__canon_row_words(b);
  float tmp[KC + 64];
  for (int64_t m = m0; m < m1; m++) pack_row(b, PATH_BF16, m, (uint32_t *)dst + m * words, tmp);
}

void moe8__gmm_panel_pairs(const moe8__gmm_block *b, int64_t c0, int64_t kc, int64_t ntp, uint32_t *Bp, float *tmp) {
  pack_b_bf16(b, c0, kc, ntp, Bp, tmp);
}

void moe8__gmm_panel_quads(const moe8__gmm_block *b, int64_t c0, int64_t kc, int64_t ntp, uint32_t *Bp, int32_t *colsum) {
  pack_b_i8(b, c0, kc, ntp, Bp, colsum);
}

void moe8__gmm_rhs_scales(const moe8__gmm_block *b, int64_t blk, int64_t ntp, float *rsv) { rhs_scales(b, blk, ntp, rsv); }

/* ---- per-ISA entry points ---------------------------------------------- */
static size_t pack_size_for(const moe8__gmm_block *b, bool bf16) {
  if (b->canon) return moe8__canon_packs(b) ? (size_t)moe8__canon_row_words(b) * 4 : 0;
  const gmm_path p = path_of(b, bf16);
  if (p == PATH_F32 && b->lt == MOE8_DTYPE_F32) return 0;
  return (size_t)packed_words(b, p) * 4;
}

static void pack_rows_for(const moe8__gmm_block *b, bool bf16, int64_t m0, int64_t m1, void *dst) {
  if (b->canon) { moe8__gmm_canon_pack(b, m0, m1, dst); return; }
  const gmm_path p = path_of(b, bf16);
  const int64_t words = packed_words(b, p);
  float tmp[KC + 64];
  float *big = NULL;
  if (p == PATH_BF16 && b->lt != MOE8_DTYPE_BF16 && b->kb + 32 > KC + 64) big = malloc(sizeof(float) * (size_t)(b->kb + 32));
  for (int64_t m = m0; m < m1; m++) pack_row(b, p, m, (uint32_t *)dst + m * words, big ? big : tmp);
  free(big);
}

/* One table's entry points: BF16 and VNNI say which instructions it may use. */
#define ENTRY(isa_name, BF16, VNNI)                                                                            \
  static void gmm_block_##isa_name(const moe8__gmm_block *b) {                                                 \
    if (b->canon) { moe8__canon_packs(b) ? moe8__gmm_canon_avx512(b) : moe8__gmm_block_ref(b); return; }     \
    if (b->lt == MOE8_DTYPE_I8 && !(VNNI)) { moe8__gmm_block_ref(b); return; }                                \
    const gmm_path p = path_of(b, BF16);                                                                       \
    if (p == PATH_BF16 && b->rhs_pk && b->rt != MOE8_DTYPE_I8 && b->m1 - b->m0 <= MR && b->lhs_packed &&      \
        moe8__cpu_has_vbmi())                                                                                  \
      gmm_block_pk_small(b);                                                                                   \
    else if (p == PATH_I8 && b->rhs_pk && b->m1 - b->m0 <= MR && b->lhs_packed)                                \
      gmm_block_i8pk_small(b);                                                                                 \
    else if (p == PATH_BF16 && b->m1 - b->m0 <= MR && !b->rhs_t && !b->rhs_pk && b->lhs_packed &&            \
        (b->rt == MOE8_DTYPE_F8E4M3 || b->rt == MOE8_DTYPE_F8E5M2 || b->rt == MOE8_DTYPE_BF16))                \
      gmm_block_bf16_small(b);                                                                                 \
    else                                                                                                       \
      gmm_block(b, p);                                                                                         \
  }                                                                                                            \
  static size_t gmm_pack_size_##isa_name(const moe8__gmm_block *b) {                                           \
    return b->lt == MOE8_DTYPE_I8 && !(VNNI) ? 0 : pack_size_for(b, BF16);                                     \
  }                                                                                                            \
  static void gmm_pack_##isa_name(const moe8__gmm_block *b, int64_t m0, int64_t m1, void *dst) {              \
    pack_rows_for(b, BF16, m0, m1, dst);                                                                       \
  }
ENTRY(avx512, false, false)
ENTRY(avx512_bf16, true, false)
ENTRY(avx512_vnni, true, true)
ENTRY(avx512_vnni_nobf16, false, true)

void moe8__gmm_init_avx512(moe8__ktable *k, moe8_isa isa, bool has_bf16) {
  k->cvt_f8_bf16 = cvt_f8_bf16;
  if (isa >= MOE8_ISA_AVX512_VNNI && !has_bf16) {
    k->gmm_block = gmm_block_avx512_vnni_nobf16; k->gmm_pack_size = gmm_pack_size_avx512_vnni_nobf16;
    k->gmm_pack = gmm_pack_avx512_vnni_nobf16;
  } else if (isa >= MOE8_ISA_AVX512_VNNI) {
    k->gmm_block = gmm_block_avx512_vnni; k->gmm_pack_size = gmm_pack_size_avx512_vnni; k->gmm_pack = gmm_pack_avx512_vnni;
  } else if (isa >= MOE8_ISA_AVX512_BF16) {
    k->gmm_block = gmm_block_avx512_bf16; k->gmm_pack_size = gmm_pack_size_avx512_bf16; k->gmm_pack = gmm_pack_avx512_bf16;
  } else {
    k->gmm_block = gmm_block_avx512; k->gmm_pack_size = gmm_pack_size_avx512; k->gmm_pack = gmm_pack_avx512;
  }
}
