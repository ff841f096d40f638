/*
 * Hugging Face tokenizer.json (the `tokenizers` library's serialisation): the byte-level BPE
 * tokenizers of GPT-2, Llama 3 and Qwen2 style. What is read:
 *   model: {"type": "BPE", "vocab": {spelled token: id}, "merges": ["a b", ...] or [["a", "b"],
 *          ...] (required, a list), "ignore_merges": bool}; tokens spelled through GPT-2's
 *          bytes_to_unicode
 *   pre_tokenizer: {"type": "ByteLevel", "use_regex": true} (GPT-2's pattern), or a "Sequence" of
 *          {"type": "Split", "pattern": {"Regex": R}, "behavior": "Isolated"} and
 *          {"type": "ByteLevel", "use_regex": false}
 *   decoder: "ByteLevel" or none; added_tokens: [{"id", "content"}] (content as written, not
 *          spelled); their text in user text is the token only where the caller allows it
 *          (l3d_encoder_encode_special: the library's own encode always does).
 *   normalizer: none, or {"type": "NFC"} (Qwen2's: Unicode canonical composition of the text
 *          between special tokens before pre-tokenisation, src/tokenizer/normalize.c)
 *   post_processor: ignored (llm3d adds begin-of-text itself where a command asks for it).
 * Anything else (WordPiece, Unigram or WordLevel models, other normalizers, add_prefix_space, other
 * pre-tokenizers or decoders, byte_fallback, subword prefixes) is refused, named.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llm3d/json.h"
#include "llm3d/tokenizer.h"
#include "tokenizer/tokenizer-impl.h"

/* A spelled token string to bytes (out has room for len bytes); false when a character is not one
 * of bytes_to_unicode's. */
static bool unspell(const char *s, size_t len, const int cp_byte[512], unsigned char *out,
                    size_t *n) {
    *n = 0;
    for (size_t i = 0; i < len;) {
        unsigned char c = (unsigned char)s[i];
        int cp, k = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : 0;
        if (k == 0 || i + (size_t)k > len) return false;
        cp = k == 1 ? c : (c & 31) << 6 | ((unsigned char)s[i + 1] & 63);
        if (cp >= 512 || cp_byte[cp] < 0) return false;
        out[(*n)++] = (unsigned char)cp_byte[cp];
        i += (size_t)k;
    }
    return true;
}

static const char *type_of(const struct l3d_json *v) {
    const char *s = l3d_json_str(l3d_json_get(v, "type"));
    return s ? s : "(no type)";
}

static bool flag_of(const struct l3d_json *v, const char *key) {
    const struct l3d_json *f = l3d_json_get(v, key);
    return f && f->type == L3D_JSON_BOOL && f->boolean;
}

/* One ByteLevel pre-tokenizer: *regex receives whether it applies GPT-2's pattern. */
static l3d_status byte_level(const struct l3d_json *p, const char *path, bool *regex) {
    if (flag_of(p, "add_prefix_space"))
        return l3d_error(L3D_ERR_FORMAT, "%s: the ByteLevel pre-tokenizer's add_prefix_space is "
                         "not supported", path);
    const struct l3d_json *u = l3d_json_get(p, "use_regex");
    *regex = !u || (u->type == L3D_JSON_BOOL && u->boolean);
    return L3D_OK;
}

