/*
 * llm3d command-line tool: one entry point per command, `int l3d_cli_<command>(argc, argv)`.
 * main() dispatches on the first argument and passes the rest with argv[0] = the command's name;
 * each command lists its flags in tables read by the one parser (l3d_flags_parse, below; the run
 * spec's flags are shared: l3d_cli_spec_groups), prints errors as "llm3d <command>: <message>"
 * on stderr and returns the process exit status: 0 on success, 1 on failure, 2 on a usage error.
 */
#ifndef LLM3D_CLI_H
#define LLM3D_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "llm3d/core.h"
#include "llm3d/model.h"

/* Every form --tokenizer SPEC takes (l3d_tokenizer_open), for the --help of prepare, tokenizer,
 * generate and inspect (l3d_flags_help wraps it). */
#define L3D_TOKENIZER_SPEC_HELP                                                                    \
    "bytes: one token per byte value (vocabulary 256). gpt2, cl100k_base, o200k_base, llama3: "   \
    "the named vocabularies `bash scripts/setup.sh --tokenizers` installs. A directory holding "  \
    "tokenizer.json (Hugging Face's byte-level BPE, as GPT-2, Llama 3 and Qwen2 write it) or "    \
    "encoder.json + vocab.bpe (GPT-2's files, as llm3d tokenizer train writes them). A .json "    \
    "file: a tokenizer.json. A tiktoken rank file (cl100k_base, o200k_base or Llama 3's "          \
    "tokenizer.model). llm.c's tokenizer file (gpt2_tokenizer.bin: decoding only)"

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
/* llm3d plan --svg (src/cli/plan_svg.c): the layouts the search evaluated (l3d_plan_svg_keep, the
 * search's callback), drawn as step time against memory per device, coloured by one of
 * l3d_plan_svg_dims; --published: predicted against published % of peak. 0, or 1 after one line. */
struct l3d_plan_result;
struct l3d_profile;
#define L3D_PLAN_SVG_NDIMS 5
extern const char *const l3d_plan_svg_dims[L3D_PLAN_SVG_NDIMS]; /* tp pp dp zero recompute */
struct l3d_plan_svg {
    struct l3d_plan_result *r;
    int64_t n, cap;
};
void l3d_plan_svg_keep(void *ctx, const struct l3d_plan_result *r);
int l3d_plan_svg_write(const char *path, const struct l3d_plan_svg *all,
                       const struct l3d_plan_result *best, const struct l3d_profile *prof,
                       int dim, const char *title);
int l3d_plan_svg_published(const char *path, int n, const char *const *names,
                           const double *published, const double *pred, const double *pred_cal);
/* llm3d compare RUN REFERENCE [--rtol R] [--loss-rtol R] [--weights-rtol R] [--verbose]
 * (src/cli/compare.c): exit status 0 SAME, 1 DIFFERENT, 2 nothing compared */
int l3d_cli_compare(int argc, char **argv);
/* llm3d convert CHECKPOINT OUT.bin [--precision fp32|bf16] (src/cli/convert.c) */
int l3d_cli_convert(int argc, char **argv);
/* llm3d inspect PATH [--tokenizer SPEC] [--json] (src/cli/inspect.c) */
int l3d_cli_inspect(int argc, char **argv);
/* llm3d plot RUN... | --trace FILE | --xy FILE, --out FILE.svg (src/cli/plot.c); --xy's
 * reader (src/cli/plot_xy.c) */
int l3d_cli_plot(int argc, char **argv);
int l3d_cli_plot_xy(const char *path, const char *out);
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
/* One of n names: its index into *out, or 0 after "llm3d <cmd>: --<flag> '<val>': choose
 * <choices>". */
int l3d_arg_choice(const char *cmd, const char *flag, const char *val, const char *const *names,
                   int n, int *out, const char *choices);
/* --save-dtype: fp32, bf16 or fp16, the types a Hugging Face folder is written in. */
int l3d_arg_save_dtype(const char *cmd, const char *val, enum l3d_dtype *out);
/* --precision of a command that keeps only the parameter type (generate, convert): fp32, bf16 or
 * fp16 (l3d_precision_param_parse), or 0 after "llm3d <cmd>: <its message>". */
