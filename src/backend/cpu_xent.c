/*
 * Softmax cross-entropy rows in explicit SIMD (cpu_xent.h). The logits are read where they lie,
 * widened in registers (bf16, fp16) or loaded as they are (fp32): the statistics read a row twice
 * (the maximum from memory, the sum of exponentials from cache: a GPT-2 row is 100 KB in bf16),
 * the gradient reads and writes it once. Before, each 16-bit row was widened into an fp32 scratch
 * row first and the loops left to GCC (8 lanes, exp without fused multiply-adds): xent_stats ran
 * at 16% and xent_backward at 33% of the memory bandwidth (docs/DESIGN.md, "Cross-entropy rows").
 *
 * Reductions: 32 lanes on every path (two 16-lane vectors, four 8-lane ones, or an array), element
 * j into lane j mod 32 in index order, the lanes combined by the tree of lane_tree. The tails are
 * masked (AVX-512) or blended (AVX2), never summed in scalar, so the result is the same bits on
 * every path, for any row length. Two accumulators (AVX-512) hide the add's latency behind the
 * exp's 13 vector operations.
 *
 * The gradient is element-wise: exp(x - mx) k with the exp of cpu_vec.h, whose lanes give s_exp's
 * bits; the target's element is recomputed in scalar from its saved logit with dloss subtracted
 * before its one rounding.
 */
#include <immintrin.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "backend/cpu_attn16.h"
#include "backend/cpu_vec.h"
#include "backend/cpu_xent.h"

#define XL L3D_XENT_LANES

/* Prefetch PF_BYTES ahead of byte b of row: the hardware prefetchers of the machine this was
 * written on left the in-place gradient bound by memory latency (bf16, 1024 GPT-2 rows, one
 * thread: 61 ms without, 22 ms with). Through an integer: a prefetch past the row's end (into the
 * next row, or unmapped) never faults, but the pointer arithmetic would be out of bounds. */
#define PF_BYTES 4096 /* 2 to 8 KB measured alike, 1 KB slower */
static inline void ahead(const void *row, int64_t b) {
    _mm_prefetch((const char *)((uintptr_t)row + (uintptr_t)(b + PF_BYTES)), _MM_HINT_T0);
}
/* ahead, and byte b of next into L2 (NULL: none) */
static inline void ahead2(const void *row, const void *next, int64_t b) {
    ahead(row, b);
    if (next) _mm_prefetch((const char *)next + b, _MM_HINT_T1);
}

/* a[0] = the lanes of a (XL) combined pairwise, halves first: the one order of every path */
static float lane_tree(float *a, bool max) {
    for (int w = XL / 2; w > 0; w /= 2)
        for (int i = 0; i < w; i++) a[i] = max ? s_max(a[i], a[i + w]) : a[i] + a[i + w];
    return a[0];
}

/* ---- scalar: the reference ----------------------------------------------------------------- */

/* max (the row's maximum) or the sum of exp(x - mx): s_max(x, acc) is maxps(x, acc), which keeps
 * acc when x is NaN */
static float red_scalar(enum l3d_dtype t, const void *row, int64_t n, float mx, bool max,
                        const void *next) {
    float a[XL];
    for (int i = 0; i < XL; i++) a[i] = max ? -INFINITY : 0.0f;
    for (int64_t j = 0; j < n; j++) {
        if (j % 16 == 0) ahead2(row, next, j * (t == L3D_F32 ? 4 : 2));
        float x = l3d_cpu_ld(t, row, j);
        a[j % XL] = max ? s_max(x, a[j % XL]) : a[j % XL] + s_exp(x - mx);
    }
    return lane_tree(a, max);
}

static void grad_scalar(enum l3d_dtype t, void *row, int64_t n, float mx, float k) {
    for (int64_t j = 0; j < n; j++) {
        if (j % 16 == 0) ahead(row, j * (t == L3D_F32 ? 4 : 2));
        l3d_cpu_st(t, row, j, s_exp(l3d_cpu_ld(t, row, j) - mx) * k);
    }
}

