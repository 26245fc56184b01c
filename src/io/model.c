/*
** model.c — a Hugging Face model directory: config.json plus safetensors
** shards, and the loading of one MoE layer from it (SPEC §9).
**
** Tensor names, for layer L (prefix P = "model.layers.L.mlp." or, for
** Mixtral, "model.layers.L.block_sparse_moe."):
**   P gate.weight                       router, [E, D]
**   P gate.e_score_correction_bias      DeepSeek-V3 selection bias, [E]
**   P experts.e.{gate,up,down}_proj.weight  [F, D], [F, D], [D, F] (out × in);
**     Mixtral: experts.e.{w1,w3,w2}.weight
**   P experts.e.*.weight_scale_inv      DeepSeek FP8: F32 [ceil(N/bn), ceil(K/bk)]
**   P experts.gate_up_proj.qweight / .scale, P experts.down_proj.qweight /
**     .scale                            moe8's own format: [E, D, 2F] and
**                                       [E, nb, 1, 2F]; [E, F, D] and [E, nb, 1, D]
** Every tensor's presence, dtype and shape is checked against the config
** before anything is used; a message names the tensor, the file and what
** was expected.
*/
#include "../core/internal.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct moe8_model {
  moe8_hf_config cfg;
  moe8_st_file **shards;
  size_t         nshards;
  const moe8_tensor_view **all;  /* every tensor of every shard, by name */
  size_t         count;
  char           fmt[128];
};

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }
static int cmp_view(const void *a, const void *b) {
  return strcmp((*(const moe8_tensor_view *const *)a)->name, (*(const moe8_tensor_view *const *)b)->name);
}

void moe8_model_close(moe8_model *m) {
  if (!m) return;
  for (size_t i = 0; i < m->nshards; i++) moe8_st_close(m->shards[i]);
  free(m->shards);
  free(m->all);
  free(m);
}

moe8_status moe8_model_open(const char *dir, moe8_model **out) {
  if (!dir || !out) return moe8__fail(MOE8_ERR_INVALID_ARG, "model: NULL argument");
  *out = NULL;
  char path[4096];
  moe8_model *m = calloc(1, sizeof *m);
  if (!m) return moe8__fail(MOE8_ERR_NOMEM, "model: out of memory");
  snprintf(path, sizeof path, "%s/config.json", dir);
  moe8_status st = moe8_hf_config_load(path, &m->cfg);
  if (st != MOE8_OK) { moe8_model_close(m); return st; }
  DIR *d = opendir(dir);
  if (!d) { moe8_model_close(m); return moe8__fail(MOE8_ERR_IO, "%s: cannot open the model directory", dir); }
  char **names = NULL;
  size_t n = 0, cap = 0;
  for (struct dirent *e; (e = readdir(d));) {
    const size_t l = strlen(e->d_name);
    if (l > 12 && !strcmp(e->d_name + l - 12, ".safetensors")) {
      if (n == cap) {
        char **nn = realloc(names, (cap = cap ? cap * 2 : 8) * sizeof *names);
        if (!nn) break;
        names = nn;
      }
      names[n++] = strdup(e->d_name);
    }
  }
  closedir(d);
  if (n == 0) { free(names); moe8_model_close(m); return moe8__fail(MOE8_ERR_IO, "%s: no *.safetensors file", dir); }
  qsort(names, n, sizeof *names, cmp_str);
  m->shards = calloc(n, sizeof *m->shards);
  for (size_t i = 0; i < n && st == MOE8_OK; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    if (!m->shards) st = moe8__fail(MOE8_ERR_NOMEM, "model: out of memory");
    else if ((st = moe8_st_open(path, &m->shards[i])) == MOE8_OK) m->nshards++;
  }
  for (size_t i = 0; i < n; i++) free(names[i]);
  free(names);
  if (st != MOE8_OK) { moe8_model_close(m); return st; }
  for (size_t i = 0; i < m->nshards; i++) m->count += moe8_st_count(m->shards[i]);
  m->all = malloc((m->count ? m->count : 1) * sizeof *m->all);
  if (!m->all) { moe8_model_close(m); return moe8__fail(MOE8_ERR_NOMEM, "model: out of memory"); }
  size_t k = 0;
  for (size_t i = 0; i < m->nshards; i++)
    for (size_t j = 0; j < moe8_st_count(m->shards[i]); j++) m->all[k++] = moe8_st_at(m->shards[i], j);
  qsort(m->all, m->count, sizeof *m->all, cmp_view);
  for (size_t i = 1; i < m->count; i++)
    if (!strcmp(m->all[i]->name, m->all[i - 1]->name)) {
      st = moe8__fail(MOE8_ERR_FORMAT, "%s: tensor '%s' is in two shards", dir, m->all[i]->name);
      moe8_model_close(m);
      return st;
    }
  *out = m;
  return MOE8_OK;
}

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
  snprintf(buf, cap, "model.layers.%lld.%s", (long long)layer,
           m && m->cfg.arch == MOE8_ARCH_MIXTRAL ? "block_sparse_moe." : "mlp.");
}

