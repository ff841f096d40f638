/* Expert parallelism's exchange (include/llm3d/ep.h): the model's all-to-all hook over the EP
 * group, blocking (the expert products need the rows; the watchdog bounds the wait), timed. */
#include "llm3d/ep.h"

static void ep_all_to_allv(void *ctx, const void *send, const int64_t *scounts,
                           const int64_t *sdispls, void *recv, const int64_t *rcounts,
                           const int64_t *rdispls, enum l3d_dtype dt) {
    struct l3d_ep *ep = ctx;
    struct l3d_comm *c = ep->comm;
    double t0 = l3d_time_s();
    struct l3d_doing was = l3d_comm_doing(c, "MoE dispatch or combine (all-to-all)", -1, -1);
    l3d_comm_all_to_allv(c, send, scounts, sdispls, recv, rcounts, rdispls, dt, NULL);
    l3d_comm_done(c, was);
    ep->comm_s += l3d_time_s() - t0;
    for (int q = 0; q < c->size; q++) /* what left this rank */
        if (q != c->rank) ep->bytes += scounts[q] * (int64_t)l3d_dtype_size(dt);
}

static void tok_sum(void *ctx, float *buf, int64_t n) {
    struct l3d_comm *c = ctx;
    struct l3d_doing was = l3d_comm_doing(c, "MoE expert counts (all-reduce)", -1, -1);
    l3d_comm_all_reduce(c, buf, n, L3D_F32, L3D_SUM, NULL);
    l3d_comm_done(c, was);
}

void l3d_ep_attach(struct l3d_ep *ep, struct l3d_gpt *m, struct l3d_comm *ep_comm,
                   struct l3d_comm *tok_comm) {
    if (m->cfg.moe.experts == 0) return;
    if (tok_comm && tok_comm->size > 1) {
        m->hooks.tok_split = tok_comm->size;
        m->hooks.tok_ctx = tok_comm;
        m->hooks.tok_sum = tok_sum;
    }
    if (!ep_comm) return;
    L3D_ASSERT((int64_t)m->shard.expert_count * ep_comm->size == m->cfg.moe.experts);
    ep->comm = ep_comm;
    m->hooks.ep_ctx = ep;
    m->hooks.ep_all_to_allv = ep_all_to_allv;
}
