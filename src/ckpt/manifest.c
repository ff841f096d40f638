/* Checkpoint manifests (src/ckpt/ckpt-impl.h): the text written (l3d_ckpt_manifest_print), read
 * and parsed (one handler per record kind), checked against the model it describes; the run id
 * that pruning and --resume read alone. The format: include/llm3d/ckpt.h. */
#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt-impl.h"
#include "llm3d/arch.h"
#include "llm3d/ckpt.h"

/* ---- print ----------------------------------------------------------------------------------- */

/* The name of the file of chunk `chunk` of rank `rank`, with nc chunks per rank. */
void l3d_ckpt_piece_name(char *buf, size_t cap, int nc, int rank, int chunk) {
    if (nc == 1)
        snprintf(buf, cap, "rank_%05d.bin", rank);
    else
        snprintf(buf, cap, "rank_%05d_c%d.bin", rank, chunk);
}

void l3d_ckpt_manifest_print(char *buf, size_t cap, const struct l3d_model_spec *c,
                             enum l3d_dtype pdt, enum l3d_dtype mdt,
                             const struct l3d_ckpt_layout *lay, const struct l3d_ckpt_state *s,
                             const struct l3d_ckpt_rank_rec *recs) {
    size_t n = 0;
    const int nc = l3d_ckpt_chunks_of(lay);
#define OUT(...) n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, __VA_ARGS__)
    OUT("llm3d-checkpoint format %d\n", L3D_CKPT_FORMAT);
    OUT("step %lld\n", (long long)s->step);
    if (s->run_id) OUT("run %016" PRIx64 "\n", s->run_id);
    OUT("model L %d C %d NH %d V %d Vp %d maxT %d\n", c->L, c->C, c->NH, c->V, c->Vp, c->maxT);
    if (!l3d_model_is_gpt2(c)) { /* GPT-2's manifests stay as they were */
        OUT("arch family %s kv_heads %d rmsnorm %d eps %a swiglu %d ffn %lld rope %d theta %a "
            "factor %a low %a high %a original %d no_bias %d untied %d", l3d_arch_name(c->arch),
            l3d_model_kv_heads(c), c->norm == L3D_NORM_RMSNORM, (double)c->norm_eps,
            c->mlp == L3D_MLP_SWIGLU, (long long)c->ffn, c->pos == L3D_POS_ROPE, c->rope.theta,
            c->rope.factor, c->rope.low_freq_factor, c->rope.high_freq_factor,
            c->rope.original_context, c->no_bias, c->untied);
        OUT("%s", c->qk_norm ? " qk_norm 1" : ""); /* QK-norm: optional, absent before it */
        if (c->head_dim > 0) OUT(" head_dim %d", c->head_dim); /* absent: channels / heads */
        OUT("\n");
    }
    if (c->moe.experts > 0)
        OUT("moe experts %d top_k %d ffn %lld shared %d dense %d norm_topk %d aux %a z %a "
            "capacity %a\n", c->moe.experts, c->moe.top_k, (long long)c->moe.ffn, c->moe.shared,
            c->moe.dense_layers, c->moe.norm_topk, c->moe.aux_coef, c->moe.z_coef,
            c->moe.capacity_factor);
    OUT("dtype params %s moments %s\n", l3d_dtype_name(pdt), l3d_dtype_name(mdt));
    OUT("layout world %d tp %d pp %d dp %d zero %d sp %d virtual %d", lay->world, lay->layout.tp,
        lay->layout.pp, lay->layout.dp, lay->layout.zero, lay->layout.sp ? 1 : 0, nc);
    if (lay->layout.ep > 1) OUT(" ep %d", lay->layout.ep); /* expert parallelism; else as before */
    OUT("\n");
    OUT("data epoch %lld index %lld B %d T %d accum %d seed %" PRIu64 "\n",
        (long long)s->loader.epoch, (long long)s->loader.index, s->B, s->T, s->accum, s->seed);
    OUT("schedule max_lr %a min_lr %a warmup %d total %d\n", (double)s->sched.max_lr,
        (double)s->sched.min_lr, s->sched.warmup_steps, s->sched.total_steps);
    OUT("adamw beta1 %a beta2 %a eps %a weight_decay %a grad_clip %a t %lld\n",
        (double)s->adamw.beta1, (double)s->adamw.beta2, (double)s->adamw.eps,
        (double)s->adamw.weight_decay, (double)s->adamw.grad_clip, (long long)s->adamw_t);
    if (s->loss_scale > 0)
        OUT("lossscale scale %a good %lld hysteresis %lld\n", s->loss_scale,
            (long long)s->ls_good, (long long)s->ls_hyst);
    for (int i = 0; i < lay->world * nc; i++) {
        const struct l3d_ckpt_rank_rec *q = &recs[i];
        char fname[64];
        l3d_ckpt_piece_name(fname, sizeof fname, nc, i / nc, (int)q->chunk);
        OUT("file rank %d chunk %lld tp %lld pp %lld dp %lld name %s bytes %lld hash %016" PRIx64
            " params %lld opt_start %lld opt_count %lld layers %lld+%lld heads %lld+%lld ffn %lld+"
            "%lld vocab %lld+%lld embedding %lld head %lld",
            i / nc, (long long)q->chunk, (long long)q->tp_rank, (long long)q->pp_rank,
            (long long)q->dp_rank, fname, (long long)q->bytes, q->hash, (long long)q->params,
            (long long)q->opt_start, (long long)q->opt_count, (long long)q->layer_start,
            (long long)q->layer_count, (long long)q->head_start, (long long)q->head_count,
            (long long)q->ffn_start, (long long)q->ffn_count, (long long)q->vocab_start,
            (long long)q->vocab_count, (long long)q->has_embedding, (long long)q->has_head);
        if (c->moe.experts > 0) /* the experts the file holds */
            OUT(" experts %lld+%lld", (long long)q->expert_start, (long long)q->expert_count);
        OUT("\n");
    }
    /* format 4: the checksum of every byte above it (the manifest's own integrity) */
    L3D_ASSERT(n < cap);
    struct l3d_ckpt_hasher h;
    l3d_ckpt_hash_init(&h);
    l3d_ckpt_hash_update(&h, buf, n);
    OUT("checksum %016" PRIx64 "\n", l3d_ckpt_hash_final(&h));
    OUT("end\n");
#undef OUT
    L3D_ASSERT(n < cap);
}

