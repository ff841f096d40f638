/* Preparation: text files -> llm.c token shards, through a tokenizer (l3d_prepare_bpe, below) or
 * byte by byte (l3d_prepare_bytes: token = byte value, vocabulary 256, no tokenizer files needed).
 * The bytes take two passes over the inputs: the first checks every file (readable, text) and
 * counts its bytes, so that nothing is written for a bad input and the train/val split and the
 * shard sizes are known; the second streams the bytes into shards. BPE encodes once, spooling
 * each split's tokens to an unnamed temporary file, then cuts the spools into shards. Shards are
 * written a chunk at a time (the sink), so memory never holds a whole one. */
#include "llm3d/data.h"

#include <omp.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "llm3d/file.h"
#include "llm3d/json.h"
#include "llm3d/tokenizer.h"
#include "tokenizer/tokenizer-impl.h"

#define CHUNK_BYTES ((size_t)1 << 20)

static const char *split_name[2] = {"train", "val"};

/* Streams tokens into the shards of the two splits, train first, in shard sizes fixed up front:
 * each shard written through the safe writer (include/llm3d/file.h) a chunk at a time, so that
 * memory holds one chunk, not one shard. */
#define SINK_CHUNK ((int64_t)1 << 20) /* tokens */

struct sink {
    const char *dir;
    char *path; /* room for dir + "/train_000000.bin" */
    uint32_t *buf;
    int64_t cap, fill; /* buf's tokens, and those not yet written */
    int64_t put;       /* tokens of this shard given so far */
    bool wide; /* uint32 shards (a vocabulary above 65,536); else the buffer's uint16 in place */
    int split, shard; /* the shard being filled, of `want` tokens; split 2 once all are written */
    int64_t want;
    int64_t n[2];   /* tokens per split */
    int nshards[2]; /* shards per split */
    struct l3d_out out;
    bool open; /* out is this shard's writer */
};

/* Shard i of a split of n tokens in k shards: equal sizes, the first n % k one token longer. */
static int64_t shard_size(int64_t n, int k, int i) { return n / k + (i < n % k ? 1 : 0); }

/* Moves to the next shard to fill, skipping a split without shards (no validation data). */
static void next_shard(struct sink *s) {
    while (s->split < 2 && s->shard >= s->nshards[s->split]) {
        s->split++;
        s->shard = 0;
    }
    s->put = 0;
    s->want = s->split < 2 ? shard_size(s->n[s->split], s->nshards[s->split], s->shard) : 0;
}

static void shard_path(char *path, size_t cap, const char *dir, int split, int shard) {
    snprintf(path, cap, "%s/%s_%06d.bin", dir, split_name[split], shard);
}

static size_t path_cap(const char *dir) { return strlen(dir) + 32; }

/* Writes the buffered tokens to the open shard (narrowed in place to uint16 unless wide: each
 * uint16 lands at or before the uint32 it comes from). */
static l3d_status sink_flush(struct sink *s) {
    size_t width = s->wide ? 4 : 2;
    if (!s->wide) {
        uint16_t *h = (uint16_t *)s->buf;
        for (int64_t k = 0; k < s->fill; k++) h[k] = (uint16_t)s->buf[k];
    }
    l3d_status st = s->fill ? l3d_out_write(&s->out, s->buf, width * (size_t)s->fill) : L3D_OK;
    s->fill = 0;
    return st;
}

static l3d_status sink_put(struct sink *s, uint32_t tok) {
    if (s->split >= 2)
        return l3d_error(L3D_ERR_IO, "the input files grew while they were being prepared: "
                         "run llm3d prepare again on files that do not change");
    if (!s->open) {
        shard_path(s->path, path_cap(s->dir), s->dir, s->split, s->shard);
        if (l3d_out_open(&s->out, s->path, "token shard") != L3D_OK) return s->out.st;
        s->open = true;
        int32_t header[L3D_SHARD_HEADER_INTS];
        l3d_shard_header(header, s->want, s->wide ? 4 : 2);
        l3d_out_write(&s->out, header, sizeof header);
    }
    s->buf[s->fill++] = tok;
    s->put++;
    if (s->fill < s->cap && s->put < s->want) return L3D_OK;
    l3d_status st = sink_flush(s);
    if (st != L3D_OK || s->put < s->want) return st;
    s->open = false;
    st = l3d_out_commit(&s->out);
    if (st != L3D_OK) return st;
    s->shard++;
    next_shard(s);
    return L3D_OK;
}

