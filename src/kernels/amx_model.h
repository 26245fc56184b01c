/*
** amx_model.h — a C model of the AMX tile instructions moe8 uses, bit for
** bit (docs/kernels.md "AMX and its model").
**
** Eight tiles of up to 16 rows × 64 bytes, configured by a 64-byte palette-1
** block as ldtilecfg reads it.  tdpbf16ps follows the arithmetic recorded
** on real hardware (tests/data/amx, checked by test_amx): for each output
** (m, n) an even-lane and an odd-lane f32 sum over the pairs, each from
** zero, products exact, every add rounded to nearest even, then
** dst + (even + odd); subnormal inputs and results are flushed to zero at
** every step.  The integer dot products are exact int32 sums that wrap.
** The model is the CPU-independent statement of what the AMX kernels
** compute; kernels/x86/gmm_amx.c is built once over it (the "amx_emu"
** table, any CPU) and once over the real instructions.
*/
#ifndef MOE8_AMX_MODEL_H
#define MOE8_AMX_MODEL_H

#include <stdint.h>
#include <string.h>

typedef struct moe8__amx_tile {
  int     rows, colsb;
  uint8_t d[16 * 64];
} moe8__amx_tile;

typedef struct moe8__amx_state {
  moe8__amx_tile t[8];
} moe8__amx_state;

/* Flush a subnormal to a zero of its sign (NaN and inf pass). */
static inline float moe8__ftz(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  if ((u & 0x7F800000u) == 0) u &= 0x80000000u;
  memcpy(&x, &u, 4);
  return x;
}

static inline float moe8__amx_bf16(const uint8_t *p) {
  uint32_t u = (uint32_t)(p[0] | (p[1] << 8)) << 16;
  float f;
  memcpy(&f, &u, 4);
  return moe8__ftz(f);
}

/* ldtilecfg: byte 0 palette, 16.. colsb of tile i (u16), 48.. rows (u8). */
static inline void moe8__amx_loadconfig(moe8__amx_state *s, const uint8_t cfg[64]) {
  for (int i = 0; i < 8; i++) {
    s->t[i].colsb = cfg[16 + 2 * i] | (cfg[17 + 2 * i] << 8);
    s->t[i].rows = cfg[48 + i];
    memset(s->t[i].d, 0, sizeof s->t[i].d);
  }
}

static inline void moe8__amx_loadd(moe8__amx_state *s, int t, const void *base, int64_t stride) {
  moe8__amx_tile *x = &s->t[t];
  memset(x->d, 0, sizeof x->d);
  for (int r = 0; r < x->rows; r++) memcpy(x->d + 64 * r, (const uint8_t *)base + r * stride, (size_t)x->colsb);
}

static inline void moe8__amx_stored(const moe8__amx_state *s, int t, void *base, int64_t stride) {
  const moe8__amx_tile *x = &s->t[t];
  for (int r = 0; r < x->rows; r++) memcpy((uint8_t *)base + r * stride, x->d + 64 * r, (size_t)x->colsb);
}

static inline void moe8__amx_zero(moe8__amx_state *s, int t) { memset(s->t[t].d, 0, sizeof s->t[t].d); }

/* dst[m][n] += Σ_k a[m][2k..2k+1] · b[k][2n..2n+1], in the recorded order. */
static inline void moe8__amx_dpbf16ps(moe8__amx_state *s, int dst, int a, int b) {
  moe8__amx_tile *c = &s->t[dst];
  const moe8__amx_tile *A = &s->t[a], *B = &s->t[b];
  const int K = A->colsb / 4, N = c->colsb / 4;
  for (int m = 0; m < c->rows; m++)
    for (int n = 0; n < N; n++) {
      float even = 0.0f, odd = 0.0f, acc;
      for (int k = 0; k < K; k++) {
        const uint8_t *pa = A->d + 64 * m + 4 * k, *pb = B->d + 64 * k + 4 * n;
        even = moe8__ftz(even + moe8__ftz(moe8__amx_bf16(pa) * moe8__amx_bf16(pb)));
        odd = moe8__ftz(odd + moe8__ftz(moe8__amx_bf16(pa + 2) * moe8__amx_bf16(pb + 2)));
      }
      memcpy(&acc, c->d + 64 * m + 4 * n, 4);
      acc = moe8__ftz(moe8__ftz(acc) + moe8__ftz(even + odd));
      memcpy(c->d + 64 * m + 4 * n, &acc, 4);
    }
}

/* The four int8 forms: sa, sb say whether a and b bytes are signed. */
static inline void moe8__amx_dpb(moe8__amx_state *s, int dst, int a, int b, int sa, int sb) {
  moe8__amx_tile *c = &s->t[dst];
  const moe8__amx_tile *A = &s->t[a], *B = &s->t[b];
  const int K = A->colsb / 4, N = c->colsb / 4;
  for (int m = 0; m < c->rows; m++)
    for (int n = 0; n < N; n++) {
      uint32_t acc;
      memcpy(&acc, c->d + 64 * m + 4 * n, 4);
      for (int k = 0; k < K; k++)
        for (int q = 0; q < 4; q++) {
          const uint8_t xa = A->d[64 * m + 4 * k + q], xb = B->d[64 * k + 4 * n + q];
          const int32_t va = sa ? (int32_t)(int8_t)xa : (int32_t)xa, vb = sb ? (int32_t)(int8_t)xb : (int32_t)xb;
          acc += (uint32_t)(va * vb); /* |va·vb| <= 2^15: exact; the sum wraps */
        }
      memcpy(c->d + 64 * m + 4 * n, &acc, 4);
    }
}

#endif
