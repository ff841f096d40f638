/* The inputs of llm3d prepare, streamed: plain, gzip (zlib) or zstd (libzstd) files, their type
 * by extension (l3d_input_type), read through one buffer of decompressed bytes, whole or a line at
 * a time; and the expansion of directories into their files (l3d_input_expand). */
#include "llm3d/data.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <zlib.h>
#include <zstd.h>

#define IN_CHUNK ((size_t)1 << 20) /* compressed bytes read at a time, and the line buffer's start */

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

void l3d_input_type(const char *path, bool *jsonl, enum l3d_input_comp *comp) {
    size_t n = strlen(path);
    *comp = L3D_IN_PLAIN;
    if (ends_with(path, ".gz")) *comp = L3D_IN_GZIP, n -= 3;
    else if (ends_with(path, ".zst")) *comp = L3D_IN_ZSTD, n -= 4;
    *jsonl = n >= 6 && strncmp(path + n - 6, ".jsonl", 6) == 0;
}

static const char *comp_name[] = {"plain", "gzip", "zstd"};

l3d_status l3d_input_open(struct l3d_input *in, const char *path) {
    *in = (struct l3d_input){.path = path};
    l3d_input_type(path, &in->jsonl, &in->comp);
    l3d_status st = l3d_fopen_regular(path, in->jsonl ? "JSON Lines file" : "text file", &in->fp,
                                      NULL);
    if (st != L3D_OK) return st;
    if (in->comp == L3D_IN_GZIP) {
        z_stream *z = l3d_alloc(sizeof *z, "gzip stream");
        memset(z, 0, sizeof *z);
        if (inflateInit2(z, 15 + 32) != Z_OK) { /* 15 + 32: a gzip or zlib header, read */
            l3d_free(z);
            fclose(in->fp);
            return l3d_error(L3D_ERR_OOM, "cannot start zlib's decompressor for %s", path);
        }
        in->gz = z;
    } else if (in->comp == L3D_IN_ZSTD) {
        in->zs = ZSTD_createDStream();
        if (!in->zs) {
            fclose(in->fp);
            return l3d_error(L3D_ERR_OOM, "cannot start zstd's decompressor for %s", path);
        }
    }
    if (in->comp != L3D_IN_PLAIN) in->raw = l3d_alloc(IN_CHUNK, "compressed input");
    in->done = true; /* no stream begun yet: an empty file is an empty stream */
    return L3D_OK;
}

void l3d_input_close(struct l3d_input *in) {
    if (in->fp) fclose(in->fp);
    if (in->gz) {
        inflateEnd(in->gz);
        l3d_free(in->gz);
    }
    if (in->zs) ZSTD_freeDStream(in->zs);
    l3d_free(in->raw);
    free(in->line);
    *in = (struct l3d_input){0};
}

/* Refills in->raw from the file when it is used up; false at the end of the file (or an error,
 * which in->fp keeps for the caller). */
static bool refill(struct l3d_input *in) {
    if (in->rpos < in->rlen) return true;
    in->rlen = fread(in->raw, 1, IN_CHUNK, in->fp);
    in->rpos = 0;
    in->disk += (int64_t)in->rlen;
    return in->rlen > 0;
}

static l3d_status read_error(struct l3d_input *in) {
    int e = errno ? errno : EIO;
    return l3d_error(L3D_ERR_IO, "cannot read %s: %s", in->path, strerror(e));
}

static l3d_status truncated(struct l3d_input *in) {
    return l3d_error(L3D_ERR_FORMAT, "%s is truncated: its %s stream ends after %lld compressed "
                     "bytes, before the end its format marks (an interrupted download or copy?)",
                     in->path, comp_name[in->comp], (long long)in->disk);
}

/* Decompresses into dst[0, cap) through zlib: *got bytes, 0 at the end of the file. A file may
 * hold several gzip members one after the other (as `cat a.gz b.gz` makes); one cut short is an
 * error. */
