/* The flag tables: one parser and one --help writer for every command's flags, and the table of
 * the flags that set the run spec (model, layout, precision), which train, bench and plan share
 * with the same names and value syntax (src/cli/cli.h). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "llm3d/arch.h"
#include "llm3d/pipeline.h"
#include "llm3d/spec.h"

/* ---- the generic parser ----------------------------------------------------------------- */

static int count(const struct l3d_flag *f) {
    int n = 0;
    while (f[n].name) n++;
    return n;
}

void l3d_flags_help(FILE *f, const struct l3d_flag_group *g, int ng) {
    for (int i = 0; i < ng; i++) {
        if (g[i].title) fprintf(f, "%s:\n", g[i].title);
        for (const struct l3d_flag *x = g[i].flags; x->name; x++) {
            if (!x->help) continue; /* a retired spelling: not listed */
            char head[64];
            int k = snprintf(head, sizeof head, "  --%s%s%s", x->name, x->arg ? " " : "",
                             x->arg ? x->arg : "");
            /* the help's lines, wrapped at 78 columns, the first beside the flag when it fits */
            const char *h = x->help;
            bool first = true;
            while (*h) {
                const char *nl = strchr(h, '\n');
                int len = nl ? (int)(nl - h) : (int)strlen(h), cut = len;
                if (cut > 56) { /* the last space within the width */
                    cut = 56;
                    while (cut > 0 && h[cut] != ' ') cut--;
                    if (cut == 0) cut = len;
                }
                if (first && k < 22) fprintf(f, "%-22s%.*s\n", head, cut, h);
                else if (first) fprintf(f, "%s\n%22s%.*s\n", head, "", cut, h);
                else fprintf(f, "%22s%.*s\n", "", cut, h);
                first = false;
                h += cut;
                while (*h == ' ' || (*h == '\n' && cut == len)) {
                    h++;
                    if (h[-1] == '\n') break;
                }
            }
        }
    }
}

/* getopt's table of the groups' flags, then --config and --help; flag k (code 256 + k) is
 * flags[index[k]] of group[k]. */
struct opt_table {
    struct option o[L3D_FLAGS_MAX + 3];
    int group[L3D_FLAGS_MAX], index[L3D_FLAGS_MAX];
};

static void opt_table(struct opt_table *t, const struct l3d_flag_group *g, int ng) {
    int n = 0;
    for (int i = 0; i < ng; i++)
        for (int j = 0; j < count(g[i].flags); j++) {
            L3D_ASSERT(n < L3D_FLAGS_MAX);
            const struct l3d_flag *x = &g[i].flags[j];
            t->o[n] = (struct option){x->name, x->arg ? required_argument : no_argument, NULL,
                                      256 + n};
            t->group[n] = i;
            t->index[n] = j;
            n++;
        }
    t->o[n++] = (struct option){"config", required_argument, NULL, 'c'};
    t->o[n++] = (struct option){"help", no_argument, NULL, 'h'};
    t->o[n] = (struct option){NULL, 0, NULL, 0};
}

/* One pass over argv: the first finds --config (*config) and an unknown flag, up to --help; the
 * second (apply) sets the flags in order, up to --help, which it prints. -1, 0 after --help, 2
 * after one line. */
static int scan(const char *cmd, int argc, char **argv, const struct opt_table *t,
                const struct l3d_flag_group *g, int ng, void (*usage)(FILE *f), bool apply,
                const char **config, struct l3d_flags_given *given) {
    optind = 0; /* a fresh scan (glibc): the second pass reads the argv the first permuted */
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, "h", t->o, NULL)) != -1) {
        if (c == 'h' && !apply) return -1; /* the flags before --help are applied first */
        if (c == 'h') {
            if (usage) usage(stdout);
            l3d_flags_help(stdout, g, ng);
            l3d_config_help(stdout, g, ng);
            return 0;
        }
        if (c == 'c' && !apply && *config) {
            fprintf(stderr, "llm3d %s: --config is given twice (%s, %s): give one file\n", cmd,
                    *config, optarg);
            return 2;
        }
        if (c == 'c') {
            *config = optarg;
            continue;
        }
        if (c < 256) {
            const char *bad = argv[optind - 1];
            fprintf(stderr, "llm3d %s: unknown flag, or a flag without its value: '%s' (see llm3d "
                    "%s --help)\n", cmd, bad, cmd);
            return 2;
        }
        if (!apply) continue;
        const struct l3d_flag_group *grp = &g[t->group[c - 256]];
        const struct l3d_flag *x = &grp->flags[t->index[c - 256]];
        if (!grp->set(grp->ctx, cmd, x->id, x->arg ? optarg : NULL)) return 2;
        given->val[c - 256] = x->arg ? optarg : NULL;
        given->when[c - 256] = ++given->n;
    }
    return -1;
}

