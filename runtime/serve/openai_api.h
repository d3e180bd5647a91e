/*
 * openai_api.h - the OpenAI-compatible request and response shapes of `fmoe serve`, as
 * pure functions (no sockets, no clock, no randomness: the caller passes ids and times),
 * so that they are unit-tested and fuzzed without a server.
 *
 *     serve_api_request r; serve_api_error err;
 *     if (fmoe_serve_api_parse(SERVE_API_CHAT, body, len, tok, max_context, &r, &err) < 0)
 *         reply(err.status, fmoe_serve_api_render_error(err.status, err.type, err.message,
 *                                                  err.param, err.code));
 *     ... submit r.prompt / r.sampling, wait ...
 *     char *json = fmoe_serve_api_render_response(&meta, text, len, &status);
 *     fmoe_serve_api_request_free(&r);
 *
 * Request fields (unknown fields are ignored; null counts as absent; a wrong type or a
 * value out of range is a 400 naming the field in `param`):
 *   both      model (any), max_tokens / max_completion_tokens (int >= 1; the latter wins;
 *             absent: the context left), temperature [0, 2] (absent: 1), top_p (0, 1],
 *             top_k (int >= 0, a llama.cpp extension), seed (int), stop (string or up to 4
 *             strings; empty strings are dropped), n (1..8), stream (bool),
 *             stream_options.include_usage (bool), ignore_eos (bool, a vLLM/llama.cpp
 *             extension); response_format {"type": "text" | "json_object" |
 *             "json_schema", "json_schema": {name, schema, strict}} (structured output:
 *             serve_sampling.json; a schema keyword fmoe does not do -> 400 naming it and
 *             its path); logit_bias, min_tokens -> 400 naming
 *             the field unless the value asks for nothing (null, [], {}, 0, "none");
 *             temperature or top_p positive but 0 as a float (1e-320) -> 400
 *   chat      messages: non-empty array of {role: string, content: string | null | array
 *             of {type: "text", text}} rendered by the tokenizer's chat template with the
 *             generation prompt and encoded without special tokens; logprobs (bool),
 *             top_logprobs (int 0..20; present without logprobs true -> 400);
 *             tools (array of {type: "function", function: {name: [A-Za-z0-9_.-]{1,64},
 *             description?, parameters?: object}}), tool_choice ("none", "auto",
 *             "required", {type: "function", function: {name}} naming one of tools),
 *             parallel_tool_calls (bool): tools need a template whose tool-call markup
 *             serve_tools knows, else 400 naming it; an assistant message's
 *             tool_calls[].function.arguments given as a JSON string of an object reach
 *             the template as that object (as vLLM passes them); the deprecated
 *             functions / function_call read as tools / tool_choice, answered in their
 *             own form (one message.function_call, finish_reason "function_call")
 *   completion tools, tool_choice -> 400 unless they ask for nothing
 *   completion prompt: a string, [string], [ids...] or [[ids...]] (one prompt per request);
 *             strings encoded with special tokens; logprobs (int 0..5, or false/null);
 *             echo true, best_of > 1 -> 400
 * Errors follow OpenAI: {"error": {"message", "type", "param", "code"}}.
 */
#ifndef FMOE_SERVE_OPENAI_API_H
#define FMOE_SERVE_OPENAI_API_H

#include <stddef.h>
#include <stdint.h>

#include "fmoe/tokenizer.h"
#include "serve_engine.h"
#include "serve_tools.h"

enum { SERVE_API_CHAT = 0, SERVE_API_COMPLETION = 1 };

#define SERVE_API_MAX_STOP 4
/* The most choices (`n`) a request may ask for: each is a sequence of its own. */
#define SERVE_API_MAX_N 8

