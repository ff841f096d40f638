/*
 * The device communicator (src/comm/nccl.h): NCCL, or MPI through host copies, over the MPI world.
 * EXPERIMENTAL: compiled with -Werror in every CI run; its choice of transport is tested without a
 * GPU (tests/cuda/test_cuda_host.c); the collectives themselves first run in scripts/gpu-check.sh.
 *
 * Ordering. A device buffer is produced by kernels on the backend's stream: an operation records
 * an event there and makes the communicator's own stream wait on it, then enqueues the NCCL call
 * on its stream and records `done`. A blocking operation waits for `done` (host); l3d_comm_wait
 * does the same for a non-blocking one, so kernels issued after it read the result, and kernels
 * issued between the start and the wait run beside the transfer (the overlap of DP pieces with
 * the backward pass). Tags: NCCL matches a peer's sends and receives in issue order, which is what
 * the project's exchanges rely on (each tag is one stream of messages between two ranks).
 *
 * The watchdog bounds each wait for `done` as watchdog.c bounds MPI's: polls with growing sleeps,
 * and after the world's timeout_s names this rank, the step, what it was doing and the operation,
 * aborts NCCL and ends the job with status 75. (The liveness questions of MPI's watchdog, which
 * name the silent peer, are not asked over NCCL.)
 */
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cuda.h"
#include "backend/cuda_host.h"
#include "comm/nccl.h"

#define CUDA_OK(call)                                                                         \
    do {                                                                                      \
        cudaError_t e_ = (call);                                                              \
        if (e_ != cudaSuccess)                                                                \
            l3d_fatal(__FILE__, __LINE__, "%s failed: %s", #call, cudaGetErrorString(e_));    \
    } while (0)
#define NCCL_OK(call)                                                                         \
    do {                                                                                      \
        ncclResult_t r_ = (call);                                                             \
        if (r_ != ncclSuccess)                                                                \
            l3d_fatal(__FILE__, __LINE__, "%s failed: %s", #call, ncclGetErrorString(r_));    \
    } while (0)

struct pending;
/* a send or receive not yet given to NCCL (see flush_p2p) */
struct p2p {
    bool send;
    void *dev;
    int64_t n;
    enum l3d_dtype t;
    int peer;
    struct pending *p;
};

struct dev_comm {
    struct l3d_comm base;
    struct l3d_comm *mpi; /* the same ranks over MPI: host buffers, staging, bootstrap */
    ncclComm_t nccl;      /* NULL: staged */
    cudaStream_t stream;  /* NCCL's */
    cudaEvent_t ready;    /* recorded on the backend's stream before each operation */
    struct p2p *queue;    /* sends and receives waiting for flush_p2p */
    int nq, capq;
    struct l3d_cuda_xfer *a2a; /* all_to_allv's sends and receives (2 size), made with it: read
                                * only while they are enqueued */
};

/* A pending operation (l3d_req.opaque[0]): an MPI request of the inner communicator, with the
 * host copies to write back (staged), or an NCCL operation's completion event. */
#define MAX_STAGE 2
struct staged {
    void *dev, *host;
    size_t bytes;
    bool back; /* copied back to the device when complete */
};
struct pending {
    l3d_req inner;
    cudaEvent_t done; /* NCCL; NULL otherwise */
    const char *op;
    int n_stage;
    struct staged st[MAX_STAGE];
    bool queued;      /* a send or receive still in the queue (NCCL) */
    void *tmp;        /* NCCL send or receive of a host buffer: its device copy ... */
    void *host_out;   /* ... copied back into this host buffer when a receive completes */
    size_t tmp_bytes;
};

static const struct l3d_comm_i dev_comm_i;

static struct dev_comm *dc(struct l3d_comm *c) {
    L3D_ASSERT(c && c->i == &dev_comm_i);
    return c->ctx;
}

static ncclDataType_t nccl_type(enum l3d_dtype t) {
    switch (t) {
    case L3D_F32: return ncclFloat32;
    case L3D_F64: return ncclFloat64;
    case L3D_I32: return ncclInt32;
    case L3D_U8: return ncclUint8;
    case L3D_BF16: return ncclBfloat16;
    case L3D_F16: return ncclFloat16;
    case L3D_I64: return ncclInt64;
    }
    l3d_fatal(__FILE__, __LINE__, "unknown dtype %d", (int)t);
}
static ncclRedOp_t nccl_op(enum l3d_redop op) { return op == L3D_SUM ? ncclSum : ncclMax; }

static size_t nbytes(int64_t n, enum l3d_dtype t) { return (size_t)n * l3d_dtype_size(t); }

/* ---- waits under the watchdog ----------------------------------------------------------------- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void wait_done(struct dev_comm *d, cudaEvent_t done, const char *op) {
    struct l3d_watch *w = d->base.watch;
    double t0 = now_s(), nap = 10e-6;
    for (;;) {
        cudaError_t e = cudaEventQuery(done);
        if (e == cudaSuccess) break;
        if (e != cudaErrorNotReady) CUDA_OK(e);
        ncclResult_t async = ncclSuccess;
        NCCL_OK(ncclCommGetAsyncError(d->nccl, &async));
        if (async != ncclSuccess && async != ncclInProgress)
            l3d_fatal(__FILE__, __LINE__, "rank %d: NCCL %s failed: %s", d->base.world_rank, op,
                      ncclGetErrorString(async));
        double waited = now_s() - t0;
        if (w && w->timeout_s > 0 && waited > w->timeout_s) {
            fprintf(stderr, "llm3d: rank %d: %s%s%s on the GPU not complete after %.0f s (step %d"
                    "%s%s): NCCL aborted, ending the job\n", d->base.world_rank,
                    d->base.role ? d->base.role : "", d->base.role ? " " : "", op, waited,
                    w->step, w->doing.what ? ", " : "", w->doing.what ? w->doing.what : "");
            fflush(stderr);
            ncclCommAbort(d->nccl);
            l3d_comm_abort(d->mpi, 75);
        }
        /* the first millisecond polls without sleeping (a TP all-reduce takes tens of
         * microseconds: a sleep would be most of it), then sleeps growing to 1 ms */
        if (waited > 1e-3) {
            struct timespec ts = {0, (long)(nap * 1e9)};
            nanosleep(&ts, NULL);
            nap = nap < 0.5e-3 ? 2 * nap : nap;
        }
    }
    double waited = now_s() - t0;
    if (w && waited > w->longest_s) {
        w->longest_s = waited;
        if (waited >= 0.5)
            snprintf(w->longest_what, sizeof w->longest_what, "NCCL %s (%s)", op,
                     w->doing.what ? w->doing.what : "-");
    }
}

