/* The CPU backend's softmax cross-entropy rows in explicit SIMD (cpu_xent.c): a row's maximum,
 * its sum of exponentials and its gradient, reading fp32, bf16 or fp16 logits directly (no fp32
 * scratch row), on the path isa (at most l3d_cpu_simd()). Every path gives the same bits: the
 * reductions run over L3D_XENT_LANES fixed lanes (element j into lane j mod 32, each lane in
 * index order), combined by one fixed tree, so a row's result depends on neither the path nor
 * the thread count. Only src/backend/cpu*.c and the tests include this file.
 *
 *   float mx = l3d_cpu_xent_max(isa, L3D_BF16, row, Vvalid);
 *   float se = l3d_cpu_xent_sumexp(isa, L3D_BF16, row, Vvalid, mx, NULL);
 *   l3d_cpu_xent_grad(isa, L3D_BF16, row, Vvalid, Vl, mx, dloss / se, target, dloss);
 */
#ifndef LLM3D_CPU_XENT_H
#define LLM3D_CPU_XENT_H

#include <stdint.h>

#include "backend/cpu_ew.h"
#include "llm3d/core.h"

/* The lanes of the reductions (the bits depend on it; every path uses it). */
#define L3D_XENT_LANES 32

/* max of row (n) of type t, NaN skipped (-inf for n = 0 or a row of NaN and -inf) */
float l3d_cpu_xent_max(enum l3d_simd isa, enum l3d_dtype t, const void *row, int64_t n);
/* sum over row (n) of exp(row[j] - mx), fast_expf's polynomial (cpu_vec.h's s_exp); next: n
 * elements fetched into cache meanwhile (the next row, whose max then reads from cache), or NULL */
float l3d_cpu_xent_sumexp(enum l3d_simd isa, enum l3d_dtype t, const void *row, int64_t n,
                          float mx, const void *next);
/* row (Vl) in place -> dlogits: exp(row[j] - mx) k for j < n, 0 for n <= j < Vl, and dloss
 * subtracted at tgt when 0 <= tgt < n (k = dloss / sumexp); each 16-bit element rounded once */
void l3d_cpu_xent_grad(enum l3d_simd isa, enum l3d_dtype t, void *row, int64_t n, int64_t Vl,
                       float mx, float k, int64_t tgt, float dloss);

#endif
