/* The device interface (include/llm3d/backend.h): one dispatch through the backend's table
 * (src/backend/backend-impl.h) per call. The backends (cpu.c, check.c) build on this file; which
 * backend a name selects is registry.c's, so this file knows none of them. */

#include <string.h>

#include "backend/backend-impl.h"

struct l3d_backend *l3d_backend_make(const struct l3d_backend_i *i, void *ctx) {
    struct l3d_backend *be = l3d_alloc(sizeof *be, "backend");
    be->i = i;
    be->ctx = ctx;
    be->prof = NULL;
    return be;
}

static const char *const kfam_names[L3D_KF_N] = {
    "products", "attention", "element-wise", "norms", "cross-entropy", "optimizer", "copies"};
const char *l3d_kfam_name(enum l3d_kfam f) {
    return f >= 0 && f < L3D_KF_N ? kfam_names[f] : "?";
}

void l3d_be_profile(struct l3d_backend *be, struct l3d_kprof *p) { be->prof = p; }

static double prof_begin(struct l3d_backend *be) {
    be->i->sync(be->ctx);
    return l3d_time_s();
}

static void prof_end(struct l3d_backend *be, enum l3d_kfam f, const char *name, double t0,
                     double bytes) {
    be->i->sync(be->ctx);
    double dt = l3d_time_s() - t0;
    struct l3d_kprof *p = be->prof;
    p->fam.s[f] += dt;
    p->fam.bytes[f] += bytes;
    p->fam.calls[f]++;
    int i = 0;
    while (i < p->nk && p->k[i].name != name && strcmp(p->k[i].name, name) != 0) i++;
    if (i == p->nk) {
        if (p->nk == L3D_KPROF_KERNELS) return;
        p->k[p->nk++] = (struct l3d_kstat){.name = name, .fam = f};
    }
    p->k[i].s += dt;
    p->k[i].bytes += bytes;
    p->k[i].calls++;
}

/* One kernel call, timed into be->prof when profiling is on (l3d_be_profile); name: the entry
 * the call goes through. */
#define KCALL(fam, name, bytes, call)                                                             \
    do {                                                                                          \
        if (!be->prof) {                                                                          \
            call;                                                                                 \
            break;                                                                                \
        }                                                                                         \
        double t0_ = prof_begin(be);                                                              \
        call;                                                                                     \
        prof_end(be, fam, name, t0_, bytes);                                                      \
    } while (0)

static inline double esz(enum l3d_dtype t) { return (double)l3d_dtype_size(t); }

void l3d_backend_free(struct l3d_backend *be) {
    if (!be) return;
    if (be->i->free) be->i->free(be->ctx);
    l3d_free(be);
}

_Noreturn void l3d_backend_no_variant(const char *be_name, const char *kernel, enum l3d_dtype dt) {
    l3d_fatal(__FILE__, __LINE__, "backend %s: kernel %s has no %s variant", be_name, kernel,
              l3d_dtype_name(dt));
}

const char *l3d_backend_name(const struct l3d_backend *be) { return be->i->name; }

void *l3d_be_alloc(struct l3d_backend *be, size_t bytes, const char *what) {
    return be->i->alloc(be->ctx, bytes, what);
}
void l3d_be_free(struct l3d_backend *be, void *p) {
    if (p) be->i->dfree(be->ctx, p);
}
void l3d_be_memset(struct l3d_backend *be, void *dst, int value, size_t bytes) {
    if (bytes) KCALL(L3D_KF_COPIES, "memset", bytes, be->i->memset(be->ctx, dst, value, bytes));
}
void l3d_be_copy_h2d(struct l3d_backend *be, void *dst, const void *src, size_t bytes) {
    if (bytes)
        KCALL(L3D_KF_COPIES, "copy_h2d", 2.0 * bytes, be->i->copy_h2d(be->ctx, dst, src, bytes));
}
void l3d_be_copy_d2h(struct l3d_backend *be, void *dst, const void *src, size_t bytes) {
    if (bytes)
        KCALL(L3D_KF_COPIES, "copy_d2h", 2.0 * bytes, be->i->copy_d2h(be->ctx, dst, src, bytes));
}
void l3d_be_copy_d2d(struct l3d_backend *be, void *dst, const void *src, size_t bytes) {
    if (bytes && dst != src)
        KCALL(L3D_KF_COPIES, "copy_d2d", 2.0 * bytes, be->i->copy_d2d(be->ctx, dst, src, bytes));
}
void l3d_be_sync(struct l3d_backend *be) { be->i->sync(be->ctx); }

