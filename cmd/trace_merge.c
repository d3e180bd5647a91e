/*
 * trace_merge.c - `fmoe trace merge IN... -o OUT`: joins traces of one model recorded with
 * the same options into one trace, requests in dataset order.
 *
 * Its first use is the shards of `mpirun -n R fmoe record` (OUT.rank-r.h5, rank r holding
 * every R-th request): the merged trace holds the requests of all shards sorted by their
 * dataset index (/requests/id), so it equals a single-process recording of the same requests, dataset for dataset, the measured ones
 * (/timing) aside. Any traces of one model and options merge the same way.
 *
 * The inputs must agree on what makes rows comparable: the model (fingerprint and geometry)
 * and every recording option that shapes a dataset or its meaning (probabilities and their
 * storage, semantic rows, speculative depth, gate inputs, timing, prefill chunking, the
 * offloaded recording's cache and policy, served passes). The first disagreement is one
 * line naming both files. A request id held twice is refused, naming both inputs and the
 * id: a shard given twice, two recordings of one dataset, or traces of different datasets
 * whose ids overlap (each numbers its requests from 0; the merged trace could not tell
 * them apart, and renumbering would lose the dataset index the id is).
 *
 * Every dataset is copied request by request: the token rows, the /timing rows of the
 * request's iterations, the access outcomes of its accesses (docs/design.md §7.1: the
 * distinct experts of each iteration's layer), the served passes. The writer works on
 * OUT.partial and renames it when complete, so a failure leaves nothing (the merge can be
 * run again; no journal).
 */
#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd_common.h"
#include "fmoe/error.h"
#include "fmoe/trace.h"
#include "paths.h"

int cmd_trace_merge(int argc, char **argv);

static const char *const CMD = "trace merge";

typedef struct merge_opts {
    const char *out_path;
    fmoe_compression compression;
    int json, quiet;
} merge_opts;

#define OPT(field) offsetof(merge_opts, field)
static const cmd_option merge_options[] = {
    {.name = "output", .short_name = 'o', .kind = CMD_OPT_STRING, .io = CMD_IO_OUTPUT,
     .value_name = "FILE",
     .help = "the merged trace (required); written as FILE.partial and renamed when complete",
     .offset = OPT(out_path)},
    {.name = "compression", .kind = CMD_OPT_CALLBACK, .value_name = "C",
     .help = "zstd, deflate or none", .default_text = "zstd", .offset = OPT(compression),
     .handler = cmd_on_compression, .example = "none"},
    {.name = "json", .kind = CMD_OPT_FLAG, .help = "print the summary as JSON",
     .offset = OPT(json)},
    {.name = "quiet", .kind = CMD_OPT_FLAG, .help = "no progress bar", .offset = OPT(quiet)},
    {0},
};
#undef OPT

static void merge_init(void *base) {
    *(merge_opts *)base = (merge_opts){.compression = FMOE_COMPRESSION_ZSTD};
}

const cmd_spec cmd_trace_merge_spec = {
    .name = "trace merge",
    .usage = "trace merge IN.h5... -o OUT.h5 [options]",
    .description =
        "Joins traces of one model, recorded with the same options, into one trace with\n"
        "the requests in dataset order (by request id): the shards of 'mpirun -n R fmoe\n"
        "record' (OUT.rank-r.h5) become the trace one process would have recorded.\n"
        "Inputs that differ in model fingerprint, geometry or recording options are\n"
        "refused with one line naming both, and so is a request id that two inputs hold\n"
        "(a shard given twice, or traces of different datasets whose ids overlap: a\n"
        "merged trace holds each id once).\n",
    .options = merge_options,
    .epilog = "example:\n"
              "  fmoe trace merge sharegpt.rank-*.h5 -o sharegpt.h5\n",
    .max_positional = -1,
    .size = sizeof(merge_opts),
    .init = merge_init,
};

/* ------------------------------------------------------------------ checks */

