/*
** moe8.h — the one public header of moe8, a quantized Mixture-of-Experts
** runtime for CPUs.
**
** What is here, in the order a user meets it:
**   1. status codes and the per-thread last-error message;
**   2. number formats (f32, bf16, f8e4m3, f8e5m2, i8) and bulk conversion;
**   3. quantization: scales and quantized values for every granularity of
**      docs/numerics.md, and the inverse;
**   4. quantization rule sets (JSON, docs/numerics.md);
**   5. ISA selection (the kernel table chosen once at first use);
**   6. MoE building blocks: router, dispatch sort, gather, grouped matmul,
**      transposed grouped matmul, combine;
**   7. the MoE layer: create, weights, forward, backward, prepare, fused
**      forward, shared experts;
**   8. training (Adam);
**   9. files: safetensors, .npy, Hugging Face configs and model
**      directories, loading a layer for training or inference;
**  10. expert parallelism: communicators, the ring and all-to-all modes.
** The version macros and moe8_version() come first.  The normative text
** behind the comments is in docs/ (numerics, layer, parallelism,
** determinism, files, models, testing).
**
** Conventions.  Every call returns a moe8_status; MOE8_OK is 0.  On an error
** moe8_last_error() returns a message for the calling thread that names what
** was wrong (the tensor, the shape, the file and byte offset).  The library
** never aborts the process on caller input.  The caller owns every buffer it
** passes in; the library frees only what it allocated, through the matching
** destroy call, and destroy(NULL) is a no-op.  Arrays are dense and
** row-major; sizes are int64_t and must be non-negative.
*/
#ifndef MOE8_H
#define MOE8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Symbols of the shared library: only what this header declares is
** exported (the library is built with hidden visibility). */
#if defined(_WIN32) && defined(MOE8_SHARED_BUILD)
#define MOE8_API __declspec(dllexport)
#elif defined(__GNUC__) || defined(__clang__)
#define MOE8_API __attribute__((visibility("default")))
#else
#define MOE8_API
#endif

#define MOE8_VERSION_MAJOR 0
#define MOE8_VERSION_MINOR 2
#define MOE8_VERSION_PATCH 0
#define MOE8_VERSION_STRING "0.2.0"
/* MAJOR·10000 + MINOR·100 + PATCH, for comparisons. */
#define MOE8_VERSION_NUMBER (MOE8_VERSION_MAJOR * 10000 + MOE8_VERSION_MINOR * 100 + MOE8_VERSION_PATCH)

/* The version of the library actually linked (the macros above are the
** header's): MOE8_VERSION_NUMBER's encoding, and "0.2.0". */
MOE8_API int         moe8_version(void);
MOE8_API const char *moe8_version_string(void);
/* sizeof the named public struct ("moe8_layer_config", "moe8_quant_spec",
** "moe8_layer_grads", "moe8_load_options", "moe8_gmm_args",
** "moe8_prepared", "moe8_router_config", "moe8_quantize_options"), 0 for
** another name: bindings
** check their mirrors of the structs against it when they load. */
MOE8_API size_t      moe8_struct_size(const char *name);

/* ------------------------------------------------------------------------
** 1. Status
*/
typedef enum moe8_status {
  MOE8_OK = 0,
  MOE8_ERR_INVALID_ARG,  /* a NULL pointer, a negative size, a bad enum     */
  MOE8_ERR_SHAPE,        /* shapes that do not fit together                 */
  MOE8_ERR_DTYPE,        /* a dtype or dtype pair that is not supported     */
  MOE8_ERR_NONFINITE,    /* NaN or inf in an input; the message has a count */
  MOE8_ERR_NOMEM,        /* an allocation failed                            */
  MOE8_ERR_IO,           /* open/read/write/rename failed                   */
  MOE8_ERR_FORMAT,       /* a file whose bytes contradict its header        */
  MOE8_ERR_PARSE,        /* malformed or unknown content in JSON            */
  MOE8_ERR_UNSUPPORTED,  /* valid but not implemented (e.g. a forced ISA)   */
  MOE8_ERR_INTERNAL      /* a bug in moe8; please report it                 */
} moe8_status;

/* A fixed English string for a status; never NULL. */
MOE8_API const char *moe8_status_str(moe8_status status);

/* The detail of the last error on the calling thread: "" when none.  The
** pointer stays valid until the next moe8 call on the same thread. */
MOE8_API const char *moe8_last_error(void);

/* Clears the calling thread's last-error message. */
MOE8_API void moe8_clear_error(void);

/* Threads.  moe8 runs its parallel loops on OpenMP threads: n of them after
** moe8_set_num_threads(n) (n >= 1), OpenMP's own count (OMP_NUM_THREADS,
** else one per CPU) after n = 0, the default.  The setting is the
** process's, for every layer and every thread that calls moe8; results do
** not depend on it (docs/determinism.md).  A loop whose work is small (a
** few microseconds on one core) runs on the calling thread alone whatever
** the setting: on a host whose cores are busy with other processes, each
** wait of a thread team for its slowest member costs a scheduler time
** slice, and small layers called often (training a small layer, decode of
** one token) would spend their time waiting (docs/performance.md).
** MOE8_ERR_INVALID_ARG for n < 0 or n > 4096. */
MOE8_API moe8_status moe8_set_num_threads(int n);
/* The number of threads a large loop runs on now (>= 1). */
MOE8_API int         moe8_get_num_threads(void);

/* ------------------------------------------------------------------------
** 2. Number formats
*/
typedef enum moe8_dtype {
  MOE8_DTYPE_NONE = 0,   /* "not quantized" in rules and specs */
  MOE8_DTYPE_F32,
  MOE8_DTYPE_BF16,
  MOE8_DTYPE_F8E4M3,     /* float8_e4m3fn: no inf, max ±448, NaN 0x7F/0xFF    */
  MOE8_DTYPE_F8E5M2,     /* IEEE-like: inf 0x7C/0xFC, max ±57344              */
  MOE8_DTYPE_I8,         /* symmetric two's complement, values in [-127, 127] */
  MOE8_DTYPE_COUNT
} moe8_dtype;

typedef struct moe8_dtype_traits {
  const char *name;       /* "f32", "bf16", "f8e4m3", "f8e5m2", "i8"          */
  uint32_t    bits;       /* storage bits                                      */
  bool        is_float;
  float       finite_max; /* largest finite value; qmax for quantized types   */
} moe8_dtype_traits;

/* Traits of a dtype; NULL for MOE8_DTYPE_NONE or an out-of-range value. */
MOE8_API const moe8_dtype_traits *moe8_dtype_info(moe8_dtype dtype);

/* Parses "f32", "bf16", "f8e4m3", "float8_e4m3fn", "f8e5m2", "float8_e5m2",
** "i8", "int8", "bfloat16", "float32".  Returns MOE8_DTYPE_NONE if unknown. */
MOE8_API moe8_dtype moe8_dtype_from_name(const char *name);

/* Conversion flags. */
#define MOE8_CONVERT_NOSAT 1u  /* FP8: overflow to NaN (e4m3) or ±inf (e5m2) */

/* Converts count elements between any two of f32, bf16, f8e4m3, f8e5m2 and
** i8.  Every conversion is a single rounding of the exact source value:
**   to bf16  round to nearest even, NaN stays a quiet NaN;
**   to FP8   round to nearest even on the full grid including subnormals,
**            saturating to ±max unless MOE8_CONVERT_NOSAT; a NaN input
**            becomes 0x7F (docs/numerics.md);
**   to i8    round half to even, clamped to [-127, 127]; NaN becomes 0 and
**            the call returns MOE8_ERR_NONFINITE after converting the rest.
** FP8 -> f32/bf16 and i8 -> f32/bf16 are exact.  dst and src must not
** overlap unless they are the same pointer with equal element sizes. */
MOE8_API moe8_status moe8_convert(void *dst, moe8_dtype dst_type, const void *src,
                         moe8_dtype src_type, size_t count, unsigned flags);

/* Scalar conversions, the ground truth every kernel is tested against. */
MOE8_API uint8_t  moe8_f32_to_f8e4m3(float x, bool saturate);
MOE8_API uint8_t  moe8_f32_to_f8e5m2(float x, bool saturate);
MOE8_API float    moe8_f8e4m3_to_f32(uint8_t x);
MOE8_API float    moe8_f8e5m2_to_f32(uint8_t x);
MOE8_API uint16_t moe8_f32_to_bf16(float x);
MOE8_API float    moe8_bf16_to_f32(uint16_t x);

/* ------------------------------------------------------------------------
** 3. Quantization (docs/numerics.md)
**
** A quantized array is a qvalue array of a quantized dtype and an f32 scale
** array with x ≈ qvalue · scale under broadcasting.  The input is viewed as
** x[E, R, C]; what E, R and C mean depends on the granularity:
**
**   granularity          input          scale shape
**   TENSOR               x[1, R, C]     [1]
**   ROW                  x[1, T, K]     [T, 1]
**   ROW_TILE             x[1, T, K]     [T, ceil(K/tile)]
**   CHANNEL              w[E, K, N]     [E, 1, 1, N]
**   CHANNEL_TILE         w[E, K, N]     [E, ceil(K/tile), 1, N]
**   BLOCK2D              w[E, N, K]     [E, ceil(N/block_n), ceil(K/tile)]
**
** BLOCK2D is DeepSeek-V3's layout: the weight is stored out×in.  A last,
** partial tile or block takes its scale from the values it has.
*/
typedef enum moe8_granularity {
  MOE8_GRAN_TENSOR = 0,
  MOE8_GRAN_ROW,
  MOE8_GRAN_ROW_TILE,
  MOE8_GRAN_CHANNEL,
  MOE8_GRAN_CHANNEL_TILE,
  MOE8_GRAN_BLOCK2D
} moe8_granularity;

typedef enum moe8_calibration {
  MOE8_CALIB_ABSMAX = 0, /* s = clip · max|x| / qmax */
  /* qwix's (the JAX quantization library of seed A): for i8,
  ** s = clip · max|x| / 127.5 (1 when below 2^-63), codes
  ** clamp(round-half-even(x / s), -128, 127); for FP8 it is ABSMAX, whose
  ** codes and scales are qwix's already.  No pow2. */
  MOE8_CALIB_QWIX   = 1,
  /* OCP microscaling (MX v1.0) for FP8: s = 2^(floor(log2 max|x|) - emax),
  ** emax 8 for E4M3 and 15 for E5M2 (the exponent clamped to [-127, 127];
  ** 1 for an all-zero block), codes = x / s saturating; with 32 along K
  ** this is MXFP8.  Not for i8; no clip or pow2 (the scale is a power of
  ** two already). */
  MOE8_CALIB_MX     = 2
} moe8_calibration;

typedef struct moe8_quant_spec {
  moe8_dtype       qtype;    /* F8E4M3, F8E5M2 or I8                          */
  moe8_granularity gran;
  int64_t          tile;     /* K tile for *_TILE and BLOCK2D (> 0)           */
  int64_t          block_n;  /* N block for BLOCK2D (> 0)                     */
  moe8_calibration calib;
  float            clip;     /* in (0, 1e30]; 1 = plain absmax; 0 means 1    */
  bool             pow2;     /* round the scale up to a power of two (UE8M0) */
} moe8_quant_spec;

/* Number of f32 scale elements the spec yields for x[E, R, C]; 0 and
** MOE8_ERR_* in *status when the spec or sizes are invalid. */
MOE8_API size_t moe8_quant_scale_count(const moe8_quant_spec *spec, int64_t E, int64_t R,
                              int64_t C, moe8_status *status);

/* The scale of one block from its absolute maximum (docs/numerics.md): clip, divide by
** qmax in f32, 1 when zero or below 2^-126, then optionally a power of two. */
MOE8_API float moe8_scale_from_absmax(float absmax, moe8_dtype qtype, float clip, bool pow2);

