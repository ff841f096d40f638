/* llm3d compare: are two runs the same training? The equivalence check of every parallel layout
 * against the single-process run (shared/DESIGN.md): per-step losses and final weights. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "llm3d/ckpt.h"
#include "llm3d/model.h"

/* Reads the "loss" of every line of DIR/metrics.jsonl; returns the count (0 on error). */
static int read_losses(const char *dir, double *loss, int max) {
    char path[4096], line[8192];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "llm3d compare: cannot open %s\n", path);
        return 0;
    }
    int n = 0;
    while (n < max && fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "\"loss\":");
        if (p) loss[n++] = strtod(p + 7, NULL);
    }
    fclose(f);
    return n;
}

static float *read_weights(const char *dir, struct l3d_gpt_config *cfg, int64_t *n) {
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
    FILE *f = fopen(path, "rb");
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

int l3d_cli_compare(int argc, char **argv) {
    static const struct option opts[] = {{"rtol", required_argument, NULL, 'r'},
                                         {"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}};
    float rtol = 1e-5f;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (c == 'r' && l3d_arg_float("compare", "rtol", optarg, 0, 1, &rtol)) continue;
        if (c == 'h') {
            printf("usage: llm3d compare RUN_DIR REFERENCE_DIR [--rtol R (1e-5)]\n"
                   "Each directory holds metrics.jsonl and model.bin of llm3d train --out. Passes when\n"
                   "every step's loss has |a - b| <= R |b| and every weight tensor has\n"
                   "max |a - b| <= R max |b|.\n");
            return 0;
        }
        return 2;
    }
    if (argc - optind != 2) {
        fprintf(stderr, "llm3d compare: give two run directories (see --help)\n");
        return 2;
    }
    const char *a = argv[optind], *b = argv[optind + 1];
    enum { MAXSTEPS = 100000 };
    double *la = malloc(MAXSTEPS * sizeof(double)), *lb = malloc(MAXSTEPS * sizeof(double));
    int na = read_losses(a, la, MAXSTEPS), nb = read_losses(b, lb, MAXSTEPS);
    int rc = 0;
    if (na == 0 || na != nb) {
        fprintf(stderr, "llm3d compare: %s has %d steps, %s has %d\n", a, na, b, nb);
        rc = 1;
    }
    double worst = 0.0;
    int worst_i = 0;
    for (int i = 0; rc == 0 && i < na; i++) {
        double r = fabs(la[i] - lb[i]) / fabs(lb[i]);
        if (r > worst) worst = r, worst_i = i;
    }
    if (rc == 0) {
        printf("losses: %d steps, worst relative difference %.3g at step %d (%.9g vs %.9g)\n", na,
               worst, worst_i + 1, la[worst_i], lb[worst_i]);
        if (worst > rtol) rc = 1;
    }
    struct l3d_gpt_config ca, cb;
    int64_t wa_n = 0, wb_n = 0;
    float *wa = rc == 0 ? read_weights(a, &ca, &wa_n) : NULL;
    float *wb = rc == 0 ? read_weights(b, &cb, &wb_n) : NULL;
    if (rc == 0 && (!wa || !wb || wa_n != wb_n)) {
        if (wa && wb) fprintf(stderr, "llm3d compare: the two models differ in size\n");
        rc = 1;
    }
    if (rc == 0) {
        struct l3d_shard sh = l3d_shard_full(&ca);
        struct l3d_tensor_info t[L3D_NUM_TENSORS];
        l3d_gpt_plan_tensors(&ca, &sh, t);
        double wworst = 0.0;
        const char *wname = "";
        for (int k = 0; k < L3D_NUM_TENSORS; k++) {
            double dmax = 0.0, bmax = 0.0;
            for (int64_t i = t[k].offset; i < t[k].offset + t[k].count; i++) {
                dmax = fmax(dmax, fabs((double)wa[i] - wb[i]));
                bmax = fmax(bmax, fabs((double)wb[i]));
            }
            double r = bmax > 0 ? dmax / bmax : dmax;
            if (r > wworst) wworst = r, wname = t[k].name;
        }
        printf("weights: %lld parameters, worst tensor %s with max|a-b|/max|b| = %.3g\n",
               (long long)wa_n, wname, wworst);
        if (wworst > rtol) rc = 1;
    }
    printf("%s (rtol %g)\n", rc == 0 ? "equivalent" : "DIFFERENT", rtol);
    free(la);
    free(lb);
    free(wa);
    free(wb);
    return rc;
}
