/* Training-checkpoint manifest (src/ckpt/manifest.c): the input's text parsed as dir/manifest is
 * and its layout checked against its model, as a load does before reading any rank file. Formats
 * 1-3 carry no checksum line, so mutations of those seeds reach every record's parser. */
#include "ckpt/ckpt-impl.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = fuzz_text(data, size);
    (void)l3d_ckpt_manifest_check(text, size);
    l3d_free(text);
    return 0;
}
