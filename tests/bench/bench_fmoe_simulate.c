/*
 * bench_fmoe_simulate.c - end-to-end throughput of the fmoe policy in the simulator
 * (docs/design.md §9: `fmoe simulate` with the fmoe policy and a 1K-entry store >= 50 K
 * token-iterations/s per core). Not a test; tests/bench/bench_fmoe_simulate.py drives it
 * and also times the `fmoe simulate` command on the files it writes.
 *
 *     bench_fmoe_simulate [--layers L] [--experts J] [--top-k K] [--hidden h]
 *                         [--requests R] [--store-requests S] [--capacity C]
 *                         [--prompt P] [--decode D] [--cache N] [--distance d]
 *                         [--policies a,b,...] [--mode offline|offline-update|online]
 *                         [--repeat n] [--write-trace T.h5 --write-store S.h5]
 *
 * The workload is Mixtral-like by default (32 layers x 8 experts, top-2, no embeddings),
 * with the structure the store exploits: 16 "topics", each a per-layer gate distribution;
 * every request follows one topic, each token's gate row is 80% its topic's and 20% its
 * own noise (and its embedding, with --hidden h > 0, the topic's direction plus noise).
 * The store is built (deduplicated, capacity C, default 1000) from S other requests of the
 * same topics; R requests (default 200 of 20 prompt + 100 decode tokens: 24,000 tokens)
 * are replayed. One token-iteration is one token through all L layers; a prefill of n
 * tokens counts n. The time is fmoe_sim_run alone, as wall time and as this process's CPU
 * time (the per-core figure), best and median of --repeat runs. Run with
 * OPENBLAS_NUM_THREADS=1.
 *
 * Each run prints one JSON line per policy and repeat; the hits let two builds be compared
 * (same seed, same workload: identical decisions give identical counts).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fmoe/error.h"
#include "fmoe/expertmap.h"
#include "fmoe/sim.h"
#include "fmoe/store.h"
#include "fmoe/trace.h"

enum { TOPICS = 16 };

static double now(clockid_t c) {
    struct timespec ts;
    clock_gettime(c, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rs = 0x9E3779B97F4A7C15ull;
static double urand(void) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (double)(rs >> 11) / 9007199254740992.0;
}

typedef struct geo {
    int32_t L, J, K, h, P, D;
} geo;

typedef struct tokens {
    int64_t n;        /* tokens */
    float *probs;     /* [n][L][J] */
    uint16_t *experts; /* [n][L][K] */
    float *sem;       /* [n][h] or NULL */
    uint8_t *phase;   /* [n] */
} tokens;

static float *topic_rows; /* [TOPICS][L][J] */
static float *topic_dir;  /* [TOPICS][h] */

static void make_topics(const geo *g) {
    topic_rows = malloc((size_t)TOPICS * g->L * g->J * sizeof *topic_rows);
    topic_dir = g->h ? malloc((size_t)TOPICS * g->h * sizeof *topic_dir) : NULL;
    for (int t = 0; t < TOPICS; t++) {
        for (int l = 0; l < g->L; l++) {
            float *r = topic_rows + ((size_t)t * g->L + l) * g->J;
            double s = 0;
            for (int j = 0; j < g->J; j++) {
                double v = urand();
                v = v * v * v * v;
                r[j] = (float)v;
                s += v;
            }
            for (int j = 0; j < g->J; j++) r[j] = (float)(r[j] / s);
        }
        for (int i = 0; i < g->h; i++) topic_dir[(size_t)t * g->h + i] = (float)(urand() - 0.5);
    }
}

