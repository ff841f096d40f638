/* Loading a sharded checkpoint on any layout, and reading one whole (inspect, convert); resolving
 * "auto" and checkpoint directories (include/llm3d/ckpt.h). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt-impl.h"
#include "llm3d/ckpt.h"

static bool same_config(const struct l3d_model_spec *a, const struct l3d_model_spec *b) {
    return l3d_model_same(a, b); /* sizes and architecture */
}

static bool same_shard(const struct l3d_shard *a, const struct l3d_shard *b) {
    return a->layer_start == b->layer_start && a->layer_count == b->layer_count &&
           a->head_start == b->head_start && a->head_count == b->head_count &&
           a->ffn_start == b->ffn_start && a->ffn_count == b->ffn_count &&
           a->vocab_start == b->vocab_start && a->vocab_count == b->vocab_count &&
           a->has_embedding == b->has_embedding && a->has_head == b->has_head &&
           a->expert_start == b->expert_start && a->expert_count == b->expert_count;
}

static void file_path(const struct l3d_ckpt_manifest *mf, int r, char *buf, size_t cap) {
    l3d_ckpt_join(buf, cap, mf->dir, "/", mf->files[r].name);
}

/* Where a piece's m and v begin in its file. */
static int64_t off_m(const struct l3d_ckpt_manifest *mf, const struct l3d_ckpt_mf_file *f) {
    return mf->header + l3d_ckpt_psize(mf) * f->params;
}
static int64_t off_v(const struct l3d_ckpt_manifest *mf, const struct l3d_ckpt_mf_file *f) {
    return off_m(mf, f) + l3d_ckpt_msize(mf) * f->opt_count;
}

/* A byte range of a rank file (piece `piece`) and the device memory of be it goes to: the same
 * pass that checksums the file loads it, from its read buffer. */
struct seg {
    int piece;
    int64_t off, n;
    struct l3d_backend *be;
    void *dst;
};

/* The run keeps its tensors in the types the checkpoint stores them in, or nothing is read:
 * there is no conversion on load. */
static l3d_status check_dtypes(const struct l3d_ckpt_manifest *mf, enum l3d_dtype pdt,
                               enum l3d_dtype mdt, const char *who, const char *todo) {
    bool p = mf->pdt != pdt;
    if (!p && mf->mdt == mdt) return L3D_OK;
    return l3d_error(L3D_ERR_FORMAT, "%s stores the %s as %s, but %s them as %s and llm3d does "
                     "not convert checkpoints: %s", mf->path, p ? "parameters" : "AdamW moments",
                     l3d_dtype_name(p ? mf->pdt : mf->mdt), who, l3d_dtype_name(p ? pdt : mdt),
                     todo);
}

/* The 8-byte NUL-padded dtype name of a format-3 header. */
static bool same_dtype_name(const uint8_t *field, enum l3d_dtype t) {
    char name[8] = {0};
    memcpy(name, l3d_dtype_name(t), strlen(l3d_dtype_name(t)));
    return memcmp(field, name, 8) == 0;
}

