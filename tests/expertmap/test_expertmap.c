/*
 * test_expertmap.c - the expert-map store, its deduplication, the matcher and the
 * selection rule (lib/expertmap/; the fMoE paper, "fMoE: Fine-Grained Expert Offloading
 * for Large Mixture-of-Experts Serving", §4.2-§4.5).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "fmoe/expertmap.h"
#include "harness.h"

/* Deterministic pseudo-random numbers (xorshift), so failures reproduce. */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float frand(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 11) * (1.0 / 9007199254740992.0));
}

/* A softmax-like random map of L rows of J (sharpened so rows differ). */
static void random_map(float *map, int L, int J) {
    for (int l = 0; l < L; l++) {
        double sum = 0;
        for (int j = 0; j < J; j++) {
            float v = frand();
            v = v * v * v * v;
            map[l * J + j] = v;
            sum += v;
        }
        for (int j = 0; j < J; j++) map[l * J + j] = (float)(map[l * J + j] / sum);
    }
}

static void onehot_map(float *map, int L, int J, int expert) {
    memset(map, 0, sizeof(float) * (size_t)L * J);
    for (int l = 0; l < L; l++) map[l * J + expert] = 1.0f;
}

/* ------------------------------------------------------------------ dedup */

/* Three entries, one per expert; their embeddings point three ways. The new entry x has
 * y1's embedding but y0's map. */
static void hand_store(fmoe_expertmap **s, int32_t d, int *failed) {
    int *harness_failed = failed;
    const fmoe_expertmap_config cfg = {.capacity = 3, .num_layers = 4, .num_experts = 4,
                                       .top_k = 1, .semantic_dim = 2, .prefetch_distance = d};
    ASSERT_OK(fmoe_expertmap_init(s, &cfg));
    const float sem[3][2] = {{1, 0}, {0, 1}, {1, 1}};
    float maps[3][16];
    for (int y = 0; y < 3; y++) onehot_map(maps[y], 4, 4, y);
    int32_t slots[3], replaced[3];
    ASSERT_OK(fmoe_expertmap_add(*s, 3, &sem[0][0], 2, &maps[0][0], 16, slots, replaced));
    for (int y = 0; y < 3; y++) {
        ASSERT_EQ(slots[y], y); /* appended while there is room */
        ASSERT_EQ(replaced[y], -1);
    }
    ASSERT_EQ(fmoe_expertmap_size(*s), 3);
}

TEST(dedup_map_dominates_when_d_is_small) {
    /* d = 1, L = 4: RDY = 1/4 cos_sem + 3/4 cos_map.
     *   y0: cos_sem 0, cos_map 1 -> 0.75      (same map)
     *   y1: cos_sem 1, cos_map 0 -> 0.25      (same embedding)
     *   y2: cos_sem 0.707, cos_map 0 -> 0.177
     * so x replaces y0, the entry whose map it repeats. */
    fmoe_expertmap *s = NULL;
    hand_store(&s, 1, harness_failed);
    if (*harness_failed) return;
    const float xs[2] = {0, 1};
    float xm[16];
    onehot_map(xm, 4, 4, 0);
    ASSERT_NEAR(fmoe_expertmap_redundancy(s, xs, xm, 0), 0.75, 1e-9);
    ASSERT_NEAR(fmoe_expertmap_redundancy(s, xs, xm, 1), 0.25, 1e-9);
    ASSERT_NEAR(fmoe_expertmap_redundancy(s, xs, xm, 2), 0.25 * sqrt(0.5), 1e-7);
    int32_t slot = -1, rep = -1;
    ASSERT_OK(fmoe_expertmap_add(s, 1, xs, 2, xm, 16, &slot, &rep));
    ASSERT_EQ(slot, 0);
    ASSERT_EQ(rep, 0);
    ASSERT_EQ(fmoe_expertmap_size(s), 3);
    ASSERT_NEAR(fmoe_expertmap_semantic(s)[1], 1.0, 0); /* y0's embedding is x's now */
    ASSERT_NEAR(fmoe_expertmap_semantic(s)[0], 0.0, 0);
    fmoe_expertmap_free(s);
}

