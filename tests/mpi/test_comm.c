/*
 * The MPI communicator and the rank grid, on whatever world it is started with (ctest: 2 and 4
 * ranks; 1 when run directly). Every operation blocking and non-blocking, checked exactly
 * (integer-valued floats, so sums are exact in any order); bf16 and fp16 reductions against the
 * host's rounding, with named cases that truncation or rounding half up would fail; the
 * large-count path with a lowered chunk size (all_to_allv's pairwise exchange among them); every
 * (tp, pp) layout of the world against the formula of topo.h.
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "comm/mpi-impl.h"
#include "llm3d/comm.h"
#include "llm3d/topo.h"
#include "test.h"

/* A check that names the world rank when it fails: every rank runs the same checks. */
static int world_rank;
#define RCHECK(x)                                                                  \
    do {                                                                           \
        int rcheck_ok_ = (x) ? 1 : 0; /* evaluated once */                         \
        if (!rcheck_ok_) fprintf(stderr, "rank %d: ", world_rank);                 \
        CHECK(rcheck_ok_ && #x);                                                   \
    } while (0)

/* Starts (req != NULL) then completes an operation: alternately by test() polling and wait(). */
static void finish(struct l3d_comm *c, l3d_req *req, int how) {
    if (!req) return;
    RCHECK(req->active);
    if (how & 1)
        while (!l3d_comm_test(c, req)) {
        }
    l3d_comm_wait(c, req); /* no-op when test completed it */
    RCHECK(!req->active);
    RCHECK(l3d_comm_test(c, req)); /* inactive: complete */
}

static l3d_req *pick(l3d_req *r, int nb) {
    memset(r, 0, sizeof *r);
    return nb ? r : NULL;
}

/* Element i of rank r's contribution: small integers, distinct per rank and index. */
static double val(int r, int64_t i) { return (double)((r + 1) * 3 + (i % 17)); }

static void test_all_reduce(struct l3d_comm *c, int64_t n) {
    int p = c->size, me = c->rank;
    float *f = malloc((size_t)n * sizeof *f);
    double *d = malloc((size_t)n * sizeof *d);
    int32_t *k = malloc((size_t)n * sizeof *k);
    uint8_t *u = malloc((size_t)n * sizeof *u);
    for (int nb = 0; nb < 2; nb++) {
        l3d_req r1, r2, r3, r4;
        for (int64_t i = 0; i < n; i++) {
            f[i] = (float)val(me, i);
            d[i] = val(me, i) * 0.5;
            k[i] = (int32_t)val(me, i);
            u[i] = (uint8_t)(me + i % 5);
        }
        l3d_comm_all_reduce(c, f, n, L3D_F32, L3D_SUM, pick(&r1, nb));
        l3d_comm_all_reduce(c, d, n, L3D_F64, L3D_SUM, pick(&r2, nb));
        l3d_comm_all_reduce(c, k, n, L3D_I32, L3D_MAX, pick(&r3, nb));
        l3d_comm_all_reduce(c, u, n, L3D_U8, L3D_MAX, pick(&r4, nb));
        if (nb) {
            finish(c, &r1, 1);
            finish(c, &r2, 0);
            finish(c, &r3, 1);
            finish(c, &r4, 0);
        }
        int bad = 0;
        for (int64_t i = 0; i < n; i++) {
            double s = 0;
            for (int r = 0; r < p; r++) s += val(r, i);
            bad += f[i] != (float)s;
            bad += d[i] != s * 0.5;
            bad += k[i] != (int32_t)val(p - 1, i);
            bad += u[i] != (uint8_t)(p - 1 + i % 5);
        }
        RCHECK(bad == 0);
    }
    free(f), free(d), free(k), free(u);
}

static void test_reduce(struct l3d_comm *c, int64_t n) {
    int p = c->size, me = c->rank;
    float *f = malloc((size_t)n * sizeof *f);
    for (int nb = 0; nb < 2; nb++)
        for (int root = 0; root < p; root++) {
            l3d_req r;
            for (int64_t i = 0; i < n; i++) f[i] = (float)val(me, i);
            l3d_comm_reduce(c, f, n, L3D_F32, L3D_SUM, root, pick(&r, nb));
            if (nb) finish(c, &r, root & 1);
            int bad = 0;
            for (int64_t i = 0; i < n; i++) {
                double s = 0;
                for (int q = 0; q < p; q++) s += val(q, i);
                bad += f[i] != (float)(me == root ? s : val(me, i)); /* others: only read */
            }
            RCHECK(bad == 0);
        }
    free(f);
}

static void test_reduce_scatter(struct l3d_comm *c, int64_t n) {
    int p = c->size, me = c->rank;
    float *send = malloc((size_t)(n * p) * sizeof *send);
    float *recv = malloc((size_t)n * sizeof *recv);
    for (int nb = 0; nb < 2; nb++) {
        l3d_req r;
        for (int64_t i = 0; i < n * p; i++) send[i] = (float)val(me, i);
        for (int64_t i = 0; i < n; i++) recv[i] = -1;
        l3d_comm_reduce_scatter(c, send, recv, n, L3D_F32, L3D_SUM, pick(&r, nb));
        if (nb) finish(c, &r, 1);
        int bad = 0;
        for (int64_t i = 0; i < n; i++) {
            double s = 0;
            for (int q = 0; q < p; q++) s += val(q, (int64_t)me * n + i);
            bad += recv[i] != (float)s;
        }
        for (int64_t i = 0; i < n * p; i++) bad += send[i] != (float)val(me, i); /* send: read */
        RCHECK(bad == 0);
    }
    free(send), free(recv);
}

static void test_all_gather(struct l3d_comm *c, int64_t n) {
    int p = c->size, me = c->rank;
    double *buf = malloc((size_t)(n * p) * sizeof *buf);
    for (int nb = 0; nb < 2; nb++) {
        l3d_req r;
        for (int64_t i = 0; i < n * p; i++) buf[i] = -1;
        for (int64_t i = 0; i < n; i++) buf[me * n + i] = val(me, i);
        l3d_comm_all_gather(c, buf, n, L3D_F64, pick(&r, nb));
        if (nb) finish(c, &r, 0);
        int bad = 0;
        for (int q = 0; q < p; q++)
            for (int64_t i = 0; i < n; i++) bad += buf[q * n + i] != val(q, i);
        RCHECK(bad == 0);
    }
    free(buf);
}

/* Uneven blocks, one empty when p > 1, in a different order than the ranks, with gaps that must
 * stay untouched. */
static void test_all_gatherv(struct l3d_comm *c, int64_t scale) {
    int p = c->size, me = c->rank;
    int64_t counts[64], displs[64], total = 0;
    L3D_ASSERT(p <= 64);
    for (int q = p - 1; q >= 0; q--) { /* last rank's block first */
        counts[q] = p > 1 && q == 1 ? 0 : scale * (q + 1) + q;
        displs[q] = total + 2; /* a gap of 2 before each block */
        total = displs[q] + counts[q];
    }
    total += 3;
    int32_t *buf = malloc((size_t)total * sizeof *buf);
    for (int nb = 0; nb < 2; nb++) {
        l3d_req r;
        for (int64_t i = 0; i < total; i++) buf[i] = -7;
        for (int64_t i = 0; i < counts[me]; i++) buf[displs[me] + i] = (int32_t)val(me, i);
        int64_t cc[64], dd[64];
        memcpy(cc, counts, sizeof cc);
        memcpy(dd, displs, sizeof dd);
        l3d_comm_all_gatherv(c, buf, cc, dd, L3D_I32, pick(&r, nb));
        memset(cc, 0xff, sizeof cc); /* the arrays may be reused once the call returns */
        memset(dd, 0xff, sizeof dd);
        if (nb) finish(c, &r, 1);
        int bad = 0;
        for (int64_t i = 0; i < total; i++) {
            int32_t want = -7;
            for (int q = 0; q < p; q++)
                if (i >= displs[q] && i < displs[q] + counts[q])
                    want = (int32_t)val(q, i - displs[q]);
            bad += buf[i] != want;
        }
        RCHECK(bad == 0);
    }
    free(buf);
}

/* all_to_allv's piece from rank s to rank d: sizes varying per pair, empty when (s + d) % 3 == 1
 * (always some when p > 1, and rank 0's own when p == 1 stays full), and its elements. */
static int64_t a2a_count(int s, int d, int64_t scale) {
    return (s + d) % 3 == 1 ? 0 : scale * ((s * 3 + d) % 4 + 1) + s + 2 * d;
}
static int32_t a2a_val(int s, int d, int64_t i) {
    return s * 1000003 + d * 10007 + (int32_t)(i % 9973);
}

/* Elements of recv (laid out by displs, gaps of -7) that are not what rank `me` should receive. */
static int64_t a2a_bad(const int32_t *recv, int64_t total, const int64_t *displs, int p, int me,
                       int64_t scale) {
    int64_t bad = 0;
    for (int64_t i = 0; i < total; i++) {
        int32_t want = -7;
        for (int q = 0; q < p; q++)
            if (i >= displs[q] && i < displs[q] + a2a_count(q, me, scale))
                want = a2a_val(q, me, i - displs[q]);
        bad += recv[i] != want;
    }
    return bad;
}

/* Repeated all_to_allv calls, blocking and not, allocate nothing (the non-blocking one's int
 * counts are the communicator's, made with it); negative case: two in flight at once, the second
 * brings its own (the window sees it), and both deliver. */
static void test_all_to_allv_allocs(struct l3d_comm *c, const int32_t *send, const int64_t *sc,
                                    const int64_t *sd, int32_t *recv, const int64_t *rc,
                                    const int64_t *rd, int64_t rtot, int64_t scale) {
    int32_t *recv2 = malloc((size_t)(rtot + 1) * sizeof *recv2);
    l3d_req r, r2;
    for (int i = 0; i < 2; i++) { /* the first call's pages, MPI's included, settled */
        l3d_comm_all_to_allv(c, send, sc, sd, recv, rc, rd, L3D_I32, pick(&r, 1));
        finish(c, &r, 0);
    }
    size_t before = l3d_mem_window_begin(), used = l3d_mem_used();
    for (int i = 0; i < 3; i++) {
        l3d_comm_all_to_allv(c, send, sc, sd, recv, rc, rd, L3D_I32, pick(&r, i != 1));
        finish(c, i != 1 ? &r : NULL, i);
    }
    RCHECK(l3d_mem_peak() == used);
    for (int64_t i = 0; i < rtot; i++) recv[i] = recv2[i] = -7;
    l3d_comm_all_to_allv(c, send, sc, sd, recv, rc, rd, L3D_I32, pick(&r, 1));
    l3d_comm_all_to_allv(c, send, sc, sd, recv2, rc, rd, L3D_I32, pick(&r2, 1));
    RCHECK(l3d_mem_peak() > used); /* (negative: the second's own counts) */
    finish(c, &r2, 0);
    finish(c, &r, 1);
    RCHECK(l3d_mem_used() == used); /* freed at its completion */
    l3d_mem_window_end(before);
    RCHECK(a2a_bad(recv, rtot, rd, c->size, c->rank, scale) == 0 &&
           a2a_bad(recv2, rtot, rd, c->size, c->rank, scale) == 0);
    free(recv2);
}

/* Every rank sends a different amount to each rank, some pieces empty, from a send buffer with
 * the pieces in reverse rank order and into a receive buffer with gaps that must stay untouched;
 * the checker then rejects one flipped element. */
static void test_all_to_allv(struct l3d_comm *c, int64_t scale) {
    int p = c->size, me = c->rank;
    int64_t sc[64], sd[64], rc[64], rd[64], stot = 0, rtot = 0;
    L3D_ASSERT(p <= 64);
    for (int q = p - 1; q >= 0; q--) {
        sc[q] = a2a_count(me, q, scale), sd[q] = stot, stot += sc[q];
        rc[q] = a2a_count(q, me, scale), rd[q] = rtot + 3, rtot = rd[q] + rc[q];
    }
    rtot += 2;
    int32_t *send = malloc((size_t)(stot + 1) * sizeof *send);
    int32_t *recv = malloc((size_t)(rtot + 1) * sizeof *recv);
    for (int q = 0; q < p; q++)
        for (int64_t i = 0; i < sc[q]; i++) send[sd[q] + i] = a2a_val(me, q, i);
    for (int nb = 0; nb < 2; nb++) {
        l3d_req r;
        for (int64_t i = 0; i < rtot; i++) recv[i] = -7;
        int64_t cc[4][64];
        memcpy(cc[0], sc, sizeof sc), memcpy(cc[1], sd, sizeof sd);
        memcpy(cc[2], rc, sizeof rc), memcpy(cc[3], rd, sizeof rd);
        l3d_comm_all_to_allv(c, send, cc[0], cc[1], recv, cc[2], cc[3], L3D_I32, pick(&r, nb));
        memset(cc, 0xff, sizeof cc); /* the arrays may be reused once the call returns */
        if (nb) finish(c, &r, 0);
        RCHECK(a2a_bad(recv, rtot, rd, p, me, scale) == 0);
    }
    /* the checker's negative cases: a gap written, an element of a piece changed */
    recv[0] = 0;
    int64_t want = 1;
    for (int q = 0; q < p; q++)
        if (rc[q] > 0) {
            recv[rd[q] + rc[q] - 1] ^= 1;
            want = 2;
            break;
        }
    RCHECK(a2a_bad(recv, rtot, rd, p, me, scale) == want);
    test_all_to_allv_allocs(c, send, sc, sd, recv, rc, rd, rtot, scale);
    free(send), free(recv);
}

static void test_broadcast(struct l3d_comm *c, int64_t n) {
    int p = c->size, me = c->rank;
    uint8_t *u = malloc((size_t)n);
    float *f = malloc((size_t)n * sizeof *f);
    for (int nb = 0; nb < 2; nb++)
        for (int root = 0; root < p; root++) {
            l3d_req r1, r2;
            for (int64_t i = 0; i < n; i++) {
                u[i] = (uint8_t)(me == root ? 100 + root + i % 7 : 0);
                f[i] = (float)(me == root ? val(root, i) : -1);
            }
            l3d_comm_broadcast(c, u, n, L3D_U8, root, pick(&r1, nb));
            l3d_comm_broadcast(c, f, n, L3D_F32, root, pick(&r2, nb));
            if (nb) finish(c, &r2, 1), finish(c, &r1, 0); /* completed out of order */
            int bad = 0;
            for (int64_t i = 0; i < n; i++)
                bad += u[i] != (uint8_t)(100 + root + i % 7) || f[i] != (float)val(root, i);
            RCHECK(bad == 0);
        }
    free(u), free(f);
}

/* A ring: each rank sends to the next and receives from the previous, in both directions of
 * blocking/non-blocking (a blocking send is paired with a posted receive, so a ring of one rank,
 * sending to itself, cannot deadlock). */
static void test_ring(struct l3d_comm *c, int64_t n, int64_t max_count) {
    int p = c->size, me = c->rank, next = (me + 1) % p, prev = (me + p - 1) % p;
    float *out = malloc((size_t)n * sizeof *out), *in = malloc((size_t)n * sizeof *in);
    for (int64_t i = 0; i < n; i++) out[i] = (float)val(me, i);
    for (int mode = 0; mode < 2; mode++) {
        l3d_req r;
        memset(&r, 0, sizeof r);
        for (int64_t i = 0; i < n; i++) in[i] = -1;
        if (n > max_count && (mode == 0 || p == 1)) /* non-blocking: at most one chunk */
            continue;
        if (mode == 0) { /* non-blocking recv, blocking send */
            l3d_comm_recv(c, in, n, L3D_F32, prev, 7, &r);
            l3d_comm_send(c, out, n, L3D_F32, next, 7, NULL);
            finish(c, &r, 1);
        } else if (p == 1) { /* non-blocking send to itself, then a blocking recv */
            l3d_comm_send(c, out, n, L3D_F32, next, 8, &r);
            l3d_comm_recv(c, in, n, L3D_F32, prev, 8, NULL);
            finish(c, &r, 0);
        } else if (me % 2 == 0) { /* blocking both ways, ordered to avoid a cycle */
            l3d_comm_send(c, out, n, L3D_F32, next, 8, NULL);
            l3d_comm_recv(c, in, n, L3D_F32, prev, 8, NULL);
        } else {
            l3d_comm_recv(c, in, n, L3D_F32, prev, 8, NULL);
            l3d_comm_send(c, out, n, L3D_F32, next, 8, NULL);
        }
        int bad = 0;
        for (int64_t i = 0; i < n; i++) bad += in[i] != (float)val(prev, i);
        RCHECK(bad == 0);
    }
    free(out), free(in);
}

/* ---- bf16 and fp16 --------------------------------------------------------------------------- */

/* The 16-bit types: n integer-valued elements (sums exact in any order), then HALF_NAMED named
 * elements that only ranks 0 and 1 make non-zero, so that one pairwise combine decides each
 * whatever the MPI library's reduction tree. Expected values are folded on the host with the same
 * rounding, and the named ones are also checked against their literal patterns. */
#define HALF_NAMED 4

static uint16_t h_of(enum l3d_dtype t, float x) {
    return t == L3D_BF16 ? l3d_f32_to_bf16(x) : l3d_f32_to_f16(x);
}
static float h_to(enum l3d_dtype t, uint16_t h) {
    return t == L3D_BF16 ? l3d_bf16_to_f32(h) : l3d_f16_to_f32(h);
}

/* Element j (of n + HALF_NAMED) of rank r's contribution to block q. */
static uint16_t hval(enum l3d_dtype t, enum l3d_redop op, int r, int64_t j, int64_t n, int q) {
    bool bf = t == L3D_BF16;
    float ulp = bf ? 0x1p-7f : 0x1p-10f;            /* of 1.0 */
    uint16_t hmax = bf ? 0x7f7f : 0x7bff;           /* the largest finite value */
    float half_ulp_max = bf ? 0x1p119f : 16.0f;     /* half its ulp */
    uint16_t neg_inf = bf ? 0xff80 : 0xfc00, snan = bf ? 0x7f81 : 0x7c01;
    if (j < n) {
        if (op == L3D_SUM) return h_of(t, (float)val(r, j + q));
        return h_of(t, (float)((r * 7 + j * 3 + q) % 11 - 5) * 0.375f);
    }
    int k = (int)(j - n);
    if (op == L3D_SUM) {
        if (r > 1) return 0;
        if (k == 0) return h_of(t, r == 0 ? 1.0f : 0.75f * ulp);      /* rounds up, not down */
        if (k == 1) return h_of(t, r == 0 ? 1.0f : 0.5f * ulp);       /* a tie: stays at 1 */
        if (k == 2) return h_of(t, r == 0 ? 1.0f + ulp : 0.5f * ulp); /* a tie: up to even */
        return r == 0 ? hmax : h_of(t, half_ulp_max);                 /* a tie: Inf */
    }
    if (k == 0) return r == 0 ? 0x8000 : 0x0000;     /* max(-0, +0) = +0 */
    if (k == 1) return 0x8000;                       /* all -0 */
    if (k == 2) return r == 1 ? snan : h_of(t, 1.0f); /* NaN wins, as the quiet NaN */
    return r == 0 ? neg_inf : (uint16_t)(hmax | 0x8000);
}

/* The host's pairwise combine: what the MPI operation is documented to compute. */
static uint16_t hcombine(enum l3d_dtype t, enum l3d_redop op, uint16_t a, uint16_t b) {
    float fa = h_to(t, a), fb = h_to(t, b);
    if (op == L3D_SUM) return h_of(t, fa + fb);
    if (fa != fa || fb != fb) return t == L3D_BF16 ? 0x7fc0 : 0x7e00;
    if (fa == fb) return a & b;
    return fa > fb ? a : b;
}

static uint16_t hwant(enum l3d_dtype t, enum l3d_redop op, int p, int64_t j, int64_t n, int q) {
    uint16_t acc = hval(t, op, 0, j, n, q);
    for (int r = 1; r < p; r++) acc = hcombine(t, op, acc, hval(t, op, r, j, n, q));
    return acc;
}

/* The named results on 2 or more ranks, literally: a truncating sum would give 1.0 (0x3f80,
 * 0x3c00) for the first; rounding half up 0x3f81/0x3c01 for the second. */
static int hnamed_bad(enum l3d_dtype t, enum l3d_redop op, const uint16_t *x) {
    bool bf = t == L3D_BF16;
    static const uint16_t sum_bf[] = {0x3f81, 0x3f80, 0x3f82, 0x7f80};
    static const uint16_t sum_f16[] = {0x3c01, 0x3c00, 0x3c02, 0x7c00};
    static const uint16_t max_bf[] = {0x0000, 0x8000, 0x7fc0, 0xff7f};
    static const uint16_t max_f16[] = {0x0000, 0x8000, 0x7e00, 0xfbff};
    const uint16_t *want = op == L3D_SUM ? (bf ? sum_bf : sum_f16) : (bf ? max_bf : max_f16);
    int bad = 0;
    for (int k = 0; k < HALF_NAMED; k++) bad += x[k] != want[k];
    return bad;
}

static void test_half_reductions(struct l3d_comm *c, enum l3d_dtype t, int64_t n) {
    int p = c->size, me = c->rank, root = p - 1;
    int64_t N = n + HALF_NAMED;
    uint16_t *buf = malloc((size_t)(N * p) * sizeof *buf);
    uint16_t *recv = malloc((size_t)N * sizeof *recv);
    for (int o = 0; o < 2; o++)
        for (int nb = 0; nb < 2; nb++) {
            enum l3d_redop op = o ? L3D_MAX : L3D_SUM;
            l3d_req r;
            int bad = 0;
            /* all_reduce */
            for (int64_t j = 0; j < N; j++) buf[j] = hval(t, op, me, j, n, 0);
            l3d_comm_all_reduce(c, buf, N, t, op, pick(&r, nb));
            if (nb) finish(c, &r, 1);
            for (int64_t j = 0; j < N; j++) bad += buf[j] != hwant(t, op, p, j, n, 0);
            if (p >= 2) bad += hnamed_bad(t, op, buf + n);
            RCHECK(bad == 0);
            /* reduce to the last rank (not 0 when p > 1): in place there, only read elsewhere */
            bad = 0;
            for (int64_t j = 0; j < N; j++) buf[j] = hval(t, op, me, j, n, 1);
            l3d_comm_reduce(c, buf, N, t, op, root, pick(&r, nb));
            if (nb) finish(c, &r, 0);
            for (int64_t j = 0; j < N; j++)
                bad += buf[j] != (me == root ? hwant(t, op, p, j, n, 1) : hval(t, op, me, j, n, 1));
            if (p >= 2 && me == root) bad += hnamed_bad(t, op, buf + n);
            RCHECK(bad == 0);
            /* reduce_scatter: rank q gets block q */
            bad = 0;
            for (int q = 0; q < p; q++)
                for (int64_t j = 0; j < N; j++) buf[q * N + j] = hval(t, op, me, j, n, q);
            for (int64_t j = 0; j < N; j++) recv[j] = 0xdead;
            l3d_comm_reduce_scatter(c, buf, recv, N, t, op, pick(&r, nb));
            if (nb) finish(c, &r, 1);
            for (int64_t j = 0; j < N; j++) bad += recv[j] != hwant(t, op, p, j, n, me);
            if (p >= 2) bad += hnamed_bad(t, op, recv + n);
            RCHECK(bad == 0);
        }
    free(buf), free(recv);
}

/* Data movement is bit for bit: every pattern, NaN payloads and signalling NaNs included. */
static uint16_t hbits(int r, int64_t i) { return (uint16_t)(0x7c01 + 977 * r + 31 * i); }

static void test_half_moves(struct l3d_comm *c, enum l3d_dtype t, int64_t n, int64_t max_count) {
    int p = c->size, me = c->rank, root = p - 1, next = (me + 1) % p, prev = (me + p - 1) % p;
    uint16_t *buf = malloc((size_t)(n * p + 1) * sizeof *buf);
    uint16_t *in = malloc((size_t)(n + 1) * sizeof *in);
    for (int nb = 0; nb < 2; nb++) {
        l3d_req r, r2;
        int bad = 0;
        for (int64_t i = 0; i < n; i++) buf[i] = me == root ? hbits(root, i) : 0;
        l3d_comm_broadcast(c, buf, n, t, root, pick(&r, nb));
        if (nb) finish(c, &r, 0);
        for (int64_t i = 0; i < n; i++) bad += buf[i] != hbits(root, i);
        for (int64_t i = 0; i < n * p; i++) buf[i] = 0;
        for (int64_t i = 0; i < n; i++) buf[me * n + i] = hbits(me, i);
        l3d_comm_all_gather(c, buf, n, t, pick(&r, nb));
        if (nb) finish(c, &r, 1);
        for (int q = 0; q < p; q++)
            for (int64_t i = 0; i < n; i++) bad += buf[q * n + i] != hbits(q, i);
        /* ring: non-blocking both ways (nb), or a posted receive and a blocking send; over one
         * chunk, blocking both ways in an order without a cycle (not to itself) */
        for (int64_t i = 0; i < n; i++) buf[i] = hbits(me, i), in[i] = 0;
        if (n <= max_count) {
            l3d_comm_recv(c, in, n, t, prev, 9, pick(&r, 1));
            l3d_comm_send(c, buf, n, t, next, 9, pick(&r2, nb));
            if (nb) finish(c, &r2, 0);
            finish(c, &r, 1);
        } else if (nb == 0 && p > 1) {
            if (me % 2 == 0) l3d_comm_send(c, buf, n, t, next, 9, NULL);
            l3d_comm_recv(c, in, n, t, prev, 9, NULL);
            if (me % 2 == 1) l3d_comm_send(c, buf, n, t, next, 9, NULL);
        } else {
            for (int64_t i = 0; i < n; i++) in[i] = hbits(prev, i); /* not run */
        }
        for (int64_t i = 0; i < n; i++) bad += in[i] != hbits(prev, i);
        RCHECK(bad == 0);
    }
    free(buf), free(in);
}

/* bf16's SUM (a loop of its own, src/comm/mpi.c) against l3d_f32_to_bf16 of the fp32 sum for every
 * 16-bit pattern on rank 0 against four partners on rank 1: a scrambled pattern, itself, its
 * negation (x + -x: +0; Inf + -Inf: NaN) and the smallest subnormal; rank 1 sends no NaN, so that
 * the one combine gives the same bits in either operand order. On exactly 2 ranks (test_comm_np2):
 * a third rank's +0 would turn a -0 sum into +0, and its combine order would matter. */
static void test_bf16_sum_patterns(struct l3d_comm *c) {
    if (c->size != 2) return;
    const int64_t n = 4 * 65536;
    uint16_t *buf = malloc((size_t)n * sizeof *buf), *want = malloc((size_t)n * sizeof *want);
    for (int nb = 0; nb < 2; nb++) {
        for (int64_t j = 0; j < n; j++) {
            uint16_t a = (uint16_t)j, k = (uint16_t)(j >> 16);
            uint16_t b = k == 0 ? (uint16_t)(j * 40503 + 12345) : k == 1 ? a
                         : k == 2 ? (uint16_t)(a ^ 0x8000) : 0x0001;
            if ((b & 0x7fff) > 0x7f80) b = 0x3f80; /* rank 1: no NaN */
            buf[j] = c->rank == 0 ? a : b;
            want[j] = l3d_f32_to_bf16(l3d_bf16_to_f32(a) + l3d_bf16_to_f32(b));
        }
        l3d_req r;
        l3d_comm_all_reduce(c, buf, n, L3D_BF16, L3D_SUM, pick(&r, nb));
        if (nb) finish(c, &r, 1);
        int bad = 0;
        for (int64_t j = 0; j < n; j++) bad += buf[j] != want[j];
        RCHECK(bad == 0);
    }
    free(buf), free(want);
}

static void test_half(struct l3d_comm *c, int64_t n, int64_t max_count) {
    for (enum l3d_dtype t = L3D_BF16; t <= L3D_F16; t++) {
        test_half_reductions(c, t, n);
        test_half_moves(c, t, n, max_count);
    }
    test_bf16_sum_patterns(c);
}

/* int64: MPI_INT64_T, values beyond 32 bits */
static void test_i64(struct l3d_comm *c, int64_t n) {
    int p = c->size, me = c->rank;
    int64_t *x = malloc((size_t)(n + 1) * sizeof *x), *y = malloc((size_t)(n + 1) * sizeof *y);
    for (int nb = 0; nb < 2; nb++) {
        l3d_req r1, r2;
        for (int64_t i = 0; i < n; i++) x[i] = y[i] = ((int64_t)1 << 40) * (me + 1) + i;
        l3d_comm_all_reduce(c, x, n, L3D_I64, L3D_SUM, pick(&r1, nb));
        l3d_comm_all_reduce(c, y, n, L3D_I64, L3D_MAX, pick(&r2, nb));
        if (nb) finish(c, &r1, 0), finish(c, &r2, 1);
        int bad = 0;
        for (int64_t i = 0; i < n; i++) {
            bad += x[i] != ((int64_t)1 << 40) * p * (p + 1) / 2 + p * i;
            bad += y[i] != ((int64_t)1 << 40) * p + i;
        }
        RCHECK(bad == 0);
    }
    free(x), free(y);
}

static void test_all_ops(struct l3d_comm *c, int64_t n, int64_t max_count) {
    test_all_reduce(c, n);
    test_reduce(c, n);
    test_reduce_scatter(c, n);
    test_all_gather(c, n);
    test_all_gatherv(c, n);
    test_all_to_allv(c, n);
    test_broadcast(c, n);
    test_ring(c, n, max_count);
    test_half(c, n, max_count);
    test_i64(c, n);
    l3d_comm_barrier(c);
}

static void test_split(struct l3d_comm *w) {
    /* two groups by parity, ordered by descending world rank; rank 0 joins none when p > 2 */
    int color = w->rank % 2;
    if (w->size > 2 && w->rank == 0) color = -1;
    struct l3d_comm *s;
    RCHECK(l3d_comm_split(w, color, -w->rank, &s) == L3D_OK);
    if (color < 0) {
        RCHECK(s == NULL);
    } else {
        RCHECK(s != NULL);
        int members[64], n = 0;
        for (int r = w->size - 1; r >= 0; r--)
            if (r % 2 == color && !(w->size > 2 && r == 0)) members[n++] = r;
        RCHECK(s->size == n);
        RCHECK(s->world_rank == w->rank);
        RCHECK(s->rank >= 0 && s->rank < n && members[s->rank] == w->rank);
        int32_t got[64];
        got[s->rank] = w->rank;
        l3d_comm_all_gather(s, got, 1, L3D_I32, NULL);
        int bad = 0;
        for (int i = 0; i < n; i++) bad += got[i] != members[i];
        RCHECK(bad == 0);
        test_all_reduce(s, 5);
    }
    l3d_comm_free(s);
}

/* The members of a group, in group rank order, by all-gathering world ranks inside it. */
static void group_members(struct l3d_comm *g, int world_rank_, int32_t *out) {
    out[g->rank] = world_rank_;
    l3d_comm_all_gather(g, out, 1, L3D_I32, NULL);
}

static void check_group(struct l3d_comm *g, int want_size, const int32_t *want, const char *what,
                        int tp, int pp) {
    int32_t got[64];
    RCHECK(g && g->size == want_size);
    if (!g || g->size != want_size) return;
    group_members(g, world_rank, got);
    int bad = 0;
    for (int i = 0; i < want_size; i++) bad += got[i] != want[i];
    if (bad)
        fprintf(stderr, "rank %d: %s group of tp %d pp %d differs\n", world_rank, what, tp, pp);
    RCHECK(bad == 0);
}

/* A layout of the grid's sizes (dp 0: inferred by l3d_layout_resolve). */
static struct l3d_layout grid(int tp, int cp, int pp, int dp) {
    struct l3d_run_spec s;
    l3d_run_spec_defaults(&s);
    s.layout.tp = tp, s.layout.cp = cp, s.layout.pp = pp, s.layout.dp = dp;
    return s.layout;
}

static void test_topo_layouts(struct l3d_comm *w) {
    int p = w->size;
    for (int tp = 1; tp <= p; tp++)
        for (int pp = 1; pp <= p; pp++) {
            if (p % (tp * pp)) continue;
            struct l3d_layout l = grid(tp, 1, pp, 0);
            RCHECK(l3d_layout_resolve(&l, p) == L3D_OK);
            int d = l.dp;
            RCHECK(l.tp == tp && l.pp == pp && l.cp == 1 && d == p / (tp * pp));
            for (int r = 0; r < p; r++) { /* coordinates round-trip */
                int a, c, b, e;
                l3d_topo_coords(&l, r, &a, &c, &b, &e);
                RCHECK(a < tp && c == 0 && b < pp && e < d);
                RCHECK(l3d_topo_rank_of(&l, a, 0, b, e) == r);
            }
            struct l3d_topo topo;
            RCHECK(l3d_topo_init(&topo, w, &l) == L3D_OK);
            RCHECK(topo.layout == &l && topo.world == w);
            RCHECK(topo.rank == w->rank && topo.world_size == p);
            int a, c, b, e;
            l3d_topo_coords(&l, w->rank, &a, &c, &b, &e);
            RCHECK(topo.tp_rank == a && topo.pp_rank == b && topo.dp_rank == e);
            RCHECK(topo.cp_rank == 0 && topo.cp_comm == NULL && topo.dpcp_comm == topo.dp_comm);
            int32_t want[64];
            for (int i = 0; i < tp; i++) want[i] = l3d_topo_rank_of(&l, i, 0, b, e);
            check_group(topo.tp_comm, tp, want, "TP", tp, pp);
            for (int i = 0; i < pp; i++) want[i] = l3d_topo_rank_of(&l, a, 0, i, e);
            check_group(topo.pp_comm, pp, want, "PP", tp, pp);
            for (int i = 0; i < d; i++) want[i] = l3d_topo_rank_of(&l, a, 0, b, i);
            check_group(topo.dp_comm, d, want, "DP", tp, pp);
            if (b == 0 || b == pp - 1) {
                want[0] = l3d_topo_rank_of(&l, a, 0, 0, e);
                want[1] = l3d_topo_rank_of(&l, a, 0, pp - 1, e);
                check_group(topo.embed_comm, pp == 1 ? 1 : 2, want, "embed", tp, pp);
            } else {
                RCHECK(topo.embed_comm == NULL);
            }
            /* the groups work: a sum over the DP group of the dp ranks */
            int32_t s = topo.dp_rank;
            l3d_comm_all_reduce(topo.dp_comm, &s, 1, L3D_I32, L3D_SUM, NULL);
            RCHECK(s == d * (d - 1) / 2);
            l3d_topo_free(&topo);
            RCHECK(topo.tp_comm == NULL && topo.embed_comm == NULL);
        }
}

/* The grid with a ring: every (tp, cp, pp) of the world, coordinates round trip, each rank's ring
 * holds the ranks that differ only in cp_rank, tp ranks apart, and the widened DP group those that
 * differ in dp_rank or cp_rank, ordered dp_rank cp + cp_rank; a sum over it counts every replica
 * of every ring. */
static void test_topo_cp(struct l3d_comm *w) {
    int p = w->size;
    for (int tp = 1; tp <= p; tp++)
        for (int cp = 2; cp <= p / tp; cp++)
            for (int pp = 1; pp <= p / (tp * cp); pp++) {
                if (p % (tp * cp * pp)) continue;
                int d = p / (tp * cp * pp);
                struct l3d_layout l = grid(tp, cp, pp, 0);
                RCHECK(l3d_layout_resolve(&l, p) == L3D_OK && l.dp == d);
                for (int r = 0; r < p; r++) {
                    int a, c, b, e;
                    l3d_topo_coords(&l, r, &a, &c, &b, &e);
                    RCHECK(a < tp && c < cp && b < pp && e < d);
                    RCHECK(l3d_topo_rank_of(&l, a, c, b, e) == r);
                }
                struct l3d_topo topo;
                RCHECK(l3d_topo_init(&topo, w, &l) == L3D_OK);
                int a = topo.tp_rank, c = topo.cp_rank, b = topo.pp_rank, e = topo.dp_rank;
                RCHECK(l3d_topo_rank_of(&l, a, c, b, e) == w->rank);
                int32_t want[64];
                for (int i = 0; i < cp; i++) want[i] = l3d_topo_rank_of(&l, a, i, b, e);
                check_group(topo.cp_comm, cp, want, "CP", tp, pp);
                RCHECK(want[1] - want[0] == tp); /* ring neighbours tp ranks apart */
                for (int i = 0; i < tp; i++) want[i] = l3d_topo_rank_of(&l, i, c, b, e);
                check_group(topo.tp_comm, tp, want, "TP", tp, pp);
                for (int i = 0; i < d * cp; i++)
                    want[i] = l3d_topo_rank_of(&l, a, i % cp, b, i / cp);
                check_group(topo.dpcp_comm, d * cp, want, "DP x CP", tp, pp);
                int32_t s = 1;
                l3d_comm_all_reduce(topo.dpcp_comm, &s, 1, L3D_I32, L3D_SUM, NULL);
                RCHECK(s == d * cp);
                l3d_topo_free(&topo);
                RCHECK(topo.cp_comm == NULL && topo.dpcp_comm == NULL);
            }
}

/* Expert parallelism: every (tp, cp, pp, ep) of the world with ep dividing dp cp > 1; the EP group
 * holds the ep consecutive DP x CP ranks (q = dp_rank cp + cp_rank) of this rank's block, the
 * expert-DP group the dp cp / ep ranks with the same ep_rank; with ep = 1 there is no EP group and
 * the expert-DP group is the DP x CP one. */
static void ep_groups_check(struct l3d_comm *w, int tp, int cp, int pp, int ep) {
    struct l3d_layout l = grid(tp, cp, pp, 0);
    l.ep = ep;
    RCHECK(l3d_layout_resolve(&l, w->size) == L3D_OK && l.ep == ep);
    struct l3d_topo topo;
    RCHECK(l3d_topo_init(&topo, w, &l) == L3D_OK);
    int a = topo.tp_rank, b = topo.pp_rank, n = l.dp * cp;
    int q = topo.dp_rank * cp + topo.cp_rank;
    RCHECK(topo.ep_rank == q % ep);
    int32_t want[64];
    if (ep == 1) {
        RCHECK(topo.ep_comm == NULL && topo.edp_comm == topo.dpcp_comm);
    } else {
        for (int i = 0; i < ep; i++) {
            int r = q / ep * ep + i;
            want[i] = l3d_topo_rank_of(&l, a, r % cp, b, r / cp);
        }
        check_group(topo.ep_comm, ep, want, "EP", tp, pp);
        for (int i = 0; i < n / ep; i++) {
            int r = i * ep + q % ep;
            want[i] = l3d_topo_rank_of(&l, a, r % cp, b, r / cp);
        }
        check_group(topo.edp_comm, n / ep, want, "expert DP", tp, pp);
        int32_t s = topo.ep_rank; /* the groups work */
        l3d_comm_all_reduce(topo.ep_comm, &s, 1, L3D_I32, L3D_SUM, NULL);
        RCHECK(s == ep * (ep - 1) / 2);
    }
    l3d_topo_free(&topo);
    RCHECK(topo.ep_comm == NULL && topo.edp_comm == NULL && topo.dp_comm == NULL);
}

static void test_topo_ep(struct l3d_comm *w) {
    int p = w->size;
    for (int tp = 1; tp <= p; tp++)
        for (int cp = 1; cp <= p / tp; cp++)
            for (int pp = 1; pp <= p / (tp * cp); pp++)
                for (int ep = 1; ep <= p / (tp * pp); ep++)
                    if (p % (tp * cp * pp) == 0 && (p / (tp * pp)) % ep == 0)
                        ep_groups_check(w, tp, cp, pp, ep);
}

/* The worked example of topo.h, 8 ranks as tp = pp = dp = 2, without MPI. */
static void test_topo_table(void) {
    static const int table[8][3] = {{0, 0, 0}, {1, 0, 0}, {0, 1, 0}, {1, 1, 0},
                                    {0, 0, 1}, {1, 0, 1}, {0, 1, 1}, {1, 1, 1}};
    struct l3d_layout l = grid(2, 1, 2, 2);
    for (int r = 0; r < 8; r++) {
        int a, c, b, e;
        l3d_topo_coords(&l, r, &a, &c, &b, &e);
        CHECK(a == table[r][0] && c == 0 && b == table[r][1] && e == table[r][2]);
        CHECK(l3d_topo_rank_of(&l, a, 0, b, e) == r);
    }
}

static int has(const char *s, const char *sub) {
    if (!strstr(s, sub)) {
        fprintf(stderr, "message \"%s\" lacks \"%s\"\n", s, sub);
        return 0;
    }
    return 1;
}

/* l3d_layout_resolve's grid: each refusal names the flags, the values and what to do. */
static void test_topo_resolve_errors(void) {
    struct l3d_layout l = grid(2, 1, 2, 2); /* 8 != 4 */
    CHECK(l3d_layout_resolve(&l, 4) == L3D_ERR_LAYOUT);
    CHECK(has(l3d_error_message(), "--tp 2") && has(l3d_error_message(), "--dp 2") &&
          has(l3d_error_message(), "= 8 ranks") && has(l3d_error_message(), "world size is 4") &&
          has(l3d_error_message(), "mpiexec -n 8"));
    l = grid(0, 1, 1, 0);
    CHECK(l3d_layout_resolve(&l, 4) == L3D_ERR_LAYOUT);
    CHECK(has(l3d_error_message(), "--tp 0 is invalid") && has(l3d_error_message(), "1, 2, 4"));
    l = grid(1, 1, 0, 0);
    CHECK(l3d_layout_resolve(&l, 4) == L3D_ERR_LAYOUT);
    CHECK(has(l3d_error_message(), "--pp 0 is invalid"));
    l = grid(1, 1, 1, -1);
    CHECK(l3d_layout_resolve(&l, 4) == L3D_ERR_LAYOUT);
    CHECK(has(l3d_error_message(), "--dp -1 is invalid"));
    l = grid(3, 1, 1, 0); /* does not divide */
    CHECK(l3d_layout_resolve(&l, 4) == L3D_ERR_LAYOUT);
    CHECK(has(l3d_error_message(), "--tp 3 x --pp 1 = 3 does not divide the world size 4") &&
          has(l3d_error_message(), "multiple of 3"));
    l = grid(1, 3, 1, 0); /* a ring that does not divide */
    CHECK(l3d_layout_resolve(&l, 4) == L3D_ERR_LAYOUT);
    CHECK(has(l3d_error_message(), "--cp 3 does not divide the 4 ranks"));
    l = grid(2, 1, 3, 0);
    CHECK(l3d_layout_resolve(&l, 12) == L3D_OK && l.dp == 2);
    l = grid(65536, 1, 65536, 0); /* product beyond int */
    CHECK(l3d_layout_resolve(&l, 4) == L3D_ERR_LAYOUT);
    l = grid(1, 1, 1, 1);
    CHECK(l3d_layout_resolve(&l, 1) == L3D_OK);
    /* what the flags left open: v and cp 0 read as 1, accum from the global batch, 1F1B alone */
    l = grid(1, 0, 1, 0);
    l.v = 0, l.micro_batch = 2, l.global_batch = 16, l.schedule = L3D_PP_GPIPE;
    CHECK(l3d_layout_resolve(&l, 4) == L3D_OK && l.cp == 1 && l.v == 1 && l.dp == 4 &&
          l.accum == 2 && l.schedule == L3D_PP_1F1B);
    l = grid(1, 1, 2, 0);
    l.schedule = L3D_PP_GPIPE, l.global_batch = 10, l.micro_batch = 4; /* 10 / (4 x 2) */
    CHECK(l3d_layout_resolve(&l, 4) == L3D_ERR_ARG);
    CHECK(has(l3d_error_message(), "--global-batch 10"));
    l.global_batch = 16;
    CHECK(l3d_layout_resolve(&l, 4) == L3D_OK && l.accum == 2 && l.schedule == L3D_PP_GPIPE);
}

/* The launcher check of l3d_comm_mpi_init with a made-up environment. */
static void test_launcher_check(int size) {
    CHECK(l3d_comm_mpi_check_launcher(size) == L3D_OK); /* the real launch is consistent */
    const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"};
    char *saved[3];
    for (int k = 0; k < 3; k++) {
        const char *v = getenv(vars[k]);
        saved[k] = v ? strdup(v) : NULL;
        unsetenv(vars[k]);
    }
    CHECK(l3d_comm_mpi_check_launcher(1) == L3D_OK); /* a singleton */
    setenv("PMI_SIZE", "1", 1);
    CHECK(l3d_comm_mpi_check_launcher(1) == L3D_OK); /* mpiexec -n 1 */
    setenv("PMI_SIZE", "3", 1);
    CHECK(l3d_comm_mpi_check_launcher(3) == L3D_OK);
    CHECK(l3d_comm_mpi_check_launcher(1) == L3D_ERR_LAYOUT);
    const char *m = l3d_error_message();
    CHECK(has(m, "announces 3 ranks (PMI_SIZE=3) while MPI sees 1") && has(m, "-DL3D_MPI=mpich") &&
          has(m, "mpiexec"));
    unsetenv("PMI_SIZE");
    setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
    CHECK(l3d_comm_mpi_check_launcher(1) == L3D_ERR_LAYOUT);
    CHECK(has(l3d_error_message(), "(OMPI_COMM_WORLD_SIZE=2)") &&
          has(l3d_error_message(), "-DL3D_MPI=openmpi"));
    unsetenv("OMPI_COMM_WORLD_SIZE");
    setenv("SLURM_STEP_NUM_TASKS", "4", 1);
    CHECK(l3d_comm_mpi_check_launcher(1) == L3D_ERR_LAYOUT);
    CHECK(has(l3d_error_message(), "srun"));
    unsetenv("SLURM_STEP_NUM_TASKS");
    for (int k = 0; k < 3; k++)
        if (saved[k]) setenv(vars[k], saved[k], 1), free(saved[k]);
}

int main(int argc, char **argv) {
    struct l3d_comm *w;
    l3d_status st = l3d_comm_mpi_init(&argc, &argv, &w);
    if (st != L3D_OK) {
        fprintf(stderr, "llm3d: %s\n", l3d_error_message());
        return 1;
    }
    world_rank = w->rank;
    double t0 = l3d_time_s();
    CHECK(w->size >= 1 && w->rank >= 0 && w->rank < w->size && w->world_rank == w->rank);
    CHECK(strlen(l3d_comm_mpi_library()) > 0 && !strchr(l3d_comm_mpi_library(), '\n'));
    if (w->rank == 0) fprintf(stderr, "test_comm: %d ranks, %s\n", w->size, l3d_comm_mpi_library());

    test_all_ops(w, 1, INT_MAX / 2);
    test_all_ops(w, 1000, INT_MAX / 2);
    test_all_ops(w, 0, INT_MAX / 2);
    /* the blocking large-count path: chunks of 7 elements, counts not a multiple of 7 */
    l3d_comm_mpi_set_max_count(w, 7);
    test_all_ops(w, 7, 7);
    test_all_ops(w, 30, 7);
    test_split(w); /* inherits the chunk size */
    l3d_comm_mpi_set_max_count(w, 1 << 30);
    test_split(w);

    test_topo_layouts(w);
    test_topo_table();
    test_topo_resolve_errors();
    test_topo_cp(w);
    test_topo_ep(w);
    test_launcher_check(w->size);

    int failed = test_failures;
    l3d_comm_all_reduce(w, &failed, 1, L3D_I32, L3D_SUM, NULL);
    if (w->rank == 0) fprintf(stderr, "test_comm: %.2f s\n", l3d_time_s() - t0);
    int rc = TEST_REPORT();
    l3d_comm_mpi_finalize(w);
    return rc || failed ? 1 : 0;
}
