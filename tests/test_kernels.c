/*
 * Every kernel pair of the backend ($L3D_BACKEND, default cpu) against the double-precision oracle
 * (tests/support/ref.c), through device buffers staged from and back to host arrays.
 *
 *   forward:  the float output against the double reference run on the same (float) inputs:
 *             |got - want| <= FWD_RTOL * (|want| + max|want|), max over the tensor;
 *   backward: a scalar objective L = sum_i w_i out_i with fixed random weights w, so dout = w.
 *             The float backward's gradients against central differences of the DOUBLE reference
 *             forward (ggml test-backend-ops MODE_GRAD): |got - num| <= BWD_RTOL * (|num| + max|num|).
 *             Gradient outputs are pre-filled with random values that are subtracted afterwards,
 *             which tests the += contract; forward outputs and scratch are pre-filled with NaN,
 *             which tests the = contract. Then the NULL gradient outputs the contract allows.
 *
 * Why these tolerances. The reference sees exactly the float inputs, so the only error is the
 * kernel's fp32 arithmetic (a few ulp, 6e-8, times the depth of its sums: ~1e-6 of a tensor's
 * magnitude at these sizes) and, for gradients, the finite difference in double (eps 1e-6:
 * truncation ~1e-12, round-off ~1e-9 of the gradient's scale). The worst error of each kernel is
 * printed at the end as a fraction of its tolerance (0.08 at most when this was written). Scaling
 * by max|want| keeps entries that cancel to ~0 from demanding a precision fp32 cannot give, while
 * a real bug (a dropped term, a wrong index, a transpose, a missing scale, = for +=) moves some
 * entry by a sizeable fraction of that magnitude, orders of magnitude above 1e-5. What it cannot
 * see is a change smaller than that, e.g. a typo in the 5th digit of GELU's 0.044715 (~1e-6).
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "llm3d/backend.h"
#include "llm3d/core.h"
#include "llm3d/model.h"
#include "support/ref.h"
#include "test.h"

#define FWD_RTOL 1e-5
#define BWD_RTOL 1e-5
#define FD_EPS 1e-6
/* At most this many entries of one gradient tensor are checked by finite differences (all of
 * them below it; a stratified random sample above, always including the first and the last). */
#define FD_MAX 400
#define SEED 20240611u

typedef long long ll; /* for printing int64_t sizes with %lld */

/* ---------------------------------------------------------------------------------------------
 * Buffers and comparison
 * ------------------------------------------------------------------------------------------- */

/* Plain malloc of exactly the requested size, so that ASan sees any overrun by a kernel. */
static void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    L3D_ASSERT(p != NULL);
    return p;
}
static float *falloc(int64_t n) { return xmalloc((size_t)n * sizeof(float)); }
static double *dalloc(int64_t n) { return xmalloc((size_t)n * sizeof(double)); }
static int32_t *ialloc(int64_t n) { return xmalloc((size_t)n * sizeof(int32_t)); }
static void *xcalloc(size_t n, size_t size) {
    void *p = xmalloc(n * size);
    memset(p, 0, n * size);
    return p;
}

static float *fnan(int64_t n) {
    float *x = falloc(n);
    for (int64_t i = 0; i < n; i++) x[i] = NAN;
    return x;
}
static float *frand(int64_t n, float mean, float std, uint64_t stream) {
    float *x = falloc(n);
    ref_fill_normal(x, n, mean, std, SEED, stream);
    return x;
}
static double *dcopy(const float *x, int64_t n) {
    double *d = dalloc(n);
    ref_to_double(d, x, n);
    return d;
}

static double max_abs(const double *x, int64_t n) {
    double m = 0.0;
    for (int64_t i = 0; i < n; i++)
        if (fabs(x[i]) > m) m = fabs(x[i]);
    return m;
}

/* The kernels, for the margin table printed at the end. */
enum kern { K_MATMUL, K_ENCODER, K_LAYERNORM, K_ATTENTION, K_GELU, K_RESIDUAL, K_XENT, K_ADAMW,
            K_SUMSQ, K_RMSNORM, K_ROPE, K_SWIGLU, K_COUNT };
static const char *const kern_name[K_COUNT] = {"matmul", "encoder", "layernorm", "attention", "gelu",
                                               "residual", "xent", "adamw", "sumsq", "rmsnorm",
                                               "rope", "swiglu"};
/* Worst |err| / tol seen per kernel, forward and backward; 1 is the tolerance. */
static double margin[K_COUNT][2];

/*
 * got[idx[k]] against want[k] for k < n (idx NULL: got[k]), |err| <= rtol * (|want| + max|want|).
 * One check; on failure prints the worst offender and how many entries fail. The worst err/tol
 * goes into margin[kern][bwd].
 */
static void check_close(enum kern kern, int bwd, const char *tag, const char *what,
                        const double *got, const int64_t *idx, const double *want, int64_t n,
                        double rtol) {
    double scale = max_abs(want, n);
    double worst = 0.0;
    int64_t worst_k = -1, nbad = 0;
    for (int64_t k = 0; k < n; k++) {
        double g = got[idx ? idx[k] : k];
        double tol = rtol * (fabs(want[k]) + scale);
        double err = fabs(g - want[k]);
        double r = tol > 0 ? err / tol : (err == 0.0 ? 0.0 : INFINITY);
        if (!(err <= tol)) {
            nbad++;
            if (isnan(err)) r = INFINITY;
        }
        if (worst_k < 0 || r > worst) {
            worst = r;
            worst_k = k;
        }
    }
    if (worst > margin[kern][bwd]) margin[kern][bwd] = worst;
    test_checks++;
    if (nbad) {
        test_failures++;
        int64_t i = idx ? idx[worst_k] : worst_k;
        fprintf(stderr,
                "FAIL %s: %s: %lld of %lld entries out of tolerance; worst [%lld]: got %.9g, want "
                "%.9g, |diff| %.3g > tol %.3g (rtol %.0e, max|want| %.3g)\n",
                tag, what, (ll)nbad, (ll)n, (ll)i, got[i], want[worst_k], fabs(got[i] - want[worst_k]),
                rtol * (fabs(want[worst_k]) + scale), rtol, scale);
    }
}

/* A float output against a double reference, forward tolerance. */
static void check_fwd(enum kern kern, const char *tag, const char *what, const float *got,
                      const double *want, int64_t n) {
    double *g = dcopy(got, n);
    check_close(kern, 0, tag, what, g, NULL, want, n, FWD_RTOL);
    free(g);
}

/* Every entry of x[0..n) bitwise equal to want (e.g. exact zeros); prints the first that is not. */
static void check_all_equal(const char *tag, const char *what, const float *x, const float *want,
                            int64_t n) {
    int64_t nbad = 0, first = -1;
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&x[i], &want[i], sizeof(float)) != 0) {
            if (first < 0) first = i;
            nbad++;
        }
    test_checks++;
    if (nbad) {
        test_failures++;
        fprintf(stderr, "FAIL %s: %s: %lld of %lld entries differ; first [%lld]: got %.9g, want %.9g\n",
                tag, what, (ll)nbad, (ll)n, (ll)first, x[first], want[first]);
    }
}

/* ---------------------------------------------------------------------------------------------
 * Staging: the kernels run on device memory (include/llm3d/backend.h), the checks on the host.
 * Each k_<kernel> below takes host arrays: it uploads every argument into a fresh device buffer
 * of exactly its size (outputs too, so that their NaN or random pre-fill reaches the kernel),
 * runs the kernel, downloads the outputs and frees the buffers. A NULL argument stays NULL.
 * ------------------------------------------------------------------------------------------- */

#define STAGE_MAX 8

struct stage {
    struct l3d_backend *be;
    int n;
    struct {
        void *host, *dev;
        size_t bytes;
        int out; /* downloaded by stage_done */
    } a[STAGE_MAX];
};

static void *stage(struct stage *s, const void *host, size_t bytes, int out) {
    if (!host) return NULL;
    L3D_ASSERT(s->n < STAGE_MAX);
    void *dev = l3d_be_alloc(s->be, bytes, "test staging");
    L3D_ASSERT(dev != NULL);
    l3d_be_copy_h2d(s->be, dev, host, bytes);
    s->a[s->n].host = (void *)host;
    s->a[s->n].dev = dev;
    s->a[s->n].bytes = bytes;
    s->a[s->n].out = out;
    s->n++;
    return dev;
}
/* An input of n floats (ints), and an output (or gradient) of n floats. */
static const float *in_f(struct stage *s, const float *h, int64_t n) {
    return stage(s, h, (size_t)n * sizeof(float), 0);
}
static const int32_t *in_i(struct stage *s, const int32_t *h, int64_t n) {
    return stage(s, h, (size_t)n * sizeof(int32_t), 0);
}
static float *out_f(struct stage *s, float *h, int64_t n) {
    return stage(s, h, (size_t)n * sizeof(float), 1);
}

static void stage_done(struct stage *s) {
    for (int i = 0; i < s->n; i++) {
        if (s->a[i].out) l3d_be_copy_d2h(s->be, s->a[i].host, s->a[i].dev, s->a[i].bytes);
        l3d_be_free(s->be, s->a[i].dev);
    }
    s->n = 0;
}

static void k_matmul_forward(struct l3d_backend *be, float *out, const float *inp, const float *w,
                             const float *b, int64_t N, int64_t C, int64_t OC) {
    struct stage s = {.be = be};
    l3d_be_matmul_forward(be, L3D_F32, out_f(&s, out, N * OC), in_f(&s, inp, N * C),
                          in_f(&s, w, OC * C), in_f(&s, b, OC), N, C, OC);
    stage_done(&s);
}
static void k_matmul_backward(struct l3d_backend *be, float *dinp, float *dw, float *db,
                              const float *dout, const float *inp, const float *w, int64_t N,
                              int64_t C, int64_t OC) {
    struct stage s = {.be = be};
    l3d_be_matmul_backward(be, L3D_F32, out_f(&s, dinp, N * C), out_f(&s, dw, OC * C),
                           out_f(&s, db, OC), in_f(&s, dout, N * OC), in_f(&s, inp, N * C),
                           in_f(&s, w, OC * C), N, C, OC);
    stage_done(&s);
}
static void k_encoder_forward(struct l3d_backend *be, float *out, const int32_t *tokens,
                              const float *wte, const float *wpe, int64_t vocab_start,
                              int64_t vocab_count, int64_t Tw, int64_t B, int64_t T, int64_t C) {
    struct stage s = {.be = be};
    l3d_be_encoder_forward(be, L3D_F32, out_f(&s, out, B * T * C), in_i(&s, tokens, B * T),
                           in_f(&s, wte, vocab_count * C), in_f(&s, wpe, Tw * C), vocab_start,
                           vocab_count, B, T, C);
    stage_done(&s);
}
static void k_encoder_backward(struct l3d_backend *be, float *dwte, float *dwpe, const float *dout,
                               const int32_t *tokens, int64_t vocab_start, int64_t vocab_count,
                               int64_t Tw, int64_t B, int64_t T, int64_t C) {
    struct stage s = {.be = be};
    l3d_be_encoder_backward(be, L3D_F32, out_f(&s, dwte, vocab_count * C), out_f(&s, dwpe, Tw * C),
                            in_f(&s, dout, B * T * C), in_i(&s, tokens, B * T), vocab_start,
                            vocab_count, B, T, C);
    stage_done(&s);
}
static void k_layernorm_forward(struct l3d_backend *be, float *out, float *mean, float *rstd,
                                const float *inp, const float *w, const float *b, int64_t N,
                                int64_t C) {
    struct stage s = {.be = be};
    l3d_be_layernorm_forward(be, L3D_F32, out_f(&s, out, N * C), out_f(&s, mean, N),
                             out_f(&s, rstd, N), in_f(&s, inp, N * C), in_f(&s, w, C),
                             in_f(&s, b, C), N, C);
    stage_done(&s);
}
static void k_layernorm_backward(struct l3d_backend *be, float *dinp, float *dw, float *db,
                                 const float *dout, const float *inp, const float *w,
                                 const float *mean, const float *rstd, int64_t N, int64_t C) {
    struct stage s = {.be = be};
    l3d_be_layernorm_backward(be, L3D_F32, out_f(&s, dinp, N * C), out_f(&s, dw, C),
                              out_f(&s, db, C), in_f(&s, dout, N * C), in_f(&s, inp, N * C),
                              in_f(&s, w, C), in_f(&s, mean, N), in_f(&s, rstd, N), N, C);
    stage_done(&s);
}
/* qkv rows of (NH + 2 NKV) heads: grouped-query attention, NKV == NH multi-head */
static int64_t n_qkv(int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS) {
    return B * T * (NH + 2 * NKV) * HS;
}
static void k_attention_forward(struct l3d_backend *be, float *out, float *lse, const float *qkv,
                                int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS) {
    struct stage s = {.be = be};
    l3d_be_attention_forward(be, L3D_F32, out_f(&s, out, B * T * NH * HS), out_f(&s, lse, B * NH * T),
                             in_f(&s, qkv, n_qkv(B, T, NH, NKV, HS)), B, T, NH, NKV, HS);
    stage_done(&s);
}
static void k_attention_backward(struct l3d_backend *be, float *dqkv, const float *dout,
                                 const float *qkv, const float *out, const float *lse, int64_t B,
                                 int64_t T, int64_t NH, int64_t NKV, int64_t HS) {
    struct stage s = {.be = be};
    const int64_t nq = n_qkv(B, T, NH, NKV, HS);
    l3d_be_attention_backward(be, L3D_F32, out_f(&s, dqkv, nq), in_f(&s, dout, B * T * NH * HS),
                              in_f(&s, qkv, nq), in_f(&s, out, B * T * NH * HS),
                              in_f(&s, lse, B * NH * T), B, T, NH, NKV, HS);
    stage_done(&s);
}
static void k_attention_cached(struct l3d_backend *be, float *out, const float *q, const float *k,
                               const float *v, int64_t pos, int64_t n, int64_t NH, int64_t NKV,
                               int64_t HS, int64_t qs, int64_t ks) {
    struct stage s = {.be = be};
    int64_t C = NH * HS, nkv = (pos + n - 1) * ks + NKV * HS;
    l3d_be_attention_cached(be, L3D_F32, out_f(&s, out, n * C), in_f(&s, q, (n - 1) * qs + C),
                            in_f(&s, k, nkv), in_f(&s, v, nkv), pos, n, NH, NKV, HS, qs, ks);
    stage_done(&s);
}
static void k_attention_naive_forward(struct l3d_backend *be, float *out, float *att,
                                      const float *qkv, int64_t B, int64_t T, int64_t NH,
                                      int64_t NKV, int64_t HS) {
    struct stage s = {.be = be};
    l3d_be_attention_naive_forward(be, L3D_F32, out_f(&s, out, B * T * NH * HS),
                                   out_f(&s, att, B * NH * T * T),
                                   in_f(&s, qkv, n_qkv(B, T, NH, NKV, HS)), B, T, NH, NKV, HS);
    stage_done(&s);
}
static void k_attention_naive_backward(struct l3d_backend *be, float *dqkv, float *datt,
                                       const float *dout, const float *qkv, const float *att,
                                       int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS) {
    struct stage s = {.be = be};
    const int64_t nq = n_qkv(B, T, NH, NKV, HS);
    l3d_be_attention_naive_backward(be, L3D_F32, out_f(&s, dqkv, nq),
                                    out_f(&s, datt, B * NH * T * T),
                                    in_f(&s, dout, B * T * NH * HS), in_f(&s, qkv, nq),
                                    in_f(&s, att, B * NH * T * T), B, T, NH, NKV, HS);
    stage_done(&s);
}
static void k_gelu_forward(struct l3d_backend *be, float *out, const float *inp, int64_t N) {
    struct stage s = {.be = be};
    l3d_be_gelu_forward(be, L3D_F32, out_f(&s, out, N), in_f(&s, inp, N), N);
    stage_done(&s);
}
static void k_gelu_backward(struct l3d_backend *be, float *dinp, const float *dout,
                            const float *inp, int64_t N) {
    struct stage s = {.be = be};
    l3d_be_gelu_backward(be, L3D_F32, out_f(&s, dinp, N), in_f(&s, dout, N), in_f(&s, inp, N), N);
    stage_done(&s);
}
static void k_residual_forward(struct l3d_backend *be, float *out, const float *a, const float *b,
                               int64_t N) {
    struct stage s = {.be = be};
    l3d_be_residual_forward(be, L3D_F32, out_f(&s, out, N), in_f(&s, a, N), in_f(&s, b, N), N);
    stage_done(&s);
}
static void k_add_inplace(struct l3d_backend *be, float *dst, const float *src, int64_t N) {
    struct stage s = {.be = be};
    l3d_be_add_inplace(be, L3D_F32, out_f(&s, dst, N), in_f(&s, src, N), N);
    stage_done(&s);
}
static void k_xent_max(struct l3d_backend *be, float *maxv, const float *logits, int64_t N,
                       int64_t Vl, int64_t Vvalid) {
    struct stage s = {.be = be};
    l3d_be_xent_max(be, L3D_F32, out_f(&s, maxv, N), in_f(&s, logits, N * Vl), N, Vl, Vvalid);
    stage_done(&s);
}
static void k_xent_sumexp(struct l3d_backend *be, float *sumexp, float *tlogit,
                          const float *logits, const float *maxv, const int32_t *targets,
                          int64_t vocab_start, int64_t N, int64_t Vl, int64_t Vvalid) {
    struct stage s = {.be = be};
    l3d_be_xent_sumexp(be, L3D_F32, out_f(&s, sumexp, N), out_f(&s, tlogit, N),
                       in_f(&s, logits, N * Vl), in_f(&s, maxv, N), in_i(&s, targets, N),
                       vocab_start, N, Vl, Vvalid);
    stage_done(&s);
}
static void k_xent_backward(struct l3d_backend *be, float *logits, const float *maxv,
                            const float *sumexp, const int32_t *targets, float dloss,
                            int64_t vocab_start, int64_t N, int64_t Vl, int64_t Vvalid) {
    struct stage s = {.be = be};
    l3d_be_xent_backward(be, L3D_F32, out_f(&s, logits, N * Vl), in_f(&s, maxv, N),
                         in_f(&s, sumexp, N), in_i(&s, targets, N), dloss, vocab_start, N, Vl,
                         Vvalid);
    stage_done(&s);
}
static void k_adamw(struct l3d_backend *be, float *p, float *m, float *v, const float *g,
                    float gscale, int64_t n, float lr, float beta1, float beta2, float eps,
                    float wd, float bc1, float bc2) {
    struct stage s = {.be = be};
    l3d_be_adamw(be, L3D_F32, out_f(&s, p, n), out_f(&s, m, n), out_f(&s, v, n), in_f(&s, g, n),
                 gscale, n, lr, beta1, beta2, eps, wd, bc1, bc2);
    stage_done(&s);
}
/* *acc += sum of x^2 (one double on the device). */
static void k_sumsq(struct l3d_backend *be, double *acc, const float *x, int64_t n) {
    struct stage s = {.be = be};
    l3d_be_sumsq(be, L3D_F32, stage(&s, acc, sizeof *acc, 1), in_f(&s, x, n), n);
    stage_done(&s);
}

