/*
 * test_fmoe_policy.c - the fmoe policy family (lib/policies/fmoe.c) driven event by event
 * with a recording sink: what it prefetches, with which priority, what it evicts, and
 * when it holds prefetches back.
 */
#include <string.h>

#include "fmoe/cache.h"
#include "fmoe/error.h"
#include "fmoe/expertmap.h"
#include "fmoe/policy.h"
#include "fmoe/routing.h"
#include "harness.h"

enum { L = 3, J = 4, K = 1, H = 2 };

typedef struct rec {
    int n;
    int32_t layer[64], expert[64];
    double priority[64];
} rec;

static int rec_prefetch(void *ctx, int32_t l, int32_t j, double pri, double value) {
    (void)value;
    rec *r = ctx;
    if (r->n < 64) {
        r->layer[r->n] = l;
        r->expert[r->n] = j;
        r->priority[r->n] = pri;
        r->n++;
    }
    return 0;
}
static void nop_lj(void *ctx, int32_t l, int32_t j) {
    (void)ctx;
    (void)l;
    (void)j;
}

typedef struct rig {
    fmoe_expertmap *store;
    fmoe_cache *cache;
    rec rec;
    fmoe_policy_sink sink;
    fmoe_policy_env env;
    fmoe_policy p;
} rig;

/* Two stored maps: entry 0 uses expert 0 at every layer, entry 1 expert 2 at layer 0 and
 * then expert 3 (0.7) with expert 1 (0.3) second. Embeddings (1,0) and (0,1). */
static int rig_init(rig *g, const char *policy, int32_t mode, int32_t capacity, int32_t d,
                    int32_t sem_dim) {
    memset(g, 0, sizeof *g);
    const fmoe_expertmap_config sc = {.capacity = 8, .num_layers = L, .num_experts = J,
                                      .top_k = K, .semantic_dim = H, .prefetch_distance = 1};
    int rc = fmoe_expertmap_init(&g->store, &sc);
    if (rc < 0) return rc;
    const float m0[L * J] = {1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0};
    const float m1[L * J] = {0, 0, 1, 0, 0, .3f, 0, .7f, 0, .3f, 0, .7f};
    const float s0[H] = {1, 0}, s1[H] = {0, 1};
    if ((rc = fmoe_expertmap_set(g->store, 0, s0, m0, 0)) < 0 ||
        (rc = fmoe_expertmap_set(g->store, 1, s1, m1, 0)) < 0)
        return rc;
    if ((rc = fmoe_cache_init(&g->cache, L, J, capacity)) < 0) return rc;
    g->sink = (fmoe_policy_sink){.ctx = &g->rec, .prefetch = rec_prefetch, .cancel = nop_lj,
                                 .pin = nop_lj, .unpin = nop_lj, .compute_on_host = nop_lj};
    g->env = (fmoe_policy_env){.now_s = 0, .cache = fmoe_cache_view_of(g->cache), .sink = &g->sink};
    static const char *const modes[] = {"offline", "online", "offline-update"};
    fmoe_policy_settings set = {0};
    if ((rc = fmoe_policy_settings_set(&set, "store_mode", modes[mode])) < 0) return rc;
    const fmoe_policy_config pc = {.num_layers = L, .num_experts = J, .top_k = K,
                                   .capacity = capacity, .prefetch_distance = d,
                                   .probs_kind = FMOE_PROBS_FULL,
                                   .expert_store = mode == FMOE_STORE_ONLINE ? NULL : g->store,
                                   .settings = &set, .semantic_dim = sem_dim};
    return fmoe_policy_init(&g->p, policy, &pc);
}

static void rig_free(rig *g) {
    fmoe_policy_free(&g->p);
    fmoe_cache_free(g->cache);
    fmoe_expertmap_free(g->store);
}

/* One token's gate at layer l with probabilities row[J]; chosen = argmax. */
static void gate(rig *g, int32_t l, const float *row) {
    uint16_t chosen = 0;
    for (int j = 1; j < J; j++)
        if (row[j] > row[chosen]) chosen = (uint16_t)j;
    const int32_t distinct = chosen;
    const fmoe_gate_event ev = {.layer = l, .num_tokens = 1, .chosen = &chosen,
                                .chosen_stride = K, .probs = row, .probs_stride = J,
                                .distinct = &distinct, .num_distinct = 1,
                                .probs_kind = FMOE_PROBS_FULL, .group = -1, .position = -1};
    g->p.ops->on_gate(g->p.state, &g->env, &ev);
}

static void start(rig *g, const float *sem) {
    const fmoe_iteration_event it = {.phase = 1, .num_tokens = 1, .semantic = sem,
                                     .semantic_dim = sem ? H : 0, .group = -1, .position = -1};
    g->p.ops->on_iteration_start(g->p.state, &g->env, &it);
}

static void resident(rig *g, int32_t l, int32_t j) {
    const int32_t s = fmoe_cache_free_slot(g->cache);
    fmoe_cache_insert(g->cache, s, l * J + j, FMOE_SLOT_RESIDENT);
}

