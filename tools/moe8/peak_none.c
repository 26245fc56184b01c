/* peak_none.c — no AVX-512 kernels in this build: no peak to measure. */
#include "peak.h"

double peak_gops(peak_kind kind) { (void)kind; return 0.0; }
