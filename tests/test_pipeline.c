/*
 * Pipeline schedules as data, without MPI: every schedule of every size runs to the end in a
 * dataflow simulation (no deadlock, each send received once), forwards each micro-batch of each
 * chunk before its backward, keeps micro-batches first-in first-out per chunk, bounds the
 * micro-batches in flight (pp - stage for 1F1B, m for GPipe, Megatron-LM's warm-up count
 * 2 (pp - stage - 1) + (v - 1) pp plus one for interleaved), and idles exactly the textbook
 * bubble (pp - 1) / (v m + pp - 1). A broken schedule is caught. The balanced partition is the
 * best contiguous split (checked against brute force) and errors name the flags. The bytes and
 * action counts of a schedule in closed form (for the memory check, before it is built) are the
 * built schedule's.
 */
#include <stdlib.h>
#include <string.h>

#include "llm3d/pipeline.h"
#include "llm3d/spec.h"
#include "test.h"

/* The closed forms the memory check uses before building (l3d_pp_schedule_bytes, _actions) are
 * what a build allocates (the accounting allocator's count) and lists. */
static void check_closed_form(const struct l3d_pp_schedule *s, size_t allocated, bool fwd_only) {
    size_t want = l3d_pp_schedule_bytes(s->pp, s->v, s->m, fwd_only);
    if (allocated != want)
        fprintf(stderr, "  pp %d v %d m %d: allocated %zu bytes, closed form %zu\n", s->pp, s->v,
                s->m, allocated, want);
    CHECK(allocated == want);
    for (int r = 0; r < s->pp; r++)
        CHECK(l3d_pp_schedule_actions(s->kind, s->pp, s->v, s->m, r, fwd_only) == s->n[r]);
}

static void check_schedule(enum l3d_pp_kind kind, int pp, int v, int m, double tf, double tb) {
    struct l3d_pp_schedule s;
    size_t before = l3d_mem_used();
    CHECK(l3d_pp_schedule_build(&s, kind, pp, v, m) == L3D_OK);
    check_closed_form(&s, l3d_mem_used() - before, false);
    struct l3d_pp_sim sim;
    l3d_pp_simulate(&s, tf, tb, &sim);
    bool ok = !sim.deadlock && sim.order_ok && sim.fifo_ok && sim.matched;
    CHECK(ok);
    double want = l3d_pp_bubble(pp, v, m);
    if (kind != L3D_PP_INTERLEAVED || tb == 2 * tf) CHECK_NEAR(sim.idle_fraction, want, 1e-12);
    if (kind == L3D_PP_1F1B)
        for (int r = 0; r < pp && r < 64; r++) {
            int bound = pp - r < m ? pp - r : m;
            CHECK(sim.max_in_flight[r] == bound);
            CHECK(s.slots[r] == bound);
        }
    if (kind == L3D_PP_GPIPE)
        for (int r = 0; r < pp && r < 64; r++) CHECK(s.slots[r] == m && sim.max_in_flight[r] == m);
    if (kind == L3D_PP_INTERLEAVED) /* Megatron-LM's warm-up forwards, then one more in 1F1B */
        for (int r = 0; r < pp && r < 64; r++) {
            int warm = 2 * (pp - r - 1) + (v - 1) * pp, bound = warm + 1 < v * m ? warm + 1 : v * m;
            if (sim.max_in_flight[r] != bound)
                fprintf(stderr, "  interleaved pp %d v %d m %d stage %d: %d in flight, want %d\n",
                        pp, v, m, r, sim.max_in_flight[r], bound);
            CHECK(sim.max_in_flight[r] == bound);
            int slots = 0; /* every micro-batch in flight has a slot of its chunk */
            for (int c = 0; c < v; c++) slots += s.slots[r * v + c];
            CHECK(slots >= bound && slots <= v * m);
        }
    if (!ok || fabs(sim.idle_fraction - want) > 1e-12)
        fprintf(stderr, "  %s pp %d v %d m %d: deadlock %d order %d fifo %d matched %d idle %.6f "
                "want %.6f\n", l3d_pp_kind_name(kind), pp, v, m, sim.deadlock, sim.order_ok,
                sim.fifo_ok, sim.matched, sim.idle_fraction, want);
    l3d_pp_schedule_free(&s);
}

