/*
 * test_fmoe_equivalence.c - the fast paths of the fmoe policy family make exactly the
 * decisions of the slow, straightforward ones.
 *
 *   matcher  the incremental, vectorised trajectory step (every SIMD build this CPU runs:
 *            baseline 4 lanes, AVX2, AVX-512) against fmoe_matcher_trajectory_reference,
 *            the scalar recomputation from scratch: best entry, its score and every
 *            entry's score equal bit for bit, layer by layer, for one query and for a
 *            batch, with ties, zero rows, partial tiles, and a store modified mid-way.
 *   policy   each variant (fmoe, fmoe-map-t, fmoe-map-ts, fmoe-hitcount, fmoe-lru,
 *            fmoe-lfu) against its fmoe__policy_<v>_reference twin (the matcher's scalar
 *            path, no cached cur_p rows, no skipped search, the plain victim scan) in the
 *            simulator, through a wrapper that logs every decision: each prefetch
 *            (layer, expert, priority bits) and each victim chosen. The logs and the
 *            results must be identical, in offline, offline-update and online mode, with
 *            and without embeddings, with full and top-k-only probabilities.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "fmoe/expertmap.h"
#include "expertmap/matcher_internal.h"
#include "fmoe/sim.h"
#include "harness.h"

static uint64_t rng = 0x853c49e6748fea9bull;
static double urand(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng >> 11) / 9007199254740992.0;
}

static void random_rows(float *p, int n, int J, int sharp) {
    for (int r = 0; r < n; r++) {
        double s = 0;
        for (int j = 0; j < J; j++) {
            double v = urand();
            for (int k = 1; k < sharp; k++) v *= v;
            p[r * J + j] = (float)v;
            s += v;
        }
        for (int j = 0; j < J; j++) p[r * J + j] = (float)(p[r * J + j] / s);
    }
}

static int same_bits(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

/* ------------------------------------------------------------------ matcher */

/* One store (C entries of L x J, `fill` of them live; a few duplicates and a zero map) and
 * nq queries, all layers, against the reference at every layer, for one SIMD level. */
