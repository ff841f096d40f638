/*
 * GELU forward and backward in explicit SIMD (cpu_ew.h), and SwiGLU's 16-bit rows (below). GCC
 * vectorised the portable GELU loop at 8 lanes (its tuning for these CPUs prefers 256-bit
 * vectors), a tanh through exp and a
 * division each element: gelu_backward ran at a quarter of the memory bandwidth, bound by the
 * arithmetic (docs/BENCHMARKS.md, "Fused element-wise kernels"). Here:
 *
 *   2u = x (2K + 2K c x^2), K = sqrt(2/pi), c = 0.044715    (x clamped to [-10, 10] first)
 *   s  = 1 / (1 + exp(-2u))                                   = 0.5 (1 + tanh u)
 *        (-2u as x (-2K - 2K c x^2): the negation in the constants, exact, one vector op less)
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
/* AVX-512 with AVX512DQ beside cpu_vec.h's T512 (vfpclassps, v16_stn) */
#define T512B T512 ",avx512dq"

/* AVX512_BF16 (CPUID leaf 7 subleaf 1, EAX bit 5): vcvtneps2bf16 rounds fp32 to bf16 to
 * nearest even in one instruction; with AVX512DQ's vfpclassps beside it (v16_st). Asked
 * through <cpuid.h>: clang 14 (the fuzz build) does not know
 * __builtin_cpu_supports("avx512bf16"). */
static bool has_avx512bf16(void) {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __builtin_cpu_supports("avx512dq") && __get_cpuid_count(7, 1, &a, &b, &c, &d) &&
           (a & (1u << 5));
}

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
        k = avx512 ? (has_avx512bf16() ? L3D_SIMD_AVX512BF16 : L3D_SIMD_AVX512)
            : avx2 ? L3D_SIMD_AVX2
                   : L3D_SIMD_SCALAR;
        /* $L3D_SIMD=avx512|avx2|scalar caps the path below what the CPU has (never above it):
         * an AVX-512 machine then runs what an AVX2-only one runs (bench/avx2.sh), one with
         * AVX512_BF16 what an AVX-512 one without it runs */
        const char *cap = getenv("L3D_SIMD");
        if (cap && strcmp(cap, "avx512") == 0 && k > L3D_SIMD_AVX512) k = L3D_SIMD_AVX512;
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
        float e = s_exp(xc * fmaf(x2, -GK2C, -GK2)), s = 1.0f / (1.0f + e); /* exp(-2u) */
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
        V e = v##W##_exp(P##_mul_ps(xc, P##_fmadd_ps(x2, P##_set1_ps(-GK2C), P##_set1_ps(-GK2)))); \
        V s = P##_div_ps(one, P##_add_ps(one, e));                                              \
        if (!back) return P##_mul_ps(x, s);                                                     \
        V d = P##_fmadd_ps(P##_mul_ps(xc, P##_mul_ps(P##_mul_ps(e, s), s)),                     \
                           P##_fmadd_ps(x2, P##_set1_ps(GK6C), P##_set1_ps(GK2)), s);           \
        return P##_fmadd_ps(d, dy, y);                                                          \
    }

DEF_VGELU(16, T512, __m512, _mm512)
DEF_VGELU(8, T256, __m256, _mm256)

/* ---- AVX-512 ------------------------------------------------------------------------------ */

/* the lanes of a 16-wide step at i of n elements: all, or the tail's */
#define MASK16(n, i) ((n) - (i) >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << ((n) - (i))) - 1u))

/* bf16 to nearest even as l3d_bf16_narrow (NaN kept quiet), in integer steps */
__attribute__((target(T512))) static inline __m256i v16_bf16(__m512 v) {
    __m512i u = _mm512_castps_si512(v), hi = _mm512_srli_epi32(u, 16);
    __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)),
                                 _mm512_and_si512(hi, _mm512_set1_epi32(1)));
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                            _mm512_set1_epi32(0x7f800000));
    return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(
        nan, _mm512_srli_epi32(r, 16), _mm512_or_si512(hi, _mm512_set1_epi32(0x40))));
}
/* stored rounded to nearest even: fp16 by vcvtps2ph, bf16 as l3d_bf16_narrow: with ne
 * (AVX512_BF16) by vcvtneps2bf16, which gives its bits (NaN quieted the same way, Inf and
 * overflow alike) except for subnormal inputs, which it flushes to zero: a vector holding one
 * (fpclass 0x20; never in practice) takes the integer steps. */
