/*
 * test_promoe.c - the promoe policy in the simulator (lib/policies/promoe.c): gate inputs
 * reach it (unbatched and through --batch's gather), a predictor that knows the routing
 * rule turns LRU's misses into prefetch hits with precision near 1, a scrambled one does
 * not, and without gate inputs it is LRU.
 *
 * The hand-made trace: token t's gate input at layer l is the one-hot vector of a random
 * v(t, l) in [0, J); layer l+1 routes the token to expert v(t, l) (layer 0 at random). The
 * predictor of layer i (stride 1: it reads layer i-1's gate input) is set by hand: W1 = 4·I,
 * W2 = 4·I, so its top-1 is the input's hot index, the right expert. Scrambled, W2 maps
 * index j to expert (j + 3) mod J: always wrong.
 */
#include "harness.h"

#include <stdlib.h>
#include <string.h>

#include "learned_policy_fixture.h"

enum { L = 4, J = 8, K = 1, H = 8, R = 10, PROMPT = 4, DECODE = 36, N = PROMPT + DECODE };
enum { SLOTS = 6 }; /* cached experts */

/* Builds the workload: R requests of a 4-token prompt and 36 decode tokens, and their gate
 * inputs (w->hidden set by hand, as fmoe_sim_workload_read_hidden leaves it). */
static void build(fmoe_sim_workload *w, int with_hidden) {
    rng = 12345;
    CHECK(fmoe_sim_workload_init(w, L, J, K, 1000000));
    float *hid = calloc((size_t)R * N * L * J, sizeof *hid);
    if (!hid) abort();
    for (int r = 0; r < R; r++) {
        uint16_t ex[N * L];
        uint8_t phase[N];
        for (int t = 0; t < N; t++) {
            phase[t] = t < PROMPT ? FMOE_PHASE_PREFILL : FMOE_PHASE_DECODE;
            int v_prev = -1;
            for (int l = 0; l < L; l++) {
                const int v = (int)(next_rand() % J);
                ex[t * L + l] = (uint16_t)(l == 0 ? next_rand() % J : (uint32_t)v_prev);
                hid[(((size_t)r * N + t) * L + l) * J + v] = 1.0f;
                v_prev = v;
            }
        }
        CHECK(fmoe_sim_workload_add_request(w, r, 0, PROMPT, DECODE, N, phase, ex));
    }
    if (with_hidden) {
        w->hidden = hid;
        w->hidden_dim = J;
    } else {
        free(hid);
    }
}

/* The rule's predictor (stride 1, h = J), or its scrambled twin. */
static fmoe_predictor *rule_predictor(int scrambled) {
    fmoe_predictor *p = NULL;
    CHECK(fmoe_predictor_alloc(&p, L, J, K, J, H, 1));
    for (int i = 1; i < L; i++) {
        fmoe_mlp *m = &p->layers[i];
        for (int a = 0; a < H; a++) m->w1[a * J + a] = 4.0f;
        for (int j = 0; j < J; j++) m->w2[(scrambled ? (j + 3) % J : j) * H + j] = 4.0f;
    }
    return p;
}

/* The rule is learned: every predicted expert is used, LRU's misses of layers 1..L-1 turn
 * into hits; scrambled, the prefetches are wasted. */
static void check_rule(int *harness_failed, const fmoe_sim_workload *w) {
    fmoe_predictor *good = rule_predictor(0), *bad = rule_predictor(1);
    fmoe_sim_result lru, pm, scr;
    run(w, "lru", NULL, SLOTS, &lru);
    run(w, "promoe", good, SLOTS, &pm);
    run(w, "promoe", bad, SLOTS, &scr);
    printf("  lru %lld hits; promoe %lld hits, %lld prefetches, precision %.3f; scrambled "
           "%lld hits, precision %.3f\n",
           (long long)lru.hits, (long long)pm.hits, (long long)pm.prefetches,
           pm.prefetch_precision, (long long)scr.hits, scr.prefetch_precision);
    ASSERT_EQ(pm.accesses, lru.accesses);
    ASSERT_EQ(scr.accesses, lru.accesses);
    ASSERT_EQ(pm.prefetch_distance, 1); /* the predictor's stride */
    ASSERT_TRUE(pm.prefetches > 0);
    ASSERT_TRUE(pm.hits > lru.hits + lru.accesses / 4);
    ASSERT_TRUE(pm.prefetch_precision >= 0.95);
    ASSERT_TRUE(scr.prefetches > 0);
    /* chance alone: a wrong top-1 hits another token's expert of a batched iteration */
    ASSERT_TRUE(scr.prefetch_precision < 0.5 * pm.prefetch_precision);
    ASSERT_TRUE(scr.hits < pm.hits);
    /* layer 0 has no predictor: its prefetches are none */
    ASSERT_EQ(pm.per_layer[0].prefetches, 0);
    fmoe_sim_result_free(&lru);
    fmoe_sim_result_free(&pm);
    fmoe_sim_result_free(&scr);
    fmoe_predictor_free(good);
    fmoe_predictor_free(bad);
}

