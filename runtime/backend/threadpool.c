/*
 * threadpool.c - fixed worker pool. One 64-bit claim word holds the job's generation (high
 * 32 bits) and the next unclaimed task (low 32 bits); a task is claimed by a compare-and-
 * swap that also checks the generation, and the caller returns once every task of its job
 * has *finished* (a count of finished tasks), without waiting for workers that took none.
 *
 * Why the caller does not wait for every worker to check in: on a loaded machine (more
 * runnable threads than cores) a worker may be descheduled for a whole time slice, and a
 * caller that waited for it paid that slice on every job, several hundred times a decode
 * step (2 threads on a busy 2-core machine decoded 20x slower than 1). Now a late worker
 * simply finds the job's tasks taken, and the caller has run them itself.
 *
 * Why this is safe (tests/model/test_threadpool.c runs tens of thousands of jobs with late
 * and sleeping workers): a worker runs task k of generation g only if its CAS moved the
 * claim word from (g, k) to (g, k + 1), and the word holds generation g only while job g
 * still has unclaimed tasks or unfinished ones the caller waits for. Publishing a job is
 * three steps, all seq_cst: the word goes to (g, LOCKED) -- LOCKED is above any task
 * count, so nothing of g can be claimed, and no CAS expecting g - 1 can succeed any more
 * -- then fn, ctx and ntasks are written, then the word goes to (g, 0). A worker reads fn,
 * ctx and ntasks after seeing (g, k < LOCKED) and before its CAS; if it read a later job's
 * values, the caller had already moved the word past generation g (the writes come after
 * that move in the single total order of seq_cst operations), so the CAS fails and the
 * values are never used. Generations wrap after 2^32 jobs; a worker would have to sleep
 * through exactly that many for a stale CAS to succeed.
 *
 * Claiming several tasks at once. A claim is a CAS on a cache line that every thread
 * writes, and the finished count another: with one task a claim, a decode step's ~4900
 * tasks of 1-2 us (the output head alone is 2000 chunks of 16 rows on the small benchmark
 * model, docs/cpu.md, Threads) paid two cross-core line transfers each on every thread,
 * while one thread pays none (run inline). A claim now takes a grain of tasks, a share of
 * those left (guided self-scheduling: large while many are left, one at the end, so the
 * threads still finish together) and at most MAX_GRAIN, so that a worker descheduled with
 * a grain in hand holds little of the job. The proof above is unchanged: a grain [k, k+g)
 * of generation g is run only by the thread whose CAS moved the word from (g, k) to
 * (g, k + g), and k + g <= ntasks < LOCKED. Which thread runs a task never changes a
 * result (every task writes its own outputs).
 *
 * Waiting: a worker spins on the claim word for SPIN_ROUNDS pause instructions (a yield
 * every 64) and then sleeps on a condition variable; the caller wakes sleepers only when
 * some are asleep (a seq_cst count, so a sleeper that missed the new word is always seen),
 * and waits for its job's last task the same way.
 */
#include "threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"

#ifdef FMOE_POOL_PROFILE
#include "pool_profile.h"
#else
#define PROF(x)
#endif

#define SPIN_ROUNDS 4000
#define LOCKED 0xffffffffu
#define MAX_GRAIN 16    /* tasks per claim, at most */
#define GRAIN_SHARE 4   /* a claim takes 1/(GRAIN_SHARE · threads) of the tasks left */
#define LINE 64         /* the claim word, the finished count and the job each own a line */

#define WORD(gen, task) (((uint64_t)(gen) << 32) | (uint32_t)(task))
#define GEN(w) ((uint32_t)((w) >> 32))
#define TASK(w) ((uint32_t)(w))

