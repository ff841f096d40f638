/*
 * CPU backend: matrix products through oneDNN's dnnl_sgemm (row-major, shares the OpenMP thread
 * pool with the loops below), every other kernel an OpenMP loop written so that GCC vectorises it.
 * Every kernel has an fp32 variant and, for mixed precision, bf16 and fp16 ones ("16-bit storage"
 * below): 16-bit operands, fp32 arithmetic, each 16-bit output rounded once.
 *
 * The arithmetic of a kernel is written once, on fp32 rows or blocks, and serves every type: an
 * fp32 kernel hands it the tensors themselves, a 16-bit one rows converted into fp32 scratch,
 * which it rounds back once (row_in / row_io / row_out / row_done below). Only the matrix
 * products differ by type (oneDNN's 16-bit matmul, or fp32 around the fp32 product).
 *
 * Contract (include/llm3d/backend.h): activations are overwritten (=), every gradient output
 * accumulates (+=). Every reduction runs over fixed static chunks combined in thread order, so a
 * run is bit-identical for the same thread count.
 */
#include <cpuid.h>
#include <dnnl.h>
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend-impl.h"
#include "backend/cpu_attn16.h"
#include "backend/cpu_attnd.h"
#include "backend/cpu_ew.h"
#include "backend/cpu_xent.h"
#include "llm3d/core.h"

#define L3D_MAX_THREADS 256

/* clang (the fuzz build's compiler): the same numerics as GCC's -std=c11, which contracts no
 * a * b + c into a fused multiply-add (clang's default would: layernorm_backward's
 * d * w - mean(d * w) at C = 1 then left the product's rounding error instead of 0, and
 * test_kernels failed). And clang 14 does not vectorise the `omp simd reduction(max : ...)`
 * loops below ("value that could not be identified as reduction"), reported as -Wpass-failed,
 * which -Werror makes fatal; GCC vectorises them. A loop left scalar is slower, not wrong; the
 * fuzz build passes -Wno-pass-failed for the same reason. */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#pragma clang diagnostic ignored "-Wpass-failed"
#endif

/* ---- helpers ---------------------------------------------------------------------------- */

static void sgemm(char ta, char tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                  int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    dnnl_status_t st = dnnl_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    if (st != dnnl_success)
        l3d_fatal(__FILE__, __LINE__,
                  "dnnl_sgemm(%c,%c,M=%lld,N=%lld,K=%lld) failed with status %d", ta, tb,
                  (long long)M, (long long)N, (long long)K, (int)st);
}

/* [lo, hi) of n items for thread tid of nth: the fixed static partition reductions rely on. */
static inline void chunk(int64_t n, int tid, int nth, int64_t *lo, int64_t *hi) {
    *lo = n * tid / nth;
    *hi = n * (tid + 1) / nth;
}

/* ---- 16-bit storage: conversions -----------------------------------------------------------
 *
 * Mixed precision (include/llm3d/backend.h): the bf16 and fp16 kernels below read 16-bit
 * operands into fp32 (exact), compute exactly as the fp32 kernels do, and round each 16-bit
 * output once, to nearest even. bf16 is the upper half of a binary32: widening is a shift and
 * narrowing adds the rounding bias (l3d_bf16_widen / l3d_bf16_narrow in core.h: bit for bit
 * l3d_f32_to_bf16, NaN kept quiet), plain loops GCC vectorises. fp16 uses F16C (vcvtph2ps, vcvtps2ph with round-to-nearest-even, the same bits as
 * l3d_f32_to_f16 / l3d_f16_to_f32) where the CPU has it, chosen at run time, else the scalar
 * functions. Every kernel works on blocks of L3D_BLK elements converted into fp32 on the stack,
 * or on rows converted into per-thread fp32 scratch.
 */
#define L3D_BLK 512


__attribute__((target("avx,f16c"))) static void f16_to_f32_f16c(float *dst, const uint16_t *src,
                                                                int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++) dst[i] = l3d_f16_to_f32(src[i]);
}
__attribute__((target("avx,f16c"))) static void f32_to_f16_f16c(uint16_t *dst, const float *src,
                                                                int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; i < n; i++) dst[i] = l3d_f32_to_f16(src[i]);
}

static inline size_t esz(enum l3d_dtype t) { return t == L3D_F32 ? 4 : 2; }
/* element i of a buffer of type t */
static inline void *at(enum l3d_dtype t, const void *p, int64_t i) {
    return (char *)p + i * (int64_t)esz(t);
}

/* The CPU converts fp16 in hardware (F16C: CPUID leaf 1, ECX bit 29 and AVX). Read through
 * <cpuid.h>, not __builtin_cpu_supports("f16c"), which clang 14 (the fuzz build) does not know. */
static bool has_f16c(void) {
    static int known = -1; /* atomic: threads converting rows may ask at once */
    int k = __atomic_load_n(&known, __ATOMIC_RELAXED);
    if (k < 0) {
        unsigned a = 0, b = 0, c = 0, d = 0;
        k = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) && (c & bit_AVX);
        __atomic_store_n(&known, k, __ATOMIC_RELAXED);
    }
    return k;
}

/* dst (n fp32) = src (n of type t: fp32, bf16 or fp16); serial. */
static void to_f32(enum l3d_dtype t, float *dst, const void *src, int64_t n) {
    if (t == L3D_BF16) {
        l3d_cpu_bf16_to_f32(l3d_cpu_simd(), dst, src, n);
    } else if (t == L3D_F16) {
        if (has_f16c()) {
            f16_to_f32_f16c(dst, src, n);
        } else {
            const uint16_t *s = src;
            for (int64_t i = 0; i < n; i++) dst[i] = l3d_f16_to_f32(s[i]);
        }
    } else {
        L3D_ASSERT(t == L3D_F32);
        if ((const void *)dst != src) memcpy(dst, src, (size_t)n * sizeof(float));
    }
}

/* dst (n of type t) = src (n fp32) rounded to nearest even; serial. */
static void from_f32(enum l3d_dtype t, void *dst, const float *src, int64_t n) {
    if (t == L3D_BF16) {
        l3d_cpu_f32_to_bf16(l3d_cpu_simd(), dst, src, n);
    } else if (t == L3D_F16) {
        if (has_f16c()) {
            f32_to_f16_f16c(dst, src, n);
        } else {
            uint16_t *d = dst;
            for (int64_t i = 0; i < n; i++) d[i] = l3d_f32_to_f16(src[i]);
        }
    } else {
        L3D_ASSERT(t == L3D_F32);
        if (dst != (const void *)src) memcpy(dst, src, (size_t)n * sizeof(float));
    }
}

/* A conversion of n elements between the fp32 buffer f and h of type t: to fp32 (in) or back. */
struct cvt_job {
    enum l3d_dtype t;
    float *f;
    void *h;
    int64_t n;
    bool in;
};
#define L3D_CVT_JOBS 6

/* Whole tensors, all the jobs in one pass in blocks of 8 L3D_BLK; over threads, in one parallel
 * region, only from 4M elements on. A conversion is memory-bound: one core converts the 1.8M
 * elements of a 768 x 2304 weight in 0.4 ms, while a fork-join on cores shared with other
 * processes waits for the other thread's time slice (4-8 ms measured on this VM under load). */
static void cvt_par(const struct cvt_job *jobs, int nj) {
    const int64_t CB = 8 * L3D_BLK;
    int64_t nb[L3D_CVT_JOBS], total = 0, elems = 0;
    L3D_ASSERT(nj <= L3D_CVT_JOBS);
    for (int j = 0; j < nj; j++) total += nb[j] = (jobs[j].n + CB - 1) / CB, elems += jobs[j].n;
#pragma omp parallel for schedule(static) if (elems > ((int64_t)1 << 22))
    for (int64_t b = 0; b < total; b++) {
        int j = 0;
        int64_t k = b;
        while (k >= nb[j]) k -= nb[j++];
        const struct cvt_job *c = &jobs[j];
        int64_t i0 = k * CB, n = c->n - i0 < CB ? c->n - i0 : CB;
        if (c->in)
            to_f32(c->t, c->f + i0, at(c->t, c->h, i0), n);
        else
            from_f32(c->t, at(c->t, c->h, i0), c->f + i0, n);
    }
}

/* rows x cols of a strided 16-bit matrix (stride ss elements) into / out of a dense fp32 one
 * (stride ds) */
static void rows_to_f32(enum l3d_dtype t, float *dst, int64_t ds, const void *src, int64_t ss,
                        int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) to_f32(t, dst + r * ds, at(t, src, r * ss), cols);
}
static void rows_from_f32(enum l3d_dtype t, void *dst, int64_t ds, const float *src, int64_t ss,
                          int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) from_f32(t, at(t, dst, r * ds), src + r * ss, cols);
}

static bool is16(enum l3d_dtype t) { return t == L3D_BF16 || t == L3D_F16; }

static dnnl_data_type_t dnnl_type(enum l3d_dtype t) {
    return t == L3D_BF16 ? dnnl_bf16 : t == L3D_F16 ? dnnl_f16 : dnnl_f32;
}

/* ---- rows in fp32: one kernel body for every type ----------------------------------------
 *
 * A kernel body computes on fp32 rows (or blocks). With fp32 tensors the rows are the tensors
 * themselves: no copy, no scratch, the same arithmetic in the same order as a plain fp32 loop.
 * With 16-bit tensors a row is widened into fp32 scratch (exact) and its result rounded back once
 * (to nearest even). A NULL scratch buffer is what an fp32 kernel passes. */

/* A row of n elements of type t at p to update in place (+=): p itself for fp32, else widened
 * into buf; row_done stores it. */
static inline float *row_io(enum l3d_dtype t, float *buf, void *p, int64_t n) {
    if (t == L3D_F32) return p;
    to_f32(t, buf, p, n);
    return buf;
}
/* A row to read only: as row_io (which writes only buf; an fp32 row is returned as it is). */
static inline const float *row_in(enum l3d_dtype t, float *buf, const void *p, int64_t n) {
    return row_io(t, buf, (void *)p, n);
}
/* Where a row of type t at p is written (=): p itself for fp32, else buf; row_done stores it. */
static inline float *row_out(enum l3d_dtype t, float *buf, void *p) {
    return t == L3D_F32 ? p : buf;
}
/* Store a row computed by row_io / row_out: each 16-bit element rounded once; fp32 is in place. */
static inline void row_done(enum l3d_dtype t, void *p, const float *row, int64_t n) {
    if (t != L3D_F32) from_f32(t, p, row, n);
}

/* The elements of a flat span of n handled at once: all of them for fp32 (in place), blocks of
 * L3D_BLK for a 16-bit type (widened on the stack). */
static inline int64_t span_blk(enum l3d_dtype t, int64_t n) {
    return t == L3D_F32 && n > 0 ? n : L3D_BLK;
}

/* This thread's static chunk [lo, hi) of a flat span of n elements of type t (chunk), walked in
 * blocks of bl (span_blk); call inside a parallel region. */
struct span {
    int64_t lo, hi, bl;
};
static inline struct span thread_span(enum l3d_dtype t, int64_t n) {
    struct span s;
    chunk(n, omp_get_thread_num(), omp_get_num_threads(), &s.lo, &s.hi);
    s.bl = span_blk(t, s.hi - s.lo);
    return s;
}
/* The length of the block of s starting at i0: bl, or what is left of the chunk. */
static inline int64_t span_len(struct span s, int64_t i0) {
    return s.hi - i0 < s.bl ? s.hi - i0 : s.bl;
}

/* p + i, or NULL for no buffer (fp32 kernels have no scratch) */
static inline float *off(float *p, int64_t i) { return p ? p + i : NULL; }

/* y (n) += x (n) */
static inline void vadd(float *y, const float *x, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) y[i] += x[i];
}

/* Gradient sums: the fp32 accumulator for n elements of the gradient g (type gdt) of a kernel
 * on type dt. An fp32 kernel accumulates into g itself, row after row; a 16-bit one sums into buf
 * (zeroed here) and acc_done adds the sum to g once, rounded once (tmp: n floats of scratch).
 * An fp32 dt always has an fp32 gdt (GRAD_TYPE below). */
static inline float *acc_begin(enum l3d_dtype dt, float *buf, void *g, int64_t n) {
    if (dt == L3D_F32) return g;
    memset(buf, 0, (size_t)n * sizeof(float));
    return buf;
}
static inline void acc_done(enum l3d_dtype dt, enum l3d_dtype gdt, void *g, const float *acc,
                            float *tmp, int64_t n) {
    if (dt == L3D_F32) return;
    float *gf = row_io(gdt, tmp, g, n);
    vadd(gf, acc, n);
    row_done(gdt, g, gf, n);
}

/* The types each kernel takes; anything else aborts with a message naming kernel and type. */
#define F32_ONLY(kernel)                                                            \
    do {                                                                            \
        if (dt != L3D_F32) l3d_backend_no_variant("cpu", kernel, dt);              \
    } while (0)
/* fp32, bf16 or fp16 */
#define F32_OR_16(kernel)                                                           \
    do {                                                                            \
        if (dt != L3D_F32 && !is16(dt)) l3d_backend_no_variant("cpu", kernel, dt); \
    } while (0)
/* parameter gradients of type dt, or fp32 (main_grad) */
#define GRAD_TYPE(kernel)                                                                    \
    do {                                                                                     \
        if (gdt != dt && gdt != L3D_F32)                                                     \
            l3d_fatal(__FILE__, __LINE__, "backend cpu: %s has no variant for %s gradients " \
                      "of %s activations", kernel, l3d_dtype_name(gdt), l3d_dtype_name(dt)); \
    } while (0)

/* ---- matmul ----------------------------------------------------------------------------- */

/* The forward product runs as a oneDNN matmul primitive (its brgemm kernels, with the bias fused),
 * which measured 10-40% faster than dnnl_sgemm on the GPT-2 forward shapes at small batch (e.g.
 * 256 x 768 x 3072 with the transposed weight: 206 vs ~330 GFLOP/s in place on 2 threads); the
 * backward products stay on dnnl_sgemm, faster there. Primitives are created once per shape and
 * kept in a small cache in the backend context. */
#define L3D_MM_CACHE 48
/* the d(weight) rows the gemm kernels write at once (dweight_gemm); planner's memory.c counts it */
#define L3D_MM_DW_BLOCK_BYTES ((int64_t)8 << 20)

/* A product dst (M,N) (+)= src (M,K) x wei (K,N) (+ bias (1,N)), src and wei read with the
 * given strides (so a transpose is a stride), dst row-major. acc adds to dst (oneDNN's sum
 * post-op: the old dst is read in its own type and the sum rounded once). */
struct mm_key {
    int64_t M, K, N, ss0, ss1, ws0, ws1;
    dnnl_data_type_t st, dt; /* src/weights/bias type, dst type */
    bool bias, acc;
    bool gemm; /* a backward product that takes oneDNN's gemm-based kernels over AMX brgemm */
};

struct mm_entry {
    struct mm_key k;
    bool ok; /* false: oneDNN has no implementation for these types on this CPU */
    char impl[48]; /* oneDNN's implementation (l3d_cpu_matmul_impl) */
    dnnl_primitive_t prim;
    dnnl_memory_t src, wei, bia, dst;
};

/* Scratch the kernels keep between calls. The project's rule: memory is allocated and touched
 * once at start-up, never inside the step loop (the first touch of a fresh page costs ~12 us per
 * 4 KiB here). Each kind of scratch is one buffer of the backend, grown to the largest size asked
 * (the first training step asks every kernel's) and freed with the backend. Like the oneDNN
 * primitive cache, it makes a backend a single caller's: kernels run one at a time, on the thread
 * that calls them (no kernel runs on the progress or checkpoint threads). */
enum scr_kind {
    SCR_THREAD,   /* per-thread rows of a parallel region (thread_scratch) */
    SCR_PARAM_W,  /* fp32 copies of 16-bit parameter vectors (param_f32) */
    SCR_PARAM_B,
    SCR_MM16,     /* fp32 operands of a 16-bit product without oneDNN's 16-bit kernels */
    SCR_TOKORDER, /* encoder_backward's (token, position) order */
    SCR_ROPE,     /* RoPE's cos/sin table (rope_table) */
    SCR_DW,       /* a block of d(weight) rows from the gemm kernels (dweight_gemm) */
    SCR_KINDS
};
struct scratch {
    void *p;
    size_t bytes;
};
/* What the RoPE table holds: cos and sin of pos[t] inv_freq[i] for these T positions and H2
 * frequencies, kept as copies of their values (a pointer can keep its address and change its
 * contents: the model's positions under context parallelism, the KV cache's). T -1: none. */
struct rope_key {
    int64_t T, H2;
    float *inv_freq; /* H2 values, in scr[SCR_ROPE] after the table */
    int32_t *pos;    /* T values, after inv_freq */
};

struct cpu_ctx {
    dnnl_engine_t engine;
    dnnl_stream_t stream;
    struct mm_entry mm[L3D_MM_CACHE];
    int mm_count, mm_next; /* entries in use; next to evict when full */
    /* 16-bit products through oneDNN's own kernels, bf16 [0] and fp16 [1]: bf16 by default on a
     * CPU with AVX512-BF16; $L3D_DNNL_16BIT=0 turns both off, =1 both on (fp16 is opt-in: no
     * machine of this project has had AVX512-FP16) */
    bool dnnl16[2];
    bool mm_gemm; /* keys with gemm set take oneDNN's gemm kernels where AMX brgemm is first:
                   * on unless $L3D_MM_GEMM=0 (mm_pick) */
    int64_t dw_block; /* bytes of d(weight) rows a gemm product writes at once (dweight_gemm):
                       * L3D_MM_DW_BLOCK_BYTES, $L3D_MM_DW_BLOCK_KB for tests */
    int64_t dw_min_rows; /* the fewest rows dweight_gemm runs with: L3D_WGRAD_BLOCK_MIN_ROWS,
                          * $L3D_MM_DW_MIN_ROWS for tests */
    struct scratch scr[SCR_KINDS];
    struct rope_key rope; /* what the table in scr[SCR_ROPE] holds */
    struct l3d_attnd *attnd; /* bf16 attention's products as oneDNN matmuls (cpu_attnd.c) */
};