static l3d_status gz_read(struct l3d_input *in, unsigned char *dst, size_t cap, size_t *got) {
    z_stream *z = in->gz;
    z->next_out = dst;
    z->avail_out = (uInt)cap;
    while (z->avail_out == cap) {
        bool more = refill(in); /* at the end, the decompressor may still hold output */
        if (!more && ferror(in->fp)) return read_error(in);
        if (!more && in->done) break;
        if (more && in->done) { /* a new member */
            inflateReset(z);
            in->done = false;
        }
        z->next_in = in->raw + in->rpos;
        z->avail_in = (uInt)(in->rlen - in->rpos);
        int rc = inflate(z, Z_NO_FLUSH);
        in->rpos = in->rlen - z->avail_in;
        if (rc == Z_STREAM_END) in->done = true;
        else if (rc != Z_OK && rc != Z_BUF_ERROR)
            return l3d_error(L3D_ERR_FORMAT, "%s is not a valid gzip file: %s (after %lld "
                             "compressed bytes)", in->path, z->msg ? z->msg : "corrupt data",
                             (long long)in->disk);
        if (!more && !in->done && z->avail_out == cap) return truncated(in);
    }
    *got = cap - z->avail_out;
    return L3D_OK;
}

/* As gz_read, through libzstd: a file of one or more zstd frames. */
static l3d_status zst_read(struct l3d_input *in, unsigned char *dst, size_t cap, size_t *got) {
    ZSTD_outBuffer out = {dst, cap, 0};
    while (out.pos == 0) {
        bool more = refill(in); /* at the end, the decompressor may still hold output */
        if (!more && ferror(in->fp)) return read_error(in);
        if (!more && in->done) break;
        ZSTD_inBuffer zin = {in->raw, in->rlen, in->rpos};
        size_t rc = ZSTD_decompressStream(in->zs, &out, &zin);
        in->rpos = zin.pos;
        if (ZSTD_isError(rc))
            return l3d_error(L3D_ERR_FORMAT, "%s is not a valid zstd file: %s (after %lld "
                             "compressed bytes)", in->path, ZSTD_getErrorName(rc),
                             (long long)in->disk);
        in->done = rc == 0; /* 0: a frame ended here */
        if (!more && !in->done && out.pos == 0) return truncated(in);
    }
    *got = out.pos;
    return L3D_OK;
}

l3d_status l3d_input_read(struct l3d_input *in, void *dst, size_t cap, size_t *got) {
    *got = 0;
    l3d_status st = L3D_OK;
    if (in->comp == L3D_IN_GZIP) st = gz_read(in, dst, cap, got);
    else if (in->comp == L3D_IN_ZSTD) st = zst_read(in, dst, cap, got);
    else {
        *got = fread(dst, 1, cap, in->fp);
        in->disk += (int64_t)*got;
        if (*got == 0 && ferror(in->fp)) st = read_error(in);
    }
    in->bytes += (int64_t)*got;
    return st;
}

l3d_status l3d_input_all(struct l3d_input *in, char **text, size_t *n) {
    size_t cap = IN_CHUNK, len = 0, got = 1;
    char *buf = malloc(cap + 1); /* grown by realloc; the caller frees it with free() */
    L3D_ASSERT(buf != NULL);
    while (got) {
        if (cap - len < IN_CHUNK / 2) {
            cap *= 2;
            char *b2 = realloc(buf, cap + 1);
            L3D_ASSERT(b2 != NULL);
            buf = b2;
        }
        l3d_status st = l3d_input_read(in, buf + len, cap - len, &got);
        if (st != L3D_OK) {
            free(buf);
            return st;
        }
        len += got;
    }
    buf[len] = 0;
    *text = buf;
    *n = len;
    return L3D_OK;
}

