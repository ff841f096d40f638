/*
 * The hang watchdog of the MPI communicator (struct l3d_watch, comm.h; docs/DESIGN.md).
 *
 * A rank that stops or hangs would leave the others waiting forever: mpirun only notices a rank
 * that dies. So every blocking operation of src/comm/mpi.c is its non-blocking form and a wait
 * here (l3d_mpi_watch_wait), which polls with growing sleeps and, after the world's watch timeout,
 * asks the ranks it waits on whether they are alive (over a duplicate of the world, answered from
 * the sleeping part of every other rank's wait), then names the one that does not respond (or
 * reports a deadlock when all do) and aborts the job with status 75 (EX_TEMPFAIL: --resume auto
 * tries again). The wait also records the longest wait and what it was on, for the step report.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/mpi-impl.h"
#include "comm/watchdog.h"

/* Every wait is a loop of MPI_Test: spinning for the first WATCH_SPIN_S (a wait of up to a
 * second, the common case, keeps its latency; Open MPI's shared-memory transport moves a large
 * message only inside MPI calls, and napping from 200 us on made d6's DP communication 11x
 * slower: docs/DESIGN.md), then sleeping an eighth of the time waited so far, between
 * WATCH_NAP_MIN_S and WATCH_NAP_MAX_S: a wait is lengthened by at most 1/8 (and 5 ms), and a rank
 * that waits long calls MPI 200 times a second instead of burning a core. Liveness questions go
 * over a duplicate of the world (wd), so they never match the program's own messages: a ping has
 * an even tag 2k, its answer the tag 2k + 1; ranks answer from the sleeping part of every wait. */
#define WATCH_SPIN_S 1.0
#define WATCH_NAP_MIN_S 10e-6
#define WATCH_NAP_MAX_S 5e-3
#define WATCH_EXIT 75 /* EX_TEMPFAIL: try again (--resume auto) */
/* The tag of the notice a rank sends every other rank before it aborts the job: the others then
 * end quietly instead of blaming it (a rank inside MPI_Abort answers no question). Questions use
 * the even tags 2 to 32000, answers the odd ones after them. */
#define WATCH_TAG_NOTICE 32700
/* A gap between two polls longer than this: the rank itself was stopped (SIGSTOP, a debugger,
 * the machine suspended), which is no wait on the others and no stall of theirs. */
#define WATCH_AWAY_S 0.5

struct mpi_watch {
    struct l3d_watch pub;
    MPI_Comm wd;           /* a duplicate of the world for the liveness questions */
    MPI_Group world_group; /* to name a communicator's members by their world ranks */
    int seq;               /* the next question's number */
    int world_size;
    bool aborting;         /* another rank's notice came: the job is being aborted */
};

struct mpi_watch *l3d_mpi_watch_init(int world_size) {
    struct mpi_watch *w = l3d_calloc(sizeof *w, "watchdog");
    w->pub.doing = (struct l3d_doing){NULL, -1, -1};
    L3D_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &w->wd));
    L3D_MPI_CHECK(MPI_Comm_set_errhandler(w->wd, MPI_ERRORS_RETURN));
    L3D_MPI_CHECK(MPI_Comm_group(MPI_COMM_WORLD, &w->world_group));
    w->world_size = world_size;
    return w;
}

void l3d_mpi_watch_free(struct mpi_watch *w) {
    L3D_MPI_CHECK(MPI_Group_free(&w->world_group));
    L3D_MPI_CHECK(MPI_Comm_free(&w->wd));
    l3d_free(w);
}

struct l3d_watch *l3d_mpi_watch_pub(struct mpi_watch *w) { return &w->pub; }


/* Answers the liveness questions that have arrived; drops answers that came too late. */
static void watch_answer(struct mpi_watch *w) {
    static const int alive = 1;
    for (;;) {
        int flag = 0;
        MPI_Status st;
        L3D_MPI_CHECK(MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, w->wd, &flag, &st));
        if (!flag) return;
        int v;
        L3D_MPI_CHECK(MPI_Recv(&v, 1, MPI_INT, st.MPI_SOURCE, st.MPI_TAG, w->wd,
                               MPI_STATUS_IGNORE));
        if (st.MPI_TAG == WATCH_TAG_NOTICE) {
            w->aborting = true;
            continue;
        }
        if (st.MPI_TAG % 2 != 0) continue; /* an answer to a question given up on */
        MPI_Request q;
        L3D_MPI_CHECK(MPI_Isend(&alive, 1, MPI_INT, st.MPI_SOURCE, st.MPI_TAG + 1, w->wd, &q));
        L3D_MPI_CHECK(MPI_Request_free(&q));
    }
}

static void rank_name(const struct mpi_watch *w, int world_rank, char *buf, size_t n) {
    if (w->pub.name)
        w->pub.name(w->pub.name_ctx, world_rank, buf, n);
    else
        snprintf(buf, n, "rank %d", world_rank);
}

