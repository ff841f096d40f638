/* BPE training against a naive reference (rescan per merge), determinism over thread counts,
 * and BPE preparation: documents whole, end-of-text first, split by document; one clear error
 * per bad input. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "llm3d/data.h"
#include "llm3d/tokenizer.h"
#include "test.h"
#include "tokenizer/tokenizer-impl.h"

static char tmp[256], gpt2_dir[4096];

/* tmp/name, valid for the rest of the run */
static char *tpath(const char *name) {
    static char buf[64][512];
    static int k;
    k = (k + 1) % 64;
    snprintf(buf[k], sizeof buf[k], "%s/%s", tmp, name);
    return buf[k];
}

static void write_text(const char *path, const char *s, size_t n) {
    FILE *fp = fopen(path, "wb");
    L3D_ASSERT(fp != NULL);
    fwrite(s, 1, n, fp);
    fclose(fp);
}

static char *read_text(const char *path, size_t *n) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END);
    *n = (size_t)ftell(fp);
    rewind(fp);
    char *b = malloc(*n + 1);
    L3D_ASSERT(fread(b, 1, *n, fp) == *n);
    b[*n] = 0;
    fclose(fp);
    return b;
}

/* ---- naive BPE: distinct pre-tokens, all pairs recounted before each merge ------------------ */

struct nword {
    unsigned char *bytes;
    size_t len;
    int64_t count;
    int *sym;
    int n;
};

struct naive {
    struct nword *w;
    int nw, cw;
    char **tok; /* token bytes by id */
    size_t *tlen;
    int ntok;
};

static void naive_word(void *ctx, const char *s, size_t len) {
    struct naive *nv = ctx;
    for (int i = 0; i < nv->nw; i++)
        if (nv->w[i].len == len && memcmp(nv->w[i].bytes, s, len) == 0) {
            nv->w[i].count++;
            return;
        }
    if (nv->nw == nv->cw) nv->w = realloc(nv->w, (size_t)(nv->cw = 2 * nv->cw + 16) * sizeof *nv->w);
    struct nword *w = &nv->w[nv->nw++];
    w->bytes = malloc(len);
    memcpy(w->bytes, s, len);
    w->len = len;
    w->count = 1;
}

/* The merges learnt from the k texts (pre-tokenized apart, as files are), spelled as vocab.bpe,
 * written to out (a memstream). */
