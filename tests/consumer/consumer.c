/* A program outside the moe8 tree: links the installed library (found by
** pkg-config or find_package), runs one forward pass and checks it. */
#include <moe8.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(void) {
  if (strcmp(moe8_version_string(), MOE8_VERSION_STRING) != 0 || moe8_version() != MOE8_VERSION_NUMBER) {
    fprintf(stderr, "version: library %s (%d), header %s\n", moe8_version_string(), moe8_version(), MOE8_VERSION_STRING);
    return 1;
  }
  const moe8_layer_config cfg = {.num_experts = 4, .top_k = 2, .hidden = 32, .ffn = 16, .norm_topk_prob = true};
  moe8_layer *L = NULL;
  if (moe8_layer_create(&cfg, NULL, "experts", &L) != MOE8_OK || moe8_layer_init_random(L, 7) != MOE8_OK ||
      moe8_layer_prepare(L) != MOE8_OK) {
    fprintf(stderr, "create: %s\n", moe8_last_error());
    return 1;
  }
  enum { T = 5, D = 32 };
  float x[T * D], y[T * D];
  for (int i = 0; i < T * D; i++) x[i] = (float)((i * 37) % 11) * 0.1f - 0.5f;
  const size_t wsz = moe8_layer_workspace_size(L, T);
  void *ws = NULL;
  if (posix_memalign(&ws, 64, wsz) != 0) return 1;
  if (moe8_layer_forward_fused(L, x, T, y, ws, wsz) != MOE8_OK) { fprintf(stderr, "forward: %s\n", moe8_last_error()); return 1; }
  double s = 0;
  for (int i = 0; i < T * D; i++) {
    if (!isfinite(y[i])) return 1;
    s += fabs(y[i]);
  }
  /* bad input is an error with a message, not a crash */
  if (moe8_layer_forward_fused(L, x, -1, y, ws, wsz) == MOE8_OK || !*moe8_last_error()) return 1;
  printf("moe8 %s: forward ok, sum |y| = %.6f\n", moe8_version_string(), s);
  free(ws);
  moe8_layer_destroy(L);
  return s > 0 ? 0 : 1;
}