/* Scratch of kind k, at least `bytes`: the kept buffer, grown (and touched) when a call needs more
 * than any before. Its contents are the last call's: a kernel writes before it reads. */
static void *scratch(struct cpu_ctx *cx, enum scr_kind k, size_t bytes, const char *what) {
    struct scratch *s = &cx->scr[k];
    if (bytes > s->bytes) {
        l3d_free(s->p);
        s->p = l3d_alloc(bytes, what);
        memset(s->p, 0, bytes); /* the pages touched now, not in the kernel's loop */
        s->bytes = bytes;
    }
    return s->p;
}

/* fp32 scratch of `per` floats for each thread of the next parallel region (kept in cx); thread
 * tid uses base + tid * per. */
static float *thread_scratch(struct cpu_ctx *cx, int64_t per, const char *what) {
    int64_t nth = omp_get_max_threads();
    return scratch(cx, SCR_THREAD, (size_t)(nth * per) * sizeof(float), what);
}

/* A parameter vector (n) as fp32: p itself, or its fp32 copy in scratch k (SCR_PARAM_W or _B: a
 * kernel may need two at once). */
static const float *param_f32(struct cpu_ctx *cx, enum scr_kind k, enum l3d_dtype t,
                              const void *p, int64_t n) {
    if (t == L3D_F32) return p;
    float *c = scratch(cx, k, (size_t)n * sizeof(float), "fp32 copy of 16-bit parameters");
    to_f32(t, c, p, n);
    return c;
}

#define DNNL_CHECK L3D_DNNL_CHECK

static void mm_entry_destroy(struct mm_entry *e) {
    if (e->ok) {
        dnnl_primitive_destroy(e->prim);
        dnnl_memory_destroy(e->src);
        dnnl_memory_destroy(e->wei);
        if (e->bia) dnnl_memory_destroy(e->bia);
        dnnl_memory_destroy(e->dst);
    }
    memset(e, 0, sizeof *e);
}

static bool mm_key_eq(const struct mm_key *a, const struct mm_key *b) {
    return a->M == b->M && a->K == b->K && a->N == b->N && a->ss0 == b->ss0 &&
           a->ss1 == b->ss1 && a->ws0 == b->ws0 && a->ws1 == b->ws1 && a->st == b->st &&
           a->dt == b->dt && a->bias == b->bias && a->acc == b->acc && a->gemm == b->gemm;
}

/* The implementation a product runs: oneDNN's first (its own preference), except for the
 * backward products marked gemm where that first is the AMX brgemm kernel. There oneDNN 2.6's
 * gemm-based bf16 kernels (also AMX, "gemm:jit") measured faster for d(inp) over a long K
 * (quiet, 2 threads, N = 2048 rows, GFLOP/s brgemm -> gemm: K = 2304 / 3072: 1090-1182 ->
 * 1399-1486, the head's K = 50304: 595-626 -> 1306-1361; docs/BENCHMARKS.md) and slower where
 * K <= N (768 -> 3072: 1456-1532 -> 1125-1183), so mm_key_dinp marks only K > N. (dW measured
 * 1.1-1.25x faster too: dweight_gemm marks them.) The choice is a rule of the shape, never a
 * timing, so a run is repeatable. Returns the descriptor to create (the caller destroys it). */
static dnnl_primitive_desc_t mm_pick(struct cpu_ctx *cx, const struct mm_key *k,
                                     const dnnl_matmul_desc_t *md, dnnl_primitive_attr_t attr,
                                     dnnl_status_t *st) {
    dnnl_primitive_desc_iterator_t it;
    *st = dnnl_primitive_desc_iterator_create(&it, md, attr, cx->engine, NULL);
    if (*st != dnnl_success) return NULL;
    dnnl_primitive_desc_t first = dnnl_primitive_desc_iterator_fetch(it), pick = NULL;
    const char *impl = "";
    DNNL_CHECK(dnnl_primitive_desc_query(first, dnnl_query_impl_info_str, 0, &impl));
    if (k->gemm && cx->mm_gemm && strstr(impl, "amx") && strncmp(impl, "brg", 3) == 0) {
        while (!pick && dnnl_primitive_desc_iterator_next(it) == dnnl_success) {
            dnnl_primitive_desc_t pd = dnnl_primitive_desc_iterator_fetch(it);
            DNNL_CHECK(dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl));
            if (strncmp(impl, "gemm:", 5) == 0)
                pick = pd;
            else
                dnnl_primitive_desc_destroy(pd);
        }
    }
    if (pick)
        dnnl_primitive_desc_destroy(first);
    else
        pick = first;
    dnnl_primitive_desc_iterator_destroy(it);
    return pick;
}

/* The cached primitive for k, created on first use; e->ok false when oneDNN answers
 * "unimplemented" (e.g. bf16 or fp16 on a CPU without AVX512 BF16 / FP16 support) or offers only
 * its reference implementation for 16-bit types: the caller then computes in fp32. */
static struct mm_entry *mm_get(struct cpu_ctx *cx, const struct mm_key *k) {
    for (int i = 0; i < cx->mm_count; i++)
        if (mm_key_eq(&cx->mm[i].k, k)) return &cx->mm[i];
    struct mm_entry *e;
    if (cx->mm_count < L3D_MM_CACHE) {
        e = &cx->mm[cx->mm_count++];
    } else {
        e = &cx->mm[cx->mm_next];
        cx->mm_next = (cx->mm_next + 1) % L3D_MM_CACHE;
        mm_entry_destroy(e);
    }
    e->k = *k;
    if (k->st != dnnl_f32 && !cx->dnnl16[k->st == dnnl_bf16 ? 0 : 1]) {
        /* turned off (L3D_DNNL_16BIT=0), or fp16 without L3D_DNNL_16BIT=1: the widened path */
        e->ok = false;
        return e;
    }
    dnnl_memory_desc_t src, wei, bia, dst;
    dnnl_dims_t sd = {k->M, k->K}, ss = {k->ss0, k->ss1}, wd = {k->K, k->N},
                ws = {k->ws0, k->ws1}, bd = {1, k->N}, bs = {k->N, 1}, dd = {k->M, k->N},
                ds = {k->N, 1};
    DNNL_CHECK(dnnl_memory_desc_init_by_strides(&src, 2, sd, k->st, ss));
    DNNL_CHECK(dnnl_memory_desc_init_by_strides(&wei, 2, wd, k->st, ws));
    DNNL_CHECK(dnnl_memory_desc_init_by_strides(&bia, 2, bd, k->st, bs));
    DNNL_CHECK(dnnl_memory_desc_init_by_strides(&dst, 2, dd, k->dt, ds));
    dnnl_matmul_desc_t md;
    DNNL_CHECK(dnnl_matmul_desc_init(&md, &src, &wei, k->bias ? &bia : NULL, &dst));
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    if (k->acc) {
        DNNL_CHECK(dnnl_primitive_attr_create(&attr));
        DNNL_CHECK(dnnl_post_ops_create(&po));
        DNNL_CHECK(dnnl_post_ops_append_sum(po, 1.0f));
        DNNL_CHECK(dnnl_primitive_attr_set_post_ops(attr, po));
    }
    dnnl_status_t st;
    dnnl_primitive_desc_t pd = mm_pick(cx, k, &md, attr, &st);
    if (po) dnnl_post_ops_destroy(po);
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (st == dnnl_unimplemented) {
        e->ok = false;
        return e;
    }
    DNNL_CHECK(st);
    const char *impl = "";
    DNNL_CHECK(dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl));
    if (k->st != dnnl_f32 && strncmp(impl, "ref", 3) == 0) {
        /* oneDNN's reference loops (e.g. for a layout its 16-bit kernels do not take) are far
         * slower than the fp32 product around converted operands */
        dnnl_primitive_desc_destroy(pd);
        e->ok = false;
        return e;
    }
    snprintf(e->impl, sizeof e->impl, "%s", impl);
    DNNL_CHECK(dnnl_primitive_create(&e->prim, pd));
    dnnl_primitive_desc_destroy(pd);
    DNNL_CHECK(dnnl_memory_create(&e->src, &src, cx->engine, DNNL_MEMORY_NONE));
    DNNL_CHECK(dnnl_memory_create(&e->wei, &wei, cx->engine, DNNL_MEMORY_NONE));
    if (k->bias) DNNL_CHECK(dnnl_memory_create(&e->bia, &bia, cx->engine, DNNL_MEMORY_NONE));
    DNNL_CHECK(dnnl_memory_create(&e->dst, &dst, cx->engine, DNNL_MEMORY_NONE));
    e->ok = true;
    return e;
}

static void mm_run(struct cpu_ctx *cx, struct mm_entry *e, void *dst, const void *src,
                   const void *wei, const void *bias) {
    L3D_ASSERT(e->ok);
    DNNL_CHECK(dnnl_memory_set_data_handle(e->src, (void *)src));
    DNNL_CHECK(dnnl_memory_set_data_handle(e->wei, (void *)wei));
    if (e->k.bias) DNNL_CHECK(dnnl_memory_set_data_handle(e->bia, (void *)bias));
    DNNL_CHECK(dnnl_memory_set_data_handle(e->dst, dst));
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, e->src}, {DNNL_ARG_WEIGHTS, e->wei},
                               {DNNL_ARG_DST, e->dst}, {DNNL_ARG_BIAS, e->bia}};
    DNNL_CHECK(dnnl_primitive_execute(e->prim, cx->stream, e->k.bias ? 4 : 3, args));
    DNNL_CHECK(dnnl_stream_wait(cx->stream));
}

/* out (N,OC) = inp (N,C) x weight^T: src (N,C) row-major, weights (C,OC) with strides (1,C), i.e.
 * the (OC,C) matrix read transposed, bias (1,OC), dst (N,OC) row-major. */
static struct mm_key mm_key_forward(int64_t N, int64_t C, int64_t OC, dnnl_data_type_t t,
                                    bool bias) {
    return (struct mm_key){.M = N, .K = C, .N = OC, .ss0 = C, .ss1 = 1, .ws0 = 1, .ws1 = C,
                           .st = t, .dt = t, .bias = bias, .acc = false};
}

// out (N,OC), inp (N,C), weight (OC,C), bias (OC) or NULL
static void matmul_forward_f32(void *ctx, float *out, const float *inp, const float *weight,
                               const float *bias, int64_t N, int64_t C, int64_t OC) {
    struct cpu_ctx *cx = ctx;
    struct mm_key k = mm_key_forward(N, C, OC, dnnl_f32, bias != NULL);
    mm_run(cx, mm_get(cx, &k), out, inp, weight, bias);
}

/* dbias (OC, type gdt) += column sums of dout (N,OC, type dt): each thread owns a block of
 * columns and walks all rows in order (bit-identical for any thread count); an fp32 kernel adds
 * each row into dbias, a 16-bit one sums in fp32 and adds once (acc_begin). */
static void bias_grad(struct cpu_ctx *cx, enum l3d_dtype dt, enum l3d_dtype gdt, void *dbias,
                      const void *dout, int64_t N, int64_t OC) {
    float *scr = is16(dt) ? thread_scratch(cx, 2 * OC, "bias gradient scratch") : NULL;
#pragma omp parallel
    {
        int64_t lo, hi;
        chunk(OC, omp_get_thread_num(), omp_get_num_threads(), &lo, &hi);
        int64_t w = hi - lo;
        float *acc = off(scr, omp_get_thread_num() * 2 * OC), *row = off(acc, OC);
        if (w > 0) {
            void *g = at(gdt, dbias, lo);
            float *a = acc_begin(dt, acc, g, w);
            for (int64_t n = 0; n < N; n++)
                vadd(a, row_in(dt, row, at(dt, dout, n * OC + lo), w), w);
            acc_done(dt, gdt, g, a, row, w);
        }
    }
}

