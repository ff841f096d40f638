/*
 * Whole-model tests at tiny sizes:
 *   - forward loss equals a double-precision GPT-2 composed from the reference kernels;
 *   - every parameter's gradient equals central finite differences of that double model;
 *   - initial loss is about ln(V); a tiny model overfits one batch; two runs are bit-identical;
 *   - the model written against a shard: a two-stage layer split gives the full model's loss and
 *     gradients, and a head slice initialises the same values as the full model holds there;
 *   - the checking backend gives bit-identical results to the CPU backend.
 * The model's buffers are device memory of the backend ($L3D_BACKEND, default cpu): the tests read
 * and write them through copies (test_to_host, l3d_be_copy_h2d).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "llm3d/model.h"
#include "llm3d/spec.h"
#include "llm3d/optim.h"
#include "support/ref.h"
#include "test.h"

/* ---- the double-precision reference GPT-2 --------------------------------------------------- */

struct ref_gpt {
    struct l3d_model_spec cfg;
    const struct l3d_tensor_info *t; /* offsets of the full model */
    const int32_t *inp, *tgt;
    int B, T;
    double *params;
    int mutant; /* the Llama reference, wrong on purpose: 1 key heads swapped, 2 no RoPE,
                 * 3 no QK-norm, 4 QK-norm's query and key weights swapped; either
                 * reference: 5 a head's size taken as C / NH where head_dim sets it apart */
};

static double *dalloc(int64_t n) { return calloc((size_t)n, sizeof(double)); }

/* A head's size as the spec says it (head_dim, else C / NH), read here rather than through
 * l3d_model_head_dim so that the reference does not share the model's reading of it. */
static int64_t ref_head_dim(const struct ref_gpt *r) {
    const struct l3d_model_spec *c = &r->cfg;
    return c->head_dim > 0 && r->mutant != 5 ? c->head_dim : c->C / c->NH;
}

/* Mean loss of the full model over (B,T), params in llm.c's layout. */
static double ref_gpt_loss(void *ctx) {
    struct ref_gpt *r = ctx;
    const struct l3d_model_spec *c = &r->cfg;
    int64_t B = r->B, T = r->T, C = c->C, N = B * T, NH = c->NH, Vp = c->Vp;
    int64_t HS = ref_head_dim(r), Q = NH * HS; /* the attention's channels: C unless head_dim */
    const double *p = r->params;
    const struct l3d_tensor_info *t = r->t;
#define P(id, l) (p + t[id].offset + (int64_t)(l) * t[id].rows * t[id].cols)
    double *x = dalloc(N * C), *ln = dalloc(N * C), *mean = dalloc(N), *rstd = dalloc(N);
    double *qkv = dalloc(N * 3 * Q), *atty = dalloc(N * Q), *att = dalloc(B * NH * T * T);
    double *tmp = dalloc(N * C), *fch = dalloc(N * 4 * C), *gel = dalloc(N * 4 * C);
    double *logits = dalloc(N * Vp), *loss = dalloc(N);
    ref_encoder_forward(x, r->inp, P(L3D_T_WTE, 0), P(L3D_T_WPE, 0), 0, Vp, B, T, C);
    for (int l = 0; l < c->L; l++) {
        ref_layernorm_forward(ln, mean, rstd, x, P(L3D_T_LN1W, l), P(L3D_T_LN1B, l), N, C);
        ref_matmul_forward(qkv, ln, P(L3D_T_QKVW, l), P(L3D_T_QKVB, l), N, C, 3 * Q);
        ref_attention_forward(atty, att, qkv, B, T, NH, HS);
        ref_matmul_forward(tmp, atty, P(L3D_T_ATTPROJW, l), P(L3D_T_ATTPROJB, l), N, Q, C);
        ref_residual_forward(x, x, tmp, N * C);
        ref_layernorm_forward(ln, mean, rstd, x, P(L3D_T_LN2W, l), P(L3D_T_LN2B, l), N, C);
        ref_matmul_forward(fch, ln, P(L3D_T_FCW, l), P(L3D_T_FCB, l), N, C, 4 * C);
        ref_gelu_forward(gel, fch, N * 4 * C);
        ref_matmul_forward(tmp, gel, P(L3D_T_FCPROJW, l), P(L3D_T_FCPROJB, l), N, 4 * C, C);
        ref_residual_forward(x, x, tmp, N * C);
    }
    ref_layernorm_forward(ln, mean, rstd, x, P(L3D_T_LNFW, 0), P(L3D_T_LNFB, 0), N, C);
    ref_matmul_forward(logits, ln, P(L3D_T_WTE, 0), NULL, N, C, Vp);
    ref_xent_loss(loss, logits, r->tgt, 0, N, Vp, c->V);
#undef P
    double s = 0.0;
    for (int64_t i = 0; i < N; i++) s += loss[i];
    free(x); free(ln); free(mean); free(rstd); free(qkv); free(atty); free(att); free(tmp);
    free(fch); free(gel); free(logits); free(loss);
    return s / (double)N;
}

/* ---- the double-precision reference Llama ----------------------------------------------------
 * Touvron et al. 2023: x = wte[tok]; per layer x += Wo attn(rope(RMSNorm(x) Wqkv)),
 * x += Wd (silu(h Wg) * h Wu) with h = RMSNorm(x); logits = RMSNorm(x) lmhead^T; composed from
 * the reference kernels (tests/support/ref.c), grouped-query attention as multi-head attention on
 * explicitly repeated key/value heads. */

/* QK-norm in place on qkv (N, (NH + 2 NKV) HS): each query head RMSNorm-ed with qw, each key
 * head with kw (HS each), the values untouched. */
static void ref_qk_norm(double *qkv, const double *qw, const double *kw, int64_t N, int64_t NH,
                        int64_t NKV, int64_t HS, double eps) {
    int64_t QKV = (NH + 2 * NKV) * HS;
    for (int64_t n = 0; n < N; n++) { /* in place: each row is read before it is written */
        ref_rmsnorm_forward(qkv + n * QKV, NULL, qkv + n * QKV, qw, NH, HS, eps);
        ref_rmsnorm_forward(qkv + n * QKV + NH * HS, NULL, qkv + n * QKV + NH * HS, kw, NKV, HS,
                            eps);
    }
}