static void check_matcher(int L, int J, int C, int fill, int nq, int level, int modify,
                          int *harness_failed) {
    const fmoe_expertmap_config cfg = {.capacity = C, .num_layers = L, .num_experts = J,
                                       .top_k = 2, .prefetch_distance = 1};
    fmoe_expertmap *s = NULL;
    fmoe_matcher *m = NULL;
    ASSERT_OK(fmoe_expertmap_init(&s, &cfg));
    const int LJ = L * J;
    float *maps = malloc(sizeof(float) * (size_t)(fill + 40) * LJ);
    random_rows(maps, (fill + 40) * L, J, 3);
    if (fill > 8) {
        memcpy(maps + 5 * LJ, maps + 2 * LJ, sizeof(float) * LJ); /* exact ties */
        memcpy(maps + 7 * LJ, maps + 2 * LJ, sizeof(float) * LJ);
        memset(maps + 3 * LJ, 0, sizeof(float) * LJ);               /* a zero map */
        memset(maps + 4 * LJ + J, 0, sizeof(float) * J);            /* a zero row */
    }
    for (int y = 0; y < fill; y++) ASSERT_OK(fmoe_expertmap_set(s, y, NULL, maps + (size_t)y * LJ, 0));
    ASSERT_OK(fmoe_matcher_init(&m, s, nq));
    if (fmoe__matcher_force_level(m, level) != 0) { /* not on this CPU */
        fmoe_matcher_free(m);
        fmoe_expertmap_free(s);
        free(maps);
        return;
    }
    float *q = malloc(sizeof(float) * (size_t)nq * LJ);
    random_rows(q, nq * L, J, 2);
    memcpy(q, maps + 2 * LJ, sizeof(float) * LJ); /* query 0 is a stored (tied) map */
    if (nq > 2) memset(q + LJ, 0, sizeof(float) * J); /* query 1 starts with a zero row */
    float *ref = malloc(sizeof(float) * C);
    ASSERT_OK(fmoe_matcher_trajectory_begin(m, nq));
    for (int l = 0; l < L; l++) {
        if (modify && l == L / 2) { /* the store changes mid-trajectory: replace and grow */
            if (fmoe_expertmap_size(s) > 1)
                ASSERT_OK(fmoe_expertmap_set(s, 1, NULL, maps + (size_t)(fill + 1) * LJ, 0));
            if (fmoe_expertmap_size(s) < C)
                ASSERT_OK(fmoe_expertmap_set(s, fmoe_expertmap_size(s), NULL,
                                             maps + (size_t)(fill + 2) * LJ, 0));
        }
        int32_t best[64];
        float score[64];
        ASSERT_OK(fmoe_matcher_trajectory_add(m, l, q + (size_t)l * J, LJ, best, score));
        for (int k = 0; k < nq; k++) {
            float rs = 0;
            const int32_t rb =
                fmoe_matcher_trajectory_reference(s, q + (size_t)k * LJ, l + 1, &rs, ref);
            if (best[k] != rb || !same_bits(score[k], rs))
                HARNESS_FAIL("L=%d J=%d C=%d fill=%d level %d, layer %d query %d: best %d "
                             "score %.9g, reference %d %.9g",
                             L, J, C, fill, level, l, k, best[k], score[k], rb, rs);
            const float *sc = fmoe_matcher_scores(m, k);
            for (int y = 0; y < fmoe_expertmap_size(s); y++)
                if (!same_bits(sc[y], ref[y]))
                    HARNESS_FAIL("level %d layer %d query %d entry %d: %.9g vs %.9g", level,
                                 l, k, y, sc[y], ref[y]);
        }
        if (l == 0 && fill > 8) ASSERT_EQ(best[0], 2); /* ties go to the lowest entry */
    }
    /* and the mathematics, to float rounding */
    float *naive = malloc(sizeof(float) * C);
    fmoe_matcher_trajectory_naive(s, q, L, naive);
    fmoe_matcher_trajectory_reference(s, q, L, NULL, ref);
    for (int y = 0; y < fmoe_expertmap_size(s); y++) ASSERT_NEAR(ref[y], naive[y], 1e-5);
    free(naive);
    free(ref);
    free(q);
    free(maps);
    fmoe_matcher_free(m);
    fmoe_expertmap_free(s);
}

TEST(matcher_step_equals_reference_bit_for_bit) {
    static const int geo[][4] = {
        /* L, J, C, fill */
        {32, 8, 100, 100},  {32, 8, 133, 97}, {6, 60, 70, 70}, {5, 128, 40, 33},
        {4, 16, 16, 16},    {3, 3, 5, 5},     {7, 8, 300, 1},  {8, 8, 64, 0},
    };
    for (size_t g = 0; g < sizeof geo / sizeof geo[0]; g++)
        for (int level = 0; level <= 2; level++)
            for (int nq = 1; nq <= 5; nq += 4)
                for (int modify = 0; modify <= 1; modify++) {
                    check_matcher(geo[g][0], geo[g][1], geo[g][2], geo[g][3], nq, level, modify,
                                  harness_failed);
                    if (*harness_failed) return;
                }
}

/* The semantic search at SIMD level `level` for n queries at once: every entry's score
 * must be the scalar definition's (fmoe__matcher_semantic_dot, scaled as the matcher
 * scales), bit for bit, and the same as one query at a time. */
