/* The fused element-wise kernels against what they replace, in one process, rounds interleaved so
 * that a shared machine's load falls on both alike (docs/BENCHMARKS.md, "Fused element-wise
 * kernels"), on the current OpenMP thread count, the best of ROUNDS rounds, in ms and GB/s (the
 * bytes each kernel must move):
 *   - GELU forward and backward over N x F elements, fp32 rows through each SIMD path this CPU has
 *     (scalar, AVX2, AVX-512: src/backend/cpu_ew.c), and through the backend in fp32, bf16, fp16;
 *   - residual + LayerNorm and residual + RMSNorm over N x C: the fused kernel against the pair
 *     (residual_forward, then the norm), in fp32, bf16, fp16;
 *   - layernorm_backward over N x C (dinp accumulated, the weight gradients in an fp32 main_grad);
 *   - STREAM's triad over the same bytes, the bandwidth they are measured against.
 * With one thread the times are the thread's CPU time (other processes' time slices on a shared
 * machine left out), else wall-clock time.
 *   l3d_bench_fused [N] [C] [F] [ROUNDS]     (defaults 2048 768 3072 7: GPT-2 124M at B*T 2048) */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu_ew.h"
#include "llm3d/backend.h"
#include "llm3d/core.h"

/* A device buffer of n elements of type t, normal(mu, sd), each rounded once on the host. */
static void *filled(struct l3d_backend *be, enum l3d_dtype t, int64_t n, float mu, float sd,
                    uint64_t s) {
    size_t es = l3d_dtype_size(t);
    char *h = l3d_alloc((size_t)n * es, "bench host");
    for (int64_t i = 0; i < n; i++) {
        float v = mu + sd * l3d_rng_normal(s, 0, (uint64_t)i);
        uint16_t r = t == L3D_BF16 ? l3d_f32_to_bf16(v) : t == L3D_F16 ? l3d_f32_to_f16(v) : 0;
        memcpy(h + (size_t)i * es, t == L3D_F32 ? (const void *)&v : (const void *)&r, es);
    }
    void *d = l3d_be_alloc(be, (size_t)n * es, "bench");
    if (!d) {
        fprintf(stderr, "l3d_bench_fused: out of memory for %lld elements (use a smaller N, C "
                        "or F)\n", (long long)n);
        exit(1);
    }
    l3d_be_copy_h2d(be, d, h, (size_t)n * es);
    l3d_free(h);
    return d;
}

enum { K_TRIAD, K_SIMD0, K_SIMD_END = K_SIMD0 + 8, K_GELU_F = K_SIMD_END, K_GELU_B = K_GELU_F + 3,
       K_PAIR_LN = K_GELU_B + 3, K_FUSED_LN = K_PAIR_LN + 3, K_PAIR_RMS = K_FUSED_LN + 3,
       K_FUSED_RMS = K_PAIR_RMS + 3, K_LN_BWD = K_FUSED_RMS + 3, K_N = K_LN_BWD + 3 };

struct bufs {
    void *x[3], *y[3], *d[3], *a[3], *b[3], *res[3], *out[3], *w[3], *bias[3];
    float *mean, *rstd, *tf[3], *gw, *gb;
};

