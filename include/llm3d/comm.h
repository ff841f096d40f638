/*
 * llm3d communicators: the collectives and point-to-point operations every parallel layer uses,
 * behind one table of function pointers. The MPI implementation (src/comm/mpi.c, with its
 * mpi-impl.h and watchdog.c) is the only code that includes mpi.h; the NCCL one (src/comm/nccl.c,
 * built with the CUDA backend; experimental, never yet run on a GPU) fills the same table over the
 * MPI world, which carries its host buffers and its start-up.
 *
 *   struct l3d_comm *world;
 *   if (l3d_comm_mpi_init(&argc, &argv, &world) != L3D_OK) ...;   // also installs the abort hook
 *   struct l3d_comm *dp;
 *   l3d_comm_split(world, color, key, &dp);                        // a sub-group
 *   l3d_comm_all_reduce(dp, grads, n, L3D_F32, L3D_SUM, NULL);      // blocking
 *   l3d_req r;
 *   l3d_comm_all_reduce(dp, bucket, m, L3D_F32, L3D_SUM, &r);       // non-blocking ...
 *   l3d_comm_wait(dp, &r);                                          // ... completed here
 *   l3d_comm_free(dp);
 *   l3d_comm_mpi_finalize(world);
 *
 * Failure policy: an operation either succeeds or brings every rank down. Any error an MPI call
 * returns is reported as "rank R: <call> failed: <MPI's message>" and the job is aborted
 * (MPI_Abort on the world), so a failed or dead peer never leaves the others hanging.
 *
 * Buffers: counts are elements of the given type. In-place forms: all_reduce and broadcast work
 * in place; reduce works in place at the root (other ranks' buf is only read); reduce_scatter
 * reads send (size * n elements, rank r's block at r * n) and writes recv (n elements; recv must
 * not overlap send); all_gather reads this rank's n elements at recv + rank * n and fills the
 * other blocks (in place); all_gatherv likewise with this rank's block at recv + displs[rank],
 * leaving the elements outside every block untouched.
 *
 * Blocking and non-blocking: req == NULL blocks until the operation is complete. With a req (which
 * must be inactive: zero-initialised, or waited on / tested complete) the call only starts the
 * operation and marks req active; its buffers must not be touched until l3d_comm_wait returns or
 * l3d_comm_test returns true, which both make req inactive again. Waiting on, or testing, an
 * inactive req does nothing (test returns true). The counts/displs arrays of all_gatherv and
 * all_to_allv may be reused as soon as the call returns. Every rank of the communicator must
 * start the same collectives in the same order and in the same form (all blocking or all
 * non-blocking: MPI does not match a blocking collective with a non-blocking one); a blocking
 * send may meet a non-blocking recv and the reverse.
 *
 * Element types (enum l3d_dtype, core.h): every operation takes every type. fp32, fp64, int32,
 * uint8 and int64 are MPI's own types and reductions. bf16 and fp16 have no portable MPI type:
 * they travel as 2 contiguous bytes, bit for bit (NaN payloads included), and reduce with
 * user-defined commutative operations that compute in fp32 and round to nearest even once per
 * pairwise combine (the correctly rounded sum of the two; MAX is exact, +0 over -0, and a NaN on
 * either side gives the type's quiet NaN). A sum over more than two ranks is a tree of such
 * combines whose shape is the MPI library's: exact whenever the partial sums are representable,
 * otherwise it may differ in the last bit between libraries, rank counts or message sizes (the
 * same holds for fp32 with MPI's own MPI_SUM).
 *
 * Counts: blocking operations take any count (the MPI implementation cuts more than INT_MAX / 2
 * elements into several calls). A non-blocking operation is one MPI call: a collective's count
 * (and, for all_gatherv and all_to_allv, each count and displacement) must be at most INT_MAX,
 * and a send's or recv's at most INT_MAX / 2, the size of one blocking chunk, so that a transfer
 * is cut the same way on both sides. Bucket larger buffers.
 */
#ifndef LLM3D_COMM_H
#define LLM3D_COMM_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "llm3d/core.h"

enum l3d_redop { L3D_SUM, L3D_MAX };

/* Point-to-point message tags: every send and recv of the project names one of these, so that two
 * exchanges can never match each other's messages. MPI guarantees tags up to 32767. */
