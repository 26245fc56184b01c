/*
** npy.c — NumPy .npy files, v1 (2-byte header length) and v2/v3 (4-byte).
**
** The header is a Python dict literal; this file parses exactly the three
** keys NumPy writes ('descr', 'fortran_order', 'shape') with a small
** recursive-descent reader, because no JSON library reads Python literals.
** Accepted: little-endian <f4, <f2, <u2 (bf16 stored as uint16, the usual
** way to ship bf16 in .npy), |i1 and |u1, <i4 and <i8 (token ids), C order.  The data must be exactly
** numel · itemsize bytes.
*/
#include "../core/internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct rd { const char *p, *end; } rd;

static void ws(rd *r) { while (r->p < r->end && (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r')) r->p++; }
static bool eat(rd *r, char c) { ws(r); if (r->p < r->end && *r->p == c) { r->p++; return true; } return false; }

static bool str(rd *r, char *out, size_t cap) {
  ws(r);
  if (r->p >= r->end || (*r->p != '\'' && *r->p != '"')) return false;
  const char q = *r->p++;
  size_t n = 0;
  while (r->p < r->end && *r->p != q) {
    if (n + 1 >= cap) return false;
    out[n++] = *r->p++;
  }
  if (r->p >= r->end) return false;
  r->p++;
  out[n] = '\0';
  return true;
}

moe8_status moe8_npy_parse(const void *buf, size_t len, const char *name, moe8_file_dtype *dtype, int *ndim,
                           int64_t shape[MOE8_MAX_DIMS], size_t *data_offset) {
  const char *file = name ? name : "<memory>";
  const unsigned char *b = buf;
  if (!buf || !dtype || !ndim || !shape || !data_offset) return moe8__fail(MOE8_ERR_INVALID_ARG, "npy: NULL argument");
  if (len < 10 || memcmp(b, "\x93NUMPY", 6) != 0) return moe8__fail(MOE8_ERR_FORMAT, "%s: not a .npy file (bad magic at byte 0)", file);
  const int major = b[6];
  size_t hlen, hoff;
  if (major == 1) { hlen = (size_t)b[8] | (size_t)b[9] << 8; hoff = 10; }
  else if (major == 2 || major == 3) {
    if (len < 12) return moe8__fail(MOE8_ERR_FORMAT, "%s: truncated header", file);
    hlen = (size_t)b[8] | (size_t)b[9] << 8 | (size_t)b[10] << 16 | (size_t)b[11] << 24;
    hoff = 12;
  } else return moe8__fail(MOE8_ERR_FORMAT, "%s: unsupported .npy version %d at byte 6", file, major);
  if (hlen > len - hoff) return moe8__fail(MOE8_ERR_FORMAT, "%s: header length %zu runs past the end of the file (%zu bytes)", file, hlen, len);
  rd r = {(const char *)b + hoff, (const char *)b + hoff + hlen};
  char descr[32] = "", key[32];
  int fortran = -1, nd = -1;
  if (!eat(&r, '{')) goto bad;
  while (!eat(&r, '}')) {
    if (!str(&r, key, sizeof key) || !eat(&r, ':')) goto bad;
    if (!strcmp(key, "descr")) {
      if (!str(&r, descr, sizeof descr)) goto bad;
    } else if (!strcmp(key, "fortran_order")) {
      ws(&r);
      if (r.end - r.p >= 4 && !memcmp(r.p, "True", 4)) { fortran = 1; r.p += 4; }
      else if (r.end - r.p >= 5 && !memcmp(r.p, "False", 5)) { fortran = 0; r.p += 5; }
      else goto bad;
    } else if (!strcmp(key, "shape")) {
      if (!eat(&r, '(')) goto bad;
      nd = 0;
      while (!eat(&r, ')')) {
        ws(&r);
        int64_t v = 0;
        int digits = 0;
        while (r.p < r.end && *r.p >= '0' && *r.p <= '9' && digits < 18) { v = v * 10 + (*r.p++ - '0'); digits++; }
        if (!digits || nd >= MOE8_MAX_DIMS) goto bad;
        if (r.p < r.end && *r.p == 'L') r.p++;
        shape[nd++] = v;
        if (!eat(&r, ',')) { if (!eat(&r, ')')) goto bad; break; }
      }
    } else {
      return moe8__fail(MOE8_ERR_FORMAT, "%s: unknown header key '%s'", file, key);
    }
    if (!eat(&r, ',')) { if (!eat(&r, '}')) goto bad; break; }
  }
  if (!descr[0] || fortran < 0 || nd < 0) return moe8__fail(MOE8_ERR_FORMAT, "%s: header lacks descr, fortran_order or shape", file);
  if (fortran) return moe8__fail(MOE8_ERR_FORMAT, "%s: fortran_order arrays are not supported (save C order)", file);
  static const struct { const char *d; moe8_file_dtype t; } m[] = {
    {"<f4", MOE8_FDT_F32}, {"<f2", MOE8_FDT_F16}, {"<u2", MOE8_FDT_BF16}, {"|i1", MOE8_FDT_I8}, {"<i1", MOE8_FDT_I8},
    {"i1", MOE8_FDT_I8}, {"|u1", MOE8_FDT_U8}, {"<u1", MOE8_FDT_U8}, {"u1", MOE8_FDT_U8}, {"<i4", MOE8_FDT_I32}, {"<i8", MOE8_FDT_I64},
  };
  int t = -1;
  for (size_t i = 0; i < sizeof m / sizeof m[0]; i++)
    if (!strcmp(descr, m[i].d)) t = (int)m[i].t;
  if (t < 0) return moe8__fail(MOE8_ERR_FORMAT, "%s: unsupported dtype '%s' (want <f4, <f2, <u2 as bf16, |i1, |u1, <i4 or <i8)", file, descr);
  uint64_t numel = 1;
  for (int i = 0; i < nd; i++) {
    if (shape[i] && numel > (UINT64_MAX >> 4) / (uint64_t)shape[i]) return moe8__fail(MOE8_ERR_FORMAT, "%s: shape too large", file);
    numel *= (uint64_t)shape[i];
  }
  const uint64_t need = numel * moe8_file_dtype_size((moe8_file_dtype)t), have = len - hoff - hlen;
  if (need != have)
    return moe8__fail(MOE8_ERR_FORMAT, "%s: %llu data bytes at offset %zu, but %s x shape needs %llu%s", file,
                      (unsigned long long)have, hoff + hlen, descr, (unsigned long long)need, have < need ? " (truncated)" : "");
  *dtype = (moe8_file_dtype)t;
  *ndim = nd;
  *data_offset = hoff + hlen;
  return MOE8_OK;
bad:
  return moe8__fail(MOE8_ERR_FORMAT, "%s: malformed header dict near byte %zu", file, (size_t)(r.p - (const char *)b));
}

moe8_status moe8_npy_read(const char *path, moe8_file_dtype *dtype, int *ndim, int64_t shape[MOE8_MAX_DIMS], void **data) {
  if (!path || !data) return moe8__fail(MOE8_ERR_INVALID_ARG, "npy: NULL argument");
  *data = NULL;
  char *cbuf;
  size_t len;
  moe8_status rs = moe8__read_small(path, SIZE_MAX / 2, &cbuf, &len);
  if (rs != MOE8_OK) return rs;
  unsigned char *buf = (unsigned char *)cbuf;
  const long sz = (long)len;
  size_t off;
  moe8_status st = moe8_npy_parse(buf ? (const void *)buf : (const void *)"", (size_t)sz, path, dtype, ndim, shape, &off);
  if (st != MOE8_OK) { free(buf); return st; }
  memmove(buf, buf + off, (size_t)sz - off);
  *data = buf;
  return MOE8_OK;
}

moe8_status moe8_npy_write(const char *path, moe8_file_dtype dtype, int ndim, const int64_t *shape, const void *data) {
  const char *descr = dtype == MOE8_FDT_F32 ? "<f4" : dtype == MOE8_FDT_BF16 ? "<u2" : dtype == MOE8_FDT_F16 ? "<f2"
                    : dtype == MOE8_FDT_I8 ? "|i1" : dtype == MOE8_FDT_U8 ? "|u1" : dtype == MOE8_FDT_I32 ? "<i4"
                    : dtype == MOE8_FDT_I64 ? "<i8" : NULL;
  if (!path || !descr || ndim < 0 || ndim > MOE8_MAX_DIMS) return moe8__fail(MOE8_ERR_INVALID_ARG, "npy write: bad dtype or rank");
  char h[512];
  int n = snprintf(h, sizeof h, "{'descr': '%s', 'fortran_order': False, 'shape': (", descr);
  uint64_t numel = 1;
  for (int i = 0; i < ndim; i++) {
    n += snprintf(h + n, sizeof h - (size_t)n, "%lld,%s", (long long)shape[i], ndim > 1 && i + 1 < ndim ? " " : "");
    numel *= (uint64_t)shape[i];
  }
  n += snprintf(h + n, sizeof h - (size_t)n, "), }");
  /* Pad with spaces and a newline so the data starts at a multiple of 64. */
  size_t total = 10 + (size_t)n + 1;
  const size_t pad = (64 - total % 64) % 64;
  unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, 0, 0};
  const size_t hl = (size_t)n + pad + 1;
  pre[8] = (unsigned char)(hl & 0xFF);
  pre[9] = (unsigned char)(hl >> 8);
  memset(h + n, ' ', pad);
  h[n + pad] = '\n';
  const void *parts[3] = {pre, h, data};
  const size_t lens[3] = {10, hl, (size_t)numel * moe8_file_dtype_size(dtype)};
  return moe8_file_write_atomic(path, parts, lens, 3);
}

static float f16_to_f32(uint16_t h) {
  const uint32_t s = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1F, m = h & 0x3FF;
  if (e == 31) return moe8__bits_f32(s | 0x7F800000u | (m << 13) | (m ? 0x400000u : 0));
  if (e == 0) {
    const float v = (float)m * 0x1p-24f;
    return s ? -v : v;
  }
  return moe8__bits_f32(s | ((e + 112) << 23) | (m << 13));
}

moe8_status moe8_file_to_f32(float *dst, const void *src, moe8_file_dtype t, size_t n) {
  if (n == 0) return MOE8_OK;
  if (!dst || !src) return moe8__fail(MOE8_ERR_INVALID_ARG, "file_to_f32: NULL %s for %zu elements", dst ? "src" : "dst", n);
  const unsigned char *b = src;
  switch (t) {
    case MOE8_FDT_F32: memmove(dst, src, n * 4); return MOE8_OK;
    case MOE8_FDT_BF16: case MOE8_FDT_F8_E4M3: case MOE8_FDT_F8_E5M2: case MOE8_FDT_I8: {
      /* The data may be unaligned (inside a mapping): go through bytes. */
      const moe8_dtype d = t == MOE8_FDT_BF16 ? MOE8_DTYPE_BF16 : t == MOE8_FDT_F8_E4M3 ? MOE8_DTYPE_F8E4M3
                         : t == MOE8_FDT_F8_E5M2 ? MOE8_DTYPE_F8E5M2 : MOE8_DTYPE_I8;
      if (d != MOE8_DTYPE_BF16 || ((uintptr_t)src & 1) == 0) return moe8_convert(dst, MOE8_DTYPE_F32, src, d, n, 0);
      for (size_t i = 0; i < n; i++) dst[i] = moe8_bf16_to_f32((uint16_t)(b[2 * i] | b[2 * i + 1] << 8));
      return MOE8_OK;
    }
    case MOE8_FDT_F16:
      for (size_t i = 0; i < n; i++) dst[i] = f16_to_f32((uint16_t)(b[2 * i] | b[2 * i + 1] << 8));
      return MOE8_OK;
    case MOE8_FDT_U8:
      for (size_t i = 0; i < n; i++) dst[i] = (float)b[i];
      return MOE8_OK;
    default:
      return moe8__fail(MOE8_ERR_DTYPE, "cannot convert %s to f32", moe8_file_dtype_name(t));
  }
}
