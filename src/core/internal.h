/*
** internal.h — what the library's own files share and users do not see.
**
** Error reporting: every failing path calls moe8__fail(status, fmt, ...),
** which formats the per-thread message and returns the status, so that
** "return moe8__fail(MOE8_ERR_SHAPE, "x: expected [%lld, %lld] ...", ...)"
** is the one idiom for errors.
**
** The kernel table: one struct of function pointers per ISA, filled once
** from the reference kernels and overridden by what an ISA has
** (moe8__kernels()).  Tests reach each ISA's table via moe8__kernels_for().
*/
#ifndef MOE8_INTERNAL_H
#define MOE8_INTERNAL_H

#include "moe8.h"

#include <pthread.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define MOE8__PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define MOE8__PRINTF(a, b)
#endif

moe8_status moe8__fail(moe8_status status, const char *fmt, ...) MOE8__PRINTF(2, 3);

/* Threads for a parallel loop of about `work` scalar operations: 1 when it
** is small, else moe8_get_num_threads() (threads.c).  Every
** "#pragma omp parallel" says num_threads(moe8__nt(work)). */
int moe8__nt(double work);

/* One token's combine (moe8_combine's row): o[D] = 0 + w[0]·y[pos[0]] +
** ... over the K slots in slot order, pos < 0 skipped, w NULL meaning 1. */
void moe8__combine_row(float *o, const float *y, const int32_t *pos, const float *w, int64_t K, int64_t D);

/* OCP MXFP4 of w[K, N] (x · W layout), column n a row of the result:
** blk [N, K/32, 16] (code of k = 32b + 2j in the low nibble of byte j,
** 32b + 2j + 1 in the high), sc [N, K/32] E8M0.  Per block: X =
** 2^(floor(log2 max|v|) - 2) (the scale byte clamped to [0, 254]; 0 for an
** all-zero block), codes = v / X rounded to the nearest E2M1 value, ties
** to the even code, saturating at ±6.  K a multiple of 32; w finite. */
void moe8__mx4_quantize(const float *w, int64_t K, int64_t N, uint8_t *blk, uint8_t *sc);
/* The kernels' layout of MXFP4 blocks (moe8__ktable.mx4_rows): row n of
** dst starts at n · moe8__mx4_row_bytes(K) (a multiple of 64, so that no
** load splits a cache line; the padding is zero).  Blocks 8g .. 8g + 7 of
** a row are 128 bytes at 128 g: 32-bit word L (little endian) of half h
** (bytes 64 h + 4 L ..) holds in its bits 4j .. 4j + 3 the code of
** k = 32 (8g + j) + 16 h + L.  The nb % 8 blocks after the last whole
** group take 16 bytes each: byte L holds the code of k = 32b + L in its
** low nibble and of 32b + 16 + L in its high.  src is the OCP layout
** above ([N, K/32, 16]); the codes are the same, moved. */
static inline int64_t moe8__mx4_row_bytes(int64_t K) { return (K / 32 * 16 + 63) / 64 * 64; }
void moe8__mx4_repack(uint8_t *dst, const uint8_t *src, int64_t N, int64_t K);
/* The column-group layout of MXFP4 weights for int8 activations
** (moe8__ktable.mx4_rows_i8): columns n = 16c + i (i < 16; the last group
** padded with zero codes and scale bytes).  Group c, block b of 32 along
** K: 256 codes at (c·nb + b)·256, where 32-bit word i of the 64 bytes at
** 64u holds, in byte t, the code of k = 32b + 8u + t in its low nibble
** and of k = 32b + 8u + 4 + t in its high; 16 scale bytes at (c·nb + b)·16,
** byte i column n's.  So one nibble mask and vpshufb give each lane 4
** codes of one block against 4 consecutive activation bytes. */
static inline int64_t moe8__mx4_cols_bytes(int64_t N, int64_t K) { return (N + 15) / 16 * 16 * (K / 2); }
static inline int64_t moe8__mx4_cols_scale_bytes(int64_t N, int64_t K) { return (N + 15) / 16 * 16 * (K / 32); }
/* One expert's MXFP4 code bytes in the kernels' layout: moe8__mx4_repack's
** (f32 activations) or the column-group one (int8). */
static inline int64_t moe8__mx4_bytes(int64_t N, int64_t K, bool cols) {
  return cols ? moe8__mx4_cols_bytes(N, K) : N * moe8__mx4_row_bytes(K);
}
/* From the OCP layout (src [N, K/32, 16], sc [N, K/32]) to the
** column-group layout (dst_b, dst_s); N rows, or several experts' rows
** when each expert's N is a multiple of 16 (the groups then follow each
** other, an expert at e · moe8__mx4_cols_bytes(N, K)). */
void moe8__mx4_to_cols(uint8_t *dst_b, uint8_t *dst_s, const uint8_t *src, const uint8_t *sc, int64_t N, int64_t K);
/* One row of int8 activations packed for moe8__ktable.mx4_rows_i8: codes
** q[K] (K a multiple of 32) as they are, then for each block b of 32 the
** int32 -12 · Σ q over the block (the weights are read as 2 · E2M1 + 12,
** unsigned, by vpdpbusd), then for each block the f32 0.5 · s[b / sbl]
** (sbl blocks share a scale: a per-row quantizer gives sbl = K / 32, a
** 1 x tile one tile / 32). */
static inline int64_t moe8__mx4_xpack_bytes(int64_t K) { return (K + K / 32 * 8 + 63) / 64 * 64; }
void moe8__mx4_xpack(uint8_t *dst, const int8_t *q, const float *s, int64_t sbl, int64_t K);
/* One value's E2M1 code (sign in bit 3) for v already divided by X. */
uint8_t moe8__e2m1_code(float v);
/* Tests: the work below which loops run on one thread (0: never). */
void moe8__set_par_min(double work);

