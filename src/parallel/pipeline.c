/* Pipeline schedules, their simulation, and the stage partition (include/llm3d/pipeline.h). */
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "llm3d/pipeline.h"

const char *l3d_pp_kind_name(enum l3d_pp_kind kind) {
    switch (kind) {
    case L3D_PP_GPIPE: return "gpipe";
    case L3D_PP_1F1B: return "1f1b";
    case L3D_PP_INTERLEAVED: return "interleaved";
    case L3D_PP_ZBH1: return "zb-h1";
    case L3D_PP_ZBV: return "zbv";
    }
    return "?";
}

l3d_status l3d_pp_kind_parse(const char *name, enum l3d_pp_kind *kind) {
    for (int k = L3D_PP_GPIPE; k <= L3D_PP_ZBV; k++)
        if (strcmp(name, l3d_pp_kind_name((enum l3d_pp_kind)k)) == 0) {
            *kind = (enum l3d_pp_kind)k;
            return L3D_OK;
        }
    return l3d_error(L3D_ERR_ARG, "--pp-schedule %s: choose gpipe, 1f1b, interleaved, zb-h1 or "
                     "zbv", name);
}

bool l3d_pp_split(enum l3d_pp_kind kind) { return kind == L3D_PP_ZBH1 || kind == L3D_PP_ZBV; }

int l3d_pp_vstage(enum l3d_pp_kind kind, int pp, int r, int chunk) {
    if (kind == L3D_PP_ZBV && chunk == 1) return 2 * pp - 1 - r; /* the V's way back */
    return chunk * pp + r;
}

void l3d_pp_vstage_owner(enum l3d_pp_kind kind, int pp, int vs, int *r, int *chunk) {
    *chunk = vs / pp;
    *r = kind == L3D_PP_ZBV && *chunk == 1 ? 2 * pp - 1 - vs : vs % pp;
}

int64_t l3d_pp_warmup(enum l3d_pp_kind kind, int pp, int r, int v, int64_t m) {
    int64_t total = m * v, warm;
    if (kind == L3D_PP_GPIPE)
        warm = total;
    else if (kind == L3D_PP_1F1B || kind == L3D_PP_ZBH1)
        warm = pp - r - 1;
    else if (kind == L3D_PP_ZBV) /* chunk 0's forwards before the stage's first B */
        warm = 2LL * (pp - r) - 1;
    else
        warm = 2LL * (pp - r - 1) + (int64_t)(v - 1) * pp;
    return warm < total ? warm : total;
}

int64_t l3d_pp_in_flight(enum l3d_pp_kind kind, int pp, int r, int v, int64_t m) {
    if (pp == 1) return 1;
    if (kind == L3D_PP_ZBH1) return pp < m ? pp : m; /* held to W: build_zbh1's cap */
    if (kind == L3D_PP_ZBV) return 2LL * pp < 2 * m ? 2LL * pp : 2 * m; /* build_zbv's cap */
    int64_t f = l3d_pp_warmup(kind, pp, r, v, m) + 1;
    return f < m * v ? f : m * v;
}

double l3d_pp_bubble(int pp, int v, int m) {
    return (double)(pp - 1) / ((double)v * m + pp - 1);
}

/* ---- building ---------------------------------------------------------------------------- */

struct builder {
    const struct l3d_pp_schedule *s;
    int stage, n;
    struct l3d_pp_action *out;
};

static void emit(struct builder *b, int op, int micro, int chunk, int peer) {
    b->out[b->n++] = (struct l3d_pp_action){.op = (uint8_t)op, .chunk = (int16_t)chunk,
                                            .micro = micro, .peer = peer};
}

/* A computation (L3D_PP_FWD, _BWD, _BWD_B or _BWD_W) with the receive before it and the send
 * after it (a W has neither). */
static void compute_op(struct builder *b, int op, int micro, int chunk) {
    int pp = b->s->pp, vs = l3d_pp_vstage(b->s->kind, pp, b->stage, chunk);
    int last = pp * b->s->v - 1, prev = -1, next = -1, c;
    if (vs > 0) l3d_pp_vstage_owner(b->s->kind, pp, vs - 1, &prev, &c);
    if (vs < last) l3d_pp_vstage_owner(b->s->kind, pp, vs + 1, &next, &c);
    if (op == L3D_PP_FWD) {
        if (vs > 0) emit(b, L3D_PP_RECV_ACT, micro, chunk, prev);
        emit(b, L3D_PP_FWD, micro, chunk, -1);
        if (vs < last) emit(b, L3D_PP_SEND_ACT, micro, chunk, next);
    } else if (op == L3D_PP_BWD_W) {
        emit(b, L3D_PP_BWD_W, micro, chunk, -1);
    } else {
        if (vs < last) emit(b, L3D_PP_RECV_GRAD, micro, chunk, next);
        emit(b, op, micro, chunk, -1);
        if (vs > 0) emit(b, L3D_PP_SEND_GRAD, micro, chunk, prev);
    }
}

