/* llm.c's tokenizer file (gpt2_tokenizer.bin; src/tokenizer/bpe.c): parsed from the input's
 * bytes; an accepted vocabulary decodes each of its tokens. */
#include "fuzz.h"
#include "llm3d/tokenizer.h"
#include "tokenizer/tokenizer-impl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct l3d_tokenizer *t = NULL;
    if (l3d_tok_parse_llmc(&t, "(input)", (const char *)data, size) != L3D_OK) return 0;
    fuzz_tokens(t, 4096);
    l3d_tokenizer_free(t);
    return 0;
}
