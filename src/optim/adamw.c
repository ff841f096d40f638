/* AdamW, learning-rate schedule, gradient clipping (include/llm3d/optim.h). */
#include <math.h>
#include <string.h>

#include "llm3d/optim.h"

l3d_status l3d_adamw_init(struct l3d_adamw *opt, struct l3d_backend *be,
                          const struct l3d_adamw_hparams *hp, int64_t start, int64_t n) {
    return l3d_adamw_init_dt(opt, be, hp, start, n, L3D_F32);
}

l3d_status l3d_adamw_init_dt(struct l3d_adamw *opt, struct l3d_backend *be,
                             const struct l3d_adamw_hparams *hp, int64_t start, int64_t n,
                             enum l3d_dtype pdt) {
    memset(opt, 0, sizeof *opt);
    opt->hp = *hp;
    opt->be = be;
    opt->start = start;
    opt->n = n;
    opt->pdt = pdt;
    if (n == 0) return L3D_OK;
    size_t bytes = (size_t)n * sizeof(float); /* the moments are fp32 whatever the parameters */
    int k = pdt == L3D_F32 ? 2 : 3; /* and 16-bit parameters have fp32 master copies */
    opt->m = l3d_be_alloc(be, bytes, "adamw first moment");
    opt->v = l3d_be_alloc(be, bytes, "adamw second moment");
    if (k == 3) opt->master = l3d_be_alloc(be, bytes, "fp32 master weights");
    if (!opt->m || !opt->v || (k == 3 && !opt->master)) {
        l3d_adamw_free(opt);
        return l3d_error(L3D_ERR_OOM, "cannot allocate %.2f GiB for AdamW's moments%s of %lld "
                         "parameters: use --zero 1 or more data-parallel ranks to shard them, or a "
                         "smaller model", k * (double)bytes / 1073741824.0,
                         k == 3 ? " and fp32 master weights" : "", (long long)n);
    }
    l3d_be_memset(be, opt->m, 0, bytes); /* first touch now, not inside the step loop */
    l3d_be_memset(be, opt->v, 0, bytes);
    if (opt->master) l3d_be_memset(be, opt->master, 0, bytes);
    return L3D_OK;
}

void l3d_adamw_free(struct l3d_adamw *opt) {
    if (opt->m) l3d_be_free(opt->be, opt->m);
    if (opt->v) l3d_be_free(opt->be, opt->v);
    if (opt->master) l3d_be_free(opt->be, opt->master);
    opt->m = opt->v = opt->master = NULL;
}

/* The step with params holding parameter p0 at its start (0: the whole flat buffer; start: the
 * range only, ZeRO-3's shard); zero: each gradient written 0 in the kernel that reads it. */
static void adamw_step_at(struct l3d_adamw *opt, struct l3d_backend *be, void *params, int64_t p0,
                          const float *grads, bool zero, float grad_scale,
                          const struct l3d_tensor_info *tensors, int ntensors, float lr) {
    const struct l3d_adamw_hparams *hp = &opt->hp;
    opt->t++;
    float bc1 = 1.0f - powf(hp->beta1, (float)opt->t);
    float bc2 = 1.0f - powf(hp->beta2, (float)opt->t);
    int64_t s0 = opt->start, s1 = opt->start + opt->n;
    const size_t pes = l3d_dtype_size(opt->pdt);
    for (int i = 0; i < ntensors; i++) {
        const struct l3d_tensor_info *t = &tensors[i];
        int64_t lo = t->offset > s0 ? t->offset : s0;
        int64_t hi = t->offset + t->count < s1 ? t->offset + t->count : s1;
        if (lo >= hi) continue;
        float wd = t->decay ? hp->weight_decay : 0.0f;
        /* fp32: the parameters are their own master weights; else the fp32 master weights, then
         * the model's 16-bit copy */
        void *p = (char *)params + (size_t)(lo - p0) * pes;
        float *master = opt->master ? opt->master + (lo - s0) : NULL;
        float *m = opt->m + (lo - s0), *v = opt->v + (lo - s0);
        float *g = (float *)grads + (lo - s0);
        if (zero)
            l3d_be_adamw_zero(be, opt->pdt, L3D_F32, p, master, m, v, g, grad_scale, hi - lo, lr,
                              hp->beta1, hp->beta2, hp->eps, wd, bc1, bc2);
        else if (master)
            l3d_be_adamw_mixed(be, opt->pdt, L3D_F32, p, master, m, v, g, grad_scale, hi - lo, lr,
                               hp->beta1, hp->beta2, hp->eps, wd, bc1, bc2);
        else
            l3d_be_adamw(be, L3D_F32, p, m, v, g, grad_scale, hi - lo, lr, hp->beta1, hp->beta2,
                         hp->eps, wd, bc1, bc2);
    }
}

