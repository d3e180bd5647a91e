/*
 * predictor_train.h - what the two learned predictors' trainers share (internal to lib/):
 * the mini-batch loop with early stopping and Adam's update, in predictor_train.c. ProMoE's
 * per-layer MLP (predictor.c) and DuoServe-MoE's ExpertMLP (predictor_duoserve.c) each hand
 * the loop their model as callbacks: one optimiser step on a batch, the validation loss,
 * keeping and restoring the best weights. The rules the loop applies are ours
 * (docs/policies.md#learned-predictors).
 */
#ifndef FMOE_PREDICTOR_TRAIN_H
#define FMOE_PREDICTOR_TRAIN_H

#include <stddef.h>
#include <stdint.h>

#include "fmoe/predictor.h"

/* Uniform in [0, 1) with 24 bits from a splitmix64 stream: the initial weights and the
 * dropout masks. */
static inline float fmoe__uniform01(uint64_t *s) {
    return (float)(fmoe_splitmix64(s) >> 40) * (1.0f / 16777216.0f);
}

/* fmoe_mlp_train_params with its zeros replaced by the defaults: batches of 64, at most 100
 * epochs, patience 3, Adam's lr 1e-3. */
typedef struct fmoe__train_settings {
    int32_t batch, max_epochs, patience;
    double lr;
} fmoe__train_settings;

static inline fmoe__train_settings fmoe__train_settings_of(const fmoe_mlp_train_params *p) {
    const fmoe__train_settings s = {
        .batch = p->batch > 0 ? p->batch : 64,
        .max_epochs = p->max_epochs > 0 ? p->max_epochs : 100,
        .patience = p->patience > 0 ? p->patience : 3,
        .lr = p->lr > 0 ? p->lr : 1e-3,
    };
    return s;
}

/* A model under training, seen by the loop through its trainer's callbacks (ctx first). */
typedef struct fmoe__trainee {
    void *ctx;
    /* One optimiser step on training rows rows[0..n) (indices into the training set, in
     * the epoch's order). @return the batch's mean loss before the step. */
    double (*step)(void *ctx, const int64_t *rows, int32_t n);
    /* The mean loss of the current weights over the validation rows (only called when
     * there are some). */
    double (*val_loss)(void *ctx);
    /* Keeps the current weights as the best so far (before the first epoch, and after
     * each better one). */
    void (*keep_best)(void *ctx);
    /* Puts the kept weights back into the model (once, after the last epoch). */
    void (*restore_best)(void *ctx);
} fmoe__trainee;

/*
 * Trains `t` (weights already initialised) on n_train rows, validating on n_val (0: the
 * training loss decides). Each epoch visits the rows in a fresh permutation (Fisher-Yates
 * over a splitmix64 stream derived from params->seed: the weights take the seed itself),
 * in batches of s->batch rows; a last batch of fewer than min_batch rows is skipped, and
 * the epoch's training loss is the mean over the rows stepped on. A validation loss below
 * (1 - 1e-4) x the best so far keeps the weights; s->patience epochs in a row without one
 * stop; params->on_epoch (may be NULL) hears every epoch. On success the best epoch's
 * weights are back in the model and *report (may be NULL) says which.
 * @return 0 or FMOE_ENOMEM (the model untouched by the loop).
 */
int fmoe__train_early_stop(const fmoe__trainee *t, int64_t n_train, int64_t n_val,
                           const fmoe__train_settings *s, int32_t min_batch,
                           const fmoe_mlp_train_params *params, fmoe_mlp_train_report *report);

/* Adam's update (Kingma & Ba 2015, Algorithm 1, with bias correction) of n parameters p
 * with gradient g and moment estimates m, v, at step a->step (already counted), with a's
 * lr, beta1, beta2 and eps (a's own moments are not used). */
void fmoe__adam_update(const fmoe_adam *a, float *p, const float *g, float *m, float *v,
                       size_t n);

#endif
