/*
 * A tokenizer as Hugging Face's files (include/llm3d/tokenizer.h, l3d_tokenizer_write_hf): what
 * transformers' AutoTokenizer reads from a model folder, for every tokenizer llm3d reads or trains.
 *
 *   tokenizer.json: the `tokenizers` library's serialisation, as src/tokenizer/hf.c reads it back:
 *     model BPE {vocab: {spelled token: id}, merges: ["a b", ...] in rank order, ignore_merges:
 *     whether a pre-token that is a token is that token (tiktoken's rule)}; tokens spelled through
 *     GPT-2's bytes_to_unicode; pre_tokenizer ByteLevel with its regex for GPT-2's pattern, else a
 *     Sequence of Split {Regex: the pattern as llm3d uses it, Isolated} and ByteLevel without its
 *     regex (as Meta's Llama 3 and Qwen2 files); normalizer NFC where the tokenizer has one;
 *     decoder ByteLevel; added_tokens: the special tokens (end-of-text, begin-of-text, tiktoken's
 *     and the read file's added tokens), special, matched as written; post_processor: a template
 *     that starts a text with begin-of-text where the tokenizer has one (Llama 3's), else none.
 *   tokenizer_config.json: tokenizer_class PreTrainedTokenizerFast, bos_token (begin-of-text,
 *     else end-of-text as GPT-2's), eos_token (end-of-text), unk_token (GPT-2's: end-of-text, where
 *     there is no begin-of-text), add_bos_token (true with begin-of-text, as Llama 3's),
 *     model_max_length where the model is known.
 *   special_tokens_map.json: the same bos/eos/unk tokens.
 *   generation_config.json: bos_token_id and eos_token_id.
 *
 * Merges: GPT-2's vocab.bpe and a read tokenizer.json give theirs in rank order. A tiktoken rank
 * file has none; llm3d's merge table holds, for each token of rank r and each split of its bytes
 * into two tokens a b, the merge (a, b) -> token at rank r (src/tokenizer/tiktoken.c). Written in
 * that order (ties by a's rank, then b's), it is the list that Hugging Face's TikTokenConverter
 * (transformers, convert_slow_tokenizer.py, extract_vocab_merges_from_model) makes and Meta's
 * Llama 3 tokenizer.json holds: the `tokenizers` library's BPE, applying the lowest-ranked merge
 * first, then merges as tiktoken does (lowest rank of the concatenation first).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llm3d/file.h"
#include "llm3d/tokenizer.h"
#include "tokenizer/tokenizer-impl.h"

#define NFC_JSON "{\"type\": \"NFC\"}"

static const char *const hf_names[] = {"tokenizer.json", "tokenizer_config.json",
                                       "special_tokens_map.json", "generation_config.json"};

bool l3d_tokenizer_hf_owned(const char *name) {
    for (size_t i = 0; i < sizeof hf_names / sizeof *hf_names; i++)
        if (strcmp(name, hf_names[i]) == 0) return true;
    return false;
}

static bool is_special(const struct l3d_tokenizer *t, int id) {
    if (id == t->eot || id == t->bot) return true;
    for (int k = 0; k < t->special.n; k++)
        if (t->special.id[k] == id) return true;
    return false;
}

/* Bytes s[0..n) (UTF-8 text: a special token, a pattern) as a JSON string. */
static void json_str(FILE *f, const unsigned char *s, size_t n) {
    fputc('"', f);
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '"' || s[i] == '\\') fprintf(f, "\\%c", s[i]);
        else if (s[i] < 0x20) fprintf(f, "\\u%04x", s[i]);
        else fputc(s[i], f);
    }
    fputc('"', f);
}

static void token_str(FILE *f, const struct l3d_tokenizer *t, int id) {
    size_t n;
    const unsigned char *s = l3d_tokenizer_token(t, id, &n);
    json_str(f, s, n);
}

struct merge_row {
    int32_t rank, a, b;
};

static int merge_cmp(const void *x, const void *y) {
    const struct merge_row *p = x, *q = y;
    if (p->rank != q->rank) return p->rank < q->rank ? -1 : 1;
    if (p->a != q->a) return p->a < q->a ? -1 : 1;
    return (p->b > q->b) - (p->b < q->b);
}