/* ---- the three paths -------------------------------------------------------------------------- */

/* Device buffers take NCCL (or staging) when any of them is device memory; host buffers MPI. */
static bool on_device(const void *p) { return p && l3d_cuda_is_device_ptr(p); }

/* the NCCL stream waits for the work issued so far on the backend's stream */
static void after_backend(struct dev_comm *d) {
    CUDA_OK(cudaEventRecord(d->ready, (cudaStream_t)l3d_backend_cuda_stream(d->base.be)));
    CUDA_OK(cudaStreamWaitEvent(d->stream, d->ready, 0));
}

/* Sends and receives are queued, and given to NCCL together in one group here: before any other
 * operation of the communicator starts, and when one of them is waited on or tested. NCCL runs
 * a communicator's operations one after the other on its stream, and a send completes only when
 * the peer's receive runs: issued one by one, the pipeline's "send the next activation, receive
 * this gradient" on one stage against "send this gradient, receive the next activation" on the
 * next would each wait for the other's first operation forever (MPI's buffered sends hide this).
 * In one group NCCL progresses them together, as MPI's non-blocking pair would. */
static void flush_p2p(struct dev_comm *d) {
    if (d->nq == 0) return;
    after_backend(d);
    NCCL_OK(ncclGroupStart());
    for (int i = 0; i < d->nq; i++) {
        struct p2p *q = &d->queue[i];
        if (q->send)
            NCCL_OK(ncclSend(q->dev, (size_t)q->n, nccl_type(q->t), q->peer, d->nccl, d->stream));
        else
            NCCL_OK(ncclRecv(q->dev, (size_t)q->n, nccl_type(q->t), q->peer, d->nccl, d->stream));
    }
    NCCL_OK(ncclGroupEnd());
    for (int i = 0; i < d->nq; i++) {
        struct pending *p = d->queue[i].p;
        CUDA_OK(cudaEventCreateWithFlags(&p->done, cudaEventDisableTiming));
        CUDA_OK(cudaEventRecord(p->done, d->stream));
        p->queued = false;
    }
    d->nq = 0;
}

