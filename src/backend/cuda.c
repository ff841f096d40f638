/*
 * The CUDA backend (src/backend/cuda.h): the device interface of backend-impl.h on one CUDA
 * device. EXPERIMENTAL: it compiles with -Werror in every CI run (`make test`, build-cuda) and its
 * host arithmetic is tested there (tests/cuda/test_cuda_host.c), but it has not yet run on a GPU;
 * scripts/gpu-check.sh is the first run (docs/DESIGN.md, "The CUDA backend").
 *
 * One stream per backend: every kernel, memset and copy is enqueued on it in issue order, which is
 * the interface's ordering. Copies to and from the host return when complete (the host buffer may
 * be reused at once); device-to-device copies and kernels are asynchronous; sync and event_wait
 * block the host. Device memory has no host view (host_view returns NULL for it): the NCCL
 * communicator takes device pointers as they are, and where NCCL cannot run (ranks sharing a
 * device) the communicator stages through host copies (src/comm/nccl.c).
 *
 * Matrix products are cuBLASLt's (fp32 compute; bf16/fp16 operands on tensor cores; the forward
 * bias fused as its epilogue), every other kernel is ours (cuda_kernels.cu): GPT-2's and Llama's
 * (RMSNorm, RoPE, SwiGLU, grouped-query attention), context parallelism's block attention and
 * the mixture-of-experts router, gather and combine (cuda_moe.cu; the experts' products are
 * cuBLASLt's, one an expert's rows, from src/model/moe.c).
 */
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend-impl.h"
#include "backend/cuda.h"
#include "backend/cuda_host.h"
#include "backend/cuda_kernels.h"

#define CUDA_CHECK(call)                                                                      \
    do {                                                                                      \
        cudaError_t e_ = (call);                                                              \
        if (e_ != cudaSuccess)                                                                \
            l3d_fatal(__FILE__, __LINE__, "backend cuda: %s failed: %s", #call,               \
                      cudaGetErrorString(e_));                                                \
    } while (0)
#define LT_CHECK(call)                                                                        \
    do {                                                                                      \
        cublasStatus_t s_ = (call);                                                           \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                      \
            l3d_fatal(__FILE__, __LINE__, "backend cuda: %s failed: %s", #call,               \
                      cublasLtGetStatusString(s_));                                           \
    } while (0)

#define L3D_LT_WORKSPACE ((size_t)32 << 20) /* cuBLASLt's scratch: 32 MiB, Hopper's advice */

/* the descriptors and the algorithm of one product shape (struct l3d_cuda_mm_key): plan_make */
struct lt_plan {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulAlgo_t algo;
};

struct cuda_ctx {
    int device;
    cudaStream_t stream;
    cublasLtHandle_t lt;
    void *workspace;
    struct l3d_cuda_allocs allocs;
    struct l3d_cuda_dev dev;
    char dev_name[256];
    double *partials; /* L3D_CUK_PARTIALS doubles: sumsq's per-block sums */
    struct l3d_cuda_plan_table plans; /* cuBLASLt plans by shape, plan[] slot for slot */
    struct lt_plan plan[L3D_CUDA_PLANS];
    /* scratch grown on demand: attention's D (floats), the encoder's grouping (bytes) */
    float *att_D;
    size_t att_D_n;
    void *enc;
    size_t enc_n;
    int n_events; /* live CUDA events: made by event_record, destroyed by event_destroy */
};

static const struct l3d_backend_i cuda_backend_i;

/* ---- memory ----------------------------------------------------------------------------------- */

static void *cuda_alloc(void *ctx, size_t bytes, const char *what) {
    struct cuda_ctx *cx = ctx;
    (void)what;
    void *p = NULL;
    /* cudaMalloc(0) gives NULL: one byte keeps every allocation a distinct, freeable pointer */
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        (void)cudaGetLastError(); /* out of memory: not sticky, clear it */
        return NULL;
    }
    l3d_cuda_allocs_add(&cx->allocs, p, bytes);
    l3d_mem_count(bytes, true);
    return p;
}

static void cuda_dfree(void *ctx, void *p) {
    struct cuda_ctx *cx = ctx;
    size_t bytes;
    if (!l3d_cuda_allocs_remove(&cx->allocs, p, &bytes))
        l3d_fatal(__FILE__, __LINE__, "backend cuda: freeing %p, which is not a live allocation "
                  "of this backend", p);
    CUDA_CHECK(cudaFree(p));
    l3d_mem_count(bytes, false);
}

/* scratch of n elements of size es in *buf (capacity *cap elements), grown, not accounted as
 * the model's memory is (it is the kernels' working space, a few MB). The old buffer may still
 * be read by kernels in flight: the stream drains before it is freed (growth is rare). */
static void *scratch(struct cuda_ctx *cx, void **buf, size_t *cap, size_t n, size_t es) {
    if (n <= *cap) return *buf;
    CUDA_CHECK(cudaStreamSynchronize(cx->stream));
    if (*buf) CUDA_CHECK(cudaFree(*buf));
    CUDA_CHECK(cudaMalloc(buf, n * es));
    *cap = n;
    return *buf;
}

