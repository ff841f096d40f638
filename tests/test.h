/*
 * A tiny test harness: CHECK prints the failing expression, CHECK_NEAR both values.
 *
 *   int main(void) { CHECK(1 + 1 == 2); CHECK_NEAR(x, 1.0, 1e-6); return TEST_REPORT(); }
 */
#ifndef L3D_TEST_H
#define L3D_TEST_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
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

/* |a - b| <= tol, printing both values when it fails. Written as !(d <= tol) so that a NaN on
 * either side (or in tol) fails: `fabs(a - b) > tol` is false for a NaN and would pass it. */
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

/* Comparisons that keep a NaN. fmax(m, NAN) is m and `x > m` is false for a NaN, so the usual
 * running maximum of |a - b| drops a NaN difference and a `worst <= tol` check passes it. */

/* max(m, x), NaN once either is NaN (and from then on, as m). */
static inline double test_max(double m, double x) {
    return isnan(m) || isnan(x) ? NAN : x > m ? x : m;
}

/* max_i |a_i - b_i| / max_i |b_i| (max |a_i - b_i| when b is all zeros); infinite when any a_i or
 * b_i is not finite, so that `test_rel_diff(...) < tol` fails on a NaN or Inf on either side. */
static inline double test_rel_diff(const float *a, const float *b, int64_t n) {
    double d = 0.0, m = 0.0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(a[i]) || !isfinite(b[i])) return INFINITY;
        double e = fabs((double)a[i] - b[i]), v = fabs((double)b[i]);
        d = e > d ? e : d;
        m = v > m ? v : m;
    }
    return m > 0 ? d / m : d;
}

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

/* The folders of a test that reads files: data, `sub` of the folder of the test's source (file:
 * its __FILE__), and tmp, /tmp/l3d_<name>_<pid>, made (its files are the test's to remove). */
#include <libgen.h>
#include <sys/stat.h>
#include <unistd.h>

static inline void test_dirs(const char *file, const char *sub, char *data, size_t data_cap,
                             const char *name, char *tmp, size_t tmp_cap) {
    char src[4096];
    snprintf(src, sizeof src, "%s", file);
    snprintf(data, data_cap, "%s/%s", dirname(src), sub);
    snprintf(tmp, tmp_cap, "/tmp/l3d_%s_%d", name, (int)getpid());
    mkdir(tmp, 0755);
}

/* Removes the folder dir and all it holds: whether that went well. */
#include <stdlib.h>
static inline bool test_rm_rf(const char *dir) {
    char cmd[8300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0;
}

#define TEST_REPORT()                                                                      \
    (fprintf(stderr, "%s: %d checks, %d failed\n", __FILE__, test_checks, test_failures), \
     test_failures ? 1 : 0)

#endif
