/*
 * test_reuse_estimate.c - the request-level next-use estimate and the LRU guard of
 * eviction by predicted reuse (lib/policies/reuse_estimate.h, lru_guard.h), on sequences
 * worked by hand from the formulas in docs/policies.md#predicted-reuse.
 */
#include "harness.h"

#include "fmoe/error.h"
#include "policies/lru_guard.h"
#include "policies/reuse_estimate.h"

/* A policy's predicted rate: 0 for expert 0 (this request will not use it), none else. */
static double predict_expert0_unused(const void *ctx, int32_t e) {
    (void)ctx;
    return e == 0 ? 0.0 : -1.0;
}

/* One request, two iterations: experts 0 and 1 at ticks 1 and 2, then 0 and 2 at 3 and 4. */
static void two_iterations(fmoe__reuse_estimate *r) {
    fmoe__reuse_estimate_request_start(r);
    fmoe__reuse_estimate_iteration_start(r, 0);
    fmoe__reuse_estimate_observe(r, 0, 0, 1);
    fmoe__reuse_estimate_observe(r, 0, 1, 2);
    fmoe__reuse_estimate_iteration_start(r, 2);
    fmoe__reuse_estimate_observe(r, 0, 0, 3);
    fmoe__reuse_estimate_observe(r, 0, 2, 4);
}

TEST(request_estimate_by_hand) {
    fmoe__reuse_estimate r;
    ASSERT_OK(fmoe__reuse_estimate_init(&r, 1, 3, 4, 2, 2));
    ASSERT_OK(fmoe__reuse_estimate_use_request(&r, 1, 4, 0));
    two_iterations(&r);
    /* 2 accesses per iteration; rate = (uses + 4 · uses over all / 2) / (2 + 4):
     * expert 0: (2 + 4) / 6 = 1, gap 2, next 3 + max(2, 2 · 1) = 5;
     * expert 1: (1 + 2) / 6 = 0.5, gap 4, next 2 + max(4, 2 · 2) = 6;
     * expert 2: 0.5, gap 4, next 4 + 4 = 8: the latest, Belady's victim. */
    ASSERT_NEAR(fmoe__reuse_estimate_next(&r, 0, 4), 5.0, 1e-12);
    ASSERT_NEAR(fmoe__reuse_estimate_next(&r, 1, 4), 6.0, 1e-12);
    ASSERT_NEAR(fmoe__reuse_estimate_next(&r, 2, 4), 8.0, 1e-12);
    /* a new request: its uses start at 0, the all-requests rate stays (2 of 3 iterations
     * for expert 0 once the next one starts at tick 4): (0 + 4 · 2/3) / (1 + 4) = 8/15,
     * gap 2 / (8/15) = 3.75, next 3 + max(3.75, 2 · 1) = 6.75 */
    fmoe__reuse_estimate_request_start(&r);
    fmoe__reuse_estimate_iteration_start(&r, 4);
    ASSERT_NEAR(fmoe__reuse_estimate_next(&r, 0, 4), 6.75, 1e-12);
    fmoe__reuse_estimate_free(&r);
}

TEST(request_estimate_takes_the_policys_prediction) {
    fmoe__reuse_estimate r;
    ASSERT_OK(fmoe__reuse_estimate_init(&r, 1, 3, 4, 2, 2));
    ASSERT_OK(fmoe__reuse_estimate_use_request(&r, 1, 4, 0));
    r.predict = predict_expert0_unused;
    two_iterations(&r);
    /* expert 0's prior is the policy's 0: rate (2 + 0) / 6, gap 6, next 3 + 6 = 9, now
     * later than expert 2's 8 (which had been the victim); the others unchanged */
    ASSERT_NEAR(fmoe__reuse_estimate_next(&r, 0, 4), 9.0, 1e-12);
    ASSERT_NEAR(fmoe__reuse_estimate_next(&r, 1, 4), 6.0, 1e-12);
    ASSERT_NEAR(fmoe__reuse_estimate_next(&r, 2, 4), 8.0, 1e-12);
    fmoe__reuse_estimate_free(&r);
}

TEST(memoryless_request_estimate_by_hand) {
    fmoe__reuse_estimate r;
    ASSERT_OK(fmoe__reuse_estimate_init(&r, 1, 3, 4, 2, 2));
    ASSERT_OK(fmoe__reuse_estimate_use_request(&r, 1, 4, 1));
    two_iterations(&r);
    /* the same rates and gaps as request_estimate_by_hand (2, 4, 4), from now = 4 whatever
     * the last access: 6, 8, 8; experts 1 and 2 tie (the caller's ties go to LRU), and
     * expert 1, idle since tick 2, is no longer put later than expert 2 */
    ASSERT_NEAR(fmoe__reuse_estimate_next(&r, 0, 4), 6.0, 1e-12);
    ASSERT_NEAR(fmoe__reuse_estimate_next(&r, 1, 4), 8.0, 1e-12);
    ASSERT_NEAR(fmoe__reuse_estimate_next(&r, 2, 4), 8.0, 1e-12);
    /* the policies rank by the rate's numerator (used + 4 · uses over all / 2): 6, 3, 3,
     * the same order (each over the common 2 + 4 iterations is the rate 1, 0.5, 0.5) */
    ASSERT_NEAR(fmoe__reuse_estimate_rate_score(&r, 0), 6.0, 1e-12);
    ASSERT_NEAR(fmoe__reuse_estimate_rate_score(&r, 1), 3.0, 1e-12);
    ASSERT_NEAR(fmoe__reuse_estimate_rate_score(&r, 2), 3.0, 1e-12);
    /* ten ticks later the order is unchanged: no overdue rule */
    ASSERT_NEAR(fmoe__reuse_estimate_next(&r, 1, 14) - fmoe__reuse_estimate_next(&r, 0, 14),
                2.0, 1e-12);
    fmoe__reuse_estimate_free(&r);
}

TEST(lru_guard_counts_a_shadow_lru_cache) {
    fmoe__lru_guard g;
    ASSERT_OK(fmoe__lru_guard_init(&g, 4, 2, 0.01));
    /* A B A C B with 2 slots: LRU misses A, B, C (evicting B), B: 4 */
    const int32_t seq[] = {0, 1, 0, 2, 1};
    for (int i = 0; i < 5; i++) fmoe__lru_guard_access(&g, seq[i], i != 2);
    ASSERT_EQ(g.lru_misses, (uint64_t)4);
    ASSERT_EQ(g.misses, (uint64_t)4);
    ASSERT_TRUE(fmoe__lru_guard_trusts(&g));
    fmoe__lru_guard_access(&g, 2, 1); /* LRU holds B and C: a hit, but ours missed */
    ASSERT_EQ(g.lru_misses, (uint64_t)4);
    ASSERT_TRUE(!fmoe__lru_guard_trusts(&g)); /* 5 > 1.01 · 4 */
    fmoe__lru_guard_free(&g);
    fmoe__lru_guard_free(&g); /* freed twice: a zeroed struct is a no-op */
}

int main(int argc, char **argv) { return RUN_TESTS(argc, argv); }
