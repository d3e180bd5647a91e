/*
 * test_prefetch_feedback.c - feedback-directed prefetching (lib/prefetch_feedback.h and its
 * use in lib/slots.c) on hand-made sequences where the right decision is known.
 */
#include "prefetch_feedback.h"

#include <string.h>

#include "fmoe/error.h"
#include "fmoe/policy.h"
#include "fmoe/slots.h"
#include "harness.h"

enum { L = 2, J = 8 };

/* `n` evictions of layer-0 experts, of which the next gate of layer 0 chooses `regretted`
 * again: regret (regretted + 1) / (n + 2). */
static void evictions(prefetch_feedback *f, int n, int regretted) {
    for (int i = 0; i < n; i++) {
        fmoe__prefetch_feedback_evicted(f, i % J);
        const int32_t chosen[1] = {i < regretted ? i % J : (i + 1) % J};
        fmoe__prefetch_feedback_gate(f, 0, chosen, 1);
    }
}

/* A layer whose predictions are always wrong stops prefetching after a bounded number of
 * tries, keeps being scored while it is refused, and resumes once they turn right. */
TEST(wrong_layer_stops_and_resumes) {
    prefetch_feedback f;
    ASSERT_OK(fmoe__prefetch_feedback_init(&f, L, J));
    evictions(&f, 10, 2); /* regret 3/12 = 0.25 */
    ASSERT_NEAR(fmoe__prefetch_feedback_regret(&f), 0.25, 1e-12);
    const int32_t chosen[2] = {0, 1};
    int tries = 0;
    while (tries < 100) {
        const int32_t r = fmoe__prefetch_feedback_predict(&f, 1, 5); /* never chosen */
        ASSERT_EQ(r, 0);
        if (!fmoe__prefetch_feedback_admit(&f, 1, r)) break;
        fmoe__prefetch_feedback_gate(&f, 1, chosen, 2);
        tries++;
    }
    /* (0 + 1) / (n + 2) <= 0.25 from n = 2 wrong predictions on */
    ASSERT_EQ(tries, 2);
    fmoe__prefetch_feedback_gate(&f, 1, chosen, 2); /* the refused one is scored too: 1/5 */
    ASSERT_NEAR(fmoe__prefetch_feedback_accuracy(&f, 1, 0), 0.2, 1e-12);
    int right = 0;
    while (right < 100) {
        const int32_t r = fmoe__prefetch_feedback_predict(&f, 1, 1); /* chosen from now on */
        if (fmoe__prefetch_feedback_admit(&f, 1, r)) break;
        fmoe__prefetch_feedback_gate(&f, 1, chosen, 2); /* scored although refused */
        right++;
    }
    ASSERT_EQ(right, 1); /* 2 / 6 > 0.25 after one right prediction */
    /* a layer never predicted starts at 1/2: admitted while the regret is below that */
    ASSERT_TRUE(fmoe__prefetch_feedback_admit(&f, 0, 0));
    fmoe__prefetch_feedback_free(&f);
}

/* When the experts a prefetch evicts are needed again at once (regret near 1), a predictor
 * right half of the time is refused; with free eviction (no regret) it is admitted. */
TEST(evicting_needed_experts_is_refused) {
    prefetch_feedback f;
    ASSERT_OK(fmoe__prefetch_feedback_init(&f, L, J));
    evictions(&f, 40, 40);
    ASSERT_TRUE(fmoe__prefetch_feedback_regret(&f) > 0.95);
    const int32_t chosen[1] = {3};
    for (int i = 0; i < 20; i++) {
        fmoe__prefetch_feedback_predict(&f, 1, i % 2 ? 3 : 4);
        fmoe__prefetch_feedback_gate(&f, 1, chosen, 1);
    }
    ASSERT_NEAR(fmoe__prefetch_feedback_accuracy(&f, 1, 0), 11.0 / 22.0, 1e-12);
    ASSERT_TRUE(!fmoe__prefetch_feedback_admit(&f, 1, 0));
    prefetch_feedback g;
    ASSERT_OK(fmoe__prefetch_feedback_init(&g, L, J));
    evictions(&g, 40, 0);
    for (int i = 0; i < 20; i++) {
        fmoe__prefetch_feedback_predict(&g, 1, i % 2 ? 3 : 4);
        fmoe__prefetch_feedback_gate(&g, 1, chosen, 1);
    }
    ASSERT_TRUE(fmoe__prefetch_feedback_admit(&g, 1, 0));
    fmoe__prefetch_feedback_free(&f);
    fmoe__prefetch_feedback_free(&g);
}

