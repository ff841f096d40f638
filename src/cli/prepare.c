/* llm3d prepare: text files -> llm.c token shards. */
#include <errno.h>
#include <omp.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "cli/cli.h"
#include "llm3d/data.h"
#include "llm3d/tokenizer.h"

static void usage(FILE *fp) {
    fprintf(fp,
            "usage: llm3d prepare --tokenizer SPEC --out DIR [flags] FILE|DIR...\n"
            "\n"
            "Tokenizes text files into llm.c token shards: DIR/train_000000.bin, ... and\n"
            "DIR/val_000000.bin, ... (created when missing), and the tokenizer as Hugging\n"
            "Face's files (DIR/tokenizer.json, tokenizer_config.json, special_tokens_map.json,\n"
            "generation_config.json), which train --out copies into its model folder.\n"
            "\n"
            "Inputs, by extension: FILE.jsonl is JSON Lines, one document per line (the\n"
            "--jsonl-key string of a JSON object; BPE tokenizers only); any other name is text\n"
            "(one document, or those between --doc-separator lines). A further .gz (gzip) or\n"
            ".zst (zstd) is decompressed as it is read. A DIR stands for its *.txt and *.jsonl\n"
            "files, maybe .gz or .zst (sorted by name; not hidden ones, not subdirectories).\n"
            "Memory: JSON Lines stream, in about 30 MiB besides the tokenizer, plus the longest\n"
            "line (--max-line) and the decompressor's window; a text file is read whole; the tokens wait on disk (4\n"
            "bytes each, an unnamed file in DIR) until both splits are counted. The progress\n"
            "bar counts the bytes read from disk (compressed).\n"
            "\n");
}

/* A rule between the flags or the operands: one line, exit status 2. */
__attribute__((format(printf, 1, 2))) static int usage_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "llm3d prepare: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (see llm3d prepare --help)\n");
    va_end(ap);
    return 2;
}

enum { P_TOK, P_OUT, P_VAL, P_SHARD, P_SEP, P_THREADS, P_DOCTOK, P_KEY, P_STRICT, P_MAXLINE };

static const struct l3d_flag prepare_flags[] = {
    {"tokenizer", "SPEC", P_TOK, L3D_TOKENIZER_SPEC_HELP ".\n"
                                 "With bytes the files are concatenated and the last "
                                 "--val-fraction of the bytes go to validation. With a BPE "
                                 "vocabulary (the others but llm.c's file) each document starts with "
                                 "the --doc-token and goes whole to training or validation (every "
                                 "1/F-th document). Vocabularies above 65,536 tokens get uint32 "
                                 "shards (llm.c's Llama 3 format)"},
    {"doc-token", "auto|eot|bot", P_DOCTOK, "BPE: the token each document starts with: the "
                                            "tokenizer's end-of-text (eot, llm.c's GPT-2 data) or "
                                            "begin-of-text (bot, Llama 3's <|begin_of_text|>, "
                                            "llm.c's Llama 3 data). auto (the default): bot where "
                                            "the tokenizer has one, else eot"},
    {"doc-separator", "LINE", P_SEP, "BPE: lines equal to LINE separate documents (\"%\" for "
                                     "fortune files); default: each file is one document"},
    {"jsonl-key", "KEY", P_KEY, "JSON Lines: the member whose string is the document (text)"},
    {"strict", NULL, P_STRICT, "JSON Lines: a malformed record (not a JSON object, no KEY, KEY not "
                               "a string, a NUL or invalid UTF-8 in it) is an error naming its "
                               "file:line; without it such records are skipped, the first 5 "
                               "listed and all counted"},
    {"max-line", "BYTES", P_MAXLINE, "JSON Lines: a longer line is an error naming its file:line; "
                                     "1 <= BYTES <= 1099511627776 (67108864, 64 MiB)"},
    {"out", "DIR", P_OUT, "output directory"},
    {"val-fraction", "F", P_VAL, "fraction for validation, 0 <= F < 1 (0.05)"},
    {"shard-tokens", "N", P_SHARD, "at most N tokens per shard, 4 <= N <= 2147483647 "
                                   "(100000000)"},
    {"threads", "N", P_THREADS, "encoding threads (default: OMP_NUM_THREADS or all cores); the "
                                "shards are the same for any N"},
    {NULL, NULL, 0, NULL},
};