__attribute__((target(T512B))) static inline void v16_stn(enum l3d_dtype t, bool ne, void *p,
                                                         int64_t i, __mmask16 m, __m512 v) {
    if (t == L3D_F32) {
        _mm512_mask_storeu_ps((float *)p + i, m, v);
        return;
    }
    __m256i h;
    if (t == L3D_F16)
        h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    else if (ne && !_mm512_fpclass_ps_mask(v, 0x20))
        /* volatile asm, not the intrinsic: the compiler may not compute it ahead of the test
         * of ne (an AVX-512 CPU without AVX512_BF16 would fault on it) */
        __asm__ volatile("vcvtneps2bf16 %g1, %t0" : "=v"(h) : "v"(v));
    else
        h = v16_bf16(v);
    _mm256_mask_storeu_epi16((uint16_t *)p + i, m, h);
}

/* How far ahead the loops prefetch each stream, in bytes: the hardware prefetcher alone left
 * the memory's latency exposed behind the arithmetic (a 16-bit GELU over 6.3M elements ran
 * 0.96 ns an element against 0.63 in cache; 0.69 with this, 512 to 2048 bytes alike). */
#define PF_AHEAD 1024

/* ne: bf16 stores by vcvtneps2bf16 (L3D_SIMD_AVX512BF16) */
__attribute__((target(T512B))) static void gelu_avx512(enum l3d_dtype t, bool ne, void *y,
                                                      const void *x, const void *dy, int64_t n) {
    const int back = dy != NULL;
    const int64_t es = t == L3D_F32 ? 4 : 2;
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = MASK16(n, i);
        _mm_prefetch((const char *)x + i * es + PF_AHEAD, _MM_HINT_T0);
        _mm_prefetch((const char *)y + i * es + PF_AHEAD, _MM_HINT_T0);
        if (back) _mm_prefetch((const char *)dy + i * es + PF_AHEAD, _MM_HINT_T0);
        __m512 xv = v16_ld(t, x, i, m);
        __m512 dv = back ? v16_ld(t, dy, i, m) : xv, yv = back ? v16_ld(t, y, i, m) : xv;
        v16_stn(t, ne, y, i, m, v16_gelu(xv, dv, yv, back));
    }
}

/* bf16 rows to fp32 and back, 16 lanes with masked tails: the 16-bit kernels of cpu.c widen
 * their rows into fp32 scratch and round them back (to_f32 / from_f32), and GCC vectorised those
 * loops at 8 lanes (its tuning for these CPUs) with the narrowing's integer rounding spelled
 * out: here the rounding is one vcvtneps2bf16 where the CPU has AVX512_BF16 (v16_st). */
__attribute__((target(T512B))) static void bf16_rows_avx512(bool ne, float *f, uint16_t *h,
                                                           int64_t n, bool in) {
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = MASK16(n, i);
        _mm_prefetch((const char *)(h + i) + PF_AHEAD, _MM_HINT_T0);
        if (in)
            _mm512_mask_storeu_ps(f + i, m, v16_ld(L3D_BF16, h, i, m));
        else
            v16_stn(L3D_BF16, ne, h, i, m, _mm512_maskz_loadu_ps(m, f + i));
    }
}

void l3d_cpu_bf16_to_f32(enum l3d_simd isa, float *dst, const uint16_t *src, int64_t n) {
    if (isa >= L3D_SIMD_AVX512) {
        bf16_rows_avx512(false, dst, (uint16_t *)src, n, true);
        return;
    }
#pragma omp simd
    for (int64_t i = 0; i < n; i++) dst[i] = l3d_bf16_widen(src[i]);
}

