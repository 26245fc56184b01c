/*
** cpu.c — the CPU's feature set and the kernel-table registry.
**
** detect() reports what the CPU and the OS give, feature by feature
** (AVX-512 F/BW/VL/DQ, BF16, VNNI, VBMI; AMX-TILE/BF16/INT8 with XCR0 bits
** 17-18 and the kernel's tile permission), and nothing else.  The registry
** lists each family with the features it needs and the init functions
** that fill its table over the reference one; a family is supported when
** the build has it and its features are all present.  The active table is
** the best supported family that may be chosen by itself (not amx_emu),
** or the one MOE8_ISA names.  Everything runs once, under pthread_once.
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
  F_AVX512 = 1 << 0,   /* F, BW, VL, DQ and the OS's ZMM state */
  F_BF16 = 1 << 1,
  F_VNNI = 1 << 2,
  F_VBMI = 1 << 3,
  F_AMX_TILE = 1 << 4, /* with XCR0 17-18 and the tile permission */
  F_AMX_BF16 = 1 << 5,
  F_AMX_INT8 = 1 << 6,
};

static const char *const g_isa_names[MOE8_ISA_COUNT] = {
  "ref", "avx512", "avx512_bf16", "avx512_vnni", "amx_emu", "amx"
};

/* The registry: a family, the features it needs, whether it may be chosen
** without being asked for, and its init. */
typedef struct family {
  moe8_isa isa;
  unsigned needs;
  bool     auto_pick;
  void   (*init)(moe8__ktable *k);
} family;

#ifdef MOE8_HAVE_AVX512
static void init_avx512_family(moe8__ktable *k) {
  moe8__kernels_init_avx512(k);
  moe8__gmm_init_avx512(k, k->isa, k->has_bf16);
  moe8__act_init_avx512(k);
}
static void init_amx_emu(moe8__ktable *k) { init_avx512_family(k); moe8__gmm_init_amx_emu(k); }
static void init_amx_hw(moe8__ktable *k) { init_avx512_family(k); moe8__gmm_init_amx_hw(k); }
#endif

static const family g_families[] = {
#ifdef MOE8_HAVE_AVX512
  {MOE8_ISA_AVX512, F_AVX512, true, init_avx512_family},
  {MOE8_ISA_AVX512_BF16, F_AVX512 | F_BF16, true, init_avx512_family},
  {MOE8_ISA_AVX512_VNNI, F_AVX512 | F_VNNI, true, init_avx512_family},
  {MOE8_ISA_AMX_EMU, F_AVX512 | F_VNNI, false, init_amx_emu},
  {MOE8_ISA_AMX, F_AVX512 | F_VNNI | F_AMX_TILE | F_AMX_BF16 | F_AMX_INT8, true, init_amx_hw},
#endif
  {MOE8_ISA_REF, 0, true, NULL},
};

static moe8__ktable   g_tables[MOE8_ISA_COUNT];
static bool           g_supported[MOE8_ISA_COUNT];
static moe8_isa       g_active;
static unsigned       g_features;
static const char    *g_amx_reason = "the build has no AVX-512 kernels";
static int64_t        g_amx_min_rows = 4;
static moe8_order     g_order_env = MOE8_ORDER_DEFAULT, g_order_set = MOE8_ORDER_DEFAULT;
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
    fs &= keep;
    if (!(keep & F_AMX_TILE) && !g_amx_reason) g_amx_reason = "MOE8_CPU_FEATURES leaves AMX out";
  }
  g_features = fs;
#else
  (void)keep_set; (void)keep;
#endif
}