static void cuda_memset(void *ctx, void *dst, int value, size_t bytes) {
    struct cuda_ctx *cx = ctx;
    CUDA_CHECK(cudaMemsetAsync(dst, value, bytes, cx->stream));
}
/* to and from the host: complete on return (the host buffer is the caller's again) */
static void cuda_copy_h2d(void *ctx, void *dst, const void *src, size_t bytes) {
    struct cuda_ctx *cx = ctx;
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cx->stream));
    CUDA_CHECK(cudaStreamSynchronize(cx->stream));
}
static void cuda_copy_d2h(void *ctx, void *dst, const void *src, size_t bytes) {
    struct cuda_ctx *cx = ctx;
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, cx->stream));
    CUDA_CHECK(cudaStreamSynchronize(cx->stream));
}
/* may overlap (memmove's contract): an overlapping copy goes through a scratch buffer */
static void cuda_copy_d2d(void *ctx, void *dst, const void *src, size_t bytes) {
    struct cuda_ctx *cx = ctx;
    const char *d = dst, *s = src;
    if (d + bytes <= s || s + bytes <= d) {
        CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cx->stream));
        return;
    }
    void *tmp;
    CUDA_CHECK(cudaMallocAsync(&tmp, bytes, cx->stream));
    CUDA_CHECK(cudaMemcpyAsync(tmp, src, bytes, cudaMemcpyDeviceToDevice, cx->stream));
    CUDA_CHECK(cudaMemcpyAsync(dst, tmp, bytes, cudaMemcpyDeviceToDevice, cx->stream));
    CUDA_CHECK(cudaFreeAsync(tmp, cx->stream));
}
static void cuda_sync(void *ctx) {
    struct cuda_ctx *cx = ctx;
    CUDA_CHECK(cudaStreamSynchronize(cx->stream));
}
static void cuda_event_record(void *ctx, struct l3d_event *ev) {
    struct cuda_ctx *cx = ctx;
    if (!ev->impl) {
        cudaEvent_t e;
        CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        ev->impl = e;
        cx->n_events++;
    }
    CUDA_CHECK(cudaEventRecord((cudaEvent_t)ev->impl, cx->stream));
}
static void cuda_event_wait(void *ctx, struct l3d_event *ev) {
    (void)ctx;
    CUDA_CHECK(cudaEventSynchronize((cudaEvent_t)ev->impl));
}
/* l3d_be_event_free: each event's CUDA event goes with it (a step may make and free events
 * without bound) */
static void cuda_event_destroy(void *ctx, struct l3d_event *ev) {
    struct cuda_ctx *cx = ctx;
    CUDA_CHECK(cudaEventDestroy((cudaEvent_t)ev->impl));
    ev->impl = NULL;
    cx->n_events--;
}

int l3d_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

bool l3d_cuda_is_device_ptr(const void *p) {
    struct cudaPointerAttributes a;
    if (!p || cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}
/* device memory has no host view (see the top of the file) */
static void *cuda_host_view(void *ctx, const void *p, size_t bytes) {
    (void)ctx;
    (void)bytes;
    return l3d_cuda_is_device_ptr(p) ? NULL : (void *)p;
}

static double cuda_peak_flops(void *ctx, enum l3d_dtype t) {
    struct cuda_ctx *cx = ctx;
    const char *source;
    return l3d_cuda_peak(&cx->dev, t, &source);
}
static bool cuda_matmul_native(void *ctx, enum l3d_dtype t) {
    (void)ctx;
    return t == L3D_F32 || t == L3D_BF16 || t == L3D_F16;
}

/* ---- types ------------------------------------------------------------------------------------ */

static bool is_float(enum l3d_dtype t) { return t == L3D_F32 || t == L3D_BF16 || t == L3D_F16; }
/* the kernels' code of a floating-point type; aborts for any other (kernel named) */
static int kt(enum l3d_dtype t, const char *kernel) {
    if (!is_float(t)) l3d_backend_no_variant("cuda", kernel, t);
    return t == L3D_F32 ? L3D_CUK_F32 : t == L3D_BF16 ? L3D_CUK_BF16 : L3D_CUK_F16;
}
/* parameter gradients of type dt, or fp32 (main_grad), as on the CPU */
static int gkt(enum l3d_dtype dt, enum l3d_dtype gdt, const char *kernel) {
    if (gdt != dt && gdt != L3D_F32)
        l3d_fatal(__FILE__, __LINE__, "backend cuda: %s has no variant for %s gradients of %s "
                  "activations", kernel, l3d_dtype_name(gdt), l3d_dtype_name(dt));
    return kt(gdt, kernel);
}
static cudaDataType_t cuda_type(enum l3d_dtype t) {
    return t == L3D_F32 ? CUDA_R_32F : t == L3D_BF16 ? CUDA_R_16BF : CUDA_R_16F;
}
/* after every launch: a bad configuration is reported where it happened */
static void launched(const char *kernel) {
    const char *e = l3d_cuk_last_error();
    if (e) l3d_fatal(__FILE__, __LINE__, "backend cuda: kernel %s: %s", kernel, e);
}

/* ---- matrix products (cuBLASLt) --------------------------------------------------------------- */

/* Column-major D (m,n) = op(A) op(B) (+ beta D) (+ bias (m), fused), fp32 compute. A, B of type
 * abt stored as (rows, cols) with leading dimension lda, ldb; D of type dt_d. Row-major tensors
 * are their transposes in column-major, which the callers use. */
struct lt_mm {
    cublasOperation_t ta, tb;
    int64_t m, n, k;
    enum l3d_dtype ab, d;
    const void *A, *B, *bias;
    int64_t lda, ldb, ldd;
    void *D;
    float beta;
};

static void plan_destroy(struct lt_plan *pl) {
    LT_CHECK(cublasLtMatrixLayoutDestroy(pl->ld));
    LT_CHECK(cublasLtMatrixLayoutDestroy(pl->lb));
    LT_CHECK(cublasLtMatrixLayoutDestroy(pl->la));
    LT_CHECK(cublasLtMatmulDescDestroy(pl->op));
}

/* min alignment preferences: cuBLASLt assumes 256 bytes unless told, and an algorithm that needs
 * more than a sub-buffer has is refused at launch */
static void plan_prefs(cublasLtMatmulPreference_t pref, const struct l3d_cuda_mm_key *k) {
    size_t ws = L3D_LT_WORKSPACE;
    uint32_t aa = (uint32_t)k->align_a, ab = (uint32_t)k->align_b, ad = (uint32_t)k->align_d;
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &ws, sizeof ws));
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa, sizeof aa));
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab, sizeof ab));
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ad, sizeof ad));
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ad, sizeof ad));
}