static l3d_status sink_push(struct sink *s, const unsigned char *bytes, size_t n) {
    for (size_t i = 0; i < n; i++) {
        l3d_status st = sink_put(s, bytes[i]);
        if (st != L3D_OK) return st;
    }
    return L3D_OK;
}

/* Sizes the shards of ntrain + nval tokens (at most shard_tokens each) and allocates the chunk. */
static void sink_open(struct sink *s, const char *out_dir, int64_t ntrain, int64_t nval,
                      int64_t shard_tokens, bool wide) {
    *s = (struct sink){.dir = out_dir, .n = {ntrain, nval}, .wide = wide};
    for (int k = 0; k < 2; k++)
        s->nshards[k] = (int)((s->n[k] + shard_tokens - 1) / shard_tokens);
    s->cap = shard_tokens < SINK_CHUNK ? shard_tokens : SINK_CHUNK;
    s->buf = l3d_alloc((size_t)s->cap * sizeof *s->buf, "shard chunk");
    s->path = l3d_alloc(path_cap(out_dir), "shard path");
    next_shard(s);
}

/* Drops a shard left half written by an error. */
static void sink_close(struct sink *s) {
    if (s->open) l3d_out_abort(&s->out);
    s->open = false;
    l3d_free(s->path);
    l3d_free(s->buf);
    s->path = NULL;
    s->buf = NULL;
}

/* Reads one input file (plain, .gz or .zst text) in chunks: checks it is text and counts its
 * bytes (*nbytes), and feeds them to sink when sink is not NULL. */