/* NCCL: the stream waits for the backend's work, the call is enqueued by `enqueue` */
static struct pending *nccl_begin(struct dev_comm *d, const char *op) {
    flush_p2p(d); /* NCCL operations in the order they were started */
    after_backend(d);
    struct pending *p = l3d_calloc(sizeof *p, "NCCL operation");
    p->op = op;
    return p;
}
/* a completed NCCL operation: a host buffer's receive copied back, its device copy freed */
static void nccl_finish(struct pending *p) {
    CUDA_OK(cudaEventDestroy(p->done));
    if (p->host_out) CUDA_OK(cudaMemcpy(p->host_out, p->tmp, p->tmp_bytes, cudaMemcpyDeviceToHost));
    if (p->tmp) CUDA_OK(cudaFree(p->tmp));
    l3d_free(p);
}
/* after the enqueue: completion event; blocking (req NULL) waits here */
static void nccl_end(struct dev_comm *d, struct pending *p, l3d_req *req) {
    CUDA_OK(cudaEventCreateWithFlags(&p->done, cudaEventDisableTiming));
    CUDA_OK(cudaEventRecord(p->done, d->stream));
    if (req) {
        req->opaque[0] = (uint64_t)(uintptr_t)p;
        req->active = true;
        return;
    }
    wait_done(d, p->done, p->op);
    nccl_finish(p);
}

/* Staging: host copies of device buffers (the backend synchronised first) */
static void *stage(struct dev_comm *d, struct pending *p, void *dev, size_t bytes, bool in,
                   bool back) {
    L3D_ASSERT(p->n_stage < MAX_STAGE);
    void *h = l3d_alloc(bytes ? bytes : 1, "staged communication");
    if (in) l3d_be_copy_d2h(d->base.be, h, dev, bytes);
    p->st[p->n_stage++] = (struct staged){dev, h, bytes, back};
    return h;
}
static void stage_finish(struct dev_comm *d, struct pending *p) {
    for (int k = 0; k < p->n_stage; k++) {
        if (p->st[k].back) l3d_be_copy_h2d(d->base.be, p->st[k].dev, p->st[k].host,
                                           p->st[k].bytes);
        l3d_free(p->st[k].host);
    }
    l3d_free(p);
}
/* after the inner MPI call: blocking finishes here, non-blocking at the wait */
static void stage_end(struct dev_comm *d, struct pending *p, l3d_req *req) {
    if (req) {
        req->opaque[0] = (uint64_t)(uintptr_t)p;
        req->active = true;
        return;
    }
    stage_finish(d, p);
}
/* the inner request of a non-blocking staged call, NULL for a blocking one */
static l3d_req *inner(struct pending *p, const l3d_req *req) { return req ? &p->inner : NULL; }

/* The MPI path (host buffers; device buffers of a staged communicator): a record for the wait.
 * Queued sends and receives go to NCCL first: a peer may wait for them before it joins this. */
static struct pending *mpi_begin(struct dev_comm *d, const char *op) {
    if (d->nccl) flush_p2p(d);
    struct pending *p = l3d_calloc(sizeof *p, "communication");
    p->op = op;
    return p;
}
/* buf as MPI takes it: itself, or a host copy (read in: in; written back: back) */
static void *mpi_buf(struct dev_comm *d, struct pending *p, void *buf, size_t bytes, bool in,
                     bool back) {
    return on_device(buf) ? stage(d, p, buf, bytes, in, back) : buf;
}
_Static_assert(sizeof(int) == 4, "ranks' devices are gathered as int32");
#define USE_NCCL(d, buf) ((d)->nccl && on_device(buf))

/* ---- collectives and point-to-point ----------------------------------------------------------- */

static void dev_all_reduce(struct l3d_comm *c, void *buf, int64_t n, enum l3d_dtype t,
                           enum l3d_redop op, l3d_req *req) {
    struct dev_comm *d = dc(c);
    if (USE_NCCL(d, buf)) {
        struct pending *p = nccl_begin(d, "all-reduce");
        NCCL_OK(ncclAllReduce(buf, buf, (size_t)n, nccl_type(t), nccl_op(op), d->nccl,
                              d->stream));
        nccl_end(d, p, req);
        return;
    }
    struct pending *p = mpi_begin(d, "all-reduce");
    void *h = mpi_buf(d, p, buf, nbytes(n, t), true, true);
    l3d_comm_all_reduce(d->mpi, h, n, t, op, inner(p, req));
    stage_end(d, p, req);
}

