/*
** test_amx.c — docs/kernels.md: the C model of the AMX tile instructions
** against results recorded on a real AMX CPU (tests/data/amx), bit for bit
** on every finite output; then tile loads, stores and partial configs.
*/
#include "testutil.h"
#include "kernels/amx_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint8_t *read_all(const char *name, size_t *n) {
  char path[512];
  const char *dir = getenv("MOE8_TEST_DATA");
  snprintf(path, sizeof path, "%s/amx/%s", dir && *dir ? dir : "tests/data", name);
  FILE *f = fopen(path, "rb");
  if (!f) TU_FAIL("cannot open %s", path);
  fseek(f, 0, SEEK_END);
  const long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *b = malloc((size_t)len);
  assert_int_equal(fread(b, 1, (size_t)len, f), (size_t)len);
  fclose(f);
  *n = (size_t)len;
  return b;
}

static void config_full(moe8__amx_state *s) {
  uint8_t cfg[64] = {1};
  for (int i = 0; i < 8; i++) { cfg[16 + 2 * i] = 64; cfg[48 + i] = 16; }
  moe8__amx_loadconfig(s, cfg);
}

/* One file: every case A | B | C0 | C through the model. */
static void check_file(const char *name, int kind, int *checked) {
  size_t n;
  uint8_t *buf = read_all(name, &n);
  assert_int_equal(n % 4096, 0);
  moe8__amx_state *s = calloc(1, sizeof *s);
  config_full(s);
  int bad = 0;
  long finite = 0;
  for (size_t c = 0; c < n / 4096; c++) {
    const uint8_t *A = buf + 4096 * c, *B = A + 1024, *C0 = A + 2048, *C = A + 3072;
    moe8__amx_loadd(s, 4, A, 64);
    moe8__amx_loadd(s, 6, B, 64);
    moe8__amx_loadd(s, 0, C0, 64);
    if (kind == 0) moe8__amx_dpbf16ps(s, 0, 4, 6);
    else moe8__amx_dpb(s, 0, 4, 6, kind == 1 || kind == 2, kind == 1 || kind == 3);
    uint8_t out[1024];
    moe8__amx_stored(s, 0, out, 64);
    for (int i = 0; i < 256; i++) {
      if (kind == 0) {
        float want;
        memcpy(&want, C + 4 * i, 4);
        if (!isfinite(want)) continue; /* specials: the hardware gives inf where IEEE gives NaN */
      }
      finite++;
      if (memcmp(out + 4 * i, C + 4 * i, 4) != 0 && bad++ < 5) {
        uint32_t g, w;
        memcpy(&g, out + 4 * i, 4);
        memcpy(&w, C + 4 * i, 4);
        print_error("%s case %zu element %d: model %08x, hardware %08x\n", name, c, i, g, w);
      }
    }
  }
  if (bad) TU_FAIL("%s: %d of %ld outputs differ from the recorded hardware", name, bad, finite);
  printf("%s: %ld outputs equal the recorded hardware bit for bit\n", name, finite);
  *checked += (int)(finite > 0);
  free(s);
  free(buf);
}

static void test_model_vs_hardware(void **state) {
  (void)state;
  int files = 0;
  check_file("tdpbf16ps.bin", 0, &files);
  check_file("tdpbssd.bin", 1, &files);
  check_file("tdpbsud.bin", 2, &files);
  check_file("tdpbusd.bin", 3, &files);
  check_file("tdpbuud.bin", 4, &files);
  assert_int_equal(files, 5);
}

/* The recorded bf16 file has FP8-valued and subnormal kinds; a direct
** check that the model is not vdpbf16ps's order: odd product first into
** the destination differs on some recorded case. */
static void test_model_order_matters(void **state) {
  (void)state;
  size_t n;
  uint8_t *buf = read_all("tdpbf16ps.bin", &n);
  int differ = 0;
  for (size_t c = 0; c < n / 4096; c++) {
    if (c % 5 != 0) continue;
    const uint8_t *A = buf + 4096 * c, *B = A + 1024, *C0 = A + 2048, *C = A + 3072;
    for (int m = 0; m < 16; m++)
      for (int j = 0; j < 16; j++) {
        float acc;
        memcpy(&acc, C0 + 64 * m + 4 * j, 4);
        for (int k = 0; k < 16; k++) {
          acc += moe8__amx_bf16(A + 64 * m + 4 * k + 2) * moe8__amx_bf16(B + 64 * k + 4 * j + 2);
          acc += moe8__amx_bf16(A + 64 * m + 4 * k) * moe8__amx_bf16(B + 64 * k + 4 * j);
        }
        differ += memcmp(&acc, C + 64 * m + 4 * j, 4) != 0;
      }
  }
  assert_true(differ > 0);
  free(buf);
}

/* Partial tiles: a config of 3 rows × 24 bytes loads, multiplies and
** stores only those; the rest of the destination memory is untouched. */
static void test_model_partial(void **state) {
  (void)state;
  moe8__amx_state *s = calloc(1, sizeof *s);
  uint8_t cfg[64] = {1};
  for (int i = 0; i < 8; i++) { cfg[16 + 2 * i] = 24; cfg[48 + i] = 3; }
  cfg[48 + 6] = 6; /* b: K = 24 / 4 = 6 rows */
  moe8__amx_loadconfig(s, cfg);
  int8_t a[3 * 24], b[6 * 24];
  for (int i = 0; i < 3 * 24; i++) a[i] = (int8_t)(i * 7 - 100);
  for (int i = 0; i < 6 * 24; i++) b[i] = (int8_t)(i * 5 - 60);
  moe8__amx_loadd(s, 4, a, 24);
  moe8__amx_loadd(s, 6, b, 24);
  moe8__amx_zero(s, 0);
  moe8__amx_dpb(s, 0, 4, 6, 1, 1);
  int32_t out[3][8];
  memset(out, 0x5A, sizeof out);
  moe8__amx_stored(s, 0, out, 32);
  for (int m = 0; m < 3; m++)
    for (int j = 0; j < 8; j++) {
      if (j >= 6) { assert_int_equal((uint32_t)out[m][j], 0x5A5A5A5Au); continue; }
      int32_t want = 0;
      for (int k = 0; k < 24; k++) want += a[m * 24 + k] * b[(k / 4) * 24 + 4 * j + k % 4];
      assert_int_equal(out[m][j], want);
    }
  free(s);
}

int main(void) {
  tu_seed();
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_model_vs_hardware),
    cmocka_unit_test(test_model_order_matters),
    cmocka_unit_test(test_model_partial),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
