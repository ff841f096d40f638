/*
 * The project's rule: memory is allocated and touched once at start-up, never inside the step
 * loop (a fresh page's first touch costs ~12 us per 4 KiB). A whole training step (zero_grad,
 * forward, backward, the gradient norm, AdamW) after the first allocates nothing, not even for a
 * moment (l3d_mem_peak over the step stays at l3d_mem_used), for a Llama model (RoPE, RMSNorm,
 * SwiGLU, grouped KV heads), a Llama mixture of experts and GPT-2, in fp32, fp16 and bf16 with
 * oneDNN's 16-bit kernels off (the backend's fp32 products around widened operands); QK-norm
 * under selective recomputation and the experts under full recomputation in fp16; the fp32 TP
 * sums (--tp-reduce-dtype fp32) in bf16 (GPT-2) and fp16 (Llama, full recomputation).
 * Negative case: the window sees an allocation made inside it. Generation in fp16: the steps
 * after the first allocate nothing while the KV cache grows.
 *
 * The CPU backend's RoPE table is kept between calls (src/backend/cpu.c, rope_table): a rotation
 * after the values of inv_freq or of the positions changed under the same pointers is the fresh
 * rotation's (against a double reference), and not the old one's.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "llm3d/backend.h"
#include "llm3d/infer.h"
#include "llm3d/model.h"
#include "llm3d/optim.h"
#include "support/ref.h"
#include "test.h"

struct trainer {
    struct l3d_gpt *m;
    struct l3d_adamw opt;
    struct l3d_sumsq gsq;
    int32_t inp[64], tgt[64];
    int B, T;
};

/* A model of cfg in precision dt with random weights (its master weights too, in 16 bits);
 * tp32: its row-parallel outputs and column-parallel input gradients through the fp32 TP sums'
 * buffers (--tp-reduce-dtype fp32, src/model/tpsum.c; one process: nothing to sum). */
static void trainer_init(struct trainer *t, struct l3d_backend *be,
                         const struct l3d_model_spec *cfg, enum l3d_dtype dt,
                         enum l3d_recompute rc, bool tp32) {
    t->B = 2;
    t->T = 16;
    struct l3d_shard sh = l3d_shard_full(cfg);
    sh.tp_reduce_f32 = tp32;
    L3D_ASSERT(l3d_gpt_init_dt(&t->m, cfg, &sh, be, t->B, t->T, L3D_GRADS_FLAT, 1, rc, dt) ==
               L3D_OK);
    struct l3d_gpt *m = t->m;
    struct l3d_adamw_hparams hp = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                                   .weight_decay = 0.1f, .grad_clip = 1.0f};
    L3D_ASSERT(l3d_adamw_init_dt(&t->opt, be, &hp, 0, m->num_params, dt) == L3D_OK);
    L3D_ASSERT(l3d_sumsq_init(&t->gsq, be, 1) == L3D_OK);
    int64_t n = m->num_params;
    float *p = malloc((size_t)n * sizeof(float));
    uint16_t *h = malloc((size_t)n * sizeof(uint16_t));
    ref_fill_normal(p, n, 0.0f, 0.05f, 11, 1);
    for (int64_t i = 0; dt != L3D_F32 && i < n; i++)
        h[i] = dt == L3D_BF16 ? l3d_f32_to_bf16(p[i]) : l3d_f32_to_f16(p[i]);
    l3d_be_copy_h2d(be, m->params, dt == L3D_F32 ? (const void *)p : h, (size_t)n * m->es);
    if (t->opt.master) l3d_be_copy_h2d(be, t->opt.master, p, (size_t)n * sizeof(float));
    free(h);
    free(p);
    ref_fill_tokens(t->inp, t->B * t->T, 0, cfg->V, 5, 1);
    ref_fill_tokens(t->tgt, t->B * t->T, 0, cfg->V, 5, 2);
}

static float trainer_step(struct trainer *t) {
    struct l3d_gpt *m = t->m;
    l3d_gpt_zero_grad(m);
    float loss = l3d_gpt_forward(m, t->inp, t->tgt, t->B, t->T);
    l3d_gpt_backward(m, 1.0f / (float)(t->B * t->T), NULL);
    double sq;
    l3d_grad_sumsq(&t->gsq, 0, m->grads, m->num_params);
    l3d_sumsq_take(&t->gsq, &sq);
    l3d_adamw_step(&t->opt, m->be, m->params, m->grads, l3d_clip_factor(sqrt(sq), 1.0f),
                   m->tensors, L3D_NUM_TENSORS, 1e-3f);
    l3d_be_sync(m->be);
    return loss;
}

