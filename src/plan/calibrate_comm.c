/* Calibration's links (include/llm3d/calibrate.h, phase 3): the all-reduces' latency and
 * bandwidth, and the DP gradient stream's overlap with backward products, on every rank. */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "plan/calibrate-impl.h"

/* Latency: the median of back-to-back 8-byte all-reduces over g (every rank; *lat in seconds on
 * each). */
static void all_reduce_latency(struct l3d_comm *g, bool quick, double *lat) {
    const int lat_reps = quick ? 300 : 5000;
    float buf[2] = {1e-6f, 1e-6f};
    double *t = l3d_alloc((size_t)lat_reps * sizeof(double), "calibrate");
    for (int r = 0; r < 20; r++) l3d_comm_all_reduce(g, buf, 2, L3D_F32, L3D_SUM, NULL);
    l3d_comm_barrier(g);
    for (int r = 0; r < lat_reps; r++) {
        double t0 = l3d_time_s();
        l3d_comm_all_reduce(g, buf, 2, L3D_F32, L3D_SUM, NULL);
        t[r] = l3d_time_s() - t0;
    }
    *lat = l3d_calib_median(t, lat_reps);
    l3d_free(t);
}

/* DP overlap, the profile's dp_overlap: how much of a gradient reduction hides behind backward
 * when it runs as the trainer runs it. The reduction: 32 MiB (16 with --quick) of fp32 zeros
 * all-reduced in the trainer's 4 MiB non-blocking pieces, all posted at once (src/parallel/dp.c).
 * The backward: the input and weight gradients of a linear layer of 256 x 768 x 768 (d12's
 * attention projection on 2 x 128 tokens, a few ms on a core), one thread a rank, repeated for
 * about twice the reduction's time so that the reduction could hide entirely; polled between the
 * products
 * (l3d_comm_test of every piece, the trainer's --progress poll) unless the world has the progress
 * thread (--progress thread, the default across nodes). Each round times, after a barrier, the
 * reduction alone posted and waited (X), the products alone (C) and both (T); hidden = (C + X -
 * T) / X, clamped to 0..1 (the products slowed by as much as the reduction took: 0), the median
 * of the rounds. The link's bandwidth is the same stream's: bus bandwidth (nccl-tests: bytes /
 * time x 2 (p - 1) / p) of each round's X, the median; a sustained rate, as the gradients move
 * (isolated 1-4 MiB all-reduces, measured until 2026-12-04, gave twice the rate a 1 Gbit/s
 * token-bucket link sustains: bench/allreduce.c across two namespace hosts, 0.13 against 0.06
 * GB/s). Every rank of g; figures on each; the products and the overlap only with dp (the DP
 * link), else the stream alone. */
#define OV_PIECE ((int64_t)1 << 20) /* fp32 elements: the trainer's 4 MiB bucket */
struct ov_work {
    struct l3d_backend *be;
    float *x, *w, *dy, *dx, *dw, *grad;
    l3d_req *reqs;
    int64_t n;
};

static double ov_time(struct l3d_comm *g, struct ov_work *k, int kernels, bool comm, bool poll) {
    int np = 0;
    l3d_comm_barrier(g);
    double t0 = l3d_time_s();
    for (int64_t o = 0; comm && o < k->n; o += OV_PIECE, np++)
        l3d_comm_all_reduce(g, k->grad + o, k->n - o < OV_PIECE ? k->n - o : OV_PIECE, L3D_F32,
                            L3D_SUM, &k->reqs[np]);
    for (int i = 0; i < kernels; i++) {
        l3d_be_matmul_backward(k->be, L3D_F32, k->dx, k->dw, NULL, k->dy, k->x, k->w, 256, 768,
                               768);
        for (int j = 0; poll && j < np; j++)
            if (k->reqs[j].active) l3d_comm_test(g, &k->reqs[j]);
    }
    for (int j = 0; j < np; j++)
        if (k->reqs[j].active) l3d_comm_wait(g, &k->reqs[j]);
    return l3d_time_s() - t0;
}

