/*
** rules.c — quantization rule sets (docs/numerics.md), parsed with cJSON.
**
** A rule set is {"rules": [rule, ...], "quantize_before_ep_all_gather": b}.
** Each rule has a required "module_path" (a POSIX extended regex) and any
** of weight_qtype, act_qtype, bwd_qtype, tile_size,
** weight_calibration_method, act_calibration_method; a missing field takes
** its default (not quantized, per-channel/per-token, absmax).  Anything
** unknown (field, qtype, method) is an error that names the file, the JSON
** path of the offending field and its line:column.
**
** cJSON keeps no source positions, so the position of a semantic error is
** the first occurrence of the offending token at or after the start of its
** rule object; a syntax error's position comes from cJSON's error pointer.
*/
#include "../core/internal.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct moe8_rules {
  size_t     count;
  moe8_rule *rules;
  regex_t   *regex;
  char     **paths;   /* owned copies of module_path */
  bool       before_all_gather;
  char      *text;    /* the JSON text it was parsed from (moe8 quantize records it) */
};

typedef struct parse_ctx {
  const char *text, *name;
  size_t      len;
} parse_ctx;

static void line_col(const parse_ctx *c, size_t off, int *line, int *col) {
  *line = 1; *col = 1;
  for (size_t i = 0; i < off && i < c->len; i++) {
    if (c->text[i] == '\n') { (*line)++; *col = 1; }
    else (*col)++;
  }
}

/* Offset of the first "token" (quoted) at or after from; len if none. */
static size_t find_token(const parse_ctx *c, const char *token, size_t from) {
  char q[256];
  snprintf(q, sizeof q, "\"%s\"", token);
  const size_t ql = strlen(q);
  for (size_t i = from; i + ql <= c->len; i++)
    if (memcmp(c->text + i, q, ql) == 0) return i;
  return c->len;
}

static moe8_status fail_at(const parse_ctx *c, size_t off, const char *path, const char *what) {
  int line, col;
  line_col(c, off, &line, &col);
  if (off >= c->len)
    return moe8__fail(MOE8_ERR_PARSE, "%s: %s: %s", c->name, path, what);
  return moe8__fail(MOE8_ERR_PARSE, "%s:%d:%d: %s: %s", c->name, line, col, path, what);
}

/* glibc's regcomp can take gigabytes on small hostile patterns (stacked
** repetition operators, large bounds); module paths are simple names, so
** such patterns are refused before regcomp.  NULL when the pattern is fine. */
static const char *regex_problem(const char *re) {
  const size_t n = strlen(re);
  if (n > 512) return "longer than 512 characters";
  bool prev_quant = false;
  for (size_t i = 0; i < n; i++) {
    const char c = re[i];
    if (c == '\\') {
      /* \d is Perl's, not POSIX's: regcomp reads it as a plain d, so
      ** "layers\.\d+" would match nothing, silently. */
      if (i + 1 < n && (re[i + 1] == 'd' || re[i + 1] == 'D')) return re[i + 1] == 'd' ? "\\d is not POSIX (write [0-9])" : "\\D is not POSIX (write [^0-9])";
      i++;
      prev_quant = false;
      continue;
    }
    const bool quant = c == '*' || c == '+' || c == '?' || c == '{';
    if (quant && prev_quant) return "stacked repetition operators";
    if (c == '{') {
      long bound = 0;
      for (i++; i < n && re[i] != '}'; i++)
        if (re[i] >= '0' && re[i] <= '9') {
          bound = bound * 10 + (re[i] - '0');
          if (bound > 100) return "a repetition bound above 100";
        } else if (re[i] == ',') bound = 0;
    }
    prev_quant = quant;
  }
  return NULL;
}

static bool parse_qtype(const cJSON *v, moe8_dtype *out) {
  if (cJSON_IsNull(v)) { *out = MOE8_DTYPE_NONE; return true; }
  if (!cJSON_IsString(v)) return false;
  const moe8_dtype t = moe8_dtype_from_name(v->valuestring);
  if (!moe8__is_qtype(t)) return false;
  *out = t;
  return true;
}