struct l3d_event *l3d_be_event_new(struct l3d_backend *be) {
    struct l3d_event *ev = l3d_calloc(sizeof *ev, "event");
    ev->be = be;
    return ev;
}
void l3d_be_event_record(struct l3d_backend *be, struct l3d_event *ev) {
    L3D_ASSERT(ev->be == be);
    if (be->i->event_record) be->i->event_record(be->ctx, ev);
    ev->recorded = true;
}
void l3d_be_event_wait(struct l3d_backend *be, struct l3d_event *ev) {
    L3D_ASSERT(ev->be == be);
    if (!ev->recorded)
        l3d_fatal(__FILE__, __LINE__, "backend %s: waiting on an event never recorded",
                  be->i->name);
    if (be->i->event_wait) be->i->event_wait(be->ctx, ev);
}
void l3d_be_event_free(struct l3d_backend *be, struct l3d_event *ev) {
    if (!ev) return;
    L3D_ASSERT(ev->be == be);
    if (ev->impl && be->i->event_destroy) be->i->event_destroy(be->ctx, ev);
    l3d_free(ev);
}
double l3d_be_peak_flops(struct l3d_backend *be, enum l3d_dtype t) {
    return be->i->peak_flops(be->ctx, t);
}
bool l3d_be_matmul_native(struct l3d_backend *be, enum l3d_dtype t) {
    return be->i->matmul_native(be->ctx, t);
}
int64_t l3d_be_matmul_wgrad_block(struct l3d_backend *be, enum l3d_dtype t) {
    return be->i->matmul_wgrad_block ? be->i->matmul_wgrad_block(be->ctx, t) : 0;
}
bool l3d_be_attention_native(struct l3d_backend *be, enum l3d_dtype t) {
    return be->i->attention_native && be->i->attention_native(be->ctx, t);
}
bool l3d_be_attention_p16(struct l3d_backend *be, enum l3d_dtype t, int64_t HS) {
    return be->i->attention_p16 && be->i->attention_p16(be->ctx, t, HS);
}
void *l3d_be_host_view(struct l3d_backend *be, const void *p, size_t bytes) {
    return be->i->host_view(be->ctx, p, bytes);
}

/* ---- kernels ---------------------------------------------------------------------------- */

void l3d_be_matmul_forward(struct l3d_backend *be, enum l3d_dtype dt, void *out, const void *inp,
                           const void *weight, const void *bias, int64_t N, int64_t C, int64_t OC) {
    KCALL(L3D_KF_PRODUCTS, "matmul_forward", 0,
          be->i->matmul_forward(be->ctx, dt, out, inp, weight, bias, N, C, OC));
}

void l3d_be_matmul_backward(struct l3d_backend *be, enum l3d_dtype dt, void *dinp, void *dweight,
                            void *dbias, const void *dout, const void *inp, const void *weight,
                            int64_t N, int64_t C, int64_t OC) {
    KCALL(L3D_KF_PRODUCTS, "matmul_backward", 0,
          be->i->matmul_backward(be->ctx, dt, dt, dinp, dweight, dbias, dout, inp, weight, N, C,
                                 OC));
}

void l3d_be_matmul_backward_mixed(struct l3d_backend *be, enum l3d_dtype dt, enum l3d_dtype gdt,
                                  void *dinp, void *dweight, void *dbias, const void *dout,
                                  const void *inp, const void *weight, int64_t N, int64_t C,
                                  int64_t OC) {
    KCALL(L3D_KF_PRODUCTS, "matmul_backward", 0,
          be->i->matmul_backward(be->ctx, dt, gdt, dinp, dweight, dbias, dout, inp, weight, N, C,
                                 OC));
}

