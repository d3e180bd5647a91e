/*
 * threadpool.h - a fixed pool of worker threads for the CPU backend and `fmoe quantize`
 * (internal). It lives beside the backend contract, not in cpu/, so that model/quantize.c
 * can use it without model/ and cpu/ including each other.
 *
 * fmoe__pool_run(pool, fn, ctx, ntasks) calls fn(ctx, task, worker) for every task in
 * [0, ntasks) across the pool's threads (the caller is worker 0) and returns when all are
 * done. Workers spin briefly before sleeping, so the many small jobs of a decode step do
 * not pay a futex wake-up each. One job at a time: run is not reentrant.
 */
#ifndef FMOE_BACKEND_THREADPOOL_H
#define FMOE_BACKEND_THREADPOOL_H

#include <stdint.h>

typedef void (*fmoe__task_fn)(void *ctx, int32_t task, int32_t worker);
typedef struct fmoe__pool fmoe__pool;

/* `threads` >= 1 counts the caller. @return 0, FMOE_ENOMEM or FMOE_EINTERNAL. */
int fmoe__pool_init(int32_t threads, fmoe__pool **out);
void fmoe__pool_free(fmoe__pool *p);
void fmoe__pool_run(fmoe__pool *p, fmoe__task_fn fn, void *ctx, int32_t ntasks);
int32_t fmoe__pool_threads(const fmoe__pool *p);

#endif
