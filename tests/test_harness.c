/*
 * The harness's comparisons fail on NaN and Inf (tests/test.h): CHECK_NEAR, test_max and
 * test_rel_diff, which the model, inference and tensor-parallel tests use for their worst
 * differences. Each expected failure is counted here and taken back out of the totals, so this
 * test fails exactly when one of them passes a value that is not finite. The CHECK_NEAR lines it
 * prints on stderr are the expected ones.
 */
#include <string.h>

#include "test.h"

/* How many failures the CHECK_NEAR of a and b within tol counted (then removed from the totals). */
static int near_fails(double a, double b, double tol) {
    int f = test_failures, c = test_checks;
    CHECK_NEAR(a, b, tol);
    int n = test_failures - f;
    test_failures = f;
    test_checks = c;
    return n;
}

int main(void) {
    fprintf(stderr, "expected CHECK_NEAR failures follow:\n");
    CHECK(near_fails(1.0, 1.0 + 1e-9, 1e-6) == 0);
    CHECK(near_fails(1.0, 1.1, 1e-6) == 1);
    CHECK(near_fails(NAN, 1.0, 1e-6) == 1);
    CHECK(near_fails(1.0, NAN, 1e-6) == 1);
    CHECK(near_fails(NAN, NAN, 1e-6) == 1);
    CHECK(near_fails(INFINITY, INFINITY, 1e-6) == 1);
    CHECK(near_fails(1.0, 1.0, NAN) == 1);
    fprintf(stderr, "end of the expected failures\n");

    /* the running maximum keeps a NaN wherever it comes; fmax would not */
    CHECK(fmax(0.0, NAN) == 0.0); /* why test_max exists */
    CHECK(isnan(test_max(0.0, NAN)));
    CHECK(isnan(test_max(NAN, 0.0)));
    CHECK(isnan(test_max(test_max(0.0, NAN), 5.0)));
    CHECK(test_max(1.0, 2.0) == 2.0 && test_max(2.0, 1.0) == 2.0);
    double worst = 0.0;
    const double d[] = {1e-9, NAN, 1e-8};
    for (int i = 0; i < 3; i++) worst = test_max(worst, d[i]);
    CHECK(!(worst <= 1e-6)); /* a `worst <= tol` check fails */

    /* relative differences of float arrays */
    float a[4] = {1.0f, -2.0f, 0.5f, 4.0f}, b[4];
    memcpy(b, a, sizeof a);
    CHECK(test_rel_diff(a, b, 4) == 0.0);
    b[2] = 0.5f + 4e-3f;
    CHECK_NEAR(test_rel_diff(a, b, 4), 1e-3, 1e-7); /* 4e-3 / max|b| = 4 */
    float zero[2] = {0.0f, 0.0f}, small[2] = {0.0f, 1e-3f};
    CHECK(test_rel_diff(zero, zero, 2) == 0.0);
    CHECK_NEAR(test_rel_diff(small, zero, 2), 1e-3, 1e-9); /* absolute when b is all zeros */
    const float bad[] = {NAN, INFINITY, -INFINITY};
    for (int k = 0; k < 3; k++) {
        memcpy(b, a, sizeof a);
        b[3] = bad[k];
        CHECK(!(test_rel_diff(a, b, 4) < 1e-5)); /* in b */
        CHECK(!(test_rel_diff(b, a, 4) < 1e-5)); /* in a */
        CHECK(!(test_rel_diff(b, b, 4) < 1e-5)); /* the same non-finite value on both sides */
    }
    return TEST_REPORT();
}