int l3d_flags_parse_given(const char *cmd, int argc, char **argv, const struct l3d_flag_group *g,
                          int ng, void (*usage)(FILE *f), int *first_arg,
                          struct l3d_flags_given *given) {
    struct opt_table t;
    opt_table(&t, g, ng);
    memset(given, 0, sizeof *given);
    /* the file's flags first, so that the command line's override them whatever their order */
    const char *config = NULL;
    int rc = scan(cmd, argc, argv, &t, g, ng, usage, false, &config, given);
    if (rc < 0 && config) rc = l3d_config_apply(cmd, config, g, ng, given);
    if (rc < 0) rc = scan(cmd, argc, argv, &t, g, ng, usage, true, &config, given);
    if (rc >= 0) return rc;
    if (first_arg) {
        *first_arg = optind;
    } else if (optind < argc) {
        l3d_flags_unexpected(cmd, argv[optind]);
        return 2;
    }
    return -1;
}

int l3d_flags_parse(const char *cmd, int argc, char **argv, const struct l3d_flag_group *g,
                    int ng, void (*usage)(FILE *f), int *first_arg) {
    struct l3d_flags_given given;
    return l3d_flags_parse_given(cmd, argc, argv, g, ng, usage, first_arg, &given);
}

int l3d_flags_parse_n(const char *cmd, int argc, char **argv, const struct l3d_flag_group *g,
                      void (*usage)(FILE *f), int nargs, const char *what, int *first_arg) {
    int rc = l3d_flags_parse(cmd, argc, argv, g, 1, usage, first_arg);
    if (rc >= 0) return rc;
    if (argc - *first_arg != nargs) {
        fprintf(stderr, "llm3d %s: give %s (see --help)\n", cmd, what);
        return 2;
    }
    return -1;
}

void l3d_flags_unexpected(const char *cmd, const char *arg) {
    if (strcmp(arg, "yes") == 0 || strcmp(arg, "no") == 0)
        fprintf(stderr, "llm3d %s: unexpected argument '%s': switches take no value now (one "
                "spelling in every command): give --sequence-parallel or --no-sequence-parallel, "
                "--flash or --no-flash\n", cmd, arg);
    else
        fprintf(stderr, "llm3d %s: unexpected argument '%s' (flags only; see llm3d %s --help)\n",
                cmd, arg, cmd);
}

/* ---- the run spec's flags ---------------------------------------------------------------- */

enum {
    F_MODEL, F_LAYERS, F_CHANNELS, F_HEADS, F_VOCAB, F_CONTEXT, F_FFN, F_ARCH, F_KV, F_HEAD_DIM,
    F_THETA, F_EPS, F_QKN, F_NO_QKN, F_MOE_E, F_MOE_K, F_MOE_FFN, F_MOE_SHARED, F_MOE_DENSE,
    F_MOE_NORM, F_MOE_NO_NORM, F_MOE_AUX, F_MOE_Z, F_MOE_CAP, F_MOE_FORCE,
    F_TP, F_CP, F_PP, F_DP, F_EP, F_SCHED, F_VIRT, F_PPLAYERS, F_PPFIRST, F_PPLAST, F_BATCH, F_SEQ,
    F_ACCUM, F_GLOBAL,
    F_ZERO, F_ZERO3_PREFETCH, F_SP, F_NO_SP, F_RECOMPUTE, F_XENT, F_THREADS, F_BUCKET,
    F_PREC, F_REDUCE, F_TP_REDUCE, F_CP_REDUCE, F_LS, F_LS_INIT, F_LS_MIN, F_LS_WINDOW, F_LS_HYST,
    F_LS_BACKOFF,
    F_OLD_HIDDEN, F_OLD_MICRO_BATCH,
};

