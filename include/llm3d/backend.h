/*
 * llm3d backend: the numeric kernels the model calls, behind one table of function pointers.
 * The CPU backend (src/backend/cpu.c) uses oneDNN for matrix products and OpenMP loops for the
 * rest; the CUDA backend (src/backend/cuda.c, built with -DL3D_CUDA=ON) fills the same table with
 * cuBLASLt products and kernels of its own, the mixture-of-experts ones included. It is
 * experimental: compiled and its host arithmetic tested, never yet run on a GPU.
 *
 *   struct l3d_backend *be = l3d_backend_cpu_init();
 *   l3d_be_matmul_forward(be, L3D_F32, out, inp, w, b, N, C, OC); // out (N,OC) = inp w^T + b
 *   l3d_backend_free(be);
 *
 * Conventions, for every kernel:
 *   - outputs first, then gradients (d<x>), then inputs, then sizes; shapes in the comments use
 *     B T C OC NH HS V; element counts are int64_t;
 *   - forward outputs (activations) are overwritten (=);
 *   - every gradient output, parameter or activation, accumulates (+=): the caller zeroes an
 *     activation-gradient buffer before the backward pass that fills it, and parameter gradients
 *     once per optimizer step, so micro-batches accumulate for free;
 *   - a NULL gradient output is skipped (e.g. no dinp for the first layer's input).
 *
 * The handle is opaque: the table of function pointers behind it is in src/backend/backend-impl.h,
 * filled by each backend (cpu.c, check.c, cuda.c); callers use the l3d_be_* functions below.
 */
#ifndef LLM3D_BACKEND_H
#define LLM3D_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "llm3d/core.h"

/* ---- the device interface ---------------------------------------------------------------
 *
 *   struct l3d_backend *be;
 *   if (l3d_backend_init(NULL, &be) != L3D_OK) ...;        // $L3D_BACKEND, else "cpu"
 *   float *w = l3d_be_alloc(be, n * sizeof(float), "weights");   // device memory, accounted
 *   l3d_be_copy_h2d(be, w, host, n * sizeof(float));              // host -> device
 *   l3d_be_matmul_forward(be, L3D_F32, out, inp, w, NULL, N, C, OC);
 *   double *sq = l3d_be_alloc(be, sizeof(double), "norm");
 *   l3d_be_memset(be, sq, 0, sizeof(double));
 *   l3d_be_sumsq(be, L3D_F32, sq, w, n);                          // stays on the device ...
 *   double host_sq;
 *   l3d_be_copy_d2h(be, &host_sq, sq, sizeof host_sq);            // ... until asked for
 *   l3d_be_free(be, w);
 *
 * Memory a backend allocates is device memory: only the backend's kernels and copies read or
 * write it, and host code reaches it only through l3d_be_copy_d2h / h2d (explicit staging).
 * Pointer arithmetic inside an allocation is allowed (sub-buffers of a flat buffer); the
 * checking backend ("check") makes every other access fail. Kernels run in issue order on one
 * stream: a copy to the host, l3d_be_sync and l3d_be_event_wait return when the work issued
 * before them is complete. Communicators read and write device buffers through
 * l3d_be_host_view (an MPI that can reach device memory; NCCL takes device pointers as they are)
 * after the backend is synchronised.
 */
struct l3d_backend;
struct l3d_event;

/* A backend by name: "cpu" (oneDNN + OpenMP) or "check" (the CPU kernels behind a separate
 * arena that refuses foreign pointers and host access to device memory). NULL or "" takes
 * $L3D_BACKEND, else "cpu". L3D_ERR_ARG naming the value and the choices otherwise. */
l3d_status l3d_backend_init(const char *name, struct l3d_backend **out);
struct l3d_backend *l3d_backend_cpu_init(void);
void l3d_backend_free(struct l3d_backend *be);
const char *l3d_backend_name(const struct l3d_backend *be);

/* Device memory. alloc returns NULL when the device is out of memory (the contents are
 * undefined: memset or copy before use); every byte is counted in l3d_mem_used/l3d_mem_peak. */
void *l3d_be_alloc(struct l3d_backend *be, size_t bytes, const char *what);
void l3d_be_free(struct l3d_backend *be, void *p);
void l3d_be_memset(struct l3d_backend *be, void *dst, int value, size_t bytes);
void l3d_be_copy_h2d(struct l3d_backend *be, void *dst, const void *src, size_t bytes);
void l3d_be_copy_d2h(struct l3d_backend *be, void *dst, const void *src, size_t bytes);
void l3d_be_copy_d2d(struct l3d_backend *be, void *dst, const void *src, size_t bytes);
/* Waits until every kernel and copy issued so far is complete. */
void l3d_be_sync(struct l3d_backend *be);
/* Events: record marks the point in the stream reached so far; wait blocks the host until the
 * work before the last record is complete (waiting on an event never recorded is an error). */
