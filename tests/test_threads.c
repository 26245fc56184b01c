/*
** test_threads.c — moe8 from several threads at once: two layers running
** forward in two threads give the bytes they give alone, and parsers
** running in parallel locate their own errors (each thread's message has
** its own file's byte offset; the JSON library's global error pointer is
** not used).  Also built with ThreadSanitizer (docs/testing.md).
*/
#include "testutil.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static void *run_shared(void *p) {
  shared_job *j = p;
  const size_t wsz = moe8_layer_workspace_size(j->L, j->T), n = (size_t)(j->T * moe8_layer_get_config(j->L)->hidden);
  void *ws = NULL;
  float *y = malloc(sizeof(float) * n);
  if (!y || posix_memalign(&ws, 64, wsz) != 0) { j->st = MOE8_ERR_NOMEM; free(y); return NULL; }
  for (int rep = 0; rep < 25 && j->st == MOE8_OK; rep++) {
    float aux;
    j->st = moe8_layer_forward(j->L, j->x, j->T, y, &aux, ws, wsz);
    if (j->st == MOE8_OK && memcmp(y, j->want, sizeof(float) * n) != 0) j->wrong++;
  }
  free(ws);
  free(y);
  return NULL;
}

static void test_one_layer_two_threads(void **state) {
  (void)state;
  const int64_t T = 23, D = 64;
  moe8_layer_config c = {.num_experts = 8, .top_k = 2, .hidden = D, .ffn = 48, .norm_topk_prob = true};
  const char *rj = "{\"rules\": [{\"module_path\": \".*\", \"weight_qtype\": \"float8_e4m3fn\", \"act_qtype\": \"float8_e4m3fn\", \"tile_size\": 32}]}";
  moe8_rules *rs = NULL;
  assert_int_equal(moe8_rules_parse(rj, strlen(rj), "inline", &rs), MOE8_OK);
  moe8_layer *L;
  assert_int_equal(moe8_layer_create(&c, rs, "experts", &L), MOE8_OK);
  assert_int_equal(moe8_layer_init_random(L, 3), MOE8_OK);
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
  const char *rj = "{\"rules\": [{\"module_path\": \".*\", \"weight_qtype\": \"float8_e4m3fn\", \"act_qtype\": \"float8_e4m3fn\", \"tile_size\": 32}]}";
  moe8_rules *rs = NULL;
  assert_int_equal(moe8_rules_parse(rj, strlen(rj), "inline", &rs), MOE8_OK);
  moe8_layer *L[2];
  float *x = malloc(sizeof(float) * (size_t)(T * D)), *alone[2], *both[2];
  tu_rng_reset(5);
  tu_fill_normal(x, (size_t)(T * D), 1.0f);
  for (int i = 0; i < 2; i++) {
    assert_int_equal(moe8_layer_create(&c, i ? rs : NULL, "experts", &L[i]), MOE8_OK);
    assert_int_equal(moe8_layer_init_random(L[i], 10 + (uint64_t)i), MOE8_OK);
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

int main(void) {
  tu_seed();
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_two_layers_two_threads),
    cmocka_unit_test(test_one_layer_two_threads),
    cmocka_unit_test(test_parsers_in_parallel),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
