/*
 * llm3d tensor parallelism (Megatron-LM, Shoeybi et al. 2019): each rank of a TP group holds a
 * slice of every layer and the model's hooks sum the partial results over the group.
 *
 *   struct l3d_shard sh;
 *   if (l3d_tp_shard(&cfg, tp, tp_rank, sp, &sh) != L3D_OK) ...; // checks divisibility, no MPI
 *   l3d_gpt_init(&m, &cfg, &sh, be, B, T, grads);
 *   struct l3d_tp tpc;
 *   l3d_tp_attach(&tpc, m, topo.tp_comm, true);                // installs the TP hooks
 *   l3d_tp_gather(m, topo.tp_comm, m->params, full);           // the full model on TP rank 0
 *                                                              // (host memory)
 *
 * Slices of rank r of tp: heads [r NH/tp, (r+1) NH/tp) of QKV (column-parallel) and of the
 * attention output projection (row-parallel, its bias added by rank 0 only, after the sum);
 * columns [r 4C/tp, (r+1) 4C/tp) of the MLP up (column-parallel) and down (row-parallel)
 * projections; rows [r Vp/tp, (r+1) Vp/tp) of the tied token embedding / LM head (vocabulary-
 * parallel: each rank looks up its rows and the sum gives the embedding; each rank computes its
 * slice of the logits and the cross-entropy combines the slices by max and sum all-reduces).
 * LayerNorms, the position embedding and the row-parallel biases are replicated: every rank
 * computes the same gradient for them. E.g. GPT-2 124M, tp = 2: rank 1 holds heads 6-11, FFN
 * columns 1536-3071 and vocabulary rows 25152-50303 (all padding from 50257 on).
 */
#ifndef LLM3D_TP_H
#define LLM3D_TP_H

#include <stdbool.h>

#include "llm3d/comm.h"
#include "llm3d/model.h"

/* The shard of TP rank tp_rank (all layers, embedding and head), with sequence parallelism
 * (LayerNorm and residual regions split by rows, all-reduces become reduce-scatter + all-gather)
 * when asked. L3D_ERR_LAYOUT naming --tp when the heads, the FFN width or the padded vocabulary do
 * not divide by tp. */
l3d_status l3d_tp_shard(const struct l3d_model_spec *cfg, int tp, int tp_rank,
                        bool sequence_parallel, struct l3d_shard *out);
/* The TP hooks' state: the group and the one non-blocking sum in flight. */
struct l3d_tp {
    struct l3d_comm *comm;
    struct l3d_backend *be;   /* the model's: the hooks' buffers are its device memory */
    enum l3d_dtype act_dtype; /* the activations' element type (the model's dt) */
    l3d_req req;
    double comm_s; /* time inside TP communication calls, for the caller to read and reset */
    int64_t bytes; /* bytes summed (all-reduce payload) */
};

/* All-reduce payload of one micro-batch's forward and backward per TP rank, in bytes: per layer two
 * sums of the (B*T, C) activations in forward (attention and MLP outputs) and two of their input
 * gradients in backward, plus the embedding's sum and the head's input gradient, plus three (B*T)
 * vectors of the cross-entropy: 4 (4L + 2) B T C + 12 B T (Megatron-LM, Shoeybi et al. 2019, sec.
 * 3). A ring all-reduce moves 2 (tp - 1) / tp of the payload in and out of each rank. */
static inline double l3d_tp_bytes_per_micro(const struct l3d_model_spec *cfg, int B, int T) {
    return 4.0 * (4.0 * cfg->L + 2.0) * B * T * cfg->C + 12.0 * B * T;
}

/* Installs the hooks that sum (and max) over tp_comm (nothing when it has one rank); with overlap,
 * backward sums each input gradient non-blocking while the weight gradient computes. tp must
 * outlive the model's use of the hooks. */
void l3d_tp_attach(struct l3d_tp *tp, struct l3d_gpt *m, struct l3d_comm *tp_comm, bool overlap);
/* Whether tensor t is split over the TP group (else every TP rank holds the same copy). */
bool l3d_tp_tensor_split(int t);
/* Gathers a flat buffer laid out like the shard's parameters (the parameters themselves, or the
 * gradients: device memory of m's backend) from every rank of the TP group into full, host memory
 * in the full model's layout, on TP rank 0 (other ranks pass NULL). Collective over tp_comm.
 * L3D_ERR_OOM on every rank when rank 0 has no room for a shard's worth of staging (one on the
 * device to receive into, one on the host to lay out from). */
l3d_status l3d_tp_gather(const struct l3d_gpt *m, struct l3d_comm *tp_comm, const float *local,
                         float *full);

#endif
