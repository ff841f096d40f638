/* safetensors header and tensors (src/ckpt/safetensors.c): l3d_st_open_file on a file of the
 * input's bytes, then every tensor of a handled dtype read as fp32. An accepted header must place
 * every tensor inside the file, with the bytes its shape and dtype need. */
#include "fuzz.h"
#include "llm3d/hf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file("model.safetensors", data, size);
    struct l3d_st st = {0};
    if (l3d_st_open_file(&st, path) == L3D_OK) {
        for (int i = 0; i < st.n; i++) {
            const struct l3d_st_tensor *t = &st.t[i];
            if (t->offset < 8 || t->bytes < 0 || t->offset + t->bytes > (int64_t)size)
                abort(); /* accepted: it must lie in the file */
            if (!t->handled || t->count > (1 << 20)) continue;
            float *out = l3d_alloc((size_t)(t->count + 1) * sizeof(float), "fuzz tensor");
            (void)l3d_st_read_f32(&st, t, out);
            l3d_free(out);
        }
    }
    l3d_st_close(&st);
    return 0;
}