TEST(promoe_learns_the_rule_unbatched) {
    fmoe_sim_workload w;
    build(&w, 1);
    check_rule(harness_failed, &w);
    fmoe_sim_workload_free(&w);
}

/* --batch: the gather copies each token's gate inputs with its routing, so the rule holds
 * row by row in the batched workload, and promoe still learns it there. */
TEST(promoe_learns_the_rule_batched) {
    fmoe_sim_workload w, b;
    build(&w, 1);
    ASSERT_OK(fmoe_sim_workload_batch(&b, &w, 4, FMOE_BATCH_TOKENS, NULL, NULL));
    ASSERT_EQ(b.hidden_dim, J);
    ASSERT_TRUE(b.hidden != NULL);
    ASSERT_EQ(b.num_tokens, w.num_tokens);
    for (int64_t t = 0; t < b.num_tokens; t++)
        for (int l = 0; l + 1 < L; l++) {
            const float *row = b.hidden + ((size_t)t * L + l) * J;
            const int hot = (int)b.experts[((size_t)t * L + l + 1) * K];
            ASSERT_EQ(row[hot], 1.0f);
        }
    check_rule(harness_failed, &b);
    fmoe_sim_workload_free(&b);
    fmoe_sim_workload_free(&w);
}

/* Without gate inputs the simulator refuses, naming --hidden; without a predictor init
 * refuses; and a promoe that gets no gate inputs (live executors for now) is exactly lru. */
TEST(promoe_without_inputs) {
    fmoe_sim_workload w;
    build(&w, 0);
    fmoe_predictor *p = rule_predictor(0);
    const fmoe_sim_costs k = costs();
    fmoe_sim_config cfg = {.policy = "promoe", .cache_experts = SLOTS, .costs = &k,
                           .predictor = p};
    fmoe_sim_result r;
    ASSERT_EQ(fmoe_sim_run(&w, &cfg, &r), FMOE_EUNSUPPORTED);
    ASSERT_CONTAINS(fmoe_error_detail(), "record the trace with 'fmoe record --hidden'");

    fmoe_policy pol;
    fmoe_policy_config pc = {.num_layers = L, .num_experts = J, .top_k = K, .capacity = SLOTS};
    ASSERT_EQ(fmoe_policy_init(&pol, "promoe", &pc), FMOE_EINVAL);
    ASSERT_CONTAINS(fmoe_error_detail(), "policy promoe needs a predictor");
    pc.predictor = p;
    pc.prefetch_distance = 2;
    ASSERT_EQ(fmoe_policy_init(&pol, "promoe", &pc), FMOE_EINVAL);
    ASSERT_CONTAINS(fmoe_error_detail(), "stride");
    pc.prefetch_distance = 0;
    pc.num_experts = J + 1;
    ASSERT_EQ(fmoe_policy_init(&pol, "promoe", &pc), FMOE_EMISMATCH);

    /* without gate inputs promoe predicts nothing: in the executors' plain order (its
     * reordered compute off) it is exactly lru */
    fmoe_policy_ops blind = *fmoe_policy_find("promoe");
    blind.flags &= ~(uint32_t)(FMOE_POLICY_NEEDS_HIDDEN | FMOE_POLICY_REORDER_COMPUTE);
    cfg.policy = NULL;
    cfg.ops = &blind;
    fmoe_sim_result lru;
    ASSERT_OK(fmoe_sim_run(&w, &cfg, &r));
    run(&w, "lru", NULL, SLOTS, &lru);
    ASSERT_EQ(r.hits, lru.hits);
    ASSERT_EQ(r.misses, lru.misses);
    ASSERT_EQ(r.prefetches, 0);
    ASSERT_NEAR(r.e2e_s.mean, lru.e2e_s.mean, 1e-12);
    fmoe_sim_result_free(&r);
    fmoe_sim_result_free(&lru);
    fmoe_predictor_free(p);
    fmoe_sim_workload_free(&w);
}

int main(int argc, char **argv) { return RUN_TESTS(argc, argv); }
