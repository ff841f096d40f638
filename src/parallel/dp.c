/* Data parallelism: bucketed gradient reduction during backward, ZeRO-1/2 (include/llm3d/dp.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/dp-impl.h"
#include "llm3d/tp.h"

/* One reduction in flight: elements [off, off + n) of the flat parameter space, read from src. */
struct l3d_dp_piece {
    l3d_req req;
    int64_t off, n;
    float *src;
    void *stage; /* the 16-bit copy reduced instead of src (l3d_dp_reduce_in), else NULL */
    int root; /* owner (ZeRO >= 1), -1 for an all-reduce */
    int seq;  /* its number in the micro-batch's backward (the watchdog's "bucket") */
    struct l3d_comm *comm; /* the group it is reduced over */
};

#define DP_SLOTS 3 /* pending lists: layer l, layer l + 1, non-layer tensors */

static int owner_of(const struct l3d_dp *dp, int64_t off) { return (int)(off / dp->shard_size); }

static void push(struct l3d_dp *dp, int slot, struct l3d_dp_piece p) {
    L3D_ASSERT(dp->npend[slot] < dp->cap[slot]); /* sized in l3d_dp_init */
    dp->pend[slot][dp->npend[slot]++] = p;
}

/* Sends out the reduction of one tensor slice [off, off + n) whose gradients lie at src, over
 * comm (the DP group, or the expert-DP group for an expert tensor), summed over pre first when
 * given (blocking: ZeRO over the expert-DP group, a slice of the other tensors). */
static void reduce_slice(struct l3d_dp *dp, struct l3d_comm *comm, struct l3d_comm *pre, int slot,
                         float *src, int64_t off, int64_t n) {
    while (n > 0) {
        int64_t len = n < dp->bucket ? n : dp->bucket;
        int root = -1;
        if (dp->zero > 0) { /* stop at the owner's boundary */
            root = owner_of(dp, off);
            int64_t end = (int64_t)(root + 1) * dp->shard_size;
            if (off + len > end) len = end - off;
        }
        struct l3d_dp_piece p = {.off = off, .n = len, .src = src, .root = root,
                                 .seq = dp->piece_seq++, .comm = comm};
        l3d_req *req = dp->overlap ? &p.req : NULL;
        void *buf = src;
        enum l3d_dtype t = dp->grad_dtype;
        bool send = comm->size > 1 && !dp->test_skip_reduce; /* else ZeRO-2: drain() adds */
        if (send && dp->stage[slot]) { /* rounded into this list's staging, reduced there */
            L3D_ASSERT(dp->stage_fill[slot] + len <= dp->stage_cap[slot]);
            t = dp->reduce_dtype;
            buf = p.stage = (char *)dp->stage[slot] +
                             (size_t)dp->stage_fill[slot] * l3d_dtype_size(t);
            dp->stage_fill[slot] += len;
            l3d_be_convert(dp->m->be, t, buf, dp->grad_dtype, src, len);
        }
        double t0 = l3d_time_s();
        if (pre && pre->size > 1 && !dp->test_skip_reduce) /* buf: src, or its staged copy */
            l3d_comm_all_reduce(pre, buf, len, t, L3D_SUM, NULL);
        if (!send)
            ;
        else if (root < 0)
            l3d_comm_all_reduce(comm, buf, len, t, L3D_SUM, req);
        else
            l3d_comm_reduce(comm, buf, len, t, L3D_SUM, root, req);
        dp->comm_wait_s += l3d_time_s() - t0;
        push(dp, slot, p);
        src += len;
        off += len;
        n -= len;
    }
}

