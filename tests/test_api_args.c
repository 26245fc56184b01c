/*
** test_api_args.c — docs/testing.md "Bad input", round 3: public calls
** given bad arguments return a status and a message, never crash (run
** under ASan/UBSan by the test command):
**   - backward checks that the workspace holds this layer's training
**     forward of the same T (a fresh workspace, another T, a fused
**     forward, another layer: refused with a message);
**   - sizes: T = INT64_MAX is refused, moe8_layer_workspace_size says 0;
**   - NULL and zeroed arguments (moe8_file_to_f32, moe8_layer_load_prepared);
**   - a rules file that is a FIFO or a device is refused without blocking.
*/
#include "testutil.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static moe8_layer *make(uint64_t seed) {
  const moe8_layer_config c = {.num_experts = 4, .top_k = 2, .hidden = 32, .ffn = 16, .norm_topk_prob = true};
  moe8_layer *L;
  assert_int_equal(moe8_layer_create(&c, NULL, "model.layers.0.mlp.experts", &L), MOE8_OK);
  assert_int_equal(moe8_layer_init_random(L, seed), MOE8_OK);
  return L;
}

static void *ws_alloc(const moe8_layer *L, int64_t T, size_t *n) {
  *n = moe8_layer_workspace_size(L, T);
  void *ws = NULL;
  assert_int_equal(posix_memalign(&ws, 64, *n), 0);
  memset(ws, 0, *n);
  return ws;
}

static void test_backward_checks_its_forward(void **state) {
  (void)state;
  moe8_layer *L = make(1), *L2 = make(2);
  const int64_t D = 32;
  float *x = malloc(sizeof(float) * 64 * D), *y = malloc(sizeof(float) * 64 * D), *dx = malloc(sizeof(float) * 64 * D);
  tu_rng_reset(3);
  tu_fill_normal(x, 64 * D, 1.0f);
  size_t n;
  void *ws = ws_alloc(L, 64, &n);
  moe8_layer_grads g = {.dx = dx};
  /* a fresh workspace holds no forward */
  assert_int_equal(moe8_layer_backward(L, x, 32, y, ws, n, &g), MOE8_ERR_INVALID_ARG);
  assert_non_null(strstr(moe8_last_error(), "holds no successful forward"));
  /* forward with T = 64, backward with T = 32 (and 65): refused, naming both */
  float aux;
  assert_int_equal(moe8_layer_forward(L, x, 64, y, &aux, ws, n), MOE8_OK);
  assert_int_equal(moe8_layer_backward(L, x, 32, y, ws, n, &g), MOE8_ERR_SHAPE);
  assert_non_null(strstr(moe8_last_error(), "T = 32, but the workspace holds the forward of T = 64"));
  assert_int_equal(moe8_layer_backward(L, x, 65, y, ws, n, &g), MOE8_ERR_SHAPE);
  /* another layer's backward on this workspace */
  assert_int_equal(moe8_layer_backward(L2, x, 64, y, ws, n, &g), MOE8_ERR_INVALID_ARG);
  assert_non_null(strstr(moe8_last_error(), "holds no successful forward of this layer"));
  /* the right one works */
  assert_int_equal(moe8_layer_backward(L, x, 64, y, ws, n, &g), MOE8_OK);
  /* a fused forward is not a training forward */
  assert_int_equal(moe8_layer_prepare(L), MOE8_OK);
  assert_int_equal(moe8_layer_forward_fused(L, x, 64, y, ws, n), MOE8_OK);
  assert_int_equal(moe8_layer_backward(L, x, 64, y, ws, n, &g), MOE8_ERR_INVALID_ARG);
  assert_non_null(strstr(moe8_last_error(), "fused"));
  /* a failed forward leaves the workspace holding nothing */
  assert_int_equal(moe8_layer_forward(L, x, 64, y, &aux, ws, n), MOE8_OK);
  x[7] = 1.0f / 0.0f;
  assert_int_equal(moe8_layer_forward(L, x, 64, y, &aux, ws, n), MOE8_ERR_NONFINITE);
  x[7] = 0.0f;
  assert_int_equal(moe8_layer_backward(L, x, 64, y, ws, n, &g), MOE8_ERR_INVALID_ARG);
  free(ws);
  free(x); free(y); free(dx);
  moe8_layer_destroy(L);
  moe8_layer_destroy(L2);
}