TEST(dedup_semantic_dominates_when_d_is_large) {
    /* d = 3, L = 4: RDY = 3/4 cos_sem + 1/4 cos_map: y0 0.25, y1 0.75, y2 0.53 -> y1. */
    fmoe_expertmap *s = NULL;
    hand_store(&s, 3, harness_failed);
    if (*harness_failed) return;
    const float xs[2] = {0, 1};
    float xm[16];
    onehot_map(xm, 4, 4, 0);
    int32_t slot = -1;
    ASSERT_OK(fmoe_expertmap_add(s, 1, xs, 2, xm, 16, &slot, NULL));
    ASSERT_EQ(slot, 1);
    /* popularity: layer 0 now has expert 0 twice (y0 and the new y1), expert 2 once */
    const uint32_t *pop = fmoe_expertmap_popularity(s);
    ASSERT_EQ(pop[0], 2);
    ASSERT_EQ(pop[1], 0);
    ASSERT_EQ(pop[2], 1);
    fmoe_expertmap_free(s);
}

TEST(dedup_batch_equals_one_at_a_time) {
    const int L = 6, J = 8, h = 5, C = 40, N = 300;
    const fmoe_expertmap_config cfg = {.capacity = C, .num_layers = L, .num_experts = J,
                                       .top_k = 2, .semantic_dim = h, .prefetch_distance = 2,
                                       .max_batch = 64};
    fmoe_expertmap *a = NULL, *b = NULL;
    ASSERT_OK(fmoe_expertmap_init(&a, &cfg));
    ASSERT_OK(fmoe_expertmap_init(&b, &cfg));
    float *maps = malloc(sizeof(float) * N * L * J), *sem = malloc(sizeof(float) * N * h);
    for (int i = 0; i < N; i++) {
        random_map(maps + (size_t)i * L * J, L, J);
        for (int k = 0; k < h; k++) sem[i * h + k] = frand() - 0.5f;
    }
    int32_t sa[300], sb[300];
    ASSERT_OK(fmoe_expertmap_add(a, N, sem, h, maps, L * J, sa, NULL));
    for (int i = 0; i < N; i++) {
        /* the rule itself: the replaced entry maximises the reference RDY */
        if (fmoe_expertmap_size(b) == C) {
            int32_t best = 0;
            double bv = -2;
            for (int y = 0; y < C; y++) {
                double r = fmoe_expertmap_redundancy(b, sem + i * h, maps + (size_t)i * L * J, y);
                if (r > bv) bv = r, best = y;
            }
            int32_t slot;
            ASSERT_OK(fmoe_expertmap_add(b, 1, sem + i * h, h, maps + (size_t)i * L * J, L * J,
                                         &slot, NULL));
            if (slot != best) /* only a float near-tie may differ */
                ASSERT_NEAR(fmoe_expertmap_redundancy(b, sem + i * h, maps + (size_t)i * L * J, slot),
                            bv, 1e-5);
            sb[i] = slot;
        } else {
            ASSERT_OK(fmoe_expertmap_add(b, 1, sem + i * h, h, maps + (size_t)i * L * J, L * J,
                                         &sb[i], NULL));
        }
    }
    for (int i = 0; i < N; i++) ASSERT_EQ(sa[i], sb[i]);
    for (int y = 0; y < C; y++) {
        float ma[6 * 8], mb[6 * 8];
        fmoe_expertmap_copy_map(a, y, ma);
        fmoe_expertmap_copy_map(b, y, mb);
        ASSERT_TRUE(memcmp(ma, mb, sizeof ma) == 0);
    }
    free(maps);
    free(sem);
    fmoe_expertmap_free(a);
    fmoe_expertmap_free(b);
}

TEST(store_rejects_bad_config_and_values) {
    fmoe_expertmap *s = NULL;
    fmoe_expertmap_config cfg = {.capacity = 0, .num_layers = 4, .num_experts = 4, .top_k = 1,
                                 .prefetch_distance = 1};
    ASSERT_EQ(fmoe_expertmap_init(&s, &cfg), FMOE_EINVAL);
    ASSERT_CONTAINS(fmoe_error_detail(), "capacity");
    cfg.capacity = 4;
    cfg.prefetch_distance = 4;
    ASSERT_EQ(fmoe_expertmap_init(&s, &cfg), FMOE_EINVAL);
    ASSERT_CONTAINS(fmoe_error_detail(), "prefetch distance 4");
    cfg.prefetch_distance = 1;
    ASSERT_OK(fmoe_expertmap_init(&s, &cfg));
    float m[16] = {0};
    m[3] = NAN;
    ASSERT_EQ(fmoe_expertmap_add(s, 1, NULL, 0, m, 16, NULL, NULL), FMOE_EINVAL);
    ASSERT_CONTAINS(fmoe_error_detail(), "map[3]");
    ASSERT_EQ(fmoe_expertmap_size(s), 0);
    fmoe_expertmap_free(s);
    fmoe_expertmap_free(NULL);
}