struct l3d_event *l3d_be_event_new(struct l3d_backend *be);
void l3d_be_event_record(struct l3d_backend *be, struct l3d_event *ev);
void l3d_be_event_wait(struct l3d_backend *be, struct l3d_event *ev);
void l3d_be_event_free(struct l3d_backend *be, struct l3d_event *ev);
/* Peak FLOP/s of the device's dense products in dtype t as the backend runs them (0 for a type
 * it has no products in), measured at each call on every thread of the current OpenMP team size
 * (CPU: about 0.3 s of fp32 fused multiply-adds; for bf16, AVX512-BF16 dot products where the CPU
 * has them, else the fp32 peak, as its bf16 products are fp32 products of widened operands; for
 * fp16 the fp32 peak likewise: these CPUs have no fp16 arithmetic). MFU is quoted against it. */
double l3d_be_peak_flops(struct l3d_backend *be, enum l3d_dtype t);
/* The kernel families of the step's time split (llm3d bench, --trace): every l3d_be_* kernel
 * belongs to one; the MoE kernels and whatever runs outside the backend count in none. */
enum l3d_kfam {
    L3D_KF_PRODUCTS,    /* matmul forward / backward (dense, compute-bound) */
    L3D_KF_ATTENTION,   /* flash, naive, cached and block attention, the merge */
    L3D_KF_ELEMENTWISE, /* GELU, SwiGLU, RoPE, residuals, biases, the embedding lookup */
    L3D_KF_NORMS,       /* LayerNorm, RMSNorm */
    L3D_KF_XENT,        /* the cross-entropy passes over the logits */
    L3D_KF_OPTIMIZER,   /* AdamW, the gradient-norm sums, casts, fp16 unscaling */
    L3D_KF_COPIES,      /* memset and the copies */
    L3D_KF_N
};
const char *l3d_kfam_name(enum l3d_kfam f);
/* Seconds, calls and bytes moved (the bytes each kernel must read and write at least, counted
 * for the memory-bound families; 0 for products and attention) per family, summed since the
 * struct was zeroed. */
struct l3d_ksplit {
    double s[L3D_KF_N], bytes[L3D_KF_N];
    int64_t calls[L3D_KF_N];
};
/* The same per family and per kernel (the backend entry's name, a string literal; in the order
 * of first call, at most L3D_KPROF_KERNELS: later ones count in their family only). */
#define L3D_KPROF_KERNELS 48
struct l3d_kstat {
    const char *name;
    enum l3d_kfam fam;
    double s, bytes;
    int64_t calls;
};
struct l3d_kprof {
    struct l3d_ksplit fam;
    struct l3d_kstat k[L3D_KPROF_KERNELS];
    int nk;
};
/* From now on every kernel call adds its time to *p (NULL: stop; the default). Each timed call
 * syncs the device before and after, so asynchronous backends lose their overlap while it is on;
 * the CPU's kernels are synchronous and pay only two clock reads a call. */
void l3d_be_profile(struct l3d_backend *be, struct l3d_kprof *p);
/* Whether the backend's matrix products in dtype t run in t itself, with no fp32 copies of their
 * operands: always for fp32; on the CPU, for bf16 / fp16 where oneDNN's 16-bit matmul runs
 * (AVX512-BF16 / AVX512-FP16 CPUs, unless L3D_DNNL_16BIT=0), else the operands are widened into
 * fp32 copies around the fp32 product (which llm3d plan counts in memory). */
bool l3d_be_matmul_native(struct l3d_backend *be, enum l3d_dtype t);
/* Whether attention (l3d_be_attention_forward / backward) in t runs its products as batched
 * 16-bit matmuls with their kept scratch (the CPU backend: bf16 through oneDNN where it picks AMX,
 * or L3D_ATTN_DNNL=1; src/backend/cpu_attnd.c), which llm3d plan counts in memory. */
bool l3d_be_attention_native(struct l3d_backend *be, enum l3d_dtype t);
/* Whether attention in t of head size HS rounds P and dS to bf16 on bf16 attention's numerics
 * (each probability to the value the whole row's softmax rounds it to: the CPU backend's oneDNN
 * attention and its AVX512-BF16 dot products), which the fp32 ring of a bf16 model then follows
 * (l3d_attn_block's p16) to give one process's attention up to the order of fp32 sums. */