/* ---- AVX-512: 16 lanes, masked tails ------------------------------------------------------- */

__attribute__((target(T512))) static inline __m512 v16_red(__m512 acc, __mmask16 m, __m512 x,
                                                           __m512 mxv, bool max) {
    if (max) return _mm512_mask_max_ps(acc, m, x, acc);
    return _mm512_mask_add_ps(acc, m, acc, v16_exp(_mm512_sub_ps(x, mxv)));
}

__attribute__((target(T512))) static float red_avx512(enum l3d_dtype t, const void *row,
                                                      int64_t n, float mx, bool max,
                                                      const void *next) {
    const int64_t es = t == L3D_F32 ? 4 : 2;
    const __m512 mxv = _mm512_set1_ps(mx);
    __m512 a0 = _mm512_set1_ps(max ? -INFINITY : 0.0f), a1 = a0;
    const __mmask16 all = 0xFFFF;
    int64_t j = 0;
    for (; j + XL <= n; j += XL) {
        ahead2(row, next, j * es), ahead2(row, next, (j + 16) * es);
        a0 = v16_red(a0, all, v16_ld(t, row, j, all), mxv, max);
        a1 = v16_red(a1, all, v16_ld(t, row, j + 16, all), mxv, max);
    }
    int64_t r = n - j; /* under 32 */
    __mmask16 m0 = r >= 16 ? all : (__mmask16)((1u << r) - 1u);
    __mmask16 m1 = r <= 16 ? 0 : (__mmask16)((1u << (r - 16)) - 1u);
    a0 = v16_red(a0, m0, v16_ld(t, row, j, m0), mxv, max);
    if (m1) a1 = v16_red(a1, m1, v16_ld(t, row, j + 16, m1), mxv, max);
    float a[XL];
    _mm512_storeu_ps(a, a0);
    _mm512_storeu_ps(a + 16, a1);
    return lane_tree(a, max);
}

__attribute__((target(T512))) static void grad_avx512(enum l3d_dtype t, void *row, int64_t n,
                                                      float mx, float k) {
    const __m512 mxv = _mm512_set1_ps(mx), kv = _mm512_set1_ps(k);
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 m = n - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - j)) - 1u);
        ahead(row, j * (t == L3D_F32 ? 4 : 2));
        __m512 e = v16_exp(_mm512_sub_ps(v16_ld(t, row, j, m), mxv));
        v16_st(t, row, j, m, _mm512_mul_ps(e, kv));
    }
}

/* ---- AVX2 + FMA: 8 lanes, blended tails ---------------------------------------------------- */

/* acc where m is 0, else acc combined with x (m: all ones or zero per lane) */
__attribute__((target(T256))) static inline __m256 v8_red(__m256 acc, __m256 m, __m256 x,
                                                          __m256 mxv, bool max) {
    __m256 v = max ? _mm256_max_ps(x, acc) : _mm256_add_ps(acc, v8_exp(_mm256_sub_ps(x, mxv)));
    return _mm256_blendv_ps(acc, v, m);
}

__attribute__((target(T256))) static float red_avx2(enum l3d_dtype t, const void *row, int64_t n,
                                                    float mx, bool max, const void *next) {
    const int64_t es = t == L3D_F32 ? 4 : 2;
    const __m256 mxv = _mm256_set1_ps(mx), all = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
    __m256 a[XL / 8];
    for (int v = 0; v < XL / 8; v++) a[v] = _mm256_set1_ps(max ? -INFINITY : 0.0f);
    int64_t j = 0;
    for (; j + XL <= n; j += XL) {
        for (int v = 0; v < XL / 8; v++) {
            ahead2(row, next, (j + 8 * v) * es);
            a[v] = v8_red(a[v], all, v8_ld(t, (const char *)row + (j + 8 * v) * es), mxv, max);
        }
    }
    if (j < n) { /* the tail: a zero-padded copy, its lanes past n blended out */
        _Alignas(32) char pad[XL * 4] = {0};
        memcpy(pad, (const char *)row + j * es, (size_t)((n - j) * es));
        const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        for (int v = 0; v < XL / 8; v++) {
            __m256i left = _mm256_set1_epi32((int)(n - j - 8 * v));
            __m256 m = _mm256_castsi256_ps(_mm256_cmpgt_epi32(left, idx));
            a[v] = v8_red(a[v], m, v8_ld(t, pad + 8 * v * es), mxv, max);
        }
    }
    float l[XL];
    for (int v = 0; v < XL / 8; v++) _mm256_storeu_ps(l + 8 * v, a[v]);
    return lane_tree(l, max);
}

