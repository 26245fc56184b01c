/*
** hfconfig.c — the MoE keys of a Hugging Face config.json (SPEC §9).
**
** Key sets: Qwen2-MoE / Qwen3-MoE (num_experts, moe_intermediate_size,
** norm_topk_prob), Mixtral (num_local_experts, intermediate_size; top-k
** weights are renormalized), DeepSeek-V3 (n_routed_experts,
** moe_intermediate_size, scoring_func "sigmoid", routed_scaling_factor,
** e_score_correction_bias, quantization_config fp8 with
** weight_block_size).  The architecture comes from model_type, else from
** which key set is present.  Keys moe8 does not use are ignored; a key it
** uses with the wrong type is an error naming it.
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
    default: return "unknown";
  }
}

static moe8_status get_int(const cJSON *root, const char *file, const char *key, int64_t *out, bool *found) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
  *found = v != NULL && !cJSON_IsNull(v);
  if (!*found) return MOE8_OK;
  /* Range first: converting an out-of-range double to an integer is undefined. */
  if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0 && v->valuedouble <= 1e12) || v->valuedouble != floor(v->valuedouble))
    return moe8__fail(MOE8_ERR_PARSE, "%s: \"%s\" must be a non-negative integer", file, key);
  *out = (int64_t)v->valuedouble;
  return MOE8_OK;
}