TEST(fmoe_trajectory_plans_layer_l_plus_d_with_priority) {
    rig g;
    ASSERT_OK(rig_init(&g, "fmoe", FMOE_STORE_OFFLINE, 8, 1, 0));
    start(&g, NULL); /* no embeddings: layer 0 from popularity (experts 0 and 2, one each) */
    ASSERT_EQ(g.rec.n, 1);
    ASSERT_EQ(g.rec.layer[0], 0);
    ASSERT_EQ(g.rec.expert[0], 0); /* tie between 0 and 2: the lower index */
    ASSERT_NEAR(g.rec.priority[0], 0.5 / (0 - -1), 1e-9);
    g.rec.n = 0;
    resident(&g, 0, 2);
    /* layer 0 routes like entry 1 (cosine 1): score 1 -> delta 0 -> K = 1 expert of
     * entry 1's row 1, expert 3 (p 0.7), priority 0.7 / (1 - 0) */
    const float r0[J] = {0, 0, 1, 0};
    gate(&g, 0, r0);
    ASSERT_EQ(g.rec.n, 1);
    ASSERT_EQ(g.rec.layer[0], 1);
    ASSERT_EQ(g.rec.expert[0], 3);
    ASSERT_NEAR(g.rec.priority[0], 0.7, 1e-6);
    rig_free(&g);
}

TEST(fmoe_delta_selection_widens_on_a_poor_match) {
    rig g;
    ASSERT_OK(rig_init(&g, "fmoe", FMOE_STORE_OFFLINE, 8, 1, 0));
    start(&g, NULL);
    resident(&g, 0, 1);
    /* row 0 = (0, 1, 0.25, 0) routes to expert 1 (resident: no miss). Its cosine with
     * entry 1's row 0 (expert 2) is 0.25 / 1.03 = 0.24, with entry 0's 0: best entry 1 at
     * score 0.24 -> delta 0.76 of row 1 {3: 0.7, 1: 0.3}: 0.7 < 0.76, so expert 1 too.
     * (A score of 0.45 would give delta 0.55 and expert 3 alone.) fmoe-map-t, without
     * delta, takes K = 1. */
    const float r0[J] = {0, 1, 0.25f, 0};
    g.rec.n = 0;
    gate(&g, 0, r0);
    ASSERT_EQ(g.rec.n, 2);
    ASSERT_EQ(g.rec.expert[0], 3);
    ASSERT_EQ(g.rec.expert[1], 1);
    ASSERT_NEAR(g.rec.priority[1], 0.3, 1e-6);
    rig_free(&g);
    ASSERT_OK(rig_init(&g, "fmoe-map-t", FMOE_STORE_OFFLINE, 8, 1, 0));
    start(&g, NULL);
    resident(&g, 0, 1);
    g.rec.n = 0;
    gate(&g, 0, r0);
    ASSERT_EQ(g.rec.n, 1); /* K per query, no delta */
    rig_free(&g);
}

TEST(fmoe_semantic_search_plans_the_first_d_layers) {
    rig g;
    ASSERT_OK(rig_init(&g, "fmoe", FMOE_STORE_OFFLINE, 8, 2, H));
    const float sem[H] = {0.1f, 0.9f}; /* nearest: entry 1, cos 0.99 -> K experts */
    start(&g, sem);
    ASSERT_EQ(g.rec.n, 2);
    ASSERT_EQ(g.rec.layer[0], 0);
    ASSERT_EQ(g.rec.expert[0], 2);
    ASSERT_NEAR(g.rec.priority[0], 1.0, 1e-6); /* p 1 at distance 1 */
    ASSERT_EQ(g.rec.layer[1], 1);
    ASSERT_EQ(g.rec.expert[1], 3);
    ASSERT_NEAR(g.rec.priority[1], 0.7 / 2, 1e-6); /* p 0.7 at distance 2 */
    rig_free(&g);
    /* fmoe-map-t ignores embeddings: popularity instead */
    ASSERT_OK(rig_init(&g, "fmoe-map-t", FMOE_STORE_OFFLINE, 8, 2, H));
    start(&g, sem);
    ASSERT_EQ(g.rec.expert[0], 0);
    rig_free(&g);
}

TEST(fmoe_pauses_prefetching_on_a_miss) {
    rig g;
    ASSERT_OK(rig_init(&g, "fmoe", FMOE_STORE_OFFLINE, 8, 1, 0));
    start(&g, NULL);
    g.rec.n = 0;
    const float r0[J] = {0, 0, 1, 0}; /* expert 2 of layer 0 is not cached: a miss */
    gate(&g, 0, r0);
    ASSERT_EQ(g.rec.n, 0); /* held back while the miss loads */
    g.p.ops->on_layer_done(g.p.state, &g.env, 0);
    ASSERT_EQ(g.rec.n, 1); /* resumed */
    ASSERT_EQ(g.rec.expert[0], 3);
    rig_free(&g);
}

