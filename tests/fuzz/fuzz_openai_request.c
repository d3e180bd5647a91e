/*
 * fuzz_openai_request.c - fuzz target for the request bodies of `fmoe serve`
 * (runtime/serve/openai_api.c).
 *
 * Input: the first byte picks the endpoint (even: chat, odd: completions), the rest is the
 * body. The server's path is followed: UTF-8 validation, then the parser; a parsed request
 * is rendered back as a response and a chunk.
 *
 * With libFuzzer (or simply meson -Dfuzzing=true, tests/fuzz/README.md):
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -DFMOE_LIBFUZZER -Ilib/include -Iruntime/include \
 *     -Iruntime/serve -Itests tests/fuzz/fuzz_openai_request.c runtime/serve/openai_api.c \
 *     runtime/tokenizer/(star).c lib/error.c lib/log.c -lcjson -lpcre2-8 -lm \
 *     -o fuzz_openai_request && FMOE_SOURCE_ROOT=. ./fuzz_openai_request
 * Without (the `fuzz` suite of meson test): replays hand-written bodies, their prefixes and
 * seeded mutations under the build's sanitizers. A crash, a sanitizer report, or a broken
 * contract (an error without status, message or type; a success with an empty prompt, a
 * max_tokens past the context, an unterminated stop string) fails the run.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "fmoe/json_constraint.h"
#include "fmoe/tokenizer.h"
#include "fuzz_mutate.h"
#include "openai_api.h"

#define MAX_CONTEXT 256

static fmoe_tokenizer *tok;
static long parsed, refused; /* the replay reports both: a run that parses nothing tests little */

static void free_tokenizer(void) { fmoe_tokenizer_free(tok); }