static double ref_llama_loss(void *ctx) {
    struct ref_gpt *r = ctx;
    const struct l3d_model_spec *c = &r->cfg;
    int64_t B = r->B, T = r->T, C = c->C, N = B * T, NH = c->NH, HS = ref_head_dim(r), Vp = c->Vp;
    int64_t NKV = l3d_model_kv_heads(c), QKV = (NH + 2 * NKV) * HS, F = c->ffn, Q = NH * HS;
    const double *p = r->params;
    const struct l3d_tensor_info *t = r->t;
#define P(id, l) (p + t[id].offset + (int64_t)(l) * t[id].rows * t[id].cols)
    double *x = dalloc(N * C), *ln = dalloc(N * C), *qkv = dalloc(N * QKV), *rot = dalloc(N * QKV);
    double *full = dalloc(N * 3 * Q), *atty = dalloc(N * Q), *tmp = dalloc(N * C);
    double *gu = dalloc(N * 2 * F), *h = dalloc(N * F), *logits = dalloc(N * Vp), *loss = dalloc(N);
    double inv[64];
    int32_t pos[64];
    L3D_ASSERT(HS / 2 <= 64 && T <= 64);
    for (int64_t i = 0; i < HS / 2; i++) inv[i] = pow(c->rope.theta, -2.0 * (double)i / (double)HS);
    for (int64_t i = 0; i < T; i++) pos[i] = (int32_t)i;
    ref_encoder_forward(x, r->inp, P(L3D_T_WTE, 0), NULL, 0, Vp, B, T, C);
    for (int l = 0; l < c->L; l++) {
        ref_rmsnorm_forward(ln, NULL, x, P(L3D_T_LN1W, l), N, C, c->norm_eps);
        ref_matmul_forward(qkv, ln, P(L3D_T_QKVW, l), NULL, N, C, QKV);
        if (c->qk_norm && r->mutant != 3) /* Qwen3: each q and k head's RMSNorm, before RoPE */
            ref_qk_norm(qkv, P(r->mutant == 4 ? L3D_T_KNORMW : L3D_T_QNORMW, l),
                        P(r->mutant == 4 ? L3D_T_QNORMW : L3D_T_KNORMW, l), N, NH, NKV, HS,
                        c->norm_eps);
        if (r->mutant == 2)
            memcpy(rot, qkv, (size_t)(N * QKV) * sizeof(double));
        else
            ref_rope_forward(rot, qkv, inv, pos, B, T, NH, NKV, HS);
        for (int64_t n = 0; r->mutant == 1 && n < N; n++) /* key heads 0 and 1 swapped */
            for (int64_t d = 0; d < HS; d++) {
                double *k = rot + n * QKV + NH * HS + d, k0 = k[0];
                k[0] = k[HS];
                k[HS] = k0;
            }
        ref_gqa_expand(full, rot, B, T, NH, NKV, HS);
        ref_attention_forward(atty, NULL, full, B, T, NH, HS);
        ref_matmul_forward(tmp, atty, P(L3D_T_ATTPROJW, l), NULL, N, Q, C);
        ref_residual_forward(x, x, tmp, N * C);
        ref_rmsnorm_forward(ln, NULL, x, P(L3D_T_LN2W, l), N, C, c->norm_eps);
        ref_matmul_forward(gu, ln, P(L3D_T_FCW, l), NULL, N, C, 2 * F);
        ref_swiglu_forward(h, gu, N, F);
        ref_matmul_forward(tmp, h, P(L3D_T_FCPROJW, l), NULL, N, F, C);
        ref_residual_forward(x, x, tmp, N * C);
    }
    ref_rmsnorm_forward(ln, NULL, x, P(L3D_T_LNFW, 0), N, C, c->norm_eps);
    ref_matmul_forward(logits, ln, P(c->untied ? L3D_T_LMHEAD : L3D_T_WTE, 0), NULL, N, C, Vp);
    ref_xent_loss(loss, logits, r->tgt, 0, N, Vp, c->V);
#undef P
    double s = 0.0;
    for (int64_t i = 0; i < N; i++) s += loss[i];
    free(x); free(ln); free(qkv); free(rot); free(full); free(atty); free(tmp); free(gu); free(h);
    free(logits); free(loss);
    return s / (double)N;
}

/* ---- helpers ------------------------------------------------------------------------------ */

static struct l3d_model_spec tiny_config(int L, int C, int NH, int V, int maxT) {
    struct l3d_model_spec c = {.L = L, .C = C, .NH = NH, .V = V, .maxT = maxT};
    L3D_ASSERT(l3d_gpt_config_finish(&c) == L3D_OK);
    return c;
}

/* Random weights with non-trivial biases and LayerNorm affine parts; wte padding rows stay 0. */
static void randomize(struct l3d_gpt *m, uint64_t seed) {
    float *p = malloc((size_t)m->num_params * sizeof(float));
    ref_fill_normal(p, m->num_params, 0.0f, 0.3f, seed, 1);
    for (int k = 0; k < 2; k++) { /* the padding rows of the embedding and of an untied head */
        const struct l3d_tensor_info *w = &m->tensors[k ? L3D_T_LMHEAD : L3D_T_WTE];
        for (int64_t r = m->cfg.V; r < w->rows; r++)
            memset(p + w->offset + r * w->cols, 0, (size_t)w->cols * sizeof(float));
    }
    const int lnw[] = {L3D_T_LN1W, L3D_T_LN2W, L3D_T_LNFW, L3D_T_QNORMW, L3D_T_KNORMW};
    for (int i = 0; i < 5; i++) {
        const struct l3d_tensor_info *t = &m->tensors[lnw[i]];
        for (int64_t k = 0; k < t->count; k++) p[t->offset + k] += 1.0f;
    }
    l3d_be_copy_h2d(m->be, m->params, p, (size_t)m->num_params * sizeof(float));
    free(p);
}

/* ---- tests -------------------------------------------------------------------------------- */

/* A model of cfg, unsharded, for batches of B x T with flat gradients (its weights unset). */
static struct l3d_gpt *full_model(struct l3d_backend *be, const struct l3d_model_spec *cfg, int B,
                                  int T) {
    struct l3d_shard sh = l3d_shard_full(cfg);
    struct l3d_gpt *m;
    L3D_ASSERT(l3d_gpt_init(&m, cfg, &sh, be, B, T, L3D_GRADS_FLAT) == L3D_OK);
    return m;
}

/* n input tokens and n targets below V, from seed (streams 1 and 2). */
static void fill_batch(int32_t *inp, int32_t *tgt, int64_t n, int32_t V, uint64_t seed) {
    ref_fill_tokens(inp, n, 0, V, seed, 1);
    ref_fill_tokens(tgt, n, 0, V, seed, 2);
}

/* The model's loss and every tensor's gradient against the double reference `loss` (GPT-2's or
 * Llama's) and its central finite differences; the head's cross-entropy xent_rows rows at a time
 * (0: the default, all 10 rows at these sizes). */
