/*
** hfconfig.c — the MoE keys of a Hugging Face config.json, per family
** (docs/models.md).
**
** Families: the rows of k_families (qwen2_moe, qwen3_moe, qwen3_next,
** mixtral, minimax, minimax_m2, deepseek_v2, deepseek_v3 (and kimi_k2,
** deepseek_v32), dots1, olmoe, glm4_moe, gpt_oss, llama4_text, and the
** families that compute one of those blocks under their own keys, as
** data), and the multimodal models of k_wrappers (read from text_config),
** chosen by model_type (or, when it is absent, by which expert-count key is
** present).  Every key moe8 uses takes, when missing or null, the default
** of the family's reference configuration class; a key with the wrong
** type, a fraction where an integer belongs or a value out of range is an
** error naming it.  What moe8 cannot compute exactly (another activation,
** another routing method, static activation scales) is refused by key.
*/
#include "../core/internal.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *moe8_arch_name(moe8_arch a) {
  switch (a) {
    case MOE8_ARCH_QWEN2_MOE: return "qwen2_moe";
    case MOE8_ARCH_QWEN3_MOE: return "qwen3_moe";
    case MOE8_ARCH_MIXTRAL: return "mixtral";
    case MOE8_ARCH_DEEPSEEK_V3: return "deepseek_v3";
    case MOE8_ARCH_OLMOE: return "olmoe";
    case MOE8_ARCH_DEEPSEEK_V2: return "deepseek_v2";
    case MOE8_ARCH_GPT_OSS: return "gpt_oss";
    case MOE8_ARCH_LLAMA4: return "llama4_text";
    default: return "unknown";
  }
}

/* The reference defaults of each family (the configuration classes of the
** Hugging Face implementations). */
typedef struct family {
  const char *name;               /* the model_type                          */
  moe8_arch   arch;               /* the block it computes                   */
  const char *experts_key, *ffn_key, *alias; /* alias: of experts_key, or NULL */
  int64_t     hidden, layers, experts, top_k, ffn, shared; /* experts, top_k 0 and shared -1: no default (required) */
  bool        norm;
  double      scaling;
  int64_t     n_group, topk_group, first_dense; /* the DeepSeek-V3 block's */
  bool        sigmoid_bias;   /* Mixtral's block routed by sigmoid + correction bias (MiniMax-M2) */
  bool        sigmoid;        /* Qwen's blocks routed by sigmoid scores, no bias (Flint) */
  /* A family that computes one of the blocks above under other key names
  ** (docs/models.md, "Adding a family"): each key is "name" or
  ** "name|alias" (an alias the configuration class maps to it; both in the
  ** file and different: refused); NULL is the block's own key; "" means
  ** the class has no such key and the row's value always holds. */
  const char *topk_key;       /* NULL: num_experts_per_tok                              */
  const char *norm_key;       /* NULL: norm_topk_prob; "": always .norm                 */
  const char *scale_key;      /* NULL: routed_scaling_factor                            */
  const char *group_key;      /* NULL: n_group                                          */
  const char *shared_key;     /* the shared experts' count; NULL: n_shared_experts; "": always .shared */
  const char *shared_width_key; /* DeepSeek blocks: the shared width is count x this key's value (default .shared_width), NULL: x the
                                ** experts' width; Qwen2-MoE's: the shared width's key (default .shared), NULL: shared_expert_intermediate_size */
  int64_t     shared_width;
  const char *dense_key;      /* PLACE_FIRST's key: the count of first dense layers */
  bool        shared_ungated; /* Qwen2-MoE's block with its shared expert added in full (no shared_expert_gate) */
  int         place;          /* which layers are MoE: PLACE_*                          */
  const char *block_prefix, *router_name; /* the files' names (moe8_hf_config), NULL: the block's own */
  /* The limited SwiGLU silu(min(g, L)) · clamp(u, ±L) (MOE8_ACT_SWIGLU_LIMIT)
  ** with L = swiglu_limit (default .limit); shared_plain: the shared
  ** experts keep the plain SwiGLU. */
  bool        limited, shared_plain;
  double      limit;
  /* DeepSeek-V3's block routed by softmax scores (Mistral-4, ERNIE-4.5):
  ** the groups' top-2 sums and the top-k on score + bias; no_bias: the
  ** family has no correction bias (Mistral-4) */
  bool        softmax_scores, no_bias;
  /* ERNIE-4.5: the weights divided by max(Σ, moe_norm_min (default .norm_min)) */
  double      norm_min;
  /* the fused experts' and a shared expert beside the block (moe8_hf_config) */
  const char *fused_gu, *fused_dn, *shared_beside;
  /* DeepSeek-V3's block: the boolean key that turns its correction bias on
  ** (default true; LFM2-MoE's use_expert_bias), and the renormalization's
  ** epsilon (w / (Σ + norm_eps): LFM2-MoE's 1e-6) */
  const char *bias_flag;
  double      norm_eps;
  /* A numeric key moe8 computes only at 0 (absent or 0: the class's
  ** default), refused otherwise with .zero_why */
  const char *zero_key, *zero_why;
  /* Kolibri-1: the top-k of logit + the router's correction bias, weighted
  ** by the sigmoid scores */
  bool        select_logits;
  /* Mistral's own tensor names (moe8_hf_config.mistral_names) */
  bool        mistral_names;
  /* JetMoE: the block's output bias (moe8_layer_config.out_bias, the
  ** block's tensor "bias" [D]); act_key: the activation's key (NULL: hidden_act) */
  bool        out_bias;
  const char *act_key;
  /* DBRX: its keys under ffn_config (parse_dbrx), its layers and experts
  ** in its own names (moe8_hf_config.layers_root, stacked_experts) */
  bool        dbrx;
  /* Cohere2-MoE: expert_selection_fn, shared_expert_combination_strategy,
  ** num_shared_experts (shared width count x the experts') */
  bool        cohere;
  /* Step-3.5/3.7 (Step3p7TextConfig): MoE layers by mlp_layer_types, else
  ** moe_layers_enum, else layers 3...; the per-layer limits swiglu_limits
  ** and swiglu_limits_shared of the SwiGLU clamped after the activation;
  ** hidden_act whatever the file says (the class computes silu) */
  bool        step;
  /* Inkling-2: the softcapped SwiGLU (MOE8_ACT_SWIGLU_SOFTCAP) with caps
  ** mlp_gate_softcap (4.0) and mlp_up_softcap (25.0); hidden_act not read
  ** (the class's experts use the softcapped form whatever it says) */
  bool        softcap;
  /* MiniMax-M3 (MiniMaxM3VLTextConfig): GPT-OSS's clamped SwiGLU in halves
  ** layout without biases (swiglu_alpha 1.702, swiglu_limit 7.0), in the
  ** shared expert too; MoE layers by mlp_layer_types, else the moe_layer_freq
  ** list (1: sparse), else all; hidden_act not read (the class computes the
  ** clamped form whatever it says: the released files write swigluoai) */
  bool        m3;
  /* DeepSeek-V4 (DeepseekV4Config): sqrt-softplus scores (scoring_func
  ** sqrtsoftplus, or sigmoid), weights / (Σ + 1e-20) times
  ** routed_scaling_factor, no groups; the limited SwiGLU in the routed and
  ** the shared expert (one, of the experts' width); every layer MoE, the
  ** "hash_moe" ones of mlp_layer_types (default: the first
  ** num_hash_layers, 3) routed by token id (parse_dsv4) */
  bool        dsv4;
  /* AXK2 (AXK2Config): the dropped groups' selection values 0.0, not -inf
  ** (moe8_layer_config.group_mask_zero); n_group and topk_group both null
  ** (no groups, the class's default) or both set */
  bool        group_zero;
  /* ERNIE-4.5-VL's text part (Ernie4_5_VLMoeTextConfig): moe_intermediate_size
  ** is [text, vision] (the text experts' width first); the files' names as
  ** moe8_hf_config.text_of_two says */
  bool        ernie_vl;
  /* Inkling (InklingTextConfig): DeepSeek-V3's sigmoid routing over the
  ** n_routed_experts, and its n_shared_experts shared experts scored by the
  ** same router and weighted with the chosen ones (the layer's last
  ** experts: moe8_layer_config.scored_shared); scaling route_scale times
  ** the layer's gate.global_scale (read at load) */
  bool        inkling;
  /* Aria (AriaTextConfig): moe_num_shared_experts ungated shared experts
  ** of the experts' width (one of count x intermediate_size) */
  bool        aria;
  /* Gemma-4 (Gemma4TextConfig, DiffusionGemmaTextConfig): the routed
  ** branch of its decoder layer with its norms and scales
  ** (moe8_layer_config router_norm, expert_scale, in_norm, out_norm,
  ** rms_eps rms_norm_eps), GeGLU experts (hidden_activation
  ** gelu_pytorch_tanh), the block's tensors the decoder layer's own
  ** (parse_gemma); moe_flag: the boolean key that turns the branch on
  ** (enable_moe_block; NULL: always on) */
  bool        gemma;
  const char *moe_flag;
  /* Nemotron-H (NemotronHConfig): ungated experts (mlp_hidden_act relu2
  ** or relu), a layer MoE where layers_block_type (or the legacy
  ** hybrid_override_pattern) says "moe" ("E"), the layers under
  ** backbone.layers. (parse_nemotron) */
  bool        nemotron;
  /* PhiMoE (PhimoeConfig): the sparsemixer router (parse_phimoe); LongCat-Flash
  ** (LongcatFlashConfig): zero-computation experts (parse_longcat) */
  bool        sparsemixer, longcat;
  /* A.X-K1 (AXK1Config): DeepSeek-V3's block with an RMSNorm on its output
  ** (moe8_layer_config.out_norm, eps rms_norm_eps), its weight
  ** post_mlp_layernorm.weight in the decoder layer */
  bool        axk1;
  /* MuSE-Spark (MuseSparkTextConfig): latent experts (parse_muse) */
  bool        muse;
  /* SwitchTransformers (SwitchTransformersConfig): its own keys and
  ** placement (parse_switch, moe8_hf_config.encdec) */
  bool        switch_t;
  /* Zaya (ZayaConfig): the MLP router with its state and skip expert
  ** (parse_zaya) */
  bool        zaya;
  /* Doge (DogeConfig): product-key single-neuron experts and a dense
  ** SwiGLU (parse_doge, moe8_layer_config.product_keys) */
  bool        doge;
  /* NLLB-MoE (NllbMoeConfig): its keys, capacity and placement (parse_nllb) */
  bool        nllb;
} family;

/* Placement of the MoE layers. */
enum {
  PLACE_BLOCK = 0, /* the block's own keys (Qwen: mlp_only_layers, decoder_sparse_step; DeepSeek: first_k_dense_replace, moe_layer_freq) */
  PLACE_ALL,       /* every layer is MoE (the class has no placement key) */
  PLACE_TYPES,     /* mlp_layer_types ("dense"/"sparse" per layer); without it the first .first_dense layers are dense */
  PLACE_TYPES_FK,  /* mlp_layer_types; without it the list the class builds from first_k_dense_replace (default .first_dense) */
  PLACE_TYPES_FKF, /* the same, the list built from first_k_dense_replace and moe_layer_freq */
  PLACE_TYPES_REQ, /* mlp_layer_types, required (the class has no default) */
  PLACE_TYPES_KEY, /* mlp_layer_types; without it the first .dense_key layers (default .first_dense) are dense */
  PLACE_FIRST,     /* the first .dense_key layers dense (default .first_dense): num_dense_layers */
  PLACE_PERIOD,    /* MoE where layer % expert_layer_period (default 2) == expert_layer_offset (default 1): Jamba */
  PLACE_INTERVAL,  /* MoE where (layer + 1) % moe_layer_interval (1) == 0 and moe_layer_start_index (1) <= layer <=
                   ** moe_layer_end_index (-1: the last): ERNIE-4.5 */
};

