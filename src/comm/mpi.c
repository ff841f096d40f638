/*
 * The MPI communicator (include/llm3d/comm.h): the only file that includes mpi.h.
 *
 * Every MPI call between init and finalize goes through L3D_MPI_CHECK (only the calls of the
 * failure paths themselves do not). Communicators use MPI_ERRORS_RETURN, so an error comes back
 * here as a code, is printed as "llm3d: rank R: <call> failed: <MPI's message>" and ends the job
 * with MPI_Abort on the world: a failed operation never leaves peers waiting. A rank that dies
 * (signal, exit) is handled by the launcher: Open MPI's mpirun and MPICH's Hydra both kill the
 * other ranks within a second and return a non-zero status; the exit guard below covers the one
 * case Hydra would report as success (a rank calling exit(0) before finalize). A rank that stops
 * or hangs is the watchdog's (src/comm/watchdog.c): every blocking operation is its non-blocking
 * form and a watch_wait, which polls with growing sleeps and, after the world's watch timeout,
 * finds the rank that does not respond, names it and aborts (struct l3d_watch, comm.h;
 * docs/DESIGN.md).
 *
 * Counts: MPI counts are int. Blocking operations take any int64_t count and loop over chunks
 * of at most max_count elements (INT_MAX / 2 unless a test lowers it); non-blocking collectives
 * take at most INT_MAX elements and non-blocking send/recv at most max_count (callers bucket),
 * since one request stands for one MPI call.
 */
#include <limits.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mpi.h>

#include "comm/mpi-impl.h"
#include "comm/watchdog.h"
#include "llm3d/backend.h"
#include "llm3d/comm.h"

/* ---- errors ---------------------------------------------------------------------------------- */

_Noreturn void l3d_mpi_fail(const char *call, int rc, const char *file, int line) {
    char msg[MPI_MAX_ERROR_STRING] = "unknown error";
    int len = 0, rank = -1;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "error %d", rc);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int name_len = (int)strcspn(call, "( ");
    fprintf(stderr, "llm3d: rank %d: %.*s failed: %s (%s:%d)\n", rank, name_len, call, msg, file,
            line);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1); /* MPI_Abort does not return; this keeps _Noreturn honest if it did */
}

/* The core abort hook: L3D_ASSERT / l3d_fatal on any rank take the whole job down (134 is the
 * status a single process gets from the default hook). */
static void mpi_abort_hook(void *ctx) {
    (void)ctx;
    MPI_Abort(MPI_COMM_WORLD, 134);
}

/* ---- communicator state ---------------------------------------------------------------------- */

/* What a l3d_req holds: the MPI request and memory to release when it completes (the int
 * counts/displacements of an all_gatherv, which MPI reads until completion). */
struct mpi_req {
    MPI_Request r;
    void *scratch;
    int peer;       /* a send's or receive's peer (rank in the communicator), -1: a collective */
    const char *op; /* "all-reduce", "receive from", ...: for the watchdog's message */
};
_Static_assert(sizeof(struct mpi_req) <= sizeof(((l3d_req *)0)->opaque),
               "l3d_req.opaque too small for an MPI request");

static const struct l3d_comm_i mpi_comm_i;

static struct mpi_comm *mc(struct l3d_comm *c) {
    L3D_ASSERT(c && c->i == &mpi_comm_i);
    return c->ctx;
}

/* ---- element types and reductions --------------------------------------------------------- */

/* MPI 3 and 4 have no portable bf16 or fp16 type (MPIX_C_FLOAT16 is MPICH's only), so both travel
 * as one committed datatype of 2 contiguous bytes, and their SUM and MAX are user-defined,
 * commutative operations. A pairwise SUM adds in fp32 and rounds once to nearest even: fp32's 24
 * bits are at least 2p + 2 for bf16 (p = 8) and fp16 (p = 11), so the fp32 sum rounded again is
 * the correctly rounded sum (Figueroa 1995, "When is double rounding innocuous?"), the same on
 * every rank whatever the MPI library's reduction order within a pair. MAX is exact: the larger
 * value, +0 over -0, and a NaN on either side gives the type's quiet NaN (NaN-propagating, so an
 * overflow shows; one canonical NaN, so the operation stays commutative). The handles are made
 * once by l3d_comm_mpi_init, shared by every communicator split from the world, and freed by
 * l3d_comm_mpi_finalize. */
struct mpi_types {
    MPI_Datatype half;   /* bf16 and fp16: 2 contiguous bytes */
    MPI_Op op[2][2];     /* [0 bf16, 1 fp16][L3D_SUM, L3D_MAX] */
};

static void half_combine(const void *in, void *inout, int n, bool f16, enum l3d_redop op) {
    const uint16_t *a = in;
    uint16_t *b = inout;
    uint16_t qnan = f16 ? 0x7e00 : 0x7fc0;
    for (int i = 0; i < n; i++) {
        float fa = f16 ? l3d_f16_to_f32(a[i]) : l3d_bf16_to_f32(a[i]);
        float fb = f16 ? l3d_f16_to_f32(b[i]) : l3d_bf16_to_f32(b[i]);
        if (op == L3D_SUM)
            b[i] = f16 ? l3d_f32_to_f16(fa + fb) : l3d_f32_to_bf16(fa + fb);
        else if (fa != fa || fb != fb)
            b[i] = qnan;
        else if (fa == fb)
            b[i] = a[i] & b[i]; /* the same pattern, or +0 and -0: +0 */
        else if (fa > fb)
            b[i] = a[i];
    }
}