// dinp (N,C), dweight (OC,C), dbias (OC), dout (N,OC), inp (N,C), weight (OC,C)
static void matmul_backward_f32(void *ctx, float *dinp, float *dweight, float *dbias,
                                const float *dout, const float *inp, const float *weight,
                                int64_t N, int64_t C, int64_t OC) {
    (void)ctx;
    if (dinp) sgemm('N', 'N', N, C, OC, 1.0f, dout, OC, weight, C, 1.0f, dinp, C);
    if (dweight) sgemm('T', 'N', OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
    if (dbias) bias_grad(ctx, L3D_F32, L3D_F32, dbias, dout, N, OC);
}

/* Matrix products in 16 bits: oneDNN's matmul with 16-bit source and weights and fp32
 * accumulation where it has one (bf16: AVX512-BF16 / AMX CPUs; fp16: AVX512-FP16); otherwise the
 * 16-bit operands are converted to fp32 (exact), the fp32 product runs, and the result is rounded
 * once: the same numerics (fp32 accumulation, one rounding), at the cost of the conversions. */
static void matmul_forward_16(struct cpu_ctx *cx, enum l3d_dtype dt, void *out, const void *inp,
                              const void *weight, const void *bias, int64_t N, int64_t C,
                              int64_t OC) {
    struct mm_key k = mm_key_forward(N, C, OC, dnnl_type(dt), bias != NULL);
    struct mm_entry *e = mm_get(cx, &k);
    if (e->ok) {
        mm_run(cx, e, out, inp, weight, bias);
        return;
    }
    float *fi = scratch(cx, SCR_MM16, (size_t)(N * C + OC * C + OC + N * OC) * sizeof(float),
                        "fp32 operands of a 16-bit matmul");
    float *fw = fi + N * C, *fb = fw + OC * C, *fo = fb + OC;
    struct cvt_job in[3] = {{dt, fi, (void *)inp, N * C, true},
                            {dt, fw, (void *)weight, OC * C, true},
                            {dt, fb, (void *)bias, bias ? OC : 0, true}};
    cvt_par(in, 3);
    matmul_forward_f32(cx, fo, fi, fw, bias ? fb : NULL, N, C, OC);
    cvt_par(&(struct cvt_job){dt, fo, out, N * OC, false}, 1);
}

/* dinp (N,C) += dout (N,OC) x weight (OC,C); bf16 over K = OC > C in the gemm kernels (mm_pick) */
static struct mm_key mm_key_dinp(int64_t N, int64_t C, int64_t OC, enum l3d_dtype dt) {
    return (struct mm_key){.M = N, .K = OC, .N = C, .ss0 = OC, .ss1 = 1, .ws0 = C, .ws1 = 1,
                           .st = dnnl_type(dt), .dt = dnnl_type(dt), .bias = false, .acc = true,
                           .gemm = dt == L3D_BF16 && OC > C};
}
/* dweight (OC,C) += dout^T (OC,N) x inp (N,C), accumulated in gdt, in one product (brgemm's sum
 * post-op adds the whole product to the old gradient): where dweight_gemm does not run. */
static struct mm_key mm_key_dweight(int64_t N, int64_t C, int64_t OC, enum l3d_dtype dt,
                                    enum l3d_dtype gdt) {
    return (struct mm_key){.M = OC, .K = N, .N = C, .ss0 = 1, .ss1 = OC, .ws0 = C, .ws1 = 1,
                           .st = dnnl_type(dt), .dt = dnnl_type(gdt), .bias = false, .acc = true,
                           .gemm = false};
}

/* d(weight) rows o0.. o0+rows-1 of a bf16 product in oneDNN's gemm kernels, into fp32 scratch
 * (beta 0): dout^T's rows are dout's columns from o0 (strides 1, OC). */
static struct mm_key mm_key_dweight_rows(int64_t N, int64_t C, int64_t OC, int64_t rows,
                                         enum l3d_dtype dt) {
    return (struct mm_key){.M = rows, .K = N, .N = C, .ss0 = 1, .ss1 = OC, .ws0 = C, .ws1 = 1,
                           .st = dnnl_type(dt), .dt = dnnl_f32, .bias = false, .acc = false,
                           .gemm = true};
}

/* g (n, type gdt) += s (n, fp32), each element rounded once; in blocks over the threads */
static void grad_add(enum l3d_dtype gdt, void *g, const float *s, int64_t n) {
#pragma omp parallel for schedule(static) if (n > ((int64_t)1 << 16))
    for (int64_t i0 = 0; i0 < n; i0 += L3D_BLK) {
        int64_t m = n - i0 < L3D_BLK ? n - i0 : L3D_BLK;
        float buf[L3D_BLK];
        float *gf = row_io(gdt, buf, at(gdt, g, i0), m);
        vadd(gf, s + i0, m);
        row_done(gdt, at(gdt, g, i0), gf, m);
    }
}

/* dweight += dout^T x inp in oneDNN's gemm kernels where mm_pick gives them (bf16, AMX brgemm
 * first, $L3D_MM_GEMM not 0): measured 1.1-1.25x brgemm's rate on GPT-2's d(weight) shapes
 * (docs/BENCHMARKS.md). Their accumulating form adds the product onto the old gradient inside
 * the sum (beta 1), so g + P1 + P2 over two micro-batches would differ from P1 + P2 summed over
 * two data-parallel ranks (cli_moe's bf16 dp2 against one process failed at 4e-5): here each
 * block of rows is computed whole into fp32 scratch (beta 0) and then added, each gradient
 * element rounded once, as brgemm's sum post-op does. The blocks (cx->dw_block bytes, a multiple
 * of 64 rows, the last one shorter) bound the scratch: a whole head's d(weight) in fp32 is 154 MB
 * at GPT-2's vocabulary, 2.1 GB at Llama 3's. Products of fewer than cx->dw_min_rows rows
 * (tokens) keep brgemm: there the add costs more than the faster kernel gains. Returns false
 * (nothing done) where the gemm kernels are not picked: the caller runs the one brgemm product. */
static struct mm_entry *dweight_gemm_entry(struct cpu_ctx *cx, enum l3d_dtype dt, int64_t N,
                                           int64_t C, int64_t OC, int64_t *rows) {
    if (dt != L3D_BF16 || !cx->mm_gemm || N < cx->dw_min_rows) return NULL;
    *rows = l3d_wgrad_block_rows(cx->dw_block, C, OC);
    struct mm_key k = mm_key_dweight_rows(N, C, OC, *rows, dt);
    struct mm_entry *e = mm_get(cx, &k);
    return e->ok && strncmp(e->impl, "gemm:", 5) == 0 ? e : NULL;
}
static bool dweight_gemm(struct cpu_ctx *cx, enum l3d_dtype dt, enum l3d_dtype gdt,
                         void *dweight, const void *dout, const void *inp, int64_t N, int64_t C,
                         int64_t OC) {
    int64_t rows;
    if (!dweight_gemm_entry(cx, dt, N, C, OC, &rows)) return false;
    float *s = scratch(cx, SCR_DW, (size_t)(rows * C) * sizeof(float), "d(weight) rows");
    for (int64_t o0 = 0; o0 < OC; o0 += rows) {
        int64_t r = OC - o0 < rows ? OC - o0 : rows;
        struct mm_key kr = mm_key_dweight_rows(N, C, OC, r, dt);
        mm_run(cx, mm_get(cx, &kr), s, at(dt, dout, o0), inp, NULL);
        grad_add(gdt, at(gdt, dweight, o0 * C), s, r * C);
    }
    return true;
}

static void matmul_backward_16(struct cpu_ctx *cx, enum l3d_dtype dt, enum l3d_dtype gdt,
                               void *dinp, void *dweight, void *dbias, const void *dout,
                               const void *inp, const void *weight, int64_t N, int64_t C,
                               int64_t OC) {
    struct mm_key ki = mm_key_dinp(N, C, OC, dt), kw = mm_key_dweight(N, C, OC, dt, gdt);
    if (dweight && dweight_gemm(cx, dt, gdt, dweight, dout, inp, N, C, OC)) dweight = NULL;
    struct mm_entry *ei = dinp ? mm_get(cx, &ki) : NULL, *ew = dweight ? mm_get(cx, &kw) : NULL;
    if (ei && ei->ok) mm_run(cx, ei, dinp, dout, weight, NULL);
    if (ew && ew->ok) mm_run(cx, ew, dweight, dout, inp, NULL);
    bool fi = ei && !ei->ok, fw = ew && !ew->ok;
    if (fi || fw) { /* fp32 around the fp32 products (sgemm, as matmul_backward_f32) */
        int64_t n = N * OC + (fi ? OC * C + N * C : 0) + (fw ? N * C : 0) +
                    (fw && gdt != L3D_F32 ? OC * C : 0);
        float *fo = scratch(cx, SCR_MM16, (size_t)n * sizeof(float),
                            "fp32 operands of a 16-bit matmul");
        /* fo: dout; then fi: weight, dinp; fw: inp, dweight unless it is fp32 already */
        float *fwt = fo + N * OC, *fdi = fwt + (fi ? OC * C : 0);
        float *fin = fdi + (fi ? N * C : 0), *fdw = gdt == L3D_F32 ? dweight : fin + N * C;
        bool cw = fw && gdt != L3D_F32;
        struct cvt_job in[5] = {{dt, fo, (void *)dout, N * OC, true},
                                {dt, fwt, (void *)weight, fi ? OC * C : 0, true},
                                {dt, fdi, dinp, fi ? N * C : 0, true},
                                {dt, fin, (void *)inp, fw ? N * C : 0, true},
                                {gdt, fdw, dweight, cw ? OC * C : 0, true}};
        cvt_par(in, 5);
        if (fi) sgemm('N', 'N', N, C, OC, 1.0f, fo, OC, fwt, C, 1.0f, fdi, C);
        if (fw) sgemm('T', 'N', OC, C, N, 1.0f, fo, OC, fin, C, 1.0f, fdw, C);
        struct cvt_job back[2] = {{dt, fdi, dinp, fi ? N * C : 0, false},
                                  {gdt, fdw, dweight, cw ? OC * C : 0, false}};
        cvt_par(back, 2);
    }
    if (dbias) bias_grad(cx, dt, gdt, dbias, dout, N, OC);
}

/* ---- embedding -------------------------------------------------------------------------- */

// out (B,T,C), tokens (B,T), wte (vocab_count,C), wpe (>=T,C) or NULL
static void cpu_encoder_forward(void *ctx, enum l3d_dtype dt, void *out, const int32_t *tokens,
                                const void *wte, const void *wpe, int64_t vocab_start,
                                int64_t vocab_count, int64_t B, int64_t T, int64_t C) {
    (void)ctx;
    F32_OR_16("encoder_forward");
    const int64_t bl = span_blk(dt, C);
#pragma omp parallel for schedule(static)
    for (int64_t bt = 0; bt < B * T; bt++) {
        int64_t v = (int64_t)tokens[bt] - vocab_start;
        bool in = v >= 0 && v < vocab_count;
        for (int64_t c0 = 0; c0 < C; c0 += bl) {
            int64_t n = C - c0 < bl ? C - c0 : bl;
            float ob[L3D_BLK], pb[L3D_BLK];
            void *op = at(dt, out, bt * C + c0);
            float *o = row_out(dt, ob, op);
            if (in)
                to_f32(dt, o, at(dt, wte, v * C + c0), n);
            else
                memset(o, 0, (size_t)n * sizeof(float));
            if (wpe) vadd(o, row_in(dt, pb, at(dt, wpe, (bt % T) * C + c0), n), n);
            row_done(dt, op, o, n);
        }
    }
}

/* (token, position) pairs, ordered by token then position: a token's rows in order */
struct tok_pos {
    int64_t v, bt;
};
static int tok_pos_cmp(const void *a, const void *b) {
    const struct tok_pos *x = a, *y = b;
    if (x->v != y->v) return x->v < y->v ? -1 : 1;
    return x->bt < y->bt ? -1 : x->bt > y->bt;
}

/* dwte, dwpe (type gdt) +=. Tokens repeat, so threads split the channels, not the rows: no two
 * threads touch the same element and the order of additions is fixed. fp32 walks the rows of
 * dout once, in order, adding each into its dwte and dwpe rows. A 16-bit kernel sums in fp32 and
 * adds to the gradient once (acc_begin): dwte the rows of each token, found by sorting (token,
 * position) pairs (so the order is fixed), which a 16-bit dwte needs: adding each occurrence
 * would round once per occurrence; then dwpe the B rows of each position. */
// dwte (vocab_count,C), dwpe (>=T,C) or NULL, dout (B,T,C), tokens (B,T)
static void cpu_encoder_backward(void *ctx, enum l3d_dtype dt, enum l3d_dtype gdt, void *dwte,
                                 void *dwpe, const void *dout, const int32_t *tokens,
                                 int64_t vocab_start, int64_t vocab_count, int64_t B, int64_t T,
                                 int64_t C) {
    struct cpu_ctx *cx = ctx;
    F32_OR_16("encoder_backward");
    GRAD_TYPE("encoder_backward");
    /* the rows in the order of the first pass: 16-bit, the sorted pairs tp (the rows of dwte's
     * tokens); fp32, row i of dout itself, all of them, dwpe added in the same pass (fused) */
    const bool fused = !is16(dt) && dwpe;
    struct tok_pos *tp = NULL;
    int64_t nrow = dwte || fused ? B * T : 0;
    if (dwte && is16(dt)) {
        tp = scratch(cx, SCR_TOKORDER, (size_t)(B * T) * sizeof *tp,
                     "encoder gradient token order");
        nrow = 0;
        for (int64_t bt = 0; bt < B * T; bt++) {
            int64_t v = (int64_t)tokens[bt] - vocab_start;
            if (v >= 0 && v < vocab_count) tp[nrow++] = (struct tok_pos){v, bt};
        }
        qsort(tp, (size_t)nrow, sizeof *tp, tok_pos_cmp);
    }
    float *scr = is16(dt) ? thread_scratch(cx, 3 * C, "encoder gradient scratch") : NULL;
#pragma omp parallel
    {
        int64_t lo, hi;
        chunk(C, omp_get_thread_num(), omp_get_num_threads(), &lo, &hi);
        int64_t w = hi - lo;
        float *acc = off(scr, omp_get_thread_num() * 3 * C), *d = off(acc, C), *g = off(d, C);
        for (int64_t i = 0; w > 0 && i < nrow;) {
            int64_t v = tp ? tp[i].v : (int64_t)tokens[i] - vocab_start;
            void *gv = dwte && v >= 0 && v < vocab_count ? at(gdt, dwte, v * C + lo) : NULL;
            float *a = gv ? acc_begin(dt, acc, gv, w) : NULL;
            do { /* the run of rows of token v */
                int64_t bt = tp ? tp[i].bt : i;
                const float *dr = row_in(dt, d, at(dt, dout, bt * C + lo), w);
                if (a) vadd(a, dr, w);
                if (fused) vadd(at(L3D_F32, dwpe, (bt % T) * C + lo), dr, w);
                i++;
            } while (i < nrow && (tp ? tp[i].v : (int64_t)tokens[i] - vocab_start) == v);
            if (gv) acc_done(dt, gdt, gv, a, g, w);
        }
        for (int64_t t = 0; dwpe && !fused && w > 0 && t < T; t++) {
            void *gt = at(gdt, dwpe, t * C + lo);
            float *a = acc_begin(dt, acc, gt, w);
            for (int64_t b = 0; b < B; b++)
                vadd(a, row_in(dt, d, at(dt, dout, (b * T + t) * C + lo), w), w);
            acc_done(dt, gdt, gt, a, g, w);
        }
    }
}

/* ---- layernorm -------------------------------------------------------------------------- */

#define L3D_LN_EPS 1e-5f

/* One row: o (C) = (x - mean) * rstd * weight + bias; *mean, *rstd its statistics; o may be x */
static inline void ln_forward_row(float *o, float *mean, float *rstd, const float *x,
                                  const float *weight, const float *bias, int64_t C) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t c = 0; c < C; c++) s += x[c];
    float m = s / (float)C;
    float v = 0.0f;
#pragma omp simd reduction(+ : v)
    for (int64_t c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
    float r = 1.0f / sqrtf(v / (float)C + L3D_LN_EPS);
#pragma omp simd
    for (int64_t c = 0; c < C; c++) o[c] = (x[c] - m) * r * weight[c] + bias[c];
    *mean = m;
    *rstd = r;
}

/* RMSNorm (Zhang & Sennrich 2019, eq. 4): one row o (C) = x * rstd * weight with
 * rstd = 1 / sqrt(mean(x^2) + eps); o may be x. */
static inline void rms_forward_row(float *o, float *rstd, const float *x, const float *weight,
                                   int64_t C, float eps) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t c = 0; c < C; c++) s += x[c] * x[c];
    float r = 1.0f / sqrtf(s / (float)C + eps);
#pragma omp simd
    for (int64_t c = 0; c < C; c++) o[c] = x[c] * r * weight[c];
    *rstd = r;
}

/* One row of dinp (C) += rstd * (g - xhat * mean(g * xhat)), g = dout * weight, xhat = x rstd:
 * d/dx of x r w with dr/dx = -r^3 x / C. */
static inline void rms_backward_row(float *di, const float *x, const float *d,
                                    const float *weight, float r, int64_t C) {
    float sgx = 0.0f;
#pragma omp simd reduction(+ : sgx)
    for (int64_t c = 0; c < C; c++) sgx += d[c] * weight[c] * x[c] * r;
    sgx /= (float)C;
#pragma omp simd
    for (int64_t c = 0; c < C; c++) di[c] += r * (d[c] * weight[c] - x[c] * r * sgx);
}

/* Row n's residual sum res = inp + add (=, rounded to dt), the row the norm then reads: the
 * 16-bit sum widened back from its rounding, so that the norm sees what the unfused pair's
 * residual_forward stored (the same bits). fp32: res itself; 16-bit: x (C floats) and y (C). */
static const float *residual_row(enum l3d_dtype dt, void *res, const void *inp, const void *add,
                                 int64_t n, int64_t C, float *x, float *y) {
    void *rp = at(dt, res, n * C);
    float *r = row_out(dt, x, rp);
    const float *a = row_in(dt, x, at(dt, inp, n * C), C);
    const float *b = row_in(dt, y, at(dt, add, n * C), C);
#pragma omp simd
    for (int64_t c = 0; c < C; c++) r[c] = a[c] + b[c];
    if (dt == L3D_F32) return r;
    row_done(dt, rp, r, C);
    to_f32(dt, x, rp, C);
    return x;
}

/* Whether a normalisation's rows run cpu_ew.c's AVX-512 rows: 16-bit types on an AVX-512 CPU.
 * fp32 keeps the portable loops: the AVX-512 rows sum in another order and measured no faster in
 * fp32, and with them the fp32 MoE layouts on the checking backend moved past their 1e-5 bounds
 * against one process (cli_ep_layouts: cp2 7.3e-5 against 6e-5, ep2 x pp2 1.3e-5 against 1e-5). */
static bool norm_rows512(enum l3d_simd isa, enum l3d_dtype dt) {
    return isa >= L3D_SIMD_AVX512 && is16(dt);
}

/* The rows of a normalisation over threads: LayerNorm (mean not NULL; bias bf) or RMSNorm (mean
 * NULL, eps) on fp32 weights wf; fp32 rows in place, 16-bit rows widened into per-thread scratch
 * and rounded back once. With add (not NULL) the rows normalised are res = inp + add, written
 * first (residual_row): the residual add and the norm in one pass over the rows. */
static void norm_forward_rows(struct cpu_ctx *cx, enum l3d_dtype dt, void *out, float *mean,
                              float *rstd, const void *inp, const float *wf, const float *bf,
                              int64_t N, int64_t C, float eps, void *res, const void *add) {
    const enum l3d_simd isa = l3d_cpu_simd();
    if (norm_rows512(isa, dt)) { /* in AVX-512, no scratch (cpu_ew.c) */
#pragma omp parallel for schedule(static)
        for (int64_t n = 0; n < N; n++)
            l3d_cpu_ln_forward_row(isa, dt, at(dt, out, n * C), mean ? mean + n : NULL, rstd + n,
                                   add ? at(dt, res, n * C) : NULL, at(dt, inp, n * C),
                                   add ? at(dt, add, n * C) : NULL, wf, bf, C, eps);
        return;
    }
    const int64_t per = add ? 2 * C : C;
    float *scr = is16(dt) ? thread_scratch(cx, per, "normalisation scratch") : NULL;
#pragma omp parallel
    {
        float *x = off(scr, omp_get_thread_num() * per); /* 16-bit: the row, in place */
#pragma omp for schedule(static)
        for (int64_t n = 0; n < N; n++) {
            void *op = at(dt, out, n * C);
            float *o = row_out(dt, x, op);
            const float *xi = add ? residual_row(dt, res, inp, add, n, C, x, off(x, C))
                                  : row_in(dt, x, at(dt, inp, n * C), C);
            if (mean)
                ln_forward_row(o, mean + n, rstd + n, xi, wf, bf, C);
            else
                rms_forward_row(o, rstd + n, xi, wf, C, eps);
            row_done(dt, op, o, C);
        }
    }
}

// out (N,C), mean (N), rstd (N) fp32, inp (N,C), weight (C), bias (C)
static void cpu_layernorm_forward(void *ctx, enum l3d_dtype dt, void *out, float *mean,
                                  float *rstd, const void *inp, const void *weight,
                                  const void *bias, int64_t N, int64_t C) {
    struct cpu_ctx *cx = ctx;
    F32_OR_16("layernorm_forward");
    const float *wf = param_f32(cx, SCR_PARAM_W, dt, weight, C);
    const float *bf = param_f32(cx, SCR_PARAM_B, dt, bias, C);
    norm_forward_rows(cx, dt, out, mean, rstd, inp, wf, bf, N, C, L3D_LN_EPS, NULL, NULL);
}

/* One row of dinp (C) += rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dout * weight. */
static inline void ln_backward_row(float *di, const float *x, const float *d,
                                   const float *weight, float m, float r, int64_t C) {
    float sg = 0.0f, sgx = 0.0f;
#pragma omp simd reduction(+ : sg, sgx)
    for (int64_t c = 0; c < C; c++) {
        float g = d[c] * weight[c];
        sg += g;
        sgx += g * (x[c] - m) * r;
    }
    sg /= (float)C;
    sgx /= (float)C;
#pragma omp simd
    for (int64_t c = 0; c < C; c++) {
        float xhat = (x[c] - m) * r;
        di[c] += r * (d[c] * weight[c] - sg - xhat * sgx);
    }
}

/* dinp (N,C) += the input gradient of a normalisation, row by row over threads: LayerNorm (mean
 * not NULL) or RMSNorm (mean NULL). 16-bit: rows widened into the thread's scratch scr + tid per
 * (3C floats used), dinp rounded back once. */
static void norm_dinp_rows(enum l3d_dtype dt, void *dinp, const void *dout, const void *inp,
                           const float *wf, const float *mean, const float *rstd, int64_t N,
                           int64_t C, float *scr, int64_t per) {
    const enum l3d_simd isa = l3d_cpu_simd();
    if (norm_rows512(isa, dt)) { /* in AVX-512, no scratch (cpu_ew.c) */
#pragma omp parallel for schedule(static)
        for (int64_t n = 0; n < N; n++)
            l3d_cpu_ln_backward_row(isa, dt, at(dt, dinp, n * C), at(dt, inp, n * C),
                                    at(dt, dout, n * C), wf, mean ? mean + n : NULL, rstd[n], C);
        return;
    }
#pragma omp parallel
    {
        float *xb = off(scr, omp_get_thread_num() * per), *db = off(xb, C), *ib = off(db, C);
#pragma omp for schedule(static)
        for (int64_t n = 0; n < N; n++) {
            void *dp = at(dt, dinp, n * C);
            float *di = row_io(dt, ib, dp, C);
            const float *x = row_in(dt, xb, at(dt, inp, n * C), C);
            const float *d = row_in(dt, db, at(dt, dout, n * C), C);
            if (mean)
                ln_backward_row(di, x, d, wf, mean[n], rstd[n], C);
            else
                rms_backward_row(di, x, d, wf, rstd[n], C);
            row_done(dt, dp, di, C);
        }
    }
}

/* dweight, dbias (type gdt; either NULL) += column sums over the rows of dout xhat and of dout,
 * xhat = (x - mean) rstd (LayerNorm) or x rstd (RMSNorm: mean NULL), each thread a block of
 * columns (acc_begin: fp32 row by row into the gradient, 16-bit summed in fp32, added once).
 * 16-bit: the thread's scratch scr + tid per (3C floats used, 4C with dbias). */