/* Ranks: the first prediction for a layer in a cycle is rank 0, later ones count up to the
 * last bucket; a repeated prediction keeps its rank; the gate starts a new cycle. The link's
 * use raises the bar: a 40% predictor with no regret is admitted on an idle link and
 * refused on a saturated one (a wrong transfer then delays a needed one). */
TEST(ranks_and_link_use) {
    prefetch_feedback f;
    ASSERT_OK(fmoe__prefetch_feedback_init(&f, L, J));
    for (int j = 0; j < J; j++)
        ASSERT_EQ(fmoe__prefetch_feedback_predict(&f, 1, j), j < FEEDBACK_RANKS ? j : FEEDBACK_RANKS - 1);
    ASSERT_EQ(fmoe__prefetch_feedback_predict(&f, 1, 2), 2);
    const int32_t chosen[1] = {0};
    fmoe__prefetch_feedback_gate(&f, 1, chosen, 1);
    ASSERT_EQ(fmoe__prefetch_feedback_predict(&f, 1, 6), 0);
    fmoe__prefetch_feedback_gate(&f, 1, chosen, 1);
    for (int i = 0; i < 40; i++) { /* rank 0 right 40% of the time */
        fmoe__prefetch_feedback_predict(&f, 1, i % 5 < 2 ? 0 : 7);
        fmoe__prefetch_feedback_gate(&f, 1, chosen, 1);
    }
    evictions(&f, 100, 0);
    ASSERT_TRUE(fmoe__prefetch_feedback_admit(&f, 1, 0));
    for (int i = 1; i <= 40; i++) fmoe__prefetch_feedback_link(&f, 1.0 * i, 1.0 * i); /* busy */
    ASSERT_TRUE(!fmoe__prefetch_feedback_admit(&f, 1, 0));
    fmoe__prefetch_feedback_free(&f);
}

/* A right prefetch saves time only in idle link time: a 60% predictor with no regret is
 * admitted on a link busy 30% of the time and refused on one busy 70% of the time (there
 * a right transfer mostly reorders the link's queue while a wrong one delays a needed one). */
TEST(busy_link_needs_accuracy_above_its_load) {
    prefetch_feedback f;
    ASSERT_OK(fmoe__prefetch_feedback_init(&f, L, J));
    const int32_t chosen[1] = {0};
    for (int i = 0; i < 100; i++) { /* rank 0 right 60% of the time */
        fmoe__prefetch_feedback_predict(&f, 1, i % 5 < 3 ? 0 : 7);
        fmoe__prefetch_feedback_gate(&f, 1, chosen, 1);
    }
    evictions(&f, 126, 0); /* regret 1/128 */
    ASSERT_NEAR(fmoe__prefetch_feedback_accuracy(&f, 1, 0), 61.0 / 102.0, 1e-12);
    for (int i = 1; i <= 200; i++) fmoe__prefetch_feedback_link(&f, 0.3 * i, 1.0 * i);
    ASSERT_NEAR(f.link_use, 0.3, 1e-3);
    ASSERT_TRUE(fmoe__prefetch_feedback_admit(&f, 1, 0));
    for (int i = 201; i <= 400; i++) fmoe__prefetch_feedback_link(&f, 60 + 0.7 * (i - 200), 1.0 * i);
    ASSERT_NEAR(f.link_use, 0.7, 1e-3);
    ASSERT_TRUE(!fmoe__prefetch_feedback_admit(&f, 1, 0));
    fmoe__prefetch_feedback_free(&f);
}

/* The link's use is a share of time: one gate interval of 1 s with the link busy all of
 * it, then nine of 0.1 s with the link idle, is busy 1 / 1.9 of the time, not 1 / 10 of
 * the intervals (decode's misses come in such bursts between runs of hits). */
TEST(link_use_is_a_share_of_time) {
    prefetch_feedback f;
    ASSERT_OK(fmoe__prefetch_feedback_init(&f, 30, J)); /* averages over ~31 gates, 3 cycles */
    double now = 0, busy = 0;
    for (int cycle = 0; cycle < 200; cycle++) {
        now += 1.0;
        busy += 1.0;
        fmoe__prefetch_feedback_link(&f, busy, now);
        for (int i = 0; i < 9; i++) {
            now += 0.1;
            fmoe__prefetch_feedback_link(&f, busy, now);
        }
    }
    ASSERT_TRUE(f.link_use > 0.4 && f.link_use < 0.7); /* 1/1.9 = 0.53; each interval's own share averaged: 0.1 */
    fmoe__prefetch_feedback_free(&f);
}

static int cancels, prefetches, dropped;
static void on_decision(void *ctx, const fmoe_decision *d) {
    (void)ctx;
    cancels += d->kind == FMOE_DECISION_CANCEL;
    prefetches += d->kind == FMOE_DECISION_PREFETCH;
    dropped += d->kind == FMOE_DECISION_DROPPED;
}

