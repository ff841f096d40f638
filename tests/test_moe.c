/*
 * Mixture-of-experts tests (include/llm3d/model.h, struct l3d_moe_spec) at tiny sizes:
 *   - a float64 reference of the whole model with MoE blocks (router softmax, top-k with its tie
 *     rule, renormalisation, the capacity rule, the experts, the shared MLP, the load-balancing
 *     and z losses), written here in plain loops over tests/support/ref.c's kernels: the model's
 *     loss, auxiliary losses, expert loads and drops against it, dropless and with drops, GELU
 *     experts with biases and SwiGLU ones without; the reference with a wrong top-k (k - 1),
 *     unnormalised weights or two experts swapped must not match;
 *   - every parameter's gradient (the experts', the router's through its top-k weights, softmax,
 *     renormalisation and both auxiliary losses) against central differences of that reference;
 *   - a router that sends every token to one expert: no crash, the load reported, the capacity
 *     rule applied (and the tie rule: the second choice is the lowest other expert);
 *   - the check backend against the cpu backend in fp32, bf16 and fp16 (bit-identical: the check
 *     backend runs the cpu kernels behind its pointer checks), and 16-bit against fp32;
 *   - --moe-force-balance (the selection fixed by position, benchmarking only): the model against
 *     the reference routing by the rule written out here (loss, losses, loads of 1, every
 *     gradient through the router), the rule shifted by one or left to the top-k must not match;
 *     l3d_moe_force_rows the same on a context-parallel ring's chunks and generation's rows; the
 *     route kernel's forced input bit for bit as the CUDA backend's row function (on the host);
 *   - the spec's rules, the parameter counts (total and active), the tensor table.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend-impl.h"
#include "backend/cuda_moe.h"
#include "llm3d/model.h"
#include "llm3d/spec.h"
#include "model/moe.h"
#include "support/ref.h"
#include "test.h"

static double *dalloc(int64_t n) { return calloc((size_t)(n > 0 ? n : 1), sizeof(double)); }

/* ---- the float64 reference ------------------------------------------------------------------- */

struct ref_model {
    struct l3d_model_spec cfg;
    const struct l3d_tensor_info *t; /* the full model's table */
    const int32_t *inp, *tgt;
    int B, T;
    double *params;
    /* 0: right; 1: top-k takes k - 1 experts; 2: no renormalisation; 3: experts 0 and 1 swapped;
     * forced routing: 4 the rule shifted by one expert, 5 the top-k instead */
    int mutant;
    /* the last evaluation's: LM loss, auxiliary losses summed over MoE layers, drops, loads */
    double lm, aux, z, dropped, load[64];
};

/* Tensor id's layer l (the tensor's own index) of the reference's parameters, or NULL when the
 * architecture lacks it. */
static const double *par(const struct ref_model *r, int id, int64_t l) {
    const struct l3d_tensor_info *t = &r->t[id];
    if (t->count == 0) return NULL;
    return r->params + t->offset + l * t->rows * t->cols;
}

/* One MLP (GELU or SwiGLU by the spec) of width F on n rows: out (n,C) = W2 act(W1 x + b1) + b2. */
static void ref_mlp(double *out, const double *x, const double *w1, const double *b1,
                    const double *w2, const double *b2, int64_t n, int64_t C, int64_t F,
                    bool swiglu) {
    int64_t Fm = swiglu ? 2 * F : F;
    double *h = dalloc(n * Fm), *a = dalloc(n * F);
    ref_matmul_forward(h, x, w1, b1, n, C, Fm);
    if (swiglu)
        ref_swiglu_forward(a, h, n, F);
    else
        ref_gelu_forward(a, h, n * F);
    ref_matmul_forward(out, a, w2, b2, n, F, C);
    free(h);
    free(a);
}

/* One token's router: p (E) the softmax of its logits, *lse, idx and w (K) its top-k (the most
 * probable first; ties: the lower expert index first) or the experts of forced (NULL: none), w
 * renormalised when asked. */
static void ref_route(const struct ref_model *r, const double *x, const double *router, double *p,
                      double *lse, int *idx, double *w, int K, const int *forced) {
    const struct l3d_moe_spec *ms = &r->cfg.moe;
    int64_t C = r->cfg.C, E = ms->experts;
    double mx = -INFINITY, s = 0.0, ws = 0.0;
    for (int64_t e = 0; e < E; e++) {
        p[e] = ref_dot(x, router + e * C, C);
        mx = fmax(mx, p[e]);
    }
    for (int64_t e = 0; e < E; e++) s += p[e] = exp(p[e] - mx);
    for (int64_t e = 0; e < E; e++) p[e] /= s;
    *lse = mx + log(s);
    for (int k = 0; k < K; k++) {
        int best = forced ? forced[k] : -1;
        for (int e = 0; !forced && e < E; e++) {
            bool taken = false;
            for (int j = 0; j < k; j++) taken |= idx[j] == e;
            if (!taken && (best < 0 || p[e] > p[best])) best = e;
        }
        idx[k] = best;
        ws += w[k] = p[best];
    }
    if (ms->norm_topk && r->mutant != 2)
        for (int k = 0; k < K; k++) w[k] /= ws;
}

/* The MoE block of layer tensor index j: out (N,C) from x (N,C); its auxiliary losses, drops and
 * load (max over mean assignments) added into r. */
static void ref_moe(struct ref_model *r, double *out, const double *x, int64_t N, int j) {
    const struct l3d_moe_spec *ms = &r->cfg.moe;
    int64_t C = r->cfg.C, E = ms->experts, F = ms->ffn;
    int K = ms->top_k, Kr = r->mutant == 1 ? K - 1 : K;
    bool sw = r->cfg.mlp == L3D_MLP_SWIGLU;
    int64_t Fm = sw ? 2 * F : F;
    int64_t cap = ms->capacity_factor > 0 ? (int64_t)ceil(ms->capacity_factor * N * K / E) : 0;
    double *p = dalloc(E), *w = dalloc(K), *y = dalloc(C), *count = dalloc(E), *psum = dalloc(E);
    int64_t *fill = calloc((size_t)E, sizeof(int64_t));
    int idx[64];
    const double *rw = par(r, L3D_T_ROUTER, j), *fw = par(r, L3D_T_EXPFCW, j);
    const double *fb = par(r, L3D_T_EXPFCB, j), *pw = par(r, L3D_T_EXPPROJW, j);
    const double *pb = par(r, L3D_T_EXPPROJB, j);
    memset(out, 0, (size_t)(N * C) * sizeof(double));
    if (ms->shared > 0)
        ref_mlp(out, x, par(r, L3D_T_SHFCW, j), par(r, L3D_T_SHFCB, j), par(r, L3D_T_SHPROJW, j),
                par(r, L3D_T_SHPROJB, j), N, C, ms->shared * F, sw);
    double zsum = 0.0;
    for (int64_t n = 0; n < N; n++) {
        double lse;
        /* --moe-force-balance: row n is position n % T of sequence n / T, so its global row in
         * the micro-batch is n itself: experts (layer + n K + k) mod E */
        int forced[64], layer = j + r->cfg.moe.dense_layers;
        for (int k = 0; k < Kr; k++)
            forced[k] = (int)((layer + n * K + k + (r->mutant == 4)) % E);
        bool force = ms->force_balance && r->mutant != 5;
        ref_route(r, x + n * C, rw, p, &lse, idx, w, Kr, force ? forced : NULL);
        zsum += lse * lse;
        for (int64_t e = 0; e < E; e++) psum[e] += p[e];
        for (int k = 0; k < Kr; k++) {
            int e = idx[k], we = r->mutant == 3 && e < 2 ? 1 - e : e; /* the swapped expert */
            count[e] += 1.0;
            if (cap > 0 && fill[e] >= cap) { /* over capacity, in token order: dropped */
                r->dropped += 1.0;
                continue;
            }
            fill[e]++;
            ref_mlp(y, x + n * C, fw + we * Fm * C, fb ? fb + we * Fm : NULL, pw + we * C * F,
                    pb ? pb + we * C : NULL, 1, C, F, sw);
            for (int64_t c = 0; c < C; c++) out[n * C + c] += w[k] * y[c];
        }
    }
    double aux = 0.0, mx = 0.0;
    for (int64_t e = 0; e < E; e++) {
        aux += count[e] / ((double)N * K) * (psum[e] / (double)N);
        mx = fmax(mx, count[e]);
    }
    r->aux += (double)E * aux;
    r->z += zsum / (double)N;
    r->load[j] = mx / ((double)N * Kr / (double)E);
    free(p); free(w); free(y); free(count); free(psum); free(fill);
}

