/*
 * llm3d pipeline parallelism: stage partition and schedules as data.
 *
 *   int layers[8];                       // layers of each virtual stage
 *   l3d_pp_partition(&cfg, T, pp * v, layers);        // balanced by estimated cost
 *   struct l3d_pp_schedule s;
 *   l3d_pp_schedule_build(&s, L3D_PP_1F1B, pp, 1, m); // m micro-batches
 *   for (int i = 0; i < s.n[stage]; i++) { const struct l3d_pp_action *a = &s.acts[stage][i]; ... }
 *   struct l3d_pp_sim sim;
 *   l3d_pp_simulate(&s, 1.0, 2.0, &sim);  // deadlock? idle fraction? (no MPI)
 *   l3d_pp_schedule_free(&s);
 *
 * A schedule is, for each pipeline rank (stage), the ordered list of what it does in one training
 * step: forward or backward of micro-batch i on model chunk c, and the sends and receives around
 * them. With v virtual stages per rank (interleaved schedule, Narayanan et al. 2021, sec. 2.2),
 * rank r holds chunks c = 0..v-1, chunk c being virtual stage c * pp + r of the pp * v stages; the
 * first virtual stage holds the embedding, the last the head and loss.
 *
 *   GPipe (Huang et al. 2019): all forwards, then all backwards; m micro-batches in flight.
 *   1F1B (PipeDream-Flush, Narayanan et al. 2021): stage r runs pp - r - 1 warm-up forwards, then
 *     alternates one forward and one backward, then the remaining backwards; at most pp - r
 *     micro-batches in flight.
 *   Interleaved 1F1B: forwards walk chunks in groups of pp micro-batches; warm-up
 *     2 (pp - r - 1) + (v - 1) pp forwards (as in Megatron-LM); needs m divisible by pp.
 *   ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, sec. 3): each backward split
 *     into B (the input gradient, which the previous stage waits for) and W (the weight
 *     gradient, which can wait). Stage r keeps 1F1B's order of F and B (its pp - r - 1 warm-up
 *     forwards); a W runs when the stage would otherwise wait (the next F or B not ready) or when
 *     the next F would hold more than pp micro-batches between F and W: 1F1B's peak, its first
 *     stage's, which every stage may now reach (the later stages defer their W, so that the B
 *     the earlier ones wait for comes sooner). The order is fixed by a timeline with equal F, B
 *     and W times: the paper's bubble, (pp - 1) (F + B - W) per stage instead of 1F1B's
 *     (pp - 1) (F + B + W), i.e. (pp - 1) / (3 m + pp - 1) of the timeline for m >= pp.
 *
 * Receives come right before the computation that needs them and sends right after the one that
 * produced them; sends never block (the executor posts them non-blocking), so a schedule runs if
 * every receive is matched by an earlier send — l3d_pp_simulate checks exactly that. With forward
 * time f and backward time b per chunk, the idle fraction of the timeline is the textbook bubble
 * (pp - 1) / (v m + pp - 1): (pp - 1) / (m + pp - 1) without interleaving.
 */
#ifndef LLM3D_PIPELINE_H
#define LLM3D_PIPELINE_H

#include <stdbool.h>
#include <stdint.h>

#include "llm3d/comm.h"
#include "llm3d/core.h"
#include "llm3d/model.h"
#include "llm3d/spec.h" /* enum l3d_pp_kind */

enum l3d_pp_op {
    L3D_PP_FWD,       /* forward of (micro, chunk) */
    L3D_PP_BWD,       /* backward of (micro, chunk) */
    L3D_PP_RECV_ACT,  /* the chunk's input activation, from the previous virtual stage */
    L3D_PP_SEND_ACT,  /* its output activation, to the next virtual stage */
    L3D_PP_RECV_GRAD, /* the gradient of its output, from the next virtual stage */
    L3D_PP_SEND_GRAD, /* the gradient of its input, to the previous virtual stage */
    L3D_PP_BWD_B,     /* the input-gradient half of a backward (zb-h1) */
    L3D_PP_BWD_W,     /* the weight-gradient half, after its B (zb-h1) */
};

