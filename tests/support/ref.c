/* Double-precision reference kernels and finite differences. See ref.h. */
#include "support/ref.h"

#include <math.h>
#include <stdlib.h>

#include "llm3d/core.h"

void ref_matmul_forward(double *out, const double *inp, const double *weight, const double *bias,
                        int64_t N, int64_t C, int64_t OC) {
    for (int64_t n = 0; n < N; n++) {
        for (int64_t o = 0; o < OC; o++) {
            double s = bias ? bias[o] : 0.0;
            for (int64_t c = 0; c < C; c++) s += inp[n * C + c] * weight[o * C + c];
            out[n * OC + o] = s;
        }
    }
}

void ref_encoder_forward(double *out, const int32_t *tokens, const double *wte, const double *wpe,
                         int64_t vocab_start, int64_t vocab_count, int64_t B, int64_t T, int64_t C) {
    for (int64_t b = 0; b < B; b++) {
        for (int64_t t = 0; t < T; t++) {
            double *o = out + (b * T + t) * C;
            int64_t row = (int64_t)tokens[b * T + t] - vocab_start;
            int in_range = row >= 0 && row < vocab_count;
            for (int64_t c = 0; c < C; c++) {
                double x = in_range ? wte[row * C + c] : 0.0;
                if (wpe) x += wpe[t * C + c];
                o[c] = x;
            }
        }
    }
}

void ref_layernorm_forward(double *out, double *mean, double *rstd, const double *inp,
                           const double *weight, const double *bias, int64_t N, int64_t C) {
    for (int64_t n = 0; n < N; n++) {
        const double *x = inp + n * C;
        double m = 0.0;
        for (int64_t c = 0; c < C; c++) m += x[c];
        m /= (double)C;
        double var = 0.0;
        for (int64_t c = 0; c < C; c++) var += (x[c] - m) * (x[c] - m);
        var /= (double)C;
        double s = 1.0 / sqrt(var + REF_LN_EPS);
        for (int64_t c = 0; c < C; c++) out[n * C + c] = (x[c] - m) * s * weight[c] + bias[c];
        if (mean) mean[n] = m;
        if (rstd) rstd[n] = s;
    }
}

void ref_attention_forward(double *out, double *att, const double *qkv, int64_t B, int64_t T,
                           int64_t NH, int64_t HS) {
    const int64_t C = NH * HS;
    const double scale = 1.0 / sqrt((double)HS);
    double *p = malloc((size_t)(T > 0 ? T : 1) * sizeof *p);
    L3D_ASSERT(p != NULL);
    for (int64_t b = 0; b < B; b++) {
        for (int64_t h = 0; h < NH; h++) {
            for (int64_t t = 0; t < T; t++) {
                const double *q = qkv + (b * T + t) * 3 * C + h * HS;
                double mx = -INFINITY;
                for (int64_t t2 = 0; t2 <= t; t2++) {
                    const double *k = qkv + (b * T + t2) * 3 * C + C + h * HS;
                    double s = 0.0;
                    for (int64_t i = 0; i < HS; i++) s += q[i] * k[i];
                    p[t2] = s * scale;
                    if (p[t2] > mx) mx = p[t2];
                }
                double sum = 0.0;
                for (int64_t t2 = 0; t2 <= t; t2++) {
                    p[t2] = exp(p[t2] - mx);
                    sum += p[t2];
                }
                for (int64_t t2 = 0; t2 <= t; t2++) p[t2] /= sum;
                for (int64_t t2 = t + 1; t2 < T; t2++) p[t2] = 0.0;
                double *o = out + (b * T + t) * C + h * HS;
                for (int64_t i = 0; i < HS; i++) {
                    double s = 0.0;
                    for (int64_t t2 = 0; t2 <= t; t2++)
                        s += p[t2] * qkv[(b * T + t2) * 3 * C + 2 * C + h * HS + i];
                    o[i] = s;
                }
                if (att)
                    for (int64_t t2 = 0; t2 < T; t2++) att[((b * NH + h) * T + t) * T + t2] = p[t2];
            }
        }
    }
    free(p);
}

void ref_attention_lse(double *lse, const double *qkv, int64_t B, int64_t T, int64_t NH,
                       int64_t HS) {
    const int64_t C = NH * HS;
    const double scale = 1.0 / sqrt((double)HS);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < NH; h++)
            for (int64_t t = 0; t < T; t++) {
                const double *q = qkv + (b * T + t) * 3 * C + h * HS;
                double mx = -INFINITY, sum = 0.0;
                for (int pass = 0; pass < 2; pass++)
                    for (int64_t t2 = 0; t2 <= t; t2++) {
                        const double *k = qkv + (b * T + t2) * 3 * C + C + h * HS;
                        double s = 0.0;
                        for (int64_t i = 0; i < HS; i++) s += q[i] * k[i];
                        s *= scale;
                        if (pass == 0) mx = s > mx ? s : mx;
                        else sum += exp(s - mx);
                    }
                lse[(b * NH + h) * T + t] = mx + log(sum);
            }
}

void ref_gelu_forward(double *out, const double *inp, int64_t N) {
    const double k = sqrt(2.0 / 3.14159265358979323846);
    for (int64_t i = 0; i < N; i++) {
        double x = inp[i];
        out[i] = 0.5 * x * (1.0 + tanh(k * (x + 0.044715 * x * x * x)));
    }
}

void ref_residual_forward(double *out, const double *a, const double *b, int64_t N) {
    for (int64_t i = 0; i < N; i++) out[i] = a[i] + b[i];
}

