/* A run's metrics.jsonl as columns for plotting (include/llm3d/plot.h): every line read with the
 * JSON reader, every key used checked for its type, the first fault reported with the file, the
 * line and the key. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "llm3d/json.h"
#include "llm3d/model.h"
#include "llm3d/plot.h"

static void grow(struct l3d_plot_metrics *m) {
    if (m->n < m->cap) return;
    m->cap = m->cap ? 2 * m->cap : 256;
    double **cols[] = {&m->step, &m->tokens, &m->loss, &m->lr, &m->norm, &m->scale, &m->val,
                       &m->aux, &m->zloss, &m->load_max};
    for (size_t i = 0; i < sizeof cols / sizeof cols[0]; i++) {
        *cols[i] = realloc(*cols[i], (size_t)m->cap * sizeof(double));
        L3D_ASSERT(*cols[i]);
    }
    if (m->layers > 0) {
        m->load = realloc(m->load, (size_t)(m->cap * m->layers) * sizeof(double));
        L3D_ASSERT(m->load);
    }
}

void l3d_plot_metrics_free(struct l3d_plot_metrics *m) {
    free(m->step), free(m->tokens), free(m->loss), free(m->lr), free(m->norm), free(m->scale);
    free(m->val), free(m->aux), free(m->zloss), free(m->load_max), free(m->load);
    memset(m, 0, sizeof *m);
}

/* One fault of line `lineno`, with the key and the value's column. */
static l3d_status bad(const char *path, int64_t lineno, const char *line, size_t len,
                      const struct l3d_json *v, const char *key, const char *why) {
    int l, col;
    l3d_json_where(line, len, v->offset, &l, &col);
    char found[48] = "";
    if (v->type == L3D_JSON_STRING)
        snprintf(found, sizeof found, " (\"%.30s%s\")", v->str, v->len > 30 ? "..." : "");
    return l3d_error(L3D_ERR_FORMAT, "%s: line %lld, column %d: \"%s\": %s, found %s%s", path,
                     (long long)lineno, col, key, why, l3d_json_type_name(v->type), found);
}

/* KEY of the line as a number into *out (NaN when absent, or null where null is allowed). */
static l3d_status num(const struct l3d_json *doc, const char *key, bool null_ok, double *out,
                      const char *path, int64_t lineno, const char *line, size_t len) {
    const struct l3d_json *v = l3d_json_get(doc, key);
    *out = NAN;
    if (!v || (null_ok && v->type == L3D_JSON_NULL)) return L3D_OK;
    if (!l3d_json_num(v, out))
        return bad(path, lineno, line, len, v, key,
                   null_ok ? "expected a number or null" : "expected a number");
    return L3D_OK;
}

/* Line i's "moe_load" (every layer's load), an array of numbers; the first one sets the layers
 * (the lines before it: NaN), a line without one is NaN, one of another length is refused. */
static l3d_status loads(struct l3d_plot_metrics *m, const struct l3d_json *doc, int64_t i,
                        const char *path, int64_t lineno, const char *line, size_t len) {
    const struct l3d_json *v = l3d_json_get(doc, "moe_load");
    if (v && v->type != L3D_JSON_ARRAY)
        return bad(path, lineno, line, len, v, "moe_load", "expected an array of numbers");
    if (v && v->count > L3D_MAX_LAYERS) /* a model's layers at most: each line's held in memory */
        return l3d_error(L3D_ERR_FORMAT, "%s: line %lld: \"moe_load\" holds %lld layers, more "
                         "than a model has (%d; not a run's metrics?)", path, (long long)lineno,
                         (long long)v->count, L3D_MAX_LAYERS);
    if (v && m->layers == 0 && v->count > 0) { /* the first: the rows so far have none */
        m->layers = (int)v->count;
        m->load = malloc((size_t)(m->cap * m->layers) * sizeof(double));
        L3D_ASSERT(m->load);
        for (int64_t k = 0; k < i * m->layers; k++) m->load[k] = NAN;
    }
    if (v && (int64_t)v->count != m->layers)
        return l3d_error(L3D_ERR_FORMAT, "%s: line %lld: \"moe_load\" holds %lld layers, the "
                         "lines before %d (not one run's metrics?)", path, (long long)lineno,
                         (long long)v->count, m->layers);
    for (int j = 0; j < m->layers; j++) {
        double *x = &m->load[i * m->layers + j];
        *x = NAN;
        if (v && !l3d_json_num(&v->items[j], x))
            return bad(path, lineno, line, len, &v->items[j], "moe_load", "expected a number");
    }
    return L3D_OK;
}