static void test_schedules(void) {
    const int pps[] = {1, 2, 3, 4, 8}, ms[] = {1, 2, 3, 4, 8, 16, 32};
    for (size_t i = 0; i < sizeof pps / sizeof pps[0]; i++)
        for (size_t j = 0; j < sizeof ms / sizeof ms[0]; j++) {
            check_schedule(L3D_PP_GPIPE, pps[i], 1, ms[j], 1.0, 2.0);
            check_schedule(L3D_PP_1F1B, pps[i], 1, ms[j], 1.0, 2.0);
            check_schedule(L3D_PP_1F1B, pps[i], 1, ms[j], 1.0, 1.0);
            for (int v = 2; v <= 3; v++)
                if (pps[i] >= 2 && ms[j] % pps[i] == 0)
                    check_schedule(L3D_PP_INTERLEAVED, pps[i], v, ms[j], 1.0, 2.0);
        }
    /* forward only (validation): runs through, every send received */
    for (int pp = 1; pp <= 4; pp++)
        for (int v = 1; v <= 3; v++) {
            struct l3d_pp_schedule s;
            struct l3d_pp_sim sim;
            size_t before = l3d_mem_used();
            CHECK(l3d_pp_schedule_build_forward(&s, L3D_PP_1F1B, pp, v, 5) == L3D_OK);
            check_closed_form(&s, l3d_mem_used() - before, true);
            l3d_pp_simulate(&s, 1.0, 2.0, &sim);
            CHECK(!sim.deadlock && sim.matched && sim.fifo_ok);
            l3d_pp_schedule_free(&s);
        }
    /* the textbook numbers: pp 4, m 8: 3/11 of the timeline idle; interleaved v 2: 3/19 */
    CHECK_NEAR(l3d_pp_bubble(4, 1, 8), 3.0 / 11.0, 1e-15);
    CHECK_NEAR(l3d_pp_bubble(4, 2, 8), 3.0 / 19.0, 1e-15);
}

/* The forwards each stage of a built schedule runs before its first backward: the warm-up
 * (l3d_pp_warmup) and one more when any is left, which is l3d_pp_in_flight with a pipeline; the
 * simulation's most in flight agrees. */
static void check_warmup(enum l3d_pp_kind kind, int pp, int v, int m) {
    struct l3d_pp_schedule s;
    struct l3d_pp_sim sim;
    CHECK(l3d_pp_schedule_build(&s, kind, pp, v, m) == L3D_OK);
    CHECK(l3d_pp_simulate(&s, 1.0, 2.0, &sim) == L3D_OK);
    for (int r = 0; r < pp; r++) {
        int64_t fwd = 0, total = (int64_t)m * v, warm = l3d_pp_warmup(kind, pp, r, v, m);
        for (int i = 0; i < s.n[r] && s.acts[r][i].op != L3D_PP_BWD; i++)
            fwd += s.acts[r][i].op == L3D_PP_FWD;
        bool ok = fwd == (warm < total ? warm + 1 : total);
        if (pp > 1) ok = ok && fwd == l3d_pp_in_flight(kind, pp, r, v, m) &&
                         sim.max_in_flight[r] == fwd;
        CHECK(ok);
        if (!ok)
            fprintf(stderr, "  %s pp %d v %d m %d stage %d: %lld forwards before the first "
                    "backward, warm-up %lld, in flight %lld, simulated %d\n",
                    l3d_pp_kind_name(kind), pp, v, m, r, (long long)fwd, (long long)warm,
                    (long long)l3d_pp_in_flight(kind, pp, r, v, m), sim.max_in_flight[r]);
    }
    l3d_pp_schedule_free(&s);
}

