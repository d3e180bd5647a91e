/*
 * analysis.c - routing statistics for `fmoe inspect`: popularity and the coarse- versus
 * fine-grained entropy analysis of "fMoE: Fine-Grained Expert Offloading for Large
 * Mixture-of-Experts Serving" §2.4 (Fig. 3b, 3c).
 */
#include "fmoe/analysis.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"

double fmoe_entropy_bits(const int64_t *counts, int32_t n) {
    int64_t total = 0;
    for (int32_t j = 0; j < n; j++) total += counts[j];
    if (total <= 0) return 0.0;
    double h = 0.0;
    for (int32_t j = 0; j < n; j++) {
        if (counts[j] <= 0) continue;
        double p = (double)counts[j] / (double)total;
        h -= p * log2(p);
    }
    return h;
}

int fmoe_routing_stats_init(fmoe_routing_stats **out, int32_t num_layers, int32_t num_experts,
                            int32_t top_k, int32_t aggregated_len) {
    *out = NULL;
    FMOE_RETURN_ERROR_IF(num_layers <= 0 || num_experts <= 0 || top_k <= 0 || aggregated_len < 0,
                         FMOE_EINVAL, "routing stats: bad geometry L=%d J=%d K=%d", num_layers,
                         num_experts, top_k);
    fmoe_routing_stats *s = calloc(1, sizeof *s);
    if (!s) return fmoe_error_set(FMOE_ENOMEM, "routing stats");
    size_t lj = (size_t)num_layers * (size_t)num_experts;
    s->num_layers = num_layers;
    s->num_experts = num_experts;
    s->top_k = top_k;
    s->aggregated_len = aggregated_len;
    s->expert_counts = calloc(lj, sizeof *s->expert_counts);
    s->request_counts = calloc(lj, sizeof *s->request_counts);
    s->iteration_counts = calloc((size_t)num_experts, sizeof *s->iteration_counts);
    s->coarse_entropy = calloc((size_t)num_layers, sizeof(double));
    s->fine_entropy = calloc((size_t)num_layers, sizeof(double));
    s->coarse_sum = calloc((size_t)num_layers, sizeof(double));
    s->fine_sum = calloc((size_t)num_layers, sizeof(double));
    s->aggregated_entropy = calloc((size_t)aggregated_len + 1, sizeof(double));
    s->aggregated_requests = calloc((size_t)aggregated_len + 1, sizeof(int64_t));
    if (!s->expert_counts || !s->request_counts || !s->iteration_counts || !s->coarse_entropy ||
        !s->fine_entropy || !s->coarse_sum || !s->fine_sum || !s->aggregated_entropy ||
        !s->aggregated_requests) {
        fmoe_routing_stats_free(s);
        return fmoe_error_set(FMOE_ENOMEM, "routing stats: %zu layer x expert counters", lj);
    }
    *out = s;
    return 0;
}

void fmoe_routing_stats_begin_request(fmoe_routing_stats *s) {
    memset(s->request_counts, 0,
           (size_t)s->num_layers * (size_t)s->num_experts * sizeof *s->request_counts);
    s->request_iterations = 0;
}

void fmoe_routing_stats_add_iteration(fmoe_routing_stats *s, int32_t phase, int32_t num_tokens,
                                      const uint16_t *experts) {
    const int32_t L = s->num_layers, J = s->num_experts, K = s->top_k;
    if (phase == 0)
        s->prefill_tokens += num_tokens;
    else
        s->decode_tokens += num_tokens;
    double aggregated = 0.0;
    for (int32_t l = 0; l < L; l++) {
        memset(s->iteration_counts, 0, (size_t)J * sizeof *s->iteration_counts);
        for (int32_t t = 0; t < num_tokens; t++) {
            const uint16_t *row = experts + ((size_t)t * L + (size_t)l) * K;
            for (int32_t k = 0; k < K; k++) {
                uint16_t e = row[k];
                FMOE_ASSERT(e < J);
                s->iteration_counts[e]++;
            }
        }
        int64_t *req = s->request_counts + (size_t)l * J;
        int64_t *all = s->expert_counts + (size_t)l * J;
        for (int32_t j = 0; j < J; j++) {
            req[j] += s->iteration_counts[j];
            all[j] += s->iteration_counts[j];
        }
        s->fine_sum[l] += fmoe_entropy_bits(s->iteration_counts, J);
        if (s->request_iterations < s->aggregated_len) aggregated += fmoe_entropy_bits(req, J);
    }
    if (s->request_iterations < s->aggregated_len) {
        s->aggregated_entropy[s->request_iterations] += aggregated / L;
        s->aggregated_requests[s->request_iterations]++;
    }
    s->request_iterations++;
    s->iterations++;
}

void fmoe_routing_stats_end_request(fmoe_routing_stats *s) {
    if (s->request_iterations == 0) return;
    for (int32_t l = 0; l < s->num_layers; l++)
        s->coarse_sum[l] += fmoe_entropy_bits(s->request_counts + (size_t)l * s->num_experts,
                                              s->num_experts);
    s->requests++;
}

void fmoe_routing_stats_finish(fmoe_routing_stats *s) {
    for (int32_t l = 0; l < s->num_layers; l++) {
        s->coarse_entropy[l] = s->requests ? s->coarse_sum[l] / (double)s->requests : 0.0;
        s->fine_entropy[l] = s->iterations ? s->fine_sum[l] / (double)s->iterations : 0.0;
    }
    int32_t used = 0;
    for (int32_t i = 0; i < s->aggregated_len; i++) {
        if (s->aggregated_requests[i] == 0) break;
        s->aggregated_entropy[i] /= (double)s->aggregated_requests[i];
        used = i + 1;
    }
    s->aggregated_len = used;
}

void fmoe_routing_stats_free(fmoe_routing_stats *s) {
    if (!s) return;
    free(s->expert_counts);
    free(s->request_counts);
    free(s->iteration_counts);
    free(s->coarse_entropy);
    free(s->fine_entropy);
    free(s->coarse_sum);
    free(s->fine_sum);
    free(s->aggregated_entropy);
    free(s->aggregated_requests);
    free(s);
}