/* ---- kernel table ---------------------------------------------------- */
struct moe8__gmm_block;
typedef struct moe8__ktable {
  moe8_isa    isa;
  /* The instructions this table's kernels use: the avx512_vnni table of a
  ** CPU with VNNI but no AVX512_BF16 (Cascade Lake, Ice Lake) runs i8 on
  ** vpdpbusd and FP8/bf16 on the f32 path. */
  bool        has_bf16, has_vnni;
  /* AMX tiles (or their model): bf16/FP8 lhs always in the canonical order. */
  bool        has_tiles;
  /* dst[i] = f32 -> FP8 of src[i]; type is F8E4M3 or F8E5M2. */
  void (*cvt_f32_f8)(uint8_t *dst, const float *src, size_t n, moe8_dtype type, bool sat);
  void (*cvt_f8_f32)(float *dst, const uint8_t *src, size_t n, moe8_dtype type);
  void (*cvt_f8_bf16)(uint16_t *dst, const uint8_t *src, size_t n, moe8_dtype type);
  void (*cvt_f32_bf16)(uint16_t *dst, const float *src, size_t n);
  void (*cvt_bf16_f32)(float *dst, const uint16_t *src, size_t n);
  /* Round half even, clamp to [-127, 127], NaN -> 0; returns the NaN count. */
  size_t (*cvt_f32_i8)(int8_t *dst, const float *src, size_t n);
  /* max |x| over the finite elements; *nonfinite += count of NaN/inf. */
  float (*absmax)(const float *x, size_t n, size_t *nonfinite);
  /* amax[i] = max(amax[i], |x[i]|) (finite only); returns the non-finite count. */
  size_t (*absmax_acc)(float *amax, const float *x, size_t n);
  /* q[i] = quantize(x[i] / s[i * s_step]), s_step 0 or 1, saturating. */
  void (*quant_div)(void *q, const float *x, const float *s, size_t s_step,
                    size_t n, moe8_dtype qtype);
  /* y[i] = value(q[i]) · s[i * s_step], s_step 0 or 1: the code's f32
  ** value (FP8 exactly, NaN codes a quiet NaN with the sign, i8 as an
  ** integer) times its scale, one f32 multiply. */
  void (*dequant)(float *y, const void *q, const float *s, size_t s_step, size_t n, moe8_dtype qtype);
  /* h[i] = silu(g[i]) · u[i], silu(g) = g / (1 + moe8__expf(-g)). */
  void (*swiglu)(float *h, const float *g, const float *u, size_t n);
  /* GPT-OSS's clamped SwiGLU: gc = g > limit ? limit : g, uc = u clamped
  ** to [-limit, limit] (a NaN g or u kept, as torch.clamp keeps it),
  ** h = gc · (1 / (1 + moe8__expf(-alpha · gc))) · (uc + 1), in that order. */
  void (*swiglu_clamp)(float *h, const float *g, const float *u, size_t n, float alpha, float limit);
  /* The limited SwiGLU (GLM-5, HY-V4): gc and uc as above, h = silu(gc) · uc
  ** with swiglu's silu. */
  void (*swiglu_limit)(float *h, const float *g, const float *u, size_t n, float limit);
  /* Step's SwiGLU clamped after the activation: s = swiglu's silu(g),
  ** h = (s > limit ? limit : s) · uc, uc as above; limit > 0 or +inf. */
  void (*swiglu_post)(float *h, const float *g, const float *u, size_t n, float limit);
  /* Inkling-2's softcapped SwiGLU: h = ((cg · tanh(g / cg)) · sg) · (cu ·
  ** tanh(u / cu)), tanh moe8__tanhf, sg = 1 / (1 + moe8__expf(-g)); cg, cu > 0. */
  void (*swiglu_softcap)(float *h, const float *g, const float *u, size_t n, float cg, float cu);
  /* Gemma-4's GeGLU with the tanh form of GELU (gelu_pytorch_tanh):
  ** c = 0.7978845608 · (g + 0.044715 · ((g · g) · g)), h = ((0.5 · g) ·
  ** (1 + moe8__tanhf(c))) · u, in that order. */
  void (*geglu)(float *h, const float *g, const float *u, size_t n);
  /* The ungated experts' activations: r = u < 0 ? 0 : u (a NaN and -0
  ** kept), h = r · r (relu2, Nemotron-H's) or h = r (relu). */
  void (*relu2)(float *h, const float *u, size_t n);
  void (*relu)(float *h, const float *u, size_t n);
  /* MXFP4 weights (GPT-OSS): for n in [n0, n1) and rows p < rows,
  ** out[p·ldo + col(n)] = Σ_k x[p·ldx + k] · w(n, k) with w(n, k) the E2M1
  ** code of weight k of row n in moe8__mx4_repack's layout (blk, rows of
  ** moe8__mx4_row_bytes(K)) times 2^(sc[n, k/32] - 127); col(n) = n, or with split > 0
  ** the gate/up de-interleave n/2 + (n odd ? split : 0).  K is a multiple
  ** of 32.  The order is moe8__ref_mx4_rows's: 32 chains, one per k mod 32,
  ** in increasing k, then added as 16 lanes and folded.  Results are the
  ** same for any rows and any [n0, n1) split. */
  void (*mx4_rows)(const float *x, int64_t rows, int64_t ldx, int64_t K, const uint8_t *blk, const uint8_t *sc, int64_t n0,
                   int64_t n1, float *out, int64_t ldo, int64_t split);
  /* The same product against int8 activations, weights in the
  ** column-group layout (blk, sc: moe8__mx4_to_cols), rows of xp packed by
  ** moe8__mx4_xpack (ldxp bytes apart).  With w2 = 2 · E2M1 (an integer in
  ** [-12, 12]) each output is one f32 chain over the blocks b in increasing
  ** order: chain = fma(I, 2^(e - 127) · sh, chain), I = Σ_k w2 · q over the
  ** block (exact int32), sh the pack's 0.5 · s (moe8__ref_mx4_rows_i8).
  ** Results are the same for any rows and any [n0, n1) split. */
  void (*mx4_rows_i8)(const uint8_t *xp, int64_t rows, int64_t ldxp, int64_t K, const uint8_t *blk, const uint8_t *sc, int64_t n0,
                      int64_t n1, float *out, int64_t ldo, int64_t split);
  /* logits[t, e] = Σ_d x[t, d] · wr[d, e] for T tokens: one chain per
  ** (t, e) in increasing d, a multiply then an add. */
  void (*router_logits)(float *logits, const float *x, const float *wr, int64_t T, int64_t D, int64_t E);
  /* One block of a grouped matmul; the contract is in kernels/gmm.h. */
  void (*gmm_block)(const struct moe8__gmm_block *b);
  /* Bytes of one packed lhs row for this call (0: no packing), and the
  ** packing of rows [m0, m1) into dst (row m at m · size). */
  size_t (*gmm_pack_size)(const struct moe8__gmm_block *b);
  void (*gmm_pack)(const struct moe8__gmm_block *b, int64_t m0, int64_t m1, void *dst);
} moe8__ktable;