static void check_forward_and_gradients(struct l3d_backend *be, struct l3d_model_spec cfg,
                                        double (*ref_loss)(void *ctx), int64_t xent_rows) {
    int B = 2, T = 5;
    struct l3d_shard sh = l3d_shard_full(&cfg);
    sh.xent_rows = xent_rows;
    struct l3d_gpt *m;
    L3D_ASSERT(l3d_gpt_init(&m, &cfg, &sh, be, B, T, L3D_GRADS_FLAT) == L3D_OK);
    CHECK(m->xent_rows == (xent_rows ? xent_rows : B * T));
    randomize(m, 7);
    int32_t inp[10], tgt[10];
    fill_batch(inp, tgt, B * T, cfg.V, 3);
    CHECK(m->num_params == l3d_gpt_param_count(&cfg));
    /* the activations' closed form (of every architecture) against the plan, up to alignment */
    size_t want = l3d_gpt_act_bytes(&cfg, &sh, B, T, 1, L3D_RECOMPUTE_NONE, true);
    CHECK(m->act_bytes >= want && m->act_bytes <= want + 64 * (size_t)(cfg.L * 13 + 40));

    l3d_gpt_zero_grad(m);
    float loss = l3d_gpt_forward(m, inp, tgt, B, T);
    l3d_gpt_backward(m, 1.0f / (float)(B * T), NULL);

    struct ref_gpt r = {.cfg = cfg, .t = m->tensors, .inp = inp, .tgt = tgt, .B = B, .T = T};
    r.params = dalloc(m->num_params);
    float *params = test_to_host(be, m->params, m->num_params);
    float *grads = test_to_host(be, m->grads, m->num_params);
    ref_to_double(r.params, params, m->num_params);
    double rloss = ref_loss(&r);
    CHECK_NEAR(loss, rloss, 2e-6 * fabs(rloss));
    /* the oracle sees a wrong KV grouping, missing RoPE or QK-norm, and a coupled head size */
    for (r.mutant = 1; r.mutant <= 5; r.mutant++) {
        bool llama = ref_loss == ref_llama_loss;
        if ((r.mutant <= 2 && !llama) || ((r.mutant == 3 || r.mutant == 4) && !cfg.qk_norm) ||
            (r.mutant == 5 && cfg.head_dim == 0))
            continue;
        double bad = ref_loss(&r);
        CHECK(!(fabs(loss - bad) <= 100 * 2e-6 * fabs(bad)));
    }
    r.mutant = 0;

    /* every parameter of every tensor: |analytic - numeric| small against the tensor's scale */
    for (int ti = 0; ti < L3D_NUM_TENSORS; ti++) {
        const struct l3d_tensor_info *t = &m->tensors[ti];
        double worst = 0.0, scale = 1e-3;
        int64_t worst_i = -1;
        /* up to 97 elements spread over the tensor (a prime stride reaches every row and column
         * pattern), all of them in small tensors */
        int64_t stride = t->count > 97 ? t->count / 97 : 1;
        double *num = dalloc(t->count);
        for (int64_t i = 0; i < t->count; i += stride) {
            num[i] = ref_fd_partial(ref_loss, &r, r.params + t->offset, i, 1e-5);
            scale = fmax(scale, fabs(num[i]));
        }
        for (int64_t i = 0; i < t->count; i += stride) {
            double d = fabs((double)grads[t->offset + i] - num[i]);
            if (!isnan(worst) && !(d <= worst)) { /* a NaN d becomes the worst and stays */
                worst = d;
                worst_i = i;
            }
        }
        if (!(worst <= 2e-4 * scale))
            fprintf(stderr, "tensor %s: worst element %lld analytic %.8g numeric %.8g\n", t->name,
                    (long long)worst_i, grads[t->offset + worst_i], num[worst_i]);
        CHECK(worst <= 2e-4 * scale);
        if (ti == L3D_T_WTE || ti == L3D_T_LMHEAD) /* padding rows: exactly zero gradient */
            for (int64_t i = (int64_t)cfg.V * cfg.C; i < t->count; i++)
                CHECK(grads[t->offset + i] == 0.0f);
        free(num);
    }
    free(r.params);
    free(params);
    free(grads);
    l3d_gpt_free(m);
}

static void test_forward_and_gradients(struct l3d_backend *be) {
    check_forward_and_gradients(be, tiny_config(2, 16, 2, 50, 8), ref_gpt_loss, 0); /* Vp 128 */
    /* the chunked cross-entropy: chunks of 3 of the 10 rows (the last one short), tied head */
    check_forward_and_gradients(be, tiny_config(2, 16, 2, 50, 8), ref_gpt_loss, 3);
    /* Llama: 4 query heads over 2 key/value heads of 4 channels, SwiGLU of 24, untied head */
    struct l3d_model_spec c = {.L = 2, .C = 16, .NH = 4, .NKV = 2, .V = 50, .maxT = 8, .ffn = 24,
                               .norm_eps = 1e-6f};
    l3d_model_set_arch(&c, L3D_ARCH_LLAMA);
    L3D_ASSERT(l3d_gpt_config_finish(&c) == L3D_OK);
    check_forward_and_gradients(be, c, ref_llama_loss, 0);
    check_forward_and_gradients(be, c, ref_llama_loss, 4); /* chunked, the untied head */
    /* the tensor table: Llama's 9 tensors, none of GPT-2's biases or wpe */
    struct l3d_tensor_info ti[L3D_NUM_TENSORS];
    struct l3d_shard full = l3d_shard_full(&c);
    int used = 0;
    l3d_gpt_plan_tensors(&c, &full, ti);
    for (int i = 0; i < L3D_NUM_TENSORS; i++) used += ti[i].count > 0;
    CHECK(used == 9 && ti[L3D_T_QKVW].rows == 32 && ti[L3D_T_FCW].rows == 48 &&
          ti[L3D_T_WPE].count == 0 && ti[L3D_T_QKVB].count == 0 && ti[L3D_T_LMHEAD].rows == 128);
    CHECK((double)l3d_gpt_param_count(&c) == l3d_model_param_count(&c));
    /* QK-norm (Qwen3): two more tensors of one head's size a layer, replicated over the heads */
    c.qk_norm = true;
    check_forward_and_gradients(be, c, ref_llama_loss, 0);
    l3d_gpt_plan_tensors(&c, &full, ti);
    CHECK(ti[L3D_T_QNORMW].count == 2 * 4 && ti[L3D_T_KNORMW].count == 2 * 4);
    CHECK((double)l3d_gpt_param_count(&c) == l3d_model_param_count(&c));
    /* a head's size apart from C / NH (Qwen3's head_dim): 4 heads of 6 over 16 channels, q|k|v
     * (4 + 2 x 2) x 6 = 48 rows, the projection (16, 24), QK-norm's vectors of 6 */
    c.head_dim = 6;
    L3D_ASSERT(l3d_gpt_config_finish(&c) == L3D_OK && c.head_dim == 6);
    check_forward_and_gradients(be, c, ref_llama_loss, 0);
    l3d_gpt_plan_tensors(&c, &full, ti);
    CHECK(ti[L3D_T_QKVW].rows == 48 && ti[L3D_T_QKVW].cols == 16 &&
          ti[L3D_T_ATTPROJW].rows == 16 && ti[L3D_T_ATTPROJW].cols == 24 &&
          ti[L3D_T_QNORMW].count == 2 * 6);
    CHECK((double)l3d_gpt_param_count(&c) == l3d_model_param_count(&c));
    /* the activations' closed form at 64 rows, where the attention's 24 channels (not C = 16)
     * outweigh the allocations' alignment */
    struct l3d_gpt *big = full_model(be, &c, 8, 8);
    size_t want = l3d_gpt_act_bytes(&c, &full, 8, 8, 1, L3D_RECOMPUTE_NONE, true);
    CHECK(big->act_bytes >= want && big->act_bytes <= want + 64 * (size_t)(c.L * 13 + 40));
    l3d_gpt_free(big);
    /* GPT-2's blocks (biases, learned positions, MHA) with heads of 10 over 16 channels */
    struct l3d_model_spec g = tiny_config(2, 16, 2, 50, 8);
    g.head_dim = 10;
    L3D_ASSERT(l3d_gpt_config_finish(&g) == L3D_OK);
    check_forward_and_gradients(be, g, ref_gpt_loss, 0);
    CHECK((double)l3d_gpt_param_count(&g) == l3d_model_param_count(&g) &&
          !l3d_model_gpt2_blocks(&g)); /* llm.c's files cannot hold it */
}

