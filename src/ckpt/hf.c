/* Hugging Face model folders (include/llm3d/hf.h): config.json to and from the model spec, the
 * names and layouts of each family's tensors over the llm3d tensor table (GPT2LMHeadModel's,
 * LlamaForCausalLM's: the keys and the map are the family's row, include/llm3d/arch.h), and the
 * folder read into (written from) the full model's flat fp32 parameters. */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt/ckpt-impl.h"
#include "llm3d/arch.h"
#include "llm3d/backend.h"
#include "llm3d/ckpt.h"
#include "llm3d/hf.h"
#include "llm3d/tokenizer.h"
#include "llm3d/json.h"

/* ---- config.json -------------------------------------------------------------------------- */

/* The least norm epsilon read: smaller ones are 0 (or subnormal) as the fp32 the model keeps. */
#define EPS_LO 1e-38

struct cfg_reader {
    const struct l3d_json *doc;
    const char *what;
    l3d_status st; /* the first error */
};

/* A value for a message: a number as written, a string quoted, else its kind ("null", "true"). */
static const char *value_text(const struct l3d_json *v, char *buf, size_t cap) {
    if (v->type == L3D_JSON_NUMBER) snprintf(buf, cap, "%.40s", v->str);
    else if (v->type == L3D_JSON_STRING) snprintf(buf, cap, "the string \"%.40s\"", v->str);
    else if (v->type == L3D_JSON_BOOL) snprintf(buf, cap, "%s", v->boolean ? "true" : "false");
    else snprintf(buf, cap, "%s", v->type == L3D_JSON_NULL ? "null" : l3d_json_type_name(v->type));
    return buf;
}

/* An integer key (required unless dflt >= 0, then its value when absent or null, as Hugging
 * Face reads n_inner, num_key_value_heads and head_dim). */
static int get_int(struct cfg_reader *r, const char *key, int64_t dflt, int64_t most) {
    const struct l3d_json *v = l3d_json_get(r->doc, key);
    int64_t x = dflt;
    char b[64];
    if (r->st != L3D_OK) return 0;
    if ((!v || v->type == L3D_JSON_NULL) && dflt >= 0) return (int)dflt;
    if (!v || !l3d_json_int(v, &x) || x < 1 || x > most)
        r->st = l3d_error(L3D_ERR_FORMAT, "%s: \"%s\" is %s: give an integer in [1, %lld]", r->what,
                          key, v ? value_text(v, b, sizeof b) : "missing", (long long)most);
    return (int)x;
}

/* A number key in (lo, hi), hi INFINITY for any finite one (1e999 reads as infinity); absent:
 * dflt, or refused when dflt is NaN. null is refused: Python passes None on, no default. */
static double get_num(struct cfg_reader *r, const char *key, double dflt, double lo, double hi) {
    const struct l3d_json *v = l3d_json_get(r->doc, key);
    double x = dflt;
    char b[64], range[64];
    if (r->st != L3D_OK || (!v && !isnan(dflt))) return dflt;
    if (v && l3d_json_num(v, &x) && isfinite(x) && x > lo && x < hi) return x;
    if (isinf(hi)) snprintf(range, sizeof range, "a finite number above %g", lo);
    else snprintf(range, sizeof range, "a number in (%g, %g)", lo, hi);
    r->st = l3d_error(L3D_ERR_FORMAT, "%s: \"%s\" is %s: give %s", r->what, key,
                      v ? value_text(v, b, sizeof b) : "missing", range);
    return dflt;
}

/* A boolean key; absent: dflt. null is refused: Python reads it as false, not as the default. */
static bool get_bool(struct cfg_reader *r, const char *key, bool dflt) {
    const struct l3d_json *v = l3d_json_get(r->doc, key);
    char b[64];
    if (r->st != L3D_OK || !v) return dflt;
    if (v->type != L3D_JSON_BOOL)
        r->st = l3d_error(L3D_ERR_FORMAT, "%s: \"%s\" is %s: give true or false%s", r->what, key,
                          value_text(v, b, sizeof b), v->type == L3D_JSON_NULL ? " (Python reads "
                          "null as false; llm3d does not guess)" : "");
    return v->boolean;
}

/* A string key that must be one of `ok` (NULL-terminated) when present; absent: accepted. */
static void want_str(struct cfg_reader *r, const char *key, const char *const *ok,
                     const char *why) {
    const struct l3d_json *v = l3d_json_get(r->doc, key);
    if (r->st != L3D_OK || !v) return;
    const char *s = l3d_json_str(v);
    char b[64];
    for (int i = 0; s && ok[i]; i++)
        if (strcmp(s, ok[i]) == 0) return;
    if (s) snprintf(b, sizeof b, "\"%.40s\"", s);
    r->st = l3d_error(L3D_ERR_FORMAT, "%s: \"%s\" is %s: llm3d cannot honour it (%s)", r->what,
                      key, s ? b : value_text(v, b, sizeof b), why);
}

/* A boolean key the code supports only with the value `need`. */
static void want_bool(struct cfg_reader *r, const char *key, bool need, const char *why) {
    if (r->st == L3D_OK && get_bool(r, key, need) != need && r->st == L3D_OK)
        r->st = l3d_error(L3D_ERR_FORMAT, "%s: \"%s\" is %s: llm3d cannot honour it (%s)",
                          r->what, key, need ? "false" : "true", why);
}

/* rope_scaling: null, or Llama 3.1's {"rope_type": "llama3", ...}. */
static void read_rope_scaling(struct cfg_reader *r, struct l3d_model_spec *m) {
    const struct l3d_json *s = l3d_json_get(r->doc, "rope_scaling");
    if (r->st != L3D_OK || !s || s->type == L3D_JSON_NULL) return;
    struct cfg_reader sub = {.doc = s, .what = r->what, .st = L3D_OK};
    const char *type = l3d_json_str(l3d_json_get(s, "rope_type"));
    if (!type) type = l3d_json_str(l3d_json_get(s, "type")); /* the older spelling */
    if (s->type != L3D_JSON_OBJECT || !type || strcmp(type, "llama3") != 0) {
        r->st = l3d_error(L3D_ERR_FORMAT, "%s: \"rope_scaling\" of type %.40s: llm3d implements "
                          "Llama 3.1's (\"rope_type\": \"llama3\") only", r->what,
                          type ? type : "(none)");
        return;
    }
    m->rope.factor = get_num(&sub, "factor", NAN, 0.0, INFINITY); /* NaN: required */
    m->rope.low_freq_factor = get_num(&sub, "low_freq_factor", NAN, 0.0, INFINITY);
    m->rope.high_freq_factor = get_num(&sub, "high_freq_factor", NAN, 0.0, INFINITY);
    m->rope.original_context = get_int(&sub, "original_max_position_embeddings", -1,
                                       L3D_MAX_CONTEXT);
    r->st = sub.st;
}

