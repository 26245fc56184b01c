/*
** model.c — a Hugging Face model directory: config.json plus safetensors
** shards, and the loading of one MoE layer from it (docs/models.md).
**
** Tensor names, for layer L (prefix P = "model.layers.L.mlp." or, for
** Mixtral, "model.layers.L.block_sparse_moe." when that is what the file
** has):
**   P gate.weight                       router, [E, D]
**   P gate.e_score_correction_bias      DeepSeek-V3 selection bias, [E]
**     (MiniMax-M2: P e_score_correction_bias)
**   routed experts, one of:
**     P experts.e.{gate,up,down}_proj.weight  [F, D], [F, D], [D, F] (out × in)
**       (Mixtral: experts.e.{w1,w3,w2}.weight); float, or F8_E4M3 with
**       .weight_scale_inv [ceil(N/bn), ceil(K/bk)] in F32, BF16 or F16;
**     P experts.gate_up_proj [E, 2F, D] and P experts.down_proj [E, D, F]
**       (the fused 3-D layout; gate rows first), float;
**     P experts.gate_up_proj.qweight / .scale, P experts.down_proj.qweight /
**       .scale: moe8's own [E, D, 2F] codes and [E, nb, 1, 2F] scales, or
**       .qweight_packed [E, bytes]: the codes in the kernels' packed layout
**       (moe8_quantization.packed_layout = 1), mapped, never copied;
**   shared expert: P shared_experts.{gate,up,down}_proj.weight (DeepSeek-V3)
**     or P shared_expert.{...}.weight and P shared_expert_gate.weight [1, D]
**     (Qwen2-MoE), float or FP8 blocks.
** Every tensor's presence, dtype and shape is checked against the config
** before it is used; a message names the tensor, the file and what was
** expected.  Loading goes expert by expert: an inference layer never holds
** more than one expert in f32, and the file's pages of an expert are
** dropped once it is converted.
*/
#define _DEFAULT_SOURCE 1 /* madvise(MADV_DONTNEED) */
#include "../core/internal.h"
#include "../kernels/gmm.h"
#include "../moe/layer_internal.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define MAX_SHARDS 100000

/* A string entry of a safetensors file's __metadata__ (src/io/safetensors.c). */
const char *moe8__st_meta(const moe8_st_file *f, const char *key);

struct moe8_model {
  moe8_hf_config cfg;
  moe8_st_file **shards;
  size_t         nshards;
  const moe8_tensor_view **all;  /* every tensor of every shard, by name */
  size_t         count;
  char           fmt[128];
  char           root[48];       /* the layers' tensor-name root: "model.layers." (or a multimodal model's) */
  char          *rules;          /* config.json moe8_quantization.rules as JSON text (moe8 quantize's record), or NULL */
  char           rules_name[4200]; /* where they are, for messages */
  atomic_int     refs;           /* the caller's handle + layers borrowing its mappings */
};

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }
static int cmp_view(const void *a, const void *b) {
  return strcmp((*(const moe8_tensor_view *const *)a)->name, (*(const moe8_tensor_view *const *)b)->name);
}

static void model_free(moe8_model *m) {
  for (size_t i = 0; i < m->nshards; i++) moe8_st_close(m->shards[i]);
  free(m->shards);
  free(m->all);
  free(m->rules);
  free(m);
}

static void model_release(void *p) {
  moe8_model *m = p;
  if (m && atomic_fetch_sub(&m->refs, 1) == 1) model_free(m);
}

void moe8_model_close(moe8_model *m) { model_release(m); }

/* The rules moe8 quantize recorded (config.json moe8_quantization.rules),
** kept as text and parsed at each load that is given no rules.  The
** config was read and checked just before (at most 1 MiB). */
static moe8_status recorded_rules(const char *path, moe8_model *m) {
  char *txt = NULL;
  size_t n = 0;
  moe8_status st = moe8__read_small(path, (size_t)1 << 20, &txt, &n);
  if (st != MOE8_OK) return st;
  cJSON *root = cJSON_ParseWithLength(txt, n);
  free(txt);
  const cJSON *q = root ? cJSON_GetObjectItemCaseSensitive(root, "moe8_quantization") : NULL;
  const cJSON *r = cJSON_IsObject(q) ? cJSON_GetObjectItemCaseSensitive(q, "rules") : NULL;
  if (r && !cJSON_IsObject(r)) st = moe8__fail(MOE8_ERR_PARSE, "%s: moe8_quantization.rules must be a rule set (a JSON object)", path);
  else if (r && !(m->rules = cJSON_PrintUnformatted(r))) st = moe8__fail(MOE8_ERR_NOMEM, "model: out of memory");
  snprintf(m->rules_name, sizeof m->rules_name, "%s moe8_quantization.rules", path);
  cJSON_Delete(root);
  if (st == MOE8_OK && m->rules) {
    /* refused at open, naming the key, rather than at each load */
    moe8_rules *rs = NULL;
    st = moe8_rules_parse(m->rules, strlen(m->rules), m->rules_name, &rs);
    moe8_rules_destroy(rs);
  }
  return st;
}

moe8_status moe8_model_open_as(const char *dir, const char *model_type, moe8_model **out) {
  if (!dir || !out) return moe8__fail(MOE8_ERR_INVALID_ARG, "model: NULL argument");
  if (!*dir) return moe8__fail(MOE8_ERR_INVALID_ARG, "model: the model directory is an empty path");
  *out = NULL;
  char path[4096];
  moe8_model *m = calloc(1, sizeof *m);
  if (!m) return moe8__fail(MOE8_ERR_NOMEM, "model: out of memory");
  atomic_init(&m->refs, 1);
  snprintf(path, sizeof path, "%s/config.json", dir);
  moe8_status st = moe8__config_load_as(path, model_type, &m->cfg);
  if (st == MOE8_OK) st = recorded_rules(path, m);
  if (st != MOE8_OK) { model_free(m); return st; }
  DIR *d = opendir(dir);
  if (!d) { model_free(m); return moe8__fail(MOE8_ERR_IO, "%s: cannot open the model directory", dir); }
  char **names = NULL;
  size_t n = 0, cap = 0;
  for (struct dirent *e; (e = readdir(d));) {
    const size_t l = strlen(e->d_name);
    if (l > 12 && !strcmp(e->d_name + l - 12, ".safetensors")) {
      if (n == MAX_SHARDS) { st = moe8__fail(MOE8_ERR_FORMAT, "%s: more than %d *.safetensors shards", dir, MAX_SHARDS); break; }
      if (n == cap) {
        char **nn = realloc(names, (cap = cap ? cap * 2 : 8) * sizeof *names);
        if (!nn) { st = moe8__fail(MOE8_ERR_NOMEM, "model: out of memory"); break; }
        names = nn;
      }
      if (!(names[n] = strdup(e->d_name))) { st = moe8__fail(MOE8_ERR_NOMEM, "model: out of memory"); break; }
      n++;
    }
  }
  closedir(d);
  if (st == MOE8_OK && n == 0) st = moe8__fail(MOE8_ERR_IO, "%s: no *.safetensors file", dir);
  if (st == MOE8_OK) {
    qsort(names, n, sizeof *names, cmp_str);
    m->shards = calloc(n, sizeof *m->shards);
    if (!m->shards) st = moe8__fail(MOE8_ERR_NOMEM, "model: out of memory");
  }
  for (size_t i = 0; i < n && st == MOE8_OK; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    if ((st = moe8_st_open(path, &m->shards[i])) == MOE8_OK) m->nshards++;
  }
  for (size_t i = 0; i < n; i++) free(names[i]);
  free(names);
  if (st != MOE8_OK) { model_free(m); return st; }
  for (size_t i = 0; i < m->nshards; i++) m->count += moe8_st_count(m->shards[i]);
  m->all = malloc((m->count ? m->count : 1) * sizeof *m->all);
  if (!m->all) { model_free(m); return moe8__fail(MOE8_ERR_NOMEM, "model: out of memory"); }
  size_t k = 0;
  for (size_t i = 0; i < m->nshards; i++)
    for (size_t j = 0; j < moe8_st_count(m->shards[i]); j++) m->all[k++] = moe8_st_at(m->shards[i], j);
  qsort(m->all, m->count, sizeof *m->all, cmp_view);
  for (size_t i = 1; i < m->count; i++)
    if (!strcmp(m->all[i]->name, m->all[i - 1]->name)) {
      st = moe8__fail(MOE8_ERR_FORMAT, "%s: tensor '%s' is in two shards", dir, m->all[i]->name);
      model_free(m);
      return st;
    }
  /* The layers' root: a text model's, or a multimodal model's language
  ** model (Llama-4 as released; transformers 5 names it the other way). */
  /* DiffusionGemma's text layers are its decoder's (the encoder's are tied
  ** to them: one copy in the file, either one); transformers 5.24's
  ** save_pretrained of Kimi K2.5 writes its language model's layers as
  ** language_model.model.blocks. */
  /* Nemotron-3 Nano Omni's released files and transformers' save_pretrained
  ** of it: language_model.backbone.layers.; Nemotron-3.5 Transcribe's
  ** (NeMo's names, which save_pretrained writes too): llm.model.layers. */
  enum { NWRAP = 8, PLAIN = NWRAP, TOP };
  static const char *const roots[NWRAP + 2] = {"language_model.model.layers.", "model.language_model.layers.", "model.llm.layers.",
                                               "model.decoder.layers.", "model.encoder.language_model.layers.",
                                               "language_model.model.blocks.", "language_model.backbone.layers.", "llm.model.layers.",
                                               "model.layers.", "layers."};
  int ri = PLAIN;
  for (size_t i = 0; i < m->count && ri == PLAIN; i++)
    for (int r = 0; r < NWRAP; r++)
      if (!strncmp(m->all[i]->name, roots[r], strlen(roots[r]))) { ri = r; break; }
  /* Mistral's own files (Mistral-Large-4 as released and as transformers
  ** saves it) and DeepSeek-V4's released ones: the layers at the top,
  ** "layers.L.", when no other root is there */
  bool other = false;
  for (size_t i = 0; i < m->count && ri == PLAIN && !other; i++) other = !strncmp(m->all[i]->name, roots[PLAIN], strlen(roots[PLAIN]));
  for (size_t i = 0; i < m->count && ri == PLAIN && !other && (m->cfg.mistral_names || m->cfg.top_layers); i++)
    if (!strncmp(m->all[i]->name, roots[TOP], strlen(roots[TOP]))) ri = TOP;
  snprintf(m->root, sizeof m->root, "%s", roots[ri]);
  /* a family's own root (DBRX's transformer.blocks.), when the file has no other */
  const size_t lr = strlen(m->cfg.layers_root);
  for (size_t i = 0; i < m->count && lr && ri == PLAIN && !other; i++)
    if (!strncmp(m->all[i]->name, m->cfg.layers_root, lr)) { snprintf(m->root, sizeof m->root, "%s", m->cfg.layers_root); break; }
  *out = m;
  return MOE8_OK;
}

moe8_status moe8_model_open(const char *dir, moe8_model **out) { return moe8_model_open_as(dir, NULL, out); }

const moe8_hf_config *moe8_model_config(const moe8_model *m) { return m ? &m->cfg : NULL; }
size_t moe8_model_tensor_count(const moe8_model *m) { return m ? m->count : 0; }
const moe8_tensor_view *moe8_model_tensor_at(const moe8_model *m, size_t i) { return m && i < m->count ? m->all[i] : NULL; }

const moe8_tensor_view *moe8_model_find(const moe8_model *m, const char *name) {
  if (!m || !name) return NULL;
  const moe8_tensor_view key = {.name = name}, *kp = &key;
  const moe8_tensor_view *const *r = bsearch(&kp, m->all, m->count, sizeof *m->all, cmp_view);
  return r ? *r : NULL;
}

void moe8_model_prefix(const moe8_model *m, int64_t layer, char *buf, size_t cap) {
  const char *root = m ? m->root : "model.layers.";
  if (m && m->cfg.nllb) { /* NLLB-MoE: the encoder's layers, then the decoder's */
    const bool dec = layer >= m->cfg.enc_layers;
    snprintf(buf, cap, "model.%s.layers.%lld.ffn.", dec ? "decoder" : "encoder", (long long)(layer - (dec ? m->cfg.enc_layers : 0)));
    return;
  }
  if (m && m->cfg.encdec) { /* SwitchTransformers: the encoder's blocks, then the decoder's (layer.1 its cross-attention) */
    const bool dec = layer >= m->cfg.enc_layers;
    snprintf(buf, cap, "%s.block.%lld.layer.%d.mlp.", dec ? "decoder" : "encoder", (long long)(layer - (dec ? m->cfg.enc_layers : 0)),
             dec ? 2 : 1);
    return;
  }
  if (m && m->cfg.block_in_layer) { /* Gemma-4: router., experts. and the norms are the decoder layer's own */
    snprintf(buf, cap, "%s%lld.", root, (long long)layer);
    return;
  }
  snprintf(buf, cap, "%s%lld.block_sparse_moe.gate.weight", root, (long long)layer);
  const bool bsm = m && m->cfg.arch != MOE8_ARCH_LLAMA4 && moe8_model_find(m, buf); /* Mixtral's, MiniMax's, Kimi's files */
  snprintf(buf, cap, "%s%lld.gate.weight", root, (long long)layer);
  if (m && m->cfg.mistral_names && moe8_model_find(m, buf)) { /* Mistral's files: the block's tensors in the decoder layer */
    snprintf(buf, cap, "%s%lld.", root, (long long)layer);
    return;
  }
  snprintf(buf, cap, "%s%lld.moe.gate.weight", root, (long long)layer);
  const bool step = m && m->cfg.layer.act == MOE8_ACT_SWIGLU_POST && moe8_model_find(m, buf); /* Step-3.5/3.7's released files */
  snprintf(buf, cap, "%s%lld.%s", root, (long long)layer,
           step ? "moe."
           : m && m->cfg.block_prefix[0] ? m->cfg.block_prefix
           : bsm ? "block_sparse_moe." : m && m->cfg.arch == MOE8_ARCH_LLAMA4 ? "feed_forward." : "mlp.");
}

const char *moe8__model_root(const moe8_model *m) { return m ? m->root : "model.layers."; }

/* Ungated experts (Nemotron-H's relu2): an up projection and a down one,
** no gate; their files name the first projection up_proj. */
static bool ungated(const moe8_model *m) { return !moe8__act_gated(m->cfg.layer.act); }

/* The block's fused float experts, gate_up (which 0) or down (1): the
** family's names (Granite's input_linear / output_linear) or transformers'
** (an ungated family's experts.up_proj [E, F, D]). */
static void fused_name(const moe8_model *m, const char *p, int which, char *buf, size_t cap) {
  const char *own = which ? m->cfg.fused_dn : m->cfg.fused_gu;
  snprintf(buf, cap, "%s%s", p, own[0] ? own : which ? "experts.down_proj" : ungated(m) ? "experts.up_proj" : "experts.gate_up_proj");
  if (own[0] && m->cfg.fused_interleaved && !moe8_model_find(m, buf)) /* Inkling-2's files, or transformers' own names */
    snprintf(buf, cap, "%s%s", p, which ? "experts.down_proj" : "experts.gate_up_proj");
}

