/*
 * llm3d planner: memory and step time of a training layout on a system, and the search for the
 * fastest layout that fits.
 *
 *   struct l3d_model_spec model;
 *   l3d_plan_model_preset(&model, "frontier-175b");          // or a GPT-2 size, or explicit
 *   struct l3d_profile prof;
 *   l3d_profile_load(&prof, "profiles/frontier.prof");       // a readable text file
 *   struct l3d_plan_run run = l3d_plan_run_default();
 *   run.devices = 128; run.precision.param = run.precision.act = L3D_F16;
 *   struct l3d_layout lay = {.tp = 4, .pp = 16, .dp = 2, .micro_batch = 1, .v = 1, .zero = 1,
 *                            .recompute = L3D_RECOMPUTE_FULL, .global_batch = 640};
 *   struct l3d_plan_result r;
 *   l3d_plan_evaluate(&model, &prof, &run, &lay, &r);        // r.mem.total, r.time.step, r.hfu
 *   struct l3d_plan_fixed fixed = l3d_plan_fixed_none();
 *   fixed.layout.global_batch = 640;                          // the run's, in every layout
 *   l3d_plan_search(&model, &prof, &run, &fixed, best, 10, &n_best, &stats);
 *
 * Two regimes share the time model and differ in what memory holds:
 *   - precision fp32 is llm3d's own trainer: parameters, gradients and AdamW moments in fp32, its
 *     activation plan (l3d_gpt_act_bytes) and its schedules' micro-batches in flight, so the
 *     prediction is the trainer's accounted allocation, exactly (tests/cli/plan.sh);
 *   - fp16 / bf16 is Megatron-LM-style mixed precision: 16-bit weights and gradients, fp32 master
 *     weights and Adam moments (ZeRO paper, Rajbhandari et al. 2020, sec. 3.1: 2 + 2 + 12 bytes a
 *     parameter), 16-bit activations by Korthikanti et al. 2022, Table 2.
 *
 * Time of one step (every formula names its source at its definition in src/plan/plan.c):
 *   per micro-batch and pipeline stage: each matrix product at the efficiency of its own (M, N, K)
 *   (the profile's curve, wave quantization, a roofline floor), the attention core at attn_eff,
 *   element-wise kernels at kernel_bw_eff of the memory bandwidth, what recomputation recomputes,
 *   TP collectives on the link the TP group sits on (less the profile's tp_overlap), p2p;
 *   the pipeline: the schedule's actions on a timeline with each stage's times
 *   (l3d_plan_pipe_phase; for equal stages (m + (p - 1)/v) t, the bubble (p - 1)/(v m) of
 *   Narayanan et al. 2021, sec. 2.2);
 *   then DP gradient communication (less what the backward hides, where the profile overlaps it),
 *   the tied-embedding all-reduce and the optimizer.
 */
#ifndef LLM3D_PLAN_H
#define LLM3D_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llm3d/core.h"
#include "llm3d/model.h"
#include "llm3d/pipeline.h"
#include "llm3d/spec.h"

/* ---- model ---------------------------------------------------------------------------- */

/* The planner's model is the run spec's (include/llm3d/spec.h, struct l3d_model_spec; presets:
 * l3d_model_preset), with two readings of its own: maxT is the sequence length planned (a step's
 * sequences fill the context; the trainer's memory check passes its --seq-len as maxT and adds
 * the position rows beyond it), and ffn the MLP width (any, for Megatron-LM's runs; 4C in
 * llm3d's trainer). */
/* Checks the sizes for the planner (the run spec's model rules, and a model of at most 10^15
 * parameters); messages name the flags. */
l3d_status l3d_plan_model_check(const struct l3d_model_spec *m);
/* The trainer's model of the same spec (finished: Vp and the defaults set). */
struct l3d_model_spec l3d_plan_model_gpt(const struct l3d_model_spec *m);
/* Parameters of the full model (tied embedding counted once, position embedding included). */
int64_t l3d_plan_model_params(const struct l3d_model_spec *m);

