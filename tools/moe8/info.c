/*
** info.c — 'moe8 info DIR': what a model directory holds.
*/
#include "cli.h"

#include <string.h>

int cmd_info(int argc, char **argv) {
  const char *dir = NULL;
  for (int i = 1; i < argc; i++) {
    if (cli_is_help(argv[i])) {
      printf("usage: moe8 info MODEL_DIR\n\nPrints the tensors (name, dtype, shape, bytes), the detected architecture,\n"
             "the MoE sizes from config.json and the expert-weight quantization.\nexit codes: 0 ok, 1 failure, 2 usage\n");
      return EXIT_OK;
    }
    if (dir || argv[i][0] == '-') { fprintf(stderr, "moe8 info: bad argument '%s'\n", argv[i]); return EXIT_USAGE; }
    dir = argv[i];
  }
  if (!dir) { fprintf(stderr, "usage: moe8 info MODEL_DIR\n"); return EXIT_USAGE; }
  moe8_model *m;
  moe8_status st = moe8_model_open(dir, &m);
  if (st != MOE8_OK) return cli_report(st, "info");
  const moe8_hf_config *c = moe8_model_config(m);
  size_t total = 0;
  for (size_t i = 0; i < moe8_model_tensor_count(m); i++) {
    const moe8_tensor_view *t = moe8_model_tensor_at(m, i);
    char shape[128] = "";
    for (int d = 0; d < t->ndim; d++) snprintf(shape + strlen(shape), sizeof shape - strlen(shape), "%s%lld", d ? ", " : "", (long long)t->shape[d]);
    printf("%-64s %-8s [%s] %zu bytes\n", t->name, moe8_file_dtype_name(t->dtype), shape, t->nbytes);
    total += t->nbytes;
  }
  printf("\narchitecture: %s (model_type \"%s\"), %lld layer(s)\n", moe8_arch_name(c->arch), c->model_type, (long long)c->num_layers);
  printf("moe: experts %lld, top_k %lld, hidden %lld, expert ffn %lld, score %s, norm_topk_prob %s, routed_scaling_factor %g%s\n",
         (long long)c->layer.num_experts, (long long)c->layer.top_k, (long long)c->layer.hidden, (long long)c->layer.ffn,
         c->layer.score == MOE8_SCORE_SIGMOID ? "sigmoid" : "softmax", c->layer.norm_topk_prob ? "true" : "false",
         c->layer.routed_scaling_factor ? (double)c->layer.routed_scaling_factor : 1.0, c->has_bias ? ", selection bias" : "");
  printf("quantization: layer 0 experts %s%s\n", moe8_model_format(m, 0), c->fp8 ? " (config: quant_method fp8)" : "");
  printf("tensors: %zu, total %zu bytes (%.2f MiB)\n", moe8_model_tensor_count(m), total, (double)total / 1048576.0);
  moe8_model_close(m);
  return EXIT_OK;
}
