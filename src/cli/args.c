/* Parsing of numeric flag values with one clear message per bad value (src/cli/cli.h). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <fcntl.h>
#include <unistd.h>

#include "cli/cli.h"
#include "llm3d/spec.h"
#include "llm3d/tokenizer.h"

int l3d_arg_int(const char *cmd, const char *flag, const char *val, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(val, &end, 10);
    if (end == val || *end != '\0' || errno) {
        fprintf(stderr, "llm3d %s: --%s '%s' is not a whole number\n", cmd, flag, val);
        return 0;
    }
    if (v < lo || v > hi) {
        fprintf(stderr, "llm3d %s: --%s %ld is out of range: give a value from %ld to %ld\n", cmd,
                flag, v, lo, hi);
        return 0;
    }
    *out = (int)v;
    return 1;
}

int l3d_arg_float(const char *cmd, const char *flag, const char *val, double lo, double hi,
                  float *out) {
    double v;
    if (!l3d_arg_double(cmd, flag, val, lo, hi, &v)) return 0;
    *out = (float)v;
    return 1;
}

int l3d_arg_double(const char *cmd, const char *flag, const char *val, double lo, double hi,
                   double *out) {
    char *end;
    errno = 0;
    double v = strtod(val, &end);
    if (end == val || *end != '\0' || errno) {
        fprintf(stderr, "llm3d %s: --%s '%s' is not a number\n", cmd, flag, val);
        return 0;
    }
    if (!(v >= lo && v <= hi)) { /* the value as given: %g made 2^40 + 1 of 2^40 */
        fprintf(stderr, "llm3d %s: --%s %s is out of range: give a value from %.15g to %.15g\n",
                cmd, flag, val, lo, hi);
        return 0;
    }
    *out = v;
    return 1;
}

int l3d_arg_u64(const char *cmd, const char *flag, const char *val, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(val, &end, 10);
    if (end == val || *end != '\0' || errno || val[0] == '-') {
        fprintf(stderr, "llm3d %s: --%s '%s' is not a non-negative whole number\n", cmd, flag, val);
        return 0;
    }
    *out = (uint64_t)v;
    return 1;
}

int l3d_cli_failed(const char *what) {
    fprintf(stderr, "llm3d %s: %s\n", what, l3d_error_message());
    return 1;
}

int l3d_cli_launcher_rank(void) {
    /* Open MPI (mpiexec, and under PMIx), MPICH's Hydra, PMIx launchers, Slurm's srun */
    static const char *const vars[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK",
                                       "SLURM_PROCID"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v) return atoi(v);
    }
    return 0;
}

bool l3d_cli_launcher_spans_nodes(void) {
    /* Open MPI: ranks on this node below the job's; MPICH's Hydra the same; Slurm: the step's
     * nodes (srun), else the allocation's */
    static const char *const pairs[][2] = {{"OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_SIZE"},
                                           {"MPI_LOCALNRANKS", "PMI_SIZE"}};
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        const char *local = getenv(pairs[i][0]), *all = getenv(pairs[i][1]);
        if (local && all && atoi(local) >= 1 && atoi(local) < atoi(all)) return true;
    }
    const char *nodes = getenv("SLURM_STEP_NUM_NODES");
    if (!nodes) nodes = getenv("SLURM_NNODES");
    return nodes && atoi(nodes) > 1;
}

void l3d_cli_mute_begin(struct l3d_cli_mute *m) {
    m->out = m->err = -1;
    if (l3d_cli_launcher_rank() == 0) return;
    int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (null < 0) return;
    fflush(stdout);
    fflush(stderr);
    m->out = dup(STDOUT_FILENO);
    m->err = dup(STDERR_FILENO);
    if (m->out >= 0) dup2(null, STDOUT_FILENO);
    if (m->err >= 0) dup2(null, STDERR_FILENO);
    close(null);
}

void l3d_cli_mute_end(struct l3d_cli_mute *m) {
    fflush(stdout);
    fflush(stderr);
    if (m->out >= 0) dup2(m->out, STDOUT_FILENO), close(m->out);
    if (m->err >= 0) dup2(m->err, STDERR_FILENO), close(m->err);
    m->out = m->err = -1;
}

int l3d_arg_choice(const char *cmd, const char *flag, const char *val, const char *const *names,
                   int n, int *out, const char *choices) {
    for (int i = 0; i < n; i++)
        if (strcmp(val, names[i]) == 0) {
            *out = i;
            return 1;
        }
    fprintf(stderr, "llm3d %s: --%s '%s': choose %s\n", cmd, flag, val, choices);
    return 0;
}

int l3d_arg_save_dtype(const char *cmd, const char *val, enum l3d_dtype *out) {
    static const char *const names[] = {"fp32", "bf16", "fp16"};
    static const enum l3d_dtype types[] = {L3D_F32, L3D_BF16, L3D_F16};
    int k = 0;
    if (!l3d_arg_choice(cmd, "save-dtype", val, names, 3, &k, "fp32, bf16 or fp16")) return 0;
    *out = types[k];
    return 1;
}

int l3d_arg_precision(const char *cmd, const char *val, enum l3d_dtype *out) {
    if (l3d_precision_param_parse(val, out) == L3D_OK) return 1;
    fprintf(stderr, "llm3d %s: %s\n", cmd, l3d_error_message());
    return 0;
}

int l3d_arg_doc_token(const char *cmd, const char *val, enum l3d_doc_token *out) {
    static const char *const names[] = {"auto", "eot", "bot"};
    int i;
    if (!l3d_arg_choice(cmd, "doc-token", val, names, 3, &i, "auto, eot or bot")) return 0;
    *out = (enum l3d_doc_token)i;
    return 1;
}

int l3d_doc_token_id(const char *cmd, const struct l3d_tokenizer *tok, const char *spec,
                     enum l3d_doc_token mode) {
    int bot = l3d_tokenizer_bot(tok);
    if (mode == L3D_DOC_BOT && bot < 0) {
        fprintf(stderr, "llm3d %s: --doc-token bot: tokenizer %s has no begin-of-text token "
                "(<|begin_of_text|>): give --doc-token eot\n", cmd, spec);
        return -2;
    }
    return mode != L3D_DOC_EOT && bot >= 0 ? bot : l3d_tokenizer_eot(tok);
}