static void test_initial_loss(struct l3d_backend *be) {
    struct l3d_model_spec cfg;
    CHECK(l3d_model_preset(&cfg, "tiny") == L3D_OK);
    int B = 4, T = 32;
    struct l3d_gpt *m = full_model(be, &cfg, B, T);
    l3d_gpt_init_weights(m, 1337);
    int32_t inp[128], tgt[128];
    fill_batch(inp, tgt, B * T, cfg.V, 5);
    float loss = l3d_gpt_forward(m, inp, tgt, B, T);
    CHECK_NEAR(loss, logf((float)cfg.V), 0.02 * logf((float)cfg.V));
    l3d_gpt_free(m);
}

/* One AdamW step with global-norm clipping over the whole model, through src/optim (its moments and
 * the norm's sum of squares on the device). */
static void adamw_once(struct l3d_gpt *m, float lr) {
    struct l3d_adamw_hparams hp = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                                   .weight_decay = 0.1f, .grad_clip = 1.0f};
    struct l3d_adamw opt;
    struct l3d_sumsq gsq;
    L3D_ASSERT(l3d_adamw_init(&opt, m->be, &hp, 0, m->num_params) == L3D_OK);
    L3D_ASSERT(l3d_sumsq_init(&gsq, m->be, 1) == L3D_OK);
    double sq;
    l3d_grad_sumsq(&gsq, 0, m->grads, m->num_params);
    l3d_sumsq_take(&gsq, &sq);
    l3d_adamw_step(&opt, m->be, m->params, m->grads, l3d_clip_factor(sqrt(sq), hp.grad_clip),
                   m->tensors, L3D_NUM_TENSORS, lr);
    l3d_sumsq_free(&gsq);
    l3d_adamw_free(&opt);
}

/* Trains `steps` AdamW steps on one fixed batch; returns the losses and final params. */
static void train_fixed(struct l3d_backend *be, int steps, float lr, float *losses, float **params,
                        int64_t *n) {
    struct l3d_model_spec cfg;
    l3d_model_preset(&cfg, "tiny");
    int B = 4, T = 32;
    struct l3d_gpt *m = full_model(be, &cfg, B, T);
    l3d_gpt_init_weights(m, 42);
    int32_t inp[128], tgt[128];
    fill_batch(inp, tgt, B * T, cfg.V, 9);
    struct l3d_adamw_hparams hp = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                                   .weight_decay = 0.0f, .grad_clip = 1.0f};
    struct l3d_adamw opt;
    L3D_ASSERT(l3d_adamw_init(&opt, be, &hp, 0, m->num_params) == L3D_OK);
    struct l3d_sumsq gsq;
    L3D_ASSERT(l3d_sumsq_init(&gsq, be, 1) == L3D_OK);
    for (int s = 0; s < steps; s++) {
        l3d_gpt_zero_grad(m);
        losses[s] = l3d_gpt_forward(m, inp, tgt, B, T);
        l3d_gpt_backward(m, 1.0f / (float)(B * T), NULL);
        double sq;
        l3d_grad_sumsq(&gsq, 0, m->grads, m->num_params);
        l3d_sumsq_take(&gsq, &sq);
        double norm = sqrt(sq);
        float clip = l3d_clip_factor(norm, hp.grad_clip);
        l3d_adamw_step(&opt, be, m->params, m->grads, clip, m->tensors, L3D_NUM_TENSORS, lr);
    }
    *n = m->num_params;
    *params = test_to_host(be, m->params, m->num_params);
    l3d_sumsq_free(&gsq);
    l3d_adamw_free(&opt);
    l3d_gpt_free(m);
}

static void test_overfit_and_determinism(struct l3d_backend *be) {
    enum { STEPS = 300 };
    float la[STEPS], lb[STEPS];
    float *pa, *pb;
    int64_t na, nb;
    train_fixed(be, STEPS, 3e-3f, la, &pa, &na);
    fprintf(stderr, "overfit: loss %.4f -> %.4f after %d steps\n", la[0], la[STEPS - 1], STEPS);
    CHECK(la[STEPS - 1] < 0.1f);
    train_fixed(be, STEPS, 3e-3f, lb, &pb, &nb);
    CHECK(na == nb);
    CHECK(memcmp(la, lb, sizeof la) == 0);
    CHECK(memcmp(pa, pb, (size_t)na * sizeof(float)) == 0);
    free(pa);
    free(pb);
}

/* Two pipeline-style shards (layers [0,2) with the embedding, [2,3) with the head) chained by
 * hand reproduce the full model's loss and gradients. */