/* ---------------------------------------------------------------------------------------------
 * Gradients: finite differences of the double reference against the float backward
 * ------------------------------------------------------------------------------------------- */

typedef double (*objective_fn)(void *ctx);

struct grad {
    const char *name;
    double *x;    /* the double input the objective reads; perturbed by the finite differences */
    int64_t n;
    float *g;     /* the float kernel's gradient output (n) */
    float *pre;   /* its content before the backward call: subtracted, to test += */
    int64_t *idx; /* the entries checked */
    double *num;  /* numeric gradient at idx */
    int64_t nidx;
    uint64_t stream;
};

/* Numeric gradient of f with respect to x at a sample of indices; allocates the float output. */
static struct grad grad_numeric(const char *name, double *x, int64_t n, objective_fn f, void *ctx,
                                uint64_t stream) {
    struct grad gr = {.name = name, .x = x, .n = n, .stream = stream};
    gr.nidx = n <= FD_MAX ? n : FD_MAX;
    gr.idx = xmalloc((size_t)gr.nidx * sizeof(int64_t));
    gr.num = dalloc(gr.nidx);
    for (int64_t k = 0; k < gr.nidx; k++) {
        if (gr.nidx == n) {
            gr.idx[k] = k;
        } else { /* one random entry from each of nidx equal strata */
            int64_t lo = k * n / gr.nidx, hi = (k + 1) * n / gr.nidx;
            gr.idx[k] = lo + (int64_t)(l3d_rng_u64(SEED, stream, (uint64_t)k) % (uint64_t)(hi - lo));
        }
    }
    if (gr.nidx < n) {
        gr.idx[0] = 0;
        gr.idx[gr.nidx - 1] = n - 1;
    }
    for (int64_t k = 0; k < gr.nidx; k++) gr.num[k] = ref_fd_partial(f, ctx, x, gr.idx[k], FD_EPS);
    gr.g = falloc(n);
    gr.pre = falloc(n);
    return gr;
}

/* Fills the gradient output with random values of the gradient's own magnitude. */
static void grad_prefill(struct grad *gr) {
    double s = max_abs(gr->num, gr->nidx);
    ref_fill_normal(gr->pre, gr->n, 0.0f, (float)(s > 0 ? 0.5 * s : 0.5), SEED, gr->stream + 7777);
    memcpy(gr->g, gr->pre, (size_t)gr->n * sizeof(float));
}

/* (g - pre) against the numeric gradient. */
static void grad_check(enum kern kern, const char *tag, const struct grad *gr) {
    double *got = dalloc(gr->n);
    for (int64_t i = 0; i < gr->n; i++) got[i] = (double)gr->g[i] - (double)gr->pre[i];
    check_close(kern, 1, tag, gr->name, got, gr->idx, gr->num, gr->nidx, BWD_RTOL);
    free(got);
}

static void grad_free(struct grad *gr) {
    free(gr->idx);
    free(gr->num);
    free(gr->g);
    free(gr->pre);
}

/* ---------------------------------------------------------------------------------------------
 * matmul
 * ------------------------------------------------------------------------------------------- */

struct mm_ctx {
    int64_t N, C, OC;
    double *inp, *w, *b, *out, *dout;
};

static double mm_objective(void *p) {
    struct mm_ctx *c = p;
    ref_matmul_forward(c->out, c->inp, c->w, c->b, c->N, c->C, c->OC);
    return ref_dot(c->dout, c->out, c->N * c->OC);
}

static void test_matmul(struct l3d_backend *be, int64_t N, int64_t C, int64_t OC,
                        int with_bias, uint64_t s) {
    char tag[128];
    snprintf(tag, sizeof tag, "matmul N=%lld C=%lld OC=%lld%s", (ll)N, (ll)C, (ll)OC,
             with_bias ? "" : " (no bias)");
    float *inp = frand(N * C, 0, 1, s + 1), *w = frand(OC * C, 0, 1, s + 2);
    float *b = with_bias ? frand(OC, 0, 1, s + 3) : NULL;
    float *dout = frand(N * OC, 0, 1, s + 4), *out = fnan(N * OC);
    struct mm_ctx c = {N, C, OC, dcopy(inp, N * C), dcopy(w, OC * C), b ? dcopy(b, OC) : NULL,
                       dalloc(N * OC), dcopy(dout, N * OC)};

    k_matmul_forward(be, out, inp, w, b, N, C, OC);
    mm_objective(&c);
    check_fwd(K_MATMUL, tag, "out", out, c.out, N * OC);

    struct grad gi = grad_numeric("dinp", c.inp, N * C, mm_objective, &c, s + 11);
    struct grad gw = grad_numeric("dweight", c.w, OC * C, mm_objective, &c, s + 12);
    struct grad gb = {0};
    if (with_bias) gb = grad_numeric("dbias", c.b, OC, mm_objective, &c, s + 13);
    grad_prefill(&gi);
    grad_prefill(&gw);
    if (with_bias) grad_prefill(&gb);
    k_matmul_backward(be, gi.g, gw.g, gb.g, dout, inp, w, N, C, OC);
    grad_check(K_MATMUL, tag, &gi);
    grad_check(K_MATMUL, tag, &gw);
    if (with_bias) grad_check(K_MATMUL, tag, &gb);

    /* NULL gradient outputs are skipped; the others are still right. */
    char tag2[160];
    snprintf(tag2, sizeof tag2, "%s, dinp NULL", tag);
    grad_prefill(&gw);
    if (with_bias) grad_prefill(&gb);
    k_matmul_backward(be, NULL, gw.g, gb.g, dout, inp, w, N, C, OC);
    grad_check(K_MATMUL, tag2, &gw);
    if (with_bias) grad_check(K_MATMUL, tag2, &gb);
    snprintf(tag2, sizeof tag2, "%s, dbias and dweight NULL", tag);
    grad_prefill(&gi);
    k_matmul_backward(be, gi.g, NULL, NULL, dout, inp, w, N, C, OC);
    grad_check(K_MATMUL, tag2, &gi);
    if (with_bias) {
        snprintf(tag2, sizeof tag2, "%s, dbias NULL", tag);
        grad_prefill(&gi);
        grad_prefill(&gw);
        k_matmul_backward(be, gi.g, gw.g, NULL, dout, inp, w, N, C, OC);
        grad_check(K_MATMUL, tag2, &gi);
        grad_check(K_MATMUL, tag2, &gw);
    }

    grad_free(&gi);
    grad_free(&gw);
    if (with_bias) grad_free(&gb);
    free(c.inp), free(c.w), free(c.b), free(c.out), free(c.dout);
    free(inp), free(w), free(b), free(dout), free(out);
}

/* ---------------------------------------------------------------------------------------------
 * encoder
 * ------------------------------------------------------------------------------------------- */

struct enc_ctx {
    int64_t B, T, C, vocab_start, vocab_count;
    const int32_t *tokens;
    double *wte, *wpe, *out, *dout;
};

static double enc_objective(void *p) {
    struct enc_ctx *c = p;
    ref_encoder_forward(c->out, c->tokens, c->wte, c->wpe, c->vocab_start, c->vocab_count, c->B,
                        c->T, c->C);
    return ref_dot(c->dout, c->out, c->B * c->T * c->C);
}

/* Tokens drawn from [0, Vtotal); the slice [vocab_start, vocab_start+vocab_count) sees only some.
 * wpe has Tw >= T rows (0: no wpe). */
static void test_encoder(struct l3d_backend *be, int64_t B, int64_t T, int64_t C,
                         int64_t vocab_start, int64_t vocab_count, int64_t Vtotal, int64_t Tw,
                         uint64_t s) {
    char tag[160];
    snprintf(tag, sizeof tag, "encoder B=%lld T=%lld C=%lld slice [%lld,%lld) of %lld, wpe rows %lld",
             (ll)B, (ll)T, (ll)C, (ll)vocab_start, (ll)(vocab_start + vocab_count), (ll)Vtotal, (ll)Tw);
    const int64_t BT = B * T;
    int32_t *tokens = ialloc(BT);
    ref_fill_tokens(tokens, BT, 0, (int32_t)Vtotal, SEED, s + 1);
    /* Make sure the first and last ids of the slice and its two neighbours occur. */
    int32_t edge[4] = {(int32_t)vocab_start, (int32_t)(vocab_start + vocab_count - 1),
                       (int32_t)(vocab_start - 1), (int32_t)(vocab_start + vocab_count)};
    for (int k = 0; k < 4 && k < BT; k++)
        if (edge[k] >= 0 && edge[k] < Vtotal) tokens[(k * 7) % BT] = edge[k];
    float *wte = frand(vocab_count * C, 0, 1, s + 2);
    float *wpe = Tw ? frand(Tw * C, 0, 1, s + 3) : NULL;
    float *dout = frand(BT * C, 0, 1, s + 4), *out = fnan(BT * C);
    struct enc_ctx c = {B, T, C, vocab_start, vocab_count, tokens, dcopy(wte, vocab_count * C),
                        wpe ? dcopy(wpe, Tw * C) : NULL, dalloc(BT * C), dcopy(dout, BT * C)};

    k_encoder_forward(be, out, tokens, wte, wpe, vocab_start, vocab_count, Tw, B, T, C);
    enc_objective(&c);
    check_fwd(K_ENCODER, tag, "out", out, c.out, BT * C);
    /* Out-of-slice tokens: exactly wpe[t], or exactly zero. */
    float *want = falloc(C);
    int64_t nout = 0;
    for (int64_t bt = 0; bt < BT; bt++) {
        int64_t row = tokens[bt] - vocab_start;
        if (row >= 0 && row < vocab_count) continue;
        nout++;
        for (int64_t i = 0; i < C; i++) want[i] = wpe ? wpe[(bt % T) * C + i] : 0.0f;
        check_all_equal(tag, "out row of an out-of-slice token", out + bt * C, want, C);
    }
    free(want);
    CHECK(nout > 0 || vocab_count == Vtotal);

    struct grad gte = grad_numeric("dwte", c.wte, vocab_count * C, enc_objective, &c, s + 11);
    struct grad gpe = {0};
    if (wpe) gpe = grad_numeric("dwpe", c.wpe, Tw * C, enc_objective, &c, s + 12);
    grad_prefill(&gte);
    if (wpe) grad_prefill(&gpe);
    k_encoder_backward(be, gte.g, gpe.g, dout, tokens, vocab_start, vocab_count, Tw, B, T, C);
    grad_check(K_ENCODER, tag, &gte);
    if (wpe) grad_check(K_ENCODER, tag, &gpe);
    /* Rows of wte no token of the slice uses, and rows of wpe past T: exactly untouched. */
    char *used = xcalloc((size_t)vocab_count, 1);
    for (int64_t bt = 0; bt < BT; bt++) {
        int64_t row = tokens[bt] - vocab_start;
        if (row >= 0 && row < vocab_count) used[row] = 1;
    }
    for (int64_t r = 0; r < vocab_count; r++)
        if (!used[r]) check_all_equal(tag, "dwte row of an unused id", gte.g + r * C, gte.pre + r * C, C);
    free(used);
    if (wpe && Tw > T)
        check_all_equal(tag, "dwpe rows past T", gpe.g + T * C, gpe.pre + T * C, (Tw - T) * C);

    char tag2[200];
    if (wpe) {
        snprintf(tag2, sizeof tag2, "%s, dwpe NULL", tag);
        grad_prefill(&gte);
        k_encoder_backward(be, gte.g, NULL, dout, tokens, vocab_start, vocab_count, Tw, B, T, C);
        grad_check(K_ENCODER, tag2, &gte);
        snprintf(tag2, sizeof tag2, "%s, dwte NULL", tag);
        grad_prefill(&gpe);
        k_encoder_backward(be, NULL, gpe.g, dout, tokens, vocab_start, vocab_count, Tw, B, T, C);
        grad_check(K_ENCODER, tag2, &gpe);
    }

    grad_free(&gte);
    if (wpe) grad_free(&gpe);
    free(c.wte), free(c.wpe), free(c.out), free(c.dout);
    free(tokens), free(wte), free(wpe), free(dout), free(out);
}

/* ---------------------------------------------------------------------------------------------
 * layernorm
 * ------------------------------------------------------------------------------------------- */

struct ln_ctx {
    int64_t N, C;
    double *inp, *w, *b, *out, *mean, *rstd, *dout;
};

static double ln_objective(void *p) {
    struct ln_ctx *c = p;
    ref_layernorm_forward(c->out, c->mean, c->rstd, c->inp, c->w, c->b, c->N, c->C);
    return ref_dot(c->dout, c->out, c->N * c->C);
}

/* inp ~ N(mu, sigma): a small sigma makes the result depend on eps (1e-5) and on the variance
 * being the biased one. */
static void test_layernorm(struct l3d_backend *be, int64_t N, int64_t C, float mu, float sigma,
                           uint64_t s) {
    char tag[128];
    snprintf(tag, sizeof tag, "layernorm N=%lld C=%lld inp~N(%g,%g)", (ll)N, (ll)C, mu, sigma);
    float *inp = frand(N * C, mu, sigma, s + 1), *w = frand(C, 1, 0.5f, s + 2);
    float *b = frand(C, 0, 0.5f, s + 3), *dout = frand(N * C, 0, 1, s + 4);
    float *out = fnan(N * C), *mean = fnan(N), *rstd = fnan(N);
    struct ln_ctx c = {N, C, dcopy(inp, N * C), dcopy(w, C), dcopy(b, C), dalloc(N * C),
                       dalloc(N), dalloc(N), dcopy(dout, N * C)};

    k_layernorm_forward(be, out, mean, rstd, inp, w, b, N, C);
    ln_objective(&c);
    check_fwd(K_LAYERNORM, tag, "out", out, c.out, N * C);
    check_fwd(K_LAYERNORM, tag, "mean", mean, c.mean, N);
    check_fwd(K_LAYERNORM, tag, "rstd", rstd, c.rstd, N);

    struct grad gi = grad_numeric("dinp", c.inp, N * C, ln_objective, &c, s + 11);
    struct grad gw = grad_numeric("dweight", c.w, C, ln_objective, &c, s + 12);
    struct grad gb = grad_numeric("dbias", c.b, C, ln_objective, &c, s + 13);
    grad_prefill(&gi), grad_prefill(&gw), grad_prefill(&gb);
    k_layernorm_backward(be, gi.g, gw.g, gb.g, dout, inp, w, mean, rstd, N, C);
    grad_check(K_LAYERNORM, tag, &gi);
    grad_check(K_LAYERNORM, tag, &gw);
    grad_check(K_LAYERNORM, tag, &gb);

    char tag2[160];
    snprintf(tag2, sizeof tag2, "%s, dinp NULL", tag);
    grad_prefill(&gw), grad_prefill(&gb);
    k_layernorm_backward(be, NULL, gw.g, gb.g, dout, inp, w, mean, rstd, N, C);
    grad_check(K_LAYERNORM, tag2, &gw);
    grad_check(K_LAYERNORM, tag2, &gb);
    snprintf(tag2, sizeof tag2, "%s, dweight and dbias NULL", tag);
    grad_prefill(&gi);
    k_layernorm_backward(be, gi.g, NULL, NULL, dout, inp, w, mean, rstd, N, C);
    grad_check(K_LAYERNORM, tag2, &gi);

    grad_free(&gi), grad_free(&gw), grad_free(&gb);
    free(c.inp), free(c.w), free(c.b), free(c.out), free(c.mean), free(c.rstd), free(c.dout);
    free(inp), free(w), free(b), free(dout), free(out), free(mean), free(rstd);
}

/* ---------------------------------------------------------------------------------------------
 * attention
 * ------------------------------------------------------------------------------------------- */

/* qkv (B,T,NH+2*NKV,HS): the objective repeats the KV heads into full (B,T,3,NH,HS) (the
 * multi-head reference's layout; a copy when NKV == NH), then runs the reference. */
