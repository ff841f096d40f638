/* llm.c single-file GPT-2 checkpoint, version 3 (fp32) or 5 (bf16) (include/llm3d/ckpt.h). A
 * model's parameters are device memory: they travel through a host staging buffer
 * (l3d_ckpt_stage_cap: 64 MiB at most). bf16 files are widened to fp32 (exact) as they are read
 * and rounded from fp32 (nearest even) as they are written. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt-impl.h"
#include "llm3d/arch.h"
#include "llm3d/backend.h"
#include "llm3d/ckpt.h"

#define HEADER_BYTES 1024

static bool is_full_shard(const struct l3d_gpt *m) {
    struct l3d_shard f = l3d_shard_full(&m->cfg);
    const struct l3d_shard *s = &m->shard;
    return s->layer_start == f.layer_start && s->layer_count == f.layer_count &&
           s->head_count == f.head_count && s->ffn_count == f.ffn_count &&
           s->vocab_count == f.vocab_count && s->has_embedding && s->has_head;
}

/* Header words 8-38 of an architecture file (llm3d's own versions 1003 / 1005, which llm.c does
 * not read): the fields of the model spec beyond GPT-2's sizes, the mixture of experts' included
 * (llm.c's own versions have none: a MoE model is never one of them); reals as their bits
 * (floats one word, doubles two). */
enum { ARCH_WORD = 8, ARCH_WORDS = 32 };

static void put_double(int32_t *w, double x) { memcpy(w, &x, sizeof x); }
static double get_double(const int32_t *w) {
    double x;
    memcpy(&x, w, sizeof x);
    return x;
}

static void arch_to_header(const struct l3d_model_spec *c, int32_t *w) {
    w[0] = (int32_t)c->arch;
    w[1] = l3d_model_kv_heads(c);
    w[2] = (int32_t)c->norm;
    w[3] = (int32_t)c->mlp;
    w[4] = (int32_t)c->pos;
    w[5] = c->no_bias;
    w[6] = c->untied;
    w[7] = (int32_t)c->ffn;
    memcpy(&w[8], &c->norm_eps, sizeof(float));
    put_double(&w[9], c->rope.theta);
    put_double(&w[11], c->rope.factor);
    put_double(&w[13], c->rope.low_freq_factor);
    put_double(&w[15], c->rope.high_freq_factor);
    w[17] = c->rope.original_context;
    /* words 26-37: the mixture of experts (0: dense; files before it hold zeros there) */
    const struct l3d_moe_spec *e = &c->moe;
    w[18] = e->experts;
    w[19] = e->top_k;
    w[20] = (int32_t)e->ffn;
    w[21] = e->shared;
    w[22] = e->dense_layers;
    w[23] = e->norm_topk;
    put_double(&w[24], e->aux_coef);
    put_double(&w[26], e->z_coef);
    put_double(&w[28], e->capacity_factor);
    w[30] = c->qk_norm; /* header word 38 (0 in files before QK-norm) */
    w[31] = c->head_dim; /* header word 39: 0 for channels / heads (and in files before it) */
}

