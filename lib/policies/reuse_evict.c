/*
 * reuse_evict.c - eviction by predicted reuse as a policy's option (reuse_evict.h).
 */
#include <string.h>

#include "reuse_evict.h"

const char *const fmoe__evict_rule_names[] = {"recency", "predicted-reuse", "request-reuse",
                                               NULL};

int fmoe__reuse_evict_init(fmoe__reuse_evict *x, fmoe__evict_rule rule,
                           const fmoe_policy_config *cfg) {
    memset(x, 0, sizeof *x);
    x->rule = rule;
    if (rule == FMOE__EVICT_RECENCY) return 0;
    const size_t ne = (size_t)cfg->num_layers * (size_t)cfg->num_experts;
    /* predicted-reuse's defaults: reuse_half_life 4, reuse_prior 2, reuse_overdue 2,
     * guard_margin 0.01, request_weight 4 */
    int rc = fmoe__lru_guard_init(&x->guard, ne, cfg->capacity, 0.01);
    if (rc == 0)
        rc = fmoe__reuse_estimate_init(&x->est, cfg->num_layers, cfg->num_experts, 4, 2, 2);
    if (rc == 0 && rule == FMOE__EVICT_REQUEST)
        rc = fmoe__reuse_estimate_use_request(&x->est, cfg->num_layers, 4, 0);
    if (rc < 0) fmoe__reuse_evict_free(x);
    return rc;
}

void fmoe__reuse_evict_free(fmoe__reuse_evict *x) {
    fmoe__lru_guard_free(&x->guard);
    fmoe__reuse_estimate_free(&x->est);
}

void fmoe__reuse_evict_request_start(fmoe__reuse_evict *x) {
    if (x->rule == FMOE__EVICT_REQUEST) fmoe__reuse_estimate_request_start(&x->est);
}

void fmoe__reuse_evict_iteration_start(fmoe__reuse_evict *x, const fmoe_policy_env *env) {
    if (x->rule == FMOE__EVICT_REQUEST)
        fmoe__reuse_estimate_iteration_start(&x->est, env->cache->tick);
}

void fmoe__reuse_evict_access(fmoe__reuse_evict *x, const fmoe_policy_env *env,
                              const fmoe_access_event *ev) {
    if (x->rule == FMOE__EVICT_RECENCY) return;
    const int32_t e = ev->layer * x->est.J + ev->expert;
    fmoe__lru_guard_access(&x->guard, e, ev->result == FMOE_ACCESS_MISS);
    fmoe__reuse_estimate_observe(&x->est, ev->layer, e, env->cache->tick);
}
