/* llm3d compare: are two runs the same training? The equivalence check of every parallel layout
 * against the single-process run (docs/DESIGN.md, Equivalence): per-step losses and gradient norms,
 * and final weights. The norm catches what the losses and weights cannot: a gradient scaled by a
 * constant (AdamW is invariant to it) reaches neither while the clipping is off, but it is a
 * different training once clipping acts.
 *
 * Every comparison is written so that a NaN fails it: a value that is not finite on either side
 * is a difference of its own, reported by name, and tolerances are tested as !(r <= rtol). (fmax
 * drops a NaN and `r > rtol` is false for one, so the obvious forms pass a NaN model as equal.) */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "llm3d/ckpt.h"
#include "llm3d/model.h"

enum { SAME = 0, DIFFERENT = 1, CANNOT = 2 }; /* exit statuses */

/* The losses and gradient norms of DIR/metrics.jsonl by step number. */
struct losses {
    int n;
    int *step;    /* strictly increasing */
    double *loss;
    double *norm; /* NaN where the line has "grad_norm":null (a step skipped as not finite) */
    int no_norm;  /* lines without "grad_norm" (metrics of an older llm3d) */
};

/* The number after KEY in line into *v, JSON's null as NaN; false when KEY is missing or not
 * followed by a number (strtod reads nan and inf too). */
static bool json_field(const char *line, const char *key, double *v) {
    const char *p = strstr(line, key);
    if (!p) return false;
    p += strlen(key);
    if (strncmp(p, "null", 4) == 0) {
        *v = NAN;
        return true;
    }
    char *end = NULL;
    *v = strtod(p, &end);
    return end != p;
}

/* Reads "step", "loss" and "grad_norm" of every line but the run record; CANNOT (with the message
 * printed) when the file is missing, empty, or a line lacks a step or loss, or the steps do not
 * increase. A line without "grad_norm" is counted (l->no_norm): its norm is not compared. */
static int read_losses(const char *dir, struct losses *l) {
    char path[4096], line[8192];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    memset(l, 0, sizeof *l);
    FILE *f;
    if (l3d_fopen_regular(path, "metrics file", &f, NULL) != L3D_OK) {
        fprintf(stderr, "llm3d compare: %s: is %s the --out of a run?\n", l3d_error_message(), dir);
        return CANNOT;
    }
    int cap = 0, lineno = 0, rc = SAME;
    while (rc == SAME && fgets(line, sizeof line, f)) {
        lineno++;
        if (strncmp(line, "{\"run\":", 7) == 0) continue; /* the run's record, not a step */
        const char *s = strstr(line, "\"step\":");
        char *end = NULL;
        long step = s ? strtol(s + 7, &end, 10) : 0;
        bool step_ok = s && end != s + 7;
        double loss = 0.0, norm = NAN;
        bool loss_ok = json_field(line, "\"loss\":", &loss);
        if (!json_field(line, "\"grad_norm\":", &norm)) l->no_norm++;
        if (!step_ok || !loss_ok) {
            fprintf(stderr, "llm3d compare: %s line %d has no \"step\" and \"loss\"\n",
                    path, lineno);
            rc = CANNOT;
        } else if (l->n > 0 && step <= l->step[l->n - 1]) {
            fprintf(stderr, "llm3d compare: %s line %d: step %ld after step %d (steps must "
                    "increase; was the file appended to without a resume?)\n", path, lineno, step,
                    l->step[l->n - 1]);
            rc = CANNOT;
        } else {
            if (l->n == cap) {
                cap = cap ? 2 * cap : 256;
                int *s2 = realloc(l->step, (size_t)cap * sizeof *l->step);
                if (s2) l->step = s2;
                double *l2 = realloc(l->loss, (size_t)cap * sizeof *l->loss);
                if (l2) l->loss = l2;
                double *n2 = realloc(l->norm, (size_t)cap * sizeof *l->norm);
                if (n2) l->norm = n2;
                if (!s2 || !l2 || !n2) {
                    fprintf(stderr, "llm3d compare: out of memory reading %s\n", path);
                    rc = CANNOT;
                    break;
                }
            }
            l->step[l->n] = (int)step;
            l->norm[l->n] = norm;
            l->loss[l->n++] = loss;
        }
    }
    fclose(f);
    if (rc == SAME && l->n == 0) {
        fprintf(stderr, "llm3d compare: %s holds no step\n", path);
        rc = CANNOT;
    }
    return rc;
}