struct att_ctx {
    int64_t B, T, NH, NKV, HS;
    double *qkv, *out, *att, *dout, *full;
};

static double att_objective(void *p) {
    struct att_ctx *c = p;
    ref_gqa_expand(c->full, c->qkv, c->B, c->T, c->NH, c->NKV, c->HS);
    ref_attention_forward(c->out, c->att, c->full, c->B, c->T, c->NH, c->HS);
    return ref_dot(c->dout, c->out, c->B * c->T * c->NH * c->HS);
}

/* Whether got against want fails the forward tolerance somewhere (for the negative cases: an
 * oracle must reject a perturbed input). */
static int fwd_rejects(const float *got, const double *want, int64_t n) {
    double scale = max_abs(want, n);
    for (int64_t i = 0; i < n; i++)
        if (!(fabs((double)got[i] - want[i]) <= FWD_RTOL * (fabs(want[i]) + scale))) return 1;
    return 0;
}

/* The tiled kernel (FlashAttention) against the double reference: out and the per-row
 * log-sum-exp forward, dqkv by finite differences of the reference forward. NKV < NH: grouped-
 * query attention against the reference on explicitly repeated KV heads. */
static void test_attention(struct l3d_backend *be, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                           int64_t HS, float sigma, uint64_t s) {
    char tag[160];
    snprintf(tag, sizeof tag, "attention B=%lld T=%lld NH=%lld NKV=%lld HS=%lld qkv~N(0,%g)",
             (ll)B, (ll)T, (ll)NH, (ll)NKV, (ll)HS, sigma);
    const int64_t nqkv = n_qkv(B, T, NH, NKV, HS), nout = B * T * NH * HS, nlse = B * NH * T;
    float *qkv = frand(nqkv, 0, sigma, s + 1), *dout = frand(nout, 0, 1, s + 2);
    float *out = fnan(nout), *lse = fnan(nlse);
    struct att_ctx c = {B, T, NH, NKV, HS, dcopy(qkv, nqkv), dalloc(nout), NULL,
                        dcopy(dout, nout), dalloc(B * T * 3 * NH * HS)};
    double *lse_ref = dalloc(nlse);

    k_attention_forward(be, out, lse, qkv, B, T, NH, NKV, HS);
    att_objective(&c);
    ref_attention_lse(lse_ref, c.full, B, T, NH, HS);
    check_fwd(K_ATTENTION, tag, "out", out, c.out, nout);
    check_fwd(K_ATTENTION, tag, "lse", lse, lse_ref, nlse);
    if (NKV > 1 && NKV < NH) { /* negative: key heads 0 and 1 swapped (a wrong group mapping) */
        double *sw = dcopy(qkv, nqkv), *want = dalloc(nout);
        for (int64_t bt = 0; bt < B * T; bt++)
            for (int64_t i = 0; i < HS; i++) {
                double *k0 = sw + bt * (NH + 2 * NKV) * HS + NH * HS + i, t0 = k0[0];
                k0[0] = k0[HS], k0[HS] = t0;
            }
        struct att_ctx w = c;
        w.qkv = sw, w.out = want;
        att_objective(&w);
        CHECK(fwd_rejects(out, want, nout));
        free(sw), free(want);
    }

    struct grad gq = grad_numeric("dqkv", c.qkv, nqkv, att_objective, &c, s + 11);
    grad_prefill(&gq);
    k_attention_backward(be, gq.g, dout, qkv, out, lse, B, T, NH, NKV, HS);
    grad_check(K_ATTENTION, tag, &gq);

    grad_free(&gq);
    free(c.qkv), free(c.out), free(c.dout), free(c.full), free(lse_ref);
    free(qkv), free(dout), free(out), free(lse);
}

/* The materialising pair (the benchmark's L3D_ATTENTION=naive), as before the tiled kernel. */
static void test_attention_naive(struct l3d_backend *be, int64_t B, int64_t T, int64_t NH,
                                 int64_t NKV, int64_t HS, float sigma, uint64_t s) {
    char tag[128];
    snprintf(tag, sizeof tag, "attention_naive B=%lld T=%lld NH=%lld NKV=%lld HS=%lld", (ll)B,
             (ll)T, (ll)NH, (ll)NKV, (ll)HS);
    const int64_t nqkv = n_qkv(B, T, NH, NKV, HS), nout = B * T * NH * HS, natt = B * NH * T * T;
    float *qkv = frand(nqkv, 0, sigma, s + 1), *dout = frand(nout, 0, 1, s + 2);
    float *out = fnan(nout), *att = fnan(natt);
    struct att_ctx c = {B, T, NH, NKV, HS, dcopy(qkv, nqkv), dalloc(nout), dalloc(natt),
                        dcopy(dout, nout), dalloc(B * T * 3 * NH * HS)};

    k_attention_naive_forward(be, out, att, qkv, B, T, NH, NKV, HS);
    att_objective(&c);
    check_fwd(K_ATTENTION, tag, "out", out, c.out, nout);
    check_fwd(K_ATTENTION, tag, "att", att, c.att, natt);
    int64_t nbad = 0; /* exactly zero above the diagonal */
    for (int64_t bh = 0; bh < B * NH; bh++)
        for (int64_t t = 0; t < T; t++)
            for (int64_t t2 = t + 1; t2 < T; t2++) nbad += att[(bh * T + t) * T + t2] != 0.0f;
    if (nbad) fprintf(stderr, "FAIL %s: %lld entries of att above the diagonal not 0\n", tag, (ll)nbad);
    CHECK(nbad == 0);

    struct grad gq = grad_numeric("dqkv", c.qkv, nqkv, att_objective, &c, s + 11);
    grad_prefill(&gq);
    float *datt = fnan(natt); /* scratch: overwritten, never read before written */
    k_attention_naive_backward(be, gq.g, datt, dout, qkv, att, B, T, NH, NKV, HS);
    grad_check(K_ATTENTION, tag, &gq);

    grad_free(&gq);
    free(c.qkv), free(c.out), free(c.att), free(c.dout), free(c.full);
    free(qkv), free(dout), free(out), free(att), free(datt);
}

/* The tiled kernel's outputs bit for bit with 1, 2 and 3 threads (its tasks are fixed pieces of
 * work, each run start to end by one thread); and the negative cases of the oracle: a perturbed
 * query, or keys seen from the future, must be rejected. */
static void test_attention_threads(struct l3d_backend *be, int64_t B, int64_t T, int64_t NH,
                                   int64_t NKV, int64_t HS, uint64_t s) {
    char tag[128];
    snprintf(tag, sizeof tag, "attention threads B=%lld T=%lld NH=%lld NKV=%lld HS=%lld", (ll)B,
             (ll)T, (ll)NH, (ll)NKV, (ll)HS);
    const int64_t nqkv = n_qkv(B, T, NH, NKV, HS), nout = B * T * NH * HS, nlse = B * NH * T;
    float *qkv = frand(nqkv, 0, 1, s + 1), *dout = frand(nout, 0, 1, s + 2);
    float *out[3], *lse[3], *dqkv[3];
    int saved = omp_get_max_threads();
    for (int k = 0; k < 3; k++) {
        omp_set_num_threads(k + 1);
        out[k] = fnan(nout), lse[k] = fnan(nlse), dqkv[k] = xcalloc((size_t)nqkv, sizeof(float));
        k_attention_forward(be, out[k], lse[k], qkv, B, T, NH, NKV, HS);
        k_attention_backward(be, dqkv[k], dout, qkv, out[k], lse[k], B, T, NH, NKV, HS);
    }
    omp_set_num_threads(saved);
    for (int k = 1; k < 3; k++) {
        check_all_equal(tag, k == 1 ? "out, 2 threads vs 1" : "out, 3 threads vs 1", out[k], out[0], nout);
        check_all_equal(tag, "lse vs 1 thread", lse[k], lse[0], nlse);
        check_all_equal(tag, "dqkv vs 1 thread", dqkv[k], dqkv[0], nqkv);
    }
    /* negative cases (multi-head layout): the reference on a query perturbed by 1e-3, and
     * without the causal mask */
    for (int k = 0; NKV != NH && k < 3; k++) free(out[k]), free(lse[k]), free(dqkv[k]);
    if (NKV != NH) {
        free(qkv), free(dout);
        return;
    }
    double *dq = dcopy(qkv, nqkv), *want = dalloc(nout);
    dq[(T / 2) * 3 * NH * HS] += 1e-3;
    ref_attention_forward(want, NULL, dq, B, T, NH, HS);
    CHECK(fwd_rejects(out[0], want, nout));
    dq[(T / 2) * 3 * NH * HS] -= 1e-3;
    /* a future key's value changed: the causal output before it must not move, after it must */
    int64_t t_future = T - 1;
    dq[t_future * 3 * NH * HS + 2 * NH * HS] += 1.0; /* v of the last position, head 0 */
    ref_attention_forward(want, NULL, dq, B, T, NH, HS);
    CHECK(!fwd_rejects(out[0], want, (T - 1) * NH * HS)); /* rows before it: same */
    CHECK(fwd_rejects(out[0], want, nout));
    free(dq), free(want);
    for (int k = 0; k < 3; k++) free(out[k]), free(lse[k]), free(dqkv[k]);
    free(qkv), free(dout);
}

/* attention_cached (generation) against the reference rows: n new rows at position pos over a
 * key/value cache with its own strides, the same kernel as training with a query block of n. */
static void test_attention_cached(struct l3d_backend *be, int64_t pos, int64_t n, int64_t NH,
                                  int64_t NKV, int64_t HS, uint64_t s) {
    char tag[128];
    snprintf(tag, sizeof tag, "attention_cached pos=%lld n=%lld NH=%lld NKV=%lld HS=%lld", (ll)pos,
             (ll)n, (ll)NH, (ll)NKV, (ll)HS);
    const int64_t T = pos + n, C = NH * HS, CKV = NKV * HS, CQ = C + 2 * CKV;
    const int64_t nqkv = n_qkv(1, T, NH, NKV, HS);
    float *qkv = frand(nqkv, 0, 1, s + 1);
    /* cache rows of 2 CKV (keys | values), queries rows of CQ, as infer.c lays them out */
    float *kv = falloc(T * 2 * CKV), *out = fnan(n * C);
    for (int64_t t = 0; t < T; t++)
        memcpy(kv + t * 2 * CKV, qkv + t * CQ + C, (size_t)(2 * CKV) * sizeof(float));
    double *d = dcopy(qkv, nqkv), *full = dalloc(T * 3 * C), *want = dalloc(T * C);
    ref_gqa_expand(full, d, 1, T, NH, NKV, HS);
    ref_attention_forward(want, NULL, full, 1, T, NH, HS);
    k_attention_cached(be, out, qkv + pos * CQ, kv, kv + CKV, pos, n, NH, NKV, HS, CQ, 2 * CKV);
    check_fwd(K_ATTENTION, tag, "out", out, want + pos * C, n * C);
    if (pos > 0) CHECK(fwd_rejects(out, want + (pos - 1) * C, n * C)); /* a row off: rejected */
    free(qkv), free(kv), free(out), free(d), free(full), free(want);
}

/* ---------------------------------------------------------------------------------------------
 * gelu
 * ------------------------------------------------------------------------------------------- */

struct gelu_ctx {
    int64_t N;
    double *inp, *out, *dout;
};

static double gelu_objective(void *p) {
    struct gelu_ctx *c = p;
    ref_gelu_forward(c->out, c->inp, c->N);
    return ref_dot(c->dout, c->out, c->N);
}

static void test_gelu(struct l3d_backend *be, int64_t N, float sigma, uint64_t s) {
    char tag[128];
    snprintf(tag, sizeof tag, "gelu N=%lld inp~N(0,%g)", (ll)N, sigma);
    float *inp = frand(N, 0, sigma, s + 1), *dout = frand(N, 0, 1, s + 2), *out = fnan(N);
    /* The interesting points: 0, the tails where tanh saturates, the bend near -0.75. */
    const float special[] = {0.0f, -0.75f, 1.0f, -3.0f, 4.5f, -9.0f, 12.0f, -20.0f, 1e-4f};
    for (int64_t k = 0; k < (int64_t)(sizeof special / sizeof special[0]) && 3 * k < N; k++)
        inp[3 * k] = special[k];
    struct gelu_ctx c = {N, dcopy(inp, N), dalloc(N), dcopy(dout, N)};

    k_gelu_forward(be, out, inp, N);
    gelu_objective(&c);
    check_fwd(K_GELU, tag, "out", out, c.out, N);

    struct grad gi = grad_numeric("dinp", c.inp, N, gelu_objective, &c, s + 11);
    grad_prefill(&gi);
    k_gelu_backward(be, gi.g, dout, inp, N);
    grad_check(K_GELU, tag, &gi);

    grad_free(&gi);
    free(c.inp), free(c.out), free(c.dout);
    free(inp), free(dout), free(out);
}

/* ---------------------------------------------------------------------------------------------
 * residual and add_inplace (its backward)
 * ------------------------------------------------------------------------------------------- */

struct res_ctx {
    int64_t N;
    double *a, *b, *out, *dout;
};

static double res_objective(void *p) {
    struct res_ctx *c = p;
    ref_residual_forward(c->out, c->a, c->b, c->N);
    return ref_dot(c->dout, c->out, c->N);
}

static void test_residual(struct l3d_backend *be, int64_t N, uint64_t s) {
    char tag[128];
    snprintf(tag, sizeof tag, "residual N=%lld", (ll)N);
    float *a = frand(N, 0, 1, s + 1), *b = frand(N, 0, 1, s + 2), *dout = frand(N, 0, 1, s + 3);
    float *out = fnan(N), *want = falloc(N);
    struct res_ctx c = {N, dcopy(a, N), dcopy(b, N), dalloc(N), dcopy(dout, N)};

    k_residual_forward(be, out, a, b, N);
    res_objective(&c);
    check_fwd(K_RESIDUAL, tag, "out", out, c.out, N);
    for (int64_t i = 0; i < N; i++) want[i] = a[i] + b[i]; /* one rounding: exact */
    check_all_equal(tag, "out == a + b in float", out, want, N);

    /* Backward: add_inplace of dout into da and db. */
    struct grad ga = grad_numeric("da", c.a, N, res_objective, &c, s + 11);
    struct grad gb = grad_numeric("db", c.b, N, res_objective, &c, s + 12);
    grad_prefill(&ga), grad_prefill(&gb);
    k_add_inplace(be, ga.g, dout, N);
    k_add_inplace(be, gb.g, dout, N);
    grad_check(K_RESIDUAL, tag, &ga);
    grad_check(K_RESIDUAL, tag, &gb);
    for (int64_t i = 0; i < N; i++) want[i] = ga.pre[i] + dout[i];
    check_all_equal(tag, "add_inplace == dst + src in float", ga.g, want, N);

    grad_free(&ga), grad_free(&gb);
    free(c.a), free(c.b), free(c.out), free(c.dout);
    free(a), free(b), free(dout), free(out), free(want);
}

/* ---------------------------------------------------------------------------------------------
 * The Llama blocks: RMSNorm, rotary positions (and their frequencies), SwiGLU
 * ------------------------------------------------------------------------------------------- */

/* The negative case of a forward oracle: the output with one entry moved by 4 tolerances, and
 * with a NaN, must both be rejected. */
static void check_rejects_perturbed(const float *got, const double *want, int64_t n) {
    float *bad = falloc(n);
    memcpy(bad, got, (size_t)n * sizeof(float));
    int64_t k = n / 2;
    double tol = FWD_RTOL * (fabs(want[k]) + max_abs(want, n));
    bad[k] = (float)(want[k] + (tol > 0 ? 4.0 * tol : 1.0));
    CHECK(fwd_rejects(bad, want, n));
    bad[k] = NAN;
    CHECK(fwd_rejects(bad, want, n));
    free(bad);
}

static void k_rmsnorm_forward(struct l3d_backend *be, float *out, float *rstd, const float *inp,
                              const float *w, int64_t N, int64_t C, float eps) {
    struct stage s = {.be = be};
    l3d_be_rmsnorm_forward(be, L3D_F32, out_f(&s, out, N * C), out_f(&s, rstd, N),
                           in_f(&s, inp, N * C), in_f(&s, w, C), N, C, eps);
    stage_done(&s);
}
static void k_rmsnorm_backward(struct l3d_backend *be, float *dinp, float *dw, const float *dout,
                               const float *inp, const float *w, const float *rstd, int64_t N,
                               int64_t C) {
    struct stage s = {.be = be};
    l3d_be_rmsnorm_backward(be, L3D_F32, L3D_F32, out_f(&s, dinp, N * C), out_f(&s, dw, C),
                            in_f(&s, dout, N * C), in_f(&s, inp, N * C), in_f(&s, w, C),
                            in_f(&s, rstd, N), N, C);
    stage_done(&s);
}

struct rms_ctx {
    int64_t N, C;
    double eps, *inp, *w, *out, *rstd, *dout;
};

static double rms_objective(void *p) {
    struct rms_ctx *c = p;
    ref_rmsnorm_forward(c->out, c->rstd, c->inp, c->w, c->N, c->C, c->eps);
    return ref_dot(c->dout, c->out, c->N * c->C);
}

/* inp ~ N(mu, sigma): a small sigma makes mean(x^2) ~ eps, where eps shows (the negative case:
 * the reference without eps is rejected there). */
