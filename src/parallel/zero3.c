/* ZeRO-3: this rank's parameters and their layer-by-layer all-gather (include/llm3d/dp.h).
 *
 * A layer's parameters are 12 slices of the flat space (one per layer tensor, llm.c's tensor-major
 * order), each cut by the same shard boundaries as the optimizer state; every slice is one
 * in-place all-gatherv into the layer's buffer, laid out as the model's gradient slots
 * (slot_off), where each rank contributes its part of the slice. The non-layer tensors (wte, wpe,
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
    int nreq;
    l3d_req req[L3D_NUM_TENSORS];
};

struct l3d_dp_zero3 {
    int prefetch, nbuf;
    bool test_perturb; /* L3D_TEST_ZERO3_PERTURB=1: DP rank 0 zeroes an element of layer 0 */
    struct gbuf *buf; /* nbuf = prefetch + 1 layer buffers */
    struct gbuf nl;   /* the non-layer tensors */
};

/* Posts the gather of layer `layer` (-1: the non-layer tensors) into b: this rank's part copied
 * from its shard, then one all-gatherv per tensor slice (blocking without overlap). */
static void post(struct l3d_dp *dp, struct gbuf *b, int layer) {
    struct l3d_gpt *m = dp->m;
    const enum l3d_dtype dt = dp->param_dtype;
    const size_t es = l3d_dtype_size(dt);
    const int d = dp->comm->size, me = dp->comm->rank;
    const int64_t S = dp->shard_size, N = m->num_params;
    int64_t counts[256], displs[256];
    L3D_ASSERT(d <= 256 && !b->busy);
    b->layer = layer;
    b->nreq = 0;
    double t0 = l3d_time_s();
    for (int t = 0; t < L3D_NUM_TENSORS; t++) {
        const struct l3d_tensor_info *ti = &m->tensors[t];
        if (l3d_gpt_is_layer_tensor(t) != (layer >= 0)) continue;
        int64_t n = layer >= 0 ? ti->rows * ti->cols : ti->count;
        if (n == 0) continue;
        int64_t off = ti->offset + (layer >= 0 ? (int64_t)layer * n : 0);
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
        if (d > 1)
            l3d_comm_all_gatherv(dp->comm, b->p, counts, displs, dt,
                                 dp->overlap ? &b->req[b->nreq++] : NULL);
    }
    dp->gather_posts_s += l3d_time_s() - t0;
}

static void wait_buf(struct l3d_dp *dp, struct gbuf *b) {
    double t0 = l3d_time_s();
    struct l3d_doing was = l3d_comm_doing(dp->comm, "ZeRO-3 parameter all-gather", b->layer, -1);
    for (int i = 0; i < b->nreq; i++) l3d_comm_wait(dp->comm, &b->req[i]);
    l3d_comm_done(dp->comm, was);
    b->nreq = 0;
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
    if (z->test_perturb && layer == 0 && !backward && dp->comm->rank == 0)
        l3d_be_memset(dp->m->be, b->p, 0, l3d_dtype_size(dp->param_dtype)); /* ln1w[0] of 1 */
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
        for (int k = 0; k < b->nreq; k++)
            if (b->req[k].active) l3d_comm_test(dp->comm, &b->req[k]);
    }
}

static void free_bufs(struct l3d_dp *dp) {
    struct l3d_dp_zero3 *z = dp->z3;
    for (int i = 0; i < z->nbuf; i++) l3d_be_free(dp->m->be, z->buf[i].p);
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
    /* Test hook: a gather that delivers a wrong value (the first weight of layer 0's first
     * LayerNorm zeroed on DP rank 0 in every forward) must fail tests/cli/zero3.sh's
     * comparison. Read once, here. */
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
    l3d_be_free(dp->m->be, dp->z3->nl.p);
    l3d_be_free(dp->m->be, dp->param_shard);
    l3d_free(dp->z3);
    dp->z3 = NULL;
    dp->param_shard = NULL;
    dp->m->hooks.params_get = NULL;
    dp->m->hooks.params_done = NULL;
    dp->m->hooks.params_ctx = NULL;
}

size_t l3d_dp_zero3_gather_bytes(const struct l3d_dp *dp) {
    if (!dp->z3) return 0;
    size_t es = l3d_dtype_size(dp->param_dtype);
    return (size_t)dp->z3->nbuf * ((size_t)dp->m->slot_size * es + 64) +
           (size_t)dp->m->nonlayer_size * es + 64;
}