void l3d_be_encoder_forward(struct l3d_backend *be, enum l3d_dtype dt, void *out,
                            const int32_t *tokens, const void *wte, const void *wpe,
                            int64_t vocab_start, int64_t vocab_count, int64_t B, int64_t T,
                            int64_t C) {
    KCALL(L3D_KF_ELEMENTWISE, "encoder_forward", (double)B * T * C * 3 * esz(dt),
          be->i->encoder_forward(be->ctx, dt, out, tokens, wte, wpe, vocab_start, vocab_count, B,
                                 T, C));
}

void l3d_be_encoder_backward(struct l3d_backend *be, enum l3d_dtype dt, void *dwte, void *dwpe,
                             const void *dout, const int32_t *tokens, int64_t vocab_start,
                             int64_t vocab_count, int64_t B, int64_t T, int64_t C) {
    KCALL(L3D_KF_ELEMENTWISE, "encoder_backward", (double)B * T * C * (3 * esz(dt)),
          be->i->encoder_backward(be->ctx, dt, dt, dwte, dwpe, dout, tokens, vocab_start,
                                  vocab_count, B, T, C));
}

void l3d_be_encoder_backward_mixed(struct l3d_backend *be, enum l3d_dtype dt, enum l3d_dtype gdt,
                                   void *dwte, void *dwpe, const void *dout,
                                   const int32_t *tokens, int64_t vocab_start,
                                   int64_t vocab_count, int64_t B, int64_t T, int64_t C) {
    KCALL(L3D_KF_ELEMENTWISE, "encoder_backward", (double)B * T * C * (esz(dt) + 2 * esz(gdt)),
          be->i->encoder_backward(be->ctx, dt, gdt, dwte, dwpe, dout, tokens, vocab_start,
                                  vocab_count, B, T, C));
}

void l3d_be_layernorm_forward(struct l3d_backend *be, enum l3d_dtype dt, void *out, float *mean,
                              float *rstd, const void *inp, const void *weight, const void *bias,
                              int64_t N, int64_t C) {
    KCALL(L3D_KF_NORMS, "layernorm_forward", (double)N * C * 2 * esz(dt),
          be->i->layernorm_forward(be->ctx, dt, out, mean, rstd, inp, weight, bias, N, C));
}

void l3d_be_layernorm_backward(struct l3d_backend *be, enum l3d_dtype dt, void *dinp,
                               void *dweight, void *dbias, const void *dout, const void *inp,
                               const void *weight, const float *mean, const float *rstd,
                               int64_t N, int64_t C) {
    KCALL(L3D_KF_NORMS, "layernorm_backward", (double)N * C * 4 * esz(dt),
          be->i->layernorm_backward(be->ctx, dt, dt, dinp, dweight, dbias, dout, inp, weight, mean,
                                    rstd, N, C));
}

void l3d_be_layernorm_backward_mixed(struct l3d_backend *be, enum l3d_dtype dt,
                                     enum l3d_dtype gdt, void *dinp, void *dweight, void *dbias,
                                     const void *dout, const void *inp, const void *weight,
                                     const float *mean, const float *rstd, int64_t N, int64_t C) {
    KCALL(L3D_KF_NORMS, "layernorm_backward", (double)N * C * 4 * esz(dt),
          be->i->layernorm_backward(be->ctx, dt, gdt, dinp, dweight, dbias, dout, inp, weight,
                                    mean, rstd, N, C));
}

void l3d_be_attention_forward(struct l3d_backend *be, enum l3d_dtype dt, void *out, float *lse,
                              const void *qkv, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                              int64_t HS) {
    KCALL(L3D_KF_ATTENTION, "attention_forward", 0,
          be->i->attention_forward(be->ctx, dt, out, lse, qkv, B, T, NH, NKV, HS));
}

void l3d_be_attention_backward(struct l3d_backend *be, enum l3d_dtype dt, void *dqkv,
                               const void *dout, const void *qkv, const void *out,
                               const float *lse, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                               int64_t HS) {
    KCALL(L3D_KF_ATTENTION, "attention_backward", 0,
          be->i->attention_backward(be->ctx, dt, dqkv, dout, qkv, out, lse, B, T, NH, NKV, HS));
}

