/* Token shards, the batch loader and byte-level preparation: round trips, every malformed-file
 * error, the window stream, DP slicing and resume. */
#include <ftw.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "llm3d/data.h"
#include "test.h"

static char tmpdir[] = "/tmp/l3d_test_data_XXXXXX";

static char *tpath(const char *name) {
    static char buf[8][512];
    static int next;
    char *p = buf[next++ % 8];
    snprintf(p, 512, "%s/%s", tmpdir, name);
    return p;
}

static void write_raw(const char *path, const void *bytes, size_t n) {
    FILE *fp = fopen(path, "wb");
    CHECK(fp != NULL);
    if (!fp) return;
    CHECK(fwrite(bytes, 1, n, fp) == n);
    fclose(fp);
}

static bool contains(const char *hay, const char *needle) { return strstr(hay, needle) != NULL; }

/* The message of the last error contains each of the given strings (NULL-terminated). */
static bool msg_has(const char *a, const char *b, const char *c) {
    const char *m = l3d_error_message();
    bool ok = contains(m, a) && (!b || contains(m, b)) && (!c || contains(m, c));
    if (!ok) fprintf(stderr, "  message was: %s\n", m);
    return ok;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

/* ---- shards ---------------------------------------------------------------------------------- */

static void test_round_trip(void) {
    uint16_t tok[1000];
    for (int i = 0; i < 1000; i++) tok[i] = (uint16_t)(i * 61 % 50257);
    CHECK(l3d_shard_write(tpath("rt.bin"), tok, 1000) == L3D_OK);
    CHECK(access(tpath("rt.bin.tmp"), F_OK) != 0); /* the temporary is gone */
    struct l3d_data *d;
    CHECK(l3d_data_open(&d, tpath("rt.bin"), 50257) == L3D_OK);
    if (!d) return;
    CHECK(l3d_data_num_files(d) == 1);
    CHECK(l3d_data_num_tokens(d) == 1000);
    int64_t n;
    const uint16_t *got = l3d_data_file_tokens(d, 0, &n);
    CHECK(n == 1000 && memcmp(got, tok, sizeof tok) == 0);
    CHECK(strcmp(l3d_data_file_path(d, 0), tpath("rt.bin")) == 0);
    l3d_data_free(d);

    /* The header is llm.c's: magic, version, count, zeros; the file is exactly 1024 + 2n bytes. */
    FILE *fp = fopen(tpath("rt.bin"), "rb");
    int32_t h[256];
    CHECK(fp && fread(h, 4, 256, fp) == 256);
    CHECK(h[0] == 20240520 && h[1] == 1 && h[2] == 1000 && h[3] == 0 && h[255] == 0);
    if (fp) fclose(fp);
    struct stat sb;
    CHECK(stat(tpath("rt.bin"), &sb) == 0 && sb.st_size == 1024 + 2000);

    /* Overwriting replaces the file. */
    CHECK(l3d_shard_write(tpath("rt.bin"), tok + 10, 5) == L3D_OK);
    CHECK(l3d_data_open(&d, tpath("rt.bin"), 50257) == L3D_OK);
    if (d) {
        got = l3d_data_file_tokens(d, 0, &n);
        CHECK(n == 5 && got[0] == tok[10] && got[4] == tok[14]);
        l3d_data_free(d);
    }
}

static void test_glob(void) {
    mkdir(tpath("g"), 0755);
    uint16_t tok[300];
    for (int f = 0; f < 3; f++) {
        for (int i = 0; i < 300; i++) tok[i] = (uint16_t)(f * 1000 + i);
        char name[64];
        snprintf(name, sizeof name, "g/shard_%d.bin", 2 - f); /* written out of order */
        CHECK(l3d_shard_write(tpath(name), tok, 100 + 100 * f) == L3D_OK);
    }
    struct l3d_data *d;
    CHECK(l3d_data_open(&d, tpath("g/shard_*.bin"), 50257) == L3D_OK);
    if (!d) return;
    CHECK(l3d_data_num_files(d) == 3);
    CHECK(l3d_data_num_tokens(d) == 600);
    for (int i = 0; i < 3; i++) { /* sorted by name: shard_0 holds f=2 */
        int64_t n;
        const uint16_t *t = l3d_data_file_tokens(d, i, &n);
        int f = 2 - i;
        CHECK(n == 100 + 100 * f && t[0] == f * 1000 && t[n - 1] == f * 1000 + n - 1);
        char name[64];
        snprintf(name, sizeof name, "g/shard_%d.bin", i);
        CHECK(strcmp(l3d_data_file_path(d, i), tpath(name)) == 0);
    }
    l3d_data_free(d);
}

/* A shard file with the given header and n tokens of value v, then extra raw bytes removed/added. */
static void write_shard_raw(const char *path, int32_t magic, int32_t version, int32_t count,
                            int64_t ntok, uint16_t v, int64_t bad_at, uint16_t bad) {
    size_t bytes = 1024 + 2 * (size_t)ntok;
    unsigned char *buf = calloc(1, bytes);
    int32_t h[3] = {magic, version, count};
    memcpy(buf, h, sizeof h);
    uint16_t *t = (uint16_t *)(buf + 1024);
    for (int64_t i = 0; i < ntok; i++) t[i] = i == bad_at ? bad : v;
    write_raw(path, buf, bytes);
    free(buf);
}

static void test_errors(void) {
    size_t base = l3d_mem_used();
    struct l3d_data *d = (struct l3d_data *)&d;
    const char *p;

    p = tpath("missing.bin");
    CHECK(l3d_data_open(&d, p, 256) == L3D_ERR_IO && d == NULL);
    CHECK(msg_has(p, "No such file", NULL));

    p = tpath("short.bin");
    write_raw(p, "abcdefgh", 8);
    CHECK(l3d_data_open(&d, p, 256) == L3D_ERR_FORMAT && d == NULL);
    CHECK(msg_has(p, "8 bytes", "header"));

    p = tpath("magic.bin");
    write_shard_raw(p, 12345, 1, 10, 10, 1, -1, 0);
    CHECK(l3d_data_open(&d, p, 256) == L3D_ERR_FORMAT);
    CHECK(msg_has(p, "12345", "20240520"));
    CHECK(msg_has("not an llm.c token shard", NULL, NULL));

    p = tpath("version.bin");
    write_shard_raw(p, 20240520, 7, 10, 10, 1, -1, 0);
    CHECK(l3d_data_open(&d, p, 256) == L3D_ERR_FORMAT);
    CHECK(msg_has(p, "version 7", NULL));

    p = tpath("trunc.bin");
    write_shard_raw(p, 20240520, 1, 100, 60, 1, -1, 0);
    CHECK(l3d_data_open(&d, p, 256) == L3D_ERR_FORMAT);
    CHECK(msg_has(p, "truncated", "100 tokens"));
    CHECK(msg_has("1224 bytes", "1144 bytes", NULL));

    p = tpath("long.bin");
    write_shard_raw(p, 20240520, 1, 50, 60, 1, -1, 0);
    CHECK(l3d_data_open(&d, p, 256) == L3D_ERR_FORMAT);
    CHECK(msg_has(p, "20 bytes after", NULL));

    p = tpath("vocab.bin");
    write_shard_raw(p, 20240520, 1, 100, 100, 5, 37, 300);
    CHECK(l3d_data_open(&d, p, 256) == L3D_ERR_FORMAT);
    CHECK(msg_has(p, "token 300", "byte offset 1098")); /* 1024 + 2*37 */
    CHECK(msg_has("vocabulary of 256", "--vocab", NULL));
    CHECK(l3d_data_open(&d, p, 301) == L3D_OK); /* inside a larger vocabulary */
    l3d_data_free(d);
    CHECK(l3d_data_open(&d, p, 0) == L3D_OK); /* 0: no range check */
    l3d_data_free(d);

    p = tpath("one.bin");
    write_shard_raw(p, 20240520, 1, 1, 1, 1, -1, 0);
    CHECK(l3d_data_open(&d, p, 256) == L3D_ERR_FORMAT);
    CHECK(msg_has(p, "1 token", "at least 2"));

    p = tpath("nomatch_*.bin");
    CHECK(l3d_data_open(&d, p, 256) == L3D_ERR_IO && d == NULL);
    CHECK(msg_has(p, "no file matches", NULL));

    /* One bad file among good ones: the error names it and nothing leaks. */
    mkdir(tpath("mix"), 0755);
    uint16_t tok[64] = {0};
    CHECK(l3d_shard_write(tpath("mix/a.bin"), tok, 64) == L3D_OK);
    write_shard_raw(tpath("mix/b.bin"), 20240520, 1, 100, 99, 1, -1, 0);
    CHECK(l3d_shard_write(tpath("mix/c.bin"), tok, 64) == L3D_OK);
    CHECK(l3d_data_open(&d, tpath("mix/*.bin"), 256) == L3D_ERR_FORMAT && d == NULL);
    CHECK(msg_has(tpath("mix/b.bin"), "truncated", NULL));

    /* Writer errors. */
    p = tpath("nodir/x.bin");
    CHECK(l3d_shard_write(p, tok, 4) == L3D_ERR_IO);
    CHECK(msg_has(p, "No such file", NULL));
    CHECK(l3d_shard_write(tpath("neg.bin"), tok, -1) == L3D_ERR_ARG);
    CHECK(msg_has(tpath("neg.bin"), "-1", NULL));

    CHECK(l3d_mem_used() == base);
}

/* ---- loader ---------------------------------------------------------------------------------- */

/* Three files of 50, 37 and 64 tokens, token = file*1000 + position: with T = 8 they hold 6, 4 and
 * 7 windows, W = 17. */
static const int64_t file_len[3] = {50, 37, 64};
static struct l3d_data *loader_data(void) {
    mkdir(tpath("ld"), 0755);
    uint16_t tok[64];
    for (int f = 0; f < 3; f++) {
        for (int i = 0; i < 64; i++) tok[i] = (uint16_t)(f * 1000 + i);
        char name[64];
        snprintf(name, sizeof name, "ld/s%d.bin", f);
        CHECK(l3d_shard_write(tpath(name), tok, file_len[f]) == L3D_OK);
    }
    struct l3d_data *d = NULL;
    CHECK(l3d_data_open(&d, tpath("ld/s*.bin"), 50257) == L3D_OK);
    return d;
}

/* Window number of one row: checks it is a valid window (one file, start a multiple of T, T+1
 * tokens inside the file, targets shifted by one) and returns its global number, or -1. */
static int64_t window_of(const int32_t *inp, const int32_t *tgt, int64_t T) {
    int f = inp[0] / 1000, s = inp[0] % 1000;
    if (f < 0 || f > 2 || s % T != 0 || s + T + 1 > file_len[f]) return -1;
    for (int64_t t = 0; t < T; t++)
        if (inp[t] != f * 1000 + s + t || tgt[t] != inp[t] + 1) return -1;
    int64_t w = s / T;
    for (int g = 0; g < f; g++) w += (file_len[g] - 1) / T;
    return w;
}

static struct l3d_loader *make_loader(struct l3d_data *d, int64_t B, int64_t T, bool random,
                                      uint64_t seed, int rank, int size) {
    struct l3d_loader_config cfg = {.B = B, .T = T, .random = random, .seed = seed,
                                    .dp_rank = rank, .dp_size = size};
    struct l3d_loader *ld = NULL;
    CHECK(l3d_loader_init(&ld, d, &cfg) == L3D_OK);
    return ld;
}

/* The window numbers of the next nbatch batches, B each, into w (nbatch*B). */
static void stream(struct l3d_loader *ld, int64_t B, int64_t T, int nbatch, int64_t *w) {
    int32_t inp[64 * 16], tgt[64 * 16];
    for (int k = 0; k < nbatch; k++) {
        l3d_loader_next(ld, inp, tgt);
        for (int64_t b = 0; b < B; b++) w[k * B + b] = window_of(inp + b * T, tgt + b * T, T);
    }
}

static void test_loader_sequential(struct l3d_data *d) {
    const int64_t T = 8, B = 3, W = 17;
    struct l3d_loader *ld = make_loader(d, B, T, false, 0, 0, 1);
    if (!ld) return;
    CHECK(l3d_loader_num_windows(ld) == W);
    int32_t inp[B * T], tgt[B * T];
    size_t used = l3d_mem_used();
    l3d_loader_next(ld, inp, tgt);
    /* First batch: file 0 at 0, 8, 16. */
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++) {
            CHECK(inp[b * T + t] == b * T + t);
            CHECK(tgt[b * T + t] == b * T + t + 1);
        }
    /* Then the stream is windows 3, 4, ... 14, and again 0, 1, ... 14: through every file; a
     * batch never straddles two epochs, so windows 15 and 16 (fewer than B = 3) are skipped, as
     * llm.c's loader skips the tail of a shard shorter than a batch. */
    int64_t w[30 * B];
    stream(ld, B, T, 30, w);
    bool ok = true;
    for (int64_t i = 0; i < 30 * B; i++) ok &= w[i] == ((1 + i / B) % 5) * B + i % B;
    CHECK(ok);
    CHECK(l3d_mem_used() == used); /* next() never allocates */
    struct l3d_loader_pos pos = l3d_loader_get_pos(ld); /* 31 batches: 6 epochs of 5, then one */
    CHECK(pos.epoch == 6 && pos.index == 3);

    l3d_loader_free(ld);
}

