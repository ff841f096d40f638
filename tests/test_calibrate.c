/*
 * The calibration's profile writer without measuring anything: measurements of a plausible
 * machine are written (l3d_calib_write, through the profile's key table) and read back by the
 * planner's parser to the same figures; every key of the shipped profiles is written by the key
 * table and read back to the same value (to the written digits). Measurements the planner would
 * refuse (NaN, negative, above the bound, for every bounded key the file holds; a busy machine's
 * gemm_thread_eff of 1.822, written as calibrate's tighter bound 1.25) are written as the nearest
 * value it accepts, with a comment saying what was measured, and the file parses; the parser
 * still refuses such a value written by hand.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "llm3d/calibrate.h"
#include "plan/calibrate-impl.h"
#include "plan/profile-impl.h"
#include "test.h"

/* Measurements of a plausible 2-core machine, one node, 2 ranks */
static void plausible(struct l3d_calib *c) {
    memset(c, 0, sizeof *c);
    c->quick = true;
    c->cores = 2, c->ranks = 2, c->nodes = 1, c->per_node = 2;
    CPU_ZERO(&c->cpus);
    CPU_SET(0, &c->cpus);
    CPU_SET(1, &c->cpus);
    for (int i = 0; i < 3; i++) c->others[i] = 0.0, c->share[i] = 1.0;
    c->fma = 80e9;
    c->bw_all = 20e9, c->bw_one = 12e9, c->triad_bytes = 12 << 20;
    c->mem_bytes = 16e9;
    c->n_eff = 6, c->n_wg = 4, c->eff_shapes = 6;
    for (int i = 0; i < c->n_eff; i++)
        c->eff_flops[i] = 1e6 * pow(10, i), c->eff[i] = 0.3 + 0.1 * i;
    for (int i = 0; i < c->n_wg; i++) c->wg_tok[i] = 64 << i, c->wg_eff[i] = 0.5 + 0.05 * i;
    c->attn_eff = 0.31, c->attn_fwd_s = 0.01, c->attn_bwd_s = 0.02;
    for (int i = 0; i < 4; i++) c->thr_all[i] = 150e9, c->thr_one[i] = 80e9;
    c->thread_eff = 0.9375;
    for (int i = 0; i < L3D_KERN_N; i++) c->k_bw[i] = 10e9 * (i + 1);
    c->kernel_bw_eff = 1.25;
    c->intra_bw = 5e9, c->intra_lat = 2e-6;
    c->ov_frac = 0.09, c->stream_bytes = 16 << 20, c->stream_rounds = 3;
    for (int t = 0; t < 2; t++) {
        c->n_eff16[t] = 6, c->n_wg16[t] = 4;
        for (int i = 0; i < 6; i++) c->eff16_flops[t][i] = c->eff_flops[i], c->eff16[t][i] = 0.2;
        for (int i = 0; i < 4; i++) c->wg16_tok[t][i] = c->wg_tok[i], c->wg16_eff[t][i] = 0.4;
        c->attn_eff16[t] = 0.15, c->thread_eff16[t] = 0.8, c->kernel_bw_eff16[t] = 0.7;
        for (int i = 0; i < 4; i++) c->thr_all16[t][i] = 1.6, c->thr_one16[t][i] = 1;
        for (int i = 0; i < L3D_KERN_N; i++) c->k_bw16[t][i] = 8e9;
    }
    c->native16[0] = true, c->peak16[0] = 160e9;
    /* the grid by shape (--quick: each row's first and last) and a model's two shapes */
    for (int i = 0; i < L3D_CALIB_GRID; i++) {
        c->grid_eff[i] = 0.3 + 0.02 * i;
        c->grid16_eff[0][i] = c->grid16_eff[1][i] = 0.2 + 0.01 * i;
    }
    c->n_exact = 2;
    const int64_t shapes[2][3] = {{256, 1152, 384}, {256, 256, 384}};
    memcpy(c->exact_shape, shapes, sizeof shapes);
    snprintf(c->model, sizeof c->model, "model d6");
    for (int i = 0; i < 2; i++) {
        c->exact_eff[i] = 0.6 + 0.1 * i, c->exact_wg[i] = 0.5;
        for (int t = 0; t < 2; t++) c->exact16_eff[t][i] = 0.4, c->exact16_wg[t][i] = 0.3 + 0.1 * i;
    }
}

