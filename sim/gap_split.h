/*
 * gap_split.h - internal to sim/: the part of a run's gap to Belady that wrong prefetches
 * caused (fmoe_sim_config.gap_split, `fmoe simulate --gap-split`; docs/simulating.md).
 *
 * It watches the run's decisions (fmoe/slots.h's decision stream, the one the decision log
 * records) and counts the misses of an expert whose last eviction made room for a
 * prefetch that had not been used by the time of that miss: the displaced expert was
 * needed before the prefetch paid off. The other parts of the split come from counts the
 * executor keeps anyway (late hits) and from Belady's run at the same size (the rest);
 * the command combines them.
 */
#ifndef FMOE_SIM_GAP_SPLIT_H
#define FMOE_SIM_GAP_SPLIT_H

#include <stdint.h>

#include "fmoe/slots.h"

typedef struct sim_gap_split {
    int32_t J;
    int32_t *displaced_by; /* [L*J] the prefetched expert its last eviction made room for, -1 */
    uint8_t *unused;       /* [L*J] 1: brought by a prefetch, not accessed since */
    int64_t wrong_prefetch_misses;
} sim_gap_split;

/* Allocates the tables for L x J experts. @return 0 or FMOE_ENOMEM. */
int fmoe__gap_split_init(sim_gap_split *g, int32_t num_layers, int32_t num_experts);

/* Frees the tables; a zeroed struct is a no-op. */
void fmoe__gap_split_free(sim_gap_split *g);

/* Takes one decision of the run, in order. Never allocates. */
void fmoe__gap_split_observe(sim_gap_split *g, const fmoe_decision *d);

#endif