static void test_loader_random(struct l3d_data *d) {
    const int64_t T = 8, W = 17;
    enum { N = 4 * 17 };
    int64_t a[N], b[N], c[N];
    struct l3d_loader *l1 = make_loader(d, 1, T, true, 42, 0, 1);
    struct l3d_loader *l2 = make_loader(d, 1, T, true, 42, 0, 1);
    struct l3d_loader *l3 = make_loader(d, 1, T, true, 43, 0, 1);
    if (!l1 || !l2 || !l3) return;
    stream(l1, 1, T, N, a);
    stream(l2, 1, T, N, b);
    stream(l3, 1, T, N, c);
    CHECK(memcmp(a, b, sizeof a) == 0);  /* same seed, same stream */
    CHECK(memcmp(a, c, sizeof a) != 0);  /* another seed, another */
    for (int e = 0; e < 4; e++) {        /* each epoch is a permutation of the W windows */
        int seen[17] = {0};
        bool ok = true;
        for (int i = 0; i < W; i++) {
            int64_t w = a[e * W + i];
            ok &= w >= 0 && w < W && !seen[w];
            if (w >= 0 && w < W) seen[w] = 1;
        }
        CHECK(ok);
    }
    CHECK(memcmp(a, a + W, W * sizeof *a) != 0); /* reshuffled per epoch */
    bool sequential = true;
    for (int i = 0; i < W; i++) sequential &= a[i] == i;
    CHECK(!sequential);
    l3d_loader_free(l1);
    l3d_loader_free(l2);
    l3d_loader_free(l3);
}

