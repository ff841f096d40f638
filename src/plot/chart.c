/* Charts: ranges, axes, references, series thinned to the pixels, the legend
 * (include/llm3d/plot.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "llm3d/plot.h"

struct l3d_plot_chart l3d_plot_chart_init(const char *title, const char *xlabel,
                                          const char *ylabel) {
    struct l3d_plot_chart c;
    memset(&c, 0, sizeof c);
    c.title = title;
    c.x = (struct l3d_plot_axis){.label = xlabel, .lo = NAN, .hi = NAN};
    c.y = (struct l3d_plot_axis){.label = ylabel, .lo = NAN, .hi = NAN};
    return c;
}

void l3d_plot_add(struct l3d_plot_chart *c, struct l3d_plot_series s) {
    L3D_ASSERT(c->ns < L3D_PLOT_MAX_SERIES);
    c->s[c->ns++] = s;
    if (s.name) c->legend = true;
}

void l3d_plot_add_ref(struct l3d_plot_chart *c, enum l3d_plot_ref_kind kind, double v,
                      const char *label) {
    L3D_ASSERT(c->nref < L3D_PLOT_MAX_REFS);
    c->ref[c->nref++] = (struct l3d_plot_ref){.kind = kind, .v = v, .label = label};
}

/* ---- geometry ------------------------------------------------------------------------------- */

/* One axis as drawn: its range (lo, hi in data units), where it lies in pixels (a at lo, b at
 * hi), the data's extent on it, and its ticks. */
struct scale {
    bool log;
    double lo, hi, a, b;
    double min, max; /* finite data drawn on the axis; min > max when none */
    double t[64];
    int nt;
};

static bool usable(const struct scale *s, double v) {
    return isfinite(v) && (!s->log || v > 0);
}

static double px(const struct scale *s, double v) {
    /* halves: the same quotient, without the overflow of a span past 1.7e308 (-1e308 to 1e308) */
    double f = s->log ? (log10(v) - log10(s->lo)) / (log10(s->hi) - log10(s->lo))
                      : (v / 2 - s->lo / 2) / (s->hi / 2 - s->lo / 2);
    return s->a + f * (s->b - s->a);
}

static void extent_add(struct scale *s, double v) {
    if (!usable(s, v)) return;
    if (v < s->min) s->min = v;
    if (v > s->max) s->max = v;
}

/* The data's extent on each axis: lines and points on both, rugs on x, references on theirs. */
static void extents(const struct l3d_plot_chart *c, struct scale *x, struct scale *y) {
    x->min = y->min = INFINITY;
    x->max = y->max = -INFINITY;
    for (int i = 0; i < c->ns; i++) {
        const struct l3d_plot_series *s = &c->s[i];
        bool rug = s->style == L3D_PLOT_RUG_BOTTOM || s->style == L3D_PLOT_RUG_TOP;
        for (int64_t k = 0; k < s->n; k++) {
            if (rug) {
                extent_add(x, s->x[k]);
            } else if (usable(x, s->x[k]) && usable(y, s->y[k])) {
                extent_add(x, s->x[k]);
                extent_add(y, s->y[k]);
            }
        }
    }
}

/* The axis's range: given, else the data's (with the references), widened to whole ticks. */
static void axis_range(const struct l3d_plot_axis *ax, struct scale *s, double ref_lo,
                       double ref_hi, int target) {
    double lo = isnan(ax->lo) ? fmin(s->min, ref_lo) : ax->lo;
    double hi = isnan(ax->hi) ? fmax(s->max, ref_hi) : ax->hi;
    if (!isfinite(lo) || !isfinite(hi)) lo = s->log ? 1 : 0, hi = s->log ? 10 : 1; /* no data */
    if (s->log && !(lo > 0)) s->log = false; /* nothing positive to scale by */
    double want_lo = lo, want_hi = hi;
    s->nt = l3d_plot_ticks(&lo, &hi, s->log, target, s->t, 64);
    /* a range given is kept as given; the ticks outside it are left out */
    if (!isnan(ax->lo)) lo = want_lo;
    if (!isnan(ax->hi)) hi = want_hi;
    s->lo = lo;
    s->hi = hi;
}