/* head_dim: a head's size, channels / heads when absent or null (Qwen3 sets it apart: 128 over
 * hidden 2048 and 32 heads); kept 0 when it is channels / heads, as a spec without it. */
static void read_head_dim(struct cfg_reader *r, const char *key, struct l3d_model_spec *m) {
    if (r->st != L3D_OK || m->NH <= 0) return;
    int hd = get_int(r, key, m->C % m->NH == 0 ? m->C / m->NH : 0, 1 << 20);
    if (r->st == L3D_OK && hd < 1)
        r->st = l3d_error(L3D_ERR_FORMAT, "%s: \"%s\" missing, and %d channels do not split "
                          "into %d heads: give the head size", r->what, key, m->C, m->NH);
    m->head_dim = (int64_t)hd * m->NH == m->C ? 0 : hd;
}

/* The load-balancing loss coefficient: counted by Hugging Face only when output_router_logits
 * is true (MixtralForCausalLM's forward), so read as 0 otherwise; a finite number >= 0. */
static void read_aux_coef(struct cfg_reader *r, const char *key, double dflt,
                          struct l3d_model_spec *m) {
    double x = get_num(r, key, dflt, -INFINITY, INFINITY);
    if (r->st == L3D_OK && x < 0)
        r->st = l3d_error(L3D_ERR_FORMAT, "%s: \"%s\" is %g: give a coefficient >= 0", r->what,
                          key, x);
    m->moe.aux_coef = get_bool(r, "output_router_logits", false) ? x : 0.0;
}

/* A number llm3d honours only at 0: absent, null or 0. */
static void want_zero(struct cfg_reader *r, const char *key, const char *why) {
    const struct l3d_json *v = l3d_json_get(r->doc, key);
    double x = 0;
    char b[64];
    if (r->st != L3D_OK || !v || v->type == L3D_JSON_NULL || (l3d_json_num(v, &x) && x == 0))
        return;
    r->st = l3d_error(L3D_ERR_FORMAT, "%s: \"%s\" is %s: llm3d cannot honour it (%s); give 0",
                      r->what, key, value_text(v, b, sizeof b), why);
}

/* A key llm3d honours only as null or absent. */
static void want_null(struct cfg_reader *r, const char *key, const char *why) {
    const struct l3d_json *v = l3d_json_get(r->doc, key);
    char b[64];
    if (r->st != L3D_OK || !v || v->type == L3D_JSON_NULL) return;
    r->st = l3d_error(L3D_ERR_FORMAT, "%s: \"%s\" is %s: llm3d cannot honour it (%s); give null",
                      r->what, key, value_text(v, b, sizeof b), why);
}

/* A whole number llm3d honours only at `need` (absent: accepted). */
static void want_fixed(struct cfg_reader *r, const char *key, int64_t need, const char *why) {
    const struct l3d_json *v = l3d_json_get(r->doc, key);
    int64_t x = need;
    char b[64];
    if (r->st != L3D_OK || !v || (l3d_json_int(v, &x) && x == need)) return;
    r->st = l3d_error(L3D_ERR_FORMAT, "%s: \"%s\" is %s: llm3d cannot honour it (%s); give %lld",
                      r->what, key, value_text(v, b, sizeof b), why, (long long)need);
}

/* A list llm3d honours only empty (absent or null: accepted). */
static void want_empty(struct cfg_reader *r, const char *key, const char *why) {
    const struct l3d_json *v = l3d_json_get(r->doc, key);
    char b[64];
    if (r->st != L3D_OK || !v || v->type == L3D_JSON_NULL ||
        (v->type == L3D_JSON_ARRAY && v->count == 0))
        return;
    if (v->type == L3D_JSON_ARRAY) snprintf(b, sizeof b, "a list of %zu", v->count);
    r->st = l3d_error(L3D_ERR_FORMAT, "%s: \"%s\" is %s: llm3d cannot honour it (%s); give []",
                      r->what, key, v->type == L3D_JSON_ARRAY ? b : value_text(v, b, sizeof b),
                      why);
}

/* Key k of family a's config.json into m. */
static void read_key(struct cfg_reader *r, const struct l3d_arch_info *a,
                     const struct l3d_arch_key *k, struct l3d_model_spec *m) {
    const char *key = k->key;
    int64_t dflt = (int64_t)k->dflt;
    switch (k->kind) {
    case L3D_KEY_LAYERS: m->L = get_int(r, key, dflt, L3D_MAX_LAYERS); break;
    case L3D_KEY_CHANNELS: m->C = get_int(r, key, dflt, L3D_MAX_CHANNELS); break;
    case L3D_KEY_HEADS: m->NH = get_int(r, key, dflt, 1 << 16); break;
    case L3D_KEY_KV_HEADS: m->NKV = get_int(r, key, m->NH, 1 << 16); break;
    case L3D_KEY_HEAD_DIM: read_head_dim(r, key, m); break;
    case L3D_KEY_FFN: m->ffn = get_int(r, key, dflt, 16LL * L3D_MAX_CHANNELS); break;
    case L3D_KEY_VOCAB: m->V = get_int(r, key, dflt, 1 << 30); break;
    case L3D_KEY_CONTEXT: m->maxT = get_int(r, key, dflt, L3D_MAX_CONTEXT); break;
    case L3D_KEY_EPS: m->norm_eps = (float)get_num(r, key, k->dflt, EPS_LO, 1.0); break;
    case L3D_KEY_THETA: m->rope.theta = get_num(r, key, k->dflt, 1.0, INFINITY); break;
    case L3D_KEY_ROPE_SCALING: read_rope_scaling(r, m); break;
    case L3D_KEY_TIED: m->untied = !get_bool(r, key, !a->untied); break;
    case L3D_KEY_STRING: want_str(r, key, k->values, k->why); break;
    case L3D_KEY_BOOL: want_bool(r, key, k->need, k->why); break;
    case L3D_KEY_EXPERTS: m->moe.experts = get_int(r, key, dflt, 1 << 16); break;
    case L3D_KEY_TOP_K: m->moe.top_k = get_int(r, key, dflt, 1 << 16); break;
    case L3D_KEY_EXPERT_FFN: m->moe.ffn = get_int(r, key, dflt, 16LL * L3D_MAX_CHANNELS); break;
    case L3D_KEY_NORM_TOPK: m->moe.norm_topk = get_bool(r, key, k->dflt != 0); break;
    case L3D_KEY_AUX_COEF: read_aux_coef(r, key, k->dflt, m); break;
    case L3D_KEY_ROUTER_LOGITS: get_bool(r, key, false); break; /* with AUX_COEF */
    case L3D_KEY_ZERO: want_zero(r, key, k->why); break;
    case L3D_KEY_NULL: want_null(r, key, k->why); break;
    case L3D_KEY_FIXED: want_fixed(r, key, dflt, k->why); break;
    case L3D_KEY_EMPTY: want_empty(r, key, k->why); break;
    }
}

