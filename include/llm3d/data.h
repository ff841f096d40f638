/*
 * llm3d data: token shards in llm.c's format, the batch loader, and preparation (bytes or BPE).
 *
 *   struct l3d_data *train;
 *   if (l3d_data_open(&train, "data/train_*.bin", 50257) != L3D_OK) {   // validates every file
 *       fprintf(stderr, "llm3d: %s\n", l3d_error_message()); return 1;
 *   }
 *   struct l3d_loader_config cfg = {.B = 4, .T = 1024, .random = true, .seed = 1337,
 *                                   .dp_rank = dp_rank, .dp_size = dp_size};
 *   struct l3d_loader *ld;
 *   if (l3d_loader_init(&ld, train, &cfg) != L3D_OK) { ... }
 *   l3d_loader_next(ld, inputs, targets);          // int32 (B,T) each; no allocation
 *   struct l3d_loader_pos pos = l3d_loader_get_pos(ld);   // into the checkpoint
 *   ...
 *   l3d_loader_free(ld);
 *   l3d_data_free(train);
 *
 * Shard format (llm.c, dev/data/data_common.py): a header of 256 int32 little-endian, [0] = magic,
 * [1] = version, [2] = number of tokens N, the rest zero; then N little-endian tokens. GPT-2
 * flavour: magic 20240520, version 1, uint16 tokens (1024 + 2N bytes); Llama 3 flavour (any
 * vocabulary above 65,536): magic 20240801, version 7, uint32 tokens (1024 + 4N bytes). Both are
 * read; prepare writes the second when the vocabulary needs it.
 *
 * Windows and batches. A window is T+1 consecutive tokens of one file starting at a multiple of T
 * (llm.c's stride): inputs are its first T tokens, targets its last T. A file of n tokens holds
 * (n-1)/T windows; windows never cross a file boundary, and the tail of a file too short for a full
 * window is never read. All windows of all files, file after file, are numbered 0..W-1.
 *
 * The loader walks an endless stream of windows: epoch e is the W windows in order (sequential mode)
 * or in a Fisher-Yates shuffle seeded with seed+e (random mode); epoch e+1 follows epoch e. Each
 * call takes the next global batch of G = dp_size*B windows from the stream; DP rank r keeps
 * windows [r*B, (r+1)*B) of it. A batch never straddles two epochs: when fewer than G windows are
 * left in an epoch they are skipped and the batch starts the next epoch (in random mode they are
 * other windows each epoch). This is llm.c's rule (its loader moves to the next shard when the
 * current one has less than a batch left): on one file in sequential mode the batches are
 * llm.c's, token for token. (Windows of several files are numbered as one sequence, so a batch
 * can span a file boundary, where llm.c would skip the first file's tail.) Every rank walks the same stream, so the
 * union of the ranks' batches is exactly the batch of one process with B*dp_size, and the position
 * (epoch, index of the next window) is the same on every rank: one position resumes all of them,
 * for any dp_size with the same dp_size*B.
 *
 *   W = 5 windows, dp_size = 2, B = 1 (global batch 2), sequential:
 *     call 1: rank 0 gets w0, rank 1 gets w1      call 3: rank 0 gets w0, rank 1 gets w1 (epoch 1;
 *     call 2: rank 0 gets w2, rank 1 gets w3              w4 is skipped: one window left, not two)
 *                                                 position after call 3: epoch 1, index 2
 */
#ifndef LLM3D_DATA_H
#define LLM3D_DATA_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "llm3d/core.h"

#define L3D_SHARD_MAGIC 20240520
#define L3D_SHARD_VERSION 1
#define L3D_SHARD32_MAGIC 20240801
#define L3D_SHARD32_VERSION 7
#define L3D_SHARD_HEADER_INTS 256
#define L3D_SHARD_HEADER_BYTES (L3D_SHARD_HEADER_INTS * 4)
#define L3D_SHARD_MAX_TOKENS INT32_MAX /* the header stores the count as int32 */

/* ---- shards ---------------------------------------------------------------------------------- */

struct l3d_data; /* a read-only set of token shards, mapped into memory */

/* Opens one file, or every file a glob(3) pattern matches (in sorted order), and validates each:
 * header, magic, version, size, at least 2 tokens, and every token < vocab_size (vocab_size 0 skips
 * the range check). Returns L3D_ERR_IO (cannot open, or no file matches) or L3D_ERR_FORMAT (a
 * malformed file) with a message naming the file; nothing is left allocated on error. */
l3d_status l3d_data_open(struct l3d_data **out, const char *pattern, int64_t vocab_size);
void l3d_data_free(struct l3d_data *data);

int l3d_data_num_files(const struct l3d_data *data);
int64_t l3d_data_num_tokens(const struct l3d_data *data); /* over all files */
/* The tokens of file i (0 <= i < num_files), a uint16 shard; *n receives their count. Valid until
 * l3d_data_free. */
const uint16_t *l3d_data_file_tokens(const struct l3d_data *data, int i, int64_t *n);
/* Any shard: its token count, whether its tokens are uint32, and tokens [start, start+count) of
 * it copied to out. */