/* The CPU's features (core/cpu.c, detected once); the kernel tables
** (kernels/registry.c) are built on them. */
enum {
  MOE8__CPU_AVX512 = 1 << 0,   /* F, BW, VL, DQ and the OS's ZMM state */
  MOE8__CPU_BF16 = 1 << 1,
  MOE8__CPU_VNNI = 1 << 2,
  MOE8__CPU_VBMI = 1 << 3,
  MOE8__CPU_AMX_TILE = 1 << 4, /* with XCR0 17-18 and the tile permission */
  MOE8__CPU_AMX_BF16 = 1 << 5,
  MOE8__CPU_AMX_INT8 = 1 << 6,
  MOE8__CPU_INTEL = 1 << 7,    /* GenuineIntel (how far ahead the decode kernels prefetch) */
};
unsigned moe8__cpu_features(void);

const moe8__ktable *moe8__kernels(void);
const moe8__ktable *moe8__kernels_for(moe8_isa isa); /* NULL if unsupported */
/* AVX512_VBMI (byte permutes), for an optional faster FP8 decode. */
bool moe8__cpu_has_vbmi(void);
/* Why the amx table is not supported (NULL when it is). */
const char *moe8__amx_unavailable(void);

void moe8__kernels_init_ref(moe8__ktable *k);
#ifdef MOE8_HAVE_AVX512
void moe8__kernels_init_avx512(moe8__ktable *k);
void moe8__gmm_init_avx512(moe8__ktable *k, moe8_isa isa, bool has_bf16);
void moe8__act_init_avx512(moe8__ktable *k);
/* The AMX kernels over the tile model and over the real instructions. */
void moe8__gmm_init_amx_emu(moe8__ktable *k);
void moe8__gmm_init_amx_hw(moe8__ktable *k);
#endif

