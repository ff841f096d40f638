/* llm3d plot: a run's loss curves, a trace's pipeline timeline, or a benchmark's data file, as an
 * SVG picture (include/llm3d/plot.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "llm3d/plot.h"

static void usage(FILE *f) {
    fprintf(f,
        "usage: llm3d plot RUN [RUN...] --out FILE.svg [--log-x] [--log-y]\n"
        "       llm3d plot --trace TRACE.json --out FILE.svg [--step N]\n"
        "       llm3d plot --xy DATA.tsv --out FILE.svg\n"
        "\n"
        "RUN (a train --out folder, or its metrics.jsonl): training and validation loss against\n"
        "step and tokens, learning rate and gradient norm, several runs overlaid; skipped steps\n"
        "(x, below) and loss-scale changes (triangles, above) marked, a skipped step's loss a gap.\n"
        "--trace: one step of a train --trace file, one row a rank, micro-batches numbered, the\n"
        "bubble fraction printed. --xy: lines of NAME<tab>X<tab>Y[<tab>LABEL], headed by '# key:\n"
        "value' lines (title, x, y, log-x, log-y, ideal: V|diagonal, style: lines|points, groups:\n"
        "N to colour series k by k mod N and dash (or mark) them by k / N, panel: TITLE to start\n"
        "another chart) -- what bench/*.sh write.\n"
        "\n");
}

enum { O_OUT, O_TRACE, O_STEP, O_XY, O_LOGX, O_LOGY };
static const struct l3d_flag plot_flags[] = {
    {"out", "FILE.svg", O_OUT, "the picture to write (required)"},
    {"trace", "FILE", O_TRACE, "draw this --trace file's pipeline timeline"},
    {"step", "N", O_STEP, "with --trace: the step to draw (default: the last traced)"},
    {"xy", "FILE", O_XY, "draw this data file (see above)"},
    {"log-x", NULL, O_LOGX, "step and tokens on a log scale"},
    {"log-y", NULL, O_LOGY, "loss and gradient norm on a log scale"},
    {NULL, NULL, 0, NULL},
};

struct plot_opts {
    const char *out, *trace, *xy;
    int step;
    bool logx, logy;
};

static int set_plot(void *ctx, const char *cmd, int id, const char *v) {
    struct plot_opts *o = ctx;
    switch (id) {
    case O_OUT: o->out = v; return 1;
    case O_TRACE: o->trace = v; return 1;
    case O_STEP: return l3d_arg_int(cmd, "step", v, 1, 1 << 30, &o->step);
    case O_XY: o->xy = v; return 1;
    case O_LOGX: o->logx = true; return 1;
    case O_LOGY: o->logy = true; return 1;
    }
    return 0;
}

/* ---- loss curves ---------------------------------------------------------------------------- */

#define MAX_RUNS 8
/* one run's columns, and the sparse ones gathered: validation points, skipped steps, loss-scale
 * changes (so that a line through them has no gaps between its points) */
/* a mixture of experts' loads: each layer's line up to this many layers, else the largest and
 * the mean over the layers */
#define LOAD_LAYERS 6
struct run {
    struct l3d_plot_metrics m;
    char name[96], val_name[112], skip_name[128], scale_name[128];
    double *vs, *vt, *vy, *skip, *chg;
    int64_t nv, nskip, nchg;
    char load_name[LOAD_LAYERS][128], aux_name[2][128];
    double *load[LOAD_LAYERS]; /* the layers' columns (strided out of m.load), or the mean */
    int nload;
};

/* The run's load columns: each layer's when it has at most LOAD_LAYERS and the chart has room
 * for every run's, else the mean. */
static void gather_loads(struct run *r, int nruns) {
    const struct l3d_plot_metrics *m = &r->m;
    int L = m->layers;
    int cols = L <= LOAD_LAYERS && nruns * (1 + L) <= L3D_PLOT_MAX_SERIES ? L : 1;
    r->nload = cols;
    for (int j = 0; j < cols; j++) {
        r->load[j] = malloc((size_t)(m->n > 0 ? m->n : 1) * sizeof(double));
        L3D_ASSERT(r->load[j]);
        for (int64_t i = 0; i < m->n; i++) {
            double sum = 0;
            for (int k = 0; k < L; k++) sum += m->load[i * L + k];
            r->load[j][i] = cols == L ? m->load[i * L + j] : sum / L;
        }
        if (cols == L) snprintf(r->load_name[j], sizeof r->load_name[j], "%s: layer %d", r->name, j);
        else snprintf(r->load_name[j], sizeof r->load_name[j], "%s: mean of %d layers", r->name, L);
    }
    snprintf(r->aux_name[0], sizeof r->aux_name[0], "%s: load balancing", r->name);
    snprintf(r->aux_name[1], sizeof r->aux_name[1], "%s: router z", r->name);
}

