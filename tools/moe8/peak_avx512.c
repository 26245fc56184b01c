/*
** peak_avx512.c — the machine's own peaks, measured with small kernels:
** 12 independent accumulators per loop, so the loop is bound by throughput,
** not latency.  Compiled with AVX-512 target attributes and called only when
** the ISA is present.
*/
#include "peak.h"

#include <immintrin.h>

#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx512vnni")))

double cli_now(void);

T512 static double run_f32(long iters) {
  __m512 c[12];
  for (int i = 0; i < 12; i++) c[i] = _mm512_set1_ps((float)i);
  const __m512 a = _mm512_set1_ps(1.0000001f), b = _mm512_set1_ps(0.9999999f);
  const double t0 = cli_now();
  for (long n = 0; n < iters; n++)
    for (int i = 0; i < 12; i++) c[i] = _mm512_fmadd_ps(a, c[i], b);
  const double t = cli_now() - t0;
  __m512 s = c[0];
  for (int i = 1; i < 12; i++) s = _mm512_add_ps(s, c[i]);
  volatile float sink = _mm512_reduce_add_ps(s);
  (void)sink;
  return (double)iters * 12 * 32 / t / 1e9;
}

T512 static double run_bf16(long iters) {
  __m512 c[12];
  for (int i = 0; i < 12; i++) c[i] = _mm512_setzero_ps();
  const __m512i a = _mm512_set1_epi32(0x3F803F80), b = _mm512_set1_epi32(0x3F803F80);
  const double t0 = cli_now();
  for (long n = 0; n < iters; n++)
    for (int i = 0; i < 12; i++) c[i] = _mm512_dpbf16_ps(c[i], (__m512bh)a, (__m512bh)b);
  const double t = cli_now() - t0;
  __m512 s = c[0];
  for (int i = 1; i < 12; i++) s = _mm512_add_ps(s, c[i]);
  volatile float sink = _mm512_reduce_add_ps(s);
  (void)sink;
  return (double)iters * 12 * 64 / t / 1e9;
}

#define DPBUSD(c, a, b) __extension__({ __m512i c_ = (c); __asm__("vpdpbusd %2, %1, %0" : "+v"(c_) : "v"(a), "v"(b)); c_; })

T512 static double run_i8(long iters) {
  __m512i c[12];
  for (int i = 0; i < 12; i++) c[i] = _mm512_setzero_si512();
  const __m512i a = _mm512_set1_epi8(1), b = _mm512_set1_epi8(1);
  const double t0 = cli_now();
  /* vpdpbusd in asm: GCC's intrinsic copies each accumulator into a new
  ** register every iteration (12 vmovdqa32 a loop), which measured 750
  ** against 841 GOP/s on an AMX Xeon's AVX-512 units. */
  for (long n = 0; n < iters; n++)
#pragma GCC unroll 12
    for (int i = 0; i < 12; i++) c[i] = DPBUSD(c[i], a, b);
  const double t = cli_now() - t0;
  __m512i s = c[0];
  for (int i = 1; i < 12; i++) s = _mm512_add_epi32(s, c[i]);
  volatile int sink = _mm512_reduce_add_epi32(s);
  (void)sink;
  return (double)iters * 12 * 128 / t / 1e9;
}

double peak_amx(int int8, long iters); /* peak_amx.c */

double peak_gops(peak_kind kind) {
  const long iters = 20000000;
  double best = 0;
  for (int r = 0; r < 3; r++) {
    const double g = kind == PEAK_AMX_BF16 || kind == PEAK_AMX_I8 ? peak_amx(kind == PEAK_AMX_I8, iters / 16)
                     : kind == PEAK_F32_FMA ? run_f32(iters) : kind == PEAK_BF16_DP ? run_bf16(iters) : run_i8(iters);
    if (g > best) best = g;
  }
  return best;
}
