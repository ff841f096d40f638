/* KV-cache inference: at every position the logits equal those of the full forward over the
 * sequence so far, within fp32 tolerance, whether tokens come one at a time or in chunks; for
 * dense models and mixtures of experts (check_moe). */
#include <stdlib.h>
#include <string.h>

#include "llm3d/infer.h"
#include "llm3d/core.h"
#include "model/moe.h"
#include "test.h"

/* Largest |a - b| over the V real logits, relative to the largest |b|; infinite on a NaN or Inf. */
static double rel_diff(const float *a, const float *b, int V) { return test_rel_diff(a, b, V); }

/* The fp32 model of cfg with weights of order 1: the cache's logits against the full forward's,
 * one token at a time, in chunks, and after another prefix. Returns the model and its full
 * forward's logits (maxT, Vp). */
static struct l3d_gpt *check_fp32(struct l3d_backend *be, struct l3d_model_spec cfg, int32_t *tok,
                                  float **full_out) {
    struct l3d_shard sh = l3d_shard_full(&cfg);
    const int T = cfg.maxT;
    struct l3d_gpt *m;
    CHECK(l3d_gpt_init(&m, &cfg, &sh, be, 1, T, L3D_GRADS_NONE) == L3D_OK);
    /* weights of order 1 (larger than GPT-2's initialisation) so that the logits spread widely */
    float *w = malloc((size_t)m->num_params * sizeof(float));
    for (int64_t i = 0; i < m->num_params; i++) w[i] = 0.3f * l3d_rng_normal(5, 0, (uint64_t)i);
    l3d_be_copy_h2d(be, m->params, w, (size_t)m->num_params * sizeof(float)); /* device memory */
    free(w);
    for (int t = 0; t < T; t++) tok[t] = (int32_t)(l3d_rng_u64(9, 0, (uint64_t)t) % (uint64_t)cfg.V);
    l3d_gpt_forward(m, tok, NULL, 1, T);
    float *full = malloc((size_t)T * cfg.Vp * sizeof(float));
    l3d_be_copy_d2h(be, full, m->logits, (size_t)T * cfg.Vp * sizeof(float));
    double spread = 0.0;
    for (int i = 0; i < cfg.V; i++) spread = fabs(full[i]) > spread ? fabs(full[i]) : spread;
    CHECK(spread > 1.0); /* not a near-constant output */

    struct l3d_infer *inf;
    CHECK(l3d_infer_init(&inf, m) == L3D_OK);
    double worst = 0.0;
    for (int p = 0; p < T; p++) { /* one token at a time */
        const float *lg = l3d_infer_step(inf, &tok[p], 1);
        double d = rel_diff(lg, full + (int64_t)p * cfg.Vp, cfg.V);
        worst = test_max(worst, d);
    }
    CHECK(l3d_infer_pos(inf) == T);
    fprintf(stderr, "one at a time: worst relative logit difference %.3g\n", worst);
    CHECK(worst < 1e-5);
    /* chunks: a prompt of 7, then 1, 5, 1, ... */
    l3d_infer_reset(inf);
    CHECK(l3d_infer_pos(inf) == 0);
    worst = 0.0;
    for (int p = 0, k = 0; p < T; k++) {
        int n = k == 0 ? 7 : (k % 2 ? 1 : 5);
        if (p + n > T) n = T - p;
        const float *lg = l3d_infer_step(inf, &tok[p], n);
        p += n;
        double d = rel_diff(lg, full + (int64_t)(p - 1) * cfg.Vp, cfg.V);
        worst = test_max(worst, d);
    }
    fprintf(stderr, "in chunks: worst relative logit difference %.3g\n", worst);
    CHECK(worst < 1e-5);
    /* a different prefix gives different logits: the cache is really read */
    l3d_infer_reset(inf);
    int32_t other[2] = {(tok[0] + 1) % cfg.V, tok[1]};
    l3d_infer_step(inf, other, 1);
    CHECK(rel_diff(l3d_infer_step(inf, &other[1], 1), full + cfg.Vp, cfg.V) > 1e-3);
    l3d_infer_free(inf);
    *full_out = full;
    return m;
}

/* 16 bits (generate --precision): m's weights rounded to dt, the KV cache and activations in dt,
 * against the same model's full forward in that type (they round at the same points; only the
 * fp32 products' blocking differs, which can move a rounding by one unit: 2^-7 of the logits'
 * spread; kv_units of them), and against fp32's, full (the rounding shows: within vs32_max). */