/* a bound's value in a help text: the parser's constant, not a copy of it */
#define STR_(x) #x
#define STR(x) STR_(x)

static const struct l3d_flag model_flags[] = {
    {"model", "NAME", F_MODEL, NULL}, /* help written with the preset names: model_help() */
    {"layers", "L", F_LAYERS, "transformer layers (overrides the preset)"},
    {"channels", "C", F_CHANNELS, "hidden size (overrides the preset)"},
    {"heads", "NH", F_HEADS, "attention heads (overrides the preset)"},
    {"vocab", "V", F_VOCAB, "vocabulary size (overrides the preset)"},
    {"context", "T", F_CONTEXT, "context length: rows of the position table (overrides the "
                                "preset)"},
    {"ffn", "F", F_FFN, "MLP width: GELU's (4 x channels; the planner's Megatron-LM runs may "
                        "differ), or SwiGLU's hidden size, which --arch llama needs (a llama "
                        "preset has its own)"},
    {"arch", "NAME", F_ARCH, "blocks: gpt2 (LayerNorm, learned positions, GELU, biases, tied "
                             "head) or llama (RMSNorm, RoPE, SwiGLU, no biases, untied head)"},
    {"kv-heads", "N", F_KV, "key/value heads, dividing the heads (grouped-query attention; "
                            "default: as many as heads)"},
    {"head-dim", "N", F_HEAD_DIM, "a head's size (default: channels / heads; Qwen3 sets it "
                                  "apart: q|k|v of (heads + 2 kv-heads) x N rows, an output "
                                  "projection of heads x N columns)"},
    {"rope-theta", "X", F_THETA, "RoPE base frequency (llama; 10000, Llama 3: 500000)"},
    {"norm-eps", "X", F_EPS, "normalisation epsilon (1e-5; RMSNorm takes any)"},
    {"qk-norm", NULL, F_QKN, "RMSNorm each query and key head before RoPE (Qwen3's q_norm, "
                             "k_norm; a qwen3 preset has it)"},
    {"no-qk-norm", NULL, F_NO_QKN, "no QK-norm (the default; over a qwen3 preset)"},
    {"moe-experts", "E", F_MOE_E, "mixture of experts: E expert MLPs a layer and a router "
                                  "(0: dense, the default; README \"Mixture of experts\")"},
    {"moe-top-k", "K", F_MOE_K, "experts each token is routed to (1..E)"},
    {"moe-ffn", "F", F_MOE_FFN, "expert MLP width (default: the MLP's, --ffn)"},
    {"moe-shared-experts", "S", F_MOE_SHARED, "always-on experts: one shared MLP of S x the "
                                              "expert width (0)"},
    {"moe-dense-layers", "N", F_MOE_DENSE, "leading layers that keep the dense MLP (0)"},
    {"moe-norm-topk", NULL, F_MOE_NORM, "renormalise the top-k router weights to sum to 1 "
                                        "(Mixtral)"},
    {"no-moe-norm-topk", NULL, F_MOE_NO_NORM, "keep the softmax probabilities (Qwen3-MoE's "
                                              "norm_topk_prob false; the default)"},
    {"moe-aux-loss-coef", "X", F_MOE_AUX, "load-balancing loss E sum f_i P_i (Switch) "
                                          "coefficient (0)"},
    {"moe-z-loss-coef", "X", F_MOE_Z, "router z-loss (ST-MoE) coefficient (0)"},
    {"moe-capacity-factor", "X", F_MOE_CAP, "0: dropless (default); > 0: an expert keeps "
                                            "ceil(X N K / E) assignments in token order"},
    {"moe-force-balance", NULL, F_MOE_FORCE, "benchmarking only: each row's experts are fixed "
                                             "by its position, (layer + (b T + t) K + j) mod E, "
                                             "exactly balanced; the router's softmax still "
                                             "weighs them and trains"},
    {"hidden", "H", F_OLD_HIDDEN, NULL},
    {NULL, NULL, 0, NULL},
};

