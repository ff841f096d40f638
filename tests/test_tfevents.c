/* TensorBoard event files (include/llm3d/tfevents.h): CRC-32C against published vectors, the
 * varint and Event encoders against bytes worked out by hand from the protobuf encoding rules,
 * the TFRecord frame, and the file: created in a missing directory, refused over a file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "llm3d/tfevents.h"
#include "test.h"

static void test_crc32c(void) {
    uint8_t zeros[32] = {0}, ones[32], inc[32];
    memset(ones, 0xff, sizeof ones);
    for (int i = 0; i < 32; i++) inc[i] = (uint8_t)i;
    CHECK(l3d_crc32c(0, "123456789", 9) == 0xE3069283u); /* the CRC catalogue's check value */
    CHECK(l3d_crc32c(0, "", 0) == 0);
    /* RFC 3720 (iSCSI) appendix B.4 */
    CHECK(l3d_crc32c(0, zeros, 32) == 0x8A9136AAu);
    CHECK(l3d_crc32c(0, ones, 32) == 0x62A8AB43u);
    CHECK(l3d_crc32c(0, inc, 32) == 0x46DD794Eu);
    /* continued over pieces: the same as in one call */
    CHECK(l3d_crc32c(l3d_crc32c(0, "1234", 4), "56789", 5) == 0xE3069283u);
    /* negative: one bit flipped changes it */
    CHECK(l3d_crc32c(0, "123456788", 9) != 0xE3069283u);
    CHECK(l3d_tfrecord_mask(0) == 0xa282ead8u);
    CHECK(l3d_tfrecord_mask(0xE3069283u) == 0xc78ab0e5u);
}

static bool bytes_are(const uint8_t *got, size_t n, const uint8_t *want, size_t wn) {
    if (n != wn || memcmp(got, want, n) != 0) {
        fprintf(stderr, "  got   ");
        for (size_t i = 0; i < n; i++) fprintf(stderr, " %02x", got[i]);
        fprintf(stderr, "\n  wanted");
        for (size_t i = 0; i < wn; i++) fprintf(stderr, " %02x", want[i]);
        fprintf(stderr, "\n");
        return false;
    }
    return true;
}

static void test_varint(void) {
    static const struct {
        uint64_t v;
        uint8_t b[10];
        size_t n;
    } cases[] = {
        {0, {0x00}, 1},
        {1, {0x01}, 1},
        {127, {0x7f}, 1},
        {128, {0x80, 0x01}, 2},
        {150, {0x96, 0x01}, 2}, /* the protobuf encoding guide's example */
        {300, {0xac, 0x02}, 2},
        {16384, {0x80, 0x80, 0x01}, 3},
        {UINT64_MAX, {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, 10},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint8_t buf[10];
        size_t n = l3d_pb_varint(buf, cases[i].v);
        CHECK(bytes_are(buf, n, cases[i].b, cases[i].n));
    }
}

static void test_event(void) {
    /* wall_time 1.5, step 150, one scalar "a" = 2: field 1 fixed64 (key 0x09), field 2 varint
     * (0x10), field 5 length-delimited (0x2a) holding a Summary whose field 1 (0x0a) holds the
     * Value: tag field 1 (0x0a) "a", simple_value field 2 fixed32 (0x15) */
    static const uint8_t want[] = {0x09, 0, 0, 0, 0, 0, 0, 0xf8, 0x3f, 0x10, 0x96, 0x01,
                                   0x2a, 0x0a, 0x0a, 0x08, 0x0a, 0x01, 'a',
                                   0x15, 0x00, 0x00, 0x00, 0x40};
    struct l3d_tfevents_scalar v = {"a", 2.0f};
    uint8_t buf[256];
    size_t n = l3d_tfevents_event(buf, sizeof buf, 1.5, 150, NULL, &v, 1);
    CHECK(bytes_are(buf, n, want, sizeof want));
    CHECK(l3d_tfevents_event(buf, sizeof want - 1, 1.5, 150, NULL, &v, 1) == 0); /* too small */
    /* the first record: file_version (field 3, 0x1a), no summary */
    static const uint8_t first[] = {0x09, 0, 0, 0, 0, 0, 0, 0, 0, 0x10, 0x00, 0x1a, 13,
                                    'b', 'r', 'a', 'i', 'n', '.', 'E', 'v', 'e', 'n', 't', ':',
                                    '2'};
    n = l3d_tfevents_event(buf, sizeof buf, 0.0, 0, "brain.Event:2", NULL, 0);
    CHECK(bytes_are(buf, n, first, sizeof first));
    /* the frame of "abc": length 3, masked CRCs computed by tests/cli/tfevents_read.py */
    static const uint8_t rec[] = {3, 0, 0, 0, 0, 0, 0, 0, 0xb0, 0x99, 0x49, 0x0e, 'a', 'b', 'c',
                                  0x6e, 0x57, 0xf1, 0x21};
    n = l3d_tfrecord_frame(buf, sizeof buf, (const uint8_t *)"abc", 3);
    CHECK(bytes_are(buf, n, rec, sizeof rec));
}

static void test_file(void) {
    char scratch[256], dir[300], file[300];
    snprintf(scratch, sizeof scratch, "%s/l3d-test-tfevents-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    L3D_ASSERT(mkdtemp(scratch));
    snprintf(dir, sizeof dir, "%s/a/b", scratch); /* missing: created */
    struct l3d_tfevents tb;
    CHECK(l3d_tfevents_open(&tb, dir) == L3D_OK);
    struct l3d_tfevents_scalar v[2] = {{"train/loss", 3.25f}, {"train/lr", 6e-4f}};
    CHECK(l3d_tfevents_write(&tb, 1, v, 2) == L3D_OK);
    CHECK(strncmp(tb.path, dir, strlen(dir)) == 0 &&
          strstr(tb.path, "/events.out.tfevents.") != NULL);
    struct stat sb;
    /* the first record (12 + 26 + 4 bytes with a wall time) and the step's, flushed */
    CHECK(stat(tb.path, &sb) == 0 && sb.st_size > 42);
    l3d_tfevents_close(&tb);
    CHECK(tb.f == NULL);
    /* a second writer (a resumed run, here within the same second): a file of its own that
     * TensorBoard reads after the first (name order) */
    struct l3d_tfevents tb2;
    CHECK(l3d_tfevents_open(&tb2, dir) == L3D_OK && strcmp(tb2.path, tb.path) > 0);
    l3d_tfevents_close(&tb2);
    /* negative: a file where the directory belongs */
    snprintf(file, sizeof file, "%s/plain", scratch);
    FILE *f = fopen(file, "w");
    L3D_ASSERT(f && fclose(f) == 0);
    CHECK(l3d_tfevents_open(&tb, file) == L3D_ERR_IO && tb.f == NULL);
    CHECK(strstr(l3d_error_message(), "not a directory") != NULL);
    CHECK(l3d_remove_tree(scratch));
}

int main(void) {
    test_crc32c();
    test_varint();
    test_event();
    test_file();
    return TEST_REPORT();
}
