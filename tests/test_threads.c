/*
** test_threads.c — moe8 from several threads at once: two layers running
** forward in two threads give the bytes they give alone, and parsers
** running in parallel locate their own errors (each thread's message has
** its own file's byte offset; the JSON library's global error pointer is
** not used), and one layer's forwards while another thread sets its
** summation order give the canonical or the native bytes, never a mix,
** and one training layer's backwards in two threads (sharing the layer's
** pool of large buffers) give the bytes of each backward alone.
** Also built with ThreadSanitizer (docs/testing.md).
*/
#include "testutil.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The FP8 rule the tests share (f8e4m3 weights and activations, tile 32). */
static moe8_rules *fp8_rules(void) {
  const char *rj = "{\"rules\": [{\"module_path\": \".*\", \"weight_qtype\": \"float8_e4m3fn\", \"act_qtype\": \"float8_e4m3fn\", \"tile_size\": 32}]}";
  moe8_rules *rs = NULL;
  assert_int_equal(moe8_rules_parse(rj, strlen(rj), "inline", &rs), MOE8_OK);
  return rs;
}

/* A layer of config c under rs (NULL: f32), its weights drawn from seed. */
static moe8_layer *new_layer(const moe8_layer_config *c, const moe8_rules *rs, uint64_t seed) {
  moe8_layer *L = NULL;
  assert_int_equal(moe8_layer_create(c, rs, "experts", &L), MOE8_OK);
  assert_int_equal(moe8_layer_init_random(L, seed), MOE8_OK);
  return L;
}

typedef struct job {
  moe8_layer *L;
  const float *x;
  float *y;
  int64_t T;
  moe8_status st;
} job;

static void *run_layer(void *p) {
  job *j = p;
  const size_t wsz = moe8_layer_workspace_size(j->L, j->T);
  void *ws = NULL;
  if (posix_memalign(&ws, 64, wsz) != 0) { j->st = MOE8_ERR_NOMEM; return NULL; }
  for (int rep = 0; rep < 20 && j->st == MOE8_OK; rep++) j->st = moe8_layer_forward_fused(j->L, j->x, j->T, j->y, ws, wsz);
  free(ws);
  return NULL;
}

/* One training layer (an FP8 rule: its forward quantizes the masters) shared
** by two threads, each with its own workspace, both writing the masters'
** generation first as an optimizer loop would not: every output equals the
** output alone (docs/testing.md, "Threads"). */
typedef struct shared_job {
  moe8_layer *L;
  const float *x, *want;
  int64_t T;
  int wrong;
  moe8_status st;
} shared_job;

/* reps calls of call(ctx, L, ws, out) on a workspace of T rows and an
** output of n floats of the thread's own, each output compared with want:
** the count that differ in *wrong, the first failure in *st. */
typedef moe8_status (*rep_call)(const void *ctx, moe8_layer *L, void *ws, size_t wsz, float *out);
static void repeat_compare(moe8_layer *L, int64_t T, size_t n, int reps, rep_call call, const void *ctx, const float *want, int *wrong,
                           moe8_status *st) {
  const size_t wsz = moe8_layer_workspace_size(L, T);
  void *ws = NULL;
  float *out = malloc(sizeof(float) * n);
  if (!out || posix_memalign(&ws, 64, wsz) != 0) { *st = MOE8_ERR_NOMEM; free(out); return; }
  for (int rep = 0; rep < reps && *st == MOE8_OK; rep++) {
    *st = call(ctx, L, ws, wsz, out);
    if (*st == MOE8_OK && memcmp(out, want, sizeof(float) * n) != 0) (*wrong)++;
  }
  free(ws);
  free(out);
}

static moe8_status shared_call(const void *ctx, moe8_layer *L, void *ws, size_t wsz, float *y) {
  const shared_job *j = ctx;
  float aux;
  return moe8_layer_forward(L, j->x, j->T, y, &aux, ws, wsz);
}