static void norm_weight_grad(enum l3d_dtype dt, enum l3d_dtype gdt, void *dweight, void *dbias,
                             const void *dout, const void *inp, const float *mean,
                             const float *rstd, int64_t N, int64_t C, float *scr, int64_t per) {
    const enum l3d_simd isa = l3d_cpu_simd();
#pragma omp parallel
    {
        int64_t lo, hi;
        chunk(C, omp_get_thread_num(), omp_get_num_threads(), &lo, &hi);
        int64_t w = hi - lo;
        float *aw = off(scr, omp_get_thread_num() * per), *xb = off(aw, C), *db = off(xb, C);
        float *ab = dbias ? off(db, C) : NULL;
        if (w > 0) {
            void *gw = dweight ? at(gdt, dweight, lo) : NULL;
            void *gb = dbias ? at(gdt, dbias, lo) : NULL;
            float *sw = gw ? acc_begin(dt, aw, gw, w) : NULL;
            float *sb = gb ? acc_begin(dt, ab, gb, w) : NULL;
            for (int64_t n = 0; n < N && norm_rows512(isa, dt); n++) /* as below (cpu_ew.c) */
                l3d_cpu_norm_wgrad_row(isa, dt, sw, sb, at(dt, inp, n * C + lo),
                                       at(dt, dout, n * C + lo), mean ? mean[n] : 0.0f, rstd[n], w);
            for (int64_t n = 0; n < N && !norm_rows512(isa, dt); n++) {
                const float *x = row_in(dt, xb, at(dt, inp, n * C + lo), w);
                const float *d = row_in(dt, db, at(dt, dout, n * C + lo), w);
                float r = rstd[n];
                if (sw && mean) {
                    float m = mean[n];
#pragma omp simd
                    for (int64_t c = 0; c < w; c++) sw[c] += d[c] * (x[c] - m) * r;
                } else if (sw) {
#pragma omp simd
                    for (int64_t c = 0; c < w; c++) sw[c] += d[c] * x[c] * r;
                }
                if (sb) vadd(sb, d, w);
            }
            if (gw) acc_done(dt, gdt, gw, sw, xb, w);
            if (gb) acc_done(dt, gdt, gb, sb, xb, w);
        }
    }
}

/* LayerNorm's backward, or RMSNorm's (mean and dbias NULL); 16-bit: per-thread scratch of 4C
 * floats (3C for RMSNorm). */
static void norm_backward(struct cpu_ctx *cx, enum l3d_dtype dt, enum l3d_dtype gdt, void *dinp,
                          void *dweight, void *dbias, const void *dout, const void *inp,
                          const void *weight, const float *mean, const float *rstd, int64_t N,
                          int64_t C, const char *kernel) {
    F32_OR_16(kernel);
    GRAD_TYPE(kernel);
    const int64_t per = (mean ? 4 : 3) * C;
    const float *wf = param_f32(cx, SCR_PARAM_W, dt, weight, C);
    float *scr = is16(dt) ? thread_scratch(cx, per, mean ? "layernorm scratch" : "rmsnorm scratch")
                          : NULL;
    if (dinp) norm_dinp_rows(dt, dinp, dout, inp, wf, mean, rstd, N, C, scr, per);
    if (dweight || dbias)
        norm_weight_grad(dt, gdt, dweight, dbias, dout, inp, mean, rstd, N, C, scr, per);
}

// dinp (N,C), dweight (C), dbias (C), dout (N,C), inp (N,C), weight (C), mean (N), rstd (N)
static void cpu_layernorm_backward(void *ctx, enum l3d_dtype dt, enum l3d_dtype gdt, void *dinp,
                                   void *dweight, void *dbias, const void *dout, const void *inp,
                                   const void *weight, const float *mean, const float *rstd,
                                   int64_t N, int64_t C) {
    struct cpu_ctx *cx = ctx;
    norm_backward(cx, dt, gdt, dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C,
                  "layernorm_backward");
}

/* ---- attention: tiled, online softmax (FlashAttention) ----------------------------------
 *
 * Dao et al. 2022, "FlashAttention: Fast and Memory-Efficient Exact Attention with IO-Awareness"
 * (Algorithm 1 forward, Algorithm 2 backward) with the loop order of Dao 2023, "FlashAttention-2"
 * (Algorithm 1: query blocks outer in forward, key blocks outer in backward; the running output
 * rescaled once per key block and divided by the row sum at the end; only the log-sum-exp
 * L = m + log(l) per query row saved). No B NH T^2 tensor exists: the scores of one
 * (L3D_FA_BQ x L3D_FA_BK) block live in a per-thread stack buffer and are recomputed in backward.
 *
 * Blocks: 64 query rows x 64 keys. With GPT-2's HS = 64 a block's Q, K, V, scores and dP are
 * 16 KiB each (80 KiB): they stay in this EPYC's 512 KiB L2 per core while the 32 KiB L1 holds the
 * panels dnnl_sgemm streams; 64-wide blocks waste half of only the diagonal block to the causal
 * mask (1/16 of the work at T = 1024) and give (T/64) tasks per head to share among threads.
 * Larger blocks (128 x 128) have not been measured yet.
 *
 * Every product is dnnl_sgemm on a block, called inside an OpenMP region where oneDNN runs
 * single-threaded. Each output element is computed by one task, start to end, in a fixed order
 * (key blocks ascending in forward; in backward, per (batch, head), key blocks outer and query
 * blocks inner, so dQ sums its key blocks ascending and dK, dV their query blocks ascending): the
 * results do not depend on the number of threads or on which thread runs a task.
 */

/* One query block: rows i = 0..nq-1 at positions p0 + i attend over keys 0..p0 + i (and below
 * nkv: a key chunk of nkv keys; p0 >= nkv is a chunk entirely before the queries, unmasked).
 * q (nq rows, stride qs), k and v (p0 + nq rows, stride ks), out (nq rows, stride os), all at the
 * head's offset; lse (nq) or NULL. S is (L3D_FA_BQ x L3D_FA_BK) scratch. The first key block is
 * always unmasked for every row, so the running max is finite from the start. p16: bf16
 * attention's numerics (l3d_fa_online_row16: P rounded to bf16 for P V, as cpu_attnd.c). */
static void fa_forward_block_n(float *out, int64_t os, float *lse, const float *q, int64_t qs,
                               const float *k, const float *v, int64_t ks, int64_t p0, int64_t nq,
                               int64_t nkv, int64_t HS, float *S, bool p16) {
    const float scale = 1.0f / sqrtf((float)HS);
    float m[L3D_FA_BQ], l[L3D_FA_BQ];
    for (int64_t i = 0; i < nq; i++) {
        m[i] = -INFINITY;
        l[i] = 0.0f;
        memset(out + i * os, 0, (size_t)HS * sizeof(float));
    }
    const int64_t nkeys = p0 + nq < nkv ? p0 + nq : nkv;
    for (int64_t j0 = 0; j0 < nkeys; j0 += L3D_FA_BK) {
        int64_t nk = nkeys - j0 < L3D_FA_BK ? nkeys - j0 : L3D_FA_BK;
        sgemm('N', 'T', nq, nk, HS, scale, q, qs, k + j0 * ks, ks, 0.0f, S, L3D_FA_BK);
        for (int64_t i = 0; i < nq; i++) {
            float *s = S + i * L3D_FA_BK;
            int64_t valid = p0 + i - j0 + 1; /* keys j0.. j0+valid-1 are visible to row i */
            int64_t vis = valid > nk ? nk : valid;
            float corr = p16 ? l3d_fa_online_row16(s, vis, nk, &m[i], &l[i])
                             : l3d_fa_online_row(s, vis, nk, &m[i], &l[i]);
            if (corr != 1.0f) {
                float *o = out + i * os;
#pragma omp simd
                for (int64_t d = 0; d < HS; d++) o[d] *= corr;
            }
        }
        sgemm('N', 'N', nq, HS, nk, 1.0f, S, L3D_FA_BK, v + j0 * ks, ks, 1.0f, out, os);
    }
    for (int64_t i = 0; i < nq; i++) {
        float inv = 1.0f / l[i], *o = out + i * os;
#pragma omp simd
        for (int64_t d = 0; d < HS; d++) o[d] *= inv;
        if (lse) lse[i] = (p16 ? m[i] * L3D_LN2 : m[i]) + logf(l[i]);
    }
}
/* The same over keys 0..p0 + i of a sequence: its first p0 + nq keys */
static void fa_forward_block(float *out, int64_t os, float *lse, const float *q, int64_t qs,
                             const float *k, const float *v, int64_t ks, int64_t p0, int64_t nq,
                             int64_t HS, float *S, bool p16) {
    fa_forward_block_n(out, os, lse, q, qs, k, v, ks, p0, nq, p0 + nq, HS, S, p16);
}
/* Where l3d_fa16_on says so, 16-bit attention runs cpu_attn16.c's dot products, which are on bf16
 * attention's numerics (p16) always: every bf16 attention path then takes them (the whole
 * sequence's, the ring's blocks, the KV cache) */


/* fa_forward_block on tensors of type dt. fp32: on the tensors. 16-bit: the query block and its
 * keys and values widened into the thread's fp32 scratch f (fa_scratch floats: 2 (p0 + nq) HS
 * elements converted for ~4 (p0 + nq) nq HS FLOPs, 1/(2 nq) of a conversion per FLOP), the
 * output rows rounded once. p16 as fa_forward_block_n. */
static void fa_forward_rows(enum l3d_dtype dt, float *f, void *out, int64_t os, float *lse,
                            const void *q, int64_t qs, const void *k, const void *v, int64_t ks,
                            int64_t p0, int64_t nq, int64_t HS, float *S, bool p16) {
    if (dt == L3D_F32) {
        fa_forward_block(out, os, lse, q, qs, k, v, ks, p0, nq, HS, S, p16);
        return;
    }
    if (l3d_fa16_on(dt, HS)) { /* bf16 dot products on the tensors themselves */
        l3d_fa16_forward_block(out, os, lse, q, qs, k, v, ks, p0, nq, p0 + nq, HS, f);
        return;
    }
    float *qf = f, *of = qf + L3D_FA_BQ * HS, *kf = of + L3D_FA_BQ * HS, *vf = kf + (p0 + nq) * HS;
    rows_to_f32(dt, qf, HS, q, qs, nq, HS);
    rows_to_f32(dt, kf, HS, k, ks, p0 + nq, HS);
    rows_to_f32(dt, vf, HS, v, ks, p0 + nq, HS);
    fa_forward_block(of, HS, lse, qf, HS, kf, vf, HS, p0, nq, HS, S, p16);
    rows_from_f32(dt, out, os, of, HS, nq, HS);
}
/* fp32 scratch per thread of fa_forward_rows for up to nkeys keys: none for fp32 */
static int64_t fa_scratch(enum l3d_dtype dt, int64_t nkeys, int64_t HS) {
    if (l3d_fa16_on(dt, HS)) return l3d_fa16_forward_floats(HS);
    return is16(dt) ? (2 * L3D_FA_BQ + 2 * nkeys) * HS : 0;
}

/* Grouped-query attention (Ainslie et al. 2023, "GQA"): NKV key/value heads, each serving the
 * NH / NKV consecutive query heads of its group; NKV == NH is multi-head attention, 1 multi-query.
 * A qkv row (NH + 2 NKV) HS: the NH query heads, the NKV key heads, the NKV value heads (for
 * NKV == NH exactly (3, NH, HS)). Query head h reads KV head h / (NH / NKV) where it lies: no
 * repeated copy of the keys and values exists. */
static void gqa_check(const char *kernel, int64_t NH, int64_t NKV) {
    if (NKV <= 0 || NH <= 0 || NH % NKV != 0)
        l3d_fatal(__FILE__, __LINE__, "backend cpu: %s: %lld query heads are not a multiple of "
                  "%lld key/value heads", kernel, (long long)NH, (long long)NKV);
}

// out (B,T,NH,HS), lse (B,NH,T), qkv (B,T,NH+2*NKV,HS)
static void cpu_attention_forward(void *ctx, enum l3d_dtype dt, void *out, float *lse,
                                  const void *qkv, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                                  int64_t HS) {
    struct cpu_ctx *cx = ctx;
    F32_OR_16("attention_forward");
    gqa_check("attention_forward", NH, NKV);
    if (l3d_attnd_on(cx->attnd, dt)) { /* oneDNN's bf16 matmuls (AMX) */
        l3d_attnd_forward(cx->attnd, out, lse, qkv, B, T, NH, NKV, HS);
        return;
    }
    const int64_t C = NH * HS, CQ = (NH + 2 * NKV) * HS, rep = NH / NKV;
    const int64_t nb = (T + L3D_FA_BQ - 1) / L3D_FA_BQ;
    const int64_t per = fa_scratch(dt, T, HS);
    float *scr = per ? thread_scratch(cx, per, "attention fp32 scratch") : NULL;
    /* tasks (b, h, query block), the longest rows (last blocks) first, handed out one at a time
     * (a contiguous static partition gave the first thread the long blocks: 70% of the causal
     * work at T = 256); each output row is one task's, so the bits do not depend on the schedule */
#pragma omp parallel
    {
        _Alignas(64) float S[L3D_FA_BQ * L3D_FA_BK];
        float *f = off(scr, omp_get_thread_num() * per);
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < B * NH * nb; task++) {
            int64_t bh = task % (B * NH), qb = nb - 1 - task / (B * NH);
            int64_t b = bh / NH, h = bh % NH, g = h / rep, i0 = qb * L3D_FA_BQ;
            int64_t nq = T - i0 < L3D_FA_BQ ? T - i0 : L3D_FA_BQ;
            const void *row = at(dt, qkv, b * T * CQ);
            fa_forward_rows(dt, f, at(dt, out, (b * T + i0) * C + h * HS), C, lse + bh * T + i0,
                            at(dt, row, i0 * CQ + h * HS), CQ, at(dt, row, (NH + g) * HS),
                            at(dt, row, (NH + NKV + g) * HS), CQ, i0, nq, HS, S, false);
        }
    }
}

/* The operands of fa_backward_span: one key/value head and the rep query heads it serves (query
 * head r at q + r hq, dq + r hq, dO + r ho, O + r ho, L + r hl), with their row strides. Query
 * row i sees keys j <= p0 + i of the nk (p0 = 0, nq = nk: one causal sequence; p0 >= nk: a key
 * chunk entirely before the queries, context parallelism). */
struct fa_span {
    float *dq, *dk, *dv;
    const float *q, *k, *v, *dO, *O, *L;
    int64_t gqs, gks, qs, ks, os; /* rows: dq; dk and dv; q; k and v; dO and O */
    int64_t hq, ho, hl;
    int64_t rep, p0, nq, nk, HS;
    bool p16; /* bf16 attention's numerics: P and dS rounded to bf16 for their products */
};

/* p and ds (n each) rounded to bf16 in place, as cpu_attnd.c rounds P and dS */
static void fa_round16(float *p, float *ds, int64_t n) {
#pragma omp simd
    for (int64_t j = 0; j < n; j++) {
        p[j] = l3d_attn_p16(p[j]);
        ds[j] = l3d_attn_p16(ds[j]);
    }
}

/* dq, dk, dv += the span's gradients from q, k, v, dO, O and L; P, dS (L3D_FA_BQ x L3D_FA_BK) and
 * D (L3D_FA_BQ) scratch. Per pair (query block i, key block j) with a visible key, each query head:
 *   P = exp(S - L), dV_j += P^T dO_i, dP = dO_i V_j^T, dS = P (dP - D) / sqrt(HS),
 *   dQ_i += dS K_j, dK_j += dS^T Q_i,   with D = rowsum(dO * O) (FlashAttention-2 eq. 4).
 * Key blocks outer, then the query heads in order, then their query blocks: dK_j and dV_j sum the
 * group's heads and blocks in one fixed order (with rep = 1, multi-head attention's order). */
static void fa_backward_span(const struct fa_span *a, float *P, float *dS, float *D) {
    const int64_t HS = a->HS, nqb = (a->nq + L3D_FA_BQ - 1) / L3D_FA_BQ;
    const int64_t nkb = (a->nk + L3D_FA_BK - 1) / L3D_FA_BK, qs = a->qs, ks = a->ks, os = a->os;
    const float scale = 1.0f / sqrtf((float)HS);
    for (int64_t kb = 0; kb < nkb; kb++) {
        int64_t j0 = kb * L3D_FA_BK, nk = a->nk - j0 < L3D_FA_BK ? a->nk - j0 : L3D_FA_BK;
        /* the first query block with a row that sees key j0 */
        int64_t qb0 = j0 > a->p0 ? (j0 - a->p0) / L3D_FA_BQ : 0;
        for (int64_t r = 0; r < a->rep; r++) {
            const float *qh = a->q + r * a->hq, *dOh = a->dO + r * a->ho, *Oh = a->O + r * a->ho;
            const float *Lh = a->L + r * a->hl;
            float *dqh = a->dq + r * a->hq;
            for (int64_t qb = qb0; qb < nqb; qb++) {
                int64_t i0 = qb * L3D_FA_BQ, nq = a->nq - i0 < L3D_FA_BQ ? a->nq - i0 : L3D_FA_BQ;
                sgemm('N', 'T', nq, nk, HS, scale, qh + i0 * qs, qs, a->k + j0 * ks, ks, 0.0f, P,
                      L3D_FA_BK);
                sgemm('N', 'T', nq, nk, HS, 1.0f, dOh + i0 * os, os, a->v + j0 * ks, ks, 0.0f, dS,
                      L3D_FA_BK);
                for (int64_t i = 0; i < nq; i++) {
                    const float *o = Oh + (i0 + i) * os, *g = dOh + (i0 + i) * os;
                    float d = 0.0f;
#pragma omp simd reduction(+ : d)
                    for (int64_t c = 0; c < HS; c++) d += o[c] * g[c];
                    D[i] = d;
                }
                for (int64_t i = 0; i < nq; i++) {
                    float *p = P + i * L3D_FA_BK, *ds = dS + i * L3D_FA_BK;
                    float Li = Lh[i0 + i], Di = D[i];
                    int64_t valid = a->p0 + i0 + i - j0 + 1;
                    valid = valid > nk ? nk : (valid < 0 ? 0 : valid);
#pragma omp simd
                    for (int64_t j = 0; j < valid; j++) {
                        p[j] = fast_expf(p[j] - Li);
                        ds[j] = p[j] * (ds[j] - Di) * scale;
                    }
                    if (a->p16) fa_round16(p, ds, valid);
                    for (int64_t j = valid; j < nk; j++) p[j] = ds[j] = 0.0f;
                }
                sgemm('T', 'N', nk, HS, nq, 1.0f, P, L3D_FA_BK, dOh + i0 * os, os, 1.0f,
                      a->dv + j0 * a->gks, a->gks);
                sgemm('N', 'N', nq, HS, nk, 1.0f, dS, L3D_FA_BK, a->k + j0 * ks, ks, 1.0f,
                      dqh + i0 * a->gqs, a->gqs);
                sgemm('T', 'N', nk, HS, nq, 1.0f, dS, L3D_FA_BK, qh + i0 * qs, qs, 1.0f,
                      a->dk + j0 * a->gks, a->gks);
            }
        }
    }
}