/* ---- markers -------------------------------------------------------------------------------- */

static void marker(struct l3d_svg *g, int m, double x, double y, double r, const char *rgb) {
    switch (m % L3D_MARK_NMARKERS) {
    case L3D_MARK_CIRCLE:
        l3d_svg_printf(g, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"%.1f\" fill=\"%s\"/>", x, y, r, rgb);
        break;
    case L3D_MARK_SQUARE:
        l3d_svg_printf(g, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"/>",
                       x - r * 0.85, y - r * 0.85, r * 1.7, r * 1.7, rgb);
        break;
    case L3D_MARK_TRIANGLE:
        l3d_svg_printf(g, "<path d=\"M%.1f %.1fL%.1f %.1fL%.1f %.1fZ\" fill=\"%s\"/>", x, y - r,
                       x + r, y + r * 0.8, x - r, y + r * 0.8, rgb);
        break;
    case L3D_MARK_DIAMOND:
        l3d_svg_printf(g, "<path d=\"M%.1f %.1fL%.1f %.1fL%.1f %.1fL%.1f %.1fZ\" fill=\"%s\"/>", x,
                       y - r * 1.2, x + r, y, x, y + r * 1.2, x - r, y, rgb);
        break;
    case L3D_MARK_CROSS:
        l3d_svg_printf(g, "<path d=\"M%.1f %.1fL%.1f %.1fM%.1f %.1fL%.1f %.1f\" stroke=\"%s\" "
                       "stroke-width=\"1.8\"/>", x - r, y - r, x + r, y + r, x - r, y + r, x + r,
                       y - r, rgb);
        break;
    }
}

/* ---- lines, thinned ------------------------------------------------------------------------- */

/* A run of a line being written: its points in pixels, and the pixel column being gathered
 * (its first, lowest, highest and last point, in the order they came). */
struct run {
    double *p;
    int64_t n, cap;
    int64_t col;
    double first[2], lo[2], hi[2], last[2];
    int64_t i_lo, i_hi;
    bool open;
};

static void run_put(struct run *r, const double *q) {
    if (r->n > 0 && r->p[2 * r->n - 2] == q[0] && r->p[2 * r->n - 1] == q[1]) return;
    if (r->n == r->cap) {
        r->cap = r->cap ? 2 * r->cap : 256;
        r->p = realloc(r->p, (size_t)r->cap * 2 * sizeof *r->p);
        L3D_ASSERT(r->p);
    }
    r->p[2 * r->n] = q[0];
    r->p[2 * r->n + 1] = q[1];
    r->n++;
}

/* the column gathered so far into the run: first, then the extremes in order, then last */
static void run_flush_col(struct run *r) {
    if (!r->open) return;
    run_put(r, r->first);
    run_put(r, r->i_lo <= r->i_hi ? r->lo : r->hi);
    run_put(r, r->i_lo <= r->i_hi ? r->hi : r->lo);
    run_put(r, r->last);
    r->open = false;
}

/* the run as one polyline (a dot when it is one point), then empty */
static void run_end(struct l3d_svg *g, struct run *r, const char *rgb, int dash) {
    run_flush_col(r);
    if (r->n == 1)
        l3d_svg_printf(g, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"2\" fill=\"%s\"/>\n", r->p[0],
                       r->p[1], rgb);
    if (r->n > 1) {
        l3d_svg_printf(g, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.6\" "
                       "stroke-linejoin=\"round\"%s points=\"", rgb, l3d_plot_dasharray(dash));
        for (int64_t i = 0; i < r->n; i++)
            l3d_svg_printf(g, "%s%.1f,%.1f", i ? " " : "", r->p[2 * i], r->p[2 * i + 1]);
        l3d_svg_printf(g, "\"/>\n");
    }
    r->n = 0;
}