int l3d_arg_precision(const char *cmd, const char *val, enum l3d_dtype *out);

/* --doc-token (prepare, generate): the token every document starts with. AUTO, the default: the
 * tokenizer's begin-of-text where it has one (Llama 3's <|begin_of_text|>, which Hugging Face's
 * Llama 3 and llm.c's Llama 3 data put first), else its end-of-text (GPT-2's <|endoftext|>, llm.c's
 * GPT-2 data). */
enum l3d_doc_token { L3D_DOC_AUTO, L3D_DOC_EOT, L3D_DOC_BOT };
int l3d_arg_doc_token(const char *cmd, const char *val, enum l3d_doc_token *out);
struct l3d_tokenizer;
/* The token id of mode for tok (named spec in messages); -1 when the tokenizer has none (eot or
 * auto), or -2 after one line when bot was asked of a tokenizer without one. */
int l3d_doc_token_id(const char *cmd, const struct l3d_tokenizer *tok, const char *spec,
                     enum l3d_doc_token mode);

/* A command's failure: "llm3d WHAT: <the last error's message>" on stderr (what: the command, and
 * what it was doing if that helps: "generate: the prompt"); 1, the status to return. */
int l3d_cli_failed(const char *what);

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

/* Flag tables (src/cli/flags.c): each command lists its flags as groups, each group a table and
 * the handler that sets them; one parser (getopt_long) and one --help writer serve them all. */
struct l3d_flag {
    const char *name; /* the long name, without "--" */
    const char *arg;  /* the value's name in --help ("N", "MODE"); NULL: a switch */
    int id;           /* the group's handler's key */
    const char *help; /* --help text, '\n' between lines; NULL: not listed (a retired spelling
                       * whose handler names the new one) */
};
struct l3d_flag_group {
    const char *title;            /* --help section heading, or NULL */
    const struct l3d_flag *flags; /* ends with {NULL} */
    /* sets flag id from val (NULL for a switch): 1, or 0 after printing one line "llm3d CMD:
     * --FLAG VAL: why" */
    int (*set)(void *ctx, const char *cmd, int id, const char *val);
    void *ctx;
};
/* Parses argv[1..] with the groups' flags. --help prints usage() (may be NULL) and every group's
 * flags, and returns 0; an unknown flag or a bad value returns 2 after one line; -1 when every
 * flag was read. first_arg NULL: positional arguments are an error; else *first_arg is the first. */
int l3d_flags_parse(const char *cmd, int argc, char **argv, const struct l3d_flag_group *g,
                    int ng, void (*usage)(FILE *f), int *first_arg);
/* l3d_flags_parse of one group for a command that takes exactly nargs positional arguments: -1,
 * and *first_arg the first of them, when they were given; else 0 after --help, or 2 after one
 * line (a bad flag, or "llm3d CMD: give WHAT (see --help)" for another count of arguments). */
int l3d_flags_parse_n(const char *cmd, int argc, char **argv, const struct l3d_flag_group *g,
                      void (*usage)(FILE *f), int nargs, const char *what, int *first_arg);
void l3d_flags_help(FILE *f, const struct l3d_flag_group *g, int ng);
/* The flags l3d_flags_parse_given applied, by their position over the groups' tables (group 0's
 * first, as getopt numbers them): the value (NULL: a switch) and when it was last applied (0: not
 * given), a --config file's before the command line's. */
#define L3D_FLAGS_MAX 160
struct l3d_flags_given {
    const char *val[L3D_FLAGS_MAX];
    int when[L3D_FLAGS_MAX];
    int n; /* applications so far */
};
/* l3d_flags_parse, saying which flags were given into *given (zeroed first). */
int l3d_flags_parse_given(const char *cmd, int argc, char **argv, const struct l3d_flag_group *g,
                          int ng, void (*usage)(FILE *f), int *first_arg,
                          struct l3d_flags_given *given);

