/*
 * test_fmoe_sim.c - the fmoe policies in the simulator (sim/ executor) on a synthetic
 * workload whose requests follow one of a few "topics": per-layer expert distributions,
 * with a semantic embedding that names the topic. A store built from other requests of
 * the same topics must let fmoe beat LRU in a small cache, semantic search must help the
 * first d layers, runs must be deterministic, and the matcher's delay must cost only
 * through late prefetches.
 */
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "fmoe/expertmap.h"
#include "fmoe/sim.h"
#include "harness.h"

enum { L = 8, J = 16, K = 2, H = 4, TOPICS = 4, PROMPT = 4, OUTPUT = 12, REQ = 40 };

static uint64_t rng = 12345;
static double urand(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng >> 11) / 9007199254740992.0;
}

typedef struct synth {
    float topic[TOPICS][L][J];
    int req_topic[REQ];
    float *probs;    /* [T][L][J] */
    uint16_t *experts; /* [T][L][K] */
    float *sem;      /* [T][H] */
    uint8_t *phase;  /* [T] */
} synth;

static void make(synth *s) {
    for (int t = 0; t < TOPICS; t++)
        for (int l = 0; l < L; l++) {
            double sum = 0;
            for (int j = 0; j < J; j++) {
                double v = urand();
                v = v * v * v * v * v * v;
                s->topic[t][l][j] = (float)v;
                sum += v;
            }
            for (int j = 0; j < J; j++) s->topic[t][l][j] = (float)(s->topic[t][l][j] / sum);
        }
    const int T = REQ * (PROMPT + OUTPUT);
    s->probs = calloc((size_t)T * L * J, sizeof *s->probs);
    s->experts = calloc((size_t)T * L * K, sizeof *s->experts);
    s->sem = calloc((size_t)T * H, sizeof *s->sem);
    s->phase = calloc((size_t)T, 1);
    for (int r = 0; r < REQ; r++) {
        const int tp = r % TOPICS;
        s->req_topic[r] = tp;
        for (int k = 0; k < PROMPT + OUTPUT; k++) {
            const int t = r * (PROMPT + OUTPUT) + k;
            s->phase[t] = k < PROMPT ? 0 : 1;
            for (int i = 0; i < H; i++) s->sem[t * H + i] = (i == tp ? 1.0f : 0.0f) + 0.2f * (float)urand();
            for (int l = 0; l < L; l++) {
                float *p = s->probs + ((size_t)t * L + l) * J;
                double sum = 0;
                for (int j = 0; j < J; j++) {
                    p[j] = 0.9f * s->topic[tp][l][j] + 0.1f * (float)urand() / J;
                    sum += p[j];
                }
                for (int j = 0; j < J; j++) p[j] = (float)(p[j] / sum);
                int32_t top[K];
                for (int a = 0; a < K; a++) {
                    int b = -1;
                    for (int j = 0; j < J; j++) {
                        int used = 0;
                        for (int c = 0; c < a; c++) used |= top[c] == j;
                        if (!used && (b < 0 || p[j] > p[b])) b = j;
                    }
                    top[a] = b;
                    s->experts[((size_t)t * L + l) * K + a] = (uint16_t)b;
                }
            }
        }
    }
}

static void synth_free(synth *s) {
    free(s->probs);
    free(s->experts);
    free(s->sem);
    free(s->phase);
}

/* Requests [r0, r1) into a workload with probabilities and embeddings. */
static int workload(const synth *s, int r0, int r1, fmoe_sim_workload *w) {
    FMOE_FORWARD_IF_ERROR(fmoe_sim_workload_init(w, L, J, K, 50000000));
    FMOE_FORWARD_IF_ERROR(fmoe_sim_workload_keep_gates(w, FMOE_PROBS_FULL, 0));
    const int n = PROMPT + OUTPUT;
    for (int r = r0; r < r1; r++) {
        const size_t t = (size_t)r * n;
        FMOE_FORWARD_IF_ERROR(fmoe_sim_workload_add_request_gates(
            w, r, 0, PROMPT, OUTPUT, n, s->phase + t, s->experts + t * L * K,
            s->probs + t * L * J, NULL));
    }
    w->semantic_dim = H;
    w->semantic = malloc((size_t)(r1 - r0) * n * H * sizeof *w->semantic);
    if (!w->semantic) return FMOE_ENOMEM;
    memcpy(w->semantic, s->sem + (size_t)r0 * n * H, (size_t)(r1 - r0) * n * H * sizeof *w->semantic);
    return 0;
}

static int store_of(const synth *s, int r1, fmoe_expertmap **out) {
    const fmoe_expertmap_config c = {.capacity = 200, .num_layers = L, .num_experts = J,
                                     .top_k = K, .semantic_dim = H, .prefetch_distance = 2};
    FMOE_FORWARD_IF_ERROR(fmoe_expertmap_init(out, &c));
    const int n = r1 * (PROMPT + OUTPUT);
    return fmoe_expertmap_add(*out, n, s->sem, H, s->probs, L * J, NULL, NULL);
}

