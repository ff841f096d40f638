/*
 * bf16 attention with its products as oneDNN matmuls (src/backend/cpu_attnd.c), forward and
 * backward, against a float64 reference written here (causal, grouped-query heads read in place)
 * and against the widened fp32 path (L3D_ATTN_DNNL=0, L3D_ATTN_DOT=0), through the CPU backend's
 * l3d_be_attention_* on bf16 tensors: odd T, T across one and several 64-row blocks, head sizes
 * 16, 24, 64 (GPT-2) and 128 (Qwen3's --head-dim), multi-head, grouped and multi-query.
 *
 * Tolerance, element by element, for an output y = sum A B whose operands A (P, or dS) are
 * rounded to bf16 before the product (unit roundoff u = 2^-8) and whose result is rounded once:
 *   |got - want| <= u |want| + 2 u M + 2^-14 M2,
 * M = sum |A| |B| (the product of the absolute values: rounding A moves y by at most u M,
 * Higham, "Accuracy and Stability of Numerical Algorithms", 3.5; the factor 2 covers the exact
 * P and dS of the reference against the kernel's fp32 ones before rounding), M2 the same sum
 * through the fp32 values dS is made of (P (|dP| + |D|) scale: fp32 errors of sums of up to
 * T + HS terms, T + HS <= 2^10 here, so 2^-14 is above (T + HS) 2^-24 for every case).
 * lse is fp32: |got - want| <= 2^-14 (|want| + max_j |s_j|). The widened path meets the same
 * bound (it rounds only its outputs); the two paths differ by at most twice it.
 * Negative cases: a key perturbed by 0.5 in one element, and dO perturbed in one element, must
 * fail the checks against the unperturbed reference; where the oneDNN path runs, the strict
 * one-rounding bound (without 2 u M) must fail on out, so the test sees P's rounding (the path
 * is the one it claims). The path is bit-identical for 1 and 2 threads.
 */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend/cpu_attnd.h"
#include "llm3d/backend.h"
#include "support/ref.h"
#include "test.h"

typedef long long ll;

struct shape {
    int64_t B, T, NH, NKV, HS;
};

struct ref {
    double *out, *Mout, *lse, *Slse, *dqkv, *M, *M2;
};

static int64_t n_qkv(const struct shape *s) { return s->B * s->T * (s->NH + 2 * s->NKV) * s->HS; }
static int64_t n_out(const struct shape *s) { return s->B * s->T * s->NH * s->HS; }
static int64_t n_lse(const struct shape *s) { return s->B * s->NH * s->T; }

static double w(const uint16_t *h, int64_t i) { return l3d_bf16_widen(h[i]); }

/* one query row's exact probabilities P (t + 1) and lse; returns max_j |s_j| */
static double ref_row(double *P, double *lse, const uint16_t *qkv, const struct shape *s,
                      int64_t b, int64_t h, int64_t t) {
    const int64_t HS = s->HS, CQ = (s->NH + 2 * s->NKV) * HS, g = h / (s->NH / s->NKV);
    const double scale = 1.0 / sqrt((double)HS);
    double mx = -INFINITY, smax = 0.0, sum = 0.0;
    for (int64_t j = 0; j <= t; j++) {
        double d = 0.0;
        for (int64_t c = 0; c < HS; c++)
            d += w(qkv, (b * s->T + t) * CQ + h * HS + c) *
                 w(qkv, (b * s->T + j) * CQ + (s->NH + g) * HS + c);
        P[j] = d * scale;
        mx = P[j] > mx ? P[j] : mx;
        smax = fabs(P[j]) > smax ? fabs(P[j]) : smax;
    }
    for (int64_t j = 0; j <= t; j++) sum += exp(P[j] - mx);
    for (int64_t j = 0; j <= t; j++) P[j] = exp(P[j] - mx) / sum;
    *lse = mx + log(sum);
    return smax;
}

