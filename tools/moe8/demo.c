/*
** demo.c — 'moe8 demo': the README's main job, in under a minute.
**
**   1. the quantization error of every format and granularity on random data;
**   2. init: a random 2-layer Qwen3-MoE-shaped model in Hugging Face naming;
**   3. quantize: FP8 e4m3 weights, in moe8's [E, nb, 1, N] format and in
**      DeepSeek's 128×128-block format;
**   4. run: the same tokens through the bf16 original and both FP8 copies,
**      the error of each against the original and what it does to a
**      next-token argmax; the same layer in PyTorch (bench/torch_moe.py,
**      when Debian's python3-torch is there), its output and its time;
**   5. train: a short f32 and FP8 quantization-aware training run;
**   6. the expert-parallel check, when mpirun and the MPI build are present.
** Files go to a temporary directory (or --dir DIR, kept).
*/
#include "cli.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static uint64_t g_rng = 0x9E3779B97F4A7C15ULL;
static float randn(void) {
  double u[2];
  for (int i = 0; i < 2; i++) {
    g_rng ^= g_rng >> 12; g_rng ^= g_rng << 25; g_rng ^= g_rng >> 27;
    u[i] = (double)((g_rng * 0x2545F4914F6CDD1DULL) >> 11) * 0x1p-53;
  }
  return (float)(sqrt(-2.0 * log(u[0] + 0x1p-60)) * cos(6.283185307179586 * u[1]));
}

static int quant_table(void) {
  const int64_t T = 256, K = 1024, E = 4, N = 512;
  float *x = malloc(sizeof(float) * (size_t)(T * K)), *w = malloc(sizeof(float) * (size_t)(E * K * N));
  float *y = malloc(sizeof(float) * (size_t)(E * K * N)), *s = malloc(sizeof(float) * (size_t)(E * K * N));
  uint8_t *q = malloc((size_t)(E * K * N));
  if (!x || !w || !y || !q || !s) { fprintf(stderr, "moe8 demo: out of memory\n"); return EXIT_FAIL; }
  for (int64_t i = 0; i < T * K; i++) x[i] = randn() * ((i % K) % 97 == 0 ? 20.0f : 1.0f);
  for (int64_t i = 0; i < E * K * N; i++) w[i] = randn() * 0.02f;
  printf("%-8s %-28s %-13s %12s %14s\n", "format", "granularity", "tensor", "rel RMS err", "max err/bmax");
  const moe8_dtype types[] = {MOE8_DTYPE_F8E4M3, MOE8_DTYPE_F8E5M2, MOE8_DTYPE_I8};
  const struct { moe8_granularity g; const char *name; int weight; int64_t tile, bn; } grans[] = {
    {MOE8_GRAN_TENSOR, "per-tensor", 0, 0, 0},
    {MOE8_GRAN_ROW, "per-token [T,1]", 0, 0, 0},
    {MOE8_GRAN_ROW_TILE, "per-token 1x128 [T,K/128]", 0, 128, 0},
    {MOE8_GRAN_CHANNEL, "per-channel [E,1,1,N]", 1, 0, 0},
    {MOE8_GRAN_CHANNEL_TILE, "K-tiled [E,K/128,1,N]", 1, 128, 0},
    {MOE8_GRAN_BLOCK2D, "2-D 128x128 [E,N/128,K/128]", 1, 128, 128},
  };
  for (size_t t = 0; t < 3; t++)
    for (size_t g = 0; g < sizeof grans / sizeof grans[0]; g++) {
      const moe8_quant_spec spec = {.qtype = types[t], .gran = grans[g].g, .tile = grans[g].tile, .block_n = grans[g].bn, .clip = 1.0f};
      const float *src = grans[g].weight ? w : x;
      const int64_t e = grans[g].weight ? E : 1, r = grans[g].weight ? K : T, c = grans[g].weight ? N : K;
      moe8_status st = moe8_quantize(&spec, src, e, r, c, q, s, NULL);
      if (st == MOE8_OK) st = moe8_dequantize(&spec, q, s, e, r, c, y);
      if (st != MOE8_OK) return cli_report(st, "demo");
      double num = 0, den = 0, worst = 0, amax = 0;
      for (int64_t i = 0; i < e * r * c; i++) {
        const double d = (double)src[i] - y[i];
        amax = fmax(amax, fabs(src[i]));
        num += d * d;
        den += (double)src[i] * src[i];
        worst = fmax(worst, fabs(d));
      }
      printf("%-8s %-28s %-13s %12.3e %14.3e\n", moe8_dtype_info(types[t])->name, grans[g].name,
             grans[g].weight ? "w[4,1024,512]" : "x[256,1024]", sqrt(num / den), worst / amax);
    }
  printf("(max err/bmax uses the tensor's max; per block the bound is 1/16 for e4m3, 1/8 for e5m2, 1/254 for i8)\n");
  free(x); free(w); free(y); free(q); free(s);
  return EXIT_OK;
}