/* "absmax", "absmax,C", "absmax_pow2", "absmax_pow2,C", "qwix", "qwix,C"
** with 0 < C <= 1e30. */
static bool parse_calibration(const char *s, float *clip, bool *pow2, moe8_calibration *calib) {
  *clip = 1.0f;
  *pow2 = false;
  *calib = MOE8_CALIB_ABSMAX;
  const char *rest;
  if (strcmp(s, "mx") == 0) { *calib = MOE8_CALIB_MX; return true; }
  if (strncmp(s, "qwix", 4) == 0) { *calib = MOE8_CALIB_QWIX; rest = s + 4; }
  else if (strncmp(s, "absmax_pow2", 11) == 0) { *pow2 = true; rest = s + 11; }
  else if (strncmp(s, "absmax", 6) == 0) rest = s + 6;
  else return false;
  if (*rest == '\0') return true;
  if (*rest != ',') return false;
  char *end;
  errno = 0;
  const double c = strtod(rest + 1, &end);
  if (errno || end == rest + 1 || *end != '\0' || !(c > 0.0 && c <= 1e30)) return false;
  *clip = (float)c;
  return true;
}

static moe8_status parse_rule(const parse_ctx *c, const cJSON *obj, size_t idx, size_t from,
                              moe8_rules *rs) {
  char path[96];
  moe8_rule *r = &rs->rules[idx];
  r->weight_clip = r->act_clip = 1.0f;
  bool have_path = false;
  /* Where tile_size and weight_calibration_method are (len: absent), for
  ** the checks that need the whole rule. */
  size_t at_tile = c->len, at_wcal = c->len;
  if (!cJSON_IsObject(obj)) {
    snprintf(path, sizeof path, "rules[%zu]", idx);
    return fail_at(c, from, path, "a rule must be a JSON object");
  }
  for (const cJSON *f = obj->child; f; f = f->next) {
    snprintf(path, sizeof path, "rules[%zu].%s", idx, f->string);
    const size_t at = find_token(c, f->string, from);
    char msg[320];
    for (const cJSON *g = obj->child; g != f; g = g->next)
      if (!strcmp(g->string, f->string)) return fail_at(c, at, path, "duplicate field");
    if (strcmp(f->string, "module_path") == 0) {
      if (!cJSON_IsString(f)) return fail_at(c, at, path, "must be a string (a POSIX extended regex)");
      const char *bad = regex_problem(f->valuestring);
      if (bad) {
        snprintf(msg, sizeof msg, "regex refused: %s", bad);
        return fail_at(c, at, path, msg);
      }
      int rc = regcomp(&rs->regex[idx], f->valuestring, REG_EXTENDED | REG_NOSUB);
      if (rc != 0) {
        char err[128];
        regerror(rc, &rs->regex[idx], err, sizeof err);
        snprintf(msg, sizeof msg, "invalid regex \"%.64s\": %s", f->valuestring, err);
        return fail_at(c, at, path, msg);
      }
      rs->paths[idx] = strdup(f->valuestring);
      if (!rs->paths[idx]) { regfree(&rs->regex[idx]); return moe8__fail(MOE8_ERR_NOMEM, "rules: out of memory"); }
      r->module_path = rs->paths[idx];
      have_path = true;
    } else if (strcmp(f->string, "weight_qtype") == 0 || strcmp(f->string, "act_qtype") == 0 ||
               strcmp(f->string, "bwd_qtype") == 0) {
      moe8_dtype *dst = f->string[0] == 'w' ? &r->weight_qtype : f->string[0] == 'a' ? &r->act_qtype : &r->bwd_qtype;
      if (cJSON_IsString(f) && !strcmp(f->valuestring, "mxfp8")) {
        /* MXFP8: e4m3 codes, OCP MX scales per 32 along K */
        if (f->string[0] != 'w') return fail_at(c, find_token(c, f->valuestring, at), path, "mxfp8 is a weight format only (weight_qtype)");
        *dst = MOE8_DTYPE_F8E4M3;
        r->weight_calib = MOE8_CALIB_MX;
        r->weight_mx8 = true;
        continue;
      }
      if (cJSON_IsString(f) && (!strcmp(f->valuestring, "mxfp4") || !strcmp(f->valuestring, "mx4"))) {
        if (f->string[0] != 'w') return fail_at(c, find_token(c, f->valuestring, at), path, "mxfp4 is a weight format only (weight_qtype)");
        r->weight_mxfp4 = true;
        *dst = MOE8_DTYPE_NONE;
        continue;
      }
      if (!parse_qtype(f, dst)) {
        snprintf(msg, sizeof msg, "unknown qtype %s%.64s%s (expected float8_e4m3fn, float8_e5m2, int8, null, or mxfp4 for weights)",
                 cJSON_IsString(f) ? "\"" : "", cJSON_IsString(f) ? f->valuestring : "(not a string)",
                 cJSON_IsString(f) ? "\"" : "");
        return fail_at(c, cJSON_IsString(f) ? find_token(c, f->valuestring, at) : at, path, msg);
      }
    } else if (strcmp(f->string, "tile_size") == 0) {
      at_tile = at;
      if (cJSON_IsNull(f)) { r->tile_size = 0; continue; }
      if (!cJSON_IsNumber(f) || !(f->valuedouble >= 1 && f->valuedouble <= 1048576) || f->valuedouble != floor(f->valuedouble))
        return fail_at(c, at, path, "must be a positive integer (at most 1048576) or null");
      r->tile_size = (int64_t)f->valuedouble;
    } else if (strcmp(f->string, "weight_calibration_method") == 0 ||
               strcmp(f->string, "act_calibration_method") == 0) {
      const bool w = f->string[0] == 'w';
      if (w) at_wcal = at;
      if (!cJSON_IsString(f) ||
          !parse_calibration(f->valuestring, w ? &r->weight_clip : &r->act_clip, w ? &r->weight_pow2 : &r->act_pow2,
                             w ? &r->weight_calib : &r->act_calib)) {
        snprintf(msg, sizeof msg,
                 "unknown calibration method %.64s (expected \"absmax\", \"absmax,C\", \"absmax_pow2\", \"absmax_pow2,C\", \"qwix\", "
                 "\"qwix,C\" with C > 0, or \"mx\")",
                 cJSON_IsString(f) ? f->valuestring : "(not a string)");
        return fail_at(c, cJSON_IsString(f) ? find_token(c, f->valuestring, at) : at, path, msg);
      }
    } else {
      return fail_at(c, at, path, "unknown field");
    }
  }
  if (!have_path) {
    snprintf(path, sizeof path, "rules[%zu]", idx);
    return fail_at(c, from, path, "missing required field \"module_path\"");
  }
  if (r->weight_mx8) {
    snprintf(path, sizeof path, "rules[%zu]", idx);
    if (r->tile_size == 0) r->tile_size = 32;
    if (r->tile_size != 32) return fail_at(c, from, path, "weight_qtype mxfp8 has its blocks of 32 along K: tile_size must be 32 or absent");
    if (r->weight_calib != MOE8_CALIB_MX)
      return fail_at(c, from, path, "weight_qtype mxfp8 takes the mx calibration: weight_calibration_method must be \"mx\" or absent");
  }
  if (r->weight_mxfp4) {
    /* MXFP4 has one quantizer (E8M0 scale per 32 along K from the block's
    ** maximum): what it cannot honour is refused, never ignored. */
    if (at_wcal < c->len && r->weight_calib != MOE8_CALIB_MX) {
      snprintf(path, sizeof path, "rules[%zu].weight_calibration_method", idx);
      return fail_at(c, at_wcal, path, "weight_qtype mxfp4 has its own scale (E8M0 per 32 along K): weight_calibration_method must be \"mx\" or absent");
    }
    snprintf(path, sizeof path, "rules[%zu].tile_size", idx);
    if (r->act_qtype == MOE8_DTYPE_NONE && at_tile < c->len && r->tile_size != 0 && r->tile_size != 32)
      return fail_at(c, at_tile, path, "weight_qtype mxfp4 has its blocks of 32 along K and act_qtype is null: tile_size must be 32, null or absent");
    if (r->act_qtype == MOE8_DTYPE_I8 && r->tile_size % 32 != 0)
      return fail_at(c, at_tile, path, "weight_qtype mxfp4 with int8 activations takes 1 x tile_size activation blocks a multiple of 32 "
                                       "(or none: per token)");
    if (r->act_qtype != MOE8_DTYPE_NONE && r->act_qtype != MOE8_DTYPE_I8) {
      snprintf(path, sizeof path, "rules[%zu].act_qtype", idx);
      return fail_at(c, find_token(c, "act_qtype", from), path, "weight_qtype mxfp4 runs f32 or int8 activations: act_qtype must be null or int8");
    }
  }
  return MOE8_OK;
}

