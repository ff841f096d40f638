/* llm3d plan --svg: every layout the search evaluated, predicted step time against memory per
 * device, coloured by one dimension, the device's memory and the chosen layout marked; with
 * --published, predicted against published utilisation and the diagonal (src/cli/cli.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "llm3d/plan.h"
#include "llm3d/plot.h"

const char *const l3d_plan_svg_dims[L3D_PLAN_SVG_NDIMS] = {"tp", "pp", "dp", "zero",
                                                           "recompute"};

void l3d_plan_svg_keep(void *ctx, const struct l3d_plan_result *r) {
    struct l3d_plan_svg *a = ctx;
    if (a->n == a->cap) {
        a->cap = a->cap ? 2 * a->cap : 1024;
        a->r = realloc(a->r, (size_t)a->cap * sizeof *a->r);
        L3D_ASSERT(a->r);
    }
    a->r[a->n++] = *r;
}

static int dim_of(const struct l3d_layout *l, int dim) {
    const int v[] = {l->tp, l->pp, l->dp, l->zero, (int)l->recompute};
    return v[dim];
}

static void dim_name(int dim, int v, char *buf, size_t n) {
    static const char *const rc[] = {"no recomputation", "selective recomputation",
                                     "full recomputation"};
    if (dim == 4) snprintf(buf, n, "%s", v >= 0 && v < 3 ? rc[v] : "recompute ?");
    else if (dim == 3) snprintf(buf, n, "ZeRO-%d", v);
    else snprintf(buf, n, "%s %d", l3d_plan_svg_dims[dim], v);
}

static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* x: memory per device with the runtime's reserve (what `fits` compares), y: seconds a step */
static void point(const struct l3d_profile *prof, const struct l3d_plan_result *r, double sc,
                  double *x, double *y) {
    int th = r->layout.threads > 0 ? r->layout.threads : 1;
    *x = (r->mem.total + prof->reserve_bytes) / th / sc;
    *y = r->time.step;
}

int l3d_plan_svg_write(const char *path, const struct l3d_plan_svg *all,
                       const struct l3d_plan_result *best, const struct l3d_profile *prof,
                       int dim, const char *title) {
    enum { MAXG = L3D_PLOT_MAX_SERIES - 2 };
    int vals[MAXG], nv = 0;
    for (int64_t i = 0; i < all->n; i++) { /* the dimension's values, sorted */
        int v = dim_of(&all->r[i].layout, dim), k = 0;
        while (k < nv && vals[k] != v) k++;
        if (k == nv && nv < MAXG) vals[nv++] = v;
    }
    qsort(vals, (size_t)nv, sizeof *vals, cmp_int);
    double sc = prof->mem_bytes >= 4e9 ? 1e9 : 1048576.0;
    double *xy = malloc(2 * (size_t)(all->n + 1) * sizeof *xy);
    char (*names)[48] = calloc((size_t)nv + 2, sizeof *names);
    L3D_ASSERT(xy && names);
    char xl[64];
    snprintf(xl, sizeof xl, "memory per device, runtime reserve included (%s)",
             sc == 1e9 ? "GB" : "MiB");
    struct l3d_plot_chart c = l3d_plot_chart_init(title, xl, "predicted step time (s)");
    c.x.log = c.y.log = true;
    int64_t at = 0;
    for (int g = 0; g < nv; g++) { /* one series a value, its points together in xy */
        int64_t from = at;
        for (int64_t i = 0; i < all->n; i++)
            if (dim_of(&all->r[i].layout, dim) == vals[g])
                point(prof, &all->r[i], sc, &xy[at], &xy[all->n + at]), at++;
        dim_name(dim, vals[g], names[g], sizeof names[g]);
        l3d_plot_add(&c, (struct l3d_plot_series){.name = names[g], .kind = "layouts",
                                                  .x = xy + from, .y = xy + all->n + from,
                                                  .n = at - from, .color = g % 6,
                                                  .marker = g / 6,
                                                  .style = L3D_PLOT_POINTS});
    }
    double bx = 0, by = 0;
    if (best) {
        point(prof, best, sc, &bx, &by);
        snprintf(names[nv], sizeof names[nv], "chosen: tp %d pp %d dp %d", best->layout.tp,
                 best->layout.pp, best->layout.dp);
        l3d_plot_add(&c, (struct l3d_plot_series){.name = names[nv], .kind = "chosen", .x = &bx,
                                                  .y = &by, .n = 1, .color = L3D_PLOT_BLACK,
                                                  .marker = L3D_MARK_DIAMOND,
                                                  .style = L3D_PLOT_POINTS});
    }
    l3d_plot_add_ref(&c, L3D_REF_VLINE, prof->mem_bytes / sc, "device memory");
    struct l3d_svg s;
    l3d_status st = l3d_svg_begin(&s, path, 1000, 620, title);
    if (st == L3D_OK) {
        l3d_plot_chart_draw(&s, &c, 0, 0, 1000, 620);
        st = l3d_svg_end(&s);
    }
    free(xy);
    free(names);
    if (st != L3D_OK) return l3d_cli_failed("plan: --svg");
    printf("wrote %s: %lld layouts, coloured by %s\n", path, (long long)all->n,
           l3d_plan_svg_dims[dim]);
    return 0;
}

int l3d_plan_svg_published(const char *path, int n, const char *const *names,
                           const double *published, const double *pred, const double *pred_cal) {
    struct l3d_plot_chart c = l3d_plot_chart_init(
        "Planner against published runs (% of peak)", "published % of peak",
        "predicted % of peak");
    l3d_plot_add(&c, (struct l3d_plot_series){.name = "no fit", .kind = "predicted",
                                              .x = published, .y = pred, .n = n,
                                              .color = L3D_PLOT_BLUE, .labels = names,
                                              .style = L3D_PLOT_POINTS});
    l3d_plot_add(&c, (struct l3d_plot_series){.name = "calibrated (--calibrated)",
                                              .kind = "calibrated", .x = published, .y = pred_cal,
                                              .n = n, .color = L3D_PLOT_VERMILLION,
                                              .marker = L3D_MARK_SQUARE,
                                              .style = L3D_PLOT_POINTS});
    l3d_plot_add_ref(&c, L3D_REF_DIAGONAL, 0, "predicted = published");
    struct l3d_svg s;
    l3d_status st = l3d_svg_begin(&s, path, 1000, 640, c.title);
    if (st == L3D_OK) {
        l3d_plot_chart_draw(&s, &c, 0, 0, 1000, 640);
        st = l3d_svg_end(&s);
    }
    if (st != L3D_OK) return l3d_cli_failed("plan: --svg");
    printf("wrote %s: %d published runs\n", path, n);
    return 0;
}
