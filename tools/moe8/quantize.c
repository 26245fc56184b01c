/*
** quantize.c — 'moe8 quantize IN OUT --rules R [--format moe8|deepseek]':
** pre-quantize the expert weights of every layer, once (seed B).
**
**   moe8      per the rule: gate|up fused [E, D, 2F] and down [E, F, D] as
**             F8_E4M3 or I8 "qweight" with F32 "scale" [E, nb, 1, N]; the
**             run path installs them as they are.
**   deepseek  every expert weight [N, K] as F8_E4M3 ".weight" plus F32
**             ".weight_scale_inv" [ceil(N/128), ceil(K/128)], w ≈ q · s per
**             128×128 block, and quantization_config in config.json.
**
** Everything is loaded and checked before anything is written.  The whole
** new model (tensors and config) is written into a temporary directory
** beside OUT and swapped in only when complete (an atomic exchange of the
** two directories where the file system has it); the old model's files
** (config, every shard, the index) are removed only after the swap, and
** any other file in OUT is kept.  A failure at any point leaves OUT as it
** was.
*/
#define _GNU_SOURCE 1 /* renameat2 */
#include "cli.h"
#include "core/internal.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A model file of a directory: the config, a tensor file or shard, the
** shard index. */
static int is_model_file(const char *name) {
  const size_t n = strlen(name);
  return !strcmp(name, "config.json") || !strcmp(name, "model.safetensors.index.json") ||
         (n > 12 && !strcmp(name + n - 12, ".safetensors"));
}

/* Removes dir's model files and, if it is then empty, dir; other entries
** are moved into keep (when keep is not NULL). */
static int clear_old(const char *dir, const char *keep) {
  DIR *d = opendir(dir);
  if (!d) return EXIT_FAIL;
  int rc = EXIT_OK;
  struct dirent *e;
  char a[4096], b[4096];
  while ((e = readdir(d)) != NULL) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    snprintf(a, sizeof a, "%s/%s", dir, e->d_name);
    if (is_model_file(e->d_name)) {
      if (unlink(a) != 0) rc = EXIT_FAIL;
    } else if (keep) {
      snprintf(b, sizeof b, "%s/%s", keep, e->d_name);
      if (access(b, F_OK) == 0 || rename(a, b) != 0) rc = EXIT_FAIL;
    } else {
      rc = EXIT_FAIL;
    }
  }
  closedir(d);
  if (rc == EXIT_OK && rmdir(dir) != 0) rc = EXIT_FAIL;
  return rc;
}

/* The finished model in tmp becomes outdir. */
static int swap_in(char *tmp, size_t cap, const char *outdir) {
  struct stat sb;
  if (stat(outdir, &sb) != 0) {
    if (rename(tmp, outdir) == 0) return EXIT_OK;
    fprintf(stderr, "moe8 quantize: cannot move the new model to %s: %s (it is complete in %s)\n", outdir, strerror(errno), tmp);
    return EXIT_FAIL;
  }
  char real[4096];
  if (!realpath(outdir, real)) snprintf(real, sizeof real, "%s", outdir);
  /* One atomic exchange where the file system has it, else two renames. */
  if (renameat2(AT_FDCWD, tmp, AT_FDCWD, real, RENAME_EXCHANGE) != 0) {
    char old[4200];
    snprintf(old, sizeof old, "%s.moe8-old-%ld", real, (long)getpid());
    if (rename(real, old) != 0 || rename(tmp, real) != 0) {
      fprintf(stderr, "moe8 quantize: cannot swap the new model into %s: %s (it is complete in %s)\n", outdir, strerror(errno), tmp);
      return EXIT_FAIL;
    }
    snprintf(tmp, cap, "%s", old); /* the old model is now there */
  }
  /* tmp now holds the old model: drop its model files, keep the rest. */
  if (clear_old(tmp, real) != EXIT_OK)
    fprintf(stderr, "moe8 quantize: the new model is in %s; some files of the old one are left in %s\n", outdir, tmp);
  return EXIT_OK;
}

