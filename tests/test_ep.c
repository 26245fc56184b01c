/*
** test_ep.c — docs/parallelism.md, docs/determinism.md: expert parallelism, run by ctest under
** mpirun -n P (P = 1, 2, 4).  Every rank builds the same layer and the same
** global tokens, runs the single-process layer on all of them as the
** reference, then the ring of experts on its own shard, and compares bytes:
** output, aux loss, dx (its rows), dWr, and its experts' dWg, dWu, dWd.
** Cases: f32, FP8 and i8 (per-token and 1×tile activations), the
** families' routings, shared experts and Llama-4's input scaling, quantize-before
** on and off, uneven shards with a rank holding no tokens, an expert with
** no tokens, every token on one rank's experts; FP8 forward again on
** prepared (packed) weights; and the failures: ranks
** that disagree on the config, E not divisible by P, NaN on one rank.
*/
#include "testutil.h"
#include "core/internal.h"

#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_rank, g_size;
static moe8_comm *g_comm;
static moe8_ep_mode g_mode; /* the mode under test */

static moe8_status ep_create(moe8_layer *L, moe8_ep **ep) {
  const moe8_ep_options o = {sizeof o, g_mode};
  return moe8_ep_create_ex(L, g_comm, &o, ep);
}

typedef struct grads { float *dx, *dwr, *dwg, *dwu, *dwd, *sg, *su, *sd, *sgate, *rs, *es, *in, *on; } grads;

enum { FS = 24 }; /* the shared expert's width in the shared scenarios */

static void grads_alloc(grads *g, int64_t T, int64_t D, int64_t E, int64_t F) {
  g->sg = malloc(sizeof(float) * (size_t)(D * FS));
  g->su = malloc(sizeof(float) * (size_t)(D * FS));
  g->sd = malloc(sizeof(float) * (size_t)(D * FS));
  g->sgate = malloc(sizeof(float) * (size_t)D);
  g->dx = malloc(sizeof(float) * (size_t)(T * D + 1));
  g->dwr = malloc(sizeof(float) * (size_t)(D * E));
  g->dwg = malloc(sizeof(float) * (size_t)(E * D * F));
  g->dwu = malloc(sizeof(float) * (size_t)(E * D * F));
  g->dwd = malloc(sizeof(float) * (size_t)(E * F * D));
  g->rs = malloc(sizeof(float) * (size_t)D);
  g->es = malloc(sizeof(float) * (size_t)E);
  g->in = malloc(sizeof(float) * (size_t)D);
  g->on = malloc(sizeof(float) * (size_t)D);
}

static void grads_free(grads *g) {
  free(g->dx); free(g->dwr); free(g->dwg); free(g->dwu); free(g->dwd); free(g->sg); free(g->su); free(g->sd); free(g->sgate);
  free(g->rs); free(g->es); free(g->in); free(g->on);
}

static moe8_rules *rules_for(int mode, bool before) {
  if (mode == 0) return NULL;
  /* 1 fp8 per-token, 2 fp8 1x16, 3 i8 per-token, 4 fp8 1x128 */
  const char *qt = mode == 3 ? "int8" : "float8_e4m3fn";
  const char *tile = mode == 2 ? ", \"tile_size\": 16" : mode == 4 ? ", \"tile_size\": 128" : "";
  char j[512];
  snprintf(j, sizeof j,
           "{\"rules\": [{\"module_path\": \"experts\", \"weight_qtype\": \"%s\", \"act_qtype\": \"%s\"%s}],"
           " \"quantize_before_ep_all_gather\": %s}",
           qt, qt, tile, before ? "true" : "false");
  moe8_rules *r = NULL;
  assert_int_equal(moe8_rules_parse(j, strlen(j), "inline", &r), MOE8_OK);
  return r;
}

/* Shards of T tokens over P ranks: uneven, sometimes empty. */
static void shards(int variant, int64_t T, int64_t *off) {
  static const int64_t p2[2][2] = {{15, 22}, {37, 0}}, p4[2][4] = {{10, 7, 0, 20}, {20, 0, 12, 5}},
                       p8[2][8] = {{5, 5, 5, 5, 5, 4, 4, 4}, {0, 10, 0, 5, 7, 0, 15, 0}};
  off[0] = 0;
  for (int q = 0; q < g_size; q++) {
    const int64_t n = g_size == 1 ? T : g_size == 2 ? p2[variant][q] : g_size == 4 ? p4[variant][q] : g_size == 8 ? p8[variant][q]
                    : T / g_size + (q < T % g_size);
    off[q + 1] = off[q] + n;
  }
}

typedef struct scenario {
  const char *name;
  int         mode;       /* 0 f32, 1 fp8 per-token, 2 fp8 1x16, 3 i8 per-token, 4 fp8 1x128 (D = 320) */
  int         bias;       /* 0 none, 1 expert 5 unused, 2 all tokens on rank 0's experts, 3 all negative (AXK2's mask) */
  int         shard_variant;
  float       aux, capacity;
  int         shared;     /* 0 none, 1 DeepSeek-V3 (ungated, sigmoid, group routing), 2 Qwen2-MoE (gated),
                          ** 3 DeepSeek-V2 (ungated, softmax, groups scored by their best),
                          ** 4 Llama-4 (ungated; sigmoid scores scaling each expert's input),
                          ** 5 AXK2 (DeepSeek-V3's, one of 4 groups kept, the dropped groups' values 0.0),
                          ** 6 Gemma-4 (no shared expert: the router's and the experts' input norms, the
                          **   per-expert scale, the output norm, GeGLU),
                          ** 7 Inkling's router-scored shared expert (the last expert, every token's second slot) */
  int         act;        /* the experts' activation (moe8_expert_act), in the shared expert too: 0 SwiGLU, 1 GPT-OSS's
                          ** clamped one without biases (MiniMax-M3), 3 clamped after the activation with the shared
                          ** expert's own limit (Step), 4 softcapped (Inkling-2), 5 and 6 the ungated relu2 (Nemotron-H)
                          ** and relu */
} scenario;

