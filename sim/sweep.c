/*
 * sweep.c - many cells over threads (fmoe/sim.h). Cells share the read-only workload; each
 * owns its cache, policy and state, so they run without locks. Workers take the next cell
 * from an atomic counter; results land at the cell's index, so the order never depends on
 * scheduling. Progress is reported from the calling thread only (callbacks need not be
 * thread-safe).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fmoe/error.h"
#include "fmoe/sim.h"

typedef struct sweep {
    const fmoe_sim_workload *w;
    const fmoe_sim_config *cells;
    fmoe_sim_result *results;
    int *codes;
    char (*details)[512]; /* per cell; an unknown policy's detail lists every policy name */
    size_t n;
    atomic_size_t next;
    atomic_size_t done;
} sweep;

static void *worker(void *arg) {
    sweep *sw = arg;
    for (;;) {
        size_t i = atomic_fetch_add(&sw->next, 1);
        if (i >= sw->n) break;
        sw->codes[i] = fmoe_sim_run(sw->w, &sw->cells[i], &sw->results[i]);
        if (sw->codes[i] < 0) {
            strncpy(sw->details[i], fmoe_error_detail(), sizeof sw->details[i] - 1);
            sw->details[i][sizeof sw->details[i] - 1] = '\0';
        }
        atomic_fetch_add(&sw->done, 1);
    }
    return NULL;
}

int fmoe_sim_sweep(const fmoe_sim_workload *w, const fmoe_sim_config *cells, size_t n,
                   int threads, fmoe_sim_result *results, const fmoe_progress *progress) {
    memset(results, 0, n * sizeof *results);
    if (n == 0) return 0;
    if (threads <= 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        threads = c > 0 ? (int)c : 1;
    }
    if ((size_t)threads > n) threads = (int)n;
    sweep sw = {.w = w, .cells = cells, .results = results, .n = n};
    atomic_init(&sw.next, 0);
    atomic_init(&sw.done, 0);
    sw.codes = calloc(n, sizeof *sw.codes);
    sw.details = calloc(n, sizeof *sw.details);
    pthread_t *tids = calloc((size_t)threads, sizeof *tids);
    if (!sw.codes || !sw.details || !tids) {
        free(sw.codes);
        free(sw.details);
        free(tids);
        return fmoe_error_set(FMOE_ENOMEM, "sweep of %zu cells", n);
    }
    int started = 0;
    for (int t = 1; t < threads; t++)
        if (pthread_create(&tids[t], NULL, worker, &sw) == 0) started = t;
        else break;
    /* The calling thread works too, reporting progress between cells. */
    for (;;) {
        size_t i = atomic_fetch_add(&sw.next, 1);
        if (i >= n) break;
        sw.codes[i] = fmoe_sim_run(w, &cells[i], &results[i]);
        if (sw.codes[i] < 0) {
            strncpy(sw.details[i], fmoe_error_detail(), sizeof sw.details[i] - 1);
            sw.details[i][sizeof sw.details[i] - 1] = '\0';
        }
        size_t d = atomic_fetch_add(&sw.done, 1) + 1;
        fmoe_progress_report(progress, (int64_t)d, (int64_t)n, "cells");
    }
    for (int t = 1; t <= started; t++) pthread_join(tids[t], NULL);
    fmoe_progress_report(progress, (int64_t)n, (int64_t)n, "cells");
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++)
        if (sw.codes[i] < 0) rc = fmoe_error_set(sw.codes[i], "%s", sw.details[i]);
    if (rc < 0)
        for (size_t i = 0; i < n; i++) fmoe_sim_result_free(&results[i]);
    free(sw.codes);
    free(sw.details);
    free(tids);
    return rc;
}
