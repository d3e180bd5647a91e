/*
 * moe_infinity_code.c - MoE-Infinity as its public code behaves (github.com/EfficientMoE/
 * MoE-Infinity at d617801, which does not implement Algorithm 1 of "MoE-Infinity: Efficient
 * MoE Inference on Personal Machines with Sparsity-Aware Expert Cache" §4.7 as written),
 * next to `moe-infinity`, the paper's Algorithm 1.
 *
 * The C++ runtime's on-demand path (core/parallel/expert_dispatcher.cpp) evicts, when the
 * sparse cache is full, the GPU-resident expert with the minimum `incache_visit_count`.
 * That counter is incremented when an expert is visited while it is already on the GPU
 * (a hit), is not reset when the expert leaves the GPU, and is cleared for every expert by
 * ClearExpertCacheCounts between generations. So this is LFU on hit counts accumulated
 * over the request (across residencies), not on "accesses since loaded" as `lfu` counts.
 * The code's prefetch path (predict + enqueue by EAM) is commented out for Mixtral,
 * DeepSeek, NLLB and Switch in that snapshot, and the EAMC is never updated online, so
 * this policy makes no prefetches.
 *
 * Where the code is silent or nondeterministic, fmoe decides: the counters are cleared at
 * every request start (the reading of ClearExpertCacheCounts as per generation), and ties
 * go to the least recently accessed expert (the code takes the first in its cache's
 * iteration order, which is not stable).
 *
 * Cost: O(1) per access, O(N) per miss; L·J counters.
 */
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "fmoe/policy.h"

typedef struct mic_state {
    int32_t num_experts;
    size_t n;
    uint64_t *visits; /* [L*J] hits while resident, since the request started */
} mic_state;

static void mic_free(void *state) {
    mic_state *m = state;
    if (!m) return;
    free(m->visits);
    free(m);
}

static int mic_init(void **state, const fmoe_policy_config *cfg) {
    mic_state *m = calloc(1, sizeof *m);
    if (!m) return fmoe_error_set(FMOE_ENOMEM, "moe-infinity-code state");
    m->num_experts = cfg->num_experts;
    m->n = (size_t)cfg->num_layers * (size_t)cfg->num_experts;
    m->visits = calloc(m->n, sizeof *m->visits);
    if (!m->visits) {
        mic_free(m);
        return fmoe_error_set(FMOE_ENOMEM, "moe-infinity-code counters");
    }
    *state = m;
    return 0;
}

static void mic_on_request_start(void *state, const fmoe_policy_env *env,
                                 const fmoe_request_event *ev) {
    (void)env;
    (void)ev;
    mic_state *m = state;
    memset(m->visits, 0, m->n * sizeof *m->visits);
}

static void mic_on_access(void *state, const fmoe_policy_env *env, const fmoe_access_event *ev) {
    (void)env;
    mic_state *m = state;
    if (ev->result != FMOE_ACCESS_MISS) m->visits[(size_t)ev->layer * m->num_experts + ev->expert]++;
}

static int32_t mic_choose_victim(void *state, const fmoe_policy_env *env, const fmoe_victim_request *req) {
    (void)req;
    const mic_state *m = state;
    const fmoe_cache_view *v = env->cache;
    int32_t best = -1;
    uint64_t best_count = UINT64_MAX, best_tick = UINT64_MAX;
    for (int32_t s = 0; s < v->capacity; s++) {
        if (!fmoe_cache_evictable(v, s)) continue;
        const uint64_t c = m->visits[v->slot_expert[s]], t = v->slot_last_access[s];
        if (c < best_count || (c == best_count && t < best_tick)) {
            best = s;
            best_count = c;
            best_tick = t;
        }
    }
    return best;
}

const fmoe_policy_ops fmoe_policy_moe_infinity_code = {
    .name = "moe-infinity-code",
    .summary = "MoE-Infinity's public code: LFU on in-cache visit counts, no prefetch",
    .init = mic_init,
    .free = mic_free,
    .on_request_start = mic_on_request_start,
    .on_access = mic_on_access,
    .choose_victim = mic_choose_victim,
};