static l3d_status read_input(const char *path, unsigned char *chunk, int64_t *nbytes,
                             struct sink *sink) {
    struct l3d_input in;
    l3d_status st = l3d_input_open(&in, path);
    if (st != L3D_OK) return st;
    if (in.jsonl)
        st = l3d_error(L3D_ERR_ARG, "%s is JSON Lines: --tokenizer bytes takes text files only "
                       "(a BPE tokenizer takes JSON Lines)", path);
    int64_t total = 0;
    for (size_t got = 1; st == L3D_OK && got;) {
        st = l3d_input_read(&in, chunk, CHUNK_BYTES, &got);
        const unsigned char *nul = st == L3D_OK && got ? memchr(chunk, 0, got) : NULL;
        if (nul)
            st = l3d_error(L3D_ERR_FORMAT, "%s holds a NUL byte at offset %lld: it is not a text "
                           "file (llm3d prepare takes text files only)", path,
                           (long long)(total + (nul - chunk)));
        if (st == L3D_OK && sink && got) st = sink_push(sink, chunk, got);
        total += (int64_t)got;
    }
    l3d_input_close(&in);
    *nbytes = total;
    return st;
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

/* The arguments both preparations share. */
static l3d_status check_args(int nfiles, double val_fraction, int64_t shard_tokens) {
    if (nfiles < 1) return l3d_error(L3D_ERR_ARG, "no input file to prepare");
    if (!(val_fraction >= 0.0 && val_fraction < 1.0))
        return l3d_error(L3D_ERR_ARG, "validation fraction %g is outside [0, 1)", val_fraction);
    if (shard_tokens < 4 || shard_tokens > L3D_SHARD_MAX_TOKENS)
        return l3d_error(L3D_ERR_ARG, "shard size %lld tokens is outside [4, %d]",
                         (long long)shard_tokens, L3D_SHARD_MAX_TOKENS);
    return L3D_OK;
}

/* Every input file read through (readable, text) before any work, in chunk: their bytes in
 * *total; the first bad file's error, or one when they hold no text at all. */
static l3d_status check_inputs(char **files, int nfiles, unsigned char *chunk, int64_t *total) {
    *total = 0;
    for (int i = 0; i < nfiles; i++) {
        int64_t n = 0;
        l3d_status st = read_input(files[i], chunk, &n, NULL);
        if (st != L3D_OK) return st;
        *total += n;
    }
    if (*total == 0)
        return l3d_error(L3D_ERR_FORMAT, "the %d input file(s) hold no text (0 bytes): nothing to "
                         "prepare", nfiles);
    return L3D_OK;
}

l3d_status l3d_prepare_bytes(const char *out_dir, char **files, int nfiles, double val_fraction,
                             int64_t shard_tokens, struct l3d_prepare_stats *stats) {
    if (stats) memset(stats, 0, sizeof *stats);
    l3d_status st = check_args(nfiles, val_fraction, shard_tokens);
    if (st != L3D_OK) return st;

    unsigned char *chunk = l3d_alloc(CHUNK_BYTES, "input chunk");
    int64_t total;
    st = check_inputs(files, nfiles, chunk, &total);
    if (st != L3D_OK) {
        l3d_free(chunk);
        return st;
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
    st = l3d_mkdir_p(out_dir);
    if (st != L3D_OK) {
        l3d_free(chunk);
        return st;
    }

    struct sink s;
    sink_open(&s, out_dir, ntrain, nval, shard_tokens, false);
    for (int i = 0; i < nfiles && st == L3D_OK; i++) {
        int64_t n;
        st = read_input(files[i], chunk, &n, &s);
    }
    if (st == L3D_OK && s.split < 2)
        st = l3d_error(L3D_ERR_IO, "the input files shrank while they were being prepared: run "
                       "llm3d prepare again on files that do not change");
    int removed = 0;
    if (st == L3D_OK) st = remove_stale(out_dir, s.nshards, &removed);
    sink_close(&s);
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

/* ---- BPE preparation ------------------------------------------------------------------------ */

/* Work for the encoding threads: a piece of one document's text, documents cut into pieces of
 * about PIECE_BYTES where encoding them apart gives the ids of the whole (l3d_tok_cut). */
#define PIECE_BYTES ((size_t)1 << 16)

struct piece {
    size_t start, len;
    bool doc_start; /* first piece of a document: an end-of-text token goes before it */
    struct l3d_ids ids;
};

/* Appends the pieces of document text[a..b) to *pv. */
static void add_doc(const char *text, size_t a, size_t b, struct piece **pv, size_t *np,
                    size_t *cap) {
    bool first = true;
    while (a < b) {
        size_t e = l3d_tok_cut(text, a, b, PIECE_BYTES);
        if (*np == *cap) {
            *cap = *cap ? 2 * *cap : 256;
            struct piece *n2 = realloc(*pv, *cap * sizeof **pv);
            L3D_ASSERT(n2 != NULL);
            *pv = n2;
        }
        (*pv)[(*np)++] = (struct piece){.start = a, .len = e - a, .doc_start = first};
        first = false;
        a = e;
    }
}

/* Cuts text[0..n) into documents at lines equal to sep (dropped; no separator: one document) and
 * those into pieces; empty documents are left out. */
static void split_docs(const char *text, size_t n, const char *sep, struct piece **pv, size_t *np,
                       size_t *cap) {
    size_t seplen = sep ? strlen(sep) : 0, doc = 0, line = 0;
    if (!sep) {
        if (n) add_doc(text, 0, n, pv, np, cap);
        return;
    }
    while (line < n) {
        const char *nl = memchr(text + line, '\n', n - line);
        size_t end = nl ? (size_t)(nl - text) : n, next = nl ? end + 1 : n;
        size_t l = end - line - (end > line && text[end - 1] == '\r');
        if (l == seplen && memcmp(text + line, sep, seplen) == 0) {
            if (line > doc) add_doc(text, doc, line, pv, np, cap);
            doc = next;
        }
        line = next;
    }
    if (n > doc) add_doc(text, doc, n, pv, np, cap);
}

static void progress_bar(double done, double total, double t0) {
    int w = 30, k = total > 0 ? (int)(w * done / total) : w;
    double dt = l3d_time_s() - t0;
    fprintf(stderr, "\rprepare: [%.*s%*s] %3.0f%% %.1f/%.1f MB, %.1f MB/s ", k,
            "##############################", w - k, "", total > 0 ? 100.0 * done / total : 100.0,
            done / 1e6, total / 1e6, dt > 0 ? done / 1e6 / dt : 0.0);
}

/* Whether document i goes to validation: every (1/f)-th document, spread over the corpus. */
static bool is_val(int64_t i, double f) {
    return f > 0 && (int64_t)floor((double)(i + 1) * f) > (int64_t)floor((double)i * f);
}

/* Encodes the pieces pv[0, np) of text (file's), the threads over them; the first piece the
 * tokenizer's pattern fails on is the error (its message taken from that thread). */
static l3d_status encode_pieces(struct l3d_encoder **enc, const char *file, const char *text,
                                struct piece *pv, size_t np) {
    size_t bad = np;
    char msg[1024];
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t i = 0; i < np; i++) {
        pv[i].ids.n = 0;
        if (l3d_encoder_encode(enc[omp_get_thread_num()], text + pv[i].start, pv[i].len,
                               &pv[i].ids) != L3D_OK) {
#pragma omp critical(prepare_encode_error)
            if (i < bad) {
                bad = i;
                snprintf(msg, sizeof msg, "%s", l3d_error_message()); /* per thread */
            }
        }
    }
    if (bad == np) return L3D_OK;
    return l3d_error(L3D_ERR_FORMAT, "input %s, the piece of text from byte %zu: %s", file,
                     pv[bad].start, msg);
}

/* The tokens of each split, in document order, spooled to an unnamed temporary file in the
 * output directory (4 bytes a token on disk, a 4 MiB buffer in memory) until the counts of both
 * splits, which fix the shard sizes, are known. */
#define SPOOL_TOKENS ((size_t)1 << 20)

struct spool {
    int fd;
    uint32_t *buf;
    size_t fill;
    int64_t n, docs; /* tokens and documents spooled */
};

static l3d_status spool_open(struct spool *sp, const char *dir) {
    *sp = (struct spool){.fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600)};
    if (sp->fd < 0 && (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL)) {
        /* a file system without O_TMPFILE: a named one, unlinked at once */
        size_t cap = strlen(dir) + 32;
        char *tmpl = l3d_alloc(cap, "spool path");
        snprintf(tmpl, cap, "%s/.prepare-tokens.XXXXXX", dir);
        sp->fd = mkostemp(tmpl, O_CLOEXEC);
        if (sp->fd >= 0) unlink(tmpl);
        l3d_free(tmpl);
    }
    if (sp->fd < 0)
        return l3d_error(L3D_ERR_IO, "cannot make a temporary file in %s for the tokens before "
                         "they are cut into shards: %s (--out names a writable directory)", dir,
                         strerror(errno));
    sp->buf = l3d_alloc(SPOOL_TOKENS * sizeof *sp->buf, "token spool");
    return L3D_OK;
}

static l3d_status spool_flush(struct spool *sp) {
    const char *p = (const char *)sp->buf;
    size_t left = sp->fill * sizeof *sp->buf;
    while (left) {
        ssize_t w = write(sp->fd, p, left);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0)
            return l3d_error(L3D_ERR_IO, "cannot write the token spool (a temporary file in "
                             "--out): %s", w < 0 ? strerror(errno) : "no space");
        p += w;
        left -= (size_t)w;
    }
    sp->fill = 0;
    return L3D_OK;
}

