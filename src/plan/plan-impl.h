/*
 * The planner's parts (private to src/plan). l3d_plan_evaluate (plan.c) checks a layout
 * (check.c), splits the layers into stages (partition.c) and, for each pipeline rank,
 *
 *   l3d_plan_rank_chunks(m, lay, layers, start, r, slots, mm, fp32, &shapes, ch); // memory.c
 *   l3d_plan_rank_memory(m, run, lay, ch, r, mm, &mem);    // memory.c: the rank's bytes
 *   l3d_plan_rank_time(&x, ch, r, &shapes, vt, &sum);       // time.c: one micro-batch's seconds
 *
 * then runs the stages' times on the schedule's timeline (l3d_plan_timeline, timeline.c) and adds
 * the step's DP communication, embedding sync and optimizer (l3d_plan_step_time, step.c).
 * l3d_plan_search (search.c) evaluates its layouts with a struct l3d_plan_cache (cache.c), which
 * keeps what they share.
 *
 * Inside the planner a model's maxT is the planned sequence: the entry points (l3d_plan_evaluate,
 * l3d_plan_memory, l3d_plan_check) plan the layout's seq with a copy of the model whose maxT is
 * that sequence (l3d_plan_view), a ring rank's shorter still (l3d_plan_cp_local); the model's own
 * maxT, its context, sizes the learned position table.
 *
 * Notation as in Korthikanti et al. 2022 and Narayanan et al. 2021: s sequence length, b
 * micro-batch, h hidden size, a heads, L layers, V vocabulary, t TP size, p PP size, d DP size,
 * v model chunks per pipeline rank, m micro-batches per step, e bytes per activation element.
 */
#ifndef LLM3D_PLAN_IMPL_H
#define LLM3D_PLAN_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "llm3d/model.h"
#include "llm3d/pipeline.h"
#include "llm3d/plan.h"

/* ---- the run ---------------------------------------------------------------------------- */

/* The DP bucket of a layout that gives none: PyTorch DDP's default bucket_cap_mb of 25. */
#define L3D_PLAN_BUCKET_BYTES 25000000
/* What a layout left at 0 filled (include/llm3d/plan.h: seq the model's context, threads 1, the
 * global batch micro_batch x dp x accum, the bucket L3D_PLAN_BUCKET_BYTES) into *lo, and the model
 * planned at that sequence (maxT = lo->seq) into *ms. */
void l3d_plan_view(const struct l3d_model_spec *m, const struct l3d_layout *lay,
                   struct l3d_model_spec *ms, struct l3d_layout *lo);

/* The ranks ZeRO shards over, as the trainer builds them (src/train/train.c): the data-parallel
 * group (dp x cp in a ring rank's layout, l3d_plan_cp_local), or with expert parallelism and
 * ZeRO >= 1 the dp / ep ranks holding the same experts (the expert-data-parallel group: the other
 * tensors' slices are summed over the EP group first, include/llm3d/ep.h). */
static inline int l3d_plan_zero_group(const struct l3d_layout *lay) {
    return lay->ep > 1 && lay->zero > 0 ? lay->dp / lay->ep : lay->dp;
}

/* llm3d's own trainer (its allocation plan) rather than Megatron-LM's mixed precision */
static inline bool l3d_plan_trainer(const struct l3d_plan_run *run) {
    return run->precision.param == L3D_F32 || run->llm3d;
}

/* ZeRO-3 against the run's trainer (src/plan/check.c): llm3d's shards the parameters too;
 * Megatron-LM's distributed optimizer (16-bit runs under --trainer megatron, a GPU profile's
 * default) does not. L3D_ERR_LAYOUT with the sentence naming --zero 3, the rule and what to give. */
l3d_status l3d_plan_zero_check(const struct l3d_profile *prof, const struct l3d_plan_run *run,
                               int zero);

/* The peak of the run's products: llm3d's mixed precision on a CPU without 16-bit products runs
 * them as fp32 products of widened operands (docs/DESIGN.md), at the fp32 peak. */
static inline double l3d_plan_peak(const struct l3d_profile *prof,
                                   const struct l3d_plan_run *run) {
    double p = l3d_profile_peak(prof, run->precision.param);
    return p <= 0 && run->llm3d ? prof->peak_fp32 : p;
}

/* Bytes per element come from l3d_dtype_size, the function the trainer sizes its buffers with. */
static inline double l3d_plan_bytes(enum l3d_dtype t) { return (double)l3d_dtype_size(t); }

