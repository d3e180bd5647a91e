/*
 * train_duoserve.h - `fmoe train-predictor --kind duoserve` (train_duoserve.c), called by
 * cmd_train_predictor.c once the options common to both kinds are parsed and checked.
 */
#ifndef FMOE_CMD_TRAIN_DUOSERVE_H
#define FMOE_CMD_TRAIN_DUOSERVE_H

#include <stdint.h>

typedef struct cmd_train_duoserve_args {
    const char *const *traces; /* [num_traces] */
    int32_t num_traces;
    const char *output;
    double split;         /* share of requests trained on, in (0, 1) */
    int64_t seed;
    int32_t epochs, patience, batch, threads;
    double lr;
    int32_t first_width;  /* 0: the paper's widths scaled to the model */
    int json, quiet;
} cmd_train_duoserve_args;

/* Trains, writes the predictor file, prints the report. @return the exit status. */
int cmd__train_duoserve(const char *cmd, const cmd_train_duoserve_args *a);

#endif
