/*
 * fmoe/analysis.h - routing statistics of a trace: per-layer expert popularity and the
 * fMoE paper's predictability analysis ("fMoE: Fine-Grained Expert Offloading for Large
 * Mixture-of-Experts Serving" §2.4, Fig. 3).
 *
 * Predictability is the Shannon entropy (bits) of the expert-activation distribution of
 * one layer: counts of how often each expert was chosen, normalised. Coarse-grained =
 * counts aggregated over a whole request (MoE-Infinity's request-level view); fine-grained
 * = counts of a single iteration (one prefill or one decode step). The mean over requests
 * (coarse) or iterations (fine) is reported per layer (Fig. 3b). `aggregated[i]` is the
 * mean entropy per layer of the pattern aggregated over a request's first i+1 iterations,
 * averaged over requests that have that many (Fig. 3c: it grows as iterations aggregate).
 *
 * Feed requests in order: begin_request, add_iteration..., end_request; then finish.
 * No I/O: the caller reads the trace.
 */
#ifndef FMOE_ANALYSIS_H
#define FMOE_ANALYSIS_H

#include <stdint.h>

#include "fmoe/routing.h" /* FMOE_PHASE_* */

typedef struct fmoe_routing_stats {
    int32_t num_layers;          /* L */
    int32_t num_experts;         /* J */
    int32_t top_k;               /* K */
    int64_t requests;
    int64_t iterations;
    int64_t prefill_tokens;
    int64_t decode_tokens;
    int64_t *expert_counts;      /* [L][J] activations over the whole trace */
    double *coarse_entropy;      /* [L] mean over requests, bits (valid after finish) */
    double *fine_entropy;        /* [L] mean over iterations, bits (valid after finish) */
    double *aggregated_entropy;  /* [aggregated_len] mean over layers and requests, bits */
    int64_t *aggregated_requests;/* [aggregated_len] requests contributing to each entry */
    int32_t aggregated_len;      /* iterations tracked for Fig. 3c */

    /* working state */
    int64_t *request_counts;     /* [L][J] current request's running counts */
    int64_t *iteration_counts;   /* [J] scratch */
    double *coarse_sum;          /* [L] */
    double *fine_sum;            /* [L] */
    int64_t request_iterations;  /* iterations seen in the current request */
} fmoe_routing_stats;

/* Allocates all working memory. `aggregated_len` >= 0 iterations are tracked for Fig. 3c. */
int fmoe_routing_stats_init(fmoe_routing_stats **out, int32_t num_layers, int32_t num_experts,
                            int32_t top_k, int32_t aggregated_len);
void fmoe_routing_stats_begin_request(fmoe_routing_stats *s);
/* experts: [num_tokens][L][K], phase FMOE_PHASE_* (0 prefill, 1 decode). Ids must be < J. */
void fmoe_routing_stats_add_iteration(fmoe_routing_stats *s, int32_t phase, int32_t num_tokens,
                                      const uint16_t *experts);
void fmoe_routing_stats_end_request(fmoe_routing_stats *s);
/* Turns the sums into means. Call once, after the last request. */
void fmoe_routing_stats_finish(fmoe_routing_stats *s);
void fmoe_routing_stats_free(fmoe_routing_stats *s);

/* Shannon entropy in bits of the distribution counts[n] / sum (0 when the sum is 0). */
double fmoe_entropy_bits(const int64_t *counts, int32_t n);

#endif