/* ---- system profile ------------------------------------------------------------------- */

#define L3D_PROFILE_MAX_EFF 32
/* llm3d's 16-bit kernels on a device without 16-bit products (a CPU without AVX512-BF16: the
 * operands widened around the fp32 product, docs/DESIGN.md), measured by llm3d bench
 * --calibrate: the optional keys gemm_eff_bf16, attn_eff_bf16, gemm_thread_eff_bf16,
 * kernel_bw_eff_bf16 (and _fp16). n_eff 0: not in the profile (the fp32 figures are used). */
/* The element-wise kernels whose bandwidth a profile may give one by one (optional key
 * kernel_bw_effs = layernorm:F gelu:F residual:F adamw:F, and kernel_bw_effs_bf16 / _fp16):
 * on a CPU, LayerNorm and GELU are bound by their arithmetic (exp, rsqrt), a residual add and
 * AdamW by memory, up to ~4x apart; one median fits neither. */
enum l3d_kern { L3D_KERN_LAYERNORM, L3D_KERN_GELU, L3D_KERN_RESIDUAL, L3D_KERN_ADAMW, L3D_KERN_N };
const char *l3d_kern_name(enum l3d_kern k);

/* The weight-gradient product of a linear layer (dW = x^T dy, its output the weight, its
 * reduction over the micro-batch's tokens), optional keys gemm_eff_wgrad and gemm_eff_wgrad_T:
 * `tokens:fraction` points. Where a backend's weight gradient depends on the tokens and not the
 * FLOPs (oneDNN's bf16 product accumulating into the fp32 main_grad: 0.39-0.43 of the peak at
 * 128 tokens, 0.74-0.77 at 1024, whatever the weight's shape: docs/BENCHMARKS.md), a
 * FLOPs curve cannot describe it. With it, gemm_eff (gemm_eff_T) is of the forward and
 * input-gradient products only. n 0: not given (gemm_eff for all three). */
struct l3d_profile_wgrad {
    int n;
    double tokens[L3D_PROFILE_MAX_EFF], eff[L3D_PROFILE_MAX_EFF];
};

/* Matrix products by their shape (issue 47): efficiency is not a function of the FLOPs alone
 * (on the quiet AVX-512 core d6's products, M 256 and N, K 384..1536, ran at about 0.65 of the
 * FMA peak where a curve by FLOPs, whose buckets mixed in products with a side of 64, said
 * 0.46-0.53). Optional keys gemm_eff_grid[_T]: `MxNxK:fraction` entries, the
 * forward and input-gradient products of a linear layer of M tokens, K inputs, N outputs
 * measured on a grid of shapes, read by the smallest side and the FLOPs
 * (l3d_profile_gemm_eff_shape). gemm_exact[_T]: `MxNxK:F/W` entries, one model's own linear
 * layers (llm3d bench --calibrate --model), F of the forward and input gradient, W of the
 * weight gradient, used in place of every curve for a linear layer of exactly that shape
 * (l3d_profile_exact). n 0: not given. */
#define L3D_PROFILE_MAX_GRID 48
#define L3D_PROFILE_MAX_EXACT 32
struct l3d_profile_grid {
    int n;
    double M[L3D_PROFILE_MAX_GRID], N[L3D_PROFILE_MAX_GRID], K[L3D_PROFILE_MAX_GRID];
    double eff[L3D_PROFILE_MAX_GRID];
};
struct l3d_profile_exact {
    int n;
    double M[L3D_PROFILE_MAX_EXACT], N[L3D_PROFILE_MAX_EXACT], K[L3D_PROFILE_MAX_EXACT];
    double eff[L3D_PROFILE_MAX_EXACT], wgrad[L3D_PROFILE_MAX_EXACT];
};