void l3d_be_attention_naive_forward(struct l3d_backend *be, enum l3d_dtype dt, void *out,
                                    void *att, const void *qkv, int64_t B, int64_t T, int64_t NH,
                                    int64_t NKV, int64_t HS) {
    if (!be->i->attention_naive_forward)
        l3d_fatal(__FILE__, __LINE__, "backend %s has no materialising attention (unset "
                  "L3D_ATTENTION)", be->i->name);
    KCALL(L3D_KF_ATTENTION, "attention_naive_forward", 0,
          be->i->attention_naive_forward(be->ctx, dt, out, att, qkv, B, T, NH, NKV, HS));
}

void l3d_be_attention_naive_backward(struct l3d_backend *be, enum l3d_dtype dt, void *dqkv,
                                     void *datt, const void *dout, const void *qkv,
                                     const void *att, int64_t B, int64_t T, int64_t NH,
                                     int64_t NKV, int64_t HS) {
    if (!be->i->attention_naive_backward)
        l3d_fatal(__FILE__, __LINE__, "backend %s has no materialising attention (unset "
                  "L3D_ATTENTION)", be->i->name);
    KCALL(L3D_KF_ATTENTION, "attention_naive_backward", 0,
          be->i->attention_naive_backward(be->ctx, dt, dqkv, datt, dout, qkv, att, B, T, NH, NKV,
                                          HS));
}

/* The MoE kernels are optional (a backend without them refuses MoE models at build: CUDA's
 * today): a call into one without aborts naming the kernel. */
static void need(const struct l3d_backend *be, const void *entry, const char *kernel) {
    if (!entry)
        l3d_fatal(__FILE__, __LINE__, "backend %s has no %s kernel yet (the cpu backend has)",
                  be->i->name, kernel);
}

/* The block geometry's rules (include/llm3d/backend.h), checked once for every backend. */
static void attn_block_check(const struct l3d_attn_block *g, const char *kernel) {
    if (g->B < 1 || g->NH < 1 || g->NKV < 1 || g->HS < 1 || g->nq < 1 || g->nk < 1 ||
        g->NH % g->NKV != 0 || g->q_pos < 0 || g->k_pos < 0)
        l3d_fatal(__FILE__, __LINE__, "%s: B %lld, heads %lld over %lld key/value heads, HS "
                  "%lld, %lld query and %lld key rows at positions %lld, %lld: sizes must be "
                  "positive, positions non-negative, the key/value heads must divide the heads",
                  kernel, (long long)g->B, (long long)g->NH, (long long)g->NKV, (long long)g->HS,
                  (long long)g->nq, (long long)g->nk, (long long)g->q_pos, (long long)g->k_pos);
    if (g->k_pos > g->q_pos)
        l3d_fatal(__FILE__, __LINE__, "%s: the key chunk at position %lld starts after the query "
                  "chunk at %lld: its first query rows see no key; skip the block (entirely "
                  "after) or split it", kernel, (long long)g->k_pos, (long long)g->q_pos);
}

void l3d_be_attention_block_forward(struct l3d_backend *be, enum l3d_dtype dt, void *out,
                                    float *lse, const void *q, const void *k, const void *v,
                                    const struct l3d_attn_block *g) {
    attn_block_check(g, "attention_block_forward");
    KCALL(L3D_KF_ATTENTION, "attention_block_forward", 0,
          be->i->attention_block_forward(be->ctx, dt, out, lse, q, k, v, g));
}

void l3d_be_attention_merge(struct l3d_backend *be, enum l3d_dtype dt, void *out, float *lse,
                            const void *out2, const float *lse2, const struct l3d_attn_block *g) {
    KCALL(L3D_KF_ATTENTION, "attention_merge", 0,
          be->i->attention_merge(be->ctx, dt, out, lse, out2, lse2, g));
}

void l3d_be_attention_block_backward(struct l3d_backend *be, enum l3d_dtype dt, void *dq,
                                     void *dk, void *dv, const void *dout, const void *q,
                                     const void *k, const void *v, const void *out,
                                     const float *lse, const struct l3d_attn_block *g) {
    attn_block_check(g, "attention_block_backward");
    KCALL(L3D_KF_ATTENTION, "attention_block_backward", 0,
          be->i->attention_block_backward(be->ctx, dt, dq, dk, dv, dout, q, k, v, out, lse, g));
}