static void plan_make(struct cuda_ctx *cx, const struct lt_mm *p, const struct l3d_cuda_mm_key *k,
                      struct lt_plan *pl) {
    LT_CHECK(cublasLtMatmulDescCreate(&pl->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT_CHECK(cublasLtMatmulDescSetAttribute(pl->op, CUBLASLT_MATMUL_DESC_TRANSA, &p->ta,
                                            sizeof p->ta));
    LT_CHECK(cublasLtMatmulDescSetAttribute(pl->op, CUBLASLT_MATMUL_DESC_TRANSB, &p->tb,
                                            sizeof p->tb));
    if (k->bias) { /* the pointer itself is set at each call */
        cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
        cudaDataType_t bt = cuda_type(p->d);
        LT_CHECK(cublasLtMatmulDescSetAttribute(pl->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                                sizeof epi));
        LT_CHECK(cublasLtMatmulDescSetAttribute(pl->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt,
                                                sizeof bt));
    }
    bool an = p->ta == CUBLAS_OP_N, bn = p->tb == CUBLAS_OP_N;
    LT_CHECK(cublasLtMatrixLayoutCreate(&pl->la, cuda_type(p->ab), (uint64_t)(an ? p->m : p->k),
                                        (uint64_t)(an ? p->k : p->m), p->lda));
    LT_CHECK(cublasLtMatrixLayoutCreate(&pl->lb, cuda_type(p->ab), (uint64_t)(bn ? p->k : p->n),
                                        (uint64_t)(bn ? p->n : p->k), p->ldb));
    LT_CHECK(cublasLtMatrixLayoutCreate(&pl->ld, cuda_type(p->d), (uint64_t)p->m, (uint64_t)p->n,
                                        p->ldd));
    cublasLtMatmulPreference_t pref;
    LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    plan_prefs(pref, k);
    cublasLtMatmulHeuristicResult_t h;
    int found = 0;
    LT_CHECK(cublasLtMatmulAlgoGetHeuristic(cx->lt, pl->op, pl->la, pl->lb, pl->ld, pl->ld, pref, 1,
                                            &h, &found));
    LT_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    if (found == 0)
        l3d_fatal(__FILE__, __LINE__, "backend cuda: cuBLASLt has no algorithm for a %lld x %lld "
                  "x %lld product of %s into %s (alignments %lld, %lld, %lld bytes)",
                  (long long)p->m, (long long)p->n, (long long)p->k, l3d_dtype_name(p->ab),
                  l3d_dtype_name(p->d), (long long)k->align_a, (long long)k->align_b,
                  (long long)k->align_d);
    pl->algo = h.algo;
}

/* The product through the plan of its key, made on first use (heuristics and descriptors cost
 * tens of microseconds, more than a small product) */
static void lt_matmul(struct cuda_ctx *cx, const struct lt_mm *p) {
    struct l3d_cuda_mm_key k = {p->ta, p->tb, p->m, p->n, p->k, p->ab, p->d, p->lda, p->ldb,
                                p->ldd, p->bias != NULL, l3d_cuda_align(p->A),
                                l3d_cuda_align(p->B), l3d_cuda_align(p->D)};
    bool hit, evict;
    int slot = l3d_cuda_plan_slot(&cx->plans, &k, &hit, &evict);
    struct lt_plan *pl = &cx->plan[slot];
    if (!hit) {
        if (evict) plan_destroy(pl);
        plan_make(cx, p, &k, pl);
    }
    if (p->bias)
        LT_CHECK(cublasLtMatmulDescSetAttribute(pl->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                &p->bias, sizeof p->bias));
    const float alpha = 1.0f;
    LT_CHECK(cublasLtMatmul(cx->lt, pl->op, &alpha, p->A, pl->la, p->B, pl->lb, &p->beta, p->D,
                            pl->ld, p->D, pl->ld, &pl->algo, cx->workspace, L3D_LT_WORKSPACE,
                            cx->stream));
}

/* out (N,OC) = inp (N,C) W^T + bias: column-major out^T (OC,N) = W (C,OC)^T inp^T (C,N) */
static void cuda_matmul_forward(void *ctx, enum l3d_dtype dt, void *out, const void *inp,
                                const void *weight, const void *bias, int64_t N, int64_t C,
                                int64_t OC) {
    struct cuda_ctx *cx = ctx;
    int k = kt(dt, "matmul_forward");
    if (N == 0 || OC == 0) return;
    if (C == 0) { /* an empty sum: out = bias, or 0 (cuBLASLt refuses k = 0) */
        CUDA_CHECK(cudaMemsetAsync(out, 0, (size_t)(N * OC) * l3d_dtype_size(dt), cx->stream));
        if (bias) l3d_cuk_add_bias(k, out, bias, N, OC, cx->stream);
        launched("matmul_forward (bias)");
        return;
    }
    /* the bias epilogue reads the bias in vectors: fused when it is 16-byte aligned, else added
     * by our kernel after the product */
    bool fuse = bias && l3d_cuda_align(bias) >= 16;
    struct lt_mm p = {CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, dt, dt, weight, inp, fuse ? bias : NULL,
                      C, C, OC, out, 0.0f};
    lt_matmul(cx, &p);
    if (bias && !fuse) {
        l3d_cuk_add_bias(k, out, bias, N, OC, cx->stream);
        launched("matmul_forward (bias)");
    }
}

/* dinp (N,C) += dout W: column-major dinp^T (C,N) += W^T... = W_cm (C,OC) dout^T (OC,N);
 * dweight (OC,C) += dout^T inp: column-major (C,OC) += inp^T (C,N) dout (N,OC);
 * dbias += column sums of dout (our kernel: cuBLASLt's bias-gradient epilogue overwrites) */
static void cuda_matmul_backward(void *ctx, enum l3d_dtype dt, enum l3d_dtype gdt, void *dinp,
                                 void *dweight, void *dbias, const void *dout, const void *inp,
                                 const void *weight, int64_t N, int64_t C, int64_t OC) {
    struct cuda_ctx *cx = ctx;
    int k = kt(dt, "matmul_backward"), g = gkt(dt, gdt, "matmul_backward");
    if (N == 0 || OC == 0) return; /* nothing to add: every sum is over N or OC */
    if (dinp && C > 0) {
        struct lt_mm p = {CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, dt, dt, weight, dout, NULL,
                          C, OC, C, dinp, 1.0f};
        lt_matmul(cx, &p);
    }
    if (dweight && C > 0) {
        struct lt_mm p = {CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, dt, gdt, inp, dout, NULL,
                          C, OC, C, dweight, 1.0f};
        lt_matmul(cx, &p);
    }
    if (dbias) {
        l3d_cuk_colsum_add(k, g, dbias, dout, N, OC, cx->stream);
        launched("matmul_backward (bias)");
    }
}

/* ---- embedding -------------------------------------------------------------------------------- */

static void cuda_encoder_forward(void *ctx, enum l3d_dtype dt, void *out, const int32_t *tokens,
                                 const void *wte, const void *wpe, int64_t vocab_start,
                                 int64_t vocab_count, int64_t B, int64_t T, int64_t C) {
    struct cuda_ctx *cx = ctx;
    l3d_cuk_encoder_forward(kt(dt, "encoder_forward"), out, tokens, wte, wpe, vocab_start,
                            vocab_count, B, T, C, cx->stream);
    launched("encoder_forward");
}

static void cuda_encoder_backward(void *ctx, enum l3d_dtype dt, enum l3d_dtype gdt, void *dwte,
                                  void *dwpe, const void *dout, const int32_t *tokens,
                                  int64_t vocab_start, int64_t vocab_count, int64_t B, int64_t T,
                                  int64_t C) {
    struct cuda_ctx *cx = ctx;
    int k = kt(dt, "encoder_backward"), g = gkt(dt, gdt, "encoder_backward");
    if (dwte && B * T > 0) {
        /* each token's rows summed in position order and added once, as on the CPU; the
         * grouping runs on the device (a sort), so the pass never waits for the host */
        L3D_ASSERT(B * T <= INT32_MAX && vocab_count < INT32_MAX);
        size_t bytes = l3d_cuk_encoder_backward_wte_bytes(B * T, vocab_count);
        void *w = scratch(cx, &cx->enc, &cx->enc_n, bytes, 1);
        const char *e = l3d_cuk_encoder_backward_wte(k, g, dwte, dout, tokens, vocab_start,
                                                     vocab_count, B * T, C, w, bytes, cx->stream);
        if (e) l3d_fatal(__FILE__, __LINE__, "backend cuda: encoder_backward: %s failed: %s", e,
                         cudaGetErrorString(cudaGetLastError()));
        launched("encoder_backward");
    }
    if (dwpe) {
        l3d_cuk_encoder_backward_wpe(k, g, dwpe, dout, B, T, C, cx->stream);
        launched("encoder_backward");
    }
}

/* ---- LayerNorm, attention (grouped-query heads throughout) ------------------------------------ */

static void cuda_layernorm_forward(void *ctx, enum l3d_dtype dt, void *out, float *mean,
                                   float *rstd, const void *inp, const void *weight,
                                   const void *bias, int64_t N, int64_t C) {
    struct cuda_ctx *cx = ctx;
    l3d_cuk_layernorm_forward(kt(dt, "layernorm_forward"), out, mean, rstd, inp, weight, bias, N,
                              C, cx->stream);
    launched("layernorm_forward");
}
static void cuda_layernorm_backward(void *ctx, enum l3d_dtype dt, enum l3d_dtype gdt, void *dinp,
                                    void *dweight, void *dbias, const void *dout, const void *inp,
                                    const void *weight, const float *mean, const float *rstd,
                                    int64_t N, int64_t C) {
    struct cuda_ctx *cx = ctx;
    l3d_cuk_layernorm_backward(kt(dt, "layernorm_backward"), gkt(dt, gdt, "layernorm_backward"),
                               dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C,
                               cx->stream);
    launched("layernorm_backward");
}

/* the warp-per-row attention kernels hold a head of HS <= L3D_CUDA_MAX_HS elements */
static void head_size(int64_t HS, const char *kernel) {
    if (l3d_cuda_attn_per_lane(HS) == 0)
        l3d_fatal(__FILE__, __LINE__, "backend cuda: %s takes head sizes 1 to %d, not %lld",
                  kernel, L3D_CUDA_MAX_HS, (long long)HS);
}
/* grouped-query heads: NKV key/value heads dividing the NH query heads (as the CPU's check) */
static void gqa(int64_t NH, int64_t NKV, const char *kernel) {
    if (NKV < 1 || NH % NKV != 0)
        l3d_fatal(__FILE__, __LINE__, "backend cuda: %s: %lld query heads over %lld key/value "
                  "heads: the key/value heads must divide the query heads", kernel,
                  (long long)NH, (long long)NKV);
}
/* the backward pass's D (B*NH*nq floats) */
static float *att_D(struct cuda_ctx *cx, const struct l3d_cuk_attn *g) {
    return scratch(cx, (void **)&cx->att_D, &cx->att_D_n, (size_t)(g->B * g->NH * g->nq),
                   sizeof(float));
}
/* element e of a buffer of dt */
static const void *el(const void *p, enum l3d_dtype dt, int64_t e) {
    return (const char *)p + e * (int64_t)l3d_dtype_size(dt);
}
static void cuda_attention_forward(void *ctx, enum l3d_dtype dt, void *out, float *lse,
                                   const void *qkv, int64_t B, int64_t T, int64_t NH,
                                   int64_t NKV, int64_t HS) {
    struct cuda_ctx *cx = ctx;
    int k = kt(dt, "attention_forward");
    head_size(HS, "attention_forward");
    gqa(NH, NKV, "attention_forward");
    struct l3d_cuk_attn g = l3d_cuda_attn_full(B, T, NH, NKV, HS);
    l3d_cuk_attn_forward(k, out, lse, qkv, el(qkv, dt, NH * HS), el(qkv, dt, (NH + NKV) * HS),
                         &g, cx->stream);
    launched("attention_forward");
}
static void cuda_attention_backward(void *ctx, enum l3d_dtype dt, void *dqkv, const void *dout,
                                    const void *qkv, const void *out, const float *lse,
                                    int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS) {
    struct cuda_ctx *cx = ctx;
    int k = kt(dt, "attention_backward");
    head_size(HS, "attention_backward");
    gqa(NH, NKV, "attention_backward");
    struct l3d_cuk_attn g = l3d_cuda_attn_full(B, T, NH, NKV, HS);
    int64_t ko = NH * HS, vo = (NH + NKV) * HS;
    l3d_cuk_attn_backward(k, dqkv, (void *)el(dqkv, dt, ko), (void *)el(dqkv, dt, vo), dout, qkv,
                          el(qkv, dt, ko), el(qkv, dt, vo), out, lse, att_D(cx, &g), &g,
                          cx->stream);
    launched("attention_backward");
}
static void cuda_attention_cached(void *ctx, enum l3d_dtype dt, void *out, const void *q,
                                  const void *k, const void *v, int64_t pos, int64_t n,
                                  int64_t NH, int64_t NKV, int64_t HS, int64_t q_stride,
                                  int64_t kv_stride) {
    struct cuda_ctx *cx = ctx;
    int t = kt(dt, "attention_cached");
    head_size(HS, "attention_cached");
    gqa(NH, NKV, "attention_cached");
    struct l3d_cuk_attn g = l3d_cuda_attn_cached(pos, n, NH, NKV, HS, q_stride, kv_stride);
    l3d_cuk_attn_forward(t, out, NULL, q, k, v, &g, cx->stream);
    launched("attention_cached");
}

/* ---- block attention (context parallelism): the geometry checked by the dispatcher ------------ */

static void cuda_attention_block_forward(void *ctx, enum l3d_dtype dt, void *out, float *lse,
                                         const void *q, const void *k, const void *v,
                                         const struct l3d_attn_block *b) {
    struct cuda_ctx *cx = ctx;
    int t = kt(dt, "attention_block_forward");
    head_size(b->HS, "attention_block_forward");
    struct l3d_cuk_attn g = l3d_cuda_attn_block(b);
    l3d_cuk_attn_forward(t, out, lse, q, k, v, &g, cx->stream);
    launched("attention_block_forward");
}
static void cuda_attention_merge(void *ctx, enum l3d_dtype dt, void *out, float *lse,
                                 const void *out2, const float *lse2,
                                 const struct l3d_attn_block *b) {
    struct cuda_ctx *cx = ctx;
    struct l3d_cuk_attn g = l3d_cuda_attn_block(b);
    l3d_cuk_attn_merge(kt(dt, "attention_merge"), out, lse, out2, lse2, &g, cx->stream);
    launched("attention_merge");
}
static void cuda_attention_block_backward(void *ctx, enum l3d_dtype dt, void *dq, void *dk,
                                          void *dv, const void *dout, const void *q,
                                          const void *k, const void *v, const void *out,
                                          const float *lse, const struct l3d_attn_block *b) {
    struct cuda_ctx *cx = ctx;
    int t = kt(dt, "attention_block_backward");
    head_size(b->HS, "attention_block_backward");
    struct l3d_cuk_attn g = l3d_cuda_attn_block(b);
    l3d_cuk_attn_backward(t, dq, dk, dv, dout, q, k, v, out, lse, att_D(cx, &g), &g, cx->stream);
    launched("attention_block_backward");
}

/* ---- the Llama blocks: RMSNorm, rotary positions, SwiGLU -------------------------------------- */

static void cuda_rmsnorm_forward(void *ctx, enum l3d_dtype dt, void *out, float *rstd,
                                 const void *inp, const void *weight, int64_t N, int64_t C,
                                 float eps) {
    struct cuda_ctx *cx = ctx;
    l3d_cuk_rmsnorm_forward(kt(dt, "rmsnorm_forward"), out, rstd, inp, weight, N, C, eps,
                            cx->stream);
    launched("rmsnorm_forward");
}
static void cuda_rmsnorm_backward(void *ctx, enum l3d_dtype dt, enum l3d_dtype gdt, void *dinp,
                                  void *dweight, const void *dout, const void *inp,
                                  const void *weight, const float *rstd, int64_t N, int64_t C) {
    struct cuda_ctx *cx = ctx;
    l3d_cuk_rmsnorm_backward(kt(dt, "rmsnorm_backward"), gkt(dt, gdt, "rmsnorm_backward"), dinp,
                             dweight, dout, inp, weight, rstd, N, C, cx->stream);
    launched("rmsnorm_backward");
}
static void rope(struct cuda_ctx *cx, enum l3d_dtype dt, void *qkv, const float *inv_freq,
                 const int32_t *pos, int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS,
                 float sign, const char *kernel) {
    int t = kt(dt, kernel);
    gqa(NH, NKV, kernel);
    if (HS % 2 != 0)
        l3d_fatal(__FILE__, __LINE__, "backend cuda: %s: head size %lld is odd (rotary pairs "
                  "need an even one)", kernel, (long long)HS);
    l3d_cuk_rope(t, qkv, inv_freq, pos, B, T, NH, NKV, HS, sign, cx->stream);
    launched(kernel);
}
static void cuda_rope_forward(void *ctx, enum l3d_dtype dt, void *qkv, const float *inv_freq,
                              const int32_t *pos, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                              int64_t HS) {
    rope(ctx, dt, qkv, inv_freq, pos, B, T, NH, NKV, HS, 1.0f, "rope_forward");
}
static void cuda_rope_backward(void *ctx, enum l3d_dtype dt, void *dqkv, const float *inv_freq,
                               const int32_t *pos, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                               int64_t HS) {
    rope(ctx, dt, dqkv, inv_freq, pos, B, T, NH, NKV, HS, -1.0f, "rope_backward");
}
static void cuda_swiglu_forward(void *ctx, enum l3d_dtype dt, void *out, const void *inp,
                                int64_t N, int64_t H) {
    struct cuda_ctx *cx = ctx;
    l3d_cuk_swiglu(kt(dt, "swiglu_forward"), out, NULL, NULL, inp, N, H, cx->stream);
    launched("swiglu_forward");
}
static void cuda_swiglu_backward(void *ctx, enum l3d_dtype dt, void *dinp, const void *dout,
                                 const void *inp, int64_t N, int64_t H) {
    struct cuda_ctx *cx = ctx;
    l3d_cuk_swiglu(kt(dt, "swiglu_backward"), NULL, dinp, dout, inp, N, H, cx->stream);
    launched("swiglu_backward");
}

/* ---- mixture of experts (cuda_moe.cu) ------------------------------------------------------- */

/* the router's sizes the kernels take: K of E experts, int32 rows (N K of them), and E blocks of
 * the weight gradient's grid in y (65535 at most) */
static void moe_sizes(int64_t N, int64_t E, int64_t K, const char *kernel) {
    if (E < 1 || E > 65535 || K < 1 || K > E || N < 0 || N * K > INT32_MAX)
        l3d_fatal(__FILE__, __LINE__, "backend cuda: %s: %lld tokens choosing %lld of %lld "
                  "experts: the kernels take 1 to 65535 experts, top-k 1 to E and fewer than "
                  "2^31 assignments (lower --batch, --seq-len or --moe-top-k)", kernel,
                  (long long)N, (long long)K, (long long)E);
}
static void cuda_moe_route(void *ctx, enum l3d_dtype dt, float *probs, float *lse, int32_t *idx,
                           float *wts, int32_t *pos, int32_t *offsets, float *stats,
                           int32_t *work, const void *inp, const void *weight, int64_t N,
                           int64_t C, int64_t E, int64_t K, int norm_topk, int64_t capacity,
                           const int32_t *fill, int64_t segs, const int32_t *forced) {
    struct cuda_ctx *cx = ctx;
    (void)work; /* the kernels count in offsets themselves */
    int t = kt(dt, "moe_route");
    moe_sizes(N, E, K, "moe_route");
    CUDA_CHECK(cudaMemsetAsync(offsets, 0, (size_t)(E + 1) * sizeof *offsets, cx->stream));
    l3d_cuk_moe_route(t, probs, lse, idx, wts, pos, offsets, stats, inp, weight, N, C, E, K,
                      norm_topk, capacity, fill, segs, forced, cx->stream);
    launched("moe_route");
}
static void cuda_moe_permute(void *ctx, enum l3d_dtype dt, void *rows, const void *inp,
                             const int32_t *pos, int64_t N, int64_t K, int64_t C) {
    struct cuda_ctx *cx = ctx;
    l3d_cuk_moe_permute(kt(dt, "moe_permute"), rows, inp, pos, N, K, C, cx->stream);
    launched("moe_permute");
}
static void cuda_moe_combine(void *ctx, enum l3d_dtype dt, void *out, const void *rows,
                             const int32_t *pos, const float *wts, int64_t N, int64_t K,
                             int64_t C) {
    struct cuda_ctx *cx = ctx;
    l3d_cuk_moe_combine(kt(dt, "moe_combine"), out, rows, pos, wts, N, K, C, cx->stream);
    launched("moe_combine");
}
static void cuda_moe_combine_backward(void *ctx, enum l3d_dtype dt, void *drows, float *dwts,
                                      const void *dout, const void *rows, const int32_t *pos,
                                      const float *wts, int64_t N, int64_t K, int64_t C) {
    struct cuda_ctx *cx = ctx;
    l3d_cuk_moe_combine_backward(kt(dt, "moe_combine_backward"), drows, dwts, dout, rows, pos,
                                 wts, N, K, C, cx->stream);
    launched("moe_combine_backward");
}
static void cuda_moe_router_backward(void *ctx, enum l3d_dtype dt, enum l3d_dtype gdt,
                                     void *dinp, void *dweight, float *dlogits,
                                     const float *dwts, const void *inp, const void *weight,
                                     const float *probs, const float *lse, const int32_t *idx,
                                     const float *wts, const float *stats, int64_t N, int64_t C,
                                     int64_t E, int64_t K, int norm_topk, float aux_scale,
                                     float z_scale) {
    struct cuda_ctx *cx = ctx;
    int t = kt(dt, "moe_router_backward"), g = gkt(dt, gdt, "moe_router_backward");
    moe_sizes(N, E, K, "moe_router_backward");
    l3d_cuk_moe_router_backward(t, g, dinp, dweight, dlogits, dwts, inp, weight, probs, lse, idx,
                                wts, stats, N, C, E, K, norm_topk, aux_scale, z_scale,
                                cx->stream);
    launched("moe_router_backward");
}

/* ---- elementwise, cross-entropy --------------------------------------------------------------- */

static void ew(struct cuda_ctx *cx, int op, enum l3d_dtype dt, void *out, const void *a,
               const void *b, int64_t N, const char *kernel) {
    l3d_cuk_elementwise(op, kt(dt, kernel), out, a, b, N, cx->stream);
    launched(kernel);
}
static void cuda_gelu_forward(void *ctx, enum l3d_dtype dt, void *out, const void *inp,
                              int64_t N) {
    ew(ctx, 0, dt, out, inp, NULL, N, "gelu_forward");
}
static void cuda_gelu_backward(void *ctx, enum l3d_dtype dt, void *dinp, const void *dout,
                               const void *inp, int64_t N) {
    ew(ctx, 1, dt, dinp, inp, dout, N, "gelu_backward");
}
static void cuda_residual_forward(void *ctx, enum l3d_dtype dt, void *out, const void *a,
                                  const void *b, int64_t N) {
    ew(ctx, 2, dt, out, a, b, N, "residual_forward");
}
static void cuda_residual_norm_forward(void *ctx, enum l3d_dtype dt, void *res, void *out,
                                       float *mean, float *rstd, const void *a, const void *b,
                                       const void *weight, const void *bias, int64_t N, int64_t C,
                                       float eps) {
    struct cuda_ctx *cx = ctx;
    const char *k = mean ? "residual_layernorm_forward" : "residual_rmsnorm_forward";
    l3d_cuk_residual_norm_forward(kt(dt, k), res, out, mean, rstd, a, b, weight, bias, N, C, eps,
                                  cx->stream);
    launched(k);
}
static void cuda_add_inplace(void *ctx, enum l3d_dtype dt, void *dst, const void *src,
                             int64_t N) {
    ew(ctx, 2, dt, dst, dst, src, N, "add_inplace");
}
static void cuda_add_bias(void *ctx, enum l3d_dtype dt, void *out, const void *bias, int64_t N,
                          int64_t C) {
    struct cuda_ctx *cx = ctx;
    l3d_cuk_add_bias(kt(dt, "add_bias"), out, bias, N, C, cx->stream);
    launched("add_bias");
}

static void cuda_xent_max(void *ctx, enum l3d_dtype dt, float *maxv, const void *logits,
                          int64_t N, int64_t Vl, int64_t Vvalid) {
    struct cuda_ctx *cx = ctx;
    l3d_cuk_xent(0, kt(dt, "xent_max"), (void *)logits, maxv, NULL, NULL, NULL, NULL, 0.0f, 0, N,
                 Vl, Vvalid, cx->stream);
    launched("xent_max");
}
static void cuda_xent_sumexp(void *ctx, enum l3d_dtype dt, float *sumexp, float *tlogit,
                             const void *logits, const float *maxv, const int32_t *targets,
                             int64_t vocab_start, int64_t N, int64_t Vl, int64_t Vvalid) {
    struct cuda_ctx *cx = ctx;
    l3d_cuk_xent(1, kt(dt, "xent_sumexp"), (void *)logits, sumexp, tlogit, maxv, NULL, targets,
                 0.0f, vocab_start, N, Vl, Vvalid, cx->stream);
    launched("xent_sumexp");
}
static void cuda_xent_backward(void *ctx, enum l3d_dtype dt, void *logits, const float *maxv,
                               const float *sumexp, const int32_t *targets, float dloss,
                               int64_t vocab_start, int64_t N, int64_t Vl, int64_t Vvalid) {
    struct cuda_ctx *cx = ctx;
    l3d_cuk_xent(2, kt(dt, "xent_backward"), logits, NULL, NULL, maxv, sumexp, targets, dloss,
                 vocab_start, N, Vl, Vvalid, cx->stream);
    launched("xent_backward");
}
static void cuda_xent_loss(void *ctx, float *losses, double *loss_sum, const float *maxv,
                           const float *sumexp, const float *tlogit, int64_t N) {
    struct cuda_ctx *cx = ctx;
    l3d_cuk_xent_loss(losses, loss_sum, maxv, sumexp, tlogit, N, cx->stream);
    launched("xent_loss");
}

/* ---- optimizer, norms, conversions ------------------------------------------------------------ */

static void cuda_adamw(void *ctx, enum l3d_dtype dt, void *param, float *m, float *v,
                       const void *grad, float grad_scale, int64_t n, float lr, float beta1,
                       float beta2, float eps, float wd, float bc1, float bc2) {
    struct cuda_ctx *cx = ctx;
    if (dt != L3D_F32) l3d_backend_no_variant("cuda", "adamw", dt);
    /* fp32: the parameters are their own master weights */
    l3d_cuk_adamw(L3D_CUK_F32, L3D_CUK_F32, NULL, param, m, v, (void *)grad, false, grad_scale,
                  n, lr, beta1, beta2, eps, wd, bc1, bc2, cx->stream);
    launched("adamw");
}
static void cuda_adamw_mixed(void *ctx, enum l3d_dtype dt, enum l3d_dtype gdt, void *param,
                             float *master, float *m, float *v, const void *grad,
                             float grad_scale, int64_t n, float lr, float beta1, float beta2,
                             float eps, float wd, float bc1, float bc2) {
    struct cuda_ctx *cx = ctx;
    l3d_cuk_adamw(kt(dt, "adamw_mixed"), gkt(dt, gdt, "adamw_mixed"), param, master, m, v,
                  (void *)grad, false, grad_scale, n, lr, beta1, beta2, eps, wd, bc1, bc2,
                  cx->stream);
    launched("adamw_mixed");
}
/* adamw (master NULL) or adamw_mixed with the gradient zeroed in the same kernel (compiled, not
 * yet run on a GPU: no GPU was at hand when it was written) */
static void cuda_adamw_zero(void *ctx, enum l3d_dtype dt, enum l3d_dtype gdt, void *param,
                            float *master, float *m, float *v, void *grad, float grad_scale,
                            int64_t n, float lr, float beta1, float beta2, float eps, float wd,
                            float bc1, float bc2) {
    struct cuda_ctx *cx = ctx;
    if (!master && (dt != L3D_F32 || gdt != L3D_F32)) l3d_backend_no_variant("cuda", "adamw", dt);
    if (master)
        l3d_cuk_adamw(kt(dt, "adamw_zero"), gkt(dt, gdt, "adamw_zero"), param, master, m, v, grad,
                      true, grad_scale, n, lr, beta1, beta2, eps, wd, bc1, bc2, cx->stream);
    else /* fp32: the parameters are their own master weights */
        l3d_cuk_adamw(L3D_CUK_F32, L3D_CUK_F32, NULL, param, m, v, grad, true, grad_scale, n, lr,
                      beta1, beta2, eps, wd, bc1, bc2, cx->stream);
    launched("adamw_zero");
}
static void cuda_sumsq(void *ctx, enum l3d_dtype dt, double *acc, const void *x, int64_t n) {
    struct cuda_ctx *cx = ctx;
    l3d_cuk_sumsq(kt(dt, "sumsq"), acc, x, n, cx->partials, cx->stream);
    launched("sumsq");
}
static void cuda_convert(void *ctx, enum l3d_dtype dst_t, void *dst, enum l3d_dtype src_t,
                         const void *src, int64_t n) {
    struct cuda_ctx *cx = ctx;
    int d = kt(dst_t, "convert"), s = kt(src_t, "convert");
    if (dst_t == src_t) {
        if (dst != src) cuda_copy_d2d(cx, dst, src, (size_t)n * l3d_dtype_size(dst_t));
        return;
    }
    l3d_cuk_convert(d, dst, s, src, n, cx->stream);
    launched("convert");
}
static void cuda_unscale(void *ctx, enum l3d_dtype dt, float *found_inf, void *x,
                         float inv_scale, int64_t n) {
    struct cuda_ctx *cx = ctx;
    l3d_cuk_unscale(kt(dt, "unscale"), found_inf, x, inv_scale, n, cx->stream);
    launched("unscale");
}

/* ---- the table -------------------------------------------------------------------------------- */

static void close_device(struct cuda_ctx *cx);
static void cuda_free(void *ctx) {
    struct cuda_ctx *cx = ctx;
    close_device(cx);
    l3d_cuda_allocs_free(&cx->allocs);
    l3d_free(cx);
}

static const struct l3d_backend_i cuda_backend_i = {
    .name = "cuda",
    .free = cuda_free,
    .alloc = cuda_alloc,
    .dfree = cuda_dfree,
    .memset = cuda_memset,
    .copy_h2d = cuda_copy_h2d,
    .copy_d2h = cuda_copy_d2h,
    .copy_d2d = cuda_copy_d2d,
    .sync = cuda_sync,
    .event_record = cuda_event_record,
    .event_wait = cuda_event_wait,
    .event_destroy = cuda_event_destroy,
    .peak_flops = cuda_peak_flops,
    .matmul_native = cuda_matmul_native,
    .host_view = cuda_host_view,
    .matmul_forward = cuda_matmul_forward,
    .matmul_backward = cuda_matmul_backward,
    .encoder_forward = cuda_encoder_forward,
    .encoder_backward = cuda_encoder_backward,
    .layernorm_forward = cuda_layernorm_forward,
    .layernorm_backward = cuda_layernorm_backward,
    .attention_forward = cuda_attention_forward,
    .attention_backward = cuda_attention_backward,
    .attention_naive_forward = NULL, /* the CPU backend's oracle pair: not on the GPU */
    .attention_naive_backward = NULL,
    .attention_cached = cuda_attention_cached,
    .attention_block_forward = cuda_attention_block_forward,
    .attention_merge = cuda_attention_merge,
    .attention_block_backward = cuda_attention_block_backward,
    .rmsnorm_forward = cuda_rmsnorm_forward,
    .rmsnorm_backward = cuda_rmsnorm_backward,
    .rope_forward = cuda_rope_forward,
    .rope_backward = cuda_rope_backward,
    .swiglu_forward = cuda_swiglu_forward,
    .swiglu_backward = cuda_swiglu_backward,
    .gelu_forward = cuda_gelu_forward,
    .gelu_backward = cuda_gelu_backward,
    .residual_forward = cuda_residual_forward,
    .residual_norm_forward = cuda_residual_norm_forward,
    .add_inplace = cuda_add_inplace,
    .add_bias = cuda_add_bias,
    .moe_route = cuda_moe_route,
    .moe_permute = cuda_moe_permute,
    .moe_combine = cuda_moe_combine,
    .moe_combine_backward = cuda_moe_combine_backward,
    .moe_router_backward = cuda_moe_router_backward,
    .xent_max = cuda_xent_max,
    .xent_sumexp = cuda_xent_sumexp,
    .xent_backward = cuda_xent_backward,
    .xent_loss = cuda_xent_loss,
    .adamw = cuda_adamw,
    .sumsq = cuda_sumsq,
    .adamw_mixed = cuda_adamw_mixed,
    .adamw_zero = cuda_adamw_zero,
    .convert = cuda_convert,
    .unscale = cuda_unscale,
};

/* the device's name, architecture, SMs and clock for the peak table (cuda_host.c) */
static void read_device(struct cuda_ctx *cx) {
    struct cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, cx->device));
    snprintf(cx->dev_name, sizeof cx->dev_name, "%s", prop.name);
    int clock_khz = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, cx->device));
    cx->dev = (struct l3d_cuda_dev){cx->dev_name, prop.major, prop.minor,
                                    prop.multiProcessorCount, clock_khz};
}

