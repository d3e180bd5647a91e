/*
 * test_policies.c - the expert-slot cache and the classic policies on hand-worked access
 * sequences (docs/design.md §7.1), driven by a minimal replay loop that uses only lib/.
 */
#include "harness.h"

#include "fmoe/cache.h"
#include "fmoe/error.h"
#include "fmoe/policy.h"
#include "fmoe/predictor.h"
#include "fmoe/slots.h"
#include "fmoe/routing.h"

typedef struct replay_log {
    int64_t hits;
    int32_t victim; /* of the access just resolved, -1 none */
    int bypassed;   /* a miss the policy left uncached: these caches never should */
} replay_log;

static double replay_placed(void *ctx, const fmoe_slots_resolved *a) {
    replay_log *lg = ctx;
    lg->hits += a->result == FMOE_ACCESS_HIT;
    lg->victim = a->victim;
    lg->bypassed |= a->result == FMOE_ACCESS_MISS && a->slot < 0;
    return 0;
}

/* Replays expert ids seq[0..n) through policy `name` with `cap` slots, each access resolved
 * by the executors' sequence (fmoe_slots_resolve) with transfers that take no time;
 * returns hits, or a negative code. victims[] (optional) receives the evicted expert per
 * access (-1 none). */
static int64_t replay(const char *name, const uint32_t *seq, int64_t n, int32_t L, int32_t J,
                      int32_t cap, int32_t *victims) {
    fmoe_policy p;
    fmoe_policy_config cfg = {.num_layers = L, .num_experts = J, .top_k = 1, .capacity = cap,
                              .future = seq, .future_len = n};
    int rc = fmoe_policy_init(&p, name, &cfg);
    if (rc < 0) return rc;
    replay_log lg = {0, -1, 0};
    fmoe_slots *q = NULL;
    const fmoe_slots_config sc = {.num_layers = L, .num_experts = J, .capacity = cap,
                                  .chunks = 1, .policy = &p};
    rc = fmoe_slots_init(&q, &sc);
    if (rc < 0) {
        fmoe_policy_free(&p);
        return rc;
    }
    const fmoe_slots_executor x = {.ctx = &lg, .placed = replay_placed};
    for (int64_t i = 0; i < n && rc == 0; i++) {
        const int32_t e = (int32_t)seq[i];
        rc = fmoe_slots_resolve(q, &x, e / J, e % J, 1, 0, i);
        if (lg.bypassed && rc == 0) rc = FMOE_EINTERNAL;
        if (victims) victims[i] = lg.victim;
    }
    fmoe_slots_free(q);
    fmoe_policy_free(&p);
    return rc < 0 ? rc : lg.hits;
}

/* ------------------------------------------------------------------ cache */

