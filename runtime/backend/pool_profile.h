/*
 * pool_profile.h - where a thread pool's time goes, for a build compiled with
 * -DFMOE_POOL_PROFILE only (threadpool.c includes it then; no release build does):
 *
 *   meson setup build-prof -Dcuda=disabled -Dc_args=-DFMOE_POOL_PROFILE
 *
 * Counted per process, over every pool it creates (a generate run has one): jobs run on
 * the pool, the caller's time between jobs (work no worker can share) and inside them
 * (its own tasks, then waiting for the others'), and per thread the tasks it ran, the time
 * inside them, and how often it fell asleep. Printed to stderr when a pool is freed: a
 * debugging aid, which is why a library prints here at all (docs/cpu.md, Threads).
 * Not thread-safe across pools used at the same time.
 */
#ifndef FMOE_BACKEND_POOL_PROFILE_H
#define FMOE_BACKEND_POOL_PROFILE_H

#include <stdio.h>
#include <time.h>

#define PROF(x) x
#define PROF_THREADS 64

static double prof_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double prof_busy_s[PROF_THREADS];          /* s inside tasks, per thread */
static long prof_tasks[PROF_THREADS], prof_sleeps[PROF_THREADS];
static long prof_jobs;
static double prof_serial_s, prof_wait_s, prof_inrun_s; /* the caller's */
static double prof_first, prof_t_start, prof_t_wait, prof_t_end;

static void prof_busy(int w, double d) {
    if (w < PROF_THREADS) prof_busy_s[w] += d, prof_tasks[w]++;
}
static void prof_sleep(int w) {
    if (w < PROF_THREADS) prof_sleeps[w]++;
}
static void prof_job_start(void) {
    const double t = prof_now();
    if (prof_t_end > 0)
        prof_serial_s += t - prof_t_end;
    else
        prof_first = t;
    prof_t_start = t;
    prof_jobs++;
}
static void prof_wait_start(void) { prof_t_wait = prof_now(); }
static void prof_job_end(void) {
    const double t = prof_now();
    prof_wait_s += t - prof_t_wait;
    prof_inrun_s += t - prof_t_start;
    prof_t_end = t;
}
static void prof_dump(int n) {
    const double span = prof_t_end - prof_first;
    if (span <= 0) return;
    fprintf(stderr,
            "pool: %ld jobs over %.3f s; caller between jobs %.3f s, in jobs %.3f s (of which "
            "waiting for others' tasks %.3f s)\n",
            prof_jobs, span, prof_serial_s, prof_inrun_s, prof_wait_s);
    for (int i = 0; i < n && i < PROF_THREADS; i++)
        fprintf(stderr, "pool: thread %d ran %ld tasks, %.3f s (%.0f%% of the span), slept %ld times\n",
                i, prof_tasks[i], prof_busy_s[i], 100 * prof_busy_s[i] / span, prof_sleeps[i]);
}

#endif
