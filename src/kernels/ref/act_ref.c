/*
** act_ref.c — reference kernels of the layer's elementwise and router
** passes: SwiGLU and the router logits.  Plain C with the roundings spelled
** out (no contraction: the build passes -ffp-contract=off); every ISA's
** version must give these bytes.
*/
#include <math.h>
#include <string.h>
#include "ref.h"

static inline float silu(float g) { return g / (1.0f + moe8__expf(-g)); }

void moe8__ref_swiglu(float *h, const float *g, const float *u, size_t n) {
  for (size_t i = 0; i < n; i++) h[i] = silu(g[i]) * u[i];
}

/* The clamps are torch.clamp's (transformers' GptOssExperts: gate
** clamp(max=limit), up clamp(-limit, limit)): a NaN passes through, so a
** non-finite gate (an overflowing f32 product) gives a NaN h, never the
** limit's finite value, and the layer's non-finite check reports it. */
void moe8__ref_swiglu_clamp(float *h, const float *g, const float *u, size_t n, float alpha, float limit) {
  for (size_t i = 0; i < n; i++) {
    const float gc = g[i] > limit ? limit : g[i];
    const float uc = u[i] < -limit ? -limit : u[i] > limit ? limit : u[i];
    h[i] = gc * (1.0f / (1.0f + moe8__expf(-alpha * gc))) * (uc + 1.0f);
  }
}

/* GLM-5's and HY-V4's: the same clamps, then the plain SwiGLU's silu
** (transformers: F.silu(gate.clamp(max=L)) * up.clamp(-L, L)). */
void moe8__ref_swiglu_limit(float *h, const float *g, const float *u, size_t n, float limit) {
  for (size_t i = 0; i < n; i++) {
    const float gc = g[i] > limit ? limit : g[i];
    const float uc = u[i] < -limit ? -limit : u[i] > limit ? limit : u[i];
    h[i] = silu(gc) * uc;
  }
}

/* Step-3.5/3.7's: the clamps after the activation (transformers:
** silu(gate).clamp(max=L) * up.clamp(-L, L)); limit +inf: none, the plain
** SwiGLU's bytes.  A NaN passes through, as torch.clamp keeps it. */
void moe8__ref_swiglu_post(float *h, const float *g, const float *u, size_t n, float limit) {
  for (size_t i = 0; i < n; i++) {
    const float s = silu(g[i]);
    const float sc = s > limit ? limit : s;
    const float uc = u[i] < -limit ? -limit : u[i] > limit ? limit : u[i];
    h[i] = sc * uc;
  }
}

/* Inkling-2's (transformers' Inkling2SoftcappedSwiGLU, in f32):
** (cg · tanh(g / cg)) · sigmoid(g) · (cu · tanh(u / cu)), in that order. */
void moe8__ref_swiglu_softcap(float *h, const float *g, const float *u, size_t n, float cg, float cu) {
  for (size_t i = 0; i < n; i++) {
    const float tg = moe8__tanhf(g[i] / cg) * cg, tu = moe8__tanhf(u[i] / cu) * cu;
    const float sg = 1.0f / (1.0f + moe8__expf(-g[i]));
    h[i] = tg * sg * tu;
  }
}

/* Gemma-4's GeGLU (transformers' GELUTanh, gelu_pytorch_tanh: torch's
** 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))) in f32), times u. */
void moe8__ref_geglu(float *h, const float *g, const float *u, size_t n) {
  for (size_t i = 0; i < n; i++) {
    const float x = g[i], c = 0.7978845608f * (x + 0.044715f * (x * x * x));
    h[i] = 0.5f * x * (1.0f + moe8__tanhf(c)) * u[i];
  }
}

/* The ungated experts' activations (Nemotron-H's relu2, ReLU):
** relu(u) = u < 0 ? 0 : u, so a NaN passes through as torch.relu keeps it
** (and -0 stays -0); relu2 squares it, relu(u) · relu(u). */
void moe8__ref_relu2(float *h, const float *u, size_t n) {
  for (size_t i = 0; i < n; i++) {
    const float r = u[i] < 0.0f ? 0.0f : u[i];
    h[i] = r * r;
  }
}

void moe8__ref_relu(float *h, const float *u, size_t n) {
  for (size_t i = 0; i < n; i++) h[i] = u[i] < 0.0f ? 0.0f : u[i];
}

