/*
 * Incremental GPT-2 forward with a key/value cache (include/llm3d/infer.h).
 *
 * The same layer as l3d_gpt_forward, written for n new rows at positions pos..pos+n-1:
 *   x = wte[tok] + wpe[pos..]; for each layer: qkv = LN1(x) Wqkv + b, keys and values appended to
 *   the cache, attention of each new query over cached positions 0..its own, x += proj(att);
 *   x += fcproj(gelu(fc(LN2(x)))); logits = LNf(x_last) wte^T.
 * Llama: x = wte[tok]; RMSNorm for LN; q and k rotated at their positions (RoPE) before the keys
 * are cached; the cache holds the NKV key/value heads; SwiGLU for the MLP; the head is lmhead.
 * Attention over the cache is the backend's l3d_be_attention_cached (Vaswani et al. 2017, eq. 1).
 * Mixture of experts: a MoE layer's MLP is the block of src/model/moe.c over the new rows
 * (l3d_moe_infer_forward: router softmax, top-k, the experts' products, the shared MLP), dropless
 * as Hugging Face's Mixtral runs it; the leading dense layers keep the MLP. Its routing and rows
 * are sized once for the largest step (a prompt of maxT tokens).
 * Every buffer is device memory of the model's backend; the logits come back by one copy.
 */
#include <stdbool.h>

#include "llm3d/infer.h"
#include "moe.h"
#include "qknorm.h"

struct l3d_infer {
    const struct l3d_gpt *m;
    struct l3d_backend *be;
    int pos;
    int64_t maxT, C, F, Fm, Vp;
    int64_t Q, KV, QKV;        /* query channels NH hd, key (and value) channels NKV hd; q|k|v
                                * row width Q + 2 KV (hd: l3d_model_head_dim) */
    enum l3d_dtype dt;         /* the model's: activations and the cache (mean, rstd fp32) */
    size_t es;
    /* device memory of the model's backend */
    void *kv;                  /* (L, maxT, 2KV): keys | values of each cached position */
    int32_t *positions;        /* (maxT) 0..maxT-1: RoPE's positions from pos on */
    void *x, *ln, *qkv, *atty, *proj, *fch, *fchg; /* rows of n <= maxT */
    float *mean, *rstd;
    void *qkn_tmp; float *qkn_rstd; /* QK-norm's scratch: (NH hd), (NH) */
    void *logits;              /* (Vp) */
    float *logits32;           /* (Vp) fp32, a 16-bit model's logits widened */
    int32_t *tokens;           /* (maxT) */
    float *logits_host;        /* (Vp): what l3d_infer_step returns */
    struct l3d_moe_infer *moe; /* the MoE layers' block; NULL: a dense model */
};

static inline void *el(const void *p, int64_t i, size_t es) { return (char *)p + i * (int64_t)es; }