enum l3d_tag {
    L3D_TAG_TP_GATHER = 1,     /* tensor-parallel ranks' parameters to TP rank 0 (l3d_tp_gather) */
    L3D_TAG_TRACE = 2,         /* a rank's trace events to world rank 0 (--trace) */
    L3D_TAG_CALIBRATE_GO = 3,  /* bench --calibrate: rank 0 tells the others to go on */
    L3D_TAG_CP_KV = 4,         /* context parallelism: keys and values to the next ring rank */
    L3D_TAG_CP_DKV = 5,        /* ... and their gradients' running sums */
    L3D_TAG_ZERO3_GATHER = 6,  /* a piece of a rank's fp32 range to DP rank 0 for a save */
    L3D_TAG_ZERO3_LAYER = 7,   /* a ZeRO-3 rank's part of a layer's parameters to the others */
    L3D_TAG_ALL_TO_ALL = 8,    /* a blocking all_to_allv's pieces, when one exceeds an MPI call */
    L3D_TAG_MODEL_GATHER = 16, /* + chunk (< 256): a (tp, pp) rank's parameters to rank 0 for
                                * model.bin */
    L3D_TAG_PIPE = 1024,       /* + 2b: the activation from virtual stage b to b + 1; + 2b + 1:
                                * its gradient back (b < 4096 stages: at most 9215) */
};

/* A pending non-blocking operation. Opaque storage for the implementation's request handle. */
typedef struct {
    uint64_t opaque[4];
    bool active;
} l3d_req;

struct l3d_comm;

struct l3d_comm_i {
    const char *name;
    /* New communicator of the ranks with the same color, ordered by key (then by rank in c).
     * Collective over c. A negative color joins no group: *out is set to NULL. */
    l3d_status (*split)(struct l3d_comm *c, int color, int key, struct l3d_comm **out);
    /* releases a communicator made by split (a no-op on the world: see l3d_comm_mpi_finalize) */
    void (*free)(struct l3d_comm *c);
    void (*all_reduce)(struct l3d_comm *c, void *buf, int64_t n, enum l3d_dtype t,
                       enum l3d_redop op, l3d_req *req);
    void (*reduce)(struct l3d_comm *c, void *buf, int64_t n, enum l3d_dtype t, enum l3d_redop op,
                   int root, l3d_req *req);
    void (*reduce_scatter)(struct l3d_comm *c, const void *send, void *recv, int64_t n,
                           enum l3d_dtype t, enum l3d_redop op, l3d_req *req);
    void (*all_gather)(struct l3d_comm *c, void *recv, int64_t n, enum l3d_dtype t, l3d_req *req);
    /* all_gather with a block of counts[r] elements at displs[r] for each rank r (in place) */
    void (*all_gatherv)(struct l3d_comm *c, void *recv, const int64_t *counts,
                        const int64_t *displs, enum l3d_dtype t, l3d_req *req);
    void (*broadcast)(struct l3d_comm *c, void *buf, int64_t n, enum l3d_dtype t, int root,
                      l3d_req *req);
    /* Each rank r of c gets scounts[r] elements from send + sdispls[r], and this rank receives
     * rcounts[r] elements from rank r at recv + rdispls[r] (expert parallelism's dispatch and
     * combine). scounts[r] here must equal rcounts[this rank] on rank r; zero counts are allowed;
     * recv must not overlap send. The count arrays may be reused when the call returns. */
    void (*all_to_allv)(struct l3d_comm *c, const void *send, const int64_t *scounts,
                        const int64_t *sdispls, void *recv, const int64_t *rcounts,
                        const int64_t *rdispls, enum l3d_dtype t, l3d_req *req);
    void (*send)(struct l3d_comm *c, const void *buf, int64_t n, enum l3d_dtype t, int peer,
                 int tag, l3d_req *req);
    void (*recv)(struct l3d_comm *c, void *buf, int64_t n, enum l3d_dtype t, int peer, int tag,
                 l3d_req *req);
    void (*wait)(struct l3d_comm *c, l3d_req *req);
    /* true when the operation has completed (then it needs no wait); drives MPI's progress */
    bool (*test)(struct l3d_comm *c, l3d_req *req);
    void (*barrier)(struct l3d_comm *c);
    /* Ends the whole job (every rank) with this exit code; does not return. (C11 does not allow
     * _Noreturn on a pointer member: l3d_comm_abort below is the _Noreturn entry point.) */
    void (*abort)(struct l3d_comm *c, int code);
    /* The rank in c of the lowest rank of c on this rank's node: the ranks that can share memory
     * (MPI_COMM_TYPE_SHARED: for Open MPI and MPICH, the ranks that the launcher started on one
     * host of its host list). Collective over c. NULL: every rank is a node of its own. */
    int (*node)(struct l3d_comm *c);
};

struct l3d_backend;