static const struct l3d_flag layout_flags[] = {
    {"tp", "N", F_TP, "tensor-parallel size: heads, MLP and vocabulary split (1)"},
    {"cp", "N", F_CP, "context-parallel size: each sequence split over N ranks (1)"},
    {"ep", "N", F_EP, "expert-parallel size: the --moe-experts split over N ranks of each "
                      "data-parallel group, tokens exchanged by all-to-all (1)"},
    {"pp", "N", F_PP, "pipeline-parallel size: contiguous layer ranges per stage (1)"},
    {"dp", "N", F_DP, "data-parallel replicas (default: ranks / (tp x pp))"},
    {"pp-schedule", "S", F_SCHED, "1f1b (default), gpipe, interleaved (with --pp-virtual), "
                                  "zb-h1 (zero bubble: backward split into B and W) or zbv "
                                  "(zero bubble, two chunks a rank in a V: --pp-virtual 2)"},
    {"pp-virtual", "V", F_VIRT, "model chunks per pipeline rank, interleaved or zbv schedule (1)"},
    {"pp-layers", "a,b,..", F_PPLAYERS, "layers of each (virtual) stage (default: balanced by "
                                        "cost)"},
    {"pp-first-layers", "N", F_PPFIRST, "layers of the first (virtual) stage, the middle ones "
                                        "split evenly (with or without --pp-last-layers)"},
    {"pp-last-layers", "N", F_PPLAST, "layers of the last (virtual) stage, the middle ones split "
                                      "evenly"},
    {"batch", "B", F_BATCH, "sequences per micro-batch on each data-parallel rank"},
    {"seq-len", "T", F_SEQ, "tokens per sequence"},
    {"grad-accum", "N", F_ACCUM, "micro-batches per step (1)"},
    {"global-batch", "G", F_GLOBAL, "sequences per step instead: G / (batch x dp) micro-batches"},
    {"zero", "S", F_ZERO, "0: replicated optimizer; 1: AdamW state sharded over dp; "
                          "2: gradients sharded too; 3: parameters too (0)"},
    {"zero3-prefetch", "N", F_ZERO3_PREFETCH, "ZeRO-3: layers whose parameter all-gather is "
                                              "posted ahead of use (1; 0 to "
                                              STR(L3D_ZERO3_MAX_PREFETCH) ")"},
    {"sequence-parallel", NULL, F_SP, "LayerNorm and residual regions split by rows over the TP "
                                      "group (needs --tp 2 or more)"},
    {"no-sequence-parallel", NULL, F_NO_SP, "no sequence parallelism (the default)"},
    {"recompute", "MODE", F_RECOMPUTE, "none (default), selective (attention scores), full "
                                       "(layers)"},
    {"xent-chunk", "ROWS", F_XENT, "rows of the head's logits computed at once, the loss and "
                                   "its gradients a chunk at a time, the head's product run "
                                   "again in backward (0, the default, or batch x seq-len or "
                                   "more: unchunked, the logits kept)"},
    {"threads", "N", F_THREADS, "OpenMP threads per rank (train: OMP_NUM_THREADS or all cores; "
                                "plan: 1)"},
    {"bucket-mb", "M", F_BUCKET, "gradient reduction pieces in MiB (4)"},
    {"micro-batch", "B", F_OLD_MICRO_BATCH, NULL},
    {NULL, NULL, 0, NULL},
};

static const struct l3d_flag precision_flags[] = {
    {"precision", "P", F_PREC, "fp32 (default), bf16 or fp16: mixed precision (16-bit weights "
                               "and activations; fp32 gradients, master weights, AdamW moments)"},
    {"grad-reduce-dtype", "T", F_REDUCE, "fp32 (default) or bf16, or fp16 with --precision fp16: "
                                         "the type data-parallel gradient sums travel in (half "
                                         "the bytes; gradients still accumulate in fp32)"},
    {"tp-reduce-dtype", "T", F_TP_REDUCE, "model (default: the model's type, as Megatron-LM) or "
                                          "fp32: the type tensor parallelism's partial sums "
                                          "are made, summed and rounded in with --precision "
                                          "bf16|fp16 (twice the TP bytes; one rounding, as one "
                                          "process)"},
    {"cp-reduce-dtype", "T", F_CP_REDUCE, "model (default) or fp32: the type of the context-"
                                          "parallel ring's partial attention outputs, their "
                                          "merges and dK|dV sums with --precision bf16|fp16 "
                                          "(fp32: rounded once, as one process's attention)"},
    {"initial-loss-scale", "S", F_LS_INIT, "fp16 dynamic loss scaling, Megatron-LM's defaults: "
                                           "the first scale (2^32)"},
    {"min-loss-scale", "S", F_LS_MIN, "the scale's floor (1)"},
    {"loss-scale-window", "N", F_LS_WINDOW, "steps without overflow that double the scale (1000)"},
    {"hysteresis", "N", F_LS_HYST, "overflows before each back-off (2)"},
    {"loss-scale-backoff", "F", F_LS_BACKOFF, "factor of each back-off (0.5)"},
    {"loss-scale", "S", F_LS, "a static scale instead of the dynamic one"},
    {NULL, NULL, 0, NULL},
};

