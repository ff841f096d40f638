/*
 * The optimizer step with the next step's gradient zeroing folded in (l3d_be_adamw_zero,
 * l3d_adamw_step_zero) against the unfused pair it replaces: the CPU backend's fused pass, the
 * check backend's oracle (adamw or adamw_mixed, then a memset: src/backend/check.c) and the CPU's
 * own unfused kernels must give the same bits for the parameters, the master weights, both
 * moments and the 16-bit copy, and leave every gradient zero; for fp32 parameters, 16-bit ones
 * with fp32 gradients and with gradients of their own type, at odd lengths (one element, a
 * partial 16-bit block, several blocks on several threads). Negative cases: the comparison
 * rejects one wrong element, the zero check rejects one nonzero gradient and the step without
 * its zeroing. Then l3d_adamw_step_zero over a tensor table with a gap and a ZeRO shard's range:
 * the same update as l3d_adamw_step and a gradient range all zero, the gap included.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "llm3d/backend.h"
#include "llm3d/optim.h"
#include "test.h"

/* A host state of n elements: master (fp32) or the fp32 parameters, m, v, the 16-bit copy, the
 * gradient (type gdt). */
struct st {
    float *p, *m, *v;
    uint16_t *w16;
    void *g;
};

static float frand(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(*s >> 11) / 9007199254740992.0) * 2.0f - 1.0f;
}

static void fill_g(enum l3d_dtype gdt, void *g, int64_t n, uint64_t *s) {
    for (int64_t i = 0; i < n; i++) {
        float x = frand(s);
        if (gdt == L3D_F32) ((float *)g)[i] = x;
        else ((uint16_t *)g)[i] = gdt == L3D_BF16 ? l3d_f32_to_bf16(x) : l3d_f32_to_f16(x);
    }
}

static struct st st_new(enum l3d_dtype gdt, int64_t n, uint64_t seed) {
    struct st a = {malloc((size_t)n * 4), malloc((size_t)n * 4), malloc((size_t)n * 4),
                   calloc((size_t)n, 2), malloc((size_t)n * l3d_dtype_size(gdt))};
    L3D_ASSERT(a.p && a.m && a.v && a.w16 && a.g);
    for (int64_t i = 0; i < n; i++) {
        a.p[i] = frand(&seed), a.m[i] = 0.1f * frand(&seed);
        a.v[i] = 0.01f * frand(&seed) * frand(&seed) + 0.01f;
    }
    fill_g(gdt, a.g, n, &seed);
    return a;
}

static void st_free(struct st *a) { free(a->p), free(a->m), free(a->v), free(a->w16), free(a->g); }

enum run_kind { FUSED, UNFUSED, NO_ZERO };

/* One step of state a (in place) on be: the fused kernel, the unfused pair, or the step alone.
 * pdt F32: the parameters are a->p (no master); else a->p is the master and w16 the copy. */
