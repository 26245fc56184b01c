/*
** fuzz_model.c — libFuzzer target: the Hugging Face model directory loader.
** An input is a config.json and a model.safetensors: two bytes of
** little-endian length n, n bytes of config, the rest the safetensors
** file.  Both are written into a private directory, opened with
** moe8_model_open, and every layer's load is tried for inference and for
** training, without and with an FP8 rule; a layer that loads runs a
** forward on a few tokens (a layer that takes Zaya's router state is
** given one).  Configs whose layer would be larger than 4 M weights are
** opened but not loaded (the harness, not moe8, would run out of memory).
*/
#define _DEFAULT_SOURCE 1
#include "moe8.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char g_dir[256];

static int put(const char *name, const uint8_t *p, size_t n) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", g_dir, name);
  FILE *f = fopen(path, "wb");
  if (!f) return 0;
  const int ok = (n == 0 || fwrite(p, 1, n, f) == n);
  return (fclose(f) == 0) & ok;
}

/* The directory and its two files go when the fuzzer exits (a run of N
** inputs, or the end of the corpus): nothing is left in $TMPDIR. */
static void remove_dir(void) {
  char path[512];
  snprintf(path, sizeof path, "%s/config.json", g_dir);
  (void)unlink(path);
  snprintf(path, sizeof path, "%s/model.safetensors", g_dir);
  (void)unlink(path);
  (void)rmdir(g_dir);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!g_dir[0]) {
    const char *t = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/moe8-fuzz-model-XXXXXX", t && t[0] ? t : "/tmp");
    if (!mkdtemp(g_dir)) abort();
    atexit(remove_dir);
  }
  if (size < 2) return 0;
  size_t n = (size_t)data[0] | (size_t)data[1] << 8;
  if (n > size - 2) n = size - 2;
  if (!put("config.json", data + 2, n) || !put("model.safetensors", data + 2 + n, size - 2 - n)) return 0;
  moe8_model *m = NULL;
  if (moe8_model_open(g_dir, &m) != MOE8_OK) return 0;
  const moe8_hf_config *c = moe8_model_config(m);
  const double w = (double)c->layer.num_experts * (double)c->layer.hidden * (double)c->layer.ffn +
                   (double)c->layer.shared_ffn * (double)c->layer.hidden;
  (void)moe8_model_format(m, 0);
  moe8_rules *fp8 = NULL;
  const char *rj = "{\"rules\": [{\"module_path\": \".*\", \"weight_qtype\": \"float8_e4m3fn\", \"act_qtype\": \"float8_e4m3fn\"}]}";
  (void)moe8_rules_parse(rj, strlen(rj), "fuzz", &fp8);
  for (int64_t l = 0; l < c->num_layers && l < 2 && w <= 4e6; l++)
    for (int mode = 0; mode < 2; mode++)
      for (int r = 0; r < 2; r++) {
        const moe8_load_options o = {sizeof o, mode ? MOE8_LOAD_INFERENCE : MOE8_LOAD_TRAINING, NULL, NULL};
        moe8_layer *L = NULL;
        if (moe8_model_load_layer_ex(m, l, r ? fp8 : NULL, &o, &L) != MOE8_OK) continue;
        const int64_t D = c->layer.hidden, T = 3;
        float *x = calloc((size_t)(T * D), sizeof(float)), *y = malloc(sizeof(float) * (size_t)(T * D));
        const size_t wsz = moe8_layer_workspace_size(L, T);
        void *ws = NULL;
        if (x && y && posix_memalign(&ws, 64, wsz ? wsz : 64) == 0) {
          for (int64_t i = 0; i < T * D; i++) x[i] = (float)(i % 5) * 0.25f - 0.5f;
          moe8_prepared pr;
          const moe8_layer_config *lc = moe8_layer_get_config(L);
          float *st = lc->router_mlp > 0 ? malloc(sizeof(float) * (size_t)(T * lc->router_mlp)) : NULL; /* Zaya's router state */
          for (int64_t i = 0; st && i < T * lc->router_mlp; i++) st[i] = (float)(i % 3) * 0.5f - 0.5f;
          if (moe8_layer_prepared(L, &pr) == MOE8_OK || moe8_layer_prepare(L) == MOE8_OK) {
            if (st) (void)moe8_layer_forward_fused_state(L, x, T, lc->router_state ? st : NULL, st, y, ws, wsz);
            else (void)moe8_layer_forward_fused(L, x, T, y, ws, wsz);
          }
          free(st);
        }
        free(ws); free(x); free(y);
        moe8_layer_destroy(L);
      }
  moe8_rules_destroy(fp8);
  moe8_model_close(m);
  return 0;
}
