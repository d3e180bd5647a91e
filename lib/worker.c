/*
 * worker.c - a policy's thread beside the executor (lib/worker.h).
 *
 * Two rings of `capacity` fixed-size slots under one mutex. A job stays in its slot until
 * the thread has finished it, so posting never reuses the buffer of the running job, and
 * the slot fmoe_worker_job hands out (head + n) does not move while the thread advances
 * the head (head + 1, n - 1). The result count is mirrored in an atomic so that polling
 * with nothing ready takes no lock (the policy polls at every event).
 */
#include "worker.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fmoe/error.h"

struct fmoe_worker {
    fmoe_worker_config cfg;
    pthread_t thread;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t work; /* a job was posted, or stop */
    pthread_cond_t room; /* a result was taken or dropped */
    pthread_cond_t idle; /* a job finished */
    unsigned char *jobs; /* [capacity][job_bytes] */
    uint64_t *job_epoch; /* [capacity] */
    int32_t job_head, job_n;
    unsigned char *res;  /* [capacity][result_bytes] */
    uint64_t *res_epoch; /* [capacity] */
    int32_t res_head, res_n;
    atomic_int res_ready;
    int busy, stop;
    uint64_t refused_epoch;
    int64_t refused;
    unsigned char *scratch; /* [result_bytes]: the running job's result */
};

static void sleep_s(double s) {
    if (s <= 0) return;
    struct timespec ts = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
    }
}

static void *worker_main(void *arg) {
    fmoe_worker *w = arg;
    const int32_t cap = w->cfg.capacity;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->stop && w->job_n == 0) pthread_cond_wait(&w->work, &w->mu);
        if (w->stop) break;
        const int32_t slot = w->job_head;
        const uint64_t epoch = w->job_epoch[slot];
        w->busy = 1;
        pthread_mutex_unlock(&w->mu);
        const int has = w->cfg.run(w->cfg.ctx, w->jobs + (size_t)slot * w->cfg.job_bytes,
                                   w->scratch);
        if (has) sleep_s(w->cfg.delay_s);
        pthread_mutex_lock(&w->mu);
        if (has) {
            while (!w->stop && w->res_n == cap) pthread_cond_wait(&w->room, &w->mu);
            if (w->stop) break;
            const int32_t r = (w->res_head + w->res_n) % cap;
            memcpy(w->res + (size_t)r * w->cfg.result_bytes, w->scratch, w->cfg.result_bytes);
            w->res_epoch[r] = epoch;
            w->res_n++;
            atomic_store_explicit(&w->res_ready, w->res_n, memory_order_release);
        }
        w->job_head = (w->job_head + 1) % cap;
        w->job_n--;
        w->busy = 0;
        pthread_cond_broadcast(&w->idle);
    }
    w->busy = 0;
    pthread_cond_broadcast(&w->idle);
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

static void free_rings(fmoe_worker *w) {
    free(w->jobs);
    free(w->job_epoch);
    free(w->res);
    free(w->res_epoch);
    free(w->scratch);
    free(w);
}

void fmoe_worker_stop(fmoe_worker *w) {
    if (!w) return;
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
    free_rings(w);
}