static int renamed(const char *cmd, const char *old, const char *now) {
    fprintf(stderr, "llm3d %s: --%s is now --%s (one spelling in every command): give --%s\n",
            cmd, old, now, now);
    return 0;
}

static int set_model(void *ctx, const char *cmd, int id, const char *v) {
    struct l3d_cli_spec *cs = ctx;
    cs->given |= 1ull << id;
    switch (id) {
    case F_MODEL: cs->preset = v; return 1;
    case F_LAYERS: return l3d_arg_int(cmd, "layers", v, 1, L3D_MAX_LAYERS, &cs->L);
    case F_CHANNELS: return l3d_arg_int(cmd, "channels", v, 1, L3D_MAX_CHANNELS, &cs->C);
    case F_HEADS: return l3d_arg_int(cmd, "heads", v, 1, 1 << 16, &cs->NH);
    case F_VOCAB: return l3d_arg_int(cmd, "vocab", v, 2, 1 << 30, &cs->V);
    case F_CONTEXT: return l3d_arg_int(cmd, "context", v, 1, L3D_MAX_CONTEXT, &cs->maxT);
    case F_FFN: return l3d_arg_int(cmd, "ffn", v, 1, 1 << 26, &cs->ffn);
    case F_ARCH: {
        char list[128];
        return l3d_arg_choice(cmd, "arch", v, l3d_arch_names(), L3D_ARCH_COUNT, &cs->arch,
                              l3d_arch_list(list, sizeof list, "or", false));
    }
    case F_KV: return l3d_arg_int(cmd, "kv-heads", v, 1, 1 << 16, &cs->NKV);
    case F_HEAD_DIM: return l3d_arg_int(cmd, "head-dim", v, 1, L3D_MAX_CHANNELS, &cs->head_dim);
    case F_THETA: return l3d_arg_double(cmd, "rope-theta", v, 1.0, 1e12, &cs->rope_theta);
    case F_EPS: return l3d_arg_float(cmd, "norm-eps", v, 1e-12, 0.5, &cs->norm_eps);
    case F_QKN: case F_NO_QKN: return 1; /* applied by l3d_cli_spec_arch from `given` */
    case F_MOE_E: return l3d_arg_int(cmd, "moe-experts", v, 0, 1 << 16, &cs->moe.experts);
    case F_MOE_K: return l3d_arg_int(cmd, "moe-top-k", v, 0, 1 << 16, &cs->moe.top_k);
    case F_MOE_FFN: {
        int f = 0;
        int r = l3d_arg_int(cmd, "moe-ffn", v, 1, 1 << 26, &f);
        cs->moe.ffn = f;
        return r;
    }
    case F_MOE_SHARED: return l3d_arg_int(cmd, "moe-shared-experts", v, 0, 1 << 16,
                                          &cs->moe.shared);
    case F_MOE_DENSE: return l3d_arg_int(cmd, "moe-dense-layers", v, 0, L3D_MAX_LAYERS,
                                         &cs->moe.dense_layers);
    case F_MOE_NORM: case F_MOE_NO_NORM: cs->moe.norm_topk = id == F_MOE_NORM; return 1;
    case F_MOE_AUX: return l3d_arg_double(cmd, "moe-aux-loss-coef", v, 0.0, 1e6,
                                          &cs->moe.aux_coef);
    case F_MOE_Z: return l3d_arg_double(cmd, "moe-z-loss-coef", v, 0.0, 1e6, &cs->moe.z_coef);
    case F_MOE_CAP: return l3d_arg_double(cmd, "moe-capacity-factor", v, 0.0, 1e6,
                                          &cs->moe.capacity_factor);
    case F_MOE_FORCE: cs->moe.force_balance = true; return 1;
    case F_OLD_HIDDEN: return renamed(cmd, "hidden", "channels");
    }
    return 0;
}