/* |a - b| / |b|; infinite when either is not finite (NaN included) or b is 0 and a is not. */
static double rel_diff(double a, double b) {
    if (!isfinite(a) || !isfinite(b)) return INFINITY;
    if (b == 0.0) return a == 0.0 ? 0.0 : INFINITY;
    return fabs(a - b) / fabs(b);
}

/* The worst relative difference of one per-step quantity over the steps compared. */
struct worst {
    const char *what, *whats; /* "loss", "losses" */
    int n, step, nonfinite;
    double r, a, b;
};

/* Step `step` has x in run a, y in run b: kept when it is the worst so far; a value that is not
 * finite on either side is counted and (the first 5) printed. */
static void worst_add(struct worst *w, int step, double x, const char *a, double y,
                      const char *b) {
    if (!isfinite(x) || !isfinite(y)) {
        if (w->nonfinite++ < 5)
            printf("%s: step %d: %s not finite: %.9g in %s, %.9g in %s\n", w->whats, step,
                   w->what, x, a, y, b);
    }
    double r = rel_diff(x, y);
    if (w->n == 0 || !(r <= w->r)) w->r = r, w->step = step, w->a = x, w->b = y;
    w->n++;
}

/* Prints w's summary line; DIFFERENT when a value was not finite or the worst is above rtol. */
static int worst_end(const struct worst *w, int lo, int hi, double rtol) {
    if (w->nonfinite > 5)
        printf("%s: ... %d steps with a %s not finite in all\n", w->whats, w->nonfinite, w->what);
    printf("%s: %d steps compared (%d-%d), worst relative difference %.3g at step %d "
           "(%.9g vs %.9g)\n", w->whats, w->n, lo, hi, w->r, w->step, w->a, w->b);
    return w->nonfinite > 0 || !(w->r <= rtol) ? DIFFERENT : SAME;
}

static int no_common_step(const char *a, const struct losses *la, const char *b,
                          const struct losses *lb) {
    fprintf(stderr, "llm3d compare: %s (steps %d-%d) and %s (steps %d-%d) share no step: nothing "
            "to compare\n", a, la->step[0], la->step[la->n - 1], b, lb->step[0],
            lb->step[lb->n - 1]);
    return CANNOT;
}

/*
 * Matches the losses by step number: a run resumed from a checkpoint into a new --out holds the
 * steps after the checkpoint only. Both runs must end at the same step (the final weights are
 * compared) and hold every step of the range they share; steps before it in one run only are
 * noted. The gradient norms of those steps are compared likewise (rtol[1]; rtol[0] the losses'):
 * a step skipped in both runs (a norm of null in both: fp16's overflow, the same in equivalent
 * runs) agrees, one skipped in one run only is a difference; not compared when either file
 * lacks them. Returns SAME, DIFFERENT, or CANNOT when the runs share no step.
 */
