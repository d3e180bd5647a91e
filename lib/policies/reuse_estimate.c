/*
 * reuse_estimate.c - the per-expert reuse estimate (reuse_estimate.h).
 */
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "reuse_estimate.h"

int fmoe__reuse_estimate_init(fmoe__reuse_estimate *r, int32_t num_layers, int32_t num_experts,
                              double half_life, double prior, double overdue) {
    const size_t ne = (size_t)num_layers * (size_t)num_experts;
    memset(r, 0, sizeof *r);
    r->J = num_experts;
    r->alpha = 1.0 - exp2(-1.0 / half_life);
    r->prior = prior;
    r->overdue = overdue;
    r->gap_mean = calloc(ne, sizeof *r->gap_mean);
    r->gaps_seen = calloc(ne, sizeof *r->gaps_seen);
    r->prev_tick = calloc(ne, sizeof *r->prev_tick);
    r->gap_pred = calloc(ne, sizeof *r->gap_pred);
    r->layer_gap = calloc((size_t)num_layers, sizeof *r->layer_gap);
    if (!r->gap_mean || !r->gaps_seen || !r->prev_tick || !r->gap_pred || !r->layer_gap) {
        fmoe__reuse_estimate_free(r);
        return fmoe_error_set(FMOE_ENOMEM, "reuse estimate for %zu experts", ne);
    }
    return 0;
}

void fmoe__reuse_estimate_free(fmoe__reuse_estimate *r) {
    free(r->gap_mean);
    free(r->gaps_seen);
    free(r->prev_tick);
    free(r->gap_pred);
    free(r->layer_gap);
    memset(r, 0, sizeof *r);
}

void fmoe__reuse_estimate_observe(fmoe__reuse_estimate *r, int32_t layer, int32_t e,
                                  uint64_t now) {
    if (r->prev_tick[e] > 0 && now > r->prev_tick[e]) {
        const double gap = (double)(now - r->prev_tick[e]);
        /* the layer's mean over its last ~64 gaps: the prior of experts without history */
        double *lg = &r->layer_gap[layer];
        *lg = *lg > 0 ? *lg + (gap - *lg) / 64.0 : gap;
        r->gap_mean[e] = r->gaps_seen[e] ? r->gap_mean[e] + r->alpha * (gap - r->gap_mean[e])
                                         : gap;
        if (r->gaps_seen[e] < UINT32_MAX) r->gaps_seen[e]++;
    }
    r->prev_tick[e] = now;
    const double n = (double)r->gaps_seen[e];
    const double c = n + r->prior > 0 ? n / (n + r->prior) : 1.0;
    r->gap_pred[e] = c * r->gap_mean[e] + (1.0 - c) * fmoe__reuse_estimate_layer_gap(r, layer);
}