static void test_layer_shards(struct l3d_backend *be) {
    struct l3d_model_spec cfg = tiny_config(3, 16, 2, 40, 8);
    int B = 2, T = 6;
    struct l3d_shard full = l3d_shard_full(&cfg), s0 = full, s1 = full;
    s0.layer_count = 2;
    s0.has_head = false;
    s1.layer_start = 2;
    s1.layer_count = 1;
    s1.has_embedding = false;
    struct l3d_gpt *mf, *m0, *m1;
    CHECK(l3d_gpt_init(&mf, &cfg, &full, be, B, T, L3D_GRADS_FLAT) == L3D_OK);
    CHECK(l3d_gpt_init(&m0, &cfg, &s0, be, B, T, L3D_GRADS_FLAT) == L3D_OK);
    CHECK(l3d_gpt_init(&m1, &cfg, &s1, be, B, T, L3D_GRADS_FLAT) == L3D_OK);
    l3d_gpt_init_weights(mf, 11);
    l3d_gpt_init_weights(m0, 11);
    l3d_gpt_init_weights(m1, 11);
    CHECK(m0->tensors[L3D_T_LNFW].count == 0 && m1->tensors[L3D_T_WPE].count == 0);
    /* same initial values where the shards overlap the full model */
    float *pf = test_to_host(be, mf->params, mf->num_params);
    float *p0 = test_to_host(be, m0->params, m0->num_params);
    float *p1 = test_to_host(be, m1->params, m1->num_params);
    for (int ti = 0; ti < L3D_NUM_TENSORS; ti++) {
        const struct l3d_tensor_info *f = &mf->tensors[ti], *a = &m0->tensors[ti], *b = &m1->tensors[ti];
        if (a->count) CHECK(memcmp(p0 + a->offset, pf + f->offset, (size_t)a->count * 4) == 0);
        if (b->count) {
            int64_t skip = f->layers > 1 ? 2 * f->rows * f->cols : 0; /* layer 2 of the full model */
            CHECK(memcmp(p1 + b->offset, pf + f->offset + skip, (size_t)b->count * 4) == 0);
        }
    }
    free(pf), free(p0), free(p1);
    int32_t inp[12], tgt[12];
    fill_batch(inp, tgt, B * T, cfg.V, 4);
    l3d_gpt_zero_grad(mf);
    l3d_gpt_zero_grad(m0);
    l3d_gpt_zero_grad(m1);
    float lf = l3d_gpt_forward(mf, inp, tgt, B, T);
    l3d_gpt_backward(mf, 1.0f / (float)(B * T), NULL);
    l3d_gpt_forward(m0, inp, NULL, B, T);
    l3d_be_copy_d2d(be, m1->input_act, l3d_gpt_output_act(m0),
                    (size_t)(B * T * cfg.C) * sizeof(float));
    float l1 = l3d_gpt_forward(m1, NULL, tgt, B, T);
    l3d_gpt_backward(m1, 1.0f / (float)(B * T), NULL);
    l3d_gpt_backward(m0, 1.0f / (float)(B * T), m1->dinput_act);
    CHECK(lf == l1);
    /* the tied wte: the full model's gradient is the sum of the embedding's and the head's */
    const struct l3d_tensor_info *fw = &mf->tensors[L3D_T_WTE];
    float *gf = test_to_host(be, mf->grads, mf->num_params);
    float *g0 = test_to_host(be, m0->grads, m0->num_params);
    float *g1 = test_to_host(be, m1->grads, m1->num_params);
    double worst = 0.0;
    for (int64_t i = 0; i < fw->count; i++) {
        double g = (double)g0[m0->tensors[L3D_T_WTE].offset + i] +
                   (double)g1[m1->tensors[L3D_T_WTE].offset + i];
        worst = test_max(worst, fabs(g - gf[fw->offset + i]));
    }
    CHECK(worst < 1e-6);
    for (int ti = L3D_T_WPE; ti < L3D_NUM_TENSORS; ti++) {
        const struct l3d_tensor_info *f = &mf->tensors[ti], *a = &m0->tensors[ti], *b = &m1->tensors[ti];
        if (a->count) CHECK(memcmp(g0 + a->offset, gf + f->offset, (size_t)a->count * 4) == 0);
        if (b->count) {
            int64_t skip = f->layers > 1 ? 2 * f->rows * f->cols : 0;
            CHECK(memcmp(g1 + b->offset, gf + f->offset + skip, (size_t)b->count * 4) == 0);
        }
    }
    free(gf), free(g0), free(g1);
    l3d_gpt_free(mf);
    l3d_gpt_free(m0);
    l3d_gpt_free(m1);
}

/* A tensor-parallel-style slice (second head, second half of the FFN, second half of the padded
 * vocabulary) holds exactly the full model's values for those rows and columns. */
static void test_slice_init(struct l3d_backend *be) {
    struct l3d_model_spec cfg = tiny_config(2, 16, 2, 200, 8); /* Vp = 256 */
    int B = 1, T = 4, C = 16, HS = 8;
    struct l3d_shard full = l3d_shard_full(&cfg), s = full;
    s.head_start = 1;
    s.head_count = 1;
    s.ffn_start = 32;
    s.ffn_count = 32;
    s.vocab_start = 128;
    s.vocab_count = 128;
    struct l3d_gpt *mf, *ms;
    CHECK(l3d_gpt_init(&mf, &cfg, &full, be, B, T, L3D_GRADS_FLAT) == L3D_OK);
    CHECK(l3d_gpt_init(&ms, &cfg, &s, be, B, T, L3D_GRADS_FLAT) == L3D_OK);
    l3d_gpt_init_weights(mf, 5);
    l3d_gpt_init_weights(ms, 5);
    float *pf = test_to_host(be, mf->params, mf->num_params);
    float *ps = test_to_host(be, ms->params, ms->num_params);
    int mism = 0;
    for (int l = 0; l < 2; l++) {
        const float *fq = pf + mf->tensors[L3D_T_QKVW].offset + (int64_t)l * 3 * C * C;
        const float *sq = ps + ms->tensors[L3D_T_QKVW].offset + (int64_t)l * 3 * HS * C;
        for (int part = 0; part < 3; part++)
            for (int r = 0; r < HS; r++)
                mism += memcmp(sq + (part * HS + r) * C, fq + (part * C + HS + r) * C, (size_t)C * 4) != 0;
        const float *fp = pf + mf->tensors[L3D_T_ATTPROJW].offset + (int64_t)l * C * C;
        const float *sp = ps + ms->tensors[L3D_T_ATTPROJW].offset + (int64_t)l * C * HS;
        for (int r = 0; r < C; r++) mism += memcmp(sp + r * HS, fp + r * C + HS, (size_t)HS * 4) != 0;
        const float *ff = pf + mf->tensors[L3D_T_FCPROJW].offset + (int64_t)l * C * 4 * C;
        const float *sf = ps + ms->tensors[L3D_T_FCPROJW].offset + (int64_t)l * C * 32;
        for (int r = 0; r < C; r++) mism += memcmp(sf + r * 32, ff + r * 4 * C + 32, 32 * 4) != 0;
        const float *fw = pf + mf->tensors[L3D_T_FCW].offset + (int64_t)l * 4 * C * C;
        const float *sw = ps + ms->tensors[L3D_T_FCW].offset + (int64_t)l * 32 * C;
        mism += memcmp(sw, fw + 32 * C, 32 * C * 4) != 0;
    }
    mism += memcmp(ps + ms->tensors[L3D_T_WTE].offset,
                   pf + mf->tensors[L3D_T_WTE].offset + 128 * C, 128 * C * 4) != 0;
    CHECK(mism == 0);
    free(pf), free(ps);
    l3d_gpt_free(mf);
    l3d_gpt_free(ms);
}

