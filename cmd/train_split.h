/*
 * train_split.h - the train/validation split by request that `fmoe train-predictor` makes
 * for every kind (promoe, duoserve): one seeded shuffle, so one seed splits the same
 * traces the same way whatever the kind.
 */
#ifndef FMOE_CMD_TRAIN_SPLIT_H
#define FMOE_CMD_TRAIN_SPLIT_H

#include <stdint.h>

typedef struct cmd_request_ref {
    int32_t trace;
    int64_t index; /* into the trace's request table */
} cmd_request_ref;

/* Every request of traces 0..n-1 (counts[t] requests each, R in all, R >= 2) in one list,
 * shuffled (Fisher-Yates over a splitmix64 stream from `seed`); the first round(split·R),
 * at least 1 and at most R - 1, train, the rest validate; each part back in trace order.
 * *out receives the list (malloc'd, R entries). @return the training count, or FMOE_ENOMEM
 * (*out NULL). */
int64_t cmd_split_requests(const int64_t *counts, int32_t n, double split, uint64_t seed,
                           cmd_request_ref **out);

#endif