struct l3d_pp_action {
    uint8_t op;
    int16_t chunk;
    int32_t micro;
    int32_t peer; /* pipeline rank sent to or received from (-1 for compute) */
};

struct l3d_pp_schedule {
    enum l3d_pp_kind kind;
    int pp, v, m;
    int *n;                      /* n[stage]: actions of the stage */
    struct l3d_pp_action **acts; /* acts[stage][0 .. n[stage]) */
    int *slots;                  /* slots[stage * v + chunk]: most micro-batches of the chunk
                                  * between forward and backward (its W when split) at once */
    int *wslots;                 /* the same between B and W (zb-h1: the stash of W's inputs;
                                  * 0 without a split backward) */
};

/* The most micro-batches of chunk `chunk` on stage r between a forward and its backward (its B
 * when split) in a built schedule: 1 when each backward comes before the next forward (the last
 * stage under 1F1B and zb-h1, whose head then keeps one micro-batch's activations: slots counts
 * them to W). */
int l3d_pp_fb_slots(const struct l3d_pp_schedule *s, int r, int chunk);
/* Whether the schedule splits each backward into B and W (zb-h1, zbv). */
bool l3d_pp_split(enum l3d_pp_kind kind);
/* The virtual stage of chunk `chunk` on pipeline rank r: chunk pp + r (interleaved: the chunks
 * loop over the ranks), but zbv's V: chunk 0 is stage r, chunk 1 stage 2 pp - 1 - r (rank 0 holds
 * the first and the last). l3d_pp_vstage_owner: the rank and chunk of virtual stage vs. */
int l3d_pp_vstage(enum l3d_pp_kind kind, int pp, int r, int chunk);
void l3d_pp_vstage_owner(enum l3d_pp_kind kind, int pp, int vs, int *r, int *chunk);
const char *l3d_pp_kind_name(enum l3d_pp_kind kind);
/* "gpipe", "1f1b", "interleaved" or "zb-h1"; L3D_ERR_ARG naming --pp-schedule otherwise. */
l3d_status l3d_pp_kind_parse(const char *name, enum l3d_pp_kind *kind);
/* Checks (pp >= 1, m >= 1, v >= 1; v > 1 only interleaved, which needs pp >= 2 and m divisible by
 * pp) with messages naming the flags, then builds. */
l3d_status l3d_pp_schedule_build(struct l3d_pp_schedule *s, enum l3d_pp_kind kind, int pp, int v,
                                 int m);
/* The checks of l3d_pp_schedule_build alone, so a caller gives its verdict before it builds. */
l3d_status l3d_pp_schedule_check(enum l3d_pp_kind kind, int pp, int v, int m);
/* Forward only (validation): each stage forwards micro-batches in order, chunk by chunk. */
l3d_status l3d_pp_schedule_build_forward(struct l3d_pp_schedule *s, enum l3d_pp_kind kind, int pp,
                                         int v, int m);
void l3d_pp_schedule_free(struct l3d_pp_schedule *s);
/* The host bytes a schedule of every stage takes (what the builds allocate: room for 7 actions a
 * (micro, chunk) pair, 3 forward only, on each of the pp stages), before building it: the memory
 * check counts them. The builds return L3D_ERR_OOM when they cannot have them. */
size_t l3d_pp_schedule_bytes(int pp, int v, int64_t m, bool fwd_only);
/* The actions of stage r in a built schedule of `kind` (n[r]), in closed form. */
int64_t l3d_pp_schedule_actions(enum l3d_pp_kind kind, int pp, int v, int64_t m, int r,
                                bool fwd_only);