static void *run_shared(void *p) {
  shared_job *j = p;
  repeat_compare(j->L, j->T, (size_t)(j->T * moe8_layer_get_config(j->L)->hidden), 25, shared_call, j, j->want, &j->wrong, &j->st);
  return NULL;
}

static void test_one_layer_two_threads(void **state) {
  (void)state;
  const int64_t T = 23, D = 64;
  moe8_layer_config c = {.num_experts = 8, .top_k = 2, .hidden = D, .ffn = 48, .norm_topk_prob = true};
  moe8_rules *rs = fp8_rules();
  moe8_layer *L = new_layer(&c, rs, 3);
  float *x = malloc(sizeof(float) * (size_t)(T * D)), *want = malloc(sizeof(float) * (size_t)(T * D));
  tu_rng_reset(6);
  tu_fill_normal(x, (size_t)(T * D), 1.0f);
  const size_t wsz = moe8_layer_workspace_size(L, T);
  void *ws = NULL;
  assert_int_equal(posix_memalign(&ws, 64, wsz), 0);
  float aux;
  assert_int_equal(moe8_layer_forward(L, x, T, want, &aux, ws, wsz), MOE8_OK);
  free(ws);
  /* The masters "changed" (same values): the first forward of a thread
  ** re-quantizes under the write lock while the other may be reading. */
  moe8_layer_weights_changed(L);
  shared_job jobs[2] = {{L, x, want, T, 0, MOE8_OK}, {L, x, want, T, 0, MOE8_OK}};
  pthread_t th[2];
  for (int i = 0; i < 2; i++) assert_int_equal(pthread_create(&th[i], NULL, run_shared, &jobs[i]), 0);
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < 2; i++) {
    assert_int_equal(jobs[i].st, MOE8_OK);
    if (jobs[i].wrong) TU_FAIL("thread %d: %d of 25 forwards of the shared layer differ from the forward alone", i, jobs[i].wrong);
  }
  moe8_layer_destroy(L);
  moe8_rules_destroy(rs);
  free(x);
  free(want);
}

static void test_two_layers_two_threads(void **state) {
  (void)state;
  const int64_t T = 19, D = 64;
  moe8_layer_config c = {.num_experts = 8, .top_k = 2, .hidden = D, .ffn = 48, .norm_topk_prob = true, .shared_ffn = 32};
  moe8_rules *rs = fp8_rules();
  moe8_layer *L[2];
  float *x = malloc(sizeof(float) * (size_t)(T * D)), *alone[2], *both[2];
  tu_rng_reset(5);
  tu_fill_normal(x, (size_t)(T * D), 1.0f);
  for (int i = 0; i < 2; i++) {
    L[i] = new_layer(&c, i ? rs : NULL, 10 + (uint64_t)i);
    assert_int_equal(moe8_layer_prepare(L[i]), MOE8_OK);
    alone[i] = malloc(sizeof(float) * (size_t)(T * D));
    both[i] = malloc(sizeof(float) * (size_t)(T * D));
    job j = {L[i], x, alone[i], T, MOE8_OK};
    run_layer(&j);
    assert_int_equal(j.st, MOE8_OK);
  }
  pthread_t th[2];
  job jobs[2] = {{L[0], x, both[0], T, MOE8_OK}, {L[1], x, both[1], T, MOE8_OK}};
  for (int i = 0; i < 2; i++) assert_int_equal(pthread_create(&th[i], NULL, run_layer, &jobs[i]), 0);
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < 2; i++) {
    assert_int_equal(jobs[i].st, MOE8_OK);
    assert_memory_equal(alone[i], both[i], sizeof(float) * (size_t)(T * D));
    moe8_layer_destroy(L[i]);
    free(alone[i]); free(both[i]);
  }
  moe8_rules_destroy(rs);
  free(x);
}

/* Each thread parses a malformed document whose error sits at its own
** byte offset, many times, and checks its message. */
typedef struct pjob { int which, bad; } pjob;

