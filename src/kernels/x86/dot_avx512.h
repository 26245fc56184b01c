/*
** dot_avx512.h — vpdpbusd and vdpbf16ps with the accumulator tied to the
** result.
**
** GCC 12 compiles _mm512_dpbusd_epi32 / _mm512_dpbf16_ps in an unrolled
** register-blocked loop by copying every accumulator to a fresh register
** before the instruction and back after it (two extra moves per dot
** product, and spills at 16 accumulators): the int8 microkernel ran at 65%
** of the vpdpbusd peak because of it.  The asm below is the same
** instruction (same bits) with the sum read and written in one register,
** so the loops compile to loads, broadcasts and dot products only.
** Include only from files compiled with the instruction's target.
*/
#ifndef MOE8_DOT_AVX512_H
#define MOE8_DOT_AVX512_H

#include <immintrin.h>

/* c + Σ4 (unsigned bytes of a) · (signed bytes of b), per 32-bit lane. */
#define moe8__dpbusd(c, a, b) __extension__({ \
    __m512i c_ = (c);                                                   \
    __asm__("vpdpbusd %2, %1, %0" : "+v"(c_) : "v"((__m512i)(a)), "vm"((__m512i)(b))); \
    c_; })

/* moe8__dpbusd(c, a, the 32-bit word at p in every lane): the instruction
** reads the word itself ({1to16}), so a kernel whose accumulators fill
** the registers needs none for the broadcast. */
#define moe8__dpbusd_b(c, a, p) __extension__({ \
    __m512i c_ = (c);                                                   \
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(c_) : "v"((__m512i)(a)), "m"(*(const int32_t *)(const void *)(p))); \
    c_; })

/* c + a.even · b.even + a.odd · b.odd (bf16 pairs), per f32 lane. */
#define moe8__dpbf16(c, a, b) __extension__({ \
    __m512 c_ = (c);                                                    \
    __asm__("vdpbf16ps %2, %1, %0" : "+v"(c_) : "v"((__m512bh)(a)), "vm"((__m512bh)(b))); \
    c_; })

/* moe8__dpbf16 with a's pair word broadcast straight from memory at p
** ({1to16}): no register holds it (the products are the same either way
** round, so the same bits). */
#define moe8__dpbf16_b(c, b, p) __extension__({ \
    __m512 c_ = (c);                                                    \
    __asm__("vdpbf16ps %2%{1to16%}, %1, %0" : "+v"(c_) : "v"((__m512bh)(b)), "m"(*(const uint32_t *)(const void *)(p))); \
    c_; })

#endif /* MOE8_DOT_AVX512_H */