/* One (batch, KV head) of the backward pass over one causal sequence of T rows: dq, dk, dv (stride
 * gs) +=, from q, k, v (stride qs), dO, O (stride os) and L, the rep query heads at q + r hq,
 * dO + r ho, L + r T (fa_backward_span with p0 = 0). */
static void fa_backward_group(float *dq, float *dk, float *dv, int64_t gs, const float *q,
                              const float *k, const float *v, int64_t qs, int64_t hq,
                              const float *dO, const float *O, int64_t os, int64_t ho,
                              const float *L, int64_t rep, int64_t T, int64_t HS, float *P,
                              float *dS, float *D) {
    const struct fa_span a = {.dq = dq, .dk = dk, .dv = dv, .q = q, .k = k, .v = v, .dO = dO,
                              .O = O, .L = L, .gqs = gs, .gks = gs, .qs = qs, .ks = qs, .os = os,
                              .hq = hq, .ho = ho, .hl = T, .rep = rep, .p0 = 0, .nq = T, .nk = T,
                              .HS = HS};
    fa_backward_span(&a, P, dS, D);
}

/* 16-bit: one group widened into the thread's fp32 scratch f ((4 rep + 4) T HS floats): its
 * query heads, key, value, their gradients, dO and O; the gradients rounded back once. */
static void fa_backward_group_16(enum l3d_dtype dt, float *f, void *dqkv, const void *qkv,
                                 const void *dO, const void *O, const float *L, int64_t NH,
                                 int64_t NKV, int64_t g, int64_t T, int64_t HS, float *P,
                                 float *dS, float *D) {
    const int64_t rep = NH / NKV, TH = T * HS, CQ = (NH + 2 * NKV) * HS, C = NH * HS;
    float *q = f, *k = q + rep * TH, *v = k + TH, *dq = v + TH, *dk = dq + rep * TH;
    float *dv = dk + TH, *fo = dv + TH, *fO = fo + rep * TH;
    /* element offsets in a qkv row of the group's query heads, key head and value head */
    const int64_t oq = g * rep * HS, ok = (NH + g) * HS, ov = (NH + NKV + g) * HS;
    for (int64_t r = 0; r < rep; r++) {
        rows_to_f32(dt, q + r * TH, HS, at(dt, qkv, oq + r * HS), CQ, T, HS);
        rows_to_f32(dt, dq + r * TH, HS, at(dt, dqkv, oq + r * HS), CQ, T, HS);
        rows_to_f32(dt, fo + r * TH, HS, at(dt, dO, oq + r * HS), C, T, HS);
        rows_to_f32(dt, fO + r * TH, HS, at(dt, O, oq + r * HS), C, T, HS);
    }
    rows_to_f32(dt, k, HS, at(dt, qkv, ok), CQ, T, HS);
    rows_to_f32(dt, v, HS, at(dt, qkv, ov), CQ, T, HS);
    rows_to_f32(dt, dk, HS, at(dt, dqkv, ok), CQ, T, HS);
    rows_to_f32(dt, dv, HS, at(dt, dqkv, ov), CQ, T, HS);
    fa_backward_group(dq, dk, dv, HS, q, k, v, HS, TH, fo, fO, HS, TH, L, rep, T, HS, P, dS, D);
    for (int64_t r = 0; r < rep; r++)
        rows_from_f32(dt, at(dt, dqkv, oq + r * HS), CQ, dq + r * TH, HS, T, HS);
    rows_from_f32(dt, at(dt, dqkv, ok), CQ, dk, HS, T, HS);
    rows_from_f32(dt, at(dt, dqkv, ov), CQ, dv, HS, T, HS);
}

/* bf16 dot products: one group of one sequence in place (l3d_fa16_backward_span, p0 = 0) */
static void fa16_group(void *dqkv, const void *qkv, const void *dO, const void *O,
                       const float *L, int64_t NH, int64_t NKV, int64_t g, int64_t T, int64_t HS,
                       float *f) {
    const int64_t rep = NH / NKV, CQ = (NH + 2 * NKV) * HS, C = NH * HS;
    const int64_t oq = g * rep * HS, ok = (NH + g) * HS, ov = (NH + NKV + g) * HS;
    const uint16_t *x = qkv, *gO = dO, *pO = O;
    uint16_t *dx = dqkv;
    const struct l3d_fa16_span a = {
        .dq = dx + oq, .dk = dx + ok, .dv = dx + ov, .q = x + oq, .k = x + ok, .v = x + ov,
        .dO = gO + oq, .O = pO + oq, .L = L, .gqs = CQ, .gks = CQ, .qs = CQ, .ks = CQ, .os = C,
        .hq = HS, .ho = HS, .hl = T, .rep = rep, .p0 = 0, .nq = T, .nk = T, .HS = HS};
    l3d_fa16_backward_span(&a, f);
}

// dqkv (B,T,NH+2*NKV,HS) +=, dout (B,T,NH,HS), qkv, out (B,T,NH,HS), lse (B,NH,T)
static void cpu_attention_backward(void *ctx, enum l3d_dtype dt, void *dqkv, const void *dout,
                                   const void *qkv, const void *out, const float *lse, int64_t B,
                                   int64_t T, int64_t NH, int64_t NKV, int64_t HS) {
    struct cpu_ctx *cx = ctx;
    F32_OR_16("attention_backward");
    gqa_check("attention_backward", NH, NKV);
    if (l3d_attnd_on(cx->attnd, dt)) { /* oneDNN's bf16 matmuls (AMX) */
        l3d_attnd_backward(cx->attnd, dqkv, dout, qkv, out, lse, B, T, NH, NKV, HS);
        return;
    }
    const int64_t C = NH * HS, CQ = (NH + 2 * NKV) * HS, rep = NH / NKV;
    const bool dot = l3d_fa16_on(dt, HS);
    const int64_t per = dot ? l3d_fa16_backward_floats(rep, T, T, HS)
                            : is16(dt) ? (4 * rep + 4) * T * HS : 0;
    float *scr = per ? thread_scratch(cx, per, "attention fp32 scratch") : NULL;
    /* One task per (batch, KV head) owns the dQ of its query heads and its dK and dV: race-free
     * without atomics or partial sums (FlashAttention-2 parallelises dK/dV over key blocks and
     * adds dQ atomically, which is not deterministic). */
#pragma omp parallel
    {
        _Alignas(64) float P[L3D_FA_BQ * L3D_FA_BK];
        _Alignas(64) float dS[L3D_FA_BQ * L3D_FA_BK];
        float D[L3D_FA_BQ];
        float *f = off(scr, omp_get_thread_num() * per);
#pragma omp for schedule(static)
        for (int64_t bg = 0; bg < B * NKV; bg++) {
            int64_t b = bg / NKV, g = bg % NKV;
            const void *row = at(dt, qkv, b * T * CQ), *dO = at(dt, dout, b * T * C);
            const void *O = at(dt, out, b * T * C);
            void *drow = at(dt, dqkv, b * T * CQ);
            const float *L = lse + (b * NH + g * rep) * T;
            if (dot) {
                fa16_group(drow, row, dO, O, L, NH, NKV, g, T, HS, f);
                continue;
            }
            if (is16(dt)) {
                fa_backward_group_16(dt, f, drow, row, dO, O, L, NH, NKV, g, T, HS, P, dS, D);
                continue;
            }
            const int64_t oq = g * rep * HS, ok = (NH + g) * HS, ov = (NH + NKV + g) * HS;
            fa_backward_group(at(dt, drow, oq), at(dt, drow, ok), at(dt, drow, ov), CQ,
                              at(dt, row, oq), at(dt, row, ok), at(dt, row, ov), CQ, HS,
                              at(dt, dO, oq), at(dt, O, oq), C, HS, L, rep, T, HS, P, dS, D);
        }
    }
}

/* ---- block attention (context parallelism) ----------------------------------------------
 *
 * The ring's kernels (include/llm3d/backend.h, l3d_attn_block): the flash kernel's forward block
 * and backward body on one (query chunk, key chunk) pair at absolute positions, p0 = q_pos - k_pos
 * the offset of the first query row into the key chunk (0: the diagonal chunk, causal; >= nk: a
 * chunk entirely before, unmasked). Grouped-query heads: query head h reads key/value head
 * h / (NH / NKV). 16-bit tensors are widened into per-thread fp32 scratch and rounded back once,
 * as in cpu_attention_forward / backward. On bf16 attention's numerics (block_p16: bf16 tensors
 * where cpu_attnd.c runs the full sequence's attention, or g->p16, the fp32 ring of a bf16 model)
 * P and dS are rounded to bf16 as that path rounds them, so a split of a sequence into blocks
 * gives the full path's result up to the order of fp32 sums. */

static bool block_p16(const struct cpu_ctx *cx, enum l3d_dtype dt, const struct l3d_attn_block *g) {
    return g->p16 || l3d_attnd_on(cx->attnd, dt);
}

struct fa_tile {
    _Alignas(64) float P[L3D_FA_BQ * L3D_FA_BK];
    _Alignas(64) float dS[L3D_FA_BQ * L3D_FA_BK];
    float D[L3D_FA_BQ];
};

/* tasks (b, h, query block), the longest rows first, one at a time, as cpu_attention_forward */
static void cpu_attention_block_forward(void *ctx, enum l3d_dtype dt, void *out, float *lse,
                                        const void *q, const void *k, const void *v,
                                        const struct l3d_attn_block *g) {
    struct cpu_ctx *cx = ctx;
    F32_OR_16("attention_block_forward");
    const int64_t HS = g->HS, grp = g->NH / g->NKV, p0 = g->q_pos - g->k_pos;
    const int64_t nb = (g->nq + L3D_FA_BQ - 1) / L3D_FA_BQ, BH = g->B * g->NH;
    const bool p16 = block_p16(cx, dt, g), dot = l3d_fa16_on(dt, HS);
    const int64_t per = fa_scratch(dt, g->nk, HS);
    float *scr = per ? thread_scratch(cx, per, "attention fp32 scratch") : NULL;
#pragma omp parallel
    {
        struct fa_tile w; /* the score block in w.P */
        float *f = off(scr, omp_get_thread_num() * per);
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < BH * nb; task++) {
            int64_t bh = task % BH, i0 = (nb - 1 - task / BH) * L3D_FA_BQ;
            int64_t b = bh / g->NH, h = bh % g->NH, kvh = h / grp;
            int64_t nq = g->nq - i0 < L3D_FA_BQ ? g->nq - i0 : L3D_FA_BQ;
            int64_t nkeys = p0 + i0 + nq < g->nk ? p0 + i0 + nq : g->nk;
            const void *qp = at(dt, q, b * g->q_bs + i0 * g->q_rs + h * HS);
            const void *kp = at(dt, k, b * g->kv_bs + kvh * HS);
            const void *vp = at(dt, v, b * g->kv_bs + kvh * HS);
            void *op = at(dt, out, b * g->o_bs + i0 * g->o_rs + h * HS);
            float *lp = lse + b * g->lse_bs + h * g->lse_hs + i0;
            if (dt == L3D_F32) {
                fa_forward_block_n(op, g->o_rs, lp, qp, g->q_rs, kp, vp, g->kv_rs, p0 + i0, nq,
                                   nkeys, HS, w.P, p16);
                continue;
            }
            if (dot) {
                l3d_fa16_forward_block(op, g->o_rs, lp, qp, g->q_rs, kp, vp, g->kv_rs, p0 + i0, nq,
                                       nkeys, HS, f);
                continue;
            }
            float *qf = f, *of = qf + L3D_FA_BQ * HS, *kf = of + L3D_FA_BQ * HS;
            float *vf = kf + nkeys * HS;
            rows_to_f32(dt, qf, HS, qp, g->q_rs, nq, HS);
            rows_to_f32(dt, kf, HS, kp, g->kv_rs, nkeys, HS);
            rows_to_f32(dt, vf, HS, vp, g->kv_rs, nkeys, HS);
            fa_forward_block_n(of, HS, lp, qf, HS, kf, vf, HS, p0 + i0, nq, nkeys, HS, w.P, p16);
            rows_from_f32(dt, op, g->o_rs, of, HS, nq, HS);
        }
    }
}

/* row by row: the two log-sum-exps combined in fp32 (expf / logf, not the fast exponential: the
 * merge is not a hot loop), the outputs reweighted */
static void cpu_attention_merge(void *ctx, enum l3d_dtype dt, void *out, float *lse,
                                const void *out2, const float *lse2,
                                const struct l3d_attn_block *g) {
    (void)ctx;
    F32_OR_16("attention_merge");
    const int64_t HS = g->HS, rows = g->B * g->NH * g->nq;
#pragma omp parallel
    {
        float a[L3D_BLK], c[L3D_BLK];
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            int64_t b = r / (g->NH * g->nq), h = r / g->nq % g->NH, i = r % g->nq;
            float *L = lse + b * g->lse_bs + h * g->lse_hs + i;
            float L2 = lse2[b * g->lse_bs + h * g->lse_hs + i], L1 = *L;
            if (L2 == -INFINITY) continue;
            float mx = L1 > L2 ? L1 : L2, w1 = expf(L1 - mx), w2 = expf(L2 - mx), sum = w1 + w2;
            *L = mx + logf(sum);
            w1 /= sum;
            w2 /= sum;
            int64_t o = b * g->o_bs + i * g->o_rs + h * HS;
            for (int64_t d0 = 0; d0 < HS; d0 += L3D_BLK) {
                int64_t n = HS - d0 < L3D_BLK ? HS - d0 : L3D_BLK;
                float *x = row_io(dt, a, at(dt, out, o + d0), n);
                const float *y = row_in(dt, c, at(dt, out2, o + d0), n);
#pragma omp simd
                for (int64_t d = 0; d < n; d++) x[d] = w1 * x[d] + w2 * y[d];
                row_done(dt, at(dt, out, o + d0), x, n);
            }
        }
    }
}

/* bf16 dot products: the block's span in place (l3d_fa16_backward_span), a's geometry */
static void fa16_block_span(const struct fa_span *a, const struct l3d_attn_block *g, void *dq,
                            void *dk, void *dv, const void *dout, const void *q, const void *k,
                            const void *v, const void *out, int64_t qo, int64_t kvo, int64_t oo,
                            float *f) {
    const uint16_t *q16 = q, *k16 = k, *v16 = v, *g16 = dout, *o16 = out;
    uint16_t *dq16 = dq, *dk16 = dk, *dv16 = dv;
    const struct l3d_fa16_span s = {
        .dq = dq16 + qo, .dk = dk16 + kvo, .dv = dv16 + kvo, .q = q16 + qo, .k = k16 + kvo,
        .v = v16 + kvo, .dO = g16 + oo, .O = o16 + oo, .L = a->L, .gqs = g->q_rs,
        .gks = g->kv_rs, .qs = g->q_rs, .ks = g->kv_rs, .os = g->o_rs, .hq = g->HS,
        .ho = g->HS, .hl = a->hl, .rep = a->rep, .p0 = a->p0, .nq = a->nq, .nk = a->nk,
        .HS = g->HS};
    l3d_fa16_backward_span(&s, f);
}

/* One task per (batch, key/value head) owns its dk and dv and the dq of the query heads it
 * serves (race-free, deterministic, as cpu_attention_backward), one fa_backward_span. 16-bit: the
 * key/value head, its query heads and their gradients widened into the thread's scratch, rounded
 * back once. */
