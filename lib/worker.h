/*
 * worker.h - internal: one thread beside the executor for a policy's predictions: fMoE's
 * matcher ("fMoE: Fine-Grained Expert Offloading for Large Mixture-of-Experts Serving"
 * §4.3, "publisher/subscriber") and ProMoE's predictor ("ProMoE: Fast MoE-based LLM
 * Serving using Proactive Caching" §4.4, "the predictor runs on the CPU asynchronously").
 *
 * The policy posts jobs into a ring and takes results from another; the thread runs the
 * jobs in posting order. Posting copies into a ring slot and never waits; the thread
 * waits for room in the result ring, never the policy. Jobs belong to an epoch (an
 * iteration): a new epoch drops the jobs of older ones that have not started and the
 * results not yet taken, since a plan for an iteration that is over can only come too
 * late. When a job finds the ring full, that epoch's later jobs are refused too (counted)
 * so that a job that builds on its predecessors (the matcher's running sums) never runs
 * without one. Every call but start belongs to one thread, the policy's.
 *
 *     fmoe_worker_epoch(w, it);
 *     my_job *j = fmoe_worker_job(w, it);       // NULL: refused
 *     if (j) { fill(j); fmoe_worker_post(w); }
 *     ... at each later event: while (fmoe_worker_poll(w, &epoch, &res)) use(&res);
 */
#ifndef FMOE_WORKER_H
#define FMOE_WORKER_H

#include <stddef.h>
#include <stdint.h>

typedef struct fmoe_worker fmoe_worker;

/* Runs one job on the thread, writing its result; @return 1 to post the result, 0 for a
 * job that has none. */
typedef int (*fmoe_worker_run_fn)(void *ctx, const void *job, void *result);

typedef struct fmoe_worker_config {
    int32_t capacity;     /* jobs pending at most, and results */
    size_t job_bytes;     /* one job's buffer */
    size_t result_bytes;  /* one result's */
    fmoe_worker_run_fn run;
    void *ctx;            /* run's; the thread is its only user while jobs are pending */
    double delay_s;       /* tests: each job that posts a result takes at least this long */
} fmoe_worker_config;

/* @return 0, FMOE_EINVAL, FMOE_ENOMEM (also when the thread cannot be made). */
int fmoe_worker_start(fmoe_worker **out, const fmoe_worker_config *cfg);
/* Stops and joins the thread (a running job finishes first). NULL: no-op. */
void fmoe_worker_stop(fmoe_worker *w);

/* Starts epoch `epoch` (> 0, growing): drops the jobs of older epochs not started and
 * every result not taken. */
void fmoe_worker_epoch(fmoe_worker *w, uint64_t epoch);
/* The buffer of the next job of `epoch` (job_bytes, contents undefined), or NULL when it
 * is refused. fmoe_worker_post publishes it. */
void *fmoe_worker_job(fmoe_worker *w, uint64_t epoch);
void fmoe_worker_post(fmoe_worker *w);
/* The oldest result not taken: its epoch into *epoch and result_bytes into result;
 * @return 1, or 0 when none is ready (one atomic load, no lock, then). */
int fmoe_worker_poll(fmoe_worker *w, uint64_t *epoch, void *result);
/* Waits until every posted job is done or the result ring is full. @return the jobs still
 * pending (0: all done; else poll, then wait again). */
int32_t fmoe_worker_wait(fmoe_worker *w);
/* Jobs refused (the first of each refused epoch). */
int64_t fmoe_worker_refused(const fmoe_worker *w);

#endif
