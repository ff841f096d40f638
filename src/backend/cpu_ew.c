/*
 * GELU forward and backward in explicit SIMD (cpu_ew.h). GCC vectorised the portable loop at
 * 8 lanes (its tuning for these CPUs prefers 256-bit vectors), a tanh through exp and a
 * division each element: gelu_backward ran at a quarter of the memory bandwidth, bound by the
 * arithmetic (docs/BENCHMARKS.md, "Fused element-wise kernels"). Here:
 *
 *   2u = x (2K + 2K c x^2), K = sqrt(2/pi), c = 0.044715    (x clamped to [-10, 10] first)
 *   s  = 1 / (1 + exp(-2u))                                   = 0.5 (1 + tanh u)
 *   gelu(x)  = x s
 *   gelu'(x) = s + x s (1 - s) (2K + 6K c x^2)               (sech^2 u = 4 s (1 - s))
 *
 * with s (1 - s) as e s^2, e = exp(-2u) (1 - s = e s): 1 - s itself cancels where s is near 1
 * (16 ulps of gelu' near x = 5 measured), e s^2 does not.
 *
 * one exp (fast_expf's Cody-Waite reduction and degree-6 polynomial, in fused multiply-adds)
 * and one division an element, 16 lanes with AVX-512. Beyond |x| = 10 the sigmoid is 1 or
 * below 1e-38 in fp32, so the clamp changes nothing there and keeps x^2 finite (gelu' of a huge
 * x is then 1 or 0, not Inf times 0). NaN propagates: every clamp keeps a NaN operand (the
 * vector min/max return their second operand when one is NaN, as the scalar ternaries do).
 *
 * The three paths run the same operations in the same order (fmaf where the vectors fuse), so
 * they give the same bits; the vector tails are masked (AVX-512) or padded (AVX2), not scalar,
 * so where a thread's chunk ends never changes an element's bits.
 */
#include <cpuid.h>
#include <immintrin.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu_attn16.h"
#include "backend/cpu_ew.h"
#include "backend/cpu_vec.h"

#define GK2 1.5957691216057308f    /* 2 sqrt(2/pi) */
#define GK2C 0.0713548162726009f   /* 2 sqrt(2/pi) 0.044715 */
#define GK6C 0.2140644488178027f   /* 6 sqrt(2/pi) 0.044715 */
#define GX_MAX 10.0f
enum l3d_simd l3d_cpu_simd(void) {
    static int known = -1; /* atomic: threads may ask at once */
    int k = __atomic_load_n(&known, __ATOMIC_RELAXED);
    if (k < 0) {
        __builtin_cpu_init();
        bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl");
        /* F16C through <cpuid.h> (leaf 1, ECX bit 29): clang 14, the fuzz build's compiler,
         * does not know __builtin_cpu_supports("f16c") */
        unsigned a = 0, b = 0, c = 0, d = 0;
        bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
        bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
        k = avx512 ? L3D_SIMD_AVX512 : avx2 ? L3D_SIMD_AVX2 : L3D_SIMD_SCALAR;
        /* $L3D_SIMD=avx2|scalar caps the path below what the CPU has (never above it): an
         * AVX-512 machine then runs what an AVX2-only one runs (bench/avx2.sh) */
        const char *cap = getenv("L3D_SIMD");
        if (cap && strcmp(cap, "avx2") == 0 && k > L3D_SIMD_AVX2) k = L3D_SIMD_AVX2;
        if (cap && strcmp(cap, "scalar") == 0) k = L3D_SIMD_SCALAR;
        __atomic_store_n(&known, k, __ATOMIC_RELAXED);
    }
    return (enum l3d_simd)k;
}

/* ---- scalar: the reference order of operations ------------------------------------------- */

static void gelu_scalar(enum l3d_dtype t, void *y, const void *xp, const void *dy, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float x = l3d_cpu_ld(t, xp, i), xc = s_min(GX_MAX, s_max(-GX_MAX, x)), x2 = xc * xc;
        float u2 = xc * fmaf(x2, GK2C, GK2);
        float e = s_exp(-u2), s = 1.0f / (1.0f + e);
        if (!dy) {
            l3d_cpu_st(t, y, i, x * s);
            continue;
        }
        float d = fmaf(xc * (e * s * s), fmaf(x2, GK6C, GK2), s);
        l3d_cpu_st(t, y, i, fmaf(d, l3d_cpu_ld(t, dy, i), l3d_cpu_ld(t, y, i)));
    }
}

