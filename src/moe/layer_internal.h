/*
** layer_internal.h — the layer object and the phases of its forward and
** backward, shared by the single-process layer (layer.c) and the
** expert-parallel modes (ep/ep_ring.c, ep/ep_a2a.c).  All run exactly these functions on the
** same rows in the same order, which is what makes expert parallelism give
** the single-process bytes.
*/
#ifndef MOE8_LAYER_INTERNAL_H
#define MOE8_LAYER_INTERNAL_H

#include "../core/internal.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>

/* One set of experts as the kernels consume them: the routed experts
** (E of width F) or the shared expert (one of width Fs). */
typedef struct moe8__xset {
  int64_t  E, F;
  int64_t  D;                       /* input and output width: hidden, or the routed experts' latent */
  int64_t  N1;                      /* the first projection's columns: 2F (gate|up), or F (an ungated expert's up) */
  int      wg, wu, wd;              /* master ids of gate, up, down            */
  float   *wgu_f32;                 /* [E, D, 2F] fused unquantized weights    */
  float   *wd_f32;                  /* [E, F, D]: the down master, or owned    */
  bool     own_wd;                  /* wd_f32 is not a master (inference)      */
  uint8_t *wgu_q, *wd_q;            /* quantized values [E, K, N], or NULL when only packed */
  float   *wgu_s, *wd_s;            /* [E, nb, 1, N] scales                    */
  uint8_t *wgu_pk, *wd_pk;          /* codes packed (moe8_gmm_pack_rhs), or NULL */
  /* MXFP4 weights (GPT-OSS's files, moe8's, or quantized at an inference
  ** load) of gate|up and down, an expert every moe8__mx4_bytes(N, K,
  ** mx_cols) code bytes and N · K/32 scale bytes: moe8__mx4_repack's layout
  ** and scales [E, N, K/32] for f32 activations, moe8__mx4_to_cols's under
  ** an int8-activation rule.  NULL otherwise. */
  uint8_t *mx_gu_b, *mx_gu_s, *mx_dn_b, *mx_dn_s;
  int64_t  mx_split;                /* F: gate/up rows alternate (GPT-OSS's files); 0: gate rows, then up */
  bool     mx_cols;                 /* ... in moe8__mx4_to_cols's layout (int8 activations) */
  bool     coded;                   /* codes put by a load since begin_load    */
  bool     pk_borrowed;             /* wgu_pk/wd_pk lie in a file mapping (not freed) */
} moe8__xset;

struct moe8_layer {
  moe8_layer_config cfg;
  moe8_rule         rule;           /* a copy; has_rule says if valid          */
  bool              has_rule;
  char              module_path[256];
  moe8_quant_spec   wspec, aspec;   /* weight / activation specs               */
  bool              wq, aq;         /* weights / activations quantized         */
  bool              wmx;            /* weights quantized to MXFP4 at an inference load (rule "mxfp4") */
  bool              wmx_file;       /* ... the routed ones taken as a moe8 MXFP4 file holds them */
  bool              before_sort;
  bool              prepared;
  /* Loaded for inference: no f32 masters of the expert weights; the
  ** kernels' buffers are filled once at load and never re-quantized. */
  bool              inference;
  bool              from_codes;     /* the load put codes (a quantized file)   */
  bool              allow_nonfinite; /* the caller takes NaN/inf outputs        */
  /* moe8_layer_create_inference until moe8_layer_finish_load: which experts
  ** the caller has given (routed 0..E-1, then the shared one), else NULL. */
  uint8_t          *given;
  /* The summation order of the expert gmms (moe8_layer_set_order): atomic,
  ** because another thread may set it while forwards run; a forward loads it
  ** once at its start (moe8__layer_order_now) and passes that value to every
  ** gmm of the call, so no forward mixes two orders. */
  _Atomic moe8_order order;
  /* Threads (docs/testing.md, "Threads"): forwards and backwards hold lock
  ** for reading; quantizing the masters into the kernels' buffers holds it
  ** for writing, and happens only when gen (bumped whenever the masters
  ** may have changed) differs from qgen - 1. */
  pthread_rwlock_t  lock;
  _Atomic uint64_t  gen;
  /* The backward's large buffers, kept for the next backward (pool.c; a
  ** pointer, so a backward holding the layer const can use it). */
  moe8__pool       *pool;
  uint64_t          qgen;
  char              describe[256];
  /* f32 masters (the expert weights' only in training layers) */
  float *w[MOE8_W_COUNT];
  size_t n[MOE8_W_COUNT];
  int        nsets;                 /* 1, or 2 with a shared expert            */
  moe8__xset xs[2];
  /* The owner of packed codes borrowed from a file mapping (a set's
  ** pk_borrowed): released at destroy. */
  void      *keep;
  void     (*release)(void *keep);
  /* Hash routing (cfg.hash_routing): the table [hash_vocab, top_k], or NULL */
  int32_t   *tid2eid;
  int64_t    hash_vocab;
};

