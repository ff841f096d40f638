/*
 * Byte-level BPE training (include/llm3d/tokenizer.h, l3d_bpe_train).
 *
 * Sennrich et al. 2016, "Neural Machine Translation of Rare Words with Subword Units", alg. 1,
 * with GPT-2's byte-level alphabet and pre-tokenization (Radford et al. 2019, sec. 2.2):
 *   1. Pre-tokenize every file (threads over pieces, l3d_tok_cut) and count the distinct
 *      pre-tokens ("words"); each word is a sequence of symbols, at first its bytes.
 *   2. Count every adjacent symbol pair, weighted by word frequency, and remember which words
 *      hold it. A max-heap holds (count, pair) entries; counts change after each merge, so an
 *      entry popped with a stale count is pushed again with the current one (lazy deletion).
 *   3. Pop the most frequent pair (a, b) (ties: the smaller (a, b)); it becomes token z. In each
 *      word that held it, replace each occurrence left to right, and update the counts of the
 *      pairs around it: (x, a) (a, b) (b, y) lose the word's count, (x, z) (z, y) gain it and
 *      are pushed. Only the words holding (a, b) are touched: no rescan of the corpus per merge.
 *   4. Stop at vocab_size - 1 tokens (the end-of-text token is last) or when no pair occurs twice.
 * Ids: the 256 bytes in GPT-2's encoder.json order, then one id per new token in merge order, then
 * <|endoftext|>; a merge whose result spells an existing token reuses its id.
 */
#include <errno.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "llm3d/file.h"
#include "llm3d/tokenizer.h"
#include "tokenizer/tokenizer-impl.h"

/* ---- counting pre-tokens -------------------------------------------------------------------- */

struct wslot {
    uint64_t hash;
    int64_t off; /* bytes in the map's arena */
    int32_t len;
    int64_t count; /* 0 = empty slot */
};

struct wmap {
    struct wslot *slot;
    uint64_t mask, used;
    unsigned char *arena;
    int64_t alen, acap;
};

static uint64_t fnv(const unsigned char *s, size_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 1099511628211ULL;
    return h ^ (h >> 29);
}

static void wmap_init(struct wmap *m) {
    memset(m, 0, sizeof *m);
    m->mask = (1u << 14) - 1;
    m->slot = calloc(m->mask + 1, sizeof *m->slot);
    m->acap = 1 << 20;
    m->arena = malloc((size_t)m->acap);
    L3D_ASSERT(m->slot && m->arena);
}

static void wmap_free(struct wmap *m) {
    free(m->slot);
    free(m->arena);
}

static void wmap_add(struct wmap *m, const unsigned char *s, size_t n, int64_t count, uint64_t h) {
    uint64_t i = h & m->mask;
    for (; m->slot[i].count; i = (i + 1) & m->mask) {
        struct wslot *w = &m->slot[i];
        if (w->hash == h && (size_t)w->len == n && memcmp(m->arena + w->off, s, n) == 0) {
            w->count += count;
            return;
        }
    }
    if (m->alen + (int64_t)n > m->acap) {
        while (m->alen + (int64_t)n > m->acap) m->acap *= 2;
        m->arena = realloc(m->arena, (size_t)m->acap);
        L3D_ASSERT(m->arena != NULL);
    }
    memcpy(m->arena + m->alen, s, n);
    m->slot[i] = (struct wslot){h, m->alen, (int32_t)n, count};
    m->alen += (int64_t)n;
    if (++m->used * 2 > m->mask) { /* grow: rehash */
        uint64_t cap = 2 * (m->mask + 1);
        struct wslot *old = m->slot;
        uint64_t oldn = m->mask + 1;
        m->slot = calloc(cap, sizeof *m->slot);
        L3D_ASSERT(m->slot != NULL);
        m->mask = cap - 1;
        for (uint64_t k = 0; k < oldn; k++) {
            if (!old[k].count) continue;
            uint64_t j = old[k].hash & m->mask;
            while (m->slot[j].count) j = (j + 1) & m->mask;
            m->slot[j] = old[k];
        }
        free(old);
    }
}

