/* llm3d tokenizer: train a byte-level BPE vocabulary; encode text, decode token shards. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "llm3d/data.h"
#include "llm3d/tokenizer.h"

static void usage(FILE *fp) {
    fprintf(fp,
            "usage: llm3d tokenizer train --vocab-size N --out DIR FILE...\n"
            "         learns a byte-level BPE vocabulary of N tokens (258..65536, the end-of-text\n"
            "         token included) with GPT-2's pre-tokenization; writes DIR/encoder.json and\n"
            "         DIR/vocab.bpe, GPT-2's format (--tokenizer DIR in prepare and generate),\n"
            "         and the same vocabulary as Hugging Face's files (DIR/tokenizer.json, ...)\n"
            "       llm3d tokenizer encode --tokenizer SPEC [--text TEXT | FILE | -]\n"
            "         prints the token ids of TEXT (or of the file; - or no FILE: standard input),\n"
            "         one line\n"
            "       llm3d tokenizer decode --tokenizer SPEC SHARD\n"
            "         prints the text of an llm.c token shard (end-of-text as <|endoftext|>)\n"
            "       llm3d tokenizer export --tokenizer SPEC --out FILE.bin | DIR\n"
            "         writes llm.c's tokenizer file (gpt2_tokenizer.bin format, version 2) to a\n"
            "         path ending in .bin; else Hugging Face's tokenizer files into the folder\n"
            "         DIR (tokenizer.json, tokenizer_config.json, special_tokens_map.json,\n"
            "         generation_config.json: what transformers' AutoTokenizer reads)\n"
            "SPEC: one of the forms under --tokenizer below\n"
            "\n");
}

static int open_tok(const char *spec, struct l3d_tokenizer **tok) {
    if (!spec) {
        fprintf(stderr, "llm3d tokenizer: give --tokenizer SPEC (bytes, gpt2, cl100k_base, "
                "o200k_base, llama3, a directory, a tokenizer.json or a rank file: see llm3d "
                "tokenizer --help)\n");
        return 2;
    }
    if (l3d_tokenizer_open(tok, spec) != L3D_OK) return l3d_cli_failed("tokenizer");
    return 0;
}

/* The flags and operands of one `llm3d tokenizer SUB` command. */
struct tok_args {
    const char *sub, *out, *spec, *text;
    int vocab;
    char **files;
    int nfiles;
};

enum { K_VOCAB, K_OUT, K_TOK, K_TEXT };

static const struct l3d_flag tok_flags[] = {
    {"vocab-size", "N", K_VOCAB, "train: the vocabulary's size, 258..65536 (the end-of-text token "
                                 "included)"},
    {"out", "PATH", K_OUT, "train: the directory for encoder.json, vocab.bpe and the Hugging Face "
                           "files; export: llm.c's FILE.bin, or a folder for the Hugging Face "
                           "files"},
    {"tokenizer", "SPEC", K_TOK, "encode, decode, export: the tokenizer. " L3D_TOKENIZER_SPEC_HELP},
    {"text", "TEXT", K_TEXT, "encode: the text (else one FILE; - or no FILE: standard input)"},
    {NULL, NULL, 0, NULL},
};

static int set_tok(void *ctx, const char *cmd, int id, const char *v) {
    struct tok_args *a = ctx;
    switch (id) {
    case K_VOCAB: return l3d_arg_int(cmd, "vocab-size", v, 258, 65536, &a->vocab);
    case K_OUT: a->out = v; return 1;
    case K_TOK: a->spec = v; return 1;
    case K_TEXT: a->text = v; return 1;
    }
    return 0;
}

/* Reads the flags after the subcommand (argv[1]); returns -1 to go on, else the exit status
 * (--help: 0, a bad flag: 2). */
static int parse_args(int argc, char **argv, struct tok_args *a) {
    const struct l3d_flag_group g = {NULL, tok_flags, set_tok, a};
    int first = 0;
    int rc = l3d_flags_parse("tokenizer", argc - 1, argv + 1, &g, 1, usage, &first);
    if (rc >= 0) return rc;
    a->files = argv + 1 + first;
    a->nfiles = argc - 1 - first;
    return -1;
}

static int cmd_train(const struct tok_args *a) {
    if (a->spec) {
        fprintf(stderr, "llm3d tokenizer train learns a vocabulary from the corpus and starts "
                "from none: leave out --tokenizer %s\n", a->spec);
        return 2;
    }
    if (!a->vocab || !a->out || a->nfiles < 1) {
        fprintf(stderr, "llm3d tokenizer train: give --vocab-size N, --out DIR and at least one "
                "corpus FILE\n");
        return 2;
    }
    double t0 = l3d_time_s();
    int merges;
    if (l3d_bpe_train(a->files, a->nfiles, a->vocab, a->out, &merges, isatty(2)) != L3D_OK)
        return l3d_cli_failed("tokenizer train");
    printf("llm3d tokenizer train: %d merges -> %s/encoder.json, %s/vocab.bpe and tokenizer.json "
           "(%.1f s)\n", merges, a->out, a->out, l3d_time_s() - t0);
    if (merges < a->vocab - 257)
        printf("llm3d tokenizer train: the corpus ran out of pairs occurring twice: %d tokens "
               "instead of %d\n", merges + 257, a->vocab);
    return 0;
}

