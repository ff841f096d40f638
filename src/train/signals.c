/* Preemption signals of the training loop (src/train/signals.h), over the runtime's signal
 * thread (src/runtime/signals.c). */
#include "llm3d/runtime.h"
#include "train/signals.h"

void l3d_train_signals_install(void) { l3d_runtime_signals_take(); }

void l3d_train_signals_restore(void) { l3d_runtime_signals_release(); }

int l3d_train_stop_requested(struct l3d_comm *world) {
    int32_t v = l3d_runtime_signal_pending();
    if (world->size > 1) l3d_comm_all_reduce(world, &v, 1, L3D_I32, L3D_MAX, NULL);
    return v;
}