/* The pre-tokenizer: the pattern to compile into *pat (a pointer into the document or GPT-2's). */
static l3d_status pre_tokenizer(const struct l3d_json *doc, const char *path, const char **pat) {
    const struct l3d_json *p = l3d_json_get(doc, "pre_tokenizer");
    bool regex = false;
    *pat = NULL;
    if (!p || p->type != L3D_JSON_OBJECT)
        return l3d_error(L3D_ERR_FORMAT, "%s: no pre_tokenizer: llm3d reads byte-level BPE "
                         "tokenizers (a ByteLevel pre-tokenizer)", path);
    if (strcmp(type_of(p), "ByteLevel") == 0) {
        l3d_status st = byte_level(p, path, &regex);
        *pat = L3D_GPT2_PATTERN;
        return st;
    }
    const struct l3d_json *seq = l3d_json_get(p, "pretokenizers");
    if (strcmp(type_of(p), "Sequence") != 0 || !seq || seq->type != L3D_JSON_ARRAY ||
        seq->count != 2 || strcmp(type_of(&seq->items[0]), "Split") != 0 ||
        strcmp(type_of(&seq->items[1]), "ByteLevel") != 0)
        return l3d_error(L3D_ERR_FORMAT, "%s: the pre_tokenizer %s is not supported: llm3d reads "
                         "ByteLevel, or a Sequence of a Split with a regex and a ByteLevel", path,
                         type_of(p));
    const struct l3d_json *split = &seq->items[0];
    const char *re = l3d_json_str(l3d_json_get(l3d_json_get(split, "pattern"), "Regex"));
    const char *beh = l3d_json_str(l3d_json_get(split, "behavior"));
    if (!re || !beh || strcmp(beh, "Isolated") != 0 || flag_of(split, "invert"))
        return l3d_error(L3D_ERR_FORMAT, "%s: the Split pre-tokenizer is supported with a "
                         "{\"Regex\": ...} pattern, behavior Isolated and invert false only", path);
    l3d_status st = byte_level(&seq->items[1], path, &regex);
    if (st == L3D_OK && regex)
        return l3d_error(L3D_ERR_FORMAT, "%s: a ByteLevel pre-tokenizer with use_regex after a "
                         "Split is not supported", path);
    *pat = re;
    return st;
}

/* The parts llm3d refuses: a normalizer other than NFC, a model other than plain BPE, another
 * decoder. *nfc receives whether the text is normalized to NFC. */
static l3d_status check_features(const struct l3d_json *doc, const char *path, bool *nfc) {
    const struct l3d_json *norm = l3d_json_get(doc, "normalizer"), *model = l3d_json_get(doc, "model");
    const struct l3d_json *dec = l3d_json_get(doc, "decoder");
    *nfc = norm && norm->type != L3D_JSON_NULL && strcmp(type_of(norm), "NFC") == 0;
    if (norm && norm->type != L3D_JSON_NULL && !*nfc)
        return l3d_error(L3D_ERR_FORMAT, "%s: the normalizer %s is not supported (llm3d reads "
                         "tokenizers without a normalizer or with NFC)", path, type_of(norm));
    if (!model || strcmp(type_of(model), "BPE") != 0)
        return l3d_error(L3D_ERR_FORMAT, "%s: the model %s is not supported: llm3d reads BPE "
                         "models only (not WordPiece, Unigram or WordLevel)", path,
                         model ? type_of(model) : "(none)");
    const char *pre = l3d_json_str(l3d_json_get(model, "continuing_subword_prefix"));
    const char *suf = l3d_json_str(l3d_json_get(model, "end_of_word_suffix"));
    if (flag_of(model, "byte_fallback") || (pre && *pre) || (suf && *suf))
        return l3d_error(L3D_ERR_FORMAT, "%s: the BPE model's byte_fallback, "
                         "continuing_subword_prefix and end_of_word_suffix are not supported", path);
    if (dec && dec->type != L3D_JSON_NULL && strcmp(type_of(dec), "ByteLevel") != 0)
        return l3d_error(L3D_ERR_FORMAT, "%s: the decoder %s is not supported (ByteLevel only)",
                         path, type_of(dec));
    return L3D_OK;
}

/* The vocabulary and the added tokens into t's token table: id -> bytes (ids no token has are
 * empty); the added tokens are t's special tokens. */