/* ---- small helpers of layer.c and phases.c ---------------------------------- */
/* The router's experts: the routed ones, LongCat-Flash's identity
** experts after them (moe8_layer_config.zero_experts) and Zaya's skip
** experts (skip_experts; never both); a product-key layer's router has
** 2N columns, its two halves of N keys. */
static inline int64_t moe8__pk_keys(int64_t E) {
  int64_t n = (int64_t)sqrt((double)E);
  while (n * n > E) n--;
  while ((n + 1) * (n + 1) <= E) n++;
  return n;
}
static inline int64_t moe8__router_width(const moe8_layer *L) {
  return L->cfg.product_keys ? 2 * moe8__pk_keys(L->cfg.num_experts) : L->cfg.num_experts + L->cfg.zero_experts + L->cfg.skip_experts;
}
static inline size_t moe8__al64(size_t n) { return (n + 63) & ~(size_t)63; }
static inline int64_t moe8__nblocks(int64_t K, int64_t tile) { return tile > 0 ? moe8__cdiv(K, tile) : 1; }
/* MXFP4 experts take f32 activations, or int8 ones per row or per 1 x tile
** with the tile a multiple of 32 (moe8__ktable.mx4_rows_i8). */
static inline bool moe8__mx4_acts_ok(const moe8_layer *L) {
  return !L->aq || (L->aspec.qtype == MOE8_DTYPE_I8 && L->aspec.tile % 32 == 0);
}
size_t moe8__count_nonfinite(const float *x, size_t n);
size_t moe8__count_nonfinite_par(const float *x, size_t n);
/* Activation and weight types that a quantized gmm kernel takes together. */
static inline bool moe8__kernel_pair(moe8_dtype a, moe8_dtype w) {
  const bool a8 = a == MOE8_DTYPE_F8E4M3 || a == MOE8_DTYPE_F8E5M2;
  const bool w8 = w == MOE8_DTYPE_F8E4M3 || w == MOE8_DTYPE_F8E5M2;
  return (a8 && w8) || (a == MOE8_DTYPE_I8 && w == MOE8_DTYPE_I8);
}

/* Per-token buffers of the shared expert for T tokens. */
typedef struct moe8__shared_buf {
  float   *x;      /* [T, D] copy of the input (the gmm may dequantize in place) */
  float   *gu, *h; /* [T, 2Fs], [T, Fs]                                        */
  uint8_t *hq;     /* [T, Fs] when activations are quantized                   */
  float   *sh;     /* h's scales                                               */
  float   *y;      /* [T, D] the shared expert's output                        */
  float   *g;      /* [T] gate values (shared_gate)                            */
} moe8__shared_buf;

/* Bytes of the buffers for T tokens (64-byte aligned pieces); carve them
** from base (64-byte aligned). */
size_t moe8__shared_buf_size(const moe8_layer *L, int64_t T);
void   moe8__shared_buf_carve(const moe8_layer *L, int64_t T, void *base, moe8__shared_buf *b);

