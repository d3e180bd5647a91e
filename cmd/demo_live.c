/*
 * demo_live.c - the live end of `fmoe demo` (demo_live.h).
 *
 * Matching the recording. `fmoe record --max-new-tokens M --ignore-eos` samples M tokens
 * and feeds every one of them back (the last for its routing only), so a request has M
 * decode iterations; the engine feeds back every sampled token but the last, so it is
 * asked for M + 1. The prompts are the trace's own token ids (no second tokenisation),
 * sampling is greedy and one sequence runs at a time, so the engine runs the recorded
 * iterations in the recorded order: the same tokens, the same routing, the same expert
 * accesses. Only whether an access hits depends on the policy and, live, on when the
 * copies finish (and, for the fmoe policies, when their matcher thread's searches do).
 */
#include "demo_live.h"

#include <stdlib.h>
#include <string.h>

#include "cmd_common.h"
#include "offload_cli.h"
#include "serve_engine.h"
#include "fmoe/error.h"
#include "fmoe/offload.h"
#include "fmoe/policy.h"
#include "fmoe/trace.h"

void demo_live_close(demo_live *l) {
    if (l->prompts)
        for (int32_t r = 0; r < l->num_requests; r++) free(l->prompts[r]);
    free(l->prompts);
    free(l->prompt_tokens);
    free(l->output_tokens);
    fmoe_tokenizer_free(l->tokenizer);
    fmoe_model_free(l->model);
    memset(l, 0, sizeof *l);
}

/* The prompts (token ids) and decode lengths of the trace's requests. */
static int read_requests(const char *trace, demo_live *l) {
    fmoe_trace_reader *r = NULL;
    int err = fmoe_trace_reader_open(&r, trace);
    if (err < 0) return err;
    const int64_t n = fmoe_trace_reader_num_requests(r);
    const fmoe_trace_request_info *q = fmoe_trace_reader_requests(r);
    l->num_requests = (int32_t)n;
    l->prompts = calloc((size_t)n + 1, sizeof *l->prompts);
    l->prompt_tokens = calloc((size_t)n + 1, sizeof *l->prompt_tokens);
    l->output_tokens = calloc((size_t)n + 1, sizeof *l->output_tokens);
    if (!l->prompts || !l->prompt_tokens || !l->output_tokens) {
        err = fmoe_error_set(FMOE_ENOMEM, "out of memory");
        goto done;
    }
    for (int64_t i = 0; i < n; i++) {
        l->prompt_tokens[i] = q[i].prompt_tokens;
        l->output_tokens[i] = q[i].output_tokens;
        if (!(l->prompts[i] = malloc(((size_t)q[i].prompt_tokens + 1) * sizeof(int32_t)))) {
            err = fmoe_error_set(FMOE_ENOMEM, "out of memory");
            goto done;
        }
        fmoe_trace_token_buffers buf = {.token_id = l->prompts[i]};
        if ((err = fmoe_trace_reader_read_tokens(r, q[i].token_begin, q[i].prompt_tokens,
                                                 &buf)) < 0)
            goto done;
    }
done:
    fmoe_trace_reader_close(r);
    return err < 0 ? err : 0;
}

int demo_live_open(const char *cmd, const char *model_dir, const char *trace, demo_live *out) {
    memset(out, 0, sizeof *out);
    int err;
    if ((err = fmoe_model_load(model_dir, NULL, &out->model)) < 0 ||
        (err = fmoe_tokenizer_load(model_dir, &out->tokenizer)) < 0 ||
        (err = cmd_generation_config_load(model_dir, &out->gc)) < 0 ||
        (err = read_requests(trace, out)) < 0) {
        demo_live_close(out);
        return cmd_fail(cmd, err);
    }
    return 0;
}