bool l3d_be_attention_p16(struct l3d_backend *be, enum l3d_dtype t, int64_t HS);
/* The bytes of fp32 scratch in which the backend's products in t compute a weight gradient, a
 * block of rows at a time, before adding it to the gradient (the CPU backend: bf16 in oneDNN's
 * gemm kernels where it picks AMX, unless L3D_MM_GEMM=0; src/backend/cpu.c, dweight_gemm); 0:
 * none. llm3d plan counts it in memory, with the rows of l3d_wgrad_block_rows. */
int64_t l3d_be_matmul_wgrad_block(struct l3d_backend *be, enum l3d_dtype t);
/* The fewest rows (tokens, the product's K) a weight gradient runs in those blocks with: below,
 * the add's pass over the gradient costs more than the faster kernel gains (GPT-2 124M bf16 on an
 * AMX Xeon: backward products 2-8% slower at 1024 rows, 25-60% at 256, 6% faster at 2048;
 * docs/BENCHMARKS.md). */
#define L3D_WGRAD_BLOCK_MIN_ROWS 2048
/* The rows of a weight gradient (OC, C) such a block holds: block bytes of fp32 rows, rounded
 * down to a multiple of 64 rows, at least 64, at most OC. */
static inline int64_t l3d_wgrad_block_rows(int64_t block, int64_t C, int64_t OC) {
    int64_t r = block / (C * 4) / 64 * 64;
    r = r < 64 ? 64 : r;
    return r < OC ? r : OC;
}
/* The address at which host code such as an MPI library may access [p, p + bytes) of device
 * memory, after l3d_be_sync; p itself when p is not device memory of this backend; NULL when the
 * device's memory is not reachable so (a GPU without a GPU-aware MPI). */
void *l3d_be_host_view(struct l3d_backend *be, const void *p, size_t bytes);

/* ---- kernels -------------------------------------------------------------------------------
 * dt is the element type of the floating-point activations and parameters a kernel reads and
 * writes; the CPU backend has fp32 kernels (mixed precision adds bf16/fp16). Shapes as in the
 * table below. tokens and targets are int32 device buffers. */
void l3d_be_matmul_forward(struct l3d_backend *be, enum l3d_dtype dt, void *out, const void *inp,
                           const void *weight, const void *bias, int64_t N, int64_t C, int64_t OC);
void l3d_be_matmul_backward(struct l3d_backend *be, enum l3d_dtype dt, void *dinp, void *dweight,
                            void *dbias, const void *dout, const void *inp, const void *weight,
                            int64_t N, int64_t C, int64_t OC);
void l3d_be_encoder_forward(struct l3d_backend *be, enum l3d_dtype dt, void *out,
                            const int32_t *tokens, const void *wte, const void *wpe,
                            int64_t vocab_start, int64_t vocab_count, int64_t B, int64_t T,
                            int64_t C);
void l3d_be_encoder_backward(struct l3d_backend *be, enum l3d_dtype dt, void *dwte, void *dwpe,
                             const void *dout, const int32_t *tokens, int64_t vocab_start,
                             int64_t vocab_count, int64_t B, int64_t T, int64_t C);
void l3d_be_layernorm_forward(struct l3d_backend *be, enum l3d_dtype dt, void *out, float *mean,
                              float *rstd, const void *inp, const void *weight, const void *bias,
                              int64_t N, int64_t C);
void l3d_be_layernorm_backward(struct l3d_backend *be, enum l3d_dtype dt, void *dinp,
                               void *dweight, void *dbias, const void *dout, const void *inp,
                               const void *weight, const float *mean, const float *rstd,
                               int64_t N, int64_t C);
/* Causal self-attention, tiled (FlashAttention): out (B,T,NH,HS) from qkv (B,T,NH+2*NKV,HS); lse
 * (B,NH,T) fp32, the log-sum-exp of each query row's scaled scores, saved for backward, which
 * recomputes the scores from qkv, out and lse. No (B,NH,T,T) tensor. Grouped-query attention
 * (Ainslie et al. 2023): NKV key/value heads, NH a multiple of NKV; a qkv row holds the NH query
 * heads, then the NKV key heads, then the NKV value heads, and query head h attends with KV head
 * h / (NH / NKV) (no repeated copy). NKV == NH is multi-head attention, (B,T,3,NH,HS). */
void l3d_be_attention_forward(struct l3d_backend *be, enum l3d_dtype dt, void *out, float *lse,
                              const void *qkv, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                              int64_t HS);
/* dqkv (B,T,NH+2*NKV,HS) += */
void l3d_be_attention_backward(struct l3d_backend *be, enum l3d_dtype dt, void *dqkv,
                               const void *dout, const void *qkv, const void *out,
                               const float *lse, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                               int64_t HS);