struct l3d_profile_16 {
    int n_eff;
    double eff_flops[L3D_PROFILE_MAX_EFF], eff[L3D_PROFILE_MAX_EFF]; /* of the run's peak */
    double attn_eff, gemm_thread_eff, kernel_bw_eff; /* kernel bytes at 2-byte elements */
    double kern_eff[L3D_KERN_N]; /* optional kernel_bw_effs_T; all 0: kernel_bw_eff for each */
    bool native; /* optional gemm_native_T = yes: the products run in 16-bit kernels, with no
                  * fp32 copies of their operands (l3d_be_matmul_native) */
    bool attn_native; /* optional attn_native_T = yes: attention's products run as batched
                       * 16-bit matmuls with their kept scratch (l3d_be_attention_native) */
    double wgrad_block; /* optional gemm_wgrad_block_T (MiB in the file): the bytes of fp32
                         * scratch of the weight gradients' blocks (l3d_be_matmul_wgrad_block) */
    struct l3d_profile_wgrad wgrad; /* optional gemm_eff_wgrad_T (with the four above) */
    struct l3d_profile_grid grid;   /* optional gemm_eff_grid_T (with the four above) */
    struct l3d_profile_exact exact; /* optional gemm_exact_T (with the four above) */
};

struct l3d_profile {
    char name[48];
    char device[128];
    double peak_fp32, peak_bf16, peak_fp16; /* FLOP/s per device; 0 = not supported */
    double mem_bytes;          /* per device */
    double mem_bw;             /* bytes/s per device */
    int devices_per_node;
    int pair_size;             /* devices sharing the fastest link */
    double pair_bw, intra_bw, inter_bw; /* bytes/s; inter_bw is per node */
    double intra_lat, inter_lat;        /* seconds */
    int n_eff;
    double eff_flops[L3D_PROFILE_MAX_EFF], eff[L3D_PROFILE_MAX_EFF]; /* GEMM efficiency curve */
    struct l3d_profile_wgrad wgrad; /* optional gemm_eff_wgrad */
    struct l3d_profile_grid grid;   /* optional gemm_eff_grid: products by shape */
    struct l3d_profile_exact exact; /* optional gemm_exact: one model's linear layers */
    double attn_eff, kernel_bw_eff;
    double kern_eff[L3D_KERN_N]; /* optional kernel_bw_effs, by enum l3d_kern; all 0: the median
                                  * kernel_bw_eff for each (l3d_profile_kern_eff) */
    double gemm_thread_eff;    /* CPU: one product on k threads of a rank against k cores */
    double dp_overlap;         /* fraction, 0 to 1, of the DP gradient reduction hidden behind
                                * the backward it runs during (yes: 1, no: 0) */
    double reserve_bytes;      /* per device (a CPU: per rank), kept by the runtime: context,
                                * library workspaces, communication buffers, fragmentation */
    double gemm_calibration;   /* optional factor on gemm_eff fitted on a published run, applied
                                * only when a run asks for it (run.calibrated); 0: none */
    int compute_units;         /* optional: SMs / CUs a device (data sheet); 0: no wave
                                * quantization (a CPU) */
    int tile_m, tile_n;        /* optional gemm_tile: output tile of one block of the GEMM
                                * library's kernels for large products (0 with compute_units 0) */
    double tp_overlap;         /* optional: fraction of TP communication hidden behind compute */
    struct l3d_profile_16 mixed[2]; /* optional: llm3d's bf16 [0] and fp16 [1] kernels */
};

/* The peak of products of type t (fp32, bf16, fp16) per device; 0 = not supported. */
double l3d_profile_peak(const struct l3d_profile *p, enum l3d_dtype t);

/* Reads a profile (format: profiles/README.md). Unknown keys, missing keys, values out of range
 * and unsorted efficiency points are errors naming the file, the line and the key. */
l3d_status l3d_profile_load(struct l3d_profile *p, const char *path);
l3d_status l3d_profile_parse(struct l3d_profile *p, const char *text, const char *what);
/* A profile name without '/' or '.' is looked up as <dir>/<name>.prof in L3D_PROFILE_DIR, then
 * ./profiles and the source tree's profiles/. */
