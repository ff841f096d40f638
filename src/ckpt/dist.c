/* Sharded, atomic training checkpoints; loading on any layout (include/llm3d/ckpt.h). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt-impl.h"
#include "llm3d/ckpt.h"

#define PATH_CAP 4096
#define HEADER_BYTES 128    /* of a rank file from format 3 on */
#define HEADER_BYTES_OLD 64 /* formats 1 and 2: no dtype names */
static const char file_magic[8] = "L3DSHRD1";

/* ---- element types -------------------------------------------------------------------------
 * On disk a dtype is its name (l3d_dtype_name: manifest `dtype` record, rank-file header), never
 * the enum's number. The element types a chunk keeps its parameters and AdamW moments in: fp32 in this
 * build (float buffers); a mixed-precision model and optimizer will say their own here. */
static const char *dtype_name(enum l3d_dtype t) { return l3d_dtype_name(t); }

/* The floating-point types a tensor can be stored in; false for anything else. */
static bool dtype_parse(const char *s, enum l3d_dtype *t) {
    enum l3d_dtype k;
    if (l3d_dtype_parse(s, &k) != L3D_OK) return false; /* the caller says what is wrong */
    if (k != L3D_F32 && k != L3D_F64 && k != L3D_BF16 && k != L3D_F16) return false;
    *t = k;
    return true;
}

static enum l3d_dtype params_dtype(const struct l3d_gpt *m) {
    (void)m;
    return L3D_F32;
}

static enum l3d_dtype moments_dtype(const struct l3d_adamw *opt) {
    (void)opt;
    return L3D_F32;
}

/* A host staging buffer for transfers of up to `want` bytes (l3d_ckpt_stage_cap: 64 MiB). */
struct stage {
    void *p;
    size_t cap;
};

static l3d_status stage_init(struct stage *sg, size_t want, const char *path) {
    sg->cap = l3d_ckpt_stage_cap(want);
    sg->p = l3d_try_alloc(sg->cap, "checkpoint staging");
    if (!sg->p)
        return l3d_error(L3D_ERR_OOM, "%s: no host memory for a %zu-byte staging buffer of the "
                         "checkpoint", path, sg->cap);
    return L3D_OK;
}

/* ---- checksum ------------------------------------------------------------------------------
 * 64-bit, four independent lanes over 8-byte little-endian words, so it runs at memory speed: the
 * round of xxHash64 (Y. Collet, xxhash.com spec: acc = rotl(acc + w * P2, 31) * P1, with its
 * primes), the lanes and the length folded by the SplitMix64 finaliser (Steele et al. 2014). An
 * integrity check against truncation and bit flips, not a cryptographic hash. */
#define P1 0x9E3779B185EBCA87ULL
#define P2 0xC2B2AE3D27D4EB4FULL

struct hasher {
    uint64_t lane[4];
    uint8_t pend[32];
    int npend;
    uint64_t len;
};

static uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static void hash_init(struct hasher *h) {
    memset(h, 0, sizeof *h);
    for (int i = 0; i < 4; i++) h->lane[i] = P1 * (uint64_t)(i + 1);
}

static void hash_block(struct hasher *h, const uint8_t *p) {
    for (int i = 0; i < 4; i++) {
        uint64_t w;
        memcpy(&w, p + 8 * i, 8);
        h->lane[i] = rotl(h->lane[i] + w * P2, 31) * P1;
    }
}

static void hash_update(struct hasher *h, const void *data, size_t n) {
    const uint8_t *p = data;
    h->len += n;
    if (h->npend) {
        size_t k = 32 - (size_t)h->npend < n ? 32 - (size_t)h->npend : n;
        memcpy(h->pend + h->npend, p, k);
        h->npend += (int)k;
        p += k;
        n -= k;
        if (h->npend < 32) return;
        hash_block(h, h->pend);
        h->npend = 0;
    }
    for (; n >= 32; p += 32, n -= 32) hash_block(h, p);
    memcpy(h->pend, p, n);
    h->npend = (int)n;
}

static uint64_t hash_final(const struct hasher *h) {
    uint8_t tail[32] = {0};
    memcpy(tail, h->pend, (size_t)h->npend);
    struct hasher c = *h;
    hash_block(&c, tail);
    uint64_t r = mix(c.len);
    for (int i = 0; i < 4; i++) r = mix(r ^ c.lane[i]);
    return r;
}

/* ---- files ---------------------------------------------------------------------------------- */

/* buf = a + sep + b; every entry point checks its paths against PATH_CAP first (long_path). */
static void join(char *buf, size_t cap, const char *a, const char *sep, const char *b) {
    int n = snprintf(buf, cap, "%s%s%s", a, sep, b);
    L3D_ASSERT(n >= 0 && (size_t)n < cap);
}

static l3d_status long_path(const char *p) {
    if (strlen(p) < PATH_CAP - 128) return L3D_OK;
    return l3d_error(L3D_ERR_ARG, "checkpoint path too long (%zu characters, at most %d): %.80s...",
                     strlen(p), PATH_CAP - 129, p);
}