/* Whole file against the manifest: header fields and checksum; bytes in segs are copied out. */
static l3d_status verify_file(const struct l3d_ckpt_manifest *mf, int r, uint8_t *buf, size_t cap,
                              const struct seg *segs, int nseg, int64_t *bytes) {
    const struct l3d_ckpt_mf_file *f = &mf->files[r];
    char path[L3D_CKPT_PATH_CAP];
    file_path(mf, r, path, sizeof path);
    int fd = open(path, O_RDONLY);
    if (fd < 0) return l3d_error(L3D_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    struct l3d_ckpt_hasher h;
    l3d_ckpt_hash_init(&h);
    int64_t got = 0;
    uint8_t hdr[L3D_CKPT_HEADER_BYTES] = {0};
    for (;;) {
        ssize_t k = read(fd, buf, cap);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        if (got < mf->header)
            memcpy(hdr + got, buf, (size_t)(k < mf->header - got ? k : mf->header - got));
        l3d_ckpt_hash_update(&h, buf, (size_t)k);
        for (int i = 0; i < nseg; i++) {
            if (segs[i].piece != r) continue;
            int64_t lo = got > segs[i].off ? got : segs[i].off;
            int64_t hi = got + k < segs[i].off + segs[i].n ? got + k : segs[i].off + segs[i].n;
            if (hi > lo) {
                l3d_be_copy_h2d(segs[i].be, (char *)segs[i].dst + (lo - segs[i].off),
                                buf + (lo - got), (size_t)(hi - lo));
                l3d_be_sync(segs[i].be); /* before buf is read into again */
            }
        }
        got += k;
    }
    close(fd);
    *bytes += got;
    if (got != f->bytes)
        return l3d_error(L3D_ERR_FORMAT, "%s: %lld bytes, the manifest says %lld: the file is "
                         "truncated or damaged", path, (long long)got, (long long)f->bytes);
    int64_t fields[5], ostart, chunk;
    memcpy(fields, hdr + 8, sizeof fields);
    memcpy(&ostart, hdr + 48, 8);
    memcpy(&chunk, hdr + 56, 8);
    if (memcmp(hdr, L3D_CKPT_FILE_MAGIC, 8) != 0 || fields[0] != mf->format ||
        fields[1] != f->rank || fields[2] != mf->st.step || fields[3] != f->params ||
        fields[4] != f->opt_count ||
        ostart != f->opt_start || chunk != f->chunk ||
        (mf->format >= L3D_CKPT_FORMAT_DTYPES && !same_dtype_name(hdr + 64, mf->pdt)) ||
        (mf->format >= L3D_CKPT_FORMAT_DTYPES && !same_dtype_name(hdr + 72, mf->mdt)))
        return l3d_error(L3D_ERR_FORMAT, "%s: its header does not match the manifest (rank %d "
                         "chunk %d, step %lld): a file from another checkpoint?", path, f->rank,
                         f->chunk, (long long)mf->st.step);
    uint64_t sum = l3d_ckpt_hash_final(&h);
    if (sum != f->hash)
        return l3d_error(L3D_ERR_FORMAT, "%s: checksum %016" PRIx64 ", the manifest says %016"
                         PRIx64 ": the file is damaged", path, sum, f->hash);
    return L3D_OK;
}

/* Every file present with its size (every rank: a stat each); the checksums split over the
 * ranks, the files of saved rank r verified by rank r mod world size, which also copies out segs
 * (of the files of saved rank `rank`). */
static l3d_status check_files(const struct l3d_ckpt_manifest *mf, int rank, int nranks,
                              const struct seg *segs, int nseg, int64_t *bytes) {
    char path[L3D_CKPT_PATH_CAP];
    for (int r = 0; r < mf->nfiles; r++) {
        struct stat sb;
        file_path(mf, r, path, sizeof path);
        if (stat(path, &sb) != 0)
            return l3d_error(L3D_ERR_IO, "rank file %s, listed in %s, is missing (%s): the "
                             "checkpoint is incomplete; use another step", path, mf->path,
                             strerror(errno));
        if ((int64_t)sb.st_size != mf->files[r].bytes)
            return l3d_error(L3D_ERR_FORMAT, "%s: %lld bytes, the manifest says %lld: the file "
                             "is truncated or damaged", path, (long long)sb.st_size,
                             (long long)mf->files[r].bytes);
    }
    size_t cap = 8u << 20;
    uint8_t *buf = l3d_alloc(cap, "checkpoint read buffer");
    l3d_status st = L3D_OK;
    for (int r = 0; st == L3D_OK && r < mf->nfiles; r++)
        if (mf->files[r].rank % nranks == rank)
            st = verify_file(mf, r, buf, cap, segs, nseg, bytes);
    l3d_free(buf);
    return st;
}

static float *alloc_nan(int64_t n, const char *what) {
    float *p = l3d_try_alloc((size_t)(n > 0 ? n : 1) * sizeof(float), what);
    if (p) memset(p, 0xff, (size_t)n * sizeof(float)); /* all-ones bits: a NaN */
    return p;
}

/* hint: what to do, e.g. "resume on the layout it was saved under" */
static l3d_status no_memory(const struct l3d_ckpt_manifest *mf, int64_t n, const char *hint) {
    return l3d_error(L3D_ERR_OOM, "%s: no memory to assemble the checkpoint's full model (%lld "
                     "parameters): %s", mf->path, (long long)n, hint);
}

static bool is_full(const struct l3d_model_spec *c, const struct l3d_shard *s) {
    struct l3d_shard f = l3d_shard_full(c);
    return same_shard(s, &f);
}

/* The full model's parameters (sel 0) or moments m (1) / v (2), from the rank files: each distinct
 * shard's buffer assembled, then placed by l3d_gpt_shard_to_full; host memory only. full holds
 * NaN where nothing was stored. fp32 (the types were checked against the run's). */
static l3d_status assemble_full(const struct l3d_ckpt_manifest *mf, int sel, float *full,
                                int64_t *bytes) {
    const struct l3d_model_spec *c = &mf->cfg;
    L3D_ASSERT((sel == 0 ? l3d_ckpt_psize(mf) : l3d_ckpt_msize(mf)) == sizeof(float));
    int64_t maxn = 0;
    struct l3d_tensor_info t[L3D_NUM_TENSORS];
    for (int r = 0; r < mf->nfiles; r++) {
        int64_t n = l3d_gpt_plan_tensors(c, &mf->files[r].shard, t);
        if (n > maxn) maxn = n;
    }
    float *tmp = alloc_nan(maxn, "checkpoint shard");
    if (!tmp) return no_memory(mf, maxn, "free host memory");
    l3d_status st = L3D_OK;
    char path[L3D_CKPT_PATH_CAP];
    for (int r = 0; st == L3D_OK && r < mf->nfiles; r++) {
        const struct l3d_ckpt_mf_file *f = &mf->files[r];
        bool first = true; /* the first piece of this shard does the whole shard */
        for (int q = 0; q < r; q++) first &= !same_shard(&mf->files[q].shard, &f->shard);
        if (!first) continue;
        int64_t n = l3d_gpt_plan_tensors(c, &f->shard, t);
        bool whole = is_full(c, &f->shard); /* read straight into full */
        float *dst = whole ? full : tmp;
        if (!whole) memset(tmp, 0xff, (size_t)n * sizeof(float));
        for (int q = r; st == L3D_OK && q < mf->nfiles; q++) {
            const struct l3d_ckpt_mf_file *g = &mf->files[q];
            if (!same_shard(&g->shard, &f->shard)) continue;
            file_path(mf, q, path, sizeof path);
            if (sel == 0 && g->params) {
                st = l3d_ckpt_read_at(path, mf->header, dst, (size_t)n * sizeof(float));
                *bytes += n * l3d_ckpt_psize(mf);
            } else if (sel > 0 && g->opt_count) {
                st = l3d_ckpt_read_at(path, sel == 1 ? off_m(mf, g) : off_v(mf, g),
                                      dst + g->opt_start, (size_t)g->opt_count * sizeof(float));
                *bytes += g->opt_count * l3d_ckpt_msize(mf);
            }
        }
        if (st == L3D_OK && !whole) l3d_gpt_shard_to_full(c, &f->shard, tmp, full);
    }
    l3d_free(tmp);
    return st;
}

static l3d_status check_no_nan(const struct l3d_ckpt_manifest *mf, const float *p, int64_t n,
                               const char *what) {
    for (int64_t i = 0; i < n; i++)
        if (p[i] != p[i])
            return l3d_error(L3D_ERR_FORMAT, "%s: no rank file holds %s element %lld of this "
                             "rank's slice (or it is NaN): the checkpoint is incomplete",
                             mf->path, what, (long long)i);
    return L3D_OK;
}

/* The checkpoint as a source of the full model's rows (struct l3d_ckpt_rows): each distinct
 * shard of its files in turn (a later one over an earlier, as l3d_gpt_shard_to_full places
 * them) gives the rows of the strip it holds, read through one buffer of a strip. */
struct rows_src {
    const struct l3d_ckpt_manifest *mf;
    int sel;          /* 0 parameters, 1 AdamW m, 2 v (fp32: the types were checked) */
    float *tmp;       /* a strip */
    int64_t *bytes;
};

/* Elements [y0, y1) of shard file f's flat space (sel's) into dst: from the last file of its
 * shard holding parameters (sel 0), or each file's moment range met (sel > 0). */
static l3d_status read_flat(const struct rows_src *s, int f, int64_t y0, int64_t y1,
                            float *dst) {
    const struct l3d_ckpt_manifest *mf = s->mf;
    char path[L3D_CKPT_PATH_CAP];
    l3d_status st = L3D_OK;
    int last = -1;
    for (int g = f; s->sel == 0 && g < mf->nfiles; g++)
        if (mf->files[g].params && same_shard(&mf->files[g].shard, &mf->files[f].shard)) last = g;
    for (int g = f; st == L3D_OK && g < mf->nfiles; g++) {
        const struct l3d_ckpt_mf_file *q = &mf->files[g];
        if (!same_shard(&q->shard, &mf->files[f].shard) || (s->sel == 0 && g != last)) continue;
        int64_t lo = s->sel == 0 ? 0 : q->opt_start;
        int64_t hi = s->sel == 0 ? INT64_MAX : q->opt_start + q->opt_count;
        int64_t a = y0 > lo ? y0 : lo, b = y1 < hi ? y1 : hi;
        if (a >= b) continue;
        int64_t base = s->sel == 0 ? mf->header : s->sel == 1 ? off_m(mf, q) : off_v(mf, q);
        file_path(mf, g, path, sizeof path);
        st = l3d_ckpt_read_at(path, base + (a - lo) * (int64_t)sizeof(float), dst + (a - y0),
                              (size_t)(b - a) * sizeof(float));
        *s->bytes += (b - a) * (int64_t)sizeof(float);
    }
    return st;
}

static l3d_status ckpt_rows(void *ctx, int t, int64_t layer, int64_t r0, int64_t n, float *out) {
    const struct rows_src *s = ctx;
    const struct l3d_ckpt_manifest *mf = s->mf;
    const struct l3d_model_spec *c = &mf->cfg;
    struct l3d_tensor_info ts[L3D_NUM_TENSORS], tf[L3D_NUM_TENSORS];
    struct l3d_shard fs = l3d_shard_full(c);
    l3d_gpt_plan_tensors(c, &fs, tf);
    const int64_t fc = tf[t].cols;
    memset(out, 0xff, (size_t)(n * fc) * sizeof(float)); /* NaN where no file holds it */
    l3d_status st = L3D_OK;
    for (int f = 0; st == L3D_OK && f < mf->nfiles; f++) {
        const struct l3d_shard *sh = &mf->files[f].shard;
        bool first = true; /* the first file of this shard does the whole shard */
        for (int q = 0; q < f; q++) first &= !same_shard(&mf->files[q].shard, sh);
        l3d_gpt_plan_tensors(c, sh, ts);
        const struct l3d_tensor_info *a = &ts[t];
        int64_t l = layer - l3d_gpt_tensor_first(c, sh, t);
        if (!first || a->count == 0 || l < 0 || l >= a->layers) continue;
        int64_t ra = 0, rb, gr, gc;
        for (;; ra++) { /* the shard's rows in [r0, r0 + n): a run (rows only grow) */
            if (ra == a->rows) break;
            l3d_gpt_global_rc(c, sh, t, ra, 0, &gr, &gc);
            if (gr >= r0) break;
        }
        for (rb = ra; rb < a->rows; rb++) {
            l3d_gpt_global_rc(c, sh, t, rb, 0, &gr, &gc);
            if (gr >= r0 + n) break;
        }
        if (ra == rb) continue;
        int64_t y0 = a->offset + (l * a->rows + ra) * a->cols, y1 = y0 + (rb - ra) * a->cols;
        if (is_full(c, sh)) { /* its rows are the full rows: read in place */
            l3d_gpt_global_rc(c, sh, t, ra, 0, &gr, &gc);
            st = read_flat(s, f, y0, y1, out + (gr - r0) * fc);
            continue;
        }
        memset(s->tmp, 0xff, (size_t)(y1 - y0) * sizeof(float));
        st = read_flat(s, f, y0, y1, s->tmp);
        for (int64_t i = ra; st == L3D_OK && i < rb; i++)
            for (int64_t k = 0; k < a->cols; k++) {
                l3d_gpt_global_rc(c, sh, t, i, k, &gr, &gc);
                out[(gr - r0) * fc + gc] = s->tmp[(i - ra) * a->cols + k];
            }
    }
    return st;
}

/* Elements [q->lo, q->hi) of a chunk's parameters (sel 0) or moments (1, 2) from a checkpoint of
 * other shards, a strip at a time (l3d_ckpt_reshard). */
static l3d_status reshard(const struct l3d_ckpt_manifest *mf, const struct l3d_gpt *m, int sel,
                          const struct l3d_ckpt_pieces *q, int64_t *bytes) {
    if ((sel == 0 ? mf->pdt : mf->mdt) != L3D_F32) /* re-slicing works on fp32 host copies */
        return l3d_error(L3D_ERR_FORMAT, "%s stores the parameters as %s: only fp32 checkpoints "
                         "load on another layout than their own; resume on the layout it was "
                         "saved under", mf->path, l3d_dtype_name(mf->pdt));
    struct rows_src s = {mf, sel, l3d_try_alloc((size_t)l3d_ckpt_strip(&mf->cfg) *
                                                sizeof(float), "checkpoint rows"), bytes};
    if (!s.tmp) return no_memory(mf, l3d_ckpt_strip(&mf->cfg), "free host memory");
    struct l3d_ckpt_rows src = {ckpt_rows, &s};
    l3d_status st = l3d_ckpt_reshard(&mf->cfg, &m->shard, &src, q,
                                     sel == 0 ? "parameter" : sel == 1 ? "AdamW m" : "AdamW v",
                                     mf->path);
    l3d_free(s.tmp);
    return st;
}

struct to_device {
    struct l3d_backend *be;
    char *dst;        /* element lo of the range */
    int64_t lo;
};

static void put_device(void *ctx, int64_t off, int64_t n, const float *host) {
    const struct to_device *d = ctx;
    l3d_be_copy_h2d(d->be, d->dst + (off - d->lo) * (int64_t)sizeof(float), host,
                    (size_t)n * sizeof(float));
    l3d_be_sync(d->be); /* before host is refilled */
}

/* The elements [lo, hi) of a chunk's flat space into dst (device, fp32) a strip at a time. */
static l3d_status reshard_device(const struct l3d_ckpt_manifest *mf, const struct l3d_gpt *m,
                                 int sel, void *dst, int64_t lo, int64_t hi, int64_t *bytes) {
    struct to_device d = {m->be, dst, lo};
    struct l3d_ckpt_pieces q = {.piece = l3d_ckpt_strip(&mf->cfg), .lo = lo, .hi = hi,
                                .put = put_device, .ctx = &d};
    return reshard(mf, m, sel, &q, bytes);
}

/* A chunk's parameters: straight from a file of the same shard (staged to the device), else
 * resharded a strip at a time. */
static l3d_status load_params(const struct l3d_ckpt_manifest *mf, struct l3d_gpt *m,
                              int64_t *bytes) {
    char path[L3D_CKPT_PATH_CAP];
    for (int r = 0; r < mf->nfiles; r++) {
        const struct l3d_ckpt_mf_file *f = &mf->files[r];
        if (f->params && same_shard(&f->shard, &m->shard)) { /* in the chunk's type (checked) */
            file_path(mf, r, path, sizeof path);
            *bytes += m->num_params * l3d_ckpt_psize(mf);
            return l3d_ckpt_read_device(path, mf->header, m->be, m->params,
                                        (size_t)(m->num_params * l3d_ckpt_psize(mf)));
        }
    }
    return reshard_device(mf, m, 0, m->params, 0, m->num_params, bytes);
}

/* A chunk's parameters [lo, hi) handed over a piece at a time (pieces): read from a file of the
 * same shard through one host buffer of a piece, else resharded a strip at a time. */
static l3d_status load_pieces(const struct l3d_ckpt_manifest *mf, const struct l3d_gpt *m,
                              const struct l3d_ckpt_pieces *q, int64_t *bytes) {
    L3D_ASSERT(l3d_ckpt_psize(mf) == sizeof(float)); /* a view's type (checked) */
    char path[L3D_CKPT_PATH_CAP];
    l3d_status st = L3D_OK;
    for (int r = 0; r < mf->nfiles; r++) {
        const struct l3d_ckpt_mf_file *f = &mf->files[r];
        if (!f->params || !same_shard(&f->shard, &m->shard)) continue;
        file_path(mf, r, path, sizeof path);
        float *buf = l3d_try_alloc((size_t)(q->hi - q->lo < q->piece ? q->hi - q->lo : q->piece) *
                                   sizeof(float) + 1, "checkpoint piece");
        if (!buf) return no_memory(mf, q->piece, "free host memory");
        for (int64_t off = q->lo, n; st == L3D_OK && off < q->hi; off += n) {
            n = q->hi - off < q->piece ? q->hi - off : q->piece;
            st = l3d_ckpt_read_at(path, mf->header + off * (int64_t)sizeof(float), buf,
                                  (size_t)n * sizeof(float));
            if (st == L3D_OK) q->put(q->ctx, off, n, buf);
            *bytes += n * (int64_t)sizeof(float);
        }
        l3d_free(buf);
        return st;
    }
    return reshard(mf, m, 0, q, bytes);
}

/* A chunk's optimizer range: from the files of the same shard (their ranges intersected with
 * ours, staged to the device), else resharded a strip at a time. The moments live on the
 * chunk's device (m->be). */
static l3d_status load_moments(const struct l3d_ckpt_manifest *mf, const struct l3d_gpt *m,
                               struct l3d_adamw *opt, int64_t *bytes) {
    int64_t s0 = opt->start, s1 = opt->start + opt->n, covered = 0;
    const int64_t es = l3d_ckpt_msize(mf);
    bool same = false;
    char path[L3D_CKPT_PATH_CAP];
    l3d_status st = L3D_OK;
    for (int r = 0; st == L3D_OK && r < mf->nfiles; r++) {
        const struct l3d_ckpt_mf_file *f = &mf->files[r];
        if (!same_shard(&f->shard, &m->shard)) continue;
        same = true;
        int64_t lo = f->opt_start > s0 ? f->opt_start : s0;
        int64_t hi = f->opt_start + f->opt_count < s1 ? f->opt_start + f->opt_count : s1;
        if (hi <= lo) continue;
        file_path(mf, r, path, sizeof path);
        size_t nb = (size_t)((hi - lo) * es);
        st = l3d_ckpt_read_device(path, off_m(mf, f) + es * (lo - f->opt_start), m->be,
                                  opt->m + (lo - s0), nb);
        if (st == L3D_OK)
            st = l3d_ckpt_read_device(path, off_v(mf, f) + es * (lo - f->opt_start), m->be,
                                      opt->v + (lo - s0), nb);
        covered += hi - lo;
        *bytes += 2 * (int64_t)nb;
    }
    if (same || st != L3D_OK) {
        if (st == L3D_OK && covered != opt->n)
            st = l3d_error(L3D_ERR_FORMAT, "%s: the rank files hold %lld of the %lld optimizer "
                           "elements of this rank's range: the checkpoint is incomplete",
                           mf->path, (long long)covered, (long long)opt->n);
        return st;
    }
    for (int sel = 1; st == L3D_OK && sel <= 2; sel++)
        st = reshard_device(mf, m, sel, sel == 1 ? opt->m : opt->v, s0, s1, bytes);
    return st;
}

l3d_status l3d_ckpt_load(const char *dir, struct l3d_comm *world,
                         const struct l3d_ckpt_layout *lay, struct l3d_gpt *const *m,
                         struct l3d_adamw *opt, const struct l3d_ckpt_pieces *pieces,
                         struct l3d_ckpt_state *s, struct l3d_ckpt_io *io, bool *report) {
    double t0 = l3d_time_s();
    memset(io, 0, sizeof *io);
    const int nc = l3d_ckpt_chunks_of(lay);
    struct l3d_ckpt_manifest mf;
    l3d_status st = l3d_ckpt_manifest_read(dir, &mf);
    bool parsed = st == L3D_OK;
    const struct l3d_model_spec *a = &mf.cfg, *b = &m[0]->cfg;
    if (st == L3D_OK && !same_config(a, b))
        st = l3d_error(L3D_ERR_FORMAT, "%s holds a model L=%d C=%d NH=%d V=%d context=%d (%s, "
                       "%d key/value heads of %d, MLP %lld%s), not the configured L=%d C=%d NH=%d "
                       "V=%d context=%d (%s, %d of %d, %lld%s): give the model flags it was "
                       "trained with", mf.path, a->L, a->C, a->NH, a->V, a->maxT,
                       l3d_arch_name(a->arch), l3d_model_kv_heads(a), l3d_model_head_dim(a),
                       (long long)a->ffn, a->qk_norm ? ", qk-norm" : "", b->L, b->C, b->NH, b->V,
                       b->maxT, l3d_arch_name(b->arch), l3d_model_kv_heads(b),
                       l3d_model_head_dim(b), (long long)b->ffn, b->qk_norm ? ", qk-norm" : "");
    if (st == L3D_OK)
        st = check_dtypes(&mf, l3d_ckpt_params_dtype(m[0]), L3D_CKPT_MOMENTS_DTYPE,
                          "this run keeps",
                          "resume it with the precision it was saved in (an llm3d build and "
                          "flags that train in those types)");
    if (st == L3D_OK) st = l3d_ckpt_manifest_check_layout(&mf);
    /* the files of this rank's own pieces, when they hold what a chunk needs (the same layout),
     * are loaded by the pass that verifies them */
    struct seg *segs = l3d_calloc((size_t)nc * 3 * sizeof *segs, "checkpoint segments");
    bool *own = l3d_calloc((size_t)nc * 2 * sizeof *own, "checkpoint segments");
    int nseg = 0;
    for (int c = 0; st == L3D_OK && c < nc && world->rank < mf.lay.world; c++) {
        for (int k = 0; k < mf.nc; k++) {
            int i = world->rank * mf.nc + k;
            const struct l3d_ckpt_mf_file *f = &mf.files[i];
            if (!same_shard(&f->shard, &m[c]->shard)) continue;
            if (f->params && m[c]->params) { /* else a piece at a time (load_pieces) */
                segs[nseg++] = (struct seg){i, mf.header, l3d_ckpt_psize(&mf) * f->params, m[c]->be,
                                            m[c]->params};
                own[2 * c] = true;
            }
            if (f->opt_start == opt[c].start && f->opt_count == opt[c].n && opt[c].n > 0) {
                int64_t nb = l3d_ckpt_msize(&mf) * f->opt_count;
                segs[nseg++] = (struct seg){i, off_m(&mf, f), nb, m[c]->be, opt[c].m};
                segs[nseg++] = (struct seg){i, off_v(&mf, f), nb, m[c]->be, opt[c].v};
                own[2 * c + 1] = true;
            }
            break;
        }
    }
    int64_t bytes = 0;
    if (st == L3D_OK) st = check_files(&mf, world->rank, world->size, segs, nseg, &bytes);
    if ((st = l3d_comm_agree(world, st, report)) == L3D_OK) {
        for (int c = 0; st == L3D_OK && c < nc; c++) {
            bool q = pieces && pieces[c].piece > 0;
            L3D_ASSERT(q || m[c]->params);
            if (q) st = load_pieces(&mf, m[c], &pieces[c], &bytes);
            else if (!own[2 * c]) st = load_params(&mf, m[c], &bytes);
            if (st == L3D_OK && !own[2 * c + 1]) st = load_moments(&mf, m[c], &opt[c], &bytes);
        }
        io->bytes_rank = bytes;
        st = l3d_comm_agree(world, st, report);
    }
    l3d_free(segs);
    l3d_free(own);
    if (st == L3D_OK) {
        *s = mf.st;
        s->layout = mf.lay;
        for (int c = 0; c < nc; c++) opt[c].t = mf.st.adamw_t;
        for (int r = 0; r < mf.nfiles; r++) io->bytes_total += mf.files[r].bytes;
    }
    if (parsed) l3d_ckpt_manifest_free(&mf);
    io->seconds = l3d_time_s() - t0;
    return st;
}

l3d_status l3d_ckpt_resolve(const char *spec, const char *root, char *dir, size_t cap) {
    dir[0] = '\0';
    bool autom = strcmp(spec, "auto") == 0;
    const char *base = autom ? root : spec;
    if (!base)
        return l3d_error(L3D_ERR_ARG, "--resume auto looks in the checkpoint directory: give --out "
                         "or --ckpt-dir");
    char path[L3D_CKPT_PATH_CAP];
    struct stat sb;
    if (l3d_ckpt_long_path(base) != L3D_OK) return L3D_ERR_ARG;
    l3d_ckpt_join(path, sizeof path, base, "/", "manifest");
    if (!autom && stat(path, &sb) == 0) {
        l3d_ckpt_join(dir, cap, base, "", "");
        return L3D_OK;
    }
    l3d_ckpt_join(path, sizeof path, base, "/", "latest");
    if (stat(path, &sb) != 0) {
        if (autom && errno == ENOENT) return L3D_OK; /* nothing saved yet: a fresh start */
        return l3d_error(L3D_ERR_IO, "%s: no checkpoint there (%s: %s); give a step "
                         "directory (holding a manifest) or a checkpoint directory (holding "
                         "`latest`)", spec, path, strerror(errno));
    }
    FILE *f; /* a FIFO would block the open, a device never end a line: refused unread */
    l3d_status st = l3d_fopen_regular(path, "checkpoint pointer", &f, NULL);
    if (st != L3D_OK) return st;
    char name[256] = "";
    bool ok = fgets(name, sizeof name, f) != NULL;
    fclose(f);
    name[strcspn(name, "\n")] = '\0';
    if (!ok || strncmp(name, "step_", 5) != 0 || strchr(name, '/'))
        return l3d_error(L3D_ERR_FORMAT, "%s: '%s' is not a step directory name", path, name);
    if ((size_t)snprintf(dir, cap, "%s/%s", base, name) >= cap)
        return l3d_error(L3D_ERR_ARG, "checkpoint path too long: %s/%s", base, name);
    return L3D_OK;
}

l3d_status l3d_ckpt_read_config(const char *dir, struct l3d_model_spec *cfg, int64_t *step) {
    struct l3d_ckpt_manifest mf;
    l3d_status st = l3d_ckpt_manifest_read(dir, &mf);
    if (st != L3D_OK) return st;
    *cfg = mf.cfg;
    *step = mf.st.step;
    l3d_ckpt_manifest_free(&mf);
    struct l3d_model_spec c = *cfg;
    if (l3d_gpt_config_finish(&c) != L3D_OK || c.Vp != cfg->Vp)
        return l3d_error(L3D_ERR_FORMAT, "%s/manifest: model record L=%d C=%d NH=%d V=%d Vp=%d "
                         "is not a valid GPT-2 config", dir, cfg->L, cfg->C, cfg->NH, cfg->V,
                         cfg->Vp);
    return L3D_OK;
}

l3d_status l3d_ckpt_export_llmc(const char *dir, const char *path) {
    return l3d_ckpt_export_llmc_dt(dir, path, L3D_F32);
}

l3d_status l3d_ckpt_read_full(const char *dir, struct l3d_model_spec *cfg, float **out) {
    int64_t step;
    *out = NULL;
    l3d_status st = l3d_ckpt_read_config(dir, cfg, &step);
    if (st != L3D_OK) return st;
    struct l3d_ckpt_manifest mf;
    if ((st = l3d_ckpt_manifest_read(dir, &mf)) != L3D_OK) return st;
    st = check_dtypes(&mf, L3D_F32, mf.mdt, "a model file holds",
                      "llm3d convert reads checkpoints with fp32 parameters only");
    if (st == L3D_OK) st = l3d_ckpt_manifest_check_layout(&mf);
    int64_t N = l3d_gpt_param_count(cfg), bytes = 0;
    if (st == L3D_OK) st = check_files(&mf, 0, 1, NULL, 0, &bytes);
    float *full = st == L3D_OK ? alloc_nan(N, "full model") : NULL;
    if (st == L3D_OK && !full) st = no_memory(&mf, N, "convert on a machine with more memory");
    if (st == L3D_OK) st = assemble_full(&mf, 0, full, &bytes);
    if (st == L3D_OK) st = check_no_nan(&mf, full, N, "parameter");
    l3d_ckpt_manifest_free(&mf);
    if (st == L3D_OK) *out = full;
    else l3d_free(full);
    return st;
}

l3d_status l3d_ckpt_export_llmc_dt(const char *dir, const char *path, enum l3d_dtype dt) {
    struct l3d_model_spec cfg;
    float *full;
    l3d_status st = l3d_ckpt_read_full(dir, &cfg, &full);
    if (st == L3D_OK) st = l3d_ckpt_save_llmc_params_dt(path, &cfg, full,
                                                        l3d_gpt_param_count(&cfg), dt);
    l3d_free(full);
    return st;
}

l3d_status l3d_ckpt_inspect(const char *dir, struct l3d_ckpt_info *info) {
    memset(info, 0, sizeof *info);
    struct l3d_ckpt_manifest mf;
    l3d_status st = l3d_ckpt_manifest_read(dir, &mf);
    if (st != L3D_OK) return st;
    *info = (struct l3d_ckpt_info){.format = mf.format, .cfg = mf.cfg, .layout = mf.lay,
                                   .state = mf.st, .params_dtype = l3d_dtype_name(mf.pdt),
                                   .moments_dtype = l3d_dtype_name(mf.mdt), .nfiles = mf.nfiles};
    for (int r = 0; r < mf.nfiles; r++) info->bytes += mf.files[r].bytes;
    int64_t read = 0;
    st = l3d_ckpt_manifest_check_layout(&mf);
    if (st == L3D_OK) st = check_files(&mf, 0, 1, NULL, 0, &read);
    l3d_ckpt_manifest_free(&mf);
    return st;
}
