/*
 * llm3d data parallelism: gradient averaging in buckets overlapped with the backward pass, and
 * ZeRO stages 1, 2 and 3 (Rajbhandari et al. 2020) over the data-parallel group.
 *
 *   struct l3d_dp dp;
 *   l3d_dp_init(&dp, model, topo.dp_comm, zero, bucket_bytes, true); // installs model hooks
 *   for each micro-batch: l3d_dp_begin_micro(&dp, last); forward; backward;  // buckets fly
 *   l3d_dp_finish(&dp);                 // waits: averaged gradients (or this rank's shard) ready
 *   struct l3d_sumsq sq;                // 2 device doubles (optim.h), once at start-up
 *   l3d_sumsq_init(&sq, be, 2);
 *   l3d_dp_grad_sumsq_add(&dp, &sq, false);  // this rank's part, on the device
 *   double v[2];
 *   l3d_sumsq_take(&sq, v);             // read once; the caller sums the groups
 *   l3d_dp_step(&dp, &opt, lr, clip);   // AdamW on this rank's range, then parameters gathered
 *   l3d_dp_free(&dp);
 *
 * The loss of each token is weighted 1/(global tokens) by the caller, so summing gradients over
 * the group averages them.
 *
 * Shards (ZeRO >= 1): the flat parameter space [0, N) is cut into dp contiguous ranges of S
 * elements (S = N/dp rounded up to 16, the last range shorter); rank r owns [r S, min(N,(r+1) S)).
 * E.g. N = 100, dp = 4: S = 32, ranges [0,32) [32,64) [64,96) [96,100). A range cuts across
 * tensors; AdamW applies each tensor's weight decay to its part of the range.
 *
 * Per-rank memory in fp32 (the ZeRO paper's mixed-precision formulas count 2-byte parameters and
 * gradients and K = 12 bytes of optimizer state; here parameters and gradients are 4 bytes, the
 * sizes of param_dtype and grad_dtype, and the optimizer state is AdamW's fp32 m and v, 8 bytes):
 *   zero 0:  4N params + 4N grads + 8N moments          = 16N   (paper: 16N)
 *   zero 1:  4N params + 4N grads + 8N/dp moments       = 8N + 8N/dp   (paper: 4N + 12N/dp)
 *   zero 2:  4N params + 4N/dp grads + 8N/dp moments    = 4N + 12N/dp  (paper: 2N + 14N/dp)
 *   zero 3:  4N/dp params + 4N/dp grads + 8N/dp moments  = 16N/dp (paper: 16N/dp)
 * ZeRO-2 and 3 also hold two layers' worth of gradient slots and the non-layer tensors' gradients
 * (embeddings, final LayerNorm) while the backward pass runs; l3d_dp_memory() reports them apart.
 *
 * ZeRO-3 (src/parallel/zero3.c): the model holds no parameters (L3D_GRADS_SHARDED); this rank's
 * range of them is param_shard (the model's type; AdamW updates it in place, nothing is gathered
 * after the step). The model's params_get hook gathers a layer's 12 tensor slices (one in-place
 * all-gatherv each) into a buffer laid out as the gradient slot, just before the layer, in forward
 * and again in backward (a full recomputation reuses backward's), and posts the next
 * l3d_dp_zero3_prefetch layers' gathers (1 by default) before waiting, so they overlap the layer's
 * compute; params_done frees the buffer. The non-layer tensors are gathered once a pass. Every
 * micro-batch gathers again (nothing is kept across micro-batches or pipeline passes). Gradients
 * take ZeRO-2's path. Memory adds the gather buffers: (prefetch + 1) layers and the non-layer
 * tensors (l3d_dp_memory's gather).
 * The gradients, the shard and the parameters are device memory (include/llm3d/backend.h): the
 * communicators are given them as they are, and only backend kernels touch them.
 *
 * Buckets: each layer's gradients are final when the backward pass leaves the layer; they go out
 * right then, in pieces of at most bucket_bytes (Open MPI's all-reduce measured here falls from
 * ~5 GB/s at 4 MiB to 0.2 GB/s at 64 MiB), and are tested between layers (overlap: below).
 * zero 0: all-reduce in place; zero 1 and 2: each piece is reduced to the rank owning it (a
 * reduce-scatter written as reduces, since a layer's slice of a tensor lies in one or two owners'
 * ranges).
 * Without ZeRO-2, gradients accumulate locally and go out on the last micro-batch only; ZeRO-2 has
 * no room to accumulate non-owned gradients, so it reduces every micro-batch into the owner's shard.
 *
 * overlap = false issues each piece as a blocking call at the same point instead. Overlap needs
 * something that moves data while the ranks compute: Open MPI's shared-memory and TCP transports
 * move it only inside MPI calls, so either the communicator's progress thread does
 * (l3d_comm_mpi_init_progress, the trainer's default) or l3d_dp_poll_kernels has the backward
 * pass test the pieces between kernels (docs/DESIGN.md, "Progress of non-blocking operations").
 */