struct prepare_opts {
    const char *tokenizer, *out, *doc_sep;
    struct l3d_prepare_jsonl jsonl;
    bool jsonl_set; /* a JSON Lines flag given */
    enum l3d_doc_token doc_token; /* --doc-token */
    double val_fraction;
    int64_t shard_tokens;
    int threads; /* 0: OpenMP's default */
};

/* A whole number, also written as 1e8. */
static int parse_count(const char *s, int64_t *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end != '\0' || errno || v != floor(v) || fabs(v) > 9e15) return 0;
    *out = (int64_t)v;
    return 1;
}

static int set_prepare(void *ctx, const char *cmd, int id, const char *v) {
    struct prepare_opts *o = ctx;
    switch (id) {
    case P_TOK: o->tokenizer = v; return 1;
    case P_OUT: o->out = v; return 1;
    case P_SEP: o->doc_sep = v; return 1;
    case P_KEY: o->jsonl.key = v; o->jsonl_set = true; return 1;
    case P_STRICT: o->jsonl.strict = true; o->jsonl_set = true; return 1;
    case P_MAXLINE: {
        int64_t n;
        o->jsonl_set = true;
        if (parse_count(v, &n) && n >= 1 && n <= ((int64_t)1 << 40)) {
            o->jsonl.max_line = (size_t)n;
            return 1;
        }
        fprintf(stderr, "llm3d %s: --max-line %s is not a whole number in [1, 1099511627776]\n",
                cmd, v);
        return 0;
    }
    case P_VAL: {
        char *end;
        errno = 0;
        o->val_fraction = strtod(v, &end);
        if (end != v && *end == '\0' && !errno && o->val_fraction >= 0 && o->val_fraction < 1)
            return 1;
        fprintf(stderr, "llm3d %s: --val-fraction %s is not a number in [0, 1)\n", cmd, v);
        return 0;
    }
    case P_SHARD:
        if (parse_count(v, &o->shard_tokens) && o->shard_tokens >= 4 &&
            o->shard_tokens <= L3D_SHARD_MAX_TOKENS)
            return 1;
        fprintf(stderr, "llm3d %s: --shard-tokens %s is not a whole number in [4, 2147483647]\n",
                cmd, v);
        return 0;
    case P_THREADS: return l3d_arg_int(cmd, "threads", v, 1, 4096, &o->threads);
    case P_DOCTOK: return l3d_arg_doc_token(cmd, v, &o->doc_token);
    }
    return 0;
}

/* The summary line: counts, and the throughput over the input's (decompressed) bytes. */
static void print_summary(const struct l3d_prepare_stats *st, bool bytes, const char *tokenizer,
                          int V, const char *out, double dt) {
    printf("llm3d prepare: %d file(s)", st->files);
    if (!bytes) printf(", %lld document(s), %.2f MB", (long long)st->docs, st->bytes / 1e6);
    if (!bytes && st->disk_bytes != st->bytes) printf(" (%.2f MB on disk)", st->disk_bytes / 1e6);
    if (st->bad_records)
        printf(", %lld malformed record(s) skipped (the first listed above)",
               (long long)st->bad_records);
    printf(", %lld tokens (%s, vocabulary %d) -> %s: train %lld tokens in %d shard(s), val %lld "
           "tokens in %d shard(s)", (long long)st->tokens, bytes ? "bytes" : tokenizer, V, out,
           (long long)st->train_tokens, st->train_shards, (long long)st->val_tokens,
           st->val_shards);
    if (st->stale_removed) printf(", %d shard(s) of an earlier run deleted", st->stale_removed);
    printf(" (%.2f s", dt);
    if (!bytes && dt > 0) printf(", %.1f MB/s", st->bytes / 1e6 / dt);
    if (dt > 0) printf(", %.0f tokens/s", st->tokens / dt);
    struct rusage ru; /* the peak resident memory, which the streaming bounds (bench/prepare.sh) */
    if (getrusage(RUSAGE_SELF, &ru) == 0) printf(", peak RSS %.1f MiB", ru.ru_maxrss / 1024.0);
    printf(")\n");
}

