/*
 * QK-norm (include/llm3d/model.h, struct l3d_model_spec's qk_norm; Qwen3's q_norm and k_norm):
 * each query and key head of the q|k|v product's rows RMSNorm-ed over its hd elements, before
 * RoPE, with one weight vector for the query heads and one for the key heads.
 *
 * The heads of a row of q|k|v (N,QKV) are (Hl + 2 KVl) rows of hd: viewed as N (Hl + 2 KVl)
 * rows of hd, the query heads are rows n H3 + h (H3 = Hl + 2 KVl, h < Hl), the keys the next
 * KVl, the values the last KVl. The backend's row gather (l3d_be_moe_permute, rows[pos[r]] =
 * inp[r]) lays a block's rows out contiguously for its RMSNorm kernel (the model's own, over
 * N Hl or N KVl rows of hd), and its combine (out[r] += rows[pos[r]]) puts them back, onto rows
 * zeroed first: one row map (pos_q, pos_k, pos_v: N H3 int32 each, -1 for the other blocks' rows)
 * per block, the same for every micro-batch (a token's rows depend on its index alone). No new
 * kernel. Kept for backward: the product's output before the norm (N,QKV), so the norm's input
 * is gathered again there, and the norm's rstd (N (Hl + KVl), fp32). The gather and combine
 * kernels check their rows against a buffer of N H3 rows, so each scratch is that size.
 */
#include <string.h>

#include "qknorm.h"

enum { BLK_Q, BLK_K, BLK_V };

struct l3d_qknorm_state {
    int nsets;        /* layer_count x act_slots, or 1 (full recomputation) */
    void *base;       /* every buffer below, one allocation */
    size_t bytes;
    int64_t set_bytes; /* one set: pre (Nmax,QKV) of dt, then rstd (Nmax (Hl+KVl)) fp32 */
    void *s_in, *s_out, *s_dout, *s_tmp; /* scratch, (Nmax,QKV) of dt each */
    float *dw;        /* (2 hd) fp32: the weights' gradients before the TP sum */
    int32_t *pos[3];  /* (Nmax H3) each */
};

/* Local widths: head size, query, key/value heads of the shard, and all heads of a row. */
struct qk_dims {
    int64_t HS, Hl, KVl, H3, QKV;
};

static struct qk_dims dims(const struct l3d_model_spec *c, const struct l3d_shard *sh) {
    struct qk_dims d = {.HS = l3d_model_head_dim(c), .Hl = sh->head_count,
                        .KVl = l3d_shard_kv_count(c, sh)};
    d.H3 = d.Hl + 2 * d.KVl;
    d.QKV = d.H3 * d.HS;
    return d;
}

static int64_t align64(int64_t b) { return (b + 63) / 64 * 64; }

static int nsets(const struct l3d_shard *sh, int act_slots, enum l3d_recompute recompute) {
    return recompute == L3D_RECOMPUTE_FULL ? 1 : sh->layer_count * act_slots;
}

/* Bytes of one saved set, and of the shared part (scratch, weight gradients, row maps). */
static void sizes(const struct l3d_model_spec *c, const struct l3d_shard *sh, int64_t N,
                  int64_t es, int64_t *set, int64_t *shared) {
    struct qk_dims d = dims(c, sh);
    *set = align64(N * d.QKV * es) + align64(N * (d.Hl + d.KVl) * 4);
    *shared = 4 * align64(N * d.QKV * es) + align64(2 * d.HS * 4) + 3 * align64(N * d.H3 * 4);
}

size_t l3d_qknorm_act_bytes(const struct l3d_model_spec *cfg, const struct l3d_shard *sh, int B,
                            int T, int act_slots, enum l3d_recompute recompute, enum l3d_dtype dt) {
    if (!cfg->qk_norm || sh->layer_count == 0) return 0;
    int64_t set, shared;
    sizes(cfg, sh, (int64_t)B * T, (int64_t)l3d_dtype_size(dt), &set, &shared);
    return (size_t)(nsets(sh, act_slots, recompute) * set + shared);
}