static void *parse_many(void *p) {
  pjob *j = p;
  char doc[256], want[64];
  /* the error: an unexpected character at byte 20 + which * 7 */
  const int at = 20 + j->which * 7;
  memset(doc, ' ', sizeof doc);
  memcpy(doc, "{\"model_type\": ", 15);
  doc[at] = '@';
  doc[at + 1] = 0;
  snprintf(want, sizeof want, "near byte %d", at);
  for (int rep = 0; rep < 2000; rep++) {
    moe8_hf_config c;
    if (moe8_hf_config_parse(doc, (size_t)at + 1, "config.json", &c) != MOE8_ERR_PARSE || !strstr(moe8_last_error(), want)) j->bad++;
    moe8_rules *r = NULL;
    char rd[64], rwant[64];
    snprintf(rd, sizeof rd, "{\"rules\": [%*s!", j->which * 3, "");
    snprintf(rwant, sizeof rwant, "byte %d", 11 + j->which * 3);
    if (moe8_rules_parse(rd, strlen(rd), "rules.json", &r) != MOE8_ERR_PARSE || !strstr(moe8_last_error(), rwant)) j->bad++;
  }
  return NULL;
}

static void test_parsers_in_parallel(void **state) {
  (void)state;
  pthread_t th[4];
  pjob jobs[4];
  for (int i = 0; i < 4; i++) {
    jobs[i] = (pjob){i, 0};
    assert_int_equal(pthread_create(&th[i], NULL, parse_many, &jobs[i]), 0);
  }
  for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < 4; i++)
    if (jobs[i].bad) TU_FAIL("thread %d: %d messages with another thread's error offset (or none)", i, jobs[i].bad);
}

/* One layer, forwards on two threads while a third toggles its order
** between canonical and native (moe8_layer_set_order): the forward reads
** the order once at its start, so each output is, byte for byte, the
** canonical or the native output alone, never a mix of the two (a shared
** expert and the routed experts' two matmuls each take the call's order). */
typedef struct order_job {
  moe8_layer *L;
  const float *x, *want[2];
  int64_t T;
  int seen[2], wrong;
  moe8_status st;
} order_job;

static _Atomic int g_order_stop;

static void *run_order_forwards(void *p) {
  order_job *j = p;
  const size_t wsz = moe8_layer_workspace_size(j->L, j->T), n = (size_t)(j->T * moe8_layer_get_config(j->L)->hidden);
  void *ws = NULL;
  float *y = malloc(sizeof(float) * n);
  if (!y || posix_memalign(&ws, 64, wsz) != 0) { j->st = MOE8_ERR_NOMEM; free(y); return NULL; }
  for (int rep = 0; rep < 40 && j->st == MOE8_OK; rep++) {
    j->st = moe8_layer_forward_fused(j->L, j->x, j->T, y, ws, wsz);
    if (j->st != MOE8_OK) break;
    if (!memcmp(y, j->want[0], sizeof(float) * n)) j->seen[0]++;
    else if (!memcmp(y, j->want[1], sizeof(float) * n)) j->seen[1]++;
    else j->wrong++;
  }
  free(ws);
  free(y);
  return NULL;
}

static void *toggle_order(void *p) {
  moe8_layer *L = p;
  for (uint64_t i = 0; !atomic_load(&g_order_stop); i++)
    if (moe8_layer_set_order(L, i & 1 ? MOE8_ORDER_NATIVE : MOE8_ORDER_CANONICAL) != MOE8_OK) return p;
  return NULL;
}