/* the element type of the run's weights, gradients and activations */
static inline enum l3d_dtype l3d_plan_dtype(enum l3d_dtype p) {
    return p == L3D_F32 ? L3D_F32 : p == L3D_BF16 ? L3D_BF16 : L3D_F16;
}

/* The profile whose figures the run's kernels reach (plan.c). */
const struct l3d_profile *l3d_plan_run_profile(const struct l3d_profile *prof,
                                               const struct l3d_plan_run *run,
                                               struct l3d_profile *tmp);

/* ---- chunks and their shapes (memory.c) --------------------------------------------------- */

/* Parameters a TP rank of t (and EP rank of ep) holds: one dense layer's, one mixture-of-experts
 * layer's and of those its E / ep experts', the first stage's embeddings, the last stage's final
 * norm and untied head (model.c). */
struct l3d_plan_counts {
    double layer, moe_layer, experts, embed, head;
};
void l3d_plan_param_counts(const struct l3d_model_spec *m, int t, int ep,
                           struct l3d_plan_counts *o);

/* One chunk of a pipeline rank: its shard (TP rank 0, the one adding row biases) and how many
 * micro-batches' activations it keeps. */
struct l3d_plan_chunk {
    struct l3d_shard sh;
    int64_t n;        /* parameters */
    int64_t n_gpt;    /* in the trainer's tensor table (l3d_gpt_plan_tensors) */
    int64_t n_exp;    /* of which the experts' (this EP rank's E / ep of them) */
    int64_t slot, nonlayer; /* one layer's matrices, the tensors outside the layers */
    int slots;
    int wslots;       /* micro-batches between B and W (zb-h1's stash) */
    bool head_once;   /* F to B one at a time (l3d_pp_fb_slots 1): a split keeps one head */
    bool first, last; /* first / last virtual stage */
    int shape;        /* its entry in the evaluation's shape memo, -1 if none */
};

/* Seconds of one micro-batch through a chunk or a rank, by part. */
struct l3d_plan_parts {
    double gemm, attn, elem, tp, p2p, rec, total;
    double cp;  /* the context-parallel ring's transfers not hidden behind attention */
    double a2a; /* expert parallelism's all-to-all exchanges (dispatch and combine) */
    double bwd; /* backward part (what DP communication can hide behind) */
    double wgt; /* its weight-gradient products (zb-h1's W; part of bwd) */
};
/* to += w from, every part */
static inline void l3d_plan_parts_add(struct l3d_plan_parts *to,
                                      const struct l3d_plan_parts *from, double w) {
    to->gemm += w * from->gemm;
    to->attn += w * from->attn;
    to->elem += w * from->elem;
    to->tp += w * from->tp;
    to->p2p += w * from->p2p;
    to->cp += w * from->cp;
    to->a2a += w * from->a2a;
    to->rec += w * from->rec;
    to->total += w * from->total;
    to->bwd += w * from->bwd;
    to->wgt += w * from->wgt;
}

/* Chunks of the same shape (layers, first, last) have the same sizes and time: a layout's
 * thousands of chunks come in a few shapes (the partition differs by at most a layer or so
 * between stages), so each shape is sized and timed once. */
#define L3D_PLAN_SHAPES 8
struct l3d_plan_shapes {
    int n;
    struct {
        int layers;
        bool first, last, timed;
        struct l3d_shard sh;
        int64_t n, n_gpt, n_exp, slot, nonlayer;
        struct l3d_plan_parts t; /* without p2p */
    } e[L3D_PLAN_SHAPES];
};

/* The v chunks of pipeline rank r (out[k] is chunk k, virtual stage k pp + r): their shards,
 * sizes and micro-batches kept (sched: the trainer's schedule, its slots and W slots [r v + k],
 * when fp32; else by the schedule kind, W slots as many as slots). start[vs]: the first layer of virtual stage vs (prefix sums of layers). */
void l3d_plan_rank_chunks(const struct l3d_model_spec *m, const struct l3d_layout *lay,
                          const int *layers, const int64_t *start, int r,
                          const struct l3d_pp_schedule *sched,
                          int64_t mm, bool fp32, struct l3d_plan_shapes *memo,
                          struct l3d_plan_chunk *out);
/* The bytes of pipeline rank r, whose chunks are ch. */
void l3d_plan_rank_memory(const struct l3d_model_spec *m, const struct l3d_plan_run *run,
                          const struct l3d_layout *lay, const struct l3d_plan_chunk *ch,
                          int r, int64_t mm, struct l3d_plan_mem *mem);

