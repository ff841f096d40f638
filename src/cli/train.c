/* llm3d train: flags -> struct l3d_train_config -> l3d_train_run (include/llm3d/train.h). */
#include <getopt.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "llm3d/ckpt.h"
#include "llm3d/hf.h"
#include "llm3d/tokenizer.h"
#include "llm3d/pipeline.h"
#include "llm3d/runtime.h"
#include "llm3d/train.h"

static void usage_train(FILE *f) {
    fprintf(f,
        "usage: llm3d train --train PATTERN [flags]\n"
        "\n"
        "Trains a GPT-2 model on token shards, as one process or under mpiexec on any layout.\n"
        "Step k's loss is measured before update k, on the weights of k-1 updates (as llm.c\n"
        "prints it); validation at step k runs after update k. Defaults: --model d6, --batch 4,\n"
        "--seq-len 64 (or the context when shorter).\n"
        "\n");
}

static void usage_bench(FILE *f) {
    fprintf(f,
        "usage: llm3d bench [flags]\n"
        "       llm3d bench --calibrate [--out FILE] [--quick]   (under mpiexec; see its --help)\n"
        "\n"
        "Measures this machine's fp32 FMA peak and sgemm rates, then trains a model on random\n"
        "tokens through the real training loop (one process) and reports the median step,\n"
        "tokens/s and MFU. --calibrate writes the system profile that llm3d plan reads.\n"
        "Flags: train's below (--train, --val and --out are ignored); defaults --model d12\n"
        "--steps 10 --warmup 2.\n"
        "\n");
}

/* --init-from PATH: the model's sizes from the llm.c header or the folder's config.json into
 * tc->model. given: the values of
 * --layers --channels --heads --vocab --context (0: not given); each given one, and a --model
 * preset's, must equal the file's. Returns -1 when they agree, else the exit status. */
static int init_from_sizes(const char *cmd, struct l3d_train_config *tc, const char *preset,
                           const int given[5]) {
    struct l3d_model_spec f;
    if (l3d_model_file_config(tc->init_from, &f) != L3D_OK) {
        fprintf(stderr, "llm3d %s: --init-from: %s\n", cmd, l3d_error_message());
        return 1;
    }
    static const char *const flag[5] = {"layers", "channels", "heads", "vocab", "context"};
    const int file[5] = {f.L, f.C, f.NH, f.V, f.maxT};
    const int pre[5] = {tc->model.L, tc->model.C, tc->model.NH, tc->model.V, tc->model.maxT};
    for (int i = 0; i < 5; i++) {
        if (given[i] && given[i] != file[i]) {
            fprintf(stderr, "llm3d %s: --%s %d disagrees with --init-from %s, whose model has "
                    "%s %d: drop --%s (the file's sizes are used)\n", cmd, flag[i], given[i],
                    tc->init_from, flag[i], file[i], flag[i]);
            return 2;
        }
        if (preset && !given[i] && pre[i] != file[i]) {
            fprintf(stderr, "llm3d %s: --model %s has %s %d but --init-from %s has %d: drop "
                    "--model (the file's sizes are used)\n", cmd, preset, flag[i], pre[i],
                    tc->init_from, file[i]);
            return 2;
        }
    }
    tc->model = f;
    return -1;
}

/* train's and bench's own flags (the run spec's are src/cli/flags.c's) */
enum {
    T_INIT, T_TRAIN, T_VAL, T_SEQUENTIAL, T_STEPS, T_LR, T_MINLR, T_WARMUP, T_WD, T_BETA1,
    T_BETA2, T_EPS, T_CLIP, T_VALEVERY, T_VALBATCHES, T_SEED, T_OUT, T_PEAK, T_QUIET, T_BACKEND,
    T_IGNORE_MEM, T_CROSS_TP, T_TRACE, T_COMM, T_PROGRESS, T_SAVE_EVERY, T_CKPT_DIR, T_KEEP,
    T_RESUME, T_OVERWRITE, T_ASYNC_SAVE, T_TIMEOUT, T_MAX_SKIPPED, T_SAVE_DTYPE, T_SAVE_SHARD,
    T_TENSORBOARD, T_TOKENIZER,
};