static void draw_line(struct l3d_svg *g, const struct l3d_plot_series *s, const struct scale *x,
                      const struct scale *y) {
    struct run r = {0};
    const char *rgb = l3d_plot_rgb(s->color);
    for (int64_t i = 0; i < s->n; i++) {
        if (!usable(x, s->x[i]) || !usable(y, s->y[i])) { /* a gap */
            run_end(g, &r, rgb, s->dash);
            continue;
        }
        double q[2] = {px(x, s->x[i]), px(y, s->y[i])};
        int64_t col = (int64_t)floor(q[0]);
        if (!r.open || col != r.col) {
            run_flush_col(&r);
            r.open = true;
            r.col = col;
            memcpy(r.first, q, sizeof q);
            memcpy(r.lo, q, sizeof q);
            memcpy(r.hi, q, sizeof q);
            r.i_lo = r.i_hi = i;
        }
        if (q[1] > r.lo[1]) memcpy(r.lo, q, sizeof q), r.i_lo = i; /* lower on the page */
        if (q[1] < r.hi[1]) memcpy(r.hi, q, sizeof q), r.i_hi = i;
        memcpy(r.last, q, sizeof q);
    }
    run_end(g, &r, rgb, s->dash);
    free(r.p);
}

/* Points and rugs: one mark a pixel (a bitmap of the plot's pixels, or of its columns). */
static void draw_marks(struct l3d_svg *g, const struct l3d_plot_series *s, const struct scale *x,
                       const struct scale *y) {
    bool rug = s->style != L3D_PLOT_POINTS;
    int64_t w = (int64_t)fabs(x->b - x->a) + 2, h = rug ? 1 : (int64_t)fabs(y->a - y->b) + 2;
    unsigned char *seen = calloc((size_t)(w * h), 1);
    L3D_ASSERT(seen);
    const char *rgb = l3d_plot_rgb(s->color);
    double top = fmin(y->a, y->b), bottom = fmax(y->a, y->b);
    for (int64_t i = 0; i < s->n; i++) {
        if (!usable(x, s->x[i]) || (!rug && !usable(y, s->y[i]))) continue;
        double qx = px(x, s->x[i]);
        double qy = rug ? (s->style == L3D_PLOT_RUG_TOP ? top + 6 : bottom - 6) : px(y, s->y[i]);
        int64_t cx = (int64_t)(qx - fmin(x->a, x->b)), cy = rug ? 0 : (int64_t)(qy - top);
        if (cx < 0 || cx >= w || cy < 0 || cy >= h || seen[cy * w + cx]) continue;
        seen[cy * w + cx] = 1;
        marker(g, s->marker, qx, qy, rug ? 4.0 : 3.5, rgb);
        if (rug) /* a thin line through the plot at the mark, so the step can be read */
            l3d_svg_printf(g, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                           "stroke-width=\"0.6\" stroke-opacity=\"0.45\"/>", qx, qx, top, bottom,
                           rgb);
        if (!rug && s->labels && s->labels[i]) {
            l3d_svg_printf(g, "\n");
            l3d_svg_text(g, qx + 6, qy - 5, 11, "start", NULL, s->labels[i]);
        }
        l3d_svg_printf(g, "\n");
    }
    free(seen);
}

/* ---- axes, references, legend ------------------------------------------------------------- */

