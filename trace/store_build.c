/*
 * store_build.c - traces -> expert-map store (`fmoe build-store`; docs/design.md §5; contract
 * in fmoe/store.h).
 *
 * Every token of every request the split keeps becomes one candidate entry (an iteration of
 * the store is one token, as in fMoE's reference implementation; "fMoE: Fine-Grained Expert
 * Offloading for Large Mixture-of-Experts Serving" §4.1): its semantic embedding and its
 * expert map (the [L][J] gate probabilities). Candidates are collected into batches of
 * `batch` tokens, in trace order, and each batch goes through fmoe_expertmap_add: appended
 * while there is room, then deduplicated with sgemm-batched redundancy scores. The batch size
 * changes only the speed, never the result (the store's add is batch-invariant).
 *
 * Requests stream in trace order, trace after trace, except for the shards of one recording
 * (`mpirun fmoe record` writes one per rank; fmoe trace merge joins them): traces of one
 * dataset whose request ids are all distinct stream in dataset order, by id across the
 * traces, so that a store built from the shards equals the one built from their merged
 * trace (the deduplication depends on the order; the split, per trace, does not follow).
 *
 * The split shuffles each trace's request indexes with splitmix64 seeded by
 * (seed, trace index) and keeps a prefix of round(split · R) requests (at least one), so
 * the same seed gives the same split on any machine, and the paper's 7:3 split is exact.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "fmoe/expertmap.h"
#include "fmoe/store.h"
#include "fmoe/trace.h"

#define DEFAULT_BATCH 256

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

int64_t fmoe_store_split(int64_t R, double split, uint64_t seed, int32_t source, uint8_t *keep) {
    if (R <= 0) return 0;
    if (!(split < 1)) {
        memset(keep, 1, (size_t)R);
        return R;
    }
    int64_t n = (int64_t)llround(split * (double)R);
    if (n < 1) n = 1;
    if (n > R) n = R;
    /* Fisher-Yates shuffle of the request indexes; the first n of the order are kept. */
    int64_t *perm = malloc((size_t)R * sizeof *perm);
    memset(keep, 0, (size_t)R);
    if (!perm) return -1;
    for (int64_t i = 0; i < R; i++) perm[i] = i;
    uint64_t state = seed ^ (0xa0761d6478bd642full * (uint64_t)(source + 1));
    for (int64_t i = R - 1; i > 0; i--) {
        const int64_t j = (int64_t)(splitmix64(&state) % (uint64_t)(i + 1));
        const int64_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int64_t i = 0; i < n; i++) keep[perm[i]] = 1;
    free(perm);
    return n;
}

typedef struct builder {
    fmoe_store_file *f;
    int32_t L, J, K, h;
    int32_t batch;
    float *maps;    /* [batch][L][J] pending candidates */
    float *sem;     /* [batch][h] */
    int32_t pending;
    int32_t *slots; /* [batch] */
    int32_t *rep;   /* [batch] */
    fmoe_store_build_report *report;
} builder;

static int flush(builder *b) {
    if (b->pending == 0) return 0;
    FMOE_FORWARD_IF_ERROR(fmoe_expertmap_add(b->f->store, b->pending, b->h ? b->sem : NULL, b->h,
                                             b->maps, (int64_t)b->L * b->J, b->slots, b->rep));
    for (int32_t i = 0; i < b->pending; i++) {
        if (b->rep[i] < 0)
            b->report->appended++;
        else
            b->report->replaced++;
    }
    b->pending = 0;
    return 0;
}

/* An ids-only trace's tokens as maps: 1/K on each chosen expert of each layer, the rows
 * the fmoe policies build from such a trace when they replay it (fmoe.c row_from_chosen),
 * so a store and the gates it is matched against speak the same language. */
static void maps_from_ids(const uint16_t *chosen, int64_t n, int32_t L, int32_t J, int32_t K,
                          float *maps) {
    memset(maps, 0, (size_t)n * L * J * sizeof *maps);
    for (int64_t t = 0; t < n; t++)
        for (int32_t l = 0; l < L; l++)
            for (int32_t k = 0; k < K; k++)
                maps[((size_t)t * L + l) * J + chosen[((size_t)t * L + l) * K + k]] =
                    1.0f / (float)K;
}