void l3d_be_attention_cached(struct l3d_backend *be, enum l3d_dtype dt, void *out, const void *q,
                             const void *k, const void *v, int64_t pos, int64_t n, int64_t NH,
                             int64_t NKV, int64_t HS, int64_t q_stride, int64_t kv_stride) {
    KCALL(L3D_KF_ATTENTION, "attention_cached", 0,
          be->i->attention_cached(be->ctx, dt, out, q, k, v, pos, n, NH, NKV, HS, q_stride,
                                  kv_stride));
}


void l3d_be_rmsnorm_forward(struct l3d_backend *be, enum l3d_dtype dt, void *out, float *rstd,
                            const void *inp, const void *weight, int64_t N, int64_t C,
                            float eps) {
    KCALL(L3D_KF_NORMS, "rmsnorm_forward", (double)N * C * 2 * esz(dt),
          be->i->rmsnorm_forward(be->ctx, dt, out, rstd, inp, weight, N, C, eps));
}

void l3d_be_rmsnorm_backward(struct l3d_backend *be, enum l3d_dtype dt, enum l3d_dtype gdt,
                             void *dinp, void *dweight, const void *dout, const void *inp,
                             const void *weight, const float *rstd, int64_t N, int64_t C) {
    KCALL(L3D_KF_NORMS, "rmsnorm_backward", (double)N * C * 4 * esz(dt),
          be->i->rmsnorm_backward(be->ctx, dt, gdt, dinp, dweight, dout, inp, weight, rstd, N, C));
}

void l3d_be_rope_forward(struct l3d_backend *be, enum l3d_dtype dt, void *qkv,
                         const float *inv_freq, const int32_t *pos, int64_t B, int64_t T,
                         int64_t NH, int64_t NKV, int64_t HS) {
    KCALL(L3D_KF_ELEMENTWISE, "rope_forward", (double)B * T * (NH + NKV) * HS * 2 * esz(dt),
          be->i->rope_forward(be->ctx, dt, qkv, inv_freq, pos, B, T, NH, NKV, HS));
}

void l3d_be_rope_backward(struct l3d_backend *be, enum l3d_dtype dt, void *dqkv,
                          const float *inv_freq, const int32_t *pos, int64_t B, int64_t T,
                          int64_t NH, int64_t NKV, int64_t HS) {
    KCALL(L3D_KF_ELEMENTWISE, "rope_backward", (double)B * T * (NH + NKV) * HS * 2 * esz(dt),
          be->i->rope_backward(be->ctx, dt, dqkv, inv_freq, pos, B, T, NH, NKV, HS));
}

void l3d_be_swiglu_forward(struct l3d_backend *be, enum l3d_dtype dt, void *out, const void *inp,
                           int64_t N, int64_t H) {
    KCALL(L3D_KF_ELEMENTWISE, "swiglu_forward", (double)N * H * 3 * esz(dt),
          be->i->swiglu_forward(be->ctx, dt, out, inp, N, H));
}

void l3d_be_swiglu_backward(struct l3d_backend *be, enum l3d_dtype dt, void *dinp,
                            const void *dout, const void *inp, int64_t N, int64_t H) {
    KCALL(L3D_KF_ELEMENTWISE, "swiglu_backward", (double)N * H * 5 * esz(dt),
          be->i->swiglu_backward(be->ctx, dt, dinp, dout, inp, N, H));
}

void l3d_be_gelu_forward(struct l3d_backend *be, enum l3d_dtype dt, void *out, const void *inp,
                         int64_t N) {
    KCALL(L3D_KF_ELEMENTWISE, "gelu_forward", (double)N * 2 * esz(dt),
          be->i->gelu_forward(be->ctx, dt, out, inp, N));
}

void l3d_be_gelu_backward(struct l3d_backend *be, enum l3d_dtype dt, void *dinp, const void *dout,
                          const void *inp, int64_t N) {
    KCALL(L3D_KF_ELEMENTWISE, "gelu_backward", (double)N * 3 * esz(dt),
          be->i->gelu_backward(be->ctx, dt, dinp, dout, inp, N));
}