/* Waits for a pending list; ZeRO-2 owners add the reduced pieces into their shard. */
static void drain(struct l3d_dp *dp, int slot) {
    double t0 = l3d_time_s();
    for (int i = 0; i < dp->npend[slot]; i++) {
        struct l3d_dp_piece *p = &dp->pend[slot][i];
        struct l3d_doing was = l3d_comm_doing(p->comm, "DP gradient bucket", p->seq, -1);
        l3d_comm_wait(p->comm, &p->req);
        l3d_comm_done(p->comm, was);
        if (p->stage && (p->root < 0 || p->root == dp->comm->rank)) /* the sum, widened back */
            l3d_be_convert(dp->m->be, dp->grad_dtype, p->src, dp->reduce_dtype, p->stage, p->n);
        if (dp->zero >= 2 && p->root == dp->comm->rank)
            l3d_be_add_inplace(dp->m->be, dp->grad_dtype, dp->grad_shard + (p->off - dp->own_start),
                               p->src, p->n);
    }
    dp->npend[slot] = 0;
    dp->stage_fill[slot] = 0;
    dp->comm_wait_s += l3d_time_s() - t0;
}

/* Polls a pending list so that MPI progresses it while the next layer computes. */
static void poll(struct l3d_dp *dp, int slot) {
    double t0 = l3d_time_s(); /* without a progress thread, MPI moves the data inside these calls */
    for (int i = 0; i < dp->npend[slot]; i++)
        if (dp->pend[slot][i].req.active)
            l3d_comm_test(dp->pend[slot][i].comm, &dp->pend[slot][i].req);
    dp->comm_wait_s += l3d_time_s() - t0;
}

/* The model's progress hook (l3d_dp_poll_kernels): every pending piece tested. */
static void progress_hook(void *ctx) {
    struct l3d_dp *dp = ctx;
    for (int s = 0; s < DP_SLOTS; s++)
        if (dp->npend[s] > 0) poll(dp, s);
    l3d_dp_zero3_poll(dp);
}

static void reduce_nonlayer(struct l3d_dp *dp) {
    struct l3d_gpt *m = dp->m;
    for (int t = 0; t < L3D_NUM_TENSORS; t++) {
        const struct l3d_tensor_info *ti = &m->tensors[t];
        if (l3d_gpt_is_layer_tensor(t) || ti->count == 0) continue;
        reduce_slice(dp, dp->comm, dp->xcomm, 2, l3d_gpt_grad_ptr(m, t, 0), ti->offset, ti->count);
    }
}

static void grads_ready(void *ctx, int layer) {
    struct l3d_dp *dp = ctx;
    struct l3d_gpt *m = dp->m;
    if (!dp->sync || (dp->comm->size == 1 && dp->zero < 2 && !dp->xcomm)) return;
    if (layer < 0) {
        if (!dp->defer_nonlayer) reduce_nonlayer(dp);
        return;
    }
    /* the list of layer + 1 moves to slot 1 once this layer's pieces are out; what was in slot 1
     * (layer + 2) must be done before the model reuses its gradient slot for layer - 1 */
    drain(dp, 1);
    struct l3d_dp_piece *tmp = dp->pend[1];
    int tc = dp->cap[1];
    dp->pend[1] = dp->pend[0];
    dp->npend[1] = dp->npend[0];
    dp->cap[1] = dp->cap[0];
    dp->pend[0] = tmp;
    dp->npend[0] = 0;
    dp->cap[0] = tc;
    void *ts = dp->stage[1]; /* the staging moves with its list (both drained: fill 0) */
    dp->stage[1] = dp->stage[0];
    dp->stage[0] = ts;
    dp->stage_fill[1] = dp->stage_fill[0];
    dp->stage_fill[0] = 0;
    for (int t = 0; t < L3D_NUM_TENSORS; t++) {
        if (!l3d_gpt_is_layer_tensor(t)) continue;
        const struct l3d_tensor_info *ti = &m->tensors[t];
        int64_t slice = ti->rows * ti->cols;
        /* the tensor's own layer (a MoE layer has no dense MLP, a dense one no experts) */
        int64_t tl = l3d_gpt_tensor_layer(&m->cfg, &m->shard, t, layer);
        if (slice == 0 || tl < 0) continue;
        bool ex = l3d_gpt_expert_tensor(t);
        reduce_slice(dp, ex ? dp->ecomm : dp->comm, ex ? NULL : dp->xcomm, 0,
                     l3d_gpt_grad_ptr(m, t, layer), ti->offset + tl * slice, slice);
    }
    poll(dp, 1);
    if (dp->zero >= 2) drain(dp, 1); /* the slot of layer + 1 is next to be overwritten */
}