#ifndef LLM3D_DP_H
#define LLM3D_DP_H

#include <stdbool.h>
#include <stdint.h>

#include "llm3d/comm.h"
#include "llm3d/model.h"
#include "llm3d/optim.h"

struct l3d_dp_piece; /* a pending reduction: private */
struct l3d_dp_zero3; /* ZeRO-3's gather buffers: private (src/parallel/zero3.c) */
struct l3d_dp_stream; /* the fp32 parameters a piece at a time: private (src/parallel/pieces.c) */

struct l3d_dp {
    struct l3d_gpt *m;
    struct l3d_comm *comm;
    /* Expert parallelism (l3d_dp_expert_groups): ZeRO-0 keeps comm the DP group and sums the
     * experts' slices over ecomm, the ranks holding the same experts; ZeRO-1/2 shard over comm =
     * those ranks (their flat buffers are the same) and sum the other slices over xcomm, the EP
     * group, first. Without experts split: ecomm = comm, xcomm NULL. */
    struct l3d_comm *ecomm, *xcomm;
    enum l3d_dtype param_dtype, grad_dtype; /* the model's dt; fp32 gradients */
    int zero;
    bool overlap;            /* non-blocking pieces (else blocking ones at the layer boundary) */
    int64_t bucket;          /* elements per piece */
    int64_t shard_size;      /* S */
    int64_t own_start, own_count; /* this rank's range (ZeRO >= 1) */
    float *grad_shard;       /* ZeRO-2: own_count accumulated gradients (device memory) */
    bool sync;               /* this micro-batch reduces (last one, or always with ZeRO-2) */
    /* pending pieces per layer slot: [0] layer l, [1] the layer before it (l+1) */
    struct l3d_dp_piece *pend[3];
    int npend[3], cap[3];
    int piece_seq;           /* pieces sent in this micro-batch's backward (watchdog messages) */
    double comm_wait_s;      /* time inside communication calls this step (exposed comm) */
    bool defer_nonlayer;     /* the non-layer tensors wait for l3d_dp_reduce_nonlayer */
    bool test_skip_reduce;   /* test hook L3D_TEST_SKIP_DP_REDUCE=1 (l3d_dp_init): send nothing */
    /* the type the gradients travel in (l3d_dp_reduce_in): grad_dtype, or 16 bits through the
     * staging buffers, one per pending list (device memory, swapped with the lists) */
    enum l3d_dtype reduce_dtype;
    void *stage[3];
    int64_t stage_fill[3], stage_cap[3];
    /* ZeRO-3: this rank's parameters (own_count of param_dtype, device memory) and the gathers */
    void *param_shard;
    struct l3d_dp_zero3 *z3;
    struct l3d_dp_stream *stream; /* a save or load a piece at a time (l3d_dp_fp32_stream_begin) */
    double gather_wait_s;  /* time waiting for parameter all-gathers (exposed), reset by caller */
    double gather_posts_s; /* time posting them (copies and the calls that start them) */
};

