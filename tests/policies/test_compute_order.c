/*
 * test_compute_order.c - ProMoE's reordered compute ("ProMoE: Fast MoE-based LLM Serving
 * using Proactive Caching", §5.3) in the slot
 * protocol both executors share (lib/slots.c fmoe_slots_compute_order): after a gate, a
 * layer's experts go resident first, then those whose transfer is under way, then the
 * rest (queued prefetches, misses), each group in order of first appearance.
 */
#include "harness.h"

#include "fmoe/cache.h"
#include "fmoe/error.h"
#include "fmoe/policy.h"
#include "fmoe/slots.h"

enum { L = 2, J = 8, N = 6 };

typedef struct rig {
    fmoe_policy policy;
    fmoe_slots *slots;
    fmoe_policy_env *env;
} rig;

static int rig_init(rig *r) {
    const fmoe_policy_config cfg = {.num_layers = L, .num_experts = J, .top_k = 2,
                                    .capacity = N, .prefetch_distance = 1};
    int rc = fmoe_policy_init(&r->policy, "lru", &cfg);
    if (rc < 0) return rc;
    const fmoe_slots_config sc = {.num_layers = L, .num_experts = J, .capacity = N,
                                  .chunks = 2, .expert_bytes = 2, .policy = &r->policy};
    if ((rc = fmoe_slots_init(&r->slots, &sc)) < 0) return rc;
    r->env = fmoe_slots_env(r->slots);
    return 0;
}

static void rig_free(rig *r) {
    fmoe_slots_free(r->slots);
    fmoe_policy_free(&r->policy);
}

TEST(resident_then_under_way_then_the_rest_in_first_appearance_order) {
    rig r;
    ASSERT_OK(rig_init(&r));
    /* layer 1: experts 1 and 6 resident; 2 prefetched and its first piece on the copy
     * engine; 4 prefetched and still queued; 3 and 7 absent */
    const int32_t resident[] = {1 * J + 1, 1 * J + 6};
    ASSERT_OK(fmoe_slots_preload(r.slots, resident, 2));
    const fmoe_policy_sink *sink = r.env->sink;
    ASSERT_EQ(sink->prefetch(sink->ctx, 1, 2, 2.0, 0.9), 0);
    ASSERT_EQ(sink->prefetch(sink->ctx, 1, 4, 1.0, 0.5), 0);
    const int32_t s = fmoe_slots_next_prefetch(r.slots, NULL, NULL);
    ASSERT_TRUE(s >= 0);
    ASSERT_EQ(fmoe_slots_expert(r.slots, s), 1 * J + 2); /* the higher priority goes first */
    fmoe_slots_chunk_start(r.slots, s);
    /* the gate's experts in order of first appearance */
    const int32_t distinct[] = {3, 4, 2, 6, 7, 1};
    int32_t order[6];
    fmoe_slots_compute_order(r.slots, 1, distinct, 6, order);
    const int32_t want[] = {3, 5, 2, 0, 1, 4}; /* 6, 1 | 2 | 3, 4, 7 */
    for (int i = 0; i < 6; i++) ASSERT_EQ(order[i], want[i]);
    /* a transfer that has landed but is not applied yet (a live I/O thread's) is still
     * under way; applied, its expert is resident */
    fmoe_slots_chunk_landed(r.slots, s);
    fmoe_slots_chunk_start(r.slots, s);
    fmoe_slots_chunk_landed(r.slots, s);
    fmoe_slots_compute_order(r.slots, 1, distinct, 6, order);
    for (int i = 0; i < 6; i++) ASSERT_EQ(order[i], want[i]);
    fmoe_slots_apply_landed(r.slots);
    fmoe_slots_compute_order(r.slots, 1, distinct, 6, order);
    const int32_t applied[] = {2, 3, 5, 0, 1, 4}; /* 2, 6, 1 | - | 3, 4, 7 */
    for (int i = 0; i < 6; i++) ASSERT_EQ(order[i], applied[i]);
    /* the same experts of layer 0 are all absent: first appearance, unchanged */
    fmoe_slots_compute_order(r.slots, 0, distinct, 6, order);
    for (int i = 0; i < 6; i++) ASSERT_EQ(order[i], i);
    ASSERT_OK(fmoe_slots_error(r.slots));
    rig_free(&r);
}

TEST(only_promoe_asks_for_it) {
    const char *const names[] = {"lru", "lfu", "mixtral-offload", "moe-infinity", "fmoe"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const fmoe_policy_ops *ops = fmoe_policy_find(names[i]);
        ASSERT_TRUE(ops != NULL);
        ASSERT_EQ(ops->flags & FMOE_POLICY_REORDER_COMPUTE, 0u);
    }
    const fmoe_policy_ops *promoe = fmoe_policy_find("promoe");
    ASSERT_TRUE(promoe != NULL);
    ASSERT_TRUE((promoe->flags & FMOE_POLICY_REORDER_COMPUTE) != 0);
}

int main(int argc, char **argv) { return RUN_TESTS(argc, argv); }
