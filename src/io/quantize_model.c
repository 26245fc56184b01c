/*
** quantize_model.c — moe8_model_quantize(): pre-quantize the expert weights
** of every layer of a model directory, once (the `moe8 quantize` command
** and Python's moe8.quantize_model call it).
**
**   moe8      per the rule: gate|up fused [E, D, 2F] and down [E, F, D] as
**             F8_E4M3 or I8 "qweight" (the kernels' packed layout where the
**             K blocks allow: "qweight_packed") with F32 "scale"
**             [E, nb, 1, N]; the run path installs them as they are.
**             Under weight_qtype mxfp4: OCP MXFP4 "_blocks" and E8M0
**             "_scales" of both (docs/files.md).  Doge's product-key
**             tables down_embed / up_embed [E, D]: "qweight" codes and
**             "scale" [E, nb, 1, 1] per expert row (FP8 or int8 rules).
**   deepseek  every expert weight [N, K] as F8_E4M3 ".weight" plus F32
**             ".weight_scale_inv" [ceil(N/128), ceil(K/128)], w ≈ q · s per
**             128×128 block, and quantization_config in config.json.
**
** Everything is loaded and checked before anything is written.  OUT is
** resolved first (a symlink to its target, wherever that is), and the whole
** new model (tensors and config) is written into a temporary directory
** beside the resolved target, "<target>.moe8-new-<pid>-XXXXXX" (so every
** rename stays on one file system), with the mode of the directory it
** replaces or, for a new one, a plain mkdir's (0777 & ~umask); it is
** swapped in only when complete (an atomic exchange of the two directories
** where the file system has it, else two renames, undone if the second
** fails).  Only files of the old model are removed after the swap: its
** config.json, model.safetensors, model.safetensors.index.json and the
** shards that index names; every other file in OUT is kept.  Another
** *.safetensors in OUT (an adapter, a stray shard) would load as a shard of
** the new model: it is refused before anything is written, never deleted.
** A failure at any point leaves OUT as it was; a failure in the swap says
** where each model is.  A temporary directory of an interrupted run on the
** same target (its process gone) is removed by the next run, or named when
** it holds files moe8 did not write.
*/
#define _GNU_SOURCE 1 /* renameat2 */
#include "core/internal.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <libgen.h>
#include <signal.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

/* The old model's files in OUT (names, not paths): what the swap may
** remove.  Filled by check_output. */
typedef struct oldset {
  char **name;
  size_t n, cap;
} oldset;

static bool oldset_add(oldset *o, const char *name) {
  for (size_t i = 0; i < o->n; i++)
    if (!strcmp(o->name[i], name)) return true;
  if (o->n == o->cap) {
    char **nn = realloc(o->name, (o->cap = o->cap ? 2 * o->cap : 8) * sizeof *nn);
    if (!nn) return false;
    o->name = nn;
  }
  if (!(o->name[o->n] = strdup(name))) return false;
  o->n++;
  return true;
}

static bool oldset_has(const oldset *o, const char *name) {
  for (size_t i = 0; i < o->n; i++)
    if (!strcmp(o->name[i], name)) return true;
  return false;
}

/* The files a run writes into its temporary directory. */
static char k_cfg[] = "config.json", k_st[] = "model.safetensors";
static char *k_ours_names[2] = {k_cfg, k_st};
static const oldset k_ours = {k_ours_names, 2, 2};

static void oldset_free(oldset *o) {
  for (size_t i = 0; i < o->n; i++) free(o->name[i]);
  free(o->name);
}

/* Removes dir's files named in old and, if dir is then empty, dir; every
** other entry is moved into keep (when keep is not NULL) unless keep has
** one of that name.  False if anything is left in dir. */
static bool clear_old(const char *dir, const char *keep, const oldset *old) {
  DIR *d = opendir(dir);
  if (!d) return false;
  bool ok = true;
  struct dirent *e;
  char a[4400], b[4400];
  while ((e = readdir(d)) != NULL) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    if (snprintf(a, sizeof a, "%s/%s", dir, e->d_name) >= (int)sizeof a) { ok = false; continue; }
    if (oldset_has(old, e->d_name)) {
      if (unlink(a) != 0) ok = false;
    } else if (keep) {
      if (snprintf(b, sizeof b, "%s/%s", keep, e->d_name) >= (int)sizeof b || access(b, F_OK) == 0 || rename(a, b) != 0) ok = false;
    } else {
      ok = false;
    }
  }
  closedir(d);
  return ok && rmdir(dir) == 0;
}

/* The process's umask, read without changing it where /proc says it. */
static mode_t current_umask(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  unsigned u;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "Umask: %o", &u) == 1) { fclose(f); return (mode_t)u; }
  if (f) fclose(f);
  const mode_t m = umask(022); /* older kernels: read by setting (a race only with another umask call) */
  umask(m);
  return m;
}

/* The JSON text a rule set was parsed from (src/moe/rules.c); a
** safetensors file with a __metadata__ (src/io/safetensors.c). */
const char *moe8__rules_text(const moe8_rules *rs);
moe8_status moe8__st_write_meta(const char *path, const moe8_tensor_view *t, size_t count, const char *const *kv, size_t nkv);

typedef struct job {
  const moe8_quantize_options *opt;
} job;

static void say(const job *j, const char *fmt, ...) MOE8__PRINTF(2, 3);
static void say(const job *j, const char *fmt, ...) {
  if (!j->opt->progress) return;
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  j->opt->progress(j->opt->progress_ctx, line);
}