static int compare_losses(const char *a, const struct losses *la, const char *b,
                          const struct losses *lb, const double rtol[2]) {
    int rc = SAME;
    int lo = la->step[0] > lb->step[0] ? la->step[0] : lb->step[0];
    int hi = la->step[la->n - 1] < lb->step[lb->n - 1] ? la->step[la->n - 1] : lb->step[lb->n - 1];
    if (lo > hi) return no_common_step(a, la, b, lb);
    if (la->step[la->n - 1] != lb->step[lb->n - 1]) {
        printf("steps: %s ends at step %d, %s at step %d: not the same training\n", a,
               la->step[la->n - 1], b, lb->step[lb->n - 1]);
        rc = DIFFERENT;
    }
    if (la->step[0] != lb->step[0]) { /* the earlier run's steps before the later one's first */
        bool a_first = la->step[0] < lb->step[0];
        const struct losses *e = a_first ? la : lb;
        int k = 0;
        while (e->step[k + 1] < lo) k++; /* e holds a step >= lo: lo <= hi <= its last */
        printf("steps: %d-%d only in %s (%s starts at step %d, as a run resumed there does)\n",
               e->step[0], e->step[k], a_first ? a : b, a_first ? b : a, lo);
    }
    struct worst wl = {.what = "loss", .whats = "losses"};
    struct worst wn = {.what = "gradient norm", .whats = "gradient norms"};
    int skipped = 0, i = 0, j = 0;
    while (i < la->n && la->step[i] < lo) i++;
    while (j < lb->n && lb->step[j] < lo) j++;
    while ((i < la->n && la->step[i] <= hi) || (j < lb->n && lb->step[j] <= hi)) {
        int sa = i < la->n && la->step[i] <= hi ? la->step[i] : hi + 1;
        int sb = j < lb->n && lb->step[j] <= hi ? lb->step[j] : hi + 1;
        if (sa != sb) { /* a gap: a step of the shared range missing from one run */
            printf("steps: step %d is in %s but not in %s\n", sa < sb ? sa : sb, sa < sb ? a : b,
                   sa < sb ? b : a);
            rc = DIFFERENT;
            if (sa < sb)
                i++;
            else
                j++;
            continue;
        }
        worst_add(&wl, sa, la->loss[i], a, lb->loss[j], b);
        if (isnan(la->norm[i]) && isnan(lb->norm[j]))
            skipped++;
        else
            worst_add(&wn, sa, la->norm[i], a, lb->norm[j], b);
        i++, j++;
    }
    if (wl.n == 0) return no_common_step(a, la, b, lb); /* e.g. steps 1, 3 and 2, 4 */
    if (worst_end(&wl, lo, hi, rtol[0]) != SAME) rc = DIFFERENT;
    if (la->no_norm > 0 || lb->no_norm > 0) {
        printf("gradient norms: not compared (%d lines of %s, %d of %s have no \"grad_norm\")\n",
               la->no_norm, a, lb->no_norm, b);
        return rc;
    }
    if (skipped > 0) printf("gradient norms: %d steps skipped in both runs\n", skipped);
    if (wn.n > 0 && worst_end(&wn, lo, hi, rtol[1]) != SAME) rc = DIFFERENT;
    return rc;
}

static float *read_weights(const char *dir, struct l3d_model_spec *cfg, int64_t *n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/model.bin", dir);
    if (l3d_ckpt_read_llmc_config(path, cfg) != L3D_OK) {
        fprintf(stderr, "llm3d compare: %s\n", l3d_error_message());
        return NULL;
    }
    struct l3d_shard sh = l3d_shard_full(cfg);
    struct l3d_tensor_info t[L3D_NUM_TENSORS];
    *n = l3d_gpt_plan_tensors(cfg, &sh, t);
    float *w = malloc((size_t)*n * sizeof(float));
    FILE *f = NULL;
    if (l3d_fopen_regular(path, "checkpoint", &f, NULL) != L3D_OK) f = NULL;
    bool ok = w && f && fseek(f, 1024, SEEK_SET) == 0 &&
              fread(w, sizeof(float), (size_t)*n, f) == (size_t)*n;
    if (f) fclose(f);
    if (!ok) {
        fprintf(stderr, "llm3d compare: cannot read the weights of %s\n", path);
        free(w);
        return NULL;
    }
    return w;
}

/* Per tensor: max|a - b| / max|b| over its elements (max|a - b| when b is all zeros), and a
 * difference of its own for every element that is not finite on either side. */
