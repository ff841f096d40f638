/* llm3d inspect: what a file or directory is, on one screen (or one JSON object): a token shard,
 * an llm.c GPT-2 checkpoint, a training checkpoint (a step directory, or a checkpoint directory
 * whose `latest` names one) or a run directory (train --out). Everything it prints it has checked:
 * sizes against headers, every rank file's checksum against its manifest, weights finite. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "llm3d/arch.h"
#include "llm3d/ckpt.h"
#include "llm3d/data.h"
#include "llm3d/hf.h"
#include "llm3d/tokenizer.h"

#define FIRST_TOKENS 24

static void usage(FILE *f) {
    fprintf(f,
        "usage: llm3d inspect PATH [--tokenizer SPEC] [--json]\n"
        "\n"
        "Says what PATH is and what it holds, after checking it:\n"
        "  token shard        (llm.c format, magic 20240520): tokens, their range, the first\n"
        "                     tokens (decoded with --tokenizer SPEC, the forms below)\n"
        "  llm.c checkpoint   (magic 20240326): model shape, dtype, parameters; size and\n"
        "                     finiteness of the weights checked\n"
        "  training checkpoint a step directory (holding `manifest`) or a checkpoint directory\n"
        "                     (holding `latest`): step, layout, precision, sizes; every rank\n"
        "                     file's size and checksum verified\n"
        "  run directory      (llm3d train --out): steps and losses of metrics.jsonl, model.bin,\n"
        "                     the latest checkpoint\n"
        "  Hugging Face folder config.json + model.safetensors (or its index): the model and\n"
        "                     every tensor's dtype and shape; shapes checked against the config,\n"
        "                     weights finite\n"
        "  safetensors file   (*.safetensors): every tensor's dtype and shape; offsets, sizes\n"
        "                     and dtypes checked against the file, no overlaps, weights finite\n"
        "Exit status: 0 when PATH is one of these and intact, 1 when it is damaged or unknown\n"
        "(one line on stderr says why), 2 on a usage error.\n"
        "\n");
}

enum { I_TOK, I_JSON };

static const struct l3d_flag inspect_flags[] = {
    {"tokenizer", "SPEC", I_TOK, "decode a token shard's first tokens with it. "
                                 L3D_TOKENIZER_SPEC_HELP},
    {"json", NULL, I_JSON, "one JSON object instead"},
    {NULL, NULL, 0, NULL},
};

struct inspect_opts {
    const char *tokspec;
    bool json;
};

static int set_inspect(void *ctx, const char *cmd, int id, const char *v) {
    struct inspect_opts *o = ctx;
    (void)cmd;
    switch (id) {
    case I_TOK: o->tokspec = v; return 1;
    case I_JSON: o->json = true; return 1;
    }
    return 0;
}

/* ---- output helpers ---------------------------------------------------------------------------- */

/* s[0..n) as a JSON string (quotes included); bytes that are not valid UTF-8 become U+FFFD. */
static void json_str(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    putchar('"');
    for (size_t i = 0; i < n;) {
        unsigned c = p[i];
        int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        bool valid = len > 0 && i + (size_t)len <= n;
        for (int k = 1; valid && k < len; k++) valid = (p[i + (size_t)k] & 0xc0) == 0x80;
        if (!valid) {
            fputs("\\ufffd", stdout);
            i++;
            continue;
        }
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c == '\n') fputs("\\n", stdout);
        else if (c < 0x20 || c == 0x7f) printf("\\u%04x", c);
        else fwrite(p + i, 1, (size_t)len, stdout);
        i += (size_t)len;
    }
    putchar('"');
}

/* s[0..n) on one line: newlines, tabs and other control bytes escaped. */
static void text_str(const char *s, size_t n) {
    putchar('"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n') fputs("\\n", stdout);
        else if (c == '\t') fputs("\\t", stdout);
        else if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c < 0x20 || c == 0x7f) printf("\\x%02x", c);
        else putchar(c);
    }
    putchar('"');
}

