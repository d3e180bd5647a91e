/*
 * pool_profile.h - where a thread pool's time goes, for a build compiled with
 * -DFMOE_POOL_PROFILE only (threadpool.c includes it then; no release build does):
 *
 *   meson setup build-prof -Dcuda=disabled -Dc_args=-DFMOE_POOL_PROFILE
 *
 * Counted per process, over every pool it creates (a generate run has one): jobs run on
 * the pool, the caller's time between jobs (work no worker can share) and inside them
 * (its own tasks, then waiting for the others'), and per thread the tasks it ran, the time
 * inside them, the claims it made (a claim takes a grain of tasks), how often it fell asleep and (workers) its CPU time from getrusage, which
 * tells a worker that had no core (a loaded machine) from one that spun without finding
 * tasks; and per task function (by address, relative to fmoe__pool_init: `nm` names it)
 * its jobs, the caller's time in them, the tasks each of the first two threads ran, and the
 * jobs in which thread 1 ran none. Printed to stderr when a pool is freed: a
 * debugging aid, which is why a library prints here at all (docs/cpu.md, Threads).
 * Not thread-safe across pools used at the same time.
 */
#ifndef FMOE_BACKEND_POOL_PROFILE_H
#define FMOE_BACKEND_POOL_PROFILE_H

#include <stdio.h>
#include <sys/resource.h>
#include <time.h>

#define PROF(x) x
#define PROF_THREADS 64

static double prof_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double prof_busy_s[PROF_THREADS];          /* s inside tasks, per thread */
/* per task function (the first PROF_FNS seen): jobs, the caller's time in them, the
 * tasks each thread ran, and the jobs in which thread 1 ran none */
#define PROF_FNS 32
static const void *prof_fn[PROF_FNS];
static long prof_fn_jobs[PROF_FNS], prof_fn_tasks[PROF_FNS][2], prof_fn_idle1[PROF_FNS];
static double prof_fn_s[PROF_FNS];
static int prof_cur = -1;
static long prof_cur_t1;
static long prof_tasks[PROF_THREADS], prof_sleeps[PROF_THREADS], prof_claims[PROF_THREADS];
static long prof_jobs;
static double prof_cpu_s[PROF_THREADS]; /* a worker's CPU time (RUSAGE_THREAD) at its exit */
static double prof_serial_s, prof_wait_s, prof_inrun_s; /* the caller's */
static double prof_first, prof_t_start, prof_t_wait, prof_t_end;

static void prof_busy(int w, double d) {
    if (w < PROF_THREADS) prof_busy_s[w] += d, prof_tasks[w]++;
    if (prof_cur >= 0 && w < 2) prof_fn_tasks[prof_cur][w]++;
    if (w == 1) prof_cur_t1++;
}
static void prof_job_fn(const void *fn) {
    prof_cur = -1;
    for (int i = 0; i < PROF_FNS; i++)
        if (prof_fn[i] == fn || !prof_fn[i]) {
            prof_fn[i] = fn;
            prof_cur = i;
            break;
        }
    if (prof_cur >= 0) prof_fn_jobs[prof_cur]++;
    prof_cur_t1 = 0;
}
static void prof_cpu_time(int w) {
    struct rusage ru;
    if (w < PROF_THREADS && getrusage(RUSAGE_THREAD, &ru) == 0)
        prof_cpu_s[w] = (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec +
                        (double)ru.ru_stime.tv_sec + 1e-6 * (double)ru.ru_stime.tv_usec;
}
static void prof_claim(int w) {
    if (w < PROF_THREADS) prof_claims[w]++;
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
    if (prof_cur >= 0) {
        prof_fn_s[prof_cur] += t - prof_t_start;
        if (prof_cur_t1 == 0) prof_fn_idle1[prof_cur]++;
    }
}
static void prof_dump(int n, const void *base) {
    const double span = prof_t_end - prof_first;
    if (span <= 0) return;
    fprintf(stderr,
            "pool: %ld jobs over %.3f s; caller between jobs %.3f s, in jobs %.3f s (of which "
            "waiting for others' tasks %.3f s)\n",
            prof_jobs, span, prof_serial_s, prof_inrun_s, prof_wait_s);
    for (int i = 0; i < n && i < PROF_THREADS; i++)
        fprintf(stderr, "pool: thread %d ran %ld tasks in %ld claims, %.3f s (%.0f%% of the span), "
                "slept %ld times\n", i, prof_tasks[i], prof_claims[i], prof_busy_s[i],
                100 * prof_busy_s[i] / span, prof_sleeps[i]);
    for (int i = 1; i < n && i < PROF_THREADS; i++)
        fprintf(stderr, "pool: thread %d was on a CPU %.3f s in all\n", i, prof_cpu_s[i]);
    /* a task function by its offset from fmoe__pool_init: `nm` on the binary names it */
    for (int i = 0; i < PROF_FNS && prof_fn[i]; i++)
        fprintf(stderr, "pool: fn %+td: %ld jobs, %.3f s, tasks caller/thread 1 %ld/%ld, "
                "thread 1 ran none in %ld\n", (const char *)prof_fn[i] - (const char *)base,
                prof_fn_jobs[i], prof_fn_s[i], prof_fn_tasks[i][0], prof_fn_tasks[i][1],
                prof_fn_idle1[i]);
}

#endif