/* dp_size = 2 with B = 2: the two ranks' batches, rank 0's rows then rank 1's, are the batch of
 * dp_size = 1 with B = 4, through several epochs (17 windows is not a multiple of 4). */
static void test_loader_dp(struct l3d_data *d, bool random) {
    const int64_t T = 8;
    struct l3d_loader *one = make_loader(d, 4, T, random, 7, 0, 1);
    struct l3d_loader *r0 = make_loader(d, 2, T, random, 7, 0, 2);
    struct l3d_loader *r1 = make_loader(d, 2, T, random, 7, 1, 2);
    if (!one || !r0 || !r1) return;
    int32_t in1[4 * T], tg1[4 * T], in2[4 * T], tg2[4 * T];
    bool ok = true;
    for (int k = 0; k < 20; k++) {
        l3d_loader_next(one, in1, tg1);
        l3d_loader_next(r0, in2, tg2);
        l3d_loader_next(r1, in2 + 2 * T, tg2 + 2 * T);
        ok &= memcmp(in1, in2, sizeof in1) == 0 && memcmp(tg1, tg2, sizeof tg1) == 0;
        struct l3d_loader_pos p1 = l3d_loader_get_pos(one), p0 = l3d_loader_get_pos(r0);
        ok &= p1.epoch == p0.epoch && p1.index == p0.index;
    }
    CHECK(ok);
    l3d_loader_free(one);
    l3d_loader_free(r0);
    l3d_loader_free(r1);
}