void moe8__ref_router_logits(float *logits, const float *x, const float *wr, int64_t T, int64_t D, int64_t E) {
  for (int64_t t = 0; t < T; t++) {
    float *l = logits + t * E;
    for (int64_t e = 0; e < E; e++) l[e] = 0.0f;
    for (int64_t d = 0; d < D; d++) {
      const float xv = x[t * D + d];
      const float *w = wr + d * E;
      for (int64_t e = 0; e < E; e++) l[e] += xv * w[e];
    }
  }
}

/* The E2M1 values of the 16 MXFP4 codes. */
static const float k_e2m1[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

/* The code of weight k = 32b + pos of one row in moe8__mx4_repack's
** layout. */
static inline uint8_t mx4_code(const uint8_t *row, int64_t nb, int64_t b, int pos) {
  const int h = pos / 16, L = pos % 16;
  if (b < nb / 8 * 8) {
    const int j = (int)(b % 8);
    return (uint8_t)(row[b / 8 * 128 + h * 64 + 4 * L + j / 2] >> (4 * (j & 1)) & 15);
  }
  return (uint8_t)(row[b * 16 + L] >> (4 * h) & 15);
}

/* The reference, in the AVX-512 kernel's order: chain pos (k mod 32) takes
** weight 32b + pos of every block b in increasing b, each a fused
** multiply-add of the weight (code × scale, exact) and x; then lane j is
** chain j + chain 16 + j, and lanes j + 8, j + 4, j + 2, j + 1 are folded
** (_mm512_reduce_add_ps's order), so the tables give the same bytes. */
void moe8__ref_mx4_rows(const float *x, int64_t rows, int64_t ldx, int64_t K, const uint8_t *blk, const uint8_t *sc, int64_t n0,
                        int64_t n1, float *out, int64_t ldo, int64_t split) {
  const int64_t nb = K / 32;
  for (int64_t p = 0; p < rows; p++)
    for (int64_t n = n0; n < n1; n++) {
      float chain[32] = {0};
      const uint8_t *row = blk + n * moe8__mx4_row_bytes(K);
      for (int64_t b = 0; b < nb; b++) {
        const float s = moe8__e8m0(sc[n * nb + b]);
        const float *xb = x + p * ldx + b * 32;
        for (int pos = 0; pos < 32; pos++) chain[pos] = fmaf(k_e2m1[mx4_code(row, nb, b, pos)] * s, xb[pos], chain[pos]);
      }
      float lane[16];
      for (int j = 0; j < 16; j++) lane[j] = chain[j] + chain[16 + j];
      for (int w = 8; w >= 1; w /= 2)
        for (int j = 0; j < w; j++) lane[j] = lane[j] + lane[j + w];
      out[p * ldo + (split > 0 ? n / 2 + ((n & 1) ? split : 0) : n)] = lane[0];
    }
}

/* The reference of the int8-activation product (moe8__ktable.mx4_rows_i8):
** the integer sums I are taken from the codes as signed 2 · E2M1 values
** (the kernels' unsigned codes and the pack's corrections give the same
** I), then scaled and added in increasing block order. */
void moe8__ref_mx4_rows_i8(const uint8_t *xp, int64_t rows, int64_t ldxp, int64_t K, const uint8_t *blk, const uint8_t *sc, int64_t n0,
                           int64_t n1, float *out, int64_t ldo, int64_t split) {
  static const int32_t w2[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
  const int64_t nb = K / 32;
  for (int64_t p = 0; p < rows; p++)
    for (int64_t n = n0; n < n1; n++) {
      const int64_t c = n / 16, i = n % 16;
      const uint8_t *x = xp + p * ldxp;
      float chain = 0.0f;
      for (int64_t b = 0; b < nb; b++) {
        const uint8_t *q = blk + (c * nb + b) * 256 + 4 * i;
        int32_t I = 0;
        for (int kk = 0; kk < 32; kk++)
          I += w2[q[64 * (kk / 8) + kk % 4] >> (kk % 8 >= 4 ? 4 : 0) & 15] * (int8_t)x[32 * b + kk];
        float sh;
        memcpy(&sh, x + K + 4 * nb + 4 * b, 4);
        chain = fmaf((float)I, moe8__e8m0(sc[(c * nb + b) * 16 + i]) * sh, chain);
      }
      out[p * ldo + (split > 0 ? n / 2 + ((n & 1) ? split : 0) : n)] = chain;
    }
}
