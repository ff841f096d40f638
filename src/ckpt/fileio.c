/* Checkpoint files (src/ckpt/ckpt-impl.h): the checksum, whole reads and writes, host staging of
 * device memory, atomic text files (a temporary file, fsync, rename), and the trimming of a
 * resumed run's metrics. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt-impl.h"
#include "llm3d/ckpt.h"
#include "llm3d/file.h"
#include "llm3d/json.h"

/* ---- checksum -----------------------------------------------------------------------------------
 * 64-bit, four independent lanes over 8-byte little-endian words, so it runs at memory speed: the
 * round of xxHash64 (Y. Collet, xxhash.com spec: acc = rotl(acc + w * P2, 31) * P1, with its
 * primes), the lanes and the length folded by the SplitMix64 finaliser (Steele et al. 2014). An
 * integrity check against truncation and bit flips, not a cryptographic hash. */
#define P1 0x9E3779B185EBCA87ULL
#define P2 0xC2B2AE3D27D4EB4FULL

static uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

void l3d_ckpt_hash_init(struct l3d_ckpt_hasher *h) {
    memset(h, 0, sizeof *h);
    for (int i = 0; i < 4; i++) h->lane[i] = P1 * (uint64_t)(i + 1);
}

static void hash_block(struct l3d_ckpt_hasher *h, const uint8_t *p) {
    for (int i = 0; i < 4; i++) {
        uint64_t w;
        memcpy(&w, p + 8 * i, 8);
        h->lane[i] = rotl(h->lane[i] + w * P2, 31) * P1;
    }
}

void l3d_ckpt_hash_update(struct l3d_ckpt_hasher *h, const void *data, size_t n) {
    const uint8_t *p = data;
    h->len += n;
    if (h->npend) {
        size_t k = 32 - (size_t)h->npend < n ? 32 - (size_t)h->npend : n;
        memcpy(h->pend + h->npend, p, k);
        h->npend += (int)k;
        p += k;
        n -= k;
        if (h->npend < 32) return;
        hash_block(h, h->pend);
        h->npend = 0;
    }
    for (; n >= 32; p += 32, n -= 32) hash_block(h, p);
    memcpy(h->pend, p, n);
    h->npend = (int)n;
}

uint64_t l3d_ckpt_hash_final(const struct l3d_ckpt_hasher *h) {
    uint8_t tail[32] = {0};
    memcpy(tail, h->pend, (size_t)h->npend);
    struct l3d_ckpt_hasher c = *h;
    hash_block(&c, tail);
    uint64_t r = mix(c.len);
    for (int i = 0; i < 4; i++) r = mix(r ^ c.lane[i]);
    return r;
}

/* ---- files ----------------------------------------------------------------------------------- */

size_t l3d_ckpt_stage_bytes(void) {
    const char *v = getenv("L3D_CKPT_TEST_STAGE"); /* tests: many transfers on tiny models */
    return v && atoll(v) > 0 ? (size_t)atoll(v) : L3D_CKPT_STAGE_BYTES;
}

l3d_status l3d_ckpt_stage_init(struct l3d_ckpt_stage *sg, size_t want, const char *path) {
    sg->cap = l3d_ckpt_stage_cap(want);
    sg->p = l3d_try_alloc(sg->cap, "checkpoint staging");
    if (!sg->p)
        return l3d_error(L3D_ERR_OOM, "%s: no host memory for a %zu-byte staging buffer of the "
                         "checkpoint", path, sg->cap);
    return L3D_OK;
}

/* every entry point checks its paths against L3D_CKPT_PATH_CAP first (l3d_ckpt_long_path) */
void l3d_ckpt_join(char *buf, size_t cap, const char *a, const char *sep, const char *b) {
    int n = snprintf(buf, cap, "%s%s%s", a, sep, b);
    L3D_ASSERT(n >= 0 && (size_t)n < cap);
}

l3d_status l3d_ckpt_long_path(const char *p) {
    if (strlen(p) < L3D_CKPT_PATH_CAP - 128) return L3D_OK;
    return l3d_error(L3D_ERR_ARG, "checkpoint path too long (%zu characters, at most %d): %.80s...",
                     strlen(p), L3D_CKPT_PATH_CAP - 129, p);
}

