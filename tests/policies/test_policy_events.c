/*
 * test_policy_events.c - policy decisions on hand-worked traces, driven event by event:
 * iterations, gates (with speculative rows), accesses, layer ends, request ends. The
 * driver is a zero-time executor over lib/ alone (the executors' per-layer sequence,
 * fmoe_slots_run_layer): a prefetch lands at once (resident), a miss loads at once, so the
 * tests see decisions, not timing (tests/sim checks timing).
 * It also lets a test set the cache's contents, to start from a paper figure's state.
 *
 * The centrepiece is Fig. 6 of the MoE-Infinity paper ("MoE-Infinity: Efficient MoE Inference
 * on Personal Machines with Sparsity-Aware Expert Cache", arXiv 2401.14361 v3, §4.7,
 * Algorithm 1 "Expert Cache Retrieval").
 */
#include "harness.h"

#include "fmoe/cache.h"
#include "fmoe/error.h"
#include "fmoe/policy.h"
#include "fmoe/slots.h"
#include "fmoe/routing.h"

#define MAXLOG 256
#define MAXJ 64 /* experts per layer in these tests */

typedef struct driver {
    fmoe_slots *slots;              /* the executors' slot protocol, with zero-time transfers */
    const fmoe_cache_view *view;
    fmoe_policy policy;
    fmoe_policy_env *env;
    int32_t L, J, K;
    int64_t request;
    /* logs */
    int n_access;
    int32_t access_expert[MAXLOG];  /* expert id */
    int access_result[MAXLOG];      /* fmoe_access_result */
    int32_t access_victim[MAXLOG];  /* expert evicted for it, -1 none */
    int n_prefetch;
    int32_t prefetch_expert[MAXLOG];
    int32_t prefetch_victim[MAXLOG]; /* -1 none; -2 dropped */
    int prefetch_at[MAXLOG];        /* accesses resolved before it (n_access then) */
    int n_cancel;
    int prefetch_hits;
    int error;
} driver;

static void drv_decision(void *ctx, const fmoe_decision *x) {
    driver *d = ctx;
    const int32_t e = x->layer * d->J + x->expert;
    switch (x->kind) {
    case FMOE_DECISION_PREFETCH:
    case FMOE_DECISION_DROPPED:
        if (d->n_prefetch < MAXLOG) {
            d->prefetch_expert[d->n_prefetch] = e;
            d->prefetch_victim[d->n_prefetch] = x->kind == FMOE_DECISION_DROPPED ? -2 : x->victim;
            d->prefetch_at[d->n_prefetch] = d->n_access;
            d->n_prefetch++;
        }
        break;
    case FMOE_DECISION_CANCEL: d->n_cancel++; break;
    default: break;
    }
}

/* An access resolved by the per-layer sequence: logged. Transfers take no time, so a
 * claimed prefetch (never left here: drv_queued lands each at once) would be a hit. */
static double drv_placed(void *ctx, const fmoe_slots_resolved *a) {
    driver *d = ctx;
    d->prefetch_hits += a->prefetch_hit;
    if (d->n_access < MAXLOG) {
        d->access_expert[d->n_access] = a->layer * d->J + a->expert;
        d->access_result[d->n_access] = a->result;
        d->access_victim[d->n_access] = a->victim;
        d->n_access++;
    }
    return 0;
}

/* A queued prefetch lands at once. */
static void drv_queued(void *ctx) {
    driver *d = ctx;
    int32_t s;
    while ((s = fmoe_slots_next_prefetch(d->slots, NULL, NULL)) >= 0) {
        fmoe_slots_chunk_start(d->slots, s);
        fmoe_slots_chunk_done(d->slots, s);
    }
}

