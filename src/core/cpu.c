/*
** cpu.c — the CPU's feature set, and nothing else.
**
** detect() reports what the CPU and the OS give, feature by feature
** (AVX-512 F/BW/VL/DQ, BF16, VNNI, VBMI; AMX-TILE/BF16/INT8 with XCR0 bits
** 17-18 and the kernel's tile permission), once, under pthread_once.  The
** kernel tables built on these features are kernels/registry.c's.
*/
#define _GNU_SOURCE 1 /* syscall(): the tile permission */
#include "internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define MOE8_X86 1
#endif
#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

enum {
  F_AVX512 = MOE8__CPU_AVX512,
  F_BF16 = MOE8__CPU_BF16,
  F_VNNI = MOE8__CPU_VNNI,
  F_VBMI = MOE8__CPU_VBMI,
  F_AMX_TILE = MOE8__CPU_AMX_TILE,
  F_AMX_BF16 = MOE8__CPU_AMX_BF16,
  F_AMX_INT8 = MOE8__CPU_AMX_INT8,
};

static unsigned       g_features;
static const char    *g_amx_reason = "the build has no AVX-512 kernels";
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

#ifdef MOE8_X86
static uint64_t xgetbv0(void) {
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return ((uint64_t)hi << 32) | lo;
}
#endif

static bool env_on(const char *name) {
  const char *v = getenv(name);
  return v && *v && strcmp(v, "0") != 0;
}

/* The kernel's permission to use tile data (Linux asks for it per
** process); refuse: MOE8_AMX_PERM=refuse acts as a refusal (tests). */
static bool amx_permission(bool refuse) {
  if (refuse) {
    g_amx_reason = "the kernel refused tile permission (MOE8_AMX_PERM=refuse)";
    return false;
  }
#if defined(__linux__) && defined(__x86_64__)
  /* ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 */
  if (syscall(SYS_arch_prctl, 0x1023, 18) != 0) {
    g_amx_reason = "the kernel refused tile permission (arch_prctl ARCH_REQ_XCOMP_PERM)";
    return false;
  }
  return true;
#else
  g_amx_reason = "tile permission is only asked for on Linux x86-64";
  return false;
#endif
}

/* MOE8_CPU_FEATURES: comma-separated feature names, each matched exactly
** (no substrings, no empty names).  avx512f, avx512bw, avx512vl and
** avx512dq each keep the AVX-512 base, which moe8 uses only as the four
** together.  A name that is not one of these is refused as MOE8_ISA
** refuses a bad value: a message on stderr listing the names, and the
** override ignored (false returned; the CPU's own features are used). */
static const char g_feature_list[] = "avx512f, avx512bw, avx512vl, avx512dq, avx512bf16, avx512vnni, avx512vbmi, amx";

static bool parse_features(const char *v, unsigned *keep) {
  static const struct { const char *name; unsigned bit; } names[] = {
    {"avx512f", F_AVX512}, {"avx512bw", F_AVX512}, {"avx512vl", F_AVX512}, {"avx512dq", F_AVX512},
    {"avx512bf16", F_BF16}, {"avx512vnni", F_VNNI}, {"avx512vbmi", F_VBMI}, {"amx", F_AMX_TILE | F_AMX_BF16 | F_AMX_INT8}};
  unsigned k = 0;
  for (const char *p = v;; p++) {
    const size_t n = strcspn(p, ",");
    size_t i = 0;
    while (i < sizeof names / sizeof names[0] && !(strlen(names[i].name) == n && strncmp(p, names[i].name, n) == 0)) i++;
    if (i == sizeof names / sizeof names[0]) {
      fprintf(stderr, "moe8: MOE8_CPU_FEATURES=%s: %s%.*s%s is not a feature name (comma-separated, each one of: %s); "
              "the override is ignored, the CPU's own features are used\n", v, n ? "'" : "", (int)(n > 64 ? 64 : n), p,
              n ? "'" : "an empty name", g_feature_list);
      return false;
    }
    k |= names[i].bit;
    p += n;
    if (!*p) break;
  }
  *keep = k;
  return true;
}

