/* Saving a sharded checkpoint (include/llm3d/ckpt.h): every rank writes its pieces' files into a
 * temporary directory, rank 0 the manifest, then the directory is renamed into place, `latest`
 * rewritten and old steps of this run pruned; --overwrite's clearing. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt-impl.h"
#include "llm3d/ckpt.h"

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

static void step_name(char *buf, size_t cap, int64_t step) {
    snprintf(buf, cap, "step_%08lld", (long long)step);
}

/* What one piece's file holds: its parameters (np elements of pdt; device memory of be, or host
 * memory when be is NULL: an asynchronous save's staged copy) and its optimizer range of the
 * moments m and v (ocount elements of mdt each, from start ostart). */
struct piece {
    int rank;
    int64_t chunk, step;
    struct l3d_backend *be;
    const void *params, *m, *v;
    int64_t np, ostart, ocount;
    enum l3d_dtype pdt, mdt;
    const struct l3d_ckpt_pieces *pieces; /* the parameters' source when params is NULL */
};

/* n bytes of src (the piece's device memory, or host memory) to fd. */
static l3d_status put(int fd, const char *path, const struct piece *pc, const void *src, size_t n,
                      const struct l3d_ckpt_stage *sg, struct l3d_ckpt_hasher *h) {
    if (!pc->be) return l3d_ckpt_write_all(fd, path, src, n, h);
    return l3d_ckpt_write_device(fd, path, pc->be, src, n, sg, h);
}

/* The parameters pulled a piece at a time (fp32: the types of a view) and written. */
static l3d_status write_pieces(int fd, const char *path, const struct piece *pc,
                               const struct l3d_ckpt_stage *sg, struct l3d_ckpt_hasher *h) {
    const struct l3d_ckpt_pieces *q = pc->pieces;
    L3D_ASSERT(q && q->piece > 0 && q->get && pc->pdt == L3D_F32);
    l3d_status st = L3D_OK;
    for (int64_t off = 0, n; st == L3D_OK && off < pc->np; off += n) {
        n = pc->np - off < q->piece ? pc->np - off : q->piece;
        const float *p = q->get(q->ctx, off, n);
        st = l3d_ckpt_write_device(fd, path, pc->be, p, (size_t)n * sizeof(float), sg, h);
    }
    return st;
}

static l3d_status write_rank_file(const char *path, const struct piece *pc,
                                  struct l3d_ckpt_rank_rec *rec) {
    const size_t pbytes = (size_t)pc->np * l3d_dtype_size(pc->pdt);
    const size_t mbytes = (size_t)pc->ocount * l3d_dtype_size(pc->mdt);
    rec->bytes = L3D_CKPT_HEADER_BYTES + (int64_t)(pbytes + 2 * mbytes);
    struct l3d_ckpt_stage sg = {0};
    l3d_status st = pc->be ? l3d_ckpt_stage_init(&sg, pbytes > mbytes ? pbytes : mbytes, path)
                           : L3D_OK; /* a staged copy is written as it is */
    if (st != L3D_OK) return st;
    /* a new name in the save's own new directory: anything there already is refused */
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd < 0) {
        l3d_free(sg.p);
        return l3d_error(L3D_ERR_IO, "cannot create %s: %s", path, strerror(errno));
    }
    struct l3d_ckpt_hasher h;
    l3d_ckpt_hash_init(&h);
    uint8_t hdr[L3D_CKPT_HEADER_BYTES] = {0};
    int64_t f[5] = {L3D_CKPT_FORMAT, pc->rank, pc->step, pc->np, pc->ocount};
    memcpy(hdr, L3D_CKPT_FILE_MAGIC, 8);
    memcpy(hdr + 8, f, sizeof f);
    memcpy(hdr + 48, &pc->ostart, 8);
    memcpy(hdr + 56, &pc->chunk, 8);
    const char *pname = l3d_dtype_name(pc->pdt), *mname = l3d_dtype_name(pc->mdt);
    memcpy(hdr + 64, pname, strlen(pname)); /* NUL-padded to 8 */
    memcpy(hdr + 72, mname, strlen(mname));
    st = l3d_ckpt_write_all(fd, path, hdr, sizeof hdr, &h);
    if (st == L3D_OK && pc->params)
        st = put(fd, path, pc, pc->params, pbytes, &sg, &h);
    else if (st == L3D_OK && pc->np > 0)
        st = write_pieces(fd, path, pc, &sg, &h);
    if (st == L3D_OK && pc->ocount > 0) {
        /* the crash point: half-way through the moments */
        st = put(fd, path, pc, pc->m, mbytes / 2, &sg, &h);
        if (pc->chunk == 0) test_kill(pc->step, "shard", pc->rank);
        if (st == L3D_OK)
            st = put(fd, path, pc, (const char *)pc->m + mbytes / 2, mbytes - mbytes / 2, &sg, &h);
        if (st == L3D_OK) st = put(fd, path, pc, pc->v, mbytes, &sg, &h);
    }
    if (st == L3D_OK && fsync(fd) != 0)
        st = l3d_error(L3D_ERR_IO, "cannot sync %s: %s", path, strerror(errno));
    if (close(fd) != 0 && st == L3D_OK)
        st = l3d_error(L3D_ERR_IO, "cannot close %s: %s", path, strerror(errno));
    l3d_free(sg.p);
    rec->hash = l3d_ckpt_hash_final(&h);
    return st;
}