static int drv_init(driver *d, const char *name, int32_t L, int32_t J, int32_t K, int32_t cap,
                    int32_t distance, int32_t spec_depth, int32_t store) {
    memset(d, 0, sizeof *d);
    d->L = L;
    d->J = J;
    d->K = K;
    /* store: moe-infinity's EAMC entries (its setting eamc_capacity), 0: the default */
    fmoe_policy_settings set = {0};
    char v[16];
    snprintf(v, sizeof v, "%d", (int)store);
    if (store > 0 && fmoe_policy_settings_set(&set, "eamc_capacity", v) < 0) return FMOE_EINVAL;
    const fmoe_policy_config cfg = {.num_layers = L, .num_experts = J, .top_k = K,
                                    .capacity = cap, .prefetch_distance = distance,
                                    .speculative_depth = spec_depth, .settings = &set};
    int rc = fmoe_policy_init(&d->policy, name, &cfg);
    if (rc < 0) return rc;
    /* the policy's default feedback (moe-infinity-fb: on; the slots' gate hook runs it) */
    const fmoe_slots_config sc = {.num_layers = L, .num_experts = J, .capacity = cap,
                                  .chunks = 1, .expert_bytes = 1, .policy = &d->policy,
                                  .feedback = fmoe_policy_feedback(d->policy.ops, 0),
                                  .hooks = {.ctx = d, .queued = drv_queued,
                                            .decision = drv_decision}};
    rc = fmoe_slots_init(&d->slots, &sc);
    if (rc < 0) return rc;
    d->view = fmoe_slots_view(d->slots);
    d->env = fmoe_slots_env(d->slots);
    return 0;
}

static void drv_free(driver *d) {
    fmoe_slots_free(d->slots);
    fmoe_policy_free(&d->policy);
}

/* Empties the cache and loads `ids` (expert ids) in order, touching each once, so the
 * first is the least recently used. */
static void drv_set_cache(driver *d, const int32_t *ids, int n) {
    if (fmoe_slots_preload(d->slots, ids, n) < 0) d->error = 1;
}

/* One request of n tokens: phase[n], chosen[n][L][K], spec[n][L][S][J] (or NULL).
 * Iterations per docs/design.md §7.1. */
static void drv_request(driver *d, int n, const uint8_t *phase, const uint16_t *chosen,
                        const float *spec, int32_t S) {
    const int32_t L = d->L, J = d->J, K = d->K;
    const fmoe_policy_ops *ops = d->policy.ops;
    void *st = d->policy.state;
    const fmoe_slots_executor x = {.ctx = d, .placed = drv_placed};
    int32_t one_token[MAXJ]; /* each token of the hand-worked traces counts as one */
    if (J > MAXJ) {
        d->error = 1;
        return;
    }
    for (int32_t j = 0; j < MAXJ; j++) one_token[j] = 1;
    const fmoe_request_event rev = {.index = d->request, .id = d->request};
    if (ops->on_request_start) ops->on_request_start(st, d->env, &rev);
    int t = 0;
    while (t < n) {
        int e = t + 1;
        if (phase[t] == FMOE_PHASE_PREFILL)
            while (e < n && phase[e] == FMOE_PHASE_PREFILL) e++;
        const fmoe_iteration_event iev = {.request = d->request, .phase = phase[t] ? 1 : 0,
                                          .num_tokens = e - t, .group = -1, .position = -1};
        if (ops->on_iteration_start) ops->on_iteration_start(st, d->env, &iev);
        for (int32_t l = 0; l < L; l++) {
            int32_t distinct[64], nd = 0;
            for (int u = t; u < e; u++)
                for (int32_t k = 0; k < K; k++) {
                    const int32_t j = chosen[((size_t)u * L + l) * K + k];
                    int seen = 0;
                    for (int32_t q = 0; q < nd; q++) seen |= distinct[q] == j;
                    if (!seen) distinct[nd++] = j;
                }
            const fmoe_gate_event gev = {
                .layer = l, .num_tokens = e - t,
                .chosen = chosen + ((size_t)t * L + l) * K, .chosen_stride = (int64_t)L * K,
                .distinct = distinct, .num_distinct = nd, .phase = iev.phase,
                .speculative = spec ? spec + ((size_t)t * L + l) * (size_t)S * J : NULL,
                .speculative_stride = (int64_t)L * S * J, .speculative_depth = spec ? S : 0,
                .group = -1, .position = -1};
            /* the executors' per-layer sequence, with zero-time transfers */
            const fmoe_slots_layer layer = {.now = 0, .gate = &gev, .tokens = one_token};
            if (fmoe_slots_run_layer(d->slots, &layer, &x) < 0 ||
                fmoe_slots_layer_done(d->slots, l, 0) < 0)
                d->error = 1;
        }
        if (ops->on_iteration_end) ops->on_iteration_end(st, d->env, &iev);
        t = e;
    }
    if (ops->on_request_end) ops->on_request_end(st, d->env, &rev);
    d->request++;
}

