/*
** check.c — 'moe8 check': run under 'mpirun -n P moe8 check' to trust a
** new cluster (or alone, P = 1).  Builds the same random layer and tokens
** on every rank, splits the tokens unevenly (a rank may get none), and
** prints one line per property with its largest difference and PASS/FAIL:
**   quantize-before on vs off (forward, backward),
**   ring of experts vs the single-process layer (forward, backward),
**   all-to-all dispatch vs the single-process layer (forward, backward),
** for FP8 per-token and 1×tile activations and for f32.  PASS means the
** bytes are equal.  Exit 0 when every line passes, 1 otherwise.
*/
#include "cli.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static double maxdiff(const float *a, const float *b, size_t n, int *equal) {
  double m = 0;
  *equal = memcmp(a, b, n * sizeof(float)) == 0;
  for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - (double)b[i]));
  return m;
}

typedef struct res { float *out, *dx, *dwr, *dwe; float aux; } res;

int cmd_check(int argc, char **argv) {
  int quiet = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--quiet")) { quiet = 1; continue; }
    if (cli_is_help(argv[i])) {
      printf("usage: mpirun -n P moe8 check [--quiet]     (or: moe8 check, for P = 1)\n\n"
             "Checks on this machine or cluster that the expert-parallel layer gives the same bytes as the\n"
             "single-process layer, and that quantizing before the all-gather changes nothing.\n"
             "exit codes: 0 every property passes, 1 a property fails or a call errs, 2 usage\n");
      return EXIT_OK;
    }
    fprintf(stderr, "moe8 check: unknown option '%s'\n", argv[i]);
    return EXIT_USAGE;
  }
  moe8_comm *comm;
  moe8_status st = cli_comm_open(&comm);
  if (st != MOE8_OK) return cli_report(st, "check");
  const int P = moe8_comm_size(comm), r = moe8_comm_rank(comm);
  const int64_t E = P * ((8 + P - 1) / P), K = 2, D = 128, F = 96, T = 61;
  /* Uneven shards; with P >= 3 the middle rank gets none. */
  int64_t *off = calloc((size_t)P + 1, sizeof *off);
  for (int q = 0; q < P; q++) {
    int64_t n = T / P + (q == 0 ? T % P : 0);
    if (P >= 3 && q == P / 2) n = 0;
    if (P >= 3 && q == 0) n += T / P;
    off[q + 1] = off[q] + n;
  }
  const int64_t T0 = off[r], Tl = off[r + 1] - off[r];
  float *x = malloc(sizeof(float) * (size_t)(T * D)), *dout = malloc(sizeof(float) * (size_t)(T * D));
  uint64_t s = 12345;
  for (int64_t i = 0; i < T * D; i++) {
    s ^= s << 13; s ^= s >> 7; s ^= s << 17;
    x[i] = (float)((double)(s >> 11) * 0x1p-53 * 4.0 - 2.0);
    dout[i] = (float)((double)((s * 0x9E3779B97F4A7C15ULL) >> 11) * 0x1p-53 - 0.5);
  }
  if (r == 0) printf("moe8 check: %d rank(s), E=%lld top_k=%lld D=%lld F=%lld, %lld tokens in shards of", P, (long long)E,
                     (long long)K, (long long)D, (long long)F, (long long)T);
  for (int q = 0; q < P && r == 0; q++) printf(" %lld", (long long)(off[q + 1] - off[q]));
  if (r == 0) printf("\n");
  if (r == 0 && !quiet) printf("%-72s %12s  %s\n", "property", "max |diff|", "result");
  const char *modes[3] = {"fp8 per-token", "fp8 1x32", "f32"};
  int failures = 0;
  static const char *const epname[2] = {"ring of experts", "all-to-all"};
  for (int em = 0; em < 2 && st == MOE8_OK; em++)
  for (int m = 0; m < 3 && st == MOE8_OK; m++) {
    res single = {0}, ep[2] = {{0}};
    uint64_t gathered[2] = {0, 0}; /* token-row bytes of the forward all-gather, after / before */
    for (int before = 1; before >= 0 && st == MOE8_OK; before--) {
      char j[400];
      snprintf(j, sizeof j, "{\"rules\": [{\"module_path\": \"experts\", \"weight_qtype\": \"float8_e4m3fn\", \"act_qtype\": "
               "\"float8_e4m3fn\"%s}], \"quantize_before_ep_all_gather\": %s}", m == 1 ? ", \"tile_size\": 32" : "",
               before ? "true" : "false");
      moe8_rules *rules = NULL;
      if (m < 2 && (st = moe8_rules_parse(j, strlen(j), "check", &rules)) != MOE8_OK) break;
      const moe8_layer_config cfg = {E, K, D, F, MOE8_SCORE_SOFTMAX, true, 0, false, 0, 0.01f};
      moe8_layer *L = NULL;
      moe8_ep *e = NULL;
      if ((st = moe8_layer_create(&cfg, rules, "model.layers.0.mlp.experts", &L)) == MOE8_OK &&
          (st = moe8_layer_init_random(L, 2024)) == MOE8_OK)
      {
        const moe8_ep_options eo = {sizeof eo, em ? MOE8_EP_ALLTOALL : MOE8_EP_RING};
        st = moe8_ep_create_ex(L, comm, &eo, &e);
      }
      res *R = &ep[before];
      R->out = malloc(sizeof(float) * (size_t)(Tl * D + 1));
      R->dx = malloc(sizeof(float) * (size_t)(Tl * D + 1));
      R->dwr = malloc(sizeof(float) * (size_t)(D * E));
      R->dwe = malloc(sizeof(float) * (size_t)(E * D * F));
      const moe8_layer_grads g = {R->dx, R->dwr, R->dwe, NULL, NULL};
      if (st == MOE8_OK) st = moe8_ep_forward(e, x + T0 * D, Tl, R->out, &R->aux);
      if (st == MOE8_OK && moe8_ep_get_stats(e)) gathered[before] = moe8_ep_get_stats(e)->tokens_bytes;
      if (st == MOE8_OK) st = moe8_ep_backward(e, x + T0 * D, Tl, dout + T0 * D, &g);
      if (st == MOE8_OK && before) {
        /* The single-process layer on all tokens, this rank's view of it. */
        const size_t wsz = moe8_layer_workspace_size(L, T);
        void *ws = NULL;
        single.out = malloc(sizeof(float) * (size_t)(T * D));
        single.dx = malloc(sizeof(float) * (size_t)(T * D));
        single.dwr = malloc(sizeof(float) * (size_t)(D * E));
        single.dwe = malloc(sizeof(float) * (size_t)(E * D * F));
        const moe8_layer_grads sg = {single.dx, single.dwr, single.dwe, NULL, NULL};
        if (posix_memalign(&ws, 64, wsz) != 0) st = MOE8_ERR_NOMEM;
        if (st == MOE8_OK) st = moe8_layer_forward(L, x, T, single.out, &single.aux, ws, wsz);
        if (st == MOE8_OK) st = moe8_layer_backward(L, x, T, dout, ws, wsz, &sg);
        /* keep only this rank's experts of the expert gradient */
        const int64_t per = D * F, e0 = r * (E / P), e1 = e0 + E / P;
        for (int64_t ee = 0; ee < E; ee++)
          if (ee < e0 || ee >= e1) memset(single.dwe + ee * per, 0, sizeof(float) * (size_t)per);
        free(ws);
      }
      moe8_ep_destroy(e);
      moe8_layer_destroy(L);
      moe8_rules_destroy(rules);
    }
    if (st != MOE8_OK) break;
    if (em == 0 && m < 2 && P > 1) {
      /* Seed A's point: the same bytes out, fewer bytes moved. */
      const double after = cli_allreduce_max(comm, (double)gathered[0]), before_b = cli_allreduce_max(comm, (double)gathered[1]);
      if (r == 0)
        printf("all-gather of the token rows (%s, largest rank): %.0f bytes quantized before it, %.0f after it "
               "(f32 rows; bf16 rows would be %.0f): %.2fx fewer bytes than f32, %.2fx fewer than bf16, the outputs checked equal below\n",
               modes[m], before_b, after, after / 2, before_b > 0 ? after / before_b : 0.0, before_b > 0 ? after / 2 / before_b : 0.0);
    }
    struct { const char *what; const float *a, *b; size_t n; } rows[] = {
      {"forward: quantize-before on vs off, output", ep[1].out, ep[0].out, (size_t)(Tl * D)},
      {"backward: quantize-before on vs off, dx", ep[1].dx, ep[0].dx, (size_t)(Tl * D)},
      {"backward: quantize-before on vs off, dWr and dWg", ep[1].dwr, ep[0].dwr, (size_t)(D * E)},
      {"forward: %s vs single process, output", ep[1].out, single.out + T0 * D, (size_t)(Tl * D)},
      {"backward: %s vs single process, dx", ep[1].dx, single.dx + T0 * D, (size_t)(Tl * D)},
      {"backward: %s vs single process, dWr", ep[1].dwr, single.dwr, (size_t)(D * E)},
      {"backward: %s vs single process, own dWg", ep[1].dwe, single.dwe, (size_t)(E * D * F)},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
      if (m == 2 && i < 3) continue; /* f32 has no quantize-before */
      int eq;
      double d = maxdiff(rows[i].a, rows[i].b, rows[i].n, &eq);
      if (i == 2 && eq) { int eq2; d = fmax(d, maxdiff(ep[1].dwe, ep[0].dwe, (size_t)(E * D * F), &eq2)); eq = eq2; }
      if (i == 3) eq = eq && memcmp(&ep[1].aux, &single.aux, 4) == 0;
      d = cli_allreduce_max(comm, d);
      const int fail = (int)cli_allreduce_max(comm, eq ? 0.0 : 1.0);
      failures += fail;
      if (r == 0 && (!quiet || fail)) {
        char what[128], name[160];
        snprintf(what, sizeof what, rows[i].what, epname[em]);
        snprintf(name, sizeof name, "%s (%s%s)", what, modes[m], i < 3 ? (em ? ", all-to-all" : ", ring") : "");
        printf("%-72s %12.3e  %s\n", name, d, fail ? "FAIL" : "PASS");
      }
    }
    for (int b = 0; b < 2; b++) { free(ep[b].out); free(ep[b].dx); free(ep[b].dwr); free(ep[b].dwe); }
    free(single.out); free(single.dx); free(single.dwr); free(single.dwe);
  }
  int rc = EXIT_OK;
  if (st != MOE8_OK) rc = cli_report(st, "check");
  else if (failures) rc = EXIT_FAIL;
  if (r == 0 && st == MOE8_OK) printf("%s\n", failures ? "check: FAILED" : "check: all properties PASS");
  free(off); free(x); free(dout);
  cli_comm_close(comm);
  return rc;
}
