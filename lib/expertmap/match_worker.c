/*
 * match_worker.c - fMoE's matcher on its own thread beside inference (papers/fmoe.txt §4.3:
 * "the expert map matcher runs asynchronously with the inference ... in a
 * publisher-subscriber fashion"; fmoe/expertmap.h "matcher thread").
 *
 * One thread owns one fmoe_matcher. The policy publishes searches (begin, semantic,
 * trajectory rows of one layer) into a ring of jobs and subscribes to a ring of results;
 * publishing copies the rows and never waits. Jobs run in the order they were posted, so
 * every result is the value the same searches made inline give (one matcher, the same
 * arithmetic, the same order). A new iteration drops the jobs of older ones that have not
 * started (their plans could only come too late) and the results of older ones not yet
 * taken.
 *
 * Sizes: at most one begin, one semantic search and L trajectory rows are pending per
 * iteration, so rings of L + 2 never overflow while the policy keeps to that; if one does
 * (a policy error), the rest of that iteration is refused and counted in `dropped`, since
 * a trajectory that missed a layer would give wrong matches. The worker waits for room in
 * the result ring (the policy takes results at every event), never the policy.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fmoe/error.h"
#include "fmoe/expertmap.h"

typedef enum { JOB_BEGIN, JOB_SEMANTIC, JOB_TRAJECTORY } job_kind;

typedef struct job {
    job_kind kind;
    uint64_t iteration;
    int32_t layer, n;
    float *rows; /* [max_queries][width] copied at posting */
} job;

typedef struct result {
    fmoe_match_result r;
    int32_t *best;  /* [max_queries] */
    float *score;   /* [max_queries] */
} result;

struct fmoe_match_worker {
    fmoe_matcher *m;
    int32_t Q, J, h, width, cap;
    pthread_t thread;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t work;  /* a job was posted, or stop */
    pthread_cond_t room;  /* a result was taken */
    pthread_cond_t idle;  /* the worker finished a job */
    job *jobs;            /* ring [cap] */
    int32_t job_head, job_n;
    result *res;          /* ring [cap] */
    int32_t res_head, res_n;
    atomic_int res_ready; /* res_n, readable without the lock */
    int busy, stop;
    uint64_t refused;     /* an iteration whose jobs overflowed: its later ones are refused */
    int64_t dropped;
    double delay_s;       /* tests: each search takes at least this long */
    int32_t *best;        /* the thread's scratch */
    float *score;
};

static void sleep_s(double s) {
    if (s <= 0) return;
    struct timespec ts = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
    }
}

static void run_job(fmoe_match_worker *w, const job *j) {
    int rc = 0;
    switch (j->kind) {
    case JOB_BEGIN: fmoe_matcher_trajectory_begin(w->m, j->n); return;
    case JOB_SEMANTIC:
        rc = fmoe_matcher_semantic(w->m, j->n, j->rows, w->h, w->best, w->score);
        break;
    case JOB_TRAJECTORY:
        rc = fmoe_matcher_trajectory_add(w->m, j->layer, j->rows, w->J, w->best, w->score);
        break;
    }
    for (int32_t q = 0; rc < 0 && q < j->n; q++) { /* a layer out of order: no match */
        w->best[q] = -1;
        w->score[q] = 0;
    }
    sleep_s(w->delay_s);
}

static void *worker_main(void *arg) {
    fmoe_match_worker *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->stop && w->job_n == 0) pthread_cond_wait(&w->work, &w->mu);
        if (w->stop) break;
        job j = w->jobs[w->job_head]; /* its rows buffer stays ours while busy */
        w->busy = 1;
        pthread_mutex_unlock(&w->mu);
        run_job(w, &j);
        pthread_mutex_lock(&w->mu);
        if (j.kind != JOB_BEGIN) {
            while (!w->stop && w->res_n == w->cap) pthread_cond_wait(&w->room, &w->mu);
            if (w->stop) break;
            result *r = &w->res[(w->res_head + w->res_n) % w->cap];
            r->r = (fmoe_match_result){.iteration = j.iteration,
                                       .kind = j.kind == JOB_SEMANTIC ? FMOE_MATCH_SEMANTIC
                                                                      : FMOE_MATCH_TRAJECTORY,
                                       .layer = j.kind == JOB_SEMANTIC ? -1 : j.layer,
                                       .n = j.n};
            memcpy(r->best, w->best, (size_t)j.n * sizeof *r->best);
            memcpy(r->score, w->score, (size_t)j.n * sizeof *r->score);
            w->res_n++;
            atomic_store_explicit(&w->res_ready, w->res_n, memory_order_release);
        }
        /* the job leaves the ring only now: posting never reuses a running job's rows */
        w->job_head = (w->job_head + 1) % w->cap;
        w->job_n--;
        w->busy = 0;
        pthread_cond_broadcast(&w->idle);
    }
    w->busy = 0;
    pthread_cond_broadcast(&w->idle);
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

