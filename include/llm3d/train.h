/*
 * llm3d training loop: data → micro-batches → AdamW steps → metrics, validation, final weights.
 *
 *   struct l3d_train_config tc;
 *   l3d_train_config_defaults(&tc);
 *   tc.train_pattern = "data/train_*.bin"; tc.out_dir = "out";
 *   struct l3d_runtime *rt;                          // world and backend (include/llm3d/runtime.h)
 *   l3d_runtime_init(&argc, &argv, &(struct l3d_runtime_opts){.cmd = "train"}, &rt);
 *   l3d_status st = l3d_train_run(&tc, rt, &result); // builds the layout's communicators in rt
 *
 * Global batch = micro-batch B x gradient accumulation steps x data-parallel size sequences of T
 * tokens; each DP rank reads its own B of every micro-batch's B x dp. Each step logs one line (step, loss, lr, grad norm, ms, tokens/s, MFU) and appends a
 * JSON object to out_dir/metrics.jsonl; at the end the weights go to out_dir/model.bin (llm.c).
 */
#ifndef LLM3D_TRAIN_H
#define LLM3D_TRAIN_H

#include <stdbool.h>
#include <stdint.h>

#include "llm3d/core.h"
#include "llm3d/model.h"
#include "llm3d/optim.h"
#include "llm3d/pipeline.h"
#include "llm3d/spec.h"

struct l3d_train_config {
    /* the run spec (include/llm3d/spec.h): model, layout and precision, as one struct (spec, for
     * the validator, the planner and checkpoints) or by part (model, layout, precision) */
    union {
        struct l3d_run_spec spec;
        struct {
            struct l3d_model_spec model;
            struct l3d_layout layout;     /* world = tp x pp x dp (dp 0: inferred) */
            struct l3d_precision precision;
        };
    };
    const char *train_pattern; /* token shards: a file or a glob */
    const char *val_pattern;   /* NULL: no validation */
    const char *out_dir;       /* NULL: write nothing */
    const char *tensorboard;   /* TensorBoard event files go to this directory (NULL: none) */
    const char *init_from;     /* llm.c checkpoint or Hugging Face folder to start from, or NULL */
    /* the Hugging Face folder --out gets at the end: its dtype (L3D_F32 or L3D_BF16, L3D_F16) and
     * the size above which its weights are sharded (0: L3D_HF_SHARD_BYTES) */
    enum l3d_dtype save_dtype;
    int64_t save_shard_bytes;
    /* the tokenizer whose Hugging Face files go into that folder (a --tokenizer SPEC, see
     * l3d_tokenizer_open); NULL: the one prepare recorded beside the training shards, else the
     * --init-from folder's (l3d_train_out_tokenizer), else none */
    const char *tokenizer;
    int steps;
    struct l3d_adamw_hparams adamw;
    float lr, min_lr;
    int warmup_steps;
    int val_every, val_batches; /* validation every val_every steps (and at the end) */
    bool random_batches;
    uint64_t seed;        /* initial weights and batch order */
    double peak_flops;    /* for MFU; <= 0: measured at start-up */
    bool quiet;           /* no per-step line */
    bool dp_blocking;     /* blocking gradient pieces instead of overlapped ones (see dp.h) */
    /* what moves overlapped pieces while the ranks compute: nothing but the calls between layers
     * (none), the backward pass's calls between kernels (poll, l3d_dp_poll_kernels) or a
     * progress thread (thread, l3d_comm_mpi_init_progress: set when the world is made) */
    enum l3d_progress { L3D_PROGRESS_NONE, L3D_PROGRESS_POLL, L3D_PROGRESS_THREAD } progress;
    const char *trace_path; /* Chrome trace-event JSON of every rank's timeline, or NULL */
    /* time every kernel by family (l3d_be_profile) and report the median step's split
     * (res->split); on with trace_path (the families' rows in the trace) and in llm3d bench */
    bool kernel_split;
    /* checkpoints (ckpt.h): saved under ckpt_dir (NULL: out_dir/checkpoints) every save_every
     * steps (0: never; then also after the last step), the newest keep of them kept; resume "auto"
     * (the latest, or a fresh start when there is none), a step directory, or NULL. SIGTERM and
     * SIGUSR1 save at the next step boundary and stop (res->stopped_by). */
    const char *ckpt_dir;
    const char *resume;
    int save_every, keep;
    /* checkpoints written by a thread while training goes on (l3d_ckpt_save_begin): each rank's
     * state copied into host staging at the step, published once every rank has written */
    bool async_save;
    /* run directories (DESIGN.md, "Run identity"): overwrite removes llm3d's files of an earlier
     * run in out_dir (and ckpt_dir) instead of refusing to start there */
    bool overwrite;
    bool ignore_memory_check; /* allocate even when the planned bytes exceed the memory free */
    bool allow_cross_node_tp; /* a TP group may span nodes (a warning instead of an error) */
    /* faults: every wait bounded by timeout_s (0: none; comm.h, struct l3d_watch); a step whose
     * loss or gradient norm is not finite is skipped on every rank, and max_skipped such steps
     * in a row stop the run with an error (the last checkpoint kept) */
    double timeout_s;
    int max_skipped;
    /* the flags given, as a config file (llm3d train --config): written to out_dir/run.yaml when
     * the run claims its directory; NULL: none */
    const char *config_yaml;
};

