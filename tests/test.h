/*
 * A tiny test harness: CHECK prints the failing expression, CHECK_NEAR both values.
 *
 *   int main(void) { CHECK(1 + 1 == 2); CHECK_NEAR(x, 1.0, 1e-6); return TEST_REPORT(); }
 */
#ifndef L3D_TEST_H
#define L3D_TEST_H

#include <math.h>
#include <stdio.h>

static int test_failures;
static int test_checks;

#define CHECK(x)                                                                   \
    do {                                                                           \
        test_checks++;                                                             \
        if (!(x)) {                                                                \
            test_failures++;                                                       \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #x);  \
        }                                                                          \
    } while (0)

/* |a - b| <= tol, printing both values when it fails. */
#define CHECK_NEAR(a, b, tol)                                                      \
    do {                                                                           \
        double a_ = (double)(a), b_ = (double)(b), t_ = (double)(tol);             \
        test_checks++;                                                             \
        if (!(fabs(a_ - b_) <= t_)) {                                              \
            test_failures++;                                                       \
            fprintf(stderr, "%s:%d: CHECK_NEAR failed: %s = %.9g, %s = %.9g, |diff| = %.3g > %.3g\n", \
                    __FILE__, __LINE__, #a, a_, #b, b_, fabs(a_ - b_), t_);        \
        }                                                                          \
    } while (0)

/* With include/llm3d/backend.h included first: the backend the tests run on, $L3D_BACKEND (default
 * cpu), its name printed (exits on an unknown name); and a host copy of n floats of its device
 * memory, to free(). */
#ifdef LLM3D_BACKEND_H
#include <stdlib.h>

static inline struct l3d_backend *test_backend_init(void) {
    struct l3d_backend *be;
    if (l3d_backend_init(NULL, &be) != L3D_OK) {
        fprintf(stderr, "%s\n", l3d_error_message());
        exit(1);
    }
    printf("backend: %s\n", l3d_backend_name(be));
    return be;
}

static inline float *test_to_host(struct l3d_backend *be, const float *dev, int64_t n) {
    float *h = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    L3D_ASSERT(h != NULL);
    l3d_be_copy_d2h(be, h, dev, (size_t)n * sizeof(float));
    return h;
}
#endif

#define TEST_REPORT()                                                                      \
    (fprintf(stderr, "%s: %d checks, %d failed\n", __FILE__, test_checks, test_failures), \
     test_failures ? 1 : 0)

#endif
