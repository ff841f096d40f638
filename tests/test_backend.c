/*
 * The device interface (include/llm3d/backend.h) of the backend $L3D_BACKEND (default cpu):
 * allocation and its accounting, memset, copies both ways and device to device at offsets (and
 * overlapping), events, the peak; and the checking backend's refusals, each in a forked child that
 * must die with the expected message on stderr: a host pointer or another backend's pointer passed
 * to a kernel, a device range past the end of its buffer, host code reading device memory, a copy
 * whose source or destination is on the wrong side. Waiting on an event never recorded dies too.
 */
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "llm3d/backend.h"
#include "llm3d/core.h"
#include "test.h"

enum { N = 1000 };

static float *dev_alloc(struct l3d_backend *be, int64_t n, const char *what) {
    float *d = l3d_be_alloc(be, (size_t)n * sizeof(float), what);
    L3D_ASSERT(d != NULL);
    return d;
}

/* ---- the interface, on any backend ---------------------------------------------------------- */

/* A fill of a large range at an odd offset and length (the CPU backend's 1 MiB pieces over the
 * threads from 4 MiB, the last one short): exactly the range, every byte */
static void test_large_fill(struct l3d_backend *be) {
    const size_t big = ((size_t)32 << 20) + 37, all = big + 200, at = 5;
    unsigned char *d = l3d_be_alloc(be, all, "large fill");
    L3D_ASSERT(d != NULL);
    unsigned char *h = l3d_alloc(all, "large fill, host");
    for (int value = 0xa5; value >= 0; value -= 0xa5) { /* 0xa5, then 0 */
        l3d_be_memset(be, d, 0x11, all);
        l3d_be_memset(be, d + at, value, big);
        l3d_be_copy_d2h(be, h, d, all);
        size_t bad = 0;
        for (size_t i = 0; i < all; i++)
            bad += h[i] != (i >= at && i < at + big ? (unsigned char)value : 0x11);
        printf("large fill of %zu bytes at offset %zu with 0x%02x: %zu wrong bytes\n", big, at,
               value, bad);
        CHECK(bad == 0);
    }
    l3d_free(h);
    l3d_be_free(be, d);
}

static void test_memory(struct l3d_backend *be) {
    size_t bytes = N * sizeof(float);
    l3d_be_free(be, dev_alloc(be, 1, "warm-up")); /* a backend's own bookkeeping, made once */
    size_t used0 = l3d_mem_used();
    float *d = dev_alloc(be, N, "round trip");
    CHECK(l3d_mem_used() >= used0 + bytes); /* device bytes are accounted */
    float h[N], back[N];
    for (int i = 0; i < N; i++) h[i] = 0.5f * (float)i - 7.0f;

    /* memset: every byte */
    l3d_be_memset(be, d, 0xa5, bytes);
    l3d_be_copy_d2h(be, back, d, bytes);
    int bad = 0;
    for (size_t i = 0; i < bytes; i++) bad += ((unsigned char *)back)[i] != 0xa5;
    CHECK(bad == 0);
    l3d_be_memset(be, d, 0, bytes);
    l3d_be_copy_d2h(be, back, d, bytes);
    bad = 0;
    for (int i = 0; i < N; i++) bad += back[i] != 0.0f;
    CHECK(bad == 0);

    /* host -> device -> host, whole and in part at offsets */
    l3d_be_copy_h2d(be, d, h, bytes);
    memset(back, 0, sizeof back);
    l3d_be_copy_d2h(be, back, d, bytes);
    CHECK(memcmp(back, h, bytes) == 0);
    float part[3];
    l3d_be_copy_d2h(be, part, d + 7, sizeof part);
    CHECK(part[0] == h[7] && part[2] == h[9]);
    const float three[3] = {1.0f, 2.0f, 3.0f};
    l3d_be_copy_h2d(be, d + N - 3, three, sizeof three); /* the last elements of the buffer */
    l3d_be_copy_d2h(be, back, d, bytes);
    CHECK(memcmp(back, h, (N - 3) * sizeof(float)) == 0 && back[N - 1] == 3.0f);
    l3d_be_copy_h2d(be, d, h, bytes);

    /* device -> device between offsets of two buffers: only the range moves */
    float *e = dev_alloc(be, N, "d2d target");
    l3d_be_memset(be, e, 0, bytes);
    l3d_be_copy_d2d(be, e + 100, d + 10, 200 * sizeof(float));
    l3d_be_copy_d2h(be, back, e, bytes);
    bad = 0;
    for (int i = 0; i < N; i++) bad += back[i] != (i >= 100 && i < 300 ? h[i - 90] : 0.0f);
    CHECK(bad == 0);
    /* overlapping ranges of one buffer, both directions (memmove semantics) */
    l3d_be_copy_d2d(be, d + 1, d, 500 * sizeof(float));
    l3d_be_copy_d2h(be, back, d, bytes);
    bad = back[0] != h[0];
    for (int i = 1; i <= 500; i++) bad += back[i] != h[i - 1];
    for (int i = 501; i < N; i++) bad += back[i] != h[i];
    CHECK(bad == 0);
    l3d_be_copy_h2d(be, d, h, bytes);
    l3d_be_copy_d2d(be, d, d + 1, 500 * sizeof(float));
    l3d_be_copy_d2h(be, back, d, bytes);
    bad = 0;
    for (int i = 0; i < 500; i++) bad += back[i] != h[i + 1];
    for (int i = 500; i < N; i++) bad += back[i] != h[i];
    CHECK(bad == 0);

    /* a kernel reads and writes sub-buffers of a flat allocation */
    l3d_be_copy_h2d(be, d, h, bytes);
    l3d_be_residual_forward(be, L3D_F32, e + 500, d + 100, d + 200, 100);
    l3d_be_copy_d2h(be, back, e + 500, 100 * sizeof(float));
    bad = 0;
    for (int i = 0; i < 100; i++) bad += back[i] != h[100 + i] + h[200 + i];
    CHECK(bad == 0);

    l3d_be_free(be, e);
    l3d_be_free(be, d);
    l3d_be_free(be, NULL); /* allowed, as free(NULL) */
    CHECK(l3d_mem_used() == used0);
}