/* Checks that all traces describe the same model and fills the store's geometry. */
static int check_sources(fmoe_trace_reader **r, const char *const *paths, int32_t n,
                         int32_t *h_out, fmoe_store_build_report *rep) {
    const fmoe_trace_header *h0 = fmoe_trace_reader_header(r[0]);
    int32_t h = h0->semantic_dim;
    for (int32_t i = 0; i < n; i++) {
        const fmoe_trace_header *h1 = fmoe_trace_reader_header(r[i]);
        if (i == 0) continue;
        FMOE_RETURN_ERROR_IF(h0->model_fingerprint[0] && h1->model_fingerprint[0] &&
                                 strcmp(h0->model_fingerprint, h1->model_fingerprint) != 0,
                             FMOE_EMISMATCH,
                             "%s is for model %s (fingerprint %s) but %s is for %s (fingerprint "
                             "%s): a store holds one model's maps",
                             paths[i], h1->model_name, h1->model_fingerprint, paths[0],
                             h0->model_name, h0->model_fingerprint);
        FMOE_RETURN_ERROR_IF(h1->num_layers != h0->num_layers ||
                                 h1->num_experts != h0->num_experts || h1->top_k != h0->top_k,
                             FMOE_EMISMATCH,
                             "%s has %d MoE layers, %d experts, top-%d; %s has %d, %d, top-%d",
                             paths[i], h1->num_layers, h1->num_experts, h1->top_k, paths[0],
                             h0->num_layers, h0->num_experts, h0->top_k);
        if (h1->semantic_dim != h) h = 0;
        if (h1->semantic_dim > 0 && h0->semantic_dim > 0 &&
            strcmp(h1->semantic_kind, h0->semantic_kind) != 0)
            h = 0;
    }
    for (int32_t i = 0; i < n; i++) {
        const fmoe_trace_header *hi = fmoe_trace_reader_header(r[i]);
        if (hi->semantic_dim == 0 || hi->semantic_dim != h) rep->semantic_skipped = 1;
        if (hi->probs_kind == FMOE_PROBS_TOPK) rep->probs_topk = 1;
        if (hi->probs_kind == FMOE_PROBS_NONE) rep->ids_only = 1;
    }
    if (rep->semantic_skipped) h = 0;
    *h_out = h;
    return 0;
}

/* One request of the stream: trace i, request k. */
typedef struct stream_item {
    int64_t id;
    int32_t trace;
    int64_t request;
} stream_item;

static int cmp_item(const void *pa, const void *pb) {
    const stream_item *a = pa, *b = pb;
    if (a->id != b->id) return a->id < b->id ? -1 : 1;
    if (a->trace != b->trace) return a->trace < b->trace ? -1 : 1;
    return (a->request > b->request) - (a->request < b->request);
}

/* The order requests stream in (into items[total]): trace order, or, for shards of one
 * dataset (several traces, one dataset name, distinct ids), by id. */
static void stream_order(fmoe_trace_reader **r, int32_t n, stream_item *items, int64_t total) {
    int64_t at = 0;
    int shards = n > 1;
    for (int32_t i = 0; i < n; i++) {
        const fmoe_trace_request_info *q = fmoe_trace_reader_requests(r[i]);
        shards &= strcmp(fmoe_trace_reader_header(r[i])->dataset,
                         fmoe_trace_reader_header(r[0])->dataset) == 0;
        for (int64_t k = 0; k < fmoe_trace_reader_num_requests(r[i]); k++)
            items[at++] = (stream_item){.id = q[k].id, .trace = i, .request = k};
    }
    if (!shards) return;
    stream_item *sorted = malloc((size_t)(total ? total : 1) * sizeof *sorted);
    if (!sorted) return; /* trace order then: still a store, only not the merged one's */
    memcpy(sorted, items, (size_t)total * sizeof *sorted);
    qsort(sorted, (size_t)total, sizeof *sorted, cmp_item);
    for (int64_t k = 1; k < total; k++)
        if (sorted[k].id == sorted[k - 1].id) { /* not shards: keep trace order */
            free(sorted);
            return;
        }
    memcpy(items, sorted, (size_t)total * sizeof *sorted);
    free(sorted);
}

