/*
 * llm3d run spec: the one description of a training run's model, layout and precision that the
 * trainer, bench, the planner, the memory check and checkpoints share (docs/DESIGN.md, "The run
 * spec"). The command-line flags that set it are one table (src/cli/flags.c); the rules every
 * consumer relies on are one validator, which returns every violated rule with a message each.
 *
 *   struct l3d_run_spec s;
 *   l3d_run_spec_defaults(&s);                      // fp32, 1 x 1 x 1, B 4, T 64
 *   l3d_model_preset(&s.model, "d12");
 *   s.layout.tp = 2; s.layout.pp = 2; s.layout.zero = 1;
 *   struct l3d_spec_errors e;
 *   if (l3d_spec_check(&s, &(struct l3d_spec_ctx){.world = 8}, &e) != L3D_OK)
 *       for (int i = 0; i < e.n; i++) puts(e.msg[i]);   // one line a broken rule
 *   struct l3d_param_bytes b;
 *   l3d_param_bytes(&s.precision, s.layout.zero, 2, &b);  // b.total: 16 + ... bytes / param
 */
#ifndef LLM3D_SPEC_H
#define LLM3D_SPEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llm3d/core.h"
#include "llm3d/model.h"

/* ---- layout --------------------------------------------------------------------------------- */

/* The most layers --zero3-prefetch posts ahead: each holds one more layer's parameters (the flag's
 * bound in --help and its parser, and l3d_spec_check's) */
#define L3D_ZERO3_MAX_PREFETCH 64

/* The pipeline schedule (include/llm3d/pipeline.h builds it; --pp-schedule names it) */
enum l3d_pp_kind { L3D_PP_GPIPE, L3D_PP_1F1B, L3D_PP_INTERLEAVED, L3D_PP_ZBH1, L3D_PP_ZBV };

/* How a run is laid out on its ranks and how a step is cut into micro-batches. */
struct l3d_layout {
    int tp, cp, pp, dp;       /* tensor, context, pipeline, data parallel sizes; dp 0: world /
                               * (tp cp pp). cp > 1: each sequence split over cp ranks (ring
                               * attention, include/llm3d/cp.h) */
    int ep;                   /* expert parallelism: the MoE experts split over ep ranks of each
                               * DP group (consecutive dp ranks; 1: every rank holds all; 0
                               * reads as 1, as l3d_layout_resolve makes it) */
    int v;                    /* model chunks per pipeline rank (interleaved schedule when > 1) */
    enum l3d_pp_kind schedule;
    bool schedule_implied;    /* interleaved because v > 1, not asked for (said at start-up) */
    const char *pp_layers;    /* "a,b,..." layers of each virtual stage, or NULL: balanced */
    int pp_first, pp_last;    /* layers of the first / last virtual stage (0: balanced), the
                               * others' split evenly (Megatron-Core's --decoder-first- / -last-
                               * pipeline-num-layers: Llama 3 405B's shorter end stages) */
    int micro_batch;          /* sequences per micro-batch on each DP rank (--batch) */
    int seq;                  /* tokens per sequence (--seq-len) */
    int accum;                /* micro-batches per step (--grad-accum); see global_batch */
    int64_t global_batch;     /* > 0: sequences per step, accum = global_batch / (B dp) */
    int zero;                 /* ZeRO stage over the DP group: 0, 1 (optimizer state), 2 (and
                               * gradients), 3 (and parameters, gathered layer by layer) */
    int zero3_prefetch;       /* ZeRO-3: layers whose all-gather is posted ahead (1; 0 to
                               * L3D_ZERO3_MAX_PREFETCH) */
    bool zero3_prefetch_set;  /* --zero3-prefetch given (refused without --zero 3) */
    bool sp;                  /* sequence parallelism over the TP group (Korthikanti et al. 2022) */
    enum l3d_recompute recompute;
    int xent_chunk;           /* rows of the head's chunked cross-entropy (--xent-chunk; 0: the
                               * default, unchunked) */
    int threads;              /* OpenMP threads per rank (CPU); 0: the default */
    size_t bucket_bytes;      /* data-parallel gradient reduction pieces */
};

