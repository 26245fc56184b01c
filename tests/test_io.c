/*
** test_io.c — docs/files.md, docs/testing.md: files.
**
** Round trips of every dtype through safetensors and .npy; the DeepSeek FP8
** block layout (w ≈ q · scale_inv per 128×128 block, partial edge blocks);
** and the bad-input matrix of the parsers, each case naming the file and
** what is wrong.  (The command-level matrix, with exit codes and "no output
** file left behind", is tests/cli_files.sh.)  Then moe8 quantize's output
** directory, the rules and tile its files record, and the mxfp4 rule's
** refusals (docs/testing.md, "Bad input").  GPT-OSS's MXFP4 experts: the
** decode, a NaN gate reported by both loads, and the two loads' agreement
** within docs/determinism.md's bound.
*/
#include "testutil.h"
#include "core/internal.h"

#include <cjson/cJSON.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char g_dir[256];

static const char *tmp_path(const char *name) {
  static char buf[512];
  snprintf(buf, sizeof buf, "%s/%s", g_dir, name);
  return buf;
}

static int setup(void **state) {
  (void)state;
  snprintf(g_dir, sizeof g_dir, "/tmp/moe8-test-io-XXXXXX");
  return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
  return system(cmd) == 0 ? 0 : -1;
}

static void test_safetensors_roundtrip_all_dtypes(void **state) {
  (void)state;
  moe8_tensor_view t[MOE8_FDT_COUNT + 1];
  unsigned char *bufs[MOE8_FDT_COUNT];
  char names[MOE8_FDT_COUNT][32];
  tu_rng_reset(3);
  for (int d = 0; d < MOE8_FDT_COUNT; d++) {
    const int64_t shape[3] = {3, 1 + d, 5};
    const size_t nb = (size_t)(3 * (1 + d) * 5) * moe8_file_dtype_size((moe8_file_dtype)d);
    bufs[d] = malloc(nb);
    for (size_t i = 0; i < nb; i++) bufs[d][i] = (unsigned char)tu_u64();
    snprintf(names[d], sizeof names[d], "t.%s", moe8_file_dtype_name((moe8_file_dtype)d));
    t[d] = (moe8_tensor_view){names[d], (moe8_file_dtype)d, 3, {shape[0], shape[1], shape[2]}, bufs[d], nb, 0};
  }
  /* A scalar and an empty tensor too. */
  float one = 1.5f;
  t[MOE8_FDT_COUNT] = (moe8_tensor_view){"scalar", MOE8_FDT_F32, 0, {0}, &one, 4, 0};
  char path[512];
  snprintf(path, sizeof path, "%s", tmp_path("all.safetensors"));
  assert_int_equal(moe8_st_write(path, t, MOE8_FDT_COUNT + 1), MOE8_OK);
  assert_int_equal(access(tmp_path("all.safetensors.tmp"), F_OK), -1); /* no temporary left */
  moe8_st_file *f;
  assert_int_equal(moe8_st_open(path, &f), MOE8_OK);
  assert_int_equal(moe8_st_count(f), MOE8_FDT_COUNT + 1);
  for (int d = 0; d < MOE8_FDT_COUNT; d++) {
    const moe8_tensor_view *r = moe8_st_find(f, names[d]);
    assert_non_null(r);
    assert_int_equal(r->dtype, d);
    assert_int_equal(r->ndim, 3);
    assert_int_equal(r->shape[1], 1 + d);
    assert_int_equal(r->nbytes, t[d].nbytes);
    assert_memory_equal(r->data, bufs[d], t[d].nbytes);
    free(bufs[d]);
  }
  const moe8_tensor_view *s = moe8_st_find(f, "scalar");
  assert_int_equal(s->ndim, 0);
  assert_memory_equal(s->data, &one, 4);
  assert_null(moe8_st_find(f, "nope"));
  moe8_st_close(f);
}

static void test_npy_roundtrip(void **state) {
  (void)state;
  const moe8_file_dtype dts[] = {MOE8_FDT_F32, MOE8_FDT_BF16, MOE8_FDT_F16, MOE8_FDT_I8, MOE8_FDT_U8, MOE8_FDT_I32, MOE8_FDT_I64};
  for (size_t i = 0; i < 7; i++)
    for (int nd = 0; nd <= 3; nd++) {
      const int64_t shape[3] = {4, 3, 7};
      size_t n = 1;
      for (int d = 0; d < nd; d++) n *= (size_t)shape[d];
      const size_t nb = n * moe8_file_dtype_size(dts[i]);
      unsigned char *data = malloc(nb + 1);
      for (size_t j = 0; j < nb; j++) data[j] = (unsigned char)(j * 37 + i);
      const char *path = tmp_path("x.npy");
      assert_int_equal(moe8_npy_write(path, dts[i], nd, shape, data), MOE8_OK);
      moe8_file_dtype dt;
      int rnd;
      int64_t rs[MOE8_MAX_DIMS];
      void *got;
      assert_int_equal(moe8_npy_read(path, &dt, &rnd, rs, &got), MOE8_OK);
      assert_int_equal(dt, dts[i]);
      assert_int_equal(rnd, nd);
      for (int d = 0; d < nd; d++) assert_int_equal(rs[d], shape[d]);
      assert_memory_equal(got, data, nb);
      free(got);
      free(data);
    }
  /* f16 and bf16 convert to f32 exactly. */
  const uint16_t h[4] = {0x3C00, 0xC000, 0x0001, 0x7C00}; /* 1, -2, 2^-24, inf */
  float f[4];
  assert_int_equal(moe8_file_to_f32(f, h, MOE8_FDT_F16, 4), MOE8_OK);
  assert_true(f[0] == 1.0f && f[1] == -2.0f && f[2] == 0x1p-24f && isinf(f[3]));
}

/* Bytes of a safetensors file with the given header and data length. */
static size_t make_st(unsigned char *buf, const char *header, size_t data_len, uint64_t hlen_override) {
  const size_t hl = strlen(header);
  const uint64_t v = hlen_override ? hlen_override : hl;
  for (int i = 0; i < 8; i++) buf[i] = (unsigned char)(v >> (8 * i));
  memcpy(buf + 8, header, hl);
  memset(buf + 8 + hl, 0, data_len);
  return 8 + hl + data_len;
}

static void test_safetensors_bad_input(void **state) {
  (void)state;
  static const struct { const char *header; size_t data; uint64_t hlen; const char *want; } cases[] = {
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, 0, "outside the 4 data bytes"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, 1000, "runs past the end"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, (uint64_t)1 << 40, "exceeds"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, 0, "needs 12"},
    {"{\"a\":{\"dtype\":\"F33\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, 0, "unknown dtype 'F33'"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
     12, 0, "overlap"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, 0, "outside"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, 0, "non-negative"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}", 8, 0, "malformed JSON"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, 0, "missing data_offsets"},
    {"{\"a\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,8]}}", 8, 0, "2^64"},
    {"[1,2]", 0, 0, "not a JSON object"},
  };
  unsigned char buf[1024];
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const size_t n = make_st(buf, cases[i].header, cases[i].data, cases[i].hlen);
    moe8_st_file *f = (moe8_st_file *)0x1;
    const moe8_status st = moe8_st_parse(buf, n, "bad.safetensors", &f);
    if (st != MOE8_ERR_FORMAT) TU_FAIL("case %zu: status %s, want format error", i, moe8_status_str(st));
    assert_null(f);
    if (!strstr(moe8_last_error(), cases[i].want) || !strstr(moe8_last_error(), "bad.safetensors"))
      TU_FAIL("case %zu: message \"%s\" lacks \"%s\" or the file name", i, moe8_last_error(), cases[i].want);
  }
  /* Truncated: fewer than 8 bytes. */
  moe8_st_file *f;
  assert_int_equal(moe8_st_parse(buf, 5, "short.safetensors", &f), MOE8_ERR_FORMAT);
  assert_non_null(strstr(moe8_last_error(), "shorter than the 8-byte header length"));
  assert_int_equal(moe8_st_open(tmp_path("missing.safetensors"), &f), MOE8_ERR_IO);
  assert_non_null(strstr(moe8_last_error(), "missing.safetensors"));
}

static void test_npy_bad_input(void **state) {
  (void)state;
  static const struct { const char *hdr; size_t data; const char *want; } cases[] = {
    {"{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }", 16, "unsupported dtype '<f8'"},
    {"{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }", 8, "fortran_order"},
    {"{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", 8, "truncated"},
    {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,) ", 8, "malformed header"},
    {"{'descr': '<f4', 'shape': (2,), }", 8, "lacks"},
    {"{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", 8, "unsupported dtype '>f4'"},
  };
  unsigned char buf[512];
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const size_t hl = strlen(cases[i].hdr);
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    buf[8] = (unsigned char)hl;
    buf[9] = 0;
    memcpy(buf + 10, cases[i].hdr, hl);
    memset(buf + 10 + hl, 0, cases[i].data);
    moe8_file_dtype dt;
    int nd;
    int64_t shape[MOE8_MAX_DIMS];
    size_t off;
    assert_int_equal(moe8_npy_parse(buf, 10 + hl + cases[i].data, "bad.npy", &dt, &nd, shape, &off), MOE8_ERR_FORMAT);
    if (!strstr(moe8_last_error(), cases[i].want)) TU_FAIL("npy case %zu: \"%s\" lacks \"%s\"", i, moe8_last_error(), cases[i].want);
  }
  moe8_file_dtype dt;
  int nd;
  int64_t shape[MOE8_MAX_DIMS];
  size_t off;
  assert_int_equal(moe8_npy_parse("NOTNUMPYxx", 10, "x.npy", &dt, &nd, shape, &off), MOE8_ERR_FORMAT);
  assert_non_null(strstr(moe8_last_error(), "bad magic"));
}

