/* The profile format's keys (src/plan/profile-impl.h): the table, reading a value, writing one. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan/profile-impl.h"

/* The keys, in the order a profile lists them (the calibration's writer keeps it) */
const struct l3d_profile_key l3d_profile_keys[] = {
#define OFF(f) offsetof(struct l3d_profile, f)
#define TEXT(f) L3D_PK_TEXT, OFF(f), 0, false, sizeof(((struct l3d_profile *)0)->f)
    /* name, kind, where, scale (to SI), positive, hi, optional, format */
    {"name", TEXT(name), false, NULL},
    {"device", TEXT(device), false, NULL},
    {"peak_tflops_fp32", L3D_PK_NUM, OFF(peak_fp32), 1e12, false, 1e5, false, "%.4g"},
    {"peak_tflops_bf16", L3D_PK_NUM, OFF(peak_bf16), 1e12, false, 1e5, false, "%.4g"},
    {"peak_tflops_fp16", L3D_PK_NUM, OFF(peak_fp16), 1e12, false, 1e5, false, "%.4g"},
    {"mem_gb", L3D_PK_NUM, OFF(mem_bytes), 1e9, true, 1e5, false, "%.4g"},
    {"mem_bw_gbs", L3D_PK_NUM, OFF(mem_bw), 1e9, true, 1e6, false, "%.4g"},
    {"devices_per_node", L3D_PK_INT, OFF(devices_per_node), 0, true, 1e6, false, NULL},
    {"pair_size", L3D_PK_INT, OFF(pair_size), 0, true, 1e6, false, NULL},
    {"pair_bw_gbs", L3D_PK_NUM, OFF(pair_bw), 1e9, false, 1e6, false, "%.4g"},
    {"intra_bw_gbs", L3D_PK_NUM, OFF(intra_bw), 1e9, false, 1e6, false, "%.4g"},
    {"intra_lat_us", L3D_PK_NUM, OFF(intra_lat), 1e-6, false, 1e6, false, "%.4g"},
    {"inter_bw_gbs", L3D_PK_NUM, OFF(inter_bw), 1e9, false, 1e6, false, "%.4g"},
    {"inter_lat_us", L3D_PK_NUM, OFF(inter_lat), 1e-6, false, 1e6, false, "%.4g"},
    {"gemm_eff", L3D_PK_EFF, 0, 0, true, 1.5, false, "%.3f"},
    {"gemm_eff_wgrad", L3D_PK_WGRAD, OFF(wgrad), 0, true, 1.5, true, "%.3f"},
    {"attn_eff", L3D_PK_NUM, OFF(attn_eff), 1, true, 1.5, false, "%.3f"},
    {"gemm_thread_eff", L3D_PK_NUM, OFF(gemm_thread_eff), 1, true, 1.5, false, "%.3f"},
    {"kernel_bw_eff", L3D_PK_NUM, OFF(kernel_bw_eff), 1, true, 2.5, false, "%.3f"},
    {"kernel_bw_effs", L3D_PK_KERN, OFF(kern_eff), 1, true, 2.5, true, "%.3f"},
    {"dp_overlap", L3D_PK_FRAC, OFF(dp_overlap), 1, false, 1, false, "%.3f"},
    {"reserve_gb", L3D_PK_NUM, OFF(reserve_bytes), 1e9, false, 1e5, true, "%.4g"},
    {"gemm_calibration", L3D_PK_NUM, OFF(gemm_calibration), 1, true, 2, true, "%.3f"},
    {"compute_units", L3D_PK_INT, OFF(compute_units), 0, true, 1e6, true, NULL},
    {"gemm_tile", L3D_PK_TILE, OFF(tile_m), 0, true, 65536, true, NULL},
    {"tp_overlap", L3D_PK_NUM, OFF(tp_overlap), 1, false, 1, true, "%.3f"},
    {"gemm_eff_grid", L3D_PK_GRID, OFF(grid), 0, true, 1.5, true, "%.3f"},
    {"gemm_exact", L3D_PK_EXACT, OFF(exact), 0, true, 1.5, true, "%.3f"},
    /* llm3d's 16-bit kernels (struct l3d_profile_16): all four of a type or none */
#define MIXED(T, i)                                                                                \
    {"gemm_native_" T, L3D_PK_BOOL, OFF(mixed[i].native), 0, false, 0, true, NULL},               \
    {"attn_native_" T, L3D_PK_BOOL, OFF(mixed[i].attn_native), 0, false, 0, true, NULL},          \
    {"gemm_wgrad_block_" T, L3D_PK_NUM, OFF(mixed[i].wgrad_block), 1048576, false, 65536, true,    \
     "%.6g"},                                                                                      \
    {"gemm_eff_" T, L3D_PK_EFF, OFF(mixed[i]), 0, true, 1.5, true, "%.3f"},                       \
    {"gemm_eff_wgrad_" T, L3D_PK_WGRAD, OFF(mixed[i].wgrad), 0, true, 1.5, true, "%.3f"},         \
    {"attn_eff_" T, L3D_PK_NUM, OFF(mixed[i].attn_eff), 1, true, 1.5, true, "%.3f"},              \
    {"gemm_thread_eff_" T, L3D_PK_NUM, OFF(mixed[i].gemm_thread_eff), 1, true, 1.5, true, "%.3f"}, \
    {"kernel_bw_eff_" T, L3D_PK_NUM, OFF(mixed[i].kernel_bw_eff), 1, true, 2.5, true, "%.3f"},    \
    {"kernel_bw_effs_" T, L3D_PK_KERN, OFF(mixed[i].kern_eff), 1, true, 2.5, true, "%.3f"},    \
    {"gemm_eff_grid_" T, L3D_PK_GRID, OFF(mixed[i].grid), 0, true, 1.5, true, "%.3f"},          \
    {"gemm_exact_" T, L3D_PK_EXACT, OFF(mixed[i].exact), 0, true, 1.5, true, "%.3f"}
    MIXED("bf16", 0), MIXED("fp16", 1),
#undef MIXED
#undef TEXT
#undef OFF
};
const size_t l3d_profile_n_keys = sizeof l3d_profile_keys / sizeof l3d_profile_keys[0];