static void test_warmup(void) {
    for (int pp = 1; pp <= 8; pp++)
        for (int m = 1; m <= 24; m++) { /* m < pp among them */
            check_warmup(L3D_PP_GPIPE, pp, 1, m);
            check_warmup(L3D_PP_1F1B, pp, 1, m);
            for (int v = 2; v <= 4; v++)
                if (pp >= 2 && m % pp == 0) check_warmup(L3D_PP_INTERLEAVED, pp, v, m);
        }
    /* the values: GPipe all m v; 1F1B pp - r - 1, at most m; interleaved 2 (pp - r - 1) +
     * (v - 1) pp, at most m v; no pipeline: one micro-batch in flight */
    static const struct {
        enum l3d_pp_kind kind;
        int pp, r, v, m, warm, in_flight;
    } want[] = {
        {L3D_PP_GPIPE, 4, 0, 1, 8, 8, 8},        {L3D_PP_1F1B, 4, 0, 1, 6, 3, 4},
        {L3D_PP_1F1B, 4, 1, 1, 6, 2, 3},         {L3D_PP_1F1B, 4, 3, 1, 6, 0, 1},
        {L3D_PP_1F1B, 4, 0, 1, 2, 2, 2},         {L3D_PP_INTERLEAVED, 4, 0, 2, 8, 10, 11},
        {L3D_PP_INTERLEAVED, 4, 3, 2, 8, 4, 5},  {L3D_PP_INTERLEAVED, 4, 0, 3, 4, 12, 12},
        {L3D_PP_GPIPE, 1, 0, 1, 8, 8, 1},        {L3D_PP_1F1B, 1, 0, 1, 8, 0, 1},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        int64_t w = l3d_pp_warmup(want[i].kind, want[i].pp, want[i].r, want[i].v, want[i].m);
        int64_t f = l3d_pp_in_flight(want[i].kind, want[i].pp, want[i].r, want[i].v, want[i].m);
        CHECK(w == want[i].warm && f == want[i].in_flight);
    }
}

/* 1F1B's shape on stage 0 of 4 with 6 micro-batches: 3 warm-up forwards, then F3 B0 F4 B1 F5 B2,
 * then B3 B4 B5; interleaving lowers stage 0's idle time below 1F1B's. */
static void test_shapes(void) {
    struct l3d_pp_schedule s;
    CHECK(l3d_pp_schedule_build(&s, L3D_PP_1F1B, 4, 1, 6) == L3D_OK);
    char seq[64] = {0};
    int n = 0;
    for (int i = 0; i < s.n[0]; i++) {
        const struct l3d_pp_action *a = &s.acts[0][i];
        if (a->op == L3D_PP_FWD || a->op == L3D_PP_BWD) {
            seq[n++] = a->op == L3D_PP_FWD ? 'F' : 'B';
            seq[n++] = (char)('0' + a->micro);
        }
    }
    CHECK(strcmp(seq, "F0F1F2F3B0F4B1F5B2B3B4B5") == 0);
    /* stage 0 sends activations to stage 1 and receives gradients from it, nothing else */
    int sends = 0, recvs = 0;
    for (int i = 0; i < s.n[0]; i++) {
        const struct l3d_pp_action *a = &s.acts[0][i];
        sends += a->op == L3D_PP_SEND_ACT && a->peer == 1;
        recvs += a->op == L3D_PP_RECV_GRAD && a->peer == 1;
        CHECK(a->op != L3D_PP_RECV_ACT && a->op != L3D_PP_SEND_GRAD);
    }
    CHECK(sends == 6 && recvs == 6);
    l3d_pp_schedule_free(&s);
    /* interleaved: stage 3 of 4 (the last rank) sends chunk 0's output to rank 0, chunk 1 */
    CHECK(l3d_pp_schedule_build(&s, L3D_PP_INTERLEAVED, 4, 2, 8) == L3D_OK);
    int wrap = 0;
    for (int i = 0; i < s.n[3]; i++)
        wrap += s.acts[3][i].op == L3D_PP_SEND_ACT && s.acts[3][i].peer == 0 && s.acts[3][i].chunk == 0;
    CHECK(wrap == 8);
    l3d_pp_schedule_free(&s);
}

/* A stage 0 that skips a send leaves stage 1 waiting forever (deadlock); one that runs its
 * backwards out of order breaks first-in first-out; the simulator says so. */