void fmoe_match_worker_stop(fmoe_match_worker *w) {
    if (!w) return;
    if (w->started) {
        pthread_mutex_lock(&w->mu);
        w->stop = 1;
        pthread_cond_broadcast(&w->work);
        pthread_cond_broadcast(&w->room);
        pthread_mutex_unlock(&w->mu);
        pthread_join(w->thread, NULL);
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->work);
        pthread_cond_destroy(&w->room);
        pthread_cond_destroy(&w->idle);
    }
    for (int32_t i = 0; w->jobs && i < w->cap; i++) free(w->jobs[i].rows);
    for (int32_t i = 0; w->res && i < w->cap; i++) {
        free(w->res[i].best);
        free(w->res[i].score);
    }
    free(w->jobs);
    free(w->res);
    free(w->best);
    free(w->score);
    fmoe_matcher_free(w->m);
    free(w);
}

int fmoe_match_worker_start(fmoe_match_worker **out, const fmoe_expertmap *store,
                            int32_t max_queries, double delay_s) {
    *out = NULL;
    FMOE_RETURN_ERROR_IF(!store || max_queries < 1 || !(delay_s >= 0), FMOE_EINVAL,
                         "matcher thread: %d queries, delay %g s", max_queries, delay_s);
    const fmoe_expertmap_config *sc = fmoe_expertmap_config_of(store);
    fmoe_match_worker *w = calloc(1, sizeof *w);
    if (!w) return fmoe_error_set(FMOE_ENOMEM, "matcher thread");
    w->Q = max_queries;
    w->J = sc->num_experts;
    w->h = sc->semantic_dim;
    w->width = w->J > w->h ? w->J : w->h;
    w->cap = sc->num_layers + 2;
    w->delay_s = delay_s;
    int rc = fmoe_matcher_init(&w->m, store, max_queries);
    if (rc < 0) {
        fmoe_match_worker_stop(w);
        return rc;
    }
    w->jobs = calloc((size_t)w->cap, sizeof *w->jobs);
    w->res = calloc((size_t)w->cap, sizeof *w->res);
    w->best = calloc((size_t)w->Q, sizeof *w->best);
    w->score = calloc((size_t)w->Q, sizeof *w->score);
    int bad = !w->jobs || !w->res || !w->best || !w->score;
    for (int32_t i = 0; !bad && i < w->cap; i++) {
        w->jobs[i].rows = malloc((size_t)w->Q * (size_t)w->width * sizeof(float));
        w->res[i].best = malloc((size_t)w->Q * sizeof(int32_t));
        w->res[i].score = malloc((size_t)w->Q * sizeof(float));
        bad |= !w->jobs[i].rows || !w->res[i].best || !w->res[i].score;
    }
    if (bad) {
        fmoe_match_worker_stop(w);
        return fmoe_error_set(FMOE_ENOMEM, "matcher thread: rings of %d searches", w->cap);
    }
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->work, NULL);
    pthread_cond_init(&w->room, NULL);
    pthread_cond_init(&w->idle, NULL);
    if ((rc = pthread_create(&w->thread, NULL, worker_main, w)) != 0) {
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->work);
        pthread_cond_destroy(&w->room);
        pthread_cond_destroy(&w->idle);
        fmoe_match_worker_stop(w);
        return fmoe_error_set(FMOE_ENOMEM, "matcher thread: %s", strerror(rc));
    }
    w->started = 1;
    *out = w;
    return 0;
}

