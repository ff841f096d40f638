/* Byte-level preparation: text files -> llm.c token shards with token = byte value (vocabulary
 * 256), the stand-in tokenizer until BPE exists. Two passes over the inputs: the first checks every
 * file (readable, text) and counts its bytes, so that nothing is written for a bad input and the
 * train/val split and the shard sizes are known; the second streams the bytes into shards, holding
 * one shard in memory at a time. */
#include "llm3d/data.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CHUNK_BYTES ((size_t)1 << 20)

static const char *split_name[2] = {"train", "val"};

/* Streams tokens into the shards of the two splits, train first, in shard sizes fixed up front. */
struct sink {
    const char *dir;
    char *path; /* room for dir + "/train_000000.bin" */
    uint16_t *buf;
    int64_t fill;
    int split, shard; /* the shard being filled, of `want` tokens; split 2 once all are written */
    int64_t want;
    int64_t n[2];   /* tokens per split */
    int nshards[2]; /* shards per split */
};

/* Shard i of a split of n tokens in k shards: equal sizes, the first n % k one token longer. */
static int64_t shard_size(int64_t n, int k, int i) { return n / k + (i < n % k ? 1 : 0); }

/* Moves to the next shard to fill, skipping a split without shards (no validation data). */
static void next_shard(struct sink *s) {
    while (s->split < 2 && s->shard >= s->nshards[s->split]) {
        s->split++;
        s->shard = 0;
    }
    s->fill = 0;
    s->want = s->split < 2 ? shard_size(s->n[s->split], s->nshards[s->split], s->shard) : 0;
}

static void shard_path(char *path, size_t cap, const char *dir, int split, int shard) {
    snprintf(path, cap, "%s/%s_%06d.bin", dir, split_name[split], shard);
}

static size_t path_cap(const char *dir) { return strlen(dir) + 32; }

static l3d_status sink_push(struct sink *s, const unsigned char *bytes, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (s->split >= 2)
            return l3d_error(L3D_ERR_IO, "the input files grew while they were being prepared: "
                             "run llm3d prepare again on files that do not change");
        s->buf[s->fill++] = bytes[i];
        if (s->fill == s->want) {
            shard_path(s->path, path_cap(s->dir), s->dir, s->split, s->shard);
            l3d_status st = l3d_shard_write(s->path, s->buf, s->fill);
            if (st != L3D_OK) return st;
            s->shard++;
            next_shard(s);
        }
    }
    return L3D_OK;
}

/* Reads one input file in chunks: checks it is text and counts its bytes (*nbytes), and feeds
 * them to sink when sink is not NULL. */