static const family k_families[] = {
  {"qwen2_moe", MOE8_ARCH_QWEN2_MOE, "num_experts", "moe_intermediate_size", "num_local_experts", 2048, 24, 60, 4, 1408, 5632, false, 1.0, 0, 0, 0},
  {"qwen3_moe", MOE8_ARCH_QWEN3_MOE, "num_experts", "moe_intermediate_size", "num_local_experts", 2048, 24, 128, 8, 768, 0, false, 1.0, 0, 0, 0},
  {"mixtral", MOE8_ARCH_MIXTRAL, "num_local_experts", "intermediate_size", NULL, 4096, 32, 8, 2, 14336, 0, true, 1.0, 0, 0, 0},
  {"deepseek_v3", MOE8_ARCH_DEEPSEEK_V3, "n_routed_experts", "moe_intermediate_size", NULL, 7168, 61, 256, 8, 2048, 1, true, 2.5, 8, 4, 3},
  /* OlmoeConfig: the experts' width is intermediate_size; num_local_experts is an alias */
  {"olmoe", MOE8_ARCH_OLMOE, "num_experts", "intermediate_size", "num_local_experts", 2048, 16, 64, 8, 2048, 0, false, 1.0, 0, 0, 0},
  /* Glm4MoeConfig (GLM-4.5/4.6): DeepSeek-V3's block (sigmoid, correction
  ** bias, group-limited top-k, shared experts) with its own defaults */
  /* DeepseekV2Config: softmax routing, greedy or group_limited_greedy;
  ** num_experts_per_tok has no default (None: a dense model) */
  {"deepseek_v2", MOE8_ARCH_DEEPSEEK_V2, "n_routed_experts", "moe_intermediate_size", NULL, 4096, 32, 64, 0, 1407, 2, false, 1.0, 0, 0, 0},
  /* Qwen3NextConfig: Qwen2-MoE's block (softmax top-k, sigmoid-gated
  ** shared expert), renormalized by default */
  {"qwen3_next", MOE8_ARCH_QWEN2_MOE, "num_experts", "moe_intermediate_size", "num_local_experts", 2048, 48, 512, 10, 512, 512, true, 1.0,
   0, 0, 0},
  /* GptOssConfig: router with a bias, top-k then softmax over the chosen
  ** logits, expert biases, the clamped SwiGLU (α swiglu_alpha, default
  ** 1.702; limit swiglu_limit, default 7.0); experts of width
  ** intermediate_size */
  {"gpt_oss", MOE8_ARCH_GPT_OSS, "num_local_experts", "intermediate_size", NULL, 2880, 36, 128, 4, 2880, 0, true, 1.0, 0, 0, 0},
  /* Llama4TextConfig: sigmoid of the top-k router logits scaling the
  ** expert input, a shared expert of width intermediate_size */
  {"llama4_text", MOE8_ARCH_LLAMA4, "num_local_experts", "intermediate_size", NULL, 5120, 48, 16, 1, 8192, 1, false, 1.0, 0, 0, 0},
  {"glm4_moe", MOE8_ARCH_DEEPSEEK_V3, "n_routed_experts", "moe_intermediate_size", "num_local_experts", 4096, 46, 128, 8, 1408, 1, true, 1.0,
   1, 1, 1},
  /* Dots1Config (dots.llm1): DeepSeek-V3's block (Dots1MoE is
  ** DeepseekV3MoE) with its own defaults: no renormalization, scaling 1.0,
  ** one group; n_routed_experts, num_experts_per_tok and n_shared_experts
  ** have none (None: the block cannot be built without them) */
  {"dots1", MOE8_ARCH_DEEPSEEK_V3, "n_routed_experts", "moe_intermediate_size", "num_local_experts", 4608, 62, 0, 0, 1408, -1, false, 1.0,
   1, 1, 0},
  /* MiniMaxConfig (MiniMax-Text-01): Mixtral's block (MiniMaxSparseMoeBlock
  ** is MixtralSparseMoeBlock); num_experts is an alias */
  {"minimax", MOE8_ARCH_MIXTRAL, "num_local_experts", "intermediate_size", "num_experts", 4096, 32, 8, 2, 14336, 0, true, 1.0, 0, 0, 0},
  /* MiniMaxM2Config: Mixtral's block routed by sigmoid scores plus the
  ** block's e_score_correction_bias for the choice, the chosen scores
  ** renormalized (MiniMaxM2TopKRouter); num_experts is an alias */
  {"minimax_m2", MOE8_ARCH_MIXTRAL, "num_local_experts", "intermediate_size", "num_experts", 3072, 62, 256, 8, 1536, 0, true, 1.0, 0, 0, 0,
   true},
  /* PhimoeConfig (Phi-3.5-MoE): Mixtral's experts and names, routed by
  ** sparsemixer (always 2 experts, router_jitter_noise; parse_phimoe) */
  {.name = "phimoe", .arch = MOE8_ARCH_MIXTRAL, .experts_key = "num_local_experts", .ffn_key = "intermediate_size", .hidden = 4096,
   .layers = 32, .experts = 16, .top_k = 2, .ffn = 6400, .norm = true, .scaling = 1.0, .place = PLACE_ALL, .sparsemixer = true},
  /* Families whose block is one of the above, as data: the class's keys
  ** and defaults (transformers' configuration classes). */
  /* Qwen3VLMoeTextConfig: Qwen3-MoE's block, always renormalized */
  {.name = "qwen3_vl_moe_text", .arch = MOE8_ARCH_QWEN3_MOE, .experts_key = "num_local_experts", .ffn_key = "moe_intermediate_size",
   .alias = "num_experts", .hidden = 2048, .layers = 24, .experts = 60, .top_k = 4, .ffn = 1408, .norm = true, .scaling = 1.0, .norm_key = ""},
  /* Qwen3OmniMoeTextConfig (the thinker's text model): Qwen3-MoE's block */
  {.name = "qwen3_omni_moe_text", .arch = MOE8_ARCH_QWEN3_MOE, .experts_key = "num_experts", .ffn_key = "moe_intermediate_size",
   .hidden = 2048, .layers = 28, .experts = 128, .top_k = 8, .ffn = 768, .norm = true, .scaling = 1.0},
  /* Qwen3_5MoeTextConfig: Qwen3-Next's block, always renormalized, every layer MoE */
  {.name = "qwen3_5_moe_text", .arch = MOE8_ARCH_QWEN2_MOE, .experts_key = "num_experts", .ffn_key = "moe_intermediate_size",
   .hidden = 2048, .layers = 40, .experts = 256, .top_k = 8, .ffn = 512, .shared = 512, .norm = true, .scaling = 1.0, .norm_key = "",
   .place = PLACE_ALL},
  /* DeepSeek-V3's block (sigmoid, correction bias, groups, ungated shared experts) */
  {.name = "glm4_moe_lite", .arch = MOE8_ARCH_DEEPSEEK_V3, .experts_key = "n_routed_experts", .ffn_key = "moe_intermediate_size",
   .alias = "num_local_experts", .hidden = 2048, .layers = 47, .experts = 64, .top_k = 4, .ffn = 1536, .shared = 1, .norm = true,
   .scaling = 1.8, .n_group = 1, .topk_group = 1, .first_dense = 1, .place = PLACE_TYPES},
  {.name = "glm4v_moe_text", .arch = MOE8_ARCH_DEEPSEEK_V3, .experts_key = "n_routed_experts", .ffn_key = "moe_intermediate_size",
   .alias = "num_local_experts", .hidden = 4096, .layers = 46, .experts = 128, .top_k = 8, .ffn = 1408, .shared = 1, .norm = true,
   .scaling = 1.0, .n_group = 1, .topk_group = 1, .first_dense = 1},
  {.name = "glm_moe_dsa", .arch = MOE8_ARCH_DEEPSEEK_V3, .experts_key = "n_routed_experts", .ffn_key = "moe_intermediate_size",
   .alias = "num_local_experts", .hidden = 6144, .layers = 78, .experts = 256, .top_k = 8, .ffn = 2048, .shared = 1, .norm = true,
   .scaling = 2.5, .n_group = 1, .topk_group = 1, .first_dense = 3, .place = PLACE_TYPES_FK},
  /* MiMoV2FlashConfig: no shared experts */
  {.name = "mimo_v2_flash", .arch = MOE8_ARCH_DEEPSEEK_V3, .experts_key = "n_routed_experts", .ffn_key = "moe_intermediate_size",
   .alias = "num_local_experts", .hidden = 4096, .layers = 48, .experts = 256, .top_k = 8, .ffn = 2048, .shared = 0, .norm = true,
   .scaling = 1.0, .n_group = 1, .topk_group = 1, .first_dense = 1, .shared_key = "", .place = PLACE_TYPES},
  {.name = "solar_open", .arch = MOE8_ARCH_DEEPSEEK_V3, .experts_key = "n_routed_experts", .ffn_key = "moe_intermediate_size",
   .alias = "num_local_experts", .hidden = 4096, .layers = 48, .experts = 128, .top_k = 8, .ffn = 1280, .shared = 1, .norm = true,
   .scaling = 1.0, .n_group = 1, .topk_group = 1, .place = PLACE_ALL},
  /* SarvamMoEConfig (Glm4MoeForCausalLM) and SarvamMLAConfig (DeepseekV3ForCausalLM) */
  {.name = "sarvam_moe", .arch = MOE8_ARCH_DEEPSEEK_V3, .experts_key = "n_routed_experts", .ffn_key = "moe_intermediate_size",
   .alias = "num_experts", .hidden = 4096, .layers = 19, .experts = 128, .top_k = 6, .ffn = 1024, .shared = 1, .norm = true,
   .scaling = 2.5, .n_group = 1, .topk_group = 1, .first_dense = 1, .shared_key = "n_shared_experts|num_shared_experts"},
  {.name = "sarvam_mla", .arch = MOE8_ARCH_DEEPSEEK_V3, .experts_key = "n_routed_experts", .ffn_key = "moe_intermediate_size",
   .alias = "num_experts", .hidden = 4096, .layers = 32, .experts = 128, .top_k = 8, .ffn = 2048, .shared = 1, .norm = true,
   .scaling = 2.5, .n_group = 1, .topk_group = 1, .first_dense = 1, .shared_key = "n_shared_experts|num_shared_experts"},
  {.name = "exaone_moe", .arch = MOE8_ARCH_DEEPSEEK_V3, .experts_key = "num_experts", .ffn_key = "moe_intermediate_size",
   .hidden = 4096, .layers = 32, .experts = 64, .top_k = 8, .ffn = 1024, .shared = 1, .norm = true, .scaling = 2.5, .n_group = 1,
   .topk_group = 1, .first_dense = 1, .shared_key = "num_shared_experts", .place = PLACE_TYPES_FK},
  /* KimiLinearConfig stores these keys under the names of Kimi's files */
  {.name = "kimi_linear", .arch = MOE8_ARCH_DEEPSEEK_V3, .experts_key = "num_experts", .ffn_key = "moe_intermediate_size",
   .alias = "num_local_experts", .hidden = 2304, .layers = 27, .experts = 256, .top_k = 8, .ffn = 1024, .shared = 1, .norm = true,
   .scaling = 2.446, .n_group = 1, .topk_group = 1, .first_dense = 1, .topk_key = "num_experts_per_token|num_experts_per_tok",
   .norm_key = "moe_renormalize|norm_topk_prob", .group_key = "num_expert_group|n_group",
   .shared_key = "num_shared_experts|n_shared_experts", .place = PLACE_TYPES_FK},
  /* FlexOlmoConfig: OLMoE's block */
  {.name = "flex_olmo", .arch = MOE8_ARCH_OLMOE, .experts_key = "num_experts", .ffn_key = "intermediate_size", .alias = "num_local_experts",
   .hidden = 4096, .layers = 32, .experts = 7, .top_k = 5, .ffn = 11008, .norm = false, .scaling = 1.0},
  /* MellumConfig: Qwen3-MoE's block placed by mlp_layer_types (default all sparse) */
  {.name = "mellum", .arch = MOE8_ARCH_QWEN3_MOE, .experts_key = "num_local_experts", .ffn_key = "moe_intermediate_size",
   .alias = "num_experts", .hidden = 2304, .layers = 28, .experts = 64, .top_k = 8, .ffn = 896, .norm = true, .scaling = 1.0,
   .place = PLACE_TYPES},
  /* UnlimitedOcrTextConfig: DeepSeek-V2's block */
  /* BailingHybridConfig: Kimi's key names */
  {.name = "bailing_hybrid", .arch = MOE8_ARCH_DEEPSEEK_V3, .experts_key = "num_experts", .ffn_key = "moe_intermediate_size",
   .alias = "num_local_experts", .hidden = 2560, .layers = 42, .experts = 512, .top_k = 8, .ffn = 768, .shared = 1, .norm = true,
   .scaling = 2.5, .n_group = 8, .topk_group = 4, .first_dense = 2, .topk_key = "num_experts_per_token|num_experts_per_tok",
   .norm_key = "moe_renormalize|norm_topk_prob", .group_key = "num_expert_group|n_group",
   .shared_key = "num_shared_experts|n_shared_experts", .place = PLACE_TYPES_FK},
  /* BeamConfig: no shared experts; routed_scaling_factor scales the routed sum (the same) */
  {.name = "beam", .arch = MOE8_ARCH_DEEPSEEK_V3, .experts_key = "num_experts", .ffn_key = "moe_intermediate_size", .hidden = 5120,
   .layers = 52, .experts = 256, .top_k = 8, .ffn = 2560, .shared = 0, .norm = true, .scaling = 2.5, .n_group = 8, .topk_group = 4,
   .first_dense = 3, .shared_key = "", .place = PLACE_TYPES},
  /* Dots3NoteTextConfig: shared width shared_experts_intermediate_size x n_shared_experts */
  {.name = "dots3_note_text", .arch = MOE8_ARCH_DEEPSEEK_V3, .experts_key = "n_routed_experts", .ffn_key = "moe_intermediate_size",
   .alias = "num_local_experts", .hidden = 5120, .layers = 46, .experts = 256, .top_k = 8, .ffn = 1536, .shared = 1, .norm = true,
   .scaling = 1.0, .n_group = 1, .topk_group = 1, .first_dense = 1,
   .shared_width_key = "shared_experts_intermediate_size|moe_shared_expert_intermediate_size", .shared_width = 1536,
   .place = PLACE_TYPES_FKF},
  /* AfmoeConfig: no groups, always renormalized, route_scale; dense layers num_dense_layers */
  {.name = "afmoe", .arch = MOE8_ARCH_DEEPSEEK_V3, .experts_key = "num_experts", .ffn_key = "moe_intermediate_size", .hidden = 2048,
   .layers = 32, .experts = 64, .top_k = 6, .ffn = 1408, .shared = 2, .norm = true, .scaling = 1.0, .n_group = 1, .topk_group = 1,
   .first_dense = 1, .norm_key = "", .scale_key = "route_scale", .group_key = "", .shared_key = "num_shared_experts",
   .dense_key = "num_dense_layers", .place = PLACE_FIRST},
  /* HYV3Config: no groups, always renormalized, router_scaling_factor */
  {.name = "hy_v3", .arch = MOE8_ARCH_DEEPSEEK_V3, .experts_key = "num_experts", .ffn_key = "moe_intermediate_size",
   .alias = "num_local_experts", .hidden = 4096, .layers = 80, .experts = 192, .top_k = 8, .ffn = 1536, .shared = 1, .norm = true,
   .scaling = 2.826, .n_group = 1, .topk_group = 1, .first_dense = 1, .norm_key = "", .scale_key = "router_scaling_factor",
   .group_key = "", .shared_key = "num_shared_experts", .place = PLACE_TYPES},
  /* Qwen4ExpTextConfig: Qwen3-Next's block, every layer MoE */
  {.name = "qwen4_exp_text", .arch = MOE8_ARCH_QWEN2_MOE, .experts_key = "num_experts", .ffn_key = "moe_intermediate_size",
   .hidden = 2048, .layers = 40, .experts = 512, .top_k = 10, .ffn = 512, .shared = 512, .norm = true, .scaling = 1.0, .place = PLACE_ALL},
  /* LaraMiniConfig: Qwen3-Next's block with the shared expert ungated, every layer MoE */
  {.name = "lara_mini", .arch = MOE8_ARCH_QWEN2_MOE, .experts_key = "num_experts", .ffn_key = "moe_intermediate_size", .hidden = 1024,
   .layers = 34, .experts = 128, .top_k = 4, .ffn = 512, .shared = 512, .norm = true, .scaling = 1.0, .shared_ungated = true,
   .place = PLACE_ALL},
  /* HunYuanMoEV1Config: softmax top-k always renormalized, one ungated shared expert of the experts' width
  ** (intermediate_size); num_experts and moe_topk as lists (per layer) are refused by name */
  {.name = "hunyuan_v1_moe", .arch = MOE8_ARCH_QWEN2_MOE, .experts_key = "num_experts", .ffn_key = "intermediate_size",
   .alias = "num_local_experts", .hidden = 4096, .layers = 32, .experts = 1, .top_k = 1, .ffn = 11008, .shared = 11008, .norm = true,
   .scaling = 1.0, .topk_key = "moe_topk|num_experts_per_tok", .norm_key = "", .shared_width_key = "intermediate_size",
   .shared_ungated = true, .place = PLACE_ALL},
  /* DeepseekOcr2TextConfig: DeepSeek-V2's block; num_experts_per_tok and mlp_layer_types have no default */
  {.name = "deepseek_ocr2_text", .arch = MOE8_ARCH_DEEPSEEK_V2, .experts_key = "n_routed_experts", .ffn_key = "moe_intermediate_size",
   .alias = "num_experts", .hidden = 4096, .layers = 32, .experts = 64, .top_k = 0, .ffn = 1407, .shared = 2, .norm = false,
   .scaling = 1.0, .place = PLACE_TYPES_REQ},
  {.name = "unlimited_ocr_text", .arch = MOE8_ARCH_DEEPSEEK_V2, .experts_key = "n_routed_experts", .ffn_key = "moe_intermediate_size",
   .alias = "num_experts", .hidden = 1280, .layers = 12, .experts = 64, .top_k = 6, .ffn = 896, .shared = 2, .norm = false, .scaling = 1.0,
   .first_dense = 1, .place = PLACE_TYPES_FK},
  /* JambaConfig: Qwen3-MoE's block (softmax top-k, never renormalized: no
  ** key) under feed_forward., its router feed_forward.router.weight;
  ** experts of width intermediate_size; MoE where layer %
  ** expert_layer_period == expert_layer_offset */
  {.name = "jamba", .arch = MOE8_ARCH_QWEN3_MOE, .experts_key = "num_experts", .ffn_key = "intermediate_size", .hidden = 4096,
   .layers = 32, .experts = 16, .top_k = 2, .ffn = 14336, .norm = false, .scaling = 1.0, .norm_key = "", .place = PLACE_PERIOD,
   .block_prefix = "feed_forward.", .router_name = "router.weight"},
  /* Glm5NextTextConfig (GLM-5, the text model of glm5_next): DeepSeek-V3's
  ** block with the limited SwiGLU in the routed and the shared experts */
  {.name = "glm5_next_text", .arch = MOE8_ARCH_DEEPSEEK_V3, .experts_key = "n_routed_experts", .ffn_key = "moe_intermediate_size",
   .alias = "num_local_experts", .hidden = 4096, .layers = 45, .experts = 288, .top_k = 8, .ffn = 2048, .shared = 1, .norm = true,
   .scaling = 2.5, .n_group = 1, .topk_group = 1, .first_dense = 3, .place = PLACE_TYPES, .limited = true, .limit = 10.0},
  /* HYV4Config and HYV4VLTextConfig (HY-V4): the same, the shared experts unclamped */
  {.name = "hy_v4", .arch = MOE8_ARCH_DEEPSEEK_V3, .experts_key = "n_routed_experts", .ffn_key = "moe_intermediate_size",
   .alias = "num_local_experts", .hidden = 2816, .layers = 34, .experts = 256, .top_k = 8, .ffn = 768, .shared = 1, .norm = true,
   .scaling = 2.827, .n_group = 1, .topk_group = 1, .first_dense = 1, .place = PLACE_TYPES, .limited = true, .limit = 10.0,
   .shared_plain = true},
  {.name = "hy_v4_vl_text", .arch = MOE8_ARCH_DEEPSEEK_V3, .experts_key = "n_routed_experts", .ffn_key = "moe_intermediate_size",
   .alias = "num_local_experts", .hidden = 6144, .layers = 78, .experts = 256, .top_k = 8, .ffn = 2048, .shared = 1, .norm = true,
   .scaling = 2.827, .n_group = 1, .topk_group = 1, .first_dense = 1, .place = PLACE_TYPES, .limited = true, .limit = 10.0,
   .shared_plain = true},
  /* Mistral4Config: DeepSeek-V3's block on softmax scores without a bias;
  ** the dropped groups' scores masked with 0.0, which selects as -inf does
  ** (softmax scores are positive, and the kept groups hold top_k experts) */
  {.name = "mistral4", .arch = MOE8_ARCH_DEEPSEEK_V3, .experts_key = "n_routed_experts", .ffn_key = "moe_intermediate_size",
   .alias = "num_local_experts", .hidden = 4096, .layers = 36, .experts = 128, .top_k = 4, .ffn = 2048, .shared = 1, .norm = true,
   .scaling = 1.0, .n_group = 1, .topk_group = 1, .first_dense = 0, .softmax_scores = true, .no_bias = true},
  /* AXK2Config (A.X-K2): DeepSeek-V3's block (sigmoid + correction bias,
  ** weights / (Σ + 1e-20) iff norm_topk_prob, times routed_scaling_factor,
  ** n_shared_experts ungated), groups optional and the dropped groups'
  ** selection values 0.0; MoE layers by mlp_layer_types ("sparse"), else
  ** the list the class builds from first_k_dense_replace (1) and
  ** moe_layer_freq (1) */
  /* AXK1Config (A.X-K1): DeepSeek-V3's block (groups, -inf mask) whose
  ** output (routed + shared) goes through post_mlp_layernorm, an RMSNorm
  ** multiplying by its weight; MoE layers by mlp_layer_types or the list
  ** the class builds from first_k_dense_replace (1) and moe_layer_freq (1) */
  {.name = "axk1", .arch = MOE8_ARCH_DEEPSEEK_V3, .experts_key = "n_routed_experts", .ffn_key = "moe_intermediate_size",
   .alias = "num_local_experts", .hidden = 7168, .layers = 61, .experts = 192, .top_k = 8, .ffn = 2048, .shared = 1, .norm = true,
   .scaling = 2.5, .n_group = 8, .topk_group = 4, .first_dense = 1, .place = PLACE_TYPES_FKF, .norm_eps = 1e-20, .axk1 = true},
  {.name = "axk2", .arch = MOE8_ARCH_DEEPSEEK_V3, .experts_key = "n_routed_experts", .ffn_key = "moe_intermediate_size",
   .alias = "num_local_experts", .hidden = 2048, .layers = 48, .experts = 128, .top_k = 8, .ffn = 512, .shared = 1, .norm = true,
   .scaling = 2.5, .n_group = 1, .topk_group = 1, .first_dense = 1, .place = PLACE_TYPES_FKF, .norm_eps = 1e-20, .group_zero = true},
  /* Ernie4_5_MoeConfig (ERNIE-4.5): softmax scores, the top-k of score +
  ** moe_statics.e_score_correction_bias, always renormalized by
  ** max(Σ, moe_norm_min); moe_num_shared_experts ungated shared experts;
  ** MoE where (l + 1) % moe_layer_interval == 0 and start <= l <= end */
  {.name = "ernie4_5_moe", .arch = MOE8_ARCH_DEEPSEEK_V3, .experts_key = "moe_num_experts", .ffn_key = "moe_intermediate_size",
   .alias = "num_experts", .hidden = 2560, .layers = 28, .experts = 64, .top_k = 6, .ffn = 1536, .shared = 2, .norm = true,
   .scaling = 1.0, .n_group = 1, .topk_group = 1, .topk_key = "moe_k|num_experts_per_tok", .norm_key = "", .group_key = "",
   .shared_key = "moe_num_shared_experts", .place = PLACE_INTERVAL, .softmax_scores = true, .norm_min = 1e-12},
  /* AriaTextConfig (Aria, the text model of aria): Mixtral's routing (the
  ** top-k of the logits, softmax over them: the renormalized scores) and
  ** ungated shared experts; experts fused x . W as experts.fc1.weight
  ** [E, D, 2F] (gate, then up) and fc2.weight [E, F, D], router
  ** router.weight, every layer MoE */
  {.name = "aria_text", .arch = MOE8_ARCH_QWEN2_MOE, .experts_key = "moe_num_experts", .ffn_key = "intermediate_size", .hidden = 4096,
   .layers = 32, .experts = 8, .top_k = 2, .ffn = 4096, .shared = 0, .norm = true, .scaling = 1.0, .topk_key = "moe_topk", .norm_key = "",
   .shared_width_key = "", .shared_ungated = true, .place = PLACE_ALL, .router_name = "router.weight", .fused_gu = "experts.fc1.weight",
   .fused_dn = "experts.fc2.weight", .aria = true},
  /* InklingTextConfig (Inkling, the text model of inkling_mm_model): sigmoid
  ** scores + bias, the top-k of the routed experts and every shared
  ** expert, all weighted by sigma(l) / sum (renormalized together) times
  ** route_scale x gate.global_scale; dense layers by mlp_layer_types, else
  ** the first dense_mlp_idx (0) */
  {.name = "inkling_text", .arch = MOE8_ARCH_DEEPSEEK_V3, .experts_key = "n_routed_experts", .ffn_key = "moe_intermediate_size",
   .hidden = 6144, .layers = 66, .experts = 256, .top_k = 6, .ffn = 3072, .shared = 0, .norm = true, .scaling = 8.0, .n_group = 1,
   .topk_group = 1, .norm_key = "", .scale_key = "route_scale", .group_key = "", .shared_key = "", .dense_key = "dense_mlp_idx",
   .first_dense = 0, .place = PLACE_TYPES_KEY, .inkling = true},
  /* Ernie4_5_VLMoeTextConfig (ERNIE-4.5-VL's text model): ERNIE-4.5's block
  ** (text_moe and the shared experts; the vision experts run on image and
  ** video tokens only), dense layers by mlp_layer_types (default: the first) */
  {.name = "ernie4_5_vl_moe_text", .arch = MOE8_ARCH_DEEPSEEK_V3, .experts_key = "moe_num_experts", .ffn_key = "moe_intermediate_size",
   .alias = "num_experts", .hidden = 2560, .layers = 28, .experts = 64, .top_k = 6, .ffn = 1536, .shared = 2, .norm = true,
   .scaling = 1.0, .n_group = 1, .topk_group = 1, .topk_key = "moe_k|num_experts_per_tok", .norm_key = "", .group_key = "",
   .shared_key = "moe_num_shared_experts", .first_dense = 1, .place = PLACE_TYPES, .softmax_scores = true, .norm_min = 1e-12,
   .ernie_vl = true},
  /* GraniteMoe*Config (IBM Granite 3 / 4): Mixtral's routing (softmax over
  ** the top-k logits = the top-k scores renormalized) under
  ** block_sparse_moe., experts fused as input_linear [E, 2F, D] and
  ** output_linear [E, D, F] (GraniteMoeSWA: experts.gate_up_proj /
  ** down_proj), router router.layer.weight (SWA: router.weight); the shared
  ** variants' ungated shared MLP of width shared_intermediate_size beside
  ** the block (shared_mlp.input_linear / output_linear) */
  {.name = "granitemoe", .arch = MOE8_ARCH_QWEN2_MOE, .experts_key = "num_local_experts", .ffn_key = "intermediate_size", .hidden = 4096,
   .layers = 32, .experts = 8, .top_k = 2, .ffn = 11008, .shared = 0, .norm = true, .scaling = 1.0, .norm_key = "", .shared_width_key = "",
   .shared_ungated = true, .place = PLACE_ALL, .block_prefix = "block_sparse_moe.", .router_name = "router.layer.weight",
   .fused_gu = "input_linear.weight", .fused_dn = "output_linear.weight"},
  {.name = "granitemoeshared", .arch = MOE8_ARCH_QWEN2_MOE, .experts_key = "num_local_experts", .ffn_key = "intermediate_size",
   .hidden = 4096, .layers = 32, .experts = 8, .top_k = 2, .ffn = 11008, .shared = 0, .norm = true, .scaling = 1.0, .norm_key = "",
   .shared_width_key = "shared_intermediate_size", .shared_ungated = true, .place = PLACE_ALL, .block_prefix = "block_sparse_moe.",
   .router_name = "router.layer.weight", .fused_gu = "input_linear.weight", .fused_dn = "output_linear.weight",
   .shared_beside = "shared_mlp."},
  {.name = "granitemoehybrid", .arch = MOE8_ARCH_QWEN2_MOE, .experts_key = "num_local_experts", .ffn_key = "intermediate_size",
   .hidden = 4096, .layers = 32, .experts = 8, .top_k = 2, .ffn = 11008, .shared = 1024, .norm = true, .scaling = 1.0, .norm_key = "",
   .shared_width_key = "shared_intermediate_size", .shared_ungated = true, .place = PLACE_ALL, .block_prefix = "block_sparse_moe.",
   .router_name = "router.layer.weight", .fused_gu = "input_linear.weight", .fused_dn = "output_linear.weight",
   .shared_beside = "shared_mlp."},
  {.name = "granitemoe_swa", .arch = MOE8_ARCH_QWEN2_MOE, .experts_key = "num_local_experts", .ffn_key = "intermediate_size",
   .hidden = 4096, .layers = 32, .experts = 8, .top_k = 2, .ffn = 11008, .shared = 0, .norm = true, .scaling = 1.0, .norm_key = "",
   .shared_width_key = "shared_intermediate_size", .shared_ungated = true, .place = PLACE_ALL, .block_prefix = "block_sparse_moe.",
   .router_name = "router.weight", .shared_beside = "shared_mlp."},
  /* Lfm2MoeConfig (LFM2-MoE): DeepSeek-V3's block without groups or shared
  ** experts, under feed_forward.; the bias (feed_forward.expert_bias) iff
  ** use_expert_bias; weights / (Σ + 1e-6) iff norm_topk_prob; the first
  ** num_dense_layers layers dense */
  {.name = "lfm2_moe", .arch = MOE8_ARCH_DEEPSEEK_V3, .experts_key = "num_experts", .ffn_key = "moe_intermediate_size", .hidden = 2048,
   .layers = 32, .experts = 32, .top_k = 4, .ffn = 1792, .shared = 0, .norm = true, .scaling = 1.0, .n_group = 1, .topk_group = 1,
   .first_dense = 2, .group_key = "", .shared_key = "", .dense_key = "num_dense_layers", .place = PLACE_FIRST,
   .block_prefix = "feed_forward.", .bias_flag = "use_expert_bias", .norm_eps = 1e-6},
  /* LagunaConfig: DeepSeek-V3's block without groups, always renormalized,
  ** the routed sum times moe_routed_scaling_factor, one ungated shared
  ** expert of width shared_expert_intermediate_size */
  {.name = "laguna", .arch = MOE8_ARCH_DEEPSEEK_V3, .experts_key = "num_experts", .ffn_key = "moe_intermediate_size", .hidden = 2048,
   .layers = 40, .experts = 256, .top_k = 8, .ffn = 512, .shared = 1, .norm = true, .scaling = 1.0, .n_group = 1, .topk_group = 1,
   .first_dense = 1, .norm_key = "", .scale_key = "moe_routed_scaling_factor", .group_key = "", .shared_key = "",
   .shared_width_key = "shared_expert_intermediate_size", .shared_width = 512, .place = PLACE_TYPES,
   .zero_key = "moe_router_logit_softcapping", .zero_why = "the router logits are then softcapped (tanh), which moe8 does not compute"},
  /* Kolibri1Config: Qwen2-MoE's block with the shared expert ungated, every
  ** layer MoE; the top-k of logit + gate.e_score_correction_bias, weighted
  ** by the sigmoid of the chosen logits, divided by their sum iff
  ** norm_topk_prob (default false) */
  {.name = "kolibri1", .arch = MOE8_ARCH_QWEN2_MOE, .experts_key = "num_experts", .ffn_key = "moe_intermediate_size",
   .alias = "num_local_experts", .hidden = 2560, .layers = 50, .experts = 384, .top_k = 6, .ffn = 512, .shared = 512, .norm = false,
   .scaling = 1.0, .shared_ungated = true, .sigmoid = true, .place = PLACE_ALL, .select_logits = true},
  /* MistralLarge4TextConfig (Mistral-Large-4, the text model of
  ** mistral_large4): Mistral-4's block (softmax scores, no bias, the 0.0
  ** group mask selecting as -inf does), always renormalized (no key); its
  ** files hold Mistral's own names (layers.L.gate.weight,
  ** layers.L.experts.N.w1/w3/w2, layers.L.shared_experts.*) */
  {.name = "mistral_large4_text", .arch = MOE8_ARCH_DEEPSEEK_V3, .experts_key = "n_routed_experts", .ffn_key = "moe_intermediate_size",
   .alias = "num_local_experts", .hidden = 6144, .layers = 72, .experts = 128, .top_k = 4, .ffn = 6144, .shared = 1, .norm = true,
   .scaling = 1.0, .n_group = 1, .topk_group = 1, .first_dense = 1, .norm_key = "", .place = PLACE_TYPES_FK, .softmax_scores = true,
   .no_bias = true, .mistral_names = true},
  /* JetMoeConfig: Mixtral's routing (softmax over the top-k logits), the
  ** experts fused as mlp.input_linear.weight [E, 2F, D] (gate rows, then
  ** up) and mlp.output_linear.weight [E, D, F], the router
  ** mlp.router.layer.weight, and the output bias mlp.bias [D] added to the
  ** block's output; its activation under activation_function; every layer
  ** MoE (its mixture of attention heads is outside the block) */
  {.name = "jetmoe", .arch = MOE8_ARCH_MIXTRAL, .experts_key = "num_local_experts", .ffn_key = "intermediate_size", .hidden = 2048,
   .layers = 12, .experts = 8, .top_k = 2, .ffn = 5632, .norm = true, .scaling = 1.0, .place = PLACE_ALL, .block_prefix = "mlp.",
   .router_name = "router.layer.weight", .fused_gu = "input_linear.weight", .fused_dn = "output_linear.weight", .out_bias = true,
   .act_key = "activation_function"},
  /* DbrxConfig: softmax over all, top-k, the weights divided by their
  ** p-norm (ffn_config.moe_normalize_expert_weights: 1 the sum, null none);
  ** the keys under ffn_config, d_model and n_layers at the top; layers at
  ** transformer.blocks.L.ffn., the experts stacked 2-D (experts.mlp.w1,
  ** v1, w2), router router.layer.weight; every layer MoE */
  {.name = "dbrx", .arch = MOE8_ARCH_QWEN3_MOE, .experts_key = "moe_num_experts", .ffn_key = "ffn_hidden_size", .hidden = 2048,
   .layers = 24, .experts = 4, .top_k = 1, .ffn = 3584, .norm = true, .scaling = 1.0, .place = PLACE_ALL, .block_prefix = "ffn.",
   .router_name = "router.layer.weight", .dbrx = true},
  /* Cohere2MoeConfig: the top-k of the logits, weighted by the softmax over
  ** those k (expert_selection_fn "softmax": Mixtral's, norm_topk_prob not
  ** read) or by their sigmoid, divided by the sum iff norm_topk_prob
  ** ("sigmoid"); num_shared_experts x intermediate_size ungated shared
  ** experts (mlp.shared_experts.*), combined with the routed sum by
  ** shared_expert_combination_strategy "average" ((routed + shared) / 2) or
  ** "sum"; placed by mlp_layer_types (from first_k_dense_replace, 0) */
  {.name = "cohere2_moe", .arch = MOE8_ARCH_QWEN2_MOE, .experts_key = "num_experts", .ffn_key = "intermediate_size", .hidden = 8192,
   .layers = 40, .experts = 8, .top_k = 2, .ffn = 22528, .shared = 0, .norm = true, .scaling = 1.0, .shared_width_key = "",
   .first_dense = 0, .place = PLACE_TYPES_FK, .cohere = true},
  /* FlintConfig: Qwen2-MoE's block routed by sigmoid scores (no bias),
  ** the chosen scores divided by their sum iff norm_topk_prob (default
  ** true), its shared expert added in full (no gate); mlp_only_layers
  ** defaults to [0, 1] */
  /* Step3p7TextConfig (Step-3.5 / Step-3.7, the text model of step3p7):
  ** sigmoid scores, the top-k of score + gate.e_score_correction_bias, the
  ** chosen scores divided by their sum, the routed sum times
  ** moe_router_scaling_factor (DeepSeek-V3's block without groups), one
  ** ungated shared expert of width share_expert_dim; the experts' SwiGLU
  ** clamped after the activation, per layer */
  {.name = "step3p5", .arch = MOE8_ARCH_DEEPSEEK_V3, .experts_key = "n_routed_experts", .ffn_key = "moe_intermediate_size",
   .alias = "moe_num_experts", .hidden = 4096, .layers = 45, .experts = 288, .top_k = 8, .ffn = 1280, .shared = 1, .norm = true,
   .scaling = 1.0, .n_group = 1, .topk_group = 1, .topk_key = "num_experts_per_tok|moe_top_k", .norm_key = "",
   .scale_key = "moe_router_scaling_factor", .group_key = "", .shared_key = "", .shared_width_key = "share_expert_dim|share_expert_dims",
   .shared_width = 1280, .place = PLACE_ALL, .step = true},
  /* MiniMaxM3VLTextConfig (MiniMax-M3, the text model of minimax_m3_vl):
  ** sigmoid scores, the top-k of score + e_score_correction_bias, the
  ** chosen scores divided by their sum, the routed sum times
  ** routed_scaling_factor, one ungated shared expert of width
  ** shared_intermediate_size; experts of width intermediate_size */
  {.name = "minimax_m3_vl_text", .arch = MOE8_ARCH_DEEPSEEK_V3, .experts_key = "num_local_experts", .ffn_key = "intermediate_size",
   .alias = "num_experts", .hidden = 6144, .layers = 60, .experts = 128, .top_k = 4, .ffn = 3072, .shared = 1, .norm = true,
   .scaling = 2.0, .n_group = 1, .topk_group = 1, .norm_key = "", .group_key = "", .shared_key = "",
   .shared_width_key = "shared_intermediate_size", .shared_width = 3072, .place = PLACE_ALL, .m3 = true},
  /* Inkling2TextConfig and Inkling2LoopTextConfig (Inkling-2, the text
  ** models of inkling2 and inkling2_loop): f32 routing, sigmoid scores, the
  ** top-k of score + gate.e_score_correction_bias, weights / (Σ + 1e-20)
  ** times route_scale, no shared experts, every layer MoE (the loop layers
  ** run the same block again); the softcapped SwiGLU */
  {.name = "inkling2_text", .arch = MOE8_ARCH_DEEPSEEK_V3, .experts_key = "n_routed_experts", .ffn_key = "moe_intermediate_size",
   .alias = "num_local_experts", .hidden = 4608, .layers = 48, .experts = 384, .top_k = 8, .ffn = 2304, .shared = 0, .norm = true,
   .scaling = 8.0, .n_group = 1, .topk_group = 1, .norm_key = "", .scale_key = "route_scale|routed_scaling_factor", .group_key = "",
   .shared_key = "", .place = PLACE_ALL, .fused_gu = "experts.w13_weight", .fused_dn = "experts.w2_weight", .norm_eps = 1e-20,
   .softcap = true},
  {.name = "inkling2_loop_text", .arch = MOE8_ARCH_DEEPSEEK_V3, .experts_key = "n_routed_experts", .ffn_key = "moe_intermediate_size",
   .alias = "num_local_experts", .hidden = 2304, .layers = 24, .experts = 128, .top_k = 8, .ffn = 1152, .shared = 0, .norm = true,
   .scaling = 8.0, .n_group = 1, .topk_group = 1, .norm_key = "", .scale_key = "route_scale|routed_scaling_factor", .group_key = "",
   .shared_key = "", .place = PLACE_ALL, .fused_gu = "experts.w13_weight", .fused_dn = "experts.w2_weight", .norm_eps = 1e-20,
   .softcap = true},
  /* DeepseekV4Config: the block under ffn. in its files (experts w1/w3/w2, router gate.weight, bias gate.bias,
  ** the hash layers' gate.tid2eid, shared_experts.w1/w3/w2); n_shared_experts and norm_topk_prob are not read */
  {.name = "deepseek_v4", .arch = MOE8_ARCH_DEEPSEEK_V3, .experts_key = "n_routed_experts", .ffn_key = "moe_intermediate_size",
   .alias = "num_local_experts", .hidden = 4096, .layers = 43, .experts = 256, .top_k = 6, .ffn = 2048, .shared = 1, .norm = true,
   .scaling = 1.5, .n_group = 1, .topk_group = 1, .norm_key = "", .group_key = "", .shared_key = "", .place = PLACE_ALL,
   .block_prefix = "ffn.", .limited = true, .limit = 10.0, .norm_eps = 1e-20, .dsv4 = true},
  /* Gemma4TextConfig (the text model of gemma4) and DiffusionGemmaTextConfig
  ** (of diffusion_gemma): softmax over all experts, the top-k renormalized,
  ** each weight times router.per_expert_scale; num_experts, top_k_experts
  ** and moe_intermediate_size have no default; every layer has the branch */
  {.name = "gemma4_text", .arch = MOE8_ARCH_MIXTRAL, .experts_key = "num_experts", .ffn_key = "moe_intermediate_size", .hidden = 2304,
   .layers = 30, .norm = true, .scaling = 1.0, .topk_key = "top_k_experts", .place = PLACE_ALL, .router_name = "router.proj.weight",
   .gemma = true, .moe_flag = "enable_moe_block"},
  {.name = "diffusion_gemma_text", .arch = MOE8_ARCH_MIXTRAL, .experts_key = "num_experts", .ffn_key = "moe_intermediate_size",
   .hidden = 2304, .layers = 30, .norm = true, .scaling = 1.0, .topk_key = "top_k_experts", .place = PLACE_ALL,
   .router_name = "router.proj.weight", .gemma = true},
  /* NemotronHConfig (Nemotron-H, Nemotron-3): DeepSeek-V3's block (sigmoid,
  ** correction bias, groups, / (Σ + 1e-20), routed_scaling_factor) with
  ** ungated relu² experts down(relu(up(x))²) and one shared expert of that
  ** form, width moe_shared_expert_intermediate_size (n_shared_experts is
  ** not read: NemotronHMoE has one); the block under mixer. */
  {.name = "nemotron_h", .arch = MOE8_ARCH_DEEPSEEK_V3, .experts_key = "n_routed_experts", .ffn_key = "moe_intermediate_size",
   .alias = "num_local_experts", .hidden = 4096, .layers = 4, .experts = 8, .top_k = 2, .ffn = 7688, .shared = 1, .norm = true,
   .scaling = 1.0, .n_group = 1, .topk_group = 1, .shared_key = "", .shared_width_key = "moe_shared_expert_intermediate_size",
   .shared_width = 7688, .place = PLACE_ALL, .block_prefix = "mixer.", .norm_eps = 1e-20, .nemotron = true},
  /* LongcatFlashConfig: softmax over n_routed_experts + zero_expert_num,
  ** the top-k of score + router.e_score_correction_bias, weights the scores
  ** times routed_scaling_factor (no renormalization, no groups, no shared
  ** expert), the ids past n_routed_experts identity experts; one MoE per
  ** decoder layer (num_layers of them; parse_longcat); the router is
  ** mlp.router.classifier.weight (src/io/model.c) */
  {.name = "longcat_flash", .arch = MOE8_ARCH_DEEPSEEK_V3, .experts_key = "n_routed_experts", .ffn_key = "expert_ffn_hidden_size",
   .alias = "num_local_experts", .hidden = 6144, .layers = 28, .experts = 512, .top_k = 12, .ffn = 2048, .shared = 0, .norm = false,
   .scaling = 6.0, .n_group = 1, .topk_group = 1, .topk_key = "moe_topk|num_experts_per_tok", .norm_key = "", .group_key = "",
   .shared_key = "", .place = PLACE_ALL, .block_prefix = "mlp.", .softmax_scores = true,
   .longcat = true},
  /* MuseSparkTextConfig (MuSE-Spark, the text model of muse_spark): f32
  ** logits times output_multiplier, sigmoid, the top-k of s +
  ** gate.e_score_correction_bias, / (Σ + 1e-15), times
  ** routed_scaling_factor; latent SwiGLU experts of width moe_hidden_size
  ** between pre_expert_proj (+ pre_expert_norm) and post_expert_proj, each
  ** expert's output normalized by experts.post_expert_norm; dense layers
  ** by mlp_layer_types (default: all sparse) */
  {.name = "muse_spark_text", .arch = MOE8_ARCH_DEEPSEEK_V3, .experts_key = "num_local_experts", .ffn_key = "moe_intermediate_size",
   .hidden = 8192, .layers = 62, .experts = 256, .top_k = 8, .ffn = 4096, .shared = 0, .norm = true, .scaling = 1.0, .n_group = 1,
   .topk_group = 1, .norm_key = "", .group_key = "", .shared_key = "", .first_dense = 0, .place = PLACE_TYPES, .norm_eps = 1e-15,
   .muse = true},
  /* SwitchTransformersConfig: top-1 of the f32 softmax, weighted by its
  ** probability, tokens past expert_capacity in their sequence dropped;
  ** ungated experts wo(act(wi(x))); the encoder's and the decoder's
  ** sparse blocks (parse_switch) */
  /* NllbMoeConfig: top-2 of the f32 softmax, NLLB's capacity in eval
  ** (capacity_ranked), the kept pair renormalized, times 1 -
  ** moe_token_dropout; ungated biased experts fc2(act(fc1(x))); the
  ** encoder's and the decoder's sparse layers (parse_nllb) */
  {.name = "nllb-moe", .arch = MOE8_ARCH_QWEN3_MOE, .experts_key = "num_experts", .ffn_key = "encoder_ffn_dim", .hidden = 1024,
   .layers = 12, .experts = 128, .top_k = 2, .ffn = 4096, .norm = false, .scaling = 1.0, .place = PLACE_ALL, .nllb = true},
  {.name = "switch_transformers", .arch = MOE8_ARCH_QWEN3_MOE, .experts_key = "num_experts", .ffn_key = "d_ff", .hidden = 768,
   .layers = 12, .experts = 8, .top_k = 1, .ffn = 2048, .norm = false, .scaling = 1.0, .place = PLACE_ALL, .switch_t = true},
  /* ZayaConfig: an MLP router (router_hidden_size) fed the previous
  ** layer's router state, over num_experts + 1 classes (the last a skip
  ** expert), softmax, the top-1 of p + balancing_biases, weighted by p;
  ** fused SwiGLU experts; every layer MoE (parse_zaya) */
  {.name = "zaya", .arch = MOE8_ARCH_QWEN3_MOE, .experts_key = "num_experts", .ffn_key = "moe_intermediate_size", .hidden = 2048,
   .layers = 40, .experts = 16, .top_k = 1, .ffn = 2048, .norm = false, .scaling = 1.0, .norm_key = "", .place = PLACE_ALL, .zaya = true},
  /* DogeConfig with is_moe (DogeCDMoE): product-key routing over
  ** num_experts single silu neurons (down_embed, up_embed), plus the dense
  ** SwiGLU of width intermediate_size; every layer (parse_doge) */
  {.name = "doge", .arch = MOE8_ARCH_QWEN3_MOE, .experts_key = "num_experts", .ffn_key = "intermediate_size", .hidden = 1024,
   .layers = 32, .experts = 16384, .top_k = 64, .ffn = 2048, .norm = false, .scaling = 1.0, .place = PLACE_ALL, .doge = true},
  {.name = "flint", .arch = MOE8_ARCH_QWEN2_MOE, .experts_key = "num_experts", .ffn_key = "moe_intermediate_size", .hidden = 2048,
   .layers = 49, .experts = 256, .top_k = 6, .ffn = 512, .shared = 1024, .norm = true, .scaling = 1.0, .first_dense = 2,
   .shared_ungated = true, .sigmoid = true},
};