/* GPT-OSS's MXFP4 experts: every byte value (both nibbles: all 16 E2M1
** codes in each place) under every finite-result E8M0 scale 0..252, decoded
** at load exactly as the OCP definition written here; gate and up taken from
** alternate rows; the biases in place; scale 255 (NaN) and a value past the
** f32 range refused with the tensor named. */
static float e2m1_ref(unsigned c) {
  static const float v[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  return (c & 8) ? -v[c & 7] : v[c & 7];
}

static moe8_status write_gptoss(const char *dir, uint8_t *gb, uint8_t *gs, uint8_t *db, uint8_t *ds, float *rw, float *rb, float *gub,
                                float *dnb, int64_t E, int64_t D, int64_t F) {
  char path[600];
  mkdir(dir, 0755);
  snprintf(path, sizeof path, "%s/config.json", dir);
  FILE *f = fopen(path, "w");
  if (!f) return MOE8_ERR_IO;
  fprintf(f, "{\"model_type\": \"gpt_oss\", \"num_local_experts\": %lld, \"num_experts_per_tok\": 2, \"hidden_size\": %lld, "
             "\"intermediate_size\": %lld, \"num_hidden_layers\": 1, \"quantization_config\": {\"quant_method\": \"mxfp4\"}}\n",
          (long long)E, (long long)D, (long long)F);
  fclose(f);
  const moe8_tensor_view t[8] = {
    {"model.layers.0.mlp.router.weight", MOE8_FDT_F32, 2, {E, D}, rw, sizeof(float) * (size_t)(E * D), 0},
    {"model.layers.0.mlp.router.bias", MOE8_FDT_F32, 1, {E}, rb, sizeof(float) * (size_t)E, 0},
    {"model.layers.0.mlp.experts.gate_up_proj_blocks", MOE8_FDT_U8, 4, {E, 2 * F, D / 32, 16}, gb, (size_t)(E * 2 * F * D / 2), 0},
    {"model.layers.0.mlp.experts.gate_up_proj_scales", MOE8_FDT_U8, 3, {E, 2 * F, D / 32}, gs, (size_t)(E * 2 * F * D / 32), 0},
    {"model.layers.0.mlp.experts.gate_up_proj_bias", MOE8_FDT_F32, 2, {E, 2 * F}, gub, sizeof(float) * (size_t)(E * 2 * F), 0},
    {"model.layers.0.mlp.experts.down_proj_blocks", MOE8_FDT_U8, 4, {E, D, F / 32, 16}, db, (size_t)(E * D * F / 2), 0},
    {"model.layers.0.mlp.experts.down_proj_scales", MOE8_FDT_U8, 3, {E, D, F / 32}, ds, (size_t)(E * D * F / 32), 0},
    {"model.layers.0.mlp.experts.down_proj_bias", MOE8_FDT_F32, 2, {E, D}, dnb, sizeof(float) * (size_t)(E * D), 0},
  };
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  return moe8_st_write(path, t, 8);
}

/* Doge's files (DogeCDMoE as save_pretrained writes it): mlp.router_gate.weight [2N, D], mlp.down_embed.weight and
** mlp.up_embed.weight [E, D], the dense SwiGLU's gate_proj / up_proj [Fs, D] and down_proj [D, Fs]; skip: which tensor to
** leave out, bad: which to write with a wrong shape (-1: none). */
static moe8_status write_doge(const char *dir, const float *w[6], int64_t E, int64_t N, int64_t D, int64_t Fs, int skip, int bad,
                              moe8_file_dtype kdt) {
  char path[640];
  mkdir(dir, 0755);
  snprintf(path, sizeof path, "%s/config.json", dir);
  FILE *f = fopen(path, "w");
  if (!f) return MOE8_ERR_IO;
  fprintf(f, "{\"model_type\": \"doge\", \"is_moe\": true, \"num_experts\": %lld, \"num_experts_per_tok\": 3, \"hidden_size\": %lld, "
             "\"intermediate_size\": %lld, \"num_hidden_layers\": 1}\n", (long long)E, (long long)D, (long long)Fs);
  fclose(f);
  static const char *const nm[6] = {"router_gate", "down_embed", "up_embed", "gate_proj", "up_proj", "down_proj"};
  const int64_t sh[6][2] = {{2 * N, D}, {E, D}, {E, D}, {Fs, D}, {Fs, D}, {D, Fs}};
  static char names[6][80];
  moe8_tensor_view t[6];
  int n = 0;
  for (int i = 0; i < 6; i++) {
    if (i == skip) continue;
    snprintf(names[i], sizeof names[i], "model.layers.0.mlp.%s.weight", nm[i]);
    const int64_t r = i == bad ? sh[i][0] - 1 : sh[i][0];
    const moe8_file_dtype dt = i == 1 ? kdt : MOE8_FDT_F32;
    t[n++] = (moe8_tensor_view){names[i], dt, 2, {r, sh[i][1]}, w[i], (size_t)(r * sh[i][1]) * (dt == MOE8_FDT_F32 ? 4 : 1), 0};
  }
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  return moe8_st_write(path, t, (size_t)n);
}

static void test_doge_files(void **state) {
  (void)state;
  enum { E = 20, N = 4, D = 16, Fs = 8, T = 3 };
  static float rg[2 * N * D], de[E * D], ue[E * D], gp[Fs * D], up[Fs * D], dp[D * Fs], x[T * D], y0[T * D], y1[T * D];
  tu_rng_reset(5160);
  float *all[6] = {rg, de, ue, gp, up, dp};
  const size_t cnt[6] = {2 * N * D, E * D, E * D, Fs * D, Fs * D, D * Fs};
  for (int i = 0; i < 6; i++) tu_fill_normal(all[i], cnt[i], 0.3f);
  tu_fill_normal(x, T * D, 1.0f);
  const float *w[6] = {rg, de, ue, gp, up, dp};
  const char *dir = tmp_path("doge");
  assert_int_equal(write_doge(dir, w, E, N, D, Fs, -1, -1, MOE8_FDT_F32), MOE8_OK);
  moe8_model *m;
  assert_int_equal(moe8_model_open(dir, &m), MOE8_OK);
  assert_true(moe8_model_config(m)->layer.product_keys);
  assert_non_null(strstr(moe8_model_format(m, 0), "product-key"));
  /* the file's layer: the bytes of the same layer from memory (the router transposed, the tables' rows the experts) */
  moe8_layer *L, *M;
  const moe8_load_options o = {sizeof o, MOE8_LOAD_INFERENCE, NULL, NULL};
  assert_int_equal(moe8_model_load_layer_ex(m, 0, NULL, &o, &L), MOE8_OK);
  const moe8_layer_config c = {.num_experts = E, .top_k = 3, .hidden = D, .ffn = 1, .act = MOE8_ACT_SILU, .shared_ffn = Fs,
                               .product_keys = true};
  assert_int_equal(moe8_layer_create_inference(&c, NULL, "experts", &M), MOE8_OK);
  float *wr = moe8_layer_weight(M, MOE8_W_ROUTER, NULL);
  for (int d = 0; d < D; d++)
    for (int k = 0; k < 2 * N; k++) wr[d * 2 * N + k] = rg[k * D + d];
  for (int e = 0; e < E; e++) assert_int_equal(moe8_layer_put_expert(M, 0, e, de + e * D, ue + e * D), MOE8_OK);
  static float gu[D * 2 * Fs], dn[Fs * D];
  for (int d = 0; d < D; d++)
    for (int f = 0; f < Fs; f++) { gu[d * 2 * Fs + f] = gp[f * D + d]; gu[d * 2 * Fs + Fs + f] = up[f * D + d]; }
  for (int f = 0; f < Fs; f++)
    for (int d = 0; d < D; d++) dn[f * D + d] = dp[d * Fs + f];
  assert_int_equal(moe8_layer_put_expert(M, 1, 0, gu, dn), MOE8_OK);
  assert_int_equal(moe8_layer_finish_load(M), MOE8_OK);
  const size_t wsz = moe8_layer_workspace_size(L, T);
  void *ws;
  assert_int_equal(posix_memalign(&ws, 64, wsz), 0);
  assert_int_equal(moe8_layer_forward_fused(L, x, T, y0, ws, wsz), MOE8_OK);
  assert_int_equal(moe8_layer_forward_fused(M, x, T, y1, ws, wsz), MOE8_OK);
  assert_memory_equal(y0, y1, sizeof y0);
  free(ws);
  moe8_layer_destroy(M);
  moe8_layer_destroy(L);
  /* a training load runs too (forward; its backward is refused) */
  assert_int_equal(moe8_model_load_layer(m, 0, NULL, &L), MOE8_OK);
  moe8_layer_destroy(L);
  /* moe8 quantize: the tables as moe8's codes per expert row; a load of the file without rules (its recorded rules) is
  ** the input's load under the rule, byte for byte; an MXFP4 rule is refused by name before anything is written */
  {
    static const char rj[] = "{\"rules\": [{\"module_path\": \".*\", \"weight_qtype\": \"float8_e4m3fn\"}]}";
    static const char mj[] = "{\"rules\": [{\"module_path\": \".*\", \"weight_qtype\": \"mxfp4\"}]}";
    moe8_rules *rs, *mx;
    assert_int_equal(moe8_rules_parse(rj, strlen(rj), "inline", &rs), MOE8_OK);
    assert_int_equal(moe8_rules_parse(mj, strlen(mj), "inline", &mx), MOE8_OK);
    char out[700];
    snprintf(out, sizeof out, "%s-q", dir);
    assert_int_equal(moe8_model_quantize(dir, out, rs, NULL), MOE8_OK);
    moe8_model *q;
    assert_int_equal(moe8_model_open(out, &q), MOE8_OK);
    assert_non_null(strstr(moe8_model_format(q, 0), "moe8 f8e4m3 product-key tables"));
    assert_int_equal(moe8_model_load_layer_ex(m, 0, rs, &o, &L), MOE8_OK);
    assert_int_equal(moe8_model_load_layer_ex(q, 0, NULL, &o, &M), MOE8_OK);
    const size_t qsz = moe8_layer_workspace_size(L, T);
    assert_int_equal(posix_memalign(&ws, 64, qsz), 0);
    assert_int_equal(moe8_layer_forward_fused(L, x, T, y0, ws, qsz), MOE8_OK);
    assert_int_equal(moe8_layer_forward_fused(M, x, T, y1, ws, qsz), MOE8_OK);
    assert_memory_equal(y0, y1, sizeof y0);
    free(ws);
    moe8_layer_destroy(M);
    moe8_layer_destroy(L);
    moe8_model_close(q);
    snprintf(out, sizeof out, "%s-qmx", dir);
    assert_int_equal(moe8_model_quantize(dir, out, mx, NULL), MOE8_ERR_UNSUPPORTED);
    assert_non_null(strstr(moe8_last_error(), "product-key"));
    assert_non_null(strstr(moe8_last_error(), "mxfp4"));
    struct stat sb;
    assert_int_not_equal(stat(out, &sb), 0);
    moe8_rules_destroy(rs);
    moe8_rules_destroy(mx);
  }
  moe8_model_close(m);
  /* each tensor missing, or of the wrong shape, is named; so is a table that is not float */
  static const char *const nm[6] = {"router_gate", "down_embed", "up_embed", "gate_proj", "up_proj", "down_proj"};
  for (int i = 0; i < 6; i++)
    for (int mode = 0; mode < 2; mode++) {
      char d2[600];
      snprintf(d2, sizeof d2, "%s-%d-%d", dir, i, mode);
      assert_int_equal(write_doge(d2, w, E, N, D, Fs, mode ? -1 : i, mode ? i : -1, MOE8_FDT_F32), MOE8_OK);
      assert_int_equal(moe8_model_open(d2, &m), MOE8_OK);
      const moe8_status st = moe8_model_load_layer(m, 0, NULL, &L);
      assert_int_equal(st, mode ? MOE8_ERR_SHAPE : MOE8_ERR_FORMAT);
      char want[64];
      snprintf(want, sizeof want, "mlp.%s.weight", nm[i]);
      assert_non_null(strstr(moe8_last_error(), want));
      moe8_model_close(m);
    }
  static uint8_t codes[E * D];
  const float *wi[6] = {rg, (const float *)codes, ue, gp, up, dp};
  char d3[600];
  snprintf(d3, sizeof d3, "%s-i8", dir);
  assert_int_equal(write_doge(d3, wi, E, N, D, Fs, -1, -1, MOE8_FDT_I8), MOE8_OK);
  assert_int_equal(moe8_model_open(d3, &m), MOE8_OK);
  assert_int_equal(moe8_model_load_layer(m, 0, NULL, &L), MOE8_ERR_DTYPE);
  assert_non_null(strstr(moe8_last_error(), "down_embed.weight"));
  moe8_model_close(m);
}

static void test_gpt_oss_mxfp4(void **state) {
  (void)state;
  enum { E = 4, D = 64, F = 32 };
  static uint8_t gb[E * 2 * F * D / 2], gs[E * 2 * F * D / 32], db[E * D * F / 2], ds[E * D * F / 32];
  static float rw[E * D], rb[E], gub[E * 2 * F], dnb[E * D];
  for (size_t i = 0; i < sizeof gb; i++) gb[i] = (uint8_t)(i * 7u + i / 256u);
  for (size_t i = 0; i < sizeof db; i++) db[i] = (uint8_t)(i * 11u + 3u);
  for (size_t i = 0; i < sizeof gs; i++) gs[i] = (uint8_t)(i % 253u);
  for (size_t i = 0; i < sizeof ds; i++) ds[i] = (uint8_t)((i * 37u) % 253u);
  tu_rng_reset(5150);
  tu_fill_normal(rw, E * D, 0.1f);
  tu_fill_normal(rb, E, 1.0f);
  tu_fill_normal(gub, E * 2 * F, 1.0f);
  tu_fill_normal(dnb, E * D, 1.0f);
  /* every byte value with every scale: 256 x 253 pairs over the gate_up blocks */
  int seen[256] = {0};
  for (size_t i = 0; i < sizeof gb; i++) seen[gb[i]] = 1;
  for (int v = 0; v < 256; v++) assert_true(seen[v]);
  const char *dir = tmp_path("gptoss");
  assert_int_equal(write_gptoss(dir, gb, gs, db, ds, rw, rb, gub, dnb, E, D, F), MOE8_OK);
  moe8_model *m;
  assert_int_equal(moe8_model_open(dir, &m), MOE8_OK);
  assert_int_equal(moe8_model_config(m)->arch, MOE8_ARCH_GPT_OSS);
  assert_true(moe8_model_config(m)->mxfp4);
  assert_non_null(strstr(moe8_model_format(m, 0), "mxfp4"));
  moe8_layer *L;
  assert_int_equal(moe8_model_load_layer(m, 0, NULL, &L), MOE8_OK);
  const float *wg = moe8_layer_weight_read(L, MOE8_W_GATE, NULL), *wu = moe8_layer_weight_read(L, MOE8_W_UP, NULL);
  const float *wd = moe8_layer_weight_read(L, MOE8_W_DOWN, NULL), *bg = moe8_layer_weight_read(L, MOE8_W_GU_BIAS, NULL);
  for (int64_t e = 0; e < E; e++)
    for (int64_t n = 0; n < 2 * F; n++)
      for (int64_t k = 0; k < D; k++) {
        const size_t bi = (size_t)(((e * 2 * F + n) * (D / 32) + k / 32) * 16 + (k % 32) / 2);
        const unsigned code = k % 2 ? gb[bi] >> 4 : gb[bi] & 15;
        const float want = ldexpf(e2m1_ref(code), (int)gs[(e * 2 * F + n) * (D / 32) + k / 32] - 127);
        const float got = n % 2 ? wu[(e * D + k) * F + n / 2] : wg[(e * D + k) * F + n / 2];
        if (memcmp(&got, &want, 4) != 0) TU_FAIL("gate_up e %lld row %lld k %lld: %g, want %g", (long long)e, (long long)n, (long long)k, got, want);
      }
  for (int64_t e = 0; e < E; e++)
    for (int64_t n = 0; n < D; n++)
      for (int64_t k = 0; k < F; k++) {
        const size_t bi = (size_t)(((e * D + n) * (F / 32) + k / 32) * 16 + (k % 32) / 2);
        const unsigned code = k % 2 ? db[bi] >> 4 : db[bi] & 15;
        const float want = ldexpf(e2m1_ref(code), (int)ds[(e * D + n) * (F / 32) + k / 32] - 127);
        if (memcmp(&wd[(e * F + k) * D + n], &want, 4) != 0) TU_FAIL("down e %lld n %lld k %lld", (long long)e, (long long)n, (long long)k);
      }
  for (int64_t e = 0; e < E; e++)
    for (int64_t f = 0; f < F; f++)
      assert_true(bg[e * 2 * F + f] == gub[e * 2 * F + 2 * f] && bg[e * 2 * F + F + f] == gub[e * 2 * F + 2 * f + 1]);
  assert_memory_equal(moe8_layer_weight_read(L, MOE8_W_ROUTER_BIAS, NULL), rb, sizeof rb);
  assert_memory_equal(moe8_layer_weight_read(L, MOE8_W_DOWN_BIAS, NULL), dnb, sizeof dnb);
  /* Loaded for inference the experts stay MXFP4 (the kernels decode them):
  ** the same outputs as the decoded f32 weights, to f32 summation (scales
  ** of a real model's range here, so the outputs are finite). */
  moe8_layer_destroy(L);
  moe8_model_close(m);
  for (size_t i = 0; i < sizeof gs; i++) gs[i] = (uint8_t)(118 + i % 8);
  for (size_t i = 0; i < sizeof ds; i++) ds[i] = (uint8_t)(118 + (i * 3) % 8);
  assert_int_equal(write_gptoss(dir, gb, gs, db, ds, rw, rb, gub, dnb, E, D, F), MOE8_OK);
  assert_int_equal(moe8_model_open(dir, &m), MOE8_OK);
  assert_int_equal(moe8_model_load_layer(m, 0, NULL, &L), MOE8_OK);
  moe8_layer *Li;
  const moe8_load_options lo = {sizeof lo, MOE8_LOAD_INFERENCE, NULL, NULL};
  assert_int_equal(moe8_model_load_layer_ex(m, 0, NULL, &lo, &Li), MOE8_OK);
  assert_non_null(strstr(moe8_layer_describe(Li), "mxfp4"));
  enum { T = 7 };
  static float xt[T * D], y1[T * D], y2[T * D];
  for (int i = 0; i < T * D; i++) xt[i] = (float)((i * 37) % 23) / 23.0f - 0.5f;
  const size_t w1 = moe8_layer_workspace_size(L, T), w2 = moe8_layer_workspace_size(Li, T);
  void *ws1, *ws2;
  assert_int_equal(posix_memalign(&ws1, 64, w1), 0);
  assert_int_equal(posix_memalign(&ws2, 64, w2), 0);
  float aux;
  assert_int_equal(moe8_layer_forward(L, xt, T, y1, &aux, ws1, w1), MOE8_OK);
  assert_int_equal(moe8_layer_forward_fused(Li, xt, T, y2, ws2, w2), MOE8_OK);
  double num = 0, den = 0;
  for (int i = 0; i < T * D; i++) { num += ((double)y1[i] - y2[i]) * ((double)y1[i] - y2[i]); den += (double)y1[i] * y1[i]; }
  if (!(den > 0 && sqrt(num / den) < 1e-5)) TU_FAIL("MXFP4 inference vs decoded: rel err %g", sqrt(num / (den > 0 ? den : 1)));
  free(ws1); free(ws2);
  moe8_layer_destroy(Li);
  moe8_layer_destroy(L);
  moe8_model_close(m);
  /* moe8 quantize takes the MXFP4 file: an FP8 rule decodes the experts
  ** exactly and writes moe8's codes (the biases kept, as GPT-OSS's) */
  {
    moe8_rules *fr;
    const char *fj = "{\"rules\": [{\"module_path\": \".*\", \"weight_qtype\": \"float8_e4m3fn\"}]}";
    assert_int_equal(moe8_rules_parse(fj, strlen(fj), "fp8", &fr), MOE8_OK);
    char qout[600];
    snprintf(qout, sizeof qout, "%s-q", dir); /* tmp_path's buffer holds dir */
    const moe8_quantize_options qo = {sizeof qo};
    if (moe8_model_quantize(dir, qout, fr, &qo) != MOE8_OK) TU_FAIL("quantize of the MXFP4 file: %s", moe8_last_error());
    moe8_model *q;
    assert_int_equal(moe8_model_open(qout, &q), MOE8_OK);
    assert_non_null(strstr(moe8_model_format(q, 0), "moe8 f8e4m3"));
    assert_non_null(moe8_model_find(q, "model.layers.0.mlp.experts.gate_up_proj_bias"));
    assert_non_null(moe8_model_find(q, "model.layers.0.mlp.experts.down_proj_bias"));
    moe8_model_close(q);
    moe8_rules_destroy(fr);
  }
  /* Refused: the E8M0 NaN, and a value past the f32 range (code 6 under 2^126). */
  gs[17] = 255;
  assert_int_equal(write_gptoss(dir, gb, gs, db, ds, rw, rb, gub, dnb, E, D, F), MOE8_OK);
  assert_int_equal(moe8_model_open(dir, &m), MOE8_OK);
  assert_int_equal(moe8_model_load_layer(m, 0, NULL, &L), MOE8_ERR_NONFINITE);
  assert_non_null(strstr(moe8_last_error(), "gate_up_proj_scales"));
  assert_non_null(strstr(moe8_last_error(), "E8M0 NaN"));
  assert_int_equal(moe8_model_load_layer_ex(m, 0, NULL, &lo, &L), MOE8_ERR_NONFINITE);
  assert_non_null(strstr(moe8_last_error(), "E8M0 NaN"));
  moe8_model_close(m);
  gs[17] = 253;
  gb[17 * 16] = 0x07; /* code 6 (low nibble 7 = +6) in block 17 */
  assert_int_equal(write_gptoss(dir, gb, gs, db, ds, rw, rb, gub, dnb, E, D, F), MOE8_OK);
  assert_int_equal(moe8_model_open(dir, &m), MOE8_OK);
  assert_int_equal(moe8_model_load_layer(m, 0, NULL, &L), MOE8_ERR_NONFINITE);
  assert_non_null(strstr(moe8_last_error(), "overflows f32"));
  assert_int_equal(moe8_model_load_layer_ex(m, 0, NULL, &lo, &L), MOE8_ERR_NONFINITE);
  assert_non_null(strstr(moe8_last_error(), "overflows f32"));
  moe8_model_close(m);
}

/* Runs x (T rows) through a training load (moe8_layer_forward) and an
** inference load (forward and forward_fused) of the GPT-OSS file in dir;
** y_train, y_inf get the outputs, st[0..2] the statuses. */
static void gptoss_both_loads(const char *dir, const float *x, int64_t T, float *y_train, float *y_inf, moe8_status *st) {
  moe8_model *m;
  assert_int_equal(moe8_model_open(dir, &m), MOE8_OK);
  moe8_layer *L, *Li;
  const moe8_load_options lo = {sizeof lo, MOE8_LOAD_INFERENCE, NULL, NULL};
  assert_int_equal(moe8_model_load_layer(m, 0, NULL, &L), MOE8_OK);
  assert_int_equal(moe8_model_load_layer_ex(m, 0, NULL, &lo, &Li), MOE8_OK);
  assert_non_null(strstr(moe8_layer_describe(Li), "mxfp4"));
  const size_t w1 = moe8_layer_workspace_size(L, T), w2 = moe8_layer_workspace_size(Li, T);
  void *ws1, *ws2;
  assert_int_equal(posix_memalign(&ws1, 64, w1), 0);
  assert_int_equal(posix_memalign(&ws2, 64, w2), 0);
  float aux;
  st[0] = moe8_layer_forward(L, x, T, y_train, &aux, ws1, w1);
  st[1] = moe8_layer_forward(Li, x, T, y_inf, &aux, ws2, w2);
  st[2] = moe8_layer_forward_fused(Li, x, T, y_inf, ws2, w2);
  free(ws1); free(ws2);
  moe8_layer_destroy(Li);
  moe8_layer_destroy(L);
  moe8_model_close(m);
}

/* A gate that overflows f32 is a NaN gate where +inf and -inf partial sums
** meet; the clamped SwiGLU keeps the NaN (torch.clamp does), so the layer
** reports the non-finite output instead of the limit's finite value
** (hardening class: clamped SwiGLU of a NaN gate).  Gate weights ±3·2^126
** (scale 253) times x = 2: in mx4_rows's order (every table) weights
** 0..15 of each block overflow chains 0..15 to +inf, weights 16..31 chains
** 16..31 to -inf, and the fold adds them; the reference gmm of a training
** load rounds each product to ±inf before adding.  (An FMA chain over k
** stays at +inf, which the clamp rightly takes to the limit, so the
** training load is checked on the reference table.) */
static void test_gpt_oss_mxfp4_nan_gate(void **state) {
  (void)state;
  enum { E = 4, D = 64, F = 32, T = 3 };
  static uint8_t gb[E * 2 * F * D / 2], gs[E * 2 * F * D / 32], db[E * D * F / 2], ds[E * D * F / 32];
  static float rw[E * D], rb[E], gub[E * 2 * F], dnb[E * D], x[T * D], y1[T * D], y2[T * D];
  tu_rng_reset(5151);
  tu_fill_normal(rw, E * D, 0.1f);
  tu_fill_normal(rb, E, 1.0f);
  tu_fill_normal(gub, E * 2 * F, 1.0f);
  tu_fill_normal(dnb, E * D, 1.0f);
  for (size_t i = 0; i < sizeof db; i++) db[i] = (uint8_t)(i * 11u + 3u);
  for (size_t i = 0; i < sizeof ds; i++) ds[i] = (uint8_t)(118 + (i * 3) % 8);
  for (int64_t r = 0; r < E * 2 * F; r++) /* row r: gate rows even, up rows odd; byte i holds weights 2i, 2i + 1 */
    for (int64_t b = 0; b < D / 32; b++) {
      gs[r * (D / 32) + b] = (uint8_t)(r % 2 ? 120 : 253);
      for (int i = 0; i < 16; i++) gb[(r * (D / 32) + b) * 16 + i] = (uint8_t)(r % 2 ? 0x3A : i < 8 ? 0x55 : 0xDD); /* +3, -3 */
    }
  for (int i = 0; i < T * D; i++) x[i] = 2.0f;
  const char *dir = tmp_path("gptoss_nan_gate");
  assert_int_equal(write_gptoss(dir, gb, gs, db, ds, rw, rb, gub, dnb, E, D, F), MOE8_OK);
  static const char *const what[3] = {"training load", "inference load", "inference load, fused"};
  for (int pass = 0; pass < 2; pass++) {
    moe8_isa_set(pass ? MOE8_ISA_REF : tu_isa_best());
    moe8_status st[3];
    gptoss_both_loads(dir, x, T, y1, y2, st);
    for (int i = pass ? 0 : 1; i < 3; i++)
      if (st[i] != MOE8_ERR_NONFINITE)
        TU_FAIL("NaN gate, %s on %s: status %s, want MOE8_ERR_NONFINITE (y[0] = %g)", what[i], moe8_isa_name(pass ? MOE8_ISA_REF : tu_isa_best()),
                moe8_status_str(st[i]), (double)(i ? y2[0] : y1[0]));
  }
  moe8_isa_set(tu_isa_best());
}

/* The two loads of an MXFP4 file (docs/determinism.md, "MXFP4 files"): the
** same decoded weights, bit for bit (test_gpt_oss_mxfp4); the outputs are
** two f32 summation orders of the same products (mx4_rows's 32 chains and
** fold against the f32 gmm's order), so they agree to within 1e-5 of the
** token's largest output magnitude, element by element, not in bytes. */
static void test_gpt_oss_mxfp4_loads_agree(void **state) {
  (void)state;
  enum { E = 4, D = 1024, F = 1024, T = 16 };
  static uint8_t gb[E * 2 * F * D / 2], gs[E * 2 * F * D / 32], db[E * D * F / 2], ds[E * D * F / 32];
  static float rw[E * D], rb[E], gub[E * 2 * F], dnb[E * D], x[T * D], y1[T * D], y2[T * D];
  tu_rng_reset(5152);
  for (size_t i = 0; i < sizeof gb; i++) gb[i] = (uint8_t)(tu_u64() & 255);
  for (size_t i = 0; i < sizeof db; i++) db[i] = (uint8_t)(tu_u64() & 255);
  for (size_t i = 0; i < sizeof gs; i++) gs[i] = (uint8_t)(119 + tu_u64() % 4);
  for (size_t i = 0; i < sizeof ds; i++) ds[i] = (uint8_t)(119 + tu_u64() % 4);
  tu_fill_normal(rw, E * D, 0.1f);
  tu_fill_normal(rb, E, 1.0f);
  tu_fill_normal(gub, E * 2 * F, 0.5f);
  tu_fill_normal(dnb, E * D, 0.5f);
  tu_fill_normal(x, T * D, 1.0f);
  const char *dir = tmp_path("gptoss_loads");
  assert_int_equal(write_gptoss(dir, gb, gs, db, ds, rw, rb, gub, dnb, E, D, F), MOE8_OK);
  moe8_status st[3];
  gptoss_both_loads(dir, x, T, y1, y2, st);
  for (int i = 0; i < 3; i++) assert_int_equal(st[i], MOE8_OK);
  double worst = 0;
  for (int64_t t = 0; t < T; t++) {
    double mx = 0, d = 0;
    for (int64_t c = 0; c < D; c++) {
      mx = fmax(mx, fabs(y1[t * D + c]));
      d = fmax(d, fabs((double)y1[t * D + c] - y2[t * D + c]));
    }
    worst = fmax(worst, d / mx);
  }
  printf("mxfp4 training vs inference load: worst |dy| / max|y| of a token %.3g\n", worst);
  if (!(worst <= 1e-5)) TU_FAIL("mxfp4 training vs inference load: %g of the token's max |y| > 1e-5", worst);
}

/* Each config in bad[0..n) is refused, its message naming why[i]. */
static void configs_refused(const char *what, const char *const *bad, const char *const *why, int n) {
  moe8_hf_config c;
  for (int i = 0; i < n; i++) {
    assert_int_not_equal(moe8_hf_config_parse(bad[i], strlen(bad[i]), what, &c), MOE8_OK);
    if (!strstr(moe8_last_error(), why[i])) TU_FAIL("%s config %d: \"%s\" lacks \"%s\"", what, i, moe8_last_error(), why[i]);
  }
}

static void test_hf_configs(void **state) {
  (void)state;
  moe8_hf_config c;
  const char *qwen = "{\"model_type\":\"qwen2_moe\",\"num_experts\":60,\"num_experts_per_tok\":4,\"hidden_size\":2048,"
                     "\"moe_intermediate_size\":1408,\"intermediate_size\":5632,\"norm_topk_prob\":false,\"num_hidden_layers\":24}";
  assert_int_equal(moe8_hf_config_parse(qwen, strlen(qwen), "qwen", &c), MOE8_OK);
  assert_int_equal(c.arch, MOE8_ARCH_QWEN2_MOE);
  assert_int_equal(c.layer.num_experts, 60);
  assert_int_equal(c.layer.ffn, 1408);
  assert_false(c.layer.norm_topk_prob);
  const char *mix = "{\"model_type\":\"mixtral\",\"num_local_experts\":8,\"num_experts_per_tok\":2,\"hidden_size\":4096,\"intermediate_size\":14336}";
  assert_int_equal(moe8_hf_config_parse(mix, strlen(mix), "mixtral", &c), MOE8_OK);
  assert_int_equal(c.arch, MOE8_ARCH_MIXTRAL);
  assert_int_equal(c.layer.ffn, 14336);
  assert_true(c.layer.norm_topk_prob);
  const char *ds = "{\"model_type\":\"deepseek_v3\",\"n_routed_experts\":256,\"num_experts_per_tok\":8,\"hidden_size\":7168,"
                   "\"moe_intermediate_size\":2048,\"scoring_func\":\"sigmoid\",\"routed_scaling_factor\":2.5,\"norm_topk_prob\":true,"
                   "\"quantization_config\":{\"quant_method\":\"fp8\",\"fmt\":\"e4m3\",\"weight_block_size\":[128,128],\"activation_scheme\":\"dynamic\"}}";
  assert_int_equal(moe8_hf_config_parse(ds, strlen(ds), "ds", &c), MOE8_OK);
  assert_int_equal(c.arch, MOE8_ARCH_DEEPSEEK_V3);
  assert_int_equal(c.layer.score, MOE8_SCORE_SIGMOID);
  assert_true(c.layer.routed_scaling_factor == 2.5f);
  assert_true(c.fp8 && c.block_n == 128 && c.block_k == 128 && c.has_bias);
  /* Every missing key takes the family's reference default. */
  const char *q2 = "{\"model_type\":\"qwen2_moe\"}", *q3 = "{\"model_type\":\"qwen3_moe\"}", *mx = "{\"model_type\":\"mixtral\"}",
             *dv3 = "{\"model_type\":\"deepseek_v3\"}";
  assert_int_equal(moe8_hf_config_parse(q2, strlen(q2), "q2", &c), MOE8_OK);
  assert_true(c.layer.num_experts == 60 && c.layer.top_k == 4 && c.layer.hidden == 2048 && c.layer.ffn == 1408 && c.num_layers == 24);
  assert_true(c.layer.shared_ffn == 5632 && c.layer.shared_gate && !c.layer.norm_topk_prob && c.layer.score == MOE8_SCORE_SOFTMAX);
  assert_int_equal(moe8_hf_config_parse(q3, strlen(q3), "q3", &c), MOE8_OK);
  assert_true(c.layer.num_experts == 128 && c.layer.top_k == 8 && c.layer.hidden == 2048 && c.layer.ffn == 768 && c.num_layers == 24);
  assert_true(c.layer.shared_ffn == 0 && !c.layer.norm_topk_prob && c.decoder_sparse_step == 1 && c.n_mlp_only == 0);
  assert_int_equal(moe8_hf_config_parse(mx, strlen(mx), "mx", &c), MOE8_OK);
  assert_true(c.layer.num_experts == 8 && c.layer.top_k == 2 && c.layer.hidden == 4096 && c.layer.ffn == 14336 && c.num_layers == 32);
  assert_true(c.layer.norm_topk_prob && c.layer.shared_ffn == 0);
  assert_int_equal(moe8_hf_config_parse(dv3, strlen(dv3), "ds", &c), MOE8_OK);
  assert_true(c.layer.num_experts == 256 && c.layer.top_k == 8 && c.layer.hidden == 7168 && c.layer.ffn == 2048 && c.num_layers == 61);
  assert_true(c.layer.routed_scaling_factor == 2.5f && c.layer.n_group == 8 && c.layer.topk_group == 4 && c.layer.norm_topk_prob);
  assert_true(c.layer.shared_ffn == 2048 && !c.layer.shared_gate && c.first_k_dense_replace == 3 && c.has_bias);
  assert_int_equal(moe8_hf_config_first_moe_layer(&c), 3);
  assert_int_equal(moe8_hf_config_check_moe_layer(&c, 0), MOE8_ERR_INVALID_ARG);
  assert_non_null(strstr(moe8_last_error(), "first_k_dense_replace"));
  assert_int_equal(moe8_hf_config_check_moe_layer(&c, 3), MOE8_OK);
  /* --arch never runs a family whose block differs (PhiMoE's sparsemixer). */
  {
    const char *phi = "{\"model_type\":\"phimoe\",\"num_local_experts\":16,\"num_experts_per_tok\":2}";
    char dir[] = "/tmp/moe8_phiXXXXXX", path[64];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    fputs(phi, f);
    fclose(f);
    assert_int_equal(moe8__config_load_as(path, "mixtral", &c), MOE8_ERR_UNSUPPORTED);
    assert_non_null(strstr(moe8_last_error(), "sparsemixer"));
    remove(path);
    rmdir(dir);
  }
  /* GLM-4.5 and OLMoE: their config classes' defaults (docs/models.md). */
  const char *glm = "{\"model_type\":\"glm4_moe\"}", *olm = "{\"model_type\":\"olmoe\"}";
  assert_int_equal(moe8_hf_config_parse(glm, strlen(glm), "glm", &c), MOE8_OK);
  assert_int_equal(c.arch, MOE8_ARCH_DEEPSEEK_V3);
  assert_string_equal(c.model_type, "glm4_moe");
  assert_true(c.layer.num_experts == 128 && c.layer.top_k == 8 && c.layer.hidden == 4096 && c.layer.ffn == 1408 && c.num_layers == 46);
  assert_true(c.layer.routed_scaling_factor == 1.0f && c.layer.n_group == 1 && c.layer.topk_group == 1 && c.layer.norm_topk_prob);
  assert_true(c.layer.shared_ffn == 1408 && c.first_k_dense_replace == 1 && c.has_bias && c.layer.score == MOE8_SCORE_SIGMOID);
  assert_int_equal(moe8_hf_config_parse(olm, strlen(olm), "olm", &c), MOE8_OK);
  assert_int_equal(c.arch, MOE8_ARCH_OLMOE);
  assert_true(c.layer.num_experts == 64 && c.layer.top_k == 8 && c.layer.hidden == 2048 && c.layer.ffn == 2048 && c.num_layers == 16);
  assert_true(!c.layer.norm_topk_prob && c.layer.shared_ffn == 0 && c.layer.score == MOE8_SCORE_SOFTMAX);
  /* Qwen3-Next: Qwen2-MoE's block with Qwen3NextConfig's defaults. */
  const char *qn = "{\"model_type\":\"qwen3_next\"}";
  assert_int_equal(moe8_hf_config_parse(qn, strlen(qn), "qn", &c), MOE8_OK);
  assert_int_equal(c.arch, MOE8_ARCH_QWEN2_MOE);
  assert_string_equal(c.model_type, "qwen3_next");
  assert_true(c.layer.num_experts == 512 && c.layer.top_k == 10 && c.layer.hidden == 2048 && c.layer.ffn == 512 && c.num_layers == 48);
  assert_true(c.layer.norm_topk_prob && c.layer.shared_ffn == 512 && c.layer.shared_gate && c.layer.score == MOE8_SCORE_SOFTMAX);
  /* DeepSeek-V2: DeepseekV2Config's defaults, greedy and group_limited_greedy. */
  const char *v2a = "{\"model_type\":\"deepseek_v2\",\"num_experts_per_tok\":6}";
  assert_int_equal(moe8_hf_config_parse(v2a, strlen(v2a), "v2a", &c), MOE8_OK);
  assert_int_equal(c.arch, MOE8_ARCH_DEEPSEEK_V2);
  assert_true(c.layer.num_experts == 64 && c.layer.top_k == 6 && c.layer.hidden == 4096 && c.layer.ffn == 1407 && c.num_layers == 32);
  assert_true(!c.layer.norm_topk_prob && c.layer.routed_scaling_factor == 1.0f && c.layer.n_group == 0 && c.layer.shared_ffn == 2 * 1407);
  assert_true(!c.has_bias && c.layer.score == MOE8_SCORE_SOFTMAX && !c.layer.shared_gate && c.first_k_dense_replace == 0);
  const char *v2b = "{\"model_type\":\"deepseek_v2\",\"num_experts_per_tok\":6,\"n_routed_experts\":160,\"topk_method\":\"group_limited_greedy\","
                    "\"n_group\":8,\"topk_group\":3,\"routed_scaling_factor\":16.0,\"n_shared_experts\":null,\"first_k_dense_replace\":1}";
  assert_int_equal(moe8_hf_config_parse(v2b, strlen(v2b), "v2b", &c), MOE8_OK);
  assert_true(c.layer.n_group == 8 && c.layer.topk_group == 3 && c.layer.group_score == MOE8_GROUP_MAX && c.layer.shared_ffn == 0);
  assert_true(c.layer.routed_scaling_factor == 16.0f && moe8_hf_config_first_moe_layer(&c) == 1);
  const char *v2bad[] = {"{\"model_type\":\"deepseek_v2\",\"num_experts_per_tok\":6,\"norm_topk_prob\":true}",
                         "{\"model_type\":\"deepseek_v2\",\"num_experts_per_tok\":6,\"topk_method\":\"noaux_tc\"}",
                         "{\"model_type\":\"deepseek_v2\",\"num_experts_per_tok\":6,\"topk_method\":\"group_limited_greedy\"}",
                         "{\"model_type\":\"deepseek_v2\",\"num_experts_per_tok\":6,\"scoring_func\":\"sigmoid\"}"};
  const char *v2why[] = {"norm_topk_prob", "deepseek_v3", "n_group", "scoring_func"};
  configs_refused("deepseek_v2", v2bad, v2why, 4);
  /* dots.llm1: DeepSeek-V3's block with Dots1Config's defaults; the keys
  ** without a default are required, by name. */
  const char *dots = "{\"model_type\":\"dots1\",\"n_routed_experts\":128,\"num_experts_per_tok\":6,\"n_shared_experts\":2,"
                     "\"scoring_func\":\"noaux_tc\"}"; /* as the released configs write it */
  assert_int_equal(moe8_hf_config_parse(dots, strlen(dots), "dots", &c), MOE8_OK);
  assert_int_equal(c.arch, MOE8_ARCH_DEEPSEEK_V3);
  assert_string_equal(c.model_type, "dots1");
  assert_true(c.layer.num_experts == 128 && c.layer.top_k == 6 && c.layer.hidden == 4608 && c.layer.ffn == 1408 && c.num_layers == 62);
  assert_true(!c.layer.norm_topk_prob && c.layer.routed_scaling_factor == 1.0f && c.layer.n_group == 1 && c.layer.topk_group == 1);
  assert_true(c.layer.shared_ffn == 2 * 1408 && c.first_k_dense_replace == 0 && c.has_bias && c.layer.score == MOE8_SCORE_SIGMOID);
  const char *dotsbad[] = {"{\"model_type\":\"dots1\",\"num_experts_per_tok\":6,\"n_shared_experts\":2}",
                           "{\"model_type\":\"dots1\",\"n_routed_experts\":128,\"n_shared_experts\":2}",
                           "{\"model_type\":\"dots1\",\"n_routed_experts\":128,\"num_experts_per_tok\":6}",
                           "{\"model_type\":\"minimax_m2\",\"scoring_func\":\"softmax\"}"};
  const char *dotswhy[] = {"n_routed_experts", "num_experts_per_tok", "n_shared_experts", "scoring_func"};
  configs_refused("dots1", dotsbad, dotswhy, 4);
  /* MiniMax (Text-01): Mixtral's block; MiniMax-M2: Mixtral's block routed
  ** by sigmoid + the block's correction bias, renormalized.  Both take
  ** num_experts as an alias. */
  const char *mm = "{\"model_type\":\"minimax\",\"num_experts\":32}", *m2 = "{\"model_type\":\"minimax_m2\"}";
  assert_int_equal(moe8_hf_config_parse(mm, strlen(mm), "mm", &c), MOE8_OK);
  assert_true(c.arch == MOE8_ARCH_MIXTRAL && c.layer.num_experts == 32 && c.layer.top_k == 2 && c.layer.ffn == 14336 && c.layer.norm_topk_prob);
  assert_true(c.layer.score == MOE8_SCORE_SOFTMAX && !c.has_bias);
  assert_int_equal(moe8_hf_config_parse(m2, strlen(m2), "m2", &c), MOE8_OK);
  assert_true(c.arch == MOE8_ARCH_MIXTRAL && c.layer.num_experts == 256 && c.layer.top_k == 8 && c.layer.hidden == 3072 && c.layer.ffn == 1536);
  assert_true(c.layer.score == MOE8_SCORE_SIGMOID && c.has_bias && c.layer.norm_topk_prob && c.layer.routed_scaling_factor == 1.0f);
  assert_true(c.layer.n_group <= 1 && c.layer.shared_ffn == 0 && c.num_layers == 62);
  /* Llama-4 as released: the multimodal config, its text model in text_config. */
  const char *l4 = "{\"model_type\":\"llama4\",\"text_config\":{\"model_type\":\"llama4_text\",\"num_local_experts\":128,"
                   "\"hidden_size\":5120,\"intermediate_size\":8192,\"num_hidden_layers\":48,\"interleave_moe_layer_step\":2},"
                   "\"vision_config\":{\"hidden_size\":1408}}";
  assert_int_equal(moe8_hf_config_parse(l4, strlen(l4), "l4", &c), MOE8_OK);
  assert_true(c.arch == MOE8_ARCH_LLAMA4 && c.layer.num_experts == 128 && c.layer.top_k == 1 && c.layer.weight_input && c.num_layers == 48);
  assert_true(c.decoder_sparse_step == 2 && c.layer.shared_ffn == 8192 && strstr(c.model_type, "llama4") != NULL);
  const char *l4bad[] = {"{\"model_type\":\"llama4\"}",
                         "{\"model_type\":\"llama4\",\"text_config\":{\"num_local_experts\":16},\"quantization_config\":{\"quant_method\":\"fbgemm_fp8\"}}"};
  const char *l4why[] = {"text_config", "fbgemm_fp8"};
  const char *ct = "{\"model_type\":\"glm4_moe\",\"quantization_config\":{\"quant_method\":\"compressed-tensors\"}}";
  assert_int_equal(moe8_hf_config_parse(ct, strlen(ct), "ct", &c), MOE8_ERR_UNSUPPORTED);
  assert_non_null(strstr(moe8_last_error(), "compressed-tensors"));
  configs_refused("llama4", l4bad, l4why, 2);
  assert_int_not_equal(moe8_hf_config_parse_as(l4, strlen(l4), "l4", "llama4_text", &c), MOE8_OK); /* the override reads the top keys */
  assert_non_null(strstr(moe8_last_error(), "text_config"));
  /* Llama-4's dense layers are named by its own keys: interleave_moe_layer_step,
  ** or moe_layers when the list is given (it has no mlp_only_layers or
  ** decoder_sparse_step) */
  assert_int_equal(moe8_hf_config_parse(l4, strlen(l4), "l4", &c), MOE8_OK);
  assert_int_equal(moe8_hf_config_check_moe_layer(&c, 0), MOE8_ERR_INVALID_ARG);
  if (!strstr(moe8_last_error(), "interleave_moe_layer_step = 2") || strstr(moe8_last_error(), "decoder_sparse_step"))
    TU_FAIL("llama4 step: \"%s\"", moe8_last_error());
  assert_int_equal(moe8_hf_config_check_moe_layer(&c, 1), MOE8_OK);
  const char *l4ml = "{\"model_type\":\"llama4_text\",\"num_hidden_layers\":4,\"interleave_moe_layer_step\":2,\"moe_layers\":[0, 3]}";
  assert_int_equal(moe8_hf_config_parse(l4ml, strlen(l4ml), "l4ml", &c), MOE8_OK);
  assert_int_equal(moe8_hf_config_check_moe_layer(&c, 0), MOE8_OK);
  assert_int_equal(moe8_hf_config_check_moe_layer(&c, 3), MOE8_OK);
  assert_int_equal(moe8_hf_config_check_moe_layer(&c, 1), MOE8_ERR_INVALID_ARG);
  if (!strstr(moe8_last_error(), "moe_layers") || strstr(moe8_last_error(), "mlp_only_layers") || strstr(moe8_last_error(), "decoder_sparse_step"))
    TU_FAIL("llama4 moe_layers: \"%s\"", moe8_last_error());
  /* GPT-OSS: the clamped SwiGLU's alpha is GptOssConfig's swiglu_alpha
  ** (default 1.702); refused unless a positive finite number */
  const char *go1 = "{\"model_type\":\"gpt_oss\",\"swiglu_alpha\":1.0}", *go0 = "{\"model_type\":\"gpt_oss\"}";
  assert_int_equal(moe8_hf_config_parse(go1, strlen(go1), "go1", &c), MOE8_OK);
  assert_true(c.layer.act == MOE8_ACT_SWIGLU_CLAMP && c.layer.act_alpha == 1.0f && c.layer.act_limit == 7.0f);
  assert_int_equal(moe8_hf_config_parse(go0, strlen(go0), "go0", &c), MOE8_OK);
  assert_true(c.layer.act_alpha == 1.702f && c.layer.act_limit == 7.0f);
  const char *gobad[] = {"{\"model_type\":\"gpt_oss\",\"swiglu_alpha\":0}", "{\"model_type\":\"gpt_oss\",\"swiglu_alpha\":-1.702}",
                         "{\"model_type\":\"gpt_oss\",\"swiglu_alpha\":1e999}", "{\"model_type\":\"gpt_oss\",\"swiglu_alpha\":1e-300}",
                         "{\"model_type\":\"gpt_oss\",\"swiglu_alpha\":\"1.702\"}"};
  for (size_t i = 0; i < sizeof gobad / sizeof gobad[0]; i++) {
    assert_int_equal(moe8_hf_config_parse(gobad[i], strlen(gobad[i]), "config.json", &c), MOE8_ERR_PARSE);
    if (!strstr(moe8_last_error(), "swiglu_alpha") || !strstr(moe8_last_error(), "config.json"))
      TU_FAIL("gpt_oss alpha %zu: \"%s\"", i, moe8_last_error());
  }
  /* DeepSeek-V3.2: V3's MoE block and its defaults */
  const char *v32 = "{\"model_type\":\"deepseek_v32\",\"index_topk\":2048}";
  assert_int_equal(moe8_hf_config_parse(v32, strlen(v32), "v32", &c), MOE8_OK);
  assert_true(c.arch == MOE8_ARCH_DEEPSEEK_V3 && c.layer.num_experts == 256 && c.layer.n_group == 8 && c.layer.topk_group == 4 &&
              c.layer.routed_scaling_factor == 2.5f && c.has_bias);
  assert_string_equal(c.model_type, "deepseek_v32");
  const char *glm2 = "{\"model_type\":\"glm4_moe\",\"num_local_experts\":16,\"num_experts_per_tok\":2}";
  assert_int_equal(moe8_hf_config_parse(glm2, strlen(glm2), "glm2", &c), MOE8_OK);
  assert_int_equal(c.layer.num_experts, 16);
  /* transformers 5 writes Qwen3-MoE's expert count as num_local_experts. */
  const char *q3a = "{\"model_type\":\"qwen3_moe\",\"num_local_experts\":64,\"num_experts_per_tok\":8}";
  assert_int_equal(moe8_hf_config_parse(q3a, strlen(q3a), "q3a", &c), MOE8_OK);
  assert_int_equal(c.layer.num_experts, 64);
  const char *q3b = "{\"model_type\":\"qwen3_moe\",\"num_local_experts\":64,\"num_experts\":32}";
  assert_int_equal(moe8_hf_config_parse(q3b, strlen(q3b), "q3b", &c), MOE8_ERR_PARSE);
  assert_non_null(strstr(moe8_last_error(), "num_local_experts"));
  const char *q2a = "{\"model_type\":\"qwen2_moe\",\"num_local_experts\":16,\"num_experts\":16}";
  assert_int_equal(moe8_hf_config_parse(q2a, strlen(q2a), "q2a", &c), MOE8_OK);
  assert_int_equal(c.layer.num_experts, 16);
  const char *ds2 = "{\"model_type\":\"deepseek_v3\",\"n_shared_experts\":2,\"moe_intermediate_size\":64,\"first_k_dense_replace\":0,"
                    "\"n_routed_experts\":16,\"n_group\":4,\"topk_group\":2,\"num_experts_per_tok\":4}";
  assert_int_equal(moe8_hf_config_parse(ds2, strlen(ds2), "ds2", &c), MOE8_OK);
  assert_true(c.layer.shared_ffn == 128 && c.layer.n_group == 4 && c.layer.topk_group == 2);
  const char *dense[] = {"{\"model_type\":\"qwen3_moe\",\"mlp_only_layers\":[0, 2]}", "{\"model_type\":\"qwen2_moe\",\"decoder_sparse_step\":2}",
                         "{\"model_type\":\"deepseek_v3\",\"first_k_dense_replace\":1,\"moe_layer_freq\":2}"};
  const char *dkey[] = {"mlp_only_layers", "decoder_sparse_step", "first_k_dense_replace"};
  const int64_t dfirst[] = {1, 1, 2};
  for (int i = 0; i < 3; i++) {
    assert_int_equal(moe8_hf_config_parse(dense[i], strlen(dense[i]), "dense", &c), MOE8_OK);
    assert_int_equal(moe8_hf_config_check_moe_layer(&c, 0), MOE8_ERR_INVALID_ARG);
    if (!strstr(moe8_last_error(), dkey[i])) TU_FAIL("dense %d: \"%s\" lacks \"%s\"", i, moe8_last_error(), dkey[i]);
    assert_int_equal(moe8_hf_config_first_moe_layer(&c), dfirst[i]);
  }
  /* Refused, naming the key. */
  const char *bad[] = {"{\"num_experts\": \"8\"}",
                       "{\"model_type\":\"qwen3_moe\",\"num_experts\":4,\"num_experts_per_tok\":5}",
                       "{\"a\":",
                       "{\"model_type\":\"qwen3_moe\",\"hidden_act\":\"gelu\"}",
                       "{\"model_type\":\"deepseek_v2\"}",
                       "{\"model_type\":\"arctic\",\"num_experts\":8}",
                       "{\"model_type\":\"deepseek_v3\",\"quantization_config\":{\"quant_method\":\"fp8\",\"weight_block_size\":[1e300,1e300]}}",
                       "{\"model_type\":\"qwen3_moe\",\"num_experts\":128.7}",
                       "{\"model_type\":\"qwen3_moe\",\"hidden_size\":-4}",
                       "{\"model_type\":\"qwen3_moe\",\"moe_intermediate_size\":1e300}",
                       "{\"model_type\":\"deepseek_v3\",\"scoring_func\":\"softmax\"}",
                       "{\"model_type\":\"deepseek_v3\",\"topk_method\":\"greedy\"}",
                       "{\"model_type\":\"deepseek_v3\",\"n_routed_experts\":64,\"n_group\":5}",
                       "{\"model_type\":\"qwen3_moe\",\"norm_topk_prob\":1}"};
  const char *want[] = {"num_experts", "num_experts_per_tok", "malformed JSON", "hidden_act", "num_experts_per_tok", "model_type",
                        "weight_block_size", "num_experts", "hidden_size", "moe_intermediate_size", "scoring_func", "topk_method",
                        "n_group", "norm_topk_prob"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    const moe8_status st = moe8_hf_config_parse(bad[i], strlen(bad[i]), "config.json", &c);
    if (st == MOE8_OK) TU_FAIL("config %zu was accepted", i);
    if (!strstr(moe8_last_error(), want[i])) TU_FAIL("config %zu: \"%s\" lacks \"%s\"", i, moe8_last_error(), want[i]);
  }
  /* An explicit override runs a compatible family under another name. */
  assert_int_equal(moe8_hf_config_parse_as(bad[4], strlen(bad[4]), "config.json", "deepseek_v3", &c), MOE8_OK);
  assert_int_equal(c.arch, MOE8_ARCH_DEEPSEEK_V3);
}

/* DeepSeek blocks with partial edges: N = 200, K = 300 -> scale_inv [2, 3]. */
static void test_deepseek_blocks(void **state) {
  (void)state;
  const int64_t N = 200, K = 300;
  float *w = malloc(sizeof(float) * (size_t)(N * K)), *y = malloc(sizeof(float) * (size_t)(N * K));
  uint8_t *q = malloc((size_t)(N * K));
  float s[6];
  tu_rng_reset(8);
  tu_fill_normal(w, (size_t)(N * K), 0.1f);
  w[199 * K + 299] = 3.0f; /* the corner block's max */
  const moe8_quant_spec spec = {.qtype = MOE8_DTYPE_F8E4M3, .gran = MOE8_GRAN_BLOCK2D, .tile = 128, .block_n = 128, .clip = 1.0f};
  assert_int_equal(moe8_quant_scale_count(&spec, 1, N, K, NULL), 6);
  assert_int_equal(moe8_quantize(&spec, w, 1, N, K, q, s, NULL), MOE8_OK);
  assert_true(s[5] == 3.0f / 448.0f);
  assert_int_equal(moe8_dequantize(&spec, q, s, 1, N, K, y), MOE8_OK);
  for (int64_t bn = 0; bn < 2; bn++)
    for (int64_t bk = 0; bk < 3; bk++) {
      float amax = 0;
      for (int64_t n = bn * 128; n < N && n < (bn + 1) * 128; n++)
        for (int64_t k = bk * 128; k < K && k < (bk + 1) * 128; k++) amax = fmaxf(amax, fabsf(w[n * K + k]));
      assert_true(s[bn * 3 + bk] == amax / 448.0f);
      for (int64_t n = bn * 128; n < N && n < (bn + 1) * 128; n++)
        for (int64_t k = bk * 128; k < K && k < (bk + 1) * 128; k++)
          assert_true(fabsf(w[n * K + k] - y[n * K + k]) <= amax / 16.0f * (1 + 1e-6f));
    }
  free(w); free(y); free(q);
}

/* ---- the command-level matrix: moe8 init/quantize/run on real files ------ */
static const char *moe8_bin(void) {
  const char *b = getenv("MOE8_BIN");
  return b ? b : "./moe8";
}

/* Runs a shell command; returns its exit status, stderr in g_err. */
static char g_err[8192];
static int sh(const char *fmt, ...) {
  char cmd[2048], ef[600];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  snprintf(ef, sizeof ef, "%s/stderr.txt", g_dir);
  char full[3000];
  snprintf(full, sizeof full, "{ %s\n} >/dev/null 2>'%s'", cmd, ef);
  const int rc = system(full);
  FILE *f = fopen(ef, "r");
  const size_t n = f ? fread(g_err, 1, sizeof g_err - 1, f) : 0;
  g_err[n] = '\0';
  if (f) fclose(f);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

static void write_text(const char *path, const char *txt) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(txt, f);
  fclose(f);
}

static unsigned char *read_all(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  *len = (size_t)ftell(f);
  rewind(f);
  unsigned char *b = malloc(*len + 1);
  assert_int_equal(fread(b, 1, *len, f), *len);
  fclose(f);
  return b;
}

/* Copies model dir src to dst, rewriting the safetensors header with edit(). */
static void corrupt(const char *src, const char *dst, void (*edit)(cJSON *root), long trunc, int bad_hlen) {
  char a[600], b[600];
  assert_int_equal(sh("rm -rf '%s' && cp -r '%s' '%s'", dst, src, dst), 0);
  snprintf(a, sizeof a, "%s/model.safetensors", src);
  snprintf(b, sizeof b, "%s/model.safetensors", dst);
  size_t len;
  unsigned char *bytes = read_all(a, &len);
  uint64_t hl = 0;
  for (int i = 7; i >= 0; i--) hl = hl << 8 | bytes[i];
  size_t outlen = len;
  unsigned char *out = bytes;
  if (edit) {
    cJSON *root = cJSON_ParseWithLength((const char *)bytes + 8, (size_t)hl);
    assert_non_null(root);
    edit(root);
    char *h = cJSON_PrintUnformatted(root);
    const size_t nh = strlen(h), dl = len - 8 - (size_t)hl;
    out = malloc(8 + nh + dl);
    for (int i = 0; i < 8; i++) out[i] = (unsigned char)((uint64_t)nh >> (8 * i));
    memcpy(out + 8, h, nh);
    memcpy(out + 8 + nh, bytes + 8 + hl, dl);
    outlen = 8 + nh + dl;
    free(h);
    cJSON_Delete(root);
    free(bytes);
  }
  if (bad_hlen) for (int i = 0; i < 8; i++) out[i] = (unsigned char)((uint64_t)outlen >> (8 * i));
  if (trunc) outlen = (size_t)trunc;
  FILE *f = fopen(b, "wb");
  assert_non_null(f);
  fwrite(out, 1, outlen, f);
  fclose(f);
  free(out);
}

#define T_GATE0 "model.layers.0.mlp.experts.0.gate_proj.weight"
#define T_UP3 "model.layers.0.mlp.experts.3.up_proj.weight"
static void e_dtype(cJSON *r) { cJSON *t = cJSON_GetObjectItem(r, T_GATE0); cJSON_ReplaceItemInObject(t, "dtype", cJSON_CreateString("F33")); }
static void e_range(cJSON *r) {
  cJSON *o = cJSON_GetObjectItem(cJSON_GetObjectItem(r, T_GATE0), "data_offsets");
  cJSON_ReplaceItemInArray(o, 1, cJSON_CreateNumber(1e9));
}
static void e_overlap(cJSON *r) {
  cJSON *a = cJSON_GetObjectItem(r, T_GATE0), *b = cJSON_GetObjectItem(r, T_UP3);
  cJSON_ReplaceItemInObject(b, "data_offsets", cJSON_Duplicate(cJSON_GetObjectItem(a, "data_offsets"), 1));
}
static void e_size(cJSON *r) {
  cJSON *s = cJSON_GetObjectItem(cJSON_GetObjectItem(r, T_GATE0), "shape");
  cJSON_ReplaceItemInArray(s, 0, cJSON_CreateNumber(17));
}
static void e_missing(cJSON *r) { cJSON_DeleteItemFromObject(r, T_UP3); }
static void e_shape(cJSON *r) { /* same bytes, transposed shape */
  cJSON *s = cJSON_GetObjectItem(cJSON_GetObjectItem(r, T_GATE0), "shape");
  const double a = cJSON_GetArrayItem(s, 0)->valuedouble, b = cJSON_GetArrayItem(s, 1)->valuedouble;
  cJSON_ReplaceItemInArray(s, 0, cJSON_CreateNumber(b));
  cJSON_ReplaceItemInArray(s, 1, cJSON_CreateNumber(a));
}

/* moe8__json_parse_keeping_numbers: printed again, every number reads as
** the text wrote it, whatever strings, escapes, arrays and objects sit
** around it; a key added later prints as cJSON prints it. */
static void test_json_keeps_numbers(void **state) {
  (void)state;
  const char *txt = "{\"a\": \"x\\\"1.0 2\", \"b\": [1.0, -2e-3, {\"c\": 3.50, \"d\": [0.0, 7]}], \"e\": 1E+5, \"f\": true, "
                    "\"g\": null, \"h\": \"9.90\", \"i\": -0.0}";
  cJSON *root = moe8__json_parse_keeping_numbers(txt, strlen(txt));
  assert_non_null(root);
  cJSON_AddNumberToObject(root, "n", 2.0);
  char *out = cJSON_PrintUnformatted(root);
  assert_non_null(out);
  static const char *const want[] = {"[1.0,-2e-3,{\"c\":3.50,\"d\":[0.0,7]}]", "\"e\":1E+5", "\"i\":-0.0", "\"a\":\"x\\\"1.0 2\"",
                                     "\"h\":\"9.90\"", "\"n\":2"};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
    if (!strstr(out, want[i])) TU_FAIL("keeping numbers: %s not in %s", want[i], out);
  cJSON *back = cJSON_Parse(out); /* and it is JSON */
  assert_non_null(back);
  assert_true(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(back, "b"), 2), "c")->valuedouble == 3.5);
  cJSON_Delete(back);
  free(out);
  cJSON_Delete(root);
  assert_null(moe8__json_parse_keeping_numbers("{\"a\": 1.0", 10));
}

