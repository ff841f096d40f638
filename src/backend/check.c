/*
 * The checking backend ("check", L3D_BACKEND=check): the CPU kernels behind a device arena that
 * host code cannot touch, so that the test suite proves the device interface is honest before a
 * GPU exists.
 *
 * Every buffer is a memfd mapped twice: a device view, PROT_NONE, whose address is what
 * l3d_be_alloc returns and what the model, the optimizer and the parallel layers pass around;
 * and a host view the kernels work on. So:
 *   - host code that dereferences, memsets or memcpys device memory faults at once; the SIGSEGV
 *     handler names the buffer and the offset before the process dies;
 *   - every pointer that reaches a kernel or a copy is looked up in the registry of buffers
 *     (sorted by address, binary search) with the extent the kernel will touch: a host pointer, a
 *     pointer of another backend, or a range past the end of its buffer aborts with the kernel's
 *     and the argument's name; so does a host-to-device copy whose source is device memory (and
 *     the other directions alike);
 *   - communicators reach device memory through l3d_be_host_view, as an MPI that can read GPU
 *     memory would.
 * The kernels are the CPU backend's, so results are bit-identical to "cpu".
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <signal.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend/backend-impl.h"
#include "backend/check.h"

struct region {
    char *dev, *host; /* device view (PROT_NONE) and host view of the same pages */
    size_t bytes;     /* what was asked for */
    size_t map;       /* mapped: bytes rounded up to pages */
    const char *what;
};

struct chk {
    struct l3d_backend *inner;
    struct region *r; /* sorted by dev */
    int n, cap;
};

/* The fault handler reads the live registries (one per process in practice). */
static struct chk *volatile fault_reg;

static void on_fault(int sig, siginfo_t *si, void *uc) {
    (void)uc;
    struct chk *c = fault_reg;
    const char *addr = si->si_addr;
    for (int i = 0; c && i < c->n; i++) {
        const struct region *g = &c->r[i];
        if (addr >= g->dev && addr < g->dev + g->map) {
            char msg[512];
            int k = snprintf(msg, sizeof msg,
                             "llm3d: check backend: host code touched device memory at %p "
                             "(offset %zu of the %zu-byte buffer '%s'): copy it with "
                             "l3d_be_copy_d2h / h2d, or use a kernel\n",
                             (void *)addr, (size_t)(addr - g->dev), g->bytes, g->what);
            if (k > 0) (void)!write(2, msg, (size_t)k < sizeof msg ? (size_t)k : sizeof msg - 1);
            break;
        }
    }
    signal(sig, SIG_DFL); /* the faulting access runs again and ends the process */
}

static void install_fault_handler(struct chk *c) {
    fault_reg = c;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, NULL);
}

/* The region holding p, or NULL. */
static struct region *find(struct chk *c, const void *p) {
    const char *a = p;
    int lo = 0, hi = c->n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        struct region *g = &c->r[mid];
        if (a < g->dev)
            hi = mid - 1;
        else if (a >= g->dev + (g->bytes ? g->bytes : 1))
            lo = mid + 1;
        else
            return g;
    }
    return NULL;
}

/* The host view of [p, p + bytes), which must lie inside one device buffer; NULL stays NULL. */
static void *dev(struct chk *c, const void *p, size_t bytes, const char *op, const char *arg) {
    if (!p) return NULL;
    struct region *g = find(c, p);
    if (!g)
        l3d_fatal(__FILE__, __LINE__, "check backend: %s: %s = %p is not device memory of this "
                  "backend (a host pointer, or another backend's)", op, arg, p);
    size_t off = (size_t)((const char *)p - g->dev);
    if (bytes > g->bytes - off)
        l3d_fatal(__FILE__, __LINE__, "check backend: %s: %s reaches %zu bytes from offset %zu of "
                  "the %zu-byte buffer '%s': past its end", op, arg, bytes, off, g->bytes,
                  g->what);
    return g->host + off;
}

/* A host buffer, which must not be device memory. */
static void *host(struct chk *c, const void *p, const char *op, const char *arg) {
    if (find(c, p))
        l3d_fatal(__FILE__, __LINE__, "check backend: %s: %s = %p is device memory where host "
                  "memory is expected", op, arg, p);
    return (void *)p;
}

