/*
 * simulate_output.c - `fmoe simulate`'s output: the table per unit, JSON, CSV and the plot
 * (simulate_impl.h).
 */
#include <cjson/cJSON.h>
#include <glob.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <errno.h>
#include <limits.h>
#include <string.h>
#include <unistd.h>

#include "cmd_common.h"
#include "plot_svg.h"
#include "paths.h"
#include "simulate_store.h" /* the fmoe policies' expert-map store */
#include "policy_opts.h"    /* --policy-opt and its shorthands */
#include "sweep.h"          /* --sweep-out, --resume, MPI ranks */
#include "fmoe/datasets.h"
#include "fmoe/decision_log.h"
#include "fmoe/error.h"
#include "files.h"
#include "sha256.h"
#include "fmoe/geometry.h"
#include "fmoe/gguf.h"
#include "fmoe/hardware.h"
#include "fmoe/policy.h"
#include "fmoe/predictor.h"
#include "fmoe/sim.h"
#include "fmoe/trace.h"
#include "simulate_impl.h"

static const char *const CMD = SIM_CMD;

/* ------------------------------------------------------------------ output */

static double hit_rate(const fmoe_sim_result *r) {
    return r->accesses ? (double)r->hits / (double)r->accesses : 0.0;
}

const char *simulate_miss_name(int32_t m) {
    return m == FMOE_SIM_MISS_CPU ? "cpu" : m == FMOE_SIM_MISS_AUTO ? "auto" : "load";
}

/* A ratio that may be undefined (NAN): null in JSON. */
static void add_ratio(cJSON *o, const char *key, double v) {
    if (isnan(v)) cJSON_AddNullToObject(o, key);
    else cJSON_AddNumberToObject(o, key, v);
}

static double layer_ratio(int64_t num, int64_t den) {
    return den > 0 ? (double)num / (double)den : NAN;
}

static cJSON *summary_json(const fmoe_sim_summary *s) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "mean", s->mean);
    cJSON_AddNumberToObject(o, "p50", s->p50);
    cJSON_AddNumberToObject(o, "p90", s->p90);
    cJSON_AddNumberToObject(o, "p99", s->p99);
    return o;
}

/* One unit's JSON document (what a sweep of one trace on one hardware prints). */
/* --gap-split: belady's result at r's cache size among res[0..n), or NULL. */
static const fmoe_sim_result *belady_at(const fmoe_sim_result *res, size_t n,
                                        const fmoe_sim_result *r) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(res[i].policy, "belady") == 0 && res[i].cache_experts == r->cache_experts)
            return &res[i];
    return NULL;
}

/* The gap of r to belady in accesses (hits short of belady's), in parts that sum to it
 * (docs/simulating.md#the-gap-to-belady-in-parts): late = accesses found in flight, wrong =
 * misses of an expert displaced by a prefetch unused by then, eviction = the rest (the
 * misses beyond belady's that neither explains: what a better eviction would avoid; it is
 * negative where prefetching saved more misses than it cost). */
typedef struct gap_parts {
    int64_t total, eviction, wrong, late;
} gap_parts;

static gap_parts gap_split_of(const fmoe_sim_result *r, const fmoe_sim_result *b) {
    gap_parts g = {.total = b->hits - r->hits, .late = r->late_hits,
                   .wrong = r->wrong_prefetch_misses > 0 ? r->wrong_prefetch_misses : 0};
    g.eviction = g.total - g.late - g.wrong;
    return g;
}

void simulate_print_gap_split(const fmoe_sim_result *res, size_t n, const size_t *order) {
    printf("\ngap to belady (its hits minus the policy's, in accesses) = eviction + "
           "wrong prefetch + late prefetch\n");
    printf("%-17s %6s %2s %9s %9s %9s %9s\n", "policy", "cache", "d", "gap", "eviction",
           "wrong", "late");
    for (size_t k = 0; k < n; k++) {
        const fmoe_sim_result *r = &res[order[k]], *b = belady_at(res, n, r);
        if (!b || r == b) continue;
        const gap_parts g = gap_split_of(r, b);
        printf("%-17s %6d %2d %9lld %9lld %9lld %9lld\n", r->policy, r->cache_experts,
               r->prefetch_distance, (long long)g.total, (long long)g.eviction,
               (long long)g.wrong, (long long)g.late);
    }
}