/* Decode-only request from a [n][L] table of single choices (K = 1). */
static void drv_decode(driver *d, int n, const uint16_t *chosen) {
    uint8_t phase[64];
    for (int i = 0; i < n; i++) phase[i] = FMOE_PHASE_DECODE;
    drv_request(d, n, phase, chosen, NULL, 0);
}

static int cached(const driver *d, int32_t e) { return fmoe_cache_lookup(d->view, e) >= 0; }

/* ------------------------------------------------------------------ MoE-Infinity Fig. 6 */

/* The paper's 3 layers x 2 experts, E[l,j] 1-based: expert id (l-1)*2 + (j-1). */
#define E(l, j) (((l) - 1) * 2 + ((j) - 1))

/* The request-level EAM [[1,2],[0,3],[0,3]] of Fig. 6, as a finished request: three decode
 * tokens routed E[1,1] E[2,2] E[3,2], then twice E[1,2] E[2,2] E[3,2]. */
static const uint16_t FIG6_HISTORY[3 * 3] = {0, 1, 1, 1, 1, 1, 1, 1, 1};
/* The current decode iteration of Fig. 6: the token goes E[1,1] -> E[2,2] -> E[3,2]. */
static const uint16_t FIG6_TOKEN[3] = {0, 1, 1};
/* The buffer (2 slots) before the iteration: E[2,2] and E[3,1], E[3,1] used last. Every
 * column of the figure follows from it: LRU turns it into (E[1,1], E[3,1]), the figure's
 * first state, and MoE-Infinity into (E[1,1], E[2,2]). */
static const int32_t FIG6_BUFFER[2] = {E(2, 2), E(3, 1)};

TEST(moe_infinity_fig6_keeps_e22_and_prefetches_e32) {
    driver d;
    ASSERT_OK(drv_init(&d, "moe-infinity", 3, 2, 1, 2, 1, 0, 0));
    drv_decode(&d, 3, FIG6_HISTORY); /* the EAMC now holds [[1,2],[0,3],[0,3]] */
    drv_set_cache(&d, FIG6_BUFFER, 2);
    d.n_access = d.n_prefetch = d.prefetch_hits = 0;
    drv_decode(&d, 1, FIG6_TOKEN);
    ASSERT_EQ(d.error, 0);
    ASSERT_EQ(d.n_access, 3);
    /* Layer 1: E[1,1] misses; Algorithm 1 evicts E[3,1] (p ~ eps) and keeps E[2,2]
     * (p = 3/3 * (1 - 1/3) = 2/3). */
    ASSERT_EQ(d.access_expert[0], E(1, 1));
    ASSERT_EQ(d.access_result[0], FMOE_ACCESS_MISS);
    ASSERT_EQ(d.access_victim[0], E(3, 1));
    /* After R2 the pEAM predicts E[3,2] for layer 3; the prefetch evicts E[1,1]
     * (p = 1/3 * 1 against E[3,2]'s 3/3 * (1 - 2/3)), not E[2,2] which the token needs. */
    ASSERT_EQ(d.n_prefetch, 1);
    ASSERT_EQ(d.prefetch_expert[0], E(3, 2));
    ASSERT_EQ(d.prefetch_victim[0], E(1, 1));
    /* Both later accesses hit: E[2,2] kept, E[3,2] prefetched. */
    ASSERT_EQ(d.access_expert[1], E(2, 2));
    ASSERT_EQ(d.access_result[1], FMOE_ACCESS_HIT);
    ASSERT_EQ(d.access_expert[2], E(3, 2));
    ASSERT_EQ(d.access_result[2], FMOE_ACCESS_HIT);
    ASSERT_EQ(d.prefetch_hits, 1);
    ASSERT_TRUE(cached(&d, E(2, 2)) && cached(&d, E(3, 2)));
    drv_free(&d);
}