/* One transformer layer (GPT-2's attention, LayerNorm, learned positions) on x in place, with the
 * dense MLP or the MoE block. */
static void ref_layer(struct ref_model *r, double *x, int l) {
    const struct l3d_model_spec *c = &r->cfg;
    int64_t B = r->B, T = r->T, C = c->C, N = B * T, NH = c->NH;
    double *ln = dalloc(N * C), *qkv = dalloc(N * 3 * C), *atty = dalloc(N * C);
    double *tmp = dalloc(N * C);
    ref_layernorm_forward(ln, NULL, NULL, x, par(r, L3D_T_LN1W, l), par(r, L3D_T_LN1B, l), N, C);
    ref_matmul_forward(qkv, ln, par(r, L3D_T_QKVW, l), par(r, L3D_T_QKVB, l), N, C, 3 * C);
    ref_attention_forward(atty, NULL, qkv, B, T, NH, C / NH);
    ref_matmul_forward(tmp, atty, par(r, L3D_T_ATTPROJW, l), par(r, L3D_T_ATTPROJB, l), N, C, C);
    ref_residual_forward(x, x, tmp, N * C);
    ref_layernorm_forward(ln, NULL, NULL, x, par(r, L3D_T_LN2W, l), par(r, L3D_T_LN2B, l), N, C);
    int nd = c->moe.dense_layers;
    if (l3d_model_moe_layer(c, l))
        ref_moe(r, tmp, ln, N, l - nd);
    else
        ref_mlp(tmp, ln, par(r, L3D_T_FCW, l), par(r, L3D_T_FCB, l), par(r, L3D_T_FCPROJW, l),
                par(r, L3D_T_FCPROJB, l), N, C, c->ffn, c->mlp == L3D_MLP_SWIGLU);
    ref_residual_forward(x, x, tmp, N * C);
    free(ln); free(qkv); free(atty); free(tmp);
}

/* The objective: the mean LM loss plus, for each MoE layer, aux_coef x its Switch loss and
 * z_coef x its z-loss (r->lm, aux, z, dropped, load set). */
static double ref_objective(void *ctx) {
    struct ref_model *r = ctx;
    const struct l3d_model_spec *c = &r->cfg;
    int64_t B = r->B, T = r->T, C = c->C, N = B * T, Vp = c->Vp;
    double *x = dalloc(N * C), *ln = dalloc(N * C), *logits = dalloc(N * Vp), *loss = dalloc(N);
    r->aux = r->z = r->dropped = 0.0;
    ref_encoder_forward(x, r->inp, par(r, L3D_T_WTE, 0), par(r, L3D_T_WPE, 0), 0, Vp, B, T, C);
    for (int l = 0; l < c->L; l++) ref_layer(r, x, l);
    ref_layernorm_forward(ln, NULL, NULL, x, par(r, L3D_T_LNFW, 0), par(r, L3D_T_LNFB, 0), N, C);
    ref_matmul_forward(logits, ln, par(r, L3D_T_WTE, 0), NULL, N, C, Vp);
    ref_xent_loss(loss, logits, r->tgt, 0, N, Vp, c->V);
    double s = 0.0;
    for (int64_t i = 0; i < N; i++) s += loss[i];
    r->lm = s / (double)N;
    free(x); free(ln); free(logits); free(loss);
    return r->lm + c->moe.aux_coef * r->aux + c->moe.z_coef * r->z;
}

/* ---- helpers --------------------------------------------------------------------------------- */

/* GPT-2's blocks (L layers, C 16, 2 heads, V 50, context 8) with experts. */
static struct l3d_model_spec moe_config(bool swiglu, struct l3d_moe_spec moe) {
    struct l3d_model_spec c = {.L = 2, .C = 16, .NH = 2, .V = 50, .maxT = 8, .moe = moe};
    if (swiglu) { /* SwiGLU experts without biases (Llama's MLP kind) on GPT-2's attention */
        c.mlp = L3D_MLP_SWIGLU;
        c.ffn = 24;
        c.no_bias = true;
    }
    L3D_ASSERT(l3d_gpt_config_finish(&c) == L3D_OK);
    return c;
}

static struct l3d_gpt *model_dt(struct l3d_backend *be, const struct l3d_model_spec *cfg, int B,
                                int T, enum l3d_recompute rc, enum l3d_dtype dt) {
    struct l3d_shard sh = l3d_shard_full(cfg);
    struct l3d_gpt *m;
    L3D_ASSERT(l3d_gpt_init_dt(&m, cfg, &sh, be, B, T, L3D_GRADS_FLAT, 1, rc, dt) == L3D_OK);
    return m;
}

/* Random fp32 weights (std 0.3, LayerNorm weights about 1, wte's padding rows 0) into p. */
static void random_weights(const struct l3d_gpt *m, float *p, uint64_t seed) {
    ref_fill_normal(p, m->num_params, 0.0f, 0.3f, seed, 1);
    const struct l3d_tensor_info *w = &m->tensors[L3D_T_WTE];
    for (int64_t r = m->cfg.V; r < w->rows; r++)
        memset(p + w->offset + r * w->cols, 0, (size_t)w->cols * sizeof(float));
    const int lnw[] = {L3D_T_LN1W, L3D_T_LN2W, L3D_T_LNFW};
    for (int i = 0; i < 3; i++)
        for (int64_t k = 0; k < m->tensors[lnw[i]].count; k++)
            p[m->tensors[lnw[i]].offset + k] += 1.0f;
}

/* p (fp32, host) into m's parameters of its type. */
static void set_params(struct l3d_gpt *m, const float *p) {
    int64_t n = m->num_params;
    uint16_t *h = malloc((size_t)n * sizeof(uint16_t));
    for (int64_t i = 0; m->dt != L3D_F32 && i < n; i++)
        h[i] = m->dt == L3D_BF16 ? l3d_f32_to_bf16(p[i]) : l3d_f32_to_f16(p[i]);
    l3d_be_copy_h2d(m->be, m->params, m->dt == L3D_F32 ? (const void *)p : h, (size_t)n * m->es);
    free(h);
}

/* One forward and backward of the mean objective; the stats taken into st (len doubles). */
static float step(struct l3d_gpt *m, const int32_t *inp, const int32_t *tgt, int B, int T,
                  double *st) {
    l3d_gpt_zero_grad(m);
    float loss = l3d_gpt_forward(m, inp, tgt, B, T);
    l3d_gpt_backward(m, 1.0f / (float)(B * T), NULL);
    memset(st, 0, (size_t)l3d_model_moe_stats_len(&m->cfg) * sizeof(double));
    l3d_gpt_moe_stats_take(m, st);
    return loss;
}

/* ---- tests ----------------------------------------------------------------------------------- */

/* The reference's value of every parameter's gradient (central differences, up to 61 elements a
 * tensor) against the model's. */
static void check_gradients(struct ref_model *r, const struct l3d_gpt *m, const float *grads) {
    for (int ti = 0; ti < L3D_NUM_TENSORS; ti++) {
        const struct l3d_tensor_info *t = &m->tensors[ti];
        int64_t stride = t->count > 61 ? t->count / 61 : 1;
        double worst = 0.0, scale = 1e-3;
        double *num = dalloc(t->count);
        for (int64_t i = 0; i < t->count; i += stride) {
            num[i] = ref_fd_partial(ref_objective, r, r->params + t->offset, i, 1e-5);
            scale = fmax(scale, fabs(num[i]));
        }
        for (int64_t i = 0; i < t->count; i += stride)
            worst = test_max(worst, fabs((double)grads[t->offset + i] - num[i]));
        if (!(worst <= 2e-4 * scale))
            fprintf(stderr, "tensor %s: worst gradient error %.3g (scale %.3g)\n", t->name, worst,
                    scale);
        CHECK(worst <= 2e-4 * scale);
        free(num);
    }
}

/* The model of cfg against the reference: loss, auxiliary losses, drops, loads; the mutants
 * rejected; every gradient. */