/* The finished model in tmp becomes real (OUT resolved; tmp is beside it).
** On failure tmp is removed and real is as it was, or the message says
** where each model is. */
static moe8_status swap_in(const job *j, char *tmp, size_t cap, const char *outdir, const char *real, const oldset *old) {
  struct stat sb;
  if (lstat(real, &sb) != 0) {
    if (rename(tmp, real) == 0) return MOE8_OK;
    const int er = errno;
    clear_old(tmp, NULL, &k_ours);
    return moe8__fail(MOE8_ERR_IO, "quantize: cannot move the new model to %s: %s (%s does not exist; nothing was written)", outdir,
                      strerror(er), real);
  }
  /* Test hook (docs/testing.md): MOE8_TEST_QUANTIZE_FAIL=swap takes the
  ** two-rename path and fails its second rename. */
  const char *hook = getenv("MOE8_TEST_QUANTIZE_FAIL");
  const bool fail_swap = hook && !strcmp(hook, "swap");
  /* One atomic exchange where the file system has it, else two renames. */
  if (fail_swap || renameat2(AT_FDCWD, tmp, AT_FDCWD, real, RENAME_EXCHANGE) != 0) {
    char aside[4400];
    snprintf(aside, sizeof aside, "%s.moe8-old-%ld", real, (long)getpid());
    if (rename(real, aside) != 0) {
      const int er = errno;
      clear_old(tmp, NULL, &k_ours);
      return moe8__fail(MOE8_ERR_IO, "quantize: cannot swap the new model into %s: %s; %s is unchanged", outdir, strerror(er), real);
    }
    if (fail_swap || rename(tmp, real) != 0) {
      const int er = fail_swap ? EXDEV : errno;
      if (rename(aside, real) == 0) {
        clear_old(tmp, NULL, &k_ours);
        return moe8__fail(MOE8_ERR_IO, "quantize: cannot move the new model into %s: %s; the old model is back in %s, unchanged", outdir,
                          strerror(er), real);
      }
      return moe8__fail(MOE8_ERR_IO, "quantize: cannot move the new model into %s: %s, nor the old one back: the old model is in %s, "
                        "the new one (complete) in %s; %s does not exist now", outdir, strerror(er), aside, tmp, real);
    }
    if (snprintf(tmp, cap, "%s", aside) >= (int)cap) return moe8__fail(MOE8_ERR_INTERNAL, "quantize: %s: path too long", aside);
    /* the old model is now there */
  }
  /* tmp now holds the old model: drop its model files, keep the rest. */
  if (!clear_old(tmp, real, old)) say(j, "note: the new model is in %s; some files of the old one are left in %s", outdir, tmp);
  return MOE8_OK;
}

typedef struct outset {
  moe8_tensor_view *t;
  char            **names;
  void            **owned;
  size_t            n, cap;
} outset;

/* Takes ownership of owned (freed with the set, also on failure). */
static moe8_status add(outset *o, const char *name, moe8_file_dtype dt, int ndim, const int64_t *shape, const void *data,
                       size_t nbytes, void *owned) {
  if (o->n == o->cap) {
    const size_t cap = o->cap ? o->cap * 2 : 64;
    moe8_tensor_view *t = realloc(o->t, cap * sizeof *t);
    if (t) o->t = t;
    char **names = t ? realloc(o->names, cap * sizeof *names) : NULL;
    if (names) o->names = names;
    void **ow = names ? realloc(o->owned, cap * sizeof *ow) : NULL;
    if (ow) o->owned = ow;
    if (!ow) { free(owned); return moe8__fail(MOE8_ERR_NOMEM, "quantize: out of memory"); }
    o->cap = cap;
  }
  char *nm = strdup(name);
  if (!nm) { free(owned); return moe8__fail(MOE8_ERR_NOMEM, "quantize: out of memory"); }
  o->names[o->n] = nm;
  o->owned[o->n] = owned;
  o->t[o->n] = (moe8_tensor_view){nm, dt, ndim, {0}, data, nbytes, 0};
  for (int i = 0; i < ndim; i++) o->t[o->n].shape[i] = shape[i];
  o->n++;
  return MOE8_OK;
}

static void outset_free(outset *o) {
  for (size_t i = 0; i < o->n; i++) { free(o->names[i]); free(o->owned[i]); }
  free(o->t); free(o->names); free(o->owned);
}

/* Is this tensor an expert weight (or scale) of some layer? */
static bool is_expert_tensor(const char *name, bool deepseek) {
  return strstr(name, ".experts.") != NULL || (deepseek && (strstr(name, ".shared_experts.") || strstr(name, ".shared_expert.")));
}

