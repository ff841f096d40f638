/*
 * The backend table behind the opaque struct l3d_backend (include/llm3d/backend.h): what a
 * backend implements. Only src/backend/ includes this file. Every entry takes the backend's own
 * context; pointers are device memory of that backend, sizes and shapes as documented per kernel.
 * Kernels take the element type dt of the floating-point activations and parameters; an entry
 * refuses a dtype it has no variant for (l3d_backend_no_variant). NULL is allowed for the
 * optional entries marked so.
 */
#ifndef LLM3D_BACKEND_IMPL_H
#define LLM3D_BACKEND_IMPL_H

#include <stdbool.h>

#include "llm3d/backend.h"

struct l3d_event {
    struct l3d_backend *be;
    void *impl;    /* the backend's own event, if it has one */
    bool recorded;
};

struct l3d_backend_i {
    const char *name;
    void (*free)(void *ctx);

    /* ---- memory: device buffers, accounted in l3d_mem_used ---- */
    void *(*alloc)(void *ctx, size_t bytes, const char *what); /* NULL when out of memory */
    void (*dfree)(void *ctx, void *p);
    void (*memset)(void *ctx, void *dst, int value, size_t bytes);
    void (*copy_h2d)(void *ctx, void *dst, const void *src, size_t bytes);
    void (*copy_d2h)(void *ctx, void *dst, const void *src, size_t bytes);
    void (*copy_d2d)(void *ctx, void *dst, const void *src, size_t bytes); /* may overlap */
    void (*sync)(void *ctx);
    /* optional (NULL: the backend is synchronous, so a recorded event is always complete) */
    void (*event_record)(void *ctx, struct l3d_event *ev);
    void (*event_wait)(void *ctx, struct l3d_event *ev);
    /* optional: releases ev->impl (l3d_be_event_free), NULL when events have none */
    void (*event_destroy)(void *ctx, struct l3d_event *ev);
    double (*peak_flops)(void *ctx, enum l3d_dtype t);
    /* whether products in t run in t itself (no fp32 copies of their operands) */
    bool (*matmul_native)(void *ctx, enum l3d_dtype t);
    /* optional (NULL: no): whether attention in t runs its products as t's own matmuls */
    bool (*attention_native)(void *ctx, enum l3d_dtype t);
    /* optional (NULL: no): l3d_be_attention_p16 */
    bool (*attention_p16)(void *ctx, enum l3d_dtype t, int64_t HS);
    /* optional (NULL: 0): l3d_be_matmul_wgrad_block */
    int64_t (*matmul_wgrad_block)(void *ctx, enum l3d_dtype t);
    /* host-accessible address of device memory (NULL: not reachable from the host) */
    void *(*host_view)(void *ctx, const void *p, size_t bytes);