/* ---- parse ----------------------------------------------------------------------------------- */

/* The floating-point types a tensor can be stored in; false for anything else. */
static bool dtype_parse(const char *s, enum l3d_dtype *t) {
    enum l3d_dtype k;
    if (l3d_dtype_parse(s, &k) != L3D_OK) return false; /* the caller says what is wrong */
    if (k != L3D_F32 && k != L3D_F64 && k != L3D_BF16 && k != L3D_F16) return false;
    *t = k;
    return true;
}

#define MAXTOK 64

/* Splits a line into at most MAXTOK space-separated tokens (in place). */
static int tokenize(char *line, char **tok) {
    int n = 0;
    for (char *p = strtok(line, " \t\n"); p && n < MAXTOK; p = strtok(NULL, " \t\n")) tok[n++] = p;
    return n;
}

/* The state of a parse: the text, the current line's tokens (tok[0] the record's word), the
 * first error (every getter does nothing once there is one). */
struct parser {
    struct l3d_ckpt_manifest *mf;
    const char *text;
    size_t len, at;   /* the text's length; where the current line begins (the checksum's end) */
    char **tok;
    int n, line;
    l3d_status st;
    unsigned seen;    /* one bit per entry of records[] */
    int nfile;        /* file records read */
    bool sum, end;    /* the `checksum` line matched; the `end` line was read */
};

/* Refuses the current record's value v of field key (NULL: the record's one value): "FILE line
 * N: RECORD KEY 'V' WHY: the manifest is damaged". */
static void bad_value(struct parser *p, const char *key, const char *v, const char *why) {
    if (p->st != L3D_OK) return;
    p->st = l3d_error(L3D_ERR_FORMAT, "%s line %d: %s%s%s '%s' %s: the manifest is damaged",
                      p->mf->path, p->line, p->tok[0], key ? " " : "", key ? key : "", v, why);
}

/* The value after key in "word key value key value ...", or NULL after an error naming it. */
static const char *field(struct parser *p, const char *key) {
    if (p->st != L3D_OK) return NULL;
    for (int i = 1; i + 1 < p->n; i += 2)
        if (strcmp(p->tok[i], key) == 0) return p->tok[i + 1];
    p->st = l3d_error(L3D_ERR_FORMAT, "%s line %d: '%s' record has no %s: the manifest is "
                      "damaged", p->mf->path, p->line, p->tok[0], key);
    return NULL;
}

/* Whether the record has the optional field key. */
static bool has_field(const struct parser *p, const char *key) {
    for (int i = 1; i + 1 < p->n; i += 2)
        if (strcmp(p->tok[i], key) == 0) return true;
    return false;
}

/* v as a whole number in [lo, hi]: an optional '-' and decimal digits, nothing else (strtoll
 * alone takes "+5", " 5" and stops at "5x"). */
static int64_t whole(struct parser *p, const char *key, const char *v, int64_t lo, int64_t hi) {
    if (!v || p->st != L3D_OK) return 0;
    char *end, why[96];
    errno = 0;
    long long x = strtoll(v, &end, 10);
    bool digits = (v[0] == '-' ? v[1] : v[0]) >= '0' && (v[0] == '-' ? v[1] : v[0]) <= '9';
    if (digits && !*end && !errno && x >= lo && x <= hi) return x;
    snprintf(why, sizeof why, "is not a whole number in [%lld, %lld]", (long long)lo,
             (long long)hi);
    bad_value(p, key, v, why);
    return 0;
}

static int64_t get_i64(struct parser *p, const char *key, int64_t lo, int64_t hi) {
    return whole(p, key, field(p, key), lo, hi);
}

/* Bounds of int fields: sums of two cannot overflow. Of counts of bytes and elements: 2^62. */
#define FIELD_MAX ((1 << 30) + (1 << 20))
#define COUNT_MAX ((int64_t)1 << 62)

static int get_int(struct parser *p, const char *key, int lo, int hi) {
    return (int)get_i64(p, key, lo, hi);
}

static bool get_flag(struct parser *p, const char *key) { return get_i64(p, key, 0, 1) != 0; }

/* Decimal digits only, the whole of uint64_t (strtoull alone takes "-1" as 2^64 - 1). */
static uint64_t get_u64(struct parser *p, const char *key) {
    const char *v = field(p, key);
    if (!v) return 0;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (v[0] >= '0' && v[0] <= '9' && !*end && !errno) return x;
    bad_value(p, key, v, "is not a whole number in [0, 2^64)");
    return 0;
}