int demo_live_serve(const char *cmd, const demo_live *l, const char *policy, const char *store,
                    int32_t cache_experts, int32_t prefetch_distance, int quiet,
                    demo_live_result *out) {
    memset(out, 0, sizeof *out);
    const fmoe_policy_ops *ops = fmoe_policy_find(policy);
    cmd_offload_args a;
    cmd_offload_args_init(&a);
    a.policy = policy;
    a.cache_experts = cache_experts;
    a.prefetch_distance = prefetch_distance;
    a.copy_chunks = 1; /* as simulate's default, so the two move experts alike */
    a.store = ops && (ops->flags & FMOE_POLICY_TAKES_STORE) ? store : NULL;

    cmd_offload off;
    int rc = cmd_offload_open(cmd, &a, l->model, 64, quiet, &off);
    if (rc) return rc;
    rc = CMD_EXIT_FAILURE;
    serve_engine *e = NULL;
    serve_job **jobs = calloc((size_t)l->num_requests + 1, sizeof *jobs);
    int err = 0;
    if (!jobs) {
        err = fmoe_error_set(FMOE_ENOMEM, "out of memory");
        goto fail;
    }
    serve_engine_options eo = {
        .model = l->model, .tokenizer = l->tokenizer, .offload = off.x, .model_name = "demo",
        .parallel = 1, .max_queue = l->num_requests + 1, .stop_ids = l->gc.stop,
        .num_stop_ids = l->gc.num_stop};
    if ((err = fmoe_serve_engine_start(&eo, &e)) < 0) goto fail;

    const double t0 = cmd_now();
    for (int32_t r = 0; r < l->num_requests; r++) {
        serve_sampling s = {.max_tokens = l->output_tokens[r] + 1, .temperature = 0,
                            .top_p = 1, .ignore_eos = 1, .has_seed = 1};
        int status = 0;
        char msg[256];
        jobs[r] = fmoe_serve_engine_submit(e, l->prompts[r], l->prompt_tokens[r], &s, &status, msg,
                                      sizeof msg);
        if (!jobs[r]) {
            rc = cmd_failf(cmd, "live %s: request %d refused (%d): %s", policy, (int)r, status,
                           msg);
            goto done;
        }
    }
    for (int32_t r = 0; r < l->num_requests; r++) {
        serve_job_status st;
        memset(&st, 0, sizeof st);
        size_t have = 0;
        while (!st.finished) {
            char *text = NULL;
            size_t len = 0;
            if (fmoe_serve_job_wait(jobs[r], have, 10.0, &text, &len, &st) == 1) have = len;
            free(text);
        }
        if (st.finished != SERVE_FINISH_LENGTH) {
            rc = cmd_failf(cmd, "live %s: request %d ended '%s'%s%s", policy, (int)r,
                           fmoe_serve_finish_name(st.finished), st.error[0] ? ": " : "", st.error);
            goto done;
        }
        out->requests++;
        if (st.completion_tokens > 1) out->decode_tokens += st.completion_tokens - 1;
        out->decode_ms += st.predicted_ms;
    }
    out->wall_s = cmd_now() - t0;
    err = fmoe_serve_engine_stop(e, 0);
    e = NULL;
    if (err < 0) goto fail;

    /* The engine is stopped: the executor's counters are final. */
    fmoe_offload_stats stats;
    fmoe_offload_get_stats(off.x, &stats);
    out->accesses = stats.accesses;
    out->hits = stats.hits;
    out->late_hits = stats.late_hits;
    out->misses = stats.misses;
    out->bytes_loaded = stats.bytes_loaded;
    out->stall_s = stats.stall_s;
    out->hit_rate = stats.accesses > 0 ? (double)stats.hits / (double)stats.accesses : 0;
    rc = CMD_EXIT_OK;
    goto done;

fail:
    rc = cmd_fail(cmd, err);
done:
    fmoe_serve_engine_stop(e, 0);
    if (jobs)
        for (int32_t r = 0; r < l->num_requests; r++)
            if (jobs[r]) fmoe_serve_job_release(jobs[r]);
    free(jobs);
    if (cmd_offload_close(cmd, &off, rc == CMD_EXIT_OK) != 0) rc = CMD_EXIT_FAILURE;
    return rc;
}