static void check_semantic(int h, int fill, int n, int level, int *harness_failed) {
    const fmoe_expertmap_config cfg = {.capacity = fill + 3, .num_layers = 2, .num_experts = 4,
                                       .top_k = 1, .semantic_dim = h, .prefetch_distance = 1};
    fmoe_expertmap *s = NULL;
    fmoe_matcher *m = NULL, *one = NULL;
    ASSERT_OK(fmoe_expertmap_init(&s, &cfg));
    float *sem = malloc(sizeof(float) * (size_t)(fill + n) * h);
    for (size_t i = 0; i < (size_t)(fill + n) * h; i++) sem[i] = (float)(urand() * 2 - 1);
    if (fill > 3) memcpy(sem + 3 * (size_t)h, sem + (size_t)h, sizeof(float) * h); /* a tie */
    float map[8];
    random_rows(map, 2, 4, 1);
    for (int y = 0; y < fill; y++) ASSERT_OK(fmoe_expertmap_set(s, y, sem + (size_t)y * h, map, 0));
    ASSERT_OK(fmoe_matcher_init(&m, s, n));
    ASSERT_OK(fmoe_matcher_init(&one, s, 1));
    if (fmoe__matcher_force_level(m, level) != 0) {
        fmoe_matcher_free(m);
        fmoe_matcher_free(one);
        fmoe_expertmap_free(s);
        free(sem);
        return;
    }
    const float *x = sem + (size_t)fill * h;
    int32_t best[16], b1;
    float score[16], s1;
    ASSERT_OK(fmoe_matcher_semantic(m, n, x, h, best, score));
    float *batch = malloc(sizeof(float) * (size_t)n * (fill + 1));
    for (int q = 0; q < n; q++)
        memcpy(batch + (size_t)q * (fill + 1), fmoe_matcher_scores(m, q), sizeof(float) * fill);
    for (int q = 0; q < n; q++) {
        const float *xq = x + (size_t)q * h;
        double n2 = 0;
        for (int i = 0; i < h; i++) n2 += (double)xq[i] * xq[i];
        const float rq = n2 > 0 ? (float)(1.0 / sqrt(n2)) : 0.0f;
        int32_t want_best = fill > 0 ? 0 : -1;
        float want_score = 0;
        for (int y = 0; y < fill; y++) {
            const float *e = sem + (size_t)y * h;
            double en = 0;
            for (int i = 0; i < h; i++) en += (double)e[i] * e[i];
            const float ny = (float)sqrt(en);
            const float want = ny > 0 ? fmoe__matcher_semantic_dot(xq, e, h) * rq / ny : 0.0f;
            const float got = batch[(size_t)q * (fill + 1) + y];
            if (!same_bits(got, want))
                HARNESS_FAIL("semantic h=%d fill=%d n=%d level %d: query %d entry %d %.9g, "
                             "definition %.9g",
                             h, fill, n, level, q, y, got, want);
            if (y == 0 || want > want_score) { /* the first of the largest */
                want_best = y;
                want_score = want;
            }
        }
        ASSERT_EQ(best[q], want_best);
        ASSERT_TRUE(same_bits(score[q], fill > 0 ? want_score : 0.0f));
        /* one query at a time (the decode path) gives the same bits */
        ASSERT_OK(fmoe_matcher_semantic(one, 1, xq, h, &b1, &s1));
        ASSERT_EQ(b1, best[q]);
        ASSERT_TRUE(same_bits(s1, score[q]));
    }
    free(batch);
    free(sem);
    fmoe_matcher_free(m);
    fmoe_matcher_free(one);
    fmoe_expertmap_free(s);
}

TEST(semantic_search_equals_the_definition_bit_for_bit) {
    static const int geo[][2] = {/* h, fill */ {64, 37}, {37, 20}, {4096, 9}, {16, 5},
                                 {5, 6},        {100, 1}, {48, 0}};
    for (size_t g = 0; g < sizeof geo / sizeof geo[0]; g++)
        for (int level = 0; level <= 2; level++)
            for (int n = 1; n <= 9; n += 4) {
                check_semantic(geo[g][0], geo[g][1], n, level, harness_failed);
                if (*harness_failed) return;
            }
}