void l3d_adamw_step(struct l3d_adamw *opt, struct l3d_backend *be, void *params,
                    const float *grads, float grad_scale, const struct l3d_tensor_info *tensors,
                    int ntensors, float lr) {
    adamw_step_at(opt, be, params, 0, grads, false, grad_scale, tensors, ntensors, lr);
}

void l3d_adamw_step_shard(struct l3d_adamw *opt, struct l3d_backend *be, void *shard,
                          const float *grads, float grad_scale,
                          const struct l3d_tensor_info *tensors, int ntensors, float lr) {
    adamw_step_at(opt, be, shard, opt->start, grads, false, grad_scale, tensors, ntensors, lr);
}

/* The elements of [s0, s1) no tensor covers (alignment gaps, the padding at a shard's end),
 * zeroed: what the fused step does not read. The covered ranges are found in offset order, one
 * scan of the (short) table each. */
static void zero_uncovered(struct l3d_backend *be, float *grads, int64_t s0, int64_t s1,
                           const struct l3d_tensor_info *tensors, int ntensors) {
    int64_t at = s0;
    for (;;) { /* the next covered range that starts at or after `at`, or overlaps it */
        int64_t lo = s1, hi = s1;
        for (int i = 0; i < ntensors; i++) {
            int64_t a = tensors[i].offset, b = tensors[i].offset + tensors[i].count;
            if (tensors[i].count > 0 && b > at && a < lo) lo = a, hi = b;
        }
        if (lo > at) l3d_be_memset(be, grads + (at - s0), 0, (size_t)(lo - at) * sizeof(float));
        if (hi >= s1) return;
        at = hi > at ? hi : at;
    }
}

void l3d_adamw_step_zero(struct l3d_adamw *opt, struct l3d_backend *be, void *params, bool shard,
                         float *grads, float grad_scale, const struct l3d_tensor_info *tensors,
                         int ntensors, float lr) {
    adamw_step_at(opt, be, params, shard ? opt->start : 0, grads, true, grad_scale, tensors,
                  ntensors, lr);
    zero_uncovered(be, grads, opt->start, opt->start + opt->n, tensors, ntensors);
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

l3d_status l3d_sumsq_init(struct l3d_sumsq *sq, struct l3d_backend *be, int n) {
    L3D_ASSERT(n > 0);
    size_t bytes = (size_t)n * sizeof(double);
    *sq = (struct l3d_sumsq){.be = be, .n = n, .acc = l3d_be_alloc(be, bytes, "gradient norm")};
    if (!sq->acc)
        return l3d_error(L3D_ERR_OOM, "cannot allocate %zu bytes of device memory for the "
                         "gradient norm: the device is full", bytes);
    l3d_be_memset(be, sq->acc, 0, bytes);
    return L3D_OK;
}

void l3d_sumsq_free(struct l3d_sumsq *sq) {
    if (sq->acc) l3d_be_free(sq->be, sq->acc);
    sq->acc = NULL;
}

void l3d_sumsq_take(struct l3d_sumsq *sq, double *out) {
    size_t bytes = (size_t)sq->n * sizeof(double);
    l3d_be_copy_d2h(sq->be, out, sq->acc, bytes);
    l3d_be_memset(sq->be, sq->acc, 0, bytes);
}

void l3d_grad_sumsq(struct l3d_sumsq *sq, int i, const float *grads, int64_t n) {
    L3D_ASSERT(i >= 0 && i < sq->n);
    l3d_be_sumsq(sq->be, L3D_F32, sq->acc + i, grads, n);
}

float l3d_clip_factor(double norm, float clip) {
    if (clip <= 0.0f || !(norm > (double)clip)) return 1.0f;
    return (float)((double)clip / (norm + 1e-6));
}
