/* The pipeline phase of a step: the schedule's actions run on a timeline with each stage's own
 * times (l3d_plan_pipe_time), extended linearly for many micro-batches (l3d_plan_pipe_phase), and
 * the schedules and timelines a search's layouts share (l3d_plan_timeline). */
#include <stdlib.h>
#include <string.h>

#include "plan-impl.h"

/* The step's pipeline phase, by running the schedule's actions (the trainer's own, as
 * l3d_pp_schedule_build lists them: Megatron-LM's 1F1B, interleaved 1F1B or GPipe) on a timeline
 * with each virtual stage's own times: fwd[vs] a forward of one micro-batch, bwd[vs] its backward
 * with any recomputation, rin_act[vs] / rin_grad[vs] the receive of its input activation / output
 * gradient (the link between the two ranks). A rank runs its list in order; a receive waits for
 * the matching send, then takes its transfer time; sends do not block (the trainer and Megatron
 * post them non-blocking). So the bubble and the p2p are those of the real stage imbalance: the
 * first stage's embedding, the last one's head and loss, uneven partitions, links that differ
 * between ranks. Returns the time of the last action; -1 when out of memory or the schedule
 * waits for a send never made (l3d_pp_simulate checks that never happens). */
double l3d_plan_pipe_time(const struct l3d_pp_schedule *sc, const double *fwd, const double *bwd,
                          const double *rin_act, const double *rin_grad) {
    return l3d_plan_pipe_time_w(sc, fwd, bwd, NULL, rin_act, rin_grad);
}

/* B of a split backward: the backward less its W; W: wgt[vs], half the backward without wgt (the
 * unit model, F = B = W for a backward of 2F). */
static double split_time(int op, const double *bwd, const double *wgt, int vs) {
    double w = wgt ? wgt[vs] : bwd[vs] / 2;
    return op == L3D_PP_BWD_W ? w : bwd[vs] - (wgt ? wgt[vs] : w);
}

double l3d_plan_pipe_time_w(const struct l3d_pp_schedule *sc, const double *fwd,
                            const double *bwd, const double *wgt, const double *rin_act,
                            const double *rin_grad) {
    int p = sc->pp, v = sc->v, S = p * v;
    int64_t m = sc->m;
    double *ready = malloc(sizeof(double) * 2 * (size_t)S * (size_t)m);
    double *clock = calloc((size_t)p, sizeof(double));
    int *at = calloc((size_t)p, sizeof(int));
    double end = -1;
    if (ready && clock && at) {
        for (int64_t i = 0; i < 2 * (int64_t)S * m; i++) ready[i] = -1;
        double *act = ready, *grad = ready + (size_t)S * (size_t)m; /* [vs * m + micro] */
        bool moved = true;
        while (moved) {
            moved = false;
            for (int r = 0; r < p; r++) {
                while (at[r] < sc->n[r]) {
                    const struct l3d_pp_action *a = &sc->acts[r][at[r]];
                    int vs = l3d_pp_vstage(sc->kind, p, r, a->chunk);
                    int64_t i = (int64_t)vs * m + a->micro;
                    bool to_next = a->op == L3D_PP_SEND_ACT, to_prev = a->op == L3D_PP_SEND_GRAD;
                    if (a->chunk < 0 || a->chunk >= v || a->micro < 0 || a->micro >= m ||
                        (to_next && vs + 1 >= S) || (to_prev && vs == 0))
                        break; /* not a schedule this timeline knows: reported as unmatched */
                    if (a->op == L3D_PP_FWD) clock[r] += fwd[vs];
                    else if (a->op == L3D_PP_BWD) clock[r] += bwd[vs];
                    else if (a->op == L3D_PP_BWD_B || a->op == L3D_PP_BWD_W)
                        clock[r] += split_time(a->op, bwd, wgt, vs);
                    else if (a->op == L3D_PP_SEND_ACT) act[i + m] = clock[r];      /* to vs + 1 */
                    else if (a->op == L3D_PP_SEND_GRAD) grad[i - m] = clock[r];    /* to vs - 1 */
                    else {
                        double t = a->op == L3D_PP_RECV_ACT ? act[i] : grad[i];
                        if (t < 0) break; /* not sent yet: another rank first */
                        clock[r] = (clock[r] > t ? clock[r] : t) +
                                   (a->op == L3D_PP_RECV_ACT ? rin_act[vs] : rin_grad[vs]);
                    }
                    at[r]++;
                    moved = true;
                }
            }
        }
        end = 0;
        for (int r = 0; r < p; r++) {
            if (at[r] < sc->n[r]) end = -1;
            if (end >= 0 && clock[r] > end) end = clock[r];
        }
    }
    free(ready);
    free(clock);
    free(at);
    return end;
}

#define PIPE_FULL (1 << 11) /* chunk-micro-batches a layout's timeline runs in full */

static void pipe_cache_free(struct l3d_plan_schedules *pc) {
    for (int i = 0; i < L3D_PLAN_SCHEDULES; i++)
        if (pc->have[i]) l3d_pp_schedule_free(&pc->s[i]);
    memset(pc, 0, sizeof *pc);
}