/* the reference forward (out, lse) and the magnitude sum P |v| of each output */
static void ref_forward(struct ref *r, const uint16_t *qkv, const struct shape *s) {
    const int64_t HS = s->HS, CQ = (s->NH + 2 * s->NKV) * HS, C = s->NH * HS;
    double *P = malloc((size_t)s->T * sizeof *P);
    for (int64_t b = 0; b < s->B; b++)
        for (int64_t h = 0; h < s->NH; h++)
            for (int64_t t = 0; t < s->T; t++) {
                int64_t li = (b * s->NH + h) * s->T + t, g = h / (s->NH / s->NKV);
                r->Slse[li] = ref_row(P, &r->lse[li], qkv, s, b, h, t);
                for (int64_t c = 0; c < HS; c++) {
                    double o = 0.0, m = 0.0;
                    for (int64_t j = 0; j <= t; j++) {
                        double v = w(qkv, (b * s->T + j) * CQ + (s->NH + s->NKV + g) * HS + c);
                        o += P[j] * v;
                        m += P[j] * fabs(v);
                    }
                    r->out[(b * s->T + t) * C + h * HS + c] = o;
                    r->Mout[(b * s->T + t) * C + h * HS + c] = m;
                }
            }
    free(P);
}

/* the reference backward of one query row (b, h, t): dqkv += its terms, M and M2 their
 * magnitudes (the header comment); O and dO the kernel's bf16 inputs */
static void ref_backward_row(struct ref *r, double *P, const uint16_t *qkv, const uint16_t *dO,
                             const uint16_t *O, const struct shape *s, int64_t b, int64_t h,
                             int64_t t) {
    const int64_t HS = s->HS, CQ = (s->NH + 2 * s->NKV) * HS, C = s->NH * HS;
    const int64_t g = h / (s->NH / s->NKV), row = b * s->T;
    const double scale = 1.0 / sqrt((double)HS);
    double lse;
    ref_row(P, &lse, qkv, s, b, h, t);
    double D = 0.0, Dm = 0.0;
    for (int64_t c = 0; c < HS; c++) {
        D += w(dO, (row + t) * C + h * HS + c) * w(O, (row + t) * C + h * HS + c);
        Dm += fabs(w(dO, (row + t) * C + h * HS + c) * w(O, (row + t) * C + h * HS + c));
    }
    const int64_t oq = (row + t) * CQ + h * HS;
    for (int64_t j = 0; j <= t; j++) {
        const int64_t ok = (row + j) * CQ + (s->NH + g) * HS, ov = ok + s->NKV * HS;
        double dP = 0.0, dPm = 0.0;
        for (int64_t c = 0; c < HS; c++) {
            dP += w(dO, (row + t) * C + h * HS + c) * w(qkv, ov + c);
            dPm += fabs(w(dO, (row + t) * C + h * HS + c) * w(qkv, ov + c));
        }
        const double dS = P[j] * (dP - D) * scale, a2 = P[j] * (dPm + Dm) * scale;
        for (int64_t c = 0; c < HS; c++) {
            double q = w(qkv, oq + c), k = w(qkv, ok + c), g2 = w(dO, (row + t) * C + h * HS + c);
            r->dqkv[oq + c] += dS * k, r->M[oq + c] += fabs(dS * k), r->M2[oq + c] += a2 * fabs(k);
            r->dqkv[ok + c] += dS * q, r->M[ok + c] += fabs(dS * q), r->M2[ok + c] += a2 * fabs(q);
            r->dqkv[ov + c] += P[j] * g2, r->M[ov + c] += P[j] * fabs(g2);
            r->M2[ov + c] += P[j] * fabs(g2);
        }
    }
}

static void ref_backward(struct ref *r, const uint16_t *d0, const uint16_t *qkv,
                         const uint16_t *dO, const uint16_t *O, const struct shape *s) {
    const int64_t n = n_qkv(s);
    for (int64_t i = 0; i < n; i++) r->dqkv[i] = w(d0, i), r->M[i] = r->M2[i] = 0.0;
    double *P = malloc((size_t)s->T * sizeof *P);
    for (int64_t b = 0; b < s->B; b++)
        for (int64_t h = 0; h < s->NH; h++)
            for (int64_t t = 0; t < s->T; t++) ref_backward_row(r, P, qkv, dO, O, s, b, h, t);
    free(P);
}

