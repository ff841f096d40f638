/*
 * Incremental GPT-2 forward with a key/value cache (include/llm3d/infer.h).
 *
 * The same layer as l3d_gpt_forward, written for n new rows at positions pos..pos+n-1:
 *   x = wte[tok] + wpe[pos..]; for each layer: qkv = LN1(x) Wqkv + b, keys and values appended to
 *   the cache, attention of each new query over cached positions 0..its own, x += proj(att);
 *   x += fcproj(gelu(fc(LN2(x)))); logits = LNf(x_last) wte^T.
 * Attention over the cache is the backend's l3d_be_attention_cached (Vaswani et al. 2017, eq. 1).
 * Every buffer is device memory of the model's backend; the logits come back by one copy.
 */
#include <stdbool.h>

#include "llm3d/infer.h"

struct l3d_infer {
    const struct l3d_gpt *m;
    struct l3d_backend *be;
    int pos;
    int64_t maxT, C, F, Vp;
    /* device memory of the model's backend */
    float *kv;                 /* (L, maxT, 2C): keys | values of each cached position */
    float *x, *ln, *mean, *rstd, *qkv, *atty, *proj, *fch, *fchg; /* rows of n <= maxT */
    float *logits;             /* (Vp) */
    int32_t *tokens;           /* (maxT) */
    float *logits_host;        /* (Vp): what l3d_infer_step returns */
};

l3d_status l3d_infer_init(struct l3d_infer **out, const struct l3d_gpt *m) {
    *out = NULL;
    L3D_ASSERT(m->dt == L3D_F32); /* generation runs the fp32 model of model.bin */
    const struct l3d_shard *s = &m->shard;
    const struct l3d_gpt_config *c = &m->cfg;
    if (s->layer_start != 0 || s->layer_count != c->L || s->head_count != c->NH ||
        s->ffn_count != 4 * (int64_t)c->C || s->vocab_count != c->Vp || !s->has_embedding ||
        !s->has_head || s->sp_size != 1)
        return l3d_error(L3D_ERR_LAYOUT, "generation runs on the whole model in one process: "
                         "load the checkpoint without tensor or pipeline parallelism");
    struct l3d_infer *inf = l3d_calloc(sizeof *inf, "inference state");
    inf->m = m;
    inf->be = m->be;
    inf->maxT = c->maxT;
    inf->C = c->C;
    inf->F = 4 * (int64_t)c->C;
    inf->Vp = c->Vp;
    int64_t T = inf->maxT, C = inf->C;
    const size_t es = l3d_dtype_size(L3D_F32);
    struct { void **p; size_t bytes; const char *what; } bufs[] = {
        {(void **)&inf->kv, (size_t)(c->L * T * 2 * C) * es, "KV cache"},
        {(void **)&inf->x, (size_t)(T * C) * es, "inference activations"},
        {(void **)&inf->ln, (size_t)(T * C) * es, "inference activations"},
        {(void **)&inf->mean, (size_t)T * es, "inference activations"},
        {(void **)&inf->rstd, (size_t)T * es, "inference activations"},
        {(void **)&inf->qkv, (size_t)(T * 3 * C) * es, "inference activations"},
        {(void **)&inf->atty, (size_t)(T * C) * es, "inference activations"},
        {(void **)&inf->proj, (size_t)(T * C) * es, "inference activations"},
        {(void **)&inf->fch, (size_t)(T * inf->F) * es, "inference activations"},
        {(void **)&inf->fchg, (size_t)(T * inf->F) * es, "inference activations"},
        {(void **)&inf->logits, (size_t)inf->Vp * es, "logits"},
        {(void **)&inf->tokens, (size_t)T * sizeof(int32_t), "inference tokens"},
    };
    size_t need = 0;
    bool ok = true;
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) {
        need += bufs[i].bytes;
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
    *out = inf;
    return L3D_OK;
}

void l3d_infer_free(struct l3d_infer *inf) {
    if (!inf) return;
    void *bufs[] = {inf->kv, inf->x, inf->ln, inf->mean, inf->rstd, inf->qkv, inf->atty,
                    inf->proj, inf->fch, inf->fchg, inf->logits, inf->tokens};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) l3d_be_free(inf->be, bufs[i]);
    l3d_free(inf->logits_host);
    l3d_free(inf);
}