void l3d_cpu_f32_to_bf16(enum l3d_simd isa, uint16_t *dst, const float *src, int64_t n) {
    if (isa >= L3D_SIMD_AVX512) {
        bf16_rows_avx512(isa == L3D_SIMD_AVX512BF16, (float *)src, dst, n, false);
        return;
    }
#pragma omp simd
    for (int64_t i = 0; i < n; i++) dst[i] = l3d_bf16_narrow(src[i]);
}

/* ---- LayerNorm rows in AVX-512 ----------------------------------------------------------
 * cpu.c's LayerNorm rows (ln_forward_row, ln_backward_row) as GCC vectorised them ran at 8 lanes
 * with one accumulator per sum (a chain of dependent adds, 4 cycles each 8 elements), on rows
 * widened into fp32 scratch and rounded back in passes of their own: a bf16 row was slower than
 * an fp32 one with half its bytes. Here 16 lanes, four accumulators, the 16-bit elements widened
 * and rounded in registers (v16_ld, v16_st), the same formulas in the same order per element
 * (no fused multiply-add where the portable rows have none); only the sums' association
 * differs. */


/* The rows' memory latency is exposed (each row's first pass waits on its loads): each first
 * pass prefetches the next row, p + C + i, 128 bytes of it per 32 elements. */
static inline void pf_next(enum l3d_dtype t, const void *p, int64_t i, int64_t C) {
    const char *q = (const char *)p + (C + i) * (t == L3D_F32 ? 4 : 2);
    _mm_prefetch(q, _MM_HINT_T0);
    _mm_prefetch(q + 64, _MM_HINT_T0);
}

/* sum over c of f(x[c]): mode 0 x, mode 1 (x - m)^2; four accumulators, masked tail */
__attribute__((target(T512))) static float v16_row_sum(enum l3d_dtype t, const void *x, int64_t C,
                                                       int mode, float m) {
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                     _mm512_setzero_ps()};
    const __m512 mv = _mm512_set1_ps(m);
    for (int64_t i = 0, k = 0; i < C; i += 16, k = (k + 1) & 3) {
        if (!(k & 1)) pf_next(t, x, i, C); /* the first pass's, again in the second (cheap) */
        __m512 v = v16_ld(t, x, i, MASK16(C, i));
        if (mode) { /* a masked lane is 0 - m: zeroed again */
            v = _mm512_maskz_sub_ps(MASK16(C, i), v, mv);
            v = _mm512_mul_ps(v, v);
        }
        acc[k] = _mm512_add_ps(acc[k], v);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]),
                                              _mm512_add_ps(acc[2], acc[3])));
}

__attribute__((target(T512B))) static void ln_forward_avx512(enum l3d_dtype t, bool ne, void *out,
                                                            float *mean, float *rstd,
                                                            const void *x, const float *w,
                                                            const float *b, int64_t C,
                                                            float eps) {
    /* RMSNorm (mean NULL): m = 0, so x - m is x and (x - m)^2 is x x, bit for bit */
    float m = mean ? v16_row_sum(t, x, C, 0, 0.0f) / (float)C : 0.0f;
    float v = v16_row_sum(t, x, C, 1, m);
    float r = 1.0f / sqrtf(v / (float)C + eps);
    const __m512 mv = _mm512_set1_ps(m), rv = _mm512_set1_ps(r);
    for (int64_t i = 0; i < C; i += 16) {
        __mmask16 k = MASK16(C, i);
        __m512 xh = _mm512_mul_ps(_mm512_sub_ps(v16_ld(t, x, i, k), mv), rv);
        __m512 o = _mm512_mul_ps(xh, _mm512_maskz_loadu_ps(k, w + i));
        if (mean) o = _mm512_add_ps(o, _mm512_maskz_loadu_ps(k, b + i));
        v16_stn(t, ne, out, i, k, o);
    }
    if (mean) *mean = m;
    *rstd = r;
}