/* The experts a token picks against those a layer has (both at least 1: get_int), named as the
 * file names them: the model's own rule (l3d_moe_spec_check) names train's flags. */
static void check_top_k(struct cfg_reader *r, const struct l3d_arch_info *a,
                        const struct l3d_model_spec *m) {
    const struct l3d_arch_key *k = l3d_arch_key_of(a, L3D_KEY_TOP_K);
    const struct l3d_arch_key *e = l3d_arch_key_of(a, L3D_KEY_EXPERTS);
    if (r->st != L3D_OK || !k || !e || m->moe.top_k <= m->moe.experts) return;
    r->st = l3d_error(L3D_ERR_FORMAT, "%s: \"%s\" is %d but \"%s\" is %d: each token picks 1 to "
                      "%d of a layer's experts; give \"%s\" at most %d in the file", r->what,
                      k->key, m->moe.top_k, e->key, m->moe.experts, m->moe.experts, k->key,
                      m->moe.experts);
}

l3d_status l3d_hf_config_parse(const char *text, size_t len, const char *what,
                               struct l3d_model_spec *cfg) {
    struct l3d_json doc;
    memset(cfg, 0, sizeof *cfg);
    l3d_status st = l3d_json_parse(&doc, text, len, what);
    if (st == L3D_OK && doc.type != L3D_JSON_OBJECT)
        st = l3d_error(L3D_ERR_FORMAT, "%s: %s, not an object", what,
                       l3d_json_type_name(doc.type));
    struct cfg_reader r = {.doc = &doc, .what = what, .st = st};
    const struct l3d_json *mt = st == L3D_OK ? l3d_json_get(&doc, "model_type") : NULL;
    const char *type = l3d_json_str(mt);
    const struct l3d_arch_info *a = l3d_arch_by_hf_type(type);
    char b[64], list[128];
    if (st == L3D_OK && a) {
        l3d_model_set_arch(cfg, a->arch);
        cfg->qk_norm = a->qk_norm; /* a flavour's attention block (Qwen3) */
        for (int i = 0; i < a->n_hf_keys; i++)
            if (a->hf_keys[i].io & L3D_KEY_READ) read_key(&r, a, &a->hf_keys[i], cfg);
        /* Mixtral: the experts' width is the only MLP width; its router always renormalises */
        if (a->moe && !l3d_arch_key_of(a, L3D_KEY_FFN)) cfg->ffn = cfg->moe.ffn;
        if (a->moe && !l3d_arch_key_of(a, L3D_KEY_NORM_TOPK)) cfg->moe.norm_topk = true;
        check_top_k(&r, a, cfg);
    } else if (st == L3D_OK) {
        if (type) snprintf(b, sizeof b, "\"%.40s\"", type);
        r.st = l3d_error(L3D_ERR_FORMAT, "%s: \"model_type\" is %s: llm3d reads %s", what,
                         type ? b : mt ? value_text(mt, b, sizeof b) : "missing",
                         l3d_arch_list(list, sizeof list, "and", true));
    }
    l3d_json_free(&doc);
    if (r.st != L3D_OK) return r.st;
    if (l3d_gpt_config_finish(cfg) != L3D_OK)
        return l3d_error(L3D_ERR_FORMAT, "%s: %s", what, l3d_error_message());
    return L3D_OK;
}

/* dir/config.json into cfg, its path into path (L3D_CKPT_PATH_CAP bytes). */
static l3d_status read_config(const char *dir, struct l3d_model_spec *cfg, char *path) {
    char *text = NULL;
    size_t len = 0;
    l3d_status st = l3d_ckpt_long_path(dir);
    if (st != L3D_OK) return st;
    l3d_ckpt_join(path, L3D_CKPT_PATH_CAP, dir, "/", "config.json");
    st = l3d_ckpt_read_text(path, "config.json", &text, &len);
    if (st == L3D_OK) st = l3d_hf_config_parse(text, len, path, cfg);
    l3d_free(text);
    return st;
}

static l3d_status check_headers(const char *dir, const struct l3d_model_spec *cfg,
                                const char *cfgpath);

l3d_status l3d_hf_config_read(const char *dir, struct l3d_model_spec *cfg) {
    char path[L3D_CKPT_PATH_CAP];
    l3d_status st = read_config(dir, cfg, path);
    return st == L3D_OK ? check_headers(dir, cfg, path) : st;
}

/* The shortest decimal that reads back as x (float: strtof; double: strtod). */
static const char *shortest(char *buf, size_t cap, double x, bool single) {
    for (int p = single ? 6 : 15; p <= 17; p++) {
        snprintf(buf, cap, "%.*g", p, x);
        if (single ? strtof(buf, NULL) == (float)x : strtod(buf, NULL) == x) break;
    }
    return buf;
}

/* rope_scaling's value: null, or Llama 3.1's scaling. */
static void write_rope_scaling(FILE *f, const struct l3d_model_spec *m) {
    if (m->rope.factor <= 0) {
        fprintf(f, "null");
        return;
    }
    char v[3][32];
    shortest(v[0], sizeof v[0], m->rope.factor, false);
    shortest(v[1], sizeof v[1], m->rope.low_freq_factor, false);
    shortest(v[2], sizeof v[2], m->rope.high_freq_factor, false);
    fprintf(f, "{\"rope_type\": \"llama3\", \"factor\": %s, \"low_freq_factor\": %s, "
            "\"high_freq_factor\": %s, \"original_max_position_embeddings\": %d}", v[0], v[1],
            v[2], m->rope.original_context);
}

