/* The training layout: flags and world size -> grid, micro-batches, stages, then (after the
 * memory check has counted their bytes) the schedules (include/llm3d/train.h). Shared with the
 * planner through include/llm3d/layout.h. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "llm3d/layout.h"
#include "llm3d/topo.h"
#include "llm3d/tp.h"
#include "llm3d/train.h"

/* The most data-parallel ranks ZeRO shards over: l3d_dp_step all-gathers from a table of that
 * many ranks (src/parallel/dp.c). */
#define ZERO_MAX_DP 256

/* The layers of each virtual stage, allocated once the stages are known to fit the layers. */
static l3d_status partition(struct l3d_train_layout *lay, const struct l3d_train_config *tc, int pp,
                            int v) {
    if ((int64_t)pp * v <= tc->model.L)
        lay->layers = calloc((size_t)pp * v, sizeof(int)); /* not accounted, like the stack */
    if ((int64_t)pp * v <= tc->model.L && !lay->layers)
        return l3d_error(L3D_ERR_OOM, "out of memory for %d x %d stages", pp, v);
    return l3d_layout_stage_layers(&tc->model, tc->T, pp, v, tc->pp_layers, lay->layers);
}

l3d_status l3d_train_layout_init(struct l3d_train_layout *lay, const struct l3d_train_config *tc,
                                 int world_size) {
    memset(lay, 0, sizeof *lay);
    int tp = tc->tp, pp = tc->pp, dp = tc->dp, v = tc->pp_virtual > 1 ? tc->pp_virtual : 1;
    int accum = tc->accum;
    l3d_status st = L3D_OK;
    if (tc->steps < 1 || tc->accum < 1)
        st = l3d_error(L3D_ERR_ARG, "--steps (%d) and --grad-accum (%d) must be at least 1",
                       tc->steps, tc->accum);
    else if (!tc->train_pattern)
        st = l3d_error(L3D_ERR_ARG, "no training data: give --train with a token shard or glob");
    else if (tc->lr <= 0.0f || tc->min_lr < 0.0f || tc->min_lr > tc->lr)
        st = l3d_error(L3D_ERR_ARG, "learning rates must satisfy 0 <= --min-lr (%g) <= --lr (%g), "
                       "--lr > 0", tc->min_lr, tc->lr);
    else if ((st = l3d_topo_resolve(world_size, &tp, &pp, &dp)) != L3D_OK)
        ;
    else if (tc->global_batch > 0 && tc->global_batch % ((int64_t)tc->B * dp) != 0)
        st = l3d_error(L3D_ERR_ARG, "--global-batch %lld does not split into micro-batches: it must "
                       "be a multiple of --batch %d x %d data-parallel replicas = %lld sequences",
                       (long long)tc->global_batch, tc->B, dp, (long long)tc->B * dp);
    else if (tc->global_batch > 0 && tc->global_batch / ((int64_t)tc->B * dp) > INT_MAX)
        st = l3d_error(L3D_ERR_ARG, "--global-batch %lld is %lld micro-batches of --batch %d x %d "
                       "data-parallel replicas a step: at most %d; give a smaller --global-batch",
                       (long long)tc->global_batch,
                       (long long)(tc->global_batch / ((int64_t)tc->B * dp)), tc->B, dp, INT_MAX);
    else if (tc->global_batch > 0 &&
             (accum = (int)(tc->global_batch / ((int64_t)tc->B * dp))) < 1)
        ;
    else if (tc->pp_schedule == L3D_PP_INTERLEAVED && v < 2)
        st = l3d_error(L3D_ERR_LAYOUT, "--pp-schedule interleaved needs --pp-virtual 2 or more "
                       "model chunks per pipeline rank");
    else if ((st = partition(lay, tc, pp, v)) != L3D_OK)
        ;
    else if ((st = l3d_pp_schedule_check(pp > 1 ? tc->pp_schedule : L3D_PP_1F1B, pp, v,
                                         accum)) != L3D_OK)
        ;
    else if (tp > 1 && (st = l3d_tp_shard(&tc->model, tp, 0, tc->sequence_parallel,
                                            &(struct l3d_shard){0})) != L3D_OK)
        ;
    else if (tc->sequence_parallel && tp == 1)
        st = l3d_error(L3D_ERR_LAYOUT, "--sequence-parallel splits the tensor-parallel group's "
                       "sequence; it needs --tp 2 or more");
    else if (tc->sequence_parallel && ((int64_t)tc->B * tc->T) % tp != 0)
        st = l3d_error(L3D_ERR_LAYOUT, "--sequence-parallel with --tp %d needs --batch x --seq-len "
                       "(%d x %d) to divide by %d", tp, tc->B, tc->T, tp);
    else if (tc->zero < 0 || tc->zero > 2)
        st = l3d_error(L3D_ERR_ARG, "--zero %d: choose 0, 1 (sharded optimizer state) or 2 (also "
                       "sharded gradients)", tc->zero);
    else if (tc->zero > 0 && dp > ZERO_MAX_DP)
        st = l3d_error(L3D_ERR_LAYOUT, "--zero %d over %d data-parallel replicas: ZeRO shards over "
                       "at most %d; give --zero 0, or fewer replicas (a larger --tp or --pp)",
                       tc->zero, dp, ZERO_MAX_DP);
    if (st == L3D_OK && tc->val_pattern && tc->val_batches < 1)
        st = l3d_error(L3D_ERR_ARG, "--val-batches %d: give 1 or more", tc->val_batches);
    if (st != L3D_OK) {
        l3d_train_layout_free(lay);
        return st;
    }
    *lay = (struct l3d_train_layout){.tp = tp, .pp = pp, .dp = dp, .v = v, .stages = pp * v,
                                     .accum = accum, .layers = lay->layers};
    return L3D_OK;
}

l3d_status l3d_train_layout_build(struct l3d_train_layout *lay,
                                  const struct l3d_train_config *tc) {
    L3D_ASSERT(lay->layers && !lay->sched.n); /* after l3d_train_layout_init, once */
    int pp = lay->pp, v = lay->v;
    l3d_status st = l3d_pp_schedule_build(&lay->sched, pp > 1 ? tc->pp_schedule : L3D_PP_1F1B, pp,
                                          v, lay->accum);
    if (st == L3D_OK && tc->val_pattern)
        st = l3d_pp_schedule_build_forward(&lay->vsched, pp, v, tc->val_batches);
    if (st != L3D_OK) {
        l3d_pp_schedule_free(&lay->sched);
        l3d_pp_schedule_free(&lay->vsched);
    }
    return st;
}

struct l3d_shard l3d_train_layout_shard(const struct l3d_train_layout *lay,
                                        const struct l3d_train_config *tc, int vs, int tp_rank) {
    struct l3d_shard sh;
    /* the layout's TP split was checked by l3d_train_layout_init */
    L3D_ASSERT(l3d_layout_stage_shard(&tc->model, lay->layers, lay->stages, vs, lay->tp, tp_rank,
                                      tc->sequence_parallel, &sh) == L3D_OK);
    return sh;
}

void l3d_train_layout_free(struct l3d_train_layout *lay) {
    free(lay->layers);
    l3d_pp_schedule_free(&lay->sched);
    l3d_pp_schedule_free(&lay->vsched);
    memset(lay, 0, sizeof *lay);
}
