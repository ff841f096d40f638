/* tiktoken rank files and tokenizer.json: the reference encoder's ids for cl100k_base, o200k_base
 * and Llama 3 (tests/data/tiktoken_NAME.tsv, written by scripts/tiktoken_vectors.js with the npm
 * package tiktoken, special tokens as text and allowed), a perturbed id caught, round trips,
 * decoding of tokens that end inside a character, and errors of malformed rank files. The rank
 * files are those `bash scripts/setup.sh --tokenizers` installs (make test runs it). */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "llm3d/tokenizer.h"
#include "support/tokvec.h"
#include "test.h"
#include "tokenizer/tokenizer-impl.h"

static char data_dir[4096], tmp_dir[4096];

static int hexval(int c) { return c <= '9' ? c - '0' : c - 'a' + 10; }

/* Every vector of file: the same ids; decoding gives the text back (valid UTF-8 or not; its NFC
 * for a tokenizer that normalizes); and the first vector with ids, one id perturbed, no longer
 * compares equal. Returns the case count. */
static int test_vectors(const struct l3d_tokenizer *t, const char *file) {
    char path[8400];
    snprintf(path, sizeof path, "%s/%s", data_dir, file);
    FILE *fp = fopen(file[0] == '/' ? file : path, "r"); /* a name under tests/data, or a path */
    CHECK(fp != NULL);
    if (!fp) return 0;
    struct l3d_encoder *e = l3d_encoder_init(t);
    struct l3d_nfc nfc = {0};
    static char line[1 << 17];
    static unsigned char text[1 << 16];
    int cases = 0, bad = 0, perturbed = 0;
    char *dec = NULL, mode;
    size_t cap = 0, n;
    while (fgets(line, sizeof line, fp)) {
        struct l3d_ids want = {0}, got = {0};
        bool ok = tokvec_parse_line(line, text, &n, &mode, &want);
        CHECK(ok && (mode == 'o' || mode == 's'));
        if (!ok) break;
        if (mode == 's') l3d_encoder_encode_special(e, (const char *)text, n, &got);
        else l3d_encoder_encode(e, (const char *)text, n, &got);
        bool same = tokvec_same(&got, &want);
        if (!same && bad++ < 5) {
            fprintf(stderr, "%s: mismatch (%c) on \"%.*s\": got", file, mode, (int)n, text);
            for (int64_t i = 0; i < got.n; i++) fprintf(stderr, " %d", got.v[i]);
            fprintf(stderr, ", want");
            for (int64_t i = 0; i < want.n; i++) fprintf(stderr, " %d", want.v[i]);
            fprintf(stderr, "\n");
        }
        CHECK(same);
        if (same && !perturbed && want.n > 0) { /* the negative case: the comparison can fail */
            want.v[want.n / 2] ^= 1;
            CHECK(!tokvec_same(&got, &want));
            perturbed = 1;
        }
        size_t m = l3d_tokenizer_decode(t, got.v, got.n, &dec, &cap), nn = n;
        const char *back = t->nfc ? l3d_tok_nfc(&nfc, (const char *)text, n, &nn) : (char *)text;
        CHECK(m == nn && (nn == 0 || memcmp(dec, back, nn) == 0));
        l3d_ids_free(&want);
        l3d_ids_free(&got);
        cases++;
    }
    fclose(fp);
    free(dec);
    l3d_nfc_free(&nfc);
    l3d_encoder_free(e);
    fprintf(stderr, "%s: %d reference vectors, %d mismatches\n", file, cases, bad);
    CHECK(perturbed == 1);
    return cases;
}

/* Decoding token by token, each token's bytes alone, gives back text whose characters cross token
 * boundaries (bytes, not characters, are what tokens hold). */