static void usage(FILE *f) {
  fprintf(f, "usage: moe8 quantize IN_DIR OUT_DIR --rules RULES.json [--format moe8|deepseek] [--force]\n\n"
             "Pre-quantizes the expert weights of each layer whose '<prefix>experts' module path matches a\n"
             "rule with a weight_qtype (f8e4m3 or int8; f8e5m2 is left unquantized with a notice).\n"
             "  --format moe8      [E, nb, 1, N] scales as the fused kernels consume them (default)\n"
             "  --format deepseek  DeepSeek-V3 FP8: F8_E4M3 .weight + F32 .weight_scale_inv per 128x128 block\n"
             "Other tensors are copied. One progress line per tensor.\n"
             "OUT_DIR must not be IN_DIR; a model already in OUT_DIR is replaced only with --force.\n"
             "exit codes: 0 ok, 1 failure (nothing written), 2 usage\n");
}

typedef struct outset {
  moe8_tensor_view *t;
  char            **names;
  void            **owned;
  size_t            n, cap;
} outset;

static int add(outset *o, const char *name, moe8_file_dtype dt, int ndim, const int64_t *shape, const void *data,
               size_t nbytes, void *owned) {
  if (o->n == o->cap) {
    o->cap = o->cap ? o->cap * 2 : 64;
    o->t = realloc(o->t, o->cap * sizeof *o->t);
    o->names = realloc(o->names, o->cap * sizeof *o->names);
    o->owned = realloc(o->owned, o->cap * sizeof *o->owned);
    if (!o->t || !o->names || !o->owned) return 0;
  }
  o->names[o->n] = strdup(name);
  o->owned[o->n] = owned;
  o->t[o->n] = (moe8_tensor_view){o->names[o->n], dt, ndim, {0}, data, nbytes, 0};
  for (int i = 0; i < ndim; i++) o->t[o->n].shape[i] = shape[i];
  o->n++;
  return 1;
}

static void outset_free(outset *o) {
  for (size_t i = 0; i < o->n; i++) { free(o->names[i]); free(o->owned[i]); }
  free(o->t); free(o->names); free(o->owned);
}

/* Is this tensor an expert weight (or scale) of some layer? */
static int is_expert_tensor(const char *name, int deepseek) {
  return strstr(name, ".experts.") != NULL || (deepseek && (strstr(name, ".shared_experts.") || strstr(name, ".shared_expert.")));
}

