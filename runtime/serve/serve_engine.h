/*
 * serve_engine.h - the generation engine behind `fmoe serve`: a queue of requests, one
 * scheduler thread running up to P sequences with continuous batching over the (optionally
 * offloaded) model, and jobs the HTTP side reads text from as it is produced.
 *
 *     serve_engine *e;
 *     fmoe_serve_engine_start(&opts, &e);                      // loads, starts the scheduler
 *     serve_job *j = fmoe_serve_engine_submit(e, ids, n, &sampling, &status, msg, sizeof msg);
 *     size_t have = 0; char *text = NULL; size_t len; serve_job_status st;
 *     while (fmoe_serve_job_wait(j, have, 1.0, &text, &len, &st) == 0 && ...) { ...; have = len; }
 *     fmoe_serve_job_release(j);                               // the HTTP side's reference
 *     fmoe_serve_engine_stop(e, grace_s);                      // finish or cut, then free
 *
 * Threads: submit/wait/cancel/release and the snapshot functions may be called from any
 * thread (libmicrohttpd's connection threads); the model runs only on the scheduler
 * thread. A job is shared by the engine and the caller (two references): whoever releases
 * last frees it.
 *
 * Scheduling (one iteration = one batched forward call): every running sequence that is
 * decoding contributes its next token; then sequences still prefilling contribute prompt
 * chunks, oldest first, up to the iteration's token budget (batch_tokens, which is also
 * the longest prompt chunk); waiting requests are admitted (FIFO) while fewer than P run. A finished or cancelled sequence frees its slot
 * at the end of the iteration it finished in.
 */
#ifndef FMOE_SERVE_ENGINE_H
#define FMOE_SERVE_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "fmoe/json_constraint.h"
#include "fmoe/model.h"
#include "fmoe/offload.h"
#include "fmoe/tokenizer.h"
#include "fmoe/trace.h"
#include "serve_logprobs.h"

typedef struct serve_engine serve_engine;
typedef struct serve_job serve_job;
typedef struct serve_metrics serve_metrics;

typedef struct serve_engine_options {
    const fmoe_model *model;           /* borrowed; outlives the engine */
    const fmoe_tokenizer *tokenizer;   /* borrowed */
    fmoe_offload *offload;             /* borrowed; NULL: every expert resident */
    serve_metrics *metrics;            /* borrowed; NULL: none */
    const char *model_name;            /* the `model` field of responses */
    int32_t parallel;                  /* P >= 1 sequences at once, P <= batch_tokens */
    /* Tokens of one batched forward call: decode tokens plus prompt chunks (fmoe serve
     * --batch-tokens; 0: FMOE_BATCH_TOKENS, which fmoe simulate --batch mirrors). It
     * sizes the runner session's activations and an offload executor's prefill_chunk
     * must equal it. */
    int32_t batch_tokens;
    int32_t max_queue;                 /* waiting requests beyond which submit says 503 */
    int32_t max_context;               /* KV positions per sequence (0: model's, <= 4096) */
    int32_t threads;                   /* CPU threads (0: all cores) */
    fmoe_backend_kind backend;         /* where the sessions compute; an offload executor's
                                          fmoe_offload_options.backend must equal it */
    const int32_t *stop_ids;           /* extra end-of-sequence ids (generation_config) */
    int32_t num_stop_ids;
    /* Production traces: every request that finished (stop or length, or cut after its
     * prompt ran) is appended when it leaves the batch, by a writer thread of its own
     * (trace_queue.h), before its client is told: its tokens, routing, gate
     * probabilities, semantic rows, the pass each token ran in, arrival time since start.
     * Borrowed; opened with the header of cmd_trace_header_for_model. NULL: none. */
    fmoe_trace_writer *trace_out;
    /* S of the trace's /tokens/speculative (the header's speculative_depth): 0, or the
     * runner session's depth when the policy reads speculative gates (fmoe_offload_attach
     * sets it), so a replay of the trace can run that policy. */
    int32_t trace_speculative;
    fmoe_activations activations;      /* the sessions' fmoe_session_options.activations */
    /* Prefix reuse (fmoe serve --no-prefix-cache turns it off): a finished sequence's slot
     * keeps its KV cache and the tokens it holds; a new request goes to the free slot whose
     * tokens share the longest prefix with its prompt and prefills only the rest
     * (fmoe_session_keep_prefix). Off by itself with trace_out (a trace holds every prompt
     * row) and for models whose rotary embedding depends on the call's length. */
    int32_t prefix_cache;
    /* Bytes of KV caches kept beyond the slots (fmoe serve --prefix-cache-gb;
     * serve_prefix.h), so that more conversations than `parallel` keep their prefixes; 0:
     * the slots' own caches only. CPU backend only (a copy between sessions). */
    int64_t prefix_cache_bytes;
} serve_engine_options;