static void run_scenario(const scenario *sc) {
  const int64_t E = 8, K = 2, D = sc->mode == 4 ? 320 : 64, F = 48, T = 37;
  moe8_layer_config cfg = {E, K, D, F, MOE8_SCORE_SOFTMAX, true, 0, sc->bias != 0, sc->capacity, sc->aux};
  if (sc->shared) { cfg.shared_ffn = FS; cfg.shared_gate = sc->shared == 2; }
  if (sc->shared == 3) { cfg.norm_topk_prob = false; cfg.routed_scaling_factor = 16.0f; cfg.n_group = 4; cfg.topk_group = 1; cfg.group_score = MOE8_GROUP_MAX; }
  if (sc->shared == 1) { cfg.score = MOE8_SCORE_SIGMOID; cfg.routed_scaling_factor = 2.5f; cfg.n_group = 4; cfg.topk_group = 2; }
  if (sc->shared == 5) { cfg.score = MOE8_SCORE_SIGMOID; cfg.routed_scaling_factor = 2.5f; cfg.n_group = 4; cfg.topk_group = 1; cfg.group_mask_zero = true; }
  if (sc->shared == 4) { cfg.score = MOE8_SCORE_SIGMOID; cfg.norm_topk_prob = false; cfg.weight_input = true; }
  if (sc->shared == 6) {
    cfg.shared_ffn = 0;
    cfg.router_norm = cfg.expert_scale = cfg.in_norm = cfg.out_norm = true;
    cfg.router_norm_scale = 0.125f;
    cfg.rms_eps = 1e-6f;
  }
  if (sc->shared == 7) { cfg.score = MOE8_SCORE_SIGMOID; cfg.routed_scaling_factor = 8.0f; cfg.scored_shared = 1; cfg.shared_ffn = 0; }
  cfg.act = (moe8_expert_act)sc->act;
  if (sc->act == MOE8_ACT_SWIGLU_CLAMP) { cfg.act_alpha = 1.702f; cfg.act_limit = 0.4f; }
  if (sc->act == MOE8_ACT_SWIGLU_POST) { cfg.act_limit = 0.4f; cfg.shared_act_limit = 0.3f; }
  if (sc->act == MOE8_ACT_SWIGLU_SOFTCAP) { cfg.act_alpha = 0.5f; cfg.act_limit = 0.4f; }
  float *x = malloc(sizeof(float) * (size_t)(T * D)), *r = malloc(sizeof(float) * (size_t)(T * D));
  tu_rng_reset(4242);
  tu_fill_normal(x, (size_t)(T * D), 1.0f);
  tu_fill_normal(r, (size_t)(T * D), 1.0f);
  int64_t off[9];
  shards(sc->shard_variant, T, off);
  const int64_t T0 = off[g_rank], Tl = off[g_rank + 1] - off[g_rank];
  float *out_b[2] = {NULL, NULL}, aux_b[2];
  grads gb[2];
  for (int before = 1; before >= 0; before--) {
    moe8_rules *rules = rules_for(sc->mode, before);
    moe8_layer *L;
    assert_int_equal(moe8_layer_create(&cfg, rules, "model.layers.0.mlp.experts", &L), MOE8_OK);
    assert_int_equal(moe8_layer_init_random(L, 77), MOE8_OK);
    if (sc->bias) {
      float *b = moe8_layer_weight(L, MOE8_W_BIAS, NULL);
      for (int64_t e = 0; e < E; e++) b[e] = 0.0f;
      if (sc->bias == 1) b[5] = -100.0f;
      else if (sc->bias == 3) for (int64_t e = 0; e < E; e++) b[e] = -0.9f + 0.05f * (float)e; /* dropped experts chosen */
      else for (int64_t e = 0; e < E / g_size && e < K; e++) b[e] = 100.0f; /* K experts, all on rank 0 */
      if (sc->bias == 2 && E / g_size < K) b[1] = 100.0f;
    }
    if (sc->shared == 6) { /* the norms' weights and scales away from 1 */
      const moe8_weight_id v[4] = {MOE8_W_ROUTER_SCALE, MOE8_W_EXPERT_SCALE, MOE8_W_IN_NORM, MOE8_W_OUT_NORM};
      size_t n;
      for (int k = 0; k < 4; k++) {
        float *w = moe8_layer_weight(L, v[k], &n);
        for (size_t i = 0; i < n; i++) w[i] = 0.6f + 0.1f * (float)((i * 7 + (size_t)k) % 9);
      }
    }
    /* The single-process reference on all T tokens. */
    const size_t wsz = moe8_layer_workspace_size(L, T);
    void *ws;
    assert_int_equal(posix_memalign(&ws, 64, wsz), 0);
    float *ref = malloc(sizeof(float) * (size_t)(T * D)), ref_aux;
    grads g;
    grads_alloc(&g, T, D, E, F);
    assert_int_equal(moe8_layer_forward(L, x, T, ref, &ref_aux, ws, wsz), MOE8_OK);
    moe8_layer_grads lg = {g.dx, g.dwr, g.dwg, g.dwu, g.dwd, g.sg, g.su, g.sd, g.sgate};
    lg.dwrs = g.rs; lg.dwes = g.es; lg.dwin = g.in; lg.dwon = g.on;
    assert_int_equal(moe8_layer_backward(L, x, T, r, ws, wsz, &lg), MOE8_OK);
    /* The ring of experts on this rank's shard. */
    moe8_ep *ep;
    assert_int_equal(ep_create(L, &ep), MOE8_OK);
    float *out = malloc(sizeof(float) * (size_t)(Tl * D + 1)), aux;
    grads eg;
    grads_alloc(&eg, Tl, D, E, F);
    moe8_status st = moe8_ep_forward(ep, x + T0 * D, Tl, out, &aux);
    if (st != MOE8_OK) TU_FAIL("%s: ep forward: %s", sc->name, moe8_last_error());
    moe8_layer_grads el = {eg.dx, eg.dwr, eg.dwg, eg.dwu, eg.dwd, eg.sg, eg.su, eg.sd, eg.sgate};
    el.dwrs = eg.rs; el.dwes = eg.es; el.dwin = eg.in; el.dwon = eg.on;
    st = moe8_ep_backward(ep, x + T0 * D, Tl, r + T0 * D, &el);
    if (st != MOE8_OK) TU_FAIL("%s: ep backward: %s", sc->name, moe8_last_error());
    /* Bytes, against the single process. */
    const char *what = g_mode == MOE8_EP_ALLTOALL ? (before ? "all-to-all, quantize-before" : "all-to-all, quantize-after")
                                                  : (before ? "ring, quantize-before" : "ring, quantize-after");
    if (memcmp(out, ref + T0 * D, sizeof(float) * (size_t)(Tl * D)) != 0) TU_FAIL("%s (%s, P=%d): output differs", sc->name, what, g_size);
    if (memcmp(&aux, &ref_aux, 4) != 0 && sc->aux != 0) TU_FAIL("%s: aux loss differs", sc->name);
    if (memcmp(eg.dx, g.dx + T0 * D, sizeof(float) * (size_t)(Tl * D)) != 0) TU_FAIL("%s (%s, P=%d): dx differs", sc->name, what, g_size);
    if (memcmp(eg.dwr, g.dwr, sizeof(float) * (size_t)(D * E)) != 0) TU_FAIL("%s (%s, P=%d): dWr differs", sc->name, what, g_size);
    const int64_t Eloc = E / g_size, e0 = g_rank * Eloc;
    for (int w = 0; w < 3; w++) {
      const float *a = w == 0 ? eg.dwg : w == 1 ? eg.dwu : eg.dwd, *b = w == 0 ? g.dwg : w == 1 ? g.dwu : g.dwd;
      const size_t per = (size_t)(D * F);
      if (memcmp(a + e0 * (int64_t)per, b + e0 * (int64_t)per, sizeof(float) * per * (size_t)Eloc) != 0)
        TU_FAIL("%s (%s, P=%d): expert weight gradient %d differs", sc->name, what, g_size, w);
      for (int64_t e = 0; e < E; e++)
        if (e < e0 || e >= e0 + Eloc)
          for (size_t i = 0; i < per; i++) assert_true(a[e * (int64_t)per + (int64_t)i] == 0.0f);
    }
    if (sc->shared == 6) { /* Gemma-4's four vectors, whole, on every rank */
      const float *a[4] = {eg.rs, eg.es, eg.in, eg.on}, *b[4] = {g.rs, g.es, g.in, g.on};
      for (int w = 0; w < 4; w++)
        if (memcmp(a[w], b[w], sizeof(float) * (size_t)(w == 1 ? E : D)) != 0)
          TU_FAIL("%s (%s, P=%d): the gradient of Gemma-4's vector %d differs", sc->name, what, g_size, w);
    } else if (sc->shared && sc->shared != 7) { /* the shared expert's gradients, whole, on every rank (7: Inkling's are experts) */
      const float *a[4] = {eg.sg, eg.su, eg.sd, eg.sgate}, *b[4] = {g.sg, g.su, g.sd, g.sgate};
      for (int w = 0; w < (sc->shared == 2 ? 4 : 3); w++)
        if (memcmp(a[w], b[w], sizeof(float) * (size_t)(w == 3 ? D : D * FS)) != 0)
          TU_FAIL("%s (%s, P=%d): shared expert gradient %d differs", sc->name, what, g_size, w);
    }
    /* The bytes on the wire: with FP8 before the gather, D·(1 + 4/tile) per token. */
    const moe8_ep_stats *s = moe8_ep_get_stats(ep);
    if (g_mode == MOE8_EP_ALLTOALL && sc->shared != 6) { /* (Gemma-4's router reads the normed x: not this formula's) */
      /* The formula on this routing: a token goes once to each other rank
      ** that holds one of its experts. */
      int32_t *ids = malloc(sizeof(int32_t) * (size_t)(T * K));
      float *lgt = malloc(sizeof(float) * (size_t)(T * E)), *wt = malloc(sizeof(float) * (size_t)(T * K));
      moe8_router_config rc = {E, K, cfg.score, cfg.norm_topk_prob, cfg.routed_scaling_factor,
                                     cfg.use_selection_bias ? moe8_layer_weight_read(L, MOE8_W_BIAS, NULL) : NULL, cfg.n_group, cfg.topk_group,
                                     cfg.group_score};
      rc.group_mask_zero = cfg.group_mask_zero;
      rc.scored_shared = cfg.scored_shared;
      assert_int_equal(moe8_router_logits(x, moe8_layer_weight_read(L, MOE8_W_ROUTER, NULL), T, D, E, lgt), MOE8_OK);
      assert_int_equal(moe8_route(&rc, lgt, T, NULL, ids, wt), MOE8_OK);
      const int64_t El = E / g_size;
      uint64_t want_recv = 0, want_sent = 0;
      for (int64_t t = 0; t < T; t++) {
        const bool mine = t >= T0 && t < T0 + Tl;
        for (int q = 0; q < g_size; q++) {
          bool hit = false;
          for (int64_t j = 0; j < K; j++) hit |= ids[t * K + j] / El == q;
          if (hit && mine && q != g_rank) want_sent++;
          if (hit && !mine && q == g_rank) want_recv++;
        }
      }
      if (s->dispatch_rows_recv != want_recv || s->dispatch_rows_sent != want_sent)
        TU_FAIL("%s (%s, P=%d): dispatch rows sent %llu / received %llu, the formula says %llu / %llu", sc->name, what, g_size,
                (unsigned long long)s->dispatch_rows_sent, (unsigned long long)s->dispatch_rows_recv, (unsigned long long)want_sent,
                (unsigned long long)want_recv);
      free(ids); free(lgt); free(wt);
    } else if (g_mode == MOE8_EP_ALLTOALL) {
    } else if (sc->mode && before && sc->shared != 4) { /* Llama-4's rows are scaled, then quantized: f32 on the wire */
      const uint64_t per_tok = (uint64_t)D + 4u * (sc->mode == 2 ? (uint64_t)(D / 16) : sc->mode == 4 ? (uint64_t)((D + 127) / 128) : 1u);
      assert_int_equal(s->tokens_bytes, (uint64_t)T * per_tok);
    } else if (sc->mode != 3 || !before) {
      assert_int_equal(s->tokens_bytes, (uint64_t)T * (uint64_t)D * 4u);
    }
    if (sc->mode == 1 || sc->mode == 2 || sc->mode == 4) {
      /* Prepared weights (FP8, packed at prepare): each rank's experts are
      ** read at its offset into the packed copy; same output bytes. */
      assert_int_equal(moe8_layer_prepare(L), MOE8_OK);
      float *out2 = malloc(sizeof(float) * (size_t)(Tl * D + 1)), aux2;
      st = moe8_ep_forward(ep, x + T0 * D, Tl, out2, &aux2);
      if (st != MOE8_OK) TU_FAIL("%s: prepared ep forward: %s", sc->name, moe8_last_error());
      if (memcmp(out2, ref + T0 * D, sizeof(float) * (size_t)(Tl * D)) != 0)
        TU_FAIL("%s (%s, P=%d): output on prepared weights differs", sc->name, what, g_size);
      free(out2);
    }
    out_b[before] = out;
    aux_b[before] = aux;
    gb[before] = eg;
    moe8_ep_destroy(ep);
    free(ref); free(ws);
    grads_free(&g);
    moe8_layer_destroy(L);
    moe8_rules_destroy(rules);
  }
  /* Quantize-before on vs off: the same bytes. */
  assert_memory_equal(out_b[0], out_b[1], sizeof(float) * (size_t)(Tl * D));
  assert_memory_equal(&aux_b[0], &aux_b[1], 4);
  assert_memory_equal(gb[0].dx, gb[1].dx, sizeof(float) * (size_t)(Tl * D));
  assert_memory_equal(gb[0].dwr, gb[1].dwr, sizeof(float) * (size_t)(D * E));
  assert_memory_equal(gb[0].dwg, gb[1].dwg, sizeof(float) * (size_t)(E * D * F));
  assert_memory_equal(gb[0].dwd, gb[1].dwd, sizeof(float) * (size_t)(E * F * D));
  for (int b = 0; b < 2; b++) { free(out_b[b]); grads_free(&gb[b]); }
  free(x); free(r);
}