static void test_split_characters(const struct l3d_tokenizer *t) {
    const char *s = "\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa9 \xe3\x81\x82\xe6\xbc\xa2\xe5\xad\x97";
    struct l3d_encoder *e = l3d_encoder_init(t);
    struct l3d_ids ids = {0};
    l3d_encoder_encode(e, s, strlen(s), &ids);
    char out[256];
    size_t o = 0, partial = 0;
    for (int64_t i = 0; i < ids.n; i++) {
        size_t len;
        const unsigned char *b = l3d_tokenizer_token(t, ids.v[i], &len);
        partial += o + len < strlen(s) && (s[o + len] & 0xC0) == 0x80; /* next byte continues */
        memcpy(out + o, b, len);
        o += len;
    }
    CHECK(o == strlen(s) && memcmp(out, s, o) == 0);
    CHECK(partial > 0); /* some token ends inside a character: the case this covers */
    l3d_ids_free(&ids);
    l3d_encoder_free(e);
}

static void expect_error(const char *name, const char *body, const char *want) {
    char path[8300];
    snprintf(path, sizeof path, "%s/%s", tmp_dir, name);
    FILE *fp = fopen(path, "w");
    L3D_ASSERT(fp != NULL);
    fputs(body, fp);
    fclose(fp);
    struct l3d_tokenizer *t = NULL;
    l3d_status st = l3d_tokenizer_open(&t, path);
    CHECK(st != L3D_OK && t == NULL);
    bool named = st != L3D_OK && strstr(l3d_error_message(), want) != NULL;
    if (!named) fprintf(stderr, "%s: got \"%s\", want \"%s\"\n", name, l3d_error_message(), want);
    CHECK(named);
}

static void test_errors(void) {
    expect_error("bad_base64.tiktoken", "IQ== 0\nI@== 1\n", "line 2 is not \"base64-token rank\"");
    expect_error("twice.tiktoken", "IQ== 0\nIQ== 0\n", "lines 1 and 2: rank 0 is given twice");
    expect_error("twice2.tiktoken", "IQ== 1\nIg== 0\n\nIw== 1\n",
                 "lines 1 and 4: rank 1 is given twice");
    /* the same token bytes with two ranks (tiktoken refuses them), whichever line comes first */
    expect_error("same.tiktoken", "IQ== 0\nIg== 1\nIQ== 2\n",
                 "same.tiktoken lines 1 (rank 0) and 3 (rank 2) hold the same token (1 bytes)");
    expect_error("same2.tiktoken", "IQ== 2\nIg== 1\n\r\nIQ== 0\n",
                 "same2.tiktoken lines 1 (rank 2) and 4 (rank 0) hold the same token (1 bytes)");
    expect_error("same3.tiktoken", "YWJj 0\nYQ== 1\nYWJj 2\n", "(rank 0) and 3 (rank 2) hold the "
                 "same token (3 bytes)");
    expect_error("gap.tiktoken", "IQ== 0\nIg== 3\nIw== 2\n\n", "rank 1 is missing");
    expect_error("few.tiktoken", "IQ== 0\nIg== 1\n", "holds 2 ranks");
    expect_error("norank.tiktoken", "IQ==\n", "line 1 is not");
}

static char *slurp(const char *path, size_t *n);

/* cl100k_base's rank file with its last line's token replaced by its first's: the rank count
 * of a known encoding, every rank once, one token twice (it was read as a vocabulary). */
static void test_duplicate_token(void) {
    char base[4000], path[4200];
    size_t n;
    l3d_tokenizer_cache_dir(base, sizeof base);
    snprintf(path, sizeof path, "%s/tiktoken/cl100k_base.tiktoken", base);
    char *txt = slurp(path, &n);
    char *last = txt + n - 1;
    while (last > txt && last[-1] != '\n') last--; /* txt ends in "\n" */
    size_t first_len = strcspn(txt, " "), last_len = strcspn(last, " ");
    CHECK(strncmp(last + last_len, " 100255\n", 8) == 0);
    FILE *fp;
    snprintf(path, sizeof path, "%s/dup.tiktoken", tmp_dir);
    L3D_ASSERT((fp = fopen(path, "w")) != NULL);
    fwrite(txt, 1, (size_t)(last - txt), fp);
    fwrite(txt, 1, first_len, fp);
    fputs(" 100255\n", fp);
    fclose(fp);
    free(txt);
    struct l3d_tokenizer *t = NULL;
    CHECK(l3d_tokenizer_open(&t, path) != L3D_OK && t == NULL);
    bool named = strstr(l3d_error_message(), "dup.tiktoken lines 1 (rank 0) and 100256 (rank "
                        "100255) hold the same token (1 bytes)") != NULL;
    if (!named) fprintf(stderr, "dup.tiktoken: got \"%s\"\n", l3d_error_message());
    CHECK(named);
    l3d_tokenizer_free(t);
}