static void check_16bit(struct l3d_backend *be, const struct l3d_gpt *m, const int32_t *tok,
                        const float *full, enum l3d_dtype dt, int kv_units, double vs32_max) {
    struct l3d_model_spec cfg = m->cfg;
    struct l3d_shard sh = l3d_shard_full(&cfg);
    const int T = cfg.maxT;
    struct l3d_gpt *h;
    CHECK(l3d_gpt_init_dt(&h, &cfg, &sh, be, 1, T, L3D_GRADS_NONE, 1, L3D_RECOMPUTE_NONE, dt) ==
          L3D_OK);
    float *p32 = l3d_be_alloc(be, (size_t)m->num_params * sizeof(float), "test");
    l3d_be_copy_d2d(be, p32, m->params, (size_t)m->num_params * sizeof(float));
    l3d_be_convert(be, dt, h->params, L3D_F32, p32, m->num_params);
    l3d_gpt_forward(h, tok, NULL, 1, T);
    float *full16 = malloc((size_t)T * cfg.Vp * sizeof(float));
    CHECK((int64_t)T * cfg.Vp <= m->num_params); /* the staging holds every logit */
    l3d_be_convert(be, L3D_F32, p32, dt, h->logits, (int64_t)T * cfg.Vp);
    l3d_be_copy_d2h(be, full16, p32, (size_t)T * cfg.Vp * sizeof(float));
    struct l3d_infer *inf16;
    CHECK(l3d_infer_init(&inf16, h) == L3D_OK);
    double kv = 0.0, vs32 = 0.0;
    size_t before = 0, used = 0;
    for (int q = 0; q < T; q++) {
        if (q == 1) /* the steps after the first allocate nothing (the cache grows in each) */
            before = l3d_mem_window_begin(), used = l3d_mem_used();
        const float *lg = l3d_infer_step(inf16, &tok[q], 1);
        kv = test_max(kv, rel_diff(lg, full16 + (int64_t)q * cfg.Vp, cfg.V));
        vs32 = test_max(vs32, rel_diff(lg, full + (int64_t)q * cfg.Vp, cfg.V));
    }
    CHECK(l3d_mem_peak() == used);
    l3d_mem_window_end(before);
    fprintf(stderr, "%s: KV cache against the full forward %.3g, against fp32 %.3g\n",
            l3d_dtype_name(dt), kv, vs32);
    CHECK(kv < kv_units * 0.0078125); /* 2^-7 a unit */
    CHECK(vs32 > 0.0 && vs32 < vs32_max); /* 16 bits differ from fp32 */
    l3d_infer_free(inf16);
    l3d_be_free(be, p32);
    free(full16);
    l3d_gpt_free(h);
}

/* The cache's logits, one token at a time from position 0, against the full forward's (T, Vp):
 * the worst relative difference. */
static double kv_worst(struct l3d_infer *inf, const int32_t *tok, const float *full,
                       const struct l3d_model_spec *cfg) {
    l3d_infer_reset(inf);
    double worst = 0.0;
    for (int p = 0; p < cfg->maxT; p++)
        worst = test_max(worst, rel_diff(l3d_infer_step(inf, &tok[p], 1),
                                         full + (int64_t)p * cfg->Vp, cfg->V));
    return worst;
}

/* Adds `by` to n fp32 parameters of m at p (device), or exchanges them with those at q. */
static void nudge(struct l3d_gpt *m, float *p, float *q, int64_t n, float by) {
    size_t bytes = (size_t)n * sizeof(float);
    float *a = malloc(bytes), *b = malloc(bytes);
    l3d_be_copy_d2h(m->be, a, p, bytes);
    if (q) {
        l3d_be_copy_d2h(m->be, b, q, bytes);
        l3d_be_copy_h2d(m->be, q, a, bytes);
        l3d_be_copy_h2d(m->be, p, b, bytes);
    } else {
        for (int64_t i = 0; i < n; i++) a[i] += by;
        l3d_be_copy_h2d(m->be, p, a, bytes);
    }
    l3d_be_sync(m->be);
    free(a);
    free(b);
}

/* Generation's MoE block (src/model/moe.h) of m's layer 1 over a prompt of maxT rows, then
 * single rows: it allocates nothing, not even for a moment, host or device (the backend's arena
 * counts in l3d_mem); negative case: the window sees an allocation made inside it. */