/* ------------------------------------------------------------------ selection */

TEST(select_high_score_takes_the_k_most_likely) {
    /* score 0.9 -> delta 0.1: expert 3 alone reaches it, but K = 2 is the floor. */
    const float p[8] = {0.05f, 0.3f, 0.05f, 0.4f, 0.15f, 0.05f, 0.0f, 0.0f};
    int32_t out[8];
    ASSERT_NEAR(fmoe_expertmap_delta(0.9), 0.1, 1e-12);
    ASSERT_EQ(fmoe_expertmap_select(p, 8, 0.9, 2, out), 2);
    ASSERT_EQ(out[0], 3);
    ASSERT_EQ(out[1], 1);
}

TEST(select_low_score_takes_experts_until_80_percent) {
    /* score 0.2 -> delta 0.8: 0.4 + 0.3 = 0.7 < 0.8, + 0.15 = 0.85 >= 0.8 -> 3 experts */
    const float p[8] = {0.05f, 0.3f, 0.05f, 0.4f, 0.15f, 0.05f, 0.0f, 0.0f};
    int32_t out[8];
    ASSERT_EQ(fmoe_expertmap_select(p, 8, 0.2, 2, out), 3);
    ASSERT_EQ(out[0], 3);
    ASSERT_EQ(out[1], 1);
    ASSERT_EQ(out[2], 4);
    /* exactly reaching the mass stops there: 0.5 + 0.3 = 0.8 */
    const float q[4] = {0.5f, 0.3f, 0.1f, 0.1f};
    ASSERT_EQ(fmoe_expertmap_select(q, 4, 0.2, 1, out), 2);
    /* score 0 -> delta 1: every expert with probability > 0, ties to the lower index */
    ASSERT_EQ(fmoe_expertmap_select(p, 8, 0.0, 2, out), 6);
    ASSERT_EQ(out[3], 0);
    ASSERT_EQ(out[4], 2);
    ASSERT_EQ(out[5], 5);
    /* negative scores clip to delta 1; scores above 1 clip to 0 (the K floor) */
    ASSERT_EQ(fmoe_expertmap_select(p, 8, -0.7, 2, out), 6);
    ASSERT_EQ(fmoe_expertmap_select(p, 8, 1.3, 2, out), 2);
}

TEST(select_topk_only_rows_use_their_own_mass) {
    /* A row of top-3 weights summing to 0.2 (softmax over 64 experts, only the chosen
     * logged): delta 0.5 of 0.2 = 0.1 -> 0.09 + 0.07 reaches it: 2 experts. */
    float p[64] = {0};
    p[10] = 0.09f;
    p[20] = 0.07f;
    p[30] = 0.04f;
    int32_t out[64];
    ASSERT_EQ(fmoe_expertmap_select(p, 64, 0.5, 1, out), 2);
    ASSERT_EQ(out[0], 10);
    ASSERT_EQ(out[1], 20);
    /* delta 1: the three known experts, never the 61 of probability 0 */
    ASSERT_EQ(fmoe_expertmap_select(p, 64, 0.0, 1, out), 3);
    /* K above the known experts: zeros fill up to K, lowest index first */
    ASSERT_EQ(fmoe_expertmap_select(p, 64, 0.0, 5, out), 5);
    ASSERT_EQ(out[3], 0);
    ASSERT_EQ(out[4], 1);
}

/* The rule of fmoe_expertmap_select written the plain way: sort by (p desc, index asc),
 * take while fewer than k_min or the mass is short of delta · total. */
static int32_t select_by_sort(const float *p, int32_t J, double score, int32_t k_min,
                              int32_t *out) {
    for (int32_t j = 0; j < J; j++) out[j] = j;
    for (int32_t a = 1; a < J; a++) /* insertion sort, stable on the index */
        for (int32_t b = a; b > 0 && p[out[b]] > p[out[b - 1]]; b--) {
            const int32_t t = out[b];
            out[b] = out[b - 1];
            out[b - 1] = t;
        }
    double total = 0, acc = 0;
    for (int32_t j = 0; j < J; j++) total += p[j] > 0 ? p[j] : 0;
    const double thr = fmoe_expertmap_delta(score) * total * (1.0 - 1e-6);
    int32_t m = 0;
    while (m < J && (m < (k_min < J ? k_min : J) || (acc < thr && p[out[m]] > 0)))
        acc += p[out[m++]];
    return m;
}

