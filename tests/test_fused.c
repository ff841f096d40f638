/*
 * The fused element-wise kernels (docs/DESIGN.md, "Fused element-wise kernels"):
 *
 *   - GELU's SIMD rows (src/backend/cpu_ew.c): every path the CPU has (scalar, AVX2, AVX-512)
 *     gives the same bits, at sizes that leave every tail length, NaN and Inf kept; and each is
 *     within the stated error of the float64 tanh form. Negative: a result one unit in the last
 *     place off fails the bit comparison, one off by 1e-5 the accuracy check.
 *   - residual + LayerNorm / RMSNorm in one pass (l3d_be_residual_layernorm_forward,
 *     l3d_be_residual_rmsnorm_forward) on the backend under test ($L3D_BACKEND) and on the
 *     checking backend: the same bits as the unfused oracle residual_forward then the norm, in
 *     fp32, bf16 and fp16, at odd sizes, and within rounding of the float64 norm of the float64
 *     sum. Negative: a perturbed residual element or weight must make the comparison fail.
 *   - the AVX-512 norm rows (l3d_cpu_ln_forward_row, _backward_row, l3d_cpu_norm_wgrad_row;
 *     LayerNorm and RMSNorm) on each AVX-512 path the CPU has, the paths bit for bit: within
 *     rounding of float64, the residual and the weight-gradient terms bit for bit. Negative: an
 *     output moved 5% fails, a gradient term one unit in the last place off fails; 16-bit GELU
 *     inputs include subnormals, whose rounding vcvtneps2bf16 alone would flush.
 *   - SwiGLU's 16-bit rows in AVX-512 (l3d_cpu_swiglu_rows): the portable element's bits at every
 *     tail length and on special gates, over a million elements (a product fused into its sum
 *     changes about one element in 40000). Negative: a reference one unit off fails.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "llm3d/backend.h"
#include "llm3d/core.h"
#include "backend/cpu_attn16.h"
#include "backend/cpu_ew.h"
#include "test.h"

typedef long long ll;

static float widen(enum l3d_dtype t, const void *p, int64_t i) {
    if (t == L3D_F32) return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    return t == L3D_BF16 ? l3d_bf16_to_f32(h) : l3d_f16_to_f32(h);
}
static void narrow(enum l3d_dtype t, void *p, int64_t i, float v) {
    if (t == L3D_F32) ((float *)p)[i] = v;
    else ((uint16_t *)p)[i] = t == L3D_BF16 ? l3d_f32_to_bf16(v) : l3d_f32_to_f16(v);
}

/* ---- GELU ------------------------------------------------------------------------------------ */

static double ref_gelu(double x, double *dx) {
    const double k = 0.7978845608028654, c = 0.044715;
    double t = tanh(k * (x + c * x * x * x));
    *dx = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * c * x * x);
    return 0.5 * x * (1 + t);
}

/* the worst |y - gelu(x)| / max(1, |x|) (forward) or |y - gelu'(x) dy| (backward, dy 1 and y
 * starting at 0); NaN-aware: a NaN in y is an infinite error */
static double gelu_err(const float *x, const float *y, int64_t n, bool back) {
    double w = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d, g = ref_gelu(x[i], &d);
        double e = back ? fabs(y[i] - d) : fabs(y[i] - g) / fmax(1.0, fabs(x[i]));
        w = test_max(w, isnan(y[i]) ? INFINITY : e);
    }
    return w;
}

static bool same_bits(const void *a, const void *b, size_t bytes) { return !memcmp(a, b, bytes); }
/* The same bits, except that a NaN matches any NaN: a NaN's sign and payload follow which operand
 * the compiler put first in a product (x86 returns the first NaN), which differs between builds
 * (the sanitized one commutes x * s), and carry no meaning. */
static bool same_floats(const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (!(isnan(a[i]) && isnan(b[i])) && memcmp(&a[i], &b[i], 4)) return false;
    return true;
}

/* y (n) by path isa: forward, or backward from y = 0.25 (+=) with dy */
static void gelu_run(enum l3d_simd isa, float *y, const float *x, const float *dy, int64_t n) {
    if (dy)
        for (int64_t i = 0; i < n; i++) y[i] = 0.25f;
    l3d_cpu_gelu_rows(isa, L3D_F32, y, x, dy, n);
}