/* The model's merges from t's table, in rank order (see the top), spelled. */
static void write_merges(FILE *f, const struct l3d_tokenizer *t, const int byte_cp[256]) {
    struct merge_row *m = l3d_alloc(((size_t)t->nmerges + 1) * sizeof *m, "merges");
    size_t n = 0;
    for (uint64_t i = 0; t->merges && i <= t->mmask; i++) {
        uint64_t key = t->merges[i].key;
        if (!key) continue;
        L3D_ASSERT(n < (size_t)t->nmerges + 1);
        m[n++] = (struct merge_row){t->merges[i].rank, (int32_t)((key - 1) >> 32),
                                    (int32_t)((key - 1) & 0xffffffffu)};
    }
    qsort(m, n, sizeof *m, merge_cmp);
    for (size_t k = 0; k < n; k++) {
        size_t la, lb;
        const unsigned char *a = l3d_tokenizer_token(t, m[k].a, &la);
        const unsigned char *b = l3d_tokenizer_token(t, m[k].b, &lb);
        fputs(k ? ",\n    \"" : "\n    \"", f);
        l3d_tok_write_spelled(f, a, la, byte_cp, true);
        fputc(' ', f);
        l3d_tok_write_spelled(f, b, lb, byte_cp, true);
        fputc('"', f);
    }
    l3d_free(m);
}

static void write_model(FILE *f, const struct l3d_tokenizer *t) {
    int byte_cp[256];
    l3d_bytes_to_unicode(byte_cp, NULL);
    fprintf(f, "  \"model\": {\n    \"type\": \"BPE\", \"dropout\": null, \"unk_token\": null, "
            "\"continuing_subword_prefix\": null, \"end_of_word_suffix\": null, \"fuse_unk\": "
            "false, \"byte_fallback\": false, \"ignore_merges\": %s,\n    \"vocab\": {",
            t->whole_first ? "true" : "false");
    bool first = true;
    for (int id = 0; id < t->V; id++) {
        size_t n;
        const unsigned char *s = l3d_tokenizer_token(t, id, &n);
        if (n == 0 || is_special(t, id)) continue; /* an id no token has; an added token */
        fputs(first ? "\n    \"" : ",\n    \"", f);
        first = false;
        l3d_tok_write_spelled(f, s, n, byte_cp, true);
        fprintf(f, "\": %d", id);
    }
    fputs("\n    },\n    \"merges\": [", f);
    write_merges(f, t, byte_cp);
    fputs("\n    ]\n  }\n}\n", f);
}

/* The added tokens: every special token, in id order. */
static void write_added(FILE *f, const struct l3d_tokenizer *t) {
    fputs("  \"added_tokens\": [", f);
    bool first = true;
    for (int id = 0; id < t->V; id++) {
        size_t n;
        if (!is_special(t, id) || (l3d_tokenizer_token(t, id, &n), n == 0)) continue;
        fprintf(f, "%s\n    {\"id\": %d, \"content\": ", first ? "" : ",", id);
        token_str(f, t, id);
        fputs(", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, "
              "\"normalized\": false, \"special\": true}", f);
        first = false;
    }
    fputs(first ? "],\n" : "\n  ],\n", f);
}

static void write_pre_tokenizer(FILE *f, const struct l3d_tokenizer *t) {
    if (strcmp(t->pattern, L3D_GPT2_PATTERN) == 0) {
        fputs("  \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
              "\"trim_offsets\": true, \"use_regex\": true},\n", f);
        return;
    }
    fputs("  \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [\n    {\"type\": "
          "\"Split\", \"pattern\": {\"Regex\": ", f);
    json_str(f, (const unsigned char *)t->pattern, strlen(t->pattern));
    fputs("}, \"behavior\": \"Isolated\", \"invert\": false},\n    {\"type\": \"ByteLevel\", "
          "\"add_prefix_space\": false, \"trim_offsets\": true, \"use_regex\": false}\n  ]},\n", f);
}

/* Llama 3's post-processor: begin-of-text before a text (and before each of a pair). */
static void write_post(FILE *f, const struct l3d_tokenizer *t) {
    if (t->bot < 0) {
        fputs("  \"post_processor\": null,\n", f);
        return;
    }
    char bos[64];
    size_t n;
    const unsigned char *s = l3d_tokenizer_token(t, t->bot, &n);
    snprintf(bos, sizeof bos, "%.*s", (int)(n < 60 ? n : 60), (const char *)s);
    fprintf(f, "  \"post_processor\": {\"type\": \"TemplateProcessing\",\n"
            "    \"single\": [{\"SpecialToken\": {\"id\": \"%s\", \"type_id\": 0}}, "
            "{\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}],\n"
            "    \"pair\": [{\"SpecialToken\": {\"id\": \"%s\", \"type_id\": 0}}, "
            "{\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}, {\"SpecialToken\": {\"id\": \"%s\", "
            "\"type_id\": 1}}, {\"Sequence\": {\"id\": \"B\", \"type_id\": 1}}],\n"
            "    \"special_tokens\": {\"%s\": {\"id\": \"%s\", \"ids\": [%d], \"tokens\": "
            "[\"%s\"]}}},\n", bos, bos, bos, bos, bos, t->bot, bos);
}

