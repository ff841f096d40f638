/* Private parts of the tokenizer shared by src/tokenizer/bpe.c and src/tokenizer/train.c. */
#ifndef LLM3D_TOKENIZER_IMPL_H
#define LLM3D_TOKENIZER_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "llm3d/core.h"

/* GPT-2's bytes_to_unicode (encoder.py): byte b is spelled as code point l3d_byte_cp[b]; the
 * printable bytes '!'..'~', 0xA1..0xAC, 0xAE..0xFF as themselves, the others as 256, 257, ... in
 * byte order. l3d_byte_order[i] is the byte with id i in GPT-2's encoder.json (printable first). */
void l3d_bytes_to_unicode(int byte_cp[256], int byte_order[256]);

/* Appends the UTF-8 JSON string spelling of bytes s[0..n) (through bytes_to_unicode, with '"' and
 * '\\' escaped) to fp. */
void l3d_tok_write_spelled(FILE *fp, const unsigned char *s, size_t n, const int byte_cp[256]);

/* Reads a whole file into a NUL-terminated buffer (l3d_free it); `what` names it in errors. */
l3d_status l3d_read_whole_file(const char *path, const char *what, char **buf, size_t *len);

#endif