static l3d_status spool_put(struct spool *sp, uint32_t tok) {
    sp->buf[sp->fill++] = tok;
    sp->n++;
    return sp->fill == SPOOL_TOKENS ? spool_flush(sp) : L3D_OK;
}

/* The spooled tokens, from the start, into the shards. */
static l3d_status spool_drain(struct spool *sp, struct sink *s) {
    l3d_status st = spool_flush(sp);
    if (st == L3D_OK && lseek(sp->fd, 0, SEEK_SET) != 0)
        st = l3d_error(L3D_ERR_IO, "cannot rewind the token spool: %s", strerror(errno));
    for (int64_t left = sp->n; st == L3D_OK && left > 0;) {
        size_t want = (size_t)(left < (int64_t)SPOOL_TOKENS ? left : (int64_t)SPOOL_TOKENS);
        ssize_t got = read(sp->fd, sp->buf, want * sizeof *sp->buf);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0 || got % (ssize_t)sizeof *sp->buf)
            return l3d_error(L3D_ERR_IO, "cannot read the token spool back: %s",
                             got < 0 ? strerror(errno) : "it is shorter than written");
        for (ssize_t k = 0; k < got / (ssize_t)sizeof *sp->buf && st == L3D_OK; k++)
            st = sink_put(s, sp->buf[k]);
        left -= got / (ssize_t)sizeof *sp->buf;
    }
    return st;
}

