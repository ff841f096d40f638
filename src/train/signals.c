/* Preemption signals of the training loop (src/train/signals.h). */
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include "train/signals.h"

/* The signals are taken by a thread of their own, in sigwait, never by a handler on a thread
 * that computes: delivered to the thread running a oneDNN product, SIGTERM corrupted the heap
 * (measured: 4-8 of 50 single-process runs died in free() within two steps of the signal, none
 * with the signal kept off that thread). Every other thread blocks them: l3d_train_signals_block
 * before any thread starts (the communication library's, OpenMP's), which the threads then
 * inherit. */
static int stop_signal;      /* __atomic: written by the waiter, read at step boundaries */
static int waiter_up, waiter_quit;
static int in_loop;          /* __atomic: 0 until install: a signal ends the process */
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
        /* before the training loop (start-up: reading data, loading a checkpoint, possibly
         * blocked in a read) the signal keeps its default action, as if never blocked */
        if (!__atomic_load_n(&in_loop, __ATOMIC_ACQUIRE)) _exit(128 + sig);
        if (__atomic_load_n(&stop_signal, __ATOMIC_ACQUIRE)) _exit(128 + sig); /* the second */
        __atomic_store_n(&stop_signal, sig, __ATOMIC_RELEASE);
    }
}

/* Blocks the signals on the calling thread (and the threads it starts) and starts the waiter, which
 * ends the process on a signal until install hands the signals to the training loop. */
void l3d_train_signals_block(void) {
    sigset_t s;
    stop_set(&s);
    pthread_sigmask(SIG_BLOCK, &s, NULL);
    if (waiter_up) return;
    __atomic_store_n(&in_loop, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&waiter_quit, 0, __ATOMIC_RELEASE);
    waiter_up = pthread_create(&waiter, NULL, wait_signals, NULL) == 0;
    L3D_ASSERT(waiter_up);
}

void l3d_train_signals_install(void) {
    l3d_train_signals_block(); /* the waiter, if the caller did not start it before */
    __atomic_store_n(&stop_signal, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&in_loop, 1, __ATOMIC_RELEASE);
}

void l3d_train_signals_restore(void) {
    if (!waiter_up) return;
    __atomic_store_n(&waiter_quit, 1, __ATOMIC_RELEASE);
    pthread_kill(waiter, SIGUSR1); /* wakes the sigwait, which sees waiter_quit */
    pthread_join(waiter, NULL);
    waiter_up = 0;
    __atomic_store_n(&in_loop, 0, __ATOMIC_RELEASE);
    /* SIGTERM and SIGUSR1 act as before on this thread again (their default: end the process) */
    sigset_t s;
    stop_set(&s);
    pthread_sigmask(SIG_UNBLOCK, &s, NULL);
}

int l3d_train_stop_requested(struct l3d_comm *world) {
    int32_t v = __atomic_load_n(&stop_signal, __ATOMIC_ACQUIRE);
    if (world->size > 1) l3d_comm_all_reduce(world, &v, 1, L3D_I32, L3D_MAX, NULL);
    return v;
}
