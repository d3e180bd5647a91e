/*
 * sweep_run.c - the threads of one process running sweep cells (contract in sweep.h).
 *
 * A pool of worker threads takes cell indexes from an input queue and leaves (index, result
 * line) pairs on an output queue; the calling thread feeds the one and drains the other, so
 * that it alone calls done() (the result file, rank 0's bookkeeping) and, in an MPI run, MPI
 * (MPI_THREAD_FUNNELED is all the runners need). The queues hold at most one entry per
 * cell, allocated at start.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fmoe/error.h"
#include "sweep.h"

typedef struct finished {
    size_t cell;
    char *line;
    int rc;
    char detail[256];
} finished;

struct cmd_sweep_pool {
    const cmd_sweep_job *job;
    pthread_mutex_t mu;
    pthread_cond_t work, out;
    size_t *in;            /* [n] ring of cells to run */
    size_t in_head, in_len;
    finished *done;        /* [n] ring of finished cells */
    size_t done_head, done_len;
    int stopping;
    int threads;
    pthread_t *tids;
};

static void *worker(void *arg) {
    cmd_sweep_pool *p = arg;
    const size_t n = p->job->n;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->in_len && !p->stopping) pthread_cond_wait(&p->work, &p->mu);
        if (!p->in_len) break;
        const size_t cell = p->in[p->in_head];
        p->in_head = (p->in_head + 1) % n;
        p->in_len--;
        pthread_mutex_unlock(&p->mu);
        finished f = {.cell = cell};
        f.line = p->job->run(p->job->ctx, cell, &f.rc);
        if (!f.line) {
            if (f.rc >= 0) f.rc = fmoe_error_set(FMOE_ENOMEM, "result line of cell %zu", cell);
            snprintf(f.detail, sizeof f.detail, "%s", fmoe_error_detail());
        }
        pthread_mutex_lock(&p->mu);
        p->done[(p->done_head + p->done_len) % n] = f;
        p->done_len++;
        pthread_cond_signal(&p->out);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int cmd_sweep_pool_start(cmd_sweep_pool **out, int threads, const cmd_sweep_job *job) {
    *out = NULL;
    if (threads <= 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        threads = c > 0 ? (int)c : 1;
    }
    const size_t n = job->n ? job->n : 1;
    if ((size_t)threads > n) threads = (int)n;
    cmd_sweep_pool *p = calloc(1, sizeof *p);
    if (!p) return fmoe_error_set(FMOE_ENOMEM, "sweep pool");
    p->job = job;
    p->in = malloc(n * sizeof *p->in);
    p->done = malloc(n * sizeof *p->done);
    p->tids = calloc((size_t)threads, sizeof *p->tids);
    if (!p->in || !p->done || !p->tids) {
        free(p->in);
        free(p->done);
        free(p->tids);
        free(p);
        return fmoe_error_set(FMOE_ENOMEM, "sweep pool of %zu cells", n);
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work, NULL);
    pthread_cond_init(&p->out, NULL);
    for (int t = 0; t < threads; t++) {
        if (pthread_create(&p->tids[t], NULL, worker, p) != 0) break;
        p->threads = t + 1;
    }
    if (p->threads == 0) {
        cmd_sweep_pool_stop(p);
        return fmoe_error_set(FMOE_EINTERNAL, "sweep: cannot start a thread");
    }
    *out = p;
    return 0;
}

int cmd_sweep_pool_threads(const cmd_sweep_pool *p) { return p->threads; }

void cmd_sweep_pool_push(cmd_sweep_pool *p, size_t i) {
    pthread_mutex_lock(&p->mu);
    p->in[(p->in_head + p->in_len) % p->job->n] = i;
    p->in_len++;
    pthread_cond_signal(&p->work);
    pthread_mutex_unlock(&p->mu);
}