static const struct l3d_flag init_flags[] = {
    {"init-from", "PATH", T_INIT, "start from an llm.c GPT-2 checkpoint or a Hugging Face "
                                  "folder (config.json + model.safetensors or its index; gpt2, "
                                  "llama or mixtral) instead of random weights; the model comes "
                                  "from its header or config.json (flags given must agree)"},
    {NULL, NULL, 0, NULL},
};
static const struct l3d_flag data_flags[] = {
    {"train", "PATTERN", T_TRAIN, "token shards (llm.c format): a file or a quoted glob"},
    {"val", "PATTERN", T_VAL, "validation shards"},
    {"sequential", NULL, T_SEQUENTIAL, "read windows in order instead of shuffled"},
    {NULL, NULL, 0, NULL},
};
static const struct l3d_flag optim_flags[] = {
    {"steps", "N", T_STEPS, "optimizer steps (100)"},
    {"lr", "LR", T_LR, "peak learning rate (6e-4), cosine decay to --min-lr"},
    {"min-lr", "LR", T_MINLR, "(6e-5)"},
    {"warmup", "N", T_WARMUP, "linear warm-up steps (10)"},
    {"weight-decay", "W", T_WD, "(0.1, matrices only)"},
    {"beta1", "B", T_BETA1, "(0.9)"},
    {"beta2", "B", T_BETA2, "(0.95)"},
    {"eps", "E", T_EPS, "(1e-8)"},
    {"grad-clip", "G", T_CLIP, "clip the global gradient norm to G, 0 disables (1.0)"},
    {NULL, NULL, 0, NULL},
};
static const struct l3d_flag run_flags[] = {
    {"val-every", "N", T_VALEVERY, "validation every N steps and at the end (50)"},
    {"val-batches", "N", T_VALBATCHES, "micro-batches a validation (8)"},
    {"seed", "S", T_SEED, "initial weights and batch order (1337)"},
    {"out", "DIR", T_OUT, "metrics.jsonl, checkpoints, and at the end the model: model.bin "
                          "(llm.c) and config.json + model.safetensors (Hugging Face) (none)"},
    {"tensorboard", "DIR", T_TENSORBOARD, "each step's loss, validation loss, learning rate, "
                                          "gradient norm, tokens/s, MFU, loss scale and skips "
                                          "as TensorBoard event files in DIR (created when "
                                          "missing; rank 0; a resumed run adds a file) (none)"},
    {"tokenizer", "SPEC", T_TOKENIZER, "the tokenizer whose Hugging Face files (tokenizer.json, "
                                       "tokenizer_config.json, special_tokens_map.json, "
                                       "generation_config.json) --out's folder gets, as prepare "
                                       "takes it (default: the one prepare recorded beside the "
                                       "--train shards, DIR/tokenizer.json, else the "
                                       "--init-from folder's tokenizer.json; none: the model "
                                       "only, said in one line)"},
    {"save-dtype", "T", T_SAVE_DTYPE, "the safetensors weights' type: fp32 (default), bf16 or "
                                      "fp16 (rounded to nearest even)"},
    {"save-shard-mb", "M", T_SAVE_SHARD, "weights above M MiB go to several safetensors files "
                                         "and an index (4096)"},
    {"backend", "NAME", T_BACKEND, "the device: cpu, check (the CPU kernels on a checked "
                                   "device arena, for tests; slower), or cuda in a build with "
                                   "-DL3D_CUDA=ON (experimental: it has not yet run on a GPU) "
                                   "(default: $L3D_BACKEND, else cpu)"},
    {"comm", "MODE", T_COMM, "overlap: data-parallel gradient pieces and tensor-parallel "
                             "input-gradient sums non-blocking, behind compute (default); "
                             "blocking: the same calls blocking (faster over shared memory on "
                             "busy cores, see docs/BENCHMARKS.md)"},
    {"progress", "MODE", T_PROGRESS, "what moves overlapped pieces while ranks compute: none (MPI "
                                     "calls between layers only), poll (between kernels) or "
                                     "thread (an MPI progress thread, MPI_THREAD_MULTIPLE; for "
                                     "nodes with a core to spare) (poll; thread when the launcher "
                                     "puts the ranks on several nodes)"},
    {"trace", "FILE", T_TRACE, "every rank's pipeline timeline as Chrome trace-event JSON"},
    {"ignore-memory-check", NULL, T_IGNORE_MEM, "start even when the layout's planned memory "
                                                "exceeds what is free (by default it is refused "
                                                "before allocating, with layouts that fit)"},
    {"allow-cross-node-tp", NULL, T_CROSS_TP, "run even when a TP group spans nodes (a warning; "
                                              "by default an error: TP groups are runs of --tp "
                                              "consecutive ranks and must sit inside one node; "
                                              "PP and DP groups may cross nodes)"},
    {"peak-gflops", "P", T_PEAK, "peak for MFU (default: measured FMA peak of this machine)"},
    {"quiet", NULL, T_QUIET, "no per-step lines (the start-up summary and the final line stay)"},
    {NULL, NULL, 0, NULL},
};
static const struct l3d_flag ckpt_flags[] = {
    {"save-every", "N", T_SAVE_EVERY, "save every N steps and after the last (0: never; 0)"},
    {"ckpt-dir", "DIR", T_CKPT_DIR, "where step directories go (default OUT/checkpoints)"},
    {"keep", "K", T_KEEP, "keep the newest K checkpoints (3)"},
    {"async-save", NULL, T_ASYNC_SAVE, "write checkpoints in the background: training stands "
                                       "still only while each rank copies its state to host "
                                       "memory (held once: parameters and AdamW moments); the "
                                       "checkpoint is published when every rank has written it. "
                                       "ZeRO-3 (and mixed-precision ZeRO-2) save synchronously"},
    {"resume", "auto|PATH", T_RESUME, "continue from the latest checkpoint (auto: a fresh start "
                                      "when there is none) or from a step or checkpoint "
                                      "directory"},
    {"overwrite", NULL, T_OVERWRITE, "start a new run in an --out (or --ckpt-dir) that holds an "
                                     "earlier run: removes its run, metrics.jsonl, model.bin, "
                                     "checkpoints' latest and step_NNNNNNNN directories (nothing "
                                     "else); without it such a directory is refused unless "
                                     "--resume is given. SIGTERM / SIGUSR1 save at the next step "
                                     "boundary and exit 0; a second one exits at once"},
    {NULL, NULL, 0, NULL},
};
static const struct l3d_flag fault_flags[] = {
    {"timeout", "S", T_TIMEOUT, "abort the job (exit 75) when a rank waits S seconds on "
                                "another (a stopped, hung or dead rank), naming it; the last "
                                "checkpoint is kept (600; 0: wait for ever)"},
    {"max-skipped-steps", "N", T_MAX_SKIPPED, "a step whose loss or gradient norm is not finite "
                                              "is skipped on every rank; N such steps in a row "
                                              "stop the run (10)"},
    {NULL, NULL, 0, NULL},
};