static char *slurp(const char *path, size_t *n) {
    FILE *fp = fopen(path, "rb");
    L3D_ASSERT(fp != NULL);
    fseek(fp, 0, SEEK_END);
    *n = (size_t)ftell(fp);
    rewind(fp);
    char *b = malloc(*n + 1);
    L3D_ASSERT(fread(b, 1, *n, fp) == *n);
    b[*n] = '\0';
    fclose(fp);
    return b;
}

/* Writes tmp_dir/NAME/tokenizer.json: GPT-2's vocabulary and merges (tests/data/gpt2) as the
 * `tokenizers` library serialises them, with the given normalizer, pre_tokenizer and model type. */
static void write_hf(const char *name, const char *normalizer, const char *pre, const char *model) {
    char path[8400];
    snprintf(path, sizeof path, "%s/%s", tmp_dir, name);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/gpt2/encoder.json", data_dir);
    size_t nv, nm;
    char *vocab = slurp(path, &nv);
    snprintf(path, sizeof path, "%s/gpt2/vocab.bpe", data_dir);
    char *merges = slurp(path, &nm);
    snprintf(path, sizeof path, "%s/%s/tokenizer.json", tmp_dir, name);
    FILE *fp = fopen(path, "w");
    L3D_ASSERT(fp != NULL);
    fprintf(fp, "{\"version\": \"1.0\", \"added_tokens\": [{\"id\": 50256, \"content\": "
            "\"<|endoftext|>\", \"special\": true}], \"normalizer\": %s, \"pre_tokenizer\": %s, "
            "\"post_processor\": null, \"decoder\": {\"type\": \"ByteLevel\"}, \"model\": "
            "{\"type\": \"%s\", \"ignore_merges\": false, \"vocab\": %s, \"merges\": [",
            normalizer, pre, model, vocab);
    char *line = strchr(merges, '\n') + 1; /* past "#version" */
    for (bool first = true; *line; first = false) {
        char *end = strchr(line, '\n');
        if (!end || end == line) break;
        fputs(first ? "\"" : ", \"", fp);
        for (char *c = line; c < end; c++) {
            if (*c == '"' || *c == '\\') fputc('\\', fp);
            fputc(*c, fp);
        }
        fputc('"', fp);
        line = end + 1;
    }
    fputs("]}}\n", fp);
    fclose(fp);
    free(vocab);
    free(merges);
}

/* tokenizer.json: GPT-2's written as a ByteLevel BPE, and as a Split + ByteLevel(use_regex false)
 * with GPT-2's pattern, encode every GPT-2 reference vector (tests/data/gpt2_vectors.tsv, of
 * gpt-3-encoder) exactly; a special token allowed is its id; refused features are named. */
