/* Private parts of the tokenizer shared by src/tokenizer/bpe.c and src/tokenizer/train.c. */
#ifndef LLM3D_TOKENIZER_IMPL_H
#define LLM3D_TOKENIZER_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#include "llm3d/core.h"

/* GPT-2's bytes_to_unicode (encoder.py): byte b is spelled as code point l3d_byte_cp[b]; the
 * printable bytes '!'..'~', 0xA1..0xAC, 0xAE..0xFF as themselves, the others as 256, 257, ... in
 * byte order. l3d_byte_order[i] is the byte with id i in GPT-2's encoder.json (printable first). */
void l3d_bytes_to_unicode(int byte_cp[256], int byte_order[256]);

/* Writes the spelling of bytes s[0..n) through bytes_to_unicode, in UTF-8, to fp; with json,
 * '"' and '\\' escaped for a JSON string. */
void l3d_tok_write_spelled(FILE *fp, const unsigned char *s, size_t n, const int byte_cp[256],
                           bool json);

/* Reads a whole file into a NUL-terminated buffer (l3d_free it); `what` names it in errors. */
l3d_status l3d_read_whole_file(const char *path, const char *what, char **buf, size_t *len);

/* A tokenizer of the 256 single bytes only (no merges), with GPT-2's pattern: for pre-tokenizing,
 * and --tokenizer bytes (l3d_tokenizer_open). */
struct l3d_tokenizer;
l3d_status l3d_tokenizer_bytes(struct l3d_tokenizer **out);

/* Where to end a piece of text[a..b) of about `target` bytes so that pieces encode apart exactly as
 * a whole: at a "\n" between two printable ASCII characters, where GPT-2's pattern always ends a
 * pre-token (a lone "\n" there is its own match, and no match reaches back across it). Returns b
 * when text[a..b) is shorter than 2 targets or has no such place after a + target. */
size_t l3d_tok_cut(const char *text, size_t a, size_t b, size_t target);

/* The parsers of the tokenizer files, on buffers (path only names them in errors): an empty
 * tokenizer (l3d_tokenizer_free it), GPT-2's encoder.json then vocab.bpe into it (txt NUL-
 * terminated), llm.c's tokenizer file. The loaders in bpe.c and the fuzz targets call these. */
struct l3d_tokenizer *l3d_tok_new(void);
l3d_status l3d_tok_parse_encoder_json(struct l3d_tokenizer *t, const char *path, const char *js,
                                      size_t n);
l3d_status l3d_tok_parse_merges(struct l3d_tokenizer *t, const char *path, char *txt, size_t n);
l3d_status l3d_tok_parse_llmc(struct l3d_tokenizer **out, const char *path, const char *buf,
                              size_t n);

#endif