static void gather(struct run *r, int nruns) {
    const struct l3d_plot_metrics *m = &r->m;
    r->vs = malloc(5 * (size_t)m->n * sizeof(double));
    L3D_ASSERT(r->vs);
    r->vt = r->vs + m->n, r->vy = r->vt + m->n, r->skip = r->vy + m->n, r->chg = r->skip + m->n;
    for (int64_t i = 0; i < m->n; i++) {
        if (isfinite(m->val[i]))
            r->vs[r->nv] = m->step[i], r->vt[r->nv] = m->tokens[i], r->vy[r->nv++] = m->val[i];
        if (isnan(m->loss[i])) r->skip[r->nskip++] = m->step[i];
        if (i > 0 && m->scale[i] != m->scale[i - 1] && isfinite(m->scale[i]))
            r->chg[r->nchg++] = m->step[i];
    }
    snprintf(r->val_name, sizeof r->val_name, "%s, validation", r->name);
    snprintf(r->skip_name, sizeof r->skip_name, "%s: %lld skipped", r->name,
             (long long)r->nskip);
    snprintf(r->scale_name, sizeof r->scale_name, "%s: loss scale changed", r->name);
    if (m->layers > 0) gather_loads(r, nruns);
}

/* A mixture of experts' charts, c[0] the load, c[1] the auxiliary losses (unweighted): run i's
 * series, the load of the busiest layer solid and the layers' (or their mean) dashed. */
static void add_moe(struct l3d_plot_chart *c, const struct run *r, int i) {
    const struct l3d_plot_metrics *m = &r->m;
    if (m->layers == 0) return;
    l3d_plot_add(&c[0], (struct l3d_plot_series){.name = r->name, .kind = "load-max", .x = m->step,
                                                 .y = m->load_max, .n = m->n, .color = i});
    for (int j = 0; j < r->nload; j++)
        l3d_plot_add(&c[0], (struct l3d_plot_series){.name = r->load_name[j], .kind = "load",
                                                     .x = m->step, .y = r->load[j], .n = m->n,
                                                     .color = i, .dash = 1 + j % 3});
    l3d_plot_add(&c[1], (struct l3d_plot_series){.name = r->aux_name[0], .kind = "aux",
                                                 .x = m->step, .y = m->aux, .n = m->n,
                                                 .color = i});
    l3d_plot_add(&c[1], (struct l3d_plot_series){.name = r->aux_name[1], .kind = "z",
                                                 .x = m->step, .y = m->zloss, .n = m->n,
                                                 .color = i, .dash = 1});
}

/* The run's series on chart c against x (steps or tokens): y the column, with validation,
 * skipped and loss-scale marks where `marks`. */
static void add_run(struct l3d_plot_chart *c, const struct run *r, int color, const double *x,
                    const double *y, const double *vx, bool marks) {
    l3d_plot_add(c, (struct l3d_plot_series){.name = r->name, .kind = "train", .x = x, .y = y,
                                              .n = r->m.n, .color = color});
    if (vx && r->nv > 0) {
        l3d_plot_add(c, (struct l3d_plot_series){.name = r->val_name, .kind = "validation",
                                                  .x = vx, .y = r->vy, .n = r->nv,
                                                  .color = color, .dash = 1});
        l3d_plot_add(c, (struct l3d_plot_series){.kind = "validation-points", .x = vx,
                                                  .y = r->vy, .n = r->nv, .color = color,
                                                  .style = L3D_PLOT_POINTS});
    }
    if (marks && r->nskip > 0)
        l3d_plot_add(c, (struct l3d_plot_series){.name = r->skip_name, .kind = "skipped",
                                                  .x = r->skip, .n = r->nskip, .color = color,
                                                  .marker = L3D_MARK_CROSS,
                                                  .style = L3D_PLOT_RUG_BOTTOM});
    if (marks && r->nchg > 0)
        l3d_plot_add(c, (struct l3d_plot_series){.name = r->scale_name, .kind = "loss-scale",
                                                  .x = r->chg, .n = r->nchg, .color = color,
                                                  .marker = L3D_MARK_TRIANGLE,
                                                  .style = L3D_PLOT_RUG_TOP});
}

/* The loss curves, and with a mixture of experts in any run a third row: the experts' load
 * (tokens of the busiest expert over the mean, each layer summed over the ranks, 1 balanced) and
 * the auxiliary losses. */
