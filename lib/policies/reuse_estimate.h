/*
 * reuse_estimate.h - internal: the per-expert reuse estimate of predicted-reuse
 * (predicted_reuse.c's design comment, docs/policies.md#predicted-reuse), shared with the
 * policies that take it as an eviction option (moe-infinity-fb's evict=predicted-reuse).
 *
 * Each access of expert e at cache tick t updates e's exponentially weighted mean gap
 * between accesses and the layer's mean gap; e's predicted gap is its own mean shrunk
 * towards the layer's by the confidence n / (n + prior) after n gaps. Its predicted next
 * use at tick `now` is last + max(predicted gap, overdue x (now - last)): an expert idle
 * for longer than predicted decays into recency order. Ticks are the cache's, the same
 * live and simulated. O(1) per access; no allocation after init.
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
} fmoe__reuse_estimate;

/* half_life: of an expert's mean gap, in gaps (> 0). @return 0 or FMOE_ENOMEM. */
int fmoe__reuse_estimate_init(fmoe__reuse_estimate *r, int32_t num_layers, int32_t num_experts,
                              double half_life, double prior, double overdue);

/* Frees the tables; a zeroed struct is a no-op. */
void fmoe__reuse_estimate_free(fmoe__reuse_estimate *r);

/* Expert e = layer * J + j accessed at cache tick `now` (ticks increase). */
void fmoe__reuse_estimate_observe(fmoe__reuse_estimate *r, int32_t layer, int32_t e,
                                  uint64_t now);

/* The layer's mean gap (1 before any gap is seen). */
static inline double fmoe__reuse_estimate_layer_gap(const fmoe__reuse_estimate *r,
                                                    int32_t layer) {
    return r->layer_gap[layer] > 0 ? r->layer_gap[layer] : 1.0;
}

/* The predicted next use of expert e, in ticks, as seen at tick `now`. */
static inline double fmoe__reuse_estimate_next(const fmoe__reuse_estimate *r, int32_t e,
                                               uint64_t now) {
    const double last = (double)r->prev_tick[e], idle = (double)now - last;
    return last + fmax(r->gap_pred[e], r->overdue * idle);
}

#endif