static void json_model(const struct l3d_model_spec *c) {
    printf("\"L\":%d,\"C\":%d,\"NH\":%d,\"V\":%d,\"Vp\":%d,\"context\":%d,\"parameters\":%lld", c->L,
           c->C, c->NH, c->V, c->Vp, c->maxT, (long long)l3d_gpt_param_count(c));
}

static void text_model(const struct l3d_model_spec *c) {
    printf("  model:      L=%d C=%d NH=%d V=%d (padded %d) context %d, %.2fM parameters\n", c->L,
           c->C, c->NH, c->V, c->Vp, c->maxT, l3d_gpt_param_count(c) / 1e6);
    if (!l3d_model_is_gpt2(c))
        printf("  blocks:     %s: %d key/value heads of %d, MLP %lld, %s, %s%s\n",
               l3d_arch_name(c->arch), l3d_model_kv_heads(c), l3d_model_head_dim(c),
               (long long)c->ffn,
               c->norm == L3D_NORM_RMSNORM ? "RMSNorm" : "LayerNorm",
               c->pos == L3D_POS_ROPE ? "RoPE" : "learned positions",
               c->qk_norm ? ", QK-norm" : "");
    if (c->moe.experts > 0)
        printf("  experts:    layers %d-%d: %d of width %lld, top-%d%s, %d shared; %.2fM active "
               "parameters a token\n", c->moe.dense_layers, c->L - 1, c->moe.experts,
               (long long)c->moe.ffn, c->moe.top_k, c->moe.norm_topk ? " renormalised" : "",
               c->moe.shared, l3d_model_active_param_count(c) / 1e6);
}

/* ---- token shards -------------------------------------------------------------------------------- */

static int inspect_shard(const char *path, const char *tokspec, bool json) {
    struct l3d_data *d;
    if (l3d_data_open(&d, path, 0) != L3D_OK) {
        fprintf(stderr, "llm3d inspect: %s\n", l3d_error_message());
        return 1;
    }
    int64_t n = l3d_data_file_ntok(d, 0);
    bool wide = l3d_data_file_wide(d, 0);
    int64_t lo = n ? INT64_MAX : 0, hi = 0;
    int32_t buf[4096];
    for (int64_t i = 0; i < n; i += 4096) {
        int64_t m = n - i < 4096 ? n - i : 4096;
        l3d_data_file_read(d, 0, i, m, buf);
        for (int64_t j = 0; j < m; j++) {
            int64_t v = (uint32_t)buf[j];
            lo = v < lo ? v : lo;
            hi = v > hi ? v : hi;
        }
    }
    int64_t k = n < FIRST_TOKENS ? n : FIRST_TOKENS;
    int32_t ids[FIRST_TOKENS];
    l3d_data_file_read(d, 0, 0, k, ids);
    char *text = NULL;
    size_t cap = 0, len = 0;
    int rc = 0;
    if (tokspec) {
        struct l3d_tokenizer *t = NULL;
        if (strcmp(tokspec, "bytes") == 0) {
            if (hi > 255) {
                fprintf(stderr, "llm3d inspect: %s holds token %lld, beyond the 256 of "
                        "--tokenizer bytes: give the tokenizer it was prepared with\n", path,
                        (long long)hi);
                rc = 2;
            }
            text = malloc((size_t)k + 1);
            for (int64_t i = 0; i < k; i++) text[i] = (char)ids[i];
            len = (size_t)k;
        } else if (l3d_tokenizer_open(&t, tokspec) != L3D_OK) {
            fprintf(stderr, "llm3d inspect: %s\n", l3d_error_message());
            rc = 1;
        } else if (hi >= l3d_tokenizer_vocab_size(t)) {
            fprintf(stderr, "llm3d inspect: %s holds token %lld, beyond the %d of tokenizer %s: "
                    "give the tokenizer it was prepared with\n", path, (long long)hi,
                    l3d_tokenizer_vocab_size(t), tokspec);
            rc = 2;
        } else {
            len = l3d_tokenizer_decode(t, ids, k, &text, &cap);
        }
        l3d_tokenizer_free(t);
    }
    if (rc == 0 && json) {
        printf("{\"kind\":\"token_shard\",\"path\":");
        json_str(path, strlen(path));
        printf(",\"tokens\":%lld,\"token_bits\":%d,\"min_token\":%lld,\"max_token\":%lld,"
               "\"first_tokens\":[", (long long)n, wide ? 32 : 16, (long long)lo, (long long)hi);
        for (int64_t i = 0; i < k; i++) printf("%s%d", i ? "," : "", ids[i]);
        printf("]");
        if (text) {
            printf(",\"first_text\":");
            json_str(text, len);
        }
        printf("}\n");
    } else if (rc == 0) {
        printf("%s: token shard (llm.c format, %s tokens)\n", path, wide ? "uint32" : "uint16");
        printf("  tokens:     %lld, ids %lld..%lld (a vocabulary of at least %lld)\n",
               (long long)n, (long long)lo, (long long)hi, (long long)hi + 1);
        printf("  first ids:  ");
        for (int64_t i = 0; i < k; i++) printf("%s%d", i ? " " : "", ids[i]);
        printf("\n");
        if (text) {
            printf("  decoded:    ");
            text_str(text, len);
            printf(" (--tokenizer %s)\n", tokspec);
        } else {
            printf("  (give --tokenizer SPEC to decode them)\n");
        }
    }
    free(text);
    l3d_data_free(d);
    return rc;
}