/* Key k of m's config.json, a line. */
static void write_key(FILE *f, const struct l3d_arch_key *k, const struct l3d_model_spec *m) {
    char num[32];
    fprintf(f, "  \"%s\": ", k->key);
    switch (k->kind) {
    case L3D_KEY_LAYERS: fprintf(f, "%d", m->L); break;
    case L3D_KEY_CHANNELS: fprintf(f, "%d", m->C); break;
    case L3D_KEY_HEADS: fprintf(f, "%d", m->NH); break;
    case L3D_KEY_KV_HEADS: fprintf(f, "%d", l3d_model_kv_heads(m)); break;
    case L3D_KEY_HEAD_DIM: fprintf(f, "%d", l3d_model_head_dim(m)); break;
    case L3D_KEY_FFN: /* null: the default width 4C of an optional key */
        if (k->dflt == 0 && m->ffn == 4LL * m->C) fprintf(f, "null");
        else fprintf(f, "%lld", (long long)m->ffn);
        break;
    case L3D_KEY_VOCAB: fprintf(f, "%d", m->V); break;
    case L3D_KEY_CONTEXT: fprintf(f, "%d", m->maxT); break;
    case L3D_KEY_EPS: fprintf(f, "%s", shortest(num, sizeof num, m->norm_eps, true)); break;
    case L3D_KEY_THETA: fprintf(f, "%s", shortest(num, sizeof num, m->rope.theta, false)); break;
    case L3D_KEY_ROPE_SCALING: write_rope_scaling(f, m); break;
    case L3D_KEY_TIED: fprintf(f, "%s", m->untied ? "false" : "true"); break;
    case L3D_KEY_STRING: fprintf(f, "\"%s\"", k->values[0]); break;
    case L3D_KEY_BOOL: fprintf(f, "%s", k->need ? "true" : "false"); break;
    case L3D_KEY_EXPERTS: fprintf(f, "%d", m->moe.experts); break;
    case L3D_KEY_TOP_K: fprintf(f, "%d", m->moe.top_k); break;
    case L3D_KEY_EXPERT_FFN: fprintf(f, "%lld", (long long)m->moe.ffn); break;
    case L3D_KEY_NORM_TOPK: fprintf(f, "%s", m->moe.norm_topk ? "true" : "false"); break;
    case L3D_KEY_AUX_COEF: fprintf(f, "%s", shortest(num, sizeof num, m->moe.aux_coef, false)); break;
    case L3D_KEY_ROUTER_LOGITS: fprintf(f, "%s", m->moe.aux_coef > 0 ? "true" : "false"); break;
    case L3D_KEY_ZERO: fprintf(f, "0.0"); break;
    case L3D_KEY_NULL: fprintf(f, "null"); break;
    case L3D_KEY_FIXED: fprintf(f, "%lld", (long long)k->dflt); break;
    case L3D_KEY_EMPTY: fprintf(f, "[]"); break;
    }
    fprintf(f, ",\n");
}

char *l3d_hf_config_text(const struct l3d_model_spec *m, enum l3d_dtype dt) {
    const struct l3d_arch_info *a = l3d_arch_hf_row(m); /* l3d_hf_tensors refuses one without */
    char *text = NULL;
    size_t len;
    L3D_ASSERT(a);
    FILE *f = open_memstream(&text, &len);
    if (!f) l3d_fatal(__FILE__, __LINE__, "out of memory for config.json");
    const char *torch = dt == L3D_BF16 ? "bfloat16" : dt == L3D_F16 ? "float16" : "float32";
    fprintf(f, "{\n  \"architectures\": [\"%s\"],\n  \"model_type\": \"%s\",\n",
            a->hf_architecture, a->hf_model_type);
    for (int i = 0; i < a->n_hf_keys; i++)
        if (a->hf_keys[i].io & L3D_KEY_WRITE) write_key(f, &a->hf_keys[i], m);
    fprintf(f, "  \"tie_word_embeddings\": %s,\n  \"torch_dtype\": \"%s\"\n}\n",
            m->untied ? "false" : "true", torch);
    fclose(f);
    char *out = l3d_alloc(len + 1, "config.json");
    memcpy(out, text, len + 1);
    free(text); /* open_memstream's */
    return out;
}

/* ---- the tensor map ------------------------------------------------------------------------ */

struct map_builder {
    const struct l3d_model_spec *cfg;
    struct l3d_tensor_info ti[L3D_NUM_TENSORS];
    struct l3d_hf_tensor *t;
    int n, cap;
    l3d_status st;
};

static int table_index(const struct map_builder *b, const char *name) {
    for (int i = 0; i < L3D_NUM_TENSORS; i++)
        if (b->ti[i].name && strcmp(b->ti[i].name, name) == 0 && b->ti[i].count > 0) return i;
    return -1;
}

/* Where an entry goes: its name's layer and expert, the layer of its table tensor. */
struct map_at {
    int layer, expert;
    int64_t table_layer;
};

/* HF tensor `hf` (a printf pattern of the layer, then the expert) = rows [row0, row0 + rows) of
 * table tensor `name` (which must have (need_rows, cols) per layer), 1-D or a matrix, transposed
 * or not. */
static void add(struct map_builder *b, const char *hf, struct map_at at, const char *name,
                int64_t row0, int64_t rows, int64_t need_rows, int64_t cols, int ndim,
                bool transposed) {
    if (b->n == b->cap) {
        struct l3d_hf_tensor *t = l3d_alloc((size_t)(2 * b->cap + 16) * sizeof *t, "tensor map");
        if (b->n) memcpy(t, b->t, (size_t)b->n * sizeof *t);
        l3d_free(b->t);
        b->t = t;
        b->cap = 2 * b->cap + 16;
    }
    struct l3d_hf_tensor *t = &b->t[b->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->e.name, sizeof t->e.name, hf, at.layer, at.expert);
    t->table = name;
    t->tensor = -1;
    t->layer = at.table_layer;
    t->row0 = row0;
    t->rows = rows;
    t->table_rows = need_rows;
    t->cols = cols;
    t->transposed = transposed;
    t->e.ndim = ndim;
    if (ndim == 1) t->e.shape[0] = rows * cols;
    else if (transposed) t->e.shape[0] = cols, t->e.shape[1] = rows;
    else t->e.shape[0] = rows, t->e.shape[1] = cols;
}

/* Each entry's table tensor found, of the shape the architecture needs. */
static l3d_status bind(struct map_builder *b) {
    for (int i = 0; i < b->n; i++) {
        struct l3d_hf_tensor *t = &b->t[i];
        int k = table_index(b, t->table);
        if (k < 0 || b->ti[k].rows != t->table_rows || b->ti[k].cols != t->cols)
            return l3d_error(L3D_ERR_ARG, "a %s model (this config) needs tensor %s of (%lld, "
                             "%lld) a layer for %s; the model's tensor table has %s: not "
                             "implemented yet", l3d_arch_info(b->cfg->arch)->title,
                             t->table, (long long)t->table_rows, (long long)t->cols, t->e.name,
                             k < 0 ? "none" : "another shape");
        t->tensor = k;
    }
    return L3D_OK;
}

/* Entry t of the family's map, for global layer `layer` (0 for a non-layer one) and expert e:
 * nothing when the layer has no such tensor (a dense MLP's in a MoE layer, or the reverse). The
 * table holds the dense MLP's layers first, then the MoE layers (include/llm3d/model.h). */
static void add_entry(struct map_builder *b, const struct l3d_arch_tensor *t, int layer, int e) {
    const struct l3d_model_spec *m = b->cfg;
    bool moe = l3d_model_moe_layer(m, layer);
    if (t->untied_only && !m->untied) return;
    if (t->layer && (t->part == L3D_PART_DENSE ? moe : t->part != L3D_PART_ALL && !moe)) return;
    struct map_at at = {layer, e, layer};
    if (t->layer && t->part >= L3D_PART_MOE) at.table_layer = layer - m->moe.dense_layers;
    int64_t row0 = l3d_arch_dim(m, t->row0) + e * l3d_arch_dim(m, t->estride);
    add(b, t->hf, at, t->table, row0, l3d_arch_dim(m, t->rows), l3d_arch_dim(m, t->table_rows),
        l3d_arch_dim(m, t->cols), t->ndim, t->transposed);
}