l3d_status l3d_ckpt_write_all(int fd, const char *path, const void *buf, size_t n,
                              struct l3d_ckpt_hasher *h) {
    if (h) l3d_ckpt_hash_update(h, buf, n);
    const char *p = buf;
    while (n > 0) {
        ssize_t k = write(fd, p, n > (1u << 30) ? (1u << 30) : n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return l3d_error(L3D_ERR_IO, "cannot write %s: %s", path, strerror(errno));
        p += k;
        n -= (size_t)k;
    }
    return L3D_OK;
}

l3d_status l3d_ckpt_read_at(const char *path, int64_t off, void *buf, size_t n) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return l3d_error(L3D_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    char *p = buf;
    while (n > 0) {
        ssize_t k = pread(fd, p, n > (1u << 30) ? (1u << 30) : n, (off_t)off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            int e = errno;
            close(fd);
            return l3d_error(L3D_ERR_FORMAT, "%s: cannot read %zu bytes at offset %lld: %s", path,
                             n, (long long)off, k == 0 ? "file too short" : strerror(e));
        }
        p += k;
        n -= (size_t)k;
        off += k;
    }
    close(fd);
    return L3D_OK;
}

/* n bytes of device memory at src, copied to the host a staging buffer at a time, written. */
l3d_status l3d_ckpt_write_device(int fd, const char *path, struct l3d_backend *be, const void *src,
                                 size_t n, const struct l3d_ckpt_stage *sg,
                                 struct l3d_ckpt_hasher *h) {
    l3d_status st = L3D_OK;
    for (size_t done = 0, k; st == L3D_OK && done < n; done += k) {
        k = n - done < sg->cap ? n - done : sg->cap;
        l3d_be_copy_d2h(be, sg->p, (const char *)src + done, k);
        st = l3d_ckpt_write_all(fd, path, sg->p, k, h);
    }
    return st;
}

/* n bytes at off of path into device memory at dst, a staging buffer at a time. A copy to the
 * device may read its host buffer until the backend is synchronised: every h2d here is followed
 * by l3d_be_sync before that buffer is refilled or freed. */
l3d_status l3d_ckpt_read_device(const char *path, int64_t off, struct l3d_backend *be, void *dst,
                                size_t n) {
    struct l3d_ckpt_stage sg;
    l3d_status st = l3d_ckpt_stage_init(&sg, n, path);
    for (size_t done = 0, k; st == L3D_OK && done < n; done += k) {
        k = n - done < sg.cap ? n - done : sg.cap;
        st = l3d_ckpt_read_at(path, off + (int64_t)done, sg.p, k);
        if (st == L3D_OK) l3d_be_copy_h2d(be, (char *)dst + done, sg.p, k);
        l3d_be_sync(be);
    }
    l3d_free(sg.p);
    return st;
}

l3d_status l3d_ckpt_fsync_path(const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return l3d_error(L3D_ERR_IO, "cannot open %s to sync it: %s", path, strerror(errno));
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    if (rc != 0) return l3d_error(L3D_ERR_IO, "cannot sync %s: %s", path, strerror(e));
    return L3D_OK;
}

/* Writes text to path atomically (include/llm3d/file.h's writer). */
l3d_status l3d_ckpt_write_text_atomic(const char *path, const char *text) {
    return l3d_write_file(path, "file", text, strlen(text));
}

/* ---- metrics --------------------------------------------------------------------------------- */

/* Whether a line of metrics.jsonl stays: one JSON object, a step line of at most step, or the
 * run record (no "step"). A line cut short, or bytes of two half-written lines, is dropped. */
static bool metrics_line_kept(const char *line, size_t len, int64_t step) {
    struct l3d_json doc;
    int64_t s = 0;
    bool keep = false;
    if (l3d_json_parse(&doc, line, len, "metrics line") == L3D_OK &&
        doc.type == L3D_JSON_OBJECT) {
        const struct l3d_json *sv = l3d_json_get(&doc, "step");
        keep = sv ? l3d_json_int(sv, &s) && s <= step : l3d_json_get(&doc, "run") != NULL;
    }
    l3d_json_free(&doc);
    return keep;
}

l3d_status l3d_ckpt_trim_metrics(const char *path, int64_t step) {
    if (l3d_ckpt_long_path(path) != L3D_OK) return L3D_ERR_ARG;
    struct stat sb;
    if (stat(path, &sb) != 0 && errno == ENOENT) return L3D_OK;
    FILE *f; /* a FIFO would block the open: refused unread */
    l3d_status ost = l3d_fopen_regular(path, "metrics file", &f, NULL);
    if (ost != L3D_OK) return ost;
    size_t cap = 1 << 16, n = 0;
    char *text = malloc(cap), line[8192];
    text[0] = '\0';
    while (fgets(line, sizeof line, f)) {
        size_t len = strlen(line);
        if (len == 0 || line[len - 1] != '\n') continue; /* cut short (or too long to be ours) */
        if (!metrics_line_kept(line, len, step)) continue; /* the rest of one: no JSON either */
        size_t k = strlen(line);
        if (n + k + 1 > cap) text = realloc(text, cap = 2 * (n + k + 1));
        memcpy(text + n, line, k + 1);
        n += k;
    }
    fclose(f);
    l3d_status st = l3d_ckpt_write_text_atomic(path, text);
    free(text);
    return st;
}

/* ---- text files ------------------------------------------------------------------------------ */

l3d_status l3d_ckpt_read_text(const char *path, const char *what, char **text, size_t *len) {
    FILE *f;
    int64_t size;
    l3d_status st = l3d_fopen_regular(path, what, &f, &size);
    if (st != L3D_OK) return st;
    if (size > ((int64_t)64 << 20)) {
        fclose(f);
        return l3d_error(L3D_ERR_FORMAT, "%s: %lld bytes, more than a %s holds (64 MiB at most)",
                         path, (long long)size, what);
    }
    *text = l3d_alloc((size_t)size + 1, what);
    *len = fread(*text, 1, (size_t)size, f);
    fclose(f);
    (*text)[*len] = '\0';
    if (*len == (size_t)size) return L3D_OK;
    l3d_free(*text);
    *text = NULL;
    return l3d_error(L3D_ERR_IO, "%s: cannot read its %lld bytes", path, (long long)size);
}