static l3d_status write_all(int fd, const char *path, const void *buf, size_t n,
                            struct hasher *h) {
    if (h) hash_update(h, buf, n);
    const char *p = buf;
    while (n > 0) {
        ssize_t k = write(fd, p, n > (1u << 30) ? (1u << 30) : n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return l3d_error(L3D_ERR_IO, "cannot write %s: %s", path, strerror(errno));
        p += k;
        n -= (size_t)k;
    }
    return L3D_OK;
}

static l3d_status read_at(const char *path, int64_t off, void *buf, size_t n) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return l3d_error(L3D_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    char *p = buf;
    while (n > 0) {
        ssize_t k = pread(fd, p, n > (1u << 30) ? (1u << 30) : n, (off_t)off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            int e = errno;
            close(fd);
            return l3d_error(L3D_ERR_FORMAT, "%s: cannot read %zu bytes at offset %lld: %s", path,
                             n, (long long)off, k == 0 ? "file too short" : strerror(e));
        }
        p += k;
        n -= (size_t)k;
        off += k;
    }
    close(fd);
    return L3D_OK;
}

/* n bytes of device memory at src, copied to the host a staging buffer at a time, written. */
static l3d_status write_device(int fd, const char *path, struct l3d_backend *be, const void *src,
                               size_t n, const struct stage *sg, struct hasher *h) {
    l3d_status st = L3D_OK;
    for (size_t done = 0, k; st == L3D_OK && done < n; done += k) {
        k = n - done < sg->cap ? n - done : sg->cap;
        l3d_be_copy_d2h(be, sg->p, (const char *)src + done, k);
        st = write_all(fd, path, sg->p, k, h);
    }
    return st;
}

/* n bytes at off of path into device memory at dst, a staging buffer at a time. A copy to the
 * device may read its host buffer until the backend is synchronised: every h2d here is followed
 * by l3d_be_sync before that buffer is refilled or freed. */
static l3d_status read_device(const char *path, int64_t off, struct l3d_backend *be, void *dst,
                              size_t n) {
    struct stage sg;
    l3d_status st = stage_init(&sg, n, path);
    for (size_t done = 0, k; st == L3D_OK && done < n; done += k) {
        k = n - done < sg.cap ? n - done : sg.cap;
        st = read_at(path, off + (int64_t)done, sg.p, k);
        if (st == L3D_OK) l3d_be_copy_h2d(be, (char *)dst + done, sg.p, k);
        l3d_be_sync(be);
    }
    l3d_free(sg.p);
    return st;
}

static l3d_status fsync_path(const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return l3d_error(L3D_ERR_IO, "cannot open %s to sync it: %s", path, strerror(errno));
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    if (rc != 0) return l3d_error(L3D_ERR_IO, "cannot sync %s: %s", path, strerror(e));
    return L3D_OK;
}

/* Writes text to path atomically: path.tmp, fsync, rename, fsync of the directory dir. */
static l3d_status write_text_atomic(const char *path, const char *dir, const char *text) {
    char tmp[PATH_CAP];
    join(tmp, sizeof tmp, path, "", ".tmp");
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return l3d_error(L3D_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
    l3d_status st = write_all(fd, tmp, text, strlen(text), NULL);
    if (st == L3D_OK && fsync(fd) != 0)
        st = l3d_error(L3D_ERR_IO, "cannot sync %s: %s", tmp, strerror(errno));
    close(fd);
    if (st == L3D_OK && rename(tmp, path) != 0)
        st = l3d_error(L3D_ERR_IO, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
    if (st != L3D_OK) unlink(tmp);
    return st == L3D_OK ? fsync_path(dir) : st;
}

/* Removes a directory of plain files (a step or temporary directory; nothing nested). */
static void remove_dir(const char *path) {
    DIR *d = opendir(path);
    if (!d) return;
    struct dirent *e;
    char p[PATH_CAP];
    while ((e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        join(p, sizeof p, path, "/", e->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(path);
}

/* Test hook: L3D_CKPT_TEST_KILL="STEP:PHASE[:RANK]" makes that rank SIGKILL itself at PHASE of
 * the save of STEP (shard: half-way through its rank file; rename: files and manifest written, the
 * directory not yet in place; latest: in place, `latest` not yet updated). The crash tests use it
 * to stop a writer at each point deterministically. */
static void test_kill(int64_t step, const char *phase, int rank) {
    const char *v = getenv("L3D_CKPT_TEST_KILL");
    if (!v) return;
    long long s = -1;
    int r = -1;
    char ph[32] = "";
    if (sscanf(v, "%lld:%31[a-z]:%d", &s, ph, &r) < 2) return;
    if (s == step && strcmp(ph, phase) == 0 && (r < 0 || r == rank)) raise(SIGKILL);
}

/* ---- save ----------------------------------------------------------------------------------- */

/* What each rank tells rank 0 about each of its files (one per chunk), gathered as bytes. */
struct rank_rec {
    int64_t status, bytes, params, opt_start, opt_count;
    uint64_t hash;
    int64_t tp_rank, pp_rank, dp_rank, chunk;
    int64_t layer_start, layer_count, head_start, head_count, ffn_start, ffn_count, vocab_start,
        vocab_count, has_embedding, has_head;
};

static void step_name(char *buf, size_t cap, int64_t step) {
    snprintf(buf, cap, "step_%08lld", (long long)step);
}

/* The name of the file of chunk `chunk` of rank `rank`, with nc chunks per rank. */
static void piece_name(char *buf, size_t cap, int nc, int rank, int chunk) {
    if (nc == 1)
        snprintf(buf, cap, "rank_%05d.bin", rank);
    else
        snprintf(buf, cap, "rank_%05d_c%d.bin", rank, chunk);
}

/* What one piece's file holds: its parameters (np elements of pdt; device memory of be) and its
 * optimizer range of the moments m and v (ocount elements of mdt each, from start ostart). */
struct piece {
    int rank;
    int64_t chunk, step;
    struct l3d_backend *be;
    const void *params, *m, *v;
    int64_t np, ostart, ocount;
    enum l3d_dtype pdt, mdt;
};

static l3d_status write_rank_file(const char *path, const struct piece *pc,
                                  struct rank_rec *rec) {
    const size_t pbytes = (size_t)pc->np * l3d_dtype_size(pc->pdt);
    const size_t mbytes = (size_t)pc->ocount * l3d_dtype_size(pc->mdt);
    rec->bytes = HEADER_BYTES + (int64_t)(pbytes + 2 * mbytes);
    struct stage sg;
    l3d_status st = stage_init(&sg, pbytes > mbytes ? pbytes : mbytes, path);
    if (st != L3D_OK) return st;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        l3d_free(sg.p);
        return l3d_error(L3D_ERR_IO, "cannot create %s: %s", path, strerror(errno));
    }
    struct hasher h;
    hash_init(&h);
    uint8_t hdr[HEADER_BYTES] = {0};
    int64_t f[5] = {L3D_CKPT_FORMAT, pc->rank, pc->step, pc->np, pc->ocount};
    memcpy(hdr, file_magic, 8);
    memcpy(hdr + 8, f, sizeof f);
    memcpy(hdr + 48, &pc->ostart, 8);
    memcpy(hdr + 56, &pc->chunk, 8);
    memcpy(hdr + 64, dtype_name(pc->pdt), strlen(dtype_name(pc->pdt))); /* NUL-padded to 8 */
    memcpy(hdr + 72, dtype_name(pc->mdt), strlen(dtype_name(pc->mdt)));
    st = write_all(fd, path, hdr, sizeof hdr, &h);
    if (st == L3D_OK) st = write_device(fd, path, pc->be, pc->params, pbytes, &sg, &h);
    if (st == L3D_OK && pc->ocount > 0) {
        st = write_device(fd, path, pc->be, pc->m, mbytes / 2, &sg, &h); /* the crash point */
        if (pc->chunk == 0) test_kill(pc->step, "shard", pc->rank);
        if (st == L3D_OK)
            st = write_device(fd, path, pc->be, (const char *)pc->m + mbytes / 2,
                              mbytes - mbytes / 2, &sg, &h);
        if (st == L3D_OK) st = write_device(fd, path, pc->be, pc->v, mbytes, &sg, &h);
    }
    if (st == L3D_OK && fsync(fd) != 0)
        st = l3d_error(L3D_ERR_IO, "cannot sync %s: %s", path, strerror(errno));
    if (close(fd) != 0 && st == L3D_OK)
        st = l3d_error(L3D_ERR_IO, "cannot close %s: %s", path, strerror(errno));
    l3d_free(sg.p);
    rec->hash = hash_final(&h);
    return st;
}

static void shard_to_rec(const struct l3d_shard *s, struct rank_rec *r) {
    r->layer_start = s->layer_start;
    r->layer_count = s->layer_count;
    r->head_start = s->head_start;
    r->head_count = s->head_count;
    r->ffn_start = s->ffn_start;
    r->ffn_count = s->ffn_count;
    r->vocab_start = s->vocab_start;
    r->vocab_count = s->vocab_count;
    r->has_embedding = s->has_embedding;
    r->has_head = s->has_head;
}

static int chunks_of(const struct l3d_ckpt_layout *lay) {
    return lay->pp_virtual > 1 ? lay->pp_virtual : 1;
}

static void print_manifest(char *buf, size_t cap, const struct l3d_gpt_config *c,
                           enum l3d_dtype pdt, enum l3d_dtype mdt,
                           const struct l3d_ckpt_layout *lay, const struct l3d_ckpt_state *s,
                           const struct rank_rec *recs) {
    size_t n = 0;
    const int nc = chunks_of(lay);
#define OUT(...) n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, __VA_ARGS__)
    OUT("llm3d-checkpoint format %d\n", L3D_CKPT_FORMAT);
    OUT("step %lld\n", (long long)s->step);
    if (s->run_id) OUT("run %016" PRIx64 "\n", s->run_id);
    OUT("model L %d C %d NH %d V %d Vp %d maxT %d\n", c->L, c->C, c->NH, c->V, c->Vp, c->maxT);
    OUT("dtype params %s moments %s\n", dtype_name(pdt), dtype_name(mdt));
    OUT("layout world %d tp %d pp %d dp %d zero %d sp %d virtual %d\n", lay->world, lay->tp,
        lay->pp, lay->dp, lay->zero, lay->sequence_parallel ? 1 : 0, nc);
    OUT("data epoch %lld index %lld B %d T %d accum %d seed %" PRIu64 "\n",
        (long long)s->loader.epoch, (long long)s->loader.index, s->B, s->T, s->accum, s->seed);
    OUT("schedule max_lr %a min_lr %a warmup %d total %d\n", (double)s->sched.max_lr,
        (double)s->sched.min_lr, s->sched.warmup_steps, s->sched.total_steps);
    OUT("adamw beta1 %a beta2 %a eps %a weight_decay %a grad_clip %a t %lld\n",
        (double)s->adamw.beta1, (double)s->adamw.beta2, (double)s->adamw.eps,
        (double)s->adamw.weight_decay, (double)s->adamw.grad_clip, (long long)s->adamw_t);
    if (s->loss_scale > 0)
        OUT("lossscale scale %a good %lld hysteresis %lld\n", s->loss_scale,
            (long long)s->ls_good, (long long)s->ls_hyst);
    for (int i = 0; i < lay->world * nc; i++) {
        const struct rank_rec *q = &recs[i];
        char fname[64];
        piece_name(fname, sizeof fname, nc, i / nc, (int)q->chunk);
        OUT("file rank %d chunk %lld tp %lld pp %lld dp %lld name %s bytes %lld hash %016" PRIx64
            " params %lld opt_start %lld opt_count %lld layers %lld+%lld heads %lld+%lld ffn %lld+"
            "%lld vocab %lld+%lld embedding %lld head %lld\n",
            i / nc, (long long)q->chunk, (long long)q->tp_rank, (long long)q->pp_rank,
            (long long)q->dp_rank, fname, (long long)q->bytes, q->hash, (long long)q->params,
            (long long)q->opt_start, (long long)q->opt_count, (long long)q->layer_start,
            (long long)q->layer_count, (long long)q->head_start, (long long)q->head_count,
            (long long)q->ffn_start, (long long)q->ffn_count, (long long)q->vocab_start,
            (long long)q->vocab_count, (long long)q->has_embedding, (long long)q->has_head);
    }
    /* format 4: the checksum of every byte above it (the manifest's own integrity) */
    L3D_ASSERT(n < cap);
    struct hasher h;
    hash_init(&h);
    hash_update(&h, buf, n);
    OUT("checksum %016" PRIx64 "\n", hash_final(&h));
    OUT("end\n");
#undef OUT
    L3D_ASSERT(n < cap);
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

bool l3d_ckpt_is_step_name(const char *name) {
    if (strncmp(name, "step_", 5) != 0 || strlen(name) < 13) return false;
    for (const char *p = name + 5; *p; p++)
        if (*p < '0' || *p > '9') return false;
    return true;
}

/* The records before the file lines (the run id among them) fit in this many bytes of any
 * manifest this llm3d writes; a run id read stops there (a device or a huge file is not read
 * on). */
#define MANIFEST_HEAD_BYTES 8192

l3d_status l3d_ckpt_run_id(const char *dir, uint64_t *id) {
    char path[PATH_CAP], head[MANIFEST_HEAD_BYTES + 1];
    struct stat sb;
    *id = 0;
    if (long_path(dir) != L3D_OK) return L3D_ERR_ARG;
    join(path, sizeof path, dir, "/", "manifest");
    if (lstat(path, &sb) != 0 && errno == ENOENT) return L3D_OK; /* none: no id */
    /* a FIFO or a device (a symbolic link to /dev/zero) is refused, never read */
    int fd;
    l3d_status st = l3d_open_regular(path, "checkpoint manifest", &fd, NULL);
    if (st != L3D_OK) return st;
    ssize_t n;
    do n = read(fd, head, MANIFEST_HEAD_BYTES);
    while (n < 0 && errno == EINTR);
    int e = errno;
    close(fd);
    if (n < 0) return l3d_error(L3D_ERR_IO, "cannot read %s: %s", path, strerror(e));
    head[n] = '\0';
    unsigned long long x;
    for (char *line = head, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = '\0';
        if (strncmp(line, "file ", 5) == 0) break; /* the records before the file lines hold it */
        if (sscanf(line, "run %llx", &x) == 1) {
            *id = x;
            break;
        }
    }
    return L3D_OK;
}

/* Removes step directories below `step` beyond the newest `keep` of this run's (newer ones are
 * left alone: they belong to a run this one was resumed before). Only exact step names whose
 * manifest is this run's: a user's step_00000003.bak, or another run's checkpoint, stays. */
static void prune(const char *root, int64_t step, int keep, uint64_t run_id) {
    DIR *d = opendir(root);
    if (!d) return;
    char *names[4096];
    int n = 0;
    struct dirent *e;
    char cur[64], p[PATH_CAP], m[PATH_CAP];
    struct stat sb;
    step_name(cur, sizeof cur, step);
    while ((e = readdir(d)) && n < 4096) {
        if (!l3d_ckpt_is_step_name(e->d_name) || strcmp(e->d_name, cur) > 0) continue;
        join(p, sizeof p, root, "/", e->d_name);
        join(m, sizeof m, p, "/", "manifest");
        /* a checkpoint (it has a manifest) of this run (0: of callers that set no id) */
        uint64_t id;
        if (stat(m, &sb) == 0 && l3d_ckpt_run_id(p, &id) == L3D_OK && id == run_id)
            names[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], cmp_str);
    for (int i = 0; i < n; i++) {
        if (i < n - keep) {
            join(p, sizeof p, root, "/", names[i]);
            remove_dir(p);
        }
        free(names[i]);
    }
}

l3d_status l3d_ckpt_clear(const char *root, int *removed) {
    if (removed) *removed = 0;
    l3d_status st = long_path(root);
    if (st != L3D_OK) return st;
    DIR *d = opendir(root);
    if (!d) return errno == ENOENT ? L3D_OK
                                   : l3d_error(L3D_ERR_IO, "cannot read %s: %s", root,
                                               strerror(errno));
    struct dirent *e;
    char p[PATH_CAP], m[PATH_CAP];
    struct stat sb;
    while ((e = readdir(d))) {
        join(p, sizeof p, root, "/", e->d_name);
        if (strcmp(e->d_name, "latest") == 0 || strcmp(e->d_name, "latest.tmp") == 0) {
            if (unlink(p) != 0 && st == L3D_OK)
                st = l3d_error(L3D_ERR_IO, "cannot remove %s: %s", p, strerror(errno));
        } else if (l3d_ckpt_is_step_name(e->d_name) || strncmp(e->d_name, ".tmp_step_", 10) == 0) {
            join(m, sizeof m, p, "/", "manifest");
            if (e->d_name[0] == 's' && stat(m, &sb) != 0) continue; /* not a checkpoint */
            remove_dir(p);
            if (stat(p, &sb) == 0 && st == L3D_OK)
                st = l3d_error(L3D_ERR_IO, "cannot remove %s (files of another program in it?)",
                               p);
            else if (removed && e->d_name[0] == 's')
                (*removed)++;
        }
    }
    closedir(d);
    return st;
}

/* Rank 0's part: manifest, rename into place, `latest`, pruning. */
static l3d_status publish(const char *root, const char *tmp, int keep,
                          const struct l3d_gpt_config *cfg, enum l3d_dtype pdt,
                          enum l3d_dtype mdt, const struct l3d_ckpt_layout *lay,
                          const struct l3d_ckpt_state *s, const struct rank_rec *recs) {
    size_t cap = 4096 + (size_t)lay->world * (size_t)chunks_of(lay) * 512;
    char *text = l3d_alloc(cap, "checkpoint manifest");
    print_manifest(text, cap, cfg, pdt, mdt, lay, s, recs);
    char path[PATH_CAP], dst[PATH_CAP], name[64];
    join(path, sizeof path, tmp, "/", "manifest");
    l3d_status st = write_text_atomic(path, tmp, text);
    l3d_free(text);
    if (st != L3D_OK) return st;
    test_kill(s->step, "rename", 0);
    step_name(name, sizeof name, s->step);
    join(dst, sizeof dst, root, "/", name);
    /* a directory of the same step (a run resumed from an earlier step) is swapped atomically */
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, dst, RENAME_EXCHANGE) == 0) {
        remove_dir(tmp);
    } else if (errno == ENOENT) {
        if (rename(tmp, dst) != 0)
            return l3d_error(L3D_ERR_IO, "cannot rename %s to %s: %s", tmp, dst, strerror(errno));
    } else {
        return l3d_error(L3D_ERR_IO, "cannot replace %s: %s", dst, strerror(errno));
    }
    if ((st = fsync_path(root)) != L3D_OK) return st;
    test_kill(s->step, "latest", 0);
    char line[80];
    snprintf(line, sizeof line, "%s\n", name);
    join(path, sizeof path, root, "/", "latest");
    if ((st = write_text_atomic(path, root, line)) != L3D_OK) return st;
    prune(root, s->step, keep, s->run_id);
    return L3D_OK;
}

l3d_status l3d_ckpt_save(const char *root, int keep, struct l3d_comm *world,
                         const struct l3d_ckpt_layout *lay, const struct l3d_ckpt_state *s,
                         struct l3d_gpt *const *m, const struct l3d_adamw *opt,
                         struct l3d_ckpt_io *io, bool *report) {
    double t0 = l3d_time_s();
    memset(io, 0, sizeof *io);
    char tmp[PATH_CAP] = "", name[64];
    step_name(name, sizeof name, s->step);
    l3d_status st = long_path(root);
    if (st == L3D_OK) join(tmp, sizeof tmp, root, "/.tmp_", name);
    if (st == L3D_OK && world->rank == 0) {
        st = l3d_mkdir_p(root);
        DIR *d = st == L3D_OK ? opendir(root) : NULL;
        struct dirent *e;
        char p[PATH_CAP];
        while (d && (e = readdir(d))) /* left by a save that crashed */
            if (strncmp(e->d_name, ".tmp_", 5) == 0) {
                join(p, sizeof p, root, "/", e->d_name);
                remove_dir(p);
            }
        if (d) closedir(d);
        if (st == L3D_OK && mkdir(tmp, 0755) != 0)
            st = l3d_error(L3D_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
    }
    if ((st = l3d_comm_agree(world, st, report)) != L3D_OK) return st;

    /* parameters from data-parallel rank 0; moments from every rank with ZeRO, else rank 0;
     * each chunk its own file */
    bool wparams = lay->dp_rank == 0, wmoments = lay->zero > 0 || lay->dp_rank == 0;
    const int nc = chunks_of(lay);
    const enum l3d_dtype pdt = params_dtype(m[0]), mdt = moments_dtype(&opt[0]);
    struct rank_rec *recs =
        l3d_calloc((size_t)world->size * (size_t)nc * sizeof *recs, "checkpoint records");
    for (int c = 0; c < nc && st == L3D_OK; c++) {
        struct rank_rec *me = &recs[world->rank * nc + c];
        me->params = wparams ? m[c]->num_params : 0;
        me->opt_start = wmoments ? opt[c].start : 0;
        me->opt_count = wmoments ? opt[c].n : 0;
        me->tp_rank = lay->tp_rank;
        me->pp_rank = lay->pp_rank;
        me->dp_rank = lay->dp_rank;
        me->chunk = c;
        shard_to_rec(&m[c]->shard, me);
        char path[PATH_CAP], fname[64];
        piece_name(fname, sizeof fname, nc, world->rank, c);
        join(path, sizeof path, tmp, "/", fname);
        /* every chunk of every rank in the same types: the manifest says them once */
        L3D_ASSERT(params_dtype(m[c]) == pdt && moments_dtype(&opt[c]) == mdt);
        const struct piece pc = {
            .rank = world->rank, .chunk = c, .step = s->step, .be = m[c]->be,
            .params = m[c]->params, .np = me->params, .pdt = pdt,
            .m = opt[c].m, .v = opt[c].v, .ostart = me->opt_start, .ocount = me->opt_count,
            .mdt = mdt};
        st = write_rank_file(path, &pc, me);
        me->status = st;
        io->bytes_rank += me->bytes;
    }
    if ((st = l3d_comm_agree(world, st, report)) == L3D_OK) {
        if (world->size > 1)
            l3d_comm_all_gather(world, recs, (int64_t)sizeof *recs * nc, L3D_U8, NULL);
        if (world->rank == 0) st = publish(root, tmp, keep, &m[0]->cfg, pdt, mdt, lay, s, recs);
        st = l3d_comm_agree(world, st, report);
    }
    /* a failed save leaves no temporary directory behind (once every rank is done writing) */
    if (st != L3D_OK && world->rank == 0 && tmp[0]) remove_dir(tmp);
    for (int i = 0; i < world->size * nc; i++) io->bytes_total += recs[i].bytes;
    l3d_free(recs);
    io->seconds = l3d_time_s() - t0;
    return st;
}

/* ---- manifest ------------------------------------------------------------------------------- */

struct mf_file {
    int rank, chunk, tp_rank, pp_rank, dp_rank;
    char name[64];
    int64_t bytes, params, opt_start, opt_count;
    uint64_t hash;
    struct l3d_shard shard;
};

struct manifest {
    char path[PATH_CAP]; /* of the manifest, for messages */
    char dir[PATH_CAP];
    struct l3d_gpt_config cfg;
    struct l3d_ckpt_layout lay;
    struct l3d_ckpt_state st;
    int format, nc;        /* format version; chunks per rank (lay.pp_virtual, 1 in format 1) */
    enum l3d_dtype pdt, mdt; /* element types of the parameters and moments (fp32 before 3) */
    int64_t header;        /* bytes of a rank file's header */
    int nfiles;            /* lay.world x nc */
    struct mf_file *files; /* nfiles, the piece of chunk c of rank r at r nc + c */
};

#define MAXTOK 64

/* Splits a line into at most MAXTOK space-separated tokens (in place). */
static int tokenize(char *line, char **tok) {
    int n = 0;
    for (char *p = strtok(line, " \t\n"); p && n < MAXTOK; p = strtok(NULL, " \t\n")) tok[n++] = p;
    return n;
}

/* The state of a parse: the text, the current line's tokens (tok[0] the record's word), the
 * first error (every getter does nothing once there is one). */
struct parser {
    struct manifest *mf;
    const char *text;
    size_t len, at;   /* the text's length; where the current line begins (the checksum's end) */
    char **tok;
    int n, line;
    l3d_status st;
    unsigned seen;    /* one bit per entry of records[] */
    int nfile;        /* file records read */
    bool sum, end;    /* the `checksum` line matched; the `end` line was read */
};

/* Refuses the current record's value v of field key (NULL: the record's one value): "FILE line
 * N: RECORD KEY 'V' WHY: the manifest is damaged". */
static void bad_value(struct parser *p, const char *key, const char *v, const char *why) {
    if (p->st != L3D_OK) return;
    p->st = l3d_error(L3D_ERR_FORMAT, "%s line %d: %s%s%s '%s' %s: the manifest is damaged",
                      p->mf->path, p->line, p->tok[0], key ? " " : "", key ? key : "", v, why);
}

/* The value after key in "word key value key value ...", or NULL after an error naming it. */
static const char *field(struct parser *p, const char *key) {
    if (p->st != L3D_OK) return NULL;
    for (int i = 1; i + 1 < p->n; i += 2)
        if (strcmp(p->tok[i], key) == 0) return p->tok[i + 1];
    p->st = l3d_error(L3D_ERR_FORMAT, "%s line %d: '%s' record has no %s: the manifest is "
                      "damaged", p->mf->path, p->line, p->tok[0], key);
    return NULL;
}

/* v as a whole number in [lo, hi]: an optional '-' and decimal digits, nothing else (strtoll
 * alone takes "+5", " 5" and stops at "5x"). */
static int64_t whole(struct parser *p, const char *key, const char *v, int64_t lo, int64_t hi) {
    if (!v || p->st != L3D_OK) return 0;
    char *end, why[96];
    errno = 0;
    long long x = strtoll(v, &end, 10);
    bool digits = (v[0] == '-' ? v[1] : v[0]) >= '0' && (v[0] == '-' ? v[1] : v[0]) <= '9';
    if (digits && !*end && !errno && x >= lo && x <= hi) return x;
    snprintf(why, sizeof why, "is not a whole number in [%lld, %lld]", (long long)lo,
             (long long)hi);
    bad_value(p, key, v, why);
    return 0;
}

static int64_t get_i64(struct parser *p, const char *key, int64_t lo, int64_t hi) {
    return whole(p, key, field(p, key), lo, hi);
}

/* Bounds of int fields: sums of two cannot overflow. Of counts of bytes and elements: 2^62. */
#define FIELD_MAX ((1 << 30) + (1 << 20))
#define COUNT_MAX ((int64_t)1 << 62)

static int get_int(struct parser *p, const char *key, int lo, int hi) {
    return (int)get_i64(p, key, lo, hi);
}

static bool get_flag(struct parser *p, const char *key) { return get_i64(p, key, 0, 1) != 0; }

/* Decimal digits only, the whole of uint64_t (strtoull alone takes "-1" as 2^64 - 1). */
static uint64_t get_u64(struct parser *p, const char *key) {
    const char *v = field(p, key);
    if (!v) return 0;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (v[0] >= '0' && v[0] <= '9' && !*end && !errno) return x;
    bad_value(p, key, v, "is not a whole number in [0, 2^64)");
    return 0;
}

/* v as exactly 16 hexadecimal digits (run ids, file checksums) */
static uint64_t hex64(struct parser *p, const char *key, const char *v) {
    if (!v || p->st != L3D_OK) return 0;
    if (strlen(v) == 16 && strspn(v, "0123456789abcdefABCDEF") == 16)
        return strtoull(v, NULL, 16);
    bad_value(p, key, v, "is not a 16-digit hex number");
    return 0;
}

/* A finite number in [lo, hi], as the type it is kept in (f32: a float, where 1e39 is an
 * infinity and 1e-50 a zero). */
static double get_real(struct parser *p, const char *key, double lo, double hi, bool f32) {
    const char *v = field(p, key);
    if (!v) return 0;
    char *end, why[96];
    double x = strtod(v, &end);
    if (f32) x = (float)x;
    if (end != v && !*end && isfinite(x) && x >= lo && x <= hi) return x;
    snprintf(why, sizeof why, "is not a finite number in [%g, %g]", lo, hi);
    bad_value(p, key, v, why);
    return 0;
}

static float get_f32(struct parser *p, const char *key, double lo, double hi) {
    return (float)get_real(p, key, lo, hi, true);
}

static void manifest_free(struct manifest *mf) {
    free(mf->files);
    mf->files = NULL;
}

/* ---- the records, one handler each, in the order they are written ---- */

/* "llm3d-checkpoint format N": the first line */
static void rec_format(struct parser *p) {
    struct manifest *mf = p->mf;
    if (strcmp(p->tok[0], "llm3d-checkpoint") != 0) {
        p->st = l3d_error(L3D_ERR_FORMAT, "%s: not an llm3d checkpoint manifest", mf->path);
        return;
    }
    int64_t fmt = get_i64(p, "format", 0, INT32_MAX);
    if (p->st == L3D_OK && (fmt < L3D_CKPT_FORMAT_ONE || fmt > L3D_CKPT_FORMAT))
        p->st = l3d_error(L3D_ERR_FORMAT, "%s: format version %lld; this llm3d reads "
                          "versions %d to %d (a newer llm3d wrote it?)", mf->path,
                          (long long)fmt, L3D_CKPT_FORMAT_ONE, L3D_CKPT_FORMAT);
    mf->format = p->st == L3D_OK ? (int)fmt : 0;
    /* formats 1 and 2 hold fp32 tensors behind a 64-byte header */
    mf->header = fmt >= L3D_CKPT_FORMAT_DTYPES ? HEADER_BYTES : HEADER_BYTES_OLD;
    mf->pdt = mf->mdt = L3D_F32;
}

/* "step N": optimizer steps completed (the trainer counts them in an int) */
static void rec_step(struct parser *p) { p->mf->st.step = whole(p, NULL, p->tok[1], 0, INT32_MAX); }

/* "run ID": the run that wrote it */
static void rec_run(struct parser *p) { p->mf->st.run_id = hex64(p, NULL, p->tok[1]); }

static void rec_model(struct parser *p) {
    struct manifest *mf = p->mf;
    mf->cfg = (struct l3d_gpt_config){
        .L = get_int(p, "L", 1, FIELD_MAX), .C = get_int(p, "C", 1, FIELD_MAX),
        .NH = get_int(p, "NH", 1, FIELD_MAX), .V = get_int(p, "V", 2, FIELD_MAX),
        .Vp = get_int(p, "Vp", 2, FIELD_MAX), .maxT = get_int(p, "maxT", 1, FIELD_MAX)};
    struct l3d_gpt_config c = mf->cfg;
    if (p->st == L3D_OK && (l3d_gpt_config_finish(&c) != L3D_OK || c.Vp != mf->cfg.Vp))
        p->st = l3d_error(L3D_ERR_FORMAT, "%s line %d: model L=%d C=%d NH=%d V=%d Vp=%d "
                          "maxT=%d is not a valid GPT-2 model (%s): the manifest is "
                          "damaged", mf->path, p->line, mf->cfg.L, mf->cfg.C, mf->cfg.NH,
                          mf->cfg.V, mf->cfg.Vp, mf->cfg.maxT,
                          c.Vp != mf->cfg.Vp ? "Vp is not V padded" : l3d_error_message());
}

/* "dtype params T moments T" (format 3 on) */
static void rec_dtype(struct parser *p) {
    const char *keys[2] = {"params", "moments"}, *v;
    enum l3d_dtype *dst[2] = {&p->mf->pdt, &p->mf->mdt};
    for (int i = 0; i < 2 && (v = field(p, keys[i])); i++)
        if (!dtype_parse(v, dst[i]))
            p->st = l3d_error(L3D_ERR_FORMAT, "%s line %d: %s dtype '%s' is not one of "
                              "fp32, bf16, fp16, fp64: the manifest is damaged or from a "
                              "newer llm3d", p->mf->path, p->line, keys[i], v);
}

/* The layout, and the table of its world x chunks rank files (allocated once the text is known
 * to be long enough to list them). */
static void rec_layout(struct parser *p) {
    struct manifest *mf = p->mf;
    struct l3d_ckpt_layout *l = &mf->lay;
    l->world = get_int(p, "world", 1, 1 << 20);
    l->tp = get_int(p, "tp", 1, 1 << 20);
    l->pp = get_int(p, "pp", 1, 1 << 20);
    l->dp = get_int(p, "dp", 1, 1 << 20);
    l->zero = get_int(p, "zero", 0, 2);
    l->sequence_parallel = get_flag(p, "sp");
    l->pp_virtual = mf->format == L3D_CKPT_FORMAT_ONE ? 1 : get_int(p, "virtual", 1, 256);
    if (p->st == L3D_OK && (int64_t)l->world * l->pp_virtual > (1 << 20))
        p->st = l3d_error(L3D_ERR_FORMAT, "%s: %d chunks per rank (virtual)", mf->path,
                          l->pp_virtual);
    /* a file record takes more than 64 bytes: a world the text cannot list is refused before
     * its table is allocated */
    if (p->st == L3D_OK && (int64_t)l->world * l->pp_virtual > (int64_t)(p->len / 64))
        p->st = l3d_error(L3D_ERR_FORMAT, "%s: a world of %d ranks with %d chunk(s) each, more "
                          "rank files than its %zu bytes can list: the manifest is truncated or "
                          "damaged", mf->path, l->world, l->pp_virtual, p->len);
    if (p->st != L3D_OK) return;
    mf->nc = l->pp_virtual;
    mf->nfiles = l->world * mf->nc;
    mf->files = calloc((size_t)mf->nfiles, sizeof *mf->files);
    if (!mf->files) {
        p->st = l3d_error(L3D_ERR_OOM, "%s: no memory for its table of %d rank files", mf->path,
                          mf->nfiles);
        return;
    }
    for (int r = 0; r < mf->nfiles; r++) mf->files[r].rank = -1;
}

static void rec_data(struct parser *p) {
    struct l3d_ckpt_state *s = &p->mf->st;
    s->loader.epoch = get_i64(p, "epoch", 0, COUNT_MAX);
    s->loader.index = get_i64(p, "index", 0, COUNT_MAX);
    s->B = get_int(p, "B", 1, FIELD_MAX);
    s->T = get_int(p, "T", 1, FIELD_MAX);
    s->accum = get_int(p, "accum", 1, FIELD_MAX);
    s->seed = get_u64(p, "seed");
}

static void rec_schedule(struct parser *p) {
    struct l3d_lr_schedule *s = &p->mf->st.sched;
    s->max_lr = get_f32(p, "max_lr", 0, FLT_MAX);
    s->min_lr = get_f32(p, "min_lr", 0, FLT_MAX);
    s->warmup_steps = get_int(p, "warmup", 0, FIELD_MAX);
    s->total_steps = get_int(p, "total", 1, FIELD_MAX);
}

/* AdamW's hyper-parameters: betas in [0, 1), eps > 0 (the smallest positive float), the rest
 * at least 0; its step count */
static void rec_adamw(struct parser *p) {
    struct l3d_adamw_hparams *h = &p->mf->st.adamw;
    h->beta1 = get_f32(p, "beta1", 0, 0x1.fffffep-1);
    h->beta2 = get_f32(p, "beta2", 0, 0x1.fffffep-1);
    h->eps = get_f32(p, "eps", FLT_TRUE_MIN, FLT_MAX);
    h->weight_decay = get_f32(p, "weight_decay", 0, FLT_MAX);
    h->grad_clip = get_f32(p, "grad_clip", 0, FLT_MAX);
    p->mf->st.adamw_t = get_i64(p, "t", 0, COUNT_MAX);
}

/* fp16 dynamic loss scaling (optional) */
static void rec_lossscale(struct parser *p) {
    struct l3d_ckpt_state *s = &p->mf->st;
    s->loss_scale = get_real(p, "scale", DBL_TRUE_MIN, DBL_MAX, false);
    s->ls_good = get_i64(p, "good", 0, COUNT_MAX);
    s->ls_hyst = get_i64(p, "hysteresis", 0, COUNT_MAX);
}

/* "START+COUNT", each a whole number in [0, 2^30) */
static bool parse_range(const char *v, long long *a, long long *b) {
    char *end;
    errno = 0;
    *a = strtoll(v, &end, 10);
    if (end == v || *end != '+' || errno || *a < 0 || *a >= (1 << 30)) return false;
    const char *c = end + 1;
    *b = strtoll(c, &end, 10);
    return end != c && !*end && !errno && *b >= 0 && *b < (1 << 30);
}

/* The shard of a file record: its ranges and whether it holds the embedding and the head. */
static struct l3d_shard file_shard(struct parser *p) {
    struct l3d_shard s = l3d_shard_full(&p->mf->cfg);
    const char *keys[4] = {"layers", "heads", "ffn", "vocab"}, *v;
    long long a[4] = {0}, b[4] = {0};
    for (int i = 0; i < 4; i++)
        if ((v = field(p, keys[i])) && !parse_range(v, &a[i], &b[i]))
            bad_value(p, keys[i], v, "is not START+COUNT (each below 2^30)");
    s.layer_start = (int)a[0], s.layer_count = (int)b[0];
    s.head_start = (int)a[1], s.head_count = (int)b[1];
    s.ffn_start = a[2], s.ffn_count = b[2];
    s.vocab_start = a[3], s.vocab_count = b[3];
    s.has_embedding = get_flag(p, "embedding");
    s.has_head = get_flag(p, "head");
    return s;
}

/* One piece: its coordinates inside the layout, file, size, checksum, ranges. */
static void rec_file(struct parser *p) {
    struct manifest *mf = p->mf;
    if (!mf->files || !mf->cfg.L) {
        p->st = l3d_error(L3D_ERR_FORMAT, "%s line %d: file record before the model and layout "
                          "records", mf->path, p->line);
        return;
    }
    int r = get_int(p, "rank", 0, mf->lay.world - 1);
    int c = mf->format == L3D_CKPT_FORMAT_ONE ? 0 : get_int(p, "chunk", 0, mf->nc - 1);
    if (p->st != L3D_OK) return;
    struct mf_file *f = &mf->files[r * mf->nc + c];
    if (f->rank >= 0) {
        p->st = l3d_error(L3D_ERR_FORMAT, "%s line %d: rank %d chunk %d listed twice", mf->path,
                          p->line, r, c);
        return;
    }
    f->rank = r;
    f->chunk = c;
    /* recorded for readers; a load goes by the shards, which the layout check judges */
    f->tp_rank = get_int(p, "tp", 0, (1 << 20) - 1);
    f->pp_rank = get_int(p, "pp", 0, (1 << 20) - 1);
    f->dp_rank = get_int(p, "dp", 0, (1 << 20) - 1);
    const char *v = field(p, "name");
    if (v && (strlen(v) >= sizeof f->name || strchr(v, '/')))
        p->st = l3d_error(L3D_ERR_FORMAT, "%s line %d: bad file name '%s'", mf->path, p->line, v);
    else if (v)
        strcpy(f->name, v);
    f->bytes = get_i64(p, "bytes", 0, COUNT_MAX);
    f->hash = hex64(p, "hash", field(p, "hash"));
    f->params = get_i64(p, "params", 0, COUNT_MAX);
    f->opt_start = get_i64(p, "opt_start", 0, COUNT_MAX);
    f->opt_count = get_i64(p, "opt_count", 0, COUNT_MAX);
    f->shard = file_shard(p);
    p->nfile++;
}

/* "checksum H" (format 4 on): of every byte above it */
static void rec_checksum(struct parser *p) {
    struct hasher h;
    hash_init(&h);
    hash_update(&h, p->text, p->at);
    uint64_t sum = hash_final(&h);
    const char *v = p->tok[1];
    p->sum = strlen(v) == 16 && strspn(v, "0123456789abcdefABCDEF") == 16 &&
             strtoull(v, NULL, 16) == sum;
    if (!p->sum)
        p->st = l3d_error(L3D_ERR_FORMAT, "%s: its checksum is %016" PRIx64 " but line %d says %s: "
                      "the manifest was edited or damaged; use another checkpoint step",
                      p->mf->path, sum, p->line, p->tok[1]);
}

static void rec_end(struct parser *p) { p->end = true; }

/* The records after the first line. Each appears once, except file lines; `need`: it must be
 * there from that format on (0: optional); `arity`: the line's token count (0: key-value
 * pairs, checked by the handler). */
static const struct record {
    const char *word;
    int since, need, arity;
    bool repeats;
    void (*parse)(struct parser *p);
} records[] = {
    {"step", 1, 1, 2, false, rec_step},
    {"run", 1, 0, 2, false, rec_run},
    {"model", 1, 1, 0, false, rec_model},
    {"dtype", L3D_CKPT_FORMAT_DTYPES, L3D_CKPT_FORMAT_DTYPES, 0, false, rec_dtype},
    {"layout", 1, 1, 0, false, rec_layout},
    {"data", 1, 1, 0, false, rec_data},
    {"schedule", 1, 1, 0, false, rec_schedule},
    {"adamw", 1, 1, 0, false, rec_adamw},
    {"lossscale", 1, 0, 0, false, rec_lossscale},
    {"file", 1, 0, 0, true, rec_file},
    {"checksum", 1, 0, 2, false, rec_checksum},
    {"end", 1, 0, 0, false, rec_end},
};
#define NRECORDS ((int)(sizeof records / sizeof records[0]))

/* One line's tokens: the first line, else the handler of its record. */
static void parse_line(struct parser *p) {
    struct manifest *mf = p->mf;
    if (mf->format == 0) {
        rec_format(p);
        return;
    }
    int k = 0;
    while (k < NRECORDS && strcmp(p->tok[0], records[k].word) != 0) k++;
    const struct record *r = &records[k < NRECORDS ? k : 0];
    if (k == NRECORDS || mf->format < r->since)
        p->st = l3d_error(L3D_ERR_FORMAT, "%s line %d: unknown record '%s'", mf->path, p->line,
                          p->tok[0]);
    else if (!r->repeats && (p->seen >> k & 1))
        p->st = l3d_error(L3D_ERR_FORMAT, "%s line %d: a second '%s' record: the manifest is "
                          "damaged", mf->path, p->line, r->word);
    else if (r->arity && p->n != r->arity)
        p->st = l3d_error(L3D_ERR_FORMAT, "%s line %d: '%s' record of %d fields, not %d: the "
                          "manifest is damaged", mf->path, p->line, r->word, p->n, r->arity);
    else
        r->parse(p);
    p->seen |= 1u << k;
}

/* After the last line: every record the format needs, the checksum, `end`, every rank file. */
static l3d_status parse_done(struct parser *p) {
    const struct manifest *mf = p->mf;
    for (int k = 0; p->st == L3D_OK && k < NRECORDS; k++)
        if (records[k].need && mf->format >= records[k].need && !(p->seen >> k & 1))
            p->st = l3d_error(L3D_ERR_FORMAT, "%s: no '%s' record: the manifest is damaged",
                              mf->path, records[k].word);
    if (p->st == L3D_OK && !p->sum && mf->format >= L3D_CKPT_FORMAT)
        p->st = l3d_error(L3D_ERR_FORMAT, "%s: no 'checksum' line (format %d carries one): the "
                          "manifest is damaged or truncated", mf->path, mf->format);
    if (p->st == L3D_OK && !p->end)
        p->st = l3d_error(L3D_ERR_FORMAT, "%s: no 'end' line: the manifest is truncated", mf->path);
    if (p->st == L3D_OK && p->nfile != mf->nfiles)
        p->st = l3d_error(L3D_ERR_FORMAT, "%s lists %d rank files for a world of %d with %d "
                          "chunk(s) each", mf->path, p->nfile, mf->lay.world, mf->nc);
    return p->st;
}

#define MANIFEST_MAX_BYTES ((int64_t)1 << 30)
#define MANIFEST_LINE 2048

/* The manifest's text (len bytes; mf->path and mf->dir set) into mf, checked record by record:
 * every value parsed in full and in its range, the model against l3d_gpt_config_finish's
 * limits, the table of rank files against the text's size before it is allocated; from format
 * 4 on the `checksum` line covers every byte above it. The checksum guards against damage, the
 * ranges against values no run writes (an edit with the checksum recomputed). */
static l3d_status manifest_parse(struct manifest *mf, const char *text, size_t len) {
    char line[MANIFEST_LINE], *tok[MAXTOK];
    struct parser p = {.mf = mf, .text = text, .len = len, .tok = tok, .st = L3D_OK};
    for (size_t next; p.st == L3D_OK && !p.end && p.at < len; p.at = next) {
        const char *nl = memchr(text + p.at, '\n', len - p.at);
        next = nl ? (size_t)(nl - text) + 1 : len;
        p.line++;
        if (next - p.at >= sizeof line || memchr(text + p.at, '\0', next - p.at)) {
            p.st = l3d_error(L3D_ERR_FORMAT, "%s line %d: %s: the manifest is damaged", mf->path,
                             p.line, next - p.at >= sizeof line ? "too long" : "a NUL byte");
            break;
        }
        memcpy(line, text + p.at, next - p.at);
        line[next - p.at] = '\0';
        if ((p.n = tokenize(line, tok)) > 0) parse_line(&p);
    }
    if (p.st == L3D_OK) parse_done(&p);
    if (p.st != L3D_OK) manifest_free(mf);
    return p.st;
}

/* Reads and checks dir/manifest: every record present, the layout possible for the model. */
static l3d_status manifest_read(const char *dir, struct manifest *mf) {
    memset(mf, 0, sizeof *mf);
    if (long_path(dir) != L3D_OK) return L3D_ERR_ARG;
    join(mf->dir, sizeof mf->dir, dir, "", "");
    join(mf->path, sizeof mf->path, dir, "/", "manifest");
    int fd;
    int64_t size;
    l3d_status st = l3d_open_regular(mf->path, "checkpoint manifest", &fd, &size);
    if (st != L3D_OK)
        return l3d_error(st, "%s (is %s a checkpoint step directory?)", l3d_error_message(), dir);
    if (size > MANIFEST_MAX_BYTES) {
        close(fd);
        return l3d_error(L3D_ERR_FORMAT, "%s: %lld bytes, more than a manifest can hold (%lld): "
                         "not a checkpoint manifest", mf->path, (long long)size,
                         (long long)MANIFEST_MAX_BYTES);
    }
    char *text = l3d_try_alloc((size_t)size + 1, "checkpoint manifest");
    if (!text) {
        close(fd);
        return l3d_error(L3D_ERR_OOM, "%s: no memory to read its %lld bytes", mf->path,
                         (long long)size);
    }
    int64_t got = 0;
    for (ssize_t k = 1; got < size && k > 0; got += k > 0 ? k : 0) {
        k = read(fd, text + got, (size_t)(size - got));
        if (k < 0 && errno == EINTR) k = 1, got -= 1;
    }
    int e = errno;
    close(fd);
    if (got != size) {
        l3d_free(text);
        return l3d_error(L3D_ERR_IO, "cannot read %s: %s", mf->path,
                         got < size ? strerror(e) : "it changed while read");
    }
    st = manifest_parse(mf, text, (size_t)size);
    l3d_free(text);
    return st;
}

/* Bytes per stored parameter and moment element. */
static int64_t psize(const struct manifest *mf) { return (int64_t)l3d_dtype_size(mf->pdt); }
static int64_t msize(const struct manifest *mf) { return (int64_t)l3d_dtype_size(mf->mdt); }

static bool same_config(const struct l3d_gpt_config *a, const struct l3d_gpt_config *b) {
    return a->L == b->L && a->C == b->C && a->NH == b->NH && a->V == b->V && a->Vp == b->Vp &&
           a->maxT == b->maxT;
}

static bool same_shard(const struct l3d_shard *a, const struct l3d_shard *b) {
    return a->layer_start == b->layer_start && a->layer_count == b->layer_count &&
           a->head_start == b->head_start && a->head_count == b->head_count &&
           a->ffn_start == b->ffn_start && a->ffn_count == b->ffn_count &&
           a->vocab_start == b->vocab_start && a->vocab_count == b->vocab_count &&
           a->has_embedding == b->has_embedding && a->has_head == b->has_head;
}

/* The layout the manifest describes must be able to hold its model: tp x pp x dp = world, every
 * shard inside the model with the parameter count its shape gives, the optimizer ranges inside
 * their shards, and every layer of every tensor-parallel slice held by some rank's parameters. */
static l3d_status manifest_check_layout(const struct manifest *mf) {
    const struct l3d_ckpt_layout *l = &mf->lay;
    const struct l3d_gpt_config *c = &mf->cfg;
    if (l->tp < 1 || l->pp < 1 || l->dp < 1 || (int64_t)l->tp * l->pp * l->dp != l->world ||
        l->zero < 0 || l->zero > 2)
        return l3d_error(L3D_ERR_LAYOUT, "%s: layout tp %d x pp %d x dp %d (ZeRO-%d) does not "
                         "make its world of %d ranks", mf->path, l->tp, l->pp, l->dp, l->zero,
                         l->world);
    if (c->NH % l->tp != 0 || (4 * (int64_t)c->C) % l->tp != 0 || c->Vp % l->tp != 0 ||
        (int64_t)l->pp * mf->nc > c->L)
        return l3d_error(L3D_ERR_LAYOUT, "%s: layout tp %d x pp %d is impossible for the model "
                         "with %d chunk(s) per rank (NH=%d heads, 4C=%d FFN columns, Vp=%d, L=%d "
                         "layers): the checkpoint is damaged", mf->path, l->tp, l->pp, mf->nc,
                         c->NH, 4 * c->C, c->Vp, c->L);
    /* every (layer, head) slice must be held by some piece's parameters */
    bool *held = calloc((size_t)c->L * (size_t)c->NH, 1);
    if (!held)
        return l3d_error(L3D_ERR_OOM, "%s: no memory to check the %lld (layer, head) slices of its "
                         "model", mf->path, (long long)c->L * c->NH);
    bool emb = false, head = false;
    for (int r = 0; r < mf->nfiles; r++) {
        const struct mf_file *f = &mf->files[r];
        struct l3d_tensor_info t[L3D_NUM_TENSORS];
        if (l3d_shard_check(c, &f->shard) != L3D_OK) {
            free(held);
            return l3d_error(L3D_ERR_LAYOUT, "%s: %s: %s", mf->path, f->name, l3d_error_message());
        }
        int64_t n = l3d_gpt_plan_tensors(c, &f->shard, t);
        if ((f->params != 0 && f->params != n) || f->opt_start < 0 || f->opt_count < 0 ||
            f->opt_start > n || f->opt_count > n - f->opt_start ||
            f->bytes != mf->header + psize(mf) * f->params + 2 * msize(mf) * f->opt_count) {
            free(held);
            return l3d_error(L3D_ERR_LAYOUT, "%s: %s: %lld parameters, optimizer range from "
                             "%lld of %lld, %lld bytes do not fit its shard of %lld parameters",
                             mf->path, f->name, (long long)f->params, (long long)f->opt_start,
                             (long long)f->opt_count, (long long)f->bytes, (long long)n);
        }
        if (!f->params) continue;
        emb |= f->shard.has_embedding;
        head |= f->shard.has_head;
        for (int ly = 0; ly < f->shard.layer_count; ly++)
            for (int h = 0; h < f->shard.head_count; h++)
                held[(size_t)(f->shard.layer_start + ly) * c->NH + f->shard.head_start + h] = true;
    }
    int64_t missing = 0;
    for (int64_t i = 0; i < (int64_t)c->L * c->NH; i++) missing += !held[i];
    free(held);
    if (missing || !emb || !head)
        return l3d_error(L3D_ERR_LAYOUT, "%s: the rank files' parameters miss %lld of the model's "
                         "%lld (layer, head) slices%s%s: the layout cannot hold the model",
                         mf->path, (long long)missing, (long long)c->L * c->NH,
                         emb ? "" : ", the embedding", head ? "" : ", the head");
    return L3D_OK;
}

l3d_status l3d_ckpt_manifest_check(const char *text, size_t len) {
    struct manifest mf;
    memset(&mf, 0, sizeof mf);
    strcpy(mf.dir, "(text)");
    strcpy(mf.path, "(text)/manifest");
    l3d_status st = manifest_parse(&mf, text, len);
    if (st != L3D_OK) return st; /* freed */
    st = manifest_check_layout(&mf);
    manifest_free(&mf);
    return st;
}

/* ---- load ----------------------------------------------------------------------------------- */

static void file_path(const struct manifest *mf, int r, char *buf, size_t cap) {
    join(buf, cap, mf->dir, "/", mf->files[r].name);
}

/* Where a piece's m and v begin in its file. */
static int64_t off_m(const struct manifest *mf, const struct mf_file *f) {
    return mf->header + psize(mf) * f->params;
}
static int64_t off_v(const struct manifest *mf, const struct mf_file *f) {
    return off_m(mf, f) + msize(mf) * f->opt_count;
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
static l3d_status check_dtypes(const struct manifest *mf, enum l3d_dtype pdt, enum l3d_dtype mdt,
                               const char *who, const char *todo) {
    bool p = mf->pdt != pdt;
    if (!p && mf->mdt == mdt) return L3D_OK;
    return l3d_error(L3D_ERR_FORMAT, "%s stores the %s as %s, but %s them as %s and llm3d does "
                     "not convert checkpoints: %s", mf->path, p ? "parameters" : "AdamW moments",
                     dtype_name(p ? mf->pdt : mf->mdt), who, dtype_name(p ? pdt : mdt), todo);
}

/* The 8-byte NUL-padded dtype name of a format-3 header. */
static bool same_dtype_name(const uint8_t *field, enum l3d_dtype t) {
    char name[8] = {0};
    memcpy(name, dtype_name(t), strlen(dtype_name(t)));
    return memcmp(field, name, 8) == 0;
}

/* Whole file against the manifest: header fields and checksum; bytes in segs are copied out. */
static l3d_status verify_file(const struct manifest *mf, int r, uint8_t *buf, size_t cap,
                              const struct seg *segs, int nseg, int64_t *bytes) {
    const struct mf_file *f = &mf->files[r];
    char path[PATH_CAP];
    file_path(mf, r, path, sizeof path);
    int fd = open(path, O_RDONLY);
    if (fd < 0) return l3d_error(L3D_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    struct hasher h;
    hash_init(&h);
    int64_t got = 0;
    uint8_t hdr[HEADER_BYTES] = {0};
    for (;;) {
        ssize_t k = read(fd, buf, cap);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        if (got < mf->header)
            memcpy(hdr + got, buf, (size_t)(k < mf->header - got ? k : mf->header - got));
        hash_update(&h, buf, (size_t)k);
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
    if (memcmp(hdr, file_magic, 8) != 0 || fields[0] != mf->format || fields[1] != f->rank ||
        fields[2] != mf->st.step || fields[3] != f->params || fields[4] != f->opt_count ||
        ostart != f->opt_start || chunk != f->chunk ||
        (mf->format >= L3D_CKPT_FORMAT_DTYPES && !same_dtype_name(hdr + 64, mf->pdt)) ||
        (mf->format >= L3D_CKPT_FORMAT_DTYPES && !same_dtype_name(hdr + 72, mf->mdt)))
        return l3d_error(L3D_ERR_FORMAT, "%s: its header does not match the manifest (rank %d "
                         "chunk %d, step %lld): a file from another checkpoint?", path, f->rank,
                         f->chunk, (long long)mf->st.step);
    uint64_t sum = hash_final(&h);
    if (sum != f->hash)
        return l3d_error(L3D_ERR_FORMAT, "%s: checksum %016" PRIx64 ", the manifest says %016"
                         PRIx64 ": the file is damaged", path, sum, f->hash);
    return L3D_OK;
}

/* Every file present with its size (every rank: a stat each); the checksums split over the
 * ranks, the files of saved rank r verified by rank r mod world size, which also copies out segs
 * (of the files of saved rank `rank`). */
static l3d_status check_files(const struct manifest *mf, int rank, int nranks,
                              const struct seg *segs, int nseg, int64_t *bytes) {
    char path[PATH_CAP];
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
static l3d_status no_memory(const struct manifest *mf, int64_t n, const char *hint) {
    return l3d_error(L3D_ERR_OOM, "%s: no memory to assemble the checkpoint's full model (%lld "
                     "parameters): %s", mf->path, (long long)n, hint);
}
#define NO_MEMORY_RESUME "resume on the layout it was saved under"

static bool is_full(const struct l3d_gpt_config *c, const struct l3d_shard *s) {
    struct l3d_shard f = l3d_shard_full(c);
    return same_shard(s, &f);
}

/* The full model's parameters (sel 0) or moments m (1) / v (2), from the rank files: each distinct
 * shard's buffer assembled, then placed by l3d_gpt_shard_to_full; host memory only. full holds
 * NaN where nothing was stored. fp32 (the types were checked against the run's). */
static l3d_status assemble_full(const struct manifest *mf, int sel, float *full, int64_t *bytes) {
    const struct l3d_gpt_config *c = &mf->cfg;
    L3D_ASSERT((sel == 0 ? psize(mf) : msize(mf)) == sizeof(float));
    int64_t maxn = 0;
    struct l3d_tensor_info t[L3D_NUM_TENSORS];
    for (int r = 0; r < mf->nfiles; r++) {
        int64_t n = l3d_gpt_plan_tensors(c, &mf->files[r].shard, t);
        if (n > maxn) maxn = n;
    }
    float *tmp = alloc_nan(maxn, "checkpoint shard");
    if (!tmp) return no_memory(mf, maxn, "free host memory");
    l3d_status st = L3D_OK;
    char path[PATH_CAP];
    for (int r = 0; st == L3D_OK && r < mf->nfiles; r++) {
        const struct mf_file *f = &mf->files[r];
        bool first = true; /* the first piece of this shard does the whole shard */
        for (int q = 0; q < r; q++) first &= !same_shard(&mf->files[q].shard, &f->shard);
        if (!first) continue;
        int64_t n = l3d_gpt_plan_tensors(c, &f->shard, t);
        bool whole = is_full(c, &f->shard); /* read straight into full */
        float *dst = whole ? full : tmp;
        if (!whole) memset(tmp, 0xff, (size_t)n * sizeof(float));
        for (int q = r; st == L3D_OK && q < mf->nfiles; q++) {
            const struct mf_file *g = &mf->files[q];
            if (!same_shard(&g->shard, &f->shard)) continue;
            file_path(mf, q, path, sizeof path);
            if (sel == 0 && g->params) {
                st = read_at(path, mf->header, dst, (size_t)n * sizeof(float));
                *bytes += n * psize(mf);
            } else if (sel > 0 && g->opt_count) {
                st = read_at(path, sel == 1 ? off_m(mf, g) : off_v(mf, g), dst + g->opt_start,
                             (size_t)g->opt_count * sizeof(float));
                *bytes += g->opt_count * msize(mf);
            }
        }
        if (st == L3D_OK && !whole) l3d_gpt_shard_to_full(c, &f->shard, tmp, full);
    }
    l3d_free(tmp);
    return st;
}

static l3d_status check_no_nan(const struct manifest *mf, const float *p, int64_t n,
                               const char *what) {
    for (int64_t i = 0; i < n; i++)
        if (p[i] != p[i])
            return l3d_error(L3D_ERR_FORMAT, "%s: no rank file holds %s element %lld of this "
                             "rank's slice (or it is NaN): the checkpoint is incomplete",
                             mf->path, what, (long long)i);
    return L3D_OK;
}

/* A chunk's parameters: straight from a file of the same shard (staged to the device), else cut
 * from the full model assembled on the host, checked there, then copied to the device. */
static l3d_status load_params(const struct manifest *mf, struct l3d_gpt *m, int64_t *bytes) {
    char path[PATH_CAP];
    const size_t nb = (size_t)m->num_params * sizeof(float);
    for (int r = 0; r < mf->nfiles; r++) {
        const struct mf_file *f = &mf->files[r];
        if (f->params && same_shard(&f->shard, &m->shard)) {
            file_path(mf, r, path, sizeof path);
            *bytes += m->num_params * psize(mf);
            return read_device(path, mf->header, m->be, m->params, nb);
        }
    }
    int64_t N = l3d_gpt_param_count(&mf->cfg);
    bool whole = is_full(&mf->cfg, &m->shard); /* then full is the chunk's buffer already */
    float *full = alloc_nan(N, "checkpoint full model");
    float *mine = whole ? full : full ? l3d_try_alloc(nb, "checkpoint shard") : NULL;
    if (!mine) {
        l3d_free(full);
        return no_memory(mf, N, NO_MEMORY_RESUME);
    }
    l3d_status st = assemble_full(mf, 0, full, bytes);
    if (st == L3D_OK) {
        if (!whole) l3d_gpt_full_to_shard(&mf->cfg, &m->shard, full, mine);
        st = check_no_nan(mf, mine, m->num_params, "parameter");
    }
    if (st == L3D_OK) l3d_be_copy_h2d(m->be, m->params, mine, nb);
    l3d_be_sync(m->be);
    if (!whole) l3d_free(mine);
    l3d_free(full);
    return st;
}

/* A chunk's optimizer range: from the files of the same shard (their ranges intersected with
 * ours, staged to the device), else cut from the full model's moments on the host. The moments
 * live on the chunk's device (m->be). */
static l3d_status load_moments(const struct manifest *mf, const struct l3d_gpt *m,
                               struct l3d_adamw *opt, int64_t *bytes) {
    int64_t s0 = opt->start, s1 = opt->start + opt->n, covered = 0;
    const int64_t es = msize(mf);
    bool same = false;
    char path[PATH_CAP];
    l3d_status st = L3D_OK;
    for (int r = 0; st == L3D_OK && r < mf->nfiles; r++) {
        const struct mf_file *f = &mf->files[r];
        if (!same_shard(&f->shard, &m->shard)) continue;
        same = true;
        int64_t lo = f->opt_start > s0 ? f->opt_start : s0;
        int64_t hi = f->opt_start + f->opt_count < s1 ? f->opt_start + f->opt_count : s1;
        if (hi <= lo) continue;
        file_path(mf, r, path, sizeof path);
        size_t nb = (size_t)((hi - lo) * es);
        st = read_device(path, off_m(mf, f) + es * (lo - f->opt_start), m->be, opt->m + (lo - s0),
                         nb);
        if (st == L3D_OK)
            st = read_device(path, off_v(mf, f) + es * (lo - f->opt_start), m->be,
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
    int64_t N = l3d_gpt_param_count(&mf->cfg);
    bool whole = is_full(&mf->cfg, &m->shard); /* then full is this rank's layout already */
    float *full = alloc_nan(N, "checkpoint full model");
    float *mine = whole ? full
                : full  ? l3d_try_alloc((size_t)m->num_params * sizeof(float), "checkpoint shard")
                        : NULL;
    if (!mine) {
        l3d_free(full);
        return no_memory(mf, N, NO_MEMORY_RESUME);
    }
    for (int sel = 1; st == L3D_OK && sel <= 2; sel++) {
        if (sel == 2) memset(full, 0xff, (size_t)N * sizeof(float));
        st = assemble_full(mf, sel, full, bytes);
        if (st != L3D_OK) break;
        if (!whole) l3d_gpt_full_to_shard(&mf->cfg, &m->shard, full, mine);
        st = check_no_nan(mf, mine + s0, opt->n, sel == 1 ? "AdamW m" : "AdamW v");
        if (st == L3D_OK)
            l3d_be_copy_h2d(m->be, sel == 1 ? opt->m : opt->v, mine + s0,
                            (size_t)opt->n * sizeof(float));
        l3d_be_sync(m->be); /* before full and mine are refilled or freed */
    }
    if (!whole) l3d_free(mine);
    l3d_free(full);
    return st;
}

l3d_status l3d_ckpt_load(const char *dir, struct l3d_comm *world,
                         const struct l3d_ckpt_layout *lay, struct l3d_gpt *const *m,
                         struct l3d_adamw *opt, struct l3d_ckpt_state *s, struct l3d_ckpt_io *io,
                         bool *report) {
    double t0 = l3d_time_s();
    memset(io, 0, sizeof *io);
    const int nc = chunks_of(lay);
    struct manifest mf;
    l3d_status st = manifest_read(dir, &mf);
    bool parsed = st == L3D_OK;
    const struct l3d_gpt_config *a = &mf.cfg, *b = &m[0]->cfg;
    if (st == L3D_OK && !same_config(a, b))
        st = l3d_error(L3D_ERR_FORMAT, "%s holds a model L=%d C=%d NH=%d V=%d context=%d, not the "
                       "configured L=%d C=%d NH=%d V=%d context=%d: give the model flags it was "
                       "trained with", mf.path, a->L, a->C, a->NH, a->V, a->maxT, b->L, b->C,
                       b->NH, b->V, b->maxT);
    if (st == L3D_OK)
        st = check_dtypes(&mf, params_dtype(m[0]), moments_dtype(&opt[0]), "this run keeps",
                          "resume it with the precision it was saved in (an llm3d build and "
                          "flags that train in those types)");
    if (st == L3D_OK) st = manifest_check_layout(&mf);
    /* the files of this rank's own pieces, when they hold what a chunk needs (the same layout),
     * are loaded by the pass that verifies them */
    struct seg *segs = l3d_calloc((size_t)nc * 3 * sizeof *segs, "checkpoint segments");
    bool *own = l3d_calloc((size_t)nc * 2 * sizeof *own, "checkpoint segments");
    int nseg = 0;
    for (int c = 0; st == L3D_OK && c < nc && world->rank < mf.lay.world; c++) {
        for (int k = 0; k < mf.nc; k++) {
            int i = world->rank * mf.nc + k;
            const struct mf_file *f = &mf.files[i];
            if (!same_shard(&f->shard, &m[c]->shard)) continue;
            if (f->params) {
                segs[nseg++] = (struct seg){i, mf.header, psize(&mf) * f->params, m[c]->be,
                                            m[c]->params};
                own[2 * c] = true;
            }
            if (f->opt_start == opt[c].start && f->opt_count == opt[c].n && opt[c].n > 0) {
                int64_t nb = msize(&mf) * f->opt_count;
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
            if (!own[2 * c]) st = load_params(&mf, m[c], &bytes);
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
    if (parsed) manifest_free(&mf);
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
    char path[PATH_CAP];
    struct stat sb;
    if (long_path(base) != L3D_OK) return L3D_ERR_ARG;
    join(path, sizeof path, base, "/", "manifest");
    if (!autom && stat(path, &sb) == 0) {
        join(dir, cap, base, "", "");
        return L3D_OK;
    }
    join(path, sizeof path, base, "/", "latest");
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

l3d_status l3d_ckpt_read_config(const char *dir, struct l3d_gpt_config *cfg, int64_t *step) {
    struct manifest mf;
    l3d_status st = manifest_read(dir, &mf);
    if (st != L3D_OK) return st;
    *cfg = mf.cfg;
    *step = mf.st.step;
    manifest_free(&mf);
    struct l3d_gpt_config c = *cfg;
    if (l3d_gpt_config_finish(&c) != L3D_OK || c.Vp != cfg->Vp)
        return l3d_error(L3D_ERR_FORMAT, "%s/manifest: model record L=%d C=%d NH=%d V=%d Vp=%d "
                         "is not a valid GPT-2 config", dir, cfg->L, cfg->C, cfg->NH, cfg->V,
                         cfg->Vp);
    return L3D_OK;
}

l3d_status l3d_ckpt_export_llmc(const char *dir, const char *path) {
    return l3d_ckpt_export_llmc_dt(dir, path, L3D_F32);
}

l3d_status l3d_ckpt_export_llmc_dt(const char *dir, const char *path, enum l3d_dtype dt) {
    struct l3d_gpt_config cfg;
    int64_t step;
    l3d_status st = l3d_ckpt_read_config(dir, &cfg, &step);
    if (st != L3D_OK) return st;
    struct manifest mf;
    if ((st = manifest_read(dir, &mf)) != L3D_OK) return st;
    st = check_dtypes(&mf, L3D_F32, mf.mdt, "an llm.c file holds",
                      "llm3d convert reads checkpoints with fp32 parameters only");
    if (st == L3D_OK) st = manifest_check_layout(&mf);
    int64_t N = l3d_gpt_param_count(&cfg), bytes = 0;
    if (st == L3D_OK) st = check_files(&mf, 0, 1, NULL, 0, &bytes);
    float *full = st == L3D_OK ? alloc_nan(N, "full model") : NULL;
    if (st == L3D_OK && !full) st = no_memory(&mf, N, "convert on a machine with more memory");
    if (st == L3D_OK) st = assemble_full(&mf, 0, full, &bytes);
    if (st == L3D_OK) st = check_no_nan(&mf, full, N, "parameter");
    if (st == L3D_OK) st = l3d_ckpt_save_llmc_params_dt(path, &cfg, full, N, dt);
    l3d_free(full);
    manifest_free(&mf);
    return st;
}

l3d_status l3d_ckpt_inspect(const char *dir, struct l3d_ckpt_info *info) {
    memset(info, 0, sizeof *info);
    struct manifest mf;
    l3d_status st = manifest_read(dir, &mf);
    if (st != L3D_OK) return st;
    *info = (struct l3d_ckpt_info){.format = mf.format, .cfg = mf.cfg, .layout = mf.lay,
                                   .state = mf.st, .params_dtype = dtype_name(mf.pdt),
                                   .moments_dtype = dtype_name(mf.mdt), .nfiles = mf.nfiles};
    for (int r = 0; r < mf.nfiles; r++) info->bytes += mf.files[r].bytes;
    int64_t read = 0;
    st = manifest_check_layout(&mf);
    if (st == L3D_OK) st = check_files(&mf, 0, 1, NULL, 0, &read);
    manifest_free(&mf);
    return st;
}

/* ---- metrics -------------------------------------------------------------------------------- */

l3d_status l3d_ckpt_trim_metrics(const char *path, int64_t step) {
    if (long_path(path) != L3D_OK) return L3D_ERR_ARG;
    struct stat sb;
    if (stat(path, &sb) != 0 && errno == ENOENT) return L3D_OK;
    FILE *f; /* a FIFO would block the open: refused unread */
    l3d_status ost = l3d_fopen_regular(path, "metrics file", &f, NULL);
    if (ost != L3D_OK) return ost;
    size_t cap = 1 << 16, n = 0;
    char *text = malloc(cap), line[8192];
    text[0] = '\0';
    while (fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "\"step\":");
        size_t len = strlen(line);
        if (len == 0 || line[len - 1] != '\n') continue; /* cut short (or too long to be ours) */
        if (p ? strtoll(p + 7, NULL, 10) > step : strncmp(line, "{\"run\":", 7) != 0) continue;
        size_t k = strlen(line);
        if (n + k + 1 > cap) text = realloc(text, cap = 2 * (n + k + 1));
        memcpy(text + n, line, k + 1);
        n += k;
    }
    fclose(f);
    char dir[PATH_CAP];
    join(dir, sizeof dir, path, "", "");
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = '\0';
    else
        strcpy(dir, ".");
    l3d_status st = write_text_atomic(path, dir, text);
    free(text);
    return st;
}