static void compute(struct builder *b, bool fwd, int micro, int chunk) {
    compute_op(b, fwd ? L3D_PP_FWD : L3D_PP_BWD, micro, chunk);
}

/* The k-th forward (or backward) of a stage: which micro-batch on which chunk. */
static void nth(const struct l3d_pp_schedule *s, bool fwd, int k, int *micro, int *chunk) {
    if (s->kind != L3D_PP_INTERLEAVED) {
        *micro = k;
        *chunk = 0;
        return;
    }
    int pp = s->pp, v = s->v, group = k / pp % v;
    *chunk = fwd ? group : v - 1 - group;
    *micro = k / (pp * v) * pp + k % pp;
}

/* Activation slots of stage r: the most micro-batches of each chunk between forward and backward
 * (its W when split); W slots: between B and W. */
static void count_slots(struct l3d_pp_schedule *s, int r) {
    int *live = &s->slots[r * s->v], *wait = &s->wslots[r * s->v];
    int cur[256] = {0}, w[256] = {0};
    for (int i = 0; i < s->n[r]; i++) {
        const struct l3d_pp_action *a = &s->acts[r][i];
        if (a->op == L3D_PP_FWD && ++cur[a->chunk] > live[a->chunk]) live[a->chunk] = cur[a->chunk];
        if (a->op == L3D_PP_BWD || a->op == L3D_PP_BWD_W) cur[a->chunk]--;
        if (a->op == L3D_PP_BWD_B && ++w[a->chunk] > wait[a->chunk]) wait[a->chunk] = w[a->chunk];
        if (a->op == L3D_PP_BWD_W) w[a->chunk]--;
    }
}

int l3d_pp_fb_slots(const struct l3d_pp_schedule *s, int r, int chunk) {
    int cur = 0, most = 0;
    for (int i = 0; i < s->n[r]; i++) {
        const struct l3d_pp_action *a = &s->acts[r][i];
        if (a->chunk != chunk) continue;
        if (a->op == L3D_PP_FWD && ++cur > most) most = cur;
        if (a->op == L3D_PP_BWD || a->op == L3D_PP_BWD_B) cur--;
    }
    return most;
}

/* ZB-H1's order (pipeline.h), from a timeline with unit F, B and W times run on every stage at
 * once: at each tick a stage runs its next F or B of 1F1B's order when its input is there (and,
 * for an F, fewer than min(pp, m) micro-batches wait for their W: 1F1B's peak, its first stage's),
 * else its oldest pending W, else waits. end[(r * 2 + b) * m + i]: the tick F (b 0) or B (b 1) of micro-batch i ends on stage r. */
static void build_zbh1(struct l3d_pp_schedule *s) {
    int pp = s->pp, m = s->m, left = pp;
    int64_t *end = l3d_alloc((size_t)pp * 2 * m * sizeof(int64_t), "schedule");
    int *k = l3d_calloc((size_t)pp * 4 * sizeof(int), "schedule"); /* per stage: k, F, B, W */
    for (int64_t i = 0; i < (int64_t)pp * 2 * m; i++) end[i] = INT64_MAX;
    struct builder *b = l3d_calloc((size_t)pp * sizeof(*b), "schedule");
    for (int r = 0; r < pp; r++) b[r] = (struct builder){.s = s, .stage = r, .out = s->acts[r]};
    for (int64_t t = 0; left > 0; t++) {
        L3D_ASSERT(t <= 8 * ((int64_t)m + pp)); /* every tick some stage moves */
        for (int r = 0; r < pp; r++) {
            int *st = &k[4 * r], warm = (int)l3d_pp_warmup(L3D_PP_ZBH1, pp, r, 1, m);
            int cap = pp < m ? pp : m; /* 1F1B's peak, stage 0's */
            if (st[3] == m) continue;
            /* 1F1B's k-th action: warm-up forwards, then F B pairs, then the backwards */
            int kk = st[0], fwd = kk < warm || (kk < 2 * m - warm && (kk - warm) % 2 == 0);
            bool more = kk < 2 * m, ready = false;
            if (more && fwd) {
                int i = st[1];
                ready = (r == 0 || end[((r - 1) * 2) * m + i] <= t) && st[1] - st[3] < cap;
            } else if (more) {
                int i = st[2];
                ready = r == pp - 1 ? end[(r * 2) * m + i] <= t : end[((r + 1) * 2 + 1) * m + i] <= t;
            }
            if (ready) {
                int i = st[fwd ? 1 : 2]++;
                end[(r * 2 + !fwd) * m + i] = t + 1;
                compute_op(&b[r], fwd ? L3D_PP_FWD : L3D_PP_BWD_B, i, 0);
                st[0]++;
            } else if (st[3] < st[2]) {
                compute_op(&b[r], L3D_PP_BWD_W, st[3]++, 0);
                if (st[3] == m) left--;
            }
        }
    }
    for (int r = 0; r < pp; r++) {
        s->n[r] = b[r].n;
        count_slots(s, r);
    }
    l3d_free(b);
    l3d_free(k);
    l3d_free(end);
}