/* The pair's types with a context (ctx) in place of the backend: a backend's kernels
 * (src/backend/backend-impl.h), or what runs in their place (struct l3d_model_hooks' context
 * parallelism). */
typedef void l3d_attention_forward_fn(void *ctx, enum l3d_dtype dt, void *out, float *lse,
                                      const void *qkv, int64_t B, int64_t T, int64_t NH,
                                      int64_t NKV, int64_t HS);
typedef void l3d_attention_backward_fn(void *ctx, enum l3d_dtype dt, void *dqkv, const void *dout,
                                       const void *qkv, const void *out, const float *lse,
                                       int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS);
/* The materialising kernel pair, att (B,NH,T,T) the probabilities, datt (B,NH,T,T) scratch: the
 * oracle the tiled kernel is benchmarked against (L3D_ATTENTION=naive); NULL in a backend
 * without it (the call aborts). */
void l3d_be_attention_naive_forward(struct l3d_backend *be, enum l3d_dtype dt, void *out,
                                    void *att, const void *qkv, int64_t B, int64_t T, int64_t NH,
                                    int64_t NKV, int64_t HS);
void l3d_be_attention_naive_backward(struct l3d_backend *be, enum l3d_dtype dt, void *dqkv,
                                     void *datt, const void *dout, const void *qkv,
                                     const void *att, int64_t B, int64_t T, int64_t NH,
                                     int64_t NKV, int64_t HS);
/* Attention of n new rows at positions pos..pos+n-1 over a key/value cache (generation):
 * out (n, NH*HS) = softmax(q k^T / sqrt(HS)) v over cached positions 0..pos+i for row i; q (n)
 * rows of q_stride elements (query heads at h*HS); k, v (pos+n) rows of kv_stride elements (the
 * NKV key/value heads at g*HS; query head h reads head h / (NH / NKV)). */
void l3d_be_attention_cached(struct l3d_backend *be, enum l3d_dtype dt, void *out, const void *q,
                             const void *k, const void *v, int64_t pos, int64_t n, int64_t NH,
                             int64_t NKV, int64_t HS, int64_t q_stride, int64_t kv_stride);
/* Block attention for context parallelism (ring attention, docs/DESIGN.md "Context
 * parallelism"): the queries of one chunk of each sequence against the keys and values of another
 * chunk, both at absolute positions, with grouped-query heads (query head h reads key/value head
 * h / (NH / NKV); GPT-2: NKV = NH). Key j is visible to query i when k_pos + j <= q_pos + i:
 * causal when the chunks overlap, full when the key chunk lies entirely before. The key chunk
 * must not start after the query chunk (k_pos <= q_pos: every query row then sees a key; a chunk
 * entirely after is the caller's to skip). Strides are in elements (lse: floats); q and dq share
 * q_rs / q_bs, k, v, dk, dv share kv_*, out, dout and merge's out2 share o_*, lse and lse2
 * lse_hs / lse_bs; heads at h HS within a row (k, v: g HS). Every kernel takes fp32, bf16, fp16
 * (arithmetic fp32, lse fp32). */
struct l3d_attn_block {
    int64_t B, NH, NKV, HS;   /* sequences, query heads, key/value heads (NKV divides NH) */
    int64_t nq, nk;           /* query rows, key rows of each sequence */
    int64_t q_pos, k_pos;     /* absolute position of the first query row, first key row */
    int64_t q_rs, q_bs;       /* q, dq: row and sequence strides */
    int64_t kv_rs, kv_bs;     /* k, v, dk, dv */
    int64_t o_rs, o_bs;       /* out, dout, out2 */
    int64_t lse_hs, lse_bs;   /* lse (and lse2): head and sequence strides; row i at + i */
    bool p16;                 /* the numerics of the backend's bf16 attention where it rounds P
                               * and dS to bf16 (l3d_be_attention_p16(bf16)), also in an fp32
                               * kernel: the fp32 ring of a bf16 model (cp.c) */
};
/* out (B,nq,NH,HS) = softmax over the visible keys of q k^T / sqrt(HS), times v; lse (B,NH,nq)
 * the log-sum-exp of each row's visible scaled scores (FlashAttention's forward on one block). */
void l3d_be_attention_block_forward(struct l3d_backend *be, enum l3d_dtype dt, void *out,
                                    float *lse, const void *q, const void *k, const void *v,
                                    const struct l3d_attn_block *g);
/* Two partial results over disjoint key sets merged into (out, lse): with L = log(e^lse +
 * e^lse2), out = out e^(lse - L) + out2 e^(lse2 - L), lse = L (the online softmax's rescaling;
 * an -inf lse contributes nothing). Only B, NH, HS, nq and the out / lse strides are read. */