/* bf16's SUM with the conversions inline (l3d_bf16_widen, l3d_bf16_narrow), the same bits as
 * half_combine, in a loop the compiler vectorizes: a tensor-parallel all-reduce of 512 x 768
 * bf16 activations between 2 ranks took 1.52 ms through half_combine's per-element calls
 * against 0.46 ms for the same count of fp32 (the bytes halved, the time tripled); now 0.20. */
static void bf16_sum(void *in, void *inout, int *n, MPI_Datatype *t) {
    (void)t;
    const uint16_t *a = in;
    uint16_t *b = inout;
    const int k = *n;
#pragma omp simd
    for (int i = 0; i < k; i++) b[i] = l3d_bf16_narrow(l3d_bf16_widen(a[i]) + l3d_bf16_widen(b[i]));
}
static void bf16_max(void *in, void *inout, int *n, MPI_Datatype *t) {
    (void)t;
    half_combine(in, inout, *n, false, L3D_MAX);
}
static void f16_sum(void *in, void *inout, int *n, MPI_Datatype *t) {
    (void)t;
    half_combine(in, inout, *n, true, L3D_SUM);
}
static void f16_max(void *in, void *inout, int *n, MPI_Datatype *t) {
    (void)t;
    half_combine(in, inout, *n, true, L3D_MAX);
}

static struct mpi_types *types_init(void) {
    struct mpi_types *ty = l3d_calloc(sizeof *ty, "MPI types");
    L3D_MPI_CHECK(MPI_Type_contiguous(2, MPI_BYTE, &ty->half));
    L3D_MPI_CHECK(MPI_Type_set_name(ty->half, "l3d_half"));
    L3D_MPI_CHECK(MPI_Type_commit(&ty->half));
    L3D_MPI_CHECK(MPI_Op_create(bf16_sum, 1, &ty->op[0][L3D_SUM]));
    L3D_MPI_CHECK(MPI_Op_create(bf16_max, 1, &ty->op[0][L3D_MAX]));
    L3D_MPI_CHECK(MPI_Op_create(f16_sum, 1, &ty->op[1][L3D_SUM]));
    L3D_MPI_CHECK(MPI_Op_create(f16_max, 1, &ty->op[1][L3D_MAX]));
    return ty;
}

static void types_free(struct mpi_types *ty) {
    for (int k = 0; k < 2; k++)
        for (int o = 0; o < 2; o++) L3D_MPI_CHECK(MPI_Op_free(&ty->op[k][o]));
    L3D_MPI_CHECK(MPI_Type_free(&ty->half));
    l3d_free(ty);
}

static MPI_Datatype mpi_type(const struct mpi_comm *m, enum l3d_dtype t) {
    switch (t) {
    case L3D_F32: return MPI_FLOAT;
    case L3D_F64: return MPI_DOUBLE;
    case L3D_I32: return MPI_INT32_T;
    case L3D_U8: return MPI_UINT8_T;
    case L3D_BF16:
    case L3D_F16: return m->types->half;
    case L3D_I64: return MPI_INT64_T;
    }
    l3d_fatal(__FILE__, __LINE__, "unknown dtype %d", (int)t);
}

static MPI_Op mpi_op(const struct mpi_comm *m, enum l3d_dtype t, enum l3d_redop op) {
    L3D_ASSERT(op == L3D_SUM || op == L3D_MAX);
    if (t == L3D_BF16 || t == L3D_F16) return m->types->op[t == L3D_F16][op];
    return op == L3D_SUM ? MPI_SUM : MPI_MAX;
}