struct train_ctx {
    struct l3d_train_config *tc;
    const char **backend;
    float peak;
};

static int set_train(void *ctx, const char *cmd, int id, const char *v) {
    struct train_ctx *x = ctx;
    struct l3d_train_config *tc = x->tc;
    const long BIG = 1L << 30;
    switch (id) {
    case T_INIT: tc->init_from = v; return 1;
    case T_TRAIN: tc->train_pattern = v; return 1;
    case T_VAL: tc->val_pattern = v; return 1;
    case T_SEQUENTIAL: tc->random_batches = false; return 1;
    case T_STEPS: return l3d_arg_int(cmd, "steps", v, 1, BIG, &tc->steps);
    case T_LR: return l3d_arg_float(cmd, "lr", v, 1e-12, 10, &tc->lr);
    case T_MINLR: return l3d_arg_float(cmd, "min-lr", v, 0, 10, &tc->min_lr);
    case T_WARMUP: return l3d_arg_int(cmd, "warmup", v, 0, BIG, &tc->warmup_steps);
    case T_WD: return l3d_arg_float(cmd, "weight-decay", v, 0, 10, &tc->adamw.weight_decay);
    case T_BETA1: return l3d_arg_float(cmd, "beta1", v, 0, 0.999999, &tc->adamw.beta1);
    case T_BETA2: return l3d_arg_float(cmd, "beta2", v, 0, 0.999999999, &tc->adamw.beta2);
    case T_EPS: return l3d_arg_float(cmd, "eps", v, 1e-30, 1, &tc->adamw.eps);
    case T_CLIP: return l3d_arg_float(cmd, "grad-clip", v, 0, 1e30, &tc->adamw.grad_clip);
    case T_VALEVERY: return l3d_arg_int(cmd, "val-every", v, 0, BIG, &tc->val_every);
    case T_VALBATCHES: return l3d_arg_int(cmd, "val-batches", v, 1, BIG, &tc->val_batches);
    case T_SEED: return l3d_arg_u64(cmd, "seed", v, &tc->seed);
    case T_OUT: tc->out_dir = v; return 1;
    case T_TOKENIZER: tc->tokenizer = v; return 1;
    case T_TENSORBOARD: {
        struct stat sb;
        if (stat(v, &sb) == 0 && !S_ISDIR(sb.st_mode)) {
            fprintf(stderr, "llm3d %s: --tensorboard %s exists and is not a directory: give a "
                    "directory (it is created when missing)\n", cmd, v);
            return 0;
        }
        tc->tensorboard = v;
        return 1;
    }
    case T_PEAK: return l3d_arg_float(cmd, "peak-gflops", v, 1e-3, 1e12, &x->peak);
    case T_QUIET: tc->quiet = true; return 1;
    case T_BACKEND: *x->backend = v; return 1;
    case T_IGNORE_MEM: tc->ignore_memory_check = true; return 1;
    case T_CROSS_TP: tc->allow_cross_node_tp = true; return 1;
    case T_TRACE: tc->trace_path = v; return 1;
    case T_COMM: {
        static const char *const modes[] = {"overlap", "blocking"};
        int m = 0;
        if (!l3d_arg_choice(cmd, "comm", v, modes, 2, &m, "overlap or blocking")) return 0;
        tc->dp_blocking = m == 1;
        return 1;
    }
    case T_PROGRESS: {
        static const char *const modes[] = {"none", "poll", "thread"};
        int m = 0;
        if (!l3d_arg_choice(cmd, "progress", v, modes, 3, &m, "none, poll or thread")) return 0;
        tc->progress = (enum l3d_progress)m;
        return 1;
    }
    case T_SAVE_EVERY: return l3d_arg_int(cmd, "save-every", v, 0, BIG, &tc->save_every);
    case T_CKPT_DIR: tc->ckpt_dir = v; return 1;
    case T_KEEP: return l3d_arg_int(cmd, "keep", v, 1, 1 << 20, &tc->keep);
    case T_RESUME: tc->resume = v; return 1;
    case T_OVERWRITE: tc->overwrite = true; return 1;
    case T_ASYNC_SAVE: tc->async_save = true; return 1;
    case T_TIMEOUT: {
        float sec = 0;
        if (!l3d_arg_float(cmd, "timeout", v, 0, 1e7, &sec)) return 0;
        tc->timeout_s = sec;
        return 1;
    }
    case T_MAX_SKIPPED:
        return l3d_arg_int(cmd, "max-skipped-steps", v, 1, 1 << 20, &tc->max_skipped);
    case T_SAVE_DTYPE: return l3d_arg_save_dtype(cmd, v, &tc->save_dtype);
    case T_SAVE_SHARD: {
        double mb = 0;
        if (!l3d_arg_double(cmd, "save-shard-mb", v, 1e-6, 1 << 30, &mb)) return 0;
        tc->save_shard_bytes = (int64_t)(mb * 1048576.0);
        return 1;
    }
    }
    return 0;
}

