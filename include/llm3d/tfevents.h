/*
 * TensorBoard event files (`llm3d train --tensorboard DIR`), written by llm3d itself: no
 * TensorFlow, no protobuf library, no new dependency (docs/DESIGN.md "TensorBoard event files").
 *
 *   struct l3d_tfevents tb;
 *   if (l3d_tfevents_open(&tb, "runs/a") != L3D_OK) return error; // creates runs/a if missing
 *   struct l3d_tfevents_scalar v[] = {{"train/loss", 3.25f}, {"train/lr", 6e-4f}};
 *   st = l3d_tfevents_write(&tb, 12, v, 2);   // one Event record at step 12, flushed
 *   l3d_tfevents_close(&tb);
 *
 * The file, DIR/events.out.tfevents.<unix seconds>.<hostname>.<pid>.llm3d, is a sequence of
 * TFRecord records (TensorFlow's core/lib/io/record_writer.cc):
 *
 *   uint64 length (LE) | uint32 masked crc32c(length) | data | uint32 masked crc32c(data)
 *
 * masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8, crc32c the Castagnoli CRC (reflected
 * polynomial 0x82F63B78). Each record's data is a serialized tensorflow.Event
 * (core/util/event.proto): wall_time (1, double), step (2, int64), file_version (3, string,
 * "brain.Event:2" in the first record alone) or summary (5, a tensorflow.Summary of
 * core/framework/summary.proto: repeated value (1) = {tag (1, string), simple_value (2, float)}).
 * The file is an append-only log (l3d_open_log), every record flushed as it is written, so
 * TensorBoard shows a run while it trains; a resumed run writes a new file in the same DIR, and
 * TensorBoard merges them (a step that goes back discards what the older file had from there on).
 */
#ifndef LLM3D_TFEVENTS_H
#define LLM3D_TFEVENTS_H

#include <stdint.h>
#include <stdio.h>

#include "llm3d/core.h"
#include "llm3d/file.h"

struct l3d_tfevents {
    FILE *f;
    char path[L3D_FILE_PATH_CAP];
};

struct l3d_tfevents_scalar {
    const char *tag;   /* "train/loss": at most L3D_TFEVENTS_TAG_MAX bytes */
    float value;       /* NaN and infinities are written as they are (TensorBoard shows them) */
};
#define L3D_TFEVENTS_TAG_MAX 200
#define L3D_TFEVENTS_MAX_SCALARS 16

/* Creates dir when missing (L3D_ERR_IO when it is a file, or cannot be made) and a new event file
 * in it, whose first record carries the file version. */
l3d_status l3d_tfevents_open(struct l3d_tfevents *tb, const char *dir);
/* One Event at `step` (wall time now) with n scalars (at most L3D_TFEVENTS_MAX_SCALARS), written
 * whole and flushed; L3D_ERR_IO naming the file and errno when it cannot be (the part written is
 * truncated away: the file ends with its last complete record). */
l3d_status l3d_tfevents_write(const struct l3d_tfevents *tb, int64_t step,
                              const struct l3d_tfevents_scalar *v, int n);
void l3d_tfevents_close(struct l3d_tfevents *tb);

/* ---- the encoders (exposed for tests) ---------------------------------------------------- */

/* CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) of n bytes, continuing crc (0 to start):
 * l3d_crc32c(0, "123456789", 9) == 0xE3069283. */
uint32_t l3d_crc32c(uint32_t crc, const void *data, size_t n);
/* TFRecord's masked CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8. */
uint32_t l3d_tfrecord_mask(uint32_t crc);
/* v as a protobuf base-128 varint (7 bits a byte, low first, the high bit set on all bytes but
 * the last) into buf (room for 10 bytes); returns the bytes written (1 to 10). */
size_t l3d_pb_varint(uint8_t *buf, uint64_t v);
/* The Event (file_version: NULL for none; then the n scalars as a summary, none when n == 0)
 * serialized into buf; returns its length, 0 when cap is too small. */
size_t l3d_tfevents_event(uint8_t *buf, size_t cap, double wall_time, int64_t step,
                          const char *file_version, const struct l3d_tfevents_scalar *v, int n);
/* data framed as one TFRecord into buf (cap >= n + 16); returns n + 16. */
size_t l3d_tfrecord_frame(uint8_t *buf, size_t cap, const uint8_t *data, size_t n);

#endif