static void test_ep_equals_single_process(void **state) {
  (void)state;
  static const scenario cases[] = {
    {"f32", 0, 0, 0, 0.01f, 0},
    {"fp8 per-token", 1, 0, 0, 0.01f, 0},
    {"fp8 1x16", 2, 0, 1, 0, 0},
    {"fp8 1x16, expert 5 unused", 2, 1, 0, 0.02f, 0},
    {"fp8 per-token, all tokens on rank 0's experts", 1, 2, 1, 0, 0},
    {"f32 with capacity 1.0", 0, 0, 0, 0, 1.0f},
    {"f32, DeepSeek-V3 shared expert and group routing", 0, 0, 1, 0, 0, 1},
    {"fp8 1x16, DeepSeek-V3 shared expert, expert 5 unused", 2, 1, 0, 0.01f, 0, 1},
    {"fp8 per-token, Qwen2-MoE gated shared expert", 1, 0, 0, 0, 0, 2},
    {"f32, Qwen2-MoE gated shared expert", 0, 0, 1, 0.01f, 0, 2},
    {"i8 per-token", 3, 0, 1, 0.01f, 0},
    {"fp8 1x128 (D = 320: a partial last tile), DeepSeek-V3 shared expert", 4, 0, 1, 0.01f, 0, 1},
    {"i8 per-token, capacity 1.25, expert 5 unused", 3, 1, 0, 0, 1.25f},
    {"fp8 1x16, DeepSeek-V2 group_limited_greedy and shared experts", 2, 0, 1, 0.01f, 0, 3},
    {"f32, Llama-4 input scaling and shared expert", 0, 0, 1, 0.01f, 0, 4},
    {"fp8 1x16, Llama-4, expert 5 unused", 2, 1, 0, 0, 0, 4},
    {"i8 per-token, Llama-4, capacity 1.25", 3, 0, 1, 0, 1.25f, 4},
    {"f32, the clamped SwiGLU without biases, shared expert (MiniMax-M3)", 0, 0, 1, 0.01f, 0, 1, MOE8_ACT_SWIGLU_CLAMP},
    {"fp8 1x16, the SwiGLU clamped after the activation, shared expert (Step)", 2, 0, 0, 0, 0, 1, MOE8_ACT_SWIGLU_POST},
    {"f32, the SwiGLU clamped after the activation, shared expert (Step)", 0, 1, 1, 0, 0, 1, MOE8_ACT_SWIGLU_POST},
    {"i8 per-token, the softcapped SwiGLU (Inkling-2)", 3, 0, 1, 0.01f, 0, 0, MOE8_ACT_SWIGLU_SOFTCAP},
    {"f32, the softcapped SwiGLU, shared expert", 0, 0, 0, 0, 0, 1, MOE8_ACT_SWIGLU_SOFTCAP},
    {"i8 per-token, GeGLU (Gemma-4's experts)", 3, 0, 1, 0.01f, 0, 0, MOE8_ACT_GEGLU},
    {"f32, GeGLU, shared expert", 0, 0, 0, 0, 0, 1, MOE8_ACT_GEGLU},
    {"f32, Gemma-4's branch (norms, per-expert scale, GeGLU)", 0, 0, 1, 0.01f, 0, 6, MOE8_ACT_GEGLU},
    {"fp8 1x16, Gemma-4's branch, expert 5 unused", 2, 1, 0, 0, 0, 6, MOE8_ACT_GEGLU},
    {"i8 per-token, Gemma-4's branch, capacity 1.25", 3, 0, 1, 0, 1.25f, 6, MOE8_ACT_GEGLU},
    {"f32, AXK2's group mask (0.0), negative selection values, shared expert", 0, 3, 1, 0.01f, 0, 5},
    {"fp8 1x16, AXK2's group mask (0.0), negative selection values", 2, 3, 0, 0, 0, 5},
    {"f32, Inkling's router-scored shared expert, expert 5 unused", 0, 1, 1, 0, 0, 7},
    {"fp8 1x16, Inkling's router-scored shared expert", 2, 0, 0, 0, 0, 7},
    {"i8 per-token, Inkling's router-scored shared expert", 3, 0, 1, 0, 0, 7},
    {"f32, the ungated relu2 experts and shared expert (Nemotron-H)", 0, 0, 1, 0.01f, 0, 1, MOE8_ACT_RELU2},
    {"fp8 1x16, the ungated relu2 experts, shared expert, expert 5 unused", 2, 1, 0, 0, 0, 1, MOE8_ACT_RELU2},
    {"i8 per-token, the ungated relu experts", 3, 0, 1, 0.01f, 0, 0, MOE8_ACT_RELU},
  };
  for (int m = 0; m < 2; m++) {
    g_mode = m ? MOE8_EP_ALLTOALL : MOE8_EP_RING;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_scenario(&cases[i]);
  }
  g_mode = MOE8_EP_RING;
}