cJSON *simulate_unit_json(const options *o, const fmoe_hardware_profile *hw, int64_t expert_bytes,
                        const expert_size *es, const fmoe_sim_workload *w,
                        const fmoe_sim_result *res, size_t n) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "trace", o->trace);
    cJSON_AddStringToObject(root, "hardware", hw->name);
    cJSON_AddNumberToObject(root, "expert_bytes", (double)expert_bytes);
    /* whose size: the trace's, or --model-config's (then with the trace's, 0: none) */
    cJSON_AddStringToObject(root, "expert_bytes_from", es->from);
    if (o->model_config) {
        cJSON_AddStringToObject(root, "model_config", o->model_config);
        cJSON_AddNumberToObject(root, "trace_expert_bytes", (double)es->trace_bytes);
    }
    if (es->layers) {
        cJSON *a = cJSON_AddArrayToObject(root, "layer_expert_bytes");
        for (int32_t l = 0; l < w->num_layers; l++)
            cJSON_AddItemToArray(a, cJSON_CreateNumber((double)es->layers[l]));
    }
    cJSON_AddNumberToObject(root, "requests", (double)w->num_requests);
    cJSON_AddNumberToObject(root, "iterations", (double)w->num_iterations);
    cJSON_AddNumberToObject(root, "accesses", (double)w->num_accesses);
    if (o->arrivals) cJSON_AddStringToObject(root, "arrivals", o->arrivals);
    /* "batch" only when batching, so that --batch 1 prints what earlier versions did */
    if (o->batch > 1) {
        cJSON_AddNumberToObject(root, "batch", o->batch);
        cJSON_AddNumberToObject(root, "batch_tokens", w->batch_tokens);
    }
    if (o->batch_trace) { /* the passes of the served trace; "batch" their widest */
        cJSON_AddNumberToObject(root, "batch", w->batch);
        cJSON_AddStringToObject(root, "batch_source", "trace");
    }
    cJSON *arr = cJSON_AddArrayToObject(root, "results");
    for (size_t i = 0; i < n; i++) {
        const fmoe_sim_result *r = &res[i];
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "policy", r->policy);
        cJSON_AddNumberToObject(x, "cache_experts", r->cache_experts);
        cJSON_AddNumberToObject(x, "cache_bytes", (double)r->cache_experts * (double)expert_bytes);
        cJSON_AddNumberToObject(x, "prefetch_distance", r->prefetch_distance);
        if (r->batch > 1) cJSON_AddNumberToObject(x, "batch", r->batch);
        cJSON_AddNumberToObject(x, "accesses", (double)r->accesses);
        cJSON_AddNumberToObject(x, "hits", (double)r->hits);
        cJSON_AddNumberToObject(x, "late_hits", (double)r->late_hits);
        cJSON_AddNumberToObject(x, "misses", (double)r->misses);
        cJSON_AddNumberToObject(x, "hit_rate", hit_rate(r));
        cJSON_AddNumberToObject(x, "prefetches", (double)r->prefetches);
        cJSON_AddNumberToObject(x, "prefetch_hits", (double)r->prefetch_hits);
        cJSON_AddNumberToObject(x, "bypassed", (double)r->bypassed);
        cJSON_AddNumberToObject(x, "bytes_loaded", (double)r->bytes_loaded);
        cJSON_AddNumberToObject(x, "wasted_prefetch_bytes", (double)r->wasted_prefetch_bytes);
        const fmoe_sim_result *bel = o->gap_split ? belady_at(res, n, r) : NULL;
        if (bel && bel != r) {
            const gap_parts g = gap_split_of(r, bel);
            cJSON *gs = cJSON_AddObjectToObject(x, "gap_split");
            cJSON_AddNumberToObject(gs, "belady_hits", (double)bel->hits);
            cJSON_AddNumberToObject(gs, "total", (double)g.total);
            cJSON_AddNumberToObject(gs, "eviction", (double)g.eviction);
            cJSON_AddNumberToObject(gs, "wrong_prefetch", (double)g.wrong);
            cJSON_AddNumberToObject(gs, "late_prefetch", (double)g.late);
        }
        add_ratio(x, "prefetch_precision", r->prefetch_precision);
        add_ratio(x, "prefetch_recall", r->prefetch_recall);
        add_ratio(x, "goodpred", r->goodpred);
        cJSON_AddStringToObject(x, "miss", simulate_miss_name(r->miss_mode));
        cJSON_AddNumberToObject(x, "host_misses", (double)r->host_misses);
        cJSON_AddNumberToObject(x, "host_busy_s", r->host_busy_s);
        cJSON_AddNumberToObject(x, "stall_s", r->stall_s);
        cJSON_AddNumberToObject(x, "total_s", r->total_s);
        cJSON_AddItemToObject(x, "ttft_s", summary_json(&r->ttft_s));
        cJSON_AddItemToObject(x, "tpot_s", summary_json(&r->tpot_s));
        cJSON_AddItemToObject(x, "e2e_s", summary_json(&r->e2e_s));
        cJSON_AddItemToObject(x, "queue_s", summary_json(&r->queue_s));
        cJSON *pp = cJSON_AddObjectToObject(x, "per_phase");
        for (int ph = 0; ph < 2; ph++) {
            const fmoe_sim_layer_stats *s = &r->per_phase[ph];
            cJSON *y = cJSON_AddObjectToObject(pp, ph ? "decode" : "prefill");
            cJSON_AddNumberToObject(y, "accesses", (double)s->accesses);
            cJSON_AddNumberToObject(y, "hits", (double)s->hits);
            cJSON_AddNumberToObject(y, "late_hits", (double)s->late_hits);
            cJSON_AddNumberToObject(y, "misses", (double)s->misses);
            cJSON_AddNumberToObject(y, "hit_rate",
                                    s->accesses ? (double)s->hits / (double)s->accesses : 0.0);
            cJSON_AddNumberToObject(y, "bytes_loaded", (double)s->bytes_loaded);
            cJSON_AddNumberToObject(y, "prefetches", (double)s->prefetches);
            cJSON_AddNumberToObject(y, "prefetch_hits", (double)s->prefetch_hits);
            cJSON_AddNumberToObject(y, "host_misses", (double)s->host_misses);
            cJSON_AddNumberToObject(y, "stall_s", s->stall_s);
        }
        cJSON *pl = cJSON_AddArrayToObject(x, "per_layer");
        for (int32_t l = 0; l < r->num_layers; l++) {
            const fmoe_sim_layer_stats *s = &r->per_layer[l];
            cJSON *y = cJSON_CreateObject();
            cJSON_AddNumberToObject(y, "layer", l);
            cJSON_AddNumberToObject(y, "accesses", (double)s->accesses);
            cJSON_AddNumberToObject(y, "hits", (double)s->hits);
            cJSON_AddNumberToObject(y, "late_hits", (double)s->late_hits);
            cJSON_AddNumberToObject(y, "misses", (double)s->misses);
            cJSON_AddNumberToObject(y, "hit_rate",
                                    s->accesses ? (double)s->hits / (double)s->accesses : 0.0);
            cJSON_AddNumberToObject(y, "bytes_loaded", (double)s->bytes_loaded);
            cJSON_AddNumberToObject(y, "prefetches", (double)s->prefetches);
            cJSON_AddNumberToObject(y, "prefetch_hits", (double)s->prefetch_hits);
            cJSON_AddNumberToObject(y, "wasted_prefetch_bytes", (double)s->wasted_prefetch_bytes);
            const int64_t used = s->prefetch_hits + s->late_hits;
            add_ratio(y, "prefetch_precision", layer_ratio(used, s->prefetches));
            add_ratio(y, "prefetch_recall", layer_ratio(used, used + s->misses));
            add_ratio(y, "goodpred", layer_ratio(s->prefetch_hits, used + s->misses));
            cJSON_AddNumberToObject(y, "host_misses", (double)s->host_misses);
            cJSON_AddNumberToObject(y, "stall_s", s->stall_s);
            cJSON_AddItemToArray(pl, y);
        }
        cJSON_AddItemToArray(arr, x);
    }
    return root;
}