/* The micro-batches per step: accum, or global_batch / (micro_batch dp) when that is given (0
 * when it does not divide: l3d_spec_check says so). dp must be resolved. */
int64_t l3d_layout_accum(const struct l3d_layout *l);

/* Fills what the flags left open, once, for `world` ranks: dp 0 becomes world / (tp cp pp), cp and
 * v below 1 become 1, accum follows from global_batch, and one stage runs 1F1B. Every consumer then
 * reads the layout as it is (the trainer, its memory check, checkpoints, the runtime's grid).
 * L3D_ERR_LAYOUT naming the flags, their values, the world size, its divisors and what to do when
 * the grid does not fit the world; L3D_ERR_ARG when the global batch does not split. The model's
 * and the batch's other rules are l3d_spec_check's: l3d_spec_resolve runs both. */
l3d_status l3d_layout_resolve(struct l3d_layout *l, int64_t world);

/* ---- precision ------------------------------------------------------------------------------ */

/* fp16 loss scaling (Micikevicius et al. 2018; Megatron-LM's DynamicGradScaler and defaults). */
struct l3d_loss_scaling {
    double fixed;             /* > 0: a static scale instead of the dynamic one */
    double init, min, backoff, growth;
    int window, hysteresis;
    const char *given;        /* a loss-scaling flag given ("hysteresis"), or NULL: outside
                               * fp16 an error */
};

/* The types a run computes, accumulates and communicates in. llm3d's trainer: param = act (fp32,
 * or bf16/fp16 mixed precision), grad fp32 (main_grad), reduce fp32 or 16-bit. The planner also
 * describes Megatron-LM's mixed precision, whose gradients are 16-bit (grad = param). */
struct l3d_precision {
    enum l3d_dtype param;     /* parameters (the working copy the products read) */
    enum l3d_dtype act;       /* activations and the TP / PP messages (= param in llm3d) */
    enum l3d_dtype grad;      /* gradient accumulation over micro-batches */
    enum l3d_dtype reduce;    /* what the DP gradient reduction moves */
    /* --tp-reduce-dtype fp32: with a 16-bit param, the TP partial sums made, summed and rounded
     * in fp32 (src/model/tpsum.c); false (model): in param, as Megatron-LM */
    bool tp_reduce_fp32;
    /* --cp-reduce-dtype fp32: with 16-bit activations the context-parallel ring's partial
     * outputs, their merges and the dK|dV sums (and what travels for them) in fp32, rounded to
     * the model's type once (src/parallel/cp.c); false ("model"): in the model's type */
    bool cp_fp32;
    struct l3d_loss_scaling ls;
};

/* fp32, or (param 16-bit) "bf16" / "fp16": the name of the precision --precision gives. */
const char *l3d_precision_name(const struct l3d_precision *p);
/* --precision NAME: fp32, bf16 or fp16 into p (param and act; grad fp32, reduce unchanged).
 * L3D_ERR_ARG naming the choices otherwise. */
l3d_status l3d_precision_parse(const char *name, struct l3d_precision *p);
/* --precision NAME of a command that keeps only the parameter type (generate, convert): what
 * l3d_precision_parse accepts, its param into *param; its L3D_ERR_ARG otherwise. */
l3d_status l3d_precision_param_parse(const char *name, enum l3d_dtype *param);
/* Whether p is llm3d's trainer's allocation plan (fp32 gradients and, in mixed precision, fp32
 * master weights) rather than Megatron-LM's (16-bit gradients). */
bool l3d_precision_llm3d(const struct l3d_precision *p);

/* Bytes a rank holds per parameter of its model shard in state that scales with parameters
 * (parameters, gradients, optimizer), for ZeRO stage `zero` over `dp` replicas: the one formula
 * the start-up report, the memory check and the planner use.
 *   llm3d (fp32 gradients): params |param| (2 or 4), grads 4, AdamW m and v 8 plus fp32 master
 *   weights 4 when the parameters are 16-bit;
 *   Megatron-LM mixed precision (ZeRO paper, Rajbhandari et al. 2020, sec. 3.1, K = 12): params 2,
 *   grads 2, optimizer 12 (master weights, m, v).
 * ZeRO-1 divides the optimizer by dp, ZeRO-2 the gradients too. The *_full fields are the same
 * before the division. */