/* Quantizes x[E, R, C] (f32).  q receives E·R·C bytes (one per element),
** scale receives moe8_quant_scale_count() floats.  Values are
** convert(x / s) with an IEEE f32 division and the saturating conversion;
** i8 rounds half to even and clamps to [-127, 127].  If x holds NaN or inf,
** returns MOE8_ERR_NONFINITE, stores the count in *nonfinite (may be NULL)
** and leaves q and scale unspecified. */
MOE8_API moe8_status moe8_quantize(const moe8_quant_spec *spec, const float *x, int64_t E,
                          int64_t R, int64_t C, void *q, float *scale,
                          size_t *nonfinite);

/* The inverse: y = q · s, exact in f32 up to the one rounding of the product. */
MOE8_API moe8_status moe8_dequantize(const moe8_quant_spec *spec, const void *q,
                            const float *scale, int64_t E, int64_t R, int64_t C,
                            float *y);

/* ------------------------------------------------------------------------
** 4. Quantization rules (docs/numerics.md)
*/
typedef struct moe8_rule {
  const char      *module_path;      /* POSIX extended regex                  */
  moe8_dtype       weight_qtype;     /* MOE8_DTYPE_NONE: not quantized        */
  moe8_dtype       act_qtype;
  moe8_dtype       bwd_qtype;
  int64_t          tile_size;        /* 0: per-channel / per-token            */
  float            weight_clip;      /* from "absmax,c"; 1 when absent        */
  bool             weight_pow2;      /* "absmax_pow2"                         */
  float            act_clip;
  bool             act_pow2;
  moe8_calibration weight_calib;     /* "qwix": MOE8_CALIB_QWIX               */
  moe8_calibration act_calib;
  /* weight_qtype "mxfp4": the experts quantized to OCP MXFP4 (E2M1 codes,
  ** one E8M0 scale per 32 along K) at an inference load and kept so
  ** (4.25 bits a weight); weight_qtype is then NONE.  Activations f32
  ** (act_qtype null), or int8 per token or 1 x tile_size with the tile a
  ** multiple of 32 (the int8 MXFP4 kernels, faster for decode); D and the
  ** FFN widths multiples of 32. */
  bool             weight_mxfp4;
  /* weight_qtype "mxfp8": weight_qtype f8e4m3, weight_calib MOE8_CALIB_MX,
  ** and tile_size 32 (set when the rule gives none; another is refused). */
  bool             weight_mx8;
} moe8_rule;

typedef struct moe8_rules moe8_rules;

/* Parses a rule set from JSON text; name is used in messages (a file name).
** Errors name the field, its JSON path and its line:column. */
MOE8_API moe8_status moe8_rules_parse(const char *json, size_t len, const char *name,
                             moe8_rules **out);
MOE8_API moe8_status moe8_rules_load(const char *path, moe8_rules **out);
MOE8_API void        moe8_rules_destroy(moe8_rules *rules);

/* The first rule whose module_path matches (regexec, unanchored), or NULL. */
MOE8_API const moe8_rule *moe8_rules_match(const moe8_rules *rules, const char *module_path);
MOE8_API size_t           moe8_rules_count(const moe8_rules *rules);
MOE8_API const moe8_rule *moe8_rules_at(const moe8_rules *rules, size_t i);
MOE8_API bool             moe8_rules_quantize_before_ep_all_gather(const moe8_rules *rules);

/* The quant spec a rule implies for a weight w[E, K, N] or an activation
** x[T, K]; false when that operand is not quantized by the rule. */
MOE8_API bool moe8_rule_weight_spec(const moe8_rule *rule, moe8_quant_spec *spec);
MOE8_API bool moe8_rule_act_spec(const moe8_rule *rule, moe8_quant_spec *spec);

/* ------------------------------------------------------------------------
** 5. ISA selection and the summation order
**
** The kernel table is chosen once, at the first call that needs it: the best
** family whose features the build enabled, CPUID reports and XGETBV says the
** OS saves (AMX also needs the kernel's tile permission, asked once).
** MOE8_ISA=ref|avx512|avx512_bf16|avx512_vnni|amx_emu|amx in the environment
** forces one (an unavailable one is refused with a message on stderr and the
** best one is used); MOE8_DEBUG=1 prints the choice, and why AMX is not used
** where it is not; MOE8_NO_BF16=1 hides AVX512_BF16 (the VNNI-only table, as
** on Cascade Lake); MOE8_CPU_FEATURES=avx512f,avx512bw,... keeps only the
** named features (emulates an older CPU).  amx_emu runs the AMX kernels over
** a C model of the tile instructions: for tests on CPUs without AMX, slow,
** never chosen by itself.
*/
typedef enum moe8_isa {
  MOE8_ISA_REF = 0,      /* portable scalar C                               */
  MOE8_ISA_AVX512,       /* AVX-512 F/BW/VL/DQ                              */
  MOE8_ISA_AVX512_BF16,  /* + vdpbf16ps                                     */
  MOE8_ISA_AVX512_VNNI,  /* + vpdpbusd, and vdpbf16ps when the CPU has
                         ** AVX512_BF16 (without it, as on Cascade Lake and
                         ** Ice Lake, FP8/bf16 run on the f32 path)        */
  MOE8_ISA_AMX_EMU,      /* the AMX kernels over the tile model (tests)     */
  MOE8_ISA_AMX,          /* + AMX-TILE/BF16/INT8 (Sapphire Rapids and later) */
  MOE8_ISA_COUNT
} moe8_isa;

MOE8_API const char *moe8_isa_name(moe8_isa isa);
MOE8_API bool        moe8_isa_supported(moe8_isa isa); /* built, CPUID and XGETBV    */
MOE8_API moe8_isa    moe8_isa_active(void);
/* Forces the ISA for the whole process (tests, benchmarks).  Not to be
** called while other threads run moe8 calls. */
MOE8_API moe8_status moe8_isa_set(moe8_isa isa);

/* The order of the float sums of a grouped matmul with a bf16 or FP8 lhs
** (docs/determinism.md).  CANONICAL is the order of AMX's tdpbf16ps
** (pieces of 32 along K, an even and an odd sum each): the same bytes on
** every kernel table and every x86 CPU.  NATIVE is each table's fastest
** order (vdpbf16ps on AVX512_BF16): the same bytes on one table only.  A
** table with tiles always sums in the canonical order.  DEFAULT is the
** process setting: MOE8_ORDER=canonical|native in the environment, else
** canonical where the active table has tiles and native elsewhere. */
typedef enum moe8_order {
  MOE8_ORDER_DEFAULT = 0,
  MOE8_ORDER_CANONICAL,
  MOE8_ORDER_NATIVE
} moe8_order;

MOE8_API const char *moe8_order_name(moe8_order order);
/* The order a call with `order` gets on the active table (never DEFAULT). */
MOE8_API moe8_order  moe8_order_effective(moe8_order order);
/* Sets the process setting (DEFAULT: back to the environment's or the CPU's). */
MOE8_API moe8_status moe8_order_set(moe8_order order);


/* ------------------------------------------------------------------------
** 6. MoE building blocks (docs/layer.md)
**
** Sizes: T tokens, hidden D, E experts, top-k K_top.  An "assignment" is
** a = t·K_top + j (token t, slot j).  All index arrays are int32.
*/
/* Routing keeps per-token scratch on the stack; E is at most this. */
#define MOE8_MAX_EXPERTS 4096
/* A product-key layer's experts (moe8_layer_config.product_keys; its
** routing keeps 2·floor(sqrt(E)) values per token): at most this. */
#define MOE8_MAX_PK_EXPERTS (1 << 20)

typedef enum moe8_score_func {
  MOE8_SCORE_SOFTMAX = 0,  /* softmax over all E (default) */
  MOE8_SCORE_SIGMOID,
  /* DeepSeek-V4: sqrt(softplus(l)), softplus(l) = log1p(exp(l)) for
  ** l <= 20 and l above (torch's threshold) */
  MOE8_SCORE_SQRTSOFTPLUS,
  /* PhiMoE's sparsemixer in inference (transformers' sparsemixer with
  ** training false): always two experts.  The first is the top logit m1
  ** (ties to the lower index), weighted by its softmax over the experts
  ** whose (m1 - l) / max(|l|, m1) <= 2·jitter_eps (the others -inf); the
  ** second is the top logit m2 of the others, weighted by its softmax over
  ** the experts but the first whose (m2 - l) / max(|l|, m2) <= 2·jitter_eps.
  ** Not renormalized; top_k must be 2; no selection bias, groups,
  ** select_logits, hash table or norm_topk_prob with it.  The scores
  ** written are the first choice's masked softmax.  All in f32 (the
  ** threshold 2·jitter_eps is an f32, as torch compares the f32 logits
  ** with it).  No backward: transformers samples the choice in training
  ** (Gumbel), which is not this rule. */
  MOE8_SCORE_SPARSEMIXER
} moe8_score_func;

/* How group-limited routing scores a group of experts. */
typedef enum moe8_group_score {
  MOE8_GROUP_TOP2_SUM = 0, /* its two best selection values, summed (DeepSeek-V3, GLM-4.5) */
  MOE8_GROUP_MAX      = 1  /* its best selection value (DeepSeek-V2 group_limited_greedy)  */
} moe8_group_score;

typedef struct moe8_router_config {
  int64_t          num_experts;           /* E                                   */
  int64_t          top_k;                 /* 1 <= top_k <= E                      */
  moe8_score_func  score;
  bool             norm_topk_prob;        /* renormalize selected scores to sum 1 */
  float            routed_scaling_factor; /* multiplies the weights; 0 means 1    */
  const float     *selection_bias;        /* [E] added for selection only, or NULL */
  /* Group-limited routing (DeepSeek-V3): the E experts form n_group equal
  ** groups; a group's score is the sum of its two best selection values
  ** (score + bias), the topk_group best groups are kept and the others'
  ** selection values become -inf before the top-k (as DeepSeek's own
  ** inference code and transformers 5 do).  n_group <= 1: plain top-k. */
  int64_t          n_group;
  int64_t          topk_group;
  moe8_group_score group_score;
  /* With norm_topk_prob: the weights are divided by max(Σ + norm_eps,
  ** norm_min) (ERNIE-4.5's moe_norm_min; LFM2-MoE's 1e-6); 0, 0: by Σ. */
  float            norm_min, norm_eps;
  /* The top-k of logit + bias instead of score + bias (Kolibri-1); the
  ** weights are still the scores. */
  bool             select_logits;
  /* With norm_topk_prob: the weights divided by their p-norm
  ** (Σ w^p)^(1/p) with p = norm_p (DBRX's moe_normalize_expert_weights);
  ** 0 or 1: by their sum (norm_min and norm_eps then apply); another p
  ** must be positive and finite, with norm_min and norm_eps 0. */
  float            norm_p;
  /* Hash routing (DeepSeek-V4's hash layers): with hash_table non-NULL,
  ** token t's experts are hash_table[token_ids[t] · top_k + j] (an int
  ** table [hash_vocab, top_k], every id in [0, E); repeats allowed), in
  ** that order, weighted by their scores (no selection: the bias, groups
  ** and select_logits are refused with it), then renormalized and scaled
  ** as above.  A token id outside [0, hash_vocab) is an error naming the
  ** token. */
  const int32_t   *hash_table;
  int64_t          hash_vocab;
  const int32_t   *token_ids;   /* [T] */
  /* Group-limited routing: the dropped groups' experts get a selection
  ** value of 0.0 instead of -inf (AXK2's router, transformers' AXK2);
  ** it selects differently from -inf once the kept experts' values can
  ** be negative (score + a negative bias): a dropped expert (value 0,
  ** ties to the lower index) then beats them. */
  bool             group_mask_zero;
  /* Router-scored shared experts (Inkling's): the last scored_shared of
  ** the E experts are shared ones every token goes through, in slots
  ** top_k - scored_shared .. top_k - 1 (in order), after the top
  ** (top_k - scored_shared) of the others; all top_k weighted by their
  ** scores, renormalized and scaled together.  0: none; else
  ** 0 < scored_shared < top_k, no groups, no hash routing. */
  int64_t          scored_shared;
  /* MOE8_SCORE_SPARSEMIXER's jitter_eps (PhiMoE's router_jitter_noise):
  ** the mask's threshold is 2·jitter_eps; a finite value >= 0. */
  float            jitter_eps;
} moe8_router_config;