/* ------------------------------------------------------------------ policy */

/* A decision: a prefetch (kind 'P': layer, expert, priority bits) or a victim ('V':
 * incoming expert, slot chosen). */
typedef struct decision {
    char kind;
    int32_t a, b;
    uint64_t bits;
} decision;

typedef struct decision_log {
    decision *d;
    size_t n, cap;
} decision_log;

static void log_add(decision_log *lg, char kind, int32_t a, int32_t b, uint64_t bits) {
    if (lg->n == lg->cap) {
        lg->cap = lg->cap ? 2 * lg->cap : 4096;
        lg->d = realloc(lg->d, lg->cap * sizeof *lg->d);
    }
    lg->d[lg->n++] = (decision){kind, a, b, bits};
}

/* The wrapper: the policy under test sees its events through it, and its decisions go
 * through it to the executor. */
typedef struct wrap {
    const fmoe_policy_ops *inner;
    void *state;
    const fmoe_policy_sink *real;
    fmoe_policy_sink sink;
    decision_log *lg;
} wrap;

static const fmoe_policy_ops *g_inner; /* set before each run (the init has no context) */
static decision_log *g_log;

static int w_prefetch(void *ctx, int32_t l, int32_t j, double pri, double value) {
    wrap *w = ctx;
    uint64_t bits;
    memcpy(&bits, &pri, sizeof bits);
    log_add(w->lg, 'P', l, j, bits);
    return w->real->prefetch(w->real->ctx, l, j, pri, value);
}
static void w_cancel(void *ctx, int32_t l, int32_t j) {
    wrap *w = ctx;
    log_add(w->lg, 'C', l, j, 0);
    w->real->cancel(w->real->ctx, l, j);
}
static void w_pin(void *ctx, int32_t l, int32_t j) {
    wrap *w = ctx;
    w->real->pin(w->real->ctx, l, j);
}
static void w_unpin(void *ctx, int32_t l, int32_t j) {
    wrap *w = ctx;
    w->real->unpin(w->real->ctx, l, j);
}
static void w_host(void *ctx, int32_t l, int32_t j) {
    wrap *w = ctx;
    w->real->compute_on_host(w->real->ctx, l, j);
}

static fmoe_policy_env w_env(wrap *w, const fmoe_policy_env *env) {
    w->real = env->sink;
    fmoe_policy_env e = *env;
    e.sink = &w->sink;
    return e;
}

static int w_init(void **state, const fmoe_policy_config *cfg) {
    wrap *w = calloc(1, sizeof *w);
    w->inner = g_inner;
    w->lg = g_log;
    w->sink = (fmoe_policy_sink){.ctx = w, .prefetch = w_prefetch, .cancel = w_cancel,
                                 .pin = w_pin, .unpin = w_unpin, .compute_on_host = w_host};
    const int rc = g_inner->init(&w->state, cfg);
    if (rc < 0) {
        free(w);
        return rc;
    }
    *state = w;
    return 0;
}
static void w_free(void *state) {
    wrap *w = state;
    if (!w) return;
    w->inner->free(w->state);
    free(w);
}
#define FORWARD(cb, evtype)                                                                   \
    static void w_##cb(void *state, const fmoe_policy_env *env, evtype ev) {                  \
        wrap *w = state;                                                                      \
        if (!w->inner->cb) return;                                                            \
        const fmoe_policy_env e = w_env(w, env);                                              \
        w->inner->cb(w->state, &e, ev);                                                       \
    }
FORWARD(on_request_start, const fmoe_request_event *)
FORWARD(on_iteration_start, const fmoe_iteration_event *)
FORWARD(on_gate, const fmoe_gate_event *)
FORWARD(on_access, const fmoe_access_event *)
FORWARD(on_layer_done, int32_t)
FORWARD(on_iteration_end, const fmoe_iteration_event *)
FORWARD(on_request_end, const fmoe_request_event *)
static int32_t w_choose_victim(void *state, const fmoe_policy_env *env,
                               const fmoe_victim_request *req) {
    wrap *w = state;
    const fmoe_policy_env e = w_env(w, env);
    const int32_t v = w->inner->choose_victim(w->state, &e, req);
    log_add(w->lg, 'V', req->incoming, v, 0);
    return v;
}