/* "step 7, DP gradient bucket 2 (all-reduce with ranks 1, 3)" into buf. */
static void watch_describe(const struct mpi_comm *m, int peer, const char *op, char *buf,
                           size_t n) {
    const struct l3d_watch *p = &m->watch->pub;
    size_t k = 0;
#define PUT(...) (k += (size_t)snprintf(buf + k, k < n ? n - k : 0, __VA_ARGS__))
    if (p->step > 0) PUT("step %d, ", p->step);
    PUT("%s", p->doing.what ? p->doing.what : "communication");
    if (p->doing.index >= 0) PUT(" %d", p->doing.index);
    if (p->doing.chunk >= 0) PUT(" chunk %d", p->doing.chunk);
    const char *role = m->base.role ? m->base.role : "";
    int size = m->base.size;
    if (peer >= 0) {
        int wr = peer;
        MPI_Group g;
        L3D_MPI_CHECK(MPI_Comm_group(m->comm, &g));
        L3D_MPI_CHECK(MPI_Group_translate_ranks(g, 1, &peer, m->watch->world_group, &wr));
        L3D_MPI_CHECK(MPI_Group_free(&g));
        char name[96];
        rank_name(m->watch, wr, name, sizeof name);
        PUT(" (%s%s%s %s)", role, *role ? " " : "", op, name);
    } else {
        PUT(" (%s%s%s with ranks", role, *role ? " " : "", op);
        MPI_Group g;
        L3D_MPI_CHECK(MPI_Comm_group(m->comm, &g));
        for (int r = 0; r < size && r < 16; r++) {
            int wr;
            L3D_MPI_CHECK(MPI_Group_translate_ranks(g, 1, &r, m->watch->world_group, &wr));
            PUT("%s %d", r ? "," : "", wr);
        }
        L3D_MPI_CHECK(MPI_Group_free(&g));
        PUT("%s)", size > 16 ? ", ..." : "");
    }
#undef PUT
    if (k >= n && n > 4) memcpy(buf + n - 4, "...", 4);
}

/* ---- expiry ---------------------------------------------------------------------------------- */

/* Another rank has reported and aborts the job: this one ends too, without a message. */
static _Noreturn void watch_quiet_abort(struct mpi_watch *w) {
    (void)w;
    fflush(stdout);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, WATCH_EXIT);
    exit(WATCH_EXIT);
}

/* The wait on r has lasted timeout_s. Asks every rank it waits on (the peer, or the other members
 * of the communicator) whether it is alive, for a grace of a quarter of the timeout (1 to 30 s),
 * answering the others' questions meanwhile. Returns true when r completed in the meantime; false
 * when every rank answered (the caller waits on); reports and aborts when one does not. */