/* ---- numeric helpers shared by the kernels ---------------------------- */
static inline uint32_t moe8__f32_bits(float f) {
  union { float f; uint32_t u; } v; v.f = f; return v.u;
}
static inline float moe8__bits_f32(uint32_t u) {
  union { float f; uint32_t u; } v; v.u = u; return v.f;
}
static inline size_t moe8__dtype_size(moe8_dtype t) {
  switch (t) {
    case MOE8_DTYPE_F32: return 4;
    case MOE8_DTYPE_BF16: return 2;
    case MOE8_DTYPE_F8E4M3: case MOE8_DTYPE_F8E5M2: case MOE8_DTYPE_I8: return 1;
    default: return 0;
  }
}
static inline bool moe8__is_qtype(moe8_dtype t) {
  return t == MOE8_DTYPE_F8E4M3 || t == MOE8_DTYPE_F8E5M2 || t == MOE8_DTYPE_I8;
}
static inline int64_t moe8__cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* exp(x) for the SwiGLU, within 2 ulp of exp on [-87.3, 88.7] (inputs
** are clamped there: the results saturate to about 1e-38 and 3.4e38, which
** is what silu and the sigmoid need).  Branch-free plain arithmetic, so
** the compiler vectorizes the loops that call it; one definition, so the
** forward and the backward, and every thread count, agree bit for bit. */
static inline float moe8__expf(float x) {
  x = x < -87.3f ? -87.3f : x > 88.7f ? 88.7f : x;
  /* n = round(x / ln 2) by the 1.5·2^23 trick; r = x - n·ln 2 in two parts. */
  const float n = (x * 1.44269504f + 12582912.0f) - 12582912.0f;
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  /* exp(r) on [-ln2/2, ln2/2]: degree-7 Taylor, Horner. */
  float p = 1.98412698e-4f;
  p = p * r + 1.38888889e-3f;
  p = p * r + 8.33333333e-3f;
  p = p * r + 4.16666667e-2f;
  p = p * r + 1.66666667e-1f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  return p * moe8__bits_f32((uint32_t)((int32_t)n + 127) << 23);
}

/* tanh(y) for the softcapped SwiGLU (Inkling-2), within a few ulp: for
** |y| < 0.5 its odd Taylor series through y^17 (Horner in y²), else
** 1 - 2 / (moe8__expf(2|y|) + 1); the sign copied from y (a NaN kept).
** Plain arithmetic: the AVX-512 kernel computes both sides and blends, for
** the same bytes. */
static inline float moe8__tanhf(float y) {
  const float a = y < 0.0f ? -y : y, s = a * a;
  float p = 5.90027440e-4f;     /* 6404582 / 10854718875 */
  p = p * s + -1.45583438e-3f;  /* -929569 / 638512875 */
  p = p * s + 3.59212803e-3f;   /* 21844 / 6081075 */
  p = p * s + -8.86323552e-3f;  /* -1382 / 155925 */
  p = p * s + 2.18694885e-2f;   /* 62 / 2835 */
  p = p * s + -5.39682540e-2f;  /* -17 / 315 */
  p = p * s + 1.33333333e-1f;   /* 2 / 15 */
  p = p * s + -3.33333333e-1f;  /* -1 / 3 */
  const float small = a + a * (s * p);
  const float big = 1.0f - 2.0f / (moe8__expf(2.0f * a) + 1.0f);
  const float t = a < 0.5f ? small : big;
  return moe8__bits_f32((moe8__f32_bits(t) & 0x7FFFFFFFu) | (moe8__f32_bits(y) & 0x80000000u));
}