static fmoe_policy_ops wrapped(const fmoe_policy_ops *inner) {
    fmoe_policy_ops o = *inner;
    o.init = w_init;
    o.free = w_free;
    o.on_request_start = w_on_request_start;
    o.on_iteration_start = w_on_iteration_start;
    o.on_gate = w_on_gate;
    o.on_access = w_on_access;
    o.on_layer_done = w_on_layer_done;
    o.choose_victim = w_choose_victim;
    o.on_iteration_end = w_on_iteration_end;
    o.on_request_end = w_on_request_end;
    return o;
}

extern const fmoe_policy_ops fmoe_policy_fmoe, fmoe__policy_fmoe_reference;
extern const fmoe_policy_ops fmoe_policy_fmoe_map_t, fmoe__policy_fmoe_map_t_reference;
extern const fmoe_policy_ops fmoe_policy_fmoe_map_ts, fmoe__policy_fmoe_map_ts_reference;
extern const fmoe_policy_ops fmoe_policy_fmoe_hitcount, fmoe__policy_fmoe_hitcount_reference;
extern const fmoe_policy_ops fmoe_policy_fmoe_lru, fmoe__policy_fmoe_lru_reference;
extern const fmoe_policy_ops fmoe_policy_fmoe_lfu, fmoe__policy_fmoe_lfu_reference;

/* A topic workload (as in test_fmoe_sim.c): R requests of P + D tokens, L x J, top-K. */
typedef struct synth {
    int L, J, K, H, R, P, D;
    float *probs, *sem;
    uint16_t *experts;
    uint8_t *phase;
} synth;

static void synth_make(synth *s, int L, int J, int K, int H, int R, int P, int D, int topk_only) {
    *s = (synth){L, J, K, H, R, P, D, NULL, NULL, NULL, NULL};
    enum { TOPICS = 5 };
    float *topic = malloc(sizeof(float) * TOPICS * L * J);
    random_rows(topic, TOPICS * L, J, 4);
    const int T = R * (P + D);
    s->probs = calloc((size_t)T * L * J, sizeof *s->probs);
    s->experts = calloc((size_t)T * L * K, sizeof *s->experts);
    s->sem = H ? calloc((size_t)T * H, sizeof *s->sem) : NULL;
    s->phase = calloc((size_t)T, 1);
    for (int r = 0; r < R; r++) {
        const int tp = (int)(urand() * TOPICS) % TOPICS;
        for (int k = 0; k < P + D; k++) {
            const int t = r * (P + D) + k;
            s->phase[t] = k < P ? 0 : 1;
            for (int i = 0; i < H; i++)
                s->sem[(size_t)t * H + i] = (i % TOPICS == tp ? 1.0f : 0.0f) + 0.3f * (float)urand();
            for (int l = 0; l < L; l++) {
                float *p = s->probs + ((size_t)t * L + l) * J;
                double sum = 0;
                for (int j = 0; j < J; j++) {
                    p[j] = 0.8f * topic[(tp * L + l) * J + j] + 0.2f * (float)urand() / J;
                    sum += p[j];
                }
                for (int j = 0; j < J; j++) p[j] = (float)(p[j] / sum);
                uint16_t *e = s->experts + ((size_t)t * L + l) * K;
                for (int a = 0; a < K; a++) {
                    int b = -1;
                    for (int j = 0; j < J; j++) {
                        int used = 0;
                        for (int c = 0; c < a; c++) used |= e[c] == j;
                        if (!used && (b < 0 || p[j] > p[b])) b = j;
                    }
                    e[a] = (uint16_t)b;
                }
                if (topk_only) { /* keep the chosen experts' weights only */
                    float keep[128];
                    for (int a = 0; a < K; a++) keep[a] = p[e[a]];
                    memset(p, 0, sizeof(float) * J);
                    for (int a = 0; a < K; a++) p[e[a]] = keep[a];
                }
            }
        }
    }
    free(topic);
}

