/*
 * The bf16 backward products of a linear layer (src/backend/cpu.c, mm_pick): where oneDNN's first
 * choice is its AMX brgemm kernel, d(inp) over K = OC > C runs in its gemm-based kernels (faster
 * there, docs/BENCHMARKS.md), and d(weight) too, in blocks of rows computed whole into fp32
 * scratch and then added to the old gradient (dweight_gemm: the gemm kernels' own accumulation
 * would make micro-batches' sums differ from data-parallel ranks' sums); $L3D_MM_GEMM=0 keeps
 * brgemm everywhere. d(weight) of fewer than L3D_WGRAD_BLOCK_MIN_ROWS (2048) rows keeps brgemm (the
 * add would cost more than the kernel gains); a third backend with $L3D_MM_DW_MIN_ROWS=1 and
 * $L3D_MM_DW_BLOCK_KB=16 runs every d(weight) in blocks of 64 rows and a shorter last one.
 * Checked:
 *  - the rule: which implementation each product takes on this CPU, and that L3D_MM_GEMM=0 changes
 *    it (skipped, and said, on a CPU whose first choice is not AMX brgemm);
 *  - the numerics of both choices against a float64 reference, element by element: d(inp) (bf16,
 *    accumulated into a non-zero bf16 d(inp) and rounded once) within
 *      |got - want| <= 2^-8 (|want| + E) + E,   E = (K + 1) 2^-24 (|dinp0| + sum_k |a_k b_k|)
 *    (fp32 accumulation of K + 1 terms, Higham 3.1, then one rounding to bf16, unit roundoff 2^-8),
 *    d(weight) (fp32 main_grad, accumulated into a non-zero one) within E + 2^-24 |want| over the
 *    N rows; shapes odd, K long and short, both sides of the OC > C rule, N = 2048 (the default
 *    backend's blocks); the blocked backend too (its sums may differ from a whole product's in
 *    the last bits: gemm:jit's order over K depends on M at N = 2048);
 *  - d(weight) into g0 is exactly g0 + (d(weight) into 0), bit for bit: the data-parallel
 *    equivalence (a rank's gradient summed with the others' equals one process accumulating the
 *    micro-batches) rests on it;
 *  - the same call twice gives the same bits (a run is repeatable);
 *  - negative cases: the results against the reference of a perturbed d(out) must fail.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend-impl.h"
#include "llm3d/backend.h"
#include "support/ref.h"
#include "test.h"

typedef long long ll;

static double w16(const uint16_t *h, int64_t i) { return l3d_bf16_widen(h[i]); }

struct prod {
    int64_t N, C, OC;
    uint16_t *dout, *inp, *wt, *dinp0;
    float *dw0;
};

/* how many elements of d(inp) (bf16) and d(weight) (fp32) fall outside the bounds above against
 * the float64 reference of p with d(out) = dout */
static int64_t misses(const struct prod *p, const uint16_t *dout, const uint16_t *dinp,
                      const float *dw) {
    const int64_t N = p->N, C = p->C, OC = p->OC;
    int64_t bad = 0;
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++) {
            double want = w16(p->dinp0, n * C + c), m = fabs(want);
            for (int64_t o = 0; o < OC; o++) {
                double t = w16(dout, n * OC + o) * w16(p->wt, o * C + c);
                want += t, m += fabs(t);
            }
            double e = (double)(OC + 1) * 0x1p-24 * m, got = w16(dinp, n * C + c);
            if (!(fabs(got - want) <= 0x1p-8 * (fabs(want) + e) + e)) bad++;
        }
    for (int64_t o = 0; o < OC; o++)
        for (int64_t c = 0; c < C; c++) {
            double want = p->dw0[o * C + c], m = fabs(want);
            for (int64_t n = 0; n < N; n++) {
                double t = w16(dout, n * OC + o) * w16(p->inp, n * C + c);
                want += t, m += fabs(t);
            }
            double e = (double)(N + 1) * 0x1p-24 * m + 0x1p-24 * fabs(want);
            if (!(fabs(dw[o * C + c] - want) <= e)) bad++;
        }
    return bad;
}