/* Appends a job (the lock held); rows[q * stride + 0..width) for q < n are copied. */
static void post(fmoe_match_worker *w, job_kind kind, uint64_t iteration, int32_t layer,
                 int32_t n, const float *rows, int64_t stride, int32_t width) {
    if (iteration == w->refused) return;
    if (w->job_n == w->cap) {
        w->refused = iteration;
        w->dropped++;
        return;
    }
    job *j = &w->jobs[(w->job_head + w->job_n) % w->cap];
    j->kind = kind;
    j->iteration = iteration;
    j->layer = layer;
    j->n = n;
    for (int32_t q = 0; rows && q < n; q++)
        memcpy(j->rows + (size_t)q * (size_t)width, rows + (size_t)q * (size_t)stride,
               (size_t)width * sizeof(float));
    w->job_n++;
    pthread_cond_signal(&w->work);
}

void fmoe_match_worker_begin(fmoe_match_worker *w, uint64_t iteration, int32_t n) {
    pthread_mutex_lock(&w->mu);
    /* drop what has not started (the running job, if any, stays at the head) */
    const int32_t keep = w->busy ? 1 : 0;
    w->job_n = w->job_n < keep ? w->job_n : keep;
    /* results not taken are of older iterations (ids only grow): dropped; one still being
     * made is filtered by the policy */
    w->res_n = 0;
    atomic_store_explicit(&w->res_ready, 0, memory_order_release);
    pthread_cond_broadcast(&w->room);
    post(w, JOB_BEGIN, iteration, 0, n > w->Q ? w->Q : n, NULL, 0, 0);
    pthread_mutex_unlock(&w->mu);
}

void fmoe_match_worker_semantic(fmoe_match_worker *w, uint64_t iteration, int32_t n,
                                const float *sem, int64_t stride) {
    if (w->h <= 0) return;
    pthread_mutex_lock(&w->mu);
    post(w, JOB_SEMANTIC, iteration, -1, n > w->Q ? w->Q : n, sem, stride, w->h);
    pthread_mutex_unlock(&w->mu);
}

void fmoe_match_worker_trajectory(fmoe_match_worker *w, uint64_t iteration, int32_t layer,
                                  int32_t n, const float *rows, int64_t stride) {
    pthread_mutex_lock(&w->mu);
    post(w, JOB_TRAJECTORY, iteration, layer, n > w->Q ? w->Q : n, rows, stride, w->J);
    pthread_mutex_unlock(&w->mu);
}

int fmoe_match_worker_poll(fmoe_match_worker *w, fmoe_match_result *r, int32_t *best,
                           float *score) {
    if (atomic_load_explicit(&w->res_ready, memory_order_acquire) == 0) return 0;
    pthread_mutex_lock(&w->mu);
    int got = 0;
    if (w->res_n > 0) {
        const result *x = &w->res[w->res_head];
        *r = x->r;
        memcpy(best, x->best, (size_t)x->r.n * sizeof *best);
        memcpy(score, x->score, (size_t)x->r.n * sizeof *score);
        w->res_head = (w->res_head + 1) % w->cap;
        w->res_n--;
        atomic_store_explicit(&w->res_ready, w->res_n, memory_order_release);
        pthread_cond_signal(&w->room);
        got = 1;
    }
    pthread_mutex_unlock(&w->mu);
    return got;
}

int32_t fmoe_match_worker_wait(fmoe_match_worker *w) {
    pthread_mutex_lock(&w->mu);
    /* a full result ring keeps the worker waiting for room: then the caller polls first */
    while (!w->stop && w->job_n > 0 && w->res_n < w->cap) pthread_cond_wait(&w->idle, &w->mu);
    const int32_t left = w->job_n;
    pthread_mutex_unlock(&w->mu);
    return left;
}

int64_t fmoe_match_worker_dropped(const fmoe_match_worker *w) {
    fmoe_match_worker *m = (fmoe_match_worker *)w;
    pthread_mutex_lock(&m->mu);
    const int64_t d = m->dropped;
    pthread_mutex_unlock(&m->mu);
    return d;
}