/* ---- llm.c checkpoints --------------------------------------------------------------------------- */

struct llmc_info {
    struct l3d_model_spec cfg;
    const char *dtype;
    int64_t bytes, nonfinite;
};

/* Header, size and every weight of an llm.c file (version 3: fp32, 5: bf16, as llm.c writes). */
static l3d_status read_llmc(const char *path, struct llmc_info *info) {
    FILE *f;
    l3d_status ost = l3d_fopen_regular(path, "checkpoint", &f, NULL);
    if (ost != L3D_OK) return ost;
    int32_t hdr[256];
    l3d_status st = L3D_OK;
    size_t es = 4;
    bool arch = false; /* llm3d's versions for other architectures (the header says which) */
    if (fread(hdr, sizeof hdr, 1, f) != 1)
        st = l3d_error(L3D_ERR_FORMAT, "%s: shorter than the 1024-byte llm.c header", path);
    else if ((arch = hdr[1] == L3D_LLMC_VERSION_ARCH_FP32 || hdr[1] == L3D_LLMC_VERSION_ARCH_BF16))
        st = l3d_ckpt_read_llmc_config(path, &info->cfg);
    else if (hdr[1] != 3 && hdr[1] != 5)
        st = l3d_error(L3D_ERR_FORMAT, "%s: llm.c checkpoint version %d; known: 3 (fp32), 5 (bf16), "
                       "llm3d's 1003 and 1005 (other architectures)", path, hdr[1]);
    if (st == L3D_OK && arch) {
        info->dtype = hdr[1] == L3D_LLMC_VERSION_ARCH_FP32 ? "fp32" : "bf16";
        es = hdr[1] == L3D_LLMC_VERSION_ARCH_FP32 ? 4 : 2;
    } else if (st == L3D_OK) {
        info->dtype = hdr[1] == 3 ? "fp32" : "bf16";
        es = hdr[1] == 3 ? 4 : 2;
        info->cfg = (struct l3d_model_spec){.maxT = hdr[2], .V = hdr[3], .L = hdr[4], .NH = hdr[5],
                                            .C = hdr[6]};
        if (l3d_gpt_config_finish(&info->cfg) != L3D_OK || info->cfg.Vp != hdr[7])
            st = l3d_error(L3D_ERR_FORMAT, "%s: header L=%d C=%d NH=%d V=%d Vp=%d context %d is "
                           "not a GPT-2 model", path, hdr[4], hdr[6], hdr[5], hdr[3], hdr[7],
                           hdr[2]);
    }
    struct stat sb;
    if (st == L3D_OK && fstat(fileno(f), &sb) == 0) {
        int64_t want = 1024 + l3d_gpt_param_count(&info->cfg) * (int64_t)es;
        info->bytes = (int64_t)sb.st_size;
        if (info->bytes != want)
            st = l3d_error(L3D_ERR_FORMAT, "%s: %lld bytes, expected %lld for its header's model "
                           "(%s): truncated or damaged", path, (long long)info->bytes,
                           (long long)want, info->dtype);
    }
    enum { CHUNK = 1 << 20 };
    unsigned char *buf = st == L3D_OK ? malloc(CHUNK) : NULL;
    for (size_t k; st == L3D_OK && (k = fread(buf, 1, CHUNK, f)) > 0;)
        for (size_t i = 0; i + es <= k; i += es) {
            if (es == 4) {
                float x;
                memcpy(&x, buf + i, 4);
                info->nonfinite += !isfinite(x);
            } else {
                uint16_t h;
                memcpy(&h, buf + i, 2);
                info->nonfinite += (h & 0x7f80u) == 0x7f80u;
            }
        }
    free(buf);
    fclose(f);
    return st;
}