static void check_against_reference(struct l3d_backend *be, struct l3d_model_spec cfg,
                                    bool expect_drops) {
    int B = 2, T = 6;
    struct l3d_gpt *m = model_dt(be, &cfg, B, T, L3D_RECOMPUTE_NONE, L3D_F32);
    float *p = malloc((size_t)m->num_params * sizeof(float));
    random_weights(m, p, 11);
    set_params(m, p);
    int32_t inp[12], tgt[12];
    ref_fill_tokens(inp, B * T, 0, cfg.V, 5, 1);
    ref_fill_tokens(tgt, B * T, 0, cfg.V, 5, 2);
    CHECK(m->num_params == l3d_gpt_param_count(&cfg));
    CHECK((double)m->num_params == l3d_model_param_count(&cfg));
    size_t want = l3d_gpt_act_bytes(&cfg, &m->shard, B, T, 1, L3D_RECOMPUTE_NONE, true);
    CHECK(m->act_bytes >= want && m->act_bytes <= want + 64 * (size_t)(cfg.L * 13 + 40));
    int Lm = l3d_shard_moe_layers(&cfg, &m->shard);
    int64_t len = l3d_model_moe_stats_len(&m->cfg);
    double *st = dalloc(len), load[64];
    float loss = step(m, inp, tgt, B, T, st);
    struct l3d_moe_summary sum;
    l3d_moe_summarize(st, Lm, cfg.moe.experts, load, &sum);

    struct ref_model r = {.cfg = cfg, .t = m->tensors, .inp = inp, .tgt = tgt, .B = B, .T = T};
    r.params = dalloc(m->num_params);
    ref_to_double(r.params, p, m->num_params);
    ref_objective(&r);
    CHECK_NEAR(loss, r.lm, 2e-6 * fabs(r.lm));
    CHECK_NEAR(sum.aux, r.aux / Lm, 1e-5 * fabs(r.aux / Lm));
    CHECK_NEAR(sum.z, r.z / Lm, 1e-5 * fabs(r.z / Lm));
    CHECK(sum.dropped == r.dropped && (sum.dropped > 0) == expect_drops);
    for (int j = 0; j < Lm; j++) CHECK_NEAR(load[j], r.load[j], 1e-12);
    if (cfg.moe.force_balance) /* T K a multiple of E here: every expert N K / E rows */
        CHECK(sum.load_max == 1.0);
    for (r.mutant = 1; r.mutant <= (cfg.moe.force_balance ? 5 : 3); r.mutant++) {
        /* a wrong block must not pass */
        ref_objective(&r);
        if (r.mutant == 2 && !cfg.moe.norm_topk) continue; /* nothing to leave out */
        CHECK(!(fabs(loss - r.lm) <= 100 * 2e-6 * fabs(r.lm)));
    }
    r.mutant = 0;
    float *grads = test_to_host(be, m->grads, m->num_params);
    check_gradients(&r, m, grads);
    free(grads);
    free(r.params);
    free(p);
    free(st);
    l3d_gpt_free(m);
}

static void test_reference(struct l3d_backend *be) {
    /* GELU experts with biases, renormalised top-2 of 4, a shared expert, one dense layer first,
     * both auxiliary losses; dropless */
    struct l3d_moe_spec a = {.experts = 4, .top_k = 2, .ffn = 12, .shared = 1, .dense_layers = 1,
                             .norm_topk = true, .aux_coef = 0.1, .z_coef = 0.05};
    check_against_reference(be, moe_config(false, a), false);
    /* SwiGLU experts without biases, unnormalised top-2 of 3, every layer MoE, a capacity that
     * drops (ceil(0.5 x 12 x 2 / 3) = 4 assignments an expert) */
    struct l3d_moe_spec b = {.experts = 3, .top_k = 2, .ffn = 8, .aux_coef = 0.05,
                             .z_coef = 0.01, .capacity_factor = 0.5};
    check_against_reference(be, moe_config(true, b), true);
    /* top-1 with renormalisation (weights 1) and drops */
    struct l3d_moe_spec c = {.experts = 4, .top_k = 1, .ffn = 8, .norm_topk = true,
                             .capacity_factor = 1.0};
    check_against_reference(be, moe_config(false, c), true);
}

/* --moe-force-balance against the reference's rule, in the three configurations above (T K = 12
 * a multiple of E = 4 and 3: every load 1): renormalised and plain weights, the capacity still
 * dropping (b: ceil(0.5 x 12 x 2 / 3) = 4 of an expert's 8), top-1 (c: no drops, each expert
 * exactly its capacity). The mutants: the rule shifted by one, the router's top-k. */
static void test_force_reference(struct l3d_backend *be) {
    struct l3d_moe_spec a = {.experts = 4, .top_k = 2, .ffn = 12, .shared = 1, .dense_layers = 1,
                             .norm_topk = true, .aux_coef = 0.1, .z_coef = 0.05,
                             .force_balance = true};
    check_against_reference(be, moe_config(false, a), false);
    struct l3d_moe_spec b = {.experts = 3, .top_k = 2, .ffn = 8, .aux_coef = 0.05,
                             .z_coef = 0.01, .capacity_factor = 0.5, .force_balance = true};
    check_against_reference(be, moe_config(true, b), true);
    struct l3d_moe_spec c = {.experts = 4, .top_k = 1, .ffn = 8, .norm_topk = true,
                             .capacity_factor = 1.0, .force_balance = true};
    check_against_reference(be, moe_config(false, c), false);
}

/* The route kernel's forced input: the backend's idx is the forced experts and its weights their
 * probabilities renormalised, bit for bit as the CUDA backend's row function (cuda_moe.h, run here
 * on the host) gives them from the same fp32 logits; without forced both take the top-k, which
 * is not the forced choice (the negative case). */
static void test_force_kernel(struct l3d_backend *be) {
    enum { N = 6, C = 5, E = 4, K = 2 };
    float x[N * C], w[E * C], hp[N * E], hw[N * K], hl[N], p[E], rw[K], rl;
    int32_t forced[N * K], hi[N * K], ri[K];
    ref_fill_normal(x, N * C, 0.0f, 1.0f, 41, 1);
    ref_fill_normal(w, E * C, 0.0f, 1.0f, 41, 2);
    l3d_moe_force_rows(forced, E, K, 3, 1, N, 1, 0, 0);
    void *d[9];
    const size_t sz[9] = {N * C * 4, E * C * 4, N * E * 4, N * 4, N * K * 4, N * K * 4,
                          N * K * 4, (E + 1) * 4, (2 * E + 2) * 4};
    for (int i = 0; i < 9; i++) d[i] = l3d_be_alloc(be, sz[i], "test");
    int32_t *work = l3d_be_alloc(be, 3 * E * 4, "test"), *df = l3d_be_alloc(be, sizeof forced, "f");
    l3d_be_copy_h2d(be, d[0], x, sizeof x);
    l3d_be_copy_h2d(be, d[1], w, sizeof w);
    l3d_be_copy_h2d(be, df, forced, sizeof forced);
    for (int pass = 0; pass < 2; pass++) { /* forced, then the top-k */
        const int32_t *f = pass == 0 ? df : NULL;
        l3d_be_moe_route(be, L3D_F32, d[2], d[3], d[4], d[5], d[6], d[7], d[8], work, d[0], d[1],
                         N, C, E, K, 1, 0, NULL, 1, f);
        l3d_be_copy_d2h(be, hp, d[2], sizeof hp);
        l3d_be_copy_d2h(be, hl, d[3], sizeof hl);
        l3d_be_copy_d2h(be, hi, d[4], sizeof hi);
        l3d_be_copy_d2h(be, hw, d[5], sizeof hw);
        int same_as_forced = 1;
        for (int n = 0; n < N; n++) {
            for (int e = 0; e < E; e++) { /* the CPU kernel's fp32 logits, in its order */
                float s = 0.0f;
                for (int c = 0; c < C; c++) s += x[n * C + c] * w[e * C + c];
                p[e] = s;
            }
            rl = l3d_moe_route_row(p, ri, rw, pass == 0 ? forced + n * K : NULL, E, K, 1);
            CHECK(rl == hl[n] && memcmp(p, hp + n * E, sizeof p) == 0);
            CHECK(memcmp(ri, hi + n * K, sizeof ri) == 0 && memcmp(rw, hw + n * K, sizeof rw) == 0);
            CHECK_NEAR(rw[0] + rw[1], 1.0f, 1e-6);
            CHECK_NEAR(rw[0] * (p[ri[1]]), rw[1] * (p[ri[0]]), 1e-7); /* p's ratio kept */
            same_as_forced &= memcmp(hi + n * K, forced + n * K, sizeof ri) == 0;
        }
        CHECK(same_as_forced == (pass == 0));
    }
    for (int i = 0; i < 9; i++) l3d_be_free(be, d[i]);
    l3d_be_free(be, work);
    l3d_be_free(be, df);
}

