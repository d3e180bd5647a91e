/*
 * serve_tools.h - the model's output split into what OpenAI's chat API returns apart:
 * reasoning (`<think>...</think>`: message.reasoning_content), tool calls in the markup of
 * the model's family (message.tool_calls) and the rest (message.content).
 *
 * The formats (docs/serving.md#tool-calls), chosen from the chat template's text:
 *   HERMES       Qwen2/2.5/3, Hermes:  <tool_call>\n{"name": N, "arguments": A}\n</tool_call>
 *   MISTRAL      Mistral v0.3, Nemo:   [TOOL_CALLS] [{"name": N, "arguments": A}, ...]
 *   DEEPSEEK_V3  DeepSeek-V3/R1:       <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function
 *                                      <｜tool▁sep｜>N\n```json\nA\n```<｜tool▁call▁end｜>...
 *                                      <｜tool▁calls▁end｜>
 *   DEEPSEEK_V31 DeepSeek-V3.1:        the same without "function" and the fence:
 *                                      <｜tool▁call▁begin｜>N<｜tool▁sep｜>A<｜tool▁call▁end｜>
 *   HARMONY      gpt-oss:              messages on channels after the prompt's
 *                                      <|start|>assistant: <|channel|>analysis<|message|>R
 *                                      <|end|><|start|>assistant<|channel|>final<|message|>C,
 *                                      a call <|channel|>commentary to=functions.N
 *                                      <|constrain|>json<|message|>A (the recipient may also
 *                                      stand before <|channel|>); generation stops at
 *                                      <|return|> or <|call|>. analysis is the reasoning,
 *                                      final (and commentary to no one) the content.
 *   LLAMA3       Llama 3.1/3.2/3.3:    an output that is {"name": N, "parameters": A}
 *                                      (after <|python_tag|> or not; several joined by ";")
 *   MISTRAL_ARGS Mistral Small 3.2, Devstral, Magistral: [TOOL_CALLS]N[ARGS]A, once per
 *                                      call ([CALL_ID]id between them is skipped)
 *
 * One pure function parses the whole text generated so far; a stream calls it again on
 * each longer text and sends the difference. That is correct because the parse of a text
 * that may still grow (final 0) is a prefix of the parse of every longer text: content,
 * reasoning and each call's arguments only grow, a call's name is given whole or not at
 * all, and whatever could still turn out to be markup (a tail that is the start of
 * `<tool_call>`, whitespace between calls) is held back until it is known.
 * tests/serve/test_serve_tools.c checks it by splitting real outputs at every byte.
 *
 * A call's `arguments` are the JSON text the model wrote, byte for byte (so that they can
 * stream as they come), not re-serialised: OpenAI's API says the same, that arguments are
 * JSON text the model produced, which may not be valid. A call whose head is not the
 * expected {"name": ..., "arguments": ...} (keys in another order, say) is read whole with
 * a JSON parser once its closing tag came; one that is not JSON at all is left in the
 * content as the model wrote it.
 */
#ifndef FMOE_SERVE_TOOLS_H
#define FMOE_SERVE_TOOLS_H

#include <stddef.h>
#include <stdint.h>

typedef enum serve_tools_format {
    SERVE_TOOLS_NONE = 0,     /* no tool calls parsed */
    SERVE_TOOLS_HERMES = 1,
    SERVE_TOOLS_MISTRAL = 2,
    SERVE_TOOLS_DEEPSEEK_V3 = 3,
    SERVE_TOOLS_DEEPSEEK_V31 = 4,
    SERVE_TOOLS_HARMONY = 5,
    SERVE_TOOLS_LLAMA3 = 6,
    SERVE_TOOLS_MISTRAL_ARGS = 7,
} serve_tools_format;

typedef enum serve_reasoning {
    SERVE_REASONING_NONE = 0, /* no <think> parsing */
    SERVE_REASONING_TAG = 1,  /* the output may open with <think> (Qwen3) */
    SERVE_REASONING_OPEN = 2, /* the prompt ended with <think>: the output starts inside it
                                 (DeepSeek-R1, V3.1 thinking, Qwen3-Thinking) */
    SERVE_REASONING_CHANNELS = 3, /* the format's own channels say it (HARMONY: analysis) */
} serve_reasoning;

/* The longest forced prefix: the opening markup and a function name (64 bytes at most,
 * as OpenAI's API allows). */
#define SERVE_TOOLS_PREFIX_MAX 192

typedef struct serve_tools_config {
    int32_t format;           /* serve_tools_format */
    int32_t reasoning;        /* serve_reasoning */
    int32_t parallel;         /* 0: only the first call is kept (parallel_tool_calls false) */
    /* 1: no call may be returned (tool_choice "none", or no tools): a HARMONY call the
     * model writes anyway is read as text, its body joining the content as a commentary
     * message to no one does (the other formats are not parsed at all then) */
    int32_t no_calls;
    /* 1: the request used the deprecated `functions`: the reply carries one call as
     * message.function_call (finish_reason "function_call"), so parallel is 0. Read by
     * the renderer (openai_api.c), not by the parse. */
    int32_t legacy;
    /* text the model's output continues: the opening markup the server appended to the
     * prompt to force a call (tool_choice "required" or a named function); parsed as if
     * the model had written it. "" for none. */
    char prefix[SERVE_TOOLS_PREFIX_MAX];
} serve_tools_config;

