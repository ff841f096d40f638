/*
 * The rotary embedding's frequencies (include/llm3d/model.h): computed on the host once, copied to
 * the device for the backend's rope kernels (l3d_be_rope_forward).
 *
 * Su et al. 2021 ("RoFormer", eq. 15): theta_i = base^(-2i/d) for the pair i of a head of size d.
 * Llama 3.1's scaling (Dubey et al. 2024, "The Llama 3 Herd of Models"; the formula as Hugging
 * Face's transformers defines it for rope_type "llama3", modeling_rope_utils.py,
 * _compute_llama3_parameters): with wavelength w = 2 pi / theta_i, L = original_context,
 *   w > L / low_freq_factor          -> theta_i / factor             (low frequencies: stretched)
 *   w < L / high_freq_factor         -> theta_i                      (high frequencies: kept)
 *   otherwise, s = (L / w - low_freq_factor) / (high_freq_factor - low_freq_factor):
 *                                    -> (1 - s) theta_i / factor + s theta_i
 * Computed in double and rounded to fp32 once (transformers computes in fp32: a few ulp apart).
 */
#include <math.h>

#include "llm3d/model.h"

void l3d_rope_inv_freq(const struct l3d_model_spec *m, float *out) {
    const int HS = l3d_model_head_dim(m);
    const struct l3d_rope *r = &m->rope;
    const double theta = r->theta > 0.0 ? r->theta : 10000.0, pi = 3.14159265358979323846;
    for (int i = 0; i < HS / 2; i++) {
        double f = pow(theta, -2.0 * i / HS);
        if (r->factor > 0.0) {
            double L = r->original_context, w = 2.0 * pi / f;
            if (w > L / r->low_freq_factor) {
                f /= r->factor;
            } else if (!(w < L / r->high_freq_factor)) {
                double lo = r->low_freq_factor, hi = r->high_freq_factor;
                double s = (L / w - lo) / (hi - lo);
                f = (1.0 - s) * f / r->factor + s * f;
            }
        }
        out[i] = (float)f;
    }
}
