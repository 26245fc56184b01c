/*
** gmm_x86_canon.c — the canonical summation order on AVX-512 F (gmm.h): the kernel,
** its lhs packing, and the pieces the AMX kernels share.
*/
#include "gmm_x86.h"

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
  const uint32_t *A = (const uint32_t *)b->lhs_packed + (b->m0 - b->pk_row0) * words;
  const int fused = is_fp8(b->lt) && (is_fp8(b->rt) || b->rt == MOE8_DTYPE_I8);
  /* Few rows on packed FP8 weights: the weights streamed once, no panel. */
  if (mt <= 8 && is_fp8(b->lt) && is_fp8(b->rt) && b->rhs_pk && moe8__cpu_has_vbmi() && gmm_pk_canon_fits(b)) {
    gmm_block_pk_canon(b);
    return;
  }
  memset(C, 0, sizeof(float) * (size_t)(mt * NT));
  for (int64_t blk = 0; blk < b->nbk; blk++) {
    const int64_t k0 = blk * b->kb, k1 = k0 + b->kb < b->K ? k0 + b->kb : b->K;
    memset(S, 0, sizeof(float) * (size_t)(mt * NT));
    for (int64_t c0 = k0; c0 < k1; c0 += KC) {
      const int64_t kc = c0 + KC < k1 ? KC : k1 - c0, kp = (kc + 1) / 2, npc = moe8__cdiv(kp, 16);
      panel_bf16(b, c0, kc, ntp, Bp, tmp);
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
  for (int64_t m = m0; m < m1; m++) pack_row(b, PATH_BF16, m, (uint32_t *)dst + (m - b->pk_row0) * words, tmp);
}