/* A layer's entries [first, end): an expert's run of them once for each expert, each expert's in
 * turn (Hugging Face's experts.0.w1, w2, w3, experts.1.w1, ...), the others once. */
static void map_layer(struct map_builder *b, const struct l3d_arch_tensor *t, int first, int end,
                      int layer) {
    for (int i = first, j; i < end; i = j) {
        for (j = i + 1; t[i].part == L3D_PART_EXPERT && j < end && t[j].part == t[i].part;) j++;
        int experts = t[i].part == L3D_PART_EXPERT ? b->cfg->moe.experts : 1;
        for (int e = 0; e < experts; e++)
            for (int k = i; k < j; k++) add_entry(b, &t[k], layer, e);
    }
}

/* The family's map: its entries before the layers', each layer's, those after. */
static void map_family(struct map_builder *b, const struct l3d_arch_info *a) {
    const struct l3d_arch_tensor *t = a->hf_tensors;
    int n = a->n_hf_tensors, first = 0, end;
    while (first < n && !t[first].layer) add_entry(b, &t[first++], 0, 0);
    for (end = first; end < n && t[end].layer;) end++;
    for (int l = 0; l < b->cfg->L; l++) map_layer(b, t, first, end, l);
    for (int i = end; i < n; i++) add_entry(b, &t[i], 0, 0);
}

l3d_status l3d_hf_tensors_ex(const struct l3d_model_spec *cfg, bool bound,
                             struct l3d_hf_tensor **out, int *n) {
    const struct l3d_arch_info *a = l3d_arch_hf_row(cfg);
    *out = NULL;
    *n = 0;
    if (!a)
        return l3d_error(L3D_ERR_ARG, "a %s model with %s (%s%.0d) has no Hugging Face "
                         "folder (Mixtral's and Qwen3's are Llama's blocks: --arch llama); keep "
                         "llm3d's model.bin or checkpoints", l3d_arch_info(cfg->arch)->title,
                         cfg->moe.experts > 0 ? "experts" : "QK-norm",
                         cfg->moe.experts > 0 ? "--moe-experts " : "--qk-norm",
                         cfg->moe.experts);
    l3d_status rc = l3d_arch_hf_check(a, cfg);
    if (rc != L3D_OK) return rc;
    struct map_builder b = {.cfg = cfg, .st = L3D_OK};
    struct l3d_shard full = l3d_shard_full(cfg);
    l3d_gpt_plan_tensors(cfg, &full, b.ti);
    map_family(&b, a);
    if (bound) b.st = bind(&b);
    if (b.st != L3D_OK) {
        l3d_free(b.t);
        return b.st;
    }
    *out = b.t;
    *n = b.n;
    return L3D_OK;
}

l3d_status l3d_hf_tensors(const struct l3d_model_spec *cfg, struct l3d_hf_tensor **out, int *n) {
    return l3d_hf_tensors_ex(cfg, true, out, n);
}

/* Element (r, c) of HF tensor t's (rows, cols) block lies at this index of the full buffer. */
static int64_t full_index(const struct l3d_tensor_info *ti, const struct l3d_hf_tensor *t) {
    return ti->offset + (t->layer * ti->rows + t->row0) * ti->cols;
}

/* ---- folders ---------------------------------------------------------------------------- */