void l3d_be_residual_forward(struct l3d_backend *be, enum l3d_dtype dt, void *out, const void *a,
                             const void *b, int64_t N) {
    KCALL(L3D_KF_ELEMENTWISE, "residual_forward", (double)N * 3 * esz(dt),
          be->i->residual_forward(be->ctx, dt, out, a, b, N));
}

/* The fused kernel where the backend has one, counted as a norm reading a and b and writing res
 * and out; else the unfused pair, each counted as itself. */
void l3d_be_residual_layernorm_forward(struct l3d_backend *be, enum l3d_dtype dt, void *res,
                                       void *out, float *mean, float *rstd, const void *a,
                                       const void *b, const void *weight, const void *bias,
                                       int64_t N, int64_t C) {
    L3D_ASSERT(mean && out != res && out != a);
    if (!be->i->residual_norm_forward) {
        l3d_be_residual_forward(be, dt, res, a, b, N * C);
        l3d_be_layernorm_forward(be, dt, out, mean, rstd, res, weight, bias, N, C);
        return;
    }
    KCALL(L3D_KF_NORMS, "residual_layernorm_forward", (double)N * C * 4 * esz(dt),
          be->i->residual_norm_forward(be->ctx, dt, res, out, mean, rstd, a, b, weight, bias, N,
                                       C, 0.0f));
}

void l3d_be_residual_rmsnorm_forward(struct l3d_backend *be, enum l3d_dtype dt, void *res,
                                     void *out, float *rstd, const void *a, const void *b,
                                     const void *weight, int64_t N, int64_t C, float eps) {
    L3D_ASSERT(out != res && out != a);
    if (!be->i->residual_norm_forward) {
        l3d_be_residual_forward(be, dt, res, a, b, N * C);
        l3d_be_rmsnorm_forward(be, dt, out, rstd, res, weight, N, C, eps);
        return;
    }
    KCALL(L3D_KF_NORMS, "residual_rmsnorm_forward", (double)N * C * 4 * esz(dt),
          be->i->residual_norm_forward(be->ctx, dt, res, out, NULL, rstd, a, b, weight, NULL, N,
                                       C, eps));
}

void l3d_be_add_inplace(struct l3d_backend *be, enum l3d_dtype dt, void *dst, const void *src,
                        int64_t N) {
    KCALL(L3D_KF_ELEMENTWISE, "add_inplace", (double)N * 3 * esz(dt),
          be->i->add_inplace(be->ctx, dt, dst, src, N));
}

void l3d_be_add_bias(struct l3d_backend *be, enum l3d_dtype dt, void *out, const void *bias,
                     int64_t N, int64_t C) {
    KCALL(L3D_KF_ELEMENTWISE, "add_bias", (double)N * C * 2 * esz(dt),
          be->i->add_bias(be->ctx, dt, out, bias, N, C));
}

bool l3d_be_has_moe(const struct l3d_backend *be) {
    return be->i->moe_route && be->i->moe_permute && be->i->moe_combine &&
           be->i->moe_combine_backward && be->i->moe_router_backward;
}

void l3d_be_moe_route(struct l3d_backend *be, enum l3d_dtype dt, float *probs, float *lse,
                      int32_t *idx, float *wts, int32_t *pos, int32_t *offsets, float *stats,
                      int32_t *work, const void *inp, const void *weight, int64_t N, int64_t C,
                      int64_t E, int64_t K, int norm_topk, int64_t capacity,
                      const int32_t *fill, int64_t segs, const int32_t *forced) {
    need(be, (const void *)be->i->moe_route, "moe_route");
    L3D_ASSERT(N * K < INT32_MAX); /* int32 rows and counts */
    if (segs < 1 || N % segs != 0)
        l3d_fatal(__FILE__, __LINE__, "moe_route: %lld tokens do not split into %lld equal "
                  "segments (the capacity's starting fills; a caller's error)", (long long)N,
                  (long long)segs);
    be->i->moe_route(be->ctx, dt, probs, lse, idx, wts, pos, offsets, stats, work, inp, weight, N,
                     C, E, K, norm_topk, capacity, fill, segs, forced);
}

