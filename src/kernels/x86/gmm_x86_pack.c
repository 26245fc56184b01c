/*
** gmm_x86_pack.c — the AVX-512 families' packing: lhs rows (f32, bf16 pairs, (a+128)
** quads, canonical pieces), B panels, the FP8 -> bf16 word tables, the
** promotion of block sums and the output rows.
*/
#include "gmm_x86.h"

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

/* 16 f32 (exactly bf16-representable) -> 8 bf16 pairs. */
INLINE __m256i pairs_from_f32(const float *src) {
  const __m512i x = _mm512_loadu_si512(src);
  const __m512i lo = _mm512_srli_epi64(_mm512_and_si512(x, _mm512_set1_epi64(0xFFFFFFFFll)), 16);
  const __m512i hi = _mm512_and_si512(_mm512_srli_epi64(x, 32), _mm512_set1_epi64(0xFFFF0000ll));
  return _mm512_cvtepi64_epi32(_mm512_or_si512(lo, hi));
}


void pack_row(const moe8__gmm_block *b, gmm_path p, int64_t m, uint32_t *dst, float *tmp) {
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
      /* A pair is two consecutive bf16 words: convert the codes in place,
      ** through the table's converter (the family its init chose). */
      moe8__kernels()->cvt_f8_bf16((uint16_t *)d, (const uint8_t *)src + k0, (size_t)len, b->lt);
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
static void scales_row(const moe8__gmm_block *b, int64_t blk, int64_t ntp, float *rsv) {
  const int64_t nt = b->n1 - b->n0;
  switch (b->rk) {
    case MOE8__SC_ROW: memcpy(rsv, b->rs + b->n0, sizeof(float) * (size_t)nt); break;
    case MOE8__SC_TILE: {
      /* In registers, so a caller's loop over the blocks has every row's
      ** loads in flight at once (rhs_scales_all). */
      const float *src = b->rs + blk * b->N + b->n0;
      int64_t j = 0;
      for (; j + 16 <= nt; j += 16) _mm512_storeu_ps(rsv + j, _mm512_loadu_ps(src + j));
      if (j < nt) {
        const __mmask16 k = (__mmask16)((1u << (nt - j)) - 1);
        _mm512_mask_storeu_ps(rsv + j, k, _mm512_maskz_loadu_ps(k, src + j));
      }
      break;
    }
    default: for (int64_t j = 0; j < nt; j++) rsv[j] = moe8__gmm_rs(b, blk, b->n0 + j); break;
  }
  for (int64_t j = nt; j < ntp; j++) rsv[j] = 0.0f;
}

void rhs_scales(const moe8__gmm_block *b, int64_t blk, int64_t ntp, float *rsv) {
  const int64_t nt = b->n1 - b->n0;
  /* The next block's row of scales is a separate stretch of memory: ask
  ** for it now, so the copy then does not wait on memory. */
  if (b->rk == MOE8__SC_TILE && blk + 1 < b->nbk)
    for (int64_t j = 0; j < nt; j += 16) _mm_prefetch((const char *)(b->rs + (blk + 1) * b->N + b->n0 + j), _MM_HINT_T0);
  scales_row(b, blk, ntp, rsv);
}

/* Every block's column scales of the task at once, block blk at dst +
** blk·ntp (rhs_scales_bytes bytes), dst in the task's scratch: what the
** kernels read before their weight stream starts.  Returns dst, or NULL
** where the rows would run past the scratch's end (thousands of blocks:
** tiny scale tiles on a long K); the kernel then reads each block's row as
** it comes to it (rhs_scales_at), the same values.  The many-row kernels
** count the rows in their scratch plans (gmm_*_fits), so they always get
** dst.  A block's row of scales is a stretch of memory N
** floats from the last one's; read at each block's start, while the
** packed weights stream, those few scattered lines held the stream up: a
** one-row FP8 task ran 25-30% slower on an AMX Xeon (same-process A/B,
** docs/performance.md).  Read in one go, their loads overlap each other. */
const float *rhs_scales_all(const moe8__gmm_block *b, int64_t ntp, float *dst) {
  if ((size_t)((const char *)dst - (const char *)b->scratch) + rhs_scales_bytes(b, ntp) > MOE8__GMM_SCRATCH) return NULL;
  for (int64_t blk = 0; blk < b->nbk; blk++) scales_row(b, blk, ntp, dst + blk * ntp);
  /* The thread's next task (pk_next: the next column tile of the same
  ** group) reads the rows beside these: ask for them now (into L2), so that
  ** its copy finds them in the cache instead of waiting on memory at its
  ** start.  An FP8 layer's decode at T = 8 spent 7% of its time in these
  ** copies on an AMD Zen 4; with the prefetch it ran 1.03x faster, at
  ** T = 32 1.02x (one thread; two 1.01x; same-process A/B, same bytes,
  ** docs/performance.md). */
  if (b->pk_next && b->rk == MOE8__SC_TILE && b->n1 < b->N) {
    const int64_t n1 = b->n1 + MOE8__GMM_NT < b->N ? b->n1 + MOE8__GMM_NT : b->N;
    for (int64_t blk = 0; blk < b->nbk; blk++) {
      const float *row = b->rs + blk * b->N;
      for (int64_t j = b->n1; j < n1; j += 16) _mm_prefetch((const char *)(row + j), _MM_HINT_T1);
      _mm_prefetch((const char *)(row + n1 - 1), _MM_HINT_T1); /* the last line where the row is not aligned */
    }
  }
  return dst;
}
size_t rhs_scales_bytes(const moe8__gmm_block *b, int64_t ntp) { return sizeof(float) * (size_t)(b->nbk * ntp); }

/* C[i][0:ntp] += S[i][0:ntp] · (ls(m0+i) · rs(:)), as in the reference. */
void promote(const moe8__gmm_block *b, int64_t blk, float *C, const float *S, int64_t mt, int64_t ntp, float *rsv) {
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

void write_out(const moe8__gmm_block *b, const float *C, int64_t mt) {
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

/* ---- B panels ----------------------------------------------------------------- */
/* f32 [kc][NT] */
void pack_b_f32(const moe8__gmm_block *b, int64_t c0, int64_t kc, int64_t ntp, float *Bp) {
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

const uint16_t *bf16_lut(moe8_dtype t) {
  pthread_once(&g_lut_once, fill_luts);
  return g_bf16_lut[t == MOE8_DTYPE_F8E5M2];
}

/* Bulk FP8 -> bf16 for the kernel table (and its exhaustive test). */
void fp8_rows_to_bf16(uint16_t *dst, const uint8_t *src, size_t n, moe8_dtype type) {
  const uint16_t *t = bf16_lut(type);
  __m512i lut[4];
  for (int i = 0; i < 4; i++) lut[i] = _mm512_loadu_si512(t + 32 * i);
  for (size_t i = 0; i < n; i += 32) {
    const __mmask32 m = n - i >= 32 ? 0xFFFFFFFFu : (__mmask32)((1u << (n - i)) - 1);
    _mm512_mask_storeu_epi16(dst + i, m, fp8_to_bf16_32(_mm256_maskz_loadu_epi8(m, src + i), lut));
  }
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
void pack_b_bf16(const moe8__gmm_block *b, int64_t c0, int64_t kc, int64_t ntp, uint32_t *Bp, float *tmp) {
  const int64_t nt = b->n1 - b->n0, kp = (kc + 1) / 2;
  const bool pk8 = b->rhs_pk && b->rt != MOE8_DTYPE_I8; /* packed i8 goes through f32 rows below */
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
    _mm512_storeu_si512(colsum + 16 * i, moe8__dpbusd(_mm512_loadu_si512(colsum + 16 * i), ones, v[i]));
  }
}

#ifndef PQ
#define PQ 4
#endif
/* i8 quads [kc/4][NT], with the column sums of the block on the way. */
VNNI_TARGET void pack_b_i8(const moe8__gmm_block *b, int64_t c0, int64_t kc, int64_t ntp, uint32_t *Bp, int32_t *colsum) {
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
        _mm512_storeu_si512(colsum + 16 * v, moe8__dpbusd(_mm512_loadu_si512(colsum + 16 * v), ones, x));
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

