/*
 * QK-norm inside the model (src/model/qknorm.c), private to src/model/: Qwen3's per-head RMSNorm
 * of the queries and keys (include/llm3d/model.h, struct l3d_model_spec's qk_norm), which gpt.c
 * calls between the q|k|v product and RoPE, and its backward.
 */
#ifndef LLM3D_MODEL_QKNORM_H
#define LLM3D_MODEL_QKNORM_H

#include "llm3d/model.h"

/* Allocates m->qkn (nothing without qk_norm): the saved activations, one set per layer and
 * activation slot (one shared set under full recomputation), one layer's scratch and the row
 * maps. L3D_ERR_OOM, or L3D_ERR_ARG on a backend without the row gather / scatter kernels. */
l3d_status l3d_qknorm_init(struct l3d_gpt *m);
void l3d_qknorm_free(struct l3d_gpt *m);
/* Bytes l3d_qknorm_init allocates for micro-batches of (B, T) (0 without qk_norm). */
size_t l3d_qknorm_act_bytes(const struct l3d_model_spec *cfg, const struct l3d_shard *sh, int B,
                            int T, int act_slots, enum l3d_recompute recompute, enum l3d_dtype dt);
/* Local layer l: qkv (N rows of the local q|k|v) in place, its query and key heads normalised;
 * the rows before the norm and the norm's rstd kept for backward. */
void l3d_qknorm_forward(struct l3d_gpt *m, int l, void *qkv, int64_t N);
/* Its backward in place on dqkv (the gradient of the normalised rows, from RoPE's backward) to
 * the gradient of the product's output; the two weights' gradients += (summed over the
 * tensor-parallel group, whose ranks hold different heads). */
void l3d_qknorm_backward(struct l3d_gpt *m, int l, void *dqkv, int64_t N);
/* The KV-cache path (src/model/infer.c): N rows of qkv (row stride QKV: NH query heads then NKV
 * key heads of hd) normalised in place with layer l's weights; tmp (NH hd) and rstd (NH)
 * scratch. */
void l3d_qknorm_rows(const struct l3d_gpt *m, int l, void *qkv, int64_t N, int64_t QKV,
                     void *tmp, float *rstd);

#endif
