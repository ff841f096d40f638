/*
 * The training loop's checkpoint calls (private to src/train): where checkpoints go, resuming,
 * periodic and preemption saves, each one call from the loop (include/llm3d/ckpt.h holds the
 * format).
 *
 *   struct l3d_train_ckpt ck;
 *   l3d_train_ckpt_init(&ck, tc, &topo, world);          // installs the SIGTERM/SIGUSR1 handlers
 *   // after the optimizers' init; the rank's v model chunks and their optimizers:
 *   l3d_train_ckpt_resume(&ck, tc, world, chunks, opts, v, ld, &start, &report);
 *   for (step = start; ...) {
 *       ... one optimizer step ...
 *       int sig = l3d_train_stop_requested(world);      // collective
 *       if (sig || l3d_train_ckpt_due(&ck, tc, step + 1)) l3d_train_ckpt_save(..., step + 1, ...);
 *       if (sig) break;
 *   }
 *   l3d_train_ckpt_free(&ck);
 */
#ifndef LLM3D_TRAIN_RESUME_H
#define LLM3D_TRAIN_RESUME_H

#include <stdio.h>

#include "llm3d/ckpt.h"
#include "llm3d/topo.h"
#include "llm3d/train.h"

struct l3d_train_ckpt {
    char root[4096];           /* where step directories go; "" when there is nowhere */
    struct l3d_ckpt_layout lay;
    int64_t last_saved;        /* step of this run's last checkpoint, -1 before the first */
    bool quiet, lead;
    uint64_t run_id;           /* written in each manifest; pruning removes only its own */
    /* fp16 loss scaling: the trainer's state, saved with each checkpoint and set by a resume
     * from one that has it (scale 0: none) */
    double ls_scale;
    int64_t ls_good, ls_hyst;
    struct l3d_ckpt_async *async; /* --async-save (NULL: every save synchronous) */
    int64_t begun;                /* the step of the background save running, if one is */
    double waited;                /* seconds its begin waited for the save before it */
};

void l3d_train_ckpt_init(struct l3d_train_ckpt *c, const struct l3d_train_config *tc,
                         const struct l3d_topo *topo, struct l3d_comm *world);
void l3d_train_ckpt_free(struct l3d_train_ckpt *c);
/* --async-save: the staging of the rank's chunks m[i] (fp32 views) and optimizers opt[i]
 * (l3d_ckpt_async_bytes), allocated once; none when the chunks move their parameters a piece at a
 * time (streamed: ZeRO-3, mixed-precision ZeRO-2), whose saves stay synchronous (said once). */
l3d_status l3d_train_ckpt_async_init(struct l3d_train_ckpt *c, const struct l3d_train_config *tc,
                                     struct l3d_gpt *const *m, const struct l3d_adamw *opt,
                                     bool streamed);
/* Closes a background save once every rank's writer is done (wait: now), printing its line.
 * Collective while one runs; every rank the same status. */
l3d_status l3d_train_ckpt_poll(struct l3d_train_ckpt *c, struct l3d_comm *world, bool wait,
                               bool *report);
/* tc->resume: loads the checkpoint into the rank's n model chunks m[i] and their optimizers
 * opt[i] (pieces: NULL, or the n chunks' l3d_ckpt_pieces, include/llm3d/ckpt.h; any layout;
 * n = the layout's chunks per rank, --pp-virtual), moves the loader to its
 * position and sets *start_step (0 for a fresh start). Collective; prints what it did on the lead
 * rank. */
l3d_status l3d_train_ckpt_resume(struct l3d_train_ckpt *c, const struct l3d_train_config *tc,
                                 struct l3d_comm *world, struct l3d_gpt *const *m,
                                 struct l3d_adamw *opt, const struct l3d_ckpt_pieces *pieces,
                                 int n, struct l3d_loader *ld, int *start_step, bool *report);
/* Lead rank: out_dir/metrics.jsonl (its path into path), new with the run's record first, or
 * for a resumed run its lines up to start_step kept. */
l3d_status l3d_train_ckpt_open_metrics(const struct l3d_train_config *tc, int start_step,
                                       uint64_t run_id, FILE **out, char *path, size_t cap);
/* Whether the periodic schedule saves after `step` steps. */
bool l3d_train_ckpt_due(const struct l3d_train_ckpt *c, const struct l3d_train_config *tc,
                        int step);
/* Saves the state after `step` steps, the n chunks m[i] with their optimizers opt[i] (and
 * pieces, as for the resume; collective); a no-op without a checkpoint directory. */
l3d_status l3d_train_ckpt_save(struct l3d_train_ckpt *c, const struct l3d_train_config *tc,
                               struct l3d_comm *world, struct l3d_gpt *const *m,
                               const struct l3d_adamw *opt, const struct l3d_ckpt_pieces *pieces,
                               int n, const struct l3d_loader *ld, int step, bool *report);

#endif