/* Warm-up forwards of stage r (forwards of chunks before its steady state; GPipe: all of them):
 * GPipe m v, 1F1B and zb-h1 pp - r - 1, interleaved 2 (pp - r - 1) + (v - 1) pp (Megatron-LM), at most the
 * m v forwards of the step. The stage's first backward follows one more forward when any is
 * left: min(warm-up + 1, m v) forwards before it. */
int64_t l3d_pp_warmup(enum l3d_pp_kind kind, int pp, int r, int v, int64_t m);
/* Micro-batches of chunks in flight on stage r at most (all its chunks together): the forwards
 * before its first backward, min(l3d_pp_warmup + 1, m v): GPipe m, 1F1B min(pp - r, m)
 * (Narayanan et al. 2021, sec. 2.2.1); 1 with pp = 1 (no pipeline: each micro-batch's backward
 * follows its forward). zb-h1: those whose activations are held, forward to W, min(pp, m) on
 * every stage (the bound its build keeps). */
int64_t l3d_pp_in_flight(enum l3d_pp_kind kind, int pp, int r, int v, int64_t m);
/* Idle fraction of an ideal timeline (equal stages, free communication): (pp-1) / (v m + pp-1). */
double l3d_pp_bubble(int pp, int v, int m);
/* The same for any schedule: the idle fraction of its simulated timeline with a forward f, a
 * backward 2f, split as B f and W f (the paper's unit model); for 1F1B, GPipe and interleaved
 * l3d_pp_bubble's value. -1 when it cannot be built (out of memory, bad sizes). */
double l3d_pp_schedule_bubble(enum l3d_pp_kind kind, int pp, int v, int m);

/* A dataflow simulation of the schedule: each stage runs its list in order; a send takes no time
 * and never blocks; a receive waits for its matching send; forward and backward of a chunk take
 * t_fwd and t_bwd. */
struct l3d_pp_sim {
    bool deadlock;        /* some stage waits for a message that is never sent */
    bool order_ok;        /* each (micro, chunk) forwarded once, then backwarded once (or B,
                           * then W), per stage */
    bool fifo_ok;         /* per chunk, micro-batches leave in the order they entered (so slot =
                           * micro % slots never overwrites one in flight) */
    bool matched;         /* every send received, nothing left over */
    double makespan;      /* time of the last action */
    double idle_fraction; /* mean over stages of 1 - busy / makespan */
    int max_in_flight[64]; /* per stage (all chunks), first 64 stages: forward to B */
    int max_held[64];      /* the same to W (to the backward unless split): activations kept */
    int max_wait[64];      /* B to W: the stash of W's inputs */
};
l3d_status l3d_pp_simulate(const struct l3d_pp_schedule *s, double t_fwd, double t_bwd,
                           struct l3d_pp_sim *out);
/* The same with a split backward's times: B t_b, W t_w, a fused backward t_b + t_w. */
l3d_status l3d_pp_simulate_bw(const struct l3d_pp_schedule *s, double t_fwd, double t_b,
                              double t_w, struct l3d_pp_sim *out);

/* Estimated forward cost of one token through a layer, the embedding and the head + loss, in
 * FLOPs (matrix products 2 per multiply-add, attention as in PaLM's 12 L C T over 3 passes). */
double l3d_pp_layer_cost(const struct l3d_model_spec *cfg, int T);
double l3d_pp_head_cost(const struct l3d_model_spec *cfg);
/* Splits the L layers into `stages` contiguous runs of at least one layer, minimising the largest
 * stage cost (layers, plus the embedding on the first and the head + loss on the last stage).
 * L3D_ERR_LAYOUT when stages > L. */
l3d_status l3d_pp_partition(const struct l3d_model_spec *cfg, int T, int stages, int *layers);
/* Parses "a,b,c" (--pp-layers) into `stages` counts summing to L. */
l3d_status l3d_pp_parse_layers(const char *text, const struct l3d_model_spec *cfg, int stages,
                               int *layers);