l3d_status l3d_dp_init(struct l3d_dp *dp, struct l3d_gpt *m, struct l3d_comm *comm, int zero,
                       size_t bucket_bytes, bool overlap) {
    memset(dp, 0, sizeof *dp);
    if (zero < 0 || zero > 3)
        return l3d_error(L3D_ERR_ARG, "--zero %d: choose 0 (replicated optimizer), 1 (sharded "
                         "optimizer state), 2 (also sharded gradients) or 3 (also sharded "
                         "parameters)", zero);
    if (bucket_bytes < 4096)
        return l3d_error(L3D_ERR_ARG, "gradient bucket of %zu bytes is too small (at least 4 KiB)",
                         bucket_bytes);
    if (zero >= 2 && m->grads)
        return l3d_error(L3D_ERR_ARG, "ZeRO-%d needs a model built with gradient slots", zero);
    dp->m = m;
    dp->comm = dp->ecomm = comm;
    dp->param_dtype = m->dt;
    dp->grad_dtype = L3D_F32; /* fp32 gradients (main_grad) in every precision */
    dp->reduce_dtype = L3D_F32;
    dp->zero = zero;
    dp->overlap = overlap;
    size_t gsize = l3d_dtype_size(dp->grad_dtype);
    dp->bucket = (int64_t)(bucket_bytes / gsize);
    int64_t N = m->num_params, d = comm->size;
    dp->shard_size = ((N + d - 1) / d + 15) / 16 * 16;
    dp->own_start = zero > 0 ? dp->shard_size * comm->rank : 0;
    dp->own_count = zero > 0 ? N - dp->own_start : N;
    if (dp->own_count > dp->shard_size && zero > 0) dp->own_count = dp->shard_size;
    if (dp->own_count < 0) dp->own_count = 0;
    if (zero >= 2) {
        size_t bytes = (size_t)(dp->own_count + 1) * gsize;
        dp->grad_shard = l3d_be_alloc(m->be, bytes, "gradient shard");
        if (!dp->grad_shard) {
            l3d_status st = l3d_error(L3D_ERR_OOM, "cannot allocate %.2f GiB for this rank's "
                                      "ZeRO-2 gradient shard (%lld elements): use more "
                                      "data-parallel ranks or a smaller model",
                                      (double)bytes / 1073741824.0, (long long)dp->own_count);
            memset(dp, 0, sizeof *dp);
            return st;
        }
        l3d_be_memset(m->be, dp->grad_shard, 0, bytes); /* first touch now, not in the step */
    }
    if (zero == 3) {
        l3d_status st = l3d_dp_zero3_init(dp);
        if (st != L3D_OK) {
            l3d_dp_zero3_free(dp);
            l3d_be_free(m->be, dp->grad_shard);
            memset(dp, 0, sizeof *dp);
            return st;
        }
    }
    /* the pending lists at their largest, allocated now rather than in the first step: a slice of
     * n elements goes out in at most n / bucket + 1 pieces, plus one per owner boundary crossed */
    int64_t per_layer = 0, nonlayer = 0;
    for (int t = 0; t < L3D_NUM_TENSORS; t++) {
        const struct l3d_tensor_info *ti = &m->tensors[t];
        int64_t n = l3d_gpt_is_layer_tensor(t) ? ti->rows * ti->cols : ti->count;
        int64_t pieces = n / dp->bucket + 1 + (zero > 0 ? n / dp->shard_size + 1 : 0);
        if (l3d_gpt_is_layer_tensor(t))
            per_layer += pieces;
        else
            nonlayer += pieces;
    }
    const int64_t caps[DP_SLOTS] = {per_layer, per_layer, nonlayer};
    for (int sl = 0; sl < DP_SLOTS; sl++) {
        dp->cap[sl] = (int)caps[sl];
        dp->pend[sl] = l3d_alloc((size_t)caps[sl] * sizeof(struct l3d_dp_piece), "dp pending");
    }
    /* Test hook: L3D_TEST_SKIP_DP_REDUCE=1 skips every gradient reduction, so each rank steps on
     * its own micro-batches' gradients: the broken data parallelism that tests/cli/compare.sh
     * checks llm3d compare tells apart from the single-process run. Read once, here. */
    const char *skip = getenv("L3D_TEST_SKIP_DP_REDUCE");
    dp->test_skip_reduce = skip && strcmp(skip, "1") == 0;
    dp->sync = true;
    m->hooks.grads_ctx = dp;
    m->hooks.grads_ready = grads_ready;
    return L3D_OK;
}