/* ZB-V (Qi et al. 2024, sec. 4: "ZB-V"), two chunks per rank in a V: rank r holds virtual stages r
 * (chunk 0) and 2 pp - 1 - r (chunk 1), so the first and the last virtual stage share rank 0 and
 * each rank's two chunks together cost what a 1F1B stage costs. The order comes from a timeline
 * with unit F, B and W times run on every rank at once, as build_zbh1's: at each tick a rank runs
 * a B whose gradient has arrived (the oldest micro-batch; chunk 1 first on a tie: the V's way back
 * feeds every rank after it), else an F whose input has arrived while fewer than min(2 pp, 2 m)
 * chunk micro-batches wait for their W (1F1B's peak: pp micro-batches of a whole stage; chunk 1
 * first: it leads to the B's), else its oldest pending W, else waits. */
struct zbv {
    struct l3d_pp_schedule *s;
    int64_t *endf, *endb;       /* [vs * m + i]: the tick the F (B) of micro-batch i ends */
    int *nf, *nb, *nw, *wq;     /* per rank and chunk: F, B done; per rank: W done, W queue */
};

static bool zbv_ready(const struct zbv *z, int r, int c, bool fwd, int64_t t) {
    const struct l3d_pp_schedule *s = z->s;
    int pp = s->pp, m = s->m, vs = l3d_pp_vstage(s->kind, pp, r, c), i;
    if (fwd) {
        i = z->nf[2 * r + c];
        return i < m && (vs == 0 || z->endf[(int64_t)(vs - 1) * m + i] <= t);
    }
    i = z->nb[2 * r + c];
    if (i >= z->nf[2 * r + c] || z->endf[(int64_t)vs * m + i] > t) return false;
    return vs == 2 * pp - 1 || z->endb[(int64_t)(vs + 1) * m + i] <= t;
}

/* Rank r's action at tick t (0 none): 1 B, 2 F (chunk in *c), 3 W. */
static int zbv_pick(const struct zbv *z, int r, int64_t t, int *c) {
    int m = z->s->m, held = z->nf[2 * r] + z->nf[2 * r + 1] - z->nw[r];
    int cap = 2 * (z->s->pp < m ? z->s->pp : m);
    bool b1 = zbv_ready(z, r, 1, false, t), b0 = zbv_ready(z, r, 0, false, t);
    if (b1 || b0) {
        *c = b1 && (!b0 || z->nb[2 * r + 1] <= z->nb[2 * r]) ? 1 : 0;
        return 1;
    }
    for (*c = 1; *c >= 0; (*c)--)
        if (held < cap && zbv_ready(z, r, *c, true, t)) return 2;
    return z->nw[r] < z->nb[2 * r] + z->nb[2 * r + 1] ? 3 : 0;
}