/* logits[T, E] = x[T, D] · wr[D, E] in f32, each element summed over d in
** order 0..D-1 (batch-invariant). */
MOE8_API moe8_status moe8_router_logits(const float *x, const float *wr, int64_t T, int64_t D, int64_t E,
                               float *logits);

/* From logits[T, E]: scores (softmax, sigmoid or sqrt-softplus, written to scores[T, E]
** when not NULL), top-k of score + bias with ties to the lower expert
** index, expert_ids[T, top_k] in decreasing order of selection value, and
** weights[T, top_k] = selected scores, renormalized when asked, times the
** scaling factor.  With n_group > 1, E must be a multiple of n_group with
** at least two experts per group, 1 <= topk_group <= n_group and top_k <=
** topk_group · E / n_group. */
MOE8_API moe8_status moe8_route(const moe8_router_config *cfg, const float *logits, int64_t T,
                       float *scores, int32_t *expert_ids, float *weights);

/* The result of the dispatch sort: caller-allocated arrays. */
typedef struct moe8_dispatch {
  int32_t *token_of;     /* [T·K_top] row p -> token (first num_rows valid)    */
  int32_t *slot_of;      /* [T·K_top] row p -> slot j                           */
  int32_t *group_sizes;  /* [E] rows kept per expert                            */
  int64_t *offsets;      /* [E+1] first row of each expert; offsets[E] = rows   */
  int32_t *pos_of;       /* [T·K_top] assignment -> row, or -1 if dropped       */
  int64_t  num_rows;     /* out: rows kept                                      */
} moe8_dispatch;

/* Stable counting sort of the T·K_top assignments by expert.  With
** capacity_factor c > 0 each expert keeps at most ceil(T·K_top/E · c) rows,
** the first in sorted order; c <= 0 is dropless.  An expert id outside
** [0, E) is an error naming the assignment. */
MOE8_API moe8_status moe8_dispatch_sort(const int32_t *expert_ids, int64_t T, int64_t top_k, int64_t E,
                               float capacity_factor, moe8_dispatch *out);

/* dst[p] = src[index[p]] for p < n, rows of row_bytes bytes; src has
** src_rows rows; an index out of range is an error naming it. */
MOE8_API moe8_status moe8_gather_rows(void *dst, const void *src, size_t row_bytes, const int32_t *index,
                             int64_t n, int64_t src_rows);

/* Gather of a quantized array's rows (docs/layer.md): qvalue rows are always
** gathered; the scale [scale_rows, scale_cols] is gathered only when it has
** one row per token (scale_rows == rows); a per-tensor [1, 1] or
** per-channel [1, cols] scale is copied through unchanged, and
** *scale_gathered says which happened.  dst_scale has room for
** n · scale_cols floats.  Any other scale shape is MOE8_ERR_SHAPE. */
MOE8_API moe8_status moe8_gather_qrows(void *dst_q, float *dst_scale, bool *scale_gathered,
                              const void *src_q, const float *src_scale, int64_t rows, int64_t cols,
                              int64_t scale_rows, int64_t scale_cols, const int32_t *index, int64_t n);

/* One operand of a grouped matmul.  scale is NULL for f32/bf16; otherwise
** lhs scales are TENSOR [1], ROW [M, 1] or ROW_TILE [M, ceil(K/tile)] and
** rhs scales are TENSOR [1], CHANNEL [G, 1, 1, N] or CHANNEL_TILE
** [G, ceil(K/tile), 1, N].  When both operands are K-tiled the tiles must
** be equal. */
typedef struct moe8_operand {
  moe8_dtype       dtype;   /* F32, BF16, F8E4M3, F8E5M2 or I8 */
  const void      *data;
  const float     *scale;
  moe8_granularity gran;
  int64_t          tile;
} moe8_operand;

/* Grouped matmul (docs/layer.md).  Rows of lhs[M, K] come in E consecutive
** groups of group_sizes[g] rows.  For the local groups g in
** [group_offset, group_offset + num_local), row p of group g gets
** out[p] = lhs[p] · rhs[g - group_offset], with rhs [num_local, K, N]
** (or [num_local, N, K] when rhs_transposed; then rhs must be f32 or bf16
** without scales).  Every other row of out is written as zero.
** Supported pairs: f32·f32, bf16·bf16, f8·f8 (any mix of e4m3/e5m2),
** i8·i8, and weight-only f32 or bf16 lhs with f8 or i8 rhs.  Products are
** summed over each scale block along K (i8 in i32, others in f32) and each
** block sum is added to the f32 accumulator times lhs_scale · rhs_scale of
** that block.  out is f32 or bf16, [M, N].  K is never split across
** threads, so results do not depend on the thread count or on which other
** rows share the call. */
typedef struct moe8_gmm_args {
  int64_t        M, K, N;
  int64_t        num_groups;      /* E: length of group_sizes */
  const int32_t *group_sizes;
  int64_t        group_offset;
  int64_t        num_local;       /* G */
  moe8_operand   lhs, rhs;
  bool           rhs_transposed;
  moe8_dtype     out_dtype;       /* F32 or BF16 */
  void          *out;
  /* Optional: the FP8 or i8 rhs codes as moe8_gmm_pack_rhs wrote them
  ** (rhs.data is then not read; rhs.dtype, scale, gran and tile still
  ** describe it).  Same results, bit for bit, as the plain rhs; faster
  ** where few rows meet each weight (decode).  Needs every scale block
  ** along K to be a multiple of 2 (FP8) or 4 (i8), or a single block. */
  const void    *rhs_packed;
  /* The summation order (section 5); 0 = MOE8_ORDER_DEFAULT. */
  moe8_order     order;
} moe8_gmm_args;

MOE8_API moe8_status moe8_gmm(const moe8_gmm_args *args);

/* Pre-packing of quantized expert weights [G, K, N] (e4m3, e5m2 or i8
** codes) into the layout the kernels stream (column tiles; k pairs for
** FP8, k quads for i8, interleaved; see docs/kernels.md): done once, e.g.
** at moe8_layer_prepare.  dst holds moe8_gmm_packed_size(dtype, G, K, N)
** bytes (about G·K·N, rounded up to whole pairs or quads and strips). */
MOE8_API size_t      moe8_gmm_packed_size(moe8_dtype dtype, int64_t G, int64_t K, int64_t N);
MOE8_API moe8_status moe8_gmm_pack_rhs(moe8_dtype dtype, const void *rhs, int64_t G, int64_t K, int64_t N, void *dst);

/* Transposed grouped matmul for weight gradients: for each local group g,
** out[g - group_offset] = lhs_gᵀ · dy_g, with lhs [M, K], dy [M, N] (f32
** or bf16, no scales), out [num_local, K, N] f32.  It runs the gmm
** kernels with the group's rows as the contraction axis, so its sums have
** the gmm's fixed order and do not depend on threads.  Groups with no rows
** give zeros. */
MOE8_API moe8_status moe8_tgmm(const moe8_operand *lhs, const moe8_operand *dy, int64_t M, int64_t K,
                      int64_t N, int64_t num_groups, const int32_t *group_sizes,
                      int64_t group_offset, int64_t num_local, float *out);

/* Combine (docs/layer.md): out[t] = Σ_j weights[t, j] · y[pos_of[t·K_top + j]]
** in f32, slots in order j = 0, 1, ...; a dropped slot (pos_of < 0) adds
** nothing; weights NULL: every weight 1 (the rows summed).  y is [rows, D]
** f32; out is [T, D]. */
MOE8_API moe8_status moe8_combine(const float *y, int64_t rows, const int32_t *pos_of, const float *weights,
                         int64_t T, int64_t top_k, int64_t D, float *out);

/* ------------------------------------------------------------------------
** 7. The MoE layer (docs/layer.md)
**
** One object holds the config, the f32 master weights (router Wr[D, E];
** gate Wg[E, D, F]; up Wu[E, D, F]; down Wd[E, F, D]; selection bias [E])
** and the quantization rule that matched its module path.  Order of calls:
** create, write the weights (moe8_layer_weight), then any number of
**   forward -> backward            (training: weights re-quantized per call)
** or
**   prepare -> forward_fused ...   (inference: weights quantized once)
** Scratch is the caller's: moe8_layer_workspace_size(T) bytes, 64-byte
** aligned, passed to forward and then, unchanged, to backward, which reads
** what forward saved there.
*/
/* The experts' activation on g = x·Wg, u = x·Wu (plus biases). */
typedef enum moe8_expert_act {
  MOE8_ACT_SWIGLU       = 0, /* h = silu(g) · u                                               */
  MOE8_ACT_SWIGLU_CLAMP = 1, /* GPT-OSS: g' = min(g, limit), u' = clamp(u, ±limit),
                             ** h = g' · sigmoid(α g') · (u' + 1)                             */
  MOE8_ACT_SWIGLU_LIMIT = 2, /* GLM-5, HY-V4: h = silu(min(g, limit)) · clamp(u, ±limit)     */
  MOE8_ACT_SWIGLU_POST  = 3, /* Step-3.5/3.7: h = min(silu(g), limit) · clamp(u, ±limit), the
                             ** clamp after the activation; limit 0: none (the plain SwiGLU)   */
  MOE8_ACT_SWIGLU_SOFTCAP = 4, /* Inkling-2: h = cg·tanh(g/cg) · sigmoid(g) · cu·tanh(u/cu) with
                             ** cg = act_alpha, cu = act_limit (mlp_gate_softcap, mlp_up_softcap) */
  MOE8_ACT_GEGLU        = 5, /* Gemma-4: h = gelu_tanh(g) · u, gelu_tanh(g) = 0.5·g·(1 + tanh(√(2/π)·(g +
                             ** 0.044715·g³))) (transformers' gelu_pytorch_tanh)                */
  /* Ungated experts: one input projection u = x·Wu [D, F] per expert, no
  ** gate (MOE8_W_GATE and MOE8_W_SHARED_GATE absent: NULL, count 0), then
  ** h = act(u) and the down projection.  The shared expert has the same
  ** form.  Everything that holds gate|up [.., 2F] holds up alone [.., F]
  ** (moe8_prepared, moe8_layer_put_expert, moe8's files). */
  MOE8_ACT_RELU2 = 6,        /* Nemotron-H: h = relu(u)², relu(u) = u < 0 ? 0 : u (a NaN kept) */
  MOE8_ACT_RELU = 7,         /* h = relu(u) */
  MOE8_ACT_SILU = 8          /* h = silu(u) = u / (1 + exp(-u)): the product-key experts' only
                             ** (moe8_layer_config.product_keys; Doge's hidden_act silu)      */
} moe8_expert_act;