/* v as exactly 16 hexadecimal digits (run ids, file checksums) */
static uint64_t hex64(struct parser *p, const char *key, const char *v) {
    if (!v || p->st != L3D_OK) return 0;
    if (strlen(v) == 16 && strspn(v, "0123456789abcdefABCDEF") == 16)
        return strtoull(v, NULL, 16);
    bad_value(p, key, v, "is not a 16-digit hex number");
    return 0;
}

/* A finite number in [lo, hi], as the type it is kept in (f32: a float, where 1e39 is an
 * infinity and 1e-50 a zero). */
static double get_real(struct parser *p, const char *key, double lo, double hi, bool f32) {
    const char *v = field(p, key);
    if (!v) return 0;
    char *end, why[96];
    double x = strtod(v, &end);
    if (f32) x = (float)x;
    if (end != v && !*end && isfinite(x) && x >= lo && x <= hi) return x;
    snprintf(why, sizeof why, "is not a finite number in [%g, %g]", lo, hi);
    bad_value(p, key, v, why);
    return 0;
}

static float get_f32(struct parser *p, const char *key, double lo, double hi) {
    return (float)get_real(p, key, lo, hi, true);
}

void l3d_ckpt_manifest_free(struct l3d_ckpt_manifest *mf) {
    free(mf->files);
    mf->files = NULL;
}

/* The records, one handler each, in the order they are written. */

/* "llm3d-checkpoint format N": the first line */
static void rec_format(struct parser *p) {
    struct l3d_ckpt_manifest *mf = p->mf;
    if (strcmp(p->tok[0], "llm3d-checkpoint") != 0) {
        p->st = l3d_error(L3D_ERR_FORMAT, "%s: not an llm3d checkpoint manifest", mf->path);
        return;
    }
    int64_t fmt = get_i64(p, "format", 0, INT32_MAX);
    if (p->st == L3D_OK && (fmt < L3D_CKPT_FORMAT_ONE || fmt > L3D_CKPT_FORMAT))
        p->st = l3d_error(L3D_ERR_FORMAT, "%s: format version %lld; this llm3d reads "
                          "versions %d to %d (a newer llm3d wrote it?)", mf->path,
                          (long long)fmt, L3D_CKPT_FORMAT_ONE, L3D_CKPT_FORMAT);
    mf->format = p->st == L3D_OK ? (int)fmt : 0;
    /* formats 1 and 2 hold fp32 tensors behind a 64-byte header */
    mf->header = fmt >= L3D_CKPT_FORMAT_DTYPES ? L3D_CKPT_HEADER_BYTES : L3D_CKPT_HEADER_BYTES_OLD;
    mf->pdt = mf->mdt = L3D_F32;
}

/* "step N": optimizer steps completed (the trainer counts them in an int) */
static void rec_step(struct parser *p) { p->mf->st.step = whole(p, NULL, p->tok[1], 0, INT32_MAX); }

/* "run ID": the run that wrote it */
static void rec_run(struct parser *p) { p->mf->st.run_id = hex64(p, NULL, p->tok[1]); }

static void rec_model(struct parser *p) {
    struct l3d_ckpt_manifest *mf = p->mf;
    mf->cfg = (struct l3d_model_spec){
        .L = get_int(p, "L", 1, FIELD_MAX), .C = get_int(p, "C", 1, FIELD_MAX),
        .NH = get_int(p, "NH", 1, FIELD_MAX), .V = get_int(p, "V", 2, FIELD_MAX),
        .Vp = get_int(p, "Vp", 2, FIELD_MAX), .maxT = get_int(p, "maxT", 1, FIELD_MAX)};
    struct l3d_model_spec c = mf->cfg;
    if (p->st == L3D_OK && (l3d_gpt_config_finish(&c) != L3D_OK || c.Vp != mf->cfg.Vp))
        p->st = l3d_error(L3D_ERR_FORMAT, "%s line %d: model L=%d C=%d NH=%d V=%d Vp=%d "
                          "maxT=%d is not a valid GPT-2 model (%s): the manifest is "
                          "damaged", mf->path, p->line, mf->cfg.L, mf->cfg.C, mf->cfg.NH,
                          mf->cfg.V, mf->cfg.Vp, mf->cfg.maxT,
                          c.Vp != mf->cfg.Vp ? "Vp is not V padded" : l3d_error_message());
    if (p->st == L3D_OK) mf->cfg = c;
}