static int set_layout(void *ctx, const char *cmd, int id, const char *v) {
    struct l3d_cli_spec *cs = ctx;
    struct l3d_layout *l = &cs->spec->layout;
    const int BIG = 1 << 30;
    cs->given |= 1ull << id;
    switch (id) {
    case F_TP: return l3d_arg_int(cmd, "tp", v, 1, 1 << 20, &l->tp);
    case F_CP: return l3d_arg_int(cmd, "cp", v, 1, 1 << 20, &l->cp);
    case F_PP: return l3d_arg_int(cmd, "pp", v, 1, 1 << 20, &l->pp);
    case F_DP: return l3d_arg_int(cmd, "dp", v, 1, 1 << 24, &l->dp);
    case F_EP: return l3d_arg_int(cmd, "ep", v, 1, 1 << 16, &l->ep);
    case F_SCHED:
        if (l3d_pp_kind_parse(v, &l->schedule) == L3D_OK) return 1;
        fprintf(stderr, "llm3d %s: %s\n", cmd, l3d_error_message());
        return 0;
    case F_VIRT: return l3d_arg_int(cmd, "pp-virtual", v, 1, 256, &l->v);
    case F_PPLAYERS: l->pp_layers = v; return 1;
    case F_PPFIRST: return l3d_arg_int(cmd, "pp-first-layers", v, 1, L3D_MAX_LAYERS, &l->pp_first);
    case F_PPLAST: return l3d_arg_int(cmd, "pp-last-layers", v, 1, L3D_MAX_LAYERS, &l->pp_last);
    case F_BATCH: return l3d_arg_int(cmd, "batch", v, 1, BIG, &l->micro_batch);
    case F_SEQ: return l3d_arg_int(cmd, "seq-len", v, 1, L3D_MAX_CONTEXT, &l->seq);
    case F_ACCUM: return l3d_arg_int(cmd, "grad-accum", v, 1, BIG, &l->accum);
    case F_GLOBAL: {
        double g = 0;
        if (!l3d_arg_double(cmd, "global-batch", v, 1, (double)(1LL << 40), &g)) return 0;
        if (g != (double)(int64_t)g) {
            fprintf(stderr, "llm3d %s: --global-batch %s: give a whole number of sequences\n",
                    cmd, v);
            return 0;
        }
        l->global_batch = (int64_t)g;
        return 1;
    }
    case F_ZERO: return l3d_arg_int(cmd, "zero", v, 0, 3, &l->zero);
    case F_ZERO3_PREFETCH:
        l->zero3_prefetch_set = true;
        return l3d_arg_int(cmd, "zero3-prefetch", v, 0, L3D_ZERO3_MAX_PREFETCH,
                           &l->zero3_prefetch);
    case F_SP: l->sp = true; return 1;
    case F_NO_SP: l->sp = false; return 1;
    case F_RECOMPUTE: {
        static const char *const modes[] = {"none", "selective", "full"};
        int m = 0;
        if (!l3d_arg_choice(cmd, "recompute", v, modes, 3, &m, "none, selective or full"))
            return 0;
        l->recompute = (enum l3d_recompute)m;
        return 1;
    }
    case F_XENT: return l3d_arg_int(cmd, "xent-chunk", v, 0, 1 << 30, &l->xent_chunk);
    case F_THREADS: return l3d_arg_int(cmd, "threads", v, 1, 4096, &l->threads);
    case F_BUCKET: {
        double mb = 0;
        if (!l3d_arg_double(cmd, "bucket-mb", v, 0.004, 4096, &mb)) return 0;
        l->bucket_bytes = (size_t)(mb * 1048576.0);
        return 1;
    }
    case F_OLD_MICRO_BATCH: return renamed(cmd, "micro-batch", "batch");
    }
    return 0;
}