/* the thread's CPU time with one thread, else the wall clock */
static double now(void) {
    struct timespec t;
    if (omp_get_max_threads() > 1) return l3d_time_s();
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#define TIME(slot, call)                                                                     \
    do {                                                                                     \
        l3d_be_sync(be);                                                                     \
        double t0_ = now();                                                                  \
        call;                                                                                \
        l3d_be_sync(be);                                                                     \
        double t_ = now() - t0_;                                                             \
        if (t_ < best[slot]) best[slot] = t_;                                                \
    } while (0)

static void round_(struct l3d_backend *be, struct bufs *u, int64_t N, int64_t C, int64_t F,
                   double *best) {
    const enum l3d_dtype ty[3] = {L3D_F32, L3D_BF16, L3D_F16};
    int64_t NF = N * F, n3 = NF / 3;
    TIME(K_TRIAD, l3d_cpu_triad_pass(u->tf[0], u->tf[1], u->tf[2], n3));
    for (int isa = 0; isa <= (int)l3d_cpu_simd(); isa++) {
        TIME(K_SIMD0 + 2 * isa, l3d_cpu_gelu_rows(isa, L3D_F32, u->tf[0], u->tf[1], NULL, n3));
        TIME(K_SIMD0 + 2 * isa + 1,
             l3d_cpu_gelu_rows(isa, L3D_F32, u->tf[0], u->tf[1], u->tf[2], n3));
    }
    for (int k = 0; k < 3; k++) {
        enum l3d_dtype t = ty[k];
        TIME(K_GELU_F + k, l3d_be_gelu_forward(be, t, u->y[k], u->x[k], NF));
        TIME(K_GELU_B + k, l3d_be_gelu_backward(be, t, u->y[k], u->d[k], u->x[k], NF));
        TIME(K_PAIR_LN + k, (l3d_be_residual_forward(be, t, u->res[k], u->a[k], u->b[k], N * C),
                             l3d_be_layernorm_forward(be, t, u->out[k], u->mean, u->rstd,
                                                      u->res[k], u->w[k], u->bias[k], N, C)));
        TIME(K_FUSED_LN + k,
             l3d_be_residual_layernorm_forward(be, t, u->res[k], u->out[k], u->mean, u->rstd,
                                               u->a[k], u->b[k], u->w[k], u->bias[k], N, C));
        TIME(K_PAIR_RMS + k, (l3d_be_residual_forward(be, t, u->res[k], u->a[k], u->b[k], N * C),
                              l3d_be_rmsnorm_forward(be, t, u->out[k], u->rstd, u->res[k],
                                                     u->w[k], N, C, 1e-6f)));
        TIME(K_FUSED_RMS + k,
             l3d_be_residual_rmsnorm_forward(be, t, u->res[k], u->out[k], u->rstd, u->a[k],
                                             u->b[k], u->w[k], N, C, 1e-6f));
        /* the model's call: dinp in the storage type, the weight gradients in an fp32
         * main_grad (the dout buffer a is read, res the input, dinp out accumulated) */
        TIME(K_LN_BWD + k, l3d_be_layernorm_backward_mixed(be, t, L3D_F32, u->out[k], u->gw, u->gb,
                                                           u->a[k], u->res[k], u->w[k], u->mean,
                                                           u->rstd, N, C));
    }
}

static void report(const double *best, int64_t N, int64_t C, int64_t F) {
    const char *tn[3] = {"fp32", "bf16", "fp16"};
    const char *isa[4] = {"scalar", "avx2", "avx512", "avx512bf"};
    const double es[3] = {4, 2, 2}, n3 = (double)(N * F / 3);
    printf("triad                      %8.2f ms  %6.2f GB/s\n", best[K_TRIAD] * 1e3,
           12 * n3 / best[K_TRIAD] / 1e9);
    for (int i = 0; i <= (int)l3d_cpu_simd(); i++)
        printf("gelu rows fp32 %-7s      fwd %7.2f ms %6.2f GB/s   bwd %7.2f ms %6.2f GB/s\n",
               isa[i], best[K_SIMD0 + 2 * i] * 1e3, 8 * n3 / best[K_SIMD0 + 2 * i] / 1e9,
               best[K_SIMD0 + 2 * i + 1] * 1e3, 16 * n3 / best[K_SIMD0 + 2 * i + 1] / 1e9);
    for (int k = 0; k < 3; k++) {
        double nf = (double)(N * F), nc = (double)(N * C);
        printf("gelu %s (backend)         fwd %7.2f ms %6.2f GB/s   bwd %7.2f ms %6.2f GB/s\n",
               tn[k], best[K_GELU_F + k] * 1e3, 2 * es[k] * nf / best[K_GELU_F + k] / 1e9,
               best[K_GELU_B + k] * 1e3, 4 * es[k] * nf / best[K_GELU_B + k] / 1e9);
        printf("residual+layernorm %s     pair %7.2f ms   fused %7.2f ms %6.2f GB/s (%.2fx)\n",
               tn[k], best[K_PAIR_LN + k] * 1e3, best[K_FUSED_LN + k] * 1e3,
               4 * es[k] * nc / best[K_FUSED_LN + k] / 1e9,
               best[K_PAIR_LN + k] / best[K_FUSED_LN + k]);
        printf("residual+rmsnorm %s       pair %7.2f ms   fused %7.2f ms %6.2f GB/s (%.2fx)\n",
               tn[k], best[K_PAIR_RMS + k] * 1e3, best[K_FUSED_RMS + k] * 1e3,
               4 * es[k] * nc / best[K_FUSED_RMS + k] / 1e9,
               best[K_PAIR_RMS + k] / best[K_FUSED_RMS + k]);
        /* bytes: dout and inp read, dinp read and written */
        printf("layernorm_backward %s          %7.2f ms %6.2f GB/s\n", tn[k],
               best[K_LN_BWD + k] * 1e3, 4 * es[k] * nc / best[K_LN_BWD + k] / 1e9);
    }
}

int main(int argc, char **argv) {
    int64_t N = argc > 1 ? atoll(argv[1]) : 2048, C = argc > 2 ? atoll(argv[2]) : 768;
    int64_t F = argc > 3 ? atoll(argv[3]) : 3072;
    int rounds = argc > 4 ? atoi(argv[4]) : 7;
    if (N < 1 || C < 1 || F < 3 || rounds < 1) {
        fprintf(stderr, "l3d_bench_fused: N, C, ROUNDS must be at least 1 and F at least 3 "
                        "(got %lld %lld %lld %d)\n", (long long)N, (long long)C, (long long)F,
                rounds);
        return 1;
    }
    struct l3d_backend *be = l3d_backend_cpu_init();
    const enum l3d_dtype ty[3] = {L3D_F32, L3D_BF16, L3D_F16};
    struct bufs u = {0};
    for (int k = 0; k < 3; k++) {
        u.x[k] = filled(be, ty[k], N * F, 0.0f, 2.0f, 1);
        u.y[k] = filled(be, ty[k], N * F, 0.0f, 1.0f, 2);
        u.d[k] = filled(be, ty[k], N * F, 0.0f, 1.0f, 3);
        u.a[k] = filled(be, ty[k], N * C, 0.0f, 1.0f, 4);
        u.b[k] = filled(be, ty[k], N * C, 0.0f, 1.0f, 5);
        u.res[k] = filled(be, ty[k], N * C, 0.0f, 1.0f, 6);
        u.out[k] = filled(be, ty[k], N * C, 0.0f, 1.0f, 7);
        u.w[k] = filled(be, ty[k], C, 1.0f, 0.1f, 8);
        u.bias[k] = filled(be, ty[k], C, 0.0f, 0.1f, 9);
        u.tf[k] = filled(be, L3D_F32, N * F / 3, 0.0f, 2.0f, 10 + (uint64_t)k);
    }
    u.mean = filled(be, L3D_F32, N, 0, 1, 20);
    u.rstd = filled(be, L3D_F32, N, 1, 0.1f, 21);
    u.gw = filled(be, L3D_F32, C, 0, 1, 22);
    u.gb = filled(be, L3D_F32, C, 0, 1, 23);
    double best[K_N];
    for (int i = 0; i < K_N; i++) best[i] = 1e30;
    for (int r = 0; r < rounds; r++) round_(be, &u, N, C, F, best);
    printf("N=%lld C=%lld F=%lld, %d thread(s), best of %d interleaved rounds\n", (long long)N,
           (long long)C, (long long)F, omp_get_max_threads(), rounds);
    report(best, N, C, F);
    l3d_backend_free(be);
    return 0;
}
