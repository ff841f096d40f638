/*
 * llm3d tokenizer: GPT-2's byte-level BPE (Radford et al. 2019, sec. 2.2; OpenAI's encoder.py),
 * its training, and llm.c's decode-only tokenizer file.
 *
 *   struct l3d_tokenizer *tok;
 *   if (l3d_tokenizer_open(&tok, "gpt2") != L3D_OK) {        // or a directory, or a .bin file
 *       fprintf(stderr, "llm3d: %s\n", l3d_error_message()); return 1;
 *   }
 *   struct l3d_encoder *enc = l3d_encoder_init(tok);         // one per thread
 *   struct l3d_ids ids = {0};
 *   l3d_encoder_encode(enc, "Hello, world!", 13, &ids);      // ids.v = {15496, 11, 995, 0}
 *   size_t len;
 *   const unsigned char *b = l3d_tokenizer_token(tok, ids.v[0], &len);   // "Hello", 5 bytes
 *   l3d_ids_free(&ids); l3d_encoder_free(enc); l3d_tokenizer_free(tok);
 *
 * Files (GPT-2's format, also what `llm3d tokenizer train` writes): DIR/encoder.json, a JSON
 * object {token string: id} with ids 0..V-1, and DIR/vocab.bpe, a "#version" line then one merge
 * "a b" per line in rank order. Token strings spell bytes through GPT-2's bytes_to_unicode map
 * (printable Latin-1 bytes stand for themselves, the other 68 bytes for U+0100..U+0143), so a
 * token is a byte string. "<|endoftext|>" is the end-of-text token (50256 in GPT-2).
 *
 * Encoding: the text is cut into pre-tokens by GPT-2's pattern
 *   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * (PCRE2 with Unicode properties; \s is the Unicode White_Space property, as in the Python
 * `regex` module GPT-2 uses), then each pre-token's bytes are merged pair by pair, lowest merge
 * rank first. Bytes that are not valid UTF-8 match no part of the pattern; each such run is a
 * pre-token of its own, so any byte string encodes and decode(encode(x)) == x. "<|endoftext|>"
 * inside a text is encoded as text, as GPT-2's encoder does; separators are added by the caller.
 *
 * llm.c's tokenizer file (gpt2_tokenizer.bin, llm.c dev/data/tokenizer.py and tokenizer.h):
 * 256 uint32 header, [0] = 20240328, [1] = version 1 or 2, [2] = V, [3] = end-of-text id
 * (version 2; 50256 in version 1); then V tokens, each a uint8 length (>= 1) and its bytes.
 * It has no merges: a tokenizer read from it decodes only.
 */
#ifndef LLM3D_TOKENIZER_H
#define LLM3D_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llm3d/core.h"

#define L3D_LLMC_TOKENIZER_MAGIC 20240328
#define L3D_EOT_STRING "<|endoftext|>"

struct l3d_tokenizer; /* immutable once loaded: shared by threads */

/* A growable list of token ids. Zero-initialise; l3d_ids_free releases it. */
struct l3d_ids {
    int32_t *v;
    int64_t n, cap;
};
void l3d_ids_push(struct l3d_ids *ids, int32_t id);
void l3d_ids_free(struct l3d_ids *ids);

/* dir/encoder.json + dir/vocab.bpe. Errors name the file and what is wrong in it (missing, bad
 * JSON at which offset, ids not 0..V-1, a merge of unknown tokens, a byte without a token...). */
l3d_status l3d_tokenizer_load(struct l3d_tokenizer **out, const char *dir);
/* llm.c's gpt2_tokenizer.bin (decoding only). */
l3d_status l3d_tokenizer_load_llmc(struct l3d_tokenizer **out, const char *path);
/* A tiktoken rank file (src/tokenizer/tiktoken.c): cl100k_base, o200k_base or Llama 3's, known by
 * its rank count, which gives the pattern and special tokens. */
l3d_status l3d_tokenizer_load_tiktoken(struct l3d_tokenizer **out, const char *path);
/* A Hugging Face tokenizer.json (src/tokenizer/hf.c): a BPE model, ByteLevel and Split
 * pre-tokenizers, ByteLevel decoder, added tokens. Other models (WordPiece, Unigram), normalizers
 * and pre-tokenizers are refused, named. */
l3d_status l3d_tokenizer_load_hf(struct l3d_tokenizer **out, const char *path);
/* A --tokenizer argument: "bytes" (the 256 byte values as tokens, no merges and no end-of-text:
 * what `prepare --tokenizer bytes` writes); a name, "gpt2", "cl100k_base", "o200k_base" or
 * "llama3", whose files `scripts/setup.sh --tokenizers` installs under l3d_tokenizer_cache_dir()
 * (gpt2/encoder.json + vocab.bpe, tiktoken/NAME.tiktoken); a directory with tokenizer.json, or
 * with encoder.json and vocab.bpe; a file: llm.c's .bin (by its magic), a tokenizer.json (by the
 * name's .json), else a tiktoken rank file. */
l3d_status l3d_tokenizer_open(struct l3d_tokenizer **out, const char *spec);
/* Where the named tokenizers live: $L3D_CACHE_DIR, else $XDG_CACHE_HOME/llm3d, else
 * $HOME/.cache/llm3d; "gpt2" in its gpt2/ folder (l3d_tokenizer_gpt2_dir). Into buf (cap bytes). */
