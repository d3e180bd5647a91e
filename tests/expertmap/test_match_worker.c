/*
 * test_match_worker.c - the matcher on its own thread (lib/expertmap/match_worker.c):
 * its results are the inline matcher's, bit for bit; a new iteration drops what is
 * pending of older ones; posting never waits for a slow search; an iteration that posts
 * more than it may is refused whole.
 */
#include <string.h>
#include <time.h>

#include "fmoe/error.h"
#include "fmoe/expertmap.h"
#include "harness.h"

enum { L = 6, J = 8, H = 16, C = 120, Q = 3 };

static uint64_t rng_state = 0x2545f4914f6cdd1dull;
static float frand(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 11) * (1.0 / 9007199254740992.0));
}

static void random_rows(float *rows, int n) {
    for (int i = 0; i < n; i++) {
        const float v = frand();
        rows[i] = v * v * v;
    }
}

static fmoe_expertmap *make_store(int *harness_failed) {
    const fmoe_expertmap_config cfg = {.capacity = C, .num_layers = L, .num_experts = J,
                                       .top_k = 2, .semantic_dim = H, .prefetch_distance = 2};
    fmoe_expertmap *s = NULL;
    ASSERT_OK(fmoe_expertmap_init(&s, &cfg));
    static float maps[C][L * J], sem[C][H];
    random_rows(&maps[0][0], C * L * J);
    for (int y = 0; y < C; y++)
        for (int k = 0; k < H; k++) sem[y][k] = frand() - 0.5f;
    if (fmoe_expertmap_add(s, C, &sem[0][0], H, &maps[0][0], L * J, NULL, NULL) < 0)
        HARNESS_FAIL("fmoe_expertmap_add: %s", fmoe_error_detail());
    return s;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Takes every result of the searches posted so far. */
static int take_all(fmoe_match_worker *w, fmoe_match_result *r, int32_t (*best)[Q],
                    float (*score)[Q], int max) {
    int n = 0;
    for (;;) {
        const int32_t left = fmoe_match_worker_wait(w);
        while (n < max && fmoe_match_worker_poll(w, &r[n], best[n], score[n])) n++;
        if (left == 0) {
            while (n < max && fmoe_match_worker_poll(w, &r[n], best[n], score[n])) n++;
            return n;
        }
    }
}

TEST(thread_results_are_the_inline_matchers_bit_for_bit) {
    int *failed = harness_failed;
    fmoe_expertmap *s = make_store(failed);
    ASSERT_TRUE(s != NULL);
    fmoe_matcher *m = NULL;
    fmoe_match_worker *w = NULL;
    ASSERT_OK(fmoe_matcher_init(&m, s, Q));
    ASSERT_OK(fmoe_match_worker_start(&w, s, Q, 0));
    float rows[L][Q][J], sem[Q][H];
    fmoe_match_result r[L + 1];
    int32_t best[L + 1][Q], ib[Q];
    float score[L + 1][Q], is[Q];
    for (uint64_t it = 1; it <= 5; it++) {
        const int32_t n = 1 + (int32_t)(it % Q);
        random_rows(&rows[0][0][0], L * Q * J);
        for (int q = 0; q < Q; q++)
            for (int k = 0; k < H; k++) sem[q][k] = frand() - 0.5f;
        fmoe_match_worker_begin(w, it, n);
        fmoe_match_worker_semantic(w, it, n, &sem[0][0], H);
        for (int32_t l = 0; l < L; l++) fmoe_match_worker_trajectory(w, it, l, n, &rows[l][0][0], J);
        ASSERT_EQ(take_all(w, r, best, score, L + 1), L + 1);
        /* the same calls inline, in the same order */
        ASSERT_OK(fmoe_matcher_trajectory_begin(m, n));
        ASSERT_OK(fmoe_matcher_semantic(m, n, &sem[0][0], H, ib, is));
        ASSERT_EQ(r[0].kind, FMOE_MATCH_SEMANTIC);
        ASSERT_EQ(r[0].layer, -1);
        ASSERT_TRUE(memcmp(best[0], ib, (size_t)n * sizeof *ib) == 0);
        ASSERT_TRUE(memcmp(score[0], is, (size_t)n * sizeof *is) == 0);
        for (int32_t l = 0; l < L; l++) {
            ASSERT_OK(fmoe_matcher_trajectory_add(m, l, &rows[l][0][0], J, ib, is));
            const fmoe_match_result *x = &r[l + 1];
            ASSERT_EQ(x->iteration, it);
            ASSERT_EQ(x->kind, FMOE_MATCH_TRAJECTORY);
            ASSERT_EQ(x->layer, l);
            ASSERT_EQ(x->n, n);
            ASSERT_TRUE(memcmp(best[l + 1], ib, (size_t)n * sizeof *ib) == 0);
            ASSERT_TRUE(memcmp(score[l + 1], is, (size_t)n * sizeof *is) == 0);
            for (int q = 0; q < n; q++) ASSERT_TRUE(ib[q] >= 0 && ib[q] < C);
        }
    }
    ASSERT_EQ(fmoe_match_worker_dropped(w), 0);
    fmoe_match_worker_stop(w);
    fmoe_matcher_free(m);
    fmoe_expertmap_free(s);
}

TEST(posting_never_waits_and_a_new_iteration_drops_the_old) {
    int *failed = harness_failed;
    fmoe_expertmap *s = make_store(failed);
    ASSERT_TRUE(s != NULL);
    const double delay = 0.2;
    fmoe_match_worker *w = NULL;
    ASSERT_OK(fmoe_match_worker_start(&w, s, Q, delay));
    float rows[L][J];
    random_rows(&rows[0][0], L * J);
    const double t0 = now_s();
    fmoe_match_worker_begin(w, 1, 1);
    for (int32_t l = 0; l < L; l++) fmoe_match_worker_trajectory(w, 1, l, 1, rows[l], J);
    /* L searches of 0.2 s each are queued; posting them took no search's time */
    const double posted = now_s() - t0;
    ASSERT_TRUE(posted < delay);
    fmoe_match_worker_begin(w, 2, 1);
    fmoe_match_worker_trajectory(w, 2, 0, 1, rows[0], J);
    ASSERT_TRUE(now_s() - t0 < delay);
    fmoe_match_result r[L + 1];
    int32_t best[L + 1][Q];
    float score[L + 1][Q];
    const int n = take_all(w, r, best, score, L + 1);
    /* at most the search already running for iteration 1 finished; iteration 2's one did */
    int old = 0, fresh = 0;
    for (int i = 0; i < n; i++) {
        old += r[i].iteration == 1;
        fresh += r[i].iteration == 2;
    }
    ASSERT_TRUE(old <= 1);
    ASSERT_EQ(fresh, 1);
    /* and it is iteration 2's first row against the store, from a fresh trajectory */
    fmoe_matcher *m = NULL;
    int32_t ib;
    float is;
    ASSERT_OK(fmoe_matcher_init(&m, s, 1));
    ASSERT_OK(fmoe_matcher_trajectory_begin(m, 1));
    ASSERT_OK(fmoe_matcher_trajectory_add(m, 0, rows[0], J, &ib, &is));
    ASSERT_EQ(r[n - 1].iteration, 2);
    ASSERT_EQ(best[n - 1][0], ib);
    ASSERT_TRUE(memcmp(&score[n - 1][0], &is, sizeof is) == 0);
    fmoe_matcher_free(m);
    fmoe_match_worker_stop(w);
    fmoe_expertmap_free(s);
}

TEST(an_iteration_posting_too_much_is_refused_whole) {
    int *failed = harness_failed;
    fmoe_expertmap *s = make_store(failed);
    ASSERT_TRUE(s != NULL);
    fmoe_match_worker *w = NULL;
    ASSERT_OK(fmoe_match_worker_start(&w, s, Q, 0.05));
    float rows[J];
    random_rows(rows, J);
    fmoe_match_worker_begin(w, 1, 1);
    /* L + 2 jobs fit; the 3 L posted here do not: from the first refused one on, the
     * iteration's later searches are refused too (a trajectory missing a layer is wrong) */
    for (int32_t l = 0; l < 3 * L; l++) fmoe_match_worker_trajectory(w, 1, l % L, 1, rows, J);
    ASSERT_EQ(fmoe_match_worker_dropped(w), 1);
    fmoe_match_result r[3 * L];
    int32_t best[3 * L][Q];
    float score[3 * L][Q];
    const int n = take_all(w, r, best, score, 3 * L);
    ASSERT_TRUE(n >= 1 && n < 3 * L);
    /* the next iteration is served again */
    fmoe_match_worker_begin(w, 2, 1);
    fmoe_match_worker_trajectory(w, 2, 0, 1, rows, J);
    ASSERT_EQ(take_all(w, r, best, score, 3 * L), 1);
    ASSERT_EQ(r[0].iteration, 2);
    fmoe_match_worker_stop(w);
    fmoe_expertmap_free(s);
}

TEST(start_checks_its_arguments) {
    int *failed = harness_failed;
    fmoe_expertmap *s = make_store(failed);
    fmoe_match_worker *w = (fmoe_match_worker *)1;
    ASSERT_EQ(fmoe_match_worker_start(&w, s, 0, 0), FMOE_EINVAL);
    ASSERT_TRUE(w == NULL);
    ASSERT_EQ(fmoe_match_worker_start(&w, s, 1, -1), FMOE_EINVAL);
    ASSERT_EQ(fmoe_match_worker_start(&w, NULL, 1, 0), FMOE_EINVAL);
    fmoe_match_worker_stop(NULL);
    fmoe_expertmap_free(s);
}

int main(int argc, char **argv) { return RUN_TESTS(argc, argv); }
