/*
 * The calibration's profile writer without measuring anything: measurements of a plausible
 * machine are written (l3d_calib_write, through the profile's key table) and read back by the
 * planner's parser to the same figures; every key of the shipped profiles is written by the key
 * table and read back to the same value (to the written digits).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "llm3d/calibrate.h"
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
    CHECK(strcmp(back.name, "local") == 0 && back.devices_per_node == 2 && back.pair_size == 1);
    CHECK_NEAR(back.peak_flops[L3D_PREC_FP32], 80e9, 1e6);
    CHECK_NEAR(back.peak_flops[L3D_PREC_BF16], 160e9, 1e6);
    CHECK(back.peak_flops[L3D_PREC_FP16] == 0);
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
            bool noted = l3d_profile_key_format(&p, key, false, val, sizeof val, note,
                                                sizeof note);
            l3d_profile_key_format(&none, key, false, absent, sizeof absent, unused,
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
        for (int i = 0; i < 3; i++)
            CHECK_NEAR(back.peak_flops[i], p.peak_flops[i], 1e-4 * p.peak_flops[i]);
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

int main(void) {
    test_round_trip();
    test_shipped_keys();
    return TEST_REPORT();
}
