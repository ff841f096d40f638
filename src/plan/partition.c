/* The layers of each pipeline stage (l3d_plan_stage_layers): the trainer's uneven split, found
 * fast, or Megatron-LM's even one. */
#include <math.h>

#include "llm3d/layout.h"
#include "llm3d/pipeline.h"
#include "plan-impl.h"

/* ---- the trainer's stage partition, fast ------------------------------------------------
 *
 * l3d_pp_partition (src/parallel/pipeline.c) finds by dynamic programming, in O(stages L^2), the
 * split of L layers of cost lc into stages that minimises the largest stage cost, the first stage
 * also paying the embedding, the last the head; ties keep the earliest cut. Every layer costs the
 * same, so the planner gets the same split in O(stages log L): best(k, j), the smallest largest
 * cost of the first j layers on k stages, is the smallest stage cost (a whole number of layers
 * plus one of the four extras) under which the k stages' capacities hold j layers; the cut
 * before stage k is then the earliest one whose stage fits under best(k, j), as the dynamic
 * programme's backtracking picks it. tests/test_plan.c checks the two agree on every (L, stages)
 * up to 48 layers for several models. */
struct part {
    double lc, emb, head;
    int stages;
};

/* a stage of n layers, with the dynamic programme's own floating-point expression */
static double stage_cost(const struct part *P, int64_t n, bool first, bool last) {
    return (double)n * P->lc + (first ? P->emb : 0.0) + (last ? P->head : 0.0);
}

/* the most layers a stage holds under cost C (0 if none), at most `most` */
static int64_t capacity(const struct part *P, double C, bool first, bool last, int64_t most) {
    double x = (C - (first ? P->emb : 0.0) - (last ? P->head : 0.0)) / P->lc;
    int64_t n = x < 0 ? 0 : x > (double)most ? most : (int64_t)x;
    while (n < most && stage_cost(P, n + 1, first, last) <= C) n++;
    while (n > 0 && stage_cost(P, n, first, last) > C) n--;
    return n;
}

/* can stages 1..k (stage k the last of all when k == stages) hold j layers under cost C? */
static bool holds(const struct part *P, double C, int k, int64_t j) {
    bool last_k = k == P->stages;
    if (k == 1) return capacity(P, C, true, last_k, j) >= j;
    int64_t c1 = capacity(P, C, true, false, j), ck = capacity(P, C, false, last_k, j);
    int64_t cm = k > 2 ? capacity(P, C, false, false, j) : 0;
    if (c1 < 1 || ck < 1 || (k > 2 && cm < 1)) return false;
    return c1 + ck + (int64_t)(k - 2) * cm >= j;
}

/* best(k, j): the smallest feasible cost among n lc + extra, n = 1..j, for each of the extras */
static double best_cost(const struct part *P, int k, int64_t j) {
    double best = INFINITY;
    for (int e = 0; e < 4; e++) {
        bool first = e & 1, last = e & 2;
        if (!holds(P, stage_cost(P, j, first, last), k, j)) continue;
        int64_t lo = 1, hi = j; /* the smallest n whose cost holds the layers */
        while (lo < hi) {
            int64_t mid = lo + (hi - lo) / 2;
            if (holds(P, stage_cost(P, mid, first, last), k, j)) hi = mid;
            else lo = mid + 1;
        }
        double c = stage_cost(P, lo, first, last);
        if (c < best) best = c;
    }
    return best;
}

static void fast_partition(const struct l3d_model_spec *cfg, int T, int stages, int *layers) {
    struct part P = {.lc = l3d_pp_layer_cost(cfg, T), .emb = 2.0 * cfg->C,
                     .head = l3d_pp_head_cost(cfg), .stages = stages};
    int64_t j = cfg->L;
    for (int k = stages; k >= 1; k--) {
        if (k == 1) {
            layers[0] = (int)j;
            break;
        }
        double B = best_cost(&P, k, j);
        int64_t i = j - capacity(&P, B, false, k == stages, j);
        if (i < k - 1) i = k - 1;
        layers[k - 1] = (int)(j - i);
        j = i;
    }
}

l3d_status l3d_plan_stage_layers(const struct l3d_model_spec *m, const struct l3d_plan_run *run,
                                 const struct l3d_layout *lay, int stages, int *layers) {
    if (stages > m->L)
        return l3d_error(L3D_ERR_LAYOUT, "%d pipeline stages (pp x v) for %d layers: each stage "
                         "needs a layer", stages, m->L);
    if (lay && (lay->pp_layers || lay->pp_first || lay->pp_last)) {
        struct l3d_layout l = *lay; /* the stages asked for, whatever pp x v the caller counts */
        L3D_ASSERT((int64_t)l.pp * (l.v > 0 ? l.v : 1) == stages);
        return l3d_layout_stage_layers(m, &l, layers);
    }
    if (l3d_plan_trainer(run)) {
        struct l3d_model_spec c = l3d_plan_model_gpt(m);
        fast_partition(&c, m->maxT, stages, layers);
        return L3D_OK;
    }
    if (m->L % stages != 0)
        return l3d_error(L3D_ERR_LAYOUT, "%d layers do not split evenly into pp x v = %d stages "
                         "(Megatron-LM needs L divisible by pp v)", m->L, stages);
    for (int i = 0; i < stages; i++) layers[i] = m->L / stages;
    return L3D_OK;
}