static void stage_free(struct l3d_dp *dp) {
    for (int s = 0; s < DP_SLOTS; s++) {
        if (dp->stage[s]) l3d_be_free(dp->m->be, dp->stage[s]);
        dp->stage[s] = NULL;
        dp->stage_cap[s] = dp->stage_fill[s] = 0;
    }
}

l3d_status l3d_dp_reduce_in(struct l3d_dp *dp, enum l3d_dtype t) {
    L3D_ASSERT(t == L3D_F32 || t == L3D_BF16 || t == L3D_F16);
    L3D_ASSERT(dp->npend[0] + dp->npend[1] + dp->npend[2] == 0); /* between steps */
    stage_free(dp);
    dp->reduce_dtype = t;
    if (t == dp->grad_dtype || dp->comm->size == 1) return L3D_OK;
    /* a list holds at most one layer's gradients (slots 0, 1) or the non-layer tensors' (2) */
    const int64_t caps[DP_SLOTS] = {dp->m->slot_size, dp->m->slot_size, dp->m->nonlayer_size};
    for (int s = 0; s < DP_SLOTS; s++) {
        size_t bytes = (size_t)caps[s] * l3d_dtype_size(t) + 64;
        dp->stage[s] = l3d_be_alloc(dp->m->be, bytes, "16-bit gradient reduction staging");
        if (!dp->stage[s]) {
            stage_free(dp);
            dp->reduce_dtype = dp->grad_dtype;
            return l3d_error(L3D_ERR_OOM, "cannot allocate %.2f GiB of staging for the 16-bit "
                             "gradient reduction: reduce in fp32 (--grad-reduce-dtype fp32) or "
                             "use a smaller model", (double)bytes / 1073741824.0);
        }
        l3d_be_memset(dp->m->be, dp->stage[s], 0, bytes); /* first touch now, not in the step */
        dp->stage_cap[s] = caps[s];
    }
    return L3D_OK;
}

void l3d_dp_poll_kernels(struct l3d_dp *dp) {
    L3D_ASSERT(dp->m && dp->overlap);
    if (dp->comm->size > 1) dp->m->hooks.progress = progress_hook;
}

void l3d_dp_free(struct l3d_dp *dp) {
    for (int s = 0; s < DP_SLOTS; s++) l3d_free(dp->pend[s]);
    if (dp->m) stage_free(dp);
    if (dp->grad_shard) l3d_be_free(dp->m->be, dp->grad_shard);
    if (dp->m) l3d_dp_zero3_free(dp);
    l3d_dp_stream_free(dp);
    if (dp->m) {
        dp->m->hooks.grads_ready = NULL;
        dp->m->hooks.progress = NULL;
        dp->m->hooks.grads_ctx = NULL;
    }
    memset(dp, 0, sizeof *dp);
}

void l3d_dp_opt_range(const struct l3d_dp *dp, int64_t *start, int64_t *count) {
    *start = dp->own_start;
    *count = dp->own_count;
}

void l3d_dp_begin_micro(struct l3d_dp *dp, bool last) {
    dp->sync = last || dp->zero >= 2;
    dp->piece_seq = 0;
    if (dp->zero >= 2) {
        /* the previous micro-batch's pieces were read from the slots and the non-layer buffer
         * that this backward overwrites; its non-layer gradients are in the shard now (when
         * deferred, they stay and accumulate in the non-layer buffer instead) */
        for (int s = 0; s < DP_SLOTS; s++) drain(dp, s);
        if (!dp->defer_nonlayer) l3d_gpt_zero_grad(dp->m);
    }
}