/* The file l3d_calib_write gives for c and p (malloc'd) */
static char *written(const struct l3d_calib *c, const struct l3d_profile *p) {
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    l3d_calib_write(m, c, p);
    fclose(m);
    return text;
}

/* Plausible measurements: the file parses to them, to the written digits, with no note */
static void test_round_trip(void) {
    struct l3d_calib c;
    plausible(&c);
    struct l3d_profile p, back;
    l3d_calib_profile(&c, &p);
    char *text = written(&c, &p);
    CHECK(l3d_profile_parse(&back, text, "written") == L3D_OK);
    CHECK(strstr(text, "not as measured") == NULL);
    /* the grid's measured shapes (--quick: 2 of each of its 6 rows), the model's two */
    CHECK(back.grid.n == 12 && back.grid.M[0] == 64 && back.grid.K[11] == 3072);
    CHECK_NEAR(back.grid.eff[1], 0.3 + 0.02 * 3, 1e-9); /* 64x3072x3072, the grid's 4th */
    CHECK(back.exact.n == 2 && back.exact.N[0] == 1152 && back.exact.N[1] == 256);
    CHECK(back.exact.eff[1] == 0.7 && back.exact.wgrad[1] == 0.5);
    CHECK(back.mixed[1].exact.n == 2 && back.mixed[1].exact.wgrad[1] == 0.4);
    CHECK(back.mixed[0].grid.n == 12 && strstr(text, "--model, model d6: its linear layers"));
    CHECK(strcmp(back.name, "local") == 0 && back.devices_per_node == 2 && back.pair_size == 1);
    CHECK_NEAR(back.peak_fp32, 80e9, 1e6);
    CHECK_NEAR(back.peak_bf16, 160e9, 1e6);
    CHECK(back.peak_fp16 == 0);
    CHECK_NEAR(back.mem_bytes, 8e9, 1e3);
    CHECK_NEAR(back.mem_bw, 10e9, 1e3);
    CHECK_NEAR(back.intra_bw, 5e9, 1e3);
    CHECK_NEAR(back.intra_lat, 2e-6, 1e-12);
    CHECK(back.inter_bw == 0 && back.inter_lat == 0);
    CHECK(back.n_eff == 6 && back.wgrad.n == 4);
    for (int i = 0; i < 6; i++) CHECK_NEAR(back.eff[i], 0.3 + 0.1 * i, 5e-4);
    CHECK_NEAR(back.wgrad.tokens[3], 512, 0);
    CHECK_NEAR(back.gemm_thread_eff, 0.9375, 5e-4);
    CHECK_NEAR(back.kern_eff[L3D_KERN_ADAMW], 2.0, 5e-4);
    CHECK_NEAR(back.dp_overlap, 0.09, 5e-4);
    CHECK(back.mixed[0].native && !back.mixed[1].native);
    CHECK_NEAR(back.mixed[1].gemm_thread_eff, 0.8, 5e-4);
    free(text);
}

/* Every key of each shipped profile written by the key table and read back: the same value, to
 * the written digits (flops to 3, other numbers to 4 significant digits or 3 decimals) */
