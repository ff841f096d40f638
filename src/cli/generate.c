/* llm3d generate: sample text from a checkpoint, token by token, printed as it comes.
 *
 * The prompt is encoded with the tokenizer (bytes for a 256-token vocabulary, else a BPE
 * tokenizer, gpt2 by default for GPT-2's 50257) after an end-of-text token, as every document
 * starts in prepared data. Each new token costs one position through the KV cache
 * (include/llm3d/infer.h); --recompute re-runs the full forward over the sequence instead (the
 * reference the cache is measured against). Past the context, both read the same window of the
 * sequence (window_start): when it would exceed the context it slides to the last half of the
 * context, which is run again from position 0 (the KV path re-fills its cache once), and grows by
 * one token a step until the next slide. A model with learned absolute positions (GPT-2's wpe)
 * sees each window's tokens at positions 0.., so the cached and the recomputed paths compute the
 * same thing for every token, at the cache's speed between slides (one slide per context/2
 * tokens). A recompute over the last `context` tokens at every token would change the positions of
 * every cached key each step: no cache could follow it. Sampling: logits / temperature, then
 * the top-k most likely, then the smallest set of those whose probability reaches top-p (Holtzman
 * et al. 2020, nucleus sampling), renormalised; temperature 0 is greedy. Generation stops after
 * --max-tokens or at an end-of-text token. */
#include <getopt.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "llm3d/ckpt.h"
#include "llm3d/infer.h"
#include "llm3d/model.h"
#include "llm3d/runtime.h"
#include "llm3d/tokenizer.h"

struct cand {
    float p;
    int id;
};

static int cmp_cand(const void *a, const void *b) {
    float x = ((const struct cand *)a)->p, y = ((const struct cand *)b)->p;
    if (x != y) return (x < y) - (x > y);
    return ((const struct cand *)a)->id - ((const struct cand *)b)->id;
}

struct sampler {
    float temperature, top_p;
    int top_k;
    struct cand *cand; /* V entries */
    l3d_rng rng;
};

/* Samples one of the V logits. */
static int sample(struct sampler *s, const float *logits, int V) {
    if (s->temperature <= 0.0f) {
        int best = 0;
        for (int i = 1; i < V; i++)
            if (logits[i] > logits[best]) best = i;
        return best;
    }
    float mx = logits[0];
    for (int i = 1; i < V; i++) mx = logits[i] > mx ? logits[i] : mx;
    double sum = 0.0;
    for (int i = 0; i < V; i++) {
        s->cand[i] = (struct cand){expf((logits[i] - mx) / s->temperature), i};
        sum += s->cand[i].p;
    }
    int n = V;
    if ((s->top_k > 0 && s->top_k < V) || s->top_p < 1.0f) {
        qsort(s->cand, (size_t)V, sizeof *s->cand, cmp_cand);
        if (s->top_k > 0 && s->top_k < V) n = s->top_k;
        double kept = 0.0;
        for (int i = 0; i < n; i++) kept += s->cand[i].p;
        if (s->top_p < 1.0f) {
            double acc = 0.0;
            int m = 0;
            while (m < n && acc < s->top_p * kept) acc += s->cand[m++].p;
            n = m > 0 ? m : 1;
            kept = acc > 0.0 ? acc : s->cand[0].p;
        }
        sum = kept;
    }
    double r = l3d_rng_next_float(&s->rng) * sum, acc = 0.0;
    for (int i = 0; i < n; i++) {
        acc += s->cand[i].p;
        if (r < acc) return s->cand[i].id;
    }
    return s->cand[n - 1].id;
}

