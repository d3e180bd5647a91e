/*
 * workload.c - a trace compiled into the §7.1 access sequence (fmoe/sim.h).
 *
 * Compilation, per iteration and layer: walk the iteration's tokens in order and each
 * token's K experts in gate order; the first time an expert appears it becomes the next
 * access, later appearances add to its token count. A per-expert stamp array makes this
 * O(n·K) with no clearing. The result (expert ids and token counts) is what every cell of a
 * sweep replays, and exactly what belady's future knowledge is.
 */
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "fmoe/sim.h"
#include "fmoe/trace.h"

int fmoe_sim_workload_init(fmoe_sim_workload *w, int32_t num_layers, int32_t num_experts,
                           int32_t top_k, int64_t expert_bytes) {
    memset(w, 0, sizeof *w);
    FMOE_RETURN_ERROR_IF(num_layers < 1 || num_experts < 1 || num_experts > 65535 ||
                             top_k < 1 || top_k > num_experts ||
                             (int64_t)num_layers * num_experts > (1 << 30),
                         FMOE_EINVAL, "workload: bad geometry L=%d J=%d K=%d", num_layers,
                         num_experts, top_k);
    FMOE_RETURN_ERROR_IF(expert_bytes < 0, FMOE_EINVAL, "workload: expert bytes %lld < 0",
                         (long long)expert_bytes);
    w->num_layers = num_layers;
    w->num_experts = num_experts;
    w->top_k = top_k;
    w->expert_bytes = expert_bytes;
    w->stamp = calloc((size_t)num_experts, sizeof *w->stamp);
    w->count = calloc((size_t)num_experts, sizeof *w->count);
    w->order = calloc((size_t)num_experts, sizeof *w->order);
    if (!w->stamp || !w->count || !w->order) {
        fmoe_sim_workload_free(w);
        return fmoe_error_set(FMOE_ENOMEM, "workload scratch");
    }
    return 0;
}

void fmoe_sim_workload_free(fmoe_sim_workload *w) {
    if (!w) return;
    free(w->requests);
    free(w->iterations);
    free(w->experts);
    free(w->access_expert);
    free(w->access_tokens);
    free(w->layer_accesses);
    free(w->stamp);
    free(w->count);
    free(w->order);
    free(w->probs);
    free(w->speculative);
    free(w->semantic);
    memset(w, 0, sizeof *w);
}

/* Grows *p (elements of `size` bytes, capacity *cap) to hold `need`. */
static int grow(void **p, int64_t *cap, int64_t need, size_t size) {
    if (need <= *cap) return 0;
    int64_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(*p, (size_t)c * size);
    if (!q) return fmoe_error_set(FMOE_ENOMEM, "workload: %lld elements", (long long)c);
    *p = q;
    *cap = c;
    return 0;
}

int fmoe_sim_workload_keep_gates(fmoe_sim_workload *w, int32_t probs_kind,
                                 int32_t speculative_depth) {
    FMOE_RETURN_ERROR_IF(w->num_requests > 0, FMOE_EINVAL,
                         "workload: gate data must be chosen before the first request");
    FMOE_RETURN_ERROR_IF(probs_kind < FMOE_PROBS_NONE || probs_kind > FMOE_PROBS_FULL,
                         FMOE_EINVAL, "workload: bad probs kind %d", probs_kind);
    FMOE_RETURN_ERROR_IF(speculative_depth < 0 || speculative_depth > 1024, FMOE_EINVAL,
                         "workload: bad speculative depth %d", speculative_depth);
    w->probs_kind = probs_kind;
    w->speculative_depth = speculative_depth;
    return 0;
}

/* Grows a per-token float array of `row` floats per token from `old_cap` to w->cap_tokens
 * tokens. */
static int grow_rows(float **p, int64_t old_cap, int64_t new_cap, size_t row) {
    if (new_cap == 0 || (new_cap == old_cap && *p)) return 0;
    float *q = realloc(*p, (size_t)new_cap * row * sizeof *q);
    if (!q) return fmoe_error_set(FMOE_ENOMEM, "workload: gate data of %lld tokens",
                                  (long long)new_cap);
    *p = q;
    return 0;
}

int fmoe_sim_workload_add_request(fmoe_sim_workload *w, int64_t id, double arrival_s,
                                  int32_t prompt_tokens, int32_t output_tokens, int64_t n,
                                  const uint8_t *phase, const uint16_t *experts) {
    return fmoe_sim_workload_add_request_gates(w, id, arrival_s, prompt_tokens, output_tokens,
                                               n, phase, experts, NULL, NULL);
}

/* The end of the iteration starting at token t: a decode token alone; a run of prefill
 * tokens whole, or its next prefill_chunk tokens (DESIGN.md §7.1). */
static int64_t iteration_end(const fmoe_sim_workload *w, const uint8_t *phase, int64_t n,
                             int64_t t) {
    int64_t e = t + 1;
    if (phase[t] != FMOE_PHASE_PREFILL) return e;
    while (e < n && phase[e] == FMOE_PHASE_PREFILL &&
           (w->prefill_chunk <= 0 || e - t < w->prefill_chunk))
        e++;
    return e;
}

