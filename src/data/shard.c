/* Token shards in llm.c's format: the validating reader and the atomic writer. See
 * include/llm3d/data.h for the format.
 *
 * Files are mapped read-only (MAP_SHARED), so the DP ranks on one node share one copy of the data
 * in the page cache instead of each holding its own. Tokens are used in place: the host must be
 * little-endian, like the format. */
#include "llm3d/data.h"
#include "llm3d/file.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "llm3d reads llm.c token shards in place: a little-endian host is required"
#endif

struct l3d_data_file {
    char *path;
    void *map; /* the whole file, or NULL */
    size_t map_bytes;
    const void *tokens; /* map + header: uint16 or uint32 (wide) */
    int64_t ntok;
    bool wide;
};

struct l3d_data {
    int nfiles;
    int64_t ntok;
    struct l3d_data_file *files;
};

static char *dup_string(const char *s, const char *what) {
    size_t n = strlen(s) + 1;
    char *d = l3d_alloc(n, what);
    memcpy(d, s, n);
    return d;
}

static bool has_glob_chars(const char *s) { return strpbrk(s, "*?[") != NULL; }

/* Index of the first token >= vocab, or -1. The max pass vectorises; the search runs only when a
 * bad token exists. */
#define FIRST_BAD(T)                                                                              \
    static int64_t first_bad_##T(const T *tok, int64_t n, int64_t vocab) {                        \
        T mx = 0;                                                                                 \
        for (int64_t i = 0; i < n; i++) mx = tok[i] > mx ? tok[i] : mx;                           \
        if ((int64_t)mx < vocab) return -1;                                                       \
        for (int64_t i = 0; i < n; i++)                                                           \
            if ((int64_t)tok[i] >= vocab) return i;                                               \
        return -1;                                                                                \
    }
FIRST_BAD(uint16_t)
FIRST_BAD(uint32_t)