static void count_word(void *ctx, const char *s, size_t n) {
    wmap_add(ctx, (const unsigned char *)s, n, 1, fnv((const unsigned char *)s, n));
}

/* ---- pairs ---------------------------------------------------------------------------------- */

struct pair {
    int32_t a, b;
    int64_t count;
    int32_t *words; /* words that held the pair at some point (may repeat, may be stale) */
    int32_t nw, cw;
};

struct pairs {
    struct pair *p;
    int64_t n, cap;
    int64_t *slot; /* index + 1 into p; 0 = empty */
    uint64_t mask;
};

static uint64_t pkey_hash(int32_t a, int32_t b) {
    uint64_t x = ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) * 0x9E3779B97F4A7C15ULL;
    return x ^ (x >> 31);
}

static int64_t pair_get(struct pairs *ps, int32_t a, int32_t b) {
    uint64_t i = pkey_hash(a, b) & ps->mask;
    for (; ps->slot[i]; i = (i + 1) & ps->mask) {
        struct pair *p = &ps->p[ps->slot[i] - 1];
        if (p->a == a && p->b == b) return ps->slot[i] - 1;
    }
    if (ps->n == ps->cap) {
        ps->cap *= 2;
        ps->p = realloc(ps->p, (size_t)ps->cap * sizeof *ps->p);
        L3D_ASSERT(ps->p != NULL);
    }
    if ((uint64_t)(ps->n + 1) * 2 > ps->mask) {
        uint64_t cap = 2 * (ps->mask + 1);
        free(ps->slot);
        ps->slot = calloc(cap, sizeof *ps->slot);
        L3D_ASSERT(ps->slot != NULL);
        ps->mask = cap - 1;
        for (int64_t k = 0; k < ps->n; k++) {
            uint64_t j = pkey_hash(ps->p[k].a, ps->p[k].b) & ps->mask;
            while (ps->slot[j]) j = (j + 1) & ps->mask;
            ps->slot[j] = k + 1;
        }
        i = pkey_hash(a, b) & ps->mask;
        while (ps->slot[i]) i = (i + 1) & ps->mask;
    }
    ps->p[ps->n] = (struct pair){.a = a, .b = b};
    ps->slot[i] = ps->n + 1;
    return ps->n++;
}

static void pair_add_word(struct pair *p, int32_t w) {
    if (p->nw && p->words[p->nw - 1] == w) return;
    if (p->nw == p->cw) {
        p->cw = p->cw ? 2 * p->cw : 4;
        p->words = realloc(p->words, (size_t)p->cw * sizeof *p->words);
        L3D_ASSERT(p->words != NULL);
    }
    p->words[p->nw++] = w;
}

struct heap;
static void heap_push(struct heap *h, int64_t count, int64_t pair);

/* Adds delta to the count of pair (a, b); with w >= 0 (a gain) records word w and pushes the new
 * count (losses are left to the heap's lazy check). */
static void pair_update(struct pairs *ps, struct heap *h, int32_t a, int32_t b, int64_t delta,
                        int32_t w) {
    int64_t i = pair_get(ps, a, b); /* (may move ps->p) */
    struct pair *p = &ps->p[i];
    p->count += delta;
    if (w >= 0) {
        pair_add_word(p, w);
        heap_push(h, p->count, i);
    }
}

/* max-heap of (count, pair index); ties: the smaller (a, b) first */
struct hentry {
    int64_t count, pair;
};

struct heap {
    struct hentry *e;
    int64_t n, cap;
    const struct pairs *ps;
};

static bool hbefore(const struct heap *h, struct hentry x, struct hentry y) {
    if (x.count != y.count) return x.count > y.count;
    const struct pair *p = &h->ps->p[x.pair], *q = &h->ps->p[y.pair];
    return p->a != q->a ? p->a < q->a : p->b < q->b;
}

