/*
 * llm3d optimizer: AdamW with decoupled weight decay on matrices only, a learning-rate schedule
 * (linear warm-up, cosine decay to a floor) and global-norm gradient clipping.
 *
 *   struct l3d_adamw opt;
 *   if (l3d_adamw_init(&opt, be, &hp, 0, model->num_params) != L3D_OK) ...;  // out of memory
 *   struct l3d_sumsq sq;
 *   if (l3d_sumsq_init(&sq, be, 1) != L3D_OK) ...;
 *   float lr = l3d_lr_at(&sched, step);
 *   l3d_grad_sumsq(&sq, 0, model->grads, model->num_params);  // on the device
 *   double host_sq;
 *   l3d_sumsq_take(&sq, &host_sq);                             // the one read of the step
 *   float clip = l3d_clip_factor(sqrt(host_sq), hp.grad_clip);
 *   l3d_adamw_step(&opt, be, model->params, model->grads, clip, model->tensors, L3D_NUM_TENSORS,
 *                  lr);
 *   l3d_sumsq_free(&sq);
 *   l3d_adamw_free(&opt);
 *
 * The moments m and v are flat fp32 device buffers (l3d_be_alloc) with the parameters' offsets,
 * so a ZeRO shard is a range.
 */
#ifndef LLM3D_OPTIM_H
#define LLM3D_OPTIM_H

#include "llm3d/backend.h"
#include "llm3d/core.h"
#include "llm3d/model.h"

struct l3d_adamw_hparams {
    float beta1, beta2, eps, weight_decay;
    float grad_clip; /* clip the global norm to this; 0 disables */
};

struct l3d_adamw {
    struct l3d_adamw_hparams hp;
    struct l3d_backend *be; /* owns m and v */
    int64_t start, n; /* the range of the flat parameter space it updates (a ZeRO shard) */
    float *m, *v;     /* first and second moments, n each, fp32 device memory (NULL when n = 0) */
    /* Mixed precision (pdt 16-bit): the fp32 master weights of the range, n (Micikevicius et al.
     * 2018; Megatron-LM's distributed optimizer keeps them with the moments, so ZeRO shards them
     * too): the source of truth the step updates, the model's 16-bit parameters their rounding. */
    enum l3d_dtype pdt; /* the model's parameter type */
    float *master;    /* NULL in fp32 */
    int64_t t;        /* steps taken */
};

/* State for parameters [start, start + n) of the flat parameter space: the moments allocated on
 * be's device and zeroed. L3D_ERR_OOM naming their size when the device has no room. */
l3d_status l3d_adamw_init(struct l3d_adamw *opt, struct l3d_backend *be,
                          const struct l3d_adamw_hparams *hp, int64_t start, int64_t n);
/* The same for a model whose parameters are of type pdt: 16-bit types add fp32 master weights
 * (zeroed: the caller fills them, l3d_dp_fp32_params_done). */
l3d_status l3d_adamw_init_dt(struct l3d_adamw *opt, struct l3d_backend *be,
                             const struct l3d_adamw_hparams *hp, int64_t start, int64_t n,
                             enum l3d_dtype pdt);
/* Frees the moments; a zeroed or already freed struct is fine. */
void l3d_adamw_free(struct l3d_adamw *opt);
/* One step over the part of each tensor inside the range (weight decay where tensors[i].decay),
 * with learning rate lr, on the gradients times grad_scale (the clipping factor of
 * l3d_clip_factor). params is the whole flat buffer (type pdt); grads[i] is the gradient of
 * parameter start + i. With master weights the step updates them and writes their rounding to
 * params. */
void l3d_adamw_step(struct l3d_adamw *opt, struct l3d_backend *be, void *params,
                    const float *grads, float grad_scale, const struct l3d_tensor_info *tensors,
                    int ntensors, float lr);
/* The same on a range's parameters only: shard[i] is parameter start + i (ZeRO-3). */
void l3d_adamw_step_shard(struct l3d_adamw *opt, struct l3d_backend *be, void *shard,
                          const float *grads, float grad_scale,
                          const struct l3d_tensor_info *tensors, int ntensors, float lr);
/* l3d_adamw_step (shard: l3d_adamw_step_shard) with the next step's gradient zeroing folded in:
 * afterwards grads[0 .. n) are all zero, each element the step reads written 0 in the same pass
 * (the rest, gaps no tensor covers, by memset). For a caller whose gradients are not read after
 * the step; a skipped step zeroes them itself. */
void l3d_adamw_step_zero(struct l3d_adamw *opt, struct l3d_backend *be, void *params, bool shard,
                         float *grads, float grad_scale, const struct l3d_tensor_info *tensors,
                         int ntensors, float lr);

struct l3d_lr_schedule {
    float max_lr;
    float min_lr;     /* floor reached at the last step */
    int warmup_steps; /* linear from max_lr/warmup to max_lr */
    int total_steps;
};
/* lr at step (0-based): (step+1)/warmup * max_lr during warm-up, then cosine from max_lr to
 * min_lr over the remaining steps (Loshchilov & Hutter 2017, without restarts). */
float l3d_lr_at(const struct l3d_lr_schedule *s, int step);

/* Sums of squares for the global gradient norm, kept on the device until asked for: n device
 * doubles, each the running sum acc += sum x^2 of the ranges added in the order they were added
 * (so the result does not depend on when it is read). The caller sums them across ranks, then
 * takes the root. */
struct l3d_sumsq {
    struct l3d_backend *be;
    double *acc; /* n device doubles */
    int n;
};
/* n accumulators, zero. L3D_ERR_OOM when the device has no room. */
l3d_status l3d_sumsq_init(struct l3d_sumsq *sq, struct l3d_backend *be, int n);
void l3d_sumsq_free(struct l3d_sumsq *sq);
/* Copies the n sums to out (host) and zeroes them for the next accumulation. */
void l3d_sumsq_take(struct l3d_sumsq *sq, double *out);
/* acc[i] += sum of squares of n gradient elements (device memory). */
void l3d_grad_sumsq(struct l3d_sumsq *sq, int i, const float *grads, int64_t n);
/* Global-norm clipping (Pascanu et al. 2013): clip / norm when norm > clip > 0, else 1. AdamW
 * applies it to the gradients as it reads them, saving a pass over memory. */
float l3d_clip_factor(double norm, float clip);

#endif