static void test_loader_resume(struct l3d_data *d) {
    const int64_t T = 8, B = 3;
    for (int random = 0; random < 2; random++) {
        struct l3d_loader *a = make_loader(d, B, T, random, 5, 0, 1);
        if (!a) return;
        int64_t skip[7 * B], wa[20 * B], wb[20 * B];
        stream(a, B, T, 7, skip); /* 5 batches of epoch 0 (15 of 17 windows), 2 of epoch 1 */
        struct l3d_loader_pos pos = l3d_loader_get_pos(a);
        CHECK(pos.epoch == 1 && pos.index == 6);
        stream(a, B, T, 20, wa);
        struct l3d_loader *b = make_loader(d, B, T, random, 5, 0, 1);
        if (!b) return;
        CHECK(l3d_loader_set_pos(b, pos) == L3D_OK);
        stream(b, B, T, 20, wb);
        CHECK(memcmp(wa, wb, sizeof wa) == 0);
        /* Back to the start of the stream. */
        CHECK(l3d_loader_set_pos(b, (struct l3d_loader_pos){0, 0}) == L3D_OK);
        stream(b, B, T, 7, wb);
        CHECK(memcmp(skip, wb, sizeof skip) == 0);
        CHECK(l3d_loader_set_pos(b, (struct l3d_loader_pos){0, 17}) == L3D_ERR_ARG);
        CHECK(msg_has("17", "windows", NULL));
        CHECK(l3d_loader_set_pos(b, (struct l3d_loader_pos){-1, 0}) == L3D_ERR_ARG);
        l3d_loader_free(a);
        l3d_loader_free(b);
    }
}

