/* Hugging Face tokenizer files written by llm3d (src/tokenizer/hfsave.c), read back by llm3d's own
 * tokenizer.json reader: the same ids as the reference encoders' (tests/data/tiktoken_NAME.tsv,
 * hf_NAME.tsv) for GPT-2's BPE, cl100k_base, o200k_base, Llama 3 (its rank file and Meta's
 * tokenizer.json), Qwen3's tokenizer.json (NFC, added tokens), and as the original for a BPE
 * trained by llm3d and --tokenizer bytes; tokenizer_config.json and generation_config.json name
 * the tokenizer's own special tokens; a tokenizer.json with one merge removed or two vocabulary
 * ids swapped gives other ids. The named vocabularies are those `bash scripts/setup.sh
 * --tokenizers` installs (make test runs it), as test_tiktoken reads them.
 *
 * `test_hftok SPEC TSV` compares instead: the tokenizer SPEC's ids for the o cases of TSV (the
 * npm oracle's, tests/cli/hftok.sh), and for its s cases where SPEC has special tokens, must be
 * the file's; prints the counts, exit status 1 on any difference or fewer than 100 cases. */
#include <stdlib.h>
#include <string.h>

#include "llm3d/file.h"
#include "llm3d/json.h"
#include "llm3d/tokenizer.h"
#include "support/tokvec.h"
#include "test.h"
#include "tokenizer/tokenizer-impl.h"

static char data_dir[4096], tmp_dir[4096];
static bool quiet; /* the differences a perturbed file must give: counted, not shown */

/* The cases of tsv (a name under tests/data, or a path) encoded by t; with expect NULL against the
 * file's ids, else against expect's ids. Returns the number of cases that differ; *cases counts
 * them all. Mode s cases only where special (the special tokens' text is the token). */
static int compare(const struct l3d_tokenizer *t, const struct l3d_tokenizer *expect,
                   const char *tsv, bool special, int *cases) {
    char path[8400];
    snprintf(path, sizeof path, "%s/%s", data_dir, tsv);
    FILE *fp = fopen(tsv[0] == '/' ? tsv : path, "r");
    CHECK(fp != NULL);
    *cases = 0;
    if (!fp) return 1;
    struct l3d_encoder *e = l3d_encoder_init(t), *x = expect ? l3d_encoder_init(expect) : NULL;
    static char line[1 << 17];
    static unsigned char text[1 << 16];
    int bad = 0;
    while (fgets(line, sizeof line, fp)) {
        struct l3d_ids want = {0}, got = {0};
        size_t n;
        char mode;
        CHECK(tokvec_parse_line(line, text, &n, &mode, &want));
        if (mode == 's' && !special) {
            l3d_ids_free(&want);
            continue;
        }
        l3d_status (*enc)(struct l3d_encoder *, const char *, size_t, struct l3d_ids *) =
            mode == 's' ? l3d_encoder_encode_special : l3d_encoder_encode;
        CHECK(enc(e, (const char *)text, n, &got) == L3D_OK);
        if (x) {
            want.n = 0;
            CHECK(enc(x, (const char *)text, n, &want) == L3D_OK);
        }
        if (!tokvec_same(&got, &want) && bad++ < 3 && !quiet)
            fprintf(stderr, "%s: %c case \"%.*s\": %lld ids, want %lld\n", tsv, mode,
                    (int)(n < 60 ? n : 60), text, (long long)got.n, (long long)want.n);
        (*cases)++;
        l3d_ids_free(&want);
        l3d_ids_free(&got);
    }
    fclose(fp);
    l3d_encoder_free(e);
    l3d_encoder_free(x);
    return bad;
}

static char *read_text(const char *dir, const char *name, size_t *n) {
    char path[8500], *buf = NULL;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    CHECK(l3d_read_whole_file(path, "test file", &buf, n) == L3D_OK);
    return buf;
}

/* tokenizer_config.json's and special_tokens_map.json's bos/eos tokens, generation_config.json's
 * ids: the tokenizer's begin-of-text (else end-of-text) and end-of-text. */
static void check_configs(const struct l3d_tokenizer *t, const char *dir, int64_t max_len) {
    int bos = t->bot >= 0 ? t->bot : t->eot;
    static const char *const files[] = {"tokenizer_config.json", "special_tokens_map.json",
                                        "generation_config.json"};
    for (int f = 0; f < 3; f++) {
        size_t n;
        char *text = read_text(dir, files[f], &n);
        struct l3d_json doc;
        CHECK(text && l3d_json_parse(&doc, text, n, files[f]) == L3D_OK);
        static const char *const key[2][2] = {{"bos_token", "eos_token"},
                                              {"bos_token_id", "eos_token_id"}};
        int want[2] = {bos, t->eot};
        for (int k = 0; k < 2; k++) {
            const struct l3d_json *v = l3d_json_get(&doc, key[f == 2][k]);
            size_t len;
            const unsigned char *s = want[k] >= 0 ? l3d_tokenizer_token(t, want[k], &len) : NULL;
            int64_t id;
            if (want[k] < 0) CHECK(v == NULL);
            else if (f == 2) CHECK(l3d_json_int(v, &id) && id == want[k]);
            else CHECK(v && v->len == len && memcmp(l3d_json_str(v), s, len) == 0);
        }
        if (f == 0) {
            const struct l3d_json *v = l3d_json_get(&doc, "model_max_length");
            int64_t m;
            CHECK(max_len ? l3d_json_int(v, &m) && m == max_len : v == NULL);
            const struct l3d_json *b = l3d_json_get(&doc, "add_bos_token");
            CHECK(b && b->type == L3D_JSON_BOOL && b->boolean == (t->bot >= 0));
        }
        l3d_json_free(&doc);
        l3d_free(text);
    }
}