static void test_order_set_while_forwards_run(void **state) {
  (void)state;
  /* A table with tiles always sums in the canonical order: run on the best
  ** one without (its native order is its own), set before threads start. */
  const moe8_isa was = moe8_isa_active();
  if (was == MOE8_ISA_AMX || was == MOE8_ISA_AMX_EMU)
    for (int i = MOE8_ISA_AVX512_VNNI; i >= MOE8_ISA_REF; i--)
      if (moe8_isa_supported((moe8_isa)i) && moe8_isa_set((moe8_isa)i) == MOE8_OK) break;
  const int64_t T = 21, D = 64;
  moe8_layer_config c = {.num_experts = 8, .top_k = 2, .hidden = D, .ffn = 48, .norm_topk_prob = true, .shared_ffn = 32};
  moe8_rules *rs = fp8_rules();
  moe8_layer *L = new_layer(&c, rs, 21);
  assert_int_equal(moe8_layer_prepare(L), MOE8_OK);
  const size_t n = (size_t)(T * D), wsz = moe8_layer_workspace_size(L, T);
  float *x = malloc(sizeof(float) * n), *want[2] = {malloc(sizeof(float) * n), malloc(sizeof(float) * n)};
  tu_rng_reset(8);
  tu_fill_normal(x, n, 1.0f);
  void *ws = NULL;
  assert_int_equal(posix_memalign(&ws, 64, wsz), 0);
  const moe8_order ord[2] = {MOE8_ORDER_CANONICAL, MOE8_ORDER_NATIVE};
  for (int o = 0; o < 2; o++) {
    assert_int_equal(moe8_layer_set_order(L, ord[o]), MOE8_OK);
    assert_int_equal(moe8_layer_forward_fused(L, x, T, want[o], ws, wsz), MOE8_OK);
  }
  free(ws);
  const bool differ = memcmp(want[0], want[1], sizeof(float) * n) != 0;
  if (!differ) printf("note: the canonical and native orders give the same bytes on the %s table\n", moe8_isa_name(moe8_isa_active()));
  else printf("the %s table: canonical and native outputs differ\n", moe8_isa_name(moe8_isa_active()));
  atomic_store(&g_order_stop, 0);
  order_job jobs[2] = {{L, x, {want[0], want[1]}, T, {0, 0}, 0, MOE8_OK}, {L, x, {want[0], want[1]}, T, {0, 0}, 0, MOE8_OK}};
  pthread_t th[3];
  for (int i = 0; i < 2; i++) assert_int_equal(pthread_create(&th[i], NULL, run_order_forwards, &jobs[i]), 0);
  assert_int_equal(pthread_create(&th[2], NULL, toggle_order, L), 0);
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  atomic_store(&g_order_stop, 1);
  void *tr = NULL;
  pthread_join(th[2], &tr);
  assert_null(tr);
  printf("forwards while the order toggled: %d canonical, %d native, %d neither\n", jobs[0].seen[0] + jobs[1].seen[0],
         jobs[0].seen[1] + jobs[1].seen[1], jobs[0].wrong + jobs[1].wrong);
  for (int i = 0; i < 2; i++) {
    assert_int_equal(jobs[i].st, MOE8_OK);
    if (jobs[i].wrong)
      TU_FAIL("thread %d: %d of 40 forwards equal neither the canonical nor the native output alone (%d canonical, %d native)", i,
              jobs[i].wrong, jobs[i].seen[0], jobs[i].seen[1]);
  }
  moe8_layer_destroy(L);
  moe8_rules_destroy(rs);
  free(x);
  free(want[0]);
  free(want[1]);
  assert_int_equal(moe8_isa_set(was), MOE8_OK);
}

/* One training layer (FP8 rule, a shared expert) whose forwards and
** backwards run in two threads at once, each with its own workspace and
** its own input size: the backward's large buffers come from the layer's
** pool (core/pool.c), which the threads share, so each gradient must still
** be the bytes of the same backward alone, at every repetition (the
** pool's blocks come back holding another call's values). */
typedef struct bwd_job {
  moe8_layer *L;
  const float *x, *dout, *want; /* want: dx then dwg, dwu, dwd, dwsd */
  int64_t T;
  int wrong;
  moe8_status st;
} bwd_job;

enum { BWD_E = 8, BWD_D = 64, BWD_F = 48, BWD_FS = 32 };

static size_t bwd_count(int64_t T) { return (size_t)(T * BWD_D + 3 * BWD_E * BWD_D * BWD_F + BWD_FS * BWD_D); }

