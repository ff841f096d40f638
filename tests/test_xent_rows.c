/*
 * The CPU backend's cross-entropy rows (src/backend/cpu_xent.c) on every SIMD path the CPU has
 * (scalar, AVX2, AVX-512), in fp32, bf16 and fp16, at row lengths around the vector widths (1, 7,
 * 15, 16, 17, 31, 32, 33, ...: every tail), with padded columns (Vvalid < Vl), the target at the
 * first, the last valid column, in the padding and outside the slice:
 *   - against a float64 oracle: the max exact, the sum of exponentials within the fp32 summation
 *     bound, each dlogit within one rounding of its type, the padding +0, nothing past the row
 *     written;
 *   - every path the same bits as the scalar one (NaN-aware);
 *   - rows with -inf entries, huge logits (the type's largest), a NaN (max skips it, the sum is
 *     NaN on every path) and an all -inf row;
 *   - through the backend, bf16 statistics and gradient bit-identical with 1 and 2 threads.
 * Negative: the oracle check rejects results of a row with one logit raised by 0.5 and a gradient
 * whose target term was dropped; the bit comparison rejects a sum one unit in the last place off;
 * the thread comparison rejects a perturbed row.
 */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu_attn16.h"
#include "backend/cpu_xent.h"
#include "llm3d/backend.h"
#include "llm3d/core.h"
#include "test.h"

typedef long long ll;
enum { GUARD = 4 }; /* elements past Vl that must stay untouched */

/* element i of a row of type t, widened; or written, rounded once to nearest even */
static float widen(enum l3d_dtype t, const void *p, int64_t i) { return l3d_cpu_ld(t, p, i); }
static void narrow(enum l3d_dtype t, void *p, int64_t i, float v) { l3d_cpu_st(t, p, i, v); }
static bool same_float(float a, float b) { return (isnan(a) && isnan(b)) || !memcmp(&a, &b, 4); }

/* one row's results: max, sumexp, and the gradient row (Vl + GUARD elements of type t) */
struct res {
    float mx, se;
    void *g;
};

static void run(enum l3d_simd isa, enum l3d_dtype t, const void *row, int64_t n, int64_t Vl,
                int64_t tgt, float dloss, struct res *r) {
    size_t es = l3d_dtype_size(t);
    memcpy(r->g, row, (size_t)(Vl + GUARD) * es);
    r->mx = l3d_cpu_xent_max(isa, t, row, n);
    r->se = l3d_cpu_xent_sumexp(isa, t, row, n, r->mx, NULL);
    l3d_cpu_xent_grad(isa, t, r->g, n, Vl, r->mx, dloss / r->se, tgt, dloss);
}

/* Whether r is the float64 oracle's result for row (n valid of Vl) within the bounds in the file
 * comment; prints the first miss when loud. */
static bool oracle_ok(enum l3d_dtype t, const void *row, int64_t n, int64_t Vl, int64_t tgt,
                      float dloss, const struct res *r, bool loud) {
    double mx = -INFINITY, se = 0.0;
    for (int64_t j = 0; j < n; j++) mx = fmax(mx, widen(t, row, j)); /* fmax skips a NaN */
    for (int64_t j = 0; j < n; j++) se += exp((double)widen(t, row, j) - mx);
    const double u = t == L3D_BF16 ? 0x1p-8 : t == L3D_F16 ? 0x1p-11 : 0.0;
    const double tiny = t == L3D_F16 ? 0x1p-25 : 1e-37; /* fp16's subnormals; exp's clamp at -87 */
    const double rel_se = 1e-6 + (double)n / L3D_XENT_LANES * 0x1p-23;
    bool ok = r->mx == (float)mx && fabs(r->se - se) <= rel_se * se;
    if (!ok && loud) fprintf(stderr, "  max %.9g (want %.9g), sumexp %.9g (want %.9g)\n", r->mx,
                             mx, r->se, se);
    for (int64_t j = 0; ok && j < Vl + GUARD; j++) {
        double g = widen(t, r->g, j), want = 0.0, tol = 0.0;
        if (j < n) {
            want = exp((double)widen(t, row, j) - mx) / se * dloss - (j == tgt ? dloss : 0.0);
            tol = (rel_se + 2e-6) * (fabs(want) + (j == tgt ? dloss : 0.0)) + u * fabs(want) + tiny;
        }
        if (j >= Vl) want = widen(t, row, j); /* the guard: untouched */
        ok = j >= n && j < Vl ? !memcmp((const char *)r->g + j * l3d_dtype_size(t),
                                        (const char[4]){0}, l3d_dtype_size(t))
                              : fabs(g - want) <= tol;
        if (!ok && loud) fprintf(stderr, "  dlogit %lld: %.9g, want %.9g (tol %.3g)\n", (ll)j, g,
                                 want, tol);
    }
    return ok;
}