/* The architecture words into cfg (its sizes set), each enum checked before it is stored. */
static l3d_status arch_from_header(const int32_t *w, const char *path, struct l3d_model_spec *c) {
    for (int i = 0; i < 7; i++) /* word 0: a family's row; 1: KV heads; the others 0 or 1 */
        if (w[i] < 0 || w[i] > (i == 0 ? L3D_ARCH_COUNT - 1 : i == 1 ? 1 + (1 << 20) : 1))
            return l3d_error(L3D_ERR_FORMAT, "%s: architecture word %d holds %d, not a value "
                             "llm3d writes: the file is damaged or from a newer llm3d", path,
                             ARCH_WORD + i, w[i]);
    c->arch = (enum l3d_arch)w[0];
    c->NKV = w[1];
    c->norm = w[2] ? L3D_NORM_RMSNORM : L3D_NORM_LAYERNORM;
    c->mlp = w[3] ? L3D_MLP_SWIGLU : L3D_MLP_GELU;
    c->pos = w[4] ? L3D_POS_ROPE : L3D_POS_LEARNED;
    c->no_bias = w[5];
    c->untied = w[6];
    c->ffn = w[7];
    memcpy(&c->norm_eps, &w[8], sizeof(float));
    c->rope.theta = get_double(&w[9]);
    c->rope.factor = get_double(&w[11]);
    c->rope.low_freq_factor = get_double(&w[13]);
    c->rope.high_freq_factor = get_double(&w[15]);
    c->rope.original_context = w[17];
    struct l3d_moe_spec *e = &c->moe;
    e->experts = w[18];
    e->top_k = w[19];
    e->ffn = w[20];
    e->shared = w[21];
    e->dense_layers = w[22];
    e->norm_topk = w[23] != 0;
    e->aux_coef = get_double(&w[24]);
    e->z_coef = get_double(&w[26]);
    e->capacity_factor = get_double(&w[28]);
    if (w[30] != 0 && w[30] != 1)
        return l3d_error(L3D_ERR_FORMAT, "%s: architecture word %d (qk-norm) holds %d, not 0 or "
                         "1: the file is damaged or from a newer llm3d", path, ARCH_WORD + 30,
                         w[30]);
    c->qk_norm = w[30] != 0;
    if (w[31] < 0 || w[31] > L3D_MAX_CHANNELS)
        return l3d_error(L3D_ERR_FORMAT, "%s: architecture word %d (head size) holds %d, not 0 "
                         "to %d: the file is damaged or from a newer llm3d", path, ARCH_WORD + 31,
                         w[31], L3D_MAX_CHANNELS);
    c->head_dim = w[31];
    return L3D_OK;
}

/* The 1024-byte header of cfg's file, fp32 or bf16. */
static void write_header(struct l3d_out *o, const struct l3d_model_spec *cfg, bool bf16) {
    int32_t hdr[256] = {0};
    hdr[0] = L3D_LLMC_MAGIC;
    const struct l3d_arch_info *a = l3d_arch_info(cfg->arch);
    const bool arch = !l3d_model_is_gpt2(cfg); /* else a family of llm.c's (its row's versions) */
    hdr[1] = arch ? (bf16 ? L3D_LLMC_VERSION_ARCH_BF16 : L3D_LLMC_VERSION_ARCH_FP32)
                  : (bf16 ? a->llmc_bf16 : a->llmc_fp32);
    if (arch) arch_to_header(cfg, &hdr[ARCH_WORD]);
    hdr[2] = cfg->maxT;
    hdr[3] = cfg->V;
    hdr[4] = cfg->L;
    hdr[5] = cfg->NH;
    hdr[6] = cfg->C;
    hdr[7] = cfg->Vp;
    l3d_out_write(o, hdr, sizeof hdr);
}

/* Writes the file from fp32 params: device memory of be, or host memory when be is NULL; as
 * version 5 (bf16) when dt is L3D_BF16. */
static l3d_status save(const char *path, const struct l3d_model_spec *cfg,
                       struct l3d_backend *be, const float *params, int64_t num_params,
                       enum l3d_dtype dt) {
    L3D_ASSERT(dt == L3D_F32 || dt == L3D_BF16);
    const bool bf16 = dt == L3D_BF16;
    const size_t nb = (size_t)num_params * l3d_dtype_size(L3D_F32);
    size_t cap = l3d_ckpt_stage_cap(nb);
    void *stage = be || bf16 ? l3d_try_alloc(cap, "checkpoint staging") : NULL;
    uint16_t *half = bf16 ? l3d_try_alloc(cap / 2 + 2, "checkpoint bf16 staging") : NULL;
    if ((be || bf16) && (!stage || (bf16 && !half))) {
        l3d_free(stage);
        l3d_free(half);
        return l3d_error(L3D_ERR_OOM, "%s: no host memory for a %zu-byte staging buffer", path,
                         cap);
    }
    struct l3d_out o; /* include/llm3d/file.h: a temporary, fsync, rename */
    if (l3d_out_open(&o, path, "llm.c checkpoint") != L3D_OK) {
        l3d_free(stage);
        l3d_free(half);
        return o.st;
    }
    write_header(&o, cfg, bf16);
    for (size_t done = 0, k; o.st == L3D_OK && done < nb; done += k) {
        k = !be && !bf16 ? nb : nb - done < cap ? nb - done : cap;
        const void *src = (const char *)params + done;
        if (be) l3d_be_copy_d2h(be, stage, src, k);
        else if (bf16) memcpy(stage, src, k);
        if (bf16) {
            const float *x = stage;
            for (size_t i = 0; i < k / 4; i++) half[i] = l3d_f32_to_bf16(x[i]);
            l3d_out_write(&o, half, k / 2);
        } else {
            l3d_out_write(&o, be ? stage : src, k);
        }
    }
    l3d_free(stage);
    l3d_free(half);
    return l3d_out_commit(&o);
}