/* The row maps of Nmax tokens (host, then the device). */
static void fill_maps(struct l3d_gpt *m, int64_t N) {
    struct qk_dims d = dims(&m->cfg, &m->shard);
    size_t bytes = (size_t)(N * d.H3) * sizeof(int32_t);
    int32_t *h = l3d_alloc(bytes, "qk-norm row maps");
    const int64_t lo[3] = {0, d.Hl, d.Hl + d.KVl}, cnt[3] = {d.Hl, d.KVl, d.KVl};
    for (int b = 0; b < 3; b++) {
        for (int64_t n = 0; n < N; n++)
            for (int64_t h3 = 0; h3 < d.H3; h3++) {
                int64_t j = h3 - lo[b];
                h[n * d.H3 + h3] = j >= 0 && j < cnt[b] ? (int32_t)(n * cnt[b] + j) : -1;
            }
        l3d_be_copy_h2d(m->be, m->qkn->pos[b], h, bytes);
        l3d_be_sync(m->be); /* before the host copy is refilled or freed */
    }
    l3d_free(h);
}

l3d_status l3d_qknorm_init(struct l3d_gpt *m) {
    const struct l3d_model_spec *c = &m->cfg;
    const struct l3d_shard *sh = &m->shard;
    if (!c->qk_norm || sh->layer_count == 0) return L3D_OK;
    if (!l3d_be_has_moe(m->be)) /* the row gather and combine are the MoE kernels */
        return l3d_error(L3D_ERR_ARG, "backend %s: --qk-norm runs on the cpu and check backends "
                         "(it gathers heads with the MoE row kernels, which this backend lacks); "
                         "use L3D_BACKEND=cpu", l3d_backend_name(m->be));
    int64_t N = (int64_t)m->Bmax * m->Tmax, es = (int64_t)m->es, set, shared;
    struct qk_dims d = dims(c, sh);
    sizes(c, sh, N, es, &set, &shared);
    struct l3d_qknorm_state *q = l3d_calloc(sizeof *q, "qk-norm state");
    m->qkn = q;
    q->nsets = nsets(sh, m->act_slots, m->recompute);
    q->set_bytes = set;
    q->bytes = (size_t)(q->nsets * set + shared);
    q->base = l3d_be_alloc(m->be, q->bytes, "qk-norm activations");
    if (!q->base)
        return l3d_error(L3D_ERR_OOM, "cannot allocate %.2f MiB for the qk-norm activations "
                         "(--qk-norm, B=%d, T=%d): lower --batch or --seq-len",
                         (double)q->bytes / 1048576.0, m->Bmax, m->Tmax);
    l3d_be_memset(m->be, q->base, 0, q->bytes);
    char *p = (char *)q->base + q->nsets * set;
    void **scr[4] = {&q->s_in, &q->s_out, &q->s_dout, &q->s_tmp};
    for (int i = 0; i < 4; i++, p += align64(N * d.QKV * es)) *scr[i] = p;
    q->dw = (float *)p;
    p += align64(2 * d.HS * 4);
    for (int b = 0; b < 3; b++, p += align64(N * d.H3 * 4)) q->pos[b] = (int32_t *)p;
    fill_maps(m, N);
    return L3D_OK;
}

void l3d_qknorm_free(struct l3d_gpt *m) {
    if (!m->qkn) return;
    l3d_be_free(m->be, m->qkn->base);
    l3d_free(m->qkn);
    m->qkn = NULL;
}

/* One call's sizes and layer l's saved set in the current slot (the rows before the norm, the
 * rstd): what forward and backward both start from. */
struct qk_call {
    struct qk_dims d;
    void *pre;
    float *rstd;
    int64_t R;       /* rows of hd: N H3 */
    int64_t rows[2]; /* of the query heads, of the key heads: N Hl, N KVl */
};

static struct qk_call call(const struct l3d_gpt *m, int l, int64_t N) {
    const struct l3d_qknorm_state *q = m->qkn;
    int i = q->nsets == 1 ? 0 : m->slot * m->shard.layer_count + l;
    struct qk_call c = {.d = dims(&m->cfg, &m->shard)};
    char *s = (char *)q->base + i * q->set_bytes;
    c.pre = s;
    c.rstd = (float *)(s + align64((int64_t)m->Bmax * m->Tmax * c.d.QKV * (int64_t)m->es));
    c.R = N * c.d.H3;
    c.rows[0] = N * c.d.Hl;
    c.rows[1] = N * c.d.KVl;
    return c;
}

static void *weight(const struct l3d_gpt *m, int b, int l) {
    return l3d_gpt_param_ptr(m, b == BLK_Q ? L3D_T_QNORMW : L3D_T_KNORMW, l);
}

/* dst (N,QKV) = src's value rows, zero in the query and key rows (which combines then add). */
static void values_only(struct l3d_gpt *m, const struct qk_call *c, void *dst, const void *src) {
    struct l3d_qknorm_state *q = m->qkn;
    l3d_be_memset(m->be, dst, 0, (size_t)(c->R * c->d.HS) * m->es);
    l3d_be_moe_permute(m->be, m->dt, q->s_in, src, q->pos[BLK_V], c->R, 1, c->d.HS);
    l3d_be_moe_combine(m->be, m->dt, dst, q->s_in, q->pos[BLK_V], NULL, c->R, 1, c->d.HS);
}