void ref_xent_loss(double *loss, const double *logits, const int32_t *targets, int64_t vocab_start,
                   int64_t N, int64_t Vl, int64_t Vvalid) {
    for (int64_t n = 0; n < N; n++) {
        const double *l = logits + n * Vl;
        double mx = -INFINITY;
        for (int64_t j = 0; j < Vvalid; j++)
            if (l[j] > mx) mx = l[j];
        double s = 0.0;
        for (int64_t j = 0; j < Vvalid; j++) s += exp(l[j] - mx);
        int64_t tcol = (int64_t)targets[n] - vocab_start;
        double tl = (tcol >= 0 && tcol < Vvalid) ? l[tcol] : 0.0;
        loss[n] = mx + log(s) - tl;
    }
}

void ref_adamw(double *param, double *m, double *v, const double *grad, int64_t n, double lr,
               double beta1, double beta2, double eps, double wd, double bc1, double bc2) {
    for (int64_t i = 0; i < n; i++) {
        double g = grad[i];
        m[i] = beta1 * m[i] + (1.0 - beta1) * g;
        v[i] = beta2 * v[i] + (1.0 - beta2) * g * g;
        double mhat = m[i] / bc1, vhat = v[i] / bc2;
        param[i] -= lr * (mhat / (sqrt(vhat) + eps) + wd * param[i]);
    }
}

void ref_to_double(double *dst, const float *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = (double)src[i];
}

void ref_to_float(float *dst, const double *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = (float)src[i];
}

void ref_fill_normal(float *x, int64_t n, float mean, float std, uint64_t seed, uint64_t stream) {
    for (int64_t i = 0; i < n; i++) x[i] = mean + std * l3d_rng_normal(seed, stream, (uint64_t)i);
}

uint16_t *ref_bf16_normal(int64_t n, float std, uint64_t seed) {
    float *f = malloc((size_t)n * sizeof *f);
    uint16_t *h = malloc((size_t)n * sizeof *h);
    ref_fill_normal(f, n, 0.0f, std, seed, 1);
    for (int64_t i = 0; i < n; i++) h[i] = l3d_f32_to_bf16(f[i]);
    free(f);
    return h;
}

void ref_fill_tokens(int32_t *x, int64_t n, int32_t lo, int32_t hi, uint64_t seed, uint64_t stream) {
    L3D_ASSERT(hi > lo);
    for (int64_t i = 0; i < n; i++)
        x[i] = lo + (int32_t)(l3d_rng_u64(seed, stream, (uint64_t)i) % (uint64_t)(hi - lo));
}

double ref_dot(const double *a, const double *b, int64_t n) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

double ref_fd_partial(double (*f)(void *ctx), void *ctx, double *x, int64_t i, double eps) {
    double x0 = x[i];
    eps *= fabs(x0) > 1.0 ? fabs(x0) : 1.0; /* relative to a large x, so that x +- eps != x */
    x[i] = x0 + eps;
    double fp = f(ctx);
    x[i] = x0 - eps;
    double fm = f(ctx);
    x[i] = x0;
    /* Divide by the step actually taken, which rounding makes differ from 2 eps. */
    return (fp - fm) / ((x0 + eps) - (x0 - eps));
}

void ref_fd_grad(double (*f)(void *ctx), void *ctx, double *x, int64_t n, double eps,
                 double *grad) {
    for (int64_t i = 0; i < n; i++) grad[i] = ref_fd_partial(f, ctx, x, i, eps);
}

void ref_gqa_expand(double *full, const double *qkv, int64_t B, int64_t T, int64_t NH,
                    int64_t NKV, int64_t HS) {
    const int64_t rep = NH / NKV, CQ = (NH + 2 * NKV) * HS, C = NH * HS;
    for (int64_t bt = 0; bt < B * T; bt++)
        for (int64_t h = 0; h < NH; h++)
            for (int64_t i = 0; i < HS; i++) {
                const double *r = qkv + bt * CQ;
                double *f = full + bt * 3 * C;
                f[h * HS + i] = r[h * HS + i];
                f[C + h * HS + i] = r[(NH + h / rep) * HS + i];
                f[2 * C + h * HS + i] = r[(NH + NKV + h / rep) * HS + i];
            }
}

void ref_rmsnorm_forward(double *out, double *rstd, const double *inp, const double *weight,
                         int64_t N, int64_t C, double eps) {
    for (int64_t n = 0; n < N; n++) {
        const double *x = inp + n * C;
        double ms = 0.0;
        for (int64_t c = 0; c < C; c++) ms += x[c] * x[c];
        double r = 1.0 / sqrt(ms / (double)C + eps);
        for (int64_t c = 0; c < C; c++) out[n * C + c] = x[c] * r * weight[c];
        if (rstd) rstd[n] = r;
    }
}

void ref_rope_forward(double *out, const double *qkv, const double *inv_freq, const int32_t *pos,
                      int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS) {
    const int64_t CQ = (NH + 2 * NKV) * HS, H2 = HS / 2;
    for (int64_t i = 0; i < B * T * CQ; i++) out[i] = qkv[i];
    for (int64_t bt = 0; bt < B * T; bt++)
        for (int64_t h = 0; h < NH + NKV; h++)
            for (int64_t i = 0; i < H2; i++) {
                double a = (double)pos[bt % T] * inv_freq[i];
                const double *x = qkv + bt * CQ + h * HS;
                double *o = out + bt * CQ + h * HS;
                o[i] = x[i] * cos(a) - x[i + H2] * sin(a);
                o[i + H2] = x[i + H2] * cos(a) + x[i] * sin(a);
            }
}

void ref_swiglu_forward(double *out, const double *inp, int64_t N, int64_t H) {
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < H; c++) {
            double g = inp[n * 2 * H + c], u = inp[n * 2 * H + H + c];
            out[n * H + c] = g / (1.0 + exp(-g)) * u;
        }
}
