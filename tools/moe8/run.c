/*
** run.c — 'moe8 run': one MoE layer of a model on tokens from a .npy file,
** through the fused inference path (prepared weights, no allocation per
** call).  Reads f32/bf16/f16 checkpoints, DeepSeek FP8 checkpoints and
** moe8's own pre-quantized ones as they are.  With no --rules, a moe8 file
** runs under the rules it was made with (config.json's
** moe8_quantization.rules), and a DeepSeek FP8 checkpoint quantizes its
** activations dynamically to f8e4m3 per token and K block, as DeepSeek's
** activation_scheme "dynamic" does.
*/
#include "cli.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
  fprintf(f, "usage: moe8 run --model DIR --input X.npy --output Y.npy [--token-ids IDS.npy] [--seq-len N] [--rules RULES.json] [--layer L] [--arch FAMILY]\n"
             "                [--router-state-in S.npy] [--router-state-out S.npy] [--training-load]\n\n"
             "X is [T, hidden] (f32, f16 or bf16 as uint16); Y is written as f32 [T, hidden].\n"
             "--token-ids IDS the tokens' ids, [T] int32 or int64: a layer that routes by token id (DeepSeek-V4's hash_moe\n"
             "                layers) needs them; other layers do not read them\n"
             "--seq-len N     the rows are sequences of N tokens (T a multiple of N; default: one sequence of T): a layer\n"
             "                with an expert capacity (SwitchTransformers') counts it per sequence; other layers do not read it\n"
             "--router-state-in S   the previous layer's router state, [T, R] (R the config's router_hidden_size): Zaya's layers\n"
             "                after the first add it to their router's input and need it (layer L - 1's --router-state-out)\n"
             "--router-state-out S  write this layer's router state [T, R] as f32, for the next layer (Zaya's layers; it may be\n"
             "                the --router-state-in file, replaced)\n"
             "--rules R       quantization rules (docs/numerics.md); without it a moe8 file runs under the rules it was made\n"
             "                with, a DeepSeek FP8 checkpoint with dynamic f8e4m3 activations, anything else unquantized\n"
             "--layer L       the MoE layer to run (default: the first MoE layer of the config)\n"
             "--arch FAMILY   read config.json as FAMILY, any model_type moe8 runs (docs/models.md lists them), for a compatible\n"
             "                model_type moe8 does not know\n"
             "--training-load build f32 master weights as training does (more memory; the same output bytes, except\n"
             "                an MXFP4 checkpoint with f32 activations: its experts' sums run in another order, each element\n"
             "                within 1e-5 of its token's largest |y|; docs/determinism.md)\n"
             "--repeat N      run the forward N times and report the fastest (timing)\n"
             "--ep-mode M     under mpirun: ring (default) or alltoall (docs/parallelism.md)\n"
             "The layer is loaded for inference: expert weights go from the file to the kernels' layout once, without f32 copies.\n"
             "The T rows are one call: a product-key layer (Doge's) routes each token with other rows' router logits, as\n"
             "transformers does over a batch's tokens (a file of one row routes that token alone; docs/layer.md).\n"
             "Under mpirun -n P the layer runs expert-parallel (P must divide the experts); rank 0 writes Y.\n"
             "exit codes: 0 ok, 1 failure (bad file, non-finite input; no output written), 2 usage\n");
}

/* The output must not be one of the inputs (same file, by device and inode). */
static int output_is_input(const char *output, const char *input, const char *dir) {
  if (cli_same_file(output, input)) {
    fprintf(stderr, "moe8 run: the output %s is the input %s: refused\n", output, input);
    return 1;
  }
  DIR *d = opendir(dir);
  if (!d) return 0; /* the model open reports it */
  char path[4096];
  int same = 0;
  for (struct dirent *e; !same && (e = readdir(d));) {
    const size_t l = strlen(e->d_name);
    if (strcmp(e->d_name, "config.json") && !(l > 12 && !strcmp(e->d_name + l - 12, ".safetensors"))) continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    if (cli_same_file(output, path)) same = 1;
  }
  closedir(d);
  if (same) fprintf(stderr, "moe8 run: the output %s is %s, a file of the model: refused\n", output, path);
  return same;
}