const struct l3d_profile_key *l3d_profile_key_find(const char *name) {
    for (size_t k = 0; k < l3d_profile_n_keys; k++)
        if (strcmp(l3d_profile_keys[k].name, name) == 0) return &l3d_profile_keys[k];
    return NULL;
}

const char *l3d_kern_name(enum l3d_kern k) {
    static const char *names[L3D_KERN_N] = {"layernorm", "gelu", "residual", "adamw"};
    return (unsigned)k < L3D_KERN_N ? names[k] : "?";
}

/* ---- reading -------------------------------------------------------------------------- */

/* kernel_bw_effs: name:fraction for each of the L3D_KERN_N kernels, each once, in any order */
static l3d_status parse_kern(double *out, const char *key, char *val, double hi, const char *what,
                             int line) {
    bool got[L3D_KERN_N] = {false};
    char *save = NULL;
    for (char *tok = strtok_r(val, " \t", &save); tok; tok = strtok_r(NULL, " \t", &save)) {
        char *colon = strchr(tok, ':'), *end = NULL;
        int k = 0;
        if (colon) {
            size_t len = (size_t)(colon - tok);
            while (k < L3D_KERN_N && (strlen(l3d_kern_name((enum l3d_kern)k)) != len ||
                                      strncmp(tok, l3d_kern_name((enum l3d_kern)k), len) != 0))
                k++;
        }
        if (!colon || k == L3D_KERN_N)
            return l3d_error(L3D_ERR_FORMAT, "%s line %d: %s entry '%s' is not kernel:fraction "
                             "with kernel layernorm, gelu, residual or adamw", what, line, key,
                             tok);
        errno = 0;
        double f = strtod(colon + 1, &end);
        if (errno || end == colon + 1 || *end || !isfinite(f) || !(f > 0) || f > hi)
            return l3d_error(L3D_ERR_FORMAT, "%s line %d: %s %s needs a fraction above 0 and "
                             "at most %g", what, line, key, tok, hi);
        if (got[k])
            return l3d_error(L3D_ERR_FORMAT, "%s line %d: %s gives %s twice", what, line, key,
                             l3d_kern_name((enum l3d_kern)k));
        got[k] = true;
        out[k] = f;
    }
    for (int k = 0; k < L3D_KERN_N; k++)
        if (!got[k])
            return l3d_error(L3D_ERR_FORMAT, "%s line %d: %s lacks %s (give layernorm, gelu, "
                             "residual and adamw)", what, line, key,
                             l3d_kern_name((enum l3d_kern)k));
    return L3D_OK;
}


