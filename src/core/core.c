/* Errors, assertions, accounted allocation, RNG and clock. See include/llm3d/core.h. */
#include "llm3d/core.h"

#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

static _Thread_local char err_msg[1024];

/* Formats into a buffer of its own first: callers wrap the previous message
 * (l3d_error(st, "%s: %s", path, l3d_error_message())), and vsnprintf must not read the buffer it
 * writes (C11 7.21.6.12: undefined; glibc garbles the message). */
l3d_status l3d_error(l3d_status st, const char *fmt, ...) {
    char msg[sizeof err_msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    memcpy(err_msg, msg, sizeof msg);
    return st;
}

const char *l3d_error_message(void) { return err_msg[0] ? err_msg : "no error"; }

const char *l3d_status_name(l3d_status st) {
    switch (st) {
    case L3D_OK: return "ok";
    case L3D_ERR_ARG: return "invalid argument";
    case L3D_ERR_IO: return "i/o error";
    case L3D_ERR_FORMAT: return "malformed file";
    case L3D_ERR_OOM: return "out of memory";
    case L3D_ERR_LAYOUT: return "invalid layout";
    case L3D_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}

/* The hook and the rank are set once at start-up, before any thread starts. */
static l3d_abort_fn abort_fn;
static void *abort_ctx;
static int log_rank = -1;

void l3d_set_abort_hook(l3d_abort_fn fn, void *ctx) {
    abort_fn = fn;
    abort_ctx = ctx;
}

void l3d_set_log_rank(int rank) { log_rank = rank; }

_Noreturn void l3d_fatal(const char *file, int line, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (log_rank >= 0)
        fprintf(stderr, "llm3d: rank %d: fatal at %s:%d: %s\n", log_rank, file, line, msg);
    else
        fprintf(stderr, "llm3d: fatal at %s:%d: %s\n", file, line, msg);
    fflush(stderr);
    if (abort_fn) abort_fn(abort_ctx);
    exit(134);
}

/* Each block carries a 64-byte header holding its size, so l3d_free can account for it and the
 * user pointer stays 64-byte aligned. */
#define L3D_ALLOC_HDR 64
static atomic_size_t mem_used;
static atomic_size_t mem_peak;

void *l3d_try_alloc(size_t bytes, const char *what) {
    (void)what;
    size_t total = bytes + L3D_ALLOC_HDR;
    total = (total + 63) & ~(size_t)63;
    unsigned char *base = aligned_alloc(64, total);
    if (!base) return NULL;
    memcpy(base, &bytes, sizeof bytes);
    l3d_mem_count(bytes, true);
    return base + L3D_ALLOC_HDR;
}

void l3d_mem_count(size_t bytes, bool add) {
    if (!add) {
        atomic_fetch_sub(&mem_used, bytes);
        return;
    }
    size_t now = atomic_fetch_add(&mem_used, bytes) + bytes;
    size_t peak = atomic_load(&mem_peak);
    while (now > peak && !atomic_compare_exchange_weak(&mem_peak, &peak, now)) {
    }
}

void *l3d_alloc(size_t bytes, const char *what) {
    void *p = l3d_try_alloc(bytes, what);
    if (!p)
        l3d_fatal(__FILE__, __LINE__, "out of memory allocating %zu bytes for %s (in use: %zu bytes)",
                  bytes, what, atomic_load(&mem_used));
    return p;
}

void *l3d_calloc(size_t bytes, const char *what) {
    void *p = l3d_alloc(bytes, what);
    memset(p, 0, bytes);
    return p;
}

void l3d_free(void *p) {
    if (!p) return;
    unsigned char *base = (unsigned char *)p - L3D_ALLOC_HDR;
    size_t bytes;
    memcpy(&bytes, base, sizeof bytes);
    atomic_fetch_sub(&mem_used, bytes);
    free(base);
}

size_t l3d_mem_used(void) { return atomic_load(&mem_used); }
size_t l3d_mem_peak(void) { return atomic_load(&mem_peak); }

size_t l3d_mem_window_begin(void) { return atomic_exchange(&mem_peak, atomic_load(&mem_used)); }

void l3d_mem_window_end(size_t before) {
    size_t peak = atomic_load(&mem_peak);
    while (before > peak && !atomic_compare_exchange_weak(&mem_peak, &peak, before)) {
    }
}

static uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

uint64_t l3d_rng_u64(uint64_t seed, uint64_t stream, uint64_t index) {
    return splitmix64(splitmix64(splitmix64(seed) ^ stream) ^ index);
}

float l3d_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
    return (float)(l3d_rng_u64(seed, stream, index) >> 40) * (1.0f / 16777216.0f);
}

float l3d_rng_normal(uint64_t seed, uint64_t stream, uint64_t index) {
    /* Box-Muller from two independent 53-bit uniforms of the same counter; u1 in (0, 1]. */
    uint64_t a = l3d_rng_u64(seed, stream, 2 * index);
    uint64_t b = l3d_rng_u64(seed, stream, 2 * index + 1);
    double u1 = ((double)(a >> 11) + 1.0) * (1.0 / 9007199254740992.0);
    double u2 = (double)(b >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

void l3d_rng_seed(l3d_rng *r, uint64_t seed) { r->state = splitmix64(seed ^ 0x6c6c6d3364ULL); }

uint64_t l3d_rng_next(l3d_rng *r) {
    r->state += 0x9e3779b97f4a7c15ULL;
    uint64_t x = r->state;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

float l3d_rng_next_float(l3d_rng *r) { return (float)(l3d_rng_next(r) >> 40) * (1.0f / 16777216.0f); }

double l3d_time_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

l3d_status l3d_mkdir_p(const char *dir) {
    size_t n = strlen(dir);
    char *p = l3d_alloc(n + 1, "directory name");
    memcpy(p, dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (p[i] != '/' && p[i] != '\0') continue;
        char c = p[i];
        p[i] = '\0';
        if (mkdir(p, 0777) != 0 && errno != EEXIST) {
            int e = errno;
            l3d_status st =
                c == '\0' ? l3d_error(L3D_ERR_IO, "cannot create the output directory %s: %s", dir,
                                       strerror(e))
                           : l3d_error(L3D_ERR_IO, "cannot create the output directory %s: "
                                       "creating %s failed: %s", dir, p, strerror(e));
            l3d_free(p);
            return st;
        }
        p[i] = c;
    }
    l3d_free(p);
    struct stat st;
    if (stat(dir, &st) != 0)
        return l3d_error(L3D_ERR_IO, "cannot create the output directory %s: %s", dir,
                         strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return l3d_error(L3D_ERR_IO, "cannot use %s as the output directory: it exists and is not "
                         "a directory", dir);
    return L3D_OK;
}


/* ---- element types --------------------------------------------------------------------------- */

static const struct {
    const char *name;
    size_t size;
} dtypes[] = {
    [L3D_F32] = {"fp32", 4}, [L3D_F64] = {"fp64", 8}, [L3D_I32] = {"int32", 4},
    [L3D_U8] = {"uint8", 1}, [L3D_BF16] = {"bf16", 2}, [L3D_F16] = {"fp16", 2},
    [L3D_I64] = {"int64", 8},
};
#define N_DTYPES (sizeof dtypes / sizeof dtypes[0])
_Static_assert(N_DTYPES == L3D_I64 + 1, "a dtype without a name and size");

size_t l3d_dtype_size(enum l3d_dtype t) {
    L3D_ASSERT((unsigned)t < N_DTYPES);
    return dtypes[t].size;
}

const char *l3d_dtype_name(enum l3d_dtype t) {
    L3D_ASSERT((unsigned)t < N_DTYPES);
    return dtypes[t].name;
}

l3d_status l3d_dtype_parse(const char *s, enum l3d_dtype *t) {
    for (size_t k = 0; k < N_DTYPES; k++)
        if (strcmp(s, dtypes[k].name) == 0) {
            *t = (enum l3d_dtype)k;
            return L3D_OK;
        }
    return l3d_error(L3D_ERR_ARG, "unknown element type '%s': choose fp32, bf16, fp16, fp64, "
                     "int32, int64 or uint8", s);
}

/* Adding 0x7fff plus the lowest kept bit carries into the kept half exactly when the dropped half
 * is above one half, or is one half and the kept value is odd: nearest, ties to even. The largest
 * finite values carry into the exponent and become Inf, as they should. */
uint16_t l3d_f32_to_bf16(float f) {
    uint32_t u = l3d_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float l3d_bf16_to_f32(uint16_t h) { return l3d_f32_from_bits((uint32_t)h << 16); }

uint16_t l3d_f32_to_f16(float f) {
    uint32_t u = l3d_f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* quiet NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 = 65504 + ulp/2: Inf */
    if (a >= 0x38800000u) {                                   /* >= 2^-14: normal */
        uint32_t r = a - 0x38000000u;                         /* exponent bias 127 -> 15 */
        r += 0xfffu + ((r >> 13) & 1u);                       /* as in l3d_f32_to_bf16 */
        return (uint16_t)(sign | (r >> 13));
    }
    if (a <= 0x33000000u) return sign; /* <= 2^-25, half the smallest subnormal: to (signed) 0 */
    /* subnormal: the value in units of 2^-24 is mant 2^(e - 150 + 24), i.e. mant >> (126 - e),
     * with e in [102, 112]; rounding up from 0x3ff gives 0x400, the smallest normal */
    uint32_t e = a >> 23, mant = (a & 0x7fffffu) | 0x800000u;
    int shift = 126 - (int)e;
    uint32_t q = mant >> shift, rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return (uint16_t)(sign | q);
}

float l3d_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) /* Inf, NaN (payload kept) */
        return l3d_f32_from_bits(sign | 0x7f800000u | (m << 13));
    if (e) return l3d_f32_from_bits(sign | ((e + 112) << 23) | (m << 13));
    float v = (float)m * 0x1p-24f; /* zero or subnormal: exact */
    return sign ? -v : v;
}

l3d_status l3d_open_regular(const char *path, const char *what, int *fd, int64_t *size) {
    *fd = -1;
    /* O_NONBLOCK: opening a FIFO with no writer, or some devices, would block here forever */
    int d = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (d < 0) return l3d_error(L3D_ERR_IO, "cannot open %s %s: %s", what, path, strerror(errno));
    struct stat sb;
    if (fstat(d, &sb) != 0) {
        int e = errno;
        close(d);
        return l3d_error(L3D_ERR_IO, "cannot stat %s %s: %s", what, path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(d);
        return l3d_error(L3D_ERR_IO, "%s %s is not a regular file (%s): give the path of a file",
                         what, path, S_ISDIR(sb.st_mode) ? "a directory" : S_ISFIFO(sb.st_mode)
                         ? "a FIFO" : S_ISCHR(sb.st_mode) || S_ISBLK(sb.st_mode) ? "a device"
                         : "a special file");
    }
    int fl = fcntl(d, F_GETFL);
    if (fl < 0 || fcntl(d, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        int e = errno;
        close(d);
        return l3d_error(L3D_ERR_IO, "cannot read %s %s: %s", what, path, strerror(e));
    }
    *fd = d;
    if (size) *size = (int64_t)sb.st_size;
    return L3D_OK;
}

l3d_status l3d_fopen_regular(const char *path, const char *what, FILE **f, int64_t *size) {
    int fd;
    *f = NULL;
    l3d_status st = l3d_open_regular(path, what, &fd, size);
    if (st != L3D_OK) return st;
    *f = fdopen(fd, "rb");
    if (!*f) {
        int e = errno;
        close(fd);
        return l3d_error(L3D_ERR_IO, "cannot read %s %s: %s", what, path, strerror(e));
    }
    return L3D_OK;
}

size_t l3d_utf8_put(char *o, uint32_t cp) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xc0 | cp >> 6);
        o[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | cp >> 12);
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | cp >> 18);
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}
