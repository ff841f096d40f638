/* llm3d generate: sample text from a checkpoint, token by token, printed as it comes.
 *
 * The prompt is encoded with the tokenizer (bytes for a 256-token vocabulary, else a BPE
 * tokenizer, gpt2 by default for GPT-2's 50257) after an end-of-text token, as every document
 * starts in prepared data. Each new token costs one position through the KV cache
 * (include/llm3d/infer.h); --no-kv-cache re-runs the full forward over the sequence instead (the
 * reference the cache is measured against). Past the context, both read the same window of the
 * sequence (window_start): when it would exceed the context it slides to the last half of the
 * context, which is run again from position 0 (the KV path re-fills its cache once), and grows by
 * one token a step until the next slide. A model with learned absolute positions (GPT-2's wpe)
 * sees each window's tokens at positions 0.., so the cached and the recomputed paths compute the
 * same thing for every token, at the cache's speed between slides (one slide per context/2
 * tokens). A recompute over the last `context` tokens at every token would change the positions of
 * every cached key each step: no cache could follow it. A mixture of experts runs in one process
 * (a checkpoint trained with --ep loads whole) and routes dropless, whatever capacity factor it
 * was trained with. Sampling: logits / temperature, then
 * the top-k most likely, then the smallest set of those whose probability reaches top-p (Holtzman
 * et al. 2020, nucleus sampling), renormalised; temperature 0 is greedy. Generation stops after
 * --max-tokens or at an end-of-text token. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "llm3d/ckpt.h"
#include "llm3d/hf.h"
#include "llm3d/infer.h"
#include "llm3d/model.h"
#include "llm3d/runtime.h"
#include "llm3d/spec.h"
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

/* The model of an llm.c file or a Hugging Face folder in precision dt: loaded into an fp32 view (a staging buffer of the
 * device for a 16-bit model), then rounded to dt. */