static bool starts(const char *s, const char *prefix) {
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

/* d(inp) and d(weight) of p through be, into fresh copies of dinp0 and dw0 */
static void run(struct l3d_backend *be, const struct prod *p, uint16_t *dinp, float *dw) {
    memcpy(dinp, p->dinp0, (size_t)(p->N * p->C) * sizeof *dinp);
    memcpy(dw, p->dw0, (size_t)(p->OC * p->C) * sizeof *dw);
    l3d_be_matmul_backward_mixed(be, L3D_BF16, L3D_F32, dinp, dw, NULL, p->dout, p->inp, p->wt,
                                 p->N, p->C, p->OC);
}

static void test_shape(struct l3d_backend *be, struct l3d_backend *brg, struct l3d_backend *blk,
                       int64_t N, int64_t C, int64_t OC, uint64_t seed) {
    struct prod p = {N, C, OC, ref_bf16_normal(N * OC, 1.0f, seed), ref_bf16_normal(N * C, 1.0f, seed + 1),
                     ref_bf16_normal(OC * C, 0.05f, seed + 2), ref_bf16_normal(N * C, 2.0f, seed + 3),
                     malloc((size_t)(OC * C) * sizeof(float))};
    ref_fill_normal(p.dw0, OC * C, 0.0f, 4.0f, seed + 4, 1);
    uint16_t *di[4];
    float *dw[4];
    for (int k = 0; k < 4; k++) { /* 0, 1: be twice; 2: brgemm kept; 3: d(weight) in blocks */
        di[k] = malloc((size_t)(N * C) * sizeof **di);
        dw[k] = malloc((size_t)(OC * C) * sizeof **dw);
        run(k == 2 ? brg : k == 3 ? blk : be, &p, di[k], dw[k]);
    }
    int64_t bad = misses(&p, p.dout, di[0], dw[0]), bad_brg = misses(&p, p.dout, di[2], dw[2]);
    int64_t bad_blk = misses(&p, p.dout, di[3], dw[3]);
    if (bad || bad_brg || bad_blk)
        fprintf(stderr, "N=%lld C=%lld OC=%lld: %lld outside the bound (%s), %lld (L3D_MM_GEMM=0), "
                "%lld (blocks)\n", (ll)N, (ll)C, (ll)OC, (ll)bad,
                l3d_cpu_matmul_impl(be, 'w', L3D_BF16, N, C, OC), (ll)bad_brg, (ll)bad_blk);
    CHECK(bad == 0);
    CHECK(bad_brg == 0);
    CHECK(bad_blk == 0);
    CHECK(memcmp(di[0], di[1], (size_t)(N * C) * sizeof **di) == 0);
    { /* d(weight) into g0 == g0 + d(weight) into 0, bit for bit */
        float *z = malloc((size_t)(OC * C) * sizeof *z), *save = p.dw0;
        uint16_t *dz = malloc((size_t)(N * C) * sizeof *dz);
        float *zero = calloc((size_t)(OC * C), sizeof *zero);
        p.dw0 = zero;
        run(be, &p, dz, z);
        p.dw0 = save;
        int64_t off = 0;
        for (int64_t i = 0; i < OC * C; i++) off += dw[0][i] != save[i] + z[i];
        if (off) fprintf(stderr, "N=%lld C=%lld OC=%lld: d(weight) into g0 is not g0 + P in %lld\n",
                         (ll)N, (ll)C, (ll)OC, (ll)off);
        CHECK(off == 0);
        free(z), free(dz), free(zero);
    }
    CHECK(memcmp(dw[0], dw[1], (size_t)(OC * C) * sizeof **dw) == 0);
    /* negative case: one element of d(out) moved by 1 (a unit-variance input) */
    uint16_t *pert = malloc((size_t)(N * OC) * sizeof *pert);
    memcpy(pert, p.dout, (size_t)(N * OC) * sizeof *pert);
    pert[(N / 2) * OC + OC / 3] = l3d_f32_to_bf16((float)w16(pert, (N / 2) * OC + OC / 3) + 1.0f);
    CHECK(misses(&p, pert, di[0], dw[0]) > 0);
    free(pert);
    for (int k = 0; k < 4; k++) free(di[k]), free(dw[k]);
    free(p.dout), free(p.inp), free(p.wt), free(p.dinp0), free(p.dw0);
}

/* the rule where oneDNN's first choice is AMX brgemm: gemm for d(weight) of at least 2048 rows,
 * for d(inp) when OC > C */
static void test_rule(struct l3d_backend *be, struct l3d_backend *brg, struct l3d_backend *blk) {
    const char *fw = l3d_cpu_matmul_impl(be, 'f', L3D_BF16, 64, 96, 400);
    if (!(starts(fw, "brg") && strstr(fw, "amx"))) {
        printf("the bf16 forward runs in %s here, not AMX brgemm: the rule is not exercised\n", fw);
        return;
    }
    CHECK(starts(l3d_cpu_matmul_impl(be, 'w', L3D_BF16, 2048, 96, 400), "gemm:"));
    CHECK(starts(l3d_cpu_matmul_impl(be, 'w', L3D_BF16, 2048, 400, 96), "gemm:"));
    CHECK(starts(l3d_cpu_matmul_impl(be, 'w', L3D_BF16, 2047, 96, 400), "brg"));
    CHECK(starts(l3d_cpu_matmul_impl(blk, 'w', L3D_BF16, 64, 96, 400), "gemm:"));
    CHECK(starts(l3d_cpu_matmul_impl(be, 'i', L3D_BF16, 64, 96, 400), "gemm:"));
    CHECK(starts(l3d_cpu_matmul_impl(be, 'i', L3D_BF16, 64, 400, 96), "brg"));
    CHECK(starts(l3d_cpu_matmul_impl(be, 'f', L3D_BF16, 64, 400, 96), "brg"));
    /* L3D_MM_GEMM=0: brgemm everywhere */
    CHECK(starts(l3d_cpu_matmul_impl(brg, 'i', L3D_BF16, 64, 96, 400), "brg"));
    CHECK(starts(l3d_cpu_matmul_impl(brg, 'w', L3D_BF16, 2048, 96, 400), "brg"));
    printf("bf16 products: forward %s, d(weight) %s, d(inp) %s (OC > C) and %s\n", fw,
           l3d_cpu_matmul_impl(be, 'w', L3D_BF16, 2048, 96, 400),
           l3d_cpu_matmul_impl(be, 'i', L3D_BF16, 64, 96, 400),
           l3d_cpu_matmul_impl(be, 'i', L3D_BF16, 64, 400, 96));
}

int main(void) {
    unsetenv("L3D_MM_GEMM");
    struct l3d_backend *be = l3d_backend_cpu_init();
    setenv("L3D_MM_GEMM", "0", 1);
    struct l3d_backend *brg = l3d_backend_cpu_init();
    unsetenv("L3D_MM_GEMM");
    setenv("L3D_MM_DW_BLOCK_KB", "16", 1);
    setenv("L3D_MM_DW_MIN_ROWS", "1", 1);
    struct l3d_backend *blk = l3d_backend_cpu_init();
    unsetenv("L3D_MM_DW_BLOCK_KB");
    unsetenv("L3D_MM_DW_MIN_ROWS");
    test_rule(be, brg, blk);
    const int64_t shapes[][3] = {{64, 96, 400}, {33, 48, 1000}, {128, 64, 72}, {7, 13, 29},
                                 {200, 40, 40}, {2048, 40, 150}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        test_shape(be, brg, blk, shapes[i][0], shapes[i][1], shapes[i][2], 1000 + 10 * i);
    l3d_backend_free(be);
    l3d_backend_free(brg);
    l3d_backend_free(blk);
    return TEST_REPORT();
}