bool l3d_hf_is_folder(const char *path) {
    char p[L3D_CKPT_PATH_CAP];
    struct stat sb;
    if (strlen(path) >= L3D_CKPT_PATH_CAP - 16 || stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return false;
    l3d_ckpt_join(p, sizeof p, path, "/", "config.json");
    return stat(p, &sb) == 0;
}

bool l3d_hf_has_model(const char *path) {
    DIR *d = opendir(path);
    struct dirent *e;
    bool found = false;
    while (d && !found && (e = readdir(d))) found = l3d_st_owned(e->d_name);
    if (d) closedir(d);
    return found;
}

/* Tensors of a file that map to nothing but are known not to be weights: those of a suffix some
 * family's row ignores (GPT-2's attention mask buffers, older Llama's rotary frequencies), a tied
 * head written anyway. */
static bool ignorable(const struct l3d_arch_info *a, const char *name, bool tied) {
    size_t n = strlen(name);
    for (int f = 0; f < L3D_ARCH_COUNT; f++)
        for (const char *const *tail = l3d_arch_info((enum l3d_arch)f)->hf_ignored; *tail; tail++) {
            size_t k = strlen(*tail);
            if (n >= k && strcmp(name + n - k, *tail) == 0) return true;
        }
    for (int i = 0; tied && i < a->n_hf_tensors; i++)
        if (a->hf_tensors[i].untied_only && strcmp(name, a->hf_tensors[i].hf) == 0) return true;
    return false;
}

/* name past a family's optional prefix (GPT-2 folders written from GPT2Model lack
 * "transformer."), or NULL when it has none. */
static const char *unprefixed(const char *name) {
    for (int f = 0; f < L3D_ARCH_COUNT; f++) {
        const char *p = l3d_arch_info((enum l3d_arch)f)->hf_prefix_optional;
        if (p && strncmp(name, p, strlen(p)) == 0) return name + strlen(p);
    }
    return NULL;
}

/* The file's tensor of HF name `name`, or of the name past its optional prefix. */
static const struct l3d_st_tensor *find_hf(const struct l3d_st *st, const char *name) {
    const struct l3d_st_tensor *t = l3d_st_find(st, name);
    const char *u = t ? NULL : unprefixed(name);
    return u ? l3d_st_find(st, u) : t;
}

/* "[a, b, ...]" */
static void shape_str(char *buf, size_t cap, const int64_t *shape, int ndim) {
    size_t k = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < ndim && k + 24 < cap; d++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%lld", d ? ", " : "", (long long)shape[d]);
    snprintf(buf + k, cap - k, "]");
}

/* The file's tensor for h (*out), of a dtype llm3d reads and the shape the config needs. */
static l3d_status check_one(const struct l3d_st *st, const struct l3d_hf_tensor *h,
                            const char *cfgpath, const struct l3d_st_tensor **out) {
    const struct l3d_st_tensor *t = *out = find_hf(st, h->e.name);
    if (!t) /* st has a file: an index names at least one */
        return l3d_error(L3D_ERR_FORMAT, "%s: no tensor %s, which the model of %s needs",
                         st->nfiles ? st->files[0] : cfgpath, h->e.name, cfgpath);
    if (!t->handled) /* said before its shape: an I64 tensor's shape is not the weight's */
        return l3d_st_read_f32(st, t, NULL); /* the dtype's refusal, nothing read */
    bool same = t->ndim == h->e.ndim;
    for (int d = 0; same && d < t->ndim; d++) same = t->shape[d] == h->e.shape[d];
    if (same) return L3D_OK;
    char got[192], want[64];
    shape_str(got, sizeof got, t->shape, t->ndim);
    shape_str(want, sizeof want, h->e.shape, h->e.ndim);
    return l3d_error(L3D_ERR_FORMAT, "%s: tensor %s has shape %s, but %s needs %s",
                     st->files[t->file], t->name, got, cfgpath, want);
}

/* Every tensor of the files is one the map reads, or ignorable. */
static l3d_status check_extra(const struct l3d_st *st, const struct l3d_hf_tensor *map, int n,
                              const struct l3d_model_spec *cfg, const char *cfgpath) {
    for (int i = 0; i < st->n; i++) {
        const char *name = st->t[i].name;
        bool known = ignorable(l3d_arch_info(cfg->arch), name, !cfg->untied);
        for (int k = 0; !known && k < n; k++) {
            const char *u = unprefixed(map[k].e.name);
            known = strcmp(map[k].e.name, name) == 0 || (u && strcmp(u, name) == 0);
        }
        if (!known)
            return l3d_error(L3D_ERR_FORMAT, "%s: tensor %s has no place in the model %s describes "
                             "(%s): a config that does not match the weights", st->files[st->t[i].file],
                             name, cfgpath, l3d_arch_name(cfg->arch));
    }
    return L3D_OK;
}

/* The experts the files hold in each MoE layer (those of the row's first expert tensor, numbered
 * from 0 without a gap) against config.json's count: a folder of another expert count would
 * otherwise be reported as a stray or a missing tensor, without the two counts. */
static l3d_status check_experts(const struct l3d_st *st, const struct l3d_model_spec *cfg,
                                const char *cfgpath) {
    const struct l3d_arch_info *a = l3d_arch_hf_row(cfg);
    const struct l3d_arch_tensor *x = NULL;
    for (int i = 0; a && !x && i < a->n_hf_tensors; i++)
        if (a->hf_tensors[i].part == L3D_PART_EXPERT) x = &a->hf_tensors[i];
    const struct l3d_arch_key *k = a ? l3d_arch_key_of(a, L3D_KEY_EXPERTS) : NULL;
    const char *at = x ? strstr(strstr(x->hf, "%d") + 2, "%d") : NULL; /* the expert's number */
    char pre[112], head[112];
    if (at) snprintf(pre, sizeof pre, "%.*s", (int)(at - x->hf), x->hf); /* "...%d...experts." */
    for (int l = cfg->moe.dense_layers; at && k && l < cfg->L; l++) {
        int have = 0;
        const struct l3d_st_tensor *last = NULL;
        snprintf(head, sizeof head, pre, l);
        size_t hn = strlen(head), tn = strlen(at + 2);
        for (int i = 0; i < st->n; i++) { /* head, digits, tail: the highest number present */
            const char *nm = st->t[i].name, *d = nm + hn;
            size_t len = strlen(nm);
            if (len <= hn + tn || strncmp(nm, head, hn) != 0 || strcmp(nm + len - tn, at + 2) != 0)
                continue;
            long e = 0;
            for (; d < nm + len - tn && *d >= '0' && *d <= '9' && e < (1L << 20); d++)
                e = e * 10 + (*d - '0');
            if (d == nm + len - tn && e + 1 > have) have = (int)e + 1, last = &st->t[i];
        }
        if (have == cfg->moe.experts) continue;
        return l3d_error(L3D_ERR_FORMAT, "%s: layer %d holds %d experts (its last: tensor %s) but "
                         "%s says \"%s\": %d: a config that does not match the weights",
                         last ? st->files[last->file] : st->files[0], l, have,
                         last ? last->name : "none", cfgpath, k->key, cfg->moe.experts);
    }
    return L3D_OK;
}

/* config.json's model against the safetensors headers alone, before a caller allocates the model
 * config.json describes (a small folder may claim any vocabulary): every tensor it needs present
 * with its shape and a dtype llm3d reads, every tensor of the files placed. Nothing of the
 * model's size is allocated, no weight read. */
static l3d_status check_headers(const char *dir, const struct l3d_model_spec *cfg,
                                const char *cfgpath) {
    struct l3d_hf_tensor *map;
    int n;
    l3d_status rc = l3d_hf_tensors_ex(cfg, false, &map, &n); /* names and shapes */
    if (rc != L3D_OK) return rc;
    struct l3d_st st;
    rc = l3d_st_open_dir(&st, dir);
    if (rc == L3D_OK) rc = check_experts(&st, cfg, cfgpath);
    if (rc == L3D_OK) rc = check_extra(&st, map, n, cfg, cfgpath);
    const struct l3d_st_tensor *t;
    for (int i = 0; rc == L3D_OK && i < n; i++) rc = check_one(&st, &map[i], cfgpath, &t);
    if (st.nfiles) l3d_st_close(&st);
    l3d_free(map);
    return rc;
}

/* The folder as a source of the full model's rows (struct l3d_ckpt_rows): each HF tensor's rows
 * of the strip, a Conv1D weight's (stored transposed: llm3d's rows are its columns) read in
 * strips of its rows' pieces through tmp. */
struct hf_rows {
    const struct l3d_st *st;
    const struct l3d_hf_tensor *map;
    int n;
    float *tmp; /* a strip */
    int64_t strip;
};

/* Rows [lo, hi) of HF tensor h (in llm3d's layout) into dst (full columns fc). */
static l3d_status hf_part(const struct hf_rows *s, const struct l3d_hf_tensor *h, int64_t lo,
                          int64_t hi, int64_t fc, float *dst) {
    const struct l3d_st_tensor *t = find_hf(s->st, h->e.name); /* checked (check_one) */
    int64_t a = lo - h->row0, hn = hi - lo;
    if (!h->transposed) return l3d_st_read_f32_range(s->st, t, a * h->cols, hn * h->cols, dst);
    int64_t kb = s->strip / hn > 0 ? s->strip / hn : 1; /* the file's (cols, rows) rows a strip */
    l3d_status rc = L3D_OK;
    for (int64_t i0 = 0; rc == L3D_OK && i0 < h->cols; i0 += kb) {
        int64_t i1 = i0 + kb < h->cols ? i0 + kb : h->cols;
        if (hn == h->rows)
            rc = l3d_st_read_f32_range(s->st, t, i0 * h->rows, (i1 - i0) * h->rows, s->tmp);
        for (int64_t i = i0; rc == L3D_OK && hn != h->rows && i < i1; i++)
            rc = l3d_st_read_f32_range(s->st, t, i * h->rows + a, hn, s->tmp + (i - i0) * hn);
        for (int64_t i = i0; rc == L3D_OK && i < i1; i++) /* file (i, a + j): llm3d's (j, i) */
            for (int64_t j = 0; j < hn; j++) dst[j * fc + i] = s->tmp[(i - i0) * hn + j];
    }
    return rc;
}

static l3d_status hf_rows(void *ctx, int t, int64_t layer, int64_t r0, int64_t n, float *out) {
    const struct hf_rows *s = ctx;
    l3d_status rc = L3D_OK;
    int64_t fc = -1;
    for (int i = 0; i < s->n && fc < 0; i++)
        if (s->map[i].tensor == t) fc = s->map[i].cols;
    L3D_ASSERT(fc > 0);
    memset(out, 0, (size_t)(n * fc) * sizeof(float)); /* the vocabulary's padding rows */
    for (int i = 0; rc == L3D_OK && i < s->n; i++) {
        const struct l3d_hf_tensor *h = &s->map[i];
        int64_t lo = r0 > h->row0 ? r0 : h->row0;
        int64_t hi = r0 + n < h->row0 + h->rows ? r0 + n : h->row0 + h->rows;
        if (h->tensor == t && h->layer == layer && lo < hi)
            rc = hf_part(s, h, lo, hi, fc, out + (lo - r0) * fc);
    }
    return rc;
}

/* The folder's parameters for shard sh of cfg, [q->lo, q->hi) of its flat space into q->put, a
 * strip of rows at a time (l3d_ckpt_reshard): config.json and every tensor's header checked
 * first, then only the shard's rows read. */
static l3d_status hf_load_shard(const char *dir, const struct l3d_model_spec *cfg,
                                const struct l3d_shard *sh, const struct l3d_ckpt_pieces *q) {
    struct l3d_model_spec fc;
    char cfgpath[L3D_CKPT_PATH_CAP];
    l3d_status rc = read_config(dir, &fc, cfgpath); /* its shapes: checked tensor by tensor */
    if (rc != L3D_OK) return rc;
    /* the shapes only: config.json holds no padded vocabulary, and the epsilon and RoPE's
     * scaling shape no tensor (the model being loaded keeps its own) */
    if (!l3d_model_same_shapes(&fc, cfg))
        return l3d_error(L3D_ERR_FORMAT, "%s describes L=%d C=%d NH=%d V=%d T=%d, not the model "
                         "being loaded (L=%d C=%d NH=%d V=%d T=%d)", cfgpath, fc.L, fc.C, fc.NH,
                         fc.V, fc.maxT, cfg->L, cfg->C, cfg->NH, cfg->V, cfg->maxT);
    struct l3d_hf_tensor *map;
    int n;
    if ((rc = l3d_hf_tensors(cfg, &map, &n)) != L3D_OK) return rc;
    struct l3d_st st;
    rc = l3d_st_open_dir(&st, dir);
    if (rc == L3D_OK) rc = check_experts(&st, cfg, cfgpath);
    if (rc == L3D_OK) rc = check_extra(&st, map, n, cfg, cfgpath);
    const struct l3d_st_tensor *t;
    for (int i = 0; rc == L3D_OK && i < n; i++) rc = check_one(&st, &map[i], cfgpath, &t);
    struct hf_rows s = {&st, map, n, NULL, l3d_ckpt_strip(cfg)};
    s.tmp = rc == L3D_OK ? l3d_try_alloc((size_t)s.strip * sizeof(float), "tensor rows") : NULL;
    if (rc == L3D_OK && !s.tmp)
        rc = l3d_error(L3D_ERR_OOM, "%s: no memory for a strip of %lld elements", dir,
                       (long long)s.strip);
    struct l3d_ckpt_rows src = {hf_rows, &s};
    if (rc == L3D_OK) rc = l3d_ckpt_reshard(cfg, sh, &src, q, NULL, dir);
    l3d_free(s.tmp);
    if (st.nfiles) l3d_st_close(&st);
    l3d_free(map);
    return rc;
}

struct to_host {
    float *dst;
};

static void put_host(void *ctx, int64_t off, int64_t n, const float *host) {
    memcpy(((struct to_host *)ctx)->dst + off, host, (size_t)n * sizeof(float));
}

l3d_status l3d_hf_load(const char *dir, const struct l3d_model_spec *cfg, float *full) {
    struct l3d_shard fs = l3d_shard_full(cfg);
    struct to_host h = {full};
    int64_t N = l3d_gpt_param_count(cfg);
    struct l3d_ckpt_pieces q = {.piece = N > 0 ? N : 1, .lo = 0, .hi = N, .put = put_host,
                                .ctx = &h};
    return hf_load_shard(dir, cfg, &fs, &q);
}

struct save_ctx {
    const struct l3d_hf_tensor *map;
    const struct l3d_tensor_info *ti;
    const float *full;
};

static void fill_full(void *ctx, int i, float *out) {
    const struct save_ctx *s = ctx;
    const struct l3d_hf_tensor *h = &s->map[i];
    const float *src = s->full + full_index(&s->ti[h->tensor], h);
    if (!h->transposed) {
        memcpy(out, src, (size_t)(h->rows * h->cols) * sizeof(float));
        return;
    }
    for (int64_t a = 0; a < h->cols; a++)
        for (int64_t j = 0; j < h->rows; j++) out[a * h->rows + j] = src[j * h->cols + a];
}

/* Every weight the folder will hold is finite and, for a 16-bit dt, one that rounds to a finite
 * value: else it would be written as infinity (or NaN), which the reader refuses. Values from
 * l3d_f32_to_f16 / l3d_f32_to_bf16 (nearest even): F16's largest is 65504, and from 65520 (65504
 * + half its ulp) up it rounds to Inf; BF16's largest is 0x7f7f0000 (about 3.3895e38), and from
 * 0x7f7f8000 (its half ulp above, the tie rounding to the even Inf) up. */
static l3d_status check_saveable(const char *dir, const struct l3d_hf_tensor *map, int n,
                                 l3d_st_fill fill, void *ctx, enum l3d_dtype dt) {
    const uint32_t bf16_inf_from = 0x7f7f8000u;
    float limit;
    memcpy(&limit, &bf16_inf_from, sizeof limit);
    if (dt == L3D_F16) limit = 65520.0f;
    int64_t most = 1;
    for (int i = 0; i < n; i++)
        if (map[i].rows * map[i].cols > most) most = map[i].rows * map[i].cols;
    float *x = l3d_try_alloc((size_t)most * sizeof(float), "tensor check");
    if (!x)
        return l3d_error(L3D_ERR_OOM, "%s: no host memory to check a tensor of %lld elements",
                         dir, (long long)most);
    l3d_status rc = L3D_OK;
    for (int i = 0; i < n; i++) {
        const struct l3d_hf_tensor *h = &map[i];
        fill(ctx, i, x); /* as the file holds it: (cols, rows) when transposed */
        int64_t k = 0, count = h->rows * h->cols;
        if (rc != L3D_OK) continue; /* every tensor taken (the model's rows go a piece at a time) */
        while (k < count && isfinite(x[k]) && (dt == L3D_F32 || fabsf(x[k]) < limit)) k++;
        if (k == count) continue;
        int64_t at = k;
        char val[32];
        shortest(val, sizeof val, x[k], true);
        if (!isfinite(x[k]))
            rc = l3d_error(L3D_ERR_ARG, "%s: tensor %s element %lld is %s: a model with NaN or "
                             "infinite weights is not saved (llm3d would refuse to read it back); "
                             "the run diverged: resume from an earlier checkpoint", dir,
                             h->e.name, (long long)at, isnan(x[k]) ? "NaN" : val);
        else
            rc = l3d_error(L3D_ERR_ARG, "%s: tensor %s element %lld is %s, beyond %s's range "
                         "(largest %s): it would be written as infinity; save in %s (train "
                         "--save-dtype, convert --precision)", dir, h->e.name, (long long)at,
                         val, dt == L3D_F16 ? "F16" : "BF16", dt == L3D_F16 ? "65504" : "3.39e38",
                         dt == L3D_F16 ? "fp32 or bf16" : "fp32");
    }
    l3d_free(x);
    return rc;
}

l3d_status l3d_hf_save(const char *dir, const struct l3d_model_spec *cfg, const float *full,
                       enum l3d_dtype dt, int64_t shard_bytes) {
    return l3d_hf_save_tok(dir, cfg, full, dt, shard_bytes, NULL);
}

l3d_status l3d_hf_save_tok(const char *dir, const struct l3d_model_spec *cfg, const float *full,
                           enum l3d_dtype dt, int64_t shard_bytes,
                           const struct l3d_tokenizer *tok) {
    struct l3d_hf_tensor *map;
    int n;
    l3d_status rc = l3d_hf_tensors(cfg, &map, &n);
    if (rc != L3D_OK) return rc;
    struct l3d_shard fs = l3d_shard_full(cfg);
    struct l3d_tensor_info ti[L3D_NUM_TENSORS];
    l3d_gpt_plan_tensors(cfg, &fs, ti);
    struct save_ctx sc = {map, ti, full};
    rc = l3d_hf_save_fill_tok(dir, cfg, fill_full, &sc, dt, shard_bytes, tok);
    l3d_free(map);
    return rc;
}

l3d_status l3d_hf_save_fill(const char *dir, const struct l3d_model_spec *cfg, l3d_st_fill fill,
                            void *ctx, enum l3d_dtype dt, int64_t shard_bytes) {
    return l3d_hf_save_fill_tok(dir, cfg, fill, ctx, dt, shard_bytes, NULL);
}

l3d_status l3d_hf_save_fill_tok(const char *dir, const struct l3d_model_spec *cfg,
                                l3d_st_fill fill, void *ctx, enum l3d_dtype dt,
                                int64_t shard_bytes, const struct l3d_tokenizer *tok) {
    struct l3d_hf_tensor *map;
    int n;
    l3d_status rc = tok ? l3d_tokenizer_fits(tok, cfg->V, dir) : L3D_OK;
    if (rc == L3D_OK) rc = l3d_ckpt_long_path(dir);
    if (rc != L3D_OK || (rc = l3d_hf_tensors(cfg, &map, &n)) != L3D_OK) return rc;
    /* written whole beside dir, then put in its place (include/llm3d/file.h) */
    struct l3d_dir_out out;
    if ((rc = l3d_dir_out_begin(&out, dir, "Hugging Face folder", l3d_st_owned)) != L3D_OK) {
        l3d_free(map);
        return rc;
    }
    rc = check_saveable(dir, map, n, fill, ctx, dt); /* before anything is written */
    if (rc == L3D_OK) rc = l3d_mkdir_p(dir);
    if (rc != L3D_OK) {
        l3d_free(map);
        return rc;
    }
    struct l3d_st_entry *e = l3d_alloc((size_t)n * sizeof *e, "tensor map");
    for (int i = 0; i < n; i++) e[i] = map[i].e;
    rc = l3d_st_write(out.tmp, e, n, fill, ctx, dt, shard_bytes);
    l3d_free(e);
    l3d_free(map);
    if (rc == L3D_OK) {
        char path[L3D_CKPT_PATH_CAP], *text = l3d_hf_config_text(cfg, dt);
        l3d_ckpt_join(path, sizeof path, out.tmp, "/", "config.json");
        rc = l3d_ckpt_write_text_atomic(path, text);
        l3d_free(text);
    }
    /* the tokenizer's files in the same new folder: published with the model, or not at all */
    if (rc == L3D_OK && tok) rc = l3d_tokenizer_write_hf(tok, out.tmp, cfg->maxT);
    if (rc != L3D_OK) {
        l3d_dir_out_abort(&out);
        return rc;
    }
    return l3d_dir_out_commit(&out);
}

/* ---- model files ------------------------------------------------------------------------ */

l3d_status l3d_model_file_config(const char *path, struct l3d_model_spec *cfg) {
    if (l3d_hf_is_folder(path)) return l3d_hf_config_read(path, cfg);
    return l3d_ckpt_read_llmc_config(path, cfg);
}

struct to_device {
    struct l3d_backend *be;
    float *dst;
};

static void put_device(void *ctx, int64_t off, int64_t n, const float *host) {
    const struct to_device *d = ctx;
    l3d_be_copy_h2d(d->be, d->dst + off, host, (size_t)n * sizeof(float));
    l3d_be_sync(d->be); /* before host is refilled */
}

l3d_status l3d_model_file_load(const char *path, struct l3d_gpt *m) {
    if (!l3d_hf_is_folder(path)) return l3d_ckpt_load_llmc(path, m);
    L3D_ASSERT(m->dt == L3D_F32); /* an fp32 model or view */
    struct to_device d = {m->be, m->params};
    struct l3d_ckpt_pieces q = {.piece = l3d_ckpt_strip(&m->cfg), .lo = 0, .hi = m->num_params,
                                .put = put_device, .ctx = &d};
    return hf_load_shard(path, &m->cfg, &m->shard, &q);
}

l3d_status l3d_model_file_load_pieces(const char *path, const struct l3d_gpt *m,
                                      const struct l3d_ckpt_pieces *q) {
    if (!l3d_hf_is_folder(path)) return l3d_ckpt_load_llmc_pieces(path, m, q);
    return hf_load_shard(path, &m->cfg, &m->shard, q);
}