static void draw_axis(struct l3d_svg *g, const struct l3d_plot_axis *ax, const struct scale *s,
                      bool is_x, const struct scale *o) {
    l3d_svg_printf(g, "<g class=\"axis\" data-axis=\"%s\" data-lo=\"%.9g\" data-hi=\"%.9g\" "
                   "data-min=\"%.9g\" data-max=\"%.9g\" data-log=\"%d\">\n", is_x ? "x" : "y",
                   s->lo, s->hi, s->min, s->max, s->log);
    double step = s->log || s->nt < 2 ? 0 : s->t[1] - s->t[0];
    for (int i = 0; i < s->nt; i++) {
        double v = s->t[i];
        if (v < s->lo * (1 - 1e-9) - 1e-300 || v > s->hi * (1 + 1e-9) + 1e-300) continue;
        double p = px(s, v);
        char lab[32];
        l3d_plot_tick_label(v, step, lab, sizeof lab);
        if (is_x) {
            l3d_svg_printf(g, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" "
                           "stroke=\"#dddddd\"/>\n", p, p, o->a, o->b);
            l3d_svg_text(g, p, o->a + 16, 12, "middle", NULL, lab);
        } else {
            l3d_svg_printf(g, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" "
                           "stroke=\"#dddddd\"/>\n", o->a, o->b, p, p);
            l3d_svg_text(g, o->a - 6, p + 4, 12, "end", NULL, lab);
        }
    }
    if (is_x) {
        l3d_svg_text(g, (s->a + s->b) / 2, o->a + 36, 13, "middle", NULL, ax->label);
    } else {
        double cy = (s->a + s->b) / 2, cx = o->a - 52;
        l3d_svg_printf(g, "<g transform=\"rotate(-90 %.1f %.1f)\">", cx, cy);
        l3d_svg_text(g, cx, cy, 13, "middle", NULL, ax->label);
        l3d_svg_printf(g, "</g>\n");
    }
    l3d_svg_printf(g, "</g>\n");
}

static void draw_refs(struct l3d_svg *g, const struct l3d_plot_chart *c, const struct scale *x,
                      const struct scale *y) {
    for (int i = 0; i < c->nref; i++) {
        const struct l3d_plot_ref *r = &c->ref[i];
        double x1 = x->a, x2 = x->b, y1, y2;
        if (r->kind == L3D_REF_HLINE) {
            if (!usable(y, r->v)) continue;
            y1 = y2 = px(y, r->v);
        } else if (r->kind == L3D_REF_VLINE) {
            if (!usable(x, r->v)) continue;
            x1 = x2 = px(x, r->v);
            y1 = y->a, y2 = y->b;
        } else { /* y = x over the common range */
            double lo = fmax(x->lo, y->lo), hi = fmin(x->hi, y->hi);
            if (!(hi > lo)) continue;
            x1 = px(x, lo), x2 = px(x, hi), y1 = px(y, lo), y2 = px(y, hi);
        }
        l3d_svg_printf(g, "<g class=\"ref\"><line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" "
                       "stroke=\"#555555\" stroke-width=\"1.2\" stroke-dasharray=\"3 3\"/>", x1,
                       x2, y1, y2);
        if (r->label) /* inside the plot, left of a vertical line, under the others' end */
            l3d_svg_text(g, x2 - 4, r->kind == L3D_REF_HLINE ? y2 - 5 : fmin(y1, y2) + 14, 11,
                         "end", NULL, r->label);
        l3d_svg_printf(g, "</g>\n");
    }
}

static void draw_legend(struct l3d_svg *g, const struct l3d_plot_chart *c, double x0, double y0,
                        double h) {
    double y = y0 + 8;
    for (int i = 0; i < c->ns && y < y0 + h; i++) {
        const struct l3d_plot_series *s = &c->s[i];
        if (!s->name) continue;
        const char *rgb = l3d_plot_rgb(s->color);
        if (s->style == L3D_PLOT_LINE)
            l3d_svg_printf(g, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                           "stroke-width=\"2.5\"%s/>", x0, x0 + 22, y, y, rgb,
                           l3d_plot_dasharray(s->dash));
        else
            marker(g, s->marker, x0 + 11, y, 4, rgb);
        char name[40]; /* the legend's width: longer names cut with an ellipsis */
        size_t len = strlen(s->name);
        snprintf(name, sizeof name, "%.*s%s", len > 27 ? 25 : (int)len, s->name,
                 len > 27 ? "\xe2\x80\xa6" : "");
        l3d_svg_text(g, x0 + 28, y + 4, 12, "start", NULL, name);
        y += 17;
    }
}