/* Fig. 6 (a): "LRU with dependency prefetch" (DeepSpeed-Inference): after each layer the
 * next layer's experts are prefetched in index order (here the first fits), LRU eviction,
 * a prefetched expert counting as used when it lands. A test-local policy. */
static int dep_init(void **s, const fmoe_policy_config *c) {
    (void)c;
    *s = NULL;
    return 0;
}
static void dep_layer_done(void *s, const fmoe_policy_env *env, int32_t l) {
    (void)s;
    if (l + 1 < env->cache->num_layers) env->sink->prefetch(env->sink->ctx, l + 1, 0, 1, 1);
}
static int32_t dep_victim(void *s, const fmoe_policy_env *env, const fmoe_victim_request *in) {
    (void)s;
    (void)in;
    const fmoe_cache_view *v = env->cache;
    int32_t best = -1;
    for (int32_t k = 0; k < v->capacity; k++) {
        if (!fmoe_cache_evictable(v, k)) continue;
        if (best < 0 || v->slot_last_access[k] < v->slot_last_access[best] ||
            (v->slot_last_access[k] == v->slot_last_access[best] &&
             v->slot_loaded_at[k] < v->slot_loaded_at[best]))
            best = k;
    }
    return best;
}
static const fmoe_policy_ops lru_dependency = {
    .name = "lru-dependency", .init = dep_init, .on_layer_done = dep_layer_done,
    .choose_victim = dep_victim,
};

TEST(moe_infinity_fig6_lru_column_misses_both) {
    driver d;
    ASSERT_OK(drv_init(&d, "lru", 3, 2, 1, 2, 0, 0, 0));
    const fmoe_policy_config cfg = {.num_layers = 3, .num_experts = 2, .top_k = 1, .capacity = 2};
    fmoe_policy_free(&d.policy);
    ASSERT_OK(fmoe_policy_init_ops(&d.policy, &lru_dependency, &cfg));
    drv_set_cache(&d, FIG6_BUFFER, 2);
    drv_decode(&d, 1, FIG6_TOKEN);
    /* E[1,1] evicts E[2,2] (least recent): buffer (E[1,1], E[3,1]). */
    ASSERT_EQ(d.access_victim[0], E(2, 2));
    /* Prefetching E[2,1] evicts E[3,1]; the token routes to E[2,2]: miss. */
    ASSERT_EQ(d.prefetch_expert[0], E(2, 1));
    ASSERT_EQ(d.prefetch_victim[0], E(3, 1));
    ASSERT_EQ(d.access_result[1], FMOE_ACCESS_MISS);
    ASSERT_EQ(d.access_victim[1], E(1, 1)); /* buffer (E[2,1], E[2,2]) */
    /* Prefetching E[3,1] evicts E[2,1]; layer 3 misses E[3,2]. */
    ASSERT_EQ(d.prefetch_expert[1], E(3, 1));
    ASSERT_EQ(d.prefetch_victim[1], E(2, 1));
    ASSERT_EQ(d.access_expert[2], E(3, 2));
    ASSERT_EQ(d.access_result[2], FMOE_ACCESS_MISS);
    drv_free(&d);
}

TEST(moe_infinity_without_history_uses_location_only) {
    /* Empty EAMC: no prediction, no prefetch; eviction p = (1 - l/L) / J, so the expert of
     * the deepest layer goes first (initial layers have caching priority, MoE-Infinity §4.6). */
    driver d;
    ASSERT_OK(drv_init(&d, "moe-infinity", 3, 2, 1, 2, 1, 0, 0));
    const int32_t buf[2] = {E(2, 1), E(3, 1)}; /* LRU would evict E[2,1] */
    drv_set_cache(&d, buf, 2);
    const uint16_t tok[3] = {0, 0, 0};
    drv_decode(&d, 1, tok);
    ASSERT_EQ(d.n_prefetch, 0);
    ASSERT_EQ(d.access_victim[0], E(3, 1));
    ASSERT_EQ(d.access_result[1], FMOE_ACCESS_HIT);
    drv_free(&d);
}