/* ---- time (time.c, step.c) ---------------------------------------------------------------- */

/* What the times of one layout are computed with: its rates and links. */
struct l3d_plan_tctx {
    const struct l3d_model_spec *m;
    const struct l3d_profile *prof;
    const struct l3d_layout *lay;
    double rate;    /* peak FLOP/s of one rank (its threads, shared when oversubscribed) */
    double threads; /* devices per rank for the GEMM efficiency */
    double bw;      /* element-wise bytes/s of one rank (the median kernel: products' operands,
                     * the head's loss, the embedding) */
    double bw_k[L3D_KERN_N]; /* bytes/s of one rank in each measured element-wise kernel */
    double e;       /* bytes per activation element */
    double tp_e;    /* bytes per element of the TP partial sums: e, or 4 (--tp-reduce-dtype fp32) */
    double ntok;    /* tokens in a micro-batch, b s */
    double cal;     /* the profile's gemm_calibration when the run asks for it, else 1 */
    double share;   /* of a device a rank's thread has: < 1 on an oversubscribed node */
    double tp_bw, tp_lat; /* the link of a TP group */
    int cp;         /* context parallelism: m's maxT is a rank's T / cp rows (l3d_plan_cp_local) */
    double cp_bw, cp_lat; /* the link between ring neighbours (tp ranks apart) */
    double cp_e;    /* bytes per element of the ring's dK|dV sums (4 with --cp-reduce-dtype fp32) */
    bool fp32;      /* llm3d's trainer (l3d_plan_trainer) */
    bool flash;     /* fused attention */
    bool dropout;   /* attention dropout (Megatron-LM's core attention; not llm3d's trainer) */
};
void l3d_plan_tctx_init(struct l3d_plan_tctx *x, const struct l3d_model_spec *m,
                        const struct l3d_profile *prof, const struct l3d_plan_run *run,
                        const struct l3d_layout *lay);

/* Context parallelism: the model and layout a ring rank is planned with: *mc with maxT / cp (its
 * rows of each sequence), *lo with dp x cp and cp 1 (the gradient reduction's and ZeRO's group);
 * the micro-batches a step stay the caller's (from the layout's own dp). Returns cp (>= 1); with
 * cp 1 copies of m and lay. */
int l3d_plan_cp_local(const struct l3d_model_spec *m, const struct l3d_layout *lay,
                      struct l3d_model_spec *mc, struct l3d_layout *lo);
/* The ring's buffers of each of the rank's chunks (l3d_cp_bytes) added to mem (other, total);
 * mc and lay the local ones. Nothing when cp is 1. */
void l3d_plan_cp_ring_memory(const struct l3d_model_spec *mc, const struct l3d_plan_run *run,
                             const struct l3d_layout *lay, const struct l3d_plan_chunk *ch,
                             int cp, struct l3d_plan_mem *mem);
/* Sets x's ring (after l3d_plan_tctx_init on the local layout): cp ranks, tp apart. */
void l3d_plan_tctx_cp(struct l3d_plan_tctx *x, int cp, int tp);

/* One all-to-all of the EP group (x->lay->ep ranks, consecutive DP ranks: tp cp pp apart on the
 * grid) in which each rank holds n bytes for all of them, its own share staying (time.c). */
double l3d_plan_all_to_all(const struct l3d_plan_tctx *x, double n);

/* A mixture of experts' forward FLOPs a token in one MoE layer's block: the router (E outputs),
 * its K experts and the shared ones, each an MLP of width moe.ffn (plan.c). */
double l3d_plan_moe_flops(const struct l3d_model_spec *m);

/* Ring all-reduce of n bytes over g ranks, and the link between ranks lo and hi (time.c). */
double l3d_plan_all_reduce(double n, int g, double bw, double lat);
void l3d_plan_link(const struct l3d_profile *p, int64_t lo, int64_t hi, int senders, double *bw,
                   double *lat);

/* One micro-batch through the chunks ch of pipeline rank r, forward and backward, summed in *sum;
 * when vt, each chunk's forward, backward and receives in vt (4 pp v, l3d_plan_timeline). */
void l3d_plan_rank_time(const struct l3d_plan_tctx *x, const struct l3d_plan_chunk *ch, int r,
                        struct l3d_plan_shapes *memo, double *vt, struct l3d_plan_parts *sum);