/* "arch family F kv_heads ... untied U": a model other than GPT-2 (after its `model` record) */
static void rec_arch(struct parser *p) {
    struct l3d_ckpt_manifest *mf = p->mf;
    struct l3d_model_spec *c = &mf->cfg;
    const char *fam = field(p, "family");
    if (p->st != L3D_OK) return;
    if (!mf->cfg.L) {
        p->st = l3d_error(L3D_ERR_FORMAT, "%s line %d: 'arch' before 'model': the manifest is "
                          "damaged", mf->path, p->line);
        return;
    }
    char list[128], why[160];
    snprintf(why, sizeof why, "is not %s", l3d_arch_list(list, sizeof list, "or", false));
    if (!l3d_arch_parse(fam, &c->arch)) bad_value(p, "family", fam, why);
    c->NKV = get_int(p, "kv_heads", 1, FIELD_MAX);
    c->norm = get_flag(p, "rmsnorm") ? L3D_NORM_RMSNORM : L3D_NORM_LAYERNORM;
    c->norm_eps = get_f32(p, "eps", 1e-30, 1.0);
    c->mlp = get_flag(p, "swiglu") ? L3D_MLP_SWIGLU : L3D_MLP_GELU;
    c->ffn = get_i64(p, "ffn", 1, FIELD_MAX);
    c->pos = get_flag(p, "rope") ? L3D_POS_ROPE : L3D_POS_LEARNED;
    c->rope.theta = get_real(p, "theta", 0.0, 1e300, false);
    c->rope.factor = get_real(p, "factor", 0.0, 1e300, false);
    c->rope.low_freq_factor = get_real(p, "low", 0.0, 1e300, false);
    c->rope.high_freq_factor = get_real(p, "high", 0.0, 1e300, false);
    c->rope.original_context = get_int(p, "original", 0, FIELD_MAX);
    c->no_bias = get_flag(p, "no_bias");
    c->untied = get_flag(p, "untied");
    c->qk_norm = has_field(p, "qk_norm") && get_flag(p, "qk_norm"); /* absent before QK-norm */
    c->head_dim = has_field(p, "head_dim") ? get_int(p, "head_dim", 1, FIELD_MAX) : 0;
    if (p->st == L3D_OK && l3d_gpt_config_finish(c) != L3D_OK)
        p->st = l3d_error(L3D_ERR_FORMAT, "%s line %d: the architecture is not a valid model "
                          "(%s): the manifest is damaged", mf->path, p->line, l3d_error_message());
}

/* "moe experts E top_k K ...": a mixture of experts (after its `arch` record) */
static void rec_moe(struct parser *p) {
    struct l3d_ckpt_manifest *mf = p->mf;
    struct l3d_moe_spec *e = &mf->cfg.moe;
    if (!mf->cfg.L) {
        p->st = l3d_error(L3D_ERR_FORMAT, "%s line %d: 'moe' before 'model': the manifest is "
                          "damaged", mf->path, p->line);
        return;
    }
    e->experts = get_int(p, "experts", 1, FIELD_MAX);
    e->top_k = get_int(p, "top_k", 1, FIELD_MAX);
    e->ffn = get_i64(p, "ffn", 1, FIELD_MAX);
    e->shared = get_int(p, "shared", 0, FIELD_MAX);
    e->dense_layers = get_int(p, "dense", 0, FIELD_MAX);
    e->norm_topk = get_flag(p, "norm_topk");
    e->aux_coef = get_real(p, "aux", 0.0, 1e300, false);
    e->z_coef = get_real(p, "z", 0.0, 1e300, false);
    e->capacity_factor = get_real(p, "capacity", 0.0, 1e300, false);
    if (p->st == L3D_OK && l3d_gpt_config_finish(&mf->cfg) != L3D_OK)
        p->st = l3d_error(L3D_ERR_FORMAT, "%s line %d: the mixture of experts is not a valid "
                          "model (%s): the manifest is damaged", mf->path, p->line,
                          l3d_error_message());
}

/* "dtype params T moments T" (format 3 on) */
static void rec_dtype(struct parser *p) {
    const char *keys[2] = {"params", "moments"}, *v;
    enum l3d_dtype *dst[2] = {&p->mf->pdt, &p->mf->mdt};
    for (int i = 0; i < 2 && (v = field(p, keys[i])); i++)
        if (!dtype_parse(v, dst[i]))
            p->st = l3d_error(L3D_ERR_FORMAT, "%s line %d: %s dtype '%s' is not one of "
                              "fp32, bf16, fp16, fp64: the manifest is damaged or from a "
                              "newer llm3d", p->mf->path, p->line, keys[i], v);
}

/* The layout, and the table of its world x chunks rank files (allocated once the text is known
 * to be long enough to list them). */
static void rec_layout(struct parser *p) {
    struct l3d_ckpt_manifest *mf = p->mf;
    struct l3d_ckpt_layout *l = &mf->lay;
    l->world = get_int(p, "world", 1, 1 << 20);
    l->layout.tp = get_int(p, "tp", 1, 1 << 20);
    l->layout.pp = get_int(p, "pp", 1, 1 << 20);
    l->layout.dp = get_int(p, "dp", 1, 1 << 20);
    l->layout.zero = get_int(p, "zero", 0, 3);
    l->layout.sp = get_flag(p, "sp");
    l->layout.v = mf->format == L3D_CKPT_FORMAT_ONE ? 1 : get_int(p, "virtual", 1, 256);
    l->layout.ep = has_field(p, "ep") ? get_int(p, "ep", 2, 1 << 16) : 1;
    if (p->st == L3D_OK && (int64_t)l->world * l->layout.v > (1 << 20))
        p->st = l3d_error(L3D_ERR_FORMAT, "%s: %d chunks per rank (virtual)", mf->path,
                          l->layout.v);
    /* a file record takes more than 64 bytes: a world the text cannot list is refused before
     * its table is allocated */
    if (p->st == L3D_OK && (int64_t)l->world * l->layout.v > (int64_t)(p->len / 64))
        p->st = l3d_error(L3D_ERR_FORMAT, "%s: a world of %d ranks with %d chunk(s) each, more "
                          "rank files than its %zu bytes can list: the manifest is truncated or "
                          "damaged", mf->path, l->world, l->layout.v, p->len);
    if (p->st != L3D_OK) return;
    mf->nc = l->layout.v;
    mf->nfiles = l->world * mf->nc;
    mf->files = calloc((size_t)mf->nfiles, sizeof *mf->files);
    if (!mf->files) {
        p->st = l3d_error(L3D_ERR_OOM, "%s: no memory for its table of %d rank files", mf->path,
                          mf->nfiles);
        return;
    }
    for (int r = 0; r < mf->nfiles; r++) mf->files[r].rank = -1;
}

