/* tokenizer.json in small documents written here (src/tokenizer/hf.c, pattern.c): the 256 byte
 * tokens, the merge "a a" and the members a case changes. The pre-tokenisation patterns' classes
 * (\P{X} and \S, alone and in brackets) split as the regex crate would; every option llm3d reads
 * has its default when absent and is refused, named, where its value is one llm3d cannot honour;
 * patterns that can match the empty string are refused when read, and an empty match or a PCRE2
 * error while encoding is an error naming the pattern and the position, not an abort. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "llm3d/data.h"
#include "llm3d/tokenizer.h"
#include "test.h"
#include "tokenizer/tokenizer-impl.h"

/* The members of a document: NULL is the default below, "-" leaves the member out. */
struct doc {
    const char *added, *normalizer, *pre, *decoder, *type, *model, *merges, *top;
    const char *whole_model; /* the "model" value in place of the one built (a key once only) */
};

#define SPLIT(re) \
    "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": " \
    "\"" re "\"}, \"behavior\": \"Isolated\", \"invert\": false}, {\"type\": \"ByteLevel\", "    \
    "\"add_prefix_space\": false, \"trim_offsets\": true, \"use_regex\": false}]}"

static void member(FILE *fp, const char *key, const char *v, const char *def) {
    if (v && strcmp(v, "-") == 0) return;
    fprintf(fp, "\"%s\": %s, ", key, v ? v : def);
}

/* The document d as text (free it). The vocabulary: the 256 bytes spelled by bytes_to_unicode in
 * GPT-2's order (id of 'a' is 64), "aa" 256, "<|endoftext|>" 257 as an added token, "aaa" 258
 * (no merge makes it: a pre-token "aaa" is 258 only with ignore_merges). */
static char *write_doc(const struct doc *d, size_t *n) {
    char *s = NULL;
    FILE *fp = open_memstream(&s, n);
    int byte_cp[256], order[256];
    l3d_bytes_to_unicode(byte_cp, order);
    fputs("{", fp);
    if (d->top) fprintf(fp, "%s, ", d->top);
    member(fp, "added_tokens", d->added, "[{\"id\": 257, \"content\": \"<|endoftext|>\", "
           "\"single_word\": false, \"lstrip\": false, \"rstrip\": false, \"normalized\": false, "
           "\"special\": true}]");
    member(fp, "normalizer", d->normalizer, "null");
    member(fp, "pre_tokenizer", d->pre, "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
           "\"trim_offsets\": true, \"use_regex\": true}");
    member(fp, "decoder", d->decoder, "{\"type\": \"ByteLevel\", \"add_prefix_space\": true, "
           "\"trim_offsets\": true, \"use_regex\": true}");
    if (d->whole_model) {
        fprintf(fp, "\"model\": %s}", d->whole_model);
        fclose(fp);
        return s;
    }
    fputs("\"model\": {", fp);
    member(fp, "type", d->type, "\"BPE\"");
    if (d->model) fprintf(fp, "%s, ", d->model);
    fputs("\"vocab\": {", fp);
    for (int i = 0; i < 256; i++) {
        unsigned char b = (unsigned char)order[i];
        fputs(i ? ", \"" : "\"", fp);
        l3d_tok_write_spelled(fp, &b, 1, byte_cp, true);
        fprintf(fp, "\": %d", i);
    }
    fputs(", \"aa\": 256, \"aaa\": 258}", fp);
    if (!d->merges || strcmp(d->merges, "-") != 0)
        fprintf(fp, ", \"merges\": %s", d->merges ? d->merges : "[\"a a\"]");
    fputs("}}", fp);
    fclose(fp);
    return s;
}

/* Reads d: the status, the tokenizer in *out when OK (else freed). */
static l3d_status read_doc(const struct doc *d, struct l3d_tokenizer **out) {
    size_t n;
    char *js = write_doc(d, &n);
    struct l3d_tokenizer *t = l3d_tok_new();
    l3d_status st = l3d_tok_parse_hf(t, "tok.json", js, n);
    free(js);
    if (st != L3D_OK || !out) l3d_tokenizer_free(t);
    else *out = t;
    return st;
}