/* Rank r's tick t: its pick run and recorded (a B queues its W); false once all its W are done. */
static bool zbv_step(struct zbv *z, struct builder *b, int r, int64_t t) {
    const struct l3d_pp_schedule *s = z->s;
    int pp = s->pp, m = s->m, c = 0;
    int *q = &z->wq[(int64_t)r * 4 * m]; /* (chunk, micro) of each B in order: W's order */
    if (z->nw[r] == 2 * m) return false;
    int op = zbv_pick(z, r, t, &c);
    if (op == 1 || op == 2) {
        bool bwd = op == 1;
        int vs = l3d_pp_vstage(s->kind, pp, r, c), i = (bwd ? z->nb : z->nf)[2 * r + c]++;
        (bwd ? z->endb : z->endf)[(int64_t)vs * m + i] = t + 1;
        compute_op(b, bwd ? L3D_PP_BWD_B : L3D_PP_FWD, i, c);
        if (bwd) {
            int k = z->nb[2 * r] + z->nb[2 * r + 1] - 1;
            q[2 * k] = c;
            q[2 * k + 1] = i;
        }
    } else if (op == 3) {
        int k = z->nw[r]++;
        compute_op(b, L3D_PP_BWD_W, q[2 * k + 1], q[2 * k]);
    }
    return z->nw[r] < 2 * m;
}

static void build_zbv(struct l3d_pp_schedule *s) {
    int pp = s->pp, m = s->m;
    struct zbv z = {.s = s};
    z.endf = l3d_alloc((size_t)4 * pp * m * sizeof(int64_t), "schedule");
    z.endb = z.endf + (int64_t)2 * pp * m;
    z.nf = l3d_calloc((size_t)pp * 5 * sizeof(int), "schedule");
    z.nb = z.nf + 2 * pp;
    z.nw = z.nf + 4 * pp;
    z.wq = l3d_alloc((size_t)pp * 4 * m * sizeof(int), "schedule");
    for (int64_t i = 0; i < (int64_t)4 * pp * m; i++) z.endf[i] = INT64_MAX;
    struct builder *b = l3d_calloc((size_t)pp * sizeof(*b), "schedule");
    for (int r = 0; r < pp; r++) b[r] = (struct builder){.s = s, .stage = r, .out = s->acts[r]};
    for (int64_t t = 0, busy = 1; busy; t++) {
        L3D_ASSERT(t <= 16 * ((int64_t)m + pp)); /* every tick some rank moves */
        busy = 0;
        for (int r = 0; r < pp; r++) busy |= zbv_step(&z, &b[r], r, t);
    }
    for (int r = 0; r < pp; r++) {
        s->n[r] = b[r].n;
        count_slots(s, r);
    }
    l3d_free(b);
    l3d_free(z.wq);
    l3d_free(z.nf);
    l3d_free(z.endf);
}

static void build_stage(struct l3d_pp_schedule *s, int r) {
    int total = s->m * s->v, warm = (int)l3d_pp_warmup(s->kind, s->pp, r, s->v, s->m);
    struct builder b = {.s = s, .stage = r, .out = s->acts[r]};
    int mi, ch;
    for (int k = 0; k < warm; k++) {
        nth(s, true, k, &mi, &ch);
        compute(&b, true, mi, ch);
    }
    for (int k = 0; k < total - warm; k++) {
        nth(s, true, warm + k, &mi, &ch);
        compute(&b, true, mi, ch);
        nth(s, false, k, &mi, &ch);
        compute(&b, false, mi, ch);
    }
    for (int k = total - warm; k < total; k++) {
        nth(s, false, k, &mi, &ch);
        compute(&b, false, mi, ch);
    }
    s->n[r] = b.n;
    count_slots(s, r);
}

/* Actions a (micro, chunk) cell gives a stage at most: forward and backward, each with a receive
 * and a send, and a W when split (3 forward only); alloc_schedule's room and
 * l3d_pp_schedule_bytes' closed form. */
#define CELL_ACTIONS(fwd_only) ((fwd_only) ? 3 : 7)

/* Room for CELL_ACTIONS actions per (micro, chunk) on every stage (the bytes of
 * l3d_pp_schedule_bytes); L3D_ERR_OOM, with s freed, when the host has no room. */
static l3d_status alloc_schedule(struct l3d_pp_schedule *s, enum l3d_pp_kind kind, int pp, int v,
                                 int m, bool fwd_only) {
    s->kind = kind;
    s->pp = pp;
    s->v = v;
    s->m = m;
    s->n = l3d_calloc((size_t)pp * sizeof(int), "schedule");
    s->acts = l3d_calloc((size_t)pp * sizeof(*s->acts), "schedule");
    s->slots = l3d_calloc((size_t)pp * v * sizeof(int), "schedule");
    s->wslots = l3d_calloc((size_t)pp * v * sizeof(int), "schedule");
    size_t each = (size_t)m * v * CELL_ACTIONS(fwd_only) * sizeof(struct l3d_pp_action);
    for (int r = 0; r < pp; r++)
        if (!(s->acts[r] = l3d_try_alloc(each, "schedule"))) {
            double need = (double)l3d_pp_schedule_bytes(pp, v, m, fwd_only);
            l3d_pp_schedule_free(s);
            return l3d_error(L3D_ERR_OOM, "out of memory for the pipeline schedule: %.2f GiB for "
                             "%d micro-batches x %d model chunks on %d pipeline stages: lower "
                             "--grad-accum (or --global-batch)%s", need / (1 << 30), m, v, pp,
                             fwd_only ? " or --val-batches" : "");
        }
    return L3D_OK;
}