/* tokenizer.json's text with a change: the first merge removed (which = 0) or the ids of the
 * tokens "e" and "t" swapped (1), written as DIR/tokenizer.json. */
static void perturb(const char *text, const char *dir, int which) {
    char *s = strdup(text), path[8500];
    if (which == 0) {
        char *m = strstr(s, "\"merges\": [\n    \""), *end = m ? strstr(m, "\",\n    \"") : NULL;
        CHECK(m && end);
        if (!end) {
            free(s);
            return;
        }
        m += strlen("\"merges\": [\n    ");
        memmove(m, end + strlen("\",\n    "), strlen(end + strlen("\",\n    ")) + 1);
    } else {
        char *c1 = strstr(s, "\n    \"e\": "), *c2 = strstr(s, "\n    \"t\": ");
        CHECK(c1 && c2);
        if (!c1 || !c2) {
            free(s);
            return;
        }
        c1 += 7, c2 += 7; /* at "\": " */
        long a = strtol(c1 + 3, NULL, 10), b = strtol(c2 + 3, NULL, 10);
        char na[16], nb[16];
        int la = snprintf(na, sizeof na, "%ld", b), lb = snprintf(nb, sizeof nb, "%ld", a);
        CHECK(la == lb); /* the swap keeps the text's length */
        memcpy(c1 + 3, na, (size_t)la);
        memcpy(c2 + 3, nb, (size_t)lb);
    }
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    CHECK(l3d_write_file(path, "test file", s, strlen(s)) == L3D_OK);
    free(s);
}

/* t written as Hugging Face's files, read back: the same tokens and special tokens, the ids of
 * tsv (expect NULL: the file's, else expect's), the configs; then the two perturbations. */
static void roundtrip(const char *name, const struct l3d_tokenizer *t,
                      const struct l3d_tokenizer *expect, const char *tsv) {
    char dir[8400], json[8500];
    snprintf(dir, sizeof dir, "%s/%s", tmp_dir, name);
    CHECK(l3d_mkdir_p(dir) == L3D_OK);
    CHECK(l3d_tokenizer_write_hf(t, dir, 1024) == L3D_OK);
    snprintf(json, sizeof json, "%s/tokenizer.json", dir);
    struct l3d_tokenizer *r;
    l3d_status st = l3d_tokenizer_load_hf(&r, json);
    if (st != L3D_OK) fprintf(stderr, "%s: %s\n", name, l3d_error_message());
    CHECK(st == L3D_OK);
    if (st != L3D_OK) return;
    CHECK(r->V == t->V && r->eot == t->eot && r->bot == t->bot && r->nfc == t->nfc);
    CHECK(r->whole_first == t->whole_first && strcmp(r->pattern, t->pattern) == 0);
    for (int id = 0; id < t->V; id++) {
        size_t a, b;
        const unsigned char *x = l3d_tokenizer_token(t, id, &a);
        const unsigned char *y = l3d_tokenizer_token(r, id, &b);
        CHECK(a == b && memcmp(x, y, a) == 0);
    }
    /* the special tokens' text as those tokens: the references' files have such cases; llm3d's
     * GPT-2-format files have no added tokens (end-of-text is an added token in tokenizer.json) */
    bool special = expect == NULL;
    int cases, bad = compare(r, expect, tsv, special, &cases);
    printf("%s: %d cases of %s, %d differ\n", name, cases, tsv, bad);
    CHECK(bad == 0 && cases >= 400);
    check_configs(t, dir, 1024);
    size_t n;
    char *text = read_text(dir, "tokenizer.json", &n);
    for (int which = t->nmerges ? 0 : 1; which < 2 && text; which++) {
        struct l3d_tokenizer *p;
        perturb(text, dir, which);
        CHECK(l3d_tokenizer_load_hf(&p, json) == L3D_OK);
        if (!p) continue;
        quiet = true;
        bad = compare(p, expect, tsv, special, &cases);
        quiet = false;
        printf("%s with %s: %d of %d cases differ\n", name,
               which ? "two vocabulary ids swapped" : "its first merge removed", bad, cases);
        CHECK(bad > 0); /* the comparison can fail */
        l3d_tokenizer_free(p);
    }
    l3d_free(text);
    l3d_tokenizer_free(r);
}

