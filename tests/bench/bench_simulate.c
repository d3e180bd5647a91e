/*
 * bench_simulate.c - simulator throughput: expert accesses per second per policy on a large
 * synthetic trace (docs/design.md §9 target: >= 10 M accesses/s per core for lru/lfu), and the
 * hit counts of a prefix of the same trace for the comparison with the Python reference
 * (tests/bench/run_bench_simulate.sh runs both).
 *
 *     bench_simulate [--requests R] [--cache N] [--policies a,b,...] [--prefix R']
 *                    [--dump FILE]
 *
 * The trace is Mixtral-shaped (32 layers, 8 experts, top-2) with a skewed popularity (half
 * the first choices go to experts 0..2), 20 prompt tokens and 100 decode tokens per
 * request: 2000 requests are 13.3 M accesses. One thread; the time is fmoe_sim_run alone
 * (workload compilation is reported separately), as wall time and as this process's CPU
 * time (the per-core figure; they differ when the machine is busy). --prefix R' also runs
 * each policy on the first R' requests and prints its hits; --dump FILE writes those R'
 * requests' routing ("FMOEBNCH", int32 L J K R' P D, then uint16 experts [R'][P+D][L][K])
 * for the Python reference to replay the very same trace.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fmoe/error.h"
#include "fmoe/sim.h"
#include "fmoe/trace.h"

enum { L = 32, J = 8, K = 2, P = 20, D = 100, T = P + D };

static double now(clockid_t c) {
    struct timespec ts;
    clock_gettime(c, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t s = 88172645463325252ull;
static uint32_t rng(void) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return (uint32_t)(s >> 11);
}

static void make_request(uint16_t *ex) {
    for (int i = 0; i < T * L; i++) {
        uint16_t a = (uint16_t)(rng() % J), b;
        if (rng() % 2) a = (uint16_t)(a % 3); /* skew toward experts 0..2 */
        do b = (uint16_t)(rng() % J); while (b == a);
        ex[i * K] = a;
        ex[i * K + 1] = b;
    }
}

int main(int argc, char **argv) {
    int R = 2000, cache = 64, prefix = 0;
    const char *policies = "ondemand,lru,lfu,belady,least-stale,moe-infinity-code,oracle,"
                           "moe-infinity";
    const char *dump = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--requests") && i + 1 < argc) R = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--cache") && i + 1 < argc) cache = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--policies") && i + 1 < argc) policies = argv[++i];
        else if (!strcmp(argv[i], "--prefix") && i + 1 < argc) prefix = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--dump") && i + 1 < argc) dump = argv[++i];
        else {
            fprintf(stderr, "usage: bench_simulate [--requests R] [--cache N] [--policies "
                            "a,b] [--prefix R'] [--dump FILE]\n");
            return 2;
        }
    }
    if (prefix > R) prefix = R;
    static uint16_t ex[T * L * K];
    uint8_t phase[T];
    for (int t = 0; t < T; t++) phase[t] = t < P ? FMOE_PHASE_PREFILL : FMOE_PHASE_DECODE;
    fmoe_sim_workload w, wp;
    memset(&wp, 0, sizeof wp);
    FILE *df = NULL;
    if (dump) {
        df = fopen(dump, "wb");
        const int32_t head[6] = {L, J, K, prefix, P, D};
        if (!df || fwrite("FMOEBNCH", 1, 8, df) != 8 || fwrite(head, sizeof head, 1, df) != 1) {
            fprintf(stderr, "%s: cannot write\n", dump);
            return 1;
        }
    }
    double t0 = now(CLOCK_MONOTONIC);
    if (fmoe_sim_workload_init(&w, L, J, K, 352321536) < 0) return 1;
    if (prefix && fmoe_sim_workload_init(&wp, L, J, K, 352321536) < 0) return 1;
    for (int r = 0; r < R; r++) {
        make_request(ex);
        if (fmoe_sim_workload_add_request(&w, r, 0, P, D, T, phase, ex) < 0 ||
            (r < prefix && fmoe_sim_workload_add_request(&wp, r, 0, P, D, T, phase, ex) < 0)) {
            fprintf(stderr, "%s\n", fmoe_error_detail());
            return 1;
        }
        if (df && r < prefix && fwrite(ex, sizeof ex, 1, df) != 1) {
            fprintf(stderr, "%s: write error\n", dump);
            return 1;
        }
    }
    if (df && fclose(df) != 0) return 1;
    const double t_build = now(CLOCK_MONOTONIC) - t0;
    printf("workload: %d requests, %lld iterations, %lld accesses (L=%d J=%d K=%d, %d+%d "
           "tokens each), compiled in %.2f s (%.1f M accesses/s); cache %d slots\n",
           R, (long long)w.num_iterations, (long long)w.num_accesses, L, J, K, P, D, t_build,
           (double)w.num_accesses / t_build / 1e6, cache);
    fmoe_hardware_profile hw;
    fmoe_hardware_preset("rtx3090-pcie4", &hw);
    fmoe_sim_costs costs;
    if (fmoe_sim_costs_init(&costs, &hw, NULL, w.expert_bytes, 4096, 16) < 0) return 1;
    char *list = strdup(policies);
    for (char *name = strtok(list, ","); name; name = strtok(NULL, ",")) {
        fmoe_sim_config cfg = {.policy = name, .cache_experts = cache, .costs = &costs};
        fmoe_sim_result res;
        const double w0 = now(CLOCK_MONOTONIC), c0 = now(CLOCK_PROCESS_CPUTIME_ID);
        if (fmoe_sim_run(&w, &cfg, &res) < 0) {
            fprintf(stderr, "%s: %s\n", name, fmoe_error_detail());
            return 1;
        }
        const double wall = now(CLOCK_MONOTONIC) - w0, cpu = now(CLOCK_PROCESS_CPUTIME_ID) - c0;
        printf("policy %-18s accesses %lld wall_s %.3f cpu_s %.3f M_accesses_per_s_wall %.2f "
               "M_accesses_per_s_cpu %.2f hit_rate %.4f",
               name, (long long)res.accesses, wall, cpu, (double)res.accesses / wall / 1e6,
               (double)res.accesses / cpu / 1e6, (double)res.hits / (double)res.accesses);
        fmoe_sim_result_free(&res);
        if (prefix) {
            if (fmoe_sim_run(&wp, &cfg, &res) < 0) return 1;
            printf(" prefix_requests %d prefix_accesses %lld prefix_hits %lld", prefix,
                   (long long)res.accesses, (long long)res.hits);
            fmoe_sim_result_free(&res);
        }
        printf("\n");
        fflush(stdout);
    }
    free(list);
    fmoe_sim_workload_free(&w);
    fmoe_sim_workload_free(&wp);
    return 0;
}