/* ---- executor ---------------------------------------------------------------------------
 *
 *   struct l3d_pp_exec x;
 *   l3d_status st = l3d_pp_exec_init(&x, chunks, v, dps, topo.pp_comm, topo.embed_comm,
 *                                    trace_events);     // L3D_ERR_OOM: no device memory
 *   double loss = l3d_pp_exec_run(&x, sched.acts[pp_rank], sched.n[pp_rank], m, inputs,
 *                                 targets, B, T, dloss);      // forwards, backwards, p2p
 *   l3d_pp_exec_finish_grads(&x);   // tied wte summed between first and last stage, DP waited
 *
 * Activations go forward and gradients backward as non-blocking sends from the chunk's activation
 * slot (micro % slots) and blocking receives into it; a slot's sends are waited for before the
 * slot is reused. Micro-batch i of a step reads inputs/targets + i B T. */
struct l3d_dp;

enum l3d_pp_event_kind { L3D_EV_FWD, L3D_EV_BWD, L3D_EV_RECV_ACT, L3D_EV_RECV_GRAD,
                         L3D_EV_EMBED_SYNC, L3D_EV_DP_WAIT, L3D_EV_OPTIMIZER, L3D_EV_STEP,
                         L3D_EV_WGRAD /* W of a split backward (its B is an L3D_EV_BWD) */,
                         L3D_EV_KFAM /* a kernel family's time in a step (chunk: l3d_kfam) */ };

struct l3d_pp_event {
    double t0, t1;   /* seconds since the trace's origin */
    uint8_t kind;
    int16_t chunk;
    int32_t micro;   /* micro-batch, or step for optimizer and step events */
};

struct l3d_pp_exec {
    struct l3d_gpt **chunks; /* v models: chunk c is virtual stage l3d_pp_vstage(kind, ...) */
    enum l3d_pp_kind kind;   /* the schedule's (the placement of the chunks; set after init) */
    struct l3d_dp *dp;       /* v data-parallel states, or NULL */
    int v, max_slots;
    struct l3d_comm *pp_comm, *embed_comm;
    struct l3d_backend *be;  /* the chunks' backend: grad_buf's owner */
    enum l3d_dtype act_dtype;  /* activations and their gradients between stages (the model's) */
    enum l3d_dtype grad_dtype; /* parameter gradients (the tied wte's sum) */
    void *grad_buf;          /* received output gradient (act_dtype; device memory of the chunks' backend) */
    l3d_req *act_req, *grad_req; /* [chunk * max_slots + slot] */
    double busy_s, span_s, recv_s; /* last run: compute time, first to last action, receive waits */
    struct l3d_pp_event *ev; /* trace events (NULL: not tracing) */
    int64_t nev, cap_ev;
    double origin;
};

/* L3D_ERR_OOM when the device has no room for the received gradient (one micro-batch's (B T, C)
 * rows); x is then zeroed. */
l3d_status l3d_pp_exec_init(struct l3d_pp_exec *x, struct l3d_gpt **chunks, int v,
                            struct l3d_dp *dp, struct l3d_comm *pp_comm,
                            struct l3d_comm *embed_comm, int64_t trace_events);
/* Also fine on a zeroed struct. */
void l3d_pp_exec_free(struct l3d_pp_exec *x);
/* Runs one stage's actions over m micro-batches; returns the sum of the micro-batch losses on the
 * stage that holds the head (0 elsewhere). dloss: each token's weight (ignored without backward). */
double l3d_pp_exec_run(struct l3d_pp_exec *x, const struct l3d_pp_action *acts, int n, int m,
                       const int32_t *inputs, const int32_t *targets, int B, int T, float dloss);
/* After the last backward: sums the tied wte's gradient over the embedding group, then lets the
 * data-parallel reductions finish. */
void l3d_pp_exec_finish_grads(struct l3d_pp_exec *x);
/* Records an event (when tracing and there is room). */
void l3d_pp_trace_add(struct l3d_pp_exec *x, int kind, int chunk, int micro, double t0, double t1);

#endif