/* A curve of unit:fraction points into n, fl, ef (gemm_eff or a 16-bit type's gemm_eff_T in
 * flops; gemm_eff_wgrad[_T] in tokens) */
static l3d_status parse_eff(int *n, double *fl, double *ef, const char *key, char *val,
                            double hi, const char *what, int line, const char *unit) {
    *n = 0;
    char *save = NULL;
    for (char *tok = strtok_r(val, " \t", &save); tok; tok = strtok_r(NULL, " \t", &save)) {
        char *colon = strchr(tok, ':'), *end1, *end2;
        if (!colon)
            return l3d_error(L3D_ERR_FORMAT, "%s line %d: %s point '%s' is not %s:fraction",
                             what, line, key, tok, unit);
        *colon = '\0';
        errno = 0;
        double f = strtod(tok, &end1), e = strtod(colon + 1, &end2);
        if (errno || *end1 || *end2 || !(f > 0) || !isfinite(f) || !(e > 0) || e > hi)
            return l3d_error(L3D_ERR_FORMAT, "%s line %d: %s point '%s:%s' needs %s > 0 and a "
                             "fraction in (0, %g]", what, line, key, tok, colon + 1, unit, hi);
        if (*n == L3D_PROFILE_MAX_EFF)
            return l3d_error(L3D_ERR_FORMAT, "%s line %d: more than %d %s points", what, line,
                             L3D_PROFILE_MAX_EFF, key);
        if (*n > 0 && f <= fl[*n - 1])
            return l3d_error(L3D_ERR_FORMAT, "%s line %d: %s points must have increasing %s "
                             "(%g after %g)", what, line, key, unit, f, fl[*n - 1]);
        fl[*n] = f;
        ef[(*n)++] = e;
    }
    if (*n == 0)
        return l3d_error(L3D_ERR_FORMAT, "%s line %d: %s has no points", what, line, key);
    return L3D_OK;
}


/* The largest side of a product a shape entry may name: beyond any layer (2^24), and small
 * enough that 2 M N K stays exact in a double */
#define SIDE_MAX 16777216.0

/* One fraction of a shape entry: in (0, hi]; false if not */
static bool shape_frac(const char *s, double hi, double *out, char **end) {
    errno = 0;
    *out = strtod(s, end);
    return !errno && *end != s && isfinite(*out) && *out > 0 && *out <= hi;
}

/* Entries `MxNxK:F` (gemm_eff_grid[_T]) or `MxNxK:F/W` (gemm_exact[_T], exact true) into their
 * struct: each side an integer from 1 to SIDE_MAX, each fraction in (0, hi], each shape once, at
 * most cap of them. The error names the key and the entry. */
