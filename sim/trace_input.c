/*
 * trace_input.c - a trace file into a simulator workload (fmoe/sim.h), through the trace
 * reader (fmoe/trace.h): request by request, experts and phases, plus the gate data
 * (probabilities, speculative rows) only when a policy of the run asks for it: those are
 * L·J floats per token and can be larger than the routing by two orders of magnitude.
 */
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "fmoe/predictor.h" /* the reader of /tokens/hidden */
#include "fmoe/sim.h"
#include "fmoe/trace.h"

int fmoe_sim_workload_read(fmoe_sim_workload *w, fmoe_trace_reader *r,
                           const fmoe_progress *progress) {
    return fmoe_sim_workload_read_ex(w, r, 0, progress);
}

int fmoe_sim_workload_read_ex(fmoe_sim_workload *w, fmoe_trace_reader *r, uint32_t want,
                              const fmoe_progress *progress) {
    return fmoe_sim_workload_read_filtered(w, r, want, NULL, progress);
}

int fmoe_sim_workload_read_filtered(fmoe_sim_workload *w, fmoe_trace_reader *r, uint32_t want,
                                    const uint8_t *keep, const fmoe_progress *progress) {
    uint16_t *experts = NULL;
    uint8_t *phase = NULL;
    float *probs = NULL, *spec = NULL, *sem = NULL;
    int64_t *served = NULL;
    const fmoe_trace_header *h = fmoe_trace_reader_header(r);
    int rc = fmoe_sim_workload_init(w, h->num_layers, h->num_experts, h->top_k, h->expert_bytes);
    if (rc < 0) return rc;
    if (h->layer_expert_bytes)
        memcpy(w->layer_expert_bytes, h->layer_expert_bytes,
               (size_t)h->num_layers * sizeof *h->layer_expert_bytes);
    w->prefill_chunk = h->prefill_chunk;
    const int keep_probs = (want & FMOE_SIM_WANT_PROBS) && h->probs_kind != FMOE_PROBS_NONE;
    const int32_t S = (want & FMOE_SIM_WANT_SPECULATIVE) ? h->speculative_depth : 0;
    rc = fmoe_sim_workload_keep_gates(w, keep_probs ? (int32_t)h->probs_kind : FMOE_PROBS_NONE, S);
    if (rc < 0) goto fail;
    const int64_t R = fmoe_trace_reader_num_requests(r);
    const fmoe_trace_request_info *req = fmoe_trace_reader_requests(r);
    int64_t max_tokens = 1;
    for (int64_t q = 0; q < R; q++)
        if (req[q].token_count > max_tokens) max_tokens = req[q].token_count;
    const size_t LK = (size_t)h->num_layers * (size_t)h->top_k;
    const size_t LJ = (size_t)h->num_layers * (size_t)h->num_experts;
    experts = malloc((size_t)max_tokens * LK * sizeof *experts);
    phase = malloc((size_t)max_tokens);
    if (keep_probs) probs = malloc((size_t)max_tokens * LJ * sizeof *probs);
    if (S > 0) spec = malloc((size_t)max_tokens * LJ * (size_t)S * sizeof *spec);
    /* The semantic embeddings the fmoe policies match on, appended to w->semantic request
     * by request. */
    const int32_t H = (want & FMOE_SIM_WANT_SEMANTIC) ? h->semantic_dim : 0;
    if (H > 0) sem = malloc((size_t)max_tokens * (size_t)H * sizeof *sem);
    /* The server's pass of each row (fmoe simulate --batch trace), appended to
     * w->served_iteration request by request; the reader refuses a trace without them. */
    const int want_served = (want & FMOE_SIM_WANT_SERVED) != 0;
    if (want_served) served = malloc((size_t)max_tokens * sizeof *served);
    if (!experts || !phase || (keep_probs && !probs) || (S > 0 && !spec) || (H > 0 && !sem) ||
        (want_served && !served)) {
        rc = fmoe_error_set(FMOE_ENOMEM, "buffers for %lld tokens", (long long)max_tokens);
        goto fail;
    }
    int64_t sem_cap = 0, served_cap = 0;
    w->semantic_dim = H;
    for (int64_t q = 0; q < R; q++) {
        if (keep && !keep[q]) continue;
        const fmoe_trace_token_buffers buf = {.phase = phase, .experts = experts,
                                               .probs = probs, .speculative = spec,
                                               .semantic = sem, .served_iteration = served};
        rc = fmoe_trace_reader_read_tokens(r, req[q].token_begin, req[q].token_count, &buf);
        if (rc < 0) goto fail;
        rc = fmoe_sim_workload_add_request_gates(w, req[q].id, req[q].arrival_s,
                                                 req[q].prompt_tokens, req[q].output_tokens,
                                                 req[q].token_count, phase, experts, probs,
                                                 spec);
        if (rc < 0) goto fail;
        if (H > 0) { /* keep the semantic rows in step with w->num_tokens */
            const int64_t need = w->num_tokens, have = need - req[q].token_count;
            if (need > sem_cap) {
                int64_t c = sem_cap ? sem_cap : 1024;
                while (c < need) c *= 2;
                float *g = realloc(w->semantic, (size_t)c * (size_t)H * sizeof *g);
                if (!g) {
                    rc = fmoe_error_set(FMOE_ENOMEM, "semantic rows of %lld tokens", (long long)c);
                    goto fail;
                }
                w->semantic = g;
                sem_cap = c;
            }
            memcpy(w->semantic + (size_t)have * H, sem, (size_t)req[q].token_count * H * sizeof *sem);
        }
        if (want_served) { /* in step with w->num_tokens too */
            const int64_t need = w->num_tokens, have = need - req[q].token_count;
            if (need > served_cap) {
                int64_t c = served_cap ? served_cap : 1024;
                while (c < need) c *= 2;
                int64_t *g = realloc(w->served_iteration, (size_t)c * sizeof *g);
                if (!g) {
                    rc = fmoe_error_set(FMOE_ENOMEM, "served passes of %lld tokens", (long long)c);
                    goto fail;
                }
                w->served_iteration = g;
                served_cap = c;
            }
            memcpy(w->served_iteration + have, served, (size_t)req[q].token_count * sizeof *served);
        }
        fmoe_progress_report(progress, q + 1, R, "requests");
    }
    free(experts);
    free(phase);
    free(probs);
    free(spec);
    free(sem);
    free(served);
    return 0;
fail:
    free(experts);
    free(phase);
    free(probs);
    free(spec);
    free(sem);
    free(served);
    fmoe_sim_workload_free(w);
    return rc;
}