/* l3d_moe_force_rows, one layout against another: a sequence of 8 rows, E 8, K 3 (T K = 24: each
 * expert 3 a sequence; a ring rank's 4 rows take 12, not a multiple of E, so a rule that took the
 * rank's rows for the sequence would start the second sequence elsewhere), layer 5. A context-parallel ring of 2 (rank r's 4 rows: chunks r and
 * 3 - r of 2 rows, written out here) gives each of its rows the full sequence's row at that
 * position; generation's one row at a time (pos0) the same; the chunks swapped must not. */
static void test_force_rows(void) {
    enum { B = 2, T = 8, E = 8, K = 3, L = 5 };
    int32_t full[B * T * K], ring[B * (T / 2) * K], one[K];
    l3d_moe_force_rows(full, E, K, L, B, T, 1, 0, 0);
    for (int b = 0; b < B; b++) {
        int cnt[E] = {0};
        for (int i = 0; i < T * K; i++) cnt[full[b * T * K + i]]++;
        for (int e = 0; e < E; e++) CHECK(cnt[e] == T * K / E);
        for (int t = 0; t < T; t++) /* K distinct experts a row */
            for (int j = 0; j < K; j++)
                for (int i = 0; i < j; i++)
                    CHECK(full[(b * T + t) * K + i] != full[(b * T + t) * K + j]);
    }
    for (int r = 0; r < 2; r++) {
        l3d_moe_force_rows(ring, E, K, L, B, T / 2, 2, r, 0);
        int same = 1, swapped = 1;
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T / 2; t++) {
                int c = t < 2 ? r : 3 - r, cs = t < 2 ? 3 - r : r;
                const int32_t *got = ring + (b * (T / 2) + t) * K;
                same &= memcmp(got, full + (b * T + c * 2 + t % 2) * K, K * 4) == 0;
                swapped &= memcmp(got, full + (b * T + cs * 2 + t % 2) * K, K * 4) == 0;
            }
        CHECK(same && !swapped);
    }
    for (int t = 0; t < T; t++) {
        l3d_moe_force_rows(one, E, K, L, 1, 1, 1, 0, t);
        CHECK(memcmp(one, full + t * K, sizeof one) == 0);
        l3d_moe_force_rows(one, E, K, L + 1, 1, 1, 1, 0, t); /* another layer: another start */
        CHECK(memcmp(one, full + t * K, sizeof one) != 0);
    }
}

/* Every token to expert 0: the second LayerNorm's output made the same for every token (weight 0,
 * bias 1) and the router's row 0 the only non-zero one. The second choice is a tie of the other
 * three experts: expert 1 (the lower index). With capacity factor 1 each expert keeps
 * ceil(N K / E) = N / 2 of its N assignments. */
static void test_all_to_one(struct l3d_backend *be) {
    for (int pass = 0; pass < 2; pass++) {
        struct l3d_moe_spec s = {.experts = 4, .top_k = 2, .ffn = 12, .norm_topk = true,
                                 .aux_coef = 0.1, .capacity_factor = pass ? 1.0 : 0.0};
        struct l3d_model_spec cfg = moe_config(false, s);
        int B = 2, T = 8, N = B * T;
        struct l3d_gpt *m = model_dt(be, &cfg, B, T, L3D_RECOMPUTE_NONE, L3D_F32);
        float *p = malloc((size_t)m->num_params * sizeof(float));
        random_weights(m, p, 3);
        const struct l3d_tensor_info *w = &m->tensors[L3D_T_LN2W], *b = &m->tensors[L3D_T_LN2B];
        const struct l3d_tensor_info *rt = &m->tensors[L3D_T_ROUTER];
        for (int64_t i = 0; i < w->count; i++) p[w->offset + i] = 0.0f, p[b->offset + i] = 1.0f;
        for (int64_t i = 0; i < rt->count; i++)
            p[rt->offset + i] = i % (rt->rows * rt->cols) < rt->cols ? 1.0f : 0.0f;
        set_params(m, p);
        int32_t inp[16], tgt[16];
        ref_fill_tokens(inp, N, 0, cfg.V, 9, 1);
        ref_fill_tokens(tgt, N, 0, cfg.V, 9, 2);
        double st[2 * 4 + 4];
        float loss = step(m, inp, tgt, B, T, st);
        CHECK(isfinite(loss));
        for (int j = 0; j < 2; j++) /* expert 0 and, by the tie rule, expert 1: all N each */
            CHECK(st[j * 4 + 0] == N && st[j * 4 + 1] == N && st[j * 4 + 2] == 0 &&
                  st[j * 4 + 3] == 0);
        struct l3d_moe_summary sum;
        l3d_moe_summarize(st, 2, 4, NULL, &sum);
        CHECK(sum.load_max == 2.0);
        CHECK(sum.dropped == (pass ? 2.0 * N : 0.0)); /* two layers, N of 2N over capacity */
        float *g = test_to_host(be, m->grads, m->num_params);
        double sq = 0.0;
        for (int64_t i = 0; i < m->num_params; i++) sq += (double)g[i] * g[i];
        CHECK(isfinite(sq) && sq > 0.0);
        free(g);
        free(p);
        l3d_gpt_free(m);
    }
}

/* The check backend against the cpu backend (bit-identical) in each precision, full
 * recomputation against none (bit-identical), and 16 bits against fp32: the loss within 2% (a
 * few roundings of 2^-8 in bf16 through two layers) and the gradients within 10% of their
 * largest (the router's top-k may flip for a token whose two choices are within a rounding). */
static void test_backends_and_precisions(struct l3d_backend *cpu) {
    struct l3d_backend *chk;
    L3D_ASSERT(l3d_backend_init("check", &chk) == L3D_OK);
    struct l3d_model_spec cfg;
    CHECK(l3d_model_preset(&cfg, "moe-tiny") == L3D_OK);
    cfg.moe.capacity_factor = 1.0;
    int B = 2, T = 16;
    int32_t inp[32], tgt[32];
    ref_fill_tokens(inp, B * T, 0, cfg.V, 4, 1);
    ref_fill_tokens(tgt, B * T, 0, cfg.V, 4, 2);
    const enum l3d_dtype dts[3] = {L3D_F32, L3D_BF16, L3D_F16};
    float loss32 = 0.0f, *g32 = NULL;
    for (int d = 0; d < 3; d++) {
        struct l3d_gpt *a = model_dt(cpu, &cfg, B, T, L3D_RECOMPUTE_NONE, dts[d]);
        struct l3d_gpt *b = model_dt(chk, &cfg, B, T, L3D_RECOMPUTE_NONE, dts[d]);
        struct l3d_gpt *f = model_dt(cpu, &cfg, B, T, L3D_RECOMPUTE_FULL, dts[d]);
        float *p = malloc((size_t)a->num_params * sizeof(float));
        random_weights(a, p, 21);
        for (int64_t i = 0; i < a->num_params; i++) p[i] *= 0.3f;
        set_params(a, p);
        set_params(b, p);
        set_params(f, p);
        double st[3][2 * 4 + 4];
        float la = step(a, inp, tgt, B, T, st[0]), lb = step(b, inp, tgt, B, T, st[1]);
        float lf = step(f, inp, tgt, B, T, st[2]);
        float *ga = test_to_host(cpu, a->grads, a->num_params);
        float *gb = test_to_host(chk, b->grads, b->num_params);
        float *gf = test_to_host(cpu, f->grads, f->num_params);
        CHECK(la == lb && lf == la && isfinite(la));
        CHECK(memcmp(ga, gb, (size_t)a->num_params * sizeof(float)) == 0);
        CHECK(memcmp(ga, gf, (size_t)a->num_params * sizeof(float)) == 0);
        CHECK(memcmp(st[0], st[1], sizeof st[0]) == 0 && memcmp(st[0], st[2], sizeof st[0]) == 0);
        if (d == 0) {
            loss32 = la;
            g32 = ga;
        } else {
            CHECK_NEAR(la, loss32, 0.02 * loss32);
            CHECK(test_rel_diff(ga, g32, a->num_params) < 0.1);
            free(ga);
        }
        free(gb);
        free(gf);
        free(p);
        l3d_gpt_free(a);
        l3d_gpt_free(b);
        l3d_gpt_free(f);
    }
    free(g32);
    l3d_backend_free(chk);
}

