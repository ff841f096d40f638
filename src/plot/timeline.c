/* A --trace file drawn as the pipeline figures of GPipe (Huang et al. 2019, fig. 2) and
 * Megatron-LM (Narayanan et al. 2021, figs. 3-4) are: one row a rank, time to the right, forward
 * and backward passes as boxes numbered by micro-batch, the bubble left blank
 * (include/llm3d/plot.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "llm3d/json.h"
#include "llm3d/plot.h"

/* the trace's categories (src/train/trace.c), in the legend's order */
enum kind { K_FWD, K_BWD, K_WGT, K_RECV_ACT, K_RECV_GRAD, K_EMBED, K_DP, K_OPT, K_OTHER, K_STEP,
            NK };
static const char *const cats[NK] = {"forward", "backward", "weight gradient", "recv activation",
                                     "recv gradient", "tied embedding sum", "data-parallel wait",
                                     "optimizer", "other", "step"};
static const char *const fills[NK] = {"#0072B2", "#E69F00", "#D55E00", "#CC79A7", "#CC79A7",
                                      "#F0E442", "#009E73", "#000000", "#56B4E9", "none"};

struct ev {
    int pid, kind, micro, chunk;
    double t0, t1; /* microseconds */
};

struct trace {
    const char *path, *text;
    size_t len;
    struct ev *ev;
    int64_t n;
    int *pids;        /* sorted, unique: row r is pids[r] */
    char **labels;    /* each row's process name, or NULL */
    int rows;
};

static l3d_status field_err(const struct trace *t, const struct l3d_json *v, int64_t i,
                            const char *key, const char *want) {
    int line, col;
    l3d_json_where(t->text, t->len, v->offset, &line, &col);
    return l3d_error(L3D_ERR_FORMAT, "%s: line %d, column %d: event %lld: \"%s\": expected %s%s%s",
                     t->path, line, col, (long long)i, key, want,
                     v->type == L3D_JSON_OBJECT ? "" : ", found ",
                     v->type == L3D_JSON_OBJECT ? "" : l3d_json_type_name(v->type));
}

/* a member that must be a number (an integer when `integer`) */
static l3d_status need_num(const struct trace *t, const struct l3d_json *e, int64_t i,
                           const char *key, bool integer, double *out) {
    const struct l3d_json *v = l3d_json_get(e, key);
    int64_t k;
    if (!v) return field_err(t, e, i, key, "a member of that name");
    if (integer ? !l3d_json_int(v, &k) || k < 0 || k > (1 << 24) : !l3d_json_num(v, out))
        return field_err(t, v, i, key, integer ? "a small whole number" : "a number");
    if (integer) *out = (double)k;
    return L3D_OK;
}

static int kind_of(const struct l3d_json *e) {
    const char *c = l3d_json_str(l3d_json_get(e, "cat"));
    for (int k = 0; c && k < NK; k++)
        if (strcmp(c, cats[k]) == 0) return k;
    return K_OTHER;
}

/* One "X" (complete) event, or a "process_name" record naming a row. */
static l3d_status read_event(struct trace *t, const struct l3d_json *e, int64_t i) {
    if (e->type != L3D_JSON_OBJECT) return field_err(t, e, i, "event", "an object");
    const char *ph = l3d_json_str(l3d_json_get(e, "ph"));
    if (!ph) return field_err(t, e, i, "ph", "a string");
    double pid, ts, dur;
    l3d_status st = L3D_OK;
    if (strcmp(ph, "M") == 0) {
        const char *name = l3d_json_str(l3d_json_get(e, "name"));
        const char *label = l3d_json_str(l3d_json_get(l3d_json_get(e, "args"), "name"));
        if (!name || strcmp(name, "process_name") != 0 || !label) return L3D_OK;
        if ((st = need_num(t, e, i, "pid", true, &pid)) != L3D_OK) return st;
        t->ev[t->n++] = (struct ev){.pid = (int)pid, .kind = -1, .micro = (int)i};
        return L3D_OK;
    }
    if (strcmp(ph, "X") != 0) return L3D_OK; /* counters, instants: not drawn */
    if ((st = need_num(t, e, i, "pid", true, &pid)) != L3D_OK ||
        (st = need_num(t, e, i, "ts", false, &ts)) != L3D_OK ||
        (st = need_num(t, e, i, "dur", false, &dur)) != L3D_OK)
        return st;
    if (!(dur >= 0) || !isfinite(ts) || !isfinite(dur))
        return field_err(t, l3d_json_get(e, "dur"), i, "dur", "a finite duration, not negative");
    const struct l3d_json *args = l3d_json_get(e, "args");
    int64_t micro = -1, chunk = 0;
    if (args && l3d_json_get(args, "micro") && !l3d_json_int(l3d_json_get(args, "micro"), &micro))
        return field_err(t, l3d_json_get(args, "micro"), i, "micro", "a whole number");
    if (args && l3d_json_get(args, "chunk") && !l3d_json_int(l3d_json_get(args, "chunk"), &chunk))
        return field_err(t, l3d_json_get(args, "chunk"), i, "chunk", "a whole number");
    t->ev[t->n++] = (struct ev){.pid = (int)pid, .kind = kind_of(e), .micro = (int)micro,
                                .chunk = (int)chunk, .t0 = ts, .t1 = ts + dur};
    return L3D_OK;
}

