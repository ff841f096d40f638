/* llm.c GPT-2 checkpoint header (src/ckpt/llmc.c): l3d_ckpt_read_llmc_config on a file of the
 * input's bytes; an accepted header has a model l3d_gpt_param_count can size without overflow. */
#include "fuzz.h"
#include "llm3d/ckpt.h"
#include "llm3d/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file("model.bin", data, size);
    struct l3d_model_spec cfg;
    if (l3d_ckpt_read_llmc_config(path, &cfg) != L3D_OK) return 0;
    if (l3d_gpt_param_count(&cfg) <= 0 || (size_t)l3d_gpt_param_count(&cfg) * 4 + 1024 != size)
        abort(); /* accepted: the header must describe this file exactly */
    return 0;
}
