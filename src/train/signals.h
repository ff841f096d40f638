/*
 * Preemption (private to src/train): after install, SIGTERM and SIGUSR1 set a flag (a second one
 * exits at once with status 128 + signal); l3d_train_stop_requested, called by every rank at a
 * step boundary, says whether any rank got one (collective). The signals are the runtime's
 * (l3d_runtime_signals_block, include/llm3d/runtime.h: kept off every thread, taken by a thread
 * of their own that ends the process until install); install hands them to the training loop and
 * restore gives them back to their default action on the calling thread.
 *
 *   l3d_train_signals_install();
 *   for (step ...) { ...; if ((sig = l3d_train_stop_requested(world))) { save; break; } }
 *   l3d_train_signals_restore();
 */
#ifndef LLM3D_TRAIN_SIGNALS_H
#define LLM3D_TRAIN_SIGNALS_H

#include "llm3d/comm.h"

void l3d_train_signals_install(void);
void l3d_train_signals_restore(void);
int l3d_train_stop_requested(struct l3d_comm *world); /* the signal number, or 0 */

#endif
