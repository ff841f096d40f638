/*
 * The training loop's state and its parts (private to src/train): l3d_train_run (train.c) builds a
 * struct l3d_trainer, then each step is
 *
 *   l3d_trainer_step(t, step, &s);       // step.c: micro-batches, DP reduction, norm, AdamW
 *   l3d_trainer_validate(t, step, &s);   // step.c: the validation loss when it is due
 *   l3d_train_report_step(t, step, &s);  // report.c: the log line and metrics.jsonl
 *
 * between l3d_train_report_start (the run's description) and l3d_train_report_end (the medians,
 * the final summary).
 */
#ifndef LLM3D_TRAIN_IMPL_H
#define LLM3D_TRAIN_IMPL_H

#include <stdio.h>

#include "llm3d/ckpt.h"
#include "llm3d/data.h"
#include "llm3d/cp.h"
#include "llm3d/dp.h"
#include "llm3d/ep.h"
#include "llm3d/pipeline.h"
#include "llm3d/runtime.h"
#include "llm3d/tfevents.h"
#include "llm3d/tp.h"
#include "llm3d/train.h"

/* fp16 loss scaling (train.h, tc->precision.ls.fixed...): the same state on every rank, updated from the
 * agreed skip decision only. */
struct l3d_loss_scaler {
    bool on, dynamic;
    double scale;
    int64_t good_steps;  /* steps without overflow since the last change (growth tracker) */
    int64_t hyst_left;   /* overflows left before the next back-off */
};
/* After a step: overflow, or a step without one; returns whether the scale changed. */
bool l3d_loss_scaler_update(struct l3d_loss_scaler *ls, const struct l3d_train_config *tc,
                            bool overflow);

struct l3d_trainer {
    const struct l3d_train_config *tc; /* its layout resolved (l3d_train_layout_init) */
    struct l3d_train_layout lay;
    struct l3d_comm *world;
    const struct l3d_topo *topo;       /* the runtime's */
    struct l3d_backend *be;            /* the runtime's */
    const char *comm_name;
    bool lead;                         /* world rank 0: prints and writes files */
    struct l3d_data *train, *val;
    struct l3d_loader *ld, *vld;
    /* this rank's v model chunks (chunk c is virtual stage c pp + pp_rank), their data-parallel
     * states (ndp initialised) and optimizers */
    struct l3d_gpt **chunks;
    struct l3d_dp *dps;
    struct l3d_adamw *opts;
    struct l3d_sumsq gsq;              /* the squared gradient norm, on the device */
    /* fp32 views of the chunks' parameters (views_begin in train.c: the chunks themselves in
     * fp32, their master weights in mixed precision) for initialisation and checkpoints */
    struct l3d_gpt *views, **vptr;
    float **p32;
    struct l3d_ckpt_pieces *pieces; /* a view without parameters: them a piece at a time */
    int ndp;
    struct l3d_tp tpc;
    struct l3d_ep epc; /* expert parallelism's exchanges, timed (include/llm3d/ep.h) */
    struct l3d_pp_exec px;
    bool px_up;
    FILE *metrics;                     /* lead rank with --out */
    char metrics_path[4200];
    struct l3d_tfevents tb;            /* lead rank with --tensorboard (tb.f NULL: none) */
    uint64_t run_id;                   /* this run's (rundir.c) */
    int32_t *inp, *tgt;                /* token ids of a step's micro-batches */
    int32_t *cinp, *ctgt;              /* cp > 1: this ring rank's chunks of them */
    struct l3d_cp *cps;                /* each chunk's ring (cp > 1) */
    int64_t BT, tokens_step, n_local;
    size_t act_bytes, act_formula;     /* this rank's activations: allocated, closed form */
    float dloss;                       /* each token's weight in the global mean loss */
    struct l3d_lr_schedule lrs;
    double peak, flops_tok;            /* FLOP/s of all ranks, model FLOPs per token */
    /* the medians' samples: rings of the last n_times steps (step % n_times), at most
     * L3D_TRAIN_TIMES_KEPT, so that --steps 2^30 allocates 4 x 32 KiB, not 4 x 8 GiB */
    double *step_s, *opt_s, *comm_s, *bub;
    /* with tc->kernel_split: the running totals l3d_be_profile adds to, each step's share of
     * them (a ring as above) and each step's communication */
    struct l3d_kprof kp_total, kp_first; /* kp_first: the totals after the run's first step */
    struct l3d_ksplit *kp;
    int kp_first_step;
    double *kp_comm_s;
    /* mixture of experts: the step's statistics summed over the stages and the dp x cp ranks
     * (l3d_model_moe_stats_len doubles) and each MoE layer's load (NULL for a dense model) */
    double *moe_stats, *moe_load;
    /* metrics.jsonl's line for a mixture of experts (allocated with moe_stats): 4 KiB for the
     * scalars and 16 bytes a MoE layer for its load (%.6g and a comma), so that any layer count
     * fits; NULL for a dense model, whose line fits the 4 KiB on the stack */
    char *mline;
    size_t mline_cap;
    int n_times;
    double agreed_at;                  /* when l3d_trainer_agree_skip last returned */
    struct l3d_loss_scaler ls;         /* fp16 only */
    double mem_figure;                 /* the memory check's bytes for this rank (< 0: skipped) */
};

/* The step times the medians of the run's summary are taken over: the last 4096 steps */
#define L3D_TRAIN_TIMES_KEPT 4096

