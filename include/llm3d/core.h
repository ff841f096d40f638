/*
 * llm3d core: status codes and error messages, always-on assertions, accounted allocation,
 * a counter-based RNG, and a wall clock.
 *
 *   l3d_status st = l3d_shard_open(&sh, path);
 *   if (st != L3D_OK) { fprintf(stderr, "llm3d: %s\n", l3d_error_message()); return 1; }
 *
 *   float *buf = l3d_alloc(n * sizeof(float), "activations");   // counted in l3d_mem_peak()
 *   float x = l3d_rng_normal(seed, stream, index);               // same value on every layout
 *
 *   uint16_t h = l3d_f32_to_bf16(x);                             // round to nearest even
 *   size_t bytes = n * l3d_dtype_size(L3D_BF16);                 // planner and trainer alike
 *
 * Errors the user or the environment can cause return a status; the message (what was wrong,
 * with which value, and what to do) is kept per thread and read with l3d_error_message().
 * Programmer errors use L3D_ASSERT, which is always on and calls the abort hook (the distributed
 * runtime installs one that brings every rank down).
 */
#ifndef LLM3D_CORE_H
#define LLM3D_CORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef enum {
    L3D_OK = 0,
    L3D_ERR_ARG,     /* a bad flag or parameter value */
    L3D_ERR_IO,      /* a file could not be opened, read or written */
    L3D_ERR_FORMAT,  /* a file's content is malformed (magic, size, range) */
    L3D_ERR_OOM,     /* an allocation failed */
    L3D_ERR_LAYOUT,  /* a layout that does not fit the model or the world */
    L3D_ERR_INTERNAL,
} l3d_status;


/* Sets the calling thread's error message (printf-style) and returns st, so that
 * `return l3d_error(L3D_ERR_IO, "cannot open %s: %s", path, strerror(errno));` reads well. */
l3d_status l3d_error(l3d_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const char *l3d_error_message(void);
const char *l3d_status_name(l3d_status st);

/* Abort hook: called by L3D_ASSERT and l3d_fatal after the message is printed. The default exits
 * the process with status 134; the MPI runtime replaces it with MPI_Abort on the world. */
typedef void (*l3d_abort_fn)(void *ctx);
void l3d_set_abort_hook(l3d_abort_fn fn, void *ctx);
/* Rank printed in fatal messages (-1 before the runtime knows it). */
void l3d_set_log_rank(int rank);
_Noreturn void l3d_fatal(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define L3D_ASSERT(x)                                                 \
    do {                                                              \
        if (!(x)) l3d_fatal(__FILE__, __LINE__, "assertion failed: %s", #x); \
    } while (0)

/* Accounted host allocation, 64-byte aligned. l3d_alloc aborts with a clear message when memory
 * runs out (it is only called at start-up, before the step loop); l3d_try_alloc returns NULL. */
void *l3d_alloc(size_t bytes, const char *what);
void *l3d_try_alloc(size_t bytes, const char *what);
void *l3d_calloc(size_t bytes, const char *what);
void l3d_free(void *p);
size_t l3d_mem_used(void);
/* Counts memory not from l3d_alloc (a backend's device arena) in l3d_mem_used / l3d_mem_peak. */
void l3d_mem_count(size_t bytes, bool add);
size_t l3d_mem_peak(void);
/* A window on the peak: begin makes the peak the memory in use now and returns the peak before;
 * l3d_mem_peak() then says the most in use since; end puts back the larger of the two. */
size_t l3d_mem_window_begin(void);
void l3d_mem_window_end(size_t before);

/* Counter-based RNG: every value is a pure function of (seed, stream, index), so a tensor element
 * gets the same initial value whatever rank or shard initialises it. SplitMix64 finaliser
 * (Steele et al. 2014) over the packed counter; normals by Box-Muller. */
uint64_t l3d_rng_u64(uint64_t seed, uint64_t stream, uint64_t index);
float l3d_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index); /* [0, 1) */
float l3d_rng_normal(uint64_t seed, uint64_t stream, uint64_t index);  /* N(0, 1) */

/* Sequential generator for sampling and batch order: a state that advances. */
typedef struct {
    uint64_t state;
} l3d_rng;
void l3d_rng_seed(l3d_rng *r, uint64_t seed);
uint64_t l3d_rng_next(l3d_rng *r);
float l3d_rng_next_float(l3d_rng *r); /* [0, 1) */

/* Element types of tensors and of communicator buffers. bf16 is the upper half of an IEEE binary32
 * (Google Brain float16: 8 exponent bits, 7 stored mantissa bits); fp16 is IEEE 754 binary16. */
enum l3d_dtype { L3D_F32, L3D_F64, L3D_I32, L3D_U8, L3D_BF16, L3D_F16, L3D_I64 };

/* Bytes per element: the one function the planner and the trainer size buffers with. */
size_t l3d_dtype_size(enum l3d_dtype t);
/* "fp32", "fp64", "int32", "uint8", "bf16", "fp16", "int64" */
const char *l3d_dtype_name(enum l3d_dtype t);
/* The inverse of l3d_dtype_name; L3D_ERR_ARG naming the text and the choices otherwise. */
l3d_status l3d_dtype_parse(const char *s, enum l3d_dtype *t);

/* Scalar conversions. From fp32: round to nearest, ties to even; a NaN stays a NaN of the same
 * sign with the quiet bit set (its payload's upper bits kept). To fp16: magnitudes from 65520 up
 * become Inf, those below 2^-14 become subnormals (multiples of 2^-24), rounded the same way.
 * To fp32: exact. */
uint16_t l3d_f32_to_bf16(float f);
float l3d_bf16_to_f32(uint16_t h);

/* UTF-8 bytes of code point cp (0 <= cp <= 0x10FFFF) into o (room for 4): their count. */
size_t l3d_utf8_put(char *o, uint32_t cp);
uint16_t l3d_f32_to_f16(float f);
float l3d_f16_to_f32(uint16_t h);
/* The IEEE binary32 bit pattern of f, and the float of pattern u (no conversion). */
static inline uint32_t l3d_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}
static inline float l3d_f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
/* bf16 both ways inline, bit for bit the two above, for loops the compiler vectorizes (the
 * backend's kernels, MPI's bf16 SUM): widening is a shift, narrowing adds the rounding bias. */
static inline float l3d_bf16_widen(uint16_t h) { return l3d_f32_from_bits((uint32_t)h << 16); }
static inline uint16_t l3d_bf16_narrow(float f) {
    uint32_t u = l3d_f32_bits(f);
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, q = (u >> 16) | 0x0040u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? q : r);
}

double l3d_time_s(void); /* monotonic wall clock in seconds */

/* mkdir -p: creates dir and its missing parents; L3D_ERR_IO naming the part that failed, or when
 * dir exists and is not a directory. */
l3d_status l3d_mkdir_p(const char *dir);

/* Opens an input file for reading, refusing anything but a regular file without blocking (a FIFO
 * with no writer, a device): opened O_NONBLOCK, checked with fstat, then made blocking again.
 * L3D_ERR_IO names `what` ("token shard", "checkpoint"), the path and the reason. *size (when not
 * NULL) gets the file's size. */
l3d_status l3d_open_regular(const char *path, const char *what, int *fd, int64_t *size);
/* The same as a stdio stream ("rb"). */
l3d_status l3d_fopen_regular(const char *path, const char *what, FILE **f, int64_t *size);

#endif