struct l3d_dp_memory {
    size_t params, grads, optimizer, grad_scratch; /* bytes per rank */
    size_t reduce_staging; /* the 16-bit reduction's staging buffers (l3d_dp_reduce_in) */
    size_t gather;         /* ZeRO-3's gather buffers: prefetch + 1 layers and the non-layer
                            * tensors, of param_dtype (params counts the shard only) */
};

/* Sets the model's gradient hooks (and, for ZeRO-2 and 3, its gradient slots) and allocates the
 * shard state (ZeRO-2's gradient shard on the model's backend, zeroed; ZeRO-3's parameter shard
 * and gather buffers, prefetch 1, and the model's params hooks; L3D_ERR_OOM when it has no room).
 * zero in {0, 1, 2, 3}; ZeRO-3 needs a model built with L3D_GRADS_SHARDED, ZeRO-2 one with
 * L3D_GRADS_SLOTS. bucket_bytes > 0. comm may have size 1 (then nothing is sent). */
l3d_status l3d_dp_init(struct l3d_dp *dp, struct l3d_gpt *m, struct l3d_comm *comm, int zero,
                       size_t bucket_bytes, bool overlap);
void l3d_dp_free(struct l3d_dp *dp);
/* Overlap by polling: installs the model's progress hook, so that the backward pass tests the
 * pending pieces after every kernel (about 10 calls per layer) instead of only between layers;
 * MPI then moves the data of transports without their own progress (Open MPI's shared memory,
 * TCP) in those calls. For overlap = true; the other mechanism is the communicator's progress
 * thread (l3d_comm_mpi_init_progress). */
void l3d_dp_poll_kernels(struct l3d_dp *dp);
/* Gradients reduced over the group in type t (L3D_BF16 or L3D_F16; L3D_F32, the default, undoes
 * it): they still accumulate over micro-batches in fp32 (main_grad); each piece is rounded to t
 * (to nearest even) into a staging buffer, reduced there (the sum of each pair of values rounded
 * to t, as a 16-bit all-reduce in Megatron-LM without --accumulate-allreduce-grads-in-fp32), and
 * widened back into the fp32 gradients when it completes. Half the bytes on the wire; the
 * staging holds the pending lists' gradients at their largest, two layers' and the non-layer
 * tensors' (l3d_dp_memory's reduce_staging). A group of one sends nothing and stages nothing.
 * L3D_ERR_OOM when the staging does not fit. */
l3d_status l3d_dp_reduce_in(struct l3d_dp *dp, enum l3d_dtype t);
/* ZeRO-3: the gathers posted ahead of the layer in use, in each pass's direction (0: each layer's
 * gather waited for where it is needed); prefetch + 1 layer buffers (reallocated; between steps).
 * L3D_ERR_OOM when they do not fit. */
l3d_status l3d_dp_zero3_prefetch(struct l3d_dp *dp, int prefetch);
/* ZeRO-3: this rank's range of the seed's initial weights (l3d_gpt_init_weights_range) straight
 * into its shard (fp32) or into opt's master weights and, rounded, the shard (mixed precision):
 * no whole fp32 copy of the parameters anywhere. */
void l3d_dp_zero3_init_weights(struct l3d_dp *dp, const struct l3d_adamw *opt, uint64_t seed);
/* ZeRO-3's gather buffers' bytes (0 for other stages). */
size_t l3d_dp_zero3_gather_bytes(const struct l3d_dp *dp);
/* Number of elements of the optimizer state this rank holds, and where they start. */
void l3d_dp_opt_range(const struct l3d_dp *dp, int64_t *start, int64_t *count);
/* Before a micro-batch's backward: whether it is the last of the step. */
void l3d_dp_begin_micro(struct l3d_dp *dp, bool last);
/* Pipeline parallelism: the tied token embedding's gradient must first be summed between the
 * first and the last stage, so the non-layer tensors (wte, wpe, final LayerNorm) are not reduced
 * by the backward pass but by l3d_dp_reduce_nonlayer, called after the last backward (and that
 * sum) and before l3d_dp_finish. With ZeRO-2 they accumulate over the micro-batches meanwhile. */
