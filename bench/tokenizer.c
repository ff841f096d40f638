/* Tokenizer load time (best of 3) and throughput: MB/s of pre-tokenization alone and of full encoding on one core (a fresh
 * encoder, so the pre-token cache starts empty), and of encoding on OMP_NUM_THREADS threads, the
 * text cut into that many pieces at line ends (each thread its own encoder), over the files given.
 *   OMP_NUM_THREADS=2 l3d_bench_tokenizer TOKENIZER FILE...   (make bench-text) */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "llm3d/tokenizer.h"

static void count(void *ctx, const char *s, size_t n) {
    (void)s;
    (void)n;
    ++*(int64_t *)ctx;
}

static bool graph(char c) { return c > ' ' && c < 127; }

static double thread_cpu_s(void) {
    struct timespec c;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c);
    return (double)c.tv_sec + 1e-9 * (double)c.tv_nsec;
}

/* Where piece k of nt starts: the first line end after k n / nt between two printable characters,
 * where the patterns end every pre-token, so the pieces encode as the whole text does. */
static size_t piece_start(const char *text, size_t n, int k, int nt) {
    if (k == 0) return 0;
    if (k == nt) return n;
    size_t e = n / (size_t)nt * (size_t)k;
    while (e + 1 < n && !(e >= 2 && text[e - 1] == '\n' && graph(text[e]) && graph(text[e - 2]))) e++;
    return e + 1 < n ? e : n;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: l3d_bench_tokenizer TOKENIZER FILE...\n");
        return 2;
    }
    struct l3d_tokenizer *t = NULL;
    double best_load = 1e30;
    for (int r = 0; r < 3; r++) { /* opening it: reading the files, the merge table, the pattern */
        l3d_tokenizer_free(t);
        double t0 = l3d_time_s();
        if (l3d_tokenizer_open(&t, argv[1]) != L3D_OK || !l3d_tokenizer_can_encode(t)) {
            fprintf(stderr, "l3d_bench_tokenizer: %s\n", l3d_error_message());
            return 1;
        }
        double dt = l3d_time_s() - t0;
        best_load = dt < best_load ? dt : best_load;
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
    double best_pre = 1e30, best_enc = 1e30, enc_cpu = 0;
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
        double t2 = l3d_time_s(), c2 = thread_cpu_s();
        l3d_encoder_encode(e, text, n, &ids);
        double t3 = l3d_time_s(), c3 = thread_cpu_s();
        best_pre = t1 - t0 < best_pre ? t1 - t0 : best_pre;
        if (t3 - t2 < best_enc) {
            best_enc = t3 - t2;
            enc_cpu = c3 - c2;
        }
        pre = np;
        toks = ids.n;
        l3d_ids_free(&ids);
        l3d_encoder_free(e);
    }
    printf("tokenizer %s (vocabulary %d), %.2f MB of text, best of %d:\n", argv[1],
           l3d_tokenizer_vocab_size(t), n / 1e6, reps);
    printf("  loading:          %.3f s\n", best_load);
    printf("  pre-tokenization: %lld pre-tokens, %.1f MB/s (1 thread)\n", (long long)pre,
           n / 1e6 / best_pre);
    printf("  encoding:         %lld tokens (%.2f bytes/token), %.1f MB/s (1 thread; %.3f s, CPU "
           "%.3f s: %.1f MB/s of CPU time)\n", (long long)toks, (double)n / (double)toks,
           n / 1e6 / best_enc, best_enc, enc_cpu, n / 1e6 / enc_cpu);
    int nt = omp_get_max_threads();
    if (nt > 1) {
        /* wall time, and each thread's CPU time: when the threads' CPU times add up to the one
         * thread's but the wall time does not drop, the threads waited for a core (a shared
         * machine), not for each other */
        double best = 1e30, cpu[64] = {0}, best_cpu[64] = {0};
        nt = nt < 64 ? nt : 64;
        for (int r = 0; r < reps; r++) {
            double t0 = l3d_time_s();
#pragma omp parallel num_threads(nt)
            {
                int k = omp_get_thread_num();
                double c0 = thread_cpu_s();
                size_t a = piece_start(text, n, k, nt), b = piece_start(text, n, k + 1, nt);
                struct l3d_encoder *e = l3d_encoder_init(t);
                struct l3d_ids ids = {0};
                l3d_encoder_encode(e, text + a, b - a, &ids);
                l3d_ids_free(&ids);
                l3d_encoder_free(e);
                cpu[k] = thread_cpu_s() - c0;
            }
            double dt = l3d_time_s() - t0;
            if (dt < best) {
                best = dt;
                memcpy(best_cpu, cpu, sizeof cpu);
            }
        }
        double slowest = 0;
        printf("  encoding:         %.1f MB/s (%d threads; %.3f s, CPU per thread", n / 1e6 / best,
               nt, best);
        for (int k = 0; k < nt; k++) {
            printf(" %.3f", best_cpu[k]);
            slowest = best_cpu[k] > slowest ? best_cpu[k] : slowest;
        }
        printf(" s: %.1f MB/s with a core per thread)\n", n / 1e6 / slowest);
    }
    double load[3];
    if (getloadavg(load, 3) == 3) printf("  load average:     %.2f %.2f %.2f\n", load[0], load[1], load[2]);
    free(text);
    l3d_tokenizer_free(t);
    return 0;
}