static void dev_reduce(struct l3d_comm *c, void *buf, int64_t n, enum l3d_dtype t,
                       enum l3d_redop op, int root, l3d_req *req) {
    struct dev_comm *d = dc(c);
    if (USE_NCCL(d, buf)) {
        struct pending *p = nccl_begin(d, "reduce");
        NCCL_OK(ncclReduce(buf, buf, (size_t)n, nccl_type(t), nccl_op(op), root, d->nccl,
                           d->stream));
        nccl_end(d, p, req);
        return;
    }
    struct pending *p = mpi_begin(d, "reduce");
    void *h = mpi_buf(d, p, buf, nbytes(n, t), true, c->rank == root);
    l3d_comm_reduce(d->mpi, h, n, t, op, root, inner(p, req));
    stage_end(d, p, req);
}

static void dev_reduce_scatter(struct l3d_comm *c, const void *send, void *recv, int64_t n,
                               enum l3d_dtype t, enum l3d_redop op, l3d_req *req) {
    struct dev_comm *d = dc(c);
    if (USE_NCCL(d, recv)) {
        struct pending *p = nccl_begin(d, "reduce-scatter");
        NCCL_OK(ncclReduceScatter(send, recv, (size_t)n, nccl_type(t), nccl_op(op), d->nccl,
                                  d->stream));
        nccl_end(d, p, req);
        return;
    }
    struct pending *p = mpi_begin(d, "reduce-scatter");
    void *hs = mpi_buf(d, p, (void *)send, nbytes(n * c->size, t), true, false);
    void *hr = mpi_buf(d, p, recv, nbytes(n, t), false, true);
    l3d_comm_reduce_scatter(d->mpi, hs, hr, n, t, op, inner(p, req));
    stage_end(d, p, req);
}

static void dev_all_gather(struct l3d_comm *c, void *recv, int64_t n, enum l3d_dtype t,
                           l3d_req *req) {
    struct dev_comm *d = dc(c);
    if (USE_NCCL(d, recv)) {
        struct pending *p = nccl_begin(d, "all-gather");
        const char *mine = (const char *)recv + nbytes(n * c->rank, t);
        NCCL_OK(ncclAllGather(mine, recv, (size_t)n, nccl_type(t), d->nccl, d->stream));
        nccl_end(d, p, req);
        return;
    }
    struct pending *p = mpi_begin(d, "all-gather");
    void *h = mpi_buf(d, p, recv, nbytes(n * c->size, t), true, true);
    l3d_comm_all_gather(d->mpi, h, n, t, inner(p, req));
    stage_end(d, p, req);
}

/* NCCL has no all-gatherv: one broadcast per rank's block, grouped into one launch */
static void dev_all_gatherv(struct l3d_comm *c, void *recv, const int64_t *counts,
                            const int64_t *displs, enum l3d_dtype t, l3d_req *req) {
    struct dev_comm *d = dc(c);
    if (USE_NCCL(d, recv)) {
        struct pending *p = nccl_begin(d, "all-gatherv");
        NCCL_OK(ncclGroupStart());
        for (int r = 0; r < c->size; r++) {
            char *blk = (char *)recv + nbytes(displs[r], t);
            NCCL_OK(ncclBroadcast(blk, blk, (size_t)counts[r], nccl_type(t), r, d->nccl,
                                  d->stream));
        }
        NCCL_OK(ncclGroupEnd());
        nccl_end(d, p, req);
        return;
    }
    struct pending *p = mpi_begin(d, "all-gatherv");
    int64_t span = l3d_cuda_blocks_span(c->size, counts, displs);
    void *h = mpi_buf(d, p, recv, nbytes(span, t), true, true);
    l3d_comm_all_gatherv(d->mpi, h, counts, displs, t, inner(p, req));
    stage_end(d, p, req);
}

/* NCCL has no all-to-allv: one send and one receive per peer with a non-zero count, grouped into
 * one launch (l3d_cuda_a2a_xfers: a peer's count for this rank is this rank's for it, so every
 * send meets its receive; this rank's own block is a send to itself, which NCCL pairs with the
 * receive in the group). NCCL when both buffers are device memory (or one is, the other NULL
 * with nothing to move); a host buffer on either side takes MPI, on host copies of any device
 * one. Every rank passes buffers of the same kind, so every rank takes the same path. */