void l3d_dp_defer_nonlayer(struct l3d_dp *dp);
void l3d_dp_reduce_nonlayer(struct l3d_dp *dp);
/* Expert parallelism: the expert tensors' gradients are summed over edp, the ranks holding the
 * same experts (their tokens' rows came from the whole EP group already), the others over the
 * whole DP group: with ZeRO-0 (dp made over the DP group) as one all-reduce each; with ZeRO-1/2
 * dp must be made over edp (its ranges then hold the same experts on every rank of it), and the
 * other slices are summed over ep first. l3d_dp_grad_sumsq_add then adds the experts' squares to
 * acc[2] (sq of 3 accumulators), which the caller sums over the EP group. */
void l3d_dp_expert_groups(struct l3d_dp *dp, struct l3d_comm *ep, struct l3d_comm *edp);
/* After the last backward: waits for every reduction. */
void l3d_dp_finish(struct l3d_dp *dp);
/* Sum of squares of the averaged gradients, this rank's part without communication, added on
 * the device to the two accumulators of sq (l3d_sumsq_init(sq, be, 2)): acc[0] += the tensors
 * split over TP, acc[1] += the replicated ones, over this rank's range, range by range in tensor
 * order (skip_wte: a pipeline's last stage, whose tied wte is counted on the first). Nothing is
 * read back: l3d_sumsq_take does, once every chunk has added its part. The global sum is the
 * pair summed over the DP group (ZeRO >= 1, where each rank holds its range), acc[0] over the
 * TP group (replicated tensors once) and both over the pipeline stages. */
void l3d_dp_grad_sumsq_add(const struct l3d_dp *dp, struct l3d_sumsq *sq, bool skip_wte);
/* AdamW on this rank's range with the clipping factor, then (ZeRO >= 1) the parameters are
 * all-gathered; gradients are zeroed for the next step (the range AdamW reads in its own pass,
 * l3d_adamw_step_zero; the rest by memset). */
void l3d_dp_step(struct l3d_dp *dp, struct l3d_adamw *opt, struct l3d_backend *be, float lr,
                 float grad_scale);
/* A skipped step (a non-finite loss or gradient norm, agreed by every rank): no update, no
 * communication; the gradients are zeroed for the next step as l3d_dp_step does. */
void l3d_dp_skip_step(struct l3d_dp *dp);
/* Test hook (L3D_TEST_NAN_AT_STEP, src/train/step.c): sets the last gradient of this rank's
 * range to NaN, after the reduction, so that only this rank sees it. */
void l3d_dp_test_poison(struct l3d_dp *dp);
/* Test hook: the gradient buffer the next step accumulates into that holds a nonzero element
 * ("gradients", "non-layer gradients", "gradient shard"), copied to the host to look; NULL when
 * all are zero, as l3d_dp_step and l3d_dp_skip_step leave them. poison: 1.0 written into the last
 * element of the first of them first (the check's negative case). */
const char *l3d_dp_test_grads_nonzero(struct l3d_dp *dp, bool poison);
struct l3d_dp_memory l3d_dp_memory(const struct l3d_dp *dp, const struct l3d_adamw *opt);
/* The chunk's parameters in fp32 (num_params, device memory), for initialisation, checkpoints and
 * llm.c files in every precision where a rank holds them whole (l3d_dp_fp32_streamed false): the
 * parameters themselves in fp32; in mixed precision the fp32 master weights when whole (no ZeRO),
 * else the fp32 gradient buffer (ZeRO-1: free between steps). Between steps only (the gradients
 * are zero). No communication. */
float *l3d_dp_fp32_params(struct l3d_dp *dp, const struct l3d_adamw *opt);
/* Fills such a buffer with the master weights of every rank's range (a collective over the DP
 * group); nothing when it is whole already. */
void l3d_dp_fp32_gather(struct l3d_dp *dp, const struct l3d_adamw *opt, float *buf);
/* Ends the use of a buffer from l3d_dp_fp32_params; loaded: it was filled with new parameters,
 * which become the master weights of this rank's range and, rounded, the model's 16-bit ones. */
