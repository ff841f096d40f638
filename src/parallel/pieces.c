/* The fp32 parameters a piece at a time, where no rank holds them whole: ZeRO-3, and ZeRO-2 in
 * mixed precision (include/llm3d/dp.h, "the fp32 parameters a piece at a time"). */
#include <string.h>

#include "parallel/dp-impl.h"

struct l3d_dp_stream {
    struct l3d_adamw *opt;
    int64_t piece;  /* P: elements a piece at most */
    float *buf;     /* one piece (device memory); NULL on the ranks past the first of a save */
    bool save;
    bool live;      /* save: the sends are posted (l3d_dp_fp32_stream_send), so _end drains */
    int64_t next;   /* save, DP rank 0: the offset of the next piece to receive */
    l3d_req *reqs;  /* save, the other ranks: their pieces' sends */
    int nreq;
};

bool l3d_dp_fp32_streamed(const struct l3d_dp *dp, const struct l3d_adamw *opt) {
    if (dp->zero == 3) return true;
    /* ZeRO-2 in mixed precision: master ranges, and no fp32 gradient buffer to gather them in */
    return opt->master && !dp->m->grads && !(opt->start == 0 && opt->n == dp->m->num_params);
}

int64_t l3d_dp_fp32_piece(int64_t n, size_t bytes) {
    int64_t p = (int64_t)(bytes / sizeof(float));
    if (p > n) p = n;
    return p > 0 ? p : 1;
}

/* Rank r's range [*lo, *hi) of the flat space (l3d_dp_init's own_start, own_count). */
static void range_of(const struct l3d_dp *dp, int r, int64_t *lo, int64_t *hi) {
    int64_t N = dp->m->num_params;
    *lo = (int64_t)r * dp->shard_size;
    *hi = *lo + dp->shard_size;
    if (*lo > N) *lo = N;
    if (*hi > N) *hi = N;
}

/* This rank's range in fp32 (device memory, at own_start): the master weights in mixed
 * precision, ZeRO-3's shard in fp32. */
static float *own_fp32(const struct l3d_dp *dp, const struct l3d_adamw *opt) {
    if (opt->master) return opt->master;
    L3D_ASSERT(dp->zero == 3 && dp->param_dtype == L3D_F32);
    return dp->param_shard;
}

void l3d_dp_stream_free(struct l3d_dp *dp) {
    struct l3d_dp_stream *s = dp->stream;
    if (!s) return;
    if (s->buf) l3d_be_free(dp->m->be, s->buf);
    l3d_free(s->reqs);
    l3d_free(s);
    dp->stream = NULL;
}

l3d_status l3d_dp_fp32_stream_begin(struct l3d_dp *dp, struct l3d_adamw *opt, size_t bytes,
                                    bool save) {
    L3D_ASSERT(!dp->stream && l3d_dp_fp32_streamed(dp, opt));
    struct l3d_dp_stream *s = l3d_calloc(sizeof *s, "fp32 parameter pieces");
    s->opt = opt;
    s->piece = l3d_dp_fp32_piece(dp->m->num_params, bytes);
    s->save = save;
    dp->stream = s;
    if (save && dp->comm->rank != 0) return L3D_OK; /* it sends from its range itself */
    size_t nb = (size_t)s->piece * sizeof(float);
    s->buf = l3d_be_alloc(dp->m->be, nb, "fp32 parameter piece");
    if (!s->buf)
        return l3d_error(L3D_ERR_OOM, "cannot allocate %.2f MiB for a piece of the fp32 "
                         "parameters (saving, resuming or --init-from): use more ranks or a "
                         "smaller model", (double)nb / 1048576.0);
    return L3D_OK;
}

void l3d_dp_fp32_stream_send(struct l3d_dp *dp) {
    struct l3d_dp_stream *s = dp->stream;
    L3D_ASSERT(s);
    if (!s->save) return;
    s->live = true;
    if (dp->comm->rank == 0 || dp->own_count == 0) return;
    const float *src = own_fp32(dp, s->opt);
    int64_t P = s->piece, lo = dp->own_start, hi = lo + dp->own_count;
    s->reqs = l3d_calloc((size_t)((hi - lo) / P + 2) * sizeof *s->reqs, "fp32 parameter pieces");
    for (int64_t off = lo / P * P; off < hi; off += P) { /* the writer's pieces, in order */
        int64_t a = off > lo ? off : lo, b = off + P < hi ? off + P : hi;
        l3d_comm_send(dp->comm, src + (a - lo), b - a, L3D_F32, 0, L3D_TAG_ZERO3_GATHER,
                      &s->reqs[s->nreq++]);
    }
}

/* Range [off, off + n) of the flat space to DP rank 0's dst (device memory), from its owners in
 * rank order; every other rank sends its part (what: the watchdog's words for the wait). */