static void test_gelu_paths(void) {
    const int64_t sizes[] = {1, 7, 8, 9, 15, 16, 17, 31, 33, 100, 1001};
    enum l3d_simd top = l3d_cpu_simd();
    printf("gelu: paths up to %s\n",
           top == L3D_SIMD_AVX512BF16 ? "avx512bf16"
           : top == L3D_SIMD_AVX512   ? "avx512"
           : top == L3D_SIMD_AVX2     ? "avx2"
                                      : "scalar");
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        int64_t n = sizes[k];
        float *x = malloc((size_t)n * 4), *dy = malloc((size_t)n * 4);
        float *y0 = malloc((size_t)n * 4), *y1 = malloc((size_t)n * 4);
        for (int64_t i = 0; i < n; i++) {
            x[i] = 6.0f * l3d_rng_normal(7, (uint64_t)n, (uint64_t)i);
            dy[i] = l3d_rng_normal(8, (uint64_t)n, (uint64_t)i);
        }
        const float special[] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 10.0f, -10.5f, 1e30f};
        for (int64_t i = 0; i < n && i < 8; i++) x[n - 1 - i] = special[i];
        for (int back = 0; back < 2; back++) {
            gelu_run(L3D_SIMD_SCALAR, y0, x, back ? dy : NULL, n);
            for (int isa = 1; isa <= (int)top; isa++) {
                gelu_run((enum l3d_simd)isa, y1, x, back ? dy : NULL, n);
                if (!same_floats(y0, y1, n))
                    fprintf(stderr, "gelu n=%lld %s: path %d differs from scalar\n", (ll)n,
                            back ? "backward" : "forward", isa);
                CHECK(same_floats(y0, y1, n));
            }
            for (int64_t i = 0; i < n && i < 8; i++) { /* the special values, path by path */
                float v = y0[n - 1 - i], xi = x[n - 1 - i];
                if (isnan(xi)) CHECK(isnan(v));
                else if (!back && isinf(xi)) CHECK(v == xi);
                else CHECK(isfinite(v));
            }
        }
        /* negative: one element a unit in the last place off */
        gelu_run(L3D_SIMD_SCALAR, y1, x, NULL, n);
        uint32_t u;
        memcpy(&u, &y1[0], 4), u ^= 1u, memcpy(&y1[0], &u, 4);
        CHECK(!same_bits(y0, y1, (size_t)n * 4));
        free(x), free(dy), free(y0), free(y1);
    }
}

/* 16-bit rows: every path against the oracle, the fp32 scalar rows on the widened values with
 * each output rounded once (what the kernel did with 16-bit blocks widened on the stack), at
 * every tail length; backward accumulating into a 16-bit y. Negative: a y rounded twice (through
 * a 16-bit dy product) fails. */
static void test_gelu_16(enum l3d_dtype t) {
    const int64_t n = 77;
    float xf[77], df[77], yf[77];
    uint16_t x[77], dy[77], y0[77], y[77], want[77];
    for (int64_t i = 0; i < n; i++) {
        narrow(t, x, i, 5.0f * l3d_rng_normal(9, 1, (uint64_t)i));
        narrow(t, dy, i, l3d_rng_normal(9, 2, (uint64_t)i));
        narrow(t, y0, i, l3d_rng_normal(9, 3, (uint64_t)i));
        xf[i] = widen(t, x, i), df[i] = widen(t, dy, i);
    }
    x[n - 1] = t == L3D_BF16 ? 0x7fc1 : 0x7e01; /* a NaN: kept */
    /* subnormals, whose GELU (about x / 2) is subnormal: vcvtneps2bf16 would flush them to
     * zero, so the AVX512BF16 path must round those vectors the integer way; one in the first
     * 16 (the masked tail of the short lengths) and one among the last */
    x[3] = 0x0005, x[n - 5] = 0x8003;
    for (int64_t i = 0; i < n; i++) xf[i] = widen(t, x, i);
    for (int back = 0; back < 2; back++)
        for (int64_t len = 1; len <= n; len += len < 40 ? 1 : 18) {
            for (int64_t i = 0; i < len; i++) yf[i] = widen(t, y0, i);
            l3d_cpu_gelu_rows(L3D_SIMD_SCALAR, L3D_F32, yf, xf, back ? df : NULL, len);
            for (int64_t i = 0; i < len; i++) narrow(t, want, i, yf[i]);
            for (int isa = 0; isa <= (int)l3d_cpu_simd(); isa++) {
                memcpy(y, y0, sizeof y);
                l3d_cpu_gelu_rows((enum l3d_simd)isa, t, y, x, back ? dy : NULL, len);
                bool ok = same_bits(y, want, (size_t)len * 2) &&
                          same_bits(y + len, y0 + len, (size_t)(n - len) * 2); /* untouched */
                if (!ok)
                    fprintf(stderr, "gelu %s %s len %lld: path %d differs from the oracle\n",
                            l3d_dtype_name(t), back ? "backward" : "forward", (ll)len, isa);
                CHECK(ok);
            }
        }
    /* the subnormal outputs are there (else the flushing would go unnoticed): the forward's
     * rounding of gelu(x[3]) is a nonzero subnormal, which flushed to zero differs */
    float g3 = 0.0f;
    l3d_cpu_gelu_rows(L3D_SIMD_SCALAR, L3D_F32, &g3, &xf[3], NULL, 1);
    narrow(t, want, 0, g3);
    CHECK((want[0] & 0x7fff) != 0 && (want[0] & (t == L3D_BF16 ? 0x7f80 : 0x7c00)) == 0);
    memcpy(y, y0, sizeof y); /* negative: the product dy gelu' rounded to 16 bits first */
    l3d_cpu_gelu_rows(l3d_cpu_simd(), t, y, x, dy, n);
    for (int64_t i = 0; i < n; i++) {
        float g = 0.0f;
        uint16_t d;
        l3d_cpu_gelu_rows(L3D_SIMD_SCALAR, L3D_F32, &g, &xf[i], &df[i], 1);
        narrow(t, &d, 0, g);
        narrow(t, want, i, widen(t, y0, i) + widen(t, &d, 0));
    }
    CHECK(!same_bits(y, want, (size_t)n * 2));
}

