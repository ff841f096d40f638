/* The training layout: flags and world size -> the spec's layout resolved, stages, then (after the
 * memory check has counted their bytes) the schedules (include/llm3d/train.h). Shared with the
 * planner through include/llm3d/layout.h. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "llm3d/layout.h"
#include "llm3d/spec.h"
#include "llm3d/tp.h"
#include "llm3d/train.h"

/* The layers of each virtual stage, allocated once the stages are known to fit the layers. */
static l3d_status partition(struct l3d_train_layout *lay, const struct l3d_train_config *tc) {
    int pp = tc->layout.pp, v = tc->layout.v;
    if ((int64_t)pp * v <= tc->model.L)
        lay->layers = calloc((size_t)pp * v, sizeof(int)); /* not accounted, like the stack */
    if ((int64_t)pp * v <= tc->model.L && !lay->layers)
        return l3d_error(L3D_ERR_OOM, "out of memory for %d x %d stages", pp, v);
    lay->stages = pp * v;
    return l3d_layout_stage_layers(&tc->model, &tc->layout, lay->layers);
}

/* The trainer's flags outside the run spec. */
static l3d_status check_flags(const struct l3d_train_config *tc) {
    if (tc->steps < 1 || tc->layout.accum < 1)
        return l3d_error(L3D_ERR_ARG, "--steps (%d) and --grad-accum (%d) must be at least 1",
                         tc->steps, tc->layout.accum);
    if (!tc->train_pattern)
        return l3d_error(L3D_ERR_ARG, "no training data: give --train with a token shard or glob");
    if (tc->lr <= 0.0f || tc->min_lr < 0.0f || tc->min_lr > tc->lr)
        return l3d_error(L3D_ERR_ARG, "learning rates must satisfy 0 <= --min-lr (%g) <= --lr "
                         "(%g), --lr > 0", tc->min_lr, tc->lr);
    return L3D_OK;
}

l3d_status l3d_train_layout_init(struct l3d_train_layout *lay, struct l3d_train_config *tc,
                                 int world_size) {
    memset(lay, 0, sizeof *lay);
    const struct l3d_layout given = tc->layout;
    l3d_status st = check_flags(tc);
    /* the run spec's every rule (include/llm3d/spec.h), the layout resolved in place, then what
     * building the stages and the schedule finds */
    if (st == L3D_OK)
        st = l3d_spec_resolve(&tc->spec, &(struct l3d_spec_ctx){.world = world_size, .train = true},
                              NULL);
    if (st == L3D_OK) st = partition(lay, tc);
    if (st == L3D_OK)
        st = l3d_pp_schedule_check(tc->layout.schedule, tc->layout.pp, tc->layout.v,
                                   tc->layout.accum);
    if (st == L3D_OK && tc->val_pattern && tc->val_batches < 1)
        st = l3d_error(L3D_ERR_ARG, "--val-batches %d: give 1 or more", tc->val_batches);
    if (st != L3D_OK) {
        l3d_train_layout_free(lay);
        tc->layout = given;
    }
    return st;
}

l3d_status l3d_train_layout_build(struct l3d_train_layout *lay,
                                  const struct l3d_train_config *tc) {
    L3D_ASSERT(lay->layers && !lay->sched.n); /* after l3d_train_layout_init, once */
    int pp = tc->layout.pp, v = tc->layout.v;
    l3d_status st = l3d_pp_schedule_build(&lay->sched, tc->layout.schedule, pp, v,
                                          tc->layout.accum);
    if (st == L3D_OK && tc->val_pattern)
        st = l3d_pp_schedule_build_forward(&lay->vsched, tc->layout.schedule, pp, v,
                                               tc->val_batches);
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
    L3D_ASSERT(l3d_layout_stage_shard(&tc->model, lay->layers, lay->stages, vs, tc->layout.tp,
                                      tp_rank, tc->layout.sp, &sh) == L3D_OK);
    sh.xent_rows = tc->layout.xent_chunk;
    sh.tp_reduce_f32 = tc->precision.tp_reduce_fp32 && tc->layout.tp > 1;
    return sh;
}

void l3d_train_layout_free(struct l3d_train_layout *lay) {
    free(lay->layers);
    l3d_pp_schedule_free(&lay->sched);
    l3d_pp_schedule_free(&lay->vsched);
    memset(lay, 0, sizeof *lay);
}