/* GPT-OSS through moe8 quantize (FP8, int8, MXFP4; docs/files.md): each
** file's run gives the bytes of the input's run under the rules, for a
** float input and for GPT-OSS's own MXFP4 layout (which an mxfp4 rule
** writes, gate and up rows alternating, and then keeps tensor for tensor). */
static void test_cli_gpt_oss_quantize(void **state) {
  (void)state;
  const char *M = moe8_bin();
  char cfg[600], src[600], x[600];
  snprintf(cfg, sizeof cfg, "%s/gcfg.json", g_dir);
  snprintf(src, sizeof src, "%s/gmodel", g_dir);
  snprintf(x, sizeof x, "%s/gx.npy", g_dir);
  write_text(cfg, "{\"model_type\": \"gpt_oss\", \"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_local_experts\": 8,"
                  " \"num_experts_per_tok\": 2, \"intermediate_size\": 96, \"swiglu_limit\": 7.0}");
  if (sh("'%s' init --config '%s' --out '%s' --dtype bf16", M, cfg, src) != 0) TU_FAIL("init: %s", g_err);
  const int64_t T = 11, D = 64, shape[2] = {T, D};
  float xv[11 * 64];
  tu_rng_reset(9);
  tu_fill_normal(xv, (size_t)(T * D), 1.0f);
  assert_int_equal(moe8_npy_write(x, MOE8_FDT_F32, 2, shape, xv), MOE8_OK);
  static const char *const rules[4][2] = {
    {"fp8", "{\"rules\": [{\"module_path\": \"experts\", \"weight_qtype\": \"float8_e4m3fn\", \"act_qtype\": \"float8_e4m3fn\", \"tile_size\": 32}]}"},
    {"i8", "{\"rules\": [{\"module_path\": \"experts\", \"weight_qtype\": \"int8\", \"act_qtype\": \"int8\"}]}"},
    {"mx", "{\"rules\": [{\"module_path\": \"experts\", \"weight_qtype\": \"mxfp4\", \"act_qtype\": \"int8\", \"tile_size\": 32}]}"},
    {"mxf", "{\"rules\": [{\"module_path\": \"experts\", \"weight_qtype\": \"mxfp4\"}]}"},
  };
  /* in: the float model, then GPT-OSS's MXFP4 file that the exact mxfp4 rule wrote */
  for (int in = 0; in < 2; in++) {
    char from[600];
    snprintf(from, sizeof from, in ? "%s/gq_mxf" : "%s", in ? g_dir : src);
    for (int r = 0; r < 4; r++) {
      char rp[600];
      snprintf(rp, sizeof rp, "%s/grules_%s.json", g_dir, rules[r][0]);
      write_text(rp, rules[r][1]);
      if (sh("rm -rf '%s/gq_%d%s' && '%s' quantize '%s' '%s/gq_%d%s' --rules '%s'", g_dir, in, rules[r][0], M, from, g_dir, in, rules[r][0], rp) != 0)
        TU_FAIL("in %d rules %s: quantize: %s", in, rules[r][0], g_err);
      for (int l = 0; l < 2; l++) {
        if (sh("'%s' run --model '%s/gq_%d%s' --input '%s' --output '%s/gy1.npy' --layer %d", M, g_dir, in, rules[r][0], x, g_dir, l) != 0)
          TU_FAIL("in %d rules %s layer %d: run of the file: %s", in, rules[r][0], l, g_err);
        if (sh("'%s' run --model '%s' --rules '%s' --input '%s' --output '%s/gy2.npy' --layer %d", M, from, rp, x, g_dir, l) != 0)
          TU_FAIL("in %d rules %s layer %d: run of the input: %s", in, rules[r][0], l, g_err);
        if (sh("cmp '%s/gy1.npy' '%s/gy2.npy'", g_dir, g_dir) != 0) TU_FAIL("in %d rules %s layer %d: the bytes differ", in, rules[r][0], l);
      }
    }
    if (!in && sh("cp -r '%s/gq_0mxf' '%s/gq_mxf'", g_dir, g_dir) != 0) TU_FAIL("cp: %s", g_err);
  }
  /* config.json rewritten by init and quantize keeps its numbers as
  ** written: transformers' configuration classes refuse 7 where they
  ** declare a float (swiglu_limit) */
  for (int i = 0; i < 2; i++) {
    char cp[700];
    snprintf(cp, sizeof cp, i ? "%s/gq_0fp8/config.json" : "%s/config.json", i ? g_dir : src);
    size_t cl;
    unsigned char *ct = read_all(cp, &cl);
    ct[cl] = 0;
    if (!strstr((const char *)ct, "7.0")) TU_FAIL("%s: swiglu_limit 7.0 rewritten as %s", cp, strstr((const char *)ct, "swiglu_limit"));
    free(ct);
  }
  /* The MXFP4 input under an mxfp4 rule: its tensors kept byte for byte. */
  char a[600], b[600];
  snprintf(a, sizeof a, "%s/gq_mxf", g_dir);
  snprintf(b, sizeof b, "%s/gq_1mx", g_dir);
  moe8_model *ma, *mb;
  assert_int_equal(moe8_model_open(a, &ma), MOE8_OK);
  assert_int_equal(moe8_model_open(b, &mb), MOE8_OK);
  assert_int_equal(moe8_model_tensor_count(ma), moe8_model_tensor_count(mb));
  for (size_t i = 0; i < moe8_model_tensor_count(ma); i++) {
    const moe8_tensor_view *ta = moe8_model_tensor_at(ma, i), *tb = moe8_model_find(mb, ta->name);
    if (!tb || tb->nbytes != ta->nbytes || memcmp(ta->data, tb->data, ta->nbytes) != 0) TU_FAIL("tensor %s not kept", ta->name);
  }
  assert_string_equal(moe8_model_format(mb, 0), "mxfp4 (E2M1 values, E8M0 scales per 32 along K)");
  moe8_model_close(ma);
  moe8_model_close(mb);
}