/* What one step measured. */
struct l3d_step_stats {
    double loss, norm, seconds, optimizer_s, comm_wait_s, bubble, tokens_per_s, mfu;
    double gather_wait_s; /* ZeRO-3: of comm_wait_s, the parameter all-gathers' waits */
    float lr, val_loss; /* val_loss NaN when validation was not due */
    bool skipped;       /* no update: a rank saw a non-finite loss or gradient norm ... */
    bool overflow;      /* ... an fp16 overflow: finite loss, Inf/NaN gradients (scaled) */
    double loss_scale;  /* the scale this step's backward used (0: no loss scaling) */
    int skip_rank;      /* ... the lowest such world rank (-1: none) */
    double stall_s;     /* the longest stalled wait of any rank (0: none; see agree_skip) */
    /* mixture of experts (moe_layers 0: a dense model): the step's auxiliary losses (means over
     * layers and micro-batches), the assignments dropped, and the load (an expert's largest
     * assignments over the mean, summed over the dp ranks) of each layer (moe_load, the
     * trainer's) and the largest */
    int moe_layers;
    double moe_aux, moe_z, moe_dropped, moe_load_max;
    const double *moe_load;
};

/* One optimizer step (collective): the step's micro-batches through the pipeline schedule, the
 * tied-embedding and data-parallel gradient reductions, the global gradient norm, clipping and
 * AdamW (ZeRO all-gather included). Fills s except val_loss. */
void l3d_trainer_step(struct l3d_trainer *t, int step, struct l3d_step_stats *s);
/* Whether this step's update is skipped on every rank: the lowest world rank that passed bad (a
 * non-finite loss or gradient norm; mixed precision: an fp16 overflow), -1 when none did, the
 * same on every rank. One MAX over the world, which also carries each rank's longest wait since
 * the previous call: a wait of 1 s or more that took half that time is a stall, printed by the
 * rank that waited (what it waited on) and returned in *stall_s (the largest of any rank, 0:
 * none). Collective over the world. */
int l3d_trainer_agree_skip(struct l3d_trainer *t, bool bad, double *stall_s);
/* The validation loss after `step` (0-based) when it is due, else NaN (collective). */
void l3d_trainer_validate(struct l3d_trainer *t, int step, struct l3d_step_stats *s);

/* ZeRO-3 from the seed (no --resume, no --init-from): each rank initialises its own range
 * (l3d_dp_zero3_init_weights), so no rank stages a whole fp32 copy at the start. */
static inline bool l3d_train_zero3_from_seed(const struct l3d_train_config *tc) {
    return tc->layout.zero == 3 && !tc->resume && !tc->init_from;
}

/* Before any large allocation (collective): the layout's planned bytes on each rank
 * (l3d_plan_memory) against the memory available to it (MemAvailable or the cgroup's room, shared
 * by the node's ranks; L3D_TEST_MEM_AVAILABLE overrides the node's bytes in tests); an
 * L3D_ERR_OOM with the figures and the layouts of the same ranks that fit, unless
 * tc->ignore_memory_check (src/train/memory.c). */
l3d_status l3d_train_memory_check(const struct l3d_train_config *tc, struct l3d_comm *world,
                                  double *figure, bool *report);

/* The node of every rank (l3d_comm_nodes); L3D_ERR_LAYOUT on every rank when a TP group spans
 * nodes, unless tc->allow_cross_node_tp (then a warning from the lead). With more than one node
 * the lead prints where the TP, PP and DP groups lie (src/train/placement.c). Collective. */
l3d_status l3d_train_placement(const struct l3d_train_config *tc, struct l3d_comm *world,
                               bool lead);

/* The lead rank's description of the run (model, layout, pipeline, batch, memory). */
void l3d_train_report_start(const struct l3d_trainer *t, const struct l3d_train_result *res);
/* The step's log line (lead, unless --quiet), metrics.jsonl line and TensorBoard event (lead;
 * L3D_ERR_IO naming the file and errno when one cannot be written: the caller agrees). */
l3d_status l3d_train_report_step(const struct l3d_trainer *t, int step,
                                 const struct l3d_step_stats *s);
/* One line to the open metrics file f (path for messages), written and flushed, checked; on a
 * failure the part written is truncated away. */
l3d_status l3d_train_metrics_write(FILE *f, const char *path, const char *line);
/* The run directory (collective; rank 0 decides): refuses an --out or checkpoint directory that
 * holds an earlier run unless --resume (continuing it: the flags' model must be the run's) or
 * --overwrite (its files removed first), refuses outputs that are inputs, writes out/run and sets
 * *id, the run's id (the earlier run's when resuming), on every rank (src/train/rundir.c). */
l3d_status l3d_train_run_claim(const struct l3d_train_config *tc, struct l3d_comm *world,
                               uint64_t *id, bool *report);
/* The medians of steps [start, end) into res, the peak measured again when the model outran it
 * (collective). */
void l3d_train_report_result(struct l3d_trainer *t, int start, int end,
                             struct l3d_train_result *res);
/* --out's model.bin and Hugging Face folder, written by rank 0 a bounded unit of rows at a time
 * from the fp32 views (views_begin with rows: a streamed chunk's view has no parameters, its
 * rows are pulled from the DP owners); collective over every rank (src/train/out.c). */
l3d_status l3d_train_save_out(struct l3d_trainer *t);
/* The lead rank's final summary. */
void l3d_train_report_end(const struct l3d_trainer *t, const struct l3d_train_result *res);

#endif