static l3d_status parse_shapes(double *M, double *N, double *K, double *F, double *W, int *n,
                               int cap, bool exact, const char *key, char *val, double hi,
                               const char *what, int line) {
    *n = 0;
    const char *form = exact ? "MxNxK:F/W (sides from 1 to 16777216, fractions in (0, %g])"
                             : "MxNxK:F (sides from 1 to 16777216, a fraction in (0, %g])";
    char fmt[96];
    snprintf(fmt, sizeof fmt, form, hi);
    char *save = NULL;
    for (char *tok = strtok_r(val, " \t", &save); tok; tok = strtok_r(NULL, " \t", &save)) {
        double side[3], f = 0, w = 0;
        char *s = tok, *end = NULL;
        bool ok = true;
        for (int d = 0; d < 3 && ok; d++) {
            errno = 0;
            long v = strtol(s, &end, 10);
            ok = !errno && end != s && v >= 1 && v <= SIDE_MAX && *end == (d < 2 ? 'x' : ':');
            side[d] = (double)v;
            s = end + 1;
        }
        ok = ok && shape_frac(s, hi, &f, &end);
        if (ok && exact) ok = *end == '/' && shape_frac(end + 1, hi, &w, &end);
        ok = ok && *end == '\0';
        if (!ok)
            return l3d_error(L3D_ERR_FORMAT, "%s line %d: %s entry '%s' is not %s", what, line, key,
                             tok, fmt);
        for (int i = 0; i < *n; i++)
            if (M[i] == side[0] && N[i] == side[1] && K[i] == side[2])
                return l3d_error(L3D_ERR_FORMAT, "%s line %d: %s gives %.0fx%.0fx%.0f twice", what,
                                 line, key, side[0], side[1], side[2]);
        if (*n == cap)
            return l3d_error(L3D_ERR_FORMAT, "%s line %d: more than %d %s entries", what, line,
                             cap, key);
        M[*n] = side[0], N[*n] = side[1], K[*n] = side[2], F[*n] = f;
        if (W) W[*n] = w;
        (*n)++;
    }
    if (*n == 0)
        return l3d_error(L3D_ERR_FORMAT, "%s line %d: %s has no entries", what, line, key);
    return L3D_OK;
}

static l3d_status read_shapes(struct l3d_profile *p, const struct l3d_profile_key *k, char *val,
                              const char *what, int line) {
    if (k->kind == L3D_PK_GRID) {
        struct l3d_profile_grid *g = (struct l3d_profile_grid *)((char *)p + k->off);
        return parse_shapes(g->M, g->N, g->K, g->eff, NULL, &g->n, L3D_PROFILE_MAX_GRID, false,
                            k->name, val, k->hi, what, line);
    }
    struct l3d_profile_exact *x = (struct l3d_profile_exact *)((char *)p + k->off);
    return parse_shapes(x->M, x->N, x->K, x->eff, x->wgrad, &x->n, L3D_PROFILE_MAX_EXACT, true,
                        k->name, val, k->hi, what, line);
}

/* A curve key's points in p: their count, x (flops or tokens) and fractions */
struct curve {
    int *n;
    double *x, *y;
};
static struct curve curve_of(struct l3d_profile *p, const struct l3d_profile_key *k) {
    if (k->kind == L3D_PK_WGRAD) {
        struct l3d_profile_wgrad *w = (struct l3d_profile_wgrad *)((char *)p + k->off);
        return (struct curve){&w->n, w->tokens, w->eff};
    }
    if (k->off == 0) return (struct curve){&p->n_eff, p->eff_flops, p->eff};
    struct l3d_profile_16 *m16 = (struct l3d_profile_16 *)((char *)p + k->off);
    return (struct curve){&m16->n_eff, m16->eff_flops, m16->eff};
}

static l3d_status read_tile(struct l3d_profile *p, const struct l3d_profile_key *k, char *val,
                            const char *what, int line) {
    char *x = NULL, *end = NULL;
    errno = 0;
    long tm = strtol(val, &x, 10), tn = 0;
    if (x != val && (*x == 'x' || *x == 'X')) tn = strtol(x + 1, &end, 10);
    else end = x;
    if (errno || x == val || *end || tm < 1 || tn < 1 || tm > k->hi || tn > k->hi)
        return l3d_error(L3D_ERR_FORMAT, "%s line %d: %s = '%s': give the output tile as MxN, "
                         "each from 1 to %g (such as 256x128)", what, line, k->name, val, k->hi);
    p->tile_m = (int)tm;
    p->tile_n = (int)tn;
    return L3D_OK;
}