TEST(select_small_and_heap_paths_agree_with_the_rule) {
    /* rows of up to 32 experts take the repeated-maximum path, larger ones the heap:
     * both must give the plain rule's experts in its order, ties included */
    static const int32_t sizes[] = {1, 2, 3, 8, 16, 31, 32, 33, 60, 128};
    float p[128];
    int32_t a[128], b[128];
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        const int32_t J = sizes[si];
        for (int trial = 0; trial < 300; trial++) {
            for (int32_t j = 0; j < J; j++) {
                const float v = frand();
                /* coarse values make ties; some zeros (top-k-only rows) */
                p[j] = trial % 3 == 0 ? (float)(int)(v * 4) / 8.0f : v * v * v;
            }
            const double score = frand() * 1.2 - 0.1;
            const int32_t k = 1 + (int32_t)(frand() * 4);
            const int32_t m = fmoe_expertmap_select(p, J, score, k, a);
            const int32_t r = select_by_sort(p, J, score, k, b);
            ASSERT_EQ(m, r);
            for (int32_t i = 0; i < m; i++) ASSERT_EQ(a[i], b[i]);
        }
    }
}

TEST(priorities) {
    /* prefetch: p / (l - l_now): likely experts and near layers first */
    ASSERT_NEAR(fmoe_expertmap_prefetch_priority(0.6, 5, 2), 0.2, 1e-12);
    ASSERT_NEAR(fmoe_expertmap_prefetch_priority(0.6, 0, -1), 0.6, 1e-12);
    ASSERT_TRUE(fmoe_expertmap_prefetch_priority(0.3, 3, 2) >
                fmoe_expertmap_prefetch_priority(0.5, 5, 2));
    /* eviction keeps the highest p * freq; p floored at 1e-6 */
    ASSERT_NEAR(fmoe_expertmap_keep_value(0.5, 4), 2.0, 1e-12);
    ASSERT_NEAR(fmoe_expertmap_keep_value(0.0, 3), 3e-6, 1e-15);
    ASSERT_TRUE(fmoe_expertmap_keep_value(0.0, 100) < fmoe_expertmap_keep_value(0.01, 1));
}

/* ------------------------------------------------------------------ matcher */

TEST(trajectory_incremental_equals_naive) {
    const int L = 12, J = 16, C = 300, Q = 5;
    const fmoe_expertmap_config cfg = {.capacity = C, .num_layers = L, .num_experts = J,
                                       .top_k = 2, .prefetch_distance = 3};
    fmoe_expertmap *s = NULL;
    fmoe_matcher *m = NULL;
    ASSERT_OK(fmoe_expertmap_init(&s, &cfg));
    float *maps = malloc(sizeof(float) * 250 * L * J);
    for (int i = 0; i < 250; i++) random_map(maps + (size_t)i * L * J, L, J);
    ASSERT_OK(fmoe_expertmap_add(s, 250, NULL, 0, maps, L * J, NULL, NULL)); /* 250 of 300 */
    ASSERT_OK(fmoe_matcher_init(&m, s, Q));
    float q[5][12 * 16], naive[300];
    for (int k = 0; k < Q; k++) random_map(q[k], L, J);
    memcpy(q[4], maps + 17 * L * J, sizeof q[4]); /* one query is a stored map */
    for (int n = 1; n <= Q; n += Q - 1) { /* n = 1 (sgemv) and n = 5 (sgemm) */
        ASSERT_OK(fmoe_matcher_trajectory_begin(m, n));
        float rows[5][16];
        for (int l = 0; l < L; l++) {
            int32_t best[5];
            float score[5];
            for (int k = 0; k < n; k++) memcpy(rows[k], q[Q - n + k] + l * J, sizeof rows[k]);
            ASSERT_OK(fmoe_matcher_trajectory_add(m, l, &rows[0][0], J, best, score));
            for (int k = 0; k < n; k++) {
                int32_t nb = fmoe_matcher_trajectory_naive(s, q[Q - n + k], l + 1, naive);
                const float *inc = fmoe_matcher_scores(m, k);
                for (int y = 0; y < 250; y++) ASSERT_NEAR(inc[y], naive[y], 1e-5);
                ASSERT_NEAR(score[k], naive[nb], 1e-5);
                if (k == n - 1) ASSERT_EQ(best[k], 17);
            }
        }
    }
    /* A layer out of order is refused. */
    ASSERT_OK(fmoe_matcher_trajectory_begin(m, 1));
    ASSERT_EQ(fmoe_matcher_trajectory_add(m, 1, q[0], J, NULL, NULL), FMOE_EINVAL);
    fmoe_matcher_free(m);
    fmoe_expertmap_free(s);
    free(maps);
}

