/*
 * Pictures as SVG files, written by llm3d itself (no plotting library, no new dependency): a
 * writer with text escaping, a colour-blind-safe palette, charts with nice linear and log ticks,
 * a legend, reference lines, and series thinned to what a pixel can show. Used by `llm3d plot`
 * (loss curves, pipeline timelines, benchmark data) and `llm3d plan --svg` (src/cli/plot.c,
 * src/cli/plan_svg.c).
 *
 *   struct l3d_svg svg;
 *   struct l3d_plot_chart c = l3d_plot_chart_init("loss", "step", "loss");
 *   l3d_plot_add(&c, (struct l3d_plot_series){.name = "run a", .x = step, .y = loss, .n = n});
 *   if (l3d_svg_begin(&svg, "loss.svg", 900, 500, "loss") != L3D_OK) return error;
 *   l3d_plot_chart_draw(&svg, &c, 0, 0, 900, 500);
 *   st = l3d_svg_end(&svg);  // written to a temporary, renamed when complete
 *
 * Large series are thinned, never cut: a line keeps, for every pixel column, the first, the
 * lowest, the highest and the last point (in their order), so a spike of one step in 10^6 stays
 * visible; points and marks keep one of each pixel they fall on. A value that is not finite (or
 * not positive on a log axis) is a gap: the line stops before it and starts again after it.
 *
 * Each chart's axes carry their ranges as attributes, for tests and other readers:
 *   <g class="axis" data-axis="x" data-lo=".." data-hi=".." data-min=".." data-max="..">
 * lo/hi the axis's range, min/max the finite data drawn on it; each series is a
 * <g class="series" data-name=".." data-kind=".."> of one <polyline> per unbroken run.
 */
#ifndef LLM3D_PLOT_H
#define LLM3D_PLOT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "llm3d/core.h"
#include "llm3d/file.h"

/* ---- the writer ---------------------------------------------------------------------------- */

struct l3d_svg {
    FILE *f;          /* out's stream */
    struct l3d_out out; /* include/llm3d/file.h's writer */
    double w, h;
    int clips; /* clip paths so far (ids) */
};

/* Opens path through the file writer (a temporary beside it; a FIFO, a device or a link refused)
 * and writes the document's head (a white background, the title as <title>). */
l3d_status l3d_svg_begin(struct l3d_svg *s, const char *path, double w, double h,
                         const char *title);
/* Closes the document and puts it in place of path; L3D_ERR_IO naming the file when a write
 * failed (nothing left behind). */
l3d_status l3d_svg_end(struct l3d_svg *s);
/* Raw markup (the caller escapes what it interpolates). */
void l3d_svg_printf(struct l3d_svg *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* text with &, <, >, " and ' escaped and control bytes dropped (valid XML whatever a run's name
 * holds) */
void l3d_svg_escape(FILE *f, const char *text);
/* One <text> at (x, y): size in px, anchor "start", "middle" or "end", weight "normal"/"bold";
 * the text escaped. */
void l3d_svg_text(struct l3d_svg *s, double x, double y, double size, const char *anchor,
                  const char *weight, const char *text);

/* ---- palette -------------------------------------------------------------------------------- */

/* Okabe and Ito's eight colours (2008, "Color Universal Design"), distinguishable with every
 * common colour-vision deficiency, in an order that puts the ones visible on white first. */
enum l3d_plot_color {
    L3D_PLOT_BLUE, L3D_PLOT_VERMILLION, L3D_PLOT_GREEN, L3D_PLOT_ORANGE, L3D_PLOT_PURPLE,
    L3D_PLOT_SKY, L3D_PLOT_BLACK, L3D_PLOT_YELLOW, L3D_PLOT_NCOLORS
};
const char *l3d_plot_rgb(int color);  /* "#0072B2"; any int, taken modulo the palette */
const char *l3d_plot_color_name(int color); /* "blue", "vermillion", ... */
/* A line's dash pattern as an attribute (" stroke-dasharray=\"6 4\"", "" for solid): dash 0-3,
 * taken modulo 4, so that series beyond the palette's colours stay apart. */
const char *l3d_plot_dasharray(int dash);

/* ---- charts --------------------------------------------------------------------------------- */

enum l3d_plot_style {
    L3D_PLOT_LINE,        /* joined in x order, gaps at values not finite */
    L3D_PLOT_POINTS,      /* a marker at each point */
    L3D_PLOT_RUG_BOTTOM,  /* a mark at each x along the bottom edge (y unused): skipped steps */
    L3D_PLOT_RUG_TOP,     /* the same along the top edge: loss-scale changes */
};
enum l3d_plot_marker { L3D_MARK_CIRCLE, L3D_MARK_SQUARE, L3D_MARK_TRIANGLE, L3D_MARK_DIAMOND,
                       L3D_MARK_CROSS, L3D_MARK_NMARKERS };

