/*
 * tiktoken rank files (OpenAI's cl100k_base and o200k_base, Meta's Llama 3 tokenizer.model): one
 * line "base64(token bytes) rank" per token, ranks 0..R-1. The file holds neither the pattern nor
 * the special tokens: the encoding is known by its rank count, and its pattern and special tokens
 * are those tiktoken (tiktoken_ext/openai_public.py) and Meta's llama3 tokenizer.py give it.
 *
 * Encoding (tiktoken's byte_pair_encode): a pre-token that is a token is that token; otherwise its
 * bytes merge pair by pair, the adjacent pair whose concatenation has the lowest rank first (the
 * leftmost on a tie). That is GPT-2's merge loop (bpe.c) over a table holding, for every token of
 * rank r and every split of its bytes into two tokens a b, the merge (a, b) -> token at rank r.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llm3d/tokenizer.h"
#include "tokenizer/tokenizer-impl.h"

/* Llama 3.1's 256 special tokens from 128000 (llama3-tokenizer-js's list; Llama 3.0 called
 * 128004, 128008 and 128010 reserved tokens); the rest are <|reserved_special_token_3..247|>. */
static const char *const llama3_named[] = {
    "<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>",
    "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>",
};

struct special_def {
    const char *s;
    int id;
};

static const struct special_def cl100k_special[] = {
    {"<|endoftext|>", 100257}, {"<|fim_prefix|>", 100258}, {"<|fim_middle|>", 100259},
    {"<|fim_suffix|>", 100260}, {"<|endofprompt|>", 100276}, {NULL, 0},
};
static const struct special_def o200k_special[] = {
    {"<|endoftext|>", 199999}, {"<|endofprompt|>", 200018}, {NULL, 0},
};

/* The encodings llm3d knows a rank file as, by its number of ranks. */
static const struct tiktoken_kind {
    const char *name;
    int ranks;
    const char *pattern;
    const struct special_def *special; /* NULL: Llama 3's */
    const char *eot, *bot;
} kinds[] = {
    {"cl100k_base", 100256, L3D_CL100K_PATTERN, cl100k_special, "<|endoftext|>", NULL},
    {"o200k_base", 199998, L3D_O200K_PATTERN, o200k_special, "<|endoftext|>", NULL},
    {"Llama 3", 128000, L3D_CL100K_PATTERN, NULL, "<|end_of_text|>", "<|begin_of_text|>"},
};

long l3d_tok_base64(const char *s, size_t n, unsigned char *out) {
    static signed char val[256];
    if (!val['B']) {
        memset(val, -1, sizeof val);
        const char *a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        for (int i = 0; i < 64; i++) val[(unsigned char)a[i]] = (signed char)i;
    }
    if (n % 4) return -1;
    long m = 0;
    for (size_t i = 0; i < n; i += 4) {
        int pad = (s[i + 3] == '=') + (s[i + 2] == '=' && s[i + 3] == '=');
        if (pad && i + 4 != n) return -1;
        int v[4];
        for (int k = 0; k < 4 - pad; k++)
            if ((v[k] = val[(unsigned char)s[i + k]]) < 0) return -1;
        for (int k = 4 - pad; k < 4; k++) v[k] = 0;
        uint32_t x = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
        out[m++] = (unsigned char)(x >> 16);
        if (pad < 2) out[m++] = (unsigned char)(x >> 8);
        if (pad < 1) out[m++] = (unsigned char)x;
    }
    return m;
}

/* One rank line's token: its bytes at blob + off, and the line. */
struct rank_entry {
    int64_t off, len;
    size_t line;
};

/* Reads the lines "base64 rank" into ent[rank] (bytes in blob), ranks 0..R-1 each once; *R
 * receives the count. ent has room for one entry a line. */