void l3d_dp_defer_nonlayer(struct l3d_dp *dp) { dp->defer_nonlayer = true; }

void l3d_dp_reduce_nonlayer(struct l3d_dp *dp) {
    L3D_ASSERT(dp->defer_nonlayer);
    if (dp->comm->size == 1 && dp->zero < 2 && !dp->xcomm) return;
    reduce_nonlayer(dp);
}

void l3d_dp_expert_groups(struct l3d_dp *dp, struct l3d_comm *ep, struct l3d_comm *edp) {
    L3D_ASSERT(ep && edp);
    if (dp->zero == 0) {
        dp->ecomm = edp;
        return;
    }
    L3D_ASSERT(dp->comm == edp);
    dp->xcomm = ep;
}

void l3d_dp_finish(struct l3d_dp *dp) {
    for (int s = 0; s < DP_SLOTS; s++) drain(dp, s);
}

/* Gradients of this rank's range as (pointer to global offset own_start). */
static const float *own_grads(const struct l3d_dp *dp) {
    return dp->zero >= 2 ? dp->grad_shard : dp->m->grads + dp->own_start;
}

void l3d_dp_grad_sumsq_add(const struct l3d_dp *dp, struct l3d_sumsq *sq, bool skip_wte) {
    L3D_ASSERT(sq->n >= 2);
    const float *g = own_grads(dp);
    int64_t s0 = dp->own_start, s1 = dp->own_start + dp->own_count;
    /* runs of tensors adjacent in the flat buffer with the same accumulator: one call each (a
     * fixed order for a given layout: the runs in tensor order, each summed as l3d_be_sumsq
     * sums) */
    int64_t run_lo = 0, run_hi = 0;
    int run_a = -1;
    for (int t = skip_wte ? 1 : 0; t < L3D_NUM_TENSORS; t++) {
        const struct l3d_tensor_info *ti = &dp->m->tensors[t];
        int64_t lo = ti->offset > s0 ? ti->offset : s0;
        int64_t hi = ti->offset + ti->count < s1 ? ti->offset + ti->count : s1;
        /* expert tensors split over the EP group: acc[2], which the trainer sums over it */
        int a = l3d_gpt_expert_tensor(t) && (dp->ecomm != dp->comm || dp->xcomm) ? 2
                : l3d_tp_tensor_split(t)                          ? 0
                                                                  : 1;
        L3D_ASSERT(a < sq->n);
        if (lo >= hi) continue;
        if (a == run_a && lo == run_hi) {
            run_hi = hi;
            continue;
        }
        if (run_a >= 0)
            l3d_be_sumsq(sq->be, dp->grad_dtype, sq->acc + run_a, g + (run_lo - s0),
                         run_hi - run_lo);
        run_a = a, run_lo = lo, run_hi = hi;
    }
    if (run_a >= 0)
        l3d_be_sumsq(sq->be, dp->grad_dtype, sq->acc + run_a, g + (run_lo - s0), run_hi - run_lo);
}

/* All-gathers every rank's range of buf (num_params elements of type dt) over the DP group, in
 * pieces of at most one bucket's bytes per rank. */
static void gather_ranges(struct l3d_dp *dp, void *buf, enum l3d_dtype dt, const char *what) {
    struct l3d_gpt *m = dp->m;
    int d = dp->comm->size;
    int64_t counts[256], displs[256];
    L3D_ASSERT(d <= 256);
    int64_t piece = (int64_t)(dp->bucket * l3d_dtype_size(dp->grad_dtype) / l3d_dtype_size(dt));
    double t0 = l3d_time_s();
    struct l3d_doing was = l3d_comm_doing(dp->comm, what, -1, -1);
    for (int64_t k = 0; k < dp->shard_size; k += piece) {
        bool any = false;
        for (int r = 0; r < d; r++) {
            int64_t start = (int64_t)r * dp->shard_size + k;
            int64_t end = (int64_t)(r + 1) * dp->shard_size;
            if (end > m->num_params) end = m->num_params;
            int64_t n = end - start;
            if (n > piece) n = piece;
            if (n < 0) n = 0;
            counts[r] = n;
            displs[r] = n > 0 ? start : 0;
            any = any || n > 0;
        }
        if (any) l3d_comm_all_gatherv(dp->comm, buf, counts, displs, dt, NULL);
    }
    l3d_comm_done(dp->comm, was);
    dp->comm_wait_s += l3d_time_s() - t0;
}