/* Multimodal models whose text model is a family: its keys are the
** wrapper's text_config, its tensors under the language model's root
** (moe8_model_open finds it). */
static const struct { const char *type, *text; } k_wrappers[] = {
  {"llama4", "llama4_text"},
  {"qwen3_vl_moe", "qwen3_vl_moe_text"},
  {"qwen3_5_moe", "qwen3_5_moe_text"},
  {"glm4v_moe", "glm4v_moe_text"},
  {"unlimited_ocr", "unlimited_ocr_text"},
  {"glm5_next", "glm5_next_text"},
  {"hy_v4_vl", "hy_v4_vl_text"},
  {"mistral_large4", "mistral_large4_text"},
  {"step3p7", "step3p5"},
  {"inkling2", "inkling2_text"},
  {"minimax_m3_vl", "minimax_m3_vl_text"},
  {"inkling2_loop", "inkling2_loop_text"},
  {"ernie4_5_vl_moe", "ernie4_5_vl_moe_text"},
  {"kimi_k25", "deepseek_v3"}, /* Kimi K2.5 / K2.6: text_config deepseek_v3 (kimi_k2 as released) */
  {"inkling_mm_model", "inkling_text"},
  {"aria", "aria_text"},
  {"gemma4", "gemma4_text"},
  {"diffusion_gemma", "diffusion_gemma_text"},
  {"nemotron_h_omni", "nemotron_h"}, /* Nemotron-3 Nano Omni: text_config (llm_config as released) */
  {"nemo_speechlm", "nemotron_h"},   /* Nemotron-3.5 Transcribe */
  {"muse_spark", "muse_spark_text"},
};

/* The number tokens of a JSON text in document order (strings skipped),
** then each number of the parsed tree, in the same order, made a raw item
** holding its token. */
static bool keep_numbers(cJSON *node, const char *txt, const size_t *at, const size_t *len, size_t count, size_t *i) {
  for (; node; node = node->next) {
    if (cJSON_IsNumber(node)) {
      if (*i >= count) return false;
      char *tok = malloc(len[*i] + 1);
      if (!tok) return false;
      memcpy(tok, txt + at[*i], len[*i]);
      tok[len[*i]] = '\0';
      (*i)++;
      node->type = cJSON_Raw;
      node->valuestring = tok;
    } else if ((cJSON_IsObject(node) || cJSON_IsArray(node)) && !keep_numbers(node->child, txt, at, len, count, i)) {
      return false;
    }
  }
  return true;
}

struct cJSON *moe8__json_parse_keeping_numbers(const char *txt, size_t n) {
  cJSON *root = cJSON_ParseWithLength(txt, n);
  if (!root) return NULL;
  size_t count = 0, cap = 64, *at = malloc(cap * sizeof *at), *len = malloc(cap * sizeof *len);
  bool ok = at && len;
  for (size_t p = 0; ok && p < n;) {
    const char c = txt[p];
    if (c == '"') { /* a string: its escapes skipped */
      for (p++; p < n && txt[p] != '"'; p++)
        if (txt[p] == '\\') p++;
      p++;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      const size_t q = p;
      while (p < n && (txt[p] == '-' || txt[p] == '+' || txt[p] == '.' || txt[p] == 'e' || txt[p] == 'E' || (txt[p] >= '0' && txt[p] <= '9'))) p++;
      if (count == cap) {
        cap *= 2;
        size_t *a2 = realloc(at, cap * sizeof *at), *l2 = a2 ? realloc(len, cap * sizeof *len) : NULL;
        if (a2) at = a2;
        if (l2) len = l2;
        ok = a2 && l2;
      }
      if (ok) { at[count] = q; len[count] = p - q; count++; }
    } else {
      p++;
    }
  }
  size_t i = 0;
  /* the numbers as the text wrote them; a mismatch leaves cJSON's own printing */
  if (ok) {
    cJSON *probe = cJSON_ParseWithLength(txt, n);
    if (probe && keep_numbers(probe, txt, at, len, count, &i) && i == count) {
      cJSON_Delete(root);
      root = probe;
    } else {
      cJSON_Delete(probe);
    }
  }
  free(at);
  free(len);
  return root;
}