static void print_llmc(const char *path, const struct llmc_info *m, bool json) {
    if (json) {
        printf("{\"kind\":\"llmc_checkpoint\",\"path\":");
        json_str(path, strlen(path));
        printf(",\"dtype\":\"%s\",", m->dtype);
        json_model(&m->cfg);
        printf(",\"bytes\":%lld,\"non_finite\":%lld}", (long long)m->bytes,
               (long long)m->nonfinite);
        return;
    }
    printf("%s: %s (magic 20240326, %s)\n", path,
           l3d_model_is_gpt2(&m->cfg) ? "llm.c GPT-2 checkpoint"
                                      : "llm3d checkpoint in llm.c's layout, its blocks in the header",
           m->dtype);
    text_model(&m->cfg);
    printf("  size:       %lld bytes, as the header says\n", (long long)m->bytes);
    printf("  weights:    %s\n", m->nonfinite ? "NOT all finite" : "all finite");
}

/* ---- training checkpoints ------------------------------------------------------------------------ */

static void print_ckpt(const char *dir, const struct l3d_ckpt_info *c, bool json) {
    const struct l3d_ckpt_layout *l = &c->layout;
    const struct l3d_ckpt_state *s = &c->state;
    if (json) {
        printf("{\"kind\":\"training_checkpoint\",\"path\":");
        json_str(dir, strlen(dir));
        printf(",\"format\":%d,\"step\":%lld,", c->format, (long long)s->step);
        json_model(&c->cfg);
        printf(",\"world\":%d,\"tp\":%d,\"pp\":%d,\"dp\":%d,\"zero\":%d,\"pp_virtual\":%d,"
               "\"sequence_parallel\":%s,\"params_dtype\":\"%s\",\"moments_dtype\":\"%s\","
               "\"batch\":%d,\"seq_len\":%d,\"grad_accum\":%d,\"seed\":%llu,\"loader_epoch\":%lld,"
               "\"loader_index\":%lld,\"files\":%d,\"bytes\":%lld,\"checksums_verified\":true}",
               l->world, l->layout.tp, l->layout.pp, l->layout.dp, l->layout.zero,
               l->layout.v > 1 ? l->layout.v : 1, l->layout.sp ? "true" : "false", c->params_dtype,
               c->moments_dtype, s->B, s->T, s->accum, (unsigned long long)s->seed,
               (long long)s->loader.epoch, (long long)s->loader.index, c->nfiles,
               (long long)c->bytes);
        return;
    }
    printf("%s: llm3d training checkpoint, format %d, step %lld\n", dir, c->format,
           (long long)s->step);
    text_model(&c->cfg);
    printf("  layout:     %d rank(s) = tp %d x pp %d x dp %d, ZeRO-%d, %d chunk(s) per rank%s\n",
           l->world, l->layout.tp, l->layout.pp, l->layout.dp, l->layout.zero,
           l->layout.v > 1 ? l->layout.v : 1, l->layout.sp ? ", sequence parallel" : "");
    printf("  precision:  parameters %s, AdamW moments %s\n", c->params_dtype, c->moments_dtype);
    printf("  training:   batch %d x %d tokens x %d micro-batches per rank, seed %llu, data at "
           "epoch %lld window %lld\n", s->B, s->T, s->accum, (unsigned long long)s->seed,
           (long long)s->loader.epoch, (long long)s->loader.index);
    printf("  files:      %d rank file(s), %.1f MB; sizes, headers and checksums verified\n",
           c->nfiles, c->bytes / 1e6);
}