void l3d_be_moe_permute(struct l3d_backend *be, enum l3d_dtype dt, void *rows, const void *inp,
                        const int32_t *pos, int64_t N, int64_t K, int64_t C) {
    need(be, (const void *)be->i->moe_permute, "moe_permute");
    be->i->moe_permute(be->ctx, dt, rows, inp, pos, N, K, C);
}

void l3d_be_moe_combine(struct l3d_backend *be, enum l3d_dtype dt, void *out, const void *rows,
                        const int32_t *pos, const float *wts, int64_t N, int64_t K, int64_t C) {
    need(be, (const void *)be->i->moe_combine, "moe_combine");
    be->i->moe_combine(be->ctx, dt, out, rows, pos, wts, N, K, C);
}

void l3d_be_moe_combine_backward(struct l3d_backend *be, enum l3d_dtype dt, void *drows,
                                 float *dwts, const void *dout, const void *rows,
                                 const int32_t *pos, const float *wts, int64_t N, int64_t K,
                                 int64_t C) {
    need(be, (const void *)be->i->moe_combine_backward, "moe_combine_backward");
    be->i->moe_combine_backward(be->ctx, dt, drows, dwts, dout, rows, pos, wts, N, K, C);
}

void l3d_be_moe_router_backward(struct l3d_backend *be, enum l3d_dtype dt, enum l3d_dtype gdt,
                                void *dinp, void *dweight, float *dlogits, const float *dwts,
                                const void *inp, const void *weight, const float *probs,
                                const float *lse, const int32_t *idx, const float *wts,
                                const float *stats, int64_t N, int64_t C, int64_t E, int64_t K,
                                int norm_topk, float aux_scale, float z_scale) {
    need(be, (const void *)be->i->moe_router_backward, "moe_router_backward");
    be->i->moe_router_backward(be->ctx, dt, gdt, dinp, dweight, dlogits, dwts, inp, weight, probs,
                               lse, idx, wts, stats, N, C, E, K, norm_topk, aux_scale, z_scale);
}

void l3d_be_xent_max(struct l3d_backend *be, enum l3d_dtype dt, float *maxv, const void *logits,
                     int64_t N, int64_t Vl, int64_t Vvalid) {
    KCALL(L3D_KF_XENT, "xent_max", (double)N * Vl * esz(dt),
          be->i->xent_max(be->ctx, dt, maxv, logits, N, Vl, Vvalid));
}

void l3d_be_xent_sumexp(struct l3d_backend *be, enum l3d_dtype dt, float *sumexp, float *tlogit,
                        const void *logits, const float *maxv, const int32_t *targets,
                        int64_t vocab_start, int64_t N, int64_t Vl, int64_t Vvalid) {
    KCALL(L3D_KF_XENT, "xent_sumexp", (double)N * Vl * esz(dt),
          be->i->xent_sumexp(be->ctx, dt, sumexp, tlogit, logits, maxv, targets, vocab_start, N,
                             Vl, Vvalid));
}

void l3d_be_xent_stats(struct l3d_backend *be, enum l3d_dtype dt, float *maxv, float *sumexp,
                       float *tlogit, const void *logits, const int32_t *targets,
                       int64_t vocab_start, int64_t N, int64_t Vl, int64_t Vvalid) {
    if (!be->i->xent_stats) { /* the unfused pair (the checking backend's oracle) */
        l3d_be_xent_max(be, dt, maxv, logits, N, Vl, Vvalid);
        l3d_be_xent_sumexp(be, dt, sumexp, tlogit, logits, maxv, targets, vocab_start, N, Vl,
                           Vvalid);
        return;
    }
    KCALL(L3D_KF_XENT, "xent_stats", (double)N * Vl * esz(dt),
          be->i->xent_stats(be->ctx, dt, maxv, sumexp, tlogit, logits, targets, vocab_start, N,
                            Vl, Vvalid));
}

void l3d_be_xent_backward(struct l3d_backend *be, enum l3d_dtype dt, void *logits,
                          const float *maxv, const float *sumexp, const int32_t *targets,
                          float dloss, int64_t vocab_start, int64_t N, int64_t Vl, int64_t Vvalid) {
    KCALL(L3D_KF_XENT, "xent_backward", (double)N * Vl * 2 * esz(dt),
          be->i->xent_backward(be->ctx, dt, logits, maxv, sumexp, targets, dloss, vocab_start, N,
                               Vl, Vvalid));
}