/* The projection names of the expert whose tensors are named base + ...:
** {gate,up,down}_proj, w1/w3/w2 (Mixtral's, Kimi's files) or HY-V4's
** linear_gate/up_proj/down_proj (transformers renames its linear_gate to
** gate_proj at load and back at save), whichever the file holds there
** (the family's own when none). */
static const char *proj_name(const moe8_model *m, const char *base, int which) {
  static const char *const hf[3] = {"gate_proj", "up_proj", "down_proj"}, *const mx[3] = {"w1", "w3", "w2"};
  static const char *const hy[3] = {"linear_gate", "up_proj", "down_proj"};
  if (m->cfg.nllb) return which == 2 ? "fc2" : "fc1"; /* NLLB-MoE's ungated experts: fc2(act(fc1(x))), biased */
  if (m->cfg.encdec) return which == 2 ? "wo" : "wi"; /* SwitchTransformers' ungated experts: wo(act(wi(x))) */
  const char *const *a = m->cfg.arch == MOE8_ARCH_MIXTRAL ? mx : hf, *const *b = a == mx ? hf : mx;
  char n[400];
  snprintf(n, sizeof n, "%s%s.weight", base, a[0]);
  if (moe8_model_find(m, n)) return a[which];
  snprintf(n, sizeof n, "%s%s.weight", base, b[0]);
  if (moe8_model_find(m, n)) return b[which];
  snprintf(n, sizeof n, "%s%s.weight", base, hy[0]);
  return moe8_model_find(m, n) ? hy[which] : a[which];
}

/* The routed experts' names: experts.N. (SwitchTransformers': experts.expert_N.) */
static const char *xdir(const moe8_model *m) { return m->cfg.encdec ? "experts.expert_" : "experts."; }

/* The names a selection bias has in the families' files (DeepSeek-V3's
** router holds it; MiniMax-M2's and EXAONE's blocks do; Sarvam's files
** name it expert_bias); the first the file holds. */
static const char *const k_bias_names[] = {"gate.e_score_correction_bias", "e_score_correction_bias", "gate.expert_bias", "expert_bias",
                                           "moe_statics.e_score_correction_bias" /* ERNIE-4.5's, [1, E] */,
                                           "experts.e_score_correction_bias" /* Laguna's files */,
                                           "gate.bias" /* Inkling-2's files */, "router_bias" /* Step-3.5/3.7's */,
                                           "router.e_score_correction_bias" /* LongCat-Flash's */};

static void dims(char *buf, size_t cap, int ndim, const int64_t *shape) {
  buf[0] = 0;
  for (int i = 0; i < ndim; i++) snprintf(buf + strlen(buf), cap - strlen(buf), "%s%lld", i ? ", " : "", (long long)shape[i]);
}

/* Finds a tensor and checks its shape. */
static moe8_status need(const moe8_model *m, const char *name, int ndim, const int64_t *shape, const moe8_tensor_view **out) {
  const moe8_tensor_view *t = moe8_model_find(m, name);
  *out = t;
  char want[128], got[128];
  dims(want, sizeof want, ndim, shape);
  if (!t) return moe8__fail(MOE8_ERR_FORMAT, "model: missing tensor '%s' (expected [%s])", name, want);
  bool ok = t->ndim == ndim;
  for (int i = 0; ok && i < ndim; i++) ok = t->shape[i] == shape[i];
  dims(got, sizeof got, t->ndim, t->shape);
  if (!ok) return moe8__fail(MOE8_ERR_SHAPE, "model: tensor '%s' is %d-D [%s], the config says %d-D [%s]", name, t->ndim, got, ndim, want);
  return MOE8_OK;
}

static bool is_float_file(moe8_file_dtype t) { return t == MOE8_FDT_F32 || t == MOE8_FDT_BF16 || t == MOE8_FDT_F16; }

/* Drops the file pages behind a tensor we are done with (they are read
** again from the file if needed). */
static void drop_pages(const moe8_tensor_view *t) {
  if (!t || !t->nbytes) return;
  const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), a = (uintptr_t)t->data, b = a + t->nbytes;
  const uintptr_t a0 = (a + pg - 1) / pg * pg, b0 = b / pg * pg; /* whole pages inside the tensor only */
  if (b0 > a0) (void)madvise((void *)a0, b0 - a0, MADV_DONTNEED);
}

const char *moe8_model_format(const moe8_model *m, int64_t layer) {
  if (!m) return "";
  moe8_model *mm = (moe8_model *)m;
  char p[128], n[256];
  moe8_model_prefix(m, layer, p, sizeof p);
  if (m->cfg.layer.product_keys) { /* Doge's key and value tables: floats, or moe8's codes of them */
    snprintf(n, sizeof n, "%sdown_embed.scale", p);
    const moe8_tensor_view *ks = moe8_model_find(m, n);
    snprintf(n, sizeof n, "%sdown_embed.qweight", p);
    const moe8_tensor_view *kq = moe8_model_find(m, n);
    snprintf(n, sizeof n, "%sdown_embed.weight", p);
    const moe8_tensor_view *k = moe8_model_find(m, n);
    if (ks || kq)
      snprintf(mm->fmt, sizeof mm->fmt, "moe8 %s product-key tables [E,%lld,1,1] per row",
               !kq ? "(no codes)" : kq->dtype == MOE8_FDT_I8 ? "i8" : "f8e4m3", (long long)(ks && ks->ndim == 4 ? ks->shape[1] : 0));
    else snprintf(mm->fmt, sizeof mm->fmt, "%s product-key tables (unquantized)", k ? moe8_file_dtype_name(k->dtype) : "no");
    return mm->fmt;
  }
  snprintf(n, sizeof n, "%sexperts.gate_up_proj.scale", p);
  const moe8_tensor_view *s = moe8_model_find(m, n), *t;
  if (s) {
    snprintf(n, sizeof n, "%sexperts.gate_up_proj.qweight_packed", p);
    const moe8_tensor_view *pk = moe8_model_find(m, n);
    snprintf(n, sizeof n, "%sexperts.gate_up_proj.qweight", p);
    t = pk ? pk : moe8_model_find(m, n);
    const int64_t nb = s->ndim == 4 ? s->shape[1] : 0;
    snprintf(mm->fmt, sizeof mm->fmt, "moe8 %s [E,%lld,1,N]%s", t && t->dtype == MOE8_FDT_I8 ? "i8" : "f8e4m3", (long long)nb,
             pk ? " packed" : "");
    return mm->fmt;
  }
  snprintf(n, sizeof n, "%sexperts.gate_up_proj_blocks", p);
  if (moe8_model_find(m, n)) {
    snprintf(mm->fmt, sizeof mm->fmt, "%smxfp4 (E2M1 values, E8M0 scales per 32 along K)", m->cfg.arch == MOE8_ARCH_GPT_OSS ? "" : "moe8 ");
    return mm->fmt;
  }
  fused_name(m, p, 0, n, sizeof n);
  if ((t = moe8_model_find(m, n))) {
    snprintf(mm->fmt, sizeof mm->fmt, "%s fused 3-D (unquantized)", moe8_file_dtype_name(t->dtype));
    return mm->fmt;
  }
  snprintf(n, sizeof n, "%sexperts.mlp.w1", p);
  if (m->cfg.stacked_experts && (t = moe8_model_find(m, n))) {
    snprintf(mm->fmt, sizeof mm->fmt, "%s stacked 2-D (unquantized)", moe8_file_dtype_name(t->dtype));
    return mm->fmt;
  }
  snprintf(n, sizeof n, "%sgate_proj.weight", p);
  if (m->cfg.layer.act == MOE8_ACT_SWIGLU_POST && (t = moe8_model_find(m, n)) && t->ndim == 3) {
    snprintf(mm->fmt, sizeof mm->fmt, "%s stacked 3-D per projection (unquantized)", moe8_file_dtype_name(t->dtype));
    return mm->fmt;
  }
  char base[200];
  snprintf(base, sizeof base, "%s%s0.", p, xdir(m));
  snprintf(n, sizeof n, "%s%s.weight", base, proj_name(m, base, ungated(m)));
  t = moe8_model_find(m, n);
  if (t && t->dtype == MOE8_FDT_F8_E4M3) {
    snprintf(mm->fmt, sizeof mm->fmt, "deepseek f8e4m3 %lldx%lld blocks", (long long)m->cfg.block_n, (long long)m->cfg.block_k);
    return mm->fmt;
  }
  snprintf(mm->fmt, sizeof mm->fmt, "%s (unquantized)", t ? moe8_file_dtype_name(t->dtype) : "no expert weights");
  return mm->fmt;
}

/* ---- reading one expert ---------------------------------------------------------- */
/* One expert's weights as the layer takes them: gate|up [D, 2F] and down
** [F, D], as f32 values or as codes with [nb, 1, N] scales. */
typedef struct xbuf {
  float   *gu, *dn;
  uint8_t *gq, *dq;
  float   *gs, *ds;
} xbuf;

static float f32_at(const moe8_tensor_view *t, size_t i) {
  const unsigned char *p = (const unsigned char *)t->data + i * moe8_file_dtype_size(t->dtype);
  float v = 0.0f;
  (void)moe8_file_to_f32(&v, p, t->dtype, 1);
  return v;
}

/* dst[k·ld + n] = src[n·K + k]: a transpose in 64×64 tiles (each tile's
** reads and writes stay in the L1 cache), tiles over the threads. */
#define TRANSPOSE(name, type)                                                                                      \
  static void name(type *dst, const type *src, int64_t N, int64_t K, int64_t ld) {                                  \
    _Pragma("omp parallel for collapse(2) schedule(static)")                                                        \
    for (int64_t n0 = 0; n0 < N; n0 += 64)                                                                          \
      for (int64_t k0 = 0; k0 < K; k0 += 64) {                                                                      \
        const int64_t n1 = n0 + 64 < N ? n0 + 64 : N, k1 = k0 + 64 < K ? k0 + 64 : K;                               \
        for (int64_t k = k0; k < k1; k++)                                                                           \
          for (int64_t n = n0; n < n1; n++) dst[k * ld + n] = src[n * K + k];                                       \
      }                                                                                                             \
  }
TRANSPOSE(transpose_u8, uint8_t)
TRANSPOSE(transpose_f32, float)

/* An unquantized [N, K] (out × in) weight into dst [K, ld] at column col0. */
static moe8_status put_float(const moe8_tensor_view *t, const void *data, int64_t N, int64_t K, float *dst, int64_t ld, int64_t col0,
                             float *tmp) {
  moe8_status st = moe8_file_to_f32(tmp, data, t->dtype, (size_t)(N * K));
  if (st != MOE8_OK) return st;
  transpose_f32(dst + col0, tmp, N, K, ld);
  return MOE8_OK;
}

/* A DeepSeek FP8 weight q[N, K] with scale_inv [ceil(N/bn), ceil(K/bk)]
** into codes dst [K, ld] at col0 and per-column K-block scales s [kb, ld]
** (each block's scale repeated over its bn columns: a 2-D block scale is a
** special case of [nb, 1, N]). */
static void put_fp8(const moe8_tensor_view *q, const moe8_tensor_view *si, int64_t N, int64_t K, int64_t bn, int64_t bk, uint8_t *dst,
                    float *s, int64_t ld, int64_t col0) {
  const int64_t nbk = moe8__cdiv(K, bk), nbn = moe8__cdiv(N, bn);
  transpose_u8(dst + col0, q->data, N, K, ld);
  float *sv = malloc(sizeof(float) * (size_t)(nbn * nbk));
  if (sv) (void)moe8_file_to_f32(sv, si->data, si->dtype, (size_t)(nbn * nbk));
  for (int64_t kb = 0; kb < nbk; kb++)
    for (int64_t n = 0; n < N; n++) s[kb * ld + col0 + n] = sv ? sv[(n / bn) * nbk + kb] : f32_at(si, (size_t)((n / bn) * nbk + kb));
  free(sv);
}

/* FP8 codes whose exponent and mantissa bits are all ones are NaN in e4m3fn. */
static moe8_status check_codes(const moe8_tensor_view *t) {
  const uint8_t *q = t->data;
  for (size_t i = 0; i < t->nbytes; i++)
    if ((q[i] & 0x7F) == 0x7F)
      return moe8__fail(MOE8_ERR_NONFINITE, "model: tensor '%s' holds the NaN code 0x%02X at element %zu (byte offset %zu in the file)",
                        t->name, q[i], i, t->offset + i);
  return MOE8_OK;
}

static moe8_status check_scale_tensor(const moe8_tensor_view *t) {
  const size_t n = t->nbytes / moe8_file_dtype_size(t->dtype);
  for (size_t i = 0; i < n; i++) {
    const float v = f32_at(t, i);
    if (!(v > 0.0f) || !isfinite(v))
      return moe8__fail(MOE8_ERR_NONFINITE, "model: scale tensor '%s' element %zu is %g (scales must be positive and finite)", t->name, i,
                        (double)v);
  }
  return MOE8_OK;
}

typedef struct loader {
  const moe8_model *m;
  const char       *p;          /* tensor-name prefix of the layer */
  int64_t           D, bn, bk;
  float            *tmp;        /* [max(N·K)] */
  bool              fp8;        /* the routed experts are FP8 blocks */
} loader;

/* Reads weight w (0 gate, 1 up, 2 down) of one expert whose tensors are
** named base + {gate,up,down}_proj.weight (or w1/w3/w2), width F. */
static moe8_status read_proj(loader *ld, const char *base, int w, int64_t F, bool fp8, xbuf *b, const moe8_tensor_view **used) {
  char n[320];
  const int64_t D = ld->D, N = w == 2 ? D : F, K = w == 2 ? F : D, shape[2] = {N, K};
  const moe8_tensor_view *t, *ts;
  snprintf(n, sizeof n, "%s%s.weight", base, proj_name(ld->m, base, w));
  moe8_status st = need(ld->m, n, 2, shape, &t);
  if (st != MOE8_OK) return st;
  used[0] = t;
  if (!fp8) {
    if (!is_float_file(t->dtype))
      return moe8__fail(MOE8_ERR_DTYPE, "model: '%s' is %s, want F32, BF16 or F16%s", n, moe8_file_dtype_name(t->dtype),
                        t->dtype == MOE8_FDT_F8_E4M3 ? " (F8_E4M3 only when the routed experts are F8_E4M3)" : "");
    return w == 2 ? put_float(t, t->data, N, K, b->dn, D, 0, ld->tmp)
                  : ungated(ld->m) ? put_float(t, t->data, N, K, b->gu, F, 0, ld->tmp) : put_float(t, t->data, N, K, b->gu, 2 * F, w ? F : 0, ld->tmp);
  }
  if (t->dtype != MOE8_FDT_F8_E4M3)
    return moe8__fail(MOE8_ERR_DTYPE, "model: '%s' is %s but the routed experts are F8_E4M3 (every expert weight must be)", n,
                      moe8_file_dtype_name(t->dtype));
  if ((st = check_codes(t)) != MOE8_OK) return st;
  snprintf(n, sizeof n, "%s%s.weight_scale_inv", base, proj_name(ld->m, base, w));
  const int64_t sshape[2] = {moe8__cdiv(N, ld->bn), moe8__cdiv(K, ld->bk)};
  if ((st = need(ld->m, n, 2, sshape, &ts)) != MOE8_OK) return st;
  if (!is_float_file(ts->dtype)) return moe8__fail(MOE8_ERR_DTYPE, "model: '%s' is %s, want F32, BF16 or F16", n, moe8_file_dtype_name(ts->dtype));
  if ((st = check_scale_tensor(ts)) != MOE8_OK) return st;
  used[1] = ts;
  if (w == 2) put_fp8(t, ts, N, K, ld->bn, ld->bk, b->dq, b->ds, D, 0);
  else if (ungated(ld->m)) put_fp8(t, ts, N, K, ld->bn, ld->bk, b->gq, b->gs, F, 0);
  else put_fp8(t, ts, N, K, ld->bn, ld->bk, b->gq, b->gs, 2 * F, w ? F : 0);
  return MOE8_OK;
}

