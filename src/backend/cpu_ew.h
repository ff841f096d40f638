/* The CPU backend's GELU in explicit SIMD (cpu_ew.c): AVX-512 or AVX2 with FMA, chosen at run
 * time, else scalar, the same operations in the same order on every path, so all three give
 * the same bits (tests/test_fused.c checks it on each path the CPU has); and, in AVX-512 only,
 * the bf16 row conversions and the LayerNorm / RMSNorm rows of cpu.c's 16-bit and fp32 norms.
 * Only src/backend/cpu*.c, bench/fused.c and the tests include this file. */
#ifndef LLM3D_CPU_EW_H
#define LLM3D_CPU_EW_H

#include <stdint.h>

#include "llm3d/core.h"

/* AVX512BF16: the AVX-512 path with bf16 outputs rounded by vcvtneps2bf16 (AVX512_BF16), the
 * same bits as AVX-512's integer rounding (a vector holding a subnormal, which the instruction
 * would flush to zero, is rounded the integer way). */
enum l3d_simd { L3D_SIMD_SCALAR, L3D_SIMD_AVX2, L3D_SIMD_AVX512, L3D_SIMD_AVX512BF16 };

/* The widest path this CPU runs (AVX-512 F, BW, VL, with AVX512_BF16 or without; else AVX2 with
 * FMA and F16C; else scalar), asked once; $L3D_SIMD=avx512|avx2|scalar caps it. */
enum l3d_simd l3d_cpu_simd(void);

/* GELU, tanh form (Hendrycks & Gimpel 2016), as x sigmoid(2u) with u = sqrt(2/pi) (x + 0.044715
 * x^3) (0.5 (1 + tanh u) = sigmoid(2u)): dy NULL: y (n) = gelu(x); else y (n) += gelu'(x) dy;
 * y, x, dy of type t (fp32, bf16, fp16), the 16-bit ones widened in registers and each output
 * rounded once to nearest even (the bits of l3d_bf16_narrow / l3d_f32_to_f16). y may be x
 * (forward). isa must be at most l3d_cpu_simd(). Max error against the float64 tanh form over
 * [-12, 12]: see docs/DESIGN.md ("Fused element-wise kernels"). */
void l3d_cpu_gelu_rows(enum l3d_simd isa, enum l3d_dtype t, void *y, const void *x,
                       const void *dy, int64_t n);

/* SwiGLU rows in AVX-512 (isa at least L3D_SIMD_AVX512), on n elements of type t: the gate g and
 * up u halves; out not NULL: out = g sigmoid(g) u; else dg, du += the gradients from d. 16-bit
 * elements widened and rounded in registers, each output once; the operations and their order of
 * cpu.c's portable rows (swiglu_cols). */
void l3d_cpu_swiglu_rows(enum l3d_simd isa, enum l3d_dtype t, void *out, void *dg, void *du,
                         const void *d, const void *g, const void *u, int64_t n);

/* dst (n fp32) = src (n bf16), exactly; and dst (n bf16) = src (n fp32) rounded to nearest
 * even, the bits of l3d_bf16_narrow (NaN kept quiet); in AVX-512 where isa has it, else the
 * scalar loops; serial. */
void l3d_cpu_bf16_to_f32(enum l3d_simd isa, float *dst, const uint16_t *src, int64_t n);
void l3d_cpu_f32_to_bf16(enum l3d_simd isa, uint16_t *dst, const float *src, int64_t n);

/* LayerNorm and RMSNorm rows in AVX-512 (isa at least L3D_SIMD_AVX512), on rows of type t
 * (fp32, bf16, fp16) read and written in place, 16-bit ones widened and rounded in registers;
 * fp32 weights. Forward: out (C) = (x - mean) rstd w + b, *mean and *rstd its statistics (eps
 * inside the square root); mean NULL: RMSNorm, out = x rstd w (b not read); with add not NULL,
 * res (C) = x + add rounded to t first, and the norm of res as stored. Backward: dinp (C) +=
 * rstd (g - mean(g) - xhat mean(g xhat)), g = d w, xhat = (x - *mean) rstd; mean NULL: RMSNorm,
 * xhat = x rstd and no mean(g). The formulas of cpu.c's portable rows, the sums associated
 * differently. */
void l3d_cpu_ln_forward_row(enum l3d_simd isa, enum l3d_dtype t, void *out, float *mean,
                            float *rstd, void *res, const void *x, const void *add,
                            const float *w, const float *b, int64_t C, float eps);
void l3d_cpu_ln_backward_row(enum l3d_simd isa, enum l3d_dtype t, void *dinp, const void *x,
                             const void *d, const float *w, const float *mean, float r,
                             int64_t C);
/* One row's terms of a norm's weight gradients in AVX-512 (isa at least L3D_SIMD_AVX512):
 * sw (w) += d (x - m) r, sb (w) += d (either NULL; m = 0 for RMSNorm: x - 0 is x), x and d (w)
 * of type t, each element's terms the bits of cpu.c's portable column loops. */
void l3d_cpu_norm_wgrad_row(enum l3d_simd isa, enum l3d_dtype t, float *sw, float *sb,
                            const void *x, const void *d, float m, float r, int64_t w);

#endif