static bool watch_expired(struct mpi_comm *m, MPI_Request *r, int peer, const char *op,
                          double waited, bool final) {
    struct mpi_watch *w = m->watch;
    static const int question = 0;
    int size = m->base.size, n = 0;
    int *who = l3d_alloc(3 * (size_t)size * sizeof *who, "watchdog");
    int *ans = who + size, *state = ans + size; /* state: 0 asked, 1 answered */
    MPI_Request *rq = l3d_alloc((size_t)size * sizeof *rq, "watchdog");
    MPI_Group g;
    L3D_MPI_CHECK(MPI_Comm_group(m->comm, &g));
    for (int k = 0; k < size; k++) {
        if (peer >= 0 ? k != peer : k == m->base.rank) continue;
        L3D_MPI_CHECK(MPI_Group_translate_ranks(g, 1, &k, w->world_group, &who[n]));
        n++;
    }
    L3D_MPI_CHECK(MPI_Group_free(&g));
    int tag = 2 * (1 + w->seq++ % 16000); /* even tags up to 32000: MPI guarantees 32767 */
    for (int k = 0; k < n; k++) {
        MPI_Request q;
        L3D_MPI_CHECK(MPI_Isend(&question, 1, MPI_INT, who[k], tag, w->wd, &q));
        L3D_MPI_CHECK(MPI_Request_free(&q));
        L3D_MPI_CHECK(MPI_Irecv(&ans[k], 1, MPI_INT, who[k], tag + 1, w->wd, &rq[k]));
        state[k] = 0;
    }
    double grace = w->pub.timeout_s / 4;
    grace = grace < 1 ? 1 : grace > 30 ? 30 : grace;
    double t0 = l3d_mpi_now_s();
    int flag = 0, answered = 0;
    while (answered < n && l3d_mpi_now_s() - t0 < grace) {
        L3D_MPI_CHECK(MPI_Test(r, &flag, MPI_STATUS_IGNORE));
        if (flag) break;
        for (int k = 0; k < n; k++) {
            if (state[k]) continue;
            int f = 0;
            L3D_MPI_CHECK(MPI_Test(&rq[k], &f, MPI_STATUS_IGNORE));
            if (f) state[k] = 1, answered++;
        }
        watch_answer(w);
        if (w->aborting) watch_quiet_abort(w);
        l3d_mpi_nap(1e-3);
    }
    if (flag || (answered == n && !final)) { /* done, or everyone alive: wait on */
        for (int k = 0; k < n; k++)
            if (!state[k]) { /* a late answer is dropped by watch_answer */
                L3D_MPI_CHECK(MPI_Cancel(&rq[k]));
                L3D_MPI_CHECK(MPI_Wait(&rq[k], MPI_STATUS_IGNORE));
            }
        l3d_free(rq);
        l3d_free(who);
        return flag != 0;
    }
    /* Ranks that waited in the same operation reach this point together: the lower world rank
     * reports first (20 ms apart, up to 1 s), and its notice ends the others quietly. */
    double turn = l3d_mpi_now_s() + 0.02 * (m->base.world_rank % 50);
    do {
        watch_answer(w);
        if (w->aborting) watch_quiet_abort(w);
        l3d_mpi_nap(1e-3);
    } while (l3d_mpi_now_s() < turn);
    static const int notice = 0;
    for (int dst = 0; dst < w->world_size; dst++) {
        if (dst == m->base.world_rank) continue;
        MPI_Request q;
        L3D_MPI_CHECK(MPI_Isend(&notice, 1, MPI_INT, dst, WATCH_TAG_NOTICE, w->wd, &q));
        L3D_MPI_CHECK(MPI_Request_free(&q));
    }
    char self[96], what[512], silent[384];
    rank_name(w, m->base.world_rank, self, sizeof self);
    watch_describe(m, peer, op, what, sizeof what);
    size_t k = 0;
    for (int i = 0; i < n && k < sizeof silent; i++)
        if (!state[i]) {
            char name[96];
            rank_name(w, who[i], name, sizeof name);
            k += (size_t)snprintf(silent + k, sizeof silent - k, "%s%s", k ? ", " : "", name);
        }
    if (answered < n)
        fprintf(stderr, "llm3d: %s: no progress for %.1f s (--timeout %g) at %s; %s did not "
                "respond within %.0f s (stopped, hung or dead): aborting the job, the last "
                "checkpoint is kept (--resume auto continues)\n", self, waited,
                w->pub.timeout_s, what, silent, grace);
    else
        fprintf(stderr, "llm3d: %s: no progress for %.1f s (--timeout %g) at %s, although the "
                "ranks it waits on respond (a deadlock, or a wait longer than --timeout): "
                "aborting the job, the last checkpoint is kept\n", self, waited, w->pub.timeout_s,
                what);
    fflush(stdout);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, WATCH_EXIT);
    exit(WATCH_EXIT);
}

void l3d_mpi_watch_wait(struct mpi_comm *m, MPI_Request *r, int peer, const char *op) {
    int flag = 0;
    struct mpi_watch *w = m->watch;
    double t0 = l3d_mpi_now_s(), t = t0, prev = t0, timeout = w->pub.timeout_s;
    double deadline = timeout > 0 ? t0 + timeout : INFINITY;
    double away = 0.0; /* time this rank did not run (itself stopped): not a wait on others */
    int expiries = 0;
    for (;;) {
        L3D_MPI_CHECK(MPI_Test(r, &flag, MPI_STATUS_IGNORE));
        if (flag) break;
        t = l3d_mpi_now_s();
        if (t - prev > WATCH_AWAY_S) { /* polls are at most 5 ms apart when the rank runs */
            away += t - prev;
            deadline += t - prev;
        }
        prev = t;
        double waited = t - t0 - away;
        if (waited < WATCH_SPIN_S) continue;
        watch_answer(w);
        if (w->aborting) watch_quiet_abort(w);
        if (t >= deadline) {
            if (watch_expired(m, r, peer, op, waited, expiries++ > 0)) break;
            deadline = l3d_mpi_now_s() + timeout;
            prev = l3d_mpi_now_s();
            continue;
        }
        double s = waited / 8;
        l3d_mpi_nap(s < WATCH_NAP_MIN_S   ? WATCH_NAP_MIN_S
                    : s > WATCH_NAP_MAX_S ? WATCH_NAP_MAX_S
                                          : s);
    }
    t = l3d_mpi_now_s();
    double waited = t - t0 - away - (t - prev > WATCH_AWAY_S ? t - prev : 0.0);
    if (waited > w->pub.longest_s) {
        w->pub.longest_s = waited;
        if (waited >= 0.5)
            watch_describe(m, peer, op, w->pub.longest_what, sizeof w->pub.longest_what);
    }
}
