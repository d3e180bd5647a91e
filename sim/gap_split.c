/*
 * gap_split.c - counts the misses that wrong prefetches caused (gap_split.h).
 *
 * Per expert: which prefetch its last eviction made room for (a PREFETCH decision's
 * victim; a demand load's EVICT clears it, as the eviction then served a miss), and
 * whether an expert brought by a prefetch has been accessed since. A MISS of an expert
 * displaced by a prefetch still unused counts as a wrong prefetch's miss: with that
 * prefetch not issued, the expert would still have been resident (the slot was taken from
 * it for nothing so far). Cancelled prefetches keep their mark: the slot was still taken.
 * O(1) per decision.
 */
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "gap_split.h"

int fmoe__gap_split_init(sim_gap_split *g, int32_t num_layers, int32_t num_experts) {
    const size_t ne = (size_t)num_layers * (size_t)num_experts;
    memset(g, 0, sizeof *g);
    g->J = num_experts;
    g->displaced_by = malloc(ne * sizeof *g->displaced_by);
    g->unused = calloc(ne, sizeof *g->unused);
    if (!g->displaced_by || !g->unused) {
        fmoe__gap_split_free(g);
        return fmoe_error_set(FMOE_ENOMEM, "gap split: tables for %zu experts", ne);
    }
    for (size_t e = 0; e < ne; e++) g->displaced_by[e] = -1;
    return 0;
}

void fmoe__gap_split_free(sim_gap_split *g) {
    free(g->displaced_by);
    free(g->unused);
    memset(g, 0, sizeof *g);
}

void fmoe__gap_split_observe(sim_gap_split *g, const fmoe_decision *d) {
    const int32_t e = d->layer * g->J + d->expert;
    switch (d->kind) {
    case FMOE_DECISION_PREFETCH:
        g->unused[e] = 1;
        if (d->victim >= 0) g->displaced_by[d->victim] = e;
        break;
    case FMOE_DECISION_EVICT:
        if (d->victim >= 0) g->displaced_by[d->victim] = -1;
        break;
    case FMOE_DECISION_ACCESS: {
        const int32_t by = g->displaced_by[e];
        if (d->result == FMOE_ACCESS_MISS && by >= 0 && g->unused[by])
            g->wrong_prefetch_misses++;
        g->displaced_by[e] = -1;
        g->unused[e] = 0;
        break;
    }
    default:
        break;
    }
}
