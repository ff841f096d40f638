/* Token shard header and contents (src/data/shard.c): l3d_data_open on a file of the input's
 * bytes, with GPT-2's vocabulary; an accepted shard is read through a loader batch. */
#include "fuzz.h"
#include "llm3d/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file("train_000000.bin", data, size);
    struct l3d_data *d = NULL;
    if (l3d_data_open(&d, path, 50257) != L3D_OK) return 0;
    int64_t n = 0;
    const uint16_t *tok = l3d_data_file_tokens(d, 0, &n);
    volatile uint32_t sum = 0;
    for (int64_t i = 0; i < n; i++) sum += tok[i]; /* every token readable */
    l3d_data_free(d);
    return 0;
}
