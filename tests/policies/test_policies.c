/*
 * test_policies.c - the expert-slot cache and the classic policies on hand-worked access
 * sequences (docs/design.md §7.1), driven by a minimal replay loop that uses only lib/.
 */
#include "harness.h"

#include "fmoe/cache.h"
#include "fmoe/error.h"
#include "fmoe/policy.h"
#include "fmoe/slots.h"

typedef struct replay_log {
    int32_t victim; /* of the last demand eviction, -1 none */
} replay_log;

static void replay_decision(void *ctx, const fmoe_decision *d) {
    if (d->kind == FMOE_DECISION_EVICT) ((replay_log *)ctx)->victim = d->victim;
}

/* Replays expert ids seq[0..n) through policy `name` with `cap` slots, over the executors'
 * slot protocol (fmoe/slots.h); returns hits, or a negative code. victims[] (optional)
 * receives the evicted expert per access (-1 none). */
static int64_t replay(const char *name, const uint32_t *seq, int64_t n, int32_t L, int32_t J,
                      int32_t cap, int32_t *victims) {
    fmoe_policy p;
    fmoe_policy_config cfg = {.num_layers = L, .num_experts = J, .top_k = 1, .capacity = cap,
                              .future = seq, .future_len = n};
    int rc = fmoe_policy_init(&p, name, &cfg);
    if (rc < 0) return rc;
    replay_log lg = {-1};
    fmoe_slots *q = NULL;
    const fmoe_slots_config sc = {.num_layers = L, .num_experts = J, .capacity = cap,
                                  .chunks = 1, .policy = &p,
                                  .hooks = {.ctx = &lg, .decision = replay_decision}};
    rc = fmoe_slots_init(&q, &sc);
    if (rc < 0) {
        fmoe_policy_free(&p);
        return rc;
    }
    fmoe_policy_env *env = fmoe_slots_env(q);
    int64_t hits = 0;
    for (int64_t i = 0; i < n; i++) {
        const int32_t e = (int32_t)seq[i];
        const fmoe_slot_access f = fmoe_slots_access(q, e);
        int32_t s = f.slot;
        fmoe_access_result res = FMOE_ACCESS_HIT;
        lg.victim = -1;
        if (f.found == FMOE_FIND_RESIDENT) {
            hits++;
        } else {
            res = FMOE_ACCESS_MISS;
            s = fmoe_slots_demand(q, e);
            if (s < 0) {
                hits = fmoe_slots_error(q) ? fmoe_slots_error(q) : FMOE_EINTERNAL;
                break;
            }
        }
        if (victims) victims[i] = lg.victim;
        fmoe_slots_touch(q, e, s, res, 0, 0);
        if (p.ops->on_access) {
            fmoe_access_event ev = {.layer = e / J, .expert = e % J, .tokens = 1, .slot = s,
                                    .position = i, .result = res};
            p.ops->on_access(p.state, env, &ev);
        }
    }
    fmoe_slots_free(q);
    fmoe_policy_free(&p);
    return hits;
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
    ASSERT_EQ(n, 19); /* the names below */
    /* the names string is the table's names, in order, exactly */
    char want[1024] = "";
    for (size_t i = 0; i < n; i++) {
        ASSERT_TRUE(fmoe_policy_find(all[i]->name) == all[i]);
        ASSERT_TRUE(all[i]->choose_victim != NULL);
        if (i) strcat(want, ", ");
        strcat(want, all[i]->name);
    }
    ASSERT_STR_EQ(fmoe_policy_names(), want);
    ASSERT_STR_EQ(fmoe_policy_names(),
                  "ondemand, lru, lfu, belady, oracle, least-stale, mixtral-offload, "
                  "moe-infinity, moe-infinity-code, moe-infinity-fb, promoe, duoserve, fmoe, "
                  "fmoe-paper, fmoe-map-t, fmoe-map-ts, "
                  "fmoe-hitcount, fmoe-lru, fmoe-lfu");
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