/* res (C) = a + b, rounded to t (the bits of the unfused residual_forward) */
__attribute__((target(T512B))) static void add_avx512(enum l3d_dtype t, bool ne, void *res,
                                                     const void *a, const void *b, int64_t C) {
    for (int64_t i = 0; i < C; i += 16) {
        __mmask16 k = MASK16(C, i);
        if (!(i & 31)) pf_next(t, a, i, C), pf_next(t, b, i, C), pf_next(t, res, i, C);
        v16_stn(t, ne, res, i, k, _mm512_add_ps(v16_ld(t, a, i, k), v16_ld(t, b, i, k)));
    }
}

void l3d_cpu_ln_forward_row(enum l3d_simd isa, enum l3d_dtype t, void *out, float *mean,
                            float *rstd, void *res, const void *x, const void *add,
                            const float *w, const float *b, int64_t C, float eps) {
    L3D_ASSERT(isa >= L3D_SIMD_AVX512);
    const bool ne = isa == L3D_SIMD_AVX512BF16;
    if (add) {
        add_avx512(t, ne, res, x, add, C);
        x = res; /* the norm reads the sum as stored */
    }
    ln_forward_avx512(t, ne, out, mean, rstd, x, w, b, C, eps);
}

/* sg = sum of g, sgx = sum of g xhat, g = d w, xhat = (x - m) r; two accumulators each */
__attribute__((target(T512))) static void ln_backward_sums(enum l3d_dtype t, const void *dinp,
                                                           const void *x, const void *d,
                                                           const float *w,
                                                           float m, float r, int64_t C,
                                                           float *sg, float *sgx) {
    __m512 g0 = _mm512_setzero_ps(), g1 = g0, h0 = g0, h1 = g0;
    const __m512 mv = _mm512_set1_ps(m), rv = _mm512_set1_ps(r);
    for (int64_t i = 0; i < C; i += 32) {
        __mmask16 k0 = MASK16(C, i), k1 = i + 16 < C ? MASK16(C, i + 16) : 0;
        pf_next(t, x, i, C), pf_next(t, d, i, C), pf_next(t, dinp, i, C);
        __m512 ga = _mm512_mul_ps(v16_ld(t, d, i, k0), _mm512_maskz_loadu_ps(k0, w + i));
        __m512 gb = _mm512_mul_ps(v16_ld(t, d, i + 16, k1), _mm512_maskz_loadu_ps(k1, w + i + 16));
        g0 = _mm512_add_ps(g0, ga);
        g1 = _mm512_add_ps(g1, gb);
        /* masked lanes: g is 0, so g * xhat is 0 whatever xhat */
        __m512 xa = _mm512_sub_ps(v16_ld(t, x, i, k0), mv);
        __m512 xb = _mm512_sub_ps(v16_ld(t, x, i + 16, k1), mv);
        h0 = _mm512_add_ps(h0, _mm512_mul_ps(_mm512_mul_ps(ga, xa), rv));
        h1 = _mm512_add_ps(h1, _mm512_mul_ps(_mm512_mul_ps(gb, xb), rv));
    }
    *sg = _mm512_reduce_add_ps(_mm512_add_ps(g0, g1));
    *sgx = _mm512_reduce_add_ps(_mm512_add_ps(h0, h1));
}

/* dinp (C) += r (g - mean(g) - xhat mean(g xhat)), as cpu.c's ln_backward_row */
__attribute__((target(T512B))) static void ln_backward_avx512(enum l3d_dtype t, bool ne, bool rms,
                                                             void *dinp, const void *x,
                                                             const void *d, const float *w,
                                                             float m, float r, int64_t C) {
    float sg, sgx;
    ln_backward_sums(t, dinp, x, d, w, m, r, C, &sg, &sgx);
    sg = rms ? 0.0f : sg / (float)C; /* RMSNorm: no mean term (g - 0 is g), m = 0 */
    sgx /= (float)C;
    const __m512 mv = _mm512_set1_ps(m), rv = _mm512_set1_ps(r);
    const __m512 sgv = _mm512_set1_ps(sg), sgxv = _mm512_set1_ps(sgx);
    for (int64_t i = 0; i < C; i += 16) {
        __mmask16 k = MASK16(C, i);
        __m512 xh = _mm512_mul_ps(_mm512_sub_ps(v16_ld(t, x, i, k), mv), rv);
        __m512 g = _mm512_mul_ps(v16_ld(t, d, i, k), _mm512_maskz_loadu_ps(k, w + i));
        __m512 u = _mm512_sub_ps(_mm512_sub_ps(g, sgv), _mm512_mul_ps(xh, sgxv));
        v16_stn(t, ne, dinp, i, k, _mm512_add_ps(v16_ld(t, dinp, i, k), _mm512_mul_ps(rv, u)));
    }
}