/* A step directory, or a checkpoint directory (its `latest`), verified. */
static l3d_status read_ckpt(const char *path, char *dir, size_t cap, struct l3d_ckpt_info *c) {
    l3d_status st = l3d_ckpt_resolve(path, NULL, dir, cap);
    return st == L3D_OK ? l3d_ckpt_inspect(dir, c) : st;
}

/* ---- run directories ----------------------------------------------------------------------------- */

struct metrics {
    int lines;
    long first_step, last_step, val_step;
    double first_loss, last_loss, val_loss;
};

/* *has: whether the run has metrics (none: no such file). A FIFO or another special file in its
 * place is refused, not opened (that blocked): L3D_ERR_IO with the message. */
static l3d_status read_metrics(const char *path, struct metrics *m, bool *has) {
    struct stat sb;
    *has = false;
    if (lstat(path, &sb) != 0 && errno == ENOENT) return L3D_OK;
    FILE *f;
    l3d_status st = l3d_fopen_regular(path, "metrics file", &f, NULL);
    if (st != L3D_OK) return st;
    *has = true;
    char line[8192];
    while (fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "\"step\":"), *l = strstr(line, "\"loss\":");
        if (!p || !l) continue;
        long step = strtol(p + 7, NULL, 10);
        double loss = strtod(l + 7, NULL);
        if (m->lines++ == 0) {
            m->first_step = step;
            m->first_loss = loss;
        }
        m->last_step = step;
        m->last_loss = loss;
        const char *v = strstr(line, "\"val_loss\":");
        if (v) {
            m->val_step = step;
            m->val_loss = strtod(v + 11, NULL);
        }
    }
    fclose(f);
    return L3D_OK;
}