static int run(const fmoe_sim_workload *w, const fmoe_expertmap *st, const char *policy,
               int32_t cache, double delay, fmoe_sim_result *out) {
    fmoe_hardware_profile hw;
    fmoe_sim_costs costs;
    FMOE_FORWARD_IF_ERROR(fmoe_hardware_preset("rtx3090-pcie4", &hw));
    FMOE_FORWARD_IF_ERROR(fmoe_sim_costs_init(&costs, &hw, NULL, 50000000, 1024, 16));
    costs.match_delay_s = delay;
    fmoe_sim_config cfg = {.policy = policy, .cache_experts = cache, .prefetch_distance = 2,
                           .costs = &costs, .expert_store = st};
    if (fmoe_policy_setting_find(fmoe_policy_find(policy), "store_mode")) /* the fmoe ones */
        FMOE_FORWARD_IF_ERROR(
            fmoe_policy_settings_set(&cfg.policy_settings, "store_mode", "offline"));
    return fmoe_sim_run(w, &cfg, out);
}

TEST(fmoe_beats_lru_with_a_matching_store) {
    synth s;
    make(&s);
    fmoe_sim_workload w;
    memset(&w, 0, sizeof w);
    fmoe_expertmap *st = NULL;
    ASSERT_OK(workload(&s, 28, REQ, &w)); /* 12 held-out requests */
    ASSERT_OK(store_of(&s, 28, &st));
    fmoe_sim_result f, t, l, f2;
    ASSERT_OK(run(&w, st, "fmoe", 12, 0, &f));
    ASSERT_OK(run(&w, st, "fmoe-map-t", 12, 0, &t));
    ASSERT_OK(run(&w, st, "lru", 12, 0, &l));
    ASSERT_OK(run(&w, st, "fmoe", 12, 0, &f2));
    fprintf(stderr, "  hits: fmoe %lld, fmoe-map-t %lld, lru %lld of %lld\n", (long long)f.hits,
            (long long)t.hits, (long long)l.hits, (long long)f.accesses);
    ASSERT_TRUE(f.hits > l.hits);
    /* semantic search helps the first d = 2 layers */
    ASSERT_TRUE(f.per_layer[0].hits + f.per_layer[1].hits >
                t.per_layer[0].hits + t.per_layer[1].hits);
    /* deterministic */
    ASSERT_EQ(f.hits, f2.hits);
    ASSERT_EQ(f.prefetches, f2.prefetches);
    ASSERT_NEAR(f.total_s, f2.total_s, 0);
    fmoe_sim_result_free(&f);
    fmoe_sim_result_free(&t);
    fmoe_sim_result_free(&l);
    fmoe_sim_result_free(&f2);
    fmoe_expertmap_free(st);
    fmoe_sim_workload_free(&w);
    synth_free(&s);
}

TEST(fmoe_match_delay_only_makes_prefetches_late) {
    synth s;
    make(&s);
    fmoe_sim_workload w;
    memset(&w, 0, sizeof w);
    fmoe_expertmap *st = NULL;
    ASSERT_OK(workload(&s, 28, REQ, &w));
    ASSERT_OK(store_of(&s, 28, &st));
    fmoe_sim_result a, b, c;
    ASSERT_OK(run(&w, st, "fmoe", 40, 0, &a));
    /* 1 us, far below a transfer: next to nothing changes (a prefetch may now start just
     * after a demand load issued at the same instant) */
    ASSERT_OK(run(&w, st, "fmoe", 40, 1e-6, &b));
    ASSERT_OK(run(&w, st, "fmoe", 40, 1.0, &c)); /* a second: every prefetch comes too late */
    ASSERT_TRUE(llabs(a.hits - b.hits) <= a.accesses / 100);
    ASSERT_TRUE(c.prefetch_hits < a.prefetch_hits);
    ASSERT_TRUE(c.total_s >= a.total_s);
    fmoe_sim_result_free(&a);
    fmoe_sim_result_free(&b);
    fmoe_sim_result_free(&c);
    fmoe_expertmap_free(st);
    fmoe_sim_workload_free(&w);
    synth_free(&s);
}

TEST(fmoe_online_mode_learns_during_the_replay) {
    synth s;
    make(&s);
    fmoe_sim_workload w;
    memset(&w, 0, sizeof w);
    ASSERT_OK(workload(&s, 0, REQ, &w));
    fmoe_hardware_profile hw;
    fmoe_sim_costs costs;
    ASSERT_OK(fmoe_hardware_preset("rtx3090-pcie4", &hw));
    ASSERT_OK(fmoe_sim_costs_init(&costs, &hw, NULL, 50000000, 1024, 16));
    /* feedback off: what is checked is that the store learns maps that predict, and on this
     * link-bound workload (50 MB experts) the admission rightly refuses most prefetches */
    fmoe_sim_config cfg = {.policy = "fmoe", .cache_experts = 12, .prefetch_distance = 2,
                           .costs = &costs, .feedback = -1};
    ASSERT_OK(fmoe_policy_settings_set(&cfg.policy_settings, "store_mode", "online"));
    ASSERT_OK(fmoe_policy_settings_set(&cfg.policy_settings, "store_capacity", "100"));
    fmoe_sim_result r;
    ASSERT_OK(fmoe_sim_run(&w, &cfg, &r));
    ASSERT_TRUE(r.prefetch_hits > 0);
    fmoe_sim_result_free(&r);
    fmoe_sim_workload_free(&w);
    synth_free(&s);
}

int main(int argc, char **argv) { return RUN_TESTS(argc, argv); }
