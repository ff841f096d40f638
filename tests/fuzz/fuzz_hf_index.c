/* A Hugging Face folder's index (src/ckpt/safetensors.c, src/ckpt/hf.c): the input as
 * model.safetensors.index.json beside a fixed config.json (GPT-2, 1 layer, 4 channels) and two
 * fixed shards (a.safetensors: transformer.wte.weight, F32; b.safetensors: transformer.wpe.weight
 * and transformer.ln_f.weight, BF16); the folder opened (l3d_st_open_dir), then its config read, which checks it against the
 * headers (l3d_hf_config_read). An accepted index lists every tensor of the shards it names. */
#include "fuzz.h"
#include "llm3d/hf.h"

static const char config[] = "{\"model_type\": \"gpt2\", \"n_layer\": 1, \"n_embd\": 4, "
                             "\"n_head\": 1, \"vocab_size\": 2, \"n_positions\": 2}";

/* A safetensors file of header `hdr` and `data` zero bytes. */
static void shard(const char *name, const char *hdr, size_t data) {
    size_t h = strlen(hdr);
    uint8_t b[256] = {0};
    if (8 + h + data > sizeof b) abort();
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)h >> (8 * i));
    memcpy(b + 8, hdr, h);
    (void)fuzz_file(name, b, 8 + h + data);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int ready;
    if (!ready) {
        (void)fuzz_file("config.json", (const uint8_t *)config, sizeof config - 1);
        shard("a.safetensors", "{\"transformer.wte.weight\":{\"dtype\":\"F32\",\"shape\":[2,4],"
              "\"data_offsets\":[0,32]}}", 32);
        shard("b.safetensors", "{\"transformer.wpe.weight\":{\"dtype\":\"BF16\",\"shape\":[2,4],"
              "\"data_offsets\":[0,16]},\"transformer.ln_f.weight\":{\"dtype\":\"BF16\","
              "\"shape\":[4],\"data_offsets\":[16,24]}}", 24);
        ready = 1;
    }
    (void)fuzz_file("model.safetensors.index.json", data, size);
    struct l3d_st st;
    if (l3d_st_open_dir(&st, fuzz_dir()) == L3D_OK) {
        if (st.nfiles < 1 || st.n < 1) abort(); /* accepted: at least one shard, one tensor */
        l3d_st_close(&st);
    }
    struct l3d_model_spec cfg;
    (void)l3d_hf_config_read(fuzz_dir(), &cfg);
    return 0;
}