TEST(fmoe_evicts_lowest_p_times_freq) {
    rig g;
    ASSERT_OK(rig_init(&g, "fmoe", FMOE_STORE_OFFLINE, 3, 1, 0));
    start(&g, NULL);
    /* resident: (2,3) visited 3 times, (2,1) visited once, (1,0) never */
    resident(&g, 2, 3);
    resident(&g, 2, 1);
    resident(&g, 1, 0);
    const fmoe_cache_view *v = fmoe_cache_view_of(g.cache);
    for (int i = 0; i < 3; i++) fmoe_cache_touch(g.cache, fmoe_cache_lookup(v, 2 * J + 3));
    fmoe_cache_touch(g.cache, fmoe_cache_lookup(v, 2 * J + 1));
    const float r0[J] = {0, 0, 1, 0};
    resident(&g, 0, 2); /* fails: cache full; layer 0 routes to an uncached expert */
    gate(&g, 0, r0); /* best entry 1: p(2,3) = .7, p(2,1) = .3, p(1,0) = 0 */
    /* keep values: (2,3) .7 * 4, (2,1) .3 * 2, (1,0) 1e-6 * 1 -> (1,0) goes */
    const fmoe_victim_request req = {.incoming = 0 * J + 2, .kind = FMOE_LOAD_DEMAND};
    const int32_t victim = g.p.ops->choose_victim(g.p.state, &g.env, &req);
    ASSERT_EQ(v->slot_expert[victim], 1 * J + 0);
    rig_free(&g);
}

TEST(fmoe_online_store_learns) {
    rig g;
    ASSERT_OK(rig_init(&g, "fmoe", FMOE_STORE_ONLINE, 8, 1, 0));
    const float rows[L][J] = {{0, 1, 0, 0}, {0, 0, 1, 0}, {1, 0, 0, 0}};
    for (int it = 0; it < 2; it++) {
        g.rec.n = 0;
        start(&g, NULL);
        for (int l = 0; l < L; l++) {
            gate(&g, l, rows[l]);
            g.p.ops->on_layer_done(g.p.state, &g.env, l);
        }
        const fmoe_iteration_event e = {.num_tokens = 1};
        g.p.ops->on_iteration_end(g.p.state, &g.env, &e);
    }
    /* the second iteration matched the first one's map: layer 1 planned expert 2 and
     * layer 2 expert 0 */
    int saw12 = 0, saw20 = 0;
    for (int i = 0; i < g.rec.n; i++) {
        saw12 |= g.rec.layer[i] == 1 && g.rec.expert[i] == 2;
        saw20 |= g.rec.layer[i] == 2 && g.rec.expert[i] == 0;
    }
    ASSERT_TRUE(saw12 && saw20);
    rig_free(&g);
}

TEST(fmoe_refuses_bad_setups) {
    rig g;
    ASSERT_EQ(rig_init(&g, "fmoe", FMOE_STORE_OFFLINE, 8, 3, 0), FMOE_EINVAL); /* d >= L */
    ASSERT_CONTAINS(fmoe_error_detail(), "prefetch distance 3");
    rig_free(&g);
    fmoe_policy p;
    const fmoe_policy_config pc = {.num_layers = L, .num_experts = J, .top_k = K, .capacity = 4,
                                   .prefetch_distance = 1, .probs_kind = FMOE_PROBS_FULL};
    ASSERT_EQ(fmoe_policy_init(&p, "fmoe", &pc), FMOE_EINVAL); /* offline, no store */
    ASSERT_CONTAINS(fmoe_error_detail(), "needs an expert-map store");
    fmoe_policy_settings online = {0};
    ASSERT_OK(fmoe_policy_settings_set(&online, "store_mode", "online"));
    const fmoe_policy_config none = {.num_layers = L, .num_experts = J, .top_k = K, .capacity = 4,
                                     .prefetch_distance = 1, .probs_kind = FMOE_PROBS_NONE,
                                     .settings = &online};
    /* ids-only routing (no probabilities): fmoe takes each chosen expert at 1/K */
    ASSERT_OK(fmoe_policy_init(&p, "fmoe", &none));
    fmoe_policy_free(&p);
    ASSERT_OK(fmoe_policy_init(&p, "fmoe-hitcount", &none)); /* counts need no probs */
    fmoe_policy_free(&p);
    /* a store of another geometry */
    fmoe_expertmap *s = NULL;
    const fmoe_expertmap_config sc = {.capacity = 2, .num_layers = L, .num_experts = J + 1,
                                      .top_k = K, .prefetch_distance = 1};
    ASSERT_OK(fmoe_expertmap_init(&s, &sc));
    fmoe_policy_config bad = pc;
    bad.expert_store = s;
    ASSERT_EQ(fmoe_policy_init(&p, "fmoe", &bad), FMOE_EMISMATCH);
    ASSERT_CONTAINS(fmoe_error_detail(), "3 layers x 5 experts");
    fmoe_expertmap_free(s);
}

int main(int argc, char **argv) { return RUN_TESTS(argc, argv); }
