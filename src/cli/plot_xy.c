/* llm3d plot --xy: the data files of the benchmark scripts (the bench scripts) as charts, so that every
 * picture of the project comes from one SVG writer (src/plot). The format (llm3d plot --help):
 *   # title: Data-parallel scaling          '# key: value' lines set the current chart
 *   # panel: weak scaling                   starts another chart (up to 4, two a row)
 *   # groups: 4                             series k: colour k mod 4, dash pattern (lines) or
 *                                           marker (points) k / 4 (default: the palette's 8)
 *   ZeRO-0 blocking<TAB>1<TAB>100           NAME, X, Y and an optional LABEL, tab-separated */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "llm3d/plot.h"

#define MAX_PANELS 4

struct xy_series {
    char *name;
    double *x, *y;
    char **labels;
    int64_t n, cap;
};

struct panel {
    char title[160], xlabel[96], ylabel[96], ideal[32];
    bool logx, logy, points;
    int groups; /* colours before the dash pattern or marker changes */
    struct xy_series s[L3D_PLOT_MAX_SERIES];
    int ns;
};

struct xy {
    char title[160];
    struct panel p[MAX_PANELS];
    int np;
};

static void strip(char *s) {
    size_t n = strlen(s);
    while (n && (s[n - 1] == '\n' || s[n - 1] == '\r' || s[n - 1] == ' ')) s[--n] = '\0';
}

/* '# key: value' into the current panel (a '#' line with another key is a comment) */
static l3d_status header(struct xy *d, char *line, const char *path, int lineno) {
    char *p = line + 1;
    while (*p == ' ') p++;
    char *colon = strchr(p, ':');
    char *v = colon ? colon + 1 : p + strlen(p);
    if (colon) *colon = '\0';
    while (*v == ' ') v++;
    struct panel *pn = &d->p[d->np ? d->np - 1 : 0];
    if (strcmp(p, "panel") == 0) {
        if (d->np == 1 && d->p[0].ns == 0 && !d->p[0].title[0]) { /* the keys before it: its */
            snprintf(d->p[0].title, sizeof d->p[0].title, "%s", v);
            return L3D_OK;
        }
        if (d->np == MAX_PANELS)
            return l3d_error(L3D_ERR_FORMAT, "%s: line %d: more than %d panels", path, lineno,
                             MAX_PANELS);
        pn = &d->p[d->np++];
        snprintf(pn->title, sizeof pn->title, "%s", v);
        if (d->np > 1) /* axes as the panel before, unless said again */
            memcpy(pn->xlabel, d->p[d->np - 2].xlabel, sizeof pn->xlabel),
                memcpy(pn->ylabel, d->p[d->np - 2].ylabel, sizeof pn->ylabel),
                memcpy(pn->ideal, d->p[d->np - 2].ideal, sizeof pn->ideal),
                pn->points = d->p[d->np - 2].points, pn->groups = d->p[d->np - 2].groups;
        return L3D_OK;
    }
    if (d->np == 0) d->np = 1;
    if (strcmp(p, "title") == 0) snprintf(d->title, sizeof d->title, "%s", v);
    else if (strcmp(p, "x") == 0) snprintf(pn->xlabel, sizeof pn->xlabel, "%s", v);
    else if (strcmp(p, "y") == 0) snprintf(pn->ylabel, sizeof pn->ylabel, "%s", v);
    else if (strcmp(p, "log-x") == 0) pn->logx = true;
    else if (strcmp(p, "log-y") == 0) pn->logy = true;
    else if (strcmp(p, "ideal") == 0) snprintf(pn->ideal, sizeof pn->ideal, "%s", v);
    else if (strcmp(p, "groups") == 0) {
        char *end;
        long g = strtol(v, &end, 10);
        if (end == v || *end || g < 1 || g > L3D_PLOT_NCOLORS)
            return l3d_error(L3D_ERR_FORMAT, "%s: line %d: groups '%s': give a whole number from "
                             "1 to %d (the palette's colours)", path, lineno, v, L3D_PLOT_NCOLORS);
        pn->groups = (int)g;
    } else if (strcmp(p, "style") == 0) {
        if (strcmp(v, "points") != 0 && strcmp(v, "lines") != 0)
            return l3d_error(L3D_ERR_FORMAT, "%s: line %d: style '%s': choose lines or points",
                             path, lineno, v);
        pn->points = strcmp(v, "points") == 0;
    }
    return L3D_OK;
}

static double number(const char *s, bool *ok) {
    char *end;
    double v = strtod(s, &end);
    *ok = end != s && *end == '\0' && !isinf(v);
    return v;
}