typedef struct progress_ctx { double t0; int64_t layer; } progress_ctx;

/* A line on stderr about every second once a load has taken two. */
static void progress(void *ctx, int64_t done, int64_t total) {
  const progress_ctx *p = ctx;
  const double t = cli_now() - p->t0;
  if (t > 2.0) fprintf(stderr, "load: layer %lld: %lld/%lld experts, %.1f s\n", (long long)p->layer, (long long)done, (long long)total, t);
}

int cmd_run(int argc, char **argv) {
  const char *dir = NULL, *input = NULL, *output = NULL, *rules_path = NULL, *arch = NULL, *tok_path = NULL;
  const char *rs_in_path = NULL, *rs_out_path = NULL;
  int64_t layer = -1;
  int training_load = 0;
  int64_t repeat = 1, seq_len = 0;
  moe8_ep_mode ep_mode = MOE8_EP_RING;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (cli_is_help(a)) { usage(stdout); return EXIT_OK; }
    if (!strcmp(a, "--model") && v) dir = argv[++i];
    else if (!strcmp(a, "--input") && v) input = argv[++i];
    else if (!strcmp(a, "--output") && v) output = argv[++i];
    else if (!strcmp(a, "--token-ids") && v) tok_path = argv[++i];
    else if (!strcmp(a, "--router-state-in") && v) rs_in_path = argv[++i];
    else if (!strcmp(a, "--router-state-out") && v) rs_out_path = argv[++i];
    else if (!strcmp(a, "--rules") && v) rules_path = argv[++i];
    else if (!strcmp(a, "--arch") && v) arch = argv[++i];
    else if (!strcmp(a, "--training-load")) training_load = 1;
    else if (!strcmp(a, "--ep-mode") && v && (!strcmp(v, "ring") || !strcmp(v, "alltoall"))) { ep_mode = !strcmp(v, "ring") ? MOE8_EP_RING : MOE8_EP_ALLTOALL; i++; }
    else if (!strcmp(a, "--seq-len") && v && cli_parse_i64(v, &seq_len) && seq_len >= 1) i++;
    else if (!strcmp(a, "--repeat") && v && cli_parse_i64(v, &repeat) && repeat <= 1000) i++;
    else if (!strcmp(a, "--layer") && v) {
      char *e;
      errno = 0;
      layer = strtoll(v, &e, 10);
      if (*e || e == v || errno || layer < 0) {
        fprintf(stderr, "moe8 run: --layer '%s' is not a layer number (0, 1, ...)\n", v);
        return EXIT_USAGE;
      }
      i++;
    }
    else { fprintf(stderr, "moe8 run: bad option '%s'\n\n", a); usage(stderr); return EXIT_USAGE; }
  }
  if (!dir || !input || !output) {
    fprintf(stderr, "moe8 run: missing %s\n\n", !dir ? "--model DIR" : !input ? "--input X.npy" : "--output Y.npy");
    usage(stderr);
    return EXIT_USAGE;
  }
  if (output_is_input(output, input, dir)) return EXIT_FAIL;
  if (rs_out_path) { /* the state written: not the output, nor an input but the state it replaces */
    if (!strcmp(rs_out_path, output) || cli_same_file(rs_out_path, output)) {
      fprintf(stderr, "moe8 run: --router-state-out %s is the --output file: refused\n", rs_out_path);
      return EXIT_FAIL;
    }
    if (output_is_input(rs_out_path, input, dir)) return EXIT_FAIL;
    if (tok_path && cli_same_file(rs_out_path, tok_path)) {
      fprintf(stderr, "moe8 run: --router-state-out %s is the --token-ids file: refused\n", rs_out_path);
      return EXIT_FAIL;
    }
  }
  if (rs_in_path && (!strcmp(rs_in_path, output) || cli_same_file(rs_in_path, output))) {
    fprintf(stderr, "moe8 run: the output %s is the --router-state-in file: refused\n", output);
    return EXIT_FAIL;
  }
  /* Under mpirun the communicator comes first, so that every later wait
  ** (a rank that fails, or stops, while loading) meets the collective
  ** deadline instead of hanging in MPI's start-up. */
  moe8_comm *c = NULL;
  bool agreed = false;
  if (cli_under_mpirun()) {
    moe8_status cs = cli_comm_open(&c);
    if (cs != MOE8_OK) return cli_report(cs, "run");
  }
  moe8_model *m = NULL;
  moe8_rules *rules = NULL;
  moe8_layer *L = NULL;
  void *x = NULL, *ws = NULL, *traw = NULL, *sraw = NULL;
  float *xf = NULL, *y = NULL, *rsi = NULL, *rso = NULL;
  int32_t *tok = NULL;
  int rc = EXIT_OK;
  double tl0 = cli_now();
  moe8_status st = moe8_model_open_as(dir, arch, &m);
  if (st == MOE8_OK && layer < 0) {
    layer = moe8_hf_config_first_moe_layer(moe8_model_config(m));
    if (layer < 0) {
      /* say why, by key: what layer 0 is */
      moe8_hf_config_check_moe_layer(moe8_model_config(m), 0);
      fprintf(stderr, "moe8 run: %s: config.json has no MoE layer: %s\n", dir, moe8_last_error());
      rc = EXIT_FAIL;
      goto done;
    }
  }
  if (st == MOE8_OK && rules_path) st = moe8_rules_load(rules_path, &rules);
  /* No --rules on an FP8 checkpoint: the library applies the activation
  ** rule the checkpoint was made for (moe8_model_load_layer_ex). */
  if (st == MOE8_OK) {
    progress_ctx pc = {tl0, layer};
    const moe8_load_options lo = {sizeof lo, training_load ? MOE8_LOAD_TRAINING : MOE8_LOAD_INFERENCE, progress, &pc};
    st = moe8_model_load_layer_ex(m, layer, rules, &lo, &L);
  }
  if (st != MOE8_OK) { rc = cli_report(st, "run"); goto done; }
  if (cli_now() - tl0 > 2.0) fprintf(stderr, "load: layer %lld ready in %.1f s\n", (long long)layer, cli_now() - tl0);
  const int64_t D = moe8_model_config(m)->layer.hidden;
  moe8_file_dtype dt;
  int nd;
  int64_t shape[MOE8_MAX_DIMS];
  if ((st = moe8_npy_read(input, &dt, &nd, shape, &x)) != MOE8_OK) { rc = cli_report(st, "run"); goto done; }
  if (nd != 2 || shape[1] != D) {
    char dims[160] = "";
    for (int i = 0; i < nd; i++) snprintf(dims + strlen(dims), sizeof dims - strlen(dims), "%s%lld", i ? ", " : "", (long long)shape[i]);
    fprintf(stderr, "moe8 run: %s: shape must be [T, %lld] (the model's hidden size), got %d-D %s [%s]\n", input, (long long)D, nd,
            moe8_file_dtype_name(dt), dims);
    rc = EXIT_FAIL;
    goto done;
  }
  const int64_t T = shape[0];
  xf = malloc(sizeof(float) * (size_t)(T * D) + 4);
  y = malloc(sizeof(float) * (size_t)(T * D) + 4);
  if (!xf || !y) { fprintf(stderr, "moe8 run: out of memory\n"); rc = EXIT_FAIL; goto done; }
  if ((st = moe8_file_to_f32(xf, x, dt, (size_t)(T * D))) != MOE8_OK) { rc = cli_report(st, "run"); goto done; }
  size_t bad = 0;
  int64_t first = -1;
  for (int64_t i = 0; i < T * D; i++)
    if (!isfinite(xf[i])) { bad++; if (first < 0) first = i; }
  if (bad) {
    fprintf(stderr, "moe8 run: %s: %zu non-finite value(s), first at [%lld, %lld]\n", input, bad, (long long)(first / D), (long long)(first % D));
    rc = EXIT_FAIL;
    goto done;
  }
  /* The tokens' ids: [T] (or [T, 1]) int32 / int64, each in [0, 2^31) (the
  ** layer checks them against its table's rows). */
  if (tok_path) {
    moe8_file_dtype tdt;
    int tnd;
    int64_t tsh[MOE8_MAX_DIMS];
    if ((st = moe8_npy_read(tok_path, &tdt, &tnd, tsh, &traw)) != MOE8_OK) { rc = cli_report(st, "run"); goto done; }
    if ((tdt != MOE8_FDT_I32 && tdt != MOE8_FDT_I64) || !(tnd == 1 || (tnd == 2 && tsh[1] == 1)) || tsh[0] != T) {
      char dims[160] = "";
      for (int i = 0; i < tnd; i++) snprintf(dims + strlen(dims), sizeof dims - strlen(dims), "%s%lld", i ? ", " : "", (long long)tsh[i]);
      fprintf(stderr, "moe8 run: --token-ids %s: must be int32 or int64 [%lld] (one id per row of %s), got %d-D %s [%s]\n", tok_path,
              (long long)T, input, tnd, moe8_file_dtype_name(tdt), dims);
      rc = EXIT_FAIL;
      goto done;
    }
    tok = malloc(sizeof(int32_t) * (size_t)T + 4);
    if (!tok) { fprintf(stderr, "moe8 run: out of memory\n"); rc = EXIT_FAIL; goto done; }
    for (int64_t t = 0; t < T; t++) {
      int64_t v;
      if (tdt == MOE8_FDT_I64) { int64_t w; memcpy(&w, (const char *)traw + 8 * t, 8); v = w; }
      else { int32_t w; memcpy(&w, (const char *)traw + 4 * t, 4); v = w; }
      if (v < 0 || v > INT32_MAX) {
        fprintf(stderr, "moe8 run: --token-ids %s: token %lld has id %lld, not a token id (0 .. 2^31 - 1)\n", tok_path, (long long)t,
                (long long)v);
        rc = EXIT_FAIL;
        goto done;
      }
      tok[t] = (int32_t)v;
    }
  }
  if (moe8_layer_get_config(L)->hash_routing && !tok) {
    fprintf(stderr, "moe8 run: layer %lld of %s routes by token id (mlp_layer_types[%lld] is \"hash_moe\"): give the tokens' ids with "
            "--token-ids IDS.npy\n", (long long)layer, dir, (long long)layer);
    rc = EXIT_FAIL;
    goto done;
  }
  /* Zaya's router state: the previous layer's in (never a zero one made
  ** up here), this layer's out. */
  const moe8_layer_config *lcf = moe8_layer_get_config(L);
  const int64_t R = lcf->router_mlp;
  if (lcf->router_state && !rs_in_path) {
    fprintf(stderr, "moe8 run: layer %lld of %s adds the previous layer's router state to its router's input (Zaya's layers after the "
            "first): give it with --router-state-in S.npy (layer %lld's --router-state-out, [T, %lld])\n", (long long)layer, dir,
            (long long)layer - 1, (long long)R);
    rc = EXIT_FAIL;
    goto done;
  }
  if (rs_in_path && !lcf->router_state) {
    fprintf(stderr, "moe8 run: --router-state-in %s: layer %lld of %s takes no router state (%s)\n", rs_in_path, (long long)layer, dir,
            R > 0 ? "the first layer's router reads its input alone" : "its router is not Zaya's MLP router");
    rc = EXIT_FAIL;
    goto done;
  }
  if (rs_out_path && R == 0) {
    fprintf(stderr, "moe8 run: --router-state-out %s: layer %lld of %s has no router state (its router is not Zaya's MLP router)\n",
            rs_out_path, (long long)layer, dir);
    rc = EXIT_FAIL;
    goto done;
  }
  if (rs_in_path) {
    moe8_file_dtype sdt;
    int snd;
    int64_t ssh[MOE8_MAX_DIMS];
    if ((st = moe8_npy_read(rs_in_path, &sdt, &snd, ssh, &sraw)) != MOE8_OK) { rc = cli_report(st, "run"); goto done; }
    if ((sdt != MOE8_FDT_F32 && sdt != MOE8_FDT_F16 && sdt != MOE8_FDT_BF16) || snd != 2 || ssh[0] != T || ssh[1] != R) {
      char dims[160] = "";
      for (int i = 0; i < snd; i++) snprintf(dims + strlen(dims), sizeof dims - strlen(dims), "%s%lld", i ? ", " : "", (long long)ssh[i]);
      fprintf(stderr, "moe8 run: --router-state-in %s: must be [%lld, %lld] (one row per row of %s, the router's width) f32, f16 or "
              "bf16, got %d-D %s [%s]\n", rs_in_path, (long long)T, (long long)R, input, snd, moe8_file_dtype_name(sdt), dims);
      rc = EXIT_FAIL;
      goto done;
    }
    rsi = malloc(sizeof(float) * (size_t)(T * R) + 4);
    if (!rsi) { fprintf(stderr, "moe8 run: out of memory\n"); rc = EXIT_FAIL; goto done; }
    if ((st = moe8_file_to_f32(rsi, sraw, sdt, (size_t)(T * R))) != MOE8_OK) { rc = cli_report(st, "run"); goto done; }
  }
  if (rs_out_path && !(rso = malloc(sizeof(float) * (size_t)(T * R) + 4))) {
    fprintf(stderr, "moe8 run: out of memory\n");
    rc = EXIT_FAIL;
    goto done;
  }
  moe8_prepared pr;
  if (moe8_layer_prepared(L, &pr) != MOE8_OK && (st = moe8_layer_prepare(L)) != MOE8_OK) { rc = cli_report(st, "run"); goto done; }
  double t0 = cli_now(), t1;
  int rank = 0, P = 1;
  if (c) {
    /* Expert parallel: rank q runs its shard of the tokens; rank 0 writes.
    ** First every rank says it got here (a rank that failed says so at
    ** done:, the same collective). */
    moe8_ep *ep = NULL;
    agreed = true;
    if (cli_allreduce_max(c, 0.0) != 0.0 || moe8_comm_broken(c)) {
      fprintf(stderr, "moe8 run: rank %d: stopped: another rank failed (its message is above)\n", moe8_comm_rank(c));
      rc = EXIT_FAIL;
      goto done;
    }
    {
      /* Every rank read its own copy of the input: they must agree on its
      ** size before any row moves (the same message on every rank). */
      const double tmax = cli_allreduce_max(c, (double)T), tmin = -cli_allreduce_max(c, -(double)T);
      if (tmax != tmin) {
        fprintf(stderr, "moe8 run: rank %d: the ranks were given inputs with different token counts (from %.0f to %.0f rows in %s): "
                "every rank must read the same input\n", moe8_comm_rank(c), tmin, tmax, input);
        rc = EXIT_FAIL;
        goto done;
      }
      /* ... and on its contents: a digest of the values (FNV-1a over the
      ** f32 rows), compared in two exact 32-bit halves. */
      uint64_t h = 0xCBF29CE484222325ULL;
      const unsigned char *xb = (const unsigned char *)xf;
      for (size_t i = 0; i < sizeof(float) * (size_t)(T * D); i++) h = (h ^ xb[i]) * 0x100000001B3ULL;
      for (int64_t t = 0; tok && t < T; t++) h = (h ^ (uint32_t)tok[t]) * 0x100000001B3ULL; /* and the token ids */
      const double hi = (double)(h >> 32), lo = (double)(h & 0xFFFFFFFFu);
      const double hmax = cli_allreduce_max(c, hi), hmin = -cli_allreduce_max(c, -hi);
      const double lmax = cli_allreduce_max(c, lo), lmin = -cli_allreduce_max(c, -lo);
      if (hmax != hmin || lmax != lmin) {
        fprintf(stderr, "moe8 run: rank %d: the ranks were given different inputs of the same shape [%lld, %lld] (this rank's %s has "
                "digest %016llx, another rank's differs): every rank must read the same input\n", moe8_comm_rank(c), (long long)T,
                (long long)D, input, (unsigned long long)h);
        rc = EXIT_FAIL;
        goto done;
      }
      const moe8_ep_options eo = {sizeof eo, ep_mode};
      st = moe8_ep_create_ex(L, c, &eo, &ep);
    }
    if (st == MOE8_OK) {
      P = moe8_comm_size(c);
      rank = moe8_comm_rank(c);
      const int64_t t0q = T * rank / P, t1q = T * (rank + 1) / P;
      float *yl = malloc(sizeof(float) * (size_t)((t1q - t0q) * D) + 4);
      t0 = cli_now();
      st = yl ? moe8_ep_forward_tokens(ep, xf + t0q * D, t1q - t0q, tok ? tok + t0q : NULL, yl, NULL) : MOE8_ERR_NOMEM;
      if (st == MOE8_OK) st = cli_gather_rows(c, yl, t1q - t0q, D, y);
      free(yl);
    }
    t1 = cli_now();
    moe8_ep_destroy(ep);
    if (st != MOE8_OK) { rc = cli_report(st, "run"); goto done; }
  } else {
    const size_t wsz = moe8_layer_workspace_size(L, T);
    if (posix_memalign(&ws, 64, wsz ? wsz : 64) != 0) { fprintf(stderr, "moe8 run: out of memory\n"); rc = EXIT_FAIL; goto done; }
    /* --repeat N: the same forward N times, the fastest reported (timing only; the output is the same). */
    double best = 1e300;
    for (int64_t r = 0; r < repeat; r++) {
      t0 = cli_now();
      st = R > 0 ? moe8_layer_forward_fused_state(L, xf, T, rsi, rso, y, ws, wsz) : moe8_layer_forward_fused_seq(L, xf, T, tok, seq_len, y, ws, wsz);
      if (st != MOE8_OK) { rc = cli_report(st, "run"); goto done; }
      t1 = cli_now();
      if (t1 - t0 < best) best = t1 - t0;
    }
    t0 = 0.0;
    t1 = best;
  }
  if (rank == 0) {
    const int64_t oshape[2] = {T, D};
    if ((st = moe8_npy_write(output, MOE8_FDT_F32, 2, oshape, y)) != MOE8_OK) { rc = cli_report(st, "run"); goto done; }
    const int64_t sshape[2] = {T, R};
    if (rso && (st = moe8_npy_write(rs_out_path, MOE8_FDT_F32, 2, sshape, rso)) != MOE8_OK) { rc = cli_report(st, "run"); goto done; }
    printf("run: %s layer %lld (%s), %lld tokens, %s%s: %.2f ms -> %s\n", moe8_arch_name(moe8_model_config(m)->arch), (long long)layer,
           moe8_model_format(m, layer), (long long)T, moe8_layer_describe(L), P > 1 ? ", expert parallel" : "", (t1 - t0) * 1e3, output);
  }
done:
  if (c && !agreed) (void)cli_allreduce_max(c, 1.0); /* this rank failed before the others' check */
  if (c) cli_comm_close(c);
  free(x); free(xf); free(y); free(ws); free(traw); free(tok); free(sraw); free(rsi); free(rso);
  moe8_layer_destroy(L);
  moe8_rules_destroy(rules);
  moe8_model_close(m);
  return rc;
}