static void check_block_allocs(const struct l3d_gpt *m) {
    const int64_t T = m->cfg.maxT, C = m->cfg.C;
    struct l3d_moe_infer *w;
    CHECK(l3d_moe_infer_init(&w, m, T) == L3D_OK && w);
    float *ln = l3d_be_alloc(m->be, (size_t)(T * C) * sizeof(float), "test");
    float *out = l3d_be_alloc(m->be, (size_t)(T * C) * sizeof(float), "test");
    float *h = malloc((size_t)(T * C) * sizeof(float));
    for (int64_t i = 0; i < T * C; i++) h[i] = l3d_rng_normal(7, 0, (uint64_t)i);
    l3d_be_copy_h2d(m->be, ln, h, (size_t)(T * C) * sizeof(float));
    l3d_moe_infer_forward(w, m, 1, out, ln, T, 0); /* the backend's first products set up */
    size_t before = l3d_mem_window_begin(), used = l3d_mem_used();
    l3d_moe_infer_forward(w, m, 1, out, ln, T, 0);
    for (int64_t i = 0; i < 8; i++) l3d_moe_infer_forward(w, m, 1, out, ln + i * C, 1, i);
    CHECK(l3d_mem_peak() == used);
    l3d_free(l3d_alloc(64, "test")); /* (negative: the window sees it) */
    CHECK(l3d_mem_peak() > used);
    l3d_mem_window_end(before);
    free(h);
    l3d_be_free(m->be, ln);
    l3d_be_free(m->be, out);
    l3d_moe_infer_free(w);
}

/* Mixture of experts (issue 46): top-2 of 4 experts, a shared expert, a dense first layer, the
 * top-k weights renormalised or not, Llama's SwiGLU experts and GPT-2's GELU ones with biases.
 * The cache's logits equal the full forward's (check_fp32), and in bf16; a step allocates
 * nothing; negative cases: the router's weights nudged, two experts exchanged, and the cache's
 * logits no longer match. */
static void check_moe(struct l3d_backend *be, int32_t *tok) {
    for (int v = 0; v < 3; v++) {
        struct l3d_model_spec mc = {.L = 3, .C = 64, .NH = 4, .NKV = v < 2 ? 2 : 0, .V = 300,
                                    .maxT = 40, .ffn = 96};
        l3d_model_set_arch(&mc, v < 2 ? L3D_ARCH_LLAMA : L3D_ARCH_GPT2);
        mc.moe = (struct l3d_moe_spec){.experts = 4, .top_k = 2, .ffn = 48, .shared = 1,
                                       .dense_layers = 1, .norm_topk = v != 1};
        CHECK(l3d_gpt_config_finish(&mc) == L3D_OK);
        fprintf(stderr, "MoE %s, top-2 of 4, %s:\n", v < 2 ? "llama" : "gpt2",
                mc.moe.norm_topk ? "renormalised" : "not renormalised");
        float *full;
        struct l3d_gpt *m = check_fp32(be, mc, tok, &full);
        /* two roundings in series (an expert's products, then the weighted sum) may each move
         * by a unit; against fp32, a unit in a router's input may exchange a near-tied expert */
        if (v == 0) check_16bit(be, m, tok, full, L3D_BF16, 2, 0.25);
        check_block_allocs(m);
        struct l3d_infer *inf;
        CHECK(l3d_infer_init(&inf, m) == L3D_OK);
        { /* the whole step, Llama's RoPE included (the CPU backend keeps its table's memory) */
            l3d_infer_step(inf, tok, 7);
            size_t before = l3d_mem_window_begin(), used = l3d_mem_used();
            for (int p = 7; p < mc.maxT; p++) l3d_infer_step(inf, &tok[p], 1);
            CHECK(l3d_mem_peak() == used); /* the steps allocate nothing, not even for a moment */
            l3d_mem_window_end(before);
        }
        CHECK(kv_worst(inf, tok, full, &mc) < 1e-5);
        /* the last layer's router: expert 0's row raised, which moves tokens to it */
        float *router = l3d_gpt_param_ptr(m, L3D_T_ROUTER, 2);
        nudge(m, router, NULL, mc.C, 0.5f);
        double d = kv_worst(inf, tok, full, &mc);
        fprintf(stderr, "  router nudged: %.3g\n", d);
        CHECK(d > 1e-3);
        nudge(m, router, NULL, mc.C, -0.5f);
        CHECK(kv_worst(inf, tok, full, &mc) < 1e-5);
        /* layer 1's experts 0 and 3 exchanged (their first products) */
        int64_t efm = (mc.mlp == L3D_MLP_SWIGLU ? 2 : 1) * mc.moe.ffn * mc.C;
        float *fcw = l3d_gpt_param_ptr(m, L3D_T_EXPFCW, 1);
        nudge(m, fcw, fcw + 3 * efm, efm, 0.0f);
        d = kv_worst(inf, tok, full, &mc);
        fprintf(stderr, "  experts 0 and 3 exchanged: %.3g\n", d);
        CHECK(d > 1e-3);
        l3d_infer_free(inf);
        free(full);
        l3d_gpt_free(m);
        /* half the experts (an --ep 2 rank's shard) is refused with a clear error */
        struct l3d_shard half = l3d_shard_full(&mc);
        l3d_shard_set_experts(&mc, &half, 2, 1);
        CHECK(l3d_gpt_init(&m, &mc, &half, be, 1, 2, L3D_GRADS_NONE) == L3D_OK);
        CHECK(l3d_infer_init(&inf, m) == L3D_ERR_LAYOUT && !inf);
        CHECK(strstr(l3d_error_message(), "every expert") != NULL);
        l3d_gpt_free(m);
    }
}