static void test_hf(void) {
    static const char *pre[] = {
        "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true}",
        "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": "
        "{\"Regex\": \"'s|'t|'re|'ve|'m|'ll|'d| ?\\\\p{L}+| ?\\\\p{N}+| ?[^\\\\s\\\\p{L}\\\\p{N}]+|"
        "\\\\s+(?!\\\\S)|\\\\s+\"}, \"behavior\": \"Isolated\", \"invert\": false}, {\"type\": "
        "\"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}]}",
    };
    for (int k = 0; k < 2; k++) {
        char dir[8400];
        write_hf(k ? "hf_split" : "hf_bytelevel", "null", pre[k], "BPE");
        snprintf(dir, sizeof dir, "%s/%s", tmp_dir, k ? "hf_split" : "hf_bytelevel");
        struct l3d_tokenizer *t;
        l3d_status st = l3d_tokenizer_open(&t, dir);
        if (st != L3D_OK) fprintf(stderr, "%s\n", l3d_error_message());
        CHECK(st == L3D_OK);
        if (st != L3D_OK) continue;
        CHECK(l3d_tokenizer_vocab_size(t) == 50257 && l3d_tokenizer_eot(t) == 50256);
        char path[8400];
        snprintf(path, sizeof path, "%s/gpt2_vectors.tsv", data_dir);
        FILE *in = fopen(path, "r"), *out;
        static char line[1 << 17];
        char tsv[8400];
        snprintf(tsv, sizeof tsv, "%s/hf.tsv", tmp_dir);
        out = fopen(tsv, "w");
        L3D_ASSERT(in && out);
        while (fgets(line, sizeof line, in)) fprintf(out, "o\t%s", line); /* as ordinary cases */
        fclose(in);
        fclose(out);
        CHECK(test_vectors(t, tsv) >= 400);
        struct l3d_encoder *e = l3d_encoder_init(t);
        struct l3d_ids ids = {0};
        l3d_encoder_encode_special(e, "a<|endoftext|>b", 15, &ids);
        CHECK(ids.n == 3 && ids.v[1] == 50256);
        l3d_ids_free(&ids);
        l3d_encoder_free(e);
        l3d_tokenizer_free(t);
    }
    static const struct {
        const char *norm, *pre, *model, *want;
    } bad[] = {
        {"{\"type\": \"NFKC\"}", NULL, "BPE", "the normalizer NFKC is not supported"},
        {"{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFC\"}]}", NULL, "BPE",
         "the normalizer Sequence is not supported"},
        {"null", NULL, "WordPiece", "the model WordPiece is not supported"},
        {"null", NULL, "Unigram", "the model Unigram is not supported"},
        {"null", "{\"type\": \"Whitespace\"}", "BPE", "the pre_tokenizer Whitespace is not supported"},
        {"null", "{\"type\": \"ByteLevel\", \"add_prefix_space\": true}", "BPE", "add_prefix_space"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char dir[8400];
        write_hf("hf_bad", bad[i].norm, bad[i].pre ? bad[i].pre : pre[0], bad[i].model);
        snprintf(dir, sizeof dir, "%s/hf_bad", tmp_dir);
        struct l3d_tokenizer *t = NULL;
        CHECK(l3d_tokenizer_open(&t, dir) != L3D_OK && t == NULL);
        bool named = strstr(l3d_error_message(), bad[i].want) != NULL;
        if (!named) fprintf(stderr, "got \"%s\", want \"%s\"\n", l3d_error_message(), bad[i].want);
        CHECK(named);
    }
}

static size_t unhex(const char *h, size_t len, char *out) {
    for (size_t i = 0; i + 1 < len; i += 2) out[i / 2] = (char)(hexval(h[i]) * 16 + hexval(h[i + 1]));
    return len / 2;
}

/* NFC (src/tokenizer/normalize.c) against node's String.prototype.normalize on every code point
 * with a decomposition or a combining class and random strings of marks (tests/data/
 * nfc_vectors.tsv, scripts/hf_vectors.js); an output perturbed no longer compares equal; invalid
 * UTF-8 composes with nothing and stays. */
static void test_nfc(void) {
    char path[8400], line[1024], in[512], want[512];
    snprintf(path, sizeof path, "%s/nfc_vectors.tsv", data_dir);
    FILE *fp = fopen(path, "r");
    CHECK(fp != NULL);
    struct l3d_nfc s = {0};
    int cases = 0, bad = 0;
    while (fp && fgets(line, sizeof line, fp)) {
        char *tab = strchr(line, '\t'), *end = line + strcspn(line, "\n");
        CHECK(tab != NULL);
        if (!tab) break;
        size_t n = unhex(line, (size_t)(tab - line), in), nw = unhex(tab + 1, (size_t)(end - tab - 1), want), m;
        const char *got = l3d_tok_nfc(&s, in, n, &m);
        bool same = m == nw && memcmp(got, want, m) == 0;
        if (!same && bad++ < 5) fprintf(stderr, "nfc mismatch on %.*s\n", (int)(tab - line), line);
        CHECK(same);
        if (cases++ == 0 && nw > 0) {
            want[nw - 1] ^= 1;
            CHECK(!(m == nw && memcmp(got, want, m) == 0));
        }
    }
    if (fp) fclose(fp);
    fprintf(stderr, "nfc_vectors.tsv: %d cases, %d mismatches\n", cases, bad);
    CHECK(cases > 10000);
    static const struct {
        const char *in, *want;
    } inv[] = {
        {"e\xff\xcc\x81", "e\xff\xcc\x81"}, /* an invalid byte blocks: the mark stays alone */
        {"e\xcc\x81\xff", "\xc3\xa9\xff"},
        {"\xcc\x81\xed\xa0\x80" "e\xcc\x81", "\xcc\x81\xed\xa0\x80\xc3\xa9"}, /* a surrogate */
    };
    for (size_t i = 0; i < sizeof inv / sizeof *inv; i++) {
        size_t m;
        const char *got = l3d_tok_nfc(&s, inv[i].in, strlen(inv[i].in), &m);
        CHECK(m == strlen(inv[i].want) && memcmp(got, inv[i].want, m) == 0);
    }
    l3d_nfc_free(&s);
}

/* tokenizer.json against @huggingface/tokenizers (tests/data/hf_NAME.tsv, scripts/hf_vectors.js):
 * GPT-2's as written by write_hf, Meta's Llama 3 and Qwen3's (Qwen2's vocabulary, pattern and NFC)
 * as `bash scripts/setup.sh --tokenizers` installs them. */
static void test_hf_oracle(void) {
    static const struct {
        const char *name;
        int V, eot;
    } hf[] = {{"gpt2", 50257, 50256}, {"llama3", 128256, 128001}, {"qwen3", 151669, 151643}};
    for (size_t i = 0; i < sizeof hf / sizeof *hf; i++) {
        char dir[8400], base[4000], tsv[64];
        l3d_tokenizer_cache_dir(base, sizeof base);
        if (i == 0) {
            write_hf("hf_gpt2", "null", "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
                     "\"use_regex\": true}", "BPE");
            snprintf(dir, sizeof dir, "%s/hf_gpt2", tmp_dir);
        } else {
            snprintf(dir, sizeof dir, "%s/hf/%s", base, hf[i].name);
        }
        struct l3d_tokenizer *t;
        l3d_status st = l3d_tokenizer_open(&t, dir);
        if (st != L3D_OK) fprintf(stderr, "%s\n", l3d_error_message());
        CHECK(st == L3D_OK);
        if (st != L3D_OK) continue;
        CHECK(l3d_tokenizer_vocab_size(t) == hf[i].V && l3d_tokenizer_eot(t) == hf[i].eot);
        CHECK(t->nfc == (i == 2));
        snprintf(tsv, sizeof tsv, "hf_%s.tsv", hf[i].name);
        CHECK(test_vectors(t, tsv) >= 2000);
        l3d_tokenizer_free(t);
    }
}

int main(void) {
    test_dirs(__FILE__, "data", data_dir, sizeof data_dir, "test_tiktoken", tmp_dir,
              sizeof tmp_dir);
    static const struct {
        const char *name;
        int V, eot, bot;
    } enc[] = {
        {"cl100k_base", 100277, 100257, -1},
        {"o200k_base", 200019, 199999, -1},
        {"llama3", 128256, 128001, 128000},
    };
    for (size_t i = 0; i < sizeof enc / sizeof *enc; i++) {
        struct l3d_tokenizer *t;
        l3d_status st = l3d_tokenizer_open(&t, enc[i].name);
        if (st != L3D_OK) fprintf(stderr, "%s\n", l3d_error_message());
        CHECK(st == L3D_OK);
        if (st != L3D_OK) continue;
        CHECK(l3d_tokenizer_vocab_size(t) == enc[i].V);
        CHECK(l3d_tokenizer_eot(t) == enc[i].eot && l3d_tokenizer_bot(t) == enc[i].bot);
        char tsv[256];
        snprintf(tsv, sizeof tsv, "tiktoken_%s.tsv", enc[i].name);
        CHECK(test_vectors(t, tsv) >= 2000);
        test_split_characters(t);
        l3d_tokenizer_free(t);
    }
    test_errors();
    test_duplicate_token();
    test_hf();
    test_nfc();
    test_hf_oracle();
    CHECK(test_rm_rf(tmp_dir));
    return TEST_REPORT();
}
