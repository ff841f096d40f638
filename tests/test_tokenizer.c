/* GPT-2 byte-level BPE: the reference encoder's ids (tests/data/gpt2_vectors.tsv, written by
 * scripts/gpt2_vectors.js with the npm package gpt-3-encoder; gpt2_vectors_unicode.tsv: letters and
 * digits of Unicode 15 to 17), the \s choice where the references disagree, round trips of arbitrary bytes,
 * llm.c's tokenizer file, and one clear error per malformed file. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "llm3d/tokenizer.h"
#include "test.h"

static char data_dir[4096], tmp_dir[4096];

static void write_file(const char *dir, const char *name, const void *s, size_t n) {
    char path[8192];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *fp = fopen(path, "wb");
    L3D_ASSERT(fp != NULL);
    fwrite(s, 1, n, fp);
    fclose(fp);
}

static void copy_file(const char *from, const char *dir, const char *name, size_t keep) {
    char *buf;
    FILE *fp = fopen(from, "rb");
    L3D_ASSERT(fp != NULL);
    fseek(fp, 0, SEEK_END);
    size_t n = (size_t)ftell(fp);
    rewind(fp);
    buf = malloc(n);
    L3D_ASSERT(fread(buf, 1, n, fp) == n);
    fclose(fp);
    write_file(dir, name, buf, keep < n ? keep : n);
    free(buf);
}

static int hexval(int c) { return c <= '9' ? c - '0' : c - 'a' + 10; }

/* Every vector of the reference encoder: same ids, and decoding gives the text back. */
static void test_vectors(const struct l3d_tokenizer *t, const char *file, int min_cases) {
    char path[8192];
    snprintf(path, sizeof path, "%s/%s", data_dir, file);
    FILE *fp = fopen(path, "r");
    CHECK(fp != NULL);
    if (!fp) return;
    struct l3d_encoder *e = l3d_encoder_init(t);
    static char line[65536];
    unsigned char text[32768];
    int cases = 0, bad = 0;
    char *dec = NULL;
    size_t cap = 0;
    while (fgets(line, sizeof line, fp)) {
        char *tab = strchr(line, '\t');
        CHECK(tab != NULL);
        if (!tab) break;
        size_t n = (size_t)(tab - line) / 2;
        for (size_t i = 0; i < n; i++) text[i] = (unsigned char)(hexval(line[2 * i]) * 16 + hexval(line[2 * i + 1]));
        struct l3d_ids want = {0}, got = {0};
        for (char *p = tab + 1, *end; *p && *p != '\n'; p = end) {
            long v = strtol(p, &end, 10);
            if (end == p) break;
            l3d_ids_push(&want, (int32_t)v);
        }
        l3d_encoder_encode(e, (const char *)text, n, &got);
        bool same = got.n == want.n && (got.n == 0 || memcmp(got.v, want.v, (size_t)got.n * 4) == 0);
        if (!same && bad++ < 5) {
            fprintf(stderr, "mismatch on \"%.*s\": got", (int)n, text);
            for (int64_t i = 0; i < got.n; i++) fprintf(stderr, " %d", got.v[i]);
            fprintf(stderr, ", want");
            for (int64_t i = 0; i < want.n; i++) fprintf(stderr, " %d", want.v[i]);
            fprintf(stderr, "\n");
        }
        CHECK(same);
        size_t m = l3d_tokenizer_decode(t, got.v, got.n, &dec, &cap);
        CHECK(m == n && (n == 0 || memcmp(dec, text, n) == 0));
        l3d_ids_free(&want);
        l3d_ids_free(&got);
        cases++;
    }
    fclose(fp);
    free(dec);
    l3d_encoder_free(e);
    fprintf(stderr, "%s: %d reference vectors, %d mismatches\n", file, cases, bad);
    CHECK(cases >= min_cases);
}

static bool encodes_as(const struct l3d_tokenizer *t, const char *s, const int32_t *want, int n) {
    struct l3d_encoder *e = l3d_encoder_init(t);
    struct l3d_ids got = {0};
    l3d_encoder_encode(e, s, strlen(s), &got);
    bool same = got.n == n && memcmp(got.v, want, (size_t)n * sizeof *want) == 0;
    if (!same) {
        fprintf(stderr, "\"%s\" encodes as", s);
        for (int64_t i = 0; i < got.n; i++) fprintf(stderr, " %d", got.v[i]);
        fprintf(stderr, "\n");
    }
    l3d_ids_free(&got);
    l3d_encoder_free(e);
    return same;
}

