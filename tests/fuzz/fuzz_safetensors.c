/*
** fuzz_safetensors.c — libFuzzer target: the safetensors header parser on
** arbitrary bytes.  Anything but a clean accept or a clean error is a bug;
** on accept, every tensor view must lie inside the buffer.
*/
#include "moe8.h"

#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  moe8_st_file *f = NULL;
  if (moe8_st_parse(data, size, "fuzz", &f) == MOE8_OK) {
    for (size_t i = 0; i < moe8_st_count(f); i++) {
      const moe8_tensor_view *t = moe8_st_at(f, i);
      if (t->offset > size || t->nbytes > size - t->offset) abort();
      volatile uint8_t sink = 0;
      if (t->nbytes) sink ^= ((const uint8_t *)t->data)[t->nbytes - 1];
      (void)sink;
      if (moe8_st_find(f, t->name) != t) abort();
    }
    moe8_st_close(f);
  } else if (f) {
    abort();
  }
  return 0;
}