/* whether two results are the same bits (NaN-aware) */
static bool same_res(enum l3d_dtype t, const struct res *a, const struct res *b, int64_t m) {
    bool ok = same_float(a->mx, b->mx) && same_float(a->se, b->se);
    for (int64_t j = 0; ok && j < m; j++) ok = same_float(widen(t, a->g, j), widen(t, b->g, j));
    return ok;
}

static void *alloc_row(enum l3d_dtype t, int64_t Vl) {
    return calloc((size_t)(Vl + GUARD), l3d_dtype_size(t));
}

/* row: every path against the oracle (want_oracle: whether it must pass) and against scalar */
static void check_paths(enum l3d_dtype t, const void *row, int64_t n, int64_t Vl, int64_t tgt,
                        bool want_oracle, const char *what) {
    const float dloss = 0.37f;
    struct res r0 = {.g = alloc_row(t, Vl)}, r = {.g = alloc_row(t, Vl)};
    run(L3D_SIMD_SCALAR, t, row, n, Vl, tgt, dloss, &r0);
    for (int isa = 0; isa <= (int)l3d_cpu_simd(); isa++) {
        run((enum l3d_simd)isa, t, row, n, Vl, tgt, dloss, &r);
        bool ok = oracle_ok(t, row, n, Vl, tgt, dloss, &r, false);
        bool same = same_res(t, &r, &r0, Vl + GUARD);
        if (ok != want_oracle || !same) {
            fprintf(stderr, "xent rows %s %s n=%lld Vl=%lld tgt=%lld path %d: oracle %s, %s\n",
                    what, l3d_dtype_name(t), (ll)n, (ll)Vl, (ll)tgt, isa, ok ? "passes" : "fails",
                    same ? "scalar's bits" : "bits differ from scalar");
            oracle_ok(t, row, n, Vl, tgt, dloss, &r, true);
        }
        CHECK(ok == want_oracle);
        CHECK(same);
    }
    if (want_oracle) { /* negative: the gradient without its target term */
        r.se = r0.se, r.mx = r0.mx;
        memcpy(r.g, row, (size_t)(Vl + GUARD) * l3d_dtype_size(t));
        l3d_cpu_xent_grad(l3d_cpu_simd(), t, r.g, n, Vl, r0.mx, dloss / r0.se, -1, dloss);
        if (tgt >= 0 && tgt < n) CHECK(!oracle_ok(t, row, n, Vl, tgt, dloss, &r, false));
        memcpy(r.g, r0.g, (size_t)(Vl + GUARD) * l3d_dtype_size(t));
        r.se = nextafterf(r0.se, INFINITY); /* negative: one unit in the last place */
        CHECK(!same_res(t, &r, &r0, Vl + GUARD));
    }
    free(r0.g), free(r.g);
}

/* a row of Vl + GUARD logits of type t, normal(0, 3), each rounded once */
static void *normal_row(enum l3d_dtype t, int64_t Vl, uint64_t seed) {
    void *row = alloc_row(t, Vl);
    for (int64_t j = 0; j < Vl + GUARD; j++)
        narrow(t, row, j, 3.0f * l3d_rng_normal(seed, 2, (uint64_t)j));
    return row;
}

/* Row lengths around the widths, padding or none, the target at the first, the last valid
 * column, in the padding, outside the slice, in the middle. Negative: one logit raised by 0.5. */
static void test_shapes(enum l3d_dtype t) {
    const int64_t sizes[] = {1, 7, 8, 15, 16, 17, 31, 32, 33, 47, 100, 1001, 4099};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        int64_t n = sizes[k], Vl = n + (int64_t)(k % 3) * 5;
        const int64_t tgts[] = {n - 1, 0, Vl > n ? n : -1, -1, n / 2};
        void *row = normal_row(t, Vl, 100 + k);
        for (size_t q = 0; q < sizeof tgts / sizeof tgts[0]; q++)
            check_paths(t, row, n, Vl, tgts[q], true, "normal");
        int64_t j = n / 3; /* negative: results of the perturbed row against this row's oracle */
        struct res r = {.g = alloc_row(t, Vl)};
        void *bad = alloc_row(t, Vl);
        memcpy(bad, row, (size_t)(Vl + GUARD) * l3d_dtype_size(t));
        narrow(t, bad, j, widen(t, row, j) + 0.5f);
        run(l3d_cpu_simd(), t, bad, n, Vl, n - 1, 0.37f, &r);
        CHECK(!oracle_ok(t, row, n, Vl, n - 1, 0.37f, &r, false));
        free(bad), free(r.g), free(row);
    }
}

