/* What the layouts of one search share (struct l3d_plan_cache): the stage partitions by stage
 * count, the last trainer schedule and the timelines, so that a search computes each once rather
 * than once a layout. */
#include <stdlib.h>
#include <string.h>

#include "plan-impl.h"

void l3d_plan_cache_free(struct l3d_plan_cache *cc) {
    for (int i = 0; i < L3D_PLAN_PARTITIONS; i++) free(cc->layers[i]);
    if (cc->have_sched) l3d_pp_schedule_free(&cc->sched);
    l3d_plan_timelines_free(&cc->tl);
    memset(cc, 0, sizeof *cc);
}

l3d_status l3d_plan_cache_layers(struct l3d_plan_cache *cc, const struct l3d_model_spec *m,
                                 const struct l3d_plan_run *run, const struct l3d_layout *lay,
                                 int S, int **owned, const int **layers) {
    *owned = NULL;
    if (cc)
        for (int i = 0; i < L3D_PLAN_PARTITIONS; i++)
            if (cc->layers[i] && cc->S[i] == S && cc->first[i] == lay->pp_first &&
                cc->last[i] == lay->pp_last && cc->given[i] == lay->pp_layers) {
                *layers = cc->layers[i];
                return L3D_OK;
            }
    int *buf = malloc(sizeof(int) * (size_t)S);
    if (!buf) return l3d_error(L3D_ERR_OOM, "out of memory planning %d stages", S);
    l3d_status st = l3d_plan_stage_layers(m, run, lay, S, buf);
    if (st != L3D_OK) {
        free(buf);
        return st;
    }
    if (cc) {
        free(cc->layers[cc->next]);
        cc->layers[cc->next] = buf;
        cc->S[cc->next] = S;
        cc->first[cc->next] = lay->pp_first;
        cc->last[cc->next] = lay->pp_last;
        cc->given[cc->next] = lay->pp_layers;
        cc->next = (cc->next + 1) % L3D_PLAN_PARTITIONS;
    } else {
        *owned = buf;
    }
    *layers = buf;
    return L3D_OK;
}

l3d_status l3d_plan_cache_schedule(struct l3d_plan_cache *cc, enum l3d_pp_kind kind, int p, int v,
                                   int64_t mm, struct l3d_pp_schedule *own,
                                   const struct l3d_pp_schedule **sched) {
    *sched = NULL;
    if (cc && cc->have_sched && cc->kind == kind && cc->p == p && cc->v == v && cc->mm == mm) {
        *sched = &cc->sched;
        return L3D_OK;
    }
    if (!cc) {
        l3d_status st = l3d_pp_schedule_build(own, kind, p, v, (int)mm);
        if (st == L3D_OK) *sched = own;
        return st;
    }
    if (cc->have_sched) l3d_pp_schedule_free(&cc->sched);
    cc->have_sched = false;
    l3d_status st = l3d_pp_schedule_build(&cc->sched, kind, p, v, (int)mm);
    if (st != L3D_OK) return st;
    cc->have_sched = true;
    cc->kind = kind;
    cc->p = p;
    cc->v = v;
    cc->mm = mm;
    *sched = &cc->sched;
    return L3D_OK;
}