int64_t l3d_data_file_ntok(const struct l3d_data *data, int i);
bool l3d_data_file_wide(const struct l3d_data *data, int i);
void l3d_data_file_read(const struct l3d_data *data, int i, int64_t start, int64_t count,
                        int32_t *out);
const char *l3d_data_file_path(const struct l3d_data *data, int i);

/* Writes n tokens as one shard, atomically: to "<path>.tmp", flushed and fsync'ed, then renamed
 * over path. 0 <= n <= L3D_SHARD_MAX_TOKENS. */
l3d_status l3d_shard_write(const char *path, const uint16_t *tokens, int64_t n);
/* The header of a shard of n tokens of `width` bytes (2: uint16, 4: uint32), for a writer that
 * streams the tokens after it (llm3d prepare). */
void l3d_shard_header(int32_t header[L3D_SHARD_HEADER_INTS], int64_t n, int width);
/* The same with uint32 tokens (llm.c's Llama 3 format). */
l3d_status l3d_shard_write32(const char *path, const uint32_t *tokens, int64_t n);

/* ---- loader ---------------------------------------------------------------------------------- */

struct l3d_loader_config {
    int64_t B;     /* windows per rank per batch */
    int64_t T;     /* sequence length: a window holds T+1 tokens */
    bool random;   /* shuffle the windows, again each epoch */
    uint64_t seed; /* epoch e is shuffled with seed+e */
    int dp_rank;   /* 0 <= dp_rank < dp_size */
    int dp_size;   /* a global batch is dp_size*B windows */
};

/* Where the stream stands: the next window read is window `index` (0 <= index < W) of epoch
 * `epoch`'s order. Identical on every DP rank. */
struct l3d_loader_pos {
    int64_t epoch;
    int64_t index;
};

struct l3d_loader;

/* The loader reads from data, which must outlive it. L3D_ERR_ARG for a bad config, or when the data
 * holds fewer windows than one global batch (the message says how many tokens are needed). */
l3d_status l3d_loader_init(struct l3d_loader **out, const struct l3d_data *data,
                           const struct l3d_loader_config *cfg);
/* inputs (B,T), targets (B,T): the next batch of this rank; targets[b][t] = inputs[b][t+1] within
 * the window. Never allocates, never fails. */
void l3d_loader_next(struct l3d_loader *ld, int32_t *inputs, int32_t *targets);
struct l3d_loader_pos l3d_loader_get_pos(const struct l3d_loader *ld);
/* Resumes the stream at pos (as returned by get_pos on a loader over the same data, T, seed and
 * mode). L3D_ERR_ARG when pos is out of range for this data. */
l3d_status l3d_loader_set_pos(struct l3d_loader *ld, struct l3d_loader_pos pos);
int64_t l3d_loader_num_windows(const struct l3d_loader *ld); /* W */
void l3d_loader_free(struct l3d_loader *ld);

/* ---- prepare's inputs (src/data/input.c) ----------------------------------------------------- */

/* An input file, streamed: its type by extension (l3d_input_type): compressed when it ends in .gz
 * (gzip, through zlib; several members one after another are one stream) or .zst (zstd, through
 * libzstd; several frames likewise), JSON Lines when the name without that ends in .jsonl, else
 * text. Memory: one compressed chunk of 1 MiB and the decompressor's state (zlib's 32 KiB window,
 * zstd's at most 128 MiB, libzstd's default limit, a few MiB for usual levels), plus what the
 * caller reads the bytes into: the line buffer of l3d_input_next_line (the longest line, at most
 * `max` + 1 MiB) or the text of l3d_input_all. A stream cut short (a truncated download) or corrupt
 * is an error naming the file; an empty file is an empty stream. */
enum l3d_input_comp { L3D_IN_PLAIN, L3D_IN_GZIP, L3D_IN_ZSTD };

struct l3d_input {
    const char *path;
    bool jsonl;
    enum l3d_input_comp comp;
    FILE *fp;
    struct z_stream_s *gz;
    struct ZSTD_DCtx_s *zs;
    unsigned char *raw; /* compressed bytes raw[rpos, rlen) not yet decompressed */
    size_t rpos, rlen;
    bool done;          /* the decompressor ended a member / frame and wants no more bytes */
    int64_t disk;       /* bytes read from the file (compressed) */
    int64_t bytes;      /* bytes given out (decompressed) */
    char *line;         /* l3d_input_next_line's buffer: line[lpos, llen) not yet given out */
    size_t lpos, llen, lcap;
    bool eof;
    int64_t lineno; /* of the line last given out, from 1 */
};

void l3d_input_type(const char *path, bool *jsonl, enum l3d_input_comp *comp);
l3d_status l3d_input_open(struct l3d_input *in, const char *path);
/* Up to cap decompressed bytes into dst: *got, 0 only at the end. */
l3d_status l3d_input_read(struct l3d_input *in, void *dst, size_t cap, size_t *got);
/* The whole (rest of the) stream into *text (malloc'd, NUL-terminated; free() it), n bytes. */
l3d_status l3d_input_all(struct l3d_input *in, char **text, size_t *n);
/* The next line (without its '\n'), valid until the next call; *eof at the end. A line over max
 * bytes is an error naming the file and the line. */
