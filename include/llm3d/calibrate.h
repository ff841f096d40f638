/*
 * llm3d calibration: measures this machine (a device is one CPU core) and writes its system
 * profile for the planner (format: profiles/README.md, `name = local`). `llm3d bench --calibrate`
 * (src/cli/calibrate.c) is its command line; the measurements live here, in src/plan/.
 *
 *   struct l3d_calib c = {.quick = false, .thread = false};
 *   l3d_calib_check_out("local.prof");                    // rank 0, before measuring anything
 *   l3d_calib_measure(world, &c, report, NULL);            // every rank (collective), 2+ ranks
 *   if (world->rank == 0) l3d_calib_save("local.prof", &c); // FILE.tmp, fsync, rename
 *
 * Every file it writes parses. A busy machine slows one side of a ratio: a figure outside the
 * range it can have is measured again (gemm_thread_eff: the one-core rates, up to 5 rounds, the
 * median of each; the element-wise kernels and the triad, up to 3 rounds, the best pass of each),
 * and one still outside is written as the bound (the planner's, or calibrate's own where tighter:
 * gemm_thread_eff 1.25) with a comment saying what was measured (l3d_calib_write).
 *
 * The order of l3d_calib_measure (src/plan/calibrate.c says why):
 *   1. rank 0 on all cores, the others asleep: STREAM triad, the backend's element-wise kernels,
 *      one product on all cores (for gemm_thread_eff);
 *   2. every rank on its own core at once: the FMA peak, the linear layer's grid of shapes (and
 *      --model's), attention, the same products on one core; rank 0's figures are written;
 *   3. the all-reduces (one node: among all ranks; several: inside each node and between them).
 */
#ifndef LLM3D_CALIBRATE_H
#define LLM3D_CALIBRATE_H

#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "llm3d/comm.h"
#include "llm3d/core.h"
#include "llm3d/plan.h"

#define L3D_CALIB_MAX_POINTS 16
#define L3D_CALIB_MAX_ROUNDS 5 /* of the one-core rates, while gemm_thread_eff is out of range */
/* GPT-2 124M's products at 512 and 2048 rows, M x N x K: one product on every thread of a rank
 * against the same on one core (gemm_thread_eff) */
#define L3D_CALIB_THREAD_SHAPES 4
extern const int64_t l3d_calib_thread_shapes[L3D_CALIB_THREAD_SHAPES][3];
/* The grid of linear-layer shapes M x N x K (gemm_eff_grid): rows of one smallest side, M, from
 * 64 to 2048 tokens, N = K from the side to 3072 (the first and last of each row under --quick);
 * gemm_eff is its measurements bucketed by FLOPs */
#define L3D_CALIB_GRID 18
extern const int64_t l3d_calib_grid[L3D_CALIB_GRID][3];
/* The element-wise kernels in the order of enum l3d_kern, by the backend's names (fp32; the
 * 16-bit AdamW is adamw_mixed) */
extern const char *const l3d_calib_kern_names[L3D_KERN_N];
extern const char *const l3d_calib_kern_names16[L3D_KERN_N];

struct l3d_calib {
    /* set by the caller */
    bool quick;                      /* shorter measurements, the same figures, noisier */
    bool thread; /* the world has the progress thread (launched across nodes): the pieces
                  * progress by it, else by tests between the products (the trainer's defaults) */
    /* --model: that model's linear layers (l3d_plan_linear_shapes), measured as they are into
     * gemm_exact[_T]; n_exact 0: none. model: what they are of, for the file's comment */
    int n_exact;
    int64_t exact_shape[L3D_PROFILE_MAX_EXACT][3];
    char model[200];
    /* the measurements (rank 0's are written) */
    int cores;                       /* devices: cores this process may run on */
    double fma;                      /* fp32 FMA peak of one thread, FLOP/s */
    double fma_loop;                 /* the FMA loop's own rate when a product beat it, else 0 */
    double thr_all[4], thr_one[4];   /* linear-layer FLOP/s of the thread shapes: all cores, one */
    double thread_eff;               /* all cores' rate / (cores x one core's), median */
    int thread_rounds;               /* rounds of the one-core rates (thr_one: their medians) */
    double thr_one_r[L3D_CALIB_MAX_ROUNDS][4], thr_one16_r[2][L3D_CALIB_MAX_ROUNDS][4];
    double bw_one, bw_all;           /* triad, bytes/s: one thread; all cores together */
    size_t triad_bytes;
    int n_eff;                       /* gemm curve: flops, fraction of fma (from the grid) */
    double eff_flops[L3D_CALIB_MAX_POINTS], eff[L3D_CALIB_MAX_POINTS];
    int eff_shapes;                  /* shapes of the grid measured (l3d_calib_grid) */
    double grid_eff[L3D_CALIB_GRID], grid16_eff[2][L3D_CALIB_GRID]; /* fraction, by shape */
    /* the model's shapes: forward + input gradient, weight gradient (fractions) */
    double exact_eff[L3D_PROFILE_MAX_EXACT], exact_wg[L3D_PROFILE_MAX_EXACT];
    double exact16_eff[2][L3D_PROFILE_MAX_EXACT], exact16_wg[2][L3D_PROFILE_MAX_EXACT];
    int n_wg;                        /* weight-gradient product: tokens, fraction of fma */
    double wg_tok[L3D_CALIB_MAX_POINTS], wg_eff[L3D_CALIB_MAX_POINTS];
    double k_bw[L3D_KERN_N];         /* element-wise kernels, bytes/s on all cores */
    int64_t k_n;                     /* elements per kernel array */
    int memory_rounds;               /* rounds of the triad and kernels (each figure: the best) */
    double kernel_bw_eff;
    double attn_fwd_s, attn_bwd_s, attn_eff;
    double mem_bytes;
    int ranks;
    int nodes, per_node;             /* the launch: nodes (l3d_comm_nodes), ranks on each */
    double intra_bw, intra_lat;      /* bytes/s, seconds; 0: not measured (one rank a node) */
    double inter_bw, inter_lat;      /* between nodes (several nodes); 0: one node */
    double secs[3];                  /* time taken: compute, comm, total */
    double share[3];                 /* CPU time got / asked for: all cores, one, all-reduce */
    double others[3];                /* other processes' share of the cores then; -1: unknown */
    cpu_set_t cpus;                  /* the cores rank 0 may use */
    /* llm3d's 16-bit kernels, [0] bf16 and [1] fp16, measured as their fp32 counterparts */
    int n_eff16[2];
    double eff16_flops[2][L3D_CALIB_MAX_POINTS], eff16[2][L3D_CALIB_MAX_POINTS];
    int n_wg16[2];
    double wg16_tok[2][L3D_CALIB_MAX_POINTS], wg16_eff[2][L3D_CALIB_MAX_POINTS];
    double attn16_s[2][2], attn_eff16[2];            /* forward, backward; fraction */
    double thr_all16[2][4], thr_one16[2][4], thread_eff16[2];
    double k_bw16[2][L3D_KERN_N], kernel_bw_eff16[2];
    /* the type's products run in its own kernels (l3d_be_matmul_native: oneDNN's bf16 matmul on
     * an AVX512-BF16 CPU), and then their peak (the backend's, one core, every core busy), of
     * which the type's fractions are; else 0 and fractions of the fp32 FMA peak */
    bool native16[2];
    bool attn_native16[2]; /* l3d_be_attention_native of bf16 and fp16 */
    int64_t wgrad_block16[2]; /* l3d_be_matmul_wgrad_block of bf16 and fp16 (bytes) */
    double peak16[2];
    /* the links' all-reduce stream: its bytes and rounds; on the DP link, the fraction hidden
     * behind the products, its round's times (s) and the products' count */
    int64_t stream_bytes;
    int stream_rounds;
    double ov_frac, ov_x, ov_c, ov_t;
    int ov_kernels;
};