static void trainer_free(struct trainer *t) {
    l3d_sumsq_free(&t->gsq);
    l3d_adamw_free(&t->opt);
    l3d_gpt_free(t->m);
}

/* The second and third steps allocate nothing; the loss stays finite. */
static void check_steps(struct l3d_backend *be, const struct l3d_model_spec *cfg,
                        enum l3d_dtype dt, enum l3d_recompute rc, const char *what, bool tp32) {
    fprintf(stderr, "%s, %s:\n", what, l3d_dtype_name(dt));
    struct trainer t;
    trainer_init(&t, be, cfg, dt, rc, tp32);
    float first = trainer_step(&t);
    size_t before = l3d_mem_window_begin(), used = l3d_mem_used();
    float loss = trainer_step(&t);
    loss += trainer_step(&t);
    size_t peak = l3d_mem_peak();
    CHECK(peak == used); /* nothing allocated inside the steps, not even for a moment */
    if (peak != used)
        fprintf(stderr, "  a step allocated %zu bytes at its peak\n", peak - used);
    l3d_free(l3d_alloc(64, "test")); /* (negative: the window sees it) */
    CHECK(l3d_mem_peak() > used);
    l3d_mem_window_end(before);
    CHECK(isfinite(first) && isfinite(loss));
    trainer_free(&t);
}

static struct l3d_model_spec llama_config(bool moe, bool qk_norm) {
    struct l3d_model_spec c = {.L = 2, .C = 32, .NH = 4, .NKV = 2, .V = 100, .maxT = 16,
                               .ffn = 48, .qk_norm = qk_norm};
    l3d_model_set_arch(&c, L3D_ARCH_LLAMA);
    if (moe)
        c.moe = (struct l3d_moe_spec){.experts = 4, .top_k = 2, .ffn = 24, .shared = 1,
                                      .dense_layers = 1, .norm_topk = true};
    L3D_ASSERT(l3d_gpt_config_finish(&c) == L3D_OK);
    return c;
}

static void test_steps(struct l3d_backend *be) {
    struct l3d_model_spec llama = llama_config(false, false), moe = llama_config(true, false);
    struct l3d_model_spec qwen = llama_config(false, true);
    struct l3d_model_spec gpt2 = {.L = 2, .C = 32, .NH = 4, .V = 100, .maxT = 16};
    L3D_ASSERT(l3d_gpt_config_finish(&gpt2) == L3D_OK);
    const enum l3d_dtype dts[3] = {L3D_F32, L3D_F16, L3D_BF16};
    for (int i = 0; i < 3; i++) {
        check_steps(be, &llama, dts[i], L3D_RECOMPUTE_NONE, "llama", false);
        check_steps(be, &moe, dts[i], L3D_RECOMPUTE_NONE, "llama with experts", false);
    }
    check_steps(be, &gpt2, L3D_F16, L3D_RECOMPUTE_NONE, "gpt2", false);
    check_steps(be, &qwen, L3D_F16, L3D_RECOMPUTE_SELECTIVE, "llama, QK-norm, selective", false);
    check_steps(be, &moe, L3D_F16, L3D_RECOMPUTE_FULL, "llama with experts, full recompute",
                false);
    check_steps(be, &gpt2, L3D_BF16, L3D_RECOMPUTE_NONE, "gpt2, fp32 TP sums", true);
    check_steps(be, &llama, L3D_F16, L3D_RECOMPUTE_FULL, "llama, fp32 TP sums, full recompute",
                true);
}

/* Generation in fp16 (a Llama with RoPE and the KV cache): the steps after the first allocate
 * nothing, though the cache the attention reads grows by a row each step (the backend's widened
 * keys: sized at l3d_infer_init). Run before anything else on the backend, so that no earlier
 * kernel has grown its scratch already. */
static void test_generation(struct l3d_backend *be) {
    struct l3d_model_spec c = llama_config(false, false);
    c.maxT = 48;
    L3D_ASSERT(l3d_gpt_config_finish(&c) == L3D_OK);
    struct l3d_shard sh = l3d_shard_full(&c);
    struct l3d_gpt *m;
    L3D_ASSERT(l3d_gpt_init_dt(&m, &c, &sh, be, 1, c.maxT, L3D_GRADS_NONE, 1,
                               L3D_RECOMPUTE_NONE, L3D_F16) == L3D_OK);
    l3d_be_memset(be, m->params, 0, (size_t)m->num_params * m->es);
    struct l3d_infer *inf;
    CHECK(l3d_infer_init(&inf, m) == L3D_OK);
    int32_t tok[48];
    ref_fill_tokens(tok, c.maxT, 0, c.V, 9, 1);
    l3d_infer_step(inf, tok, 1);
    size_t before = l3d_mem_window_begin(), used = l3d_mem_used();
    for (int p = 1; p < c.maxT; p++) l3d_infer_step(inf, &tok[p], 1);
    CHECK(l3d_mem_peak() == used);
    l3d_mem_window_end(before);
    l3d_infer_free(inf);
    l3d_gpt_free(m);
}