TEST(moe_infinity_eamc_replaces_most_similar) {
    /* Capacity 2 (App. B.1, Fig. 10): A = layer 0 e0, layer 1 e1 (x3); B = e2, e3 (x3);
     * C = e2, e2 (x3) is closer to B (cos 0.5) than to A (0): C replaces B, not A. A later
     * request starting at e2 then matches C and prefetches layer 1's e2, not B's e3. */
    driver d;
    ASSERT_OK(drv_init(&d, "moe-infinity", 2, 4, 1, 8, 1, 0, 2));
    const uint16_t A[6] = {0, 1, 0, 1, 0, 1}, B[6] = {2, 3, 2, 3, 2, 3}, C[6] = {2, 2, 2, 2, 2, 2};
    drv_decode(&d, 3, A);
    drv_decode(&d, 3, B);
    drv_decode(&d, 3, C);
    d.n_prefetch = 0;
    const int32_t none[1] = {0};
    drv_set_cache(&d, none, 0);
    const uint16_t D[2] = {2, 0};
    drv_decode(&d, 1, D);
    ASSERT_EQ(d.n_prefetch, 1);
    ASSERT_EQ(d.prefetch_expert[0], 1 * 4 + 2);
    drv_free(&d);
    /* With capacity 3 nothing is replaced; B and C tie on layer 0 (cos 3/sqrt(18)) and the
     * older entry, B, wins: the prefetch is e3. */
    ASSERT_OK(drv_init(&d, "moe-infinity", 2, 4, 1, 8, 1, 0, 3));
    drv_decode(&d, 3, A);
    drv_decode(&d, 3, B);
    drv_decode(&d, 3, C);
    d.n_prefetch = 0;
    drv_set_cache(&d, none, 0);
    drv_decode(&d, 1, D);
    ASSERT_EQ(d.n_prefetch, 1);
    ASSERT_EQ(d.prefetch_expert[0], 1 * 4 + 3);
    drv_free(&d);
}

TEST(moe_infinity_layer_proximity_orders_the_plan) {
    /* Distance 2 from layer 0: layer 1's expert (weight 1 - 1/3) before layer 2's
     * (1 - 2/3), both from the one stored EAM. */
    driver d;
    ASSERT_OK(drv_init(&d, "moe-infinity", 3, 2, 1, 6, 2, 0, 0));
    const uint16_t H[3] = {0, 1, 0};
    drv_decode(&d, 1, H);
    d.n_prefetch = d.n_access = 0;
    const int32_t none[1] = {0};
    drv_set_cache(&d, none, 0);
    drv_decode(&d, 1, H);
    ASSERT_TRUE(d.n_prefetch >= 2);
    ASSERT_EQ(d.prefetch_expert[0], E(2, 2));
    ASSERT_EQ(d.prefetch_expert[1], E(3, 1));
    ASSERT_EQ(d.access_result[1], FMOE_ACCESS_HIT);
    ASSERT_EQ(d.access_result[2], FMOE_ACCESS_HIT);
    drv_free(&d);
}

/* ------------------------------------------------------------------ moe-infinity-fb */

/* Demand first: a gate with a miss issues its plan only after the layer's misses are
 * loaded, so the plan cannot take the link ahead of them; a gate without a miss issues it
 * at once. The faithful moe-infinity issues it at the gate either way. L = 3, J = 2, K = 1,
 * 6 slots (no eviction: feedback admits into free slots). History: one request of tokens
 * E[1,1] E[2,2] E[3,2] and E[1,2] E[2,2] E[3,2]; then, from an empty cache, a token
 * E[1,2] E[2,2] E[3,2]: layer 1 misses, the match plans E[2,2]; layer 2 hits (prefetched)
 * and plans E[3,2] at its gate. */