static void spool_close(struct spool *sp) {
    if (sp->fd >= 0) close(sp->fd);
    l3d_free(sp->buf);
    *sp = (struct spool){.fd = -1};
}

/* The encoding of the documents of all input files, in order: pieces of a batch of text encoded
 * by the threads, each document's tokens (after the doc token) spooled to its split. */
#define BATCH_BYTES ((size_t)8 << 20) /* JSON Lines: documents gathered before encoding them */
#define MAX_LISTED 5                  /* malformed records listed on stderr, then only counted */

struct encoding {
    struct l3d_encoder **enc;
    int nth;
    struct piece *pv;
    size_t np, cap;
    char *text; /* a JSON Lines batch: the documents one after another */
    size_t tn, tcap;
    struct spool sp[2];
    int64_t ndocs;
    int cur; /* the split of the document being spooled */
    int eot;
    double val_fraction;
    const struct l3d_prepare_jsonl *jl;
    int64_t bad, bytes, disk_done, disk_total;
    bool progress;
    double t0;
};

/* Encodes the pieces of text and spools their tokens; the pieces emptied. */
static l3d_status emit(struct encoding *e, const char *file, const char *text) {
    l3d_status st = encode_pieces(e->enc, file, text, e->pv, e->np);
    for (size_t i = 0; i < e->np; i++) {
        struct piece *p = &e->pv[i];
        if (st == L3D_OK && p->doc_start) {
            e->cur = is_val(e->ndocs++, e->val_fraction) ? 1 : 0;
            e->sp[e->cur].docs++;
            st = spool_put(&e->sp[e->cur], (uint32_t)e->eot);
        }
        for (int64_t k = 0; k < p->ids.n && st == L3D_OK; k++)
            st = spool_put(&e->sp[e->cur], (uint32_t)p->ids.v[k]);
        l3d_ids_free(&p->ids);
    }
    e->np = 0;
    return st;
}

/* A text file: one document, or those between --doc-separator lines; read whole (decompressed). */
static l3d_status encode_text(struct encoding *e, struct l3d_input *in, const char *sep) {
    char *text;
    size_t n;
    l3d_status st = l3d_input_all(in, &text, &n);
    if (st != L3D_OK) return st;
    const char *nul = memchr(text, 0, n);
    if (nul)
        st = l3d_error(L3D_ERR_FORMAT, "%s holds a NUL byte at offset %lld: it is not a text "
                       "file (llm3d prepare takes text files only)", in->path,
                       (long long)(nul - text));
    if (st == L3D_OK) {
        split_docs(text, n, sep, &e->pv, &e->np, &e->cap);
        st = emit(e, in->path, text);
    }
    free(text);
    return st;
}

static bool utf8_valid(const unsigned char *s, size_t n, size_t *bad) {
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        uint32_t cp = k == 1 ? c : k == 2 ? (c & 0x1f) : k == 3 ? (c & 0x0f) : (c & 0x07);
        for (size_t j = 1; k && j < k; j++) {
            if (i + j >= n || (s[i + j] & 0xc0) != 0x80) k = 0;
            else cp = cp << 6 | (s[i + j] & 0x3f);
        }
        static const uint32_t least[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (!k || cp < least[k] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
            *bad = i;
            return false;
        }
        i += k;
    }
    return true;
}

/* Reads one JSON Lines record: its document (the key's string) appended to the batch; false, with
 * why, for a malformed one. */
