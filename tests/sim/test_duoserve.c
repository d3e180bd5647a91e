/*
 * test_duoserve.c - the duoserve policy in the simulator (lib/policies/duoserve.c): with a
 * predictor that knows the routing rule, every decode access of layers 1..L-1 is served by
 * its prefetch and only layer 0 (never predicted) misses; a scrambled predictor's
 * prefetches are wasted and the gate re-fetches; prefill issues no prefetch; at K slots the
 * ring reuses nothing (LRU's hits are 0 and so are duoserve's outside its predictions);
 * init refuses a missing predictor, one of the other kind, and a distance above 1.
 *
 * The hand-made trace: layer 0 chooses a random pair {a, b}; layer l+1 chooses
 * {f(a), f(b)} with f(e) = (3e + 1) mod J, a bijection. Its affinity tables (Eq. 3) put
 * most of row a's mass on f(a) and f(b'), b' the varying partner, so the mean of the two
 * rows of {a, b} has its two largest entries at f(a) and f(b). The predictor is an
 * ExpertMLP of one FC layer reading that part of the state: logit_j = 4 · a_{l-1,l}(j) (or,
 * scrambled, the entry of expert (j + 3) mod J).
 */
#include "harness.h"

#include <stdlib.h>
#include <string.h>

#include "learned_policy_fixture.h"

enum { L = 4, J = 8, K = 2, R = 10, PROMPT = 4, DECODE = 36, N = PROMPT + DECODE };

static uint16_t all_ex[R][N][L][K];

static void build(fmoe_sim_workload *w) {
    rng = 777;
    CHECK(fmoe_sim_workload_init(w, L, J, K, 1000000));
    for (int r = 0; r < R; r++) {
        uint8_t phase[N];
        for (int t = 0; t < N; t++) {
            phase[t] = t < PROMPT ? FMOE_PHASE_PREFILL : FMOE_PHASE_DECODE;
            uint16_t *e = all_ex[r][t][0];
            e[0] = (uint16_t)(next_rand() % J);
            do e[1] = (uint16_t)(next_rand() % J); while (e[1] == e[0]);
            for (int l = 1; l < L; l++)
                for (int k = 0; k < K; k++)
                    all_ex[r][t][l][k] = (uint16_t)((3 * all_ex[r][t][l - 1][k] + 1) % J);
        }
        CHECK(fmoe_sim_workload_add_request(w, r, 0, PROMPT, DECODE, N, phase,
                                            &all_ex[r][0][0][0]));
    }
}

static fmoe_predictor *rule_predictor(int scrambled) {
    const int32_t widths[2] = {fmoe_duoserve_input_dim(L, J), J};
    fmoe_predictor *p = NULL;
    CHECK(fmoe_predictor_alloc_duoserve(&p, L, J, K, 1, widths));
    CHECK(fmoe_duoserve_tables(p, &all_ex[0][0][0][0], (int64_t)R * N));
    float *W = p->expert_mlp->params + p->expert_mlp->w_off[0];
    for (int j = 0; j < J; j++) W[(size_t)j * widths[0] + L * J + (scrambled ? (j + 3) % J : j)] = 4;
    return p;
}