l3d_status l3d_ckpt_save_llmc(const char *path, const struct l3d_gpt *m) {
    if (!is_full_shard(m))
        return l3d_error(L3D_ERR_ARG, "llm.c checkpoints hold the whole model; this rank holds a "
                         "shard (gather it first)");
    L3D_ASSERT(m->dt == L3D_F32); /* an fp32 model or view */
    return save(path, &m->cfg, m->be, m->params, m->num_params, L3D_F32);
}

l3d_status l3d_ckpt_save_llmc_params(const char *path, const struct l3d_model_spec *cfg,
                                     const float *params, int64_t num_params) {
    return save(path, cfg, NULL, params, num_params, L3D_F32);
}

l3d_status l3d_ckpt_save_llmc_pieces(const char *path, const struct l3d_model_spec *cfg,
                                     l3d_ckpt_next next, void *ctx) {
    struct l3d_out o; /* include/llm3d/file.h: a temporary, fsync, rename */
    if (l3d_out_open(&o, path, "llm.c checkpoint") != L3D_OK) return o.st;
    write_header(&o, cfg, false);
    for (int64_t done = 0, N = l3d_gpt_param_count(cfg), n; done < N; done += n) {
        const float *p = next(ctx, &n);
        L3D_ASSERT(n > 0 && done + n <= N);
        if (o.st == L3D_OK) l3d_out_write(&o, p, (size_t)n * sizeof(float));
    }
    return l3d_out_commit(&o);
}

l3d_status l3d_ckpt_save_llmc_params_dt(const char *path, const struct l3d_model_spec *cfg,
                                        const float *params, int64_t num_params,
                                        enum l3d_dtype dt) {
    return save(path, cfg, NULL, params, num_params, dt);
}

static l3d_status read_header(FILE *f, const char *path, int32_t hdr[256]) {
    if (fread(hdr, sizeof(int32_t), 256, f) != 256)
        return l3d_error(L3D_ERR_FORMAT, "%s: shorter than the 1024-byte llm.c header", path);
    if (hdr[0] != L3D_LLMC_MAGIC)
        return l3d_error(L3D_ERR_FORMAT, "%s: magic %d, expected %d: not an llm.c GPT-2 checkpoint",
                         path, hdr[0], L3D_LLMC_MAGIC);
    if (!l3d_arch_by_llmc_version(hdr[1]) && hdr[1] != L3D_LLMC_VERSION_ARCH_FP32 &&
        hdr[1] != L3D_LLMC_VERSION_ARCH_BF16)
        return l3d_error(L3D_ERR_FORMAT, "%s: version %d; llm3d reads version 3 (fp32) and 5 "
                         "(bf16), and its own 1003 and 1005 (other architectures)", path, hdr[1]);
    return L3D_OK;
}

/* The header checked against the limits of a model and the file's size, before anything is
 * allocated for it. */