static bool take_record(struct encoding *e, const char *where, const char *line, size_t len,
                        char *why, size_t cap) {
    struct l3d_json doc;
    const char *key = e->jl->key;
    const struct l3d_json *v = NULL;
    size_t bad = 0, wl = strlen(where);
    if (l3d_json_parse(&doc, line, len, where) != L3D_OK) {
        const char *m = l3d_error_message(); /* "WHERE: line 1, column C: ..." */
        if (strncmp(m, where, wl) == 0 && strncmp(m + wl, ": line 1, ", 10) == 0) m += wl + 10;
        snprintf(why, cap, "malformed JSON: %s", m);
    } else if (doc.type != L3D_JSON_OBJECT) {
        snprintf(why, cap, "%s, not a JSON object", l3d_json_type_name(doc.type));
    } else if (!(v = l3d_json_get(&doc, key))) {
        snprintf(why, cap, "no \"%s\" member (--jsonl-key names the text's)", key);
    } else if (v->type != L3D_JSON_STRING) {
        snprintf(why, cap, "\"%s\" is %s, not a string", key, l3d_json_type_name(v->type));
    } else if (memchr(v->str, 0, v->len)) {
        snprintf(why, cap, "\"%s\" holds a NUL character (\\u0000): prepare takes text only", key);
    } else if (!utf8_valid((const unsigned char *)v->str, v->len, &bad)) {
        snprintf(why, cap, "\"%s\" is not valid UTF-8 (byte %zu of the value)", key, bad);
    } else {
        if (e->tcap < e->tn + v->len + 1) {
            e->tcap = 2 * (e->tn + v->len + 1);
            char *t2 = realloc(e->text, e->tcap);
            L3D_ASSERT(t2 != NULL);
            e->text = t2;
        }
        memcpy(e->text + e->tn, v->str, v->len);
        add_doc(e->text, e->tn, e->tn + v->len, &e->pv, &e->np, &e->cap); /* empty: skipped */
        e->tn += v->len;
        l3d_json_free(&doc);
        return true;
    }
    l3d_json_free(&doc);
    return false;
}

static void show_progress(const struct encoding *e, const struct l3d_input *in) {
    if (e->progress)
        progress_bar((double)(e->disk_done + in->disk), (double)e->disk_total, e->t0);
}

static bool blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!strchr(" \t\r", s[i])) return false;
    return true;
}

/* A JSON Lines file, a record at a time, encoded in batches of about BATCH_BYTES of text. A
 * malformed record is listed (the first MAX_LISTED) and counted, or the error with --strict;
 * blank lines are skipped. */
static l3d_status encode_jsonl(struct encoding *e, struct l3d_input *in) {
    size_t wcap = strlen(in->path) + 32;
    char *where = l3d_alloc(wcap, "record name"), why[1024];
    l3d_status st = L3D_OK;
    for (;;) {
        const char *line;
        size_t len;
        bool eof;
        st = l3d_input_next_line(in, e->jl->max_line, &line, &len, &eof);
        if (st != L3D_OK || eof) break;
        if (blank(line, len)) continue;
        snprintf(where, wcap, "%s:%lld", in->path, (long long)in->lineno);
        if (!take_record(e, where, line, len, why, sizeof why)) {
            if (e->jl->strict) {
                st = l3d_error(L3D_ERR_FORMAT, "%s: %s (--strict: every record must be a JSON "
                               "object with a \"%s\" string)", where, why, e->jl->key);
                break;
            }
            if (++e->bad <= MAX_LISTED)
                fprintf(stderr, "%sllm3d prepare: warning: %s: %s; record skipped\n",
                        e->progress ? "\r\033[K" : "", where, why);
            continue;
        }
        if (e->tn >= BATCH_BYTES) {
            st = emit(e, in->path, e->text);
            e->tn = 0;
            show_progress(e, in);
            if (st != L3D_OK) break;
        }
    }
    if (st == L3D_OK) st = emit(e, in->path, e->text);
    e->tn = 0;
    e->np = 0;
    l3d_free(where);
    return st;
}

