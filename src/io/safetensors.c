/*
** safetensors.c — the safetensors format: an 8-byte little-endian header
** length, a JSON header, then the data.
**
** Reading maps the file and validates everything before any tensor is
** handed out: the header length against the file size (and a 100 MiB cap),
** the JSON, each tensor's dtype, shape (at most 8 dims, non-negative
** integers) and data_offsets (inside the data, begin <= end, exactly
** numel · dtype size bytes, computed without overflow), and that no two
** tensors overlap.  Every error names the file and the tensor, and the
** byte offset where it applies.
**
** Limits: a header of at most 100 MiB and 200 000 tensors (counted before
** the JSON is parsed, so memory stays bounded).
**
** Writing builds the header with cJSON, pads it with spaces to a multiple
** of 8 bytes and writes it through moe8_file_write_atomic, so a failure
** never leaves a half file.
*/
#include "../core/internal.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define HEADER_CAP ((uint64_t)100 << 20)
#define MOE8_ST_MAX_TENSORS 200000

static const struct { const char *name; size_t size; } g_fdt[MOE8_FDT_COUNT] = {
  [MOE8_FDT_F32] = {"F32", 4}, [MOE8_FDT_F16] = {"F16", 2}, [MOE8_FDT_BF16] = {"BF16", 2},
  [MOE8_FDT_F8_E4M3] = {"F8_E4M3", 1}, [MOE8_FDT_F8_E5M2] = {"F8_E5M2", 1}, [MOE8_FDT_I8] = {"I8", 1},
  [MOE8_FDT_U8] = {"U8", 1}, [MOE8_FDT_I32] = {"I32", 4}, [MOE8_FDT_I64] = {"I64", 8},
};

const char *moe8_file_dtype_name(moe8_file_dtype t) { return (unsigned)t < MOE8_FDT_COUNT ? g_fdt[t].name : "?"; }
size_t moe8_file_dtype_size(moe8_file_dtype t) { return (unsigned)t < MOE8_FDT_COUNT ? g_fdt[t].size : 0; }

struct moe8_st_file {
  char             *path;
  void             *map;
  size_t            map_len;
  size_t            count;
  moe8_tensor_view *t;
  char            **names;
  char            **meta;      /* __metadata__'s string entries: key, value, key, value, ... */
  size_t            nmeta;     /* entries (pairs) */
};

void moe8_st_close(moe8_st_file *f) {
  if (!f) return;
  for (size_t i = 0; i < f->count; i++) free(f->names[i]);
  free(f->names);
  for (size_t i = 0; i < 2 * f->nmeta; i++) free(f->meta[i]);
  free(f->meta);
  free(f->t);
  if (f->map) { moe8__map_unregister(f->map); munmap(f->map, f->map_len); }
  free(f->path);
  free(f);
}

static int by_name(const void *a, const void *b) {
  return strcmp(((const moe8_tensor_view *)a)->name, ((const moe8_tensor_view *)b)->name);
}

static int by_offset(const void *a, const void *b) {
  const moe8_tensor_view *x = *(const moe8_tensor_view *const *)a, *y = *(const moe8_tensor_view *const *)b;
  return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static bool as_u64(const cJSON *v, uint64_t *out) {
  if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 9007199254740992.0 ||
      v->valuedouble != (double)(uint64_t)v->valuedouble)
    return false;
  *out = (uint64_t)v->valuedouble;
  return true;
}