/* --out's --tokenizer read at start-up, so that a bad one stops the run before it trains, not at
 * its end; its ids within the model's vocabulary. (The one prepare recorded is read at the end:
 * where it cannot serve, the folder gets the model only, said in one line.) Returns -1 to go
 * on. */
static int check_out_tokenizer(const char *cmd, const struct l3d_train_config *tc) {
    const char *spec = tc->out_dir ? tc->tokenizer : NULL;
    struct l3d_tokenizer *tok = NULL;
    if (!spec) return -1;
    l3d_status st = l3d_tokenizer_open(&tok, spec);
    if (st == L3D_OK) st = l3d_tokenizer_fits(tok, tc->model.V, spec);
    if (st == L3D_OK && !l3d_tokenizer_can_encode(tok))
        st = l3d_error(L3D_ERR_ARG, "%s is llm.c's decode-only file, which holds no merges", spec);
    l3d_tokenizer_free(tok);
    if (st == L3D_OK) return -1;
    fprintf(stderr, "llm3d %s: --tokenizer: %s\n", cmd, l3d_error_message());
    return 2;
}

/* The model from --init-from, or the preset and sizes; then the default sequence length. */
static int train_model(const char *cmd, struct l3d_train_config *tc, struct l3d_cli_spec *cs) {
    if (tc->init_from) { /* the file's sizes; the flags given must agree with them */
        if (cs->preset && l3d_model_preset(&tc->model, cs->preset) != L3D_OK) {
            fprintf(stderr, "llm3d %s: --model: %s\n", cmd, l3d_error_message());
            return 2;
        }
        int rc = init_from_sizes(cmd, tc, cs->preset,
                                 (const int[]){cs->L, cs->C, cs->NH, cs->V, cs->maxT});
        if (rc >= 0) return rc;
        struct l3d_model_spec want = tc->model; /* the architecture flags must agree too */
        l3d_cli_spec_arch(cs, &want);
        /* the routing's training settings are no part of the weights: the flags set them (a
         * Mixtral folder holds the load-balancing coefficient alone, the others read as 0) */
        struct l3d_moe_spec *fm = &tc->model.moe;
        fm->aux_coef = want.moe.aux_coef, fm->z_coef = want.moe.z_coef;
        fm->capacity_factor = want.moe.capacity_factor;
        fm->force_balance = want.moe.force_balance;
        if (l3d_gpt_config_finish(&want) != L3D_OK || !l3d_model_same(&want, &tc->model)) {
            fprintf(stderr, "llm3d %s: the architecture flags disagree with --init-from %s, whose "
                    "model is %s with %d key/value heads and an MLP of %lld, %d experts a layer "
                    "(top-%d, %d shared, %d dense layers first): drop them (the file's "
                    "architecture is used)\n", cmd, tc->init_from, l3d_arch_name(tc->model.arch),
                    l3d_model_kv_heads(&tc->model), (long long)tc->model.ffn, fm->experts,
                    fm->top_k, fm->shared, fm->dense_layers);
            return 2;
        }
    } else {
        int rc = l3d_cli_spec_model(cmd, cs);
        if (rc >= 0) return rc;
    }
    /* the default sequence fits the context */
    if (!l3d_cli_spec_given(cs, "seq-len") && tc->layout.seq > tc->model.maxT)
        tc->layout.seq = tc->model.maxT;
    return -1;
}

