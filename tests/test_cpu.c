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
** The default mode also runs this program again as a child (mode
** "report": one line of what the feature set gave) under each of the
** feature variables, and checks how they are read: MOE8_CPU_FEATURES
** names matched exactly, an unknown or empty name refused on stderr with
** the list of names and the override ignored; MOE8_NO_VBMI=0 is off.
*/
#include "testutil.h"
#include "core/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *g_mode = "default";

/* What the feature set gave: the supported tables, the active one, VBMI. */
static void report(void) {
  printf("supported");
  for (int i = 0; i < MOE8_ISA_COUNT; i++)
    if (moe8_isa_supported((moe8_isa)i)) printf(" %s", moe8_isa_name((moe8_isa)i));
  printf("; active %s; vbmi %d\n", moe8_isa_name(moe8_isa_active()), (int)moe8__cpu_has_vbmi());
}

/* This program run as "report" with env (NAME=VALUE ...) and the feature
** variables otherwise unset; its stdout and stderr in out. */
static void child(const char *env, char *out, size_t cap) {
  char self[4096], cmd[8192];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  assert_true(n > 0);
  self[n] = '\0';
  snprintf(cmd, sizeof cmd, "env -u MOE8_CPU_FEATURES -u MOE8_NO_VBMI -u MOE8_NO_BF16 -u MOE8_ISA -u MOE8_DEBUG -u MOE8_CPU_VENDOR %s '%s' report 2>&1", env,
           self);
  FILE *f = popen(cmd, "r");
  assert_non_null(f);
  const size_t got = fread(out, 1, cap - 1, f);
  out[got] = '\0';
  assert_int_equal(pclose(f), 0);
}

static void test_feature_variables(void **state) {
  (void)state;
  if (strcmp(g_mode, "default") != 0) skip();
  char base[4096], got[4096];
  child("", base, sizeof base);
  /* Unknown names, substrings, empty names: refused, the override ignored. */
  static const char *const bad[][2] = {{"garbage", "'garbage'"}, {"noavx512vnni,avx512f", "'noavx512vnni'"},
                                       {"avx512f,avx512vnnix", "'avx512vnnix'"}, {"avx512f,", "an empty name"},
                                       {"AVX512F", "'AVX512F'"}, {"avx512f,amx,vnni", "'vnni'"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char env[256];
    snprintf(env, sizeof env, "MOE8_CPU_FEATURES='%s'", bad[i][0]);
    child(env, got, sizeof got);
    printf("%s: %s", env, got);
    assert_non_null(strstr(got, "MOE8_CPU_FEATURES="));
    assert_non_null(strstr(got, bad[i][1]));
    assert_non_null(strstr(got, "avx512f, avx512bw, avx512vl, avx512dq, avx512bf16, avx512vnni, avx512vbmi, amx"));
    assert_non_null(strstr(got, "ignored"));
    assert_non_null(strstr(got, base)); /* the CPU's own features */
  }
  /* MOE8_NO_VBMI=0 is off; =1 hides VBMI. */
  child("MOE8_NO_VBMI=0", got, sizeof got);
  assert_string_equal(got, base);
  if (!moe8_isa_supported(MOE8_ISA_AVX512)) {
    printf("notice: no AVX-512 on this CPU or build: the feature names' effects are not checked\n");
    return;
  }
  child("MOE8_NO_VBMI=1", got, sizeof got);
  assert_non_null(strstr(got, "; vbmi 0"));
  /* MOE8_CPU_VENDOR (read with the AVX-512 features): intel and amd are
  ** taken without a word, anything else is refused and ignored; the
  ** features are the CPU's either way. */
  child("MOE8_CPU_VENDOR=intel", got, sizeof got);
  assert_string_equal(got, base);
  child("MOE8_CPU_VENDOR=amd", got, sizeof got);
  assert_string_equal(got, base);
  child("MOE8_CPU_VENDOR=arm", got, sizeof got);
  printf("MOE8_CPU_VENDOR=arm: %s", got);
  assert_non_null(strstr(got, "MOE8_CPU_VENDOR=arm is not intel or amd; ignored"));
  assert_non_null(strstr(got, base));
  /* Names matched exactly; each of F, BW, VL, DQ keeps the AVX-512 base. */
  static const char *const base_names[] = {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512bw,avx512f,avx512dq,avx512vl"};
  for (size_t i = 0; i < sizeof base_names / sizeof base_names[0]; i++) {
    char env[256];
    snprintf(env, sizeof env, "MOE8_CPU_FEATURES=%s", base_names[i]);
    child(env, got, sizeof got);
    printf("%s: %s", env, got);
    assert_string_equal(got, "supported ref avx512; active avx512; vbmi 0\n");
  }
  if (moe8__kernels_for(MOE8_ISA_AVX512_VNNI)) {
    child("MOE8_CPU_FEATURES=avx512bw,avx512vnni", got, sizeof got);
    assert_string_equal(got, "supported ref avx512 avx512_vnni amx_emu; active avx512_vnni; vbmi 0\n");
  }
  if (moe8__cpu_has_vbmi()) {
    child("MOE8_CPU_FEATURES=avx512f,avx512vbmi", got, sizeof got);
    assert_string_equal(got, "supported ref avx512; active avx512; vbmi 1\n");
  }
}

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
  if (strcmp(g_mode, "report") == 0) {
    report();
    return 0;
  }
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_mode), cmocka_unit_test(test_feature_variables)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
