/*
 * Tensor-parallel partial sums in fp32 (--tp-reduce-dtype fp32; src/model/tpsum.c), private to
 * src/model/: in 16-bit precision the row-parallel products' outputs and the column-parallel
 * products' input gradients are made, summed over the TP group and only then rounded to the
 * model's type, once, as one process rounds its whole sum. gpt.c calls these in place of its
 * 16-bit product and sum when l3d_tpsum_on.
 *
 *   l3d_tpsum_row_forward(m, out, inp, w, b, N, Cin);     // out = round(sum_tp(inp w^T) + b)
 *   l3d_tpsum_zero(m, N);                                  // backward: the fp32 sum = 0, then
 *   l3d_tpsum_dinp(m, r0, n, dout, w, C, OC, true);        // its rows r0.. += dout w, per chunk
 *   l3d_tpsum_reduce(m, dinp, N);                          // dinp = round(sum_tp(...))
 */
#ifndef LLM3D_MODEL_TPSUM_H
#define LLM3D_MODEL_TPSUM_H

#include "llm3d/model.h"

/* Allocates m->tp32 when l3d_tpsum_act_bytes is not 0 for the model's shard and type.
 * L3D_ERR_OOM naming the bytes. */
l3d_status l3d_tpsum_init(struct l3d_gpt *m);
void l3d_tpsum_free(struct l3d_gpt *m);
/* Bytes l3d_tpsum_init allocates for micro-batches of (B, T): 0 unless sh->tp_reduce_f32 and dt
 * is 16-bit. */
size_t l3d_tpsum_act_bytes(const struct l3d_model_spec *cfg, const struct l3d_shard *sh, int B,
                           int T, enum l3d_dtype dt);
/* Whether the TP sums of this model run in fp32 (m->tp32 allocated). */
bool l3d_tpsum_on(const struct l3d_gpt *m);
/* Row-parallel product and its sum: out (dt) = round(sum over TP of inp (N,Cin) w (C,Cin)^T + b),
 * the bias (may be NULL) once across the group; with sequence parallelism this rank's N / sp
 * rows of it (reduce-scattered), else all N. */
void l3d_tpsum_row_forward(struct l3d_gpt *m, void *out, const void *inp, const void *w,
                           const void *b, int64_t N, int64_t Cin);
/* Column-parallel input gradient: the fp32 sum's N rows zeroed; then rows [r0, r0 + n) of it
 * += dout (n,OC) w (OC,C) (w widened when widen_w: the first chunk of a weight; dout widened a
 * block of rows at a time when OC is wider than the layers' products: the head); then dinp (dt)
 * = round(sum over TP), this rank's N / sp rows with sequence parallelism, else all N. */
void l3d_tpsum_zero(struct l3d_gpt *m, int64_t N);
void l3d_tpsum_dinp(struct l3d_gpt *m, int64_t r0, int64_t n, const void *dout, const void *w,
                    int64_t C, int64_t OC, bool widen_w);
void l3d_tpsum_reduce(struct l3d_gpt *m, void *dinp, int64_t N);
/* l3d_tpsum_reduce in two halves, the sum running behind other work (the weight gradient's
 * product) through the hooks' non-blocking all-reduce: begin returns false, having begun
 * nothing, under SP or without that hook (then l3d_tpsum_reduce); end waits, then rounds. */
bool l3d_tpsum_reduce_begin(struct l3d_gpt *m, int64_t N);
void l3d_tpsum_reduce_end(struct l3d_gpt *m, void *dinp, int64_t N);

#endif