typedef struct moe8_layer_config {
  int64_t         num_experts;            /* E                                    */
  int64_t         top_k;
  int64_t         hidden;                 /* D                                    */
  int64_t         ffn;                    /* F: expert FFN width                  */
  moe8_score_func score;
  bool            norm_topk_prob;
  float           routed_scaling_factor;  /* 0 means 1                            */
  bool            use_selection_bias;     /* the layer holds a bias [E], zeros    */
  float           capacity_factor;        /* <= 0: dropless                       */
  float           aux_loss_weight;        /* α of α·E·Σ f_e·P_e; 0: no aux loss   */
  int64_t         n_group, topk_group;    /* group-limited routing; n_group <= 1: none */
  /* Shared expert: a SwiGLU MLP of width shared_ffn (0: none) that every
  ** token goes through, added after the routed experts' combine; with
  ** shared_gate (Qwen2-MoE) it is multiplied by sigmoid(x · w_gate) first. */
  int64_t         shared_ffn;
  bool            shared_gate;
  moe8_group_score group_score;           /* with n_group > 1 (moe8_router_config) */
  /* The expert form (GPT-OSS's when act is MOE8_ACT_SWIGLU_CLAMP and both
  ** biases are on).  router_bias: logits += b [E] (MOE8_W_ROUTER_BIAS),
  ** for selection and weights alike.  expert_bias: the routed experts'
  ** gate|up pre-activations += b [E, 2F] (gate columns, then up; ungated
  ** experts, NLLB-MoE's fc1: their up pre-activations += b [E, F]) and their
  ** outputs += b [E, D], before the routing weight.  Forward, fused and
  ** expert-parallel forward; backward and training are refused for a
  ** layer with any of them (MOE8_ERR_UNSUPPORTED). */
  moe8_expert_act act;
  float           act_alpha, act_limit;   /* CLAMP: α > 0, limit > 0; LIMIT: limit > 0; POST: limit >= 0; SOFTCAP: both > 0 */
  bool            router_bias, expert_bias;
  /* Llama-4: each routed expert gets its token scaled by the routing weight
  ** (E_j(w_j · x)) and the outputs are summed unweighted, instead of
  ** Σ w_j · E_j(x).  Activations are then quantized after the scaling
  ** (quantize_before_ep_all_gather does not apply); expert parallelism and
  ** the backward are refused for now (MOE8_ERR_UNSUPPORTED). */
  bool            weight_input;
  /* The shared expert's SwiGLU is the plain one even when act is not
  ** (HY-V4 clamps only its routed experts); false: the shared expert uses
  ** act as the routed ones do (GLM-5 clamps both). */
  bool            shared_plain_act;
  /* With norm_topk_prob: the weights are divided by max(Σ + norm_eps,
  ** norm_min) (ERNIE-4.5's moe_norm_min, where it holds the gradient is a
  ** constant denominator's; LFM2-MoE's norm_eps 1e-6); 0, 0: by Σ. */
  float           norm_min, norm_eps;
  /* The router selects by logit + bias instead of score + bias (Kolibri-1:
  ** the top-k of l + b, weighted by sigmoid(l)). */
  bool            select_logits;
  /* JetMoE: the block's output plus a bias b [D] (MOE8_W_OUT_BIAS), added
  ** to every token's row after the routed sum and the shared expert;
  ** forward, fused, backward (its gradient: dout summed over the tokens)
  ** and both expert-parallel modes. */
  bool            out_bias;
  /* With norm_topk_prob: the weights divided by their p-norm, p = norm_p
  ** (moe8_router_config.norm_p; DBRX); 0 or 1: by their sum. */
  float           norm_p;
  /* The shared expert's output times shared_scale before it is added (0
  ** means 1): with routed_scaling_factor 0.5 and shared_scale 0.5 the block
  ** is Cohere2-MoE's "average", (routed + shared) / 2 (the same floats:
  ** halving is exact). */
  float           shared_scale;
  /* MOE8_ACT_SWIGLU_POST: the shared expert's own limit (Step's
  ** swiglu_limits_shared; 0: its SwiGLU unclamped), act_limit being the
  ** routed experts'; ignored with the other activations. */
  float           shared_act_limit;
  /* DeepSeek-V4's hash layers: the experts of a token are a table's row
  ** for its token id (moe8_layer_set_hash_table), weighted by their
  ** scores, renormalized and scaled (moe8_router_config.hash_table); the
  ** forwards then need the token ids (moe8_layer_forward_tokens and the
  ** others below: a forward without them is refused by name).  Backward
  ** and training work as for any layer (the ids are the forward's); both
  ** expert-parallel modes take each rank's token ids
  ** (moe8_ep_forward_tokens).  No selection bias, groups or
  ** select_logits with it. */
  bool            hash_routing;
  /* Group-limited routing with the dropped groups' selection values 0.0
  ** instead of -inf (moe8_router_config.group_mask_zero; AXK2). */
  bool            group_mask_zero;
  /* Router-scored shared experts (moe8_router_config.scored_shared;
  ** Inkling): num_experts and top_k count them; the last scored_shared
  ** experts are shared ones every token goes through, weighted by their
  ** router scores with the routed ones.  Forward, fused, backward and both
  ** expert-parallel modes (they are experts). */
  int64_t         scored_shared;
  /* Gemma-4's routed branch, four capabilities that a layer may take one
  ** by one; each RMSNorm is n(x) = x · (mean(x²) + rms_eps)^(-1/2) over
  ** the row's D values, in f32, and its weight multiplies (not 1 + w).
  ** router_norm: the router reads n(x) ⊙ s · router_norm_scale instead of
  ** x (s = MOE8_W_ROUTER_SCALE [D]; Gemma-4's router.scale and D^-1/2).
  ** expert_scale: each routing weight, after the renormalization and the
  ** scaling, times c[e] of its expert (MOE8_W_EXPERT_SCALE [E]; Gemma-4's
  ** router.per_expert_scale).  in_norm: the experts (routed and shared)
  ** read n(x) ⊙ w (MOE8_W_IN_NORM [D]; pre_feedforward_layernorm_2).
  ** out_norm: the block's output y (routed sum, shared expert, out_bias)
  ** becomes n(y) ⊙ w (MOE8_W_OUT_NORM [D]; post_feedforward_layernorm_2).
  ** Forward, fused, backward (gradients through the norms and scales),
  ** training and both expert-parallel modes (the single process's bytes). */
  bool            router_norm, expert_scale, in_norm, out_norm;
  float           router_norm_scale;      /* 0 means 1                            */
  float           rms_eps;                /* the norms' epsilon, >= 0             */
  /* MOE8_SCORE_SPARSEMIXER's jitter_eps (moe8_router_config; PhiMoE's
  ** router_jitter_noise, default there 0.01).  Forward, fused and both
  ** expert-parallel modes forward; the backward and the trainer are
  ** refused (MOE8_ERR_UNSUPPORTED). */
  float           router_jitter;
  /* LongCat-Flash's zero-computation experts: the router scores
  ** num_experts + zero_experts experts (the router's weight is [D, E + Z],
  ** its bias and the selection bias [E + Z]; scores [T, E + Z]), and a
  ** chosen id e >= num_experts is an identity expert: its slot adds
  ** w · x (no weights, no rows in the dispatch).  The identity slots are
  ** summed in slot order after the routed experts' combine, before the
  ** shared expert.  Forward, fused, backward (the identity's gradient:
  ** dx += w · dout, dw = dout · x), the trainer and both expert-parallel
  ** modes (the identity slots stay on the token's owner); no capacity
  ** factor, aux loss, groups, weight_input, hash routing or sparsemixer
  ** with it.  0: none. */
  int64_t         zero_experts;
  /* Latent experts (Nemotron-H's moe_latent_size, MuSE-Spark): latent > 0
  ** is the routed experts' width; they read z = x · P (MOE8_W_LATENT_IN
  ** [D, latent]; with latent_norm then n(z) ⊙ v, MOE8_W_LATENT_NORM
  ** [latent], eps rms_eps), and their weighted sum c [T, latent] becomes
  ** c · Q (MOE8_W_LATENT_OUT [latent, D]) before the shared expert and
  ** out_bias are added.  The router and the shared expert read the full
  ** x.  The projections and the norm are dense f32 per token, whatever
  ** the rules (which quantize the routed experts' latent rows and the
  ** shared expert as for any layer).  0: none.
  ** expert_out_norm: each routed expert's output row o (width latent, or
  ** hidden without latent) becomes u · (mean(u²) + expert_out_eps)^(-1/2),
  ** u = o ⊙ s (MOE8_W_EXPERT_OUT_NORM [width]; MuSE-Spark's
  ** post_expert_norm, its 1 + w), before the routing weight.
  ** Forward, fused inference, backward (moe8_layer_grads dwli, dwlo, dwln,
  ** dweon) and the trainer; both expert-parallel modes are refused for a
  ** layer with either (MOE8_ERR_UNSUPPORTED); no expert_bias, in_norm,
  ** weight_input or zero_experts with latent. */
  int64_t         latent;
  bool            latent_norm, expert_out_norm;
  float           expert_out_eps;
  /* SwitchTransformers' expert capacity (its Top1Router): the forward's T
  ** rows are sequences of seq_len consecutive tokens (the forwards'
  ** seq_len, moe8_layer_forward_seq; 0: all T one sequence), and a slot is
  ** dropped when its token is not among the first expert_capacity tokens
  ** of its sequence that chose its expert (counted in token order, its own
  ** token included): the slot takes no expert row and adds nothing (a
  ** token whose every slot is dropped has the output +0.0, before the
  ** shared expert and out_bias).  Forward and fused; the backward, the
  ** trainer and expert parallelism are refused by name (not implemented);
  ** no zero_experts, hash routing, scored_shared, weight_input, capacity
  ** factor or aux loss with it.  0: none. */
  int64_t         expert_capacity;
  /* Zaya's router (ZayaRouter and its ZayaRouterMLP): an MLP of width
  ** router_mlp = R > 0 instead of the linear x · Wr (0: the linear one).
  ** Its state s = x · A + a (MOE8_W_ROUTER_DOWN [D, R],
  ** MOE8_W_ROUTER_DOWN_BIAS [R]), plus, with router_state, the previous
  ** layer's state p [T, R] times c (MOE8_W_ROUTER_STATE_SCALE [R]):
  ** s = x · A + a + p ⊙ c (Zaya's layers after the first; its first
  ** layer's router has no c and reads x alone).  s is the layer's own
  ** router state, which the next layer takes as its p
  ** (moe8_layer_forward_state).  Then u = n(s) ⊙ g (an RMSNorm over the R
  ** values, eps rms_eps; MOE8_W_ROUTER_MLP_NORM [R]), v = gelu(u · B1 +
  ** b1), w = gelu(v · B2 + b2) (MOE8_W_ROUTER_FC1 / _FC2 [R, R] and their
  ** biases [R]; gelu(z) = z/2 · (1 + erf(z/√2)), torch's exact GELU), and
  ** the logits w · Wr (MOE8_W_ROUTER [R, E + skip_experts], plus the
  ** router bias when router_bias), every step in f32.  The scores, the
  ** top-k and the weights are then the layer's as for any router.
  ** Forward and fused inference; the backward, the trainer and expert
  ** parallelism are refused by name (not implemented); no router_norm,
  ** hash routing, sparsemixer, groups, scored_shared, weight_input,
  ** capacity (either kind) or aux loss with it.  router_state needs
  ** router_mlp. */
  int64_t         router_mlp;
  bool            router_state;
  /* Skip experts (Zaya's one "without actual compute"): the router scores
  ** num_experts + skip_experts classes (its weight [.., E + S], its bias
  ** and the selection bias [E + S]; scores [T, E + S]), and a slot that
  ** chooses one of the last S adds nothing and computes nothing (its
  ** weight becomes 0; a token whose every slot is skipped has the output
  ** +0.0, before the shared expert and out_bias).  Forward and fused;
  ** the backward, the trainer and expert parallelism are refused by name;
  ** no zero_experts, capacity (either kind), groups, hash routing,
  ** sparsemixer, scored_shared, weight_input or aux loss with it.  0: none. */
  int64_t         skip_experts;
  /* Product-key experts (Doge's DogeCDMoE): num_experts single-neuron
  ** experts, ungated (act MOE8_ACT_SILU, ffn 1): expert j's output is
  ** act(x · k_j) · v_j with its key k_j = MOE8_W_UP [E, D, 1] (Doge's
  ** down_embed) and its value v_j = MOE8_W_DOWN [E, 1, D] (up_embed).
  ** The router weight MOE8_W_ROUTER is [D, 2N], N = floor(sqrt(E)) keys:
  ** the logits l [T, 2N] = x · Wr in f32 are read as transformers'
  ** router_logits.view(2, T, N) reads them, the first T·N floats of the
  ** flat [T, 2N] buffer being the first key halves and the rest the
  ** second ones: token t's halves sx = flat[t·N ..], sy = flat[(T + t)·N
  ** ..] (for T > 1 they are other tokens' logits: a token's routing
  ** depends on the other tokens of the call; T = 1 reads its own).  Each
  ** half sorted descending (ties to the lower index), the candidate (a, b)
  ** scores sx[a] + sy[b] in f32 and is expert ia[a]·N + ib[b]; the top_k
  ** candidates (ties to the lower a·N + b; top_k <= N²) in that order are
  ** the slots; their weights the softmax of their scores (f32), divided by
  ** their sum with norm_topk_prob, times routed_scaling_factor.  Slot j
  ** adds (w_j · act(x · k_e)) · v_e, summed in slot order from zero; the
  ** shared expert (a SwiGLU: shared_plain_act) and out_bias are added
  ** after.  num_experts up to MOE8_MAX_PK_EXPERTS.  Under a weight rule
  ** both tables are quantized per expert row, [E, ceil(D/tile) or 1, 1, 1]
  ** scales (moe8_prepared's s_down too: the values' K = 1 would give each
  ** value its own scale); under an activation rule x is quantized (the
  ** key products use its codes), the one activation per slot is not.
  ** Forward, fused inference and moe8_layer_experts (given ids: -1
  ** skipped); the backward, the trainer and expert parallelism are
  ** refused by name; no selection bias, groups, router bias, expert
  ** biases, zero_experts, hash routing, scored_shared, weight_input,
  ** capacity, aux loss, latent experts, Gemma-4's norms or MXFP4 with
  ** it. */
  bool            product_keys;
  /* NLLB-MoE's capacity (its Top2Router in eval mode): with
  ** capacity_ranked the capacity C is ceil(capacity_fraction · T) when
  ** capacity_fraction > 0 (moe_eval_capacity_token_fraction), else
  ** expert_capacity, over all T rows of the forward (one group: seq_len is
  ** not read); the slots are queued by rank, every token's slot 0 in token
  ** order, then every token's slot 1, ..., and a slot whose expert already
  ** has C slots queued before it (dropped ones counted) gets id -1 and
  ** weight 0.  After the drop a token's kept weights are divided by
  ** max(their sum, FLT_EPSILON), then times routed_scaling_factor (NLLB's
  ** 1 - moe_token_dropout; the router itself does not scale them).  No
  ** norm_topk_prob with it; otherwise as expert_capacity (forward and
  ** fused; backward, trainer and expert parallelism refused by name). */
  double          capacity_fraction;
  bool            capacity_ranked;
} moe8_layer_config;