/* the stream, cuBLASLt and the fixed scratch on cx->device */
static void open_device(struct cuda_ctx *cx) {
    CUDA_CHECK(cudaSetDevice(cx->device));
    CUDA_CHECK(cudaStreamCreateWithFlags(&cx->stream, cudaStreamNonBlocking));
    LT_CHECK(cublasLtCreate(&cx->lt));
    CUDA_CHECK(cudaMalloc(&cx->workspace, L3D_LT_WORKSPACE));
    CUDA_CHECK(cudaMalloc((void **)&cx->partials, L3D_CUK_PARTIALS * sizeof(double)));
    read_device(cx);
}
static void close_device(struct cuda_ctx *cx) {
    cudaStreamSynchronize(cx->stream);
    cudaFree(cx->att_D);
    cudaFree(cx->enc);
    cudaFree(cx->partials);
    cudaFree(cx->workspace);
    for (int i = 0; i < cx->plans.used; i++) plan_destroy(&cx->plan[i]);
    cx->plans = (struct l3d_cuda_plan_table){0};
    cublasLtDestroy(cx->lt);
    cudaStreamDestroy(cx->stream);
    cx->att_D = NULL;
    cx->enc = NULL;
    cx->att_D_n = cx->enc_n = 0;
}

void l3d_backend_cuda_rebind(struct l3d_backend *be, int local_rank) {
    L3D_ASSERT(l3d_backend_is_cuda(be));
    struct cuda_ctx *cx = be->ctx;
    int ndev = 0;
    CUDA_CHECK(cudaGetDeviceCount(&ndev));
    int d = l3d_cuda_pick_device(local_rank, ndev);
    if (d == cx->device) return;
    L3D_ASSERT(cx->allocs.count == 0 && cx->n_events == 0);
    close_device(cx);
    cx->device = d;
    open_device(cx);
}