/* The shared expert on T tokens x (and, when the rule quantizes
** activations, their per-token quantization xq/sx): fills b->y and b->g. */
/* The router configuration of the layer (the single process and both
** expert-parallel modes route with it). */
moe8_router_config moe8__router_config(const moe8_layer *L, const int32_t *token_ids);
/* A hash-routed layer's forward needs its table and T token ids in
** [0, vocab): MOE8_ERR_INVALID_ARG naming what is missing, or the token;
** MOE8_OK for any other layer (token_ids not read). */
moe8_status moe8__check_tokens(const moe8_layer *L, const int32_t *token_ids, int64_t T, const char *what);
/* logits[T, E] = x · Wr (+ the router bias when the layer has one). */
moe8_status moe8__router_logits(const moe8_layer *L, const float *x, int64_t T, float *logits);
/* Zaya's MLP router (moe8_layer_config.router_mlp = R): s[T, R] = x · A +
** a (+ p ⊙ c when p, the previous layer's state, is given), the state;
** then the logits[T, E + S] of its RMSNorm, two Linear + GELU and the
** output projection (u, v [T, R] are scratch). */
moe8_status moe8__router_mlp(const moe8_layer *L, const float *x, int64_t T, const float *p, float *s, float *u, float *v,
                             float *logits);
/* Skip experts (skip_experts): a slot whose id is one of the router's
** last skip_experts classes gets id -1 and weight 0 (no row, nothing
** added). */
void moe8__skip_slots(const moe8_layer *L, int64_t T, int32_t *ids, float *w);
/* MOE8_ERR_UNSUPPORTED naming the form when the layer's experts have a
** form with no backward (the input scaling by renormalized weights);
** `what` leads. */
moe8_status moe8__check_backward_form(const moe8_layer *L, const char *what);

moe8_status moe8__shared_forward(const moe8_layer *L, moe8_order order, const float *x, const uint8_t *xq, const float *sx,
                                 int64_t T, moe8__shared_buf *b, void *scratch, size_t scratch_bytes);
/* out[t] = out[t] + g_t · y[t] (or + y[t] without a gate). */
void moe8__shared_add(const moe8_layer *L, int64_t T, const moe8__shared_buf *b, float *out);
void moe8__out_bias_add(const moe8_layer *L, int64_t T, float *out);
void moe8__out_bias_grad(const moe8_layer *L, const float *dout, int64_t T, float *acc);
/* Its backward from dout [T, D]: dx (may be NULL) += the shared expert's
** part (the MLP's, then the gate's), and the grads' shared fields. */
moe8_status moe8__shared_backward(const moe8_layer *L, const float *x, const uint8_t *xq, const float *sx, int64_t T,
                                  const float *dout, moe8__shared_buf *b, float *dx, const moe8_layer_grads *gr);

/* Loading (io/model.c): begin with the file's weight dtype and K tile
** (MOE8_DTYPE_NONE: unquantized f32 values), put every expert of every
** set (gate|up [D, 2F] and down [F, D], as f32 or as codes with their
** [nb, 1, N] scales), end. */
moe8_status moe8__layer_begin_load(moe8_layer *L, moe8_dtype file_qt, int64_t tile);
moe8_status moe8__layer_put_expert(moe8_layer *L, int set, int64_t e, const float *gu, const float *dn, const uint8_t *gq,
                                   const float *gs, const uint8_t *dq, const float *ds);
/* Packed codes of set s as they are in a mapping that outlives the layer
** through keep/release (inference layers only). */
moe8_status moe8__layer_put_packed(moe8_layer *L, int set, const uint8_t *gu_pk, const float *gs, const uint8_t *dn_pk,
                                   const float *ds);
