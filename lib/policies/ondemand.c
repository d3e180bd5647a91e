/*
 * ondemand.c - DeepSpeed-Inference style on-demand loading (docs/design.md §6).
 *
 * An expert is loaded when its layer needs it and is not resident; nothing is fetched
 * ahead of time, so every miss stalls the compute stream for the whole transfer. What
 * stays resident is managed as LRU over the N slots. This is the "on-demand" baseline of
 * MoE-Infinity (§5, "DeepSpeed-Inference" and vLLM rows of its Table 1) and fMoE (§6.1).
 * DeepSpeed itself keeps no cache across layers (ZeRO-Inference streams each layer's
 * weights and frees them); with N = K slots this policy degenerates to that behaviour, with
 * more slots it is the natural "cache what you loaded" variant the papers compare against.
 *
 * Hit counts therefore equal `lru`'s; the policy exists under its own name so reports
 * read like the papers' tables, and so that on-demand specific knobs (such as computing
 * misses on the host, `--miss cpu`) can attach here without changing `lru`.
 *
 * Cost: O(N) per miss, nothing per hit.
 */
#include "fmoe/policy.h"

static int ondemand_init(void **state, const fmoe_policy_config *cfg) {
    (void)cfg;
    *state = NULL;
    return 0;
}

static int32_t ondemand_choose_victim(void *state, const fmoe_policy_env *env,
                                      const fmoe_victim_request *req) {
    (void)state;
    (void)req;
    return fmoe_policy_victim_lru(env->cache);
}

const fmoe_policy_ops fmoe_policy_ondemand = {
    .name = "ondemand",
    .summary = "DeepSpeed-Inference style: load on miss, no prefetch, LRU cache",
    .init = ondemand_init,
    .choose_victim = ondemand_choose_victim,
};
