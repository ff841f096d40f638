/*
 * Start-up under hostile conditions (issue 16, item 5): SIGTERM ends the process from the moment
 * the preemption signals are blocked until the training loop takes them over (a start-up blocked
 * in a read still stops), and again after the loop gives them back; an error message that wraps
 * the previous one is not garbled. Each signal case runs in a child process.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "llm3d/core.h"
#include "llm3d/runtime.h"
#include "test.h"
#include "train/signals.h"

static void sleep_ms(int ms) {
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&t, &t) != 0) {}
}

/* Runs fn in a child; returns its wait status (the child gets 10 s, then SIGKILL). */
static int in_child(void (*fn)(void)) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        alarm(10);
        fn();
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return status;
}

/* start-up: signals blocked (l3d_runtime_init), the training loop not yet started */
static void term_at_startup(void) {
    l3d_runtime_signals_block();
    kill(getpid(), SIGTERM);
    sleep_ms(3000); /* a start-up blocked in a read: the signal must end it */
    _exit(0);
}

/* in the loop: the first signal is a request (the process goes on to save), the second ends it */
static void term_in_loop_once(void) {
    l3d_runtime_signals_block();
    l3d_train_signals_install();
    kill(getpid(), SIGTERM);
    sleep_ms(300);
    _exit(7);
}

static void term_in_loop_twice(void) {
    l3d_runtime_signals_block();
    l3d_train_signals_install();
    kill(getpid(), SIGTERM);
    sleep_ms(300);
    kill(getpid(), SIGTERM);
    sleep_ms(3000);
    _exit(0);
}

/* after the loop: the default action again */
static void term_after_loop(void) {
    l3d_runtime_signals_block();
    l3d_train_signals_install();
    l3d_train_signals_restore();
    kill(getpid(), SIGTERM);
    sleep_ms(3000);
    _exit(0);
}

static void test_signals(void) {
    int st = in_child(term_at_startup);
    printf("SIGTERM at start-up: %s %d\n", WIFEXITED(st) ? "exit" : "signal",
           WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 128 + SIGTERM);
    st = in_child(term_in_loop_once);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 7); /* a request, not the end */
    st = in_child(term_in_loop_twice);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 128 + SIGTERM);
    st = in_child(term_after_loop);
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM);
}

/* l3d_error(st, "%s: %s", what, l3d_error_message()): vsnprintf must not read what it writes */
static void test_error_wraps(void) {
    l3d_error(L3D_ERR_FORMAT, "channels (%d) must be divisible by heads (%d)", 9, 2);
    l3d_error(L3D_ERR_FORMAT, "%s: %s", "/some/path/model.bin", l3d_error_message());
    printf("wrapped: %s\n", l3d_error_message());
    CHECK(strcmp(l3d_error_message(),
                 "/some/path/model.bin: channels (9) must be divisible by heads (2)") == 0);
    l3d_error(L3D_ERR_FORMAT, "%s (%s)", l3d_error_message(), "again");
    CHECK(strcmp(l3d_error_message(),
                 "/some/path/model.bin: channels (9) must be divisible by heads (2) (again)") == 0);
}

int main(void) {
    test_error_wraps();
    test_signals();
    return TEST_REPORT();
}
