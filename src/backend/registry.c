/*
 * The backends by name (l3d_backend_init, include/llm3d/backend.h): the one file that knows
 * every backend. It depends on the backends, and they on backend.c only, so the dependencies run
 * one way: registry.c -> cpu.c, check.c -> backend.c. A new backend is one row of the table.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/check.h"
#ifdef L3D_CUDA
#include "backend/cuda.h"
#endif
#include "llm3d/backend.h"

static struct l3d_backend *check_over_cpu(void) {
    return l3d_backend_check_init(l3d_backend_cpu_init());
}

static const struct {
    const char *name;
    struct l3d_backend *(*init)(void);
    const char *what; /* for the message that lists the backends; NULL: the name says it */
} backends[] = {
    {"cpu", l3d_backend_cpu_init, NULL},
    {"check", check_over_cpu, "the CPU kernels behind a checked device arena, for tests"},
#ifdef L3D_CUDA /* -DL3D_CUDA=ON */
    {"cuda", l3d_backend_cuda_init, "experimental: it has not yet run on a GPU"},
#endif
};
#define N_BACKENDS (sizeof backends / sizeof backends[0])

l3d_status l3d_backend_init(const char *name, struct l3d_backend **out) {
    *out = NULL;
    const char *src = "--backend";
    if (!name || !*name) {
        name = getenv("L3D_BACKEND");
        src = "L3D_BACKEND";
    }
    if (!name || !*name) name = "cpu";
    for (size_t k = 0; k < N_BACKENDS; k++)
        if (strcmp(name, backends[k].name) == 0) {
            *out = backends[k].init();
            return L3D_OK;
        }
    char list[512]; /* "cpu, or check (the CPU kernels ...)" */
    size_t n = 0;
    for (size_t k = 0; k < N_BACKENDS && n < sizeof list; k++) {
        const char *sep = k == 0 ? "" : k + 1 == N_BACKENDS ? ", or " : ", ";
        const char *what = backends[k].what;
        n += (size_t)snprintf(list + n, sizeof list - n, "%s%s%s%s%s", sep, backends[k].name,
                              what ? " (" : "", what ? what : "", what ? ")" : "");
    }
    return l3d_error(L3D_ERR_ARG, "unknown backend '%s' (%s): use %s", name, src, list);
}