static int build(fmoe_trace_reader **r, const char *const *paths, int32_t n,
                 const fmoe_store_build_options *o, fmoe_store_file *f,
                 fmoe_store_build_report *rep) {
    int32_t h = 0;
    FMOE_FORWARD_IF_ERROR(check_sources(r, paths, n, &h, rep));
    const fmoe_trace_header *h0 = fmoe_trace_reader_header(r[0]);
    const int32_t L = h0->num_layers, J = h0->num_experts, K = h0->top_k;
    FMOE_RETURN_ERROR_IF(o->prefetch_distance < 0 || o->prefetch_distance >= L, FMOE_EINVAL,
                         "prefetch distance %d: the model has %d MoE layers, so it must be "
                         "0..%d",
                         o->prefetch_distance, L, L - 1);
    int64_t total_requests = 0, total_tokens = 0, max_tokens = 1;
    for (int32_t i = 0; i < n; i++) {
        total_requests += fmoe_trace_reader_num_requests(r[i]);
        const fmoe_trace_request_info *q = fmoe_trace_reader_requests(r[i]);
        for (int64_t k = 0; k < fmoe_trace_reader_num_requests(r[i]); k++)
            if (q[k].token_count > max_tokens) max_tokens = q[k].token_count;
    }

    snprintf(f->model_name, sizeof f->model_name, "%s", h0->model_name);
    snprintf(f->model_fingerprint, sizeof f->model_fingerprint, "%s", h0->model_fingerprint);
    f->probs_kind = rep->probs_topk || rep->ids_only ? FMOE_PROBS_TOPK : FMOE_PROBS_FULL;
    if (h) snprintf(f->semantic_kind, sizeof f->semantic_kind, "%s", h0->semantic_kind);
    f->split = o->split;
    f->capacity_asked = o->capacity;
    f->split_seed = o->seed;
    f->num_sources = n;
    f->sources = calloc((size_t)n, sizeof *f->sources);
    const size_t nr = (size_t)(total_requests ? total_requests : 1);
    f->used_source = malloc(nr * sizeof *f->used_source);
    f->used_id = malloc(nr * sizeof *f->used_id);
    f->held_out_source = malloc(nr * sizeof *f->held_out_source);
    f->held_out_id = malloc(nr * sizeof *f->held_out_id);
    if (!f->sources || !f->used_source || !f->used_id || !f->held_out_source || !f->held_out_id)
        return fmoe_error_set(FMOE_ENOMEM, "build-store: request lists");
    /* Which requests go in; count their tokens for the progress bar. */
    uint8_t **keep = calloc((size_t)n, sizeof *keep);
    if (!keep) return fmoe_error_set(FMOE_ENOMEM, "build-store");
    int rc = 0;
    int64_t tokens_in = 0;
    for (int32_t i = 0; i < n && rc == 0; i++) {
        const int64_t R = fmoe_trace_reader_num_requests(r[i]);
        const fmoe_trace_header *hi = fmoe_trace_reader_header(r[i]);
        fmoe_store_source *s = &f->sources[i];
        snprintf(s->path, sizeof s->path, "%s", paths[i]);
        snprintf(s->created, sizeof s->created, "%s", hi->created);
        snprintf(s->dataset, sizeof s->dataset, "%s", hi->dataset);
        s->num_requests = R;
        keep[i] = malloc((size_t)(R ? R : 1));
        if (!keep[i] || fmoe_store_split(R, o->split, o->seed, i, keep[i]) < 0) {
            rc = fmoe_error_set(FMOE_ENOMEM, "build-store: split of %s", paths[i]);
            break;
        }
        const fmoe_trace_request_info *q = fmoe_trace_reader_requests(r[i]);
        for (int64_t k = 0; k < R; k++) {
            total_tokens += q[k].token_count;
            if (keep[i][k]) {
                f->used_source[f->num_used] = i;
                f->used_id[f->num_used++] = q[k].id;
                tokens_in += q[k].token_count;
            } else {
                f->held_out_source[f->num_held_out] = i;
                f->held_out_id[f->num_held_out++] = q[k].id;
            }
        }
    }
    if (rc == 0 && total_tokens == 0)
        rc = fmoe_error_set(FMOE_EINCOMPLETE, "%s%s: no tokens to build a store from (empty trace)",
                            paths[0], n > 1 ? " and the other traces" : "");
    if (rc == 0 && tokens_in == 0)
        rc = fmoe_error_set(FMOE_EINCOMPLETE,
                            "the requests the split keeps hold no tokens (split %g, seed %llu)",
                            o->split, (unsigned long long)o->seed);

    /* The store never holds more entries than tokens streamed in, so a capacity beyond
     * them would only allocate rows that stay empty (--capacity 100000000 asked for 116 GB):
     * size it to the tokens. The file keeps the capacity asked
     * (capacity_asked), up to which offline updates grow it. */
    const int32_t capacity =
        tokens_in < o->capacity ? (int32_t)(tokens_in > 0 ? tokens_in : 1) : o->capacity;
    const fmoe_expertmap_config cfg = {.capacity = capacity, .num_layers = L,
                                       .num_experts = J, .top_k = K, .semantic_dim = h,
                                       .prefetch_distance = o->prefetch_distance,
                                       .max_batch = o->batch > 0 ? o->batch : DEFAULT_BATCH};
    if (rc == 0) rc = fmoe_expertmap_init(&f->store, &cfg);

    builder b = {.f = f, .L = L, .J = J, .K = K, .h = h, .batch = cfg.max_batch, .report = rep};
    float *probs = NULL, *sem = NULL;
    uint16_t *chosen = NULL;
    if (rc == 0) {
        b.maps = malloc((size_t)b.batch * L * J * sizeof *b.maps);
        b.sem = h ? malloc((size_t)b.batch * h * sizeof *b.sem) : NULL;
        b.slots = malloc((size_t)b.batch * sizeof *b.slots);
        b.rep = malloc((size_t)b.batch * sizeof *b.rep);
        probs = malloc((size_t)max_tokens * L * J * sizeof *probs);
        sem = h ? malloc((size_t)max_tokens * h * sizeof *sem) : NULL;
        /* the chosen experts are read even when the maps come from the probabilities: the
         * reader checks them (ids below J, no repeats), so a damaged trace is refused
         * rather than turned into a store */
        chosen = malloc((size_t)max_tokens * L * K * sizeof *chosen);
        if (!b.maps || (h && !b.sem) || !b.slots || !b.rep || !probs || (h && !sem) || !chosen)
            rc = fmoe_error_set(FMOE_ENOMEM, "build-store: buffers for %lld tokens",
                                (long long)max_tokens);
    }
    int64_t done = 0;
    stream_item *items = rc == 0 ? malloc(nr * sizeof *items) : NULL;
    if (rc == 0 && !items) rc = fmoe_error_set(FMOE_ENOMEM, "build-store: request order");
    if (rc == 0) stream_order(r, n, items, total_requests);
    for (int64_t at = 0; at < total_requests && rc == 0; at++) {
        const int32_t i = items[at].trace;
        const fmoe_trace_request_info *q = fmoe_trace_reader_requests(r[i]);
        {
            const int64_t k = items[at].request;
            if (!keep[i][k] || q[k].token_count == 0) continue;
            const int ids = fmoe_trace_reader_header(r[i])->probs_kind == FMOE_PROBS_NONE;
            const fmoe_trace_token_buffers buf = {.probs = ids ? NULL : probs,
                                                  .experts = chosen, .semantic = sem};
            rc = fmoe_trace_reader_read_tokens(r[i], q[k].token_begin, q[k].token_count, &buf);
            if (rc == 0 && ids) maps_from_ids(chosen, q[k].token_count, L, J, K, probs);
            for (int64_t t = 0; t < q[k].token_count && rc == 0; t++) {
                memcpy(b.maps + (size_t)b.pending * L * J, probs + (size_t)t * L * J,
                       (size_t)L * J * sizeof *probs);
                if (h) memcpy(b.sem + (size_t)b.pending * h, sem + (size_t)t * h, (size_t)h * sizeof *sem);
                if (++b.pending == b.batch) rc = flush(&b);
            }
            done += q[k].token_count;
            rep->tokens += q[k].token_count;
            fmoe_progress_report(o->progress, done, tokens_in, "tokens");
        }
    }
    if (rc == 0) rc = flush(&b);
    f->tokens_used = rep->tokens;
    free(items);
    free(probs);
    free(chosen);
    free(sem);
    free(b.maps);
    free(b.sem);
    free(b.slots);
    free(b.rep);
    for (int32_t i = 0; i < n; i++) free(keep[i]);
    free(keep);
    return rc;
}