static void *chk_alloc(void *ctx, size_t bytes, const char *what) {
    struct chk *c = ctx;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t map = ((bytes ? bytes : 1) + page - 1) / page * page;
    int fd = memfd_create("l3d-check", MFD_CLOEXEC);
    if (fd < 0) return NULL;
    void *h = MAP_FAILED, *d = MAP_FAILED;
    if (ftruncate(fd, (off_t)map) == 0) {
        h = mmap(NULL, map, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        d = mmap(NULL, map, PROT_NONE, MAP_SHARED, fd, 0);
    }
    close(fd);
    if (h == MAP_FAILED || d == MAP_FAILED) {
        if (h != MAP_FAILED) munmap(h, map);
        if (d != MAP_FAILED) munmap(d, map);
        return NULL;
    }
    if (c->n == c->cap) {
        int cap = c->cap ? 2 * c->cap : 64;
        /* the checker's own bookkeeping: not counted with the memory the program uses */
        struct region *r = realloc(c->r, (size_t)cap * sizeof *r);
        if (!r) l3d_fatal(__FILE__, __LINE__, "check backend: out of memory for its registry");
        c->r = r;
        c->cap = cap;
    }
    int i = c->n;
    while (i > 0 && c->r[i - 1].dev > (char *)d) i--; /* keep the registry sorted */
    memmove(&c->r[i + 1], &c->r[i], (size_t)(c->n - i) * sizeof *c->r);
    c->r[i] = (struct region){.dev = d, .host = h, .bytes = bytes, .map = map, .what = what};
    c->n++;
    l3d_mem_count(bytes, true);
    return d;
}

static void chk_dfree(void *ctx, void *p) {
    struct chk *c = ctx;
    struct region *g = find(c, p);
    if (!g || g->dev != (char *)p)
        l3d_fatal(__FILE__, __LINE__, "check backend: freeing %p, which is not the start of a "
                  "device buffer of this backend", p);
    munmap(g->dev, g->map);
    munmap(g->host, g->map);
    l3d_mem_count(g->bytes, false);
    int i = (int)(g - c->r);
    memmove(&c->r[i], &c->r[i + 1], (size_t)(c->n - i - 1) * sizeof *c->r);
    c->n--;
}

static void chk_memset(void *ctx, void *dst, int value, size_t bytes) {
    memset(dev(ctx, dst, bytes, "memset", "dst"), value, bytes);
}
static void chk_copy_h2d(void *ctx, void *dst, const void *src, size_t bytes) {
    memcpy(dev(ctx, dst, bytes, "copy_h2d", "dst"), host(ctx, src, "copy_h2d", "src"), bytes);
}
static void chk_copy_d2h(void *ctx, void *dst, const void *src, size_t bytes) {
    memcpy(host(ctx, dst, "copy_d2h", "dst"), dev(ctx, src, bytes, "copy_d2h", "src"), bytes);
}
static void chk_copy_d2d(void *ctx, void *dst, const void *src, size_t bytes) {
    memmove(dev(ctx, dst, bytes, "copy_d2d", "dst"), dev(ctx, src, bytes, "copy_d2d", "src"),
            bytes);
}
static void chk_sync(void *ctx) { l3d_be_sync(((struct chk *)ctx)->inner); }
static double chk_peak_flops(void *ctx, enum l3d_dtype t) {
    return l3d_be_peak_flops(((struct chk *)ctx)->inner, t);
}
static bool chk_matmul_native(void *ctx, enum l3d_dtype t) {
    return l3d_be_matmul_native(((struct chk *)ctx)->inner, t);
}
static int64_t chk_matmul_wgrad_block(void *ctx, enum l3d_dtype t) {
    return l3d_be_matmul_wgrad_block(((struct chk *)ctx)->inner, t);
}
static bool chk_attention_native(void *ctx, enum l3d_dtype t) {
    return l3d_be_attention_native(((struct chk *)ctx)->inner, t);
}
static bool chk_attention_p16(void *ctx, enum l3d_dtype t, int64_t HS) {
    return l3d_be_attention_p16(((struct chk *)ctx)->inner, t, HS);
}
static void *chk_host_view(void *ctx, const void *p, size_t bytes) {
    struct chk *c = ctx;
    return find(c, p) ? dev(c, p, bytes, "host_view", "buffer") : (void *)p;
}

static void chk_free(void *ctx) {
    struct chk *c = ctx;
    if (fault_reg == c) fault_reg = NULL;
    while (c->n) chk_dfree(c, c->r[c->n - 1].dev); /* buffers the caller did not free */
    free(c->r);
    l3d_backend_free(c->inner);
    l3d_free(c);
}

/* ---- kernels: every pointer translated with the extent the kernel touches -------------- */

#define IN(c) ((c)->inner)
#define D(p, n, name) dev(c, p, (size_t)(n), name, #p)

static void chk_matmul_forward(void *ctx, enum l3d_dtype dt, void *out, const void *inp,
                               const void *weight, const void *bias, int64_t N, int64_t C,
                               int64_t OC) {
    struct chk *c = ctx;
    size_t e = l3d_dtype_size(dt);
    const char *k = "matmul_forward";
    l3d_be_matmul_forward(IN(c), dt, D(out, N * OC * e, k), D(inp, N * C * e, k),
                          D(weight, OC * C * e, k), D(bias, OC * e, k), N, C, OC);
}
static void chk_matmul_backward(void *ctx, enum l3d_dtype dt, enum l3d_dtype gdt, void *dinp,
                                void *dweight, void *dbias, const void *dout, const void *inp,
                                const void *weight, int64_t N, int64_t C, int64_t OC) {
    struct chk *c = ctx;
    size_t e = l3d_dtype_size(dt), ge = l3d_dtype_size(gdt);
    const char *k = "matmul_backward";
    l3d_be_matmul_backward_mixed(IN(c), dt, gdt, D(dinp, N * C * e, k),
                                 D(dweight, OC * C * ge, k), D(dbias, OC * ge, k),
                                 D(dout, N * OC * e, k), D(inp, N * C * e, k),
                                 D(weight, OC * C * e, k), N, C, OC);
}
static void chk_encoder_forward(void *ctx, enum l3d_dtype dt, void *out, const int32_t *tokens,
                                const void *wte, const void *wpe, int64_t vocab_start,
                                int64_t vocab_count, int64_t B, int64_t T, int64_t C) {
    struct chk *c = ctx;
    size_t e = l3d_dtype_size(dt);
    const char *k = "encoder_forward";
    l3d_be_encoder_forward(IN(c), dt, D(out, B * T * C * e, k), D(tokens, B * T * 4, k),
                           D(wte, vocab_count * C * e, k), D(wpe, T * C * e, k), vocab_start,
                           vocab_count, B, T, C);
}
static void chk_encoder_backward(void *ctx, enum l3d_dtype dt, enum l3d_dtype gdt, void *dwte,
                                 void *dwpe, const void *dout, const int32_t *tokens,
                                 int64_t vocab_start, int64_t vocab_count, int64_t B, int64_t T,
                                 int64_t C) {
    struct chk *c = ctx;
    size_t e = l3d_dtype_size(dt), ge = l3d_dtype_size(gdt);
    const char *k = "encoder_backward";
    l3d_be_encoder_backward_mixed(IN(c), dt, gdt, D(dwte, vocab_count * C * ge, k),
                                  D(dwpe, T * C * ge, k), D(dout, B * T * C * e, k),
                                  D(tokens, B * T * 4, k), vocab_start, vocab_count, B, T, C);
}
static void chk_layernorm_forward(void *ctx, enum l3d_dtype dt, void *out, float *mean,
                                  float *rstd, const void *inp, const void *weight,
                                  const void *bias, int64_t N, int64_t C) {
    struct chk *c = ctx;
    size_t e = l3d_dtype_size(dt);
    const char *k = "layernorm_forward";
    l3d_be_layernorm_forward(IN(c), dt, D(out, N * C * e, k), D(mean, N * 4, k),
                             D(rstd, N * 4, k), D(inp, N * C * e, k), D(weight, C * e, k),
                             D(bias, C * e, k), N, C);
}
static void chk_layernorm_backward(void *ctx, enum l3d_dtype dt, enum l3d_dtype gdt, void *dinp,
                                   void *dweight, void *dbias, const void *dout, const void *inp,
                                   const void *weight, const float *mean, const float *rstd,
                                   int64_t N, int64_t C) {
    struct chk *c = ctx;
    size_t e = l3d_dtype_size(dt), ge = l3d_dtype_size(gdt);
    const char *k = "layernorm_backward";
    l3d_be_layernorm_backward_mixed(IN(c), dt, gdt, D(dinp, N * C * e, k), D(dweight, C * ge, k),
                                    D(dbias, C * ge, k), D(dout, N * C * e, k),
                                    D(inp, N * C * e, k), D(weight, C * e, k), D(mean, N * 4, k),
                                    D(rstd, N * 4, k), N, C);
}
static void chk_attention_forward(void *ctx, enum l3d_dtype dt, void *out, float *lse,
                                  const void *qkv, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                                  int64_t HS) {
    struct chk *c = ctx;
    size_t e = l3d_dtype_size(dt);
    const char *k = "attention_forward";
    l3d_be_attention_forward(IN(c), dt, D(out, B * T * NH * HS * e, k), D(lse, B * NH * T * 4, k),
                             D(qkv, B * T * (NH + 2 * NKV) * HS * e, k), B, T, NH, NKV, HS);
}
static void chk_attention_backward(void *ctx, enum l3d_dtype dt, void *dqkv, const void *dout,
                                   const void *qkv, const void *out, const float *lse, int64_t B,
                                   int64_t T, int64_t NH, int64_t NKV, int64_t HS) {
    struct chk *c = ctx;
    size_t e = l3d_dtype_size(dt);
    const char *k = "attention_backward";
    int64_t nqkv = B * T * (NH + 2 * NKV) * HS * (int64_t)e;
    l3d_be_attention_backward(IN(c), dt, D(dqkv, nqkv, k), D(dout, B * T * NH * HS * e, k),
                              D(qkv, nqkv, k), D(out, B * T * NH * HS * e, k),
                              D(lse, B * NH * T * 4, k), B, T, NH, NKV, HS);
}
static void chk_attention_naive_forward(void *ctx, enum l3d_dtype dt, void *out, void *att,
                                        const void *qkv, int64_t B, int64_t T, int64_t NH,
                                        int64_t NKV, int64_t HS) {
    struct chk *c = ctx;
    size_t e = l3d_dtype_size(dt);
    const char *k = "attention_naive_forward";
    l3d_be_attention_naive_forward(IN(c), dt, D(out, B * T * NH * HS * e, k),
                                   D(att, B * NH * T * T * e, k),
                                   D(qkv, B * T * (NH + 2 * NKV) * HS * e, k), B, T, NH, NKV, HS);
}
static void chk_attention_naive_backward(void *ctx, enum l3d_dtype dt, void *dqkv, void *datt,
                                         const void *dout, const void *qkv, const void *att,
                                         int64_t B, int64_t T, int64_t NH, int64_t NKV,
                                         int64_t HS) {
    struct chk *c = ctx;
    size_t e = l3d_dtype_size(dt);
    const char *k = "attention_naive_backward";
    int64_t nqkv = B * T * (NH + 2 * NKV) * HS * (int64_t)e;
    l3d_be_attention_naive_backward(IN(c), dt, D(dqkv, nqkv, k), D(datt, B * NH * T * T * e, k),
                                    D(dout, B * T * NH * HS * e, k), D(qkv, nqkv, k),
                                    D(att, B * NH * T * T * e, k), B, T, NH, NKV, HS);
}
static void chk_attention_cached(void *ctx, enum l3d_dtype dt, void *out, const void *q,
                                 const void *kc, const void *vc, int64_t pos, int64_t n,
                                 int64_t NH, int64_t NKV, int64_t HS, int64_t q_stride,
                                 int64_t kv_stride) {
    struct chk *c = ctx;
    size_t e = l3d_dtype_size(dt);
    const char *k = "attention_cached";
    int64_t C = NH * HS, kv = ((pos + n - 1) * kv_stride + NKV * HS) * (int64_t)e;
    l3d_be_attention_cached(IN(c), dt, D(out, n * C * e, k), D(q, ((n - 1) * q_stride + C) * e, k),
                            D(kc, kv, k), D(vc, kv, k), pos, n, NH, NKV, HS, q_stride, kv_stride);
}
static void chk_rmsnorm_forward(void *ctx, enum l3d_dtype dt, void *out, float *rstd,
                                const void *inp, const void *weight, int64_t N, int64_t C,
                                float eps) {
    struct chk *c = ctx;
    size_t e = l3d_dtype_size(dt);
    const char *k = "rmsnorm_forward";
    l3d_be_rmsnorm_forward(IN(c), dt, D(out, N * C * e, k), D(rstd, N * 4, k),
                           D(inp, N * C * e, k), D(weight, C * e, k), N, C, eps);
}
static void chk_rmsnorm_backward(void *ctx, enum l3d_dtype dt, enum l3d_dtype gdt, void *dinp,
                                 void *dweight, const void *dout, const void *inp,
                                 const void *weight, const float *rstd, int64_t N, int64_t C) {
    struct chk *c = ctx;
    size_t e = l3d_dtype_size(dt), ge = l3d_dtype_size(gdt);
    const char *k = "rmsnorm_backward";
    l3d_be_rmsnorm_backward(IN(c), dt, gdt, D(dinp, N * C * e, k), D(dweight, C * ge, k),
                            D(dout, N * C * e, k), D(inp, N * C * e, k), D(weight, C * e, k),
                            D(rstd, N * 4, k), N, C);
}
/* both directions: the same extents */
static void chk_rope(void *ctx, enum l3d_dtype dt, void *qkv, const float *inv_freq,
                     const int32_t *pos, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                     int64_t HS, int backward) {
    struct chk *c = ctx;
    const char *k = backward ? "rope_backward" : "rope_forward";
    void *x = D(qkv, B * T * (NH + 2 * NKV) * HS * l3d_dtype_size(dt), k);
    const float *f = D(inv_freq, HS / 2 * 4, k);
    const int32_t *p = D(pos, T * 4, k);
    if (backward)
        l3d_be_rope_backward(IN(c), dt, x, f, p, B, T, NH, NKV, HS);
    else
        l3d_be_rope_forward(IN(c), dt, x, f, p, B, T, NH, NKV, HS);
}
static void chk_rope_forward(void *ctx, enum l3d_dtype dt, void *qkv, const float *inv_freq,
                             const int32_t *pos, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                             int64_t HS) {
    chk_rope(ctx, dt, qkv, inv_freq, pos, B, T, NH, NKV, HS, 0);
}
static void chk_rope_backward(void *ctx, enum l3d_dtype dt, void *dqkv, const float *inv_freq,
                              const int32_t *pos, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                              int64_t HS) {
    chk_rope(ctx, dt, dqkv, inv_freq, pos, B, T, NH, NKV, HS, 1);
}
static void chk_swiglu_forward(void *ctx, enum l3d_dtype dt, void *out, const void *inp,
                               int64_t N, int64_t H) {
    struct chk *c = ctx;
    size_t e = l3d_dtype_size(dt);
    const char *k = "swiglu_forward";
    l3d_be_swiglu_forward(IN(c), dt, D(out, N * H * e, k), D(inp, N * 2 * H * e, k), N, H);
}
static void chk_swiglu_backward(void *ctx, enum l3d_dtype dt, void *dinp, const void *dout,
                                const void *inp, int64_t N, int64_t H) {
    struct chk *c = ctx;
    size_t e = l3d_dtype_size(dt);
    const char *k = "swiglu_backward";
    l3d_be_swiglu_backward(IN(c), dt, D(dinp, N * 2 * H * e, k), D(dout, N * H * e, k),
                           D(inp, N * 2 * H * e, k), N, H);
}
/* bytes a strided block tensor spans: B sequences of n rows of w elements */
static int64_t span(int64_t B, int64_t bs, int64_t n, int64_t rs, int64_t w, size_t e) {
    return ((B - 1) * bs + (n - 1) * rs + w) * (int64_t)e;
}
static void chk_attention_block_forward(void *ctx, enum l3d_dtype dt, void *out, float *lse,
                                        const void *q, const void *kc, const void *vc,
                                        const struct l3d_attn_block *g) {
    struct chk *c = ctx;
    size_t e = l3d_dtype_size(dt);
    const char *k = "attention_block_forward";
    int64_t C = g->NH * g->HS, Ckv = g->NKV * g->HS, kv = span(g->B, g->kv_bs, g->nk, g->kv_rs,
                                                               Ckv, e);
    l3d_be_attention_block_forward(IN(c), dt, D(out, span(g->B, g->o_bs, g->nq, g->o_rs, C, e), k),
                                   D(lse, span(g->B, g->lse_bs, g->NH, g->lse_hs, g->nq, 4), k),
                                   D(q, span(g->B, g->q_bs, g->nq, g->q_rs, C, e), k), D(kc, kv, k),
                                   D(vc, kv, k), g);
}
static void chk_attention_merge(void *ctx, enum l3d_dtype dt, void *out, float *lse,
                                const void *out2, const float *lse2,
                                const struct l3d_attn_block *g) {
    struct chk *c = ctx;
    size_t e = l3d_dtype_size(dt);
    const char *k = "attention_merge";
    int64_t o = span(g->B, g->o_bs, g->nq, g->o_rs, g->NH * g->HS, e);
    int64_t l = span(g->B, g->lse_bs, g->NH, g->lse_hs, g->nq, 4);
    l3d_be_attention_merge(IN(c), dt, D(out, o, k), D(lse, l, k), D(out2, o, k), D(lse2, l, k), g);
}
static void chk_attention_block_backward(void *ctx, enum l3d_dtype dt, void *dq, void *dkc,
                                         void *dvc, const void *dout, const void *q,
                                         const void *kc, const void *vc, const void *out,
                                         const float *lse, const struct l3d_attn_block *g) {
    struct chk *c = ctx;
    size_t e = l3d_dtype_size(dt);
    const char *k = "attention_block_backward";
    int64_t C = g->NH * g->HS, kv = span(g->B, g->kv_bs, g->nk, g->kv_rs, g->NKV * g->HS, e);
    int64_t qn = span(g->B, g->q_bs, g->nq, g->q_rs, C, e);
    int64_t o = span(g->B, g->o_bs, g->nq, g->o_rs, C, e);
    l3d_be_attention_block_backward(IN(c), dt, D(dq, qn, k), D(dkc, kv, k), D(dvc, kv, k),
                                    D(dout, o, k), D(q, qn, k), D(kc, kv, k), D(vc, kv, k),
                                    D(out, o, k),
                                    D(lse, span(g->B, g->lse_bs, g->NH, g->lse_hs, g->nq, 4), k),
                                    g);
}
static void chk_gelu_forward(void *ctx, enum l3d_dtype dt, void *out, const void *inp,
                             int64_t N) {
    struct chk *c = ctx;
    size_t b = (size_t)N * l3d_dtype_size(dt);
    l3d_be_gelu_forward(IN(c), dt, D(out, b, "gelu_forward"), D(inp, b, "gelu_forward"), N);
}
static void chk_gelu_backward(void *ctx, enum l3d_dtype dt, void *dinp, const void *dout,
                              const void *inp, int64_t N) {
    struct chk *c = ctx;
    size_t b = (size_t)N * l3d_dtype_size(dt);
    const char *k = "gelu_backward";
    l3d_be_gelu_backward(IN(c), dt, D(dinp, b, k), D(dout, b, k), D(inp, b, k), N);
}
static void chk_residual_forward(void *ctx, enum l3d_dtype dt, void *out, const void *a,
                                 const void *b, int64_t N) {
    struct chk *c = ctx;
    size_t n = (size_t)N * l3d_dtype_size(dt);
    const char *k = "residual_forward";
    l3d_be_residual_forward(IN(c), dt, D(out, n, k), D(a, n, k), D(b, n, k), N);
}
/* the fused kernel of the backend behind, its extents checked as the pair's would be */
static void chk_residual_norm_forward(void *ctx, enum l3d_dtype dt, void *res, void *out,
                                      float *mean, float *rstd, const void *a, const void *b,
                                      const void *weight, const void *bias, int64_t N, int64_t C,
                                      float eps) {
    struct chk *c = ctx;
    size_t e = l3d_dtype_size(dt), n = (size_t)(N * C) * e;
    const char *k = mean ? "residual_layernorm_forward" : "residual_rmsnorm_forward";
    void *r = D(res, n, k), *o = D(out, n, k);
    const void *x = D(a, n, k), *y = D(b, n, k), *w = D(weight, C * e, k);
    float *sd = D(rstd, N * 4, k);
    if (mean)
        l3d_be_residual_layernorm_forward(IN(c), dt, r, o, D(mean, N * 4, k), sd, x, y, w,
                                          D(bias, C * e, k), N, C);
    else
        l3d_be_residual_rmsnorm_forward(IN(c), dt, r, o, sd, x, y, w, N, C, eps);
}
static void chk_add_inplace(void *ctx, enum l3d_dtype dt, void *dst, const void *src, int64_t N) {
    struct chk *c = ctx;
    size_t n = (size_t)N * l3d_dtype_size(dt);
    l3d_be_add_inplace(IN(c), dt, D(dst, n, "add_inplace"), D(src, n, "add_inplace"), N);
}
/* mixture of experts: rows in expert order span at most N K rows (the model sizes them so) */
static void chk_moe_route(void *ctx, enum l3d_dtype dt, float *probs, float *lse, int32_t *idx,
                          float *wts, int32_t *pos, int32_t *offsets, float *stats, int32_t *work,
                          const void *inp, const void *weight, int64_t N, int64_t C, int64_t E,
                          int64_t K, int norm_topk, int64_t capacity,
                          const int32_t *fill, int64_t segs, const int32_t *forced) {
    struct chk *c = ctx;
    size_t e = l3d_dtype_size(dt);
    const char *k = "moe_route";
    l3d_be_moe_route(IN(c), dt, D(probs, N * E * 4, k), D(lse, N * 4, k), D(idx, N * K * 4, k),
                     D(wts, N * K * 4, k), D(pos, N * K * 4, k), D(offsets, (E + 1) * 4, k),
                     D(stats, (2 * E + 2) * 4, k), D(work, 3 * E * 4, k), D(inp, N * C * e, k),
                     D(weight, E * C * e, k), N, C, E, K, norm_topk, capacity,
                     fill ? D(fill, segs * E * 4, k) : NULL, segs,
                     forced ? D(forced, N * K * 4, k) : NULL);
}
static void chk_moe_permute(void *ctx, enum l3d_dtype dt, void *rows, const void *inp,
                            const int32_t *pos, int64_t N, int64_t K, int64_t C) {
    struct chk *c = ctx;
    size_t e = l3d_dtype_size(dt);
    const char *k = "moe_permute";
    l3d_be_moe_permute(IN(c), dt, D(rows, N * K * C * e, k), D(inp, N * C * e, k),
                       D(pos, N * K * 4, k), N, K, C);
}
static void chk_moe_combine(void *ctx, enum l3d_dtype dt, void *out, const void *rows,
                            const int32_t *pos, const float *wts, int64_t N, int64_t K, int64_t C) {
    struct chk *c = ctx;
    size_t e = l3d_dtype_size(dt);
    const char *k = "moe_combine";
    l3d_be_moe_combine(IN(c), dt, D(out, N * C * e, k), D(rows, N * K * C * e, k),
                       D(pos, N * K * 4, k), D(wts, N * K * 4, k), N, K, C);
}
static void chk_moe_combine_backward(void *ctx, enum l3d_dtype dt, void *drows, float *dwts,
                                     const void *dout, const void *rows, const int32_t *pos,
                                     const float *wts, int64_t N, int64_t K, int64_t C) {
    struct chk *c = ctx;
    size_t e = l3d_dtype_size(dt);
    const char *k = "moe_combine_backward";
    l3d_be_moe_combine_backward(IN(c), dt, D(drows, N * K * C * e, k), D(dwts, N * K * 4, k),
                                D(dout, N * C * e, k), D(rows, N * K * C * e, k),
                                D(pos, N * K * 4, k), D(wts, N * K * 4, k), N, K, C);
}
static void chk_moe_router_backward(void *ctx, enum l3d_dtype dt, enum l3d_dtype gdt, void *dinp,
                                    void *dweight, float *dlogits, const float *dwts,
                                    const void *inp, const void *weight, const float *probs,
                                    const float *lse, const int32_t *idx, const float *wts,
                                    const float *stats, int64_t N, int64_t C, int64_t E,
                                    int64_t K, int norm_topk, float aux_scale, float z_scale) {
    struct chk *c = ctx;
    size_t e = l3d_dtype_size(dt), g = l3d_dtype_size(gdt);
    const char *k = "moe_router_backward";
    l3d_be_moe_router_backward(IN(c), dt, gdt, D(dinp, N * C * e, k), D(dweight, E * C * g, k),
                               D(dlogits, N * E * 4, k), D(dwts, N * K * 4, k),
                               D(inp, N * C * e, k), D(weight, E * C * e, k),
                               D(probs, N * E * 4, k), D(lse, N * 4, k), D(idx, N * K * 4, k),
                               D(wts, N * K * 4, k), D(stats, (2 * E + 2) * 4, k), N, C, E, K,
                               norm_topk, aux_scale, z_scale);
}
static void chk_add_bias(void *ctx, enum l3d_dtype dt, void *out, const void *bias, int64_t N,
                         int64_t C) {
    struct chk *c = ctx;
    size_t e = l3d_dtype_size(dt);
    l3d_be_add_bias(IN(c), dt, D(out, N * C * e, "add_bias"), D(bias, C * e, "add_bias"), N, C);
}
static void chk_xent_max(void *ctx, enum l3d_dtype dt, float *maxv, const void *logits, int64_t N,
                         int64_t Vl, int64_t Vvalid) {
    struct chk *c = ctx;
    size_t e = l3d_dtype_size(dt);
    l3d_be_xent_max(IN(c), dt, D(maxv, N * 4, "xent_max"), D(logits, N * Vl * e, "xent_max"), N,
                    Vl, Vvalid);
}
static void chk_xent_sumexp(void *ctx, enum l3d_dtype dt, float *sumexp, float *tlogit,
                            const void *logits, const float *maxv, const int32_t *targets,
                            int64_t vocab_start, int64_t N, int64_t Vl, int64_t Vvalid) {
    struct chk *c = ctx;
    size_t e = l3d_dtype_size(dt);
    const char *k = "xent_sumexp";
    l3d_be_xent_sumexp(IN(c), dt, D(sumexp, N * 4, k), D(tlogit, N * 4, k),
                       D(logits, N * Vl * e, k), D(maxv, N * 4, k), D(targets, N * 4, k),
                       vocab_start, N, Vl, Vvalid);
}
static void chk_xent_backward(void *ctx, enum l3d_dtype dt, void *logits, const float *maxv,
                              const float *sumexp, const int32_t *targets, float dloss,
                              int64_t vocab_start, int64_t N, int64_t Vl, int64_t Vvalid) {
    struct chk *c = ctx;
    size_t e = l3d_dtype_size(dt);
    const char *k = "xent_backward";
    l3d_be_xent_backward(IN(c), dt, D(logits, N * Vl * e, k), D(maxv, N * 4, k),
                         D(sumexp, N * 4, k), D(targets, N * 4, k), dloss, vocab_start, N, Vl,
                         Vvalid);
}
static void chk_xent_loss(void *ctx, float *losses, double *loss_sum, const float *maxv,
                          const float *sumexp, const float *tlogit, int64_t N) {
    struct chk *c = ctx;
    const char *k = "xent_loss";
    l3d_be_xent_loss(IN(c), D(losses, N * 4, k), D(loss_sum, 8, k), D(maxv, N * 4, k),
                     D(sumexp, N * 4, k), D(tlogit, N * 4, k), N);
}
static void chk_adamw(void *ctx, enum l3d_dtype dt, void *param, float *m, float *v,
                      const void *grad, float grad_scale, int64_t n, float lr, float beta1,
                      float beta2, float eps, float wd, float bc1, float bc2) {
    struct chk *c = ctx;
    size_t e = l3d_dtype_size(dt);
    const char *k = "adamw";
    l3d_be_adamw(IN(c), dt, D(param, n * e, k), D(m, n * 4, k), D(v, n * 4, k),
                 D(grad, n * e, k), grad_scale, n, lr, beta1, beta2, eps, wd, bc1, bc2);
}
static void chk_sumsq(void *ctx, enum l3d_dtype dt, double *acc, const void *x, int64_t n) {
    struct chk *c = ctx;
    l3d_be_sumsq(IN(c), dt, D(acc, 8, "sumsq"), D(x, n * l3d_dtype_size(dt), "sumsq"), n);
}

static void chk_adamw_mixed(void *ctx, enum l3d_dtype dt, enum l3d_dtype gdt, void *param,
                            float *master, float *m, float *v, const void *grad, float grad_scale,
                            int64_t n, float lr, float beta1, float beta2, float eps, float wd,
                            float bc1, float bc2) {
    struct chk *c = ctx;
    const char *k = "adamw_mixed";
    l3d_be_adamw_mixed(IN(c), dt, gdt, D(param, n * l3d_dtype_size(dt), k), D(master, n * 4, k),
                       D(m, n * 4, k), D(v, n * 4, k), D(grad, n * l3d_dtype_size(gdt), k),
                       grad_scale, n, lr, beta1, beta2, eps, wd, bc1, bc2);
}
/* The fused step's oracle: the unfused kernels, adamw (master NULL) or adamw_mixed, then the
 * gradient zeroed by a memset of its own (bit-identical to the CPU's fused pass) */
static void chk_adamw_zero(void *ctx, enum l3d_dtype dt, enum l3d_dtype gdt, void *param,
                           float *master, float *m, float *v, void *grad, float grad_scale,
                           int64_t n, float lr, float beta1, float beta2, float eps, float wd,
                           float bc1, float bc2) {
    struct chk *c = ctx;
    const char *k = "adamw_zero";
    size_t pe = l3d_dtype_size(dt), ge = l3d_dtype_size(gdt);
    void *g = D(grad, n * ge, k), *p = D(param, n * pe, k);
    float *mm = D(m, n * 4, k), *vv = D(v, n * 4, k);
    if (master)
        l3d_be_adamw_mixed(IN(c), dt, gdt, p, D(master, n * 4, k), mm, vv, g, grad_scale, n, lr,
                           beta1, beta2, eps, wd, bc1, bc2);
    else
        l3d_be_adamw(IN(c), dt, p, mm, vv, g, grad_scale, n, lr, beta1, beta2, eps, wd, bc1, bc2);
    l3d_be_memset(IN(c), g, 0, (size_t)n * ge);
}
static void chk_convert(void *ctx, enum l3d_dtype dst_t, void *dst, enum l3d_dtype src_t,
                        const void *src, int64_t n) {
    struct chk *c = ctx;
    l3d_be_convert(IN(c), dst_t, D(dst, n * l3d_dtype_size(dst_t), "convert"), src_t,
                   D(src, n * l3d_dtype_size(src_t), "convert"), n);
}
static void chk_unscale(void *ctx, enum l3d_dtype dt, float *found_inf, void *x, float inv_scale,
                        int64_t n) {
    struct chk *c = ctx;
    l3d_be_unscale(IN(c), dt, D(found_inf, 4, "unscale"), D(x, n * l3d_dtype_size(dt), "unscale"),
                   inv_scale, n);
}

#undef D
#undef IN

static const struct l3d_backend_i check_backend_i = {
    .name = "check",
    .free = chk_free,
    .alloc = chk_alloc,
    .dfree = chk_dfree,
    .memset = chk_memset,
    .copy_h2d = chk_copy_h2d,
    .copy_d2h = chk_copy_d2h,
    .copy_d2d = chk_copy_d2d,
    .sync = chk_sync,
    .event_record = NULL, /* the inner backend is synchronous */
    .event_wait = NULL,
    .peak_flops = chk_peak_flops,
    .matmul_native = chk_matmul_native,
    .attention_native = chk_attention_native,
    .attention_p16 = chk_attention_p16,
    .matmul_wgrad_block = chk_matmul_wgrad_block,
    .host_view = chk_host_view,
    .matmul_forward = chk_matmul_forward,
    .matmul_backward = chk_matmul_backward,
    .encoder_forward = chk_encoder_forward,
    .encoder_backward = chk_encoder_backward,
    .layernorm_forward = chk_layernorm_forward,
    .layernorm_backward = chk_layernorm_backward,
    .attention_forward = chk_attention_forward,
    .attention_backward = chk_attention_backward,
    .attention_naive_forward = chk_attention_naive_forward,
    .attention_naive_backward = chk_attention_naive_backward,
    .attention_cached = chk_attention_cached,
    .attention_block_forward = chk_attention_block_forward,
    .attention_merge = chk_attention_merge,
    .attention_block_backward = chk_attention_block_backward,
    .rmsnorm_forward = chk_rmsnorm_forward,
    .rmsnorm_backward = chk_rmsnorm_backward,
    .rope_forward = chk_rope_forward,
    .rope_backward = chk_rope_backward,
    .swiglu_forward = chk_swiglu_forward,
    .swiglu_backward = chk_swiglu_backward,
    .gelu_forward = chk_gelu_forward,
    .gelu_backward = chk_gelu_backward,
    .residual_forward = chk_residual_forward,
    .residual_norm_forward = chk_residual_norm_forward,
    .add_inplace = chk_add_inplace,
    .add_bias = chk_add_bias,
    .moe_route = chk_moe_route,
    .moe_permute = chk_moe_permute,
    .moe_combine = chk_moe_combine,
    .moe_combine_backward = chk_moe_combine_backward,
    .moe_router_backward = chk_moe_router_backward,
    .xent_max = chk_xent_max,
    .xent_sumexp = chk_xent_sumexp,
    .xent_backward = chk_xent_backward,
    .xent_loss = chk_xent_loss,
    .adamw = chk_adamw,
    .sumsq = chk_sumsq,
    .adamw_mixed = chk_adamw_mixed,
    .adamw_zero = chk_adamw_zero,
    .convert = chk_convert,
    .unscale = chk_unscale,
};

struct l3d_backend *l3d_backend_check_init(struct l3d_backend *inner) {
    struct chk *c = l3d_calloc(sizeof *c, "check backend");
    c->inner = inner;
    install_fault_handler(c);
    return l3d_backend_make(&check_backend_i, c);
}