static void run(struct l3d_backend *be, enum run_kind k, enum l3d_dtype pdt, enum l3d_dtype gdt,
                struct st *a, int64_t n) {
    size_t f = (size_t)n * 4, gb = (size_t)n * l3d_dtype_size(gdt), wb = (size_t)n * 2;
    float *p = l3d_be_alloc(be, f, "t"), *m = l3d_be_alloc(be, f, "t");
    float *v = l3d_be_alloc(be, f, "t");
    void *g = l3d_be_alloc(be, gb, "t"), *w = pdt == L3D_F32 ? NULL : l3d_be_alloc(be, wb, "t");
    l3d_be_copy_h2d(be, p, a->p, f), l3d_be_copy_h2d(be, m, a->m, f);
    l3d_be_copy_h2d(be, v, a->v, f), l3d_be_copy_h2d(be, g, a->g, gb);
    if (w) l3d_be_copy_h2d(be, w, a->w16, wb);
    const float hp[7] = {0.01f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.3f, 0.2f}; /* lr b1 b2 eps wd bc */
    if (k == FUSED)
        l3d_be_adamw_zero(be, pdt, gdt, w ? w : p, w ? p : NULL, m, v, g, 0.5f, n, hp[0], hp[1],
                          hp[2], hp[3], hp[4], hp[5], hp[6]);
    else if (w)
        l3d_be_adamw_mixed(be, pdt, gdt, w, p, m, v, g, 0.5f, n, hp[0], hp[1], hp[2], hp[3],
                           hp[4], hp[5], hp[6]);
    else
        l3d_be_adamw(be, L3D_F32, p, m, v, g, 0.5f, n, hp[0], hp[1], hp[2], hp[3], hp[4], hp[5],
                     hp[6]);
    if (k == UNFUSED) l3d_be_memset(be, g, 0, gb);
    l3d_be_copy_d2h(be, a->p, p, f), l3d_be_copy_d2h(be, a->m, m, f);
    l3d_be_copy_d2h(be, a->v, v, f), l3d_be_copy_d2h(be, a->g, g, gb);
    if (w) l3d_be_copy_d2h(be, a->w16, w, wb);
    l3d_be_free(be, p), l3d_be_free(be, m), l3d_be_free(be, v), l3d_be_free(be, g);
    if (w) l3d_be_free(be, w);
}

/* The same bits in every output (NaN-aware: memcmp of the bits) */
static bool same(const struct st *a, const struct st *b, enum l3d_dtype gdt, int64_t n) {
    size_t f = (size_t)n * 4;
    return memcmp(a->p, b->p, f) == 0 && memcmp(a->m, b->m, f) == 0 &&
           memcmp(a->v, b->v, f) == 0 && memcmp(a->w16, b->w16, (size_t)n * 2) == 0 &&
           memcmp(a->g, b->g, (size_t)n * l3d_dtype_size(gdt)) == 0;
}

/* every byte of the gradient zero (+0.0 in every type) */
static bool grad_zero(const struct st *a, enum l3d_dtype gdt, int64_t n) {
    const unsigned char *b = a->g;
    for (size_t i = 0; i < (size_t)n * l3d_dtype_size(gdt); i++)
        if (b[i]) return false;
    return true;
}

static void check_kernel(struct l3d_backend *cpu, struct l3d_backend *chk, enum l3d_dtype pdt,
                         enum l3d_dtype gdt, int64_t n) {
    uint64_t seed = (uint64_t)n * 31 + (uint64_t)pdt * 7 + (uint64_t)gdt;
    struct st a = st_new(gdt, n, seed), b = st_new(gdt, n, seed), c = st_new(gdt, n, seed);
    struct st d = st_new(gdt, n, seed);
    run(cpu, FUSED, pdt, gdt, &a, n);
    run(chk, FUSED, pdt, gdt, &b, n); /* the check backend's oracle: the pair, then a memset */
    run(cpu, UNFUSED, pdt, gdt, &c, n);
    run(cpu, NO_ZERO, pdt, gdt, &d, n);
    bool ok = grad_zero(&a, gdt, n) && same(&a, &b, gdt, n) && same(&a, &c, gdt, n);
    if (!ok)
        fprintf(stderr, "FAIL adamw_zero params %s grads %s n=%lld\n", l3d_dtype_name(pdt),
                l3d_dtype_name(gdt), (long long)n);
    CHECK(ok);
    CHECK(!grad_zero(&d, gdt, n)); /* the step alone leaves its gradient */
    memcpy(d.g, a.g, (size_t)n * l3d_dtype_size(gdt));
    CHECK(same(&a, &d, gdt, n)); /* and is otherwise the same step */
    /* negative cases: one wrong element of the update, one gradient left nonzero */
    b.v[n / 2] = nextafterf(b.v[n / 2], 1.0f);
    CHECK(!same(&a, &b, gdt, n));
    ((unsigned char *)c.g)[(size_t)(n - 1) * l3d_dtype_size(gdt)] = 1;
    CHECK(!grad_zero(&c, gdt, n));
    CHECK(!same(&a, &c, gdt, n));
    st_free(&a), st_free(&b), st_free(&c), st_free(&d);
}