moe8_status moe8__layer_end_load(moe8_layer *L);
/* An inference layer without weight or activation rules takes its routed
** experts as MXFP4 bytes (ownership of the four buffers passes, also on
** failure), then ends the load (prepared). */
moe8_status moe8__layer_load_mx4(moe8_layer *L, uint8_t *gu_b, uint8_t *gu_s, uint8_t *dn_b, uint8_t *dn_s);
/* An inference layer under weight_qtype mxfp4, between begin_load and
** end_load, takes its routed experts' MXFP4 bytes as they are (the
** kernels' layout, gate rows then up rows: moe8's own files); ownership of
** the four buffers passes, also on failure. */
moe8_status moe8__layer_put_mx4(moe8_layer *L, uint8_t *gu_b, uint8_t *gu_s, uint8_t *dn_b, uint8_t *dn_s);
/* Before begin_load, for moe8's MXFP4 file: an inference layer whose rule
** names no weight format (f32 or int8 activations) keeps the file's MXFP4,
** as the rule the file was written under would; returns whether it does. */
bool moe8__layer_keep_mx4(moe8_layer *L);
/* The layer's order setting as one atomic load: a forward takes it once at
** its start and hands that value to every expert matmul of the call
** (moe8_layer_set_order may run on another thread meanwhile). */
static inline moe8_order moe8__layer_order_now(const moe8_layer *L) {
  return atomic_load_explicit(&L->order, memory_order_relaxed);
}
/* A layer without f32 expert masters (inference). */
moe8_status moe8__layer_create(const moe8_layer_config *cfg, const moe8_rules *rules, const char *module_path, bool inference,
                               moe8_layer **out);
/* Whether set s's weights can be held packed (the K blocks whole pairs or quads). */
bool moe8__layer_packable(const moe8_layer *L, int set);

/* Expert part of the forward of set (0 routed, 1 shared) for the G groups
** starting at expert g0, whose
** rows (gsz[G] of them, consecutive) are the inputs xs (f32) and, when the
** rule quantizes activations, xsq/sxs.  Writes gu [rows, 2F], h [rows, F],
** hq/sh (quantized h) and y [rows, D]. */
/* The activation of expert set `set` (0 routed, 1 shared). */
static inline moe8_expert_act moe8__set_act(const moe8_layer *L, int set) {
  return set && (L->cfg.shared_plain_act || L->cfg.product_keys) ? MOE8_ACT_SWIGLU : L->cfg.act; /* Doge's dense MLP: SwiGLU */
}

/* An activation of gate and up (the SwiGLUs), or of up alone (the
** ungated experts: relu2, relu). */
static inline bool moe8__act_gated(moe8_expert_act a) { return a != MOE8_ACT_RELU2 && a != MOE8_ACT_RELU && a != MOE8_ACT_SILU; }

/* The down projection's quantization shape, K (its scales' blocks) by N
** (their columns): [F, D]; a product-key layer's routed value table
** [E, D] is quantized per expert row as its key table is, [D, 1] (its
** K = 1 would give every value a scale of its own).  The codes' layout
** is the same [E, D] either way. */
static inline void moe8__down_kn(const moe8_layer *L, int set, int64_t *K, int64_t *N) {
  const bool pk = set == 0 && L->cfg.product_keys;
  *K = pk ? L->xs[0].D : L->xs[set].F;
  *N = pk ? 1 : L->xs[set].D;
}

/* MOE8_ACT_SWIGLU_POST's limit for expert set `set`: the set's own, +inf
** where it is 0 (no clamp). */
static inline float moe8__set_post_limit(const moe8_layer *L, int set) {
  const float l = set ? L->cfg.shared_act_limit : L->cfg.act_limit;
  return l > 0.0f ? l : INFINITY;
}

moe8_status moe8__experts_forward(const moe8_layer *L, moe8_order order, int set, int64_t rows, const int32_t *gsz, int64_t g0,
                                  int64_t G, float *xs, const uint8_t *xsq, const float *sxs, float *gu, float *h, uint8_t *hq,
                                  float *sh, float *y, void *scratch, size_t scratch_bytes);

/* The backward's gradients zeroed (those gr asks for and the layer has):
** dx [T, D], the experts', the router's, the shared expert's, the biases'. */
void moe8__zero_grads(const moe8_layer *L, int64_t T, const moe8_layer_grads *gr);
/* dx [T, D] += dl [T, E] · Wr^T, the router's part of the input gradient. */
moe8_status moe8__router_dx(const moe8_layer *L, const float *dl, int64_t T, float *dx);

/* Llama-4's expert input (weight_input), the same in the layer and both
** expert-parallel modes: row p (token tok[p], slot slot[p]) times its
** slot's routing weight w[tok·K + slot]. */
void moe8__scale_rows(float *xs, int64_t rows, int64_t D, const int32_t *tok, const int32_t *slot, const float *w, int64_t K);