l3d_status l3d_infer_init(struct l3d_infer **out, const struct l3d_gpt *m) {
    *out = NULL;
    const struct l3d_shard *s = &m->shard;
    const struct l3d_model_spec *c = &m->cfg;
    if (s->layer_start != 0 || s->layer_count != c->L || s->head_count != c->NH ||
        s->ffn_count != c->ffn || s->vocab_count != c->Vp || !s->has_embedding ||
        !s->has_head || s->sp_size != 1)
        return l3d_error(L3D_ERR_LAYOUT, "generation runs on the whole model in one process: "
                         "load the checkpoint without tensor or pipeline parallelism");
    if (c->moe.experts > 0 && (s->expert_start != 0 || s->expert_count != c->moe.experts))
        return l3d_error(L3D_ERR_LAYOUT, "generation runs on the whole model in one process: "
                         "load every expert of the checkpoint (no expert parallelism)");
    struct l3d_infer *inf = l3d_calloc(sizeof *inf, "inference state");
    inf->m = m;
    inf->be = m->be;
    inf->maxT = c->maxT;
    inf->C = c->C;
    inf->F = c->ffn;
    inf->Fm = c->mlp == L3D_MLP_SWIGLU ? 2 * c->ffn : c->ffn;
    inf->Q = (int64_t)c->NH * l3d_model_head_dim(c);
    inf->KV = (int64_t)l3d_model_kv_heads(c) * l3d_model_head_dim(c);
    inf->QKV = inf->Q + 2 * inf->KV;
    inf->Vp = c->Vp;
    inf->dt = m->dt;
    inf->es = m->es;
    int64_t T = inf->maxT, C = inf->C;
    const size_t es = m->es, f4 = sizeof(float);
    /* the dense MLP's rows: none where every layer has experts */
    const size_t dense = c->moe.experts == 0 || c->moe.dense_layers > 0;
    struct { void **p; size_t bytes; const char *what; } bufs[] = {
        {&inf->kv, (size_t)(c->L * T * 2 * inf->KV) * es, "KV cache"},
        {(void **)&inf->positions, (size_t)T * sizeof(int32_t), "inference positions"},
        {&inf->x, (size_t)(T * C) * es, "inference activations"},
        {&inf->ln, (size_t)(T * C) * es, "inference activations"},
        {(void **)&inf->mean, (size_t)T * f4, "inference activations"},
        {(void **)&inf->rstd, (size_t)T * f4, "inference activations"},
        {&inf->qkn_tmp, c->qk_norm ? (size_t)inf->Q * es : 0, "inference activations"},
        {(void **)&inf->qkn_rstd, c->qk_norm ? (size_t)c->NH * f4 : 0, "inference activations"},
        {&inf->qkv, (size_t)(T * inf->QKV) * es, "inference activations"},
        {&inf->atty, (size_t)(T * inf->Q) * es, "inference activations"},
        {&inf->proj, (size_t)(T * C) * es, "inference activations"},
        {&inf->fch, dense * (size_t)(T * inf->Fm) * es, "inference activations"},
        {&inf->fchg, dense * (size_t)(T * inf->F) * es, "inference activations"},
        {&inf->logits, (size_t)inf->Vp * es, "logits"},
        {(void **)&inf->logits32, (size_t)inf->Vp * f4, "logits"},
        {(void **)&inf->tokens, (size_t)T * sizeof(int32_t), "inference tokens"},
    };
    size_t need = 0;
    bool ok = true;
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) {
        need += bufs[i].bytes;
        if (bufs[i].bytes == 0) continue; /* a block the model lacks */
        *bufs[i].p = l3d_be_alloc(inf->be, bufs[i].bytes, bufs[i].what);
        ok = ok && *bufs[i].p;
        if (*bufs[i].p) l3d_be_memset(inf->be, *bufs[i].p, 0, bufs[i].bytes); /* first touch */
    }
    inf->logits_host = l3d_try_alloc((size_t)inf->Vp * sizeof(float), "logits");
    if (!ok || !inf->logits_host) {
        l3d_infer_free(inf);
        return l3d_error(L3D_ERR_OOM, "cannot allocate %.2f GiB for the KV cache and generation "
                         "buffers (context %lld): use a model with a shorter context",
                         need / 1073741824.0, (long long)T);
    }
    l3d_status st = l3d_moe_infer_init(&inf->moe, m, T);
    if (st != L3D_OK) {
        l3d_infer_free(inf);
        return st;
    }
    int32_t *p = l3d_alloc((size_t)T * sizeof(int32_t), "inference positions");
    for (int64_t t = 0; t < T; t++) p[t] = (int32_t)t;
    l3d_be_copy_h2d(inf->be, inf->positions, p, (size_t)T * sizeof(int32_t));
    l3d_be_sync(inf->be); /* before the host copy goes */
    l3d_free(p);
    /* the attention over the longest cache once, on the zeroed buffers (its output unused): a
     * backend's scratch that grows with the cache (the CPU one widens 16-bit keys into it) is
     * made now, not in a generation step */
    l3d_be_attention_cached(inf->be, inf->dt, inf->atty, inf->qkv, inf->kv,
                            el(inf->kv, inf->KV, es), T - 1, 1, c->NH, l3d_model_kv_heads(c),
                            l3d_model_head_dim(c), inf->QKV, 2 * inf->KV);
    *out = inf;
    return L3D_OK;
}

