/* llm3d prepare: text files -> llm.c token shards. */
#include <errno.h>
#include <getopt.h>
#include <omp.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "llm3d/data.h"
#include "llm3d/tokenizer.h"

static void usage(FILE *fp) {
    fprintf(fp,
            "usage: llm3d prepare --tokenizer SPEC --out DIR [options] FILE...\n"
            "\n"
            "Tokenizes text files into llm.c token shards: DIR/train_000000.bin, ... and\n"
            "DIR/val_000000.bin, ... (created when missing).\n"
            "\n"
            "  --tokenizer SPEC      bytes: one token per byte, vocabulary 256; the files are\n"
            "                        concatenated and the last --val-fraction of the bytes go to\n"
            "                        validation.\n"
            "                        gpt2 (fetched by scripts/setup.sh --gpt2) or a directory with\n"
            "                        encoder.json and vocab.bpe (llm3d tokenizer train): byte-level\n"
            "                        BPE; each document starts with <|endoftext|> and goes whole\n"
            "                        to training or validation (every 1/F-th document)\n"
            "  --doc-separator LINE  BPE: lines equal to LINE separate documents (\"%%\" for fortune\n"
            "                        files); default: each file is one document\n"
            "  --out DIR             output directory\n"
            "  --val-fraction F      fraction for validation, 0 <= F < 1 (0.05)\n"
            "  --shard-tokens N      at most N tokens per shard, 4 <= N <= %d (100000000)\n"
            "  --threads N           encoding threads (default: OMP_NUM_THREADS or all cores); the\n"
            "                        shards are the same for any N\n"
            "  -h, --help            this message\n",
            L3D_SHARD_MAX_TOKENS);
}

__attribute__((format(printf, 1, 2))) static int usage_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "llm3d prepare: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (see llm3d prepare --help)\n");
    va_end(ap);
    return 2;
}

/* A whole number, also written as 1e8. */
static int parse_count(const char *s, int64_t *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end != '\0' || errno || v != floor(v) || fabs(v) > 9e15) return 0;
    *out = (int64_t)v;
    return 1;
}

int l3d_cli_prepare(int argc, char **argv) {
    static const struct option opts[] = {
        {"tokenizer", required_argument, NULL, 't'},
        {"out", required_argument, NULL, 'o'},
        {"val-fraction", required_argument, NULL, 'v'},
        {"shard-tokens", required_argument, NULL, 's'},
        {"doc-separator", required_argument, NULL, 'd'},
        {"threads", required_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *tokenizer = NULL, *out = NULL, *doc_sep = NULL;
    double val_fraction = 0.05;
    int64_t shard_tokens = 100000000;

    optind = 0; /* glibc: full reset, main() or an earlier command may have run getopt */
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (c) {
        case 't': tokenizer = optarg; break;
        case 'o': out = optarg; break;
        case 'd': doc_sep = optarg; break;
        case 'v': {
            char *end;
            errno = 0;
            val_fraction = strtod(optarg, &end);
            if (end == optarg || *end != '\0' || errno || !(val_fraction >= 0 && val_fraction < 1))
                return usage_error("--val-fraction %s is not a number in [0, 1)", optarg);
            break;
        }
        case 's':
            if (!parse_count(optarg, &shard_tokens) || shard_tokens < 4 ||
                shard_tokens > L3D_SHARD_MAX_TOKENS)
                return usage_error("--shard-tokens %s is not a whole number in [4, 2147483647]",
                                   optarg);
            break;
        case 'j': {
            int threads;
            if (!l3d_arg_int("prepare", "threads", optarg, 1, 1024, &threads)) return 2;
            omp_set_num_threads(threads);
            break;
        }
        case 'h': usage(stdout); return 0;
        case ':': return usage_error("option %s needs a value", argv[optind - 1]);
        default:
            if (optopt) return usage_error("unknown option -%c", optopt);
            return usage_error("unknown option %s", argv[optind - 1]);
        }
    }
    if (!tokenizer)
        return usage_error("missing --tokenizer: bytes, gpt2, or a directory with encoder.json "
                           "and vocab.bpe");
    if (!out) return usage_error("missing --out DIR, the directory for the shards");
    if (optind >= argc) return usage_error("no input FILE given");

    bool bytes = strcmp(tokenizer, "bytes") == 0;
    if (bytes && doc_sep)
        return usage_error("--doc-separator applies to BPE tokenizers, not bytes");
    struct l3d_tokenizer *tok = NULL;
    if (!bytes && l3d_tokenizer_open(&tok, tokenizer) != L3D_OK) {
        fprintf(stderr, "llm3d prepare: %s\n", l3d_error_message());
        return 1;
    }
    struct l3d_prepare_stats stats;
    double t0 = l3d_time_s();
    l3d_status st = bytes ? l3d_prepare_bytes(out, argv + optind, argc - optind, val_fraction,
                                              shard_tokens, &stats)
                          : l3d_prepare_bpe(out, argv + optind, argc - optind, val_fraction,
                                            shard_tokens, tok, doc_sep, isatty(2), &stats);
    int V = bytes ? L3D_BYTES_VOCAB : l3d_tokenizer_vocab_size(tok);
    l3d_tokenizer_free(tok);
    if (st != L3D_OK) {
        fprintf(stderr, "llm3d prepare: %s\n", l3d_error_message());
        return st == L3D_ERR_ARG ? 2 : 1;
    }
    double dt = l3d_time_s() - t0;
    printf("llm3d prepare: %d file(s)", stats.files);
    if (!bytes) printf(", %lld document(s), %.2f MB", (long long)stats.docs, stats.bytes / 1e6);
    printf(", %lld tokens (%s, vocabulary %d) -> %s: train %lld tokens in %d shard(s), val %lld "
           "tokens in %d shard(s)", (long long)stats.tokens, bytes ? "bytes" : tokenizer, V, out,
           (long long)stats.train_tokens, stats.train_shards, (long long)stats.val_tokens,
           stats.val_shards);
    if (stats.stale_removed)
        printf(", %d shard(s) of an earlier run deleted", stats.stale_removed);
    printf(" (%.2f s", dt);
    if (!bytes && dt > 0) printf(", %.1f MB/s", stats.bytes / 1e6 / dt);
    printf(")\n");
    return 0;
}
