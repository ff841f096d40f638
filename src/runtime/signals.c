/*
 * The preemption signals, SIGTERM and SIGUSR1 (include/llm3d/runtime.h): kept off every thread
 * from before the process starts any, and taken by a thread of their own in sigwait, which ends
 * the process (status 128 + signal, as the default action would) until a loop takes them over as
 * requests (train/signals.c does, for the training loop's preemption saves).
 *
 * Why a thread of their own and never a handler on a thread that computes: delivered to the
 * thread running a oneDNN product, SIGTERM corrupted the heap (measured: 4-8 of 50
 * single-process runs died in free() within two steps of the signal, none with the signal kept
 * off that thread). Every other thread blocks them: l3d_runtime_signals_block runs before any
 * thread starts (the communication library's, OpenMP's), and the threads inherit the mask.
 * The state below is process-wide because signals are.
 */
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include "llm3d/runtime.h"

static int stop_signal;      /* __atomic: written by the waiter, read at step boundaries */
static int waiter_up, waiter_quit;
static int taken;            /* __atomic: 0 until signals_take: a signal ends the process */
static pthread_t waiter;

static void stop_set(sigset_t *s) {
    sigemptyset(s);
    sigaddset(s, SIGTERM);
    sigaddset(s, SIGUSR1);
}

static void *wait_signals(void *arg) {
    (void)arg;
    sigset_t s;
    stop_set(&s);
    for (;;) {
        int sig = 0;
        if (sigwait(&s, &sig) != 0) continue;
        if (__atomic_load_n(&waiter_quit, __ATOMIC_ACQUIRE)) return NULL;
        /* before the loop (start-up: reading data, loading a checkpoint, possibly blocked in a
         * read) the signal keeps its default action, as if never blocked */
        if (!__atomic_load_n(&taken, __ATOMIC_ACQUIRE)) _exit(128 + sig);
        if (__atomic_load_n(&stop_signal, __ATOMIC_ACQUIRE)) _exit(128 + sig); /* the second */
        __atomic_store_n(&stop_signal, sig, __ATOMIC_RELEASE);
    }
}

void l3d_runtime_signals_block(void) {
    sigset_t s;
    stop_set(&s);
    pthread_sigmask(SIG_BLOCK, &s, NULL);
    if (waiter_up) return;
    __atomic_store_n(&taken, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&waiter_quit, 0, __ATOMIC_RELEASE);
    waiter_up = pthread_create(&waiter, NULL, wait_signals, NULL) == 0;
    L3D_ASSERT(waiter_up);
}

void l3d_runtime_signals_take(void) {
    l3d_runtime_signals_block(); /* the waiter, if the caller did not start it before */
    __atomic_store_n(&stop_signal, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&taken, 1, __ATOMIC_RELEASE);
}

void l3d_runtime_signals_release(void) {
    if (!waiter_up) return;
    __atomic_store_n(&waiter_quit, 1, __ATOMIC_RELEASE);
    pthread_kill(waiter, SIGUSR1); /* wakes the sigwait, which sees waiter_quit */
    pthread_join(waiter, NULL);
    waiter_up = 0;
    __atomic_store_n(&taken, 0, __ATOMIC_RELEASE);
    /* SIGTERM and SIGUSR1 act as before on this thread again (their default: end the process) */
    sigset_t s;
    stop_set(&s);
    pthread_sigmask(SIG_UNBLOCK, &s, NULL);
}

int l3d_runtime_signal_pending(void) { return __atomic_load_n(&stop_signal, __ATOMIC_ACQUIRE); }