static moe8_status bwd_once(moe8_layer *L, const float *x, const float *dout, int64_t T, void *ws, size_t wsz, float *g) {
  float *out = malloc(sizeof(float) * (size_t)(T * BWD_D)), aux;
  if (!out) return MOE8_ERR_NOMEM;
  const size_t ew = (size_t)(BWD_E * BWD_D * BWD_F);
  float *dx = g, *dwg = dx + T * BWD_D, *dwu = dwg + ew, *dwd = dwu + ew, *dwsd = dwd + ew;
  moe8_layer_grads gr = {.dx = dx, .dwg = dwg, .dwu = dwu, .dwd = dwd, .dwsd = dwsd};
  moe8_status st = moe8_layer_forward(L, x, T, out, &aux, ws, wsz);
  if (st == MOE8_OK) st = moe8_layer_backward(L, x, T, dout, ws, wsz, &gr);
  free(out);
  return st;
}

static moe8_status bwd_call(const void *ctx, moe8_layer *L, void *ws, size_t wsz, float *g) {
  const bwd_job *j = ctx;
  return bwd_once(L, j->x, j->dout, j->T, ws, wsz, g);
}

static void *run_bwd(void *p) {
  bwd_job *j = p;
  repeat_compare(j->L, j->T, bwd_count(j->T), 6, bwd_call, j, j->want, &j->wrong, &j->st);
  return NULL;
}

static void test_backwards_two_threads(void **state) {
  (void)state;
  const int64_t Ts[2] = {37, 21};
  moe8_layer_config c = {.num_experts = BWD_E, .top_k = 2, .hidden = BWD_D, .ffn = BWD_F, .shared_ffn = BWD_FS,
                         .norm_topk_prob = true};
  moe8_rules *rs = fp8_rules();
  moe8_layer *L = new_layer(&c, rs, 5);
  float *x[2], *dout[2], *want[2];
  bwd_job jobs[2];
  tu_rng_reset(8);
  for (int i = 0; i < 2; i++) {
    const int64_t T = Ts[i];
    x[i] = malloc(sizeof(float) * (size_t)(T * BWD_D));
    dout[i] = malloc(sizeof(float) * (size_t)(T * BWD_D));
    want[i] = malloc(sizeof(float) * bwd_count(T));
    tu_fill_normal(x[i], (size_t)(T * BWD_D), 1.0f);
    tu_fill_normal(dout[i], (size_t)(T * BWD_D), 1.0f);
    /* alone, on a layer of its own (a fresh pool) */
    moe8_layer *L1 = new_layer(&c, rs, 5);
    const size_t wsz = moe8_layer_workspace_size(L1, T);
    void *ws = NULL;
    assert_int_equal(posix_memalign(&ws, 64, wsz), 0);
    assert_int_equal(bwd_once(L1, x[i], dout[i], T, ws, wsz, want[i]), MOE8_OK);
    free(ws);
    moe8_layer_destroy(L1);
    jobs[i] = (bwd_job){L, x[i], dout[i], want[i], T, 0, MOE8_OK};
  }
  pthread_t th[2];
  for (int i = 0; i < 2; i++) assert_int_equal(pthread_create(&th[i], NULL, run_bwd, &jobs[i]), 0);
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < 2; i++) {
    assert_int_equal(jobs[i].st, MOE8_OK);
    if (jobs[i].wrong) TU_FAIL("thread %d (T=%lld): %d of 6 backwards of the shared layer differ from the backward alone", i, (long long)Ts[i], jobs[i].wrong);
  }
  moe8_layer_destroy(L);
  moe8_rules_destroy(rs);
  for (int i = 0; i < 2; i++) free(x[i]), free(dout[i]), free(want[i]);
}

int main(void) {
  tu_seed();
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_two_layers_two_threads),
    cmocka_unit_test(test_one_layer_two_threads),
    cmocka_unit_test(test_backwards_two_threads),
    cmocka_unit_test(test_parsers_in_parallel),
    cmocka_unit_test(test_order_set_while_forwards_run),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