static void synth_free(synth *s) {
    free(s->probs);
    free(s->experts);
    free(s->sem);
    free(s->phase);
}

static int synth_workload(const synth *s, int r0, int r1, int topk_only, fmoe_sim_workload *w) {
    const int L = s->L, J = s->J, K = s->K, n = s->P + s->D;
    FMOE_FORWARD_IF_ERROR(fmoe_sim_workload_init(w, L, J, K, 50000000));
    FMOE_FORWARD_IF_ERROR(
        fmoe_sim_workload_keep_gates(w, topk_only ? FMOE_PROBS_TOPK : FMOE_PROBS_FULL, 0));
    for (int r = r0; r < r1; r++) {
        const size_t t = (size_t)r * n;
        FMOE_FORWARD_IF_ERROR(fmoe_sim_workload_add_request_gates(
            w, r, 0, s->P, s->D, n, s->phase + t, s->experts + t * L * K, s->probs + t * L * J,
            NULL));
    }
    if (s->H) {
        w->semantic_dim = s->H;
        w->semantic = malloc(sizeof(float) * (size_t)(r1 - r0) * n * s->H);
        if (!w->semantic) return FMOE_ENOMEM;
        memcpy(w->semantic, s->sem + (size_t)r0 * n * s->H,
               sizeof(float) * (size_t)(r1 - r0) * n * s->H);
    }
    return 0;
}

static int run_logged(const fmoe_sim_workload *w, const fmoe_expertmap *st, int mode,
                      const fmoe_policy_ops *ops, int32_t cache, int32_t d, decision_log *lg,
                      fmoe_sim_result *out) {
    fmoe_hardware_profile hw;
    fmoe_sim_costs costs;
    FMOE_FORWARD_IF_ERROR(fmoe_hardware_preset("rtx3090-pcie4", &hw));
    FMOE_FORWARD_IF_ERROR(fmoe_sim_costs_init(&costs, &hw, NULL, 50000000, 1024, 16));
    costs.match_delay_s = 20e-6;
    const fmoe_policy_ops wops = wrapped(ops);
    g_inner = ops;
    g_log = lg;
    static const char *const modes[] = {"offline", "online", "offline-update"};
    fmoe_sim_config cfg = {.ops = &wops, .cache_experts = cache, .prefetch_distance = d,
                           .costs = &costs, .expert_store = mode == FMOE_STORE_ONLINE ? NULL : st};
    FMOE_FORWARD_IF_ERROR(fmoe_policy_settings_set(&cfg.policy_settings, "store_mode", modes[mode]));
    FMOE_FORWARD_IF_ERROR(fmoe_policy_settings_set(&cfg.policy_settings, "store_capacity", "40"));
    return fmoe_sim_run(w, &cfg, out);
}

