/*
** peak.h — single-core peak throughput of the machine, measured (bench).
*/
#ifndef MOE8_PEAK_H
#define MOE8_PEAK_H

typedef enum { PEAK_F32_FMA, PEAK_BF16_DP, PEAK_I8_DP, PEAK_AMX_BF16, PEAK_AMX_I8 } peak_kind;

/* Best of 3 runs, in GFLOP/s (f32, bf16) or GOP/s (i8), one thread. */
double peak_gops(peak_kind kind);

#endif