int fmoe_store_build(const char *const *traces, int32_t n, const fmoe_store_build_options *o,
                     fmoe_store_file **out, fmoe_store_build_report *report) {
    FMOE_RETURN_ERROR_IF(!traces || n < 1 || !o || !out, FMOE_EINVAL,
                         "build-store: no trace given");
    FMOE_RETURN_ERROR_IF(o->capacity < 1, FMOE_EINVAL,
                         "store capacity must be at least 1 entry, got %d", o->capacity);
    FMOE_RETURN_ERROR_IF(!(o->split > 0 && o->split <= 1), FMOE_EINVAL,
                         "split %g: expected the share of requests for the store, in (0, 1]",
                         o->split);
    *out = NULL;
    fmoe_store_build_report local;
    if (!report) report = &local;
    memset(report, 0, sizeof *report);
    fmoe_trace_reader **r = calloc((size_t)n, sizeof *r);
    fmoe_store_file *f = calloc(1, sizeof *f);
    if (!r || !f) {
        free(r);
        free(f);
        return fmoe_error_set(FMOE_ENOMEM, "build-store");
    }
    int rc = 0;
    for (int32_t i = 0; i < n && rc == 0; i++) rc = fmoe_trace_reader_open(&r[i], traces[i]);
    if (rc == 0) rc = build(r, traces, n, o, f, report);
    for (int32_t i = 0; i < n; i++) fmoe_trace_reader_close(r[i]);
    free(r);
    if (rc < 0) {
        fmoe_store_file_free(f);
        return rc;
    }
    *out = f;
    return 0;
}