static l3d_status read_config(FILE *f, const char *path, int64_t size,
                              struct l3d_model_spec *cfg, size_t *es) {
    int32_t hdr[256];
    l3d_status st = read_header(f, path, hdr);
    if (st != L3D_OK) return st;
    bool bf16 = hdr[1] == L3D_LLMC_VERSION_BF16 || hdr[1] == L3D_LLMC_VERSION_ARCH_BF16;
    *es = bf16 ? 2 : 4; /* bytes a parameter in the file */
    *cfg = (struct l3d_model_spec){.maxT = hdr[2], .V = hdr[3], .L = hdr[4], .NH = hdr[5],
                                   .C = hdr[6]};
    if (hdr[1] == L3D_LLMC_VERSION_ARCH_FP32 || hdr[1] == L3D_LLMC_VERSION_ARCH_BF16) {
        st = arch_from_header(&hdr[ARCH_WORD], path, cfg);
        if (st != L3D_OK) return st;
    } else { /* llm.c's own: the family whose row has this version, with its blocks */
        l3d_model_set_arch(cfg, l3d_arch_by_llmc_version(hdr[1])->arch);
    }
    st = l3d_gpt_config_finish(cfg);
    if (st != L3D_OK) return l3d_error(L3D_ERR_FORMAT, "%s: %s", path, l3d_error_message());
    if (cfg->Vp != hdr[7])
        return l3d_error(L3D_ERR_FORMAT, "%s: padded vocabulary %d, expected %d (V=%d padded to a "
                         "multiple of %d)", path, hdr[7], cfg->Vp, cfg->V, L3D_VOCAB_ALIGN);
    int64_t want = HEADER_BYTES + l3d_gpt_param_count(cfg) * (int64_t)*es;
    if (size != want)
        return l3d_error(L3D_ERR_FORMAT, "%s: %lld bytes, but its header (L=%d C=%d NH=%d V=%d "
                         "T=%d, %s) needs %lld: truncated or damaged", path, (long long)size,
                         cfg->L, cfg->C, cfg->NH, cfg->V, cfg->maxT, *es == 2 ? "bf16" : "fp32",
                         (long long)want);
    return L3D_OK;
}

/* The header's config and the file's bytes a parameter. */
static l3d_status read_llmc_config(const char *path, struct l3d_model_spec *cfg, size_t *es) {
    FILE *f;
    int64_t size;
    l3d_status st = l3d_fopen_regular(path, "checkpoint", &f, &size);
    if (st != L3D_OK) return st;
    st = read_config(f, path, size, cfg, es);
    fclose(f);
    return st;
}

l3d_status l3d_ckpt_read_llmc_config(const char *path, struct l3d_model_spec *cfg) {
    size_t es;
    return read_llmc_config(path, cfg, &es);
}

/* The file's parameters after its header: n_full of them, read cap bytes at a time into buf and
 * copied to the device at dev (of be), or, with be NULL, into buf whole (cap: all of them). Every
 * parameter is checked finite. */
static l3d_status read_body(const char *path, FILE *f, size_t fes, int64_t n_full, void *buf,
                            size_t cap, struct l3d_backend *be, void *dev) {
    const size_t es = sizeof(float), nb = (size_t)n_full * es;
    fseek(f, HEADER_BYTES, SEEK_SET);
    size_t got = 0;
    int64_t bad = 0, first_bad = -1; /* parameters that are NaN or infinite */
    for (size_t k; got < nb; got += k) {
        k = nb - got < cap ? nb - got : cap;
        char *at = be ? buf : (char *)buf + got;
        if (fes == 2) { /* bf16: the chunk's halves read into a staging buffer, widened */
            uint16_t *h = l3d_try_alloc(k / 2 + 2, "bf16 staging");
            size_t ok = h ? fread(h, 2, k / 4, f) : 0;
            float *x = (float *)(void *)at;
            for (size_t i = 0; i < ok; i++) x[i] = l3d_bf16_to_f32(h[i]);
            l3d_free(h);
            if (ok != k / 4) break;
        } else if (fread(at, 1, k, f) != k) {
            break;
        }
        for (size_t i = 0; i < k / es; i++)
            if (!isfinite(((const float *)(void *)at)[i]) && bad++ == 0)
                first_bad = (int64_t)(got / es + i);
        if (be) {
            l3d_be_copy_h2d(be, (char *)dev + got, buf, k);
            l3d_be_sync(be); /* the copy may read buf until then */
        }
    }
    if (got != nb)
        return l3d_error(L3D_ERR_IO, "%s: read %zu of %lld parameters", path, got / es,
                         (long long)n_full);
    if (bad)
        return l3d_error(L3D_ERR_FORMAT, "%s: %lld of its %lld parameters are not finite (NaN or "
                         "infinite; the first is parameter %lld): the file is damaged or its run "
                         "diverged; use another checkpoint", path, (long long)bad,
                         (long long)n_full, (long long)first_bad);
    return L3D_OK;
}