static void test_cli_files(void **state) {
  (void)state;
  const char *M = moe8_bin();
  char cfg[600], src[600], x[600], xnan[600], rules[600];
  snprintf(cfg, sizeof cfg, "%s/cfg.json", g_dir);
  snprintf(src, sizeof src, "%s/model", g_dir);
  snprintf(x, sizeof x, "%s/x.npy", g_dir);
  snprintf(xnan, sizeof xnan, "%s/xnan.npy", g_dir);
  snprintf(rules, sizeof rules, "%s/rules.json", g_dir);
  /* D = 200 and F = 136 give partial 128-blocks in both directions. */
  write_text(cfg, "{\"model_type\": \"qwen3_moe\", \"num_experts\": 4, \"num_experts_per_tok\": 2, \"hidden_size\": 200,"
                  " \"moe_intermediate_size\": 136, \"num_hidden_layers\": 1}");
  write_text(rules, "{\"rules\": [{\"module_path\": \"experts\", \"weight_qtype\": \"float8_e4m3fn\", \"act_qtype\": \"float8_e4m3fn\", \"tile_size\": 128}]}");
  if (sh("'%s' init --config '%s' --out '%s' --dtype bf16", M, cfg, src) != 0) TU_FAIL("init: %s", g_err);
  const int64_t T = 9, D = 200, shape[2] = {T, D};
  float xv[9 * 200];
  tu_rng_reset(5);
  tu_fill_normal(xv, (size_t)(T * D), 1.0f);
  assert_int_equal(moe8_npy_write(x, MOE8_FDT_F32, 2, shape, xv), MOE8_OK);
  xv[3 * D + 7] = NAN;
  assert_int_equal(moe8_npy_write(xnan, MOE8_FDT_F32, 2, shape, xv), MOE8_OK);

  /* 1. quantize (moe8 format) then run == the prepared fused path on the original weights. */
  assert_int_equal(sh("'%s' quantize '%s' '%s/q8' --rules '%s'", M, src, g_dir, rules), 0);
  assert_int_equal(sh("'%s' run --model '%s' --input '%s' --output '%s/y_orig.npy' --rules '%s'", M, src, x, g_dir, rules), 0);
  assert_int_equal(sh("'%s' run --model '%s/q8' --input '%s' --output '%s/y_q8.npy' --rules '%s'", M, g_dir, x, g_dir, rules), 0);
  assert_int_equal(sh("cmp '%s/y_orig.npy' '%s/y_q8.npy'", g_dir, g_dir), 0);

  /* ... and under mpirun the expert-parallel run writes the same bytes. */
  if (moe8_has_mpi() && sh("command -v mpirun") == 0) {
    assert_int_equal(sh("OMP_NUM_THREADS=1 ASAN_OPTIONS=detect_leaks=0 OMPI_MCA_btl_vader_single_copy_mechanism=none mpirun "
                        "--allow-run-as-root --oversubscribe -n 2 '%s' run --model '%s/q8' --input '%s' --output '%s/y_ep.npy'",
                        M, g_dir, x, g_dir), 0);
    assert_int_equal(sh("cmp '%s/y_q8.npy' '%s/y_ep.npy'", g_dir, g_dir), 0);
  }

  /* 2. DeepSeek format: exact names, dtypes, shapes; w ≈ q·scale_inv per block. */
  assert_int_equal(sh("'%s' quantize '%s' '%s/ds' --rules '%s' --format deepseek", M, src, g_dir, rules), 0);
  char p[600];
  snprintf(p, sizeof p, "%s/ds", g_dir);
  moe8_model *ds, *orig;
  assert_int_equal(moe8_model_open(p, &ds), MOE8_OK);
  assert_int_equal(moe8_model_open(src, &orig), MOE8_OK);
  assert_true(moe8_model_config(ds)->fp8);
  const char *proj[3] = {"gate_proj", "up_proj", "down_proj"};
  for (int e = 0; e < 4; e++)
    for (int w = 0; w < 3; w++) {
      const int64_t N = w == 2 ? 200 : 136, K = w == 2 ? 136 : 200;
      char n[256];
      snprintf(n, sizeof n, "model.layers.0.mlp.experts.%d.%s.weight", e, proj[w]);
      const moe8_tensor_view *q = moe8_model_find(ds, n), *o = moe8_model_find(orig, n);
      snprintf(n, sizeof n, "model.layers.0.mlp.experts.%d.%s.weight_scale_inv", e, proj[w]);
      const moe8_tensor_view *s = moe8_model_find(ds, n);
      assert_non_null(q); assert_non_null(s); assert_non_null(o);
      assert_int_equal(q->dtype, MOE8_FDT_F8_E4M3);
      assert_int_equal(s->dtype, MOE8_FDT_F32);
      assert_true(q->ndim == 2 && q->shape[0] == N && q->shape[1] == K);
      assert_true(s->ndim == 2 && s->shape[0] == 2 && s->shape[1] == 2);
      float *wf = malloc(sizeof(float) * (size_t)(N * K)), sc[4];
      assert_int_equal(moe8_file_to_f32(wf, o->data, o->dtype, (size_t)(N * K)), MOE8_OK);
      memcpy(sc, s->data, 16);
      for (int bn = 0; bn < 2; bn++)
        for (int bk = 0; bk < 2; bk++) {
          float amax = 0;
          for (int64_t r = bn * 128; r < N && r < (bn + 1) * 128; r++)
            for (int64_t c = bk * 128; c < K && c < (bk + 1) * 128; c++) amax = fmaxf(amax, fabsf(wf[r * K + c]));
          for (int64_t r = bn * 128; r < N && r < (bn + 1) * 128; r++)
            for (int64_t c = bk * 128; c < K && c < (bk + 1) * 128; c++) {
              const float dq = moe8_f8e4m3_to_f32(((const uint8_t *)q->data)[r * K + c]) * sc[bn * 2 + bk];
              if (!(fabsf(dq - wf[r * K + c]) <= amax / 16.0f * (1 + 1e-6f))) TU_FAIL("%s block (%d,%d): %g vs %g", n, bn, bk, dq, wf[r * K + c]);
            }
        }
      free(wf);
    }
  moe8_model_close(ds);
  moe8_model_close(orig);
  /* ... and it runs as it is. */
  assert_int_equal(sh("'%s' run --model '%s/ds' --input '%s' --output '%s/y_ds.npy'", M, g_dir, x, g_dir), 0);

  /* 3. The bad-input matrix: a message naming the file and what is wrong,
  ** exit 1, no output file. */
  char bad[600];
  snprintf(bad, sizeof bad, "%s/bad", g_dir);
  static const struct { const char *what; void (*edit)(cJSON *); long trunc; int hlen; const char *want; } cases[] = {
    {"truncated", NULL, 100, 0, "runs past the end"},
    {"header length past the end", NULL, 0, 1, "runs past the end"},
    {"offsets out of range", e_range, 0, 0, "outside the"},
    {"overlapping", e_overlap, 0, 0, "overlap"},
    {"byte size vs dtype x shape", e_size, 0, 0, "needs"},
    {"unknown dtype", e_dtype, 0, 0, "unknown dtype 'F33'"},
    {"missing expert tensor", e_missing, 0, 0, "missing tensor '" T_UP3 "'"},
    {"wrong shape", e_shape, 0, 0, "is 2-D [200, 136], the config says 2-D [136, 200]"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    corrupt(src, bad, cases[i].edit, cases[i].trunc, cases[i].hlen);
    const int rc = sh("'%s' run --model '%s' --input '%s' --output '%s/out.npy'", M, bad, x, g_dir);
    if (rc != 1) TU_FAIL("%s: exit %d, want 1 (%s)", cases[i].what, rc, g_err);
    if (!strstr(g_err, cases[i].want) || (!strstr(g_err, "model.safetensors") && !strstr(g_err, "tensor '")))
      TU_FAIL("%s: message \"%s\" lacks \"%s\" or the file/tensor", cases[i].what, g_err, cases[i].want);
    assert_int_not_equal(sh("test -e '%s/out.npy' || test -e '%s/out.npy.tmp'", g_dir, g_dir), 0);
    assert_int_equal(sh("'%s' quantize '%s' '%s/qbad' --rules '%s'", M, bad, g_dir, rules), 1);
    assert_int_not_equal(sh("test -e '%s/qbad/model.safetensors'", g_dir), 0);
  }
  /* Malformed config.json; E not matching the config; NaN in the input. */
  corrupt(src, bad, NULL, 0, 0);
  char c2[700];
  snprintf(c2, sizeof c2, "%s/config.json", bad);
  write_text(c2, "{\"model_type\": \"qwen3_moe\", \"num_experts\": 4,");
  assert_int_equal(sh("'%s' run --model '%s' --input '%s' --output '%s/out.npy'", M, bad, x, g_dir), 1);
  assert_non_null(strstr(g_err, "config.json: malformed JSON"));
  write_text(c2, "{\"model_type\": \"qwen3_moe\", \"num_experts\": 8, \"num_experts_per_tok\": 2, \"hidden_size\": 200,"
                 " \"moe_intermediate_size\": 136, \"num_hidden_layers\": 1}");
  assert_int_equal(sh("'%s' run --model '%s' --input '%s' --output '%s/out.npy'", M, bad, x, g_dir), 1);
  assert_non_null(strstr(g_err, "model.layers.0.mlp.gate.weight' is 2-D [4, 200], the config says 2-D [8, 200]"));
  assert_int_equal(sh("'%s' run --model '%s' --input '%s' --output '%s/out.npy'", M, src, xnan, g_dir), 1);
  assert_non_null(strstr(g_err, "xnan.npy: 1 non-finite value(s), first at [3, 7]"));
  assert_int_not_equal(sh("test -e '%s/out.npy'", g_dir), 0);
  /* info on the good model names the architecture and the format. */
  assert_int_equal(sh("{ '%s' info '%s/ds' 1>&2; }", M, g_dir), 0);
  assert_non_null(strstr(g_err, "architecture: qwen3_moe"));
  assert_non_null(strstr(g_err, "deepseek f8e4m3 128x128 blocks"));
}

/* A directory on another file system than g_dir (for the symlink case);
** NULL when there is none. */
static const char *other_fs_dir(void) {
  static char d[256];
  struct stat a, b;
  const char *cand[] = {"/dev/shm", "/run", "/var/tmp", "."};
  if (stat(g_dir, &a) != 0) return NULL;
  for (size_t i = 0; i < sizeof cand / sizeof cand[0]; i++) {
    snprintf(d, sizeof d, "%s/moe8-test-io-fs-XXXXXX", cand[i]);
    if (stat(cand[i], &b) != 0 || b.st_dev == a.st_dev || !mkdtemp(d)) continue;
    return d;
  }
  return NULL;
}

/* The mode bits of a path (-1 if it does not exist). */
static int mode_of(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0 ? (int)(sb.st_mode & 07777) : -1;
}

/* moe8 quantize's output directory (docs/files.md, "The output
** directory"): other files are never touched (a *.safetensors that is not
** the old model's is refused, before anything is written); the directory
** gets a plain mkdir's mode, or keeps its own; --force through a symlink
** to another file system swaps on the target's file system; a failed swap
** puts the old model back and says so; an interrupted run's temporary
** directory is removed (or named) by the next run. */
static void test_quantize_output_dir(void **state) {
  (void)state;
  const char *M = moe8_bin();
  char cfg[600], src[600], rules[600], q[600];
  snprintf(cfg, sizeof cfg, "%s/qcfg.json", g_dir);
  snprintf(src, sizeof src, "%s/qmodel", g_dir);
  snprintf(rules, sizeof rules, "%s/qrules.json", g_dir);
  snprintf(q, sizeof q, "%s/qout", g_dir);
  write_text(cfg, "{\"model_type\": \"qwen3_moe\", \"num_experts\": 4, \"num_experts_per_tok\": 2, \"hidden_size\": 64,"
                  " \"moe_intermediate_size\": 32, \"num_hidden_layers\": 1}");
  write_text(rules, "{\"rules\": [{\"module_path\": \".*\", \"weight_qtype\": \"float8_e4m3fn\", \"tile_size\": 32}]}");
  if (sh("'%s' init --config '%s' --out '%s'", M, cfg, src) != 0) TU_FAIL("init: %s", g_err);

  /* 1. an adapter beside: refused (with and without --force), untouched */
  assert_int_equal(sh("mkdir '%s' && echo adapter > '%s/adapter_model.safetensors' && echo keep > '%s/README.md'", q, q, q), 0);
  for (int force = 0; force < 2; force++) {
    if (sh("'%s' quantize '%s' '%s' --rules '%s'%s", M, src, q, rules, force ? " --force" : "") != 1) TU_FAIL("adapter beside: %s", g_err);
    if (!strstr(g_err, "adapter_model.safetensors is not a file of the model")) TU_FAIL("adapter beside: message \"%s\"", g_err);
    assert_int_equal(sh("test \"$(cat '%s/adapter_model.safetensors')\" = adapter && test ! -e '%s/config.json'", q, q), 0);
    assert_int_not_equal(sh("ls -a '%s' | grep -q 'moe8-new\\|moe8-old'", g_dir), 0);
  }
  /* ... moved away, the model is written and the README kept */
  assert_int_equal(sh("rm '%s/adapter_model.safetensors'", q), 0);
  if (sh("'%s' quantize '%s' '%s' --rules '%s'", M, src, q, rules) != 0) TU_FAIL("quantize beside a README: %s", g_err);
  assert_int_equal(sh("test \"$(cat '%s/README.md')\" = keep && test -e '%s/model.safetensors'", q, q), 0);

  /* 2. the directory's mode: a plain mkdir's under the umask, or its own */
  static const struct { const char *umask; int mode; } um[] = {{"022", 0755}, {"077", 0700}, {"002", 0775}};
  for (size_t i = 0; i < sizeof um / sizeof um[0]; i++) {
    assert_int_equal(sh("rm -rf '%s'", q), 0);
    if (sh("umask %s && '%s' quantize '%s' '%s' --rules '%s'", um[i].umask, M, src, q, rules) != 0) TU_FAIL("umask %s: %s", um[i].umask, g_err);
    if (mode_of(q) != um[i].mode) TU_FAIL("umask %s: the new directory has mode %o, want %o", um[i].umask, mode_of(q), um[i].mode);
    if (sh("umask %s && '%s' quantize '%s' '%s' --rules '%s' --force", um[i].umask, M, src, q, rules) != 0) TU_FAIL("--force: %s", g_err);
    if (mode_of(q) != um[i].mode) TU_FAIL("umask %s, --force: mode %o, want %o", um[i].umask, mode_of(q), um[i].mode);
  }
  assert_int_equal(chmod(q, 0750), 0);
  if (sh("umask 022 && '%s' quantize '%s' '%s' --rules '%s' --force", M, src, q, rules) != 0) TU_FAIL("--force 0750: %s", g_err);
  if (mode_of(q) != 0750) TU_FAIL("--force over a 0750 directory: mode %o, want it kept", mode_of(q));

  /* 3a. a failed swap (the two-rename path's second rename): the old model
  ** back in place, unchanged, the message says so, nothing left beside */
  assert_int_equal(sh("cat '%s/config.json' '%s/model.safetensors' | cksum > '%s/sum0'", q, q, g_dir), 0);
  if (sh("MOE8_TEST_QUANTIZE_FAIL=swap '%s' quantize '%s' '%s' --rules '%s' --force", M, src, q, rules) != 1) TU_FAIL("failed swap: %s", g_err);
  if (!strstr(g_err, "the old model is back in")) TU_FAIL("failed swap: message \"%s\"", g_err);
  assert_int_equal(sh("cat '%s/config.json' '%s/model.safetensors' | cksum | cmp -s - '%s/sum0'", q, q, g_dir), 0);
  assert_int_not_equal(sh("ls -a '%s' | grep -q 'moe8-new\\|moe8-old'", g_dir), 0);

  /* 3b. an interrupted run's temporary directories: one holding only a
  ** model is removed, one holding other files is named and kept; a live
  ** process's is left alone */
  const pid_t child = fork();
  if (child == 0) _exit(0);
  assert_true(child > 0);
  waitpid(child, NULL, 0);
  char st1[700], st2[700], st3[700];
  snprintf(st1, sizeof st1, "%s.moe8-new-%ld-abcdef", q, (long)child);
  snprintf(st2, sizeof st2, "%s.moe8-new-%ld-ghijkl", q, (long)child);
  snprintf(st3, sizeof st3, "%s.moe8-new-%ld-mnopqr", q, (long)getppid());
  assert_int_equal(sh("mkdir '%s' '%s' '%s' && : > '%s/model.safetensors' && : > '%s/config.json' && echo mine > '%s/notes.txt' && "
                      ": > '%s/model.safetensors'", st1, st2, st3, st1, st1, st2, st3), 0);
  if (sh("{ '%s' quantize '%s' '%s' --rules '%s' --force 1>&2; }", M, src, q, rules) != 0) TU_FAIL("after a killed run: %s", g_err);
  if (!strstr(g_err, "removed") || !strstr(g_err, "-abcdef")) TU_FAIL("stale directory not reported removed: \"%s\"", g_err);
  if (!strstr(g_err, "-ghijkl was left by an interrupted run")) TU_FAIL("stale directory with other files not named: \"%s\"", g_err);
  assert_int_not_equal(sh("test -e '%s'", st1), 0);
  assert_int_equal(sh("test \"$(cat '%s/notes.txt')\" = mine && test -e '%s/model.safetensors'", st2, st3), 0);
  assert_int_equal(sh("rm -rf '%s' '%s'", st2, st3), 0);

  /* 3c. --force through a symlink to another file system: swapped on the
  ** target's, the link kept, nothing left on either side */
  const char *other = other_fs_dir();
  if (!other) {
    printf("notice: no second file system here: the cross-file-system --force case is skipped\n");
    return;
  }
  char tgt[600], link[600];
  snprintf(tgt, sizeof tgt, "%s/tgt", other);
  snprintf(link, sizeof link, "%s/qlink", g_dir);
  assert_int_equal(sh("cp -r '%s' '%s' && ln -s '%s' '%s'", src, tgt, tgt, link), 0);
  if (sh("'%s' quantize '%s' '%s' --rules '%s' --force", M, src, link, rules) != 0) TU_FAIL("--force through a symlink: %s", g_err);
  assert_int_equal(sh("test -L '%s' && grep -q moe8_quantization '%s/config.json'", link, tgt), 0);
  assert_int_not_equal(sh("ls -a '%s' '%s' | grep -q 'moe8-new\\|moe8-old'", g_dir, other), 0);
  if (sh("MOE8_TEST_QUANTIZE_FAIL=swap '%s' quantize '%s' '%s' --rules '%s' --force", M, src, link, rules) != 1) TU_FAIL("swap: %s", g_err);
  if (!strstr(g_err, "the old model is back in")) TU_FAIL("failed swap through a link: message \"%s\"", g_err);
  assert_int_equal(sh("test -L '%s' && test -e '%s/config.json'", link, link), 0);
  assert_int_equal(sh("rm -rf '%s'", other), 0);
}

/* moe8's file records the rules it was made under (config.json
** moe8_quantization.rules): `moe8 run` on it without rules writes the
** bytes of `moe8 run --rules R` on the input, for weight-only FP8 and MXFP8,
** int8 weights and activations, calibrations (qwix, clip, pow2: the shared
** expert is quantized at load), per-layer rules with the sort's
** quantization, an activation-only rule (no layer quantized), and MXFP4
** with and without int8 activations; every layer, a shared expert. */
static void test_quantize_records_rules(void **state) {
  (void)state;
  const char *M = moe8_bin();
  char cfg[600], src[600], rules[600], q[600], x[600];
  snprintf(cfg, sizeof cfg, "%s/rcfg.json", g_dir);
  snprintf(src, sizeof src, "%s/rmodel", g_dir);
  snprintf(rules, sizeof rules, "%s/rrules.json", g_dir);
  snprintf(q, sizeof q, "%s/rq", g_dir);
  snprintf(x, sizeof x, "%s/rx.npy", g_dir);
  write_text(cfg, "{\"model_type\": \"qwen2_moe\", \"num_experts\": 4, \"num_experts_per_tok\": 2, \"hidden_size\": 64,"
                  " \"moe_intermediate_size\": 32, \"shared_expert_intermediate_size\": 32, \"num_hidden_layers\": 2}");
  if (sh("'%s' init --config '%s' --out '%s'", M, cfg, src) != 0) TU_FAIL("init: %s", g_err);
  const int64_t T = 7, shape[2] = {T, 64};
  float xv[7 * 64];
  tu_rng_reset(11);
  tu_fill_normal(xv, (size_t)(T * 64), 1.0f);
  assert_int_equal(moe8_npy_write(x, MOE8_FDT_F32, 2, shape, xv), MOE8_OK);
  static const char *sets[] = {
    "{\"rules\": [{\"module_path\": \".*\", \"weight_qtype\": \"float8_e4m3fn\", \"tile_size\": 32}]}",
    "{\"rules\": [{\"module_path\": \".*\", \"weight_qtype\": \"int8\", \"act_qtype\": \"int8\"}]}",
    "{\"rules\": [{\"module_path\": \".*\", \"weight_qtype\": \"mxfp8\"}]}",
    "{\"rules\": [{\"module_path\": \".*\", \"weight_qtype\": \"int8\", \"weight_calibration_method\": \"qwix\", \"act_qtype\": \"int8\", "
    "\"act_calibration_method\": \"absmax,0.9\", \"tile_size\": 32}]}",
    "{\"rules\": [{\"module_path\": \".*\", \"weight_qtype\": \"float8_e4m3fn\", \"weight_calibration_method\": \"absmax_pow2,0.5\", "
    "\"tile_size\": 16}]}",
    "{\"quantize_before_ep_all_gather\": true, \"rules\": [{\"module_path\": \"layers\\\\.1\\\\.\", \"weight_qtype\": \"float8_e4m3fn\", "
    "\"act_qtype\": \"float8_e4m3fn\", \"tile_size\": 32}, {\"module_path\": \".*\", \"act_qtype\": \"int8\"}]}",
    "{\"rules\": [{\"module_path\": \".*\", \"act_qtype\": \"float8_e4m3fn\"}]}",
    "{\"rules\": [{\"module_path\": \".*\", \"weight_qtype\": \"mxfp4\", \"act_qtype\": \"int8\", \"tile_size\": 32}]}",
    "{\"rules\": [{\"module_path\": \".*\", \"weight_qtype\": \"mxfp4\"}]}",
  };
  for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++) {
    write_text(rules, sets[i]);
    assert_int_equal(sh("rm -rf '%s'", q), 0);
    if (sh("'%s' quantize '%s' '%s' --rules '%s'", M, src, q, rules) != 0) TU_FAIL("rules %zu: quantize: %s", i, g_err);
    char cp[700];
    snprintf(cp, sizeof cp, "%s/config.json", q);
    size_t len;
    unsigned char *txt = read_all(cp, &len);
    cJSON *root = cJSON_ParseWithLength((const char *)txt, len);
    free(txt);
    const cJSON *mq = cJSON_GetObjectItemCaseSensitive(root, "moe8_quantization");
    if (!cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(mq, "rules"))) TU_FAIL("rules %zu: config.json records no moe8_quantization.rules", i);
    cJSON_Delete(root);
    for (int l = 0; l < 2; l++) {
      if (sh("'%s' run --model '%s' --input '%s' --output '%s/ry1.npy' --layer %d", M, q, x, g_dir, l) != 0) TU_FAIL("rules %zu: run: %s", i, g_err);
      if (sh("'%s' run --model '%s' --input '%s' --output '%s/ry2.npy' --layer %d --rules '%s'", M, src, x, g_dir, l, rules) != 0)
        TU_FAIL("rules %zu: run --rules: %s", i, g_err);
      if (sh("cmp '%s/ry1.npy' '%s/ry2.npy'", g_dir, g_dir) != 0)
        TU_FAIL("rules %zu (%s), layer %d: the file's run differs from the input's run under its rules", i, sets[i], l);
    }
  }
}