void l3d_be_attention_merge(struct l3d_backend *be, enum l3d_dtype dt, void *out, float *lse,
                            const void *out2, const float *lse2, const struct l3d_attn_block *g);
/* The block's share of the gradients (FlashAttention-2's backward with the FINAL out and lse of
 * each query row, over all its key chunks): dq, dk, dv +=. P = exp(s - lse) is then the block of
 * the full softmax, and D = rowsum(dout * out) the full row's. */
void l3d_be_attention_block_backward(struct l3d_backend *be, enum l3d_dtype dt, void *dq,
                                     void *dk, void *dv, const void *dout, const void *q,
                                     const void *k, const void *v, const void *out,
                                     const float *lse, const struct l3d_attn_block *g);
/* RMSNorm (Zhang & Sennrich 2019, eq. 4): out (N,C) = inp * rstd * weight, with rstd (N) fp32
 * = 1 / sqrt(mean over C of inp^2 + eps), saved for backward (no mean, no bias). */
void l3d_be_rmsnorm_forward(struct l3d_backend *be, enum l3d_dtype dt, void *out, float *rstd,
                            const void *inp, const void *weight, int64_t N, int64_t C, float eps);
/* dinp (N,C) += and dweight (C, type gdt: dt or L3D_F32 main_grad) +=, from dout, inp, weight and
 * the saved rstd; either may be NULL. */
void l3d_be_rmsnorm_backward(struct l3d_backend *be, enum l3d_dtype dt, enum l3d_dtype gdt,
                             void *dinp, void *dweight, const void *dout, const void *inp,
                             const void *weight, const float *rstd, int64_t N, int64_t C);
/* Rotary position embedding (Su et al. 2021) in Hugging Face's rotate-half form, in place on the
 * NH query heads and NKV key heads of each row of qkv (B,T,NH+2*NKV,HS) (the values are not
 * touched): in each head, pair (i, i + HS/2) for i < HS/2 turns by the angle
 * a = pos[t] * inv_freq[i]: (x_i, x_j) -> (x_i cos a - x_j sin a, x_j cos a + x_i sin a).
 * inv_freq (HS/2 fp32, device memory: l3d_rope_inv_freq's values), pos (T int32 positions,
 * device memory, any values: the same for every sequence of the batch). HS even.
 * rope_backward, in place on dqkv: the inverse rotation (the transpose) of its query and key
 * gradients, which turns d(rotated) into d(qkv before rope). */
void l3d_be_rope_forward(struct l3d_backend *be, enum l3d_dtype dt, void *qkv,
                         const float *inv_freq, const int32_t *pos, int64_t B, int64_t T,
                         int64_t NH, int64_t NKV, int64_t HS);
void l3d_be_rope_backward(struct l3d_backend *be, enum l3d_dtype dt, void *dqkv,
                          const float *inv_freq, const int32_t *pos, int64_t B, int64_t T,
                          int64_t NH, int64_t NKV, int64_t HS);
/* SwiGLU (Shazeer 2020): inp (N,2H) holds [gate | up] in each row (the fused product of the
 * gate and up rows); out (N,H) = silu(gate) * up, silu(g) = g / (1 + e^-g). Backward: dinp
 * (N,2H) += the gradients of both halves. */
void l3d_be_swiglu_forward(struct l3d_backend *be, enum l3d_dtype dt, void *out, const void *inp,
                           int64_t N, int64_t H);
void l3d_be_swiglu_backward(struct l3d_backend *be, enum l3d_dtype dt, void *dinp,
                            const void *dout, const void *inp, int64_t N, int64_t H);
void l3d_be_gelu_forward(struct l3d_backend *be, enum l3d_dtype dt, void *out, const void *inp,
                         int64_t N);
void l3d_be_gelu_backward(struct l3d_backend *be, enum l3d_dtype dt, void *dinp, const void *dout,
                          const void *inp, int64_t N);
void l3d_be_residual_forward(struct l3d_backend *be, enum l3d_dtype dt, void *out, const void *a,
                             const void *b, int64_t N);
void l3d_be_add_inplace(struct l3d_backend *be, enum l3d_dtype dt, void *dst, const void *src,
                        int64_t N);
/* The residual add and the normalisation after it in one pass over the rows (the backends'
 * fused kernel; residual_forward then the norm where a backend has none): res (N,C) = a + b,
 * rounded to dt, then out (N,C) = LayerNorm(res) with mean, rstd (N) fp32 saved (layernorm), or
 * RMSNorm(res) with rstd (rmsnorm), exactly as l3d_be_residual_forward followed by
 * l3d_be_layernorm_forward / l3d_be_rmsnorm_forward on res compute them (the same bits; the
 * pair stays, the tests' oracle). res may be a; out is neither. Its backward needs no fused
 * kernel: the norm's backward accumulates (+=) into the residual's gradient. */
