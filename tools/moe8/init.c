/*
** init.c — 'moe8 init': a random MoE model in Hugging Face naming, from a
** config.json of any family moe8 reads, one or more layers, weights
** N(0, 1/fan_in), each family's tensors named and laid out as its
** checkpoints are (the loader, src/io/model.c, is the spec):
**   Qwen-MoE, DeepSeek, OLMoE, ...  mlp.gate.weight, mlp.experts.e.{gate,up,down}_proj.weight
**                                   (out × in), shared_expert(s), e_score_correction_bias
**   Mixtral                         block_sparse_moe.gate.weight, ...experts.e.{w1,w3,w2}.weight
**   GPT-OSS                         mlp.router.{weight,bias}, mlp.experts.gate_up_proj [E, D, 2F]
**                                   (x · W) and its bias [E, 2F], mlp.experts.down_proj [E, F, D]
**                                   and its bias [E, D]; the biases zero
**   Llama-4 (llama4_text, llama4)   feed_forward.router.weight, feed_forward.experts.gate_up_proj
**                                   [E, D, 2F], .down_proj [E, F, D], feed_forward.shared_expert.
**                                   {gate,up,down}_proj.weight; llama4 (multimodal) under
**                                   language_model.model.layers. and its text_config's layer count;
**                                   the other multimodal wrappers under model.language_model.layers.
**   Nemotron-H                      backbone.layers.L.mixer.gate.weight, ...experts.e.{up,down}_proj.weight
**                                   (ungated: no gate_proj), shared_experts.{up,down}_proj.weight;
**                                   with moe_latent_size fc1_latent_proj / fc2_latent_proj.weight
**                                   (nemotron_h_omni under language_model.backbone.layers.,
**                                   nemo_speechlm under llm.model.layers., as their files are)
**   Zaya                            mlp.gate.down_proj.{weight,bias}, gate.router_states_scale (after
**                                   the first layer), gate.router_mlp.{norm,fc1,fc2,out_proj}.*,
**                                   gate.balancing_biases, mlp.experts.gate_up_proj / down_proj
**   NLLB-MoE                        model.{encoder,decoder}.layers.i.ffn.router.classifier.weight (and
**                                   .bias under router_bias), ...experts.expert_e.fc1 / fc2.{weight,bias}
**                                   (ungated; the biases zero); the sparse layers of both stacks
**   MuSE-Spark                      mlp.gate.weight, mlp.experts.e.{gate,up,down}_proj.weight in the
**                                   latent width, pre_expert_proj / post_expert_proj.weight,
**                                   pre_expert_norm.weight and experts.post_expert_norm.weight (zeros)
**
** Each tensor is drawn straight into its file dtype, row by row from its
** own stream (seed, layer, tensor, row), on every thread: the memory is
** the file's tensors and no more (no layer, no f32 masters), and the
** values do not depend on the thread count.  One progress line per layer.
*/
#include "cli.h"
#include "core/internal.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

/* dst[N, K] (f32 or bf16) ~ N(0, 1/fan_in): Box-Muller on a splitmix64
** stream per row. */
static void fill_normal(void *dst, bool bf, int64_t N, int64_t K, int64_t fan_in, uint64_t stream) {
  const float sd = 1.0f / sqrtf((float)fan_in);
  #pragma omp parallel for schedule(static) num_threads(moe8__nt(40.0 * (double)N * (double)K))
  for (int64_t n = 0; n < N; n++) {
    uint64_t s = mix(stream ^ mix((uint64_t)n + 0x632BE59BD9B4E019ULL));
    float row[256];
    for (int64_t k0 = 0; k0 < K; k0 += 256) {
      const int64_t kn = K - k0 < 256 ? K - k0 : 256;
      for (int64_t k = 0; k < kn; k++) {
        const double u0 = (double)(mix(s += 0x9E3779B97F4A7C15ULL) >> 11) * 0x1p-53;
        const double u1 = (double)(mix(s += 0x9E3779B97F4A7C15ULL) >> 11) * 0x1p-53;
        row[k] = sd * (float)(sqrt(-2.0 * log(u0 + 0x1p-60)) * cos(6.283185307179586 * u1));
      }
      moe8_convert((char *)dst + (size_t)(n * K + k0) * (bf ? 2 : 4), bf ? MOE8_DTYPE_BF16 : MOE8_DTYPE_F32, row, MOE8_DTYPE_F32,
                   (size_t)kn, 0);
    }
  }
}