static void test_shipped_keys(void) {
    const char *shipped[] = {"frontier", "dgx-a100", "dgx-h100", "h200"};
    for (size_t s = 0; s < 4; s++) {
        struct l3d_profile p, back;
        CHECK(l3d_profile_find(&p, shipped[s]) == L3D_OK);
        char *text = NULL;
        size_t len = 0;
        FILE *m = open_memstream(&text, &len);
        static const struct l3d_profile none; /* every key absent (0) */
        for (size_t k = 0; k < l3d_profile_n_keys; k++) {
            const struct l3d_profile_key *key = &l3d_profile_keys[k];
            char val[1024], note[1024], absent[1024], unused[1024];
            bool noted = l3d_profile_key_format(&p, key, NULL, val, sizeof val, note,
                                                sizeof note);
            l3d_profile_key_format(&none, key, NULL, absent, sizeof absent, unused,
                                   sizeof unused);
            /* an optional key the profile leaves out (or gives as 0) is left out */
            if (key->optional && strcmp(val, absent) == 0) continue;
            if (noted) fprintf(stderr, "%s: %s\n", shipped[s], note);
            CHECK(!noted);
            fprintf(m, "%s = %s\n", key->name, val);
        }
        fclose(m);
        l3d_status st = l3d_profile_parse(&back, text, shipped[s]);
        if (st != L3D_OK) fprintf(stderr, "%s\n", l3d_error_message());
        CHECK(st == L3D_OK);
        CHECK(strcmp(back.device, p.device) == 0);
        const enum l3d_dtype types[3] = {L3D_F32, L3D_BF16, L3D_F16};
        for (int i = 0; i < 3; i++)
            CHECK_NEAR(l3d_profile_peak(&back, types[i]), l3d_profile_peak(&p, types[i]),
                       1e-4 * l3d_profile_peak(&p, types[i]));
        CHECK_NEAR(back.inter_lat, p.inter_lat, 1e-4 * p.inter_lat);
        CHECK(back.n_eff == p.n_eff && back.compute_units == p.compute_units);
        CHECK(back.tile_m == p.tile_m && back.tile_n == p.tile_n);
        for (int i = 0; i < p.n_eff; i++) {
            CHECK_NEAR(back.eff_flops[i], p.eff_flops[i], 5e-3 * p.eff_flops[i]);
            CHECK_NEAR(back.eff[i], p.eff[i], 5e-4);
        }
        CHECK_NEAR(back.gemm_calibration, p.gemm_calibration, 5e-4);
        CHECK_NEAR(back.reserve_bytes, p.reserve_bytes, 1e-4 * p.reserve_bytes);
        CHECK_NEAR(back.dp_overlap, p.dp_overlap, 5e-4);
        free(text);
    }
}

/* Does the file give key `name`? */
static bool has_key(const char *text, const char *name) {
    char line[96];
    snprintf(line, sizeof line, "\n%s = ", name);
    return strstr(text, line) != NULL;
}

/* A curve key's fractions in p */
static double *curve_eff(struct l3d_profile *p, const struct l3d_profile_key *k, int *n) {
    char *base = (char *)p + k->off;
    if (k->kind == L3D_PK_WGRAD) {
        struct l3d_profile_wgrad *w = (struct l3d_profile_wgrad *)base;
        *n = w->n;
        return w->eff;
    }
    if (k->off == 0) return *n = p->n_eff, p->eff;
    struct l3d_profile_16 *m = (struct l3d_profile_16 *)base;
    *n = m->n_eff;
    return m->eff;
}

/* Is there a line "# not as measured: KEY: ..." that says `measured`? */
/* (not inlined: GCC 12 then takes `text` for a pointer to the caller's freed buffer) */
__attribute__((noinline)) static bool has_note(const char *text, const char *key,
                                               const char *measured) {
    char note[160];
    snprintf(note, sizeof note, "# not as measured: %s: ", key);
    const char *at = strstr(text, note);
    if (!at) return false;
    const char *eol = strchr(at, '\n'), *m = strstr(at, measured);
    return eol && m && m < eol;
}

enum spoil { SPOIL_NAN, SPOIL_NEGATIVE, SPOIL_ABOVE };
static const char *const spoil_name[3] = {"NaN", "negative", "above the bound"};

/* The figure a spoiled key's value becomes (file units): at the bound 10 times over, -1, NaN */
static double spoiled(enum spoil how, const struct l3d_profile_key *k) {
    return how == SPOIL_ABOVE ? 10 * k->hi : how == SPOIL_NEGATIVE ? -1.0 : NAN;
}

/* Every bounded figure of p's keys that `text` gives spoiled as `how` says; their number */
static int spoil(struct l3d_profile *p, const char *text, enum spoil how) {
    int n_keys = 0;
    for (size_t k = 0; k < l3d_profile_n_keys; k++) {
        const struct l3d_profile_key *key = &l3d_profile_keys[k];
        if (!has_key(text, key->name)) continue;
        double v = spoiled(how, key), *e;
        char *base = (char *)p + key->off;
        int n = 0;
        switch (key->kind) {
        case L3D_PK_NUM:
        case L3D_PK_FRAC: *(double *)base = v * key->scale; break;
        case L3D_PK_INT:
            *(int *)base = how == SPOIL_ABOVE ? (int)v : how == SPOIL_NEGATIVE ? -1 : 0;
            break;
        case L3D_PK_KERN:
            for (int i = 0; i < L3D_KERN_N; i++) ((double *)base)[i] = v;
            break;
        case L3D_PK_EFF:
        case L3D_PK_WGRAD:
            e = curve_eff(p, key, &n);
            for (int i = 0; i < n; i++) e[i] = v;
            break;
        default: continue; /* text, yes/no: no range */
        }
        n_keys++;
    }
    return n_keys;
}

