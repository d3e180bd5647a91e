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

int fmoe__reuse_estimate_use_request(fmoe__reuse_estimate *r, int32_t num_layers,
                                     double request_weight, int32_t memoryless) {
    const size_t ne = (size_t)num_layers * (size_t)r->J;
    r->request_weight = request_weight;
    r->memoryless = memoryless;
    r->req_stamp = calloc(ne, sizeof *r->req_stamp);
    r->req_used = calloc(ne, sizeof *r->req_used);
    r->all_used = calloc(ne, sizeof *r->all_used);
    if (!r->req_stamp || !r->req_used || !r->all_used) {
        fmoe__reuse_estimate_free(r);
        return fmoe_error_set(FMOE_ENOMEM, "request reuse estimate for %zu experts", ne);
    }
    return 0;
}

void fmoe__reuse_estimate_free(fmoe__reuse_estimate *r) {
    free(r->req_stamp);
    free(r->req_used);
    free(r->all_used);
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
    if (r->req_used) {
        if (r->req_stamp[e] != r->request) {
            r->req_stamp[e] = r->request;
            r->req_used[e] = 0;
        }
        r->req_used[e]++;
        r->all_used[e]++;
    }
    const double n = (double)r->gaps_seen[e];
    const double c = n + r->prior > 0 ? n / (n + r->prior) : 1.0;
    r->gap_pred[e] = c * r->gap_mean[e] + (1.0 - c) * fmoe__reuse_estimate_layer_gap(r, layer);
}

void fmoe__reuse_estimate_request_start(fmoe__reuse_estimate *r) {
    r->request++; /* every stamp of the last request is now stale: O(1), no table reset */
    r->req_iterations = 0;
}

void fmoe__reuse_estimate_iteration_start(fmoe__reuse_estimate *r, uint64_t now) {
    if (r->req_iterations > 0 || r->all_iterations > 0) {
        /* the accesses of the iteration that ended, into a mean over about 64 */
        const double n = (double)(now - r->iteration_tick);
        double *m = &r->ticks_per_iteration;
        *m = *m > 0 ? *m + (n - *m) / 64.0 : n;
    }
    r->iteration_tick = now;
    r->req_iterations += 1;
    r->all_iterations++;
}

double fmoe__reuse_estimate_request_gap(const fmoe__reuse_estimate *r, int32_t e) {
    const double predicted = r->predict ? r->predict(r->predict_ctx, e) : -1.0;
    const int own_prior = predicted >= 0;
    const double used = r->req_stamp[e] == r->request ? (double)r->req_used[e] : 0.0;
    /* an expert no request has used and the policy predicts nothing for: the layer's mean
     * gap, as the gap source gives an expert without history (their order is LRU's) */
    if (!own_prior && r->all_used[e] == 0) return fmoe__reuse_estimate_layer_gap(r, e / r->J);
    const double prior = own_prior ? predicted
                                   : (double)r->all_used[e] / (double)(r->all_iterations
                                                                           ? r->all_iterations
                                                                           : 1);
    const double w = r->request_weight, n = r->req_iterations + w;
    const double rate = n > 0 ? (used + w * prior) / n : prior;
    const double per_iteration = r->ticks_per_iteration > 0 ? r->ticks_per_iteration : 1.0;
    /* a rate of 0 (a predicted 0 and no use yet): never back, the first to go (ties: LRU) */
    return rate > 0 ? per_iteration / rate : HUGE_VAL;
}