static moe8_status read_expert(loader *ld, const char *base, int64_t F, bool fp8, xbuf *b, bool drop) {
  const moe8_tensor_view *used[3][2] = {{0}};
  moe8_status st = MOE8_OK;
  for (int w = ungated(ld->m); w < 3 && st == MOE8_OK; w++) st = read_proj(ld, base, w, F, fp8, b, used[w]); /* ungated: no gate */
  for (int w = 0; w < 3 && drop; w++) { drop_pages(used[w][0]); drop_pages(used[w][1]); }
  return st;
}

static moe8_status xbuf_alloc(xbuf *b, int64_t D, int64_t F, bool codes, int64_t bk) {
  memset(b, 0, sizeof *b);
  if (codes) {
    b->gq = malloc((size_t)(D * 2 * F)); b->dq = malloc((size_t)(F * D));
    b->gs = malloc(sizeof(float) * (size_t)(moe8__cdiv(D, bk) * 2 * F)); b->ds = malloc(sizeof(float) * (size_t)(moe8__cdiv(F, bk) * D));
    if (b->gq && b->dq && b->gs && b->ds) return MOE8_OK;
  } else {
    b->gu = malloc(sizeof(float) * (size_t)(D * 2 * F)); b->dn = malloc(sizeof(float) * (size_t)(F * D));
    if (b->gu && b->dn) return MOE8_OK;
  }
  return moe8__fail(MOE8_ERR_NOMEM, "model: out of memory for one expert's weights");
}

static void xbuf_free(xbuf *b) { free(b->gu); free(b->dn); free(b->gq); free(b->dq); free(b->gs); free(b->ds); }

/* The tile is in config.json (moe8_quantization.tile_size): a block
** count alone is ambiguous (K = 200 in 2 blocks: tile 100 or 128), so moe8
** quantize also records it beside the scales (the file's __metadata__
** moe8.tile_size); the two must agree. */
static moe8_status check_tile_record(const moe8_model *m, const moe8_tensor_view *s) {
  for (size_t i = 0; i < m->nshards; i++) {
    if (moe8_st_find(m->shards[i], s->name) != s) continue;
    const char *rec = moe8__st_meta(m->shards[i], "moe8.tile_size");
    char *end = NULL;
    const long long rt = rec ? strtoll(rec, &end, 10) : 0;
    if (rec && (end == rec || *end || rt != (long long)m->cfg.moe8_tile))
      return moe8__fail(MOE8_ERR_FORMAT, "model: '%s' was quantized with tile_size %s (%s, __metadata__ moe8.tile_size), but config.json "
                        "moe8_quantization.tile_size is %lld: its scales would be read as blocks of another size; refused", s->name, rec,
                        moe8_st_path(m->shards[i]), (long long)m->cfg.moe8_tile);
  }
  return MOE8_OK;
}

