/*
 * The CUDA kernels' launchers (src/backend/cuda_kernels.cu), called by the CUDA backend's table
 * (src/backend/cuda.c). Plain C types only, so that both the C side and nvcc's C++ read it: the
 * element type is an enum of its own, pointers are device memory, `stream` a cudaStream_t. Every
 * launcher enqueues on the stream and returns; semantics are those of the table entry of the same
 * name (src/backend/backend-impl.h), outputs of type gdt where the entry has one.
 */
#ifndef LLM3D_BACKEND_CUDA_KERNELS_H
#define LLM3D_BACKEND_CUDA_KERNELS_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- launch shapes (src/backend/cuda_host.c: host arithmetic, tested without a GPU) --------- */

struct l3d_cuda_launch {
    uint32_t blocks, threads; /* blocks 0: nothing to launch (n == 0) */
};
/* Elementwise kernels over n items, grid-stride: `threads` a block (a multiple of 32, <= 1024),
 * ceil(n / threads) blocks capped at max_blocks (the loop covers the rest). */
struct l3d_cuda_launch l3d_cuda_launch_1d(int64_t n, uint32_t threads, uint32_t max_blocks);
/* Kernels of one warp a row: `warps` warps a block, ceil(rows / warps) blocks (rows < 2^31 * warps,
 * asserted: CUDA's grid limit in x). */
struct l3d_cuda_launch l3d_cuda_launch_rows(int64_t rows, uint32_t warps);
/* Attention keeps a row of HS elements in a warp, ceil(HS / 32) in each lane's registers:
 * that count, or 0 when HS is not in 1..L3D_CUDA_MAX_HS (the kernel refuses the shape). */
#define L3D_CUDA_MAX_HS 256
int l3d_cuda_attn_per_lane(int64_t HS);

enum l3d_cuk_type { L3D_CUK_F32, L3D_CUK_BF16, L3D_CUK_F16 };

/* fixed grid of the two-pass reductions (sumsq): partials of one block each, then summed in
 * order by one block; `partials` holds L3D_CUK_PARTIALS doubles */
#define L3D_CUK_PARTIALS 1024

void l3d_cuk_encoder_forward(int dt, void *out, const int32_t *tokens, const void *wte,
                             const void *wpe, int64_t vocab_start, int64_t vocab_count, int64_t B,
                             int64_t T, int64_t C, void *stream);
/* dwte rows of the tokens in range, grouped on the device (no copy to the host): work is
 * l3d_cuk_encoder_backward_wte_bytes(BT, vocab_count) bytes of device scratch, 256-byte aligned.
 * Returns NULL, or the CUDA call that failed. BT < 2^31 (CUB's counts are int). */
size_t l3d_cuk_encoder_backward_wte_bytes(int64_t BT, int64_t vocab_count);
const char *l3d_cuk_encoder_backward_wte(int dt, int gdt, void *dwte, const void *dout,
                                         const int32_t *tokens, int64_t vocab_start,
                                         int64_t vocab_count, int64_t BT, int64_t C, void *work,
                                         size_t work_bytes, void *stream);
void l3d_cuk_encoder_backward_wpe(int dt, int gdt, void *dwpe, const void *dout, int64_t B,
                                  int64_t T, int64_t C, void *stream);
void l3d_cuk_layernorm_forward(int dt, void *out, float *mean, float *rstd, const void *inp,
                               const void *weight, const void *bias, int64_t N, int64_t C,
                               void *stream);
/* res (N,C) = a + b, then out its LayerNorm (mean not NULL) or RMSNorm (mean NULL, eps): one
 * warp a row, the pair's arithmetic */
void l3d_cuk_residual_norm_forward(int dt, void *res, void *out, float *mean, float *rstd,
                                   const void *a, const void *b, const void *weight,
                                   const void *bias, int64_t N, int64_t C, float eps,
                                   void *stream);
void l3d_cuk_layernorm_backward(int dt, int gdt, void *dinp, void *dweight, void *dbias,
                                const void *dout, const void *inp, const void *weight,
                                const float *mean, const float *rstd, int64_t N, int64_t C,
                                void *stream);
/* g (C, type gdt) += column sums of x (N,C) (a product's bias gradient) */
void l3d_cuk_colsum_add(int dt, int gdt, void *g, const void *x, int64_t N, int64_t C,
                        void *stream);
/* Attention's geometry, in elements (struct l3d_attn_block's, which every attention entry maps
 * to: l3d_cuda_attn_full / _cached / _block in cuda_host.h). B sequences, NH query heads of HS,
 * query head h reading key/value head h / grp; nq query rows, nk key rows; query row i sees the
 * keys 0..min(p0 + i, nk - 1) (p0 = q_pos - k_pos >= 0). Strides: q and dq rows qs apart,
 * sequences qb; k, v, dk, dv ks, kb; out, dout os, ob; lse head lh, sequence lb (row i at + i);
 * pointers at head 0 of row 0 of sequence 0. */
struct l3d_cuk_attn {
    int64_t B, NH, grp, HS, nq, nk, p0;
    int64_t qs, qb, ks, kb, os, ob, lh, lb;
};
/* out (=) and lse (=, may be NULL: the cached path) of every query row; HS <= L3D_CUDA_MAX_HS */
void l3d_cuk_attn_forward(int dt, void *out, float *lse, const void *q, const void *k,
                          const void *v, const struct l3d_cuk_attn *g, void *stream);