static struct mpi_comm *comm_new(MPI_Comm comm, int world_rank, int64_t max_count,
                                 struct mpi_types *types, bool is_world) {
    struct mpi_comm *m = l3d_calloc(sizeof *m, "communicator");
    m->types = types;
    L3D_MPI_CHECK(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
    m->comm = comm;
    m->max_count = max_count;
    m->is_world = is_world;
    m->base.i = &mpi_comm_i;
    m->base.ctx = m;
    m->base.world_rank = world_rank;
    L3D_MPI_CHECK(MPI_Comm_rank(comm, &m->base.rank));
    L3D_MPI_CHECK(MPI_Comm_size(comm, &m->base.size));
    m->a2a_counts = l3d_alloc(4 * (size_t)m->base.size * sizeof(int), "all_to_allv counts");
    return m;
}

/* ---- the progress thread (l3d_comm_mpi_init_progress) ------------------------------------- */

/* Open MPI's shared-memory transport (vader: a 32 KiB first fragment, then a CMA copy by the
 * receiver and a completion message back) and libnbc's non-blocking collectives move a message
 * only inside MPI calls of both sides, so a non-blocking gradient piece started before a layer's
 * backward used to sit untouched until the next call between layers (docs/DESIGN.md, "Progress
 * of non-blocking operations"). With a progress thread, the process asks for
 * MPI_THREAD_MULTIPLE and a thread probes a private duplicate of the world (MPI_Iprobe drives the
 * whole progress engine, every communicator's requests included; nothing is ever sent on that
 * duplicate) every PROGRESS_NAP_S while any non-blocking operation of the process is pending and
 * the main thread is not itself inside a wait (which drives MPI and, after a second, naps: the
 * watchdog's back-off). Otherwise it sleeps on a condition variable and costs nothing. It never
 * waits on a request, so every wait stays the watchdog's. */
#define PROGRESS_NAP_S 50e-6
#define PROGRESS_NAP_MAX_S 2e-3

struct mpi_progress {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_int pending; /* non-blocking operations started and not yet completed */
    atomic_int waiting; /* the main thread is in a wait, driving MPI itself */
    atomic_bool stop;
    atomic_bool fresh;  /* an operation started since the last probe: nap from nap_s again */
    MPI_Comm probe;     /* the duplicate of the world that the thread probes */
    double nap_s;
};

static void *progress_main(void *arg) {
    struct mpi_progress *p = arg;
    double nap_s = p->nap_s;
    pthread_mutex_lock(&p->mu);
    while (!atomic_load(&p->stop)) {
        if (atomic_load(&p->pending) == 0 || atomic_load(&p->waiting)) {
            pthread_cond_wait(&p->cv, &p->mu);
            continue;
        }
        pthread_mutex_unlock(&p->mu);
        int flag = 0;
        L3D_MPI_CHECK(MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, p->probe, &flag, MPI_STATUS_IGNORE));
        /* a new operation needs its rounds soon; one pending for long is mostly done at the MPI
         * level already (it counts until the main thread tests it): the naps double up to
         * PROGRESS_NAP_MAX_S, so the thread wakes less and leaves the core to the compute */
        nap_s = atomic_exchange(&p->fresh, false) ? p->nap_s : fmin(2 * nap_s, PROGRESS_NAP_MAX_S);
        l3d_mpi_nap(nap_s);
        pthread_mutex_lock(&p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* A non-blocking operation has started: wakes the thread when it is the only one pending. */
static void progress_started(struct mpi_comm *m) {
    struct mpi_progress *p = m->prog;
    if (!p) return;
    atomic_store(&p->fresh, true);
    if (atomic_fetch_add(&p->pending, 1) != 0) return;
    pthread_mutex_lock(&p->mu);
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

/* The main thread leaves a wait: the thread polls again if anything is pending. */
static void progress_resume(struct mpi_comm *m) {
    struct mpi_progress *p = m->prog;
    if (!p) return;
    atomic_store(&p->waiting, 0);
    pthread_mutex_lock(&p->mu);
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

static void progress_ended(struct mpi_comm *m) {
    if (m->prog) atomic_fetch_sub(&m->prog->pending, 1);
}

static struct mpi_progress *progress_init(void) {
    struct mpi_progress *p = l3d_calloc(sizeof *p, "progress thread");
    L3D_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &p->probe));
    L3D_MPI_CHECK(MPI_Comm_set_errhandler(p->probe, MPI_ERRORS_RETURN));
    atomic_init(&p->pending, 0);
    atomic_init(&p->waiting, 0);
    atomic_init(&p->stop, false);
    atomic_init(&p->fresh, false);
    p->nap_s = PROGRESS_NAP_S;
    const char *us = getenv("L3D_PROGRESS_NAP_US"); /* bench/scaling.sh tries other naps */
    if (us && atof(us) > 0) p->nap_s = atof(us) * 1e-6;
    if (pthread_mutex_init(&p->mu, NULL) != 0 || pthread_cond_init(&p->cv, NULL) != 0 ||
        pthread_create(&p->thread, NULL, progress_main, p) != 0)
        l3d_fatal(__FILE__, __LINE__, "cannot start the MPI progress thread");
    return p;
}

static void progress_free(struct mpi_progress *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, true);
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->thread, NULL);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    L3D_MPI_CHECK(MPI_Comm_free(&p->probe));
    l3d_free(p);
}

/* Records a started MPI request in req, which must not hold one still pending. The request is
 * copied in and out of req->opaque with memcpy (no aliasing of the uint64_t storage). */
static void req_store(struct mpi_comm *m, l3d_req *req, MPI_Request r, void *scratch, int peer,
                      const char *op) {
    L3D_ASSERT(!req->active);
    progress_started(m);
    struct mpi_req q = {.r = r, .scratch = scratch, .peer = peer, .op = op};
    memset(req->opaque, 0, sizeof req->opaque);
    memcpy(req->opaque, &q, sizeof q);
    req->active = true;
}

static struct mpi_req req_load(const l3d_req *req) {
    struct mpi_req q;
    memcpy(&q, req->opaque, sizeof q);
    return q;
}

static void req_done(struct mpi_comm *m, l3d_req *req, struct mpi_req *q) {
    progress_ended(m);
    if (q->scratch && q->scratch == m->a2a_counts) /* the communicator's own: kept */
        m->a2a_busy = false;
    else
        l3d_free(q->scratch);
    memset(req->opaque, 0, sizeof req->opaque);
    req->active = false;
}

/* A non-blocking count: one MPI call, so it must fit an int. */
static int nb_count(int64_t n) {
    L3D_ASSERT(n >= 0 && n <= INT_MAX);
    return (int)n;
}

static char *at(const void *buf, int64_t elems, size_t esize) {
    return (char *)buf + (size_t)elems * esize;
}

/* Where MPI may read and write a buffer of n elements: device memory of the communicator's
 * backend through the backend's host view, after the backend finished the kernels that
 * produce it (MPI reaches device memory as a GPU-aware MPI does); host memory as it is. */
static void *hv(struct l3d_comm *c, const void *buf, int64_t n, enum l3d_dtype t) {
    if (!c->be || !buf) return (void *)buf;
    l3d_be_sync(c->be);
    void *h = l3d_be_host_view(c->be, buf, (size_t)n * l3d_dtype_size(t));
    if (!h)
        l3d_fatal(__FILE__, __LINE__, "rank %d: MPI cannot reach the device memory of backend "
                  "%s: use a GPU-aware MPI or the NCCL communicator", c->world_rank,
                  l3d_backend_name(c->be));
    return h;
}

/* ---- waits ----------------------------------------------------------------------------------- */

/* Completes r (a request of communicator m: peer >= 0 for a send or receive, -1 for a collective)
 * under the watchdog (watchdog.c). While this thread waits it drives MPI itself, so the progress
 * thread rests until the wait is over. */
static void watch_wait(struct mpi_comm *m, MPI_Request *r, int peer, const char *op) {
    int flag = 0;
    L3D_MPI_CHECK(MPI_Test(r, &flag, MPI_STATUS_IGNORE));
    if (flag) return;
    if (m->prog) atomic_store(&m->prog->waiting, 1); /* this thread drives MPI now */
    l3d_mpi_watch_wait(m, r, peer, op);
    progress_resume(m);
}

/* ---- split / free ---------------------------------------------------------------------------- */

static l3d_status mpi_split(struct l3d_comm *c, int color, int key, struct l3d_comm **out) {
    struct mpi_comm *m = mc(c);
    MPI_Comm nc;
    L3D_MPI_CHECK(MPI_Comm_split(m->comm, color < 0 ? MPI_UNDEFINED : color, key, &nc));
    if (nc == MPI_COMM_NULL) {
        *out = NULL;
        return L3D_OK;
    }
    struct mpi_comm *n = comm_new(nc, c->world_rank, m->max_count, m->types, false);
    n->watch = m->watch;
    n->prog = m->prog;
    n->base.watch = c->watch;
    n->base.be = c->be;
    *out = &n->base;
    return L3D_OK;
}

static void mpi_free(struct l3d_comm *c) {
    struct mpi_comm *m = mc(c);
    if (m->is_world) return; /* l3d_comm_mpi_finalize releases the world */
    L3D_MPI_CHECK(MPI_Comm_free(&m->comm));
    l3d_free(m->a2a_counts);
    l3d_free(m);
}

/* ---- collectives ----------------------------------------------------------------------------- */

/* A collective just started as r: non-blocking (req), handed to the caller with scratch, freed at
 * completion; blocking, waited for here under the watchdog and scratch freed. */
static void coll_finish(struct mpi_comm *m, l3d_req *req, MPI_Request r, void *scratch,
                        const char *what) {
    if (req) {
        req_store(m, req, r, scratch, -1, what);
        return;
    }
    watch_wait(m, &r, -1, what);
    l3d_free(scratch);
}

static void mpi_all_reduce(struct l3d_comm *c, void *buf, int64_t n, enum l3d_dtype t,
                           enum l3d_redop op, l3d_req *req) {
    struct mpi_comm *m = mc(c);
    buf = hv(c, buf, n, t);
    MPI_Datatype dt = mpi_type(m, t);
    MPI_Op mo = mpi_op(m, t, op);
    if (req) {
        MPI_Request r;
        L3D_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buf, nb_count(n), dt, mo, m->comm, &r));
        coll_finish(m, req, r, NULL, "all-reduce");
        return;
    }
    size_t es = l3d_dtype_size(t);
    for (int64_t o = 0; o < n; o += m->max_count) {
        int k = (int)(n - o < m->max_count ? n - o : m->max_count);
        MPI_Request q;
        L3D_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, at(buf, o, es), k, dt, mo, m->comm, &q));
        watch_wait(m, &q, -1, "all-reduce");
    }
}