static void detect(void) {
  /* Parsed first, on any CPU, so a bad value is always reported. */
  const char *keep_env = getenv("MOE8_CPU_FEATURES");
  unsigned keep = 0;
  const bool keep_set = keep_env && *keep_env && parse_features(keep_env, &keep);
#if defined(MOE8_X86) && defined(MOE8_HAVE_AVX512)
  unsigned a, b, c, d;
  g_amx_reason = "the CPU has no AMX";
  if (!__get_cpuid(1, &a, &b, &c, &d) || !((c >> 27) & 1)) return;
  const uint64_t xcr0 = xgetbv0();
  /* XCR0: SSE(1), AVX(2), opmask(5), ZMM_Hi256(6), Hi16_ZMM(7). */
  if ((xcr0 & 0xE6) != 0xE6 || __get_cpuid_max(0, NULL) < 7) return;
  __cpuid_count(7, 0, a, b, c, d);
  const bool f = (b >> 16) & 1, dq = (b >> 17) & 1, bw = (b >> 30) & 1, vl = (b >> 31) & 1;
  if (!(f && dq && bw && vl)) return;
  unsigned fs = F_AVX512;
  { /* the vendor, a report like the others: "GenuineIntel" in EBX, EDX, ECX */
    unsigned v0, v1, v2, v3;
    if (__get_cpuid(0, &v0, &v1, &v2, &v3) && v1 == 0x756E6547u && v3 == 0x49656E69u && v2 == 0x6C65746Eu) fs |= MOE8__CPU_INTEL;
    /* MOE8_CPU_VENDOR=intel|amd picks that vendor's tuning (how far
    ** the decode kernels prefetch, the few-row FP8 blocking), so tests run
    ** both on any CPU; any other value is refused, the override ignored. */
    const char *ven = getenv("MOE8_CPU_VENDOR");
    if (ven && strcmp(ven, "intel") == 0) fs |= MOE8__CPU_INTEL;
    else if (ven && strcmp(ven, "amd") == 0) fs &= ~(unsigned)MOE8__CPU_INTEL;
    else if (ven) fprintf(stderr, "moe8: MOE8_CPU_VENDOR=%s is not intel or amd; ignored\n", ven);
  }
  if ((c >> 11) & 1) fs |= F_VNNI;
  if ((c >> 1) & 1) fs |= F_VBMI;
  const bool amx_cpu = ((d >> 24) & 1) && ((d >> 22) & 1) && ((d >> 25) & 1);
  const bool amx_os = ((xcr0 >> 17) & 3) == 3;
  unsigned a1, b1, c1, d1;
  __cpuid_count(7, 1, a1, b1, c1, d1);
  if ((a1 >> 5) & 1) fs |= F_BF16;
  /* MOE8_NO_BF16 / MOE8_NO_VBMI (set and not "0") hide one feature;
  ** MOE8_CPU_FEATURES keeps only those it names (read once). */
  if (env_on("MOE8_NO_BF16")) fs &= ~(unsigned)F_BF16;
  if (env_on("MOE8_NO_VBMI")) fs &= ~(unsigned)F_VBMI; /* set and not "0", as MOE8_NO_BF16 */
  /* The test override reaches the permission step on any CPU. */
  const char *perm = getenv("MOE8_AMX_PERM");
  const bool refuse = perm && strcmp(perm, "refuse") == 0;
  if (!amx_cpu && !refuse) g_amx_reason = "the CPU has no AMX (CPUID 7.0 EDX bits 22, 24, 25)";
  else if (!amx_os && !refuse) g_amx_reason = "the OS does not enable tile state (XCR0 bits 17-18)";
  else if (amx_permission(refuse)) { fs |= F_AMX_TILE | F_AMX_BF16 | F_AMX_INT8; g_amx_reason = NULL; }
  if (keep_set) {
    fs &= keep | MOE8__CPU_INTEL; /* the vendor is not a feature to hide */
    if (!(keep & F_AMX_TILE) && !g_amx_reason) g_amx_reason = "MOE8_CPU_FEATURES leaves AMX out";
  }
  g_features = fs;
#else
  (void)keep_set; (void)keep;
#endif
}


unsigned moe8__cpu_features(void) {
  pthread_once(&g_once, detect);
  return g_features;
}

bool moe8__cpu_has_vbmi(void) { return (moe8__cpu_features() & F_VBMI) != 0; }

const char *moe8__amx_unavailable(void) {
  pthread_once(&g_once, detect);
  return g_amx_reason;
}
