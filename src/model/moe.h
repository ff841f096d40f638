/*
 * The mixture-of-experts block inside the model (src/model/moe.c), private to src/model/: what
 * gpt.c calls in place of a MoE layer's MLP. include/llm3d/model.h (struct l3d_moe_spec) says
 * what the block computes; docs/DESIGN.md "Mixture of experts" its data flow.
 */
#ifndef LLM3D_MODEL_MOE_H
#define LLM3D_MODEL_MOE_H

#include "llm3d/model.h"

/* The parameters of the model's MoE layers, with `experts` of each layer's experts counted, less
 * those of the dense MLPs they replace; 0 for a dense model. */
double l3d_moe_layer_param_delta(const struct l3d_model_spec *m, int experts);
/* Allocates m->moe (nothing for a dense model): the MoE layers' saved activations, one set per
 * MoE layer of the shard and activation slot (one shared set under full recomputation) and one
 * layer's backward scratch. L3D_ERR_OOM or L3D_ERR_ARG (a backend without the MoE kernels, a
 * layout the block does not run on) otherwise. */
l3d_status l3d_moe_init(struct l3d_gpt *m);
void l3d_moe_free(struct l3d_gpt *m);
/* Bytes l3d_moe_init allocates for micro-batches of (B, T) in precision dt, act_slots of them
 * kept at once. */
size_t l3d_moe_act_bytes(const struct l3d_model_spec *cfg, const struct l3d_shard *sh, int B,
                         int T, int act_slots, enum l3d_recompute recompute, enum l3d_dtype dt);
/* Local layer l's MoE block: out (N,C) = the routed experts' weighted sum plus the shared MLP,
 * from the layer's normalised input ln (N,C); counts its statistics when `count` (not in a
 * recomputation). */
void l3d_moe_forward(struct l3d_gpt *m, int l, void *out, const void *ln, int64_t N, bool count);
/* Its backward: dln (N,C) = the gradient of ln (=), the parameters' gradients +=, from dout
 * (N,C), with the auxiliary losses weighted as the micro-batch's mean loss (dloss N). */
void l3d_moe_backward(struct l3d_gpt *m, int l, void *dln, const void *dout, const void *ln,
                      int64_t N, float dloss);
/* Generation's MoE block (src/model/infer.c): one set of routing and rows for steps of up to Nmax
 * new tokens, made once (*out NULL for a model without MoE layers); the whole model in one
 * process. L3D_ERR_OOM or L3D_ERR_ARG (a backend without the MoE kernels) otherwise. */
struct l3d_moe_infer;
l3d_status l3d_moe_infer_init(struct l3d_moe_infer **out, const struct l3d_gpt *m, int64_t Nmax);
void l3d_moe_infer_free(struct l3d_moe_infer *w);
/* Layer l's block over N <= Nmax rows, as l3d_moe_forward computes it but dropless (no capacity:
 * Hugging Face's Mixtral and Qwen3-MoE keep every assignment) and counting nothing: out (N,C)
 * from the normalised ln (N,C). Allocates nothing. */
void l3d_moe_infer_forward(struct l3d_moe_infer *w, const struct l3d_gpt *m, int l, void *out,
                           const void *ln, int64_t N, int64_t pos0);
/* --moe-force-balance's rule (benchmarking only; include/llm3d/model.h, struct l3d_moe_spec):
 * idx (B T, K) the experts of the B x T rows of a micro-batch in MoE layer `layer` (the model's
 * index): the row at position t of sequence b goes to experts (layer + (b S + t) K + j) mod E,
 * j = 0..K-1, S the sequences' length: T, or T cp on a context-parallel ring, whose rank cp_rank
 * holds two chunks of T / 2 rows (l3d_cp_chunk_start); pos0 the first row's position (generation's
 * cache; 0 otherwise, and with cp > 1). So the micro-batch's rows in token order take the experts
 * in turn, whatever the layout: exactly balanced in a sequence when T K is a multiple of E. */
void l3d_moe_force_rows(int32_t *idx, int64_t E, int64_t K, int layer, int B, int64_t T,
                        int cp, int cp_rank, int64_t pos0);
/* A micro-batch of B rows split over a context-parallel ring of cp ranks (each row 2 cp chunks,
 * rank cp_rank holding two, l3d_cp_chunk_start): this rank's N = B T tokens' routing idx (N,K),
 * row-major with its two chunks in turn, counted into cnt (B, 2 cp, E; =, zeros elsewhere), so
 * that a sum over the ring gives every chunk's per-expert counts in the micro-batch's order. */
void l3d_moe_chunk_counts(float *cnt, const int32_t *idx, int64_t N, int64_t K, int64_t E,
                          int B, int cp, int cp_rank);
/* From the ring's summed counts cnt (which become their exclusive prefix in token order): fill
 * (2 B, E) the assignments to each expert before each of this rank's chunks, in its order. */
void l3d_moe_chunk_fills(int32_t *fill, float *cnt, int64_t E, int B, int cp, int cp_rank);

#endif
