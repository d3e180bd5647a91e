/*
 * trace_queue.c - finished requests appended to the trace by a thread of their own
 * (trace_queue.h).
 */
#include "trace_queue.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"

typedef struct entry {
    fmoe_trace_request req;
    void *tag;
    struct entry *next;
} entry;

struct serve_trace_queue {
    fmoe_trace_writer *w;
    serve_trace_done_fn done;
    void *ctx;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    entry *head, *tail;
    int stop;
    int error;                 /* the first append error */
    char detail[512];          /* its detail (set on the queue's thread) */
};

static void entry_free(entry *e) {
    free((void *)e->req.token_id);
    free((void *)e->req.phase);
    free((void *)e->req.experts);
    free((void *)e->req.probs);
    free((void *)e->req.semantic);
    free((void *)e->req.speculative);
    free((void *)e->req.served_iteration);
    free((void *)e->req.served_s);
    free(e);
}

static void *queue_main(void *arg) {
    serve_trace_queue *q = arg;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (!q->head && !q->stop) pthread_cond_wait(&q->cv, &q->mu);
        entry *e = q->head;
        if (!e) break; /* stopping, and nothing is left */
        q->head = e->next;
        if (!q->head) q->tail = NULL;
        const int skip = q->error;
        pthread_mutex_unlock(&q->mu);
        const int rc = skip ? skip : fmoe_trace_writer_append_request(q->w, &e->req);
        pthread_mutex_lock(&q->mu);
        if (rc < 0 && !q->error) {
            q->error = rc;
            snprintf(q->detail, sizeof q->detail, "%s", fmoe_error_detail());
        }
        pthread_mutex_unlock(&q->mu);
        q->done(q->ctx, e->tag, rc);
        entry_free(e);
        pthread_mutex_lock(&q->mu);
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

int fmoe_serve_trace_queue_start(fmoe_trace_writer *w, serve_trace_done_fn done, void *ctx,
                            serve_trace_queue **out) {
    *out = NULL;
    serve_trace_queue *q = calloc(1, sizeof *q);
    if (!q) return fmoe_error_set(FMOE_ENOMEM, "out of memory");
    q->w = w;
    q->done = done;
    q->ctx = ctx;
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    if (pthread_create(&q->thread, NULL, queue_main, q) != 0) {
        pthread_cond_destroy(&q->cv);
        pthread_mutex_destroy(&q->mu);
        free(q);
        return fmoe_error_set(FMOE_ENOMEM, "cannot start the trace writer thread");
    }
    *out = q;
    return 0;
}

int fmoe_serve_trace_queue_push(serve_trace_queue *q, const fmoe_trace_request *req, void *tag) {
    entry *e = malloc(sizeof *e);
    if (!e) return fmoe_error_set(FMOE_ENOMEM, "out of memory queueing a request for the trace");
    e->req = *req;
    e->tag = tag;
    e->next = NULL;
    pthread_mutex_lock(&q->mu);
    if (q->tail)
        q->tail->next = e;
    else
        q->head = e;
    q->tail = e;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
    return 0;
}

int fmoe_serve_trace_queue_stop(serve_trace_queue *q) {
    if (!q) return 0;
    pthread_mutex_lock(&q->mu);
    q->stop = 1;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
    pthread_join(q->thread, NULL);
    const int rc = q->error;
    if (rc < 0) fmoe_error_set(rc, "%s", q->detail);
    pthread_cond_destroy(&q->cv);
    pthread_mutex_destroy(&q->mu);
    free(q);
    return rc;
}