/* d is refused with a message holding `want` (and naming the file). */
static void refused(const char *line_name, const struct doc *d, const char *want) {
    l3d_status st = read_doc(d, NULL);
    const char *msg = l3d_error_message();
    bool ok = st == L3D_ERR_FORMAT && strstr(msg, want) != NULL && strstr(msg, "tok.json") != NULL;
    if (!ok) fprintf(stderr, "%s: status %d, got \"%s\", want \"%s\"\n", line_name, (int)st,
                     st != L3D_OK ? msg : "", want);
    CHECK(ok);
}
#define REFUSED(want, ...) refused(#__VA_ARGS__, &(struct doc){__VA_ARGS__}, want)

/* d is read. */
static struct l3d_tokenizer *accepted(const char *line_name, const struct doc *d) {
    struct l3d_tokenizer *t = NULL;
    l3d_status st = read_doc(d, &t);
    if (st != L3D_OK) fprintf(stderr, "%s: refused: %s\n", line_name, l3d_error_message());
    CHECK(st == L3D_OK);
    return t;
}
#define ACCEPTED(...) accepted(#__VA_ARGS__, &(struct doc){__VA_ARGS__})
/* d is read, and the tokenizer dropped */
#define READS(...) l3d_tokenizer_free(accepted(#__VA_ARGS__, &(struct doc){__VA_ARGS__}))

/* The pre-tokens of text, joined by '|'. */
struct joined {
    char s[512];
    size_t n;
};

static void join(void *ctx, const char *s, size_t len) {
    struct joined *j = ctx;
    if (j->n && j->n < sizeof j->s - 1) j->s[j->n++] = '|';
    for (size_t i = 0; i < len && j->n < sizeof j->s - 1; i++) j->s[j->n++] = s[i];
    j->s[j->n] = '\0';
}

/* t (read from `what`; NULL: refused, already counted) cuts text into the pre-tokens want
 * ("a|b|c"); t is freed. */
static void pretokens_are(struct l3d_tokenizer *t, const char *what, const char *text,
                          const char *want) {
    if (!t) return;
    struct l3d_encoder *e = l3d_encoder_init(t);
    struct joined j = {0};
    CHECK(l3d_encoder_pretokenize(e, text, strlen(text), join, &j) == L3D_OK);
    bool same = strcmp(j.s, want) == 0;
    if (!same) fprintf(stderr, "%s: \"%s\" splits as \"%s\", want \"%s\"\n", what, text, j.s,
                       want);
    CHECK(same);
    l3d_encoder_free(e);
    l3d_tokenizer_free(t);
}

/* The Split pattern re cuts text into the pre-tokens want. */
static void splits_as(const char *re_json, const char *text, const char *want) {
    char pre[1024];
    snprintf(pre, sizeof pre, SPLIT("%s"), re_json);
    pretokens_are(accepted(re_json, &(struct doc){.pre = pre}), re_json, text, want);
}

/* \P{X} is the complement of \p{X} (alone, and as an item in brackets, where [^\P{N}] is \p{N});
 * \S in brackets too. Unmatched text is a pre-token of its own, so each pattern is written where
 * reading \P as \p (the defect) splits otherwise. */
