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
** Each task (≤ 192 rows × ≤ 128 columns) walks the scale blocks along K in
** order; a block is cut into chunks of ≤ KC columns of K for the caches,
** and the block sum S of each element is kept in scratch between chunks,
** so its order along k is the same whatever the chunking and whatever the
** task's rows and columns.  At a block's end, C += S · (ls · rs) with a
** separate multiply and add, as the reference does.
**
** Scratch layout (floats): C[MT][NT], S[MT][NT], B panel, A panel.
** Packed panels: f32 B[kc][ntp]; bf16 B[kc/2][ntp] of bf16 pairs (k even in
** the low half); i8 B[kc/4][ntp] of 4 bytes; A likewise per row.  Padding
** columns of B and padding k of A and B are zero (i8 A pads with 0x80,
** i.e. a = 0), so they add exactly nothing.
*/
#include "../gmm.h"

#include <immintrin.h>
#include <string.h>

enum { MT = 192, NT = 128, KC = 256, MR = 8, NR = 32 };

#define INLINE static inline __attribute__((always_inline))

/* ---- conversions of one row to f32 ------------------------------------ */
static void row_to_f32(float *dst, const void *src, moe8_dtype t, int64_t n) {
  const moe8__ktable *k = moe8__kernels_for(MOE8_ISA_AVX512);
  switch (t) {
    case MOE8_DTYPE_F32: memcpy(dst, src, (size_t)n * 4); break;
    case MOE8_DTYPE_BF16: k->cvt_bf16_f32(dst, src, (size_t)n); break;
    case MOE8_DTYPE_F8E4M3: case MOE8_DTYPE_F8E5M2: k->cvt_f8_f32(dst, src, (size_t)n, t); break;
    default: {
      const int8_t *s = src;
      int64_t i = 0;
      for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(s + i)))));
      for (; i < n; i++) dst[i] = (float)s[i];
    }
  }
}

static size_t esize(moe8_dtype t) { return moe8__dtype_size(t); }

/* B panel row k (columns n0..n0+nt) as f32, from plain or transposed rhs. */
static void b_row_f32(const moe8__gmm_block *b, int64_t k, int64_t n0, int64_t nt, float *dst) {
  if (!b->rhs_t) {
    row_to_f32(dst, (const char *)b->rhs + (size_t)(k * b->N + n0) * esize(b->rt), b->rt, nt);
  } else if (b->rt == MOE8_DTYPE_F32) {
    for (int64_t j = 0; j < nt; j++) dst[j] = ((const float *)b->rhs)[(n0 + j) * b->K + k];
  } else {
    for (int64_t j = 0; j < nt; j++) dst[j] = moe8_bf16_to_f32(((const uint16_t *)b->rhs)[(n0 + j) * b->K + k]);
  }
}

