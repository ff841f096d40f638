/* Private parts of the tokenizer shared by src/tokenizer/bpe.c and src/tokenizer/train.c. */
#ifndef LLM3D_TOKENIZER_IMPL_H
#define LLM3D_TOKENIZER_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "llm3d/core.h"

struct merge_slot {
    uint64_t key; /* (left << 32 | right) + 1; 0 = empty */
    int32_t rank, result;
};

/* A table from token bytes to id: for reading merges, and for tiktoken's whole pre-token look-up. */
struct bytes_index {
    uint64_t *slot; /* the token's hash's high 32 bits << 32 | id + 1; 0 = empty */
    uint64_t mask;
};

/* The special tokens of a vocabulary (tiktoken's special_tokens, tokenizer.json's special added
 * tokens): spelled in user text they are encoded as text unless the caller allows them. */
struct tok_special {
    int32_t *id;
    int n;
};

struct l3d_tokenizer {
    int V, eot, bot;       /* bot: begin-of-text, -1 when there is none */
    unsigned char *blob;   /* the bytes of every token, one after the other */
    int64_t *off;          /* (V+1) offsets into blob; a rank file's unused ids are empty */
    int32_t byte_id[256];  /* the token of each single byte (-1 when decoding only) */
    int nmerges;
    struct merge_slot *merges; /* open addressing, mmask+1 slots */
    uint64_t mmask;
    pcre2_code *re;        /* NULL when decoding only */
    char *pattern, *what;  /* re as written, and where it comes from: for errors while encoding */
    /* tiktoken (and tokenizer.json's ignore_merges): a pre-token that is a token is that token,
     * before any merge; ix finds it */
    bool whole_first;
    bool nfc; /* tokenizer.json's NFC normalizer: text is composed before pre-tokenisation */
    struct bytes_index ix;
    struct tok_special special;
};

void l3d_tok_index_build(struct bytes_index *ix, const struct l3d_tokenizer *t);
int l3d_tok_index_find(const struct bytes_index *ix, const struct l3d_tokenizer *t,
                       const unsigned char *s, size_t n);
/* The index's hash of bytes, FNV-1a (64-bit) and a final mix, a byte at a time: so that the
 * hashes of every prefix of a token cost one step each (tiktoken.c's splits). */
#define L3D_TOK_HASH_START 1469598103934665603ULL
static inline uint64_t l3d_tok_hash_step(uint64_t h, unsigned char c) {
    return (h ^ c) * 1099511628211ULL;
}
static inline uint64_t l3d_tok_hash_end(uint64_t h) { return h ^ (h >> 29); }
/* l3d_tok_index_find with h, the hash of s[0..n) */
int l3d_tok_index_find_hashed(const struct bytes_index *ix, const struct l3d_tokenizer *t,
                              const unsigned char *s, size_t n, uint64_t h);
/* Inserts the merge (a, b) -> result at rank; false when the pair is there already (it keeps its
 * first rank). The table must have a free slot. */
bool l3d_tok_merge_insert(struct l3d_tokenizer *t, int32_t a, int32_t b, int32_t rank,
                          int32_t result);
/* t->merges sized for n merges (load factor <= 1/2), empty. */
void l3d_tok_merges_alloc(struct l3d_tokenizer *t, uint64_t n);

/* Compiles a pre-tokenisation pattern written in the syntax of tiktoken's and tokenizer.json's
 * patterns (Rust/Python regex: \p{L}, \p{N}, \p{Lu}, \p{Ll}, \p{Lt}, \p{Lm}, \p{Lo}, \p{M},
 * their \P{..}, \s, \S, (?i:...), (?!...)) into t->re, with the Unicode classes spelled out from
 * unicode_classes.h and \s as the White_Space property (src/tokenizer/pattern.c). `what` names
 * the pattern's origin in errors (kept in t->what, the pattern in t->pattern). A pattern that can
 * match the empty string is refused, as far as PCRE2 can tell (see pattern.c). */
l3d_status l3d_tok_compile(struct l3d_tokenizer *t, const char *pattern, const char *what);
#define L3D_GPT2_PATTERN \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
/* cl100k_base's and Llama 3's pattern (the same), and o200k_base's, as tiktoken writes them */
#define L3D_CL100K_PATTERN \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|" \
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define L3D_O200K_PATTERN \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+" \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+" \
    "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|" \
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

/* Scratch of l3d_tok_nfc: code points and the UTF-8 written. */
struct l3d_nfc {
    int32_t *cp; /* a code point, or -(byte + 1) for a byte of invalid UTF-8 */
    size_t ncp, cpcap;
    char *out;
    size_t cap;
};
/* Unicode NFC of text[0..n) (src/tokenizer/normalize.c): text itself when it is NFC by a quick
 * check, else s->out (NUL-terminated); *out_n its length. */
const char *l3d_tok_nfc(struct l3d_nfc *s, const char *text, size_t n, size_t *out_n);
void l3d_nfc_free(struct l3d_nfc *s);

/* Base64 (RFC 4648, with padding) of s[0..n) into out (at least 3n/4 bytes); -1 when malformed. */
long l3d_tok_base64(const char *s, size_t n, unsigned char *out);

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
/* A tiktoken rank file (lines "base64 rank") into an empty t: tokens, rank merges, pattern and
 * special tokens of the encoding its rank count names (src/tokenizer/tiktoken.c). */
l3d_status l3d_tok_parse_tiktoken(struct l3d_tokenizer *t, const char *path, const char *txt,
                                  size_t n);
/* A Hugging Face tokenizer.json (text js of n bytes) into an empty t (src/tokenizer/hf.c). */
l3d_status l3d_tok_parse_hf(struct l3d_tokenizer *t, const char *path, const char *js, size_t n);

#endif