/* v (SI units of key k) as written, in the file's units, is what a spoiled figure becomes: the
 * bound above it (gemm_thread_eff[_T]: L3D_CALIB_THREAD_EFF_MAX); 0.001 below or NaN where the
 * key must be positive (also 0 where it need not) */
static bool as_clamped(double v, const struct l3d_profile_key *k, enum spoil how) {
    double f = k->kind == L3D_PK_NUM || k->kind == L3D_PK_FRAC ? v / k->scale : v;
    /* gemm_thread_eff[_T]: calibrate's own bound, below the planner's */
    double hi = strncmp(k->name, "gemm_thread_eff", 15) == 0 ? L3D_CALIB_THREAD_EFF_MAX : k->hi;
    if (how == SPOIL_ABOVE) return fabs(f - hi) <= 1e-12 * hi;
    double floor = k->kind == L3D_PK_INT ? 1.0 : L3D_PROFILE_FLOOR;
    return fabs(f - floor) <= 1e-12 || (!k->positive && f == 0.0);
}

/* For each way to spoil them, every bounded key at once: the file parses, each key holds its
 * clamped value, and a comment above it names the key and what was measured */
static void test_out_of_range(void) {
    struct l3d_calib c;
    plausible(&c);
    struct l3d_profile good;
    l3d_calib_profile(&c, &good);
    char *plain = written(&c, &good);
    for (int how = 0; how < 3; how++) {
        struct l3d_profile p = good, back;
        int n_keys = spoil(&p, plain, (enum spoil)how);
        CHECK(n_keys >= 30); /* every key calibrate writes but name, device, gemm_native_T */
        char *text = written(&c, &p);
        l3d_status st = l3d_profile_parse(&back, text, spoil_name[how]);
        if (st != L3D_OK) fprintf(stderr, "%s: %s\n", spoil_name[how], l3d_error_message());
        CHECK(st == L3D_OK);
        for (size_t k = 0; k < l3d_profile_n_keys && st == L3D_OK; k++) {
            const struct l3d_profile_key *key = &l3d_profile_keys[k];
            if (!has_key(plain, key->name)) continue;
            const char *base = (const char *)&back + key->off;
            bool ok = true;
            int n = 0, n0 = 0;
            const double *e;
            switch (key->kind) {
            case L3D_PK_NUM:
            case L3D_PK_FRAC: ok = as_clamped(*(const double *)base, key, how); break;
            case L3D_PK_INT: ok = as_clamped(*(const int *)base, key, how); break;
            case L3D_PK_KERN:
                for (int i = 0; i < L3D_KERN_N; i++)
                    ok = ok && as_clamped(((const double *)base)[i], key, how);
                break;
            case L3D_PK_EFF:
            case L3D_PK_WGRAD:
                e = curve_eff(&back, key, &n);
                curve_eff(&good, key, &n0);
                ok = n == n0 && n > 0;
                for (int i = 0; i < n; i++) ok = ok && as_clamped(e[i], key, how);
                break;
            default: continue;
            }
            char measured[64];
            if (key->kind == L3D_PK_INT)
                snprintf(measured, sizeof measured, "measured %d", how == SPOIL_ABOVE ?
                         (int)spoiled(how, key) : how == SPOIL_NEGATIVE ? -1 : 0);
            else
                snprintf(measured, sizeof measured, "measured %g", spoiled(how, key));
            bool commented = has_note(text, key->name, measured);
            if (!ok || !commented)
                fprintf(stderr, "%s: %s: value %s, comment '%s' %s\n", spoil_name[how],
                        key->name, ok ? "clamped" : "NOT clamped", measured,
                        commented ? "found" : "NOT found");
            CHECK(ok && commented);
        }
        free(text);
    }
    free(plain);
}

/* The busy machine's figure (cli_cluster failed on it): gemm_thread_eff 1.822 from the
 * measurements is written as calibrate's bound 1.25, saying so; by hand, 1.822 is still refused */