static void heap_push(struct heap *h, int64_t count, int64_t pair) {
    if (h->n == h->cap) {
        h->cap = h->cap ? 2 * h->cap : 1 << 16;
        h->e = realloc(h->e, (size_t)h->cap * sizeof *h->e);
        L3D_ASSERT(h->e != NULL);
    }
    int64_t i = h->n++;
    h->e[i] = (struct hentry){count, pair};
    while (i > 0 && hbefore(h, h->e[i], h->e[(i - 1) / 2])) {
        struct hentry t = h->e[i];
        h->e[i] = h->e[(i - 1) / 2];
        h->e[(i - 1) / 2] = t;
        i = (i - 1) / 2;
    }
}

static struct hentry heap_pop(struct heap *h) {
    struct hentry top = h->e[0];
    h->e[0] = h->e[--h->n];
    for (int64_t i = 0;;) {
        int64_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < h->n && hbefore(h, h->e[l], h->e[m])) m = l;
        if (r < h->n && hbefore(h, h->e[r], h->e[m])) m = r;
        if (m == i) break;
        struct hentry t = h->e[i];
        h->e[i] = h->e[m];
        h->e[m] = t;
        i = m;
    }
    return top;
}

/* ---- vocabulary ----------------------------------------------------------------------------- */

struct vocab {
    unsigned char *blob;
    int64_t *off; /* V + 1 */
    int32_t n, cap;
    int64_t blen, bcap;
    int32_t *slot; /* id + 1 by bytes */
    uint64_t mask;
};

static const unsigned char *vocab_bytes(const struct vocab *v, int32_t id, size_t *n) {
    *n = (size_t)(v->off[id + 1] - v->off[id]);
    return v->blob + v->off[id];
}

/* The id of token bytes s[0..n), added when new. */
static int32_t vocab_id(struct vocab *v, const unsigned char *s, size_t n, bool *added) {
    uint64_t i = fnv(s, n) & v->mask;
    for (; v->slot[i]; i = (i + 1) & v->mask) {
        size_t m;
        const unsigned char *t = vocab_bytes(v, v->slot[i] - 1, &m);
        if (m == n && memcmp(t, s, n) == 0) {
            *added = false;
            return v->slot[i] - 1;
        }
    }
    if (v->blen + (int64_t)n > v->bcap) {
        while (v->blen + (int64_t)n > v->bcap) v->bcap *= 2;
        v->blob = realloc(v->blob, (size_t)v->bcap);
        L3D_ASSERT(v->blob != NULL);
    }
    memcpy(v->blob + v->blen, s, n);
    v->blen += (int64_t)n;
    v->slot[i] = v->n + 1;
    v->off[++v->n] = v->blen;
    *added = true;
    return v->n - 1;
}

/* ---- training ------------------------------------------------------------------------------- */

/* The files a tokenizer folder's new vocabulary replaces (the rest is carried over). */
static bool tokenizer_owned(const char *name) {
    return strcmp(name, "encoder.json") == 0 || strcmp(name, "vocab.bpe") == 0 ||
           l3d_tokenizer_hf_owned(name);
}

/* The two files just written in dir, read back, as Hugging Face's files beside them. */
static l3d_status write_hf_files(const char *dir) {
    struct l3d_tokenizer *t;
    l3d_status st = l3d_tokenizer_load(&t, dir);
    if (st == L3D_OK) st = l3d_tokenizer_write_hf(t, dir, 0);
    if (st == L3D_OK) l3d_tokenizer_free(t);
    return st;
}