static l3d_status set_tokens(struct l3d_tokenizer *t, const struct l3d_json *vocab,
                             const struct l3d_json *added, const char *path) {
    int cp_byte[512], byte_cp[256];
    l3d_bytes_to_unicode(byte_cp, NULL);
    for (int i = 0; i < 512; i++) cp_byte[i] = -1;
    for (int b = 0; b < 256; b++) cp_byte[byte_cp[b]] = b;
    int64_t V = 0, id;
    size_t nb = 0, na = added && added->type == L3D_JSON_ARRAY ? added->count : 0;
    for (size_t i = 0; i < vocab->count; i++) {
        if (!l3d_json_int(&vocab->items[i], &id) || id < 0 || id >= 1 << 24)
            return l3d_error(L3D_ERR_FORMAT, "%s: the vocabulary's token \"%s\" has no id in "
                             "0..2^24", path, vocab->keys[i].str);
        V = id + 1 > V ? id + 1 : V;
        nb += vocab->keys[i].len;
    }
    for (size_t i = 0; i < na; i++) {
        const struct l3d_json *c = l3d_json_get(&added->items[i], "content");
        if (!l3d_json_int(l3d_json_get(&added->items[i], "id"), &id) || id < 0 ||
            id >= 1 << 24 || !c || c->type != L3D_JSON_STRING)
            return l3d_error(L3D_ERR_FORMAT, "%s: added token %zu has no id in 0..2^24 or no "
                             "content", path, i);
        V = id + 1 > V ? id + 1 : V;
        nb += c->len;
    }
    int64_t *len = l3d_alloc((size_t)V * sizeof *len, "token lengths");
    unsigned char *tmp = l3d_alloc(nb + 1, "token bytes");
    int64_t *at = l3d_alloc((size_t)V * sizeof *at, "token offsets");
    for (int64_t k = 0; k < V; k++) len[k] = -1;
    size_t o = 0;
    l3d_status st = L3D_OK;
    for (size_t i = 0; i < vocab->count && st == L3D_OK; i++) {
        size_t n;
        (void)l3d_json_int(&vocab->items[i], &id);
        if (!unspell(vocab->keys[i].str, vocab->keys[i].len, cp_byte, tmp + o, &n))
            st = l3d_error(L3D_ERR_FORMAT, "%s: the vocabulary's token \"%s\" is not spelled in "
                           "GPT-2's bytes_to_unicode characters: not a byte-level BPE", path,
                           vocab->keys[i].str);
        else if (len[id] >= 0)
            st = l3d_error(L3D_ERR_FORMAT, "%s: token id %lld is given twice", path, (long long)id);
        if (st != L3D_OK) break;
        at[id] = (int64_t)o;
        len[id] = (int64_t)n;
        o += n;
    }
    t->special.id = l3d_alloc((na + 1) * sizeof *t->special.id, "special tokens");
    for (size_t i = 0; i < na && st == L3D_OK; i++) {
        const struct l3d_json *c = l3d_json_get(&added->items[i], "content");
        (void)l3d_json_int(l3d_json_get(&added->items[i], "id"), &id);
        t->special.id[t->special.n++] = (int32_t)id;
        if (len[id] >= 0 && (len[id] != (int64_t)c->len || memcmp(tmp + at[id], c->str, c->len)))
            st = l3d_error(L3D_ERR_FORMAT, "%s: added token %lld \"%s\" is another token in the "
                           "vocabulary", path, (long long)id, c->str);
        if (!strcmp(c->str, "<|endoftext|>") || !strcmp(c->str, "<|end_of_text|>")) t->eot = (int)id;
        if (!strcmp(c->str, "<|begin_of_text|>")) t->bot = (int)id;
        if (len[id] >= 0) continue;
        memcpy(tmp + o, c->str, c->len);
        at[id] = (int64_t)o;
        len[id] = (int64_t)c->len;
        o += c->len;
    }
    if (st == L3D_OK) {
        t->V = (int)V;
        t->off = l3d_alloc((size_t)(V + 1) * sizeof *t->off, "token offsets");
        t->blob = l3d_alloc(o + 1, "token bytes");
        int64_t p = 0;
        for (int64_t k = 0; k < V; k++) {
            t->off[k] = p;
            if (len[k] > 0) memcpy(t->blob + p, tmp + at[k], (size_t)len[k]);
            p += len[k] > 0 ? len[k] : 0;
        }
        t->off[V] = p;
    }
    l3d_free(len);
    l3d_free(tmp);
    l3d_free(at);
    return st;
}

/* The merges, rank = position: a list of "a b" strings or of ["a", "b"] pairs (the two forms of
 * the `tokenizers` library), of spelled tokens; a model without the list is refused, as there. */