l3d_status l3d_profile_key_read(struct l3d_profile *p, const struct l3d_profile_key *k, char *val,
                                const char *what, int line) {
    char *base = (char *)p + k->off, *end;
    const char *key = k->name;
    errno = 0;
    switch (k->kind) {
    case L3D_PK_TEXT: snprintf(base, (size_t)k->hi, "%s", val); return L3D_OK;
    case L3D_PK_EFF:
    case L3D_PK_WGRAD: {
        struct curve c = curve_of(p, k);
        return parse_eff(c.n, c.x, c.y, key, val, k->hi, what, line,
                         k->kind == L3D_PK_EFF ? "flops" : "tokens");
    }
    case L3D_PK_TILE: return read_tile(p, k, val, what, line);
    case L3D_PK_KERN: return parse_kern((double *)base, key, val, k->hi, what, line);
    case L3D_PK_GRID:
    case L3D_PK_EXACT: return read_shapes(p, k, val, what, line);
    case L3D_PK_BOOL:
        if (strcmp(val, "1") == 0 || strcmp(val, "yes") == 0) *(bool *)base = true;
        else if (strcmp(val, "0") == 0 || strcmp(val, "no") == 0) *(bool *)base = false;
        else return l3d_error(L3D_ERR_FORMAT, "%s line %d: %s = '%s': give yes or no", what, line,
                              key, val);
        return L3D_OK;
    case L3D_PK_FRAC: { /* yes (1), no (0) or a fraction from 0 to hi */
        bool word = strcmp(val, "yes") == 0 || strcmp(val, "no") == 0;
        double v = word ? (val[0] == 'y') : strtod(val, &end);
        if (!word && (errno || end == val || *end || !(v >= 0.0 && v <= k->hi)))
            return l3d_error(L3D_ERR_FORMAT, "%s line %d: %s = '%s': give yes, no or a fraction "
                             "from 0 to %g", what, line, key, val, k->hi);
        *(double *)base = v * k->scale;
        return L3D_OK;
    }
    case L3D_PK_INT: {
        long v = strtol(val, &end, 10);
        if (errno || end == val || *end || v < 1 || v > k->hi)
            return l3d_error(L3D_ERR_FORMAT, "%s line %d: %s = '%s' is not a positive integer",
                             what, line, key, val);
        *(int *)base = (int)v;
        return L3D_OK;
    }
    case L3D_PK_NUM: {
        double v = strtod(val, &end);
        if (errno || end == val || *end || !isfinite(v) || v < 0 || (k->positive && v == 0))
            return l3d_error(L3D_ERR_FORMAT, "%s line %d: %s = '%s' is not a %s number", what,
                             line, key, val, k->positive ? "positive" : "non-negative");
        if (v > k->hi)
            return l3d_error(L3D_ERR_FORMAT, "%s line %d: %s = %s is out of range: allowed %s0 "
                             "to %g (profiles/README.md gives the unit)", what, line, key, val,
                             k->positive ? "above " : "", k->hi);
        *(double *)base = v * k->scale;
        return L3D_OK;
    }
    }
    return l3d_error(L3D_ERR_INTERNAL, "profile key %s has no reader", key);
}

/* ---- writing -------------------------------------------------------------------------- */