struct l3d_backend *l3d_backend_cuda_init(void) {
    int local = l3d_cuda_env_local_rank(), ndev = 0;
    if (local <= 0)
        fprintf(stderr, "llm3d: the CUDA backend has not yet run on a GPU (experimental)\n");
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0)
        l3d_fatal(__FILE__, __LINE__, "backend cuda: no CUDA device (%s): run on a machine with "
                  "a GPU, or use --backend cpu", e != cudaSuccess ? cudaGetErrorString(e) :
                  "cudaGetDeviceCount found none");
    struct cuda_ctx *cx = l3d_calloc(sizeof *cx, "cuda backend");
    cx->device = l3d_cuda_pick_device(local, ndev);
    open_device(cx);
    return l3d_backend_make(&cuda_backend_i, cx);
}

bool l3d_backend_is_cuda(const struct l3d_backend *be) { return be && be->i == &cuda_backend_i; }
void *l3d_backend_cuda_stream(struct l3d_backend *be) {
    L3D_ASSERT(l3d_backend_is_cuda(be));
    return ((struct cuda_ctx *)be->ctx)->stream;
}
int l3d_backend_cuda_device(struct l3d_backend *be) {
    L3D_ASSERT(l3d_backend_is_cuda(be));
    return ((struct cuda_ctx *)be->ctx)->device;
}