static const char *proj_name(const moe8_model *m, int which) {
  static const char *const hf[3] = {"gate_proj", "up_proj", "down_proj"}, *const mx[3] = {"w1", "w3", "w2"};
  return m->cfg.arch == MOE8_ARCH_MIXTRAL ? mx[which] : hf[which];
}

/* Finds a tensor and checks its dtype class and shape. */
static moe8_status need(const moe8_model *m, const char *name, int ndim, const int64_t *shape, const moe8_tensor_view **out) {
  const moe8_tensor_view *t = moe8_model_find(m, name);
  *out = t;
  char want[96] = "", got[96] = "";
  for (int i = 0; i < ndim; i++) snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", i ? ", " : "", (long long)shape[i]);
  if (!t) return moe8__fail(MOE8_ERR_FORMAT, "model: missing tensor '%s' (expected [%s])", name, want);
  bool ok = t->ndim == ndim;
  for (int i = 0; i < t->ndim; i++) {
    snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (ok) ok = t->shape[i] == shape[i];
  }
  if (!ok) return moe8__fail(MOE8_ERR_SHAPE, "model: tensor '%s' has shape [%s], the config says [%s]", name, got, want);
  return MOE8_OK;
}

static bool is_float_file(moe8_file_dtype t) {
  return t == MOE8_FDT_F32 || t == MOE8_FDT_BF16 || t == MOE8_FDT_F16;
}

const char *moe8_model_format(const moe8_model *m, int64_t layer) {
  if (!m) return "";
  moe8_model *mm = (moe8_model *)m;
  char p[128], n[256];
  moe8_model_prefix(m, layer, p, sizeof p);
  snprintf(n, sizeof n, "%sexperts.gate_up_proj.qweight", p);
  const moe8_tensor_view *t = moe8_model_find(m, n);
  if (t) {
    snprintf(n, sizeof n, "%sexperts.gate_up_proj.scale", p);
    const moe8_tensor_view *s = moe8_model_find(m, n);
    const int64_t nb = s && s->ndim == 4 ? s->shape[1] : 0;
    snprintf(mm->fmt, sizeof mm->fmt, "moe8 %s [E,%lld,1,N]", t->dtype == MOE8_FDT_I8 ? "i8" : "f8e4m3", (long long)nb);
    return mm->fmt;
  }
  snprintf(n, sizeof n, "%sexperts.0.%s.weight", p, proj_name(m, 0));
  t = moe8_model_find(m, n);
  if (t && t->dtype == MOE8_FDT_F8_E4M3) {
    snprintf(mm->fmt, sizeof mm->fmt, "deepseek f8e4m3 %lldx%lld blocks", (long long)m->cfg.block_n, (long long)m->cfg.block_k);
    return mm->fmt;
  }
  snprintf(mm->fmt, sizeof mm->fmt, "%s (unquantized)", t ? moe8_file_dtype_name(t->dtype) : "no expert weights");
  return mm->fmt;
}

