/* llm.c's tokenizer file (gpt2_tokenizer.bin; src/tokenizer/bpe.c): parsed from the input's
 * bytes; an accepted vocabulary decodes each of its tokens. */
#include "fuzz.h"
#include "llm3d/tokenizer.h"
#include "tokenizer/tokenizer-impl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct l3d_tokenizer *t = NULL;
    if (l3d_tok_parse_llmc(&t, "(input)", (const char *)data, size) != L3D_OK) return 0;
    int V = l3d_tokenizer_vocab_size(t);
    for (int id = 0; id < V && id < 4096; id++) {
        size_t n = 0;
        const unsigned char *s = l3d_tokenizer_token(t, id, &n);
        if (n && !s) abort();
    }
    l3d_tokenizer_free(t);
    return 0;
}