int fmoe_worker_start(fmoe_worker **out, const fmoe_worker_config *cfg) {
    *out = NULL;
    FMOE_RETURN_ERROR_IF(cfg->capacity < 1 || cfg->job_bytes < 1 || cfg->result_bytes < 1 ||
                             !cfg->run || !(cfg->delay_s >= 0),
                         FMOE_EINVAL, "policy thread: %d slots of %zu + %zu bytes, delay %g s",
                         cfg->capacity, cfg->job_bytes, cfg->result_bytes, cfg->delay_s);
    fmoe_worker *w = calloc(1, sizeof *w);
    if (!w) return fmoe_error_set(FMOE_ENOMEM, "policy thread");
    w->cfg = *cfg;
    const size_t cap = (size_t)cfg->capacity;
    w->jobs = malloc(cap * cfg->job_bytes);
    w->job_epoch = calloc(cap, sizeof *w->job_epoch);
    w->res = malloc(cap * cfg->result_bytes);
    w->res_epoch = calloc(cap, sizeof *w->res_epoch);
    w->scratch = malloc(cfg->result_bytes);
    if (!w->jobs || !w->job_epoch || !w->res || !w->res_epoch || !w->scratch) {
        free_rings(w);
        return fmoe_error_set(FMOE_ENOMEM, "policy thread: rings of %d jobs of %zu bytes",
                              cfg->capacity, cfg->job_bytes);
    }
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->work, NULL);
    pthread_cond_init(&w->room, NULL);
    pthread_cond_init(&w->idle, NULL);
    const int rc = pthread_create(&w->thread, NULL, worker_main, w);
    if (rc != 0) {
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->work);
        pthread_cond_destroy(&w->room);
        pthread_cond_destroy(&w->idle);
        free_rings(w);
        return fmoe_error_set(FMOE_ENOMEM, "policy thread: %s", strerror(rc));
    }
    *out = w;
    return 0;
}

void fmoe_worker_epoch(fmoe_worker *w, uint64_t epoch) {
    (void)epoch; /* results of the new epoch cannot exist yet: epochs only grow */
    pthread_mutex_lock(&w->mu);
    const int32_t keep = w->busy ? 1 : 0; /* the running job stays at the head */
    if (w->job_n > keep) w->job_n = keep;
    w->res_n = 0; /* one still being made is filtered by its epoch when taken */
    atomic_store_explicit(&w->res_ready, 0, memory_order_release);
    pthread_cond_broadcast(&w->room);
    pthread_mutex_unlock(&w->mu);
}

void *fmoe_worker_job(fmoe_worker *w, uint64_t epoch) {
    void *slot = NULL;
    pthread_mutex_lock(&w->mu);
    if (epoch != w->refused_epoch) {
        if (w->job_n == w->cfg.capacity) {
            w->refused_epoch = epoch;
            w->refused++;
        } else {
            const int32_t s = (w->job_head + w->job_n) % w->cfg.capacity;
            w->job_epoch[s] = epoch;
            slot = w->jobs + (size_t)s * w->cfg.job_bytes;
        }
    }
    pthread_mutex_unlock(&w->mu);
    return slot;
}

void fmoe_worker_post(fmoe_worker *w) {
    pthread_mutex_lock(&w->mu);
    w->job_n++;
    pthread_cond_signal(&w->work);
    pthread_mutex_unlock(&w->mu);
}

int fmoe_worker_poll(fmoe_worker *w, uint64_t *epoch, void *result) {
    if (atomic_load_explicit(&w->res_ready, memory_order_acquire) == 0) return 0;
    int got = 0;
    pthread_mutex_lock(&w->mu);
    if (w->res_n > 0) {
        const int32_t r = w->res_head;
        *epoch = w->res_epoch[r];
        memcpy(result, w->res + (size_t)r * w->cfg.result_bytes, w->cfg.result_bytes);
        w->res_head = (r + 1) % w->cfg.capacity;
        w->res_n--;
        atomic_store_explicit(&w->res_ready, w->res_n, memory_order_release);
        pthread_cond_signal(&w->room);
        got = 1;
    }
    pthread_mutex_unlock(&w->mu);
    return got;
}

int32_t fmoe_worker_wait(fmoe_worker *w) {
    pthread_mutex_lock(&w->mu);
    while (!w->stop && w->job_n > 0 && w->res_n < w->cfg.capacity)
        pthread_cond_wait(&w->idle, &w->mu);
    const int32_t left = w->job_n;
    pthread_mutex_unlock(&w->mu);
    return left;
}

int64_t fmoe_worker_refused(const fmoe_worker *w) {
    fmoe_worker *m = (fmoe_worker *)w;
    pthread_mutex_lock(&m->mu);
    const int64_t n = m->refused;
    pthread_mutex_unlock(&m->mu);
    return n;
}