static const struct l3d_pp_schedule *pipe_schedule(struct l3d_plan_schedules *pc,
                                                   enum l3d_pp_kind kind, int p, int v, int m) {
    for (int i = 0; i < L3D_PLAN_SCHEDULES; i++)
        if (pc->have[i] && pc->kind[i] == kind && pc->p[i] == p && pc->v[i] == v && pc->m[i] == m)
            return &pc->s[i];
    int i = pc->next;
    pc->next = (pc->next + 1) % L3D_PLAN_SCHEDULES;
    if (pc->have[i]) l3d_pp_schedule_free(&pc->s[i]);
    pc->have[i] = l3d_pp_schedule_build(&pc->s[i], kind, p, v, m) == L3D_OK;
    if (!pc->have[i]) return NULL;
    pc->kind[i] = kind;
    pc->p[i] = p;
    pc->v[i] = v;
    pc->m[i] = m;
    return &pc->s[i];
}

/* The pipeline phase of m micro-batches: the timeline of the schedule itself when p v m is at
 * most `full` chunk-micro-batches; else the timelines of 2p and 3p micro-batches, extended
 * linearly: past its warm-up (at most 2 (p - 1) + (v - 1) p chunk-forwards, under 2p
 * micro-batches) a schedule repeats with a fixed period per micro-batch, so each p more add the
 * same time (test_pipe_time checks the two agree). -1 when neither is possible (more than 2^20
 * chunk-micro-batches even so, out of memory). */
static double pipe_phase(struct l3d_plan_schedules *pc, enum l3d_pp_kind kind, int p, int v,
                         int64_t m, const double *fwd, const double *bwd, const double *wgt,
                         const double *rin_act, const double *rin_grad, int64_t full) {
    if ((int64_t)p * v * m <= full && m <= 1 << 24) {
        const struct l3d_pp_schedule *sc = pipe_schedule(pc, kind, p, v, (int)m);
        return sc ? l3d_plan_pipe_time_w(sc, fwd, bwd, wgt, rin_act, rin_grad) : -1;
    }
    int64_t m1 = 2LL * p, m2 = 3LL * p;
    if (m <= m2 || (int64_t)p * v * m2 > 1 << 20) return -1;
    const struct l3d_pp_schedule *s1 = pipe_schedule(pc, kind, p, v, (int)m1);
    double t1 = s1 ? l3d_plan_pipe_time_w(s1, fwd, bwd, wgt, rin_act, rin_grad) : -1;
    const struct l3d_pp_schedule *s2 = pipe_schedule(pc, kind, p, v, (int)m2);
    double t2 = s2 ? l3d_plan_pipe_time_w(s2, fwd, bwd, wgt, rin_act, rin_grad) : -1;
    if (t1 < 0 || t2 < 0) return -1;
    return t2 + (double)(m - m2) * (t2 - t1) / (double)p;
}

double l3d_plan_pipe_phase(enum l3d_pp_kind kind, int p, int v, int64_t m, const double *fwd,
                           const double *bwd, const double *rin_act, const double *rin_grad,
                           int64_t full) {
    struct l3d_plan_schedules pc = {0};
    double t = pipe_phase(&pc, kind, p, v, m, fwd, bwd, NULL, rin_act, rin_grad, full);
    pipe_cache_free(&pc);
    return t;
}

void l3d_plan_timelines_free(struct l3d_plan_timelines *tc) {
    pipe_cache_free(&tc->pc);
    for (int i = 0; i < L3D_PLAN_TIMELINES; i++) free(tc->tl[i].vt);
    memset(tc, 0, sizeof *tc);
}

double l3d_plan_timeline(struct l3d_plan_timelines *tc, enum l3d_pp_kind kind, int p, int v,
                         int64_t mm, double *vt) {
    int S = p * v;
    size_t n = sizeof(double) * 5 * (size_t)S;
    for (int i = 0; tc && i < L3D_PLAN_TIMELINES; i++)
        if (tc->tl[i].vt && tc->tl[i].S == S && tc->tl[i].kind == kind && tc->tl[i].v == v &&
            tc->tl[i].mm == mm && memcmp(tc->tl[i].vt, vt, n) == 0) {
            free(vt);
            return tc->tl[i].pipe;
        }
    struct l3d_plan_schedules own = {0};
    double sim = pipe_phase(tc ? &tc->pc : &own, kind, p, v, mm, vt, vt + S, vt + 4 * S,
                            vt + 2 * S, vt + 3 * S, PIPE_FULL);
    pipe_cache_free(&own);
    if (!tc) {
        free(vt);
        return sim;
    }
    int i = tc->next;
    tc->next = (i + 1) % L3D_PLAN_TIMELINES;
    free(tc->tl[i].vt);
    tc->tl[i].vt = vt;
    tc->tl[i].S = S;
    tc->tl[i].kind = kind;
    tc->tl[i].v = v;
    tc->tl[i].mm = mm;
    tc->tl[i].pipe = sim;
    return sim;
}
