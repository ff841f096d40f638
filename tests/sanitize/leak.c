/* The negative case of the sanitized suite's leak check (tests/lsan.supp, keep_modules.c): on 2
 * ranks, a block that a function of ours allocates between MPI_Init and MPI_Finalize and loses.
 * The test sanitize_leak_np2 (CMakeLists.txt, sanitized builds only) passes only when
 * LeakSanitizer's report names leak_here, under the same options as every MPI test: a
 * suppression or an unwinding that hid our own leaks would fail it. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

__attribute__((noinline)) static void *leak_here(size_t n) {
    void *p = malloc(n);
    if (p) memset(p, 1, n);
    return p;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    void *volatile p = leak_here(4096);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    printf("rank %d lost a block of 4096 bytes at %p\n", rank, p);
    p = NULL;
    MPI_Finalize();
    return 0;
}
