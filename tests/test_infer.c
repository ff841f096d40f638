/* KV-cache inference: at every position the logits equal those of the full forward over the
 * sequence so far, within fp32 tolerance, whether tokens come one at a time or in chunks. */
#include <stdlib.h>
#include <string.h>

#include "llm3d/infer.h"
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

int main(void) {
    struct l3d_model_spec cfg = {.L = 3, .C = 64, .NH = 4, .V = 300, .maxT = 40};
    CHECK(l3d_gpt_config_finish(&cfg) == L3D_OK);
    struct l3d_backend *be = test_backend_init();
    struct l3d_shard sh = l3d_shard_full(&cfg);
    const int T = cfg.maxT;
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

    /* 16 bits (generate --precision): the same weights rounded, the KV cache and activations in
     * bf16 / fp16, against the same model's full forward in that type (they round at the same
     * points; only the fp32 products' blocking differs, which can move a rounding by one unit:
     * 2^-7 of the logits' spread), and against fp32's (the rounding shows, within a few units) */
    for (int k = 0; k < 2; k++) {
        enum l3d_dtype dt = k ? L3D_F16 : L3D_BF16;
        struct l3d_gpt *h;
        CHECK(l3d_gpt_init_dt(&h, &cfg, &sh, be, 1, T, L3D_GRADS_NONE, 1, L3D_RECOMPUTE_NONE,
                              dt) == L3D_OK);
        float *p32 = l3d_be_alloc(be, (size_t)m->num_params * sizeof(float), "test");
        l3d_be_copy_d2d(be, p32, m->params, (size_t)m->num_params * sizeof(float));
        l3d_be_convert(be, dt, h->params, L3D_F32, p32, m->num_params);
        l3d_gpt_forward(h, tok, NULL, 1, T);
        float *full16 = malloc((size_t)T * cfg.Vp * sizeof(float));
        l3d_be_convert(be, L3D_F32, p32, dt, h->logits, (int64_t)T * cfg.Vp > m->num_params
                                                             ? m->num_params
                                                             : (int64_t)T * cfg.Vp);
        CHECK((int64_t)T * cfg.Vp <= m->num_params); /* the staging holds every logit */
        l3d_be_copy_d2h(be, full16, p32, (size_t)T * cfg.Vp * sizeof(float));
        struct l3d_infer *inf16;
        CHECK(l3d_infer_init(&inf16, h) == L3D_OK);
        double kv = 0.0, vs32 = 0.0;
        for (int q = 0; q < T; q++) {
            const float *lg = l3d_infer_step(inf16, &tok[q], 1);
            kv = test_max(kv, rel_diff(lg, full16 + (int64_t)q * cfg.Vp, cfg.V));
            vs32 = test_max(vs32, rel_diff(lg, full + (int64_t)q * cfg.Vp, cfg.V));
        }
        fprintf(stderr, "%s: KV cache against the full forward %.3g, against fp32 %.3g\n",
                l3d_dtype_name(dt), kv, vs32);
        CHECK(kv < 0.0078);                 /* 2^-7 */
        CHECK(vs32 > 0.0 && vs32 < 0.0625); /* 16 bits differ from fp32, by a few units */
        l3d_infer_free(inf16);
        l3d_be_free(be, p32);
        free(full16);
        l3d_gpt_free(h);
    }

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
