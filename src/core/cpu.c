/*
** cpu.c — CPU feature detection and the kernel table.
**
** An ISA counts only if the build enabled it (MOE8_HAVE_AVX512), CPUID
** reports the instructions, and XGETBV says the OS saves the opmask and
** ZMM state.  The table for each supported ISA is filled once under
** pthread_once: it starts as the reference table and the ISA's init
** function overrides what it has.  The active table is the best supported
** ISA, or the one MOE8_ISA names.
*/
#include "internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define MOE8_X86 1
#endif

static const char *const g_isa_names[MOE8_ISA_COUNT] = {
  "ref", "avx512", "avx512_bf16", "avx512_vnni"
};

static moe8__ktable  g_tables[MOE8_ISA_COUNT];
static bool           g_supported[MOE8_ISA_COUNT];
static moe8_isa       g_active;
static bool           g_vbmi, g_bf16;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

#ifdef MOE8_X86
static uint64_t xgetbv0(void) {
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return ((uint64_t)hi << 32) | lo;
}
#endif

static void detect(void) {
  g_supported[MOE8_ISA_REF] = true;
#if defined(MOE8_X86) && defined(MOE8_HAVE_AVX512)
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return;
  const bool osxsave = (c >> 27) & 1;
  if (!osxsave) return;
  /* XCR0: SSE(1), AVX(2), opmask(5), ZMM_Hi256(6), Hi16_ZMM(7). */
  if ((xgetbv0() & 0xE6) != 0xE6) return;
  if (__get_cpuid_max(0, NULL) < 7) return;
  __cpuid_count(7, 0, a, b, c, d);
  const bool f = (b >> 16) & 1, dq = (b >> 17) & 1, bw = (b >> 30) & 1, vl = (b >> 31) & 1;
  const bool vnni = (c >> 11) & 1;
  g_vbmi = ((c >> 1) & 1) && getenv("MOE8_NO_VBMI") == NULL; /* read once, not per call */
  __cpuid_count(7, 1, a, b, c, d);
  const bool bf16 = (a >> 5) & 1;
  /* Features one by one: VNNI does not need BF16 (Cascade Lake and Ice
  ** Lake have VNNI only).  MOE8_NO_BF16=1 hides BF16 (tests the
  ** VNNI-only table on any CPU). */
  g_bf16 = bf16 && getenv("MOE8_NO_BF16") == NULL;
  g_supported[MOE8_ISA_AVX512] = f && dq && bw && vl;
  g_supported[MOE8_ISA_AVX512_BF16] = g_supported[MOE8_ISA_AVX512] && g_bf16;
  g_supported[MOE8_ISA_AVX512_VNNI] = g_supported[MOE8_ISA_AVX512] && vnni;
#endif
}

static void init_tables(void) {
  detect();
  for (int i = 0; i < MOE8_ISA_COUNT; i++) {
    if (!g_supported[i]) continue;
    moe8__kernels_init_ref(&g_tables[i]);
#ifdef MOE8_HAVE_AVX512
    g_tables[i].has_bf16 = i == MOE8_ISA_AVX512_BF16 || (i == MOE8_ISA_AVX512_VNNI && g_bf16);
    g_tables[i].has_vnni = i == MOE8_ISA_AVX512_VNNI;
    if (i >= MOE8_ISA_AVX512) {
      moe8__kernels_init_avx512(&g_tables[i]);
      moe8__gmm_init_avx512(&g_tables[i], (moe8_isa)i, g_tables[i].has_bf16);
      moe8__act_init_avx512(&g_tables[i]);
    }
#endif
    g_tables[i].isa = (moe8_isa)i;
  }
  g_active = MOE8_ISA_REF;
  for (int i = MOE8_ISA_COUNT - 1; i >= 0; i--)
    if (g_supported[i]) { g_active = (moe8_isa)i; break; }

  const char *env = getenv("MOE8_ISA");
  if (env && *env) {
    int want = -1;
    for (int i = 0; i < MOE8_ISA_COUNT; i++)
      if (strcmp(env, g_isa_names[i]) == 0) want = i;
    if (want < 0)
      fprintf(stderr, "moe8: MOE8_ISA=%s is not an ISA (ref, avx512, avx512_bf16, avx512_vnni); using %s\n",
              env, g_isa_names[g_active]);
    else if (!g_supported[want])
      fprintf(stderr, "moe8: MOE8_ISA=%s is not supported by this build or CPU; using %s\n",
              env, g_isa_names[g_active]);
    else
      g_active = (moe8_isa)want;
  }
  const char *dbg = getenv("MOE8_DEBUG");
  if (dbg && *dbg && strcmp(dbg, "0") != 0)
    fprintf(stderr, "moe8: kernel table %s%s\n", g_isa_names[g_active],
            g_active == MOE8_ISA_AVX512_VNNI && !g_tables[g_active].has_bf16
                ? " (without vdpbf16ps: the CPU lacks AVX512_BF16 or MOE8_NO_BF16 is set; FP8 and bf16 run on the f32 path)" : "");
}

const char *moe8_isa_name(moe8_isa isa) {
  return (unsigned)isa < MOE8_ISA_COUNT ? g_isa_names[isa] : "unknown";
}

bool moe8_isa_supported(moe8_isa isa) {
  pthread_once(&g_once, init_tables);
  return (unsigned)isa < MOE8_ISA_COUNT && g_supported[isa];
}

moe8_isa moe8_isa_active(void) {
  pthread_once(&g_once, init_tables);
  return g_active;
}

moe8_status moe8_isa_set(moe8_isa isa) {
  pthread_once(&g_once, init_tables);
  if ((unsigned)isa >= MOE8_ISA_COUNT)
    return moe8__fail(MOE8_ERR_INVALID_ARG, "moe8_isa_set: %d is not an ISA", (int)isa);
  if (!g_supported[isa])
    return moe8__fail(MOE8_ERR_UNSUPPORTED, "moe8_isa_set: %s is not supported by this build or CPU",
                      g_isa_names[isa]);
  g_active = isa;
  return MOE8_OK;
}

const moe8__ktable *moe8__kernels(void) {
  pthread_once(&g_once, init_tables);
  return &g_tables[g_active];
}

bool moe8__cpu_has_vbmi(void) {
  pthread_once(&g_once, init_tables);
  return g_vbmi;
}

const moe8__ktable *moe8__kernels_for(moe8_isa isa) {
  pthread_once(&g_once, init_tables);
  if ((unsigned)isa >= MOE8_ISA_COUNT || !g_supported[isa]) return NULL;
  return &g_tables[isa];
}
