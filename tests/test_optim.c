/*
 * The optimizer against its definitions, not against the kernels it calls: l3d_clip_factor is
 * global-norm clipping (Pascanu et al. 2013) at exactly the threshold, and l3d_adamw_step is
 * AdamW (Loshchilov & Hutter 2019, Algorithm 2) written out here in double: bias corrections
 * 1 - beta1^t and 1 - beta2^t from t = 1, weight decay on the decayed tensors only, the clipping
 * factor applied to the gradients, the range [start, start + n) of a ZeRO shard. In fp32 and with
 * fp32 master weights and a 16-bit copy (the copy is the masters' rounding). test_kernels checks
 * the kernel for given bc1, bc2; these checks fail when the step computes them wrong.
 */
#include <string.h>

#include "llm3d/backend.h"
#include "llm3d/optim.h"
#include "test.h"

/* Clipping: clip / norm above the threshold (the 1e-6 the code adds to the norm moves 2/3 by
 * 4e-7), 1 at or below it and when disabled; a NaN norm is not above the threshold, so 1 (the
 * trainer skips such a step before using it: src/train/step.c). */
static void test_clip(void) {
    CHECK_NEAR(l3d_clip_factor(1.5, 1.0f), 2.0 / 3.0, 1e-6);
    CHECK_NEAR(l3d_clip_factor(4.0, 0.5f), 0.125, 1e-6);
    CHECK_NEAR(l3d_clip_factor(2.5, 2.0f), 0.8, 1e-6);
    CHECK(l3d_clip_factor(0.9, 1.0f) == 1.0f);
    CHECK(l3d_clip_factor(1.0, 1.0f) == 1.0f);
    CHECK(l3d_clip_factor(0.0, 1.0f) == 1.0f);
    CHECK(l3d_clip_factor(1e6, 0.0f) == 1.0f); /* --grad-clip 0: disabled */
    CHECK(l3d_clip_factor(NAN, 1.0f) == 1.0f);
    CHECK(l3d_clip_factor(INFINITY, 1.0f) == 0.0f); /* above any threshold: clip / inf */
}

enum { NP = 23 };

/* The parameters [0, NP) as two tensors: a decayed matrix [0, 15) and an undecayed bias [15, 23). */
static void tensors(struct l3d_tensor_info t[2], enum l3d_dtype dt) {
    t[0] = (struct l3d_tensor_info){.name = "w", .offset = 0, .count = 15, .dtype = dt,
                                    .layers = 1, .rows = 3, .cols = 5, .decay = true};
    t[1] = (struct l3d_tensor_info){.name = "b", .offset = 15, .count = 8, .dtype = dt,
                                    .layers = 1, .rows = 1, .cols = 8, .decay = false};
    for (int k = 0; k < 2; k++) t[k].bytes = (size_t)t[k].count * l3d_dtype_size(dt);
}

static double p0_of(int i) { return 0.5 * sin(1.0 + i) + (i % 3 == 0 ? 1.0 : -0.25); }
/* step s (1-based) of parameter i: of either sign and of sizes 1e-3 to 1 */
static double g_of(int s, int i) { return cos(0.7 * i + 1.3 * s) * pow(10.0, -(i + s) % 4); }

/* AdamW in double, steps 1..steps from t = 1, on the parameters [start, start + n) only. */
static void reference(const struct l3d_adamw_hparams *hp, const float lr[], const float scale[],
                      int steps, int start, int n, double p[NP]) {
    double m[NP] = {0}, v[NP] = {0};
    for (int i = 0; i < NP; i++) p[i] = p0_of(i);
    for (int s = 1; s <= steps; s++) {
        double bc1 = 1.0 - pow(hp->beta1, s), bc2 = 1.0 - pow(hp->beta2, s);
        for (int i = start; i < start + n; i++) {
            double g = g_of(s, i) * scale[s - 1], wd = i < 15 ? hp->weight_decay : 0.0;
            m[i] = hp->beta1 * m[i] + (1.0 - hp->beta1) * g;
            v[i] = hp->beta2 * v[i] + (1.0 - hp->beta2) * g * g;
            double mhat = m[i] / bc1, vhat = v[i] / bc2;
            p[i] -= lr[s - 1] * (mhat / (sqrt(vhat) + hp->eps) + wd * p[i]);
        }
    }
}