static void test_sizes(void **state) {
  (void)state;
  moe8_layer *L = make(1);
  assert_int_equal(moe8_layer_workspace_size(L, INT64_MAX), 0);
  assert_int_equal(moe8_layer_workspace_size(L, -1), 0);
  assert_int_equal(moe8_layer_workspace_size(NULL, 4), 0);
  float x[32] = {0}, y[32];
  char ws[128] __attribute__((aligned(64)));
  float aux;
  assert_int_equal(moe8_layer_forward(L, x, INT64_MAX, y, &aux, ws, sizeof ws), MOE8_ERR_SHAPE);
  assert_non_null(strstr(moe8_last_error(), "a call takes 0 to"));
  /* a large but representable T: the workspace is what is too small */
  assert_int_equal(moe8_layer_forward(L, x, (int64_t)1 << 40, y, &aux, ws, sizeof ws), MOE8_ERR_INVALID_ARG);
  assert_non_null(strstr(moe8_last_error(), "workspace of 128 bytes"));
  moe8_layer_grads g = {0};
  assert_int_equal(moe8_layer_backward(L, x, INT64_MAX, y, ws, sizeof ws, &g), MOE8_ERR_SHAPE);
  moe8_layer_destroy(L);
}

static void test_null_and_zeroed(void **state) {
  (void)state;
  float d[4];
  const uint8_t s[4] = {0};
  assert_int_equal(moe8_file_to_f32(NULL, s, MOE8_FDT_F8_E4M3, 4), MOE8_ERR_INVALID_ARG);
  assert_int_equal(moe8_file_to_f32(d, NULL, MOE8_FDT_F32, 4), MOE8_ERR_INVALID_ARG);
  assert_int_equal(moe8_file_to_f32(NULL, NULL, MOE8_FDT_F32, 0), MOE8_OK);
  moe8_layer *L = make(1);
  moe8_prepared p;
  memset(&p, 0, sizeof p);
  assert_int_equal(moe8_layer_load_prepared(L, &p), MOE8_ERR_DTYPE);
  p.dtype = MOE8_DTYPE_F8E4M3;
  assert_int_equal(moe8_layer_load_prepared(L, &p), MOE8_ERR_INVALID_ARG);
  assert_non_null(strstr(moe8_last_error(), "NULL w_gate_up"));
  assert_int_equal(moe8_layer_load_prepared(L, NULL), MOE8_ERR_INVALID_ARG);
  assert_int_equal(moe8_layer_load_prepared(NULL, &p), MOE8_ERR_INVALID_ARG);
  assert_int_equal(moe8_layer_set_order(L, (moe8_order)5), MOE8_ERR_INVALID_ARG);
  moe8_layer_weights_changed(NULL); /* no crash */
  moe8_layer_destroy(L);
}

static void on_alarm(int sig) {
  (void)sig;
  static const char m[] = "test_api_args: a rules load blocked\n";
  (void)!write(2, m, sizeof m - 1);
  _exit(3);
}

static void test_rules_file_kinds(void **state) {
  (void)state;
  signal(SIGALRM, on_alarm);
  alarm(20); /* a blocking open fails the test instead of hanging it */
  char dir[] = "/tmp/moe8_argsXXXXXX";
  assert_non_null(mkdtemp(dir));
  char fifo[64];
  snprintf(fifo, sizeof fifo, "%s/rules.fifo", dir);
  assert_int_equal(mkfifo(fifo, 0600), 0);
  moe8_rules *r = (moe8_rules *)0x1;
  assert_true(moe8_rules_load(fifo, &r) != MOE8_OK);
  assert_null(r);
  assert_non_null(strstr(moe8_last_error(), "rules.fifo"));
  assert_true(moe8_rules_load("/dev/zero", &r) != MOE8_OK);
  assert_true(moe8_rules_load(dir, &r) != MOE8_OK);
  char missing[64];
  snprintf(missing, sizeof missing, "%s/none.json", dir);
  assert_true(moe8_rules_load(missing, &r) != MOE8_OK);
  assert_non_null(strstr(moe8_last_error(), "none.json"));
  unlink(fifo);
  rmdir(dir);
  alarm(0);
}