/* Over a dense grid of [-12, 12]: gelu within 3e-7 max(1, |x|), gelu' within 3e-7 (measured
 * over 24M points: 5.2e-7 absolute at x = 4.67, one unit in the last place of 4.67; gelu'
 * 2.1e-7 at 1.12), on the widest path (the others give the same bits). Negative: 1e-5 added to
 * one output fails. */
static void test_gelu_accuracy(void) {
    const int64_t n = 480001;
    float *x = malloc(n * 4), *y = malloc(n * 4), *one = malloc(n * 4);
    for (int64_t i = 0; i < n; i++) x[i] = -12.0f + 24.0f * (float)i / (float)(n - 1), one[i] = 1;
    l3d_cpu_gelu_rows(l3d_cpu_simd(), L3D_F32, y, x, NULL, n);
    double ef = gelu_err(x, y, n, false);
    CHECK(ef <= 3e-7);
    y[n / 3] += 1e-5f;
    CHECK(!(gelu_err(x, y, n, false) <= 3e-7));
    memset(y, 0, n * 4);
    l3d_cpu_gelu_rows(l3d_cpu_simd(), L3D_F32, y, x, one, n);
    double eb = gelu_err(x, y, n, true);
    CHECK(eb <= 3e-7);
    y[n / 2] += 1e-5f;
    CHECK(!(gelu_err(x, y, n, true) <= 3e-7));
    printf("gelu: max error %.3g (forward, relative to max(1,|x|)), %.3g (gelu')\n", ef, eb);
    free(x), free(y), free(one);
}

/* ---- residual + norm ------------------------------------------------------------------------ */

/* device buffers of one case: a, b, weight, bias in; res, out, mean, rstd out */
struct rn {
    struct l3d_backend *be;
    enum l3d_dtype t;
    int64_t N, C;
    bool rms;
    void *a, *b, *w, *bias, *res, *out;
    float *mean, *rstd;
};

static void *dev_from(struct l3d_backend *be, enum l3d_dtype t, int64_t n, uint64_t seed, float mu,
                      float sd) {
    size_t e = l3d_dtype_size(t);
    void *h = malloc((size_t)n * e), *d = l3d_be_alloc(be, (size_t)n * e, "fused test");
    for (int64_t i = 0; i < n; i++) narrow(t, h, i, mu + sd * l3d_rng_normal(seed, 1, (uint64_t)i));
    l3d_be_copy_h2d(be, d, h, (size_t)n * e);
    free(h);
    return d;
}

static void rn_init(struct rn *r, struct l3d_backend *be, enum l3d_dtype t, int64_t N, int64_t C,
                    bool rms, uint64_t s) {
    size_t e = l3d_dtype_size(t), nc = (size_t)(N * C) * e;
    *r = (struct rn){.be = be, .t = t, .N = N, .C = C, .rms = rms};
    r->a = dev_from(be, t, N * C, s + 1, 0.3f, 1.5f);
    r->b = dev_from(be, t, N * C, s + 2, -0.1f, 0.7f);
    r->w = dev_from(be, t, C, s + 3, 1.0f, 0.2f);
    r->bias = dev_from(be, t, C, s + 4, 0.0f, 0.1f);
    r->res = l3d_be_alloc(be, nc, "fused res");
    r->out = l3d_be_alloc(be, nc, "fused out");
    r->mean = l3d_be_alloc(be, (size_t)N * 4, "fused mean");
    r->rstd = l3d_be_alloc(be, (size_t)N * 4, "fused rstd");
}