static void measure_stream(struct l3d_comm *g, struct l3d_calib *c, bool dp, double *bw) {
    struct l3d_backend *be = l3d_backend_cpu_init();
    int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    struct ov_work k = {.be = be, .n = (c->quick ? 16 : 32) * OV_PIECE / 4};
    k.x = l3d_calib_filled(256 * 768, -1.0f, 1.0f, 31);
    k.w = l3d_calib_filled(768 * 768, -0.03f, 0.03f, 32);
    k.dy = l3d_calib_filled(256 * 768, -1.0f, 1.0f, 33);
    k.dx = l3d_calib_filled(256 * 768, 0.0f, 0.0f, 34);
    k.dw = l3d_calib_filled(768 * 768, 0.0f, 0.0f, 35);
    /* zeros: the sums stay zeros, round after round */
    k.grad = l3d_calib_filled(k.n, 0.0f, 0.0f, 36);
    k.reqs = l3d_calloc((size_t)(k.n / OV_PIECE + 1) * sizeof(l3d_req), "calibrate");
    const bool poll = !c->thread;
    ov_time(g, &k, dp ? 2 : 0, true, poll); /* warm-up: primitives, MPI's buffers */
    /* the products' count: twice the reduction's time, the same on every rank (the largest) */
    double kernels = 0;
    if (dp) {
        double x0 = ov_time(g, &k, 0, true, poll), k1 = ov_time(g, &k, 4, false, poll) / 4;
        kernels = fmin(fmax(ceil(2.0 * x0 / k1), 4.0), 4000.0);
        l3d_comm_all_reduce(g, &kernels, 1, L3D_F64, L3D_MAX, NULL);
    }
    const int rounds = c->quick ? 3 : 7;
    double f[7] = {0}, xs[7], cs[7], ts[7], rate[7];
    const double p = g->size;
    for (int r = 0; r < rounds; r++) {
        xs[r] = ov_time(g, &k, 0, true, poll);
        rate[r] = 4.0 * (double)k.n / xs[r] * 2.0 * (p - 1) / p;
        if (!dp) continue;
        cs[r] = ov_time(g, &k, (int)kernels, false, poll);
        ts[r] = ov_time(g, &k, (int)kernels, true, poll);
        f[r] = fmin(1.0, fmax(0.0, (cs[r] + xs[r] - ts[r]) / xs[r]));
    }
    *bw = l3d_calib_median(rate, rounds);
    c->stream_bytes = k.n * 4;
    c->stream_rounds = rounds;
    if (dp) { /* the DP link's: the figure and the times of the round that gave it */
        double sorted[7];
        memcpy(sorted, f, sizeof f);
        c->ov_frac = l3d_calib_median(sorted, rounds);
        for (int r = 0; r < rounds; r++)
            if (f[r] == c->ov_frac) c->ov_x = xs[r], c->ov_c = cs[r], c->ov_t = ts[r];
        c->ov_kernels = (int)kernels;
    }
    float *bufs[] = {k.x, k.w, k.dy, k.dx, k.dw, k.grad};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) l3d_free(bufs[i]);
    l3d_free(k.reqs);
    omp_set_num_threads(threads);
    l3d_backend_free(be);
}

/* The links, on every rank; results on rank 0. One node: the all-reduce among all ranks (intra).
 * Several (a two-level profile): inside each node among its ranks, every node at once (intra;
 * none with one rank a node), then between nodes among one rank of each, the lowest (inter: the
 * network, what the planner divides among a node's ranks that send at once). */
void l3d_calib_links(struct l3d_comm *w, struct l3d_calib *c, const int *node_of) {
    const double wall0 = l3d_time_s(), cpu0 = l3d_calib_cpu_s();
    if (c->nodes == 1) {
        all_reduce_latency(w, c->quick, &c->intra_lat);
        measure_stream(w, c, true, &c->intra_bw);
    } else {
        struct l3d_comm *node = NULL, *leads = NULL;
        int first = w->rank; /* the lowest rank of this rank's node */
        for (int r = 0; r < w->rank; r++)
            if (node_of[r] == node_of[w->rank]) { first = r; break; }
        if (l3d_comm_split(w, node_of[w->rank], w->rank, &node) != L3D_OK ||
            l3d_comm_split(w, first == w->rank ? 0 : 1, w->rank, &leads) != L3D_OK)
            l3d_fatal(__FILE__, __LINE__, "calibrate: cannot split the world by node: %s",
                      l3d_error_message());
        if (c->per_node > 1) {
            all_reduce_latency(node, c->quick, &c->intra_lat);
            measure_stream(node, c, false, &c->intra_bw);
        }
        l3d_comm_barrier(w);
        if (first == w->rank) {
            all_reduce_latency(leads, c->quick, &c->inter_lat);
            measure_stream(leads, c, true, &c->inter_bw);
        }
        l3d_comm_barrier(w);
        l3d_comm_free(leads);
        l3d_comm_free(node);
    }
    c->share[2] = (l3d_calib_cpu_s() - cpu0) / (l3d_time_s() - wall0);
}
