/*
 * test_threadpool.c - runtime/backend/threadpool.c: every task of every job runs exactly
 * once, with its own job's fn and ctx, and none is still running when fmoe__pool_run
 * returns — across tens of thousands of small jobs, with more threads than cores and tasks
 * that sometimes sleep, so that some workers are late, asleep or descheduled while the
 * others finish a job and the next begins. (It caught a first try at letting the caller
 * return without waiting for sleeping workers to check in, with generation-tagged claims:
 * tasks ran twice and the caller returned with tasks unrun, within seconds.)
 *
 * The pool now does let the caller return once every task has finished, without waiting
 * for idle workers (threadpool.c says why that is safe): a worker that wakes late finds a
 * newer job, or none. Jobs of one to three tasks on eight threads, back to back, make
 * nearly every worker late for nearly every job.
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../runtime/backend/threadpool.h"
#include "harness.h"

#define MAX_TASKS 64

typedef struct job {
    uint32_t id;
    _Atomic int32_t runs[MAX_TASKS];
    _Atomic int32_t active;   /* tasks running now */
    _Atomic int32_t foreign;  /* tasks that saw another job's id in the shared slot */
    _Atomic uint32_t *current; /* the job the test thread is running */
    int32_t sleep_every;
} job;

static void run_task(void *ctx, int32_t task, int32_t worker) {
    (void)worker;
    job *j = ctx;
    atomic_fetch_add(&j->active, 1);
    if (atomic_load(j->current) != j->id) atomic_fetch_add(&j->foreign, 1);
    if (j->sleep_every && task % j->sleep_every == 0) {
        const struct timespec ts = {0, 20000}; /* 20 us: let the others run ahead */
        nanosleep(&ts, NULL);
    }
    atomic_fetch_add(&j->runs[task], 1);
    atomic_fetch_sub(&j->active, 1);
}

/* `jobs` jobs of 1..max_tasks tasks on a pool of `threads`. @return 0 when each task of
 * each job ran once, inside its job. */
static int run_jobs(int32_t threads, int32_t jobs, int32_t max_tasks, uint32_t seed) {
    fmoe__pool *pool = NULL;
    if (fmoe__pool_init(threads, &pool) != 0) return -1;
    _Atomic uint32_t current = 0;
    int bad = 0;
    for (int32_t k = 0; k < jobs && !bad; k++) {
        seed = seed * 1664525u + 1013904223u;
        job *j = calloc(1, sizeof *j); /* a fresh ctx each job: a stale one would be freed */
        if (!j) return -1;
        j->id = (uint32_t)k + 1;
        j->current = &current;
        j->sleep_every = (seed >> 8) % 7 == 0 ? 1 + (int32_t)((seed >> 12) % 5) : 0;
        const int32_t n = 1 + (int32_t)((seed >> 16) % (uint32_t)max_tasks);
        atomic_store(&current, j->id);
        fmoe__pool_run(pool, run_task, j, n);
        if (atomic_load(&j->active) != 0 || atomic_load(&j->foreign) != 0) bad = 1;
        for (int32_t t = 0; t < MAX_TASKS; t++)
            if (atomic_load(&j->runs[t]) != (t < n ? 1 : 0)) bad = 1;
        atomic_store(&current, 0);
        free(j);
    }
    fmoe__pool_free(pool);
    return bad;
}

TEST(every_task_once_two_threads) { ASSERT_EQ(run_jobs(2, 10000, MAX_TASKS, 1), 0); }

TEST(every_task_once_more_threads_than_cores) { ASSERT_EQ(run_jobs(5, 4000, MAX_TASKS, 2), 0); }

TEST(every_task_once_late_workers) { ASSERT_EQ(run_jobs(8, 20000, 3, 4), 0); }

TEST(one_thread_runs_inline) { ASSERT_EQ(run_jobs(1, 2000, MAX_TASKS, 3), 0); }

int main(int argc, char **argv) { return RUN_TESTS(argc, argv); }