void l3d_be_xent_loss(struct l3d_backend *be, float *losses, double *loss_sum, const float *maxv,
                      const float *sumexp, const float *tlogit, int64_t N) {
    KCALL(L3D_KF_XENT, "xent_loss", 0,
          be->i->xent_loss(be->ctx, losses, loss_sum, maxv, sumexp, tlogit, N));
}

void l3d_be_adamw(struct l3d_backend *be, enum l3d_dtype dt, void *param, float *m, float *v,
                  const void *grad, float grad_scale, int64_t n, float lr, float beta1,
                  float beta2, float eps, float wd, float bc1, float bc2) {
    KCALL(L3D_KF_OPTIMIZER, "adamw", (double)n * (3 * esz(dt) + 16),
          be->i->adamw(be->ctx, dt, param, m, v, grad, grad_scale, n, lr, beta1, beta2, eps, wd,
                       bc1, bc2));
}

void l3d_be_sumsq(struct l3d_backend *be, enum l3d_dtype dt, double *acc, const void *x,
                  int64_t n) {
    KCALL(L3D_KF_OPTIMIZER, "sumsq", (double)n * esz(dt),
          be->i->sumsq(be->ctx, dt, acc, x, n));
}

void l3d_be_adamw_mixed(struct l3d_backend *be, enum l3d_dtype dt, enum l3d_dtype gdt,
                        void *param, float *master, float *m, float *v, const void *grad,
                        float grad_scale, int64_t n, float lr, float beta1, float beta2,
                        float eps, float wd, float bc1, float bc2) {
    KCALL(L3D_KF_OPTIMIZER, "adamw_mixed", (double)n * (esz(dt) + esz(gdt) + 24),
          be->i->adamw_mixed(be->ctx, dt, gdt, param, master, m, v, grad, grad_scale, n, lr, beta1,
                             beta2, eps, wd, bc1, bc2));
}

void l3d_be_adamw_zero(struct l3d_backend *be, enum l3d_dtype dt, enum l3d_dtype gdt, void *param,
                       float *master, float *m, float *v, void *grad, float grad_scale, int64_t n,
                       float lr, float beta1, float beta2, float eps, float wd, float bc1,
                       float bc2) {
    L3D_ASSERT(master || (dt == L3D_F32 && gdt == L3D_F32));
    if (!be->i->adamw_zero) { /* the unfused pair */
        if (master)
            l3d_be_adamw_mixed(be, dt, gdt, param, master, m, v, grad, grad_scale, n, lr, beta1,
                               beta2, eps, wd, bc1, bc2);
        else
            l3d_be_adamw(be, dt, param, m, v, grad, grad_scale, n, lr, beta1, beta2, eps, wd, bc1,
                         bc2);
        l3d_be_memset(be, grad, 0, (size_t)n * l3d_dtype_size(gdt));
        return;
    }
    /* the adamw or adamw_mixed traffic and the zeros written over the gradient */
    double bytes = master ? esz(dt) + 2 * esz(gdt) + 24 : 3 * esz(dt) + 16 + esz(gdt);
    KCALL(L3D_KF_OPTIMIZER, master ? "adamw_mixed_zero" : "adamw_zero", (double)n * bytes,
          be->i->adamw_zero(be->ctx, dt, gdt, param, master, m, v, grad, grad_scale, n, lr, beta1,
                            beta2, eps, wd, bc1, bc2));
}

void l3d_be_convert(struct l3d_backend *be, enum l3d_dtype dst_t, void *dst, enum l3d_dtype src_t,
                    const void *src, int64_t n) {
    KCALL(L3D_KF_OPTIMIZER, "convert", (double)n * (esz(dst_t) + esz(src_t)),
          be->i->convert(be->ctx, dst_t, dst, src_t, src, n));
}

void l3d_be_unscale(struct l3d_backend *be, enum l3d_dtype dt, float *found_inf, void *x,
                    float inv_scale, int64_t n) {
    KCALL(L3D_KF_OPTIMIZER, "unscale", (double)n * 2 * esz(dt),
          be->i->unscale(be->ctx, dt, found_inf, x, inv_scale, n));
}