/* moe8's file records its tile beside the scales (__metadata__
** moe8.tile_size): a config.json whose moe8_quantization.tile_size was
** edited to another tile of the same block count (64 -> 100 on K = 128
** and 64) is refused naming tile_size and the tensor, with and without
** rules; rules asking for two tiles in one file are refused. */
static void test_quantize_tile_recorded(void **state) {
  (void)state;
  const char *M = moe8_bin();
  char cfg[600], src[600], rules[600], q[600], x[600], cp[700];
  snprintf(cfg, sizeof cfg, "%s/tcfg.json", g_dir);
  snprintf(src, sizeof src, "%s/tmodel", g_dir);
  snprintf(rules, sizeof rules, "%s/trules.json", g_dir);
  snprintf(q, sizeof q, "%s/tq", g_dir);
  snprintf(x, sizeof x, "%s/tx.npy", g_dir);
  write_text(cfg, "{\"model_type\": \"qwen3_moe\", \"num_experts\": 4, \"num_experts_per_tok\": 2, \"hidden_size\": 128,"
                  " \"moe_intermediate_size\": 64, \"num_hidden_layers\": 2}");
  write_text(rules, "{\"rules\": [{\"module_path\": \".*\", \"weight_qtype\": \"float8_e4m3fn\", \"tile_size\": 64}]}");
  if (sh("'%s' init --config '%s' --out '%s'", M, cfg, src) != 0) TU_FAIL("init: %s", g_err);
  const int64_t T = 5, shape[2] = {T, 128};
  float xv[5 * 128];
  tu_rng_reset(13);
  tu_fill_normal(xv, (size_t)(T * 128), 1.0f);
  assert_int_equal(moe8_npy_write(x, MOE8_FDT_F32, 2, shape, xv), MOE8_OK);
  if (sh("'%s' quantize '%s' '%s' --rules '%s'", M, src, q, rules) != 0) TU_FAIL("quantize: %s", g_err);
  if (sh("'%s' run --model '%s' --input '%s' --output '%s/ty.npy'", M, q, x, g_dir) != 0) TU_FAIL("run: %s", g_err);
  /* tile_size 64 -> 100 in config.json: 2 and 1 K blocks either way */
  snprintf(cp, sizeof cp, "%s/config.json", q);
  size_t len;
  unsigned char *txt = read_all(cp, &len);
  cJSON *root = cJSON_ParseWithLength((const char *)txt, len);
  free(txt);
  cJSON *mq = cJSON_GetObjectItemCaseSensitive(root, "moe8_quantization");
  assert_non_null(cJSON_GetObjectItemCaseSensitive(mq, "tile_size"));
  cJSON_ReplaceItemInObjectCaseSensitive(mq, "tile_size", cJSON_CreateNumber(100));
  char *out = cJSON_Print(root);
  write_text(cp, out);
  free(out);
  cJSON_Delete(root);
  for (int with_rules = 0; with_rules < 2; with_rules++) {
    assert_int_equal(sh("rm -f '%s/ty2.npy'", g_dir), 0);
    const int rc = sh("'%s' run --model '%s' --input '%s' --output '%s/ty2.npy'%s%s%s", M, q, x, g_dir, with_rules ? " --rules '" : "",
                      with_rules ? rules : "", with_rules ? "'" : "");
    if (rc != 1) TU_FAIL("edited tile_size%s: exit %d, want 1 (%s)", with_rules ? " with rules" : "", rc, g_err);
    if (!strstr(g_err, "model.layers.0.mlp.experts.gate_up_proj.scale' was quantized with tile_size 64") ||
        !strstr(g_err, "moe8_quantization.tile_size is 100"))
      TU_FAIL("edited tile_size: message \"%s\"", g_err);
    assert_int_not_equal(sh("test -e '%s/ty2.npy'", g_dir), 0);
  }
  /* two tiles in one file: refused, nothing written */
  write_text(rules, "{\"rules\": [{\"module_path\": \"layers\\\\.0\\\\.\", \"weight_qtype\": \"float8_e4m3fn\", \"tile_size\": 64},"
                    " {\"module_path\": \".*\", \"weight_qtype\": \"float8_e4m3fn\", \"tile_size\": 32}]}");
  if (sh("'%s' quantize '%s' '%s/tq2' --rules '%s'", M, src, g_dir, rules) != 1) TU_FAIL("two tiles: %s", g_err);
  if (!strstr(g_err, "tile_size 32 on model.layers.1.mlp.experts and 64 on an earlier layer")) TU_FAIL("two tiles: message \"%s\"", g_err);
  assert_int_not_equal(sh("test -e '%s/tq2'", g_dir), 0);
}

/* An mxfp4 weight rule refuses what its quantizer does not honour, naming
** the rule file's line and the key (hardening class: mxfp4 rule options). */
static void test_mxfp4_rule_options(void **state) {
  (void)state;
  static const struct { const char *fields; const char *want; } bad[] = {
    {"\"weight_calibration_method\": \"absmax,0.5\"", "r.json:3:5: rules[0].weight_calibration_method: weight_qtype mxfp4"},
    {"\"weight_calibration_method\": \"absmax_pow2\"", "r.json:3:5: rules[0].weight_calibration_method"},
    {"\"weight_calibration_method\": \"qwix\"", "r.json:3:5: rules[0].weight_calibration_method"},
    {"\"tile_size\": 64", "r.json:3:5: rules[0].tile_size: weight_qtype mxfp4"},
    {"\"act_qtype\": \"int8\", \"tile_size\": 48", "rules[0].tile_size: weight_qtype mxfp4 with int8"},
    {"\"act_qtype\": \"float8_e4m3fn\"", "r.json:3:5: rules[0].act_qtype: weight_qtype mxfp4"},
  };
  char txt[512];
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    snprintf(txt, sizeof txt, "{\"rules\": [\n  {\"module_path\": \".*\", \"weight_qtype\": \"mxfp4\",\n    %s}]}", bad[i].fields);
    moe8_rules *r = NULL;
    assert_int_equal(moe8_rules_parse(txt, strlen(txt), "r.json", &r), MOE8_ERR_PARSE);
    assert_null(r);
    if (!strstr(moe8_last_error(), bad[i].want)) TU_FAIL("case %zu: \"%s\" lacks \"%s\"", i, moe8_last_error(), bad[i].want);
  }
  static const char *good[] = {"\"tile_size\": 32", "\"weight_calibration_method\": \"mx\"", "\"act_qtype\": \"int8\", \"tile_size\": 64",
                               "\"act_qtype\": \"int8\"", "\"tile_size\": null"};
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    snprintf(txt, sizeof txt, "{\"rules\": [\n  {\"module_path\": \".*\", \"weight_qtype\": \"mxfp4\",\n    %s}]}", good[i]);
    moe8_rules *r = NULL;
    if (moe8_rules_parse(txt, strlen(txt), "r.json", &r) != MOE8_OK) TU_FAIL("good case %zu refused: %s", i, moe8_last_error());
    moe8_rules_destroy(r);
  }
}