size_t l3d_pp_schedule_bytes(int pp, int v, int64_t m, bool fwd_only) {
    double acts = (double)m * v * CELL_ACTIONS(fwd_only) * sizeof(struct l3d_pp_action);
    double b = (double)pp * (sizeof(int) + sizeof(struct l3d_pp_action *) + acts) +
               2.0 * pp * v * sizeof(int); /* slots, wslots */
    return b < (double)SIZE_MAX ? (size_t)b : SIZE_MAX;
}

int64_t l3d_pp_schedule_actions(enum l3d_pp_kind kind, int pp, int v, int64_t m, int r,
                                bool fwd_only) {
    int64_t per_micro = 0; /* a pass: the computation, a receive unless first, a send unless last */
    for (int c = 0; c < v; c++) {
        int vs = l3d_pp_vstage(kind, pp, r, c);
        per_micro += 1 + (vs > 0) + (vs < pp * v - 1);
    }
    return (fwd_only ? 1 : 2) * m * per_micro + (!fwd_only && l3d_pp_split(kind) ? m * v : 0);
}

l3d_status l3d_pp_schedule_check(enum l3d_pp_kind kind, int pp, int v, int m) {
    if (pp < 1 || m < 1 || v < 1)
        return l3d_error(L3D_ERR_ARG, "pipeline of %d stages, %d micro-batches, %d virtual stages: "
                         "each must be at least 1", pp, m, v);
    if (kind == L3D_PP_ZBV && v != 2)
        return l3d_error(L3D_ERR_ARG, "--pp-schedule zbv places two model chunks on each rank, in "
                         "a V: give --pp-virtual 2 (got %d)", v);
    if (v > 1 && kind != L3D_PP_INTERLEAVED && kind != L3D_PP_ZBV)
        return l3d_error(L3D_ERR_ARG, "--pp-virtual %d needs --pp-schedule interleaved or zbv", v);
    if (v > 256)
        return l3d_error(L3D_ERR_ARG, "--pp-virtual %d: at most 256 virtual stages per rank", v);
    if (kind == L3D_PP_INTERLEAVED && (pp < 2 || v < 2))
        return l3d_error(L3D_ERR_ARG, "the interleaved schedule needs --pp 2 or more (got %d) and "
                         "--pp-virtual 2 or more (got %d)", pp, v);
    if (kind == L3D_PP_INTERLEAVED && m % pp != 0)
        return l3d_error(L3D_ERR_ARG, "the interleaved schedule needs the micro-batches "
                         "(--grad-accum %d) to be a multiple of --pp %d", m, pp);
    return L3D_OK;
}

/* A stage's action count is an int: at most INT_MAX / 6 (micro, chunk) cells, 358 million, whose
 * schedule would take 25 GiB a stage (the memory check refuses far fewer first). */
static l3d_status check_cells(int v, int m, bool fwd_only) {
    int64_t most = INT_MAX / CELL_ACTIONS(fwd_only);
    if ((int64_t)m * v <= most) return L3D_OK;
    return l3d_error(L3D_ERR_ARG, "%d micro-batches x %d model chunks: a pipeline schedule "
                     "holds at most %lld (micro-batch, chunk) pairs: lower --grad-accum (or "
                     "--global-batch)%s", m, v, (long long)most,
                     fwd_only ? " or --val-batches" : "");
}

l3d_status l3d_pp_schedule_build(struct l3d_pp_schedule *s, enum l3d_pp_kind kind, int pp, int v,
                                 int m) {
    memset(s, 0, sizeof *s);
    l3d_status st = l3d_pp_schedule_check(kind, pp, v, m);
    if (st == L3D_OK) st = check_cells(v, m, false);
    if (st == L3D_OK) st = alloc_schedule(s, kind, pp, v, m, false);
    if (st != L3D_OK) return st;
    if (kind == L3D_PP_ZBH1)
        build_zbh1(s);
    else if (kind == L3D_PP_ZBV)
        build_zbv(s);
    else
        for (int r = 0; r < pp; r++) build_stage(s, r);
    return L3D_OK;
}