static int compare_weights(const char *a, const char *b, double rtol, bool verbose) {
    struct l3d_model_spec ca, cb;
    int64_t na = 0, nb = 0;
    float *wa = read_weights(a, &ca, &na);
    float *wb = wa ? read_weights(b, &cb, &nb) : NULL;
    int rc = wa && wb ? SAME : CANNOT;
    /* every shape (a MoE model's experts too: the tensors are laid out by them) */
    if (rc == SAME && (!l3d_model_same_shapes(&ca, &cb) || na != nb)) {
        printf("weights: different models: %s has L %d C %d NH %d V %d context %d, %d experts, "
               "%lld parameters; %s has L %d C %d NH %d V %d context %d, %d experts, %lld "
               "parameters\n", a, ca.L, ca.C, ca.NH, ca.V, ca.maxT, ca.moe.experts, (long long)na,
               b, cb.L, cb.C, cb.NH, cb.V, cb.maxT, cb.moe.experts, (long long)nb);
        rc = DIFFERENT;
    } else if (rc == SAME) {
        struct l3d_shard sh = l3d_shard_full(&ca);
        struct l3d_tensor_info t[L3D_NUM_TENSORS];
        l3d_gpt_plan_tensors(&ca, &sh, t);
        double worst = 0.0;
        const char *wname = t[0].name;
        for (int k = 0; k < L3D_NUM_TENSORS; k++) {
            double dmax = 0.0, bmax = 0.0;
            int64_t bad[2] = {0, 0}, first = -1;
            for (int64_t i = t[k].offset; i < t[k].offset + t[k].count; i++) {
                bool fa = isfinite(wa[i]), fb = isfinite(wb[i]);
                if (!fa || !fb) {
                    bad[0] += !fa, bad[1] += !fb;
                    if (first < 0) first = i;
                    continue;
                }
                double d = fabs((double)wa[i] - wb[i]), m = fabs((double)wb[i]);
                if (d > dmax) dmax = d;
                if (m > bmax) bmax = m;
            }
            if (bad[0] + bad[1] > 0) {
                printf("weights: %s not finite: %lld elements in %s, %lld in %s (first [%lld]: "
                       "%.9g vs %.9g)\n", t[k].name, (long long)bad[0], a, (long long)bad[1], b,
                       (long long)(first - t[k].offset), wa[first], wb[first]);
                rc = DIFFERENT;
            }
            double r = bmax > 0 ? dmax / bmax : dmax;
            if (bad[0] + bad[1] > 0) r = INFINITY;
            if (verbose)
                printf("weights: %-10s %9lld  max|a-b| %.3g  max|b| %.3g  ratio %.3g\n", t[k].name,
                       (long long)t[k].count, dmax, bmax, r);
            if (!(r <= worst)) worst = r, wname = t[k].name;
        }
        printf("weights: %lld parameters, worst tensor %s with max|a-b|/max|b| = %.3g\n",
               (long long)na, wname, worst);
        if (!(worst <= rtol)) rc = DIFFERENT;
    }
    free(wa);
    free(wb);
    return rc;
}

/* The defaults and the measurement behind them: docs/DESIGN.md, Equivalence. */
#define LOSS_RTOL 1e-5
#define NORM_RTOL 1e-5
#define WEIGHTS_RTOL 1e-3
#define STR_(x) #x
#define STR(x) STR_(x)

static void usage(FILE *f) {
    fprintf(f,
        "usage: llm3d compare RUN_DIR REFERENCE_DIR [--rtol R] [--loss-rtol R]\n"
        "                     [--norm-rtol R] [--weights-rtol R] [--verbose]\n"
        "\n"
        "Did two runs train the same model? Each directory is the --out of llm3d train\n"
        "(metrics.jsonl, model.bin). SAME when\n"
        "  - both runs end at the same step, and every step they share has a loss with\n"
        "    |a - b| <= R |b|; steps are matched by number, so a run resumed from a checkpoint\n"
        "    into a new --out (its metrics start after the checkpoint) compares with the\n"
        "    original; runs that share no step are an error;\n"
        "  - every step they share has a gradient norm (\"grad_norm\") with |a - b| <= R |b|,\n"
        "    or was skipped in both (null: fp16's overflow); a gradient of another scale (a\n"
        "    mean over the wrong number of replicas) leaves the losses and weights alone while\n"
        "    clipping is off or always on, not the norm; not compared for metrics without it;\n"
        "  - every weight tensor of model.bin has max|a - b| <= R max|b|;\n"
        "  - every loss and weight is finite in both runs (a NaN or Inf is a difference).\n"
        "Exit status: 0 SAME, 1 DIFFERENT, 2 nothing compared (usage, a missing or unreadable\n"
        "file, no step in common).\n"
        "\n"
        "Tolerances. Equivalent layouts (tp, pp, dp, ZeRO) add in other orders, so they differ\n"
        "by round-off, and AdamW amplifies it where a gradient is zero in exact arithmetic (the\n"
        "attention key bias, to which softmax is invariant; dead GELU units): it normalises the\n"
        "noise into steps of size lr with a random sign. The loss does not depend on those\n"
        "weights. Measured on the tiny model with tests/cli/equiv.sh's settings (10 and 40\n"
        "steps; tp2, dp2, dp2 ZeRO-1, pp2 and pp2 x tp2 x sp against one process):\n"
        "  losses   at most 1.2e-7 relative, with AdamW eps 1e-8 or 1e-6;\n"
        "  norms    at most 1.6e-7 relative (tests/cli/equiv.sh's layouts, 10 steps);\n"
        "  weights  at most 2.9e-4 of a tensor's max|b| with eps 1e-8 (train's default; 1.2e-4\n"
        "           without the key bias), 8e-6 with eps 1e-6 (up to 1.6e-5 where tp x pp ran\n"
        "           for some of the steps: tests/cli/ckpt.sh);\n"
        "  broken   data parallelism without its gradient reduction: losses 8e-3, worst\n"
        "           tensor 0.74-1.1; a loss gradient not divided by dp: norms 2x at dp 2.\n"
        "So the defaults pass equivalent runs trained with either eps, the weights with a margin\n"
        "of 3x (a tensor off by 1e-2 is a wrong layout). Runs trained with eps 1e-6 can be held\n"
        "to --rtol 1e-5 (3e-5 for some tp layouts), as tests/cli/equiv.sh does.\n"
        "\n");
}