int fmoe_sim_workload_add_request_gates(fmoe_sim_workload *w, int64_t id, double arrival_s,
                                        int32_t prompt_tokens, int32_t output_tokens, int64_t n,
                                        const uint8_t *phase, const uint16_t *experts,
                                        const float *probs, const float *speculative) {
    const int32_t L = w->num_layers, K = w->top_k, J = w->num_experts;
    const int32_t S = w->speculative_depth;
    FMOE_RETURN_ERROR_IF(n < 0, FMOE_EINVAL, "request %lld: %lld tokens", (long long)id,
                         (long long)n);
    FMOE_RETURN_ERROR_IF(w->probs_kind != FMOE_PROBS_NONE && n > 0 && !probs, FMOE_EINVAL,
                         "request %lld: the workload keeps probabilities but none were given",
                         (long long)id);
    FMOE_RETURN_ERROR_IF(S > 0 && n > 0 && !speculative, FMOE_EINVAL,
                         "request %lld: the workload keeps speculative rows but none were given",
                         (long long)id);
    for (int64_t i = 0; i < n * L * K; i++)
        FMOE_RETURN_ERROR_IF(experts[i] >= J, FMOE_EFORMAT,
                             "request %lld, token %lld, layer %lld: expert %u >= %d experts",
                             (long long)id, (long long)(i / ((int64_t)L * K)),
                             (long long)(i / K % L), experts[i], J);
    /* Count iterations first so every buffer grows once per request. */
    int64_t niter = 0, max_acc = 0;
    for (int64_t t = 0; t < n; t = iteration_end(w, phase, n, t)) niter++;
    max_acc = n * L * K;
    FMOE_FORWARD_IF_ERROR(grow((void **)&w->requests, &w->cap_requests, w->num_requests + 1,
                               sizeof *w->requests));
    int64_t cap_it = w->cap_iterations;
    FMOE_FORWARD_IF_ERROR(grow((void **)&w->iterations, &w->cap_iterations,
                               w->num_iterations + niter, sizeof *w->iterations));
    if (w->cap_iterations != cap_it) {
        void *q = realloc(w->layer_accesses, (size_t)w->cap_iterations * L * sizeof(uint16_t));
        if (!q) return fmoe_error_set(FMOE_ENOMEM, "workload: layer table");
        w->layer_accesses = q;
    }
    const int64_t cap_tok = w->cap_tokens;
    FMOE_FORWARD_IF_ERROR(grow((void **)&w->experts, &w->cap_tokens, w->num_tokens + n,
                               (size_t)L * K * sizeof *w->experts));
    if (w->probs_kind != FMOE_PROBS_NONE)
        FMOE_FORWARD_IF_ERROR(grow_rows(&w->probs, cap_tok, w->cap_tokens, (size_t)L * J));
    if (S > 0)
        FMOE_FORWARD_IF_ERROR(
            grow_rows(&w->speculative, cap_tok, w->cap_tokens, (size_t)L * S * J));
    int64_t cap_acc = w->cap_accesses;
    FMOE_FORWARD_IF_ERROR(grow((void **)&w->access_expert, &cap_acc, w->num_accesses + max_acc,
                               sizeof *w->access_expert));
    if (cap_acc != w->cap_accesses) {
        void *q = realloc(w->access_tokens, (size_t)cap_acc * sizeof *w->access_tokens);
        if (!q) return fmoe_error_set(FMOE_ENOMEM, "workload: access table");
        w->access_tokens = q;
        w->cap_accesses = cap_acc;
    }

    const int64_t tok0 = w->num_tokens;
    if (n) memcpy(w->experts + (size_t)tok0 * L * K, experts, (size_t)(n * L * K) * sizeof *experts);
    if (n && w->probs_kind != FMOE_PROBS_NONE)
        memcpy(w->probs + (size_t)tok0 * L * J, probs, (size_t)n * L * J * sizeof *probs);
    if (n && S > 0)
        memcpy(w->speculative + (size_t)tok0 * L * S * J, speculative,
               (size_t)n * L * S * J * sizeof *speculative);
    fmoe_sim_request *rq = &w->requests[w->num_requests];
    *rq = (fmoe_sim_request){.id = id, .arrival_s = arrival_s, .prompt_tokens = prompt_tokens,
                             .output_tokens = output_tokens,
                             .first_iteration = w->num_iterations, .num_iterations = niter};
    int64_t t = 0, context = 0;
    while (t < n) {
        const int64_t e = iteration_end(w, phase, n, t);
        context += e - t;
        fmoe_sim_iteration *it = &w->iterations[w->num_iterations];
        *it = (fmoe_sim_iteration){.request = w->num_requests,
                                   .phase = phase[t] == FMOE_PHASE_PREFILL ? 0 : 1,
                                   .num_tokens = (int32_t)(e - t), .context = context,
                                   .token_begin = tok0 + t, .access_begin = w->num_accesses};
        uint16_t *la = w->layer_accesses + (size_t)w->num_iterations * L;
        for (int32_t l = 0; l < L; l++) {
            const uint64_t st = ++w->stamp_now;
            int32_t nd = 0;
            for (int64_t u = t; u < e; u++) {
                const uint16_t *row = experts + ((size_t)u * L + l) * K;
                for (int32_t k = 0; k < K; k++) {
                    const uint16_t j = row[k];
                    if (w->stamp[j] != st) {
                        w->stamp[j] = st;
                        w->count[j] = 0;
                        w->order[nd++] = j;
                    }
                    w->count[j]++;
                }
            }
            for (int32_t q = 0; q < nd; q++) {
                w->access_expert[w->num_accesses] = (uint32_t)(l * J + w->order[q]);
                w->access_tokens[w->num_accesses] = w->count[w->order[q]];
                w->num_accesses++;
            }
            la[l] = (uint16_t)nd;
        }
        w->num_iterations++;
        t = e;
    }
    w->num_tokens += n;
    w->num_requests++;
    return 0;
}
