/*
 * The communicator's progress thread (l3d_comm_mpi_init_progress, include/llm3d/comm.h):
 * non-blocking operations complete while every rank computes without calling MPI. Each round
 * starts the forms data parallelism uses (an all-reduce and a reduce to a root, 4 MiB each, on a
 * split communicator, the way ZeRO-0 and ZeRO-1/2 pieces go out), then every rank computes for
 * COMPUTE_S seconds without any MPI call, then a single l3d_comm_test per request on rank 0 of
 * the group, while the others compute on, must find it complete; the sums must be exact. Open
 * MPI's shared-memory transport moves such a message only inside MPI calls of both sides, so
 * without the thread the test fails: run with L3D_TEST_PROGRESS_THREAD=0 to see it (the check
 * names the requests left pending). A second round after the thread went idle checks that it
 * wakes again; blocking operations (a barrier, the watchdog's waits) still work beside it.
 */
#include <stdlib.h>
#include <string.h>

#include "llm3d/comm.h"
#include "test.h"

#define COMPUTE_S 1.5
#define N_ELEMS (1 << 20) /* 4 MiB of fp32: one gradient piece (--bucket-mb 4) */

static int world_rank;

/* Busy arithmetic for s seconds, no MPI call (the backward pass between two layers). */
static double compute(double s) {
    volatile double x = 1.0;
    double t0 = l3d_time_s();
    while (l3d_time_s() - t0 < s)
        for (int i = 0; i < 10000; i++) x = x * 1.0000001 + 1e-9;
    return x;
}

/* One round: all-reduce and reduce (to root != 0) in flight during compute(); returns how many
 * were pending on rank 0. */
static int round_trip(struct l3d_comm *c, float *a, float *b, int root) {
    int p = c->size, me = c->rank;
    for (int64_t i = 0; i < N_ELEMS; i++) {
        a[i] = (float)((me + 1) * (i % 13));
        b[i] = (float)((me + 2) * (i % 7));
    }
    l3d_req ra, rb;
    memset(&ra, 0, sizeof ra);
    memset(&rb, 0, sizeof rb);
    l3d_comm_all_reduce(c, a, N_ELEMS, L3D_F32, L3D_SUM, &ra);
    l3d_comm_reduce(c, b, N_ELEMS, L3D_F32, L3D_SUM, root, &rb);
    (void)compute(COMPUTE_S);
    /* Rank 0 of the group tests once while the others still compute: its operations can only be
     * complete if the others' part of them moved during their computation (its own part may
     * move inside this one call; rank 0 is not the reduce's root, so it needs the root's). */
    bool da = true, db = true;
    if (me == 0) {
        da = l3d_comm_test(c, &ra);
        db = l3d_comm_test(c, &rb);
    }
    (void)compute(0.3);
    int pending = !da + !db;
    if (pending)
        fprintf(stderr, "rank %d: %s%s%s still pending after %.1f s of computation\n", world_rank,
                da ? "" : "the all-reduce", pending == 2 ? " and " : "", db ? "" : "the reduce",
                COMPUTE_S);
    l3d_comm_wait(c, &ra);
    l3d_comm_wait(c, &rb);
    int64_t sa = (int64_t)p * (p + 1) / 2, sb = (int64_t)p * (p + 3) / 2, bad = 0;
    for (int64_t i = 0; i < N_ELEMS; i++) {
        bad += a[i] != (float)(sa * (i % 13));
        if (me == root) bad += b[i] != (float)(sb * (i % 7));
    }
    if (bad) fprintf(stderr, "rank %d: %lld wrong sums\n", world_rank, (long long)bad);
    CHECK(bad == 0);
    return pending;
}

int main(int argc, char **argv) {
    const char *env = getenv("L3D_TEST_PROGRESS_THREAD");
    bool thread = !env || strcmp(env, "0") != 0;
    struct l3d_comm *w;
    if (l3d_comm_mpi_init_progress(&argc, &argv, thread, &w) != L3D_OK) {
        fprintf(stderr, "test_progress: %s\n", l3d_error_message());
        return 1;
    }
    world_rank = w->rank;
    w->watch->timeout_s = 60; /* every wait bounded, as in training */
    struct l3d_comm *dp;
    CHECK(l3d_comm_split(w, w->rank / 2, w->rank, &dp) == L3D_OK); /* pairs, as DP groups */
    float *a = malloc((size_t)N_ELEMS * sizeof *a), *b = malloc((size_t)N_ELEMS * sizeof *b);
    CHECK(a && b);
    int pending = 0;
    CHECK(dp->size == (w->size > 1 ? 2 : 1));
    if (dp->size > 1) {
        pending += round_trip(dp, a, b, dp->size - 1);
        l3d_comm_barrier(w);
        (void)compute(0.2); /* the thread idles: nothing pending */
        pending += round_trip(dp, a, b, dp->size - 1);
    }
    CHECK(pending == 0);
    int failed = test_failures;
    l3d_comm_all_reduce(w, &failed, 1, L3D_I32, L3D_SUM, NULL);
    if (w->rank == 0)
        fprintf(stderr, "test_progress: %d ranks, progress thread %s, %s\n", w->size,
                thread ? "on" : "off", failed ? "FAILED" : "every operation completed behind "
                "the computation");
    free(a);
    free(b);
    l3d_comm_free(dp);
    int rc = TEST_REPORT();
    l3d_comm_mpi_finalize(w);
    return rc || failed ? 1 : 0;
}
