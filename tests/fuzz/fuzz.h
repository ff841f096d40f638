/*
 * Shared by the libFuzzer targets (tests/fuzz/fuzz_*.c): each calls the real parser of one kind of
 * input on the bytes libFuzzer gives it, through a file in a scratch directory where the parser
 * takes a path. A crash, a sanitizer report, a leak or a hang is a finding; an error status is
 * the expected answer to most inputs. See tests/fuzz/README.md.
 */
#ifndef L3D_FUZZ_H
#define L3D_FUZZ_H

#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "llm3d/core.h"
#include "llm3d/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A scratch directory of this process, made once (removed by run.sh's scratch directory). */
static inline const char *fuzz_dir(void) {
    static char dir[256];
    if (!dir[0]) {
        const char *base = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/l3d-fuzz-XXXXXX", base && *base ? base : "/tmp");
        if (!mkdtemp(dir)) {
            perror("fuzz: mkdtemp");
            abort();
        }
    }
    return dir;
}

/* dir/name holding data[0..size): the path (static storage, one per name slot). */
static inline const char *fuzz_file(const char *name, const uint8_t *data, size_t size) {
    static char path[4][512];
    static int slot;
    char *p = path[slot++ & 3];
    snprintf(p, 512, "%s/%s", fuzz_dir(), name);
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) {
        perror("fuzz: open");
        abort();
    }
    for (size_t done = 0; done < size;) {
        ssize_t k = write(fd, data + done, size - done);
        if (k <= 0) {
            perror("fuzz: write");
            abort();
        }
        done += (size_t)k;
    }
    close(fd);
    return p;
}

/* A NUL-terminated copy (l3d_free it). */
static inline char *fuzz_text(const uint8_t *data, size_t size) {
    char *t = l3d_alloc(size + 1, "fuzz input");
    memcpy(t, data, size);
    t[size] = '\0';
    return t;
}

/* A file of the source tree's tests/fuzz/data read whole (malloc'd, NUL-terminated). */
static inline char *fuzz_data_file(const char *name, size_t *len) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", L3D_FUZZ_DATA, name);
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "fuzz: cannot open %s\n", path);
        abort();
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (!b || fread(b, 1, (size_t)n, f) != (size_t)n) abort();
    b[n] = '\0';
    fclose(f);
    *len = (size_t)n;
    return b;
}

/* Each of the first `max` token ids of t (all of them for max < 0) gives its bytes (a token of
 * n > 0 bytes has them): abort() otherwise. */
static inline void fuzz_tokens(const struct l3d_tokenizer *t, int max) {
    int V = l3d_tokenizer_vocab_size(t);
    for (int id = 0; id < V && (max < 0 || id < max); id++) {
        size_t n = 0;
        if (!l3d_tokenizer_token(t, id, &n) && n) abort();
    }
}

#endif
