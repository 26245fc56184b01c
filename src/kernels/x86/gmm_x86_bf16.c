/*
** gmm_x86_bf16.c — the vdpbf16ps microkernels and the small-M bf16 kernel (the
** avx512_bf16 family).
*/
#include "gmm_x86.h"

BF16_TARGET INLINE void ukr_bf16(const int mr, const uint32_t *A, int64_t lda, const uint32_t *B, int64_t kp, float *S) {
  __m512 c[MR][2];
  for (int i = 0; i < mr; i++) { c[i][0] = _mm512_loadu_ps(S + i * NT); c[i][1] = _mm512_loadu_ps(S + i * NT + 16); }
  for (int64_t k = 0; k < kp; k++) {
    const __m512i b0 = _mm512_loadu_si512(B + k * NT), b1 = _mm512_loadu_si512(B + k * NT + 16);
    for (int i = 0; i < mr; i++) {
      const __m512i a = _mm512_set1_epi32((int)A[i * lda + k]);
      c[i][0] = moe8__dpbf16(c[i][0], (__m512bh)a, (__m512bh)b0);
      c[i][1] = moe8__dpbf16(c[i][1], (__m512bh)a, (__m512bh)b1);
    }
  }
  for (int i = 0; i < mr; i++) { _mm512_storeu_ps(S + i * NT, c[i][0]); _mm512_storeu_ps(S + i * NT + 16, c[i][1]); }
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
      c[i][0] = moe8__dpbf16(c[i][0], (__m512bh)a, (__m512bh)b0);
      c[i][1] = moe8__dpbf16(c[i][1], (__m512bh)a, (__m512bh)b1);
    }
  }
  prom_store(mr, c, Ci, Co, ldo, m0, m1, ls, rs);
}

BF16_TARGET void ukr_bf16_any(int mr, const uint32_t *A, int64_t lda, const uint32_t *B, int64_t kp, float *S) {
  BY_ROWS(mr, ukr_bf16, A, lda, B, kp, S)
}

BF16_TARGET void ukr_bf16_prom_any(int mr, const uint32_t *A, int64_t lda, const uint32_t *B, int64_t kp, const float *Ci,
                                          float *Co, int64_t ldo, __mmask16 m0, __mmask16 m1, const float *ls, const float *rs) {
  BY_ROWS(mr, ukr_bf16_prom, A, lda, B, kp, Ci, Co, ldo, m0, m1, ls, rs)
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
        c[i][s][0] = moe8__dpbf16(c[i][s][0], (__m512bh)a, (__m512bh)b0);
        c[i][s][1] = moe8__dpbf16(c[i][s][1], (__m512bh)a, (__m512bh)b1);
      }
    }
  }
  for (int i = 0; i < mr; i++)
    for (int s = 0; s < ns; s++) {
      _mm512_storeu_ps(S + i * NT + j + 32 * s, c[i][s][0]);
      _mm512_storeu_ps(S + i * NT + j + 32 * s + 16, c[i][s][1]);
    }
}

BF16_TARGET void gmm_block_bf16_small(const moe8__gmm_block *b) {
  const int64_t mt = b->m1 - b->m0, nt = b->n1 - b->n0, ntp = moe8__cdiv(nt, NR) * NR;
  float *C = b->scratch, *S = C + MOE8__GMM_MT * NT, *rsv = S + MOE8__GMM_MT * NT;
  const int64_t words = packed_words(b, PATH_BF16);
  const uint32_t *A = (const uint32_t *)b->lhs_packed + (b->m0 - b->pk_row0) * words;
  const bool fp8 = b->rt != MOE8_DTYPE_BF16;
  __m512i lut[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
  if (fp8) {
    const uint16_t *t = bf16_lut(b->rt);
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