void l3d_cpu_ln_backward_row(enum l3d_simd isa, enum l3d_dtype t, void *dinp, const void *x,
                             const void *d, const float *w, const float *mean, float r,
                             int64_t C) {
    L3D_ASSERT(isa >= L3D_SIMD_AVX512);
    ln_backward_avx512(t, isa == L3D_SIMD_AVX512BF16, !mean, dinp, x, d, w, mean ? *mean : 0.0f,
                       r, C);
}

/* sw (w) += d (x - m) r, sb (w) += d (either NULL): one row's terms of a norm's weight
 * gradients, in the order of cpu.c's column loops (each element's sum the same bits) */
__attribute__((target(T512))) static void wgrad_avx512(enum l3d_dtype t, float *sw, float *sb,
                                                       const void *x, const void *d, float m,
                                                       float r, int64_t w) {
    const __m512 mv = _mm512_set1_ps(m), rv = _mm512_set1_ps(r);
    for (int64_t i = 0; i < w; i += 16) {
        __mmask16 k = MASK16(w, i);
        __m512 dv = v16_ld(t, d, i, k);
        if (sw) {
            __m512 g = _mm512_mul_ps(_mm512_mul_ps(dv, _mm512_sub_ps(v16_ld(t, x, i, k), mv)), rv);
            _mm512_mask_storeu_ps(sw + i, k, _mm512_add_ps(_mm512_maskz_loadu_ps(k, sw + i), g));
        }
        if (sb)
            _mm512_mask_storeu_ps(sb + i, k, _mm512_add_ps(_mm512_maskz_loadu_ps(k, sb + i), dv));
    }
}

