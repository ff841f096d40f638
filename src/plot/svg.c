/* The SVG writer, the palette and the ticks (include/llm3d/plot.h). */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "llm3d/plot.h"

static const char *const rgb[L3D_PLOT_NCOLORS] = {"#0072B2", "#D55E00", "#009E73", "#E69F00",
                                                  "#CC79A7", "#56B4E9", "#000000", "#F0E442"};
static const char *const names[L3D_PLOT_NCOLORS] = {"blue", "vermillion", "bluish green",
                                                    "orange", "reddish purple", "sky blue",
                                                    "black", "yellow"};

static int wrap(int c) {
    return ((c % L3D_PLOT_NCOLORS) + L3D_PLOT_NCOLORS) % L3D_PLOT_NCOLORS;
}
const char *l3d_plot_rgb(int color) { return rgb[wrap(color)]; }
const char *l3d_plot_color_name(int color) { return names[wrap(color)]; }
const char *l3d_plot_dasharray(int dash) {
    static const char *const pattern[4] = {"", " stroke-dasharray=\"6 4\"",
                                           " stroke-dasharray=\"1.5 3\"",
                                           " stroke-dasharray=\"8 3 1.5 3\""};
    return pattern[((dash % 4) + 4) % 4];
}

l3d_status l3d_svg_begin(struct l3d_svg *s, const char *path, double w, double h,
                         const char *title) {
    memset(s, 0, sizeof *s);
    if (l3d_out_open(&s->out, path, "picture") != L3D_OK) return s->out.st;
    s->f = l3d_out_stream(&s->out);
    s->w = w;
    s->h = h;
    fprintf(s->f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
            "viewBox=\"0 0 %.0f %.0f\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">"
            "\n<title>", w, h, w, h);
    l3d_svg_escape(s->f, title);
    fprintf(s->f, "</title>\n<rect width=\"100%%\" height=\"100%%\" fill=\"#ffffff\"/>\n");
    return L3D_OK;
}

l3d_status l3d_svg_end(struct l3d_svg *s) {
    fprintf(s->f, "</svg>\n");
    s->f = NULL;
    return l3d_out_commit(&s->out);
}

void l3d_svg_printf(struct l3d_svg *s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfprintf(s->f, fmt, ap);
    va_end(ap);
}

void l3d_svg_escape(FILE *f, const char *text) {
    for (const unsigned char *c = (const unsigned char *)(text ? text : ""); *c; c++) {
        switch (*c) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        case '\'': fputs("&apos;", f); break;
        default:
            /* XML 1.0 has no control characters but tab, newline and return */
            if (*c >= 0x20 || *c == '\t') fputc(*c, f);
            else if (*c == '\n' || *c == '\r') fputc(' ', f);
        }
    }
}

void l3d_svg_text(struct l3d_svg *s, double x, double y, double size, const char *anchor,
                  const char *weight, const char *text) {
    fprintf(s->f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"%.0f\" text-anchor=\"%s\"%s%s%s>", x, y,
            size, anchor, weight ? " font-weight=\"" : "", weight ? weight : "",
            weight ? "\"" : "");
    l3d_svg_escape(s->f, text);
    fputs("</text>\n", s->f);
}

/* ---- ticks ---------------------------------------------------------------------------------- */

/* Heckbert's nice number: 1, 2, 5 or 10 times a power of ten, rounded or the next above */
static double nice_num(double x, bool round_it) {
    double e = floor(log10(x)), f = x / pow(10, e), n;
    if (round_it) n = f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10;
    else n = f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10;
    return n * pow(10, e);
}

static int linear_ticks(double *lo, double *hi, int target, double *t, int max) {
    if (!(*hi > *lo)) { /* one value: a range around it */
        double d = *lo != 0 ? fabs(*lo) * 0.1 : 1.0;
        *lo -= d;
        *hi += d;
    }
    double step = nice_num(nice_num(*hi - *lo, false) / (target > 1 ? target - 1 : 1), true);
    double a = floor(*lo / step) * step, b = ceil(*hi / step) * step;
    int n = 0;
    for (double v = a; v <= b + step * 0.5 && n < max; v += step)
        t[n++] = fabs(v) < step * 1e-9 ? 0.0 : v;
    *lo = a;
    *hi = b;
    return n;
}

