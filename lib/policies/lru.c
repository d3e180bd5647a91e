/*
 * lru.c - least-recently-used expert cache, no prefetch (docs/design.md §6, §7.1).
 *
 * On a miss with the cache full, evict the resident, unpinned expert whose last access is
 * oldest. "Access" is the §7.1 touch: once per distinct expert per layer per iteration, so
 * a prefill touching an expert for 500 tokens counts as one access, like a decode step.
 * This is the cache that the offloading papers use as their base line (ProMoE §7, fMoE
 * §6.1; Mixtral-Offloading uses it per layer). Recency comes from the cache's own tick
 * stamps, so the policy keeps no state.
 *
 * Cost: O(N) scan of the slots per miss, nothing per hit. An O(1) recency list would pay
 * a list update on every hit instead; at the slot counts that matter (tens to a few
 * hundred) the scan is cheaper overall and keeps the cache free of policy structures.
 */
#include "fmoe/policy.h"

static int lru_init(void **state, const fmoe_policy_config *cfg) {
    (void)cfg;
    *state = NULL;
    return 0;
}

static int32_t lru_choose_victim(void *state, const fmoe_policy_env *env, const fmoe_victim_request *req) {
    (void)state;
    (void)req;
    return fmoe_policy_victim_lru(env->cache);
}

const fmoe_policy_ops fmoe_policy_lru = {
    .name = "lru",
    .summary = "evict the least recently accessed expert; no prefetch",
    .init = lru_init,
    .choose_victim = lru_choose_victim,
};