static void test_rmsnorm(struct l3d_backend *be, int64_t N, int64_t C, float mu, float sigma,
                         float eps, uint64_t s) {
    char tag[128];
    snprintf(tag, sizeof tag, "rmsnorm N=%lld C=%lld inp~N(%g,%g) eps %g", (ll)N, (ll)C, mu,
             sigma, eps);
    float *inp = frand(N * C, mu, sigma, s + 1), *w = frand(C, 1, 0.5f, s + 2);
    float *dout = frand(N * C, 0, 1, s + 4), *out = fnan(N * C), *rstd = fnan(N);
    struct rms_ctx c = {N, C, eps, dcopy(inp, N * C), dcopy(w, C), dalloc(N * C), dalloc(N),
                        dcopy(dout, N * C)};

    k_rmsnorm_forward(be, out, rstd, inp, w, N, C, eps);
    rms_objective(&c);
    check_fwd(K_RMSNORM, tag, "out", out, c.out, N * C);
    check_fwd(K_RMSNORM, tag, "rstd", rstd, c.rstd, N);
    check_rejects_perturbed(out, c.out, N * C);
    if (sigma < 0.1f && fabsf(mu) < 0.1f) {
        struct rms_ctx z = c;
        z.eps = 0.0, z.out = dalloc(N * C), z.rstd = dalloc(N);
        rms_objective(&z);
        CHECK(fwd_rejects(out, z.out, N * C));
        free(z.out), free(z.rstd);
    }

    struct grad gi = grad_numeric("dinp", c.inp, N * C, rms_objective, &c, s + 11);
    struct grad gw = grad_numeric("dweight", c.w, C, rms_objective, &c, s + 12);
    grad_prefill(&gi), grad_prefill(&gw);
    k_rmsnorm_backward(be, gi.g, gw.g, dout, inp, w, rstd, N, C);
    grad_check(K_RMSNORM, tag, &gi);
    grad_check(K_RMSNORM, tag, &gw);
    char tag2[160];
    snprintf(tag2, sizeof tag2, "%s, dinp NULL", tag);
    grad_prefill(&gw);
    k_rmsnorm_backward(be, NULL, gw.g, dout, inp, w, rstd, N, C);
    grad_check(K_RMSNORM, tag2, &gw);
    snprintf(tag2, sizeof tag2, "%s, dweight NULL", tag);
    grad_prefill(&gi);
    k_rmsnorm_backward(be, gi.g, NULL, dout, inp, w, rstd, N, C);
    grad_check(K_RMSNORM, tag2, &gi);

    grad_free(&gi), grad_free(&gw);
    free(c.inp), free(c.w), free(c.out), free(c.rstd), free(c.dout);
    free(inp), free(w), free(dout), free(out), free(rstd);
}

/* rope_forward (bwd 0) or rope_backward (1) in place on x (B,T,NH+2*NKV,HS) */
static void k_rope(struct l3d_backend *be, int bwd, float *x, const float *inv_freq,
                   const int32_t *pos, int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS) {
    struct stage s = {.be = be};
    float *dx = out_f(&s, x, n_qkv(B, T, NH, NKV, HS));
    const float *df = in_f(&s, inv_freq, HS / 2);
    const int32_t *dp = in_i(&s, pos, T);
    if (bwd)
        l3d_be_rope_backward(be, L3D_F32, dx, df, dp, B, T, NH, NKV, HS);
    else
        l3d_be_rope_forward(be, L3D_F32, dx, df, dp, B, T, NH, NKV, HS);
    stage_done(&s);
}

/* The frequencies of a head size HS at base theta, from the model's function (its own test:
 * test_rope_inv_freq). */
static float *rope_freqs(int64_t HS, double theta) {
    struct l3d_model_spec m = {.C = (int)HS * 2, .NH = 2, .rope = {.theta = theta}};
    float *f = falloc(HS / 2);
    l3d_rope_inv_freq(&m, f);
    return f;
}

struct rope_ctx {
    int64_t B, T, NH, NKV, HS;
    const int32_t *pos;
    double *freq, *qkv, *out, *w;
};

static double rope_objective(void *p) {
    struct rope_ctx *c = p;
    ref_rope_forward(c->out, c->qkv, c->freq, c->pos, c->B, c->T, c->NH, c->NKV, c->HS);
    return ref_dot(c->w, c->out, n_qkv(c->B, c->T, c->NH, c->NKV, c->HS));
}

/* RoPE at the positions pos (T of them, any values): forward against the reference (the value
 * heads bit for bit untouched), backward (in place, not +=) against finite differences, and the
 * backward as the transpose of the forward: <R x, y> = <x, R^T y>. Negative cases: the reference
 * at positions one further on, a perturbed output, and the identity with R in place of R^T. */
static void test_rope(struct l3d_backend *be, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                      int64_t HS, const int32_t *pos, double theta, uint64_t s) {
    char tag[160];
    snprintf(tag, sizeof tag, "rope B=%lld T=%lld NH=%lld NKV=%lld HS=%lld pos[0]=%d theta %g",
             (ll)B, (ll)T, (ll)NH, (ll)NKV, (ll)HS, pos[0], theta);
    const int64_t n = n_qkv(B, T, NH, NKV, HS), CQ = (NH + 2 * NKV) * HS;
    float *freq = rope_freqs(HS, theta), *x = frand(n, 0, 1, s + 1), *w = frand(n, 0, 1, s + 2);
    float *out = falloc(n);
    memcpy(out, x, (size_t)n * sizeof(float));
    struct rope_ctx c = {B, T, NH, NKV, HS, pos, dcopy(freq, HS / 2), dcopy(x, n), dalloc(n),
                         dcopy(w, n)};
    k_rope(be, 0, out, freq, pos, B, T, NH, NKV, HS);
    rope_objective(&c);
    check_fwd(K_ROPE, tag, "out", out, c.out, n);
    for (int64_t bt = 0; bt < B * T; bt++) {
        int64_t v = bt * CQ + (NH + NKV) * HS;
        check_all_equal(tag, "value heads untouched", out + v, x + v, NKV * HS);
    }
    check_rejects_perturbed(out, c.out, n);
    int32_t *later = ialloc(T);
    for (int64_t t = 0; t < T; t++) later[t] = pos[t] + 1;
    struct rope_ctx o = c;
    o.pos = later, o.out = dalloc(n);
    rope_objective(&o);
    CHECK(fwd_rejects(out, o.out, n));
    free(o.out), free(later);

    struct grad gq = grad_numeric("dqkv", c.qkv, n, rope_objective, &c, s + 11);
    memset(gq.pre, 0, (size_t)n * sizeof(float)); /* in place: d(rotated) in, d(qkv) out */
    memcpy(gq.g, w, (size_t)n * sizeof(float));
    k_rope(be, 1, gq.g, freq, pos, B, T, NH, NKV, HS);
    grad_check(K_ROPE, tag, &gq);

    /* <R x, y> = <x, R^T y>, with out = R x and gq.g = R^T w; negative: R w for R^T w */
    float *rw = falloc(n);
    memcpy(rw, w, (size_t)n * sizeof(float));
    k_rope(be, 0, rw, freq, pos, B, T, NH, NKV, HS);
    double lhs = 0, rhs = 0, wrong = 0, mag = 0;
    for (int64_t i = 0; i < n; i++) {
        lhs += (double)out[i] * w[i];
        rhs += (double)x[i] * gq.g[i];
        wrong += (double)x[i] * rw[i];
        mag += fabs((double)out[i] * w[i]) + fabs((double)x[i] * gq.g[i]);
    }
    CHECK(fabs(lhs - rhs) <= FWD_RTOL * mag);
    CHECK(!(fabs(lhs - wrong) <= FWD_RTOL * mag));
    grad_free(&gq);
    free(c.freq), free(c.qkv), free(c.out), free(c.w);
    free(freq), free(x), free(w), free(out), free(rw);
}

/* l3d_rope_inv_freq against values computed independently (Python, in double, from the formula
 * of Su et al. 2021 and Llama 3.1's scaling as transformers' _compute_llama3_parameters states
 * it), one entry of each branch; within 2 ulp of fp32. */
static void test_rope_inv_freq(void) {
    /* Llama 3.1 8B: head size 4096/32 = 128, theta 5e5, factor 8, low 1, high 4, context 8192:
     * wavelengths above 8192 are divided by 8, below 2048 kept, between interpolated. */
    struct l3d_model_spec m = {.C = 4096, .NH = 32, .rope = {500000.0, 8.0, 1.0, 4.0, 8192}};
    float f[64];
    const struct {
        int i;
        double want;
    } e[] = {
        {0, 1.0},                      /* 5e5^0; wavelength 2 pi: kept */
        {28, 0.003211445994752591},    /* 5e5^(-56/128); wavelength 1956.5 < 2048: kept */
        /* 5e5^(-1/2) = 1/sqrt(5e5) = 0.00141421356; wavelength 2 pi sqrt(5e5) = 4442.88, so
         * s = (8192 / 4442.88 - 1) / 3 = 0.2812826; (1 - s) f / 8 + s f = f (1 + 7 s) / 8 */
        {32, 0.0005248461609929547},
        {34, 0.0001785078127679964},   /* wavelength 6695.1: s = 0.0745266 */
        {40, 3.428102195952591e-05},   /* 5e5^(-80/128) = 2.742482e-4 (wavelength 22910.6) / 8 */
        {63, 3.068925988914511e-07},   /* 5e5^(-126/128) = 2.455141e-6, / 8 */
    };
    l3d_rope_inv_freq(&m, f);
    for (size_t k = 0; k < sizeof e / sizeof e[0]; k++)
        CHECK_NEAR(f[e[k].i], e[k].want, 0x1p-23 * e[k].want);
    struct l3d_model_spec u = m; /* negative: without the scaling, entry 40 is 8 times larger */
    u.rope.factor = 0.0;
    l3d_rope_inv_freq(&u, f);
    CHECK(!(fabs(f[40] - 3.428102195952591e-05) <= 0x1p-23 * 3.428102195952591e-05));
    CHECK_NEAR(f[40], 0.0002742481756762073, 0x1p-23 * 0.0002742481756762073);
    /* Llama 2: theta 1e4 (the spec's 0), head size 128: 1e4^(-2/128) = 0.86596432336 */
    struct l3d_model_spec l2 = {.C = 4096, .NH = 32};
    l3d_rope_inv_freq(&l2, f);
    CHECK_NEAR(f[1], 0.8659643233600653, 0x1p-23);
    /* GPT-2's head size 64: 1e4^(-62/64) = 1.333521432e-4 */
    struct l3d_model_spec g = {.C = 768, .NH = 12, .rope = {.theta = 10000.0}};
    l3d_rope_inv_freq(&g, f);
    CHECK_NEAR(f[31], 0.0001333521432163324, 0x1p-23 * 0.0001333521432163324);
}

static void k_swiglu_forward(struct l3d_backend *be, float *out, const float *inp, int64_t N,
                             int64_t H) {
    struct stage s = {.be = be};
    l3d_be_swiglu_forward(be, L3D_F32, out_f(&s, out, N * H), in_f(&s, inp, N * 2 * H), N, H);
    stage_done(&s);
}
static void k_swiglu_backward(struct l3d_backend *be, float *dinp, const float *dout,
                              const float *inp, int64_t N, int64_t H) {
    struct stage s = {.be = be};
    l3d_be_swiglu_backward(be, L3D_F32, out_f(&s, dinp, N * 2 * H), in_f(&s, dout, N * H),
                           in_f(&s, inp, N * 2 * H), N, H);
    stage_done(&s);
}

struct swiglu_ctx {
    int64_t N, H;
    double *inp, *out, *dout;
};

static double swiglu_objective(void *p) {
    struct swiglu_ctx *c = p;
    ref_swiglu_forward(c->out, c->inp, c->N, c->H);
    return ref_dot(c->dout, c->out, c->N * c->H);
}

static void test_swiglu(struct l3d_backend *be, int64_t N, int64_t H, float sigma, uint64_t s) {
    char tag[128];
    snprintf(tag, sizeof tag, "swiglu N=%lld H=%lld inp~N(0,%g)", (ll)N, (ll)H, sigma);
    float *inp = frand(N * 2 * H, 0, sigma, s + 1), *dout = frand(N * H, 0, 1, s + 2);
    float *out = fnan(N * H);
    /* gates at 0, in both tails (sigmoid saturated) and at the bend of silu near -1.28 */
    const float special[] = {0.0f, -1.28f, 1.0f, -6.0f, 9.0f, -20.0f, 30.0f, -90.0f, 1e-4f};
    for (int64_t k = 0; k < (int64_t)(sizeof special / sizeof special[0]) && k < N * H; k++)
        inp[(k % N) * 2 * H + (3 * k) % H] = special[k];
    struct swiglu_ctx c = {N, H, dcopy(inp, N * 2 * H), dalloc(N * H), dcopy(dout, N * H)};

    k_swiglu_forward(be, out, inp, N, H);
    swiglu_objective(&c);
    check_fwd(K_SWIGLU, tag, "out", out, c.out, N * H);
    check_rejects_perturbed(out, c.out, N * H);

    struct grad gi = grad_numeric("dinp", c.inp, N * 2 * H, swiglu_objective, &c, s + 11);
    grad_prefill(&gi);
    k_swiglu_backward(be, gi.g, dout, inp, N, H);
    grad_check(K_SWIGLU, tag, &gi);

    grad_free(&gi);
    free(c.inp), free(c.out), free(c.dout);
    free(inp), free(dout), free(out);
}

/* ---------------------------------------------------------------------------------------------
 * cross-entropy: xent_max, xent_sumexp, the loss as the model forms it, xent_backward
 * ------------------------------------------------------------------------------------------- */

struct xent_ctx {
    int64_t N, Vl, Vvalid, vocab_start;
    const int32_t *targets;
    double *logits, *loss, dloss;
};

static double xent_objective(void *p) {
    struct xent_ctx *c = p;
    ref_xent_loss(c->loss, c->logits, c->targets, c->vocab_start, c->N, c->Vl, c->Vvalid);
    double s = 0.0;
    for (int64_t n = 0; n < c->N; n++) s += c->loss[n];
    return c->dloss * s;
}

/* logits (N,Vl) ~ N(0,sigma) in the Vvalid real columns, +-1e30 in the padding; targets drawn
 * from [0, Vtotal), the slice being [vocab_start, vocab_start+Vvalid). */
static void test_xent(struct l3d_backend *be, int64_t N, int64_t Vl, int64_t Vvalid,
                      int64_t vocab_start, int64_t Vtotal, float sigma, uint64_t s) {
    char tag[160];
    snprintf(tag, sizeof tag, "xent N=%lld Vl=%lld Vvalid=%lld slice [%lld,%lld) of %lld logits~N(0,%g)",
             (ll)N, (ll)Vl, (ll)Vvalid, (ll)vocab_start, (ll)(vocab_start + Vvalid), (ll)Vtotal,
             sigma);
    float *logits = frand(N * Vl, 0, sigma, s + 1);
    for (int64_t n = 0; n < N; n++)
        for (int64_t j = Vvalid; j < Vl; j++) logits[n * Vl + j] = (j % 2) ? -1e30f : 1e30f;
    int32_t *targets = ialloc(N);
    ref_fill_tokens(targets, N, 0, (int32_t)Vtotal, SEED, s + 2);
    if (N >= 2) { /* the slice's edges */
        targets[0] = (int32_t)vocab_start;
        targets[N - 1] = (int32_t)(vocab_start + Vvalid - 1);
    }
    if (N >= 3 && Vtotal > Vvalid) targets[1] = (int32_t)(vocab_start > 0 ? vocab_start - 1 : vocab_start + Vvalid);
    float *maxv = fnan(N), *sumexp = fnan(N), *tlogit = fnan(N);
    struct xent_ctx c = {N, Vl, Vvalid, vocab_start, targets, dcopy(logits, N * Vl), dalloc(N), 0.37};

    k_xent_max(be, maxv, logits, N, Vl, Vvalid);
    k_xent_sumexp(be, sumexp, tlogit, logits, maxv, targets, vocab_start, N, Vl, Vvalid);
    /* maxv: the exact max of the real columns. tlogit: the exact target logit, or 0. */
    float *want = falloc(N), *want_t = falloc(N);
    double *want_s = dalloc(N);
    int64_t nin = 0;
    for (int64_t n = 0; n < N; n++) {
        const float *l = logits + n * Vl;
        float mx = l[0];
        for (int64_t j = 1; j < Vvalid; j++) mx = l[j] > mx ? l[j] : mx;
        want[n] = mx;
        double se = 0.0;
        for (int64_t j = 0; j < Vvalid; j++) se += exp((double)l[j] - (double)maxv[n]);
        want_s[n] = se;
        int64_t tc = targets[n] - vocab_start;
        int in = tc >= 0 && tc < Vvalid;
        nin += in;
        want_t[n] = in ? l[tc] : 0.0f;
    }
    CHECK(nin > 0);
    CHECK(nin < N || Vtotal == Vvalid || N < 3);
    check_all_equal(tag, "maxv", maxv, want, N);
    check_all_equal(tag, "tlogit", tlogit, want_t, N);
    check_fwd(K_XENT, tag, "sumexp", sumexp, want_s, N);
    /* The loss as the model forms it after its all-reduces: log(sumexp) + max - tlogit. */
    double *loss = dalloc(N);
    for (int64_t n = 0; n < N; n++) loss[n] = log((double)sumexp[n]) + maxv[n] - tlogit[n];
    xent_objective(&c);
    check_close(K_XENT, 0, tag, "loss", loss, NULL, c.loss, N, FWD_RTOL);

    /* Backward in place: dlogits = (softmax - onehot) * dloss, against d(dloss * sum loss). */
    struct grad gl = grad_numeric("dlogits", c.logits, N * Vl, xent_objective, &c, s + 11);
    memcpy(gl.g, logits, (size_t)(N * Vl) * sizeof(float));
    memset(gl.pre, 0, (size_t)(N * Vl) * sizeof(float)); /* overwritten, not accumulated */
    k_xent_backward(be, gl.g, maxv, sumexp, targets, (float)c.dloss, vocab_start, N, Vl,
                         Vvalid);
    grad_check(K_XENT, tag, &gl);
    /* Padding: exactly 0 (the sample above may miss it). */
    if (Vl > Vvalid) {
        float *zero = xcalloc((size_t)(Vl - Vvalid), sizeof(float));
        for (int64_t n = 0; n < N; n++)
            check_all_equal(tag, "dlogits padding", gl.g + n * Vl + Vvalid, zero, Vl - Vvalid);
        free(zero);
    }

    grad_free(&gl);
    free(c.logits), free(c.loss);
    free(logits), free(targets), free(maxv), free(sumexp), free(tlogit), free(want), free(want_t);
    free(want_s), free(loss);
}