typedef struct serve_api_request {
    int32_t kind;              /* SERVE_API_CHAT or SERVE_API_COMPLETION */
    int32_t *prompt;           /* [num_prompt] token ids, malloc'd */
    int32_t num_prompt;
    serve_sampling sampling;   /* .stop points into stop_store */
    char *stop_store[SERVE_API_MAX_STOP]; /* owned copies of the stop strings */
    const char *stop_ptrs[SERVE_API_MAX_STOP];
    int32_t stream;            /* 1: server-sent events */
    int32_t include_usage;     /* stream_options.include_usage */
    int32_t n;                 /* choices, 1..SERVE_API_MAX_N */
    char *tools_json;          /* chat: the `tools` handed to the template (NULL: none) */
    serve_tools_config tools;  /* chat: how the output splits into reasoning, tool calls and
                                  content (format SERVE_TOOLS_NONE: no calls parsed) */
} serve_api_request;

typedef struct serve_api_error {
    int status;                /* HTTP status: 400, 500 (out of memory) */
    const char *type;          /* "invalid_request_error", "server_error" */
    const char *code;          /* NULL, or e.g. "context_length_exceeded" */
    char param[64];            /* the offending field; "" renders as null */
    char message[512];
} serve_api_error;

/*
 * Parses a request body (UTF-8 already validated by the caller; need not be
 * NUL-terminated) of the given kind, tokenizes its prompt with `tok`, and checks it fits
 * `max_context` positions with its max_tokens. Thread-safe (tok is immutable).
 * @return 0 and *out (free with fmoe_serve_api_request_free), or FMOE_EINVAL (*err says why:
 *   status 400) or FMOE_ENOMEM (status 500); *out is then empty and needs no free.
 */
int fmoe_serve_api_parse(int32_t kind, const char *body, size_t len, const fmoe_tokenizer *tok,
                    int32_t max_context, serve_api_request *out, serve_api_error *err);

/* @return the offset of the first byte of s[0..n) that is not part of a well-formed UTF-8
 *   sequence (overlong forms, surrogates and code points past U+10FFFF are ill-formed),
 *   or n when all of it is well-formed. */
size_t fmoe_serve_api_utf8_invalid_at(const char *s, size_t n);

/* Frees what fmoe_serve_api_parse allocated; a zeroed request is a no-op. */
void fmoe_serve_api_request_free(serve_api_request *r);

/* What every response or chunk of one request repeats. */
typedef struct serve_api_meta {
    int32_t kind;              /* SERVE_API_CHAT or SERVE_API_COMPLETION */
    const char *id;            /* "chatcmpl-..." or "cmpl-..." (fmoe_serve_api_make_id) */
    int64_t created;           /* unix seconds */
    const char *model;
    /* logprobs asked (serve_sampling.logprobs): choices carry `logprobs`, whose token
     * strings come from tok's pieces; 0: "logprobs": null */
    int32_t logprobs;
    const fmoe_tokenizer *tok;
    serve_tools_config tools;  /* chat: the request's (fmoe_serve_api_splits_output) */
} serve_api_meta;

/* 1 when a chat response's text is split by serve_tools (tool calls or reasoning): choices
 * then carry a serve_tools_parse, streams a serve_tools_stream. */
static inline int fmoe_serve_api_splits_output(const serve_api_meta *m) {
    return m->kind == SERVE_API_CHAT &&
           (m->tools.format != SERVE_TOOLS_NONE || m->tools.reasoning != SERVE_REASONING_NONE);
}

#define SERVE_API_ID_MAX 40

/* Writes "chatcmpl-" or "cmpl-" and 24 hex digits of rnd[0..12) into out. */
void fmoe_serve_api_make_id(int32_t kind, const uint8_t rnd[12], char out[SERVE_API_ID_MAX]);

/* The OpenAI finish_reason of a serve_finish: "stop", "length" (also for CANCELLED: the
 * server cut the text short), NULL while running or for ERROR. */
const char *fmoe_serve_api_finish_reason(int32_t finish);

/* All renderers return malloc'd, NUL-terminated compact JSON, or NULL when out of memory.
 * `text` need not be NUL-terminated (len bytes; an embedded NUL ends it). */