static void test_negated_classes(void) {
    splits_as("\\\\P{L}\\\\p{L}+", "ab cd1ef", "ab| cd|1ef");
    splits_as("\\\\P{N}\\\\p{N}+", "12a34 5", "12|a34| 5");
    splits_as("x\\\\P{Lu}+", "xABxcdE", "xAB|xcd|E");
    splits_as("[\\\\P{L}x]+", "ab, cxd!x", "ab|, |c|x|d|!x");
    splits_as("a[^\\\\P{N}]+", "a12ab3a4", "a12|ab3|a4");
    splits_as("[\\\\p{N}\\\\P{L}]+", "ab1 !c", "ab|1 !|c");
    splits_as("[\\\\P{L}\\\\p{L}]+", "a1 \xc3\xa9!", "a1 \xc3\xa9!"); /* every character */
    splits_as("[^\\\\P{L}\\\\p{N}]+", "ab1c!", "ab|1|c|!");        /* letters only */
    splits_as("[^\\\\S\\\\n]+", "a \t\nb", "a| \t|\nb");
    splits_as("[\\\\S]+", "ab  c", "ab|  |c");
    splits_as("\\\\P{M}\\\\p{M}*", "e\xcc\x81" "a", "e\xcc\x81|a");
    /* a letter outside ASCII and one of Unicode 17 (U+11F04 KAWI LETTER A) */
    splits_as("\\\\P{L}+", "\xc3\xa9" "1\xf0\x91\xbc\x84-", "\xc3\xa9|1|\xf0\x91\xbc\x84|-");
    REFUSED("the pattern's class \\P{Greek} at offset 0", .pre = SPLIT("\\\\P{Greek}"));
}

/* Patterns that can match the empty string are refused when read: PCRE2's minimum length of the
 * pattern without its lookarounds ((?=a) alone has 1, counting the character it looks at). */
static void test_empty_match_refused(void) {
    static const char *const empty[] = {
        "a*", "x?", "", "(?=a)", "(?!a)", "(?<=a)", "a|", "|a", "\\\\s*", "a|(?=b)",
        "(?:\\\\s+(?!\\\\S))?", "\\\\b", "[a-z]{0,3}",
    };
    for (size_t i = 0; i < sizeof empty / sizeof *empty; i++) {
        char pre[512];
        snprintf(pre, sizeof pre, SPLIT("%s"), empty[i]);
        refused(empty[i], &(struct doc){.pre = pre}, "can match the empty string");
    }
    REFUSED("the pre-tokenisation pattern \"a*\" can match the empty string",
            .pre = SPLIT("a*"));
    /* a lookaround beside characters consumed is fine */
    splits_as("(?=ab)a", "aab", "a|a|b");
    splits_as("(?<=a)b|a", "abb", "a|b|b");
    splits_as("\\\\s+(?!\\\\S)|\\\\s+", "a   b", "a|  | |b");
    splits_as("[(?=]+", "a(?=b", "a|(?=|b"); /* no lookaround inside brackets */
}

/* An empty match while encoding (through \K, which PCRE2's minimum length does not see) and a
 * PCRE2 error (its match limit) are errors naming the file, the pattern and the byte; encode,
 * encode_special (positions in the whole text) and pretokenize alike. */
static void test_match_errors(void) {
    struct l3d_tokenizer *t = ACCEPTED(.pre = SPLIT("a\\\\K"));
    if (t) {
        struct l3d_encoder *e = l3d_encoder_init(t);
        struct l3d_ids ids = {0};
        CHECK(l3d_encoder_encode(e, "baab", 4, &ids) == L3D_ERR_FORMAT);
        const char *msg = l3d_error_message();
        CHECK(strstr(msg, "tok.json: the pre-tokenisation pattern \"a\\K\" matched the empty "
                     "string at byte 2 of the text") != NULL);
        CHECK(l3d_encoder_encode(e, "bbb", 3, &ids) == L3D_OK); /* no match: fine */
        ids.n = 0;
        CHECK(l3d_encoder_encode_special(e, "b<|endoftext|>ba", 16, &ids) == L3D_ERR_FORMAT);
        CHECK(strstr(l3d_error_message(), "at byte 16 of the text") != NULL);
        CHECK(ids.n == 2 && ids.v[1] == 257); /* the ids before it */
        struct joined j = {0};
        CHECK(l3d_encoder_pretokenize(e, "xa", 2, join, &j) == L3D_ERR_FORMAT);
        l3d_ids_free(&ids);
        l3d_encoder_free(e);
        l3d_tokenizer_free(t);
    }
    t = ACCEPTED(.pre = SPLIT("(a+)+$"));
    if (t) {
        struct l3d_encoder *e = l3d_encoder_init(t);
        struct l3d_ids ids = {0};
        char text[64];
        memset(text, 'a', 40);
        memcpy(text + 40, "b", 2);
        CHECK(l3d_encoder_encode(e, "aab aa", 6, &ids) == L3D_OK);
        CHECK(l3d_encoder_encode(e, text, 41, &ids) == L3D_ERR_FORMAT);
        CHECK(strstr(l3d_error_message(), "tok.json: matching the pre-tokenisation pattern "
                     "\"(a+)+$\" from byte 0 of the text failed: match limit exceeded") != NULL);
        l3d_ids_free(&ids);
        l3d_encoder_free(e);
        l3d_tokenizer_free(t);
    }
}