void l3d_dp_fp32_params_done(struct l3d_dp *dp, struct l3d_adamw *opt, float *buf, bool loaded);

/* ---- the fp32 parameters a piece at a time (src/parallel/pieces.c) ------------------------------
 * ZeRO-3, and ZeRO-2 in mixed precision, keep no whole fp32 copy of the parameters on any rank:
 * each rank's range lives in its master weights (mixed precision) or its fp32 shard (ZeRO-3 in
 * fp32). Saves, resumes, --init-from and ZeRO-2's initialisation from the seed move them in pieces
 * of P = l3d_dp_fp32_piece(N, bytes) elements, [0, P), [P, 2P), ..., through one device buffer of
 * P fp32 per chunk (bytes: the checkpoint's staging size, 64 MiB):
 *
 *   l3d_dp_fp32_stream_begin(&dp, &opt, bytes, save);  // the buffer (L3D_ERR_OOM: agree, end)
 *   l3d_dp_fp32_stream_send(&dp);                      // after the agreement, on every rank
 *   save, DP rank 0:  p = l3d_dp_fp32_stream_get(&dp, off, n);  // each piece in order
 *   load, every rank: l3d_dp_fp32_stream_want(&dp, &lo, &hi);   // the pieces it needs
 *                     l3d_dp_fp32_stream_put(&dp, off, n, host);  // or _seed for all of them
 *   l3d_dp_fp32_stream_end(&dp);                       // on every rank
 *
 * Save: every rank but DP rank 0 posts a non-blocking send of each piece's part of its range
 * (_send: from the range itself, nothing staged) and waits for them in _end; DP rank 0 receives
 * each piece's parts from their owners into its buffer when the writer asks for it (_get), and
 * in _end receives whatever the writer did not ask for (a failed write), so no send is left
 * waiting. E.g. N = 100, dp = 4 (ranges of 32), P = 40: piece [40, 80) is rank 1's [40, 64) and
 * rank 2's [64, 80); rank 1 sends [32, 40) and [40, 64), rank 2 [64, 80) and [80, 96).
 * Load: each rank takes [lo, hi) (ZeRO-3: its range; ZeRO-2: everything, its 16-bit parameters
 * being whole): a piece is rounded into the 16-bit parameters (ZeRO-2) or the shard (ZeRO-3)
 * and copied into the master range where it meets it. No communication.
 * Memory: P fp32 on the device per chunk while a stream is open, on DP rank 0 only for a save;
 * the writer's and the reader's host buffer (the checkpoint's staging, at most as large) beside
 * it; no whole copy. */
bool l3d_dp_fp32_streamed(const struct l3d_dp *dp, const struct l3d_adamw *opt);
/* Elements a piece of n fp32 parameters at most `bytes` takes: in [1, n]. */
int64_t l3d_dp_fp32_piece(int64_t n, size_t bytes);
l3d_status l3d_dp_fp32_stream_begin(struct l3d_dp *dp, struct l3d_adamw *opt, size_t bytes,
                                    bool save);
void l3d_dp_fp32_stream_send(struct l3d_dp *dp);
const float *l3d_dp_fp32_stream_get(struct l3d_dp *dp, int64_t off, int64_t n);
void l3d_dp_fp32_stream_want(const struct l3d_dp *dp, int64_t *lo, int64_t *hi);
void l3d_dp_fp32_stream_put(struct l3d_dp *dp, int64_t off, int64_t n, const float *host);
void l3d_dp_fp32_stream_seed(struct l3d_dp *dp, uint64_t seed);
void l3d_dp_fp32_stream_end(struct l3d_dp *dp);
/* Rows of the fp32 parameters in any order, without a stream (--out: train.c): [off, off + n)
 * into dst (device memory of n elements) on DP rank 0, from its owners; collective over the DP
 * group, every rank calling it with the same ranges in the same order. Nothing held beside dst. */
void l3d_dp_fp32_pull(struct l3d_dp *dp, const struct l3d_adamw *opt, int64_t off, int64_t n,
                      float *dst);

#endif
