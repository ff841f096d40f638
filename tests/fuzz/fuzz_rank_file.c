/* A rank file of a training checkpoint (header, size, checksum; src/ckpt/load.c): the input's
 * bytes as rank_00000.bin beside a fixed manifest (tests/fuzz/data/rank/manifest, format 4, one
 * rank of a 1-layer model), converted to an llm.c file as `llm3d convert` does. */
#include "fuzz.h"
#include "llm3d/ckpt.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static char *mf;
    static size_t nmf;
    if (!mf) {
        mf = fuzz_data_file("rank/manifest", &nmf);
        fuzz_file("manifest", (const uint8_t *)mf, nmf);
    }
    fuzz_file("rank_00000.bin", data, size);
    char out[512];
    snprintf(out, sizeof out, "%s/out/model.bin", fuzz_dir());
    (void)l3d_ckpt_export_llmc(fuzz_dir(), out);
    return 0;
}