void l3d_plot_chart_draw(struct l3d_svg *g, const struct l3d_plot_chart *c, double x0, double y0,
                         double w, double h) {
    double left = 74, right = c->legend ? 200 : 24, top = 34, bottom = 50;
    struct scale x = {.log = c->x.log, .a = x0 + left, .b = x0 + w - right};
    struct scale y = {.log = c->y.log, .a = y0 + h - bottom, .b = y0 + top};
    extents(c, &x, &y);
    double rx_lo = INFINITY, rx_hi = -INFINITY, ry_lo = INFINITY, ry_hi = -INFINITY;
    bool diagonal = false;
    for (int i = 0; i < c->nref; i++) {
        const struct l3d_plot_ref *r = &c->ref[i];
        if (r->kind == L3D_REF_HLINE && usable(&y, r->v)) ry_lo = fmin(ry_lo, r->v), ry_hi = fmax(ry_hi, r->v);
        if (r->kind == L3D_REF_VLINE && usable(&x, r->v)) rx_lo = fmin(rx_lo, r->v), rx_hi = fmax(rx_hi, r->v);
        diagonal |= r->kind == L3D_REF_DIAGONAL;
    }
    if (diagonal) { /* both axes over both extents: the diagonal runs corner to corner */
        rx_lo = ry_lo = fmin(fmin(x.min, y.min), fmin(rx_lo, ry_lo));
        rx_hi = ry_hi = fmax(fmax(x.max, y.max), fmax(rx_hi, ry_hi));
    }
    axis_range(&c->x, &x, rx_lo, rx_hi, (int)((x.b - x.a) / 90) + 2);
    axis_range(&c->y, &y, ry_lo, ry_hi, (int)((y.a - y.b) / 50) + 2);
    l3d_svg_printf(g, "<g class=\"chart\" data-title=\"");
    l3d_svg_escape(g->f, c->title);
    l3d_svg_printf(g, "\">\n");
    if (c->title) l3d_svg_text(g, x0 + left, y0 + 20, 15, "start", "bold", c->title);
    draw_axis(g, &c->x, &x, true, &y);
    draw_axis(g, &c->y, &y, false, &x);
    int clip = ++g->clips;
    l3d_svg_printf(g, "<clipPath id=\"clip%d\"><rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" "
                   "height=\"%.1f\"/></clipPath>\n<g clip-path=\"url(#clip%d)\">\n", clip,
                   x.a - 5, y.b - 5, x.b - x.a + 10, y.a - y.b + 10, clip);
    draw_refs(g, c, &x, &y);
    for (int i = 0; i < c->ns; i++) {
        const struct l3d_plot_series *s = &c->s[i];
        l3d_svg_printf(g, "<g class=\"series\" data-name=\"");
        l3d_svg_escape(g->f, s->name);
        l3d_svg_printf(g, "\" data-kind=\"");
        l3d_svg_escape(g->f, s->kind ? s->kind : "data");
        l3d_svg_printf(g, "\" data-points=\"%lld\">\n", (long long)s->n);
        if (s->style == L3D_PLOT_LINE) draw_line(g, s, &x, &y);
        else draw_marks(g, s, &x, &y);
        l3d_svg_printf(g, "</g>\n");
    }
    l3d_svg_printf(g, "</g>\n<rect class=\"frame\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" "
                   "height=\"%.1f\" fill=\"none\" stroke=\"#333333\"/>\n", x.a, y.b, x.b - x.a,
                   y.a - y.b);
    if (c->legend) draw_legend(g, c, x.b + 14, y.b, y.a - y.b);
    l3d_svg_printf(g, "</g>\n");
}