/* prepare says the same, naming the input and the piece, rather than aborting. */
static void test_prepare_match_error(void) {
    char dir[64], in[96], out[96];
    snprintf(dir, sizeof dir, "/tmp/l3d_test_tokenizer_json_%d", (int)getpid());
    snprintf(in, sizeof in, "%s/in.txt", dir);
    snprintf(out, sizeof out, "%s/out", dir);
    CHECK(mkdir(dir, 0755) == 0);
    FILE *fp = fopen(in, "w");
    L3D_ASSERT(fp != NULL);
    fputs("bbb\n%\nxa\n", fp);
    fclose(fp);
    struct l3d_tokenizer *t = ACCEPTED(.pre = SPLIT("a\\\\K"));
    char *files[] = {in};
    if (t) {
        CHECK(l3d_prepare_bpe(out, files, 1, 0, 1000, t, "%", -1, false, NULL) == L3D_ERR_FORMAT);
        const char *msg = l3d_error_message();
        bool named = strstr(msg, "in.txt, the piece of text from byte 6: tok.json: the pre-"
                            "tokenisation pattern \"a\\K\" matched the empty string at byte 2");
        if (!named) fprintf(stderr, "prepare: %s\n", msg);
        CHECK(named);
        l3d_tokenizer_free(t);
    }
    CHECK(test_rm_rf(dir));
}

/* The ids of text (its first 16) under t, as "id id ..." */
static bool encodes_as(const struct l3d_tokenizer *t, const char *text, const char *want) {
    struct l3d_encoder *e = l3d_encoder_init(t);
    struct l3d_ids ids = {0};
    char got[256] = "";
    size_t n = 0;
    CHECK(l3d_encoder_encode(e, text, strlen(text), &ids) == L3D_OK);
    for (int64_t i = 0; i < ids.n && i < 16; i++)
        n += (size_t)snprintf(got + n, sizeof got - n, i ? " %d" : "%d", ids.v[i]);
    bool same = strcmp(got, want) == 0;
    if (!same) fprintf(stderr, "\"%s\" encodes as \"%s\", want \"%s\"\n", text, got, want);
    l3d_ids_free(&ids);
    l3d_encoder_free(e);
    return same;
}

/* merges: a list of "a b" strings or of ["a", "b"] pairs (both forms of the `tokenizers`
 * library, merging "aa" to 256); any other value, or none, is refused. */
