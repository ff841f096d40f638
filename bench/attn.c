/* bf16 attention's paths side by side (docs/BENCHMARKS.md): forward + backward at B, T, NH heads
 * of HS, on three CPU backends made with L3D_ATTN_DNNL=1 (oneDNN's bf16 matmuls, AMX where
 * present), L3D_ATTN_DNNL=0 L3D_ATTN_DOT=0 (the flash kernels widened to fp32) and
 * L3D_ATTN_DNNL=0 L3D_ATTN_DOT=1 (the flash kernels in vdpbf16ps dot products), interleaved
 * round by round in one process so that a shared machine's load falls on each alike. Per path:
 * the best and the median wall time of a round, and the median process CPU time (all threads; run
 * with OMP_WAIT_POLICY=passive so that waiting threads do not spin), in ms, and GFLOP/s of the
 * best (causal: 2 B NH T^2 HS FLOPs forward, 2.5x that backward, FlashAttention-2's count).
 *   l3d_bench_attn [B] [T] [NH] [HS] [ROUNDS]     (defaults 8 256 12 64 7) */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "llm3d/backend.h"
#include "llm3d/core.h"

#define PATHS 3
#define MAXR 64

static double clk(clockid_t c) {
    struct timespec ts;
    clock_gettime(c, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static uint16_t *bf16_buf(int64_t n, uint64_t seed) {
    uint16_t *h = l3d_alloc((size_t)n * 2, "bench");
    for (int64_t i = 0; i < n; i++)
        h[i] = l3d_f32_to_bf16(2.0f * l3d_rng_uniform(seed, 0, (uint64_t)i) - 1.0f);
    return h;
}

int main(int argc, char **argv) {
    const int64_t B = argc > 1 ? atoll(argv[1]) : 8, T = argc > 2 ? atoll(argv[2]) : 256;
    const int64_t NH = argc > 3 ? atoll(argv[3]) : 12, HS = argc > 4 ? atoll(argv[4]) : 64;
    const int R = argc > 5 ? atoi(argv[5]) : 7;
    if (B < 1 || T < 1 || NH < 1 || HS < 1 || R < 1 || R > MAXR) {
        fprintf(stderr, "l3d_bench_attn: B T NH HS ROUNDS must be positive (ROUNDS <= %d), got "
                "%lld %lld %lld %lld %d\n", MAXR, (long long)B, (long long)T, (long long)NH,
                (long long)HS, R);
        return 1;
    }
    static const char *const name[PATHS] = {"oneDNN matmuls", "widened fp32", "vdpbf16ps dots"};
    static const char *const dnnl[PATHS] = {"1", "0", "0"}, *const dot[PATHS] = {"0", "0", "1"};
    struct l3d_backend *be[PATHS];
    for (int p = 0; p < PATHS; p++) {
        setenv("L3D_ATTN_DNNL", dnnl[p], 1);
        setenv("L3D_ATTN_DOT", dot[p], 1); /* read at each call: set again before each run */
        be[p] = l3d_backend_cpu_init();
    }
    const int64_t nqkv = B * T * 3 * NH * HS, nout = B * T * NH * HS;
    uint16_t *qkv = bf16_buf(nqkv, 1), *dout = bf16_buf(nout, 2), *dqkv = bf16_buf(nqkv, 3);
    uint16_t *out = bf16_buf(nout, 4);
    float *lse = l3d_alloc((size_t)(B * NH * T) * sizeof(float), "bench");
    double wall[PATHS][MAXR], cpu[PATHS][MAXR];
    for (int r = -1; r < R; r++) /* round -1: every scratch and primitive made, untimed */
        for (int p = 0; p < PATHS; p++) {
            setenv("L3D_ATTN_DOT", dot[p], 1);
            double w0 = clk(CLOCK_MONOTONIC), c0 = clk(CLOCK_PROCESS_CPUTIME_ID);
            l3d_be_attention_forward(be[p], L3D_BF16, out, lse, qkv, B, T, NH, NH, HS);
            l3d_be_attention_backward(be[p], L3D_BF16, dqkv, dout, qkv, out, lse, B, T, NH, NH, HS);
            if (r >= 0)
                wall[p][r] = clk(CLOCK_MONOTONIC) - w0, cpu[p][r] = clk(CLOCK_PROCESS_CPUTIME_ID) - c0;
        }
    const double flops = 3.5 * 2.0 * (double)(B * NH * T) * (double)T * (double)HS;
    printf("bf16 attention B=%lld T=%lld NH=%lld HS=%lld, forward + backward, %d interleaved "
           "rounds:\n", (long long)B, (long long)T, (long long)NH, (long long)HS, R);
    for (int p = 0; p < PATHS; p++) {
        qsort(wall[p], (size_t)R, sizeof(double), cmp_d);
        qsort(cpu[p], (size_t)R, sizeof(double), cmp_d);
        printf("  %-15s best %8.2f ms  median %8.2f ms  cpu %8.2f ms  %7.1f GFLOP/s\n", name[p],
               wall[p][0] * 1e3, wall[p][R / 2] * 1e3, cpu[p][R / 2] * 1e3,
               flops / wall[p][0] * 1e-9);
    }
    for (int p = 0; p < PATHS; p++) l3d_backend_free(be[p]);
    l3d_free(qkv), l3d_free(dout), l3d_free(dqkv), l3d_free(out), l3d_free(lse);
    return 0;
}
