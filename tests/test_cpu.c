/*
** test_cpu.c — docs/kernels.md: the feature set picks the family.  Run by
** ctest in three modes, each with its environment:
**   default      the process's choice; the order follows the table
**                (canonical on a table with tiles, else native unless
**                set), and the setters work;
**   vnni_only    MOE8_CPU_FEATURES=avx512f,avx512vnni: the VNNI family
**                without vdpbf16ps, no BF16 table, no AMX;
**   amx_refused  MOE8_AMX_PERM=refuse: the tile permission refused, so
**                no AMX table, the AVX-512 one chosen, and the reason
**                (printed under MOE8_DEBUG) says so.
*/
#include "testutil.h"
#include "core/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *g_mode = "default";

static void test_mode(void **state) {
  (void)state;
  if (!moe8_isa_supported(MOE8_ISA_AVX512)) {
    printf("notice: no AVX-512 on this CPU or build: the feature-set tests are skipped\n");
    skip();
  }
  if (strcmp(g_mode, "vnni_only") == 0) {
    const moe8__ktable *t = moe8__kernels_for(MOE8_ISA_AVX512_VNNI);
    if (!t) { printf("notice: this CPU has no AVX512_VNNI: skipped\n"); skip(); }
    assert_int_equal(moe8_isa_active(), MOE8_ISA_AVX512_VNNI);
    assert_false(moe8__kernels()->has_bf16);
    assert_false(moe8_isa_supported(MOE8_ISA_AVX512_BF16));
    assert_false(moe8_isa_supported(MOE8_ISA_AMX));
    assert_false(moe8__cpu_has_vbmi());
  } else if (strcmp(g_mode, "amx_refused") == 0) {
    assert_false(moe8_isa_supported(MOE8_ISA_AMX));
    assert_true(moe8_isa_active() != MOE8_ISA_AMX && moe8_isa_active() >= MOE8_ISA_AVX512);
    const char *why = moe8__amx_unavailable();
    assert_non_null(why);
    assert_non_null(strstr(why, "refused"));
    assert_int_equal(moe8_isa_set(MOE8_ISA_AMX), MOE8_ERR_UNSUPPORTED);
    assert_non_null(strstr(moe8_last_error(), "refused"));
  } else {
    const moe8_isa best = moe8_isa_active();
    const bool tiles = moe8__kernels()->has_tiles;
    assert_true(best != MOE8_ISA_AMX_EMU); /* the model is never chosen by itself */
    assert_int_equal(moe8_order_effective(MOE8_ORDER_DEFAULT), tiles ? MOE8_ORDER_CANONICAL : MOE8_ORDER_NATIVE);
    assert_int_equal(moe8_order_effective(MOE8_ORDER_CANONICAL), MOE8_ORDER_CANONICAL);
    assert_int_equal(moe8_order_set(MOE8_ORDER_CANONICAL), MOE8_OK);
    assert_int_equal(moe8_order_effective(MOE8_ORDER_DEFAULT), MOE8_ORDER_CANONICAL);
    assert_int_equal(moe8_order_effective(MOE8_ORDER_NATIVE), tiles ? MOE8_ORDER_CANONICAL : MOE8_ORDER_NATIVE);
    assert_int_equal(moe8_order_set((moe8_order)7), MOE8_ERR_INVALID_ARG);
    assert_int_equal(moe8_order_set(MOE8_ORDER_DEFAULT), MOE8_OK);
    if (moe8_isa_supported(MOE8_ISA_AMX_EMU)) {
      /* A table with tiles sums in the canonical order whatever is asked. */
      assert_int_equal(moe8_isa_set(MOE8_ISA_AMX_EMU), MOE8_OK);
      assert_int_equal(moe8_order_effective(MOE8_ORDER_NATIVE), MOE8_ORDER_CANONICAL);
      assert_int_equal(moe8_isa_set(best), MOE8_OK);
    }
    /* A gmm with an unknown order is refused. */
    float x[4] = {1, 2, 3, 4}, w[4] = {1, 0, 0, 1}, y[4];
    int32_t gs[1] = {2};
    moe8_gmm_args a = {.M = 2, .K = 2, .N = 2, .num_groups = 1, .group_sizes = gs, .num_local = 1,
                       .lhs = {MOE8_DTYPE_F32, x, NULL, 0, 0}, .rhs = {MOE8_DTYPE_F32, w, NULL, 0, 0},
                       .out_dtype = MOE8_DTYPE_F32, .out = y, .order = (moe8_order)9};
    assert_int_equal(moe8_gmm(&a), MOE8_ERR_INVALID_ARG);
    assert_non_null(strstr(moe8_last_error(), "order"));
  }
}

int main(int argc, char **argv) {
  if (argc > 1) g_mode = argv[1];
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_mode)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