/* The router's counting sort in integers (issue 46's defect: it counted in fp32, exact only
 * below 2^24, and allocated its counters on every call): 2^24 + 5 assignments to one expert of
 * two, dropless and with a capacity, against the counts written out; and the route kernel
 * allocates nothing (the accounted peak stays where it was: the counters are the caller's). */
static void test_sort_exact(void) {
    const int64_t n = ((int64_t)1 << 24) + 5;
    int32_t *idx = malloc((size_t)n * sizeof *idx), *pos = malloc((size_t)n * sizeof *pos);
    L3D_ASSERT(idx && pos);
    for (int64_t i = 0; i < n; i++) idx[i] = i == 3 ? 1 : 0; /* expert 1 takes the fourth */
    int32_t sw[6], off[3]; /* the sort's workspace: counts, running and kept */
    for (int pass = 0; pass < 2; pass++) {
        int64_t cap = pass ? ((int64_t)1 << 24) + 2 : 0, kept0 = pass ? cap : n - 1;
        int64_t dropped = l3d_cpu_moe_sort(idx, n, 2, cap, NULL, n, sw, off, pos);
        CHECK(sw[0] == n - 1 && sw[1] == 1);
        CHECK(off[0] == 0 && off[1] == kept0 && off[2] == kept0 + 1);
        CHECK(dropped == n - 1 - kept0);
        /* expert 0's rows in token order, expert 1's after them, the overflow dropped */
        CHECK(pos[0] == 0 && pos[3] == kept0 && pos[4] == 3);
        CHECK(pos[n - 1] == (pass ? -1 : n - 2) && pos[n - 4] == n - 5);
        if (pass) CHECK(pos[cap] == kept0 - 1 && pos[cap + 1] == -1); /* the last kept */
    }
    free(idx);
    free(pos);

    struct l3d_backend *cpu;
    L3D_ASSERT(l3d_backend_init("cpu", &cpu) == L3D_OK);
    enum { N = 6, C = 3, E = 4, K = 2 };
    float x[N * C], w[E * C];
    ref_fill_normal(x, N * C, 0.0f, 1.0f, 5, 1);
    ref_fill_normal(w, E * C, 0.0f, 1.0f, 5, 2);
    float probs[N * E], lse[N], wts[N * K], st[2 * E + 2];
    int32_t ix[N * K], ps[N * K], of[E + 1], work[3 * E];
    size_t before = l3d_mem_window_begin(), used = l3d_mem_used();
    l3d_be_moe_route(cpu, L3D_F32, probs, lse, ix, wts, ps, of, st, work, x, w, N, C, E, K, 1, 0,
                     NULL, 1, NULL);
    CHECK(l3d_mem_peak() == used); /* nothing allocated inside, not even for a moment */
    l3d_mem_window_end(before);
    CHECK(of[E] == N * K && work[0] + work[1] + work[2] + work[3] == N * K);
    for (int e = 0; e < E; e++) CHECK(st[e] == (float)work[e]);
    l3d_backend_free(cpu);
}

/* The router kernels alone against float64: l3d_be_moe_route's probabilities, log-sum-exp, top-k
 * (ties to the lower index: two equal logits made on purpose), weights, the counting sort and
 * its statistics; l3d_be_moe_router_backward's logit gradient against the softmax Jacobian
 * written out (with renormalisation, the Switch and z terms), and its input and weight
 * gradients. The reference without renormalisation must not match the renormalised kernel. */
static void test_router_kernels(struct l3d_backend *be) {
    enum { N = 7, C = 5, E = 5, K = 3 };
    float x[N * C], w[E * C], dw[N * K];
    ref_fill_normal(x, N * C, 0.0f, 1.0f, 31, 1);
    ref_fill_normal(w, E * C, 0.0f, 0.5f, 31, 2);
    ref_fill_normal(dw, N * K, 0.0f, 1.0f, 31, 3);
    memcpy(w + 3 * C, w + 1 * C, C * sizeof(float)); /* experts 1 and 3 tie for every token */
    size_t fb = sizeof(float);
    float *dx = l3d_be_alloc(be, N * C * fb, "x"), *dwt = l3d_be_alloc(be, E * C * fb, "w");
    float *probs = l3d_be_alloc(be, N * E * fb, "p"), *lse = l3d_be_alloc(be, N * fb, "lse");
    float *wts = l3d_be_alloc(be, N * K * fb, "wts"), *st = l3d_be_alloc(be, (2 * E + 2) * fb, "s");
    int32_t *idx = l3d_be_alloc(be, N * K * 4, "idx"), *pos = l3d_be_alloc(be, N * K * 4, "pos");
    int32_t *off = l3d_be_alloc(be, (E + 1) * 4, "off"), *work = l3d_be_alloc(be, 3 * E * 4, "w");
    float *ddw = l3d_be_alloc(be, N * K * fb, "dw"), *dl = l3d_be_alloc(be, N * E * fb, "dl");
    float *gin = l3d_be_alloc(be, N * C * fb, "gx"), *gw = l3d_be_alloc(be, E * C * fb, "gw");
    l3d_be_copy_h2d(be, dx, x, sizeof x);
    l3d_be_copy_h2d(be, dwt, w, sizeof w);
    l3d_be_copy_h2d(be, ddw, dw, sizeof dw);
    l3d_be_memset(be, gin, 0, N * C * fb);
    l3d_be_memset(be, gw, 0, E * C * fb);
    l3d_be_moe_route(be, L3D_F32, probs, lse, idx, wts, pos, off, st, work, dx, dwt, N, C, E, K,
                     1, 4, NULL, 1, NULL);
    const float aux = 0.3f, z = 0.2f;
    l3d_be_moe_router_backward(be, L3D_F32, L3D_F32, gin, gw, dl, ddw, dx, dwt, probs, lse, idx,
                               wts, st, N, C, E, K, 1, aux, z);
    float hp[N * E], hl[N], hw[N * K], hs[2 * E + 2], hdl[N * E], hgx[N * C], hgw[E * C];
    int32_t hi[N * K], hpos[N * K], hoff[E + 1];
    l3d_be_copy_d2h(be, hp, probs, sizeof hp);
    l3d_be_copy_d2h(be, hl, lse, sizeof hl);
    l3d_be_copy_d2h(be, hw, wts, sizeof hw);
    l3d_be_copy_d2h(be, hs, st, sizeof hs);
    l3d_be_copy_d2h(be, hdl, dl, sizeof hdl);
    l3d_be_copy_d2h(be, hgx, gin, sizeof hgx);
    l3d_be_copy_d2h(be, hgw, gw, sizeof hgw);
    l3d_be_copy_d2h(be, hi, idx, sizeof hi);
    l3d_be_copy_d2h(be, hpos, pos, sizeof hpos);
    l3d_be_copy_d2h(be, hoff, off, sizeof hoff);
    struct l3d_model_spec cfg = {.C = C, .moe = {.experts = E, .top_k = K, .norm_topk = true}};
    struct ref_model r = {.cfg = cfg}, r_plain = r;
    r_plain.cfg.moe.norm_topk = false;
    double xd[N * C], wd[E * C], count[E] = {0}, psum[E] = {0}, zsum = 0;
    ref_to_double(xd, x, N * C);
    ref_to_double(wd, w, E * C);
    double worst = 0.0, worst_plain = 0.0, dworst = 0.0, gmax = 0.0;
    double dlog[N * E];
    int fill[E] = {0}, dropped = 0, cap = 4;
    for (int n = 0; n < N; n++) {
        double p[E], l, wk[K], wp[K];
        int id[K], idp[K];
        ref_route(&r, xd + n * C, wd, p, &l, id, wk, K, NULL);
        ref_route(&r_plain, xd + n * C, wd, p, &l, idp, wp, K, NULL);
        zsum += l * l;
        CHECK_NEAR(hl[n], l, 1e-5 * fabs(l) + 1e-6);
        for (int e = 0; e < E; e++) {
            CHECK_NEAR(hp[n * E + e], p[e], 1e-6);
            psum[e] += p[e];
        }
        for (int k = 0; k < K; k++) {
            CHECK(hi[n * K + k] == id[k]);
            worst = test_max(worst, fabs(hw[n * K + k] - wk[k]));
            worst_plain = test_max(worst_plain, fabs(hw[n * K + k] - wp[k]));
            count[id[k]] += 1;
            bool keep = fill[id[k]] < cap; /* token order: the first `cap` assignments */
            dropped += !keep;
            CHECK(hpos[n * K + k] == (keep ? hoff[id[k]] + fill[id[k]]++ : -1));
        }
        int at1 = -1, at3 = -1; /* the tie: expert 1 chosen before expert 3 */
        for (int k = 0; k < K; k++) {
            if (hi[n * K + k] == 1) at1 = k;
            if (hi[n * K + k] == 3) at3 = k;
        }
        CHECK(at3 < 0 || (at1 >= 0 && at1 < at3));
        /* dlogits: renormalisation, softmax Jacobian, Switch (aux x count_e on dP), z (z lse p) */
        double S = 0, dot = 0, dp[E], pd = 0;
        for (int k = 0; k < K; k++) S += p[id[k]], dot += dw[n * K + k] * wk[k];
        for (int e = 0; e < E; e++) dp[e] = aux * (double)hs[e];
        for (int k = 0; k < K; k++) dp[id[k]] += (dw[n * K + k] - dot) / S;
        for (int e = 0; e < E; e++) pd += p[e] * dp[e];
        for (int e = 0; e < E; e++) {
            dlog[n * E + e] = p[e] * (dp[e] - pd) + z * l * p[e];
            dworst = test_max(dworst, fabs(hdl[n * E + e] - dlog[n * E + e]));
            gmax = fmax(gmax, fabs(dlog[n * E + e]));
        }
    }
    CHECK(worst < 1e-6 && !(worst_plain < 1e-3)); /* renormalised, and the plain weights differ */
    CHECK(dworst < 1e-5 * gmax);
    for (int e = 0; e < E; e++) CHECK(hs[e] == count[e] && hoff[e + 1] - hoff[e] == fill[e]);
    for (int e = 0; e < E; e++) CHECK_NEAR(hs[E + e], psum[e], 1e-5);
    CHECK_NEAR(hs[2 * E], zsum, 1e-4 * zsum);
    CHECK(hs[2 * E + 1] == dropped && dropped > 0);
    double gx[N * C], gwr[E * C]; /* dx = dlogits W, dW = dlogits^T x */
    for (int i = 0; i < N * C; i++) gx[i] = 0;
    for (int i = 0; i < E * C; i++) gwr[i] = 0;
    for (int n = 0; n < N; n++)
        for (int e = 0; e < E; e++)
            for (int c = 0; c < C; c++) {
                gx[n * C + c] += dlog[n * E + e] * wd[e * C + c];
                gwr[e * C + c] += dlog[n * E + e] * xd[n * C + c];
            }
    for (int i = 0; i < N * C; i++) CHECK_NEAR(hgx[i], gx[i], 1e-5 * gmax * 4);
    for (int i = 0; i < E * C; i++) CHECK_NEAR(hgw[i], gwr[i], 1e-5 * gmax * 8);
    void *bufs[] = {dx, dwt, probs, lse, wts, st, idx, pos, off, work, ddw, dl, gin, gw};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) l3d_be_free(be, bufs[i]);
}