moe8_status moe8_rules_parse(const char *json, size_t len, const char *name, moe8_rules **out) {
  if (!json || !out) return moe8__fail(MOE8_ERR_INVALID_ARG, "moe8_rules_parse: NULL argument");
  *out = NULL;
  parse_ctx c = {json, name ? name : "<rules>", len};
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, false);
  if (!root) {
    /* This call's end pointer locates the error (the library's global error
    ** pointer is shared by every thread). */
    const char *ep = end;
    size_t off = ep && ep >= json && ep <= json + len ? (size_t)(ep - json) : len;
    int line, col;
    line_col(&c, off, &line, &col);
    return moe8__fail(MOE8_ERR_PARSE, "%s:%d:%d: malformed JSON (at byte %zu)", c.name, line, col, off);
  }
  /* Trailing non-space text after the document is an error too. */
  for (const char *p = end; p && p < json + len; p++)
    if (*p != ' ' && *p != '\n' && *p != '\r' && *p != '\t' && *p != '\0') {
      cJSON_Delete(root);
      int line, col;
      line_col(&c, (size_t)(p - json), &line, &col);
      return moe8__fail(MOE8_ERR_PARSE, "%s:%d:%d: trailing characters after the JSON document", c.name, line, col);
    }
  moe8_status st = MOE8_OK;
  moe8_rules *rs = calloc(1, sizeof *rs);
  if (!rs) { cJSON_Delete(root); return moe8__fail(MOE8_ERR_NOMEM, "rules: out of memory"); }
  if (!cJSON_IsObject(root)) { st = fail_at(&c, 0, "$", "the rule set must be a JSON object"); goto done; }
  const cJSON *rules = NULL;
  for (const cJSON *f = root->child; f; f = f->next) {
    for (const cJSON *g = root->child; g != f; g = g->next)
      if (!strcmp(g->string, f->string)) { st = fail_at(&c, find_token(&c, f->string, 0), f->string, "duplicate field"); goto done; }
    if (strcmp(f->string, "rules") == 0) rules = f;
    else if (strcmp(f->string, "quantize_before_ep_all_gather") == 0) {
      if (!cJSON_IsBool(f)) { st = fail_at(&c, find_token(&c, f->string, 0), f->string, "must be true or false"); goto done; }
      rs->before_all_gather = cJSON_IsTrue(f);
    } else {
      st = fail_at(&c, find_token(&c, f->string, 0), f->string, "unknown field");
      goto done;
    }
  }
  if (!rules || !cJSON_IsArray(rules)) {
    st = fail_at(&c, rules ? find_token(&c, "rules", 0) : len, "rules", rules ? "must be an array" : "missing required field");
    goto done;
  }
  const size_t n = (size_t)cJSON_GetArraySize(rules);
  rs->rules = calloc(n ? n : 1, sizeof *rs->rules);
  rs->regex = calloc(n ? n : 1, sizeof *rs->regex);
  rs->paths = calloc(n ? n : 1, sizeof *rs->paths);
  if (!rs->rules || !rs->regex || !rs->paths) { st = moe8__fail(MOE8_ERR_NOMEM, "rules: out of memory"); goto done; }
  size_t from = find_token(&c, "rules", 0), i = 0;
  for (const cJSON *r = rules->child; r; r = r->next, i++) {
    /* Each rule's search for positions starts at its own module_path key. */
    size_t here = find_token(&c, "module_path", from);
    if (here < len) from = here;
    st = parse_rule(&c, r, i, from, rs);
    rs->count = i + (rs->paths[i] != NULL);
    if (st != MOE8_OK) goto done;
    from = from < len ? from + 1 : len;
  }
  if (!(rs->text = malloc(len + 1))) { st = moe8__fail(MOE8_ERR_NOMEM, "rules: out of memory"); goto done; }
  memcpy(rs->text, json, len);
  rs->text[len] = '\0';