static void dev_all_to_allv(struct l3d_comm *c, const void *send, const int64_t *scounts,
                            const int64_t *sdispls, void *recv, const int64_t *rcounts,
                            const int64_t *rdispls, enum l3d_dtype t, l3d_req *req) {
    struct dev_comm *d = dc(c);
    bool dev_s = on_device(send), dev_r = on_device(recv);
    if (d->nccl && (dev_s || dev_r) && (dev_s || !send) && (dev_r || !recv)) {
        struct pending *p = nccl_begin(d, "all-to-all");
        struct l3d_cuda_xfer *x = d->a2a; /* no allocation per call */
        int ns = l3d_cuda_a2a_xfers(c->size, scounts, sdispls, l3d_dtype_size(t), x);
        int nr = l3d_cuda_a2a_xfers(c->size, rcounts, rdispls, l3d_dtype_size(t), x + ns);
        NCCL_OK(ncclGroupStart());
        for (int i = 0; i < ns; i++)
            NCCL_OK(ncclSend((const char *)send + x[i].at, x[i].count, nccl_type(t), x[i].peer,
                             d->nccl, d->stream));
        for (int i = ns; i < ns + nr; i++)
            NCCL_OK(ncclRecv((char *)recv + x[i].at, x[i].count, nccl_type(t), x[i].peer, d->nccl,
                             d->stream));
        NCCL_OK(ncclGroupEnd());
        nccl_end(d, p, req);
        return;
    }
    int64_t sspan = l3d_cuda_blocks_span(c->size, scounts, sdispls);
    int64_t rspan = l3d_cuda_blocks_span(c->size, rcounts, rdispls);
    struct pending *p = mpi_begin(d, "all-to-all");
    void *hs = mpi_buf(d, p, (void *)send, nbytes(sspan, t), true, false);
    void *hr = mpi_buf(d, p, recv, nbytes(rspan, t), true, true); /* gaps kept */
    l3d_comm_all_to_allv(d->mpi, hs, scounts, sdispls, hr, rcounts, rdispls, t, inner(p, req));
    stage_end(d, p, req);
}

static void dev_broadcast(struct l3d_comm *c, void *buf, int64_t n, enum l3d_dtype t, int root,
                          l3d_req *req) {
    struct dev_comm *d = dc(c);
    if (USE_NCCL(d, buf)) {
        struct pending *p = nccl_begin(d, "broadcast");
        NCCL_OK(ncclBroadcast(buf, buf, (size_t)n, nccl_type(t), root, d->nccl, d->stream));
        nccl_end(d, p, req);
        return;
    }
    struct pending *p = mpi_begin(d, "broadcast");
    void *h = mpi_buf(d, p, buf, nbytes(n, t), c->rank == root, c->rank != root);
    l3d_comm_broadcast(d->mpi, h, n, t, root, inner(p, req));
    stage_end(d, p, req);
}

/* A send or receive on a communicator with NCCL always takes NCCL, whatever the buffer: the two
 * sides of a transfer must use the same transport, and one side's buffer may be on the device
 * while the other's is on the host (the checkpoint gather sends device parameters to a host
 * buffer of rank 0). A host buffer goes through a device copy. Queued (flush_p2p); a blocking one
 * is flushed and waited for at once. */
static void nccl_p2p(struct dev_comm *d, bool send, void *buf, int64_t n, enum l3d_dtype t,
                     int peer, l3d_req *req) {
    struct pending *p = l3d_calloc(sizeof *p, "NCCL operation");
    p->op = send ? "send to" : "receive from";
    void *dev = buf;
    if (!on_device(buf)) {
        p->tmp_bytes = nbytes(n, t);
        CUDA_OK(cudaMalloc(&p->tmp, p->tmp_bytes ? p->tmp_bytes : 1));
        if (send) CUDA_OK(cudaMemcpy(p->tmp, buf, p->tmp_bytes, cudaMemcpyHostToDevice));
        else p->host_out = buf;
        dev = p->tmp;
    }
    if (d->nq == d->capq) {
        d->capq = d->capq ? 2 * d->capq : 8;
        struct p2p *q = l3d_alloc((size_t)d->capq * sizeof *q, "NCCL send/receive queue");
        if (d->nq) memcpy(q, d->queue, (size_t)d->nq * sizeof *q);
        l3d_free(d->queue);
        d->queue = q;
    }
    d->queue[d->nq++] = (struct p2p){send, dev, n, t, peer, p};
    p->queued = true;
    if (req) {
        req->opaque[0] = (uint64_t)(uintptr_t)p;
        req->active = true;
        return;
    }
    flush_p2p(d);
    wait_done(d, p->done, p->op);
    nccl_finish(p);
}