l3d_status l3d_pp_schedule_build_forward(struct l3d_pp_schedule *s, enum l3d_pp_kind kind, int pp,
                                         int v, int m) {
    memset(s, 0, sizeof *s);
    if (pp < 1 || m < 1 || v < 1)
        return l3d_error(L3D_ERR_ARG, "pipeline of %d stages, %d micro-batches, %d virtual stages: "
                         "each must be at least 1", pp, m, v);
    l3d_status st = check_cells(v, m, true);
    if (st == L3D_OK)
        st = alloc_schedule(s, kind == L3D_PP_ZBV ? kind : v > 1 ? L3D_PP_INTERLEAVED
                                                                 : L3D_PP_GPIPE, pp, v, m, true);
    if (st != L3D_OK) return st;
    for (int r = 0; r < pp; r++) {
        struct builder b = {.s = s, .stage = r, .out = s->acts[r]};
        for (int i = 0; i < m; i++) /* (micro, virtual stage) order: dependencies come first */
            for (int c = 0; c < v; c++) compute(&b, true, i, c);
        s->n[r] = b.n;
        for (int c = 0; c < v; c++) s->slots[r * v + c] = 1;
    }
    return L3D_OK;
}

void l3d_pp_schedule_free(struct l3d_pp_schedule *s) {
    if (s->acts)
        for (int r = 0; r < s->pp; r++) l3d_free(s->acts[r]);
    l3d_free(s->acts);
    l3d_free(s->n);
    l3d_free(s->slots);
    l3d_free(s->wslots);
    memset(s, 0, sizeof *s);
}

/* ---- simulation -------------------------------------------------------------------------- */

/* A message's identity: activation or gradient of (micro, chunk) into stage `to`. */
static int64_t msg_key(const struct l3d_pp_schedule *s, bool grad, int micro, int chunk, int to) {
    return (((int64_t)to * 2 + grad) * s->v + chunk) * s->m + micro;
}

/* The simulation's state: per stage (clock, busy time, live micro-batches forward to B and to
 * W), per (stage, chunk) the next micro-batch expected to enter (forward), leave (B) and finish
 * (W: FIFO), per cell its state. */
struct sim {
    const struct l3d_pp_schedule *s;
    double t[3]; /* forward, B, W; a fused backward t[1] + t[2] */
    double *clock, *busy;
    int *live, *held, *wait, *next_in, *next_out, *next_w;
    uint8_t *state; /* 0, 1 forwarded, 3 B done, 2 done */
    struct l3d_pp_sim *out;
};

/* A computation of stage r: order and FIFO checks, the clock. */
static void sim_compute(struct sim *z, int r, const struct l3d_pp_action *a) {
    const struct l3d_pp_schedule *s = z->s;
    struct l3d_pp_sim *out = z->out;
    int cv = r * s->v + a->chunk;
    uint8_t *st = &z->state[(int64_t)cv * s->m + a->micro];
    double dt;
    if (a->op == L3D_PP_FWD) {
        if (*st != 0) out->order_ok = false;
        if (a->micro != z->next_in[cv]) out->fifo_ok = false;
        z->next_in[cv] = a->micro + 1;
        *st = 1;
        dt = z->t[0];
        z->live[r]++;
        z->held[r]++;
        if (r < 64 && z->live[r] > out->max_in_flight[r]) out->max_in_flight[r] = z->live[r];
        if (r < 64 && z->held[r] > out->max_held[r]) out->max_held[r] = z->held[r];
    } else if (a->op == L3D_PP_BWD || a->op == L3D_PP_BWD_B) {
        if (*st != 1) out->order_ok = false;
        if (a->micro != z->next_out[cv]) out->fifo_ok = false;
        z->next_out[cv] = a->micro + 1;
        bool fused = a->op == L3D_PP_BWD;
        *st = fused ? 2 : 3;
        dt = fused ? z->t[1] + z->t[2] : z->t[1];
        z->live[r]--;
        z->held[r] -= fused;
        z->wait[r] += !fused;
        if (r < 64 && z->wait[r] > out->max_wait[r]) out->max_wait[r] = z->wait[r];
    } else {
        if (*st != 3) out->order_ok = false; /* a W before its B */
        if (a->micro != z->next_w[cv]) out->fifo_ok = false;
        z->next_w[cv] = a->micro + 1;
        *st = 2;
        dt = z->t[2];
        z->held[r]--;
        z->wait[r]--;
    }
    z->clock[r] += dt;
    z->busy[r] += dt;
}