static void usage(FILE *fp) {
    fprintf(fp,
            "usage: llm3d generate --checkpoint FILE [flags]\n"
            "  --checkpoint FILE   an llm.c GPT-2 checkpoint (llm3d train --out writes model.bin)\n"
            "  --tokenizer SPEC    bytes, gpt2, a directory with encoder.json + vocab.bpe (llm3d\n"
            "                      tokenizer train), or llm.c's gpt2_tokenizer.bin (decoding\n"
            "                      only: no --prompt). Default: bytes for a 256-token vocabulary,\n"
            "                      gpt2 for 50257\n"
            "  --prompt TEXT       text to continue (default: none, a new document)\n"
            "  --max-tokens N      tokens to generate (200)\n"
            "  --temperature T     0 = greedy (0.8)\n"
            "  --top-k K           sample among the K most likely, 0 = all (40)\n"
            "  --top-p P           then among the fewest whose probability reaches P, 1 = all (1)\n"
            "  --seed S            sampling seed (42)\n"
            "  --recompute         no KV cache: re-run the window (the same tokens the cache\n"
            "                      holds) for each token\n"
            "  --threads N         OpenMP threads (1: a step is one row per matrix, where more\n"
            "                      threads mostly wait on each other and on memory)\n"
            "  --backend NAME      the device: cpu, or check (the CPU kernels on a checked device\n"
            "                      arena, for tests; slower) (default: $L3D_BACKEND, else cpu)\n"
            "  --precision P       fp32 (default), bf16 or fp16: the weights rounded to 16 bits\n"
            "                      and 16-bit activations and KV cache, fp32 arithmetic (half the\n"
            "                      cache's memory)\n");
}

/* The model of an llm.c file in precision dt: loaded into an fp32 view (a staging buffer of the
 * device for a 16-bit model), then rounded to dt. */
static l3d_status load_model(const char *ckpt, struct l3d_gpt *m) {
    if (m->dt == L3D_F32) return l3d_ckpt_load_llmc(ckpt, m);
    size_t bytes = (size_t)m->num_params * sizeof(float);
    float *p32 = l3d_be_alloc(m->be, bytes, "fp32 weights staging");
    if (!p32)
        return l3d_error(L3D_ERR_OOM, "cannot allocate %.2f GiB to stage %s's fp32 weights",
                         bytes / 1073741824.0, ckpt);
    struct l3d_gpt view;
    l3d_gpt_fp32_view(m, p32, &view);
    l3d_status st = l3d_ckpt_load_llmc(ckpt, &view);
    if (st == L3D_OK) l3d_be_convert(m->be, m->dt, m->params, L3D_F32, p32, m->num_params);
    l3d_be_sync(m->be);
    l3d_be_free(m->be, p32);
    return st;
}

/* The first token of the window the next step reads, given the previous window start w and the
 * sequence length n: w while the window fits the context maxT, else the last maxT/2 tokens. */
static int64_t window_start(int64_t w, int64_t n, int64_t maxT) {
    return n - w > maxT ? n - maxT / 2 : w;
}

/* Encodes the prompt after an end-of-text token (when the vocabulary has one). */
static int encode_prompt(const struct l3d_tokenizer *tok, const char *prompt, struct l3d_ids *ids) {
    if (!tok) { /* bytes */
        if (!*prompt) l3d_ids_push(ids, '\n');
        for (const char *p = prompt; *p; p++) l3d_ids_push(ids, (unsigned char)*p);
        return 0;
    }
    if (l3d_tokenizer_eot(tok) >= 0) l3d_ids_push(ids, l3d_tokenizer_eot(tok));
    if (*prompt) {
        if (!l3d_tokenizer_can_encode(tok)) {
            fprintf(stderr, "llm3d generate: llm.c's tokenizer file decodes only: give --tokenizer "
                    "gpt2 or a directory with encoder.json and vocab.bpe to use a --prompt\n");
            return 2;
        }
        struct l3d_encoder *e = l3d_encoder_init(tok);
        l3d_encoder_encode(e, prompt, strlen(prompt), ids);
        l3d_encoder_free(e);
    } else if (ids->n == 0) {
        l3d_ids_push(ids, 0);
    }
    return 0;
}