static void dev_send(struct l3d_comm *c, const void *buf, int64_t n, enum l3d_dtype t, int peer,
                     int tag, l3d_req *req) {
    struct dev_comm *d = dc(c);
    if (d->nccl) {
        nccl_p2p(d, true, (void *)buf, n, t, peer, req);
        return;
    }
    struct pending *p = mpi_begin(d, "send to");
    void *h = mpi_buf(d, p, (void *)buf, nbytes(n, t), true, false);
    l3d_comm_send(d->mpi, h, n, t, peer, tag, inner(p, req));
    stage_end(d, p, req);
}

static void dev_recv(struct l3d_comm *c, void *buf, int64_t n, enum l3d_dtype t, int peer,
                     int tag, l3d_req *req) {
    struct dev_comm *d = dc(c);
    if (d->nccl) {
        nccl_p2p(d, false, buf, n, t, peer, req);
        return;
    }
    struct pending *p = mpi_begin(d, "receive from");
    void *h = mpi_buf(d, p, buf, nbytes(n, t), false, true);
    l3d_comm_recv(d->mpi, h, n, t, peer, tag, inner(p, req));
    stage_end(d, p, req);
}

static struct pending *pending_of(l3d_req *req) {
    return (struct pending *)(uintptr_t)req->opaque[0];
}
static void req_clear(l3d_req *req) {
    memset(req->opaque, 0, sizeof req->opaque);
    req->active = false;
}

static void dev_wait(struct l3d_comm *c, l3d_req *req) {
    struct dev_comm *d = dc(c);
    if (!req->active) return;
    struct pending *p = pending_of(req);
    if (p->queued) flush_p2p(d);
    if (p->done) {
        wait_done(d, p->done, p->op);
        nccl_finish(p);
    } else {
        l3d_comm_wait(d->mpi, &p->inner);
        stage_finish(d, p);
    }
    req_clear(req);
}

static bool dev_test(struct l3d_comm *c, l3d_req *req) {
    struct dev_comm *d = dc(c);
    if (!req->active) return true;
    struct pending *p = pending_of(req);
    if (p->queued) flush_p2p(d);
    if (p->done) {
        cudaError_t e = cudaEventQuery(p->done);
        if (e == cudaErrorNotReady) return false;
        CUDA_OK(e);
        nccl_finish(p);
    } else {
        if (!l3d_comm_test(d->mpi, &p->inner)) return false;
        stage_finish(d, p);
    }
    req_clear(req);
    return true;
}

static void dev_barrier(struct l3d_comm *c) {
    struct dev_comm *d = dc(c);
    if (d->nccl) flush_p2p(d); /* a peer may wait for them before it joins the barrier */
    l3d_comm_barrier(d->mpi);
}
static void dev_abort(struct l3d_comm *c, int code) {
    struct dev_comm *d = dc(c);
    if (d->nccl) ncclCommAbort(d->nccl);
    l3d_comm_abort(d->mpi, code);
}
static int dev_node(struct l3d_comm *c) {
    struct dev_comm *d = dc(c);
    return d->mpi->i->node ? d->mpi->i->node(d->mpi) : d->mpi->rank;
}

/* ---- making and freeing ----------------------------------------------------------------------- */

/* the device communicator over MPI communicator m; NCCL bootstrapped over m (rank 0's unique id
 * broadcast) unless staged. m then sees host buffers only. Collective over m. */