/* Slots of 4 over an LRU policy, decisions counted by on_decision. */
static fmoe_slots *lru_slots(int *harness_failed, fmoe_policy *p, int feedback) {
    const fmoe_policy_config pc = {.num_layers = L, .num_experts = J, .top_k = 1, .capacity = 4};
    ASSERT_OK(fmoe_policy_init(p, "lru", &pc));
    fmoe_slots *q;
    const fmoe_slots_config sc = {.num_layers = L, .num_experts = J, .capacity = 4, .chunks = 1,
                                  .expert_bytes = 100, .policy = p, .feedback = feedback,
                                  .hooks = {.decision = on_decision}};
    ASSERT_OK(fmoe_slots_init(&q, &sc));
    return q;
}

/* Only predictions of experts that are not resident are scored: a policy that keeps
 * predicting the resident expert its gate chooses earns no credit for the transfer of a
 * non-resident one. Three right predictions of resident (1, 0) would have made rank 0 look
 * 4/5 accurate; the first prediction of non-resident (1, 5) is then refused on a full
 * cache (no evidence: 1/2 against a regret of 1/2), not admitted on that credit. */
TEST(resident_predictions_earn_no_credit) {
    fmoe_policy p;
    fmoe_slots *q = lru_slots(harness_failed, &p, 1);
    const int32_t full[4] = {0 * J + 0, 0 * J + 1, 1 * J + 1, 1 * J + 0};
    ASSERT_OK(fmoe_slots_preload(q, full, 4));
    fmoe_policy_env *env = fmoe_slots_env(q);
    const int32_t chosen[1] = {0};
    prefetches = dropped = 0;
    for (int i = 0; i < 3; i++) {
        ASSERT_EQ(env->sink->prefetch(env->sink->ctx, 1, 0, 1.0, 0.5), 0); /* resident */
        fmoe_slots_gate(q, 1, chosen, 1);
    }
    ASSERT_EQ(env->sink->prefetch(env->sink->ctx, 1, 5, 1.0, 0.5), 1);
    ASSERT_EQ(prefetches, 0);
    ASSERT_EQ(dropped, 1);
    ASSERT_TRUE(fmoe_cache_lookup(fmoe_slots_view(q), 1 * J + 5) < 0);
    fmoe_slots_free(q);
    fmoe_policy_free(&p);
}

/* Early preemption: at the gate of layer 1, its queued prefetches of experts the gate did
 * not choose are cancelled (their slots freed); the chosen one stays; other layers' stay. */
TEST(gate_cancels_unchosen_queued_prefetches) {
    fmoe_policy p;
    fmoe_slots *q = lru_slots(harness_failed, &p, 1);
    fmoe_policy_env *env = fmoe_slots_env(q);
    ASSERT_EQ(env->sink->prefetch(env->sink->ctx, 1, 2, 1.0, 0.5), 0);
    ASSERT_EQ(env->sink->prefetch(env->sink->ctx, 1, 3, 1.0, 0.5), 0);
    ASSERT_EQ(env->sink->prefetch(env->sink->ctx, 0, 3, 1.0, 0.5), 0);
    ASSERT_EQ(fmoe_slots_pending(q), 3);
    const int32_t chosen[1] = {3};
    cancels = 0;
    fmoe_slots_gate(q, 1, chosen, 1);
    ASSERT_EQ(cancels, 1);
    ASSERT_EQ(fmoe_slots_pending(q), 2);
    const fmoe_cache_view *v = fmoe_slots_view(q);
    ASSERT_TRUE(fmoe_cache_lookup(v, 1 * J + 2) < 0);
    ASSERT_TRUE(fmoe_cache_lookup(v, 1 * J + 3) >= 0);
    ASSERT_TRUE(fmoe_cache_lookup(v, 0 * J + 3) >= 0);
    fmoe_slots_free(q);
    fmoe_policy_free(&p);

    /* without feedback the gate changes nothing */
    q = lru_slots(harness_failed, &p, 0);
    env = fmoe_slots_env(q);
    ASSERT_EQ(env->sink->prefetch(env->sink->ctx, 1, 2, 1.0, 0.5), 0);
    cancels = 0;
    fmoe_slots_gate(q, 1, chosen, 1);
    ASSERT_EQ(cancels, 0);
    ASSERT_EQ(fmoe_slots_pending(q), 1);
    fmoe_slots_free(q);
    fmoe_policy_free(&p);
}

int main(int argc, char **argv) { return RUN_TESTS(argc, argv); }