    /* ---- kernels ---- */
    /* out (N,OC) = inp (N,C) @ weight (OC,C)^T + bias (OC); bias may be NULL. */
    void (*matmul_forward)(void *ctx, enum l3d_dtype dt, void *out, const void *inp,
                           const void *weight, const void *bias, int64_t N, int64_t C, int64_t OC);
    /* dinp (N,C) += dout (N,OC) @ weight (OC,C); dweight (OC,C) += dout^T @ inp (N,C);
     * dbias (OC) += column sums of dout. dweight and dbias have type gdt (dt, or L3D_F32). */
    void (*matmul_backward)(void *ctx, enum l3d_dtype dt, enum l3d_dtype gdt, void *dinp,
                            void *dweight, void *dbias, const void *dout, const void *inp,
                            const void *weight, int64_t N, int64_t C, int64_t OC);
    /* out (B,T,C) = wte[tok - vocab_start] for tokens in [vocab_start, vocab_start+vocab_count),
     * zero for the others (vocabulary-parallel lookup), plus wpe[t] when wpe is not NULL.
     * tokens (B,T), wte (vocab_count,C), wpe (>=T,C). */
    void (*encoder_forward)(void *ctx, enum l3d_dtype dt, void *out, const int32_t *tokens,
                            const void *wte, const void *wpe, int64_t vocab_start,
                            int64_t vocab_count, int64_t B, int64_t T, int64_t C);
    /* dwte (vocab_count,C) += dout rows of the tokens in range; dwpe (>=T,C) += sum over B;
     * both of type gdt. */
    void (*encoder_backward)(void *ctx, enum l3d_dtype dt, enum l3d_dtype gdt, void *dwte,
                             void *dwpe, const void *dout, const int32_t *tokens,
                             int64_t vocab_start, int64_t vocab_count, int64_t B, int64_t T,
                             int64_t C);
    /* out (N,C) = (inp - mean) * rstd * weight + bias; mean, rstd (N) fp32, saved for backward. */
    void (*layernorm_forward)(void *ctx, enum l3d_dtype dt, void *out, float *mean, float *rstd,
                              const void *inp, const void *weight, const void *bias, int64_t N,
                              int64_t C);
    /* dweight, dbias of type gdt */
    void (*layernorm_backward)(void *ctx, enum l3d_dtype dt, enum l3d_dtype gdt, void *dinp,
                               void *dweight, void *dbias, const void *dout, const void *inp,
                               const void *weight, const float *mean, const float *rstd,
                               int64_t N, int64_t C);
    /* Causal self-attention over NH query heads of size HS (the heads of this shard), tiled
     * (FlashAttention), with NKV key/value heads (grouped-query attention; NH a multiple of NKV,
     * query head h reads KV head h / (NH / NKV); NKV == NH: multi-head). qkv (B,T,NH+2*NKV,HS):
     * the queries, then the keys, then the values of a row (for NKV == NH: (B,T,3,NH,HS)); out
     * (B,T,NH,HS); lse (B,NH,T) fp32: log sum_j exp(s_ij) of each row's scores
     * s = q k^T / sqrt(HS), saved for backward. */
    l3d_attention_forward_fn *attention_forward;
    /* dqkv (B,T,NH+2*NKV,HS) += ..., the scores recomputed block by block from qkv, out, lse. */
    l3d_attention_backward_fn *attention_backward;
    /* optional: the materialising pair, the benchmark's and tests' oracle. att (B,NH,T,T) the
     * softmax probabilities (zero above the diagonal); datt (B,NH,T,T) scratch, overwritten. */
    void (*attention_naive_forward)(void *ctx, enum l3d_dtype dt, void *out, void *att,
                                    const void *qkv, int64_t B, int64_t T, int64_t NH,
                                    int64_t NKV, int64_t HS);
    void (*attention_naive_backward)(void *ctx, enum l3d_dtype dt, void *dqkv, void *datt,
                                     const void *dout, const void *qkv, const void *att,
                                     int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS);
    /* see l3d_be_attention_cached */
    void (*attention_cached)(void *ctx, enum l3d_dtype dt, void *out, const void *q,
                             const void *k, const void *v, int64_t pos, int64_t n, int64_t NH,
                             int64_t NKV, int64_t HS, int64_t q_stride, int64_t kv_stride);
    /* see l3d_be_attention_block_forward, _merge, _block_backward (context parallelism); the
     * geometry is checked by the dispatcher */
    void (*attention_block_forward)(void *ctx, enum l3d_dtype dt, void *out, float *lse,
                                    const void *q, const void *k, const void *v,
                                    const struct l3d_attn_block *g);
    void (*attention_merge)(void *ctx, enum l3d_dtype dt, void *out, float *lse,
                            const void *out2, const float *lse2, const struct l3d_attn_block *g);
    void (*attention_block_backward)(void *ctx, enum l3d_dtype dt, void *dq, void *dk, void *dv,
                                     const void *dout, const void *q, const void *k,
                                     const void *v, const void *out, const float *lse,
                                     const struct l3d_attn_block *g);
    /* RMSNorm (Zhang & Sennrich 2019): out (N,C) = inp * rstd * weight, rstd (N) fp32
     * = 1/sqrt(mean(inp^2) + eps), saved for backward. */
    void (*rmsnorm_forward)(void *ctx, enum l3d_dtype dt, void *out, float *rstd, const void *inp,
                            const void *weight, int64_t N, int64_t C, float eps);
    /* dinp (N,C) +=, dweight (C, type gdt) += */
    void (*rmsnorm_backward)(void *ctx, enum l3d_dtype dt, enum l3d_dtype gdt, void *dinp,
                             void *dweight, const void *dout, const void *inp,
                             const void *weight, const float *rstd, int64_t N, int64_t C);
    /* see l3d_be_rope_forward / l3d_be_rope_backward: in place on qkv (B,T,NH+2*NKV,HS) */
    void (*rope_forward)(void *ctx, enum l3d_dtype dt, void *qkv, const float *inv_freq,
                         const int32_t *pos, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                         int64_t HS);
    void (*rope_backward)(void *ctx, enum l3d_dtype dt, void *dqkv, const float *inv_freq,
                          const int32_t *pos, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                          int64_t HS);
    /* SwiGLU (Shazeer 2020): inp (N,2H) rows [gate | up], out (N,H) = silu(gate) * up;
     * backward dinp (N,2H) += */
    void (*swiglu_forward)(void *ctx, enum l3d_dtype dt, void *out, const void *inp, int64_t N,
                           int64_t H);
    void (*swiglu_backward)(void *ctx, enum l3d_dtype dt, void *dinp, const void *dout,
                            const void *inp, int64_t N, int64_t H);
    /* GELU, tanh approximation (Hendrycks & Gimpel 2016, eq. after 2). */
    void (*gelu_forward)(void *ctx, enum l3d_dtype dt, void *out, const void *inp, int64_t N);
    void (*gelu_backward)(void *ctx, enum l3d_dtype dt, void *dinp, const void *dout,
                          const void *inp, int64_t N);
    /* out (N) = a + b. Its backward is add_inplace twice. */
    void (*residual_forward)(void *ctx, enum l3d_dtype dt, void *out, const void *a, const void *b,
                             int64_t N);
    /* optional (NULL: residual_forward, then the norm): res (N,C) = a + b, then out (N,C) the
     * norm of res, LayerNorm (mean not NULL; weight, bias) or RMSNorm (mean NULL, bias NULL;
     * weight, eps), in one pass; the same bits as the pair. res may be a, not out. */
    void (*residual_norm_forward)(void *ctx, enum l3d_dtype dt, void *res, void *out, float *mean,
                                  float *rstd, const void *a, const void *b, const void *weight,
                                  const void *bias, int64_t N, int64_t C, float eps);
    /* dst (N) += src. */
    void (*add_inplace)(void *ctx, enum l3d_dtype dt, void *dst, const void *src, int64_t N);
    /* out (N,C) += bias (C) on every row. */
    void (*add_bias)(void *ctx, enum l3d_dtype dt, void *out, const void *bias, int64_t N,
                     int64_t C);
    /* mixture of experts: see l3d_be_moe_route and the others (include/llm3d/backend.h);
     * optional (NULL: the backend refuses MoE models) */
    void (*moe_route)(void *ctx, enum l3d_dtype dt, float *probs, float *lse, int32_t *idx,
                      float *wts, int32_t *pos, int32_t *offsets, float *stats, int32_t *work,
                      const void *inp, const void *weight, int64_t N, int64_t C, int64_t E,
                      int64_t K, int norm_topk, int64_t capacity, const int32_t *fill,
                      int64_t segs, const int32_t *forced);
    void (*moe_permute)(void *ctx, enum l3d_dtype dt, void *rows, const void *inp,
                        const int32_t *pos, int64_t N, int64_t K, int64_t C);
    void (*moe_combine)(void *ctx, enum l3d_dtype dt, void *out, const void *rows,
                        const int32_t *pos, const float *wts, int64_t N, int64_t K, int64_t C);
    void (*moe_combine_backward)(void *ctx, enum l3d_dtype dt, void *drows, float *dwts,
                                 const void *dout, const void *rows, const int32_t *pos,
                                 const float *wts, int64_t N, int64_t K, int64_t C);
    void (*moe_router_backward)(void *ctx, enum l3d_dtype dt, enum l3d_dtype gdt, void *dinp,
                                void *dweight, float *dlogits, const float *dwts,
                                const void *inp, const void *weight, const float *probs,
                                const float *lse, const int32_t *idx, const float *wts,
                                const float *stats, int64_t N, int64_t C, int64_t E, int64_t K,
                                int norm_topk, float aux_scale, float z_scale);
    /* Softmax cross-entropy over a slice of the vocabulary, in three passes so that the tensor-
     * parallel model can all-reduce between them (max, then sum of exponentials and target logit).
     * logits (N,Vl): columns [0,Vvalid) are real vocabulary entries vocab_start.., the rest
     * padding, which never wins and gets zero gradient. targets (N) are global token ids. */
    void (*xent_max)(void *ctx, enum l3d_dtype dt, float *maxv, const void *logits, int64_t N,
                     int64_t Vl, int64_t Vvalid);
    /* sumexp (N) = sum_j exp(logit_j - maxv); tlogit (N) = logit of the target if it lies in this
     * slice, else 0. */
    void (*xent_sumexp)(void *ctx, enum l3d_dtype dt, float *sumexp, float *tlogit,
                        const void *logits, const float *maxv, const int32_t *targets,
                        int64_t vocab_start, int64_t N, int64_t Vl, int64_t Vvalid);
    /* optional (NULL: xent_max, then xent_sumexp): both over each row while it is in cache, for
     * logits with the whole vocabulary (no all-reduce of the max between the two); the same bits
     * as the pair */
    void (*xent_stats)(void *ctx, enum l3d_dtype dt, float *maxv, float *sumexp, float *tlogit,
                       const void *logits, const int32_t *targets, int64_t vocab_start,
                       int64_t N, int64_t Vl, int64_t Vvalid);
    /* In place: logits (N,Vl) becomes dlogits = (softmax - onehot(target)) * dloss; padding 0. */
    void (*xent_backward)(void *ctx, enum l3d_dtype dt, void *logits, const float *maxv,
                          const float *sumexp, const int32_t *targets, float dloss,
                          int64_t vocab_start, int64_t N, int64_t Vl, int64_t Vvalid);
    /* losses (N) = log(sumexp) + maxv - tlogit; *loss_sum += their sum in token order. */
    void (*xent_loss)(void *ctx, float *losses, double *loss_sum, const float *maxv,
                      const float *sumexp, const float *tlogit, int64_t N);
    /* AdamW (Loshchilov & Hutter 2019) on n elements with gradient grad * grad_scale (gradient
     * clipping folded in): m, v (fp32) updated, param updated with
     * lr * (mhat / (sqrt(vhat) + eps) + wd * param); bc1 = 1 - beta1^t, bc2 = 1 - beta2^t. */
    void (*adamw)(void *ctx, enum l3d_dtype dt, void *param, float *m, float *v, const void *grad,
                  float grad_scale, int64_t n, float lr, float beta1, float beta2, float eps,
                  float wd, float bc1, float bc2);
    /* *acc += sum of squares of x (n), in double. */
    void (*sumsq)(void *ctx, enum l3d_dtype dt, double *acc, const void *x, int64_t n);
    /* see l3d_be_adamw_mixed, l3d_be_convert, l3d_be_unscale */
    void (*adamw_mixed)(void *ctx, enum l3d_dtype dt, enum l3d_dtype gdt, void *param,
                        float *master, float *m, float *v, const void *grad, float grad_scale,
                        int64_t n, float lr, float beta1, float beta2, float eps, float wd,
                        float bc1, float bc2);
    /* see l3d_be_adamw_zero: adamw (master NULL) or adamw_mixed, then grad = 0, one pass; NULL:
     * the two kernels and a memset */
    void (*adamw_zero)(void *ctx, enum l3d_dtype dt, enum l3d_dtype gdt, void *param,
                       float *master, float *m, float *v, void *grad, float grad_scale, int64_t n,
                       float lr, float beta1, float beta2, float eps, float wd, float bc1,
                       float bc2);
    void (*convert)(void *ctx, enum l3d_dtype dst_t, void *dst, enum l3d_dtype src_t,
                    const void *src, int64_t n);
    void (*unscale)(void *ctx, enum l3d_dtype dt, float *found_inf, void *x, float inv_scale,
                    int64_t n);
};