static void init_tables(void) {
  detect();
  const char *mr = getenv("MOE8_AMX_MIN_ROWS");
  if (mr && *mr) {
    char *end;
    const long v = strtol(mr, &end, 10);
    if (*end == '\0' && v >= 1 && v <= 1 << 20) g_amx_min_rows = v;
    else fprintf(stderr, "moe8: MOE8_AMX_MIN_ROWS=%s is not a row count in [1, 2^20]; using %lld\n", mr, (long long)g_amx_min_rows);
  }
  const char *ord = getenv("MOE8_ORDER");
  if (ord && *ord) {
    if (strcmp(ord, "canonical") == 0) g_order_env = MOE8_ORDER_CANONICAL;
    else if (strcmp(ord, "native") == 0) g_order_env = MOE8_ORDER_NATIVE;
    else fprintf(stderr, "moe8: MOE8_ORDER=%s is not an order (canonical, native); using the CPU's default\n", ord);
  }
  int best = -1;
  for (size_t i = 0; i < sizeof g_families / sizeof g_families[0]; i++) {
    const family *fm = &g_families[i];
    if ((fm->needs & g_features) != fm->needs) continue;
    moe8__ktable *t = &g_tables[fm->isa];
    moe8__kernels_init_ref(t);
    t->isa = fm->isa;
    t->has_bf16 = fm->isa > MOE8_ISA_AVX512 && (g_features & F_BF16);
    t->has_vnni = (fm->needs & F_VNNI) != 0;
    if (fm->init) fm->init(t);
    g_supported[fm->isa] = true;
    if (fm->auto_pick && (best < 0 || fm->isa > (moe8_isa)best)) best = fm->isa;
  }
  g_active = best < 0 ? MOE8_ISA_REF : (moe8_isa)best;

  const char *env = getenv("MOE8_ISA");
  if (env && *env) {
    int want = -1;
    for (int i = 0; i < MOE8_ISA_COUNT; i++)
      if (strcmp(env, g_isa_names[i]) == 0) want = i;
    if (want < 0)
      fprintf(stderr, "moe8: MOE8_ISA=%s is not an ISA (ref, avx512, avx512_bf16, avx512_vnni, amx_emu, amx); using %s\n",
              env, g_isa_names[g_active]);
    else if (!g_supported[want])
      fprintf(stderr, "moe8: MOE8_ISA=%s is not supported by this build or CPU%s%s; using %s\n", env,
              want == MOE8_ISA_AMX && g_amx_reason ? ": " : "", want == MOE8_ISA_AMX && g_amx_reason ? g_amx_reason : "",
              g_isa_names[g_active]);
    else
      g_active = (moe8_isa)want;
  }
  if (env_on("MOE8_DEBUG")) {
    fprintf(stderr, "moe8: kernel table %s%s\n", g_isa_names[g_active],
            g_active == MOE8_ISA_AVX512_VNNI && !g_tables[g_active].has_bf16
                ? " (without vdpbf16ps: the CPU lacks AVX512_BF16 or MOE8_NO_BF16 is set; FP8 and bf16 run on the f32 path)" : "");
    if (g_amx_reason) fprintf(stderr, "moe8: AMX not used: %s\n", g_amx_reason);
  }
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
    return moe8__fail(MOE8_ERR_UNSUPPORTED, "moe8_isa_set: %s is not supported by this build or CPU%s%s",
                      g_isa_names[isa], isa == MOE8_ISA_AMX && g_amx_reason ? ": " : "",
                      isa == MOE8_ISA_AMX && g_amx_reason ? g_amx_reason : "");
  g_active = isa;
  return MOE8_OK;
}

const moe8__ktable *moe8__kernels(void) {
  pthread_once(&g_once, init_tables);
  return &g_tables[g_active];
}

bool moe8__cpu_has_vbmi(void) {
  pthread_once(&g_once, init_tables);
  return (g_features & F_VBMI) != 0;
}

const moe8__ktable *moe8__kernels_for(moe8_isa isa) {
  pthread_once(&g_once, init_tables);
  if ((unsigned)isa >= MOE8_ISA_COUNT || !g_supported[isa]) return NULL;
  return &g_tables[isa];
}

const char *moe8__amx_unavailable(void) {
  pthread_once(&g_once, init_tables);
  return g_amx_reason;
}

int64_t moe8__amx_min_rows(void) {
  pthread_once(&g_once, init_tables);
  return g_amx_min_rows;
}

/* ---- the summation order --------------------------------------------------- */
const char *moe8_order_name(moe8_order order) {
  switch (order) {
    case MOE8_ORDER_DEFAULT: return "default";
    case MOE8_ORDER_CANONICAL: return "canonical";
    case MOE8_ORDER_NATIVE: return "native";
    default: return "unknown";
  }
}

moe8_order moe8_order_effective(moe8_order order) {
  pthread_once(&g_once, init_tables);
  if (g_tables[g_active].has_tiles) return MOE8_ORDER_CANONICAL;
  if (order == MOE8_ORDER_CANONICAL || order == MOE8_ORDER_NATIVE) return order;
  if (g_order_set != MOE8_ORDER_DEFAULT) return g_order_set;
  if (g_order_env != MOE8_ORDER_DEFAULT) return g_order_env;
  return MOE8_ORDER_NATIVE;
}

moe8_status moe8_order_set(moe8_order order) {
  pthread_once(&g_once, init_tables);
  if (order != MOE8_ORDER_DEFAULT && order != MOE8_ORDER_CANONICAL && order != MOE8_ORDER_NATIVE)
    return moe8__fail(MOE8_ERR_INVALID_ARG, "moe8_order_set: %d is not an order", (int)order);
  g_order_set = order;
  return MOE8_OK;
}
