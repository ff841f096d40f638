/* llm3d generate: sample from a checkpoint. Byte-level vocabularies are decoded to text; others
 * print token ids until the tokenizer lands. Each new token re-runs the forward pass over the
 * sequence so far (the KV cache comes with issue "tokenizer"). */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "llm3d/ckpt.h"
#include "llm3d/model.h"

struct cand {
    float p;
    int id;
};

static int cmp_cand(const void *a, const void *b) {
    float x = ((const struct cand *)a)->p, y = ((const struct cand *)b)->p;
    return (x < y) - (x > y);
}

/* Samples from logits (V) with temperature and top-k (0 = all); cand is scratch of V entries. */
static int sample(const float *logits, int V, float temperature, int top_k, struct cand *cand,
                  l3d_rng *rng) {
    if (temperature <= 0.0f) {
        int best = 0;
        for (int i = 1; i < V; i++)
            if (logits[i] > logits[best]) best = i;
        return best;
    }
    float mx = logits[0];
    for (int i = 1; i < V; i++) mx = logits[i] > mx ? logits[i] : mx;
    for (int i = 0; i < V; i++) cand[i] = (struct cand){expf((logits[i] - mx) / temperature), i};
    int n = V;
    if (top_k > 0 && top_k < V) {
        qsort(cand, (size_t)V, sizeof *cand, cmp_cand);
        n = top_k;
    }
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += cand[i].p;
    double r = l3d_rng_next_float(rng) * sum, acc = 0.0;
    for (int i = 0; i < n; i++) {
        acc += cand[i].p;
        if (r < acc) return cand[i].id;
    }
    return cand[n - 1].id;
}

int l3d_cli_generate(int argc, char **argv) {
    static const struct option opts[] = {
        {"checkpoint", required_argument, NULL, 'c'}, {"prompt", required_argument, NULL, 'p'},
        {"max-tokens", required_argument, NULL, 'n'}, {"temperature", required_argument, NULL, 't'},
        {"top-k", required_argument, NULL, 'k'}, {"seed", required_argument, NULL, 's'},
        {"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0},
    };
    const char *ckpt = NULL, *prompt = "";
    int max_tokens = 200, top_k = 40, ok = 1, c;
    float temperature = 0.8f;
    uint64_t seed = 42;
    optind = 1;
    while (ok && (c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'c': ckpt = optarg; break;
        case 'p': prompt = optarg; break;
        case 'n': ok = l3d_arg_int("generate", "max-tokens", optarg, 1, 1 << 20, &max_tokens); break;
        case 't': ok = l3d_arg_float("generate", "temperature", optarg, 0, 100, &temperature); break;
        case 'k': ok = l3d_arg_int("generate", "top-k", optarg, 0, 1 << 30, &top_k); break;
        case 's': ok = l3d_arg_u64("generate", "seed", optarg, &seed); break;
        case 'h':
            printf("usage: llm3d generate --checkpoint FILE [--prompt TEXT] [--max-tokens N (200)]\n"
                   "       [--temperature T (0.8; 0 = greedy)] [--top-k K (40; 0 = all)] [--seed S]\n");
            return 0;
        default: return 2;
        }
    }
    if (!ok) return 2;
    if (!ckpt) {
        fprintf(stderr, "llm3d generate: give --checkpoint FILE (an llm.c GPT-2 checkpoint, e.g. "
                "the model.bin that llm3d train --out writes)\n");
        return 2;
    }
    struct l3d_gpt_config cfg;
    if (l3d_ckpt_read_llmc_config(ckpt, &cfg) != L3D_OK) {
        fprintf(stderr, "llm3d generate: %s\n", l3d_error_message());
        return 1;
    }
    bool bytes = cfg.V == 256;
    int plen = (int)strlen(prompt);
    if (!bytes && plen > 0) {
        fprintf(stderr, "llm3d generate: this checkpoint's vocabulary has %d tokens; text prompts "
                "need the byte-level vocabulary (256) until the BPE tokenizer lands\n", cfg.V);
        return 2;
    }
    int T = plen + max_tokens < cfg.maxT ? plen + max_tokens : cfg.maxT;
    if (T < 2) T = 2;
    struct l3d_backend *be = l3d_backend_cpu_init();
    struct l3d_shard sh = l3d_shard_full(&cfg);
    struct l3d_gpt *m;
    if (l3d_gpt_init(&m, &cfg, &sh, be, 1, T, L3D_GRADS_NONE) != L3D_OK || l3d_ckpt_load_llmc(ckpt, m) != L3D_OK) {
        fprintf(stderr, "llm3d generate: %s\n", l3d_error_message());
        l3d_backend_free(be);
        return 1;
    }
    int32_t *seq = calloc((size_t)(plen + max_tokens + 1), sizeof(int32_t));
    struct cand *cand = malloc((size_t)cfg.V * sizeof *cand);
    int n = 0;
    if (plen == 0) seq[n++] = bytes ? '\n' : 0; /* start from a newline (or token 0) */
    for (int i = 0; i < plen; i++) seq[n++] = (unsigned char)prompt[i];
    fputs(prompt, stdout);
    l3d_rng rng;
    l3d_rng_seed(&rng, seed);
    for (int i = 0; i < max_tokens; i++) {
        int start = n > T ? n - T : 0, len = n - start; /* slide the window past the context */
        l3d_gpt_forward(m, seq + start, NULL, 1, len);
        const float *row = m->logits + (int64_t)(len - 1) * sh.vocab_count;
        int tok = sample(row, cfg.V, temperature, top_k, cand, &rng);
        seq[n++] = tok;
        if (bytes)
            putchar(tok);
        else
            printf("%d ", tok);
        fflush(stdout);
    }
    putchar('\n');
    free(seq);
    free(cand);
    l3d_gpt_free(m);
    l3d_backend_free(be);
    return 0;
}
