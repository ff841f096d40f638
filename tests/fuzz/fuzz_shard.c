/* Token shard header and contents (src/data/shard.c), both formats (uint16 and llm.c's uint32 Llama
 * 3 shards): l3d_data_open on a file of the input's bytes, with GPT-2's vocabulary; an accepted
 * shard holds at least 2 tokens, each inside it. */
#include "fuzz.h"
#include "llm3d/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file("train_000000.bin", data, size);
    struct l3d_data *d = NULL;
    if (l3d_data_open(&d, path, 50257) != L3D_OK) return 0;
    int64_t n = l3d_data_file_ntok(d, 0);
    if (n < 2) abort();
    int32_t tok[256];
    for (int64_t i = 0; i < n; i += 256) {
        int64_t k = n - i < 256 ? n - i : 256;
        l3d_data_file_read(d, 0, i, k, tok);
        for (int64_t j = 0; j < k; j++)
            if (tok[j] < 0 || tok[j] >= 50257) abort(); /* readable, and inside the vocabulary */
    }
    l3d_data_free(d);
    return 0;
}