/* P = 8, k = 8, E = 64: the all-to-all mode receives fewer bytes per
** rank than the ring (f32 and FP8 before the exchange). */
static void test_ep_bytes_p8(void **state) {
  (void)state;
  if (g_size != 8) { if (g_rank == 0) printf("notice: the byte comparison runs at P = 8 only\n"); return; }
  const int64_t E = 64, K = 8, D = 256, F = 32, Tl = 16;
  const moe8_layer_config cfg = {E, K, D, F, MOE8_SCORE_SOFTMAX, true, 0, false, 0, 0};
  float *x = malloc(sizeof(float) * (size_t)(Tl * D)), *out = malloc(sizeof(float) * (size_t)(Tl * D));
  tu_rng_reset(900 + (uint64_t)g_rank);
  tu_fill_normal(x, (size_t)(Tl * D), 1.0f);
  for (int mode = 0; mode < 2; mode++) {
    moe8_rules *rules = rules_for(mode ? 2 : 0, true);
    moe8_layer *L;
    assert_int_equal(moe8_layer_create(&cfg, rules, "model.layers.0.mlp.experts", &L), MOE8_OK);
    assert_int_equal(moe8_layer_init_random(L, 5), MOE8_OK);
    uint64_t got[2];
    for (int m = 0; m < 2; m++) {
      const moe8_ep_options o = {sizeof o, m ? MOE8_EP_ALLTOALL : MOE8_EP_RING};
      moe8_ep *ep;
      assert_int_equal(moe8_ep_create_ex(L, g_comm, &o, &ep), MOE8_OK);
      assert_int_equal(moe8_ep_forward(ep, x, Tl, out, NULL), MOE8_OK);
      got[m] = moe8_ep_get_stats(ep)->fwd_recv_bytes;
      moe8_ep_destroy(ep);
    }
    if (g_rank == 0) printf("P=8 k=8 E=64 %s: forward bytes received by rank 0: ring %llu, all-to-all %llu (%.2fx)\n", mode ? "fp8 1x16" : "f32",
                            (unsigned long long)got[0], (unsigned long long)got[1], (double)got[1] / (double)got[0]);
    if (!(got[1] < got[0])) TU_FAIL("rank %d: all-to-all received %llu bytes, the ring %llu", g_rank, (unsigned long long)got[1],
                                    (unsigned long long)got[0]);
    moe8_layer_destroy(L);
    moe8_rules_destroy(rules);
  }
  free(x); free(out);
}