static float to_f32(enum l3d_dtype dt, const void *buf, int i) {
    const uint16_t *h = buf;
    return dt == L3D_F32 ? ((const float *)buf)[i]
           : dt == L3D_BF16 ? l3d_bf16_to_f32(h[i])
                            : l3d_f16_to_f32(h[i]);
}

/*
 * Three steps of l3d_adamw_step on parameters of type pdt (16-bit: fp32 masters), for the shard
 * [start, start + n), against the reference. The fp32 parameters (or masters) must be within
 * 2e-6 of it (a few fp32 roundings of values near 1; a step is lr = 1e-2 in size, and beta1 in
 * place of beta2 in the bias correction moves the first by 0.7 lr); parameters outside the shard
 * unchanged; a 16-bit copy the rounding of its master.
 */
static void check_steps(struct l3d_backend *be, enum l3d_dtype pdt, int start, int n) {
    const struct l3d_adamw_hparams hp = {.beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                                         .weight_decay = 0.1f, .grad_clip = 1.0f};
    const float lr[3] = {1e-2f, 2e-2f, 5e-3f}, scale[3] = {1.0f, 0.5f, 0.8f};
    struct l3d_tensor_info t[2];
    tensors(t, pdt);
    size_t es = l3d_dtype_size(pdt);
    struct l3d_adamw opt;
    CHECK(l3d_adamw_init_dt(&opt, be, &hp, start, n, pdt) == L3D_OK);
    /* the host parameters: fp32, then in pdt (the 16-bit copy rounds them) */
    float p0[NP];
    unsigned char host[NP * sizeof(float)];
    for (int i = 0; i < NP; i++) {
        p0[i] = (float)p0_of(i);
        if (pdt == L3D_F32) memcpy(host + i * es, &p0[i], es);
        else {
            uint16_t h = pdt == L3D_BF16 ? l3d_f32_to_bf16(p0[i]) : l3d_f32_to_f16(p0[i]);
            memcpy(host + i * es, &h, es);
        }
    }
    void *params = l3d_be_alloc(be, NP * es, "test parameters");
    float *grads = l3d_be_alloc(be, (size_t)n * sizeof(float), "test gradients");
    L3D_ASSERT(params && grads);
    l3d_be_copy_h2d(be, params, host, NP * es);
    if (opt.master) l3d_be_copy_h2d(be, opt.master, p0 + start, (size_t)n * sizeof(float));
    for (int s = 1; s <= 3; s++) {
        float g[NP];
        for (int i = 0; i < n; i++) g[i] = (float)g_of(s, start + i);
        l3d_be_copy_h2d(be, grads, g, (size_t)n * sizeof(float));
        l3d_adamw_step(&opt, be, params, grads, scale[s - 1], t, 2, lr[s - 1]);
    }
    CHECK(opt.t == 3);
    double want[NP];
    reference(&hp, lr, scale, 3, start, n, want);
    unsigned char before[NP * sizeof(float)];
    memcpy(before, host, NP * es);
    l3d_be_copy_d2h(be, host, params, NP * es);
    float *master = opt.master ? test_to_host(be, opt.master, n) : NULL;
    int bad = 0;
    for (int i = 0; i < NP; i++) {
        if (i < start || i >= start + n) { /* outside the shard: untouched */
            CHECK(memcmp(host + i * es, before + i * es, es) == 0);
            continue;
        }
        float got = master ? master[i - start] : to_f32(pdt, host, i);
        if (!(fabs(got - want[i]) <= 2e-6) && bad++ < 4)
            fprintf(stderr, "  %s shard [%d, %d) parameter %d: %.9g, closed form %.9g\n",
                    l3d_dtype_name(pdt), start, start + n, i, got, want[i]);
        if (master) { /* the 16-bit copy: the master rounded */
            uint16_t r = pdt == L3D_BF16 ? l3d_f32_to_bf16(got) : l3d_f32_to_f16(got);
            CHECK(memcmp(host + i * es, &r, es) == 0);
        }
    }
    CHECK(bad == 0);
    free(master);
    l3d_be_free(be, params);
    l3d_be_free(be, grads);
    l3d_adamw_free(&opt);
}

int main(void) {
    struct l3d_backend *be = test_backend_init();
    test_clip();
    check_steps(be, L3D_F32, 0, NP);
    check_steps(be, L3D_F32, 4, 13); /* a shard across both tensors */
    check_steps(be, L3D_BF16, 0, NP);
    check_steps(be, L3D_BF16, 9, 14);
    check_steps(be, L3D_F16, 0, NP);
    l3d_backend_free(be);
    return TEST_REPORT();
}