/* The watchdog: every wait of a communicator (a blocking operation, l3d_comm_wait) is bounded by
 * timeout_s. A waiting rank polls with growing sleeps (no core burnt on a long wait); when the
 * time is up it asks the ranks it waits on whether they are alive (they answer from their own
 * waits), prints one line naming itself, the step, what it was doing and the rank that does not
 * respond, and aborts the job (exit status 75, EX_TEMPFAIL: the last checkpoint is untouched,
 * --resume auto continues). When every rank it waits on answers, they all wait on something else
 * and the rank that waits on the silent one reports; after a second timeout_s the rank reports a
 * deadlock itself; the reporting rank tells every other rank first, and they end quietly. One per
 * process, shared by the world and every communicator split from it:
 *
 *   struct l3d_watch *w = world->watch;
 *   w->timeout_s = 600;                          // 0: unbounded
 *   w->step = step + 1;
 *   struct l3d_doing was = l3d_comm_doing(dp, "DP gradient bucket", 2, -1); // for the next waits
 *   ...
 *   l3d_comm_done(dp, was);
 *
 * The callers set what they do before they communicate; the text is only formatted when a wait
 * expires or lasts long, so a label costs three stores. */
struct l3d_doing {
    const char *what; /* static text naming the action ("forward micro-batch"); NULL: none */
    int index, chunk; /* a micro-batch or bucket number, a model chunk; -1: none */
};

struct l3d_watch {
    double timeout_s; /* bound of one wait in seconds; 0: none */
    int step;         /* the 1-based step under way, 0 outside the steps */
    struct l3d_doing doing;
    /* Writes a rank's name ("rank 3 (tp 1, pp 0, dp 1)") into buf; NULL: "rank R". */
    void (*name)(void *ctx, int world_rank, char *buf, size_t n);
    void *name_ctx;
    /* Filled by the communicator: the longest wait since the caller last set longest_s to 0, and
     * (for a wait of 0.5 s or more) the line that says what it waited on. */
    double longest_s;
    char longest_what[256];
};

/* Says what the next waits of c (and of every communicator of its world) are for; returns what
 * was said before, for l3d_comm_done. */
static inline struct l3d_doing l3d_comm_doing(struct l3d_comm *c, const char *what, int index,
                                              int chunk);
/* Restores what l3d_comm_doing returned (a nested action is over). */
static inline void l3d_comm_done(struct l3d_comm *c, struct l3d_doing before);

struct l3d_comm {
    const struct l3d_comm_i *i;
    void *ctx;
    int rank, size;
    int world_rank; /* this process's rank in the world, for messages */
    /* The backend whose device buffers this communicator is given (NULL: host memory only);
     * communicators split from this one inherit it. Set with l3d_comm_use_backend. */
    struct l3d_backend *be;
    struct l3d_watch *watch; /* the world's (NULL for a communicator without a watchdog) */
    const char *role;        /* "TP", "DP", ... for messages (NULL: none); set by its maker */
};

static inline struct l3d_doing l3d_comm_doing(struct l3d_comm *c, const char *what, int index,
                                              int chunk) {
    struct l3d_doing before = {NULL, -1, -1};
    if (!c || !c->watch) return before;
    before = c->watch->doing;
    c->watch->doing = (struct l3d_doing){what, index, chunk};
    return before;
}
static inline void l3d_comm_done(struct l3d_comm *c, struct l3d_doing before) {
    if (c && c->watch) c->watch->doing = before;
}

/* Buffers given to c (and to communicators split from it afterwards) may be device memory of be:
 * the MPI communicator synchronises be before each operation and hands MPI the backend's host
 * view of the buffer (l3d_be_host_view); host buffers pass unchanged. */
static inline void l3d_comm_use_backend(struct l3d_comm *c, struct l3d_backend *be) { c->be = be; }

/* MPI: initialises MPI (thread level FUNNELED: only the main thread calls MPI) and returns the
 * world; installs an abort hook so that L3D_ASSERT and l3d_fatal on any rank abort the whole job
 * (exit status 134), and sets the rank printed in fatal messages. Once per process.
 * Returns L3D_ERR_LAYOUT, with MPI already finalised and *world NULL, when MPI sees one rank but
 * the launcher's environment announces more (a binary built with one MPI started by another MPI's
 * launcher runs N single-rank copies); the message names the variable and both fixes. */
l3d_status l3d_comm_mpi_init(int *argc, char ***argv, struct l3d_comm **world);
/* l3d_comm_mpi_init with, when thread is true, MPI_THREAD_MULTIPLE and a progress thread: while
 * any non-blocking operation of this process is pending and the caller computes, the thread
 * drives MPI's progress engine every 50 us, so that transports which move data only inside MPI
 * calls (Open MPI's shared memory, TCP) complete them behind the computation. L3D_ERR_ARG (MPI
 * finalised, *world NULL) when the library has no MPI_THREAD_MULTIPLE. */
l3d_status l3d_comm_mpi_init_progress(int *argc, char ***argv, bool thread,
                                      struct l3d_comm **world);
/* Frees the world and finalises MPI; every communicator split from it must be freed first. */
void l3d_comm_mpi_finalize(struct l3d_comm *world);
/* Name and version of the MPI library (for logs). */
const char *l3d_comm_mpi_library(void);