/* Llama-4's backward on a token's owner: rows[pos[t·K + j]] is the
** gradient of slot j's expert input (pos -1: dropped).  dx[t] (dx may be
** NULL) = Σ_j s_j · row_j in slot order from zero, s_j = scores[t·E +
** ids[t·K + j]] · c; dw[t·K + j] = row_j · x[t] in increasing d (0 when
** dropped), the routing weight's gradient for the router backward. */
void moe8__input_weight_backward(int64_t T, int64_t K, int64_t D, int64_t E, const int32_t *pos, const float *rows, const float *x,
                                 const float *scores, const int32_t *ids, float c, float *dx, float *dw);

/* dy[p] = w[t,j] · dout[t] and dwrow[p] = dout[t] · y[p] for rows p, with
** t = token_of[p] and j = slot_of[p] (w indexed t·K + j, dout by t; w
** NULL: every weight 1, Llama-4's unweighted sum). */
void moe8__dy_dw(int64_t rows, const int32_t *token_of, const int32_t *slot_of, const float *w, int64_t K,
                 const float *dout, const float *y, int64_t D, float *dy, float *dwrow);

/* Expert part of the backward for groups [g0, g0 + G): from dy [rows, D]
** and the saved xsq/sxs or xs, hq/sh or h, gu, writes dxs [rows, D] and
** the groups' slices of dwg, dwu, dwd (full-size arrays; may be NULL), and
** adds the expert biases' gradients to dbgu [E, 2F] and dbd [E, D] (NULL:
** none). */
moe8_status moe8__experts_backward(const moe8_layer *L, int set, int64_t rows, const int32_t *gsz, int64_t g0, int64_t G, float *dy,
                                   const float *xs, const uint8_t *xsq, const float *sxs, const float *h, const uint8_t *hq,
                                   const float *sh, const float *gu, float *dxs, float *dwg, float *dwu, float *dwd,
                                   float *dbgu, float *dbd);

/* The aux loss from all T tokens' ids [T·K] and scores [T, E]; f[E] gets
** the fractions f_e (for the backward).  Sums run in token order. */
float moe8__aux_loss(const moe8_layer *L, int64_t T, const int32_t *ids, const float *scores, double *f);

/* d logits [T, E] of the local tokens from dw [T·K] (d loss / d weight),
** their scores and ids, and the aux term α·E·f_e / T_total. */
void moe8__router_backward(const moe8_layer *L, int64_t T, const float *scores, const int32_t *ids, const float *dw,
                           const double *f, int64_t T_total, float *dl);

/* acc[D, E] += Σ_t x[t]ᵀ · dl[t], each element one chain in t order, so a
** relay over token shards in order gives the single-process bytes. */
void moe8__router_wgrad(float *acc, const float *x, const float *dl, int64_t T, int64_t D, int64_t E);

/* Gemma-4's norms (router_norm, in_norm, out_norm): out = ((x · r) ⊙ w) · c
** per row, and the backward adding to dx and dw (either may be NULL). */
void moe8__rms_norm_rows(const float *x, int64_t T, int64_t D, float eps, const float *w, float c, float *out);
moe8_status moe8__rms_norm_backward(const float *x, int64_t T, int64_t D, float eps, const float *w, float c, const float *dy,
                                    float *dx, float *dw);