/* Every blocking operation is its non-blocking form and a watch_wait. (This also keeps clear of
 * MPICH 4.0 to 4.1.x's crash in a blocking in-place MPI_Reduce at a root other than 0,
 * pmodels/mpich#6540, #6893, which its MPI_Ireduce does not have.) */

/* Blocking reduce of n elements from send on every rank into recv on root, in chunks. At the root
 * send == recv means in place (in_place must then be true on every rank); elsewhere recv is not
 * used. */
static void reduce_chunked(struct mpi_comm *m, const void *send, void *recv, int64_t n,
                           enum l3d_dtype t, enum l3d_redop op, int root, bool in_place) {
    size_t es = l3d_dtype_size(t);
    MPI_Datatype dt = mpi_type(m, t);
    MPI_Op mo = mpi_op(m, t, op);
    bool at_root = m->base.rank == root;
    for (int64_t o = 0; o < n; o += m->max_count) {
        int k = (int)(n - o < m->max_count ? n - o : m->max_count);
        const void *s = at_root && in_place ? MPI_IN_PLACE : at(send, o, es);
        void *r = at_root ? at(recv, o, es) : NULL;
        MPI_Request q;
        L3D_MPI_CHECK(MPI_Ireduce(s, r, k, dt, mo, root, m->comm, &q));
        watch_wait(m, &q, -1, "reduce");
    }
}

static void mpi_reduce(struct l3d_comm *c, void *buf, int64_t n, enum l3d_dtype t,
                       enum l3d_redop op, int root, l3d_req *req) {
    struct mpi_comm *m = mc(c);
    L3D_ASSERT(root >= 0 && root < c->size);
    buf = hv(c, buf, n, t);
    if (req) {
        bool at_root = c->rank == root;
        MPI_Request r;
        L3D_MPI_CHECK(MPI_Ireduce(at_root ? MPI_IN_PLACE : buf, at_root ? buf : NULL, nb_count(n),
                                  mpi_type(m, t), mpi_op(m, t, op), root, m->comm, &r));
        coll_finish(m, req, r, NULL, "reduce");
        return;
    }
    reduce_chunked(m, buf, buf, n, t, op, root, true);
}

/* Blocking broadcast of n elements at buf from root, in chunks. */
static void bcast_chunked(struct mpi_comm *m, void *buf, int64_t n, enum l3d_dtype t, int root) {
    size_t es = l3d_dtype_size(t);
    for (int64_t o = 0; o < n; o += m->max_count) {
        int k = (int)(n - o < m->max_count ? n - o : m->max_count);
        MPI_Request q;
        L3D_MPI_CHECK(MPI_Ibcast(at(buf, o, es), k, mpi_type(m, t), root, m->comm, &q));
        watch_wait(m, &q, -1, "broadcast");
    }
}

