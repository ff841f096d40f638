/*
 * llm3d command-line tool: one entry point per command, `int l3d_cli_<command>(argc, argv)`.
 * main() dispatches on the first argument and passes the rest with argv[0] = the command's name;
 * each command parses its own flags (getopt_long), prints errors as "llm3d <command>: <message>"
 * on stderr and returns the process exit status: 0 on success, 1 on failure, 2 on a usage error.
 */
#ifndef LLM3D_CLI_H
#define LLM3D_CLI_H

#include <stdbool.h>
#include <stdint.h>

/* llm3d prepare --tokenizer SPEC --out DIR [--val-fraction F] [--shard-tokens N]
 * [--doc-separator LINE] FILE... (src/cli/prepare.c) */
int l3d_cli_prepare(int argc, char **argv);
/* llm3d tokenizer train|encode|decode ... (src/cli/tokenizer.c) */
int l3d_cli_tokenizer(int argc, char **argv);

/* llm3d train [flags] (src/cli/train.c) */
int l3d_cli_train(int argc, char **argv);
struct l3d_train_config;
/* Parses the model, data and optimizer flags shared by train and bench into tc (which holds the
 * defaults), and --backend into *backend (left as it is when not given). Returns -1 on success,
 * else the exit status to return (0 after --help). */
int l3d_cli_train_flags(const char *cmd, int argc, char **argv, struct l3d_train_config *tc,
                        const char **backend);
/* llm3d bench [flags] (src/cli/bench.c) */
int l3d_cli_bench(int argc, char **argv);
/* llm3d plan [flags] (src/cli/plan.c) */
int l3d_cli_plan(int argc, char **argv);
/* llm3d bench --calibrate [--out FILE] [--quick]: this machine's system profile, under mpiexec
 * (src/cli/calibrate.c); l3d_cli_bench passes every argument when one is --calibrate */
int l3d_cli_calibrate(int argc, char **argv);
/* llm3d compare RUN REFERENCE [--rtol R] [--loss-rtol R] [--weights-rtol R] [--verbose]
 * (src/cli/compare.c): exit status 0 SAME, 1 DIFFERENT, 2 nothing compared */
int l3d_cli_compare(int argc, char **argv);
/* llm3d convert CHECKPOINT OUT.bin (src/cli/convert.c) */
int l3d_cli_convert(int argc, char **argv);
/* llm3d inspect PATH [--tokenizer SPEC] [--json] (src/cli/inspect.c) */
int l3d_cli_inspect(int argc, char **argv);
/* llm3d generate --checkpoint FILE [flags] (src/cli/generate.c) */
int l3d_cli_generate(int argc, char **argv);

/* Flag values (src/cli/args.c): parse `val` of `flag` for command `cmd` within [lo, hi]; on a bad
 * value print "llm3d <cmd>: --<flag> <val>: <why>" and return 0. */
int l3d_arg_int(const char *cmd, const char *flag, const char *val, long lo, long hi, int *out);
int l3d_arg_float(const char *cmd, const char *flag, const char *val, double lo, double hi,
                  float *out);
int l3d_arg_double(const char *cmd, const char *flag, const char *val, double lo, double hi,
                   double *out);
int l3d_arg_u64(const char *cmd, const char *flag, const char *val, uint64_t *out);

/* The rank an MPI launcher gave this process, from its environment (Open MPI, MPICH's Hydra,
 * PMIx, Slurm), 0 when started alone. Flags are parsed before MPI starts, by every rank alike:
 * between l3d_cli_mute_begin and _end the ranks but 0 print nothing (stdout and stderr go to
 * /dev/null), so that a flag error is said once. */
int l3d_cli_launcher_rank(void);
/* Whether the launcher's environment (Open MPI, MPICH's Hydra, Slurm) puts this job's ranks on
 * more than one node; false where it says nothing */
bool l3d_cli_launcher_spans_nodes(void);
struct l3d_cli_mute {
    int out, err; /* the saved descriptors, -1 when not muted */
};
void l3d_cli_mute_begin(struct l3d_cli_mute *m);
void l3d_cli_mute_end(struct l3d_cli_mute *m);

#endif