done:
  cJSON_Delete(root);
  if (st != MOE8_OK) { moe8_rules_destroy(rs); return st; }
  *out = rs;
  return MOE8_OK;
}

/* The text a rule set was parsed from (moe8 quantize records it in the
** file's config.json, so a run of the file applies the same rules). */
const char *moe8__rules_text(const moe8_rules *rs);
const char *moe8__rules_text(const moe8_rules *rs) { return rs ? rs->text : NULL; }

moe8_status moe8_rules_load(const char *path, moe8_rules **out) {
  if (!path || !out) return moe8__fail(MOE8_ERR_INVALID_ARG, "moe8_rules_load: NULL argument");
  *out = NULL;
  /* The one open routine for inputs: a regular file only (a FIFO or a
  ** device is refused without blocking), at most 64 MiB. */
  char *buf = NULL;
  size_t len = 0;
  moe8_status st = moe8__read_small(path, (size_t)64 << 20, &buf, &len);
  if (st != MOE8_OK) return st;
  st = moe8_rules_parse(buf, len, path, out);
  free(buf);
  return st;
}

void moe8_rules_destroy(moe8_rules *rs) {
  if (!rs) return;
  for (size_t i = 0; i < rs->count; i++) {
    if (rs->paths[i]) regfree(&rs->regex[i]);
    free(rs->paths[i]);
  }
  free(rs->rules);
  free(rs->regex);
  free(rs->paths);
  free(rs->text);
  free(rs);
}

