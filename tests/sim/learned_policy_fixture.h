/*
 * learned_policy_fixture.h - what the simulator tests of the policies with a learned
 * predictor (test_promoe.c, test_duoserve.c) share: setup that aborts on failure, a seeded
 * random stream for their hand-made traces, one set of costs, and a run of a policy.
 */
#ifndef FMOE_TESTS_LEARNED_POLICY_FIXTURE_H
#define FMOE_TESTS_LEARNED_POLICY_FIXTURE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "fmoe/error.h"
#include "fmoe/predictor.h"
#include "fmoe/sim.h"

/* Setup that cannot fail in a correct build, in helpers that have no harness_failed to
 * assert with: abort. */
#define CHECK(expr)                                                                   \
    do {                                                                              \
        if ((expr) < 0) {                                                             \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr,            \
                    fmoe_error_detail());                                             \
            abort();                                                                  \
        }                                                                             \
    } while (0)

/* The traces' random stream (a 64-bit LCG): a test seeds rng, then draws. */
static uint64_t rng;
static inline uint32_t next_rand(void) {
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(rng >> 33);
}

/* Transfer 1 ms, layer 0.5 ms, expert 1 ms. */
static inline fmoe_sim_costs costs(void) {
    fmoe_hardware_profile hw = {.alpha_s = 0, .beta_bytes_per_s = 1e9};
    hw.attention = (fmoe_linear_cost){.present = 1, .base_s = 0.5e-3};
    hw.expert = (fmoe_linear_cost){.present = 1, .base_s = 1e-3};
    fmoe_sim_costs k;
    if (fmoe_sim_costs_init(&k, &hw, NULL, 1000000, 0, 16) < 0) abort();
    return k;
}

/* Simulates policy (with predictor p, may be NULL) at `slots` cached experts into *r. */
static inline void run(const fmoe_sim_workload *w, const char *policy, const fmoe_predictor *p,
                       int32_t slots, fmoe_sim_result *r) {
    const fmoe_sim_costs k = costs();
    const fmoe_sim_config cfg = {.policy = policy, .cache_experts = slots, .costs = &k,
                                 .predictor = p};
    CHECK(fmoe_sim_run(w, &cfg, r));
}

#endif
