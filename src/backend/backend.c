/* The device interface (include/llm3d/backend.h) over the backend's table. Transitional: the
 * memory of the CPU backend is host memory from the accounting allocator. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "llm3d/backend.h"

#define K(be) ((be)->i)

static void need_f32(enum l3d_dtype dt, const char *kernel) {
    if (dt != L3D_F32)
        l3d_fatal(__FILE__, __LINE__, "backend: kernel %s has no %d variant", kernel, (int)dt);
}

l3d_status l3d_backend_init(const char *name, struct l3d_backend **out) {
    *out = NULL;
    if (!name || !*name) name = getenv("L3D_BACKEND");
    if (!name || !*name) name = "cpu";
    if (strcmp(name, "cpu") != 0)
        return l3d_error(L3D_ERR_ARG, "unknown backend '%s' (L3D_BACKEND or --backend): use cpu",
                         name);
    *out = l3d_backend_cpu_init();
    return L3D_OK;
}

const char *l3d_backend_name(const struct l3d_backend *be) { return be->i->name; }

void *l3d_be_alloc(struct l3d_backend *be, size_t bytes, const char *what) {
    (void)be;
    return l3d_try_alloc(bytes, what);
}
void l3d_be_free(struct l3d_backend *be, void *p) {
    (void)be;
    l3d_free(p);
}
void l3d_be_memset(struct l3d_backend *be, void *dst, int value, size_t bytes) {
    (void)be;
    if (bytes) memset(dst, value, bytes);
}
void l3d_be_copy_h2d(struct l3d_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    if (bytes) memcpy(dst, src, bytes);
}
void l3d_be_copy_d2h(struct l3d_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    if (bytes) memcpy(dst, src, bytes);
}
void l3d_be_copy_d2d(struct l3d_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    if (bytes) memmove(dst, src, bytes);
}
void l3d_be_sync(struct l3d_backend *be) { (void)be; }
struct l3d_event {
    int recorded;
};
struct l3d_event *l3d_be_event_new(struct l3d_backend *be) {
    (void)be;
    return l3d_calloc(sizeof(struct l3d_event), "event");
}
void l3d_be_event_record(struct l3d_backend *be, struct l3d_event *ev) {
    (void)be;
    ev->recorded = 1;
}
void l3d_be_event_wait(struct l3d_backend *be, struct l3d_event *ev) {
    (void)be;
    L3D_ASSERT(ev->recorded);
}
void l3d_be_event_free(struct l3d_backend *be, struct l3d_event *ev) {
    (void)be;
    l3d_free(ev);
}
double l3d_be_peak_flops(struct l3d_backend *be, enum l3d_dtype t) {
    (void)be;
    return t == L3D_F32 ? l3d_cpu_fma_peak(0.2) : 0.0;
}
void *l3d_be_host_view(struct l3d_backend *be, const void *p, size_t bytes) {
    (void)be;
    (void)bytes;
    return (void *)p;
}

void l3d_be_matmul_forward(struct l3d_backend *be, enum l3d_dtype dt, void *out, const void *inp,
                           const void *weight, const void *bias, int64_t N, int64_t C, int64_t OC) {
    need_f32(dt, "matmul_forward");
    K(be)->matmul_forward(be->ctx, out, inp, weight, bias, N, C, OC);
}
void l3d_be_matmul_backward(struct l3d_backend *be, enum l3d_dtype dt, void *dinp, void *dweight,
                            void *dbias, const void *dout, const void *inp, const void *weight,
                            int64_t N, int64_t C, int64_t OC) {
    need_f32(dt, "matmul_backward");
    K(be)->matmul_backward(be->ctx, dinp, dweight, dbias, dout, inp, weight, N, C, OC);
}
void l3d_be_encoder_forward(struct l3d_backend *be, enum l3d_dtype dt, void *out,
                            const int32_t *tokens, const void *wte, const void *wpe,
                            int64_t vocab_start, int64_t vocab_count, int64_t B, int64_t T,
                            int64_t C) {
    need_f32(dt, "encoder_forward");
    K(be)->encoder_forward(be->ctx, out, tokens, wte, wpe, vocab_start, vocab_count, B, T, C);
}
void l3d_be_encoder_backward(struct l3d_backend *be, enum l3d_dtype dt, void *dwte, void *dwpe,
                             const void *dout, const int32_t *tokens, int64_t vocab_start,
                             int64_t vocab_count, int64_t B, int64_t T, int64_t C) {
    need_f32(dt, "encoder_backward");
    K(be)->encoder_backward(be->ctx, dwte, dwpe, dout, tokens, vocab_start, vocab_count, B, T, C);
}
void l3d_be_layernorm_forward(struct l3d_backend *be, enum l3d_dtype dt, void *out, float *mean,
                              float *rstd, const void *inp, const void *weight, const void *bias,
                              int64_t N, int64_t C) {
    need_f32(dt, "layernorm_forward");
    K(be)->layernorm_forward(be->ctx, out, mean, rstd, inp, weight, bias, N, C);
}
void l3d_be_layernorm_backward(struct l3d_backend *be, enum l3d_dtype dt, void *dinp,
                               void *dweight, void *dbias, const void *dout, const void *inp,
                               const void *weight, const float *mean, const float *rstd,
                               int64_t N, int64_t C) {
    need_f32(dt, "layernorm_backward");
    K(be)->layernorm_backward(be->ctx, dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
}
void l3d_be_attention_forward(struct l3d_backend *be, enum l3d_dtype dt, void *out, void *att,
                              const void *qkv, int64_t B, int64_t T, int64_t NH, int64_t HS) {
    need_f32(dt, "attention_forward");
    K(be)->attention_forward(be->ctx, out, att, qkv, B, T, NH, HS);
}
void l3d_be_attention_backward(struct l3d_backend *be, enum l3d_dtype dt, void *dqkv, void *datt,
                               const void *dout, const void *qkv, const void *att, int64_t B,
                               int64_t T, int64_t NH, int64_t HS) {
    need_f32(dt, "attention_backward");
    K(be)->attention_backward(be->ctx, dqkv, datt, dout, qkv, att, B, T, NH, HS);
}
void l3d_be_gelu_forward(struct l3d_backend *be, enum l3d_dtype dt, void *out, const void *inp,
                         int64_t N) {
    need_f32(dt, "gelu_forward");
    K(be)->gelu_forward(be->ctx, out, inp, N);
}
void l3d_be_gelu_backward(struct l3d_backend *be, enum l3d_dtype dt, void *dinp, const void *dout,
                          const void *inp, int64_t N) {
    need_f32(dt, "gelu_backward");
    K(be)->gelu_backward(be->ctx, dinp, dout, inp, N);
}
void l3d_be_residual_forward(struct l3d_backend *be, enum l3d_dtype dt, void *out, const void *a,
                             const void *b, int64_t N) {
    need_f32(dt, "residual_forward");
    K(be)->residual_forward(be->ctx, out, a, b, N);
}
void l3d_be_add_inplace(struct l3d_backend *be, enum l3d_dtype dt, void *dst, const void *src,
                        int64_t N) {
    need_f32(dt, "add_inplace");
    K(be)->add_inplace(be->ctx, dst, src, N);
}
void l3d_be_add_bias(struct l3d_backend *be, enum l3d_dtype dt, void *out, const void *bias,
                     int64_t N, int64_t C) {
    need_f32(dt, "add_bias");
    for (int64_t n = 0; n < N; n++) K(be)->add_inplace(be->ctx, (float *)out + n * C, bias, C);
}
void l3d_be_xent_max(struct l3d_backend *be, enum l3d_dtype dt, float *maxv, const void *logits,
                     int64_t N, int64_t Vl, int64_t Vvalid) {
    need_f32(dt, "xent_max");
    K(be)->xent_max(be->ctx, maxv, logits, N, Vl, Vvalid);
}
void l3d_be_xent_sumexp(struct l3d_backend *be, enum l3d_dtype dt, float *sumexp, float *tlogit,
                        const void *logits, const float *maxv, const int32_t *targets,
                        int64_t vocab_start, int64_t N, int64_t Vl, int64_t Vvalid) {
    need_f32(dt, "xent_sumexp");
    K(be)->xent_sumexp(be->ctx, sumexp, tlogit, logits, maxv, targets, vocab_start, N, Vl, Vvalid);
}
void l3d_be_xent_backward(struct l3d_backend *be, enum l3d_dtype dt, void *logits,
                          const float *maxv, const float *sumexp, const int32_t *targets,
                          float dloss, int64_t vocab_start, int64_t N, int64_t Vl,
                          int64_t Vvalid) {
    need_f32(dt, "xent_backward");
    K(be)->xent_backward(be->ctx, logits, maxv, sumexp, targets, dloss, vocab_start, N, Vl, Vvalid);
}
void l3d_be_xent_loss(struct l3d_backend *be, float *losses, double *loss_sum, const float *maxv,
                      const float *sumexp, const float *tlogit, int64_t N) {
    (void)be;
    double total = *loss_sum;
    for (int64_t i = 0; i < N; i++) {
        losses[i] = logf(sumexp[i]) + maxv[i] - tlogit[i];
        total += losses[i];
    }
    *loss_sum = total;
}
void l3d_be_adamw(struct l3d_backend *be, enum l3d_dtype dt, void *param, float *m, float *v,
                  const void *grad, float grad_scale, int64_t n, float lr, float beta1,
                  float beta2, float eps, float wd, float bc1, float bc2) {
    need_f32(dt, "adamw");
    K(be)->adamw(be->ctx, param, m, v, grad, grad_scale, n, lr, beta1, beta2, eps, wd, bc1, bc2);
}
void l3d_be_sumsq(struct l3d_backend *be, enum l3d_dtype dt, double *acc, const void *x,
                  int64_t n) {
    need_f32(dt, "sumsq");
    *acc += K(be)->sumsq(be->ctx, x, n);
}
