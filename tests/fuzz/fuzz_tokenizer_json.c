/* A Hugging Face tokenizer.json (src/tokenizer/hf.c, through the JSON reader): parsed from the
 * input's bytes, which also go through NFC twice; an accepted tokenizer decodes each of its
 * tokens, and encodes the input's first bytes (with its special tokens allowed, and without) to
 * ids that decode to those bytes, NFC composed where its normalizer asks for it, unless encoding
 * returns an error (its pattern matched the empty string or PCRE2 gave up). */
#include "fuzz.h"
#include "llm3d/tokenizer.h"
#include "tokenizer/tokenizer-impl.h"

static void round_trip(struct l3d_encoder *e, const struct l3d_tokenizer *t, const char *s,
                       size_t n, bool special) {
    struct l3d_ids ids = {0};
    struct l3d_nfc nfc = {0};
    size_t cap = 0, m = n;
    char *back = NULL;
    /* an error: the file's pattern matched empty (through \K or a lookahead) or hit PCRE2's limit */
    l3d_status st = special ? l3d_encoder_encode_special(e, s, n, &ids)
                            : l3d_encoder_encode(e, s, n, &ids);
    size_t got = l3d_tokenizer_decode(t, ids.v, ids.n, &back, &cap);
    /* with special tokens, NFC runs between them: the whole's NFC is not the reference there */
    const char *want = t->nfc ? l3d_tok_nfc(&nfc, s, n, &m) : s;
    if (st == L3D_OK && (!special || !t->nfc) && (got != m || (m && memcmp(back, want, m))))
        abort();
    free(back);
    l3d_nfc_free(&nfc);
    l3d_ids_free(&ids);
}

/* NFC of any bytes (normalize.c, which an accepted Qwen2-style file runs): composing again
 * changes nothing (NFC is idempotent, invalid bytes stay). */
static void nfc_twice(const char *s, size_t n) {
    struct l3d_nfc a = {0}, b = {0};
    size_t m1, m2;
    const char *once = l3d_tok_nfc(&a, s, n, &m1), *twice = l3d_tok_nfc(&b, once, m1, &m2);
    if (m1 != m2 || (m1 && memcmp(once, twice, m1))) abort();
    l3d_nfc_free(&a);
    l3d_nfc_free(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *js = fuzz_text(data, size);
    nfc_twice(js, size);
    struct l3d_tokenizer *t = l3d_tok_new();
    if (l3d_tok_parse_hf(t, "tokenizer.json", js, size) == L3D_OK) {
        fuzz_tokens(t, 4096);
        struct l3d_encoder *e = l3d_encoder_init(t);
        size_t n = size < 256 ? size : 256;
        round_trip(e, t, js, n, false);
        round_trip(e, t, js, n, true);
        l3d_encoder_free(e);
    }
    l3d_tokenizer_free(t);
    l3d_free(js);
    return 0;
}