static void rec_data(struct parser *p) {
    struct l3d_ckpt_state *s = &p->mf->st;
    s->loader.epoch = get_i64(p, "epoch", 0, COUNT_MAX);
    s->loader.index = get_i64(p, "index", 0, COUNT_MAX);
    s->B = get_int(p, "B", 1, FIELD_MAX);
    s->T = get_int(p, "T", 1, FIELD_MAX);
    s->accum = get_int(p, "accum", 1, FIELD_MAX);
    s->seed = get_u64(p, "seed");
}

static void rec_schedule(struct parser *p) {
    struct l3d_lr_schedule *s = &p->mf->st.sched;
    s->max_lr = get_f32(p, "max_lr", 0, FLT_MAX);
    s->min_lr = get_f32(p, "min_lr", 0, FLT_MAX);
    s->warmup_steps = get_int(p, "warmup", 0, FIELD_MAX);
    s->total_steps = get_int(p, "total", 1, FIELD_MAX);
}

/* AdamW's hyper-parameters: betas in [0, 1), eps > 0 (the smallest positive float), the rest
 * at least 0; its step count */
static void rec_adamw(struct parser *p) {
    struct l3d_adamw_hparams *h = &p->mf->st.adamw;
    h->beta1 = get_f32(p, "beta1", 0, 0x1.fffffep-1);
    h->beta2 = get_f32(p, "beta2", 0, 0x1.fffffep-1);
    h->eps = get_f32(p, "eps", FLT_TRUE_MIN, FLT_MAX);
    h->weight_decay = get_f32(p, "weight_decay", 0, FLT_MAX);
    h->grad_clip = get_f32(p, "grad_clip", 0, FLT_MAX);
    p->mf->st.adamw_t = get_i64(p, "t", 0, COUNT_MAX);
}

/* fp16 dynamic loss scaling (optional) */
static void rec_lossscale(struct parser *p) {
    struct l3d_ckpt_state *s = &p->mf->st;
    s->loss_scale = get_real(p, "scale", DBL_TRUE_MIN, DBL_MAX, false);
    s->ls_good = get_i64(p, "good", 0, COUNT_MAX);
    s->ls_hyst = get_i64(p, "hysteresis", 0, COUNT_MAX);
}

/* "START+COUNT", each a whole number in [0, 2^30) */
static bool parse_range(const char *v, long long *a, long long *b) {
    char *end;
    errno = 0;
    *a = strtoll(v, &end, 10);
    if (end == v || *end != '+' || errno || *a < 0 || *a >= (1 << 30)) return false;
    const char *c = end + 1;
    *b = strtoll(c, &end, 10);
    return end != c && !*end && !errno && *b >= 0 && *b < (1 << 30);
}

/* The shard of a file record: its ranges and whether it holds the embedding and the head. */
static struct l3d_shard file_shard(struct parser *p) {
    struct l3d_shard s = l3d_shard_full(&p->mf->cfg);
    const char *keys[4] = {"layers", "heads", "ffn", "vocab"}, *v;
    long long a[4] = {0}, b[4] = {0};
    for (int i = 0; i < 4; i++)
        if ((v = field(p, keys[i])) && !parse_range(v, &a[i], &b[i]))
            bad_value(p, keys[i], v, "is not START+COUNT (each below 2^30)");
    s.layer_start = (int)a[0], s.layer_count = (int)b[0];
    s.head_start = (int)a[1], s.head_count = (int)b[1];
    s.ffn_start = a[2], s.ffn_count = b[2];
    s.vocab_start = a[3], s.vocab_count = b[3];
    s.has_embedding = get_flag(p, "embedding");
    s.has_head = get_flag(p, "head");
    if (p->mf->cfg.moe.experts > 0 && has_field(p, "experts")) { /* else all of them */
        v = field(p, "experts");
        if (!parse_range(v, &a[0], &b[0]))
            bad_value(p, "experts", v, "is not START+COUNT (each below 2^30)");
        s.expert_start = (int)a[0], s.expert_count = (int)b[0];
    }
    return s;
}