/* The next step's gradient zeroing where the fused optimizer step did not reach: under ZeRO-2/3
 * the model's buffers (the optimizer read the shard), else the flat buffer outside this rank's
 * range (ZeRO-1's other ranks' ranges). */
static void zero_rest(struct l3d_dp *dp) {
    struct l3d_gpt *m = dp->m;
    if (dp->zero >= 2 || !m->grads) {
        l3d_gpt_zero_grad(m);
        return;
    }
    int64_t end = dp->own_start + dp->own_count;
    l3d_be_memset(m->be, m->grads, 0, (size_t)dp->own_start * sizeof(float));
    l3d_be_memset(m->be, m->grads + end, 0, (size_t)(m->num_params - end) * sizeof(float));
}

void l3d_dp_step(struct l3d_dp *dp, struct l3d_adamw *opt, struct l3d_backend *be, float lr,
                 float grad_scale) {
    struct l3d_gpt *m = dp->m;
    L3D_ASSERT(opt->start == dp->own_start && opt->n == dp->own_count);
    /* the step zeroes the gradients it reads (this rank's range, ZeRO-2's shard) as it reads
     * them: one pass over them instead of two */
    float *g = (float *)own_grads(dp);
    if (dp->zero == 3) /* the shard is the parameters: nothing to gather until the next pass */
        l3d_adamw_step_zero(opt, be, dp->param_shard, true, g, grad_scale, m->tensors,
                            L3D_NUM_TENSORS, lr);
    else
        l3d_adamw_step_zero(opt, be, m->params, false, g, grad_scale, m->tensors,
                            L3D_NUM_TENSORS, lr);
    /* the updated ranges, in the model's type (16-bit in mixed precision, as Megatron-LM's
     * distributed optimizer gathers them) */
    if ((dp->zero == 1 || dp->zero == 2) && dp->comm->size > 1)
        gather_ranges(dp, m->params, dp->param_dtype, "ZeRO parameter all-gather");
    zero_rest(dp);
}

void l3d_dp_skip_step(struct l3d_dp *dp) {
    if (dp->zero >= 2)
        l3d_be_memset(dp->m->be, dp->grad_shard, 0,
                      (size_t)dp->own_count * l3d_dtype_size(dp->grad_dtype));
    l3d_gpt_zero_grad(dp->m);
}

void l3d_dp_test_poison(struct l3d_dp *dp) {
    const float nan = NAN;
    const uint16_t half_nan = 0x7fff; /* a NaN in bf16 and in fp16 */
    bool f32 = dp->grad_dtype == L3D_F32;
    size_t es = l3d_dtype_size(dp->grad_dtype);
    /* the last element: the first is the tied embedding's, which the norm leaves out on the
     * last pipeline stage (it counts the first stage's copy) */
    if (dp->own_count > 0)
        l3d_be_copy_h2d(dp->m->be, (char *)own_grads(dp) + (size_t)(dp->own_count - 1) * es,
                        f32 ? (const void *)&nan : &half_nan, es);
}

/* Whether n floats of device memory at g are all zero, in pieces through a host buffer. */
static bool device_zero(struct l3d_backend *be, const float *g, int64_t n) {
    enum { PIECE = 1 << 16 };
    float *h = l3d_alloc(PIECE * sizeof(float), "gradient check");
    bool zero = true;
    for (int64_t i = 0; i < n && zero; i += PIECE) {
        int64_t k = n - i < PIECE ? n - i : PIECE;
        l3d_be_copy_d2h(be, h, g + i, (size_t)k * sizeof(float));
        for (int64_t j = 0; j < k; j++) zero = zero && h[j] == 0.0f; /* NaN is not zero */
    }
    l3d_free(h);
    return zero;
}

