/* Mixed-precision kernels against fp32, through the backend ($L3D_BACKEND, default cpu), on the
 * current OpenMP thread count (run it with OMP_NUM_THREADS=1 and 2):
 *   - the linear layers of GPT-2 124M at rows N (B*T): forward out (N,OC) = inp (N,C) W^T + b,
 *     2 N C OC FLOPs, and backward (dinp and dweight, 4 N C OC FLOPs; 16-bit runs accumulate
 *     dweight into an fp32 main_grad as the model will), in GFLOP/s, the median of the passes run
 *     in about SECONDS each;
 *   - the tiled attention forward + backward at B, T = 1024, 12 heads of 64, in ms.
 * Which matrix product runs is printed: oneDNN's 16-bit matmul, or fp32 around the fp32 product
 * on a CPU without one (the conversions are part of the time).
 *   l3d_bench_mixed [N] [SECONDS] [ATT_B] [ATT_T]     (defaults 256 0.5 1 1024) */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include "llm3d/backend.h"
#include "llm3d/core.h"

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* A device buffer of n elements of type t with values uniform in [-a, a). */
static void *filled(struct l3d_backend *be, enum l3d_dtype t, int64_t n, float a, uint64_t s) {
    float *h = l3d_alloc((size_t)n * sizeof(float), "bench host");
    for (int64_t i = 0; i < n; i++) h[i] = a * (2.0f * l3d_rng_uniform(s, 0, (uint64_t)i) - 1.0f);
    float *d32 = l3d_be_alloc(be, (size_t)n * sizeof(float), "bench");
    void *d = l3d_be_alloc(be, (size_t)n * l3d_dtype_size(t), "bench");
    if (!d32 || !d) {
        fprintf(stderr, "l3d_bench_mixed: out of memory\n");
        exit(1);
    }
    l3d_be_copy_h2d(be, d32, h, (size_t)n * sizeof(float));
    l3d_be_convert(be, t, d, L3D_F32, d32, n);
    l3d_be_free(be, d32);
    l3d_free(h);
    return d;
}

#define MAXP 256

static double median(double *x, int n) {
    qsort(x, (size_t)n, sizeof x[0], cmp_d);
    return x[n / 2];
}

/* One linear layer's operands in type t (dweight: an fp32 main_grad). */
struct lin {
    enum l3d_dtype t;
    void *x, *w, *b, *y, *dx, *dw;
};

static void lin_init(struct l3d_backend *be, struct lin *l, enum l3d_dtype t, int64_t N, int64_t C,
                     int64_t OC) {
    l->t = t;
    l->x = filled(be, t, N * C, 1, 1), l->w = filled(be, t, OC * C, 0.05f, 2);
    l->b = filled(be, t, OC, 0.1f, 3), l->y = filled(be, t, N * OC, 1, 4);
    l->dx = filled(be, t, N * C, 0, 5), l->dw = filled(be, L3D_F32, OC * C, 0, 6);
}
static void lin_free(struct l3d_backend *be, struct lin *l) {
    l3d_be_free(be, l->x), l3d_be_free(be, l->w), l3d_be_free(be, l->b), l3d_be_free(be, l->y);
    l3d_be_free(be, l->dx), l3d_be_free(be, l->dw);
}
/* seconds of one forward (k = 0) or backward (k = 1) call */
static double lin_pass(struct l3d_backend *be, struct lin *l, int k, int64_t N, int64_t C,
                       int64_t OC) {
    double t0 = l3d_time_s();
    if (k == 0)
        l3d_be_matmul_forward(be, l->t, l->y, l->x, l->w, l->b, N, C, OC);
    else
        l3d_be_matmul_backward_mixed(be, l->t, L3D_F32, l->dx, l->dw, NULL, l->y, l->x, l->w, N,
                                     C, OC);
    l3d_be_sync(be);
    return l3d_time_s() - t0;
}

struct att {
    enum l3d_dtype t;
    void *qkv, *dout, *out, *dqkv;
    float *lse;
};

static double att_pass(struct l3d_backend *be, struct att *a, int64_t B, int64_t T, int64_t NH,
                       int64_t HS) {
    double t0 = l3d_time_s();
    l3d_be_attention_forward(be, a->t, a->out, a->lse, a->qkv, B, T, NH, NH, HS);
    l3d_be_attention_backward(be, a->t, a->dqkv, a->dout, a->qkv, a->out, a->lse, B, T, NH, NH,
                              HS);
    l3d_be_sync(be);
    return l3d_time_s() - t0;
}