static void rn_free(struct rn *r) {
    void *p[] = {r->a, r->b, r->w, r->bias, r->res, r->out, r->mean, r->rstd};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) l3d_be_free(r->be, p[i]);
}

/* fused (the one call) or the unfused oracle (residual_forward, then the norm) */
static void rn_run(struct rn *r, bool fused) {
    const float eps = 1e-6f;
    if (fused && r->rms)
        l3d_be_residual_rmsnorm_forward(r->be, r->t, r->res, r->out, r->rstd, r->a, r->b, r->w,
                                        r->N, r->C, eps);
    else if (fused)
        l3d_be_residual_layernorm_forward(r->be, r->t, r->res, r->out, r->mean, r->rstd, r->a,
                                          r->b, r->w, r->bias, r->N, r->C);
    if (fused) return;
    l3d_be_residual_forward(r->be, r->t, r->res, r->a, r->b, r->N * r->C);
    if (r->rms)
        l3d_be_rmsnorm_forward(r->be, r->t, r->out, r->rstd, r->res, r->w, r->N, r->C, eps);
    else
        l3d_be_layernorm_forward(r->be, r->t, r->out, r->mean, r->rstd, r->res, r->w, r->bias,
                                 r->N, r->C);
}

/* host copies of res, out (dtype t), rstd and mean: one buffer, in that order */
static char *rn_host(const struct rn *r) {
    size_t nc = (size_t)(r->N * r->C) * l3d_dtype_size(r->t), n4 = (size_t)r->N * 4;
    char *h = malloc(2 * nc + 2 * n4);
    l3d_be_copy_d2h(r->be, h, r->res, nc);
    l3d_be_copy_d2h(r->be, h + nc, r->out, nc);
    l3d_be_copy_d2h(r->be, h + 2 * nc, r->rstd, n4);
    if (!r->rms) l3d_be_copy_d2h(r->be, h + 2 * nc + n4, r->mean, n4);
    else memset(h + 2 * nc + n4, 0, n4);
    return h;
}
static size_t rn_bytes(const struct rn *r) {
    return 2 * (size_t)(r->N * r->C) * l3d_dtype_size(r->t) + 2 * (size_t)r->N * 4;
}

/* The fused result against float64: res within half a unit of t's last place of a + b (each
 * read back as stored), out within 2 units (relative to the row's largest |out|) of the float64
 * norm of the stored res. */
static bool rn_near_ref(const struct rn *r, const char *h) {
    const int64_t N = r->N, C = r->C;
    size_t nc = (size_t)(N * C) * l3d_dtype_size(r->t);
    double u = r->t == L3D_F32 ? 0x1p-24 : r->t == L3D_BF16 ? 0x1p-8 : 0x1p-11;
    size_t e = l3d_dtype_size(r->t);
    char *a = malloc(nc), *b = malloc(nc), *w = malloc((size_t)C * e), *bs = malloc((size_t)C * e);
    l3d_be_copy_d2h(r->be, a, r->a, nc);
    l3d_be_copy_d2h(r->be, b, r->b, nc);
    l3d_be_copy_d2h(r->be, w, r->w, (size_t)C * e);
    l3d_be_copy_d2h(r->be, bs, r->bias, (size_t)C * e);
    bool ok = true;
    for (int64_t n = 0; n < N && ok; n++) {
        double s = 0, q = 0, m, v, big = 0;
        for (int64_t c = 0; c < C; c++) {
            double x = widen(r->t, h, n * C + c), want = (double)widen(r->t, a, n * C + c) +
                                                        widen(r->t, b, n * C + c);
            ok = ok && fabs(x - want) <= u * fabs(want) * 1.0001 + 1e-30;
            s += x, q += x * x;
        }
        m = r->rms ? 0.0 : s / C;
        v = r->rms ? q / C : q / C - m * m;
        double rs = 1.0 / sqrt((v > 0 ? v : 0) + (r->rms ? 1e-6 : 1e-5));
        double *o = malloc((size_t)C * sizeof(double));
        for (int64_t c = 0; c < C; c++) {
            double x = widen(r->t, h, n * C + c);
            o[c] = (x - m) * rs * widen(r->t, w, c) + (r->rms ? 0.0 : widen(r->t, bs, c));
            big = fmax(big, fabs(o[c]));
        }
        double tol = 2 * (r->t == L3D_F32 ? 1e-6 : u) * big + 1e-6;
        for (int64_t c = 0; c < C; c++)
            ok = ok && fabs(widen(r->t, h + nc, n * C + c) - o[c]) <= tol;
        free(o);
    }
    free(a), free(b), free(w), free(bs);
    return ok;
}

