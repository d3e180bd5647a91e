/*
 * reuse_estimate.h - internal: the per-expert reuse estimate of predicted-reuse
 * (predicted_reuse.c's design comment, docs/policies.md#predicted-reuse), shared with the
 * policies that take it as an eviction option (evict=predicted-reuse of moe-infinity-fb,
 * fmoe, promoe and duoserve).
 *
 * Each access of expert e at cache tick t updates e's exponentially weighted mean gap
 * between accesses and the layer's mean gap; e's predicted gap is its own mean shrunk
 * towards the layer's by the confidence n / (n + prior) after n gaps. Its predicted next
 * use at tick `now` is last + max(predicted gap, overdue x (now - last)): an expert idle
 * for longer than predicted decays into recency order. Ticks are the cache's, the same
 * live and simulated. O(1) per access; no allocation after init.
 *
 * The request source (fmoe__reuse_estimate_use_request) predicts the gap from how often the
 * *current request* uses the expert instead: MoE-Infinity §4.2's request-level activation
 * matrix (its EAM, one row per layer), which finds that a request reuses a few experts far
 * more than the model does overall. Its rate r_e (iterations of the request that accessed
 * e, per iteration) is the request's own count shrunk towards a prior by w iterations:
 *     r_e = (used_e + w · prior_e) / (iterations + w),
 * prior_e the rate a policy predicts for this request from its own predictions (the
 * callback `predict`: a matched expert map, an EAMC entry), or where it predicts none the
 * expert's rate over all requests so far; its predicted gap is ticks-per-iteration / r_e (a
 * geometric wait of mean 1/r_e iterations, each of about the mean number of accesses).
 * The overdue rule is the same. This is how a policy plugs its prediction into Belady's
 * rule: a rate per expert for the request, refined by what the request does.
 *
 * Memoryless (fmoe__reuse_estimate_use_request's `memoryless`): the same rate read as the
 * independent reference model, where each iteration uses e with probability r_e whatever
 * happened before, so the expected next use is now + gap and the order is the rates' alone
 * (lowest rate first, ties to the least recently used). Belady's rule on that prediction is
 * the A0 policy of Aho, Denning and Ullman ("Principles of Optimal Page Replacement",
 * JACM 1971), optimal under that model; no overdue rule, no recency term.
 */
#ifndef FMOE_POLICIES_REUSE_ESTIMATE_H
#define FMOE_POLICIES_REUSE_ESTIMATE_H

#include <math.h>
#include <stdint.h>

typedef struct fmoe__reuse_estimate {
    int32_t J;
    double alpha;       /* weight of a new gap in an expert's mean */
    double prior;       /* gaps for half confidence */
    double overdue;     /* the idle-time factor (0: predictions never re-estimated) */
    double *gap_mean;   /* [L*J] decayed mean inter-access gap, ticks */
    uint32_t *gaps_seen; /* [L*J] gaps observed (saturating) */
    uint64_t *prev_tick; /* [L*J] tick of the last access, 0 = none */
    double *gap_pred;   /* [L*J] the predicted gap after the last access */
    double *layer_gap;  /* [L] decayed mean gap over the layer's experts, ticks; 0 none yet */
    /* the request source (NULL tables: off) */
    double request_weight;   /* w: iterations of prior */
    uint64_t request;        /* the current request's number, from 1 */
    uint64_t *req_stamp;     /* [L*J] request of req_used (older: 0 uses) */
    uint32_t *req_used;      /* [L*J] iterations of the request that accessed e */
    /* The policy's prediction of expert e's rate in the current request (a share of its
     * iterations, in [0, 1]), or < 0 for none; NULL: none. Read at victim choices. */
    double (*predict)(const void *ctx, int32_t e);
    const void *predict_ctx;
    uint64_t *all_used;      /* [L*J] iterations of every request that accessed e */
    uint64_t all_iterations; /* iterations of every request */
    double req_iterations;   /* iterations of the current request */
    double ticks_per_iteration; /* decayed mean accesses per iteration; 0 before one */
    uint64_t iteration_tick; /* tick at the current iteration's start */
    int32_t memoryless;      /* request source: next use = now + gap (A0), not last + ... */
} fmoe__reuse_estimate;

/* half_life: of an expert's mean gap, in gaps (> 0). @return 0 or FMOE_ENOMEM. */
int fmoe__reuse_estimate_init(fmoe__reuse_estimate *r, int32_t num_layers, int32_t num_experts,
                              double half_life, double prior, double overdue);

/* Switches r to the request source with w = request_weight (>= 0) iterations of prior,
 * memoryless (1) or from the last access with the overdue rule (0); the caller then reports
 * request and iteration starts. @return 0 or FMOE_ENOMEM. */
int fmoe__reuse_estimate_use_request(fmoe__reuse_estimate *r, int32_t num_layers,
                                     double request_weight, int32_t memoryless);

/* Frees the tables; a zeroed struct is a no-op. */
void fmoe__reuse_estimate_free(fmoe__reuse_estimate *r);

/* Request source: a request starts (its counts and predicted rates begin empty). O(1). */
void fmoe__reuse_estimate_request_start(fmoe__reuse_estimate *r);

/* Request source: an iteration starts at cache tick `now`. */
void fmoe__reuse_estimate_iteration_start(fmoe__reuse_estimate *r, uint64_t now);

/* Expert e = layer * J + j accessed at cache tick `now` (ticks increase). */
void fmoe__reuse_estimate_observe(fmoe__reuse_estimate *r, int32_t layer, int32_t e,
                                  uint64_t now);

/* The layer's mean gap (1 before any gap is seen). */
static inline double fmoe__reuse_estimate_layer_gap(const fmoe__reuse_estimate *r,
                                                    int32_t layer) {
    return r->layer_gap[layer] > 0 ? r->layer_gap[layer] : 1.0;
}

/* Request source: e's predicted gap in ticks (see the top of this file). */
double fmoe__reuse_estimate_request_gap(const fmoe__reuse_estimate *r, int32_t e);

/* Request source without a policy's prediction (predict NULL): a number in the order of
 * e's rate in the current request, the rate's numerator used_e + w · prior_e (the
 * denominator is the same for every expert). For ranking by rate alone (memoryless) at
 * one division less per candidate than fmoe__reuse_estimate_next; an expert no request has
 * used scores 0. */
static inline double fmoe__reuse_estimate_rate_score(const fmoe__reuse_estimate *r, int32_t e) {
    const double used = r->req_stamp[e] == r->request ? (double)r->req_used[e] : 0.0;
    const double all = r->all_iterations ? (double)r->all_iterations : 1.0;
    return used + r->request_weight * ((double)r->all_used[e] / all);
}

/* The predicted next use of expert e, in ticks, as seen at tick `now`. */
static inline double fmoe__reuse_estimate_next(const fmoe__reuse_estimate *r, int32_t e,
                                               uint64_t now) {
    const double last = (double)r->prev_tick[e], idle = (double)now - last;
    const double gap = r->req_used ? fmoe__reuse_estimate_request_gap(r, e) : r->gap_pred[e];
    if (r->memoryless) return (double)now + gap;
    return last + fmax(gap, r->overdue * idle);
}

#endif