/* The same with heads of 6 over 16 channels (head_dim apart from C / NH) and grouped key/value
 * heads: the slice of heads 2-3 (key/value head 1) holds the full model's q rows 12-23, k rows
 * 24 + 6-11, v rows 36 + 6-11 and attprojw's columns 12-23; every q|k|v row of the full model is
 * drawn at its own global row (no two rows alike: a k or v row read at a q row's index would
 * repeat it). */
static void test_slice_init_head_dim(struct l3d_backend *be) {
    struct l3d_model_spec cfg = {.L = 2, .C = 16, .NH = 4, .NKV = 2, .V = 50, .maxT = 8, .ffn = 24,
                                 .head_dim = 6};
    l3d_model_set_arch(&cfg, L3D_ARCH_LLAMA);
    L3D_ASSERT(l3d_gpt_config_finish(&cfg) == L3D_OK);
    const int64_t C = 16, HS = 6, Q = 24, KV = 12, R = Q + 2 * KV;
    struct l3d_shard full = l3d_shard_full(&cfg), s = full;
    s.head_start = 2;
    s.head_count = 2;
    struct l3d_gpt *mf, *ms;
    CHECK(l3d_gpt_init(&mf, &cfg, &full, be, 1, 4, L3D_GRADS_FLAT) == L3D_OK);
    CHECK(l3d_gpt_init(&ms, &cfg, &s, be, 1, 4, L3D_GRADS_FLAT) == L3D_OK);
    l3d_gpt_init_weights(mf, 5);
    l3d_gpt_init_weights(ms, 5);
    float *pf = test_to_host(be, mf->params, mf->num_params);
    float *ps = test_to_host(be, ms->params, ms->num_params);
    int mism = 0, alike = 0;
    for (int l = 0; l < 2; l++) {
        const float *fq = pf + mf->tensors[L3D_T_QKVW].offset + l * R * C;
        const float *sq = ps + ms->tensors[L3D_T_QKVW].offset + l * (2 * HS + 2 * HS) * C;
        const int64_t at[3][2] = {{0, 2 * HS}, {2 * HS, Q + HS}, {3 * HS, Q + KV + HS}};
        for (int part = 0; part < 3; part++) /* q: 2 heads; k, v: 1 head */
            for (int64_t r = 0; r < (part ? HS : 2 * HS); r++)
                mism += memcmp(sq + (at[part][0] + r) * C, fq + (at[part][1] + r) * C,
                               (size_t)C * 4) != 0;
        for (int64_t a = 0; a < R; a++)
            for (int64_t b = a + 1; b < R; b++)
                alike += memcmp(fq + a * C, fq + b * C, (size_t)C * 4) == 0;
        const float *fp = pf + mf->tensors[L3D_T_ATTPROJW].offset + l * C * Q;
        const float *sp = ps + ms->tensors[L3D_T_ATTPROJW].offset + l * C * 2 * HS;
        for (int64_t r = 0; r < C; r++)
            mism += memcmp(sp + r * 2 * HS, fp + r * Q + 2 * HS, (size_t)(2 * HS) * 4) != 0;
    }
    CHECK(mism == 0 && alike == 0);
    free(pf), free(ps);
    l3d_gpt_free(mf);
    l3d_gpt_free(ms);
}
/* Activation slots and recomputation: two micro-batches forwarded into two slots before either
 * backward (what a pipeline stage does), under each recomputation mode, give bit-identical
 * gradients to one micro-batch at a time with everything kept; the activation bytes match the
 * closed form up to each buffer's 64-byte alignment, and recomputation shrinks them. */
