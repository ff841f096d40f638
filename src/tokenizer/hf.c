/*
 * Hugging Face tokenizer.json (the `tokenizers` library's serialisation): the byte-level BPE
 * tokenizers of GPT-2, Llama 3 and Qwen2 style. What is read (a default where a key is absent or
 * null; a boolean that is neither true nor false is refused, as the library refuses it):
 *   model: {"type": "BPE" (absent: BPE, as the library reads a model with merges), "vocab":
 *          {spelled token: id}, "merges": ["a b", ...] or [["a", "b"], ...] (required, a list),
 *          "ignore_merges": bool (false), "byte_fallback": false, "dropout": null or 0,
 *          "continuing_subword_prefix" and "end_of_word_suffix": null or ""}; tokens spelled
 *          through GPT-2's bytes_to_unicode; unk_token and fuse_unk unused (all bytes are tokens)
 *   pre_tokenizer (required): {"type": "ByteLevel", "use_regex": true (true),
 *          "add_prefix_space": false (false)} (GPT-2's pattern), or a "Sequence" of
 *          {"type": "Split", "pattern": {"Regex": R}, "behavior": "Isolated", "invert": false
 *          (false)} and {"type": "ByteLevel", "use_regex": false, "add_prefix_space": false};
 *          trim_offsets moves offsets only
 *   decoder: {"type": "ByteLevel"} or none; added_tokens: none or [{"id", "content"}] (content as
 *          written, not spelled; lstrip, rstrip, single_word false); their text in user text is
 *          the token only where the caller allows it (l3d_encoder_encode_special: the library's
 *          own encode always does), "special" or not
 *   normalizer: none, or {"type": "NFC"} (Qwen2's: Unicode canonical composition of the text
 *          between special tokens before pre-tokenisation, src/tokenizer/normalize.c)
 *   truncation, padding: none (llm3d encodes whole texts)
 *   post_processor: ignored (llm3d adds begin-of-text itself where a command asks for it).
 * Anything else (WordPiece, Unigram or WordLevel models, other normalizers, other pre-tokenizers
 * or decoders, any other value of the options above) is refused, naming the key and the value.
 * tests/test_tokenizer_json.c has each key's default and refusal.
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

/* The boolean member key of v (`what` names v in errors) into *out: def when absent or null. */
static l3d_status bool_of(const struct l3d_json *v, const char *key, bool def, const char *path,
                          const char *what, bool *out) {
    const struct l3d_json *f = l3d_json_get(v, key);
    *out = f && f->type == L3D_JSON_BOOL ? f->boolean : def;
    if (f && f->type != L3D_JSON_BOOL && f->type != L3D_JSON_NULL)
        return l3d_error(L3D_ERR_FORMAT, "%s: %s's %s is %s, not true or false", path, what, key,
                         l3d_json_type_name(f->type));
    return L3D_OK;
}

/* The boolean member key of v is `want` (or absent, or null): the only setting llm3d has. */
static l3d_status bool_is(const struct l3d_json *v, const char *key, bool want, const char *path,
                          const char *what) {
    bool b;
    l3d_status st = bool_of(v, key, want, path, what, &b);
    if (st == L3D_OK && b != want)
        st = l3d_error(L3D_ERR_FORMAT, "%s: %s's %s is %s, which llm3d does not support: it reads "
                       "%s %s only", path, what, key, b ? "true" : "false", key,
                       want ? "true" : "false");
    return st;
}

/* One ByteLevel pre-tokenizer: *regex receives whether it applies GPT-2's pattern (use_regex,
 * true when absent); add_prefix_space must be false (absent: false); trim_offsets moves offsets
 * only, which llm3d does not give. */
static l3d_status byte_level(const struct l3d_json *p, const char *path, bool *regex) {
    const char *what = "the ByteLevel pre-tokenizer";
    bool trim;
    l3d_status st = bool_is(p, "add_prefix_space", false, path, what);
    if (st == L3D_OK) st = bool_of(p, "trim_offsets", true, path, what, &trim);
    if (st == L3D_OK) st = bool_of(p, "use_regex", true, path, what, regex);
    return st;
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
        if (st == L3D_OK && !regex)
            return l3d_error(L3D_ERR_FORMAT, "%s: a ByteLevel pre-tokenizer alone with use_regex "
                             "false (the whole text one pre-token) is not supported: set it true "
                             "for GPT-2's pattern, or put a Split before it", path);
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
    if (!re || !beh || strcmp(beh, "Isolated") != 0)
        return l3d_error(L3D_ERR_FORMAT, "%s: the Split pre-tokenizer is supported with a "
                         "{\"Regex\": ...} pattern, behavior Isolated and invert false only", path);
    l3d_status st = bool_is(split, "invert", false, path, "the Split pre-tokenizer");
    if (st == L3D_OK) st = byte_level(&seq->items[1], path, &regex);
    if (st == L3D_OK && regex)
        return l3d_error(L3D_ERR_FORMAT, "%s: a ByteLevel pre-tokenizer with use_regex after a "
                         "Split is not supported", path);
    *pat = re;
    return st;
}

/* The BPE model's options: type "BPE" (absent: BPE where there are merges, as the `tokenizers`
 * library reads a model without one); byte_fallback false, no dropout, no subword prefix or word
 * suffix; *whole receives ignore_merges (false when absent). unk_token and fuse_unk matter only
 * for a text with a byte no token has, which a byte-level vocabulary cannot meet. */