const moe8_rule *moe8_rules_match(const moe8_rules *rs, const char *module_path) {
  if (!rs || !module_path) return NULL;
  for (size_t i = 0; i < rs->count; i++)
    if (regexec(&rs->regex[i], module_path, 0, NULL, 0) == 0) return &rs->rules[i];
  return NULL;
}

size_t moe8_rules_count(const moe8_rules *rs) { return rs ? rs->count : 0; }

const moe8_rule *moe8_rules_at(const moe8_rules *rs, size_t i) {
  return rs && i < rs->count ? &rs->rules[i] : NULL;
}

bool moe8_rules_quantize_before_ep_all_gather(const moe8_rules *rs) {
  return rs && rs->before_all_gather;
}

bool moe8_rule_weight_spec(const moe8_rule *r, moe8_quant_spec *spec) {
  if (!r || !moe8__is_qtype(r->weight_qtype)) return false;
  memset(spec, 0, sizeof *spec);
  spec->qtype = r->weight_qtype;
  spec->gran = r->tile_size > 0 ? MOE8_GRAN_CHANNEL_TILE : MOE8_GRAN_CHANNEL;
  spec->tile = r->tile_size;
  spec->clip = r->weight_clip;
  spec->pow2 = r->weight_pow2;
  spec->calib = r->weight_calib;
  return true;
}

bool moe8_rule_act_spec(const moe8_rule *r, moe8_quant_spec *spec) {
  if (!r || !moe8__is_qtype(r->act_qtype)) return false;
  memset(spec, 0, sizeof *spec);
  spec->qtype = r->act_qtype;
  spec->gran = r->tile_size > 0 ? MOE8_GRAN_ROW_TILE : MOE8_GRAN_ROW;
  spec->tile = r->tile_size;
  spec->clip = r->act_clip;
  spec->pow2 = r->act_pow2;
  spec->calib = r->act_calib;
  return true;
}