static void cpu_attention_block_backward(void *ctx, enum l3d_dtype dt, void *dq, void *dk,
                                         void *dv, const void *dout, const void *q,
                                         const void *k, const void *v, const void *out,
                                         const float *lse, const struct l3d_attn_block *g) {
    struct cpu_ctx *cx = ctx;
    F32_OR_16("attention_block_backward");
    const int64_t HS = g->HS, rep = g->NH / g->NKV, KH = g->nk * HS, QH = g->nq * HS;
    const bool p16 = block_p16(cx, dt, g), dot = l3d_fa16_on(dt, HS);
    const int64_t per = dot ? l3d_fa16_backward_floats(rep, g->nq, g->nk, HS)
                            : is16(dt) ? 4 * KH + 4 * rep * QH : 0;
    float *scr = per ? thread_scratch(cx, per, "attention fp32 scratch") : NULL;
#pragma omp parallel
    {
        struct fa_tile w; /* this thread's score block, its gradient, the rows' D */
        float *f = off(scr, omp_get_thread_num() * per);
#pragma omp for schedule(static)
        for (int64_t bg = 0; bg < g->B * g->NKV; bg++) {
            int64_t b = bg / g->NKV, kvh = bg % g->NKV, kvo = b * g->kv_bs + kvh * HS;
            int64_t qo = b * g->q_bs + kvh * rep * HS, oo = b * g->o_bs + kvh * rep * HS;
            const float *L = lse + b * g->lse_bs + kvh * rep * g->lse_hs;
            struct fa_span a = {.L = L, .hl = g->lse_hs, .rep = rep, .p0 = g->q_pos - g->k_pos,
                                .nq = g->nq, .nk = g->nk, .HS = HS, .p16 = p16};
            if (dt == L3D_F32) {
                a.dq = at(dt, dq, qo), a.dk = at(dt, dk, kvo), a.dv = at(dt, dv, kvo);
                a.q = at(dt, q, qo), a.k = at(dt, k, kvo), a.v = at(dt, v, kvo);
                a.dO = at(dt, dout, oo), a.O = at(dt, out, oo);
                a.gqs = a.qs = g->q_rs, a.gks = a.ks = g->kv_rs, a.os = g->o_rs;
                a.hq = a.ho = HS;
                fa_backward_span(&a, w.P, w.dS, w.D);
                continue;
            }
            if (dot) {
                fa16_block_span(&a, g, dq, dk, dv, dout, q, k, v, out, qo, kvo, oo, f);
                continue;
            }
            /* 16-bit: k v dk dv (nk rows each), then q dq dO O (rep heads of nq rows each) */
            float *kf = f, *vf = kf + KH, *dkf = vf + KH, *dvf = dkf + KH, *qf = dvf + KH;
            float *dqf = qf + rep * QH, *gf = dqf + rep * QH, *Of = gf + rep * QH;
            rows_to_f32(dt, kf, HS, at(dt, k, kvo), g->kv_rs, g->nk, HS);
            rows_to_f32(dt, vf, HS, at(dt, v, kvo), g->kv_rs, g->nk, HS);
            rows_to_f32(dt, dkf, HS, at(dt, dk, kvo), g->kv_rs, g->nk, HS);
            rows_to_f32(dt, dvf, HS, at(dt, dv, kvo), g->kv_rs, g->nk, HS);
            for (int64_t r = 0; r < rep; r++) {
                rows_to_f32(dt, qf + r * QH, HS, at(dt, q, qo + r * HS), g->q_rs, g->nq, HS);
                rows_to_f32(dt, dqf + r * QH, HS, at(dt, dq, qo + r * HS), g->q_rs, g->nq, HS);
                rows_to_f32(dt, gf + r * QH, HS, at(dt, dout, oo + r * HS), g->o_rs, g->nq, HS);
                rows_to_f32(dt, Of + r * QH, HS, at(dt, out, oo + r * HS), g->o_rs, g->nq, HS);
            }
            a.dq = dqf, a.dk = dkf, a.dv = dvf, a.q = qf, a.k = kf, a.v = vf, a.dO = gf, a.O = Of;
            a.gqs = a.qs = a.gks = a.ks = a.os = HS;
            a.hq = a.ho = QH;
            fa_backward_span(&a, w.P, w.dS, w.D);
            for (int64_t r = 0; r < rep; r++)
                rows_from_f32(dt, at(dt, dq, qo + r * HS), g->q_rs, dqf + r * QH, HS, g->nq, HS);
            rows_from_f32(dt, at(dt, dk, kvo), g->kv_rs, dkf, HS, g->nk, HS);
            rows_from_f32(dt, at(dt, dv, kvo), g->kv_rs, dvf, HS, g->nk, HS);
        }
    }
}

/* ---- attention -------------------------------------------------------------------------- */

/* The materialising kernel pair, kept as the oracle the tiled kernel is benchmarked against
 * (L3D_ATTENTION=naive): per (batch, head), S = Q K^T / sqrt(HS) by sgemm, causal softmax row by
 * row, out = P V by sgemm. The (b, h) pairs are spread over threads; oneDNN runs single-threaded
 * inside the region. The whole T x T product is computed and the upper triangle zeroed: O(T^2)
 * memory. */
// out (B,T,NH,HS), att (B,NH,T,T), qkv (B,T,NH+2*NKV,HS)
static void attention_naive_forward_f32(void *ctx, float *out, float *att, const float *qkv,
                                        int64_t B, int64_t T, int64_t NH, int64_t NKV,
                                        int64_t HS) {
    (void)ctx;
    const int64_t C = NH * HS, CQ = (NH + 2 * NKV) * HS, rep = NH / NKV;
    const float scale = 1.0f / sqrtf((float)HS);
#pragma omp parallel for schedule(static)
    for (int64_t bh = 0; bh < B * NH; bh++) {
        int64_t b = bh / NH, h = bh % NH, g = h / rep;
        const float *row = qkv + b * T * CQ;
        const float *q = row + h * HS, *k = row + (NH + g) * HS, *v = row + (NH + NKV + g) * HS;
        float *a = att + bh * T * T;
        sgemm('N', 'T', T, T, HS, scale, q, CQ, k, CQ, 0.0f, a, T);
        for (int64_t t = 0; t < T; t++) {
            float *r = a + t * T;
            float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
            for (int64_t j = 0; j <= t; j++) mx = r[j] > mx ? r[j] : mx;
            float s = 0.0f;
#pragma omp simd reduction(+ : s)
            for (int64_t j = 0; j <= t; j++) {
                r[j] = fast_expf(r[j] - mx);
                s += r[j];
            }
            float inv = 1.0f / s;
#pragma omp simd
            for (int64_t j = 0; j <= t; j++) r[j] *= inv;
            for (int64_t j = t + 1; j < T; j++) r[j] = 0.0f;
        }
        sgemm('N', 'N', T, HS, T, 1.0f, a, T, v, CQ, 0.0f, out + b * T * C + h * HS, C);
    }
}

/* Tasks (batch, KV head): the group's query heads in order add into the shared dK and dV. */
// dqkv (B,T,NH+2*NKV,HS), datt (B,NH,T,T) scratch, dout (B,T,NH,HS), qkv, att (B,NH,T,T)
static void attention_naive_backward_f32(void *ctx, float *dqkv, float *datt, const float *dout,
                                         const float *qkv, const float *att, int64_t B, int64_t T,
                                         int64_t NH, int64_t NKV, int64_t HS) {
    (void)ctx;
    const int64_t C = NH * HS, CQ = (NH + 2 * NKV) * HS, rep = NH / NKV;
    const float scale = 1.0f / sqrtf((float)HS);
#pragma omp parallel for schedule(static)
    for (int64_t bg = 0; bg < B * NKV; bg++) {
        int64_t b = bg / NKV, g = bg % NKV;
        const float *row = qkv + b * T * CQ;
        const float *k = row + (NH + g) * HS, *v = row + (NH + NKV + g) * HS;
        float *drow = dqkv + b * T * CQ;
        float *dk = drow + (NH + g) * HS, *dv = drow + (NH + NKV + g) * HS;
        for (int64_t h = g * rep; h < (g + 1) * rep; h++) {
            const float *q = row + h * HS, *a = att + (b * NH + h) * T * T;
            const float *dO = dout + b * T * C + h * HS;
            float *dq = drow + h * HS, *da = datt + (b * NH + h) * T * T;
            sgemm('N', 'T', T, T, HS, 1.0f, dO, C, v, CQ, 0.0f, da, T); /* dP = dO V^T */
            sgemm('T', 'N', T, HS, T, 1.0f, a, T, dO, C, 1.0f, dv, CQ); /* dV += P^T dO */
            for (int64_t t = 0; t < T; t++) { /* dS = P (dP - rowsum(P dP)) */
                const float *p = a + t * T;
                float *d = da + t * T;
                float s = 0.0f;
#pragma omp simd reduction(+ : s)
                for (int64_t j = 0; j <= t; j++) s += p[j] * d[j];
#pragma omp simd
                for (int64_t j = 0; j <= t; j++) d[j] = p[j] * (d[j] - s) * scale;
                for (int64_t j = t + 1; j < T; j++) d[j] = 0.0f;
            }
            sgemm('N', 'N', T, HS, T, 1.0f, da, T, k, CQ, 1.0f, dq, CQ); /* dQ += dS K */
            sgemm('T', 'N', T, HS, T, 1.0f, da, T, q, CQ, 1.0f, dk, CQ); /* dK += dS^T Q */
        }
    }
}

/* ---- GELU, residual --------------------------------------------------------------------- */

/* GELU, tanh form (Hendrycks & Gimpel 2016): each thread its static chunk of the N elements
 * through cpu_ew.c's rows, in AVX-512 / AVX2 where the CPU has them (the same bits on every
 * path), 16-bit elements widened and rounded in registers. dy NULL: y = gelu(x); else
 * y += gelu'(x) dy. */
static void gelu_par(enum l3d_dtype dt, void *y, const void *x, const void *dy, int64_t N) {
    const enum l3d_simd isa = l3d_cpu_simd();
#pragma omp parallel
    {
        int64_t lo, hi;
        chunk(N, omp_get_thread_num(), omp_get_num_threads(), &lo, &hi);
        if (hi > lo)
            l3d_cpu_gelu_rows(isa, dt, at(dt, y, lo), at(dt, x, lo), dy ? at(dt, dy, lo) : NULL,
                              hi - lo);
    }
}

/* Elementwise y (N) = a + b (y may be a: add_inplace). */
static inline void ew_add(float *y, const float *a, const float *b, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) y[i] = a[i] + b[i];
}

/* Each thread its static chunk of the N elements: fp32 in place, 16-bit in blocks of L3D_BLK
 * widened on the stack, each output rounded once. y may be a (add_inplace). */
static void ew(enum l3d_dtype dt, void *y, const void *a, const void *b, int64_t N) {
#pragma omp parallel
    {
        const struct span sp = thread_span(dt, N);
        for (int64_t i0 = sp.lo; i0 < sp.hi; i0 += sp.bl) {
            int64_t n = span_len(sp, i0);
            float yb[L3D_BLK], ab[L3D_BLK], bb[L3D_BLK];
            void *yp = at(dt, y, i0);
            float *yf = row_out(dt, yb, yp);
            ew_add(yf, row_in(dt, ab, at(dt, a, i0), n), row_in(dt, bb, at(dt, b, i0), n), n);
            row_done(dt, yp, yf, n);
        }
    }
}

static void cpu_gelu_forward(void *ctx, enum l3d_dtype dt, void *out, const void *inp,
                             int64_t N) {
    (void)ctx;
    F32_OR_16("gelu_forward");
    gelu_par(dt, out, inp, NULL, N);
}
static void cpu_gelu_backward(void *ctx, enum l3d_dtype dt, void *dinp, const void *dout,
                              const void *inp, int64_t N) {
    (void)ctx;
    F32_OR_16("gelu_backward");
    gelu_par(dt, dinp, inp, dout, N);
}
static void cpu_residual_forward(void *ctx, enum l3d_dtype dt, void *out, const void *a,
                                 const void *b, int64_t N) {
    (void)ctx;
    F32_OR_16("residual_forward");
    ew(dt, out, a, b, N);
}
static void cpu_add_inplace(void *ctx, enum l3d_dtype dt, void *dst, const void *src, int64_t N) {
    (void)ctx;
    F32_OR_16("add_inplace");
    ew(dt, dst, dst, src, N);
}

// out (N,C) += bias (C) on every row
static void cpu_add_bias(void *ctx, enum l3d_dtype dt, void *out, const void *bias, int64_t N,
                         int64_t C) {
    (void)ctx;
    F32_OR_16("add_bias");
    const int64_t bl = span_blk(dt, C);
#pragma omp parallel for schedule(static) if (N * C > (1 << 14))
    for (int64_t r = 0; r < N; r++) {
        for (int64_t c0 = 0; c0 < C; c0 += bl) {
            int64_t n = C - c0 < bl ? C - c0 : bl;
            float ob[L3D_BLK], bb[L3D_BLK];
            void *op = at(dt, out, r * C + c0);
            float *o = row_io(dt, ob, op, n);
            vadd(o, row_in(dt, bb, at(dt, bias, c0), n), n);
            row_done(dt, op, o, n);
        }
    }
}

/* ---- RMSNorm, rotary positions, SwiGLU (the Llama blocks) ------------------------------ */

// out (N,C), rstd (N) fp32, inp (N,C), weight (C)
static void cpu_rmsnorm_forward(void *ctx, enum l3d_dtype dt, void *out, float *rstd,
                                const void *inp, const void *weight, int64_t N, int64_t C,
                                float eps) {
    struct cpu_ctx *cx = ctx;
    F32_OR_16("rmsnorm_forward");
    const float *wf = param_f32(cx, SCR_PARAM_W, dt, weight, C);
    norm_forward_rows(cx, dt, out, NULL, rstd, inp, wf, NULL, N, C, eps, NULL, NULL);
}

/* res (N,C) = a + b, then out (N,C) = LayerNorm(res) (mean not NULL; weight, bias) or
 * RMSNorm(res) (mean NULL; weight, eps): the residual add and the next norm in one pass, the
 * same bits as residual_forward then the norm. */
static void cpu_residual_norm_forward(void *ctx, enum l3d_dtype dt, void *res, void *out,
                                      float *mean, float *rstd, const void *a, const void *b,
                                      const void *weight, const void *bias, int64_t N, int64_t C,
                                      float eps) {
    struct cpu_ctx *cx = ctx;
    F32_OR_16("residual_norm_forward");
    const float *wf = param_f32(cx, SCR_PARAM_W, dt, weight, C);
    const float *bf = mean ? param_f32(cx, SCR_PARAM_B, dt, bias, C) : NULL;
    norm_forward_rows(cx, dt, out, mean, rstd, a, wf, bf, N, C, mean ? L3D_LN_EPS : eps, res, b);
}

// dinp (N,C), dweight (C), dout (N,C), inp (N,C), weight (C), rstd (N)
static void cpu_rmsnorm_backward(void *ctx, enum l3d_dtype dt, enum l3d_dtype gdt, void *dinp,
                                 void *dweight, const void *dout, const void *inp,
                                 const void *weight, const float *rstd, int64_t N, int64_t C) {
    struct cpu_ctx *cx = ctx;
    norm_backward(cx, dt, gdt, dinp, dweight, NULL, dout, inp, weight, NULL, rstd, N, C,
                  "rmsnorm_backward");
}

/* Rotary position embedding (Su et al. 2021, "RoFormer", eq. 34) in Hugging Face's rotate-half
 * form: in each query and key head, dimension i pairs with i + HS/2 and the pair turns by the
 * angle pos[t] inv_freq[i]. Backward turns the gradient back (the transpose of a rotation is its
 * inverse): sign -1. The angles are formed and their cosines and sines taken in double, then
 * rounded once, a table of T x HS/2 pairs shared by every sequence and head (Hugging Face forms
 * the angle in fp32, which at position 10^5 is off by ~4e-3 rad; the table is the exact angle's
 * rounding). The rows are then rotated in place, each thread its rows (no reduction: the same
 * bits for any thread count); the value heads are not touched. */

/* The cos/sin table of (inv_freq, pos): T rows of H2 cosines then H2 sines. Kept in the
 * backend and made again only when the values differ from the last table's (compared, not the
 * pointers: every layer's forward and backward of a step share one table; the KV cache's
 * positions move each step). Forward and backward share it: the sign is applied by the caller. */
static const float *rope_table(struct cpu_ctx *cx, const float *inv_freq, const int32_t *pos,
                               int64_t T, int64_t H2) {
    struct rope_key *k = &cx->rope;
    if (k->T == T && k->H2 == H2 && memcmp(k->inv_freq, inv_freq, (size_t)H2 * 4) == 0 &&
        memcmp(k->pos, pos, (size_t)T * 4) == 0)
        return cx->scr[SCR_ROPE].p;
    size_t nt = (size_t)(2 * T * H2) * sizeof(float);
    float *tab = scratch(cx, SCR_ROPE, nt + (size_t)(H2 + T) * 4, "rope cos/sin table");
    *k = (struct rope_key){T, H2, (float *)((char *)tab + nt), (int32_t *)((char *)tab + nt) + H2};
    memcpy(k->inv_freq, inv_freq, (size_t)H2 * 4);
    memcpy(k->pos, pos, (size_t)T * 4);
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < H2; i++) {
            double a = (double)pos[t] * (double)inv_freq[i];
            tab[(2 * t) * H2 + i] = (float)cos(a);
            tab[(2 * t + 1) * H2 + i] = (float)sin(a);
        }
    return tab;
}

static void rope_apply(struct cpu_ctx *cx, enum l3d_dtype dt, void *qkv, const float *inv_freq,
                       const int32_t *pos, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                       int64_t HS, float sign, const char *kernel) {
    F32_OR_16(kernel);
    gqa_check(kernel, NH, NKV);
    if (HS % 2 != 0)
        l3d_fatal(__FILE__, __LINE__, "backend cpu: %s: head size %lld is odd (rotary pairs "
                  "need an even one)", kernel, (long long)HS);
    const int64_t H2 = HS / 2, CQ = (NH + 2 * NKV) * HS, CR = (NH + NKV) * HS;
    float *scr = is16(dt) ? thread_scratch(cx, CR, "rope scratch") : NULL;
    const float *tab = rope_table(cx, inv_freq, pos, T, H2);
#pragma omp parallel
    {
        float *buf = off(scr, omp_get_thread_num() * CR);
#pragma omp for schedule(static)
        for (int64_t bt = 0; bt < B * T; bt++) {
            const float *cs = tab + 2 * (bt % T) * H2, *sn = cs + H2;
            void *rp = at(dt, qkv, bt * CQ);
            float *x = row_io(dt, buf, rp, CR);
            for (int64_t h = 0; h < NH + NKV; h++) {
                float *lo = x + h * HS, *hi = lo + H2;
#pragma omp simd
                for (int64_t i = 0; i < H2; i++) {
                    float a = lo[i], b = hi[i], s = sign * sn[i]; /* exact: sign is +-1 */
                    lo[i] = a * cs[i] - b * s;
                    hi[i] = b * cs[i] + a * s;
                }
            }
            row_done(dt, rp, x, CR);
        }
    }
}

// qkv (B,T,NH+2*NKV,HS) in place, inv_freq (HS/2), pos (T)
static void cpu_rope_forward(void *ctx, enum l3d_dtype dt, void *qkv, const float *inv_freq,
                             const int32_t *pos, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                             int64_t HS) {
    rope_apply(ctx, dt, qkv, inv_freq, pos, B, T, NH, NKV, HS, 1.0f, "rope_forward");
}
// dqkv (B,T,NH+2*NKV,HS) in place
static void cpu_rope_backward(void *ctx, enum l3d_dtype dt, void *dqkv, const float *inv_freq,
                              const int32_t *pos, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                              int64_t HS) {
    rope_apply(ctx, dt, dqkv, inv_freq, pos, B, T, NH, NKV, HS, -1.0f, "rope_backward");
}