static bool same_file(const char *a, const char *b) {
  struct stat sa, sb;
  return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

/* Never over the input, and not over another model unless forced; OUT
** resolved into real (a symlink to its target; a new OUT beside its
** parent's real path), the old model's files listed in old. */
static moe8_status check_output(const char *in, const char *outdir, bool force, char *real, size_t rcap, oldset *old) {
  if (same_file(in, outdir)) return moe8__fail(MOE8_ERR_INVALID_ARG, "quantize: the output directory %s is the input model %s: refused", outdir, in);
  char a1[4400], a2[4400];
  const char *files[3] = {"config.json", "model.safetensors", "model.safetensors.index.json"};
  for (int k = 0; k < 3; k++) {
    snprintf(a1, sizeof a1, "%s/%s", outdir, files[k]);
    snprintf(a2, sizeof a2, "%s/%s", in, files[k]);
    if (same_file(a1, a2)) return moe8__fail(MOE8_ERR_INVALID_ARG, "quantize: %s is the input's %s: refused", a1, a2);
    if (!force && access(a1, F_OK) == 0)
      return moe8__fail(MOE8_ERR_INVALID_ARG, "quantize: %s already holds a %smodel (%s): refused unless forced (--force, force=True)", outdir,
                        k == 2 ? "sharded " : "", a1);
  }
  struct stat ob, lb;
  if (lstat(outdir, &lb) == 0) {
    if (stat(outdir, &ob) != 0)
      return moe8__fail(MOE8_ERR_INVALID_ARG, "quantize: %s is a symbolic link to a path that does not exist: refused", outdir);
    if (!S_ISDIR(ob.st_mode)) return moe8__fail(MOE8_ERR_INVALID_ARG, "quantize: %s exists and is not a directory", outdir);
    if (!realpath(outdir, real)) return moe8__fail(MOE8_ERR_IO, "quantize: cannot resolve %s: %s", outdir, strerror(errno));
  } else {
    /* A new directory: its parent's real path and its own name. */
    char c1[4096], c2[4096], pr[4096];
    snprintf(c1, sizeof c1, "%s", outdir);
    snprintf(c2, sizeof c2, "%s", outdir);
    size_t n = strlen(c1);
    while (n > 1 && c1[n - 1] == '/') { n--; c1[n] = c2[n] = '\0'; }
    const char *base = basename(c2), *parent = dirname(c1);
    if (!strcmp(base, ".") || !strcmp(base, "..") || !strcmp(base, "/"))
      return moe8__fail(MOE8_ERR_INVALID_ARG, "quantize: %s is not a directory name", outdir);
    if (!realpath(parent, pr)) return moe8__fail(MOE8_ERR_IO, "quantize: cannot create %s: its directory %s: %s", outdir, parent, strerror(errno));
    if (snprintf(real, rcap, "%s%s%s", pr, strcmp(pr, "/") ? "/" : "", base) >= (int)rcap)
      return moe8__fail(MOE8_ERR_INVALID_ARG, "quantize: %s: path too long", outdir);
    return MOE8_OK;
  }
  /* The old model's files: the ones the new model replaces, the index and
  ** the shards it names.  Any other *.safetensors would load as a shard of
  ** the new model: refused, never removed. */
  bool ok = true;
  for (int k = 0; k < 3; k++) ok &= oldset_add(old, files[k]);
  snprintf(a1, sizeof a1, "%s/model.safetensors.index.json", real);
  if (ok && access(a1, F_OK) == 0) {
    char *txt = NULL;
    size_t n = 0;
    moe8_status st = moe8__read_small(a1, (size_t)64 << 20, &txt, &n);
    if (st != MOE8_OK) return st;
    cJSON *root = cJSON_ParseWithLength(txt, n);
    free(txt);
    const cJSON *wm = root ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL;
    if (!cJSON_IsObject(wm)) {
      cJSON_Delete(root);
      return moe8__fail(MOE8_ERR_PARSE, "quantize: %s has no weight_map object: cannot tell the old model's shards (remove them by hand)", a1);
    }
    for (const cJSON *e = wm->child; e && ok; e = e->next)
      if (cJSON_IsString(e) && !strchr(e->valuestring, '/') && strcmp(e->valuestring, "..") && strcmp(e->valuestring, "."))
        ok &= oldset_add(old, e->valuestring);
    cJSON_Delete(root);
  }
  if (!ok) return moe8__fail(MOE8_ERR_NOMEM, "quantize: out of memory");
  DIR *d = opendir(real);
  if (!d) return moe8__fail(MOE8_ERR_IO, "quantize: cannot read the directory %s: %s", outdir, strerror(errno));
  moe8_status st = MOE8_OK;
  for (struct dirent *e; st == MOE8_OK && (e = readdir(d));) {
    const size_t l = strlen(e->d_name);
    if (l > 12 && !strcmp(e->d_name + l - 12, ".safetensors") && !oldset_has(old, e->d_name))
      st = moe8__fail(MOE8_ERR_INVALID_ARG, "quantize: %s/%s is not a file of the model in %s (not model.safetensors, nor a shard its index "
                      "names): moe8 would load it as a shard of the new model, and does not delete files it did not write; move it "
                      "out of %s first", outdir, e->d_name, outdir, outdir);
  }
  closedir(d);
  return st;
}

/* A process that still runs (or that this one may not signal). */
static bool alive(long pid) { return pid > 0 && (kill((pid_t)pid, 0) == 0 || errno == EPERM); }

/* Temporary directories of earlier runs on the same target: a
** "<base>.moe8-new-<pid>-*" whose process is gone holds at most the new
** model it wrote (then it is removed) or, when it was killed inside the
** swap, the old model's files and the user's (then it is named, never
** removed); a "<base>.moe8-old-<pid>" of a gone process is named.  A live
** process's directories are another run's, left alone. */
static void stale_scan(const job *j, const char *real) {
  char c1[4096], c2[4096];
  snprintf(c1, sizeof c1, "%s", real);
  snprintf(c2, sizeof c2, "%s", real);
  const char *parent = dirname(c1), *base = basename(c2);
  char pfx_new[4200], pfx_old[4200], p[8400];
  snprintf(pfx_new, sizeof pfx_new, "%s.moe8-new-", base);
  snprintf(pfx_old, sizeof pfx_old, "%s.moe8-old-", base);
  const size_t ln = strlen(pfx_new), lo = strlen(pfx_old);
  DIR *d = opendir(parent);
  if (!d) return;
  for (struct dirent *e; (e = readdir(d));) {
    const bool isnew = !strncmp(e->d_name, pfx_new, ln), isold = !strncmp(e->d_name, pfx_old, lo);
    if (!isnew && !isold) continue;
    char *end;
    const long pid = strtol(e->d_name + (isnew ? ln : lo), &end, 10);
    const bool named = end != e->d_name + (isnew ? ln : lo) && (isnew ? *end == '-' : *end == '\0');
    if (named && (alive(pid) || pid == (long)getpid())) continue;
    snprintf(p, sizeof p, "%s/%s", parent, e->d_name);
    struct stat sb;
    if (lstat(p, &sb) != 0 || !S_ISDIR(sb.st_mode)) continue;
    if (isnew && named && clear_old(p, NULL, &k_ours)) {
      say(j, "note: removed %s, the unfinished output of an interrupted run (process %ld)", p, pid);
      continue;
    }
    say(j, "note: %s was left by an interrupted run%s and holds files moe8 does not remove: %s; look through it, then remove it", p,
        named ? "" : " (or one still running)", isnew ? "the old model's and others it was moving back" : "the model it had moved aside");
  }
  closedir(d);
}

/* The moe8 format's four tensors of one layer. */
static moe8_status layer_moe8(const job *j, outset *o, moe8_layer *L, const char *p, int64_t E, int64_t D, int64_t F, int *packed_layout) {
  moe8_prepared pr;
  moe8_status st = moe8_layer_prepare(L);
  if (st == MOE8_OK) st = moe8_layer_prepared(L, &pr);
  if (st != MOE8_OK) return st;
  const int64_t nbg = pr.tile ? (D + pr.tile - 1) / pr.tile : 1, nbd = pr.tile ? (F + pr.tile - 1) / pr.tile : 1;
  /* gate|up [E, D, 2F], or an ungated layer's up alone [E, D, F] (under the same names) */
  const int64_t N1 = moe8_layer_weight_read(L, MOE8_W_GATE, NULL) ? 2 * F : F;
  const moe8_file_dtype fq = pr.dtype == MOE8_DTYPE_I8 ? MOE8_FDT_I8 : MOE8_FDT_F8_E4M3;
  /* The kernels' packed layout when the K blocks allow (a run maps it in
  ** place), else the plain [E, K, N] codes. */
  const int64_t per = pr.dtype == MOE8_DTYPE_I8 ? 4 : 2;
  const bool pk = (!pr.tile || pr.tile % per == 0);
  const size_t pgu = moe8_gmm_packed_size(pr.dtype, 1, D, N1), pdn = moe8_gmm_packed_size(pr.dtype, 1, F, D);
  const int64_t s1[3] = {E, D, N1}, s2[4] = {E, nbg, 1, N1}, s3[3] = {E, F, D}, s4[4] = {E, nbd, 1, D};
  const int64_t p1[2] = {E, (int64_t)pgu}, p3[2] = {E, (int64_t)pdn};
  const size_t b1 = pk ? (size_t)E * pgu : (size_t)(E * D * N1), b2 = (size_t)(E * nbg * N1) * 4;
  const size_t b3 = pk ? (size_t)E * pdn : (size_t)(E * F * D), b4 = (size_t)(E * nbd * D) * 4;
  void *c1 = malloc(b1), *c2 = malloc(b2), *c3 = malloc(b3), *c4 = malloc(b4);
  if (!c1 || !c2 || !c3 || !c4) { free(c1); free(c2); free(c3); free(c4); return moe8__fail(MOE8_ERR_NOMEM, "quantize: out of memory"); }
  if (pk) {
    st = moe8_gmm_pack_rhs(pr.dtype, pr.w_gate_up, E, D, N1, c1);
    if (st == MOE8_OK) st = moe8_gmm_pack_rhs(pr.dtype, pr.w_down, E, F, D, c3);
    if (st != MOE8_OK) { free(c1); free(c2); free(c3); free(c4); return st; }
  } else {
    memcpy(c1, pr.w_gate_up, b1); memcpy(c3, pr.w_down, b3);
  }
  *packed_layout = pk;
  memcpy(c2, pr.s_gate_up, b2); memcpy(c4, pr.s_down, b4);
  char n[256];
  const char *qn = pk ? "qweight_packed" : "qweight";
  snprintf(n, sizeof n, "%sexperts.gate_up_proj.%s", p, qn);
  if ((st = add(o, n, fq, pk ? 2 : 3, pk ? p1 : s1, c1, b1, c1)) != MOE8_OK) { free(c2); free(c3); free(c4); return st; }
  say(j, "quantize %s [%lld, %lld, %lld] -> %s%s", n, (long long)E, (long long)D, (long long)N1, moe8_file_dtype_name(fq), pk ? " (packed)" : "");
  snprintf(n, sizeof n, "%sexperts.gate_up_proj.scale", p);
  if ((st = add(o, n, MOE8_FDT_F32, 4, s2, c2, b2, c2)) != MOE8_OK) { free(c3); free(c4); return st; }
  snprintf(n, sizeof n, "%sexperts.down_proj.%s", p, qn);
  if ((st = add(o, n, fq, pk ? 2 : 3, pk ? p3 : s3, c3, b3, c3)) != MOE8_OK) { free(c4); return st; }
  say(j, "quantize %s [%lld, %lld, %lld] -> %s", n, (long long)E, (long long)F, (long long)D, moe8_file_dtype_name(fq));
  snprintf(n, sizeof n, "%sexperts.down_proj.scale", p);
  return add(o, n, MOE8_FDT_F32, 4, s4, c4, b4, c4);
}

/* Doge's product-key tables (docs/files.md), each [E, D]: the keys
** down_embed and the values up_embed as the layer holds them under the
** rule (an inference load: the codes the runtime quantizer makes at load,
** per expert row): P down_embed.qweight [E, D] F8_E4M3 or I8 (row e the
** codes of row e) with P down_embed.scale [E, nb, 1, 1] F32 (nb =
** ceil(D / tile), 1 per channel: the [E, nb, 1, N] layout, N = 1), the
** same for up_embed.  Never packed (pkeys.c reads the rows as codes).  The
** dense SwiGLU, the layer's shared expert, is copied (quantized at load,
** as under the rule). */
static moe8_status layer_pk(const job *j, outset *o, moe8_layer *L, const char *p, int64_t E, int64_t D) {
  moe8_prepared pr;
  moe8_status st = moe8_layer_prepared(L, &pr);
  if (st != MOE8_OK) return st;
  if (pr.dtype != MOE8_DTYPE_F8E4M3 && pr.dtype != MOE8_DTYPE_I8)
    return moe8__fail(MOE8_ERR_INTERNAL, "quantize: %s: the product-key tables were not quantized by the rule (%s)", p,
                      moe8_dtype_info(pr.dtype)->name);
  const int64_t nb = pr.tile ? (D + pr.tile - 1) / pr.tile : 1;
  const moe8_file_dtype fq = pr.dtype == MOE8_DTYPE_I8 ? MOE8_FDT_I8 : MOE8_FDT_F8_E4M3;
  /* the layer's keys are its W_UP [E, D, 1], its values W_DOWN [E, 1, D]
  ** quantized as [E, D, 1]: each expert's D codes in row order either way */
  const void *q[2] = {pr.w_gate_up, pr.w_down};
  const float *s[2] = {pr.s_gate_up, pr.s_down};
  static const char *const tn[2] = {"down_embed", "up_embed"};
  const int64_t qs[2] = {E, D}, ss[4] = {E, nb, 1, 1};
  const size_t bq = (size_t)(E * D), bs = (size_t)(E * nb) * 4;
  char n[256];
  for (int i = 0; i < 2 && st == MOE8_OK; i++) {
    void *cq = malloc(bq), *cs = malloc(bs);
    if (!cq || !cs) { free(cq); free(cs); return moe8__fail(MOE8_ERR_NOMEM, "quantize: out of memory"); }
    memcpy(cq, q[i], bq);
    memcpy(cs, s[i], bs);
    snprintf(n, sizeof n, "%s%s.qweight", p, tn[i]);
    if ((st = add(o, n, fq, 2, qs, cq, bq, cq)) != MOE8_OK) { free(cs); return st; }
    say(j, "quantize %s%s.weight [%lld, %lld] -> %s per expert row", p, tn[i], (long long)E, (long long)D, moe8_file_dtype_name(fq));
    snprintf(n, sizeof n, "%s%s.scale", p, tn[i]);
    st = add(o, n, MOE8_FDT_F32, 4, ss, cs, bs, cs);
  }
  return st;
}

/* moe8's MXFP4 experts (weight_qtype mxfp4): per expert the OCP MXFP4 of
** gate|up [D, 2F] and down [F, D] from the f32 masters, the quantizer the
** layer runs at load (so a run of the file gives the bytes of a run of the
** input under the rule): P experts.gate_up_proj_blocks [E, 2F, D/32, 16]
** (gate rows, then up rows) and _scales [E, 2F, D/32]; down_proj the same
** with [E, D, F/32, ...].  The shared expert stays as the input holds it
** (the layer quantizes it at load, as under the rule). */
static moe8_status layer_mx4(const job *j, outset *o, moe8_layer *L, const char *p, int64_t E, int64_t D, int64_t F, bool gptoss) {
  const int64_t Fs = moe8_layer_get_config(L)->shared_ffn;
  if (D % 32 || F % 32 || Fs % 32)
    return moe8__fail(MOE8_ERR_SHAPE, "quantize: %s: weight_qtype mxfp4 needs hidden (%lld), ffn (%lld) and the shared expert's (%lld) to be "
                      "multiples of 32", p, (long long)D, (long long)F, (long long)Fs);
  const float *wg = moe8_layer_weight_read(L, MOE8_W_GATE, NULL), *wu = moe8_layer_weight_read(L, MOE8_W_UP, NULL),
              *wd = moe8_layer_weight_read(L, MOE8_W_DOWN, NULL);
  const int64_t N1 = wg ? 2 * F : F; /* an ungated layer's up alone */
  const size_t bg = (size_t)(E * N1 * D / 2), sg = (size_t)(E * N1 * (D / 32)), bd = (size_t)(E * D * F / 2), sd = (size_t)(E * D * (F / 32));
  uint8_t *b1 = malloc(bg), *s1 = malloc(sg), *b2 = malloc(bd), *s2 = malloc(sd);
  float *gu = malloc(sizeof(float) * (size_t)(D * N1));
  if (!b1 || !s1 || !b2 || !s2 || !gu) {
    free(b1); free(s1); free(b2); free(s2); free(gu);
    return moe8__fail(MOE8_ERR_NOMEM, "quantize: out of memory");
  }
  for (int64_t e = 0; e < E; e++) {
    for (int64_t d = 0; d < D; d++) {
      if (gptoss) /* GPT-OSS's own layout: gate and up in alternate columns */
        for (int64_t f = 0; f < F; f++) {
          gu[d * 2 * F + 2 * f] = wg[(e * D + d) * F + f];
          gu[d * 2 * F + 2 * f + 1] = wu[(e * D + d) * F + f];
        }
      else {
        if (wg) memcpy(gu + d * N1, wg + (e * D + d) * F, sizeof(float) * (size_t)F);
        memcpy(gu + d * N1 + (wg ? F : 0), wu + (e * D + d) * F, sizeof(float) * (size_t)F);
      }
    }
    moe8__mx4_quantize(gu, D, N1, b1 + (size_t)e * (bg / (size_t)E), s1 + (size_t)e * (sg / (size_t)E));
    moe8__mx4_quantize(wd + e * F * D, F, D, b2 + (size_t)e * (bd / (size_t)E), s2 + (size_t)e * (sd / (size_t)E));
  }
  free(gu);
  const int64_t g1[4] = {E, N1, D / 32, 16}, g2[3] = {E, N1, D / 32}, d1[4] = {E, D, F / 32, 16}, d2[3] = {E, D, F / 32};
  char n[256];
  moe8_status st;
  snprintf(n, sizeof n, "%sexperts.gate_up_proj_blocks", p);
  if ((st = add(o, n, MOE8_FDT_U8, 4, g1, b1, bg, b1)) != MOE8_OK) { free(s1); free(b2); free(s2); return st; }
  say(j, "quantize %sexperts.gate_up_proj [%lld, %lld, %lld] -> MXFP4 blocks and E8M0 scales", p, (long long)E, (long long)D, (long long)N1);
  snprintf(n, sizeof n, "%sexperts.gate_up_proj_scales", p);
  if ((st = add(o, n, MOE8_FDT_U8, 3, g2, s1, sg, s1)) != MOE8_OK) { free(b2); free(s2); return st; }
  snprintf(n, sizeof n, "%sexperts.down_proj_blocks", p);
  if ((st = add(o, n, MOE8_FDT_U8, 4, d1, b2, bd, b2)) != MOE8_OK) { free(s2); return st; }
  say(j, "quantize %sexperts.down_proj [%lld, %lld, %lld] -> MXFP4 blocks and E8M0 scales", p, (long long)E, (long long)F, (long long)D);
  snprintf(n, sizeof n, "%sexperts.down_proj_scales", p);
  return add(o, n, MOE8_FDT_U8, 3, d2, s2, sd, s2);
}

/* DeepSeek's format: every expert weight (the shared expert's too) [N, K]
** with 128×128 block scales. */
static moe8_status layer_deepseek(const job *j, outset *o, moe8_layer *L, const moe8_hf_config *hc, const char *p) {
  const int64_t E = hc->layer.num_experts, D = hc->layer.hidden, F = hc->layer.ffn, Fs = hc->layer.shared_ffn;
  const moe8_quant_spec spec = {.qtype = MOE8_DTYPE_F8E4M3, .gran = MOE8_GRAN_BLOCK2D, .tile = 128, .block_n = 128, .clip = 1.0f};
  const bool mx = hc->arch == MOE8_ARCH_MIXTRAL;
  const char *proj[3] = {mx ? "w1" : "gate_proj", mx ? "w3" : "up_proj", mx ? "w2" : "down_proj"};
  if (hc->encdec) { proj[1] = hc->nllb ? "fc1" : "wi"; proj[2] = hc->nllb ? "fc2" : "wo"; } /* experts.expert_N.wi / wo, NLLB-MoE's fc1 / fc2 */
  const char *xd = hc->encdec ? "experts.expert_" : "experts.";
  const float *mw[3] = {moe8_layer_weight_read(L, MOE8_W_GATE, NULL), moe8_layer_weight_read(L, MOE8_W_UP, NULL),
                        moe8_layer_weight_read(L, MOE8_W_DOWN, NULL)};
  const float *sw[3] = {moe8_layer_weight_read(L, MOE8_W_SHARED_GATE, NULL), moe8_layer_weight_read(L, MOE8_W_SHARED_UP, NULL),
                        moe8_layer_weight_read(L, MOE8_W_SHARED_DOWN, NULL)};
  const char *sname = hc->arch == MOE8_ARCH_DEEPSEEK_V3 || hc->arch == MOE8_ARCH_DEEPSEEK_V2 ? "shared_experts" : "shared_expert";
  char n[256];
  moe8_status st = MOE8_OK;
  /* e = E is the shared expert (when the layer has one). */
  for (int64_t e = 0; e < E + (Fs > 0) && st == MOE8_OK; e++)
    for (int w = mw[0] ? 0 : 1; w < 3 && st == MOE8_OK; w++) { /* an ungated layer: up and down */
      const bool sh = e == E;
      const int64_t DE = sh || hc->layer.latent <= 0 ? D : hc->layer.latent; /* latent experts: their width */
      const int64_t FF = sh ? Fs : F, N = w == 2 ? DE : FF, K = w == 2 ? FF : DE;
      float *wt = malloc(sizeof(float) * (size_t)(N * K));
      const size_t ns = (size_t)(((N + 127) / 128) * ((K + 127) / 128));
      void *q = malloc((size_t)(N * K)), *s = malloc(ns * 4);
      if (!wt || !q || !s) { free(wt); free(q); free(s); return moe8__fail(MOE8_ERR_NOMEM, "quantize: out of memory"); }
      const float *src = sh ? sw[w] : mw[w] + e * N * K; /* master [K, N] */
      for (int64_t nn = 0; nn < N; nn++)
        for (int64_t k = 0; k < K; k++) wt[nn * K + k] = src[k * N + nn];
      st = moe8_quantize(&spec, wt, 1, N, K, q, s, NULL);
      free(wt);
      if (st != MOE8_OK) { free(q); free(s); return st; }
      const int64_t qs[2] = {N, K}, ss[2] = {(N + 127) / 128, (K + 127) / 128};
      if (sh) snprintf(n, sizeof n, "%s%s.%s.weight", p, sname, proj[w]);
      else snprintf(n, sizeof n, "%s%s%lld.%s.weight", p, xd, (long long)e, proj[w]);
      if ((st = add(o, n, MOE8_FDT_F8_E4M3, 2, qs, q, (size_t)(N * K), q)) != MOE8_OK) { free(s); return st; }
      say(j, "quantize %s [%lld, %lld] -> F8_E4M3 + weight_scale_inv [%lld, %lld]", n, (long long)N, (long long)K, (long long)ss[0],
          (long long)ss[1]);
      if (sh) snprintf(n, sizeof n, "%s%s.%s.weight_scale_inv", p, sname, proj[w]);
      else snprintf(n, sizeof n, "%s%s%lld.%s.weight_scale_inv", p, xd, (long long)e, proj[w]);
      st = add(o, n, MOE8_FDT_F32, 2, ss, s, ns * 4, s);
    }
  return st;
}

/* The input's config.json with the new quantization recorded, into tmp. */
static moe8_status write_config(const char *in, const char *tmp, bool deepseek, int quantized_layers, moe8_dtype qtype, int64_t qtile,
                                int packed_layout, bool mx4, bool gptoss, const moe8_rules *rules) {
  char path[4400];
  snprintf(path, sizeof path, "%s/config.json", in);
  char *txt = NULL;
  size_t n = 0;
  moe8_status st = moe8__read_small(path, (size_t)16 << 20, &txt, &n);
  if (st != MOE8_OK) return st;
  cJSON *root = moe8__json_parse_keeping_numbers(txt, n); /* 7.0 stays 7.0 */
  free(txt);
  if (!root) return moe8__fail(MOE8_ERR_PARSE, "quantize: %s is not JSON", path);
  if (!quantized_layers && !deepseek) cJSON_DeleteItemFromObjectCaseSensitive(root, "moe8_quantization");
  if (quantized_layers) {
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
    } else if (mx4 && gptoss) {
      /* GPT-OSS's own MXFP4 checkpoint, as its released files are (transformers loads it too) */
      cJSON *q = cJSON_AddObjectToObject(root, "quantization_config");
      cJSON_AddStringToObject(q, "quant_method", "mxfp4");
      cJSON *nc = cJSON_AddArrayToObject(q, "modules_to_not_convert");
      static const char *const keep[4] = {"model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"};
      for (int i = 0; i < 4; i++) cJSON_AddItemToArray(nc, cJSON_CreateString(keep[i]));
    } else if (mx4) {
      cJSON *q = cJSON_AddObjectToObject(root, "moe8_quantization");
      cJSON_AddStringToObject(q, "weight_qtype", "mxfp4");
      cJSON_AddNumberToObject(q, "tile_size", 32);
      cJSON_AddStringToObject(q, "scale_layout", "E8M0 [E, N, K/32]");
      cJSON_AddNumberToObject(q, "packed_layout", 0);
    } else {
      cJSON *q = cJSON_AddObjectToObject(root, "moe8_quantization");
      cJSON_AddStringToObject(q, "weight_qtype", moe8_dtype_info(qtype)->name);
      cJSON_AddNumberToObject(q, "tile_size", (double)qtile);
      cJSON_AddStringToObject(q, "scale_layout", "[E, nb, 1, N]");
      cJSON_AddNumberToObject(q, "packed_layout", packed_layout);
    }
  }
  /* moe8's file records the rules it was made under (the activations, the
  ** sort's quantization and the rest), so a run of it without rules is a
  ** run of the input with them. */
  if (!deepseek) {
    cJSON *q = cJSON_GetObjectItemCaseSensitive(root, "moe8_quantization");
    if (!q) q = cJSON_AddObjectToObject(root, "moe8_quantization");
    const char *rt = moe8__rules_text(rules);
    cJSON *r = rt ? cJSON_Parse(rt) : NULL;
    if (!q || !r || !cJSON_AddItemToObject(q, "rules", r)) {
      cJSON_Delete(r);
      cJSON_Delete(root);
      return moe8__fail(MOE8_ERR_NOMEM, "quantize: cannot record the rules in config.json (out of memory)");
    }
  }
  char *out = cJSON_Print(root);
  cJSON_Delete(root);
  if (!out) return moe8__fail(MOE8_ERR_NOMEM, "quantize: out of memory");
  snprintf(path, sizeof path, "%s/config.json", tmp);
  const void *parts[2] = {out, "\n"};
  const size_t lens[2] = {strlen(out), 1};
  st = moe8_file_write_atomic(path, parts, lens, 2);
  free(out);
  return st;
}