int main(void) {
    /* the KV cache's kernel against the full forward's with bf16 attention through oneDNN's
     * matmuls where it has them (L3D_ATTN_DNNL=1: the cache then rounds P as that path does;
     * elsewhere both run the flash kernels) */
    setenv("L3D_ATTN_DNNL", "1", 1);
    struct l3d_model_spec cfg = {.L = 3, .C = 64, .NH = 4, .V = 300, .maxT = 40};
    CHECK(l3d_gpt_config_finish(&cfg) == L3D_OK);
    struct l3d_backend *be = test_backend_init();
    struct l3d_shard sh = l3d_shard_full(&cfg);
    int32_t tok[40];
    float *full;
    /* Llama: RoPE at each position (a chunk's rows at pos..), 4 query heads over 2 cached
     * key/value heads, SwiGLU, RMSNorm, untied head */
    struct l3d_model_spec lc = {.L = 3, .C = 64, .NH = 4, .NKV = 2, .V = 300, .maxT = 40,
                                .ffn = 96};
    l3d_model_set_arch(&lc, L3D_ARCH_LLAMA);
    CHECK(l3d_gpt_config_finish(&lc) == L3D_OK);
    l3d_gpt_free(check_fp32(be, lc, tok, &full));
    free(full);
    lc.qk_norm = true; /* Qwen3's QK-norm: each new row's heads normalised before the cache */
    l3d_gpt_free(check_fp32(be, lc, tok, &full));
    free(full);
    /* heads of 24 over 64 channels (Qwen3's head_dim apart from C / NH): q|k|v rows of
     * (4 + 2 x 2) x 24, the cache 2 x 24 a key/value head, the projection's 96 columns; and
     * GPT-2's blocks (learned positions, biases) with heads of 10 */
    lc.head_dim = 24;
    CHECK(l3d_gpt_config_finish(&lc) == L3D_OK && l3d_model_head_dim(&lc) == 24);
    l3d_gpt_free(check_fp32(be, lc, tok, &full));
    free(full);
    struct l3d_model_spec gh = cfg;
    gh.head_dim = 10;
    CHECK(l3d_gpt_config_finish(&gh) == L3D_OK);
    l3d_gpt_free(check_fp32(be, gh, tok, &full));
    free(full);
    struct l3d_gpt *m = check_fp32(be, cfg, tok, &full);
    struct l3d_infer *inf;

    /* 16 bits (generate --precision) */
    check_16bit(be, m, tok, full, L3D_BF16, 1, 0.0625); /* against fp32: a few units */
    check_16bit(be, m, tok, full, L3D_F16, 1, 0.0625);
    check_moe(be, tok);

    /* a sharded model is refused with a clear error */
    struct l3d_shard half = sh;
    half.layer_count = 1;
    half.has_head = false;
    struct l3d_gpt *m2;
    CHECK(l3d_gpt_init(&m2, &cfg, &half, be, 1, 2, L3D_GRADS_NONE) == L3D_OK);
    CHECK(l3d_infer_init(&inf, m2) == L3D_ERR_LAYOUT);
    CHECK(strstr(l3d_error_message(), "whole model") != NULL);
    l3d_gpt_free(m2);
    free(full);
    l3d_gpt_free(m);
    l3d_backend_free(be);
    return TEST_REPORT();
}