/* SwiGLU (Shazeer 2020, "GLU Variants Improve Transformer", eq. 5 with Swish_1 = SiLU):
 * out = silu(g) u, silu(g) = g sigmoid(g); d/dg = u sigmoid(g) (1 + g (1 - sigmoid(g))),
 * d/du = silu(g). sigmoid through the branch-free exp (its clamp keeps 1 + e^-g finite). */
static inline float sigmoid_f(float g) { return 1.0f / (1.0f + fast_expf(-g)); }

/* Columns [c0, c0+n) of one row: the gate g and up u halves, out o =, or dg, du += from d. */
static inline void swiglu_cols(float *o, float *dg, float *du, const float *d, const float *g,
                               const float *u, int64_t n) {
    if (o) {
#pragma omp simd
        for (int64_t i = 0; i < n; i++) o[i] = g[i] * sigmoid_f(g[i]) * u[i];
        return;
    }
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        float s = sigmoid_f(g[i]);
        dg[i] += d[i] * u[i] * s * (1.0f + g[i] * (1.0f - s));
        du[i] += d[i] * g[i] * s;
    }
}

/* Tasks (row, column block) over threads: fp32 whole rows in place, 16-bit blocks of L3D_BLK
 * widened on the stack, each output rounded once. Forward when out is not NULL, else backward
 * into dinp (N,2H) from dout (N,H). */
static void swiglu_rows(enum l3d_dtype dt, void *out, void *dinp, const void *dout,
                        const void *inp, int64_t N, int64_t H) {
    const int64_t bl = span_blk(dt, H), nb = (H + bl - 1) / bl;
    const enum l3d_simd isa = l3d_cpu_simd();
    /* 16-bit rows in AVX-512 where the CPU has it (cpu_ew.c: widened in registers, no stack
     * copies); fp32 keeps the portable rows' bits */
    const bool v512 = is16(dt) && isa >= L3D_SIMD_AVX512;
#pragma omp parallel for schedule(static)
    for (int64_t task = 0; task < N * nb; task++) {
        int64_t r = task / nb, c0 = task % nb * bl, n = H - c0 < bl ? H - c0 : bl;
        if (v512) {
            const void *g = at(dt, inp, r * 2 * H + c0), *u = at(dt, inp, r * 2 * H + H + c0);
            if (out)
                l3d_cpu_swiglu_rows(isa, dt, at(dt, out, r * H + c0), NULL, NULL, NULL, g, u, n);
            else
                l3d_cpu_swiglu_rows(isa, dt, NULL, at(dt, dinp, r * 2 * H + c0),
                                    at(dt, dinp, r * 2 * H + H + c0), at(dt, dout, r * H + c0),
                                    g, u, n);
            continue;
        }
        float gb[L3D_BLK], ub[L3D_BLK], ob[L3D_BLK], db[L3D_BLK], eb[L3D_BLK];
        const float *g = row_in(dt, gb, at(dt, inp, r * 2 * H + c0), n);
        const float *u = row_in(dt, ub, at(dt, inp, r * 2 * H + H + c0), n);
        if (out) {
            void *op = at(dt, out, r * H + c0);
            float *o = row_out(dt, ob, op);
            swiglu_cols(o, NULL, NULL, NULL, g, u, n);
            row_done(dt, op, o, n);
            continue;
        }
        void *gp = at(dt, dinp, r * 2 * H + c0), *up = at(dt, dinp, r * 2 * H + H + c0);
        float *dg = row_io(dt, ob, gp, n), *du = row_io(dt, eb, up, n);
        swiglu_cols(NULL, dg, du, row_in(dt, db, at(dt, dout, r * H + c0), n), g, u, n);
        row_done(dt, gp, dg, n);
        row_done(dt, up, du, n);
    }
}

// out (N,H), inp (N,2H) = [gate | up] per row
static void cpu_swiglu_forward(void *ctx, enum l3d_dtype dt, void *out, const void *inp,
                               int64_t N, int64_t H) {
    (void)ctx;
    F32_OR_16("swiglu_forward");
    swiglu_rows(dt, out, NULL, NULL, inp, N, H);
}
// dinp (N,2H) +=, dout (N,H), inp (N,2H)
static void cpu_swiglu_backward(void *ctx, enum l3d_dtype dt, void *dinp, const void *dout,
                                const void *inp, int64_t N, int64_t H) {
    (void)ctx;
    F32_OR_16("swiglu_backward");
    swiglu_rows(dt, NULL, dinp, dout, inp, N, H);
}

/* ---- softmax cross-entropy over a vocabulary slice ------------------------------------- */

/* The passes over the logits (N,Vl) of type dt, Vvalid valid columns, a row per step of
 * the static loop, each row by cpu_xent.c's SIMD rows (no scratch: 16-bit rows are widened in
 * registers). A row's results depend only on the row (fixed lanes and order within it), so they
 * are bit-identical for any thread count and on every SIMD path. out (N): maxv (XENT_MAX) or
 * sumexp (XENT_SUMEXP, with tlogit); XENT_BACKWARD overwrites the logits (only it writes them).
 * XENT_STATS: the max, then the sum of exponentials and the target logit on the row while it is
 * in cache (out maxv, out2 sumexp): the bits of XENT_MAX then XENT_SUMEXP. */
enum xent_pass { XENT_MAX, XENT_SUMEXP, XENT_STATS, XENT_BACKWARD };

struct xent_args {
    enum xent_pass pass;
    enum l3d_dtype dt;
    void *logits;
    float *out, *out2, *tlogit;
    const float *maxv, *sumexp;
    const int32_t *targets;
    float dloss;
    int64_t vocab_start, N, Vl, Vvalid;
};

/* fp32 rows keep the bits the fp32 layout comparisons were measured with (before cpu_xent.c):
 * cpu_xent.c's 32-lane sums and its exp moved zero-started biases of fp32 layouts past those
 * bounds (cli_ckpt and cli_equiv 1.1-1.4e-5 against 1e-5 on the sanitized checking build; with
 * the old sums but cpu_xent.c's gradient, moeforce.sh's ep2 x cp2 with drops 7.1e-5 against 6e-5
 * in Release). The max is exact in any order (NaN skipped by both), so it takes cpu_xent.c's
 * prefetched rows; the sum of exponentials stays the loop GCC vectorises, and the gradient that
 * loop's element-wise bits with a prefetch (docs/DESIGN.md, "Cross-entropy rows in explicit
 * SIMD"). */
static inline float f32_row_sumexp(const float *l, int64_t n, float mx) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < n; j++) s += fast_expf(l[j] - mx);
    return s;
}
/* The gradient's row in chunks of 1024 (4 KB), the chunk after next prefetched first: the loop
 * is element-wise, so its bits are the unchunked loop's; without the prefetch it was bound by
 * memory latency (cpu_xent.c's figures). */
static void f32_row_grad(float *l, int64_t Vv, int64_t Vl, float mx, float k, int64_t t,
                         float dloss) {
    enum { CH = 1024 };
    for (int64_t j0 = 0; j0 < Vv; j0 += CH) {
        int64_t j1 = Vv - j0 < CH ? Vv : j0 + CH;
        for (int64_t p = j0 + 2 * CH; p < j1 + 2 * CH && p < Vv; p += 16)
            _mm_prefetch((const char *)(l + p), _MM_HINT_T0);
#pragma omp simd
        for (int64_t j = j0; j < j1; j++) l[j] = fast_expf(l[j] - mx) * k;
    }
    for (int64_t j = Vv; j < Vl; j++) l[j] = 0.0f;
    if (t >= 0 && t < Vv) l[t] -= dloss;
}

static void xent_rows(const struct xent_args *a) {
    const enum l3d_simd isa = l3d_cpu_simd();
    const enum l3d_dtype dt = a->dt;
    const int64_t Vv = a->Vvalid;
    const bool f32 = dt == L3D_F32;
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < a->N; n++) {
        void *row = at(dt, a->logits, n * a->Vl);
        int64_t t = a->pass == XENT_MAX ? -1 : (int64_t)a->targets[n] - a->vocab_start;
        if (a->pass == XENT_MAX || a->pass == XENT_STATS)
            a->out[n] = l3d_cpu_xent_max(isa, dt, row, Vv);
        if (a->pass == XENT_SUMEXP || a->pass == XENT_STATS) {
            float mx = a->pass == XENT_STATS ? a->out[n] : a->maxv[n];
            float *se = a->pass == XENT_STATS ? a->out2 : a->out;
            /* the next row of this thread's chunk (static schedule) fetched meanwhile */
            const void *next = n + 1 < a->N ? at(dt, a->logits, (n + 1) * a->Vl) : NULL;
            se[n] = f32 ? f32_row_sumexp(row, Vv, mx)
                        : l3d_cpu_xent_sumexp(isa, dt, row, Vv, mx, next);
            a->tlogit[n] = (t >= 0 && t < Vv) ? l3d_cpu_ld(dt, row, t) : 0.0f;
        }
        if (a->pass == XENT_BACKWARD && f32) /* logits in place -> dlogits */
            f32_row_grad(row, Vv, a->Vl, a->maxv[n], a->dloss / a->sumexp[n], t, a->dloss);
        else if (a->pass == XENT_BACKWARD)
            l3d_cpu_xent_grad(isa, dt, row, Vv, a->Vl, a->maxv[n], a->dloss / a->sumexp[n], t,
                              a->dloss);
    }
}

// maxv (N), logits (N,Vl)
static void cpu_xent_max(void *ctx, enum l3d_dtype dt, float *maxv, const void *logits, int64_t N,
                         int64_t Vl, int64_t Vvalid) {
    (void)ctx;
    F32_OR_16("xent_max");
    xent_rows(&(struct xent_args){.pass = XENT_MAX, .dt = dt, .logits = (void *)logits,
                                  .out = maxv, .N = N, .Vl = Vl, .Vvalid = Vvalid});
}
// sumexp (N), tlogit (N), logits (N,Vl), maxv (N), targets (N)
static void cpu_xent_sumexp(void *ctx, enum l3d_dtype dt, float *sumexp, float *tlogit,
                            const void *logits, const float *maxv, const int32_t *targets,
                            int64_t vocab_start, int64_t N, int64_t Vl, int64_t Vvalid) {
    (void)ctx;
    F32_OR_16("xent_sumexp");
    xent_rows(&(struct xent_args){.pass = XENT_SUMEXP, .dt = dt, .logits = (void *)logits,
                                  .out = sumexp, .tlogit = tlogit, .maxv = maxv,
                                  .targets = targets, .vocab_start = vocab_start, .N = N,
                                  .Vl = Vl, .Vvalid = Vvalid});
}
/* the two passes on each row while it is in cache: the bits of the pair */
static void cpu_xent_stats(void *ctx, enum l3d_dtype dt, float *maxv, float *sumexp,
                           float *tlogit, const void *logits, const int32_t *targets,
                           int64_t vocab_start, int64_t N, int64_t Vl, int64_t Vvalid) {
    (void)ctx;
    F32_OR_16("xent_stats");
    xent_rows(&(struct xent_args){.pass = XENT_STATS, .dt = dt, .logits = (void *)logits,
                                  .out = maxv, .out2 = sumexp, .tlogit = tlogit,
                                  .targets = targets, .vocab_start = vocab_start, .N = N,
                                  .Vl = Vl, .Vvalid = Vvalid});
}
// logits (N,Vl) in place -> dlogits, maxv (N), sumexp (N), targets (N)
static void cpu_xent_backward(void *ctx, enum l3d_dtype dt, void *logits, const float *maxv,
                              const float *sumexp, const int32_t *targets, float dloss,
                              int64_t vocab_start, int64_t N, int64_t Vl, int64_t Vvalid) {
    (void)ctx;
    F32_OR_16("xent_backward");
    xent_rows(&(struct xent_args){.pass = XENT_BACKWARD, .dt = dt, .logits = logits,
                                  .maxv = maxv, .sumexp = sumexp, .targets = targets,
                                  .dloss = dloss, .vocab_start = vocab_start, .N = N, .Vl = Vl,
                                  .Vvalid = Vvalid});
}

/* losses (N), *loss_sum += sum in token order (sequential: bit-identical for any thread count) */
static void cpu_xent_loss(void *ctx, float *losses, double *loss_sum, const float *maxv,
                          const float *sumexp, const float *tlogit, int64_t N) {
    (void)ctx;
    double total = *loss_sum;
    for (int64_t i = 0; i < N; i++) {
        losses[i] = logf(sumexp[i]) + maxv[i] - tlogit[i];
        total += losses[i];
    }
    *loss_sum = total;
}

/* ---- optimizer helpers ------------------------------------------------------------------ */

/* The scalars of one AdamW step (see backend-impl.h's adamw). */
struct adamw_hp {
    float gs, lr, b1, b2, eps, wd, bc1, bc2;
};

/* One block: master p, m, v (n) updated from the fp32 gradient g; gz (NULL, or g itself when
 * the gradient is fp32 and is to be zeroed) written 0 right after each element is read, in the
 * same pass (always inlined: the NULL test is folded out of each call's loop). */
static inline __attribute__((always_inline)) void adamw_block(float *p, float *mm, float *vv,
                                                              const float *g, float *gz,
                                                              int64_t n, struct adamw_hp h) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        float gi = g[i] * h.gs;
        if (gz) gz[i] = 0.0f;
        float mi = h.b1 * mm[i] + (1.0f - h.b1) * gi;
        float vi = h.b2 * vv[i] + (1.0f - h.b2) * gi * gi;
        mm[i] = mi;
        vv[i] = vi;
        float mhat = mi / h.bc1, vhat = vi / h.bc2;
        p[i] -= h.lr * (mhat / (sqrtf(vhat) + h.eps) + h.wd * p[i]);
    }
}

/* AdamW on fp32 master weights (N) with a gradient of type gdt: master, m, v updated in place,
 * then param (type dt, or NULL) = master rounded to dt; zero: the gradient is written 0 as it is
 * read (the next step's zeroing in this pass). Each thread its static chunk: an fp32 gradient
 * read in place, a 16-bit one in blocks of L3D_BLK widened on the stack (and zeroed there, in
 * cache). */
static void adamw_any(enum l3d_dtype dt, enum l3d_dtype gdt, void *param, float *master,
                      float *m, float *v, void *grad, bool zero, int64_t N, struct adamw_hp h) {
#pragma omp parallel
    {
        const struct span sp = thread_span(gdt, N);
        for (int64_t i0 = sp.lo; i0 < sp.hi; i0 += sp.bl) {
            int64_t n = span_len(sp, i0);
            float gb[L3D_BLK];
            const float *g = row_in(gdt, gb, at(gdt, grad, i0), n);
            float *p = master + i0, *mm = m + i0, *vv = v + i0;
            if (zero && gdt == L3D_F32)
                adamw_block(p, mm, vv, g, (float *)grad + i0, n, h);
            else
                adamw_block(p, mm, vv, g, NULL, n, h);
            if (zero && gdt != L3D_F32) /* the block just widened, still in cache */
                memset(at(gdt, grad, i0), 0, (size_t)n * l3d_dtype_size(gdt));
            if (param) from_f32(dt, at(dt, param, i0), p, n);
        }
    }
}

/* AdamW on the fp32 master weights, the update exactly cpu_adamw's, then the 16-bit copy. */
static void adamw_mixed_cpu(void *ctx, enum l3d_dtype dt, enum l3d_dtype gdt, void *param,
                            float *master, float *m, float *v, const void *grad, float grad_scale,
                            int64_t N, float lr, float beta1, float beta2, float eps, float wd,
                            float bc1, float bc2) {
    (void)ctx;
    if (!(dt == L3D_F32 || is16(dt)) || !(gdt == L3D_F32 || gdt == dt))
        l3d_fatal(__FILE__, __LINE__, "backend cpu: adamw_mixed has no variant for parameters "
                  "%s with gradients %s", l3d_dtype_name(dt), l3d_dtype_name(gdt));
    adamw_any(dt, gdt, param, master, m, v, (void *)grad, false, N,
              (struct adamw_hp){grad_scale, lr, beta1, beta2, eps, wd, bc1, bc2});
}

/* adamw (master NULL: the fp32 parameters are their own master weights) or adamw_mixed, the
 * gradient zeroed in the same pass */
static void cpu_adamw_zero(void *ctx, enum l3d_dtype dt, enum l3d_dtype gdt, void *param,
                           float *master, float *m, float *v, void *grad, float grad_scale,
                           int64_t N, float lr, float beta1, float beta2, float eps, float wd,
                           float bc1, float bc2) {
    (void)ctx;
    if (!(dt == L3D_F32 || is16(dt)) || !(gdt == L3D_F32 || gdt == dt) ||
        (!master && (dt != L3D_F32 || gdt != L3D_F32)))
        l3d_fatal(__FILE__, __LINE__, "backend cpu: adamw_zero has no variant for parameters "
                  "%s with gradients %s%s", l3d_dtype_name(dt), l3d_dtype_name(gdt),
                  master ? "" : " and no master weights");
    struct adamw_hp h = {grad_scale, lr, beta1, beta2, eps, wd, bc1, bc2};
    if (master)
        adamw_any(dt, gdt, param, master, m, v, grad, true, N, h);
    else
        adamw_any(L3D_F32, L3D_F32, NULL, param, m, v, grad, true, N, h);
}

/* s += x[i]^2 over n, in double, reading the four quarters of x side by side (SUMSQ_STREAMS
 * sequential streams, SUMSQ_LANES partial sums each). One stream a core kept too few lines in
 * flight: the old single loop read DRAM at half the triad's bytes/s on one thread and on two
 * (whose three streams a core keep more misses outstanding), while its compute ceiling, one chain
 * of widening multiply-adds, was 28 GB/s a core from L2, four times that. Four streams measured
 * 1.3-1.5x the single loop from DRAM on a shared machine (docs/BENCHMARKS.md) and as fast as
 * independent lanes from L2 (38 GB/s). The sums are added to s stream by stream, lane by lane,
 * then the tail: a fixed order for a given n. */
