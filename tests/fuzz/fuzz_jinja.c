/*
 * fuzz_jinja.c - fuzz target for the chat-template Jinja interpreter (runtime/tokenizer/
 * jinja*.c): the input is a template, rendered with a conversation of every shape fmoe
 * serve passes (system, turns, tool calls and results, thinking).
 *
 * Invariants: no crash or sanitizer report, and a refusal is one line that names the
 * template line ("chat template line N: ...") or says what ran out; work stays bounded
 * (the interpreter's step, depth, output and memory limits).
 *
 * With libFuzzer: clang -g -O1 -fsanitize=fuzzer,address,undefined -DFMOE_LIBFUZZER
 *   -Ilib/include -Iruntime/include -Iruntime/tokenizer tests/fuzz/fuzz_jinja.c runtime/tokenizer/jinja_*.c
 *   lib/error.c -lm -o fuzz_jinja && ./fuzz_jinja tests/fuzz/corpus/jinja
 * Without (the `fuzz` suite of meson test): replays corpus/jinja.tar.zst (real chat
 * templates) and seeded mutations of each of its templates (FMOE_FIXTURES/chat_templates).
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "fuzz_mutate.h"
#include "jinja.h"

static const char VARS[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
    " {\"role\": \"user\", \"content\": \"Weather?\"},"
    " {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"c1\", \"type\":"
    " \"function\", \"function\": {\"name\": \"w\", \"arguments\": {\"city\": \"Paris\","
    " \"lat\": 48.0}}}]},"
    " {\"role\": \"tool\", \"tool_call_id\": \"c1\", \"name\": \"w\", \"content\": \"sunny\"},"
    " {\"role\": \"assistant\", \"content\": \"<think>\\nok\\n</think>\\n\\nSunny.\","
    " \"reasoning_content\": \"ok\"},"
    " {\"role\": \"user\", \"content\": \"Thanks \\u00e9\\ud83d\\ude42\"}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"w\", \"description\": \"d\","
    " \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}}}}],"
    " \"documents\": null, \"add_generation_prompt\": true, \"bos_token\": \"<s>\","
    " \"eos_token\": \"</s>\", \"enable_thinking\": false}";

static void one_input(const uint8_t *data, size_t size) {
    char *tmpl = malloc(size + 1);
    if (!tmpl) abort();
    memcpy(tmpl, data, size);
    tmpl[size] = '\0'; /* a NUL inside ends the template, as a C string does */
    char *out = NULL;
    size_t len = 0;
    int rc = fmoe__jinja_render(tmpl, VARS, &out, &len);
    if (rc == 0) {
        if (!out || strlen(out) > len) {
            fprintf(stderr, "fuzz_jinja: output without its length\n");
            abort();
        }
    } else {
        const char *d = fmoe_error_detail();
        if (out || !d[0] || strchr(d, '\n') || strncmp(d, "chat template", 13) != 0) {
            fprintf(stderr, "fuzz_jinja: bad failure (rc %d): %s\n", rc, d);
            abort();
        }
    }
    free(out);
    free(tmpl);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    one_input(data, size);
    return 0;
}

#ifndef FMOE_LIBFUZZER
static const char *const TOKENS[] = {
    "{{", "}}", "{%", "%}", "{%-", "-%}", "{#", "#}", "{% for x in messages %}", "{% endfor %}",
    "{% if ", "{% endif %}", "{% else %}", "{% set ns.a = 1 %}", "loop.", "(", ")", "[", "]",
    "|tojson", "|length", "|map(attribute='x')", " is defined", " not ", "'", "\"", "\\",
    "range(99999)", "{% macro m(a=1) %}", "{% endmacro %}", "m()", ".items()", "[::-1]", "~",
    "**", "//", "{% break %}", "none", "namespace(", "raise_exception('x')", "\n"};

/* Every template of FMOE_FIXTURES/chat_templates, each with 200 seeded mutations. */
int fuzz_seeded_replay(void);
int fuzz_seeded_replay(void) {
    const char *fx = getenv("FMOE_FIXTURES");
    if (!fx) {
        fprintf(stderr, "fuzz_jinja: FMOE_FIXTURES is not set\n");
        return 1;
    }
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/chat_templates", fx);
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "fuzz_jinja: cannot open %s\n", dir);
        return 1;
    }
    fuzz_mutator m = {.state = 0x9E3779B97F4A7C15ull, .tokens = TOKENS,
                      .num_tokens = sizeof TOKENS / sizeof TOKENS[0]};
    long runs = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t nl = strlen(e->d_name);
        if (nl < 6 || strcmp(e->d_name + nl - 6, ".jinja") != 0) continue;
        char path[8192];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        FILE *f = fopen(path, "rb");
        if (!f) return 1;
        static char src[1 << 16], buf[(1 << 16) + 4096];
        size_t n = fread(src, 1, sizeof src, f);
        fclose(f);
        for (int k = 0; k < 200; k++) {
            size_t len = fuzz_mutate(&m, src, n, buf, sizeof buf);
            one_input((const uint8_t *)buf, len), runs++;
        }
    }
    closedir(d);
    printf("fuzz_jinja: %ld mutated templates, no failure\n", runs);
    return 0;
}
#endif