static void mpi_reduce_scatter(struct l3d_comm *c, const void *send, void *recv, int64_t n,
                               enum l3d_dtype t, enum l3d_redop op, l3d_req *req) {
    struct mpi_comm *m = mc(c);
    send = hv(c, send, n * c->size, t);
    recv = hv(c, recv, n, t);
    MPI_Datatype dt = mpi_type(m, t);
    MPI_Op mo = mpi_op(m, t, op);
    if (req || n * c->size <= m->max_count) { /* non-blocking, or small: one operation */
        MPI_Request r;
        L3D_MPI_CHECK(MPI_Ireduce_scatter_block(send, recv, nb_count(n), dt, mo, m->comm, &r));
        coll_finish(m, req, r, NULL, "reduce-scatter");
        return;
    }
    /* Large: rank r's block is reduced to r, one chunked reduce per rank (no staging copy). */
    size_t es = l3d_dtype_size(t);
    for (int r = 0; r < c->size; r++)
        reduce_chunked(m, at(send, (int64_t)r * n, es), recv, n, t, op, r, false);
}

static void mpi_all_gather(struct l3d_comm *c, void *recv, int64_t n, enum l3d_dtype t,
                           l3d_req *req) {
    struct mpi_comm *m = mc(c);
    recv = hv(c, recv, n * c->size, t);
    if (req || n * c->size <= m->max_count) { /* non-blocking, or small: one operation */
        MPI_Request r;
        L3D_MPI_CHECK(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, nb_count(n),
                                     mpi_type(m, t), m->comm, &r));
        coll_finish(m, req, r, NULL, "all-gather");
        return;
    }
    /* Large: every rank broadcasts its block, in chunks. */
    size_t es = l3d_dtype_size(t);
    for (int r = 0; r < c->size; r++) bcast_chunked(m, at(recv, (int64_t)r * n, es), n, t, r);
}

/* The extent of a v-collective's blocks: the end of the farthest non-empty one. */
static int64_t blocks_extent(int p, const int64_t *counts, const int64_t *displs) {
    int64_t extent = 0;
    for (int r = 0; r < p; r++) {
        L3D_ASSERT(counts[r] >= 0 && displs[r] >= 0);
        if (counts[r] > 0 && displs[r] + counts[r] > extent) extent = displs[r] + counts[r];
    }
    return extent;
}

static bool blocks_fit(int p, const int64_t *counts, const int64_t *displs, int64_t limit) {
    for (int r = 0; r < p; r++)
        if (counts[r] > limit || displs[r] > limit) return false;
    return true;
}

/* A blocking all-to-all: in round k this rank sends to rank + k and receives from rank - k,
 * chunk by chunk (the pairs' chunks match in order, as mpi_p2p's do), each wait under the
 * watchdog; its own block is a copy. Every rank takes this path whatever its counts (whether
 * they fit one MPI call differs between ranks, and a collective must be joined by all). */
static void alltoall_pairwise(struct mpi_comm *m, const char *send, const int64_t *sc,
                              const int64_t *sd, char *recv, const int64_t *rc,
                              const int64_t *rd, enum l3d_dtype t) {
    int p = m->base.size, me = m->base.rank;
    size_t es = l3d_dtype_size(t);
    MPI_Datatype type = mpi_type(m, t);
    memcpy(at(recv, rd[me], es), at(send, sd[me], es), (size_t)rc[me] * es);
    for (int k = 1; k < p; k++) {
        int to = (me + k) % p, from = (me - k + p) % p;
        int64_t most = sc[to] > rc[from] ? sc[to] : rc[from];
        for (int64_t o = 0; o < most; o += m->max_count) {
            MPI_Request q[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
            int64_t ks = sc[to] - o < m->max_count ? sc[to] - o : m->max_count;
            int64_t kr = rc[from] - o < m->max_count ? rc[from] - o : m->max_count;
            if (kr > 0)
                L3D_MPI_CHECK(MPI_Irecv(at(recv, rd[from] + o, es), (int)kr, type, from,
                                        L3D_TAG_ALL_TO_ALL, m->comm, &q[0]));
            if (ks > 0)
                L3D_MPI_CHECK(MPI_Isend(at(send, sd[to] + o, es), (int)ks, type, to,
                                        L3D_TAG_ALL_TO_ALL, m->comm, &q[1]));
            if (kr > 0) watch_wait(m, &q[0], from, "all-to-all receive from");
            if (ks > 0) watch_wait(m, &q[1], to, "all-to-all send to");
        }
    }
}

static void mpi_all_to_allv(struct l3d_comm *c, const void *send, const int64_t *scounts,
                            const int64_t *sdispls, void *recv, const int64_t *rcounts,
                            const int64_t *rdispls, enum l3d_dtype t, l3d_req *req) {
    struct mpi_comm *m = mc(c);
    int p = c->size;
    send = hv(c, send, blocks_extent(p, scounts, sdispls), t);
    recv = hv(c, recv, blocks_extent(p, rcounts, rdispls), t);
    if (!req) { /* one rank's pieces may fit one MPI call while another's do not: by pairs */
        alltoall_pairwise(m, send, scounts, sdispls, recv, rcounts, rdispls, t);
        return;
    }
    /* non-blocking: one MPI call, its counts and displacements must fit an int */
    L3D_ASSERT(blocks_fit(p, scounts, sdispls, INT_MAX) &&
               blocks_fit(p, rcounts, rdispls, INT_MAX));
    /* the communicator's arrays: no allocation per call (req_done frees them for the next) */
    int *ic = m->a2a_busy ? l3d_alloc(4 * (size_t)p * sizeof *ic, "all_to_allv counts")
                          : m->a2a_counts;
    m->a2a_busy = true;
    for (int r = 0; r < p; r++) {
        ic[r] = (int)scounts[r];
        ic[p + r] = (int)sdispls[r];
        ic[2 * p + r] = (int)rcounts[r];
        ic[3 * p + r] = (int)rdispls[r];
    }
    MPI_Datatype dt = mpi_type(m, t);
    MPI_Request r;
    L3D_MPI_CHECK(MPI_Ialltoallv(send, ic, ic + p, dt, recv, ic + 2 * p, ic + 3 * p, dt, m->comm,
                                 &r));
    coll_finish(m, req, r, ic, "all-to-all"); /* MPI reads the arrays until completion */
}

static void mpi_all_gatherv(struct l3d_comm *c, void *recv, const int64_t *counts,
                            const int64_t *displs, enum l3d_dtype t, l3d_req *req) {
    struct mpi_comm *m = mc(c);
    int p = c->size;
    bool fits = blocks_fit(p, counts, displs, req ? INT_MAX : m->max_count);
    recv = hv(c, recv, blocks_extent(p, counts, displs), t);
    if (!fits) {
        L3D_ASSERT(!req); /* non-blocking: counts and displacements must fit an int */
        size_t es = l3d_dtype_size(t);
        for (int r = 0; r < p; r++) bcast_chunked(m, at(recv, displs[r], es), counts[r], t, r);
        return;
    }
    int *ic = l3d_alloc(2 * (size_t)p * sizeof *ic, "all_gatherv counts");
    int *id = ic + p;
    for (int r = 0; r < p; r++) {
        ic[r] = (int)counts[r];
        id[r] = (int)displs[r];
    }
    MPI_Request r;
    L3D_MPI_CHECK(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, ic, id,
                                  mpi_type(m, t), m->comm, &r));
    coll_finish(m, req, r, ic, "all-gather"); /* MPI reads ic and id until completion */
}