static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

static int row_of(const struct trace *t, int pid) {
    const int *p = bsearch(&pid, t->pids, (size_t)t->rows, sizeof(int), cmp_int);
    return (int)(p - t->pids);
}

/* The rows: every pid once, sorted; each row's label from its process_name record. */
static void make_rows(struct trace *t, const struct l3d_json *events) {
    t->pids = malloc((size_t)(t->n + 1) * sizeof(int));
    L3D_ASSERT(t->pids);
    for (int64_t i = 0; i < t->n; i++) t->pids[i] = t->ev[i].pid;
    qsort(t->pids, (size_t)t->n, sizeof(int), cmp_int);
    for (int64_t i = 0; i < t->n; i++)
        if (t->rows == 0 || t->pids[t->rows - 1] != t->pids[i]) t->pids[t->rows++] = t->pids[i];
    t->labels = calloc((size_t)t->rows + 1, sizeof(char *));
    L3D_ASSERT(t->labels);
    for (int64_t i = 0; i < t->n; i++) {
        if (t->ev[i].kind != -1) continue;
        const struct l3d_json *e = &events->items[t->ev[i].micro];
        t->labels[row_of(t, t->ev[i].pid)] =
            (char *)l3d_json_str(l3d_json_get(l3d_json_get(e, "args"), "name"));
    }
}

static l3d_status read_trace(struct trace *t, struct l3d_json *doc) {
    const struct l3d_json *events = doc->type == L3D_JSON_ARRAY ? doc
                                                                : l3d_json_get(doc, "traceEvents");
    if (!events || events->type != L3D_JSON_ARRAY)
        return l3d_error(L3D_ERR_FORMAT, "%s: no \"traceEvents\" array (not a Chrome trace-event "
                         "file: give the file of llm3d train --trace)", t->path);
    t->ev = malloc((events->count + 1) * sizeof *t->ev);
    L3D_ASSERT(t->ev);
    for (size_t i = 0; i < events->count; i++) {
        l3d_status st = read_event(t, &events->items[i], (int64_t)i);
        if (st != L3D_OK) return st;
    }
    if (t->n == 0)
        return l3d_error(L3D_ERR_FORMAT, "%s: no complete (\"ph\":\"X\") events to draw", t->path);
    make_rows(t, events);
    return L3D_OK;
}

/* ---- the step drawn and its bubble ---------------------------------------------------------- */

/* The window [*w0, *w1] of step `step` (0: the last one traced) over every rank; the whole trace
 * when it holds no step events. */
