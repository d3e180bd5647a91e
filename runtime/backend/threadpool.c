/*
 * threadpool.c - fixed worker pool: a generation counter announces a job, an atomic
 * counter hands out its tasks, and the last worker to finish wakes the caller.
 *
 * Waiting: a worker spins on the generation for SPIN_ROUNDS pause instructions (tens of
 * microseconds, about the gap between two kernels of one layer) and then sleeps on a
 * condition variable; the caller waits for completion the same way. Everything a job
 * needs (fn, ctx, ntasks) is written before the generation is bumped with seq_cst order,
 * so a worker that sees the new generation sees the job.
 */
#include "threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "fmoe/error.h"

#define SPIN_ROUNDS 4000

struct fmoe__pool {
    int32_t n; /* threads including the caller */
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t wake, done;
    _Atomic uint64_t gen;
    _Atomic int32_t next;
    _Atomic int32_t busy;
    _Atomic int stop;
    fmoe__task_fn fn;
    void *ctx;
    int32_t ntasks;
};

typedef struct worker_arg {
    fmoe__pool *pool;
    int32_t id;
} worker_arg;

/* One round of waiting: a pause, and every 64 rounds a yield, so that on an
 * oversubscribed machine the thread we wait for can have this core. */
static inline void cpu_relax(int round) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
    if ((round & 63) == 63) sched_yield();
}

static void run_tasks(fmoe__pool *p, int32_t worker) {
    for (;;) {
        int32_t t = atomic_fetch_add(&p->next, 1);
        if (t >= p->ntasks) break;
        p->fn(p->ctx, t, worker);
    }
}

static void *worker_main(void *arg) {
    worker_arg *wa = arg;
    fmoe__pool *p = wa->pool;
    const int32_t id = wa->id;
    free(wa);
    uint64_t seen = 0;
    for (;;) {
        int spins = 0;
        while (atomic_load(&p->gen) == seen && !atomic_load(&p->stop) && spins < SPIN_ROUNDS) {
            cpu_relax(spins);
            spins++;
        }
        if (atomic_load(&p->gen) == seen && !atomic_load(&p->stop)) {
            pthread_mutex_lock(&p->mu);
            while (atomic_load(&p->gen) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->wake, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop)) return NULL;
        seen = atomic_load(&p->gen);
        run_tasks(p, id);
        if (atomic_fetch_sub(&p->busy, 1) == 1) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

int fmoe__pool_init(int32_t threads, fmoe__pool **out) {
    if (threads < 1) threads = 1;
    fmoe__pool *p = calloc(1, sizeof *p);
    if (!p) return fmoe_error_set(FMOE_ENOMEM, "out of memory");
    p->n = 1;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    p->threads = calloc((size_t)threads, sizeof *p->threads);
    if (!p->threads) {
        fmoe__pool_free(p);
        return fmoe_error_set(FMOE_ENOMEM, "out of memory");
    }
    for (int32_t i = 1; i < threads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (!wa) {
            fmoe__pool_free(p);
            return fmoe_error_set(FMOE_ENOMEM, "out of memory");
        }
        wa->pool = p;
        wa->id = i;
        if (pthread_create(&p->threads[i], NULL, worker_main, wa) != 0) {
            free(wa);
            fmoe__pool_free(p);
            return fmoe_error_set(FMOE_EINTERNAL, "cannot start worker thread %d", i);
        }
        p->n++;
    }
    *out = p;
    return 0;
}

void fmoe__pool_free(fmoe__pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int32_t i = 1; i < p->n; i++) pthread_join(p->threads[i], NULL);
    free(p->threads);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
    free(p);
}

int32_t fmoe__pool_threads(const fmoe__pool *p) { return p ? p->n : 1; }

void fmoe__pool_run(fmoe__pool *p, fmoe__task_fn fn, void *ctx, int32_t ntasks) {
    if (ntasks <= 0) return;
    if (!p || p->n == 1 || ntasks == 1) {
        for (int32_t t = 0; t < ntasks; t++) fn(ctx, t, 0);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    p->ntasks = ntasks;
    atomic_store(&p->next, 0);
    atomic_store(&p->busy, p->n - 1);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add(&p->gen, 1);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    run_tasks(p, 0);
    int spins = 0;
    while (atomic_load(&p->busy) > 0 && spins < SPIN_ROUNDS) {
        cpu_relax(spins);
        spins++;
    }
    if (atomic_load(&p->busy) > 0) {
        pthread_mutex_lock(&p->mu);
        while (atomic_load(&p->busy) > 0) pthread_cond_wait(&p->done, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
}
