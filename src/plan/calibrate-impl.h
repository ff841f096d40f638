/* Calibration's parts, shared between src/plan/calibrate*.c (the public side:
 * include/llm3d/calibrate.h). */
#ifndef LLM3D_CALIBRATE_IMPL_H
#define LLM3D_CALIBRATE_IMPL_H

#include "llm3d/backend.h"
#include "llm3d/calibrate.h"

extern const enum l3d_dtype l3d_calib_types16[2]; /* bf16, fp16 */
extern const char *const l3d_calib_names16[2];    /* "bf16", "fp16" */

/* The median of v[0..n) (sorts v) */
double l3d_calib_median(double *v, int n);
/* CPU time of this process, all its threads, in seconds */
double l3d_calib_cpu_s(void);
/* n floats uniform in [lo, hi) from counter-based stream `stream` (l3d_alloc'd) */
float *l3d_calib_filled(int64_t n, float lo, float hi, uint64_t stream);

/* A phase's start, to tell how much of the cores' time processes other than the calibration's
 * ranks took meanwhile (rank 0 reads /proc/stat; `own` is the ranks' CPU time, summed) */
struct l3d_calib_phase_mark {
    double wall, busy, cpu;
};
struct l3d_calib_phase_mark l3d_calib_phase_start(const struct l3d_calib *c);
double l3d_calib_phase_others(const struct l3d_calib *c, const struct l3d_calib_phase_mark *p,
                              double own);

/* Phase 1, rank 0 on every core while the others sleep (src/plan/calibrate_compute.c) */
void l3d_calib_all_cores(struct l3d_calib *c, l3d_calib_report_fn report, void *arg);
/* Phase 2, every rank on its own core at once */
void l3d_calib_one_core(struct l3d_calib *c);
/* Phase 3, the links, every rank; results on rank 0 (src/plan/calibrate_comm.c) */
void l3d_calib_links(struct l3d_comm *w, struct l3d_calib *c, const int *node_of);

#endif