void l3d_tokenizer_cache_dir(char *buf, size_t cap);
void l3d_tokenizer_gpt2_dir(char *buf, size_t cap);
void l3d_tokenizer_free(struct l3d_tokenizer *t);

int l3d_tokenizer_vocab_size(const struct l3d_tokenizer *t);
int l3d_tokenizer_eot(const struct l3d_tokenizer *t); /* -1 when there is none */
int l3d_tokenizer_bot(const struct l3d_tokenizer *t); /* begin-of-text (Llama 3's); -1: none */
bool l3d_tokenizer_can_encode(const struct l3d_tokenizer *t); /* false for llm.c files */
/* The bytes of token id (0 <= id < V), *len of them; NULL for an id out of range. */
const unsigned char *l3d_tokenizer_token(const struct l3d_tokenizer *t, int id, size_t *len);
/* Appends the bytes of ids[0..n) to out, growing it (*cap bytes, realloc'd); returns the length.
 * Ids out of range are an L3D_ASSERT failure: check them first where they come from a file. */
size_t l3d_tokenizer_decode(const struct l3d_tokenizer *t, const int32_t *ids, int64_t n,
                            char **out, size_t *cap);

/* Per-thread encoding state: the compiled pattern's match data and a cache of pre-tokens. */
struct l3d_encoder;
struct l3d_encoder *l3d_encoder_init(const struct l3d_tokenizer *t); /* t can encode */
/* Appends the token ids of text[0..n) to ids. Special tokens spelled in the text ("<|endoftext|>")
 * are encoded as text, as tiktoken's encode_ordinary does. An error (L3D_ERR_FORMAT) only where
 * the tokenizer file's own pattern fails on the text: it matches the empty string there (through a
 * lookahead or \K: other such patterns are refused when read) or PCRE2 gives up (its match
 * limit); the message names the file, the pattern and the byte; ids then hold the ids before it. */
l3d_status l3d_encoder_encode(struct l3d_encoder *e, const char *text, size_t n,
                              struct l3d_ids *ids);
/* The same, but the special tokens spelled in the text are those tokens (tiktoken's encode with
 * allowed_special="all"). */
l3d_status l3d_encoder_encode_special(struct l3d_encoder *e, const char *text, size_t n,
                                      struct l3d_ids *ids);
void l3d_encoder_free(struct l3d_encoder *e);

/* Pre-tokenization alone: calls fn(ctx, start, len) for each pre-token of text[0..n), in order
 * (they tile the text; for a tokenizer with an NFC normalizer, the normalized text, held by e).
 * Used by BPE training. Errors as l3d_encoder_encode's. */
l3d_status l3d_encoder_pretokenize(struct l3d_encoder *e, const char *text, size_t n,
                                   void (*fn)(void *ctx, const char *s, size_t len), void *ctx);

/* Writes llm.c's tokenizer file (version 2) for t; every token must be 1..255 bytes long. */
l3d_status l3d_tokenizer_save_llmc(const struct l3d_tokenizer *t, const char *path);

/* Writes t as Hugging Face's tokenizer files into the existing directory dir (each through
 * include/llm3d/file.h's writer): tokenizer.json, tokenizer_config.json, special_tokens_map.json
 * and generation_config.json (src/tokenizer/hfsave.c says what each holds, and how a tiktoken rank
 * file's merges are recovered). max_len: tokenizer_config.json's model_max_length (0: not written).
 * Refused for llm.c's decode-only file. */
l3d_status l3d_tokenizer_write_hf(const struct l3d_tokenizer *t, const char *dir, int64_t max_len);
/* The same files into the folder dir, made when absent, put in place whole (l3d_dir_out: its other
 * files carried over). */
l3d_status l3d_tokenizer_save_hf(const struct l3d_tokenizer *t, const char *dir);
/* L3D_OK when t's ids fit a model of V tokens; else L3D_ERR_ARG naming `what` and both sizes. */
l3d_status l3d_tokenizer_fits(const struct l3d_tokenizer *t, int V, const char *what);
/* Whether name is one of the files l3d_tokenizer_write_hf writes. */
bool l3d_tokenizer_hf_owned(const char *name);

/* ---- training -------------------------------------------------------------------------------- */

/* Learns a byte-level BPE vocabulary of vocab_size tokens (256 bytes + merges + end-of-text,
 * 258 <= vocab_size <= 65536) from the files, with GPT-2's pre-tokenization, and writes
 * out_dir/encoder.json and out_dir/vocab.bpe. Classic BPE (Sennrich et al. 2016): pair counts over
 * the distinct pre-tokens weighted by frequency, updated incrementally after each merge, the most
 * frequent pair taken from a priority queue (ties: the smaller pair of token ids). Deterministic.
 * Fewer merges are learnt when the corpus runs out of pairs; *merges_out receives the number
 * (may be NULL). Threads read and pre-tokenize the files in parallel. */
l3d_status l3d_bpe_train(char **files, int nfiles, int vocab_size, const char *out_dir,
                         int *merges_out, bool progress);

#endif