moe8_status moe8_hf_config_parse(const char *json, size_t len, const char *name, moe8_hf_config *c) {
  const char *file = name ? name : "config.json";
  if (!json || !c) return moe8__fail(MOE8_ERR_INVALID_ARG, "config: NULL argument");
  memset(c, 0, sizeof *c);
  cJSON *root = cJSON_ParseWithLength(json, len);
  if (!root) {
    const char *ep = cJSON_GetErrorPtr();
    return moe8__fail(MOE8_ERR_PARSE, "%s: malformed JSON near byte %zu", file, ep ? (size_t)(ep - json) : 0);
  }
  moe8_status st = MOE8_OK;
  if (!cJSON_IsObject(root)) { st = moe8__fail(MOE8_ERR_PARSE, "%s: not a JSON object", file); goto done; }
  const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
  if (mt && cJSON_IsString(mt)) snprintf(c->model_type, sizeof c->model_type, "%s", mt->valuestring);
  bool f_e1, f_e2, f_e3, f_k, f_d, f_moe_f, f_f, f_l;
  int64_t e1 = 0, e2 = 0, e3 = 0, moe_f = 0, f = 0;
  if ((st = get_int(root, file, "num_experts", &e1, &f_e1)) || (st = get_int(root, file, "num_local_experts", &e2, &f_e2)) ||
      (st = get_int(root, file, "n_routed_experts", &e3, &f_e3)) ||
      (st = get_int(root, file, "num_experts_per_tok", &c->layer.top_k, &f_k)) ||
      (st = get_int(root, file, "hidden_size", &c->layer.hidden, &f_d)) ||
      (st = get_int(root, file, "moe_intermediate_size", &moe_f, &f_moe_f)) ||
      (st = get_int(root, file, "intermediate_size", &f, &f_f)) ||
      (st = get_int(root, file, "num_hidden_layers", &c->num_layers, &f_l)))
    goto done;
  if (!strcmp(c->model_type, "mixtral") || (!c->model_type[0] && f_e2)) c->arch = MOE8_ARCH_MIXTRAL;
  else if (!strcmp(c->model_type, "deepseek_v3") || (!c->model_type[0] && f_e3)) c->arch = MOE8_ARCH_DEEPSEEK_V3;
  else if (!strcmp(c->model_type, "qwen3_moe")) c->arch = MOE8_ARCH_QWEN3_MOE;
  else if (!strcmp(c->model_type, "qwen2_moe") || (!c->model_type[0] && f_e1)) c->arch = MOE8_ARCH_QWEN2_MOE;
  c->layer.num_experts = f_e1 ? e1 : f_e2 ? e2 : e3;
  c->layer.ffn = c->arch == MOE8_ARCH_MIXTRAL ? (f_f ? f : moe_f) : (f_moe_f ? moe_f : f);
  if (!f_l) c->num_layers = 1;
  if (!(f_e1 || f_e2 || f_e3)) { st = moe8__fail(MOE8_ERR_PARSE, "%s: no expert count (num_experts, num_local_experts or n_routed_experts)", file); goto done; }
  if (!f_k) { st = moe8__fail(MOE8_ERR_PARSE, "%s: missing \"num_experts_per_tok\"", file); goto done; }
  if (!f_d) { st = moe8__fail(MOE8_ERR_PARSE, "%s: missing \"hidden_size\"", file); goto done; }
  if (!(f_moe_f || f_f)) { st = moe8__fail(MOE8_ERR_PARSE, "%s: missing \"moe_intermediate_size\" / \"intermediate_size\"", file); goto done; }
  /* Routing: defaults per architecture, then explicit keys. */
  c->layer.norm_topk_prob = c->arch == MOE8_ARCH_MIXTRAL || c->arch == MOE8_ARCH_DEEPSEEK_V3 || c->arch == MOE8_ARCH_QWEN3_MOE;
  c->layer.score = c->arch == MOE8_ARCH_DEEPSEEK_V3 ? MOE8_SCORE_SIGMOID : MOE8_SCORE_SOFTMAX;
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "norm_topk_prob");
  if (v) {
    if (!cJSON_IsBool(v)) { st = moe8__fail(MOE8_ERR_PARSE, "%s: \"norm_topk_prob\" must be true or false", file); goto done; }
    c->layer.norm_topk_prob = cJSON_IsTrue(v);
  }
  v = cJSON_GetObjectItemCaseSensitive(root, "scoring_func");
  if (v) {
    if (cJSON_IsString(v) && !strcmp(v->valuestring, "softmax")) c->layer.score = MOE8_SCORE_SOFTMAX;
    else if (cJSON_IsString(v) && !strcmp(v->valuestring, "sigmoid")) c->layer.score = MOE8_SCORE_SIGMOID;
    else { st = moe8__fail(MOE8_ERR_PARSE, "%s: \"scoring_func\" must be \"softmax\" or \"sigmoid\"", file); goto done; }
  }
  v = cJSON_GetObjectItemCaseSensitive(root, "routed_scaling_factor");
  if (v) {
    if (!cJSON_IsNumber(v) || !(v->valuedouble > 0 && v->valuedouble < 1e6)) {
      st = moe8__fail(MOE8_ERR_PARSE, "%s: \"routed_scaling_factor\" must be a positive number", file);
      goto done;
    }
    c->layer.routed_scaling_factor = (float)v->valuedouble;
  }
  c->has_bias = c->arch == MOE8_ARCH_DEEPSEEK_V3;
  c->layer.use_selection_bias = c->has_bias;
  const cJSON *q = cJSON_GetObjectItemCaseSensitive(root, "quantization_config");
  if (q) {
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(q, "quant_method");
    if (!cJSON_IsObject(q) || !cJSON_IsString(m)) { st = moe8__fail(MOE8_ERR_PARSE, "%s: quantization_config.quant_method must be a string", file); goto done; }
    if (!strcmp(m->valuestring, "fp8")) {
      const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(q, "fmt"), *bs = cJSON_GetObjectItemCaseSensitive(q, "weight_block_size");
      if (fmt && !(cJSON_IsString(fmt) && !strcmp(fmt->valuestring, "e4m3"))) {
        st = moe8__fail(MOE8_ERR_PARSE, "%s: quantization_config.fmt must be \"e4m3\"", file);
        goto done;
      }
      c->fp8 = true;
      c->block_n = c->block_k = 128;
      if (bs) {
        if (!cJSON_IsArray(bs) || cJSON_GetArraySize(bs) != 2 || !cJSON_IsNumber(bs->child) || !cJSON_IsNumber(bs->child->next) ||
            bs->child->valuedouble < 1 || bs->child->next->valuedouble < 1) {
          st = moe8__fail(MOE8_ERR_PARSE, "%s: quantization_config.weight_block_size must be [n, k]", file);
          goto done;
        }
        c->block_n = (int64_t)bs->child->valuedouble;
        c->block_k = (int64_t)bs->child->next->valuedouble;
      }
    }
  }
  const cJSON *mq = cJSON_GetObjectItemCaseSensitive(root, "moe8_quantization");
  if (mq) {
    bool found;
    if (!cJSON_IsObject(mq) || (st = get_int(mq, file, "tile_size", &c->moe8_tile, &found)) != MOE8_OK) {
      if (st == MOE8_OK) st = moe8__fail(MOE8_ERR_PARSE, "%s: \"moe8_quantization\" must be an object", file);
      goto done;
    }
  }
  if (c->layer.num_experts < 1 || c->layer.top_k < 1 || c->layer.top_k > c->layer.num_experts || c->layer.hidden < 1 || c->layer.ffn < 1)
    st = moe8__fail(MOE8_ERR_PARSE, "%s: inconsistent sizes: experts %lld, num_experts_per_tok %lld, hidden %lld, ffn %lld", file,
                    (long long)c->layer.num_experts, (long long)c->layer.top_k, (long long)c->layer.hidden, (long long)c->layer.ffn);
done:
  cJSON_Delete(root);
  return st;
}

moe8_status moe8_hf_config_load(const char *path, moe8_hf_config *out) {
  FILE *f = fopen(path, "rb");
  if (!f) return moe8__fail(MOE8_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  char *buf = malloc(1 << 20);
  const size_t n = buf ? fread(buf, 1, 1 << 20, f) : 0;
  const bool big = buf && n == (1 << 20);
  fclose(f);
  if (!buf) return moe8__fail(MOE8_ERR_NOMEM, "%s: out of memory", path);
  if (big) { free(buf); return moe8__fail(MOE8_ERR_FORMAT, "%s: larger than 1 MiB", path); }
  moe8_status st = moe8_hf_config_parse(buf, n, path, out);
  free(buf);
  return st;
}