static l3d_status write_files(const char *out_dir, const struct vocab *v, const int32_t *merges,
                              int nmerges) {
    int byte_cp[256];
    l3d_bytes_to_unicode(byte_cp, NULL);
    /* both files into a new folder beside out_dir, put in its place whole (llm3d/file.h) */
    struct l3d_dir_out dir;
    l3d_status st = l3d_dir_out_begin(&dir, out_dir, "tokenizer folder", tokenizer_owned);
    if (st != L3D_OK) return st;
    char path[L3D_FILE_PATH_CAP + 16];
    struct l3d_out o;
    snprintf(path, sizeof path, "%s/encoder.json", dir.tmp);
    if ((st = l3d_out_open(&o, path, "tokenizer file")) == L3D_OK) {
        FILE *fp = l3d_out_stream(&o);
        fputc('{', fp);
        for (int32_t id = 0; id < v->n; id++) {
            size_t n;
            const unsigned char *s = vocab_bytes(v, id, &n);
            fputs(id ? ", \"" : "\"", fp);
            l3d_tok_write_spelled(fp, s, n, byte_cp, true);
            fprintf(fp, "\": %d", id);
        }
        fprintf(fp, ", \"%s\": %d}", L3D_EOT_STRING, v->n);
        st = l3d_out_commit(&o);
    }
    snprintf(path, sizeof path, "%s/vocab.bpe", dir.tmp);
    if (st == L3D_OK && (st = l3d_out_open(&o, path, "tokenizer file")) == L3D_OK) {
        FILE *fp = l3d_out_stream(&o);
        fputs("#version: 0.2\n", fp);
        for (int k = 0; k < nmerges; k++) {
            size_t n;
            const unsigned char *s = vocab_bytes(v, merges[2 * k], &n);
            l3d_tok_write_spelled(fp, s, n, byte_cp, false);
            fputc(' ', fp);
            s = vocab_bytes(v, merges[2 * k + 1], &n);
            l3d_tok_write_spelled(fp, s, n, byte_cp, false);
            fputc('\n', fp);
        }
        st = l3d_out_commit(&o);
    }
    if (st == L3D_OK) st = write_hf_files(dir.tmp);
    if (st != L3D_OK) {
        l3d_dir_out_abort(&dir);
        return st;
    }
    return l3d_dir_out_commit(&dir);
}

#define TRAIN_PIECE ((size_t)1 << 16)

/* Pre-tokenizes one corpus file (threads over pieces cut by l3d_tok_cut) into the per-thread word
 * counts maps[thread]; *n receives its size in bytes. */
static l3d_status count_file(const char *path, const struct l3d_tokenizer *shape,
                             struct wmap *maps, size_t *n) {
    char *text;
    l3d_status st = l3d_read_whole_file(path, "corpus file", &text, n);
    if (st != L3D_OK) return st;
    const char *nul = memchr(text, 0, *n);
    if (nul) {
        st = l3d_error(L3D_ERR_FORMAT, "%s holds a NUL byte at offset %lld: it is not a text "
                       "file (the tokenizer trains on text files only)", path,
                       (long long)(nul - text));
        l3d_free(text);
        return st;
    }
    size_t npieces = 0, *cut = malloc((*n / TRAIN_PIECE + 2) * sizeof *cut);
    cut[0] = 0;
    for (size_t a = 0; a < *n;) a = cut[++npieces] = l3d_tok_cut(text, a, *n, TRAIN_PIECE);
    size_t bad = npieces; /* GPT-2's pattern fails on no text; were it to, the first piece's error */
    char msg[1024];
#pragma omp parallel
    {
        struct l3d_encoder *e = l3d_encoder_init(shape);
        struct wmap *m = &maps[omp_get_thread_num()];
#pragma omp for schedule(dynamic, 1)
        for (size_t i = 0; i < npieces; i++)
            if (l3d_encoder_pretokenize(e, text + cut[i], cut[i + 1] - cut[i], count_word, m) !=
                L3D_OK) {
#pragma omp critical(train_pretokenize_error)
                if (i < bad) {
                    bad = i;
                    snprintf(msg, sizeof msg, "%s", l3d_error_message()); /* per thread */
                }
            }
        l3d_encoder_free(e);
    }
    if (bad < npieces)
        st = l3d_error(L3D_ERR_FORMAT, "%s, the piece of text from byte %zu: %s", path, cut[bad],
                       msg);
    free(cut);
    l3d_free(text);
    return st;
}

/* Step 1: the distinct pre-tokens of all files and their counts, in one map (l3d_free it after
 * wmap_free). An empty corpus is an error. */