struct l3d_param_bytes {
    double params, grads, optimizer, total;
    double params_full, grads_full, optimizer_full;
};
void l3d_param_bytes(const struct l3d_precision *p, int zero, int dp, struct l3d_param_bytes *b);

/* ---- the model ------------------------------------------------------------------------------ */

/* Presets (src/spec/presets.c): tiny (tests), d6, d12 = gpt2 (124M), d24 = gpt2-medium (350M),
 * d36 = gpt2-large (774M), d48 = gpt2-xl (1.5B), GPT-2's V = 50257 and context 1024; the
 * Frontier study's frontier-22b, -175b, -1t (Dash et al. 2023), gpt3-175b (Brown et al. 2020),
 * and Megatron-LM 2021's weak-scaling table megatron-1.7b ... megatron-1t (Narayanan et al. 2021,
 * Table 1), context 2048. m is reset, its name set. */
l3d_status l3d_model_preset(struct l3d_model_spec *m, const char *name);
const char *l3d_model_preset_names(void);

/* ---- the run -------------------------------------------------------------------------------- */

struct l3d_run_spec {
    struct l3d_model_spec model;
    struct l3d_layout layout;
    struct l3d_precision precision;
};

/* fp32, tp = pp = cp = 1, dp 0 (inferred), v 1, 1F1B, B 4, T 64, accum 1, ZeRO-0, no SP, no
 * recomputation, 4 MiB buckets, Megatron-LM's loss-scaling defaults; the model zeroed (a preset
 * or sizes fill it). */
void l3d_run_spec_defaults(struct l3d_run_spec *s);

/* What the spec is checked for. */
struct l3d_spec_ctx {
    int64_t world;            /* ranks (x threads when threads_in_world); 0: dp must be given */
    bool world_unknown;       /* before the ranks are known: the rules that need them wait */
    bool threads_in_world;    /* the planner's devices count threads (CPU cores) */
    bool train;               /* llm3d's trainer will run it (its own limits, e.g. a 4C MLP) */
};

#define L3D_SPEC_MAX_ERRORS 16
struct l3d_spec_errors {
    int n;                    /* violated rules (at most L3D_SPEC_MAX_ERRORS kept) */
    l3d_status status[L3D_SPEC_MAX_ERRORS]; /* L3D_ERR_ARG (a flag's value) or L3D_ERR_LAYOUT */
    char msg[L3D_SPEC_MAX_ERRORS][320];     /* each names the flag(s), the value(s) and the rule */
};

/* Checks every rule of the spec for ctx and returns the first violation's status (its message
 * also set as l3d_error's, all of them joined by "; "), L3D_OK when none; e (may be NULL) gets
 * every violated rule. dp 0 is inferred from ctx->world for the checks only. */
l3d_status l3d_spec_check(const struct l3d_run_spec *s, const struct l3d_spec_ctx *ctx,
                          struct l3d_spec_errors *e);
/* The same for some of the parts: the planner checks the model and precision once and each
 * layout it considers on its own. */
enum { L3D_SPEC_MODEL = 1, L3D_SPEC_LAYOUT = 2, L3D_SPEC_PRECISION = 4, L3D_SPEC_ALL = 7 };
l3d_status l3d_spec_check_parts(const struct l3d_run_spec *s, const struct l3d_spec_ctx *ctx,
                                unsigned parts, struct l3d_spec_errors *e);
/* The validator, then l3d_layout_resolve of s->layout for ctx->world ranks (the grid first, so a
 * grid that does not fit the world is the one message); s is changed only when both pass. */
l3d_status l3d_spec_resolve(struct l3d_run_spec *s, const struct l3d_spec_ctx *ctx,
                            struct l3d_spec_errors *e);

#endif
