/* GPT-2's encoder.json (src/tokenizer/bpe.c): parsed from the input's bytes, then GPT-2's own
 * vocab.bpe header line with no merges; an accepted vocabulary gives each token's bytes. */
#include "fuzz.h"
#include "llm3d/tokenizer.h"
#include "tokenizer/tokenizer-impl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *js = fuzz_text(data, size);
    struct l3d_tokenizer *t = l3d_tok_new();
    char merges[] = "#version: 0.2\n";
    if (l3d_tok_parse_encoder_json(t, "encoder.json", js, size) == L3D_OK &&
        l3d_tok_parse_merges(t, "vocab.bpe", merges, strlen(merges)) == L3D_OK) {
        fuzz_tokens(t, -1);
    }
    l3d_tokenizer_free(t);
    l3d_free(js);
    return 0;
}
