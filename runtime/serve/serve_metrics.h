/*
 * serve_metrics.h - the server's Prometheus metrics (text exposition format 0.0.4):
 * latency histograms and token/request counters observed by the engine, and the gauges
 * and per-layer expert-cache counters read from the engine when /metrics is rendered.
 *
 * All functions are thread-safe (one mutex); observing is a few additions.
 *
 * Names (prefix fmoe_):
 *   fmoe_time_to_first_token_seconds        histogram   submit -> first token
 *   fmoe_inter_token_latency_seconds        histogram   between consecutive tokens
 *   fmoe_request_latency_seconds            histogram   submit -> finished (end to end)
 *   fmoe_request_queue_time_seconds         histogram   submit -> first forward
 *   fmoe_requests_running, fmoe_requests_waiting             gauges
 *   fmoe_prompt_tokens_total, fmoe_generation_tokens_total   counters
 *   fmoe_requests_total{finish_reason="stop|length|cancelled|error"}  counter
 *   fmoe_http_requests_total{code="200|400|..."}                      counter
 *   fmoe_trace_write_failures_total   counter  requests failed (507) or refused (503)
 *                                     because --trace-out could not record them
 *   per layer {layer="l"}: fmoe_expert_cache_hits_total, fmoe_expert_cache_misses_total,
 *   fmoe_expert_cache_late_total, fmoe_expert_prefetch_issued_total,
 *   fmoe_expert_prefetch_useful_total, fmoe_expert_load_bytes_total,
 *   fmoe_expert_cache_resident (gauge), fmoe_expert_stall_seconds_total
 *   fmoe_model_info{model="NAME"}  gauge (1), once fmoe_serve_metrics_set_model_name was called
 * m may be NULL in fmoe_serve_metrics_render: then only the gauges and per-layer families.
 */
#ifndef FMOE_SERVE_METRICS_H
#define FMOE_SERVE_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "serve_engine.h"

typedef struct serve_metrics serve_metrics;

/* @return NULL when out of memory. */
serve_metrics *fmoe_serve_metrics_new(void);
void fmoe_serve_metrics_free(serve_metrics *m);

void fmoe_serve_metrics_observe_ttft(serve_metrics *m, double seconds);
void fmoe_serve_metrics_observe_itl(serve_metrics *m, double seconds);
void fmoe_serve_metrics_observe_e2e(serve_metrics *m, double seconds);
void fmoe_serve_metrics_observe_queue(serve_metrics *m, double seconds);
void fmoe_serve_metrics_add_tokens(serve_metrics *m, int64_t prompt, int64_t generated);
/* Prompt tokens a request did not run: their KV came from the prefix cache. */
void fmoe_serve_metrics_add_cached_tokens(serve_metrics *m, int64_t cached);
/* finish: serve_finish (SERVE_FINISH_STOP..ERROR) */
void fmoe_serve_metrics_request_done(serve_metrics *m, int32_t finish);
void fmoe_serve_metrics_http_status(serve_metrics *m, int code);
/* One request that failed or was refused because the trace could not record it. */
void fmoe_serve_metrics_trace_failure(serve_metrics *m);

/* Extensions (the HTTP side calls them): the model's name, rendered as
 * fmoe_model_info{model="NAME"} 1 (copied; NULL clears it). @return 0 or FMOE_ENOMEM. */
int fmoe_serve_metrics_set_model_name(serve_metrics *m, const char *name);

/* Writes v as a Prometheus label value (backslash, double quote and newline escaped) into
 * out (cap bytes, NUL-terminated, truncated at a whole escape). @return the length the
 * whole escaped value needs, without the NUL. */
size_t fmoe_serve_metrics_escape_label(const char *v, char *out, size_t cap);

/* Renders everything: histograms and counters from m, gauges and per-layer counters as
 * given. @return 0 and *out (malloc'd, NUL-terminated, *len bytes), or FMOE_ENOMEM. */
int fmoe_serve_metrics_render(serve_metrics *m, const serve_engine_gauges *g,
                         const serve_layer_counters *layers, int32_t num_layers, char **out,
                         size_t *len);

#endif