TEST(cache_insert_evict_touch) {
    fmoe_cache *c = NULL;
    ASSERT_OK(fmoe_cache_init(&c, 2, 4, 3));
    const fmoe_cache_view *v = fmoe_cache_view_of(c);
    ASSERT_EQ(v->capacity, 3);
    ASSERT_EQ(fmoe_cache_free_slot(c), 0);
    ASSERT_OK(fmoe_cache_insert(c, 0, 5, FMOE_SLOT_RESIDENT));
    ASSERT_EQ(fmoe_cache_lookup(v, 5), 0);
    ASSERT_EQ(fmoe_cache_free_slot(c), 1);
    ASSERT_EQ(fmoe_cache_insert(c, 0, 6, FMOE_SLOT_RESIDENT), FMOE_EINVAL); /* not free */
    ASSERT_EQ(fmoe_cache_insert(c, 1, 5, FMOE_SLOT_RESIDENT), FMOE_EINVAL); /* cached */
    ASSERT_EQ(fmoe_cache_insert(c, 1, 8, FMOE_SLOT_RESIDENT), FMOE_EINVAL); /* id >= L*J */
    fmoe_cache_touch(c, 0);
    fmoe_cache_touch(c, 0);
    ASSERT_EQ(v->tick, 2);
    ASSERT_EQ(v->slot_accesses[0], 2);
    ASSERT_EQ(v->slot_last_access[0], 2);
    ASSERT_EQ(v->expert_accesses[5], 2);
    ASSERT_OK(fmoe_cache_pin(c, 0));
    ASSERT_TRUE(!fmoe_cache_evictable(v, 0));
    ASSERT_EQ(fmoe_cache_evict(c, 0), FMOE_EINVAL);
    ASSERT_OK(fmoe_cache_unpin(c, 0));
    ASSERT_EQ(fmoe_cache_unpin(c, 0), FMOE_EINVAL);
    ASSERT_OK(fmoe_cache_evict(c, 0));
    ASSERT_EQ(fmoe_cache_lookup(v, 5), -1);
    ASSERT_EQ(v->expert_accesses[5], 2); /* lifetime count survives eviction */
    ASSERT_EQ(v->used, 0);
    /* Re-inserted: count since load starts again. */
    ASSERT_OK(fmoe_cache_insert(c, 2, 5, FMOE_SLOT_LOADING));
    ASSERT_TRUE(!fmoe_cache_evictable(v, 2));
    ASSERT_OK(fmoe_cache_mark_resident(c, 2));
    ASSERT_TRUE(fmoe_cache_evictable(v, 2));
    ASSERT_EQ(v->slot_accesses[2], 0);
    ASSERT_EQ(v->slot_loaded_at[2], 2);
    fmoe_cache_free(c);
    fmoe_cache_free(NULL);
}

TEST(cache_bad_args) {
    fmoe_cache *c = NULL;
    ASSERT_EQ(fmoe_cache_init(&c, 2, 4, 0), FMOE_EINVAL);
    ASSERT_CONTAINS(fmoe_error_detail(), "at least 1");
    ASSERT_EQ(fmoe_cache_init(&c, 0, 4, 1), FMOE_EINVAL);
    ASSERT_TRUE(c == NULL);
}

TEST(cache_fills_slots_in_order_and_reuses_freed) {
    fmoe_cache *c = NULL;
    ASSERT_OK(fmoe_cache_init(&c, 1, 8, 4));
    for (int32_t e = 0; e < 4; e++) {
        int32_t s = fmoe_cache_free_slot(c);
        ASSERT_EQ(s, e);
        ASSERT_OK(fmoe_cache_insert(c, s, e, FMOE_SLOT_RESIDENT));
    }
    ASSERT_EQ(fmoe_cache_free_slot(c), -1);
    ASSERT_OK(fmoe_cache_evict(c, 2));
    ASSERT_EQ(fmoe_cache_free_slot(c), 2);
    fmoe_cache_reset(c);
    ASSERT_EQ(fmoe_cache_view_of(c)->used, 0);
    ASSERT_EQ(fmoe_cache_free_slot(c), 0);
    fmoe_cache_free(c);
}

TEST(cache_version_changes_with_every_change) {
    fmoe_cache *c = NULL;
    ASSERT_OK(fmoe_cache_init(&c, 1, 8, 2));
    const fmoe_cache_view *v = fmoe_cache_view_of(c);
    uint64_t last = v->version;
#define CHANGED()                                                                                \
    do {                                                                                         \
        ASSERT_TRUE(v->version != last);                                                         \
        last = v->version;                                                                       \
    } while (0)
    ASSERT_OK(fmoe_cache_insert(c, 0, 3, FMOE_SLOT_LOADING));
    CHANGED();
    ASSERT_OK(fmoe_cache_mark_resident(c, 0));
    CHANGED();
    fmoe_cache_touch(c, 0);
    CHANGED();
    fmoe_cache_touch_uncached(c, 5);
    CHANGED();
    ASSERT_OK(fmoe_cache_pin(c, 0));
    CHANGED();
    ASSERT_OK(fmoe_cache_unpin(c, 0));
    CHANGED();
    ASSERT_OK(fmoe_cache_evict(c, 0));
    CHANGED();
    fmoe_cache_reset(c);
    CHANGED();
    /* failed calls and lookups change nothing */
    ASSERT_EQ(fmoe_cache_evict(c, 1), FMOE_EINVAL);
    ASSERT_EQ(fmoe_cache_lookup(v, 3), -1);
    ASSERT_EQ(fmoe_cache_free_slot(c), 0);
    ASSERT_EQ(v->version, last);
#undef CHANGED
    fmoe_cache_free(c);
}