static void load_tokenizer(void) {
    if (tok) return;
    atexit(free_tokenizer);
    const char *root = getenv("FMOE_SOURCE_ROOT");
    char path[4096];
    snprintf(path, sizeof path, "%s/datasets/fmoe-tiny", root ? root : ".");
    if (fmoe_tokenizer_load(path, &tok) < 0) {
        fprintf(stderr, "fuzz_openai_request: %s\n", fmoe_error_detail());
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    load_tokenizer();
    int32_t kind = data[0] % 2 ? SERVE_API_COMPLETION : SERVE_API_CHAT;
    /* An exact-size copy: a read past the body is an ASan report. */
    size_t n = size - 1;
    char *body = malloc(n ? n : 1);
    if (!body) return 0;
    memcpy(body, data + 1, n);
    if (fmoe_serve_api_utf8_invalid_at(body, n) < n) {
        free(body);
        return 0;
    }
    serve_api_request r;
    serve_api_error e;
    int rc = fmoe_serve_api_parse(kind, body, n, tok, MAX_CONTEXT, &r, &e);
    free(body);
    if (rc < 0) {
        if ((e.status != 400 && e.status != 500) || !e.message[0] || !e.type) {
            fprintf(stderr, "fuzz_openai_request: bad error (rc %d, status %d)\n", rc, e.status);
            abort();
        }
        char *j = fmoe_serve_api_render_error(e.type, e.message, e.param, e.code);
        free(j);
        refused++;
        return 0;
    }
    if (r.num_prompt < 1 || !r.prompt || r.sampling.max_tokens < 1 ||
        r.num_prompt + (int64_t)r.sampling.max_tokens > MAX_CONTEXT ||
        r.sampling.num_stop > SERVE_API_MAX_STOP || !(r.sampling.temperature >= 0) ||
        !(r.sampling.top_p > 0)) {
        fprintf(stderr, "fuzz_openai_request: accepted an impossible request\n");
        abort();
    }
    for (int i = 0; i < r.sampling.num_stop; i++)
        if (strlen(r.sampling.stop[i]) == 0) abort();
    for (int i = 0; i < r.num_prompt; i++)
        if (r.prompt[i] < 0 || r.prompt[i] >= fmoe_tokenizer_vocab_size(tok)) abort();
    serve_api_meta m = {kind, "id", 1, "model", r.sampling.logprobs, tok, r.tools};
    serve_job_status st = {.finished = SERVE_FINISH_STOP, .prompt_tokens = r.num_prompt};
    /* the prompt's first ids as if generated, with logprobs of a made-up row of logits */
    float logits[64];
    for (int i = 0; i < 64; i++) logits[i] = (float)((i * 37) % 11) - 5.0f;
    serve_token_logprob lp[2];
    const int32_t nlp = r.num_prompt < 2 ? r.num_prompt : 2;
    for (int32_t i = 0; i < nlp; i++) {
        fmoe_serve_logprobs_of(logits, 64, r.prompt[i] % 64, r.sampling.top_logprobs, &lp[i]);
        lp[i].text_end = 2 * (uint64_t)(i + 1);
    }
    free(fmoe_serve_api_render_response_lp(&m, "text", 4, &st, lp, nlp));
    free(fmoe_serve_api_render_chunk_lp(&m, 0, 0, "t", 1, "stop", r.include_usage, lp, nlp, 0));
    if (fmoe_serve_api_splits_output(&m)) { /* tools or <think>: the split renderers */
        static const char out[] = "<think>a</think>b<tool_call>{\"name\": \"f\", "
                                  "\"arguments\": {}}</tool_call>";
        serve_tools_parse p;
        if (fmoe_serve_tools_parse(&m.tools, out, sizeof out - 1, 1, &p) == 0) {
            const serve_api_choice c = {out, sizeof out - 1, SERVE_FINISH_STOP, lp, nlp, &p};
            free(fmoe_serve_api_render_response_n(&m, &c, 1, &st));
            fmoe_serve_tools_parse_free(&p);
        }
    }
    if (r.sampling.json) {
        /* the compiled schema's automaton over a document of every kind of value, byte by
         * byte (feed stops at the first byte refused) */
        static const char doc[] = "{\"a\":[1,-2.5e3,\"x\\n\\u00e9\",true,null,{}],\"b\":{\"c\":false}}";
        fmoe_json_matcher *jm;
        if (fmoe_json_matcher_init(r.sampling.json, NULL, &jm) == 0) {
            for (size_t i = 0; i < sizeof doc - 1; i++)
                if (fmoe_json_matcher_feed(jm, doc + i, 1) < 0) break;
            (void)fmoe_json_matcher_is_complete(jm);
            fmoe_json_matcher_free(jm);
        }
    }
    fmoe_serve_api_request_free(&r);
    parsed++;
    return 0;
}

#ifndef FMOE_LIBFUZZER
static int target(const uint8_t *data, size_t size) { return LLVMFuzzerTestOneInput(data, size); }

int fuzz_seeded_replay(void);
int fuzz_seeded_replay(void) {
    static const char *const seeds[] = {
        "\0{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"s\"},"
        "{\"role\":\"user\",\"content\":\"Hello there\"}],\"max_tokens\":16,\"temperature\":0.7,"
        "\"top_p\":0.9,\"top_k\":40,\"seed\":7,\"stop\":[\"\\n\",\"END\"],\"stream\":true,"
        "\"stream_options\":{\"include_usage\":true}}",
        "\0{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
        "{\"type\":\"text\",\"text\":\"b\"}]},{\"role\":\"assistant\",\"content\":null}],"
        "\"max_completion_tokens\":3,\"n\":1,\"logprobs\":false}",
        "\1{\"prompt\":\"def f(x):\",\"max_tokens\":8,\"stop\":\"\\n\\n\",\"echo\":false,"
        "\"ignore_eos\":true}",
        "\1{\"prompt\":[[1,2,3,4095]],\"best_of\":1,\"logprobs\":null,\"seed\":-5}",
        "\1{\"prompt\":[\"caf\xC3\xA9 \\u00e9 \\ud83d\\ude00\"],\"temperature\":0}",
        "\0{\"messages\":[{\"role\":\"user\",\"content\":\"j\"}],\"response_format\":{\"type\":"
        "\"json_schema\",\"json_schema\":{\"name\":\"x\",\"strict\":true,\"schema\":{\"type\":"
        "\"object\",\"properties\":{\"a\":{\"type\":\"array\",\"items\":{\"anyOf\":[{\"type\":"
        "\"number\"},{\"type\":\"string\"},{\"enum\":[true,null]},{\"type\":\"object\"}]},"
        "\"minItems\":1,\"maxItems\":9},\"b\":{\"type\":[\"object\",\"null\"],\"properties\":"
        "{\"c\":{\"type\":\"boolean\"}},\"required\":[\"c\"],\"additionalProperties\":false}},"
        "\"required\":[\"a\"]}}}}",
        "\1{\"prompt\":\"p\",\"response_format\":{\"type\":\"json_object\"}}",
        "\1{\"prompt\":\"p\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":"
        "{\"name\":\"r\",\"schema\":{\"$defs\":{\"A\":{\"type\":\"object\",\"properties\":"
        "{\"b\":{\"$ref\":\"#/$defs/B\"}}},\"B\":{\"enum\":[1,\"x\"]}},\"type\":\"array\","
        "\"items\":{\"$ref\":\"#/$defs/A\"}}}}}",
    };
    static const char *const tokens[] = {
        "{", "}", "[", "]", ",", ":", "\"", "null", "true", "false", "-1", "0", "1e309",
        "2.5", "4096", "\"messages\"", "\"prompt\"", "\"role\"", "\"content\"", "\"stop\"",
        "\"max_tokens\"", "\"n\"", "\"seed\"", "\"top_p\"", "\"stream_options\"", "\"text\"",
        "\"type\"", "\\u0000", "\\ud800", "\xC3\xA9", "   ", "\"properties\"", "\"items\"",
        "\"anyOf\"", "\"enum\"", "\"const\"", "\"required\"", "\"object\"", "\"array\"",
        "\"string\"", "\"integer\"", "\"json_schema\"", "\"schema\"", "\"$ref\"",
        "\"#/$defs/A\"", "\"#/$defs/B\""};
    fuzz_mutator m = {0x9e3779b97f4a7c15ull, tokens, sizeof tokens / sizeof tokens[0]};
    long runs = 0;
    for (size_t s = 0; s < sizeof seeds / sizeof seeds[0]; s++) {
        size_t n = 1 + strlen(seeds[s] + 1); /* the kind byte may be NUL */
        fuzz_replay(&m, seeds[s], n, 1, 20000, target);
        runs += (long)n + 20001;
    }
    printf("fuzz_openai_request: %ld inputs (%ld parsed, %ld refused, the rest not UTF-8 or "
           "empty), no crash\n", runs, parsed, refused);
    return 0;
}
#endif