/* tensors got (bf16) against want within u |want| + mu u M + 2^-14 M2 (mu 2, or 0: the strict
 * one-rounding bound); the number of elements out of it, the worst err/tol in *worst (NaN
 * fails: !(err <= tol)) */
static int64_t count_bad(const uint16_t *got, const double *want, const double *M,
                         const double *M2, int64_t n, double mu, double *worst) {
    const double u = 1.0 / 256;
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        double err = fabs(w(got, i) - want[i]);
        double tol = u * fabs(want[i]) + mu * u * M[i] + ldexp(M2[i], -14);
        if (!(err <= tol)) bad++;
        if (worst) *worst = test_max(*worst, tol > 0 ? err / tol : err > 0 ? INFINITY : 0.0);
    }
    return bad;
}

static int64_t count_bad_lse(const float *got, const struct ref *r, int64_t n) {
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++)
        if (!(fabs(got[i] - r->lse[i]) <= ldexp(fabs(r->lse[i]) + r->Slse[i], -14))) bad++;
    return bad;
}

/* a against b, two paths each within the bound of the reference want: at most twice it */
static int64_t count_bad_paths(const uint16_t *a, const uint16_t *b, const double *want,
                               const double *M, const double *M2, int64_t n) {
    const double u = 1.0 / 256;
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        double tol = 2 * (u * fabs(want[i]) + 2 * u * M[i] + ldexp(M2[i], -14));
        if (!(fabs(w(a, i) - w(b, i)) <= tol)) bad++;
    }
    return bad;
}

struct run {
    uint16_t *out, *dqkv;
    float *lse;
};

/* forward, then backward with O and lse from `in` (NULL: this run's own) */
static void run_path(struct l3d_backend *be, struct run *x, const struct run *in,
                     const uint16_t *qkv, const uint16_t *dO, const uint16_t *d0,
                     const struct shape *s) {
    x->out = malloc((size_t)n_out(s) * 2);
    x->lse = malloc((size_t)n_lse(s) * sizeof(float));
    x->dqkv = malloc((size_t)n_qkv(s) * 2);
    memcpy(x->dqkv, d0, (size_t)n_qkv(s) * 2);
    l3d_be_attention_forward(be, L3D_BF16, x->out, x->lse, qkv, s->B, s->T, s->NH, s->NKV, s->HS);
    in = in ? in : x;
    l3d_be_attention_backward(be, L3D_BF16, x->dqkv, dO, qkv, in->out, in->lse, s->B, s->T, s->NH,
                              s->NKV, s->HS);
}
static void run_free(struct run *x) { free(x->out), free(x->lse), free(x->dqkv); }

static double worst_fwd, worst_bwd;

/* the new path's out and dqkv against the reference with one input perturbed by 0.5: the first
 * value (forward) or dO (backward) element of position 0, which every query row sees */
static void negative_cases(struct l3d_backend *be, const struct ref *r, const uint16_t *qkv,
                           const uint16_t *dO, const uint16_t *d0, const struct shape *s) {
    const int64_t vo = (s->NH + s->NKV) * s->HS; /* position 0's first value head */
    uint16_t *bad_qkv = malloc((size_t)n_qkv(s) * 2), *bad_dO = malloc((size_t)n_out(s) * 2);
    memcpy(bad_qkv, qkv, (size_t)n_qkv(s) * 2);
    memcpy(bad_dO, dO, (size_t)n_out(s) * 2);
    bad_qkv[vo] = l3d_f32_to_bf16(l3d_bf16_widen(bad_qkv[vo]) + 0.5f);
    bad_dO[0] = l3d_f32_to_bf16(l3d_bf16_widen(bad_dO[0]) + 0.5f);
    struct run x, y;
    run_path(be, &x, NULL, bad_qkv, dO, d0, s);
    CHECK(count_bad(x.out, r->out, r->Mout, r->Mout, n_out(s), 2, NULL) > 0);
    run_path(be, &y, NULL, qkv, bad_dO, d0, s);
    CHECK(count_bad(y.dqkv, r->dqkv, r->M, r->M2, n_qkv(s), 2, NULL) > 0);
    run_free(&x), run_free(&y);
    free(bad_qkv), free(bad_dO);
}

