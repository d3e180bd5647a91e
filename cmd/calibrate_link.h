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

/* The file link as an offloaded decode step sees it (--link-decode-gb): the copy engine's
 * bytes over its busy seconds in the decode iterations of a short run of the model from its
 * file with O_DIRECT, LRU, its expert slots `cache_gb` GiB as --cache-gb sizes them. */
typedef struct calibrate_decode_link {
    double cache_gb;
    int32_t slots;        /* the expert slots of cache_gb */
    int32_t threads;      /* the session's compute threads (0: all cores) */
    int32_t tokens;       /* decode tokens run */
    int64_t bytes;        /* the copy engine's bytes in decode iterations */
    double busy_s;        /* its seconds copying them */
    double hit_pct;       /* the run's hits, percent of accesses */
    double decode_s;      /* the decode's wall seconds */
} calibrate_decode_link;

/* Loads the model at `path`, opens it offloaded (--cache-gb cache_gb --tier file
 * --direct-io --read-depth depth --policy lru, the CPU backend with `threads` threads and
 * `activations`), prefills a prompt of 4 random tokens (seeded: every calibration reads
 * alike) and decodes greedily for at least 8 tokens and three seconds (quick: 2 tokens),
 * at most 64 tokens or 60 s. Why a decode and not reads alone: a decode step's reader
 * threads share the cores with its products, and on a machine with few cores the disk it
 * sees is slower than reads timed on an idle CPU (docs/results.md, the Qwen3 shape: 8-12%).
 * @return a command exit code: 0, or 1/2 with the error printed ("fmoe <cmd>: ..."),
 * also when no copy ran in decode (the cache holds every expert routed). */
int calibrate_decode_link_run(const char *cmd, const char *path, int32_t depth,
                              double cache_gb, int32_t threads, int32_t activations,
                              int quick, calibrate_decode_link *out);

#endif
