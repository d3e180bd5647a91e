/*
 * predictor_train.c - the mini-batch trainer with early stopping and Adam's update that
 * ProMoE's predictor (predictor.c) and DuoServe-MoE's (predictor_duoserve.c) share.
 * Contracts in predictor_train.h.
 *
 * Determinism: the shuffle is our own splitmix64 stream, the losses are summed in batch
 * order; the same seed and the same callbacks give the same bits.
 */
#include "predictor_train.h"

#include <math.h>
#include <stdlib.h>

#include "fmoe/error.h"

/* Uniform in [0, n) without modulo bias worth speaking of (n < 2^32). */
static uint64_t below(uint64_t *s, uint64_t n) {
    return (uint64_t)(((__uint128_t)fmoe_splitmix64(s) * n) >> 64);
}

static void shuffle(int64_t *order, int64_t n, uint64_t *stream) {
    for (int64_t i = n - 1; i > 0; i--) { /* Fisher-Yates */
        const int64_t j = (int64_t)below(stream, (uint64_t)i + 1);
        const int64_t tmp = order[i];
        order[i] = order[j];
        order[j] = tmp;
    }
}

int fmoe__train_early_stop(const fmoe__trainee *t, int64_t n_train, int64_t n_val,
                           const fmoe__train_settings *s, int32_t min_batch,
                           const fmoe_mlp_train_params *params, fmoe_mlp_train_report *report) {
    int64_t *order = malloc((size_t)n_train * sizeof *order);
    if (!order) return fmoe_error_set(FMOE_ENOMEM, "training: out of memory");
    /* the shuffles' stream; the initial weights took params->seed itself */
    uint64_t stream = params->seed ^ 0xD1B54A32D192ED03ull;
    for (int64_t i = 0; i < n_train; i++) order[i] = i;

    fmoe_mlp_train_report rep = {0};
    double best_loss = INFINITY;
    int32_t plateau = 0;
    t->keep_best(t->ctx);
    for (int32_t epoch = 1; epoch <= s->max_epochs; epoch++) {
        shuffle(order, n_train, &stream);
        double train_total = 0.0;
        int64_t seen = 0;
        for (int64_t r0 = 0; r0 < n_train; r0 += s->batch) {
            const int32_t b = (int32_t)(n_train - r0 < s->batch ? n_train - r0 : s->batch);
            if (b < min_batch) break; /* only the last batch can be short */
            train_total += t->step(t->ctx, order + r0, b) * b;
            seen += b;
        }
        const double train_loss = train_total / (double)(seen > 0 ? seen : 1);
        const double val_loss = n_val > 0 ? t->val_loss(t->ctx) : train_loss;
        rep.epochs = epoch;
        if (val_loss < best_loss * (1.0 - 1e-4)) {
            best_loss = val_loss;
            plateau = 0;
            rep.best_epoch = epoch;
            rep.train_loss = train_loss;
            rep.val_loss = val_loss;
            t->keep_best(t->ctx);
        } else {
            plateau++;
        }
        if (params->on_epoch) params->on_epoch(params->ctx, epoch, train_loss, val_loss);
        if (plateau >= s->patience) break;
    }
    t->restore_best(t->ctx);
    if (report) *report = rep;
    free(order);
    return 0;
}

void fmoe__adam_update(const fmoe_adam *a, float *p, const float *g, float *m, float *v,
                       size_t n) {
    const double c1 = 1.0 - pow(a->beta1, (double)a->step);
    const double c2 = 1.0 - pow(a->beta2, (double)a->step);
    const float b1 = (float)a->beta1, b2 = (float)a->beta2;
    for (size_t i = 0; i < n; i++) {
        m[i] = b1 * m[i] + (1.0f - b1) * g[i];
        v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
        const double mhat = m[i] / c1, vhat = v[i] / c2;
        p[i] -= (float)(a->lr * mhat / (sqrt(vhat) + a->eps));
    }
}
