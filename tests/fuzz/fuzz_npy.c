/*
** fuzz_npy.c — libFuzzer target: the .npy header parser.  On accept, the
** data region it reports must fit the buffer exactly.
*/
#include "moe8.h"

#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  moe8_file_dtype dt;
  int nd;
  int64_t shape[MOE8_MAX_DIMS];
  size_t off;
  if (moe8_npy_parse(data, size, "fuzz", &dt, &nd, shape, &off) == MOE8_OK) {
    size_t n = moe8_file_dtype_size(dt);
    for (int i = 0; i < nd; i++) n *= (size_t)shape[i];
    if (off > size || n != size - off) abort();
  }
  return 0;
}
