/* TensorBoard event files: CRC-32C, a protobuf encoder for the Event fields llm3d writes, the
 * TFRecord framing and the file (include/llm3d/tfevents.h). */
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "llm3d/tfevents.h"

/* ---- CRC-32C ------------------------------------------------------------------------------- */

/* The byte-at-a-time table of the reflected Castagnoli polynomial (RFC 3720 appendix B.4 gives
 * the same CRC for iSCSI); a few hundred bytes a step need nothing faster. */
static uint32_t crc_table[256];

static void crc_table_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
        crc_table[i] = c;
    }
}

uint32_t l3d_crc32c(uint32_t crc, const void *data, size_t n) {
    if (!crc_table[1]) crc_table_init(); /* idempotent: a race writes the same values */
    const uint8_t *p = data;
    crc = ~crc;
    for (size_t i = 0; i < n; i++) crc = crc_table[(crc ^ p[i]) & 0xffu] ^ (crc >> 8);
    return ~crc;
}

uint32_t l3d_tfrecord_mask(uint32_t crc) {
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

/* ---- protobuf: the wire types Event and Summary use ------------------------------------------ */

size_t l3d_pb_varint(uint8_t *buf, uint64_t v) {
    size_t n = 0;
    while (v >= 0x80) {
        buf[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    buf[n++] = (uint8_t)v;
    return n;
}

/* A bounded output buffer: a write past cap marks it over and writes nothing more. */
struct pb {
    uint8_t *p;
    size_t n, cap;
    bool over;
};

static void pb_raw(struct pb *b, const void *data, size_t n) {
    if (b->over || n > b->cap - b->n) {
        b->over = true;
        return;
    }
    memcpy(b->p + b->n, data, n);
    b->n += n;
}

static void pb_varint(struct pb *b, uint64_t v) {
    uint8_t t[10];
    pb_raw(b, t, l3d_pb_varint(t, v));
}

enum { WIRE_VARINT = 0, WIRE_FIXED64 = 1, WIRE_BYTES = 2, WIRE_FIXED32 = 5 };

static void pb_key(struct pb *b, int field, int wire) { pb_varint(b, (uint64_t)field << 3 | wire); }

/* protobuf's fixed fields and TFRecord's length and CRCs: little-endian */
static void pb_le(struct pb *b, uint64_t v, int bytes) {
    uint8_t t[8];
    for (int i = 0; i < bytes; i++) t[i] = (uint8_t)(v >> (8 * i));
    pb_raw(b, t, (size_t)bytes);
}

static void pb_bytes(struct pb *b, int field, const void *data, size_t n) {
    pb_key(b, field, WIRE_BYTES);
    pb_varint(b, n);
    pb_raw(b, data, n);
}

/* Summary.Value {tag = 1, simple_value = 2} into a buffer of its own, then as field 1 of b (a
 * Summary): a length-delimited field needs its length first. */
static void pb_summary_value(struct pb *b, const struct l3d_tfevents_scalar *s) {
    uint8_t buf[L3D_TFEVENTS_TAG_MAX + 16];
    struct pb v = {.p = buf, .cap = sizeof buf};
    size_t len = strlen(s->tag);
    L3D_ASSERT(len <= L3D_TFEVENTS_TAG_MAX);
    pb_bytes(&v, 1, s->tag, len);
    uint32_t bits;
    memcpy(&bits, &s->value, sizeof bits);
    pb_key(&v, 2, WIRE_FIXED32);
    pb_le(&v, bits, 4);
    L3D_ASSERT(!v.over);
    pb_bytes(b, 1, buf, v.n);
}

size_t l3d_tfevents_event(uint8_t *buf, size_t cap, double wall_time, int64_t step,
                          const char *file_version, const struct l3d_tfevents_scalar *v, int n) {
    L3D_ASSERT(n >= 0 && n <= L3D_TFEVENTS_MAX_SCALARS);
    struct pb e = {.p = buf, .cap = cap};
    uint64_t bits;
    memcpy(&bits, &wall_time, sizeof bits);
    pb_key(&e, 1, WIRE_FIXED64);
    pb_le(&e, bits, 8);
    pb_key(&e, 2, WIRE_VARINT);
    pb_varint(&e, (uint64_t)step); /* int64: a negative step would take ten bytes, as protobuf's */
    if (file_version) pb_bytes(&e, 3, file_version, strlen(file_version));
    if (n > 0) {
        uint8_t sbuf[L3D_TFEVENTS_MAX_SCALARS * (L3D_TFEVENTS_TAG_MAX + 24)];
        struct pb s = {.p = sbuf, .cap = sizeof sbuf};
        for (int i = 0; i < n; i++) pb_summary_value(&s, &v[i]);
        L3D_ASSERT(!s.over);
        pb_bytes(&e, 5, sbuf, s.n);
    }
    return e.over ? 0 : e.n;
}

size_t l3d_tfrecord_frame(uint8_t *buf, size_t cap, const uint8_t *data, size_t n) {
    L3D_ASSERT(cap >= n + 16);
    struct pb r = {.p = buf, .cap = cap};
    pb_le(&r, n, 8);
    pb_le(&r, l3d_tfrecord_mask(l3d_crc32c(0, buf, 8)), 4);
    pb_raw(&r, data, n);
    pb_le(&r, l3d_tfrecord_mask(l3d_crc32c(0, data, n)), 4);
    return r.n;
}

/* ---- the file ------------------------------------------------------------------------------- */

static double wall_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static l3d_status write_event(const struct l3d_tfevents *tb, int64_t step,
                              const char *file_version, const struct l3d_tfevents_scalar *v,
                              int n) {
    uint8_t ev[L3D_TFEVENTS_MAX_SCALARS * (L3D_TFEVENTS_TAG_MAX + 24) + 64];
    uint8_t rec[sizeof ev + 16];
    size_t len = l3d_tfevents_event(ev, sizeof ev, wall_now(), step, file_version, v, n);
    L3D_ASSERT(len > 0);
    size_t m = l3d_tfrecord_frame(rec, sizeof rec, ev, len);
    return l3d_log_append(tb->f, tb->path, rec, m, "record");
}

/* The latest <seconds> of the event files in dir (-1: none). */
static long long latest_seconds(const char *dir) {
    static const char prefix[] = "events.out.tfevents.";
    long long latest = -1;
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (strncmp(e->d_name, prefix, sizeof prefix - 1) != 0) continue;
        long long s = strtoll(e->d_name + sizeof prefix - 1, NULL, 10);
        if (s > latest) latest = s;
    }
    if (d) closedir(d);
    return latest;
}

/* DIR/events.out.tfevents.<seconds>.<host>.<pid>.llm3d (TensorBoard reads any name holding
 * "tfevents", in name order, and a step that goes back discards the later steps it has read: a
 * resumed run's file must sort after the earlier run's). So a run that starts in the second of
 * an earlier file (a resume seconds after a stop) waits for the next second; one that finds a
 * file up to 2 s in the future waits too (a clock set back a little); further, it gives up
 * waiting. A name still taken (an earlier process of the same pid) gets .1, .2, ... */
static l3d_status event_path(struct l3d_tfevents *tb, const char *dir) {
    char host[256] = "localhost";
    if (gethostname(host, sizeof host - 1) != 0) strcpy(host, "localhost");
    host[sizeof host - 1] = '\0';
    for (char *c = host; *c; c++)
        if (*c == '/') *c = '_';
    long long latest = latest_seconds(dir), secs;
    while ((secs = (long long)time(NULL)) <= latest && latest - secs <= 2)
        nanosleep(&(struct timespec){.tv_nsec = 20000000}, NULL);
    for (int i = 0; i < 1000; i++) {
        char suffix[16] = "";
        if (i) snprintf(suffix, sizeof suffix, ".%d", i);
        int w = snprintf(tb->path, sizeof tb->path, "%s/events.out.tfevents.%010lld.%s.%d.llm3d%s",
                         dir, secs, host, (int)getpid(), suffix);
        if (w < 0 || w >= (int)sizeof tb->path)
            return l3d_error(L3D_ERR_ARG, "--tensorboard path too long: %s", dir);
        struct stat sb;
        if (lstat(tb->path, &sb) != 0 && errno == ENOENT) return L3D_OK;
    }
    return l3d_error(L3D_ERR_IO, "--tensorboard %s: no free event file name (%s)", dir, tb->path);
}

l3d_status l3d_tfevents_open(struct l3d_tfevents *tb, const char *dir) {
    tb->f = NULL;
    tb->path[0] = '\0';
    struct stat sb;
    if (stat(dir, &sb) == 0 && !S_ISDIR(sb.st_mode))
        return l3d_error(L3D_ERR_IO, "--tensorboard %s exists and is not a directory: give a "
                         "directory (it is created when missing)", dir);
    l3d_status st = l3d_mkdir_p(dir);
    if (st != L3D_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", l3d_error_message());
        return l3d_error(st, "--tensorboard: %s", why);
    }
    st = event_path(tb, dir);
    if (st == L3D_OK) st = l3d_open_log(tb->path, "TensorBoard event file", false, &tb->f);
    if (st == L3D_OK) st = write_event(tb, 0, "brain.Event:2", NULL, 0);
    if (st != L3D_OK) l3d_tfevents_close(tb);
    return st;
}

l3d_status l3d_tfevents_write(const struct l3d_tfevents *tb, int64_t step,
                              const struct l3d_tfevents_scalar *v, int n) {
    return write_event(tb, step, NULL, v, n);
}

void l3d_tfevents_close(struct l3d_tfevents *tb) {
    if (tb->f) fclose(tb->f);
    tb->f = NULL;
}