static l3d_status count_corpus(char **files, int nfiles, bool progress, struct wmap **out) {
    struct l3d_tokenizer *shape = NULL; /* a tokenizer of only the 256 bytes, for its pattern */
    int nth = omp_get_max_threads();
    struct wmap *maps = l3d_alloc((size_t)nth * sizeof *maps, "word counts");
    for (int i = 0; i < nth; i++) wmap_init(&maps[i]);
    l3d_status st = l3d_tokenizer_bytes(&shape);
    int64_t total = 0;
    for (int f = 0; f < nfiles && st == L3D_OK; f++) {
        size_t n;
        st = count_file(files[f], shape, maps, &n);
        if (st != L3D_OK) break;
        total += (int64_t)n;
        if (progress)
            fprintf(stderr, "\rtokenizer train: pre-tokenized %d/%d file(s), %.1f MB", f + 1,
                    nfiles, (double)total / 1e6);
    }
    l3d_tokenizer_free(shape);
    if (st == L3D_OK && total == 0)
        st = l3d_error(L3D_ERR_FORMAT, "the %d corpus file(s) hold no text (0 bytes): nothing to "
                       "train on", nfiles);
    if (st != L3D_OK) {
        for (int i = 0; i < nth; i++) wmap_free(&maps[i]);
        l3d_free(maps);
        if (progress) fputc('\n', stderr);
        return st;
    }
    for (int i = 1; i < nth; i++) {
        for (uint64_t k = 0; k <= maps[i].mask; k++) {
            const struct wslot *w = &maps[i].slot[k];
            if (w->count) wmap_add(&maps[0], maps[i].arena + w->off, (size_t)w->len, w->count, w->hash);
        }
        wmap_free(&maps[i]);
    }
    *out = maps;
    return L3D_OK;
}

/* Sorts ws[0..n) by the words' bytes in arena (bottom-up merge sort): thread scheduling, which
 * decides the order of the map's slots, must not decide the ids. */
static void sort_words(struct wslot *ws, int64_t n, const unsigned char *arena) {
    struct wslot *tmp = malloc((size_t)n * sizeof *tmp), *sorted = ws;
    for (int64_t width = 1; width < n; width *= 2) {
        for (int64_t lo = 0; lo < n; lo += 2 * width) {
            int64_t mid = lo + width < n ? lo + width : n;
            int64_t hi = lo + 2 * width < n ? lo + 2 * width : n, i = lo, j = mid, k = lo;
            while (i < mid && j < hi) {
                const struct wslot *x = &sorted[i], *y = &sorted[j];
                int32_t m = x->len < y->len ? x->len : y->len;
                int c = memcmp(arena + x->off, arena + y->off, (size_t)m);
                if (c < 0 || (c == 0 && x->len <= y->len)) tmp[k++] = sorted[i++];
                else tmp[k++] = sorted[j++];
            }
            while (i < mid) tmp[k++] = sorted[i++];
            while (j < hi) tmp[k++] = sorted[j++];
        }
        struct wslot *sw = sorted;
        sorted = tmp;
        tmp = sw;
    }
    if (sorted != ws) memcpy(ws, sorted, (size_t)n * sizeof *ws);
    free(sorted == ws ? tmp : sorted);
}

/* The words as symbol sequences: word w is sym[start[w] .. start[w] + len[w]) (len shrinks as
 * merges join symbols), count[w] times in the corpus. */
struct words {
    int64_t n;
    int64_t *start, *count;
    int32_t *len, *sym;
};

/* The words of map wm (freed here, with maps) in sorted order, each symbol the id of its byte. */
static void words_init(struct words *wd, struct wmap *maps) {
    struct wmap *wm = &maps[0];
    int64_t nwords = 0;
    struct wslot *ws = malloc((size_t)wm->used * sizeof *ws);
    for (uint64_t k = 0; k <= wm->mask; k++)
        if (wm->slot[k].count) ws[nwords++] = wm->slot[k];
    const unsigned char *arena = wm->arena;
    sort_words(ws, nwords, arena);
    int byte_cp[256], order[256], byte_id[256];
    l3d_bytes_to_unicode(byte_cp, order);
    for (int i = 0; i < 256; i++) byte_id[order[i]] = i;
    wd->n = nwords;
    wd->start = malloc((size_t)(nwords + 1) * sizeof *wd->start);
    wd->len = malloc((size_t)nwords * sizeof *wd->len);
    wd->count = malloc((size_t)nwords * sizeof *wd->count);
    int64_t nsym = 0;
    for (int64_t w = 0; w < nwords; w++) nsym += ws[w].len;
    wd->sym = malloc((size_t)(nsym ? nsym : 1) * sizeof *wd->sym);
    nsym = 0;
    for (int64_t w = 0; w < nwords; w++) {
        wd->start[w] = nsym;
        wd->len[w] = ws[w].len;
        wd->count[w] = ws[w].count;
        for (int32_t k = 0; k < ws[w].len; k++) wd->sym[nsym++] = byte_id[arena[ws[w].off + k]];
    }
    free(ws);
    wmap_free(wm);
    l3d_free(maps);
}