/* Where the references disagree, \s is the Python `regex` module's (Unicode White_Space): U+0085
 * is space, U+FEFF is not (docs/DESIGN.md). Python splits " \u0085a" as " ", "\u0085", "a" and
 * " \uFEFFa" as " \uFEFF", "a"; the JavaScript encoder gives 1587 227 64 and 220 171 119 123 64. */
static void test_whitespace_choice(const struct l3d_tokenizer *t) {
    CHECK(encodes_as(t, " \xc2\x85" "a", (const int32_t[]){220, 126, 227, 64}, 4));
    CHECK(encodes_as(t, " \xef\xbb\xbf" "a", (const int32_t[]){27332, 119, 123, 64}, 4));
}

static bool round_trip(struct l3d_encoder *e, const struct l3d_tokenizer *t, const unsigned char *s,
                       size_t n) {
    struct l3d_ids ids = {0};
    l3d_encoder_encode(e, (const char *)s, n, &ids);
    char *dec = NULL;
    size_t cap = 0, m = l3d_tokenizer_decode(t, ids.v, ids.n, &dec, &cap);
    bool ok = m == n && (n == 0 || memcmp(dec, s, n) == 0);
    free(dec);
    l3d_ids_free(&ids);
    return ok;
}

/* decode(encode(x)) == x for random bytes (mostly invalid UTF-8), random mixes of valid code
 * points and stray bytes, and long runs. */
static void test_round_trip(const struct l3d_tokenizer *t) {
    struct l3d_encoder *e = l3d_encoder_init(t);
    l3d_rng rng;
    l3d_rng_seed(&rng, 7);
    static unsigned char buf[20000];
    static const char *pieces[] = {"a", " ", "\n", "é", "日", "🙂", "'s", "1", "\xff", "\xc3",
                                   "\xe6\x97", "\t", "\xc2\xa0", "\xc2\x85", "\xef\xbb\xbf", ",",
                                   "\x80", "\xf0\x9f"};
    int fails = 0;
    for (int trial = 0; trial < 300; trial++) {
        size_t n = 0, len = 1 + l3d_rng_next(&rng) % 400;
        if (trial % 2 == 0) {
            for (; n < len; n++) buf[n] = (unsigned char)l3d_rng_next(&rng);
        } else {
            while (n < len) {
                const char *p = pieces[l3d_rng_next(&rng) % (sizeof pieces / sizeof *pieces)];
                memcpy(buf + n, p, strlen(p));
                n += strlen(p);
            }
        }
        fails += !round_trip(e, t, buf, n);
    }
    CHECK(fails == 0);
    memset(buf, ' ', sizeof buf);
    CHECK(round_trip(e, t, buf, sizeof buf));
    memset(buf, 'a', sizeof buf);
    CHECK(round_trip(e, t, buf, sizeof buf));
    memset(buf, 0xff, 5000);
    CHECK(round_trip(e, t, buf, 5000));
    CHECK(round_trip(e, t, (const unsigned char *)"", 0));
    /* the cache gives the same ids as a fresh encoder */
    struct l3d_ids a = {0}, b = {0};
    const char *s = "the cat the cat the hat, the cat's hat";
    l3d_encoder_encode(e, s, strlen(s), &a);
    struct l3d_encoder *e2 = l3d_encoder_init(t);
    l3d_encoder_encode(e2, s, strlen(s), &b);
    CHECK(a.n == b.n && memcmp(a.v, b.v, (size_t)a.n * 4) == 0);
    l3d_ids_free(&a);
    l3d_ids_free(&b);
    l3d_encoder_free(e2);
    l3d_encoder_free(e);
}