/* What the pipeline ranks add up to. */
struct l3d_plan_ranks {
    double t_max, t_sum;      /* a micro-batch on the slowest rank; on all of them */
    double bwd_of_max;        /* the backward part of t_max */
    double n_max;             /* parameters of the largest rank */
    double n_exp;             /* of which its experts' (expert parallelism's own groups) */
    struct l3d_plan_parts worst, all; /* the slowest rank's parts; every rank's summed */
    struct l3d_plan_mem mem;  /* the fullest rank's bytes */
};
/* The step's time: the pipeline phase `pipe` of mm micro-batches over the ranks rk, then DP
 * communication, the tied embedding's sum and the optimizer (step.c). */
void l3d_plan_step_time(const struct l3d_plan_tctx *x, const struct l3d_plan_run *run,
                        const struct l3d_plan_ranks *rk, double pipe, int64_t mm,
                        struct l3d_plan_time *T);

/* ---- the pipeline's timeline (timeline.c) ------------------------------------------------- */

/* Schedules of a few (kind, p, v, m), kept across the layouts of a search. */
#define L3D_PLAN_SCHEDULES 4
struct l3d_plan_schedules {
    bool have[L3D_PLAN_SCHEDULES];
    enum l3d_pp_kind kind[L3D_PLAN_SCHEDULES];
    int p[L3D_PLAN_SCHEDULES], v[L3D_PLAN_SCHEDULES], m[L3D_PLAN_SCHEDULES];
    struct l3d_pp_schedule s[L3D_PLAN_SCHEDULES];
    int next;
};
/* The short schedules the timeline runs, and the last timelines' stage times (4 S) and results:
 * layouts that differ in the ZeRO stage alone (the search tries the recomputation and SP variants
 * in between) share them. */
#define L3D_PLAN_TIMELINES 8
struct l3d_plan_timelines {
    struct l3d_plan_schedules pc;
    struct {
        double *vt;
        int S, v;
        enum l3d_pp_kind kind;
        int64_t mm;
        double pipe;
    } tl[L3D_PLAN_TIMELINES];
    int next;
};
void l3d_plan_timelines_free(struct l3d_plan_timelines *tc);
/* The pipeline phase of mm micro-batches with the stage times vt (pp v forwards, backwards,
 * receives of the input, receives of the output's gradient, W of a split backward): a timeline's result kept in tc, else
 * the schedule's timeline (l3d_plan_pipe_phase), kept there. Takes vt (kept in tc or freed); tc
 * NULL keeps nothing. -1 when neither is possible. */
double l3d_plan_timeline(struct l3d_plan_timelines *tc, enum l3d_pp_kind kind, int p, int v,
                         int64_t mm, double *vt);

/* ---- what a search's layouts share (cache.c) ---------------------------------------------- */

#define L3D_PLAN_PARTITIONS 32
struct l3d_plan_cache {
    int S[L3D_PLAN_PARTITIONS];      /* stage partitions by stage count and the ends given */
    int first[L3D_PLAN_PARTITIONS], last[L3D_PLAN_PARTITIONS];
    const char *given[L3D_PLAN_PARTITIONS];
    int *layers[L3D_PLAN_PARTITIONS];
    int next;
    bool have_sched;                 /* the trainer's schedule of the last layout */
    enum l3d_pp_kind kind;
    int p, v;
    int64_t mm;
    struct l3d_pp_schedule sched;
    struct l3d_plan_timelines tl;
};
void l3d_plan_cache_free(struct l3d_plan_cache *cc);
/* The layers of each of layout lay's S stages (l3d_plan_stage_layers): from the cache, else
 * computed (and kept there when cc; else in *owned, for the caller to free). */
l3d_status l3d_plan_cache_layers(struct l3d_plan_cache *cc, const struct l3d_model_spec *m,
                                 const struct l3d_plan_run *run, const struct l3d_layout *lay,
                                 int S, int **owned, const int **layers);
/* The trainer's schedule of (kind, p, v, mm) in *sched: the cache's, else built (into the cache
 * when cc, else into *own, for the caller to free). */
l3d_status l3d_plan_cache_schedule(struct l3d_plan_cache *cc, enum l3d_pp_kind kind, int p, int v,
                                   int64_t mm, struct l3d_pp_schedule *own,
                                   const struct l3d_pp_schedule **sched);

/* l3d_plan_evaluate with a search's cache (NULL: none); prof already the run's
 * (l3d_plan_run_profile) */
l3d_status l3d_plan_evaluate_in(const struct l3d_model_spec *m, const struct l3d_profile *prof,
                                const struct l3d_plan_run *run, const struct l3d_layout *lay,
                                struct l3d_plan_result *r, struct l3d_plan_cache *cc);

#endif