/* A reduction stays on the device until copied: sumsq accumulates into a device double. */
static void test_device_scalar(struct l3d_backend *be) {
    float h[N];
    double want = 0.0;
    for (int i = 0; i < N; i++) {
        h[i] = (float)(i % 7) - 3.0f;
        want += (double)h[i] * h[i];
    }
    float *d = dev_alloc(be, N, "x");
    double *acc = l3d_be_alloc(be, sizeof(double), "sumsq");
    L3D_ASSERT(acc != NULL);
    l3d_be_copy_h2d(be, d, h, sizeof h);
    double got = 1.5;
    l3d_be_copy_h2d(be, acc, &got, sizeof got);
    l3d_be_sumsq(be, L3D_F32, acc, d, N);
    l3d_be_sumsq(be, L3D_F32, acc, d, N); /* += */
    l3d_be_copy_d2h(be, &got, acc, sizeof got);
    CHECK(got == 1.5 + 2.0 * want);
    l3d_be_free(be, acc);
    l3d_be_free(be, d);
}

static void test_events(struct l3d_backend *be) {
    float h[N], back[N];
    for (int i = 0; i < N; i++) h[i] = (float)i;
    float *d = dev_alloc(be, N, "event input"), *e = dev_alloc(be, N, "event output");
    struct l3d_event *ev = l3d_be_event_new(be);
    CHECK(ev != NULL);
    l3d_be_copy_h2d(be, d, h, sizeof h);
    l3d_be_residual_forward(be, L3D_F32, e, d, d, N);
    l3d_be_event_record(be, ev);
    l3d_be_event_wait(be, ev); /* the work before the record is complete */
    l3d_be_copy_d2h(be, back, e, sizeof back);
    int bad = 0;
    for (int i = 0; i < N; i++) bad += back[i] != 2.0f * (float)i;
    CHECK(bad == 0);
    l3d_be_event_record(be, ev); /* an event may be recorded again */
    l3d_be_event_wait(be, ev);
    l3d_be_event_wait(be, ev); /* and waited on twice */
    l3d_be_sync(be);
    l3d_be_event_free(be, ev);
    l3d_be_event_free(be, NULL);
    l3d_be_free(be, e);
    l3d_be_free(be, d);
}

/* ---- deaths: in a forked child, stderr captured through a pipe ------------------------------ */

struct death {
    struct l3d_backend *be;
    float *dev, *dev2; /* N floats each */
    float *host;       /* N floats */
    struct l3d_backend *other;
    float *other_dev;
};

/* Runs fn in a child whose stderr goes to a pipe; the child must die (a signal, or a non-zero
 * exit), by `sig` when sig != 0, with both msg[0] and msg[1] in what it wrote. */