/* Latent experts (moe8_layer_config.latent): z[T, latent] = x · P, then
** n(z) ⊙ v with latent_norm; and out[T, D] = c · Q. */
moe8_status moe8__latent_in(const moe8_layer *L, const float *x, int64_t T, float *z);
moe8_status moe8__latent_out(const moe8_layer *L, const float *c, int64_t T, float *out);
/* Their backward: dc[T, latent] = dout · Qᵀ and dq [latent, D] += cᵀ ·
** dout (dq may be NULL); from dz [T, latent], the gradient at the
** experts' input, dx [T, D] += (through latent_norm, its weight's gradient
** into gr->dwln) dz0 · Pᵀ and gr->dwli += xᵀ · dz0 (each may be NULL). */
void moe8__latent_out_backward(const moe8_layer *L, const float *dout, const float *c, int64_t T, float *dc, float *dq);
moe8_status moe8__latent_in_backward(const moe8_layer *L, const float *x, int64_t T, const float *dz, float *dx, const moe8_layer_grads *gr);
/* The routed experts' width: latent, or hidden. */
static inline int64_t moe8__routed_width(const moe8_layer *L) { return L->cfg.latent > 0 ? L->cfg.latent : L->cfg.hidden; }
/* MuSE-Spark's per-expert output norm on rows y[rows, D] in place: u = y ⊙
** s, y = u · (mean(u²) + eps)^(-1/2). */
void moe8__expert_out_norm_rows(float *y, int64_t rows, int64_t D, float eps, const float *s);
/* Its backward: o the rows before the norm, y after; dy in place from the
** gradient at y to the gradient at o; ds += the scale's gradient (NULL:
** not wanted). */
moe8_status moe8__expert_out_norm_backward(const float *o, const float *y, int64_t rows, int64_t D, float eps, const float *s, float *dy,
                                           float *ds);

/* MOE8_ERR_NONFINITE naming the layer and the first token when out[T, D]
** holds NaN or inf. */
moe8_status moe8__check_output(const moe8_layer *L, const float *out, int64_t T);
moe8_status moe8__finish_output(const moe8_layer *L, int64_t T, const float *y, const int32_t *pos_of, const float *w,
                                const float *idn, const moe8__shared_buf *b, float *out);
/* SwitchTransformers' expert capacity (moe8_layer_config.expert_capacity):
** the T tokens are sequences of seq tokens (0: one of T); in each, in
** token order, a slot whose expert has already been chosen by
** expert_capacity tokens of the sequence gets id -1 and weight 0 (no row,
** nothing added).  T a multiple of seq (the caller checked). */
void moe8__apply_capacity(const moe8_layer *L, int64_t T, int64_t seq, int32_t *ids, float *w);
/* Whether the layer drops slots past a capacity: SwitchTransformers'
** (expert_capacity, per sequence) or NLLB-MoE's (capacity_ranked: by rank
** over all T rows, the kept weights renormalized; moe8__apply_capacity
** applies either). */
static inline bool moe8__capacity_on(const moe8_layer_config *c) { return c->expert_capacity > 0 || c->capacity_ranked; }
/* LongCat-Flash's identity experts (zero_experts): idn[t] = Σ_j w[t·K + j]
** · x[t] over the slots j whose id is >= num_experts, in slot order from
** zero (moe8__finish_output adds idn after the combine, NULL: none). */
void moe8__identity_rows(const moe8_layer *L, const float *x, int64_t T, const int32_t *ids, const float *w, float *idn);
/* Their backward: for each identity slot, dw[t·K + j] = dout[t] · x[t]
** (increasing d) and dx[t] += w · dout[t] (dx may be NULL), slots in
** order. */
void moe8__identity_backward(const moe8_layer *L, const float *x, int64_t T, const int32_t *ids, const float *w, const float *dout,
                             float *dx, float *dw);

/* Product-key experts (moe8_layer_config.product_keys; pkeys.c).
** moe8__pk_route: the ids [T, top_k] and weights of the T tokens from
** their logits [T, 2N] (the flat buffer read as transformers' view(2, T,
** N)); MOE8_ERR_NONFINITE naming the token when a logit is not finite.
** moe8__pk_experts: out[t] = Σ_j (w · act(x_t · k_e)) · v_e over the
** slots in order from zero (ids < 0 skipped; ids must be < E), x as f32
** or, with xq non-NULL (the rule's activation codes of x, scales sx),
** its codes met by the key codes (or fake-quantized when the pair has no
** kernel). */
moe8_status moe8__pk_route(const moe8_layer *L, const float *logits, int64_t T, int32_t *ids, float *w);
moe8_status moe8__pk_experts(const moe8_layer *L, const float *x, const uint8_t *xq, const float *sx, int64_t T, const int32_t *ids,
                             const float *w, float *out);

/* Quantizes the expert weights from the masters (unless prepared). */
moe8_status moe8__layer_quantize_weights(moe8_layer *L);

#endif