void l3d_be_residual_layernorm_forward(struct l3d_backend *be, enum l3d_dtype dt, void *res,
                                       void *out, float *mean, float *rstd, const void *a,
                                       const void *b, const void *weight, const void *bias,
                                       int64_t N, int64_t C);
void l3d_be_residual_rmsnorm_forward(struct l3d_backend *be, enum l3d_dtype dt, void *res,
                                     void *out, float *rstd, const void *a, const void *b,
                                     const void *weight, int64_t N, int64_t C, float eps);

/* out (N,C) += bias (C) on every row. */
void l3d_be_add_bias(struct l3d_backend *be, enum l3d_dtype dt, void *out, const void *bias,
                     int64_t N, int64_t C);

/* ---- mixture of experts (include/llm3d/model.h, struct l3d_moe_spec) ----------------------
 * N tokens, C channels, E experts, K choices a token; R rows in expert order (at most N K).
 * Whether the backend has these kernels (the model refuses MoE layers on one that has not). */
bool l3d_be_has_moe(const struct l3d_backend *be);
/* The router, fp32 whatever dt: logits (N,E) = inp (N,C) weight (E,C)^T summed in fp32;
 * probs (N,E) their softmax, lse (N) their log-sum-exp; idx (N,K) each token's K most probable
 * experts, most probable first (ties: the lower expert index first); wts (N,K) their
 * probabilities, divided by their sum when norm_topk. Then the assignments (n,k) in expert order,
 * a stable counting sort: offsets (E+1, int32) where each expert's rows start, pos (N,K, int32)
 * the row of assignment (n,k), token order within an expert, or -1 when dropped: with
 * capacity > 0 an expert keeps its first `capacity` assignments in token order. The tokens are
 * segs equal segments (1: all of them), and with fill (segs,E, int32; NULL: zeros) expert e's
 * count of segment s starts at fill[s E + e], the assignments before it that live elsewhere (a
 * context-parallel ring's other chunks), so an assignment is kept while that count plus the
 * expert's assignments before it in its segment is under the capacity. stats (2E+2,
 * fp32) = [assignments each expert was routed before drops (E), its probabilities summed over
 * the tokens (E), the sum over tokens of lse^2, assignments dropped]: the counts are exact integers
 * in the sort (work), their fp32 copies in stats round above 2^24. work (3E, int32): the caller's
 * scratch for the counts (allocated once with the MoE layers' buffers: the
 * kernel allocates nothing). N K must be below 2^31 (int32 rows). forced (N,K, int32, device;
 * NULL: the top-k) replaces the selection (--moe-force-balance, benchmarking only): idx = forced,
 * K distinct experts in 0..E-1 a token, the weights still the router's probabilities at them
 * (renormalised when norm_topk); probs, lse, the sort, the capacity and stats as above. */
void l3d_be_moe_route(struct l3d_backend *be, enum l3d_dtype dt, float *probs, float *lse,
                      int32_t *idx, float *wts, int32_t *pos, int32_t *offsets, float *stats,
                      int32_t *work, const void *inp, const void *weight, int64_t N, int64_t C,
                      int64_t E, int64_t K, int norm_topk, int64_t capacity,
                      const int32_t *fill, int64_t segs, const int32_t *forced);
/* rows (R,C): row pos[n,k] = inp[n] for each kept assignment (the gather into expert order). */
void l3d_be_moe_permute(struct l3d_backend *be, enum l3d_dtype dt, void *rows, const void *inp,
                        const int32_t *pos, int64_t N, int64_t K, int64_t C);
/* out (N,C) += sum over the kept k of wts[n,k] rows[pos[n,k]] (wts NULL: weight 1, which is the
 * permute's backward), summed in fp32 with out's value and rounded once. */
void l3d_be_moe_combine(struct l3d_backend *be, enum l3d_dtype dt, void *out, const void *rows,
                        const int32_t *pos, const float *wts, int64_t N, int64_t K, int64_t C);
/* combine's backward: drows (R,C) row pos[n,k] = wts[n,k] dout[n] (=, every kept row), dwts
 * (N,K, fp32) = dout[n] . rows[pos[n,k]] (=, 0 for a dropped assignment). */
void l3d_be_moe_combine_backward(struct l3d_backend *be, enum l3d_dtype dt, void *drows,
                                 float *dwts, const void *dout, const void *rows,
                                 const int32_t *pos, const float *wts, int64_t N, int64_t K,
                                 int64_t C);