int main(int argc, char **argv) {
    int64_t N = argc > 1 ? atoll(argv[1]) : 256;
    double secs = argc > 2 ? atof(argv[2]) : 0.5;
    int64_t AB = argc > 3 ? atoll(argv[3]) : 1, AT = argc > 4 ? atoll(argv[4]) : 1024;
    if (N < 1 || !(secs > 0) || AB < 1 || AT < 1) {
        fprintf(stderr, "usage: l3d_bench_mixed [N >= 1] [SECONDS > 0] [ATT_B] [ATT_T]\n");
        return 2;
    }
    struct l3d_backend *be;
    if (l3d_backend_init(NULL, &be) != L3D_OK) {
        fprintf(stderr, "l3d_bench_mixed: %s\n", l3d_error_message());
        return 2;
    }
    const enum l3d_dtype ts[3] = {L3D_F32, L3D_BF16, L3D_F16};
    const int64_t shapes[][2] = {{768, 2304}, {768, 768}, {768, 3072}, {3072, 768}};
    printf("backend %s, %d threads, N = %lld rows; peak (l3d_be_peak_flops): fp32 %.1f, bf16 %.1f "
           "GFLOP/s (bf16 dot products with AVX512-BF16, else fp32 FMAs)\n",
           l3d_backend_name(be), omp_get_max_threads(), (long long)N,
           l3d_be_peak_flops(be, L3D_F32) / 1e9, l3d_be_peak_flops(be, L3D_BF16) / 1e9);
    printf("(the three types interleaved pass by pass, medians: the machine's load drifts)\n");
    printf("%-16s %-5s %12s %12s %10s %10s\n", "shape C x OC", "type", "fwd GFLOP/s",
           "bwd GFLOP/s", "fwd vs f32", "bwd vs f32");
    static double tp[3][2][MAXP];
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t C = shapes[s][0], OC = shapes[s][1];
        struct lin l[3];
        for (int k = 0; k < 3; k++) {
            lin_init(be, &l[k], ts[k], N, C, OC);
            lin_pass(be, &l[k], 0, N, C, OC), lin_pass(be, &l[k], 1, N, C, OC); /* warm-up */
        }
        int n = 0;
        for (double start = l3d_time_s(); n < 3 || (n < MAXP && l3d_time_s() - start < 3 * secs);
             n++)
            for (int k = 0; k < 3; k++)
                for (int d = 0; d < 2; d++) tp[k][d][n] = lin_pass(be, &l[k], d, N, C, OC);
        double g[3][2];
        for (int k = 0; k < 3; k++)
            for (int d = 0; d < 2; d++)
                g[k][d] = (d + 1) * 2.0 * (double)N * C * OC / median(tp[k][d], n) / 1e9;
        for (int k = 0; k < 3; k++) {
            char shape[32];
            snprintf(shape, sizeof shape, "%lld x %lld", (long long)C, (long long)OC);
            printf("%-16s %-5s %12.1f %12.1f %10.2f %10.2f\n", shape, l3d_dtype_name(ts[k]),
                   g[k][0], g[k][1], g[k][0] / g[0][0], g[k][1] / g[0][1]);
            lin_free(be, &l[k]);
        }
    }
    const int64_t NH = 12, HS = 64, nqkv = AB * AT * 3 * NH * HS, nout = AB * AT * NH * HS;
    struct att a[3];
    for (int k = 0; k < 3; k++) {
        a[k] = (struct att){.t = ts[k], .qkv = filled(be, ts[k], nqkv, 1, 7),
                            .dout = filled(be, ts[k], nout, 1, 8),
                            .out = filled(be, ts[k], nout, 0, 9),
                            .dqkv = filled(be, ts[k], nqkv, 0, 10),
                            .lse = l3d_be_alloc(be, (size_t)(AB * NH * AT) * 4, "bench lse")};
        att_pass(be, &a[k], AB, AT, NH, HS);
    }
    int n = 0;
    for (double start = l3d_time_s(); n < 3 || (n < MAXP && l3d_time_s() - start < 3 * secs); n++)
        for (int k = 0; k < 3; k++) tp[k][0][n] = att_pass(be, &a[k], AB, AT, NH, HS);
    double t32 = median(tp[0][0], n);
    for (int k = 0; k < 3; k++) {
        double t = median(tp[k][0], n);
        printf("attention B=%lld T=%lld NH=12 HS=64 %-5s fwd+bwd %8.1f ms  (%.2fx fp32's time)\n",
               (long long)AB, (long long)AT, l3d_dtype_name(ts[k]), t * 1e3, t / t32);
        l3d_be_free(be, a[k].qkv), l3d_be_free(be, a[k].dout), l3d_be_free(be, a[k].out);
        l3d_be_free(be, a[k].dqkv), l3d_be_free(be, a[k].lse);
    }
    l3d_backend_free(be);
    return 0;
}