/* The columns of one step line; the run's record (its first line, "run") is skipped. */
static l3d_status read_line(struct l3d_plot_metrics *m, const char *path, int64_t lineno,
                            const char *line, size_t len) {
    struct l3d_json doc;
    l3d_status st = l3d_json_parse(&doc, line, len, path);
    if (st != L3D_OK) { /* the reader counts lines of the one line it was given: say which */
        int col = 0;
        const char *msg = l3d_error_message(), *p = strstr(msg, ": line 1, column ");
        if (p) sscanf(p, ": line 1, column %d", &col);
        const char *rest = p ? strchr(p + 17, ':') : NULL;
        char copy[512];
        snprintf(copy, sizeof copy, "%s", rest ? rest + 2 : msg);
        l3d_json_free(&doc);
        return l3d_error(L3D_ERR_FORMAT, "%s: line %lld, column %d: not a JSON object: %s (a "
                         "line cut short, or not llm3d's metrics?)", path, (long long)lineno, col,
                         copy);
    }
    if (doc.type != L3D_JSON_OBJECT) {
        st = l3d_error(L3D_ERR_FORMAT, "%s: line %lld: expected an object, found %s", path,
                       (long long)lineno, l3d_json_type_name(doc.type));
    } else if (!l3d_json_get(&doc, "run")) {
        const struct l3d_json *sv = l3d_json_get(&doc, "step"), *sk = l3d_json_get(&doc, "skipped");
        int64_t step = 0;
        grow(m);
        size_t i = (size_t)m->n;
        if (!sv)
            st = l3d_error(L3D_ERR_FORMAT, "%s: line %lld: no \"step\" (not llm3d's metrics?)",
                           path, (long long)lineno);
        else if (!l3d_json_int(sv, &step) || step < 0)
            st = bad(path, lineno, line, len, sv, "step", "expected a step number");
        else if (m->n > 0 && (double)step <= m->step[m->n - 1])
            st = l3d_error(L3D_ERR_FORMAT, "%s: line %lld: step %lld after step %.0f (steps must "
                           "increase)", path, (long long)lineno, (long long)step,
                           m->step[m->n - 1]);
        else if (sk && sk->type != L3D_JSON_BOOL)
            st = bad(path, lineno, line, len, sk, "skipped", "expected true or false");
        m->step[i] = (double)step;
        if (st == L3D_OK) st = num(&doc, "loss", true, &m->loss[i], path, lineno, line, len);
        if (st == L3D_OK && !l3d_json_get(&doc, "loss"))
            st = l3d_error(L3D_ERR_FORMAT, "%s: line %lld: no \"loss\"", path, (long long)lineno);
        if (st == L3D_OK) st = num(&doc, "lr", false, &m->lr[i], path, lineno, line, len);
        if (st == L3D_OK) st = num(&doc, "grad_norm", true, &m->norm[i], path, lineno, line, len);
        if (st == L3D_OK) st = num(&doc, "tokens", false, &m->tokens[i], path, lineno, line, len);
        if (st == L3D_OK) st = num(&doc, "val_loss", true, &m->val[i], path, lineno, line, len);
        if (st == L3D_OK)
            st = num(&doc, "loss_scale", false, &m->scale[i], path, lineno, line, len);
        if (st == L3D_OK) st = num(&doc, "moe_aux_loss", false, &m->aux[i], path, lineno, line, len);
        if (st == L3D_OK) st = num(&doc, "moe_z_loss", false, &m->zloss[i], path, lineno, line, len);
        if (st == L3D_OK)
            st = num(&doc, "moe_load_max", false, &m->load_max[i], path, lineno, line, len);
        if (st == L3D_OK) st = loads(m, &doc, (int64_t)i, path, lineno, line, len);
        if (st == L3D_OK) {
            /* a skipped step: said so, or its loss null (not finite) */
            if ((sk && sk->boolean) || !isfinite(m->loss[i])) m->loss[i] = NAN, m->skipped++;
            m->n++;
        }
    }
    l3d_json_free(&doc);
    return st;
}

l3d_status l3d_plot_metrics_read(struct l3d_plot_metrics *m, const char *run) {
    memset(m, 0, sizeof *m);
    struct stat sb;
    bool dir = stat(run, &sb) == 0 && S_ISDIR(sb.st_mode);
    snprintf(m->path, sizeof m->path, "%s%s", run, dir ? "/metrics.jsonl" : "");
    FILE *f;
    l3d_status st = l3d_fopen_regular(m->path, "metrics file", &f, NULL);
    if (st != L3D_OK)
        return l3d_error(st, "%s (give a run's --out folder, or its metrics.jsonl)",
                         l3d_error_message());
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int64_t lineno = 0;
    while (st == L3D_OK && (len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        if (len > 0 && line[len - 1] == '\n') len--;
        st = read_line(m, m->path, lineno, line, (size_t)len);
    }
    free(line);
    fclose(f);
    if (st == L3D_OK && m->n == 0)
        st = l3d_error(L3D_ERR_FORMAT, "%s holds no step (did the run take one?)", m->path);
    if (st != L3D_OK) l3d_plot_metrics_free(m);
    return st;
}
