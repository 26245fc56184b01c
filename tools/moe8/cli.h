/*
** cli.h — shared pieces of the moe8 command: each subcommand is one file
** with one entry point, int cmd_NAME(int argc, char **argv), returning the
** process exit code (0 ok, 1 failure, 2 usage error).
*/
#ifndef MOE8_CLI_H
#define MOE8_CLI_H

#include "moe8.h"

#include <stdio.h>

enum { EXIT_OK = 0, EXIT_FAIL = 1, EXIT_USAGE = 2 };

/* Set by 'moe8 demo': subcommands skip their per-tensor progress lines. */
extern int cli_quiet;

int cmd_demo(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_train(int argc, char **argv);
int cmd_init(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_check(int argc, char **argv);

/* MPI glue (mpi_glue.c): under mpirun with an MPI build, MPI_COMM_WORLD;
** else the single-process communicator. */
int         cli_under_mpirun(void);
moe8_status cli_comm_open(moe8_comm **out);
void        cli_comm_close(moe8_comm *c);
double      cli_allreduce_max(moe8_comm *c, double v);
void        cli_allreduce_sum(moe8_comm *c, double *v, int n);
moe8_status cli_gather_rows(moe8_comm *c, const float *send, int64_t rows, int64_t row_floats, float *recv);
double      cli_time_allgather(moe8_comm *c, const void *send, size_t n, void *recv, int reps);

struct cJSON;
/* Pretty-prints JSON to path through a temporary file and a rename. */
int cli_write_json(const char *path, struct cJSON *root);
/* Creates a directory (an existing one is fine). */
int cli_mkdir(const char *dir);
/* Parses a positive integer; 0 when it is not one. */
int cli_parse_i64(const char *s, int64_t *v);

/* Prints "moe8: <status>: <detail>" on stderr and returns EXIT_FAIL. */
int cli_report(moe8_status st, const char *what);

/* Wall-clock seconds from a monotonic clock. */
double cli_now(void);

/* Runs cmd (bench/torch_moe.py) and returns the "min_ms" of its JSON line,
** or -1 when it fails or prints none. */
double cli_torch_min_ms(const char *cmd);

/* True when a and b name the same existing file (device and inode). */
int cli_same_file(const char *a, const char *b);

/* True when argv[i] is -h or --help. */
int cli_is_help(const char *arg);

#endif