typedef enum moe8_weight_id {
  MOE8_W_ROUTER = 0,  /* [D, E] (E + zero_experts + skip_experts columns with them; [R, ..] with router_mlp) */
  MOE8_W_GATE,        /* [E, D, F] */
  MOE8_W_UP,          /* [E, D, F] */
  MOE8_W_DOWN,        /* [E, F, D] */
  MOE8_W_BIAS,        /* [E]       (E + zero_experts + skip_experts) */
  MOE8_W_SHARED_GATE, /* [D, Fs]   shared expert (when shared_ffn > 0) */
  MOE8_W_SHARED_UP,   /* [D, Fs]   */
  MOE8_W_SHARED_DOWN, /* [Fs, D]   */
  MOE8_W_SHARED_GATE_W, /* [D]     the shared expert's sigmoid gate (shared_gate) */
  MOE8_W_ROUTER_BIAS, /* [E]       router_bias (E + zero_experts + skip_experts) */
  MOE8_W_GU_BIAS,     /* [E, 2F]   expert_bias: gate columns, then up (ungated experts: [E, F], up's) */
  MOE8_W_DOWN_BIAS,   /* [E, D]    expert_bias */
  MOE8_W_OUT_BIAS,    /* [D]       out_bias */
  MOE8_W_ROUTER_SCALE, /* [D]      router_norm's s */
  MOE8_W_EXPERT_SCALE, /* [E]      expert_scale's c */
  MOE8_W_IN_NORM,     /* [D]       in_norm's weight */
  MOE8_W_OUT_NORM,    /* [D]       out_norm's weight */
  MOE8_W_LATENT_IN,   /* [D, latent]  latent: x · P, the routed experts' input */
  MOE8_W_LATENT_OUT,  /* [latent, D]  latent: c · Q, their weighted sum back to D */
  MOE8_W_LATENT_NORM, /* [latent]     latent_norm's weight (multiplying) */
  MOE8_W_EXPERT_OUT_NORM, /* [latent or D] expert_out_norm's scale */
  MOE8_W_ROUTER_DOWN,       /* [D, R]  router_mlp: A, the router state's projection */
  MOE8_W_ROUTER_DOWN_BIAS,  /* [R]     its bias a */
  MOE8_W_ROUTER_STATE_SCALE, /* [R]    router_state: c, the previous layer's state's scale */
  MOE8_W_ROUTER_MLP_NORM,   /* [R]     the router's RMSNorm weight g */
  MOE8_W_ROUTER_FC1,        /* [R, R]  B1 */
  MOE8_W_ROUTER_FC1_BIAS,   /* [R]     b1 */
  MOE8_W_ROUTER_FC2,        /* [R, R]  B2 */
  MOE8_W_ROUTER_FC2_BIAS,   /* [R]     b2 */
  MOE8_W_COUNT
} moe8_weight_id;

typedef struct moe8_layer moe8_layer;

/* rules may be NULL (no quantization); module_path selects the rule (the
** first match of moe8_rules_match), e.g. "model.layers.0.mlp.experts". */
MOE8_API moe8_status moe8_layer_create(const moe8_layer_config *cfg, const moe8_rules *rules, const char *module_path,
                              moe8_layer **out);
MOE8_API void        moe8_layer_destroy(moe8_layer *layer);

/* The writable f32 master weight and its element count; NULL for an
** unknown id (or the bias when the layer has none).  Taking it marks the
** layer unprepared (the caller may change the weights). */
MOE8_API float      *moe8_layer_weight(moe8_layer *layer, moe8_weight_id id, size_t *count);
/* The same, read-only: the layer stays prepared. */
MOE8_API const float *moe8_layer_weight_read(const moe8_layer *layer, moe8_weight_id id, size_t *count);

/* Says that the caller changed the masters through a pointer it took
** earlier (an optimizer writing in place): the next forward re-quantizes
** them.  moe8_layer_weight calls it; so do the loads and
** moe8_layer_init_random.  Threads: a layer may be shared by threads that
** run forwards and backwards at once, each with its own workspace; the
** weights are quantized once per change, under the layer's write lock, never
** while a forward reads them.  Changing the masters (this call, or writing
** them) while another thread runs a forward is the caller's data race. */
MOE8_API void moe8_layer_weights_changed(moe8_layer *layer);

/* Fills the weights from a seeded generator (N(0, 1/fan_in)). */
MOE8_API moe8_status moe8_layer_init_random(moe8_layer *layer, uint64_t seed);

/* Seed A at one process: quantize the activations before the token sort
** (true) or after it (false).  Defaults to the rule set's
** quantize_before_ep_all_gather.  The output is bitwise the same. */
MOE8_API void        moe8_layer_set_quantize_before_sort(moe8_layer *layer, bool before);

/* Outputs are checked: a NaN or inf in out is MOE8_ERR_NONFINITE naming the
** layer, the token and the column.  allow = true returns such outputs
** instead (the caller asked for them). */
MOE8_API void moe8_layer_set_allow_nonfinite(moe8_layer *layer, bool allow);

/* The layer's experts on tokens the caller routed: the expert op of a
** serving stack (docs/integration.md).  topk_ids [T, top_k] int32 and
** topk_weights [T, top_k] f32, as the caller's router produced them; an id
** < 0 is skipped (its slot adds nothing), an id in [E, E + zero_experts)
** is an identity expert (its slot adds w · x), a larger one is an error; the
** weights are used as given (no renormalization, no scaling).  Then
** dispatch, the expert matmuls (prepared/packed weights when the layer is
** prepared), combine and the shared expert, exactly as moe8_layer_forward
** does after its own routing: the same bytes given the same ids and
** weights.  Capacity dropping applies; no aux loss; the workspace holds
** no forward for a backward. */
MOE8_API moe8_status moe8_layer_experts(moe8_layer *layer, const float *x, int64_t T, const int32_t *topk_ids,
                                        const float *topk_weights, float *out, void *ws, size_t ws_size);
/* moe8_layer_experts without the layer's shared expert (for a caller that
** runs its own, as transformers' blocks and serving stacks do): the routed
** experts' weighted sum alone, the bytes moe8_layer_experts gives a layer
** that has no shared expert. */
MOE8_API moe8_status moe8_layer_experts_routed(moe8_layer *layer, const float *x, int64_t T, const int32_t *topk_ids,
                                               const float *topk_weights, float *out, void *ws, size_t ws_size);

/* The summation order of the layer's expert matmuls (section 5; default:
** the process setting).  Under expert parallelism every rank's layer must
** sum in the same order (canonical, or native on the same table): a
** mismatch is an error at moe8_ep_create naming both. */
MOE8_API moe8_status moe8_layer_set_order(moe8_layer *layer, moe8_order order);
MOE8_API moe8_order  moe8_layer_order(const moe8_layer *layer); /* the effective one */

/* The rule the layer uses (NULL: none) and a one-line description of what
** is quantized, e.g. "weights f8e4m3 [E,16,1,N], activations f8e4m3 1x128". */
MOE8_API const moe8_rule *moe8_layer_rule(const moe8_layer *layer);
MOE8_API const moe8_layer_config *moe8_layer_get_config(const moe8_layer *layer);
MOE8_API const char      *moe8_layer_describe(const moe8_layer *layer);

MOE8_API size_t      moe8_layer_workspace_size(const moe8_layer *layer, int64_t T);

/* out[T, D] = the layer applied to x[T, D]; *aux_loss (may be NULL) gets
** the auxiliary loss.  Non-finite values in x or the weights are an error
** naming the tensor and the count. */
MOE8_API moe8_status moe8_layer_forward(moe8_layer *layer, const float *x, int64_t T, float *out, float *aux_loss,
                               void *ws, size_t ws_size);