static const cJSON *item(const cJSON *o, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  return v && !cJSON_IsNull(v) ? v : NULL;
}

/* An integer key in [lo, hi], or def when absent. */
static moe8_status get_int(const cJSON *o, const char *file, const char *key, int64_t def, int64_t lo, int64_t hi, int64_t *out) {
  const cJSON *v = item(o, key);
  if (!v) { *out = def; return MOE8_OK; }
  /* Range first: converting an out-of-range double to an integer is undefined. */
  if (!cJSON_IsNumber(v) || !(v->valuedouble >= (double)lo && v->valuedouble <= (double)hi) || v->valuedouble != floor(v->valuedouble))
    return moe8__fail(MOE8_ERR_PARSE, "%s: \"%s\" must be an integer in [%lld, %lld]", file, key, (long long)lo, (long long)hi);
  *out = (int64_t)v->valuedouble;
  return MOE8_OK;
}

static moe8_status get_bool(const cJSON *o, const char *file, const char *key, bool def, bool *out) {
  const cJSON *v = item(o, key);
  if (!v) { *out = def; return MOE8_OK; }
  if (!cJSON_IsBool(v)) return moe8__fail(MOE8_ERR_PARSE, "%s: \"%s\" must be true or false", file, key);
  *out = cJSON_IsTrue(v);
  return MOE8_OK;
}

/* A string key equal to one of the allowed values (or absent). */
static moe8_status want_str(const cJSON *o, const char *file, const char *key, const char *allowed, const char *what) {
  const cJSON *v = item(o, key);
  if (!v) return MOE8_OK;
  if (!cJSON_IsString(v)) return moe8__fail(MOE8_ERR_PARSE, "%s: \"%s\" must be a string", file, key);
  char buf[128];
  snprintf(buf, sizeof buf, "%s", allowed);
  for (char *save = NULL, *t = strtok_r(buf, "|", &save); t; t = strtok_r(NULL, "|", &save))
    if (!strcmp(t, v->valuestring)) return MOE8_OK;
  return moe8__fail(MOE8_ERR_UNSUPPORTED, "%s: \"%s\" is \"%.60s\": %s", file, key, v->valuestring, what);
}

/* The name a row's key ("name" or "name|alias"; NULL: std) has in the
** file: the name, or the alias when only it is there; both there with
** different values: refused, naming both. */
static moe8_status pick_key(const cJSON *o, const char *file, const char *spec, const char *std, char out[64]) {
  const char *s = spec && *spec ? spec : std, *bar = strchr(s, '|');
  char name[64], alias[64] = "";
  snprintf(name, sizeof name, "%.*s", bar ? (int)(bar - s) : (int)strlen(s), s);
  if (bar) snprintf(alias, sizeof alias, "%s", bar + 1);
  const cJSON *a = item(o, name), *b = *alias ? item(o, alias) : NULL;
  if (a && b && !cJSON_Compare(a, b, true))
    return moe8__fail(MOE8_ERR_PARSE, "%s: \"%s\" and its alias \"%s\" disagree", file, name, alias);
  snprintf(out, 64, "%s", !a && b ? alias : name);
  return MOE8_OK;
}

/* A number key in (0, 1e30) (lo_incl: [0, 1e30)), or def when absent. */
static moe8_status get_pos(const cJSON *root, const char *file, const char *key, double def, bool lo_incl, const char *what, float *out) {
  const cJSON *v = item(root, key);
  if (v && (!cJSON_IsNumber(v) || !((lo_incl ? v->valuedouble >= 0 : v->valuedouble > 0) && v->valuedouble < 1e30)))
    return moe8__fail(MOE8_ERR_PARSE, "%s: \"%s\" must be a %s number%s", file, key, lo_incl ? "non-negative" : "positive", what);
  *out = (float)(v ? v->valuedouble : def);
  return MOE8_OK;
}

/* routed_scaling_factor (or the family's key) in (0, 1e6), or the family's default. */
static moe8_status get_scaling(const cJSON *root, const char *file, const char *key, double def, float *out) {
  const cJSON *v = item(root, key);
  if (v && (!cJSON_IsNumber(v) || !(v->valuedouble > 0 && v->valuedouble < 1e6)))
    return moe8__fail(MOE8_ERR_PARSE, "%s: \"%s\" must be a number in (0, 1e6)", file, key);
  *out = (float)(v ? v->valuedouble : def);
  return MOE8_OK;
}

/* Group-limited routing that can be computed: n_group > 1 divides the
** experts into groups of at least 2, topk_group <= n_group, and the kept
** groups hold at least top_k experts. */
static moe8_status check_groups(const moe8_layer_config *L, const char *file) {
  const int64_t E = L->num_experts, G = L->n_group;
  if (G <= 1) return MOE8_OK;
  if (E % G || E / G < 2)
    return moe8__fail(MOE8_ERR_PARSE, "%s: \"n_group\" = %lld must divide \"n_routed_experts\" = %lld into groups of at least 2", file,
                      (long long)G, (long long)E);
  if (L->topk_group > G)
    return moe8__fail(MOE8_ERR_PARSE, "%s: \"topk_group\" = %lld exceeds \"n_group\" = %lld", file, (long long)L->topk_group, (long long)G);
  if (L->top_k > L->topk_group * (E / G))
    return moe8__fail(MOE8_ERR_PARSE, "%s: \"num_experts_per_tok\" = %lld exceeds the %lld experts of \"topk_group\" = %lld groups", file,
                      (long long)L->top_k, (long long)(L->topk_group * (E / G)), (long long)L->topk_group);
  return MOE8_OK;
}

/* DeepSeek's dense layers: first_k_dense_replace (the family's default)
** and moe_layer_freq (1). */
static moe8_status get_dense_layers(const cJSON *root, const char *file, int64_t def, moe8_hf_config *c) {
  moe8_status st = get_int(root, file, "first_k_dense_replace", def, 0, 1 << 20, &c->first_k_dense_replace);
  c->first_k_dense_from_default = item(root, "first_k_dense_replace") == NULL;
  return st == MOE8_OK ? get_int(root, file, "moe_layer_freq", 1, 1, 1 << 20, &c->moe_layer_freq) : st;
}

/* The MoE layers of a family placed by mlp_layer_types (or every layer):
** the dense ones go to mlp_only_layers; decoder_sparse_step 0 marks a list
** from the file, -1 the class's default list (for the messages). */
static moe8_status get_placement(const cJSON *root, const char *file, const family *fam, moe8_hf_config *c) {
  c->first_k_dense_replace = 0;
  c->first_k_dense_from_default = false;
  c->moe_layer_freq = c->decoder_sparse_step = 1;
  c->n_mlp_only = 0;
  c->expert_layer_period = c->expert_layer_offset = 0;
  if (fam->place == PLACE_ALL) return MOE8_OK;
  if (fam->place == PLACE_PERIOD) {
    moe8_status st = get_int(root, file, "expert_layer_period", 2, 1, 1 << 20, &c->expert_layer_period);
    if (st == MOE8_OK) st = get_int(root, file, "expert_layer_offset", 1, 0, 1 << 20, &c->expert_layer_offset);
    if (st == MOE8_OK && c->expert_layer_offset >= c->expert_layer_period) /* as JambaConfig refuses it */
      return moe8__fail(MOE8_ERR_PARSE, "%s: \"expert_layer_offset\" = %lld must be smaller than \"expert_layer_period\" = %lld", file,
                        (long long)c->expert_layer_offset, (long long)c->expert_layer_period);
    return st;
  }
  if (fam->place == PLACE_INTERVAL) {
    int64_t iv = 1, lo = 1, hi = -1;
    moe8_status st = get_int(root, file, "moe_layer_interval", 1, 1, 1 << 20, &iv);
    if (st == MOE8_OK) st = get_int(root, file, "moe_layer_start_index", 1, 0, 1 << 20, &lo);
    if (st == MOE8_OK) st = get_int(root, file, "moe_layer_end_index", -1, -1, 1 << 20, &hi);
    if (hi == -1) hi = c->num_layers - 1; /* as the class's __post_init__ */
    for (int64_t l = 0; st == MOE8_OK && l < c->num_layers; l++) {
      if ((l + 1) % iv == 0 && l >= lo && l <= hi) continue;
      if (c->n_mlp_only >= MOE8_MAX_MLP_ONLY)
        return moe8__fail(MOE8_ERR_PARSE, "%s: moe_layer_interval, moe_layer_start_index and moe_layer_end_index leave more than %d "
                          "dense layers", file, MOE8_MAX_MLP_ONLY);
      c->mlp_only_layers[c->n_mlp_only++] = l;
    }
    c->decoder_sparse_step = -3;
    return st;
  }
  if (fam->place == PLACE_FIRST) { /* the first num_dense_layers layers dense (the class has no list) */
    int64_t n = 0;
    moe8_status st = get_int(root, file, fam->dense_key, fam->first_dense, 0, 1 << 20, &n);
    for (int64_t l = 0; st == MOE8_OK && l < n && l < c->num_layers; l++) {
      if (c->n_mlp_only >= MOE8_MAX_MLP_ONLY) return moe8__fail(MOE8_ERR_PARSE, "%s: \"%s\" = %lld: too many dense layers", file, fam->dense_key, (long long)n);
      c->mlp_only_layers[c->n_mlp_only++] = l;
    }
    c->decoder_sparse_step = -2;
    c->first_k_dense_from_default = item(root, fam->dense_key) == NULL;
    return st;
  }
  const cJSON *v = item(root, "mlp_layer_types");
  if (v) {
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != c->num_layers)
      return moe8__fail(MOE8_ERR_PARSE, "%s: \"mlp_layer_types\" must be a list of num_hidden_layers = %lld entries \"dense\" or \"sparse\"",
                        file, (long long)c->num_layers);
    int64_t l = 0;
    for (const cJSON *e = v->child; e; e = e->next, l++) {
      const bool dense = cJSON_IsString(e) && !strcmp(e->valuestring, "dense");
      if (!dense && !(cJSON_IsString(e) && !strcmp(e->valuestring, "sparse")))
        return moe8__fail(MOE8_ERR_UNSUPPORTED, "%s: \"mlp_layer_types\"[%lld] is not \"dense\" or \"sparse\"", file, (long long)l);
      if (!dense) continue;
      if (c->n_mlp_only >= MOE8_MAX_MLP_ONLY)
        return moe8__fail(MOE8_ERR_PARSE, "%s: \"mlp_layer_types\" has more than %d dense layers", file, MOE8_MAX_MLP_ONLY);
      c->mlp_only_layers[c->n_mlp_only++] = l;
    }
    c->decoder_sparse_step = 0;
    return MOE8_OK;
  }
  if (fam->place == PLACE_TYPES_REQ)
    return moe8__fail(MOE8_ERR_PARSE, "%s: \"mlp_layer_types\" is missing (%s's configuration has no default)", file, fam->name);
  if (fam->place == PLACE_TYPES_KEY) { /* the list the class builds from dense_key: its first layers dense */
    int64_t n = 0;
    moe8_status st = get_int(root, file, fam->dense_key, fam->first_dense, 0, 1 << 20, &n);
    for (int64_t l = 0; st == MOE8_OK && l < n && l < c->num_layers; l++) {
      if (c->n_mlp_only >= MOE8_MAX_MLP_ONLY) return moe8__fail(MOE8_ERR_PARSE, "%s: \"%s\" = %lld: too many dense layers", file, fam->dense_key, (long long)n);
      c->mlp_only_layers[c->n_mlp_only++] = l;
    }
    c->decoder_sparse_step = -7;
    snprintf(c->dense_key, sizeof c->dense_key, "%s", fam->dense_key);
    c->first_k_dense_from_default = item(root, fam->dense_key) == NULL;
    return st;
  }
  if (fam->place == PLACE_TYPES_FKF) return get_dense_layers(root, file, fam->first_dense, c); /* first_k_dense_replace, moe_layer_freq */
  if (fam->place == PLACE_TYPES_FK) {
    /* the list the class builds: the first first_k_dense_replace layers dense */
    moe8_status st = get_int(root, file, "first_k_dense_replace", fam->first_dense, 0, 1 << 20, &c->first_k_dense_replace);
    c->first_k_dense_from_default = item(root, "first_k_dense_replace") == NULL;
    return st;
  }
  for (int64_t l = 0; l < fam->first_dense && l < c->num_layers; l++) c->mlp_only_layers[c->n_mlp_only++] = l;
  c->decoder_sparse_step = -1;
  return MOE8_OK;
}

/* A per-layer list the class trims when it holds num_nextn_predict_layers
** trailing entries: its first n entries (NULL when absent, null or empty:
** the class's default); shorter: refused. */
static moe8_status step_list(const cJSON *root, const char *file, const char *key, int64_t n, const cJSON **out) {
  const cJSON *v = item(root, key);
  *out = NULL;
  if (!v) return MOE8_OK;
  if (!cJSON_IsArray(v)) return moe8__fail(MOE8_ERR_PARSE, "%s: \"%s\" must be a list (one entry a layer)", file, key);
  if (cJSON_GetArraySize(v) == 0) return MOE8_OK;
  if (cJSON_GetArraySize(v) < n)
    return moe8__fail(MOE8_ERR_PARSE, "%s: \"%s\" has %d entries, fewer than num_hidden_layers = %lld", file, key, cJSON_GetArraySize(v),
                      (long long)n);
  *out = v->child;
  return MOE8_OK;
}

/* Step-3.5/3.7 (Step3p7TextConfig): the MoE layers (mlp_layer_types; else
** the legacy moe_layers_enum, a list of layer indices or a comma-separated
** string of them; else every layer from 3 on), the experts' limits per
** layer (swiglu_limits, swiglu_limits_shared: a number >= 0 or null, 0
** and null meaning no clamp), mlp_bias refused, the expert count's second
** alias num_local_experts. */
static moe8_status parse_step(const cJSON *root, const char *file, moe8_hf_config *c) {
  const int64_t n = c->num_layers;
  moe8_status st;
  int64_t e2 = 0;
  if ((st = get_int(root, file, "num_local_experts", c->layer.num_experts, 1, MOE8_MAX_EXPERTS, &e2)) != MOE8_OK) return st;
  if (e2 != c->layer.num_experts)
    return moe8__fail(MOE8_ERR_PARSE, "%s: \"num_local_experts\" = %lld disagrees with the expert count %lld (n_routed_experts, "
                      "moe_num_experts)", file, (long long)e2, (long long)c->layer.num_experts);
  bool mb = false;
  if ((st = get_bool(root, file, "mlp_bias", false, &mb)) != MOE8_OK) return st;
  if (mb) return moe8__fail(MOE8_ERR_UNSUPPORTED, "%s: \"mlp_bias\" is true: the experts' linear layers then have biases, which moe8 "
                            "does not hold", file);
  int64_t nextn = 0;
  if ((st = get_int(root, file, "num_nextn_predict_layers", 0, 0, 1 << 20, &nextn)) != MOE8_OK) return st;
  if (n > MOE8_MAX_MLP_ONLY)
    return moe8__fail(MOE8_ERR_PARSE, "%s: \"num_hidden_layers\" = %lld: moe8 reads Step's per-layer keys for at most %d layers", file,
                      (long long)n, MOE8_MAX_MLP_ONLY);
  c->n_mlp_only = 0;
  c->decoder_sparse_step = 0;
  const cJSON *types = item(root, "mlp_layer_types");
  if (types) {
    if (!cJSON_IsArray(types) || (cJSON_GetArraySize(types) != n && cJSON_GetArraySize(types) != n + nextn))
      return moe8__fail(MOE8_ERR_PARSE, "%s: \"mlp_layer_types\" must be a list of num_hidden_layers = %lld entries (or %lld with "
                        "the num_nextn_predict_layers ones) \"dense\" or \"sparse\"", file, (long long)n, (long long)(n + nextn));
    int64_t l = 0;
    for (const cJSON *e = types->child; e && l < n; e = e->next, l++) {
      const bool dense = cJSON_IsString(e) && !strcmp(e->valuestring, "dense");
      if (!dense && !(cJSON_IsString(e) && !strcmp(e->valuestring, "sparse")))
        return moe8__fail(MOE8_ERR_UNSUPPORTED, "%s: \"mlp_layer_types\"[%lld] is not \"dense\" or \"sparse\"", file, (long long)l);
      if (dense) c->mlp_only_layers[c->n_mlp_only++] = l;
    }
  } else {
    bool moe[MOE8_MAX_MLP_ONLY] = {0};
    const cJSON *en = item(root, "moe_layers_enum");
    if (!en) {
      for (int64_t l = 3; l < n; l++) moe[l] = true;
    } else if (cJSON_IsString(en)) {
      const char *s = en->valuestring;
      while (*s) {
        const char *comma = strchr(s, ','), *end = comma ? comma : s + strlen(s);
        char tok[32];
        const size_t len = (size_t)(end - s);
        if (len >= sizeof tok)
          return moe8__fail(MOE8_ERR_PARSE, "%s: \"moe_layers_enum\" must be comma-separated layer indices", file);
        memcpy(tok, s, len);
        tok[len] = 0;
        char *t = tok, *q;
        while (*t == ' ' || *t == '\t') t++;
        if (*t) {
          errno = 0;
          const long long v = strtoll(t, &q, 10);
          while (*q == ' ' || *q == '\t') q++;
          if (q == t || *q || errno)
            return moe8__fail(MOE8_ERR_PARSE, "%s: \"moe_layers_enum\" entry \"%s\" is not a layer index", file, t);
          if (v >= 0 && v < n) moe[v] = true; /* the class ignores indices outside the layers */
        }
        s = comma ? comma + 1 : end;
      }
    } else if (cJSON_IsArray(en)) {
      for (const cJSON *e = en->child; e; e = e->next) {
        if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) || !(fabs(e->valuedouble) < 1e15))
          return moe8__fail(MOE8_ERR_PARSE, "%s: a \"moe_layers_enum\" entry is not a layer index", file);
        if (e->valuedouble >= 0 && e->valuedouble < (double)n) moe[(int64_t)e->valuedouble] = true;
      }
    } else {
      return moe8__fail(MOE8_ERR_PARSE, "%s: \"moe_layers_enum\" must be a list of layer indices or a comma-separated string", file);
    }
    for (int64_t l = 0; l < n; l++)
      if (!moe[l]) c->mlp_only_layers[c->n_mlp_only++] = l;
  }
  /* the limits: the routed experts' and the shared expert's */
  c->layer.act = MOE8_ACT_SWIGLU_POST;
  c->layer.act_limit = c->layer.shared_act_limit = 0.0f;
  static const char *const keys[2] = {"swiglu_limits", "swiglu_limits_shared"};
  for (int k = 0; k < 2; k++) {
    const cJSON *e;
    if ((st = step_list(root, file, keys[k], n, &e)) != MOE8_OK) return st;
    float *dst = k ? c->shared_act_limits : c->act_limits;
    for (int64_t l = 0; l < n; l++, e = e ? e->next : NULL) {
      dst[l] = 0.0f;
      if (!e || cJSON_IsNull(e)) continue;
      if (!cJSON_IsNumber(e) || !(e->valuedouble >= 0 && e->valuedouble < 1e30))
        return moe8__fail(MOE8_ERR_PARSE, "%s: \"%s\"[%lld] must be a non-negative number or null (0 and null: no clamp)", file,
                          keys[k], (long long)l);
      dst[l] = (float)e->valuedouble;
      if (dst[l] > 0.0f) c->per_layer_limits = true;
    }
  }
  return MOE8_OK;
}