/* --plot: hit rate and latency (TPOT p50, or TTFT p50 for a trace without decode) against
 * cache size, one series per (policy, prefetch distance), points sorted by cache size. */
int simulate_write_plot(const char *path, const char *trace, const fmoe_sim_result *res,
                      size_t n) {
    size_t *order = malloc((n ? n : 1) * sizeof *order);
    double *x = malloc((n ? n : 1) * sizeof *x), *hit = malloc((n ? n : 1) * sizeof *hit);
    double *lat = malloc((n ? n : 1) * sizeof *lat);
    plot_series *sh = calloc(n ? n : 1, sizeof *sh), *sl = calloc(n ? n : 1, sizeof *sl);
    char (*labels)[64] = calloc(n ? n : 1, sizeof *labels);
    int rc = 0;
    if (!order || !x || !hit || !lat || !sh || !sl || !labels) {
        rc = fmoe_error_set(FMOE_ENOMEM, "plot of %zu results", n);
        goto done;
    }
    int decode = 0;
    for (size_t i = 0; i < n; i++) decode |= res[i].tpot_s.p50 > 0;
    /* group (policy, distance) in order of first appearance, each by cache size */
    size_t m = 0;
    int32_t ns = 0;
    uint8_t *taken = calloc(n ? n : 1, 1);
    if (!taken) {
        rc = fmoe_error_set(FMOE_ENOMEM, "plot");
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        if (taken[i]) continue;
        const size_t first = m;
        for (size_t k = i; k < n; k++)
            if (!taken[k] && strcmp(res[k].policy, res[i].policy) == 0 &&
                res[k].prefetch_distance == res[i].prefetch_distance) {
                size_t at = m++; /* insertion by cache size */
                while (at > first && res[order[at - 1]].cache_experts > res[k].cache_experts) {
                    order[at] = order[at - 1];
                    at--;
                }
                order[at] = k;
                taken[k] = 1;
            }
        for (size_t q = first; q < m; q++) {
            x[q] = res[order[q]].cache_experts;
            hit[q] = 100.0 * hit_rate(&res[order[q]]);
            lat[q] = 1e3 * (decode ? res[order[q]].tpot_s.p50 : res[order[q]].ttft_s.p50);
        }
        int distances = 0; /* the distance is named only for a policy run at several */
        for (size_t k = 0; k < n; k++)
            distances |= strcmp(res[k].policy, res[i].policy) == 0 &&
                         res[k].prefetch_distance != res[i].prefetch_distance;
        if (distances)
            snprintf(labels[ns], sizeof labels[ns], "%s d=%d", res[i].policy,
                     res[i].prefetch_distance);
        else
            snprintf(labels[ns], sizeof labels[ns], "%s", res[i].policy);
        sh[ns] = (plot_series){labels[ns], (int32_t)(m - first), x + first, hit + first};
        sl[ns] = (plot_series){labels[ns], (int32_t)(m - first), x + first, lat + first};
        ns++;
    }
    free(taken);
    const plot_panel panels[2] = {
        {"hit rate", "cache (experts)", "hit rate (%)", ns, sh},
        {decode ? "TPOT p50" : "TTFT p50", "cache (experts)", decode ? "TPOT p50 (ms)" :
                                                                      "TTFT p50 (ms)", ns, sl}};
    rc = plot_svg_write(path, trace, panels, 2);
done:
    free(order);
    free(x);
    free(hit);
    free(lat);
    free(sh);
    free(sl);
    free(labels);
    return rc;
}