/* One piece: its coordinates inside the layout, file, size, checksum, ranges. */
static void rec_file(struct parser *p) {
    struct l3d_ckpt_manifest *mf = p->mf;
    if (!mf->files || !mf->cfg.L) {
        p->st = l3d_error(L3D_ERR_FORMAT, "%s line %d: file record before the model and layout "
                          "records", mf->path, p->line);
        return;
    }
    int r = get_int(p, "rank", 0, mf->lay.world - 1);
    int c = mf->format == L3D_CKPT_FORMAT_ONE ? 0 : get_int(p, "chunk", 0, mf->nc - 1);
    if (p->st != L3D_OK) return;
    struct l3d_ckpt_mf_file *f = &mf->files[r * mf->nc + c];
    if (f->rank >= 0) {
        p->st = l3d_error(L3D_ERR_FORMAT, "%s line %d: rank %d chunk %d listed twice", mf->path,
                          p->line, r, c);
        return;
    }
    f->rank = r;
    f->chunk = c;
    /* recorded for readers; a load goes by the shards, which the layout check judges */
    f->tp_rank = get_int(p, "tp", 0, (1 << 20) - 1);
    f->pp_rank = get_int(p, "pp", 0, (1 << 20) - 1);
    f->dp_rank = get_int(p, "dp", 0, (1 << 20) - 1);
    const char *v = field(p, "name");
    if (v && (strlen(v) >= sizeof f->name || strchr(v, '/')))
        p->st = l3d_error(L3D_ERR_FORMAT, "%s line %d: bad file name '%s'", mf->path, p->line, v);
    else if (v)
        strcpy(f->name, v);
    f->bytes = get_i64(p, "bytes", 0, COUNT_MAX);
    f->hash = hex64(p, "hash", field(p, "hash"));
    f->params = get_i64(p, "params", 0, COUNT_MAX);
    f->opt_start = get_i64(p, "opt_start", 0, COUNT_MAX);
    f->opt_count = get_i64(p, "opt_count", 0, COUNT_MAX);
    f->shard = file_shard(p);
    p->nfile++;
}

/* "checksum H" (format 4 on): of every byte above it */
static void rec_checksum(struct parser *p) {
    struct l3d_ckpt_hasher h;
    l3d_ckpt_hash_init(&h);
    l3d_ckpt_hash_update(&h, p->text, p->at);
    uint64_t sum = l3d_ckpt_hash_final(&h);
    const char *v = p->tok[1];
    p->sum = strlen(v) == 16 && strspn(v, "0123456789abcdefABCDEF") == 16 &&
             strtoull(v, NULL, 16) == sum;
    if (!p->sum)
        p->st = l3d_error(L3D_ERR_FORMAT, "%s: its checksum is %016" PRIx64 " but line %d says "
                          "%s: the manifest was edited or damaged; use another checkpoint step",
                          p->mf->path, sum, p->line, v);
}

static void rec_end(struct parser *p) { p->end = true; }

/* The records after the first line, by their first word. */
static const struct record {
    const char *word;
    int since;     /* known from this format on (before: an unknown record) */
    int need;      /* must be there from this format on; 0: optional */
    int arity;     /* the line's token count; 0: key-value pairs (each handler asks for its own) */
    bool repeats;  /* one per rank file; every other record appears once */
    void (*parse)(struct parser *p);
} records[] = {
    {"step", 1, 1, 2, false, rec_step},
    {"run", 1, 0, 2, false, rec_run},
    {"model", 1, 1, 0, false, rec_model},
    {"arch", L3D_CKPT_FORMAT, 0, 0, false, rec_arch},
    {"moe", L3D_CKPT_FORMAT, 0, 0, false, rec_moe},
    {"dtype", L3D_CKPT_FORMAT_DTYPES, L3D_CKPT_FORMAT_DTYPES, 0, false, rec_dtype},
    {"layout", 1, 1, 0, false, rec_layout},
    {"data", 1, 1, 0, false, rec_data},
    {"schedule", 1, 1, 0, false, rec_schedule},
    {"adamw", 1, 1, 0, false, rec_adamw},
    {"lossscale", 1, 0, 0, false, rec_lossscale},
    {"file", 1, 0, 0, true, rec_file},
    {"checksum", 1, 0, 2, false, rec_checksum},
    {"end", 1, 0, 0, false, rec_end},
};
#define NRECORDS ((int)(sizeof records / sizeof records[0]))

/* One line's tokens: the first line, else the handler of its record. */
static void parse_line(struct parser *p) {
    struct l3d_ckpt_manifest *mf = p->mf;
    if (mf->format == 0) {
        rec_format(p);
        return;
    }
    int k = 0;
    while (k < NRECORDS && strcmp(p->tok[0], records[k].word) != 0) k++;
    if (k == NRECORDS || mf->format < records[k].since) {
        p->st = l3d_error(L3D_ERR_FORMAT, "%s line %d: unknown record '%s'", mf->path, p->line,
                          p->tok[0]);
        return;
    }
    const struct record *r = &records[k];
    if (!r->repeats && (p->seen >> k & 1))
        p->st = l3d_error(L3D_ERR_FORMAT, "%s line %d: a second '%s' record: the manifest is "
                          "damaged", mf->path, p->line, r->word);
    else if (r->arity && p->n != r->arity)
        p->st = l3d_error(L3D_ERR_FORMAT, "%s line %d: '%s' record of %d fields, not %d: the "
                          "manifest is damaged", mf->path, p->line, r->word, p->n, r->arity);
    else
        r->parse(p);
    p->seen |= 1u << k;
}

/* After the last line: every record the format needs, the checksum, `end`, every rank file. */
static l3d_status parse_done(struct parser *p) {
    const struct l3d_ckpt_manifest *mf = p->mf;
    for (int k = 0; p->st == L3D_OK && k < NRECORDS; k++)
        if (records[k].need && mf->format >= records[k].need && !(p->seen >> k & 1))
            p->st = l3d_error(L3D_ERR_FORMAT, "%s: no '%s' record: the manifest is damaged",
                              mf->path, records[k].word);
    if (p->st == L3D_OK && !p->sum && mf->format >= L3D_CKPT_FORMAT)
        p->st = l3d_error(L3D_ERR_FORMAT, "%s: no 'checksum' line (format %d carries one): the "
                          "manifest is damaged or truncated", mf->path, mf->format);
    if (p->st == L3D_OK && !p->end)
        p->st = l3d_error(L3D_ERR_FORMAT, "%s: no 'end' line: the manifest is truncated", mf->path);
    if (p->st == L3D_OK && p->nfile != mf->nfiles)
        p->st = l3d_error(L3D_ERR_FORMAT, "%s lists %d rank files for a world of %d with %d "
                          "chunk(s) each", mf->path, p->nfile, mf->lay.world, mf->nc);
    return p->st;
}

