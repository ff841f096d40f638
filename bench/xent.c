/* The cross-entropy kernels alone (docs/DESIGN.md, "Cross-entropy rows"): xent_stats (max, sum of
 * exponentials, target logit) and xent_backward (logits in place -> dlogits) over N x V logits in
 * fp32, bf16 and fp16 through the backend, with STREAM's triad, rounds interleaved so that a shared
 * machine's load falls on all alike; the best of ROUNDS rounds in ms and GB/s (stats reads the
 * logits once, backward reads and writes them). With one thread the times are the thread's CPU
 * time (other processes' time slices left out), else wall-clock time. The logits are refilled
 * before each backward, outside the timing.
 *   l3d_bench_xent [N] [V] [ROUNDS]     (defaults 2048 50304 5: GPT-2 124M at B*T 2048) */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "llm3d/backend.h"
#include "llm3d/core.h"

/* the thread's CPU time with one thread, else the wall clock */
static double now(void) {
    struct timespec t;
    if (omp_get_max_threads() > 1) return l3d_time_s();
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* n elements of type t, normal(0, 2), each rounded once (the host copy the rounds refill from) */
static char *host_logits(enum l3d_dtype t, int64_t n) {
    size_t es = l3d_dtype_size(t);
    char *h = l3d_alloc((size_t)n * es, "bench host");
    for (int64_t i = 0; i < n; i++) {
        float v = 2.0f * l3d_rng_normal(1, 0, (uint64_t)i);
        uint16_t r = t == L3D_BF16 ? l3d_f32_to_bf16(v) : t == L3D_F16 ? l3d_f32_to_f16(v) : 0;
        memcpy(h + (size_t)i * es, t == L3D_F32 ? (const void *)&v : (const void *)&r, es);
    }
    return h;
}

int main(int argc, char **argv) {
    int64_t N = argc > 1 ? atoll(argv[1]) : 2048, V = argc > 2 ? atoll(argv[2]) : 50304;
    int rounds = argc > 3 ? atoi(argv[3]) : 5;
    if (N < 1 || V < 1 || rounds < 1) {
        fprintf(stderr, "l3d_bench_xent: N, V and ROUNDS must be at least 1 (got %lld %lld %d)\n",
                (long long)N, (long long)V, rounds);
        return 1;
    }
    struct l3d_backend *be = l3d_backend_cpu_init();
    const enum l3d_dtype ty[3] = {L3D_F32, L3D_BF16, L3D_F16};
    const char *tn[3] = {"fp32", "bf16", "fp16"};
    char *host[3];
    void *dev[3];
    for (int k = 0; k < 3; k++) {
        host[k] = host_logits(ty[k], N * V);
        dev[k] = l3d_be_alloc(be, (size_t)(N * V) * l3d_dtype_size(ty[k]), "bench logits");
        if (!dev[k]) {
            fprintf(stderr, "l3d_bench_xent: out of memory for %lld logits (use a smaller N or "
                            "V)\n", (long long)(N * V));
            return 1;
        }
    }
    int32_t *tg = l3d_alloc((size_t)N * 4, "bench targets");
    for (int64_t i = 0; i < N; i++) tg[i] = (int32_t)((i * 7919) % V);
    float *mx = l3d_alloc((size_t)N * 4, "bench"), *se = l3d_alloc((size_t)N * 4, "bench");
    float *tl = l3d_alloc((size_t)N * 4, "bench");
    int64_t n3 = N * V / 4; /* a triad over as many bytes as the bf16 logits */
    float *ta = l3d_alloc((size_t)n3 * 4, "bench"), *tb = l3d_alloc((size_t)n3 * 4, "bench");
    float *tc = l3d_alloc((size_t)n3 * 4, "bench");
    for (int64_t i = 0; i < n3; i++) ta[i] = tb[i] = tc[i] = 1.0f;
    double best[7];
    for (int i = 0; i < 7; i++) best[i] = 1e30;
    for (int r = 0; r < rounds; r++) {
        double t = l3d_cpu_triad_pass(ta, tb, tc, n3);
        best[6] = t < best[6] ? t : best[6];
        for (int k = 0; k < 3; k++) {
            l3d_be_copy_h2d(be, dev[k], host[k], (size_t)(N * V) * l3d_dtype_size(ty[k]));
            double t0 = now();
            l3d_be_xent_stats(be, ty[k], mx, se, tl, dev[k], tg, 0, N, V, V);
            double t1 = now();
            l3d_be_xent_backward(be, ty[k], dev[k], mx, se, tg, 1.0f / (float)N, 0, N, V, V);
            double t2 = now();
            best[2 * k] = t1 - t0 < best[2 * k] ? t1 - t0 : best[2 * k];
            best[2 * k + 1] = t2 - t1 < best[2 * k + 1] ? t2 - t1 : best[2 * k + 1];
        }
    }
    printf("N=%lld V=%lld, %d thread(s), best of %d interleaved rounds\n", (long long)N,
           (long long)V, omp_get_max_threads(), rounds);
    printf("triad            %8.2f ms %6.2f GB/s\n", best[6] * 1e3, 12.0 * n3 / best[6] / 1e9);
    for (int k = 0; k < 3; k++) {
        double b = (double)(N * V) * (double)l3d_dtype_size(ty[k]);
        printf("xent %s  stats %8.2f ms %6.2f GB/s   backward %8.2f ms %6.2f GB/s\n", tn[k],
               best[2 * k] * 1e3, b / best[2 * k] / 1e9, best[2 * k + 1] * 1e3,
               2 * b / best[2 * k + 1] / 1e9);
    }
    return 0;
}