struct l3d_backend {
    const struct l3d_backend_i *i;
    void *ctx;
    struct l3d_kprof *prof; /* l3d_be_profile: NULL when off */
};

/* The CPU backend's MoE kernels (src/backend/cpu_moe.c), the table entries above. */
void l3d_cpu_moe_route(void *ctx, enum l3d_dtype dt, float *probs, float *lse, int32_t *idx,
                       float *wts, int32_t *pos, int32_t *offsets, float *stats, int32_t *work,
                       const void *inp, const void *weight, int64_t N, int64_t C, int64_t E,
                       int64_t K, int norm_topk, int64_t capacity, const int32_t *fill,
                       int64_t segs, const int32_t *forced);
/* Its stable counting sort of the n assignments idx (expert ids, 0 to E-1) into expert order, in
 * integers: work (3E) holds each expert's assignments (first E), offsets (E+1) where its kept
 * rows start, pos (n) each assignment's row or -1 (dropped: with capacity > 0 an expert keeps an
 * assignment while its count before it, from start[s E + e] (NULL: 0) at the start of each
 * segment s of `per` assignments, is under `capacity`); returns the assignments dropped. n below
 * 2^31. */
int64_t l3d_cpu_moe_sort(const int32_t *idx, int64_t n, int64_t E, int64_t capacity,
                         const int32_t *start, int64_t per, int32_t *work, int32_t *offsets,
                         int32_t *pos);