static int write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  if (!f || fputs(text, f) < 0 || fclose(f) != 0) { fprintf(stderr, "moe8 demo: cannot write %s\n", path); return EXIT_FAIL; }
  return EXIT_OK;
}

static float *read_f32_npy(const char *path, size_t *n) {
  moe8_file_dtype dt;
  int nd;
  int64_t shape[MOE8_MAX_DIMS];
  void *data;
  if (moe8_npy_read(path, &dt, &nd, shape, &data) != MOE8_OK || dt != MOE8_FDT_F32 || nd != 2) return NULL;
  *n = (size_t)(shape[0] * shape[1]);
  return data;
}

/* Step 6: the expert-parallel check needs the MPI build and mpirun. */
static int demo_ep(const char *dir) {
  (void)dir;
  if (!moe8_has_mpi()) { printf("skipped: this build has no MPI (apt-get install libopenmpi-dev openmpi-bin)\n"); return EXIT_OK; }
  if (system("command -v mpirun >/dev/null 2>&1") != 0) { printf("skipped: mpirun not found\n"); return EXIT_OK; }
  char self[4096], cmd[4400];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return EXIT_FAIL;
  self[n] = '\0';
  snprintf(cmd, sizeof cmd, "OMP_NUM_THREADS=1 mpirun %s--oversubscribe -n 2 '%s' check --quiet",
           geteuid() == 0 ? "--allow-run-as-root " : "", self);
  fflush(stdout);
  return system(cmd) == 0 ? EXIT_OK : EXIT_FAIL;
}

/* The fastest of reps fused forwards of layer 0 of a model directory (its
** inference load) on T tokens, ms; y gets the output; -1 on an error. */
static double time_layer(const char *dir, const float *x, int64_t T, float *y, int reps) {
  moe8_model *m = NULL;
  moe8_layer *L = NULL;
  const moe8_load_options o = {sizeof o, MOE8_LOAD_INFERENCE, NULL, NULL};
  moe8_status st = moe8_model_open(dir, &m);
  if (st == MOE8_OK) st = moe8_model_load_layer_ex(m, 0, NULL, &o, &L);
  moe8_model_close(m);
  const size_t wsz = L ? moe8_layer_workspace_size(L, T) : 0;
  void *ws = NULL;
  if (wsz && posix_memalign(&ws, 64, wsz) != 0) ws = NULL;
  double best = 1e30;
  for (int r = 0; r < reps && st == MOE8_OK; r++) {
    const double ts = cli_now();
    st = moe8_layer_forward_fused(L, x, T, y, ws, wsz);
    const double dt = cli_now() - ts;
    if (dt < best) best = dt;
  }
  free(ws);
  moe8_layer_destroy(L);
  if (st != MOE8_OK) { cli_report(st, "demo"); return -1; }
  return best * 1e3;
}

/* bench/torch_moe.py on layer 0 of dir (dtype f32 or bf16, one thread):
** the fastest of 5 in ms, its output written to yout; -1 when it fails. */
static double torch_layer(const char *dir, const char *x, const char *yout, const char *dtype) {
  char cmd[2200];
  snprintf(cmd, sizeof cmd,
           "OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 /usr/bin/python3 '%s/torch_moe.py' --model '%s' --input '%s' "
           "--output '%s' %s 1 5 2>/dev/null", MOE8_BENCH_DIR, dir, x, yout, dtype);
  return cli_torch_min_ms(cmd);
}

static double rel_rms(const float *y, const float *ref, size_t n) {
  double num = 0, den = 0;
  for (size_t j = 0; j < n; j++) { num += ((double)y[j] - ref[j]) * ((double)y[j] - ref[j]); den += (double)ref[j] * ref[j]; }
  return den > 0 ? sqrt(num / den) : 0.0;
}