static moe8_status parse_tensor(const char *file, const cJSON *e, size_t data_len, size_t base, moe8_tensor_view *t) {
  const char *n = e->string;
  if (!cJSON_IsObject(e)) return moe8__fail(MOE8_ERR_FORMAT, "%s: tensor '%s': header entry is not an object", file, n);
  const cJSON *dt = NULL, *sh = NULL, *off = NULL;
  for (const cJSON *k = e->child; k; k = k->next) {
    if (!strcmp(k->string, "dtype")) dt = k;
    else if (!strcmp(k->string, "shape")) sh = k;
    else if (!strcmp(k->string, "data_offsets")) off = k;
    else return moe8__fail(MOE8_ERR_FORMAT, "%s: tensor '%s': unknown header key '%s'", file, n, k->string);
  }
  if (!dt || !sh || !off)
    return moe8__fail(MOE8_ERR_FORMAT, "%s: tensor '%s': missing %s", file, n, !dt ? "dtype" : !sh ? "shape" : "data_offsets");
  int fdt = -1;
  if (cJSON_IsString(dt))
    for (int i = 0; i < MOE8_FDT_COUNT; i++)
      if (!strcmp(dt->valuestring, g_fdt[i].name)) fdt = i;
  if (fdt < 0)
    return moe8__fail(MOE8_ERR_FORMAT, "%s: tensor '%s': unknown dtype %s%s%s", file, n, cJSON_IsString(dt) ? "'" : "",
                      cJSON_IsString(dt) ? dt->valuestring : "(not a string)", cJSON_IsString(dt) ? "'" : "");
  t->dtype = (moe8_file_dtype)fdt;
  if (!cJSON_IsArray(sh) || cJSON_GetArraySize(sh) > MOE8_MAX_DIMS)
    return moe8__fail(MOE8_ERR_FORMAT, "%s: tensor '%s': shape must be an array of at most %d sizes", file, n, MOE8_MAX_DIMS);
  t->ndim = 0;
  uint64_t numel = 1;
  bool overflow = false;
  for (const cJSON *d = sh->child; d; d = d->next) {
    uint64_t v;
    if (!as_u64(d, &v)) return moe8__fail(MOE8_ERR_FORMAT, "%s: tensor '%s': shape has a size that is not a non-negative integer", file, n);
    t->shape[t->ndim++] = (int64_t)v;
    if (v && numel > UINT64_MAX / v) overflow = true;
    numel *= v;
  }
  uint64_t b, en;
  if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2 || !as_u64(off->child, &b) || !as_u64(off->child->next, &en))
    return moe8__fail(MOE8_ERR_FORMAT, "%s: tensor '%s': data_offsets must be [begin, end]", file, n);
  if (b > en || en > data_len)
    return moe8__fail(MOE8_ERR_FORMAT,
                      "%s: tensor '%s': data_offsets [%llu, %llu] (file bytes %llu..%llu) outside the %zu data bytes after the header",
                      file, n, (unsigned long long)b, (unsigned long long)en, (unsigned long long)(b + base),
                      (unsigned long long)(en + base), data_len);
  const uint64_t sz = g_fdt[fdt].size;
  if (overflow || numel > UINT64_MAX / sz || numel * sz != en - b)
    return moe8__fail(MOE8_ERR_FORMAT, "%s: tensor '%s': %llu bytes at file offset %llu, but %s x %s needs %s%llu", file, n,
                      (unsigned long long)(en - b), (unsigned long long)(b + base), g_fdt[fdt].name,
                      t->ndim ? "shape" : "scalar", overflow ? "more than 2^64 bytes: " : "",
                      overflow ? 0ull : (unsigned long long)(numel * sz));
  t->offset = (size_t)(b + base);
  t->nbytes = (size_t)(en - b);
  return MOE8_OK;
}