/* Runs what stage r can; returns whether it moved. sent: message send times (-1 none, -2 taken). */
static bool sim_stage(struct sim *z, int r, int *pos, double *sent, int64_t *pending) {
    const struct l3d_pp_schedule *s = z->s;
    int pp = s->pp;
    bool moved = false;
    while (pos[r] < s->n[r]) {
        const struct l3d_pp_action *a = &s->acts[r][pos[r]];
        if (a->op == L3D_PP_SEND_ACT || a->op == L3D_PP_SEND_GRAD) {
            bool grad = a->op == L3D_PP_SEND_GRAD;
            int to, chunk, vs = l3d_pp_vstage(s->kind, pp, r, a->chunk);
            l3d_pp_vstage_owner(s->kind, pp, vs + (grad ? -1 : 1), &to, &chunk);
            if (to != a->peer) z->out->matched = false; /* sent to another stage */
            int64_t key = msg_key(s, grad, a->micro, chunk, to);
            if (sent[key] >= 0) z->out->matched = false; /* sent twice */
            sent[key] = z->clock[r];
            (*pending)++;
        } else if (a->op == L3D_PP_RECV_ACT || a->op == L3D_PP_RECV_GRAD) {
            int64_t key = msg_key(s, a->op == L3D_PP_RECV_GRAD, a->micro, a->chunk, r);
            if (sent[key] < 0) break; /* blocked */
            if (sent[key] > z->clock[r]) z->clock[r] = sent[key];
            sent[key] = -2.0; /* consumed */
            (*pending)--;
        } else {
            sim_compute(z, r, a);
        }
        pos[r]++;
        moved = true;
    }
    return moved;
}

l3d_status l3d_pp_simulate_bw(const struct l3d_pp_schedule *s, double t_fwd, double t_b,
                              double t_w, struct l3d_pp_sim *out) {
    memset(out, 0, sizeof *out);
    int pp = s->pp, v = s->v, m = s->m;
    int64_t nkeys = (int64_t)pp * 2 * v * m, ncell = (int64_t)pp * v * m;
    size_t pv = (size_t)pp * v * sizeof(int);
    struct sim z = {.s = s, .t = {t_fwd, t_b, t_w}, .out = out,
                    .clock = l3d_calloc((size_t)pp * sizeof(double), "simulation"),
                    .busy = l3d_calloc((size_t)pp * sizeof(double), "simulation"),
                    .live = l3d_calloc((size_t)pp * sizeof(int), "simulation"),
                    .held = l3d_calloc((size_t)pp * sizeof(int), "simulation"),
                    .wait = l3d_calloc((size_t)pp * sizeof(int), "simulation"),
                    .next_in = l3d_calloc(pv, "simulation"),
                    .next_out = l3d_calloc(pv, "simulation"),
                    .next_w = l3d_calloc(pv, "simulation"),
                    .state = l3d_calloc((size_t)ncell, "simulation")};
    double *sent = l3d_alloc((size_t)nkeys * sizeof(double), "simulation"); /* send time, or -1 */
    int *pos = l3d_calloc((size_t)pp * sizeof(int), "simulation");
    for (int64_t i = 0; i < nkeys; i++) sent[i] = -1.0;
    out->order_ok = out->fifo_ok = out->matched = true;
    int64_t pending = 0; /* sent, not yet received */
    for (bool progress = true; progress;) {
        progress = false;
        for (int r = 0; r < pp; r++) progress |= sim_stage(&z, r, pos, sent, &pending);
    }
    for (int r = 0; r < pp; r++) {
        if (pos[r] < s->n[r]) out->deadlock = true;
        if (z.clock[r] > out->makespan) out->makespan = z.clock[r];
    }
    for (int64_t i = 0; i < ncell; i++)
        if (z.state[i] != 2) out->order_ok = false;
    if (pending != 0) out->matched = false;
    double idle = 0.0;
    for (int r = 0; r < pp; r++)
        idle += out->makespan > 0 ? 1.0 - z.busy[r] / out->makespan : 0.0;
    out->idle_fraction = idle / pp;
    l3d_free(sent);
    l3d_free(pos);
    l3d_free(z.clock), l3d_free(z.busy), l3d_free(z.live), l3d_free(z.held), l3d_free(z.wait);
    l3d_free(z.next_in), l3d_free(z.next_out), l3d_free(z.next_w), l3d_free(z.state);
    return L3D_OK;
}