void l3d_infer_free(struct l3d_infer *inf) {
    if (!inf) return;
    void *bufs[] = {inf->kv, inf->positions, inf->x, inf->ln, inf->mean, inf->rstd, inf->qkv, inf->atty,
                    inf->proj, inf->fch, inf->fchg, inf->logits, inf->logits32, inf->tokens,
                    inf->qkn_tmp, inf->qkn_rstd};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) l3d_be_free(inf->be, bufs[i]);
    l3d_free(inf->logits_host);
    l3d_moe_infer_free(inf->moe);
    l3d_free(inf);
}

int l3d_infer_pos(const struct l3d_infer *inf) { return inf->pos; }
void l3d_infer_reset(struct l3d_infer *inf) { inf->pos = 0; }

/* Tensor t's parameters of layer l, or NULL for a tensor the architecture lacks (a bias). */
static const void *param(const struct l3d_gpt *m, int t, int l) {
    return l3d_gpt_tensor_used(&m->cfg, t) ? l3d_gpt_param_ptr(m, t, l) : NULL;
}
#define P(t, l) param(m, t, l)

/* inf->ln (n, C) = the model's normalisation of x (n, C). */
static void norm(struct l3d_infer *inf, const void *x, const void *w, const void *b, int64_t n) {
    const struct l3d_model_spec *c = &inf->m->cfg;
    if (c->norm == L3D_NORM_RMSNORM)
        l3d_be_rmsnorm_forward(inf->be, inf->dt, inf->ln, inf->rstd, x, w, n, c->C, c->norm_eps);
    else
        l3d_be_layernorm_forward(inf->be, inf->dt, inf->ln, inf->mean, inf->rstd, x, w, b, n,
                                 c->C);
}

/* inf->proj (n, C) = layer l's MLP of the normalised inf->ln: the MoE block in a MoE layer. */
static void mlp(struct l3d_infer *inf, int l, int64_t n) {
    const struct l3d_gpt *m = inf->m;
    const struct l3d_model_spec *c = &m->cfg;
    struct l3d_backend *be = inf->be;
    const enum l3d_dtype dt = inf->dt;
    if (l3d_model_moe_layer(c, l)) {
        l3d_moe_infer_forward(inf->moe, m, l, inf->proj, inf->ln, n, inf->pos);
        return;
    }
    l3d_be_matmul_forward(be, dt, inf->fch, inf->ln, P(L3D_T_FCW, l), P(L3D_T_FCB, l), n, inf->C,
                          inf->Fm);
    if (c->mlp == L3D_MLP_SWIGLU)
        l3d_be_swiglu_forward(be, dt, inf->fchg, inf->fch, n, inf->F);
    else
        l3d_be_gelu_forward(be, dt, inf->fchg, inf->fch, n * inf->F);
    l3d_be_matmul_forward(be, dt, inf->proj, inf->fchg, P(L3D_T_FCPROJW, l), P(L3D_T_FCPROJB, l),
                          n, inf->F, inf->C);
}

/* inf->x (n, C) += add, then inf->ln its normalisation, in one pass over the rows
 * (l3d_be_residual_*norm_forward: the bits of the add, then norm). */
static void add_norm(struct l3d_infer *inf, const void *add, const void *w, const void *b,
                     int64_t n) {
    const struct l3d_model_spec *c = &inf->m->cfg;
    if (c->norm == L3D_NORM_RMSNORM)
        l3d_be_residual_rmsnorm_forward(inf->be, inf->dt, inf->x, inf->ln, inf->rstd, inf->x, add,
                                        w, n, c->C, c->norm_eps);
    else
        l3d_be_residual_layernorm_forward(inf->be, inf->dt, inf->x, inf->ln, inf->mean,
                                          inf->rstd, inf->x, add, w, b, n, c->C);
}

