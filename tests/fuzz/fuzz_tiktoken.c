/* A tiktoken rank file (lines "base64 rank"; src/tokenizer/tiktoken.c): parsed from the input's
 * bytes; an accepted vocabulary (only a file of one of the known rank counts is) decodes each of
 * its tokens and encodes its own first bytes back to them. */
#include "fuzz.h"
#include "llm3d/tokenizer.h"
#include "tokenizer/tokenizer-impl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *txt = fuzz_text(data, size);
    struct l3d_tokenizer *t = l3d_tok_new();
    if (l3d_tok_parse_tiktoken(t, "(input)", txt, size) == L3D_OK) {
        fuzz_tokens(t, 4096);
        struct l3d_encoder *e = l3d_encoder_init(t);
        struct l3d_ids ids = {0};
        size_t n = size < 256 ? size : 256, cap = 0;
        char *back = NULL;
        if (l3d_encoder_encode(e, txt, n, &ids) != L3D_OK) abort(); /* the known patterns */
        if (l3d_tokenizer_decode(t, ids.v, ids.n, &back, &cap) != n || (n && memcmp(back, txt, n)))
            abort(); /* byte-level BPE gives every byte string back */
        free(back);
        l3d_ids_free(&ids);
        l3d_encoder_free(e);
    }
    l3d_tokenizer_free(t);
    l3d_free(txt);
    return 0;
}