/* x (T rows of NH + 2 NKV heads of HS) rotated in double: the query and key heads. */
static void ref_rope(double *y, const float *x, const float *f, const int32_t *pos, int64_t T,
                     int64_t heads, int64_t HS) {
    int64_t H2 = HS / 2;
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < heads; h++)
            for (int64_t i = 0; i < H2; i++) {
                const float *r = x + (t * (heads + 1) + h) * HS; /* one value head (NKV 1) */
                double a = (double)pos[t] * f[i], c = cos(a), s = sin(a);
                y[(t * heads + h) * HS + i] = r[i] * c - r[i + H2] * s;
                y[(t * heads + h) * HS + i + H2] = r[i + H2] * c + r[i] * s;
            }
}

/* The worst difference of the rotated x0 from the double rotation by (f, pos). */
static double rope_err(struct l3d_backend *be, float *dx, const float *x0, const float *df,
                       const float *f, const int32_t *dp, const int32_t *pos) {
    enum { T = 5, NH = 2, NKV = 1, HS = 8, CQ = (NH + 2 * NKV) * HS };
    float y[T * CQ];
    double ref[T * (NH + NKV) * HS];
    l3d_be_copy_h2d(be, dx, x0, sizeof y);
    l3d_be_rope_forward(be, L3D_F32, dx, df, dp, 1, T, NH, NKV, HS);
    l3d_be_copy_d2h(be, y, dx, sizeof y);
    ref_rope(ref, x0, f, pos, T, NH + NKV, HS);
    double worst = 0.0;
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < (NH + NKV) * HS; j++) {
            double d = fabs(y[t * CQ + j] - ref[t * (NH + NKV) * HS + j]);
            worst = d > worst || isnan(d) ? d : worst;
        }
    return worst;
}

/* The kept table follows the values behind unchanged pointers: inv_freq scaled, then positions
 * moved (the KV cache's next rows, a context-parallel chunk), each against the double rotation;
 * negative: the old values' rotation is not the new one. */
static void test_rope_table(struct l3d_backend *be) {
    enum { T = 5, HS = 8, CQ = 4 * HS };
    float x0[T * CQ], f[HS / 2], old[HS / 2];
    int32_t pos[T] = {0, 1, 2, 3, 4}, opos[T];
    ref_fill_normal(x0, T * CQ, 0.0f, 1.0f, 3, 1);
    for (int i = 0; i < HS / 2; i++) f[i] = powf(10000.0f, -2.0f * (float)i / HS);
    float *dx = l3d_be_alloc(be, sizeof x0, "x"), *df = l3d_be_alloc(be, sizeof f, "f");
    int32_t *dp = l3d_be_alloc(be, sizeof pos, "pos");
    l3d_be_copy_h2d(be, df, f, sizeof f);
    l3d_be_copy_h2d(be, dp, pos, sizeof pos);
    CHECK(rope_err(be, dx, x0, df, f, dp, pos) < 1e-5);
    memcpy(old, f, sizeof f);
    for (int i = 0; i < HS / 2; i++) f[i] *= 1.5f; /* the same pointer, new frequencies */
    l3d_be_copy_h2d(be, df, f, sizeof f);
    CHECK(rope_err(be, dx, x0, df, f, dp, pos) < 1e-5);
    CHECK(rope_err(be, dx, x0, df, old, dp, pos) > 1e-2); /* (negative) */
    memcpy(opos, pos, sizeof pos);
    for (int t = 0; t < T; t++) pos[t] += 7; /* the same pointer, new positions */
    l3d_be_copy_h2d(be, dp, pos, sizeof pos);
    CHECK(rope_err(be, dx, x0, df, f, dp, pos) < 1e-5);
    CHECK(rope_err(be, dx, x0, df, f, dp, opos) > 1e-2); /* (negative) */
    l3d_be_free(be, dx);
    l3d_be_free(be, df);
    l3d_be_free(be, dp);
}

int main(void) {
    setenv("L3D_DNNL_16BIT", "0", 1); /* 16-bit products through the fp32 ones, on any CPU */
    struct l3d_backend *be = test_backend_init();
    test_generation(be);
    test_steps(be);
    test_rope_table(be);
    l3d_backend_free(be);
    return TEST_REPORT();
}