static void test_loader_errors(struct l3d_data *d) {
    size_t base = l3d_mem_used();
    struct l3d_loader *ld = NULL;
    struct l3d_loader_config cfg = {.B = 9, .T = 8, .dp_rank = 0, .dp_size = 2}; /* 18 > 17 */
    CHECK(l3d_loader_init(&ld, d, &cfg) == L3D_ERR_ARG && ld == NULL);
    CHECK(msg_has("17 window", "145 tokens", "151 tokens")); /* 18*8+1 needed, 151 held */
    cfg = (struct l3d_loader_config){.B = 1, .T = 100, .dp_size = 1}; /* no file holds 101 */
    CHECK(l3d_loader_init(&ld, d, &cfg) == L3D_ERR_ARG && ld == NULL);
    CHECK(msg_has("0 window", "101 tokens", NULL));
    cfg = (struct l3d_loader_config){.B = 1, .T = 8, .dp_rank = 2, .dp_size = 2};
    CHECK(l3d_loader_init(&ld, d, &cfg) == L3D_ERR_ARG);
    cfg = (struct l3d_loader_config){.B = 0, .T = 8, .dp_size = 1};
    CHECK(l3d_loader_init(&ld, d, &cfg) == L3D_ERR_ARG);
    /* Exactly one global batch is enough, and it wraps onto itself. */
    cfg = (struct l3d_loader_config){.B = 17, .T = 8, .random = true, .seed = 1, .dp_size = 1};
    CHECK(l3d_loader_init(&ld, d, &cfg) == L3D_OK);
    l3d_loader_free(ld);
    CHECK(l3d_mem_used() == base);
}