static int set_precision(void *ctx, const char *cmd, int id, const char *v) {
    struct l3d_cli_spec *cs = ctx;
    struct l3d_precision *p = &cs->spec->precision;
    struct l3d_loss_scaling *ls = &p->ls;
    cs->given |= 1ull << id;
    if (id >= F_LS && id <= F_LS_BACKOFF) {
        ls->given = id == F_LS ? "loss-scale" : id == F_LS_INIT ? "initial-loss-scale"
                      : id == F_LS_MIN ? "min-loss-scale" : id == F_LS_WINDOW ? "loss-scale-window"
                    : id == F_LS_HYST ? "hysteresis" : "loss-scale-backoff";
    }
    switch (id) {
    case F_PREC:
        if (l3d_precision_parse(v, p) == L3D_OK) return 1;
        fprintf(stderr, "llm3d %s: %s\n", cmd, l3d_error_message());
        return 0;
    case F_REDUCE: { /* the element types' one parser, then the floating ones */
        enum l3d_dtype t;
        if (l3d_dtype_parse(v, &t) == L3D_OK && (t == L3D_F32 || t == L3D_BF16 || t == L3D_F16)) {
            p->reduce = t;
            return 1;
        }
        fprintf(stderr, "llm3d %s: --grad-reduce-dtype '%s': choose fp32 (the default), bf16, or "
                "fp16 (with --precision fp16)\n", cmd, v);
        return 0;
    }
    case F_TP_REDUCE: {
        static const char *const kinds[] = {"model", "fp32"};
        int k = 0;
        if (!l3d_arg_choice(cmd, "tp-reduce-dtype", v, kinds, 2, &k,
                            "model (the default: the model's type) or fp32"))
            return 0;
        p->tp_reduce_fp32 = k == 1;
        return 1;
    }
    case F_CP_REDUCE: {
        int m = 0;
        static const char *const modes[] = {"model", "fp32"};
        if (!l3d_arg_choice(cmd, "cp-reduce-dtype", v, modes, 2, &m, "model (the default) or fp32"))
            return 0;
        p->cp_fp32 = m == 1;
        return 1;
    }
    case F_LS: return l3d_arg_double(cmd, "loss-scale", v, 0, 1e30, &ls->fixed);
    case F_LS_INIT: return l3d_arg_double(cmd, "initial-loss-scale", v, 1e-30, 1e30, &ls->init);
    case F_LS_MIN: return l3d_arg_double(cmd, "min-loss-scale", v, 1e-30, 1e30, &ls->min);
    case F_LS_WINDOW: return l3d_arg_int(cmd, "loss-scale-window", v, 1, 1 << 30, &ls->window);
    case F_LS_HYST: return l3d_arg_int(cmd, "hysteresis", v, 1, 1 << 30, &ls->hysteresis);
    case F_LS_BACKOFF:
        return l3d_arg_double(cmd, "loss-scale-backoff", v, 1e-6, 0.999999, &ls->backoff);
    }
    return 0;
}

void l3d_cli_spec_init(struct l3d_cli_spec *cs, struct l3d_run_spec *spec) {
    memset(cs, 0, sizeof *cs);
    cs->spec = spec;
    cs->arch = -1;
}

int l3d_cli_spec_groups(struct l3d_cli_spec *cs, struct l3d_flag_group *out) {
    /* the preset names belong in --model's help line, written once */
    static char model_help[1024];
    static struct l3d_flag model_table[sizeof model_flags / sizeof model_flags[0]];
    memcpy(model_table, model_flags, sizeof model_flags);
    snprintf(model_help, sizeof model_help, "a preset: %s", l3d_model_preset_names());
    model_table[0].help = model_help;
    out[0] = (struct l3d_flag_group){"model (a preset, then explicit sizes override it)",
                                     model_table, set_model, cs};
    out[1] = (struct l3d_flag_group){"layout (parallel sizes and batch; launch with mpiexec -n N; "
                                     "see README)", layout_flags, set_layout, cs};
    out[2] = (struct l3d_flag_group){"precision", precision_flags, set_precision, cs};
    return 3;
}

bool l3d_cli_spec_given(const struct l3d_cli_spec *cs, const char *flag) {
    const struct l3d_flag *t[3] = {model_flags, layout_flags, precision_flags};
    for (int i = 0; i < 3; i++)
        for (const struct l3d_flag *x = t[i]; x->name; x++)
            if (strcmp(x->name, flag) == 0) return (cs->given >> x->id) & 1;
    L3D_ASSERT(!"l3d_cli_spec_given: no such flag");
    return false;
}

