/* ZeRO-3: this rank's parameters and their layer-by-layer all-gather (include/llm3d/dp.h).
 *
 * A layer's parameters are 12 slices of the flat space (one per layer tensor, llm.c's tensor-major
 * order), each cut by the same shard boundaries as the optimizer state; every slice is gathered
 * in place into the layer's buffer, laid out as the model's gradient slots (slot_off), each rank
 * sending its part of the slice to the others (post: point to point, not an all-gatherv). The non-layer tensors (wte, wpe,
 * final LayerNorm) likewise into one buffer (nonlayer_off). Buffers: prefetch + 1 layers (the one
 * in use and those posted ahead) and the non-layer one. */
#include <stdlib.h>
#include <string.h>

#include "parallel/dp-impl.h"

#define FREE_BUF (-2) /* a buffer's layer when it holds nothing */

struct gbuf {
    void *p;
    int layer; /* the layer it holds (-1: the non-layer tensors), FREE_BUF */
    bool busy; /* handed to the model: params_get .. params_done */
    int nrecv, nsend;  /* pending: the other ranks' parts coming, this rank's part going out */
    l3d_req *recv, *send; /* L3D_NUM_TENSORS x (dp - 1) each */
};

struct l3d_dp_zero3 {
    int prefetch, nbuf;
    bool test_perturb; /* L3D_TEST_ZERO3_PERTURB=1: DP rank 0 zeroes a slice of layer 0 (perturb) */
    struct gbuf *buf; /* nbuf = prefetch + 1 layer buffers */
    struct gbuf nl;   /* the non-layer tensors */
};

static void wait_reqs(struct l3d_dp *dp, l3d_req *r, int *n, const char *what, int layer) {
    struct l3d_doing was = l3d_comm_doing(dp->comm, what, layer, -1);
    for (int i = 0; i < *n; i++) l3d_comm_wait(dp->comm, &r[i]);
    l3d_comm_done(dp->comm, was);
    *n = 0;
}

/* Posts the gather of layer `layer` (-1: the non-layer tensors) into b: this rank's part copied
 * from its shard, then, per tensor slice, a receive of each other rank's part and a send of this
 * rank's to each (waited for at once without overlap). Point to point rather than one
 * all-gatherv a slice: a collective completes only when every rank has also taken this rank's
 * part, which on a shared-memory transport needs the other rank inside MPI after it posted (in
 * the forward pass, at its next layer): a rendezvous a layer whatever the prefetch. Here the
 * layer waits for its receives only; the sends complete in the background and are waited for
 * before the buffer is filled again. */