/* ---- preparation ----------------------------------------------------------------------------- */

static void test_prepare(void) {
    /* Two text files of 700 and 333 bytes, all byte values 1..255. */
    static char text[1033];
    for (int i = 0; i < 1033; i++) text[i] = (char)(1 + (i * 7) % 255);
    write_raw(tpath("a.txt"), text, 700);
    write_raw(tpath("b.txt"), text + 700, 333);
    char fa[512], fb[512]; /* tpath's buffers rotate: keep the names */
    snprintf(fa, sizeof fa, "%s", tpath("a.txt"));
    snprintf(fb, sizeof fb, "%s", tpath("b.txt"));
    char *files[2] = {fa, fb};
    char out[512];
    snprintf(out, sizeof out, "%s", tpath("prep/deep"));
    struct l3d_prepare_stats stats;
    CHECK(l3d_prepare_bytes(out, files, 2, 0.1, 100, &stats) == L3D_OK);
    /* 103 val tokens (10%, rounded) in 2 shards; 930 train tokens in 10 shards of 93. */
    CHECK(stats.files == 2 && stats.tokens == 1033);
    CHECK(stats.val_tokens == 103 && stats.train_tokens == 930);
    CHECK(stats.train_shards == 10 && stats.val_shards == 2 && stats.stale_removed == 0);

    char pat[600];
    struct l3d_data *tr = NULL, *va = NULL;
    snprintf(pat, sizeof pat, "%s/train_*.bin", out);
    CHECK(l3d_data_open(&tr, pat, 256) == L3D_OK);
    snprintf(pat, sizeof pat, "%s/val_*.bin", out);
    CHECK(l3d_data_open(&va, pat, 256) == L3D_OK);
    if (!tr || !va) return;
    CHECK(l3d_data_num_files(tr) == 10 && l3d_data_num_files(va) == 2);
    char back[1033];
    int64_t k = 0;
    bool ok = true;
    for (int s = 0; s < 2; s++) {
        struct l3d_data *d = s ? va : tr;
        for (int f = 0; f < l3d_data_num_files(d); f++) {
            int64_t n;
            const uint16_t *t = l3d_data_file_tokens(d, f, &n);
            ok &= n <= 100 && k + n <= 1033;
            for (int64_t i = 0; i < n && k < 1033; i++) back[k++] = (char)t[i];
        }
    }
    CHECK(ok && k == 1033 && memcmp(back, text, 1033) == 0);
    CHECK(strstr(l3d_data_file_path(tr, 0), "train_000000.bin") != NULL);
    CHECK(strstr(l3d_data_file_path(va, 1), "val_000001.bin") != NULL);
    l3d_data_free(tr);
    l3d_data_free(va);

    /* Again with big shards and no validation: the earlier run's extra shards are deleted. */
    CHECK(l3d_prepare_bytes(out, files, 2, 0.0, 100000, &stats) == L3D_OK);
    CHECK(stats.train_shards == 1 && stats.val_shards == 0 && stats.stale_removed == 11);
    snprintf(pat, sizeof pat, "%s/*.bin", out);
    CHECK(l3d_data_open(&tr, pat, 256) == L3D_OK);
    if (tr) {
        CHECK(l3d_data_num_files(tr) == 1 && l3d_data_num_tokens(tr) == 1033);
        l3d_data_free(tr);
    }

    /* Errors. */
    size_t base = l3d_mem_used();
    write_raw(tpath("bin.txt"), "ab\0cd", 5);
    char *bad[2] = {fa, tpath("bin.txt")};
    CHECK(l3d_prepare_bytes(tpath("p2"), bad, 2, 0.1, 100, NULL) == L3D_ERR_FORMAT);
    CHECK(msg_has(tpath("bin.txt"), "not a text file", "offset 2"));
    CHECK(access(tpath("p2"), F_OK) != 0); /* nothing written */

    char *missing[1] = {tpath("nope.txt")};
    CHECK(l3d_prepare_bytes(tpath("p2"), missing, 1, 0.1, 100, NULL) == L3D_ERR_IO);
    CHECK(msg_has(tpath("nope.txt"), "No such file", NULL));

    write_raw(tpath("empty.txt"), "", 0);
    char *empty[1] = {tpath("empty.txt")};
    CHECK(l3d_prepare_bytes(tpath("p2"), empty, 1, 0.1, 100, NULL) == L3D_ERR_FORMAT);
    CHECK(msg_has("no text", NULL, NULL));

    char *dir[1] = {tmpdir};
    CHECK(l3d_prepare_bytes(tpath("p2"), dir, 1, 0.1, 100, NULL) == L3D_ERR_IO);
    CHECK(msg_has(tmpdir, "directory", NULL));

    /* The output directory cannot be created under a regular file. */
    CHECK(l3d_prepare_bytes(tpath("a.txt/sub"), files, 2, 0.1, 100, NULL) == L3D_ERR_IO);
    CHECK(msg_has(tpath("a.txt/sub"), "output directory", NULL));

    CHECK(l3d_prepare_bytes(tpath("p2"), files, 2, 1.0, 100, NULL) == L3D_ERR_ARG);
    CHECK(l3d_prepare_bytes(tpath("p2"), files, 2, 0.1, 3, NULL) == L3D_ERR_ARG);
    CHECK(l3d_mem_used() == base);
}