typedef struct serve_tool_call {
    char *name;               /* NUL-terminated */
    char *arguments;          /* [arguments_len] bytes (+ NUL): JSON text, partial while the
                                 call is still being written */
    size_t arguments_len;
} serve_tool_call;

typedef struct serve_tools_parse {
    char *content;            /* [content_len] (+ NUL) */
    size_t content_len;
    char *reasoning;          /* [reasoning_len] (+ NUL) */
    size_t reasoning_len;
    int32_t has_reasoning;    /* a think block was seen (an empty one too) */
    serve_tool_call *calls;   /* [num_calls] */
    int32_t num_calls;
} serve_tools_parse;

/* @return the format whose markup the chat template text shows (SERVE_TOOLS_NONE when it
 *   shows none, shows a format fmoe does not read, or text is NULL). */
serve_tools_format fmoe_serve_tools_detect(const char *template_text);

/* @return the name of a tool-call format the template text shows that fmoe does not read
 *   (Qwen3-Coder's XML, Granite's <|tool_call|>), for the error message; NULL when none. */
const char *fmoe_serve_tools_unsupported(const char *template_text);

/* @return the format's name for messages ("hermes", "mistral", "deepseek_v3", ...). */
const char *fmoe_serve_tools_format_name(int32_t format);

/* Writes into out the opening markup that makes the model's next words a call: of
 * function `name` (its arguments follow), or of a function it names itself (name NULL),
 * spaced as template_text (may be NULL) writes an earlier call.
 * @return 0, or -1 when it does not fit or the format has none. */
int fmoe_serve_tools_forced_prefix(int32_t format, const char *name, const char *template_text,
                                   char out[SERVE_TOOLS_PREFIX_MAX]);

/* Writes into out the markup that opens a call whose whole {"name": N, KEY: A} object the
 * model then writes (tool_choice "required" with several tools: that object is
 * constrained to a call of one of them), and into *args_key KEY ("arguments", Llama 3's
 * "parameters"). @return 0, or -1 for a format whose calls are not such an object
 * (harmony, DeepSeek, Mistral's [ARGS]). */
int fmoe_serve_tools_call_opening(int32_t format, const char *template_text,
                                  char out[SERVE_TOOLS_PREFIX_MAX], const char **args_key);

/* Splits cfg->prefix followed by text[0..len) (need not be NUL-terminated). final 0: more
 * may come, so what could still become markup is held back; 1: the output ended.
 * @return 0 and *out (free with fmoe_serve_tools_parse_free), or FMOE_ENOMEM. */
int fmoe_serve_tools_parse(const serve_tools_config *cfg, const char *text, size_t len,
                           int final, serve_tools_parse *out);

void fmoe_serve_tools_parse_free(serve_tools_parse *p);

/* Call ids: "call_" and 24 hex digits derived from the response id, the choice and the
 * call's index, unique as the response id is; for MISTRAL(_ARGS) 9 letters and digits, which
 * Mistral's templates insist on when the id comes back with the tool's result. */
#define SERVE_TOOLS_ID_MAX 40
void fmoe_serve_tools_call_id(int32_t format, const char *response_id, int32_t choice,
                              int32_t index, char out[SERVE_TOOLS_ID_MAX]);

/* ---------------------------------------------------------------------------------------
 * Streaming: what a stream has sent, and the next delta.
 * ------------------------------------------------------------------------------------ */

typedef struct serve_tools_call_delta {
    int32_t index;            /* the call's index */
    const char *name;         /* its first delta: the name (the id goes with it); else NULL */
    const char *arguments;    /* [arguments_len] more bytes of its arguments */
    size_t arguments_len;
} serve_tools_call_delta;

typedef struct serve_tools_delta {
    const char *content;      /* [content_len] new bytes */
    size_t content_len;
    const char *reasoning;    /* [reasoning_len] new bytes */
    size_t reasoning_len;
    serve_tools_call_delta *calls; /* [num_calls] */
    int32_t num_calls;
} serve_tools_delta;

typedef struct serve_tools_stream {
    serve_tools_config cfg;
    serve_tools_parse last;   /* the latest parse: the delta points into it */
    size_t content_sent, reasoning_sent;
    int32_t calls_sent;       /* calls whose name went out */
    size_t *args_sent;        /* [cap] bytes of each call's arguments sent */
    serve_tools_call_delta *deltas; /* [cap] */
    int32_t cap;
} serve_tools_stream;

/* A stream of cfg (copied); free with fmoe_serve_tools_stream_free. */
void fmoe_serve_tools_stream_init(serve_tools_stream *s, const serve_tools_config *cfg);
void fmoe_serve_tools_stream_free(serve_tools_stream *s);

/* Parses the whole text so far and returns in *d what was not sent yet (valid until the
 * next call or the free); the stream then counts it as sent.
 * @return 0, or FMOE_ENOMEM. */
int fmoe_serve_tools_stream_next(serve_tools_stream *s, const char *text, size_t len, int final,
                                 serve_tools_delta *d);

#endif