static l3d_status loss_figure(struct run *runs, int n, const struct plot_opts *o) {
    struct l3d_plot_chart c[6] = {
        l3d_plot_chart_init("Loss by step", "step", "loss"),
        l3d_plot_chart_init("Loss by tokens", "tokens", "loss"),
        l3d_plot_chart_init("Learning rate", "step", "learning rate"),
        l3d_plot_chart_init("Gradient norm (before clipping)", "step", "gradient norm"),
        l3d_plot_chart_init("Expert load (busiest expert / mean; solid: the busiest layer)",
                            "step", "load"),
        l3d_plot_chart_init("Router auxiliary losses (unweighted)", "step", "loss")};
    int charts = 4;
    for (int i = 0; i < n; i++) charts = runs[i].m.layers > 0 ? 6 : charts;
    for (int k = 0; k < charts; k++) {
        c[k].x.log = o->logx;
        c[k].y.log = o->logy && k != 2 && k != 4;
    }
    if (charts == 6) l3d_plot_add_ref(&c[4], L3D_REF_HLINE, 1.0, "balanced");
    for (int i = 0; i < n; i++) {
        const struct run *r = &runs[i];
        add_run(&c[0], r, i, r->m.step, r->m.loss, r->vs, true);
        add_run(&c[1], r, i, r->m.tokens, r->m.loss, r->vt, false);
        add_run(&c[2], r, i, r->m.step, r->m.lr, NULL, false);
        add_run(&c[3], r, i, r->m.step, r->m.norm, NULL, true);
        add_moe(&c[4], r, i);
    }
    struct l3d_svg s;
    l3d_status st = l3d_svg_begin(&s, o->out, 1280, 440.0 * charts / 2, "llm3d training curves");
    if (st != L3D_OK) return st;
    for (int k = 0; k < charts; k++)
        l3d_plot_chart_draw(&s, &c[k], (k % 2) * 640, (k / 2) * 440, 640, 440);
    return l3d_svg_end(&s);
}

/* The legend's name of each run: its folder's last part, or the whole path where two runs share
 * it (a run and its resumed copy in folders of the same name). */
static void name_runs(struct run *runs, char **paths, int n) {
    for (int i = 0; i < n; i++) {
        char p[4096];
        snprintf(p, sizeof p, "%s", paths[i]);
        size_t len = strlen(p);
        while (len > 1 && p[len - 1] == '/') p[--len] = '\0';
        char *slash = strrchr(p, '/');
        const char *base = slash && slash[1] ? slash + 1 : p;
        if (strcmp(base, "metrics.jsonl") == 0 && slash) { /* the file given: its folder */
            *slash = '\0';
            slash = strrchr(p, '/');
            base = slash ? slash + 1 : p;
        }
        snprintf(runs[i].name, sizeof runs[i].name, "%s", base);
    }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++)
            if (i != j && strcmp(runs[i].name, runs[j].name) == 0) {
                snprintf(runs[i].name, sizeof runs[i].name, "%s", paths[i]);
                break;
            }
}

static int plot_runs(char **paths, int n, const struct plot_opts *o) {
    if (n > MAX_RUNS) {
        fprintf(stderr, "llm3d plot: %d runs: at most %d in one picture (a legend beyond that "
                "cannot be read); plot them in groups\n", n, MAX_RUNS);
        return 2;
    }
    struct run runs[MAX_RUNS];
    memset(runs, 0, sizeof runs);
    l3d_status st = L3D_OK;
    int got = 0;
    for (; got < n && st == L3D_OK; got++)
        if ((st = l3d_plot_metrics_read(&runs[got].m, paths[got])) != L3D_OK) break;
    if (st == L3D_OK) {
        name_runs(runs, paths, n);
        for (int i = 0; i < n; i++) gather(&runs[i], n);
        st = loss_figure(runs, n, o);
    }
    int64_t steps = 0, val = 0, skipped = 0;
    for (int i = 0; i < got; i++) {
        steps += runs[i].m.n, val += runs[i].nv, skipped += runs[i].nskip;
        free(runs[i].vs);
        for (int j = 0; j < LOAD_LAYERS; j++) free(runs[i].load[j]);
        l3d_plot_metrics_free(&runs[i].m);
    }
    if (st != L3D_OK) return l3d_cli_failed("plot");
    printf("wrote %s: %d run%s, %lld steps, %lld validation points, %lld skipped\n", o->out, n,
           n == 1 ? "" : "s", (long long)steps, (long long)val, (long long)skipped);
    return 0;
}

/* ---- entry ---------------------------------------------------------------------------------- */

int l3d_cli_plot(int argc, char **argv) {
    struct plot_opts o = {0};
    struct l3d_flag_group g[] = {{NULL, plot_flags, set_plot, &o}};
    int first = 0;
    int rc = l3d_flags_parse("plot", argc, argv, g, 1, usage, &first);
    if (rc >= 0) return rc;
    int nruns = argc - first, modes = (nruns > 0) + !!o.trace + !!o.xy;
    if (!o.out || modes != 1) {
        fprintf(stderr, "llm3d plot: give %s (llm3d plot --help)\n",
                !o.out ? "--out FILE.svg" : "one of: run folders, --trace FILE, --xy FILE");
        return 2;
    }
    if (o.step && !o.trace) {
        fprintf(stderr, "llm3d plot: --step %d picks a step of a --trace file; give --trace\n",
                o.step);
        return 2;
    }
    if (o.xy) return l3d_cli_plot_xy(o.xy, o.out);
    if (!o.trace) return plot_runs(argv + first, nruns, &o);
    double bubble = 0;
    int step = 0;
    if (l3d_plot_timeline(o.trace, o.out, o.step, &bubble, &step) != L3D_OK)
        return l3d_cli_failed("plot");
    printf("wrote %s: step %d, pipeline bubble %.1f%% (idle share of each rank's pipeline "
           "phase)\n", o.out, step, 100 * bubble);
    return 0;
}
