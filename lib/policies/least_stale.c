/*
 * least_stale.c - Least-Stale eviction, no prefetch (SpecMD: "A Comprehensive Study On
 * Speculative Expert Prefetching", Hoang, Jaiswal, Samragh, Cho, arXiv 2602.03921, 2026,
 * §"Least-Stale").
 *
 * SpecMD observes that expert accesses in MoE inference do not follow temporal locality:
 * the layers of a forward pass run in a fixed order, so "recently used" says little about
 * "needed soon". Least-Stale splits the cache in two: experts used in the current forward
 * pass (fresh) and experts whose last use was in an earlier pass (stale). On a miss with
 * the cache full it evicts a stale expert first, first-in first-out among them (the one
 * loaded earliest); only when every evictable expert is fresh does it evict a fresh one,
 * again FIFO.
 *
 * Reading taken here (the paper names the policy and its goal, not a pseudo-code; see
 * docs/policies.md#baselines-ondemand-lru-lfu-least-stale-belady-oracle): "forward pass" =
 * one iteration of docs/design.md §7.1 (a prefill, or one decode step). An expert is fresh
 * when its last access tick is at or after the cache tick at which the current iteration
 * started; a prefetched expert not yet accessed counts from its load. FIFO is by load tick
 * (slot_loaded_at), ties to the lowest slot.
 *
 * Hit counts depend only on the access sequence, its iteration boundaries and the
 * capacity (tests/python/reference_cache.py replays it independently).
 *
 * Cost: O(1) per iteration, O(N) per miss, nothing per hit.
 */
#include <stdlib.h>

#include "fmoe/error.h"
#include "fmoe/policy.h"

typedef struct least_stale_state {
    uint64_t pass_start; /* cache tick when the current iteration started */
} least_stale_state;

static int least_stale_init(void **state, const fmoe_policy_config *cfg) {
    (void)cfg;
    least_stale_state *s = calloc(1, sizeof *s);
    if (!s) return fmoe_error_set(FMOE_ENOMEM, "least-stale state");
    *state = s;
    return 0;
}

static void least_stale_free(void *state) { free(state); }

static void least_stale_on_iteration_start(void *state, const fmoe_policy_env *env,
                                           const fmoe_iteration_event *ev) {
    (void)ev;
    least_stale_state *s = state;
    /* Accesses of this pass get ticks > the current tick. */
    s->pass_start = env->cache->tick + 1;
}

static int32_t least_stale_choose_victim(void *state, const fmoe_policy_env *env,
                                         const fmoe_victim_request *req) {
    (void)req;
    const least_stale_state *st = state;
    const fmoe_cache_view *v = env->cache;
    /* One key per slot, (fresh, load tick), compared as one integer: stale first, then the
     * first loaded (ticks stay below 2^63). */
    int32_t best = -1;
    uint64_t best_key = UINT64_MAX;
    for (int32_t s = 0; s < v->capacity; s++) {
        if (!fmoe_cache_evictable(v, s)) continue;
        const uint64_t key = ((uint64_t)(v->slot_last_access[s] >= st->pass_start) << 63) |
                             v->slot_loaded_at[s];
        if (key < best_key) {
            best_key = key;
            best = s;
        }
    }
    return best;
}

const fmoe_policy_ops fmoe_policy_least_stale = {
    .name = "least-stale",
    .summary = "SpecMD: evict experts unused in this forward pass first, FIFO",
    .init = least_stale_init,
    .free = least_stale_free,
    .on_iteration_start = least_stale_on_iteration_start,
    .choose_victim = least_stale_choose_victim,
};