/* one element of buffer p (type t, device) changed by one step of its type */
static void perturb(struct l3d_backend *be, enum l3d_dtype t, void *p, int64_t i) {
    size_t e = l3d_dtype_size(t);
    char h[4];
    l3d_be_copy_d2h(be, h, (char *)p + i * (int64_t)e, e);
    float v = widen(t, h, 0);
    narrow(t, h, 0, v + fmaxf(fabsf(v) * 0.05f, 0.01f));
    l3d_be_copy_h2d(be, (char *)p + i * (int64_t)e, h, e);
}

static void test_residual_norm(struct l3d_backend *be, enum l3d_dtype t, int64_t N, int64_t C,
                               bool rms, uint64_t s) {
    struct rn r;
    rn_init(&r, be, t, N, C, rms, s);
    rn_run(&r, false);
    char *oracle = rn_host(&r);
    l3d_be_memset(be, r.res, 0xff, (size_t)(N * C) * l3d_dtype_size(t)); /* NaN: all rewritten */
    l3d_be_memset(be, r.out, 0xff, (size_t)(N * C) * l3d_dtype_size(t));
    rn_run(&r, true);
    char *fused = rn_host(&r);
    bool same = same_bits(oracle, fused, rn_bytes(&r)), near = rn_near_ref(&r, fused);
    if (!same || !near)
        fprintf(stderr, "residual+%s %s N=%lld C=%lld on %s: %s\n", rms ? "rmsnorm" : "layernorm",
                l3d_dtype_name(t), (ll)N, (ll)C, l3d_backend_name(be),
                !same ? "differs from the unfused pair" : "off the float64 reference");
    CHECK(same);
    CHECK(near);
    /* negatives: a perturbed residual, then a perturbed weight, each must show */
    void *targets[2] = {r.b, r.w};
    for (int k = 0; k < (C == 1 && !rms ? 1 : 2); k++) { /* a 1-wide LayerNorm is its bias */
        perturb(be, t, targets[k], k == 0 ? (N * C) / 2 : C / 2);
        rn_run(&r, true);
        char *bad = rn_host(&r);
        CHECK(!same_bits(oracle, bad, rn_bytes(&r)));
        free(bad);
    }
    free(oracle), free(fused);
    rn_free(&r);
}

static void residual_norm_suite(struct l3d_backend *be) {
    const enum l3d_dtype types[] = {L3D_F32, L3D_BF16, L3D_F16};
    const int64_t shapes[][2] = {{1, 1}, {3, 7}, {5, 33}, {17, 130}, {64, 517}, {9, 768}};
    uint64_t s = 100;
    for (int ti = 0; ti < 3; ti++)
        for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++)
            for (int rms = 0; rms < 2; rms++)
                test_residual_norm(be, types[ti], shapes[k][0], shapes[k][1], rms, s += 10);
}

/* ---- LayerNorm rows in AVX-512 (cpu_ew.c) ------------------------------------------------- */

/* |got - ref| within r u |ref| + sub + k 2^-23 (|ref| + scale) for every element (the 16-bit
 * rounding of test_kernels' bound, u the unit roundoff, sub fp16's subnormal step, k the longest
 * fp32 sum); NaN-aware: a NaN fails */
static bool ln_near(enum l3d_dtype t, const void *got, const double *ref, int64_t C, double scale) {
    const double u = t == L3D_BF16 ? 0x1p-8 : t == L3D_F16 ? 0x1p-11 : 0.0;
    const double sub = t == L3D_F16 ? 0x1p-25 : 0.0, k = (double)C + 8;
    bool ok = true;
    for (int64_t c = 0; c < C; c++) {
        double e = fabs(widen(t, got, c) - ref[c]);
        ok = ok && e <= u * fabs(ref[c]) + sub + k * 0x1p-23 * (fabs(ref[c]) + scale);
    }
    return ok;
}

/* float64 LayerNorm of the C values of x (type t): out, and its mean and rstd; rms: RMSNorm
 * (mean 0, no bias) */