int l3d_cli_prepare(int argc, char **argv) {
    struct prepare_opts o = {.val_fraction = 0.05, .shard_tokens = 100000000,
                             .jsonl = {"text", false, L3D_PREPARE_MAX_LINE}};
    const struct l3d_flag_group g = {NULL, prepare_flags, set_prepare, &o};
    int first = 0;
    int rc = l3d_flags_parse("prepare", argc, argv, &g, 1, usage, &first);
    if (rc >= 0) return rc;
    if (o.threads) omp_set_num_threads(o.threads);
    const char *tokenizer = o.tokenizer, *out = o.out;
    if (!tokenizer)
        return usage_error("missing --tokenizer: bytes, gpt2, cl100k_base, o200k_base, llama3, "
                           "a directory with tokenizer.json or encoder.json and vocab.bpe, a "
                           ".json file or a rank file");
    if (!out) return usage_error("missing --out DIR, the directory for the shards");
    if (first >= argc) return usage_error("no input FILE given");

    bool bytes = strcmp(tokenizer, "bytes") == 0;
    if (bytes && (o.doc_sep || o.doc_token != L3D_DOC_AUTO || o.jsonl_set))
        return usage_error("--doc-separator, --doc-token, --jsonl-key, --strict and --max-line "
                           "apply to BPE tokenizers, not bytes");
    struct l3d_input_list in;
    if (l3d_input_expand(argv + first, argc - first, &in) != L3D_OK) {
        fprintf(stderr, "llm3d prepare: %s\n", l3d_error_message());
        return 2;
    }
    struct l3d_tokenizer *tok = NULL;
    int doc_token = -1;
    if (!bytes && l3d_tokenizer_open(&tok, tokenizer) != L3D_OK) doc_token = -3;
    if (tok) doc_token = l3d_doc_token_id("prepare", tok, tokenizer, o.doc_token);
    if (doc_token < -1) {
        l3d_tokenizer_free(tok);
        l3d_input_list_free(&in);
        return doc_token == -2 ? 2 : l3d_cli_failed("prepare");
    }
    struct l3d_prepare_stats stats;
    double t0 = l3d_time_s();
    l3d_status st = bytes ? l3d_prepare_bytes(out, in.paths, in.n, o.val_fraction,
                                              o.shard_tokens, &stats)
                          : l3d_prepare_bpe_opts(out, in.paths, in.n, o.val_fraction,
                                                 o.shard_tokens, tok, o.doc_sep, doc_token,
                                                 isatty(2), &o.jsonl, &stats);
    int V = bytes ? L3D_BYTES_VOCAB : l3d_tokenizer_vocab_size(tok);
    /* the tokenizer recorded beside the shards, as Hugging Face's files: what train --out puts in
     * its model folder */
    if (st == L3D_OK && bytes) st = l3d_tokenizer_open(&tok, "bytes");
    if (st == L3D_OK) st = l3d_tokenizer_write_hf(tok, out, 0);
    l3d_tokenizer_free(tok);
    l3d_input_list_free(&in);
    if (st != L3D_OK) {
        fprintf(stderr, "llm3d prepare: %s\n", l3d_error_message());
        return st == L3D_ERR_ARG ? 2 : 1;
    }
    print_summary(&stats, bytes, tokenizer, V, out, l3d_time_s() - t0);
    return 0;
}