static void shard_to_rec(const struct l3d_shard *s, struct l3d_ckpt_rank_rec *r) {
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
    r->expert_start = s->expert_start;
    r->expert_count = s->expert_count;
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

/* Removes step directories below `step` beyond the newest `keep` of this run's (newer ones are
 * left alone: they belong to a run this one was resumed before). Only exact step names whose
 * manifest is this run's: a user's step_00000003.bak, or another run's checkpoint, stays. */
static void prune(const char *root, int64_t step, int keep, uint64_t run_id) {
    DIR *d = opendir(root);
    if (!d) return;
    char *names[4096];
    int n = 0;
    struct dirent *e;
    char cur[64], p[L3D_CKPT_PATH_CAP], m[L3D_CKPT_PATH_CAP];
    struct stat sb;
    step_name(cur, sizeof cur, step);
    while ((e = readdir(d)) && n < 4096) {
        if (!l3d_ckpt_is_step_name(e->d_name) || strcmp(e->d_name, cur) > 0) continue;
        l3d_ckpt_join(p, sizeof p, root, "/", e->d_name);
        l3d_ckpt_join(m, sizeof m, p, "/", "manifest");
        /* a checkpoint (it has a manifest) of this run (0: of callers that set no id) */
        uint64_t id;
        if (stat(m, &sb) == 0 && l3d_ckpt_run_id(p, &id) == L3D_OK && id == run_id)
            names[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], cmp_str);
    for (int i = 0; i < n; i++) {
        if (i < n - keep) {
            l3d_ckpt_join(p, sizeof p, root, "/", names[i]);
            l3d_remove_tree(p);
        }
        free(names[i]);
    }
}

l3d_status l3d_ckpt_clear(const char *root, int *removed) {
    if (removed) *removed = 0;
    l3d_status st = l3d_ckpt_long_path(root);
    if (st != L3D_OK) return st;
    DIR *d = opendir(root);
    if (!d) return errno == ENOENT ? L3D_OK
                                   : l3d_error(L3D_ERR_IO, "cannot read %s: %s", root,
                                               strerror(errno));
    struct dirent *e;
    char p[L3D_CKPT_PATH_CAP], m[L3D_CKPT_PATH_CAP];
    struct stat sb;
    while ((e = readdir(d))) {
        l3d_ckpt_join(p, sizeof p, root, "/", e->d_name);
        if (strcmp(e->d_name, "latest") == 0 || strcmp(e->d_name, "latest.tmp") == 0) {
            if (unlink(p) != 0 && st == L3D_OK)
                st = l3d_error(L3D_ERR_IO, "cannot remove %s: %s", p, strerror(errno));
        } else if (l3d_ckpt_is_step_name(e->d_name) || strncmp(e->d_name, ".tmp_step_", 10) == 0) {
            l3d_ckpt_join(m, sizeof m, p, "/", "manifest");
            if (e->d_name[0] == 's' && stat(m, &sb) != 0) continue; /* not a checkpoint */
            l3d_remove_tree(p);
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
                          const struct l3d_model_spec *cfg, enum l3d_dtype pdt,
                          enum l3d_dtype mdt, const struct l3d_ckpt_layout *lay,
                          const struct l3d_ckpt_state *s, const struct l3d_ckpt_rank_rec *recs) {
    size_t cap = 4096 + (size_t)lay->world * (size_t)l3d_ckpt_chunks_of(lay) * 512;
    char *text = l3d_alloc(cap, "checkpoint manifest");
    l3d_ckpt_manifest_print(text, cap, cfg, pdt, mdt, lay, s, recs);
    char path[L3D_CKPT_PATH_CAP], dst[L3D_CKPT_PATH_CAP], name[64];
    l3d_ckpt_join(path, sizeof path, tmp, "/", "manifest");
    l3d_status st = l3d_ckpt_write_text_atomic(path, text);
    l3d_free(text);
    if (st != L3D_OK) return st;
    test_kill(s->step, "rename", 0);
    step_name(name, sizeof name, s->step);
    l3d_ckpt_join(dst, sizeof dst, root, "/", name);
    /* a directory of the same step (a run resumed from an earlier step) is swapped atomically */
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, dst, RENAME_EXCHANGE) == 0) {
        l3d_remove_tree(tmp);
    } else if (errno == ENOENT) {
        if (rename(tmp, dst) != 0)
            return l3d_error(L3D_ERR_IO, "cannot rename %s to %s: %s", tmp, dst, strerror(errno));
    } else {
        return l3d_error(L3D_ERR_IO, "cannot replace %s: %s", dst, strerror(errno));
    }
    if ((st = l3d_ckpt_fsync_path(root)) != L3D_OK) return st;
    test_kill(s->step, "latest", 0);
    char line[80];
    snprintf(line, sizeof line, "%s\n", name);
    l3d_ckpt_join(path, sizeof path, root, "/", "latest");
    if ((st = l3d_ckpt_write_text_atomic(path, line)) != L3D_OK) return st;
    prune(root, s->step, keep, s->run_id);
    return L3D_OK;
}

/* One save between its phases: the temporary directory made (open), the rank files written
 * (write: no communication, so an asynchronous save runs it on its writer thread), then the
 * records gathered and the directory published (close). */
struct l3d_ckpt_job {
    char root[L3D_CKPT_PATH_CAP], tmp[L3D_CKPT_PATH_CAP];
    int keep, nc, rank, world;
    struct l3d_ckpt_layout lay;
    struct l3d_ckpt_state s;
    struct l3d_model_spec cfg;
    enum l3d_dtype pdt, mdt;
    struct l3d_ckpt_rank_rec *recs;  /* world x nc; this rank's filled by write */
    struct piece *pcs;               /* this rank's nc pieces */
    l3d_status written;              /* write's status */
    int64_t bytes_rank;
    double t0;
};

static void job_free(struct l3d_ckpt_job *j) {
    l3d_free(j->recs);
    l3d_free(j->pcs);
    j->recs = NULL;
    j->pcs = NULL;
}

/* The temporary directory (rank 0, after removing those of saves that crashed), agreed; then
 * this rank's records and pieces. Collective. */
static l3d_status job_open(struct l3d_ckpt_job *j, const char *root, int keep,
                           struct l3d_comm *world, const struct l3d_ckpt_layout *lay,
                           const struct l3d_ckpt_state *s, struct l3d_gpt *const *m,
                           const struct l3d_adamw *opt, const struct l3d_ckpt_pieces *pieces,
                           bool *report) {
    memset(j, 0, sizeof *j);
    j->t0 = l3d_time_s();
    char name[64];
    step_name(name, sizeof name, s->step);
    l3d_status st = l3d_ckpt_long_path(root);
    if (st == L3D_OK) {
        snprintf(j->root, sizeof j->root, "%s", root);
        l3d_ckpt_join(j->tmp, sizeof j->tmp, root, "/.tmp_", name);
    }
    if (st == L3D_OK && world->rank == 0) {
        st = l3d_mkdir_p(root);
        DIR *d = st == L3D_OK ? opendir(root) : NULL;
        struct dirent *e;
        char p[L3D_CKPT_PATH_CAP];
        while (d && (e = readdir(d))) /* left by a save that crashed */
            if (strncmp(e->d_name, ".tmp_", 5) == 0) {
                l3d_ckpt_join(p, sizeof p, root, "/", e->d_name);
                l3d_remove_tree(p);
            }
        if (d) closedir(d);
        if (st == L3D_OK && mkdir(j->tmp, 0755) != 0)
            st = l3d_error(L3D_ERR_IO, "cannot create %s: %s", j->tmp, strerror(errno));
    }
    if ((st = l3d_comm_agree(world, st, report)) != L3D_OK) return st;
    j->keep = keep, j->lay = *lay, j->s = *s, j->cfg = m[0]->cfg;
    j->rank = world->rank, j->world = world->size, j->nc = l3d_ckpt_chunks_of(lay);
    j->pdt = l3d_ckpt_params_dtype(m[0]), j->mdt = L3D_CKPT_MOMENTS_DTYPE;
    /* parameters from data-parallel rank 0 (expert parallelism: the first ep, each its
     * experts); moments from every rank with ZeRO, else from those; each chunk its own file */
    bool wparams = lay->dp_rank < (lay->layout.ep > 1 ? lay->layout.ep : 1);
    bool wmoments = lay->layout.zero > 0 || wparams;
    j->recs = l3d_calloc((size_t)j->world * (size_t)j->nc * sizeof *j->recs, "checkpoint records");
    j->pcs = l3d_calloc((size_t)j->nc * sizeof *j->pcs, "checkpoint pieces");
    for (int c = 0; c < j->nc; c++) {
        struct l3d_ckpt_rank_rec *me = &j->recs[j->rank * j->nc + c];
        me->params = wparams ? m[c]->num_params : 0;
        me->opt_start = wmoments ? opt[c].start : 0;
        me->opt_count = wmoments ? opt[c].n : 0;
        me->tp_rank = lay->tp_rank;
        me->pp_rank = lay->pp_rank;
        me->dp_rank = lay->dp_rank;
        me->chunk = c;
        shard_to_rec(&m[c]->shard, me);
        /* every chunk of every rank in the same types: the manifest says them once */
        L3D_ASSERT(l3d_ckpt_params_dtype(m[c]) == j->pdt);
        j->pcs[c] = (struct piece){
            .rank = j->rank, .chunk = c, .step = s->step, .be = m[c]->be,
            .params = m[c]->params, .np = me->params, .pdt = j->pdt,
            .m = opt[c].m, .v = opt[c].v, .ostart = me->opt_start, .ocount = me->opt_count,
            .mdt = j->mdt, .pieces = pieces && pieces[c].piece > 0 ? &pieces[c] : NULL};
        L3D_ASSERT(j->pcs[c].params || j->pcs[c].pieces || j->pcs[c].np == 0);
    }
    return L3D_OK;
}

/* This rank's files into the temporary directory; no communication. */
static void job_write(struct l3d_ckpt_job *j) {
    l3d_status st = L3D_OK;
    for (int c = 0; c < j->nc && st == L3D_OK; c++) {
        struct l3d_ckpt_rank_rec *me = &j->recs[j->rank * j->nc + c];
        char path[L3D_CKPT_PATH_CAP], fname[64];
        l3d_ckpt_piece_name(fname, sizeof fname, j->nc, j->rank, c);
        l3d_ckpt_join(path, sizeof path, j->tmp, "/", fname);
        st = write_rank_file(path, &j->pcs[c], me);
        me->status = st;
        j->bytes_rank += me->bytes;
    }
    j->written = st;
}

/* Every rank's write agreed, the records gathered, the directory published by rank 0 (or, when
 * a rank failed, removed). Collective; frees the job. */
static l3d_status job_close(struct l3d_ckpt_job *j, struct l3d_comm *world,
                            struct l3d_ckpt_io *io, bool *report) {
    l3d_status st = l3d_comm_agree(world, j->written, report);
    if (st == L3D_OK) {
        if (world->size > 1)
            l3d_comm_all_gather(world, j->recs, (int64_t)sizeof *j->recs * j->nc, L3D_U8, NULL);
        if (world->rank == 0)
            st = publish(j->root, j->tmp, j->keep, &j->cfg, j->pdt, j->mdt, &j->lay, &j->s,
                         j->recs);
        st = l3d_comm_agree(world, st, report);
    }
    /* a failed save leaves no temporary directory behind (once every rank is done writing) */
    if (st != L3D_OK && world->rank == 0 && j->tmp[0]) l3d_remove_tree(j->tmp);
    memset(io, 0, sizeof *io);
    for (int i = 0; i < world->size * j->nc; i++) io->bytes_total += j->recs[i].bytes;
    io->bytes_rank = j->bytes_rank;
    io->seconds = l3d_time_s() - j->t0;
    job_free(j);
    return st;
}

l3d_status l3d_ckpt_save(const char *root, int keep, struct l3d_comm *world,
                         const struct l3d_ckpt_layout *lay, const struct l3d_ckpt_state *s,
                         struct l3d_gpt *const *m, const struct l3d_adamw *opt,
                         const struct l3d_ckpt_pieces *pieces, struct l3d_ckpt_io *io,
                         bool *report) {
    memset(io, 0, sizeof *io);
    struct l3d_ckpt_job j;
    l3d_status st = job_open(&j, root, keep, world, lay, s, m, opt, pieces, report);
    if (st != L3D_OK) {
        job_free(&j);
        io->seconds = l3d_time_s() - j.t0;
        return st;
    }
    job_write(&j);
    return job_close(&j, world, io, report);
}

/* ---- asynchronous saves ------------------------------------------------------------------- */

struct l3d_ckpt_async {
    char *staging;               /* host copies of this rank's pieces, allocated once */
    size_t cap;
    struct l3d_ckpt_job job;
    pthread_t thread;
    bool running;                /* a save begun and not closed */
    atomic_int done;             /* its writer thread has finished */
    double stall_s;              /* the last begin's time, copying included */
};

size_t l3d_ckpt_async_bytes(const struct l3d_ckpt_layout *lay, struct l3d_gpt *const *m,
                            const struct l3d_adamw *opt) {
    bool wparams = lay->dp_rank == 0, wmoments = lay->layout.zero > 0 || lay->dp_rank == 0;
    size_t b = 0;
    for (int c = 0; c < l3d_ckpt_chunks_of(lay); c++) {
        if (wparams)
            b += (size_t)m[c]->num_params * l3d_dtype_size(l3d_ckpt_params_dtype(m[c])) + 64;
        if (wmoments) b += 2 * ((size_t)opt[c].n * l3d_dtype_size(L3D_CKPT_MOMENTS_DTYPE) + 64);
    }
    return b;
}

l3d_status l3d_ckpt_async_init(struct l3d_ckpt_async **out, size_t bytes) {
    struct l3d_ckpt_async *a = l3d_calloc(sizeof *a, "asynchronous checkpoint");
    a->cap = bytes;
    /* allocated and touched now, not in the step loop: the copies then run at memory speed */
    a->staging = bytes ? l3d_alloc(bytes, "asynchronous checkpoint staging") : NULL;
    if (bytes) memset(a->staging, 0, bytes);
    *out = a;
    return L3D_OK;
}

/* Test hook: L3D_CKPT_TEST_SLOW_MS=N makes a background writer wait N ms before it writes, so
 * the tests can act while a save is in flight (a save due meanwhile, a signal, a kill). */
static void test_slow(void) {
    const char *v = getenv("L3D_CKPT_TEST_SLOW_MS");
    long ms = v ? strtol(v, NULL, 10) : 0;
    if (ms > 0) nanosleep(&(struct timespec){.tv_sec = ms / 1000, .tv_nsec = ms % 1000 * 1000000L},
                          NULL);
}

static void *writer(void *arg) {
    struct l3d_ckpt_async *a = arg;
    test_slow();
    job_write(&a->job);
    atomic_store(&a->done, 1);
    return NULL;
}

/* Copies n bytes of the piece's memory (device or host) into the staging at *off. */
static const void *stage(struct l3d_ckpt_async *a, size_t *off, struct l3d_backend *be,
                         const void *src, size_t n) {
    char *dst = a->staging + *off;
    L3D_ASSERT(*off + n <= a->cap);
    if (n) l3d_be_copy_d2h(be, dst, src, n);
    *off += (n + 63) / 64 * 64;
    return dst;
}

l3d_status l3d_ckpt_save_begin(struct l3d_ckpt_async *a, const char *root, int keep,
                               struct l3d_comm *world, const struct l3d_ckpt_layout *lay,
                               const struct l3d_ckpt_state *s, struct l3d_gpt *const *m,
                               const struct l3d_adamw *opt, bool *report) {
    L3D_ASSERT(!a->running);
    double t0 = l3d_time_s();
    l3d_status st = job_open(&a->job, root, keep, world, lay, s, m, opt, NULL, report);
    if (st != L3D_OK) {
        job_free(&a->job);
        return st;
    }
    size_t off = 0;
    for (int c = 0; c < a->job.nc; c++) { /* the step's state copied: training may go on */
        struct piece *pc = &a->job.pcs[c];
        size_t pb = (size_t)pc->np * l3d_dtype_size(pc->pdt);
        size_t mb = (size_t)pc->ocount * l3d_dtype_size(pc->mdt);
        if (pc->np) pc->params = stage(a, &off, pc->be, pc->params, pb);
        if (pc->ocount) {
            pc->m = stage(a, &off, pc->be, pc->m, mb);
            pc->v = stage(a, &off, pc->be, pc->v, mb);
        }
        l3d_be_sync(pc->be);
        pc->be = NULL; /* host memory from here */
    }
    atomic_store(&a->done, 0);
    if (pthread_create(&a->thread, NULL, writer, a) != 0) {
        job_write(&a->job); /* no thread: written here, the save still completes */
        atomic_store(&a->done, 1);
        a->thread = pthread_self();
    }
    a->running = true;
    a->stall_s = l3d_time_s() - t0;
    return L3D_OK;
}

bool l3d_ckpt_save_running(const struct l3d_ckpt_async *a) {
    return a && a->running;
}

double l3d_ckpt_async_stall(const struct l3d_ckpt_async *a) {
    return a->stall_s;
}

l3d_status l3d_ckpt_save_poll(struct l3d_ckpt_async *a, struct l3d_comm *world, bool wait,
                              bool *closed, int64_t *step, struct l3d_ckpt_io *io, bool *report) {
    *closed = false;
    if (!a->running) return L3D_OK;
    /* every rank the same verdict: closed when no rank's writer is still busy */
    int32_t busy = !atomic_load(&a->done);
    if (!wait && world->size > 1) l3d_comm_all_reduce(world, &busy, 1, L3D_I32, L3D_MAX, NULL);
    if (!wait && busy) return L3D_OK;
    if (!pthread_equal(a->thread, pthread_self())) pthread_join(a->thread, NULL);
    a->running = false;
    *closed = true;
    *step = a->job.s.step;
    return job_close(&a->job, world, io, report);
}

void l3d_ckpt_async_free(struct l3d_ckpt_async *a) {
    if (!a) return;
    if (a->running && !pthread_equal(a->thread, pthread_self())) pthread_join(a->thread, NULL);
    job_free(&a->job);
    l3d_free(a->staging);
    l3d_free(a);
}