enum { P_RTOL, P_LOSS, P_NORM, P_WEIGHTS, P_VERBOSE };

static const struct l3d_flag compare_flags[] = {
    {"rtol", "R", P_RTOL, "all of --loss-rtol, --norm-rtol and --weights-rtol"},
    {"loss-rtol", "R", P_LOSS, "per-step losses (default " STR(LOSS_RTOL) ")"},
    {"norm-rtol", "R", P_NORM, "per-step gradient norms (default " STR(NORM_RTOL) ")"},
    {"weights-rtol", "R", P_WEIGHTS, "final weight tensors (default " STR(WEIGHTS_RTOL) ")"},
    {"verbose", NULL, P_VERBOSE, "every tensor's max|a - b| and max|b|"},
    {NULL, NULL, 0, NULL},
};

struct compare_opts {
    float both, loss, norm, weights; /* -1: not given */
    bool verbose;
};

static int set_compare(void *ctx, const char *cmd, int id, const char *v) {
    struct compare_opts *o = ctx;
    switch (id) {
    case P_RTOL: return l3d_arg_float(cmd, "rtol", v, 0, 1, &o->both);
    case P_LOSS: return l3d_arg_float(cmd, "loss-rtol", v, 0, 1, &o->loss);
    case P_NORM: return l3d_arg_float(cmd, "norm-rtol", v, 0, 1, &o->norm);
    case P_WEIGHTS: return l3d_arg_float(cmd, "weights-rtol", v, 0, 1, &o->weights);
    case P_VERBOSE: o->verbose = true; return 1;
    }
    return 0;
}

int l3d_cli_compare(int argc, char **argv) {
    struct compare_opts o = {.both = -1.0f, .loss = -1.0f, .norm = -1.0f, .weights = -1.0f};
    const struct l3d_flag_group g = {NULL, compare_flags, set_compare, &o};
    int first = 0;
    int rc = l3d_flags_parse_n("compare", argc, argv, &g, usage, 2, "two run directories", &first);
    if (rc >= 0) return rc; /* 0 after --help is SAME's status, 2 CANNOT's */
    float both = o.both, loss_rtol = o.loss, weights_rtol = o.weights;
    bool verbose = o.verbose;
    double lt = loss_rtol >= 0 ? loss_rtol : both >= 0 ? both : LOSS_RTOL;
    double rt[2] = {lt, o.norm >= 0 ? o.norm : both >= 0 ? both : NORM_RTOL};
    double wt = weights_rtol >= 0 ? weights_rtol : both >= 0 ? both : WEIGHTS_RTOL;
    const char *a = argv[first], *b = argv[first + 1];
    struct losses la = {0}, lb = {0};
    rc = read_losses(a, &la);
    if (rc == SAME) rc = read_losses(b, &lb);
    if (rc == SAME) rc = compare_losses(a, &la, b, &lb, rt);
    if (rc != CANNOT) {
        int rw = compare_weights(a, b, wt, verbose);
        if (rw != SAME) rc = rw;
    }
    free(la.step);
    free(la.loss);
    free(la.norm);
    free(lb.step);
    free(lb.loss);
    free(lb.norm);
    if (rc != CANNOT)
        printf("%s (loss rtol %g, norm rtol %g, weights rtol %g)\n",
               rc == SAME ? "SAME" : "DIFFERENT", lt, rt[1], wt);
    return rc;
}
