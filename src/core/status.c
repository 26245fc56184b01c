/*
** status.c — status strings and the per-thread last-error message.
**
** Every failing path in the library formats its detail here through
** moe8__fail(); the message lives in thread-local storage so concurrent
** callers never see each other's errors.
*/
#include "internal.h"

#include <string.h>

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char g_last_error[4096]; /* the longest, the family list of an unknown model_type, is ~1.5 KB */

const char *moe8_status_str(moe8_status status) {
  switch (status) {
    case MOE8_OK:              return "ok";
    case MOE8_ERR_INVALID_ARG: return "invalid argument";
    case MOE8_ERR_SHAPE:       return "shape mismatch";
    case MOE8_ERR_DTYPE:       return "unsupported dtype";
    case MOE8_ERR_NONFINITE:   return "non-finite or invalid value";
    case MOE8_ERR_NOMEM:       return "out of memory";
    case MOE8_ERR_IO:          return "i/o error";
    case MOE8_ERR_FORMAT:      return "malformed file";
    case MOE8_ERR_PARSE:       return "parse error";
    case MOE8_ERR_UNSUPPORTED: return "unsupported";
    case MOE8_ERR_INTERNAL:    return "internal error";
  }
  return "unknown status";
}

const char *moe8_last_error(void) { return g_last_error; }

void moe8_clear_error(void) { g_last_error[0] = '\0'; }

moe8_status moe8__fail(moe8_status status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_last_error, sizeof g_last_error, fmt, ap);
  va_end(ap);
  return status;
}

int         moe8_version(void) { return MOE8_VERSION_NUMBER; }
const char *moe8_version_string(void) { return MOE8_VERSION_STRING; }

size_t moe8_struct_size(const char *name) {
  static const struct { const char *name; size_t size; } k[] = {
    {"moe8_layer_config", sizeof(moe8_layer_config)}, {"moe8_quant_spec", sizeof(moe8_quant_spec)},
    {"moe8_layer_grads", sizeof(moe8_layer_grads)},   {"moe8_load_options", sizeof(moe8_load_options)},
    {"moe8_quantize_options", sizeof(moe8_quantize_options)},
    {"moe8_gmm_args", sizeof(moe8_gmm_args)},         {"moe8_prepared", sizeof(moe8_prepared)},
    {"moe8_router_config", sizeof(moe8_router_config)}};
  for (size_t i = 0; name && i < sizeof k / sizeof k[0]; i++)
    if (!strcmp(name, k[i].name)) return k[i].size;
  return 0;
}