static int inspect_run(const char *path, bool json) {
    char p[4096], dir[4096];
    struct metrics mt = {0};
    snprintf(p, sizeof p, "%s/metrics.jsonl", path);
    bool has_metrics;
    if (read_metrics(p, &mt, &has_metrics) != L3D_OK) {
        fprintf(stderr, "llm3d inspect: %s\n", l3d_error_message());
        return 1;
    }
    struct llmc_info m = {0};
    struct stat sb;
    snprintf(p, sizeof p, "%s/model.bin", path);
    bool has_model = stat(p, &sb) == 0;
    if (has_model && read_llmc(p, &m) != L3D_OK) {
        fprintf(stderr, "llm3d inspect: %s\n", l3d_error_message());
        return 1;
    }
    char ck[4096];
    snprintf(ck, sizeof ck, "%s/checkpoints/latest", path);
    bool has_ckpt = stat(ck, &sb) == 0;
    struct l3d_ckpt_info c;
    snprintf(ck, sizeof ck, "%s/checkpoints", path);
    if (has_ckpt && read_ckpt(ck, dir, sizeof dir, &c) != L3D_OK) {
        fprintf(stderr, "llm3d inspect: %s\n", l3d_error_message());
        return 1;
    }
    const char *id = strrchr(path, '/');
    id = id && id[1] ? id + 1 : path;
    if (json) {
        printf("{\"kind\":\"run\",\"path\":");
        json_str(path, strlen(path));
        printf(",\"run_id\":");
        json_str(id, strlen(id));
        if (has_metrics && mt.lines)
            printf(",\"metrics_lines\":%d,\"first_step\":%ld,\"last_step\":%ld,\"first_loss\":%.9g,"
                   "\"last_loss\":%.9g", mt.lines, mt.first_step, mt.last_step, mt.first_loss,
                   mt.last_loss);
        if (mt.val_step) printf(",\"val_step\":%ld,\"val_loss\":%.9g", mt.val_step, mt.val_loss);
        printf(",\"model\":");
        if (has_model) print_llmc(p, &m, true);
        else printf("null");
        printf(",\"checkpoint\":");
        if (has_ckpt) print_ckpt(dir, &c, true);
        else printf("null");
        printf("}\n");
        return 0;
    }
    printf("%s: llm3d run directory (run id: %s, the directory's name)\n", path, id);
    if (has_metrics && mt.lines)
        printf("  metrics:    %d step line(s), steps %ld..%ld, loss %.4f -> %.4f\n", mt.lines,
               mt.first_step, mt.last_step, mt.first_loss, mt.last_loss);
    else
        printf("  metrics:    none\n");
    if (mt.val_step) printf("  validation: loss %.4f at step %ld\n", mt.val_loss, mt.val_step);
    if (has_model)
        printf("  model.bin:  llm.c %s, L=%d C=%d NH=%d V=%d context %d, %.2fM parameters, "
               "weights %s\n", m.dtype, m.cfg.L, m.cfg.C, m.cfg.NH, m.cfg.V, m.cfg.maxT,
               l3d_gpt_param_count(&m.cfg) / 1e6, m.nonfinite ? "NOT all finite" : "all finite");
    else
        printf("  model.bin:  none (the run has not finished, or had no --out)\n");
    if (has_ckpt)
        printf("  checkpoint: %s, step %lld, tp %d x pp %d x dp %d, %.1f MB, checksums verified\n",
               dir, (long long)c.state.step, c.layout.layout.tp, c.layout.layout.pp,
               c.layout.layout.dp, c.bytes / 1e6);
    else
        printf("  checkpoint: none\n");
    return 0;
}

/* ---- Hugging Face folders ---------------------------------------------------------------- */

/* The tensor table of safetensors files: each tensor's name, dtype and shape (JSON: the elements
 * of a "tensors" array). */
static void print_tensors(const struct l3d_st *st, bool json) {
    for (int i = 0; i < st->n; i++) {
        const struct l3d_st_tensor *t = &st->t[i];
        if (json) {
            printf("%s{\"name\":", i ? "," : "");
            json_str(t->name, strlen(t->name));
            printf(",\"dtype\":\"%s\",\"shape\":[", t->dtype_name);
        } else {
            printf("    %-48s %-4s [", t->name, t->dtype_name);
        }
        for (int d = 0; d < t->ndim; d++)
            printf("%s%lld", d ? (json ? "," : ", ") : "", (long long)t->shape[d]);
        printf(json ? "]}" : "]\n");
    }
}

/* One .safetensors file, without a config: its header checked against the file (every tensor's
 * dtype, shape and byte range inside the file, no two overlapping, no bytes left over:
 * l3d_st_open_file), then the weights of the float dtypes read and checked finite, a million at
 * a time. */