/* Gradients of L = Σ dout ⊙ out + aux_loss at the last forward (same x, T
** and ws).  Each pointer may be NULL to skip that gradient; the others are
** overwritten: dx[T, D], dwr[D, E], dwg[E, D, F], dwu[E, D, F], dwd[E, F, D]
** (an ungated layer's dwg and dwsg, which it has no weight for: zeros).
** Quantizers are straight-through; with the rule's bwd_qtype, dout-like
** operands are quantized per row for the input gradients and per column
** for the weight gradients.  The layer keeps the backward's large scratch
** (about 1.7x its expert weights in f32, plus the routed rows) for the
** next backward, until it is destroyed (docs/layer.md, "Backward"). */
typedef struct moe8_layer_grads {
  float *dx, *dwr, *dwg, *dwu, *dwd;
  /* The shared expert's (when the layer has one): [D, Fs], [D, Fs],
  ** [Fs, D] and the gate [D]. */
  float *dwsg, *dwsu, *dwsd, *dwsgate;
  /* With router_bias / expert_bias: [E], [E, 2F] (gate columns, then up),
  ** [E, D] (NULL: not wanted). */
  float *dwrb, *dwgub, *dwdb;
  /* With out_bias: [D] (NULL: not wanted). */
  float *dwob;
  /* With router_norm, expert_scale, in_norm, out_norm: [D], [E], [D], [D]
  ** (NULL: not wanted). */
  float *dwrs, *dwes, *dwin, *dwon;
  /* With latent: P [D, latent], Q [latent, D], and with latent_norm its
  ** weight [latent]; with expert_out_norm its scale [latent, or D] (NULL:
  ** not wanted). */
  float *dwli, *dwlo, *dwln, *dweon;
} moe8_layer_grads;

MOE8_API moe8_status moe8_layer_backward(moe8_layer *layer, const float *x, int64_t T, const float *dout, void *ws,
                                size_t ws_size, const moe8_layer_grads *grads);

/* Inference (docs/layer.md, seed B): quantize [Wg|Wu] ([E, D, 2F]) and Wd once
** per the rule to [E, ceil(K/tile), 1, N] scales (one block when the rule
** has no tile size) and keep them.  A rule with no weight_qtype, or a
** weight type moe8 does not pre-quantize (f8e5m2), leaves the weights as
** they are; the latter with a notice in moe8_layer_describe().  Call again
** after changing the weights. */
MOE8_API moe8_status moe8_layer_prepare(moe8_layer *layer);

/* The forward over the prepared weights: route, dispatch, gmm, SwiGLU, gmm,
** combine, with no allocation and no re-quantization.  Bitwise equal to
** moe8_layer_forward on the same weights. */
MOE8_API moe8_status moe8_layer_forward_fused(moe8_layer *layer, const float *x, int64_t T, float *out, void *ws,
                                     size_t ws_size);

/* Hash routing (moe8_layer_config.hash_routing).  The table: tid2eid
** [vocab, top_k] int32, every entry an expert id in [0, E) (else
** MOE8_ERR_INVALID_ARG naming the element), copied into the layer; set it
** before the first forward (a hash layer without one is refused by name).
** The forwards with the token ids of x's rows, token_ids [T] int32 in
** [0, vocab) (an id outside is refused, naming the token): the same as
** moe8_layer_forward / moe8_layer_forward_fused otherwise, and for a
** layer without hash routing the ids are not read (they may be NULL). */
MOE8_API moe8_status moe8_layer_set_hash_table(moe8_layer *layer, const int32_t *tid2eid, int64_t vocab);
/* The layer's table and its rows (NULL, 0 when it has none). */
MOE8_API const int32_t *moe8_layer_hash_table(const moe8_layer *layer, int64_t *vocab);
MOE8_API moe8_status moe8_layer_forward_tokens(moe8_layer *layer, const float *x, int64_t T, const int32_t *token_ids, float *out,
                                               float *aux_loss, void *ws, size_t ws_size);
MOE8_API moe8_status moe8_layer_forward_fused_tokens(moe8_layer *layer, const float *x, int64_t T, const int32_t *token_ids, float *out,
                                                     void *ws, size_t ws_size);

/* The forwards of a layer with expert_capacity, x's T rows being
** sequences of seq_len consecutive tokens (T a multiple of it; 0: one
** sequence of T): the same as moe8_layer_forward_tokens /
** moe8_layer_forward_fused_tokens otherwise; for a layer without
** expert_capacity seq_len is not read. */
MOE8_API moe8_status moe8_layer_forward_seq(moe8_layer *layer, const float *x, int64_t T, const int32_t *token_ids, int64_t seq_len,
                                            float *out, float *aux_loss, void *ws, size_t ws_size);
MOE8_API moe8_status moe8_layer_forward_fused_seq(moe8_layer *layer, const float *x, int64_t T, const int32_t *token_ids, int64_t seq_len,
                                                  float *out, void *ws, size_t ws_size);

/* The forwards of a layer with Zaya's MLP router (router_mlp), which
** carries a router state from each layer to the next.  router_state_in
** [T, R] is the previous layer's state (what its forward wrote to
** router_state_out, row for row): required by a layer with router_state
** (NULL is refused, naming the layer: there is no silent zero state) and
** refused by any other layer (Zaya's first layer reads x alone).
** router_state_out [T, R] (NULL: not wanted) gets this layer's state s
** (moe8_layer_config.router_mlp), written once the forward has succeeded;
** it may be router_state_in (updated in place) but must not overlap x or
** out.  Otherwise these are moe8_layer_forward and moe8_layer_forward_fused
** (which refuse a layer with router_state by name).  R is the layer's
** router_mlp. */
MOE8_API moe8_status moe8_layer_forward_state(moe8_layer *layer, const float *x, int64_t T, const float *router_state_in,
                                              float *router_state_out, float *out, float *aux_loss, void *ws, size_t ws_size);
MOE8_API moe8_status moe8_layer_forward_fused_state(moe8_layer *layer, const float *x, int64_t T, const float *router_state_in,
                                                    float *router_state_out, float *out, void *ws, size_t ws_size);

/* The prepared expert weights as the kernels consume them: gate|up fused
** [E, D, 2F] (an ungated layer's up [E, D, F]) and down [E, F, D], with dtype and scale (NULL when not
** quantized; scale shape [E, nb, 1, N]).  Valid until the next prepare. */
typedef struct moe8_prepared {
  moe8_dtype   dtype;
  int64_t      tile;          /* 0: per-channel                    */
  const void  *w_gate_up;     /* [E, D, 2F]                        */
  const float *s_gate_up;     /* [E, ceil(D/tile) or 1, 1, 2F]     */
  const void  *w_down;        /* [E, F, D]                         */
  const float *s_down;        /* [E, ceil(F/tile) or 1, 1, D]; product_keys: [E, ceil(D/tile) or 1, 1, 1] */
} moe8_prepared;

MOE8_API moe8_status moe8_layer_prepared(const moe8_layer *layer, moe8_prepared *out);

/* Seed B's weight preparation for one expert weight w of shape[ndim]; it
** must be 3-D [E, K, N] (a 2-D weight is MOE8_ERR_SHAPE).  With no rule, no
** weight_qtype, or a weight type that is not pre-quantized (f8e5m2), the
** weight is left as it is: spec->qtype = MOE8_DTYPE_NONE, nothing written,
** and *notice (may be NULL) says why.  Otherwise q gets E·K·N bytes, scale
** gets [E, ceil(K/tile) or 1, 1, N] floats and *spec the spec used. */
MOE8_API moe8_status moe8_expert_weight_quantize(const moe8_rule *rule, const float *w, int ndim, const int64_t *shape,
                                        void *q, float *scale, moe8_quant_spec *spec, const char **notice);

/* ------------------------------------------------------------------------
** 8. Training
**
** A trainer holds Adam's moments for a layer's router, gate, up and down
** weights.  Each step runs forward on x[T, D], takes the loss
**   mean((out - target)²) + aux_loss,
** runs backward (straight-through for quantized rules) and updates the f32
** masters.  The caller's workspace is moe8_layer_workspace_size(T).
*/
typedef struct moe8_trainer moe8_trainer;

MOE8_API moe8_status moe8_trainer_create(moe8_layer *layer, float lr, moe8_trainer **out);
MOE8_API void        moe8_trainer_destroy(moe8_trainer *tr);
/* Changes the learning rate for the next steps (schedules). */
MOE8_API moe8_status moe8_trainer_set_lr(moe8_trainer *tr, float lr);
MOE8_API moe8_status moe8_trainer_step(moe8_trainer *tr, const float *x, const float *target, int64_t T, float *loss,
                              void *ws, size_t ws_size);
/* The same with the token ids of x's rows (a hash-routed layer's step;
** moe8_trainer_step refuses such a layer by name). */
MOE8_API moe8_status moe8_trainer_step_tokens(moe8_trainer *tr, const float *x, const int32_t *token_ids, const float *target, int64_t T,
                                              float *loss, void *ws, size_t ws_size);

/* ------------------------------------------------------------------------
** 9. Files (docs/files.md)
**
** safetensors: read by mmap, every offset, size, dtype and shape checked
** against the file before a tensor is handed out; written to a temporary
** name and renamed.  .npy: v1/v2, little-endian.  Errors name the file,
** the tensor and the byte offset.
*/
typedef enum moe8_file_dtype {
  MOE8_FDT_F32 = 0, MOE8_FDT_F16, MOE8_FDT_BF16, MOE8_FDT_F8_E4M3, MOE8_FDT_F8_E5M2,
  MOE8_FDT_I8, MOE8_FDT_U8, MOE8_FDT_I32, MOE8_FDT_I64, MOE8_FDT_COUNT
} moe8_file_dtype;

#define MOE8_MAX_DIMS 8

typedef struct moe8_tensor_view {
  const char     *name;
  moe8_file_dtype dtype;
  int             ndim;
  int64_t         shape[MOE8_MAX_DIMS];
  const void     *data;      /* inside the mapping: may be unaligned */
  size_t          nbytes;
  size_t          offset;    /* byte offset of the data in the file  */
} moe8_tensor_view;

MOE8_API const char *moe8_file_dtype_name(moe8_file_dtype t);   /* "F32", "BF16", ... */
MOE8_API size_t      moe8_file_dtype_size(moe8_file_dtype t);

typedef struct moe8_st_file moe8_st_file;

/* Maps and validates a whole safetensors file (header capped at 100 MiB). */
MOE8_API moe8_status moe8_st_open(const char *path, moe8_st_file **out);
/* The same validation on bytes in memory (name is used in messages); the
** buffer must outlive the handle. */
MOE8_API moe8_status moe8_st_parse(const void *buf, size_t len, const char *name, moe8_st_file **out);
MOE8_API void        moe8_st_close(moe8_st_file *f);
MOE8_API size_t      moe8_st_count(const moe8_st_file *f);
MOE8_API const moe8_tensor_view *moe8_st_at(const moe8_st_file *f, size_t i);   /* sorted by name */
MOE8_API const moe8_tensor_view *moe8_st_find(const moe8_st_file *f, const char *name);
MOE8_API const char *moe8_st_path(const moe8_st_file *f);

/* Writes tensors (data pointers are the caller's) as one safetensors file
** through moe8_file_write_atomic; on failure nothing is left at path. */
MOE8_API moe8_status moe8_st_write(const char *path, const moe8_tensor_view *tensors, size_t count);

/* Reads a whole .npy (v1/v2, C order, little-endian <f4, <f2, <u2 read as
** bf16, |i1, |u1, <i4, <i8).  *data is malloc'ed (free it). */
MOE8_API moe8_status moe8_npy_read(const char *path, moe8_file_dtype *dtype, int *ndim, int64_t shape[MOE8_MAX_DIMS],
                          void **data);
MOE8_API moe8_status moe8_npy_parse(const void *buf, size_t len, const char *name, moe8_file_dtype *dtype, int *ndim,
                           int64_t shape[MOE8_MAX_DIMS], size_t *data_offset);
/* Writes a v1 .npy (F32 as <f4, BF16 as <u2, F16 as <f2, I8, U8, I32, I64) via a rename. */
MOE8_API moe8_status moe8_npy_write(const char *path, moe8_file_dtype dtype, int ndim, const int64_t *shape, const void *data);