/* ---- vectors: GELU's steps as gelu_scalar, on cpu_vec.h's exp ----------------------------
 * One definition for both widths: W the lanes (16, 8), ATTR its target, V the float vector, P
 * the intrinsics' prefix (_mm512, _mm256). vW_gelu: the forward's gelu(x), or the backward's
 * y + gelu'(x) dy. */
#define DEF_VGELU(W, ATTR, V, P)                                                                \
    __attribute__((target(ATTR))) static inline V v##W##_gelu(V x, V dy, V y, int back) {      \
        V xc = P##_min_ps(P##_set1_ps(GX_MAX), P##_max_ps(P##_set1_ps(-GX_MAX), x));           \
        V x2 = P##_mul_ps(xc, xc), one = P##_set1_ps(1.0f);                                     \
        V u2 = P##_mul_ps(xc, P##_fmadd_ps(x2, P##_set1_ps(GK2C), P##_set1_ps(GK2)));          \
        V e = v##W##_exp(P##_sub_ps(P##_setzero_ps(), u2));                                     \
        V s = P##_div_ps(one, P##_add_ps(one, e));                                              \
        if (!back) return P##_mul_ps(x, s);                                                     \
        V d = P##_fmadd_ps(P##_mul_ps(xc, P##_mul_ps(P##_mul_ps(e, s), s)),                     \
                           P##_fmadd_ps(x2, P##_set1_ps(GK6C), P##_set1_ps(GK2)), s);           \
        return P##_fmadd_ps(d, dy, y);                                                          \
    }

DEF_VGELU(16, T512, __m512, _mm512)
DEF_VGELU(8, T256, __m256, _mm256)

/* ---- AVX-512 ------------------------------------------------------------------------------ */

__attribute__((target(T512))) static void gelu_avx512(enum l3d_dtype t, void *y, const void *x,
                                                     const void *dy, int64_t n) {
    const int back = dy != NULL;
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1u);
        __m512 xv = v16_ld(t, x, i, m);
        __m512 dv = back ? v16_ld(t, dy, i, m) : xv, yv = back ? v16_ld(t, y, i, m) : xv;
        v16_st(t, y, i, m, v16_gelu(xv, dv, yv, back));
    }
}

/* ---- AVX2 + FMA ---------------------------------------------------------------------------- */

/* The tail (under 8 elements) through the same vector code on zero-padded copies. */
__attribute__((target(T256))) static void gelu_avx2(enum l3d_dtype t, void *y, const void *x,
                                                   const void *dy, int64_t n) {
    const int back = dy != NULL;
    const int64_t es = t == L3D_F32 ? 4 : 2;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        char *yp = (char *)y + i * es;
        const char *xp = (const char *)x + i * es;
        __m256 xv = v8_ld(t, xp);
        __m256 dv = back ? v8_ld(t, (const char *)dy + i * es) : xv, yv = back ? v8_ld(t, yp) : xv;
        v8_st(t, yp, v8_gelu(xv, dv, yv, back));
    }
    if (i == n) return;
    _Alignas(32) char xb[32] = {0}, db[32] = {0}, yb[32] = {0};
    size_t k = (size_t)((n - i) * es);
    memcpy(xb, (const char *)x + i * es, k);
    if (back) memcpy(db, (const char *)dy + i * es, k), memcpy(yb, (char *)y + i * es, k);
    v8_st(t, yb, v8_gelu(v8_ld(t, xb), v8_ld(t, db), v8_ld(t, yb), back));
    memcpy((char *)y + i * es, yb, k);
}

void l3d_cpu_gelu_rows(enum l3d_simd isa, enum l3d_dtype t, void *y, const void *x,
                       const void *dy, int64_t n) {
    if (isa == L3D_SIMD_AVX512)
        gelu_avx512(t, y, x, dy, n);
    else if (isa == L3D_SIMD_AVX2)
        gelu_avx2(t, y, x, dy, n);
    else
        gelu_scalar(t, y, x, dy, n);
}