static void test_shape(struct l3d_backend *be, struct l3d_backend *wide, bool on,
                       struct shape s, uint64_t seed) {
    const int64_t nq = n_qkv(&s), no = n_out(&s), nl = n_lse(&s);
    uint16_t *qkv = ref_bf16_normal(nq, 1.0f, seed), *dO = ref_bf16_normal(no, 1.0f, seed + 1);
    uint16_t *d0 = ref_bf16_normal(nq, 0.5f, seed + 2);
    struct run x, y;
    run_path(be, &x, NULL, qkv, dO, d0, &s);
    run_path(wide, &y, &x, qkv, dO, d0, &s); /* backward on the new path's out and lse */
    struct ref r = {.out = malloc((size_t)no * 8), .Mout = malloc((size_t)no * 8),
                    .lse = malloc((size_t)nl * 8), .Slse = malloc((size_t)nl * 8),
                    .dqkv = malloc((size_t)nq * 8), .M = malloc((size_t)nq * 8),
                    .M2 = malloc((size_t)nq * 8)};
    ref_forward(&r, qkv, &s);
    ref_backward(&r, d0, qkv, dO, x.out, &s);
    int64_t bo = count_bad(x.out, r.out, r.Mout, r.Mout, no, 2, &worst_fwd);
    int64_t bd = count_bad(x.dqkv, r.dqkv, r.M, r.M2, nq, 2, &worst_bwd);
    if (bo || bd)
        fprintf(stderr, "B=%lld T=%lld NH=%lld NKV=%lld HS=%lld: %lld out, %lld dqkv out of "
                "tolerance\n", (ll)s.B, (ll)s.T, (ll)s.NH, (ll)s.NKV, (ll)s.HS, (ll)bo, (ll)bd);
    CHECK(bo == 0 && bd == 0);
    CHECK(count_bad_lse(x.lse, &r, nl) == 0);
    /* the widened path: one rounding of each output */
    CHECK(count_bad(y.out, r.out, r.Mout, r.Mout, no, 0, NULL) == 0);
    CHECK(count_bad_lse(y.lse, &r, nl) == 0);
    CHECK(count_bad(y.dqkv, r.dqkv, r.M, r.M2, nq, 0, NULL) == 0);
    CHECK(count_bad_paths(x.out, y.out, r.out, r.Mout, r.Mout, no) == 0);
    CHECK(count_bad_paths(x.dqkv, y.dqkv, r.dqkv, r.M, r.M2, nq) == 0);
    if (on && s.T >= 64) /* P's rounding shows: the oneDNN path ran */
        CHECK(count_bad(x.out, r.out, r.Mout, r.Mout, no, 0, NULL) > 0);
    negative_cases(be, &r, qkv, dO, d0, &s);
    free(r.out), free(r.Mout), free(r.lse), free(r.Slse), free(r.dqkv), free(r.M), free(r.M2);
    run_free(&x), run_free(&y);
    free(qkv), free(dO), free(d0);
}

/* the path's results for 1 and 2 threads: bit for bit (one task per output element in oneDNN's
 * brgemm, fixed-order fp32 loops here) */
static void test_threads(struct l3d_backend *be, struct shape s, uint64_t seed) {
    uint16_t *qkv = ref_bf16_normal(n_qkv(&s), 1.0f, seed), *dO = ref_bf16_normal(n_out(&s), 1.0f, seed + 1);
    uint16_t *d0 = ref_bf16_normal(n_qkv(&s), 0.5f, seed + 2);
    int saved = omp_get_max_threads();
    struct run x[2];
    for (int k = 0; k < 2; k++) {
        omp_set_num_threads(k + 1);
        run_path(be, &x[k], NULL, qkv, dO, d0, &s);
    }
    omp_set_num_threads(saved);
    CHECK(memcmp(x[0].out, x[1].out, (size_t)n_out(&s) * 2) == 0);
    CHECK(memcmp(x[0].lse, x[1].lse, (size_t)n_lse(&s) * sizeof(float)) == 0);
    CHECK(memcmp(x[0].dqkv, x[1].dqkv, (size_t)n_qkv(&s) * 2) == 0);
    run_free(&x[0]), run_free(&x[1]);
    free(qkv), free(dO), free(d0);
}