enum { NP = 29 };

/* l3d_adamw_step_zero on ZeRO's range [4, 25) of parameters whose tensors leave a gap: [0, 15)
 * and [18, 27); the same update as l3d_adamw_step and every gradient of the range zero. */
static void check_step(struct l3d_backend *be, enum l3d_dtype pdt) {
    const struct l3d_adamw_hparams hp = {.beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                                         .weight_decay = 0.1f, .grad_clip = 1.0f};
    struct l3d_tensor_info t[2] = {{.name = "w", .offset = 0, .count = 15, .dtype = pdt,
                                    .decay = true},
                                   {.name = "b", .offset = 18, .count = 9, .dtype = pdt}};
    const int start = 4, n = 21;
    size_t es = l3d_dtype_size(pdt);
    unsigned char host[2][NP * 4];
    float g[2][NP];
    for (int k = 0; k < 2; k++) { /* k 0: l3d_adamw_step, 1: l3d_adamw_step_zero */
        struct l3d_adamw opt;
        CHECK(l3d_adamw_init_dt(&opt, be, &hp, start, n, pdt) == L3D_OK);
        uint64_t s = 5;
        float p0[NP];
        for (int i = 0; i < NP; i++) p0[i] = frand(&s);
        void *params = l3d_be_alloc(be, NP * 4, "test parameters");
        float *grads = l3d_be_alloc(be, (size_t)n * 4, "test gradients");
        l3d_be_copy_h2d(be, params, p0, NP * 4); /* 16-bit: bits that the step overwrites */
        if (opt.master) l3d_be_copy_h2d(be, opt.master, p0 + start, (size_t)n * 4);
        for (int step = 0; step < 2; step++) {
            for (int i = 0; i < n; i++) g[k][i] = frand(&s);
            l3d_be_copy_h2d(be, grads, g[k], (size_t)n * 4);
            if (k == 0) l3d_adamw_step(&opt, be, params, grads, 0.7f, t, 2, 1e-2f);
            else l3d_adamw_step_zero(&opt, be, params, false, grads, 0.7f, t, 2, 1e-2f);
        }
        l3d_be_copy_d2h(be, host[k], params, NP * es);
        l3d_be_copy_d2h(be, g[k], grads, (size_t)n * 4);
        l3d_be_free(be, params), l3d_be_free(be, grads);
        l3d_adamw_free(&opt);
    }
    CHECK(memcmp(host[0], host[1], NP * es) == 0);
    bool zero = true, kept = false;
    for (int i = 0; i < n; i++) zero = zero && g[1][i] == 0.0f, kept = kept || g[0][i] != 0.0f;
    CHECK(zero);
    CHECK(kept); /* negative case: the unfused step leaves its gradients */
}

int main(void) {
    struct l3d_backend *cpu, *chk;
    if (l3d_backend_init("cpu", &cpu) != L3D_OK || l3d_backend_init("check", &chk) != L3D_OK) {
        fprintf(stderr, "%s\n", l3d_error_message());
        return 1;
    }
    const int64_t ns[] = {1, 7, 513, 100003};
    const enum l3d_dtype p16[2] = {L3D_BF16, L3D_F16};
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
        check_kernel(cpu, chk, L3D_F32, L3D_F32, ns[i]);
        for (int t = 0; t < 2; t++) {
            check_kernel(cpu, chk, p16[t], L3D_F32, ns[i]);
            check_kernel(cpu, chk, p16[t], p16[t], ns[i]);
        }
    }
    check_step(cpu, L3D_F32);
    check_step(chk, L3D_F32);
    check_step(cpu, L3D_BF16);
    check_step(chk, L3D_F16);
    l3d_backend_free(chk);
    l3d_backend_free(cpu);
    return TEST_REPORT();
}