/* The moe8 format: [E, D, 2F] / [E, F, D] codes (or packed) and [E, nb, 1, N] scales. */
static moe8_status load_moe8(loader *ld, moe8_layer *L, moe8_model *mm, bool *borrowed) {
  const moe8_model *m = ld->m;
  const moe8_hf_config *c = &m->cfg;
  const int64_t E = c->layer.num_experts, D = ld->D, F = c->layer.ffn, N1 = ungated(m) ? F : 2 * F; /* gate|up, or up alone */
  const char *p = ld->p;
  char n[320];
  const moe8_tensor_view *gq = NULL, *dq = NULL, *gs, *ds;
  snprintf(n, sizeof n, "%sexperts.gate_up_proj.scale", p);
  gs = moe8_model_find(m, n);
  if (!gs || gs->ndim != 4 || gs->dtype != MOE8_FDT_F32 || gs->shape[0] != E || gs->shape[1] < 1 || gs->shape[2] != 1 || gs->shape[3] != N1)
    return moe8__fail(MOE8_ERR_FORMAT, "model: '%s' missing or not F32 [%lld, nb, 1, %lld]", n, (long long)E, (long long)N1);
  moe8_status st = check_tile_record(m, gs);
  if (st != MOE8_OK) return st;
  const int64_t nb = gs->shape[1], tile = nb == 1 && c->moe8_tile >= D ? 0 : c->moe8_tile;
  if (moe8__cdiv(D, tile ? tile : D) != nb)
    return moe8__fail(MOE8_ERR_FORMAT, "model: '%s' has %lld K blocks, but moe8_quantization.tile_size %lld in config.json gives %lld", n,
                      (long long)nb, (long long)c->moe8_tile, (long long)moe8__cdiv(D, tile ? tile : D));
  const int64_t dshape_s[4] = {E, tile ? moe8__cdiv(F, tile) : 1, 1, D};
  snprintf(n, sizeof n, "%sexperts.down_proj.scale", p);
  st = need(m, n, 4, dshape_s, &ds);
  if (st != MOE8_OK) return st;
  if (ds->dtype != MOE8_FDT_F32) return moe8__fail(MOE8_ERR_DTYPE, "model: '%s' must be F32", n);
  if ((st = check_scale_tensor(gs)) != MOE8_OK || (st = check_scale_tensor(ds)) != MOE8_OK) return st;
  const bool packed = c->moe8_packed == 1;
  moe8_dtype qt = MOE8_DTYPE_NONE;
  snprintf(n, sizeof n, "%sexperts.gate_up_proj.%s", p, packed ? "qweight_packed" : "qweight");
  const moe8_tensor_view *probe = moe8_model_find(m, n);
  if (!probe) return moe8__fail(MOE8_ERR_FORMAT, "model: missing tensor '%s'%s", n, packed ? " (config.json says moe8_quantization.packed_layout 1)" : "");
  qt = probe->dtype == MOE8_FDT_F8_E4M3 ? MOE8_DTYPE_F8E4M3 : probe->dtype == MOE8_FDT_I8 ? MOE8_DTYPE_I8 : MOE8_DTYPE_NONE;
  if (qt == MOE8_DTYPE_NONE) return moe8__fail(MOE8_ERR_DTYPE, "model: '%s' must be F8_E4M3 or I8, not %s", n, moe8_file_dtype_name(probe->dtype));
  if (packed) {
    const int64_t s1[2] = {E, (int64_t)moe8_gmm_packed_size(qt, 1, D, N1)}, s2[2] = {E, (int64_t)moe8_gmm_packed_size(qt, 1, F, D)};
    if ((st = need(m, n, 2, s1, &gq)) != MOE8_OK) return st;
    snprintf(n, sizeof n, "%sexperts.down_proj.qweight_packed", p);
    if ((st = need(m, n, 2, s2, &dq)) != MOE8_OK) return st;
  } else {
    const int64_t s1[3] = {E, D, N1}, s2[3] = {E, F, D};
    if ((st = need(m, n, 3, s1, &gq)) != MOE8_OK) return st;
    snprintf(n, sizeof n, "%sexperts.down_proj.qweight", p);
    if ((st = need(m, n, 3, s2, &dq)) != MOE8_OK) return st;
  }
  if (dq->dtype != gq->dtype) return moe8__fail(MOE8_ERR_DTYPE, "model: '%s' and '%s' must have one dtype", gq->name, dq->name);
  if (qt == MOE8_DTYPE_F8E4M3 && ((st = check_codes(gq)) != MOE8_OK || (st = check_codes(dq)) != MOE8_OK)) return st;
  if ((st = moe8__layer_begin_load(L, qt, tile)) != MOE8_OK) return st;
  /* Scales may be unaligned inside the mapping: copied (they are ~3% of the codes). */
  float *sg = malloc(gs->nbytes + 4), *sd = malloc(ds->nbytes + 4);
  if (!sg || !sd) { free(sg); free(sd); return moe8__fail(MOE8_ERR_NOMEM, "model: out of memory"); }
  memcpy(sg, gs->data, gs->nbytes);
  memcpy(sd, ds->data, ds->nbytes);
  const size_t ngs = gs->nbytes / 4 / (size_t)E, nds = ds->nbytes / 4 / (size_t)E;
  if (packed && L->inference && moe8__layer_packable(L, 0)) {
    /* The codes stay where they are: the layer borrows the mapping. */
    st = moe8__layer_put_packed(L, 0, gq->data, sg, dq->data, sd);
    if (st == MOE8_OK) { atomic_fetch_add(&mm->refs, 1); *borrowed = true; }
  } else if (packed) {
    /* A training layer (or a layout these sizes cannot use): unpack. */
    uint8_t *g1 = malloc((size_t)(D * N1)), *d1 = malloc((size_t)(F * D));
    if (!g1 || !d1) st = moe8__fail(MOE8_ERR_NOMEM, "model: out of memory");
    const size_t pg = moe8_gmm_packed_size(qt, 1, D, N1), pd = moe8_gmm_packed_size(qt, 1, F, D);
    for (int64_t e = 0; e < E && st == MOE8_OK; e++) {
      const uint8_t *a = (const uint8_t *)gq->data + (size_t)e * pg, *b = (const uint8_t *)dq->data + (size_t)e * pd;
      for (int64_t k = 0; k < D; k++)
        for (int64_t j = 0; j < N1; j++) g1[k * N1 + j] = a[moe8__pk_offset(qt, D, N1, k, j)];
      for (int64_t k = 0; k < F; k++)
        for (int64_t j = 0; j < D; j++) d1[k * D + j] = b[moe8__pk_offset(qt, F, D, k, j)];
      st = moe8__layer_put_expert(L, 0, e, NULL, NULL, g1, sg + (size_t)e * ngs, d1, sd + (size_t)e * nds);
    }
    free(g1); free(d1);
  } else {
    for (int64_t e = 0; e < E && st == MOE8_OK; e++)
      st = moe8__layer_put_expert(L, 0, e, NULL, NULL, (const uint8_t *)gq->data + (size_t)(e * D * N1), sg + (size_t)e * ngs,
                                  (const uint8_t *)dq->data + (size_t)(e * F * D), sd + (size_t)e * nds);
    if (L->inference) { drop_pages(gq); drop_pages(dq); }
  }
  free(sg); free(sd);
  return st;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* need() of a float tensor (F32, BF16 or F16). */
static moe8_status need_float(const moe8_model *m, const char *name, int ndim, const int64_t *shape, const moe8_tensor_view **out) {
  moe8_status st = need(m, name, ndim, shape, out);
  if (st == MOE8_OK && !is_float_file((*out)->dtype))
    st = moe8__fail(MOE8_ERR_DTYPE, "model: '%s' is %s, want F32, BF16 or F16", name, moe8_file_dtype_name((*out)->dtype));
  return st;
}

/* Expert i of experts stacked per projection, gate sv[0] and up sv[1]
** [n, F, D], down sv[2] [n, D, F] (out x in), into b's gate|up [D, 2F]
** and down [F, D] (Step-3.5/3.7's files; Inkling's shared experts). */
static moe8_status put_stacked(const moe8_tensor_view *const sv[3], int64_t i, int64_t D, int64_t F, xbuf *b, float *tmp) {
  const size_t es = (size_t)(F * D);
  moe8_status st = put_float(sv[0], (const char *)sv[0]->data + (size_t)i * es * moe8_file_dtype_size(sv[0]->dtype), F, D, b->gu, 2 * F, 0, tmp);
  if (st == MOE8_OK) st = put_float(sv[1], (const char *)sv[1]->data + (size_t)i * es * moe8_file_dtype_size(sv[1]->dtype), F, D, b->gu, 2 * F, F, tmp);
  if (st == MOE8_OK) st = put_float(sv[2], (const char *)sv[2]->data + (size_t)i * es * moe8_file_dtype_size(sv[2]->dtype), D, F, b->dn, D, 0, tmp);
  return st;
}

static moe8_status load_layer(const moe8_model *m, int64_t layer, const moe8_rules *rules, const moe8_load_options *opt,
                              moe8_layer **out);

/* No rules on an FP8 checkpoint: the activations it was made for, FP8
** e4m3 per token and K block (DeepSeek's activation_scheme "dynamic" with
** its weight block along K; a moe8 file's recorded tile), so every caller
** (the command, the library, Python) computes the same bytes. */
moe8_status moe8_model_load_layer_ex(const moe8_model *m, int64_t layer, const moe8_rules *rules, const moe8_load_options *opt,
                                     moe8_layer **out) {
  if (!m || !out) return moe8__fail(MOE8_ERR_INVALID_ARG, "model: NULL argument");
  const bool inference = opt && opt->mode == MOE8_LOAD_INFERENCE;
  /* moe8's file made under rules: those rules (every layer, every
  ** activation setting), so its run is the input's run with them; a
  ** training load of its MXFP4 experts decodes them (no rule). */
  if (!rules && m->rules && !(strstr(moe8_model_format(m, layer), "mxfp4") && !inference)) {
    moe8_rules *rec = NULL;
    moe8_status st = moe8_rules_parse(m->rules, strlen(m->rules), m->rules_name, &rec);
    if (st == MOE8_OK) st = load_layer(m, layer, rec, opt, out);
    moe8_rules_destroy(rec);
    return st;
  }
  if (!rules && strstr(moe8_model_format(m, layer), "moe8 mxfp4") && inference) {
    /* moe8's MXFP4 file for inference: kept as MXFP4 (the rule it was written under) */
    const char *j = "{\"rules\": [{\"module_path\": \".*\", \"weight_qtype\": \"mxfp4\"}]}";
    moe8_rules *mx = NULL;
    moe8_status st = moe8_rules_parse(j, strlen(j), "the checkpoint's mxfp4 rule", &mx);
    if (st == MOE8_OK) st = load_layer(m, layer, mx, opt, out);
    moe8_rules_destroy(mx);
    return st;
  }
  if (rules || !strstr(moe8_model_format(m, layer), "f8e4m3")) return load_layer(m, layer, rules, opt, out);
  const moe8_hf_config *hc = &m->cfg;
  const bool own = strstr(moe8_model_format(m, layer), "moe8") != NULL;
  const int64_t tile = own ? hc->moe8_tile : hc->block_k ? hc->block_k : 128;
  char j[256];
  if (tile > 0) snprintf(j, sizeof j, "{\"rules\": [{\"module_path\": \".*\", \"act_qtype\": \"float8_e4m3fn\", \"tile_size\": %lld}]}", (long long)tile);
  else snprintf(j, sizeof j, "{\"rules\": [{\"module_path\": \".*\", \"act_qtype\": \"float8_e4m3fn\"}]}");
  moe8_rules *dyn = NULL;
  moe8_status st = moe8_rules_parse(j, strlen(j), "the checkpoint's dynamic activation rule", &dyn);
  if (st == MOE8_OK) st = load_layer(m, layer, dyn, opt, out);
  moe8_rules_destroy(dyn);
  return st;
}

/* ---- GPT-OSS ---------------------------------------------------------------------- */
/* The E2M1 values of MXFP4 codes 0..15 (sign, 2 exponent bits, 1 mantissa
** bit): every one exact in bf16 and f32. */
static const float k_e2m1[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

/* One expert's [N, K] MXFP4 weight (blocks [N, K/32, 16] bytes, the low
** nibble first; E8M0 scales [N, K/32], 2^(s-127)) decoded exactly, as
** value(n, k) into out[n * K + k].  Scale 255 (NaN) and values past the
** f32 range are refused, naming the tensor and the element. */
static moe8_status mxfp4_decode(const moe8_tensor_view *bt, const moe8_tensor_view *st, int64_t e, int64_t N, int64_t K, float *out) {
  const int64_t nb = K / 32;
  const uint8_t *blk = (const uint8_t *)bt->data + (size_t)(e * N * nb * 16), *sc = (const uint8_t *)st->data + (size_t)(e * N * nb);
  for (int64_t n = 0; n < N; n++)
    for (int64_t b = 0; b < nb; b++) {
      const uint8_t s = sc[n * nb + b];
      if (s == 255)
        return moe8__fail(MOE8_ERR_NONFINITE, "model: '%s'[%lld, %lld, %lld] is 255, the E8M0 NaN (byte offset %zu of the tensor)", st->name,
                          (long long)e, (long long)n, (long long)b, (size_t)((e * N + n) * nb + b));
      for (int64_t j = 0; j < 16; j++) {
        const uint8_t v = blk[(n * nb + b) * 16 + j];
        const float lo = ldexpf(k_e2m1[v & 15], (int)s - 127), hi = ldexpf(k_e2m1[v >> 4], (int)s - 127);
        if (!isfinite(lo) || !isfinite(hi))
          return moe8__fail(MOE8_ERR_NONFINITE, "model: '%s' expert %lld row %lld block %lld: code x 2^(%d - 127) overflows f32", bt->name,
                            (long long)e, (long long)n, (long long)b, (int)s);
        out[n * K + b * 32 + 2 * j] = lo;
        out[n * K + b * 32 + 2 * j + 1] = hi;
      }
    }
  return MOE8_OK;
}

/* A GPT-OSS expert tensor: float `name` [E, K, N] (x · W layout), or its
** MXFP4 pair name_blocks [E, N, K/32, 16] + name_scales [E, N, K/32]. */
typedef struct gptoss_w {
  const moe8_tensor_view *f, *blocks, *scales;
} gptoss_w;

/* An MXFP4 *_blocks / *_scales pair into weight memory: the scales
** checked (255, the E8M0 NaN, refused, and blocks whose largest code
** overflows f32 under their scale), the blocks moved into the kernels'
** layout (moe8__mx4_repack, or with cols moe8__mx4_to_cols with the
** scales) a few MB at a time, each part's file pages dropped once copied
** (the layer then holds the file's bytes once).  With cols each expert's
** N is a multiple of 16 (the layer's widths are multiples of 32). */
static moe8_status mx4_take(const moe8_tensor_view *blocks, const moe8_tensor_view *scales, bool cols, uint8_t **bo, uint8_t **so) {
  const int64_t K = blocks->shape[blocks->ndim - 2] * 32, rows = (int64_t)(blocks->nbytes / (size_t)(K / 2)), nb = K / 32;
  const int64_t rb = cols ? K / 2 : moe8__mx4_row_bytes(K);
  *bo = *so = NULL;
  if (cols && (rows % 16 || blocks->shape[1] % 16))
    return moe8__fail(MOE8_ERR_SHAPE, "model: '%s' has %lld rows an expert; the int8 MXFP4 layout needs a multiple of 16", blocks->name,
                      (long long)blocks->shape[1]);
  *bo = moe8__alloc_weights((size_t)(rows * rb));
  *so = moe8__alloc_weights(scales->nbytes);
  if (!*bo || !*so) { free(*bo); free(*so); *bo = *so = NULL; return moe8__fail(MOE8_ERR_NOMEM, "model: out of memory for '%s'", blocks->name); }
  const uint8_t *sc = scales->data, *bl = blocks->data;
  for (size_t i = 0; i < scales->nbytes; i++) {
    if (sc[i] == 255) {
      free(*bo); free(*so); *bo = *so = NULL;
      return moe8__fail(MOE8_ERR_NONFINITE, "model: '%s' element %zu is 255, the E8M0 NaN (byte offset %zu of the tensor)", scales->name, i, i);
    }
    if (sc[i] >= 253)
      for (int j = 0; j < 16; j++) {
        const uint8_t v = bl[i * 16 + (size_t)j], m = (v & 7) > (v >> 4 & 7) ? (v & 7) : (v >> 4 & 7);
        if (ldexpf(k_e2m1[m], (int)sc[i] - 127) > 3.40282347e38f) {
          free(*bo); free(*so); *bo = *so = NULL;
          return moe8__fail(MOE8_ERR_NONFINITE, "model: '%s' block %zu: a code x 2^(%d - 127) overflows f32", blocks->name, i, (int)sc[i]);
        }
      }
  }
  const int64_t chunk = (((int64_t)8 << 20) / (K / 2) + 16) / 16 * 16;
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t n = rows - r0 < chunk ? rows - r0 : chunk;
    if (cols) moe8__mx4_to_cols(*bo + r0 * rb, *so + r0 * nb, bl + r0 * (K / 2), sc + r0 * nb, n, K);
    else moe8__mx4_repack(*bo + r0 * rb, bl + r0 * (K / 2), n, K);
    const moe8_tensor_view part = {blocks->name, blocks->dtype, 1, {n * (K / 2)}, bl + r0 * (K / 2), (size_t)(n * (K / 2)), 0};
    drop_pages(&part);
  }
  if (!cols) memcpy(*so, sc, scales->nbytes);
  drop_pages(scales);
  return MOE8_OK;
}

/* A float [K, N] weight (x · W) replaced by its MXFP4 values: what a
** layer under the mxfp4 rule keeps of it (moe8__mx4_quantize).  A training
** load of moe8's MXFP4 file gives the float shared expert these values, so
** it sees the weights an inference load of the same file sees. */
static moe8_status gptoss_read(const gptoss_w *w, int64_t e, int64_t K, int64_t N, float *out, float *tmp);

static moe8_status mx4_round_trip(float *w, int64_t K, int64_t N) {
  if (K % 32) return moe8__fail(MOE8_ERR_SHAPE, "model: an MXFP4 file's shared expert needs K = %lld to be a multiple of 32", (long long)K);
  const int64_t nb = K / 32;
  uint8_t *blk = malloc((size_t)(N * nb * 16)), *sc = malloc((size_t)(N * nb));
  float *tmp = malloc(sizeof(float) * (size_t)(N * K));
  moe8_status st = blk && sc && tmp ? MOE8_OK : moe8__fail(MOE8_ERR_NOMEM, "model: out of memory");
  if (st == MOE8_OK) {
    moe8__mx4_quantize(w, K, N, blk, sc);
    const moe8_tensor_view bt = {"the shared expert's MXFP4 blocks", MOE8_FDT_U8, 0, {0}, blk, (size_t)(N * nb * 16), 0},
                           stv = {"the shared expert's MXFP4 scales", MOE8_FDT_U8, 0, {0}, sc, (size_t)(N * nb), 0};
    const gptoss_w v = {NULL, &bt, &stv};
    st = gptoss_read(&v, 0, K, N, w, tmp);
  }
  free(blk); free(sc); free(tmp);
  return st;
}

static moe8_status gptoss_find(const moe8_model *m, const char *p, const char *what, int64_t E, int64_t K, int64_t N, gptoss_w *w) {
  char n[320];
  moe8_status st;
  *w = (gptoss_w){0};
  snprintf(n, sizeof n, "%sexperts.%s_blocks", p, what);
  if (moe8_model_find(m, n)) {
    if (K % 32) return moe8__fail(MOE8_ERR_SHAPE, "model: MXFP4 '%s' needs its K = %lld to be a multiple of 32", n, (long long)K);
    const int64_t bs[4] = {E, N, K / 32, 16}, ss[3] = {E, N, K / 32};
    if ((st = need(m, n, 4, bs, &w->blocks)) != MOE8_OK) return st;
    snprintf(n, sizeof n, "%sexperts.%s_scales", p, what);
    if ((st = need(m, n, 3, ss, &w->scales)) != MOE8_OK) return st;
    if (w->blocks->dtype != MOE8_FDT_U8 || w->scales->dtype != MOE8_FDT_U8)
      return moe8__fail(MOE8_ERR_DTYPE, "model: MXFP4 '%s' and its scales must be U8", w->blocks->name);
    return MOE8_OK;
  }
  snprintf(n, sizeof n, "%sexperts.%s", p, what);
  const int64_t fs[3] = {E, K, N};
  if ((st = need(m, n, 3, fs, &w->f)) != MOE8_OK) return st;
  if (!is_float_file(w->f->dtype)) return moe8__fail(MOE8_ERR_DTYPE, "model: '%s' is %s, want F32, BF16 or F16 (or MXFP4 _blocks/_scales)", n,
                                                      moe8_file_dtype_name(w->f->dtype));
  return MOE8_OK;
}

/* Expert e of w as [K, N] f32 (x · W) into out (tmp: N·K floats). */
static moe8_status gptoss_read(const gptoss_w *w, int64_t e, int64_t K, int64_t N, float *out, float *tmp) {
  if (w->f) return moe8_file_to_f32(out, (const char *)w->f->data + (size_t)(e * K * N) * moe8_file_dtype_size(w->f->dtype), w->f->dtype,
                                    (size_t)(K * N));
  moe8_status st = mxfp4_decode(w->blocks, w->scales, e, N, K, tmp);
  if (st == MOE8_OK) transpose_f32(out, tmp, N, K, N);
  return st;
}

/* Both MXFP4 pairs of the routed experts into weight memory (mx4_take);
** b[4]: gate|up blocks and scales, down blocks and scales; nothing kept on
** failure. */
static moe8_status mx4_take_pair(const gptoss_w *wgu, const gptoss_w *wdn, bool cols, uint8_t *b[4]) {
  b[0] = b[1] = b[2] = b[3] = NULL;
  moe8_status st = mx4_take(wgu->blocks, wgu->scales, cols, &b[0], &b[1]);
  if (st == MOE8_OK && (st = mx4_take(wdn->blocks, wdn->scales, cols, &b[2], &b[3])) != MOE8_OK) { free(b[0]); free(b[1]); }
  return st;
}

/* The routed experts of a layer in its load whose gate|up [E, D, 2F]
** (gate columns, then up) and down [E, F, D] are floats or moe8's MXFP4:
** the MXFP4 bytes kept as they are by an inference layer under the mxfp4
** rule, else each expert read (decoded exactly) into the layer.  gu, dn:
** an expert's buffers; tmp: 2F·D floats; progress counted of `total`. */
static moe8_status put_routed(moe8_layer *L, const gptoss_w *wgu, const gptoss_w *wdn, int64_t E, int64_t D, int64_t F, float *gu, float *dn,
                              float *tmp, const moe8_load_options *o, int64_t total) {
  if (wgu->blocks && L->inference && L->wmx) {
    uint8_t *b[4];
    moe8_status st = mx4_take_pair(wgu, wdn, L->aq, b);
    return st == MOE8_OK ? moe8__layer_put_mx4(L, b[0], b[1], b[2], b[3]) : st;
  }
  moe8_status st = MOE8_OK;
  double last = now_s();
  for (int64_t e = 0; e < E && st == MOE8_OK; e++) {
    st = gptoss_read(wgu, e, D, moe8__act_gated(L->cfg.act) ? 2 * F : F, gu, tmp);
    if (st == MOE8_OK) st = gptoss_read(wdn, e, F, D, dn, tmp);
    if (st == MOE8_OK) st = moe8__layer_put_expert(L, 0, e, gu, dn, NULL, NULL, NULL, NULL);
    if (o && o->progress && now_s() - last > 1.0) { last = now_s(); o->progress(o->progress_ctx, e + 1, total); }
  }
  return st;
}

/* GPT-OSS's MoE block (transformers' GptOssMLP): router.weight [E, D] and
** router.bias [E]; experts.gate_up_proj [E, D, 2F] with gate and up in
** alternate columns (gate = column 2f, up = 2f + 1) and its bias [E, 2F]
** alike; experts.down_proj [E, F, D] and its bias [E, D]; the weights as
** floats or MXFP4 (decoded exactly at load; moe8 keeps f32 values, or
** quantizes them by the rules). */
static moe8_status load_gpt_oss(const moe8_model *m, int64_t layer, const moe8_rules *rules, const moe8_load_options *o, moe8_layer **out) {
  const moe8_hf_config *c = &m->cfg;
  const int64_t E = c->layer.num_experts, D = c->layer.hidden, F = c->layer.ffn;
  char p[128], n[320], mp[160];
  moe8_model_prefix(m, layer, p, sizeof p);
  snprintf(mp, sizeof mp, "%sexperts", p);
  const moe8_tensor_view *rw, *rb, *gub, *dnb;
  moe8_status st;
  const int64_t rs[2] = {E, D}, rbs[1] = {E}, gbs[2] = {E, 2 * F}, dbs[2] = {E, D};
  snprintf(n, sizeof n, "%srouter.weight", p);
  if ((st = need(m, n, 2, rs, &rw)) != MOE8_OK) return st;
  snprintf(n, sizeof n, "%srouter.bias", p);
  if ((st = need(m, n, 1, rbs, &rb)) != MOE8_OK) return st;
  snprintf(n, sizeof n, "%sexperts.gate_up_proj_bias", p);
  if ((st = need(m, n, 2, gbs, &gub)) != MOE8_OK) return st;
  snprintf(n, sizeof n, "%sexperts.down_proj_bias", p);
  if ((st = need(m, n, 2, dbs, &dnb)) != MOE8_OK) return st;
  const moe8_tensor_view *fl[4] = {rw, rb, gub, dnb};
  for (int i = 0; i < 4; i++)
    if (!is_float_file(fl[i]->dtype))
      return moe8__fail(MOE8_ERR_DTYPE, "model: '%s' is %s, want F32, BF16 or F16", fl[i]->name, moe8_file_dtype_name(fl[i]->dtype));
  /* The experts: GPT-OSS's floats or MXFP4, or moe8's own file of them
  ** (moe8 quantize: FP8 / int8 codes, gate columns then up; the biases
  ** stay GPT-OSS's, in alternate columns). */
  snprintf(n, sizeof n, "%sexperts.gate_up_proj.scale", p);
  const bool own = moe8_model_find(m, n) != NULL;
  gptoss_w wgu = {0}, wdn = {0};
  if (!own && (st = gptoss_find(m, p, "gate_up_proj", E, D, 2 * F, &wgu)) != MOE8_OK) return st;
  if (!own && (st = gptoss_find(m, p, "down_proj", E, F, D, &wdn)) != MOE8_OK) return st;
  /* the router's transpose buffer now; an expert's three more only when
  ** the experts are decoded (not for MXFP4 kept as it is) */
  float *tmp = malloc(sizeof(float) * (size_t)(E * D)), *raw = NULL, *gu = NULL, *dn = NULL;
  float *bgu = malloc(sizeof(float) * (size_t)(2 * E * F));
  moe8_layer *L = NULL;
  if (!tmp || !bgu) st = moe8__fail(MOE8_ERR_NOMEM, "model: out of memory");
  if (st == MOE8_OK) st = moe8__layer_create(&c->layer, rules, mp, o->mode == MOE8_LOAD_INFERENCE, &L);
  if (st == MOE8_OK) st = put_float(rw, rw->data, E, D, L->w[MOE8_W_ROUTER], E, 0, tmp);
  if (st == MOE8_OK) st = moe8_file_to_f32(L->w[MOE8_W_ROUTER_BIAS], rb->data, rb->dtype, (size_t)E);
  if (st == MOE8_OK) st = moe8_file_to_f32(L->w[MOE8_W_DOWN_BIAS], dnb->data, dnb->dtype, (size_t)(E * D));
  if (st == MOE8_OK) st = moe8_file_to_f32(bgu, gub->data, gub->dtype, (size_t)(2 * E * F));
  /* moe8 keeps gate columns, then up columns */
  for (int64_t e = 0; e < E && st == MOE8_OK; e++)
    for (int64_t f = 0; f < F; f++) {
      L->w[MOE8_W_GU_BIAS][e * 2 * F + f] = bgu[e * 2 * F + 2 * f];
      L->w[MOE8_W_GU_BIAS][e * 2 * F + F + f] = bgu[e * 2 * F + 2 * f + 1];
    }
  if (st == MOE8_OK && own) {
    loader ld = {m, p, D, 128, 128, tmp, false};
    bool borrowed = false;
    st = load_moe8(&ld, L, (moe8_model *)m, &borrowed);
    if (borrowed) { L->keep = (void *)m; L->release = model_release; }
    if (st == MOE8_OK) st = moe8__layer_end_load(L);
    if (st == MOE8_OK && o->progress) o->progress(o->progress_ctx, E, E);
    free(tmp); free(bgu);
    if (st != MOE8_OK) { moe8_layer_destroy(L); return st; }
    *out = L;
    return MOE8_OK;
  }
  if (st == MOE8_OK && L->inference && !L->wq && moe8__mx4_acts_ok(L) && wgu.blocks && wdn.blocks) {
    /* MXFP4 kept as the file holds it: 4.25 bits a weight, decoded by the
    ** kernels (moe8__ktable.mx4_rows). */
    uint8_t *b[4];
    st = mx4_take_pair(&wgu, &wdn, L->aq, b);
    if (st == MOE8_OK) st = moe8__layer_load_mx4(L, b[0], b[1], b[2], b[3]);
    if (st == MOE8_OK && o->progress) o->progress(o->progress_ctx, E, E);
    free(tmp); free(raw); free(gu); free(dn); free(bgu);
    if (st != MOE8_OK) { moe8_layer_destroy(L); return st; }
    *out = L;
    return MOE8_OK;
  }
  if (st == MOE8_OK) {
    free(tmp);
    tmp = malloc(sizeof(float) * (size_t)(2 * F * D));
    raw = malloc(sizeof(float) * (size_t)(2 * F * D));
    gu = malloc(sizeof(float) * (size_t)(2 * F * D));
    dn = malloc(sizeof(float) * (size_t)(F * D));
    if (!tmp || !raw || !gu || !dn) st = moe8__fail(MOE8_ERR_NOMEM, "model: out of memory");
  }
  if (st == MOE8_OK) st = moe8__layer_begin_load(L, MOE8_DTYPE_NONE, 0);
  double last = now_s();
  for (int64_t e = 0; e < E && st == MOE8_OK; e++) {
    st = gptoss_read(&wgu, e, D, 2 * F, raw, tmp);
    for (int64_t d = 0; d < D && st == MOE8_OK; d++)
      for (int64_t f = 0; f < F; f++) {
        gu[d * 2 * F + f] = raw[d * 2 * F + 2 * f];
        gu[d * 2 * F + F + f] = raw[d * 2 * F + 2 * f + 1];
      }
    if (st == MOE8_OK) st = gptoss_read(&wdn, e, F, D, dn, tmp);
    if (st == MOE8_OK) st = moe8__layer_put_expert(L, 0, e, gu, dn, NULL, NULL, NULL, NULL);
    if (o->progress && now_s() - last > 1.0) { last = now_s(); o->progress(o->progress_ctx, e + 1, E); }
  }
  if (st == MOE8_OK) st = moe8__layer_end_load(L);
  if (st == MOE8_OK && o->progress) o->progress(o->progress_ctx, E, E);
  free(tmp); free(raw); free(gu); free(dn); free(bgu);
  if (st != MOE8_OK) { moe8_layer_destroy(L); return st; }
  *out = L;
  return MOE8_OK;
}

/* Llama-4's MoE block (transformers' Llama4TextMoe): feed_forward.router
** .weight [E, D]; experts.gate_up_proj [E, D, 2F] in x · W layout, gate
** the first F columns, up the next; experts.down_proj [E, F, D]; the
** shared expert shared_expert.{gate,up,down}_proj.weight (out × in). */
static moe8_status load_llama4(const moe8_model *m, int64_t layer, const moe8_rules *rules, const moe8_load_options *o, moe8_layer **out) {
  const moe8_hf_config *c = &m->cfg;
  const int64_t E = c->layer.num_experts, D = c->layer.hidden, F = c->layer.ffn, Fs = c->layer.shared_ffn;
  char p[128], n[320], mp[160];
  moe8_model_prefix(m, layer, p, sizeof p);
  snprintf(mp, sizeof mp, "%sexperts", p);
  const moe8_tensor_view *rw, *sw[3];
  moe8_status st;
  const int64_t rs[2] = {E, D};
  snprintf(n, sizeof n, "%srouter.weight", p);
  if ((st = need(m, n, 2, rs, &rw)) != MOE8_OK) return st;
  static const char *const sn[3] = {"gate_proj", "up_proj", "down_proj"};
  for (int i = 0; i < 3 && Fs > 0; i++) {
    const int64_t sh[2] = {i == 2 ? D : Fs, i == 2 ? Fs : D};
    snprintf(n, sizeof n, "%sshared_expert.%s.weight", p, sn[i]);
    if ((st = need(m, n, 2, sh, &sw[i])) != MOE8_OK) return st;
    if (!is_float_file(sw[i]->dtype)) return moe8__fail(MOE8_ERR_DTYPE, "model: '%s' is %s, want F32, BF16 or F16", n, moe8_file_dtype_name(sw[i]->dtype));
  }
  if (!is_float_file(rw->dtype)) return moe8__fail(MOE8_ERR_DTYPE, "model: '%s' is %s, want F32, BF16 or F16", rw->name, moe8_file_dtype_name(rw->dtype));
  /* The experts: Llama-4's floats [E, D, 2F] / [E, F, D], or moe8's own
  ** file of them (moe8 quantize: FP8 / int8 codes, or MXFP4). */
  snprintf(n, sizeof n, "%sexperts.gate_up_proj.scale", p);
  const bool own = moe8_model_find(m, n) != NULL;
  snprintf(n, sizeof n, "%sexperts.gate_up_proj_blocks", p);
  const bool own_mx = moe8_model_find(m, n) != NULL;
  gptoss_w wgu = {0}, wdn = {0};
  if (!own && (st = gptoss_find(m, p, "gate_up_proj", E, D, 2 * F, &wgu)) != MOE8_OK) return st;
  if (!own && (st = gptoss_find(m, p, "down_proj", E, F, D, &wdn)) != MOE8_OK) return st;
  if (!own && !own_mx && (!wgu.f || !wdn.f))
    return moe8__fail(MOE8_ERR_FORMAT, "model: Llama-4's experts are floats ('%sexperts.gate_up_proj') or moe8's own file of them", p);
  if (own_mx && (!wgu.blocks || !wdn.blocks))
    return moe8__fail(MOE8_ERR_FORMAT, "model: layer %lld has MXFP4 gate_up_proj blocks but a float down_proj: both or neither", (long long)layer);
  const int64_t FF = F > Fs ? F : Fs, big = (E > 2 * FF ? E : 2 * FF) * D;
  float *tmp = malloc(sizeof(float) * (size_t)big), *gu = malloc(sizeof(float) * (size_t)(2 * FF * D)), *dn = malloc(sizeof(float) * (size_t)(FF * D));
  moe8_layer *L = NULL;
  bool borrowed = false;
  if (!tmp || !gu || !dn) st = moe8__fail(MOE8_ERR_NOMEM, "model: out of memory");
  if (st == MOE8_OK) st = moe8__layer_create(&c->layer, rules, mp, o->mode == MOE8_LOAD_INFERENCE, &L);
  if (st == MOE8_OK) st = put_float(rw, rw->data, E, D, L->w[MOE8_W_ROUTER], E, 0, tmp);
  if (st == MOE8_OK && own) {
    loader ld = {m, p, D, 128, 128, tmp, false};
    st = load_moe8(&ld, L, (moe8_model *)m, &borrowed);
    if (borrowed) { L->keep = (void *)m; L->release = model_release; }
  } else if (st == MOE8_OK && (st = moe8__layer_begin_load(L, MOE8_DTYPE_NONE, 0)) == MOE8_OK) {
    st = put_routed(L, &wgu, &wdn, E, D, F, gu, dn, tmp, o, E + 1);
  }
  if (st == MOE8_OK && Fs > 0) {
    st = put_float(sw[0], sw[0]->data, Fs, D, gu, 2 * Fs, 0, tmp);
    if (st == MOE8_OK) st = put_float(sw[1], sw[1]->data, Fs, D, gu, 2 * Fs, Fs, tmp);
    if (st == MOE8_OK) st = put_float(sw[2], sw[2]->data, D, Fs, dn, D, 0, tmp);
    if (st == MOE8_OK && own_mx && !L->wmx && (st = mx4_round_trip(gu, D, 2 * Fs)) == MOE8_OK) st = mx4_round_trip(dn, Fs, D);
    if (st == MOE8_OK) st = moe8__layer_put_expert(L, 1, 0, gu, dn, NULL, NULL, NULL, NULL);
  }
  if (st == MOE8_OK) st = moe8__layer_end_load(L);
  if (st == MOE8_OK && o->progress) o->progress(o->progress_ctx, E + 1, E + 1);
  free(tmp); free(gu); free(dn);
  if (st != MOE8_OK) { moe8_layer_destroy(L); return st; }
  *out = L;
  return MOE8_OK;
}

/* ---- Doge ------------------------------------------------------------------------ */
/* moe8's codes of Doge's two tables (moe8 quantize, docs/files.md): P
** down_embed.qweight / up_embed.qweight [E, D] F8_E4M3 or I8, one dtype,
** with P down_embed.scale / up_embed.scale [E, nb, 1, 1] F32 (nb =
** ceil(D / tile), the recorded tile; 1 per channel), every scale positive
** and finite, no NaN code; the tile record beside the scales agrees with
** config.json.  Checked, all four, before the layer takes any. */
static moe8_status doge_codes(const moe8_model *m, const char *p, int64_t layer, const moe8_tensor_view *q[2], const moe8_tensor_view *s[2],
                              moe8_dtype *qt) {
  const moe8_hf_config *c = &m->cfg;
  const int64_t E = c->layer.num_experts, D = c->layer.hidden, tile = c->moe8_tile, nb = tile > 0 ? moe8__cdiv(D, tile) : 1;
  const int64_t qs[2] = {E, D}, ss[4] = {E, nb, 1, 1};
  static const char *const tn[2] = {"down_embed", "up_embed"};
  char n[320], w[320];
  moe8_status st = MOE8_OK;
  for (int i = 0; i < 2 && st == MOE8_OK; i++) {
    /* floats and codes of one layer: which to run would be a guess */
    snprintf(w, sizeof w, "%s%s.weight", p, tn[i]);
    snprintf(n, sizeof n, "%s%s.qweight", p, tn[i]);
    if (moe8_model_find(m, w))
      return moe8__fail(MOE8_ERR_FORMAT, "model: layer %lld holds '%s' (a float table) beside moe8's codes of its product-key tables "
                        "('%s.qweight' / '.scale'): which to run is ambiguous (a file holds both tables as floats or both as codes)",
                        (long long)layer, w, tn[i]);
    if ((st = need(m, n, 2, qs, &q[i])) != MOE8_OK) return st;
    if (q[i]->dtype != MOE8_FDT_F8_E4M3 && q[i]->dtype != MOE8_FDT_I8)
      return moe8__fail(MOE8_ERR_DTYPE, "model: '%s' [%lld, %lld] is %s, want F8_E4M3 or I8 (moe8's codes of the table)", n, (long long)E,
                        (long long)D, moe8_file_dtype_name(q[i]->dtype));
    if (q[i]->dtype != q[0]->dtype)
      return moe8__fail(MOE8_ERR_DTYPE, "model: '%s' is %s and '%s' %s: both tables hold one dtype", q[0]->name,
                        moe8_file_dtype_name(q[0]->dtype), n, moe8_file_dtype_name(q[i]->dtype));
    if (q[i]->dtype == MOE8_FDT_F8_E4M3 && (st = check_codes(q[i])) != MOE8_OK) return st;
    snprintf(n, sizeof n, "%s%s.scale", p, tn[i]);
    if ((st = need(m, n, 4, ss, &s[i])) != MOE8_OK) {
      char keep[1024];
      snprintf(keep, sizeof keep, "%s", moe8_last_error());
      return moe8__fail(st, "%s: moe8's per-row scales of '%s' (config.json moe8_quantization.tile_size %lld: %lld block(s) along %lld)", keep,
                        q[i]->name, (long long)tile, (long long)nb, (long long)D);
    }
    if (s[i]->dtype != MOE8_FDT_F32)
      return moe8__fail(MOE8_ERR_DTYPE, "model: '%s' [%lld, %lld, 1, 1] is %s, want F32", n, (long long)E, (long long)nb,
                        moe8_file_dtype_name(s[i]->dtype));
    if ((st = check_scale_tensor(s[i])) == MOE8_OK) st = check_tile_record(m, s[i]);
  }
  if (st == MOE8_OK) *qt = q[0]->dtype == MOE8_FDT_I8 ? MOE8_DTYPE_I8 : MOE8_DTYPE_F8E4M3;
  return st;
}

/* DogeCDMoE's tensors under P = model.layers.L.mlp.: router_gate.weight
** [2N, D] (N = floor(sqrt(E)) keys per half), down_embed.weight [E, D]
** (each expert's key: its input row) and up_embed.weight [E, D] (its
** value: its output row), the dense SwiGLU gate_proj / up_proj [Fs, D] and
** down_proj [D, Fs]; floats.  Expert e goes in as up [D, 1] = key row and
** down [1, D] = value row (the same memory as the rows).  moe8's file of
** the tables (doge_codes) goes in as codes, as the layer holds them after
** quantizing the floats under the rule it was made with; the dense SwiGLU
** is quantized at load with that rule's spec, as then. */
static moe8_status load_doge(const moe8_model *m, int64_t layer, const moe8_rules *rules, const moe8_load_options *o, moe8_layer **out) {
  const moe8_hf_config *c = &m->cfg;
  const int64_t E = c->layer.num_experts, D = c->layer.hidden, Fs = c->layer.shared_ffn, N2 = 2 * moe8__pk_keys(E);
  char p[128], n[320], mp[160];
  moe8_model_prefix(m, layer, p, sizeof p);
  snprintf(mp, sizeof mp, "%sexperts", p);
  static const char *const tn[6] = {"router_gate.weight", "down_embed.weight", "up_embed.weight", "gate_proj.weight", "up_proj.weight",
                                    "down_proj.weight"};
  static const char *const cn[4] = {"down_embed.qweight", "down_embed.scale", "up_embed.qweight", "up_embed.scale"};
  const int64_t sh[6][2] = {{N2, D}, {E, D}, {E, D}, {Fs, D}, {Fs, D}, {D, Fs}};
  const moe8_tensor_view *tv[6] = {0}, *cq[2] = {0}, *cs[2] = {0};
  moe8_dtype qt = MOE8_DTYPE_NONE;
  bool codes = false;
  for (int i = 0; i < 4 && !codes; i++) {
    snprintf(n, sizeof n, "%s%s", p, cn[i]);
    codes = moe8_model_find(m, n) != NULL;
  }
  moe8_status st = codes ? doge_codes(m, p, layer, cq, cs, &qt) : MOE8_OK;
  for (int i = 0; i < 6 && st == MOE8_OK; i++) {
    if (codes && (i == 1 || i == 2)) continue;
    snprintf(n, sizeof n, "%s%s", p, tn[i]);
    st = need_float(m, n, 2, sh[i], &tv[i]);
  }
  if (st != MOE8_OK) return st;
  const int64_t big = (N2 > Fs ? N2 : Fs) * D, tile = c->moe8_tile, nb = tile > 0 ? moe8__cdiv(D, tile) : 1;
  float *tmp = malloc(sizeof(float) * (size_t)big + 16), *gu = malloc(sizeof(float) * (size_t)(2 * Fs * D + D)),
        *dn = malloc(sizeof(float) * (size_t)(Fs * D + D));
  /* the scales may be unaligned inside the mapping: copied */
  float *ks = codes ? malloc(cs[0]->nbytes + 4) : NULL, *vs = codes ? malloc(cs[1]->nbytes + 4) : NULL;
  moe8_layer *L = NULL;
  double last = now_s();
  st = tmp && gu && dn && (!codes || (ks && vs)) ? MOE8_OK : moe8__fail(MOE8_ERR_NOMEM, "model: out of memory");
  if (st == MOE8_OK) st = moe8__layer_create(&c->layer, rules, mp, o->mode == MOE8_LOAD_INFERENCE, &L);
  if (st == MOE8_OK) st = put_float(tv[0], tv[0]->data, N2, D, L->w[MOE8_W_ROUTER], N2, 0, tmp);
  if (st == MOE8_OK) st = moe8__layer_begin_load(L, qt, codes ? tile : 0);
  if (st == MOE8_OK && codes) {
    /* What the load quantizes (the dense SwiGLU) takes the rule's
    ** calibration when the rule asks for the file's type and tile, as a
    ** load of the float file under that rule does. */
    moe8_quant_spec rspec;
    if (L->has_rule && moe8_rule_weight_spec(&L->rule, &rspec) && rspec.qtype == L->wspec.qtype && rspec.tile == L->wspec.tile)
      L->wspec = rspec;
    memcpy(ks, cs[0]->data, cs[0]->nbytes);
    memcpy(vs, cs[1]->data, cs[1]->nbytes);
  }
  const size_t ksz = codes ? 0 : moe8_file_dtype_size(tv[1]->dtype) * (size_t)D, vsz = codes ? 0 : moe8_file_dtype_size(tv[2]->dtype) * (size_t)D;
  for (int64_t e = 0; e < E && st == MOE8_OK; e++) {
    if (codes) {
      st = moe8__layer_put_expert(L, 0, e, NULL, NULL, (const uint8_t *)cq[0]->data + (size_t)(e * D), ks + e * nb,
                                  (const uint8_t *)cq[1]->data + (size_t)(e * D), vs + e * nb);
    } else {
      st = moe8_file_to_f32(gu, (const char *)tv[1]->data + (size_t)e * ksz, tv[1]->dtype, (size_t)D);
      if (st == MOE8_OK) st = moe8_file_to_f32(dn, (const char *)tv[2]->data + (size_t)e * vsz, tv[2]->dtype, (size_t)D);
      if (st == MOE8_OK) st = moe8__layer_put_expert(L, 0, e, gu, dn, NULL, NULL, NULL, NULL);
    }
    if (o->progress && now_s() - last > 1.0) { last = now_s(); o->progress(o->progress_ctx, e + 1, E + 1); }
  }
  if (st == MOE8_OK && L->inference) { drop_pages(codes ? cq[0] : tv[1]); drop_pages(codes ? cq[1] : tv[2]); }
  if (st == MOE8_OK) st = put_float(tv[3], tv[3]->data, Fs, D, gu, 2 * Fs, 0, tmp);
  if (st == MOE8_OK) st = put_float(tv[4], tv[4]->data, Fs, D, gu, 2 * Fs, Fs, tmp);
  if (st == MOE8_OK) st = put_float(tv[5], tv[5]->data, D, Fs, dn, D, 0, tmp);
  if (st == MOE8_OK) st = moe8__layer_put_expert(L, 1, 0, gu, dn, NULL, NULL, NULL, NULL);
  if (st == MOE8_OK) st = moe8__layer_end_load(L);
  if (st == MOE8_OK && o->progress) o->progress(o->progress_ctx, E + 1, E + 1);
  free(tmp); free(gu); free(dn); free(ks); free(vs);
  if (st != MOE8_OK) { moe8_layer_destroy(L); return st; }
  *out = L;
  return MOE8_OK;
}

/* A hash table [vocab, top_k] of I64 or I32 expert ids (DeepSeek-V4's
** gate.tid2eid) into the layer; an id outside [0, E) refused, naming the
** tensor, the element and its byte offset in the file. */
static moe8_status put_hash_table(moe8_layer *L, const moe8_tensor_view *t) {
  const int64_t E = L->cfg.num_experts, n = t->shape[0] * t->shape[1];
  const bool i64 = t->dtype == MOE8_FDT_I64;
  int32_t *ids = malloc(sizeof(int32_t) * (size_t)n + 4);
  if (!ids) return moe8__fail(MOE8_ERR_NOMEM, "model: out of memory for '%s'", t->name);
  const unsigned char *b = t->data;
  for (int64_t i = 0; i < n; i++) {
    int64_t v;
    if (i64) { int64_t w; memcpy(&w, b + 8 * i, 8); v = w; }
    else { int32_t w; memcpy(&w, b + 4 * i, 4); v = w; }
    if (v < 0 || v >= E) {
      free(ids);
      return moe8__fail(MOE8_ERR_FORMAT, "model: '%s'[%lld, %lld] = %lld is not an expert id in [0, %lld) (element %lld, byte offset %zu "
                        "in the file)", t->name, (long long)(i / t->shape[1]), (long long)(i % t->shape[1]), (long long)v, (long long)E,
                        (long long)i, t->offset + (size_t)i * (i64 ? 8 : 4));
    }
    ids[i] = (int32_t)v;
  }
  const moe8_status st = moe8_layer_set_hash_table(L, ids, t->shape[0]);
  free(ids);
  return st;
}

static moe8_status load_layer(const moe8_model *m, int64_t layer, const moe8_rules *rules, const moe8_load_options *opt,
                              moe8_layer **out) {
  *out = NULL;
  moe8_load_options o = {sizeof o, MOE8_LOAD_TRAINING, NULL, NULL};
  if (opt) {
    if (opt->size < offsetof(moe8_load_options, progress) || opt->size > (size_t)1 << 16)
      return moe8__fail(MOE8_ERR_INVALID_ARG, "model: moe8_load_options.size = %zu is not a size this library knows", opt->size);
    memcpy(&o, opt, opt->size < sizeof o ? opt->size : sizeof o);
  }
  if (o.mode != MOE8_LOAD_TRAINING && o.mode != MOE8_LOAD_INFERENCE)
    return moe8__fail(MOE8_ERR_INVALID_ARG, "model: unknown load mode %d", (int)o.mode);
  const moe8_hf_config *c = &m->cfg;
  moe8_status st = moe8_hf_config_check_moe_layer(c, layer);
  if (st != MOE8_OK) return st;
  if (c->arch == MOE8_ARCH_GPT_OSS) return load_gpt_oss(m, layer, rules, &o, out);
  if (c->arch == MOE8_ARCH_LLAMA4) return load_llama4(m, layer, rules, &o, out);
  if (c->layer.product_keys) return load_doge(m, layer, rules, &o, out);
  const int64_t E = c->layer.num_experts, D = c->layer.hidden, F = c->layer.ffn, Fs = c->layer.shared_ffn;
  char p[128], n[320], mp[160];
  moe8_model_prefix(m, layer, p, sizeof p);
  snprintf(mp, sizeof mp, "%sexperts", p);
  const moe8_tensor_view *t;
  /* Router and bias first: every format has them. */
  snprintf(n, sizeof n, "%s%s", p, c->router_name[0] ? c->router_name : "gate.weight"); /* the family's own (Jamba: router.weight) */
  /* AFMoE's, HY-V3's files; HunYuan's; transformers' own PhiMoE block (mlp.router.weight); LongCat-Flash's */
  static const char *const router_names[4] = {"router.gate.weight", "gate.wg.weight", "router.weight", "router.classifier.weight"};
  for (int i = 0; i < 4 && !moe8_model_find(m, n); i++) {
    char n2[320];
    snprintf(n2, sizeof n2, "%s%s", p, router_names[i]);
    if (moe8_model_find(m, n2)) snprintf(n, sizeof n, "%s", n2);
  }
  /* the router's experts: LongCat-Flash's identity ones after the routed, or Zaya's skip expert */
  const int64_t ER = E + c->layer.zero_experts + c->layer.skip_experts;
  /* Zaya's MLP router: its output projection gate.router_mlp.out_proj [E + 1, R] is the router weight */
  const int64_t RM = c->layer.router_mlp, RK = RM > 0 ? RM : D;
  if (RM > 0) snprintf(n, sizeof n, "%sgate.router_mlp.out_proj.weight", p);
  const int64_t rshape[2] = {c->text_of_two ? D : ER, c->text_of_two ? ER : RK}; /* ERNIE-4.5-VL's router is in x out */
  if ((st = need(m, n, 2, rshape, &t)) != MOE8_OK) return st;
  if (!is_float_file(t->dtype)) return moe8__fail(MOE8_ERR_DTYPE, "model: router '%s' is %s, want F32, BF16 or F16", n, moe8_file_dtype_name(t->dtype));
  const moe8_tensor_view *router = t, *bias = NULL, *sgate = NULL, *hasht = NULL;
  const bool hash = c->top_layers && layer < MOE8_MAX_MLP_ONLY && c->hash_moe[layer];
  if (hash) { /* DeepSeek-V4's hash layer: its table gate.tid2eid [vocab_size, top_k], no bias */
    snprintf(n, sizeof n, "%sgate.tid2eid", p);
    const int64_t hs[2] = {c->vocab_size, c->layer.top_k};
    if ((st = need(m, n, 2, hs, &hasht)) != MOE8_OK) return st;
    if (hasht->dtype != MOE8_FDT_I64 && hasht->dtype != MOE8_FDT_I32)
      return moe8__fail(MOE8_ERR_DTYPE, "model: '%s' is %s, want I64 or I32 (expert ids)", n, moe8_file_dtype_name(hasht->dtype));
  }
  if (c->has_bias && !hash && RM > 0) { /* Zaya's balancing_biases [E + 1]: required (the skip class's is not 0) */
    snprintf(n, sizeof n, "%sgate.balancing_biases", p);
    const int64_t bs[1] = {ER};
    if ((st = need_float(m, n, 1, bs, &bias)) != MOE8_OK) return st;
  }
  if (c->has_bias && !hash && !bias) {
    for (size_t i = 0; i < sizeof k_bias_names / sizeof k_bias_names[0] && !bias; i++) {
      snprintf(n, sizeof n, "%s%s", p, k_bias_names[i]);
      bias = moe8_model_find(m, n);
    }
    if (!bias) { /* Kolibri-1's files hold it beside the block, in the decoder layer */
      snprintf(n, sizeof n, "%s%lld.moe.router.expert_bias", m->root, (long long)layer);
      bias = moe8_model_find(m, n);
    }
    /* ERNIE-4.5-VL's [2, E]: the text experts' row first; Inkling's: its
    ** routed experts' (the shared ones, the layer's last, are not chosen) */
    const int64_t EB = ER - c->layer.scored_shared; /* (LongCat-Flash's: [E + Z]) */
    if (bias && (!(bias->ndim == 1 || (bias->ndim == 2 && (bias->shape[0] == 1 || (c->text_of_two && bias->shape[0] == 2)))) ||
                 bias->shape[bias->ndim - 1] != EB || !is_float_file(bias->dtype)))
      return moe8__fail(MOE8_ERR_SHAPE, "model: '%s' must be a float vector of %lld (or [1, %lld]%s)", n, (long long)EB, (long long)EB,
                        c->text_of_two ? ", or [2, E]: text, vision" : "");
  }
  if (Fs > 0 && c->layer.shared_gate) {
    snprintf(n, sizeof n, "%sshared_expert_gate.weight", p);
    const int64_t gshape[2] = {1, D};
    if ((st = need(m, n, 2, gshape, &sgate)) != MOE8_OK) return st;
    if (!is_float_file(sgate->dtype)) return moe8__fail(MOE8_ERR_DTYPE, "model: '%s' is %s, want F32, BF16 or F16", n, moe8_file_dtype_name(sgate->dtype));
  }
  const moe8_tensor_view *obias = NULL;
  if (c->layer.out_bias) { /* JetMoE's output bias: the block's "bias" [D] */
    snprintf(n, sizeof n, "%sbias", p);
    const int64_t bshape[1] = {D};
    if ((st = need(m, n, 1, bshape, &obias)) != MOE8_OK) return st;
    if (!is_float_file(obias->dtype)) return moe8__fail(MOE8_ERR_DTYPE, "model: '%s' is %s, want F32, BF16 or F16", n, moe8_file_dtype_name(obias->dtype));
  }
  /* Gemma-4's norms and scales, the decoder layer's own vectors */
  static const struct { moe8_weight_id id; const char *name; } k_norms[4] = {
    {MOE8_W_ROUTER_SCALE, "router.scale"}, {MOE8_W_EXPERT_SCALE, "router.per_expert_scale"},
    {MOE8_W_IN_NORM, "pre_feedforward_layernorm_2.weight"}, {MOE8_W_OUT_NORM, "post_feedforward_layernorm_2.weight"}};
  const bool has_norm[4] = {c->layer.router_norm, c->layer.expert_scale, c->layer.in_norm, c->layer.out_norm};
  const moe8_tensor_view *normv[4] = {NULL, NULL, NULL, NULL};
  for (int i = 0; i < 4; i++) {
    if (!has_norm[i]) continue;
    const char *nm = i == 3 && c->out_norm_name[0] ? c->out_norm_name : k_norms[i].name;
    snprintf(n, sizeof n, "%s%s", p, nm);
    if (i == 3 && c->out_norm_name[0] && !moe8_model_find(m, n)) /* A.X-K1's files: the decoder layer's */
      snprintf(n, sizeof n, "%s%lld.%s", m->root, (long long)layer, nm);
    const int64_t vshape[1] = {i == 1 ? E : D};
    if ((st = need(m, n, 1, vshape, &normv[i])) != MOE8_OK) return st;
    if (!is_float_file(normv[i]->dtype))
      return moe8__fail(MOE8_ERR_DTYPE, "model: '%s' is %s, want F32, BF16 or F16", n, moe8_file_dtype_name(normv[i]->dtype));
  }
  /* Latent experts: the projections around them (Nemotron-H's fc1/fc2_latent_proj;
  ** MuSE-Spark's pre/post_expert_proj, its norms' weights the (1 + w) of the file) */
  const int64_t DX = c->layer.latent > 0 ? c->layer.latent : D; /* the routed experts' width */
  const bool muse = !strncmp(c->model_type, "muse_spark", 10);
  const moe8_tensor_view *latv[4] = {NULL, NULL, NULL, NULL}; /* in [DX, D], out [D, DX], the norms [DX] */
  if (c->layer.latent > 0) {
    static const char *const ln[2][4] = {{"fc1_latent_proj.weight", "fc2_latent_proj.weight", NULL, NULL},
                                         {"pre_expert_proj.weight", "post_expert_proj.weight", "pre_expert_norm.weight",
                                          "experts.post_expert_norm.weight"}};
    for (int i = 0; i < 4; i++) {
      if (!ln[muse][i]) continue;
      const int64_t sh[2] = {i == 1 ? D : DX, i == 0 ? D : DX};
      snprintf(n, sizeof n, "%s%s", p, ln[muse][i]);
      if ((st = need(m, n, i < 2 ? 2 : 1, i < 2 ? sh : sh + 1, &latv[i])) != MOE8_OK) return st;
      if (!is_float_file(latv[i]->dtype))
        return moe8__fail(MOE8_ERR_DTYPE, "model: '%s' is %s, want F32, BF16 or F16", n, moe8_file_dtype_name(latv[i]->dtype));
    }
  }
  /* Zaya's router MLP: the state's projection (and, after the first layer,
  ** the previous state's scale), the norm and the two hidden layers;
  ** each [out, in] as torch's Linear holds it, or a vector [R] */
  static const struct { moe8_weight_id id; const char *name; int rows; } k_rmlp[8] = {
    {MOE8_W_ROUTER_DOWN, "gate.down_proj.weight", 1},        {MOE8_W_ROUTER_DOWN_BIAS, "gate.down_proj.bias", 0},
    {MOE8_W_ROUTER_STATE_SCALE, "gate.router_states_scale", 0}, {MOE8_W_ROUTER_MLP_NORM, "gate.router_mlp.norm.weight", 0},
    {MOE8_W_ROUTER_FC1, "gate.router_mlp.fc1.weight", 2},    {MOE8_W_ROUTER_FC1_BIAS, "gate.router_mlp.fc1.bias", 0},
    {MOE8_W_ROUTER_FC2, "gate.router_mlp.fc2.weight", 2},    {MOE8_W_ROUTER_FC2_BIAS, "gate.router_mlp.fc2.bias", 0}};
  const moe8_tensor_view *rmlp[8] = {NULL};
  for (int i = 0; RM > 0 && i < 8; i++) {
    if (k_rmlp[i].id == MOE8_W_ROUTER_STATE_SCALE && layer == 0) continue; /* ZayaRouter's use_eda: layer_idx != 0 */
    const int64_t sh[2] = {RM, k_rmlp[i].rows == 1 ? D : RM};
    snprintf(n, sizeof n, "%s%s", p, k_rmlp[i].name);
    if ((st = need_float(m, n, k_rmlp[i].rows ? 2 : 1, sh, &rmlp[i])) != MOE8_OK) return st;
  }
  moe8_layer_config lc = c->layer;
  lc.use_selection_bias = bias != NULL;
  lc.router_state = RM > 0 && layer > 0;
  if (lc.scored_shared > 0) { /* Inkling: the weights times route_scale times the layer's gate.global_scale [1] */
    snprintf(n, sizeof n, "%sgate.global_scale", p);
    const moe8_tensor_view *gsv;
    const int64_t gs1[1] = {1};
    if ((st = need(m, n, 1, gs1, &gsv)) != MOE8_OK) return st;
    float g = 0.0f;
    if (!is_float_file(gsv->dtype) || (st = moe8_file_to_f32(&g, gsv->data, gsv->dtype, 1)) != MOE8_OK || !isfinite(g))
      return st != MOE8_OK ? st : moe8__fail(MOE8_ERR_FORMAT, "model: '%s' must be one finite float (it is %s%s)", n,
                                             moe8_file_dtype_name(gsv->dtype), is_float_file(gsv->dtype) ? ", not finite" : "");
    lc.routed_scaling_factor = (lc.routed_scaling_factor != 0.0f ? lc.routed_scaling_factor : 1.0f) * g;
  }
  lc.hash_routing = hash;
  if (c->per_layer_limits && layer < MOE8_MAX_MLP_ONLY) { /* Step's limits, this layer's */
    lc.act_limit = c->act_limits[layer];
    lc.shared_act_limit = c->shared_act_limits[layer];
  }
  const int64_t DF = (D > F ? D : F) > DX ? (D > F ? D : F) : DX, big = DF > Fs ? DF : Fs;
  const int64_t N1 = ungated(m) ? F : 2 * F, N1s = ungated(m) ? Fs : 2 * Fs; /* the first projection's columns */
  const int p0 = ungated(m); /* the first projection: gate, or (ungated) up */
  loader ld = {m, p, D, c->block_n ? c->block_n : 128, c->block_k ? c->block_k : 128, NULL, false};
  /* The largest [N, K] read at once: a fused gate|up [2F, D], a router [E, D], a shared [Fs, D] or fused [2Fs, D]. */
  int64_t rows_max = 2 * F > big ? (2 * F > ER ? 2 * F : ER) : (big > ER ? big : ER);
  if (2 * Fs > rows_max) rows_max = 2 * Fs;
  if (D > rows_max) rows_max = D; /* a latent projection [D, DX] or [DX, D] */
  if (DX > rows_max) rows_max = DX;
  int64_t ntmp = rows_max * big;
  if (RM > 0 && RM * (D > ER ? (D > RM ? D : RM) : (ER > RM ? ER : RM)) > ntmp) /* Zaya's router: [R, D], [R, R], [E + 1, R] */
    ntmp = RM * (D > ER ? (D > RM ? D : RM) : (ER > RM ? ER : RM));
  ld.tmp = malloc(sizeof(float) * (size_t)(ntmp + 16));
  if (!ld.tmp) return moe8__fail(MOE8_ERR_NOMEM, "model: out of memory");
  moe8_layer *L = NULL;
  bool borrowed = false, routed_done = false, mx_file = false;
  xbuf b = {0};
  if ((st = moe8__layer_create(&lc, rules, mp, o.mode == MOE8_LOAD_INFERENCE, &L)) != MOE8_OK) { free(ld.tmp); return st; }
  if (c->text_of_two) st = moe8_file_to_f32(L->w[MOE8_W_ROUTER], router->data, router->dtype, (size_t)(D * ER)); /* [D, E] as held */
  else st = put_float(router, router->data, ER, RK, L->w[MOE8_W_ROUTER], ER, 0, ld.tmp);
  if (st != MOE8_OK) goto fail;
  for (int i = 0; i < 8; i++) {
    if (!rmlp[i]) continue;
    if (k_rmlp[i].rows) st = put_float(rmlp[i], rmlp[i]->data, RM, k_rmlp[i].rows == 1 ? D : RM, L->w[k_rmlp[i].id], RM, 0, ld.tmp);
    else st = moe8_file_to_f32(L->w[k_rmlp[i].id], rmlp[i]->data, rmlp[i]->dtype, (size_t)RM);
    if (st != MOE8_OK) goto fail;
  }
  if (c->encdec && lc.router_bias) { /* SwitchTransformers' router_bias: the classifier's bias [E] */
    const int64_t bs[1] = {E};
    snprintf(n, sizeof n, "%srouter.classifier.bias", p);
    if ((st = need(m, n, 1, bs, &t)) != MOE8_OK) goto fail;
    if (!is_float_file(t->dtype)) { st = moe8__fail(MOE8_ERR_DTYPE, "model: '%s' is %s, want F32, BF16 or F16", n, moe8_file_dtype_name(t->dtype)); goto fail; }
    if ((st = moe8_file_to_f32(L->w[MOE8_W_ROUTER_BIAS], t->data, t->dtype, (size_t)E)) != MOE8_OK) goto fail;
  }
  if (bias && (st = moe8_file_to_f32(L->w[MOE8_W_BIAS], bias->data, bias->dtype, (size_t)(ER - lc.scored_shared))) != MOE8_OK) goto fail;
  if (bias) memset(L->w[MOE8_W_BIAS] + (ER - lc.scored_shared), 0, sizeof(float) * (size_t)lc.scored_shared); /* Inkling's shared: never chosen */
  if (sgate && (st = moe8_file_to_f32(L->w[MOE8_W_SHARED_GATE_W], sgate->data, sgate->dtype, (size_t)D)) != MOE8_OK) goto fail;
  if (obias && (st = moe8_file_to_f32(L->w[MOE8_W_OUT_BIAS], obias->data, obias->dtype, (size_t)D)) != MOE8_OK) goto fail;
  for (int i = 0; i < 4; i++)
    if (normv[i] && (st = moe8_file_to_f32(L->w[k_norms[i].id], normv[i]->data, normv[i]->dtype, (size_t)(i == 1 ? E : D))) != MOE8_OK)
      goto fail;
  if (hasht && (st = put_hash_table(L, hasht)) != MOE8_OK) goto fail;
  if (c->router_logit_scale != 0.0f && c->router_logit_scale != 1.0f) /* MuSE-Spark's output_multiplier, on the weight */
    for (size_t i = 0; i < L->n[MOE8_W_ROUTER]; i++) L->w[MOE8_W_ROUTER][i] *= c->router_logit_scale;
  if (latv[0] && (st = put_float(latv[0], latv[0]->data, DX, D, L->w[MOE8_W_LATENT_IN], DX, 0, ld.tmp)) != MOE8_OK) goto fail;
  if (latv[1] && (st = put_float(latv[1], latv[1]->data, D, DX, L->w[MOE8_W_LATENT_OUT], D, 0, ld.tmp)) != MOE8_OK) goto fail;
  for (int i = 2; i < 4; i++) {
    if (!latv[i]) continue;
    float *v = L->w[i == 2 ? MOE8_W_LATENT_NORM : MOE8_W_EXPERT_OUT_NORM];
    if ((st = moe8_file_to_f32(v, latv[i]->data, latv[i]->dtype, (size_t)DX)) != MOE8_OK) goto fail;
    for (int64_t j = 0; j < DX; j++) v[j] = 1.0f + v[j];
  }
  ld.D = DX; /* the routed experts' width; the shared expert's is D */

  /* The routed experts' format: one of them, never a guess between two. */
  double t0 = now_s(), last = t0;
  const int64_t total = E + (Fs > 0);
  {
    char per[256], fused[256], q[256], base[200];
    snprintf(base, sizeof base, "%s%s0.", p, xdir(m));
    snprintf(per, sizeof per, "%s%s.weight", base, proj_name(m, base, p0));
    fused_name(m, p, 0, fused, sizeof fused);
    snprintf(q, sizeof q, "%sexperts.gate_up_proj.scale", p);
    const char *other = moe8_model_find(m, q) ? q : moe8_model_find(m, fused) ? fused : NULL;
    if (other && moe8_model_find(m, per)) {
      st = moe8__fail(MOE8_ERR_FORMAT, "model: layer %lld holds its experts twice, as '%s' and as per-expert '%s': which one "
                      "to run is ambiguous (remove one set)", (long long)layer, other, per);
      goto fail;
    }
  }
  if (ungated(m)) { /* a gate in an ungated family's files: another model, never run as this one */
    static const char *const gates[3] = {"experts.0.gate_proj.weight", "experts.gate_up_proj", "shared_experts.gate_proj.weight"};
    for (int i = 0; i < 3; i++) {
      snprintf(n, sizeof n, "%s%s", p, gates[i]);
      if (moe8_model_find(m, n)) {
        st = moe8__fail(MOE8_ERR_FORMAT, "model: '%s' is a gate projection, but %s's experts are ungated (%s): the file does not hold "
                        "this family's block", n, c->model_type, c->layer.act == MOE8_ACT_RELU ? "relu" : "relu2");
        goto fail;
      }
    }
  }
  snprintf(n, sizeof n, "%sexperts.gate_up_proj_blocks", p);
  if (moe8_model_find(m, n)) {
    /* moe8's MXFP4 file (moe8 quantize, weight_qtype mxfp4): the OCP
    ** blocks and scales, gate rows then up rows.  Kept as they are by an
    ** inference layer under the mxfp4 rule or a rule naming no weight
    ** format; decoded exactly otherwise. */
    gptoss_w wgu, wdn;
    if ((st = gptoss_find(m, p, "gate_up_proj", E, DX, N1, &wgu)) != MOE8_OK || (st = gptoss_find(m, p, "down_proj", E, F, DX, &wdn)) != MOE8_OK)
      goto fail;
    if (!wdn.blocks) {
      st = moe8__fail(MOE8_ERR_FORMAT, "model: layer %lld has MXFP4 gate_up_proj blocks but a float down_proj: both or neither", (long long)layer);
      goto fail;
    }
    (void)moe8__layer_keep_mx4(L);
    if ((st = moe8__layer_begin_load(L, MOE8_DTYPE_NONE, 0)) != MOE8_OK || (st = xbuf_alloc(&b, DX, F, false, 1)) != MOE8_OK) goto fail;
    st = put_routed(L, &wgu, &wdn, E, DX, F, b.gu, b.dn, ld.tmp, &o, total);
    xbuf_free(&b);
    b = (xbuf){0};
    if (st != MOE8_OK) goto fail;
    routed_done = mx_file = true;
  }
  snprintf(n, sizeof n, "%sexperts.gate_up_proj.scale", p);
  if (!routed_done && moe8_model_find(m, n)) {
    if ((st = load_moe8(&ld, L, (moe8_model *)m, &borrowed)) != MOE8_OK) goto fail;
    /* The codes are the file's; what is quantized at load (the shared
    ** expert) takes the rule's calibration (mx, clip, pow2, qwix) when the
    ** rule asks for the file's type and block, as a load of the input
    ** under that rule does. */
    moe8_quant_spec rspec;
    if (L->has_rule && moe8_rule_weight_spec(&L->rule, &rspec) && rspec.qtype == L->wspec.qtype && rspec.tile == L->wspec.tile)
      L->wspec = rspec;
    routed_done = true;
    ld.fp8 = L->wq;
  }
  snprintf(n, sizeof n, "%sexperts.mlp.w1", p);
  if (!routed_done && c->stacked_experts && moe8_model_find(m, n)) {
    /* DBRX: experts.mlp.w1 (gate), v1 (up) [E·F, D], each expert's F rows
    ** out x in; experts.mlp.w2 [E·F, D], each expert's [F, D] already the
    ** layer's x·W down weight */
    static const char *const sn[3] = {"w1", "v1", "w2"};
    const moe8_tensor_view *sv[3];
    const int64_t s2[2] = {E * F, D};
    for (int i = 0; i < 3; i++) {
      snprintf(n, sizeof n, "%sexperts.mlp.%s", p, sn[i]);
      if ((st = need(m, n, 2, s2, &sv[i])) != MOE8_OK) goto fail;
      if (!is_float_file(sv[i]->dtype)) {
        st = moe8__fail(MOE8_ERR_DTYPE, "model: '%s' is %s, want F32, BF16 or F16", n, moe8_file_dtype_name(sv[i]->dtype));
        goto fail;
      }
    }
    if ((st = moe8__layer_begin_load(L, MOE8_DTYPE_NONE, 0)) != MOE8_OK || (st = xbuf_alloc(&b, D, F, false, 1)) != MOE8_OK) goto fail;
    for (int64_t e = 0; e < E && st == MOE8_OK; e++) {
      const size_t off = (size_t)(e * F * D);
      st = put_float(sv[0], (const char *)sv[0]->data + off * moe8_file_dtype_size(sv[0]->dtype), F, D, b.gu, 2 * F, 0, ld.tmp);
      if (st == MOE8_OK)
        st = put_float(sv[1], (const char *)sv[1]->data + off * moe8_file_dtype_size(sv[1]->dtype), F, D, b.gu, 2 * F, F, ld.tmp);
      if (st == MOE8_OK)
        st = moe8_file_to_f32(b.dn, (const char *)sv[2]->data + off * moe8_file_dtype_size(sv[2]->dtype), sv[2]->dtype, (size_t)(F * D));
      if (st == MOE8_OK) st = moe8__layer_put_expert(L, 0, e, b.gu, b.dn, NULL, NULL, NULL, NULL);
      if (o.progress && now_s() - last > 1.0) { last = now_s(); o.progress(o.progress_ctx, e + 1, total); }
    }
    xbuf_free(&b);
    b = (xbuf){0};
    if (st != MOE8_OK) goto fail;
    routed_done = true;
  }
  snprintf(n, sizeof n, "%sshared_experts.gate_proj", p);
  if (!routed_done && lc.scored_shared > 0) {
    /* Inkling: the routed experts fused, experts.gate_up_proj [Er, 2F, D]
    ** and down_proj [Er, D, F], then its shared experts stacked,
    ** shared_experts.gate_proj / up_proj [S, F, D], down_proj [S, D, F],
    ** as the layer's last S experts */
    const int64_t S = lc.scored_shared, Er = E - S;
    const moe8_tensor_view *tv[5];
    static const char *const tn[5] = {"experts.gate_up_proj", "experts.down_proj", "shared_experts.gate_proj", "shared_experts.up_proj",
                                      "shared_experts.down_proj"};
    for (int i = 0; i < 5; i++) {
      const int64_t sh[3] = {i < 2 ? Er : S, i == 0 ? 2 * F : i == 1 || i == 4 ? D : F, i == 1 || i == 4 ? F : D};
      snprintf(n, sizeof n, "%s%s", p, tn[i]);
      if ((st = need_float(m, n, 3, sh, &tv[i])) != MOE8_OK) goto fail;
    }
    if ((st = moe8__layer_begin_load(L, MOE8_DTYPE_NONE, 0)) != MOE8_OK || (st = xbuf_alloc(&b, D, F, false, 1)) != MOE8_OK) goto fail;
    for (int64_t e = 0; e < E && st == MOE8_OK; e++) {
      const size_t es = (size_t)(F * D);
      if (e < Er) {
        st = put_float(tv[0], (const char *)tv[0]->data + (size_t)e * 2 * es * moe8_file_dtype_size(tv[0]->dtype), 2 * F, D, b.gu, 2 * F, 0,
                       ld.tmp);
        if (st == MOE8_OK)
          st = put_float(tv[1], (const char *)tv[1]->data + (size_t)e * es * moe8_file_dtype_size(tv[1]->dtype), D, F, b.dn, D, 0, ld.tmp);
      } else
        st = put_stacked(tv + 2, e - Er, D, F, &b, ld.tmp);
      if (st == MOE8_OK) st = moe8__layer_put_expert(L, 0, e, b.gu, b.dn, NULL, NULL, NULL, NULL);
      if (o.progress && now_s() - last > 1.0) { last = now_s(); o.progress(o.progress_ctx, e + 1, total); }
    }
    xbuf_free(&b);
    b = (xbuf){0};
    if (st != MOE8_OK) goto fail;
    routed_done = true;
  }
  fused_name(m, p, 0, n, sizeof n);
  const moe8_tensor_view *fgu = routed_done ? NULL : moe8_model_find(m, n), *fdn = NULL;
  if (!routed_done && fgu) {
    /* Fused 3-D: gate_up_proj [E, 2F, D] (gate rows, then up rows), down_proj [E, D, F];
    ** or the same transposed, x · W: [E, D, 2F] (gate columns, then up) and
    ** [E, F, D] (Qwen3-VL-MoE's released files).  The shapes tell which:
    ** both fit only if D = 2F and D = F. */
    char dname[320];
    fused_name(m, p, 1, dname, sizeof dname);
    const moe8_tensor_view *dv = moe8_model_find(m, dname);
    const bool ilv = c->fused_interleaved && c->fused_gu[0] && strstr(n, c->fused_gu) != NULL;
    const bool xw = !ilv && !ungated(m) && fgu->ndim == 3 && /* an ungated family's files: transformers' [E, F, DX] only (DX = F would fit both) */ fgu->shape[0] == E && fgu->shape[1] == DX && fgu->shape[2] == N1 && dv && dv->ndim == 3 &&
                    dv->shape[0] == E && dv->shape[1] == F && dv->shape[2] == DX;
    /* LongCat-Flash's gate_up_proj has rows for its identity experts too (never read) */
    const int64_t s1[3] = {ER - c->layer.skip_experts, xw ? DX : N1, xw ? N1 : DX}, s2[3] = {E, xw ? F : DX, xw ? DX : F};
    if ((st = need(m, n, 3, s1, &fgu)) != MOE8_OK) goto fail;
    if ((st = need(m, dname, 3, s2, &fdn)) != MOE8_OK) goto fail;
    if (!is_float_file(fgu->dtype) || !is_float_file(fdn->dtype)) {
      st = moe8__fail(MOE8_ERR_DTYPE, "model: fused expert tensors '%s' (%s) and '%s' (%s) must be F32, BF16 or F16", fgu->name,
                      moe8_file_dtype_name(fgu->dtype), fdn->name, moe8_file_dtype_name(fdn->dtype));
      goto fail;
    }
    if ((st = moe8__layer_begin_load(L, MOE8_DTYPE_NONE, 0)) != MOE8_OK || (st = xbuf_alloc(&b, DX, F, false, 1)) != MOE8_OK) goto fail;
    const size_t es1 = moe8_file_dtype_size(fgu->dtype) * (size_t)(N1 * DX), es2 = moe8_file_dtype_size(fdn->dtype) * (size_t)(DX * F);
    for (int64_t e = 0; e < E && st == MOE8_OK; e++) {
      if (xw) { /* already the layer's [DX, 2F] and [F, DX] */
        st = moe8_file_to_f32(b.gu, (const char *)fgu->data + (size_t)e * es1, fgu->dtype, (size_t)(N1 * DX));
        if (st == MOE8_OK) st = moe8_file_to_f32(b.dn, (const char *)fdn->data + (size_t)e * es2, fdn->dtype, (size_t)(DX * F));
      } else {
        st = put_float(fgu, (const char *)fgu->data + (size_t)e * es1, N1, DX, b.gu, N1, 0, ld.tmp);
        if (st == MOE8_OK) st = put_float(fdn, (const char *)fdn->data + (size_t)e * es2, DX, F, b.dn, DX, 0, ld.tmp);
      }
      if (st == MOE8_OK && ilv) /* alternate gate / up columns to the layer's halves (ld.tmp is free again) */
        for (int64_t dd = 0; dd < DX; dd++) {
          float *row = b.gu + dd * 2 * F;
          memcpy(ld.tmp, row, sizeof(float) * (size_t)(2 * F));
          for (int64_t f = 0; f < F; f++) { row[f] = ld.tmp[2 * f]; row[F + f] = ld.tmp[2 * f + 1]; }
        }
      if (st == MOE8_OK) st = moe8__layer_put_expert(L, 0, e, b.gu, b.dn, NULL, NULL, NULL, NULL);
      if (o.progress && now_s() - last > 1.0) { last = now_s(); o.progress(o.progress_ctx, e + 1, total); }
    }
    xbuf_free(&b);
    if (st != MOE8_OK) goto fail;
    routed_done = true;
  }
  /* Step-3.5/3.7's released files: the experts stacked per projection,
  ** moe.gate_proj.weight / up_proj.weight [E, F, D], down_proj.weight [E, D, F]. */
  snprintf(n, sizeof n, "%sgate_proj.weight", p);
  if (!routed_done && c->layer.act == MOE8_ACT_SWIGLU_POST && moe8_model_find(m, n)) {
    const moe8_tensor_view *sv[3];
    static const char *const pn[3] = {"gate_proj", "up_proj", "down_proj"};
    for (int i = 0; i < 3; i++) {
      const int64_t sh[3] = {E, i == 2 ? D : F, i == 2 ? F : D};
      snprintf(n, sizeof n, "%s%s.weight", p, pn[i]);
      if ((st = need_float(m, n, 3, sh, &sv[i])) != MOE8_OK) goto fail;
    }
    if ((st = moe8__layer_begin_load(L, MOE8_DTYPE_NONE, 0)) != MOE8_OK || (st = xbuf_alloc(&b, D, F, false, 1)) != MOE8_OK) goto fail;
    for (int64_t e = 0; e < E && st == MOE8_OK; e++) {
      st = put_stacked(sv, e, D, F, &b, ld.tmp);
      if (st == MOE8_OK) st = moe8__layer_put_expert(L, 0, e, b.gu, b.dn, NULL, NULL, NULL, NULL);
      if (o.progress && now_s() - last > 1.0) { last = now_s(); o.progress(o.progress_ctx, e + 1, total); }
    }
    xbuf_free(&b);
    b = (xbuf){0};
    if (st != MOE8_OK) goto fail;
    routed_done = true;
  }
  if (!routed_done) {
    char base[200];
    snprintf(base, sizeof base, "%s%s0.", p, xdir(m));
    snprintf(n, sizeof n, "%s%s.weight", base, proj_name(m, base, p0));
    const moe8_tensor_view *first = moe8_model_find(m, n);
    if (!first) {
      st = moe8__fail(MOE8_ERR_FORMAT, "model: layer %lld has no expert weights: none of '%s', '%sexperts.gate_up_proj', "
                      "'%sexperts.gate_up_proj.qweight'", (long long)layer, n, p, p);
      goto fail;
    }
    ld.fp8 = first->dtype == MOE8_FDT_F8_E4M3;
    if ((st = moe8__layer_begin_load(L, ld.fp8 ? MOE8_DTYPE_F8E4M3 : MOE8_DTYPE_NONE, ld.fp8 ? ld.bk : 0)) != MOE8_OK) goto fail;
    if ((st = xbuf_alloc(&b, DX, F, ld.fp8, ld.bk)) != MOE8_OK) goto fail;
    for (int64_t e = 0; e < E && st == MOE8_OK; e++) {
      snprintf(n, sizeof n, "%s%s%lld.", p, xdir(m), (long long)e);
      st = read_expert(&ld, n, F, ld.fp8, &b, L->inference);
      if (st == MOE8_OK) st = moe8__layer_put_expert(L, 0, e, b.gu, b.dn, b.gq, b.gs, b.dq, b.ds);
      if (o.progress && now_s() - last > 1.0) { last = now_s(); o.progress(o.progress_ctx, e + 1, total); }
    }
    xbuf_free(&b);
    if (st != MOE8_OK) goto fail;
  }
  /* NLLB-MoE's expert biases: fc1.bias [F] (up's) and fc2.bias [D], floats
  ** whatever the experts' format (moe8 quantize keeps them beside the codes) */
  for (int64_t e = 0; c->nllb && e < E && st == MOE8_OK; e++)
    for (int w = 0; w < 2 && st == MOE8_OK; w++) {
      const int64_t bs[1] = {w ? D : F};
      snprintf(n, sizeof n, "%s%s%lld.fc%d.bias", p, xdir(m), (long long)e, w + 1);
      if ((st = need(m, n, 1, bs, &t)) != MOE8_OK) break;
      if (!is_float_file(t->dtype)) { st = moe8__fail(MOE8_ERR_DTYPE, "model: '%s' is %s, want F32, BF16 or F16", n, moe8_file_dtype_name(t->dtype)); break; }
      st = moe8_file_to_f32(L->w[w ? MOE8_W_DOWN_BIAS : MOE8_W_GU_BIAS] + e * bs[0], t->data, t->dtype, (size_t)bs[0]);
    }
  if (st != MOE8_OK) goto fail;
  ld.D = D;
  /* The shared expert fused: beside the block (Granite's shared_mlp), or in
  ** it as shared_experts.gate_up_proj.weight [2Fs, D] (gate rows, then up)
  ** and shared_experts.down_proj.weight (MiniMax-M3's). */
  char sg[320] = "", sd[320] = "";
  if (Fs > 0 && c->shared_beside[0]) {
    snprintf(sg, sizeof sg, "%s%lld.%sinput_linear.weight", m->root, (long long)layer, c->shared_beside);
    snprintf(sd, sizeof sd, "%s%lld.%soutput_linear.weight", m->root, (long long)layer, c->shared_beside);
  } else if (Fs > 0) {
    snprintf(sg, sizeof sg, "%sshared_experts.gate_up_proj.weight", p);
    snprintf(sd, sizeof sd, "%sshared_experts.down_proj.weight", p);
    if (!moe8_model_find(m, sg)) sg[0] = 0;
  }
  if (sg[0]) {
    const int64_t s1[2] = {2 * Fs, D}, s2[2] = {D, Fs};
    const moe8_tensor_view *tg, *td;
    if ((st = need(m, sg, 2, s1, &tg)) != MOE8_OK || (st = need(m, sd, 2, s2, &td)) != MOE8_OK) goto fail;
    if (!is_float_file(tg->dtype) || !is_float_file(td->dtype)) {
      st = moe8__fail(MOE8_ERR_DTYPE, "model: the shared expert '%s' (%s) and '%s' (%s) must be F32, BF16 or F16", sg,
                      moe8_file_dtype_name(tg->dtype), sd, moe8_file_dtype_name(td->dtype));
      goto fail;
    }
    if ((st = xbuf_alloc(&b, D, Fs, false, 1)) == MOE8_OK && (st = put_float(tg, tg->data, 2 * Fs, D, b.gu, 2 * Fs, 0, ld.tmp)) == MOE8_OK &&
        (st = put_float(td, td->data, D, Fs, b.dn, D, 0, ld.tmp)) == MOE8_OK && mx_file && !L->wmx &&
        (st = mx4_round_trip(b.gu, D, 2 * Fs)) == MOE8_OK)
      st = mx4_round_trip(b.dn, Fs, D);
    if (st == MOE8_OK) st = moe8__layer_put_expert(L, 1, 0, b.gu, b.dn, NULL, NULL, NULL, NULL);
    xbuf_free(&b);
    b = (xbuf){0};
    if (st != MOE8_OK) goto fail;
  }
  /* The shared expert, in the family's names, as the routed ones are stored. */
  if (Fs > 0 && !sg[0]) {
    /* the family's name first (DeepSeek shared_experts, Qwen shared_expert), then the others' files' (HY-V3 shared_mlp) */
    static const char *const sn[3] = {"shared_experts", "shared_expert", "shared_mlp"};
    const int first = c->arch == MOE8_ARCH_DEEPSEEK_V3 || c->arch == MOE8_ARCH_DEEPSEEK_V2 ? 0 : 1;
    snprintf(n, sizeof n, "%s%s.", p, sn[first]);
    for (int i = 0; i < 3; i++) {
      char b2[320], pr[400];
      snprintf(b2, sizeof b2, "%s%s.", p, sn[i]);
      snprintf(pr, sizeof pr, "%s%s.weight", b2, proj_name(m, b2, p0));
      if (moe8_model_find(m, pr)) { snprintf(n, sizeof n, "%s", b2); break; }
    }
    if (c->layer.act == MOE8_ACT_SWIGLU_POST) { /* Step-3.5/3.7's released files: share_expert.* in the decoder layer */
      char b2[320], pr[400];
      snprintf(b2, sizeof b2, "%s%lld.share_expert.", m->root, (long long)layer);
      snprintf(pr, sizeof pr, "%sgate_proj.weight", b2);
      if (moe8_model_find(m, pr)) snprintf(n, sizeof n, "%s", b2);
    }
    char probe[400];
    snprintf(probe, sizeof probe, "%s%s.weight", n, proj_name(m, n, p0));
    const moe8_tensor_view *sf = moe8_model_find(m, probe);
    const bool sfp8 = sf && sf->dtype == MOE8_FDT_F8_E4M3;
    if (sfp8 && !L->wq) {
      st = moe8__fail(MOE8_ERR_DTYPE, "model: the shared expert '%s' is F8_E4M3 but the routed experts are not quantized", probe);
      goto fail;
    }
    if (sfp8 && L->wspec.tile != ld.bk) {
      st = moe8__fail(MOE8_ERR_SHAPE, "model: the shared expert's K blocks (%lld) differ from the routed experts' (%lld)", (long long)ld.bk,
                      (long long)L->wspec.tile);
      goto fail;
    }
    if ((st = xbuf_alloc(&b, D, Fs, sfp8, ld.bk)) == MOE8_OK && (st = read_expert(&ld, n, Fs, sfp8, &b, L->inference)) == MOE8_OK &&
        mx_file && !L->wmx && !sfp8 && (st = mx4_round_trip(b.gu, D, N1s)) == MOE8_OK)
      st = mx4_round_trip(b.dn, Fs, D);
    if (st == MOE8_OK) st = moe8__layer_put_expert(L, 1, 0, b.gu, b.dn, b.gq, b.gs, b.dq, b.ds);
    xbuf_free(&b);
    if (st != MOE8_OK) goto fail;
  }
  if ((st = moe8__layer_end_load(L)) != MOE8_OK) goto fail;
  if (o.progress) o.progress(o.progress_ctx, total, total); /* always once at the end: done = total */
  if (borrowed) { L->keep = (void *)m; L->release = model_release; }
  free(ld.tmp);
  *out = L;
  return MOE8_OK;
fail:
  if (borrowed) { L->xs[0].pk_borrowed = false; L->xs[0].wgu_pk = L->xs[0].wd_pk = NULL; model_release((void *)m); }
  free(ld.tmp);
  moe8_layer_destroy(L);
  return st;
}

moe8_status moe8_model_load_layer(const moe8_model *m, int64_t layer, const moe8_rules *rules, moe8_layer **out) {
  return moe8_model_load_layer_ex(m, layer, rules, NULL, out);
}