const char *l3d_dp_test_grads_nonzero(struct l3d_dp *dp, bool poison) {
    struct l3d_gpt *m = dp->m;
    const struct { float *g; int64_t n; const char *what; } bufs[] = {
        {m->grads, m->grads ? m->num_params : 0, "gradients"},
        {m->grads_nonlayer, m->grads_nonlayer ? m->nonlayer_size : 0, "non-layer gradients"},
        {dp->grad_shard, dp->grad_shard ? dp->own_count : 0, "gradient shard"},
    };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        if (bufs[i].n <= 0) continue;
        if (poison) {
            const float one = 1.0f;
            l3d_be_copy_h2d(m->be, bufs[i].g + bufs[i].n - 1, &one, sizeof one);
            poison = false;
        }
        if (!device_zero(m->be, bufs[i].g, bufs[i].n)) return bufs[i].what;
    }
    return NULL;
}

struct l3d_dp_memory l3d_dp_memory(const struct l3d_dp *dp, const struct l3d_adamw *opt) {
    const struct l3d_gpt *m = dp->m;
    struct l3d_dp_memory r = {0};
    size_t psize = l3d_dtype_size(dp->param_dtype), gsize = l3d_dtype_size(dp->grad_dtype);
    r.params = (size_t)(dp->zero == 3 ? dp->own_count : m->num_params) * psize;
    r.gather = l3d_dp_zero3_gather_bytes(dp);
    /* AdamW's m and v, fp32, and the fp32 master weights in mixed precision */
    r.optimizer = (size_t)opt->n * (opt->master ? 3 : 2) * sizeof(float);
    if (m->grads) {
        r.grads = (size_t)m->num_params * gsize;
    } else {
        r.grads = (size_t)dp->own_count * gsize;
        r.grad_scratch = (size_t)(m->nonlayer_size + 2 * m->slot_size) * gsize;
    }
    for (int s = 0; s < DP_SLOTS; s++)
        if (dp->stage[s])
            r.reduce_staging += (size_t)dp->stage_cap[s] * l3d_dtype_size(dp->reduce_dtype) + 64;
    return r;
}

float *l3d_dp_fp32_params(struct l3d_dp *dp, const struct l3d_adamw *opt) {
    struct l3d_gpt *m = dp->m;
    L3D_ASSERT(!l3d_dp_fp32_streamed(dp, opt)); /* those go a piece at a time (pieces.c) */
    if (!opt->master) return m->params; /* fp32: the parameters themselves */
    if (opt->start == 0 && opt->n == m->num_params) return opt->master; /* the whole range */
    return m->grads; /* ZeRO-1: the fp32 gradient buffer is free between steps */
}

void l3d_dp_fp32_gather(struct l3d_dp *dp, const struct l3d_adamw *opt, float *buf) {
    if (!opt->master || buf == opt->master) return; /* whole already */
    l3d_be_copy_d2d(dp->m->be, buf + opt->start, opt->master, (size_t)opt->n * sizeof(float));
    if (dp->comm->size > 1) gather_ranges(dp, buf, L3D_F32, "fp32 master-weight all-gather");
}

void l3d_dp_fp32_params_done(struct l3d_dp *dp, struct l3d_adamw *opt, float *buf, bool loaded) {
    struct l3d_gpt *m = dp->m;
    if (!opt->master || !buf) return;
    if (loaded) { /* the model's 16-bit copy, and this rank's master range */
        l3d_be_convert(m->be, m->dt, m->params, L3D_F32, buf, m->num_params);
        if (buf != opt->master)
            l3d_be_copy_d2d(m->be, opt->master, buf + opt->start, (size_t)opt->n * sizeof(float));
    }
    if (buf == m->grads) l3d_be_memset(m->be, buf, 0, (size_t)m->num_params * sizeof(float));
}