/* NAME<TAB>X<TAB>Y[<TAB>LABEL] into its series (a new one at a new name) */
static l3d_status row(struct xy *d, char *line, const char *path, int lineno) {
    char *f[4] = {line, NULL, NULL, NULL};
    int nf = 1;
    for (char *c = line; *c && nf < 4; c++)
        if (*c == '\t') *c = '\0', f[nf++] = c + 1;
    bool okx, oky;
    double x = nf >= 3 ? number(f[1], &okx) : 0, y = nf >= 3 ? number(f[2], &oky) : 0;
    if (nf < 3 || !okx || !oky || !*f[0])
        return l3d_error(L3D_ERR_FORMAT, "%s: line %d: expected NAME<tab>X<tab>Y with numbers X "
                         "and Y (Y may be nan), found '%.60s'", path, lineno, line);
    if (d->np == 0) d->np = 1;
    struct panel *pn = &d->p[d->np - 1];
    int k = 0;
    while (k < pn->ns && strcmp(pn->s[k].name, f[0]) != 0) k++;
    if (k == pn->ns) {
        if (pn->ns == L3D_PLOT_MAX_SERIES)
            return l3d_error(L3D_ERR_FORMAT, "%s: line %d: more than %d series in a panel", path,
                             lineno, L3D_PLOT_MAX_SERIES);
        pn->s[pn->ns++].name = strdup(f[0]);
    }
    struct xy_series *s = &pn->s[k];
    if (!pn->points && s->n > 0 && x < s->x[s->n - 1])
        return l3d_error(L3D_ERR_FORMAT, "%s: line %d: '%s' goes back to x %g after %g (lines "
                         "need x in order; or '# style: points')", path, lineno, f[0], x,
                         s->x[s->n - 1]);
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 16;
        s->x = realloc(s->x, (size_t)s->cap * sizeof *s->x);
        s->y = realloc(s->y, (size_t)s->cap * sizeof *s->y);
        s->labels = realloc(s->labels, (size_t)s->cap * sizeof *s->labels);
        L3D_ASSERT(s->x && s->y && s->labels);
    }
    s->labels[s->n] = nf == 4 ? strdup(f[3]) : NULL;
    s->x[s->n] = x;
    s->y[s->n++] = y;
    return L3D_OK;
}

static l3d_status draw(const struct xy *d, const char *out) {
    int cols = d->np > 1 ? 2 : 1, rows = (d->np + cols - 1) / cols;
    double w = cols == 1 ? 900 : 640, h = cols == 1 ? 520 : 440, top = d->title[0] ? 30 : 0;
    struct l3d_svg s;
    l3d_status st = l3d_svg_begin(&s, out, w * cols, h * rows + top,
                                  d->title[0] ? d->title : "llm3d");
    if (st != L3D_OK) return st;
    if (d->title[0]) l3d_svg_text(&s, 16, 22, 17, "start", "bold", d->title);
    for (int i = 0; i < d->np; i++) {
        const struct panel *pn = &d->p[i];
        struct l3d_plot_chart c = l3d_plot_chart_init(pn->title[0] ? pn->title : NULL,
                                                      pn->xlabel, pn->ylabel);
        c.x.log = pn->logx;
        c.y.log = pn->logy;
        int groups = pn->groups ? pn->groups : L3D_PLOT_NCOLORS;
        for (int k = 0; k < pn->ns; k++)
            l3d_plot_add(&c, (struct l3d_plot_series){
                .name = pn->s[k].name, .x = pn->s[k].x, .y = pn->s[k].y, .n = pn->s[k].n,
                .color = k % groups, .marker = k / groups, .dash = pn->points ? 0 : k / groups,
                .labels = (const char *const *)pn->s[k].labels,
                .style = pn->points ? L3D_PLOT_POINTS : L3D_PLOT_LINE});
        if (strcmp(pn->ideal, "diagonal") == 0) l3d_plot_add_ref(&c, L3D_REF_DIAGONAL, 0, "ideal");
        else if (pn->ideal[0]) l3d_plot_add_ref(&c, L3D_REF_HLINE, atof(pn->ideal), "ideal");
        l3d_plot_chart_draw(&s, &c, (i % cols) * w, top + (i / cols) * h, w, h);
    }
    return l3d_svg_end(&s);
}

int l3d_cli_plot_xy(const char *path, const char *out) {
    FILE *f = NULL;
    l3d_status st = l3d_fopen_regular(path, "data file", &f, NULL);
    struct xy *d = calloc(1, sizeof *d);
    L3D_ASSERT(d);
    char *line = NULL;
    size_t cap = 0;
    int lineno = 0, points = 0;
    while (st == L3D_OK && getline(&line, &cap, f) >= 0) {
        lineno++;
        strip(line);
        if (!line[0]) continue;
        st = line[0] == '#' ? header(d, line, path, lineno) : row(d, line, path, lineno);
        points += line[0] != '#';
    }
    free(line);
    if (f) fclose(f);
    if (st == L3D_OK && points == 0)
        st = l3d_error(L3D_ERR_FORMAT, "%s holds no data line (NAME<tab>X<tab>Y)", path);
    if (st == L3D_OK) st = draw(d, out);
    for (int i = 0; i < MAX_PANELS; i++)
        for (int k = 0; k < d->p[i].ns; k++) {
            struct xy_series *s = &d->p[i].s[k];
            for (int64_t j = 0; j < s->n; j++) free(s->labels[j]);
            free(s->name), free(s->x), free(s->y), free(s->labels);
        }
    free(d);
    if (st != L3D_OK) return l3d_cli_failed("plot");
    printf("wrote %s: %d data points\n", out, points);
    return 0;
}