static void pull_range(struct l3d_dp *dp, const struct l3d_adamw *opt, int64_t off, int64_t n,
                       float *dst, const char *what) {
    struct l3d_comm *c = dp->comm;
    const float *src = own_fp32(dp, opt);
    double t0 = l3d_time_s();
    struct l3d_doing was = l3d_comm_doing(c, what, -1, -1);
    for (int r = 0; r < c->size; r++) { /* the owners of the range's parts, in order */
        int64_t lo, hi;
        range_of(dp, r, &lo, &hi);
        int64_t a = off > lo ? off : lo, b = off + n < hi ? off + n : hi;
        if (a >= b || (c->rank != 0 && r != c->rank)) continue;
        if (r == c->rank && c->rank == 0)
            l3d_be_copy_d2d(dp->m->be, dst + (a - off), src + (a - lo),
                            (size_t)(b - a) * sizeof(float));
        else if (c->rank == 0)
            l3d_comm_recv(c, dst + (a - off), b - a, L3D_F32, r, L3D_TAG_ZERO3_GATHER, NULL);
        else
            l3d_comm_send(c, src + (a - lo), b - a, L3D_F32, 0, L3D_TAG_ZERO3_GATHER, NULL);
    }
    l3d_comm_done(c, was);
    dp->comm_wait_s += l3d_time_s() - t0;
}

const float *l3d_dp_fp32_stream_get(struct l3d_dp *dp, int64_t off, int64_t n) {
    struct l3d_dp_stream *s = dp->stream;
    int64_t N = dp->m->num_params;
    L3D_ASSERT(s && s->live && s->buf && off == s->next && dp->comm->rank == 0 &&
               n == (N - off < s->piece ? N - off : s->piece));
    /* the other ranks' parts: the sends l3d_dp_fp32_stream_send posted */
    pull_range(dp, s->opt, off, n, s->buf, "fp32 parameter piece to DP rank 0 (save)");
    s->next = off + n;
    return s->buf;
}

void l3d_dp_fp32_stream_want(const struct l3d_dp *dp, int64_t *lo, int64_t *hi) {
    *lo = dp->zero == 3 ? dp->own_start : 0;
    *hi = dp->zero == 3 ? dp->own_start + dp->own_count : dp->m->num_params;
}

/* The piece [off, off + n) in the buffer into what this rank keeps of it: the 16-bit parameters
 * (whole, ZeRO-2), ZeRO-3's shard, the master range. */
static void apply(struct l3d_dp *dp, int64_t off, int64_t n) {
    struct l3d_dp_stream *s = dp->stream;
    struct l3d_gpt *m = dp->m;
    if (m->params)
        l3d_be_convert(m->be, m->dt, (char *)m->params + (size_t)off * m->es, L3D_F32, s->buf, n);
    int64_t lo = dp->own_start, hi = lo + dp->own_count;
    int64_t a = off > lo ? off : lo, b = off + n < hi ? off + n : hi;
    if (a >= b) return;
    if (dp->zero == 3)
        l3d_be_convert(m->be, m->dt, (char *)dp->param_shard + (size_t)(a - lo) * m->es, L3D_F32,
                       s->buf + (a - off), b - a);
    if (s->opt->master)
        l3d_be_copy_d2d(m->be, s->opt->master + (a - s->opt->start), s->buf + (a - off),
                        (size_t)(b - a) * sizeof(float));
}

void l3d_dp_fp32_stream_put(struct l3d_dp *dp, int64_t off, int64_t n, const float *host) {
    struct l3d_dp_stream *s = dp->stream;
    L3D_ASSERT(s && !s->save && n <= s->piece);
    l3d_be_copy_h2d(dp->m->be, s->buf, host, (size_t)n * sizeof(float));
    apply(dp, off, n);
    l3d_be_sync(dp->m->be); /* host may be refilled once this returns */
}

void l3d_dp_fp32_stream_seed(struct l3d_dp *dp, uint64_t seed) {
    struct l3d_dp_stream *s = dp->stream;
    L3D_ASSERT(s && !s->save);
    int64_t lo, hi;
    l3d_dp_fp32_stream_want(dp, &lo, &hi);
    for (int64_t off = lo; off < hi; off += s->piece) {
        int64_t n = hi - off < s->piece ? hi - off : s->piece;
        l3d_gpt_init_weights_range(dp->m, seed, off, n, s->buf);
        apply(dp, off, n);
    }
    l3d_be_sync(dp->m->be);
}

void l3d_dp_fp32_stream_end(struct l3d_dp *dp) {
    struct l3d_dp_stream *s = dp->stream;
    if (!s) return;
    int64_t N = dp->m->num_params;
    if (s->live && s->buf) /* what the writer did not take (it failed): every send completes */
        while (s->next < N)
            l3d_dp_fp32_stream_get(dp, s->next, N - s->next < s->piece ? N - s->next : s->piece);
    if (s->nreq > 0) {
        double t0 = l3d_time_s();
        struct l3d_doing was = l3d_comm_doing(dp->comm, "fp32 parameter pieces to DP rank 0 "
                                              "(save)", -1, -1);
        for (int i = 0; i < s->nreq; i++) l3d_comm_wait(dp->comm, &s->reqs[i]);
        l3d_comm_done(dp->comm, was);
        dp->comm_wait_s += l3d_time_s() - t0;
    }
    l3d_dp_stream_free(dp);
}

void l3d_dp_fp32_pull(struct l3d_dp *dp, const struct l3d_adamw *opt, int64_t off, int64_t n,
                      float *dst) {
    pull_range(dp, opt, off, n, dst, "fp32 parameter rows to DP rank 0 (--out)");
}