static void expect_death(const char *what, void (*fn)(struct death *), struct death *dz, int sig,
                         const char *const msg[2]) {
    int fd[2];
    L3D_ASSERT(pipe(fd) == 0);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    L3D_ASSERT(pid >= 0);
    if (pid == 0) {
        close(fd[0]);
        dup2(fd[1], 2);
        close(fd[1]);
        /* a child that survives the refusal may hang in OpenMP (its thread pool is not forked):
         * the alarm ends it, and the parent reports the missing message */
        alarm(20);
        fn(dz);
        _exit(0); /* survived: the parent reports it */
    }
    close(fd[1]);
    char buf[4096];
    size_t len = 0;
    ssize_t k;
    while ((k = read(fd[0], buf + len, sizeof buf - 1 - len)) > 0) len += (size_t)k;
    buf[len] = '\0';
    close(fd[0]);
    int status = 0;
    L3D_ASSERT(waitpid(pid, &status, 0) == pid);
    int died = WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) != 0);
    int right_sig = sig == 0 || (WIFSIGNALED(status) && WTERMSIG(status) == sig);
    int said = strstr(buf, msg[0]) != NULL && strstr(buf, msg[1]) != NULL;
    if (!died || !right_sig || !said)
        fprintf(stderr, "FAIL %s: status %s %d, wanted %s and '%s' ... '%s' on stderr; it "
                "wrote:\n%s\n", what, WIFSIGNALED(status) ? "signal" : "exit",
                WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status),
                sig ? strsignal(sig) : "a non-zero status", msg[0], msg[1], buf);
    else
        printf("  dies as it should: %s\n", what);
    CHECK(died);
    CHECK(right_sig);
    CHECK(said);
}

static void wait_unrecorded(struct death *dz) {
    struct l3d_event *ev = l3d_be_event_new(dz->be);
    l3d_be_event_wait(dz->be, ev);
}
static void kernel_host_ptr(struct death *dz) {
    l3d_be_gelu_forward(dz->be, L3D_F32, dz->dev, dz->host, N);
}
static void kernel_other_backend(struct death *dz) {
    l3d_be_gelu_forward(dz->be, L3D_F32, dz->dev, dz->other_dev, N);
}
static void kernel_past_end(struct death *dz) {
    l3d_be_residual_forward(dz->be, L3D_F32, dz->dev2, dz->dev, dz->dev + 1, N);
}
static void host_read(struct death *dz) {
    volatile float x = *(volatile float *)(dz->dev + 5);
    (void)x;
}
static void host_write(struct death *dz) { memset(dz->dev2, 0, 16); }
static void h2d_device_src(struct death *dz) {
    l3d_be_copy_h2d(dz->be, dz->dev2, dz->dev, N * sizeof(float));
}
static void d2h_device_dst(struct death *dz) {
    l3d_be_copy_d2h(dz->be, dz->dev2, dz->dev, N * sizeof(float));
}
static void d2h_past_end(struct death *dz) {
    l3d_be_copy_d2h(dz->be, dz->host, dz->dev + 1, N * sizeof(float));
}

/* mixed precision: an fp32 main_grad sized as if it were bf16 (1500 elements: 3000 bytes in bf16
 * fit the 4000-byte buffer, 6000 in fp32 do not) */
static void main_grad_too_small(struct death *dz) {
    l3d_be_matmul_backward_mixed(dz->be, L3D_BF16, L3D_F32, NULL, dz->dev, NULL, dz->dev2,
                                 dz->dev2, dz->dev2, 1, 30, 50);
}
static void grads_of_other_16bit_type(struct death *dz) {
    l3d_be_matmul_backward_mixed(dz->be, L3D_BF16, L3D_F16, NULL, dz->dev, NULL, dz->dev2,
                                 dz->dev2, dz->dev2, 1, 30, 50);
}
static void adamw_16bit_params(struct death *dz) {
    l3d_be_adamw(dz->be, L3D_BF16, dz->dev, dz->dev2, dz->dev2, dz->dev, 1.0f, 10, 1e-3f, 0.9f,
                 0.95f, 1e-8f, 0.0f, 0.1f, 0.05f);
}
static void naive_attention_bf16(struct death *dz) {
    l3d_be_attention_naive_forward(dz->be, L3D_BF16, dz->dev, dz->dev2, dz->dev, 1, 4, 1, 1, 8);
}