/* ---- promotion and output -------------------------------------------- */
/* C[m][0:ntp] += S[m][0:ntp] · (ls(m) · rs(:)), as in the reference. */
static void promote(const moe8__gmm_block *b, int64_t blk, float *C, const float *S, int64_t mt, int64_t ntp,
                    float *rsv) {
  const int64_t nt = b->n1 - b->n0;
  for (int64_t j = 0; j < ntp; j++) rsv[j] = j < nt ? moe8__gmm_rs(b, blk, b->n0 + j) : 0.0f;
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

/* ---- f32 path ---------------------------------------------------------- */
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

static void ukr_f32_any(int mr, const float *A, int64_t lda, const float *B, int64_t kc, float *S) {
  switch (mr) {
    case 8: ukr_f32(8, A, lda, B, kc, S); break;
    case 7: ukr_f32(7, A, lda, B, kc, S); break;
    case 6: ukr_f32(6, A, lda, B, kc, S); break;
    case 5: ukr_f32(5, A, lda, B, kc, S); break;
    case 4: ukr_f32(4, A, lda, B, kc, S); break;
    case 3: ukr_f32(3, A, lda, B, kc, S); break;
    case 2: ukr_f32(2, A, lda, B, kc, S); break;
    default: ukr_f32(1, A, lda, B, kc, S); break;
  }
}

static void gmm_f32path(const moe8__gmm_block *b) {
  const int64_t mt = b->m1 - b->m0, nt = b->n1 - b->n0, ntp = moe8__cdiv(nt, NR) * NR;
  float *C = b->scratch, *S = C + MT * NT, *Bp = S + MT * NT, *Ap = Bp + KC * NT, *rsv = Ap + MT * KC;
  memset(C, 0, sizeof(float) * MT * NT);
  for (int64_t blk = 0; blk < b->nbk; blk++) {
    const int64_t k0 = blk * b->kb, k1 = k0 + b->kb < b->K ? k0 + b->kb : b->K;
    memset(S, 0, sizeof(float) * MT * NT);
    for (int64_t c0 = k0; c0 < k1; c0 += KC) {
      const int64_t kc = c0 + KC < k1 ? KC : k1 - c0;
      for (int64_t k = 0; k < kc; k++) {
        b_row_f32(b, c0 + k, b->n0, nt, Bp + k * NT);
        memset(Bp + k * NT + nt, 0, sizeof(float) * (size_t)(ntp - nt));
      }
      const float *A;
      int64_t lda;
      if (b->lt == MOE8_DTYPE_F32) { A = (const float *)b->lhs + b->m0 * b->K + c0; lda = b->K; }
      else {
        for (int64_t i = 0; i < mt; i++)
          row_to_f32(Ap + i * KC, (const char *)b->lhs + (size_t)((b->m0 + i) * b->K + c0) * esize(b->lt), b->lt, kc);
        A = Ap; lda = KC;
      }
      for (int64_t i = 0; i < mt; i += MR)
        for (int64_t j = 0; j < ntp; j += NR)
          ukr_f32_any(mt - i < MR ? (int)(mt - i) : MR, A + i * lda, lda, Bp + j, kc, S + i * NT + j);
    }
    promote(b, blk, C, S, mt, ntp, rsv);
  }
  write_out(b, C, mt);
}

/* ---- bf16 path ---------------------------------------------------------- */
#define BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

/* 16 f32 (exactly bf16-representable) at src -> 8 bf16 pairs. */
INLINE __m256i pairs_from_f32(const float *src) {
  const __m512i x = _mm512_loadu_si512(src);
  const __m512i lo = _mm512_srli_epi64(_mm512_and_si512(x, _mm512_set1_epi64(0xFFFFFFFFll)), 16);
  const __m512i hi = _mm512_and_si512(_mm512_srli_epi64(x, 32), _mm512_set1_epi64(0xFFFF0000ll));
  return _mm512_cvtepi64_epi32(_mm512_or_si512(lo, hi));
}

BF16_TARGET INLINE void ukr_bf16(const int mr, const uint32_t *A, const uint32_t *B, int64_t kp, float *S) {
  __m512 c[MR][2];
  for (int i = 0; i < mr; i++) { c[i][0] = _mm512_loadu_ps(S + i * NT); c[i][1] = _mm512_loadu_ps(S + i * NT + 16); }
  for (int64_t k = 0; k < kp; k++) {
    const __m512i b0 = _mm512_loadu_si512(B + k * NT), b1 = _mm512_loadu_si512(B + k * NT + 16);
    for (int i = 0; i < mr; i++) {
      const __m512i a = _mm512_set1_epi32((int)A[i * (KC / 2) + k]);
      c[i][0] = _mm512_dpbf16_ps(c[i][0], (__m512bh)a, (__m512bh)b0);
      c[i][1] = _mm512_dpbf16_ps(c[i][1], (__m512bh)a, (__m512bh)b1);
    }
  }
  for (int i = 0; i < mr; i++) { _mm512_storeu_ps(S + i * NT, c[i][0]); _mm512_storeu_ps(S + i * NT + 16, c[i][1]); }
}

BF16_TARGET static void ukr_bf16_any(int mr, const uint32_t *A, const uint32_t *B, int64_t kp, float *S) {
  switch (mr) {
    case 8: ukr_bf16(8, A, B, kp, S); break;
    case 7: ukr_bf16(7, A, B, kp, S); break;
    case 6: ukr_bf16(6, A, B, kp, S); break;
    case 5: ukr_bf16(5, A, B, kp, S); break;
    case 4: ukr_bf16(4, A, B, kp, S); break;
    case 3: ukr_bf16(3, A, B, kp, S); break;
    case 2: ukr_bf16(2, A, B, kp, S); break;
    default: ukr_bf16(1, A, B, kp, S); break;
  }
}

BF16_TARGET static void gmm_bf16path(const moe8__gmm_block *b) {
  const int64_t mt = b->m1 - b->m0, nt = b->n1 - b->n0, ntp = moe8__cdiv(nt, NR) * NR;
  float *C = b->scratch, *S = C + MT * NT;
  uint32_t *Bp = (uint32_t *)(S + MT * NT), *Ap = Bp + (KC / 2) * NT;
  float *tmp = (float *)(Ap + MT * (KC / 2)), *rsv = tmp + 2 * NT + KC + 32;
  memset(C, 0, sizeof(float) * MT * NT);
  for (int64_t blk = 0; blk < b->nbk; blk++) {
    const int64_t k0 = blk * b->kb, k1 = k0 + b->kb < b->K ? k0 + b->kb : b->K;
    memset(S, 0, sizeof(float) * MT * NT);
    for (int64_t c0 = k0; c0 < k1; c0 += KC) {
      const int64_t kc = c0 + KC < k1 ? KC : k1 - c0, kp = (kc + 1) / 2;
      /* B: rows k and k+1 as f32, interleaved into bf16 pairs. */
      float *r0 = tmp, *r1 = tmp + NT;
      for (int64_t p = 0; p < kp; p++) {
        b_row_f32(b, c0 + 2 * p, b->n0, nt, r0);
        if (2 * p + 1 < kc) b_row_f32(b, c0 + 2 * p + 1, b->n0, nt, r1);
        else memset(r1, 0, sizeof(float) * (size_t)nt);
        for (int64_t j = nt; j < ntp; j++) r0[j] = r1[j] = 0.0f;
        for (int64_t j = 0; j < ntp; j += 16) {
          const __m512i lo = _mm512_srli_epi32(_mm512_loadu_si512(r0 + j), 16);
          const __m512i hi = _mm512_and_si512(_mm512_loadu_si512(r1 + j), _mm512_set1_epi32((int)0xFFFF0000u));
          _mm512_storeu_si512(Bp + p * NT + j, _mm512_or_si512(lo, hi));
        }
      }
      /* A: each row's chunk as bf16 pairs. */
      float *ra = tmp + 2 * NT;
      for (int64_t i = 0; i < mt; i++) {
        uint32_t *ap = Ap + i * (KC / 2);
        const char *src = (const char *)b->lhs + (size_t)((b->m0 + i) * b->K + c0) * esize(b->lt);
        if (b->lt == MOE8_DTYPE_BF16) {
          memcpy(ap, src, (size_t)kc * 2);
          if (kc & 1) ((uint16_t *)ap)[kc] = 0;
        } else {
          row_to_f32(ra, src, b->lt, kc);
          for (int64_t k = kc; k < 2 * kp + 16; k++) ra[k] = 0.0f;
          for (int64_t k = 0; k < 2 * kp; k += 16) _mm256_storeu_si256((__m256i *)(ap + k / 2), pairs_from_f32(ra + k));
        }
      }
      for (int64_t i = 0; i < mt; i += MR)
        for (int64_t j = 0; j < ntp; j += NR)
          ukr_bf16_any(mt - i < MR ? (int)(mt - i) : MR, Ap + i * (KC / 2), Bp + j, kp, S + i * NT + j);
    }
    promote(b, blk, C, S, mt, ntp, rsv);
  }
  write_out(b, C, mt);
}

/* ---- i8 path ------------------------------------------------------------ */
#define VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))

VNNI_TARGET INLINE void ukr_i8(const int mr, const uint32_t *A, const uint32_t *B, int64_t kq, int32_t *S) {
  __m512i c[MR][2];
  for (int i = 0; i < mr; i++) { c[i][0] = _mm512_loadu_si512(S + i * NT); c[i][1] = _mm512_loadu_si512(S + i * NT + 16); }
  for (int64_t k = 0; k < kq; k++) {
    const __m512i b0 = _mm512_loadu_si512(B + k * NT), b1 = _mm512_loadu_si512(B + k * NT + 16);
    for (int i = 0; i < mr; i++) {
      const __m512i a = _mm512_set1_epi32((int)A[i * (KC / 4) + k]);
      c[i][0] = _mm512_dpbusd_epi32(c[i][0], a, b0);
      c[i][1] = _mm512_dpbusd_epi32(c[i][1], a, b1);
    }
  }
  for (int i = 0; i < mr; i++) { _mm512_storeu_si512(S + i * NT, c[i][0]); _mm512_storeu_si512(S + i * NT + 16, c[i][1]); }
}

VNNI_TARGET static void ukr_i8_any(int mr, const uint32_t *A, const uint32_t *B, int64_t kq, int32_t *S) {
  switch (mr) {
    case 8: ukr_i8(8, A, B, kq, S); break;
    case 7: ukr_i8(7, A, B, kq, S); break;
    case 6: ukr_i8(6, A, B, kq, S); break;
    case 5: ukr_i8(5, A, B, kq, S); break;
    case 4: ukr_i8(4, A, B, kq, S); break;
    case 3: ukr_i8(3, A, B, kq, S); break;
    case 2: ukr_i8(2, A, B, kq, S); break;
    default: ukr_i8(1, A, B, kq, S); break;
  }
}

VNNI_TARGET static void gmm_i8path(const moe8__gmm_block *b) {
  const int64_t mt = b->m1 - b->m0, nt = b->n1 - b->n0, ntp = moe8__cdiv(nt, NR) * NR;
  float *C = b->scratch;
  int32_t *S = (int32_t *)(C + MT * NT);
  uint32_t *Bp = (uint32_t *)(S + MT * NT), *Ap = Bp + (KC / 4) * NT;
  int32_t *colsum = (int32_t *)(Ap + MT * (KC / 4));
  float *Sf = (float *)(colsum + NT), *rsv = Sf + MT * NT;
  const int8_t *rhs = b->rhs;
  memset(C, 0, sizeof(float) * MT * NT);
  for (int64_t blk = 0; blk < b->nbk; blk++) {
    const int64_t k0 = blk * b->kb, k1 = k0 + b->kb < b->K ? k0 + b->kb : b->K;
    memset(S, 0, sizeof(int32_t) * MT * NT);
    memset(colsum, 0, sizeof(int32_t) * NT);
    for (int64_t c0 = k0; c0 < k1; c0 += KC) {
      const int64_t kc = c0 + KC < k1 ? KC : k1 - c0, kq = (kc + 3) / 4;
      /* B: four k rows interleaved per column; column sums on the way. */
      for (int64_t q = 0; q < kq; q++)
        for (int64_t j = 0; j < ntp; j += 16) {
          const __mmask16 m = j + 16 <= nt ? 0xFFFF : j < nt ? (__mmask16)((1u << (nt - j)) - 1) : 0;
          __m512i v = _mm512_setzero_si512(), cs = _mm512_loadu_si512(colsum + j);
          for (int r = 0; r < 4; r++) {
            const int64_t k = c0 + 4 * q + r;
            if (k >= c0 + kc) break;
            const __m512i x = _mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, rhs + k * b->N + b->n0 + j));
            cs = _mm512_add_epi32(cs, x);
            v = _mm512_or_si512(v, _mm512_slli_epi32(_mm512_and_si512(x, _mm512_set1_epi32(0xFF)), 8 * r));
          }
          _mm512_storeu_si512(colsum + j, cs);
          _mm512_storeu_si512(Bp + q * NT + j, v);
        }
      /* A: a + 128 as unsigned bytes, padded with a = 0. */
      for (int64_t i = 0; i < mt; i++) {
        uint8_t *ap = (uint8_t *)(Ap + i * (KC / 4));
        const uint8_t *src = (const uint8_t *)b->lhs + (b->m0 + i) * b->K + c0;
        for (int64_t k = 0; k < kc; k++) ap[k] = src[k] ^ 0x80;
        for (int64_t k = kc; k < 4 * kq; k++) ap[k] = 0x80;
      }
      for (int64_t i = 0; i < mt; i += MR)
        for (int64_t j = 0; j < ntp; j += NR)
          ukr_i8_any(mt - i < MR ? (int)(mt - i) : MR, Ap + i * (KC / 4), Bp + j, kq, S + i * NT + j);
    }
    /* Σ(a+128)·b - 128·Σb = Σa·b, exact; then to float for promotion. */
    for (int64_t i = 0; i < mt; i++)
      for (int64_t j = 0; j < ntp; j += 16) {
        const __m512i s = _mm512_sub_epi32(_mm512_loadu_si512(S + i * NT + j),
                                           _mm512_slli_epi32(_mm512_loadu_si512(colsum + j), 7));
        _mm512_storeu_ps(Sf + i * NT + j, _mm512_cvtepi32_ps(s));
      }
    promote(b, blk, C, Sf, mt, ntp, rsv);
  }
  write_out(b, C, mt);
}