/* -inf entries, the type's largest logits, a NaN, an all -inf row */
static void test_special(enum l3d_dtype t) {
    const int64_t n = 77, Vl = 83;
    const float big = t == L3D_F16 ? 65504.0f : t == L3D_BF16 ? 0x1.fep127f : 3.4e38f;
    void *row = normal_row(t, Vl, 7);
    for (int64_t j = 0; j < n; j += 5) narrow(t, row, j, -INFINITY);
    check_paths(t, row, n, Vl, n - 1, true, "-inf entries");
    narrow(t, row, 3, big), narrow(t, row, 40, -big), narrow(t, row, n - 1, big);
    check_paths(t, row, n, Vl, n - 1, true, "huge logits");
    check_paths(t, row, n, Vl, 40, true, "huge logits");
    narrow(t, row, 9, NAN);
    for (int isa = 0; isa <= (int)l3d_cpu_simd(); isa++) {
        struct res r = {.g = alloc_row(t, Vl)};
        run((enum l3d_simd)isa, t, row, n, Vl, 1, 0.37f, &r);
        CHECK(r.mx == big && isnan(r.se) && isnan(widen(t, r.g, 9)));
        for (int64_t j = 0; j < n; j++) narrow(t, r.g, j, -INFINITY);
        CHECK(l3d_cpu_xent_max((enum l3d_simd)isa, t, r.g, n) == -INFINITY);
        CHECK(isnan(l3d_cpu_xent_sumexp((enum l3d_simd)isa, t, r.g, n, -INFINITY, NULL)));
        free(r.g);
    }
    free(row);
}

/* bf16 xent_stats then xent_backward through the backend on nth threads: maxv, sumexp, tlogit
 * and the dlogits into out (3 N + N Vl floats) */
static void be_run(struct l3d_backend *be, int nth, const void *lg, int64_t N, int64_t Vl,
                   int64_t Vv, float *out) {
    omp_set_num_threads(nth);
    size_t bytes = (size_t)(N * Vl) * 2;
    void *d = l3d_be_alloc(be, bytes, "test logits");
    int32_t *tg = l3d_be_alloc(be, (size_t)N * 4, "test targets");
    float *st = l3d_be_alloc(be, (size_t)N * 12, "test stats");
    l3d_be_copy_h2d(be, d, lg, bytes);
    int32_t *h = malloc((size_t)N * 4);
    for (int64_t i = 0; i < N; i++) h[i] = (int32_t)((i * 37) % Vv);
    l3d_be_copy_h2d(be, tg, h, (size_t)N * 4);
    l3d_be_xent_stats(be, L3D_BF16, st, st + N, st + 2 * N, d, tg, 0, N, Vl, Vv);
    l3d_be_xent_backward(be, L3D_BF16, d, st, st + N, tg, 0.37f, 0, N, Vl, Vv);
    l3d_be_copy_d2h(be, out, st, (size_t)N * 12);
    uint16_t *g = malloc(bytes);
    l3d_be_copy_d2h(be, g, d, bytes);
    for (int64_t i = 0; i < N * Vl; i++) out[3 * N + i] = l3d_bf16_to_f32(g[i]);
    free(g), free(h);
    l3d_be_free(be, d), l3d_be_free(be, tg), l3d_be_free(be, st);
}

/* The backend's bf16 statistics and gradient: the same bits with 1 and 2 threads (the rows split
 * differently). Negative: one logit of the last row changed. */
static void test_threads(void) {
    const int64_t N = 13, Vl = 1003, Vv = 997, m = 3 * N + N * Vl;
    struct l3d_backend *be = l3d_backend_cpu_init();
    void *lg = normal_row(L3D_BF16, N * Vl, 11);
    float *a = malloc((size_t)m * 4), *b = malloc((size_t)m * 4);
    be_run(be, 1, lg, N, Vl, Vv, a);
    be_run(be, 2, lg, N, Vl, Vv, b);
    CHECK(!memcmp(a, b, (size_t)m * 4));
    narrow(L3D_BF16, lg, (N - 1) * Vl + 5, widen(L3D_BF16, lg, (N - 1) * Vl + 5) + 1.0f);
    be_run(be, 2, lg, N, Vl, Vv, b);
    CHECK(memcmp(a, b, (size_t)m * 4) != 0);
    free(a), free(b), free(lg);
    l3d_backend_free(be);
}

int main(void) {
    enum l3d_simd top = l3d_cpu_simd();
    printf("xent rows: paths up to %s\n",
           top >= L3D_SIMD_AVX512 ? "avx512" : top == L3D_SIMD_AVX2 ? "avx2" : "scalar");
    const enum l3d_dtype ty[3] = {L3D_F32, L3D_BF16, L3D_F16};
    for (int k = 0; k < 3; k++) {
        test_shapes(ty[k]);
        test_special(ty[k]);
    }
    test_threads();
    return TEST_REPORT();
}