/* The families that are rows of data (docs/models.md): their classes'
** defaults, key names with aliases, mlp_layer_types, the multimodal
** wrappers' text_config, and the families refused with their reason. */
static void test_family_rows(void **state) {
  (void)state;
  moe8_hf_config c;
#define PARSE(js) moe8_hf_config_parse((js), strlen(js), "config.json", &c)
  assert_int_equal(PARSE("{\"model_type\":\"kimi_linear\"}"), MOE8_OK);
  assert_true(c.arch == MOE8_ARCH_DEEPSEEK_V3 && c.layer.num_experts == 256 && c.layer.top_k == 8 && c.layer.ffn == 1024 &&
              c.layer.shared_ffn == 1024 && c.layer.norm_topk_prob && fabsf(c.layer.routed_scaling_factor - 2.446f) < 1e-6f);
  assert_int_equal(moe8_hf_config_first_moe_layer(&c), 1); /* first_k_dense_replace 1 when mlp_layer_types is absent */
  assert_int_equal(PARSE("{\"model_type\":\"kimi_linear\",\"num_experts\":64,\"num_experts_per_token\":4,\"num_shared_experts\":2,"
                         "\"num_expert_group\":4,\"topk_group\":2,\"moe_renormalize\":false,\"num_hidden_layers\":3,"
                         "\"mlp_layer_types\":[\"sparse\",\"dense\",\"sparse\"]}"), MOE8_OK);
  assert_true(c.layer.num_experts == 64 && c.layer.top_k == 4 && c.layer.shared_ffn == 2048 && c.layer.n_group == 4 &&
              !c.layer.norm_topk_prob);
  assert_int_equal(moe8_hf_config_check_moe_layer(&c, 0), MOE8_OK);
  assert_int_equal(moe8_hf_config_check_moe_layer(&c, 1), MOE8_ERR_INVALID_ARG);
  assert_non_null(strstr(moe8_last_error(), "mlp_layer_types[1]"));
  /* a key and its alias that disagree; a bad list */
  assert_int_equal(PARSE("{\"model_type\":\"kimi_linear\",\"num_experts_per_token\":4,\"num_experts_per_tok\":6}"), MOE8_ERR_PARSE);
  assert_non_null(strstr(moe8_last_error(), "num_experts_per_token"));
  assert_int_equal(PARSE("{\"model_type\":\"mellum\",\"num_hidden_layers\":2,\"mlp_layer_types\":[\"sparse\"]}"), MOE8_ERR_PARSE);
  assert_non_null(strstr(moe8_last_error(), "mlp_layer_types"));
  assert_int_equal(PARSE("{\"model_type\":\"mellum\",\"num_hidden_layers\":2,\"mlp_layer_types\":[\"sparse\",\"hash_moe\"]}"),
                   MOE8_ERR_UNSUPPORTED);
  /* the class's default list: glm4_moe_lite's layer 0 dense, mellum's none */
  assert_int_equal(PARSE("{\"model_type\":\"glm4_moe_lite\",\"first_k_dense_replace\":3}"), MOE8_OK);
  assert_int_equal(moe8_hf_config_first_moe_layer(&c), 1);
  assert_int_equal(moe8_hf_config_check_moe_layer(&c, 0), MOE8_ERR_INVALID_ARG);
  assert_non_null(strstr(moe8_last_error(), "the family's default"));
  assert_int_equal(PARSE("{\"model_type\":\"mellum\"}"), MOE8_OK);
  assert_true(c.arch == MOE8_ARCH_QWEN3_MOE && c.layer.num_experts == 64 && c.layer.norm_topk_prob);
  assert_int_equal(moe8_hf_config_first_moe_layer(&c), 0);
  /* always renormalized: the key is not read */
  assert_int_equal(PARSE("{\"model_type\":\"qwen3_vl_moe_text\",\"norm_topk_prob\":false}"), MOE8_OK);
  assert_true(c.layer.norm_topk_prob && c.layer.num_experts == 60 && c.layer.top_k == 4);
  assert_int_equal(PARSE("{\"model_type\":\"qwen3_5_moe_text\",\"mlp_only_layers\":[0]}"), MOE8_OK);
  assert_true(c.arch == MOE8_ARCH_QWEN2_MOE && c.layer.shared_gate && c.layer.shared_ffn == 512 && c.layer.norm_topk_prob);
  assert_int_equal(moe8_hf_config_check_moe_layer(&c, 0), MOE8_OK); /* Qwen3_5MoeTextConfig has no placement key */
  assert_int_equal(PARSE("{\"model_type\":\"mimo_v2_flash\",\"routed_scaling_factor\":null,\"n_shared_experts\":2}"), MOE8_OK);
  assert_true(c.layer.shared_ffn == 0 && c.layer.routed_scaling_factor == 1.0f);
  /* a multimodal wrapper: text_config, named in model_type */
  assert_int_equal(PARSE("{\"model_type\":\"qwen3_vl_moe\",\"text_config\":{\"model_type\":\"qwen3_vl_moe_text\",\"num_experts\":8}}"), MOE8_OK);
  assert_true(c.layer.num_experts == 8 && !strcmp(c.model_type, "qwen3_vl_moe (text_config)"));
  assert_int_equal(PARSE("{\"model_type\":\"glm4v_moe\"}"), MOE8_ERR_PARSE);
  assert_non_null(strstr(moe8_last_error(), "text_config"));
  /* Nemotron-3 Nano Omni: text_config, or the legacy llm_config (text_config wins); Nemotron-3.5 Transcribe */
  assert_int_equal(PARSE("{\"model_type\":\"nemotron_h_omni\",\"llm_config\":{\"model_type\":\"nemotron_h\",\"n_routed_experts\":16,"
                         "\"moe_intermediate_size\":32,\"hybrid_override_pattern\":\"ME\"}}"), MOE8_OK);
  assert_true(c.layer.num_experts == 16 && c.layer.act == MOE8_ACT_RELU2 && !strcmp(c.model_type, "nemotron_h_omni (text_config)"));
  assert_int_equal(PARSE("{\"model_type\":\"nemotron_h_omni\",\"text_config\":{\"n_routed_experts\":16},"
                         "\"llm_config\":{\"n_routed_experts\":1}}"), MOE8_OK);
  assert_int_equal(c.layer.num_experts, 16);
  assert_int_equal(PARSE("{\"model_type\":\"nemotron_h_omni\",\"text_config\":null,\"llm_config\":{\"n_routed_experts\":24}}"), MOE8_OK);
  assert_int_equal(c.layer.num_experts, 24);
  assert_int_equal(PARSE("{\"model_type\":\"nemotron_h_omni\"}"), MOE8_ERR_PARSE);
  assert_non_null(strstr(moe8_last_error(), "llm_config"));
  assert_int_equal(PARSE("{\"model_type\":\"nemo_speechlm\",\"llm_config\":{\"n_routed_experts\":16}}"), MOE8_ERR_PARSE);
  assert_int_equal(PARSE("{\"model_type\":\"nemo_speechlm\",\"text_config\":{\"n_routed_experts\":16,\"mlp_hidden_act\":\"relu\"}}"),
                   MOE8_OK);
  assert_true(c.layer.num_experts == 16 && c.layer.act == MOE8_ACT_RELU && c.layer.shared_ffn == 7688);
  static const char sl[] = "{\"model_type\":\"nemo_speechlm\",\"text_config\":{}}";
  assert_int_equal(moe8_hf_config_parse_as(sl, strlen(sl), "config.json", "nemotron_h", &c), MOE8_ERR_UNSUPPORTED);
  assert_non_null(strstr(moe8_last_error(), "multimodal"));
  /* Every wrapper refuses an override as the multimodal model (Kimi K2.5
  ** and Aria had no row: their files ran as the override's top keys). */
  static const char *const mm[] = {"{\"model_type\":\"kimi_k25\",\"text_config\":{}}", "{\"model_type\":\"aria\",\"text_config\":{}}",
                                   "{\"model_type\":\"muse_spark\",\"text_config\":{}}"};
  for (size_t i = 0; i < sizeof mm / sizeof mm[0]; i++) {
    assert_int_equal(moe8_hf_config_parse_as(mm[i], strlen(mm[i]), "config.json", "deepseek_v3", &c), MOE8_ERR_UNSUPPORTED);
    assert_non_null(strstr(moe8_last_error(), "multimodal"));
  }
  /* An unknown model_type's message lists every family and wrapper, to
  ** its end (it outgrew a 1 KiB message buffer: the last names and the
  ** --arch hint were cut). */
  assert_int_equal(PARSE("{\"model_type\":\"no_such_moe\",\"num_experts\":4}"), MOE8_ERR_UNSUPPORTED);
  assert_non_null(strstr(moe8_last_error(), "nemo_speechlm"));
  assert_non_null(strstr(moe8_last_error(), "(--arch)"));
  /* ERNIE-4.5: softmax scores with the bias, max(sum, moe_norm_min), MoE by interval / start / end */
  assert_int_equal(PARSE("{\"model_type\":\"ernie4_5_moe\",\"num_hidden_layers\":6,\"moe_layer_interval\":2,\"moe_norm_min\":0.25}"), MOE8_OK);
  assert_true(c.arch == MOE8_ARCH_DEEPSEEK_V3 && c.layer.score == MOE8_SCORE_SOFTMAX && c.layer.use_selection_bias && c.layer.norm_min == 0.25f &&
              c.layer.shared_ffn == 2 * 1536 && c.layer.n_group == 1);
  assert_int_equal(moe8_hf_config_first_moe_layer(&c), 1);
  assert_int_equal(moe8_hf_config_check_moe_layer(&c, 2), MOE8_ERR_INVALID_ARG); /* (2 + 1) % 2 != 0 */
  assert_non_null(strstr(moe8_last_error(), "moe_layer_interval"));
  assert_int_equal(moe8_hf_config_check_moe_layer(&c, 5), MOE8_OK);
  assert_int_equal(PARSE("{\"model_type\":\"ernie4_5_moe\",\"use_bias\":true}"), MOE8_ERR_UNSUPPORTED);
  /* the limited SwiGLU: GLM-5 clamps its shared experts too, HY-V4 does not */
  assert_int_equal(PARSE("{\"model_type\":\"hy_v4\",\"swiglu_limit\":3.5}"), MOE8_OK);
  assert_true(c.layer.act == MOE8_ACT_SWIGLU_LIMIT && c.layer.act_limit == 3.5f && c.layer.shared_plain_act);
  assert_int_equal(PARSE("{\"model_type\":\"glm5_next_text\"}"), MOE8_OK);
  assert_true(c.layer.act == MOE8_ACT_SWIGLU_LIMIT && c.layer.act_limit == 10.0f && !c.layer.shared_plain_act);
  assert_int_equal(PARSE("{\"model_type\":\"hy_v4\",\"swiglu_limit\":0}"), MOE8_ERR_PARSE);
  assert_non_null(strstr(moe8_last_error(), "swiglu_limit"));
  /* Step-3.5: the SwiGLU clamped after the activation, limits per layer
  ** (lists one MTP entry longer trimmed), moe_layers_enum as a string,
  ** hidden_act not read, the released keys' aliases */
  assert_int_equal(PARSE("{\"model_type\":\"step3p5\",\"num_hidden_layers\":4,\"num_nextn_predict_layers\":1,\"hidden_act\":"
                         "\"swigluoai\",\"moe_num_experts\":16,\"moe_top_k\":4,\"share_expert_dim\":40,\"moe_layers_enum\":\"2, 3,9\","
                         "\"swiglu_limits\":[0,0,7,null,5],\"swiglu_limits_shared\":[null,0,16,0,1]}"), MOE8_OK);
  assert_true(c.layer.act == MOE8_ACT_SWIGLU_POST && c.per_layer_limits && c.act_limits[2] == 7.0f && c.act_limits[3] == 0.0f &&
              c.shared_act_limits[2] == 16.0f && c.shared_act_limits[3] == 0.0f && c.layer.num_experts == 16 && c.layer.top_k == 4 &&
              c.layer.shared_ffn == 40 && c.layer.n_group == 1 && c.layer.norm_topk_prob && c.layer.use_selection_bias);
  assert_int_equal(moe8_hf_config_first_moe_layer(&c), 2);
  assert_int_equal(moe8_hf_config_check_moe_layer(&c, 1), MOE8_ERR_INVALID_ARG);
  assert_int_equal(PARSE("{\"model_type\":\"step3p5\",\"num_hidden_layers\":5}"), MOE8_OK); /* layers 3... by default */
  assert_true(moe8_hf_config_first_moe_layer(&c) == 3 && !c.per_layer_limits);
  assert_int_equal(PARSE("{\"model_type\":\"step3p5\",\"num_hidden_layers\":2,\"swiglu_limits\":[1,-2]}"), MOE8_ERR_PARSE);
  assert_non_null(strstr(moe8_last_error(), "swiglu_limits"));
  assert_int_equal(PARSE("{\"model_type\":\"step3p5\",\"num_hidden_layers\":4,\"swiglu_limits_shared\":[1,2]}"), MOE8_ERR_PARSE);
  assert_non_null(strstr(moe8_last_error(), "swiglu_limits_shared"));
  assert_int_equal(PARSE("{\"model_type\":\"step3p5\",\"mlp_bias\":true}"), MOE8_ERR_UNSUPPORTED);
  assert_int_equal(PARSE("{\"model_type\":\"step3p5\",\"moe_layers_enum\":\"3,x\"}"), MOE8_ERR_PARSE);
  assert_int_equal(PARSE("{\"model_type\":\"step3p5\",\"n_routed_experts\":8,\"num_local_experts\":16}"), MOE8_ERR_PARSE);
  /* Inkling-2: the softcapped SwiGLU (caps in act_alpha, act_limit), route_scale, 1e-20, its files' w13_weight */
  assert_int_equal(PARSE("{\"model_type\":\"inkling2_text\",\"hidden_act\":\"gelu\"}"), MOE8_OK);
  assert_true(c.layer.act == MOE8_ACT_SWIGLU_SOFTCAP && c.layer.act_alpha == 4.0f && c.layer.act_limit == 25.0f &&
              c.layer.routed_scaling_factor == 8.0f && c.layer.norm_eps == 1e-20f && c.layer.num_experts == 384 && c.layer.ffn == 2304 &&
              c.layer.shared_ffn == 0 && c.layer.use_selection_bias && c.fused_interleaved && !strcmp(c.fused_gu, "experts.w13_weight"));
  assert_int_equal(PARSE("{\"model_type\":\"inkling2_loop_text\",\"mlp_gate_softcap\":2,\"mlp_up_softcap\":3,\"intermediate_size\":64,"
                         "\"routed_scaling_factor\":1.5}"), MOE8_OK);
  assert_true(c.layer.act_alpha == 2.0f && c.layer.act_limit == 3.0f && c.layer.ffn == 64 && c.layer.routed_scaling_factor == 1.5f);
  assert_int_equal(PARSE("{\"model_type\":\"inkling2_text\",\"mlp_up_softcap\":0}"), MOE8_ERR_PARSE);
  assert_non_null(strstr(moe8_last_error(), "mlp_up_softcap"));
  assert_int_equal(PARSE("{\"model_type\":\"inkling2_text\",\"moe_intermediate_size\":8,\"intermediate_size\":16}"), MOE8_ERR_PARSE);
  assert_int_equal(PARSE("{\"model_type\":\"inkling2_text\",\"scoring_func\":\"softmax\"}"), MOE8_ERR_UNSUPPORTED);
  assert_int_equal(PARSE("{\"model_type\":\"inkling2\",\"text_config\":{\"n_routed_experts\":16}}"), MOE8_OK);
  assert_true(c.layer.act == MOE8_ACT_SWIGLU_SOFTCAP && c.layer.num_experts == 16);
  /* Gemma-4: enable_moe_block, its required keys, GeGLU, the norms and scales, the block in the decoder layer */
  assert_int_equal(PARSE("{\"model_type\":\"gemma4_text\",\"num_experts\":8,\"top_k_experts\":2,\"moe_intermediate_size\":64}"),
                   MOE8_ERR_UNSUPPORTED);
  assert_non_null(strstr(moe8_last_error(), "\"enable_moe_block\" is false"));
  assert_int_equal(PARSE("{\"model_type\":\"gemma4_text\",\"enable_moe_block\":true,\"num_experts\":128,\"top_k_experts\":8,"
                         "\"moe_intermediate_size\":704,\"hidden_size\":2816,\"rms_norm_eps\":1e-5,\"hidden_activation\":\"gelu_pytorch_tanh\"}"),
                   MOE8_OK);
  assert_true(c.layer.act == MOE8_ACT_GEGLU && c.layer.router_norm && c.layer.expert_scale && c.layer.in_norm && c.layer.out_norm &&
              c.layer.rms_eps == 1e-5f && c.layer.router_norm_scale == (float)pow(2816.0, -0.5) && c.layer.norm_topk_prob &&
              c.layer.score == MOE8_SCORE_SOFTMAX && c.layer.num_experts == 128 && c.layer.top_k == 8 && c.layer.ffn == 704 &&
              c.layer.hidden == 2816 && c.num_layers == 30 && c.layer.shared_ffn == 0 && !c.has_bias && c.block_in_layer &&
              !strcmp(c.router_name, "router.proj.weight") && moe8_hf_config_first_moe_layer(&c) == 0);
  assert_int_equal(moe8_hf_config_check_moe_layer(&c, 29), MOE8_OK);
  assert_int_equal(PARSE("{\"model_type\":\"gemma4_text\",\"enable_moe_block\":true,\"num_experts\":8,\"top_k_experts\":2}"),
                   MOE8_ERR_PARSE);
  assert_non_null(strstr(moe8_last_error(), "moe_intermediate_size"));
  assert_int_equal(PARSE("{\"model_type\":\"gemma4_text\",\"enable_moe_block\":true,\"num_experts\":8,\"moe_intermediate_size\":8}"),
                   MOE8_ERR_PARSE);
  assert_non_null(strstr(moe8_last_error(), "top_k_experts"));
  assert_int_equal(PARSE("{\"model_type\":\"gemma4_text\",\"enable_moe_block\":true,\"top_k_experts\":2,\"moe_intermediate_size\":8}"),
                   MOE8_ERR_PARSE);
  assert_non_null(strstr(moe8_last_error(), "num_experts"));
  assert_int_equal(PARSE("{\"model_type\":\"gemma4_text\",\"enable_moe_block\":true,\"num_experts\":8,\"top_k_experts\":2,"
                         "\"moe_intermediate_size\":8,\"hidden_activation\":\"gelu\"}"), MOE8_ERR_UNSUPPORTED);
  assert_non_null(strstr(moe8_last_error(), "hidden_activation"));
  assert_int_equal(PARSE("{\"model_type\":\"gemma4_text\",\"enable_moe_block\":\"yes\"}"), MOE8_ERR_PARSE);
  assert_int_equal(PARSE("{\"model_type\":\"gemma4_text\",\"enable_moe_block\":true,\"num_experts\":8,\"top_k_experts\":2,"
                         "\"moe_intermediate_size\":8,\"rms_norm_eps\":-1}"), MOE8_ERR_PARSE);
  assert_non_null(strstr(moe8_last_error(), "rms_norm_eps"));
  assert_int_equal(PARSE("{\"model_type\":\"gemma4\",\"text_config\":{\"model_type\":\"gemma4_text\",\"enable_moe_block\":true,"
                         "\"num_experts\":16,\"top_k_experts\":4,\"moe_intermediate_size\":32,\"hidden_size\":64}}"), MOE8_OK);
  assert_true(c.layer.act == MOE8_ACT_GEGLU && c.layer.num_experts == 16 && c.layer.top_k == 4 && c.layer.rms_eps == 1e-6f &&
              !strcmp(c.model_type, "gemma4 (text_config)"));
  assert_int_equal(PARSE("{\"model_type\":\"gemma4\",\"text_config\":{\"num_experts\":16}}"), MOE8_ERR_UNSUPPORTED);
  assert_non_null(strstr(moe8_last_error(), "enable_moe_block"));
  assert_int_equal(PARSE("{\"model_type\":\"diffusion_gemma\",\"text_config\":{\"num_experts\":16,\"top_k_experts\":4,"
                         "\"moe_intermediate_size\":32}}"), MOE8_OK);
  assert_true(c.layer.act == MOE8_ACT_GEGLU && c.layer.out_norm && c.block_in_layer && c.layer.num_experts == 16);
  assert_int_equal(PARSE("{\"model_type\":\"diffusion_gemma_text\",\"num_experts\":16,\"top_k_experts\":4}"), MOE8_ERR_PARSE);
  /* MiniMax-M3: GPT-OSS's clamped SwiGLU without biases, a scaled routed sum, placement by moe_layer_freq */
  assert_int_equal(PARSE("{\"model_type\":\"minimax_m3_vl_text\",\"hidden_act\":\"swigluoai\",\"num_hidden_layers\":3,"
                         "\"moe_layer_freq\":[0,1,1],\"swiglu_limit\":5}"), MOE8_OK);
  assert_true(c.layer.act == MOE8_ACT_SWIGLU_CLAMP && c.layer.act_alpha == 1.702f && c.layer.act_limit == 5.0f && !c.layer.router_bias &&
              !c.layer.expert_bias && !c.layer.shared_plain_act && c.layer.routed_scaling_factor == 2.0f && c.layer.shared_ffn == 3072 &&
              c.layer.num_experts == 128 && c.layer.top_k == 4 && c.layer.ffn == 3072 && c.layer.use_selection_bias);
  assert_int_equal(moe8_hf_config_check_moe_layer(&c, 0), MOE8_ERR_INVALID_ARG);
  assert_int_equal(moe8_hf_config_check_moe_layer(&c, 1), MOE8_OK);
  assert_int_equal(PARSE("{\"model_type\":\"minimax_m3_vl_text\",\"num_hidden_layers\":3,\"moe_layer_freq\":[0,1]}"), MOE8_ERR_PARSE);
  assert_non_null(strstr(moe8_last_error(), "moe_layer_freq"));
  assert_int_equal(PARSE("{\"model_type\":\"minimax_m3_vl_text\",\"swiglu_alpha\":0}"), MOE8_ERR_PARSE);
  assert_int_equal(PARSE("{\"model_type\":\"minimax_m3_vl\",\"text_config\":{\"num_local_experts\":16}}"), MOE8_OK);
  assert_true(c.layer.act == MOE8_ACT_SWIGLU_CLAMP && c.layer.num_experts == 16);
  /* a family whose block differs: refused with the reason */
  /* AXK2: DeepSeek-V3's block with the dropped groups' values 0.0; no groups by default (both keys null), set together */
  assert_int_equal(PARSE("{\"model_type\":\"axk2\"}"), MOE8_OK);
  assert_true(c.arch == MOE8_ARCH_DEEPSEEK_V3 && c.layer.num_experts == 128 && c.layer.top_k == 8 && c.layer.hidden == 2048 &&
              c.num_layers == 48 && c.layer.ffn == 512 && c.layer.shared_ffn == 512 && c.layer.routed_scaling_factor == 2.5f &&
              c.layer.norm_topk_prob && c.layer.n_group <= 1 && c.layer.group_mask_zero && c.has_bias &&
              moe8_hf_config_first_moe_layer(&c) == 1);
  assert_int_equal(PARSE("{\"model_type\":\"axk2\",\"n_group\":4,\"topk_group\":2,\"num_hidden_layers\":3,"
                         "\"mlp_layer_types\":[\"sparse\",\"dense\",\"sparse\"],\"n_shared_experts\":2}"), MOE8_OK);
  assert_true(c.layer.n_group == 4 && c.layer.topk_group == 2 && c.layer.group_mask_zero && c.layer.shared_ffn == 1024 &&
              moe8_hf_config_first_moe_layer(&c) == 0);
  assert_int_equal(moe8_hf_config_check_moe_layer(&c, 1), MOE8_ERR_INVALID_ARG);
  assert_int_equal(PARSE("{\"model_type\":\"axk2\",\"n_group\":4,\"topk_group\":null}"), MOE8_ERR_PARSE);
  assert_non_null(strstr(moe8_last_error(), "set together"));
  assert_int_equal(PARSE("{\"model_type\":\"axk2\",\"topk_group\":2}"), MOE8_ERR_PARSE);
  assert_non_null(strstr(moe8_last_error(), "\"n_group\""));
  assert_int_equal(PARSE("{\"model_type\":\"deepseek_v3\"}"), MOE8_OK);
  assert_false(c.layer.group_mask_zero);
  /* transformers' types with experts or a router that are not a language model's MoE block: refused by name with the reason */
  {
    static const struct { const char *js, *why; } nm[4] = {
      {"{\"model_type\":\"openai_privacy_filter\"}", "token-classification encoder"},
      {"{\"model_type\":\"vitpose_backbone\"}", "vision (pose) backbone"},
      {"{\"model_type\":\"granite_docling\"}", "no MoE block"},
      {"{\"model_type\":\"gemma4_assistant\"}", "drafter"},
    };
    for (int i = 0; i < 4; i++) {
      assert_int_equal(PARSE(nm[i].js), MOE8_ERR_UNSUPPORTED);
      assert_non_null(strstr(moe8_last_error(), "which moe8 does not run: "));
      assert_non_null(strstr(moe8_last_error(), nm[i].why));
    }
  }
  /* PhiMoE: Mixtral's experts routed by sparsemixer, 2 experts whatever num_experts_per_tok says, router_jitter_noise */
  assert_int_equal(PARSE("{\"model_type\":\"phimoe\"}"), MOE8_OK);
  assert_true(c.arch == MOE8_ARCH_MIXTRAL && c.layer.score == MOE8_SCORE_SPARSEMIXER && c.layer.num_experts == 16 && c.layer.top_k == 2 &&
              c.layer.hidden == 4096 && c.num_layers == 32 && c.layer.ffn == 6400 && c.layer.router_jitter == 0.01f &&
              !c.layer.norm_topk_prob && !c.has_bias && c.layer.shared_ffn == 0 && moe8_hf_config_first_moe_layer(&c) == 0);
  assert_int_equal(PARSE("{\"model_type\":\"phimoe\",\"num_experts_per_tok\":4,\"router_jitter_noise\":0.3,\"num_local_experts\":8}"),
                   MOE8_OK);
  assert_true(c.layer.top_k == 2 && c.layer.router_jitter == 0.3f && c.layer.num_experts == 8);
  assert_int_equal(PARSE("{\"model_type\":\"phimoe\",\"router_jitter_noise\":-1}"), MOE8_ERR_PARSE);
  assert_non_null(strstr(moe8_last_error(), "router_jitter_noise"));
  assert_int_equal(PARSE("{\"model_type\":\"phimoe\",\"num_local_experts\":1,\"num_experts_per_tok\":1}"), MOE8_ERR_PARSE);
  assert_non_null(strstr(moe8_last_error(), "num_local_experts"));
  assert_int_equal(PARSE("{\"model_type\":\"phimoe\",\"hidden_act\":\"gelu\"}"), MOE8_ERR_UNSUPPORTED);
  /* LongCat-Flash: softmax over n_routed_experts + zero_expert_num, the top-k of score + bias, weights x 6.0, the
  ** identity experts after the routed ones; num_layers its layers (num_hidden_layers twice it) */
  assert_int_equal(PARSE("{\"model_type\":\"longcat_flash\"}"), MOE8_OK);
  assert_true(c.arch == MOE8_ARCH_DEEPSEEK_V3 && c.layer.score == MOE8_SCORE_SOFTMAX && c.layer.num_experts == 512 &&
              c.layer.zero_experts == 256 && c.layer.top_k == 12 && c.layer.hidden == 6144 && c.num_layers == 28 && c.layer.ffn == 2048 &&
              c.layer.routed_scaling_factor == 6.0f && !c.layer.norm_topk_prob && c.has_bias && c.layer.n_group <= 1 &&
              c.layer.shared_ffn == 0 && moe8_hf_config_first_moe_layer(&c) == 0);
  assert_int_equal(PARSE("{\"model_type\":\"longcat_flash\",\"num_local_experts\":16,\"zero_expert_num\":8,\"num_experts_per_tok\":20,"
                         "\"moe_intermediate_size\":96,\"num_hidden_layers\":6}"), MOE8_OK);
  assert_true(c.layer.num_experts == 16 && c.layer.zero_experts == 8 && c.layer.top_k == 20 && c.layer.ffn == 96 && c.num_layers == 3);
  assert_int_equal(PARSE("{\"model_type\":\"longcat_flash\",\"zero_expert_num\":null,\"num_layers\":2,\"num_hidden_layers\":4}"), MOE8_OK);
  /* a layer past the count names the key LongCat counts its layers by */
  assert_int_equal(moe8_hf_config_check_moe_layer(&c, 2), MOE8_ERR_INVALID_ARG);
  assert_non_null(strstr(moe8_last_error(), "num_layers = 2"));
  assert_null(strstr(moe8_last_error(), "num_hidden_layers"));
  assert_true(c.layer.zero_experts == 0 && c.num_layers == 2);
  assert_int_equal(PARSE("{\"model_type\":\"longcat_flash\",\"num_layers\":3,\"num_hidden_layers\":5}"), MOE8_ERR_PARSE);
  assert_non_null(strstr(moe8_last_error(), "\"num_hidden_layers\" = 5 is not twice \"num_layers\""));
  assert_int_equal(PARSE("{\"model_type\":\"longcat_flash\",\"router_bias\":true}"), MOE8_ERR_UNSUPPORTED);
  assert_non_null(strstr(moe8_last_error(), "\"router_bias\""));
  /* SwitchTransformers: top-1 softmax, the expert capacity, ungated relu experts; the encoder's blocks then the decoder's,
  ** sparse where block % step == 1 (step = layers // sparse layers; for 0 sparse layers step = layers: block 1 still) */
  assert_int_equal(PARSE("{\"model_type\":\"switch_transformers\"}"), MOE8_OK);
  assert_true(c.layer.num_experts == 8 && c.layer.top_k == 1 && c.layer.hidden == 768 && c.layer.ffn == 2048 && c.num_layers == 24 &&
              c.encdec && c.enc_layers == 12 && c.layer.expert_capacity == 64 && c.layer.act == MOE8_ACT_RELU &&
              c.layer.score == MOE8_SCORE_SOFTMAX && !c.layer.norm_topk_prob && !c.layer.router_bias && !c.has_bias &&
              moe8_hf_config_first_moe_layer(&c) == 1);
  {
    static const int64_t want[] = {1, 5, 9, 13, 17, 21};
    int64_t got = 0;
    for (int64_t l = 0; l < 24; l++)
      if (moe8_hf_config_check_moe_layer(&c, l) == MOE8_OK) { assert_true(got < 6 && want[got] == l); got++; }
    assert_int_equal(got, 6);
  }
  assert_int_equal(moe8_hf_config_check_moe_layer(&c, 12), MOE8_ERR_INVALID_ARG);
  assert_non_null(strstr(moe8_last_error(), "decoder.block.0.layer.2.mlp.wi.weight"));
  assert_int_equal(PARSE("{\"model_type\":\"switch_transformers\",\"hidden_size\":64,\"num_hidden_layers\":3,\"num_decoder_layers\":null,"
                         "\"num_sparse_encoder_layers\":0,\"num_sparse_decoder_layers\":3,\"dense_act_fn\":\"relu2\",\"router_bias\":true}"),
                   MOE8_OK);
  assert_true(c.layer.hidden == 64 && c.num_layers == 6 && c.enc_layers == 3 && c.layer.act == MOE8_ACT_RELU2 && c.layer.router_bias);
  for (int64_t l = 0; l < 6; l++) assert_int_equal(moe8_hf_config_check_moe_layer(&c, l) == MOE8_OK, l == 1 || l >= 3);
  moe8_clear_error();
  static const char *const sw_bad[] = {"\"dense_act_fn\":\"gelu\"", "\"router_dtype\":\"bfloat16\"", "\"expert_capacity\":0"};
  for (int i = 0; i < 3; i++) {
    char js[160];
    snprintf(js, sizeof js, "{\"model_type\":\"switch_transformers\",%s}", sw_bad[i]);
    assert_int_equal(moe8_hf_config_parse(js, strlen(js), "config.json", &c), MOE8_ERR_UNSUPPORTED);
    char key[40];
    snprintf(key, sizeof key, "%.*s", (int)(strchr(sw_bad[i] + 1, '"') - sw_bad[i] + 1), sw_bad[i]);
    assert_non_null(strstr(moe8_last_error(), key));
  }
  assert_int_equal(PARSE("{\"model_type\":\"switch_transformers\",\"router_jitter_noise\":0.5}"), MOE8_OK); /* training only */
  {
    static const char js[] = "{\"model_type\":\"switch_transformers\"}";
    assert_int_equal(moe8_hf_config_parse_as(js, strlen(js), "config.json", "qwen3_moe", &c), MOE8_ERR_UNSUPPORTED);
    assert_non_null(strstr(moe8_last_error(), "expert_capacity"));
  }
  /* NLLB-MoE: top-2 of the f32 softmax, NLLB's capacity (ceil(fraction x T) over all rows, ranked), the pair renormalized after
  ** the drop, times 1 - moe_token_dropout; ungated biased relu experts; the encoder's layers then the decoder's, sparse where
  ** (i + 1) % step == 0 */
  assert_int_equal(PARSE("{\"model_type\":\"nllb-moe\"}"), MOE8_OK);
  assert_true(c.layer.num_experts == 128 && c.layer.top_k == 2 && c.layer.hidden == 1024 && c.layer.ffn == 4096 && c.num_layers == 24 &&
              c.encdec && c.nllb && c.enc_layers == 12 && c.layer.capacity_ranked && c.layer.capacity_fraction == 1.0 &&
              c.layer.expert_capacity == 0 && c.layer.act == MOE8_ACT_RELU && c.layer.expert_bias && !c.layer.router_bias &&
              c.layer.score == MOE8_SCORE_SOFTMAX && !c.layer.norm_topk_prob && c.layer.routed_scaling_factor == 0.8f && !c.has_bias &&
              moe8_hf_config_first_moe_layer(&c) == 3);
  {
    static const int64_t want[] = {3, 7, 11, 15, 19, 23};
    int64_t got = 0;
    for (int64_t l = 0; l < 24; l++)
      if (moe8_hf_config_check_moe_layer(&c, l) == MOE8_OK) { assert_true(got < 6 && want[got] == l); got++; }
    assert_int_equal(got, 6);
  }
  assert_int_equal(moe8_hf_config_check_moe_layer(&c, 12), MOE8_ERR_INVALID_ARG);
  assert_non_null(strstr(moe8_last_error(), "model.decoder.layers.0.ffn.fc1.weight"));
  assert_non_null(strstr(moe8_last_error(), "decoder_sparse_step"));
  assert_int_equal(moe8_hf_config_check_moe_layer(&c, 24), MOE8_ERR_INVALID_ARG);
  assert_non_null(strstr(moe8_last_error(), "encoder_layers + decoder_layers"));
  assert_int_equal(PARSE("{\"model_type\":\"nllb-moe\",\"hidden_size\":64,\"encoder_layers\":3,\"decoder_layers\":2,\"encoder_sparse_step\":1,"
                         "\"decoder_sparse_step\":0,\"num_experts\":4,\"encoder_ffn_dim\":32,\"decoder_ffn_dim\":32,\"router_bias\":true,"
                         "\"moe_eval_capacity_token_fraction\":-1.0,\"expert_capacity\":5,\"moe_token_dropout\":0.0,"
                         "\"activation_function\":\"relu2\"}"), MOE8_OK);
  assert_true(c.layer.hidden == 64 && c.num_layers == 5 && c.enc_layers == 3 && c.layer.act == MOE8_ACT_RELU2 && c.layer.router_bias &&
              c.layer.capacity_fraction == 0.0 && c.layer.expert_capacity == 5 && c.layer.routed_scaling_factor == 1.0f && c.layer.ffn == 32);
  for (int64_t l = 0; l < 5; l++) assert_int_equal(moe8_hf_config_check_moe_layer(&c, l) == MOE8_OK, l < 3);
  moe8_clear_error();
  {
    static const struct { const char *kv, *key; moe8_status st; } nb[] = {
      {"\"activation_function\":\"gelu\"", "\"activation_function\"", MOE8_ERR_UNSUPPORTED},
      {"\"router_dtype\":\"bfloat16\"", "\"router_dtype\"", MOE8_ERR_UNSUPPORTED},
      {"\"second_expert_policy\":\"random\"", "\"second_expert_policy\"", MOE8_ERR_UNSUPPORTED},
      {"\"normalize_router_prob_before_dropping\":true", "\"normalize_router_prob_before_dropping\"", MOE8_ERR_UNSUPPORTED},
      {"\"batch_prioritized_routing\":true", "\"batch_prioritized_routing\"", MOE8_ERR_UNSUPPORTED},
      {"\"decoder_ffn_dim\":8", "\"decoder_ffn_dim\"", MOE8_ERR_UNSUPPORTED},
      {"\"moe_eval_capacity_token_fraction\":0,\"expert_capacity\":null", "\"expert_capacity\" null", MOE8_ERR_UNSUPPORTED},
      {"\"moe_eval_capacity_token_fraction\":0,\"expert_capacity\":0", "\"expert_capacity\"", MOE8_ERR_PARSE},
      {"\"moe_eval_capacity_token_fraction\":\"x\"", "\"moe_eval_capacity_token_fraction\"", MOE8_ERR_PARSE},
      {"\"moe_token_dropout\":1.0", "\"moe_token_dropout\"", MOE8_ERR_PARSE},
      {"\"num_experts\":1", "\"num_experts\"", MOE8_ERR_PARSE},
    };
    for (size_t i = 0; i < sizeof nb / sizeof nb[0]; i++) {
      char js[200];
      snprintf(js, sizeof js, "{\"model_type\":\"nllb-moe\",%s}", nb[i].kv);
      assert_int_equal(moe8_hf_config_parse(js, strlen(js), "config.json", &c), nb[i].st);
      if (!strstr(moe8_last_error(), nb[i].key)) TU_FAIL("nllb-moe %s: the error does not name %s: %s", nb[i].kv, nb[i].key, moe8_last_error());
    }
    static const char js[] = "{\"model_type\":\"nllb-moe\"}";
    assert_int_equal(moe8_hf_config_parse_as(js, strlen(js), "config.json", "qwen3_moe", &c), MOE8_ERR_UNSUPPORTED);
    assert_non_null(strstr(moe8_last_error(), "nllb-moe"));
  }
  /* Zaya: the MLP router (router_hidden_size, rms_norm_eps) over num_experts + 1 classes (the skip expert), top-1 only, the
  ** balancing_biases as the selection bias; every layer MoE; the router state is the loader's (layers after the first) */
  assert_int_equal(PARSE("{\"model_type\":\"zaya\"}"), MOE8_OK);
  assert_true(c.arch == MOE8_ARCH_QWEN3_MOE && c.layer.num_experts == 16 && c.layer.top_k == 1 && c.layer.hidden == 2048 &&
              c.layer.ffn == 2048 && c.num_layers == 40 && c.layer.router_mlp == 256 && c.layer.skip_experts == 1 &&
              !c.layer.router_state && fabsf(c.layer.rms_eps - 1e-5f) < 1e-12f && c.has_bias && c.layer.use_selection_bias &&
              c.layer.score == MOE8_SCORE_SOFTMAX && !c.layer.norm_topk_prob && c.layer.act == MOE8_ACT_SWIGLU &&
              moe8_hf_config_first_moe_layer(&c) == 0);
  for (int64_t l = 0; l < 40; l++) assert_int_equal(moe8_hf_config_check_moe_layer(&c, l), MOE8_OK);
  assert_int_equal(PARSE("{\"model_type\":\"zaya\",\"hidden_size\":64,\"num_experts\":8,\"moe_intermediate_size\":32,"
                         "\"router_hidden_size\":16,\"rms_norm_eps\":1e-6,\"num_hidden_layers\":3,\"num_experts_per_tok\":1,"
                         "\"layer_types\":[\"hybrid\",\"hybrid_sliding\",\"hybrid\"],\"sliding_window\":16}"), MOE8_OK);
  assert_true(c.layer.hidden == 64 && c.layer.num_experts == 8 && c.layer.ffn == 32 && c.layer.router_mlp == 16 && c.num_layers == 3 &&
              fabsf(c.layer.rms_eps - 1e-6f) < 1e-12f);
  {
    static const struct { const char *kv, *key; moe8_status st; } zb[6] = {
      {"\"num_experts_per_tok\":2", "\"num_experts_per_tok\" = 2", MOE8_ERR_UNSUPPORTED},
      {"\"hidden_act\":\"gelu\"", "\"hidden_act\"", MOE8_ERR_UNSUPPORTED},
      {"\"router_hidden_size\":0", "\"router_hidden_size\"", MOE8_ERR_PARSE},
      {"\"router_hidden_size\":1.5", "\"router_hidden_size\"", MOE8_ERR_PARSE},
      {"\"rms_norm_eps\":-1", "\"rms_norm_eps\"", MOE8_ERR_PARSE},
      {"\"num_experts\":4096", "skip expert", MOE8_ERR_PARSE}};
    for (int i = 0; i < 6; i++) {
      char js[160];
      snprintf(js, sizeof js, "{\"model_type\":\"zaya\",%s}", zb[i].kv);
      assert_int_equal(moe8_hf_config_parse(js, strlen(js), "config.json", &c), zb[i].st);
      assert_non_null(strstr(moe8_last_error(), zb[i].key));
    }
    static const char js[] = "{\"model_type\":\"zaya\"}"; /* run as another family: refused, the router named */
    assert_int_equal(moe8_hf_config_parse_as(js, strlen(js), "config.json", "qwen3_moe", &c), MOE8_ERR_UNSUPPORTED);
    assert_non_null(strstr(moe8_last_error(), "router is an MLP"));
  }
  /* Doge (DogeCDMoE): is_moe, product keys over num_experts (past MOE8_MAX_EXPERTS), single silu neurons (ffn 1), the dense
  ** SwiGLU as the shared expert, every layer MoE; the top-k at most the floor(sqrt(E))^2 candidates */
  assert_int_equal(PARSE("{\"model_type\":\"doge\"}"), MOE8_ERR_UNSUPPORTED); /* is_moe's default: dense */
  assert_non_null(strstr(moe8_last_error(), "\"is_moe\""));
  assert_int_equal(PARSE("{\"model_type\":\"doge\",\"is_moe\":true}"), MOE8_OK);
  assert_true(c.layer.num_experts == 16384 && c.layer.top_k == 64 && c.layer.hidden == 1024 && c.layer.ffn == 1 && c.num_layers == 32 &&
              c.layer.shared_ffn == 2048 && c.layer.product_keys && c.layer.act == MOE8_ACT_SILU && !c.layer.norm_topk_prob &&
              !c.layer.shared_gate && !c.has_bias && c.layer.score == MOE8_SCORE_SOFTMAX && moe8_hf_config_first_moe_layer(&c) == 0);
  for (int64_t l = 0; l < 32; l++) assert_int_equal(moe8_hf_config_check_moe_layer(&c, l), MOE8_OK);
  assert_int_equal(moe8_hf_config_check_moe_layer(&c, 32), MOE8_ERR_INVALID_ARG);
  assert_int_equal(PARSE("{\"model_type\":\"doge\",\"is_moe\":true,\"hidden_size\":64,\"num_hidden_layers\":3,\"num_experts\":30,"
                         "\"num_experts_per_tok\":25,\"intermediate_size\":96,\"norm_topk_prob\":true,\"output_router_logits\":true}"),
                   MOE8_OK);
  assert_true(c.layer.num_experts == 30 && c.layer.top_k == 25 && c.layer.hidden == 64 && c.num_layers == 3 && c.layer.shared_ffn == 96 &&
              c.layer.norm_topk_prob);
  assert_int_equal(PARSE("{\"model_type\":\"doge\",\"is_moe\":true,\"num_experts\":30,\"num_experts_per_tok\":26}"), MOE8_ERR_PARSE);
  assert_non_null(strstr(moe8_last_error(), "\"num_experts_per_tok\" = 26 exceeds the 25 candidates"));
  assert_int_equal(PARSE("{\"model_type\":\"doge\",\"is_moe\":true,\"num_experts\":2000000}"), MOE8_ERR_PARSE);
  assert_non_null(strstr(moe8_last_error(), "\"num_experts\""));
  assert_int_equal(PARSE("{\"model_type\":\"doge\",\"is_moe\":1}"), MOE8_ERR_PARSE);
  assert_non_null(strstr(moe8_last_error(), "\"is_moe\""));
  static const char *const doge_bad[] = {"\"hidden_act\":\"gelu\"", "\"mlp_bias\":true"};
  for (int i = 0; i < 2; i++) {
    char js[160];
    snprintf(js, sizeof js, "{\"model_type\":\"doge\",\"is_moe\":true,%s}", doge_bad[i]);
    assert_int_equal(moe8_hf_config_parse(js, strlen(js), "config.json", &c), MOE8_ERR_UNSUPPORTED);
    char key[40];
    snprintf(key, sizeof key, "%.*s", (int)(strchr(doge_bad[i] + 1, '"') - doge_bad[i] + 1), doge_bad[i]);
    assert_non_null(strstr(moe8_last_error(), key));
  }
  {
    static const char js[] = "{\"model_type\":\"doge\",\"is_moe\":true}";
    assert_int_equal(moe8_hf_config_parse_as(js, strlen(js), "config.json", "qwen3_moe", &c), MOE8_ERR_UNSUPPORTED);
    assert_non_null(strstr(moe8_last_error(), "product keys"));
  }
  assert_int_equal(PARSE("{\"model_type\":\"longcat_flash\",\"n_routed_experts\":16,\"zero_expert_num\":4,\"moe_topk\":21}"), MOE8_ERR_PARSE);
  assert_non_null(strstr(moe8_last_error(), "\"moe_topk\" = 21 exceeds the 20 experts"));
  assert_int_equal(PARSE("{\"model_type\":\"longcat_flash\",\"expert_ffn_hidden_size\":64,\"moe_intermediate_size\":32}"), MOE8_ERR_PARSE);
  assert_non_null(strstr(moe8_last_error(), "disagree"));
  assert_int_equal(PARSE("{\"model_type\":\"longcat_flash\",\"moe_topk\":4,\"num_experts_per_tok\":5}"), MOE8_ERR_PARSE);
  /* MuSE-Spark: latent experts (moe_hidden_size), both norms and their epsilons, 1e-15, the router's multiplier;
  ** the wrapper's text_config; dense layers by mlp_layer_types (default: none) */
  assert_int_equal(PARSE("{\"model_type\":\"muse_spark_text\"}"), MOE8_OK);
  assert_true(c.arch == MOE8_ARCH_DEEPSEEK_V3 && c.layer.score == MOE8_SCORE_SIGMOID && c.layer.num_experts == 256 && c.layer.top_k == 8 &&
              c.layer.hidden == 8192 && c.layer.ffn == 4096 && c.layer.latent == 4096 && c.layer.latent_norm && c.layer.expert_out_norm &&
              c.layer.rms_eps == 1e-5f && c.layer.expert_out_eps == 1e-8f && c.layer.norm_eps == 1e-15f && c.layer.norm_topk_prob &&
              c.layer.shared_ffn == 0 && c.layer.n_group == 1 && c.has_bias && c.router_logit_scale == (float)0.1767766952966369 &&
              c.num_layers == 62 && moe8_hf_config_first_moe_layer(&c) == 0);
  assert_int_equal(PARSE("{\"model_type\":\"muse_spark\",\"text_config\":{\"hidden_size\":64,\"num_hidden_layers\":2,"
                         "\"moe_hidden_size\":48,\"rms_norm_eps\":1e-6,\"post_norm_eps\":1e-7,\"output_multiplier\":0.5,"
                         "\"routed_scaling_factor\":2.0,\"mlp_layer_types\":[\"dense\",\"sparse\"]}}"), MOE8_OK);
  assert_true(c.layer.hidden == 64 && c.layer.latent == 48 && c.layer.rms_eps == 1e-6f && c.layer.expert_out_eps == 1e-7f &&
              c.router_logit_scale == 0.5f && c.layer.routed_scaling_factor == 2.0f && moe8_hf_config_first_moe_layer(&c) == 1);
  assert_int_equal(moe8_hf_config_check_moe_layer(&c, 0), MOE8_ERR_INVALID_ARG);
  assert_non_null(strstr(moe8_last_error(), "mlp_layer_types"));
  assert_int_equal(PARSE("{\"model_type\":\"muse_spark_text\",\"moe_hidden_size\":0}"), MOE8_ERR_PARSE);
  assert_non_null(strstr(moe8_last_error(), "moe_hidden_size"));
  assert_int_equal(PARSE("{\"model_type\":\"muse_spark_text\",\"hidden_act\":\"gelu\"}"), MOE8_ERR_UNSUPPORTED);
  assert_non_null(strstr(moe8_last_error(), "hidden_act"));
  /* DeepSeek-V4: sqrt-softplus scores (or sigmoid; softmax refused), 1.5, 1e-20, the limited SwiGLU in the one
  ** shared expert too, every layer MoE and the hash_moe ones routed by token id (default: the first 3), the
  ** layers at the top allowed, vocab_size the tables' rows; intermediate_size the experts' width's alias */
  assert_int_equal(PARSE("{\"model_type\":\"deepseek_v4\"}"), MOE8_OK);
  assert_true(c.arch == MOE8_ARCH_DEEPSEEK_V3 && c.layer.score == MOE8_SCORE_SQRTSOFTPLUS && c.layer.num_experts == 256 &&
              c.layer.top_k == 6 && c.layer.hidden == 4096 && c.num_layers == 43 && c.layer.ffn == 2048 && c.layer.shared_ffn == 2048 &&
              c.layer.norm_topk_prob && c.layer.routed_scaling_factor == 1.5f && c.layer.norm_eps == 1e-20f && c.layer.n_group == 1 &&
              c.layer.act == MOE8_ACT_SWIGLU_LIMIT && c.layer.act_limit == 10.0f && !c.layer.shared_plain_act && c.has_bias &&
              c.top_layers && c.vocab_size == 129280 && !strcmp(c.block_prefix, "ffn."));
  assert_true(c.hash_moe[0] && c.hash_moe[1] && c.hash_moe[2] && !c.hash_moe[3] && moe8_hf_config_first_moe_layer(&c) == 0);
  assert_int_equal(moe8_hf_config_check_moe_layer(&c, 42), MOE8_OK);
  assert_int_equal(PARSE("{\"model_type\":\"deepseek_v4\",\"num_hidden_layers\":3,\"mlp_layer_types\":[\"moe\",\"hash_moe\",\"moe\",\"x\"],"
                         "\"scoring_func\":\"sigmoid\",\"n_shared_experts\":4,\"norm_topk_prob\":false,\"intermediate_size\":64,"
                         "\"vocab_size\":100,\"swiglu_limit\":7}"), MOE8_OK); /* the list trimmed to the layers, as the class does */
  assert_true(!c.hash_moe[0] && c.hash_moe[1] && !c.hash_moe[2] && c.layer.score == MOE8_SCORE_SIGMOID && c.layer.shared_ffn == 64 &&
              c.layer.ffn == 64 && c.layer.norm_topk_prob && c.vocab_size == 100 && c.layer.act_limit == 7.0f);
  assert_int_equal(PARSE("{\"model_type\":\"deepseek_v4\",\"num_hidden_layers\":5,\"num_hash_layers\":1}"), MOE8_OK);
  assert_true(c.hash_moe[0] && !c.hash_moe[1]);
  assert_int_equal(PARSE("{\"model_type\":\"deepseek_v4\",\"scoring_func\":\"softmax\"}"), MOE8_ERR_UNSUPPORTED);
  assert_non_null(strstr(moe8_last_error(), "\"scoring_func\" is \"softmax\""));
  assert_int_equal(PARSE("{\"model_type\":\"deepseek_v4\",\"num_hidden_layers\":3,\"mlp_layer_types\":[\"moe\",\"hash_moe\"]}"),
                   MOE8_ERR_PARSE);
  assert_non_null(strstr(moe8_last_error(), "mlp_layer_types"));
  assert_int_equal(PARSE("{\"model_type\":\"deepseek_v4\",\"num_hidden_layers\":2,\"mlp_layer_types\":[\"moe\",\"dense\"]}"),
                   MOE8_ERR_UNSUPPORTED);
  assert_non_null(strstr(moe8_last_error(), "\"mlp_layer_types\"[1]"));
  assert_int_equal(PARSE("{\"model_type\":\"deepseek_v4\",\"moe_intermediate_size\":32,\"intermediate_size\":64}"), MOE8_ERR_PARSE);
  assert_non_null(strstr(moe8_last_error(), "intermediate_size"));
  assert_int_equal(PARSE("{\"model_type\":\"deepseek_v4\",\"quantization_config\":{\"quant_method\":\"fp8\",\"expert_dtype\":\"fp4\"}}"),
                   MOE8_ERR_UNSUPPORTED);
  assert_non_null(strstr(moe8_last_error(), "expert_dtype"));
  assert_int_equal(PARSE("{\"model_type\":\"deepseek_v4\",\"expert_dtype\":\"fp4\"}"), MOE8_ERR_UNSUPPORTED);
  assert_int_equal(PARSE("{\"model_type\":\"deepseek_v4\",\"mlp_bias\":true}"), MOE8_ERR_UNSUPPORTED);
  assert_int_equal(PARSE("{\"model_type\":\"deepseek_v4\",\"hidden_act\":\"gelu\"}"), MOE8_ERR_UNSUPPORTED);
  assert_int_equal(PARSE("{\"model_type\":\"deepseek_v4\",\"vocab_size\":0}"), MOE8_ERR_PARSE);
  /* Nemotron-H: DeepSeek-V3's block with ungated relu2 experts and one shared expert of
  ** moe_shared_expert_intermediate_size; the layers from layers_block_type (its length the count), else
  ** hybrid_override_pattern, else the class's default list; backbone.layers.L.mixer. */
  assert_int_equal(PARSE("{\"model_type\":\"nemotron_h\"}"), MOE8_OK);
  assert_true(c.arch == MOE8_ARCH_DEEPSEEK_V3 && c.layer.act == MOE8_ACT_RELU2 && c.layer.score == MOE8_SCORE_SIGMOID &&
              c.layer.num_experts == 8 && c.layer.top_k == 2 && c.layer.hidden == 4096 && c.layer.ffn == 7688 &&
              c.layer.shared_ffn == 7688 && c.layer.norm_topk_prob && c.layer.routed_scaling_factor == 1.0f && c.layer.norm_eps == 1e-20f &&
              c.layer.n_group == 1 && c.has_bias && c.num_layers == 4 && !strcmp(c.block_prefix, "mixer.") &&
              !strcmp(c.layers_root, "backbone.layers."));
  assert_int_equal(moe8_hf_config_first_moe_layer(&c), 1);
  assert_int_equal(moe8_hf_config_check_moe_layer(&c, 3), MOE8_ERR_INVALID_ARG);
  assert_non_null(strstr(moe8_last_error(), "default"));
  assert_int_equal(PARSE("{\"model_type\":\"nemotron_h\",\"num_hidden_layers\":52,\"hybrid_override_pattern\":\"M-E*E\","
                         "\"n_routed_experts\":16,\"num_experts_per_tok\":4,\"moe_intermediate_size\":64,"
                         "\"moe_shared_expert_intermediate_size\":96,\"n_shared_experts\":3,\"routed_scaling_factor\":2.5,"
                         "\"n_group\":4,\"topk_group\":2,\"mlp_hidden_act\":\"relu\",\"hidden_act\":\"gelu\"}"), MOE8_OK);
  assert_true(c.num_layers == 5 && c.layer.act == MOE8_ACT_RELU && c.layer.num_experts == 16 && c.layer.top_k == 4 && c.layer.ffn == 64 &&
              c.layer.shared_ffn == 96 && c.layer.routed_scaling_factor == 2.5f && c.layer.n_group == 4 && c.layer.topk_group == 2);
  assert_int_equal(moe8_hf_config_first_moe_layer(&c), 2);
  assert_int_equal(moe8_hf_config_check_moe_layer(&c, 4), MOE8_OK);
  assert_int_equal(moe8_hf_config_check_moe_layer(&c, 1), MOE8_ERR_INVALID_ARG);
  assert_non_null(strstr(moe8_last_error(), "hybrid_override_pattern"));
  assert_int_equal(PARSE("{\"model_type\":\"nemotron_h\",\"hybrid_override_pattern\":\"MEM\",\"layers_block_type\":"
                         "[\"moe\",\"mamba\",\"attention\",\"mlp\",\"moe\",\"linear_attention\"],\"num_local_experts\":4}"), MOE8_OK);
  assert_true(c.num_layers == 6 && c.layer.num_experts == 4 && moe8_hf_config_first_moe_layer(&c) == 0);
  assert_int_equal(moe8_hf_config_check_moe_layer(&c, 4), MOE8_OK);
  assert_int_equal(moe8_hf_config_check_moe_layer(&c, 3), MOE8_ERR_INVALID_ARG);
  assert_non_null(strstr(moe8_last_error(), "layers_block_type"));
  assert_int_equal(PARSE("{\"model_type\":\"nemotron_h\",\"moe_latent_size\":1024}"), MOE8_OK);
  assert_true(c.layer.latent == 1024 && !c.layer.latent_norm && !c.layer.expert_out_norm && c.router_logit_scale == 0.0f);
  assert_int_equal(PARSE("{\"model_type\":\"nemotron_h\",\"moe_latent_size\":0}"), MOE8_ERR_PARSE);
  assert_non_null(strstr(moe8_last_error(), "moe_latent_size"));
  assert_int_equal(PARSE("{\"model_type\":\"nemotron_h\",\"moe_latent_size\":null}"), MOE8_OK);
  assert_true(c.layer.latent == 0);
  assert_int_equal(PARSE("{\"model_type\":\"nemotron_h\",\"mlp_hidden_act\":\"silu\"}"), MOE8_ERR_UNSUPPORTED);
  assert_non_null(strstr(moe8_last_error(), "mlp_hidden_act"));
  assert_int_equal(PARSE("{\"model_type\":\"nemotron_h\",\"mlp_bias\":true}"), MOE8_ERR_UNSUPPORTED);
  assert_non_null(strstr(moe8_last_error(), "mlp_bias"));
  assert_int_equal(PARSE("{\"model_type\":\"nemotron_h\",\"hybrid_override_pattern\":\"MEX\"}"), MOE8_ERR_PARSE);
  assert_non_null(strstr(moe8_last_error(), "hybrid_override_pattern"));
  assert_int_equal(PARSE("{\"model_type\":\"nemotron_h\",\"layers_block_type\":[\"moe\",\"dense\"]}"), MOE8_ERR_PARSE);
  assert_non_null(strstr(moe8_last_error(), "layers_block_type\"[1]"));
  assert_int_equal(PARSE("{\"model_type\":\"nemotron_h\",\"n_routed_experts\":8,\"num_local_experts\":16}"), MOE8_ERR_PARSE);
  assert_int_equal(PARSE("{\"model_type\":\"nemotron_h\",\"scoring_func\":\"softmax\"}"), MOE8_ERR_UNSUPPORTED);
#undef PARSE
}