static l3d_status check_model(const struct l3d_json *model, const char *path, bool *whole) {
    const char *what = "the BPE model";
    bool bpe = model && (l3d_json_get(model, "type") ? strcmp(type_of(model), "BPE") == 0
                                                     : l3d_json_get(model, "merges") != NULL);
    if (!bpe)
        return l3d_error(L3D_ERR_FORMAT, "%s: the model %s is not supported: llm3d reads BPE "
                         "models only (not WordPiece, Unigram or WordLevel)", path,
                         model && model->type != L3D_JSON_NULL ? type_of(model) : "(none)");
    l3d_status st = bool_is(model, "byte_fallback", false, path, what);
    if (st == L3D_OK) st = bool_of(model, "ignore_merges", false, path, what, whole);
    const struct l3d_json *drop = l3d_json_get(model, "dropout");
    double p = 0;
    if (st == L3D_OK && drop && drop->type != L3D_JSON_NULL && (!l3d_json_num(drop, &p) || p != 0))
        st = l3d_error(L3D_ERR_FORMAT, "%s: the BPE model's dropout is %s: llm3d merges without "
                       "dropout (it makes encoding random); set it to null", path,
                       drop->type == L3D_JSON_NUMBER ? drop->str : l3d_json_type_name(drop->type));
    static const char *const affix[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2 && st == L3D_OK; i++) {
        const struct l3d_json *a = l3d_json_get(model, affix[i]);
        if (a && a->type != L3D_JSON_NULL && (a->type != L3D_JSON_STRING || a->len > 0))
            st = l3d_error(L3D_ERR_FORMAT, "%s: the BPE model's %s is %s%s%s: llm3d reads "
                           "byte-level BPE without one; set it to null", path, affix[i],
                           a->type == L3D_JSON_STRING ? "\"" : "",
                           a->type == L3D_JSON_STRING ? a->str : l3d_json_type_name(a->type),
                           a->type == L3D_JSON_STRING ? "\"" : "");
    }
    return st;
}

/* The parts llm3d refuses: a normalizer other than NFC, another decoder than ByteLevel, a
 * truncation or padding (encoding gives whole texts), then the model's (check_model). *nfc
 * receives whether the text is normalized to NFC, *whole the model's ignore_merges. */
static l3d_status check_features(const struct l3d_json *doc, const char *path, bool *nfc,
                                 bool *whole) {
    const struct l3d_json *norm = l3d_json_get(doc, "normalizer"), *model = l3d_json_get(doc, "model");
    const struct l3d_json *dec = l3d_json_get(doc, "decoder");
    *nfc = norm && norm->type != L3D_JSON_NULL && strcmp(type_of(norm), "NFC") == 0;
    if (norm && norm->type != L3D_JSON_NULL && !*nfc)
        return l3d_error(L3D_ERR_FORMAT, "%s: the normalizer %s is not supported (llm3d reads "
                         "tokenizers without a normalizer or with NFC)", path, type_of(norm));
    if (dec && dec->type != L3D_JSON_NULL && strcmp(type_of(dec), "ByteLevel") != 0)
        return l3d_error(L3D_ERR_FORMAT, "%s: the decoder %s is not supported (ByteLevel only)",
                         path, type_of(dec));
    static const char *const whole_text[] = {"truncation", "padding"};
    for (int i = 0; i < 2; i++) {
        const struct l3d_json *v = l3d_json_get(doc, whole_text[i]);
        if (v && v->type != L3D_JSON_NULL)
            return l3d_error(L3D_ERR_FORMAT, "%s: %s is set (%s): llm3d encodes whole texts, "
                             "neither truncated nor padded; set it to null", path, whole_text[i],
                             l3d_json_type_name(v->type));
    }
    return check_model(model, path, whole);
}

/* The added tokens: absent, null or a list of {"id", "content"} matched as written (lstrip,
 * rstrip and single_word false; special and normalized true or false, both read as special). */
static l3d_status check_added(const struct l3d_json *added, const char *path) {
    if (added && added->type != L3D_JSON_NULL && added->type != L3D_JSON_ARRAY)
        return l3d_error(L3D_ERR_FORMAT, "%s: added_tokens is %s, not a list of {\"id\", "
                         "\"content\"} objects", path, l3d_json_type_name(added->type));
    static const char *const exact[] = {"lstrip", "rstrip", "single_word"};
    static const char *const any[] = {"special", "normalized"};
    char what[64];
    l3d_status st = L3D_OK;
    for (size_t i = 0; added && i < added->count && st == L3D_OK; i++) {
        snprintf(what, sizeof what, "added token %zu", i);
        bool b;
        for (int k = 0; k < 3 && st == L3D_OK; k++)
            st = bool_is(&added->items[i], exact[k], false, path, what);
        for (int k = 0; k < 2 && st == L3D_OK; k++)
            st = bool_of(&added->items[i], any[k], true, path, what, &b);
    }
    return st;
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
    if (st == L3D_OK) st = check_features(&doc, path, &t->nfc, &t->whole_first);
    if (st == L3D_OK) st = check_added(l3d_json_get(&doc, "added_tokens"), path);
    if (st == L3D_OK) st = pre_tokenizer(&doc, path, &pat);
    if (st == L3D_OK && (!vocab || vocab->type != L3D_JSON_OBJECT || vocab->count == 0))
        st = l3d_error(L3D_ERR_FORMAT, "%s: the BPE model has no vocab object", path);
    if (st == L3D_OK) st = set_tokens(t, vocab, l3d_json_get(&doc, "added_tokens"), path);
    if (st == L3D_OK) {
        l3d_tok_index_build(&t->ix, t);
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