static int cmd_export(const struct tok_args *a, const struct l3d_tokenizer *tok) {
    if (!a->out) {
        fprintf(stderr, "llm3d tokenizer export: give --out FILE\n");
        return 2;
    }
    size_t n = strlen(a->out);
    bool llmc = n >= 4 && strcmp(a->out + n - 4, ".bin") == 0;
    l3d_status st = llmc ? l3d_tokenizer_save_llmc(tok, a->out) : l3d_tokenizer_save_hf(tok, a->out);
    if (st != L3D_OK) return l3d_cli_failed("tokenizer export");
    if (!llmc)
        printf("llm3d tokenizer export: %s/tokenizer.json, tokenizer_config.json, "
               "special_tokens_map.json, generation_config.json\n", a->out);
    return 0;
}

/* The text to encode: --text, else the one FILE read into *buf (free it); standard input for - or
 * no FILE at all, as a Unix filter reads it. Returns 0, or the exit status. */
static int encode_input(const struct tok_args *a, const char **text, char **buf, size_t *n) {
    *buf = NULL;
    *n = 0;
    if (a->text) {
        *text = a->text;
        *n = strlen(a->text);
        return 0;
    }
    if (a->nfiles > 1) {
        fprintf(stderr, "llm3d tokenizer encode: %d FILEs given: give --text TEXT, one FILE, or "
                "the text on standard input\n", a->nfiles);
        return 2;
    }
    const char *name = a->nfiles ? a->files[0] : "-";
    bool in = strcmp(name, "-") == 0;
    FILE *fp = stdin;
    if (!in && l3d_fopen_regular(name, "input", &fp, NULL) != L3D_OK)
        return l3d_cli_failed("tokenizer encode");
    size_t cap = 0;
    for (size_t got = 1; fp && got;) {
        if (*n + 65536 > cap) {
            char *b2 = realloc(*buf, cap = 2 * cap + 65536);
            L3D_ASSERT(b2 != NULL);
            *buf = b2;
        }
        *n += got = fread(*buf + *n, 1, 65536, fp);
    }
    bool failed = !fp || ferror(fp);
    if (fp && !in) fclose(fp);
    if (failed) {
        fprintf(stderr, "llm3d tokenizer encode: cannot read %s\n",
                in ? "standard input" : name);
        return 1;
    }
    *text = *buf;
    return 0;
}

static int cmd_encode(const struct tok_args *a, const struct l3d_tokenizer *tok) {
    const char *text = NULL;
    char *buf;
    size_t n;
    int rc = encode_input(a, &text, &buf, &n);
    if (rc) return rc;
    if (!l3d_tokenizer_can_encode(tok)) {
        fprintf(stderr, "llm3d tokenizer encode: llm.c's tokenizer file decodes only\n");
        free(buf);
        return 2;
    }
    struct l3d_encoder *e = l3d_encoder_init(tok);
    struct l3d_ids ids = {0};
    l3d_status st = l3d_encoder_encode(e, text, n, &ids);
    if (st != L3D_OK) fprintf(stderr, "llm3d tokenizer encode: %s\n", l3d_error_message());
    for (int64_t i = 0; i < ids.n && st == L3D_OK; i++) printf(i ? " %d" : "%d", ids.v[i]);
    if (st == L3D_OK) printf("\n");
    l3d_ids_free(&ids);
    l3d_encoder_free(e);
    free(buf);
    return st == L3D_OK ? 0 : 1;
}

static int cmd_decode(const struct tok_args *a, const struct l3d_tokenizer *tok) {
    if (a->nfiles != 1) {
        fprintf(stderr, "llm3d tokenizer decode: give one SHARD file\n");
        return 2;
    }
    struct l3d_data *d;
    if (l3d_data_open(&d, a->files[0], l3d_tokenizer_vocab_size(tok)) != L3D_OK)
        return l3d_cli_failed("tokenizer decode");
    for (int f = 0; f < l3d_data_num_files(d); f++) {
        int64_t n = l3d_data_file_ntok(d, f);
        for (int64_t i = 0; i < n; i++) {
            int32_t id;
            size_t len;
            l3d_data_file_read(d, f, i, 1, &id);
            const unsigned char *b = l3d_tokenizer_token(tok, id, &len);
            fwrite(b, 1, len, stdout);
        }
    }
    l3d_data_free(d);
    return 0;
}

int l3d_cli_tokenizer(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(stdout);
        l3d_flags_help(stdout, &(struct l3d_flag_group){NULL, tok_flags, set_tok, NULL}, 1);
        return 0;
    }
    struct tok_args a = {.sub = argv[1]};
    if (strcmp(a.sub, "train") && strcmp(a.sub, "encode") && strcmp(a.sub, "decode") &&
        strcmp(a.sub, "export")) {
        fprintf(stderr, "llm3d tokenizer: unknown subcommand '%s': train, encode, decode or "
                "export\n", a.sub);
        return 2;
    }
    int rc = parse_args(argc, argv, &a);
    if (rc >= 0) return rc;
    if (strcmp(a.sub, "train") == 0) return cmd_train(&a);
    struct l3d_tokenizer *tok;
    rc = open_tok(a.spec, &tok);
    if (rc) return rc;
    rc = strcmp(a.sub, "export") == 0   ? cmd_export(&a, tok)
         : strcmp(a.sub, "encode") == 0 ? cmd_encode(&a, tok)
                                        : cmd_decode(&a, tok);
    l3d_tokenizer_free(tok);
    return rc;
}
