/* Measured peaks of this CPU: FMA throughput, sgemm, STREAM triad bandwidth (include/llm3d/backend.h). */
#include <dnnl.h>
#include <immintrin.h>
#include <math.h>
#include <omp.h>

#include "llm3d/backend.h"
#include "llm3d/core.h"

#define NACC 16 /* independent accumulators: enough to cover FMA latency x pipes */

/* Returns FLOPs done in `iters` iterations; acc values are stored to keep the loop alive. */
__attribute__((target("avx512f"))) static double fma_loop_avx512(int64_t iters, float *sink) {
    __m512 acc[NACC];
    __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < NACC; i++) acc[i] = _mm512_set1_ps((float)i);
    for (int64_t it = 0; it < iters; it++)
        for (int i = 0; i < NACC; i++) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
    __m512 s = acc[0];
    for (int i = 1; i < NACC; i++) s = _mm512_add_ps(s, acc[i]);
    *sink = _mm512_reduce_add_ps(s);
    return (double)iters * NACC * 16 * 2;
}

__attribute__((target("avx2,fma"))) static double fma_loop_avx2(int64_t iters, float *sink) {
    __m256 acc[NACC];
    __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
    for (int i = 0; i < NACC; i++) acc[i] = _mm256_set1_ps((float)i);
    for (int64_t it = 0; it < iters; it++)
        for (int i = 0; i < NACC; i++) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
    __m256 s = acc[0];
    for (int i = 1; i < NACC; i++) s = _mm256_add_ps(s, acc[i]);
    float v[8];
    _mm256_storeu_ps(v, s);
    *sink = v[0] + v[7];
    return (double)iters * NACC * 8 * 2;
}

typedef double (*peak_loop)(int64_t iters, float *sink);

/* The best of five short rounds of `loop` on every thread, each about seconds / 5 (the clock
 * ramps up and other load comes and goes), with iters chosen per lanes of the instruction. */
static double peak_rounds(peak_loop loop, int64_t lanes, double seconds) {
    double best = 0.0;
    for (int round = 0; round < 5; round++) {
        double flops = 0.0;
        double t0 = l3d_time_s();
#pragma omp parallel reduction(+ : flops)
        {
            float s;
            flops += loop((int64_t)(2e8 * seconds / 5) / lanes, &s);
            volatile float keep = s; /* keeps the loop's result live */
            (void)keep;
        }
        double dt = l3d_time_s() - t0;
        if (flops / dt > best) best = flops / dt;
    }
    return best;
}

double l3d_cpu_fma_peak(double seconds) {
    if (__builtin_cpu_supports("avx512f")) return peak_rounds(fma_loop_avx512, 16, seconds);
    return peak_rounds(fma_loop_avx2, 8, seconds);
}

/* vdpbf16ps: each of the 16 fp32 lanes adds two bf16 products, 4 FLOPs a lane an instruction. */
__attribute__((target("avx512f,avx512bf16"))) static double bf16_loop(int64_t iters, float *sink) {
    __m512 acc[NACC];
    __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3380);
    for (int i = 0; i < NACC; i++) acc[i] = _mm512_set1_ps((float)i);
    for (int64_t it = 0; it < iters; it++)
        for (int i = 0; i < NACC; i++) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
    __m512 s = acc[0];
    for (int i = 1; i < NACC; i++) s = _mm512_add_ps(s, acc[i]);
    *sink = _mm512_reduce_add_ps(s);
    return (double)iters * NACC * 16 * 4;
}

double l3d_cpu_bf16_peak(double seconds) {
    if (!__builtin_cpu_supports("avx512bf16")) return 0.0;
    return peak_rounds(bf16_loop, 32, seconds);
}

double l3d_cpu_sgemm_flops(int64_t M, int64_t N, int64_t K, double seconds) {
    float *A = l3d_calloc((size_t)(M * K) * sizeof(float), "bench");
    float *B = l3d_calloc((size_t)(N * K) * sizeof(float), "bench");
    float *C = l3d_calloc((size_t)(M * N) * sizeof(float), "bench");
    dnnl_sgemm('N', 'T', M, N, K, 1.0f, A, K, B, K, 0.0f, C, N); /* warm-up */
    double best = 0.0, start = l3d_time_s();
    int reps = 0;
    while (reps < 3 || l3d_time_s() - start < seconds) {
        double t0 = l3d_time_s();
        dnnl_sgemm('N', 'T', M, N, K, 1.0f, A, K, B, K, 0.0f, C, N);
        double dt = l3d_time_s() - t0;
        double f = 2.0 * (double)M * N * K / dt;
        if (f > best) best = f;
        reps++;
    }
    l3d_free(A);
    l3d_free(B);
    l3d_free(C);
    return best;
}

/* STREAM's triad (McCalpin 1995), a[i] = b[i] + s c[i], counted as STREAM counts it: 3 x 4 bytes
 * an element (two reads, one write; the write-allocate read of a is not counted). */
double l3d_cpu_triad_pass(float *a, const float *b, const float *c, int64_t n) {
    const float s = 0.5f;
    double t0 = l3d_time_s();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; i++) a[i] = b[i] + s * c[i];
    return l3d_time_s() - t0;
}

/* The arrays are first touched by the threads that time them (same static schedule), so pages
 * sit on their nodes and no page fault is timed. */
double l3d_cpu_triad_bw(size_t bytes, double seconds) {
    int64_t n = (int64_t)(bytes / (3 * sizeof(float)));
    float *a = l3d_alloc((size_t)n * sizeof(float), "bench");
    float *b = l3d_alloc((size_t)n * sizeof(float), "bench");
    float *c = l3d_alloc((size_t)n * sizeof(float), "bench");
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        a[i] = 0.0f;
        b[i] = 1.0f;
        c[i] = 2.0f;
    }
    double best = INFINITY, start = l3d_time_s();
    for (int reps = 0; reps < 4 || l3d_time_s() - start < seconds; reps++) {
        double dt = l3d_cpu_triad_pass(a, b, c, n);
        if (dt < best) best = dt;
    }
    volatile float keep = a[n / 2]; /* the stores are live */
    (void)keep;
    l3d_free(a);
    l3d_free(b);
    l3d_free(c);
    return 3.0 * sizeof(float) * (double)n / best;
}