/* The first header field on which b differs from a, as "what a-value / b-value", into
 * buf; "" when they agree. */
static const char *header_difference(const fmoe_trace_header *a, const fmoe_trace_header *b,
                                     char *buf, size_t cap) {
    buf[0] = '\0';
#define INT_FIELD(f, what)                                                                     \
    if (a->f != b->f) {                                                                        \
        snprintf(buf, cap, "%s %lld, the other %lld", what, (long long)b->f, (long long)a->f); \
        return buf;                                                                            \
    }
#define STR_FIELD(f, what)                                                                     \
    if (strcmp(a->f, b->f) != 0) {                                                             \
        snprintf(buf, cap, "%s '%s', the other '%s'", what, b->f, a->f);                       \
        return buf;                                                                            \
    }
    STR_FIELD(model_fingerprint, "model fingerprint")
    INT_FIELD(num_layers, "MoE layers")
    INT_FIELD(num_experts, "experts")
    INT_FIELD(top_k, "top_k")
    INT_FIELD(hidden_size, "hidden size")
    INT_FIELD(shared_experts, "shared experts")
    INT_FIELD(expert_bytes, "expert bytes")
    STR_FIELD(dtype, "dtype")
    INT_FIELD(probs_kind, "probs_kind")
    INT_FIELD(probs_half, "float16 probabilities")
    INT_FIELD(semantic_dim, "semantic_dim")
    STR_FIELD(semantic_kind, "semantic_kind")
    INT_FIELD(speculative_depth, "speculative depth")
    INT_FIELD(hidden_dim, "hidden_dim (gate inputs)")
    INT_FIELD(timing_layers, "timing layers")
    INT_FIELD(prefill_chunk, "prefill_chunk")
    INT_FIELD(offload_cache_experts, "offload cache experts")
    STR_FIELD(offload_policy, "offload policy")
    INT_FIELD(served, "served")
#undef INT_FIELD
#undef STR_FIELD
    const char *ca = a->config_json ? a->config_json : "", *cb = b->config_json ? b->config_json : "";
    if (strcmp(ca, cb) != 0) snprintf(buf, cap, "a different config.json");
    for (int32_t l = 0; !buf[0] && l < a->num_layers; l++) {
        const int64_t ba = a->layer_expert_bytes ? a->layer_expert_bytes[l] : a->expert_bytes;
        const int64_t bb = b->layer_expert_bytes ? b->layer_expert_bytes[l] : b->expert_bytes;
        if (ba != bb) snprintf(buf, cap, "other expert bytes in layer %d", l);
    }
    return buf;
}

/* ------------------------------------------------------------------ copying */

/* One request of the output: which input and which of its requests. */
typedef struct source {
    int64_t id;
    int32_t input;
    int64_t request;
    int64_t iteration_begin; /* its first iteration in the input's replay order */
    int64_t access_begin;    /* its first access outcome in the input */
} source;

static int cmp_source(const void *pa, const void *pb) {
    const source *a = pa, *b = pb;
    if (a->id != b->id) return a->id < b->id ? -1 : 1;
    if (a->input != b->input) return a->input < b->input ? -1 : 1;
    return (a->request > b->request) - (a->request < b->request);
}

/* Per-request buffers, grown to the largest request. */
typedef struct buffers {
    int64_t tokens, iterations, accesses;
    int32_t *token_id;
    uint8_t *phase, *outcomes;
    uint16_t *experts;
    float *probs, *semantic, *speculative, *hidden, *layer_s, *iteration_s, *served_s;
    int64_t *served_iteration;
    uint64_t *seen; /* [J] stamps for counting distinct experts */
    uint64_t stamp;
} buffers;

static void buffers_free(buffers *b) {
    free(b->token_id);
    free(b->phase);
    free(b->outcomes);
    free(b->experts);
    free(b->probs);
    free(b->semantic);
    free(b->speculative);
    free(b->hidden);
    free(b->layer_s);
    free(b->iteration_s);
    free(b->served_s);
    free(b->served_iteration);
    free(b->seen);
}