l3d_status l3d_profile_find(struct l3d_profile *p, const char *name_or_path);
/* Achieved fraction of the peak by one matrix product of `flops` FLOPs (2 m n k): the curve of
 * gemm_eff, measured on cubes. */
double l3d_profile_gemm_eff(const struct l3d_profile *p, double flops);
/* Wave quantization of an M x N output (NVIDIA, "Matrix Multiplication Background User's Guide"):
 * tiles / (waves x compute units), the tiles gemm_tile in the better of its two orientations, the
 * waves ceil(tiles / compute_units); 1 without compute_units, and for outputs of at most one wave
 * (there the libraries use smaller tiles or split K: the curve's small sizes cover them). */
double l3d_profile_gemm_waves(const struct l3d_profile *p, double M, double N);
/* Compute efficiency of an M x N x K product (M x K times K x N) by its shape. With a
 * gemm_eff_grid: its entries grouped into rows of one smallest side (min(M, N, K)), each row
 * interpolated linearly in log(FLOPs), the two rows around the product's smallest side then
 * linearly in log(side); flat beyond the ends; times the shape's wave quantization (each entry's
 * own divided out). Else the gemm_eff curve
 * at its FLOPs with each measured cube's own wave quantization taken out, times the shape's; at a
 * cube of a gemm_eff point, exactly that point (unless a larger point is less efficient without
 * its quantization: that one's bounds it). Without compute_units, the curve at its FLOPs. The
 * memory-bound floor is the planner's. */
double l3d_profile_gemm_eff_shape(const struct l3d_profile *p, double M, double N, double K);
/* Compute efficiency of the weight-gradient product of a linear layer on M tokens, K inputs, N
 * outputs (a K x N output reduced over M): the gemm_eff_wgrad curve at M tokens (interpolated
 * linearly in log(tokens), flat beyond the ends) times the K x N output's wave quantization;
 * without that curve, l3d_profile_gemm_eff_shape(p, K, N, M). */
double l3d_profile_wgrad_eff(const struct l3d_profile *p, double M, double N, double K);
/* A gemm_exact entry for a linear layer of M tokens, K inputs, N outputs (each rounded to an
 * integer): true and *fwd (its forward and input-gradient efficiency), *wgrad (its weight
 * gradient's), as measured at that shape; false when the profile has none. */
bool l3d_profile_exact(const struct l3d_profile *p, double M, double N, double K, double *fwd,
                       double *wgrad);
/* Fraction of mem_bw that element-wise kernel k reaches: its kernel_bw_effs entry, else
 * kernel_bw_eff. */
double l3d_profile_kern_eff(const struct l3d_profile *p, enum l3d_kern k);
/* The profile as llm3d's trainer runs precision `prec` on it: for bf16 / fp16 with that type's
 * 16-bit keys in the profile, *out is p with gemm_eff, gemm_eff_wgrad (none when the type has
 * none), attn_eff, gemm_thread_eff and kernel_bw_eff replaced by them (gemm_eff_grid and gemm_exact
 * by the type's, none when it has none), and true is returned; else *out is p, false. */
bool l3d_profile_mixed(const struct l3d_profile *p, enum l3d_dtype prec, struct l3d_profile *out);

/* ---- one layout ----------------------------------------------------------------------- */