static void naive_train(const char *const *text, const size_t *n, int nt, int vocab, FILE *out) {
    struct naive nv = {0};
    struct l3d_tokenizer *bt;
    CHECK(l3d_tokenizer_bytes(&bt) == L3D_OK);
    struct l3d_encoder *e = l3d_encoder_init(bt);
    for (int i = 0; i < nt; i++) l3d_encoder_pretokenize(e, text[i], n[i], naive_word, &nv);
    l3d_encoder_free(e);
    l3d_tokenizer_free(bt);
    int byte_cp[256], order[256], id_of[256];
    l3d_bytes_to_unicode(byte_cp, order);
    nv.tok = malloc((size_t)vocab * sizeof *nv.tok);
    nv.tlen = malloc((size_t)vocab * sizeof *nv.tlen);
    for (int i = 0; i < 256; i++) {
        nv.tok[i] = malloc(1);
        nv.tok[i][0] = (char)order[i];
        nv.tlen[i] = 1;
        id_of[order[i]] = i;
    }
    nv.ntok = 256;
    for (int i = 0; i < nv.nw; i++) {
        nv.w[i].sym = malloc(nv.w[i].len * sizeof(int));
        nv.w[i].n = (int)nv.w[i].len;
        for (size_t k = 0; k < nv.w[i].len; k++) nv.w[i].sym[k] = id_of[nv.w[i].bytes[k]];
    }
    int64_t *cnt = malloc((size_t)vocab * vocab * sizeof *cnt);
    fputs("#version: 0.2\n", out);
    while (nv.ntok < vocab - 1) {
        memset(cnt, 0, (size_t)nv.ntok * vocab * sizeof *cnt);
        for (int i = 0; i < nv.nw; i++)
            for (int k = 0; k + 1 < nv.w[i].n; k++)
                cnt[(int64_t)nv.w[i].sym[k] * vocab + nv.w[i].sym[k + 1]] += nv.w[i].count;
        int64_t best = -1, bc = 1; /* at least 2 */
        for (int64_t p = 0; p < (int64_t)nv.ntok * vocab; p++)
            if (cnt[p] > bc) bc = cnt[best = p];
        if (best < 0) break;
        int a = (int)(best / vocab), b = (int)(best % vocab);
        size_t len = nv.tlen[a] + nv.tlen[b];
        char *cat = malloc(len);
        memcpy(cat, nv.tok[a], nv.tlen[a]);
        memcpy(cat + nv.tlen[a], nv.tok[b], nv.tlen[b]);
        int z = -1;
        for (int t = 0; t < nv.ntok; t++)
            if (nv.tlen[t] == len && memcmp(nv.tok[t], cat, len) == 0) z = t;
        if (z < 0) {
            z = nv.ntok++;
            nv.tok[z] = cat;
            nv.tlen[z] = len;
        } else {
            free(cat);
        }
        l3d_tok_write_spelled(out, (const unsigned char *)nv.tok[a], nv.tlen[a], byte_cp, false);
        fputc(' ', out);
        l3d_tok_write_spelled(out, (const unsigned char *)nv.tok[b], nv.tlen[b], byte_cp, false);
        fputc('\n', out);
        for (int i = 0; i < nv.nw; i++) {
            int o = 0, *s = nv.w[i].sym;
            for (int k = 0; k < nv.w[i].n;) {
                if (k + 1 < nv.w[i].n && s[k] == a && s[k + 1] == b) {
                    s[o++] = z;
                    k += 2;
                } else {
                    s[o++] = s[k++];
                }
            }
            nv.w[i].n = o;
        }
    }
    free(cnt);
    for (int i = 0; i < nv.nw; i++) {
        free(nv.w[i].bytes);
        free(nv.w[i].sym);
    }
    for (int t = 0; t < nv.ntok; t++) free(nv.tok[t]);
    free(nv.tok);
    free(nv.tlen);
    free(nv.w);
}

/* A corpus of words over a small alphabet: many ties, overlapping runs ("aaaa"), punctuation. */
static size_t make_corpus(char *buf, size_t cap, uint64_t seed) {
    static const char *words[] = {"aaaa", "abab", "ba", "aab", "the", "then", "there", "a",
                                  "it's", "42", "4242", "!!", "é", "éé", "\t", "  "};
    size_t n = 0;
    for (int i = 0; n + 16 < cap; i++) {
        const char *w = words[l3d_rng_u64(seed, 0, (uint64_t)i) % 16];
        if (i % 2 == 0) buf[n++] = ' ';
        memcpy(buf + n, w, strlen(w));
        n += strlen(w);
        if (i % 17 == 16) buf[n++] = '\n';
    }
    return n;
}