/* the choice: L3D_ATTN_DNNL=0 turns the path off, =1 on wherever oneDNN has bf16 kernels, unset
 * or empty off; never for fp32 or fp16; another value is refused. Returns whether =1 turned it
 * on. */
static bool test_rule(void) {
    setenv("L3D_ATTN_DNNL", "0", 1);
    struct l3d_attnd *off = l3d_attnd_init();
    CHECK(!l3d_attnd_on(off, L3D_BF16));
    CHECK(strstr(l3d_attnd_rule(off), "L3D_ATTN_DNNL=0") != NULL);
    l3d_attnd_free(off);
    setenv("L3D_ATTN_DNNL", "1", 1);
    struct l3d_attnd *ad = l3d_attnd_init();
    bool on = l3d_attnd_on(ad, L3D_BF16);
    CHECK(!l3d_attnd_on(ad, L3D_F32) && !l3d_attnd_on(ad, L3D_F16));
    printf("bf16 attention, L3D_ATTN_DNNL=1: %s\n", l3d_attnd_rule(ad));
    l3d_attnd_free(ad);
    /* the default, unset or empty: off (opt-in, cpu_attnd.c says why) */
    for (int k = 0; k < 2; k++) {
        if (k) setenv("L3D_ATTN_DNNL", "", 1);
        else unsetenv("L3D_ATTN_DNNL");
        ad = l3d_attnd_init();
        printf("bf16 attention by default: %s\n", l3d_attnd_rule(ad));
        CHECK(!l3d_attnd_on(ad, L3D_BF16));
        CHECK(strstr(l3d_attnd_rule(ad), "the default") != NULL);
        l3d_attnd_free(ad);
    }
    unsetenv("L3D_ATTN_DNNL");
    /* any other value: one error naming the variable (the child process dies) */
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        setenv("L3D_ATTN_DNNL", "yes", 1);
        l3d_attnd_free(l3d_attnd_init());
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(!(WIFEXITED(status) && WEXITSTATUS(status) == 0));
    return on;
}

int main(void) {
    setenv("L3D_ATTN_DOT", "0", 1); /* the widened path, not cpu_attn16.c's dot products */
    bool on = test_rule();
    if (!on) printf("oneDNN has no bf16 matmul here: both runs take the widened path\n");
    setenv("L3D_ATTN_DNNL", "1", 1);
    struct l3d_backend *be = l3d_backend_cpu_init();
    setenv("L3D_ATTN_DNNL", "0", 1);
    struct l3d_backend *wide = l3d_backend_cpu_init();
    unsetenv("L3D_ATTN_DNNL");
    /* B, T, NH, NKV, HS: one row; odd T over two blocks, GPT-2's heads; Qwen3's head size 128
     * with grouped heads over three blocks; multi-query; odd T past four blocks, HS 24; even T;
     * 18 groups: two chunks of 8 ending inside batches 2 and 5, one of 2 (512 rows a call:
     * cpu_attnd.c's ad_geo); 6 query heads a group (384 rows), a group a call */
    const struct shape sh[] = {{1, 1, 1, 1, 64},   {2, 65, 4, 4, 64},  {1, 130, 6, 2, 128},
                               {2, 70, 4, 1, 16},  {1, 257, 3, 3, 24}, {2, 128, 4, 2, 64},
                               {6, 70, 3, 3, 16},  {3, 100, 12, 2, 32}};
    uint64_t seed = 1;
    for (size_t k = 0; k < sizeof sh / sizeof sh[0]; k++) test_shape(be, wide, on, sh[k], seed += 10);
    test_threads(be, (struct shape){2, 130, 4, 2, 64}, seed += 10);
    printf("worst error / tolerance: forward %.3g, backward %.3g\n", worst_fwd, worst_bwd);
    l3d_backend_free(be);
    l3d_backend_free(wide);
    return TEST_REPORT();
}