/* The gate inputs are read after the routing, request by request straight into w->hidden:
 * the kept requests are w's, in trace order, so their rows follow one another. */
int fmoe_sim_workload_read_hidden(fmoe_sim_workload *w, fmoe_trace_reader *r,
                                  const uint8_t *keep) {
    const fmoe_trace_header *h = fmoe_trace_reader_header(r);
    FMOE_RETURN_ERROR_IF(w->batch > 0 || w->hidden, FMOE_EINVAL,
                         "workload: gate inputs must be read once, before batching");
    FMOE_RETURN_ERROR_IF(w->num_layers != h->num_layers, FMOE_EINVAL,
                         "workload: not the trace's (%d layers, the trace has %d)", w->num_layers,
                         h->num_layers);
    FMOE_FORWARD_IF_ERROR(fmoe_trace_reader_check_hidden(r));
    const int64_t R = fmoe_trace_reader_num_requests(r);
    const fmoe_trace_request_info *req = fmoe_trace_reader_requests(r);
    const size_t row = (size_t)h->num_layers * (size_t)h->hidden_dim; /* floats per token */
    int rc = 0;
    int64_t tok = 0;
    for (int64_t q = 0; q < R; q++)
        if (!keep || keep[q]) tok += req[q].token_count;
    if (tok != w->num_tokens) {
        rc = fmoe_error_set(FMOE_EINVAL, "workload: %lld tokens, the trace's requests have %lld",
                            (long long)w->num_tokens, (long long)tok);
        goto done;
    }
    w->hidden = malloc((size_t)(tok ? tok : 1) * row * sizeof *w->hidden);
    if (!w->hidden) {
        rc = fmoe_error_set(FMOE_ENOMEM, "gate inputs of %lld tokens (%.1f GiB as float32)",
                            (long long)tok, (double)tok * (double)row * 4.0 / 1073741824.0);
        goto done;
    }
    tok = 0;
    for (int64_t q = 0; q < R && rc == 0; q++) {
        if (keep && !keep[q]) continue;
        const fmoe_trace_token_buffers buf = {.hidden = w->hidden + (size_t)tok * row};
        rc = fmoe_trace_reader_read_tokens(r, req[q].token_begin, req[q].token_count, &buf);
        tok += req[q].token_count;
    }
    if (rc == 0) w->hidden_dim = h->hidden_dim;
done:
    if (rc < 0) {
        free(w->hidden);
        w->hidden = NULL;
    }
    return rc;
}

int fmoe_sim_workload_load_trace(fmoe_sim_workload *w, const char *path,
                                 const fmoe_progress *progress) {
    fmoe_trace_reader *r = NULL;
    int rc = fmoe_trace_reader_open(&r, path);
    if (rc < 0) return rc;
    rc = fmoe_sim_workload_read(w, r, progress);
    if (rc < 0 && !strstr(fmoe_error_detail(), path)) fmoe_error_prefix("%s", path);
    fmoe_trace_reader_close(r);
    return rc;
}