static void test_train(void) {
    static char corpus[40000];
    size_t n = make_corpus(corpus, sizeof corpus, 3);
    write_text(tpath("c1.txt"), corpus, n / 2);
    write_text(tpath("c2.txt"), corpus + n / 2, n - n / 2);
    char *files[] = {tpath("c1.txt"), tpath("c2.txt")};
    const int vocab = 330;
    int merges;
    l3d_status st;
    omp_set_num_threads(2);
    CHECK(l3d_bpe_train(files, 2, vocab, tpath("tok2"), &merges, false) == L3D_OK);
    omp_set_num_threads(1);
    CHECK(l3d_bpe_train(files, 2, vocab, tpath("tok1"), &merges, false) == L3D_OK);
    omp_set_num_threads(2);
    CHECK(merges > 50);
    size_t n1, n2, n3, n4;
    char *b1 = read_text(tpath("tok1/vocab.bpe"), &n1), *b2 = read_text(tpath("tok2/vocab.bpe"), &n2);
    char *j1 = read_text(tpath("tok1/encoder.json"), &n3), *j2 = read_text(tpath("tok2/encoder.json"), &n4);
    CHECK(b1 && b2 && n1 == n2 && memcmp(b1, b2, n1) == 0); /* deterministic over threads */
    CHECK(j1 && j2 && n3 == n4 && memcmp(j1, j2, n3) == 0);
    /* the same merges as the naive trainer, in the same order */
    char *ref;
    size_t nref;
    FILE *ms = open_memstream(&ref, &nref);
    const char *texts[2] = {corpus, corpus + n / 2};
    size_t lens[2] = {n / 2, n - n / 2};
    naive_train(texts, lens, 2, vocab, ms);
    fclose(ms);
    CHECK(nref == n1 && memcmp(ref, b1, n1) == 0);
    if (nref != n1 || memcmp(ref, b1, n1) != 0) {
        size_t d = 0;
        while (d < n1 && d < nref && ref[d] == b1[d]) d++;
        fprintf(stderr, "merges differ from the naive trainer at byte %zu: \"%.40s\" vs \"%.40s\"\n",
                d, b1 + d, ref + d);
    }
    free(ref);
    /* the result loads, has vocab tokens, end-of-text last, and encodes the corpus compactly and
     * reversibly */
    struct l3d_tokenizer *t;
    CHECK(l3d_tokenizer_load(&t, tpath("tok1")) == L3D_OK);
    CHECK(l3d_tokenizer_vocab_size(t) == vocab);
    CHECK(l3d_tokenizer_eot(t) == vocab - 1);
    struct l3d_encoder *e = l3d_encoder_init(t);
    struct l3d_ids ids = {0};
    l3d_encoder_encode(e, corpus, n, &ids);
    CHECK(ids.n < (int64_t)n / 2);
    char *dec = NULL;
    size_t cap = 0;
    CHECK(l3d_tokenizer_decode(t, ids.v, ids.n, &dec, &cap) == n && memcmp(dec, corpus, n) == 0);
    free(dec);
    l3d_ids_free(&ids);
    l3d_encoder_free(e);
    l3d_tokenizer_free(t);
    /* a vocabulary larger than the corpus supports: fewer merges, still valid */
    st = l3d_bpe_train(files, 1, 5000, tpath("big"), &merges, false);
    if (st != L3D_OK) fprintf(stderr, "%s\n", l3d_error_message());
    CHECK(st == L3D_OK);
    CHECK(merges > 0 && merges < 5000 - 257);
    if (l3d_tokenizer_load(&t, tpath("big")) == L3D_OK) {
        CHECK(l3d_tokenizer_vocab_size(t) <= merges + 257);
        l3d_tokenizer_free(t);
    } else {
        CHECK(0);
    }
    /* errors */
    write_text(tpath("empty.txt"), "", 0);
    char *bad[] = {tpath("empty.txt"), tpath("nul.txt"), tpath("none.txt")};
    CHECK(l3d_bpe_train(bad, 1, 300, tpath("x"), NULL, false) == L3D_ERR_FORMAT);
    CHECK(strstr(l3d_error_message(), "no text") != NULL);
    write_text(tpath("nul.txt"), "ab\0cd", 5);
    CHECK(l3d_bpe_train(bad + 1, 1, 300, tpath("x"), NULL, false) == L3D_ERR_FORMAT);
    CHECK(strstr(l3d_error_message(), "nul.txt holds a NUL byte at offset 2") != NULL);
    CHECK(l3d_bpe_train(bad + 2, 1, 300, tpath("x"), NULL, false) == L3D_ERR_IO);
    CHECK(strstr(l3d_error_message(), "none.txt") != NULL);
    CHECK(l3d_bpe_train(files, 2, 257, tpath("x"), NULL, false) == L3D_ERR_ARG);
    CHECK(l3d_bpe_train(files, 2, 65537, tpath("x"), NULL, false) == L3D_ERR_ARG);
    free(b1);
    free(b2);
    free(j1);
    free(j2);
}

/* The tokens of a shard file. */
static int64_t shard_tokens(const char *path, uint16_t *out, int64_t cap) {
    struct l3d_data *d;
    if (l3d_data_open(&d, path, 0) != L3D_OK) return -1;
    int64_t n;
    const uint16_t *t = l3d_data_file_tokens(d, 0, &n);
    if (n <= cap) memcpy(out, t, (size_t)n * sizeof *t);
    l3d_data_free(d);
    return n;
}