static void test_ep_failures(void **state) {
  (void)state;
  for (int m = 0; m < 2; m++) {
  g_mode = m ? MOE8_EP_ALLTOALL : MOE8_EP_RING;
  /* Ranks that disagree on the config: every rank gets the same message. */
  if (g_size > 1) {
    const moe8_layer_config c = {8, g_rank == 1 ? 3 : 2, 16, 8, MOE8_SCORE_SOFTMAX, false, 0, false, 0, 0};
    moe8_layer *L;
    moe8_ep *ep = (moe8_ep *)0x1;
    assert_int_equal(moe8_layer_create(&c, NULL, NULL, &L), MOE8_OK);
    assert_int_equal(moe8_layer_init_random(L, 1), MOE8_OK);
    assert_int_equal(ep_create(L, &ep), MOE8_ERR_INVALID_ARG);
    assert_null(ep);
    if (!strstr(moe8_last_error(), "ranks disagree on the layer config: rank 1 has top_k = 3, rank 0 has 2"))
      TU_FAIL("rank %d: message \"%s\"", g_rank, moe8_last_error());
    moe8_layer_destroy(L);
    /* Different weights. */
    const moe8_layer_config c2 = {8, 2, 16, 8, MOE8_SCORE_SOFTMAX, false, 0, false, 0, 0};
    assert_int_equal(moe8_layer_create(&c2, NULL, NULL, &L), MOE8_OK);
    assert_int_equal(moe8_layer_init_random(L, (uint64_t)(1 + (g_rank == g_size - 1))), MOE8_OK);
    assert_int_equal(ep_create(L, &ep), MOE8_ERR_INVALID_ARG);
    assert_non_null(strstr(moe8_last_error(), "weights differ"));
    moe8_layer_destroy(L);
  }
  /* Latent experts and the per-expert output norm: no expert-parallel mode, refused by name on every rank. */
  for (int v = 0; v < 2; v++) {
    moe8_layer_config c = {8, 2, 16, 8, MOE8_SCORE_SOFTMAX, false, 0, false, 0, 0};
    if (v) c.expert_out_norm = true;
    else c.latent = 12;
    moe8_layer *L;
    moe8_ep *ep = (moe8_ep *)0x1;
    assert_int_equal(moe8_layer_create(&c, NULL, NULL, &L), MOE8_OK);
    assert_int_equal(ep_create(L, &ep), MOE8_ERR_UNSUPPORTED);
    assert_null(ep);
    assert_non_null(strstr(moe8_last_error(), v ? "per-expert output norm" : "latent experts"));
    moe8_layer_destroy(L);
  }
  /* E not divisible by P. */
  if (g_size > 1) {
    const moe8_layer_config c = {g_size == 2 ? 3 : 6, 1, 16, 8, MOE8_SCORE_SOFTMAX, false, 0, false, 0, 0};
    moe8_layer *L;
    moe8_ep *ep;
    assert_int_equal(moe8_layer_create(&c, NULL, NULL, &L), MOE8_OK);
    assert_int_equal(ep_create(L, &ep), MOE8_ERR_SHAPE);
    assert_non_null(strstr(moe8_last_error(), "cannot be split evenly"));
    moe8_layer_destroy(L);
  }
  /* NaN in one rank's tokens: every rank fails with that rank's message. */
  {
    const moe8_layer_config c = {8, 2, 16, 8, MOE8_SCORE_SOFTMAX, false, 0, false, 0, 0};
    moe8_layer *L;
    moe8_ep *ep;
    assert_int_equal(moe8_layer_create(&c, NULL, NULL, &L), MOE8_OK);
    assert_int_equal(moe8_layer_init_random(L, 1), MOE8_OK);
    assert_int_equal(ep_create(L, &ep), MOE8_OK);
    float x[4 * 16], out[4 * 16];
    for (int i = 0; i < 64; i++) x[i] = 0.1f * (float)(i % 7);
    if (g_rank == g_size - 1) x[5] = NAN;
    assert_int_equal(moe8_ep_forward(ep, x, 4, out, NULL), MOE8_ERR_NONFINITE);
    char want[64];
    snprintf(want, sizeof want, "rank %d: ep forward: input x [4, 16] has 1 non-finite", g_size - 1);
    if (!strstr(moe8_last_error(), want)) TU_FAIL("rank %d: message \"%s\" lacks \"%s\"", g_rank, moe8_last_error(), want);
    /* backward without a successful forward */
    const moe8_layer_grads gr = {NULL, NULL, NULL, NULL, NULL};
    assert_int_equal(moe8_ep_backward(ep, x, 4, x, &gr), MOE8_ERR_INVALID_ARG);
    moe8_ep_destroy(ep);
    moe8_layer_destroy(L);
  }
  /* Ranks that disagree on the mode. */
  if (g_size > 1) {
    const moe8_layer_config c = {8, 2, 16, 8, MOE8_SCORE_SOFTMAX, false, 0, false, 0, 0};
    moe8_layer *L;
    moe8_ep *ep;
    assert_int_equal(moe8_layer_create(&c, NULL, NULL, &L), MOE8_OK);
    const moe8_ep_options o = {sizeof o, g_rank == 1 ? MOE8_EP_ALLTOALL : MOE8_EP_RING};
    assert_int_equal(moe8_ep_create_ex(L, g_comm, &o, &ep), MOE8_ERR_INVALID_ARG);
    assert_non_null(strstr(moe8_last_error(), "rank 1 has expert-parallel mode = 1, rank 0 has 0"));
    moe8_layer_destroy(L);
  }
  /* Ranks that sum in different orders (docs/determinism.md): P-invariance
  ** holds only when they agree, so create refuses, naming both. */
  if (g_size > 1 && !moe8__kernels()->has_tiles) {
    const moe8_layer_config c = {8, 2, 16, 8, MOE8_SCORE_SOFTMAX, false, 0, false, 0, 0};
    moe8_layer *L;
    moe8_ep *ep;
    assert_int_equal(moe8_layer_create(&c, NULL, NULL, &L), MOE8_OK);
    assert_int_equal(moe8_layer_init_random(L, 1), MOE8_OK);
    assert_int_equal(moe8_layer_set_order(L, g_rank == 1 ? MOE8_ORDER_CANONICAL : MOE8_ORDER_NATIVE), MOE8_OK);
    assert_int_equal(ep_create(L, &ep), MOE8_ERR_INVALID_ARG);
    if (!strstr(moe8_last_error(), "ranks disagree on the summation order: rank 1 sums in the canonical order, rank 0 in the native order of the"))
      TU_FAIL("rank %d: message \"%s\"", g_rank, moe8_last_error());
    /* Both canonical: agreed. */
    assert_int_equal(moe8_layer_set_order(L, MOE8_ORDER_CANONICAL), MOE8_OK);
    assert_int_equal(ep_create(L, &ep), MOE8_OK);
    moe8_ep_destroy(ep);
    moe8_layer_destroy(L);
  }
  }
  g_mode = MOE8_EP_RING;
}