TEST(policy_fast_paths_make_the_reference_decisions) {
    static const fmoe_policy_ops *const pairs[][2] = {
        {&fmoe_policy_fmoe, &fmoe__policy_fmoe_reference},
        {&fmoe_policy_fmoe_map_t, &fmoe__policy_fmoe_map_t_reference},
        {&fmoe_policy_fmoe_map_ts, &fmoe__policy_fmoe_map_ts_reference},
        {&fmoe_policy_fmoe_hitcount, &fmoe__policy_fmoe_hitcount_reference},
        {&fmoe_policy_fmoe_lru, &fmoe__policy_fmoe_lru_reference},
        {&fmoe_policy_fmoe_lfu, &fmoe__policy_fmoe_lfu_reference},
    };
    /* geometry: L, J, K, H (embedding size, 0: none), top-k-only probabilities */
    static const int geo[][5] = {{12, 8, 2, 6, 0}, {8, 20, 3, 0, 0}, {10, 16, 2, 4, 1}};
    size_t compared = 0;
    for (size_t g = 0; g < sizeof geo / sizeof geo[0]; g++) {
        synth s;
        const int topk = geo[g][4];
        synth_make(&s, geo[g][0], geo[g][1], geo[g][2], geo[g][3], 24, 5, 14, topk);
        fmoe_sim_workload w;
        memset(&w, 0, sizeof w);
        ASSERT_OK(synth_workload(&s, 14, 24, topk, &w));
        /* a store of 40 entries from the first 14 requests (266 tokens: deduplicated) */
        const fmoe_expertmap_config sc = {.capacity = 40, .num_layers = s.L,
                                          .num_experts = s.J, .top_k = s.K,
                                          .semantic_dim = s.H, .prefetch_distance = 2};
        fmoe_expertmap *st = NULL;
        ASSERT_OK(fmoe_expertmap_init(&st, &sc));
        ASSERT_OK(fmoe_expertmap_add(st, 14 * (s.P + s.D), s.sem, s.H, s.probs, s.L * s.J, NULL,
                                     NULL));
        const int32_t N = s.L * s.J;
        const int32_t caches[] = {N / 8, N / 3};
        for (size_t p = 0; p < sizeof pairs / sizeof pairs[0]; p++)
            for (int mode = FMOE_STORE_OFFLINE; mode <= FMOE_STORE_OFFLINE_UPDATE; mode++)
                for (size_t c = 0; c < 2; c++) {
                    decision_log la = {0}, lb = {0};
                    fmoe_sim_result ra, rb;
                    ASSERT_OK(run_logged(&w, st, mode, pairs[p][0], caches[c], 2, &la, &ra));
                    ASSERT_OK(run_logged(&w, st, mode, pairs[p][1], caches[c], 2, &lb, &rb));
                    if (la.n != lb.n)
                        HARNESS_FAIL("%s geometry %zu mode %d cache %d: %zu decisions, the "
                                     "reference %zu",
                                     pairs[p][0]->name, g, mode, caches[c], la.n, lb.n);
                    for (size_t i = 0; i < la.n; i++)
                        if (la.d[i].kind != lb.d[i].kind || la.d[i].a != lb.d[i].a ||
                            la.d[i].b != lb.d[i].b || la.d[i].bits != lb.d[i].bits)
                            HARNESS_FAIL("%s geometry %zu mode %d cache %d: decision %zu of %zu "
                                         "differs: %c %d %d vs %c %d %d",
                                         pairs[p][0]->name, g, mode, caches[c], i, la.n,
                                         la.d[i].kind, la.d[i].a, la.d[i].b, lb.d[i].kind,
                                         lb.d[i].a, lb.d[i].b);
                    ASSERT_EQ(ra.hits, rb.hits);
                    ASSERT_EQ(ra.misses, rb.misses);
                    ASSERT_EQ(ra.prefetches, rb.prefetches);
                    ASSERT_EQ(ra.prefetch_hits, rb.prefetch_hits);
                    ASSERT_TRUE(same_bits((float)ra.total_s, (float)rb.total_s) &&
                                ra.total_s == rb.total_s);
                    ASSERT_TRUE(la.n > 0);
                    compared += la.n;
                    free(la.d);
                    free(lb.d);
                    fmoe_sim_result_free(&ra);
                    fmoe_sim_result_free(&rb);
                }
        fmoe_expertmap_free(st);
        fmoe_sim_workload_free(&w);
        synth_free(&s);
    }
    fprintf(stderr, "  %zu decisions compared\n", compared);
}

int main(int argc, char **argv) { return RUN_TESTS(argc, argv); }