static l3d_status read_input(const char *path, unsigned char *chunk, int64_t *nbytes,
                             struct sink *sink) {
    struct stat st;
    if (stat(path, &st) != 0)
        return l3d_error(L3D_ERR_IO, "cannot read %s: %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode))
        return l3d_error(L3D_ERR_IO, "cannot read %s: it is a directory, not a text file", path);
    FILE *fp = fopen(path, "rb");
    if (!fp) return l3d_error(L3D_ERR_IO, "cannot read %s: %s", path, strerror(errno));
    int64_t total = 0;
    for (;;) {
        size_t got = fread(chunk, 1, CHUNK_BYTES, fp);
        const unsigned char *nul = got ? memchr(chunk, 0, got) : NULL;
        if (nul) {
            fclose(fp);
            return l3d_error(L3D_ERR_FORMAT,
                             "%s holds a NUL byte at offset %lld: it is not a text file (byte-level "
                             "preparation takes text only)",
                             path, (long long)(total + (nul - chunk)));
        }
        if (sink && got) {
            l3d_status s = sink_push(sink, chunk, got);
            if (s != L3D_OK) {
                fclose(fp);
                return s;
            }
        }
        total += (int64_t)got;
        if (got < CHUNK_BYTES) break;
    }
    int e = ferror(fp) ? (errno ? errno : EIO) : 0;
    fclose(fp);
    if (e) return l3d_error(L3D_ERR_IO, "cannot read %s: %s", path, strerror(e));
    *nbytes = total;
    return L3D_OK;
}

/* Deletes <split>_NNNNNN.bin with NNNNNN >= the number just written: shards of an earlier run
 * that a "train_*.bin" pattern would otherwise pick up. Returns how many were deleted. */
static l3d_status remove_stale(const char *dir, const int nshards[2], int *removed) {
    *removed = 0;
    DIR *dp = opendir(dir);
    if (!dp) return l3d_error(L3D_ERR_IO, "cannot list %s: %s", dir, strerror(errno));
    char *path = l3d_alloc(path_cap(dir), "shard path");
    l3d_status st = L3D_OK;
    struct dirent *de;
    while ((de = readdir(dp)) != NULL) {
        for (int s = 0; s < 2; s++) {
            size_t pre = strlen(split_name[s]);
            const char *name = de->d_name;
            if (strlen(name) != pre + 11 || strncmp(name, split_name[s], pre) != 0 ||
                name[pre] != '_' || strcmp(name + pre + 7, ".bin") != 0)
                continue;
            int idx = 0;
            bool digits = true;
            for (int k = 0; k < 6; k++) {
                char c = name[pre + 1 + k];
                if (c < '0' || c > '9') digits = false;
                else idx = idx * 10 + (c - '0');
            }
            if (!digits || idx < nshards[s]) continue;
            snprintf(path, path_cap(dir), "%s/%s", dir, name);
            if (unlink(path) == 0)
                ++*removed;
            else if (st == L3D_OK)
                st = l3d_error(L3D_ERR_IO, "cannot delete %s, a shard of an earlier run that "
                               "\"%s_*.bin\" would still match: %s", path, split_name[s],
                               strerror(errno));
        }
    }
    closedir(dp);
    l3d_free(path);
    return st;
}

l3d_status l3d_prepare_bytes(const char *out_dir, char **files, int nfiles, double val_fraction,
                             int64_t shard_tokens, struct l3d_prepare_stats *stats) {
    if (stats) memset(stats, 0, sizeof *stats);
    if (nfiles < 1) return l3d_error(L3D_ERR_ARG, "no input file to prepare");
    if (!(val_fraction >= 0.0 && val_fraction < 1.0))
        return l3d_error(L3D_ERR_ARG, "validation fraction %g is outside [0, 1)", val_fraction);
    if (shard_tokens < 4 || shard_tokens > L3D_SHARD_MAX_TOKENS)
        return l3d_error(L3D_ERR_ARG, "shard size %lld tokens is outside [4, %d]",
                         (long long)shard_tokens, L3D_SHARD_MAX_TOKENS);

    unsigned char *chunk = l3d_alloc(CHUNK_BYTES, "input chunk");
    int64_t total = 0;
    for (int i = 0; i < nfiles; i++) {
        int64_t n;
        l3d_status st = read_input(files[i], chunk, &n, NULL);
        if (st != L3D_OK) {
            l3d_free(chunk);
            return st;
        }
        total += n;
    }
    if (total == 0) {
        l3d_free(chunk);
        return l3d_error(L3D_ERR_FORMAT, "the %d input file(s) hold no text (0 bytes): nothing to "
                         "prepare", nfiles);
    }
    int64_t nval = (int64_t)llround(val_fraction * (double)total);
    if (val_fraction > 0.0 && nval < 2) nval = 2;
    int64_t ntrain = total - nval;
    if (ntrain < 2) {
        l3d_free(chunk);
        return l3d_error(L3D_ERR_FORMAT, "the input holds %lld byte(s), too few for a training "
                         "shard of at least 2 tokens%s", (long long)total,
                         nval ? " and a validation shard of at least 2" : "");
    }
    l3d_status st = l3d_mkdir_p(out_dir);
    if (st != L3D_OK) {
        l3d_free(chunk);
        return st;
    }

    struct sink s = {.dir = out_dir, .n = {ntrain, nval}};
    for (int k = 0; k < 2; k++)
        s.nshards[k] = (int)((s.n[k] + shard_tokens - 1) / shard_tokens);
    int64_t biggest = shard_size(ntrain, s.nshards[0], 0); /* shard 0 is a split's largest */
    if (nval && shard_size(nval, s.nshards[1], 0) > biggest) biggest = shard_size(nval, s.nshards[1], 0);
    s.buf = l3d_try_alloc((size_t)biggest * sizeof *s.buf, "shard buffer");
    if (!s.buf) {
        l3d_free(chunk);
        return l3d_error(L3D_ERR_OOM, "out of memory for a shard of %lld tokens: lower "
                         "--shard-tokens", (long long)biggest);
    }
    s.path = l3d_alloc(path_cap(out_dir), "shard path");
    next_shard(&s);
    for (int i = 0; i < nfiles && st == L3D_OK; i++) {
        int64_t n;
        st = read_input(files[i], chunk, &n, &s);
    }
    if (st == L3D_OK && s.split < 2)
        st = l3d_error(L3D_ERR_IO, "the input files shrank while they were being prepared: run "
                       "llm3d prepare again on files that do not change");
    int removed = 0;
    if (st == L3D_OK) st = remove_stale(out_dir, s.nshards, &removed);
    l3d_free(s.path);
    l3d_free(s.buf);
    l3d_free(chunk);
    if (st != L3D_OK) return st;
    if (stats) {
        stats->files = nfiles;
        stats->tokens = total;
        stats->train_tokens = ntrain;
        stats->val_tokens = nval;
        stats->train_shards = s.nshards[0];
        stats->val_shards = s.nshards[1];
        stats->stale_removed = removed;
    }
    return L3D_OK;
}