l3d_status l3d_input_next_line(struct l3d_input *in, size_t max, const char **line, size_t *len,
                               bool *eof);
void l3d_input_close(struct l3d_input *in);

/* The inputs named on the command line, a directory replaced by its files of the types prepare
 * takes (*.txt, *.jsonl, each maybe .gz or .zst; not hidden ones, not subdirectories) sorted by
 * name (strcmp, bytewise); a directory with none is an error. Other operands are kept as they are. */
struct l3d_input_list {
    char **paths;
    int n, cap;
};
l3d_status l3d_input_expand(char **args, int n, struct l3d_input_list *out);
void l3d_input_list_free(struct l3d_input_list *l);

/* ---- preparation ----------------------------------------------------------------------------- */

#define L3D_BYTES_VOCAB 256

struct l3d_prepare_stats {
    int files;
    int64_t tokens, train_tokens, val_tokens;
    int train_shards, val_shards;
    int stale_removed; /* shards of an earlier run, beyond the ones written, that were deleted */
    int64_t docs, bytes; /* BPE preparation: documents, input bytes (decompressed) */
    int64_t disk_bytes;  /* BPE preparation: input bytes as stored (compressed) */
    int64_t bad_records; /* JSON Lines records skipped as malformed */
};

/* JSON Lines inputs of BPE preparation: each line a JSON object whose member `key` (a string) is
 * one document. A malformed record (not JSON, not an object, no such member, not a string, a NUL
 * character or invalid UTF-8 in it) is skipped and counted, or the error with strict; a line over
 * max_line bytes is always an error. */
#define L3D_PREPARE_MAX_LINE ((size_t)64 << 20)
struct l3d_prepare_jsonl {
    const char *key;
    bool strict;
    size_t max_line;
};

/* Byte-level preparation (--tokenizer bytes): token = byte value, vocabulary 256.
 * Concatenates the files in order; the last val_fraction (0 <= val_fraction < 1) of the tokens,
 * at least 2 when val_fraction > 0, go to validation. Writes out_dir/train_000000.bin, ... and
 * out_dir/val_000000.bin, ... (created, with parents, when missing): each split cut into
 * ceil(n / shard_tokens) shards of equal size (+-1 token), never more than shard_tokens
 * (4 <= shard_tokens <= L3D_SHARD_MAX_TOKENS). Numbered shards of an earlier run beyond those
 * written are deleted, so that "train_*.bin" matches exactly this run's shards. Every file is
 * read and checked (readable, no NUL byte: text only) before anything is written. stats may be
 * NULL. */
l3d_status l3d_prepare_bytes(const char *out_dir, char **files, int nfiles, double val_fraction,
                             int64_t shard_tokens, struct l3d_prepare_stats *stats);

/* BPE preparation with a tokenizer that encodes (include/llm3d/tokenizer.h): uint16 shards for a
 * vocabulary of at most 65536, else uint32 shards (llm.c's Llama 3 format). Each file is a
 * document, or, with doc_separator, each run of lines between lines equal to it (e.g. "%" for
 * fortune files; the separator lines are dropped, empty documents skipped). Every document is
 * written as doc_token (-1: the tokenizer's end-of-text, llm.c's GPT-2 convention; Llama 3's
 * begin-of-text is llm.c's Llama 3 one) then its tokens, whole: document i goes to validation when
 * floor((i+1) f) > floor(i f) for f = val_fraction (every 1/f-th document), the others to
 * training; each split cut into shards as l3d_prepare_bytes does. The files are read in order
 * (l3d_input: plain, .gz, .zst; a *.jsonl one a record at a time, each record a document as
 * a text file is one) and encoded by all OpenMP threads, documents and pieces of long ones in
 * parallel; progress prints a bar on stderr (bytes read from disk). The tokens wait in an unnamed
 * temporary file in out_dir (4 bytes each) until both splits are counted; no shard is written
 * before every file has been read (a file with a NUL byte, a truncated stream: nothing written,
 * the out_dir directories this call made removed again). */
struct l3d_tokenizer;
l3d_status l3d_prepare_bpe(const char *out_dir, char **files, int nfiles, double val_fraction,
                           int64_t shard_tokens, const struct l3d_tokenizer *tok,
                           const char *doc_separator, int doc_token, bool progress,
                           struct l3d_prepare_stats *stats);
/* The same, with JSON Lines options (NULL: key "text", not strict, L3D_PREPARE_MAX_LINE). */
l3d_status l3d_prepare_bpe_opts(const char *out_dir, char **files, int nfiles, double val_fraction,
                                int64_t shard_tokens, const struct l3d_tokenizer *tok,
                                const char *doc_separator, int doc_token, bool progress,
                                const struct l3d_prepare_jsonl *jsonl,
                                struct l3d_prepare_stats *stats);

#endif