int l3d_cli_generate(int argc, char **argv) {
    enum { O_TOPP = 256, O_TOK, O_RECOMPUTE, O_THREADS, O_BACKEND, O_PRECISION };
    static const struct option opts[] = {
        {"checkpoint", required_argument, NULL, 'c'}, {"prompt", required_argument, NULL, 'p'},
        {"max-tokens", required_argument, NULL, 'n'}, {"temperature", required_argument, NULL, 't'},
        {"top-k", required_argument, NULL, 'k'}, {"top-p", required_argument, NULL, O_TOPP},
        {"seed", required_argument, NULL, 's'}, {"tokenizer", required_argument, NULL, O_TOK},
        {"recompute", no_argument, NULL, O_RECOMPUTE}, {"threads", required_argument, NULL, O_THREADS},
        {"backend", required_argument, NULL, O_BACKEND}, {"help", no_argument, NULL, 'h'},
        {"precision", required_argument, NULL, O_PRECISION},
        {NULL, 0, NULL, 0},
    };
    const char *ckpt = NULL, *prompt = "", *tokspec = NULL;
    int max_tokens = 200, threads = 1, ok = 1, c;
    bool recompute = false;
    enum l3d_dtype dt = L3D_F32;
    uint64_t seed = 42;
    struct sampler smp = {.temperature = 0.8f, .top_p = 1.0f, .top_k = 40};
    struct l3d_runtime_opts ro = {.cmd = "generate", .no_world = true};
    optind = 1;
    while (ok && (c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'c': ckpt = optarg; break;
        case 'p': prompt = optarg; break;
        case O_TOK: tokspec = optarg; break;
        case O_RECOMPUTE: recompute = true; break;
        case 'n': ok = l3d_arg_int("generate", "max-tokens", optarg, 1, 1 << 20, &max_tokens); break;
        case 't': ok = l3d_arg_float("generate", "temperature", optarg, 0, 100, &smp.temperature); break;
        case 'k': ok = l3d_arg_int("generate", "top-k", optarg, 0, 1 << 30, &smp.top_k); break;
        case O_TOPP: ok = l3d_arg_float("generate", "top-p", optarg, 1e-6, 1, &smp.top_p); break;
        case 's': ok = l3d_arg_u64("generate", "seed", optarg, &seed); break;
        case O_THREADS: ok = l3d_arg_int("generate", "threads", optarg, 1, 1024, &threads); break;
        case O_BACKEND: ro.backend = optarg; break;
        case O_PRECISION:
            if (strcmp(optarg, "fp32") == 0 || strcmp(optarg, "bf16") == 0 ||
                strcmp(optarg, "fp16") == 0) {
                dt = optarg[0] == 'b' ? L3D_BF16 : optarg[2] == '1' ? L3D_F16 : L3D_F32;
            } else {
                fprintf(stderr, "llm3d generate: --precision '%s': choose fp32, bf16 or fp16\n",
                        optarg);
                ok = 0;
            }
            break;
        case 'h': usage(stdout); return 0;
        default: return 2;
        }
    }
    if (!ok) return 2;
    omp_set_num_threads(threads);
    if (!ckpt) {
        fprintf(stderr, "llm3d generate: give --checkpoint FILE (an llm.c GPT-2 checkpoint, e.g. "
                "the model.bin that llm3d train --out writes)\n");
        return 2;
    }
    struct l3d_model_spec cfg;
    if (l3d_ckpt_read_llmc_config(ckpt, &cfg) != L3D_OK) {
        fprintf(stderr, "llm3d generate: %s\n", l3d_error_message());
        return 1;
    }
    if (!tokspec) {
        if (cfg.V != 256 && cfg.V != 50257) {
            fprintf(stderr, "llm3d generate: %s has a vocabulary of %d tokens: give --tokenizer, "
                    "the directory of the tokenizer its data was prepared with\n", ckpt, cfg.V);
            return 2;
        }
        tokspec = cfg.V == 256 ? "bytes" : "gpt2";
    }
    struct l3d_tokenizer *tok = NULL;
    if (strcmp(tokspec, "bytes") == 0) {
        if (cfg.V != 256) {
            fprintf(stderr, "llm3d generate: --tokenizer bytes needs a 256-token vocabulary; %s "
                    "has %d\n", ckpt, cfg.V);
            return 2;
        }
    } else {
        if (l3d_tokenizer_open(&tok, tokspec) != L3D_OK) {
            fprintf(stderr, "llm3d generate: %s\n", l3d_error_message());
            return 1;
        }
        if (l3d_tokenizer_vocab_size(tok) != cfg.V) {
            fprintf(stderr, "llm3d generate: tokenizer %s has %d tokens but %s was trained on %d: "
                    "give the tokenizer its data was prepared with\n", tokspec,
                    l3d_tokenizer_vocab_size(tok), ckpt, cfg.V);
            l3d_tokenizer_free(tok);
            return 2;
        }
    }
    struct l3d_ids seq = {0};
    int rc = encode_prompt(tok, prompt, &seq);
    struct l3d_runtime *rt = NULL;
    struct l3d_gpt *m = NULL;
    struct l3d_infer *inf = NULL;
    if (rc == 0 && l3d_runtime_init(&argc, &argv, &ro, &rt) != L3D_OK) rc = 1; /* said there */
    if (rc == 0) {
        struct l3d_shard sh = l3d_shard_full(&cfg);
        if (l3d_gpt_init_dt(&m, &cfg, &sh, rt->be, 1, recompute ? cfg.maxT : 1, L3D_GRADS_NONE,
                            1, L3D_RECOMPUTE_NONE, dt) != L3D_OK ||
            load_model(ckpt, m) != L3D_OK || (!recompute && l3d_infer_init(&inf, m) != L3D_OK)) {
            fprintf(stderr, "llm3d generate: %s\n", l3d_error_message());
            rc = 1;
        }
    }
    if (rc != 0) {
        l3d_ids_free(&seq);
        l3d_gpt_free(m);
        l3d_runtime_free(rt);
        l3d_tokenizer_free(tok);
        return rc;
    }
    fputs(prompt, stdout);
    fflush(stdout);
    smp.cand = malloc((size_t)cfg.V * sizeof *smp.cand);
    float *last_logits = malloc((size_t)cfg.Vp * sizeof *last_logits); /* host copy */
    /* a 16-bit model's last logits row, widened on the device (recompute) */
    float *row32 = recompute && dt != L3D_F32
                       ? l3d_be_alloc(rt->be, (size_t)cfg.Vp * sizeof(float), "logits row")
                       : NULL;
    l3d_rng_seed(&smp.rng, seed);
    int eot = tok ? l3d_tokenizer_eot(tok) : -1;
    int64_t fed = 0, w = 0; /* tokens of seq in the KV cache; the window's first token */
    double t0 = l3d_time_s();
    int generated = 0;
    for (; generated < max_tokens; generated++) {
        const float *logits;
        int64_t w_next = window_start(w, seq.n, cfg.maxT);
        if (recompute) {
            w = w_next;
            int64_t len = seq.n - w;
            l3d_gpt_forward(m, seq.v + w, NULL, 1, (int)len);
            const void *row = (const char *)m->logits + (len - 1) * (int64_t)cfg.Vp * m->es;
            if (row32) {
                l3d_be_convert(rt->be, L3D_F32, row32, dt, row, cfg.Vp);
                row = row32;
            }
            l3d_be_copy_d2h(rt->be, last_logits, row, (size_t)cfg.Vp * sizeof(float));
            logits = last_logits;
        } else {
            if (w_next != w) { /* the window slid: its tokens again from position 0 */
                l3d_infer_reset(inf);
                w = fed = w_next;
            }
            logits = l3d_infer_step(inf, seq.v + fed, (int)(seq.n - fed));
            fed = seq.n;
        }
        int t = sample(&smp, logits, cfg.V);
        if (t == eot) break;
        l3d_ids_push(&seq, t);
        size_t len = 1;
        unsigned char b = (unsigned char)t;
        const unsigned char *bytes = tok ? l3d_tokenizer_token(tok, t, &len) : &b;
        fwrite(bytes, 1, len, stdout);
        fflush(stdout);
    }
    double secs = l3d_time_s() - t0;
    putchar('\n');
    fprintf(stderr, "llm3d generate: %d tokens in %.2f s (%.1f tokens/s, %s, %s)\n", generated,
            secs, secs > 0 ? generated / secs : 0.0, recompute ? "recomputed" : "KV cache",
            l3d_dtype_name(dt));
    free(smp.cand);
    free(last_logits);
    if (row32) l3d_be_free(rt->be, row32);
    l3d_ids_free(&seq);
    l3d_infer_free(inf);
    l3d_gpt_free(m);
    l3d_runtime_free(rt);
    l3d_tokenizer_free(tok);
    return 0;
}