__attribute__((target(T256))) static inline __m256 v8_grad(__m256 x, __m256 mxv, __m256 kv) {
    return _mm256_mul_ps(v8_exp(_mm256_sub_ps(x, mxv)), kv);
}

/* the tail (under 8 elements) through the same vector code on a zero-padded copy */
__attribute__((target(T256))) static void grad_avx2(enum l3d_dtype t, void *row, int64_t n,
                                                    float mx, float k) {
    const int64_t es = t == L3D_F32 ? 4 : 2;
    const __m256 mxv = _mm256_set1_ps(mx), kv = _mm256_set1_ps(k);
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        char *p = (char *)row + j * es;
        ahead(row, j * es);
        v8_st(t, p, v8_grad(v8_ld(t, p), mxv, kv));
    }
    if (j == n) return;
    _Alignas(32) char pad[32] = {0};
    size_t b = (size_t)((n - j) * es);
    memcpy(pad, (char *)row + j * es, b);
    v8_st(t, pad, v8_grad(v8_ld(t, pad), mxv, kv));
    memcpy((char *)row + j * es, pad, b);
}

/* ---- the entry points ---------------------------------------------------------------------- */

/* the paths by enum l3d_simd; AVX512_BF16 takes the AVX-512 path (its stores round in integer
 * steps: the same bits) */
static float (*const red_path[])(enum l3d_dtype, const void *, int64_t, float, bool,
                                 const void *) = {[L3D_SIMD_SCALAR] = red_scalar,
                                                  [L3D_SIMD_AVX2] = red_avx2,
                                                  [L3D_SIMD_AVX512] = red_avx512,
                                                  [L3D_SIMD_AVX512BF16] = red_avx512};
static void (*const grad_path[])(enum l3d_dtype, void *, int64_t, float, float) = {
    [L3D_SIMD_SCALAR] = grad_scalar, [L3D_SIMD_AVX2] = grad_avx2,
    [L3D_SIMD_AVX512] = grad_avx512, [L3D_SIMD_AVX512BF16] = grad_avx512};
_Static_assert(sizeof red_path / sizeof red_path[0] == L3D_SIMD_AVX512BF16 + 1 &&
                   sizeof grad_path / sizeof grad_path[0] == L3D_SIMD_AVX512BF16 + 1,
               "a path for every enum l3d_simd");

float l3d_cpu_xent_max(enum l3d_simd isa, enum l3d_dtype t, const void *row, int64_t n) {
    return red_path[isa](t, row, n, 0.0f, true, NULL);
}

float l3d_cpu_xent_sumexp(enum l3d_simd isa, enum l3d_dtype t, const void *row, int64_t n,
                          float mx, const void *next) {
    return red_path[isa](t, row, n, mx, false, next);
}

void l3d_cpu_xent_grad(enum l3d_simd isa, enum l3d_dtype t, void *row, int64_t n, int64_t Vl,
                       float mx, float k, int64_t tgt, float dloss) {
    const bool has_t = tgt >= 0 && tgt < n;
    const float xt = has_t ? l3d_cpu_ld(t, row, tgt) : 0.0f; /* before the row is overwritten */
    grad_path[isa](t, row, n, mx, k);
    const size_t es = t == L3D_F32 ? 4 : 2;
    if (Vl > n) memset((char *)row + (size_t)n * es, 0, (size_t)(Vl - n) * es); /* +0 bits */
    if (has_t) l3d_cpu_st(t, row, tgt, s_exp(xt - mx) * k - dloss);
}