static struct dev_comm *wrap(struct l3d_comm *m, struct l3d_backend *be, bool use_nccl) {
    struct dev_comm *d = l3d_calloc(sizeof *d, "device communicator");
    d->mpi = m;
    d->a2a = l3d_alloc(2 * (size_t)m->size * sizeof *d->a2a, "all-to-all transfers");
    d->base = (struct l3d_comm){.i = &dev_comm_i, .ctx = d, .rank = m->rank, .size = m->size,
                                .world_rank = m->world_rank, .be = be, .watch = m->watch,
                                .role = m->role};
    m->be = NULL;
    CUDA_OK(cudaSetDevice(l3d_backend_cuda_device(be)));
    CUDA_OK(cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking));
    CUDA_OK(cudaEventCreateWithFlags(&d->ready, cudaEventDisableTiming));
    if (use_nccl) {
        ncclUniqueId id;
        memset(&id, 0, sizeof id);
        if (m->rank == 0) NCCL_OK(ncclGetUniqueId(&id));
        l3d_comm_broadcast(m, &id, (int64_t)sizeof id, L3D_U8, 0, NULL);
        NCCL_OK(ncclCommInitRank(&d->nccl, m->size, id, m->rank));
    }
    return d;
}

static l3d_status dev_split(struct l3d_comm *c, int color, int key, struct l3d_comm **out) {
    struct dev_comm *d = dc(c);
    struct l3d_comm *m;
    l3d_status st = l3d_comm_split(d->mpi, color, key, &m);
    if (st != L3D_OK || !m) {
        *out = NULL;
        return st;
    }
    *out = &wrap(m, c->be, d->nccl != NULL)->base;
    return L3D_OK;
}

static void dev_free(struct l3d_comm *c) {
    struct dev_comm *d = dc(c);
    L3D_ASSERT(d->nq == 0); /* every send and receive was waited on */
    l3d_free(d->queue);
    l3d_free(d->a2a);
    if (d->nccl) NCCL_OK(ncclCommDestroy(d->nccl));
    cudaEventDestroy(d->ready);
    cudaStreamDestroy(d->stream);
    l3d_comm_free(d->mpi); /* a no-op on the MPI world */
    l3d_free(d);
}

static const struct l3d_comm_i dev_comm_i = {
    .name = "nccl",
    .split = dev_split,
    .free = dev_free,
    .all_reduce = dev_all_reduce,
    .reduce = dev_reduce,
    .reduce_scatter = dev_reduce_scatter,
    .all_gather = dev_all_gather,
    .all_gatherv = dev_all_gatherv,
    .all_to_allv = dev_all_to_allv,
    .broadcast = dev_broadcast,
    .send = dev_send,
    .recv = dev_recv,
    .wait = dev_wait,
    .test = dev_test,
    .barrier = dev_barrier,
    .abort = dev_abort,
    .node = dev_node,
};

/* Each rank's node and device gathered, the transport chosen the same way everywhere; a rank
 * whose launcher did not announce its local rank takes its device from the MPI_COMM_TYPE_SHARED
 * count now (before any allocation). */
l3d_status l3d_comm_device_world(struct l3d_comm *world, struct l3d_backend *be,
                                 struct l3d_comm **out) {
    *out = world;
    if (!l3d_backend_is_cuda(be)) return L3D_OK;
    int n = world->size;
    int *node_of = l3d_alloc((size_t)n * sizeof *node_of, "rank nodes");
    int *dev = l3d_alloc((size_t)n * sizeof *dev, "rank devices"); /* gathered as int32 */
    l3d_comm_nodes(world, node_of);
    if (l3d_cuda_env_local_rank() < 0)
        l3d_backend_cuda_rebind(be, l3d_cuda_local_rank_of(node_of, n, world->rank));
    dev[world->rank] = l3d_backend_cuda_device(be);
    if (n > 1) l3d_comm_all_gather(world, dev, 1, L3D_I32, NULL);
    int a, b;
    enum l3d_cuda_comm_kind kind = l3d_cuda_comm_choice(node_of, dev, n, &a, &b);
    if (kind == L3D_CUDA_COMM_STAGED && world->rank == 0)
        fprintf(stderr, "llm3d: ranks %d and %d share GPU %d of their node, where NCCL cannot "
                "run: device buffers go through MPI with host copies (slower)\n", a, b, dev[a]);
    l3d_free(dev);
    l3d_free(node_of);
    *out = &wrap(world, be, kind == L3D_CUDA_COMM_NCCL)->base;
    return L3D_OK;
}

struct l3d_comm *l3d_comm_device_release(struct l3d_comm *world) {
    if (!world || world->i != &dev_comm_i) return world;
    struct l3d_comm *m = dc(world)->mpi;
    dev_free(world);
    return m;
}