/* msg holds pat. */
static bool says(const char *pat) { return strstr(l3d_error_message(), pat) != NULL; }

/* The spec's rules, each a clear refusal; the layouts MoE does not run on yet, by name. */
static void test_spec(void) {
    struct l3d_model_spec c;
    CHECK(l3d_model_preset(&c, "moe-tiny") == L3D_OK);
    struct l3d_model_spec bad = c;
    bad.moe.top_k = 5;
    CHECK(l3d_gpt_config_finish(&bad) == L3D_ERR_ARG && says("--moe-top-k 5 with --moe-experts 4"));
    bad = c, bad.moe.top_k = 0;
    CHECK(l3d_gpt_config_finish(&bad) == L3D_ERR_ARG && says("--moe-top-k 0"));
    bad = c, bad.moe.experts = 0;
    CHECK(l3d_gpt_config_finish(&bad) == L3D_ERR_ARG && says("without --moe-experts"));
    bad = c, bad.moe.dense_layers = 3;
    CHECK(l3d_gpt_config_finish(&bad) == L3D_ERR_ARG && says("--moe-dense-layers 3"));
    bad = c, bad.moe.aux_coef = NAN;
    CHECK(l3d_gpt_config_finish(&bad) == L3D_ERR_ARG && says("--moe-aux-loss-coef"));
    bad = c, bad.moe.z_coef = -1;
    CHECK(l3d_gpt_config_finish(&bad) == L3D_ERR_ARG && says("--moe-z-loss-coef"));
    bad = c, bad.moe.capacity_factor = -0.5;
    CHECK(l3d_gpt_config_finish(&bad) == L3D_ERR_ARG && says("--moe-capacity-factor"));
    bad = c, bad.moe.ffn = -1;
    CHECK(l3d_gpt_config_finish(&bad) == L3D_ERR_ARG && says("--moe-ffn"));
    CHECK(l3d_model_preset(&bad, "tiny") == L3D_OK);
    bad.moe.force_balance = true; /* a dense model has no selection to force */
    CHECK(l3d_gpt_config_finish(&bad) == L3D_ERR_ARG && says("--moe-force-balance on a dense"));
    bad = c;
    CHECK(l3d_gpt_config_finish(&bad) == L3D_OK); /* the preset itself holds */
    struct l3d_run_spec s;
    l3d_run_spec_defaults(&s);
    s.model = c;
    struct l3d_spec_ctx ctx = {.world = 2, .train = true};
    s.layout.tp = 2;
    s.layout.seq = 32;
    CHECK(l3d_spec_check(&s, &ctx, NULL) == L3D_OK); /* the experts whole on each tp rank */
    s.layout.tp = 1, s.layout.pp = 2; /* a stage's MoE layers: its own (l3d_gpt_tensor_first) */
    CHECK(l3d_spec_check(&s, &ctx, NULL) == L3D_OK);
    /* context parallelism: the EP group lies in dp x cp (here the ring itself) */
    s.layout.pp = 1, s.layout.cp = 2, s.layout.ep = 2;
    CHECK(l3d_spec_check(&s, &ctx, NULL) == L3D_OK);
    s.layout.ep = 4;
    CHECK(l3d_spec_check(&s, &ctx, NULL) != L3D_OK &&
          says("--ep 4 does not divide the 2 ranks of data x context parallelism (dp 1 x --cp 2)"));
    s.layout.cp = 1, s.layout.ep = 1, s.layout.zero = 3;
    CHECK(l3d_spec_check(&s, &ctx, NULL) == L3D_OK);
    s.layout.zero = 1;
    CHECK(l3d_spec_check(&s, &ctx, NULL) == L3D_OK);
}

/* The counts, derived: gpt2-moe is GPT-2 small (124,475,904 parameters with the padded
 * vocabulary) whose 12 MLPs (2 x 768 x 3072 + 3072 + 768 = 4,722,432 each) become a router
 * (8 x 768 = 6,144) and 8 experts of width 1536 (2 x 768 x 1536 + 1536 + 768 = 2,361,600 each):
 * 12 x (6,144 + 8 x 2,361,600 - 4,722,432) = 170,118,144 more, 294,594,048 in all; a token uses
 * 2 experts: 12 x (6,144 + 2 x 2,361,600 - 4,722,432) = 82,944 more than GPT-2, 124,558,848. */