void l3d_cpu_norm_wgrad_row(enum l3d_simd isa, enum l3d_dtype t, float *sw, float *sb,
                            const void *x, const void *d, float m, float r, int64_t w) {
    L3D_ASSERT(isa >= L3D_SIMD_AVX512);
    wgrad_avx512(t, sw, sb, x, d, m, r, w);
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
        _mm_prefetch(xp + PF_AHEAD, _MM_HINT_T0); /* as gelu_avx512 */
        _mm_prefetch(yp + PF_AHEAD, _MM_HINT_T0);
        if (back) _mm_prefetch((const char *)dy + i * es + PF_AHEAD, _MM_HINT_T0);
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

/* ---- SwiGLU in AVX-512 -------------------------------------------------------------------
 * cpu.c's portable swiglu_cols, operation for operation and with its bits: s = 1 / (1 + exp(-g))
 * (fast_expf), out = (g s) u; dg += ((d u) s) (1 + g (1 - s)), du += (d g) s, every product
 * rounded before its sum, as the ISO C build (-std=c11: no contraction) computes the portable
 * loop. 16 lanes, masked tails. */
/* fast_expf (cpu_attn16.h) lane by lane with its bits: its steps as the ISO C build compiles
 * them, each product rounded before its sum (cpu_vec.h's v16_exp fuses them, other bits) */
__attribute__((target(T512))) static inline __m512 v16_exp_nf(__m512 x) {
#define M_(a, b) _mm512_mul_ps(a, b)
#define C_(v) _mm512_set1_ps(v)
    x = _mm512_min_ps(C_(EXP_HI), _mm512_max_ps(C_(EXP_LO), x)); /* NaN kept, as its ternaries */
    __m512 t = _mm512_add_ps(M_(x, C_(LOG2E)), C_(SHIFTER));
    __m512 n = _mm512_sub_ps(t, C_(SHIFTER));
    __m512 r = _mm512_sub_ps(x, M_(n, C_(LN2_HI)));
    r = _mm512_sub_ps(r, M_(n, C_(LN2_LO)));
    __m512 p = C_(1.0f / 720.0f);
    p = _mm512_add_ps(M_(p, r), C_(1.0f / 120.0f));
    p = _mm512_add_ps(M_(p, r), C_(1.0f / 24.0f));
    p = _mm512_add_ps(M_(p, r), C_(1.0f / 6.0f));
    p = _mm512_add_ps(M_(p, r), C_(0.5f));
    p = _mm512_add_ps(M_(p, r), C_(1.0f));
    p = _mm512_add_ps(M_(p, r), C_(1.0f));
    return M_(p, _mm512_castsi512_ps(_mm512_slli_epi32(
                     _mm512_add_epi32(_mm512_castps_si512(t),
                                      _mm512_set1_epi32((int)(127u - 0x4b400000u))),
                     23)));
#undef M_
#undef C_
}
/* sigmoid_f of cpu.c: 1 / (1 + fast_expf(-g)), -g by the sign bit as C's negation */
__attribute__((target(T512))) static inline __m512 v16_sig(__m512 g) {
    __m512 one = _mm512_set1_ps(1.0f);
    __m512 ng = _mm512_castsi512_ps(
        _mm512_xor_si512(_mm512_castps_si512(g), _mm512_set1_epi32((int)0x80000000u)));
    return _mm512_div_ps(one, _mm512_add_ps(one, v16_exp_nf(ng)));
}

__attribute__((target(T512B))) static void swiglu_avx512(enum l3d_dtype t, bool ne, void *o,
                                                        void *dg, void *du, const void *d,
                                                        const void *g, const void *u,
                                                        int64_t n) {
    const int64_t es = t == L3D_F32 ? 4 : 2;
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = MASK16(n, i);
        _mm_prefetch((const char *)g + i * es + PF_AHEAD, _MM_HINT_T0);
        _mm_prefetch((const char *)u + i * es + PF_AHEAD, _MM_HINT_T0);
        __m512 gv = v16_ld(t, g, i, m), uv = v16_ld(t, u, i, m), s = v16_sig(gv);
        if (o) {
            v16_stn(t, ne, o, i, m, _mm512_mul_ps(_mm512_mul_ps(gv, s), uv));
            continue;
        }
        _mm_prefetch((const char *)d + i * es + PF_AHEAD, _MM_HINT_T0);
        _mm_prefetch((const char *)dg + i * es + PF_AHEAD, _MM_HINT_T0);
        _mm_prefetch((const char *)du + i * es + PF_AHEAD, _MM_HINT_T0);
        __m512 dv = v16_ld(t, d, i, m);
        __m512 a = _mm512_mul_ps(_mm512_mul_ps(dv, uv), s);
        __m512 b = _mm512_add_ps(one, _mm512_mul_ps(gv, _mm512_sub_ps(one, s)));
        v16_stn(t, ne, dg, i, m, _mm512_add_ps(v16_ld(t, dg, i, m), _mm512_mul_ps(a, b)));
        __m512 c = _mm512_mul_ps(_mm512_mul_ps(dv, gv), s);
        v16_stn(t, ne, du, i, m, _mm512_add_ps(v16_ld(t, du, i, m), c));
    }
}

void l3d_cpu_swiglu_rows(enum l3d_simd isa, enum l3d_dtype t, void *out, void *dg, void *du,
                         const void *d, const void *g, const void *u, int64_t n) {
    L3D_ASSERT(isa >= L3D_SIMD_AVX512);
    swiglu_avx512(t, isa == L3D_SIMD_AVX512BF16, out, dg, du, d, g, u, n);
}

void l3d_cpu_gelu_rows(enum l3d_simd isa, enum l3d_dtype t, void *y, const void *x,
                       const void *dy, int64_t n) {
    if (isa >= L3D_SIMD_AVX512)
        gelu_avx512(t, isa == L3D_SIMD_AVX512BF16, y, x, dy, n);
    else if (isa == L3D_SIMD_AVX2)
        gelu_avx2(t, y, x, dy, n);
    else
        gelu_scalar(t, y, x, dy, n);
}