/* ---------------------------------------------------------------------------------------------
 * adamw, sumsq
 * ------------------------------------------------------------------------------------------- */

static void test_adamw(struct l3d_backend *be, int64_t n, float lr, float beta1, float beta2,
                       float eps, float wd, float gscale, float clip, uint64_t s) {
    char tag[180];
    snprintf(tag, sizeof tag, "adamw n=%lld lr=%g beta1=%g beta2=%g eps=%g wd=%g |g|~%g clip x%g, "
             "3 steps", (ll)n, lr, beta1, beta2, eps, wd, gscale, clip);
    float *p = frand(n, 0, 1, s + 1), *m = falloc(n), *v = falloc(n), *g = falloc(n);
    memset(m, 0, (size_t)n * sizeof(float));
    memset(v, 0, (size_t)n * sizeof(float));
    double *pd = dcopy(p, n), *md = dcopy(m, n), *vd = dcopy(v, n), *gd = dalloc(n);
    for (int t = 1; t <= 3; t++) {
        ref_fill_normal(g, n, 0, gscale, SEED, s + 10 + (uint64_t)t);
        ref_to_double(gd, g, n);
        for (int64_t i = 0; i < n; i++) gd[i] *= clip; /* the clipped gradient */
        float bc1 = 1.0f - powf(beta1, (float)t), bc2 = 1.0f - powf(beta2, (float)t);
        k_adamw(be, p, m, v, g, clip, n, lr, beta1, beta2, eps, wd, bc1, bc2);
        ref_adamw(pd, md, vd, gd, n, lr, beta1, beta2, eps, wd, bc1, bc2);
    }
    /* Each entry moves by ~lr per step; fp32 keeps ~1e-7 of |param|, far below 1e-5 of it. */
    check_fwd(K_ADAMW, tag, "param", p, pd, n);
    check_fwd(K_ADAMW, tag, "m", m, md, n);
    check_fwd(K_ADAMW, tag, "v", v, vd, n);
    free(p), free(m), free(v), free(g), free(pd), free(md), free(vd), free(gd);
}

static void test_sumsq(struct l3d_backend *be, int64_t n, float sigma, uint64_t s) {
    float *x = frand(n, 0, sigma, s);
    double want = 0.0;
    for (int64_t i = 0; i < n; i++) want += (double)x[i] * (double)x[i];
    double got = 0.0;
    k_sumsq(be, &got, x, n);
    /* Accumulated in double, any order: within 1e-7 even with each square rounded to float
     * (relative error <= 2^-24 per term); a float accumulator over many terms is not. */
    double tol = 1e-7 * want;
    double r = want > 0 ? fabs(got - want) / tol : (got == 0.0 ? 0.0 : INFINITY);
    if (r > margin[K_SUMSQ][0]) margin[K_SUMSQ][0] = r;
    if (!(fabs(got - want) <= tol)) fprintf(stderr, "FAIL sumsq n=%lld:\n", (ll)n);
    CHECK_NEAR(got, want, tol);
    free(x);
}

/* ------------------------------------------------------------------------------------------- */

/* ---------------------------------------------------------------------------------------------
 * Mixed precision: every kernel in bf16 and fp16 against the fp32 kernel (itself checked against
 * the double reference above) run on the same inputs, rounded to the 16-bit format first so that
 * both see exactly the same values.
 *
 * Tolerances, from the format's unit roundoff u (half an ulp at 1: bf16 2^-8, fp16 2^-11). The
 * 16-bit kernels widen their operands to fp32 (exact), compute in fp32 and round each output
 * once (an accumulated gradient: old + delta, rounded once). So a 16-bit output y16 and the fp32
 * kernel's y32 differ by
 *     |y16 - y32| <= r u |y32| + d,
 * r the number of 16-bit roundings on the value's path (1 for every output here; 0 for the fp32
 * outputs mean, rstd, lse, maxv, sumexp and an fp32 main_grad; the number of occurrences of a
 * token for a 16-bit embedding gradient, which adds each occurrence), and d the difference of two
 * fp32 computations of the same value in another order or by another product kernel (oneDNN's
 * bf16 matmul against sgemm): at most ~ k 2^-24 sum|terms| for a sum of k terms. The check is
 *     |got - want| <= r (u |want| + s) + k 2^-23 (|want| + max|want|),
 * s = 2^-25 for fp16 (half its subnormal spacing: below 2^-14 the rounding error is absolute),
 * k the length of the longest fp32 sum behind the value (C or OC for a product, N for a column
 * sum, T for attention, Vvalid for the softmax), the max|want| term covering sums that cancel
 * (sum|terms| is ~ sqrt(k) max|want| for these random inputs, well inside k 2^-23 max|want|).
 * Round to nearest even gives |y16 - y32| <= u |y32| exactly, so the worst err/tol printed at the
 * end approaches 1 from below; truncation (up to 2u), a second rounding, a wrong element or 16-bit
 * accumulation (k roundings) exceeds it. Every check is followed by its negative case: the same
 * oracle must reject the output with one entry moved by twice its tolerance, and with a NaN.
 * ------------------------------------------------------------------------------------------- */

static double unit_roundoff(enum l3d_dtype t) {
    return t == L3D_BF16 ? 0x1p-8 : t == L3D_F16 ? 0x1p-11 : 0x1p-24;
}
/* The tolerance of one entry: r roundings of the value itself (plus half fp16's smallest
 * subnormal spacing, for outputs in fp16's subnormal range), and k fp32 operations' worth of
 * the tensor's scale. */
struct mp_tol {
    double r, k, a; /* a: roundings of the tensor's scale (the bf16 dot products' operands) */
};
static double mp_tol_at(enum l3d_dtype t, struct mp_tol tl, double want, double scale) {
    double sub = t == L3D_F16 ? 0x1p-25 : 0.0;
    return tl.r * (unit_roundoff(t) * fabs(want) + sub) + tl.k * 0x1p-23 * (fabs(want) + scale) +
           tl.a * unit_roundoff(t) * scale;
}

/* x rounded to type t in place (exactly representable afterwards) */
static void q16(enum l3d_dtype t, float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        if (t == L3D_BF16) x[i] = l3d_bf16_to_f32(l3d_f32_to_bf16(x[i]));
        if (t == L3D_F16) x[i] = l3d_f16_to_f32(l3d_f32_to_f16(x[i]));
    }
}
static float *qrand(enum l3d_dtype t, int64_t n, float mean, float std, uint64_t stream) {
    float *x = frand(n, mean, std, stream);
    q16(t, x, n);
    return x;
}
static float *fdup(const float *x, int64_t n) {
    if (!x) return NULL;
    float *y = falloc(n);
    memcpy(y, x, (size_t)n * sizeof(float));
    return y;
}

/* Staging in a given element type: host fp32 arrays converted to t on upload, widened back on
 * download (outputs). */
#define MS_MAX 12
struct mstage {
    struct l3d_backend *be;
    int n;
    struct {
        float *host;
        void *dev;
        int64_t count;
        enum l3d_dtype t;
        int out;
    } a[MS_MAX];
};

static void *ms(struct mstage *s, enum l3d_dtype t, const float *h, int64_t n, int out) {
    if (!h) return NULL;
    L3D_ASSERT(s->n < MS_MAX);
    size_t e = l3d_dtype_size(t);
    void *tmp = xmalloc((size_t)n * e);
    for (int64_t i = 0; i < n; i++) {
        if (t == L3D_F32) ((float *)tmp)[i] = h[i];
        if (t == L3D_BF16) ((uint16_t *)tmp)[i] = l3d_f32_to_bf16(h[i]);
        if (t == L3D_F16) ((uint16_t *)tmp)[i] = l3d_f32_to_f16(h[i]);
    }
    void *dev = l3d_be_alloc(s->be, (size_t)n * e, "test staging");
    L3D_ASSERT(dev != NULL);
    l3d_be_copy_h2d(s->be, dev, tmp, (size_t)n * e);
    free(tmp);
    s->a[s->n].host = (float *)h;
    s->a[s->n].dev = dev;
    s->a[s->n].count = n;
    s->a[s->n].t = t;
    s->a[s->n].out = out;
    s->n++;
    return dev;
}
static void ms_done(struct mstage *s) {
    for (int i = 0; i < s->n; i++) {
        if (s->a[i].out) {
            enum l3d_dtype t = s->a[i].t;
            int64_t n = s->a[i].count;
            void *tmp = xmalloc((size_t)n * l3d_dtype_size(t));
            l3d_be_copy_d2h(s->be, tmp, s->a[i].dev, (size_t)n * l3d_dtype_size(t));
            for (int64_t k = 0; k < n; k++) {
                float *h = s->a[i].host;
                if (t == L3D_F32) h[k] = ((float *)tmp)[k];
                if (t == L3D_BF16) h[k] = l3d_bf16_to_f32(((uint16_t *)tmp)[k]);
                if (t == L3D_F16) h[k] = l3d_f16_to_f32(((uint16_t *)tmp)[k]);
            }
            free(tmp);
        }
        l3d_be_free(s->be, s->a[i].dev);
    }
    s->n = 0;
}

static double mp_margin[K_COUNT][2]; /* worst err/tol per kernel, [0] bf16, [1] fp16 */

/* Entries of got outside |got - want| <= mp_tol_at (NaN-aware); *worst the largest err/tol,
 * *worst_i where. */
static int64_t mp_bad(enum l3d_dtype t, const float *got, const float *want, int64_t n,
                      struct mp_tol tl, double *worst, int64_t *worst_i) {
    double scale = 0.0;
    for (int64_t i = 0; i < n; i++) scale = test_max(scale, fabs((double)want[i]));
    int64_t nbad = 0;
    *worst = 0.0;
    *worst_i = 0;
    for (int64_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - want[i]), tol = mp_tol_at(t, tl, want[i], scale);
        double r = err <= tol ? (tol > 0 ? err / tol : 0.0) : INFINITY;
        if (!(err <= tol)) {
            nbad++;
            r = tol > 0 && !isnan(err) ? err / tol : INFINITY;
        }
        if (r > *worst || (isnan(r))) {
            *worst = r;
            *worst_i = i;
        }
    }
    return nbad;
}

/* got (the 16-bit kernel's output, widened) against want (the fp32 kernel's), then the negative
 * cases: one entry moved by twice its tolerance, and a NaN, must both be rejected. */
static void mp_check_a(enum kern kern, enum l3d_dtype t, const char *tag, const char *what,
                       const float *got, const float *want, int64_t n, double r, double k_ops,
                       double a) {
    struct mp_tol tl = {r, k_ops, a};
    double worst;
    int64_t wi;
    int64_t nbad = mp_bad(t, got, want, n, tl, &worst, &wi);
    int slot = t == L3D_F16;
    if (worst > mp_margin[kern][slot]) mp_margin[kern][slot] = worst;
    test_checks++;
    if (nbad) {
        test_failures++;
        fprintf(stderr, "FAIL %s %s: %s: %lld of %lld entries out of tolerance; worst [%lld]: "
                "got %.9g, want %.9g (%g roundings + %g fp32 ops)\n", tag, l3d_dtype_name(t),
                what, (ll)nbad, (ll)n, (ll)wi, got[wi], want[wi], r, k_ops);
    }
    if (n == 0) return;
    float *bad = fdup(got, n);
    double scale = 0.0;
    for (int64_t i = 0; i < n; i++) scale = test_max(scale, fabs((double)want[i]));
    int64_t k = n / 2;
    double tol = mp_tol_at(t, tl, want[k], scale);
    bad[k] = (float)((double)want[k] + (tol > 0 ? 2.0 * tol : 1e-30));
    int64_t dummy;
    if (bad[k] != want[k]) CHECK(mp_bad(t, bad, want, n, tl, &worst, &dummy) > 0);
    bad[k] = got[k];
    bad[n - 1] = NAN;
    CHECK(mp_bad(t, bad, want, n, tl, &worst, &dummy) > 0);
    free(bad);
}
static void mp_check(enum kern kern, enum l3d_dtype t, const char *tag, const char *what,
                     const float *got, const float *want, int64_t n, double r, double k_ops) {
    mp_check_a(kern, t, tag, what, got, want, n, r, k_ops, 0.0);
}

static const enum l3d_dtype mp_types[2] = {L3D_BF16, L3D_F16};

/* -- conversions, and the loss-scaling check -- */

static void mp_convert(struct l3d_backend *be) {
    /* specials, ties, the fp16 range edges and subnormals, then random values of many scales */
    const float sp[] = {0.0f, -0.0f, 1.0f, -1.0f, INFINITY, -INFINITY, NAN, -NAN,
                        1.0f + 0x1p-8f, 1.0f + 0x1p-8f + 0x1p-23f, 1.0f + 3 * 0x1p-8f,
                        1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 65504.0f, 65519.99f, 65520.0f,
                        1e30f, 3.4e38f, 0x1p-14f, 0x1p-24f, 0x1p-25f, 0x1.8p-25f, 0x1p-26f,
                        1e-40f, 0x1.fffffep127f};
    const int64_t nsp = (int64_t)(sizeof sp / sizeof sp[0]), n = 1037;
    float *x = frand(n, 0, 1, 9001);
    for (int64_t i = 0; i < n; i++) x[i] *= powf(2.0f, (float)((i % 61) - 30));
    memcpy(x, sp, sizeof sp);
    for (int k = 0; k < 2; k++) {
        enum l3d_dtype t = mp_types[k];
        uint16_t *want = xmalloc((size_t)n * 2), *got = xmalloc((size_t)n * 2);
        for (int64_t i = 0; i < n; i++)
            want[i] = t == L3D_BF16 ? l3d_f32_to_bf16(x[i]) : l3d_f32_to_f16(x[i]);
        float *d32 = l3d_be_alloc(be, (size_t)n * 4, "test");
        void *d16 = l3d_be_alloc(be, (size_t)n * 2, "test");
        l3d_be_copy_h2d(be, d32, x, (size_t)n * 4);
        l3d_be_convert(be, t, d16, L3D_F32, d32, n);
        l3d_be_copy_d2h(be, got, d16, (size_t)n * 2);
        int64_t nbad = 0;
        for (int64_t i = 0; i < n; i++) nbad += got[i] != want[i];
        CHECK(nbad == 0);
        if (nbad) fprintf(stderr, "FAIL convert fp32 -> %s: %lld of %lld differ from core's\n",
                          l3d_dtype_name(t), (ll)nbad, (ll)n);
        /* negative: the comparison sees a single wrong bit */
        got[3] ^= 1;
        nbad = 0;
        for (int64_t i = 0; i < n; i++) nbad += got[i] != want[i];
        CHECK(nbad == 1);
        /* back to fp32: exact (bit for bit) */
        float *back = falloc(n);
        l3d_be_convert(be, L3D_F32, d32, t, d16, n);
        l3d_be_copy_d2h(be, back, d32, (size_t)n * 4);
        nbad = 0;
        for (int64_t i = 0; i < n; i++) {
            float w = t == L3D_BF16 ? l3d_bf16_to_f32(want[i]) : l3d_f16_to_f32(want[i]);
            nbad += memcmp(&w, &back[i], 4) != 0;
        }
        CHECK(nbad == 0);
        /* 16 -> other 16 goes through fp32: round(widen(x)) */
        enum l3d_dtype o = mp_types[1 - k];
        void *d16b = l3d_be_alloc(be, (size_t)n * 2, "test");
        l3d_be_convert(be, o, d16b, t, d16, n);
        l3d_be_copy_d2h(be, got, d16b, (size_t)n * 2);
        nbad = 0;
        for (int64_t i = 0; i < n; i++) {
            float w = t == L3D_BF16 ? l3d_bf16_to_f32(want[i]) : l3d_f16_to_f32(want[i]);
            nbad += got[i] != (o == L3D_BF16 ? l3d_f32_to_bf16(w) : l3d_f32_to_f16(w));
        }
        CHECK(nbad == 0);
        l3d_be_free(be, d16b);
        l3d_be_free(be, d32);
        l3d_be_free(be, d16);
        free(back), free(want), free(got);
    }
    CHECK(nsp < n);
    free(x);
}