/* llm.c's Llama 3 shards: uint32 tokens under magic 20240801 version 7, read as they were written
 * (ids above 65535 too); the wrong version for the magic, or a file of 2-byte tokens under it, is
 * refused. */
static void test_wide(void) {
    uint32_t tok[300];
    for (int i = 0; i < 300; i++) tok[i] = (uint32_t)(i * 431 + 60000) % 128256;
    CHECK(l3d_shard_write32(tpath("w.bin"), tok, 300) == L3D_OK);
    struct l3d_data *d = NULL;
    CHECK(l3d_data_open(&d, tpath("w.bin"), 128256) == L3D_OK);
    if (d) {
        int32_t got[300];
        CHECK(l3d_data_file_wide(d, 0) && l3d_data_file_ntok(d, 0) == 300);
        l3d_data_file_read(d, 0, 0, 300, got);
        int diff = 0;
        for (int i = 0; i < 300; i++) diff += (uint32_t)got[i] != tok[i];
        CHECK(diff == 0);
        l3d_data_free(d);
    }
    struct stat sb;
    CHECK(stat(tpath("w.bin"), &sb) == 0 && sb.st_size == 1024 + 4 * 300);
    CHECK(l3d_data_open(&d, tpath("w.bin"), 60000) == L3D_ERR_FORMAT); /* a token >= V */
    write_shard_raw(tpath("w1.bin"), 20240801, 1, 10, 20, 1, -1, 0);
    CHECK(l3d_data_open(&d, tpath("w1.bin"), 256) == L3D_ERR_FORMAT);
    CHECK(msg_has(tpath("w1.bin"), "version 1", "version 7"));
    write_shard_raw(tpath("w2.bin"), 20240801, 7, 10, 10, 1, -1, 0); /* 10 uint16 = 5 uint32 */
    CHECK(l3d_data_open(&d, tpath("w2.bin"), 256) == L3D_ERR_FORMAT);
    CHECK(msg_has(tpath("w2.bin"), "truncated", "10 tokens"));
}

