/*
 * lru_guard.h - internal: the LRU guard of eviction by predicted reuse
 * (predicted_reuse.c's design comment, docs/policies.md#predicted-reuse).
 *
 * An LRU cache of the same capacity kept in the shadow, fed the same accesses, and both
 * caches' misses: a policy follows its predictions while its own misses are at most
 * (1 + margin) times the shadow's, and LRU's choice otherwise, so that wrong predictions
 * cost at most `margin` of LRU's misses plus what following LRU from other contents costs
 * (about N misses). Belady's rule never misses more than LRU on any prefix (MIN is optimal
 * on every prefix), so perfect predictions are never overridden. The shadow is a linked
 * list over expert ids, most recent first: O(1) per access, O(L·J) memory.
 */
#ifndef FMOE_POLICIES_LRU_GUARD_H
#define FMOE_POLICIES_LRU_GUARD_H

#include <stdint.h>

typedef struct fmoe__lru_guard {
    int32_t *prev, *next;  /* [L*J] neighbours in the shadow's list, -1 none */
    uint8_t *in;           /* [L*J] 1: in the shadow cache */
    int32_t head, tail, size, capacity;
    uint64_t lru_misses;   /* the shadow's */
    uint64_t misses;       /* the guarded cache's (as reported) */
    double margin;
} fmoe__lru_guard;

/* For `num_ids` expert ids and a cache of `capacity` slots. @return 0 or FMOE_ENOMEM. */
int fmoe__lru_guard_init(fmoe__lru_guard *g, size_t num_ids, int32_t capacity, double margin);

/* Frees the tables; a zeroed struct is a no-op. */
void fmoe__lru_guard_free(fmoe__lru_guard *g);

/* Expert e accessed; `missed`: the guarded cache missed it. */
void fmoe__lru_guard_access(fmoe__lru_guard *g, int32_t e, int missed);

/* Whether the predictions may choose the victim now. */
static inline int fmoe__lru_guard_trusts(const fmoe__lru_guard *g) {
    return (double)g->misses <= (1.0 + g->margin) * (double)g->lru_misses;
}

#endif