/* unscale: the flag set by any Inf/NaN (never cleared), finite values scaled and rounded once */
static void mp_unscale(struct l3d_backend *be, enum l3d_dtype t, int64_t n, uint64_t s) {
    char tag[96];
    snprintf(tag, sizeof tag, "unscale n=%lld", (ll)n);
    for (int c = 0; c < 4; c++) { /* all finite; an Inf; a NaN; all finite, flag already set */
        float *x = qrand(t, n, 0, 1000, s + c), *want = fdup(x, n);
        float flag[1] = {c == 3 ? 1.0f : 0.0f};
        if (c == 1) x[n - 1] = -INFINITY;
        if (c == 2) x[n / 3] = NAN;
        const float inv = 1.0f / 1024.0f * 3.0f;
        for (int64_t i = 0; i < n; i++) want[i] = x[i] * inv;
        q16(t, want, n);
        struct mstage st = {.be = be};
        void *dx = ms(&st, t, x, n, 1);
        l3d_be_unscale(be, t, ms(&st, L3D_F32, flag, 1, 1), dx, inv, n);
        ms_done(&st);
        CHECK(flag[0] == (c == 0 ? 0.0f : 1.0f));
        if (c == 0) mp_check(K_SUMSQ, t, tag, "x * inv_scale", x, want, n, 1, 1);
        free(x), free(want);
    }
}

/* -- matmul -- */

static void mm_run(struct l3d_backend *be, enum l3d_dtype t, enum l3d_dtype gt, float *out,
                   float *dinp, float *dw, float *db, const float *inp, const float *w,
                   const float *b, const float *dout, int64_t N, int64_t C, int64_t OC) {
    struct mstage s = {.be = be};
    l3d_be_matmul_forward(be, t, ms(&s, t, out, N * OC, 1), ms(&s, t, inp, N * C, 0),
                          ms(&s, t, w, OC * C, 0), ms(&s, t, b, OC, 0), N, C, OC);
    l3d_be_matmul_backward_mixed(be, t, gt, ms(&s, t, dinp, N * C, 1), ms(&s, gt, dw, OC * C, 1),
                                 ms(&s, gt, db, OC, 1), ms(&s, t, dout, N * OC, 0),
                                 ms(&s, t, inp, N * C, 0), ms(&s, t, w, OC * C, 0), N, C, OC);
    ms_done(&s);
}

static void mp_matmul(struct l3d_backend *be, enum l3d_dtype t, enum l3d_dtype gt, int64_t N,
                      int64_t C, int64_t OC, int with_bias, int null_dinp, uint64_t s) {
    char tag[160];
    snprintf(tag, sizeof tag, "matmul N=%lld C=%lld OC=%lld%s%s grads %s", (ll)N, (ll)C, (ll)OC,
             with_bias ? "" : " (no bias)", null_dinp ? " dinp NULL" : "", l3d_dtype_name(gt));
    float *inp = qrand(t, N * C, 0, 1, s + 1), *w = qrand(t, OC * C, 0, 1, s + 2);
    float *b = with_bias ? qrand(t, OC, 0, 1, s + 3) : NULL, *dout = qrand(t, N * OC, 0, 1, s + 4);
    float *out[2], *di[2], *dw[2], *db[2];
    float *di0 = null_dinp ? NULL : qrand(t, N * C, 0, 2, s + 5);
    float *dw0 = qrand(t, OC * C, 0, 2, s + 6);
    float *db0 = with_bias ? qrand(t, OC, 0, 2, s + 7) : NULL;
    for (int k = 0; k < 2; k++) {
        out[k] = fnan(N * OC), di[k] = fdup(di0, N * C), dw[k] = fdup(dw0, OC * C),
        db[k] = fdup(db0, OC);
        mm_run(be, k ? t : L3D_F32, k ? gt : L3D_F32, out[k], di[k], dw[k], db[k], inp, w, b, dout,
               N, C, OC);
    }
    double rg = gt == L3D_F32 ? 0 : 1;
    mp_check(K_MATMUL, t, tag, "out", out[1], out[0], N * OC, 1, C);
    if (!null_dinp) mp_check(K_MATMUL, t, tag, "dinp", di[1], di[0], N * C, 1, OC);
    mp_check(K_MATMUL, t, tag, "dweight", dw[1], dw[0], OC * C, rg, N);
    if (with_bias) mp_check(K_MATMUL, t, tag, "dbias", db[1], db[0], OC, rg, N);
    for (int k = 0; k < 2; k++) free(out[k]), free(di[k]), free(dw[k]), free(db[k]);
    free(inp), free(w), free(b), free(dout), free(di0), free(dw0), free(db0);
}

/* -- encoder -- */

static void mp_encoder(struct l3d_backend *be, enum l3d_dtype t, enum l3d_dtype gt, int64_t B,
                       int64_t T, int64_t C, int64_t vocab_start, int64_t vocab_count,
                       int64_t Vtotal, uint64_t s) {
    char tag[160];
    snprintf(tag, sizeof tag, "encoder B=%lld T=%lld C=%lld slice [%lld,+%lld) of %lld grads %s",
             (ll)B, (ll)T, (ll)C, (ll)vocab_start, (ll)vocab_count, (ll)Vtotal,
             l3d_dtype_name(gt));
    int32_t *tok = ialloc(B * T);
    ref_fill_tokens(tok, B * T, 0, (int32_t)Vtotal, SEED, s + 1);
    float *wte = qrand(t, vocab_count * C, 0, 1, s + 2), *wpe = qrand(t, T * C, 0, 1, s + 3);
    float *dout = qrand(t, B * T * C, 0, 1, s + 4);
    float *g0 = qrand(t, vocab_count * C, 0, 1, s + 5), *p0 = qrand(t, T * C, 0, 1, s + 6);
    /* k = 0: fp32, 1: 16-bit, 2: 16-bit on 3 threads (bit-identical: threads own channels) */
    float *out[3], *dwte[3], *dwpe[3];
    int saved = omp_get_max_threads();
    for (int k = 0; k < 3; k++) {
        enum l3d_dtype a = k ? t : L3D_F32, g = k ? gt : L3D_F32;
        omp_set_num_threads(k == 2 ? 3 : saved);
        out[k] = fnan(B * T * C), dwte[k] = fdup(g0, vocab_count * C), dwpe[k] = fdup(p0, T * C);
        struct mstage st = {.be = be};
        int32_t *dtok = l3d_be_alloc(be, (size_t)(B * T) * 4, "test tokens");
        l3d_be_copy_h2d(be, dtok, tok, (size_t)(B * T) * 4);
        l3d_be_encoder_forward(be, a, ms(&st, a, out[k], B * T * C, 1), dtok,
                               ms(&st, a, wte, vocab_count * C, 0), ms(&st, a, wpe, T * C, 0),
                               vocab_start, vocab_count, B, T, C);
        l3d_be_encoder_backward_mixed(be, a, g, ms(&st, g, dwte[k], vocab_count * C, 1),
                                      ms(&st, g, dwpe[k], T * C, 1),
                                      ms(&st, a, dout, B * T * C, 0), dtok, vocab_start,
                                      vocab_count, B, T, C);
        ms_done(&st);
        l3d_be_free(be, dtok);
    }
    omp_set_num_threads(saved);
    check_all_equal(tag, "16-bit out, 3 threads", out[2], out[1], B * T * C);
    check_all_equal(tag, "16-bit dwte, 3 threads", dwte[2], dwte[1], vocab_count * C);
    check_all_equal(tag, "16-bit dwpe, 3 threads", dwpe[2], dwpe[1], T * C);
    double rg = gt == L3D_F32 ? 0 : 1; /* dwte: a token's rows summed in fp32, added once */
    mp_check(K_ENCODER, t, tag, "out", out[1], out[0], B * T * C, 1, 1);
    mp_check(K_ENCODER, t, tag, "dwte", dwte[1], dwte[0], vocab_count * C,
             rg, B * T);
    mp_check(K_ENCODER, t, tag, "dwpe", dwpe[1], dwpe[0], T * C, rg, B);
    for (int k = 0; k < 3; k++) free(out[k]), free(dwte[k]), free(dwpe[k]);
    free(tok), free(wte), free(wpe), free(dout), free(g0), free(p0);
}

/* -- layernorm -- */

static void mp_layernorm(struct l3d_backend *be, enum l3d_dtype t, enum l3d_dtype gt, int64_t N,
                         int64_t C, float mu, float sigma, uint64_t s) {
    char tag[160];
    snprintf(tag, sizeof tag, "layernorm N=%lld C=%lld inp~N(%g,%g) grads %s", (ll)N, (ll)C, mu,
             sigma, l3d_dtype_name(gt));
    float *inp = qrand(t, N * C, mu, sigma, s + 1), *w = qrand(t, C, 1, 0.5f, s + 2);
    float *b = qrand(t, C, 0, 0.5f, s + 3), *dout = qrand(t, N * C, 0, 1, s + 4);
    float *di0 = qrand(t, N * C, 0, 1, s + 5), *dw0 = qrand(t, C, 0, 1, s + 6);
    float *db0 = qrand(t, C, 0, 1, s + 7);
    /* k = 0: fp32, 1: 16-bit, 2: 16-bit on 3 threads (bit-identical: rows and columns owned) */
    float *out[3], *mean[3], *rstd[3], *di[3], *dw[3], *db[3];
    int saved = omp_get_max_threads();
    for (int k = 0; k < 3; k++) {
        enum l3d_dtype a = k ? t : L3D_F32, g = k ? gt : L3D_F32;
        omp_set_num_threads(k == 2 ? 3 : saved);
        out[k] = fnan(N * C), mean[k] = fnan(N), rstd[k] = fnan(N);
        di[k] = fdup(di0, N * C), dw[k] = fdup(dw0, C), db[k] = fdup(db0, C);
        struct mstage st = {.be = be};
        float *dmean = ms(&st, L3D_F32, mean[k], N, 1), *drstd = ms(&st, L3D_F32, rstd[k], N, 1);
        const void *dinp = ms(&st, a, inp, N * C, 0), *dwt = ms(&st, a, w, C, 0);
        l3d_be_layernorm_forward(be, a, ms(&st, a, out[k], N * C, 1), dmean, drstd, dinp, dwt,
                                 ms(&st, a, b, C, 0), N, C);
        l3d_be_layernorm_backward_mixed(be, a, g, ms(&st, a, di[k], N * C, 1),
                                        ms(&st, g, dw[k], C, 1), ms(&st, g, db[k], C, 1),
                                        ms(&st, a, dout, N * C, 0), dinp, dwt, dmean, drstd, N, C);
        ms_done(&st);
    }
    omp_set_num_threads(saved);
    check_all_equal(tag, "16-bit out, 3 threads", out[2], out[1], N * C);
    check_all_equal(tag, "16-bit dinp, 3 threads", di[2], di[1], N * C);
    check_all_equal(tag, "16-bit dweight, 3 threads", dw[2], dw[1], C);
    check_all_equal(tag, "16-bit dbias, 3 threads", db[2], db[1], C);
    double rg = gt == L3D_F32 ? 0 : 1;
    mp_check(K_LAYERNORM, t, tag, "out", out[1], out[0], N * C, 1, C);
    mp_check(K_LAYERNORM, t, tag, "mean", mean[1], mean[0], N, 0, C);
    mp_check(K_LAYERNORM, t, tag, "rstd", rstd[1], rstd[0], N, 0, C);
    mp_check(K_LAYERNORM, t, tag, "dinp", di[1], di[0], N * C, 1, C);
    mp_check(K_LAYERNORM, t, tag, "dweight", dw[1], dw[0], C, rg, N);
    mp_check(K_LAYERNORM, t, tag, "dbias", db[1], db[0], C, rg, N);
    for (int k = 0; k < 3; k++)
        free(out[k]), free(mean[k]), free(rstd[k]), free(di[k]), free(dw[k]), free(db[k]);
    free(inp), free(w), free(b), free(dout), free(di0), free(dw0), free(db0);
}

/* -- attention: tiled forward and backward, and over a key/value cache -- */

/* forward when out is not NULL (out, lse =), else backward (dqkv +=) from the given out, lse */
static void att_run(struct l3d_backend *be, enum l3d_dtype a, float *out, float *lse, float *dqkv,
                    const float *out_in, const float *lse_in, const float *qkv, const float *dout,
                    int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS) {
    const int64_t nqkv = n_qkv(B, T, NH, NKV, HS), nout = B * T * NH * HS, nlse = B * NH * T;
    struct mstage st = {.be = be};
    const void *dq = ms(&st, a, qkv, nqkv, 0);
    if (out)
        l3d_be_attention_forward(be, a, ms(&st, a, out, nout, 1), ms(&st, L3D_F32, lse, nlse, 1),
                                 dq, B, T, NH, NKV, HS);
    else
        l3d_be_attention_backward(be, a, ms(&st, a, dqkv, nqkv, 1), ms(&st, a, dout, nout, 0), dq,
                                  ms(&st, a, out_in, nout, 0), ms(&st, L3D_F32, lse_in, nlse, 0),
                                  B, T, NH, NKV, HS);
    ms_done(&st);
}

/* Whether the backend's bf16 attention runs its products in bf16 dot products (the CPU
 * backend's l3d_fa16_on: HS even, AVX512-BF16, L3D_ATTN_DOT "1", or unset on an AMD CPU,
 * l3d_fa16_default's rule, mirrored here): P and dS are then rounded to
 * bf16 before their products, which moves an output by at most u sum|terms| (P >= 0 sums to 1
 * per row: out moves by at most u max|v|); ATTN_DOT_SCALE such roundings of the tensor's
 * largest entry bound it for these N(0,1) inputs (the worst measured: 0.94 of u max|want|). */
#define ATTN_DOT_SCALE 2.0
static bool attn_dot(enum l3d_dtype t, int64_t HS) {
    const char *e = getenv("L3D_ATTN_DOT"); /* set by test_mixed_precision: "1", then "0" */
    bool want = e && *e ? strcmp(e, "0") != 0 : __builtin_cpu_is("amd");
    return t == L3D_BF16 && HS % 2 == 0 && want &&
           __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw");
}

/* Backward's inputs are forward's outputs: both backward runs get the 16-bit kernel's out (exact
 * in fp32) and lse, so that the comparison sees only the backward kernel's own roundings (the
 * rounding of out moves D = rowsum(dO * O), and through it every dS of the row, by far more than
 * u relative where dP - D cancels: inherent to 16-bit activations, not the kernel's error). */
static void mp_attention(struct l3d_backend *be, enum l3d_dtype t, int64_t B, int64_t T,
                         int64_t NH, int64_t NKV, int64_t HS, int threads, uint64_t s) {
    char tag[160];
    snprintf(tag, sizeof tag, "attention B=%lld T=%lld NH=%lld NKV=%lld HS=%lld", (ll)B, (ll)T,
             (ll)NH, (ll)NKV, (ll)HS);
    const int64_t nqkv = n_qkv(B, T, NH, NKV, HS), nout = B * T * NH * HS, nlse = B * NH * T;
    float *qkv = qrand(t, nqkv, 0, 1, s + 1), *dout = qrand(t, nout, 0, 1, s + 2);
    float *d0 = qrand(t, nqkv, 0, 1, s + 3);
    float *out[2], *lse[2], *dqkv[2];
    for (int k = 0; k < 2; k++) {
        out[k] = fnan(nout), lse[k] = fnan(nlse), dqkv[k] = fdup(d0, nqkv);
        att_run(be, k ? t : L3D_F32, out[k], lse[k], NULL, NULL, NULL, qkv, NULL, B, T, NH, NKV,
                HS);
    }
    for (int k = 0; k < 2; k++)
        att_run(be, k ? t : L3D_F32, NULL, NULL, dqkv[k], out[1], lse[1], qkv, dout, B, T, NH, NKV,
                HS);
    const double a = attn_dot(t, HS) ? ATTN_DOT_SCALE : 0.0;
    mp_check_a(K_ATTENTION, t, tag, "out", out[1], out[0], nout, 1, T, a);
    mp_check(K_ATTENTION, t, tag, "lse", lse[1], lse[0], nlse, 0, T);
    mp_check_a(K_ATTENTION, t, tag, "dqkv", dqkv[1], dqkv[0], nqkv, 1, T, a);
    if (threads) { /* the 16-bit kernel is bit-identical for 1, 2 and 3 threads */
        int saved = omp_get_max_threads();
        for (int nth = 2; nth <= 3; nth++) {
            omp_set_num_threads(nth);
            float *o = fnan(nout), *l = fnan(nlse), *d = fdup(d0, nqkv);
            att_run(be, t, o, l, NULL, NULL, NULL, qkv, NULL, B, T, NH, NKV, HS);
            att_run(be, t, NULL, NULL, d, o, l, qkv, dout, B, T, NH, NKV, HS);
            check_all_equal(tag, "16-bit out, 2-3 threads vs 1", o, out[1], nout);
            check_all_equal(tag, "16-bit lse, 2-3 threads vs 1", l, lse[1], nlse);
            check_all_equal(tag, "16-bit dqkv, 2-3 threads vs 1", d, dqkv[1], nqkv);
            free(o), free(l), free(d);
        }
        omp_set_num_threads(saved);
    }
    for (int k = 0; k < 2; k++) free(out[k]), free(lse[k]), free(dqkv[k]);
    free(qkv), free(dout), free(d0);
}