/* Sampling and limits of one request, as the API layer parsed them. */
typedef struct serve_sampling {
    int32_t max_tokens;   /* >= 1 (the API layer fills a default: the context left) */
    float temperature;    /* 0: greedy */
    float top_p;          /* >= 1: off */
    int32_t top_k;        /* 0: off */
    uint64_t seed;
    int32_t has_seed;     /* 0: the engine picks a seed */
    const char *const *stop; /* stop strings (copied by submit); generation ends before
                                the first occurrence, which is not part of the text */
    int32_t num_stop;
    int32_t ignore_eos;
    /* 1: record each generated token's log-probability (serve_logprobs.h: of the raw
     * distribution) and its top_logprobs alternatives, for fmoe_serve_job_logprobs */
    int32_t logprobs;
    int32_t top_logprobs; /* [0, SERVE_MAX_TOP_LOGPROBS] */
    /* 1: special tokens stay in the text (tool-call markers such as Mistral's [TOOL_CALLS]
     * are special tokens, which the text otherwise skips) */
    int32_t keep_special;
    /* Structured output (response_format): each step samples only among the tokens that
     * keep the text a prefix of a document of this schema, and an end-of-sequence token
     * is admitted, then forced, once the document is whole (fmoe/json_constraint.h);
     * ignore_eos does not apply then. Borrowed from the caller; submit takes a reference
     * of its own. NULL: free text. */
    fmoe_json_schema *json;
} serve_sampling;

typedef enum serve_finish {
    SERVE_RUNNING = 0,
    SERVE_FINISH_STOP = 1,      /* EOS or a stop string */
    SERVE_FINISH_LENGTH = 2,    /* max_tokens or the context */
    SERVE_FINISH_CANCELLED = 3, /* the client went away, or shutdown cut it */
    SERVE_FINISH_ERROR = 4,     /* the forward pass failed; status.error says why */
} serve_finish;

/* "stop", "length", "cancelled", "error", or NULL while running (OpenAI finish_reason). */
const char *fmoe_serve_finish_name(int32_t finish);

/* Expert-cache figures of one request: its share of every batched iteration it was in
 * (accesses of an iteration are attributed to each sequence whose tokens routed to the
 * expert). */
typedef struct serve_job_cache {
    int64_t hits, misses, late;
    int64_t prefetched;         /* accesses served by a prefetch (hits and late hits) */
    int64_t bytes_loaded;
    double stall_ms;
} serve_job_cache;

typedef struct serve_job_status {
    int32_t finished;           /* serve_finish */
    int32_t prompt_tokens;
    int32_t completion_tokens;
    int32_t cached_tokens;      /* prompt tokens whose KV was reused, not run (prefix_cache;
                                   OpenAI's usage.prompt_tokens_details.cached_tokens) */
    double queue_ms;            /* submit -> first forward of the request */
    double prompt_ms;           /* first forward -> first token sampled */
    double predicted_ms;        /* first token -> last token */
    serve_job_cache cache;
    char error[256];            /* SERVE_FINISH_ERROR: the forward pass's error */
    int32_t http_status;        /* SERVE_FINISH_ERROR: the HTTP status it maps to (0: 500;
                                   507: the request could not be written to the trace) */
} serve_job_status;

/* Starts the scheduler thread. @return 0, FMOE_EINVAL (bad options), FMOE_ENOMEM (the
 * sessions' KV caches: the detail says how much). */
int fmoe_serve_engine_start(const serve_engine_options *o, serve_engine **out);

