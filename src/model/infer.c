/*
 * Incremental GPT-2 forward with a key/value cache (include/llm3d/infer.h).
 *
 * The same layer as l3d_gpt_forward, written for n new rows at positions pos..pos+n-1:
 *   x = wte[tok] + wpe[pos..]; for each layer: qkv = LN1(x) Wqkv + b, keys and values appended to
 *   the cache, attention of each new query over cached positions 0..its own, x += proj(att);
 *   x += fcproj(gelu(fc(LN2(x)))); logits = LNf(x_last) wte^T.
 * Attention (Vaswani et al. 2017, eq. 1): softmax(q k^T / sqrt(HS)) v, causal.
 */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "llm3d/infer.h"

struct l3d_infer {
    const struct l3d_gpt *m;
    int pos;
    int64_t maxT, C, F, Vp;
    float *kv;                 /* (L, maxT, 2C): keys | values of each cached position */
    float *x, *ln, *mean, *rstd, *qkv, *atty, *proj, *fch, *fchg; /* rows of n <= maxT */
    float *scores;             /* (threads, maxT) attention scratch */
    float *logits;             /* (Vp) */
    int nthreads;
};

l3d_status l3d_infer_init(struct l3d_infer **out, const struct l3d_gpt *m) {
    *out = NULL;
    const struct l3d_shard *s = &m->shard;
    const struct l3d_gpt_config *c = &m->cfg;
    if (s->layer_start != 0 || s->layer_count != c->L || s->head_count != c->NH ||
        s->ffn_count != 4 * (int64_t)c->C || s->vocab_count != c->Vp || !s->has_embedding ||
        !s->has_head || s->sp_size != 1)
        return l3d_error(L3D_ERR_LAYOUT, "generation runs on the whole model in one process: "
                         "load the checkpoint without tensor or pipeline parallelism");
    struct l3d_infer *inf = l3d_calloc(sizeof *inf, "inference state");
    inf->m = m;
    inf->maxT = c->maxT;
    inf->C = c->C;
    inf->F = 4 * (int64_t)c->C;
    inf->Vp = c->Vp;
    inf->nthreads = omp_get_max_threads();
    int64_t T = inf->maxT, C = inf->C;
    inf->kv = l3d_alloc((size_t)(c->L * T * 2 * C) * sizeof(float), "KV cache");
    inf->x = l3d_alloc((size_t)(T * C) * sizeof(float), "inference activations");
    inf->ln = l3d_alloc((size_t)(T * C) * sizeof(float), "inference activations");
    inf->mean = l3d_alloc((size_t)T * sizeof(float), "inference activations");
    inf->rstd = l3d_alloc((size_t)T * sizeof(float), "inference activations");
    inf->qkv = l3d_alloc((size_t)(T * 3 * C) * sizeof(float), "inference activations");
    inf->atty = l3d_alloc((size_t)(T * C) * sizeof(float), "inference activations");
    inf->proj = l3d_alloc((size_t)(T * C) * sizeof(float), "inference activations");
    inf->fch = l3d_alloc((size_t)(T * inf->F) * sizeof(float), "inference activations");
    inf->fchg = l3d_alloc((size_t)(T * inf->F) * sizeof(float), "inference activations");
    inf->scores = l3d_alloc((size_t)(inf->nthreads * T) * sizeof(float), "attention scratch");
    inf->logits = l3d_alloc((size_t)inf->Vp * sizeof(float), "logits");
    *out = inf;
    return L3D_OK;
}

void l3d_infer_free(struct l3d_infer *inf) {
    if (!inf) return;
    float *bufs[] = {inf->kv, inf->x, inf->ln, inf->mean, inf->rstd, inf->qkv, inf->atty,
                     inf->proj, inf->fch, inf->fchg, inf->scores, inf->logits};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) l3d_free(bufs[i]);
    l3d_free(inf);
}

int l3d_infer_pos(const struct l3d_infer *inf) { return inf->pos; }
void l3d_infer_reset(struct l3d_infer *inf) { inf->pos = 0; }

/* atty (n,C): each head of each new row i (position pos+i) attends over cached positions
 * 0..pos+i. q from qkv (n,3C); keys and values from the layer's cache (maxT,2C). Threads only
 * when the work (about n NH (pos+n) HS products) outweighs starting a parallel region. */
