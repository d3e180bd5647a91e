/*
 * inspect_store.c - `fmoe inspect STORE.h5 [--json]` for expert-map stores (docs/design.md §5).
 * cmd_inspect dispatches here on format "fmoe-store".
 *
 * Shows what the store is (model, geometry, capacity and fill, prefetch distance, kinds of
 * probabilities and embeddings), where it came from (source traces, split, requests and
 * tokens used), and how well it covers the space of maps: the distribution of each
 * entry's nearest-neighbour similarity (by map, by embedding, and by the RDY score the
 * deduplication uses), the experts the entries favour per layer, and the hit counters.
 * Nearest neighbours are computed for at most SAMPLE entries (evenly spaced; fewer for very
 * large stores, about 1e10 multiply-adds in all) against the whole store; the output says
 * when it sampled.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cmd_common.h"
#include "fmoe/error.h"
#include "fmoe/expertmap.h"
#include "fmoe/store.h"

int cmd_inspect_store(const char *path, int json);

#define SAMPLE 2048
#define BINS 10

static const char *const CMD = "inspect";

typedef struct dist {
    double mean, min, p10, p50, p90, max;
    int64_t hist[BINS]; /* [0, 1) in BINS equal bins; below 0 counts in the first */
} dist;

static int cmp_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static double quantile(const float *v, int32_t n, double q) {
    if (n == 0) return 0;
    const double pos = q * (n - 1);
    const int32_t lo = (int32_t)floor(pos), hi = lo + 1 < n ? lo + 1 : lo;
    return v[lo] + (v[hi] - v[lo]) * (pos - lo);
}

/* Sorts v. Histogram of [0, 1] in BINS bins (values below 0 count in the first). */
static dist summarise(float *v, int32_t n) {
    dist d;
    memset(&d, 0, sizeof d);
    if (n == 0) return d;
    qsort(v, (size_t)n, sizeof *v, cmp_float);
    double s = 0;
    for (int32_t i = 0; i < n; i++) {
        s += v[i];
        int b = (int)floor(v[i] * BINS);
        b = b < 0 ? 0 : b >= BINS ? BINS - 1 : b;
        d.hist[b]++;
    }
    d.mean = s / n;
    d.min = v[0];
    d.max = v[n - 1];
    d.p10 = quantile(v, n, 0.1);
    d.p50 = quantile(v, n, 0.5);
    d.p90 = quantile(v, n, 0.9);
    return d;
}

static void print_dist(const char *name, const dist *d, int32_t n) {
    printf("  %-14s mean %.3f  min %.3f  p10 %.3f  p50 %.3f  p90 %.3f  max %.3f\n", name,
           d->mean, d->min, d->p10, d->p50, d->p90, d->max);
    printf("  %-14s", "");
    for (int b = 0; b < BINS; b++)
        printf(" %.1f-%.1f:%lld", b / (double)BINS, (b + 1) / (double)BINS, (long long)d->hist[b]);
    printf("  (of %d)\n", n);
}

static cJSON *dist_json(const dist *d) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "mean", d->mean);
    cJSON_AddNumberToObject(o, "min", d->min);
    cJSON_AddNumberToObject(o, "p10", d->p10);
    cJSON_AddNumberToObject(o, "p50", d->p50);
    cJSON_AddNumberToObject(o, "p90", d->p90);
    cJSON_AddNumberToObject(o, "max", d->max);
    cJSON *h = cJSON_AddArrayToObject(o, "histogram_0_to_1");
    for (int b = 0; b < BINS; b++) cJSON_AddItemToArray(h, cJSON_CreateNumber((double)d->hist[b]));
    return o;
}