static l3d_status load_model(const char *ckpt, struct l3d_gpt *m) {
    if (m->dt == L3D_F32) return l3d_model_file_load(ckpt, m);
    size_t bytes = (size_t)m->num_params * sizeof(float);
    float *p32 = l3d_be_alloc(m->be, bytes, "fp32 weights staging");
    if (!p32)
        return l3d_error(L3D_ERR_OOM, "cannot allocate %.2f GiB to stage %s's fp32 weights",
                         bytes / 1073741824.0, ckpt);
    struct l3d_gpt view;
    l3d_gpt_fp32_view(m, p32, &view);
    l3d_status st = l3d_model_file_load(ckpt, &view);
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

/* Encodes the prompt after the token documents start with (--doc-token; none when the vocabulary
 * has neither). */
static int encode_prompt(const struct l3d_tokenizer *tok, const char *spec, const char *prompt,
                         enum l3d_doc_token mode, struct l3d_ids *ids) {
    if (!tok) { /* bytes */
        if (mode != L3D_DOC_AUTO) {
            fprintf(stderr, "llm3d generate: --doc-token applies to BPE tokenizers, not bytes\n");
            return 2;
        }
        if (!*prompt) l3d_ids_push(ids, '\n');
        for (const char *p = prompt; *p; p++) l3d_ids_push(ids, (unsigned char)*p);
        return 0;
    }
    int start = l3d_doc_token_id("generate", tok, spec, mode);
    if (start == -2) return 2;
    if (start >= 0) l3d_ids_push(ids, start);
    if (*prompt) {
        if (!l3d_tokenizer_can_encode(tok)) {
            fprintf(stderr, "llm3d generate: llm.c's tokenizer file decodes only: give --tokenizer "
                    "gpt2 or a directory with encoder.json and vocab.bpe to use a --prompt\n");
            return 2;
        }
        struct l3d_encoder *e = l3d_encoder_init(tok);
        l3d_status st = l3d_encoder_encode(e, prompt, strlen(prompt), ids);
        l3d_encoder_free(e);
        if (st != L3D_OK) return l3d_cli_failed("generate: the prompt");
    } else if (ids->n == 0) {
        l3d_ids_push(ids, 0);
    }
    return 0;
}

/* ---- the flags ------------------------------------------------------------------------------ */

struct gen_opts {
    const char *ckpt, *prompt, *tokspec, *backend;
    int max_tokens, threads;
    enum l3d_doc_token doc_token;
    bool no_cache;      /* --no-kv-cache: the full forward over the window for every token */
    bool force_balance; /* --moe-force-balance: the training's fixed routing (benchmarks) */
    enum l3d_dtype dt;  /* --precision's parameters and activations */
    uint64_t seed;
    struct sampler smp; /* temperature, top-k, top-p; its candidates are the loop's */
};

enum {
    G_CKPT, G_TOK, G_PROMPT, G_MAX, G_TEMP, G_TOPK, G_TOPP, G_SEED, G_NO_CACHE, G_OLD_RECOMPUTE,
    G_THREADS, G_BACKEND, G_PREC, G_DOCTOK, G_FORCE,
};

static const struct l3d_flag model_flags[] = {
    {"checkpoint", "PATH", G_CKPT, "an llm.c GPT-2 checkpoint, fp32 or bf16 (llm3d train --out "
                                   "writes model.bin; llm3d convert writes one from a training "
                                   "checkpoint), or a Hugging Face folder (config.json + "
                                   "model.safetensors: train --out writes one too)"},
    {"init-from", "PATH", G_CKPT, "the same (train's and bench's spelling)"},
    {"tokenizer", "SPEC", G_TOK, L3D_TOKENIZER_SPEC_HELP " (no --prompt then). Default: bytes "
                                 "for a 256-token vocabulary, gpt2 for 50257"},
    {NULL, NULL, 0, NULL},
};
static const struct l3d_flag sample_flags[] = {
    {"prompt", "TEXT", G_PROMPT, "text to continue (default: none, a new document)"},
    {"doc-token", "auto|eot|bot", G_DOCTOK, "the token the prompt starts with, as prepare "
                                            "--doc-token started the training documents: "
                                            "end-of-text (eot) or begin-of-text (bot); auto (the "
                                            "default): bot where the tokenizer has one (Llama 3), "
                                            "else eot"},
    {"max-tokens", "N", G_MAX, "tokens to generate (200)"},
    {"temperature", "T", G_TEMP, "0 = greedy (0.8)"},
    {"top-k", "K", G_TOPK, "sample among the K most likely, 0 = all (40)"},
    {"top-p", "P", G_TOPP, "then among the fewest whose probability reaches P, 1 = all (1)"},
    {"seed", "S", G_SEED, "sampling seed (42)"},
    {NULL, NULL, 0, NULL},
};
static const struct l3d_flag run_flags[] = {
    {"no-kv-cache", NULL, G_NO_CACHE, "re-run the window (the same tokens the cache holds) for "
                                      "each token instead of the KV cache: the reference the "
                                      "cache is checked against"},
    {"recompute", NULL, G_OLD_RECOMPUTE, NULL},
    {"moe-force-balance", NULL, G_FORCE, "route as train --moe-force-balance does (benchmarking "
                                         "only): position t's experts fixed, not the router's "
                                         "top-k"},
    {"threads", "N", G_THREADS, "OpenMP threads (1: a step is one row per matrix, where more "
                                "threads mostly wait on each other and on memory)"},
    {"backend", "NAME", G_BACKEND, "the device: cpu, check (the CPU kernels on a checked "
                                   "device arena, for tests; slower), or cuda in a build with "
                                   "-DL3D_CUDA=ON (experimental: it has not yet run on a GPU) "
                                   "(default: $L3D_BACKEND, else cpu)"},
    {"precision", "P", G_PREC, "fp32 (default), bf16 or fp16: the weights rounded to 16 bits and "
                               "16-bit activations and KV cache, fp32 arithmetic (half the "
                               "cache's memory)"},
    {NULL, NULL, 0, NULL},
};

static void usage(FILE *f) {
    fprintf(f,
        "usage: llm3d generate --checkpoint FILE [flags]\n"
        "\n"
        "Prints the prompt, then each token as it is sampled, until --max-tokens or an\n"
        "end-of-text token; one line on stderr says how many tokens and how fast.\n"
        "\n");
}

static int set_gen(void *ctx, const char *cmd, int id, const char *v) {
    struct gen_opts *o = ctx;
    struct sampler *s = &o->smp;
    switch (id) {
    case G_CKPT: o->ckpt = v; return 1;
    case G_TOK: o->tokspec = v; return 1;
    case G_PROMPT: o->prompt = v; return 1;
    case G_DOCTOK: return l3d_arg_doc_token(cmd, v, &o->doc_token);
    case G_MAX: return l3d_arg_int(cmd, "max-tokens", v, 1, 1 << 20, &o->max_tokens);
    case G_TEMP: return l3d_arg_float(cmd, "temperature", v, 0, 100, &s->temperature);
    case G_TOPK: return l3d_arg_int(cmd, "top-k", v, 0, 1 << 30, &s->top_k);
    case G_TOPP: return l3d_arg_float(cmd, "top-p", v, 1e-6, 1, &s->top_p);
    case G_SEED: return l3d_arg_u64(cmd, "seed", v, &o->seed);
    case G_NO_CACHE: o->no_cache = true; return 1;
    case G_OLD_RECOMPUTE:
        /* train's and plan's --recompute MODE is activation recomputation: one name, one meaning */
        fprintf(stderr, "llm3d %s: --recompute is now --no-kv-cache (--recompute MODE is train's "
                "activation recomputation): give --no-kv-cache\n", cmd);
        return 0;
    case G_THREADS: return l3d_arg_int(cmd, "threads", v, 1, 4096, &o->threads);
    case G_BACKEND: o->backend = v; return 1;
    case G_PREC: return l3d_arg_precision(cmd, v, &o->dt);
    case G_FORCE: o->force_balance = true; return 1;
    }
    return 0;
}

/* Fills o from the flags: -1 to go on, else the exit status (0 after --help). */
static int gen_flags(int argc, char **argv, struct gen_opts *o) {
    *o = (struct gen_opts){.prompt = "", .max_tokens = 200, .threads = 1, .dt = L3D_F32,
                           .seed = 42,
                           .smp = {.temperature = 0.8f, .top_p = 1.0f, .top_k = 40}};
    const struct l3d_flag_group g[] = {
        {NULL, model_flags, set_gen, o},
        {"sampling", sample_flags, set_gen, o},
        {"run", run_flags, set_gen, o},
    };
    int rc = l3d_flags_parse("generate", argc, argv, g, 3, usage, NULL);
    if (rc >= 0) return rc;
    if (!o->ckpt) {
        fprintf(stderr, "llm3d generate: give --checkpoint FILE (an llm.c GPT-2 checkpoint, e.g. "
                "the model.bin that llm3d train --out writes)\n");
        return 2;
    }
    omp_set_num_threads(o->threads);
    return -1;
}

/* ---- the model and the tokenizer ------------------------------------------------------------ */

/* What a generation holds; everything NULL (or empty) until made. */
struct gen {
    struct l3d_model_spec cfg;
    struct l3d_tokenizer *tok; /* NULL: bytes */
    struct l3d_runtime *rt;
    struct l3d_gpt *m;
    struct l3d_infer *inf;     /* NULL with --no-kv-cache */
    struct l3d_ids seq;        /* the prompt's tokens, then the generated ones */
};

/* The tokenizer of --tokenizer, or the default for the checkpoint's vocabulary, which it must
 * match: 0, or the exit status after one line. */
static int gen_tokenizer(const struct gen_opts *o, struct gen *g) {
    const char *spec = o->tokspec;
    int V = g->cfg.V;
    if (!spec) {
        if (V != 256 && V != 50257) {
            fprintf(stderr, "llm3d generate: %s has a vocabulary of %d tokens: give --tokenizer, "
                    "the directory of the tokenizer its data was prepared with\n", o->ckpt, V);
            return 2;
        }
        spec = V == 256 ? "bytes" : "gpt2";
    }
    if (strcmp(spec, "bytes") == 0) {
        if (V == 256) return 0;
        fprintf(stderr, "llm3d generate: --tokenizer bytes needs a 256-token vocabulary; %s has "
                "%d\n", o->ckpt, V);
        return 2;
    }
    if (l3d_tokenizer_open(&g->tok, spec) != L3D_OK) return l3d_cli_failed("generate");
    if (l3d_tokenizer_vocab_size(g->tok) != V) {
        fprintf(stderr, "llm3d generate: tokenizer %s has %d tokens but %s was trained on %d: give "
                "the tokenizer its data was prepared with\n", spec,
                l3d_tokenizer_vocab_size(g->tok), o->ckpt, V);
        return 2;
    }
    return 0;
}

/* The checkpoint's model on the backend, in --precision, with a KV cache unless --no-kv-cache;
 * the tokenizer and the prompt's tokens before it. 0, or the exit status after one line. */
static int gen_open(const struct gen_opts *o, struct gen *g, int *argc, char ***argv) {
    if (l3d_model_file_config(o->ckpt, &g->cfg) != L3D_OK) return l3d_cli_failed("generate");
    if (o->force_balance && g->cfg.moe.experts == 0) {
        fprintf(stderr, "llm3d generate: --moe-force-balance: %s is a dense model (no experts, "
                "no router to force); drop the flag\n", o->ckpt);
        return 2;
    }
    int rc = gen_tokenizer(o, g);
    if (rc == 0)
        rc = encode_prompt(g->tok, o->tokspec ? o->tokspec : "gpt2", o->prompt, o->doc_token,
                           &g->seq);
    if (rc != 0) return rc;
    struct l3d_runtime_opts ro = {.cmd = "generate", .no_world = true, .backend = o->backend};
    if (l3d_runtime_init(argc, argv, &ro, &g->rt) != L3D_OK) return 1; /* said there */
    /* a mixture of experts routes dropless at inference, as Hugging Face's Mixtral does: the
     * full forward of --no-kv-cache as the cache's (a capacity would drop a prompt's
     * assignments that a one-token step keeps) */
    g->cfg.moe.capacity_factor = 0.0;
    g->cfg.moe.force_balance = o->force_balance;
    struct l3d_shard sh = l3d_shard_full(&g->cfg);
    sh.xent_rows = 1; /* --no-kv-cache samples the last row's logits only: one row of them */
    if (l3d_gpt_init_dt(&g->m, &g->cfg, &sh, g->rt->be, 1, o->no_cache ? g->cfg.maxT : 1,
                        L3D_GRADS_NONE, 1, L3D_RECOMPUTE_NONE, o->dt) != L3D_OK ||
        load_model(o->ckpt, g->m) != L3D_OK ||
        (!o->no_cache && l3d_infer_init(&g->inf, g->m) != L3D_OK)) {
        fprintf(stderr, "llm3d generate: %s\n", l3d_error_message());
        return 1;
    }
    return 0;
}

static void gen_close(struct gen *g) {
    l3d_ids_free(&g->seq);
    l3d_infer_free(g->inf);
    l3d_gpt_free(g->m);
    l3d_runtime_free(g->rt);
    l3d_tokenizer_free(g->tok);
}

/* ---- the generation loop -------------------------------------------------------------------- */

/* Where the loop stands in the sequence, and its buffers. */
struct gen_step {
    int64_t w, fed; /* the window's first token; the tokens of the sequence in the KV cache */
    float *host;    /* Vp floats: the recomputed last logits row on the host */
    void *row32;    /* a 16-bit model's last logits row widened on the device (recompute) */
};

/* The logits of the token after the sequence, through the KV cache or (--no-kv-cache) a forward
 * over the window; both read the same window. */
static const float *next_logits(const struct gen_opts *o, struct gen *g, struct gen_step *s) {
    const struct l3d_model_spec *cfg = &g->cfg;
    int64_t w_next = window_start(s->w, g->seq.n, cfg->maxT);
    if (!o->no_cache) {
        if (w_next != s->w) { /* the window slid: its tokens again from position 0 */
            l3d_infer_reset(g->inf);
            s->w = s->fed = w_next;
        }
        const float *logits = l3d_infer_step(g->inf, g->seq.v + s->fed, (int)(g->seq.n - s->fed));
        s->fed = g->seq.n;
        return logits;
    }
    s->w = w_next;
    int64_t len = g->seq.n - s->w;
    l3d_gpt_forward(g->m, g->seq.v + s->w, NULL, 1, (int)len);
    /* the logits of the last row only (a chunk of one row, l3d_gpt_xent_rows) */
    const void *row = (const char *)g->m->logits +
                      (len - 1 - g->m->logits_row0) * (int64_t)cfg->Vp * g->m->es;
    if (s->row32) {
        l3d_be_convert(g->rt->be, L3D_F32, s->row32, o->dt, row, cfg->Vp);
        row = s->row32;
    }
    l3d_be_copy_d2h(g->rt->be, s->host, row, (size_t)cfg->Vp * sizeof(float));
    return s->host;
}

/* Token t's text on stdout, at once. */
static void print_token(const struct gen *g, int t) {
    size_t len = 1;
    unsigned char b = (unsigned char)t;
    const unsigned char *bytes = g->tok ? l3d_tokenizer_token(g->tok, t, &len) : &b;
    fwrite(bytes, 1, len, stdout);
    fflush(stdout);
}

/* The speed, and the prompt's length and first token (the --doc-token a BPE prompt starts with). */
static void print_summary(const struct gen_opts *o, const struct gen *g, int64_t prompt,
                          int generated, double secs) {
    putchar('\n');
    fprintf(stderr, "llm3d generate: %d tokens in %.2f s (%.1f tokens/s, %s, %s) after a prompt of "
            "%lld tokens", generated, secs, secs > 0 ? generated / secs : 0.0,
            o->no_cache ? "recomputed" : "KV cache", l3d_dtype_name(o->dt), (long long)prompt);
    if (g->tok && prompt > 0) {
        size_t len;
        const unsigned char *b = l3d_tokenizer_token(g->tok, g->seq.v[0], &len);
        fprintf(stderr, " starting with %.*s", (int)len, (const char *)b);
    }
    fputc('\n', stderr);
}

/* Samples up to --max-tokens tokens after the prompt, printing each; stops at end-of-text. */
static void gen_loop(const struct gen_opts *o, struct gen *g) {
    struct sampler smp = o->smp;
    smp.cand = malloc((size_t)g->cfg.V * sizeof *smp.cand);
    l3d_rng_seed(&smp.rng, o->seed);
    struct gen_step s = {.host = malloc((size_t)g->cfg.Vp * sizeof(float))};
    if (o->no_cache && o->dt != L3D_F32)
        s.row32 = l3d_be_alloc(g->rt->be, (size_t)g->cfg.Vp * sizeof(float), "logits row");
    int eot = g->tok ? l3d_tokenizer_eot(g->tok) : -1;
    fputs(o->prompt, stdout);
    fflush(stdout);
    double t0 = l3d_time_s();
    int64_t prompt = g->seq.n;
    int generated = 0;
    for (; generated < o->max_tokens; generated++) {
        int t = sample(&smp, next_logits(o, g, &s), g->cfg.V);
        if (t == eot) break;
        l3d_ids_push(&g->seq, t);
        print_token(g, t);
    }
    print_summary(o, g, prompt, generated, l3d_time_s() - t0);
    free(smp.cand);
    free(s.host);
    if (s.row32) l3d_be_free(g->rt->be, s.row32);
}

/* ---- the command ---------------------------------------------------------------------------- */

int l3d_cli_generate(int argc, char **argv) {
    struct gen_opts o;
    int rc = gen_flags(argc, argv, &o);
    if (rc >= 0) return rc;
    struct gen g = {0};
    rc = gen_open(&o, &g, &argc, &argv);
    if (rc == 0) gen_loop(&o, &g);
    gen_close(&g);
    return rc;
}