static void test_counts(void) {
    struct l3d_model_spec c;
    CHECK(l3d_model_preset(&c, "gpt2-moe") == L3D_OK);
    CHECK(l3d_gpt_param_count(&c) == 294594048LL);
    CHECK(l3d_model_active_param_count(&c) == 124558848.0);
    struct l3d_model_spec d;
    CHECK(l3d_model_preset(&d, "d12") == L3D_OK);
    CHECK(l3d_gpt_param_count(&d) == 124475904LL);
    CHECK(l3d_model_active_param_count(&d) == 124475904.0);
    /* the active count's FLOPs: 6 per active parameter as the dense model's (wpe aside) */
    CHECK_NEAR(l3d_gpt_flops_per_token(&c, 1024) - l3d_gpt_flops_per_token(&d, 1024),
               6.0 * 82944, 1e-3);
    /* moe-tiny's table: the dense MLP in no layer, the MoE tensors in both */
    /* a pipeline stage's first layer of each tensor, in that tensor's own numbering: 4 layers,
     * 1 leading dense; the second stage (layers 2-3) holds MoE layers 1-2, no dense MLP */
    struct l3d_model_spec q;
    CHECK(l3d_model_preset(&q, "moe-tiny") == L3D_OK);
    q.L = 4, q.moe.dense_layers = 1;
    struct l3d_shard st = l3d_shard_full(&q);
    st.layer_start = 2, st.layer_count = 2;
    CHECK(l3d_gpt_tensor_first(&q, &st, L3D_T_ROUTER) == 1);
    CHECK(l3d_gpt_tensor_first(&q, &st, L3D_T_EXPFCW) == 1);
    CHECK(l3d_gpt_tensor_first(&q, &st, L3D_T_QKVW) == 2);
    CHECK(l3d_gpt_tensor_first(&q, &st, L3D_T_WTE) == 0);
    st.layer_start = 0; /* the first stage: MoE layer 0 is its layer 1 */
    CHECK(l3d_gpt_tensor_first(&q, &st, L3D_T_ROUTER) == 0);
    CHECK(l3d_gpt_tensor_first(&q, &st, L3D_T_FCW) == 0);
    struct l3d_model_spec t;
    CHECK(l3d_model_preset(&t, "moe-tiny") == L3D_OK);
    struct l3d_tensor_info ti[L3D_NUM_TENSORS];
    struct l3d_shard sh = l3d_shard_full(&t);
    l3d_gpt_plan_tensors(&t, &sh, ti);
    CHECK(ti[L3D_T_FCW].count == 0 && ti[L3D_T_ROUTER].layers == 2 && ti[L3D_T_ROUTER].rows == 4);
    CHECK(ti[L3D_T_EXPFCW].rows == 4 * 128 && ti[L3D_T_EXPPROJW].rows == 4 * 64 &&
          ti[L3D_T_EXPPROJW].cols == 128 && ti[L3D_T_SHFCW].count == 0);
    t.moe.dense_layers = 1;
    l3d_gpt_plan_tensors(&t, &sh, ti);
    CHECK(ti[L3D_T_FCW].layers == 1 && ti[L3D_T_ROUTER].layers == 1);
    CHECK(l3d_gpt_tensor_layer(&t, &sh, L3D_T_FCW, 1) == -1 &&
          l3d_gpt_tensor_layer(&t, &sh, L3D_T_ROUTER, 1) == 0 &&
          l3d_gpt_tensor_layer(&t, &sh, L3D_T_ROUTER, 0) == -1);
}

/* A backend without the MoE kernels (the CUDA backend's case): the model refuses at build, by
 * name. The cpu backend's table with the route kernel taken out stands for it. */
/* Expert parallelism's shards: EP rank r of ep holds experts [r E/ep, (r+1) E/ep); its
 * initial weights are the full model's cut to those experts (the router and everything else
 * whole), and the ep shards placed back give the full model. The cut of the neighbouring
 * experts must differ (the check's negative case). */
static void test_expert_shards(struct l3d_backend *be) {
    struct l3d_moe_spec a = {.experts = 4, .top_k = 2, .ffn = 12, .shared = 1, .dense_layers = 1};
    for (int swiglu = 0; swiglu < 2; swiglu++) {
        struct l3d_model_spec cfg = moe_config(swiglu, a);
        struct l3d_gpt *full = model_dt(be, &cfg, 1, 4, L3D_RECOMPUTE_NONE, L3D_F32);
        l3d_gpt_init_weights(full, 7);
        int64_t nf = full->num_params;
        float *back = calloc((size_t)nf, sizeof *back);
        /* the parameters in host memory (the check backend's device memory is not the host's) */
        float *fullh = malloc((size_t)nf * sizeof *fullh);
        l3d_be_copy_d2h(be, fullh, full->params, (size_t)nf * sizeof *fullh);
        for (int ep = 2; ep <= 4; ep += 2)
            for (int r = 0; r < ep; r++) {
                struct l3d_shard sh = l3d_shard_full(&cfg);
                l3d_shard_set_experts(&cfg, &sh, ep, r);
                CHECK(sh.expert_start == r * 4 / ep && sh.expert_count == 4 / ep);
                struct l3d_gpt *m;
                CHECK(l3d_gpt_init(&m, &cfg, &sh, be, 1, 4, L3D_GRADS_FLAT) == L3D_OK);
                l3d_gpt_init_weights(m, 7);
                size_t mb = (size_t)m->num_params * sizeof(float);
                float *cut = calloc(1, mb), *mh = malloc(mb);
                l3d_be_copy_d2h(be, mh, m->params, mb);
                l3d_gpt_full_to_shard(&cfg, &sh, fullh, cut);
                CHECK(memcmp(cut, mh, mb) == 0);
                l3d_gpt_shard_to_full(&cfg, &sh, mh, back);
                struct l3d_shard next = sh; /* the neighbouring experts' cut differs */
                next.expert_start = (sh.expert_start + sh.expert_count) % 4;
                l3d_gpt_full_to_shard(&cfg, &next, fullh, cut);
                CHECK(memcmp(cut, mh, mb) != 0);
                free(cut);
                free(mh);
                l3d_gpt_free(m);
            }
        CHECK(memcmp(back, fullh, (size_t)nf * sizeof *back) == 0);
        free(back);
        free(fullh);
        l3d_gpt_free(full);
    }
}

static void test_backend_refused(struct l3d_backend *cpu) {
    struct l3d_backend_i table = *cpu->i;
    table.moe_route = NULL;
    struct l3d_backend lacking = {.i = &table, .ctx = cpu->ctx};
    struct l3d_model_spec cfg;
    CHECK(l3d_model_preset(&cfg, "moe-tiny") == L3D_OK);
    struct l3d_shard sh = l3d_shard_full(&cfg);
    struct l3d_gpt *m = NULL;
    CHECK(l3d_gpt_init(&m, &cfg, &sh, &lacking, 1, 8, L3D_GRADS_FLAT) == L3D_ERR_ARG && !m &&
          says("has no MoE kernels (--moe-experts 4): the cpu, check and CUDA "
               "backends have them"));
    CHECK(l3d_model_preset(&cfg, "tiny") == L3D_OK); /* a dense model builds there */
    CHECK(l3d_gpt_init(&m, &cfg, &sh, &lacking, 1, 8, L3D_GRADS_FLAT) == L3D_OK);
    l3d_gpt_free(m);
}

/* ---- a capacity on a context-parallel ring (l3d_moe_chunk_counts, l3d_moe_chunk_fills) ------
 * A micro-batch of RB rows of 2 cp chunks of RH tokens, routed at random (K distinct experts a
 * token), split over the ring as the trainer does (rank r: chunks r and 2 cp - 1 - r of each row,
 * row-major); each rank's counts summed (the all-reduce), each rank's fills against a count over
 * the whole micro-batch in one process's order (b T + t), and the drops those fills give against
 * one process's. Negative: another rank's fills, and no fills (each rank's own tokens only, the
 * old per-rank rule), must disagree with one process. */
enum { RB = 2, RH = 3, RE = 4, RK = 2, RMAXCP = 3 };

/* The fills, and whether rank r's drops equal one process's, at capacity cap. */
static bool ring_matches(const int32_t *gidx, const int32_t *fill, int cp, int r, int64_t cap,
                         bool check_fills) {
    int64_t Tg = 2 * cp * RH, ok = 1;
    int32_t seen[RE];
    bool keep_one[RB * 2 * RMAXCP * RH * RK];
    memset(seen, 0, sizeof seen);
    for (int64_t i = 0; i < RB * Tg * RK; i++) keep_one[i] = seen[gidx[i]]++ < cap;
    for (int64_t s = 0; s < 2 * RB; s++) {
        int64_t b = s / 2, c = l3d_cp_chunk_start(cp, r, (int)(s % 2), 2), g0 = (b * Tg + c * RH);
        int32_t before[RE] = {0}, in_seg[RE] = {0};
        for (int64_t i = 0; i < g0 * RK; i++) before[gidx[i]]++;
        for (int64_t e = 0; e < RE && check_fills; e++) ok &= fill[s * RE + e] == before[e];
        for (int64_t i = g0 * RK; i < (g0 + RH) * RK; i++) {
            int32_t e = gidx[i];
            ok &= (fill[s * RE + e] + in_seg[e]++ < cap) == keep_one[i];
        }
    }
    return ok;
}

