/*
 * train_common.h - what both kinds of `fmoe train-predictor` (promoe in
 * cmd_train_predictor.c, duoserve in train_duoserve.c) do alike around their training: open
 * the traces and check they are of one model, split their requests (train_split.h), label
 * the predictor with where it came from, show progress by epoch, and the report's lines
 * about the data.
 */
#ifndef FMOE_CMD_TRAIN_COMMON_H
#define FMOE_CMD_TRAIN_COMMON_H

#include <cjson/cJSON.h>
#include <stdint.h>

#include "cmd_common.h"
#include "fmoe/predictor.h"
#include "fmoe/trace.h"
#include "train_split.h"

/* The traces a predictor trains on. */
typedef struct cmd_train_traces {
    const char *const *paths;      /* [n] */
    int32_t n;
    fmoe_trace_reader **readers;   /* [n] */
    const fmoe_trace_header *h0;   /* readers[0]'s header */
    int64_t num_requests;          /* R, all traces together */
    cmd_request_ref *reqs;         /* [R] after the split: num_train training requests first */
    int64_t num_train;
} cmd_train_traces;

/* Opens the n traces and checks that they are traces of one model (fingerprint, layers,
 * experts, top-k); with_hidden: also that each holds /tokens/hidden of one width, checked
 * through (--kind promoe trains on it). Prints why not. *t is set up even on failure, for
 * cmd_train_traces_close. @return 0 or the exit status. */
int cmd_train_traces_open(const char *cmd, const char *const *paths, int32_t n, int with_hidden,
                          cmd_train_traces *t);

/* Refuses fewer than 2 requests, then splits them (cmd_split_requests with split and seed).
 * @return 0 or the exit status (printed). */
int cmd_train_traces_split(const char *cmd, cmd_train_traces *t, double split, int64_t seed);

void cmd_train_traces_close(cmd_train_traces *t);

/* The model's name and fingerprint (from the first trace), the training target, the seed and
 * the split, written into p's metadata. */
void cmd_train_label_predictor(const cmd_train_traces *t, fmoe_predictor *p, const char *target,
                               int64_t seed, double split);

/* A progress bar whose label a trainer's epoch callback rewrites (label[] is shown). */
typedef struct cmd_train_progress {
    cmd_progress_bar bar;
    fmoe_progress cb;
    char label[96];
} cmd_train_progress;

/* Starts the bar in place (p must stay where it is while the bar runs), labelled `first`. */
void cmd_train_progress_start(cmd_train_progress *p, const char *first, int quiet);

/* v as a JSON number, or null when it is not finite (nothing was measured). */
cJSON *cmd_json_finite_or_null(double v);

/* The report's JSON "seed", "split", "threads" and "train_requests". */
void cmd_train_json_run(cJSON *d, int64_t seed, double split, int32_t threads,
                        const cmd_train_traces *t);

/* The report's JSON "validation_requests": {trace, index, id} of each, in split order. */
void cmd_train_json_validation(cJSON *d, const cmd_train_traces *t);

/* The report's line "  data  R requests: N train (n tokens), V validation (v tokens); seed S". */
void cmd_train_print_data(const cmd_train_traces *t, int64_t train_tokens, int64_t val_tokens,
                          int64_t seed);

#endif