/* Writes the parts, in order, to path.  A regular file (or a new one) is
** written to a temporary file created exclusively, with an unpredictable
** name, in the same directory (mode: the existing file's, else 0666 less
** the umask), flushed to disk and renamed over path; on any failure the
** temporary file is removed and path is untouched.  A symbolic link is
** followed (the file it names is replaced; a dangling link is refused).  A
** character device or a FIFO with a reader is written in place, never
** replaced; a directory, block device, socket or reader-less FIFO is
** refused. */
MOE8_API moe8_status moe8_file_write_atomic(const char *path, const void *const *parts, const size_t *lens, size_t nparts);

/* Any of F32, F16, BF16, F8_E4M3, F8_E5M2, I8, U8 to f32 (exact). */
MOE8_API moe8_status moe8_file_to_f32(float *dst, const void *src, moe8_file_dtype t, size_t count);

/* Hugging Face config.json of an MoE model. */
#define MOE8_MAX_MLP_ONLY 1024
typedef enum moe8_arch {
  MOE8_ARCH_UNKNOWN = 0, MOE8_ARCH_QWEN2_MOE, MOE8_ARCH_QWEN3_MOE, MOE8_ARCH_MIXTRAL, MOE8_ARCH_DEEPSEEK_V3,
  MOE8_ARCH_OLMOE,       /* Qwen3-MoE's block: softmax top-k, optional renormalization */
  MOE8_ARCH_DEEPSEEK_V2, /* softmax top-k (greedy or group_limited_greedy), scaling, ungated shared experts */
  MOE8_ARCH_GPT_OSS,     /* router bias, top-k then softmax, expert biases, clamped SwiGLU, MXFP4 experts */
  MOE8_ARCH_LLAMA4       /* sigmoid of the top-k logits scaling the expert input, ungated shared expert */
} moe8_arch;

typedef struct moe8_hf_config {
  moe8_arch         arch;
  char              model_type[64];
  int64_t           num_layers;
  moe8_layer_config layer;          /* E, top_k, D, F, score, norm, scaling, groups, shared expert */
  bool              fp8;            /* quantization_config quant_method fp8   */
  int64_t           block_n, block_k; /* weight_block_size                    */
  bool              has_bias;       /* DeepSeek e_score_correction_bias       */
  int64_t           moe8_tile;      /* moe8_quantization.tile_size (0: none)  */
  int               moe8_packed;    /* moe8_quantization.packed_layout (0: plain codes) */
  /* Which layers are MoE (the others are dense MLPs): DeepSeek-V3
  ** first_k_dense_replace and moe_layer_freq; Qwen decoder_sparse_step and
  ** mlp_only_layers. */
  int64_t           first_k_dense_replace, moe_layer_freq, decoder_sparse_step;
  bool              first_k_dense_from_default; /* config.json did not set it */
  int64_t           n_mlp_only;
  int64_t           mlp_only_layers[MOE8_MAX_MLP_ONLY];
  bool              mxfp4;          /* MXFP4 experts: quantization_config quant_method mxfp4 (GPT-OSS), or moe8_quantization weight_qtype mxfp4 (moe8 quantize) */
  /* Jamba's placement: MoE where layer % expert_layer_period ==
  ** expert_layer_offset (period 0: not this placement). */
  int64_t           expert_layer_period, expert_layer_offset;
  /* The MoE block's name in a decoder layer and its router's in the
  ** block, as the family's files have them ("feed_forward.",
  ** "router.weight"); empty: the block's own ("mlp." or Mixtral's
  ** "block_sparse_moe.", "gate.weight"). */
  char              block_prefix[24], router_name[24];
  /* The fused experts' names in the block ([E, 2F, D] gate rows first,
  ** [E, D, F]); empty: "experts.gate_up_proj", "experts.down_proj"
  ** (Granite: "input_linear.weight", "output_linear.weight"). */
  char              fused_gu[32], fused_dn[32];
  /* A shared expert held beside the block, in the decoder layer, as one
  ** fused pair (Granite's "shared_mlp.": input_linear.weight [2Fs, D]
  ** gate rows first, output_linear.weight [D, Fs]); empty: in the block,
  ** per projection. */
  char              shared_beside[24];
  /* Mistral's own files (Mistral-Large-4): the layers may lie under
  ** "layers." (no "model." root) and the block's tensors in the decoder
  ** layer itself (layers.L.gate.weight, layers.L.experts.N.w1.weight,
  ** layers.L.shared_experts.*), which the loader takes when the file holds
  ** the router there. */
  bool              mistral_names;
  /* DBRX: the layers under this root when the file holds it
  ** ("transformer.blocks."; empty: none of its own), and its experts
  ** stacked as three 2-D tensors of the block, experts.mlp.w1 (gate) and
  ** experts.mlp.v1 (up) [E·F, D] (out x in per expert) and experts.mlp.w2
  ** [E·F, D] (x·W per expert: h · w2_e). */
  char              layers_root[24];
  bool              stacked_experts;
  /* Step-3.5/3.7: the experts' limits per layer (swiglu_limits,
  ** swiglu_limits_shared; 0: no clamp), which the loader puts in each
  ** layer's act_limit and shared_act_limit (layer.act is then
  ** MOE8_ACT_SWIGLU_POST); false: layer's limits hold for every layer. */
  bool              per_layer_limits;
  float             act_limits[MOE8_MAX_MLP_ONLY], shared_act_limits[MOE8_MAX_MLP_ONLY];
  /* The family's fused gate|up (fused_gu) holds gate and up rows
  ** alternately (Inkling-2's w13_weight: row 2f gate f, 2f + 1 up f);
  ** transformers' gate_up_proj, when the file has it instead, is halves. */
  bool              fused_interleaved;
  /* DeepSeek-V4: the files may hold the layers at the top ("layers.L.",
  ** no "model." root: its released checkpoints); and the layers whose
  ** mlp_layer_types entry is "hash_moe" route by token id (their
  ** ffn.gate.tid2eid [vocab_size, top_k]; moe8_layer_config.hash_routing
  ** set at load); vocab_size the config's. */
  bool              top_layers;
  bool              hash_moe[MOE8_MAX_MLP_ONLY];
  int64_t           vocab_size;
  /* ERNIE-4.5-VL's text part: the block holds text and vision experts and
  ** moe8 computes the text ones (what transformers runs on text tokens):
  ** the router gate.weight [D, E] (in x out), the selection bias
  ** moe_statics.e_score_correction_bias [2, E] (row 0), experts 0..E-1 of
  ** experts.0..2E-1 (the vision experts, of their own width, not read). */
  bool              text_of_two;
  /* The key that counts a family's first dense layers when mlp_layer_types
  ** is absent (Inkling's dense_mlp_idx), for the dense layer's message. */
  char              dense_key[32];
  /* Gemma-4: the block's tensors are the decoder layer's own
  ** (layers.L.router.proj.weight, layers.L.experts.*, its norms), with
  ** no block prefix. */
  bool              block_in_layer;
  /* The block's output norm's weight when it is not Gemma-4's
  ** post_feedforward_layernorm_2 (A.X-K1's post_mlp_layernorm.weight: in
  ** the block, or beside it in the decoder layer as its files hold it). */
  char              out_norm_name[48];
  /* The router's logits times this (0 means 1; MuSE-Spark's
  ** output_multiplier): the loader multiplies the router's weight by it. */
  float             router_logit_scale;
  /* SwitchTransformers (an encoder-decoder, T5's layout): layers
  ** 0..enc_layers-1 are the encoder's blocks i (encoder.block.i.layer.1.mlp.),
  ** layers enc_layers..num_layers-1 the decoder's blocks i - enc_layers
  ** (decoder.block.i.layer.2.mlp.; its layer.1 is the cross-attention); a
  ** stack's block i is sparse when sparse_step > 0 and (i % sparse_step ==
  ** 1 or sparse_step == 1), sparse_step[0] the encoder's (num_layers //
  ** num_sparse_encoder_layers, or num_layers for 0), [1] the decoder's;
  ** sparse_layers[2] the keys' values (for the dense layers' message).
  ** Its experts experts.expert_N.wi / wo (ungated), its router
  ** router.classifier.weight (and .bias).  encdec false: not this layout. */
  bool              encdec;
  int64_t           enc_layers, sparse_step[2], sparse_layers[2];
  /* NLLB-MoE (with encdec; BART's layout): layers 0..enc_layers-1 are the
  ** encoder's layers i (model.encoder.layers.i.ffn.), the others the
  ** decoder's i - enc_layers (model.decoder.layers.i.ffn.); a stack's
  ** layer i is sparse when sparse_step > 0 and (i + 1) % sparse_step == 0
  ** (sparse_step[0] encoder_sparse_step, [1] decoder_sparse_step).  Its
  ** experts experts.expert_N.fc1 / fc2 with their biases (ungated, biased:
  ** expert_bias), its router router.classifier.weight (and .bias). */
  bool              nllb;
} moe8_hf_config;

/* Parses config.json.  Supported model_type values: "qwen2_moe",
** "qwen3_moe", "mixtral", "deepseek_v3"; each missing key takes the
** default of the family's reference configuration (docs/models.md has the
** table).  Refused, with the key named: another model_type, a hidden_act
** other than silu, DeepSeek's scoring_func other than sigmoid or
** topk_method other than noaux_tc, values of the wrong type, integers
** given as fractions or out of range.  Without model_type the family is
** inferred from the expert-count key and only the keys present are used. */
MOE8_API moe8_status moe8_hf_config_load(const char *path, moe8_hf_config *out);
MOE8_API moe8_status moe8_hf_config_parse(const char *json, size_t len, const char *name, moe8_hf_config *out);
/* The same, reading the file as family model_type (an explicit override
** for a compatible model_type moe8 does not know); NULL: as written. */
MOE8_API moe8_status moe8_hf_config_parse_as(const char *json, size_t len, const char *name, const char *model_type,
                                    moe8_hf_config *out);
MOE8_API const char *moe8_arch_name(moe8_arch a);
/* MOE8_OK when layer L is an MoE layer; else MOE8_ERR_INVALID_ARG with a
** message naming the key that makes it dense (or the layer range). */
MOE8_API moe8_status moe8_hf_config_check_moe_layer(const moe8_hf_config *c, int64_t layer);
/* The first MoE layer, or -1 when there is none. */
MOE8_API int64_t     moe8_hf_config_first_moe_layer(const moe8_hf_config *c);

/* A model directory: config.json and one or more *.safetensors shards. */
typedef struct moe8_model moe8_model;

MOE8_API moe8_status moe8_model_open(const char *dir, moe8_model **out);
/* The same, reading config.json as family model_type (see
** moe8_hf_config_parse_as); NULL: as written. */
MOE8_API moe8_status moe8_model_open_as(const char *dir, const char *model_type, moe8_model **out);
MOE8_API void        moe8_model_close(moe8_model *m);
MOE8_API const moe8_hf_config   *moe8_model_config(const moe8_model *m);
MOE8_API size_t                  moe8_model_tensor_count(const moe8_model *m);
MOE8_API const moe8_tensor_view *moe8_model_tensor_at(const moe8_model *m, size_t i);
MOE8_API const moe8_tensor_view *moe8_model_find(const moe8_model *m, const char *name);
/* The checkpoint's expert-weight format: "f32/bf16/f16 (unquantized)",
** "deepseek f8e4m3 128x128 blocks" or "moe8 f8e4m3 [E,16,1,N]" and so on. */
MOE8_API const char *moe8_model_format(const moe8_model *m, int64_t layer);

/* The tensor-name prefix of layer L's MoE block: "model.layers.L.mlp." or,
** for Mixtral, "model.layers.L.block_sparse_moe.". */
MOE8_API void moe8_model_prefix(const moe8_model *m, int64_t layer, char *buf, size_t cap);

