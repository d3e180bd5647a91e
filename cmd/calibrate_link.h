/*
 * calibrate_link.h - `fmoe calibrate --link-file MODEL`: the file link timed on the model's
 * own experts, read as a live run's file tier reads them.
 */
#ifndef FMOE_CMD_CALIBRATE_LINK_H
#define FMOE_CMD_CALIBRATE_LINK_H

#include <stdint.h>

#define CALIBRATE_EXPERT_POINTS 4

/* The reads timed: point i is a piece of an expert in 8 >> i pieces (as --copy-chunks
 * splits a transfer), the last the whole expert. */
typedef struct calibrate_expert_reads {
    int32_t n;                                /* points */
    double bytes[CALIBRATE_EXPERT_POINTS];    /* the mean bytes of the point's reads */
    double seconds[CALIBRATE_EXPERT_POINTS];  /* their mean time, the slowest and fastest
                                                 tenth left out */
    int32_t reads;                            /* reads per point */
    int64_t expert_bytes;                     /* the largest layer's expert */
} calibrate_expert_reads;

/* 1 when `path` is a model the forward pass loads (a directory, or a GGUF file), whose
 * experts the link is then timed on; 0 for any other file (timed by reads of its bytes). */
int calibrate_link_is_model(const char *path);

/* Loads the model at `path` and times reads of its routed experts, each at a random layer
 * and expert, through the file tier with O_DIRECT and `depth` requests in flight
 * (fmoe_offload's --tier file --direct-io --read-depth): pieces of 1/8, 1/4, 1/2 of an
 * expert and whole experts, interleaved (a repetition reads each size once, so the drift
 * of a shared disk slows every size alike), for at least 24 repetitions and until about
 * three seconds have passed (quick: 4 repetitions). @return 0, or the load's or a read's
 * error (named). */
int calibrate_expert_reads_run(const char *path, int32_t depth, int quick,
                               calibrate_expert_reads *out);

#endif