/* MiniMax-M3 (MiniMaxM3VLTextConfig): GPT-OSS's clamped SwiGLU without
** biases in the routed and the shared experts; the MoE layers by
** mlp_layer_types, else the legacy moe_layer_freq list (an entry per
** layer, true or non-zero: sparse), else every layer. */
static moe8_status parse_m3(const cJSON *root, const char *file, moe8_hf_config *c) {
  moe8_layer_config *L = &c->layer;
  const cJSON *a = item(root, "swiglu_alpha");
  if (a && (!cJSON_IsNumber(a) || !(a->valuedouble > 0 && a->valuedouble < 1e6)))
    return moe8__fail(MOE8_ERR_PARSE, "%s: \"swiglu_alpha\" must be a number in (0, 1e6)", file);
  L->act_alpha = (float)(a ? a->valuedouble : 1.702);
  moe8_status st = get_pos(root, file, "swiglu_limit", 7.0, false, " (the experts' clamp)", &L->act_limit);
  if (st != MOE8_OK) return st;
  L->act = MOE8_ACT_SWIGLU_CLAMP;
  c->n_mlp_only = 0;
  c->decoder_sparse_step = 0;
  const int64_t n = c->num_layers;
  const cJSON *types = item(root, "mlp_layer_types"), *freq = item(root, "moe_layer_freq");
  const cJSON *list = types ? types : freq;
  if (!list) return MOE8_OK;
  const char *key = types ? "mlp_layer_types" : "moe_layer_freq";
  if (!cJSON_IsArray(list) || cJSON_GetArraySize(list) != n)
    return moe8__fail(MOE8_ERR_PARSE, "%s: \"%s\" must be a list of num_hidden_layers = %lld entries%s", file, key, (long long)n,
                      types ? " \"dense\" or \"sparse\"" : " (1: MoE, 0: dense)");
  int64_t l = 0;
  for (const cJSON *e = list->child; e; e = e->next, l++) {
    bool dense;
    if (types) {
      dense = cJSON_IsString(e) && !strcmp(e->valuestring, "dense");
      if (!dense && !(cJSON_IsString(e) && !strcmp(e->valuestring, "sparse")))
        return moe8__fail(MOE8_ERR_UNSUPPORTED, "%s: \"mlp_layer_types\"[%lld] is not \"dense\" or \"sparse\"", file, (long long)l);
    } else {
      if (!cJSON_IsNumber(e) && !cJSON_IsBool(e))
        return moe8__fail(MOE8_ERR_PARSE, "%s: \"moe_layer_freq\"[%lld] must be a number or true/false", file, (long long)l);
      dense = cJSON_IsBool(e) ? cJSON_IsFalse(e) : e->valuedouble == 0;
    }
    if (!dense) continue;
    if (c->n_mlp_only >= MOE8_MAX_MLP_ONLY)
      return moe8__fail(MOE8_ERR_PARSE, "%s: \"%s\" has more than %d dense layers", file, key, MOE8_MAX_MLP_ONLY);
    c->mlp_only_layers[c->n_mlp_only++] = l;
  }
  return MOE8_OK;
}

/* Gemma-4's routed branch (docs/models.md): GeGLU experts, the router
** reading RMSNorm(h) ⊙ router.scale · D^-1/2, weights times
** router.per_expert_scale, the experts reading pre_feedforward_layernorm_2(h)
** and the branch's output post_feedforward_layernorm_2 of the routed sum;
** the norms' epsilon rms_norm_eps.  moe_intermediate_size has no default. */
static moe8_status parse_gemma(const cJSON *root, const char *file, const family *fam, moe8_hf_config *c) {
  moe8_layer_config *L = &c->layer;
  moe8_status st = want_str(root, file, "hidden_activation", "gelu_pytorch_tanh",
                            "moe8's Gemma-4 experts are GeGLU with the tanh form of GELU (gelu_pytorch_tanh)");
  if (st != MOE8_OK) return st;
  if (!item(root, "moe_intermediate_size"))
    return moe8__fail(MOE8_ERR_PARSE, "%s: \"moe_intermediate_size\" is missing (%s's configuration has no default)", file, fam->name);
  float eps = 1e-6f;
  if ((st = get_pos(root, file, "rms_norm_eps", 1e-6, true, " (the norms' epsilon)", &eps)) != MOE8_OK) return st;
  L->act = MOE8_ACT_GEGLU;
  L->router_norm = L->expert_scale = L->in_norm = L->out_norm = true;
  L->rms_eps = eps;
  L->router_norm_scale = (float)pow((double)L->hidden, -0.5); /* transformers: hidden_size ** -0.5, a Python float */
  L->norm_topk_prob = true;
  c->block_in_layer = true;
  return MOE8_OK;
}

/* PhiMoE: the sparsemixer router (MOE8_SCORE_SPARSEMIXER), which chooses 2
** experts whatever num_experts_per_tok says (transformers' sparsemixer
** does), weighted without renormalization; its threshold's
** router_jitter_noise (default 0.01); input_jitter_noise acts in training
** only. */
static moe8_status parse_phimoe(const cJSON *root, const char *file, moe8_hf_config *c) {
  moe8_layer_config *L = &c->layer;
  if (L->num_experts < 2)
    return moe8__fail(MOE8_ERR_PARSE, "%s: \"num_local_experts\" = %lld: the sparsemixer router chooses 2 experts", file,
                      (long long)L->num_experts);
  L->score = MOE8_SCORE_SPARSEMIXER;
  L->norm_topk_prob = false;
  L->top_k = 2;
  return get_pos(root, file, "router_jitter_noise", 0.01, true, " (the sparsemixer's threshold is twice it)", &L->router_jitter);
}

/* LongCat-Flash: zero_expert_num identity experts after the
** n_routed_experts (null: none), the top-k over all of them; the layer
** count is num_layers (each decoder layer holds one MoE between its two
** sublayers; the class's num_hidden_layers is twice it); the expert width
** expert_ffn_hidden_size (alias moe_intermediate_size).  router_bias true
** is refused: LongcatFlashTopkRouter then holds classifier.bias but its
** forward does not add it, and moe8 does not pick one. */
static moe8_status parse_longcat(const cJSON *root, const char *file, moe8_hf_config *c) {
  moe8_layer_config *L = &c->layer;
  moe8_status st;
  const cJSON *z = cJSON_GetObjectItemCaseSensitive(root, "zero_expert_num"); /* item() reads null as absent */
  if (z && cJSON_IsNull(z)) L->zero_experts = 0; /* the class's "or 0" */
  else if ((st = get_int(root, file, "zero_expert_num", 256, 0, MOE8_MAX_EXPERTS - L->num_experts, &L->zero_experts)) != MOE8_OK) return st;
  if (L->top_k > L->num_experts + L->zero_experts)
    return moe8__fail(MOE8_ERR_PARSE, "%s: \"moe_topk\" = %lld exceeds the %lld experts", file, (long long)L->top_k,
                      (long long)(L->num_experts + L->zero_experts));
  int64_t f2 = L->ffn;
  if ((st = get_int(root, file, "moe_intermediate_size", L->ffn, 1, (int64_t)1 << 30, &f2)) != MOE8_OK) return st;
  if (item(root, "moe_intermediate_size") && item(root, "expert_ffn_hidden_size") && f2 != L->ffn)
    return moe8__fail(MOE8_ERR_PARSE, "%s: \"moe_intermediate_size\" = %lld and its alias \"expert_ffn_hidden_size\" = %lld disagree", file,
                      (long long)f2, (long long)L->ffn);
  L->ffn = f2;
  int64_t nl = 28, nh = 0;
  if ((st = get_int(root, file, "num_hidden_layers", 56, 2, 1 << 21, &nh)) != MOE8_OK) return st;
  if ((st = get_int(root, file, "num_layers", item(root, "num_hidden_layers") ? nh / 2 : 28, 1, 1 << 20, &nl)) != MOE8_OK) return st;
  if (item(root, "num_layers") && item(root, "num_hidden_layers") && nh != 2 * nl)
    return moe8__fail(MOE8_ERR_PARSE, "%s: \"num_hidden_layers\" = %lld is not twice \"num_layers\" = %lld (each layer has two sublayers)",
                      file, (long long)nh, (long long)nl);
  if (nl < 1)
    return moe8__fail(MOE8_ERR_PARSE, "%s: \"num_hidden_layers\" = %lld: LongCat-Flash's layers hold two sublayers each (num_layers = "
                      "num_hidden_layers / 2 is 0)", file, (long long)nh);
  c->num_layers = nl;
  bool rb = false;
  if ((st = get_bool(root, file, "router_bias", false, &rb)) != MOE8_OK) return st;
  if (rb)
    return moe8__fail(MOE8_ERR_UNSUPPORTED, "%s: \"router_bias\" is true: transformers' LongcatFlashTopkRouter then holds a classifier bias "
                      "its forward does not add; moe8 does not pick one", file);
  return MOE8_OK;
}

/* DeepSeek-V4 (DeepseekV4Config): every layer MoE, those whose
** mlp_layer_types entry is "hash_moe" (the others "moe") routed by token
** id; the list trimmed to num_hidden_layers as the class does (shorter:
** refused); without it the first num_hash_layers (3) layers hash.  The
** experts' width under moe_intermediate_size or its alias
** intermediate_size; vocab_size (129280) the rows of the hash tables;
** mlp_bias true and a quantization_config expert_dtype other than fp8 (FP4
** experts) refused by name. */
static moe8_status parse_dsv4(const cJSON *root, const char *file, moe8_hf_config *c) {
  moe8_layer_config *L = &c->layer;
  const int64_t n = c->num_layers;
  moe8_status st;
  int64_t f2 = L->ffn;
  if ((st = get_int(root, file, "intermediate_size", L->ffn, 1, (int64_t)1 << 30, &f2)) != MOE8_OK) return st;
  if (item(root, "intermediate_size") && item(root, "moe_intermediate_size") && f2 != L->ffn)
    return moe8__fail(MOE8_ERR_PARSE, "%s: \"intermediate_size\" = %lld and its alias \"moe_intermediate_size\" = %lld disagree", file,
                      (long long)f2, (long long)L->ffn);
  L->ffn = L->shared_ffn = f2; /* the shared expert (DeepseekV4MLP) is intermediate_size wide: one, whatever n_shared_experts says */
  if ((st = get_int(root, file, "vocab_size", 129280, 1, (int64_t)1 << 31, &c->vocab_size)) != MOE8_OK) return st;
  bool mb = false;
  if ((st = get_bool(root, file, "mlp_bias", false, &mb)) != MOE8_OK) return st;
  if (mb) return moe8__fail(MOE8_ERR_UNSUPPORTED, "%s: \"mlp_bias\" is true: the shared expert's linear layers then have biases, which "
                            "moe8 does not hold", file);
  if ((st = want_str(root, file, "expert_dtype", "fp8", "FP4-packed experts are not a format moe8 reads")) != MOE8_OK) return st;
  const cJSON *q = item(root, "quantization_config");
  if (q && cJSON_IsObject(q) && (st = want_str(q, file, "expert_dtype", "fp8", "quantization_config.expert_dtype: FP4-packed experts are "
                                               "not a format moe8 reads")) != MOE8_OK)
    return st;
  if (n > MOE8_MAX_MLP_ONLY)
    return moe8__fail(MOE8_ERR_PARSE, "%s: \"num_hidden_layers\" = %lld: moe8 reads DeepSeek-V4's per-layer keys for at most %d layers", file,
                      (long long)n, MOE8_MAX_MLP_ONLY);
  c->top_layers = true;
  const cJSON *types = item(root, "mlp_layer_types");
  if (types) {
    if (!cJSON_IsArray(types) || cJSON_GetArraySize(types) < n)
      return moe8__fail(MOE8_ERR_PARSE, "%s: \"mlp_layer_types\" must be a list of num_hidden_layers = %lld entries \"hash_moe\" or \"moe\"",
                        file, (long long)n);
    int64_t l = 0;
    for (const cJSON *e = types->child; e && l < n; e = e->next, l++) {
      const bool hash = cJSON_IsString(e) && !strcmp(e->valuestring, "hash_moe");
      if (!hash && !(cJSON_IsString(e) && !strcmp(e->valuestring, "moe")))
        return moe8__fail(MOE8_ERR_UNSUPPORTED, "%s: \"mlp_layer_types\"[%lld] is not \"hash_moe\" or \"moe\" (DeepSeek-V4's layers are all MoE)",
                          file, (long long)l);
      c->hash_moe[l] = hash;
    }
    return MOE8_OK;
  }
  int64_t nh = 3;
  if ((st = get_int(root, file, "num_hash_layers", 3, 0, 1 << 20, &nh)) != MOE8_OK) return st;
  for (int64_t l = 0; l < n && l < nh; l++) c->hash_moe[l] = true;
  return MOE8_OK;
}

/* Nemotron-H (NemotronHConfig): the layers are layers_block_type's
** entries (its length is the layer count; num_hidden_layers is not read),
** else the legacy hybrid_override_pattern's letters (M mamba, E moe, *
** attention, - mlp), else the class's default list (linear_attention, moe,
** full_attention, mlp); a layer is MoE where its entry is "moe".  The
** experts' activation mlp_hidden_act (relu2, or relu); mlp_bias refused
** by name; moe_latent_size (null: none) the routed experts' latent width
** (fc1_latent_proj before them, fc2_latent_proj after). */
static moe8_status parse_nemotron(const cJSON *root, const char *file, moe8_hf_config *c) {
  moe8_layer_config *L = &c->layer;
  moe8_status st;
  const cJSON *a = item(root, "mlp_hidden_act");
  if (a && !cJSON_IsString(a)) return moe8__fail(MOE8_ERR_PARSE, "%s: \"mlp_hidden_act\" must be a string", file);
  if (a && strcmp(a->valuestring, "relu2") && strcmp(a->valuestring, "relu"))
    return moe8__fail(MOE8_ERR_UNSUPPORTED, "%s: \"mlp_hidden_act\" is \"%.40s\": moe8 runs Nemotron-H's ungated experts with relu2 or "
                      "relu", file, a->valuestring);
  L->act = a && !strcmp(a->valuestring, "relu") ? MOE8_ACT_RELU : MOE8_ACT_RELU2;
  bool mb = false;
  if ((st = get_bool(root, file, "mlp_bias", false, &mb)) != MOE8_OK) return st;
  if (mb) return moe8__fail(MOE8_ERR_UNSUPPORTED, "%s: \"mlp_bias\" is true: the experts' linear layers then have biases, which moe8 "
                            "does not hold", file);
  if ((st = get_int(root, file, "moe_latent_size", 0, 1, (int64_t)1 << 30, &L->latent)) != MOE8_OK) return st;
  static const char *const pat = "ME*-";
  static const char *const names[6] = {"linear_attention", "moe", "full_attention", "mlp", "mamba", "attention"};
  const cJSON *types = item(root, "layers_block_type"), *hp = item(root, "hybrid_override_pattern");
  if (!types) types = item(root, "layer_types"); /* the class's attribute map */
  bool moe[MOE8_MAX_MLP_ONLY];
  int64_t n = 0;
  if (types) {
    if (!cJSON_IsArray(types) || cJSON_GetArraySize(types) < 1)
      return moe8__fail(MOE8_ERR_PARSE, "%s: \"layers_block_type\" must be a list of layer types", file);
    for (const cJSON *e = types->child; e; e = e->next, n++) {
      int k = -1;
      for (int i = 0; i < 6 && cJSON_IsString(e); i++)
        if (!strcmp(e->valuestring, names[i])) k = i;
      if (k < 0)
        return moe8__fail(MOE8_ERR_PARSE, "%s: \"layers_block_type\"[%lld] is not one of linear_attention, moe, full_attention, mlp "
                          "(or mamba, attention)", file, (long long)n);
      if (n >= MOE8_MAX_MLP_ONLY)
        return moe8__fail(MOE8_ERR_PARSE, "%s: \"layers_block_type\": moe8 reads at most %d layers", file, MOE8_MAX_MLP_ONLY);
      moe[n] = k == 1;
    }
    c->decoder_sparse_step = -4;
  } else if (hp) {
    if (!cJSON_IsString(hp) || !hp->valuestring[0])
      return moe8__fail(MOE8_ERR_PARSE, "%s: \"hybrid_override_pattern\" must be a string of layer letters (M, E, *, -)", file);
    for (const char *q = hp->valuestring; *q; q++, n++) {
      if (!strchr(pat, *q))
        return moe8__fail(MOE8_ERR_PARSE, "%s: \"hybrid_override_pattern\"[%lld] is '%c', not a layer letter (M, E, *, -)", file,
                          (long long)n, *q);
      if (n >= MOE8_MAX_MLP_ONLY)
        return moe8__fail(MOE8_ERR_PARSE, "%s: \"hybrid_override_pattern\": moe8 reads at most %d layers", file, MOE8_MAX_MLP_ONLY);
      moe[n] = *q == 'E';
    }
    c->decoder_sparse_step = -5;
  } else {
    for (n = 0; n < 4; n++) moe[n] = n == 1;
    c->decoder_sparse_step = -6;
  }
  c->num_layers = n;
  c->n_mlp_only = 0;
  for (int64_t l = 0; l < n; l++)
    if (!moe[l]) c->mlp_only_layers[c->n_mlp_only++] = l;
  snprintf(c->layers_root, sizeof c->layers_root, "backbone.layers.");
  return MOE8_OK;
}

/* moe8_quantization: what moe8 quantize recorded (docs/files.md). */
static moe8_status parse_moe8_quantization(const cJSON *root, const char *file, moe8_hf_config *c) {
  const cJSON *mq = item(root, "moe8_quantization");
  if (!mq) return MOE8_OK;
  if (!cJSON_IsObject(mq)) return moe8__fail(MOE8_ERR_PARSE, "%s: \"moe8_quantization\" must be an object", file);
  int64_t pk = 0;
  moe8_status st = get_int(mq, file, "tile_size", 0, 0, (int64_t)1 << 30, &c->moe8_tile);
  if (st == MOE8_OK) st = get_int(mq, file, "packed_layout", 0, 0, 1, &pk);
  if (st != MOE8_OK) return st;
  c->moe8_packed = (int)pk;
  const cJSON *wq = item(mq, "weight_qtype");
  if (wq && !cJSON_IsString(wq)) return moe8__fail(MOE8_ERR_PARSE, "%s: moe8_quantization.weight_qtype must be a string", file);
  if (wq && !strcmp(wq->valuestring, "mxfp4")) {
    if (c->arch == MOE8_ARCH_GPT_OSS)
      return moe8__fail(MOE8_ERR_UNSUPPORTED, "%s: moe8_quantization mxfp4 is moe8's file for the other families (GPT-OSS's own files "
                        "hold MXFP4 already)", file);
    c->mxfp4 = true; /* moe8's MXFP4 experts: P experts.{gate_up,down}_proj_{blocks,scales} */
  }
  return MOE8_OK;
}

/* SwitchTransformers: d_model (alias hidden_size), num_layers (alias
** num_hidden_layers) encoder blocks and num_decoder_layers (null: as many)
** decoder blocks, each stack's sparse blocks by its num_sparse_*_layers
** (SwitchTransformersConfig's encoder_sparse_step and decoder_sparse_step,
** the rule of SwitchTransformersStack); num_experts, d_ff, expert_capacity;
** top-1 of the softmax in f32, weighted by its probability; the router's
** bias with router_bias; experts wo(act(wi(x))), act dense_act_fn (relu or
** relu2: moe8's ungated experts); router_dtype float32 only (the others
** round the router's input and logits); router_jitter_noise acts in
** training only. */
static moe8_status parse_switch(const cJSON *root, const char *file, const family *fam, moe8_hf_config *c) {
  moe8_status st;
  moe8_layer_config *L = &c->layer;
  char kk[64];
#define TRY(x) do { if ((st = (x)) != MOE8_OK) return st; } while (0)
  TRY(pick_key(root, file, "d_model|hidden_size", "", kk));
  TRY(get_int(root, file, kk, fam->hidden, 1, (int64_t)1 << 30, &L->hidden));
  int64_t ne = 0, nd = 0, se = 0, sd = 0;
  TRY(pick_key(root, file, "num_layers|num_hidden_layers", "", kk));
  TRY(get_int(root, file, kk, fam->layers, 1, 1 << 19, &ne));
  TRY(get_int(root, file, "num_decoder_layers", ne, 0, 1 << 19, &nd));
  TRY(get_int(root, file, "num_sparse_encoder_layers", 3, 0, 1 << 19, &se));
  TRY(get_int(root, file, "num_sparse_decoder_layers", 3, 0, 1 << 19, &sd));
  TRY(get_int(root, file, "num_experts", fam->experts, 1, MOE8_MAX_EXPERTS, &L->num_experts));
  TRY(get_int(root, file, "d_ff", fam->ffn, 1, (int64_t)1 << 30, &L->ffn));
  TRY(get_int(root, file, "expert_capacity", 64, 0, (int64_t)1 << 40, &L->expert_capacity));
  if (L->expert_capacity == 0) /* every token dropped: the block is 0; moe8's 0 means no capacity */
    return moe8__fail(MOE8_ERR_UNSUPPORTED, "%s: \"expert_capacity\" is 0: the block drops every token (its output is 0)", file);
  TRY(want_str(root, file, "dense_act_fn", "relu|relu2", "moe8's ungated experts compute relu or relu2 (SwitchTransformersDenseActDense's "
               "ACT2FN[dense_act_fn])"));
  TRY(want_str(root, file, "router_dtype", "float32", "moe8's router computes in float32 (float16 and bfloat16 round its input and "
               "logits)"));
  const cJSON *act = item(root, "dense_act_fn");
  L->act = act && !strcmp(act->valuestring, "relu2") ? MOE8_ACT_RELU2 : MOE8_ACT_RELU;
  TRY(get_bool(root, file, "router_bias", false, &L->router_bias));
  L->top_k = 1;
  L->score = MOE8_SCORE_SOFTMAX;
  L->norm_topk_prob = false;
  L->routed_scaling_factor = 1.0f;
  c->encdec = true;
  c->enc_layers = ne;
  c->num_layers = ne + nd;
  c->sparse_layers[0] = se;
  c->sparse_layers[1] = sd;
  c->sparse_step[0] = se > 0 ? ne / se : ne;
  c->sparse_step[1] = sd > 0 ? nd / sd : nd;
  return MOE8_OK;
#undef TRY
}

