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
#include "gmm_x86.h"

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
  const uint32_t *A = b->lhs_packed ? (const uint32_t *)b->lhs_packed + (b->m0 - b->pk_row0) * words : NULL;
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
      if (path == PATH_BF16) panel_bf16(b, k0, k1 - k0, ntp, Bp, tmp);
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
      else if (path == PATH_BF16) panel_bf16(b, c0, kc, ntp, Bp, tmp);
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
  for (int64_t m = m0; m < m1; m++) pack_row(b, p, m, (uint32_t *)dst + (m - b->pk_row0) * words, big ? big : tmp);
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
    else if (p == PATH_BF16 && b->rhs_pk && b->rt != MOE8_DTYPE_I8 && b->lhs_packed && moe8__cpu_has_vbmi() && \
             gmm_pk_rows_fits(b))                                                                              \
      gmm_block_pk_rows(b);                                                                                    \
    else if (p == PATH_I8 && b->rhs_pk && b->m1 - b->m0 <= MR && b->lhs_packed)                                \
      gmm_block_i8pk_small(b);                                                                                 \
    else if (p == PATH_I8 && b->rhs_pk && b->lhs_packed && gmm_i8pk_rows_fits(b))                              \
      gmm_block_i8pk_rows(b);                                                                                  \
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
  k->cvt_f8_bf16 = moe8__cpu_has_vbmi() ? fp8_rows_to_bf16_vbmi : fp8_rows_to_bf16;
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

