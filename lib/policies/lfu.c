/*
 * lfu.c - least-frequently-used expert cache, no prefetch (docs/design.md §7.1).
 *
 * On a miss with the cache full, evict the resident, unpinned expert with the fewest accesses
 * since it was loaded; ties go to the least recently accessed. Counting "since loaded" (not
 * over the expert's lifetime) is the classic in-cache LFU, and what MoE-Infinity's public
 * code does with `incache_visit_count` (its on-demand path,
 * core/parallel/expert_dispatcher.cpp) and the fMoE paper ("fMoE: Fine-Grained Expert
 * Offloading for Large Mixture-of-Experts Serving") §4.5 describes as MoE-Infinity's cache.
 * An access is the §7.1 touch (once per distinct expert per layer per iteration). The counts
 * live in the cache (slot_accesses), so the policy keeps no state.
 *
 * Known weakness, kept on purpose because it is the baseline: an expert that was hot long
 * ago keeps a high count and can squat in its slot (no ageing, unlike redis's LFU).
 *
 * Cost: O(N) per miss, nothing per hit.
 */
#include "fmoe/policy.h"

static int lfu_init(void **state, const fmoe_policy_config *cfg) {
    (void)cfg;
    *state = NULL;
    return 0;
}

static int32_t lfu_choose_victim(void *state, const fmoe_policy_env *env, const fmoe_victim_request *req) {
    (void)state;
    (void)req;
    const fmoe_cache_view *v = env->cache;
    int32_t best = -1;
    uint64_t best_count = UINT64_MAX, best_tick = UINT64_MAX;
    for (int32_t s = 0; s < v->capacity; s++) {
        if (!fmoe_cache_evictable(v, s)) continue;
        const uint64_t n = v->slot_accesses[s], t = v->slot_last_access[s];
        if (n < best_count || (n == best_count && t < best_tick)) {
            best_count = n;
            best_tick = t;
            best = s;
        }
    }
    return best;
}

const fmoe_policy_ops fmoe_policy_lfu = {
    .name = "lfu",
    .summary = "evict the expert with the fewest accesses since loaded (ties: LRU)",
    .init = lfu_init,
    .choose_victim = lfu_choose_victim,
};