/* dq, dk, dv += from dout and the final out and lse of each row; D (B*NH*nq fp32) scratch */
void l3d_cuk_attn_backward(int dt, void *dq, void *dk, void *dv, const void *dout, const void *q,
                           const void *k, const void *v, const void *out, const float *lse,
                           float *D, const struct l3d_cuk_attn *g, void *stream);
/* (out, lse) merged with (out2, lse2), l3d_be_attention_merge's formula (reads B NH HS nq, the
 * out and lse strides) */
void l3d_cuk_attn_merge(int dt, void *out, float *lse, const void *out2, const float *lse2,
                        const struct l3d_cuk_attn *g, void *stream);
/* RMSNorm: rstd (N fp32) =, out (N,C) =; backward dinp +=, dweight (type gdt) += (either NULL) */
void l3d_cuk_rmsnorm_forward(int dt, void *out, float *rstd, const void *inp, const void *weight,
                             int64_t N, int64_t C, float eps, void *stream);
void l3d_cuk_rmsnorm_backward(int dt, int gdt, void *dinp, void *dweight, const void *dout,
                              const void *inp, const void *weight, const float *rstd, int64_t N,
                              int64_t C, void *stream);
/* RoPE in place on the NH + NKV query and key heads of qkv (B,T,NH+2*NKV,HS); sign 1 forward,
 * -1 backward (the inverse rotation); HS even */
void l3d_cuk_rope(int dt, void *qkv, const float *inv_freq, const int32_t *pos, int64_t B,
                  int64_t T, int64_t NH, int64_t NKV, int64_t HS, float sign, void *stream);
/* SwiGLU: out (N,H) = silu(gate) up (dinp NULL), or dinp (N,2H) += (out NULL) */
void l3d_cuk_swiglu(int dt, void *out, void *dinp, const void *dout, const void *inp, int64_t N,
                    int64_t H, void *stream);
/* op 0: out = gelu(a); 1: out += gelu'(a) * b; 2: out = a + b (out may be a) */
void l3d_cuk_elementwise(int op, int dt, void *out, const void *a, const void *b, int64_t N,
                         void *stream);
void l3d_cuk_add_bias(int dt, void *out, const void *bias, int64_t N, int64_t C, void *stream);
/* pass 0: max, 1: sumexp and tlogit, 2: backward in place */
void l3d_cuk_xent(int pass, int dt, void *logits, float *out, float *tlogit, const float *maxv,
                  const float *sumexp, const int32_t *targets, float dloss, int64_t vocab_start,
                  int64_t N, int64_t Vl, int64_t Vvalid, void *stream);
void l3d_cuk_xent_loss(float *losses, double *loss_sum, const float *maxv, const float *sumexp,
                       const float *tlogit, int64_t N, void *stream);
/* param (type dt, or NULL) = master after the update; grad of type gdt, written 0 as it is read
 * when zero */
void l3d_cuk_adamw(int dt, int gdt, void *param, float *master, float *m, float *v, void *grad,
                   bool zero, float grad_scale, int64_t n, float lr, float beta1, float beta2,
                   float eps, float wd, float bc1, float bc2, void *stream);
void l3d_cuk_sumsq(int dt, double *acc, const void *x, int64_t n, double *partials,
                   void *stream);
void l3d_cuk_convert(int dst_t, void *dst, int src_t, const void *src, int64_t n, void *stream);
void l3d_cuk_unscale(int dt, float *found_inf, void *x, float inv_scale, int64_t n, void *stream);

/* Mixture of experts (cuda_moe.cu), the table entries moe_route .. moe_router_backward. The
 * route's segs divides N; N K < 2^31, E <= 65535. */
void l3d_cuk_moe_route(int dt, float *probs, float *lse, int32_t *idx, float *wts, int32_t *pos,
                       int32_t *offsets, float *stats, const void *inp, const void *weight,
                       int64_t N, int64_t C, int64_t E, int64_t K, int norm_topk,
                       int64_t capacity, const int32_t *fill, int64_t segs,
                       const int32_t *forced, void *stream);
void l3d_cuk_moe_permute(int dt, void *rows, const void *inp, const int32_t *pos, int64_t N,
                         int64_t K, int64_t C, void *stream);
void l3d_cuk_moe_combine(int dt, void *out, const void *rows, const int32_t *pos,
                         const float *wts, int64_t N, int64_t K, int64_t C, void *stream);
void l3d_cuk_moe_combine_backward(int dt, void *drows, float *dwts, const void *dout,
                                  const void *rows, const int32_t *pos, const float *wts,
                                  int64_t N, int64_t K, int64_t C, void *stream);
void l3d_cuk_moe_router_backward(int dt, int gdt, void *dinp, void *dweight, float *dlogits,
                                 const float *dwts, const void *inp, const void *weight,
                                 const float *probs, const float *lse, const int32_t *idx,
                                 const float *wts, const float *stats, int64_t N, int64_t C,
                                 int64_t E, int64_t K, int norm_topk, float aux_scale,
                                 float z_scale, void *stream);

/* the last launch error as text, NULL when none (checked after each launch by cuda.c) */
const char *l3d_cuk_last_error(void);

#ifdef __cplusplus
}
#endif

#endif
