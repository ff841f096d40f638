/*
 * Expert parallelism (docs/DESIGN.md "Expert parallelism"; --ep N): the ep consecutive ranks of a
 * data-parallel times context-parallel group (Megatron-Core's) split a mixture of experts' E
 * experts, E / ep each (l3d_shard_set_experts), and exchange token rows by all-to-all over
 * topo.ep_comm: each rank routes its own tokens,
 * dispatches their rows to the ranks holding their experts and takes the outputs back (the
 * model's ep_all_to_allv hook, src/model/moe.c). The experts' gradients are summed over
 * topo.edp_comm (l3d_dp_expert_groups), the rest over the DP x CP group as without experts.
 *
 *   l3d_shard_set_experts(&cfg, &sh, layout.ep, topo.ep_rank);   // before the model is built
 *   l3d_ep_attach(&ep, m, topo.ep_comm, topo.cp_comm);           // the hooks
 *   l3d_dp_expert_groups(&dp, topo.ep_comm, topo.edp_comm);
 */
#ifndef LLM3D_EP_H
#define LLM3D_EP_H

#include "llm3d/comm.h"
#include "llm3d/model.h"

/* The exchange's group and what it measured: seconds inside the all-to-alls and the bytes this
 * rank sent, for the caller to read and reset (a step's metrics: ep_comm_ms, ep_bytes). */
struct l3d_ep {
    struct l3d_comm *comm;
    double comm_s;
    int64_t bytes;
};

/* Installs m's all-to-all hook over ep_comm into ep (ep_comm NULL: ep = 1, nothing to install;
 * the model chunks of a rank may share one ep), and the sum of the router's expert counts over
 * tok_comm, the ranks that split each micro-batch's tokens (the context-parallel ring; NULL or
 * one rank: none). A dense model: nothing. */
void l3d_ep_attach(struct l3d_ep *ep, struct l3d_gpt *m, struct l3d_comm *ep_comm,
                   struct l3d_comm *tok_comm);

#endif