/* R requests of P + D tokens each. */
static int make_tokens(const geo *g, int32_t R, tokens *tk) {
    const int32_t T = g->P + g->D;
    tk->n = (int64_t)R * T;
    tk->probs = malloc((size_t)tk->n * g->L * g->J * sizeof *tk->probs);
    tk->experts = malloc((size_t)tk->n * g->L * g->K * sizeof *tk->experts);
    tk->sem = g->h ? malloc((size_t)tk->n * g->h * sizeof *tk->sem) : NULL;
    tk->phase = malloc((size_t)tk->n);
    if (!tk->probs || !tk->experts || (g->h && !tk->sem) || !tk->phase) return -1;
    for (int32_t r = 0; r < R; r++) {
        const int t = (int)(urand() * TOPICS) % TOPICS;
        for (int32_t k = 0; k < T; k++) {
            const int64_t x = (int64_t)r * T + k;
            tk->phase[x] = k < g->P ? FMOE_PHASE_PREFILL : FMOE_PHASE_DECODE;
            for (int32_t l = 0; l < g->L; l++) {
                const float *tr = topic_rows + ((size_t)t * g->L + l) * g->J;
                float *p = tk->probs + ((size_t)x * g->L + l) * g->J;
                double s = 0;
                for (int32_t j = 0; j < g->J; j++) {
                    double v = urand();
                    v = v * v * v;
                    p[j] = (float)(0.8 * tr[j] + 0.2 * v);
                    s += p[j];
                }
                for (int32_t j = 0; j < g->J; j++) p[j] = (float)(p[j] / s);
                uint16_t *e = tk->experts + ((size_t)x * g->L + l) * g->K;
                for (int32_t a = 0; a < g->K; a++) {
                    int32_t b = -1;
                    for (int32_t j = 0; j < g->J; j++) {
                        int used = 0;
                        for (int32_t c = 0; c < a; c++) used |= e[c] == j;
                        if (!used && (b < 0 || p[j] > p[b])) b = j;
                    }
                    e[a] = (uint16_t)b;
                }
            }
            for (int32_t i = 0; i < g->h; i++)
                tk->sem[(size_t)x * g->h + i] =
                    topic_dir[(size_t)t * g->h + i] + (float)(0.5 * (urand() - 0.5));
        }
    }
    return 0;
}

static void tokens_free(tokens *tk) {
    free(tk->probs);
    free(tk->experts);
    free(tk->sem);
    free(tk->phase);
}

static int die(const char *what) {
    fprintf(stderr, "bench_fmoe_simulate: %s: %s\n", what, fmoe_error_detail());
    return 1;
}

