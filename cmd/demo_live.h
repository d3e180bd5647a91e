/*
 * demo_live.h - the live end of `fmoe demo`: the requests of a recorded trace served
 * again, in-process, through the serve engine (runtime/serve/serve_engine.h) over an
 * offloaded model, one at a time, so the expert accesses are the recording's and a
 * policy's live hit rate can be set beside its simulated one.
 *
 *     demo_live live;
 *     if ((rc = demo_live_open(CMD, model_dir, heldout_trace, &live))) return rc;
 *     demo_live_result r;
 *     rc = demo_live_serve(CMD, &live, "fmoe", store, 12, 1, quiet, &r);
 *     demo_live_close(&live);
 */
#ifndef FMOE_CMD_DEMO_LIVE_H
#define FMOE_CMD_DEMO_LIVE_H

#include <stdint.h>

#include "paths.h"
#include "fmoe/model.h"
#include "fmoe/tokenizer.h"

typedef struct demo_live {
    fmoe_model *model;
    fmoe_tokenizer *tokenizer;
    cmd_generation_config gc;
    int32_t num_requests;
    int32_t *prompt_tokens;    /* [num_requests] */
    int32_t *output_tokens;    /* [num_requests] decode tokens the recording fed */
    int32_t **prompts;         /* [num_requests][prompt_tokens[r]] token ids */
} demo_live;

/* What one policy did over all the requests. */
typedef struct demo_live_result {
    int64_t requests;
    int64_t accesses, hits, late_hits, misses; /* fmoe_offload_get_stats */
    int64_t bytes_loaded;
    double stall_s;
    double hit_rate;           /* hits / accesses, as simulate's hit_rate */
    int64_t decode_tokens;     /* tokens sampled after each request's first */
    double decode_ms;          /* first token -> last token, summed over the requests */
    double wall_s;             /* submit of the first -> end of the last */
} demo_live_result;

/* Loads the model, its tokenizer and stop ids, and the prompts and decode lengths of the
 * trace's requests. @return 0 or 1 (printed). */
int demo_live_open(const char *cmd, const char *model_dir, const char *trace, demo_live *out);

void demo_live_close(demo_live *l);

/* Serves every request again with `policy` over a fast tier of cache_experts slots
 * (store: the expert-map store, for policies that take one; else NULL): greedy, the
 * recording's number of decode tokens (ignore_eos), parallel 1. @return 0 or 1 (printed). */
int demo_live_serve(const char *cmd, const demo_live *l, const char *policy, const char *store,
                    int32_t cache_experts, int32_t prefetch_distance, int quiet,
                    demo_live_result *out);

#endif