static l3d_status pick_step(const struct trace *t, int step, int *got, double *w0, double *w1) {
    int last = 0, first = 0;
    for (int64_t i = 0; i < t->n; i++)
        if (t->ev[i].kind == K_STEP) {
            last = t->ev[i].micro > last ? t->ev[i].micro : last;
            first = first == 0 || t->ev[i].micro < first ? t->ev[i].micro : first;
        }
    *w0 = INFINITY, *w1 = -INFINITY;
    if (last == 0) { /* no steps: everything */
        for (int64_t i = 0; i < t->n; i++)
            if (t->ev[i].kind >= 0) *w0 = fmin(*w0, t->ev[i].t0), *w1 = fmax(*w1, t->ev[i].t1);
        *got = 0;
        return L3D_OK;
    }
    int want = step > 0 ? step : last;
    for (int64_t i = 0; i < t->n; i++)
        if (t->ev[i].kind == K_STEP && t->ev[i].micro == want)
            *w0 = fmin(*w0, t->ev[i].t0), *w1 = fmax(*w1, t->ev[i].t1);
    if (!(*w1 >= *w0))
        return l3d_error(L3D_ERR_ARG, "--step %d: %s traces steps %d to %d", step, t->path, first,
                         last);
    *got = want;
    return L3D_OK;
}

static bool in_window(const struct ev *e, double w0, double w1) {
    double eps = 1e-3 * (w1 - w0) + 1e-3;
    return e->kind >= 0 && e->kind != K_STEP && e->t0 >= w0 - eps && e->t1 <= w1 + eps;
}

/* Each row's pipeline phase (first to last forward, backward or receive) and the bubble: the
 * phase's time without a forward or backward, over all rows. */
static double bubble(const struct trace *t, double w0, double w1, double *ph0, double *ph1) {
    double *busy = calloc((size_t)t->rows, sizeof *busy);
    L3D_ASSERT(busy);
    for (int r = 0; r < t->rows; r++) ph0[r] = INFINITY, ph1[r] = -INFINITY;
    for (int64_t i = 0; i < t->n; i++) {
        const struct ev *e = &t->ev[i];
        if (!in_window(e, w0, w1) || e->kind > K_RECV_GRAD) continue;
        int r = row_of(t, e->pid);
        ph0[r] = fmin(ph0[r], e->t0);
        ph1[r] = fmax(ph1[r], e->t1);
        if (e->kind <= K_WGT) busy[r] += e->t1 - e->t0; /* W (zb-h1) is work too */
    }
    double span = 0, idle = 0;
    for (int r = 0; r < t->rows; r++)
        if (ph1[r] > ph0[r]) span += ph1[r] - ph0[r], idle += ph1[r] - ph0[r] - busy[r];
    free(busy);
    return span > 0 ? idle / span : 0.0;
}

/* ---- drawing -------------------------------------------------------------------------------- */

struct geom {
    double left, right, top, rh; /* the plot's box: x from left to right, rows from top */
    double w0, w1;               /* the window in trace microseconds */
};

static double gx(const struct geom *g, double t) {
    return g->left + (t - g->w0) / (g->w1 - g->w0) * (g->right - g->left);
}

/* A box of one kind on a row; `label` its micro-batch number (drawn when it fits), -1 none. */
static void box(struct l3d_svg *s, const struct geom *g, int row, int kind, double x0, double x1,
                int label, bool light) {
    bool half = kind == K_RECV_ACT || kind == K_RECV_GRAD; /* waits: thinner, as in the papers */
    double y = g->top + row * g->rh, h = g->rh > 2 ? g->rh - 1 : g->rh;
    if (half) y += h * 0.3, h *= 0.4;
    double w = x1 - x0 < 0.6 ? 0.6 : x1 - x0; /* a short event stays visible */
    l3d_svg_printf(s, "<rect class=\"ev\" data-kind=\"%s\" x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" "
                   "height=\"%.2f\" fill=\"%s\"%s/>", cats[kind], x0, y, w, h, fills[kind],
                   light ? " fill-opacity=\"0.6\"" : "");
    char num[16];
    int digits = snprintf(num, sizeof num, "%d", label);
    if (label >= 0 && !half && g->rh >= 12 && w >= 7.0 * digits + 4)
        l3d_svg_printf(s, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"%.0f\" text-anchor=\"middle\" "
                       "fill=\"%s\">%s</text>", x0 + w / 2, y + h / 2 + 4,
                       g->rh >= 20 ? 12.0 : 10.0, kind == K_FWD || kind == K_OPT ? "#ffffff"
                       : "#000000", num);
    l3d_svg_printf(s, "\n");
}

