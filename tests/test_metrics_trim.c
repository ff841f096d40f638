/*
 * metrics.jsonl on --resume (l3d_ckpt_trim_metrics, src/ckpt/fileio.c): the run record and the
 * step lines up to the checkpoint's step stay, in order; every other line goes: later steps, a
 * last line without its newline, and lines that are not one JSON object even when they hold
 * "step": a write cut short that the next write ran into, bytes of a damaged file. A missing
 * file is no error.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "llm3d/ckpt.h"
#include "test.h"

static const char *run_line = "{\"run\":\"0123456789abcdef\",\"model\":{\"L\":2,\"C\":64}}\n";

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

static char *read_file(const char *path) {
    static char buf[4096];
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

/* path trimmed to step gives want */
static void trimmed(const char *path, const char *text, int64_t step, const char *want) {
    write_file(path, text);
    CHECK(l3d_ckpt_trim_metrics(path, step) == L3D_OK);
    const char *got = read_file(path);
    bool same = got && strcmp(got, want) == 0;
    CHECK(same);
    if (!same) fprintf(stderr, "step %lld: kept\n%s\nwanted\n%s\n", (long long)step, got, want);
}

int main(void) {
    char dir[] = "/tmp/l3d_metrics_trim_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[256];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);

    /* a missing file: nothing to trim */
    CHECK(l3d_ckpt_trim_metrics(path, 3) == L3D_OK);

    char text[2048], want[1024];
    snprintf(text, sizeof text,
             "%s"
             "{\"step\":1,\"loss\":5.5}\n"
             "{\"step\":2,\"loss\":5.0,\"lr\":2e-4,\"grad_n{\"step\":2,\"loss\":5.0}\n" /* cut */
             "{\"step\":2,\"loss\":5.0}\n"
             "{\"step\":3,\"loss\":4.25,\"val_loss\":4.5}\n"
             "\"step\":3 is no object\n"
             "{\"step\":3,\"loss\":}\n" /* not JSON */
             "[{\"step\":1}]\n"         /* not an object */
             "{\"step\":\"3\",\"loss\":4.0}\n" /* a step that is no integer */
             "{\"step\":4,\"loss\":4.0}\n"     /* after the checkpoint */
             "{\"step\":5,\"lo",                /* no newline */
             run_line);
    snprintf(want, sizeof want,
             "%s"
             "{\"step\":1,\"loss\":5.5}\n"
             "{\"step\":2,\"loss\":5.0}\n"
             "{\"step\":3,\"loss\":4.25,\"val_loss\":4.5}\n",
             run_line);
    trimmed(path, text, 3, want);
    /* trimmed again: nothing more goes; to step 1: the run record and step 1 */
    trimmed(path, want, 3, want);
    snprintf(want, sizeof want, "%s{\"step\":1,\"loss\":5.5}\n", run_line);
    trimmed(path, text, 1, want);
    /* a run record cut short, and a line with neither step nor run, go too */
    trimmed(path, "{\"run\":\"01234\n{\"loss\":1}\n{\"step\":1,\"loss\":5.5}\n", 1,
            "{\"step\":1,\"loss\":5.5}\n");

    unlink(path);
    rmdir(dir);
    return TEST_REPORT();
}
