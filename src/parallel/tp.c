/* Tensor parallelism: shards and the model's collective hooks (include/llm3d/tp.h). */
#include <stdlib.h>
#include <string.h>

#include "llm3d/tp.h"

l3d_status l3d_tp_shard(const struct l3d_model_spec *cfg, int tp, int tp_rank,
                        bool sequence_parallel, struct l3d_shard *out) {
    int64_t F = cfg->ffn > 0 ? cfg->ffn : 4 * (int64_t)cfg->C;
    int kv = l3d_model_kv_heads(cfg);
    if (tp > cfg->NH)
        return l3d_error(L3D_ERR_LAYOUT, "--tp %d is larger than the model's %d attention heads: "
                         "choose a tensor-parallel size that divides the heads", tp, cfg->NH);
    if (cfg->NH % tp != 0)
        return l3d_error(L3D_ERR_LAYOUT, "--tp %d does not divide the model's %d attention heads: "
                         "choose a divisor of %d", tp, cfg->NH, cfg->NH);
    /* each rank holds whole key/value heads with the query heads they serve; more ranks than
     * key/value heads would need each replicated over tp / NKV ranks (Megatron-LM does so),
     * which llm3d does not do */
    if (kv % tp != 0)
        return l3d_error(L3D_ERR_LAYOUT, "--tp %d does not divide the model's %d key/value heads "
                         "(grouped-query attention; %d query heads): choose a divisor of %d (key/"
                         "value heads are not replicated across ranks)", tp, kv, cfg->NH, kv);
    if (F % tp != 0)
        return l3d_error(L3D_ERR_LAYOUT, "--tp %d does not divide the MLP width %lld", tp,
                         (long long)F);
    if (cfg->Vp % tp != 0)
        return l3d_error(L3D_ERR_LAYOUT, "--tp %d does not divide the padded vocabulary %d (the "
                         "vocabulary %d rounded up to a multiple of %d)", tp, cfg->Vp, cfg->V,
                         L3D_VOCAB_ALIGN);
    struct l3d_shard s = l3d_shard_full(cfg);
    s.head_count = cfg->NH / tp;
    s.head_start = tp_rank * s.head_count;
    s.ffn_count = F / tp;
    s.ffn_start = tp_rank * s.ffn_count;
    s.vocab_count = cfg->Vp / tp;
    s.vocab_start = tp_rank * s.vocab_count;
    s.adds_row_bias = tp_rank == 0;
    if (sequence_parallel) {
        s.sp_size = tp;
        s.sp_rank = tp_rank;
    }
    *out = s;
    return L3D_OK;
}

/* Every hook counts the time spent inside the communication call (exposed TP communication) and
 * the payload bytes; buffers hold n elements of type dt (the model's activation type, or fp32
 * statistics). One all-reduce over the group; req NULL: blocking. */
static void all_reduce(struct l3d_tp *tp, void *buf, int64_t n, enum l3d_dtype dt,
                       enum l3d_redop op, l3d_req *req) {
    double t0 = l3d_time_s();
    l3d_comm_all_reduce(tp->comm, buf, n, dt, op, req);
    tp->comm_s += l3d_time_s() - t0;
    tp->bytes += n * (int64_t)l3d_dtype_size(dt);
}

static void tp_sum(void *ctx, void *buf, int64_t n, enum l3d_dtype dt) {
    all_reduce(ctx, buf, n, dt, L3D_SUM, NULL);
}
static void tp_max(void *ctx, void *buf, int64_t n, enum l3d_dtype dt) {
    all_reduce(ctx, buf, n, dt, L3D_MAX, NULL);
}

static void tp_sum_begin(void *ctx, void *buf, int64_t n, enum l3d_dtype dt) {
    struct l3d_tp *tp = ctx;
    L3D_ASSERT(!tp->req.active);
    all_reduce(tp, buf, n, dt, L3D_SUM, &tp->req);
}

static void tp_sum_end(void *ctx) {
    struct l3d_tp *tp = ctx;
    double t0 = l3d_time_s();
    l3d_comm_wait(tp->comm, &tp->req);
    tp->comm_s += l3d_time_s() - t0;
}