/* The --moe-* flags given, over the preset's values. */
static void moe_flags(const struct l3d_cli_spec *cs, struct l3d_moe_spec *o) {
    const struct l3d_moe_spec *f = &cs->moe;
#define GIVEN(id) ((cs->given >> (id)) & 1)
    if (GIVEN(F_MOE_E)) o->experts = f->experts;
    if (GIVEN(F_MOE_K)) o->top_k = f->top_k;
    if (GIVEN(F_MOE_FFN)) o->ffn = f->ffn;
    if (GIVEN(F_MOE_SHARED)) o->shared = f->shared;
    if (GIVEN(F_MOE_DENSE)) o->dense_layers = f->dense_layers;
    if (GIVEN(F_MOE_NORM) || GIVEN(F_MOE_NO_NORM)) o->norm_topk = f->norm_topk;
    if (GIVEN(F_MOE_AUX)) o->aux_coef = f->aux_coef;
    if (GIVEN(F_MOE_Z)) o->z_coef = f->z_coef;
    if (GIVEN(F_MOE_CAP)) o->capacity_factor = f->capacity_factor;
    if (GIVEN(F_MOE_FORCE)) o->force_balance = true;
#undef GIVEN
}

void l3d_cli_spec_arch(const struct l3d_cli_spec *cs, struct l3d_model_spec *m) {
    if (cs->arch >= 0) {
        enum l3d_mlp was = m->mlp;
        l3d_model_set_arch(m, (enum l3d_arch)cs->arch); /* --arch's choices: the rows' names */
        if (m->mlp != was) m->ffn = 0; /* a GPT-2 preset's 4C is no SwiGLU width: --ffn says it */
    }
    if (cs->NKV) m->NKV = cs->NKV;
    if (cs->head_dim) m->head_dim = cs->head_dim;
    if (cs->rope_theta > 0) m->rope.theta = cs->rope_theta;
    if (cs->norm_eps > 0) m->norm_eps = cs->norm_eps;
    if ((cs->given >> F_QKN) & 1) m->qk_norm = true;
    if ((cs->given >> F_NO_QKN) & 1) m->qk_norm = false;
    /* GELU's width follows the channels (0: 4C of the sizes now, l3d_gpt_config_finish); a
     * SwiGLU preset keeps its own unless --ffn is given */
    if (cs->ffn || m->mlp == L3D_MLP_GELU) m->ffn = cs->ffn;
    moe_flags(cs, &m->moe);
}

int l3d_cli_spec_model(const char *cmd, struct l3d_cli_spec *cs) {
    struct l3d_model_spec *m = &cs->spec->model;
    if (cs->preset && l3d_model_preset(m, cs->preset) != L3D_OK) {
        fprintf(stderr, "llm3d %s: --model: %s\n", cmd, l3d_error_message());
        return 2;
    }
    if (cs->L) m->L = cs->L;
    if (cs->C) m->C = cs->C;
    if (cs->NH) m->NH = cs->NH;
    if (cs->V) m->V = cs->V;
    if (cs->maxT) m->maxT = cs->maxT;
    l3d_cli_spec_arch(cs, m);
    if (l3d_gpt_config_finish(m) != L3D_OK) {
        fprintf(stderr, "llm3d %s: %s\n", cmd, l3d_error_message());
        return 2;
    }
    return -1;
}

int l3d_cli_spec_flags_done(const char *cmd, struct l3d_cli_spec *cs) {
    struct l3d_layout *l = &cs->spec->layout;
    if (l3d_cli_spec_given(cs, "grad-accum") && l->global_batch > 0) {
        fprintf(stderr, "llm3d %s: give --grad-accum or --global-batch, not both (the "
                "micro-batches per step are global batch / (batch x dp))\n", cmd);
        return 2;
    }
    if (l->v > 1 && !l3d_cli_spec_given(cs, "pp-schedule")) {
        l->schedule = L3D_PP_INTERLEAVED;
        l->schedule_implied = true;
    }
    return -1;
}

int l3d_cli_spec_report(const char *cmd, const struct l3d_run_spec *s,
                        const struct l3d_spec_ctx *ctx) {
    /* every violated rule, in one line: an error is said once (and once per job under mpiexec) */
    if (l3d_spec_check(s, ctx, NULL) == L3D_OK) return -1;
    fprintf(stderr, "llm3d %s: %s\n", cmd, l3d_error_message());
    return 2;
}