static void words_free(struct words *wd) {
    free(wd->sym);
    free(wd->start);
    free(wd->len);
    free(wd->count);
}

/* A vocabulary of room for vocab_size tokens holding the 256 bytes, in GPT-2's order. */
static void vocab_init(struct vocab *v, int vocab_size) {
    *v = (struct vocab){.cap = vocab_size, .bcap = 1 << 16};
    v->off = calloc((size_t)vocab_size + 1, sizeof *v->off);
    v->blob = malloc((size_t)v->bcap);
    uint64_t vcap = 1;
    while (vcap < 2 * (uint64_t)vocab_size) vcap <<= 1;
    v->slot = calloc(vcap, sizeof *v->slot);
    v->mask = vcap - 1;
    int byte_cp[256], order[256];
    l3d_bytes_to_unicode(byte_cp, order);
    for (int i = 0; i < 256; i++) {
        unsigned char c = (unsigned char)order[i];
        bool added;
        vocab_id(v, &c, 1, &added);
    }
}

static void vocab_free(struct vocab *v) {
    free(v->off);
    free(v->blob);
    free(v->slot);
}

/* Step 2: every adjacent pair of every word, counted, with the words that hold it; each pair in
 * the heap once. */
static void pairs_init(struct pairs *ps, struct heap *h, const struct words *wd) {
    *ps = (struct pairs){.cap = 1 << 16, .mask = (1 << 17) - 1};
    ps->p = malloc((size_t)ps->cap * sizeof *ps->p);
    ps->slot = calloc(ps->mask + 1, sizeof *ps->slot);
    for (int64_t w = 0; w < wd->n; w++)
        for (int32_t k = 0; k + 1 < wd->len[w]; k++) {
            const int32_t *s = wd->sym + wd->start[w];
            int64_t pi = pair_get(ps, s[k], s[k + 1]);
            ps->p[pi].count += wd->count[w];
            pair_add_word(&ps->p[pi], (int32_t)w);
        }
    *h = (struct heap){.ps = ps};
    for (int64_t i = 0; i < ps->n; i++) heap_push(h, ps->p[i].count, i);
}

static void pairs_free(struct pairs *ps, struct heap *h) {
    for (int64_t i = 0; i < ps->n; i++) free(ps->p[i].words);
    free(ps->p);
    free(ps->slot);
    free(h->e);
}

/* Step 3 in word w: each occurrence of (a, b), left to right, becomes z, and the counts of the
 * pairs around it move from (x, a) (b, y) to (x, z) (z, y). */
static void merge_word(struct pairs *ps, struct heap *h, struct words *wd, int32_t w, int32_t a,
                       int32_t b, int32_t z) {
    int32_t *s = wd->sym + wd->start[w], n = wd->len[w], o = 0;
    int64_t c = wd->count[w];
    bool after_z = false; /* s[o-1] is a z made from the occurrence just before */
    for (int32_t k = 0; k < n;) {
        if (!(k + 1 < n && s[k] == a && s[k + 1] == b)) {
            s[o++] = s[k++];
            after_z = false;
            continue;
        }
        if (o > 0) { /* (x, a) -> (x, z); after a z, (b, a) went with it: (z, z) */
            if (!after_z) pair_update(ps, h, s[o - 1], a, -c, -1);
            pair_update(ps, h, s[o - 1], z, c, w);
        }
        if (k + 2 < n) { /* (b, y) -> (z, y), unless y starts the next occurrence */
            pair_update(ps, h, b, s[k + 2], -c, -1);
            if (!(k + 3 < n && s[k + 2] == a && s[k + 3] == b))
                pair_update(ps, h, z, s[k + 2], c, w);
        }
        s[o++] = z;
        k += 2;
        after_z = true;
    }
    wd->len[w] = o;
}