static void test_broken(void) {
    struct l3d_pp_schedule s;
    CHECK(l3d_pp_schedule_build(&s, L3D_PP_1F1B, 2, 1, 2) == L3D_OK);
    struct l3d_pp_sim sim;
    /* stage 0: drop its first send */
    struct l3d_pp_action saved[32];
    int n0 = s.n[0];
    memcpy(saved, s.acts[0], (size_t)n0 * sizeof saved[0]);
    for (int i = 0, j = 0; i < n0; i++)
        if (!(saved[i].op == L3D_PP_SEND_ACT && saved[i].micro == 0)) s.acts[0][j++] = saved[i];
    s.n[0] = n0 - 1;
    l3d_pp_simulate(&s, 1, 2, &sim);
    CHECK(sim.deadlock);
    memcpy(s.acts[0], saved, (size_t)n0 * sizeof saved[0]);
    s.n[0] = n0;
    /* stage 0: backward of micro-batch 1 before micro-batch 0 (breaks first-in first-out) */
    int b0 = -1, b1 = -1;
    for (int i = 0; i < n0; i++) {
        if (s.acts[0][i].op == L3D_PP_BWD && s.acts[0][i].micro == 0) b0 = i;
        if (s.acts[0][i].op == L3D_PP_BWD && s.acts[0][i].micro == 1) b1 = i;
    }
    CHECK(b0 >= 0 && b1 >= 0);
    s.acts[0][b0].micro = 1;
    s.acts[0][b1].micro = 0;
    l3d_pp_simulate(&s, 1, 2, &sim);
    CHECK(!sim.fifo_ok);
    l3d_pp_schedule_free(&s);
}

/* A zero-bubble schedule's shared checks, after the caller's (ok): for m >= pp the idle share
 * (pp - 1) / (per_m m + pp - 1), below the reference's (ref: the schedule it improves on), and
 * l3d_pp_schedule_bubble's value that of the simulation. */
static void check_split(enum l3d_pp_kind kind, int v, int pp, int m, double per_m,
                        const struct l3d_pp_sim *sim, const struct l3d_pp_sim *ref, bool ok) {
    if (pp > 1) ok = ok && sim->idle_fraction < ref->idle_fraction - 1e-9;
    if (m >= pp) ok = ok && fabs(sim->idle_fraction - (pp - 1.0) / (per_m * m + pp - 1)) < 1e-12;
    ok = ok && fabs(l3d_pp_schedule_bubble(kind, pp, v, m) - sim->idle_fraction) < 1e-15;
    CHECK(ok);
    if (!ok)
        fprintf(stderr, "  %s pp %d m %d: deadlock %d order %d fifo %d matched %d idle %.6f "
                "(reference %.6f)\n", l3d_pp_kind_name(kind), pp, m, sim->deadlock,
                sim->order_ok, sim->fifo_ok, sim->matched, sim->idle_fraction, ref->idle_fraction);
}

/* A zero-bubble schedule s (kind, v chunks) and its reference (one chunk, rkind), built for pp
 * stages and m micro-batches, s's bytes and action counts checked, simulated with unit times (the
 * reference's rt each: its stages are v chunks); whether s runs through, in order, matched. */
static bool split_and_ref(struct l3d_pp_schedule *s, enum l3d_pp_kind kind, int v,
                          struct l3d_pp_schedule *r, enum l3d_pp_kind rkind, double rt, int pp,
                          int m, struct l3d_pp_sim *sim, struct l3d_pp_sim *ref) {
    size_t before = l3d_mem_used();
    CHECK(l3d_pp_schedule_build(s, kind, pp, v, m) == L3D_OK);
    check_closed_form(s, l3d_mem_used() - before, false);
    CHECK(l3d_pp_schedule_build(r, rkind, pp, 1, m) == L3D_OK);
    l3d_pp_simulate_bw(s, 1.0, 1.0, 1.0, sim);
    l3d_pp_simulate_bw(r, rt, rt, rt, ref);
    return !sim->deadlock && sim->order_ok && sim->fifo_ok && sim->matched;
}

/* ZB-H1: runs through; 1F1B's in-flight bound forward to B (l3d_pp_fb_slots too: the last
 * stage 1, its head once); forward to W (the activations kept) within l3d_pp_in_flight's
 * min(pp, m), reached on the first stage: 1F1B's peak; W slots the
 * most B to W; for m >= pp the paper's bubble (pp - 1) (F + B - W) per stage with unit
 * times, (pp - 1) / (3 m + pp - 1) of the timeline, and below 1F1B's always. */