static void test_slots_and_recompute(struct l3d_backend *be) {
    struct l3d_model_spec cfg = tiny_config(3, 16, 2, 40, 8);
    int B = 2, T = 6;
    struct l3d_shard sh = l3d_shard_full(&cfg);
    sh.has_embedding = false; /* a middle-to-last stage: input from input_act */
    sh.layer_start = 1;
    sh.layer_count = 2;
    int32_t tgt[2][12];
    ref_fill_tokens(tgt[0], B * T, 0, cfg.V, 4, 7);
    ref_fill_tokens(tgt[1], B * T, 0, cfg.V, 4, 8);
    float *x[2], *dx[2];
    int64_t nx = (int64_t)B * T * cfg.C;
    for (int i = 0; i < 2; i++) {
        x[i] = malloc((size_t)nx * sizeof(float));
        dx[i] = malloc((size_t)nx * sizeof(float));
        for (int64_t j = 0; j < nx; j++) x[i][j] = 0.5f * l3d_rng_normal(99, (uint64_t)i, (uint64_t)j);
    }
    struct l3d_gpt *ref;
    CHECK(l3d_gpt_init(&ref, &cfg, &sh, be, B, T, L3D_GRADS_FLAT) == L3D_OK);
    l3d_gpt_init_weights(ref, 3);
    l3d_gpt_zero_grad(ref);
    float lref[2];
    for (int i = 0; i < 2; i++) {
        l3d_be_copy_h2d(be, ref->input_act, x[i], (size_t)nx * sizeof(float));
        lref[i] = l3d_gpt_forward(ref, NULL, tgt[i], B, T);
        l3d_gpt_backward(ref, 0.01f, NULL);
        l3d_be_copy_d2h(be, dx[i], ref->dinput_act, (size_t)nx * sizeof(float));
    }
    size_t bytes[3];
    for (int rc = L3D_RECOMPUTE_NONE; rc <= L3D_RECOMPUTE_FULL; rc++) {
        struct l3d_gpt *m;
        CHECK(l3d_gpt_init_ex(&m, &cfg, &sh, be, B, T, L3D_GRADS_FLAT, 2, rc) == L3D_OK);
        l3d_gpt_init_weights(m, 3);
        l3d_gpt_zero_grad(m);
        float l[2];
        for (int i = 0; i < 2; i++) {
            l3d_gpt_use_slot(m, i);
            l3d_be_copy_h2d(be, m->input_act, x[i], (size_t)nx * sizeof(float));
            l[i] = l3d_gpt_forward(m, NULL, tgt[i], B, T);
        }
        int same_dx = 1;
        for (int i = 0; i < 2; i++) {
            l3d_gpt_use_slot(m, i);
            l3d_gpt_backward(m, 0.01f, NULL);
            float *d = test_to_host(be, m->dinput_act, nx);
            same_dx &= memcmp(d, dx[i], (size_t)nx * sizeof(float)) == 0;
            free(d);
        }
        CHECK(l[0] == lref[0] && l[1] == lref[1]);
        CHECK(same_dx);
        float *g = test_to_host(be, m->grads, m->num_params);
        float *gref = test_to_host(be, ref->grads, ref->num_params);
        CHECK(memcmp(g, gref, (size_t)m->num_params * sizeof(float)) == 0);
        free(g), free(gref);
        size_t want = l3d_gpt_act_bytes(&cfg, &sh, B, T, 2, rc, !m->attn_naive);
        bytes[rc] = m->act_bytes;
        CHECK(m->act_bytes >= want && m->act_bytes <= want + 64 * (size_t)(2 * 40 + 40));
        l3d_gpt_free(m);
    }
    /* the tiled attention keeps no probabilities: selective keeps what none keeps */
    CHECK(bytes[L3D_RECOMPUTE_FULL] < bytes[L3D_RECOMPUTE_SELECTIVE] &&
          bytes[L3D_RECOMPUTE_SELECTIVE] == bytes[L3D_RECOMPUTE_NONE]);
    /* the closed form at GPT-2 124M's shapes, no recomputation, one slot: the per-layer term is
     * 4 (s b h (2 + 12 + 2) + a s b + 4 s b) bytes with the tiled kernel, a s^2 b with the
     * materialising one */
    struct l3d_model_spec g;
    l3d_model_preset(&g, "d12");
    struct l3d_shard one = l3d_shard_full(&g);
    one.layer_count = 1;
    one.has_embedding = one.has_head = false;
    struct l3d_shard two = one;
    two.layer_count = 2;
    double per_layer = 4.0 * (64.0 * 4 * 768 * 16 + 12.0 * 64 * 4 + 4.0 * 64 * 4);
    CHECK((double)(l3d_gpt_act_bytes(&g, &two, 4, 64, 1, L3D_RECOMPUTE_NONE, true) -
                   l3d_gpt_act_bytes(&g, &one, 4, 64, 1, L3D_RECOMPUTE_NONE, true)) == per_layer);
    per_layer += 4.0 * 12 * 64 * 4 * (64 - 1);
    CHECK((double)(l3d_gpt_act_bytes(&g, &two, 4, 64, 1, L3D_RECOMPUTE_NONE, false) -
                   l3d_gpt_act_bytes(&g, &one, 4, 64, 1, L3D_RECOMPUTE_NONE, false)) == per_layer);
    l3d_gpt_free(ref);
    for (int i = 0; i < 2; i++) {
        free(x[i]);
        free(dx[i]);
    }
}

/* Two micro-batches through a last-stage shard of cfg (layers 1.., input from input_act; a MoE
 * model, which no pipeline stage holds yet, whole from tokens and with one activation slot) in
 * groups of S (the slots): their forwards, then fused backwards or B of each, then W of each (with
 * S = 2, W deferred past the other micro-batch's B, as zb-h1 does); skip_w leaves W of
 * micro-batch 1 out. Returns the gradients; dx the input gradients. */
static struct l3d_shard split_shard(const struct l3d_model_spec *cfg) {
    struct l3d_shard sh = l3d_shard_full(cfg);
    if (cfg->moe.experts > 0) return sh;
    sh.has_embedding = false;
    sh.layer_start = 1;
    sh.layer_count = cfg->L - 1;
    return sh;
}

static float *split_run(struct l3d_backend *be, const struct l3d_model_spec *cfg, int rc,
                        bool split, bool skip_w, float *dx) {
    int B = 2, T = 6, S = cfg->moe.experts > 0 ? 1 : 2; /* MoE: one activation slot so far */
    int64_t nx = (int64_t)B * T * cfg->C;
    struct l3d_shard sh = split_shard(cfg);
    struct l3d_gpt *m;
    CHECK(l3d_gpt_init_ex(&m, cfg, &sh, be, B, T, L3D_GRADS_FLAT, S, rc) == L3D_OK);
    if (split) CHECK(l3d_gpt_split_init(m, S, false) == L3D_OK);
    l3d_gpt_init_weights(m, 5);
    l3d_gpt_zero_grad(m);
    float *x = malloc((size_t)nx * sizeof(float));
    int32_t tgt[12], tok[12];
    for (int i0 = 0; i0 < 2; i0 += S) { /* S micro-batches: forwards, B (or fused), then W */
        for (int i = i0; i < i0 + S; i++) {
            for (int64_t j = 0; j < nx; j++) x[j] = 0.5f * l3d_rng_normal(41, (uint64_t)i, (uint64_t)j);
            fill_batch(tok, tgt, B * T, cfg->V, 6 + (uint64_t)i);
            l3d_gpt_use_slot(m, i % S);
            if (!sh.has_embedding) l3d_be_copy_h2d(be, m->input_act, x, (size_t)nx * sizeof(float));
            l3d_gpt_forward(m, sh.has_embedding ? tok : NULL, tgt, B, T);
        }
        for (int i = i0; i < i0 + S; i++) {
            l3d_gpt_use_slot(m, i % S);
            if (split) l3d_gpt_backward_input(m, 0.01f, NULL, i % S);
            else l3d_gpt_backward(m, 0.01f, NULL);
            l3d_be_copy_d2h(be, dx + i * nx, m->dinput_act, (size_t)nx * sizeof(float));
        }
        for (int i = i0; split && i < i0 + S && !(skip_w && i == 1); i++) {
            l3d_gpt_use_slot(m, i % S);
            l3d_gpt_backward_weight(m, i % S);
        }
    }
    float *g = test_to_host(be, m->grads, m->num_params);
    l3d_gpt_free(m);
    free(x);
    return g;
}

/* B then W gives the fused backward's gradients and input gradients bit for bit, for GPT-2's and
 * Llama's blocks and a MoE model (its experts' and router's weight gradients come with B; under
 * full recomputation W re-runs its block, routing included), with and without full
 * recomputation; W left out does not. */