TEST(moe_infinity_fb_plan_waits_for_the_gates_misses) {
    const uint16_t hist[6] = {0, 1, 1, 1, 1, 1}, tok[3] = {1, 1, 1};
    const int32_t none[1] = {0};
    const char *names[2] = {"moe-infinity", "moe-infinity-fb"};
    for (int v = 0; v < 2; v++) {
        driver d;
        ASSERT_OK(drv_init(&d, names[v], 3, 2, 1, 6, 1, 0, 0));
        drv_decode(&d, 2, hist);
        drv_set_cache(&d, none, 0);
        d.n_access = d.n_prefetch = d.prefetch_hits = 0;
        drv_decode(&d, 1, tok);
        ASSERT_EQ(d.error, 0);
        ASSERT_EQ(d.n_prefetch, 2);
        ASSERT_EQ(d.prefetch_expert[0], E(2, 2));
        ASSERT_EQ(d.access_result[0], FMOE_ACCESS_MISS);
        /* before the miss of E[1,2] (faithful) or after it (fb) */
        ASSERT_EQ(d.prefetch_at[0], v == 0 ? 0 : 1);
        ASSERT_EQ(d.prefetch_expert[1], E(3, 2));
        ASSERT_EQ(d.prefetch_at[1], 1); /* layer 2's gate has no miss: at once */
        ASSERT_EQ(d.access_result[1], FMOE_ACCESS_HIT);
        ASSERT_EQ(d.access_result[2], FMOE_ACCESS_HIT);
        ASSERT_EQ(d.prefetch_hits, 2);
        drv_free(&d);
    }
}

/* Where Algorithm 1 is wrong, the duel turns to recency. One long first request (an empty
 * EAMC: Algorithm 1 ranks by location only, deepest layer out first), 2 layers x 4
 * experts, 3 slots: layer 0 cycles through its 4 experts (never reusable in 2 slots),
 * layer 1 always routes to its expert 0. Algorithm 1 evicts layer 1's expert for every
 * layer-0 miss, so both layers miss at every token; recency keeps it and misses only
 * layer 0. moe-infinity-fb's shadows see this within a few tokens. */
TEST(moe_infinity_fb_duel_turns_to_recency_where_algorithm1_thrashes) {
    enum { T = 48 };
    uint16_t tok[T * 2];
    for (int t = 0; t < T; t++) {
        tok[t * 2] = (uint16_t)(t % 4);
        tok[t * 2 + 1] = 0;
    }
    int layer1_hits[2] = {0, 0};
    const char *names[2] = {"moe-infinity", "moe-infinity-fb"};
    for (int v = 0; v < 2; v++) {
        driver d;
        ASSERT_OK(drv_init(&d, names[v], 2, 4, 1, 3, 1, 0, 0));
        drv_decode(&d, T, tok);
        ASSERT_EQ(d.error, 0);
        ASSERT_EQ(d.n_prefetch, 0); /* no history, no plan */
        ASSERT_EQ(d.n_access, 2 * T);
        for (int t = 0; t < T; t++) layer1_hits[v] += d.access_result[t * 2 + 1] == FMOE_ACCESS_HIT;
        drv_free(&d);
    }
    ASSERT_EQ(layer1_hits[0], 1); /* Algorithm 1: only the second token's (a free slot) */
    ASSERT_TRUE(layer1_hits[1] >= T - 8);
    /* LRU itself, for the record: every layer-1 access after the first hits */
    driver d;
    ASSERT_OK(drv_init(&d, "lru", 2, 4, 1, 3, 0, 0, 0));
    drv_decode(&d, T, tok);
    int lru_hits = 0;
    for (int t = 0; t < T; t++) lru_hits += d.access_result[t * 2 + 1] == FMOE_ACCESS_HIT;
    ASSERT_EQ(lru_hits, T - 1);
    drv_free(&d);
}

/* Where Algorithm 1 is right, the duel keeps it. 3 layers x 2 experts, 2 slots, every
 * token routes to expert 0 of each layer: a cycle of 3 in 2 slots. Recency thrashes (no
 * hit at all); Algorithm 1's location weight keeps layer 0's expert and hits it at every
 * token after the first, and so does moe-infinity-fb. */