static void tp_gather(void *ctx, const void *local, void *full, int64_t n, enum l3d_dtype dt) {
    struct l3d_tp *tp = ctx;
    double t0 = l3d_time_s();
    size_t esize = l3d_dtype_size(dt);
    l3d_be_copy_d2d(tp->be, (char *)full + (size_t)tp->comm->rank * (size_t)n * esize, local,
                    (size_t)n * esize);
    l3d_comm_all_gather(tp->comm, full, n, dt, NULL);
    tp->comm_s += l3d_time_s() - t0;
    tp->bytes += n * tp->comm->size * (int64_t)esize;
}

static void tp_scatter(void *ctx, const void *full, void *local, int64_t n, enum l3d_dtype dt) {
    struct l3d_tp *tp = ctx;
    double t0 = l3d_time_s();
    l3d_comm_reduce_scatter(tp->comm, full, local, n, dt, L3D_SUM, NULL);
    tp->comm_s += l3d_time_s() - t0;
    tp->bytes += n * tp->comm->size * (int64_t)l3d_dtype_size(dt);
}

void l3d_tp_attach(struct l3d_tp *tp, struct l3d_gpt *m, struct l3d_comm *tp_comm, bool overlap) {
    memset(tp, 0, sizeof *tp);
    tp->comm = tp_comm;
    tp->be = m->be;
    tp->act_dtype = m->dt;
    if (tp_comm->size == 1) return;
    m->hooks.ctx = tp;
    m->hooks.tp_all_reduce = tp_sum;
    m->hooks.tp_all_reduce_max = tp_max;
    m->hooks.tp_all_gather = tp_gather;
    m->hooks.tp_reduce_scatter = tp_scatter;
    if (overlap) {
        m->hooks.tp_all_reduce_begin = tp_sum_begin;
        m->hooks.tp_all_reduce_end = tp_sum_end;
    }
}

bool l3d_tp_tensor_split(int t) {
    return t == L3D_T_WTE || t == L3D_T_QKVW || t == L3D_T_QKVB || t == L3D_T_ATTPROJW ||
           t == L3D_T_FCW || t == L3D_T_FCB || t == L3D_T_FCPROJW || t == L3D_T_LMHEAD;
}

/* Rank 0 receives each rank's shard into device memory, stages it to the host and places it. */
l3d_status l3d_tp_gather(const struct l3d_gpt *m, struct l3d_comm *tp_comm, const float *local,
                         float *full) {
    const enum l3d_dtype dt = L3D_F32; /* the parameters' (l3d_gpt_shard_to_full is fp32) */
    size_t bytes = (size_t)m->num_params * l3d_dtype_size(dt);
    float *host = NULL, *dev = NULL;
    l3d_status st = L3D_OK;
    if (tp_comm->rank == 0) {
        host = l3d_try_alloc(bytes, "tp gather staging");
        dev = tp_comm->size > 1 ? l3d_be_alloc(m->be, bytes, "tp gather") : NULL;
        if (!host || (tp_comm->size > 1 && !dev))
            st = l3d_error(L3D_ERR_OOM, "cannot allocate 2 x %.2f MiB to gather the tensor-"
                           "parallel shards on rank 0: the host or the device is full",
                           (double)bytes / 1048576.0);
    }
    bool report;
    st = l3d_comm_agree(tp_comm, st, &report); /* before any rank sends */
    if (st == L3D_OK && tp_comm->rank != 0)
        l3d_comm_send(tp_comm, local, m->num_params, dt, 0, L3D_TAG_TP_GATHER, NULL);
    for (int r = 0; st == L3D_OK && tp_comm->rank == 0 && r < tp_comm->size; r++) {
        struct l3d_shard sh;
        L3D_ASSERT(l3d_tp_shard(&m->cfg, tp_comm->size, r, m->shard.sp_size > 1, &sh) == L3D_OK);
        struct l3d_tensor_info t[L3D_NUM_TENSORS];
        L3D_ASSERT(l3d_gpt_plan_tensors(&m->cfg, &sh, t) == m->num_params);
        const float *src = local;
        if (r > 0) {
            l3d_comm_recv(tp_comm, dev, m->num_params, dt, r, L3D_TAG_TP_GATHER, NULL);
            src = dev;
        }
        l3d_be_copy_d2h(m->be, host, src, bytes);
        l3d_gpt_shard_to_full(&m->cfg, &sh, host, full);
    }
    if (dev) l3d_be_free(m->be, dev);
    l3d_free(host);
    return st;
}
