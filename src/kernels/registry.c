/*
** registry.c — the kernel tables: each family of kernels, the CPU
** features it needs (core/cpu.c reports them) and the init functions that
** fill its table over the reference one.  A family is supported when the
** build has it and its features are all present.  The active table is the
** best supported family that may be chosen by itself (not amx_emu), or
** the one MOE8_ISA names.  Built once, under pthread_once.
*/
#include "../core/internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


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
  {MOE8_ISA_AVX512, MOE8__CPU_AVX512, true, init_avx512_family},
  {MOE8_ISA_AVX512_BF16, MOE8__CPU_AVX512 | MOE8__CPU_BF16, true, init_avx512_family},
  {MOE8_ISA_AVX512_VNNI, MOE8__CPU_AVX512 | MOE8__CPU_VNNI, true, init_avx512_family},
  {MOE8_ISA_AMX_EMU, MOE8__CPU_AVX512 | MOE8__CPU_VNNI, false, init_amx_emu},
  {MOE8_ISA_AMX, MOE8__CPU_AVX512 | MOE8__CPU_VNNI | MOE8__CPU_AMX_TILE | MOE8__CPU_AMX_BF16 | MOE8__CPU_AMX_INT8, true, init_amx_hw},
#endif
  {MOE8_ISA_REF, 0, true, NULL},
};

static moe8__ktable   g_tables[MOE8_ISA_COUNT];
static bool           g_supported[MOE8_ISA_COUNT];
static moe8_isa       g_active;
/* Rows from which a task runs on the tiles: FP8 and bf16 from 4 (where
** the AVX-512 canonical kernel and the tiles cross), packed i8 from 6 (the
** VNNI kernel streams 4 rows 1.10x and 5 rows 1.07x faster than the tiles,
** 6 the same; docs/performance.md); MOE8_AMX_MIN_ROWS sets both. */
static int64_t        g_amx_min_rows = 4, g_amx_min_rows_i8 = 6;
static moe8_order     g_order_env = MOE8_ORDER_DEFAULT, g_order_set = MOE8_ORDER_DEFAULT;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void init_tables(void) {
  const unsigned features = moe8__cpu_features();
  const char *amx_reason = moe8__amx_unavailable();
  const char *mr = getenv("MOE8_AMX_MIN_ROWS");
  if (mr && *mr) {
    char *end;
    const long v = strtol(mr, &end, 10);
    if (*end == '\0' && v >= 1 && v <= 1 << 20) g_amx_min_rows = g_amx_min_rows_i8 = v;
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
    if ((fm->needs & features) != fm->needs) continue;
    moe8__ktable *t = &g_tables[fm->isa];
    moe8__kernels_init_ref(t);
    t->isa = fm->isa;
    t->has_bf16 = fm->isa > MOE8_ISA_AVX512 && (features & MOE8__CPU_BF16);
    t->has_vnni = (fm->needs & MOE8__CPU_VNNI) != 0;
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
              want == MOE8_ISA_AMX && amx_reason ? ": " : "", want == MOE8_ISA_AMX && amx_reason ? amx_reason : "",
              g_isa_names[g_active]);
    else
      g_active = (moe8_isa)want;
  }
  const char *dbg = getenv("MOE8_DEBUG");
  if (dbg && *dbg && strcmp(dbg, "0") != 0) {
    fprintf(stderr, "moe8: kernel table %s%s\n", g_isa_names[g_active],
            g_active == MOE8_ISA_AVX512_VNNI && !g_tables[g_active].has_bf16
                ? " (without vdpbf16ps: the CPU lacks AVX512_BF16 or MOE8_NO_BF16 is set; FP8 and bf16 run on the f32 path)" : "");
    if (amx_reason) fprintf(stderr, "moe8: AMX not used: %s\n", amx_reason);
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
                      g_isa_names[isa], isa == MOE8_ISA_AMX && moe8__amx_unavailable() ? ": " : "",
                      isa == MOE8_ISA_AMX && moe8__amx_unavailable() ? moe8__amx_unavailable() : "");
  g_active = isa;
  return MOE8_OK;
}

const moe8__ktable *moe8__kernels(void) {
  pthread_once(&g_once, init_tables);
  return &g_tables[g_active];
}

const moe8__ktable *moe8__kernels_for(moe8_isa isa) {
  pthread_once(&g_once, init_tables);
  if ((unsigned)isa >= MOE8_ISA_COUNT || !g_supported[isa]) return NULL;
  return &g_tables[isa];
}

int64_t moe8__amx_min_rows(void) {
  pthread_once(&g_once, init_tables);
  return g_amx_min_rows;
}
int64_t moe8__amx_min_rows_i8(void) {
  pthread_once(&g_once, init_tables);
  return g_amx_min_rows_i8;
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
