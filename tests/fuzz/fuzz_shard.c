/* Token shard header and contents (src/data/shard.c): l3d_data_open on a file of the input's
 * bytes, with GPT-2's vocabulary; an accepted shard holds at least 2 tokens, each inside it. */
#include "fuzz.h"
#include "llm3d/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file("train_000000.bin", data, size);
    struct l3d_data *d = NULL;
    if (l3d_data_open(&d, path, 50257) != L3D_OK) return 0;
    int64_t n = 0;
    const uint16_t *tok = l3d_data_file_tokens(d, 0, &n);
    if (n < 2) abort();
    for (int64_t i = 0; i < n; i++)
        if (tok[i] >= 50257) abort(); /* every token readable, and inside the vocabulary */
    l3d_data_free(d);
    return 0;
}