static void attend(struct l3d_infer *inf, const float *kv, int pos, int n) {
    const int64_t C = inf->C, NH = inf->m->cfg.NH, HS = C / NH;
    const float scale = 1.0f / sqrtf((float)HS);
#pragma omp parallel for schedule(static) if ((int64_t)n * NH * (pos + n) * HS > (1 << 16))
    for (int64_t ih = 0; ih < (int64_t)n * NH; ih++) {
        int64_t i = ih / NH, h = ih % NH, len = pos + i + 1;
        const float *q = inf->qkv + i * 3 * C + h * HS;
        float *sc = inf->scores + (int64_t)omp_get_thread_num() * inf->maxT;
        float mx = -INFINITY;
        for (int64_t t = 0; t < len; t++) {
            const float *k = kv + t * 2 * C + h * HS;
            float d = 0.0f;
#pragma omp simd reduction(+ : d)
            for (int64_t j = 0; j < HS; j++) d += q[j] * k[j];
            sc[t] = d * scale;
            mx = sc[t] > mx ? sc[t] : mx;
        }
        float sum = 0.0f;
        for (int64_t t = 0; t < len; t++) {
            sc[t] = expf(sc[t] - mx);
            sum += sc[t];
        }
        float inv = 1.0f / sum, *o = inf->atty + i * C + h * HS;
        memset(o, 0, (size_t)HS * sizeof(float));
        for (int64_t t = 0; t < len; t++) {
            const float *v = kv + t * 2 * C + C + h * HS;
            float p = sc[t] * inv;
#pragma omp simd
            for (int64_t j = 0; j < HS; j++) o[j] += p * v[j];
        }
    }
}

const float *l3d_infer_step(struct l3d_infer *inf, const int32_t *tokens, int n) {
    const struct l3d_gpt *m = inf->m;
    L3D_ASSERT(n >= 1 && inf->pos + n <= inf->maxT);
    for (int i = 0; i < n; i++) L3D_ASSERT(tokens[i] >= 0 && tokens[i] < m->cfg.V);
    const struct l3d_backend_i *k = m->be->i;
    void *bc = m->be->ctx;
    const struct l3d_tensor_info *ti = m->tensors;
    const float *P = m->params;
    const int64_t C = inf->C, F = inf->F, T = inf->maxT, N = n;
    const int pos = inf->pos;
    k->encoder_forward(bc, inf->x, tokens, P + ti[L3D_T_WTE].offset,
                       P + ti[L3D_T_WPE].offset + (int64_t)pos * C, 0, inf->Vp, 1, N, C);
    for (int l = 0; l < m->cfg.L; l++) {
#define LP(id) (P + ti[id].offset + (int64_t)l * ti[id].rows * ti[id].cols)
        float *kv = inf->kv + (int64_t)l * T * 2 * C;
        k->layernorm_forward(bc, inf->ln, inf->mean, inf->rstd, inf->x, LP(L3D_T_LN1W),
                             LP(L3D_T_LN1B), N, C);
        k->matmul_forward(bc, inf->qkv, inf->ln, LP(L3D_T_QKVW), LP(L3D_T_QKVB), N, C, 3 * C);
        for (int64_t i = 0; i < N; i++) /* keys and values of the new positions */
            memcpy(kv + (pos + i) * 2 * C, inf->qkv + i * 3 * C + C, (size_t)(2 * C) * sizeof(float));
        attend(inf, kv, pos, n);
        k->matmul_forward(bc, inf->proj, inf->atty, LP(L3D_T_ATTPROJW), LP(L3D_T_ATTPROJB), N, C, C);
        k->add_inplace(bc, inf->x, inf->proj, N * C);
        k->layernorm_forward(bc, inf->ln, inf->mean, inf->rstd, inf->x, LP(L3D_T_LN2W),
                             LP(L3D_T_LN2B), N, C);
        k->matmul_forward(bc, inf->fch, inf->ln, LP(L3D_T_FCW), LP(L3D_T_FCB), N, C, F);
        k->gelu_forward(bc, inf->fchg, inf->fch, N * F);
        k->matmul_forward(bc, inf->proj, inf->fchg, LP(L3D_T_FCPROJW), LP(L3D_T_FCPROJB), N, F, C);
        k->add_inplace(bc, inf->x, inf->proj, N * C);
#undef LP
    }
    const float *last = inf->x + (N - 1) * C;
    k->layernorm_forward(bc, inf->ln, inf->mean, inf->rstd, last, P + ti[L3D_T_LNFW].offset,
                         P + ti[L3D_T_LNFB].offset, 1, C);
    k->matmul_forward(bc, inf->logits, inf->ln, P + ti[L3D_T_WTE].offset, NULL, 1, C, inf->Vp);
    inf->pos += n;
    return inf->logits;
}