/* Grows *p to n elements of `size` when `want`. @return 0 or FMOE_ENOMEM. */
static int grow(void *p, int want, size_t n, size_t size) {
    if (!want) return 0;
    void *q = realloc(*(void **)p, (n ? n : 1) * size);
    if (!q) return fmoe_error_set(FMOE_ENOMEM, "out of memory (%zu bytes)", n * size);
    *(void **)p = q;
    return 0;
}

static int reserve(buffers *b, const fmoe_trace_header *h, int64_t tokens, int64_t iterations,
                   int64_t accesses) {
    const size_t L = (size_t)h->num_layers, J = (size_t)h->num_experts;
    if (tokens > b->tokens) {
        const size_t T = (size_t)tokens;
        FMOE_FORWARD_IF_ERROR(grow(&b->token_id, 1, T, sizeof *b->token_id));
        FMOE_FORWARD_IF_ERROR(grow(&b->phase, 1, T, 1));
        FMOE_FORWARD_IF_ERROR(grow(&b->experts, 1, T * L * (size_t)h->top_k, 2));
        FMOE_FORWARD_IF_ERROR(grow(&b->probs, h->probs_kind != FMOE_PROBS_NONE, T * L * J, 4));
        FMOE_FORWARD_IF_ERROR(grow(&b->semantic, h->semantic_dim > 0,
                                   T * (size_t)h->semantic_dim, 4));
        FMOE_FORWARD_IF_ERROR(grow(&b->speculative, h->speculative_depth > 0,
                                   T * L * (size_t)h->speculative_depth * J, 4));
        FMOE_FORWARD_IF_ERROR(grow(&b->hidden, h->hidden_dim > 0, T * L * (size_t)h->hidden_dim, 4));
        FMOE_FORWARD_IF_ERROR(grow(&b->served_iteration, h->served > 0, T, 8));
        FMOE_FORWARD_IF_ERROR(grow(&b->served_s, h->served > 0, T, 4));
        b->tokens = tokens;
    }
    if (iterations > b->iterations) {
        const size_t I = (size_t)iterations;
        FMOE_FORWARD_IF_ERROR(grow(&b->layer_s, h->timing_layers > 0, I * (size_t)h->timing_layers, 4));
        FMOE_FORWARD_IF_ERROR(grow(&b->iteration_s, h->timing_layers > 0, I, 4));
        b->iterations = iterations;
    }
    if (accesses > b->accesses) {
        FMOE_FORWARD_IF_ERROR(grow(&b->outcomes, 1, (size_t)accesses, 1));
        b->accesses = accesses;
    }
    return 0;
}

/* The §7.1 accesses of a request's rows (experts [T][L][K], its iterations `it`): per
 * iteration and layer, the distinct experts its tokens chose. */
static int64_t count_accesses(buffers *b, const fmoe_trace_header *h,
                              const fmoe_trace_iteration *it, int64_t n_it, int64_t token0) {
    const int64_t L = h->num_layers, K = h->top_k;
    int64_t a = 0;
    for (int64_t i = 0; i < n_it; i++)
        for (int64_t l = 0; l < L; l++) {
            b->stamp++;
            for (int64_t t = 0; t < it[i].num_tokens; t++) {
                const uint16_t *row = b->experts + ((it[i].token_begin - token0 + t) * L + l) * K;
                for (int64_t k = 0; k < K; k++)
                    if (b->seen[row[k]] != b->stamp) {
                        b->seen[row[k]] = b->stamp;
                        a++;
                    }
            }
        }
    return a;
}