struct l3d_plot_series {
    const char *name;       /* the legend's entry; NULL: not listed */
    const char *kind;       /* data-kind of its group ("loss", "skipped"); NULL: "data" */
    const double *x, *y;    /* n points (LINE: x not decreasing) */
    int64_t n;
    int color;              /* enum l3d_plot_color */
    int marker;             /* enum l3d_plot_marker: POINTS, RUG_* */
    enum l3d_plot_style style;
    int dash;               /* 0 solid, 1 dashed, 2 dotted, 3 dash-dot (modulo 4) */
    const char *const *labels; /* POINTS: a text beside each point, or NULL */
};

struct l3d_plot_axis {
    const char *label;
    bool log;
    double lo, hi;          /* the range; NaN (l3d_plot_chart_init): from the data */
};

enum l3d_plot_ref_kind { L3D_REF_HLINE, L3D_REF_VLINE, L3D_REF_DIAGONAL };
struct l3d_plot_ref {       /* a reference drawn under the data, labelled at its end */
    enum l3d_plot_ref_kind kind;
    double v;               /* the y of HLINE, the x of VLINE */
    const char *label;
};

#define L3D_PLOT_MAX_SERIES 40
#define L3D_PLOT_MAX_REFS 8
struct l3d_plot_chart {
    const char *title;
    struct l3d_plot_axis x, y;
    struct l3d_plot_series s[L3D_PLOT_MAX_SERIES];
    int ns;
    struct l3d_plot_ref ref[L3D_PLOT_MAX_REFS];
    int nref;
    bool legend;            /* a legend right of the plot (set when a series has a name) */
};

struct l3d_plot_chart l3d_plot_chart_init(const char *title, const char *xlabel,
                                          const char *ylabel);
/* Adds a series (asserts room: L3D_PLOT_MAX_SERIES) or a reference line. */
void l3d_plot_add(struct l3d_plot_chart *c, struct l3d_plot_series s);
void l3d_plot_add_ref(struct l3d_plot_chart *c, enum l3d_plot_ref_kind kind, double v,
                      const char *label);
/* Draws c in the box (x, y, w, h) of the document: title, axes, ticks, grid, references, series,
 * legend. */
void l3d_plot_chart_draw(struct l3d_svg *s, const struct l3d_plot_chart *c, double x, double y,
                         double w, double h);

/* Tick values for [lo, hi]: linear, 1, 2 or 5 times a power of ten apart (Heckbert, "Nice
 * numbers for graph labels", Graphics Gems, 1990), the range widened to whole ticks in *lo, *hi;
 * log (lo > 0): powers of ten, or 1-2-5 multiples within a decade or two. Returns the count
 * (at most max). */
int l3d_plot_ticks(double *lo, double *hi, bool log, int target, double *ticks, int max);
/* A tick's text: "0.5", "2k", "1.5M", "3e-4" */
void l3d_plot_tick_label(double v, double step, char *buf, size_t n);

/* ---- what llm3d plots -------------------------------------------------------------------- */

/* A run's metrics.jsonl (src/train/report.c writes it) as columns, one row a step; a column the
 * file lacks, or a null, is NaN; a skipped step's loss is NaN (a gap). */
struct l3d_plot_metrics {
    char path[4200];
    int64_t n, cap, skipped;
    double *step, *tokens, *loss, *lr, *norm, *scale, *val;
    /* a mixture of experts' (NaN on a line without them): the auxiliary losses, the largest
     * layer's load and each layer's, load[i * layers + j] (layers 0: a dense run) */
    double *aux, *zloss, *load_max, *load;
    int layers;
};
/* run: a run folder (its metrics.jsonl) or the file. L3D_ERR_FORMAT names the file, the line,
 * the column and the key at the first line that is not a JSON object, a key of the wrong type
 * (a string where a number belongs), a missing step or loss, a step that does not increase, or a
 * "moe_load" that is not an array of numbers of the first one's length. */
l3d_status l3d_plot_metrics_read(struct l3d_plot_metrics *m, const char *run);
void l3d_plot_metrics_free(struct l3d_plot_metrics *m);

/* The pipeline timeline of a --trace file (Chrome trace events, src/train/trace.c) for one
 * training step (0: the last): one row a rank, forward, backward, receives, the data-parallel
 * wait and the optimizer, micro-batches numbered, idle time shaded. *bubble: the pipeline phase's
 * idle fraction over the ranks (each rank's span from its first to its last pipeline event, less
 * its forward and backward time: the trainer's measure); *step_out the step drawn. */
l3d_status l3d_plot_timeline(const char *trace, const char *out, int step, double *bubble,
                             int *step_out);

#endif