TEST(moe_infinity_fb_duel_keeps_algorithm1_on_a_cycle) {
    enum { T = 40 };
    uint16_t tok[T * 3] = {0};
    const char *names[3] = {"lru", "moe-infinity", "moe-infinity-fb"};
    int hits[3] = {0, 0, 0};
    for (int v = 0; v < 3; v++) {
        driver d;
        ASSERT_OK(drv_init(&d, names[v], 3, 2, 1, 2, 1, 0, 0));
        drv_decode(&d, T, tok);
        ASSERT_EQ(d.error, 0);
        for (int i = 0; i < d.n_access; i++) hits[v] += d.access_result[i] == FMOE_ACCESS_HIT;
        drv_free(&d);
    }
    ASSERT_EQ(hits[0], 0);
    ASSERT_EQ(hits[1], T - 1);
    ASSERT_EQ(hits[2], T - 1);
}

/* ------------------------------------------------------------------ least-stale */

TEST(least_stale_hand_worked) {
    /* L=2, J=3 (ids 0..2 layer 0, 3..5 layer 1), one slot pair, decode tokens:
     *   it1 (0, 3): 0m 3m
     *   it2 (1, 3): 1m: 0 and 3 both stale, FIFO -> 0 (loaded first); 3h
     *   it3 (0, 4): 0m: 1 and 3 stale, FIFO -> 3 (loaded at it1, 1 at it2; LRU would
     *               evict 1, used before 3 in it2); 4m: 0 fresh, 1 stale -> 1
     *   it4 (1, 3): 1m: 0, 4 stale -> 0 (loaded first); 3m: 1 fresh, 4 stale -> 4 */
    const uint16_t tok[8] = {0, 0, 1, 0, 0, 1, 1, 0};
    const int32_t want_victim[8] = {-1, -1, 0, -1, 3, 1, 0, 4};
    const int want_result[8] = {0, 0, 0, 1, 0, 0, 0, 0};
    driver d;
    ASSERT_OK(drv_init(&d, "least-stale", 2, 3, 1, 2, 0, 0, 0));
    drv_decode(&d, 4, tok);
    ASSERT_EQ(d.n_access, 8);
    for (int i = 0; i < 8; i++) {
        ASSERT_EQ(d.access_victim[i], want_victim[i]);
        ASSERT_EQ(d.access_result[i], want_result[i]);
    }
    drv_free(&d);
    /* LRU on the same trace evicts 1 at it3 (the difference). */
    ASSERT_OK(drv_init(&d, "lru", 2, 3, 1, 2, 0, 0, 0));
    drv_decode(&d, 4, tok);
    ASSERT_EQ(d.access_victim[4], 1);
    drv_free(&d);
}

TEST(least_stale_all_fresh_is_fifo) {
    /* One prefill iteration over 3 layers with 2 slots: every cached expert is fresh, so
     * the first loaded goes. */
    const uint16_t tok[3] = {1, 1, 1};
    const uint8_t phase[1] = {FMOE_PHASE_PREFILL};
    driver d;
    ASSERT_OK(drv_init(&d, "least-stale", 3, 2, 1, 2, 0, 0, 0));
    drv_request(&d, 1, phase, tok, NULL, 0);
    ASSERT_EQ(d.access_victim[2], E(1, 2));
    drv_free(&d);
}

/* ------------------------------------------------------------------ mixtral-offload */

TEST(mixtral_offload_prefetches_speculated_top_k_per_layer) {
    /* L=3, J=4, K=1, 3 slots: one per layer. Speculative rows (S=1) of each token predict
     * the next layer: right for layer 1, wrong for layer 2. */
    const int32_t L = 3, J = 4, S = 1;
    const uint16_t tok[3] = {0, 2, 3};
    float spec[3 * 1 * 4] = {0};
    spec[0 * J + 2] = 0.9f; /* layer 0 predicts layer 1: e2 (right) */
    spec[1 * J + 1] = 0.7f; /* layer 1 predicts layer 2: e1 (wrong: e3) */
    spec[1 * J + 3] = 0.2f;
    const uint8_t phase[1] = {FMOE_PHASE_DECODE};
    driver d;
    ASSERT_OK(drv_init(&d, "mixtral-offload", L, J, 1, 3, 1, S, 0));
    drv_request(&d, 1, phase, tok, spec, S);
    ASSERT_EQ(d.n_prefetch, 2);
    ASSERT_EQ(d.prefetch_expert[0], 1 * J + 2);
    ASSERT_EQ(d.prefetch_expert[1], 2 * J + 1);
    ASSERT_EQ(d.access_result[0], FMOE_ACCESS_MISS);
    ASSERT_EQ(d.access_result[1], FMOE_ACCESS_HIT);
    ASSERT_EQ(d.access_result[2], FMOE_ACCESS_MISS);
    /* Per-layer LRU: layer 2's miss replaces layer 2's wrong guess, nothing else. */
    ASSERT_EQ(d.access_victim[2], 2 * J + 1);
    ASSERT_TRUE(cached(&d, 0 * J + 0) && cached(&d, 1 * J + 2) && cached(&d, 2 * J + 3));
    drv_free(&d);
}