static int cmp_d(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int write_trace(const char *path, const geo *g, int32_t R, const tokens *tk) {
    fmoe_trace_header h;
    memset(&h, 0, sizeof h);
    snprintf(h.model_name, sizeof h.model_name, "bench-mixtral-like");
    h.num_layers = g->L;
    h.num_experts = g->J;
    h.top_k = g->K;
    h.hidden_size = g->h;
    h.expert_bytes = 352321536;
    snprintf(h.dtype, sizeof h.dtype, "bfloat16");
    snprintf(h.dataset, sizeof h.dataset, "synthetic topics");
    snprintf(h.recorded_on, sizeof h.recorded_on, "bench_fmoe_simulate");
    h.probs_kind = FMOE_PROBS_FULL;
    h.semantic_dim = g->h;
    if (g->h) snprintf(h.semantic_kind, sizeof h.semantic_kind, "embedding");
    const fmoe_trace_write_options o = {.compression = FMOE_COMPRESSION_ZSTD,
                                        .flush_requests = INT32_MAX};
    fmoe_trace_writer *w = NULL;
    FMOE_FORWARD_IF_ERROR(fmoe_trace_writer_open(&w, path, &h, &o));
    const int32_t T = g->P + g->D;
    int32_t *ids = malloc((size_t)T * sizeof *ids);
    for (int32_t i = 0; i < T; i++) ids[i] = -1;
    for (int32_t r = 0; r < R; r++) {
        const size_t x = (size_t)r * T;
        const fmoe_trace_request q = {.id = r, .prompt_tokens = g->P, .output_tokens = g->D,
                                      .token_id = ids, .phase = tk->phase + x,
                                      .experts = tk->experts + x * g->L * g->K,
                                      .probs = tk->probs + x * g->L * g->J,
                                      .semantic = g->h ? tk->sem + x * g->h : NULL};
        int rc = fmoe_trace_writer_append_request(w, &q);
        if (rc < 0) {
            fmoe_trace_writer_abort(w);
            free(ids);
            return rc;
        }
    }
    free(ids);
    return fmoe_trace_writer_close(w);
}

static int write_store(const char *path, fmoe_expertmap *st, int32_t h, int64_t used) {
    fmoe_store_file f;
    memset(&f, 0, sizeof f);
    snprintf(f.model_name, sizeof f.model_name, "bench-mixtral-like");
    f.probs_kind = FMOE_PROBS_FULL;
    if (h) snprintf(f.semantic_kind, sizeof f.semantic_kind, "embedding");
    f.split = 1;
    f.tokens_used = used;
    f.store = st;
    return fmoe_store_write(path, &f, NULL);
}

int main(int argc, char **argv) {
    geo g = {.L = 32, .J = 8, .K = 2, .h = 0, .P = 20, .D = 100};
    int32_t R = 200, S = 100, C = 1000, N = 64, d = 3, repeat = 3;
    const char *policies = "fmoe", *mode = "offline", *wtrace = NULL, *wstore = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
#define OPT_I(name, var)                                                                         \
    if (!strcmp(a, name) && v) {                                                                 \
        var = atoi(v);                                                                           \
        i++;                                                                                     \
        continue;                                                                                \
    }
#define OPT_S(name, var)                                                                         \
    if (!strcmp(a, name) && v) {                                                                 \
        var = v;                                                                                 \
        i++;                                                                                     \
        continue;                                                                                \
    }
        OPT_I("--layers", g.L) OPT_I("--experts", g.J) OPT_I("--top-k", g.K)
        OPT_I("--hidden", g.h) OPT_I("--requests", R) OPT_I("--store-requests", S)
        OPT_I("--capacity", C) OPT_I("--prompt", g.P) OPT_I("--decode", g.D)
        OPT_I("--cache", N) OPT_I("--distance", d) OPT_I("--repeat", repeat)
        OPT_S("--policies", policies) OPT_S("--mode", mode) OPT_S("--write-trace", wtrace)
        OPT_S("--write-store", wstore)
        fprintf(stderr, "usage: bench_fmoe_simulate [--layers L] [--experts J] [--top-k K] "
                        "[--hidden h] [--requests R] [--store-requests S] [--capacity C] "
                        "[--prompt P] [--decode D] [--cache N] [--distance d] "
                        "[--policies a,b] [--mode M] [--repeat n] [--write-trace T.h5 "
                        "--write-store S.h5]\n");
        return 2;
    }
    make_topics(&g);
    tokens train, eval;
    memset(&train, 0, sizeof train);
    memset(&eval, 0, sizeof eval);
    if (make_tokens(&g, S, &train) < 0 || make_tokens(&g, R, &eval) < 0) {
        fprintf(stderr, "bench_fmoe_simulate: out of memory\n");
        return 1;
    }
    const fmoe_expertmap_config sc = {.capacity = C, .num_layers = g.L, .num_experts = g.J,
                                      .top_k = g.K, .semantic_dim = g.h, .prefetch_distance = d};
    fmoe_expertmap *st = NULL;
    double t0 = now(CLOCK_PROCESS_CPUTIME_ID);
    if (fmoe_expertmap_init(&st, &sc) < 0) return die("store");
    if (fmoe_expertmap_add(st, (int32_t)train.n, train.sem, g.h, train.probs, (int64_t)g.L * g.J,
                           NULL, NULL) < 0)
        return die("store add");
    const double t_store = now(CLOCK_PROCESS_CPUTIME_ID) - t0;
    if (wtrace && wstore) {
        if (write_trace(wtrace, &g, R, &eval) < 0) return die(wtrace);
        if (write_store(wstore, st, g.h, train.n) < 0) return die(wstore);
    }
    fmoe_sim_workload w;
    memset(&w, 0, sizeof w);
    if (fmoe_sim_workload_init(&w, g.L, g.J, g.K, 352321536) < 0 ||
        fmoe_sim_workload_keep_gates(&w, FMOE_PROBS_FULL, 0) < 0)
        return die("workload");
    const int32_t T = g.P + g.D;
    for (int32_t r = 0; r < R; r++) {
        const size_t x = (size_t)r * T;
        if (fmoe_sim_workload_add_request_gates(&w, r, 0, g.P, g.D, T, eval.phase + x,
                                                eval.experts + x * g.L * g.K,
                                                eval.probs + x * g.L * g.J, NULL) < 0)
            return die("workload");
    }
    if (g.h) {
        w.semantic_dim = g.h;
        w.semantic = malloc((size_t)eval.n * g.h * sizeof *w.semantic);
        if (!w.semantic) return die("workload");
        memcpy(w.semantic, eval.sem, (size_t)eval.n * g.h * sizeof *w.semantic);
    }
    fprintf(stderr,
            "workload: L=%d J=%d K=%d h=%d; store %d of %d entries from %lld tokens (%.2f s "
            "CPU); replay %d requests, %lld iterations, %lld tokens, %lld accesses; cache %d, "
            "d=%d, mode %s\n",
            g.L, g.J, g.K, g.h, fmoe_expertmap_size(st), C, (long long)train.n, t_store, R,
            (long long)w.num_iterations, (long long)w.num_tokens, (long long)w.num_accesses, N,
            d, mode);
    fmoe_hardware_profile hw;
    fmoe_sim_costs costs;
    if (fmoe_hardware_preset("rtx3090-pcie4", &hw) < 0 ||
        fmoe_sim_costs_init(&costs, &hw, NULL, w.expert_bytes, 4096, 16) < 0)
        return die("costs");
    char *list = strdup(policies);
    double *cpu = malloc((size_t)(repeat > 0 ? repeat : 1) * sizeof *cpu);
    for (char *name = strtok(list, ","); name; name = strtok(NULL, ",")) {
        fmoe_sim_config cfg = {.policy = name, .cache_experts = N, .prefetch_distance = d,
                               .costs = &costs, .expert_store = st};
        char cap[24];
        snprintf(cap, sizeof cap, "%d", (int)C);
        fmoe_policy_settings all = {0}; /* the fmoe policies' settings; others take none */
        if (fmoe_policy_settings_set(&all, "store_mode", mode) < 0 ||
            fmoe_policy_settings_set(&all, "store_capacity", cap) < 0)
            return die("settings");
        fmoe_policy_settings_select(&cfg.policy_settings, fmoe_policy_find(name), &all);
        for (int i = 0; i < repeat; i++) {
            fmoe_sim_result res;
            const double w0 = now(CLOCK_MONOTONIC), c0 = now(CLOCK_PROCESS_CPUTIME_ID);
            if (fmoe_sim_run(&w, &cfg, &res) < 0) return die(name);
            const double wall = now(CLOCK_MONOTONIC) - w0;
            cpu[i] = now(CLOCK_PROCESS_CPUTIME_ID) - c0;
            printf("{\"policy\": \"%s\", \"L\": %d, \"J\": %d, \"h\": %d, \"C\": %d, "
                   "\"cache\": %d, \"d\": %d, \"mode\": \"%s\", \"run\": %d, \"tokens\": %lld, "
                   "\"iterations\": %lld, \"wall_s\": %.4f, \"cpu_s\": %.4f, "
                   "\"token_iterations_per_cpu_s\": %.1f, \"hits\": %lld, \"misses\": %lld, "
                   "\"prefetches\": %lld, \"prefetch_hits\": %lld, \"total_s\": %.9g}\n",
                   name, g.L, g.J, g.h, C, N, d, mode, i, (long long)w.num_tokens,
                   (long long)w.num_iterations, wall, cpu[i], (double)w.num_tokens / cpu[i],
                   (long long)res.hits, (long long)res.misses, (long long)res.prefetches,
                   (long long)res.prefetch_hits, res.total_s);
            fflush(stdout);
            fmoe_sim_result_free(&res);
        }
        qsort(cpu, (size_t)repeat, sizeof *cpu, cmp_d);
        if (repeat > 0)
            fprintf(stderr, "%-14s best %.0f, median %.0f token-iterations per CPU second\n",
                    name, (double)w.num_tokens / cpu[0],
                    (double)w.num_tokens / cpu[repeat / 2]);
    }
    free(cpu);
    free(list);
    fmoe_sim_workload_free(&w);
    fmoe_expertmap_free(st);
    tokens_free(&train);
    tokens_free(&eval);
    free(topic_rows);
    free(topic_dir);
    return 0;
}