/* GPT-OSS's expert form (router bias, expert biases, clamped SwiGLU), the
** limited SwiGLU (GLM-5, HY-V4), the SwiGLU clamped after the activation
** (Step) and the softcapped one (Inkling-2): the forward of both modes gives the
** single-process bytes (f32, FP8 1x16 quantize-before, i8), and so does
** every gradient of the backward. */
static void test_ep_gpt_oss_form(void **state) {
  (void)state;
  const int64_t E = 8, K = 2, D = 64, F = 48, T = 37;
  for (int form = 0; form < 5; form++) { /* GPT-OSS's, the limited SwiGLU, Step's, Inkling-2's, JetMoE's output bias (with a shared expert) */
  moe8_layer_config cfg = {E, K, D, F, MOE8_SCORE_SOFTMAX, true, 0, false, 0, 0};
  cfg.act = form == 4 ? MOE8_ACT_SWIGLU : form == 3 ? MOE8_ACT_SWIGLU_SOFTCAP : form == 2 ? MOE8_ACT_SWIGLU_POST : form ? MOE8_ACT_SWIGLU_LIMIT
                                                                                                                     : MOE8_ACT_SWIGLU_CLAMP;
  cfg.act_alpha = form == 3 ? 0.5f : 1.702f; /* the softcapped form's gate cap */
  cfg.out_bias = form == 4;
  cfg.norm_p = form == 4 ? 2.5f : 0.0f; /* DBRX's p-norm too */
  cfg.shared_scale = form == 4 ? 0.5f : 0.0f; /* and Cohere2-MoE's averaged shared expert */
  cfg.routed_scaling_factor = form == 4 ? 0.5f : 0.0f;
  cfg.shared_ffn = form == 4 ? 32 : 0;
  cfg.act_limit = 0.4f; /* binds on many rows of these weights */
  cfg.router_bias = cfg.expert_bias = !form;
  float *x = malloc(sizeof(float) * (size_t)(T * D));
  tu_rng_reset(777);
  tu_fill_normal(x, (size_t)(T * D), 1.0f);
  int64_t off[9];
  shards(0, T, off);
  const int64_t T0 = off[g_rank], Tl = off[g_rank + 1] - off[g_rank];
  for (int mode = 0; mode < 4; mode++) {
    if (mode == 1) continue;
    for (int m = 0; m < 2; m++) {
      g_mode = m ? MOE8_EP_ALLTOALL : MOE8_EP_RING;
      moe8_rules *rules = rules_for(mode, true);
      moe8_layer *L;
      assert_int_equal(moe8_layer_create(&cfg, rules, "model.layers.0.mlp.experts", &L), MOE8_OK);
      assert_int_equal(moe8_layer_init_random(L, 31), MOE8_OK);
      const moe8_weight_id bids[3] = {MOE8_W_ROUTER_BIAS, MOE8_W_GU_BIAS, MOE8_W_DOWN_BIAS};
      for (int b = 0; b < 3 && !form; b++) {
        size_t n = 0;
        float *w = moe8_layer_weight(L, bids[b], &n);
        assert_non_null(w);
        tu_rng_reset(900 + (uint64_t)b);
        tu_fill_normal(w, n, 0.5f);
      }
      if (form == 4) {
        float *ob = moe8_layer_weight(L, MOE8_W_OUT_BIAS, NULL);
        assert_non_null(ob);
        tu_rng_reset(903);
        tu_fill_normal(ob, (size_t)D, 0.5f);
      }
      const size_t wsz = moe8_layer_workspace_size(L, T);
      void *ws;
      assert_int_equal(posix_memalign(&ws, 64, wsz), 0);
      float *ref = malloc(sizeof(float) * (size_t)(T * D)), ref_aux;
      assert_int_equal(moe8_layer_forward(L, x, T, ref, &ref_aux, ws, wsz), MOE8_OK);
      moe8_ep *ep;
      assert_int_equal(ep_create(L, &ep), MOE8_OK);
      float *out = malloc(sizeof(float) * (size_t)(Tl * D + 1)), aux;
      moe8_status st = moe8_ep_forward(ep, x + T0 * D, Tl, out, &aux);
      if (st != MOE8_OK)
        TU_FAIL("%s form: ep forward: %s", form == 4 ? "out_bias" : form == 3 ? "softcap" : form == 2 ? "post" : form ? "limited" : "gpt_oss",
                moe8_last_error());
      if (memcmp(out, ref + T0 * D, sizeof(float) * (size_t)(Tl * D)) != 0)
        TU_FAIL("gpt_oss form (mode %d, %s, P=%d): output differs", mode, m ? "all-to-all" : "ring", g_size);
      /* the backward: every gradient, the biases' included, the single process's bytes */
      grads g, eg;
      grads_alloc(&g, T, D, E, F);
      grads_alloc(&eg, Tl, D, E, F);
      float *b1 = malloc(sizeof(float) * (size_t)(E + E * 2 * F + E * D)), *b2 = malloc(sizeof(float) * (size_t)(E + E * 2 * F + E * D));
      memset(b1, 0, sizeof(float) * (size_t)(E + E * 2 * F + E * D));
      memset(b2, 0, sizeof(float) * (size_t)(E + E * 2 * F + E * D));
      static float ob1[64], ob2[64];
      memset(ob1, 0, sizeof ob1);
      memset(ob2, 0xFF, sizeof ob2); /* NaN: the relay must write every element */
      const moe8_layer_grads lg = {g.dx, g.dwr, g.dwg, g.dwu, g.dwd, NULL, NULL, NULL, NULL, form ? NULL : b1, form ? NULL : b1 + E,
                                   form ? NULL : b1 + E + E * 2 * F, form == 4 ? ob1 : NULL};
      assert_int_equal(moe8_layer_forward(L, x, T, ref, &ref_aux, ws, wsz), MOE8_OK);
      assert_int_equal(moe8_layer_backward(L, x, T, x, ws, wsz, &lg), MOE8_OK);
      const moe8_layer_grads el = {eg.dx, eg.dwr, eg.dwg, eg.dwu, eg.dwd, NULL, NULL, NULL, NULL, form ? NULL : b2, form ? NULL : b2 + E,
                                   form ? NULL : b2 + E + E * 2 * F, form == 4 ? ob2 : NULL};
      st = moe8_ep_backward(ep, x + T0 * D, Tl, x + T0 * D, &el);
      if (st != MOE8_OK) TU_FAIL("gpt_oss form: ep backward: %s", moe8_last_error());
      const char *what = m ? "all-to-all" : "ring";
      if (memcmp(eg.dx, g.dx + T0 * D, sizeof(float) * (size_t)(Tl * D)) != 0) TU_FAIL("gpt_oss form (%s, P=%d): dx differs", what, g_size);
      if (memcmp(eg.dwr, g.dwr, sizeof(float) * (size_t)(D * E)) != 0) TU_FAIL("gpt_oss form (%s, P=%d): dWr differs", what, g_size);
      if (memcmp(b2, b1, sizeof(float) * (size_t)E) != 0) TU_FAIL("gpt_oss form (%s, P=%d): router bias gradient differs", what, g_size);
      if (form == 4 && memcmp(ob2, ob1, sizeof(float) * (size_t)D) != 0)
        TU_FAIL("out_bias form (%s, P=%d): output bias gradient differs", what, g_size);
      const int64_t Eloc = E / g_size, e0 = g_rank * Eloc;
      if (memcmp(b2 + E + e0 * 2 * F, b1 + E + e0 * 2 * F, sizeof(float) * (size_t)(Eloc * 2 * F)) != 0 ||
          memcmp(b2 + E + E * 2 * F + e0 * D, b1 + E + E * 2 * F + e0 * D, sizeof(float) * (size_t)(Eloc * D)) != 0)
        TU_FAIL("gpt_oss form (%s, P=%d): expert bias gradients differ", what, g_size);
      if (memcmp(eg.dwg + e0 * D * F, g.dwg + e0 * D * F, sizeof(float) * (size_t)(Eloc * D * F)) != 0 ||
          memcmp(eg.dwd + e0 * F * D, g.dwd + e0 * F * D, sizeof(float) * (size_t)(Eloc * F * D)) != 0)
        TU_FAIL("gpt_oss form (%s, P=%d): expert weight gradients differ", what, g_size);
      free(b1); free(b2);
      grads_free(&g);
      grads_free(&eg);
      moe8_ep_destroy(ep);
      free(ref); free(out); free(ws);
      moe8_layer_destroy(L);
      moe8_rules_destroy(rules);
    }
  }
  free(x);
  }
  g_mode = MOE8_EP_RING;
}