static int train_flags(const char *cmd, int argc, char **argv, struct l3d_train_config *tc,
                       const char **backend) {
    struct l3d_cli_spec cs;
    l3d_cli_spec_init(&cs, &tc->spec);
    struct train_ctx x = {.tc = tc, .backend = backend};
    struct l3d_flag_group g[10];
    int n = l3d_cli_spec_groups(&cs, g);
    /* the model's, then train's own groups, then the layout's and the precision's */
    struct l3d_flag_group spec_layout = g[1], spec_prec = g[2];
    g[n - 2] = (struct l3d_flag_group){NULL, init_flags, set_train, &x};
    g[n - 1] = (struct l3d_flag_group){"data", data_flags, set_train, &x};
    g[n++] = (struct l3d_flag_group){"optimizer (AdamW)", optim_flags, set_train, &x};
    g[n++] = spec_layout;
    g[n++] = spec_prec;
    g[n++] = (struct l3d_flag_group){"run", run_flags, set_train, &x};
    g[n++] = (struct l3d_flag_group){"checkpoints (sharded, atomic; resume on any layout; see "
                                     "README). Several nodes: --out and --ckpt-dir\n"
                                     "  must be one shared filesystem (NFS, Lustre...)",
                                     ckpt_flags, set_train, &x};
    g[n++] = (struct l3d_flag_group){"faults", fault_flags, set_train, &x};
    bool bench = strcmp(cmd, "bench") == 0;
    struct l3d_flags_given given;
    int rc = l3d_flags_parse_given(cmd, argc, argv, g, n, bench ? usage_bench : usage_train, NULL,
                                   &given);
    if (rc >= 0) return rc;
    if ((rc = l3d_cli_spec_flags_done(cmd, &cs)) >= 0) return rc;
    if ((rc = train_model(cmd, tc, &cs)) >= 0) return rc;
    if (strcmp(cmd, "bench") != 0 && (rc = check_out_tokenizer(cmd, tc)) >= 0) return rc;
    if ((tc->save_every > 0 || (tc->resume && strcmp(tc->resume, "auto") == 0)) && !tc->out_dir &&
        !tc->ckpt_dir) {
        fprintf(stderr, "llm3d %s: --save-every and --resume auto need a checkpoint directory: give "
                "--out DIR (checkpoints go to DIR/checkpoints) or --ckpt-dir DIR\n", cmd);
        return 2;
    }
    /* every rule of the run spec that holds whatever the world (the ranks are known once MPI
     * starts: l3d_train_layout_init checks the rest, on every rank alike) */
    if ((rc = l3d_cli_spec_report(cmd, &tc->spec, &(struct l3d_spec_ctx){.world_unknown = true,
                                                                         .train = true})) >= 0)
        return rc;
    tc->peak_flops = x.peak * 1e9;
    if (tc->layout.threads) omp_set_num_threads(tc->layout.threads);
    tc->config_yaml = l3d_config_yaml(cmd, g, n, &given); /* OUT/run.yaml */
    return -1;
}