int cmd_inspect_store(const char *path, int json) {
    fmoe_store_file *f = NULL;
    int rc = fmoe_store_read(path, 1, &f);
    if (rc < 0) return cmd_fail(CMD, rc);
    const fmoe_expertmap_config *c = fmoe_expertmap_config_of(f->store);
    const int32_t E = fmoe_expertmap_size(f->store), L = c->num_layers, J = c->num_experts;
    /* at most SAMPLE entries, and about 1e10 multiply-adds (seconds, not minutes) */
    const double per = (double)(E > 0 ? E : 1) * ((double)L * J + c->semantic_dim);
    int32_t n = E < SAMPLE ? E : SAMPLE;
    if ((double)n * per > 1e10) n = (int32_t)(1e10 / per) < 64 ? (E < 64 ? E : 64) : (int32_t)(1e10 / per);
    int32_t *ids = malloc((size_t)(n ? n : 1) * sizeof *ids);
    float *nm = malloc((size_t)(n ? n : 1) * sizeof *nm), *ns = malloc((size_t)(n ? n : 1) * sizeof *ns),
          *nr = malloc((size_t)(n ? n : 1) * sizeof *nr);
    if (!ids || !nm || !ns || !nr) {
        rc = cmd_failf(CMD, "out of memory");
        goto done;
    }
    for (int32_t i = 0; i < n; i++) ids[i] = (int32_t)((int64_t)i * E / n);
    if (E > 1 && (rc = fmoe_expertmap_nearest(f->store, ids, n, nm, ns, nr)) < 0) {
        rc = cmd_fail(CMD, rc);
        goto done;
    }
    const int32_t nn = E > 1 ? n : 0;
    dist dm = summarise(nm, nn), ds = summarise(ns, c->semantic_dim ? nn : 0),
         dr = summarise(nr, nn);
    const uint32_t *hits = fmoe_expertmap_hits(f->store);
    int64_t hit_entries = 0, hit_total = 0;
    uint32_t hit_max = 0;
    for (int32_t y = 0; y < E; y++) {
        hit_entries += hits[y] > 0;
        hit_total += hits[y];
        if (hits[y] > hit_max) hit_max = hits[y];
    }
    const uint32_t *pop = fmoe_expertmap_popularity(f->store);
    const double bytes = (double)c->capacity * (c->semantic_dim + (double)L * J) * 4.0;
    char b[32];

    if (json) {
        cJSON *root = cJSON_CreateObject();
        cJSON_AddStringToObject(root, "file", path);
        cJSON_AddStringToObject(root, "format", FMOE_STORE_FORMAT);
        cJSON_AddNumberToObject(root, "version", FMOE_STORE_VERSION);
        cJSON_AddStringToObject(root, "model_name", f->model_name);
        cJSON_AddStringToObject(root, "model_fingerprint", f->model_fingerprint);
        cJSON_AddNumberToObject(root, "capacity", c->capacity);
        cJSON_AddNumberToObject(root, "size", E);
        cJSON_AddNumberToObject(root, "num_layers", L);
        cJSON_AddNumberToObject(root, "num_experts", J);
        cJSON_AddNumberToObject(root, "top_k", c->top_k);
        cJSON_AddNumberToObject(root, "semantic_dim", c->semantic_dim);
        cJSON_AddStringToObject(root, "semantic_kind", f->semantic_kind);
        cJSON_AddNumberToObject(root, "prefetch_distance", c->prefetch_distance);
        cJSON_AddStringToObject(root, "probs_kind", fmoe_probs_kind_name(f->probs_kind));
        cJSON_AddNumberToObject(root, "memory_bytes", bytes);
        cJSON_AddNumberToObject(root, "split", f->split);
        cJSON_AddNumberToObject(root, "split_seed", (double)f->split_seed);
        cJSON_AddNumberToObject(root, "requests_used", (double)f->num_used);
        cJSON_AddNumberToObject(root, "requests_held_out", (double)f->num_held_out);
        cJSON_AddNumberToObject(root, "tokens_used", (double)f->tokens_used);
        cJSON *srcs = cJSON_AddArrayToObject(root, "sources");
        for (int32_t s = 0; s < f->num_sources; s++) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "path", f->sources[s].path);
            cJSON_AddStringToObject(o, "dataset", f->sources[s].dataset);
            cJSON_AddStringToObject(o, "created", f->sources[s].created);
            cJSON_AddNumberToObject(o, "num_requests", (double)f->sources[s].num_requests);
            cJSON_AddItemToArray(srcs, o);
        }
        cJSON *nnj = cJSON_AddObjectToObject(root, "nearest_neighbour");
        cJSON_AddNumberToObject(nnj, "entries_sampled", nn);
        cJSON_AddItemToObject(nnj, "map", dist_json(&dm));
        if (c->semantic_dim) cJSON_AddItemToObject(nnj, "semantic", dist_json(&ds));
        cJSON_AddItemToObject(nnj, "rdy", dist_json(&dr));
        cJSON *hj = cJSON_AddObjectToObject(root, "hits");
        cJSON_AddNumberToObject(hj, "entries_hit", (double)hit_entries);
        cJSON_AddNumberToObject(hj, "total", (double)hit_total);
        cJSON_AddNumberToObject(hj, "max", hit_max);
        cJSON *pl = cJSON_AddArrayToObject(root, "experts_favoured_per_layer");
        for (int32_t l = 0; l < L; l++) {
            int32_t used = 0;
            for (int32_t j = 0; j < J; j++) used += pop[(size_t)l * J + j] > 0;
            cJSON_AddItemToArray(pl, cJSON_CreateNumber(used));
        }
        char *text = cJSON_Print(root);
        if (text) puts(text);
        free(text);
        cJSON_Delete(root);
        rc = CMD_EXIT_OK;
        goto done;
    }

    printf("%s: fmoe expert-map store, version %d\n", path, FMOE_STORE_VERSION);
    printf("  model        %s\n", f->model_name[0] ? f->model_name : "(unnamed)");
    printf("  fingerprint  %s\n", f->model_fingerprint[0] ? f->model_fingerprint : "(none)");
    printf("  geometry     %d MoE layers, %d experts, top-%d; prefetch distance %d\n", L, J,
           c->top_k, c->prefetch_distance);
    printf("  entries      %d of %d (%.1f%% full), %s at capacity in memory\n", E, c->capacity,
           c->capacity ? 100.0 * E / c->capacity : 0.0, cmd_format_bytes(bytes, b, sizeof b));
    printf("  probs        %s%s\n", fmoe_probs_kind_name(f->probs_kind),
           f->probs_kind == FMOE_PROBS_TOPK ? " (maps hold the chosen experts' weights, the rest 0)"
                                            : "");
    if (c->semantic_dim)
        printf("  semantic     %d-dim %s\n", c->semantic_dim, f->semantic_kind);
    else
        printf("  semantic     none (the first %d layers fall back to the most frequent experts)\n",
               c->prefetch_distance);
    printf("  built from   %lld tokens of %lld requests", (long long)f->tokens_used,
           (long long)f->num_used);
    if (f->split < 1)
        printf("; split %.3g (seed %llu), %lld requests held out", f->split,
               (unsigned long long)f->split_seed, (long long)f->num_held_out);
    printf("\n  sources\n");
    for (int32_t s = 0; s < f->num_sources; s++)
        printf("    %s (%s, %lld requests, created %s)\n", f->sources[s].path,
               f->sources[s].dataset[0] ? f->sources[s].dataset : "no dataset name",
               (long long)f->sources[s].num_requests, f->sources[s].created);
    printf("\ncoverage: each entry's similarity to its nearest other entry%s\n",
           nn < E ? " (sampled)" : "");
    if (nn == 0) {
        printf("  (fewer than two entries)\n");
    } else {
        print_dist("map cosine", &dm, nn);
        if (c->semantic_dim) print_dist("semantic cos", &ds, nn);
        print_dist("RDY", &dr, nn);
    }
    printf("\nexperts among some entry's top-%d, per layer (of %d):", c->top_k, J);
    for (int32_t l = 0; l < L; l++) {
        int32_t used = 0;
        for (int32_t j = 0; j < J; j++) used += pop[(size_t)l * J + j] > 0;
        printf("%s%d", l % 16 ? " " : "\n  ", used);
    }
    printf("\nhits: %lld entries matched at least once, %lld matches, most %u\n",
           (long long)hit_entries, (long long)hit_total, hit_max);
    rc = CMD_EXIT_OK;
done:
    free(ids);
    free(nm);
    free(ns);
    free(nr);
    fmoe_store_file_free(f);
    return rc;
}