static void check_zbh1(int pp, int m) {
    struct l3d_pp_schedule s, one;
    struct l3d_pp_sim sim, ref;
    bool ok = split_and_ref(&s, L3D_PP_ZBH1, 1, &one, L3D_PP_1F1B, 1.0, pp, m, &sim, &ref);
    for (int r = 0; r < pp; r++) {
        int bound = pp - r < m ? pp - r : m, held = (int)l3d_pp_in_flight(L3D_PP_ZBH1, pp, r, 1, m);
        ok = ok && sim.max_in_flight[r] == bound && sim.max_held[r] <= held &&
             s.slots[r] == sim.max_held[r] && ref.max_held[r] == bound &&
             s.wslots[r] == sim.max_wait[r] && s.wslots[r] >= 1 && s.wslots[r] <= s.slots[r] &&
             one.wslots[r] == 0 && l3d_pp_fb_slots(&s, r, 0) == bound &&
             l3d_pp_fb_slots(&one, r, 0) == bound;
    }
    ok = ok && sim.max_held[0] == ref.max_held[0];
    check_split(L3D_PP_ZBH1, 1, pp, m, 3.0, &sim, &ref, ok);
    l3d_pp_schedule_free(&s);
    l3d_pp_schedule_free(&one);
}

/* ZB-H1 at every size; a W moved before its B, or a W dropped, is caught. */
static void test_zbh1(void) {
    const int pps[] = {1, 2, 3, 4, 8}, ms[] = {1, 2, 3, 4, 8, 16, 32};
    for (size_t i = 0; i < sizeof pps / sizeof pps[0]; i++)
        for (size_t j = 0; j < sizeof ms / sizeof ms[0]; j++) check_zbh1(pps[i], ms[j]);
    CHECK_NEAR(l3d_pp_schedule_bubble(L3D_PP_ZBH1, 4, 1, 8), 3.0 / 27.0, 1e-12);
    struct l3d_pp_schedule w8;
    CHECK(l3d_pp_schedule_build(&w8, L3D_PP_ZBH1, 8, 1, 32) == L3D_OK);
    /* stage r defers r W past the next B (the later stages wait for W so that the earlier
     * stages' B comes sooner): W slots 1 .. pp, activation slots pp on every stage */
    for (int r = 0; r < 8; r++) CHECK(w8.wslots[r] == r + 1 && w8.slots[r] == 8);
    l3d_pp_schedule_free(&w8);
    CHECK_NEAR(l3d_pp_schedule_bubble(L3D_PP_1F1B, 4, 1, 8), 3.0 / 11.0, 1e-15);
    struct l3d_pp_schedule s;
    struct l3d_pp_sim sim;
    CHECK(l3d_pp_schedule_build(&s, L3D_PP_ZBH1, 2, 1, 4) == L3D_OK);
    struct l3d_pp_action *a = s.acts[1];
    int b = -1, w = -1;
    for (int i = 0; i < s.n[1]; i++) {
        if (a[i].op == L3D_PP_BWD_B && a[i].micro == 2) b = i;
        if (a[i].op == L3D_PP_BWD_W && a[i].micro == 2) w = i;
    }
    CHECK(b >= 0 && w > b);
    struct l3d_pp_action wa = a[w];
    memmove(&a[b + 1], &a[b], (size_t)(w - b) * sizeof *a); /* W just before its B */
    a[b] = wa;
    l3d_pp_simulate_bw(&s, 1, 1, 1, &sim);
    CHECK(!sim.order_ok);
    memmove(&a[b], &a[b + 1], (size_t)(w - b) * sizeof *a); /* back, then W dropped */
    a[w] = wa;
    l3d_pp_simulate_bw(&s, 1, 1, 1, &sim);
    CHECK(sim.order_ok && !sim.deadlock);
    s.n[1]--;
    memmove(&a[w], &a[w + 1], (size_t)(s.n[1] - w) * sizeof *a);
    l3d_pp_simulate_bw(&s, 1, 1, 1, &sim);
    CHECK(!sim.order_ok);
    l3d_pp_schedule_free(&s);
}

/* ZB-V: runs through; rank r holds virtual stages r and 2 pp - 1 - r, and each chunk's actions
 * talk to the ranks of the stages beside it (rank pp - 1 to itself at the V's turn); at most
 * min(2 pp, 2 m) chunk micro-batches held to W on a rank (pp whole stages': 1F1B's peak); for
 * m >= pp the bubble (pp - 1) / (6 m + pp - 1) with unit chunk times, half a ZB-H1's of whole
 * stages (its F, B, W twice as long), and below it always. */