/* Every rank learns whether any rank failed (collective over c), before a collective that a failed
 * rank would never join. Returns st on a failing rank, an error naming the lowest failing rank on
 * the others, L3D_OK when none failed; *report is set true on that lowest failing rank only. */
static inline l3d_status l3d_comm_agree(struct l3d_comm *c, l3d_status st, bool *report) {
    int32_t v[2] = {st != L3D_OK ? (int32_t)st : 0, st != L3D_OK ? c->size - c->rank : 0};
    if (c->size > 1) c->i->all_reduce(c, v, 2, L3D_I32, L3D_MAX, NULL);
    if (v[0] == 0) return L3D_OK;
    int first = c->size - v[1];
    *report = first == c->rank;
    if (st == L3D_OK) return l3d_error((l3d_status)v[0], "rank %d failed", first);
    return st;
}

static inline l3d_status l3d_comm_split(struct l3d_comm *c, int color, int key,
                                        struct l3d_comm **out) {
    return c->i->split(c, color, key, out);
}
static inline void l3d_comm_free(struct l3d_comm *c) {
    if (c) c->i->free(c);
}
static inline void l3d_comm_all_reduce(struct l3d_comm *c, void *buf, int64_t n, enum l3d_dtype t,
                                       enum l3d_redop op, l3d_req *req) {
    c->i->all_reduce(c, buf, n, t, op, req);
}
static inline void l3d_comm_reduce(struct l3d_comm *c, void *buf, int64_t n, enum l3d_dtype t,
                                   enum l3d_redop op, int root, l3d_req *req) {
    c->i->reduce(c, buf, n, t, op, root, req);
}
static inline void l3d_comm_reduce_scatter(struct l3d_comm *c, const void *send, void *recv,
                                           int64_t n, enum l3d_dtype t, enum l3d_redop op,
                                           l3d_req *req) {
    c->i->reduce_scatter(c, send, recv, n, t, op, req);
}
static inline void l3d_comm_all_gather(struct l3d_comm *c, void *recv, int64_t n, enum l3d_dtype t,
                                       l3d_req *req) {
    c->i->all_gather(c, recv, n, t, req);
}
static inline void l3d_comm_all_gatherv(struct l3d_comm *c, void *recv, const int64_t *counts,
                                        const int64_t *displs, enum l3d_dtype t, l3d_req *req) {
    c->i->all_gatherv(c, recv, counts, displs, t, req);
}
static inline void l3d_comm_broadcast(struct l3d_comm *c, void *buf, int64_t n, enum l3d_dtype t,
                                      int root, l3d_req *req) {
    c->i->broadcast(c, buf, n, t, root, req);
}
static inline void l3d_comm_all_to_allv(struct l3d_comm *c, const void *send,
                                        const int64_t *scounts, const int64_t *sdispls,
                                        void *recv, const int64_t *rcounts,
                                        const int64_t *rdispls, enum l3d_dtype t, l3d_req *req) {
    c->i->all_to_allv(c, send, scounts, sdispls, recv, rcounts, rdispls, t, req);
}
static inline void l3d_comm_send(struct l3d_comm *c, const void *buf, int64_t n, enum l3d_dtype t,
                                 int peer, int tag, l3d_req *req) {
    c->i->send(c, buf, n, t, peer, tag, req);
}
static inline void l3d_comm_recv(struct l3d_comm *c, void *buf, int64_t n, enum l3d_dtype t,
                                 int peer, int tag, l3d_req *req) {
    c->i->recv(c, buf, n, t, peer, tag, req);
}
/* The node of every rank of c (collective over c): node_of[r] (c->size entries) numbers the nodes
 * 0, 1, ... in the order of their lowest rank; returns the number of nodes. Placement (TP inside
 * a node) and the memory check (the ranks that share a node's memory) both count nodes this way. */
static inline int l3d_comm_nodes(struct l3d_comm *c, int *node_of) {
    int32_t *lead = (int32_t *)malloc((size_t)c->size * sizeof *lead);
    L3D_ASSERT(lead);
    lead[c->rank] = c->i->node ? c->i->node(c) : c->rank;
    if (c->size > 1) c->i->all_gather(c, lead, 1, L3D_I32, NULL);
    int n = 0;
    for (int r = 0; r < c->size; r++) node_of[r] = lead[r] == r ? n++ : node_of[lead[r]];
    free(lead);
    return n;
}
static inline void l3d_comm_wait(struct l3d_comm *c, l3d_req *req) { c->i->wait(c, req); }
static inline bool l3d_comm_test(struct l3d_comm *c, l3d_req *req) { return c->i->test(c, req); }
static inline void l3d_comm_barrier(struct l3d_comm *c) { c->i->barrier(c); }
static inline _Noreturn void l3d_comm_abort(struct l3d_comm *c, int code) {
    c->i->abort(c, code);
    abort(); /* not reached */
}

#endif
