/* AdamW, learning-rate schedule, gradient clipping (include/llm3d/optim.h). */
#include <math.h>
#include <string.h>

#include "llm3d/optim.h"

void l3d_adamw_init(struct l3d_adamw *opt, const struct l3d_adamw_hparams *hp, int64_t start,
                    int64_t n) {
    opt->hp = *hp;
    opt->start = start;
    opt->n = n;
    opt->t = 0;
    opt->m = l3d_calloc((size_t)n * sizeof(float), "adamw first moment");
    opt->v = l3d_calloc((size_t)n * sizeof(float), "adamw second moment");
}

void l3d_adamw_free(struct l3d_adamw *opt) {
    l3d_free(opt->m);
    l3d_free(opt->v);
    opt->m = opt->v = NULL;
}

void l3d_adamw_step(struct l3d_adamw *opt, struct l3d_backend *be, float *params,
                    const float *grads, float grad_scale, const struct l3d_tensor_info *tensors,
                    int ntensors, float lr) {
    const struct l3d_adamw_hparams *hp = &opt->hp;
    opt->t++;
    float bc1 = 1.0f - powf(hp->beta1, (float)opt->t);
    float bc2 = 1.0f - powf(hp->beta2, (float)opt->t);
    int64_t s0 = opt->start, s1 = opt->start + opt->n;
    for (int i = 0; i < ntensors; i++) {
        const struct l3d_tensor_info *t = &tensors[i];
        int64_t lo = t->offset > s0 ? t->offset : s0;
        int64_t hi = t->offset + t->count < s1 ? t->offset + t->count : s1;
        if (lo >= hi) continue;
        l3d_be_adamw(be, L3D_F32, params + lo, opt->m + (lo - s0), opt->v + (lo - s0),
                     grads + (lo - s0), grad_scale, hi - lo, lr, hp->beta1, hp->beta2, hp->eps,
                     t->decay ? hp->weight_decay : 0.0f, bc1, bc2);
    }
}

float l3d_lr_at(const struct l3d_lr_schedule *s, int step) {
    if (s->warmup_steps > 0 && step < s->warmup_steps)
        return s->max_lr * (float)(step + 1) / (float)s->warmup_steps;
    int decay_steps = s->total_steps - s->warmup_steps;
    if (decay_steps <= 1) return s->max_lr;
    double frac = (double)(step - s->warmup_steps) / (double)(decay_steps - 1);
    if (frac > 1.0) frac = 1.0;
    double coeff = 0.5 * (1.0 + cos(3.14159265358979323846 * frac));
    return (float)(s->min_lr + coeff * (s->max_lr - s->min_lr));
}

double l3d_grad_sumsq(struct l3d_backend *be, const float *grads, int64_t n) {
    double s = 0.0;
    l3d_be_sumsq(be, L3D_F32, &s, grads, n);
    return s;
}

float l3d_clip_factor(double norm, float clip) {
    if (clip <= 0.0f || !(norm > (double)clip)) return 1.0f;
    return (float)((double)clip / (norm + 1e-6));
}