static void check_zbv(int pp, int m) {
    struct l3d_pp_schedule s, h;
    struct l3d_pp_sim sim, ref;
    bool ok = split_and_ref(&s, L3D_PP_ZBV, 2, &h, L3D_PP_ZBH1, 2.0, pp, m, &sim, &ref);
    int cap = 2 * (pp < m ? pp : m);
    for (int r = 0; r < pp; r++) {
        ok = ok && sim.max_held[r] <= cap && sim.max_held[r] == l3d_pp_in_flight(L3D_PP_ZBV, pp, r,
                                                                                 2, m);
        for (int i = 0; i < s.n[r]; i++) {
            const struct l3d_pp_action *a = &s.acts[r][i];
            int vs = l3d_pp_vstage(L3D_PP_ZBV, pp, r, a->chunk), pr, pc;
            if (a->op == L3D_PP_SEND_ACT || a->op == L3D_PP_RECV_GRAD)
                l3d_pp_vstage_owner(L3D_PP_ZBV, pp, vs + 1, &pr, &pc);
            else if (a->op == L3D_PP_RECV_ACT || a->op == L3D_PP_SEND_GRAD)
                l3d_pp_vstage_owner(L3D_PP_ZBV, pp, vs - 1, &pr, &pc);
            else
                continue;
            ok = ok && a->peer == pr && (r != pp - 1 || (pr == r) == (a->chunk == (a->op ==
                                         L3D_PP_SEND_ACT || a->op == L3D_PP_RECV_GRAD ? 0 : 1)));
        }
    }
    check_split(L3D_PP_ZBV, 2, pp, m, 6.0, &sim, &ref, ok);
    l3d_pp_schedule_free(&s);
    l3d_pp_schedule_free(&h);
}

/* ZB-V at every size; its placement's map and inverse; a send to the interleaved placement's
 * rank instead of the V's is caught (unmatched); --pp-virtual other than 2 refused by name. */
static void test_zbv(void) {
    const int pps[] = {2, 3, 4, 8}, ms[] = {1, 2, 3, 4, 8, 16, 32};
    for (size_t i = 0; i < sizeof pps / sizeof pps[0]; i++)
        for (size_t j = 0; j < sizeof ms / sizeof ms[0]; j++) check_zbv(pps[i], ms[j]);
    for (int vs = 0; vs < 8; vs++) {
        int r, c;
        l3d_pp_vstage_owner(L3D_PP_ZBV, 4, vs, &r, &c);
        CHECK(l3d_pp_vstage(L3D_PP_ZBV, 4, r, c) == vs && r == (vs < 4 ? vs : 7 - vs));
    }
    struct l3d_pp_schedule s;
    struct l3d_pp_sim sim;
    CHECK(l3d_pp_schedule_build(&s, L3D_PP_ZBV, 4, 2, 8) == L3D_OK);
    for (int i = 0; i < s.n[2]; i++) /* rank 2's chunk 1 (stage 5) sends to stage 6: rank 1 */
        if (s.acts[2][i].op == L3D_PP_SEND_ACT && s.acts[2][i].chunk == 1) s.acts[2][i].peer = 3;
    l3d_pp_simulate_bw(&s, 1, 1, 1, &sim);
    CHECK(!sim.matched);
    l3d_pp_schedule_free(&s);
    CHECK(l3d_pp_schedule_build(&s, L3D_PP_ZBV, 4, 3, 8) == L3D_ERR_ARG);
    CHECK(strstr(l3d_error_message(), "give --pp-virtual 2") != NULL);
}

static double stage_cost(const struct l3d_model_spec *cfg, int T, const int *layers, int k, int n) {
    return layers[k] * l3d_pp_layer_cost(cfg, T) + (k == 0 ? 2.0 * cfg->C : 0.0) +
           (k == n - 1 ? l3d_pp_head_cost(cfg) : 0.0);
}

static double worst(const struct l3d_model_spec *cfg, int T, const int *layers, int n) {
    double w = 0;
    for (int k = 0; k < n; k++) w = fmax(w, stage_cost(cfg, T, layers, k, n));
    return w;
}