static void post(struct l3d_dp *dp, struct gbuf *b, int layer) {
    struct l3d_gpt *m = dp->m;
    const enum l3d_dtype dt = dp->param_dtype;
    const size_t es = l3d_dtype_size(dt);
    const int d = dp->comm->size, me = dp->comm->rank;
    const int64_t S = dp->shard_size, N = m->num_params;
    int64_t counts[256], displs[256];
    L3D_ASSERT(d <= 256 && !b->busy && b->nrecv == 0);
    double t0 = l3d_time_s();
    wait_reqs(dp, b->send, &b->nsend, "ZeRO-3 parameter send", b->layer); /* before overwriting */
    b->layer = layer;
    for (int t = 0; t < L3D_NUM_TENSORS; t++) {
        const struct l3d_tensor_info *ti = &m->tensors[t];
        if (l3d_gpt_is_layer_tensor(t) != (layer >= 0)) continue;
        int64_t n = layer >= 0 ? ti->rows * ti->cols : ti->count;
        /* the tensor's own layer: a MoE layer has no dense MLP, a dense one no experts */
        int64_t tl = layer >= 0 ? l3d_gpt_tensor_layer(&m->cfg, &m->shard, t, layer) : 0;
        if (n == 0 || tl < 0) continue;
        int64_t off = ti->offset + tl * n;
        int64_t base = layer >= 0 ? m->slot_off[t] : m->nonlayer_off[t];
        for (int r = 0; r < d; r++) { /* rank r's part of [off, off + n) */
            int64_t lo = (int64_t)r * S, hi = lo + S < N ? lo + S : N;
            if (lo < off) lo = off;
            if (hi > off + n) hi = off + n;
            counts[r] = hi > lo ? hi - lo : 0;
            displs[r] = hi > lo ? base + (lo - off) : 0;
        }
        if (counts[me] > 0)
            l3d_be_copy_d2d(m->be, (char *)b->p + (size_t)displs[me] * es,
                            (char *)dp->param_shard +
                                (size_t)(off + displs[me] - base - dp->own_start) * es,
                            (size_t)counts[me] * es);
        for (int r = 0; r < d; r++) {
            if (r == me) continue;
            if (counts[r] > 0)
                l3d_comm_recv(dp->comm, (char *)b->p + (size_t)displs[r] * es, counts[r], dt, r,
                              L3D_TAG_ZERO3_LAYER, &b->recv[b->nrecv++]);
            if (counts[me] > 0)
                l3d_comm_send(dp->comm, (char *)b->p + (size_t)displs[me] * es, counts[me], dt, r,
                              L3D_TAG_ZERO3_LAYER, &b->send[b->nsend++]);
        }
    }
    if (!dp->overlap) { /* blocking: all of it now */
        wait_reqs(dp, b->recv, &b->nrecv, "ZeRO-3 parameter receive", layer);
        wait_reqs(dp, b->send, &b->nsend, "ZeRO-3 parameter send", layer);
    }
    dp->gather_posts_s += l3d_time_s() - t0;
}

static void wait_buf(struct l3d_dp *dp, struct gbuf *b) {
    double t0 = l3d_time_s();
    wait_reqs(dp, b->recv, &b->nrecv, "ZeRO-3 parameter receive", b->layer);
    double w = l3d_time_s() - t0;
    dp->gather_wait_s += w;
    dp->comm_wait_s += w;
}

static struct gbuf *holding(struct l3d_dp_zero3 *z, int layer) {
    for (int i = 0; i < z->nbuf; i++)
        if (z->buf[i].layer == layer) return &z->buf[i];
    return NULL;
}

static struct gbuf *free_buf(struct l3d_dp_zero3 *z) { return holding(z, FREE_BUF); }

/* The test hook: layer 0's first tensor slice (its first LayerNorm's weights) zeroed in the
 * gathered buffer, the whole slice, so that the run's losses leave the reference's by far more
 * than any tolerance (one element of it moved them by 2.4e-5 only). */
static void perturb(struct l3d_dp *dp, struct gbuf *b) {
    struct l3d_gpt *m = dp->m;
    int t = 0;
    while (!l3d_gpt_is_layer_tensor(t)) t++;
    const size_t es = l3d_dtype_size(dp->param_dtype);
    /* this rank's part may still be going out: the others must get the true values */
    wait_reqs(dp, b->send, &b->nsend, "ZeRO-3 parameter send", b->layer);
    l3d_be_memset(m->be, (char *)b->p + (size_t)m->slot_off[t] * es, 0,
                  (size_t)(m->tensors[t].rows * m->tensors[t].cols) * es);
}

/* The model's params_get: the gather of `layer` (posted by an earlier prefetch, or now), the next
 * `prefetch` layers in the pass's direction posted behind it, then the wait for this one. The
 * non-layer tensors come first in either pass, so their call posts the first layers'. */