/* Every input file's documents, in order, into the spools. */
static l3d_status encode_all(struct encoding *e, char **files, int nfiles, const char *sep) {
    l3d_status st = L3D_OK;
    for (int f = 0; f < nfiles && st == L3D_OK; f++) {
        struct l3d_input in;
        st = l3d_input_open(&in, files[f]);
        if (st != L3D_OK) break;
        st = in.jsonl ? encode_jsonl(e, &in) : encode_text(e, &in, sep);
        e->bytes += in.bytes;
        show_progress(e, &in);
        e->disk_done += in.disk;
        l3d_input_close(&in);
    }
    if (e->progress) fputc('\n', stderr);
    return st;
}

/* The counts the shards need, checked: documents in both splits where asked, enough tokens. */
static l3d_status check_counts(const struct encoding *e, int nfiles, const char *sep) {
    if (e->bytes == 0)
        return l3d_error(L3D_ERR_FORMAT, "the %d input file(s) hold no text (0 bytes): nothing to "
                         "prepare", nfiles);
    if (e->ndocs == 0)
        return l3d_error(L3D_ERR_FORMAT, "the %d input file(s) hold no document: every line is "
                         "the separator \"%s\", or every record is empty or malformed (%lld)",
                         nfiles, sep ? sep : "", (long long)e->bad);
    if (e->val_fraction > 0 && (e->sp[1].docs == 0 || e->sp[0].docs == 0))
        return l3d_error(L3D_ERR_FORMAT, "%lld document(s) cannot be split into training and "
                         "validation at --val-fraction %g: give more text, documents separated "
                         "by a line (--doc-separator), or --val-fraction 0", (long long)e->ndocs,
                         e->val_fraction);
    if (e->sp[0].n < 2)
        return l3d_error(L3D_ERR_FORMAT, "the input holds %lld token(s), too few for a training "
                         "shard of at least 2", (long long)(e->sp[0].n + e->sp[1].n));
    return L3D_OK;
}

/* The spooled splits cut into shards; *removed: earlier shards deleted. */
static l3d_status write_shards(struct encoding *e, const char *out_dir, int64_t shard_tokens,
                               bool wide, int nshards[2], int *removed) {
    struct sink s;
    sink_open(&s, out_dir, e->sp[0].n, e->sp[1].n, shard_tokens, wide);
    l3d_status st = spool_drain(&e->sp[0], &s);
    if (st == L3D_OK) st = spool_drain(&e->sp[1], &s);
    L3D_ASSERT(st != L3D_OK || s.split == 2);
    nshards[0] = s.nshards[0];
    nshards[1] = s.nshards[1];
    if (st == L3D_OK) st = remove_stale(out_dir, s.nshards, removed);
    sink_close(&s);
    return st;
}

/* The shallowest directory of path that does not exist (malloc'd), NULL when path exists: what
 * l3d_mkdir_p will make, and unmake_dirs removes again when the preparation fails. */
static char *missing_root(const char *path) {
    char *p = strdup(path);
    L3D_ASSERT(p != NULL);
    struct stat sb;
    for (size_t i = 1; p[i - 1]; i++) {
        if (p[i] != '/' && p[i] != 0) continue;
        char c = p[i];
        p[i] = 0;
        if (stat(p, &sb) != 0) return p;
        p[i] = c;
    }
    free(p);
    return NULL;
}

/* Removes dir and its parents up to root, each only when empty (rmdir). */
static void unmake_dirs(const char *dir, const char *root) {
    char *p = strdup(dir);
    L3D_ASSERT(p != NULL);
    for (;;) {
        rmdir(p);
        char *slash = strrchr(p, '/');
        if (strcmp(p, root) == 0 || !slash || slash == p) break;
        *slash = 0;
    }
    free(p);
}