/* A growing line of text in a caller's buffer (cut at its size) */
struct line {
    char *s;
    size_t n, len;
    size_t base; /* a note's length with its key: what follows it is separated by "; " */
};
static void add(struct line *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add(struct line *t, const char *fmt, ...) {
    if (t->len + 1 >= t->n) return;
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(t->s + t->len, t->n - t->len, fmt, ap);
    va_end(ap);
    if (w > 0) t->len = t->len + (size_t)w < t->n ? t->len + (size_t)w : t->n - 1;
}

/* Whether the reader refuses v (file units) with range (0 or above 0, hi], and why into why */
static bool refused(double v, bool positive, double hi, char *why, size_t n) {
    if (isnan(v)) snprintf(why, n, "not a number");
    else if (v < 0) snprintf(why, n, "below 0");
    else if (positive && v == 0) snprintf(why, n, "not above 0");
    else if (v > hi) snprintf(why, n, "above %g", hi);
    else return false;
    return true;
}

/* v (file units) written with fmt as the reader accepts it: NaN or at or below the lower end
 * become the floor (L3D_PROFILE_FLOOR where the figure must be positive, else 0), above hi hi;
 * a positive figure that fmt rounds to 0 the floor too. Writes the value into val and, when it is
 * not v, "measured V (why), written as W" into note (after `what`). */
static void put_num(struct line *val, struct line *note, const char *what, const char *fmt,
                    double v, bool positive, double hi) {
    char why[64];
    bool out = refused(v, positive, hi, why, sizeof why);
    double w = !out ? v : v > hi ? hi : positive ? L3D_PROFILE_FLOOR : 0.0;
    char buf[64];
    snprintf(buf, sizeof buf, fmt, w);
    if (positive && !(strtod(buf, NULL) > 0)) {
        out = true;
        snprintf(why, sizeof why, "0 at the file's precision");
        w = L3D_PROFILE_FLOOR;
        snprintf(buf, sizeof buf, fmt, w);
    }
    add(val, "%s", buf);
    if (out)
        add(note, "%s%s%smeasured %g (%s), written as %s", note->len > note->base ? "; " : "",
            what, *what ? " " : "", v, why, buf);
}

/* A curve's points: x as the reader reads it (flops %.3g, tokens %.0f), each above the last one
 * written (a point that is not is left out: the reader needs increasing x), fractions by put_num */
static void put_curve(struct line *val, struct line *note, const struct l3d_profile *p,
                      const struct l3d_profile_key *k) {
    struct curve c = curve_of((struct l3d_profile *)p, k);
    const char *xfmt = k->kind == L3D_PK_EFF ? "%.3g" : "%.0f";
    double last = 0.0;
    char xs[64], what[80];
    for (int i = 0; i < *c.n && i < L3D_PROFILE_MAX_EFF; i++) {
        snprintf(xs, sizeof xs, xfmt, c.x[i]);
        double x = strtod(xs, NULL);
        if (!(x > last) || !isfinite(x)) {
            add(note, "%spoint %d (%s %g) left out: not above the point before",
                note->len > note->base ? "; " : "", i + 1,
                k->kind == L3D_PK_EFF ? "flops" : "tokens", c.x[i]);
            continue;
        }
        last = x;
        add(val, "%s%s:", val->len ? " " : "", xs);
        snprintf(what, sizeof what, "point %s", xs);
        put_num(val, note, what, k->fmt, c.y[i], true, k->hi);
    }
    if (last == 0.0) { /* the reader needs a point: the least efficiency, at the least size */
        add(val, "1:");
        add(val, k->fmt, L3D_PROFILE_FLOOR);
        add(note, "%sno point left, written as %s", note->len > note->base ? "; " : "", val->s);
    }
}

/* Shape entries (gemm_eff_grid, gemm_exact): the sides as integers, each fraction by put_num;
 * an entry whose shape is out of range or given before is left out (the reader refuses it) */
static void put_shapes(struct line *val, struct line *note, const struct l3d_profile *p,
                       const struct l3d_profile_key *k) {
    const char *base = (const char *)p + k->off;
    bool exact = k->kind == L3D_PK_EXACT;
    const struct l3d_profile_grid *g = (const struct l3d_profile_grid *)base;
    const struct l3d_profile_exact *x = (const struct l3d_profile_exact *)base;
    int n = exact ? x->n : g->n, cap = exact ? L3D_PROFILE_MAX_EXACT : L3D_PROFILE_MAX_GRID;
    char what[96];
    for (int i = 0; i < n && i < cap; i++) {
        double M = exact ? x->M[i] : g->M[i], N = exact ? x->N[i] : g->N[i];
        double K = exact ? x->K[i] : g->K[i];
        bool dup = false;
        for (int j = 0; j < i; j++)
            dup = dup || ((exact ? x->M[j] : g->M[j]) == M && (exact ? x->N[j] : g->N[j]) == N &&
                          (exact ? x->K[j] : g->K[j]) == K);
        if (dup || !(M >= 1 && N >= 1 && K >= 1 && M <= SIDE_MAX && N <= SIDE_MAX &&
                     K <= SIDE_MAX) || M != round(M) || N != round(N) || K != round(K)) {
            add(note, "%sentry %d (%gx%gx%g) left out: %s", note->len > note->base ? "; " : "",
                i + 1, M, N, K, dup ? "given before" : "not a shape");
            continue;
        }
        add(val, "%s%.0fx%.0fx%.0f:", val->len ? " " : "", M, N, K);
        snprintf(what, sizeof what, "%.0fx%.0fx%.0f", M, N, K);
        put_num(val, note, what, k->fmt, exact ? x->eff[i] : g->eff[i], true, k->hi);
        if (!exact) continue;
        add(val, "/");
        put_num(val, note, what, k->fmt, x->wgrad[i], true, k->hi);
    }
    if (val->len == 0) { /* the reader needs an entry: the least efficiency, the least shape */
        add(val, "1x1x1:%.3f", L3D_PROFILE_FLOOR);
        if (exact) add(val, "/%.3f", L3D_PROFILE_FLOOR);
        add(note, "%sno entry left, written as %s", note->len > note->base ? "; " : "", val->s);
    }
}

/* Text to the line's end: a '#' would start a comment, a line break end the line */
static void put_text(struct line *val, struct line *note, const char *text) {
    size_t start = val->len;
    add(val, "%s", text);
    bool changed = false;
    for (size_t i = start; i < val->len; i++)
        if (strchr("#\n\r", val->s[i])) val->s[i] = ' ', changed = true;
    if (changed) add(note, "'#' and line breaks written as spaces");
}

static void put_int(struct line *val, struct line *note, const char *what, int v, double hi) {
    int w = v < 1 ? 1 : v > hi ? (int)hi : v;
    add(val, "%d", w);
    if (w != v)
        add(note, "%s%s%smeasured %d (from 1 to %g), written as %d",
            note->len > note->base ? "; " : "", what, *what ? " " : "", v, hi, w);
}

bool l3d_profile_key_format(const struct l3d_profile *p, const struct l3d_profile_key *k,
                            const struct l3d_profile_measured *m, char *val, size_t n, char *note,
                            size_t nn) {
    struct line v = {val, n, 0, 0}, t = {note, nn, 0, 0};
    val[0] = '\0';
    add(&t, "%s: ", k->name);
    t.base = t.len;
    const char *base = (const char *)p + k->off;
    const bool positive = k->positive || (m && m->positive);
    const double hi = m && m->hi > 0 && m->hi < k->hi ? m->hi : k->hi;
    switch (k->kind) {
    case L3D_PK_TEXT: put_text(&v, &t, base); break;
    case L3D_PK_NUM:
    case L3D_PK_FRAC:
        put_num(&v, &t, "", k->fmt, *(const double *)base / k->scale, positive, hi);
        break;
    case L3D_PK_INT: put_int(&v, &t, "", *(const int *)base, k->hi); break;
    case L3D_PK_BOOL: add(&v, "%s", *(const bool *)base ? "yes" : "no"); break;
    case L3D_PK_TILE:
        put_int(&v, &t, "M", p->tile_m, k->hi);
        add(&v, "x");
        put_int(&v, &t, "N", p->tile_n, k->hi);
        break;
    case L3D_PK_KERN:
        for (int i = 0; i < L3D_KERN_N; i++) {
            add(&v, "%s%s:", i ? " " : "", l3d_kern_name((enum l3d_kern)i));
            put_num(&v, &t, l3d_kern_name((enum l3d_kern)i), k->fmt, ((const double *)base)[i],
                    true, k->hi);
        }
        break;
    case L3D_PK_EFF:
    case L3D_PK_WGRAD: put_curve(&v, &t, p, k); break;
    case L3D_PK_GRID:
    case L3D_PK_EXACT: put_shapes(&v, &t, p, k); break;
    }
    if (t.len > t.base) return true;
    note[0] = '\0';
    return false;
}
