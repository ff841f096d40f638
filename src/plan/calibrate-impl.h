/* Calibration's parts, shared between src/plan/calibrate*.c (the public side:
 * include/llm3d/calibrate.h). */
#ifndef LLM3D_CALIBRATE_IMPL_H
#define LLM3D_CALIBRATE_IMPL_H

#include "llm3d/backend.h"
#include "llm3d/calibrate.h"

extern const enum l3d_dtype l3d_calib_types16[2]; /* bf16, fp16 */
extern const char *const l3d_calib_names16[2];    /* "bf16", "fp16" */

/* What every part uses (src/plan/calibrate_base.c, which calls no other part) */
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
/* Phase 2, every rank on its own core at once: the rates; then, while rank 0's gemm_thread_eff
 * or a 16-bit one is out of range (l3d_calib_thread_in_range), every rank another round of the
 * one-core rates (l3d_calib_thread_again), so that each core is measured with its neighbours
 * busy as before; then l3d_calib_fractions: the rates as fractions of the peaks */
void l3d_calib_one_core(struct l3d_calib *c);
bool l3d_calib_thread_in_range(const struct l3d_calib *c);
void l3d_calib_thread_again(struct l3d_calib *c);
void l3d_calib_fractions(struct l3d_calib *c);

/* Whether grid shape i (l3d_calib_grid) is measured: all of them, or under --quick each row's
 * first and last */
bool l3d_calib_grid_measured(const struct l3d_calib *c, int i);

/* gemm_thread_eff above this is measured again, and written as this if still above (the file
 * says what was measured): one product on k threads beats k single cores only by what k cores'
 * caches hold together; the 4 shapes' 2-thread ratios spread 0.76-1.28 on the idle 2-core
 * machine (docs/BENCHMARKS.md), their median lower. 1.82 was measured on that machine while other
 * processes took most of the cores (the one-core rates halved). */
#define L3D_CALIB_THREAD_EFF_MAX 1.25
/* kernel_bw_eff's largest (the profile's key table): a kernel's fraction of the triad above it
 * is measured again */
double l3d_calib_kernel_eff_max(void);
/* Phase 3, the links, every rank; results on rank 0 (src/plan/calibrate_comm.c) */
void l3d_calib_links(struct l3d_comm *w, struct l3d_calib *c, const int *node_of);

#endif