struct l3d_plan_run {
    int64_t devices;       /* ranks x threads_per_rank on a CPU; GPUs otherwise */
    /* the run spec's precision: param (fp32, bf16, fp16), grad (fp32: llm3d's main_grad; the
     * parameters' type: Megatron-LM's 2-byte gradients), reduce (the DP sums' type: 2 bytes an
     * element from fp32 main_grad through 16-bit staging with --grad-reduce-dtype bf16|fp16) */
    struct l3d_precision precision;
    bool flash;            /* fused attention: no s^2 scores kept or moved through memory */
    bool calibrated;       /* apply the profile's gemm_calibration (a fit, docs/frontier.md) */
    /* whose trainer runs it: llm3d's (its allocation plan and optimizer traffic; with 16-bit
     * parameters fp32 gradients, AdamW moments and master weights) or Megatron-LM's (2-byte
     * gradients, the ZeRO paper's K = 12). fp32 is llm3d's plan either way */
    bool llm3d;
    /* llm3d's 16-bit products run in 16-bit kernels, with no fp32 copies of their operands
     * (l3d_be_matmul_native); l3d_plan_evaluate and the search also take it from the profile
     * (gemm_native_bf16 / _fp16 = yes). false: those copies are counted, once */
    bool native16;
    /* llm3d's bf16 attention runs as batched oneDNN matmuls, whose scratch (kept for the run)
     * the plan counts; also from the profile (attn_native_bf16 = yes) */
    bool attn_native16;
    /* with native16: the bytes of fp32 scratch in which llm3d's bf16 weight gradients run a block
     * of rows at a time (l3d_be_matmul_wgrad_block); also from the profile
     * (gemm_wgrad_block_bf16); 0: none */
    double wgrad_block16;
    /* llm3d's ZeRO-3, and ZeRO-2 in mixed precision, hold no whole fp32 copy of the parameters:
     * they move a piece of at most piece_bytes at a time (include/llm3d/dp.h; 64 MiB, the
     * checkpoint's staging, l3d_ckpt_stage_bytes): one device piece per chunk when the run reads
     * or writes files (files: resumed, --init-from, checkpoints saved; ZeRO-2 also for its
     * initialisation from the seed), and beside it, with files, a host buffer of one piece (the
     * writer's staging, the reader's buffer). files false: from the seed with no saves (what
     * `llm3d plan` assumes; the trainer's memory check says which) */
    bool files;
    size_t piece_bytes;
};
struct l3d_plan_run l3d_plan_run_default(void);

/* A layout is the run spec's struct l3d_layout: tp, cp, pp, dp, micro_batch, v, zero, recompute,
 * sp, schedule, threads (CPU: cores a rank), the sequence it plans (seq), the global batch
 * (global_batch, sequences a step) and the DP bucket (bucket_bytes); what it leaves at 0 reads as
 * cp 1, threads 1, seq the model's context (maxT), global batch micro_batch x dp x accum and
 * bucket 25 MB (PyTorch DDP's default). The model's maxT is its context, the learned position
 * table's rows. */

struct l3d_plan_mem {      /* bytes on the fullest rank */
    double params, grads, optimizer, activations, other, total;
    int stage;             /* pipeline rank that holds the most */
    int in_flight;         /* micro-batches whose activations stage 0 keeps */
};

struct l3d_plan_time {     /* seconds per training step */
    double gemm, attention, elementwise; /* compute of the slowest pipeline rank, whole step */
    double recompute;      /* part of the above spent re-running forwards */
    double tp_comm, pp_p2p, bubble, dp_comm, embed_sync, optimizer;
    double cp_comm;        /* the context-parallel ring's exposed transfers (in the pipeline) */
    double ep_comm;        /* expert parallelism's all-to-all exchanges (in the pipeline) */
    double step;
    double bubble_frac;    /* bubble / the pipeline phase: its idle share (0 without a pipeline) */
};

struct l3d_plan_result {
    struct l3d_layout layout;
    struct l3d_plan_mem mem;
    struct l3d_plan_time time;
    bool fits;
    int m;                  /* micro-batches per pipeline per step */
    double tokens_per_s;
    double model_flops;     /* per step: Narayanan et al. 2021 eq. 3, 3 passes (no recompute) */
    double hw_flops;        /* the same with the recomputed forward counted (4 passes when full) */
    double mfu, hfu;        /* per device against the precision's peak */
};

/* Checks the layout against model, run and profile (divisibility, heads, schedule rules, the
 * precision's peak); L3D_ERR_LAYOUT with a sentence naming the value and the rule. prof NULL: the
 * profile's checks (threads a node, the peak) are left out (l3d_plan_memory). */