static l3d_status read_ranks(const char *path, const char *txt, size_t n, struct rank_entry *ent,
                             unsigned char *blob, int *R) {
    size_t line = 0, nlines = 0, nb = 0;
    for (size_t i = 0; i < n; i++) nlines += txt[i] == '\n';
    nlines += n > 0 && txt[n - 1] != '\n';
    for (size_t k = 0; k < nlines; k++) ent[k].len = -1;
    int count = 0;
    for (size_t i = 0; i < n;) {
        line++;
        const char *a = txt + i, *e = memchr(a, '\n', n - i);
        size_t len = e ? (size_t)(e - a) : n - i;
        i += len + 1;
        if (len && a[len - 1] == '\r') len--;
        if (len == 0) continue;
        const char *sp = memchr(a, ' ', len);
        long rank = -1, m = -1;
        if (sp && sp + 1 < a + len && sp[1] >= '0' && sp[1] <= '9') {
            char *end;
            rank = strtol(sp + 1, &end, 10);
            if (end != a + len) rank = -1;
            m = l3d_tok_base64(a, (size_t)(sp - a), blob + nb);
        }
        if (m <= 0 || rank < 0 || (size_t)rank >= nlines)
            return l3d_error(L3D_ERR_FORMAT, "%s line %zu is not \"base64-token rank\" with a rank "
                             "below the file's %zu lines: not a tiktoken rank file", path, line,
                             nlines);
        if (ent[rank].len >= 0)
            return l3d_error(L3D_ERR_FORMAT, "%s lines %zu and %zu: rank %ld is given twice: each "
                             "rank is one token", path, ent[rank].line, line, rank);
        ent[rank] = (struct rank_entry){(int64_t)nb, m, line};
        nb += (size_t)m;
        count++;
    }
    for (int r = 0; r < count; r++)
        if (ent[r].len < 0)
            return l3d_error(L3D_ERR_FORMAT, "%s: rank %d is missing: the %d ranks must be 0..%d",
                             path, r, count, count - 1);
    *R = count;
    return L3D_OK;
}

/* The tokens of ranks 0..R-1 are distinct byte strings, as tiktoken requires (its
 * load_tiktoken_bpe keeps one rank per byte string and Encoding checks the count): two lines with
 * the same token are refused, named. */
static l3d_status check_distinct(const char *path, const struct rank_entry *ent,
                                 const unsigned char *blob, int R) {
    uint64_t cap = 1;
    while (cap < 2 * (uint64_t)R) cap <<= 1;
    int32_t *slot = l3d_calloc(cap * sizeof *slot, "rank file check"); /* rank + 1; 0: empty */
    l3d_status st = L3D_OK;
    for (int r = 0; r < R && st == L3D_OK; r++) {
        const unsigned char *s = blob + ent[r].off;
        uint64_t h = L3D_TOK_HASH_START;
        for (int64_t k = 0; k < ent[r].len; k++) h = l3d_tok_hash_step(h, s[k]);
        uint64_t i = l3d_tok_hash_end(h) & (cap - 1);
        for (; slot[i]; i = (i + 1) & (cap - 1)) {
            const struct rank_entry *o = &ent[slot[i] - 1];
            if (o->len != ent[r].len || memcmp(blob + o->off, s, (size_t)o->len) != 0) continue;
            bool first = o->line < ent[r].line;
            st = l3d_error(L3D_ERR_FORMAT, "%s lines %zu (rank %d) and %zu (rank %d) hold the "
                           "same token (%lld bytes): each token has one rank, as tiktoken "
                           "requires; remove one of the lines", path,
                           first ? o->line : ent[r].line, first ? slot[i] - 1 : r,
                           first ? ent[r].line : o->line, first ? r : slot[i] - 1,
                           (long long)ent[r].len);
            break;
        }
        slot[i] = r + 1;
    }
    l3d_free(slot);
    return st;
}

/* t's tokens: ranks 0..R-1 from ent/blob, then the special tokens of kind k (ids above R). */
static void set_tokens(struct l3d_tokenizer *t, const struct tiktoken_kind *k,
                       const struct rank_entry *ent, const unsigned char *blob, int R) {
    char name[64];
    int V = R;
    if (k->special)
        for (const struct special_def *d = k->special; d->s; d++) V = d->id + 1 > V ? d->id + 1 : V;
    else
        V = R + 256;
    t->V = V;
    t->off = l3d_alloc((size_t)(V + 1) * sizeof *t->off, "token offsets");
    int64_t nb = 0;
    for (int r = 0; r < R; r++) nb += ent[r].len;
    t->blob = l3d_alloc((size_t)nb + 256 * 40, "token bytes");
    t->special.id = l3d_alloc(256 * sizeof *t->special.id, "special tokens");
    int64_t o = 0;
    for (int id = 0; id < V; id++) {
        t->off[id] = o;
        const char *sp = NULL;
        if (id < R) {
            memcpy(t->blob + o, blob + ent[id].off, (size_t)ent[id].len);
            o += ent[id].len;
            continue;
        }
        if (!k->special) {
            int j = id - R, nn = (int)(sizeof llama3_named / sizeof *llama3_named);
            if (j < nn) sp = llama3_named[j];
            else snprintf(name, sizeof name, "<|reserved_special_token_%d|>", j - nn + 3);
            sp = sp ? sp : name;
        } else {
            for (const struct special_def *d = k->special; d->s; d++)
                if (d->id == id) sp = d->s;
        }
        if (!sp) continue; /* an id no token has: empty */
        memcpy(t->blob + o, sp, strlen(sp));
        o += (int64_t)strlen(sp);
        t->special.id[t->special.n++] = id;
        if (strcmp(sp, k->eot) == 0) t->eot = id;
        if (k->bot && strcmp(sp, k->bot) == 0) t->bot = id;
    }
    t->off[V] = o;
}