static int inspect_st_file(const char *path, bool json) {
    struct l3d_st st = {0};
    l3d_status rc = l3d_st_open_file(&st, path);
    int64_t bytes = 0, unread = 0, chunk = (int64_t)1 << 20;
    float *buf = rc == L3D_OK ? l3d_alloc((size_t)chunk * sizeof *buf, "tensor chunk") : NULL;
    for (int i = 0; i < st.n && rc == L3D_OK; i++) {
        const struct l3d_st_tensor *t = &st.t[i];
        bytes += t->bytes;
        if (!t->handled) {
            unread++;
            continue;
        }
        for (int64_t k = 0; k < t->count && rc == L3D_OK; k += chunk)
            rc = l3d_st_read_f32_range(&st, t, k, t->count - k < chunk ? t->count - k : chunk, buf);
    }
    l3d_free(buf);
    if (rc != L3D_OK) {
        fprintf(stderr, "llm3d inspect: %s\n", l3d_error_message());
        l3d_st_close(&st);
        return 1;
    }
    if (json) {
        printf("{\"kind\":\"safetensors\",\"path\":");
        json_str(path, strlen(path));
        printf(",\"bytes\":%lld,\"unread\":%lld,\"tensors\":[", (long long)bytes,
               (long long)unread);
        print_tensors(&st, true);
        printf("]}\n");
    } else {
        printf("%s: safetensors file, %d tensor(s), %.2f MB of weights\n", path, st.n, bytes / 1e6);
        for (int i = 0; i < st.nmeta; i++) { /* the writer's text: control bytes escaped */
            printf("  metadata: ");
            text_str(st.meta[2 * i], strlen(st.meta[2 * i]));
            printf(" = ");
            text_str(st.meta[2 * i + 1], strlen(st.meta[2 * i + 1]));
            putchar('\n');
        }
        printf("  tensors: %d; offsets, sizes and dtypes checked against the file, none "
               "overlapping; weights all finite", st.n);
        if (unread) printf(" (%lld of a dtype llm3d does not read left unchecked)", (long long)unread);
        printf("\n");
        print_tensors(&st, false);
    }
    l3d_st_close(&st);
    return 0;
}

/* The folder's config and tensors, after loading it whole (shapes against config.json, every
 * weight finite). */
static int inspect_hf(const char *path, bool json) {
    struct l3d_model_spec c;
    struct l3d_st st = {0};
    float *full = NULL;
    l3d_status rc = l3d_hf_config_read(path, &c);
    if (rc == L3D_OK) {
        full = l3d_try_alloc((size_t)l3d_gpt_param_count(&c) * sizeof(float), "model");
        rc = full ? l3d_hf_load(path, &c, full)
                  : l3d_error(L3D_ERR_OOM, "%s: no memory for its weights", path);
    }
    if (rc == L3D_OK) rc = l3d_st_open_dir(&st, path);
    l3d_free(full);
    if (rc != L3D_OK) {
        fprintf(stderr, "llm3d inspect: %s\n", l3d_error_message());
        return 1;
    }
    const char *type = l3d_arch_hf_row(&c)->hf_model_type; /* read: a row holds it */
    int64_t bytes = 0;
    for (int i = 0; i < st.n; i++) bytes += st.t[i].bytes;
    if (json) {
        printf("{\"kind\":\"hf_folder\",\"path\":");
        json_str(path, strlen(path));
        printf(",\"model_type\":\"%s\",\"L\":%d,\"C\":%d,\"NH\":%d,\"NKV\":%d,\"head_dim\":%d,"
               "\"V\":%d,"
               "\"context\":%d,\"ffn\":%lld,\"tied\":%s,\"norm_eps\":%.9g,\"rope_theta\":%.17g,"
               "\"parameters\":%lld,\"experts\":%d,\"top_k\":%d,\"active_parameters\":%.0f,"
               "\"files\":%d,\"bytes\":%lld,\"tensors\":[", type, c.L, c.C,
               c.NH, l3d_model_kv_heads(&c), l3d_model_head_dim(&c), c.V, c.maxT,
               (long long)c.ffn, c.untied ? "false" : "true", (double)c.norm_eps,
               c.pos == L3D_POS_ROPE ? c.rope.theta : 0.0,
               (long long)l3d_gpt_param_count(&c), c.moe.experts, c.moe.top_k,
               l3d_model_active_param_count(&c), st.nfiles, (long long)bytes);
        print_tensors(&st, true);
        printf("]}\n");
    } else {
        printf("%s: Hugging Face folder, %s, %d safetensors file(s), %.2f MB\n", path, type,
               st.nfiles, bytes / 1e6);
        printf("  model:   L=%d C=%d NH=%d KV heads %d, heads of %d, V=%d context %d, MLP %lld, "
               "%s head%s, %.2fM parameters (llm3d's, vocabulary padded to %d)\n", c.L, c.C,
               c.NH, l3d_model_kv_heads(&c), l3d_model_head_dim(&c), c.V, c.maxT, (long long)c.ffn,
               c.untied ? "untied" : "tied", c.qk_norm ? ", QK-norm" : "",
               l3d_gpt_param_count(&c) / 1e6, c.Vp);
        if (c.moe.experts > 0)
            printf("  experts: %d a layer, top-%d%s; %.2fM parameters active a token\n",
                   c.moe.experts, c.moe.top_k, c.moe.norm_topk ? " renormalised" : "",
                   l3d_model_active_param_count(&c) / 1e6);
        printf("  tensors: %d; shapes checked against config.json, weights all finite\n", st.n);
        print_tensors(&st, false);
    }
    l3d_st_close(&st);
    return 0;
}