l3d_status l3d_plan_check(const struct l3d_model_spec *m, const struct l3d_profile *prof,
                          const struct l3d_plan_run *run, const struct l3d_layout *lay);
/* The distinct linear-layer shapes a rank of layout lay multiplies for model m (the planner's:
 * maxT the sequence planned), as the planner times them: M tokens (a micro-batch's, b s / cp; a
 * MoE expert's balanced share of the routed rows, b s top_k / experts), N outputs, K inputs,
 * the widths divided by tp: QKV, the attention projection, the MLP's two (dense, or the router,
 * the experts' and the shared experts'), the LM head. Into out[0..max); returns their number.
 * `llm3d bench --calibrate --model` measures them (gemm_exact). */
int l3d_plan_linear_shapes(const struct l3d_model_spec *m, const struct l3d_layout *lay,
                           int64_t (*out)[3], int max);
l3d_status l3d_plan_evaluate(const struct l3d_model_spec *m, const struct l3d_profile *prof,
                             const struct l3d_plan_run *run, const struct l3d_layout *lay,
                             struct l3d_plan_result *r);

/* The memory of the fullest rank alone (no profile, no time): the same formulas as
 * l3d_plan_evaluate's r.mem. The trainer checks its own layout, and the alternatives it proposes,
 * with it before allocating (src/train/memory.c). */
l3d_status l3d_plan_memory(const struct l3d_model_spec *m, const struct l3d_plan_run *run,
                           const struct l3d_layout *lay, struct l3d_plan_mem *worst);

/* Layers of each pipeline rank's chunks: as layout lay gives them (--pp-layers, or the end
 * stages' --pp-first-layers / --pp-last-layers: l3d_layout_stage_layers), else as the trainer
 * splits them (l3d_pp_partition) for llm3d's trainer, evenly for Megatron-LM's (L divisible by
 * pp v). m: the model planned at the layout's sequence. */
l3d_status l3d_plan_stage_layers(const struct l3d_model_spec *m, const struct l3d_plan_run *run,
                                 const struct l3d_layout *lay, int stages, int *layers);

/* The pipeline phase of a step: the schedule's actions run on a timeline, each virtual stage vs
 * (chunk c of rank r is c pp + r) with its own forward fwd[vs], backward bwd[vs] (recomputation
 * included), and receive times rin_act[vs] of its input and rin_grad[vs] of its output's
 * gradient. A rank runs its list in order, a receive waits for the matching send and then takes
 * its time, sends do not block. Returns the time of the last action; -1 when a receive is never
 * matched or memory runs out. */
double l3d_plan_pipe_time(const struct l3d_pp_schedule *sc, const double *fwd, const double *bwd,
                          const double *rin_act, const double *rin_grad);
/* The same with W of a split backward (zb-h1) taking wgt[vs] of bwd[vs] (its B the rest); wgt
 * NULL: half (l3d_plan_pipe_time). */
double l3d_plan_pipe_time_w(const struct l3d_pp_schedule *sc, const double *fwd,
                            const double *bwd, const double *wgt, const double *rin_act,
                            const double *rin_grad);
/* The same for m micro-batches of a schedule kind: in full when p v m <= full, else the timelines
 * of 4p and 5p micro-batches extended linearly (past the warm-up each p more micro-batches add the
 * same time); l3d_plan_evaluate uses 2^13. -1 when neither applies. */
double l3d_plan_pipe_phase(enum l3d_pp_kind kind, int p, int v, int64_t m, const double *fwd,
                           const double *bwd, const double *rin_act, const double *rin_grad,
                           int64_t full);

/* ---- search --------------------------------------------------------------------------- */