static void mp_attention_cached(struct l3d_backend *be, enum l3d_dtype t, int64_t pos, int64_t n,
                                int64_t NH, int64_t NKV, int64_t HS, uint64_t s) {
    char tag[160];
    snprintf(tag, sizeof tag, "attention_cached pos=%lld n=%lld NH=%lld NKV=%lld HS=%lld", (ll)pos,
             (ll)n, (ll)NH, (ll)NKV, (ll)HS);
    const int64_t C = NH * HS, qs = 3 * C + 5, ks = NKV * HS + 3, T = pos + n;
    float *q = qrand(t, n * qs, 0, 1, s + 1), *kc = qrand(t, T * ks, 0, 1, s + 2);
    float *vc = qrand(t, T * ks, 0, 1, s + 3);
    float *out[2];
    for (int k = 0; k < 2; k++) {
        enum l3d_dtype a = k ? t : L3D_F32;
        out[k] = fnan(n * C);
        struct mstage st = {.be = be};
        l3d_be_attention_cached(be, a, ms(&st, a, out[k], n * C, 1), ms(&st, a, q, n * qs, 0),
                                ms(&st, a, kc, T * ks, 0), ms(&st, a, vc, T * ks, 0), pos, n, NH, NKV,
                                HS, qs, ks);
        ms_done(&st);
    }
    mp_check_a(K_ATTENTION, t, tag, "out", out[1], out[0], n * C, 1, T,
               attn_dot(t, HS) ? ATTN_DOT_SCALE : 0.0);
    free(out[0]), free(out[1]), free(q), free(kc), free(vc);
}

/* -- elementwise: gelu, residual, add_inplace, add_bias -- */

static void mp_elementwise(struct l3d_backend *be, enum l3d_dtype t, int64_t N, int64_t C,
                           uint64_t s) {
    char tag[96];
    snprintf(tag, sizeof tag, "elementwise N=%lld C=%lld", (ll)N, (ll)C);
    const int64_t n = N * C;
    float *x = qrand(t, n, 0, 2, s + 1), *y = qrand(t, n, 0, 1, s + 2);
    float *d = qrand(t, n, 0, 1, s + 3);
    float *bias = qrand(t, C, 0, 1, s + 4);
    float *g[2], *dg[2], *r[2], *ai[2], *ab[2];
    for (int k = 0; k < 2; k++) {
        enum l3d_dtype a = k ? t : L3D_F32;
        g[k] = fnan(n), dg[k] = fdup(y, n), r[k] = fnan(n), ai[k] = fdup(x, n), ab[k] = fdup(x, n);
        struct mstage st = {.be = be};
        const void *dx = ms(&st, a, x, n, 0), *dy = ms(&st, a, y, n, 0);
        l3d_be_gelu_forward(be, a, ms(&st, a, g[k], n, 1), dx, n);
        l3d_be_gelu_backward(be, a, ms(&st, a, dg[k], n, 1), ms(&st, a, d, n, 0), dx, n);
        l3d_be_residual_forward(be, a, ms(&st, a, r[k], n, 1), dx, dy, n);
        l3d_be_add_inplace(be, a, ms(&st, a, ai[k], n, 1), dy, n);
        l3d_be_add_bias(be, a, ms(&st, a, ab[k], n, 1), ms(&st, a, bias, C, 0), N, C);
        ms_done(&st);
    }
    mp_check(K_GELU, t, tag, "gelu out", g[1], g[0], n, 1, 1);
    mp_check(K_GELU, t, tag, "gelu dinp", dg[1], dg[0], n, 1, 1);
    mp_check(K_RESIDUAL, t, tag, "residual out", r[1], r[0], n, 1, 1);
    mp_check(K_RESIDUAL, t, tag, "add_inplace dst", ai[1], ai[0], n, 1, 1);
    mp_check(K_RESIDUAL, t, tag, "add_bias out", ab[1], ab[0], n, 1, 1);
    for (int k = 0; k < 2; k++) free(g[k]), free(dg[k]), free(r[k]), free(ai[k]), free(ab[k]);
    free(x), free(y), free(d), free(bias);
}

/* -- the Llama blocks: RMSNorm, RoPE, SwiGLU -- */

static void mp_rmsnorm(struct l3d_backend *be, enum l3d_dtype t, enum l3d_dtype gt, int64_t N,
                       int64_t C, float mu, float sigma, uint64_t s) {
    char tag[160];
    snprintf(tag, sizeof tag, "rmsnorm N=%lld C=%lld inp~N(%g,%g) grads %s", (ll)N, (ll)C, mu,
             sigma, l3d_dtype_name(gt));
    float *inp = qrand(t, N * C, mu, sigma, s + 1), *w = qrand(t, C, 1, 0.5f, s + 2);
    float *dout = qrand(t, N * C, 0, 1, s + 4), *di0 = qrand(t, N * C, 0, 1, s + 5);
    float *dw0 = qrand(t, C, 0, 1, s + 6);
    /* k = 0: fp32, 1: 16-bit, 2: 16-bit on 3 threads (bit-identical: rows and columns owned) */
    float *out[3], *rstd[3], *di[3], *dw[3];
    int saved = omp_get_max_threads();
    for (int k = 0; k < 3; k++) {
        enum l3d_dtype a = k ? t : L3D_F32, g = k ? gt : L3D_F32;
        omp_set_num_threads(k == 2 ? 3 : saved);
        out[k] = fnan(N * C), rstd[k] = fnan(N), di[k] = fdup(di0, N * C), dw[k] = fdup(dw0, C);
        struct mstage st = {.be = be};
        float *drstd = ms(&st, L3D_F32, rstd[k], N, 1);
        const void *dinp = ms(&st, a, inp, N * C, 0), *dwt = ms(&st, a, w, C, 0);
        l3d_be_rmsnorm_forward(be, a, ms(&st, a, out[k], N * C, 1), drstd, dinp, dwt, N, C,
                               1e-5f);
        l3d_be_rmsnorm_backward(be, a, g, ms(&st, a, di[k], N * C, 1), ms(&st, g, dw[k], C, 1),
                                ms(&st, a, dout, N * C, 0), dinp, dwt, drstd, N, C);
        ms_done(&st);
    }
    omp_set_num_threads(saved);
    check_all_equal(tag, "16-bit out, 3 threads", out[2], out[1], N * C);
    check_all_equal(tag, "16-bit dinp, 3 threads", di[2], di[1], N * C);
    check_all_equal(tag, "16-bit dweight, 3 threads", dw[2], dw[1], C);
    double rg = gt == L3D_F32 ? 0 : 1;
    mp_check(K_RMSNORM, t, tag, "out", out[1], out[0], N * C, 1, C);
    mp_check(K_RMSNORM, t, tag, "rstd", rstd[1], rstd[0], N, 0, C);
    mp_check(K_RMSNORM, t, tag, "dinp", di[1], di[0], N * C, 1, C);
    mp_check(K_RMSNORM, t, tag, "dweight", dw[1], dw[0], C, rg, N);
    for (int k = 0; k < 3; k++) free(out[k]), free(rstd[k]), free(di[k]), free(dw[k]);
    free(inp), free(w), free(dout), free(di0), free(dw0);
}

/* Both directions on the same 16-bit input; the value heads stay bit for bit as they were. */
static void mp_rope(struct l3d_backend *be, enum l3d_dtype t, int64_t B, int64_t T, int64_t NH,
                    int64_t NKV, int64_t HS, int32_t p0, uint64_t s) {
    char tag[160];
    snprintf(tag, sizeof tag, "rope B=%lld T=%lld NH=%lld NKV=%lld HS=%lld from %d", (ll)B, (ll)T,
             (ll)NH, (ll)NKV, (ll)HS, p0);
    const int64_t n = n_qkv(B, T, NH, NKV, HS), CQ = (NH + 2 * NKV) * HS;
    float *x = qrand(t, n, 0, 1, s + 1), *freq = rope_freqs(HS, 10000.0);
    int32_t *pos = ialloc(T);
    for (int64_t i = 0; i < T; i++) pos[i] = p0 + (int32_t)(i * 7 % T); /* a permutation */
    float *y[2][2];
    for (int k = 0; k < 2; k++) {
        enum l3d_dtype a = k ? t : L3D_F32;
        struct mstage st = {.be = be};
        int32_t *dp = l3d_be_alloc(be, (size_t)T * 4, "test positions");
        l3d_be_copy_h2d(be, dp, pos, (size_t)T * 4);
        const float *df = ms(&st, L3D_F32, freq, HS / 2, 0);
        y[k][0] = fdup(x, n), y[k][1] = fdup(x, n);
        l3d_be_rope_forward(be, a, ms(&st, a, y[k][0], n, 1), df, dp, B, T, NH, NKV, HS);
        l3d_be_rope_backward(be, a, ms(&st, a, y[k][1], n, 1), df, dp, B, T, NH, NKV, HS);
        ms_done(&st);
        l3d_be_free(be, dp);
    }
    for (int d = 0; d < 2; d++) {
        mp_check(K_ROPE, t, tag, d ? "backward" : "forward", y[1][d], y[0][d], n, 1, 2);
        for (int64_t bt = 0; bt < B * T; bt++) {
            int64_t v = bt * CQ + (NH + NKV) * HS;
            check_all_equal(tag, "16-bit value heads untouched", y[1][d] + v, x + v, NKV * HS);
        }
    }
    for (int k = 0; k < 2; k++) free(y[k][0]), free(y[k][1]);
    free(x), free(freq), free(pos);
}

static void mp_swiglu(struct l3d_backend *be, enum l3d_dtype t, int64_t N, int64_t H, uint64_t s) {
    char tag[96];
    snprintf(tag, sizeof tag, "swiglu N=%lld H=%lld", (ll)N, (ll)H);
    float *inp = qrand(t, N * 2 * H, 0, 3, s + 1), *dout = qrand(t, N * H, 0, 1, s + 2);
    float *d0 = qrand(t, N * 2 * H, 0, 1, s + 3);
    float *out[2], *di[2];
    for (int k = 0; k < 2; k++) {
        enum l3d_dtype a = k ? t : L3D_F32;
        out[k] = fnan(N * H), di[k] = fdup(d0, N * 2 * H);
        struct mstage st = {.be = be};
        const void *dinp = ms(&st, a, inp, N * 2 * H, 0);
        l3d_be_swiglu_forward(be, a, ms(&st, a, out[k], N * H, 1), dinp, N, H);
        l3d_be_swiglu_backward(be, a, ms(&st, a, di[k], N * 2 * H, 1), ms(&st, a, dout, N * H, 0),
                               dinp, N, H);
        ms_done(&st);
    }
    mp_check(K_SWIGLU, t, tag, "out", out[1], out[0], N * H, 1, 1);
    mp_check(K_SWIGLU, t, tag, "dinp", di[1], di[0], N * 2 * H, 1, 1);
    for (int k = 0; k < 2; k++) free(out[k]), free(di[k]);
    free(inp), free(dout), free(d0);
}

/* -- cross-entropy on 16-bit logits -- */

static void mp_xent(struct l3d_backend *be, enum l3d_dtype t, int64_t N, int64_t Vl,
                    int64_t Vvalid, int64_t vocab_start, int64_t Vtotal, float sigma, uint64_t s) {
    char tag[160];
    snprintf(tag, sizeof tag, "xent N=%lld Vl=%lld Vvalid=%lld start %lld of %lld sigma %g", (ll)N,
             (ll)Vl, (ll)Vvalid, (ll)vocab_start, (ll)Vtotal, sigma);
    float *logits = qrand(t, N * Vl, 0, sigma, s + 1);
    int32_t *tg = ialloc(N);
    ref_fill_tokens(tg, N, 0, (int32_t)Vtotal, SEED, s + 2);
    float *mx[2], *se[2], *tl[2], *dl[2];
    for (int k = 0; k < 2; k++) {
        enum l3d_dtype a = k ? t : L3D_F32;
        mx[k] = fnan(N), se[k] = fnan(N), tl[k] = fnan(N), dl[k] = fdup(logits, N * Vl);
        struct mstage st = {.be = be};
        int32_t *dt = l3d_be_alloc(be, (size_t)N * 4, "test targets");
        l3d_be_copy_h2d(be, dt, tg, (size_t)N * 4);
        float *dmx = ms(&st, L3D_F32, mx[k], N, 1), *dse = ms(&st, L3D_F32, se[k], N, 1);
        void *dlg = ms(&st, a, dl[k], N * Vl, 1);
        l3d_be_xent_max(be, a, dmx, dlg, N, Vl, Vvalid);
        l3d_be_xent_sumexp(be, a, dse, ms(&st, L3D_F32, tl[k], N, 1), dlg, dmx, dt, vocab_start,
                           N, Vl, Vvalid);
        l3d_be_xent_backward(be, a, dlg, dmx, dse, dt, 0.37f, vocab_start, N, Vl, Vvalid);
        ms_done(&st);
        l3d_be_free(be, dt);
    }
    mp_check(K_XENT, t, tag, "maxv", mx[1], mx[0], N, 0, 0);
    mp_check(K_XENT, t, tag, "sumexp", se[1], se[0], N, 0, Vvalid);
    mp_check(K_XENT, t, tag, "tlogit", tl[1], tl[0], N, 0, 0);
    mp_check(K_XENT, t, tag, "dlogits", dl[1], dl[0], N * Vl, 1, Vvalid);
    for (int k = 0; k < 2; k++) free(mx[k]), free(se[k]), free(tl[k]), free(dl[k]);
    free(logits), free(tg);
}

/* The fused statistics (l3d_be_xent_stats: max, sum of exponentials and target logit in one
 * pass) against the unfused pair on the same logits: the same bits in every type. Negative: the
 * same comparison must reject the fused results of logits with one entry raised to the row's
 * maximum + 1 (every statistic of that row moves). */
static void xent_stats_run(struct l3d_backend *be, enum l3d_dtype t, bool fused, const float *lg,
                           const int32_t *tg, float *out, int64_t N, int64_t Vl, int64_t Vvalid,
                           int64_t vocab_start) {
    struct mstage st = {.be = be};
    int32_t *dt = l3d_be_alloc(be, (size_t)N * 4, "test targets");
    l3d_be_copy_h2d(be, dt, tg, (size_t)N * 4);
    float *dmx = ms(&st, L3D_F32, out, N, 1), *dse = ms(&st, L3D_F32, out + N, N, 1);
    float *dtl = ms(&st, L3D_F32, out + 2 * N, N, 1);
    void *dlg = ms(&st, t, lg, N * Vl, 0);
    if (fused) {
        l3d_be_xent_stats(be, t, dmx, dse, dtl, dlg, dt, vocab_start, N, Vl, Vvalid);
    } else {
        l3d_be_xent_max(be, t, dmx, dlg, N, Vl, Vvalid);
        l3d_be_xent_sumexp(be, t, dse, dtl, dlg, dmx, dt, vocab_start, N, Vl, Vvalid);
    }
    ms_done(&st);
    l3d_be_free(be, dt);
}

static void test_xent_stats(struct l3d_backend *be, enum l3d_dtype t, int64_t N, int64_t Vl,
                            int64_t Vvalid, int64_t vocab_start, uint64_t s) {
    char tag[128];
    snprintf(tag, sizeof tag, "xent_stats %s N=%lld Vl=%lld Vvalid=%lld start %lld",
             l3d_dtype_name(t), (ll)N, (ll)Vl, (ll)Vvalid, (ll)vocab_start);
    float *lg = qrand(t, N * Vl, 0, 3, s + 1), *want = fnan(3 * N), *got = fnan(3 * N);
    int32_t *tg = ialloc(N);
    ref_fill_tokens(tg, N, 0, (int32_t)(vocab_start + Vl), SEED, s + 2);
    xent_stats_run(be, t, false, lg, tg, want, N, Vl, Vvalid, vocab_start);
    xent_stats_run(be, t, true, lg, tg, got, N, Vl, Vvalid, vocab_start);
    check_all_equal(tag, "fused = max, then sumexp", got, want, 3 * N);
    lg[(N - 1) * Vl + Vvalid / 2] = want[N - 1] + 1.0f; /* the last row's new maximum */
    xent_stats_run(be, t, true, lg, tg, got, N, Vl, Vvalid, vocab_start);
    bool same = true;
    for (int64_t i = 0; i < 3 * N; i++) same = same && (got[i] == want[i]);
    CHECK(!same);
    free(lg), free(want), free(got), free(tg);
}

/* -- the optimizer step on fp32 master weights, and sumsq of 16-bit gradients -- */

static void mp_adamw(struct l3d_backend *be, enum l3d_dtype t, enum l3d_dtype gt, int64_t n,
                     uint64_t s) {
    char tag[96];
    snprintf(tag, sizeof tag, "adamw_mixed n=%lld grads %s", (ll)n, l3d_dtype_name(gt));
    float *p0 = frand(n, 0, 1, s + 1), *m0 = frand(n, 0, 0.1f, s + 2);
    float *g = qrand(t, n, 0, 1, s + 4);
    float *v0 = frand(n, 0, 0.1f, s + 3);
    for (int64_t i = 0; i < n; i++) v0[i] = v0[i] * v0[i];
    float *p[2], *m[2], *v[2], *w16 = fnan(n);
    for (int k = 0; k < 2; k++) {
        p[k] = fdup(p0, n), m[k] = fdup(m0, n), v[k] = fdup(v0, n);
        struct mstage st = {.be = be};
        float *dp = ms(&st, L3D_F32, p[k], n, 1), *dm = ms(&st, L3D_F32, m[k], n, 1);
        float *dv = ms(&st, L3D_F32, v[k], n, 1);
        if (k == 0)
            l3d_be_adamw(be, L3D_F32, dp, dm, dv, ms(&st, L3D_F32, g, n, 0), 0.5f, n, 1e-2f, 0.9f,
                         0.95f, 1e-8f, 0.1f, 0.3f, 0.2f);
        else
            l3d_be_adamw_mixed(be, t, gt, ms(&st, t, w16, n, 1), dp, dm, dv, ms(&st, gt, g, n, 0),
                               0.5f, n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.3f, 0.2f);
        ms_done(&st);
    }
    mp_check(K_ADAMW, t, tag, "master", p[1], p[0], n, 0, 4);
    mp_check(K_ADAMW, t, tag, "m", m[1], m[0], n, 0, 4);
    mp_check(K_ADAMW, t, tag, "v", v[1], v[0], n, 0, 4);
    /* the 16-bit copy is the updated master rounded to nearest even, bit for bit */
    float *want = fdup(p[1], n);
    q16(t, want, n);
    check_all_equal(tag, "16-bit param = round(master)", w16, want, n);
    for (int k = 0; k < 2; k++) free(p[k]), free(m[k]), free(v[k]);
    free(p0), free(m0), free(v0), free(g), free(w16), free(want);
}