l3d_status l3d_pp_simulate(const struct l3d_pp_schedule *s, double t_fwd, double t_bwd,
                           struct l3d_pp_sim *out) {
    return l3d_pp_simulate_bw(s, t_fwd, t_bwd / 2, t_bwd / 2, out);
}

double l3d_pp_schedule_bubble(enum l3d_pp_kind kind, int pp, int v, int m) {
    if (!l3d_pp_split(kind)) return l3d_pp_bubble(pp, v, m);
    struct l3d_pp_schedule s;
    if (l3d_pp_schedule_build(&s, kind, pp, v, m) != L3D_OK) return -1;
    struct l3d_pp_sim sim;
    l3d_pp_simulate_bw(&s, 1.0, 1.0, 1.0, &sim);
    l3d_pp_schedule_free(&s);
    return sim.deadlock ? -1 : sim.idle_fraction;
}

/* ---- partition --------------------------------------------------------------------------- */

double l3d_pp_layer_cost(const struct l3d_model_spec *cfg, int T) {
    double C = cfg->C;
    return 2.0 * 12.0 * C * C + 4.0 * C * T; /* qkv, projection, MLP; scores and weighted sum */
}

double l3d_pp_head_cost(const struct l3d_model_spec *cfg) {
    return 2.0 * (double)cfg->C * cfg->Vp; /* the LM head; the softmax is small beside it */
}

l3d_status l3d_pp_partition(const struct l3d_model_spec *cfg, int T, int stages, int *layers) {
    int L = cfg->L;
    if (stages < 1 || stages > L)
        return l3d_error(L3D_ERR_LAYOUT, "%d pipeline stages (--pp x --pp-virtual) but the model "
                         "has %d layers: each stage needs at least one layer; lower --pp or "
                         "--pp-virtual", stages, L);
    double lc = l3d_pp_layer_cost(cfg, T), head = l3d_pp_head_cost(cfg);
    double emb = 2.0 * cfg->C; /* token + position rows added */
    /* best[k][j]: smallest possible largest cost placing the first j layers on k stages */
    double *best = l3d_alloc((size_t)(stages + 1) * (L + 1) * sizeof(double), "partition");
    int *cut = l3d_alloc((size_t)(stages + 1) * (L + 1) * sizeof(int), "partition");
#define BEST(k, j) best[(k) * (L + 1) + (j)]
#define CUT(k, j) cut[(k) * (L + 1) + (j)]
    for (int k = 0; k <= stages; k++)
        for (int j = 0; j <= L; j++) BEST(k, j) = 1e300;
    BEST(0, 0) = 0.0;
    for (int k = 1; k <= stages; k++)
        for (int j = k; j <= L - (stages - k); j++)
            for (int i = k - 1; i < j; i++) { /* stage k-1 holds layers [i, j) */
                double c = (j - i) * lc + (k == 1 ? emb : 0.0) + (k == stages ? head : 0.0);
                double w = BEST(k - 1, i) > c ? BEST(k - 1, i) : c;
                if (w < BEST(k, j)) { /* ties keep the earliest cut: more layers later */
                    BEST(k, j) = w;
                    CUT(k, j) = i;
                }
            }
    for (int k = stages, j = L; k >= 1; k--) {
        layers[k - 1] = j - CUT(k, j);
        j = CUT(k, j);
    }
#undef BEST
#undef CUT
    l3d_free(best);
    l3d_free(cut);
    return L3D_OK;
}

l3d_status l3d_pp_parse_layers(const char *text, const struct l3d_model_spec *cfg, int stages,
                               int *layers) {
    int n = 0, sum = 0;
    const char *p = text;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || (*end && *end != ','))
            return l3d_error(L3D_ERR_ARG, "--pp-layers '%s': give a comma-separated list of "
                             "positive layer counts, one per pipeline stage", text);
        if (n == stages)
            return l3d_error(L3D_ERR_ARG, "--pp-layers '%s' lists more than the %d pipeline "
                             "stages (--pp x --pp-virtual)", text, stages);
        layers[n++] = (int)v;
        sum += (int)v;
        p = *end ? end + 1 : end;
    }
    if (n != stages || sum != cfg->L)
        return l3d_error(L3D_ERR_ARG, "--pp-layers '%s': %d counts summing to %d, but the layout "
                         "has %d stages (--pp x --pp-virtual) and the model %d layers", text, n, sum,
                         stages, cfg->L);
    return L3D_OK;
}