/* The parts of a layout the flags fixed: a mask of them beside a layout holding their values. */
enum {
    L3D_FIX_TP = 1 << 0, L3D_FIX_CP = 1 << 1, L3D_FIX_PP = 1 << 2, L3D_FIX_DP = 1 << 3,
    L3D_FIX_MB = 1 << 4, L3D_FIX_V = 1 << 5, L3D_FIX_ZERO = 1 << 6, L3D_FIX_RECOMPUTE = 1 << 7,
    L3D_FIX_SP = 1 << 8, L3D_FIX_EP = 1 << 9,
};
struct l3d_plan_fixed {
    unsigned mask;             /* L3D_FIX_* */
    /* the fixed parts' values; zero3_prefetch (the trainer's 1), threads, seq, global_batch,
     * bucket_bytes and the pipeline schedule with one model chunk a rank (1F1B, or GPipe) hold in
     * every layout */
    struct l3d_layout layout;
    /* the micro-batches tried when not fixed: 1, 2, 4, ..., 64 (false), or layout.micro_batch
     * and its halvings while they divide it (the trainer's memory check: the same sequences a
     * step in smaller pieces) */
    bool mb_halvings;
};
/* Nothing fixed: every layout the search tries. */
struct l3d_plan_fixed l3d_plan_fixed_none(void);
/* fx with part `bit` fixed to `value` (the layout field of that part). */
void l3d_plan_fix(struct l3d_plan_fixed *fx, unsigned bit, int value);

/* Every layout of `ranks` ranks that the fixed parts allow, in the search's order (tp, cp, pp,
 * dp, ep, micro-batch, v, ZeRO, recomputation, SP; ep only for a mixture of experts, each ep
 * that divides dp x cp and the experts), each(ctx, layout) for each, before any
 * evaluation: the one enumeration behind l3d_plan_search and the trainer's memory check's
 * suggestions. Every layout has fx->layout's threads, seq, global batch (micro-batches that do not
 * split it are not tried), bucket and ZeRO-3 prefetch. dpn: devices per node (tp beyond it, or
 * beyond the heads, not tried unless fixed; 0 or 1: no node limit); zero3: whether ZeRO-3 is
 * tried (llm3d's trainer has it; Megatron-LM's optimizer not). */
struct l3d_plan_space {
    const struct l3d_model_spec *m;
    int64_t ranks;
    int dpn;
    bool zero3;
    /* Megatron-LM's stages: equal layers, or where the stages do not divide them Megatron-Core's
     * shorter first and last stages (pp_first, pp_last), unless fx->layout gives a split */
    bool even_stages;
    bool zero_bubble; /* zb-h1 tried beside 1F1B (llm3d's trainer runs it; Megatron-LM not) */
    const struct l3d_plan_fixed *fx;
};
void l3d_plan_layouts(const struct l3d_plan_space *sp,
                      void (*each)(void *, const struct l3d_layout *), void *ctx);

struct l3d_plan_search_stats {
    int64_t evaluated, valid, fit;
    double seconds;
};
/* Enumerates (tp, pp, dp, micro-batch, v, ZeRO, recompute, SP) valid for the run, keeps those
 * that fit in memory, returns the `top` fastest in out (sorted), their number in *n_out. */
l3d_status l3d_plan_search(const struct l3d_model_spec *m, const struct l3d_profile *prof,
                           const struct l3d_plan_run *run, const struct l3d_plan_fixed *fixed,
                           struct l3d_plan_result *out, int top, int *n_out,
                           struct l3d_plan_search_stats *stats);
/* The same, calling each(each_ctx, r) with every valid layout evaluated, fitting or not (the
 * pictures of llm3d plan --svg). */
l3d_status l3d_plan_search_each(const struct l3d_model_spec *m, const struct l3d_profile *prof,
                                const struct l3d_plan_run *run, const struct l3d_plan_fixed *fixed,
                                struct l3d_plan_result *out, int top, int *n_out,
                                struct l3d_plan_search_stats *stats,
                                void (*each)(void *, const struct l3d_plan_result *),
                                void *each_ctx);
/* One line on why the first result beats the second (its largest time advantage). */
void l3d_plan_explain(const struct l3d_plan_result *best, const struct l3d_plan_result *next,
                      char *buf, size_t len);

#endif