static int log_ticks(double *lo, double *hi, int target, double *t, int max) {
    if (!(*hi > *lo)) {
        *lo = *lo / 2 > 0 ? *lo / 2 : *lo;
        *hi = *hi <= DBL_MAX / 2 ? *hi * 2 : DBL_MAX;
    }
    /* the powers of ten a double holds: 1e-323 (subnormal) to 1e308 */
    double a = fmax(floor(log10(*lo) + 1e-9), -323), b = fmin(ceil(log10(*hi) - 1e-9), 308);
    int n = 0;
    if (b - a <= 2) { /* a decade or two: 1, 2, 5 of each, within the data's range widened */
        static const double m[] = {1, 2, 5};
        double l = *lo, h = *hi;
        *lo = INFINITY, *hi = 0;
        for (double e = a - 1; e <= b && n < max; e++)
            for (int i = 0; i < 3 && n < max; i++) {
                double v = m[i] * pow(10, e);
                double next = i == 2 ? pow(10, e + 1) : m[i + 1] * pow(10, e);
                if (!isfinite(v)) break; /* 2e308 */
                if (v * 1.0001 < l && next * 1.0001 <= l) continue; /* the last tick below l */
                if (v > h * 1.0001 && (n == 0 || t[n - 1] * 1.0001 >= h)) continue;
                t[n++] = v;
                *lo = v < *lo ? v : *lo;
                *hi = v > *hi ? v : *hi;
            }
        return n;
    }
    double step = ceil((b - a) / (target > 1 ? target - 1 : 1));
    a = floor(a / step) * step;
    b = ceil(b / step) * step;
    for (double e = a; e <= b + 0.5 && n < max; e += step) t[n++] = pow(10, e);
    *lo = pow(10, a);
    *hi = pow(10, b);
    return n;
}

int l3d_plot_ticks(double *lo, double *hi, bool log, int target, double *ticks, int max) {
    double l = *lo, h = *hi;
    bool logs = log && *lo > 0;
    int n = logs ? log_ticks(lo, hi, target, ticks, max) : linear_ticks(lo, hi, target, ticks, max);
    /* Data near the largest double (or the smallest, on a log scale) widened to whole ticks would
     * end past what a double holds (1.7e308 to 1e309, or a span of 3.4e308): there the range ends
     * at the data, and the ticks beyond it are left out. */
    if (!isfinite(*lo) || (logs && (!(*lo > 0) || l < 1e-323))) *lo = l;
    if (!isfinite(*hi) || (logs && h > 1e308)) *hi = h;
    if (!(*hi > *lo) && *lo > 0) *lo *= 0.9; /* one such value: the range beside it, towards 0 */
    else if (!(*hi > *lo)) *hi *= 0.9;
    int k = 0;
    for (int i = 0; i < n; i++)
        if (isfinite(ticks[i]) && (!logs || ticks[i] > 0)) ticks[k++] = ticks[i];
    if (k == 0 && max >= 2 && *hi > *lo) ticks[k++] = *lo, ticks[k++] = *hi;
    return k;
}

void l3d_plot_tick_label(double v, double step, char *buf, size_t n) {
    static const char *const si[] = {"", "k", "M", "G", "T", "P"};
    double a = fabs(v);
    if (v == 0) {
        snprintf(buf, n, "0");
    } else if (a >= 1e4 && a < 1e18) { /* 20k, 1.5M: the digits the step needs */
        int k = 0;
        while (a >= 1000 && k < 5) a /= 1000, v /= 1000, step /= 1000, k++;
        int d = step > 0 && step < 1 ? (int)ceil(-log10(step) - 1e-9) : 0;
        if (step <= 0) snprintf(buf, n, "%g%s", v, si[k]);
        else snprintf(buf, n, "%.*f%s", d > 3 ? 3 : d, v, si[k]);
    } else if (a < 1e-3 || a >= 1e18) {
        snprintf(buf, n, "%.3g", v);
        /* "3e-04" -> "3e-4" */
        char *e = strchr(buf, 'e');
        if (e && (e[1] == '-' || e[1] == '+') && e[2] == '0') memmove(e + 2, e + 3, strlen(e + 3) + 1);
        if (e && e[1] == '+') memmove(e + 1, e + 2, strlen(e + 2) + 1);
    } else if (step <= 0) { /* a log axis: each its own digits */
        snprintf(buf, n, "%g", v);
    } else {
        int d = step < 1 ? (int)ceil(-log10(step) - 1e-9) : 0;
        snprintf(buf, n, "%.*f", d > 6 ? 6 : d, v);
    }
}