int cmd_quantize(int argc, char **argv) {
  const char *in = NULL, *outdir = NULL, *rules_path = NULL, *format = "moe8";
  int force = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (cli_is_help(a)) { usage(stdout); return EXIT_OK; }
    if (!strcmp(a, "--rules") && v) rules_path = argv[++i];
    else if (!strcmp(a, "--force")) force = 1;
    else if (!strcmp(a, "--format") && v) format = argv[++i];
    else if (a[0] != '-' && !in) in = a;
    else if (a[0] != '-' && !outdir) outdir = a;
    else { fprintf(stderr, "moe8 quantize: bad argument '%s'\n\n", a); usage(stderr); return EXIT_USAGE; }
  }
  const int deepseek = !strcmp(format, "deepseek");
  if (!in || !outdir || !rules_path || (!deepseek && strcmp(format, "moe8"))) { usage(stderr); return EXIT_USAGE; }
  /* Never over the input, and not over another model unless asked. */
  if (cli_same_file(in, outdir)) {
    fprintf(stderr, "moe8 quantize: the output directory %s is the input model %s: refused\n", outdir, in);
    return EXIT_FAIL;
  }
  {
    char a1[4096], a2[4096];
    const char *files[2] = {"config.json", "model.safetensors"};
    for (int k = 0; k < 2; k++) {
      snprintf(a1, sizeof a1, "%s/%s", outdir, files[k]);
      snprintf(a2, sizeof a2, "%s/%s", in, files[k]);
      if (cli_same_file(a1, a2)) {
        fprintf(stderr, "moe8 quantize: %s is the input's %s: refused\n", a1, a2);
        return EXIT_FAIL;
      }
      if (!force && access(a1, F_OK) == 0) {
        fprintf(stderr, "moe8 quantize: %s already holds a model (%s): refused without --force\n", outdir, a1);
        return EXIT_FAIL;
      }
    }
    snprintf(a1, sizeof a1, "%s/model.safetensors.index.json", outdir);
    if (!force && access(a1, F_OK) == 0) {
      fprintf(stderr, "moe8 quantize: %s already holds a sharded model (%s): refused without --force\n", outdir, a1);
      return EXIT_FAIL;
    }
    struct stat ob;
    if (stat(outdir, &ob) == 0 && !S_ISDIR(ob.st_mode)) {
      fprintf(stderr, "moe8 quantize: %s exists and is not a directory\n", outdir);
      return EXIT_FAIL;
    }
  }
  moe8_rules *rules = NULL;
  moe8_model *m = NULL;
  moe8_status st = moe8_rules_load(rules_path, &rules);
  if (st == MOE8_OK) st = moe8_model_open(in, &m);
  if (st != MOE8_OK) { moe8_rules_destroy(rules); return cli_report(st, "quantize"); }
  const moe8_hf_config *hc = moe8_model_config(m);
  const int64_t E = hc->layer.num_experts, D = hc->layer.hidden, F = hc->layer.ffn;
  outset o = {0};
  int rc = EXIT_OK, quantized_layers = 0;
  int64_t qtile = 0;
  int packed_layout = 0;
  moe8_dtype qtype = MOE8_DTYPE_NONE;
  /* Which layers get quantized, and their new tensors. */
  unsigned char *replace = calloc((size_t)hc->num_layers, 1);
  for (int64_t l = 0; l < hc->num_layers && rc == EXIT_OK; l++) {
    char p[128], mp[160];
    moe8_model_prefix(m, l, p, sizeof p);
    snprintf(mp, sizeof mp, "%sexperts", p);
    const moe8_rule *r = moe8_rules_match(rules, mp);
    if (moe8_hf_config_check_moe_layer(hc, l) != MOE8_OK) {
      if (!cli_quiet) printf("layer %lld: a dense MLP layer, copied\n", (long long)l);
      continue;
    }
    if (strstr(moe8_model_format(m, l), "unquantized") == NULL) {
      fprintf(stderr, "moe8 quantize: %s: layer %lld is already quantized (%s)\n", in, (long long)l, moe8_model_format(m, l));
      rc = EXIT_FAIL;
      break;
    }
    if (!r || (r->weight_qtype != MOE8_DTYPE_F8E4M3 && r->weight_qtype != MOE8_DTYPE_I8)) {
      printf("layer %lld: %s: weights left as they are\n", (long long)l,
             !r ? "no rule matches" : r->weight_qtype == MOE8_DTYPE_NONE ? "the rule has no weight_qtype"
                                                                         : "notice: weight_qtype is not pre-quantized (f8e4m3 and int8 are)");
      continue;
    }
    if (deepseek && r->weight_qtype != MOE8_DTYPE_F8E4M3) {
      fprintf(stderr, "moe8 quantize: --format deepseek stores F8_E4M3 only; the rule for %s asks for %s\n", mp,
              moe8_dtype_info(r->weight_qtype)->name);
      rc = EXIT_USAGE;
      break;
    }
    moe8_layer *L = NULL;
    if ((st = moe8_model_load_layer(m, l, rules, &L)) != MOE8_OK) { rc = cli_report(st, "quantize"); break; }
    replace[l] = 1;
    quantized_layers++;
    qtype = r->weight_qtype;
    qtile = r->tile_size;
    char n[256];
    if (!deepseek) {
      moe8_prepared pr;
      if ((st = moe8_layer_prepare(L)) != MOE8_OK || (st = moe8_layer_prepared(L, &pr)) != MOE8_OK) { rc = cli_report(st, "quantize"); moe8_layer_destroy(L); break; }
      const int64_t nbg = pr.tile ? (D + pr.tile - 1) / pr.tile : 1, nbd = pr.tile ? (F + pr.tile - 1) / pr.tile : 1;
      const moe8_file_dtype fq = pr.dtype == MOE8_DTYPE_I8 ? MOE8_FDT_I8 : MOE8_FDT_F8_E4M3;
      /* The kernels' packed layout when the K blocks allow (a run maps it
      ** in place), else the plain [E, K, N] codes. */
      const int64_t per = pr.dtype == MOE8_DTYPE_I8 ? 4 : 2;
      const int pk = (!pr.tile || pr.tile % per == 0);
      const size_t pgu = moe8_gmm_packed_size(pr.dtype, 1, D, 2 * F), pdn = moe8_gmm_packed_size(pr.dtype, 1, F, D);
      const int64_t s1[3] = {E, D, 2 * F}, s2[4] = {E, nbg, 1, 2 * F}, s3[3] = {E, F, D}, s4[4] = {E, nbd, 1, D};
      const int64_t p1[2] = {E, (int64_t)pgu}, p3[2] = {E, (int64_t)pdn};
      const size_t b1 = pk ? (size_t)E * pgu : (size_t)(E * D * 2 * F), b2 = (size_t)(E * nbg * 2 * F) * 4;
      const size_t b3 = pk ? (size_t)E * pdn : (size_t)(E * F * D), b4 = (size_t)(E * nbd * D) * 4;
      void *c1 = malloc(b1), *c2 = malloc(b2), *c3 = malloc(b3), *c4 = malloc(b4);
      if (!c1 || !c2 || !c3 || !c4) { free(c1); free(c2); free(c3); free(c4); rc = EXIT_FAIL; moe8_layer_destroy(L); break; }
      if (pk) {
        st = moe8_gmm_pack_rhs(pr.dtype, pr.w_gate_up, E, D, 2 * F, c1);
        if (st == MOE8_OK) st = moe8_gmm_pack_rhs(pr.dtype, pr.w_down, E, F, D, c3);
        if (st != MOE8_OK) { free(c1); free(c2); free(c3); free(c4); rc = cli_report(st, "quantize"); moe8_layer_destroy(L); break; }
      } else {
        memcpy(c1, pr.w_gate_up, b1); memcpy(c3, pr.w_down, b3);
      }
      packed_layout = pk;
      memcpy(c2, pr.s_gate_up, b2); memcpy(c4, pr.s_down, b4);
      snprintf(n, sizeof n, "%sexperts.gate_up_proj.%s", p, pk ? "qweight_packed" : "qweight"); add(&o, n, fq, pk ? 2 : 3, pk ? p1 : s1, c1, b1, c1);
      if (!cli_quiet) printf("quantize %s [%lld, %lld, %lld] -> %s%s\n", n, (long long)E, (long long)D, (long long)(2 * F), moe8_file_dtype_name(fq), pk ? " (packed)" : "");
      snprintf(n, sizeof n, "%sexperts.gate_up_proj.scale", p); add(&o, n, MOE8_FDT_F32, 4, s2, c2, b2, c2);
      snprintf(n, sizeof n, "%sexperts.down_proj.%s", p, pk ? "qweight_packed" : "qweight"); add(&o, n, fq, pk ? 2 : 3, pk ? p3 : s3, c3, b3, c3);
      if (!cli_quiet) printf("quantize %s [%lld, %lld, %lld] -> %s\n", n, (long long)E, (long long)F, (long long)D, moe8_file_dtype_name(fq));
      snprintf(n, sizeof n, "%sexperts.down_proj.scale", p); add(&o, n, MOE8_FDT_F32, 4, s4, c4, b4, c4);
    } else {
      const moe8_quant_spec spec = {.qtype = MOE8_DTYPE_F8E4M3, .gran = MOE8_GRAN_BLOCK2D, .tile = 128, .block_n = 128, .clip = 1.0f};
      const char *proj[3] = {hc->arch == MOE8_ARCH_MIXTRAL ? "w1" : "gate_proj", hc->arch == MOE8_ARCH_MIXTRAL ? "w3" : "up_proj",
                             hc->arch == MOE8_ARCH_MIXTRAL ? "w2" : "down_proj"};
      const float *mw[3] = {moe8_layer_weight_read(L, MOE8_W_GATE, NULL), moe8_layer_weight_read(L, MOE8_W_UP, NULL), moe8_layer_weight_read(L, MOE8_W_DOWN, NULL)};
      const float *sw[3] = {moe8_layer_weight_read(L, MOE8_W_SHARED_GATE, NULL), moe8_layer_weight_read(L, MOE8_W_SHARED_UP, NULL),
                            moe8_layer_weight_read(L, MOE8_W_SHARED_DOWN, NULL)};
      const int64_t Fs = hc->layer.shared_ffn;
      const char *sname = hc->arch == MOE8_ARCH_DEEPSEEK_V3 ? "shared_experts" : "shared_expert";
      /* e = E is the shared expert (when the layer has one). */
      for (int64_t e = 0; e < E + (Fs > 0) && rc == EXIT_OK; e++)
        for (int w = 0; w < 3 && rc == EXIT_OK; w++) {
          const int sh = e == E;
          const int64_t FF = sh ? Fs : F, N = w == 2 ? D : FF, K = w == 2 ? FF : D;
          float *wt = malloc(sizeof(float) * (size_t)(N * K));
          const size_t ns = (size_t)(((N + 127) / 128) * ((K + 127) / 128));
          void *q = malloc((size_t)(N * K)), *s = malloc(ns * 4);
          if (!wt || !q || !s) { free(wt); free(q); free(s); rc = EXIT_FAIL; break; }
          const float *src = sh ? sw[w] : mw[w] + e * N * K; /* master [K, N] */
          for (int64_t nn = 0; nn < N; nn++)
            for (int64_t k = 0; k < K; k++) wt[nn * K + k] = src[k * N + nn];
          st = moe8_quantize(&spec, wt, 1, N, K, q, s, NULL);
          free(wt);
          if (st != MOE8_OK) { free(q); free(s); rc = cli_report(st, "quantize"); break; }
          const int64_t qs[2] = {N, K}, ss[2] = {(N + 127) / 128, (K + 127) / 128};
          if (sh) snprintf(n, sizeof n, "%s%s.%s.weight", p, sname, proj[w]);
          else snprintf(n, sizeof n, "%sexperts.%lld.%s.weight", p, (long long)e, proj[w]);
          add(&o, n, MOE8_FDT_F8_E4M3, 2, qs, q, (size_t)(N * K), q);
          if (!cli_quiet) printf("quantize %s [%lld, %lld] -> F8_E4M3 + weight_scale_inv [%lld, %lld]\n", n, (long long)N, (long long)K,
                 (long long)ss[0], (long long)ss[1]);
          if (sh) snprintf(n, sizeof n, "%s%s.%s.weight_scale_inv", p, sname, proj[w]);
          else snprintf(n, sizeof n, "%sexperts.%lld.%s.weight_scale_inv", p, (long long)e, proj[w]);
          add(&o, n, MOE8_FDT_F32, 2, ss, s, ns * 4, s);
        }
    }
    moe8_layer_destroy(L);
  }
  /* Everything else is copied as it is. */
  for (size_t i = 0; i < moe8_model_tensor_count(m) && rc == EXIT_OK; i++) {
    const moe8_tensor_view *t = moe8_model_tensor_at(m, i);
    long long l = -1;
    if (is_expert_tensor(t->name, deepseek) && sscanf(t->name, "model.layers.%lld.", &l) == 1 && l >= 0 && l < hc->num_layers && replace[l]) continue;
    add(&o, t->name, t->dtype, t->ndim, t->shape, t->data, t->nbytes, NULL);
  }
  /* The new model, whole, in a directory beside OUT. */
  char path[4400], tmp[4200];
  {
    size_t n = strlen(outdir);
    while (n > 1 && outdir[n - 1] == '/') n--;
    snprintf(tmp, sizeof tmp, "%.*s.moe8-new-XXXXXX", (int)n, outdir);
  }
  int have_tmp = 0;
  if (rc == EXIT_OK) {
    if (mkdtemp(tmp)) have_tmp = 1;
    else { fprintf(stderr, "moe8 quantize: cannot create %s beside the output: %s\n", tmp, strerror(errno)); rc = EXIT_FAIL; }
  }
  if (rc == EXIT_OK) {
    snprintf(path, sizeof path, "%s/model.safetensors", tmp);
    if ((st = moe8_st_write(path, o.t, o.n)) != MOE8_OK) rc = cli_report(st, "quantize");
  }
  if (rc == EXIT_OK) {
    snprintf(path, sizeof path, "%s/config.json", in);
    char *txt = NULL;
    size_t n = 0;
    if ((st = moe8__read_small(path, (size_t)16 << 20, &txt, &n)) != MOE8_OK) rc = cli_report(st, "quantize");
    cJSON *root = txt ? cJSON_ParseWithLength(txt, n) : NULL;
    free(txt);
    if (!root) rc = EXIT_FAIL;
    else if (quantized_layers) {
      cJSON_DeleteItemFromObjectCaseSensitive(root, "quantization_config");
      cJSON_DeleteItemFromObjectCaseSensitive(root, "moe8_quantization");
      if (deepseek) {
        cJSON *q = cJSON_AddObjectToObject(root, "quantization_config");
        cJSON_AddStringToObject(q, "quant_method", "fp8");
        cJSON_AddStringToObject(q, "fmt", "e4m3");
        cJSON *bs = cJSON_AddArrayToObject(q, "weight_block_size");
        cJSON_AddItemToArray(bs, cJSON_CreateNumber(128));
        cJSON_AddItemToArray(bs, cJSON_CreateNumber(128));
        cJSON_AddStringToObject(q, "activation_scheme", "dynamic");
      } else {
        cJSON *q = cJSON_AddObjectToObject(root, "moe8_quantization");
        cJSON_AddStringToObject(q, "weight_qtype", moe8_dtype_info(qtype)->name);
        cJSON_AddNumberToObject(q, "tile_size", (double)qtile);
        cJSON_AddStringToObject(q, "scale_layout", "[E, nb, 1, N]");
        cJSON_AddNumberToObject(q, "packed_layout", packed_layout);
      }
    }
    if (root) {
      snprintf(path, sizeof path, "%s/config.json", tmp);
      rc = cli_write_json(path, root);
      cJSON_Delete(root);
    }
    if (rc != EXIT_OK) fprintf(stderr, "moe8 quantize: cannot write the new config.json; %s is unchanged\n", outdir);
  }
  /* Test hook (docs/testing.md): fail after the whole new model is written. */
  if (rc == EXIT_OK && getenv("MOE8_TEST_QUANTIZE_FAIL")) {
    fprintf(stderr, "moe8 quantize: failing on purpose (MOE8_TEST_QUANTIZE_FAIL); %s is unchanged\n", outdir);
    rc = EXIT_FAIL;
  }
  if (rc == EXIT_OK) rc = swap_in(tmp, sizeof tmp, outdir);
  else if (have_tmp) clear_old(tmp, NULL);
  if (rc == EXIT_OK)
    printf("quantize: %d of %lld layer(s) quantized (%s format), %zu tensors -> %s\n", quantized_layers, (long long)hc->num_layers,
           format, o.n, outdir);
  outset_free(&o);
  free(replace);
  moe8_model_close(m);
  moe8_rules_destroy(rules);
  return rc;
}