static const void *params_get(void *ctx, int layer, bool backward) {
    struct l3d_dp *dp = ctx;
    struct l3d_dp_zero3 *z = dp->z3;
    int Ll = dp->m->shard.layer_count, dir = backward ? -1 : 1;
    struct gbuf *b = layer < 0 ? &z->nl : holding(z, layer);
    if (layer < 0 || !b) {
        if (!b) b = free_buf(z);
        L3D_ASSERT(b && b->layer == FREE_BUF); /* every pass releases what it took */
        post(dp, b, layer);
    }
    int next = layer >= 0 ? layer + dir : backward ? Ll - 1 : 0;
    for (int k = 0; k < z->prefetch && next >= 0 && next < Ll; k++, next += dir) {
        if (holding(z, next)) continue;
        struct gbuf *f = free_buf(z);
        if (!f) break;
        post(dp, f, next);
    }
    wait_buf(dp, b);
    if (z->test_perturb && layer == 0 && !backward && dp->comm->rank == 0) perturb(dp, b);
    b->busy = true;
    return b->p;
}

static void params_done(void *ctx, int layer, bool backward) {
    (void)backward;
    struct l3d_dp *dp = ctx;
    struct gbuf *b = layer < 0 ? &dp->z3->nl : holding(dp->z3, layer);
    L3D_ASSERT(b && b->busy);
    b->busy = false;
    b->layer = FREE_BUF;
}

void l3d_dp_zero3_poll(struct l3d_dp *dp) {
    struct l3d_dp_zero3 *z = dp->z3;
    if (!z) return;
    for (int i = 0; i <= z->nbuf; i++) {
        struct gbuf *b = i < z->nbuf ? &z->buf[i] : &z->nl;
        for (int k = 0; k < b->nrecv; k++)
            if (b->recv[k].active) l3d_comm_test(dp->comm, &b->recv[k]);
        for (int k = 0; k < b->nsend; k++)
            if (b->send[k].active) l3d_comm_test(dp->comm, &b->send[k]);
    }
}

/* A buffer's request lists; the sends still pending are waited for first (the other ranks took
 * them already: only this rank's progress is missing). */
static void gbuf_reqs(struct l3d_dp *dp, struct gbuf *b) {
    size_t n = (size_t)L3D_NUM_TENSORS * (size_t)(dp->comm->size > 1 ? dp->comm->size - 1 : 1);
    b->recv = l3d_calloc(n * sizeof *b->recv, "ZeRO-3 gather requests");
    b->send = l3d_calloc(n * sizeof *b->send, "ZeRO-3 gather requests");
}

static void gbuf_release(struct l3d_dp *dp, struct gbuf *b) {
    if (b->send) wait_reqs(dp, b->send, &b->nsend, "ZeRO-3 parameter send", b->layer);
    l3d_free(b->recv);
    l3d_free(b->send);
    b->recv = b->send = NULL;
    l3d_be_free(dp->m->be, b->p);
    b->p = NULL;
}

static void free_bufs(struct l3d_dp *dp) {
    struct l3d_dp_zero3 *z = dp->z3;
    for (int i = 0; i < z->nbuf; i++) gbuf_release(dp, &z->buf[i]);
    l3d_free(z->buf);
    z->buf = NULL;
    z->nbuf = 0;
}

l3d_status l3d_dp_zero3_prefetch(struct l3d_dp *dp, int prefetch) {
    L3D_ASSERT(dp->zero == 3 && prefetch >= 0);
    struct l3d_dp_zero3 *z = dp->z3;
    struct l3d_gpt *m = dp->m;
    free_bufs(dp);
    z->prefetch = prefetch;
    z->nbuf = prefetch + 1;
    z->buf = l3d_calloc((size_t)z->nbuf * sizeof *z->buf, "ZeRO-3 gather buffers");
    size_t bytes = (size_t)m->slot_size * l3d_dtype_size(dp->param_dtype) + 64;
    for (int i = 0; i < z->nbuf; i++) {
        z->buf[i].layer = FREE_BUF;
        gbuf_reqs(dp, &z->buf[i]);
        z->buf[i].p = l3d_be_alloc(m->be, bytes, "ZeRO-3 layer gather buffer");
        if (!z->buf[i].p) {
            free_bufs(dp);
            return l3d_error(L3D_ERR_OOM, "cannot allocate %d ZeRO-3 gather buffers of %.2f MiB "
                             "(--zero3-prefetch %d): lower --zero3-prefetch or use more ranks",
                             prefetch + 1, (double)bytes / 1048576.0, prefetch);
        }
        l3d_be_memset(m->be, z->buf[i].p, 0, bytes); /* first touch now, not in the step */
    }
    return L3D_OK;
}