#define MANIFEST_MAX_BYTES ((int64_t)1 << 30)
#define MANIFEST_LINE 2048

/* The manifest's text (len bytes; mf->path and mf->dir set) into mf, checked record by record:
 * every value parsed in full and in its range, the model against l3d_gpt_config_finish's
 * limits, the table of rank files against the text's size before it is allocated; from format
 * 4 on the `checksum` line covers every byte above it. The checksum guards against damage, the
 * ranges against values no run writes (an edit with the checksum recomputed). */
static l3d_status manifest_parse(struct l3d_ckpt_manifest *mf, const char *text, size_t len) {
    char line[MANIFEST_LINE], *tok[MAXTOK];
    struct parser p = {.mf = mf, .text = text, .len = len, .tok = tok, .st = L3D_OK};
    for (size_t next; p.st == L3D_OK && !p.end && p.at < len; p.at = next) {
        const char *nl = memchr(text + p.at, '\n', len - p.at);
        next = nl ? (size_t)(nl - text) + 1 : len;
        p.line++;
        if (next - p.at >= sizeof line || memchr(text + p.at, '\0', next - p.at)) {
            p.st = l3d_error(L3D_ERR_FORMAT, "%s line %d: %s: the manifest is damaged", mf->path,
                             p.line, next - p.at >= sizeof line ? "too long" : "a NUL byte");
            break;
        }
        memcpy(line, text + p.at, next - p.at);
        line[next - p.at] = '\0';
        if ((p.n = tokenize(line, tok)) > 0) parse_line(&p);
    }
    if (p.st == L3D_OK) parse_done(&p);
    if (p.st != L3D_OK) l3d_ckpt_manifest_free(mf);
    return p.st;
}

/* Reads and checks dir/manifest: every record present, the layout possible for the model. */
l3d_status l3d_ckpt_manifest_read(const char *dir, struct l3d_ckpt_manifest *mf) {
    memset(mf, 0, sizeof *mf);
    if (l3d_ckpt_long_path(dir) != L3D_OK) return L3D_ERR_ARG;
    l3d_ckpt_join(mf->dir, sizeof mf->dir, dir, "", "");
    l3d_ckpt_join(mf->path, sizeof mf->path, dir, "/", "manifest");
    int fd;
    int64_t size;
    l3d_status st = l3d_open_regular(mf->path, "checkpoint manifest", &fd, &size);
    if (st != L3D_OK)
        return l3d_error(st, "%s (is %s a checkpoint step directory?)", l3d_error_message(), dir);
    if (size > MANIFEST_MAX_BYTES) {
        close(fd);
        return l3d_error(L3D_ERR_FORMAT, "%s: %lld bytes, more than a manifest can hold (%lld): "
                         "not a checkpoint manifest", mf->path, (long long)size,
                         (long long)MANIFEST_MAX_BYTES);
    }
    char *text = l3d_try_alloc((size_t)size + 1, "checkpoint manifest");
    if (!text) {
        close(fd);
        return l3d_error(L3D_ERR_OOM, "%s: no memory to read its %lld bytes", mf->path,
                         (long long)size);
    }
    int64_t got = 0;
    for (ssize_t k = 1; got < size && k > 0; got += k > 0 ? k : 0) {
        k = read(fd, text + got, (size_t)(size - got));
        if (k < 0 && errno == EINTR) k = 1, got -= 1;
    }
    int e = errno;
    close(fd);
    if (got != size) {
        l3d_free(text);
        return l3d_error(L3D_ERR_IO, "cannot read %s: %s", mf->path,
                         got < size ? strerror(e) : "it changed while read");
    }
    st = manifest_parse(mf, text, (size_t)size);
    l3d_free(text);
    return st;
}

/* ---- check ----------------------------------------------------------------------------------- */

/* The layout the manifest describes must be able to hold its model: tp x pp x dp = world, every
 * shard inside the model with the parameter count its shape gives, the optimizer ranges inside
 * their shards, and every layer of every tensor-parallel slice held by some rank's parameters. */