moe8_status moe8_st_parse(const void *buf, size_t len, const char *name, moe8_st_file **out) {
  if (!out || (!buf && len)) return moe8__fail(MOE8_ERR_INVALID_ARG, "safetensors: NULL argument");
  *out = NULL;
  const char *file = name ? name : "<memory>";
  const unsigned char *p = buf;
  if (len < 8) return moe8__fail(MOE8_ERR_FORMAT, "%s: %zu bytes, shorter than the 8-byte header length (truncated file?)", file, len);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = hlen << 8 | p[i];
  if (hlen > HEADER_CAP) return moe8__fail(MOE8_ERR_FORMAT, "%s: header length %llu exceeds the %llu-byte cap", file, (unsigned long long)hlen, (unsigned long long)HEADER_CAP);
  if (hlen > len - 8)
    return moe8__fail(MOE8_ERR_FORMAT, "%s: header length %llu at byte 0 runs past the end of the file (%zu bytes; truncated?)", file,
                      (unsigned long long)hlen, len);
  /* Bounded memory: the parse tree costs some hundred bytes a tensor, so
  ** the tensor count is checked before parsing (an upper bound: the
  ** "data_offsets" keys). */
  size_t ntens = 0;
  const char *hb = (const char *)p + 8, *he = hb + hlen;
  for (const char *q = hb; (q = memchr(q, 'd', (size_t)(he - q))) != NULL; q++)
    if ((size_t)(he - q) >= 12 && !memcmp(q, "data_offsets", 12)) ntens++;
  if (ntens > MOE8_ST_MAX_TENSORS)
    return moe8__fail(MOE8_ERR_FORMAT, "%s: the header lists %zu tensors, more than the %d one file may hold", file, ntens,
                      MOE8_ST_MAX_TENSORS);
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts((const char *)p + 8, (size_t)hlen, &end, false);
  if (!root) {
    const char *ep = end; /* this call's, not the library's global pointer */
    const size_t at = ep ? (size_t)(ep - ((const char *)p + 8)) + 8 : 8;
    return moe8__fail(MOE8_ERR_FORMAT, "%s: malformed JSON header near byte %zu", file, at);
  }
  moe8_status st = MOE8_OK;
  moe8_st_file *f = calloc(1, sizeof *f);
  if (!f) { cJSON_Delete(root); return moe8__fail(MOE8_ERR_NOMEM, "%s: out of memory", file); }
  f->path = strdup(file);
  if (!cJSON_IsObject(root)) { st = moe8__fail(MOE8_ERR_FORMAT, "%s: the header is not a JSON object", file); goto done; }
  size_t n = 0;
  for (const cJSON *e = root->child; e; e = e->next) n += strcmp(e->string, "__metadata__") != 0;
  f->t = calloc(n ? n : 1, sizeof *f->t);
  f->names = calloc(n ? n : 1, sizeof *f->names);
  if (!f->t || !f->names || !f->path) { st = moe8__fail(MOE8_ERR_NOMEM, "%s: out of memory", file); goto done; }
  const size_t base = (size_t)(8 + hlen), data_len = len - base;
  for (const cJSON *e = root->child; e; e = e->next) {
    if (!strcmp(e->string, "__metadata__")) {
      if (!cJSON_IsObject(e)) { st = moe8__fail(MOE8_ERR_FORMAT, "%s: __metadata__ is not an object", file); goto done; }
      /* Its string entries are kept (moe8 quantize records its tile there);
      ** others are ignored, as they were. */
      size_t nm = 0;
      for (const cJSON *m = e->child; m; m = m->next) nm += cJSON_IsString(m);
      if (nm && !(f->meta = calloc(2 * nm, sizeof *f->meta))) { st = moe8__fail(MOE8_ERR_NOMEM, "%s: out of memory", file); goto done; }
      for (const cJSON *m = e->child; m; m = m->next) {
        if (!cJSON_IsString(m)) continue;
        f->meta[2 * f->nmeta] = strdup(m->string);
        f->meta[2 * f->nmeta + 1] = strdup(m->valuestring);
        f->nmeta++;
        if (!f->meta[2 * f->nmeta - 2] || !f->meta[2 * f->nmeta - 1]) { st = moe8__fail(MOE8_ERR_NOMEM, "%s: out of memory", file); goto done; }
      }
      continue;
    }
    moe8_tensor_view *t = &f->t[f->count];
    if ((st = parse_tensor(file, e, data_len, base, t)) != MOE8_OK) goto done;
    if (!(f->names[f->count] = strdup(e->string))) { st = moe8__fail(MOE8_ERR_NOMEM, "%s: out of memory", file); goto done; }
    t->name = f->names[f->count];
    t->data = p + t->offset;
    f->count++;
  }
  /* Overlaps, in offset order. */
  {
    const moe8_tensor_view **o = malloc((f->count ? f->count : 1) * sizeof *o);
    if (!o) { st = moe8__fail(MOE8_ERR_NOMEM, "%s: out of memory", file); goto done; }
    for (size_t i = 0; i < f->count; i++) o[i] = &f->t[i];
    qsort(o, f->count, sizeof *o, by_offset);
    size_t last_end = 0;
    const moe8_tensor_view *last = NULL;
    for (size_t i = 0; i < f->count; i++) {
      if (!o[i]->nbytes) continue;
      if (last && o[i]->offset < last_end) {
        st = moe8__fail(MOE8_ERR_FORMAT, "%s: tensors '%s' (bytes %zu..%zu) and '%s' (bytes %zu..%zu) overlap", file, last->name,
                        last->offset, last_end, o[i]->name, o[i]->offset, o[i]->offset + o[i]->nbytes);
        break;
      }
      last = o[i];
      last_end = o[i]->offset + o[i]->nbytes;
    }
    free(o);
    if (st != MOE8_OK) goto done;
  }
  qsort(f->t, f->count, sizeof *f->t, by_name);
  for (size_t i = 1; i < f->count; i++)
    if (!strcmp(f->t[i].name, f->t[i - 1].name)) {
      st = moe8__fail(MOE8_ERR_FORMAT, "%s: tensor '%s' appears twice", file, f->t[i].name);
      goto done;
    }
done:
  cJSON_Delete(root);
  if (st != MOE8_OK) { moe8_st_close(f); return st; }
  *out = f;
  return MOE8_OK;
}