struct fmoe__pool {
    int32_t n; /* threads including the caller */
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t wake, done;
    _Alignas(LINE) _Atomic uint64_t claim; /* (generation, next task), see above */
    _Alignas(LINE) _Atomic int32_t finished; /* tasks of the current job that have returned */
    _Alignas(LINE) _Atomic(fmoe__task_fn) fn; /* the current job; valid while the claim word */
    _Atomic(void *) ctx;                      /* holds its generation with a task index */
    _Atomic int32_t ntasks;                   /* below LOCKED */
    _Atomic int32_t sleepers;   /* workers asleep (or about to be) on `wake` */
    _Atomic int caller_asleep;  /* the caller is asleep (or about to be) on `done` */
    _Atomic int stop;
    uint32_t gen;               /* the caller's: the generation of the last job */
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

/* Claims and runs grains of tasks of generation `gen` until none is left (or the word has
 * moved on). @return the number of tasks this thread ran. */
static int32_t run_tasks(fmoe__pool *p, uint32_t gen, int32_t worker) {
    int32_t ran = 0;
    uint64_t w = atomic_load(&p->claim);
    while (GEN(w) == gen && TASK(w) != LOCKED) {
        const fmoe__task_fn fn = atomic_load(&p->fn);
        void *ctx = atomic_load(&p->ctx);
        const int32_t ntasks = atomic_load(&p->ntasks);
        if ((int64_t)TASK(w) >= ntasks) break;
        const int32_t k = (int32_t)TASK(w);
        int32_t g = (ntasks - k) / (GRAIN_SHARE * p->n);
        g = g < 1 ? 1 : g > MAX_GRAIN ? MAX_GRAIN : g;
        if (!atomic_compare_exchange_weak(&p->claim, &w, w + (uint32_t)g)) continue; /* reloaded */
        for (int32_t t = k; t < k + g; t++) {
            PROF(double t0 = prof_now());
            fn(ctx, t, worker);
            PROF(prof_busy(worker, prof_now() - t0));
        }
        ran += g;
        PROF(prof_claim(worker));
        if (atomic_fetch_add(&p->finished, g) + g == ntasks && atomic_load(&p->caller_asleep)) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->mu);
        }
        w = atomic_load(&p->claim);
    }
    return ran;
}

/* Whether the claim word announces a job other than `seen` that can be claimed from. */
static inline int new_job(uint64_t w, uint32_t seen) {
    return GEN(w) != seen && TASK(w) != LOCKED;
}

static void *worker_main(void *arg) {
    worker_arg *wa = arg;
    fmoe__pool *p = wa->pool;
    const int32_t id = wa->id;
    free(wa);
    uint32_t seen = GEN(atomic_load(&p->claim));
    for (;;) {
        uint64_t w = atomic_load(&p->claim);
        for (int spins = 0; !new_job(w, seen) && !atomic_load(&p->stop) && spins < SPIN_ROUNDS;
             spins++) {
            cpu_relax(spins);
            w = atomic_load(&p->claim);
        }
        if (!new_job(w, seen) && !atomic_load(&p->stop)) {
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            PROF(prof_sleep(id));
            /* a word still LOCKED is about to become (g, 0): the caller then wakes us */
            while (!new_job(w = atomic_load(&p->claim), seen) && !atomic_load(&p->stop))
                pthread_cond_wait(&p->wake, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop)) {
            PROF(prof_cpu_time(id));
            return NULL;
        }
        /* the job seen, even if the word has moved on since: then it finds nothing to
         * claim, and the next loop sees the newer one */
        seen = GEN(w);
        run_tasks(p, seen, id);
    }
}

int fmoe__pool_init(int32_t threads, fmoe__pool **out) {
    if (threads < 1) threads = 1;
    fmoe__pool *p = aligned_alloc(LINE, (sizeof *p + LINE - 1) / LINE * LINE);
    if (!p) return fmoe_error_set(FMOE_ENOMEM, "out of memory");
    memset(p, 0, sizeof *p);
    p->n = 1;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    atomic_store(&p->claim, WORD(0, 0));
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
    PROF(prof_dump(p->n, (const void *)fmoe__pool_init));
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
    PROF(prof_job_start());
    PROF(prof_job_fn((const void *)fn));
    const uint32_t gen = ++p->gen;
    atomic_store(&p->claim, WORD(gen, LOCKED));
    atomic_store(&p->fn, fn);
    atomic_store(&p->ctx, ctx);
    atomic_store(&p->ntasks, ntasks);
    atomic_store(&p->finished, 0);
    atomic_store(&p->claim, WORD(gen, 0));
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->mu);
    }
    run_tasks(p, gen, 0);
    PROF(prof_wait_start());
    int spins = 0;
    while (atomic_load(&p->finished) < ntasks && spins < SPIN_ROUNDS) {
        cpu_relax(spins);
        spins++;
    }
    if (atomic_load(&p->finished) < ntasks) {
        pthread_mutex_lock(&p->mu);
        atomic_store(&p->caller_asleep, 1);
        while (atomic_load(&p->finished) < ntasks) pthread_cond_wait(&p->done, &p->mu);
        atomic_store(&p->caller_asleep, 0);
        pthread_mutex_unlock(&p->mu);
    }
    PROF(prof_job_end());
}