/* Stops accepting (submit says 503), lets running and waiting requests finish for up to
 * grace_s seconds, cancels the rest, joins the scheduler and frees the engine. Jobs still
 * referenced by the HTTP side stay valid until released. NULL is a no-op.
 * @return 0, or the first error appending to trace_out (detail set; later requests were
 *         not written). */
int fmoe_serve_engine_stop(serve_engine *e, double grace_s);

/* Queues a request of prompt ids[0..n). @return the job (two references: the caller's and
 * the engine's), or NULL with *http_status and a one-line message: 503 (queue full, or
 * shutting down), 400 (empty prompt, prompt + max_tokens beyond the context, an id outside
 * the vocabulary), 500 (out of memory); 503 also once the trace could not be written. */
serve_job *fmoe_serve_engine_submit(serve_engine *e, const int32_t *ids, int32_t n,
                               const serve_sampling *s, int *http_status, char *msg,
                               size_t cap);

/* Waits up to timeout_s until the job's text is longer than `have` bytes or the job has
 * finished; then sets *text to a malloc'd copy of the whole text so far (stop strings and
 * a trailing incomplete UTF-8 sequence held back; caller frees; may be NULL when len is 0),
 * *len, and *st. @return 1 when there is news (more text or finished), 0 on timeout. */
int fmoe_serve_job_wait(serve_job *j, size_t have, double timeout_s, char **text, size_t *len,
                   serve_job_status *st);

/* The log-probabilities of generated tokens from..(all so far) of a request that asked for
 * them (serve_sampling.logprobs): *out a malloc'd copy of *n records (NULL when 0; caller
 * frees), each with text_end, the text's length once that token was decoded.
 * @return 0, or FMOE_ENOMEM (*n 0). */
int fmoe_serve_job_logprobs(serve_job *j, int32_t from, serve_token_logprob **out, int32_t *n);

/* Has the engine call fn(arg) whenever the job has news (more text, or it finished), on
 * the engine's threads with the job's lock held: fn must be quick and must not call into
 * the job (an event-driven server resumes the connection waiting for it). fn NULL: none.
 * Once this returns no call of the previous fn is in progress, so its arg may go. */
void fmoe_serve_job_set_notify(serve_job *j, void (*fn)(void *), void *arg);

/* Asks the engine to stop the job (a client disconnected): its sequence leaves the batch
 * at the end of the current iteration and finishes as SERVE_FINISH_CANCELLED. */
void fmoe_serve_job_cancel(serve_job *j);

/* Drops the caller's reference. */
void fmoe_serve_job_release(serve_job *j);

/* What /v1/models, /health and /metrics need. */
typedef struct serve_engine_info {
    const char *model_name;
    int32_t max_context;
    int32_t parallel;
    int32_t num_layers;         /* MoE layers L (per-layer metrics) */
    int32_t offloaded;          /* 1 when an executor runs the experts */
    const char *backend;        /* "cpu" or "cuda": where the sessions compute */
    int64_t created;            /* unix seconds the engine started */
} serve_engine_info;

void fmoe_serve_engine_get_info(const serve_engine *e, serve_engine_info *out);

typedef struct serve_engine_gauges {
    int32_t running;
    int32_t waiting;
    int32_t ready;              /* 0 while loading or stopping (/health: 503) */
    const char *trace_error;    /* non-NULL once --trace-out could not be written: why
                                   (the engine's string, valid while it runs; /health:
                                   503 degraded) */
    int64_t prefix_cache_bytes;     /* KV memory kept for prefixes beyond the slots */
    int64_t prefix_cache_tokens;    /* tokens it holds now */
    int64_t prefix_cache_evictions; /* kept prefixes replaced by another conversation's */
} serve_engine_gauges;

void fmoe_serve_engine_get_gauges(serve_engine *e, serve_engine_gauges *out);

/* Per MoE layer expert-cache counters since start (all zero without offloading). */
typedef struct serve_layer_counters {
    int64_t hits, misses, late;
    int64_t prefetch_issued, prefetch_useful;
    int64_t load_bytes;
    int64_t resident;           /* experts of the layer resident now (a gauge) */
    double stall_s;
} serve_layer_counters;

/* Fills out[0..num_layers). */
void fmoe_serve_engine_get_layers(serve_engine *e, serve_layer_counters *out);

#endif