TEST(mixtral_offload_share_and_refusal) {
    /* 2 slots for 3 layers: layer 2 owns none; its expert streams through uncached while
     * layers 0 and 1 keep theirs. */
    const uint16_t tok[6] = {0, 0, 0, 0, 0, 0};
    const uint8_t phase[2] = {FMOE_PHASE_DECODE, FMOE_PHASE_DECODE};
    float spec[2 * 3 * 2] = {0};
    driver d;
    ASSERT_OK(drv_init(&d, "mixtral-offload", 3, 2, 1, 2, 1, 1, 0));
    drv_request(&d, 2, phase, tok, spec, 1);
    ASSERT_EQ(d.access_result[3], FMOE_ACCESS_HIT); /* layer 0, second token */
    ASSERT_EQ(d.access_result[4], FMOE_ACCESS_HIT); /* layer 1 */
    ASSERT_EQ(d.access_result[5], FMOE_ACCESS_MISS); /* layer 2: no share */
    drv_free(&d);
    /* No speculative rows in the trace: a one-line refusal saying so. */
    fmoe_policy p;
    const fmoe_policy_config cfg = {.num_layers = 3, .num_experts = 2, .top_k = 1,
                                    .capacity = 2, .prefetch_distance = 1};
    ASSERT_EQ(fmoe_policy_init(&p, "mixtral-offload", &cfg), FMOE_EUNSUPPORTED);
    ASSERT_CONTAINS(fmoe_error_detail(), "policy mixtral-offload needs speculative gate rows");
    ASSERT_CONTAINS(fmoe_error_detail(), "the trace lacks them");
    ASSERT_TRUE(strchr(fmoe_error_detail(), '\n') == NULL);
    /* Distance beyond the trace's rows. */
    const fmoe_policy_config cfg2 = {.num_layers = 3, .num_experts = 2, .top_k = 1,
                                     .capacity = 2, .prefetch_distance = 2,
                                     .speculative_depth = 1};
    ASSERT_EQ(fmoe_policy_init(&p, "mixtral-offload", &cfg2), FMOE_EINVAL);
    ASSERT_CONTAINS(fmoe_error_detail(), "reach 1 layer ahead");
}

/* ------------------------------------------------------------------ probabilities */

static const fmoe_policy_ops needs_probs = {
    .name = "needs-probs", .flags = FMOE_POLICY_NEEDS_PROBS, .init = dep_init,
    .choose_victim = dep_victim,
};

TEST(policy_needing_probs_refuses_a_trace_without) {
    fmoe_policy p;
    fmoe_policy_config cfg = {.num_layers = 1, .num_experts = 4, .top_k = 1, .capacity = 2,
                              .probs_kind = FMOE_PROBS_NONE};
    ASSERT_EQ(fmoe_policy_init_ops(&p, &needs_probs, &cfg), FMOE_EUNSUPPORTED);
    ASSERT_STR_EQ(fmoe_error_detail(),
                  "policy needs-probs needs gate probabilities; the trace has none (probs_kind "
                  "none: record or import it with probabilities)");
    cfg.probs_kind = FMOE_PROBS_TOPK; /* accepted (the CLI prints a note) */
    ASSERT_OK(fmoe_policy_init_ops(&p, &needs_probs, &cfg));
    fmoe_policy_free(&p);
}

int main(int argc, char **argv) { return RUN_TESTS(argc, argv); }