/* Zaya (ZayaConfig, ZayaRouter): num_experts_per_tok must be 1 (the
** class refuses another); the router is an MLP of width
** router_hidden_size (256) whose RMSNorm takes rms_norm_eps (1e-5), over
** num_experts + 1 classes, the last one the skip expert; the top-1 of the
** softmax plus the router's balancing_biases (the selection bias, read
** from the files), weighted by its probability (no renormalization).
** Every layer is MoE (layer_types only chooses the attention); the loader
** turns router_state on for the layers after the first. */
static moe8_status parse_zaya(const cJSON *root, const char *file, moe8_hf_config *c) {
  moe8_layer_config *L = &c->layer;
  moe8_status st;
  if (L->top_k != 1)
    return moe8__fail(MOE8_ERR_UNSUPPORTED, "%s: \"num_experts_per_tok\" = %lld: Zaya's router takes 1 expert per token (ZayaConfig "
                      "refuses another)", file, (long long)L->top_k);
  if ((st = get_int(root, file, "router_hidden_size", 256, 1, (int64_t)1 << 24, &L->router_mlp)) != MOE8_OK) return st;
  if ((st = get_pos(root, file, "rms_norm_eps", 1e-5, true, " (the router's RMSNorm epsilon)", &L->rms_eps)) != MOE8_OK) return st;
  if (L->num_experts + 1 > MOE8_MAX_EXPERTS)
    return moe8__fail(MOE8_ERR_PARSE, "%s: \"num_experts\" = %lld: with the skip expert the router's classes exceed moe8's %d", file,
                      (long long)L->num_experts, MOE8_MAX_EXPERTS);
  L->skip_experts = 1;
  c->has_bias = L->use_selection_bias = true; /* balancing_biases [E + 1] */
  return MOE8_OK;
}

/* Doge (DogeConfig, DogeCDMoE when is_moe): hidden_size, num_hidden_layers,
** num_experts (up to MOE8_MAX_PK_EXPERTS), num_experts_per_tok (at most
** the floor(sqrt(num_experts))² candidates: transformers' topk of them),
** norm_topk_prob; the experts single neurons of hidden_act (silu only:
** moe8's product-key experts), the dense SwiGLU (the layer's shared
** expert) of width intermediate_size, no biases (mlp_bias).  is_moe false
** is a dense DogeMLP: no MoE layer at all.  output_router_logits and
** router_aux_loss_coef act in training only. */
static moe8_status parse_doge(const cJSON *root, const char *file, const family *fam, moe8_hf_config *c) {
  moe8_status st;
  moe8_layer_config *L = &c->layer;
#define TRY(x) do { if ((st = (x)) != MOE8_OK) return st; } while (0)
  bool on = false, bias = false;
  TRY(get_bool(root, file, "is_moe", false, &on));
  if (!on)
    return moe8__fail(MOE8_ERR_UNSUPPORTED, "%s: \"is_moe\" is false (or absent: DogeConfig's default): the model is dense (DogeMLP), its "
                      "layers have no MoE block", file);
  TRY(want_str(root, file, "hidden_act", "silu", "moe8's product-key experts and Doge's dense MLP compute silu"));
  TRY(get_bool(root, file, "mlp_bias", false, &bias));
  if (bias)
    return moe8__fail(MOE8_ERR_UNSUPPORTED, "%s: \"mlp_bias\" is true: the dense MLP's projections then have biases, which moe8 does not "
                      "hold", file);
  const int64_t BIG = (int64_t)1 << 30;
  TRY(get_int(root, file, "hidden_size", fam->hidden, 1, BIG, &L->hidden));
  TRY(get_int(root, file, "num_hidden_layers", fam->layers, 1, 1 << 20, &c->num_layers));
  TRY(get_int(root, file, "num_experts", fam->experts, 1, MOE8_MAX_PK_EXPERTS, &L->num_experts));
  TRY(get_int(root, file, "num_experts_per_tok", fam->top_k, 1, MOE8_MAX_EXPERTS, &L->top_k));
  TRY(get_int(root, file, "intermediate_size", fam->ffn, 1, BIG, &L->shared_ffn));
  TRY(get_bool(root, file, "norm_topk_prob", fam->norm, &L->norm_topk_prob));
  int64_t n = 1;
  while ((n + 1) * (n + 1) <= L->num_experts) n++;
  if (L->top_k > n * n)
    return moe8__fail(MOE8_ERR_PARSE, "%s: \"num_experts_per_tok\" = %lld exceeds the %lld candidates of \"num_experts\" = %lld "
                      "(floor(sqrt(num_experts))^2 = %lld x %lld product keys)", file, (long long)L->top_k, (long long)(n * n),
                      (long long)L->num_experts, (long long)n, (long long)n);
  L->ffn = 1;
  L->act = MOE8_ACT_SILU;
  L->product_keys = true;
  L->score = MOE8_SCORE_SOFTMAX;
  L->routed_scaling_factor = 1.0f;
  return MOE8_OK;
#undef TRY
}

/* NLLB-MoE (NllbMoeConfig), as transformers 4.x's NllbMoeTop2Router and
** NllbMoeSparseMLP compute it in eval mode: d_model (alias hidden_size),
** encoder_layers + decoder_layers, each stack's sparse layers by its
** encoder_sparse_step / decoder_sparse_step ((i + 1) % step == 0; step <=
** 0: none), num_experts, encoder_ffn_dim (decoder_ffn_dim must be equal:
** one width per model); top-2 of the softmax in f32 (the second the best
** logit but the first's), the router's bias with router_bias; the
** capacity ceil(moe_eval_capacity_token_fraction · tokens) over all the
** tokens of a forward (capacity_ranked; 0 or less: expert_capacity, whose
** null leaves it to the first call's tokens: refused), the first choices
** queued before the second ones, the kept pair renormalized by max(Σ,
** eps) after the drop, times 1 - moe_token_dropout (eval's scaling);
** experts fc2(act(fc1(x))) with their biases, activation_function relu or
** relu2.  Refused by name: second_expert_policy other than "all" (random
** at inference), normalize_router_prob_before_dropping and
** batch_prioritized_routing true (not implemented), router_dtype other
** than float32. */
static moe8_status parse_nllb(const cJSON *root, const char *file, const family *fam, moe8_hf_config *c) {
  moe8_status st;
  moe8_layer_config *L = &c->layer;
  char kk[64];
#define TRY(x) do { if ((st = (x)) != MOE8_OK) return st; } while (0)
  TRY(pick_key(root, file, "d_model|hidden_size", "", kk));
  TRY(get_int(root, file, kk, fam->hidden, 1, (int64_t)1 << 30, &L->hidden));
  int64_t ne = 0, nd = 0, se = 0, sd = 0, fd = 0;
  TRY(get_int(root, file, "encoder_layers", fam->layers, 1, 1 << 19, &ne));
  TRY(get_int(root, file, "decoder_layers", 12, 0, 1 << 19, &nd));
  TRY(get_int(root, file, "encoder_sparse_step", 4, -(1 << 19), 1 << 19, &se));
  TRY(get_int(root, file, "decoder_sparse_step", 4, -(1 << 19), 1 << 19, &sd));
  TRY(get_int(root, file, "num_experts", fam->experts, 2, MOE8_MAX_EXPERTS, &L->num_experts));
  TRY(get_int(root, file, "encoder_ffn_dim", fam->ffn, 1, (int64_t)1 << 30, &L->ffn));
  TRY(get_int(root, file, "decoder_ffn_dim", fam->ffn, 1, (int64_t)1 << 30, &fd));
  if (fd != L->ffn)
    return moe8__fail(MOE8_ERR_UNSUPPORTED, "%s: \"decoder_ffn_dim\" (%lld) differs from \"encoder_ffn_dim\" (%lld): moe8 holds one expert "
                      "width per model", file, (long long)fd, (long long)L->ffn);
  TRY(want_str(root, file, "activation_function", "relu|relu2", "moe8's ungated experts compute relu or relu2 (NllbMoeDenseActDense's "
               "ACT2FN[activation_function])"));
  TRY(want_str(root, file, "router_dtype", "float32", "moe8's router computes in float32 (float16 and bfloat16 round its input and "
               "logits)"));
  TRY(want_str(root, file, "second_expert_policy", "all", "moe8 computes the policy \"all\" (the second expert always queued); "
               "\"sampling\" and \"random\" draw random numbers at inference too"));
  bool flag = false;
  TRY(get_bool(root, file, "normalize_router_prob_before_dropping", false, &flag));
  if (flag)
    return moe8__fail(MOE8_ERR_UNSUPPORTED, "%s: \"normalize_router_prob_before_dropping\" is true: not implemented (moe8 renormalizes "
                      "the kept pair after the drop, the default)", file);
  TRY(get_bool(root, file, "batch_prioritized_routing", false, &flag));
  if (flag)
    return moe8__fail(MOE8_ERR_UNSUPPORTED, "%s: \"batch_prioritized_routing\" is true: not implemented (moe8 queues the tokens in their "
                      "order, the default)", file);
  const cJSON *fr = item(root, "moe_eval_capacity_token_fraction"), *dr = item(root, "moe_token_dropout");
  if (fr && (!cJSON_IsNumber(fr) || !(fr->valuedouble > -1e30 && fr->valuedouble < 1e30)))
    return moe8__fail(MOE8_ERR_PARSE, "%s: \"moe_eval_capacity_token_fraction\" must be a finite number", file);
  if (dr && (!cJSON_IsNumber(dr) || !(dr->valuedouble >= 0.0 && dr->valuedouble < 1.0)))
    return moe8__fail(MOE8_ERR_PARSE, "%s: \"moe_token_dropout\" must be a number in [0, 1)", file);
  const double frac = fr ? fr->valuedouble : 1.0, drop = dr ? dr->valuedouble : 0.2;
  if (frac > 0.0) {
    L->capacity_fraction = frac;
  } else {
    const cJSON *ec = item(root, "expert_capacity");
    if (!ec && cJSON_GetObjectItemCaseSensitive(root, "expert_capacity"))
      return moe8__fail(MOE8_ERR_UNSUPPORTED, "%s: \"moe_eval_capacity_token_fraction\" is %g and \"expert_capacity\" null: the router "
                        "keeps the capacity of its first call (2 x ceil(tokens / num_experts)) for every later one; not implemented",
                        file, frac);
    TRY(get_int(root, file, "expert_capacity", 64, 1, (int64_t)1 << 40, &L->expert_capacity));
  }
  const cJSON *act = item(root, "activation_function");
  L->act = act && !strcmp(act->valuestring, "relu2") ? MOE8_ACT_RELU2 : MOE8_ACT_RELU;
  TRY(get_bool(root, file, "router_bias", false, &L->router_bias));
  L->expert_bias = true;
  L->capacity_ranked = true;
  L->top_k = 2;
  L->score = MOE8_SCORE_SOFTMAX;
  L->norm_topk_prob = false;
  L->routed_scaling_factor = (float)(1.0 - drop);
  c->encdec = c->nllb = true;
  c->enc_layers = ne;
  c->num_layers = ne + nd;
  c->sparse_step[0] = se;
  c->sparse_step[1] = sd;
  return MOE8_OK;
#undef TRY
}

/* DBRX's keys: d_model and n_layers at the top, the MoE's under
** ffn_config (DbrxFFNConfig's defaults when absent). */
static moe8_status parse_dbrx(const cJSON *root, const char *file, const family *fam, moe8_hf_config *c) {
  moe8_status st;
  moe8_layer_config *L = &c->layer;
  char kk[64], fn[600];
#define TRY(x) do { if ((st = (x)) != MOE8_OK) return st; } while (0)
  TRY(pick_key(root, file, "d_model|hidden_size", "", kk));
  TRY(get_int(root, file, kk, fam->hidden, 1, (int64_t)1 << 30, &L->hidden));
  TRY(pick_key(root, file, "n_layers|num_hidden_layers", "", kk));
  TRY(get_int(root, file, kk, fam->layers, 1, 1 << 20, &c->num_layers));
  const cJSON *fc = cJSON_GetObjectItemCaseSensitive(root, "ffn_config");
  if (fc && !cJSON_IsNull(fc) && !cJSON_IsObject(fc)) return moe8__fail(MOE8_ERR_PARSE, "%s: \"ffn_config\" must be an object", file);
  if (fc && cJSON_IsNull(fc)) fc = NULL;
  snprintf(fn, sizeof fn, "%s ffn_config", file);
  TRY(get_int(fc, fn, "moe_num_experts", fam->experts, 1, MOE8_MAX_EXPERTS, &L->num_experts));
  TRY(get_int(fc, fn, "moe_top_k", fam->top_k, 1, MOE8_MAX_EXPERTS, &L->top_k));
  TRY(get_int(fc, fn, "ffn_hidden_size", fam->ffn, 1, (int64_t)1 << 30, &L->ffn));
  if (L->top_k > L->num_experts)
    return moe8__fail(MOE8_ERR_PARSE, "%s: \"moe_top_k\" = %lld exceeds \"moe_num_experts\" = %lld", fn, (long long)L->top_k,
                      (long long)L->num_experts);
  const cJSON *act = fc ? item(fc, "ffn_act_fn") : NULL;
  if (act && !cJSON_IsObject(act)) return moe8__fail(MOE8_ERR_PARSE, "%s: \"ffn_act_fn\" must be an object {\"name\": ...}", fn);
  snprintf(fn, sizeof fn, "%s ffn_config.ffn_act_fn", file);
  if (act) TRY(want_str(act, fn, "name", "silu", "moe8's experts are SwiGLU with silu"));
  /* moe_normalize_expert_weights: absent 1.0 (the sum), null none, else the p of the p-norm */
  snprintf(fn, sizeof fn, "%s ffn_config", file);
  const cJSON *p = fc ? cJSON_GetObjectItemCaseSensitive(fc, "moe_normalize_expert_weights") : NULL;
  L->score = MOE8_SCORE_SOFTMAX;
  L->routed_scaling_factor = 1.0f;
  L->norm_topk_prob = !(p && cJSON_IsNull(p));
  if (p && !cJSON_IsNull(p)) {
    if (!cJSON_IsNumber(p) || !(p->valuedouble > 0 && p->valuedouble < 1e30))
      return moe8__fail(MOE8_ERR_PARSE, "%s: \"moe_normalize_expert_weights\" must be a positive finite number (the p of the "
                        "p-norm) or null", fn);
    L->norm_p = (float)p->valuedouble == 1.0f ? 0.0f : (float)p->valuedouble;
  }
  /* moe_jitter_eps scales the router's input by noise in training only (DbrxRouter): not read */
  snprintf(c->layers_root, sizeof c->layers_root, "transformer.blocks.");
  c->stacked_experts = true;
  c->moe_layer_freq = c->decoder_sparse_step = 1;
#undef TRY
  return MOE8_OK;
}