/* The router's backward: dlogits (N,E, fp32, =) from dwts (N,K) through the renormalisation
 * (norm_topk) and the softmax, with the load-balancing loss's gradient aux_scale x stats[e] added
 * to each probability's and the z-loss's z_scale x lse[n] x probs[n,e] to each logit's; then
 * dinp (N,C, dt, NULL: none) += dlogits weight and dweight (E,C, type gdt) += dlogits^T inp. */
void l3d_be_moe_router_backward(struct l3d_backend *be, enum l3d_dtype dt, enum l3d_dtype gdt,
                                void *dinp, void *dweight, float *dlogits, const float *dwts,
                                const void *inp, const void *weight, const float *probs,
                                const float *lse, const int32_t *idx, const float *wts,
                                const float *stats, int64_t N, int64_t C, int64_t E, int64_t K,
                                int norm_topk, float aux_scale, float z_scale);

void l3d_be_xent_max(struct l3d_backend *be, enum l3d_dtype dt, float *maxv, const void *logits,
                     int64_t N, int64_t Vl, int64_t Vvalid);
void l3d_be_xent_sumexp(struct l3d_backend *be, enum l3d_dtype dt, float *sumexp, float *tlogit,
                        const void *logits, const float *maxv, const int32_t *targets,
                        int64_t vocab_start, int64_t N, int64_t Vl, int64_t Vvalid);
/* l3d_be_xent_max and l3d_be_xent_sumexp fused: one read of the logits instead of two where the
 * backend has the fused kernel (the pair otherwise), the same bits; only for logits that hold
 * the whole vocabulary (a vocabulary-parallel model all-reduces the max between the two). */
void l3d_be_xent_stats(struct l3d_backend *be, enum l3d_dtype dt, float *maxv, float *sumexp,
                       float *tlogit, const void *logits, const int32_t *targets,
                       int64_t vocab_start, int64_t N, int64_t Vl, int64_t Vvalid);
void l3d_be_xent_backward(struct l3d_backend *be, enum l3d_dtype dt, void *logits,
                          const float *maxv, const float *sumexp, const int32_t *targets,
                          float dloss, int64_t vocab_start, int64_t N, int64_t Vl, int64_t Vvalid);
/* losses (N) = log(sumexp) + maxv - tlogit, each token's loss; *loss_sum (one device double)
 * += their sum, in token order. */
void l3d_be_xent_loss(struct l3d_backend *be, float *losses, double *loss_sum, const float *maxv,
                      const float *sumexp, const float *tlogit, int64_t N);
/* fp32 parameters and gradients (dt = L3D_F32); m and v are fp32. Mixed precision:
 * l3d_be_adamw_mixed. */
void l3d_be_adamw(struct l3d_backend *be, enum l3d_dtype dt, void *param, float *m, float *v,
                  const void *grad, float grad_scale, int64_t n, float lr, float beta1,
                  float beta2, float eps, float wd, float bc1, float bc2);
/* *acc (one device double) += sum of x[i]^2 over n elements, accumulated in double. */
void l3d_be_sumsq(struct l3d_backend *be, enum l3d_dtype dt, double *acc, const void *x,
                  int64_t n);

/* ---- mixed precision ------------------------------------------------------------------------
 * Every kernel above also takes dt = L3D_BF16 or L3D_F16 (except adamw, which is fp32 only, and
 * the naive attention pair, an fp32 oracle): activations and parameters are stored in 16 bits,
 * the arithmetic is fp32 (Megatron-LM's mixed precision, Micikevicius et al. 2018): LayerNorm
 * statistics, softmax, cross-entropy, GELU and every reduction accumulate in fp32, mean, rstd,
 * lse, maxv, sumexp stay fp32, and each 16-bit output is rounded once, to nearest even. Matrix
 * products: oneDNN's bf16 matmul (fp32 accumulation) where the CPU has it; otherwise, and for fp16
 * on every CPU here, the operands are converted to fp32 around the fp32 product.
 *
 *   l3d_be_matmul_forward(be, L3D_BF16, out16, inp16, w16, b16, N, C, OC);
 *   l3d_be_matmul_backward_mixed(be, L3D_BF16, L3D_F32, dinp16, main_grad_w, main_grad_b, ...);
 *   l3d_be_unscale(be, L3D_F32, found_inf, main_grad, 1.0f / loss_scale, n);  // fp16 only
 *   l3d_be_adamw_mixed(be, L3D_BF16, L3D_F32, w16, master, m, v, main_grad, clip, n, ...);
 *
 * The _mixed backward kernels take gdt, the type of the parameter gradients they accumulate
 * into: dt, or L3D_F32 for Megatron's fp32 `main_grad` buffer (accumulated across micro-batches
 * without 16-bit rounding). The plain backward kernels are the _mixed ones with gdt = dt. */
