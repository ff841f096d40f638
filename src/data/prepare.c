/* Preparation: text files -> llm.c token shards, through a tokenizer (l3d_prepare_bpe, below) or
 * byte by byte (l3d_prepare_bytes: token = byte value, vocabulary 256, no tokenizer files needed).
 * The bytes take two passes over the inputs: the first checks every file (readable, text) and
 * counts its bytes, so that nothing is written for a bad input and the train/val split and the
 * shard sizes are known; the second streams the bytes into shards, holding one shard in memory at
 * a time. */
#include "llm3d/data.h"

#include <omp.h>

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "llm3d/tokenizer.h"
#include "tokenizer/tokenizer-impl.h"

#define CHUNK_BYTES ((size_t)1 << 20)

static const char *split_name[2] = {"train", "val"};

/* Streams tokens into the shards of the two splits, train first, in shard sizes fixed up front. */
struct sink {
    const char *dir;
    char *path; /* room for dir + "/train_000000.bin" */
    uint32_t *buf;
    int64_t fill;
    bool wide; /* uint32 shards (a vocabulary above 65,536); else the buffer's uint16 in place */
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

static l3d_status sink_put(struct sink *s, uint32_t tok) {
    if (s->split >= 2)
        return l3d_error(L3D_ERR_IO, "the input files grew while they were being prepared: "
                         "run llm3d prepare again on files that do not change");
    s->buf[s->fill++] = tok;
    if (s->fill == s->want) {
        shard_path(s->path, path_cap(s->dir), s->dir, s->split, s->shard);
        l3d_status st;
        if (s->wide) {
            st = l3d_shard_write32(s->path, s->buf, s->fill);
        } else { /* narrowed in place: each uint16 lands at or before the uint32 it comes from */
            uint16_t *h = (uint16_t *)s->buf;
            for (int64_t k = 0; k < s->fill; k++) h[k] = (uint16_t)s->buf[k];
            st = l3d_shard_write(s->path, h, s->fill);
        }
        if (st != L3D_OK) return st;
        s->shard++;
        next_shard(s);
    }
    return L3D_OK;
}

static l3d_status sink_push(struct sink *s, const unsigned char *bytes, size_t n) {
    for (size_t i = 0; i < n; i++) {
        l3d_status st = sink_put(s, bytes[i]);
        if (st != L3D_OK) return st;
    }
    return L3D_OK;
}

/* Sizes the shards of ntrain + nval tokens (at most shard_tokens each) and allocates the buffer of
 * the largest. */
static l3d_status sink_open(struct sink *s, const char *out_dir, int64_t ntrain, int64_t nval,
                            int64_t shard_tokens) {
    *s = (struct sink){.dir = out_dir, .n = {ntrain, nval}};
    for (int k = 0; k < 2; k++)
        s->nshards[k] = (int)((s->n[k] + shard_tokens - 1) / shard_tokens);
    int64_t biggest = shard_size(ntrain, s->nshards[0], 0); /* shard 0 is a split's largest */
    if (nval && shard_size(nval, s->nshards[1], 0) > biggest)
        biggest = shard_size(nval, s->nshards[1], 0);
    s->buf = l3d_try_alloc((size_t)biggest * sizeof *s->buf, "shard buffer");
    if (!s->buf)
        return l3d_error(L3D_ERR_OOM, "out of memory for a shard of %lld tokens: lower "
                         "--shard-tokens", (long long)biggest);
    s->path = l3d_alloc(path_cap(out_dir), "shard path");
    next_shard(s);
    return L3D_OK;
}

/* Reads one input file in chunks: checks it is text and counts its bytes (*nbytes), and feeds
 * them to sink when sink is not NULL. */
static l3d_status read_input(const char *path, unsigned char *chunk, int64_t *nbytes,
                             struct sink *sink) {
    FILE *fp;
    l3d_status ost = l3d_fopen_regular(path, "text file", &fp, NULL);
    if (ost != L3D_OK) return ost;
    int64_t total = 0;
    for (;;) {
        size_t got = fread(chunk, 1, CHUNK_BYTES, fp);
        const unsigned char *nul = got ? memchr(chunk, 0, got) : NULL;
        if (nul) {
            fclose(fp);
            return l3d_error(L3D_ERR_FORMAT,
                             "%s holds a NUL byte at offset %lld: it is not a text file (llm3d prepare "
                             "takes text files only)",
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
    st = sink_open(&s, out_dir, ntrain, nval, shard_tokens);
    if (st != L3D_OK) {
        l3d_free(chunk);
        return st;
    }
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

/* Growable token store with document boundaries. */
struct corpus {
    uint32_t *tok;
    int64_t n, cap;
    int64_t *doc; /* start of each document in tok; ndocs + 1 entries once finished */
    int64_t ndocs, dcap;
};

static void corpus_put(struct corpus *c, int32_t t) {
    if (c->n == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 1 << 20;
        uint32_t *t2 = realloc(c->tok, (size_t)c->cap * sizeof *t2);
        L3D_ASSERT(t2 != NULL);
        c->tok = t2;
    }
    c->tok[c->n++] = (uint32_t)t;
}

static void corpus_doc(struct corpus *c) {
    if (c->ndocs + 1 >= c->dcap) {
        c->dcap = c->dcap ? 2 * c->dcap : 1024;
        int64_t *d2 = realloc(c->doc, (size_t)c->dcap * sizeof *d2);
        L3D_ASSERT(d2 != NULL);
        c->doc = d2;
    }
    c->doc[c->ndocs++] = c->n;
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

/* The documents of the input files, tokenized (each one after the token eot) into c, the threads
 * over each file's pieces; with progress, a bar on stderr of the files' `total` bytes. */
static l3d_status encode_files(struct corpus *c, char **files, int nfiles,
                               const struct l3d_tokenizer *tok, const char *doc_separator, int eot,
                               bool progress, int64_t total) {
    l3d_status st = L3D_OK;
    int nth = omp_get_max_threads();
    struct l3d_encoder **enc = l3d_alloc((size_t)nth * sizeof *enc, "encoders");
    for (int i = 0; i < nth; i++) enc[i] = l3d_encoder_init(tok);
    struct piece *pv = NULL;
    size_t cap = 0;
    double t0 = l3d_time_s(), done = 0;
    for (int f = 0; f < nfiles && st == L3D_OK; f++) {
        char *text;
        size_t n, np = 0;
        st = l3d_read_whole_file(files[f], "input", &text, &n);
        if (st != L3D_OK) break;
        split_docs(text, n, doc_separator, &pv, &np, &cap);
        st = encode_pieces(enc, files[f], text, pv, np);
        for (size_t i = 0; i < np; i++) {
            if (st != L3D_OK) {
                l3d_ids_free(&pv[i].ids);
                continue;
            }
            if (pv[i].doc_start) {
                corpus_doc(c);
                corpus_put(c, eot);
            }
            for (int64_t k = 0; k < pv[i].ids.n; k++) corpus_put(c, pv[i].ids.v[k]);
            l3d_ids_free(&pv[i].ids);
        }
        l3d_free(text);
        done += (double)n;
        if (progress) progress_bar(done, (double)total, t0);
    }
    if (progress) fputc('\n', stderr);
    for (int i = 0; i < nth; i++) l3d_encoder_free(enc[i]);
    l3d_free(enc);
    free(pv);
    return st;
}

l3d_status l3d_prepare_bpe(const char *out_dir, char **files, int nfiles, double val_fraction,
                           int64_t shard_tokens, const struct l3d_tokenizer *tok,
                           const char *doc_separator, int doc_token, bool progress,
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
    unsigned char *chunk = l3d_alloc(CHUNK_BYTES, "input chunk");
    int64_t total;
    st = check_inputs(files, nfiles, chunk, &total);
    l3d_free(chunk);
    if (st != L3D_OK) return st;

    struct corpus c = {0};
    st = encode_files(&c, files, nfiles, tok, doc_separator, eot, progress, total);
    if (st == L3D_OK && c.ndocs == 0)
        st = l3d_error(L3D_ERR_FORMAT, "the %d input file(s) hold no document: every line is the "
                       "separator \"%s\"", nfiles, doc_separator ? doc_separator : "");
    int64_t nval = 0, nvaldocs = 0;
    if (st == L3D_OK) {
        corpus_doc(&c); /* end of the last document */
        c.ndocs--;
        for (int64_t d = 0; d < c.ndocs; d++)
            if (is_val(d, val_fraction)) {
                nval += c.doc[d + 1] - c.doc[d];
                nvaldocs++;
            }
        if (val_fraction > 0 && (nvaldocs == 0 || nvaldocs == c.ndocs))
            st = l3d_error(L3D_ERR_FORMAT, "%lld document(s) cannot be split into training and "
                           "validation at --val-fraction %g: give more text, documents separated "
                           "by a line (--doc-separator), or --val-fraction 0", (long long)c.ndocs,
                           val_fraction);
        else if (c.n - nval < 2)
            st = l3d_error(L3D_ERR_FORMAT, "the input holds %lld token(s), too few for a training "
                           "shard of at least 2", (long long)c.n);
    }
    struct sink s = {0};
    if (st == L3D_OK) st = l3d_mkdir_p(out_dir);
    if (st == L3D_OK) st = sink_open(&s, out_dir, c.n - nval, nval, shard_tokens);
    s.wide = V > 65536;
    for (int split = 0; split < 2 && st == L3D_OK; split++)
        for (int64_t d = 0; d < c.ndocs && st == L3D_OK; d++)
            if (is_val(d, val_fraction) == (split == 1))
                for (int64_t k = c.doc[d]; k < c.doc[d + 1] && st == L3D_OK; k++)
                    st = sink_put(&s, c.tok[k]);
    int removed = 0;
    if (st == L3D_OK) st = remove_stale(out_dir, s.nshards, &removed);
    l3d_free(s.path);
    l3d_free(s.buf);
    if (st == L3D_OK && stats) {
        stats->files = nfiles;
        stats->docs = c.ndocs;
        stats->tokens = c.n;
        stats->train_tokens = c.n - nval;
        stats->val_tokens = nval;
        stats->train_shards = s.nshards[0];
        stats->val_shards = s.nshards[1];
        stats->stale_removed = removed;
        stats->bytes = total;
    }
    free(c.tok);
    free(c.doc);
    return st;
}