/* Zaya's files (ZayaSparseMoeBlock's save_pretrained names): two layers,
** the router MLP's tensors transposed into the layer's x · W masters, the
** first layer without router_states_scale (no router state), the second
** with it; a missing or misshapen tensor refused with its name. */
enum { ZE = 3, ZD = 8, ZF = 4, ZR = 6 };
static moe8_status write_zaya(const char *dir, const char *drop, const char *bad) {
  static float buf[16][ZE * 2 * ZF * ZD];
  char path[600], names[2][12][96];
  moe8_tensor_view t[24];
  int nt = 0;
  mkdir(dir, 0755);
  snprintf(path, sizeof path, "%s/config.json", dir);
  FILE *f = fopen(path, "w");
  if (!f) return MOE8_ERR_IO;
  fprintf(f, "{\"model_type\": \"zaya\", \"num_experts\": %d, \"hidden_size\": %d, \"moe_intermediate_size\": %d, "
             "\"router_hidden_size\": %d, \"num_hidden_layers\": 2, \"rms_norm_eps\": 1e-6}\n", ZE, ZD, ZF, ZR);
  fclose(f);
  static const struct { const char *name; int ndim; int64_t s0, s1, s2; } k[11] = {
    {"gate.down_proj.weight", 2, ZR, ZD, 0}, {"gate.down_proj.bias", 1, ZR, 0, 0}, {"gate.router_states_scale", 1, ZR, 0, 0},
    {"gate.router_mlp.norm.weight", 1, ZR, 0, 0}, {"gate.router_mlp.fc1.weight", 2, ZR, ZR, 0}, {"gate.router_mlp.fc1.bias", 1, ZR, 0, 0},
    {"gate.router_mlp.fc2.weight", 2, ZR, ZR, 0}, {"gate.router_mlp.fc2.bias", 1, ZR, 0, 0},
    {"gate.router_mlp.out_proj.weight", 2, ZE + 1, ZR, 0}, {"gate.balancing_biases", 1, ZE + 1, 0, 0},
    {"experts.gate_up_proj", 3, ZE, 2 * ZF, ZD}};
  for (int i = 0; i < 16; i++)
    for (int j = 0; j < ZE * 2 * ZF * ZD; j++) buf[i][j] = 0.01f * (float)(i + 1) + 0.001f * (float)(j % 97); /* [i][j] tells which */
  for (int l = 0; l < 2; l++)
    for (int i = 0; i < 12; i++) {
      const bool dn = i == 11;
      const char *nm = dn ? "experts.down_proj" : k[i].name;
      if (i == 2 && l == 0) continue;
      snprintf(names[l][i], 96, "model.layers.%d.mlp.%s", l, nm);
      if (drop && !strcmp(names[l][i], drop)) continue;
      moe8_tensor_view v = {names[l][i], MOE8_FDT_F32, dn ? 3 : k[i].ndim, {dn ? ZE : k[i].s0, dn ? ZD : k[i].s1, dn ? ZF : k[i].s2},
                            buf[i], 0, 0};
      if (bad && !strcmp(v.name, bad)) v.shape[0] -= 1;
      size_t n = 1;
      for (int d = 0; d < v.ndim; d++) n *= (size_t)v.shape[d];
      v.nbytes = 4 * n;
      t[nt++] = v;
    }
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  return moe8_st_write(path, t, (size_t)nt);
}