/* The merges of every token of ranks 0..R-1: each split into two tokens (see the top). The splits
 * whose halves are both tokens (cl100k_base: 233,378 of 543,574; o200k_base: 446,189 of
 * 1,197,672) are collected first, so the table is sized for them: sized for every split it was
 * 4 times larger, and zeroing it was half of the load time. */
static void rank_merges(struct l3d_tokenizer *t, int R) {
    uint64_t splits = 0, n = 0;
    for (int id = 0; id < R; id++) {
        int64_t len = t->off[id + 1] - t->off[id];
        splits += len > 1 ? (uint64_t)(len - 1) : 0;
    }
    int32_t(*m)[3] = l3d_alloc((splits + 1) * sizeof *m, "rank merges");
    for (int id = 0; id < R; id++) {
        const unsigned char *s = t->blob + t->off[id];
        size_t len = (size_t)(t->off[id + 1] - t->off[id]);
        uint64_t h = L3D_TOK_HASH_START; /* of the prefix s[0..k) */
        for (size_t k = 1; k < len; k++) {
            h = l3d_tok_hash_step(h, s[k - 1]);
            int a = l3d_tok_index_find_hashed(&t->ix, t, s, k, l3d_tok_hash_end(h));
            int b = a >= 0 && a < R ? l3d_tok_index_find(&t->ix, t, s + k, len - k) : -1;
            if (b >= 0 && b < R) {
                m[n][0] = a, m[n][1] = b, m[n][2] = id;
                n++;
            }
        }
    }
    l3d_tok_merges_alloc(t, n + 1);
    for (uint64_t i = 0; i < n; i++) l3d_tok_merge_insert(t, m[i][0], m[i][1], m[i][2], m[i][2]);
    l3d_free(m);
}

l3d_status l3d_tok_parse_tiktoken(struct l3d_tokenizer *t, const char *path, const char *txt,
                                  size_t n) {
    size_t nlines = 1;
    for (size_t i = 0; i < n; i++) nlines += txt[i] == '\n';
    struct rank_entry *ent = l3d_alloc(nlines * sizeof *ent, "rank file entries");
    unsigned char *blob = l3d_alloc(n + 1, "rank file tokens");
    int R = 0;
    l3d_status st = read_ranks(path, txt, n, ent, blob, &R);
    if (st == L3D_OK) st = check_distinct(path, ent, blob, R);
    const struct tiktoken_kind *k = NULL;
    for (size_t i = 0; st == L3D_OK && i < sizeof kinds / sizeof *kinds; i++)
        if (kinds[i].ranks == R) k = &kinds[i];
    if (st == L3D_OK && !k)
        st = l3d_error(L3D_ERR_FORMAT, "%s holds %d ranks: llm3d knows the pattern and special "
                       "tokens of tiktoken rank files of cl100k_base (100256 ranks), o200k_base "
                       "(199998) and Llama 3 (128000) only", path, R);
    if (st == L3D_OK) {
        set_tokens(t, k, ent, blob, R);
        l3d_tok_index_build(&t->ix, t);
        t->whole_first = true;
        rank_merges(t, R);
        for (int b = 0; b < 256 && st == L3D_OK; b++) {
            unsigned char c = (unsigned char)b;
            t->byte_id[b] = l3d_tok_index_find(&t->ix, t, &c, 1);
            if (t->byte_id[b] < 0 || t->byte_id[b] >= R)
                st = l3d_error(L3D_ERR_FORMAT, "%s has no rank for the byte 0x%02X: a byte-level "
                               "vocabulary holds all 256 bytes", path, b);
        }
    }
    if (st == L3D_OK) st = l3d_tok_compile(t, k->pattern, path);
    l3d_free(ent);
    l3d_free(blob);
    return st;
}