/* Opens path for its parameters: its header must describe the model `want` and its
 * size what the header says. */
static l3d_status open_body(const char *path, const struct l3d_model_spec *want, FILE **f,
                            size_t *fes) {
    struct l3d_model_spec cfg;
    l3d_status st = read_llmc_config(path, &cfg, fes);
    if (st != L3D_OK) return st;
    if (cfg.L != want->L || cfg.C != want->C || cfg.NH != want->NH || cfg.V != want->V ||
        cfg.maxT != want->maxT)
        return l3d_error(L3D_ERR_FORMAT, "%s holds a model L=%d C=%d NH=%d V=%d T=%d, not the "
                         "configured L=%d C=%d NH=%d V=%d T=%d", path, cfg.L, cfg.C, cfg.NH, cfg.V,
                         cfg.maxT, want->L, want->C, want->NH, want->V, want->maxT);
    /* the routing's training settings (auxiliary losses, capacity) are no part of the weights:
     * the run's own (--init-from with --moe-capacity-factor, say) */
    struct l3d_model_spec same = *want;
    same.moe.aux_coef = cfg.moe.aux_coef, same.moe.z_coef = cfg.moe.z_coef;
    same.moe.capacity_factor = cfg.moe.capacity_factor;
    if (!l3d_model_same(&cfg, &same))
        return l3d_error(L3D_ERR_FORMAT, "%s holds a %s model (%d key/value heads, MLP width "
                         "%lld) of these sizes, not the configured %s (%d, %lld): give the "
                         "architecture flags it was trained with", path, l3d_arch_name(cfg.arch),
                         l3d_model_kv_heads(&cfg), (long long)cfg.ffn, l3d_arch_name(want->arch),
                         l3d_model_kv_heads(want), (long long)want->ffn);
    int64_t size;
    st = l3d_fopen_regular(path, "checkpoint", f, &size);
    if (st != L3D_OK) return st;
    int64_t want_bytes = HEADER_BYTES + l3d_gpt_param_count(want) * (int64_t)*fes;
    if (size != want_bytes) { /* the file changed since its header was read */
        fclose(*f);
        return l3d_error(L3D_ERR_FORMAT, "%s: %lld bytes, expected %lld for this model: truncated "
                         "or damaged", path, (long long)size, (long long)want_bytes);
    }
    return L3D_OK;
}

l3d_status l3d_ckpt_read_llmc_full(const char *path, const struct l3d_model_spec *cfg,
                                   float *full) {
    FILE *f;
    size_t fes;
    l3d_status st = open_body(path, cfg, &f, &fes);
    if (st != L3D_OK) return st;
    int64_t n = l3d_gpt_param_count(cfg);
    st = read_body(path, f, fes, n, full, (size_t)n * sizeof(float), NULL, NULL);
    fclose(f);
    return st;
}

l3d_status l3d_ckpt_load_llmc(const char *path, struct l3d_gpt *m) {
    L3D_ASSERT(m->dt == L3D_F32); /* an fp32 model or view */
    FILE *f;
    size_t fes; /* the file's bytes a parameter: 4, or 2 (bf16) */
    l3d_status st = open_body(path, &m->cfg, &f, &fes);
    if (st != L3D_OK) return st;
    int64_t n_full = l3d_gpt_param_count(&m->cfg);
    const size_t es = sizeof(float), nb = (size_t)n_full * es;
    /* the full shard streams through the staging buffer; a shard (tensor- or pipeline-parallel
     * rank) reads the whole file on the host, keeps its slice and copies that */
    bool full = is_full_shard(m);
    size_t cap = full ? l3d_ckpt_stage_cap(nb) : nb;
    void *buf = l3d_try_alloc(cap, "checkpoint");
    float *mine = full || !buf ? NULL
                               : l3d_try_alloc((size_t)m->num_params * es, "checkpoint shard");
    if (!buf || (!full && !mine)) {
        fclose(f);
        l3d_free(buf);
        return l3d_error(L3D_ERR_OOM, "%s: no memory to read the %lld parameters", path,
                         (long long)n_full);
    }
    st = read_body(path, f, fes, n_full, buf, cap, full ? m->be : NULL, m->params);
    fclose(f);
    if (st == L3D_OK && !full) {
        l3d_gpt_full_to_shard(&m->cfg, &m->shard, buf, mine);
        l3d_be_copy_h2d(m->be, m->params, mine, (size_t)m->num_params * es);
        l3d_be_sync(m->be);
    }
    l3d_free(mine);
    l3d_free(buf);
    return st;
}

