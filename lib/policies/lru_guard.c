/*
 * lru_guard.c - the shadow LRU cache of the predicted-reuse guard (lru_guard.h).
 */
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "lru_guard.h"

int fmoe__lru_guard_init(fmoe__lru_guard *g, size_t num_ids, int32_t capacity, double margin) {
    memset(g, 0, sizeof *g);
    g->prev = malloc((num_ids ? num_ids : 1) * sizeof *g->prev);
    g->next = malloc((num_ids ? num_ids : 1) * sizeof *g->next);
    g->in = calloc(num_ids ? num_ids : 1, sizeof *g->in);
    if (!g->prev || !g->next || !g->in) {
        fmoe__lru_guard_free(g);
        return fmoe_error_set(FMOE_ENOMEM, "LRU guard for %zu experts", num_ids);
    }
    g->head = g->tail = -1;
    g->capacity = capacity;
    g->margin = margin;
    return 0;
}

void fmoe__lru_guard_free(fmoe__lru_guard *g) {
    free(g->prev);
    free(g->next);
    free(g->in);
    memset(g, 0, sizeof *g);
}

static void unlink_id(fmoe__lru_guard *g, int32_t e) {
    const int32_t a = g->prev[e], b = g->next[e];
    if (a >= 0) g->next[a] = b;
    else g->head = b;
    if (b >= 0) g->prev[b] = a;
    else g->tail = a;
}

void fmoe__lru_guard_access(fmoe__lru_guard *g, int32_t e, int missed) {
    if (missed) g->misses++;
    if (g->capacity <= 0) { /* no slots: every access misses */
        g->lru_misses++;
        return;
    }
    if (g->in[e]) {
        unlink_id(g, e);
    } else {
        g->lru_misses++;
        if (g->size == g->capacity) { /* the least recent leaves */
            const int32_t old = g->tail;
            unlink_id(g, old);
            g->in[old] = 0;
        } else {
            g->size++;
        }
        g->in[e] = 1;
    }
    g->prev[e] = -1;
    g->next[e] = g->head;
    if (g->head >= 0) g->prev[g->head] = e;
    g->head = e;
    if (g->tail < 0) g->tail = e;
}