/* A whole (non-streamed) response: choices[0], usage, and the llama.cpp-style `timings`
 * and fmoe's expert-cache figures `fmoe` from st. */
char *fmoe_serve_api_render_response(const serve_api_meta *m, const char *text, size_t len,
                                const serve_job_status *st);

/* The same with the generated tokens' log-probabilities lp[0..num_lp) (m->logprobs): chat
 * {"content": [{token, logprob, bytes, top_logprobs}]}, completions {tokens,
 * token_logprobs, top_logprobs, text_offset}. A logprob of -inf is rendered as -9999. */
char *fmoe_serve_api_render_response_lp(const serve_api_meta *m, const char *text, size_t len,
                                        const serve_job_status *st,
                                        const serve_token_logprob *lp, int32_t num_lp);

/* One choice of a response of n (the request's `n`). */
typedef struct serve_api_choice {
    const char *text;
    size_t len;
    int32_t finished;                 /* serve_finish: its finish_reason */
    const serve_token_logprob *lp;    /* [num_lp] (m->logprobs) */
    int32_t num_lp;
    /* the text split (fmoe_serve_api_splits_output), or NULL: message.content is text;
     * else content, reasoning_content and tool_calls (ids from m->id, the choice and the
     * call's index), finish_reason "tool_calls" when it made calls and stopped */
    const serve_tools_parse *parsed;
} serve_api_choice;

/* A whole response of n choices (index 0..n-1); st: the usage (completion tokens of all
 * the choices), timings and expert-cache figures. */
char *fmoe_serve_api_render_response_n(const serve_api_meta *m, const serve_api_choice *ch,
                                       int32_t n, const serve_job_status *st);

/* One stream chunk. role: chat's first chunk (delta {"role":"assistant","content":""});
 * else delta text (may be empty) and finish_reason (NULL while running). usage_null: add
 * "usage": null (stream_options.include_usage asks every chunk but the last to carry it). */
char *fmoe_serve_api_render_chunk(const serve_api_meta *m, int role, const char *text, size_t len,
                             const char *finish_reason, int usage_null);

/* The same for choice `index`, with the log-probabilities of the chunk's tokens (as
 * render_response_lp); start: the text offset of the first one (completions' text_offset). */
char *fmoe_serve_api_render_chunk_lp(const serve_api_meta *m, int32_t index, int role,
                                     const char *text,
                                     size_t len, const char *finish_reason, int usage_null,
                                     const serve_token_logprob *lp, int32_t num_lp,
                                     size_t start);

/* A chat chunk of a split output (fmoe_serve_api_splits_output): delta {content,
 * reasoning_content, tool_calls: [{index, id, type, function: {name, arguments}}]} with
 * only the parts d has (a call's id, type and name in its first delta only), logprobs as
 * render_chunk_lp; d NULL: an empty delta (the final chunk). */
char *fmoe_serve_api_render_chunk_tools(const serve_api_meta *m, int32_t index,
                                        const serve_tools_delta *d, const char *finish_reason,
                                        int usage_null, const serve_token_logprob *lp,
                                        int32_t num_lp, size_t start);

/* The chunk include_usage adds before [DONE]: "choices": [] and usage, timings, fmoe. */
char *fmoe_serve_api_render_usage_chunk(const serve_api_meta *m, const serve_job_status *st);

/* {"error": {"message", "type", "param" (NULL or "": null), "code" (NULL: null)}}. */
char *fmoe_serve_api_render_error(const char *type, const char *message, const char *param,
                             const char *code);

/* GET /health when it is not plainly ok: {"status": STATUS, "error": WHY}. */
char *fmoe_serve_api_render_health(const char *status, const char *why);

/* GET /v1/models: one model, with fmoe's max_context and parallel. */
char *fmoe_serve_api_render_models(const serve_engine_info *info);

#endif