/* ---- prepare's line reader (src/data/input.c) ----------------------------------------------- */

/* Lines across the 1 MiB chunks, empty ones, a '\r' kept, a last line without '\n', the end
 * given again; a line over the bound is the error naming FILE:LINE, one of exactly the bound not. */
static void test_input_lines(void) {
    size_t big = (size_t)3 << 20;
    char *text = malloc(big + 32);
    CHECK(text != NULL);
    if (!text) return;
    memset(text, 'a', big);
    memcpy(text + big, "\n\nx\r\ntail", 9);
    write_raw(tpath("lines.txt"), text, big + 9);
    free(text);
    struct l3d_input in;
    CHECK(l3d_input_open(&in, tpath("lines.txt")) == L3D_OK);
    CHECK(!in.jsonl && in.comp == L3D_IN_PLAIN);
    size_t want[] = {big, 0, 2, 4}, len;
    const char *line;
    bool eof;
    for (int i = 0; i < 4; i++) {
        CHECK(l3d_input_next_line(&in, (size_t)4 << 20, &line, &len, &eof) == L3D_OK && !eof);
        CHECK(len == want[i] && in.lineno == i + 1);
        if (i == 0) CHECK(line[0] == 'a' && line[big - 1] == 'a');
        if (i == 2) CHECK(memcmp(line, "x\r", 2) == 0);
        if (i == 3) CHECK(memcmp(line, "tail", 4) == 0);
    }
    CHECK(l3d_input_next_line(&in, (size_t)4 << 20, &line, &len, &eof) == L3D_OK && eof);
    CHECK(l3d_input_next_line(&in, (size_t)4 << 20, &line, &len, &eof) == L3D_OK && eof);
    CHECK(in.bytes == (int64_t)big + 9 && in.disk == in.bytes);
    l3d_input_close(&in);
    CHECK(l3d_input_open(&in, tpath("lines.txt")) == L3D_OK);
    CHECK(l3d_input_next_line(&in, (size_t)1 << 20, &line, &len, &eof) == L3D_ERR_FORMAT);
    CHECK(msg_has("lines.txt:1: a line longer than 1048576 bytes", "--max-line", NULL));
    l3d_input_close(&in);
    write_raw(tpath("short.jsonl.zst"), "abc\nde\n", 7);
    bool jsonl;
    enum l3d_input_comp comp;
    l3d_input_type(tpath("short.jsonl.zst"), &jsonl, &comp);
    CHECK(jsonl && comp == L3D_IN_ZSTD);
    l3d_input_type("a.jsonl.txt.gz", &jsonl, &comp);
    CHECK(!jsonl && comp == L3D_IN_GZIP);
    write_raw(tpath("short.jsonl"), "abc\nde\n", 7);
    CHECK(l3d_input_open(&in, tpath("short.jsonl")) == L3D_OK && in.jsonl);
    CHECK(l3d_input_next_line(&in, 3, &line, &len, &eof) == L3D_OK && len == 3); /* at the bound */
    CHECK(l3d_input_next_line(&in, 1, &line, &len, &eof) == L3D_ERR_FORMAT);
    CHECK(msg_has("short.jsonl:2: a line longer than 1 bytes", NULL, NULL));
    l3d_input_close(&in);
}

int main(void) {
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    test_round_trip();
    test_wide();
    test_glob();
    test_errors();
    struct l3d_data *d = loader_data();
    if (d) {
        test_loader_sequential(d);
        test_loader_random(d);
        test_loader_dp(d, false);
        test_loader_dp(d, true);
        test_loader_resume(d);
        test_loader_errors(d);
        l3d_data_free(d);
    }
    test_prepare();
    test_input_lines();
    CHECK(l3d_mem_used() == 0);
    nftw(tmpdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return TEST_REPORT();
}