/* ------------------------------------------------------------------ registry */

TEST(registry_names_and_unknown) {
    const fmoe_policy_ops *const *all = NULL;
    size_t n = fmoe_policy_registry(&all);
    ASSERT_TRUE(n > 0);
    /* the names string is the table's names, in order, exactly; each name is found */
    char want[2048] = "";
    for (size_t i = 0; i < n; i++) {
        ASSERT_TRUE(fmoe_policy_find(all[i]->name) == all[i]);
        ASSERT_TRUE(all[i]->init != NULL && all[i]->choose_victim != NULL);
        ASSERT_TRUE(all[i]->summary != NULL && all[i]->summary[0] != '\0');
        ASSERT_TRUE(strlen(all[i]->name) < 32); /* fmoe_policy_names' room per name */
        ASSERT_TRUE(strlen(want) + strlen(all[i]->name) + 2 < sizeof want);
        if (i) strcat(want, ", ");
        strcat(want, all[i]->name);
    }
    ASSERT_STR_EQ(fmoe_policy_names(), want);
    fmoe_policy p;
    fmoe_policy_config cfg = {.num_layers = 1, .num_experts = 4, .top_k = 1, .capacity = 2};
    ASSERT_EQ(fmoe_policy_init(&p, "lruu", &cfg), FMOE_ENOTFOUND);
    char detail[1100];
    snprintf(detail, sizeof detail, "unknown policy 'lruu' (valid: %s)", want);
    ASSERT_STR_EQ(fmoe_error_detail(), detail);
    cfg.capacity = 0;
    ASSERT_EQ(fmoe_policy_init(&p, "lru", &cfg), FMOE_EINVAL);
    ASSERT_CONTAINS(fmoe_error_detail(), "at least 1");
    cfg.capacity = 2;
    ASSERT_EQ(fmoe_policy_init(&p, "belady", &cfg), FMOE_EINVAL); /* no future */
    ASSERT_CONTAINS(fmoe_error_detail(), "future");
}

/* The predictor a policy takes is its table's predictor_kind, one of fmoe/predictor.h's
 * kinds; the registry's list of those policies and its checks follow from the table. */
TEST(registry_predictor_kinds) {
    const fmoe_policy_ops *const *all = NULL;
    size_t n = fmoe_policy_registry(&all);
    size_t takers = 0;
    for (size_t i = 0; i < n; i++) takers += all[i]->predictor_kind != NULL;
    char want[2048] = "";
    fmoe_predictor other = {.num_layers = 2, .num_experts = 4, .top_k = 1};
    strcpy(other.kind, "not-a-kind");
    for (size_t i = 0, k = 0; i < n; i++) {
        const fmoe_policy_ops *ops = all[i];
        ASSERT_TRUE(!fmoe_policy_takes_predictor(ops, NULL));
        ASSERT_TRUE(!fmoe_policy_takes_predictor(ops, "not-a-kind"));
        if (!ops->predictor_kind) continue;
        ASSERT_TRUE(fmoe_predictor_kind_id_of(ops->predictor_kind) >= 0);
        ASSERT_TRUE(fmoe_policy_takes_predictor(ops, ops->predictor_kind));
        strcat(want, k == 0 ? "" : k + 1 == takers ? " and " : ", ");
        strcat(want, ops->name);
        k++;
        /* refused before its init runs: without a predictor, and with one of another kind */
        fmoe_policy p;
        fmoe_policy_config cfg = {.num_layers = 2, .num_experts = 4, .top_k = 1, .capacity = 2,
                                  .probs_kind = FMOE_PROBS_FULL, .speculative_depth = 1};
        ASSERT_EQ(fmoe_policy_init(&p, ops->name, &cfg), FMOE_EINVAL);
        char detail[256];
        snprintf(detail, sizeof detail, "policy %s needs a predictor: train one with 'fmoe "
                 "train-predictor --kind %s'", ops->name, ops->predictor_kind);
        ASSERT_CONTAINS(fmoe_error_detail(), detail);
        cfg.predictor = &other;
        ASSERT_EQ(fmoe_policy_init(&p, ops->name, &cfg), FMOE_EINVAL);
        snprintf(detail, sizeof detail, "policy %s needs a predictor of kind %s, got "
                 "'not-a-kind'", ops->name, ops->predictor_kind);
        ASSERT_CONTAINS(fmoe_error_detail(), detail);
    }
    ASSERT_STR_EQ(fmoe_policy_predictor_names(), want);
    ASSERT_EQ(fmoe_predictor_kind_id_of(FMOE_PREDICTOR_KIND_PROMOE), FMOE_PREDICTOR_PROMOE);
    ASSERT_EQ(fmoe_predictor_kind_id_of(FMOE_PREDICTOR_KIND_DUOSERVE), FMOE_PREDICTOR_DUOSERVE);
    ASSERT_EQ(fmoe_predictor_kind_id_of("not-a-kind"), -1);
    ASSERT_EQ(fmoe_predictor_kind_id_of(NULL), -1);
}