void l3d_be_matmul_backward_mixed(struct l3d_backend *be, enum l3d_dtype dt, enum l3d_dtype gdt,
                                  void *dinp, void *dweight, void *dbias, const void *dout,
                                  const void *inp, const void *weight, int64_t N, int64_t C,
                                  int64_t OC);
void l3d_be_encoder_backward_mixed(struct l3d_backend *be, enum l3d_dtype dt, enum l3d_dtype gdt,
                                   void *dwte, void *dwpe, const void *dout,
                                   const int32_t *tokens, int64_t vocab_start,
                                   int64_t vocab_count, int64_t B, int64_t T, int64_t C);
void l3d_be_layernorm_backward_mixed(struct l3d_backend *be, enum l3d_dtype dt,
                                     enum l3d_dtype gdt, void *dinp, void *dweight, void *dbias,
                                     const void *dout, const void *inp, const void *weight,
                                     const float *mean, const float *rstd, int64_t N, int64_t C);
/* AdamW on the fp32 master weights (n): master, m, v updated as l3d_be_adamw does with the
 * gradient grad (type gdt: L3D_F32 main_grad, or the 16-bit dt) times grad_scale, then param
 * (type dt, may be NULL) = master rounded to dt: the optimizer's step and the copy to the model's
 * 16-bit weights in one pass. */
void l3d_be_adamw_mixed(struct l3d_backend *be, enum l3d_dtype dt, enum l3d_dtype gdt,
                        void *param, float *master, float *m, float *v, const void *grad,
                        float grad_scale, int64_t n, float lr, float beta1, float beta2,
                        float eps, float wd, float bc1, float bc2);
/* The optimizer's step and the next step's gradient zeroing in one pass: with master NULL,
 * l3d_be_adamw (dt = gdt = L3D_F32, param the fp32 weights), else l3d_be_adamw_mixed; then
 * grad (n, type gdt) = 0, each element written as soon as it is read (ZeRO's and the pipeline's
 * optimizer ranges zero the rest of the gradient buffer with l3d_be_memset). Bit-identical to
 * the pair of kernels and the memset, which is what a backend without the fused kernel runs. */
void l3d_be_adamw_zero(struct l3d_backend *be, enum l3d_dtype dt, enum l3d_dtype gdt, void *param,
                       float *master, float *m, float *v, void *grad, float grad_scale, int64_t n,
                       float lr, float beta1, float beta2, float eps, float wd, float bc1,
                       float bc2);
/* dst (n, type dst_t) = src (n, type src_t), for fp32, bf16, fp16: to 16 bits rounded to nearest
 * even (fp16: Inf from 65520 up), to fp32 exact. The buffers must not overlap unless equal. */
void l3d_be_convert(struct l3d_backend *be, enum l3d_dtype dst_t, void *dst, enum l3d_dtype src_t,
                    const void *src, int64_t n);
/* Loss-scaling check (fp16): *found_inf (one device float) = 1 when any of x (n, type dt) is Inf
 * or NaN, else left as it is (so one flag collects many buffers, then is all-reduced with MAX);
 * then x *= inv_scale in place (rounded to dt) unless inv_scale is 1. */
void l3d_be_unscale(struct l3d_backend *be, enum l3d_dtype dt, float *found_inf, void *x,
                    float inv_scale, int64_t n);

/* Measured peaks of this CPU with the current OpenMP thread count, in FLOP/s, over about
 * `seconds`: fp32 FMA throughput (independent AVX-512, else AVX2, fused multiply-adds on every
 * thread: the peak MFU is quoted against), and dnnl_sgemm on an M x N x K product. */
double l3d_cpu_fma_peak(double seconds);
/* bf16 dot products (AVX512-BF16 vdpbf16ps, fp32 accumulation, 4 FLOPs a lane) on every thread;
 * 0 when the CPU has no AVX512-BF16. */
double l3d_cpu_bf16_peak(double seconds);
double l3d_cpu_sgemm_flops(int64_t M, int64_t N, int64_t K, double seconds);
/* Memory bandwidth in bytes/s reached by STREAM's triad (a = b + s c, 12 bytes an element) over
 * three arrays of `bytes` in all (make it much larger than the caches) with the current OpenMP
 * thread count: the best pass of those run in about `seconds` (at least 4). One pass over
 * caller's arrays of n elements, in seconds: l3d_cpu_triad_pass (to interleave with other
 * measurements on a machine whose bandwidth varies). */
double l3d_cpu_triad_bw(size_t bytes, double seconds);
double l3d_cpu_triad_pass(float *a, const float *b, const float *c, int64_t n);

#endif
