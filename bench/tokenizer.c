/* Tokenizer throughput on one core: MB/s of GPT-2's pre-tokenization alone and of full encoding
 * (a fresh encoder, so the pre-token cache starts empty), over the text files given.
 *   OMP_NUM_THREADS=1 l3d_bench_tokenizer TOKENIZER FILE...   (make bench-text) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llm3d/tokenizer.h"

static void count(void *ctx, const char *s, size_t n) {
    (void)s;
    (void)n;
    ++*(int64_t *)ctx;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: l3d_bench_tokenizer TOKENIZER FILE...\n");
        return 2;
    }
    struct l3d_tokenizer *t;
    if (l3d_tokenizer_open(&t, argv[1]) != L3D_OK || !l3d_tokenizer_can_encode(t)) {
        fprintf(stderr, "l3d_bench_tokenizer: %s\n", l3d_error_message());
        return 1;
    }
    size_t n = 0, cap = 0;
    char *text = NULL;
    for (int i = 2; i < argc; i++) {
        FILE *fp = fopen(argv[i], "rb");
        if (!fp) {
            fprintf(stderr, "l3d_bench_tokenizer: cannot read %s\n", argv[i]);
            return 1;
        }
        for (size_t got = 1; got;) {
            if (n + 65536 > cap) text = realloc(text, cap = 2 * cap + 65536);
            n += got = fread(text + n, 1, 65536, fp);
        }
        fclose(fp);
    }
    const int reps = 3;
    double best_pre = 1e30, best_enc = 1e30;
    int64_t pre = 0, toks = 0;
    for (int r = 0; r < reps; r++) {
        struct l3d_encoder *e = l3d_encoder_init(t);
        int64_t np = 0;
        double t0 = l3d_time_s();
        l3d_encoder_pretokenize(e, text, n, count, &np);
        double t1 = l3d_time_s();
        l3d_encoder_free(e);
        e = l3d_encoder_init(t); /* cold cache */
        struct l3d_ids ids = {0};
        double t2 = l3d_time_s();
        l3d_encoder_encode(e, text, n, &ids);
        double t3 = l3d_time_s();
        best_pre = t1 - t0 < best_pre ? t1 - t0 : best_pre;
        best_enc = t3 - t2 < best_enc ? t3 - t2 : best_enc;
        pre = np;
        toks = ids.n;
        l3d_ids_free(&ids);
        l3d_encoder_free(e);
    }
    printf("tokenizer %s (vocabulary %d), %.2f MB of text, one core, best of %d:\n", argv[1],
           l3d_tokenizer_vocab_size(t), n / 1e6, reps);
    printf("  pre-tokenization: %lld pre-tokens, %.1f MB/s\n", (long long)pre, n / 1e6 / best_pre);
    printf("  encoding:         %lld tokens (%.2f bytes/token), %.1f MB/s\n", (long long)toks,
           (double)n / (double)toks, n / 1e6 / best_enc);
    free(text);
    l3d_tokenizer_free(t);
    return 0;
}