static void test_ring_capacity(void) {
    uint32_t rng = 12345u;
    for (int cp = 2; cp <= RMAXCP; cp++) {
        int64_t Tg = 2 * cp * RH, NL = RB * 2 * RH, G = RB * 2 * cp * RE;
        int32_t gidx[RB * 2 * RMAXCP * RH * RK], lidx[RB * 2 * RH * RK];
        for (int64_t n = 0; n < RB * Tg; n++) {
            rng = rng * 1664525u + 1013904223u;
            int32_t a = (int32_t)((rng >> 16) % RE);
            int32_t b = (int32_t)((a + 1 + (rng >> 8) % (RE - 1)) % RE); /* not a */
            gidx[n * RK] = a, gidx[n * RK + 1] = b;
        }
        float tot[RB * 2 * RMAXCP * RE] = {0}, cnt[RB * 2 * RMAXCP * RE];
        for (int r = 0; r < cp; r++) { /* each rank's tokens in its order, its counts summed */
            for (int64_t n = 0; n < NL; n++) {
                int64_t b = n / (2 * RH), k = (n % (2 * RH)) / RH, j = n % RH;
                int64_t t = l3d_cp_chunk_start(cp, r, (int)k, 2 * RH) + j;
                for (int64_t q = 0; q < RK; q++) lidx[n * RK + q] = gidx[(b * Tg + t) * RK + q];
            }
            l3d_moe_chunk_counts(cnt, lidx, NL, RK, RE, RB, cp, r);
            for (int64_t i = 0; i < G; i++) tot[i] += cnt[i];
        }
        int32_t fill[2 * RB * RE], other[2 * RB * RE], none[2 * RB * RE] = {0};
        bool none_differs = false;
        for (int r = 0; r < cp; r++) {
            memcpy(cnt, tot, sizeof tot);
            l3d_moe_chunk_fills(fill, cnt, RE, RB, cp, r);
            memcpy(cnt, tot, sizeof tot);
            l3d_moe_chunk_fills(other, cnt, RE, RB, cp, (r + 1) % cp);
            for (int64_t cap = 1; cap <= 8; cap++) {
                CHECK(ring_matches(gidx, fill, cp, r, cap, true));
                none_differs |= !ring_matches(gidx, none, cp, r, cap, false);
            }
            CHECK(!ring_matches(gidx, other, cp, r, 3, true));
        }
        CHECK(none_differs);
    }
}

/* The CPU (or check) backend's routing of n tokens x (n,RC) by w (RE,RC) at capacity cap with
 * starting fills (host, or NULL) over segs segments: idx, pos (n,RK) and stats on the host. */
enum { RC = 8 };
static void route_host(struct l3d_backend *be, const float *x, const float *w, int64_t n,
                       int64_t cap, const int32_t *fill, int64_t segs, int32_t *idx, int32_t *pos,
                       float *stats) {
    size_t fb = sizeof(float);
    float *d[6] = {l3d_be_alloc(be, n * RC * fb, "x"), l3d_be_alloc(be, RE * RC * fb, "w"),
                   l3d_be_alloc(be, n * RE * fb, "p"), l3d_be_alloc(be, n * fb, "lse"),
                   l3d_be_alloc(be, n * RK * fb, "wts"), l3d_be_alloc(be, (2 * RE + 2) * fb, "s")};
    int32_t *di = l3d_be_alloc(be, n * RK * 4, "idx"), *dp = l3d_be_alloc(be, n * RK * 4, "pos");
    int32_t *off = l3d_be_alloc(be, (RE + 1) * 4, "off"), *df = NULL;
    int32_t *work = l3d_be_alloc(be, 3 * RE * 4, "work");
    l3d_be_copy_h2d(be, d[0], x, n * RC * fb);
    l3d_be_copy_h2d(be, d[1], w, RE * RC * fb);
    if (fill) {
        df = l3d_be_alloc(be, segs * RE * 4, "fill");
        l3d_be_copy_h2d(be, df, fill, segs * RE * 4);
    }
    l3d_be_moe_route(be, L3D_F32, d[2], d[3], di, d[4], dp, off, d[5], work, d[0], d[1], n, RC, RE,
                     RK, 1, cap, df, segs, NULL);
    l3d_be_copy_d2h(be, idx, di, n * RK * 4);
    l3d_be_copy_d2h(be, pos, dp, n * RK * 4);
    l3d_be_copy_d2h(be, stats, d[5], (2 * RE + 2) * fb);
    for (int i = 0; i < 6; i++) l3d_be_free(be, d[i]);
    l3d_be_free(be, di), l3d_be_free(be, dp), l3d_be_free(be, off), l3d_be_free(be, df);
    l3d_be_free(be, work);
}

/* The whole chain on the backend's kernel: one process routes the micro-batch at capacity 3;
 * each ring rank (cp 2) routes its chunks dropless, its counts are summed with the others', and
 * it routes again with its fills: every assignment kept or dropped as one process's, the drops
 * summed as its. Negative: the ranks without fills (each rank's own order) disagree. */
static void test_ring_route(struct l3d_backend *be) {
    enum { cp = 2, Tg = 2 * cp * RH, NG = RB * Tg, NL = RB * 2 * RH, G = RB * 2 * cp * RE };
    float x[NG * RC], w[RE * RC], xl[NL * RC], st[2 * RE + 2], cnt[G], tot[G] = {0};
    int32_t gidx[NG * RK], gpos[NG * RK], lidx[cp][NL * RK], lpos[NL * RK], fill[2 * RB * RE];
    ref_fill_normal(x, NG * RC, 0.0f, 1.0f, 41, 1);
    ref_fill_normal(w, RE * RC, 0.0f, 1.0f, 41, 2);
    const int64_t cap = 3;
    route_host(be, x, w, NG, cap, NULL, 1, gidx, gpos, st);
    float dropped = st[2 * RE + 1], sum = 0.0f;
    int64_t gof[cp][NL]; /* each rank's tokens' global indices, in its order */
    for (int r = 0; r < cp; r++) {
        for (int64_t n = 0; n < NL; n++) {
            int64_t b = n / (2 * RH), k = (n % (2 * RH)) / RH;
            gof[r][n] = b * Tg + l3d_cp_chunk_start(cp, r, (int)k, 2 * RH) + n % RH;
            memcpy(xl + n * RC, x + gof[r][n] * RC, RC * sizeof(float));
        }
        route_host(be, xl, w, NL, 0, NULL, 1, lidx[r], lpos, st);
        l3d_moe_chunk_counts(cnt, lidx[r], NL, RK, RE, RB, cp, r);
        for (int64_t i = 0; i < G; i++) tot[i] += cnt[i];
    }
    bool same = true, alone_same = true;
    for (int r = 0; r < cp; r++) {
        for (int64_t n = 0; n < NL; n++) memcpy(xl + n * RC, x + gof[r][n] * RC, RC * 4);
        memcpy(cnt, tot, sizeof tot);
        l3d_moe_chunk_fills(fill, cnt, RE, RB, cp, r);
        route_host(be, xl, w, NL, cap, fill, 2 * RB, lidx[r], lpos, st);
        sum += st[2 * RE + 1];
        for (int64_t n = 0; n < NL; n++)
            for (int64_t q = 0; q < RK; q++)
                same &= lidx[r][n * RK + q] == gidx[gof[r][n] * RK + q] &&
                        (lpos[n * RK + q] >= 0) == (gpos[gof[r][n] * RK + q] >= 0);
        route_host(be, xl, w, NL, cap, NULL, 1, lidx[r], lpos, st);
        for (int64_t i = 0; i < NL * RK; i++)
            alone_same &= (lpos[i] >= 0) == (gpos[gof[r][i / RK] * RK + i % RK] >= 0);
    }
    CHECK(same && dropped > 0.0f && sum == dropped);
    CHECK(!alone_same);
}

int main(void) {
    struct l3d_backend *be = test_backend_init();
    test_spec();
    test_counts();
    test_router_kernels(be);
    test_sort_exact();
    test_reference(be);
    test_force_reference(be);
    test_force_rows();
    test_force_kernel(be);
    test_all_to_one(be);
    test_backends_and_precisions(be);
    test_expert_shards(be);
    test_backend_refused(be);
    test_ring_capacity();
    test_ring_route(be);
    l3d_backend_free(be);
    return TEST_REPORT();
}