static void test_check_refusals(void) {
    struct death dz = {0};
    L3D_ASSERT(l3d_backend_init("check", &dz.be) == L3D_OK);
    L3D_ASSERT(l3d_backend_init("cpu", &dz.other) == L3D_OK);
    dz.dev = dev_alloc(dz.be, N, "weights");
    dz.dev2 = dev_alloc(dz.be, N, "output");
    dz.host = calloc(N, sizeof(float));
    dz.other_dev = dev_alloc(dz.other, N, "cpu buffer");
    l3d_be_memset(dz.be, dz.dev, 0, N * sizeof(float));
    l3d_be_memset(dz.be, dz.dev2, 0, N * sizeof(float));
    l3d_be_memset(dz.other, dz.other_dev, 0, N * sizeof(float));
    const struct {
        const char *what;
        void (*fn)(struct death *);
        int sig;             /* 0: any death */
        const char *msg[2];  /* both on stderr */
    } cases[] = {
        {"a host pointer passed to a kernel", kernel_host_ptr, 0,
         {"gelu_forward: inp = ", "is not device memory of this backend"}},
        {"another backend's pointer passed to a kernel", kernel_other_backend, 0,
         {"gelu_forward: inp = ", "is not device memory of this backend"}},
        {"a device range past the end of its buffer", kernel_past_end, 0,
         {"residual_forward: b reaches 4000 bytes from offset 4 of the 4000-byte buffer "
          "'weights': past its end", ""}},
        {"a host read of device memory", host_read, SIGSEGV,
         {"host code touched device memory at", "(offset 20 of the 4000-byte buffer 'weights')"}},
        {"a host memset of device memory", host_write, SIGSEGV,
         {"host code touched device memory at", "of the 4000-byte buffer 'output'"}},
        {"copy_h2d with a device source", h2d_device_src, 0,
         {"copy_h2d: src = ", "is device memory where host memory is expected"}},
        {"copy_d2h with a device destination", d2h_device_dst, 0,
         {"copy_d2h: dst = ", "is device memory where host memory is expected"}},
        {"copy_d2h past the end of the source", d2h_past_end, 0,
         {"copy_d2h: src reaches", "past its end"}},
        {"an fp32 main_grad the size of a bf16 one", main_grad_too_small, 0,
         {"matmul_backward: dweight reaches 6000 bytes from offset 0 of the 4000-byte buffer "
          "'weights': past its end", ""}},
        {"fp16 gradients of bf16 activations", grads_of_other_16bit_type, 0,
         {"matmul_backward has no variant for fp16 gradients of bf16 activations", ""}},
        {"adamw on bf16 parameters (adamw_mixed keeps fp32 masters)", adamw_16bit_params, 0,
         {"kernel adamw has no bf16 variant", ""}},
        {"the naive attention (an fp32 oracle) in bf16", naive_attention_bf16, 0,
         {"kernel attention_naive_forward has no bf16 variant", ""}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        expect_death(cases[i].what, cases[i].fn, &dz, cases[i].sig, cases[i].msg);
    /* what the children did not do: the parent still reads its buffers */
    float back[N];
    l3d_be_copy_d2h(dz.be, back, dz.dev2, sizeof back);
    CHECK(back[0] == 0.0f && back[N - 1] == 0.0f);
    l3d_be_free(dz.other, dz.other_dev);
    l3d_backend_free(dz.other);
    free(dz.host);
    l3d_backend_free(dz.be); /* frees the buffers it still holds */
}

int main(void) {
    struct l3d_backend *be = test_backend_init();
    test_memory(be);
    test_large_fill(be);
    test_device_scalar(be);
    test_events(be);
    struct death dz = {.be = be};
    const char *const unrecorded[2] = {"waiting on an event never recorded", ""};
    expect_death("waiting on an event never recorded", wait_unrecorded, &dz, 0, unrecorded);
    double peak = l3d_be_peak_flops(be, L3D_F32);
    printf("peak fp32: %.3g FLOP/s\n", peak);
    CHECK(peak > 0.0);
    /* 16-bit products: bf16 dot products, or fp32 ones around converted operands */
    double pb = l3d_be_peak_flops(be, L3D_BF16), ph = l3d_be_peak_flops(be, L3D_F16);
    printf("peak bf16: %.3g FLOP/s, fp16: %.3g FLOP/s\n", pb, ph);
    CHECK(pb > 0.0);
    CHECK(ph > 0.0);
    CHECK(l3d_be_peak_flops(be, L3D_I32) == 0.0);
    l3d_backend_free(be);

    printf("checking backend:\n");
    test_check_refusals();
    return TEST_REPORT();
}