/* A layer from layer L of the model, with the rule that matches
** "<prefix>experts".  f32/bf16/f16 weights are converted to the f32
** masters; DeepSeek FP8 blocks and moe8's [E, nb, 1, N] weights are
** installed as the prepared weights as they are (no re-quantization), and
** the layer is then ready for moe8_layer_forward_fused.  Every tensor's
** presence, dtype and shape is checked against the config. */
MOE8_API moe8_status moe8_model_load_layer(const moe8_model *m, int64_t layer, const moe8_rules *rules, moe8_layer **out);

/* How moe8_model_load_layer_ex builds the layer.
**   TRAINING   f32 masters (quantized checkpoints: their values), for
**              forward/backward/training and moe8_layer_prepare;
**   INFERENCE  no f32 masters: each expert goes from the file to the
**              kernels' layout once (quantized by the rule, or as the
**              checkpoint stores it, never re-quantized through f32;
**              packed where the K blocks allow); moe8-format packed files
**              are used in place (the model's mapping stays alive with the
**              layer, after moe8_model_close too).  The layer is prepared
**              on return; backward and training are refused.
** progress (may be NULL) is called about once a second on long loads with
** the experts done and the total, and once at the end with done = total.
** Options grow at the end: set size to
** sizeof(moe8_load_options). */
typedef enum moe8_load_mode { MOE8_LOAD_TRAINING = 0, MOE8_LOAD_INFERENCE = 1 } moe8_load_mode;
typedef struct moe8_load_options {
  size_t         size;
  moe8_load_mode mode;
  void         (*progress)(void *ctx, int64_t done, int64_t total);
  void          *progress_ctx;
} moe8_load_options;

/* moe8_model_load_layer with options (NULL: training). */
/* rules NULL on an FP8 checkpoint (DeepSeek F8_E4M3 blocks, or moe8's own
** f8e4m3 format): the activations it was made for, f8e4m3 per token and K
** block (DeepSeek's dynamic scheme with its weight block along K; the moe8
** file's recorded tile): the command, the library and Python all compute
** the same bytes.  Other checkpoints: no quantization without rules. */
MOE8_API moe8_status moe8_model_load_layer_ex(const moe8_model *m, int64_t layer, const moe8_rules *rules, const moe8_load_options *opt,
                                     moe8_layer **out);

/* Pre-quantizes the expert weights of a model directory into out_dir, once
** (what `moe8 quantize` runs): each MoE layer whose "<prefix>experts"
** module path matches a rule with weight_qtype f8e4m3 or int8 (f8e5m2 is
** left unquantized, with a progress notice); every other tensor is copied.
**   MOE8_QFORMAT_MOE8      gate|up [E, D, 2F] and down [E, F, D] codes (the
**                          kernels' packed layout where the K blocks allow)
**                          with [E, nb, 1, N] f32 scales (docs/files.md);
**   MOE8_QFORMAT_DEEPSEEK  DeepSeek-V3 FP8: F8_E4M3 .weight and F32
**                          .weight_scale_inv per 128×128 block.
** Everything is checked before anything is written; the new model is
** written whole beside out_dir and swapped in, so a failure leaves out_dir
** as it was.  out_dir may not be in_dir; a model already in out_dir is
** replaced only with force.  progress (may be NULL) gets one line per
** tensor or layer and a summary.  options NULL: moe8 format, no force. */
typedef enum moe8_qformat { MOE8_QFORMAT_MOE8 = 0, MOE8_QFORMAT_DEEPSEEK = 1 } moe8_qformat;
typedef struct moe8_quantize_options {
  size_t       struct_size;   /* sizeof(moe8_quantize_options) */
  moe8_qformat format;
  bool         force;
  void       (*progress)(void *ctx, const char *line);
  void        *progress_ctx;
} moe8_quantize_options;
MOE8_API moe8_status moe8_model_quantize(const char *in_dir, const char *out_dir, const moe8_rules *rules,
                                         const moe8_quantize_options *options);

/* An inference layer from weights in memory: what moe8_model_load's
** inference mode builds from a checkpoint, with the caller as the file
** (a PyTorch module, a serving stack's own loader).  The experts come one
** at a time in f32 and are kept only as the rule makes them (FP8 or int8
** codes and scales, packed; MXFP4 under weight_qtype mxfp4; f32 without a
** weight rule), so no f32 copy of all the experts is ever held:
**   moe8_layer_create_inference(cfg, rules, module_path, &L);
**   the router, its biases and the shared gate through moe8_layer_weight;
**   moe8_layer_put_expert(L, 0, e, gate_up, down) for every e < E, and
**   (with shared_ffn > 0) moe8_layer_put_expert(L, 1, 0, ...) for the
**   shared expert;
**   moe8_layer_finish_load(L): refused while an expert is missing.
** gate_up is [D, 2F] (x · W layout: the gate's F columns, then the up's;
** an ungated layer's: the up [D, F] alone),
** down [F, D] (shared: F = shared_ffn); non-finite values are refused,
** naming the expert.  The layer then runs moe8_layer_forward_fused and
** moe8_layer_experts (no backward; moe8_layer_init_random refused), with
** the same bytes as a training layer given the same weights and prepared. */
MOE8_API moe8_status moe8_layer_create_inference(const moe8_layer_config *cfg, const moe8_rules *rules, const char *module_path,
                                                 moe8_layer **out);
MOE8_API moe8_status moe8_layer_put_expert(moe8_layer *layer, int set, int64_t e, const float *gate_up, const float *down);
MOE8_API moe8_status moe8_layer_finish_load(moe8_layer *layer);

/* Installs already-quantized expert weights as a layer's prepared weights
** (copied); the masters become their dequantized values. */
MOE8_API moe8_status moe8_layer_load_prepared(moe8_layer *layer, const moe8_prepared *p);

/* ------------------------------------------------------------------------
** 10. Expert parallelism (docs/parallelism.md): a ring of experts over a communicator
**
** P ranks, E divisible by P; rank r owns experts r·E/P .. (r+1)·E/P - 1
** and a shard of the tokens (shards may differ in size, zero included).
** Forward: route the local tokens; quantize them per token first when the
** layer's rule quantizes activations and quantize_before_ep_all_gather is
** set; all-gather the token rows (q + scale rows, or f32 rows) and the
** routing; every rank sorts all assignments the same way, runs its own
** experts' rows, and sends each output row back to its token's owner, which
** sums the slots in order.  Results are bit-identical for every P and to
** the single-process layer.  Every call is collective: all ranks call it,
** and an error on one rank is returned, with its message, on every rank.
*/
typedef struct moe8_comm moe8_comm;

MOE8_API bool        moe8_has_mpi(void);                      /* built with MPI?          */
MOE8_API moe8_status moe8_comm_create_single(moe8_comm **out);
/* mpi_comm points to an MPI_Comm (MPI already initialized); it is
** duplicated.  MOE8_ERR_UNSUPPORTED in a build without MPI. */
MOE8_API moe8_status moe8_comm_create_mpi(const void *mpi_comm, moe8_comm **out);
MOE8_API int         moe8_comm_rank(const moe8_comm *c);
MOE8_API int         moe8_comm_size(const moe8_comm *c);
/* The collective deadline: with MOE8_EP_TIMEOUT=S (seconds) in the
** environment when an MPI communicator is created, a rank that waits more
** than S seconds for another at a collective returns MOE8_ERR_IO naming
** the collective and the ranks that did not arrive; the communicator is
** then broken (true here) and the job should end (MPI_Abort): the missing
** rank can never complete the collective.  Unset or 0: no deadline (the
** library's default; the moe8 command sets 600 s unless told otherwise). */
MOE8_API bool        moe8_comm_broken(const moe8_comm *c);
MOE8_API void        moe8_comm_destroy(moe8_comm *c);

/* What went over the wire in the last forward and backward, as bytes this
** rank received (its own rows included) and seconds spent in the call. */
typedef struct moe8_ep_stats {
  uint64_t tokens_bytes;     double tokens_s;     /* forward all-gather of token rows */
  uint64_t routing_bytes;    double routing_s;    /* forward all-gather of ids/weights/scores */
  uint64_t combine_bytes;    double combine_s;    /* forward all-to-all of expert outputs */
  uint64_t dout_bytes;       double dout_s;       /* backward all-gather of dout rows */
  uint64_t dx_bytes;         double dx_s;         /* backward all-to-all of input gradients */
  uint64_t router_bytes;     double router_s;     /* backward relay + broadcast of dWr */
  uint64_t shared_bytes;     double shared_s;     /* backward all-gather of x for the shared expert */
  /* Bytes this rank sent to and received from the other ranks (its own
  ** rows excluded), every phase of the last forward and backward. */
  uint64_t fwd_sent_bytes, fwd_recv_bytes, bwd_sent_bytes, bwd_recv_bytes;
  /* All-to-all mode: token rows dispatched to / received from other ranks
  ** in the last forward (one row per token and destination rank). */
  uint64_t dispatch_rows_sent, dispatch_rows_recv;
} moe8_ep_stats;

typedef struct moe8_ep moe8_ep;

/* How tokens travel (docs/parallelism.md):
**   RING      every token row is all-gathered to every rank with its
**             routing; each rank sorts all assignments and runs its experts
**             (the seeds' design; bytes independent of the routing);
**   ALLTOALL  each token row goes only to the ranks that hold one of its
**             top-k experts, once per rank (quantized first, with its scale
**             row, when the rule says so), by MPI_Alltoallv; expert outputs
**             come back to the token's owner, which combines them in slot
**             order.  Fewer bytes when k is small against P.
** Both give the single-process bytes for every P.  Options grow at the
** end: set size to sizeof(moe8_ep_options). */
typedef enum moe8_ep_mode { MOE8_EP_RING = 0, MOE8_EP_ALLTOALL = 1 } moe8_ep_mode;
typedef struct moe8_ep_options {
  size_t       size;
  moe8_ep_mode mode;
} moe8_ep_options;

/* Collective.  Checks that every rank has the same config, rule, P and
** weights (a checksum) and that P divides E; otherwise every rank gets the
** same message.  The layer stays the caller's. */
MOE8_API moe8_status moe8_ep_create(moe8_layer *layer, moe8_comm *comm, moe8_ep **out);
/* The same with options (NULL: the ring); every rank must choose the same mode. */
MOE8_API moe8_status moe8_ep_create_ex(moe8_layer *layer, moe8_comm *comm, const moe8_ep_options *opt, moe8_ep **out);
MOE8_API moe8_ep_mode moe8_ep_get_mode(const moe8_ep *ep);
MOE8_API void        moe8_ep_destroy(moe8_ep *ep);

/* out_local[T_local, D] for this rank's tokens; *aux_loss (may be NULL) is
** the aux loss over all tokens. */
MOE8_API moe8_status moe8_ep_forward(moe8_ep *ep, const float *x_local, int64_t T_local, float *out_local, float *aux_loss);
/* The same with this rank's tokens' ids (token_ids_local [T_local]), for a
** hash-routed layer (moe8_layer_config.hash_routing; moe8_ep_forward
** refuses one by name); the backward is moe8_ep_backward's. */
MOE8_API moe8_status moe8_ep_forward_tokens(moe8_ep *ep, const float *x_local, int64_t T_local, const int32_t *token_ids_local,
                                            float *out_local, float *aux_loss);

/* Gradients at the last forward: dx [T_local, D] for this rank's tokens;
** dwr [D, E] on every rank; dwg, dwu, dwd full-size with this rank's
** experts written and the others zero.  Any pointer may be NULL. */
MOE8_API moe8_status moe8_ep_backward(moe8_ep *ep, const float *x_local, int64_t T_local, const float *dout_local,
                             const moe8_layer_grads *grads);

MOE8_API const moe8_ep_stats *moe8_ep_get_stats(const moe8_ep *ep);

#ifdef __cplusplus
}
#endif
#endif /* MOE8_H */