static l3d_status encoding_begin(struct encoding *e, const char *out_dir, char **files,
                                 int nfiles) {
    e->sp[0].fd = e->sp[1].fd = -1;
    e->nth = omp_get_max_threads();
    e->enc = l3d_alloc((size_t)e->nth * sizeof *e->enc, "encoders");
    for (int i = 0; i < e->nth; i++) e->enc[i] = NULL;
    for (int f = 0; f < nfiles; f++) {
        struct stat sb;
        if (stat(files[f], &sb) == 0) e->disk_total += (int64_t)sb.st_size;
    }
    e->t0 = l3d_time_s();
    l3d_status st = l3d_mkdir_p(out_dir);
    if (st == L3D_OK) st = spool_open(&e->sp[0], out_dir);
    if (st == L3D_OK) st = spool_open(&e->sp[1], out_dir);
    return st;
}

static void encoding_end(struct encoding *e) {
    for (int i = 0; i < e->nth; i++)
        if (e->enc[i]) l3d_encoder_free(e->enc[i]);
    l3d_free(e->enc);
    for (size_t i = 0; i < e->np; i++) l3d_ids_free(&e->pv[i].ids);
    free(e->pv);
    free(e->text);
    spool_close(&e->sp[0]);
    spool_close(&e->sp[1]);
}

l3d_status l3d_prepare_bpe_opts(const char *out_dir, char **files, int nfiles, double val_fraction,
                                int64_t shard_tokens, const struct l3d_tokenizer *tok,
                                const char *doc_separator, int doc_token, bool progress,
                                const struct l3d_prepare_jsonl *jsonl,
                                struct l3d_prepare_stats *stats) {
    if (stats) memset(stats, 0, sizeof *stats);
    l3d_status st = check_args(nfiles, val_fraction, shard_tokens);
    if (st != L3D_OK) return st;
    int V = l3d_tokenizer_vocab_size(tok), eot = doc_token >= 0 ? doc_token : l3d_tokenizer_eot(tok);
    if (!l3d_tokenizer_can_encode(tok))
        return l3d_error(L3D_ERR_ARG, "llm.c's tokenizer file decodes only: give the tokenizer "
                         "as gpt2 or a directory with encoder.json and vocab.bpe");
    if (eot < 0 || eot >= V)
        return l3d_error(L3D_ERR_ARG, "the tokenizer has no \"%s\" token to start documents with "
                         "(--doc-token gives another)", L3D_EOT_STRING);
    static const struct l3d_prepare_jsonl defaults = {"text", false, L3D_PREPARE_MAX_LINE};
    char *made = missing_root(out_dir); /* removed again if this fails */
    struct encoding e = {.eot = eot, .val_fraction = val_fraction, .progress = progress,
                         .jl = jsonl ? jsonl : &defaults};
    st = encoding_begin(&e, out_dir, files, nfiles);
    for (int i = 0; i < e.nth && st == L3D_OK; i++) e.enc[i] = l3d_encoder_init(tok);
    if (st == L3D_OK) st = encode_all(&e, files, nfiles, doc_separator);
    if (st == L3D_OK) st = check_counts(&e, nfiles, doc_separator);
    int nshards[2] = {0, 0}, removed = 0;
    if (st == L3D_OK) st = write_shards(&e, out_dir, shard_tokens, V > 65536, nshards, &removed);
    if (st == L3D_OK && stats) {
        stats->files = nfiles;
        stats->docs = e.ndocs;
        stats->tokens = e.sp[0].n + e.sp[1].n;
        stats->train_tokens = e.sp[0].n;
        stats->val_tokens = e.sp[1].n;
        stats->train_shards = nshards[0];
        stats->val_shards = nshards[1];
        stats->stale_removed = removed;
        stats->bytes = e.bytes;
        stats->disk_bytes = e.disk_done;
        stats->bad_records = e.bad;
    }
    encoding_end(&e);
    if (st != L3D_OK && made) unmake_dirs(out_dir, made);
    free(made);
    return st;
}

l3d_status l3d_prepare_bpe(const char *out_dir, char **files, int nfiles, double val_fraction,
                           int64_t shard_tokens, const struct l3d_tokenizer *tok,
                           const char *doc_separator, int doc_token, bool progress,
                           struct l3d_prepare_stats *stats) {
    return l3d_prepare_bpe_opts(out_dir, files, nfiles, val_fraction, shard_tokens, tok,
                                doc_separator, doc_token, progress, NULL, stats);
}