/* ------------------------------------------------------------------ hand-worked traces */

/* Capacity 2, one layer, sequence 0 0 1 2 1 2 0 (worked in the comments):
 *   lru:    0m 0h 1m 2m(evict 0: last t2 < t3) 1h 2h 0m(evict 1)      -> 3 hits
 *   lfu:    0m 0h 1m 2m(evict 1: count 1 < 2) 1m(evict 2) 2m(evict 1) 0h -> 2 hits
 *   belady: 0m 0h 1m 2m(evict 0: next at 6 > 4) 1h 2h 0m(1, 2 never again: LRU -> 1)
 *           -> 3 hits */
static const uint32_t SEQ_A[] = {0, 0, 1, 2, 1, 2, 0};

TEST(lru_hand_worked) {
    int32_t vic[7];
    ASSERT_EQ(replay("lru", SEQ_A, 7, 1, 4, 2, vic), 3);
    const int32_t want[7] = {-1, -1, -1, 0, -1, -1, 1};
    for (int i = 0; i < 7; i++) ASSERT_EQ(vic[i], want[i]);
}

TEST(ondemand_equals_lru) {
    int32_t vic[7];
    ASSERT_EQ(replay("ondemand", SEQ_A, 7, 1, 4, 2, vic), 3);
    ASSERT_EQ(vic[3], 0);
    ASSERT_EQ(vic[6], 1);
}

TEST(lfu_hand_worked) {
    int32_t vic[7];
    ASSERT_EQ(replay("lfu", SEQ_A, 7, 1, 4, 2, vic), 2);
    const int32_t want[7] = {-1, -1, -1, 1, 2, 1, -1};
    for (int i = 0; i < 7; i++) ASSERT_EQ(vic[i], want[i]);
}

TEST(lfu_ties_go_to_least_recent) {
    /* 0 1 2, capacity 2: 0 and 1 both have one access; 0 is older -> evicted. */
    static const uint32_t seq[] = {0, 1, 2, 1};
    int32_t vic[4];
    ASSERT_EQ(replay("lfu", seq, 4, 1, 4, 2, vic), 1);
    ASSERT_EQ(vic[2], 0);
}

TEST(belady_hand_worked) {
    int32_t vic[7];
    ASSERT_EQ(replay("belady", SEQ_A, 7, 1, 4, 2, vic), 3);
    const int32_t want[7] = {-1, -1, -1, 0, -1, -1, 1};
    for (int i = 0; i < 7; i++) ASSERT_EQ(vic[i], want[i]);
}

