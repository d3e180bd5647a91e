/*
 * match_worker.c - fMoE's matcher on its own thread beside inference ("fMoE: Fine-Grained
 * Expert Offloading for Large Mixture-of-Experts Serving" §4.3: the matcher runs
 * asynchronously with inference, publisher/subscriber; fmoe/expertmap.h
 * "matcher thread"), on the policy thread of lib/worker.h.
 *
 * The thread owns one fmoe_matcher. A job is a begin, a semantic search or one layer's
 * trajectory rows, copied when posted; the jobs run in posting order, so every result is
 * the value the same searches made inline give (one matcher, the same arithmetic, the
 * same order). At most one begin, one semantic search and L trajectory rows are pending
 * per iteration, so rings of L + 2 do not overflow while the policy keeps to that; an
 * iteration that overflows them is refused whole (lib/worker.h), since a trajectory
 * missing a layer would give wrong matches.
 */
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "fmoe/expertmap.h"
#include "worker.h"

typedef enum { JOB_BEGIN, JOB_SEMANTIC, JOB_TRAJECTORY } job_kind;

typedef struct job {
    int32_t kind, layer, n;
    float rows[]; /* [n][width] */
} job;

/* a result: the fmoe_match_result, then best[Q], then score[Q] */
struct fmoe_match_worker {
    fmoe_worker *w;
    fmoe_matcher *m;
    int32_t Q, J, h, width;
    size_t best_at, score_at;
    unsigned char *taken; /* [result bytes]: the result being taken (the policy's thread) */
};

static int run_job(void *ctx, const void *jobp, void *result) {
    fmoe_match_worker *x = ctx;
    const job *j = jobp;
    if (j->kind == JOB_BEGIN) {
        fmoe_matcher_trajectory_begin(x->m, j->n);
        return 0;
    }
    unsigned char *res = result;
    int32_t *best = (int32_t *)(res + x->best_at);
    float *score = (float *)(res + x->score_at);
    const int rc = j->kind == JOB_SEMANTIC
                       ? fmoe_matcher_semantic(x->m, j->n, j->rows, x->h, best, score)
                       : fmoe_matcher_trajectory_add(x->m, j->layer, j->rows, x->J, best, score);
    for (int32_t q = 0; rc < 0 && q < j->n; q++) { /* a layer out of order: no match */
        best[q] = -1;
        score[q] = 0;
    }
    const fmoe_match_result r = {.kind = j->kind == JOB_SEMANTIC ? FMOE_MATCH_SEMANTIC
                                                                 : FMOE_MATCH_TRAJECTORY,
                                 .layer = j->kind == JOB_SEMANTIC ? -1 : j->layer,
                                 .n = j->n};
    memcpy(res, &r, sizeof r);
    return 1;
}

void fmoe_match_worker_stop(fmoe_match_worker *x) {
    if (!x) return;
    fmoe_worker_stop(x->w); /* first: the thread uses the matcher */
    fmoe_matcher_free(x->m);
    free(x->taken);
    free(x);
}

int fmoe_match_worker_start(fmoe_match_worker **out, const fmoe_expertmap *store,
                            int32_t max_queries, double delay_s) {
    *out = NULL;
    FMOE_RETURN_ERROR_IF(!store || max_queries < 1 || !(delay_s >= 0), FMOE_EINVAL,
                         "matcher thread: %d queries, delay %g s", max_queries, delay_s);
    const fmoe_expertmap_config *sc = fmoe_expertmap_config_of(store);
    fmoe_match_worker *x = calloc(1, sizeof *x);
    if (!x) return fmoe_error_set(FMOE_ENOMEM, "matcher thread");
    x->Q = max_queries;
    x->J = sc->num_experts;
    x->h = sc->semantic_dim;
    x->width = x->J > x->h ? x->J : x->h;
    x->best_at = sizeof(fmoe_match_result);
    x->score_at = x->best_at + (size_t)x->Q * sizeof(int32_t);
    int rc = fmoe_matcher_init(&x->m, store, max_queries);
    x->taken = malloc(x->score_at + (size_t)x->Q * sizeof(float));
    if (rc == 0 && !x->taken) rc = fmoe_error_set(FMOE_ENOMEM, "matcher thread");
    const fmoe_worker_config wc = {
        .capacity = sc->num_layers + 2,
        .job_bytes = sizeof(job) + (size_t)x->Q * (size_t)x->width * sizeof(float),
        .result_bytes = x->score_at + (size_t)x->Q * sizeof(float),
        .run = run_job, .ctx = x, .delay_s = delay_s};
    if (rc < 0 || (rc = fmoe_worker_start(&x->w, &wc)) < 0) {
        fmoe_matcher_free(x->m);
        free(x->taken);
        free(x);
        return rc;
    }
    *out = x;
    return 0;
}

/* Posts a job; rows[q * stride + 0..width) for q < n are copied. */
static void post(fmoe_match_worker *x, job_kind kind, uint64_t iteration, int32_t layer,
                 int32_t n, const float *rows, int64_t stride, int32_t width) {
    job *j = fmoe_worker_job(x->w, iteration);
    if (!j) return;
    j->kind = kind;
    j->layer = layer;
    j->n = n > x->Q ? x->Q : n;
    for (int32_t q = 0; rows && q < j->n; q++)
        memcpy(j->rows + (size_t)q * (size_t)width, rows + (size_t)q * (size_t)stride,
               (size_t)width * sizeof(float));
    fmoe_worker_post(x->w);
}

void fmoe_match_worker_begin(fmoe_match_worker *x, uint64_t iteration, int32_t n) {
    fmoe_worker_epoch(x->w, iteration);
    post(x, JOB_BEGIN, iteration, 0, n, NULL, 0, 0);
}

void fmoe_match_worker_semantic(fmoe_match_worker *x, uint64_t iteration, int32_t n,
                                const float *sem, int64_t stride) {
    if (x->h > 0) post(x, JOB_SEMANTIC, iteration, -1, n, sem, stride, x->h);
}

void fmoe_match_worker_trajectory(fmoe_match_worker *x, uint64_t iteration, int32_t layer,
                                  int32_t n, const float *rows, int64_t stride) {
    post(x, JOB_TRAJECTORY, iteration, layer, n, rows, stride, x->J);
}

int fmoe_match_worker_poll(fmoe_match_worker *x, fmoe_match_result *r, int32_t *best,
                           float *score) {
    unsigned char *res = x->taken; /* copied out of the ring whole, then split */
    uint64_t epoch;
    const int got = fmoe_worker_poll(x->w, &epoch, res);
    if (got) {
        memcpy(r, res, sizeof *r);
        r->iteration = epoch;
        memcpy(best, res + x->best_at, (size_t)r->n * sizeof *best);
        memcpy(score, res + x->score_at, (size_t)r->n * sizeof *score);
    }
    return got;
}

int32_t fmoe_match_worker_wait(fmoe_match_worker *x) { return fmoe_worker_wait(x->w); }

int64_t fmoe_match_worker_dropped(const fmoe_match_worker *x) {
    return fmoe_worker_refused(x->w);
}