l3d_status l3d_ckpt_manifest_check_layout(const struct l3d_ckpt_manifest *mf) {
    const struct l3d_ckpt_layout *l = &mf->lay;
    const struct l3d_model_spec *c = &mf->cfg;
    if (l->layout.tp < 1 || l->layout.pp < 1 || l->layout.dp < 1 ||
        (int64_t)l->layout.tp * l->layout.pp * l->layout.dp != l->world || l->layout.zero < 0 ||
        l->layout.zero > 3)
        return l3d_error(L3D_ERR_LAYOUT,
                         "%s: layout tp %d x pp %d x dp %d (ZeRO-%d) does not "
                         "make its world of %d ranks",
                         mf->path, l->layout.tp, l->layout.pp, l->layout.dp, l->layout.zero,
                         l->world);
    if (c->NH % l->layout.tp != 0 || c->ffn % l->layout.tp != 0 ||
        l3d_model_kv_heads(c) % l->layout.tp != 0 ||
        c->Vp % l->layout.tp != 0 || (int64_t)l->layout.pp * mf->nc > c->L)
        return l3d_error(L3D_ERR_LAYOUT,
                         "%s: layout tp %d x pp %d is impossible for the model "
                         "with %d chunk(s) per rank (NH=%d heads, %d key/value heads, %lld FFN "
                         "columns, Vp=%d, L=%d layers): the checkpoint is damaged",
                         mf->path, l->layout.tp, l->layout.pp, mf->nc, c->NH,
                         l3d_model_kv_heads(c), (long long)c->ffn, c->Vp, c->L);
    /* every (layer, head) slice must be held by some piece's parameters */
    bool *held = calloc((size_t)c->L * (size_t)c->NH, 1);
    if (!held)
        return l3d_error(L3D_ERR_OOM, "%s: no memory to check the %lld (layer, head) slices of its "
                         "model", mf->path, (long long)c->L * c->NH);
    bool emb = false, head = false;
    for (int r = 0; r < mf->nfiles; r++) {
        const struct l3d_ckpt_mf_file *f = &mf->files[r];
        struct l3d_tensor_info t[L3D_NUM_TENSORS];
        if (l3d_shard_check(c, &f->shard) != L3D_OK) {
            free(held);
            return l3d_error(L3D_ERR_LAYOUT, "%s: %s: %s", mf->path, f->name, l3d_error_message());
        }
        int64_t n = l3d_gpt_plan_tensors(c, &f->shard, t);
        if ((f->params != 0 && f->params != n) || f->opt_start < 0 || f->opt_count < 0 ||
            f->opt_start > n || f->opt_count > n - f->opt_start ||
            f->bytes != mf->header + l3d_ckpt_psize(mf) * f->params +
                            2 * l3d_ckpt_msize(mf) * f->opt_count) {
            free(held);
            return l3d_error(L3D_ERR_LAYOUT, "%s: %s: %lld parameters, optimizer range from "
                             "%lld of %lld, %lld bytes do not fit its shard of %lld parameters",
                             mf->path, f->name, (long long)f->params, (long long)f->opt_start,
                             (long long)f->opt_count, (long long)f->bytes, (long long)n);
        }
        if (!f->params) continue;
        emb |= f->shard.has_embedding;
        head |= f->shard.has_head;
        for (int ly = 0; ly < f->shard.layer_count; ly++)
            for (int h = 0; h < f->shard.head_count; h++)
                held[(size_t)(f->shard.layer_start + ly) * c->NH + f->shard.head_start + h] = true;
    }
    int64_t missing = 0;
    for (int64_t i = 0; i < (int64_t)c->L * c->NH; i++) missing += !held[i];
    free(held);
    if (missing || !emb || !head)
        return l3d_error(L3D_ERR_LAYOUT, "%s: the rank files' parameters miss %lld of the model's "
                         "%lld (layer, head) slices%s%s: the layout cannot hold the model",
                         mf->path, (long long)missing, (long long)c->L * c->NH,
                         emb ? "" : ", the embedding", head ? "" : ", the head");
    return L3D_OK;
}

l3d_status l3d_ckpt_manifest_check(const char *text, size_t len) {
    struct l3d_ckpt_manifest mf;
    memset(&mf, 0, sizeof mf);
    strcpy(mf.dir, "(text)");
    strcpy(mf.path, "(text)/manifest");
    l3d_status st = manifest_parse(&mf, text, len);
    if (st != L3D_OK) return st; /* freed */
    st = l3d_ckpt_manifest_check_layout(&mf);
    l3d_ckpt_manifest_free(&mf);
    return st;
}

/* ---- run id ---------------------------------------------------------------------------------- */

/* The records before the file lines (the run id among them) fit in this many bytes of any
 * manifest this llm3d writes; a run id read stops there (a device or a huge file is not read
 * on). */
#define MANIFEST_HEAD_BYTES 8192

l3d_status l3d_ckpt_run_id(const char *dir, uint64_t *id) {
    char path[L3D_CKPT_PATH_CAP], head[MANIFEST_HEAD_BYTES + 1];
    struct stat sb;
    *id = 0;
    if (l3d_ckpt_long_path(dir) != L3D_OK) return L3D_ERR_ARG;
    l3d_ckpt_join(path, sizeof path, dir, "/", "manifest");
    if (lstat(path, &sb) != 0 && errno == ENOENT) return L3D_OK; /* none: no id */
    /* a FIFO or a device (a symbolic link to /dev/zero) is refused, never read */
    int fd;
    l3d_status st = l3d_open_regular(path, "checkpoint manifest", &fd, NULL);
    if (st != L3D_OK) return st;
    ssize_t n;
    do n = read(fd, head, MANIFEST_HEAD_BYTES);
    while (n < 0 && errno == EINTR);
    int e = errno;
    close(fd);
    if (n < 0) return l3d_error(L3D_ERR_IO, "cannot read %s: %s", path, strerror(e));
    head[n] = '\0';
    unsigned long long x;
    for (char *line = head, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = '\0';
        if (strncmp(line, "file ", 5) == 0) break; /* the records before the file lines hold it */
        if (sscanf(line, "run %llx", &x) == 1) {
            *id = x;
            break;
        }
    }
    return L3D_OK;
}