/* Qwen2's NFC normalizer, the only one llm3d has */
static const char *normalizer(const struct l3d_tokenizer *t) { return t->nfc ? NFC_JSON : "null"; }

static char *tokenizer_json(const struct l3d_tokenizer *t) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) l3d_fatal(__FILE__, __LINE__, "out of memory for tokenizer.json");
    fputs("{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n", f);
    write_added(f, t);
    fprintf(f, "  \"normalizer\": %s,\n", normalizer(t));
    write_pre_tokenizer(f, t);
    write_post(f, t);
    fputs("  \"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": "
          "true, \"use_regex\": true},\n", f);
    write_model(f, t);
    fclose(f);
    return text;
}

/* The begin and end tokens transformers is told of: Llama 3's begin-of-text, else end-of-text as
 * GPT-2's (whose documents start with it, as llm3d prepares them); -1 where there is none. */
static int bos_id(const struct l3d_tokenizer *t) { return t->bot >= 0 ? t->bot : t->eot; }

/* "bos_token": ..., "eos_token": ..., "unk_token": ... (those the tokenizer has), each a line. */
static void special_map(FILE *f, const struct l3d_tokenizer *t) {
    const char *key[3] = {"bos_token", "eos_token", "unk_token"};
    int id[3] = {bos_id(t), t->eot, t->bot < 0 ? t->eot : -1};
    for (int k = 0; k < 3; k++) {
        if (id[k] < 0) continue;
        fprintf(f, "  \"%s\": ", key[k]);
        token_str(f, t, id[k]);
        fputs(",\n", f);
    }
}

static char *config_json(const struct l3d_tokenizer *t, int64_t max_len, int which) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) l3d_fatal(__FILE__, __LINE__, "out of memory for tokenizer_config.json");
    fputs("{\n", f);
    if (which == 0) { /* tokenizer_config.json */
        fputs("  \"tokenizer_class\": \"PreTrainedTokenizerFast\",\n", f);
        special_map(f, t);
        if (max_len > 0) fprintf(f, "  \"model_max_length\": %lld,\n", (long long)max_len);
        fprintf(f, "  \"add_bos_token\": %s,\n  \"add_eos_token\": false,\n"
                "  \"clean_up_tokenization_spaces\": false\n}\n", t->bot >= 0 ? "true" : "false");
    } else if (which == 1) { /* special_tokens_map.json */
        special_map(f, t);
        fputs("  \"additional_special_tokens\": []\n}\n", f);
    } else { /* generation_config.json */
        if (bos_id(t) >= 0) fprintf(f, "  \"bos_token_id\": %d,\n", bos_id(t));
        if (t->eot >= 0) fprintf(f, "  \"eos_token_id\": %d,\n", t->eot);
        fputs("  \"_from_model_config\": true\n}\n", f);
    }
    fclose(f);
    return text;
}

l3d_status l3d_tokenizer_write_hf(const struct l3d_tokenizer *t, const char *dir,
                                  int64_t max_len) {
    if (!l3d_tokenizer_can_encode(t))
        return l3d_error(L3D_ERR_ARG, "llm.c's tokenizer file holds no merges: it cannot be "
                         "written as a Hugging Face tokenizer.json; give the tokenizer it was "
                         "made from (encoder.json + vocab.bpe, a name, a tokenizer.json)");
    l3d_status st = L3D_OK;
    char path[L3D_FILE_PATH_CAP + 32];
    for (int k = 0; k < 4 && st == L3D_OK; k++) {
        char *text = k == 0 ? tokenizer_json(t) : config_json(t, max_len, k - 1);
        snprintf(path, sizeof path, "%s/%s", dir, hf_names[k]);
        st = l3d_write_file(path, "tokenizer file", text, strlen(text));
        free(text); /* open_memstream's */
    }
    return st;
}

l3d_status l3d_tokenizer_save_hf(const struct l3d_tokenizer *t, const char *dir) {
    struct l3d_dir_out out;
    l3d_status st = l3d_dir_out_begin(&out, dir, "tokenizer folder", l3d_tokenizer_hf_owned);
    if (st != L3D_OK) return st;
    if ((st = l3d_tokenizer_write_hf(t, out.tmp, 0)) != L3D_OK) {
        l3d_dir_out_abort(&out);
        return st;
    }
    return l3d_dir_out_commit(&out);
}

l3d_status l3d_tokenizer_fits(const struct l3d_tokenizer *t, int V, const char *what) {
    if (t->V <= V) return L3D_OK;
    return l3d_error(L3D_ERR_ARG, "%s: the tokenizer has %d tokens but the model's vocabulary is "
                     "%d: give the tokenizer the model's data was prepared with", what, t->V, V);
}