/* Loads an unquantized [out, in] weight transposed into dst [in, out] with
** row stride ld (so gate and up can share one fused buffer). */
static moe8_status load_transposed(const moe8_tensor_view *t, float *dst, int64_t out_n, int64_t in_k, int64_t ld, float *tmp) {
  moe8_status st = moe8_file_to_f32(tmp, t->data, t->dtype, (size_t)(out_n * in_k));
  if (st != MOE8_OK) return st;
  for (int64_t n = 0; n < out_n; n++)
    for (int64_t k = 0; k < in_k; k++) dst[k * ld + n] = tmp[n * in_k + k];
  return MOE8_OK;
}

/* A DeepSeek FP8 weight q[N, K] with scale_inv[ceil(N/bn), ceil(K/bk)] into
** the kernels' layout: q transposed into dst[K, ld] at column col0, and
** per-column K-block scales s[kb, ld] (each block's scale repeated over its
** bn columns: a 2-D block scale is a special case of [nb, 1, N]). */
static void load_fp8_block(const moe8_tensor_view *q, const moe8_tensor_view *si, int64_t N, int64_t K, int64_t bn, int64_t bk,
                           uint8_t *dst, float *s, int64_t ld, int64_t col0) {
  const uint8_t *qb = q->data;
  const unsigned char *sb = si->data;
  const int64_t nbk = moe8__cdiv(K, bk), nbn = moe8__cdiv(N, bn);
  for (int64_t n = 0; n < N; n++)
    for (int64_t k = 0; k < K; k++) dst[k * ld + col0 + n] = qb[n * K + k];
  for (int64_t kb = 0; kb < nbk; kb++)
    for (int64_t n = 0; n < N; n++) {
      float v;
      memcpy(&v, sb + 4 * (size_t)((n / bn) * nbk + kb), 4);
      s[kb * ld + col0 + n] = v;
    }
  (void)nbn;
}