static moe8_status parse_root(const cJSON *root, const char *file, const char *override, moe8_hf_config *c) {
  moe8_status st;
#define TRY(x) do { if ((st = (x)) != MOE8_OK) return st; } while (0)
  if (!cJSON_IsObject(root)) return moe8__fail(MOE8_ERR_PARSE, "%s: not a JSON object", file);
  const cJSON *mt = item(root, "model_type");
  if (mt && !cJSON_IsString(mt)) return moe8__fail(MOE8_ERR_PARSE, "%s: \"model_type\" must be a string", file);
  const char *type = override ? override : mt ? mt->valuestring : NULL;
  /* An override runs a compatible model as a known family; a family whose
  ** block is known to compute something else is refused even then, never
  ** run silently wrong (docs/models.md). */
  static const struct { const char *type, *why; } k_differs[] = {
    {"llama4", "it is the multimodal model: run it without the override (moe8 reads its text_config)"},
    {"qwen3_vl_moe", "it is the multimodal model: run it without the override (moe8 reads its text_config)"},
    {"qwen3_5_moe", "it is the multimodal model: run it without the override (moe8 reads its text_config)"},
    {"glm4v_moe", "it is the multimodal model: run it without the override (moe8 reads its text_config)"},
    {"unlimited_ocr", "it is the multimodal model: run it without the override (moe8 reads its text_config)"},
    {"aria", "it is the multimodal model: run it without the override (moe8 reads its text_config)"},
    {"ernie4_5_vl_moe", "it is the multimodal model: run it without the override (moe8 reads its text_config)"},
    {"gemma4", "it is the multimodal model: run it without the override (moe8 reads its text_config)"},
    {"diffusion_gemma", "it is the multimodal model: run it without the override (moe8 reads its text_config)"},
    {"glm5_next", "it is the multimodal model: run it without the override (moe8 reads its text_config)"},
    {"hy_v4_vl", "it is the multimodal model: run it without the override (moe8 reads its text_config)"},
    {"inkling_mm_model", "it is the multimodal model: run it without the override (moe8 reads its text_config)"},
    {"inkling2", "it is the multimodal model: run it without the override (moe8 reads its text_config)"},
    {"inkling2_loop", "it is the multimodal model: run it without the override (moe8 reads its text_config)"},
    {"minimax_m3_vl", "it is the multimodal model: run it without the override (moe8 reads its text_config)"},
    {"mistral_large4", "it is the multimodal model: run it without the override (moe8 reads its text_config)"},
    {"kimi_k25", "it is the multimodal model: run it without the override (moe8 reads its text_config)"},
    {"muse_spark", "it is the multimodal model: run it without the override (moe8 reads its text_config)"},
    {"nemo_speechlm", "it is the multimodal model: run it without the override (moe8 reads its text_config)"},
    {"nemotron_h_omni", "it is the multimodal model: run it without the override (moe8 reads its text_config)"},
    {"step3p7", "it is the multimodal model: run it without the override (moe8 reads its text_config)"},
    /* transformers 5.24 types with experts or a router that are not an MoE
    ** language model's block */
    {"openai_privacy_filter", "it is a token-classification encoder (PII tagging), not a language model's MoE block"},
    {"vitpose_backbone", "it is a vision (pose) backbone whose experts are per-dataset heads, not an MoE block"},
    {"granite_docling", "it has no MoE block (its router scores image tiles)"},
    {"gemma4_unified", "it has no MoE block"},
    {"muse_glimmer", "it has no MoE block"},
    {"gemma4_assistant", "it is a speculative-decoding drafter with no MoE block of its own"},
    {"gemma4_unified_assistant", "it is a speculative-decoding drafter with no MoE block of its own"},
  };
  if (mt)
    for (size_t i = 0; i < sizeof k_differs / sizeof k_differs[0]; i++)
      if (!strcmp(mt->valuestring, k_differs[i].type) && (override || strncmp(k_differs[i].why, "it is the multimodal", 20))) {
        if (override)
          return moe8__fail(MOE8_ERR_UNSUPPORTED, "%s: \"model_type\" is \"%s\", which moe8 does not run even as %s: %s", file,
                            k_differs[i].type, override, k_differs[i].why);
        return moe8__fail(MOE8_ERR_UNSUPPORTED, "%s: \"model_type\" is \"%s\", which moe8 does not run: %s", file, k_differs[i].type,
                          k_differs[i].why);
      }
  /* Families whose block is their own: run as another family (an
  ** override) they would compute something else. */
  static const struct { const char *type, *why; } k_own[] = {
    {"phimoe", "its router is sparsemixer (a different selection and weighting), not softmax top-k"},
    {"longcat_flash", "it has zero-computation (identity) experts (zero_expert_num)"},
    {"switch_transformers", "its experts drop tokens past expert_capacity, and its layers are an encoder's and a decoder's"},
    {"zaya", "its router is an MLP fed the previous layer's router state, with a skip expert"},
    {"doge", "its experts are single neurons chosen by product keys (two halves of the router's keys)"},
    {"nllb-moe", "its top-2 router drops slots past a capacity over all tokens and renormalizes the pair, its experts are biased ReLU "
                 "MLPs, and its layers are an encoder's and a decoder's"},
  };
  for (size_t i = 0; mt && override && i < sizeof k_own / sizeof k_own[0]; i++)
    if (!strcmp(mt->valuestring, k_own[i].type) && strcmp(override, k_own[i].type))
      return moe8__fail(MOE8_ERR_UNSUPPORTED, "%s: \"model_type\" is \"%s\", which moe8 does not run as %s: %s", file, k_own[i].type,
                        override, k_own[i].why);
  /* A multimodal model as released (Llama-4 Scout and Maverick, Qwen3-VL,
  ** ...): its text model's keys are its text_config; its tensors are found
  ** under the language model's root (moe8_model_open). */
  for (size_t w = 0; !override && type && w < sizeof k_wrappers / sizeof k_wrappers[0]; w++) {
    if (strcmp(type, k_wrappers[w].type)) continue;
    const cJSON *tc = item(root, "text_config");
    /* Nemotron-3 Nano Omni as released: the text model under the legacy
    ** llm_config (its class reads it when text_config is absent) */
    const bool legacy = !strcmp(type, "nemotron_h_omni");
    if (!tc && legacy) tc = item(root, "llm_config");
    if (!cJSON_IsObject(tc))
      return moe8__fail(MOE8_ERR_PARSE, "%s: \"model_type\" is \"%s\" but \"text_config\"%s is missing or not an object", file, type,
                        legacy ? " (or \"llm_config\")" : "");
    const cJSON *q = item(root, "quantization_config");
    if (q) {
      const cJSON *m = cJSON_IsObject(q) ? item(q, "quant_method") : NULL;
      return moe8__fail(MOE8_ERR_UNSUPPORTED, "%s: quantization_config.quant_method \"%.40s\": moe8 reads %s's float checkpoints "
                        "(bf16, f16, f32) only", file, cJSON_IsString(m) ? m->valuestring : "?", type);
    }
    moe8_status st2 = parse_root(tc, file, k_wrappers[w].text, c);
    if (st2 == MOE8_OK) st2 = parse_moe8_quantization(root, file, c); /* moe8 quantize records it at the top */
    if (st2 == MOE8_OK) snprintf(c->model_type, sizeof c->model_type, "%s (text_config)", type);
    return st2;
  }
  const family *fam = NULL;
  /* Model types that are one of the families under another name: Kimi-K2
  ** is the DeepSeek-V3 architecture (its config class is DeepSeek-V3's,
  ** the same keys and defaults). */
  if (type && !strcmp(type, "kimi_k2")) type = "deepseek_v3";
  /* DeepSeek-V3.2: V3's MoE block and keys (what changed is the attention) */
  if (type && !strcmp(type, "deepseek_v32")) type = "deepseek_v3";
  if (type) {
    for (size_t i = 0; i < sizeof k_families / sizeof k_families[0]; i++)
      if (!strcmp(type, k_families[i].name)) fam = &k_families[i];
    if (!fam) {
      char names[2048] = "";
      for (size_t i = 0; i < sizeof k_families / sizeof k_families[0]; i++)
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "", k_families[i].name);
      for (size_t i = 0; i < sizeof k_wrappers / sizeof k_wrappers[0]; i++)
        snprintf(names + strlen(names), sizeof names - strlen(names), ", %s", k_wrappers[i].type);
      return moe8__fail(MOE8_ERR_UNSUPPORTED, "%s: %s \"%.60s\" is not a family moe8 runs (%s, deepseek_v32, kimi_k2)%s", file,
                        override ? "the family override" : "\"model_type\"", type, names,
                        override ? "" : "; a compatible model can be run as one of them with an explicit override (--arch)");
    }
  } else if (item(root, "n_routed_experts")) fam = &k_families[3];
  else if (item(root, "num_local_experts")) fam = &k_families[2];
  else if (item(root, "shared_expert_intermediate_size")) fam = &k_families[0];
  else if (item(root, "num_experts")) fam = &k_families[1];
  else return moe8__fail(MOE8_ERR_PARSE, "%s: no \"model_type\" and no expert count (num_experts, num_local_experts or n_routed_experts)", file);
  c->arch = fam->arch;
  snprintf(c->model_type, sizeof c->model_type, "%s", mt ? mt->valuestring : fam->name);
  const bool ds = fam->arch == MOE8_ARCH_DEEPSEEK_V3, v2 = fam->arch == MOE8_ARCH_DEEPSEEK_V2;
  const bool qwen = fam->arch == MOE8_ARCH_QWEN2_MOE || fam->arch == MOE8_ARCH_QWEN3_MOE;
  const int64_t BIG = (int64_t)1 << 30;
  moe8_layer_config *L = &c->layer;
  if (fam->dbrx) {
    TRY(parse_dbrx(root, file, fam, c));
    goto tail;
  }
  if (fam->switch_t) {
    TRY(parse_switch(root, file, fam, c));
    goto tail;
  }
  if (fam->doge) {
    TRY(parse_doge(root, file, fam, c));
    goto tail;
  }
  if (fam->nllb) {
    TRY(parse_nllb(root, file, fam, c));
    goto tail;
  }
  if (fam->gemma && fam->moe_flag) { /* a dense Gemma-4 has no MoE layer at all */
    bool on = false;
    TRY(get_bool(root, file, fam->moe_flag, false, &on));
    if (!on)
      return moe8__fail(MOE8_ERR_UNSUPPORTED, "%s: \"%s\" is false (or absent: %s's default): the model is dense, its decoder layers "
                        "have no MoE branch", file, fam->moe_flag, fam->name);
  }
  if (!fam->step && !fam->softcap && !fam->m3 && !fam->gemma && !fam->nemotron)
    TRY(want_str(root, file, fam->act_key ? fam->act_key : "hidden_act", "silu", "moe8's experts are SwiGLU with silu"));
  L->out_bias = fam->out_bias;
  TRY(get_int(root, file, "hidden_size", fam->hidden, 1, BIG, &L->hidden));
  TRY(get_int(root, file, "num_hidden_layers", fam->layers, 1, 1 << 20, &c->num_layers));
  /* The expert count under the family's key or its alias: transformers 5
  ** writes Qwen2/3-MoE's num_experts as num_local_experts (the config
  ** class's attribute map).  Both present and different: refused. */
  const char *ekey = fam->experts_key;
  if (fam->alias && !item(root, fam->experts_key) && item(root, fam->alias)) ekey = fam->alias;
  if (fam->alias && item(root, fam->experts_key) && item(root, fam->alias)) {
    int64_t a = 0, b = 0;
    TRY(get_int(root, file, fam->experts_key, 0, 1, MOE8_MAX_EXPERTS, &a));
    TRY(get_int(root, file, fam->alias, 0, 1, MOE8_MAX_EXPERTS, &b));
    if (a != b)
      return moe8__fail(MOE8_ERR_PARSE, "%s: \"%s\" = %lld and its alias \"%s\" = %lld disagree", file, fam->experts_key,
                        (long long)a, fam->alias, (long long)b);
  }
  if (fam->experts == 0 && !item(root, ekey))
    return moe8__fail(MOE8_ERR_PARSE, "%s: \"%s\" is missing (%s's configuration has no default)", file, fam->experts_key, fam->name);
  TRY(get_int(root, file, ekey, fam->experts, 1, MOE8_MAX_EXPERTS, &L->num_experts));
  char kk[64];
  TRY(pick_key(root, file, fam->topk_key, "num_experts_per_tok", kk));
  if (fam->top_k == 0 && !item(root, kk))
    return moe8__fail(MOE8_ERR_PARSE, "%s: \"%s\" is missing (%s's configuration has no default: without it the model is "
                      "dense)", file, kk, fam->name);
  TRY(get_int(root, file, kk, fam->top_k, 1, MOE8_MAX_EXPERTS, &L->top_k));
  if (fam->ernie_vl) { /* [text, vision]: the text experts' width */
    const cJSON *fl = item(root, fam->ffn_key);
    L->ffn = fam->ffn;
    if (fl && !(cJSON_IsArray(fl) && cJSON_GetArraySize(fl) == 2))
      return moe8__fail(MOE8_ERR_PARSE, "%s: \"%s\" must be a list [text, vision] of two widths", file, fam->ffn_key);
    if (fl) {
      const cJSON *w = cJSON_GetArrayItem(fl, 0);
      if (!cJSON_IsNumber(w) || !(w->valuedouble >= 1 && w->valuedouble <= (double)BIG) || w->valuedouble != floor(w->valuedouble))
        return moe8__fail(MOE8_ERR_PARSE, "%s: \"%s\"[0] (the text experts' width) must be an integer in [1, %lld]", file, fam->ffn_key,
                          (long long)BIG);
      L->ffn = (int64_t)w->valuedouble;
    }
    c->text_of_two = true;
  } else
    TRY(get_int(root, file, fam->ffn_key, fam->ffn, 1, BIG, &L->ffn));
  if (L->top_k > L->num_experts && !fam->longcat) /* LongCat-Flash's count its identity experts too (parse_longcat) */
    return moe8__fail(MOE8_ERR_PARSE, "%s: \"%s\" = %lld exceeds \"%s\" = %lld", file, kk, (long long)L->top_k,
                      fam->experts_key, (long long)L->num_experts);
  /* Routing. */
  L->score = (ds && !fam->softmax_scores) || fam->arch == MOE8_ARCH_LLAMA4 || fam->sigmoid_bias || fam->sigmoid ? MOE8_SCORE_SIGMOID
                                                                                                                : MOE8_SCORE_SOFTMAX;
  if (fam->arch == MOE8_ARCH_MIXTRAL || fam->arch == MOE8_ARCH_GPT_OSS) L->norm_topk_prob = true; /* the reference always renormalizes */
  else if (fam->norm_key && !*fam->norm_key) L->norm_topk_prob = fam->norm; /* the class has no key: always so */
  else {
    TRY(pick_key(root, file, fam->norm_key, "norm_topk_prob", kk));
    TRY(get_bool(root, file, kk, fam->norm, &L->norm_topk_prob));
  }
  L->routed_scaling_factor = 1.0f;
  if (ds) {
    TRY(pick_key(root, file, fam->scale_key, "routed_scaling_factor", kk));
    TRY(get_scaling(root, file, kk, fam->scaling, &L->routed_scaling_factor));
    /* dots.llm1's released configs write scoring_func "noaux_tc" (its
    ** block, DeepSeek-V3's, is sigmoid scores with noaux_tc selection) */
    if (fam->softmax_scores)
      TRY(want_str(root, file, "scoring_func", "softmax", "this family routes by softmax scores"));
    else if (fam->dsv4) {
      /* DeepseekV4TopKRouter's score_fn is ACT2FN[scoring_func]: sqrtsoftplus or sigmoid (ACT2FN has no softmax) */
      TRY(want_str(root, file, "scoring_func", "sqrtsoftplus|sigmoid", "DeepSeek-V4's router scores by sqrtsoftplus or sigmoid"));
      const cJSON *sf = item(root, "scoring_func");
      L->score = sf && !strcmp(sf->valuestring, "sigmoid") ? MOE8_SCORE_SIGMOID : MOE8_SCORE_SQRTSOFTPLUS;
    } else
      TRY(want_str(root, file, "scoring_func", strcmp(fam->name, "dots1") ? "sigmoid" : "sigmoid|noaux_tc",
                   "DeepSeek-V3's block routes by sigmoid scores"));
    TRY(want_str(root, file, "topk_method", "noaux_tc", "moe8 runs DeepSeek-V3's group-limited noaux_tc routing"));
    if (fam->group_key && !*fam->group_key) { /* the class has no groups */
      L->n_group = fam->n_group;
      L->topk_group = fam->topk_group;
    } else {
      TRY(pick_key(root, file, fam->group_key, "n_group", kk));
      TRY(get_int(root, file, kk, fam->n_group, 1, MOE8_MAX_EXPERTS, &L->n_group));
      TRY(get_int(root, file, "topk_group", fam->topk_group, 1, MOE8_MAX_EXPERTS, &L->topk_group));
      if (fam->group_zero && !item(root, kk) != !item(root, "topk_group"))
        return moe8__fail(MOE8_ERR_PARSE, "%s: \"%s\" and \"topk_group\" must be set together (both null: no groups)", file,
                          item(root, kk) ? "topk_group" : kk);
      L->group_mask_zero = fam->group_zero;
    }
    TRY(check_groups(L, file));
    bool with_bias = !fam->no_bias;
    if (fam->bias_flag) TRY(get_bool(root, file, fam->bias_flag, true, &with_bias));
    c->has_bias = L->use_selection_bias = with_bias;
    L->norm_eps = (float)fam->norm_eps;
    if (fam->norm_min > 0) {
      TRY(get_pos(root, file, "moe_norm_min", fam->norm_min, true, "", &L->norm_min));
      const cJSON *ub = item(root, "use_bias");
      if (ub && !cJSON_IsBool(ub)) return moe8__fail(MOE8_ERR_PARSE, "%s: \"use_bias\" must be true or false", file);
      if (ub && cJSON_IsTrue(ub))
        return moe8__fail(MOE8_ERR_UNSUPPORTED, "%s: \"use_bias\" is true: the shared experts' linear layers then have biases, "
                          "which moe8 does not hold", file);
    }
    int64_t nsh = fam->shared;
    if (!fam->shared_key || *fam->shared_key) {
      TRY(pick_key(root, file, fam->shared_key, "n_shared_experts", kk));
      if (fam->shared < 0 && !item(root, kk))
        return moe8__fail(MOE8_ERR_PARSE, "%s: \"%s\" is missing (%s's configuration has no default and its block needs it)", file, kk,
                          fam->name);
      TRY(get_int(root, file, kk, fam->shared, 0, 1 << 16, &nsh));
    }
    int64_t sw = L->ffn;
    if (fam->shared_width_key) {
      TRY(pick_key(root, file, fam->shared_width_key, "", kk));
      TRY(get_int(root, file, kk, fam->shared_width, 1, BIG, &sw));
    }
    L->shared_ffn = nsh * sw;
    if (!fam->step && !fam->m3 && !fam->dsv4 && !fam->inkling && !fam->nemotron && !fam->muse) /* Step's, MiniMax-M3's, DeepSeek-V4's, Inkling's and Nemotron-H's classes ignore these */
      TRY(get_dense_layers(root, file, fam->first_dense, c));
  } else if (v2) {
    /* DeepSeek-V2: softmax scores; greedy top-k, or group_limited_greedy
    ** (a group's score is its best expert's, the topk_group best groups
    ** stay); weights are the selected scores times routed_scaling_factor;
    ** n_shared_experts ungated shared experts (null: none). */
    TRY(want_str(root, file, "scoring_func", "softmax", "DeepSeek-V2 routes by softmax scores"));
    const cJSON *tm = item(root, "topk_method");
    if (tm && cJSON_IsString(tm) && !strcmp(tm->valuestring, "noaux_tc"))
      return moe8__fail(MOE8_ERR_UNSUPPORTED, "%s: \"topk_method\" is \"noaux_tc\", DeepSeek-V3's routing: run the model as deepseek_v3 "
                        "(model_type, or --arch deepseek_v3)", file);
    TRY(want_str(root, file, "topk_method", "greedy|group_limited_greedy", "DeepSeek-V2 routes by greedy or group_limited_greedy"));
    const bool grouped = tm && !strcmp(tm->valuestring, "group_limited_greedy");
    TRY(get_bool(root, file, "norm_topk_prob", false, &L->norm_topk_prob));
    if (L->norm_topk_prob)
      return moe8__fail(MOE8_ERR_UNSUPPORTED, "%s: \"norm_topk_prob\" is true: DeepSeek-V2's own code then renormalizes without "
                        "routed_scaling_factor while transformers' scales without renormalizing; moe8 does not pick one (no released "
                        "DeepSeek-V2 checkpoint sets it)", file);
    TRY(get_scaling(root, file, "routed_scaling_factor", fam->scaling, &L->routed_scaling_factor));
    if (grouped) {
      if (!item(root, "n_group") || !item(root, "topk_group"))
        return moe8__fail(MOE8_ERR_PARSE, "%s: \"topk_method\" group_limited_greedy needs \"n_group\" and \"topk_group\"", file);
      TRY(get_int(root, file, "n_group", 1, 1, MOE8_MAX_EXPERTS, &L->n_group));
      TRY(get_int(root, file, "topk_group", 1, 1, MOE8_MAX_EXPERTS, &L->topk_group));
      if (L->topk_group > L->n_group) /* also with one group: the config asks for more groups than it has */
        return moe8__fail(MOE8_ERR_PARSE, "%s: \"topk_group\" = %lld exceeds \"n_group\" = %lld", file, (long long)L->topk_group,
                          (long long)L->n_group);
      TRY(check_groups(L, file));
      L->group_score = MOE8_GROUP_MAX;
    }
    const cJSON *ns = cJSON_GetObjectItemCaseSensitive(root, "n_shared_experts");
    int64_t nsh = 0;
    if (!(ns && cJSON_IsNull(ns))) TRY(get_int(root, file, "n_shared_experts", fam->shared, 0, 1 << 16, &nsh));
    L->shared_ffn = nsh * L->ffn;
    TRY(get_dense_layers(root, file, fam->first_dense, c));
  } else if (fam->sigmoid_bias) {
    /* MiniMax-M2: sigmoid scores, the top-k of score + bias, the chosen
    ** scores renormalized; no groups, no scaling, no shared expert */
    TRY(want_str(root, file, "scoring_func", "sigmoid", "MiniMax-M2 routes by sigmoid scores"));
    const cJSON *ub = item(root, "use_routing_bias");
    if (ub && !cJSON_IsBool(ub)) return moe8__fail(MOE8_ERR_PARSE, "%s: \"use_routing_bias\" must be true or false", file);
    c->has_bias = L->use_selection_bias = true; /* the block's buffer; absent from the file it is zeros */
    c->moe_layer_freq = 1;
  } else {
    const cJSON *v = item(root, "scoring_func");
    if (v) TRY(want_str(root, file, "scoring_func", "softmax", "this family routes by softmax"));
    c->moe_layer_freq = 1;
  }
  if (fam->arch == MOE8_ARCH_LLAMA4) {
    /* router_scores = sigmoid of the top-k logits (the others' -inf give 0),
    ** routed_in = x * score; the shared expert is ungated, of the experts'
    ** width; MoE layers every interleave_moe_layer_step (or "moe_layers") */
    L->norm_topk_prob = false;
    L->weight_input = true;
    L->shared_ffn = L->ffn;
    int64_t step = 1;
    TRY(get_int(root, file, "interleave_moe_layer_step", 1, 1, 1 << 20, &step));
    c->decoder_sparse_step = step;
    const cJSON *ml = item(root, "moe_layers");
    if (ml) {
      if (!cJSON_IsArray(ml)) return moe8__fail(MOE8_ERR_PARSE, "%s: \"moe_layers\" must be a list of layer indices", file);
      bool moe[1 << 12] = {0};
      if (c->num_layers > (1 << 12)) return moe8__fail(MOE8_ERR_PARSE, "%s: \"moe_layers\" with more than 4096 layers", file);
      for (const cJSON *e = ml->child; e; e = e->next) {
        if (!cJSON_IsNumber(e) || !(e->valuedouble >= 0 && e->valuedouble < (double)c->num_layers) || e->valuedouble != floor(e->valuedouble))
          return moe8__fail(MOE8_ERR_PARSE, "%s: a \"moe_layers\" entry is not a layer index in [0, %lld)", file, (long long)c->num_layers);
        moe[(int64_t)e->valuedouble] = true;
      }
      c->decoder_sparse_step = 1;
      for (int64_t l = 0; l < c->num_layers; l++)
        if (!moe[l]) {
          if (c->n_mlp_only >= MOE8_MAX_MLP_ONLY) return moe8__fail(MOE8_ERR_PARSE, "%s: \"moe_layers\" leaves too many dense layers", file);
          c->mlp_only_layers[c->n_mlp_only++] = l;
        }
    }
  }
  if (fam->arch == MOE8_ARCH_GPT_OSS) {
    /* softmax over the top-k logits = the top-k softmax scores renormalized */
    L->router_bias = L->expert_bias = true;
    L->act = MOE8_ACT_SWIGLU_CLAMP;
    const cJSON *a = item(root, "swiglu_alpha");
    if (a && (!cJSON_IsNumber(a) || !(a->valuedouble > 0 && a->valuedouble < 1e30 && (float)a->valuedouble > 0)))
      return moe8__fail(MOE8_ERR_PARSE, "%s: \"swiglu_alpha\" must be a positive finite number", file);
    L->act_alpha = (float)(a ? a->valuedouble : 1.702);
    TRY(get_pos(root, file, "swiglu_limit", 7.0, false, "", &L->act_limit));
  }
  if (fam->select_logits) c->has_bias = L->use_selection_bias = L->select_logits = true;
  if (fam->zero_key) {
    const cJSON *v = item(root, fam->zero_key);
    if (v && !cJSON_IsNumber(v)) return moe8__fail(MOE8_ERR_PARSE, "%s: \"%s\" must be a number", file, fam->zero_key);
    if (v && v->valuedouble != 0.0)
      return moe8__fail(MOE8_ERR_UNSUPPORTED, "%s: \"%s\" is %g: %s", file, fam->zero_key, v->valuedouble, fam->zero_why);
  }
  if (fam->limited) {
    /* transformers' classes clamp at the value they are given; HY-V4's
    ** docstring calls a value <= 0 "disabled", which its code does not do */
    TRY(get_pos(root, file, "swiglu_limit", fam->limit, false, " (the experts' clamp)", &L->act_limit));
    L->act = MOE8_ACT_SWIGLU_LIMIT;
    L->shared_plain_act = fam->shared_plain;
  }
  if (fam->arch == MOE8_ARCH_QWEN2_MOE && fam->shared_width_key && !*fam->shared_width_key) {
    L->shared_ffn = fam->shared; /* the class has no shared expert key */
  } else if (fam->arch == MOE8_ARCH_QWEN2_MOE) {
    TRY(pick_key(root, file, fam->shared_width_key, "shared_expert_intermediate_size", kk));
    TRY(get_int(root, file, kk, fam->shared, 0, BIG, &L->shared_ffn));
    L->shared_gate = L->shared_ffn > 0 && !fam->shared_ungated;
  }
  if (fam->aria) { /* count x the experts' width, one ungated SwiGLU */
    int64_t nsh = 0;
    TRY(get_int(root, file, "moe_num_shared_experts", 2, 0, 1 << 16, &nsh));
    L->shared_ffn = nsh * L->ffn;
    L->shared_gate = false;
  }
  if (fam->cohere) {
    int64_t nsh = 0;
    TRY(get_int(root, file, "num_shared_experts", 0, 0, 1 << 16, &nsh));
    L->shared_ffn = nsh * L->ffn;
    L->shared_gate = false;
    TRY(want_str(root, file, "expert_selection_fn", "softmax|sigmoid", "Cohere2-MoE selects by softmax or sigmoid"));
    const cJSON *sf = item(root, "expert_selection_fn");
    if (sf && !strcmp(sf->valuestring, "sigmoid")) { /* the top-k of the logits, their sigmoid, / sum iff norm_topk_prob */
      L->score = MOE8_SCORE_SIGMOID;
      L->select_logits = true;
    } else
      L->norm_topk_prob = true; /* the softmax over the k: the chosen scores renormalized, whatever norm_topk_prob says */
    TRY(want_str(root, file, "shared_expert_combination_strategy", "average|sum", "Cohere2-MoE averages or sums"));
    const cJSON *cs = item(root, "shared_expert_combination_strategy");
    if (nsh > 0 && !(cs && !strcmp(cs->valuestring, "sum"))) { /* "average": (routed + shared) / 2, exactly halves of both */
      L->routed_scaling_factor = 0.5f;
      L->shared_scale = 0.5f;
    }
  }
  if (fam->arch != MOE8_ARCH_LLAMA4) c->decoder_sparse_step = 1;
  if (qwen && fam->place == PLACE_BLOCK) {
    TRY(get_int(root, file, "decoder_sparse_step", 1, 1, 1 << 20, &c->decoder_sparse_step));
    const cJSON *v = item(root, "mlp_only_layers");
    if (v) {
      if (!cJSON_IsArray(v)) return moe8__fail(MOE8_ERR_PARSE, "%s: \"mlp_only_layers\" must be a list of layer indices", file);
      const int n = cJSON_GetArraySize(v);
      if (n > MOE8_MAX_MLP_ONLY) return moe8__fail(MOE8_ERR_PARSE, "%s: \"mlp_only_layers\" has %d entries (at most %d)", file, n, MOE8_MAX_MLP_ONLY);
      for (const cJSON *e = v->child; e; e = e->next) {
        if (!cJSON_IsNumber(e) || !(e->valuedouble >= 0 && e->valuedouble < (double)(1 << 20)) || e->valuedouble != floor(e->valuedouble))
          return moe8__fail(MOE8_ERR_PARSE, "%s: \"mlp_only_layers\" entry %lld must be a layer index", file, (long long)c->n_mlp_only);
        c->mlp_only_layers[c->n_mlp_only++] = (int64_t)e->valuedouble;
      }
    } else {
      /* the class's default list: its first .first_dense layers (Flint: [0, 1]) */
      for (int64_t l = 0; l < fam->first_dense && l < c->num_layers; l++) c->mlp_only_layers[c->n_mlp_only++] = l;
      c->first_k_dense_from_default = fam->first_dense > 0;
    }
  }
