/* The negative case of the sanitized suite's leak check (tests/lsan.supp, keep_modules.c): on 2
 * ranks, a block that a function of ours allocates between MPI's start and its end, through the
 * project's own communicator (l3d_comm_mpi_init, as every command starts), and loses. The test
 * sanitize_leak_np2 (CMakeLists.txt, sanitized builds only) passes only when LeakSanitizer's
 * report names leak_here, under the same options as every MPI test: a suppression or an
 * unwinding that hid our own leaks would fail it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llm3d/comm.h"

__attribute__((noinline)) static void *leak_here(size_t n) {
    void *p = malloc(n);
    if (p) memset(p, 1, n);
    return p;
}

int main(int argc, char **argv) {
    struct l3d_comm *world = NULL;
    if (l3d_comm_mpi_init(&argc, &argv, &world) != L3D_OK) return 1;
    void *volatile p = leak_here(4096);
    printf("rank %d of %d lost a block of 4096 bytes at %p\n", world->rank, world->size, p);
    p = NULL;
    l3d_comm_mpi_finalize(world);
    return 0;
}