moe8_status moe8_st_open(const char *path, moe8_st_file **out) {
  if (!path || !out) return moe8__fail(MOE8_ERR_INVALID_ARG, "safetensors: NULL argument");
  *out = NULL;
  int fd;
  size_t len;
  moe8_status ost = moe8__open_regular(path, &fd, &len);
  if (ost != MOE8_OK) return ost;
  void *map = NULL;
  if (len > 0) {
    map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) { close(fd); return moe8__fail(MOE8_ERR_IO, "%s: mmap failed: %s", path, strerror(errno)); }
  }
  close(fd);
  moe8_status st = moe8_st_parse(map ? map : "", len, path, out);
  if (st != MOE8_OK) { if (map) munmap(map, len); return st; }
  (*out)->map = map;
  (*out)->map_len = len;
  moe8__map_register(map, len, path);
  return MOE8_OK;
}

size_t moe8_st_count(const moe8_st_file *f) { return f ? f->count : 0; }
const moe8_tensor_view *moe8_st_at(const moe8_st_file *f, size_t i) { return f && i < f->count ? &f->t[i] : NULL; }
const char *moe8_st_path(const moe8_st_file *f) { return f ? f->path : ""; }

/* A string entry of the file's __metadata__, or NULL. */
const char *moe8__st_meta(const moe8_st_file *f, const char *key);
const char *moe8__st_meta(const moe8_st_file *f, const char *key) {
  if (!f || !key) return NULL;
  for (size_t i = 0; i < f->nmeta; i++)
    if (!strcmp(f->meta[2 * i], key)) return f->meta[2 * i + 1];
  return NULL;
}

const moe8_tensor_view *moe8_st_find(const moe8_st_file *f, const char *name) {
  if (!f || !name) return NULL;
  const moe8_tensor_view key = {.name = name};
  return bsearch(&key, f->t, f->count, sizeof *f->t, by_name);
}

/* ---- writing ------------------------------------------------------------ */

