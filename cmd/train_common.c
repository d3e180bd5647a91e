/*
 * train_common.c - the steps and report lines both kinds of `fmoe train-predictor` share
 * (train_common.h).
 */
#include "train_common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"

/* Checks trace s against the first; prints why they differ. @return 0 or the exit status. */
static int check_same_model(const char *cmd, const cmd_train_traces *t, int32_t s,
                            int with_hidden) {
    const fmoe_trace_header *h = fmoe_trace_reader_header(t->readers[s]), *h0 = t->h0;
    if (h->num_layers == h0->num_layers && h->num_experts == h0->num_experts &&
        h->top_k == h0->top_k && (!with_hidden || h->hidden_dim == h0->hidden_dim) &&
        strcmp(h->model_fingerprint, h0->model_fingerprint) == 0)
        return 0;
    if (with_hidden)
        return cmd_failf(cmd,
                         "%s and %s are traces of different models (fingerprints %.12s and "
                         "%.12s; L x J x K x h %d x %d x %d x %d and %d x %d x %d x %d)",
                         t->paths[0], t->paths[s], h0->model_fingerprint, h->model_fingerprint,
                         h0->num_layers, h0->num_experts, h0->top_k, h0->hidden_dim,
                         h->num_layers, h->num_experts, h->top_k, h->hidden_dim);
    return cmd_failf(cmd,
                     "%s and %s are traces of different models (fingerprints %.12s and %.12s; "
                     "L x J x K %d x %d x %d and %d x %d x %d)",
                     t->paths[0], t->paths[s], h0->model_fingerprint, h->model_fingerprint,
                     h0->num_layers, h0->num_experts, h0->top_k, h->num_layers, h->num_experts,
                     h->top_k);
}

int cmd_train_traces_open(const char *cmd, const char *const *paths, int32_t n, int with_hidden,
                          cmd_train_traces *t) {
    memset(t, 0, sizeof *t);
    t->paths = paths;
    t->n = n;
    t->readers = calloc((size_t)(n > 0 ? n : 1), sizeof *t->readers);
    if (!t->readers) return cmd_failf(cmd, "out of memory");
    int rc;
    for (int32_t s = 0; s < n; s++) {
        if ((rc = fmoe_trace_reader_open(&t->readers[s], paths[s])) < 0) return cmd_fail(cmd, rc);
        const fmoe_trace_header *h = fmoe_trace_reader_header(t->readers[s]);
        if (with_hidden && h->hidden_dim <= 0)
            return cmd_failf(cmd,
                             "%s has no hidden states (/tokens/hidden), which --kind promoe "
                             "trains on: record the trace with 'fmoe record --hidden'",
                             paths[s]);
        if (!t->h0)
            t->h0 = h;
        else if ((rc = check_same_model(cmd, t, s, with_hidden)) != 0)
            return rc;
        if (with_hidden && (rc = fmoe_trace_reader_check_hidden(t->readers[s])) < 0)
            return cmd_fail(cmd, rc);
        t->num_requests += fmoe_trace_reader_num_requests(t->readers[s]);
    }
    return 0;
}

int cmd_train_traces_split(const char *cmd, cmd_train_traces *t, double split, int64_t seed) {
    const int64_t nreq = t->num_requests;
    if (nreq < 2)
        return cmd_failf(cmd, "%lld request%s in the traces: a train/validation split needs at "
                              "least 2",
                         (long long)nreq, nreq == 1 ? "" : "s");
    /* one seeded shuffle of every request, whatever the kind (train_split.h) */
    int64_t *counts = calloc((size_t)(t->n > 0 ? t->n : 1), sizeof *counts);
    for (int32_t s = 0; counts && s < t->n; s++)
        counts[s] = fmoe_trace_reader_num_requests(t->readers[s]);
    t->num_train = counts ? cmd_split_requests(counts, t->n, split, (uint64_t)seed, &t->reqs) : -1;
    free(counts);
    return t->num_train < 0 ? cmd_failf(cmd, "out of memory") : 0;
}

void cmd_train_traces_close(cmd_train_traces *t) {
    free(t->reqs);
    if (t->readers)
        for (int32_t s = 0; s < t->n; s++) fmoe_trace_reader_close(t->readers[s]);
    free(t->readers);
    memset(t, 0, sizeof *t);
}

void cmd_train_label_predictor(const cmd_train_traces *t, fmoe_predictor *p, const char *target,
                               int64_t seed, double split) {
    snprintf(p->model_fingerprint, sizeof p->model_fingerprint, "%s", t->h0->model_fingerprint);
    snprintf(p->model_name, sizeof p->model_name, "%s", t->h0->model_name);
    snprintf(p->target, sizeof p->target, "%s", target);
    p->seed = seed;
    p->split = split;
}

void cmd_train_progress_start(cmd_train_progress *p, const char *first, int quiet) {
    cmd_progress_bar_init(&p->bar, "training", quiet);
    p->bar.label = p->label;
    snprintf(p->label, sizeof p->label, "%s", first);
    p->cb = cmd_progress_bar_callback(&p->bar);
}

cJSON *cmd_json_finite_or_null(double v) {
    return isfinite(v) ? cJSON_CreateNumber(v) : cJSON_CreateNull();
}

void cmd_train_json_run(cJSON *d, int64_t seed, double split, int32_t threads,
                        const cmd_train_traces *t) {
    cJSON_AddNumberToObject(d, "seed", (double)seed);
    cJSON_AddNumberToObject(d, "split", split);
    cJSON_AddNumberToObject(d, "threads", threads);
    cJSON_AddNumberToObject(d, "train_requests", (double)t->num_train);
}

void cmd_train_json_validation(cJSON *d, const cmd_train_traces *t) {
    cJSON *vr = cJSON_AddArrayToObject(d, "validation_requests");
    for (int64_t q = t->num_train; q < t->num_requests; q++) {
        const cmd_request_ref *ref = &t->reqs[q];
        const fmoe_trace_request_info *ri = fmoe_trace_reader_requests(t->readers[ref->trace]);
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "trace", ref->trace);
        cJSON_AddNumberToObject(e, "index", (double)ref->index);
        cJSON_AddNumberToObject(e, "id", (double)ri[ref->index].id);
        cJSON_AddItemToArray(vr, e);
    }
}

void cmd_train_print_data(const cmd_train_traces *t, int64_t train_tokens, int64_t val_tokens,
                          int64_t seed) {
    printf("  data         %lld requests: %lld train (%lld tokens), %lld validation (%lld "
           "tokens); seed %lld\n",
           (long long)t->num_requests, (long long)t->num_train, (long long)train_tokens,
           (long long)(t->num_requests - t->num_train), (long long)val_tokens, (long long)seed);
}