/* The argmax over V words of h[t] · head for each of T tokens of width D. */
static void argmax_rows(const float *h, const float *head, int64_t T, int64_t D, int64_t V, int *out) {
  for (int64_t t = 0; t < T; t++) {
    float best = -INFINITY;
    int arg = 0;
    for (int64_t v = 0; v < V; v++) {
      float s = 0;
      for (int64_t d = 0; d < D; d++) s += h[t * D + d] * head[v * D + d];
      if (s > best) best = s, arg = (int)v;
    }
    out[t] = arg;
  }
}

#define RUN(fn, ...) do { char *av_[] = {__VA_ARGS__, NULL}; int ac_ = 0; while (av_[ac_]) ac_++; \
                          if ((rc = fn(ac_, av_)) != EXIT_OK) goto done; } while (0)

int cmd_demo(int argc, char **argv) {
  const char *keep = NULL;
  for (int i = 1; i < argc; i++) {
    if (cli_is_help(argv[i])) {
      printf("usage: moe8 demo [--dir DIR]\n\n"
             "Quantization error table; then init -> quantize (moe8 and DeepSeek FP8) -> run -> error against\n"
             "the original -> a short training run -> the expert-parallel check (when mpirun is present).\n"
             "Files go to a temporary directory, or to DIR (kept).\nexit codes: 0 ok, 1 failure, 2 usage\n");
      return EXIT_OK;
    }
    if (!strcmp(argv[i], "--dir") && i + 1 < argc) keep = argv[++i];
    else { fprintf(stderr, "moe8 demo: unknown option '%s'\n", argv[i]); return EXIT_USAGE; }
  }
  const double t0 = cli_now();
  char dir[512], p[8][600];
  if (keep) { snprintf(dir, sizeof dir, "%s", keep); if (cli_mkdir(dir) != EXIT_OK) return EXIT_FAIL; }
  else {
    snprintf(dir, sizeof dir, "/tmp/moe8-demo-XXXXXX");
    if (!mkdtemp(dir)) { fprintf(stderr, "moe8 demo: cannot create a temporary directory\n"); return EXIT_FAIL; }
  }
  printf("moe8 %s demo (kernels %s, files in %s)\n\n== 1. quantization error on random data\n", MOE8_VERSION_STRING,
         moe8_isa_name(moe8_isa_active()), dir);
  int rc = quant_table();
  if (rc != EXIT_OK) return rc;
  cli_quiet = 1;
  snprintf(p[0], sizeof p[0], "%s/config.json", dir);
  snprintf(p[1], sizeof p[1], "%s/rules.json", dir);
  snprintf(p[2], sizeof p[2], "%s/model", dir);
  snprintf(p[3], sizeof p[3], "%s/model-fp8", dir);
  snprintf(p[4], sizeof p[4], "%s/model-deepseek-fp8", dir);
  snprintf(p[5], sizeof p[5], "%s/x.npy", dir);
  if ((rc = write_file(p[0], "{\"model_type\": \"qwen3_moe\", \"num_experts\": 16, \"num_experts_per_tok\": 4,\n"
                             " \"hidden_size\": 512, \"moe_intermediate_size\": 256, \"num_hidden_layers\": 2,\n"
                             " \"norm_topk_prob\": true}\n")) != EXIT_OK ||
      (rc = write_file(p[1], "{\"rules\": [{\"module_path\": \"mlp\\\\.experts\", \"weight_qtype\": \"float8_e4m3fn\",\n"
                             "            \"act_qtype\": \"float8_e4m3fn\", \"tile_size\": 128}],\n"
                             " \"quantize_before_ep_all_gather\": true}\n")) != EXIT_OK)
    goto done;
  printf("\n== 2. init\n");
  RUN(cmd_init, "init", "--config", p[0], "--out", p[2], "--dtype", "bf16");
  printf("\n== 3. quantize (rule: f8e4m3 weights and activations, tile 128)\n");
  RUN(cmd_quantize, "quantize", p[2], p[3], "--rules", p[1]);
  RUN(cmd_quantize, "quantize", p[2], p[4], "--rules", p[1], "--format", "deepseek");
  /* Tokens. */
  {
    const int64_t T = 128, D = 512, shape[2] = {T, D};
    float *x = malloc(sizeof(float) * (size_t)(T * D));
    if (!x) { rc = EXIT_FAIL; goto done; }
    for (int64_t i = 0; i < T * D; i++) x[i] = randn();
    const moe8_status st = moe8_npy_write(p[5], MOE8_FDT_F32, 2, shape, x);
    free(x);
    if (st != MOE8_OK) { rc = cli_report(st, "demo"); goto done; }
  }
  printf("\n== 4. run layer 0 on x[128, 512]\n");
  char y0[600], y1[600], y2[600], y3[600];
  snprintf(y0, sizeof y0, "%s/y-bf16.npy", dir);
  snprintf(y1, sizeof y1, "%s/y-bf16-fused-fp8.npy", dir);
  snprintf(y2, sizeof y2, "%s/y-fp8.npy", dir);
  snprintf(y3, sizeof y3, "%s/y-deepseek-fp8.npy", dir);
  printf("(each time is the fastest of 5 forwards)\n");
  RUN(cmd_run, "run", "--model", p[2], "--input", p[5], "--output", y0, "--repeat", "5");
  RUN(cmd_run, "run", "--model", p[2], "--input", p[5], "--output", y1, "--rules", p[1], "--repeat", "5");
  RUN(cmd_run, "run", "--model", p[3], "--input", p[5], "--output", y2, "--rules", p[1], "--repeat", "5");
  RUN(cmd_run, "run", "--model", p[4], "--input", p[5], "--output", y3, "--repeat", "5");
  /* The error of each FP8 run against the bf16 original, and what it does
  ** to a model's choice of the next token: the argmax of a random head of
  ** 2048 words over the layer's output and over the residual stream x + y
  ** (what a transformer's next layers see). */
  {
    enum { V = 2048 };
    const int64_t T = 128, D = 512;
    size_t n0, n, nx;
    float *ref = read_f32_npy(y0, &n0), *x = read_f32_npy(p[5], &nx);
    float *head = malloc(sizeof(float) * V * (size_t)D), *h = malloc(sizeof(float) * (size_t)(T * D));
    int *am[4];
    for (int i = 0; i < 4; i++) am[i] = malloc(sizeof(int) * 2 * (size_t)T);
    const char *ys[3] = {y1, y2, y3};
    const char *what[3] = {"(a) bf16 weights, FP8 rules at load", "(b) moe8 FP8 checkpoint", "(c) DeepSeek FP8 checkpoint"};
    if (!ref || !x || !head || !h || !am[0] || !am[1] || !am[2] || !am[3] || n0 != (size_t)(T * D) || nx != n0) rc = EXIT_FAIL;
    for (int64_t i = 0; rc == EXIT_OK && i < V * D; i++) head[i] = randn() * 0.044194174f; /* 1/sqrt(512) */
    float *first = NULL;
    for (int i = -1; i < 3 && rc == EXIT_OK; i++) {
      float *y = i < 0 ? ref : read_f32_npy(ys[i], &n);
      if (!y || (i >= 0 && n != n0)) { if (i >= 0) free(y); rc = EXIT_FAIL; break; }
      argmax_rows(y, head, T, D, V, am[i + 1]);
      for (int64_t j = 0; j < T * D; j++) h[j] = x[j] + y[j];
      argmax_rows(h, head, T, D, V, am[i + 1] + T);
      if (i < 0) {
        printf("%-38s %11s  %s\n", "layer 0's output y against the bf16", "rel RMS err", "argmax of a random 2048-word head agrees");
        printf("%-38s %11s  %s\n", "original's (f32 arithmetic)", "", "on y / on x + y (the residual stream)");
        continue;
      }
      int a = 0, b = 0;
      for (int64_t t = 0; t < T; t++) a += am[i + 1][t] == am[0][t], b += am[i + 1][T + t] == am[0][T + t];
      const bool same = i == 1 && first && !memcmp(first, y, n * 4);
      printf("%-38s %11.3e  %3d / %3d of %lld%s\n", what[i], rel_rms(y, ref, n), a, b, (long long)T,
             same ? "   (the bytes of (a))" : "");
      if (i == 0) first = y; else free(y);
    }
    free(first);
    free(ref), free(x), free(head), free(h);
    for (int i = 0; i < 4; i++) free(am[i]);
    if (rc != EXIT_OK) { fprintf(stderr, "moe8 demo: cannot read back the outputs\n"); goto done; }
    printf("(FP8 moves a layer's output by about 6%%; a model adds it to its residual stream, where the next token\n"
           " changes less often. Whole small transformers models patched with an FP8 rule, 4 layers, 256 positions:\n"
           " the argmax agreed on 97%% of positions for Qwen3-MoE and Mixtral, 80%% for DeepSeek-V3, whose MoE branch\n"
           " outweighs the residual stream at random init: scripts/fp8_argmax.py, docs/integration.md)\n");
  }
  /* The same layer in PyTorch, one thread each (a busy machine skews a
  ** two-thread PyTorch run far more than moe8's). */
  {
    const int64_t T = 128, D = 512;
    size_t n0, nt;
    float *x = read_f32_npy(p[5], &n0), *ref = read_f32_npy(y0, &n0), *y = malloc(sizeof(float) * (size_t)(T * D));
    if (!x || !ref || !y) { free(x), free(ref), free(y); rc = EXIT_FAIL; goto done; }
    printf("\nthe same layer and tokens in PyTorch (bench/torch_moe.py: transformers' loop over the experts), one thread each:\n");
    if (system("/usr/bin/python3 -c 'import torch, numpy' >/dev/null 2>&1") != 0) {
      printf("skipped: PyTorch is not installed (apt-get install -y python3-torch)\n");
    } else {
#ifdef _OPENMP
      const int nth = omp_get_max_threads();
#else
      const int nth = 1;
#endif
      moe8_set_num_threads(1);
      const double m_bf = time_layer(p[2], x, T, y, 5), m_f8 = time_layer(p[3], x, T, y, 5);
      moe8_set_num_threads(nth);
      char yt[600];
      snprintf(yt, sizeof yt, "%s/y-torch.npy", dir);
      const double t_f32 = torch_layer(p[2], p[5], yt, "f32");
      float *ytf = t_f32 > 0 ? read_f32_npy(yt, &nt) : NULL;
      const double e_f32 = ytf && nt == n0 ? rel_rms(ytf, ref, n0) : -1;
      free(ytf);
      const double t_bf = torch_layer(p[2], p[5], yt, "bf16");
      ytf = t_bf > 0 ? read_f32_npy(yt, &nt) : NULL;
      const double e_bf = ytf && nt == n0 ? rel_rms(ytf, ref, n0) : -1;
      free(ytf);
      if (m_bf < 0 || m_f8 < 0) rc = EXIT_FAIL;
      else if (t_f32 < 0 || t_bf < 0 || e_f32 < 0 || e_bf < 0) printf("skipped: the PyTorch run failed (bench/torch_moe.py)\n");
      else {
        printf("  %-36s %8.2f ms   output vs moe8's bf16-checkpoint run: rel err %.1e\n", "PyTorch eager, f32", t_f32, e_f32);
        printf("  %-36s %8.2f ms   rel err %.1e (bf16 arithmetic)\n", "PyTorch eager, bf16", t_bf, e_bf);
        printf("  %-36s %8.2f ms   %.1fx PyTorch f32\n", "moe8, bf16 checkpoint (f32 weights)", m_bf, t_f32 / m_bf);
        printf("  %-36s %8.2f ms   %.1fx PyTorch bf16\n", "moe8, FP8 checkpoint", m_f8, t_bf / m_f8);
      }
    }
    free(x), free(ref), free(y);
    if (rc != EXIT_OK) goto done;
  }
  /* Decode, one token: FP8 weights read a quarter of the f32 bytes, half of bf16's. */
  {
    float x[512], y[512];
    for (int i = 0; i < 512; i++) x[i] = randn();
    printf("\ndecode (one token, fastest of 20):\n");
    const double t0m = time_layer(p[2], x, 1, y, 20), t1m = time_layer(p[3], x, 1, y, 20);
    if (t0m < 0 || t1m < 0) { rc = EXIT_FAIL; goto done; }
    printf("  bf16 checkpoint (f32 weights in memory)   %8.3f ms\n  FP8 checkpoint (f8e4m3 codes, packed)     %8.3f ms: %.2fx faster\n",
           t0m, t1m, t1m > 0 ? t0m / t1m : 0.0);
  }
  printf("\n== 5. train: a student learns a random teacher, 100 steps\n");
  printf("f32 weights and activations:\n  ");
  fflush(stdout);
  RUN(cmd_train, "train", "--steps", "100", "--quiet");
  printf("FP8 quantization-aware (FP8 forward, straight-through backward):\n  ");
  fflush(stdout);
  RUN(cmd_train, "train", "--steps", "100", "--quiet", "--fp8");
  printf("\n== 6. expert parallelism\n");
  rc = demo_ep(dir);
done:
  cli_quiet = 0;
  if (!keep) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "moe8 demo: could not remove %s\n", dir);
  }
  if (rc == EXIT_OK) printf("\ndemo finished in %.1f s\n", cli_now() - t0);
  return rc;
}