/* ---- the command --------------------------------------------------------------------------------- */

static bool exists(const char *dir, const char *name) {
    char p[4096];
    struct stat sb;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &sb) == 0;
}

int l3d_cli_inspect(int argc, char **argv) {
    struct inspect_opts o = {0};
    const struct l3d_flag_group g = {NULL, inspect_flags, set_inspect, &o};
    int first = 0;
    int rc = l3d_flags_parse_n("inspect", argc, argv, &g, usage, 1, "one PATH", &first);
    if (rc >= 0) return rc;
    const char *tokspec = o.tokspec;
    bool json = o.json;
    const char *path = argv[first];
    struct stat sb;
    if (stat(path, &sb) != 0) {
        fprintf(stderr, "llm3d inspect: %s: %s\n", path, strerror(errno));
        return 1;
    }
    if (S_ISDIR(sb.st_mode)) {
        if (exists(path, "manifest") || exists(path, "latest")) {
            char dir[4096];
            struct l3d_ckpt_info ci;
            if (read_ckpt(path, dir, sizeof dir, &ci) != L3D_OK) {
                fprintf(stderr, "llm3d inspect: %s\n", l3d_error_message());
                return 1;
            }
            print_ckpt(dir, &ci, json);
            if (json) putchar('\n');
            return 0;
        }
        if (exists(path, "metrics.jsonl") || exists(path, "model.bin") ||
            exists(path, "checkpoints/latest"))
            return inspect_run(path, json);
        if (exists(path, "config.json")) return inspect_hf(path, json);
        fprintf(stderr, "llm3d inspect: %s: a directory that is neither a training checkpoint (no "
                "manifest or latest), a run directory (no metrics.jsonl, model.bin or "
                "checkpoints) nor a Hugging Face folder (no config.json)\n", path);
        return 1;
    }
    size_t len = strlen(path);
    if (len > 12 && strcmp(path + len - 12, ".safetensors") == 0) return inspect_st_file(path, json);
    FILE *f;
    if (l3d_fopen_regular(path, "file", &f, NULL) != L3D_OK) {
        fprintf(stderr, "llm3d inspect: %s\n", l3d_error_message());
        return 1;
    }
    int32_t magic = 0;
    bool got = fread(&magic, sizeof magic, 1, f) == 1;
    fclose(f);
    if (got && (magic == L3D_SHARD_MAGIC || magic == L3D_SHARD32_MAGIC))
        return inspect_shard(path, tokspec, json);
    if (got && magic == L3D_LLMC_MAGIC) {
        struct llmc_info m = {0};
        if (read_llmc(path, &m) != L3D_OK) {
            fprintf(stderr, "llm3d inspect: %s\n", l3d_error_message());
            return 1;
        }
        print_llmc(path, &m, json);
        if (json) putchar('\n');
        if (m.nonfinite)
            fprintf(stderr, "llm3d inspect: %s: %lld of its weights are not finite (NaN or "
                    "infinite)\n", path, (long long)m.nonfinite);
        return m.nonfinite ? 1 : 0;
    }
    fprintf(stderr, "llm3d inspect: %s: not a token shard (magic %d) or an llm.c checkpoint "
            "(magic %d): its first 4 bytes read %d (a safetensors file is read by its name, "
            "*.safetensors)\n", path, L3D_SHARD_MAGIC, L3D_LLMC_MAGIC, magic);
    return 1;
}
