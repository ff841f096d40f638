/*
 * Expert parallelism with a router that sends every token to one expert (issue 46, "bad input"),
 * on every world size ctest runs (ep = world, 4 experts): every token's first choice is expert 0
 * and, by the tie rule, its second expert 1, so EP rank 0 takes every row (ep 2: both experts;
 * ep 4: rank 1 the other half) and the other ranks none. The exchange must not crash or read past
 * its buffers (the receive side is sized for the worst routing), the load is reported (the two
 * busy experts at N assignments each: max over mean 2), the capacity rule drops what it must
 * (capacity factor 1: ceil(N K / E) = N / 2 of each busy expert's N), the sharded model's loss
 * equals the one-rank model's and its expert gradients are finite, zero on the idle experts'
 * ranks; the exchange's timing (struct l3d_ep: seconds, bytes sent) is counted.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "llm3d/comm.h"
#include "llm3d/ep.h"
#include "llm3d/model.h"
#include "mpi/mpi_test.h"

/* Weights std 0.3; LN2's weight 0 and bias 1 (its output all ones), the router's row of expert 0
 * ones and the others 0: every token's logits are C for expert 0 and 0 for the rest. */
static void all_to_one(struct l3d_gpt *m, uint64_t seed) {
    l3d_gpt_init_weights(m, seed);
    float *p = test_to_host(m->be, m->params, m->num_params);
    const struct l3d_tensor_info *w = &m->tensors[L3D_T_LN2W], *b = &m->tensors[L3D_T_LN2B];
    const struct l3d_tensor_info *rt = &m->tensors[L3D_T_ROUTER];
    for (int64_t i = 0; i < w->count; i++) p[w->offset + i] = 0.0f, p[b->offset + i] = 1.0f;
    for (int64_t i = 0; i < rt->count; i++)
        p[rt->offset + i] = i % (rt->rows * rt->cols) < rt->cols ? 1.0f : 0.0f;
    l3d_be_copy_h2d(m->be, m->params, p, (size_t)m->num_params * sizeof(float));
    free(p);
}

static void check_all_to_one(struct l3d_comm *world, struct l3d_backend *be, double cf) {
    int ep = world->size, B = 2, T = 8, N = B * T;
    struct l3d_model_spec cfg = {.L = 2, .C = 16, .NH = 2, .V = 50, .maxT = 8,
                                 .moe = {.experts = 4, .top_k = 2, .ffn = 12, .norm_topk = true,
                                         .aux_coef = 0.1, .capacity_factor = cf}};
    L3D_ASSERT(l3d_gpt_config_finish(&cfg) == L3D_OK);
    struct l3d_shard full = l3d_shard_full(&cfg), sh = full;
    l3d_shard_set_experts(&cfg, &sh, ep, world->rank);
    struct l3d_gpt *mf, *ms;
    CHECK(l3d_gpt_init(&mf, &cfg, &full, be, B, T, L3D_GRADS_FLAT) == L3D_OK);
    CHECK(l3d_gpt_init(&ms, &cfg, &sh, be, B, T, L3D_GRADS_FLAT) == L3D_OK);
    all_to_one(mf, 7);
    all_to_one(ms, 7);
    struct l3d_ep epc = {0};
    l3d_ep_attach(&epc, ms, world, NULL);
    int32_t inp[16], tgt[16];
    for (int i = 0; i < N; i++) {
        inp[i] = (int32_t)(l3d_rng_u64(3, 1, (uint64_t)i) % (uint64_t)cfg.V);
        tgt[i] = (int32_t)(l3d_rng_u64(3, 2, (uint64_t)i) % (uint64_t)cfg.V);
    }
    double sf[2 * 4 + 4] = {0}, ss[2 * 4 + 4] = {0}; /* take adds into them */
    struct l3d_gpt *both[2] = {mf, ms};
    float loss[2];
    double *st[2] = {sf, ss};
    for (int k = 0; k < 2; k++) {
        l3d_gpt_zero_grad(both[k]);
        loss[k] = l3d_gpt_forward(both[k], inp, tgt, B, T);
        l3d_gpt_backward(both[k], 1.0f / (float)N, NULL);
        l3d_gpt_moe_stats_take(both[k], st[k]);
    }
    CHECK(isfinite(loss[1]));
    CHECK_NEAR(loss[1], loss[0], 1e-6 * fabs(loss[0]));
    /* every rank routed its own (the same) tokens: experts 0 and 1 took all N each */
    for (int j = 0; j < 2; j++)
        CHECK(ss[j * 4 + 0] == N && ss[j * 4 + 1] == N && ss[j * 4 + 2] == 0 && ss[j * 4 + 3] == 0);
    struct l3d_moe_summary sum;
    l3d_moe_summarize(ss, 2, 4, NULL, &sum);
    CHECK(sum.load_max == 2.0);
    CHECK(sum.dropped == (cf > 0 ? 2.0 * N : 0.0)); /* two layers, N of the 2N over capacity */
    /* the expert gradients: finite; none on a rank whose experts took no rows */
    float *g = test_to_host(be, ms->grads, ms->num_params);
    const struct l3d_tensor_info *fc = &ms->tensors[L3D_T_EXPFCW];
    double sq = 0.0;
    for (int64_t i = 0; i < fc->count; i++) sq += (double)g[fc->offset + i] * g[fc->offset + i];
    bool busy = sh.expert_start <= 1; /* holds expert 0 or 1 */
    CHECK(isfinite(sq) && (busy ? sq > 0.0 : sq == 0.0));
    /* the exchange was timed and counted what left each rank: at least the routing's counts
     * (E / ep integers to each other rank, a layer) and, to or from the busy ranks, rows */
    CHECK(epc.comm_s > 0.0);
    CHECK(epc.bytes > 2 * (int64_t)(ep - 1) * (4 / ep) * 8);
    free(g);
    l3d_gpt_free(ms);
    l3d_gpt_free(mf);
}

int main(int argc, char **argv) {
    struct l3d_backend *be;
    struct l3d_comm *world = test_mpi_init(&argc, &argv, &be);
    if (!world) return 1;
    check_all_to_one(world, be, 0.0); /* dropless */
    check_all_to_one(world, be, 1.0); /* capacity N K / E = N / 2 an expert */
    return test_mpi_end(world, be);
}