static double ref_ln(enum l3d_dtype t, const void *x, const float *w, const float *b, int64_t C,
                     bool rms, double *out, double *m, double *r) {
    double s = 0, v = 0, mx = 0;
    for (int64_t c = 0; c < C; c++) s += widen(t, x, c);
    *m = rms ? 0.0 : s / (double)C;
    for (int64_t c = 0; c < C; c++) v += (widen(t, x, c) - *m) * (widen(t, x, c) - *m);
    *r = 1.0 / sqrt(v / (double)C + 1e-5);
    for (int64_t c = 0; c < C; c++) {
        out[c] = (widen(t, x, c) - *m) * *r * w[c] + (rms ? 0.0 : b[c]);
        mx = fmax(mx, fabs(out[c]));
    }
    return mx;
}

/* float64 dinp (C) = di0 + r (g - mean(g) - xhat mean(g xhat)), g = d w, xhat = (x - m) r, with
 * the kernel's fp32 m and r (rms: RMSNorm, m 0 and no mean(g)); returns the scale of its terms */
static double ref_ln_back(enum l3d_dtype t, const void *di0, const void *x, const void *d,
                          const float *w, float m, float r, int64_t C, bool rms, double *out) {
    double sg = 0, sgx = 0, mx = 0;
    for (int64_t c = 0; c < C; c++) {
        double g = widen(t, d, c) * w[c];
        sg += g, sgx += g * (widen(t, x, c) - m) * r;
    }
    sg = rms ? 0.0 : sg / (double)C, sgx /= (double)C;
    for (int64_t c = 0; c < C; c++) {
        double g = widen(t, d, c) * w[c], xh = (widen(t, x, c) - m) * r;
        out[c] = widen(t, di0, c) + r * (g - sg - xh * sgx);
        mx = fmax(mx, fabs(out[c]) + fabs(r * g) + fabs(widen(t, di0, c)));
    }
    return mx;
}

/* element i of the host row p (type t) moved by 5% of its value, at least 0.01 */
static void moved(enum l3d_dtype t, void *p, int64_t i) {
    float v = widen(t, p, i);
    narrow(t, p, i, v + fmaxf(0.05f * fabsf(v), 0.01f));
}

/* One row of C through path isa: the residual add's bits, the forward and the backward against
 * float64, the norm's weight-gradient terms bit for bit against the portable column loop, and
 * the same row's norm without the add giving the same bits; outputs appended to keep (the paths
 * are compared by the caller). Negative: an output moved by 5% (at least 0.01) fails. */