/* Reads request s of its input and appends it to w. */
static int copy_request(fmoe_trace_reader *r, const char *path, const source *s, buffers *b,
                        fmoe_trace_writer *w) {
    const fmoe_trace_header *h = fmoe_trace_reader_header(r);
    const fmoe_trace_request_info *q = &fmoe_trace_reader_requests(r)[s->request];
    int64_t n_all = 0;
    const fmoe_trace_iteration *its = fmoe_trace_reader_iterations(r, &n_all);
    const int64_t n_it =
        fmoe_trace_request_iterations(q->prompt_tokens, q->output_tokens, h->prefill_chunk);
    FMOE_FORWARD_IF_ERROR(reserve(b, h, q->token_count, n_it, 0));
    const fmoe_trace_token_buffers tb = {
        .token_id = b->token_id, .phase = b->phase, .experts = b->experts, .probs = b->probs,
        .semantic = b->semantic, .speculative = b->speculative, .hidden = b->hidden,
        .served_iteration = b->served_iteration, .served_s = b->served_s};
    FMOE_FORWARD_IF_ERROR(fmoe_trace_reader_read_tokens(r, q->token_begin, q->token_count, &tb));
    if (h->timing_layers > 0)
        FMOE_FORWARD_IF_ERROR(
            fmoe_trace_reader_read_timing(r, s->iteration_begin, n_it, b->layer_s, b->iteration_s));
    int64_t accesses = 0;
    if (h->offload_cache_experts > 0) {
        accesses = count_accesses(b, h, its + s->iteration_begin, n_it, q->token_begin);
        FMOE_FORWARD_IF_ERROR(reserve(b, h, 0, 0, accesses));
        int rc = fmoe_trace_reader_read_access_outcomes(r, s->access_begin, accesses, b->outcomes,
                                                        NULL);
        if (rc < 0) {
            if (!strstr(fmoe_error_detail(), path)) fmoe_error_prefix("%s", path);
            return rc;
        }
    }
    const fmoe_trace_request req = {
        .id = q->id,
        .arrival_s = q->arrival_s,
        .prompt_tokens = q->prompt_tokens,
        .output_tokens = q->output_tokens,
        .token_id = b->token_id,
        .phase = b->phase,
        .experts = b->experts,
        .probs = h->probs_kind != FMOE_PROBS_NONE ? b->probs : NULL,
        .semantic = h->semantic_dim > 0 ? b->semantic : NULL,
        .speculative = h->speculative_depth > 0 ? b->speculative : NULL,
        .hidden = h->hidden_dim > 0 ? b->hidden : NULL,
        .layer_s = h->timing_layers > 0 ? b->layer_s : NULL,
        .iteration_s = h->timing_layers > 0 ? b->iteration_s : NULL,
        .access_outcome = h->offload_cache_experts > 0 ? b->outcomes : NULL,
        .num_access_outcomes = accesses,
        .served_iteration = h->served ? b->served_iteration : NULL,
        .served_s = h->served ? b->served_s : NULL,
    };
    return fmoe_trace_writer_append_request(w, &req);
}

/* Fills the sources of input k (its iteration and access offsets, counting accesses when it
 * is an offloaded recording) and checks its access outcomes add up. */
static int index_input(fmoe_trace_reader *r, const char *path, int32_t k, buffers *b,
                       source *out) {
    const fmoe_trace_header *h = fmoe_trace_reader_header(r);
    const int64_t R = fmoe_trace_reader_num_requests(r);
    const fmoe_trace_request_info *req = fmoe_trace_reader_requests(r);
    int64_t n_all = 0;
    const fmoe_trace_iteration *its = fmoe_trace_reader_iterations(r, &n_all);
    int64_t iteration = 0, access = 0;
    for (int64_t q = 0; q < R; q++) {
        out[q] = (source){.id = req[q].id, .input = k, .request = q,
                          .iteration_begin = iteration, .access_begin = access};
        const int64_t n_it = fmoe_trace_request_iterations(req[q].prompt_tokens,
                                                           req[q].output_tokens, h->prefill_chunk);
        if (h->offload_cache_experts > 0) {
            FMOE_FORWARD_IF_ERROR(reserve(b, h, req[q].token_count, 0, 0));
            const fmoe_trace_token_buffers tb = {.experts = b->experts};
            FMOE_FORWARD_IF_ERROR(
                fmoe_trace_reader_read_tokens(r, req[q].token_begin, req[q].token_count, &tb));
            access += count_accesses(b, h, its + iteration, n_it, req[q].token_begin);
        }
        iteration += n_it;
    }
    if (h->offload_cache_experts > 0) {
        int64_t total = 0;
        FMOE_FORWARD_IF_ERROR(fmoe_trace_reader_read_access_outcomes(r, 0, 0, NULL, &total));
        FMOE_RETURN_ERROR_IF(total != access, FMOE_EFORMAT,
                             "%s: /timing/access_outcome has %lld entries, the replay resolves "
                             "%lld accesses",
                             path, (long long)total, (long long)access);
    }
    return 0;
}