/* DeepSeek-V4's block (sqrt-softplus scores, weights / (sum + 1e-20) x 1.5,
** the limited SwiGLU in the routed and the shared expert), routed by score
** + bias or by token id (hash routing: each rank gives its tokens' ids):
** both modes give the single process's bytes, forward and every gradient
** (f32, FP8 1x16 quantize-before and after, i8); a hash layer's forward
** without the ids, or with an id past the table on one rank, is refused on
** every rank, by name; ranks whose tables differ are refused at create. */
static void test_ep_dsv4(void **state) {
  (void)state;
  enum { E = 8, K = 3, D = 64, F = 48, T = 37, V = 11 };
  static int32_t table[V * K], tok[T];
  tu_rng_reset(5150);
  for (int i = 0; i < V * K; i++) table[i] = (int32_t)(tu_u64() % E);
  table[1] = table[0]; /* a repeated expert */
  for (int t = 0; t < T; t++) tok[t] = (int32_t)(tu_u64() % V);
  float *x = malloc(sizeof(float) * (size_t)(T * D)), *r = malloc(sizeof(float) * (size_t)(T * D));
  tu_fill_normal(x, (size_t)(T * D), 1.0f);
  tu_fill_normal(r, (size_t)(T * D), 1.0f);
  int64_t off[9];
  shards(1, T, off);
  const int64_t T0 = off[g_rank], Tl = off[g_rank + 1] - off[g_rank];
  for (int hash = 0; hash < 2; hash++)
  for (int mode = 0; mode < 4; mode++) {
    if (mode == 1) continue;
    for (int m = 0; m < 4; m++) {
      const bool before = m & 2;
      if (!mode && before) continue;
      g_mode = m & 1 ? MOE8_EP_ALLTOALL : MOE8_EP_RING;
      moe8_layer_config cfg = {.num_experts = E, .top_k = K, .hidden = D, .ffn = F, .score = MOE8_SCORE_SQRTSOFTPLUS, .norm_topk_prob = true,
                               .routed_scaling_factor = 1.5f, .norm_eps = 1e-20f, .use_selection_bias = !hash, .act = MOE8_ACT_SWIGLU_LIMIT,
                               .act_limit = 0.4f, .shared_ffn = FS, .hash_routing = hash == 1};
      moe8_rules *rules = rules_for(mode, before);
      moe8_layer *L;
      assert_int_equal(moe8_layer_create(&cfg, rules, "model.layers.0.ffn.experts", &L), MOE8_OK);
      assert_int_equal(moe8_layer_init_random(L, 41), MOE8_OK);
      if (hash) assert_int_equal(moe8_layer_set_hash_table(L, table, V), MOE8_OK);
      else {
        float *b = moe8_layer_weight(L, MOE8_W_BIAS, NULL);
        tu_rng_reset(42);
        tu_fill_normal(b, E, 0.3f);
      }
      const size_t wsz = moe8_layer_workspace_size(L, T);
      void *ws;
      assert_int_equal(posix_memalign(&ws, 64, wsz), 0);
      float *ref = malloc(sizeof(float) * (size_t)(T * D)), ref_aux;
      grads g, eg;
      grads_alloc(&g, T, D, E, F);
      grads_alloc(&eg, Tl, D, E, F);
      assert_int_equal(moe8_layer_forward_tokens(L, x, T, tok, ref, &ref_aux, ws, wsz), MOE8_OK);
      const moe8_layer_grads lg = {g.dx, g.dwr, g.dwg, g.dwu, g.dwd, g.sg, g.su, g.sd};
      assert_int_equal(moe8_layer_backward(L, x, T, r, ws, wsz, &lg), MOE8_OK);
      moe8_ep *ep;
      assert_int_equal(ep_create(L, &ep), MOE8_OK);
      float *out = malloc(sizeof(float) * (size_t)(Tl * D + 1)), aux;
      const char *what = g_mode == MOE8_EP_ALLTOALL ? "all-to-all" : "ring";
      moe8_status st = moe8_ep_forward_tokens(ep, x + T0 * D, Tl, tok + T0, out, &aux);
      if (st != MOE8_OK) TU_FAIL("dsv4 (hash %d, %s): ep forward: %s", hash, what, moe8_last_error());
      const moe8_layer_grads el = {eg.dx, eg.dwr, eg.dwg, eg.dwu, eg.dwd, eg.sg, eg.su, eg.sd};
      st = moe8_ep_backward(ep, x + T0 * D, Tl, r + T0 * D, &el);
      if (st != MOE8_OK) TU_FAIL("dsv4 (hash %d, %s): ep backward: %s", hash, what, moe8_last_error());
      const int64_t Eloc = E / g_size, e0 = g_rank * Eloc;
      if (memcmp(out, ref + T0 * D, sizeof(float) * (size_t)(Tl * D)) ||
          memcmp(eg.dx, g.dx + T0 * D, sizeof(float) * (size_t)(Tl * D)) || memcmp(eg.dwr, g.dwr, sizeof(float) * (size_t)(D * E)) ||
          memcmp(eg.dwg + e0 * D * F, g.dwg + e0 * D * F, sizeof(float) * (size_t)(Eloc * D * F)) ||
          memcmp(eg.dwu + e0 * D * F, g.dwu + e0 * D * F, sizeof(float) * (size_t)(Eloc * D * F)) ||
          memcmp(eg.dwd + e0 * F * D, g.dwd + e0 * F * D, sizeof(float) * (size_t)(Eloc * F * D)) ||
          memcmp(eg.sg, g.sg, sizeof(float) * (size_t)(D * FS)) || memcmp(eg.sd, g.sd, sizeof(float) * (size_t)(D * FS)))
        TU_FAIL("dsv4 (hash %d, mode %d, %s, %s, P=%d): output or a gradient differs from the single process", hash, mode, what,
                before ? "quantize-before" : "quantize-after", g_size);
      if (hash) {
        /* without the ids: refused on every rank (a rank with no tokens too) */
        st = moe8_ep_forward(ep, x + T0 * D, Tl, out, &aux);
        if (st != MOE8_ERR_INVALID_ARG || !strstr(moe8_last_error(), "routes by token id"))
          TU_FAIL("dsv4 hash, %s: ep forward without token ids: %d %s", what, (int)st, moe8_last_error());
        /* an id past the table on the last rank that holds tokens: every rank gets it */
        int32_t *bad = malloc(sizeof(int32_t) * (size_t)(Tl + 1));
        memcpy(bad, tok + T0, sizeof(int32_t) * (size_t)Tl);
        int last = g_size - 1;
        while (last > 0 && off[last + 1] == off[last]) last--;
        if (g_rank == last && Tl > 0) bad[Tl - 1] = V;
        st = moe8_ep_forward_tokens(ep, x + T0 * D, Tl, bad, out, &aux);
        if (st != MOE8_ERR_INVALID_ARG || !strstr(moe8_last_error(), "outside its hash table's [0, 11)"))
          TU_FAIL("dsv4 hash, %s: an id past the table: %d %s", what, (int)st, moe8_last_error());
        free(bad);
      }
      moe8_ep_destroy(ep);
      if (hash && g_size > 1 && mode == 0 && m == 0) {
        /* ranks with different tables: refused at create, naming it */
        int32_t t2[V * K];
        memcpy(t2, table, sizeof t2);
        if (g_rank == 1) t2[5] = (t2[5] + 1) % E;
        assert_int_equal(moe8_layer_set_hash_table(L, t2, V), MOE8_OK);
        st = ep_create(L, &ep);
        if (st != MOE8_ERR_INVALID_ARG || !strstr(moe8_last_error(), "hash routing"))
          TU_FAIL("dsv4 hash: ranks with different tables: %d %s", (int)st, moe8_last_error());
      }
      grads_free(&g);
      grads_free(&eg);
      free(ref); free(out); free(ws);
      moe8_layer_destroy(L);
      moe8_rules_destroy(rules);
    }
  }
  free(x); free(r);
  g_mode = MOE8_EP_RING;
}