static void test_prepare(void) {
    struct l3d_tokenizer *t;
    CHECK(l3d_tokenizer_load(&t, gpt2_dir) == L3D_OK);
    const char *a = "doc one\n%\ndoc two\n\n%\n%\ndoc three \xc3\xa9\n";
    const char *b = "whole file doc\n";
    write_text(tpath("a.txt"), a, strlen(a));
    write_text(tpath("b.txt"), b, strlen(b));
    char *files[] = {tpath("a.txt"), tpath("b.txt")};
    const char *docs[] = {"doc one\n", "doc two\n\n", "doc three \xc3\xa9\n", "whole file doc\n"};
    struct l3d_prepare_stats stats;
    CHECK(l3d_prepare_bpe(tpath("data"), files, 2, 0.34, 1000, t, "%", -1, false, &stats) == L3D_OK);
    CHECK(stats.docs == 4 && stats.train_shards == 1 && stats.val_shards == 1);
    /* expected: documents 0, 1, 3 in training, 2 in validation (every 1/0.34-th), each after
     * end-of-text */
    struct l3d_ids want[2] = {{0}, {0}};
    struct l3d_encoder *e = l3d_encoder_init(t);
    for (int d = 0; d < 4; d++) {
        struct l3d_ids *w = &want[d == 2];
        l3d_ids_push(w, 50256);
        l3d_encoder_encode(e, docs[d], strlen(docs[d]), w);
    }
    l3d_encoder_free(e);
    uint16_t got[256];
    const char *names[2] = {"data/train_000000.bin", "data/val_000000.bin"};
    for (int k = 0; k < 2; k++) {
        int64_t n = shard_tokens(tpath(names[k]), got, 256);
        bool same = n == want[k].n;
        for (int64_t i = 0; same && i < n; i++) same = got[i] == want[k].v[i];
        CHECK(same);
        l3d_ids_free(&want[k]);
    }
    CHECK(stats.train_tokens + stats.val_tokens == stats.tokens);
    /* several shards: at most 5 tokens each; a rerun with fewer shards deletes the extra ones */
    CHECK(l3d_prepare_bpe(tpath("data"), files, 2, 0.34, 5, t, "%", -1, false, &stats) == L3D_OK);
    CHECK(stats.train_shards == (int)((stats.train_tokens + 4) / 5));
    CHECK(l3d_prepare_bpe(tpath("data"), files, 2, 0.34, 1000, t, "%", -1, false, &stats) == L3D_OK);
    CHECK(stats.stale_removed > 0);
    /* without a separator each file is one document */
    CHECK(l3d_prepare_bpe(tpath("data"), files, 2, 0.5, 1000, t, NULL, -1, false, &stats) == L3D_OK);
    CHECK(stats.docs == 2);

    /* errors, one clear message each */
    write_text(tpath("empty.txt"), "", 0);
    write_text(tpath("nul.txt"), "ab\0", 3);
    write_text(tpath("seps.txt"), "%\n%\n", 4);
    char *empty[] = {tpath("empty.txt")}, *nul[] = {tpath("nul.txt")}, *seps[] = {tpath("seps.txt")};
    CHECK(l3d_prepare_bpe(tpath("e"), empty, 1, 0.1, 1000, t, NULL, -1, false, NULL) == L3D_ERR_FORMAT);
    CHECK(strstr(l3d_error_message(), "no text") != NULL);
    CHECK(l3d_prepare_bpe(tpath("e"), nul, 1, 0.1, 1000, t, NULL, -1, false, NULL) == L3D_ERR_FORMAT);
    CHECK(strstr(l3d_error_message(), "nul.txt holds a NUL byte") != NULL);
    CHECK(l3d_prepare_bpe(tpath("e"), seps, 1, 0.1, 1000, t, "%", -1, false, NULL) == L3D_ERR_FORMAT);
    CHECK(strstr(l3d_error_message(), "no document") != NULL);
    CHECK(l3d_prepare_bpe(tpath("e"), files + 1, 1, 0.1, 1000, t, NULL, -1, false, NULL) == L3D_ERR_FORMAT);
    CHECK(strstr(l3d_error_message(), "--val-fraction 0") != NULL);
    CHECK(l3d_prepare_bpe(tpath("e"), files + 1, 1, 0.0, 1000, t, NULL, -1, false, NULL) == L3D_OK);
    struct stat sb;
    CHECK(stat(tpath("e/val_000000.bin"), &sb) != 0); /* no validation shard */
    /* decoding-only tokenizer (llm.c's file) */
    CHECK(l3d_tokenizer_save_llmc(t, tpath("tok.bin")) == L3D_OK);
    struct l3d_tokenizer *u;
    CHECK(l3d_tokenizer_load_llmc(&u, tpath("tok.bin")) == L3D_OK);
    CHECK(l3d_prepare_bpe(tpath("e"), files, 2, 0.1, 1000, u, NULL, -1, false, NULL) == L3D_ERR_ARG);
    CHECK(strstr(l3d_error_message(), "decodes only") != NULL);
    l3d_tokenizer_free(u);
    l3d_tokenizer_free(t);
    /* a vocabulary too large for uint16 shards: 256 bytes + 65281 two-byte tokens; documents start
     * with token 65536 (no end-of-text: the doc_token given), written to uint32 shards */
    mkdir(tpath("huge"), 0755);
    FILE *fp = fopen(tpath("huge/encoder.json"), "wb");
    int byte_cp[256], id = 0;
    l3d_bytes_to_unicode(byte_cp, NULL);
    fputc('{', fp);
    for (int x = 0; x < 256; x++) {
        unsigned char c = (unsigned char)x;
        fputs(id ? ", \"" : "\"", fp);
        l3d_tok_write_spelled(fp, &c, 1, byte_cp, true);
        fprintf(fp, "\": %d", id++);
    }
    for (int x = 0; id < 65537; x++) {
        unsigned char c[2] = {(unsigned char)(x / 256), (unsigned char)(x % 256)};
        fputs(", \"", fp);
        l3d_tok_write_spelled(fp, c, 2, byte_cp, true);
        fprintf(fp, "\": %d", id++);
    }
    fputs("}", fp);
    fclose(fp);
    write_text(tpath("huge/vocab.bpe"), "#version: 0.2\n", 14);
    CHECK(l3d_tokenizer_load(&t, tpath("huge")) == L3D_OK);
    CHECK(l3d_prepare_bpe(tpath("e"), files, 2, 0.1, 1000, t, NULL, -1, false, NULL) == L3D_ERR_ARG);
    CHECK(strstr(l3d_error_message(), "no \"<|endoftext|>\" token") != NULL);
    CHECK(l3d_prepare_bpe(tpath("w"), files, 2, 0.0, 1000, t, NULL, 65536, false, NULL) == L3D_OK);
    int32_t hdr[3] = {0}, first[2] = {0};
    FILE *sh = fopen(tpath("w/train_000000.bin"), "rb");
    CHECK(sh && fread(hdr, 4, 3, sh) == 3);
    if (sh) fclose(sh);
    CHECK(hdr[0] == 20240801 && hdr[1] == 7); /* llm.c's Llama 3 shard header */
    struct l3d_data *d = NULL;
    CHECK(l3d_data_open(&d, tpath("w/train_000000.bin"), 65537) == L3D_OK);
    if (d) {
        CHECK(l3d_data_file_wide(d, 0) && l3d_data_file_ntok(d, 0) == hdr[2]);
        l3d_data_file_read(d, 0, 0, 2, first);
        CHECK(first[0] == 65536 && first[1] < 65536);
        l3d_data_free(d);
    }
    CHECK(l3d_data_open(&d, tpath("w/train_000000.bin"), 65536) == L3D_ERR_FORMAT); /* 65536 >= V */
    l3d_tokenizer_free(t);
}

int main(void) {
    test_dirs(__FILE__, "data/gpt2", gpt2_dir, sizeof gpt2_dir, "test_bpe", tmp, sizeof tmp);
    test_train();
    test_prepare();
    CHECK(test_rm_rf(tmp));
    return TEST_REPORT();
}