static void mpi_broadcast(struct l3d_comm *c, void *buf, int64_t n, enum l3d_dtype t, int root,
                          l3d_req *req) {
    struct mpi_comm *m = mc(c);
    L3D_ASSERT(root >= 0 && root < c->size);
    buf = hv(c, buf, n, t);
    if (req) {
        MPI_Request r;
        L3D_MPI_CHECK(MPI_Ibcast(buf, nb_count(n), mpi_type(m, t), root, m->comm, &r));
        coll_finish(m, req, r, NULL, "broadcast");
        return;
    }
    bcast_chunked(m, buf, n, t, root);
}

/* ---- point to point -------------------------------------------------------------------------- */

/* A blocking send or receive of more than max_count elements is a run of messages with the same
 * tag; MPI keeps their order between one pair of ranks, so they match chunk by chunk. A blocking
 * send may meet a non-blocking receive (and the reverse), so the non-blocking forms take at most
 * max_count elements, one message: both sides then always cut a transfer the same way. */
static int p2p_nb_count(const struct mpi_comm *m, int64_t n) {
    L3D_ASSERT(n >= 0 && n <= m->max_count);
    return (int)n;
}

/* A send (send true) or a receive of n elements: non-blocking into *req, or blocking in pieces of
 * at most max_count elements, each wait bounded by the watchdog. MPI_Isend reads its buffer only;
 * it is the caller's const one. */
static void mpi_p2p(struct l3d_comm *c, void *buf, int64_t n, enum l3d_dtype t, int peer, int tag,
                    l3d_req *req, bool send) {
    struct mpi_comm *m = mc(c);
    L3D_ASSERT(peer >= 0 && peer < c->size);
    buf = hv(c, buf, n, t);
    const char *what = send ? "send to" : "receive from";
    MPI_Datatype type = mpi_type(m, t);
    if (req) {
        MPI_Request r;
        int k = p2p_nb_count(m, n);
        L3D_MPI_CHECK(send ? MPI_Isend(buf, k, type, peer, tag, m->comm, &r)
                           : MPI_Irecv(buf, k, type, peer, tag, m->comm, &r));
        req_store(m, req, r, NULL, peer, what);
        return;
    }
    size_t es = l3d_dtype_size(t);
    int64_t o = 0;
    do { /* one message even when n is 0, to match the other side's */
        int k = (int)(n - o < m->max_count ? n - o : m->max_count);
        MPI_Request q;
        void *p = at(buf, o, es);
        L3D_MPI_CHECK(send ? MPI_Isend(p, k, type, peer, tag, m->comm, &q)
                           : MPI_Irecv(p, k, type, peer, tag, m->comm, &q));
        watch_wait(m, &q, peer, what);
        o += k;
    } while (o < n);
}

static void mpi_send(struct l3d_comm *c, const void *buf, int64_t n, enum l3d_dtype t, int peer,
                     int tag, l3d_req *req) {
    mpi_p2p(c, (void *)buf, n, t, peer, tag, req, true);
}

static void mpi_recv(struct l3d_comm *c, void *buf, int64_t n, enum l3d_dtype t, int peer,
                     int tag, l3d_req *req) {
    mpi_p2p(c, buf, n, t, peer, tag, req, false);
}

/* ---- completion ------------------------------------------------------------------------------ */

static void mpi_wait(struct l3d_comm *c, l3d_req *req) {
    struct mpi_comm *m = mc(c);
    if (!req->active) return;
    struct mpi_req q = req_load(req);
    watch_wait(m, &q.r, q.peer, q.op);
    req_done(m, req, &q);
}

static bool mpi_test(struct l3d_comm *c, l3d_req *req) {
    struct mpi_comm *m = mc(c);
    if (!req->active) return true;
    int flag = 0;
    struct mpi_req q = req_load(req);
    L3D_MPI_CHECK(MPI_Test(&q.r, &flag, MPI_STATUS_IGNORE));
    if (flag)
        req_done(m, req, &q);
    else /* MPI may update a request it has not completed */
        memcpy(req->opaque, &q, sizeof q);
    return flag != 0;
}