TEST(trajectory_catches_up_after_store_changes) {
    const int L = 8, J = 8, C = 64;
    const fmoe_expertmap_config cfg = {.capacity = C, .num_layers = L, .num_experts = J,
                                       .top_k = 2, .prefetch_distance = 2};
    fmoe_expertmap *s = NULL;
    fmoe_matcher *m = NULL;
    ASSERT_OK(fmoe_expertmap_init(&s, &cfg));
    float maps[100][64], q[64], naive[64];
    for (int i = 0; i < 100; i++) random_map(maps[i], L, J);
    random_map(q, L, J);
    ASSERT_OK(fmoe_expertmap_add(s, 40, NULL, 0, &maps[0][0], 64, NULL, NULL));
    ASSERT_OK(fmoe_matcher_init(&m, s, 1));
    ASSERT_OK(fmoe_matcher_trajectory_begin(m, 1));
    for (int l = 0; l < L; l++) {
        if (l == 3) /* grow and then dedup mid-trajectory */
            ASSERT_OK(fmoe_expertmap_add(s, 60, NULL, 0, &maps[40][0], 64, NULL, NULL));
        int32_t best;
        float score;
        ASSERT_OK(fmoe_matcher_trajectory_add(m, l, q + l * J, J, &best, &score));
        int32_t nb = fmoe_matcher_trajectory_naive(s, q, l + 1, naive);
        const float *inc = fmoe_matcher_scores(m, 0);
        for (int y = 0; y < fmoe_expertmap_size(s); y++) ASSERT_NEAR(inc[y], naive[y], 1e-5);
        ASSERT_NEAR(score, naive[nb], 1e-5);
    }
    fmoe_matcher_free(m);
    fmoe_expertmap_free(s);
}

TEST(semantic_search_matches_brute_force) {
    const int L = 4, J = 4, h = 32, C = 100;
    const fmoe_expertmap_config cfg = {.capacity = C, .num_layers = L, .num_experts = J,
                                       .top_k = 1, .semantic_dim = h, .prefetch_distance = 1};
    fmoe_expertmap *s = NULL;
    fmoe_matcher *m = NULL;
    ASSERT_OK(fmoe_expertmap_init(&s, &cfg));
    float sem[100][32], maps[100][16], q[3][32];
    for (int i = 0; i < 100; i++) {
        for (int k = 0; k < h; k++) sem[i][k] = frand() - 0.5f;
        random_map(maps[i], L, J);
    }
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < h; i++) q[k][i] = frand() - 0.5f;
    for (int i = 0; i < h; i++) q[2][i] = 3.0f * sem[42][i]; /* scale does not matter */
    ASSERT_OK(fmoe_expertmap_add(s, 100, &sem[0][0], h, &maps[0][0], 16, NULL, NULL));
    ASSERT_OK(fmoe_matcher_init(&m, s, 3));
    for (int n = 1; n <= 3; n += 2) {
        int32_t best[3];
        float score[3];
        ASSERT_OK(fmoe_matcher_semantic(m, n, &q[3 - n][0], h, best, score));
        for (int k = 0; k < n; k++) {
            const float *x = q[3 - n + k];
            int32_t bb = -1;
            double bv = -2;
            for (int y = 0; y < C; y++) {
                double ab = 0, aa = 0, yy = 0;
                for (int i = 0; i < h; i++)
                    ab += x[i] * sem[y][i], aa += x[i] * x[i], yy += sem[y][i] * sem[y][i];
                double c = ab / sqrt(aa * yy);
                ASSERT_NEAR(fmoe_matcher_scores(m, k)[y], c, 1e-5);
                if (c > bv) bv = c, bb = y;
            }
            ASSERT_EQ(best[k], bb);
            ASSERT_NEAR(score[k], bv, 1e-5);
        }
    }
    int32_t best;
    float score;
    ASSERT_OK(fmoe_matcher_semantic(m, 1, q[2], h, &best, &score));
    ASSERT_EQ(best, 42);
    ASSERT_NEAR(score, 1.0, 1e-5);
    /* an empty store answers -1 */
    fmoe_expertmap_clear(s);
    ASSERT_OK(fmoe_matcher_semantic(m, 1, q[2], h, &best, &score));
    ASSERT_EQ(best, -1);
    ASSERT_OK(fmoe_matcher_trajectory_begin(m, 1));
    ASSERT_OK(fmoe_matcher_trajectory_add(m, 0, maps[0], J, &best, &score));
    ASSERT_EQ(best, -1);
    fmoe_matcher_free(m);
    fmoe_expertmap_free(s);
}