/* llm.c's tokenizer file: written, read back, decodes every token alike; bad files. */
static void test_llmc_file(const struct l3d_tokenizer *t) {
    char path[8192];
    snprintf(path, sizeof path, "%s/gpt2_tokenizer.bin", tmp_dir);
    CHECK(l3d_tokenizer_save_llmc(t, path) == L3D_OK);
    struct l3d_tokenizer *u;
    CHECK(l3d_tokenizer_open(&u, path) == L3D_OK);
    CHECK(l3d_tokenizer_vocab_size(u) == 50257);
    CHECK(l3d_tokenizer_eot(u) == 50256);
    CHECK(!l3d_tokenizer_can_encode(u));
    int diff = 0;
    for (int id = 0; id < 50257; id++) {
        size_t n1, n2;
        const unsigned char *a = l3d_tokenizer_token(t, id, &n1), *b = l3d_tokenizer_token(u, id, &n2);
        diff += n1 != n2 || memcmp(a, b, n1) != 0;
    }
    CHECK(diff == 0);
    l3d_tokenizer_free(u);

    char bad[8192];
    snprintf(bad, sizeof bad, "%s/trunc.bin", tmp_dir);
    copy_file(path, tmp_dir, "trunc.bin", 100000);
    CHECK(l3d_tokenizer_load_llmc(&u, bad) == L3D_ERR_FORMAT);
    CHECK(strstr(l3d_error_message(), "truncated") != NULL);
    copy_file(path, tmp_dir, "trunc.bin", 500);
    CHECK(l3d_tokenizer_load_llmc(&u, bad) == L3D_ERR_FORMAT);
    CHECK(strstr(l3d_error_message(), "header") != NULL);
    char junk[2048] = "not a tokenizer";
    write_file(tmp_dir, "trunc.bin", junk, sizeof junk);
    CHECK(l3d_tokenizer_load_llmc(&u, bad) == L3D_ERR_FORMAT);
    CHECK(strstr(l3d_error_message(), "magic") != NULL);
}