static void test_merges(void) {
    static const char *const forms[] = {"[\"a a\"]", "[[\"a\", \"a\"]]"};
    for (int k = 0; k < 2; k++) {
        struct l3d_tokenizer *t = accepted(forms[k], &(struct doc){.merges = forms[k]});
        if (t) CHECK(encodes_as(t, "aab", "256 65"));
        l3d_tokenizer_free(t);
    }
    struct l3d_tokenizer *t = ACCEPTED(.merges = "[]");
    if (t) CHECK(encodes_as(t, "aab", "64 64 65"));
    l3d_tokenizer_free(t);
    REFUSED("tok.json: the BPE model's merges is an object, not a list", .merges = "{\"a a\": 0}");
    REFUSED("the BPE model's merges is a string, not a list", .merges = "\"a a\"");
    REFUSED("the BPE model's merges is a number, not a list", .merges = "1");
    REFUSED("the BPE model's merges is null, not a list", .merges = "null");
    REFUSED("the BPE model's merges is missing, not a list", .merges = "-");
    REFUSED("merge 0 is not a pair", .merges = "[[\"a\", 5]]");
    REFUSED("merge 0 is not a pair", .merges = "[[1, 1]]");
    REFUSED("merge 1 is not a pair", .merges = "[\"a a\", \"a a a\"]");
    REFUSED("merge 0 is not a pair", .merges = "[[\"a\", \"a\", \"a\"]]");
    REFUSED("merge 0 is not a pair", .merges = "[\"aa\"]");
    REFUSED("merge 0 is not a pair", .merges = "[\"a b\"]"); /* "ab" is no token */
}

/* The pre-tokens of text under d are want. */
static void doc_splits(const char *line_name, const struct doc *d, const char *text,
                       const char *want) {
    pretokens_are(accepted(line_name, d), line_name, text, want);
}
#define SPLITS(text, want, ...) doc_splits(#__VA_ARGS__, &(struct doc){__VA_ARGS__}, text, want)

/* The ids of text under d are want. */
static void doc_encodes(const char *line_name, const struct doc *d, const char *text,
                        const char *want) {
    struct l3d_tokenizer *t = accepted(line_name, d);
    if (t) CHECK(encodes_as(t, text, want));
    l3d_tokenizer_free(t);
}
#define ENCODES(text, want, ...) doc_encodes(#__VA_ARGS__, &(struct doc){__VA_ARGS__}, text, want)

/* The model's keys: type, ignore_merges, byte_fallback, dropout, continuing_subword_prefix,
 * end_of_word_suffix; each one's default when absent (or null) and its refusal. */
static void test_model_options(void) {
    ENCODES("aaa", "256 64");                            /* every default */
    ENCODES("aaa", "256 64", .type = "-");               /* no type: BPE, as the library reads it */
    REFUSED("tok.json: the model (no type) is not supported", .type = "-", .merges = "-");
    REFUSED("the model WordPiece is not supported", .type = "\"WordPiece\"");
    REFUSED("the model Unigram is not supported", .type = "\"Unigram\"");
    REFUSED("the model (none) is not supported", .whole_model = "null");
    ENCODES("aaa", "258", .model = "\"ignore_merges\": true");
    ENCODES("aaa", "256 64", .model = "\"ignore_merges\": false");
    ENCODES("aaa", "256 64", .model = "\"ignore_merges\": null");
    REFUSED("the BPE model's ignore_merges is a string, not true or false",
            .model = "\"ignore_merges\": \"true\"");
    READS(.model = "\"byte_fallback\": false");
    REFUSED("the BPE model's byte_fallback is true, which llm3d does not support: it reads "
            "byte_fallback false only", .model = "\"byte_fallback\": true");
    REFUSED("the BPE model's byte_fallback is a number, not true or false",
            .model = "\"byte_fallback\": 1");
    ENCODES("aaa", "256 64", .model = "\"dropout\": null");
    ENCODES("aaa", "256 64", .model = "\"dropout\": 0");
    REFUSED("the BPE model's dropout is 0.1: llm3d merges without dropout",
            .model = "\"dropout\": 0.1");
    REFUSED("the BPE model's dropout is a string", .model = "\"dropout\": \"0\"");
    READS(.model = "\"continuing_subword_prefix\": null, \"end_of_word_suffix\": null");
    READS(.model = "\"continuing_subword_prefix\": \"\", \"end_of_word_suffix\": \"\"");
    REFUSED("the BPE model's continuing_subword_prefix is \"##\"",
            .model = "\"continuing_subword_prefix\": \"##\"");
    REFUSED("the BPE model's end_of_word_suffix is \"</w>\"",
            .model = "\"end_of_word_suffix\": \"</w>\"");
    REFUSED("the BPE model's end_of_word_suffix is a boolean",
            .model = "\"end_of_word_suffix\": false");
    READS(.model = "\"unk_token\": \"<unk>\", \"fuse_unk\": true"); /* never used */
    REFUSED("the BPE model has no vocab object",
            .whole_model = "{\"type\": \"BPE\", \"merges\": []}");
}