/* Every rank parses the flags (before MPI starts) and finds the same errors: rank 0 says them. */
int l3d_cli_train_flags(const char *cmd, int argc, char **argv, struct l3d_train_config *tc,
                        const char **backend) {
    struct l3d_cli_mute mute;
    l3d_cli_mute_begin(&mute);
    /* --progress's default depends on the launch: unset until the flags are read */
    tc->progress = (enum l3d_progress)-1;
    int rc = train_flags(cmd, argc, argv, tc, backend);
    l3d_cli_mute_end(&mute);
    /* Across nodes the progress thread is the default: over TCP a non-blocking message moves only
     * inside MPI calls of both ranks, so a pipeline's 1.5 MiB activation waited for the sender's
     * next call (pp2 across two namespace hosts, d6: 2122 ms a step polled, 1414 ms with the
     * thread; DP pieces: docs/BENCHMARKS.md). Within one node, polling (docs/DESIGN.md). */
    if ((int)tc->progress == -1)
        tc->progress = l3d_cli_launcher_spans_nodes() ? L3D_PROGRESS_THREAD : L3D_PROGRESS_POLL;
    return rc;
}

int l3d_cli_train(int argc, char **argv) {
    struct l3d_train_config tc;
    l3d_train_config_defaults(&tc);
    struct l3d_runtime_opts ro = {.cmd = "train", .stop_signals = true};
    int rc = l3d_cli_train_flags("train", argc, argv, &tc, &ro.backend);
    if (rc >= 0) return rc;
    if (!tc.train_pattern) {
        free((char *)tc.config_yaml);
        if (l3d_cli_launcher_rank() == 0)
            fprintf(stderr, "llm3d train: no training data: give --train with a token shard file "
                    "or a quoted glob (make some with llm3d prepare)\n");
        return 2;
    }
    struct l3d_runtime *rt;
    ro.progress_thread = !tc.dp_blocking && tc.progress == L3D_PROGRESS_THREAD;
    if (l3d_runtime_init(&argc, &argv, &ro, &rt) != L3D_OK) {
        free((char *)tc.config_yaml);
        return 1;
    }
    struct l3d_train_result res;
    l3d_status st = l3d_train_run(&tc, rt, &res);
    if (st != L3D_OK && res.report_error)
        fprintf(stderr, "llm3d train: %s\n", l3d_error_message());
    l3d_runtime_free(rt);
    free((char *)tc.config_yaml);
    return st == L3D_OK ? 0 : 1;
}