moe8_status moe8_model_quantize(const char *in, const char *outdir, const moe8_rules *rules, const moe8_quantize_options *options) {
  const moe8_quantize_options dflt = {sizeof dflt, MOE8_QFORMAT_MOE8, false, NULL, NULL};
  if (!in || !outdir || !rules) return moe8__fail(MOE8_ERR_INVALID_ARG, "quantize: NULL argument (input, output and rules are needed)");
  if (!*in || !*outdir) return moe8__fail(MOE8_ERR_INVALID_ARG, "quantize: an empty directory name");
  if (options && options->struct_size != sizeof *options)
    return moe8__fail(MOE8_ERR_INVALID_ARG, "quantize: options.struct_size is %zu, this library's is %zu", options->struct_size, sizeof *options);
  const moe8_quantize_options *opt = options ? options : &dflt;
  if (opt->format != MOE8_QFORMAT_MOE8 && opt->format != MOE8_QFORMAT_DEEPSEEK)
    return moe8__fail(MOE8_ERR_INVALID_ARG, "quantize: format %d is not a format (moe8 0, deepseek 1)", (int)opt->format);
  const job jb = {opt}, *j = &jb;
  const bool deepseek = opt->format == MOE8_QFORMAT_DEEPSEEK;
  char real[4096];
  oldset old = {0};
  moe8_status st = check_output(in, outdir, opt->force, real, sizeof real, &old);
  moe8_model *m = NULL;
  if (st == MOE8_OK) st = moe8_model_open(in, &m);
  if (st != MOE8_OK) { oldset_free(&old); return st; }
  const moe8_hf_config *hc = moe8_model_config(m);
  const bool gptoss = hc->arch == MOE8_ARCH_GPT_OSS;
  /* the routed experts' width: latent experts' (their projections are copied as they are) */
  const int64_t E = hc->layer.num_experts, D = hc->layer.latent > 0 ? hc->layer.latent : hc->layer.hidden, F = hc->layer.ffn;
  outset o = {0};
  int quantized_layers = 0, packed_layout = 0, mx4_layers = 0;
  int64_t qtile = 0;
  moe8_dtype qtype = MOE8_DTYPE_NONE;
  /* Which layers get quantized, and their new tensors. */
  unsigned char *replace = calloc((size_t)hc->num_layers + 1, 1);
  if (!replace) st = moe8__fail(MOE8_ERR_NOMEM, "quantize: out of memory");
  /* MXFP4 is computed from the f32 masters: those layers load under no rule. */
  moe8_rules *no_rules = NULL;
  if (st == MOE8_OK) st = moe8_rules_parse("{\"rules\": []}", 13, "no rules", &no_rules);
  for (int64_t l = 0; l < hc->num_layers && st == MOE8_OK; l++) {
    char p[128], mp[160];
    moe8_model_prefix(m, l, p, sizeof p);
    snprintf(mp, sizeof mp, "%sexperts", p);
    const moe8_rule *r = moe8_rules_match(rules, mp);
    if (moe8_hf_config_check_moe_layer(hc, l) != MOE8_OK) {
      moe8_clear_error();
      say(j, "layer %lld: a dense MLP layer, copied", (long long)l);
      continue;
    }
    /* GPT-OSS's own MXFP4 (a released checkpoint) is an input: kept under
    ** an mxfp4 rule, decoded exactly and quantized under the others. */
    const bool file_mx4 = gptoss && !strcmp(moe8_model_format(m, l), "mxfp4 (E2M1 values, E8M0 scales per 32 along K)");
    if (!file_mx4 && strstr(moe8_model_format(m, l), "unquantized") == NULL) {
      st = moe8__fail(MOE8_ERR_INVALID_ARG, "quantize: %s: layer %lld is already quantized (%s)", in, (long long)l, moe8_model_format(m, l));
      break;
    }
    const bool mx4 = r && r->weight_mxfp4, codes = r && (r->weight_qtype == MOE8_DTYPE_F8E4M3 || r->weight_qtype == MOE8_DTYPE_I8);
    /* Doge's product-key tables: moe8's FP8 or int8 codes per expert row
    ** (layer_pk).  Not MXFP4: the layer does not run its single-neuron
    ** experts as MXFP4 (a rule is refused at load too); not DeepSeek's
    ** format, whose 128 x 128 blocks of per-expert Linear weights are
    ** not the tables' per-row scales. */
    if (hc->layer.product_keys && (mx4 || (codes && deepseek))) {
      st = moe8__fail(MOE8_ERR_UNSUPPORTED, "quantize: %s: layer %lld has product-key experts (Doge's down_embed / up_embed tables): %s", in,
                      (long long)l, mx4 ? "weight_qtype mxfp4 is not implemented for them (the layer's experts are single neurons, "
                                          "never MXFP4 blocks; moe8 run --rules refuses it too): use float8_e4m3fn or int8"
                                        : "the deepseek format holds per-expert Linear weights in 128 x 128 blocks, not the tables' "
                                          "per-row scales: use --format moe8");
      break;
    }
    if (!mx4 && !codes) {
      say(j, "layer %lld: %s: weights left as they are", (long long)l,
          !r ? "no rule matches" : r->weight_qtype == MOE8_DTYPE_NONE ? "the rule has no weight_qtype"
                                                                      : "notice: weight_qtype is not pre-quantized (f8e4m3, int8 and mxfp4 are)");
      continue;
    }
    const char *want = mx4 ? "mxfp4" : moe8_dtype_info(r->weight_qtype)->name;
    if (deepseek && (mx4 || r->weight_qtype != MOE8_DTYPE_F8E4M3)) {
      st = moe8__fail(MOE8_ERR_INVALID_ARG, "quantize: the deepseek format stores F8_E4M3 only; the rule for %s asks for %s", mp, want);
      break;
    }
    if (quantized_layers && (mx4_layers > 0) != mx4) {
      st = moe8__fail(MOE8_ERR_INVALID_ARG, "quantize: the rules ask for %s on %s and %s on an earlier layer: a moe8 file holds one format",
                      want, mp, mx4 ? "another weight_qtype" : "mxfp4");
      break;
    }
    if (file_mx4 && mx4) {
      say(j, "layer %lld: %s: MXFP4 kept as the file holds it", (long long)l, mp);
      quantized_layers++;
      mx4_layers++;
      continue;
    }
    moe8_layer *L = NULL;
    /* MXFP4 from the f32 masters (the rule quantizes at inference loads
    ** only); product-key tables as an inference load quantizes them */
    const moe8_load_options lo = {sizeof lo, MOE8_LOAD_INFERENCE, NULL, NULL};
    if ((st = moe8_model_load_layer_ex(m, l, mx4 ? no_rules : rules, hc->layer.product_keys ? &lo : NULL, &L)) != MOE8_OK) break;
    replace[l] = 1;
    quantized_layers++;
    if (mx4) {
      mx4_layers++;
      st = layer_mx4(j, &o, L, p, E, D, F, gptoss);
    } else if (deepseek) {
      st = layer_deepseek(j, &o, L, hc, p);
    } else {
      /* One tile and one layout a file: config.json records one of each
      ** (and the loader reads every layer's scales with it). */
      int pk = 0;
      if (qtype != MOE8_DTYPE_NONE && r->tile_size != qtile)
        st = moe8__fail(MOE8_ERR_INVALID_ARG, "quantize: the rules ask for tile_size %lld on %s and %lld on an earlier layer: a moe8 file "
                        "holds one tile", (long long)r->tile_size, mp, (long long)qtile);
      if (st == MOE8_OK) st = hc->layer.product_keys ? layer_pk(j, &o, L, p, E, D) : layer_moe8(j, &o, L, p, E, D, F, &pk);
      if (st == MOE8_OK && qtype != MOE8_DTYPE_NONE && pk != packed_layout)
        st = moe8__fail(MOE8_ERR_INVALID_ARG, "quantize: %s's codes %s the kernels' packed layout and an earlier layer's %s: a moe8 file "
                        "holds one layout", mp, pk ? "take" : "do not take", pk ? "do not" : "do");
      qtype = r->weight_qtype;
      qtile = r->tile_size;
      packed_layout = pk;
    }
    moe8_layer_destroy(L);
  }
  /* Everything else is copied as it is. */
  for (size_t i = 0; i < moe8_model_tensor_count(m) && st == MOE8_OK; i++) {
    const moe8_tensor_view *t = moe8_model_tensor_at(m, i);
    long long l = -1;
    const char *root = moe8__model_root(m);
    const size_t tl = strlen(t->name);
    /* GPT-OSS's expert biases stay, and NLLB-MoE's (experts.expert_N.fc1.bias,
    ** .fc2.bias): floats beside the codes, under the names the loader reads */
    const bool bias = (gptoss && tl > 5 && !strcmp(t->name + tl - 5, "_bias")) || (hc->nllb && tl > 5 && !strcmp(t->name + tl - 5, ".bias"));
    /* Inkling's shared experts are the layer's last experts: in the codes */
    const bool scored = hc->layer.scored_shared > 0 && strstr(t->name, ".shared_experts.") != NULL;
    /* MuSE-Spark's per-expert output norm is not an expert weight: it stays */
    const bool keep = strstr(t->name, ".experts.post_expert_norm.") != NULL;
    /* Doge's tables, now codes (the dense SwiGLU, its shared expert, stays) */
    const bool table = hc->layer.product_keys && ((tl > 18 && !strcmp(t->name + tl - 18, ".down_embed.weight")) ||
                                                  (tl > 16 && !strcmp(t->name + tl - 16, ".up_embed.weight")));
    if (!bias && !keep && (scored || table || is_expert_tensor(t->name, deepseek)) && !strncmp(t->name, root, strlen(root)) &&
        sscanf(t->name + strlen(root), "%lld.", &l) == 1 && l >= 0 && l < hc->num_layers && replace[l])
      continue;
    bool mine = false; /* SwitchTransformers, NLLB-MoE: a replaced layer's experts under its own prefix (no layer root) */
    for (int64_t q = 0; hc->encdec && !bias && q < hc->num_layers && !mine; q++) {
      char pq[160];
      moe8_model_prefix(m, q, pq, sizeof pq);
      mine = replace[q] && !strncmp(t->name, pq, strlen(pq)) && is_expert_tensor(t->name, deepseek);
    }
    if (mine) continue;
    st = add(&o, t->name, t->dtype, t->ndim, t->shape, t->data, t->nbytes, NULL);
  }
  /* The new model, whole, in a directory beside OUT's target, with the
  ** mode of the directory it replaces or a plain mkdir's. */
  char path[4400], tmp[4160];
  snprintf(tmp, sizeof tmp, "%s.moe8-new-%ld-XXXXXX", real, (long)getpid());
  bool have_tmp = false;
  if (st == MOE8_OK) {
    stale_scan(j, real);
    struct stat ob;
    const mode_t mode = stat(real, &ob) == 0 ? ob.st_mode & 07777 : 0777 & ~current_umask();
    if (mkdtemp(tmp)) have_tmp = true;
    else st = moe8__fail(MOE8_ERR_IO, "quantize: cannot create %s beside the output: %s", tmp, strerror(errno));
    if (have_tmp && chmod(tmp, mode) != 0) st = moe8__fail(MOE8_ERR_IO, "quantize: cannot set the mode of %s: %s", tmp, strerror(errno));
  }
  if (st == MOE8_OK) {
    snprintf(path, sizeof path, "%s/model.safetensors", tmp);
    /* The tile is recorded beside the scales too: config.json's alone
    ** could be edited to another tile of the same block count. */
    char tile_txt[32];
    snprintf(tile_txt, sizeof tile_txt, "%lld", (long long)qtile);
    const char *kv[2] = {"moe8.tile_size", tile_txt};
    const bool codes = !deepseek && quantized_layers > mx4_layers;
    st = moe8__st_write_meta(path, o.t, o.n, kv, codes ? 1 : 0);
  }
  if (st == MOE8_OK) st = write_config(in, tmp, deepseek, quantized_layers, qtype, qtile, packed_layout, mx4_layers > 0, gptoss, rules);
  /* Test hook (docs/testing.md): fail after the whole new model is written. */
  const char *hook = getenv("MOE8_TEST_QUANTIZE_FAIL");
  if (st == MOE8_OK && hook && strcmp(hook, "swap") != 0)
    st = moe8__fail(MOE8_ERR_IO, "quantize: failing on purpose (MOE8_TEST_QUANTIZE_FAIL); %s is unchanged", outdir);
  if (st == MOE8_OK) st = swap_in(j, tmp, sizeof tmp, outdir, real, &old);
  else if (have_tmp) {
    char keep[1024];
    snprintf(keep, sizeof keep, "%s", moe8_last_error());
    clear_old(tmp, NULL, &k_ours);
    moe8__fail(st, "%s", keep);
  }
  if (st == MOE8_OK)
    say(j, "quantize: %d of %lld layer(s) quantized (%s format), %zu tensors -> %s", quantized_layers, (long long)hc->num_layers,
        deepseek ? "deepseek" : "moe8", o.n, outdir);
  outset_free(&o);
  oldset_free(&old);
  moe8_rules_destroy(no_rules);
  free(replace);
  moe8_model_close(m);
  return st;
}
