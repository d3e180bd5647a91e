/*
 * fuzz_serve_tools.c - fuzz target for the reading of model outputs into reasoning, tool
 * calls and content (runtime/serve/serve_tools.c), on which a stream's deltas rest.
 * Input: byte 0 picks the format (% 8), the reasoning mode (/ 8 % 4) and
 * parallel_tool_calls (/ 32 % 2); the rest is the output.
 * Invariants: every string is as long as it says and NUL-terminated; the parse of each
 * prefix (not final) is a prefix of the whole parse (content, reasoning, the calls' names
 * equal and their arguments prefixes), the promise streaming rests on; with
 * parallel_tool_calls false there is at most one call.
 * Build and run: tests/fuzz/README.md.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve_tools.h"

static void fail(const char *what, size_t cut) {
    fprintf(stderr, "fuzz_serve_tools: %s (at byte %zu)\n", what, cut);
    abort();
}

static int is_prefix(const char *a, size_t na, const char *b, size_t nb) {
    return na <= nb && (na == 0 || memcmp(a, b, na) == 0);
}

static void check_strings(const serve_tools_parse *p) {
    if (p->content[p->content_len] || p->reasoning[p->reasoning_len]) fail("unterminated", 0);
    for (int32_t i = 0; i < p->num_calls; i++)
        if (!p->calls[i].name[0] || p->calls[i].arguments[p->calls[i].arguments_len])
            fail("a call without a name or unterminated arguments", 0);
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);
int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    if (size < 1 || size > 4096) return 0;
    serve_tools_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.format = data[0] % 8;
    cfg.reasoning = data[0] / 8 % 4;
    cfg.parallel = data[0] / 32 % 2;
    const char *text = (const char *)data + 1;
    const size_t n = size - 1;
    serve_tools_parse whole;
    if (fmoe_serve_tools_parse(&cfg, text, n, 1, &whole) < 0) return 0;
    check_strings(&whole);
    if (!cfg.parallel && whole.num_calls > 1) fail("more than one call", n);
    /* every cut when short, else 64 of them */
    const size_t step = n <= 256 ? 1 : n / 64;
    for (size_t k = 0; k <= n; k += step) {
        serve_tools_parse p;
        if (fmoe_serve_tools_parse(&cfg, text, k, 0, &p) < 0) break;
        check_strings(&p);
        if (!is_prefix(p.content, p.content_len, whole.content, whole.content_len))
            fail("content is not a prefix of the whole", k);
        if (!is_prefix(p.reasoning, p.reasoning_len, whole.reasoning, whole.reasoning_len))
            fail("reasoning is not a prefix of the whole", k);
        if (p.num_calls > whole.num_calls) fail("more calls than the whole", k);
        for (int32_t i = 0; i < p.num_calls; i++)
            if (strcmp(p.calls[i].name, whole.calls[i].name) != 0 ||
                !is_prefix(p.calls[i].arguments, p.calls[i].arguments_len,
                           whole.calls[i].arguments, whole.calls[i].arguments_len))
                fail("a call is not a prefix of the whole's", k);
        fmoe_serve_tools_parse_free(&p);
    }
    fmoe_serve_tools_parse_free(&whole);
    return 0;
}
