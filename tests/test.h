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

#define TEST_REPORT()                                                                      \
    (fprintf(stderr, "%s: %d checks, %d failed\n", __FILE__, test_checks, test_failures), \
     test_failures ? 1 : 0)

#endif