/* Where l3d_calib_measure stands when it calls its report (on rank 0 only), for the command
 * line's progress lines */
enum l3d_calib_phase {
    L3D_CALIB_START,    /* c->cores known; nothing measured yet */
    L3D_CALIB_MEMORY,   /* triad and element-wise kernels on all cores */
    L3D_CALIB_COMPUTE,  /* the one-core figures (phase 2) */
    L3D_CALIB_LINKS,    /* the all-reduces (phase 3): everything measured */
};
typedef void (*l3d_calib_report_fn)(enum l3d_calib_phase phase, const struct l3d_calib *c,
                                    void *arg);

/* A linear layer's products at M x K input, N x K weight in dt through be (a host-memory backend:
 * cpu or check) with the current thread count, as the calibration's ladder times them: the
 * faster of the forward and input-gradient pair and the weight gradient, in FLOP/s (the median
 * pass of those in about secs, at least 3). The rates a 16-bit peak is raised to
 * (l3d_calib_fractions: peak_tflops_bf16 is at least the fastest product measured). */
double l3d_calib_product_rate(struct l3d_backend *be, enum l3d_dtype dt, int64_t M, int64_t N,
                              int64_t K, double secs);

/* Can `path` be written? Creates and removes path.tmp, as l3d_calib_save will; L3D_ERR_ARG for
 * a directory, L3D_ERR_IO when it cannot be written, each naming --out. */
l3d_status l3d_calib_check_out(const char *path);
/* Measures (collective over world, 2 or more ranks; see the top of this file). The launch's
 * nodes must have as many ranks each: else L3D_ERR_ARG on every rank, before any measurement.
 * report (may be NULL) is called on rank 0 after each phase. */
l3d_status l3d_calib_measure(struct l3d_comm *world, struct l3d_calib *c,
                             l3d_calib_report_fn report, void *arg);
/* Did other processes take more than a tenth of the cores' time during a phase (the figures
 * are low)? */
bool l3d_calib_busy(const struct l3d_calib *c);
/* "other processes took X% on all cores, ..." (no newline) */
void l3d_calib_print_others(FILE *f, const struct l3d_calib *c);

/* The profile the measurements give (SI units, as l3d_profile_parse fills it), each figure as
 * measured (l3d_calib_write brings those outside the planner's range into it). */
void l3d_calib_profile(const struct l3d_calib *c, struct l3d_profile *p);
/* Writes profile p (from l3d_calib_profile) with the comments of measurements c, every key
 * through the profile's key table (src/plan/profile_keys.c), in the form the parser reads it. A
 * figure the parser would refuse (NaN, negative, 0 where the key must be positive or a rate or
 * time was measured, above its bound; gemm_thread_eff[_T] above L3D_CALIB_THREAD_EFF_MAX, 1.25)
 * is written as the nearest value in range (the bound; 0.001 for a positive figure at or below
 * 0), with a line "# not as measured: KEY: measured V (why), written as W ..." above its
 * comment. */
void l3d_calib_write(FILE *f, const struct l3d_calib *c, const struct l3d_profile *p);
/* l3d_calib_profile and l3d_calib_write to path.tmp, fsync, rename to path; the text is parsed
 * back first and not written if it would not parse (L3D_ERR_INTERNAL, naming the key). */
l3d_status l3d_calib_save(const char *path, const struct l3d_calib *c);

#endif