/* Opens, checks and maps one shard into f (whose path is set). On error f->map stays NULL. */
static l3d_status open_file(struct l3d_data_file *f, int64_t vocab_size) {
    const char *path = f->path;
    int fd;
    int64_t fsize;
    l3d_status ost = l3d_open_regular(path, "token shard", &fd, &fsize);
    if (ost != L3D_OK) return ost;
    long long size = (long long)fsize;
    if (size < L3D_SHARD_HEADER_BYTES) {
        close(fd);
        return l3d_error(L3D_ERR_FORMAT,
                         "%s has %lld bytes, fewer than the %d-byte header of an llm.c token shard",
                         path, size, L3D_SHARD_HEADER_BYTES);
    }
    int32_t header[L3D_SHARD_HEADER_INTS];
    ssize_t got = pread(fd, header, sizeof header, 0);
    if (got != (ssize_t)sizeof header) {
        int e = got < 0 ? errno : EIO;
        close(fd);
        return l3d_error(L3D_ERR_IO, "cannot read the header of %s: %s", path, strerror(e));
    }
    bool wide = header[0] == L3D_SHARD32_MAGIC;
    if (header[0] != L3D_SHARD_MAGIC && !wide) {
        close(fd);
        return l3d_error(L3D_ERR_FORMAT,
                         "%s has magic number %d where %d (uint16 tokens) or %d (uint32 tokens) "
                         "was expected: it is not an llm.c token shard",
                         path, (int)header[0], L3D_SHARD_MAGIC, L3D_SHARD32_MAGIC);
    }
    int version = wide ? L3D_SHARD32_VERSION : L3D_SHARD_VERSION;
    if (header[1] != version) {
        close(fd);
        return l3d_error(L3D_ERR_FORMAT,
                         "%s has shard version %d, but its magic %d goes with version %d", path,
                         (int)header[1], (int)header[0], version);
    }
    int width = wide ? 4 : 2;
    long long ntok = header[2];
    long long expect = L3D_SHARD_HEADER_BYTES + width * ntok;
    if (ntok < 0) {
        close(fd);
        return l3d_error(L3D_ERR_FORMAT, "%s has a negative token count (%lld) in its header", path,
                         ntok);
    }
    if (size < expect) {
        close(fd);
        return l3d_error(L3D_ERR_FORMAT,
                         "%s is truncated: its header says %lld tokens = %lld bytes with the header, "
                         "but the file has %lld bytes",
                         path, ntok, expect, size);
    }
    if (size > expect) {
        close(fd);
        return l3d_error(L3D_ERR_FORMAT,
                         "%s has %lld bytes after its tokens: its header says %lld tokens = %lld "
                         "bytes with the header, but the file has %lld bytes",
                         path, size - expect, ntok, expect, size);
    }
    if (ntok < 2) {
        close(fd);
        return l3d_error(L3D_ERR_FORMAT,
                         "%s holds %lld token(s); a shard needs at least 2 (an input and its target)",
                         path, ntok);
    }
    void *map = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED)
        return l3d_error(L3D_ERR_IO, "cannot map token shard %s into memory: %s", path, strerror(e));
    const void *tok = (const char *)map + L3D_SHARD_HEADER_BYTES;
    int64_t bad = vocab_size <= 0 ? -1
                  : wide          ? first_bad_uint32_t(tok, ntok, vocab_size)
                                  : first_bad_uint16_t(tok, ntok, vocab_size);
    if (bad >= 0) {
        l3d_status st_err = l3d_error(
            L3D_ERR_FORMAT,
            "%s holds token %u at byte offset %lld, outside the vocabulary of %lld tokens: the data "
            "was prepared with another tokenizer than the model's (check --vocab and the model's "
            "vocabulary size)",
            path, wide ? ((const uint32_t *)tok)[bad] : ((const uint16_t *)tok)[bad],
            (long long)(L3D_SHARD_HEADER_BYTES + width * bad), (long long)vocab_size);
        munmap(map, (size_t)size);
        return st_err;
    }
    f->map = map;
    f->map_bytes = (size_t)size;
    f->tokens = tok;
    f->ntok = ntok;
    f->wide = wide;
    return L3D_OK;
}

l3d_status l3d_data_open(struct l3d_data **out, const char *pattern, int64_t vocab_size) {
    *out = NULL;
    if (vocab_size < 0)
        return l3d_error(L3D_ERR_ARG, "vocabulary size %lld is negative", (long long)vocab_size);

    /* A plain path is opened as is, so that a missing file reads "cannot open X: No such file". */
    glob_t g;
    memset(&g, 0, sizeof g);
    bool globbed = has_glob_chars(pattern);
    if (globbed) {
        int rc = glob(pattern, 0, NULL, &g);
        if (rc == GLOB_NOMATCH) {
            globfree(&g);
            return l3d_error(L3D_ERR_IO, "no file matches the token shard pattern %s", pattern);
        }
        if (rc != 0) {
            globfree(&g);
            return l3d_error(rc == GLOB_NOSPACE ? L3D_ERR_OOM : L3D_ERR_IO,
                             "cannot list the files matching %s: %s", pattern,
                             rc == GLOB_NOSPACE ? "out of memory" : "a directory could not be read");
        }
    }
    int nfiles = globbed ? (int)g.gl_pathc : 1;

    struct l3d_data *d = l3d_calloc(sizeof *d, "token shards");
    d->files = l3d_calloc((size_t)nfiles * sizeof *d->files, "token shard table");
    d->nfiles = nfiles;
    for (int i = 0; i < nfiles; i++)
        d->files[i].path = dup_string(globbed ? g.gl_pathv[i] : pattern, "token shard path");
    if (globbed) globfree(&g);

    for (int i = 0; i < nfiles; i++) {
        l3d_status st = open_file(&d->files[i], vocab_size);
        if (st != L3D_OK) {
            l3d_data_free(d);
            return st;
        }
        d->ntok += d->files[i].ntok;
    }
    *out = d;
    return L3D_OK;
}