tail:
  if (fam->place != PLACE_BLOCK) TRY(get_placement(root, file, fam, c));
  if (fam->step) TRY(parse_step(root, file, c));
  if (fam->m3) TRY(parse_m3(root, file, c));
  if (fam->dsv4) TRY(parse_dsv4(root, file, c));
  if (fam->inkling) {
    /* the shared experts scored by the router: the layer's last ones (its
    ** router weight [E + S, D], bias [E]); the class needs at least one */
    int64_t S = 0;
    TRY(get_int(root, file, "n_shared_experts", 2, 1, MOE8_MAX_EXPERTS, &S));
    if (L->num_experts + S > MOE8_MAX_EXPERTS)
      return moe8__fail(MOE8_ERR_PARSE, "%s: n_routed_experts + n_shared_experts = %lld exceeds moe8's %d experts", file,
                        (long long)(L->num_experts + S), MOE8_MAX_EXPERTS);
    L->num_experts += S;
    L->top_k += S;
    L->scored_shared = S;
    c->top_layers = true; /* InklingTextModel's files: layers.L. */
  }
  if (fam->gemma) TRY(parse_gemma(root, file, fam, c));
  if (fam->nemotron) TRY(parse_nemotron(root, file, c));
  if (fam->muse) { /* the latent experts: the width, both norms and their epsilons; the router's logit multiplier */
    TRY(get_int(root, file, "moe_hidden_size", 4096, 1, BIG, &L->latent));
    TRY(get_pos(root, file, "rms_norm_eps", 1e-5, true, " (pre_expert_norm's epsilon)", &L->rms_eps));
    TRY(get_pos(root, file, "post_norm_eps", 1e-8, true, " (post_expert_norm's epsilon)", &L->expert_out_eps));
    TRY(get_pos(root, file, "output_multiplier", 0.1767766952966369, false, " (the router's logit multiplier)", &c->router_logit_scale));
    L->latent_norm = L->expert_out_norm = true;
    c->top_layers = true; /* MuseSparkTextModel's files: layers.L. */
  }
  if (fam->axk1) { /* the block's output RMSNorm: post_mlp_layernorm in the decoder layer */
    float eps = 1e-6f;
    TRY(get_pos(root, file, "rms_norm_eps", 1e-6, true, " (post_mlp_layernorm's epsilon)", &eps));
    L->out_norm = true;
    L->rms_eps = eps;
    snprintf(c->out_norm_name, sizeof c->out_norm_name, "post_mlp_layernorm.weight");
  }
  if (fam->sparsemixer) TRY(parse_phimoe(root, file, c));
  if (fam->longcat) TRY(parse_longcat(root, file, c));
  if (fam->zaya) TRY(parse_zaya(root, file, c));
  if (fam->softcap) {
    /* the caps; intermediate_size is the class's alias of moe_intermediate_size */
    TRY(get_pos(root, file, "mlp_gate_softcap", 4.0, false, " (the experts' gate softcap)", &L->act_alpha));
    TRY(get_pos(root, file, "mlp_up_softcap", 25.0, false, " (the experts' up softcap)", &L->act_limit));
    L->act = MOE8_ACT_SWIGLU_SOFTCAP;
    int64_t f2 = L->ffn;
    TRY(get_int(root, file, "intermediate_size", L->ffn, 1, BIG, &f2));
    if (item(root, "intermediate_size") && item(root, fam->ffn_key) && f2 != L->ffn)
      return moe8__fail(MOE8_ERR_PARSE, "%s: \"intermediate_size\" = %lld and its alias \"%s\" = %lld disagree", file, (long long)f2,
                        fam->ffn_key, (long long)L->ffn);
    L->ffn = f2;
    c->fused_interleaved = true; /* its files' w13_weight */
  }
  if (fam->block_prefix) snprintf(c->block_prefix, sizeof c->block_prefix, "%s", fam->block_prefix);
  if (fam->router_name) snprintf(c->router_name, sizeof c->router_name, "%s", fam->router_name);
  if (fam->fused_gu) snprintf(c->fused_gu, sizeof c->fused_gu, "%s", fam->fused_gu);
  if (fam->fused_dn) snprintf(c->fused_dn, sizeof c->fused_dn, "%s", fam->fused_dn);
  if (fam->shared_beside) snprintf(c->shared_beside, sizeof c->shared_beside, "%s", fam->shared_beside);
  c->mistral_names = fam->mistral_names;
  /* Weights quantization in the checkpoint. */
  const cJSON *q = item(root, "quantization_config");
  if (q) {
    const cJSON *m = item(q, "quant_method");
    if (!cJSON_IsObject(q) || !cJSON_IsString(m)) return moe8__fail(MOE8_ERR_PARSE, "%s: quantization_config.quant_method must be a string", file);
    if (!strcmp(m->valuestring, "mxfp4")) {
      if (fam->arch != MOE8_ARCH_GPT_OSS)
        return moe8__fail(MOE8_ERR_UNSUPPORTED, "%s: quantization_config.quant_method \"mxfp4\" is read for gpt_oss only", file);
      c->mxfp4 = true;
    } else if (!strcmp(m->valuestring, "fp8")) {
      const cJSON *fmt = item(q, "fmt"), *bs = item(q, "weight_block_size");
      /* DeepSeek's files write "e4m3", MiniMax-M2's "float8_e4m3fn": the same format */
      if (fmt && !(cJSON_IsString(fmt) && (!strcmp(fmt->valuestring, "e4m3") || !strcmp(fmt->valuestring, "float8_e4m3fn"))))
        return moe8__fail(MOE8_ERR_UNSUPPORTED, "%s: quantization_config.fmt must be \"e4m3\" (or \"float8_e4m3fn\")", file);
      TRY(want_str(q, file, "activation_scheme", "dynamic", "quantization_config.activation_scheme: moe8 quantizes activations dynamically"));
      c->fp8 = true;
      c->block_n = c->block_k = 128;
      if (bs) {
        if (!cJSON_IsArray(bs) || cJSON_GetArraySize(bs) != 2)
          return moe8__fail(MOE8_ERR_PARSE, "%s: quantization_config.weight_block_size must be [n, k]", file);
        const cJSON *b0 = bs->child, *b1 = b0->next;
        if (!cJSON_IsNumber(b0) || !cJSON_IsNumber(b1) || !(b0->valuedouble >= 1 && b0->valuedouble <= 65536) ||
            !(b1->valuedouble >= 1 && b1->valuedouble <= 65536) || b0->valuedouble != floor(b0->valuedouble) ||
            b1->valuedouble != floor(b1->valuedouble))
          return moe8__fail(MOE8_ERR_PARSE, "%s: quantization_config.weight_block_size must be two integers in [1, 65536]", file);
        c->block_n = (int64_t)b0->valuedouble;
        c->block_k = (int64_t)b1->valuedouble;
      }
    } else {
      /* compressed-tensors, fbgemm_fp8, gptq, awq, bitsandbytes, ...: other
      ** tensors and other arithmetic, never read as if they were floats */
      return moe8__fail(MOE8_ERR_UNSUPPORTED, "%s: quantization_config.quant_method \"%.40s\" is not a format moe8 reads (fp8: "
                        "block-scaled e4m3 as DeepSeek's files; mxfp4: GPT-OSS's); run a float checkpoint of the model", file,
                        m->valuestring);
    }
  }
  TRY(parse_moe8_quantization(root, file, c));
#undef TRY
  return MOE8_OK;
}

moe8_status moe8_hf_config_parse_as(const char *json, size_t len, const char *name, const char *model_type, moe8_hf_config *c) {
  const char *file = name ? name : "config.json";
  if (!json || !c) return moe8__fail(MOE8_ERR_INVALID_ARG, "config: NULL argument");
  memset(c, 0, sizeof *c);
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, 0);
  if (!root) {
    /* The end pointer of this call (not the library's global one) locates the error. */
    return moe8__fail(MOE8_ERR_PARSE, "%s: malformed JSON near byte %zu", file, end && end >= json ? (size_t)(end - json) : 0);
  }
  moe8_status st = parse_root(root, file, model_type, c);
  cJSON_Delete(root);
  if (st != MOE8_OK) memset(c, 0, sizeof *c);
  return st;
}

moe8_status moe8_hf_config_parse(const char *json, size_t len, const char *name, moe8_hf_config *c) {
  return moe8_hf_config_parse_as(json, len, name, NULL, c);
}

moe8_status moe8_hf_config_check_moe_layer(const moe8_hf_config *c, int64_t layer) {
  if (!c) return moe8__fail(MOE8_ERR_INVALID_ARG, "config: NULL");
  if (layer < 0 || layer >= c->num_layers) {
    /* the key the family counts its layers by (LongCat-Flash: num_layers,
    ** its num_hidden_layers being the sublayers; DBRX: n_layers;
    ** SwitchTransformers: both stacks') */
    const char *key = !strcmp(c->model_type, "longcat_flash") ? "num_layers" : !strcmp(c->model_type, "dbrx") ? "n_layers"
                      : c->nllb ? "encoder_layers + decoder_layers" : c->encdec ? "num_layers + num_decoder_layers" : "num_hidden_layers";
    return moe8__fail(MOE8_ERR_INVALID_ARG, "layer %lld is outside [0, %s = %lld)", (long long)layer, key, (long long)c->num_layers);
  }
  if (c->nllb) { /* NLLB-MoE: the encoder's layers, then the decoder's; sparse where (i + 1) % step == 0 */
    const int s = layer >= c->enc_layers;
    const int64_t i = layer - (s ? c->enc_layers : 0), step = c->sparse_step[s];
    if (!(step > 0 && (i + 1) % step == 0))
      return moe8__fail(MOE8_ERR_INVALID_ARG, "layer %lld is the %s's layer %lld, a dense MLP (model.%s.layers.%lld.ffn.fc1.weight): %s = %lld, "
                        "sparse where (layer + 1) %% step == 0%s", (long long)layer, s ? "decoder" : "encoder", (long long)i,
                        s ? "decoder" : "encoder", (long long)i, s ? "decoder_sparse_step" : "encoder_sparse_step", (long long)step,
                        step > 0 ? "" : " (none: the step is not positive)");
    return MOE8_OK;
  }
  if (c->encdec) { /* SwitchTransformers: the encoder's blocks, then the decoder's */
    const int s = layer >= c->enc_layers;
    const int64_t i = layer - (s ? c->enc_layers : 0), step = c->sparse_step[s];
    if (!(step > 0 && (i % step == 1 || step == 1)))
      return moe8__fail(MOE8_ERR_INVALID_ARG, "layer %lld is the %s's block %lld, a dense MLP (%s.block.%lld.layer.%d.mlp.wi.weight): %s = %lld of "
                        "%lld blocks, sparse where block %% %lld == 1", (long long)layer, s ? "decoder" : "encoder", (long long)i,
                        s ? "decoder" : "encoder", (long long)i, s ? 2 : 1, s ? "num_sparse_decoder_layers" : "num_sparse_encoder_layers",
                        (long long)c->sparse_layers[s], (long long)(s ? c->num_layers - c->enc_layers : c->enc_layers), (long long)step);
    return MOE8_OK;
  }
  {
    if (layer < c->first_k_dense_replace) {
      const int64_t first = moe8_hf_config_first_moe_layer(c);
      char where[96];
      if (first >= 0) snprintf(where, sizeof where, "the MoE layers start at %lld", (long long)first);
      else snprintf(where, sizeof where, "none of its %lld layers is MoE", (long long)c->num_layers);
      return moe8__fail(MOE8_ERR_INVALID_ARG, "layer %lld is a dense MLP layer (first_k_dense_replace = %lld%s): %s", (long long)layer,
                        (long long)c->first_k_dense_replace,
                        c->first_k_dense_from_default ? ", the family's default: config.json does not set it" : "", where);
    }
    if (c->moe_layer_freq > 1 && layer % c->moe_layer_freq)
      return moe8__fail(MOE8_ERR_INVALID_ARG, "layer %lld is a dense MLP layer (moe_layer_freq = %lld)", (long long)layer,
                        (long long)c->moe_layer_freq);
  }
  if (c->expert_layer_period > 0 && layer % c->expert_layer_period != c->expert_layer_offset)
    return moe8__fail(MOE8_ERR_INVALID_ARG,
                      "layer %lld is a dense MLP layer (expert_layer_period = %lld, expert_layer_offset = %lld: MoE where layer %% %lld == %lld)",
                      (long long)layer, (long long)c->expert_layer_period, (long long)c->expert_layer_offset,
                      (long long)c->expert_layer_period, (long long)c->expert_layer_offset);
  if (c->arch == MOE8_ARCH_LLAMA4) {
    /* Llama4TextConfig places its MoE layers by moe_layers (the list, when
    ** given) or interleave_moe_layer_step; it has neither mlp_only_layers
    ** nor decoder_sparse_step */
    for (int64_t i = 0; i < c->n_mlp_only; i++)
      if (c->mlp_only_layers[i] == layer)
        return moe8__fail(MOE8_ERR_INVALID_ARG, "layer %lld is a dense MLP layer (not listed in moe_layers)", (long long)layer);
    if (c->decoder_sparse_step > 1 && (layer + 1) % c->decoder_sparse_step)
      return moe8__fail(MOE8_ERR_INVALID_ARG,
                        "layer %lld is a dense MLP layer (interleave_moe_layer_step = %lld: MoE where (layer + 1) %% %lld == 0)",
                        (long long)layer, (long long)c->decoder_sparse_step, (long long)c->decoder_sparse_step);
    return MOE8_OK;
  }
  for (int64_t i = 0; i < c->n_mlp_only; i++)
    if (c->mlp_only_layers[i] == layer) {
      if (c->decoder_sparse_step == 0)
        return moe8__fail(MOE8_ERR_INVALID_ARG, "layer %lld is a dense MLP layer (mlp_layer_types[%lld] is \"dense\")", (long long)layer,
                          (long long)layer);
      if (c->decoder_sparse_step <= -4 && c->decoder_sparse_step >= -6) /* Nemotron-H: a mamba, attention or MLP layer */
        return moe8__fail(MOE8_ERR_INVALID_ARG, "layer %lld is not an MoE layer (%s)", (long long)layer,
                          c->decoder_sparse_step == -4 ? "its layers_block_type entry is not \"moe\""
                          : c->decoder_sparse_step == -5 ? "its hybrid_override_pattern letter is not 'E'"
                                                         : "layers_block_type, the class's default: config.json does not set it; layer 1 is MoE");
      if (c->decoder_sparse_step == -3) /* PLACE_INTERVAL (ERNIE-4.5) */
        return moe8__fail(MOE8_ERR_INVALID_ARG, "layer %lld is a dense MLP layer (moe_layer_interval, moe_layer_start_index and "
                          "moe_layer_end_index: MoE where (layer + 1) %% interval == 0 and start <= layer <= end)", (long long)layer);
      if (c->decoder_sparse_step == -7) /* PLACE_TYPES_KEY: mlp_layer_types absent, the family's dense-count key */
        return moe8__fail(MOE8_ERR_INVALID_ARG, "layer %lld is a dense MLP layer (mlp_layer_types absent; %s = %lld%s)", (long long)layer,
                          c->dense_key, (long long)c->n_mlp_only, c->first_k_dense_from_default ? ", the family's default" : "");
      if (c->decoder_sparse_step == -2) /* PLACE_FIRST, whose one key is num_dense_layers */
        return moe8__fail(MOE8_ERR_INVALID_ARG, "layer %lld is a dense MLP layer (num_dense_layers = %lld%s)", (long long)layer,
                          (long long)c->n_mlp_only, c->first_k_dense_from_default ? ", the family's default: config.json does not set it" : "");
      if (c->decoder_sparse_step < 0)
        return moe8__fail(MOE8_ERR_INVALID_ARG, "layer %lld is a dense MLP layer (mlp_layer_types, the family's default: config.json does "
                          "not set it, and the first %lld layer(s) are dense)", (long long)layer, (long long)c->n_mlp_only);
      return moe8__fail(MOE8_ERR_INVALID_ARG, "layer %lld is a dense MLP layer (listed in mlp_only_layers%s)", (long long)layer,
                        c->first_k_dense_from_default ? ", the family's default: config.json does not set it" : "");
    }
  if (c->decoder_sparse_step > 1 && (layer + 1) % c->decoder_sparse_step)
    return moe8__fail(MOE8_ERR_INVALID_ARG, "layer %lld is a dense MLP layer (decoder_sparse_step = %lld: MoE where (layer + 1) %% %lld == 0)",
                      (long long)layer, (long long)c->decoder_sparse_step, (long long)c->decoder_sparse_step);
  return MOE8_OK;
}

int64_t moe8_hf_config_first_moe_layer(const moe8_hf_config *c) {
  if (!c) return -1;
  for (int64_t l = 0; l < c->num_layers && l < (1 << 20); l++) {
    if (c->encdec) {
      const int s = l >= c->enc_layers;
      const int64_t i = l - (s ? c->enc_layers : 0), step = c->sparse_step[s];
      if (c->nllb ? step > 0 && (i + 1) % step == 0 : step > 0 && (i % step == 1 || step == 1)) return l;
      continue;
    }
    if (l < c->first_k_dense_replace || (c->moe_layer_freq > 1 && l % c->moe_layer_freq)) continue;
    if (c->expert_layer_period > 0 && l % c->expert_layer_period != c->expert_layer_offset) continue;
    bool dense = c->decoder_sparse_step > 1 && (l + 1) % c->decoder_sparse_step;
    for (int64_t i = 0; i < c->n_mlp_only && !dense; i++) dense = c->mlp_only_layers[i] == l;
    if (!dense) return l;
  }
  return -1;
}

moe8_status moe8__config_load_as(const char *path, const char *model_type, moe8_hf_config *out) {
  if (!path || !out) return moe8__fail(MOE8_ERR_INVALID_ARG, "config: NULL argument");
  char *buf;
  size_t n;
  moe8_status st = moe8__read_small(path, (size_t)1 << 20, &buf, &n);
  if (st != MOE8_OK) return st;
  st = moe8_hf_config_parse_as(buf, n, path, model_type, out);
  free(buf);
  return st;
}

moe8_status moe8_hf_config_load(const char *path, moe8_hf_config *out) {
  return moe8__config_load_as(path, NULL, out);
}