TEST(clone_is_independent) {
    const fmoe_expertmap_config cfg = {.capacity = 4, .num_layers = 2, .num_experts = 4,
                                       .top_k = 1, .semantic_dim = 2, .prefetch_distance = 1};
    fmoe_expertmap *a = NULL, *b = NULL;
    ASSERT_OK(fmoe_expertmap_init(&a, &cfg));
    float m[8], e[2] = {1, 2};
    onehot_map(m, 2, 4, 1);
    ASSERT_OK(fmoe_expertmap_add(a, 1, e, 2, m, 8, NULL, NULL));
    fmoe_expertmap_hit(a, 0);
    ASSERT_OK(fmoe_expertmap_clone(&b, a, 0));
    ASSERT_EQ(fmoe_expertmap_size(b), 1);
    ASSERT_EQ(fmoe_expertmap_hits(b)[0], 1);
    ASSERT_EQ(fmoe_expertmap_popularity(b)[4 + 1], 1);
    ASSERT_OK(fmoe_expertmap_add(b, 1, e, 2, m, 8, NULL, NULL));
    ASSERT_EQ(fmoe_expertmap_size(a), 1);
    ASSERT_EQ(fmoe_expertmap_size(b), 2);
    fmoe_expertmap_free(a);
    fmoe_expertmap_free(b);
}

/* Offline updates grow a store built to its tokens: a clone with more tiles per layer
 * holds every entry's map and embedding where the original had them, and has room. */
TEST(clone_grows_to_a_larger_capacity) {
    const int32_t L = 3, J = 8, C = 20; /* 2 tiles of 16 per layer -> 5 */
    const fmoe_expertmap_config cfg = {.capacity = C, .num_layers = L, .num_experts = J,
                                       .top_k = 2, .semantic_dim = 2, .prefetch_distance = 1};
    fmoe_expertmap *a = NULL, *b = NULL;
    ASSERT_OK(fmoe_expertmap_init(&a, &cfg));
    float m[3 * 8], e[2];
    for (int32_t y = 0; y < C; y++) { /* distinct entries: no deduplication */
        for (int32_t i = 0; i < L * J; i++) m[i] = (float)((y * 7 + i * 3) % 11) / 11.0f;
        e[0] = (float)y;
        e[1] = 1.0f;
        ASSERT_OK(fmoe_expertmap_set(a, y, e, m, 0));
    }
    ASSERT_EQ(fmoe_expertmap_size(a), C);
    ASSERT_OK(fmoe_expertmap_clone(&b, a, 70));
    ASSERT_EQ(fmoe_expertmap_config_of(b)->capacity, 70);
    ASSERT_EQ(fmoe_expertmap_size(b), C);
    float ma[3 * 8], mb[3 * 8];
    for (int32_t y = 0; y < C; y++) {
        fmoe_expertmap_copy_map(a, y, ma);
        fmoe_expertmap_copy_map(b, y, mb);
        for (int32_t i = 0; i < L * J; i++) ASSERT_EQ(ma[i], mb[i]);
        ASSERT_EQ(fmoe_expertmap_semantic(b)[2 * y], (float)y);
    }
    for (int32_t i = 0; i < L * J; i++)
        ASSERT_EQ(fmoe_expertmap_popularity(a)[i], fmoe_expertmap_popularity(b)[i]);
    /* room: appended, not deduplicated */
    for (int32_t i = 0; i < L * J; i++) m[i] = 0.5f;
    e[0] = 99.0f;
    ASSERT_OK(fmoe_expertmap_add(b, 1, e, 2, m, L * J, NULL, NULL));
    ASSERT_EQ(fmoe_expertmap_size(b), C + 1);
    /* a smaller capacity keeps the source's */
    fmoe_expertmap *c = NULL;
    ASSERT_OK(fmoe_expertmap_clone(&c, a, 5));
    ASSERT_EQ(fmoe_expertmap_config_of(c)->capacity, C);
    fmoe_expertmap_free(a);
    fmoe_expertmap_free(b);
    fmoe_expertmap_free(c);
}

int main(int argc, char **argv) { return RUN_TESTS(argc, argv); }