/* --config FILE (src/cli/config.c), which every command's parser takes: a YAML mapping of the
 * flags (keys: their long names), in sections named by their --help headings or at the top level.
 * l3d_flags_parse applies it before the command line's flags. -1, or 2 after one line naming the
 * file and line (an unknown key with the nearest flag, a key in another section, a bad value in
 * the flag's own words, a key given twice, YAML's syntax errors, a document not a mapping). */
int l3d_config_apply(const char *cmd, const char *path, const struct l3d_flag_group *g, int ng,
                     struct l3d_flags_given *given);
/* The section of group i's flags: the first word of its --help heading ("model", "layout"), or
 * for an untitled group that of the one before (--help lists its flags under that heading); NULL
 * (the top level) for an untitled first group. Written into buf. */
const char *l3d_config_section(const struct l3d_flag_group *g, int i, char *buf, size_t cap);
/* --config's --help lines, naming the groups' sections. */
void l3d_config_help(FILE *f, const struct l3d_flag_group *g, int ng);
/* The flags given as a config file that --config reads back to the same flags: every flag of the
 * groups in its section, those not given commented out (a malloc'd string: free it). */
char *l3d_config_yaml(const char *cmd, const struct l3d_flag_group *g, int ng,
                      const struct l3d_flags_given *given);
/* The error for a positional argument a command does not take (one line on stderr). */
void l3d_flags_unexpected(const char *cmd, const char *arg);

/* The run spec's flags (model, layout and batch, precision): the same names, values and checks
 * in train, bench and plan. */
struct l3d_run_spec;
struct l3d_model_spec;
struct l3d_spec_ctx;
struct l3d_cli_spec {
    struct l3d_run_spec *spec; /* where the values go; holds the command's defaults */
    const char *preset;        /* --model */
    int L, C, NH, V, maxT, ffn; /* explicit sizes; 0: not given */
    int arch, NKV;             /* --arch (-1: not given), --kv-heads (0: not given) */
    int head_dim;              /* --head-dim (0: not given) */
    double rope_theta;         /* 0: not given */
    float norm_eps;            /* 0: not given */
    struct l3d_moe_spec moe;   /* the --moe-* flags' values (each applied when given) */
    unsigned long long given;  /* a bit for each flag given */
};
void l3d_cli_spec_init(struct l3d_cli_spec *cs, struct l3d_run_spec *spec);
/* The three groups (model, layout, precision) into out[0..2]; returns 3. */
int l3d_cli_spec_groups(struct l3d_cli_spec *cs, struct l3d_flag_group *out);
/* Whether --flag (a spec flag's name) was given. */
bool l3d_cli_spec_given(const struct l3d_cli_spec *cs, const char *flag);
/* The model: the --model preset (when given), then the explicit sizes, checked. -1 or the exit
 * status after one line. */
int l3d_cli_spec_model(const char *cmd, struct l3d_cli_spec *cs);
/* The architecture flags given (--arch, --kv-heads, --head-dim, --ffn, --rope-theta, --norm-eps)
 * applied to m
 * (unfinished: l3d_gpt_config_finish follows). */
void l3d_cli_spec_arch(const struct l3d_cli_spec *cs, struct l3d_model_spec *m);
/* Rules between the flags themselves (--grad-accum with --global-batch) and what one implies
 * (--pp-virtual > 1: the interleaved schedule unless --pp-schedule says otherwise). -1 or 2. */
int l3d_cli_spec_flags_done(const char *cmd, struct l3d_cli_spec *cs);
/* The planner's model (llm3d plan, and bench --calibrate --model): the --model preset (d12
 * without one), then the sizes given; its maxT is the sequence planned: --seq-len, else
 * --context, else the preset's context. */
l3d_status l3d_cli_plan_model(const struct l3d_cli_spec *cs, struct l3d_model_spec *m);
/* l3d_spec_check: -1 when the spec holds, else 2 after one line holding every violated rule
 * ("; " between them). */
int l3d_cli_spec_report(const char *cmd, const struct l3d_run_spec *s,
                        const struct l3d_spec_ctx *ctx);

#endif