int l3d_infer_pos(const struct l3d_infer *inf) { return inf->pos; }
void l3d_infer_reset(struct l3d_infer *inf) { inf->pos = 0; }

const float *l3d_infer_step(struct l3d_infer *inf, const int32_t *tokens, int n) {
    const struct l3d_gpt *m = inf->m;
    L3D_ASSERT(n >= 1 && inf->pos + n <= inf->maxT);
    for (int i = 0; i < n; i++) L3D_ASSERT(tokens[i] >= 0 && tokens[i] < m->cfg.V);
    struct l3d_backend *be = inf->be;
    const struct l3d_tensor_info *ti = m->tensors;
    const float *P = m->params;
    const int64_t C = inf->C, F = inf->F, T = inf->maxT, N = n, NH = m->cfg.NH;
    const int pos = inf->pos;
    const enum l3d_dtype dt = L3D_F32;
    l3d_be_copy_h2d(be, inf->tokens, tokens, (size_t)n * sizeof(int32_t));
    l3d_be_encoder_forward(be, dt, inf->x, inf->tokens, P + ti[L3D_T_WTE].offset,
                           P + ti[L3D_T_WPE].offset + (int64_t)pos * C, 0, inf->Vp, 1, N, C);
    for (int l = 0; l < m->cfg.L; l++) {
#define LP(id) (P + ti[id].offset + (int64_t)l * ti[id].rows * ti[id].cols)
        float *kv = inf->kv + (int64_t)l * T * 2 * C;
        l3d_be_layernorm_forward(be, dt, inf->ln, inf->mean, inf->rstd, inf->x, LP(L3D_T_LN1W),
                                 LP(L3D_T_LN1B), N, C);
        l3d_be_matmul_forward(be, dt, inf->qkv, inf->ln, LP(L3D_T_QKVW), LP(L3D_T_QKVB), N, C,
                              3 * C);
        for (int64_t i = 0; i < N; i++) /* keys and values of the new positions */
            l3d_be_copy_d2d(be, kv + (pos + i) * 2 * C, inf->qkv + i * 3 * C + C,
                            (size_t)(2 * C) * sizeof(float));
        l3d_be_attention_cached(be, dt, inf->atty, inf->qkv, kv, kv + C, pos, N, NH, C / NH,
                                3 * C, 2 * C);
        l3d_be_matmul_forward(be, dt, inf->proj, inf->atty, LP(L3D_T_ATTPROJW),
                              LP(L3D_T_ATTPROJB), N, C, C);
        l3d_be_add_inplace(be, dt, inf->x, inf->proj, N * C);
        l3d_be_layernorm_forward(be, dt, inf->ln, inf->mean, inf->rstd, inf->x, LP(L3D_T_LN2W),
                                 LP(L3D_T_LN2B), N, C);
        l3d_be_matmul_forward(be, dt, inf->fch, inf->ln, LP(L3D_T_FCW), LP(L3D_T_FCB), N, C, F);
        l3d_be_gelu_forward(be, dt, inf->fchg, inf->fch, N * F);
        l3d_be_matmul_forward(be, dt, inf->proj, inf->fchg, LP(L3D_T_FCPROJW),
                              LP(L3D_T_FCPROJB), N, F, C);
        l3d_be_add_inplace(be, dt, inf->x, inf->proj, N * C);
#undef LP
    }
    const float *last = inf->x + (N - 1) * C;
    l3d_be_layernorm_forward(be, dt, inf->ln, inf->mean, inf->rstd, last,
                             P + ti[L3D_T_LNFW].offset, P + ti[L3D_T_LNFB].offset, 1, C);
    l3d_be_matmul_forward(be, dt, inf->logits, inf->ln, P + ti[L3D_T_WTE].offset, NULL, 1, C,
                          inf->Vp);
    l3d_be_copy_d2h(be, inf->logits_host, inf->logits, (size_t)inf->Vp * sizeof(float));
    inf->pos += n;
    return inf->logits_host;
}
