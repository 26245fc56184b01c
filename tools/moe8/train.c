/*
** train.c — 'moe8 train': a student layer learns a fixed random teacher
** layer on synthetic tokens with Adam, in f32 or quantization-aware FP8.
** One progress line per step; the loss curve goes to a CSV file (written to
** a temporary name and renamed, so it is never half-written).
*/
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
  fprintf(f,
          "usage: moe8 train [--steps N] [--tokens T] [--lr LR] [--fp8 | --rules FILE] [--csv FILE] [--seed S] [--quiet]\n"
          "                  [--experts E] [--top-k K] [--hidden D] [--ffn F]\n\n"
          "A student MoE layer (default E=4, top_k=2, D=16, F=16) learns a fixed random teacher layer\n"
          "of the same shape with Adam on fresh random tokens each step; loss = mean squared error\n"
          "against the teacher's output.\n"
          "  --steps N     steps (default 200)            --tokens T  tokens per step (default 256)\n"
          "  --lr LR       Adam learning rate, cosine-decayed to lr/20 (default 0.05)\n"
          "  --fp8         quantization-aware: f8e4m3 weights and activations, tile 32\n"
          "exit codes: 0 ok, 1 failure (including a loss that is not finite), 2 usage\n"
          "  --rules FILE  a rule set (docs/numerics.md) applied to the student's module path 'experts'\n"
          "  --csv FILE    write step,loss to FILE      --quiet  only the summary line\n");
}