/* ---- per-ISA entry points ---------------------------------------------- */
static bool bf16_pair(const moe8__gmm_block *b) {
  return b->lt != MOE8_DTYPE_F32 && b->lt != MOE8_DTYPE_I8 && b->rt != MOE8_DTYPE_F32;
}

static void gmm_block_avx512(const moe8__gmm_block *b) {
  if (b->lt == MOE8_DTYPE_I8) moe8__gmm_block_ref(b); /* exact i32 needs VNNI here */
  else gmm_f32path(b);
}

static void gmm_block_avx512_bf16(const moe8__gmm_block *b) {
  if (b->lt == MOE8_DTYPE_I8) moe8__gmm_block_ref(b);
  else if (bf16_pair(b)) gmm_bf16path(b);
  else gmm_f32path(b);
}

static void gmm_block_avx512_vnni(const moe8__gmm_block *b) {
  if (b->lt == MOE8_DTYPE_I8) gmm_i8path(b);
  else if (bf16_pair(b)) gmm_bf16path(b);
  else gmm_f32path(b);
}

void moe8__gmm_init_avx512(moe8__ktable *k, moe8_isa isa) {
  k->gmm_block = isa >= MOE8_ISA_AVX512_VNNI ? gmm_block_avx512_vnni
               : isa >= MOE8_ISA_AVX512_BF16 ? gmm_block_avx512_bf16
                                             : gmm_block_avx512;
}
