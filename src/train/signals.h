/*
 * Preemption (private to src/train): after install, SIGTERM and SIGUSR1 set a flag (a second one
 * exits at once with status 128 + signal); l3d_train_stop_requested, called by every rank at a
 * step boundary, says whether any rank got one (collective). A thread of its own takes them
 * (sigwait); l3d_train_signals_block (include/llm3d/train.h), called before the process starts any
 * thread (the communication library's, the first OpenMP region's), keeps them off every other thread, which inherit the
 * mask, and starts that thread: until install, a signal ends the process (status 128 + signal, as
 * its default action would), so a start-up blocked in a read still stops. restore ends that thread
 * and unblocks them on the calling thread (their default action again). The flag is the one
 * process-wide state here.
 *
 *   l3d_train_signals_install();
 *   for (step ...) { ...; if ((sig = l3d_train_stop_requested(world))) { save; break; } }
 *   l3d_train_signals_restore();
 */
#ifndef LLM3D_TRAIN_SIGNALS_H
#define LLM3D_TRAIN_SIGNALS_H

#include "llm3d/comm.h"
#include "llm3d/train.h"

void l3d_train_signals_install(void);
void l3d_train_signals_restore(void);
int l3d_train_stop_requested(struct l3d_comm *world); /* the signal number, or 0 */

#endif