static void usage(FILE *f) {
  fprintf(f, "usage: moe8 init --config CONFIG.json --out DIR [--layers N] [--seed S] [--dtype f32|bf16]\n\n"
             "Writes DIR/config.json and DIR/model.safetensors: a random MoE model with the config's\n"
             "experts, top-k, hidden and intermediate sizes, in the family's own Hugging Face tensor names\n"
             "and layout (Qwen-MoE, Mixtral, DeepSeek, GPT-OSS, Llama-4, ...): moe8 run loads it as it is.\n"
             "exit codes: 0 ok, 1 failure, 2 usage\n");
}

int cli_write_json(const char *path, cJSON *root) {
  char *txt = cJSON_Print(root);
  if (!txt) return EXIT_FAIL;
  const void *parts[2] = {txt, "\n"};
  const size_t lens[2] = {strlen(txt), 1};
  moe8_status st = moe8_file_write_atomic(path, parts, lens, 2);
  free(txt);
  return st == MOE8_OK ? EXIT_OK : cli_report(st, "write");
}

int cli_mkdir(const char *dir) {
  if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
    fprintf(stderr, "moe8: cannot create directory %s: %s\n", dir, strerror(errno));
    return EXIT_FAIL;
  }
  return EXIT_OK;
}

int cmd_init(int argc, char **argv) {
  const char *config = NULL, *outdir = NULL, *dtype = "f32";
  int64_t layers = 0, seed = 1;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (cli_is_help(a)) { usage(stdout); return EXIT_OK; }
    if (!strcmp(a, "--config") && v) config = argv[++i];
    else if (!strcmp(a, "--out") && v) outdir = argv[++i];
    else if (!strcmp(a, "--dtype") && v) dtype = argv[++i];
    else if (!strcmp(a, "--layers") && v && cli_parse_i64(v, &layers)) i++;
    else if (!strcmp(a, "--seed") && v && cli_parse_i64(v, &seed)) i++;
    else { fprintf(stderr, "moe8 init: bad option '%s'\n\n", a); usage(stderr); return EXIT_USAGE; }
  }
  if (!config || !outdir || (strcmp(dtype, "f32") && strcmp(dtype, "bf16"))) { usage(stderr); return EXIT_USAGE; }
  moe8_hf_config hc;
  moe8_status st = moe8_hf_config_load(config, &hc);
  if (st != MOE8_OK) return cli_report(st, "init");
  /* Nemotron-H's layers are its layers_block_type (hybrid_override_pattern)
  ** entries: --layers keeps the first N of them (written so below). */
  const bool typed = hc.decoder_sparse_step <= -4 && hc.decoder_sparse_step >= -6; /* Nemotron-H's layer types */
  if (typed && layers > hc.num_layers) {
    fprintf(stderr, "moe8 init: --layers %lld: the config's layers_block_type has %lld layers\n", (long long)layers, (long long)hc.num_layers);
    return EXIT_USAGE;
  }
  if (hc.encdec && layers > 0) { /* SwitchTransformers, NLLB-MoE: two stacks, counted by their own keys */
    fprintf(stderr, "moe8 init: --layers: %s layers are its encoder's %s and its decoder's %s: set them in the config\n",
            hc.nllb ? "nllb-moe's" : "switch_transformers'", hc.nllb ? "encoder_layers" : "num_layers",
            hc.nllb ? "decoder_layers" : "num_decoder_layers");
    return EXIT_USAGE;
  }
  if (layers > 0) hc.num_layers = layers;
  const int64_t E = hc.layer.num_experts, D = hc.layer.hidden, F = hc.layer.ffn, NL = hc.num_layers;
  /* LongCat-Flash: a router (and bias) over its identity experts too, its
  ** own bias name, and its layer count under num_layers */
  const bool longcat = !strncmp(hc.model_type, "longcat_flash", 13);
  const int64_t ER = E + hc.layer.zero_experts;
  const bool bf = !strcmp(dtype, "bf16");
  const moe8_file_dtype fdt = bf ? MOE8_FDT_BF16 : MOE8_FDT_F32;
  const size_t es = bf ? 2 : 4;
  /* NLLB-MoE's experts: fc1, fc2 and a bias for each (4 tensors an expert) */
  const size_t per_layer = 1 + (hc.has_bias ? 1 : 0) + (size_t)((hc.nllb ? 4 : 3) * E) + 13;
  const int64_t DX = hc.layer.latent > 0 ? hc.layer.latent : D; /* the routed experts' width (latent experts') */
  moe8_tensor_view *tv = calloc(per_layer * (size_t)NL, sizeof *tv);
  char (*names)[256] = calloc(per_layer * (size_t)NL, sizeof *names);
  void **bufs = calloc(per_layer * (size_t)NL, sizeof *bufs);
  if (!tv || !names || !bufs) { fprintf(stderr, "moe8 init: out of memory\n"); return EXIT_FAIL; }
  size_t nt = 0, bytes = 0;
  int rc = EXIT_OK;
  const double t0 = cli_now();
  const int64_t Fs = hc.layer.shared_ffn;
  /* A multimodal model's text layers live under its language model (the
  ** loader looks there first): Llama-4's checkpoints as
  ** language_model.model.layers., transformers 5's other wrappers (Qwen3-VL-
  ** MoE, Qwen3.5-MoE, GLM-4.5V, ...) as model.language_model.layers. */
  const bool multimodal = strstr(hc.model_type, " (text_config)") != NULL;
  /* ERNIE-4.5-VL's files keep its layers at model.layers. (as released) */
  const char *lroot = !multimodal || hc.text_of_two ? (typed ? hc.layers_root : "model.layers.") /* Nemotron-H's backbone.layers. */
                      : !strncmp(hc.model_type, "llama4 ", 7) ? "language_model.model.layers."
                      : !strncmp(hc.model_type, "nemotron_h_omni ", 16) ? "language_model.backbone.layers."
                      : !strncmp(hc.model_type, "nemo_speechlm ", 14) ? "llm.model.layers." : "model.language_model.layers.";
  for (int64_t l = 0; l < NL && rc == EXIT_OK; l++) {
    if (moe8_hf_config_check_moe_layer(&hc, l) != MOE8_OK) { moe8_clear_error(); continue; } /* dense MLP layers are not moe8's */
    char p[96];
    snprintf(p, sizeof p, "%s%lld.%s", lroot, (long long)l,
             hc.block_in_layer ? ""
             : hc.block_prefix[0] ? hc.block_prefix
             : hc.arch == MOE8_ARCH_MIXTRAL ? "block_sparse_moe." : hc.arch == MOE8_ARCH_LLAMA4 ? "feed_forward." : "mlp.");
    if (hc.nllb) /* NLLB-MoE: the encoder's layers, then the decoder's, the block as the layer's ffn. */
      snprintf(p, sizeof p, "model.%s.layers.%lld.ffn.", l < hc.enc_layers ? "encoder" : "decoder",
               (long long)(l < hc.enc_layers ? l : l - hc.enc_layers));
    else if (hc.encdec) /* SwitchTransformers: the encoder's blocks, then the decoder's */
      snprintf(p, sizeof p, "%s.block.%lld.layer.%d.mlp.", l < hc.enc_layers ? "encoder" : "decoder",
               (long long)(l < hc.enc_layers ? l : l - hc.enc_layers), l < hc.enc_layers ? 1 : 2);
    if (hc.arch == MOE8_ARCH_GPT_OSS || hc.arch == MOE8_ARCH_LLAMA4) {
      /* Fused experts, x · W: [E, K, N] is E·K rows of N, fan-in K; a
      ** bias (fan_in 0) is zero, its dtype the file's. */
      const bool oss = hc.arch == MOE8_ARCH_GPT_OSS;
      const struct { const char *name; int ndim; int64_t s0, s1, s2, fan_in; } t[6] = {
        {"router.weight", 2, E, D, 0, D},
        {oss ? "router.bias" : "shared_expert.gate_proj.weight", oss ? 1 : 2, oss ? E : Fs, D, 0, oss ? 0 : D},
        {"experts.gate_up_proj", 3, E, D, 2 * F, D},
        {oss ? "experts.gate_up_proj_bias" : "shared_expert.up_proj.weight", 2, oss ? E : Fs, oss ? 2 * F : D, 0, oss ? 0 : D},
        {"experts.down_proj", 3, E, F, D, F},
        {oss ? "experts.down_proj_bias" : "shared_expert.down_proj.weight", 2, oss ? E : D, oss ? D : Fs, 0, oss ? 0 : Fs}};
      for (int i = 0; i < 6 && rc == EXIT_OK; i++) {
        if (!oss && (i & 1) && Fs <= 0) continue; /* Llama-4 without a shared expert */
        const int64_t rows = t[i].ndim == 3 ? t[i].s0 * t[i].s1 : t[i].ndim == 2 ? t[i].s0 : 1;
        const int64_t cols = t[i].ndim == 3 ? t[i].s2 : t[i].ndim == 2 ? t[i].s1 : t[i].s0;
        snprintf(names[nt], 256, "%s%s", p, t[i].name);
        bufs[nt] = t[i].fan_in ? malloc(es * (size_t)(rows * cols) + 1) : calloc(es * (size_t)(rows * cols) + 1, 1);
        if (!bufs[nt]) { fprintf(stderr, "moe8 init: out of memory for %s\n", names[nt]); rc = EXIT_FAIL; break; }
        if (t[i].fan_in) fill_normal(bufs[nt], bf, rows, cols, t[i].fan_in, mix((uint64_t)seed * 0x9E3779B97F4A7C15ULL ^ mix((uint64_t)l << 32 ^ (uint64_t)nt)));
        tv[nt] = (moe8_tensor_view){names[nt], fdt, t[i].ndim, {t[i].s0, t[i].s1, t[i].s2}, bufs[nt], es * (size_t)(rows * cols), 0};
        bytes += tv[nt].nbytes;
        nt++;
      }
      if (rc == EXIT_OK && !cli_quiet)
        printf("init: layer %lld of %lld drawn (%.2f GB so far, %.1f s)\n", (long long)l + 1, (long long)NL, (double)bytes * 1e-9, cli_now() - t0);
      continue;
    }
    if (hc.layer.product_keys) {
      /* Doge's DogeCDMoE: router_gate over 2 x N keys, the experts' key and
      ** value tables (a value's fan-in top_k: the k slots' sum stays near
      ** unit scale), the dense SwiGLU; out x in */
      int64_t nk = 1;
      while ((nk + 1) * (nk + 1) <= E) nk++;
      const struct { const char *name; int64_t s0, s1, fan_in; } t[6] = {
        {"router_gate.weight", 2 * nk, D, D}, {"down_embed.weight", E, D, D}, {"up_embed.weight", E, D, hc.layer.top_k},
        {"gate_proj.weight", Fs, D, D}, {"up_proj.weight", Fs, D, D}, {"down_proj.weight", D, Fs, Fs}};
      for (int i = 0; i < 6 && rc == EXIT_OK; i++) {
        snprintf(names[nt], 256, "%s%s", p, t[i].name);
        bufs[nt] = malloc(es * (size_t)(t[i].s0 * t[i].s1) + 1);
        if (!bufs[nt]) { fprintf(stderr, "moe8 init: out of memory for %s\n", names[nt]); rc = EXIT_FAIL; break; }
        fill_normal(bufs[nt], bf, t[i].s0, t[i].s1, t[i].fan_in, mix((uint64_t)seed * 0x9E3779B97F4A7C15ULL ^ mix((uint64_t)l << 32 ^ (uint64_t)nt)));
        tv[nt] = (moe8_tensor_view){names[nt], fdt, 2, {t[i].s0, t[i].s1}, bufs[nt], es * (size_t)(t[i].s0 * t[i].s1), 0};
        bytes += tv[nt].nbytes;
        nt++;
      }
      if (rc == EXIT_OK && !cli_quiet)
        printf("init: layer %lld of %lld drawn (%.2f GB so far, %.1f s)\n", (long long)l + 1, (long long)NL, (double)bytes * 1e-9, cli_now() - t0);
      continue;
    }
    if (hc.layer.scored_shared > 0) {
      /* Inkling's block: the router over the routed and the shared experts,
      ** the routed ones' bias (zeros) and the layer's global_scale (1),
      ** the routed experts fused and the shared ones stacked, out x in */
      const int64_t S = hc.layer.scored_shared, Er = E - S;
      const struct { const char *name; int ndim; int64_t s0, s1, s2, fan_in; } t[8] = {
        {"gate.weight", 2, E, D, 0, D}, {"gate.e_score_correction_bias", 1, Er, 0, 0, 0}, {"gate.global_scale", 1, 1, 0, 0, -1},
        {"experts.gate_up_proj", 3, Er, 2 * F, D, D}, {"experts.down_proj", 3, Er, D, F, F}, {"shared_experts.gate_proj", 3, S, F, D, D},
        {"shared_experts.up_proj", 3, S, F, D, D}, {"shared_experts.down_proj", 3, S, D, F, F}};
      for (int i = 0; i < 8 && rc == EXIT_OK; i++) {
        const int64_t rows = t[i].ndim == 3 ? t[i].s0 * t[i].s1 : t[i].ndim == 2 ? t[i].s0 : 1;
        const int64_t cols = t[i].ndim == 3 ? t[i].s2 : t[i].ndim == 2 ? t[i].s1 : t[i].s0;
        const bool f32 = t[i].ndim == 1; /* the router's vectors in f32, as the class keeps them */
        const size_t ee = f32 ? 4 : es;
        snprintf(names[nt], 256, "%s%s", p, t[i].name);
        bufs[nt] = t[i].fan_in > 0 ? malloc(ee * (size_t)(rows * cols) + 1) : calloc(ee * (size_t)(rows * cols) + 1, 1);
        if (!bufs[nt]) { fprintf(stderr, "moe8 init: out of memory for %s\n", names[nt]); rc = EXIT_FAIL; break; }
        if (t[i].fan_in > 0) fill_normal(bufs[nt], bf, rows, cols, t[i].fan_in, mix((uint64_t)seed * 0x9E3779B97F4A7C15ULL ^ mix((uint64_t)l << 32 ^ (uint64_t)nt)));
        if (t[i].fan_in < 0) { const float one = 1.0f; memcpy(bufs[nt], &one, 4); }
        tv[nt] = (moe8_tensor_view){names[nt], f32 ? MOE8_FDT_F32 : fdt, t[i].ndim, {t[i].s0, t[i].s1, t[i].s2}, bufs[nt],
                                    ee * (size_t)(rows * cols), 0};
        bytes += tv[nt].nbytes;
        nt++;
      }
      continue;
    }
    if (hc.layer.router_mlp > 0) {
      /* Zaya's block (ZayaRouter, ZayaExperts): the router MLP, its
      ** vectors f32 as the class keeps them (the biases zeros, the norm
      ** weight and, after the first layer, router_states_scale ones,
      ** balancing_biases zeros but the skip class's -1, as transformers
      ** initializes them), the experts fused, out x in */
      const int64_t R = hc.layer.router_mlp, EC = E + hc.layer.skip_experts;
      const struct { const char *name; int ndim; int64_t s0, s1, s2, fan_in; } t[11] = {
        {"gate.down_proj.weight", 2, R, D, 0, D}, {"gate.down_proj.bias", 1, R, 0, 0, 0}, {"gate.router_states_scale", 1, R, 0, 0, -1},
        {"gate.router_mlp.norm.weight", 1, R, 0, 0, -1}, {"gate.router_mlp.fc1.weight", 2, R, R, 0, R},
        {"gate.router_mlp.fc1.bias", 1, R, 0, 0, 0}, {"gate.router_mlp.fc2.weight", 2, R, R, 0, R}, {"gate.router_mlp.fc2.bias", 1, R, 0, 0, 0},
        {"gate.router_mlp.out_proj.weight", 2, EC, R, 0, R}, {"gate.balancing_biases", 1, EC, 0, 0, -2},
        {"experts.gate_up_proj", 3, E, 2 * F, D, D}};
      for (int i = 0; i < 12 && rc == EXIT_OK; i++) {
        const bool dn = i == 11; /* experts.down_proj [E, D, F] */
        const char *name = dn ? "experts.down_proj" : t[i].name;
        const int ndim = dn ? 3 : t[i].ndim;
        const int64_t s0 = dn ? E : t[i].s0, s1 = dn ? D : t[i].s1, s2 = dn ? F : t[i].s2, fan = dn ? F : t[i].fan_in;
        if (i == 2 && l == 0) continue; /* the first layer's router takes no state */
        const int64_t rows = ndim == 3 ? s0 * s1 : ndim == 2 ? s0 : 1, cols = ndim == 3 ? s2 : ndim == 2 ? s1 : s0;
        const bool f32 = ndim == 1;
        const size_t ee = f32 ? 4 : es;
        snprintf(names[nt], 256, "%s%s", p, name);
        bufs[nt] = fan > 0 ? malloc(ee * (size_t)(rows * cols) + 1) : calloc(ee * (size_t)(rows * cols) + 1, 1);
        if (!bufs[nt]) { fprintf(stderr, "moe8 init: out of memory for %s\n", names[nt]); rc = EXIT_FAIL; break; }
        if (fan > 0) fill_normal(bufs[nt], bf, rows, cols, fan, mix((uint64_t)seed * 0x9E3779B97F4A7C15ULL ^ mix((uint64_t)l << 32 ^ (uint64_t)nt)));
        for (int64_t j = 0; fan == -1 && j < cols; j++) ((float *)bufs[nt])[j] = 1.0f;
        if (fan == -2) ((float *)bufs[nt])[cols - 1] = -1.0f;
        tv[nt] = (moe8_tensor_view){names[nt], f32 ? MOE8_FDT_F32 : fdt, ndim, {s0, s1, s2}, bufs[nt], ee * (size_t)(rows * cols), 0};
        bytes += tv[nt].nbytes;
        nt++;
      }
      if (rc == EXIT_OK && !cli_quiet)
        printf("init: layer %lld of %lld drawn (%.2f GB so far, %.1f s)\n", (long long)l + 1, (long long)NL, (double)bytes * 1e-9, cli_now() - t0);
      continue;
    }
    const char *proj[3] = {hc.arch == MOE8_ARCH_MIXTRAL ? "w1" : "gate_proj", hc.arch == MOE8_ARCH_MIXTRAL ? "w3" : "up_proj",
                           hc.arch == MOE8_ARCH_MIXTRAL ? "w2" : "down_proj"};
    if (hc.encdec) { proj[1] = hc.nllb ? "fc1" : "wi"; proj[2] = hc.nllb ? "fc2" : "wo"; } /* experts.expert_N.wi / wo, NLLB-MoE's fc1 / fc2 */
    /* e = -1 the router, e = E the shared expert, e = E + 1 its gate; each
    ** stored [N, K] = out x in. */
    const int w0 = hc.layer.act == MOE8_ACT_RELU2 || hc.layer.act == MOE8_ACT_RELU; /* ungated experts: up and down */
    for (int64_t e = -1; e < E + (Fs > 0 ? 2 : 0) && rc == EXIT_OK; e++)
      for (int w = e < 0 || e == E + 1 ? 0 : w0; w < (e < 0 || e == E + 1 ? 1 : 3); w++) {
        int64_t N, K;
        if (e < 0) { /* ERNIE-4.5-VL's router is stored in x out */
          N = hc.text_of_two ? D : ER; K = hc.text_of_two ? ER : D;
          snprintf(names[nt], 256, "%s%s", p, longcat || hc.encdec ? "router.classifier.weight" : hc.router_name[0] ? hc.router_name : "gate.weight");
        }
        else if (e == E + 1) {
          if (!hc.layer.shared_gate) continue;
          N = 1; K = D;
          snprintf(names[nt], 256, "%sshared_expert_gate.weight", p);
        } else if (e == E) {
          N = w == 2 ? D : Fs; K = w == 2 ? Fs : D;
          snprintf(names[nt], 256, "%s%s.%s.weight", p, hc.arch == MOE8_ARCH_DEEPSEEK_V3 || hc.arch == MOE8_ARCH_DEEPSEEK_V2 ? "shared_experts" : "shared_expert", proj[w]);
        } else {
          N = w == 2 ? DX : F; K = w == 2 ? F : DX;
          snprintf(names[nt], 256, "%sexperts.%s%lld.%s.weight", p, hc.encdec ? "expert_" : "", (long long)e, proj[w]);
        }
        bufs[nt] = malloc(es * (size_t)(N * K) + 1);
        if (!bufs[nt]) { fprintf(stderr, "moe8 init: out of memory for %s [%lld, %lld]\n", names[nt], (long long)N, (long long)K); rc = EXIT_FAIL; break; }
        fill_normal(bufs[nt], bf, N, K, K, mix((uint64_t)seed * 0x9E3779B97F4A7C15ULL ^ mix((uint64_t)l << 32 ^ (uint64_t)nt)));
        tv[nt] = (moe8_tensor_view){names[nt], fdt, 2, {N, K}, bufs[nt], es * (size_t)(N * K), 0};
        bytes += tv[nt].nbytes;
        nt++;
      }
    /* NLLB-MoE's expert biases, fc1.bias [F] and fc2.bias [D]: zeros, in the
    ** file's dtype as its released files hold them */
    for (int64_t e = 0; hc.nllb && e < E && rc == EXIT_OK; e++)
      for (int w = 1; w <= 2; w++) {
        const int64_t n = w == 1 ? F : D;
        snprintf(names[nt], 256, "%sexperts.expert_%lld.fc%d.bias", p, (long long)e, w);
        bufs[nt] = calloc(es * (size_t)n + 1, 1);
        if (!bufs[nt]) { fprintf(stderr, "moe8 init: out of memory for %s\n", names[nt]); rc = EXIT_FAIL; break; }
        tv[nt] = (moe8_tensor_view){names[nt], fdt, 1, {n}, bufs[nt], es * (size_t)n, 0};
        bytes += tv[nt].nbytes;
        nt++;
      }
    if (hc.encdec && hc.layer.router_bias && rc == EXIT_OK) { /* SwitchTransformers' and NLLB-MoE's router_bias, zeros */
      snprintf(names[nt], 256, "%srouter.classifier.bias", p);
      bufs[nt] = calloc((size_t)E, 4);
      tv[nt] = (moe8_tensor_view){names[nt], MOE8_FDT_F32, 1, {E}, bufs[nt], 4 * (size_t)E, 0};
      bytes += tv[nt].nbytes;
      nt++;
    }
    if (hc.layer.out_bias && rc == EXIT_OK) { /* JetMoE's output bias, zeros */
      snprintf(names[nt], 256, "%sbias", p);
      bufs[nt] = calloc((size_t)D, 4);
      tv[nt] = (moe8_tensor_view){names[nt], MOE8_FDT_F32, 1, {D}, bufs[nt], 4 * (size_t)D, 0};
      bytes += tv[nt].nbytes;
      nt++;
    }
    /* Gemma-4's norm weights and scales, ones (as transformers initializes them) */
    static const char *const norms[4] = {"router.scale", "router.per_expert_scale", "pre_feedforward_layernorm_2.weight",
                                         "post_feedforward_layernorm_2.weight"};
    const bool has_norm[4] = {hc.layer.router_norm, hc.layer.expert_scale, hc.layer.in_norm, hc.layer.out_norm};
    for (int i = 0; i < 4 && rc == EXIT_OK; i++) {
      if (!has_norm[i]) continue;
      const int64_t n = i == 1 ? E : D;
      snprintf(names[nt], 256, "%s%s", p, i == 3 && hc.out_norm_name[0] ? hc.out_norm_name : norms[i]); /* A.X-K1's name */
      float *one = malloc(sizeof(float) * (size_t)n);
      if (!one) { fprintf(stderr, "moe8 init: out of memory for %s\n", names[nt]); rc = EXIT_FAIL; break; }
      for (int64_t j = 0; j < n; j++) one[j] = 1.0f;
      bufs[nt] = one;
      tv[nt] = (moe8_tensor_view){names[nt], MOE8_FDT_F32, 1, {n}, bufs[nt], 4 * (size_t)n, 0};
      bytes += tv[nt].nbytes;
      nt++;
    }
    /* Latent experts: the projections around them (out x in), and
    ** MuSE-Spark's norms, zeros (their scale is 1 + w, as transformers
    ** initializes them) */
    const bool muse = !strncmp(hc.model_type, "muse_spark", 10);
    static const char *const lnames[2][4] = {{"fc1_latent_proj.weight", "fc2_latent_proj.weight", NULL, NULL},
                                             {"pre_expert_proj.weight", "post_expert_proj.weight", "pre_expert_norm.weight",
                                              "experts.post_expert_norm.weight"}};
    for (int i = 0; i < 4 && rc == EXIT_OK && hc.layer.latent > 0; i++) {
      if (!lnames[muse][i]) continue;
      const int64_t N = i == 0 ? DX : i == 1 ? D : 1, K = i == 0 ? D : DX;
      snprintf(names[nt], 256, "%s%s", p, lnames[muse][i]);
      bufs[nt] = i < 2 ? malloc(es * (size_t)(N * K) + 1) : calloc((size_t)K, 4);
      if (!bufs[nt]) { fprintf(stderr, "moe8 init: out of memory for %s\n", names[nt]); rc = EXIT_FAIL; break; }
      if (i < 2) fill_normal(bufs[nt], bf, N, K, K, mix((uint64_t)seed * 0x9E3779B97F4A7C15ULL ^ mix((uint64_t)l << 32 ^ (uint64_t)nt)));
      tv[nt] = i < 2 ? (moe8_tensor_view){names[nt], fdt, 2, {N, K}, bufs[nt], es * (size_t)(N * K), 0}
                     : (moe8_tensor_view){names[nt], MOE8_FDT_F32, 1, {K}, bufs[nt], 4 * (size_t)K, 0};
      bytes += tv[nt].nbytes;
      nt++;
    }
    if (hc.has_bias && rc == EXIT_OK && hc.text_of_two) { /* ERNIE-4.5-VL's [2, E]: text, vision */
      snprintf(names[nt], 256, "%smoe_statics.e_score_correction_bias", p);
      bufs[nt] = calloc((size_t)(2 * E), 4);
      tv[nt] = (moe8_tensor_view){names[nt], MOE8_FDT_F32, 2, {2, E}, bufs[nt], 8 * (size_t)E, 0};
      bytes += tv[nt].nbytes;
      nt++;
    } else if (hc.has_bias && rc == EXIT_OK) {
      snprintf(names[nt], 256, "%s%s", p, longcat ? "router.e_score_correction_bias" : "gate.e_score_correction_bias");
      bufs[nt] = calloc((size_t)ER, 4);
      tv[nt] = (moe8_tensor_view){names[nt], MOE8_FDT_F32, 1, {ER}, bufs[nt], 4 * (size_t)ER, 0};
      bytes += tv[nt].nbytes;
      nt++;
    }
    if (rc == EXIT_OK && !cli_quiet)
      printf("init: layer %lld of %lld drawn (%.2f GB so far, %.1f s)\n", (long long)l + 1, (long long)NL, (double)bytes * 1e-9, cli_now() - t0);
  }
  if (rc == EXIT_OK && !cli_quiet) { printf("init: writing %.2f GB to %s\n", (double)bytes * 1e-9, outdir); fflush(stdout); }
  char path[4096];
  if (rc == EXIT_OK) rc = cli_mkdir(outdir);
  if (rc == EXIT_OK) {
    snprintf(path, sizeof path, "%s/model.safetensors", outdir);
    if ((st = moe8_st_write(path, tv, nt)) != MOE8_OK) rc = cli_report(st, "init");
  }
  if (rc == EXIT_OK) {
    /* config.json: the input's keys, with the layer count we wrote. */
    char *txt = NULL;
    size_t n = 0;
    if ((st = moe8__read_small(config, (size_t)1 << 20, &txt, &n)) != MOE8_OK) (void)cli_report(st, "init");
    cJSON *root = txt ? moe8__json_parse_keeping_numbers(txt, n) : NULL; /* its numbers as written: 7.0 stays 7.0 */
    free(txt);
    if (!root) { fprintf(stderr, "moe8 init: cannot re-read %s\n", config); rc = EXIT_FAIL; }
    else {
      cJSON *lc = multimodal ? cJSON_GetObjectItemCaseSensitive(root, "text_config") : root; /* where the count is read */
      if (multimodal && !cJSON_IsObject(lc)) lc = cJSON_GetObjectItemCaseSensitive(root, "llm_config"); /* Nemotron-3 Nano Omni's */
      if (!hc.encdec) { /* SwitchTransformers' counts stay as written (--layers is refused) */
        cJSON_DeleteItemFromObjectCaseSensitive(lc, "num_hidden_layers");
        cJSON_DeleteItemFromObjectCaseSensitive(lc, "num_layers");
        cJSON_AddNumberToObject(lc, longcat ? "num_layers" : "num_hidden_layers", (double)NL);
      }
      /* Nemotron-H: its layer list, or pattern, cut to the layers written */
      cJSON *lt = cJSON_GetObjectItemCaseSensitive(lc, "layers_block_type"), *hp = cJSON_GetObjectItemCaseSensitive(lc, "hybrid_override_pattern");
      while (typed && cJSON_IsArray(lt) && cJSON_GetArraySize(lt) > NL) cJSON_DeleteItemFromArray(lt, cJSON_GetArraySize(lt) - 1);
      if (typed && !cJSON_IsArray(lt) && cJSON_IsString(hp) && (int64_t)strlen(hp->valuestring) > NL) hp->valuestring[NL] = 0;
      snprintf(path, sizeof path, "%s/config.json", outdir);
      rc = cli_write_json(path, root);
      cJSON_Delete(root);
    }
    if (rc != EXIT_OK) { snprintf(path, sizeof path, "%s/model.safetensors", outdir); remove(path); }
  }
  if (rc == EXIT_OK)
    printf("init: %s, %lld layer(s), E=%lld top_k=%lld D=%lld F=%lld, %zu tensors (%s) -> %s\n", moe8_arch_name(hc.arch), (long long)NL,
           (long long)E, (long long)hc.layer.top_k, (long long)D, (long long)F, nt, dtype, outdir);
  for (size_t i = 0; i < nt; i++) free(bufs[i]);
  free(bufs); free(tv); free(names);
  return rc;
}
