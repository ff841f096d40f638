/* The training layout: flags and world size -> grid, micro-batches, stages, schedules
 * (include/llm3d/train.h). Shared with the planner through include/llm3d/layout.h. */
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
    return l3d_layout_stage_layers(&tc->model, tc->layout.seq, pp, v, tc->layout.pp_layers, lay->layers);
}

l3d_status l3d_train_layout_init(struct l3d_train_layout *lay, const struct l3d_train_config *tc,
                                 int world_size) {
    memset(lay, 0, sizeof *lay);
    int tp = tc->layout.tp, pp = tc->layout.pp, dp = tc->layout.dp, v = tc->layout.v > 1 ? tc->layout.v : 1;
    int accum = tc->layout.accum;
    l3d_status st = L3D_OK;
    if (tc->steps < 1 || tc->layout.accum < 1)
        st = l3d_error(L3D_ERR_ARG, "--steps (%d) and --grad-accum (%d) must be at least 1",
                       tc->steps, tc->layout.accum);
    else if (!tc->train_pattern)
        st = l3d_error(L3D_ERR_ARG, "no training data: give --train with a token shard or glob");
    else if (tc->lr <= 0.0f || tc->min_lr < 0.0f || tc->min_lr > tc->lr)
        st = l3d_error(L3D_ERR_ARG, "learning rates must satisfy 0 <= --min-lr (%g) <= --lr (%g), "
                       "--lr > 0", tc->min_lr, tc->lr);
    else if ((st = l3d_topo_resolve(world_size, &tp, &pp, &dp)) != L3D_OK)
        ;
    else if (tc->layout.global_batch > 0 && tc->layout.global_batch % ((int64_t)tc->layout.micro_batch * dp) != 0)
        st = l3d_error(L3D_ERR_ARG, "--global-batch %lld does not split into micro-batches: it must "
                       "be a multiple of --batch %d x %d data-parallel replicas = %lld sequences",
                       (long long)tc->layout.global_batch, tc->layout.micro_batch, dp, (long long)tc->layout.micro_batch * dp);
    else if (tc->layout.global_batch > 0 &&
             (accum = (int)(tc->layout.global_batch / ((int64_t)tc->layout.micro_batch * dp))) < 1)
        ;
    else if (tc->layout.schedule == L3D_PP_INTERLEAVED && v < 2)
        st = l3d_error(L3D_ERR_LAYOUT, "--pp-schedule interleaved needs --pp-virtual 2 or more "
                       "model chunks per pipeline rank");
    else if ((st = partition(lay, tc, pp, v)) != L3D_OK)
        ;
    else if ((st = l3d_pp_schedule_build(&lay->sched, pp > 1 ? tc->layout.schedule : L3D_PP_1F1B, pp,
                                         v, accum)) != L3D_OK)
        ;
    else if (tp > 1 && (st = l3d_tp_shard(&tc->model, tp, 0, tc->layout.sp,
                                            &(struct l3d_shard){0})) != L3D_OK)
        ;
    else if (tc->layout.sp && tp == 1)
        st = l3d_error(L3D_ERR_LAYOUT, "--sequence-parallel splits the tensor-parallel group's "
                       "sequence; it needs --tp 2 or more");
    else if (tc->layout.sp && ((int64_t)tc->layout.micro_batch * tc->layout.seq) % tp != 0)
        st = l3d_error(L3D_ERR_LAYOUT, "--sequence-parallel with --tp %d needs --batch x --seq-len "
                       "(%d x %d) to divide by %d", tp, tc->layout.micro_batch, tc->layout.seq, tp);
    else if (tc->layout.zero < 0 || tc->layout.zero > 2)
        st = l3d_error(L3D_ERR_ARG, "--zero %d: choose 0, 1 (sharded optimizer state) or 2 (also "
                       "sharded gradients)", tc->layout.zero);
    else if (tc->layout.zero > 0 && dp > ZERO_MAX_DP)
        st = l3d_error(L3D_ERR_LAYOUT, "--zero %d over %d data-parallel replicas: ZeRO shards over "
                       "at most %d; give --zero 0, or fewer replicas (a larger --tp or --pp)",
                       tc->layout.zero, dp, ZERO_MAX_DP);
    if (st == L3D_OK && tc->val_pattern)
        st = l3d_pp_schedule_build_forward(&lay->vsched, pp, v, tc->val_batches);
    if (st != L3D_OK) {
        l3d_train_layout_free(lay);
        return st;
    }
    *lay = (struct l3d_train_layout){.tp = tp, .pp = pp, .dp = dp, .v = v, .stages = pp * v,
                                     .accum = accum, .layers = lay->layers, .sched = lay->sched,
                                     .vsched = lay->vsched};
    return L3D_OK;
}

struct l3d_shard l3d_train_layout_shard(const struct l3d_train_layout *lay,
                                        const struct l3d_train_config *tc, int vs, int tp_rank) {
    struct l3d_shard sh;
    /* the layout's TP split was checked by l3d_train_layout_init */
    L3D_ASSERT(l3d_layout_stage_shard(&tc->model, lay->layers, lay->stages, vs, lay->tp, tp_rank,
                                      tc->layout.sp, &sh) == L3D_OK);
    return sh;
}

void l3d_train_layout_free(struct l3d_train_layout *lay) {
    free(lay->layers);
    l3d_pp_schedule_free(&lay->sched);
    l3d_pp_schedule_free(&lay->vsched);
    memset(lay, 0, sizeof *lay);
}