static void test_busy_thread_eff(void) {
    struct l3d_calib c;
    plausible(&c);
    c.thread_eff = 1.822;
    struct l3d_profile p, back;
    l3d_calib_profile(&c, &p);
    char *text = written(&c, &p);
    CHECK(l3d_profile_parse(&back, text, "busy") == L3D_OK);
    CHECK_NEAR(back.gemm_thread_eff, 1.25, 0);
    CHECK(strstr(text, "# not as measured: gemm_thread_eff: measured 1.822 (above 1.25), written "
                       "as 1.250") != NULL);
    CHECK(strstr(text, "\ngemm_thread_eff = 1.250\n") != NULL);
    /* the negative case: written by hand, out of range is an error naming key, value and range */
    struct { const char *from, *to, *want; } hand[] = {
        {"\ngemm_thread_eff = 1.250\n", "\ngemm_thread_eff = 1.822\n",
         "gemm_thread_eff = 1.822 is out of range: allowed above 0 to 1.5"},
        {"\ngemm_thread_eff = 1.250\n", "\ngemm_thread_eff = nan\n",
         "gemm_thread_eff = 'nan' is not a positive number"},
        {"\ngemm_thread_eff = 1.250\n", "\ngemm_thread_eff = -1\n",
         "gemm_thread_eff = '-1' is not a positive number"},
        {"\ndp_overlap = ", "\ndp_overlap = 1.5 # ", "dp_overlap = '1.5': give yes, no or a"},
        {" adamw:2.000\n", " adamw:3\n",
         "kernel_bw_effs adamw:3 needs a fraction above 0 and at most 2.5"},
    };
    for (size_t i = 0; i < sizeof hand / sizeof hand[0]; i++) {
        const char *at = strstr(text, hand[i].from);
        CHECK(at != NULL);
        if (!at) continue;
        char *edit = malloc(strlen(text) + strlen(hand[i].to) + 1);
        sprintf(edit, "%.*s%s%s", (int)(at - text), text, hand[i].to, at + strlen(hand[i].from));
        CHECK(l3d_profile_parse(&back, edit, "by hand") == L3D_ERR_FORMAT);
        if (!strstr(l3d_error_message(), hand[i].want)) {
            fprintf(stderr, "by hand %zu: '%s' lacks '%s'\n", i, l3d_error_message(), hand[i].want);
            CHECK(0);
        }
        free(edit);
    }
    free(text);
    /* saved: the file loads */
    char dir[] = "/tmp/l3d-test-calibrate-XXXXXX", path[96];
    CHECK(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/local.prof", dir);
    CHECK(l3d_calib_save(path, &c) == L3D_OK);
    CHECK(l3d_profile_load(&back, path) == L3D_OK);
    CHECK_NEAR(back.gemm_thread_eff, 1.25, 0);
    unlink(path);
    rmdir(dir);
}

/* What the file's form would turn into something else: a positive figure its 3 decimals round to
 * 0, a '#' in the device's name (a comment to the parser), two curve points at the same written
 * flops (the parser needs them increasing) */
static void test_written_form(void) {
    struct l3d_calib c;
    plausible(&c);
    struct l3d_profile p, back;
    l3d_calib_profile(&c, &p);
    p.attn_eff = 0.0004;
    snprintf(p.device, sizeof p.device, "core #1\nof a CPU");
    p.eff_flops[2] = p.eff_flops[1] * 1.0001; /* both written 1e+07 */
    char *text = written(&c, &p);
    CHECK(l3d_profile_parse(&back, text, "form") == L3D_OK);
    CHECK_NEAR(back.attn_eff, L3D_PROFILE_FLOOR, 0);
    CHECK(strstr(text, "attn_eff: measured 0.0004 (0 at the file's precision), written as 0.001"));
    CHECK(strcmp(back.device, "core  1 of a CPU") == 0);
    CHECK(back.n_eff == p.n_eff - 1);
    CHECK_NEAR(back.eff[1], p.eff[1], 5e-4);
    CHECK_NEAR(back.eff[2], p.eff[3], 5e-4);
    CHECK(strstr(text, "gemm_eff: point 3 (flops 1.0001e+07) left out"));
    free(text);
}

int main(void) {
    test_round_trip();
    test_shipped_keys();
    test_out_of_range();
    test_busy_thread_eff();
    test_written_form();
    return TEST_REPORT();
}