moe8_status moe8_model_load_layer(const moe8_model *m, int64_t layer, const moe8_rules *rules, moe8_layer **out) {
  if (!m || !out) return moe8__fail(MOE8_ERR_INVALID_ARG, "model: NULL argument");
  *out = NULL;
  const moe8_hf_config *c = &m->cfg;
  if (layer < 0 || layer >= c->num_layers)
    return moe8__fail(MOE8_ERR_INVALID_ARG, "model: layer %lld is outside [0, %lld)", (long long)layer, (long long)c->num_layers);
  const int64_t E = c->layer.num_experts, D = c->layer.hidden, F = c->layer.ffn;
  char p[128], n[256], mp[160];
  moe8_model_prefix(m, layer, p, sizeof p);
  snprintf(mp, sizeof mp, "%sexperts", p);
  const moe8_tensor_view *t, *ts;
  moe8_status st;
  /* Router and bias first: every format has them. */
  snprintf(n, sizeof n, "%sgate.weight", p);
  const int64_t rshape[2] = {E, D};
  if ((st = need(m, n, 2, rshape, &t)) != MOE8_OK) return st;
  if (!is_float_file(t->dtype)) return moe8__fail(MOE8_ERR_DTYPE, "model: router '%s' is %s, want F32, BF16 or F16", n, moe8_file_dtype_name(t->dtype));
  const moe8_tensor_view *router = t, *bias = NULL;
  if (c->has_bias) {
    snprintf(n, sizeof n, "%sgate.e_score_correction_bias", p);
    bias = moe8_model_find(m, n);
    if (bias && (bias->ndim != 1 || bias->shape[0] != E || !is_float_file(bias->dtype)))
      return moe8__fail(MOE8_ERR_SHAPE, "model: '%s' must be a float vector of %lld", n, (long long)E);
  }
  moe8_layer_config lc = c->layer;
  lc.use_selection_bias = bias != NULL;
  moe8_layer *L = NULL;
  float *tmp = malloc(sizeof(float) * (size_t)((D > E ? D : E) * (F > E ? F : E) + E * D + 16));
  if (!tmp) return moe8__fail(MOE8_ERR_NOMEM, "model: out of memory");
  if ((st = moe8_layer_create(&lc, rules, mp, &L)) != MOE8_OK) { free(tmp); return st; }
  if ((st = load_transposed(router, moe8_layer_weight(L, MOE8_W_ROUTER, NULL), E, D, E, tmp)) != MOE8_OK) goto fail;
  if (bias && (st = moe8_file_to_f32(moe8_layer_weight(L, MOE8_W_BIAS, NULL), bias->data, bias->dtype, (size_t)E)) != MOE8_OK) goto fail;

  /* moe8's own format? */
  snprintf(n, sizeof n, "%sexperts.gate_up_proj.qweight", p);
  if (moe8_model_find(m, n)) {
    const moe8_tensor_view *gq, *gs, *dq, *ds;
    const int64_t gshape[3] = {E, D, 2 * F}, dshape[3] = {E, F, D};
    if ((st = need(m, n, 3, gshape, &gq)) != MOE8_OK) goto fail;
    snprintf(n, sizeof n, "%sexperts.down_proj.qweight", p);
    if ((st = need(m, n, 3, dshape, &dq)) != MOE8_OK) goto fail;
    const moe8_dtype qt = gq->dtype == MOE8_FDT_F8_E4M3 ? MOE8_DTYPE_F8E4M3 : gq->dtype == MOE8_FDT_I8 ? MOE8_DTYPE_I8 : MOE8_DTYPE_NONE;
    if (qt == MOE8_DTYPE_NONE || dq->dtype != gq->dtype) {
      st = moe8__fail(MOE8_ERR_DTYPE, "model: '%s' and '%s' must both be F8_E4M3 or I8", gq->name, dq->name);
      goto fail;
    }
    snprintf(n, sizeof n, "%sexperts.gate_up_proj.scale", p);
    gs = moe8_model_find(m, n);
    if (!gs || gs->ndim != 4 || gs->dtype != MOE8_FDT_F32 || gs->shape[0] != E || gs->shape[1] < 1 || gs->shape[2] != 1 || gs->shape[3] != 2 * F) {
      st = moe8__fail(MOE8_ERR_FORMAT, "model: '%s' missing or not F32 [%lld, nb, 1, %lld]", n, (long long)E, (long long)(2 * F));
      goto fail;
    }
    /* The tile is in config.json (moe8_quantization.tile_size): a block
    ** count alone is ambiguous (K = 200 in 2 blocks: tile 100 or 128). */
    const int64_t nb = gs->shape[1], tile = nb == 1 && c->moe8_tile >= D ? 0 : c->moe8_tile;
    if (moe8__cdiv(D, tile ? tile : D) != nb) {
      st = moe8__fail(MOE8_ERR_FORMAT, "model: '%s' has %lld K blocks, but moe8_quantization.tile_size %lld in config.json gives %lld",
                      n, (long long)nb, (long long)c->moe8_tile, (long long)moe8__cdiv(D, tile ? tile : D));
      goto fail;
    }
    const int64_t dshape_s[4] = {E, tile ? moe8__cdiv(F, tile) : 1, 1, D};
    snprintf(n, sizeof n, "%sexperts.down_proj.scale", p);
    if ((st = need(m, n, 4, dshape_s, &ds)) != MOE8_OK) goto fail;
    if (ds->dtype != MOE8_FDT_F32) { st = moe8__fail(MOE8_ERR_DTYPE, "model: '%s' must be F32", n); goto fail; }
    /* Scales may be unaligned inside the mapping: copy them. */
    float *sgu = malloc(gs->nbytes + 4), *sd = malloc(ds->nbytes + 4);
    if (!sgu || !sd) { free(sgu); free(sd); st = moe8__fail(MOE8_ERR_NOMEM, "model: out of memory"); goto fail; }
    memcpy(sgu, gs->data, gs->nbytes);
    memcpy(sd, ds->data, ds->nbytes);
    const moe8_prepared pr = {qt, tile, gq->data, sgu, dq->data, sd};
    st = moe8_layer_load_prepared(L, &pr);
    free(sgu); free(sd);
    if (st != MOE8_OK) goto fail;
    free(tmp);
    *out = L;
    return MOE8_OK;
  }

  /* Per-expert tensors: all unquantized, or all DeepSeek FP8. */
  snprintf(n, sizeof n, "%sexperts.0.%s.weight", p, proj_name(m, 0));
  const moe8_tensor_view *first = moe8_model_find(m, n);
  const bool fp8 = first && first->dtype == MOE8_FDT_F8_E4M3;
  const int64_t bn = c->block_n ? c->block_n : 128, bk = c->block_k ? c->block_k : 128;
  uint8_t *gq = NULL, *dq = NULL;
  float *gsc = NULL, *dsc = NULL;
  if (fp8) {
    gq = malloc((size_t)(E * D * 2 * F)); dq = malloc((size_t)(E * F * D));
    gsc = malloc(sizeof(float) * (size_t)(E * moe8__cdiv(D, bk) * 2 * F)); dsc = malloc(sizeof(float) * (size_t)(E * moe8__cdiv(F, bk) * D));
    if (!gq || !dq || !gsc || !dsc) { st = moe8__fail(MOE8_ERR_NOMEM, "model: out of memory"); goto fail_fp8; }
  }
  float *wg = moe8_layer_weight(L, MOE8_W_GATE, NULL), *wu = moe8_layer_weight(L, MOE8_W_UP, NULL), *wd = moe8_layer_weight(L, MOE8_W_DOWN, NULL);
  for (int64_t e = 0; e < E; e++)
    for (int w = 0; w < 3; w++) {
      const int64_t N = w == 2 ? D : F, K = w == 2 ? F : D, shape[2] = {N, K};
      snprintf(n, sizeof n, "%sexperts.%lld.%s.weight", p, (long long)e, proj_name(m, w));
      if ((st = need(m, n, 2, shape, &t)) != MOE8_OK) goto fail_fp8;
      if (fp8) {
        if (t->dtype != MOE8_FDT_F8_E4M3) { st = moe8__fail(MOE8_ERR_DTYPE, "model: '%s' is %s but expert 0 is F8_E4M3", n, moe8_file_dtype_name(t->dtype)); goto fail_fp8; }
        snprintf(n, sizeof n, "%sexperts.%lld.%s.weight_scale_inv", p, (long long)e, proj_name(m, w));
        const int64_t sshape[2] = {moe8__cdiv(N, bn), moe8__cdiv(K, bk)};
        if ((st = need(m, n, 2, sshape, &ts)) != MOE8_OK) goto fail_fp8;
        if (ts->dtype != MOE8_FDT_F32) { st = moe8__fail(MOE8_ERR_DTYPE, "model: '%s' must be F32", n); goto fail_fp8; }
        if (w == 2) load_fp8_block(t, ts, N, K, bn, bk, dq + e * F * D, dsc + e * moe8__cdiv(F, bk) * D, D, 0);
        else load_fp8_block(t, ts, N, K, bn, bk, gq + e * D * 2 * F, gsc + e * moe8__cdiv(D, bk) * 2 * F, 2 * F, w ? F : 0);
      } else {
        if (!is_float_file(t->dtype)) { st = moe8__fail(MOE8_ERR_DTYPE, "model: '%s' is %s, want F32, BF16, F16 (or F8_E4M3 for every expert)", n, moe8_file_dtype_name(t->dtype)); goto fail_fp8; }
        float *dst = w == 0 ? wg + e * D * F : w == 1 ? wu + e * D * F : wd + e * F * D;
        if ((st = load_transposed(t, dst, N, K, N, tmp)) != MOE8_OK) goto fail_fp8;
      }
    }
  if (fp8) {
    const moe8_prepared pr = {MOE8_DTYPE_F8E4M3, bk, gq, gsc, dq, dsc};
    st = moe8_layer_load_prepared(L, &pr);
  }
fail_fp8:
  free(gq); free(dq); free(gsc); free(dsc);
  if (st != MOE8_OK) goto fail;
  free(tmp);
  *out = L;
  return MOE8_OK;
fail:
  free(tmp);
  moe8_layer_destroy(L);
  return st;
}