/* ------------------------------------------------------------------ command */

int cmd_trace_merge(int argc, char **argv) {
    merge_opts o;
    merge_init(&o);
    int npos = 0;
    int rc = cmd_options_parse(&cmd_trace_merge_spec, &o, argc, argv, &npos);
    if (rc) return rc == CMD_OPTIONS_HELP ? CMD_EXIT_OK : rc;
    if (npos < 1) return cmd_usage_error(CMD, "give the traces to merge (IN.h5...)");
    if (!o.out_path) return cmd_usage_error(CMD, "-o OUT.h5 is required");
    char **inputs = argv + 1; /* -o against them: checked by the parse (cmd/outputs.h) */

    int exit_code = CMD_EXIT_OK, err = 0;
    fmoe_trace_reader **readers = calloc((size_t)npos, sizeof *readers);
    source *sources = NULL;
    buffers b = {0};
    fmoe_trace_writer *w = NULL;
    int64_t total = 0, tokens = 0;
    if (!readers) return cmd_failf(CMD, "out of memory");

    for (int k = 0; k < npos; k++) {
        if ((err = fmoe_trace_reader_open(&readers[k], inputs[k])) < 0) goto fail;
        const fmoe_trace_header *h = fmoe_trace_reader_header(readers[k]);
        char why[512];
        if (k > 0 && header_difference(fmoe_trace_reader_header(readers[0]), h, why,
                                       sizeof why)[0]) {
            exit_code = cmd_failf(CMD, "%s: %s (%s): merge traces of one model recorded with the "
                                       "same options",
                                  inputs[k], why, inputs[0]);
            goto done;
        }
        total += fmoe_trace_reader_num_requests(readers[k]);
        tokens += fmoe_trace_reader_num_tokens(readers[k]);
    }
    const fmoe_trace_header *h0 = fmoe_trace_reader_header(readers[0]);
    sources = calloc((size_t)(total ? total : 1), sizeof *sources);
    b.seen = calloc((size_t)h0->num_experts, sizeof *b.seen);
    if (!sources || !b.seen) {
        exit_code = cmd_failf(CMD, "out of memory");
        goto done;
    }
    for (int k = 0, at = 0; k < npos; k++) {
        if ((err = index_input(readers[k], inputs[k], k, &b, sources + at)) < 0) goto fail;
        at += (int)fmoe_trace_reader_num_requests(readers[k]);
    }
    qsort(sources, (size_t)total, sizeof *sources, cmp_source);
    /* A merged trace holds each request id once: the id is the request's index in its
     * dataset, and nothing else in the file says which input a row came from. Two inputs
     * of different datasets both number their requests from 0, so their ids collide
     * almost always; renumbering would make /requests/id lie about the dataset index, so
     * any collision is refused, before the output is created. */
    for (int64_t i = 1; i < total; i++) {
        const source *a = &sources[i - 1], *c = &sources[i];
        if (a->id != c->id) continue;
        const char *da = fmoe_trace_reader_header(readers[a->input])->dataset,
                   *dc = fmoe_trace_reader_header(readers[c->input])->dataset;
        if (a->input == c->input)
            exit_code = cmd_failf(CMD, "%s: request id %lld is there twice: a merged trace "
                                       "holds each request id once",
                                  inputs[a->input], (long long)c->id);
        else if (strcmp(da, dc) == 0)
            exit_code = cmd_failf(CMD, "request %lld is in %s and in %s, both of dataset '%s': "
                                       "a shard given twice, or two recordings of one dataset",
                                  (long long)c->id, inputs[a->input], inputs[c->input], dc);
        else
            exit_code = cmd_failf(CMD, "request id %lld is in %s (dataset '%s') and in %s "
                                       "(dataset '%s'): a merged trace holds each request id "
                                       "once, so traces of different datasets merge only when "
                                       "their ids do not overlap (simulate and build-store take "
                                       "several --trace as they are)",
                                  (long long)c->id, inputs[a->input], da, inputs[c->input], dc);
        goto done;
    }

    /* The first input's header; what the inputs do not share is said so. */
    fmoe_trace_header h = *h0;
    h.created[0] = '\0';
    h.fmoe_version[0] = '\0';
    for (int k = 1; k < npos; k++) {
        const fmoe_trace_header *hk = fmoe_trace_reader_header(readers[k]);
        if (strcmp(hk->dataset, h.dataset) != 0) snprintf(h.dataset, sizeof h.dataset, "merged");
        if (strcmp(hk->recorded_on, h.recorded_on) != 0)
            snprintf(h.recorded_on, sizeof h.recorded_on, "merged");
        if (strcmp(hk->model_name, h.model_name) != 0) h.model_name[0] = '\0';
        /* f32 and q8 recordings mixed: neither is true of the whole, so not known */
        if (strcmp(hk->activations, h.activations) != 0) h.activations[0] = '\0';
    }
    const fmoe_trace_write_options wo = {.compression = o.compression,
                                         .flush_requests = INT32_MAX};
    if ((err = fmoe_trace_writer_open(&w, o.out_path, &h, &wo)) < 0) goto fail;
    cmd_progress_bar bar;
    cmd_progress_bar_init(&bar, "merge", o.quiet);
    fmoe_progress p = cmd_progress_bar_callback(&bar);
    for (int64_t i = 0; i < total; i++) {
        const source *s = &sources[i];
        if ((err = copy_request(readers[s->input], inputs[s->input], s, &b, w)) < 0) break;
        fmoe_progress_report(&p, i + 1, total, "requests");
    }
    cmd_progress_bar_done(&bar);
    if (err < 0) goto fail;
    err = fmoe_trace_writer_close(w);
    w = NULL;
    if (err < 0) goto fail;
    if (o.json) {
        cJSON *j = cJSON_CreateObject();
        if (!j) {
            exit_code = cmd_failf(CMD, "out of memory");
            goto done;
        }
        cJSON_AddStringToObject(j, "output", o.out_path);
        cJSON *in = cJSON_AddArrayToObject(j, "inputs");
        for (int k = 0; k < npos; k++) cJSON_AddItemToArray(in, cJSON_CreateString(inputs[k]));
        cJSON_AddNumberToObject(j, "requests", (double)total);
        cJSON_AddNumberToObject(j, "tokens", (double)tokens);
        if (cmd_print_json(j) != 0) exit_code = cmd_failf(CMD, "out of memory");
    } else {
        printf("Merged %lld request%s (%lld tokens) from %d trace%s into %s.\n", (long long)total,
               total == 1 ? "" : "s", (long long)tokens, npos, npos == 1 ? "" : "s", o.out_path);
    }
    goto done;
fail:
    exit_code = cmd_fail(CMD, err);
done:
    fmoe_trace_writer_abort(w);
    for (int k = 0; k < npos; k++) fmoe_trace_reader_close(readers[k]);
    free(readers);
    free(sources);
    buffers_free(&b);
    return exit_code;
}