void l3d_data_free(struct l3d_data *data) {
    if (!data) return;
    for (int i = 0; i < data->nfiles; i++) {
        struct l3d_data_file *f = &data->files[i];
        if (f->map) munmap(f->map, f->map_bytes);
        l3d_free(f->path);
    }
    l3d_free(data->files);
    l3d_free(data);
}

int l3d_data_num_files(const struct l3d_data *data) { return data->nfiles; }

int64_t l3d_data_num_tokens(const struct l3d_data *data) { return data->ntok; }

const uint16_t *l3d_data_file_tokens(const struct l3d_data *data, int i, int64_t *n) {
    L3D_ASSERT(i >= 0 && i < data->nfiles && !data->files[i].wide);
    *n = data->files[i].ntok;
    return data->files[i].tokens;
}

int64_t l3d_data_file_ntok(const struct l3d_data *data, int i) {
    L3D_ASSERT(i >= 0 && i < data->nfiles);
    return data->files[i].ntok;
}

bool l3d_data_file_wide(const struct l3d_data *data, int i) {
    L3D_ASSERT(i >= 0 && i < data->nfiles);
    return data->files[i].wide;
}

void l3d_data_file_read(const struct l3d_data *data, int i, int64_t start, int64_t count,
                        int32_t *out) {
    L3D_ASSERT(i >= 0 && i < data->nfiles);
    const struct l3d_data_file *f = &data->files[i];
    L3D_ASSERT(start >= 0 && count >= 0 && start + count <= f->ntok);
    if (f->wide) {
        const uint32_t *t = (const uint32_t *)f->tokens + start;
        for (int64_t k = 0; k < count; k++) out[k] = (int32_t)t[k];
    } else {
        const uint16_t *t = (const uint16_t *)f->tokens + start;
        for (int64_t k = 0; k < count; k++) out[k] = t[k];
    }
}

const char *l3d_data_file_path(const struct l3d_data *data, int i) {
    L3D_ASSERT(i >= 0 && i < data->nfiles);
    return data->files[i].path;
}

void l3d_shard_header(int32_t header[L3D_SHARD_HEADER_INTS], int64_t n, int width) {
    memset(header, 0, L3D_SHARD_HEADER_BYTES);
    header[0] = width == 4 ? L3D_SHARD32_MAGIC : L3D_SHARD_MAGIC;
    header[1] = width == 4 ? L3D_SHARD32_VERSION : L3D_SHARD_VERSION;
    header[2] = (int32_t)n;
}

/* Writes n tokens of `width` bytes (2: uint16, magic 20240520; 4: uint32, magic 20240801). */
static l3d_status shard_write(const char *path, const void *tokens, int64_t n, int width) {
    if (n < 0 || n > L3D_SHARD_MAX_TOKENS)
        return l3d_error(L3D_ERR_ARG,
                         "cannot write %lld tokens to shard %s: a shard holds 0 to %d tokens",
                         (long long)n, path, L3D_SHARD_MAX_TOKENS);
    int32_t header[L3D_SHARD_HEADER_INTS];
    l3d_shard_header(header, n, width);
    struct l3d_out o; /* include/llm3d/file.h: a temporary, fsync, rename */
    if (l3d_out_open(&o, path, "token shard") != L3D_OK) return o.st;
    l3d_out_write(&o, header, sizeof header);
    if (n > 0) l3d_out_write(&o, tokens, (size_t)width * (size_t)n);
    return l3d_out_commit(&o);
}

l3d_status l3d_shard_write(const char *path, const uint16_t *tokens, int64_t n) {
    return shard_write(path, tokens, n, 2);
}

l3d_status l3d_shard_write32(const char *path, const uint32_t *tokens, int64_t n) {
    return shard_write(path, tokens, n, 4);
}