/* moe8_st_write with a __metadata__ of nkv string pairs (kv: key, value,
** key, value, ...). */
moe8_status moe8__st_write_meta(const char *path, const moe8_tensor_view *t, size_t count, const char *const *kv, size_t nkv);
moe8_status moe8_st_write(const char *path, const moe8_tensor_view *t, size_t count) { return moe8__st_write_meta(path, t, count, NULL, 0); }

moe8_status moe8__st_write_meta(const char *path, const moe8_tensor_view *t, size_t count, const char *const *kv, size_t nkv) {
  if (!path || (count && !t) || (nkv && !kv)) return moe8__fail(MOE8_ERR_INVALID_ARG, "safetensors write: NULL argument");
  cJSON *root = cJSON_CreateObject();
  if (!root) return moe8__fail(MOE8_ERR_NOMEM, "%s: out of memory", path);
  if (nkv) {
    cJSON *md = cJSON_AddObjectToObject(root, "__metadata__");
    for (size_t i = 0; md && i < nkv; i++) cJSON_AddStringToObject(md, kv[2 * i], kv[2 * i + 1]);
  }
  uint64_t off = 0;
  for (size_t i = 0; i < count; i++) {
    if ((unsigned)t[i].dtype >= MOE8_FDT_COUNT || t[i].ndim < 0 || t[i].ndim > MOE8_MAX_DIMS || !t[i].name) {
      cJSON_Delete(root);
      return moe8__fail(MOE8_ERR_INVALID_ARG, "%s: tensor %zu has a bad dtype, rank or name", path, i);
    }
    uint64_t numel = 1;
    for (int d = 0; d < t[i].ndim; d++) numel *= (uint64_t)t[i].shape[d];
    const uint64_t nb = numel * g_fdt[t[i].dtype].size;
    if (nb != t[i].nbytes) {
      cJSON_Delete(root);
      return moe8__fail(MOE8_ERR_SHAPE, "%s: tensor '%s' has %zu bytes, its shape needs %llu", path, t[i].name, t[i].nbytes,
                        (unsigned long long)nb);
    }
    cJSON *e = cJSON_AddObjectToObject(root, t[i].name);
    cJSON *sh = cJSON_AddArrayToObject(e, "shape"), *of = cJSON_AddArrayToObject(e, "data_offsets");
    cJSON_AddStringToObject(e, "dtype", g_fdt[t[i].dtype].name);
    for (int d = 0; d < t[i].ndim; d++) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t[i].shape[d]));
    cJSON_AddItemToArray(of, cJSON_CreateNumber((double)off));
    cJSON_AddItemToArray(of, cJSON_CreateNumber((double)(off + nb)));
    off += nb;
  }
  char *json = cJSON_PrintUnformatted(root);
  cJSON_Delete(root);
  if (!json) return moe8__fail(MOE8_ERR_NOMEM, "%s: out of memory", path);
  const size_t jl = strlen(json), hl = (jl + 7) & ~(size_t)7;
  unsigned char *hdr = malloc(8 + hl);
  if (!hdr) { free(json); return moe8__fail(MOE8_ERR_NOMEM, "%s: out of memory", path); }
  for (int i = 0; i < 8; i++) hdr[i] = (unsigned char)((uint64_t)hl >> (8 * i));
  memcpy(hdr + 8, json, jl);
  memset(hdr + 8 + jl, ' ', hl - jl);
  free(json);
  const void **parts = malloc((count + 1) * sizeof *parts);
  size_t *lens = malloc((count + 1) * sizeof *lens);
  moe8_status st;
  if (!parts || !lens) st = moe8__fail(MOE8_ERR_NOMEM, "%s: out of memory", path);
  else {
    parts[0] = hdr;
    lens[0] = 8 + hl;
    for (size_t i = 0; i < count; i++) { parts[i + 1] = t[i].data; lens[i + 1] = t[i].nbytes; }
    st = moe8_file_write_atomic(path, parts, lens, count + 1);
  }
  free(parts); free(lens); free(hdr);
  return st;
}

/* Writes the parts to path.tmp, flushes, renames over path; removes the
** temporary file on any failure. */
