/* The JSON reader (src/core/json.c) every imported file goes through (Hugging Face config.json,
 * tokenizer.json, safetensors headers, metrics, traces): any bytes, parsed, walked and freed. */
#include "fuzz.h"
#include "llm3d/json.h"

static size_t walk(const struct l3d_json *v) {
    size_t n = 1;
    for (size_t i = 0; i < v->count; i++) n += walk(&v->items[i]);
    int64_t x;
    (void)l3d_json_int(v, &x);
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct l3d_json v;
    if (l3d_json_parse(&v, (const char *)data, size, "fuzz.json") == L3D_OK) {
        (void)walk(&v);
        (void)l3d_json_get(&v, "model_type");
    }
    l3d_json_free(&v);
    return 0;
}