/* What the expert forms do not have yet is refused by name, never computed
** wrong: the input scaling by renormalized weights; bad form parameters.
** (Llama-4's form, the routing weight scaling the expert input, has its
** backward here and its expert parallelism in test_ep; the trainer of a
** layer with biases is test_layer's gpt_oss_form_trainer.) */
static void test_forms_refused(void **state) {
  (void)state;
  moe8_layer_config c = {.num_experts = 4, .top_k = 1, .hidden = 16, .ffn = 8, .score = MOE8_SCORE_SIGMOID, .weight_input = true};
  moe8_layer *L;
  assert_int_equal(moe8_layer_create(&c, NULL, "experts", &L), MOE8_OK);
  assert_int_equal(moe8_layer_init_random(L, 1), MOE8_OK);
  float x[3 * 16], y[3 * 16], aux;
  for (int i = 0; i < 48; i++) x[i] = (float)(i % 7) - 3.0f;
  const size_t wsz = moe8_layer_workspace_size(L, 3);
  void *ws = NULL;
  assert_int_equal(posix_memalign(&ws, 64, wsz), 0);
  assert_int_equal(moe8_layer_forward(L, x, 3, y, &aux, ws, wsz), MOE8_OK);
  static float dx[3 * 16];
  const moe8_layer_grads g = {.dx = dx};
  assert_int_equal(moe8_layer_backward(L, x, 3, y, ws, wsz, &g), MOE8_OK); /* test_layer checks its values */
  moe8_comm *cm;
  moe8_ep *ep;
  assert_int_equal(moe8_comm_create_single(&cm), MOE8_OK);
  assert_int_equal(moe8_ep_create(L, cm, &ep), MOE8_OK);
  float ye[3 * 16];
  assert_int_equal(moe8_ep_forward(ep, x, 3, ye, NULL), MOE8_OK);
  float yl[3 * 16];
  assert_int_equal(moe8_layer_forward(L, x, 3, yl, &aux, ws, wsz), MOE8_OK);
  assert_memory_equal(ye, yl, sizeof ye);
  moe8_ep_destroy(ep);
  moe8_trainer *tr;
  assert_int_equal(moe8_trainer_create(L, 0.01f, &tr), MOE8_OK);
  moe8_trainer_destroy(tr);
  moe8_comm_destroy(cm);
  moe8_layer_destroy(L);
  free(ws);
  moe8_layer_config b = {.num_experts = 4, .top_k = 2, .hidden = 16, .ffn = 8, .act = MOE8_ACT_SWIGLU_CLAMP, .act_alpha = 1.702f,
                         .act_limit = 0.0f};
  assert_int_equal(moe8_layer_create(&b, NULL, "experts", &L), MOE8_ERR_INVALID_ARG);
  assert_non_null(strstr(moe8_last_error(), "act_limit"));
  b.act_limit = 7.0f;
  b.act = (moe8_expert_act)(MOE8_ACT_SILU + 1); /* past the last */
  assert_int_equal(moe8_layer_create(&b, NULL, "experts", &L), MOE8_ERR_INVALID_ARG);
  b.act = MOE8_ACT_SWIGLU_CLAMP;
  b.expert_bias = true;
  b.weight_input = true;
  b.norm_topk_prob = true;
  assert_int_equal(moe8_layer_create(&b, NULL, "experts", &L), MOE8_OK);
  assert_int_equal(moe8_trainer_create(L, 0.01f, &tr), MOE8_ERR_UNSUPPORTED);
  assert_non_null(strstr(moe8_last_error(), "renormalized"));
  moe8_layer_destroy(L);
}

int main(void) {
  tu_seed();
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_backward_checks_its_forward),
    cmocka_unit_test(test_sizes),
    cmocka_unit_test(test_null_and_zeroed),
    cmocka_unit_test(test_rules_file_kinds),
    cmocka_unit_test(test_forms_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
