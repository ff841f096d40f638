/* The planner's system profile (src/plan/profile.c): l3d_profile_parse on the input's text; an
 * accepted profile answers a matrix-product efficiency in (0, 1.5], the range its points may take
 * (a measured rate may pass a nominal peak). */
#include <math.h>

#include "fuzz.h"
#include "llm3d/plan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = fuzz_text(data, size);
    struct l3d_profile p;
    if (l3d_profile_parse(&p, text, "(input)") == L3D_OK) {
        for (double f = 1e3; f < 1e16; f *= 31.0) {
            double e = l3d_profile_gemm_eff(&p, f);
            if (!(e > 0 && e <= 1.5 + 1e-12)) {
                fprintf(stderr, "efficiency %g at %g FLOP\n", e, f);
                abort();
            }
        }
    }
    l3d_free(text);
    return 0;
}
