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
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "backend/cpu_ew.h"

#define GK2 1.5957691216057308f    /* 2 sqrt(2/pi) */
#define GK2C 0.0713548162726009f   /* 2 sqrt(2/pi) 0.044715 */
#define GK6C 0.2140644488178027f   /* 6 sqrt(2/pi) 0.044715 */
#define GX_MAX 10.0f
#define EXP_LO -87.0f
#define EXP_HI 88.0f
#define LOG2E 1.44269504088896341f
#define SHIFTER 12582912.0f        /* 1.5 * 2^23: adding it rounds to an integer */
#define LN2_HI 0.693145751953125f  /* exact in float */
#define LN2_LO 1.428606765330187e-06f

enum l3d_simd l3d_cpu_simd(void) {
    static int known = -1; /* atomic: threads may ask at once */
    int k = __atomic_load_n(&known, __ATOMIC_RELAXED);
    if (k < 0) {
        __builtin_cpu_init();
        k = __builtin_cpu_supports("avx512f")                                    ? L3D_SIMD_AVX512
            : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? L3D_SIMD_AVX2
                                                                                : L3D_SIMD_SCALAR;
        __atomic_store_n(&known, k, __ATOMIC_RELAXED);
    }
    return (enum l3d_simd)k;
}

/* ---- scalar: the reference order of operations ------------------------------------------- */

static inline float s_max(float c, float v) { return c > v ? c : v; } /* maxps(c, v) */
static inline float s_min(float c, float v) { return c < v ? c : v; } /* minps(c, v) */

static inline float s_exp(float a) {
    a = s_min(EXP_HI, s_max(EXP_LO, a));
    float t = fmaf(a, LOG2E, SHIFTER);
    float nn = t - SHIFTER;
    float r = fmaf(nn, -LN2_HI, a);
    r = fmaf(nn, -LN2_LO, r);
    float p = 1.0f / 720.0f;
    p = fmaf(p, r, 1.0f / 120.0f);
    p = fmaf(p, r, 1.0f / 24.0f);
    p = fmaf(p, r, 1.0f / 6.0f);
    p = fmaf(p, r, 0.5f);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    uint32_t tb; /* unsigned: a NaN's bits are no undefined behaviour (fast_expf says why) */
    memcpy(&tb, &t, sizeof tb);
    uint32_t bits = (tb - 0x4b400000u + 127u) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

static void gelu_scalar(float *y, const float *x, const float *dy, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float xc = s_min(GX_MAX, s_max(-GX_MAX, x[i])), x2 = xc * xc;
        float u2 = xc * fmaf(x2, GK2C, GK2);
        float e = s_exp(-u2), s = 1.0f / (1.0f + e);
        if (!dy) {
            y[i] = x[i] * s;
            continue;
        }
        float d = fmaf(xc * (e * s * s), fmaf(x2, GK6C, GK2), s);
        y[i] = fmaf(d, dy[i], y[i]);
    }
}

/* ---- AVX-512 ------------------------------------------------------------------------------ */

__attribute__((target("avx512f"))) static inline __m512 v16_exp(__m512 a) {
    a = _mm512_min_ps(_mm512_set1_ps(EXP_HI), _mm512_max_ps(_mm512_set1_ps(EXP_LO), a));
    __m512 t = _mm512_fmadd_ps(a, _mm512_set1_ps(LOG2E), _mm512_set1_ps(SHIFTER));
    __m512 nn = _mm512_sub_ps(t, _mm512_set1_ps(SHIFTER));
    __m512 r = _mm512_fmadd_ps(nn, _mm512_set1_ps(-LN2_HI), a);
    r = _mm512_fmadd_ps(nn, _mm512_set1_ps(-LN2_LO), r);
    __m512 p = _mm512_set1_ps(1.0f / 720.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    __m512i bits = _mm512_slli_epi32(
        _mm512_add_epi32(_mm512_castps_si512(t), _mm512_set1_epi32((int)(127u - 0x4b400000u))),
        23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
}

/* 16 lanes: the forward's y, or the backward's y + gelu'(x) dy */
__attribute__((target("avx512f"))) static inline __m512 v16_gelu(__m512 x, __m512 dy, __m512 y,
                                                                 int back) {
    __m512 xc = _mm512_min_ps(_mm512_set1_ps(GX_MAX), _mm512_max_ps(_mm512_set1_ps(-GX_MAX), x));
    __m512 x2 = _mm512_mul_ps(xc, xc);
    __m512 u2 = _mm512_mul_ps(xc, _mm512_fmadd_ps(x2, _mm512_set1_ps(GK2C), _mm512_set1_ps(GK2)));
    __m512 one = _mm512_set1_ps(1.0f);
    __m512 e = v16_exp(_mm512_sub_ps(_mm512_setzero_ps(), u2));
    __m512 s = _mm512_div_ps(one, _mm512_add_ps(one, e));
    if (!back) return _mm512_mul_ps(x, s);
    __m512 d = _mm512_fmadd_ps(_mm512_mul_ps(xc, _mm512_mul_ps(_mm512_mul_ps(e, s), s)),
                               _mm512_fmadd_ps(x2, _mm512_set1_ps(GK6C), _mm512_set1_ps(GK2)), s);
    return _mm512_fmadd_ps(d, dy, y);
}

__attribute__((target("avx512f"))) static void gelu_avx512(float *y, const float *x,
                                                          const float *dy, int64_t n) {
    const int back = dy != NULL;
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1u);
        __m512 xv = _mm512_maskz_loadu_ps(m, x + i);
        __m512 dv = back ? _mm512_maskz_loadu_ps(m, dy + i) : xv;
        __m512 yv = back ? _mm512_maskz_loadu_ps(m, y + i) : xv;
        _mm512_mask_storeu_ps(y + i, m, v16_gelu(xv, dv, yv, back));
    }
}