static l3d_status set_merges(struct l3d_tokenizer *t, const struct l3d_json *merges,
                             const char *path) {
    int cp_byte[512], byte_cp[256];
    l3d_bytes_to_unicode(byte_cp, NULL);
    for (int i = 0; i < 512; i++) cp_byte[i] = -1;
    for (int b = 0; b < 256; b++) cp_byte[byte_cp[b]] = b;
    if (!merges || merges->type != L3D_JSON_ARRAY)
        return l3d_error(L3D_ERR_FORMAT, "%s: the BPE model's merges is %s, not a list: write "
                         "\"merges\": [\"a b\", ...] or [[\"a\", \"b\"], ...] (empty for none)",
                         path, merges ? l3d_json_type_name(merges->type) : "missing");
    size_t nm = merges->count;
    l3d_tok_merges_alloc(t, nm + 1);
    unsigned char buf[2048];
    for (size_t r = 0; r < nm; r++) {
        const struct l3d_json *m = &merges->items[r];
        const char *a = NULL, *b = NULL;
        size_t la = 0, lb = 0, na, nb;
        if (m->type == L3D_JSON_STRING && (b = memchr(m->str, ' ', m->len)) != NULL) {
            a = m->str;
            la = (size_t)(b - a);
            b++;
            lb = m->len - la - 1;
        } else if (m->type == L3D_JSON_ARRAY && m->count == 2 &&
                   m->items[0].type == L3D_JSON_STRING && m->items[1].type == L3D_JSON_STRING) {
            a = m->items[0].str, la = m->items[0].len;
            b = m->items[1].str, lb = m->items[1].len;
        }
        bool ok = a && la + lb < sizeof buf && unspell(a, la, cp_byte, buf, &na) &&
                  unspell(b, lb, cp_byte, buf + na, &nb);
        int ia = ok ? l3d_tok_index_find(&t->ix, t, buf, na) : -1;
        int ib = ok ? l3d_tok_index_find(&t->ix, t, buf + na, nb) : -1;
        int ir = ok ? l3d_tok_index_find(&t->ix, t, buf, na + nb) : -1;
        if (ia < 0 || ib < 0 || ir < 0)
            return l3d_error(L3D_ERR_FORMAT, "%s: merge %zu is not a pair (\"a b\" or [\"a\", "
                             "\"b\"]) of the vocabulary's tokens whose concatenation is a token",
                             path, r);
        l3d_tok_merge_insert(t, ia, ib, (int32_t)r, ir); /* a repeat keeps its first rank */
    }
    return L3D_OK;
}

l3d_status l3d_tok_parse_hf(struct l3d_tokenizer *t, const char *path, const char *js, size_t n) {
    struct l3d_json doc;
    l3d_status st = l3d_json_parse(&doc, js, n, path);
    const char *pat = NULL;
    const struct l3d_json *model = l3d_json_get(&doc, "model");
    const struct l3d_json *vocab = l3d_json_get(model, "vocab");
    if (st == L3D_OK) st = check_features(&doc, path, &t->nfc);
    if (st == L3D_OK) st = pre_tokenizer(&doc, path, &pat);
    if (st == L3D_OK && (!vocab || vocab->type != L3D_JSON_OBJECT || vocab->count == 0))
        st = l3d_error(L3D_ERR_FORMAT, "%s: the BPE model has no vocab object", path);
    if (st == L3D_OK) st = set_tokens(t, vocab, l3d_json_get(&doc, "added_tokens"), path);
    if (st == L3D_OK) {
        l3d_tok_index_build(&t->ix, t);
        t->whole_first = flag_of(model, "ignore_merges");
        st = set_merges(t, l3d_json_get(model, "merges"), path);
    }
    for (int b = 0; b < 256 && st == L3D_OK; b++) {
        unsigned char c = (unsigned char)b;
        if ((t->byte_id[b] = l3d_tok_index_find(&t->ix, t, &c, 1)) < 0)
            st = l3d_error(L3D_ERR_FORMAT, "%s: the vocabulary has no token for byte 0x%02X: a "
                           "byte-level BPE vocabulary holds all 256 bytes", path, b);
    }
    if (st == L3D_OK) st = l3d_tok_compile(t, pat, path);
    l3d_json_free(&doc);
    return st;
}