static void mpi_barrier(struct l3d_comm *c) {
    struct mpi_comm *m = mc(c);
    MPI_Request q;
    L3D_MPI_CHECK(MPI_Ibarrier(m->comm, &q));
    watch_wait(m, &q, -1, "barrier");
}

static _Noreturn void mpi_abort(struct l3d_comm *c, int code) {
    (void)c;
    fflush(stdout);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
    exit(code);
}

static int mpi_node(struct l3d_comm *c) {
    struct mpi_comm *m = mc(c);
    MPI_Comm shm;
    int lead = c->rank;
    L3D_MPI_CHECK(MPI_Comm_split_type(m->comm, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &shm));
    L3D_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &lead, 1, MPI_INT, MPI_MIN, shm));
    L3D_MPI_CHECK(MPI_Comm_free(&shm));
    return lead;
}

static const struct l3d_comm_i mpi_comm_i = {
    .name = "mpi",
    .split = mpi_split,
    .free = mpi_free,
    .all_reduce = mpi_all_reduce,
    .reduce = mpi_reduce,
    .reduce_scatter = mpi_reduce_scatter,
    .all_gather = mpi_all_gather,
    .all_gatherv = mpi_all_gatherv,
    .all_to_allv = mpi_all_to_allv,
    .broadcast = mpi_broadcast,
    .send = mpi_send,
    .recv = mpi_recv,
    .wait = mpi_wait,
    .test = mpi_test,
    .barrier = mpi_barrier,
    .abort = mpi_abort,
    .node = mpi_node,
};

void l3d_comm_mpi_set_max_count(struct l3d_comm *c, int64_t max_count) {
    L3D_ASSERT(max_count >= 1 && max_count <= INT_MAX);
    mc(c)->max_count = max_count;
}

/* ---- library and launcher -------------------------------------------------------------------- */

const char *l3d_comm_mpi_library(void) {
    /* Written once, on the first call; the text is the same for every caller. */
    static char lib[MPI_MAX_LIBRARY_VERSION_STRING];
    if (!lib[0]) {
        char full[MPI_MAX_LIBRARY_VERSION_STRING];
        int len = 0;
        if (MPI_Get_library_version(full, &len) != MPI_SUCCESS) return "unknown MPI";
        full[len < (int)sizeof full ? len : (int)sizeof full - 1] = '\0';
        /* first line, runs of blanks folded to one space ("MPICH Version:\t4.0.2") */
        size_t w = 0;
        for (size_t r = 0; full[r] && full[r] != '\n' && w + 1 < sizeof lib; r++) {
            bool blank = full[r] == ' ' || full[r] == '\t';
            if (blank && (w == 0 || lib[w - 1] == ' ')) continue;
            lib[w++] = blank ? ' ' : full[r];
        }
        while (w > 0 && lib[w - 1] == ' ') w--;
        lib[w] = '\0';
        static const char mpich[] = "MPICH Version: "; /* -> "MPICH 4.0.2" */
        if (strncmp(lib, mpich, sizeof mpich - 1) == 0)
            memmove(lib + 6, lib + sizeof mpich - 1, strlen(lib + sizeof mpich - 1) + 1);
    }
    return lib;
}

#if defined(L3D_MPIEXEC)
#define MPIEXEC_HINT L3D_MPIEXEC
#elif defined(OPEN_MPI)
#define MPIEXEC_HINT "Open MPI's mpiexec; on Debian mpiexec.openmpi"
#elif defined(MPICH)
#define MPIEXEC_HINT "MPICH's mpiexec; on Debian mpiexec.mpich"
#else
#define MPIEXEC_HINT "the mpiexec installed with it"
#endif

/* Variables that launchers set in each process, with the number of ranks of the job, checked in
 * this order (verified on Debian 12: Open MPI 4.1 mpirun sets OMPI_COMM_WORLD_SIZE and no
 * PMIX_SIZE; MPICH 4 Hydra sets PMI_SIZE; Slurm's srun sets SLURM_STEP_NUM_TASKS, which sbatch
 * does not, so a singleton in a batch script with -n 4 is not mistaken for a 4-rank launch). */
static const struct {
    const char *var, *fix;
} launchers[] = {
    {"OMPI_COMM_WORLD_SIZE", "rebuild with -DL3D_MPI=openmpi to use Open MPI's launcher"},
    {"PMI_SIZE", "rebuild with -DL3D_MPI=mpich to use MPICH's launcher (Hydra)"},
    {"SLURM_STEP_NUM_TASKS",
     "give srun the --mpi plugin this MPI speaks (srun --mpi=list; pmix for Open MPI, pmi2 for "
     "MPICH)"},
};

l3d_status l3d_comm_mpi_check_launcher(int mpi_size) {
    if (mpi_size != 1) return L3D_OK;
    for (size_t k = 0; k < sizeof launchers / sizeof launchers[0]; k++) {
        const char *v = getenv(launchers[k].var);
        if (!v) continue;
        char *end;
        long n = strtol(v, &end, 10);
        if (end == v || n <= 1) continue;
        const char *lib = l3d_comm_mpi_library();
        int lib_len = (int)strcspn(lib, ","); /* "Open MPI v4.1.4, package: ..." */
        return l3d_error(L3D_ERR_LAYOUT,
                         "this llm3d was built with %.*s but was started by a launcher that "
                         "announces %ld ranks (%s=%s) while MPI sees 1: launch it with the mpiexec "
                         "of the same MPI (%s), or %s",
                         lib_len, lib, n, launchers[k].var, v, MPIEXEC_HINT, launchers[k].fix);
    }
    return L3D_OK;
}