const float *l3d_infer_step(struct l3d_infer *inf, const int32_t *tokens, int n) {
    const struct l3d_gpt *m = inf->m;
    L3D_ASSERT(n >= 1 && inf->pos + n <= inf->maxT);
    for (int i = 0; i < n; i++) L3D_ASSERT(tokens[i] >= 0 && tokens[i] < m->cfg.V);
    struct l3d_backend *be = inf->be;
    const struct l3d_model_spec *c = &m->cfg;
    const int64_t C = inf->C, T = inf->maxT, N = n, NH = c->NH;
    const int64_t HS = l3d_model_head_dim(c), Q = inf->Q, KV = inf->KV, QKV = inf->QKV;
    const int64_t NKV = l3d_model_kv_heads(c);
    const int pos = inf->pos;
    const enum l3d_dtype dt = inf->dt;
    const size_t es = inf->es;
    const void *wpe = P(L3D_T_WPE, 0);
    l3d_be_copy_h2d(be, inf->tokens, tokens, (size_t)n * sizeof(int32_t));
    l3d_be_encoder_forward(be, dt, inf->x, inf->tokens, l3d_gpt_param_ptr(m, L3D_T_WTE, 0),
                           wpe ? el(wpe, (int64_t)pos * C, es) : NULL, 0, inf->Vp, 1, N, C);
    for (int l = 0; l < c->L; l++) {
        void *kv = el(inf->kv, (int64_t)l * T * 2 * KV, es);
        if (l == 0) /* the later layers' with the residual add before it (add_norm) */
            norm(inf, inf->x, P(L3D_T_LN1W, l), P(L3D_T_LN1B, l), N);
        l3d_be_matmul_forward(be, dt, inf->qkv, inf->ln, P(L3D_T_QKVW, l), P(L3D_T_QKVB, l), N, C,
                              QKV);
        if (c->qk_norm) /* each head's RMSNorm, before RoPE and the cache */
            l3d_qknorm_rows(m, l, inf->qkv, N, QKV, inf->qkn_tmp, inf->qkn_rstd);
        if (c->pos == L3D_POS_ROPE) /* rows at positions pos.. : their keys cached rotated */
            l3d_be_rope_forward(be, dt, inf->qkv, m->rope_inv_freq, inf->positions + pos, 1, N,
                                NH, NKV, HS);
        for (int64_t i = 0; i < N; i++) /* keys and values of the new positions */
            l3d_be_copy_d2d(be, el(kv, (pos + i) * 2 * KV, es), el(inf->qkv, i * QKV + Q, es),
                            (size_t)(2 * KV) * es);
        l3d_be_attention_cached(be, dt, inf->atty, inf->qkv, kv, el(kv, KV, es), pos, N, NH, NKV,
                                HS, QKV, 2 * KV);
        l3d_be_matmul_forward(be, dt, inf->proj, inf->atty, P(L3D_T_ATTPROJW, l),
                              P(L3D_T_ATTPROJB, l), N, Q, C);
        add_norm(inf, inf->proj, P(L3D_T_LN2W, l), P(L3D_T_LN2B, l), N);
        mlp(inf, l, N);
        if (l + 1 < c->L) /* the final norm reads the last row only: a plain add before it */
            add_norm(inf, inf->proj, P(L3D_T_LN1W, l + 1), P(L3D_T_LN1B, l + 1), N);
        else
            l3d_be_add_inplace(be, dt, inf->x, inf->proj, N * C);
    }
    norm(inf, el(inf->x, (N - 1) * C, es), P(L3D_T_LNFW, 0), P(L3D_T_LNFB, 0), 1);
    l3d_be_matmul_forward(be, dt, inf->logits, inf->ln,
                          P(c->untied ? L3D_T_LMHEAD : L3D_T_WTE, 0), NULL, 1, C, inf->Vp);
    const float *lg = inf->logits;
    if (dt != L3D_F32) { /* widened on the device (exact), then the one copy back */
        l3d_be_convert(be, L3D_F32, inf->logits32, dt, inf->logits, inf->Vp);
        lg = inf->logits32;
    }
    l3d_be_copy_d2h(be, inf->logits_host, lg, (size_t)inf->Vp * sizeof(float));
    inf->pos += n;
    return inf->logits_host;
}