/* DeepSeek-V4's router score sqrt(softplus(l)), softplus as torch
** computes it (threshold 20: l itself above), and its derivative from the
** score alone: d/dl = sigmoid(l) / (2 s) with sigmoid(l) = 1 - exp(-s²)
** (softplus(l) = s²); 0 where s is 0 (the score underflowed). */
static inline float moe8__sqrt_softplus(float l) {
  return sqrtf(l > 20.0f ? l : log1pf(expf(l)));
}
static inline float moe8__sqrt_softplus_grad(float s) {
  return s > 0.0f ? -expm1f(-s * s) / (2.0f * s) : 0.0f;
}

/* Opens an input file without blocking on FIFOs or devices and checks it
** is a regular file (file.c); *size gets its length. */
moe8_status moe8__open_regular(const char *path, int *fd, size_t *size);
/* Reads a whole regular file of at most cap bytes; *buf is malloc'ed and
** NUL-terminated. */
moe8_status moe8__read_small(const char *path, size_t cap, char **buf, size_t *len);
/* A JSON text parsed so that printing it again writes every number as the
** text wrote it (7.0 stays 7.0: transformers' configuration classes refuse
** an integer where they declare a float), for the config.json files moe8
** rewrites (moe8 quantize, moe8 init); NULL when it is not JSON or out of
** memory.  Numbers added later print as cJSON prints them. */
struct cJSON *moe8__json_parse_keeping_numbers(const char *txt, size_t n);
/* config.json with an optional family override (hfconfig.c). */
moe8_status moe8__config_load_as(const char *path, const char *model_type, moe8_hf_config *out);
/* The model's layers' tensor-name root ("model.layers.", or a multimodal
** model's language-model root). */
const char *moe8__model_root(const moe8_model *m);

/* Memory for weights that are streamed (the packed experts): 2 MiB
** aligned, transparent huge pages asked for (fewer TLB misses on a stream
** of gigabytes; the kernel may refuse); freed with free(). */
void *moe8__alloc_weights(size_t n);
/* Large scratch buffers kept from one call to the next (pool.c): get
** returns a block of at least bytes (64-byte aligned, its contents
** whatever the last user left; NULL when out of memory), put gives it
** back (NULL is ignored).
** Safe from several threads at once; destroy frees what it holds. */
typedef struct moe8__pool {
  pthread_mutex_t mu;
  void           *free;
  int             n;
} moe8__pool;
void  moe8__pool_init(moe8__pool *p);
void  moe8__pool_destroy(moe8__pool *p);
void *moe8__pool_get(moe8__pool *p, size_t bytes);
void  moe8__pool_put(moe8__pool *p, void *q);
/* Transparent huge pages asked for on the whole 2 MiB pages inside
** [p, p + n) (a caller's workspace: the matmuls' packed rows and
** accumulators, read a tile of 16 rows at a time); a refusal is ignored. */
void moe8__advise_huge(void *p, size_t n);

/* The library's file mappings (maps.c): a SIGBUS inside one ends the
** process with a message naming the file. */
void moe8__map_register(const void *p, size_t len, const char *path);
void moe8__map_unregister(const void *p);

/* moe8_dispatch_sort; with skip_negative an id < 0 is an assignment the
** caller skipped (pos_of = -1, no row); an id in [E, E + zero) is an
** identity expert's (LongCat-Flash's zero_experts: pos_of = -1, no row). */
struct moe8_dispatch;
moe8_status moe8__dispatch_sort(const int32_t *ids, int64_t T, int64_t K, int64_t E, int64_t zero, float capacity_factor,
                                bool skip_negative, struct moe8_dispatch *d);

/* Scalar f32 -> i8 as the quantizer needs it: round half even, clamp. */
int8_t moe8__f32_to_i8(float x);

#endif /* MOE8_INTERNAL_H */
