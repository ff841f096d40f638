/* GPT-2's vocab.bpe (src/tokenizer/bpe.c): the merges of the input's bytes over a fixed
 * encoder.json (tests/fuzz/data/encoder.json, a 320-token vocabulary llm3d tokenizer train
 * learnt). */
#include "fuzz.h"
#include "llm3d/tokenizer.h"
#include "tokenizer/tokenizer-impl.h"

static char *js;
static size_t njs;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!js) js = fuzz_data_file("encoder.json", &njs);
    struct l3d_tokenizer *t = l3d_tok_new();
    if (l3d_tok_parse_encoder_json(t, "encoder.json", js, njs) != L3D_OK) abort();
    char *txt = fuzz_text(data, size);
    if (l3d_tok_parse_merges(t, "vocab.bpe", txt, size) == L3D_OK && l3d_tokenizer_eot(t) >= 0 &&
        l3d_tokenizer_eot(t) >= l3d_tokenizer_vocab_size(t))
        abort();
    l3d_tokenizer_free(t);
    l3d_free(txt);
    return 0;
}