l3d_status l3d_dp_zero3_init(struct l3d_dp *dp) {
    struct l3d_gpt *m = dp->m;
    if (m->params)
        return l3d_error(L3D_ERR_ARG, "ZeRO-3 needs a model built without parameters "
                         "(L3D_GRADS_SHARDED)");
    size_t es = l3d_dtype_size(dp->param_dtype);
    size_t shard = (size_t)(dp->own_count + 1) * es, nl = (size_t)m->nonlayer_size * es + 64;
    dp->z3 = l3d_calloc(sizeof *dp->z3, "ZeRO-3 state");
    dp->z3->nl.layer = FREE_BUF;
    gbuf_reqs(dp, &dp->z3->nl);
    /* Test hook: a gather that delivers wrong values (layer 0's first LayerNorm weights zeroed
     * on DP rank 0 in every forward: perturb) must fail tests/cli/zero3.sh's comparison. Read
     * once, here. */
    const char *perturb = getenv("L3D_TEST_ZERO3_PERTURB");
    dp->z3->test_perturb = perturb && strcmp(perturb, "1") == 0;
    dp->param_shard = l3d_be_alloc(m->be, shard, "ZeRO-3 parameter shard");
    dp->z3->nl.p = l3d_be_alloc(m->be, nl, "ZeRO-3 non-layer gather buffer");
    if (!dp->param_shard || !dp->z3->nl.p)
        return l3d_error(L3D_ERR_OOM, "cannot allocate %.2f GiB for this rank's ZeRO-3 parameter "
                         "shard and non-layer gather buffer: use more data-parallel ranks or a "
                         "smaller model", (double)(shard + nl) / 1073741824.0);
    l3d_be_memset(m->be, dp->param_shard, 0, shard);
    l3d_be_memset(m->be, dp->z3->nl.p, 0, nl);
    m->hooks.params_ctx = dp;
    m->hooks.params_get = params_get;
    m->hooks.params_done = params_done;
    return l3d_dp_zero3_prefetch(dp, 1);
}

void l3d_dp_zero3_free(struct l3d_dp *dp) {
    if (!dp->z3) return;
    free_bufs(dp);
    gbuf_release(dp, &dp->z3->nl);
    l3d_be_free(dp->m->be, dp->param_shard);
    l3d_free(dp->z3);
    dp->z3 = NULL;
    dp->param_shard = NULL;
    dp->m->hooks.params_get = NULL;
    dp->m->hooks.params_done = NULL;
    dp->m->hooks.params_ctx = NULL;
}

void l3d_dp_zero3_init_weights(struct l3d_dp *dp, const struct l3d_adamw *opt, uint64_t seed) {
    struct l3d_gpt *m = dp->m;
    L3D_ASSERT(dp->zero == 3);
    if (dp->own_count == 0) return;
    if (!opt->master) { /* fp32: the shard is the parameters AdamW updates */
        l3d_gpt_init_weights_range(m, seed, dp->own_start, dp->own_count, dp->param_shard);
        return;
    }
    float *f = opt->master; /* mixed precision: the master range, rounded into the shard */
    L3D_ASSERT(f && opt->start == dp->own_start && opt->n == dp->own_count);
    l3d_gpt_init_weights_range(m, seed, dp->own_start, dp->own_count, f);
    l3d_be_convert(m->be, m->dt, dp->param_shard, L3D_F32, f, dp->own_count);
}

size_t l3d_dp_zero3_gather_bytes(const struct l3d_dp *dp) {
    if (!dp->z3) return 0;
    size_t es = l3d_dtype_size(dp->param_dtype);
    return (size_t)dp->z3->nbuf * ((size_t)dp->m->slot_size * es + 64) +
           (size_t)dp->m->nonlayer_size * es + 64;
}