/* The pre-tokenizer's keys: ByteLevel's use_regex (true), add_prefix_space (false),
 * trim_offsets; Split's pattern, behavior, invert (false); and the shapes llm3d reads. */
static void test_pre_tokenizer_options(void) {
    static const char *const bl = "{\"type\": \"ByteLevel\"}";
    SPLITS("ab cd1", "ab| cd|1", .pre = bl); /* use_regex absent: GPT-2's pattern */
    SPLITS("ab cd1", "ab| cd|1", .pre = "{\"type\": \"ByteLevel\", \"use_regex\": true}");
    SPLITS("ab", "ab", .pre = "{\"type\": \"ByteLevel\", \"add_prefix_space\": false}");
    REFUSED("a ByteLevel pre-tokenizer alone with use_regex false (the whole text one pre-token) "
            "is not supported", .pre = "{\"type\": \"ByteLevel\", \"use_regex\": false}");
    REFUSED("the ByteLevel pre-tokenizer's use_regex is a string, not true or false",
            .pre = "{\"type\": \"ByteLevel\", \"use_regex\": \"no\"}");
    REFUSED("the ByteLevel pre-tokenizer's add_prefix_space is true, which llm3d does not support",
            .pre = "{\"type\": \"ByteLevel\", \"add_prefix_space\": true}");
    REFUSED("the ByteLevel pre-tokenizer's add_prefix_space is a number",
            .pre = "{\"type\": \"ByteLevel\", \"add_prefix_space\": 0}");
    REFUSED("the ByteLevel pre-tokenizer's trim_offsets is a string",
            .pre = "{\"type\": \"ByteLevel\", \"trim_offsets\": \"yes\"}");
    REFUSED("tok.json: no pre_tokenizer", .pre = "-");
    REFUSED("tok.json: no pre_tokenizer", .pre = "null");
    REFUSED("the pre_tokenizer Whitespace is not supported", .pre = "{\"type\": \"Whitespace\"}");
    REFUSED("the pre_tokenizer Sequence is not supported", .pre = "{\"type\": \"Sequence\", "
            "\"pretokenizers\": [{\"type\": \"ByteLevel\"}]}");
    /* Split + ByteLevel */
#define SEQ(split, bytelevel)                                                              \
    "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", " split "}, "        \
    "{\"type\": \"ByteLevel\"" bytelevel "}]}"
#define RE "\"pattern\": {\"Regex\": \"\\\\p{L}+\"}, "
#define ISO "\"behavior\": \"Isolated\""
#define NO_RE ", \"use_regex\": false"
    SPLITS("ab cd", "ab| |cd", .pre = SEQ(RE ISO, NO_RE));
    REFUSED("the Split pre-tokenizer's invert is true, which llm3d does not support",
            .pre = SEQ(RE ISO ", \"invert\": true", NO_RE));
    REFUSED("the Split pre-tokenizer's invert is a string",
            .pre = SEQ(RE ISO ", \"invert\": \"no\"", NO_RE));
    REFUSED("the Split pre-tokenizer is supported with a {\"Regex\": ...} pattern",
            .pre = SEQ(RE "\"behavior\": \"Removed\"", NO_RE));
    REFUSED("the Split pre-tokenizer is supported with a {\"Regex\": ...} pattern",
            .pre = SEQ(RE "\"invert\": false", NO_RE)); /* no behavior */
    REFUSED("the Split pre-tokenizer is supported with a {\"Regex\": ...} pattern",
            .pre = SEQ("\"pattern\": {\"String\": \" \"}, " ISO, NO_RE));
    REFUSED("a ByteLevel pre-tokenizer with use_regex after a Split is not supported",
            .pre = SEQ(RE ISO, "")); /* use_regex absent: true */
    REFUSED("the ByteLevel pre-tokenizer's add_prefix_space is true",
            .pre = SEQ(RE ISO, NO_RE ", \"add_prefix_space\": true"));
#undef NO_RE
#undef ISO
#undef RE
#undef SEQ
}