int cmd_sweep_pool_pop(cmd_sweep_pool *p, double timeout_s, size_t *i, char **line, int *rc,
                       char *detail, size_t cap) {
    pthread_mutex_lock(&p->mu);
    if (!p->done_len && timeout_s != 0) {
        if (timeout_s < 0) {
            while (!p->done_len) pthread_cond_wait(&p->out, &p->mu);
        } else {
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            const double t = (double)until.tv_nsec * 1e-9 + timeout_s;
            until.tv_sec += (time_t)t;
            until.tv_nsec = (long)((t - (double)(time_t)t) * 1e9);
            while (!p->done_len &&
                   pthread_cond_timedwait(&p->out, &p->mu, &until) != ETIMEDOUT) {
            }
        }
    }
    int got = 0;
    if (p->done_len) {
        const finished *f = &p->done[p->done_head];
        *i = f->cell;
        *line = f->line;
        *rc = f->rc;
        if (detail && cap) snprintf(detail, cap, "%s", f->detail);
        p->done_head = (p->done_head + 1) % p->job->n;
        p->done_len--;
        got = 1;
    }
    pthread_mutex_unlock(&p->mu);
    return got;
}

void cmd_sweep_pool_stop(cmd_sweep_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stopping = 1;
    p->in_len = 0; /* cells not started are dropped */
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mu);
    for (int t = 0; t < p->threads; t++) pthread_join(p->tids[t], NULL);
    while (p->done_len) { /* results nobody popped */
        free(p->done[p->done_head].line);
        p->done_head = (p->done_head + 1) % p->job->n;
        p->done_len--;
    }
    pthread_cond_destroy(&p->work);
    pthread_cond_destroy(&p->out);
    pthread_mutex_destroy(&p->mu);
    free(p->in);
    free(p->done);
    free(p->tids);
    free(p);
}

int cmd_sweep_run_local(const cmd_sweep_job *job) {
    size_t todo = 0, finished_cells = 0;
    for (size_t i = 0; i < job->n; i++) todo += !(job->skip && job->skip[i]);
    const size_t resumed = job->n - todo;
    fmoe_progress_report(job->progress, (int64_t)resumed, (int64_t)job->n, "cells");
    if (todo == 0) return 0;
    cmd_sweep_pool *p = NULL;
    FMOE_FORWARD_IF_ERROR(cmd_sweep_pool_start(&p, job->threads, job));
    /* All cells queued at once: the threads take them in grid order, as they finish. */
    for (size_t i = 0; i < job->n; i++)
        if (!(job->skip && job->skip[i])) cmd_sweep_pool_push(p, i);
    int rc = 0;
    while (finished_cells < todo && rc == 0) {
        size_t i = 0;
        char *line = NULL, detail[256];
        int cell_rc = 0;
        cmd_sweep_pool_pop(p, -1, &i, &line, &cell_rc, detail, sizeof detail);
        finished_cells++;
        if (!line) rc = fmoe_error_set(cell_rc, "%s", detail);
        else rc = job->done(job->ctx, i, line);
        free(line);
        fmoe_progress_report(job->progress, (int64_t)(resumed + finished_cells), (int64_t)job->n,
                             "cells");
    }
    cmd_sweep_pool_stop(p);
    return rc;
}

/* The ranks a launcher started, from the variables it sets: Open MPI's mpirun
 * (OMPI_COMM_WORLD_SIZE), MPICH/Hydra and Slurm's PMI (PMI_SIZE), PMIx (srun --mpi=pmix:
 * PMIX_RANK, with the size from Slurm's SLURM_STEP_NUM_TASKS). */
int cmd_mpi_launched_size(void) {
    static const char *const sizes[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MPI_LOCALNRANKS",
                                        "SLURM_STEP_NUM_TASKS"};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        const char *v = getenv(sizes[k]);
        if (k == 3 && !getenv("PMIX_RANK") && !getenv("PMI_RANK")) continue;
        if (v && atoi(v) > 1) return atoi(v);
    }
    return 0;
}