/* ---- init / finalize ------------------------------------------------------------------------- */

/* A rank that exits while MPI is still initialised (an exit() on an error path, or main returning
 * before l3d_comm_mpi_finalize) takes the job down with it. Without this, MPICH's Hydra reports
 * the exit status of the first process to end: a rank calling exit(0) early kills its blocked
 * peers and the job "succeeds" with status 0. Open MPI's mpirun fails such a job by itself. */
static void exit_guard_status(int status) {
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (!inited || finalized) return;
    int rank = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (status == 0)
        fprintf(stderr, "llm3d: rank %d: exiting without l3d_comm_mpi_finalize: aborting the job\n",
                rank);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, status ? status : 1);
}
#if defined(__GLIBC__)
static void exit_guard(int status, void *arg) {
    (void)arg;
    exit_guard_status(status);
}
#define INSTALL_EXIT_GUARD() on_exit(exit_guard, NULL)
#else
static void exit_guard(void) { exit_guard_status(1); }
#define INSTALL_EXIT_GUARD() atexit(exit_guard)
#endif

l3d_status l3d_comm_mpi_init(int *argc, char ***argv, struct l3d_comm **world) {
    return l3d_comm_mpi_init_progress(argc, argv, false, world);
}

l3d_status l3d_comm_mpi_init_progress(int *argc, char ***argv, bool thread,
                                      struct l3d_comm **world) {
    *world = NULL;
    int inited = 0, provided = 0;
    MPI_Initialized(&inited);
    L3D_ASSERT(!inited); /* one l3d_comm_mpi_init per process */
#if defined(__GLIBC__)
    /* Keep freed memory in the heap instead of returning it to the kernel: Open MPI allocates
     * fresh temporaries for every large or non-blocking collective, and with glibc's defaults
     * each one is a new mmap whose pages fault in again (measured on 2 ranks: a 64 MiB
     * all-reduce 211 ms -> 19 ms, 16 non-blocking 4 MiB pieces 349 ms -> 25 ms). */
    mallopt(M_MMAP_THRESHOLD, 1 << 30);
    mallopt(M_TRIM_THRESHOLD, INT_MAX);
    mallopt(M_TOP_PAD, 64 << 20);
#endif
#if defined(OPEN_MPI)
    /* Started without a launcher (a singleton): Open MPI then forks a supporting daemon (orted)
     * unless told the process is isolated. llm3d never spawns processes; the daemon is a known
     * place for singleton start-up to hang (open-mpi/ompi#3818) and costs ~0.1 s per run
     * (measured: a one-step tiny run 0.49 -> 0.38 s). A setting of the user's own wins. */
    if (!getenv("OMPI_COMM_WORLD_SIZE") && !getenv("PMIX_RANK"))
        setenv("OMPI_MCA_ess_singleton_isolated", "1", 0);
    /* Non-blocking reduce (ZeRO's gradient pieces): libnbc's default for 2-4 ranks and 64 KiB or
     * more is a chain of 8 KiB segments, one schedule round each, and a round moves only when
     * both ranks are inside MPI: a 4 MiB piece needed 512 rounds and was still pending after
     * 1.5 s of progress-thread polling on 4 loaded ranks (tests/mpi/test_progress.c). The
     * binomial tree takes log2(ranks) rounds of whole messages. A user's own setting wins. */
    setenv("OMPI_MCA_coll_libnbc_ireduce_algorithm", "binomial", 0);
#endif
    int want = thread ? MPI_THREAD_MULTIPLE : MPI_THREAD_FUNNELED;
    int rc = MPI_Init_thread(argc, argv, want, &provided);
    if (rc != MPI_SUCCESS)
        return l3d_error(L3D_ERR_INTERNAL, "MPI_Init_thread failed (error %d) with %s", rc,
                         l3d_comm_mpi_library());
    if (provided < want) { /* the same on every rank: one library */
        MPI_Finalize();
        return l3d_error(L3D_ERR_ARG, "%s provides no MPI_THREAD_MULTIPLE, which the progress "
                         "thread needs: use --progress poll or none", l3d_comm_mpi_library());
    }
    /* From here on, any MPI error or L3D_ASSERT on any rank aborts every rank. */
    L3D_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    int rank, size;
    L3D_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    L3D_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
    l3d_set_log_rank(rank);
    l3d_set_abort_hook(mpi_abort_hook, NULL);
    INSTALL_EXIT_GUARD(); /* once per process: init runs once */
    l3d_status st = l3d_comm_mpi_check_launcher(size);
    if (st != L3D_OK) { /* N independent singletons: end MPI cleanly, the caller reports */
        l3d_set_abort_hook(NULL, NULL);
        l3d_set_log_rank(-1);
        MPI_Finalize();
        return st;
    }
    struct mpi_comm *w = comm_new(MPI_COMM_WORLD, rank, INT_MAX / 2, types_init(), true);
    w->watch = l3d_mpi_watch_init(size);
    w->base.role = "world";
    w->base.watch = l3d_mpi_watch_pub(w->watch);
    if (thread) w->prog = progress_init();
    *world = &w->base;
    return L3D_OK;
}

void l3d_comm_mpi_finalize(struct l3d_comm *world) {
    if (!world) return;
    struct mpi_comm *m = mc(world);
    L3D_ASSERT(m->is_world);
    progress_free(m->prog);
    types_free(m->types);
    l3d_mpi_watch_free(m->watch);
    l3d_free(m->a2a_counts);
    l3d_free(m);
    /* After MPI_Finalize no MPI call (MPI_Abort included) is allowed: back to the default hook,
     * and MPI_Finalize's own status is not checked (there is nothing left to abort). */
    l3d_set_abort_hook(NULL, NULL);
    MPI_Finalize();
}