static void mp_sumsq(struct l3d_backend *be, enum l3d_dtype t, int64_t n, uint64_t s) {
    char tag[64];
    snprintf(tag, sizeof tag, "sumsq n=%lld", (ll)n);
    float *x = qrand(t, n, 0, 1, s);
    double acc[2] = {0.25, 0.25};
    for (int k = 0; k < 2; k++) {
        enum l3d_dtype a = k ? t : L3D_F32;
        struct mstage st = {.be = be};
        double *dacc = l3d_be_alloc(be, sizeof(double), "test");
        l3d_be_copy_h2d(be, dacc, &acc[k], sizeof(double));
        l3d_be_sumsq(be, a, dacc, ms(&st, a, x, n, 0), n);
        l3d_be_copy_d2h(be, &acc[k], dacc, sizeof(double));
        l3d_be_free(be, dacc);
        ms_done(&st);
    }
    /* squares of 16-bit values are exact in double; only the order of the double sums differs */
    CHECK_NEAR(acc[1], acc[0], 1e-12 * acc[0]);
    CHECK(!(fabs(acc[1] * (1 + 1e-9) - acc[0]) <= 1e-12 * acc[0])); /* negative case */
    (void)tag;
    free(x);
}

static void test_mixed_precision(struct l3d_backend *be, uint64_t s) {
    mp_convert(be);
    setenv("L3D_ATTN_DOT", "1", 1); /* bf16 attention in dot products where the CPU has them */
    for (int k = 0; k < 2; k++) {
        enum l3d_dtype t = mp_types[k];
        mp_unscale(be, L3D_F32, 1000, s += 100);
        mp_unscale(be, t, 1037, s += 100);
        const int64_t mm[][3] = {{1, 1, 1}, {7, 13, 9}, {17, 37, 23}, {48, 160, 136}};
        for (size_t i = 0; i < sizeof mm / sizeof mm[0]; i++) {
            mp_matmul(be, t, t, mm[i][0], mm[i][1], mm[i][2], 1, 0, s += 100);
            mp_matmul(be, t, L3D_F32, mm[i][0], mm[i][1], mm[i][2], (int)(i % 2), (int)(i == 2),
                      s += 100);
        }
        mp_encoder(be, t, t, 2, 5, 7, 0, 6, 6, s += 100);
        mp_encoder(be, t, L3D_F32, 3, 8, 16, 4, 5, 13, s += 100);
        mp_encoder(be, t, t, 2, 9, 600, 11, 12, 23, s += 100);
        mp_layernorm(be, t, t, 4, 7, 0.3f, 2, s += 100);
        mp_layernorm(be, t, L3D_F32, 13, 65, 0.5f, 1, s += 100);
        mp_layernorm(be, t, t, 3, 768, 0.1f, 3, s += 100);
        mp_attention(be, t, 1, 1, 1, 1, 1, 0, s += 100);
        mp_attention(be, t, 2, 9, 1, 1, 16, 0, s += 100);
        mp_attention(be, t, 1, 65, 1, 1, 80, 0, s += 100);
        mp_attention(be, t, 2, 257, 3, 3, 24, 1, s += 100);
        mp_attention(be, t, 2, 70, 4, 1, 16, 0, s += 100);
        mp_attention(be, t, 1, 130, 6, 2, 24, 1, s += 100);
        mp_attention_cached(be, t, 0, 1, 2, 2, 8, s += 100);
        mp_attention_cached(be, t, 37, 90, 3, 3, 16, s += 100);
        mp_attention_cached(be, t, 37, 90, 4, 2, 16, s += 100);
        mp_elementwise(be, t, 1, 1, s += 100);
        mp_elementwise(be, t, 7, 300, s += 100);
        mp_elementwise(be, t, 9, 1029, s += 100);
        mp_rmsnorm(be, t, t, 4, 7, 0.3f, 2, s += 100);
        mp_rmsnorm(be, t, L3D_F32, 13, 65, 0.5f, 1, s += 100);
        mp_rmsnorm(be, t, t, 3, 768, 0.1f, 3, s += 100);
        mp_rope(be, t, 2, 9, 4, 2, 8, 0, s += 100);
        mp_rope(be, t, 1, 33, 3, 1, 64, 70000, s += 100);
        mp_swiglu(be, t, 1, 1, s += 100);
        mp_swiglu(be, t, 7, 300, s += 100);
        mp_swiglu(be, t, 3, 1029, s += 100);
        mp_xent(be, t, 3, 10, 10, 0, 10, 1, s += 100);
        mp_xent(be, t, 7, 40, 33, 48, 100, 3, s += 100);
        mp_xent(be, t, 4, 1100, 1000, 0, 1000, 10, s += 100);
        /* rows of 61 valid of 67 columns (no multiple of a vector), logits up to ~100 */
        mp_xent(be, t, 9, 67, 61, 0, 61, 30, s += 100);
        mp_adamw(be, t, t, 1037, s += 100);
        mp_adamw(be, t, L3D_F32, 1037, s += 100);
        mp_sumsq(be, t, 1, s += 100);
        mp_sumsq(be, t, 100003, s += 100);
    }
    /* bf16 attention at GPT-2's head size (two key blocks, dot products where the CPU has them),
     * then its fallback on such a CPU (L3D_ATTN_DOT=0, the default: fp32 products of widened
     * operands, the AVX2 machines' path) under the strict one-rounding tolerance */
    mp_attention(be, L3D_BF16, 1, 128, 4, 2, 64, 1, s += 100);
    for (int k = 0; k < 3; k++) {
        enum l3d_dtype t = k == 0 ? L3D_F32 : mp_types[k - 1];
        test_xent_stats(be, t, 1, 1, 1, 0, s += 100);
        test_xent_stats(be, t, 7, 384, 300, 0, s += 100);
        test_xent_stats(be, t, 5, 1100, 1000, 500, s += 100);
        test_xent_stats(be, t, 9, 67, 61, 0, s += 100);
    }
    setenv("L3D_ATTN_DOT", "0", 1);
    mp_attention(be, L3D_BF16, 2, 70, 4, 1, 16, 0, s += 100);
    mp_attention(be, L3D_BF16, 1, 128, 4, 2, 64, 0, s += 100);
    mp_attention_cached(be, L3D_BF16, 37, 90, 4, 2, 16, s += 100);
    unsetenv("L3D_ATTN_DOT");
    printf("mixed precision: worst error as a fraction of the tolerance (bf16, fp16):\n");
    for (int k = 0; k < K_COUNT; k++)
        printf("  %-10s %.3g   %.3g\n", kern_name[k], mp_margin[k][0], mp_margin[k][1]);
}

int main(void) {
    double t0 = l3d_time_s();
    /* the widened and dot-product attention paths under their tolerances here; the oneDNN path
     * (the default for bf16 on an AMX CPU) has its own test, test_attn_dnnl */
    setenv("L3D_ATTN_DNNL", "0", 1);
    struct l3d_backend *be = test_backend_init();
    uint64_t s = 0;

    /* N, C, OC: ones, primes (no multiple of 8 or 16), powers of two, one larger sampled case. */
    const int64_t mm[][3] = {{1, 1, 1}, {1, 5, 3}, {2, 1, 7}, {7, 13, 9}, {5, 16, 8},
                             {17, 37, 23}, {32, 64, 48}, {48, 160, 136}};
    for (size_t k = 0; k < sizeof mm / sizeof mm[0]; k++) {
        test_matmul(be, mm[k][0], mm[k][1], mm[k][2], 1, s += 100);
        if (k % 3 == 1) test_matmul(be, mm[k][0], mm[k][1], mm[k][2], 0, s += 100);
    }

    /* B, T, C, vocab_start, vocab_count, Vtotal, wpe rows (0: none). */
    const int64_t enc[][7] = {{1, 1, 1, 0, 1, 1, 1},    {1, 1, 4, 0, 3, 3, 0},
                              {2, 5, 7, 0, 6, 6, 5},    {3, 8, 16, 4, 5, 13, 11},
                              {2, 13, 9, 10, 7, 17, 0}, {4, 16, 24, 0, 9, 20, 16},
                              {2, 9, 33, 11, 12, 23, 20}};
    for (size_t k = 0; k < sizeof enc / sizeof enc[0]; k++)
        test_encoder(be, enc[k][0], enc[k][1], enc[k][2], enc[k][3], enc[k][4], enc[k][5], enc[k][6],
                     s += 100);

    /* N, C and the input's spread: sigma 0.01 makes var ~1e-4, where eps = 1e-5 shows. */
    test_layernorm(be, 1, 1, 0.5f, 1, s += 100);
    test_layernorm(be, 1, 3, 0, 1, s += 100);
    test_layernorm(be, 4, 7, 0.3f, 2, s += 100);
    test_layernorm(be, 9, 32, -1, 1, s += 100);
    test_layernorm(be, 13, 65, 0.5f, 1, s += 100);
    test_layernorm(be, 6, 40, 0.02f, 0.01f, s += 100);
    test_layernorm(be, 3, 200, 0.1f, 3, s += 100);

    /* B, T, NH, HS: T=1, T<HS, T>HS, HS not a multiple of 8, peaky softmax. */
    test_attention(be, 1, 1, 1, 1, 1, 1, s += 100);
    test_attention(be, 1, 1, 2, 2, 4, 1, s += 100);
    test_attention(be, 2, 5, 3, 3, 4, 1, s += 100);
    test_attention(be, 1, 13, 2, 2, 8, 1, s += 100);
    test_attention(be, 2, 9, 1, 1, 16, 1, s += 100);
    test_attention(be, 1, 33, 2, 2, 5, 1, s += 100);
    test_attention(be, 2, 20, 4, 4, 8, 2.5f, s += 100);
    test_attention(be, 1, 64, 1, 1, 4, 1, s += 100);
    /* the tiled kernel's blocks are 64: T across one, several and a partial last block, head
     * sizes 64 (GPT-2), 24 and 80 (not multiples of the block), T = 1024 with one small head */
    test_attention(be, 1, 7, 2, 2, 64, 1, s += 100);
    test_attention(be, 1, 64, 2, 2, 24, 1, s += 100);
    test_attention(be, 1, 65, 1, 1, 80, 1.5f, s += 100);
    test_attention(be, 1, 257, 2, 2, 12, 1, s += 100);
    test_attention(be, 1, 1024, 1, 1, 4, 1, s += 100);
    test_attention_naive(be, 1, 1, 1, 1, 1, 1, s += 100);
    test_attention_naive(be, 2, 5, 3, 3, 4, 1, s += 100);
    test_attention_naive(be, 2, 20, 4, 4, 8, 2.5f, s += 100);
    test_attention_threads(be, 2, 257, 3, 3, 24, s += 100);
    test_attention_threads(be, 1, 1024, 2, 2, 16, s += 100);
    test_attention_cached(be, 0, 1, 2, 2, 8, s += 100);
    test_attention_cached(be, 100, 1, 2, 2, 8, s += 100);
    test_attention_cached(be, 37, 90, 3, 3, 16, s += 100);
    test_attention_cached(be, 64, 64, 1, 1, 64, s += 100);
    /* grouped-query attention: NKV = 1 (multi-query), 2 and NH, T across blocks */
    test_attention(be, 2, 9, 4, 1, 8, 1, s += 100);
    test_attention(be, 1, 13, 4, 2, 8, 1, s += 100);
    test_attention(be, 2, 70, 6, 2, 16, 1.5f, s += 100);
    test_attention(be, 1, 20, 6, 3, 4, 2, s += 100);
    test_attention(be, 1, 65, 8, 2, 24, 1, s += 100);
    test_attention_naive(be, 2, 9, 4, 1, 8, 1, s += 100);
    test_attention_naive(be, 1, 13, 6, 2, 4, 1, s += 100);
    test_attention_threads(be, 2, 130, 4, 2, 16, s += 100);
    test_attention_threads(be, 1, 257, 3, 1, 24, s += 100);
    test_attention_cached(be, 0, 1, 4, 1, 8, s += 100);
    test_attention_cached(be, 37, 90, 6, 2, 16, s += 100);
    test_attention_cached(be, 100, 1, 4, 4, 8, s += 100);

    test_gelu(be, 1, 1, s += 100);
    test_gelu(be, 37, 1, s += 100);
    test_gelu(be, 1000, 3, s += 100);
    test_gelu(be, 4099, 2, s += 100);

    test_residual(be, 1, s += 100);
    test_residual(be, 17, s += 100);
    test_residual(be, 1003, s += 100);

    /* N, C, the input's spread, eps: sigma 0.003 makes mean(x^2) ~ 1e-5 = eps. Not C = 1: there
     * dinp = rstd g eps / (x^2 + eps) is the difference of two terms ~x^2/eps times larger, which
     * fp32 cannot resolve to the relative tolerance (an input ill-conditioned, not a bug). */
    test_rmsnorm(be, 2, 3, 0.5f, 1, 1e-5f, s += 100);
    test_rmsnorm(be, 4, 7, 0.3f, 2, 1e-5f, s += 100);
    test_rmsnorm(be, 9, 32, -1, 1, 1e-6f, s += 100);
    test_rmsnorm(be, 13, 65, 0.5f, 1, 1e-5f, s += 100);
    test_rmsnorm(be, 6, 40, 0.0f, 0.003f, 1e-5f, s += 100);
    test_rmsnorm(be, 3, 200, 0.1f, 3, 1e-5f, s += 100);
    /* positions: from 0; an offset (generation); any order with repeats and large values (context
     * parallelism's chunks); head sizes 2 (one pair), 8, 64, 128 */
    const int32_t p_seq[] = {0, 1, 2, 3, 4, 5, 6}, p_off[] = {1000, 1001, 1002, 1003, 1004};
    const int32_t p_any[] = {17, 3, 3, 100000, 0, 4095, 262143, 42, 9};
    test_rope(be, 2, 7, 4, 2, 8, p_seq, 10000.0, s += 100);
    test_rope(be, 1, 5, 2, 1, 2, p_off, 10000.0, s += 100);
    test_rope(be, 2, 9, 3, 3, 64, p_any, 500000.0, s += 100);
    test_rope(be, 1, 5, 4, 1, 128, p_off, 500000.0, s += 100);
    test_rope_inv_freq();
    test_swiglu(be, 1, 1, 1, s += 100);
    test_swiglu(be, 3, 13, 2, s += 100);
    test_swiglu(be, 9, 100, 3, s += 100);
    test_swiglu(be, 2, 1029, 4, s += 100);

    /* N, Vl, Vvalid, vocab_start, Vtotal, sigma. */
    test_xent(be, 1, 1, 1, 0, 1, 1, s += 100);
    test_xent(be, 3, 10, 10, 0, 10, 1, s += 100);
    test_xent(be, 5, 37, 37, 0, 37, 3, s += 100);
    test_xent(be, 4, 40, 33, 0, 33, 1, s += 100);      /* padding, huge padding logits */
    test_xent(be, 6, 32, 32, 32, 96, 2, s += 100);     /* middle slice: targets outside */
    test_xent(be, 7, 24, 17, 48, 65, 1, s += 100);     /* last slice: outside and padding */
    test_xent(be, 2, 128, 100, 0, 100, 4, s += 100);
    test_xent(be, 9, 64, 61, 61, 122, 10, s += 100);   /* very peaky */

    test_adamw(be, 1, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.0f, 1, 1, s += 100);
    test_adamw(be, 13, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.0f, 1, 0.25f, s += 100);
    test_adamw(be, 1000, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 1, 1, s += 100);
    test_adamw(be, 1001, 3e-3f, 0.8f, 0.99f, 1e-3f, 0.1f, 1e-3f, 0.5f, s += 100); /* eps matters */
    /* A large lr * wd, so that decaying the updated instead of the old param (an lr^2 wd term)
     * shows. */
    test_adamw(be, 257, 0.2f, 0.9f, 0.999f, 1e-8f, 0.5f, 1, 1, s += 100);

    test_sumsq(be, 0, 1, s += 100);
    test_sumsq(be, 1, 1, s += 100);
    test_sumsq(be, 7, 1, s += 100);
    test_sumsq(be, 1000, 3, s += 100);
    test_sumsq(be, 100003, 1, s += 100);
    test_sumsq(be, 1000003, 1e-3f, s += 100);

    test_mixed_precision(be, s += 100);


    printf("worst error as a fraction of the tolerance (fwd rtol %.0e, bwd rtol %.0e):\n", FWD_RTOL,
           BWD_RTOL);
    for (int k = 0; k < K_COUNT; k++)
        printf("  %-10s forward %.3g   backward %.3g\n", kern_name[k], margin[k][0], margin[k][1]);
    l3d_backend_free(be);
    printf("%.2f s\n", l3d_time_s() - t0);
    return TEST_REPORT();
}