void l3d_cpu_moe_permute(void *ctx, enum l3d_dtype dt, void *rows, const void *inp,
                         const int32_t *pos, int64_t N, int64_t K, int64_t C);
void l3d_cpu_moe_combine(void *ctx, enum l3d_dtype dt, void *out, const void *rows,
                         const int32_t *pos, const float *wts, int64_t N, int64_t K, int64_t C);
void l3d_cpu_moe_combine_backward(void *ctx, enum l3d_dtype dt, void *drows, float *dwts,
                                  const void *dout, const void *rows, const int32_t *pos,
                                  const float *wts, int64_t N, int64_t K, int64_t C);
void l3d_cpu_moe_router_backward(void *ctx, enum l3d_dtype dt, enum l3d_dtype gdt, void *dinp,
                                 void *dweight, float *dlogits, const float *dwts,
                                 const void *inp, const void *weight, const float *probs,
                                 const float *lse, const int32_t *idx, const float *wts,
                                 const float *stats, int64_t N, int64_t C, int64_t E, int64_t K,
                                 int norm_topk, float aux_scale, float z_scale);

/* The CPU backend's implementation of one linear-layer product in dt (be: a cpu backend), `which`
 * 'f' forward, 'i' d(inp), 'w' d(weight) into fp32, for tests: oneDNN's name (e.g.
 * "brg:avx512_core_amx_bf16", "gemm:jit") or "widened" (fp32 products around converted
 * operands). Creates the primitive if the shape has none yet. */
const char *l3d_cpu_matmul_impl(struct l3d_backend *be, char which, enum l3d_dtype dt, int64_t N,
                                int64_t C, int64_t OC);

/* For backends: wraps a filled table and context into a handle (freed by l3d_backend_free). */
struct l3d_backend *l3d_backend_make(const struct l3d_backend_i *i, void *ctx);
/* Aborts: `kernel` of backend `be_name` has no variant for dtype dt. */
_Noreturn void l3d_backend_no_variant(const char *be_name, const char *kernel, enum l3d_dtype dt);

#endif