static void test_split_backward(struct l3d_backend *be) {
    struct l3d_model_spec llama = {.L = 3, .C = 16, .NH = 4, .NKV = 2, .V = 50, .maxT = 8,
                                   .ffn = 24, .norm_eps = 1e-6f};
    l3d_model_set_arch(&llama, L3D_ARCH_LLAMA);
    L3D_ASSERT(l3d_gpt_config_finish(&llama) == L3D_OK);
    struct l3d_model_spec moe = {.L = 3, .C = 16, .NH = 2, .V = 40, .maxT = 8,
                                 .moe = {.experts = 4, .top_k = 2, .dense_layers = 1}};
    L3D_ASSERT(l3d_gpt_config_finish(&moe) == L3D_OK);
    struct l3d_model_spec qwen = llama;
    qwen.qk_norm = true; /* its norms' weight gradients come with B */
    const struct l3d_model_spec cfgs[4] = {tiny_config(3, 16, 2, 40, 8), llama, moe, qwen};
    for (int k = 0; k < 4; k++)
        for (int rc = L3D_RECOMPUTE_NONE; rc <= L3D_RECOMPUTE_FULL; rc += 2) {
            int64_t nx = 2 * 6 * cfgs[k].C;
            float *dx0 = malloc(2 * (size_t)nx * sizeof(float));
            float *dx1 = malloc(2 * (size_t)nx * sizeof(float));
            float *dx2 = malloc(2 * (size_t)nx * sizeof(float));
            float *g0 = split_run(be, &cfgs[k], rc, false, false, dx0);
            float *g1 = split_run(be, &cfgs[k], rc, true, false, dx1);
            float *g2 = split_run(be, &cfgs[k], rc, true, true, dx2);
            struct l3d_shard sh = split_shard(&cfgs[k]);
            int64_t n = l3d_gpt_plan_tensors(&cfgs[k], &sh, (struct l3d_tensor_info[L3D_NUM_TENSORS]){0});
            CHECK(memcmp(g0, g1, (size_t)n * sizeof(float)) == 0);
            CHECK(memcmp(dx0, dx1, 2 * (size_t)nx * sizeof(float)) == 0);
            CHECK(memcmp(g0, g2, (size_t)n * sizeof(float)) != 0); /* W missing: caught */
            free(g0), free(g1), free(g2), free(dx0), free(dx1), free(dx2);
        }
}

/* For fp32, the checking backend runs the CPU kernels on the same values: a forward, backward and
 * optimizer step give bit-identical logits, per-token losses, loss, gradients and parameters. */
static void test_check_identical(void) {
    struct l3d_model_spec cfg = tiny_config(2, 16, 2, 50, 8);
    struct l3d_shard sh = l3d_shard_full(&cfg);
    int B = 2, T = 5, N = B * T;
    int32_t inp[10], tgt[10];
    fill_batch(inp, tgt, N, cfg.V, 6);
    const char *names[2] = {"cpu", "check"};
    float loss[2], *logits[2], *losses[2], *grads[2], *params[2];
    int64_t np = 0;
    for (int k = 0; k < 2; k++) {
        struct l3d_backend *be;
        L3D_ASSERT(l3d_backend_init(names[k], &be) == L3D_OK);
        CHECK(strcmp(l3d_backend_name(be), names[k]) == 0);
        struct l3d_gpt *m;
        L3D_ASSERT(l3d_gpt_init(&m, &cfg, &sh, be, B, T, L3D_GRADS_FLAT) == L3D_OK);
        randomize(m, 21);
        np = m->num_params;
        l3d_gpt_zero_grad(m);
        loss[k] = l3d_gpt_forward(m, inp, tgt, B, T);
        logits[k] = test_to_host(be, m->logits, (int64_t)N * cfg.Vp);
        losses[k] = test_to_host(be, m->losses, N);
        l3d_gpt_backward(m, 1.0f / (float)N, NULL);
        grads[k] = test_to_host(be, m->grads, np);
        adamw_once(m, 1e-2f);
        params[k] = test_to_host(be, m->params, np);
        l3d_gpt_free(m);
        l3d_backend_free(be);
    }
    CHECK(memcmp(&loss[0], &loss[1], sizeof loss[0]) == 0);
    CHECK(memcmp(logits[0], logits[1], (size_t)N * cfg.Vp * sizeof(float)) == 0);
    CHECK(memcmp(losses[0], losses[1], (size_t)N * sizeof(float)) == 0);
    CHECK(memcmp(grads[0], grads[1], (size_t)np * sizeof(float)) == 0);
    CHECK(memcmp(params[0], params[1], (size_t)np * sizeof(float)) == 0);
    for (int k = 0; k < 2; k++) free(logits[k]), free(losses[k]), free(grads[k]), free(params[k]);
}

static void test_errors(struct l3d_backend *be) {
    struct l3d_model_spec cfg = {.L = 2, .C = 30, .NH = 4, .V = 100, .maxT = 8};
    CHECK(l3d_gpt_config_finish(&cfg) == L3D_ERR_ARG);
    CHECK(strstr(l3d_error_message(), "divisible") != NULL);
    cfg.head_dim = 8; /* a head size given: the channels need not split into the heads */
    CHECK(l3d_gpt_config_finish(&cfg) == L3D_OK && l3d_model_head_dim(&cfg) == 8);
    cfg.head_dim = 7; /* RoPE turns pairs: an odd head size refused, naming the flag */
    cfg.ffn = 64;
    l3d_model_set_arch(&cfg, L3D_ARCH_LLAMA);
    CHECK(l3d_gpt_config_finish(&cfg) == L3D_ERR_ARG);
    CHECK(strstr(l3d_error_message(), "even head size, not 7 (--head-dim)") != NULL);
    cfg.head_dim = -1;
    CHECK(l3d_gpt_config_finish(&cfg) == L3D_ERR_ARG);
    CHECK(strstr(l3d_error_message(), "--head-dim -1") != NULL);
    cfg = (struct l3d_model_spec){.L = 2, .C = 32, .NH = 4, .V = 100, .maxT = 8, .head_dim = 8};
    CHECK(l3d_gpt_config_finish(&cfg) == L3D_OK && cfg.head_dim == 0); /* C / NH: one spelling */
    CHECK(l3d_model_preset(&cfg, "nope") == L3D_ERR_ARG);
    cfg = tiny_config(2, 16, 2, 50, 8);
    struct l3d_shard sh = l3d_shard_full(&cfg);
    struct l3d_gpt *m;
    CHECK(l3d_gpt_init(&m, &cfg, &sh, be, 1, 9, L3D_GRADS_FLAT) == L3D_ERR_ARG);
    CHECK(m == NULL);
    sh.layer_count = 3;
    CHECK(l3d_gpt_init(&m, &cfg, &sh, be, 1, 4, L3D_GRADS_FLAT) == L3D_ERR_LAYOUT);
}

int main(void) {
    struct l3d_backend *be = test_backend_init();
    test_forward_and_gradients(be);
    test_initial_loss(be);
    test_overfit_and_determinism(be);
    test_layer_shards(be);
    test_slice_init(be);
    test_slice_init_head_dim(be);
    test_slots_and_recompute(be);
    test_split_backward(be);
    test_errors(be);
    test_check_identical();
    l3d_backend_free(be);
    return TEST_REPORT();
}