static int cmp_ev(const void *a, const void *b) {
    const struct ev *x = a, *y = b;
    if (x->pid != y->pid) return (x->pid > y->pid) - (x->pid < y->pid);
    return (x->t0 > y->t0) - (x->t0 < y->t0);
}

/* Each row: the phase shaded as idle, then the events in time order, those of a kind that
 * follow within a pixel merged into one box (1,000 ranks of thousands of events stay a few
 * boxes a pixel; none is dropped: a merged box spans them all). */
static void draw_rows(struct l3d_svg *s, struct trace *t, const struct geom *g, const double *ph0,
                      const double *ph1) {
    qsort(t->ev, (size_t)t->n, sizeof *t->ev, cmp_ev);
    int every = g->rh >= 11 ? 1 : (int)ceil(11 / g->rh);
    int64_t i = 0;
    for (int r = 0; r < t->rows; r++) {
        char def[32];
        snprintf(def, sizeof def, "rank %d", t->pids[r]);
        l3d_svg_printf(s, "<g class=\"row\" data-rank=\"%d\">\n", t->pids[r]);
        if (r % every == 0)
            l3d_svg_text(s, g->left - 8, g->top + (r + 0.5) * g->rh + 4, g->rh >= 11 ? 12 : 10,
                         "end", NULL, t->labels[r] ? t->labels[r] : def);
        if (ph1[r] > ph0[r])
            l3d_svg_printf(s, "<rect class=\"idle\" x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" "
                           "height=\"%.2f\" fill=\"#e4e4e4\"/>\n", gx(g, ph0[r]),
                           g->top + r * g->rh, gx(g, ph1[r]) - gx(g, ph0[r]),
                           g->rh > 2 ? g->rh - 1 : g->rh);
        int kind = -1, label = -1, light = 0;
        double x0 = 0, x1 = 0;
        for (; i < t->n && row_of(t, t->ev[i].pid) == r; i++) {
            const struct ev *e = &t->ev[i];
            if (!in_window(e, g->w0, g->w1)) continue;
            double a = gx(g, e->t0), b = gx(g, e->t1);
            /* boxes too narrow to read that follow within a pixel: one box */
            if (e->kind == kind && a - x1 < 1.0 && (x1 - x0 < 2.0 || b - a < 2.0)) {
                x1 = fmax(x1, b);
                label = -1;
                continue;
            }
            if (kind >= 0) box(s, g, r, kind, x0, x1, label, light);
            kind = e->kind, x0 = a, x1 = b, light = e->chunk > 0;
            label = e->kind <= K_WGT && e->micro >= 0 ? e->micro + 1 : -1;
        }
        if (kind >= 0) box(s, g, r, kind, x0, x1, label, light);
        l3d_svg_printf(s, "</g>\n");
    }
}

/* The time axis (ms from the step's start) under the rows, and the legend under it. */
static void draw_axis(struct l3d_svg *s, const struct geom *g, double bottom) {
    double lo = 0, hi = (g->w1 - g->w0) / 1e3, tk[64];
    int nt = l3d_plot_ticks(&lo, &hi, false, (int)((g->right - g->left) / 90) + 2, tk, 64);
    double span = (g->w1 - g->w0) / 1e3;
    l3d_svg_printf(s, "<g class=\"axis\" data-axis=\"x\" data-lo=\"0\" data-hi=\"%.9g\" "
                   "data-min=\"0\" data-max=\"%.9g\" data-log=\"0\">\n", span, span);
    for (int i = 0; i < nt; i++) {
        if (tk[i] > span * (1 + 1e-9)) continue;
        double x = g->left + tk[i] / span * (g->right - g->left);
        char lab[32];
        l3d_plot_tick_label(tk[i], nt > 1 ? tk[1] - tk[0] : 0, lab, sizeof lab);
        l3d_svg_printf(s, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" "
                       "stroke=\"#bbbbbb\" stroke-dasharray=\"2 3\"/>\n", x, x, g->top, bottom);
        l3d_svg_text(s, x, bottom + 16, 12, "middle", NULL, lab);
    }
    l3d_svg_text(s, (g->left + g->right) / 2, bottom + 36, 13, "middle", NULL,
                 "time from the step's start (ms)");
    l3d_svg_printf(s, "</g>\n");
    double x = g->left, y = bottom + 58;
    static const int shown[] = {K_FWD, K_BWD, K_WGT, K_RECV_ACT, K_EMBED, K_DP, K_OPT};
    static const char *const words[] = {"forward", "backward (B)", "weight gradient (W)",
                                        "receive (waiting)", "tied embedding sum",
                                        "data-parallel wait", "optimizer"};
    l3d_svg_printf(s, "<rect x=\"%.1f\" y=\"%.1f\" width=\"14\" height=\"14\" fill=\"#e4e4e4\" "
                   "stroke=\"#999999\"/>", x, y - 11);
    l3d_svg_text(s, x + 19, y, 12, "start", NULL, "idle (bubble)");
    x += 120;
    for (int k = 0; k < 7; k++) {
        l3d_svg_printf(s, "<rect x=\"%.1f\" y=\"%.1f\" width=\"14\" height=\"14\" fill=\"%s\"/>", x,
                       y - 11, fills[shown[k]]);
        l3d_svg_text(s, x + 19, y, 12, "start", NULL, words[k]);
        x += 36 + 7.0 * (double)strlen(words[k]);
    }
}

