/*
** quantize.c — 'moe8 quantize IN OUT --rules R [--format moe8|deepseek]':
** pre-quantize the expert weights of every layer, once (seed B), through
** moe8_model_quantize() (src/io/quantize_model.c: the formats, and how a
** failure leaves OUT as it was).
*/
#include "cli.h"

#include <stdio.h>
#include <string.h>

static void usage(FILE *f) {
  fprintf(f, "usage: moe8 quantize IN_DIR OUT_DIR --rules RULES.json [--format moe8|deepseek] [--force]\n\n"
             "Pre-quantizes the expert weights of each layer whose '<prefix>experts' module path matches a\n"
             "rule with a weight_qtype (f8e4m3, int8 or mxfp4; f8e5m2 is left unquantized with a notice).\n"
             "Every family, GPT-OSS and Llama-4 included: GPT-OSS's MXFP4 stays in its own layout\n"
             "(docs/files.md); the file's run gives the bytes of the input's run under the rules.\n"
             "  --format moe8      [E, nb, 1, N] scales as the fused kernels consume them (default)\n"
             "  --format deepseek  DeepSeek-V3 FP8: F8_E4M3 .weight + F32 .weight_scale_inv per 128x128 block\n"
             "Other tensors are copied. One progress line per tensor.\n"
             "OUT_DIR must not be IN_DIR; a model already in OUT_DIR is replaced only with --force.\n"
             "exit codes: 0 ok, 1 failure (nothing written), 2 usage\n");
}

static void progress(void *ctx, const char *line) {
  (void)ctx;
  if (!cli_quiet || !strncmp(line, "quantize:", 9) || !strncmp(line, "note:", 5)) printf("%s\n", line);
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
  if (!in || !outdir || !rules_path || (!deepseek && strcmp(format, "moe8"))) {
    if (!in || !outdir) fprintf(stderr, "moe8 quantize: IN_DIR and OUT_DIR are needed\n\n");
    else if (!rules_path) fprintf(stderr, "moe8 quantize: --rules is needed\n\n");
    else fprintf(stderr, "moe8 quantize: --format is moe8 or deepseek, not '%s'\n\n", format);
    usage(stderr);
    return EXIT_USAGE;
  }
  moe8_rules *rules = NULL;
  moe8_status st = moe8_rules_load(rules_path, &rules);
  if (st != MOE8_OK) return cli_report(st, "quantize");
  const moe8_quantize_options o = {sizeof o, deepseek ? MOE8_QFORMAT_DEEPSEEK : MOE8_QFORMAT_MOE8, force != 0, progress, NULL};
  st = moe8_model_quantize(in, outdir, rules, &o);
  moe8_rules_destroy(rules);
  return st == MOE8_OK ? EXIT_OK : cli_report(st, "quantize");
}