/* One clear error for each malformed pair of files. */
static void expect_bad(const char *json, const char *bpe, l3d_status want, const char *needle) {
    char dir[8192];
    snprintf(dir, sizeof dir, "%s/bad", tmp_dir);
    mkdir(dir, 0755);
    if (json) write_file(dir, "encoder.json", json, strlen(json));
    if (bpe) write_file(dir, "vocab.bpe", bpe, strlen(bpe));
    struct l3d_tokenizer *t = NULL;
    l3d_status st = l3d_tokenizer_load(&t, dir);
    CHECK(st == want && (t == NULL) == (want != L3D_OK));
    l3d_tokenizer_free(t);
    if (want != L3D_OK && !strstr(l3d_error_message(), needle)) {
        fprintf(stderr, "error \"%s\" lacks \"%s\"\n", l3d_error_message(), needle);
        CHECK(0);
    }
    char p[8300];
    snprintf(p, sizeof p, "%s/encoder.json", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/vocab.bpe", dir);
    unlink(p);
}

static void test_errors(void) {
    struct l3d_tokenizer *t;
    char dir[8192];
    snprintf(dir, sizeof dir, "%s/nowhere", tmp_dir);
    CHECK(l3d_tokenizer_load(&t, dir) == L3D_ERR_IO);
    CHECK(strstr(l3d_error_message(), "nowhere/encoder.json") != NULL);
    CHECK(l3d_tokenizer_open(&t, dir) == L3D_ERR_IO);
    CHECK(strstr(l3d_error_message(), "gpt2_tokenizer.bin") != NULL);
    /* a JSON object of the 256 byte tokens, then variations */
    static char json[16384];
    int byte_cp[256];
    size_t n = 0;
    json[n++] = '{';
    for (int b = 0; b < 256; b++) {
        int cp = b >= '!' && b <= '~' ? b : (b >= 0xA1 && b <= 0xAC) || b >= 0xAE ? b : -1;
        byte_cp[b] = cp;
    }
    int extra = 0;
    for (int b = 0; b < 256; b++) {
        int cp = byte_cp[b] >= 0 ? byte_cp[b] : 256 + extra++;
        n += (size_t)snprintf(json + n, sizeof json - n, "%s\"", b ? ", " : "");
        if (cp == '"' || cp == '\\') json[n++] = '\\';
        if (cp < 0x80) json[n++] = (char)cp;
        else { json[n++] = (char)(0xC0 | cp >> 6); json[n++] = (char)(0x80 | (cp & 63)); }
        n += (size_t)snprintf(json + n, sizeof json - n, "\": %d", b);
    }
    size_t base = n;
    snprintf(json + n, sizeof json - n, ", \"ab\": 256}");
    expect_bad(json, "#version: 0.2\na b\n", L3D_OK, "");
    expect_bad(json, NULL, L3D_ERR_IO, "vocab.bpe");
    expect_bad(json, "a b\n", L3D_ERR_FORMAT, "#version");
    expect_bad(json, "#version: 0.2\na c\n", L3D_ERR_FORMAT, "line 2");
    expect_bad(json, "#version: 0.2\nab\n", L3D_ERR_FORMAT, "line 2");
    snprintf(json + base, sizeof json - base, ", \"ab\": 257}");
    expect_bad(json, "#version: 0.2\n", L3D_ERR_FORMAT, "257");
    snprintf(json + base, sizeof json - base, ", \"ab\": 255}");
    expect_bad(json, "#version: 0.2\n", L3D_ERR_FORMAT, "twice");
    snprintf(json + base, sizeof json - base, ", \"ab\": 256");
    expect_bad(json, "#version: 0.2\n", L3D_ERR_FORMAT, "malformed JSON");
    snprintf(json + base, sizeof json - base, ", \"\\u4e2d\": 256}");
    expect_bad(json, "#version: 0.2\n", L3D_ERR_FORMAT, "U+4E2D");
    expect_bad("[1, 2]", "#version: 0.2\n", L3D_ERR_FORMAT, "JSON object");
    expect_bad("{\"a\": 0}", "#version: 0.2\n", L3D_ERR_FORMAT, "byte 0x00");
    expect_bad("", "#version: 0.2\n", L3D_ERR_FORMAT, "JSON object");
}

/* --tokenizer bytes: the 256 byte values as tokens, the identity in both directions (as prepare
 * --tokenizer bytes writes shards), no end-of-text; llm.c's file of it round-trips. */
static void test_bytes_spec(void) {
    struct l3d_tokenizer *t;
    l3d_status st = l3d_tokenizer_open(&t, "bytes");
    if (st != L3D_OK) fprintf(stderr, "%s\n", l3d_error_message());
    CHECK(st == L3D_OK);
    if (st != L3D_OK) return;
    CHECK(l3d_tokenizer_vocab_size(t) == 256);
    CHECK(l3d_tokenizer_eot(t) == -1);
    CHECK(l3d_tokenizer_can_encode(t));
    int diff = 0;
    for (int id = 0; id < 256; id++) {
        size_t n;
        const unsigned char *b = l3d_tokenizer_token(t, id, &n);
        diff += n != 1 || b[0] != id;
    }
    CHECK(diff == 0);
    struct l3d_encoder *e = l3d_encoder_init(t);
    struct l3d_ids ids = {0};
    const char *s = "the cat's h\xc3\xa9\xff\n\n  7";
    l3d_encoder_encode(e, s, strlen(s), &ids);
    diff = ids.n != (int64_t)strlen(s);
    for (int64_t i = 0; !diff && i < ids.n; i++) diff += ids.v[i] != (unsigned char)s[i];
    CHECK(diff == 0);
    l3d_ids_free(&ids);
    l3d_encoder_free(e);

    char path[8192];
    snprintf(path, sizeof path, "%s/bytes_tokenizer.bin", tmp_dir);
    CHECK(l3d_tokenizer_save_llmc(t, path) == L3D_OK);
    struct l3d_tokenizer *u;
    CHECK(l3d_tokenizer_open(&u, path) == L3D_OK);
    CHECK(l3d_tokenizer_vocab_size(u) == 256 && l3d_tokenizer_eot(u) == -1);
    diff = 0;
    for (int id = 0; id < 256; id++) {
        size_t n;
        const unsigned char *b = l3d_tokenizer_token(u, id, &n);
        diff += n != 1 || b[0] != id;
    }
    CHECK(diff == 0);
    l3d_tokenizer_free(u);
    l3d_tokenizer_free(t);
}

int main(void) {
    test_dirs(__FILE__, "data", data_dir, sizeof data_dir, "test_tokenizer", tmp_dir,
              sizeof tmp_dir);
    char gpt2[8192];
    snprintf(gpt2, sizeof gpt2, "%s/gpt2", data_dir);
    struct l3d_tokenizer *t;
    l3d_status st = l3d_tokenizer_load(&t, gpt2);
    if (st != L3D_OK) fprintf(stderr, "%s\n", l3d_error_message());
    CHECK(st == L3D_OK);
    if (st != L3D_OK) return TEST_REPORT();
    CHECK(l3d_tokenizer_vocab_size(t) == 50257);
    CHECK(l3d_tokenizer_eot(t) == 50256);
    test_vectors(t, "gpt2_vectors.tsv", 400);
    test_vectors(t, "gpt2_vectors_unicode.tsv", 12);
    test_whitespace_choice(t);
    test_round_trip(t);
    test_llmc_file(t);
    test_errors();
    test_bytes_spec();
    l3d_tokenizer_free(t);
    CHECK(test_rm_rf(tmp_dir));
    return TEST_REPORT();
}