struct l3d_train_result {
    int steps;
    float first_loss, last_loss, last_val_loss;
    double median_step_s, tokens_per_s, mfu; /* medians: of the last 4096 steps at most */
    double median_optimizer_s; /* gradient norm, clipping, AdamW and the ZeRO all-gather */
    double median_comm_s;      /* exposed data-parallel communication: time blocked waiting */
    double bubble, bubble_theory; /* pipeline idle fraction, measured (median step) and ideal */
    size_t act_bytes, act_bytes_formula; /* activations per rank: allocated, closed form */
    size_t mem_peak;           /* accounted host memory of the fullest rank while training */
    bool report_error;         /* on failure: this rank is the one that prints the message */
    int start_step;            /* steps already done by the checkpoint resumed from */
    int stopped_by;            /* the signal that stopped the run after a checkpoint, else 0 */
    int skipped;               /* steps skipped for a non-finite loss or gradient norm */
    int overflows;             /* of them, fp16 overflows that backed the loss scale off */
    /* with kernel_split: where the median step (by time) went, per kernel family; its
     * communication (exposed DP waits, TP and CP collectives) and its whole time */
    struct l3d_ksplit split;
    double split_comm_s, split_step_s;
    /* with kernel_split: every kernel's totals over the steps after the first (kernel_steps) */
    struct l3d_kprof kernels;
    int kernel_steps;
};

/* What the trainer derives from the run spec's resolved layout (tc->layout: tp, cp, pp, dp, v,
 * accum, the schedule), checked against the flags and the world before any communication or
 * allocation (every rank reaches the same verdict on its own): the stage partition and the
 * schedules. */
struct l3d_train_layout {
    int stages;                    /* pp v virtual stages */
    int *layers;                   /* layers of each virtual stage */
    struct l3d_pp_schedule sched;  /* the training step's actions, per pipeline rank */
    struct l3d_pp_schedule vsched; /* validation's forwards (empty without --val) */
};

struct l3d_runtime;
void l3d_train_config_defaults(struct l3d_train_config *tc);
/* Checks tc's flags and layout for world_size ranks (the schedules' rules included), resolves
 * tc->layout in place (l3d_spec_resolve: dp, cp, v, accum, the schedule) and fills lay with the
 * stage partition. Collective-free; an error names the flag, its value and what to do
 * (l3d_error_message), and leaves tc as it was and nothing to free. */
l3d_status l3d_train_layout_init(struct l3d_train_layout *lay, struct l3d_train_config *tc,
                                 int world_size);
/* Builds lay's schedules: the training step's and, with --val, validation's forwards. Their bytes
 * grow with the micro-batches, so the memory check counts them first (l3d_pp_schedule_bytes) and
 * this runs after it. Collective-free; L3D_ERR_OOM naming --grad-accum when the host has no room,
 * with nothing more to free than before. */
l3d_status l3d_train_layout_build(struct l3d_train_layout *lay,
                                  const struct l3d_train_config *tc);
/* The model shard of virtual stage vs on TP rank tp_rank (l3d_layout_stage_shard). */
struct l3d_shard l3d_train_layout_shard(const struct l3d_train_layout *lay,
                                        const struct l3d_train_config *tc, int vs, int tp_rank);
void l3d_train_layout_free(struct l3d_train_layout *lay);
/* Trains on the runtime's world (a single process is a world of one) and backend, building the
 * layout's communicators in rt (l3d_runtime_layout). Every rank returns the same status;
 * report_error marks the one rank that should print the message, so it appears once. */
l3d_status l3d_train_run(const struct l3d_train_config *tc, struct l3d_runtime *rt,
                         struct l3d_train_result *res);
/* The tokenizer --out's folder gets (src/train/out.c): tc->tokenizer, else DIR/tokenizer.json where
 * DIR is the directory of tc->train_pattern and prepare recorded it there, else the --init-from
 * folder's tokenizer.json (those two into buf, cap bytes), else NULL (the model only). */
const char *l3d_train_out_tokenizer(const struct l3d_train_config *tc, char *buf, size_t cap);

#endif