TEST(duoserve_predicts_the_rule_at_k_slots) {
    fmoe_sim_workload w;
    build(&w);
    fmoe_predictor *good = rule_predictor(0), *bad = rule_predictor(1);
    fmoe_sim_result lru, ds, scr;
    run(&w, "lru", NULL, K, &lru);
    run(&w, "duoserve", good, K, &ds);
    run(&w, "duoserve", bad, K, &scr);
    printf("  K slots: lru %lld misses; duoserve %lld misses, %lld late, %lld prefetches, "
           "precision %.3f; scrambled %lld misses, precision %.3f\n",
           (long long)lru.misses, (long long)ds.misses, (long long)ds.late_hits,
           (long long)ds.prefetches, ds.prefetch_precision, (long long)scr.misses,
           scr.prefetch_precision);
    ASSERT_EQ(ds.accesses, lru.accesses);
    ASSERT_EQ(ds.prefetch_distance, 1);
    ASSERT_EQ(lru.hits, 0); /* two slots, two experts a layer: nothing is reused */
    /* decode: layer 0 always misses (never predicted, the slots hold layer L-1's), every
     * later layer is served by its prediction */
    const fmoe_sim_layer_stats *dec = &ds.per_phase[1];
    ASSERT_EQ(dec->misses, (int64_t)R * DECODE * K);
    ASSERT_EQ(ds.per_layer[0].prefetches, 0);
    for (int l = 1; l < L; l++) ASSERT_EQ(ds.per_layer[l].prefetches, (int64_t)R * DECODE * K);
    ASSERT_TRUE(ds.prefetch_precision >= 0.999);
    /* prefill streams its experts on demand: no prefetch, LRU's misses and TTFT */
    ASSERT_EQ(ds.per_phase[0].prefetches, 0);
    ASSERT_EQ(ds.per_phase[0].misses, lru.per_phase[0].misses);
    ASSERT_NEAR(ds.ttft_s.p50, lru.ttft_s.p50, 1e-12);
    ASSERT_TRUE(ds.tpot_s.mean < lru.tpot_s.mean);
    /* scrambled: the gate re-fetches what it chose */
    ASSERT_TRUE(scr.prefetch_precision < 0.2);
    ASSERT_TRUE(scr.misses > ds.misses + (int64_t)R * DECODE);
    ASSERT_TRUE(scr.tpot_s.mean > ds.tpot_s.mean);
    fmoe_sim_result_free(&lru);
    fmoe_sim_result_free(&ds);
    fmoe_sim_result_free(&scr);
    fmoe_predictor_free(good);
    fmoe_predictor_free(bad);
    fmoe_sim_workload_free(&w);
}

/* A longer ring: the predictions still serve every decode layer after the first, and
 * layer 0 now hits at times (an expert still in the ring). */
TEST(duoserve_with_a_longer_ring) {
    fmoe_sim_workload w;
    build(&w);
    fmoe_predictor *good = rule_predictor(0);
    fmoe_sim_result ds;
    run(&w, "duoserve", good, 12, &ds);
    ASSERT_TRUE(ds.prefetch_precision >= 0.999);
    ASSERT_TRUE(ds.per_phase[1].misses < (int64_t)R * DECODE * K);
    fmoe_sim_result_free(&ds);
    fmoe_predictor_free(good);
    fmoe_sim_workload_free(&w);
}

TEST(duoserve_init_refusals) {
    fmoe_policy pol;
    fmoe_policy_config pc = {.num_layers = L, .num_experts = J, .top_k = K, .capacity = 2};
    ASSERT_EQ(fmoe_policy_init(&pol, "duoserve", &pc), FMOE_EINVAL);
    ASSERT_CONTAINS(fmoe_error_detail(), "policy duoserve needs a predictor");
    fmoe_predictor *promoe = NULL;
    CHECK(fmoe_predictor_alloc(&promoe, L, J, K, 16, 4, 1));
    pc.predictor = promoe;
    ASSERT_EQ(fmoe_policy_init(&pol, "duoserve", &pc), FMOE_EINVAL);
    ASSERT_CONTAINS(fmoe_error_detail(), "of kind duoserve, got 'promoe'");
    fmoe_predictor *good = rule_predictor(0);
    pc.predictor = good;
    ASSERT_EQ(fmoe_policy_init(&pol, "promoe", &pc), FMOE_EINVAL);
    ASSERT_CONTAINS(fmoe_error_detail(), "of kind promoe, got 'duoserve'");
    pc.prefetch_distance = 2;
    ASSERT_EQ(fmoe_policy_init(&pol, "duoserve", &pc), FMOE_EINVAL);
    ASSERT_CONTAINS(fmoe_error_detail(), "distance 1");
    pc.prefetch_distance = 1;
    pc.num_experts = J + 1;
    pc.top_k = K;
    ASSERT_EQ(fmoe_policy_init(&pol, "duoserve", &pc), FMOE_EMISMATCH);
    pc.num_experts = J;
    ASSERT_OK(fmoe_policy_init(&pol, "duoserve", &pc));
    fmoe_policy_free(&pol);
    fmoe_predictor_free(good);
    fmoe_predictor_free(promoe);
}

int main(int argc, char **argv) { return RUN_TESTS(argc, argv); }