static void ln_row_case(enum l3d_simd isa, enum l3d_dtype t, int64_t C, bool rms, uint64_t s,
                        char *keep) {
    const size_t es = l3d_dtype_size(t), rb = (size_t)C * es;
    char *a = malloc(rb), *add = malloc(rb), *d = malloc(rb), *di = malloc(rb), *di0 = malloc(rb);
    char *res = malloc(rb), *out = malloc(rb), *out2 = malloc(rb);
    float *w = malloc((size_t)C * 4), *b = malloc((size_t)C * 4), *sw = malloc((size_t)C * 4);
    float *sb = malloc((size_t)C * 4), *ew = malloc((size_t)C * 4), *eb = malloc((size_t)C * 4);
    double *ref = malloc((size_t)C * 8);
    for (int64_t c = 0; c < C; c++) {
        narrow(t, a, c, 0.3f + 1.5f * l3d_rng_normal(s, 1, (uint64_t)c));
        narrow(t, add, c, l3d_rng_normal(s, 2, (uint64_t)c));
        narrow(t, d, c, l3d_rng_normal(s, 3, (uint64_t)c));
        narrow(t, di0, c, 0.5f * l3d_rng_normal(s, 4, (uint64_t)c));
        w[c] = 1.0f + 0.2f * l3d_rng_normal(s, 5, (uint64_t)c), b[c] = 0.1f * (float)(c % 7);
        sw[c] = ew[c] = l3d_rng_normal(s, 6, (uint64_t)c), sb[c] = eb[c] = (float)c;
    }
    float m = 0.0f, r, m2 = 0.0f, r2; /* RMSNorm: m stays 0 */
    l3d_cpu_ln_forward_row(isa, t, out, rms ? NULL : &m, &r, res, a, add, w, b, C, 1e-5f);
    bool ok = true;
    for (int64_t c = 0; c < C; c++) { /* the residual as residual_forward rounds it */
        char want[4];
        narrow(t, want, 0, widen(t, a, c) + widen(t, add, c));
        ok = ok && !memcmp(res + (size_t)c * es, want, es);
    }
    CHECK(ok);
    double rm, rr, mx = ref_ln(t, res, w, b, C, rms, ref, &rm, &rr);
    CHECK(ln_near(t, out, ref, C, mx));
    CHECK(fabs(m - rm) <= 1e-5 && fabs(r - rr) <= 1e-5 * rr);
    memcpy(out2, out, rb); /* negative: one output moved */
    moved(t, out2, C / 2);
    CHECK(!ln_near(t, out2, ref, C, mx));
    l3d_cpu_ln_forward_row(isa, t, out2, rms ? NULL : &m2, &r2, NULL, res, NULL, w, b, C, 1e-5f);
    CHECK(same_bits(out, out2, rb) && m == m2 && r == r2); /* the pair's bits */
    memcpy(di, di0, rb);
    l3d_cpu_ln_backward_row(isa, t, di, res, d, w, rms ? NULL : &m, r, C);
    mx = ref_ln_back(t, di0, res, d, w, m, r, C, rms, ref);
    CHECK(ln_near(t, di, ref, C, mx));
    memcpy(out2, di, rb); /* negative: one output moved */
    moved(t, out2, C / 2);
    CHECK(!ln_near(t, out2, ref, C, mx));
    l3d_cpu_norm_wgrad_row(isa, t, sw, sb, res, d, m, r, C);
    for (int64_t c = 0; c < C; c++) { /* cpu.c's column loops, element by element */
        float dv = widen(t, d, c), g = dv * (widen(t, res, c) - m);
        ew[c] += g * r, eb[c] += dv;
    }
    CHECK(same_bits(sw, ew, (size_t)C * 4) && same_bits(sb, eb, (size_t)C * 4));
    ew[C - 1] = nextafterf(ew[C - 1], INFINITY);
    CHECK(!same_bits(sw, ew, (size_t)C * 4)); /* negative: one unit in the last place */
    memcpy(keep, out, rb), memcpy(keep + rb, di, rb), memcpy(keep + 2 * rb, sw, (size_t)C * 4);
    free(a), free(add), free(d), free(di), free(di0), free(res), free(out), free(out2);
    free(w), free(b), free(sw), free(sb), free(ew), free(eb), free(ref);
}

/* Every row width against float64 on each AVX-512 path the CPU has, the paths bit for bit;
 * LayerNorm, or RMSNorm (rms). */
static void test_ln_rows(enum l3d_dtype t, bool rms) {
    const enum l3d_simd top = l3d_cpu_simd();
    const int64_t sizes[] = {1, 5, 16, 17, 33, 64, 100, 771};
    if (top < L3D_SIMD_AVX512) {
        printf("layernorm rows: no AVX-512 here, skipped\n");
        return;
    }
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        const int64_t C = sizes[k];
        const size_t kb = (size_t)C * (2 * l3d_dtype_size(t) + 4);
        char *k0 = malloc(kb), *k1 = malloc(kb);
        for (int isa = L3D_SIMD_AVX512; isa <= (int)top; isa++) {
            char *kp = isa == L3D_SIMD_AVX512 ? k0 : k1;
            ln_row_case((enum l3d_simd)isa, t, C, rms, 300 + (uint64_t)C + 7 * rms, kp);
            if (isa > L3D_SIMD_AVX512) CHECK(same_bits(k0, k1, kb));
        }
        free(k0), free(k1);
    }
}

/* ---- SwiGLU's 16-bit rows in AVX-512 -------------------------------------------------------- */

/* cpu.c's portable SwiGLU element (swiglu_cols), each operation its own statement so that no
 * compiler fuses a product into a sum (the ISO C build's portable loop fuses none): o, or dg and
 * du advanced from their values */
static void swiglu_ref(float g, float u, float d, float *o, float *dg, float *du) {
    float ng = -g, e = fast_expf(ng), den = 1.0f + e, s = 1.0f / den;
    if (o) {
        float gs = g * s;
        *o = gs * u;
        return;
    }
    float du_ = d * u, a = du_ * s, oms = 1.0f - s, gm = g * oms, b = 1.0f + gm, ab = a * b;
    *dg = *dg + ab;
    float dg_ = d * g, c = dg_ * s;
    *du = *du + c;
}

/* 16-bit values a and b (n) agree bit for bit, a NaN matching any NaN */
static bool same16(enum l3d_dtype t, const uint16_t *a, const uint16_t *b, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (a[i] != b[i] && !(isnan(widen(t, a, i)) && isnan(widen(t, b, i)))) return false;
    return true;
}