void l3d_qknorm_forward(struct l3d_gpt *m, int l, void *qkv, int64_t N) {
    struct l3d_qknorm_state *q = m->qkn;
    struct qk_call c = call(m, l, N);
    const enum l3d_dtype dt = m->dt;
    l3d_be_copy_d2d(m->be, c.pre, qkv, (size_t)(c.R * c.d.HS) * m->es);
    values_only(m, &c, qkv, c.pre);
    for (int b = BLK_Q; b <= BLK_K; b++) {
        l3d_be_moe_permute(m->be, dt, q->s_in, c.pre, q->pos[b], c.R, 1, c.d.HS);
        l3d_be_rmsnorm_forward(m->be, dt, q->s_out, c.rstd + (b == BLK_K ? c.rows[0] : 0),
                               q->s_in, weight(m, b, l), c.rows[b], c.d.HS, m->cfg.norm_eps);
        l3d_be_moe_combine(m->be, dt, qkv, q->s_out, q->pos[b], NULL, c.R, 1, c.d.HS);
    }
}

void l3d_qknorm_backward(struct l3d_gpt *m, int l, void *dqkv, int64_t N) {
    struct l3d_qknorm_state *q = m->qkn;
    struct qk_call c = call(m, l, N);
    const enum l3d_dtype dt = m->dt;
    int64_t HS = c.d.HS;
    /* tensor parallelism: each rank's heads give part of the weights' gradients, summed over
     * the group before they are added (the gradients accumulate over micro-batches) */
    bool tp = m->hooks.tp_all_reduce != NULL;
    float *gw[2] = {l3d_gpt_grad_ptr(m, L3D_T_QNORMW, l), l3d_gpt_grad_ptr(m, L3D_T_KNORMW, l)};
    if (tp) l3d_be_memset(m->be, q->dw, 0, 2 * (size_t)HS * sizeof(float));
    l3d_be_copy_d2d(m->be, q->s_tmp, dqkv, (size_t)(c.R * HS) * m->es);
    values_only(m, &c, dqkv, q->s_tmp); /* dv as it was */
    for (int b = BLK_Q; b <= BLK_K; b++) {
        l3d_be_moe_permute(m->be, dt, q->s_in, c.pre, q->pos[b], c.R, 1, HS);
        l3d_be_moe_permute(m->be, dt, q->s_dout, q->s_tmp, q->pos[b], c.R, 1, HS);
        l3d_be_memset(m->be, q->s_out, 0, (size_t)(c.rows[b] * HS) * m->es);
        l3d_be_rmsnorm_backward(m->be, dt, L3D_F32, q->s_out, tp ? q->dw + b * HS : gw[b],
                                q->s_dout, q->s_in, weight(m, b, l),
                                c.rstd + (b == BLK_K ? c.rows[0] : 0), c.rows[b], HS);
        l3d_be_moe_combine(m->be, dt, dqkv, q->s_out, q->pos[b], NULL, c.R, 1, HS);
    }
    if (!tp) return;
    m->hooks.tp_all_reduce(m->hooks.ctx, q->dw, 2 * HS, L3D_F32);
    for (int b = BLK_Q; b <= BLK_K; b++)
        l3d_be_add_inplace(m->be, L3D_F32, gw[b], q->dw + b * HS, HS);
}

void l3d_qknorm_rows(const struct l3d_gpt *m, int l, void *qkv, int64_t N, int64_t QKV,
                     void *tmp, float *rstd) {
    const struct l3d_model_spec *c = &m->cfg;
    int64_t HS = l3d_model_head_dim(c), NKV = l3d_model_kv_heads(c);
    const int64_t heads[2] = {c->NH, NKV}, at[2] = {0, c->NH * HS};
    for (int64_t n = 0; n < N; n++) /* a row's query heads, then its key heads: each contiguous */
        for (int b = BLK_Q; b <= BLK_K; b++) {
            void *x = (char *)qkv + (n * QKV + at[b]) * (int64_t)m->es;
            l3d_be_rmsnorm_forward(m->be, m->dt, tmp, rstd, x, weight(m, b, l), heads[b], HS,
                                   c->norm_eps);
            l3d_be_copy_d2d(m->be, x, tmp, (size_t)(heads[b] * HS) * m->es);
        }
}