int cmd_train(int argc, char **argv) {
  int64_t steps = 200, T = 256, seed = 1, E = 4, K = 2, D = 16, F = 16;
  float lr = 0.05f;
  const char *rules_path = NULL, *csv = NULL;
  int fp8 = 0, quiet = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (cli_is_help(a)) { usage(stdout); return EXIT_OK; }
    else if (!strcmp(a, "--fp8")) fp8 = 1;
    else if (!strcmp(a, "--quiet")) quiet = 1;
    else if (!strcmp(a, "--steps") && v && cli_parse_i64(v, &steps)) i++;
    else if (!strcmp(a, "--tokens") && v && cli_parse_i64(v, &T)) i++;
    else if (!strcmp(a, "--seed") && v && cli_parse_i64(v, &seed)) i++;
    else if (!strcmp(a, "--experts") && v && cli_parse_i64(v, &E)) i++;
    else if (!strcmp(a, "--top-k") && v && cli_parse_i64(v, &K)) i++;
    else if (!strcmp(a, "--hidden") && v && cli_parse_i64(v, &D)) i++;
    else if (!strcmp(a, "--ffn") && v && cli_parse_i64(v, &F)) i++;
    else if (!strcmp(a, "--lr") && v) {
      char *end;
      lr = strtof(v, &end);
      if (*end || !(lr > 0.0f && lr < 1.0f)) { fprintf(stderr, "moe8 train: --lr '%s' must be a number in (0, 1)\n", v); return EXIT_USAGE; }
      i++;
    }
    else if (!strcmp(a, "--rules") && v) rules_path = argv[++i];
    else if (!strcmp(a, "--csv") && v) csv = argv[++i];
    else { fprintf(stderr, "moe8 train: bad option '%s'\n\n", a); usage(stderr); return EXIT_USAGE; }
  }
  moe8_rules *rules = NULL;
  moe8_status st = MOE8_OK;
  if (rules_path) st = moe8_rules_load(rules_path, &rules);
  else if (fp8) {
    const char *j = "{\"rules\": [{\"module_path\": \"experts\", \"weight_qtype\": \"float8_e4m3fn\","
                    " \"act_qtype\": \"float8_e4m3fn\", \"tile_size\": 32}]}";
    st = moe8_rules_parse(j, strlen(j), "--fp8", &rules);
  }
  if (st != MOE8_OK) return cli_report(st, "train");
  moe8_layer_config cfg = {E, K, D, F, MOE8_SCORE_SOFTMAX, true, 0, false, 0, 0};
  moe8_layer *teacher = NULL, *student = NULL;
  moe8_trainer *tr = NULL;
  if ((st = moe8_layer_create(&cfg, NULL, "teacher", &teacher)) == MOE8_OK &&
      (st = moe8_layer_init_random(teacher, 1000 + (uint64_t)seed)) == MOE8_OK &&
      (st = moe8_layer_create(&cfg, rules, "experts", &student)) == MOE8_OK &&
      (st = moe8_layer_init_random(student, 2000 + (uint64_t)seed)) == MOE8_OK)
    st = moe8_trainer_create(student, lr, &tr);
  moe8_rules_destroy(rules);
  if (st != MOE8_OK) {
    const int rc = cli_report(st, "train");
    moe8_layer_destroy(teacher);
    moe8_layer_destroy(student);
    return rc;
  }
  const size_t TD = (size_t)(T * cfg.hidden);
  const size_t wsz = moe8_layer_workspace_size(student, T);
  void *ws = NULL;
  float *x = malloc(TD * sizeof(float)), *y = malloc(TD * sizeof(float)), *curve = malloc((size_t)steps * sizeof(float));
  if (posix_memalign(&ws, 64, wsz) != 0 || !x || !y || !curve) { fprintf(stderr, "moe8 train: out of memory\n"); return EXIT_FAIL; }
  if (!quiet) printf("moe8 train: student %s, %lld steps of %lld tokens, Adam lr %g\n", moe8_layer_describe(student),
                     (long long)steps, (long long)T, (double)lr);
  uint64_t rng = 0x2545F4914F6CDD1DULL * (uint64_t)seed;
  const double t0 = cli_now();
  for (int64_t s = 0; s < steps && st == MOE8_OK; s++) {
    for (size_t i = 0; i < TD; i += 2) { /* Box-Muller on xorshift */
      double u[2];
      for (int k = 0; k < 2; k++) {
        rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
        u[k] = (double)(rng >> 11) * 0x1p-53;
      }
      const double r = sqrt(-2.0 * log(u[0] + 0x1p-60));
      x[i] = (float)(r * cos(6.283185307179586 * u[1]));
      if (i + 1 < TD) x[i + 1] = (float)(r * sin(6.283185307179586 * u[1]));
    }
    /* Cosine decay from lr to lr/20. */
    moe8_trainer_set_lr(tr, lr * (0.05f + 0.95f * 0.5f * (1.0f + cosf(3.14159265f * (float)s / (float)steps))));
    st = moe8_layer_forward(teacher, x, T, y, NULL, ws, wsz);
    if (st == MOE8_OK) st = moe8_trainer_step(tr, x, y, T, &curve[s], ws, wsz);
    if (st == MOE8_OK && !isfinite(curve[s])) {
      fprintf(stderr, "moe8 train: the loss is not finite at step %lld (lower --lr)\n", (long long)s + 1);
      st = MOE8_ERR_NONFINITE;
      break;
    }
    if (st == MOE8_OK && !quiet)
      printf("step %4lld/%lld  loss %.6f  (%5.1f%% of first)\n", (long long)s + 1, (long long)steps, (double)curve[s],
             100.0 * curve[s] / curve[0]);
  }
  int rc = EXIT_OK;
  if (st == MOE8_ERR_NONFINITE && !*moe8_last_error()) rc = EXIT_FAIL;
  else if (st != MOE8_OK) rc = cli_report(st, "train");
  else {
    printf("trained %lld steps in %.2f s: loss %.6f -> %.6f (%.1f%% of first)\n", (long long)steps, cli_now() - t0,
           (double)curve[0], (double)curve[steps - 1], 100.0 * curve[steps - 1] / curve[0]);
    if (csv) {
      /* the one output routine (an exclusive temporary, fsync, rename) */
      const size_t cap = 32 + (size_t)steps * 40;
      char *text = malloc(cap);
      size_t len = 0;
      if (text) {
        len += (size_t)snprintf(text, cap, "step,loss\n");
        for (int64_t s = 0; s < steps && len < cap; s++)
          len += (size_t)snprintf(text + len, cap - len, "%lld,%.8g\n", (long long)s + 1, (double)curve[s]);
      }
      const void *parts[1] = {text};
      const size_t lens[1] = {len};
      const moe8_status ws_st = text ? moe8_file_write_atomic(csv, parts, lens, 1) : MOE8_ERR_NOMEM;
      free(text);
      if (ws_st != MOE8_OK) rc = cli_report(ws_st, "train");
    }
  }
  moe8_trainer_destroy(tr);
  moe8_layer_destroy(student);
  moe8_layer_destroy(teacher);
  free(ws); free(x); free(y); free(curve);
  return rc;
}