/* PhiMoE's sparsemixer router (always 2 experts, its own weights): both
** modes give the single process's forward bytes (f32, FP8 1x16
** quantize-before and after, i8), and its backward is refused on every
** rank by name.  LongCat-Flash's identity experts (3 of them after the 8
** routed, chosen by score + bias, weights the scores x 6): both modes give
** the single process's bytes, forward and every gradient, the router's
** [D, E + 3] included. */
static void test_ep_phimoe_longcat(void **state) {
  (void)state;
  enum { E = 8, Z = 3, D = 64, F = 48, T = 37 };
  float *x = malloc(sizeof(float) * (size_t)(T * D)), *r = malloc(sizeof(float) * (size_t)(T * D));
  tu_rng_reset(6160);
  tu_fill_normal(x, (size_t)(T * D), 1.0f);
  tu_fill_normal(r, (size_t)(T * D), 1.0f);
  int64_t off[9];
  shards(1, T, off);
  const int64_t T0 = off[g_rank], Tl = off[g_rank + 1] - off[g_rank];
  for (int form = 0; form < 2; form++) /* 0 sparsemixer, 1 identity experts */
  for (int mode = 0; mode < 4; mode++) {
    if (mode == 1) continue;
    for (int m = 0; m < 4; m++) {
      const bool before = m & 2;
      if (!mode && before) continue;
      g_mode = m & 1 ? MOE8_EP_ALLTOALL : MOE8_EP_RING;
      moe8_layer_config cfg = {.num_experts = E, .top_k = form ? 3 : 2, .hidden = D, .ffn = F};
      if (form) { cfg.zero_experts = Z; cfg.use_selection_bias = true; cfg.routed_scaling_factor = 6.0f; }
      else { cfg.score = MOE8_SCORE_SPARSEMIXER; cfg.router_jitter = 0.05f; }
      const int64_t ER = E + cfg.zero_experts;
      moe8_rules *rules = rules_for(mode, before);
      moe8_layer *L;
      assert_int_equal(moe8_layer_create(&cfg, rules, "model.layers.0.mlp.experts", &L), MOE8_OK);
      assert_int_equal(moe8_layer_init_random(L, 43), MOE8_OK);
      if (form) { /* identity experts chosen often, not always */
        float *b = moe8_layer_weight(L, MOE8_W_BIAS, NULL);
        for (int64_t e = 0; e < ER; e++) b[e] = e >= E ? 0.08f : 0.0f;
      }
      const size_t wsz = moe8_layer_workspace_size(L, T);
      void *ws;
      assert_int_equal(posix_memalign(&ws, 64, wsz), 0);
      float *ref = malloc(sizeof(float) * (size_t)(T * D)), ref_aux;
      grads g, eg;
      grads_alloc(&g, T, D, ER, F);
      grads_alloc(&eg, Tl, D, ER, F);
      assert_int_equal(moe8_layer_forward(L, x, T, ref, &ref_aux, ws, wsz), MOE8_OK);
      const moe8_layer_grads lg = {g.dx, g.dwr, g.dwg, g.dwu, g.dwd};
      if (form) assert_int_equal(moe8_layer_backward(L, x, T, r, ws, wsz, &lg), MOE8_OK);
      moe8_ep *ep;
      assert_int_equal(ep_create(L, &ep), MOE8_OK);
      float *out = malloc(sizeof(float) * (size_t)(Tl * D + 1)), aux;
      const char *what = g_mode == MOE8_EP_ALLTOALL ? "all-to-all" : "ring", *fn = form ? "identity experts" : "sparsemixer";
      moe8_status st = moe8_ep_forward(ep, x + T0 * D, Tl, out, &aux);
      if (st != MOE8_OK) TU_FAIL("%s (%s): ep forward: %s", fn, what, moe8_last_error());
      if (memcmp(out, ref + T0 * D, sizeof(float) * (size_t)(Tl * D)))
        TU_FAIL("%s (mode %d, %s, %s, P=%d): output differs from the single process", fn, mode, what,
                before ? "quantize-before" : "quantize-after", g_size);
      const moe8_layer_grads el = {eg.dx, eg.dwr, eg.dwg, eg.dwu, eg.dwd};
      st = moe8_ep_backward(ep, x + T0 * D, Tl, r + T0 * D, &el);
      if (!form && (st != MOE8_ERR_UNSUPPORTED || !strstr(moe8_last_error(), "sparsemixer")))
        TU_FAIL("sparsemixer (%s): ep backward: %d %s", what, (int)st, moe8_last_error());
      if (form && st != MOE8_OK) TU_FAIL("identity experts (%s): ep backward: %s", what, moe8_last_error());
      const int64_t Eloc = E / g_size, e0 = g_rank * Eloc;
      if (form && (memcmp(eg.dx, g.dx + T0 * D, sizeof(float) * (size_t)(Tl * D)) || memcmp(eg.dwr, g.dwr, sizeof(float) * (size_t)(D * ER)) ||
                   memcmp(eg.dwg + e0 * D * F, g.dwg + e0 * D * F, sizeof(float) * (size_t)(Eloc * D * F)) ||
                   memcmp(eg.dwu + e0 * D * F, g.dwu + e0 * D * F, sizeof(float) * (size_t)(Eloc * D * F)) ||
                   memcmp(eg.dwd + e0 * F * D, g.dwd + e0 * F * D, sizeof(float) * (size_t)(Eloc * F * D))))
        TU_FAIL("identity experts (mode %d, %s, %s, P=%d): a gradient differs from the single process", mode, what,
                before ? "quantize-before" : "quantize-after", g_size);
      moe8_ep_destroy(ep);
      grads_free(&g);
      grads_free(&eg);
      free(ref); free(out); free(ws);
      moe8_layer_destroy(L);
      moe8_rules_destroy(rules);
    }
  }
  free(x); free(r);
  g_mode = MOE8_EP_RING;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  MPI_Comm world = MPI_COMM_WORLD;
  if (moe8_comm_create_mpi(&world, &g_comm) != MOE8_OK) { fprintf(stderr, "%s\n", moe8_last_error()); MPI_Abort(MPI_COMM_WORLD, 1); }
  tu_seed();
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_ep_equals_single_process),
    cmocka_unit_test(test_ep_failures),
    cmocka_unit_test(test_ep_bytes_p8),
    cmocka_unit_test(test_ep_gpt_oss_form),
    cmocka_unit_test(test_ep_dsv4),
    cmocka_unit_test(test_ep_phimoe_longcat),
  };
  const int rc = cmocka_run_group_tests(tests, NULL, NULL);
  moe8_comm_destroy(g_comm);
  int any = rc != 0, all = 0;
  MPI_Allreduce(&any, &all, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return all;
}