/* Step 3: merges of the most frequent pair until the vocabulary holds vocab_size - 1 tokens or no
 * pair occurs twice; merges[2k], merges[2k + 1] are the k-th merge's tokens; progress lines count
 * the seconds since t0. Returns the number of merges. */
static int learn_merges(struct vocab *v, struct pairs *ps, struct heap *h, struct words *wd,
                        int vocab_size, int32_t *merges, bool progress, double t0) {
    int nmerges = 0;
    int32_t *seen = calloc((size_t)(wd->n ? wd->n : 1), sizeof *seen); /* merge stamp per word */
    while (v->n < vocab_size - 1 && h->n > 0) {
        struct hentry top = heap_pop(h);
        struct pair *bp = &ps->p[top.pair];
        if (top.count != bp->count) { /* stale entry */
            if (bp->count > 0) heap_push(h, bp->count, top.pair);
            continue;
        }
        if (bp->count < 2) break;
        int32_t a = bp->a, b = bp->b;
        size_t na, nb;
        const unsigned char *sa = vocab_bytes(v, a, &na), *sb = vocab_bytes(v, b, &nb);
        unsigned char *cat = malloc(na + nb);
        memcpy(cat, sa, na);
        memcpy(cat + na, sb, nb);
        bool added;
        int32_t z = vocab_id(v, cat, na + nb, &added);
        free(cat);
        merges[2 * nmerges] = a;
        merges[2 * nmerges + 1] = b;
        nmerges++;
        int32_t nwb = bp->nw, *wl = bp->words;
        bp->words = NULL;
        bp->nw = bp->cw = 0;
        bp->count = 0; /* every occurrence goes */
        for (int32_t i = 0; i < nwb; i++) {
            if (seen[wl[i]] == nmerges) continue;
            seen[wl[i]] = nmerges;
            merge_word(ps, h, wd, wl[i], a, b, z);
        }
        free(wl);
        ps->p[pair_get(ps, a, b)].count = 0; /* (x, a)/(b, y) updates may have touched it */
        if (progress && nmerges % 256 == 0)
            fprintf(stderr, "\rtokenizer train: %d merges, %d tokens (%.1f s)   ", nmerges,
                    v->n + 1, l3d_time_s() - t0);
    }
    free(seen);
    return nmerges;
}

l3d_status l3d_bpe_train(char **files, int nfiles, int vocab_size, const char *out_dir,
                         int *merges_out, bool progress) {
    if (merges_out) *merges_out = 0;
    if (vocab_size < 258 || vocab_size > 65536)
        return l3d_error(L3D_ERR_ARG, "vocabulary size %d is outside [258, 65536] (256 bytes, at "
                         "least one merge, the end-of-text token; uint16 shards)", vocab_size);
    if (nfiles < 1) return l3d_error(L3D_ERR_ARG, "no corpus file to train on");
    double t0 = l3d_time_s();
    struct wmap *maps;
    l3d_status st = count_corpus(files, nfiles, progress, &maps);
    if (st != L3D_OK) return st;
    struct words wd;
    words_init(&wd, maps);
    struct vocab v;
    vocab_init(&v, vocab_size);
    struct pairs ps;
    struct heap h;
    pairs_init(&ps, &h, &wd);
    int32_t *merges = malloc((size_t)2 * vocab_size * sizeof *merges);
    int nmerges = learn_merges(&v, &ps, &h, &wd, vocab_size, merges, progress, t0);
    if (progress) fputc('\n', stderr);
    st = write_files(out_dir, &v, merges, nmerges);
    if (merges_out) *merges_out = nmerges;
    pairs_free(&ps, &h);
    free(merges);
    words_free(&wd);
    vocab_free(&v);
    return st;
}
