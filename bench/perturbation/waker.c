/* A process that sleeps PERIOD_MS, then spins SPIN_US, forever (until SIGTERM): the least a
 * periodic observer can do per wake-up, or a chosen amount more. bench/perturbation.py runs a
 * workload beside it to see what waking at a given rate costs that workload by itself. */
#include <signal.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <unistd.h>
#include <stdlib.h>
#include <time.h>

static volatile sig_atomic_t stop;

static void on_term(int sig) { (void)sig; stop = 1; }

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: waker PERIOD_MS SPIN_US\n");
        return 2;
    }
    long period_ms = atol(argv[1]), spin_us = atol(argv[2]);
    if (period_ms <= 0 || spin_us < 0) {
        fprintf(stderr, "waker: PERIOD_MS must be > 0 and SPIN_US >= 0\n");
        return 2;
    }
    signal(SIGTERM, on_term);
    /* Stop with the shell that started it, however that shell ends (Ctrl-C on the benchmark
     * included): a waker left behind would spin on the user's machine for good. */
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() == 1)
        return 0;
    struct timespec period = {period_ms / 1000, (period_ms % 1000) * 1000000L};
    while (!stop) {
        nanosleep(&period, NULL);
        long long start = now_ns();
        while (now_ns() - start < spin_us * 1000LL)
            ;
    }
    return 0;
}