l3d_status l3d_input_next_line(struct l3d_input *in, size_t max, const char **line, size_t *len,
                               bool *eof) {
    *eof = false;
    if (in->lpos > 0) { /* the lines before lpos are given back: keep the rest at the front */
        memmove(in->line, in->line + in->lpos, in->llen - in->lpos);
        in->llen -= in->lpos;
        in->lpos = 0;
    }
    size_t scanned = 0;
    for (;;) {
        char *nl = in->llen > scanned ? memchr(in->line + scanned, '\n', in->llen - scanned) : NULL;
        if (nl || in->eof) {
            size_t end = nl ? (size_t)(nl - in->line) : in->llen;
            if (!nl && end == 0) break;
            in->lineno++;
            if (end > max) break;
            *line = in->line;
            *len = end;
            in->lpos = nl ? end + 1 : end;
            return L3D_OK;
        }
        scanned = in->llen;
        if (scanned > max) {
            in->lineno++;
            break;
        }
        if (in->lcap - in->llen < IN_CHUNK / 2) {
            in->lcap = in->lcap ? 2 * in->lcap : IN_CHUNK;
            char *l2 = realloc(in->line, in->lcap);
            L3D_ASSERT(l2 != NULL);
            in->line = l2;
        }
        size_t got;
        l3d_status st = l3d_input_read(in, in->line + in->llen, in->lcap - in->llen, &got);
        if (st != L3D_OK) return st;
        in->llen += got;
        in->eof = got == 0;
    }
    if (in->llen == 0 && in->eof) {
        *eof = true;
        return L3D_OK;
    }
    return l3d_error(L3D_ERR_FORMAT, "%s:%lld: a line longer than %zu bytes (--max-line): split "
                     "the record, or raise --max-line", in->path, (long long)in->lineno, max);
}

/* The file types a directory's listing gives prepare (a file named on the command line may have
 * any name: text unless its extension says otherwise). */
static bool taken(const char *name) {
    static const char *ext[] = {".txt", ".jsonl", ".txt.gz", ".jsonl.gz", ".txt.zst", ".jsonl.zst"};
    if (name[0] == '.') return false; /* hidden: an editor's or a writer's temporary */
    for (size_t i = 0; i < sizeof ext / sizeof *ext; i++)
        if (ends_with(name, ext[i])) return true;
    return false;
}

static int by_name(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void list_add(struct l3d_input_list *l, char *path) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 16;
        char **p2 = realloc(l->paths, (size_t)l->cap * sizeof *p2);
        L3D_ASSERT(p2 != NULL);
        l->paths = p2;
    }
    l->paths[l->n++] = path;
}

/* Appends dir's files of the taken types (not its subdirectories), sorted by name. */
static l3d_status add_dir(struct l3d_input_list *l, const char *dir) {
    DIR *dp = opendir(dir);
    if (!dp) return l3d_error(L3D_ERR_IO, "cannot list the input directory %s: %s", dir,
                              strerror(errno));
    int first = l->n;
    struct dirent *de;
    while ((de = readdir(dp)) != NULL) {
        if (!taken(de->d_name)) continue;
        size_t cap = strlen(dir) + strlen(de->d_name) + 2;
        char *path = malloc(cap);
        L3D_ASSERT(path != NULL);
        snprintf(path, cap, "%s/%s", dir, de->d_name);
        struct stat sb;
        if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode)) list_add(l, path);
        else free(path);
    }
    closedir(dp);
    if (l->n == first)
        return l3d_error(L3D_ERR_ARG, "the input directory %s holds no file prepare takes: name "
                         "them *.txt or *.jsonl, each maybe compressed (.gz, .zst)", dir);
    qsort(l->paths + first, (size_t)(l->n - first), sizeof *l->paths, by_name);
    return L3D_OK;
}

l3d_status l3d_input_expand(char **args, int n, struct l3d_input_list *out) {
    *out = (struct l3d_input_list){0};
    for (int i = 0; i < n; i++) {
        struct stat sb;
        l3d_status st = L3D_OK;
        if (stat(args[i], &sb) == 0 && S_ISDIR(sb.st_mode)) st = add_dir(out, args[i]);
        else {
            char *p = strdup(args[i]);
            L3D_ASSERT(p != NULL);
            list_add(out, p);
        }
        if (st != L3D_OK) {
            l3d_input_list_free(out);
            return st;
        }
    }
    return L3D_OK;
}

void l3d_input_list_free(struct l3d_input_list *l) {
    for (int i = 0; i < l->n; i++) free(l->paths[i]);
    free(l->paths);
    *l = (struct l3d_input_list){0};
}