/* The document's other keys: normalizer (none), decoder (ByteLevel), added_tokens (none) and their
 * options, truncation and padding (none), post_processor (ignored). */
static void test_document_options(void) {
    SPLITS("e\xcc\x81", "e|\xcc\x81", .normalizer = "-");        /* none: not composed */
    SPLITS("e\xcc\x81", "e|\xcc\x81", .normalizer = "null");
    SPLITS("e\xcc\x81", "\xc3\xa9", .normalizer = "{\"type\": \"NFC\"}");
    REFUSED("the normalizer NFKC is not supported", .normalizer = "{\"type\": \"NFKC\"}");
    REFUSED("the normalizer Sequence is not supported",
            .normalizer = "{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFC\"}]}");
    REFUSED("the normalizer (no type) is not supported", .normalizer = "\"NFC\"");
    READS(.decoder = "-");
    READS(.decoder = "null");
    READS(.decoder = "{\"type\": \"ByteLevel\"}");
    REFUSED("the decoder WordPiece is not supported", .decoder = "{\"type\": \"WordPiece\"}");
    struct l3d_tokenizer *t = ACCEPTED(.added = "-");
    if (t) CHECK(l3d_tokenizer_eot(t) == -1 && t->special.n == 0);
    l3d_tokenizer_free(t);
    t = ACCEPTED(.added = "null");
    if (t) CHECK(l3d_tokenizer_eot(t) == -1 && t->special.n == 0);
    l3d_tokenizer_free(t);
    t = ACCEPTED(.added = "[{\"id\": 257, \"content\": \"<|endoftext|>\", \"special\": false}]");
    if (t) CHECK(l3d_tokenizer_eot(t) == 257 && t->special.n == 1);
    l3d_tokenizer_free(t);
    REFUSED("added_tokens is an object, not a list", .added = "{\"<|endoftext|>\": 257}");
    REFUSED("added token 0 has no id", .added = "[{\"content\": \"<|endoftext|>\"}]");
    static const char *const exact[] = {"lstrip", "rstrip", "single_word"};
    for (int k = 0; k < 3; k++) {
        char added[160], want[160];
        snprintf(added, sizeof added, "[{\"id\": 257, \"content\": \"<|endoftext|>\", \"%s\": "
                 "true}]", exact[k]);
        snprintf(want, sizeof want, "added token 0's %s is true, which llm3d does not support",
                 exact[k]);
        refused(exact[k], &(struct doc){.added = added}, want);
    }
    REFUSED("added token 0's special is a string, not true or false",
            .added = "[{\"id\": 257, \"content\": \"<|endoftext|>\", \"special\": \"yes\"}]");
    REFUSED("added token 0's normalized is a number, not true or false",
            .added = "[{\"id\": 257, \"content\": \"<|endoftext|>\", \"normalized\": 1}]");
    READS(.top = "\"truncation\": null, \"padding\": null, \"post_processor\": {\"type\": "
             "\"TemplateProcessing\"}");
    REFUSED("tok.json: truncation is set (an object): llm3d encodes whole texts",
            .top = "\"truncation\": {\"max_length\": 8}");
    REFUSED("tok.json: padding is set (an object)",
            .top = "\"padding\": {\"strategy\": \"BatchLongest\"}");
}

int main(void) {
    test_negated_classes();
    test_empty_match_refused();
    test_match_errors();
    test_prepare_match_error();
    test_merges();
    test_model_options();
    test_pre_tokenizer_options();
    test_document_options();
    return TEST_REPORT();
}
