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
    cmocka_unit_test(test_parsers_in_parallel),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
