/* Saving a sharded checkpoint (include/llm3d/ckpt.h): every rank writes its pieces' files into a
 * temporary directory, rank 0 the manifest, then the directory is renamed into place, `latest`
 * rewritten and old steps of this run pruned; --overwrite's clearing. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
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

/* What one piece's file holds: its parameters (np elements of pdt; device memory of be) and its
 * optimizer range of the moments m and v (ocount elements of mdt each, from start ostart). */
struct piece {
    int rank;
    int64_t chunk, step;
    struct l3d_backend *be;
    const void *params, *m, *v;
    int64_t np, ostart, ocount;
    enum l3d_dtype pdt, mdt;
    const struct l3d_ckpt_pieces *pieces; /* the parameters' source when params is NULL */
};

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
    struct l3d_ckpt_stage sg;
    l3d_status st = l3d_ckpt_stage_init(&sg, pbytes > mbytes ? pbytes : mbytes, path);
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
        st = l3d_ckpt_write_device(fd, path, pc->be, pc->params, pbytes, &sg, &h);
    else if (st == L3D_OK && pc->np > 0)
        st = write_pieces(fd, path, pc, &sg, &h);
    if (st == L3D_OK && pc->ocount > 0) {
        /* the crash point: half-way through the moments */
        st = l3d_ckpt_write_device(fd, path, pc->be, pc->m, mbytes / 2, &sg, &h);
        if (pc->chunk == 0) test_kill(pc->step, "shard", pc->rank);
        if (st == L3D_OK)
            st = l3d_ckpt_write_device(fd, path, pc->be, (const char *)pc->m + mbytes / 2,
                                       mbytes - mbytes / 2, &sg, &h);
        if (st == L3D_OK) st = l3d_ckpt_write_device(fd, path, pc->be, pc->v, mbytes, &sg, &h);
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

l3d_status l3d_ckpt_save(const char *root, int keep, struct l3d_comm *world,
                         const struct l3d_ckpt_layout *lay, const struct l3d_ckpt_state *s,
                         struct l3d_gpt *const *m, const struct l3d_adamw *opt,
                         const struct l3d_ckpt_pieces *pieces, struct l3d_ckpt_io *io,
                         bool *report) {
    double t0 = l3d_time_s();
    memset(io, 0, sizeof *io);
    char tmp[L3D_CKPT_PATH_CAP] = "", name[64];
    step_name(name, sizeof name, s->step);
    l3d_status st = l3d_ckpt_long_path(root);
    if (st == L3D_OK) l3d_ckpt_join(tmp, sizeof tmp, root, "/.tmp_", name);
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
        if (st == L3D_OK && mkdir(tmp, 0755) != 0)
            st = l3d_error(L3D_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
    }
    if ((st = l3d_comm_agree(world, st, report)) != L3D_OK) return st;

    /* parameters from data-parallel rank 0; moments from every rank with ZeRO, else rank 0;
     * each chunk its own file */
    bool wparams = lay->dp_rank == 0, wmoments = lay->layout.zero > 0 || lay->dp_rank == 0;
    const int nc = l3d_ckpt_chunks_of(lay);
    const enum l3d_dtype pdt = l3d_ckpt_params_dtype(m[0]), mdt = L3D_CKPT_MOMENTS_DTYPE;
    struct l3d_ckpt_rank_rec *recs =
        l3d_calloc((size_t)world->size * (size_t)nc * sizeof *recs, "checkpoint records");
    for (int c = 0; c < nc && st == L3D_OK; c++) {
        struct l3d_ckpt_rank_rec *me = &recs[world->rank * nc + c];
        me->params = wparams ? m[c]->num_params : 0;
        me->opt_start = wmoments ? opt[c].start : 0;
        me->opt_count = wmoments ? opt[c].n : 0;
        me->tp_rank = lay->tp_rank;
        me->pp_rank = lay->pp_rank;
        me->dp_rank = lay->dp_rank;
        me->chunk = c;
        shard_to_rec(&m[c]->shard, me);
        char path[L3D_CKPT_PATH_CAP], fname[64];
        l3d_ckpt_piece_name(fname, sizeof fname, nc, world->rank, c);
        l3d_ckpt_join(path, sizeof path, tmp, "/", fname);
        /* every chunk of every rank in the same types: the manifest says them once */
        L3D_ASSERT(l3d_ckpt_params_dtype(m[c]) == pdt);
        const struct piece pc = {
            .rank = world->rank, .chunk = c, .step = s->step, .be = m[c]->be,
            .params = m[c]->params, .np = me->params, .pdt = pdt,
            .m = opt[c].m, .v = opt[c].v, .ostart = me->opt_start, .ocount = me->opt_count,
            .mdt = mdt, .pieces = pieces && pieces[c].piece > 0 ? &pieces[c] : NULL};
        L3D_ASSERT(pc.params || pc.pieces || pc.np == 0);
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
    if (st != L3D_OK && world->rank == 0 && tmp[0]) l3d_remove_tree(tmp);
    for (int i = 0; i < world->size * nc; i++) io->bytes_total += recs[i].bytes;
    l3d_free(recs);
    io->seconds = l3d_time_s() - t0;
    return st;
}