static void test_zaya_files(void **state) {
  (void)state;
  const char *dir = tmp_path("zaya");
  assert_int_equal(write_zaya(dir, NULL, NULL), MOE8_OK);
  moe8_model *m;
  assert_int_equal(moe8_model_open(dir, &m), MOE8_OK);
  for (int l = 0; l < 2; l++) {
    moe8_layer *L;
    assert_int_equal(moe8_model_load_layer(m, l, NULL, &L), MOE8_OK);
    const moe8_layer_config *c = moe8_layer_get_config(L);
    assert_true(c->router_mlp == ZR && c->skip_experts == 1 && c->router_state == (l == 1) && c->top_k == 1 && c->use_selection_bias &&
                fabsf(c->rms_eps - 1e-6f) < 1e-12f);
    /* [out, in] in the file, x · W in the layer: element [in][out] is the file's [out][in] */
    const float *A = moe8_layer_weight_read(L, MOE8_W_ROUTER_DOWN, NULL), *B1 = moe8_layer_weight_read(L, MOE8_W_ROUTER_FC1, NULL);
    const float *wr = moe8_layer_weight_read(L, MOE8_W_ROUTER, NULL), *bb = moe8_layer_weight_read(L, MOE8_W_BIAS, NULL);
    const float *cs = moe8_layer_weight_read(L, MOE8_W_ROUTER_STATE_SCALE, NULL), *g = moe8_layer_weight_read(L, MOE8_W_ROUTER_MLP_NORM, NULL);
    for (int o = 0; o < ZR; o++)
      for (int i = 0; i < ZD; i++) assert_true(A[i * ZR + o] == 0.01f * 1 + 0.001f * (float)((o * ZD + i) % 97));
    for (int o = 0; o < ZR; o++)
      for (int i = 0; i < ZR; i++) assert_true(B1[i * ZR + o] == 0.01f * 5 + 0.001f * (float)((o * ZR + i) % 97));
    for (int o = 0; o < ZE + 1; o++)
      for (int i = 0; i < ZR; i++) assert_true(wr[i * (ZE + 1) + o] == 0.01f * 9 + 0.001f * (float)((o * ZR + i) % 97));
    for (int e = 0; e < ZE + 1; e++) assert_true(bb[e] == 0.01f * 10 + 0.001f * (float)e);
    for (int r = 0; r < ZR; r++) assert_true(g[r] == 0.01f * 4 + 0.001f * (float)r);
    if (l == 0) assert_null(cs);
    else for (int r = 0; r < ZR; r++) assert_true(cs[r] == 0.01f * 3 + 0.001f * (float)r);
    moe8_layer_destroy(L);
  }
  moe8_model_close(m);
  /* a tensor missing, or of the wrong shape: named */
  static const char *const gone[3] = {"model.layers.1.mlp.gate.router_states_scale", "model.layers.0.mlp.gate.balancing_biases",
                                      "model.layers.0.mlp.gate.router_mlp.fc2.bias"};
  for (int i = 0; i < 3; i++) {
    char d2[64];
    snprintf(d2, sizeof d2, "zaya_drop%d", i);
    assert_int_equal(write_zaya(tmp_path(d2), gone[i], NULL), MOE8_OK);
    assert_int_equal(moe8_model_open(tmp_path(d2), &m), MOE8_OK);
    moe8_layer *L = NULL;
    assert_int_equal(moe8_model_load_layer(m, i == 0 ? 1 : 0, NULL, &L), MOE8_ERR_FORMAT);
    assert_null(L);
    assert_non_null(strstr(moe8_last_error(), gone[i]));
    moe8_model_close(m);
  }
  static const char *const misshapen[3] = {"model.layers.0.mlp.gate.router_mlp.out_proj.weight", "model.layers.1.mlp.gate.down_proj.weight",
                                           "model.layers.0.mlp.experts.gate_up_proj"};
  for (int i = 0; i < 3; i++) {
    char d2[64];
    snprintf(d2, sizeof d2, "zaya_shape%d", i);
    assert_int_equal(write_zaya(tmp_path(d2), NULL, misshapen[i]), MOE8_OK);
    assert_int_equal(moe8_model_open(tmp_path(d2), &m), MOE8_OK);
    moe8_layer *L = NULL;
    assert_int_equal(moe8_model_load_layer(m, i == 1 ? 1 : 0, NULL, &L), MOE8_ERR_SHAPE);
    assert_non_null(strstr(moe8_last_error(), misshapen[i]));
    moe8_model_close(m);
  }
}

int main(void) {
  tu_seed();
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_safetensors_roundtrip_all_dtypes),
    cmocka_unit_test(test_npy_roundtrip),
    cmocka_unit_test(test_safetensors_bad_input),
    cmocka_unit_test(test_npy_bad_input),
    cmocka_unit_test(test_hf_configs),
    cmocka_unit_test(test_family_rows),
    cmocka_unit_test(test_zaya_files),
    cmocka_unit_test(test_doge_files),
    cmocka_unit_test(test_gpt_oss_mxfp4),
    cmocka_unit_test(test_gpt_oss_mxfp4_nan_gate),
    cmocka_unit_test(test_gpt_oss_mxfp4_loads_agree),
    cmocka_unit_test(test_deepseek_blocks),
    cmocka_unit_test(test_cli_files),
    cmocka_unit_test(test_mxfp4_rule_options),
    cmocka_unit_test(test_json_keeps_numbers),
    cmocka_unit_test(test_cli_gpt_oss_quantize),
    cmocka_unit_test(test_quantize_output_dir),
    cmocka_unit_test(test_quantize_records_rules),
    cmocka_unit_test(test_quantize_tile_recorded),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