TEST(belady_beats_lru_on_cyclic) {
    /* 0 1 2 0 1 2, capacity 2: LRU and LFU always evict the next one needed (0 hits);
     * belady evicts 1 at position 2 (next use 4 > 3), then 0 (never again): 2 hits. */
    static const uint32_t seq[] = {0, 1, 2, 0, 1, 2};
    int32_t vic[6];
    ASSERT_EQ(replay("lru", seq, 6, 1, 4, 2, NULL), 0);
    ASSERT_EQ(replay("lfu", seq, 6, 1, 4, 2, NULL), 0);
    ASSERT_EQ(replay("belady", seq, 6, 1, 4, 2, vic), 2);
    ASSERT_EQ(vic[2], 1);
    ASSERT_EQ(vic[4], 0);
}

TEST(moe_infinity_code_counts_hits_across_residencies) {
    /* Capacity 2. Expert 0 is hit twice, evicted, reloaded and hit twice more: its
     * in-cache visit count is 4, tied with expert 1's, so the miss of 3 evicts the least
     * recent, 1. `lfu` counts since the reload (3 against 5) and evicts 0. */
    static const uint32_t seq[] = {0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2, 0, 0, 0, 3};
    int32_t vic[15];
    ASSERT_EQ(replay("moe-infinity-code", seq, 15, 1, 4, 2, vic), 10);
    ASSERT_EQ(vic[8], 0);
    ASSERT_EQ(vic[11], 2);
    ASSERT_EQ(vic[14], 1);
    ASSERT_EQ(replay("lfu", seq, 15, 1, 4, 2, vic), 10);
    ASSERT_EQ(vic[14], 0);
}

TEST(capacity_one_streams) {
    /* Any capacity >= 1 works (docs/design.md §7.1): with one slot only immediate repeats hit. */
    static const uint32_t seq[] = {3, 3, 1, 3, 3, 3, 2};
    for (int i = 0; i < 4; i++) {
        const char *names[] = {"ondemand", "lru", "lfu", "belady"};
        ASSERT_EQ(replay(names[i], seq, 7, 1, 4, 1, NULL), 3);
    }
}

TEST(experts_of_different_layers_share_the_cache) {
    /* L=2, J=2: ids 0,1 (layer 0) and 2,3 (layer 1); capacity counts them all. */
    static const uint32_t seq[] = {0, 2, 1, 3, 0, 2, 1, 3};
    ASSERT_EQ(replay("lru", seq, 8, 2, 2, 3, NULL), 0);
    ASSERT_EQ(replay("lru", seq, 8, 2, 2, 4, NULL), 4);
    ASSERT_EQ(replay("belady", seq, 8, 2, 2, 3, NULL), 3);
}

/* ------------------------------------------------------------------ properties */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rng(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}

TEST(belady_never_beaten_random) {
    enum { N = 2000 };
    static uint32_t seq[N];
    for (int trial = 0; trial < 40; trial++) {
        const int32_t L = 1 + (int32_t)(rng() % 3), J = 2 + (int32_t)(rng() % 12);
        const int32_t ne = L * J;
        for (int i = 0; i < N; i++) {
            /* skewed: half the accesses go to a quarter of the experts */
            uint32_t e = rng() % (uint32_t)ne;
            if (rng() & 1) e = e % (uint32_t)(ne / 4 + 1);
            seq[i] = e;
        }
        const int32_t cap = 1 + (int32_t)(rng() % (uint32_t)ne);
        int64_t b = replay("belady", seq, N, L, J, cap, NULL);
        int64_t lru = replay("lru", seq, N, L, J, cap, NULL);
        int64_t lfu = replay("lfu", seq, N, L, J, cap, NULL);
        ASSERT_TRUE(b >= 0 && lru >= 0 && lfu >= 0);
        if (b < lru || b < lfu)
            HARNESS_FAIL("trial %d (L=%d J=%d cap=%d): belady %lld < lru %lld / lfu %lld", trial,
                         L, J, cap, (long long)b, (long long)lru, (long long)lfu);
        if (cap >= ne) { /* everything fits: only cold misses */
            int64_t distinct = 0;
            int seen[64] = {0};
            for (int i = 0; i < N; i++)
                if (!seen[seq[i]]++) distinct++;
            ASSERT_EQ(lru, N - distinct);
            ASSERT_EQ(b, N - distinct);
        }
    }
}

int main(int argc, char **argv) { return RUN_TESTS(argc, argv); }