/* [off, off + n) of the file's parameters into buf (fp32), widened from bf16 (fes 2) through
 * half (n of them); *bad counts the ones that are not finite, *first_bad the first's index. */
static l3d_status read_range(const char *path, FILE *f, size_t fes, int64_t off, int64_t n,
                             float *buf, uint16_t *half, int64_t *bad, int64_t *first_bad) {
    size_t got = 0;
    if (fseeko(f, (off_t)(HEADER_BYTES + off * (int64_t)fes), SEEK_SET) == 0) {
        if (fes == 2) {
            got = fread(half, 2, (size_t)n, f);
            for (size_t i = 0; i < got; i++) buf[i] = l3d_bf16_to_f32(half[i]);
        } else {
            got = fread(buf, sizeof(float), (size_t)n, f);
        }
    }
    if (got != (size_t)n)
        return l3d_error(L3D_ERR_IO, "%s: cannot read parameters %lld to %lld", path,
                         (long long)off, (long long)(off + n - 1));
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(buf[i]) && (*bad)++ == 0) *first_bad = off + i;
    return L3D_OK;
}

l3d_status l3d_ckpt_load_llmc_pieces(const char *path, const struct l3d_gpt *m,
                                     const struct l3d_ckpt_pieces *q) {
    FILE *f;
    size_t fes;
    l3d_status st = open_body(path, &m->cfg, &f, &fes);
    if (st != L3D_OK) return st;
    int64_t n_full = l3d_gpt_param_count(&m->cfg), most = q->hi - q->lo;
    if (!is_full_shard(m)) most = n_full; /* a shard: the whole file on the host, then cut */
    else if (most > q->piece) most = q->piece;
    float *buf = l3d_try_alloc((size_t)most * sizeof(float) + 1, "checkpoint piece");
    uint16_t *half = fes == 2 ? l3d_try_alloc((size_t)most * 2 + 1, "bf16 staging") : NULL;
    float *mine = is_full_shard(m) || !buf ? NULL
                  : l3d_try_alloc((size_t)m->num_params * sizeof(float) + 1, "checkpoint shard");
    int64_t bad = 0, first_bad = -1;
    if (!buf || (fes == 2 && !half) || (!is_full_shard(m) && !mine))
        st = l3d_error(L3D_ERR_OOM, "%s: no memory to read the %lld parameters", path,
                       (long long)n_full);
    if (st == L3D_OK && is_full_shard(m)) {
        for (int64_t off = q->lo, n; st == L3D_OK && off < q->hi; off += n) {
            n = q->hi - off < q->piece ? q->hi - off : q->piece;
            st = read_range(path, f, fes, off, n, buf, half, &bad, &first_bad);
            if (st == L3D_OK && bad == 0) q->put(q->ctx, off, n, buf);
        }
    } else if (st == L3D_OK) {
        st = read_range(path, f, fes, 0, n_full, buf, half, &bad, &first_bad);
        if (st == L3D_OK && bad == 0) {
            l3d_gpt_full_to_shard(&m->cfg, &m->shard, buf, mine);
            for (int64_t off = q->lo, n; off < q->hi; off += n) {
                n = q->hi - off < q->piece ? q->hi - off : q->piece;
                q->put(q->ctx, off, n, mine + off);
            }
        }
    }
    fclose(f);
    l3d_free(mine);
    l3d_free(half);
    l3d_free(buf);
    if (st == L3D_OK && bad)
        st = l3d_error(L3D_ERR_FORMAT, "%s: %lld of its %lld parameters are not finite (NaN or "
                       "infinite; the first is parameter %lld): the file is damaged or its run "
                       "diverged; use another checkpoint", path, (long long)bad,
                       (long long)n_full, (long long)first_bad);
    return st;
}