static void test_partition(void) {
    struct l3d_model_spec cfg;
    l3d_model_preset(&cfg, "d12");
    int layers[12];
    /* GPT-2 124M on 2 stages: the head weighs about 5.5 layers, so the last stage gets fewer */
    CHECK(l3d_pp_partition(&cfg, 1024, 2, layers) == L3D_OK);
    CHECK(layers[0] + layers[1] == 12 && layers[0] > layers[1]);
    /* brute force over every split into 3 stages */
    CHECK(l3d_pp_partition(&cfg, 64, 3, layers) == L3D_OK);
    double best = 1e300;
    for (int a = 1; a <= 10; a++)
        for (int b = 1; a + b <= 11; b++) {
            int t[3] = {a, b, 12 - a - b};
            best = fmin(best, worst(&cfg, 64, t, 3));
        }
    CHECK(worst(&cfg, 64, layers, 3) == best);
    CHECK(layers[0] + layers[1] + layers[2] == 12);
    /* without a heavy head the split is even */
    struct l3d_model_spec small = {.L = 8, .C = 256, .NH = 4, .V = 256, .maxT = 64};
    l3d_gpt_config_finish(&small);
    CHECK(l3d_pp_partition(&small, 64, 4, layers) == L3D_OK);
    CHECK(layers[0] == 2 && layers[1] == 2 && layers[2] == 2 && layers[3] == 2);
    /* errors */
    CHECK(l3d_pp_partition(&small, 64, 9, layers) == L3D_ERR_LAYOUT);
    CHECK(strstr(l3d_error_message(), "8 layers") != NULL);
    CHECK(l3d_pp_parse_layers("3,5", &small, 2, layers) == L3D_OK && layers[0] == 3 && layers[1] == 5);
    CHECK(l3d_pp_parse_layers("3,4", &small, 2, layers) == L3D_ERR_ARG);
    CHECK(strstr(l3d_error_message(), "--pp-layers") != NULL);
    CHECK(l3d_pp_parse_layers("3,x", &small, 2, layers) == L3D_ERR_ARG);
    CHECK(l3d_pp_parse_layers("0,8", &small, 2, layers) == L3D_ERR_ARG);
    CHECK(l3d_pp_parse_layers("2,2,4", &small, 2, layers) == L3D_ERR_ARG);
    struct l3d_pp_schedule s;
    CHECK(l3d_pp_schedule_build(&s, L3D_PP_INTERLEAVED, 4, 2, 6) == L3D_ERR_ARG);
    CHECK(strstr(l3d_error_message(), "multiple of --pp 4") != NULL);
    CHECK(l3d_pp_schedule_build(&s, L3D_PP_1F1B, 4, 2, 8) == L3D_ERR_ARG);
    CHECK(l3d_pp_schedule_check(L3D_PP_INTERLEAVED, 4, 2, 6) == L3D_ERR_ARG);
    CHECK(l3d_pp_schedule_check(L3D_PP_INTERLEAVED, 4, 2, 8) == L3D_OK);
    /* more (micro, chunk) pairs than a stage's int count of actions holds: an error naming
     * --grad-accum, before any allocation (the bytes would be 25 GiB a stage) */
    size_t before = l3d_mem_used();
    CHECK(l3d_pp_schedule_build(&s, L3D_PP_1F1B, 1, 1, 1 << 30) == L3D_ERR_ARG);
    CHECK(strstr(l3d_error_message(), "--grad-accum") != NULL && l3d_mem_used() == before);
    CHECK(s.n == NULL && s.acts == NULL);
    CHECK(l3d_pp_schedule_bytes(2, 1, 1 << 30, false) > ((size_t)144 << 30));
    enum l3d_pp_kind k;
    CHECK(l3d_pp_kind_parse("1f1b", &k) == L3D_OK && k == L3D_PP_1F1B);
    CHECK(l3d_pp_kind_parse("zb-h1", &k) == L3D_OK && k == L3D_PP_ZBH1);
    CHECK(l3d_pp_kind_parse("zigzag", &k) == L3D_ERR_ARG);
}

int main(void) {
    test_schedules();
    test_warmup();
    test_shapes();
    test_broken();
    test_zbh1();
    test_zbv();
    test_partition();
    return TEST_REPORT();
}