/* ---- AVX2 + FMA ---------------------------------------------------------------------------- */

__attribute__((target("avx2,fma"))) static inline __m256 v8_exp(__m256 a) {
    a = _mm256_min_ps(_mm256_set1_ps(EXP_HI), _mm256_max_ps(_mm256_set1_ps(EXP_LO), a));
    __m256 t = _mm256_fmadd_ps(a, _mm256_set1_ps(LOG2E), _mm256_set1_ps(SHIFTER));
    __m256 nn = _mm256_sub_ps(t, _mm256_set1_ps(SHIFTER));
    __m256 r = _mm256_fmadd_ps(nn, _mm256_set1_ps(-LN2_HI), a);
    r = _mm256_fmadd_ps(nn, _mm256_set1_ps(-LN2_LO), r);
    __m256 p = _mm256_set1_ps(1.0f / 720.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i bits = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_castps_si256(t), _mm256_set1_epi32((int)(127u - 0x4b400000u))),
        23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

__attribute__((target("avx2,fma"))) static inline __m256 v8_gelu(__m256 x, __m256 dy, __m256 y,
                                                                 int back) {
    __m256 xc = _mm256_min_ps(_mm256_set1_ps(GX_MAX), _mm256_max_ps(_mm256_set1_ps(-GX_MAX), x));
    __m256 x2 = _mm256_mul_ps(xc, xc);
    __m256 u2 = _mm256_mul_ps(xc, _mm256_fmadd_ps(x2, _mm256_set1_ps(GK2C), _mm256_set1_ps(GK2)));
    __m256 one = _mm256_set1_ps(1.0f);
    __m256 e = v8_exp(_mm256_sub_ps(_mm256_setzero_ps(), u2));
    __m256 s = _mm256_div_ps(one, _mm256_add_ps(one, e));
    if (!back) return _mm256_mul_ps(x, s);
    __m256 d = _mm256_fmadd_ps(_mm256_mul_ps(xc, _mm256_mul_ps(_mm256_mul_ps(e, s), s)),
                               _mm256_fmadd_ps(x2, _mm256_set1_ps(GK6C), _mm256_set1_ps(GK2)), s);
    return _mm256_fmadd_ps(d, dy, y);
}

/* The tail (under 8 elements) through the same vector code on zero-padded copies. */
__attribute__((target("avx2,fma"))) static void gelu_avx2(float *y, const float *x,
                                                         const float *dy, int64_t n) {
    const int back = dy != NULL;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 xv = _mm256_loadu_ps(x + i);
        __m256 dv = back ? _mm256_loadu_ps(dy + i) : xv, yv = back ? _mm256_loadu_ps(y + i) : xv;
        _mm256_storeu_ps(y + i, v8_gelu(xv, dv, yv, back));
    }
    if (i == n) return;
    float xb[8] = {0}, db[8] = {0}, yb[8] = {0};
    size_t k = (size_t)(n - i) * sizeof(float);
    memcpy(xb, x + i, k);
    if (back) memcpy(db, dy + i, k), memcpy(yb, y + i, k);
    _mm256_storeu_ps(yb, v8_gelu(_mm256_loadu_ps(xb), _mm256_loadu_ps(db), _mm256_loadu_ps(yb),
                                 back));
    memcpy(y + i, yb, k);
}

void l3d_cpu_gelu_rows(enum l3d_simd isa, float *y, const float *x, const float *dy, int64_t n) {
    if (isa == L3D_SIMD_AVX512)
        gelu_avx512(y, x, dy, n);
    else if (isa == L3D_SIMD_AVX2)
        gelu_avx2(y, x, dy, n);
    else
        gelu_scalar(y, x, dy, n);
}