/* A BPE trained by llm3d on the texts of hf_gpt2.tsv: its tokenizer.json (written by training,
 * beside encoder.json and vocab.bpe) encodes as its GPT-2-format files. */
static void trained(void) {
    char corpus[8400], dir[8400], tsv[8400], line[1 << 16];
    static unsigned char text[1 << 15];
    snprintf(corpus, sizeof corpus, "%s/corpus.txt", tmp_dir);
    snprintf(dir, sizeof dir, "%s/trained", tmp_dir);
    snprintf(tsv, sizeof tsv, "%s/hf_gpt2.tsv", data_dir);
    FILE *in = fopen(tsv, "r"), *out = fopen(corpus, "w");
    CHECK(in && out);
    while (in && out && fgets(line, sizeof line, in)) {
        struct l3d_ids ids = {0};
        size_t n;
        char mode;
        if (tokvec_parse_line(line, text, &n, &mode, &ids) && mode == 'o') fwrite(text, 1, n, out);
        l3d_ids_free(&ids);
    }
    if (in) fclose(in);
    if (out) fclose(out);
    char *files[1] = {corpus};
    int merges = 0;
    CHECK(l3d_bpe_train(files, 1, 1200, dir, &merges, false) == L3D_OK && merges > 800);
    struct l3d_tokenizer *t, *h;
    char json[8500];
    snprintf(json, sizeof json, "%s/tokenizer.json", dir);
    CHECK(l3d_tokenizer_load(&t, dir) == L3D_OK && l3d_tokenizer_load_hf(&h, json) == L3D_OK);
    int cases, bad = compare(h, t, "hf_gpt2.tsv", false, &cases);
    CHECK(bad == 0 && cases >= 2000);
    check_configs(t, dir, 0); /* written without a model: no model_max_length */
    roundtrip("trained_hf", t, t, "hf_gpt2.tsv");
    l3d_tokenizer_free(t);
    l3d_tokenizer_free(h);
}

static int compare_mode(const char *spec, const char *tsv) {
    struct l3d_tokenizer *t;
    if (l3d_tokenizer_open(&t, spec) != L3D_OK) {
        fprintf(stderr, "%s\n", l3d_error_message());
        return 1;
    }
    /* s cases where the tokenizer has special tokens (GPT-2's encoder.json has none) */
    int cases, bad = compare(t, NULL, tsv, t->special.n > 0, &cases);
    printf("%s: %d cases of %s%s, %d differ\n", spec, cases, tsv,
           t->special.n > 0 ? "" : " (special tokens' text as text only)", bad);
    l3d_tokenizer_free(t);
    CHECK(test_rm_rf(tmp_dir));
    return bad == 0 && cases >= 100 && test_failures == 0 ? 0 : 1;
}

int main(int argc, char **argv) {
    test_dirs(__FILE__, "data", data_dir, sizeof data_dir, "test_hftok", tmp_dir, sizeof tmp_dir);
    if (argc == 3) return compare_mode(argv[1], argv[2]);
    static const struct {
        const char *name, *spec, *tsv; /* spec: a name, a path under the cache or tests/data */
    } toks[] = {
        {"gpt2", "data:gpt2", "hf_gpt2.tsv"},
        {"cl100k_base", "cl100k_base", "tiktoken_cl100k_base.tsv"},
        {"o200k_base", "o200k_base", "tiktoken_o200k_base.tsv"},
        {"llama3", "llama3", "tiktoken_llama3.tsv"},
        {"llama3_json", "cache:hf/llama3/tokenizer.json", "hf_llama3.tsv"},
        {"qwen3_json", "cache:hf/qwen3/tokenizer.json", "hf_qwen3.tsv"},
    };
    for (size_t i = 0; i < sizeof toks / sizeof *toks; i++) {
        char spec[8400], base[4000];
        l3d_tokenizer_cache_dir(base, sizeof base);
        if (strncmp(toks[i].spec, "data:", 5) == 0)
            snprintf(spec, sizeof spec, "%s/%s", data_dir, toks[i].spec + 5);
        else if (strncmp(toks[i].spec, "cache:", 6) == 0)
            snprintf(spec, sizeof spec, "%s/%s", base, toks[i].spec + 6);
        else
            snprintf(spec, sizeof spec, "%s", toks[i].spec);
        struct l3d_tokenizer *t;
        l3d_status st = l3d_tokenizer_open(&t, spec);
        if (st != L3D_OK) fprintf(stderr, "%s\n", l3d_error_message());
        CHECK(st == L3D_OK);
        if (st != L3D_OK) continue;
        roundtrip(toks[i].name, t, NULL, toks[i].tsv);
        l3d_tokenizer_free(t);
    }
    struct l3d_tokenizer *b;
    CHECK(l3d_tokenizer_open(&b, "bytes") == L3D_OK);
    roundtrip("bytes", b, b, "hf_gpt2.tsv");
    l3d_tokenizer_free(b);
    trained();
    CHECK(test_rm_rf(tmp_dir));
    return TEST_REPORT();
}