static l3d_status draw(struct trace *t, const char *out, int step, double w0, double w1,
                       double *bub) {
    double *ph = malloc(2 * (size_t)t->rows * sizeof *ph);
    L3D_ASSERT(ph);
    *bub = bubble(t, w0, w1, ph, ph + t->rows);
    struct geom g = {.left = 190, .right = 1170, .top = 56, .w0 = w0, .w1 = w1};
    g.rh = fmin(30, fmax(1, 600.0 / t->rows));
    double bottom = g.top + t->rows * g.rh, H = bottom + 80;
    char title[256];
    snprintf(title, sizeof title, "Pipeline timeline%s%.0d: bubble %.1f%% (idle share of the "
             "pipeline phase, %d rank%s)", step ? ", step " : "", step, 100 * *bub, t->rows,
             t->rows == 1 ? "" : "s");
    struct l3d_svg s;
    l3d_status st = l3d_svg_begin(&s, out, 1200, H, title);
    if (st == L3D_OK) {
        l3d_svg_printf(&s, "<g class=\"timeline\" data-bubble=\"%.6f\" data-step=\"%d\" "
                       "data-ranks=\"%d\">\n", *bub, step, t->rows);
        l3d_svg_text(&s, g.left, 26, 15, "start", "bold", title);
        l3d_svg_text(&s, g.left, 44, 12, "start", NULL,
                     "one row a rank; numbers: micro-batches (1 the first); paler: later model "
                     "chunks (interleaved)");
        draw_axis(&s, &g, bottom);
        draw_rows(&s, t, &g, ph, ph + t->rows);
        l3d_svg_printf(&s, "</g>\n");
        st = l3d_svg_end(&s);
    }
    free(ph);
    return st;
}

l3d_status l3d_plot_timeline(const char *trace, const char *out, int step, double *bub,
                             int *step_out) {
    FILE *f;
    int64_t size;
    l3d_status st = l3d_fopen_regular(trace, "trace file", &f, &size);
    if (st != L3D_OK) return st;
    char *text = malloc((size_t)size + 1);
    L3D_ASSERT(text);
    if (fread(text, 1, (size_t)size, f) != (size_t)size)
        st = l3d_error(L3D_ERR_IO, "cannot read %s", trace);
    fclose(f);
    struct l3d_json doc = {0};
    struct trace t = {.path = trace, .text = text, .len = (size_t)size};
    if (st == L3D_OK) st = l3d_json_parse(&doc, text, (size_t)size, trace);
    if (st == L3D_OK) st = read_trace(&t, &doc);
    double w0 = 0, w1 = 0;
    if (st == L3D_OK) st = pick_step(&t, step, step_out, &w0, &w1);
    if (st == L3D_OK && !(w1 > w0))
        st = l3d_error(L3D_ERR_FORMAT, "%s: the events span no time", trace);
    if (st == L3D_OK) st = draw(&t, out, *step_out, w0, w1, bub);
    free(t.ev), free(t.pids), free(t.labels), free(text);
    l3d_json_free(&doc);
    return st;
}