/* l3d_cpu_swiglu_rows on this CPU's AVX-512 path: the portable element's bits (swiglu_ref) at
 * every tail length, with NaN, infinities, signed zeros, subnormals and exp's clamps among the
 * gates. Negative: a reference one unit in the last place off must fail the comparison. */
static void test_swiglu_rows(enum l3d_dtype t) {
    enum l3d_simd isa = l3d_cpu_simd();
    if (isa < L3D_SIMD_AVX512) {
        printf("swiglu rows %s: no AVX-512 here, the portable rows run (nothing to compare)\n",
               l3d_dtype_name(t));
        return;
    }
    /* the last long enough for a one-in-40000 difference to show */
    const int64_t lens[] = {1, 15, 16, 17, 1029, (1 << 20) + 3};
    const float special[] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 100.0f, -100.0f, 1e-39f,
                             87.5f, -87.5f};
    bool all = true;
    for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++) {
        int64_t n = lens[k];
        uint16_t *g = calloc((size_t)n, 2), *u = calloc((size_t)n, 2), *d = calloc((size_t)n, 2);
        uint16_t *o = calloc((size_t)n, 2), *dg = calloc((size_t)n, 2), *du = calloc((size_t)n, 2);
        uint16_t *ro = calloc((size_t)n, 2), *rdg = calloc((size_t)n, 2);
        uint16_t *rdu = calloc((size_t)n, 2);
        for (int64_t i = 0; i < n; i++) {
            float gv = 12.0f * (2.0f * l3d_rng_uniform(71, (uint64_t)k, (uint64_t)i) - 1.0f);
            if (i % 7 == 3) gv = special[(i / 7) % (sizeof special / sizeof special[0])];
            narrow(t, g, i, gv);
            narrow(t, u, i, 4.0f * (2.0f * l3d_rng_uniform(72, (uint64_t)k, (uint64_t)i) - 1.0f));
            narrow(t, d, i, 2.0f * l3d_rng_uniform(73, (uint64_t)k, (uint64_t)i) - 1.0f);
            narrow(t, dg, i, 2.0f * l3d_rng_uniform(74, (uint64_t)k, (uint64_t)i) - 1.0f);
            narrow(t, du, i, 2.0f * l3d_rng_uniform(75, (uint64_t)k, (uint64_t)i) - 1.0f);
            float fo, fdg = widen(t, dg, i), fdu = widen(t, du, i);
            swiglu_ref(widen(t, g, i), widen(t, u, i), widen(t, d, i), &fo, NULL, NULL);
            swiglu_ref(widen(t, g, i), widen(t, u, i), widen(t, d, i), NULL, &fdg, &fdu);
            narrow(t, ro, i, fo), narrow(t, rdg, i, fdg), narrow(t, rdu, i, fdu);
        }
        l3d_cpu_swiglu_rows(isa, t, o, NULL, NULL, NULL, g, u, n);
        l3d_cpu_swiglu_rows(isa, t, NULL, dg, du, d, g, u, n);
        bool ok = same16(t, o, ro, n) && same16(t, dg, rdg, n) && same16(t, du, rdu, n);
        if (!ok) printf("swiglu rows %s n=%lld: not the portable bits\n", l3d_dtype_name(t), (ll)n);
        all = all && ok;
        if (n == 1029) { /* negative: one reference element moved by a unit in the last place */
            rdg[517] ^= 1;
            CHECK(!same16(t, dg, rdg, n));
        }
        free(g), free(u), free(d), free(o), free(dg), free(du), free(ro), free(rdg), free(rdu);
    }
    printf("swiglu rows %s: AVX-512 against the portable element, every length: %s\n",
           l3d_dtype_name(t), all ? "the same bits" : "DIFFERENT");
    CHECK(all);
}

int main(void) {
    test_gelu_paths();
    test_gelu_accuracy();
    test_gelu_16(L3D_BF16);
    test_gelu_16(L3D_F16);
    test_swiglu_rows(L3D_BF16);
    test_swiglu_rows(L3D_F16);
    for (int rms = 0; rms < 2; rms++) {
        test_ln_rows(L3D_F32, rms);
        test_ln_rows(L3D_BF16, rms);
        test_ln_rows(L3D_F16, rms);
    }
    struct l3d_backend *be = test_backend_init();
    residual_norm_suite(be);
    l3d_backend_free(be);
    if (l3d_backend_init("check", &be) == L3D_OK) {
        residual_norm_suite(be);
        l3d_backend_free(be);
    }
    return TEST_REPORT();
}