/* A CSV field: as is, or quoted when it holds a comma, quote or line break. */
static void csv_field(FILE *f, const char *s) {
    if (!strpbrk(s, ",\"\r\n")) {
        fputs(s, f);
        return;
    }
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"') fputc('"', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

/* Rows res[0..n); with several units (prefix != NULL) each row opens with its unit's
 * trace and hardware. */
int simulate_write_csv(const char *path, const fmoe_sim_result *res, size_t n,
                     const char *const *prefix) {
    /* Through PATH.partial, renamed when complete: an existing PATH is never truncated first. */
    char partial[PATH_MAX + 16];
    snprintf(partial, sizeof partial, "%s.partial", path);
    FILE *f = stdout;
    if (strcmp(path, "-") != 0) {
        int e = fmoe__partial_fopen(path, partial, "w", &f);
        if (e < 0) return cmd_fail(CMD, e);
    }
    if (prefix) fputs("trace,hardware,", f);
    fprintf(f, "policy,cache_experts,prefetch_distance,accesses,hits,late_hits,misses,hit_rate,"
               "bytes_loaded,wasted_prefetch_bytes,stall_s,total_s,ttft_mean_s,ttft_p50_s,"
               "ttft_p90_s,ttft_p99_s,tpot_mean_s,tpot_p50_s,tpot_p90_s,tpot_p99_s,e2e_mean_s,"
               "e2e_p50_s,e2e_p90_s,e2e_p99_s,prefetches,prefetch_hits,prefetch_precision,"
               "prefetch_recall,goodpred,miss,host_misses,host_busy_s,queue_mean_s,queue_p50_s,"
               "queue_p90_s,queue_p99_s\n");
    for (size_t i = 0; i < n; i++) {
        const fmoe_sim_result *r = &res[i];
        if (prefix) {
            csv_field(f, prefix[2 * i]);
            fputc(',', f);
            csv_field(f, prefix[2 * i + 1]);
            fputc(',', f);
        }
        fprintf(f, "%s,%d,%d,%lld,%lld,%lld,%lld,%.6f,%lld,%lld,%.9g,%.9g", r->policy,
                r->cache_experts, r->prefetch_distance, (long long)r->accesses,
                (long long)r->hits, (long long)r->late_hits, (long long)r->misses, hit_rate(r),
                (long long)r->bytes_loaded, (long long)r->wasted_prefetch_bytes, r->stall_s,
                r->total_s);
        const fmoe_sim_summary *s[3] = {&r->ttft_s, &r->tpot_s, &r->e2e_s};
        for (int k = 0; k < 3; k++)
            fprintf(f, ",%.9g,%.9g,%.9g,%.9g", s[k]->mean, s[k]->p50, s[k]->p90, s[k]->p99);
        fprintf(f, ",%lld,%lld", (long long)r->prefetches, (long long)r->prefetch_hits);
        const double q[3] = {r->prefetch_precision, r->prefetch_recall, r->goodpred};
        for (int k = 0; k < 3; k++) {
            if (isnan(q[k])) fputs(",", f);
            else fprintf(f, ",%.6f", q[k]);
        }
        fprintf(f, ",%s,%lld,%.9g,%.9g,%.9g,%.9g,%.9g\n", simulate_miss_name(r->miss_mode),
                (long long)r->host_misses, r->host_busy_s, r->queue_s.mean, r->queue_s.p50,
                r->queue_s.p90, r->queue_s.p99);
    }
    int bad = ferror(f);
    if (f == stdout) return bad ? cmd_failf(CMD, "standard output: write error") : 0;
    bad |= fclose(f) != 0;
    if (bad || rename(partial, path) != 0) {
        const int e = errno;
        unlink(partial);
        return cmd_failf(CMD, "%s: cannot write: %s", path, strerror(e));
    }
    return 0;
}

static const fmoe_sim_result *sort_base;
static int cmp_best(const void *a, const void *b) {
    const fmoe_sim_result *x = &sort_base[*(const size_t *)a], *y = &sort_base[*(const size_t *)b];
    if (x->e2e_s.mean != y->e2e_s.mean) return x->e2e_s.mean < y->e2e_s.mean ? -1 : 1;
    if (x->hits != y->hits) return x->hits > y->hits ? -1 : 1;
    return (*(const size_t *)a > *(const size_t *)b) - (*(const size_t *)a < *(const size_t *)b);
}

/* "  12.3%" or "      -" for an undefined ratio. */
static const char *pct(double v, char *buf, size_t cap) {
    if (isnan(v)) snprintf(buf, cap, "%7s", "-");
    else snprintf(buf, cap, "%6.1f%%", 100.0 * v);
    return buf;
}

void simulate_print_table(const options *o, const fmoe_hardware_profile *hw, int64_t expert_bytes,
                        const expert_size *es, const fmoe_sim_workload *w,
                        const fmoe_sim_result *res, size_t n, size_t *order) {
    char eb[32], cb[32], lb[32], wb[32], gp[16];
    printf("%s: %lld request%s, %lld iterations, %lld expert accesses; expert %s",
           o->trace, (long long)w->num_requests, w->num_requests == 1 ? "" : "s",
           (long long)w->num_iterations,
           (long long)w->num_accesses, cmd_format_bytes((double)expert_bytes, eb, sizeof eb));
    if (o->model_config) { /* whose size, when it is not the trace's own */
        printf(" (%sfrom --model-config %s; the trace's: %s)",
               es->layers ? "the largest layer's, " : "", o->model_config,
               es->trace_bytes ? cmd_format_bytes((double)es->trace_bytes, cb, sizeof cb)
                               : "none");
    }
    printf("; hardware %s", hw->name);
    if (o->miss_mode != FMOE_SIM_MISS_LOAD) printf("; misses: %s", simulate_miss_name(o->miss_mode));
    if (o->arrivals) printf("; arrivals: %s (FCFS)", o->arrivals);
    if (o->batch > 1) printf("; batch %d (continuous batching, %d tokens an iteration)", o->batch,
                             (int)w->batch_tokens);
    if (o->batch_trace)
        printf("; batch: the trace's served passes (up to %d requests a pass)", (int)w->batch);
    printf("\n\n");
    for (size_t i = 0; i < n; i++) order[i] = i;
    sort_base = res;
    qsort(order, n, sizeof *order, cmp_best);
    printf("%-17s %6s %10s %2s %7s %9s %9s %10s %10s %8s %9s %9s %9s %9s", "policy", "cache",
           "(bytes)", "d", "hit%", "late", "misses", "loaded", "wasted", "goodpred", "stall s",
           "TTFT p50", "TPOT p50", "e2e p99");
    if (o->arrivals) printf(" %9s", "queue p99");
    if (o->miss_mode != FMOE_SIM_MISS_LOAD) printf(" %9s", "on host");
    printf("\n");
    for (size_t k = 0; k < n; k++) {
        const fmoe_sim_result *r = &res[order[k]];
        printf("%-17s %6d %10s %2d %6.2f%% %9lld %9lld %10s %10s %8s %9.3f %7.2fms %7.2fms "
               "%8.3fs",
               r->policy, r->cache_experts,
               cmd_format_bytes((double)r->cache_experts * (double)expert_bytes, cb, sizeof cb),
               r->prefetch_distance, 100.0 * hit_rate(r), (long long)r->late_hits,
               (long long)r->misses, cmd_format_bytes((double)r->bytes_loaded, lb, sizeof lb),
               cmd_format_bytes((double)r->wasted_prefetch_bytes, wb, sizeof wb),
               pct(r->prefetches ? r->goodpred : NAN, gp, sizeof gp), r->stall_s, 1e3 * r->ttft_s.p50,
               1e3 * r->tpot_s.p50, r->e2e_s.p99);
        if (o->arrivals) printf(" %8.3fs", r->queue_s.p99);
        if (o->miss_mode != FMOE_SIM_MISS_LOAD) printf(" %9lld", (long long)r->host_misses);
        printf("\n");
    }
}