enum { SUMSQ_STREAMS = 4, SUMSQ_LANES = 8 };
static inline double sumsq_acc(double s, const float *x, int64_t n) {
    const int64_t q = n / SUMSQ_STREAMS / SUMSQ_LANES * SUMSQ_LANES; /* each stream's length */
    double a[SUMSQ_STREAMS][SUMSQ_LANES] = {{0}};
    for (int64_t i = 0; i < q; i += SUMSQ_LANES)
        for (int k = 0; k < SUMSQ_STREAMS; k++) {
#pragma omp simd
            for (int j = 0; j < SUMSQ_LANES; j++) {
                double v = x[k * q + i + j];
                a[k][j] += v * v;
            }
        }
    for (int k = 0; k < SUMSQ_STREAMS; k++)
        for (int j = 0; j < SUMSQ_LANES; j++) s += a[k][j];
    for (int64_t i = SUMSQ_STREAMS * q; i < n; i++) s += (double)x[i] * (double)x[i];
    return s;
}

/* A fixed static partition over threads, the partial sums combined in thread order; each
 * element widened to double. */
static void cpu_sumsq(void *ctx, enum l3d_dtype dt, double *acc, const void *x, int64_t n) {
    (void)ctx;
    F32_OR_16("sumsq");
    double part[L3D_MAX_THREADS] = {0};
    int nth_used = 1;
#pragma omp parallel
    {
        int nth = omp_get_num_threads(), tid = omp_get_thread_num();
        L3D_ASSERT(nth <= L3D_MAX_THREADS);
        const struct span sp = thread_span(dt, n);
        double s = 0.0;
        float b[L3D_BLK];
        for (int64_t i0 = sp.lo; i0 < sp.hi; i0 += sp.bl) {
            int64_t m = span_len(sp, i0);
            s = sumsq_acc(s, row_in(dt, b, at(dt, x, i0), m), m);
        }
        part[tid] = s;
        if (tid == 0) nth_used = nth;
    }
    double s = 0.0;
    for (int t = 0; t < nth_used; t++) s += part[t];
    *acc += s;
}

static void convert_cpu(void *ctx, enum l3d_dtype dst_t, void *dst, enum l3d_dtype src_t,
                        const void *src, int64_t N) {
    (void)ctx;
    if (!(dst_t == L3D_F32 || is16(dst_t)) || !(src_t == L3D_F32 || is16(src_t)))
        l3d_fatal(__FILE__, __LINE__, "backend cpu: convert has no variant from %s to %s",
                  l3d_dtype_name(src_t), l3d_dtype_name(dst_t));
    if (dst_t == src_t) {
        if (dst != src) memmove(dst, src, (size_t)N * esz(dst_t));
        return;
    }
#pragma omp parallel for schedule(static)
    for (int64_t i0 = 0; i0 < N; i0 += L3D_BLK) {
        int64_t n = N - i0 < L3D_BLK ? N - i0 : L3D_BLK;
        float x[L3D_BLK];
        to_f32(src_t, x, at(src_t, src, i0), n);
        from_f32(dst_t, at(dst_t, dst, i0), x, n);
    }
}

static void unscale_cpu(void *ctx, enum l3d_dtype dt, float *found_inf, void *x, float inv_scale,
                        int64_t N) {
    (void)ctx;
    if (!(dt == L3D_F32 || is16(dt))) l3d_backend_no_variant("cpu", "unscale", dt);
    int bad = 0;
#pragma omp parallel reduction(| : bad)
    {
        const struct span sp = thread_span(dt, N);
        for (int64_t i0 = sp.lo; i0 < sp.hi; i0 += sp.bl) {
            int64_t n = span_len(sp, i0);
            float buf[L3D_BLK];
            void *p = at(dt, x, i0);
            float *b = row_io(dt, buf, p, n);
            int nf = 0;
#pragma omp simd reduction(| : nf)
            for (int64_t i = 0; i < n; i++) nf |= !(fabsf(b[i]) <= 3.40282347e38f); /* Inf, NaN */
            bad |= nf;
            if (inv_scale != 1.0f) {
#pragma omp simd
                for (int64_t i = 0; i < n; i++) b[i] *= inv_scale;
                row_done(dt, p, b, n);
            }
        }
    }
    if (bad) *found_inf = 1.0f;
}

/* ---- attention over a key/value cache (generation) ------------------------------------- */

/* The training kernel's forward block (fa_forward_rows) with the queries of the n new rows and
 * the keys and values of the cache: one new row is a query block of one. Tasks (head, query
 * block) over threads. The same code and key blocks as cpu_attention_forward; only oneDNN may
 * round a one-row product differently from a 64-row one. Where bf16 attention runs cpu_attnd.c,
 * on its numerics (P rounded to bf16 as it rounds them, l3d_fa_online_row16), so that cached
 * generation chooses the tokens of the uncached forward. */
static void cpu_attention_cached(void *ctx, enum l3d_dtype dt, void *out, const void *q,
                                 const void *k, const void *v, int64_t pos, int64_t n, int64_t NH,
                                 int64_t NKV, int64_t HS, int64_t q_stride, int64_t kv_stride) {
    struct cpu_ctx *cx = ctx;
    F32_OR_16("attention_cached");
    gqa_check("attention_cached", NH, NKV);
    const int64_t C = NH * HS, nb = (n + L3D_FA_BQ - 1) / L3D_FA_BQ, rep = NH / NKV;
    const bool p16 = l3d_attnd_on(cx->attnd, dt); /* the uncached forward's numerics */
    const int64_t per = fa_scratch(dt, pos + n, HS);
    float *scr = per ? thread_scratch(cx, per, "attention fp32 scratch") : NULL;
#pragma omp parallel
    {
        _Alignas(64) float S[L3D_FA_BQ * L3D_FA_BK];
        float *f = off(scr, omp_get_thread_num() * per);
#pragma omp for schedule(static)
        for (int64_t task = 0; task < NH * nb; task++) {
            int64_t h = task % NH, i0 = (task / NH) * L3D_FA_BQ;
            int64_t nq = n - i0 < L3D_FA_BQ ? n - i0 : L3D_FA_BQ;
            fa_forward_rows(dt, f, at(dt, out, i0 * C + h * HS), C, NULL,
                            at(dt, q, i0 * q_stride + h * HS), q_stride, at(dt, k, h / rep * HS),
                            at(dt, v, h / rep * HS), kv_stride, pos + i0, nq, HS, S, p16);
        }
    }
}

/* ---- the table: the kernels that differ by type dispatch here; the others take dt -------- */

static void cpu_matmul_forward(void *ctx, enum l3d_dtype dt, void *out, const void *inp,
                               const void *weight, const void *bias, int64_t N, int64_t C,
                               int64_t OC) {
    F32_OR_16("matmul_forward");
    if (is16(dt))
        matmul_forward_16(ctx, dt, out, inp, weight, bias, N, C, OC);
    else
        matmul_forward_f32(ctx, out, inp, weight, bias, N, C, OC);
}
static void cpu_matmul_backward(void *ctx, enum l3d_dtype dt, enum l3d_dtype gdt, void *dinp,
                                void *dweight, void *dbias, const void *dout, const void *inp,
                                const void *weight, int64_t N, int64_t C, int64_t OC) {
    F32_OR_16("matmul_backward");
    GRAD_TYPE("matmul_backward");
    if (is16(dt))
        matmul_backward_16(ctx, dt, gdt, dinp, dweight, dbias, dout, inp, weight, N, C, OC);
    else
        matmul_backward_f32(ctx, dinp, dweight, dbias, dout, inp, weight, N, C, OC);
}
static void cpu_attention_naive_forward(void *ctx, enum l3d_dtype dt, void *out, void *att,
                                        const void *qkv, int64_t B, int64_t T, int64_t NH,
                                        int64_t NKV, int64_t HS) {
    F32_ONLY("attention_naive_forward");
    gqa_check("attention_naive_forward", NH, NKV);
    attention_naive_forward_f32(ctx, out, att, qkv, B, T, NH, NKV, HS);
}
static void cpu_attention_naive_backward(void *ctx, enum l3d_dtype dt, void *dqkv, void *datt,
                                         const void *dout, const void *qkv, const void *att,
                                         int64_t B, int64_t T, int64_t NH, int64_t NKV,
                                         int64_t HS) {
    F32_ONLY("attention_naive_backward");
    gqa_check("attention_naive_backward", NH, NKV);
    attention_naive_backward_f32(ctx, dqkv, datt, dout, qkv, att, B, T, NH, NKV, HS);
}
static void cpu_adamw(void *ctx, enum l3d_dtype dt, void *param, float *m, float *v,
                      const void *grad, float grad_scale, int64_t n, float lr, float beta1,
                      float beta2, float eps, float wd, float bc1, float bc2) {
    (void)ctx;
    F32_ONLY("adamw");
    adamw_any(L3D_F32, L3D_F32, NULL, param, m, v, (void *)grad, false, n,
              (struct adamw_hp){grad_scale, lr, beta1, beta2, eps, wd, bc1, bc2});
}

/* ---- memory: the device is the host; buffers come from the accounting allocator -------- */

static void *cpu_alloc(void *ctx, size_t bytes, const char *what) {
    (void)ctx;
    return l3d_try_alloc(bytes, what);
}
static void cpu_dfree(void *ctx, void *p) {
    (void)ctx;
    l3d_free(p);
}
static void cpu_memset(void *ctx, void *dst, int value, size_t bytes) {
    (void)ctx;
    /* from 4 MiB (the gradients' zeroing, 4 bytes a parameter, and a layer's 16-bit activation
     * gradients, 3-13 MB at GPT-2's B 8 x T 256) in 1 MiB pieces over the threads: 13-16 GB/s
     * on 2 threads here against 8 for one memset. (Non-temporal stores filled the gradients in
     * half that time but made the start-up's first-touch fills 40-50% slower: not kept.) */
    const size_t piece = (size_t)1 << 20;
    const int64_t pieces = (int64_t)((bytes + piece - 1) / piece);
#pragma omp parallel for schedule(static) if (pieces >= 4)
    for (int64_t i = 0; i < pieces; i++) {
        size_t o = (size_t)i * piece;
        memset((char *)dst + o, value, bytes - o < piece ? bytes - o : piece);
    }
}
static void cpu_copy(void *ctx, void *dst, const void *src, size_t bytes) {
    (void)ctx;
    memcpy(dst, src, bytes);
}
static void cpu_copy_d2d(void *ctx, void *dst, const void *src, size_t bytes) {
    (void)ctx;
    memmove(dst, src, bytes);
}
static void cpu_sync(void *ctx) { (void)ctx; } /* every kernel returns when it is done */
static double cpu_peak_flops(void *ctx, enum l3d_dtype t) {
    (void)ctx;
    /* 16-bit products without 16-bit arithmetic run as fp32 products (matmul_forward_16) */
    double bf16 = t == L3D_BF16 ? l3d_cpu_bf16_peak(0.3) : 0.0;
    if (bf16 > 0.0) return bf16;
    if (t == L3D_F32 || is16(t)) return l3d_cpu_fma_peak(0.3);
    return 0.0;
}
/* The three products of a linear layer (forward with bias, both backward ones, the weight
 * gradient into fp32 main_grad as the trainer's mixed precision takes it) all through oneDNN's
 * 16-bit kernels, on a small shape */
static bool cpu_matmul_native(void *ctx, enum l3d_dtype t) {
    struct cpu_ctx *cx = ctx;
    if (t == L3D_F32) return true;
    if (!is16(t)) return false;
    struct mm_key k[3] = {mm_key_forward(64, 64, 64, dnnl_type(t), true), mm_key_dinp(64, 64, 64, t),
                          mm_key_dweight(64, 64, 64, t, L3D_F32)};
    for (int i = 0; i < 3; i++)
        if (!mm_get(cx, &k[i])->ok) return false;
    return true;
}
const char *l3d_cpu_matmul_impl(struct l3d_backend *be, char which, enum l3d_dtype dt, int64_t N,
                                int64_t C, int64_t OC) {
    struct cpu_ctx *cx = be->ctx;
    int64_t rows;
    struct mm_entry *g = which == 'w' ? dweight_gemm_entry(cx, dt, N, C, OC, &rows) : NULL;
    if (g) return g->impl;
    struct mm_key k = which == 'f'   ? mm_key_forward(N, C, OC, dnnl_type(dt), false)
                      : which == 'i' ? mm_key_dinp(N, C, OC, dt)
                                     : mm_key_dweight(N, C, OC, dt, L3D_F32);
    struct mm_entry *e = mm_get(cx, &k);
    return e->ok ? e->impl : "widened";
}
static int64_t cpu_matmul_wgrad_block(void *ctx, enum l3d_dtype t) {
    struct cpu_ctx *cx = ctx;
    int64_t rows;
    return dweight_gemm_entry(cx, t, cx->dw_min_rows, 64, 64, &rows) ? cx->dw_block : 0;
}
static bool cpu_attention_native(void *ctx, enum l3d_dtype t) {
    return l3d_attnd_on(((struct cpu_ctx *)ctx)->attnd, t);
}
/* oneDNN's attention (cpu_attnd.c) and the dot products (cpu_attn16.c, l3d_fa16_on) */
static bool cpu_attention_p16(void *ctx, enum l3d_dtype t, int64_t HS) {
    return cpu_attention_native(ctx, t) || (t == L3D_BF16 && l3d_fa16_on(t, HS));
}
static void *cpu_host_view(void *ctx, const void *p, size_t bytes) {
    (void)ctx;
    (void)bytes;
    return (void *)p;
}

static void cpu_free(void *ctx) {
    struct cpu_ctx *cx = ctx;
    for (int i = 0; i < cx->mm_count; i++) mm_entry_destroy(&cx->mm[i]);
    for (int k = 0; k < SCR_KINDS; k++) l3d_free(cx->scr[k].p);
    l3d_attnd_free(cx->attnd);
    dnnl_stream_destroy(cx->stream);
    dnnl_engine_destroy(cx->engine);
    l3d_free(cx);
}

static const struct l3d_backend_i cpu_backend_i = {
    .name = "cpu",
    .free = cpu_free,
    .alloc = cpu_alloc,
    .dfree = cpu_dfree,
    .memset = cpu_memset,
    .copy_h2d = cpu_copy,
    .copy_d2h = cpu_copy,
    .copy_d2d = cpu_copy_d2d,
    .sync = cpu_sync,
    .event_record = NULL, /* synchronous */
    .event_wait = NULL,
    .peak_flops = cpu_peak_flops,
    .matmul_native = cpu_matmul_native,
    .attention_native = cpu_attention_native,
    .attention_p16 = cpu_attention_p16,
    .matmul_wgrad_block = cpu_matmul_wgrad_block,
    .host_view = cpu_host_view,
    .matmul_forward = cpu_matmul_forward,
    .matmul_backward = cpu_matmul_backward,
    .encoder_forward = cpu_encoder_forward,
    .encoder_backward = cpu_encoder_backward,
    .layernorm_forward = cpu_layernorm_forward,
    .layernorm_backward = cpu_layernorm_backward,
    .attention_forward = cpu_attention_forward,
    .attention_backward = cpu_attention_backward,
    .attention_naive_forward = cpu_attention_naive_forward,
    .attention_naive_backward = cpu_attention_naive_backward,
    .attention_cached = cpu_attention_cached,
    .attention_block_forward = cpu_attention_block_forward,
    .attention_merge = cpu_attention_merge,
    .attention_block_backward = cpu_attention_block_backward,
    .rmsnorm_forward = cpu_rmsnorm_forward,
    .rmsnorm_backward = cpu_rmsnorm_backward,
    .rope_forward = cpu_rope_forward,
    .rope_backward = cpu_rope_backward,
    .swiglu_forward = cpu_swiglu_forward,
    .swiglu_backward = cpu_swiglu_backward,
    .gelu_forward = cpu_gelu_forward,
    .gelu_backward = cpu_gelu_backward,
    .residual_forward = cpu_residual_forward,
    .residual_norm_forward = cpu_residual_norm_forward,
    .add_inplace = cpu_add_inplace,
    .add_bias = cpu_add_bias,
    .moe_route = l3d_cpu_moe_route,
    .moe_permute = l3d_cpu_moe_permute,
    .moe_combine = l3d_cpu_moe_combine,
    .moe_combine_backward = l3d_cpu_moe_combine_backward,
    .moe_router_backward = l3d_cpu_moe_router_backward,
    .xent_max = cpu_xent_max,
    .xent_sumexp = cpu_xent_sumexp,
    .xent_stats = cpu_xent_stats,
    .xent_backward = cpu_xent_backward,
    .xent_loss = cpu_xent_loss,
    .adamw = cpu_adamw,
    .sumsq = cpu_sumsq,
    .adamw_mixed = adamw_mixed_cpu,
    .adamw_zero = cpu_adamw_zero,
    .convert = convert_cpu,
    .unscale = unscale_cpu,
};

struct l3d_backend *l3d_backend_cpu_init(void) {
    struct cpu_ctx *cx = l3d_calloc(sizeof *cx, "cpu backend");
    const char *d16 = getenv("L3D_DNNL_16BIT");
    bool on = d16 && strcmp(d16, "1") == 0, off = d16 && strcmp(d16, "0") == 0;
    cx->dnnl16[0] = on || (!off && __builtin_cpu_supports("avx512bf16"));
    cx->dnnl16[1] = on;
    const char *mg = getenv("L3D_MM_GEMM");
    cx->mm_gemm = !(mg && strcmp(mg, "0") == 0);
    const char *db = getenv("L3D_MM_DW_BLOCK_KB");
    cx->dw_block = db && atoll(db) > 0 ? atoll(db) * 1024 : L3D_MM_DW_BLOCK_BYTES;
    const char *dm = getenv("L3D_MM_DW_MIN_ROWS");
    cx->dw_min_rows = dm && atoll(dm) > 0 ? atoll(dm) : L3D_WGRAD_BLOCK_MIN_ROWS;
    cx->rope.T = -1; /* no table yet */
    DNNL_CHECK(dnnl_engine_create(&cx->engine, dnnl_cpu, 0));
    DNNL_CHECK(dnnl_stream_create(&cx->stream, cx->engine, dnnl_stream_default_flags));
    cx->attnd = l3d_attnd_init();
    return l3d_backend_make(&cpu_backend_i, cx);
}
