/*
 * reuse_evict.h - internal: eviction by predicted reuse as an option of a policy that
 * otherwise evicts by recency (promoe's and duoserve's evict=predicted-reuse and
 * evict=request-reuse; docs/policies.md#predicted-reuse).
 *
 * Belady's rule on predictions: of the slots the policy would choose among, the one whose
 * expert's predicted next use (reuse_estimate.h) is latest goes first, ties to the least
 * recently accessed; while the LRU guard (lru_guard.h) finds this cache has missed more than
 * (1 + margin) times an LRU cache of its size, the order is LRU's. The policy keeps its own
 * rules of which slots may go (pins, predictions, the current layer's experts): this only
 * orders the candidates. Estimates at predicted-reuse's defaults (half-life 4 gaps, prior 2,
 * overdue 2, margin 0.01). O(1) per access, O(1) per candidate.
 */
#ifndef FMOE_POLICIES_REUSE_EVICT_H
#define FMOE_POLICIES_REUSE_EVICT_H

#include <stdint.h>

#include "fmoe/policy.h"
#include "lru_guard.h"
#include "reuse_estimate.h"

typedef enum fmoe__evict_rule {
    FMOE__EVICT_RECENCY = 0,   /* plain LRU: nothing kept */
    FMOE__EVICT_REUSE = 1,     /* the per-expert gap estimate */
    FMOE__EVICT_REQUEST = 2,   /* the request-level rate estimate */
} fmoe__evict_rule;

/* The choices of a policy's `evict` setting, in fmoe__evict_rule's order. */
extern const char *const fmoe__evict_rule_names[];

typedef struct fmoe__reuse_evict {
    fmoe__evict_rule rule;
    fmoe__reuse_estimate est;
    fmoe__lru_guard guard;
} fmoe__reuse_evict;

/* For cfg's geometry and cache. @return 0 or FMOE_ENOMEM. RECENCY allocates nothing. */
int fmoe__reuse_evict_init(fmoe__reuse_evict *x, fmoe__evict_rule rule,
                           const fmoe_policy_config *cfg);
void fmoe__reuse_evict_free(fmoe__reuse_evict *x);

/* The events the estimate needs (no-ops for RECENCY). */
void fmoe__reuse_evict_request_start(fmoe__reuse_evict *x);
void fmoe__reuse_evict_iteration_start(fmoe__reuse_evict *x, const fmoe_policy_env *env);
void fmoe__reuse_evict_access(fmoe__reuse_evict *x, const fmoe_policy_env *env,
                              const fmoe_access_event *ev);

/* Whether evictable slot a goes before slot b (b = -1: none yet) in the rule's order. */
static inline int fmoe__reuse_evict_before(const fmoe__reuse_evict *x, const fmoe_cache_view *v,
                                           int32_t a, int32_t b) {
    if (b < 0) return 1;
    const uint64_t ta = v->slot_last_access[a], tb = v->slot_last_access[b];
    if (x->rule != FMOE__EVICT_RECENCY && fmoe__lru_guard_trusts(&x->guard)) {
        const double na = fmoe__reuse_estimate_next(&x->est, v->slot_expert[a], v->tick);
        const double nb = fmoe__reuse_estimate_next(&x->est, v->slot_expert[b], v->tick);
        if (na != nb) return na > nb;
    }
    return ta < tb;
}

#endif
