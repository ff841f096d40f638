/*
 * The checking backend (src/backend/check.c): the kernels of an inner backend behind a device
 * arena that host code cannot touch. Selected by name through l3d_backend_init (registry.c).
 *
 *   struct l3d_backend *be = l3d_backend_check_init(l3d_backend_cpu_init());
 */
#ifndef LLM3D_BACKEND_CHECK_H
#define LLM3D_BACKEND_CHECK_H

#include "llm3d/backend.h"

/* The checking backend over inner, which it owns (freed with it). */
struct l3d_backend *l3d_backend_check_init(struct l3d_backend *inner);

#endif
