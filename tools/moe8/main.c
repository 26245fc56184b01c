/*
** main.c — the moe8 command: dispatch to one subcommand per file.
**
** Exit codes (all subcommands): 0 success, 1 failure (bad input file,
** non-finite data, a failed check), 2 usage error.
*/
#include "cli.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static const struct {
  const char *name, *summary;
  int (*run)(int, char **);
} g_cmds[] = {
  {"demo",  "the whole path: quantization table, init -> quantize -> run -> train -> EP check", cmd_demo},
  {"init",     "a random MoE model in Hugging Face naming from a config.json", cmd_init},
  {"quantize", "pre-quantize a model's expert weights (moe8 or DeepSeek FP8 format)", cmd_quantize},
  {"run",      "run one MoE layer of a model on tokens from a .npy file", cmd_run},
  {"info",     "tensors, dtypes, shapes, architecture and quantization of a model", cmd_info},
  {"check",    "under mpirun: expert parallelism gives the single-process bytes", cmd_check},
  {"train", "a student layer learns a random teacher (f32 or FP8 quantization-aware)", cmd_train},
  {"bench", "benchmarks against peers run in the same process: quant, gmm, layer, ep (moe8 bench --help)", cmd_bench},
};

static void usage(FILE *f) {
  fprintf(f,
          "moe8 %s — a quantized Mixture-of-Experts runtime (FP8 E4M3/E5M2, INT8)\n\n"
          "usage: moe8 <command> [options]     moe8 <command> --help\n\ncommands:\n",
          MOE8_VERSION_STRING);
  for (size_t i = 0; i < sizeof g_cmds / sizeof g_cmds[0]; i++)
    fprintf(f, "  %-9s %s\n", g_cmds[i].name, g_cmds[i].summary);
  fprintf(f,
          "\nenvironment: MOE8_ISA=ref|avx512|avx512_bf16|avx512_vnni|amx|amx_emu forces a kernel table,\n"
          "             MOE8_ORDER=canonical|native the summation order (docs/determinism.md),\n"
          "             MOE8_DEBUG=1 prints the choice, OMP_NUM_THREADS sets threads,\n"
          "             OMP_WAIT_POLICY=active|passive how idle threads wait (default passive,\n"
          "             except in the bench).\n"
          "--threads N (any command) sets the threads for this run.\n"
          "moe8 --version prints the version.  exit codes:  0 success, 1 failure, 2 usage error.\n");
}

int cli_quiet = 0;

int cli_report(moe8_status st, const char *what) {
  fprintf(stderr, "moe8: %s: %s: %s\n", what, moe8_status_str(st), moe8_last_error());
  return EXIT_FAIL;
}

double cli_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double cli_torch_min_ms(const char *cmd) {
  char line[512];
  FILE *p = popen(cmd, "r");
  if (!p) return -1;
  double ms = -1;
  while (fgets(line, sizeof line, p)) {
    const char *m = strstr(line, "\"min_ms\": ");
    if (m) ms = strtod(m + 10, NULL);
  }
  return pclose(p) == 0 ? ms : -1;
}

int cli_parse_i64(const char *s, int64_t *v) {
  char *end;
  errno = 0;
  const long long x = strtoll(s, &end, 10);
  if (errno || *end || end == s || x <= 0) return 0;
  *v = x;
  return 1;
}

int cli_same_file(const char *a, const char *b) {
  struct stat sa, sb;
  return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

int cli_is_help(const char *arg) { return strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0; }

/* OpenMP's threads wait for work by spinning unless OMP_WAIT_POLICY says
** passive.  On a host whose cores are busy with other processes a spinning
** thread takes the time slice its team's slowest member needs: training a
** small layer on two threads took 2.6 s instead of 0.06 s next to two busy
** processes (docs/performance.md, "Threads on a busy host").  The runtime
** reads the policy once, before main, so the command sets passive and
** starts itself again when the environment does not choose; an explicit
** OMP_WAIT_POLICY (active for the last few per cent on an idle machine) is
** kept.  The bench keeps OpenMP's default, as its peers run with it. */
static void wait_policy(int argc, char **argv) {
  if (getenv("OMP_WAIT_POLICY") || (argc > 1 && strcmp(argv[1], "bench") == 0)) return;
  if (setenv("OMP_WAIT_POLICY", "passive", 1) != 0) return;
  execv("/proc/self/exe", argv); /* on failure: go on with the default */
}

int main(int argc, char **argv) {
  wait_policy(argc, argv);
  /* --threads N anywhere: the OpenMP threads of this run (taken out of argv). */
  for (int i = 1; i < argc; i++)
    if (strcmp(argv[i], "--threads") == 0) {
      int64_t n = 0;
      if (i + 1 >= argc || !cli_parse_i64(argv[i + 1], &n) || n > 4096) {
        fprintf(stderr, "moe8: --threads takes a thread count in [1, 4096]\n");
        return EXIT_USAGE;
      }
      moe8_set_num_threads((int)n);
      for (int j = i; j + 2 <= argc; j++) argv[j] = argv[j + 2];
      argc -= 2;
      i--;
    }
  if (argc < 2) { usage(stderr); return EXIT_USAGE; }
  if (cli_is_help(argv[1]) || strcmp(argv[1], "help") == 0) { usage(stdout); return EXIT_OK; }
  if (strcmp(argv[1], "--version") == 0) { printf("moe8 %s\n", MOE8_VERSION_STRING); return EXIT_OK; }
  for (size_t i = 0; i < sizeof g_cmds / sizeof g_cmds[0]; i++)
    if (strcmp(argv[1], g_cmds[i].name) == 0) return g_cmds[i].run(argc - 1, argv + 1);
  fprintf(stderr, "moe8: unknown command '%s'\n\n", argv[1]);
  usage(stderr);
  return EXIT_USAGE;
}
