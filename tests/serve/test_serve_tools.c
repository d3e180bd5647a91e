/*
 * test_serve_tools.c - reasoning and tool calls parsed out of model outputs
 * (runtime/serve/serve_tools.h).
 *
 * The outputs are written in each family's format as its chat template writes an earlier
 * assistant call (tests/fixtures/chat_templates, the formats the models were trained to
 * produce); the expected names, arguments and content are worked out by hand, and complete
 * arguments are also read back with cJSON. Every case is then streamed: the parse of each
 * prefix (the text split at every byte) must be a prefix of the whole parse, and the
 * deltas of a byte-by-byte stream, concatenated, must equal it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "fmoe/error.h"
#include "harness.h"
#include "serve_tools.h"

#define DS_CALLS_BEGIN "<\xEF\xBD\x9Ctool\xE2\x96\x81" "calls\xE2\x96\x81" "begin\xEF\xBD\x9C>"
#define DS_CALLS_END "<\xEF\xBD\x9Ctool\xE2\x96\x81" "calls\xE2\x96\x81" "end\xEF\xBD\x9C>"
#define DS_CALL_BEGIN "<\xEF\xBD\x9Ctool\xE2\x96\x81" "call\xE2\x96\x81" "begin\xEF\xBD\x9C>"
#define DS_CALL_END "<\xEF\xBD\x9Ctool\xE2\x96\x81" "call\xE2\x96\x81" "end\xEF\xBD\x9C>"
#define DS_SEP "<\xEF\xBD\x9Ctool\xE2\x96\x81" "sep\xEF\xBD\x9C>"

typedef struct want_call {
    const char *name, *arguments;
} want_call;

static serve_tools_config config(int32_t format, int32_t reasoning, int32_t parallel) {
    serve_tools_config c;
    memset(&c, 0, sizeof c);
    c.format = format;
    c.reasoning = reasoning;
    c.parallel = parallel;
    return c;
}

static int is_prefix(const char *a, size_t na, const char *b, size_t nb) {
    return na <= nb && (na == 0 || memcmp(a, b, na) == 0);
}

/* Checks the streaming promise on text: every prefix's parse extends into the whole one,
 * and a byte-by-byte stream reassembles it. @return 0, or the first offending cut + 1. */
static size_t stream_check(const serve_tools_config *cfg, const char *text,
                           const serve_tools_parse *whole) {
    const size_t n = strlen(text);
    for (size_t k = 0; k <= n; k++) {
        serve_tools_parse p;
        if (fmoe_serve_tools_parse(cfg, text, k, 0, &p) < 0) return k + 1;
        int ok = is_prefix(p.content, p.content_len, whole->content, whole->content_len) &&
                 is_prefix(p.reasoning, p.reasoning_len, whole->reasoning,
                           whole->reasoning_len) &&
                 p.num_calls <= whole->num_calls;
        for (int32_t i = 0; ok && i < p.num_calls; i++)
            ok = strcmp(p.calls[i].name, whole->calls[i].name) == 0 &&
                 is_prefix(p.calls[i].arguments, p.calls[i].arguments_len,
                           whole->calls[i].arguments, whole->calls[i].arguments_len);
        fmoe_serve_tools_parse_free(&p);
        if (!ok) {
            fprintf(stderr, "  the parse of the first %zu bytes is not a prefix\n", k);
            return k + 1;
        }
    }
    /* reassembled from a byte-by-byte stream, the last step final */
    serve_tools_stream s;
    fmoe_serve_tools_stream_init(&s, cfg);
    char content[4096] = "", reasoning[4096] = "", name[8][64] = {{0}}, args[8][1024] = {{0}};
    size_t nc = 0, nr = 0, na[8] = {0};
    int32_t calls = 0;
    size_t bad = 0;
    for (size_t k = 0; k <= n && !bad; k++) {
        serve_tools_delta d;
        if (fmoe_serve_tools_stream_next(&s, text, k, k == n, &d) < 0) {
            bad = k + 1;
            break;
        }
        memcpy(content + nc, d.content ? d.content : "", d.content_len);
        nc += d.content_len;
        memcpy(reasoning + nr, d.reasoning ? d.reasoning : "", d.reasoning_len);
        nr += d.reasoning_len;
        for (int32_t i = 0; i < d.num_calls; i++) {
            const serve_tools_call_delta *c = &d.calls[i];
            if (c->name) { /* a first delta: in order, once */
                if (c->index != calls) bad = k + 1;
                snprintf(name[calls++], 64, "%s", c->name);
            } else if (c->index >= calls) {
                bad = k + 1;
            }
            memcpy(args[c->index] + na[c->index], c->arguments, c->arguments_len);
            na[c->index] += c->arguments_len;
        }
    }
    fmoe_serve_tools_stream_free(&s);
    if (bad) return bad;
    if (nc != whole->content_len || memcmp(content, whole->content, nc) != 0 ||
        nr != whole->reasoning_len || memcmp(reasoning, whole->reasoning, nr) != 0 ||
        calls != whole->num_calls) {
        fprintf(stderr, "  the stream reassembles content \"%.*s\", reasoning \"%.*s\", %d calls\n",
                (int)nc, content, (int)nr, reasoning, calls);
        return n + 1;
    }
    for (int32_t i = 0; i < calls; i++)
        if (strcmp(name[i], whole->calls[i].name) != 0 || na[i] != whole->calls[i].arguments_len ||
            memcmp(args[i], whole->calls[i].arguments, na[i]) != 0)
            return n + 1;
    return 0;
}

/* Parses text whole and checks it against the expectation, then streams it. */
#define CHECK_PARSE(cfg, text, want_content, want_reasoning, wcalls, ncalls)                     \
    do {                                                                                        \
        serve_tools_parse p_;                                                                   \
        ASSERT_OK(fmoe_serve_tools_parse(&(cfg), (text), strlen(text), 1, &p_));                \
        ASSERT_STR_EQ(p_.content, (want_content));                                              \
        if (want_reasoning) ASSERT_STR_EQ(p_.reasoning, (const char *)(want_reasoning));        \
        else ASSERT_EQ(p_.has_reasoning, 0);                                                    \
        ASSERT_EQ(p_.num_calls, (ncalls));                                                      \
        for (int32_t i_ = 0; i_ < (ncalls); i_++) {                                             \
            ASSERT_STR_EQ(p_.calls[i_].name, (wcalls)[i_].name);                                 \
            ASSERT_STR_EQ(p_.calls[i_].arguments, (wcalls)[i_].arguments);                       \
        }                                                                                       \
        ASSERT_EQ(stream_check(&(cfg), (text), &p_), 0);                                        \
        fmoe_serve_tools_parse_free(&p_);                                                       \
    } while (0)

/* complete arguments are JSON (read back by cJSON, not by the code under test) */
static int valid_json(const char *s) {
    cJSON *j = cJSON_Parse(s);
    cJSON_Delete(j);
    return j != NULL;
}

/* ---------------------------------------------------------------------------------------
 * Hermes / Qwen
 * ------------------------------------------------------------------------------------ */

TEST(hermes_call_after_text) {
    const serve_tools_config cfg = config(SERVE_TOOLS_HERMES, SERVE_REASONING_NONE, 1);
    const want_call w[] = {{"get_weather", "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}};
    CHECK_PARSE(cfg,
                "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                "{\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>",
                "Let me check.\n", NULL, w, 1);
    ASSERT_TRUE(valid_json(w[0].arguments));
}

TEST(hermes_parallel_calls_and_parallel_false) {
    const char *text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
                       "\"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", "
                       "\"arguments\": {\"tz\": \"CET\"}}\n</tool_call>";
    const want_call w[] = {{"get_weather", "{\"city\": \"Paris\"}"},
                           {"get_time", "{\"tz\": \"CET\"}"}};
    serve_tools_config cfg = config(SERVE_TOOLS_HERMES, SERVE_REASONING_NONE, 1);
    CHECK_PARSE(cfg, text, "", NULL, w, 2);
    cfg.parallel = 0; /* parallel_tool_calls false: the first call only */
    CHECK_PARSE(cfg, text, "", NULL, w, 1);
}

TEST(qwen3_thinking_then_call) {
    const serve_tools_config cfg = config(SERVE_TOOLS_HERMES, SERVE_REASONING_TAG, 1);
    const want_call w[] = {{"get_weather", "{\"city\": \"Paris\"}"}};
    CHECK_PARSE(cfg,
                "<think>\nThe user wants the weather.\n</think>\n\n<tool_call>\n{\"name\": "
                "\"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
                "", "\nThe user wants the weather.\n", w, 1);
    /* thinking, then a plain answer */
    CHECK_PARSE(cfg, "<think>\nhm\n</think>\n\nIt is sunny.", "\n\nIt is sunny.", "\nhm\n", w, 0);
    /* no think block at all: all content */
    CHECK_PARSE(cfg, "It is <b>sunny</b>.", "It is <b>sunny</b>.", NULL, w, 0);
}

TEST(hermes_markup_inside_argument_strings) {
    const serve_tools_config cfg = config(SERVE_TOOLS_HERMES, SERVE_REASONING_NONE, 1);
    const want_call w[] = {{"echo", "{\"text\": \"a } ] </tool_call> \\\" {[ b\"}"}};
    CHECK_PARSE(cfg,
                "<tool_call>\n{\"name\": \"echo\", \"arguments\": {\"text\": \"a } ] "
                "</tool_call> \\\" {[ b\"}}\n</tool_call>",
                "", NULL, w, 1);
    ASSERT_TRUE(valid_json(w[0].arguments));
}

TEST(hermes_keys_in_another_order_are_read_whole) {
    const serve_tools_config cfg = config(SERVE_TOOLS_HERMES, SERVE_REASONING_NONE, 1);
    const want_call w[] = {{"f", "{\"x\":[1,2]}"}};
    CHECK_PARSE(cfg, "<tool_call>{\"arguments\": {\"x\": [1, 2]}, \"name\": \"f\"}</tool_call>", "",
                NULL, w, 1);
}

TEST(hermes_block_that_is_no_call_stays_text) {
    const serve_tools_config cfg = config(SERVE_TOOLS_HERMES, SERVE_REASONING_NONE, 1);
    const want_call none[] = {{"", ""}};
    CHECK_PARSE(cfg, "Hi <tool_call>not json</tool_call> bye",
                "Hi <tool_call>not json</tool_call> bye", NULL, none, 0);
    /* a '<' that starts no marker is text, streamed once it is known */
    CHECK_PARSE(cfg, "a < b and <tool", "a < b and <tool", NULL, none, 0);
}

TEST(hermes_forced_prefix_of_a_named_function) {
    serve_tools_config cfg = config(SERVE_TOOLS_HERMES, SERVE_REASONING_NONE, 1);
    ASSERT_OK(fmoe_serve_tools_forced_prefix(SERVE_TOOLS_HERMES, "get_weather", NULL, cfg.prefix));
    ASSERT_STR_EQ(cfg.prefix, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ");
    const want_call w[] = {{"get_weather", "{\"city\": \"Oslo\"}"}};
    CHECK_PARSE(cfg, "{\"city\": \"Oslo\"}}\n</tool_call>", "", NULL, w, 1);
    /* "required": the model names the function */
    ASSERT_OK(fmoe_serve_tools_forced_prefix(SERVE_TOOLS_HERMES, NULL, NULL, cfg.prefix));
    CHECK_PARSE(cfg, "get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>", "", NULL,
                w, 1);
}

TEST(truncated_call_keeps_its_partial_arguments) {
    /* max_tokens cut the call: the arguments as far as they came (not valid JSON), as
     * OpenAI returns them with finish_reason "length" */
    const serve_tools_config cfg = config(SERVE_TOOLS_HERMES, SERVE_REASONING_NONE, 1);
    const want_call w[] = {{"get_weather", "{\"city\": \"Par"}};
    CHECK_PARSE(cfg, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par",
                "", NULL, w, 1);
    ASSERT_TRUE(!valid_json(w[0].arguments));
}

/* ---------------------------------------------------------------------------------------
 * Mistral
 * ------------------------------------------------------------------------------------ */

TEST(mistral_v03_list_of_calls) {
    const serve_tools_config cfg = config(SERVE_TOOLS_MISTRAL, SERVE_REASONING_NONE, 1);
    const want_call w[] = {{"get_weather", "{\"city\": \"Paris\"}"}, {"get_time", "{}"}};
    CHECK_PARSE(cfg,
                "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": "
                "\"Paris\"}}, {\"name\": \"get_time\", \"arguments\": {}}]",
                "", NULL, w, 2);
    /* Mistral-Nemo's template writes no space */
    CHECK_PARSE(cfg, "[TOOL_CALLS][{\"name\": \"get_time\", \"arguments\": {}}]", "", NULL, w + 1,
                1);
}

TEST(mistral_not_a_list_stays_text) {
    const serve_tools_config cfg = config(SERVE_TOOLS_MISTRAL, SERVE_REASONING_NONE, 1);
    const want_call none[] = {{"", ""}};
    CHECK_PARSE(cfg, "[TOOL_CALLS] oops", "[TOOL_CALLS] oops", NULL, none, 0);
}

/* ---------------------------------------------------------------------------------------
 * DeepSeek
 * ------------------------------------------------------------------------------------ */

TEST(deepseek_v3_calls) {
    const serve_tools_config cfg = config(SERVE_TOOLS_DEEPSEEK_V3, SERVE_REASONING_NONE, 1);
    const want_call w[] = {{"get_weather", "{\"city\": \"Paris\"}"}, {"get_time", "{}"}};
    CHECK_PARSE(cfg,
                "Checking." DS_CALLS_BEGIN DS_CALL_BEGIN "function" DS_SEP
                "get_weather\n```json\n{\"city\": \"Paris\"}\n```" DS_CALL_END "\n" DS_CALL_BEGIN
                "function" DS_SEP "get_time\n```json\n{}\n```" DS_CALL_END DS_CALLS_END,
                "Checking.", NULL, w, 2);
}

TEST(deepseek_v31_reasoning_then_call) {
    /* the prompt ended with <think>: the output starts inside it */
    const serve_tools_config cfg = config(SERVE_TOOLS_DEEPSEEK_V31, SERVE_REASONING_OPEN, 1);
    const want_call w[] = {{"get_weather", "{\"city\": \"Paris\"}"}};
    CHECK_PARSE(cfg,
                "Need the weather.</think>Sure." DS_CALLS_BEGIN DS_CALL_BEGIN
                "get_weather" DS_SEP "{\"city\": \"Paris\"}" DS_CALL_END DS_CALLS_END,
                "Sure.", "Need the weather.", w, 1);
}

/* ---------------------------------------------------------------------------------------
 * gpt-oss harmony: as the gpt-oss template writes earlier turns, and as the model writes
 * the answer after the prompt's <|start|>assistant (openai/harmony's format doc)
 * ------------------------------------------------------------------------------------ */

TEST(harmony_analysis_then_final) {
    const serve_tools_config cfg = config(SERVE_TOOLS_HARMONY, SERVE_REASONING_CHANNELS, 1);
    const want_call none[] = {{"", ""}};
    CHECK_PARSE(cfg,
                "<|channel|>analysis<|message|>User asks 2+2. Simple.<|end|>"
                "<|start|>assistant<|channel|>final<|message|>2 + 2 = 4.",
                "2 + 2 = 4.", "User asks 2+2. Simple.", none, 0);
    /* <|return|> left in the text (a stop id the engine did not know) ends it too */
    CHECK_PARSE(cfg, "<|channel|>final<|message|>Hi <b>there</b><|return|>", "Hi <b>there</b>",
                NULL, none, 0);
    /* commentary to no one is a preamble for the user: content */
    CHECK_PARSE(cfg,
                "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant"
                "<|channel|>final<|message|>Done.",
                "Checking.Done.", NULL, none, 0);
    /* a model that does not write harmony: its text is the answer, at the end */
    CHECK_PARSE(cfg, "just words <|end", "just words <|end", NULL, none, 0);
}

TEST(harmony_tool_calls_both_header_orders) {
    const serve_tools_config cfg = config(SERVE_TOOLS_HARMONY, SERVE_REASONING_CHANNELS, 1);
    const want_call w[] = {{"get_weather", "{\"city\":\"Paris\"}"}};
    /* the recipient after the channel, <|constrain|>json: how gpt-oss writes a call */
    CHECK_PARSE(cfg,
                "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant"
                "<|channel|>commentary to=functions.get_weather <|constrain|>json"
                "<|message|>{\"city\":\"Paris\"}<|call|>",
                "", "Need weather.", w, 1);
    ASSERT_TRUE(valid_json(w[0].arguments));
    /* the recipient before the channel: how the template renders an earlier call */
    CHECK_PARSE(cfg,
                " to=functions.get_weather<|channel|>commentary json<|message|>"
                "{\"city\":\"Paris\"}",
                "", NULL, w, 1);
    /* a built-in tool (browser) is not a function: its call stays in the reasoning */
    const want_call none[] = {{"", ""}};
    CHECK_PARSE(cfg,
                "<|channel|>analysis to=browser.search code<|message|>{\"query\":\"x\"}<|end|>"
                "<|start|>assistant<|channel|>final<|message|>ok",
                "ok", "{\"query\":\"x\"}", none, 0);
}

/* tool_choice "none" (no_calls): a call the model writes anyway is not returned as one;
 * its body is text, as a commentary message to no one is, and the reasoning stays apart */
TEST(harmony_call_under_tool_choice_none_is_content) {
    serve_tools_config cfg = config(SERVE_TOOLS_HARMONY, SERVE_REASONING_CHANNELS, 1);
    cfg.no_calls = 1;
    const want_call none[] = {{"", ""}};
    CHECK_PARSE(cfg,
                "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant"
                "<|channel|>commentary to=functions.get_weather <|constrain|>json"
                "<|message|>{\"city\":\"Paris\"}<|call|>",
                "{\"city\":\"Paris\"}", "Need weather.", none, 0);
    CHECK_PARSE(cfg,
                " to=functions.get_weather<|channel|>commentary json<|message|>{}<|end|>"
                "<|start|>assistant<|channel|>final<|message|>Sunny.",
                "{}Sunny.", NULL, none, 0);
}

TEST(harmony_forced_prefix_and_parallel_false) {
    char p[SERVE_TOOLS_PREFIX_MAX];
    ASSERT_OK(fmoe_serve_tools_forced_prefix(SERVE_TOOLS_HARMONY, "f", NULL, p));
    ASSERT_STR_EQ(p, "<|channel|>commentary to=functions.f <|constrain|>json<|message|>");
    serve_tools_config cfg = config(SERVE_TOOLS_HARMONY, SERVE_REASONING_CHANNELS, 0);
    ASSERT_OK(fmoe_serve_tools_forced_prefix(SERVE_TOOLS_HARMONY, NULL, NULL, cfg.prefix));
    const want_call w[] = {{"get_time", "{}"}};
    CHECK_PARSE(cfg,
                "get_time <|constrain|>json<|message|>{}<|end|><|start|>assistant<|channel|>"
                "commentary to=functions.other <|constrain|>json<|message|>{}",
                "", NULL, w, 1);
}

/* ---------------------------------------------------------------------------------------
 * Llama 3.x: {"name": N, "parameters": A} (Llama 3.1-3.3's templates), <|python_tag|>
 * ------------------------------------------------------------------------------------ */

TEST(llama3_json_calls) {
    const serve_tools_config cfg = config(SERVE_TOOLS_LLAMA3, SERVE_REASONING_NONE, 1);
    const want_call w[] = {{"get_weather", "{\"city\": \"Paris\"}"},
                           {"get_time", "{\"tz\": \"CET\"}"}};
    CHECK_PARSE(cfg, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", "",
                NULL, w, 1);
    CHECK_PARSE(cfg,
                "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": "
                "\"Paris\"}}; {\"name\": \"get_time\", \"parameters\": {\"tz\": \"CET\"}}",
                "", NULL, w, 2);
    /* keys in another order: read whole at the end, the arguments printed compactly */
    const want_call w2[] = {{"get_time", "{\"tz\":\"CET\"}"}};
    CHECK_PARSE(cfg, "{\"parameters\": {\"tz\": \"CET\"}, \"name\": \"get_time\"}", "", NULL,
                w2, 1);
    const want_call none[] = {{"", ""}};
    CHECK_PARSE(cfg, "The weather is {mostly} fine.", "The weather is {mostly} fine.", NULL,
                none, 0);
    CHECK_PARSE(cfg, "{\"answer\": 4}", "{\"answer\": 4}", NULL, none, 0);
    char p[SERVE_TOOLS_PREFIX_MAX];
    ASSERT_OK(fmoe_serve_tools_forced_prefix(SERVE_TOOLS_LLAMA3, "f", NULL, p));
    ASSERT_STR_EQ(p, "{\"name\": \"f\", \"parameters\": ");
}

/* ---------------------------------------------------------------------------------------
 * Mistral's [TOOL_CALLS]N[ARGS]A (Mistral Small 3.2, Devstral, Magistral)
 * ------------------------------------------------------------------------------------ */

TEST(mistral_args_calls) {
    const serve_tools_config cfg = config(SERVE_TOOLS_MISTRAL_ARGS, SERVE_REASONING_NONE, 1);
    const want_call w[] = {{"get_weather", "{\"city\": \"Paris\"}"}, {"get_time", "{}"}};
    CHECK_PARSE(cfg,
                "Sure.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}"
                "[TOOL_CALLS]get_time[ARGS]{}",
                "Sure.", NULL, w, 2);
    /* the v11 form with [CALL_ID] */
    CHECK_PARSE(cfg, "[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{\"city\": \"Paris\"}", "",
                NULL, w, 1);
    const want_call none[] = {{"", ""}};
    CHECK_PARSE(cfg, "[TOOL_CALLS]not a name![ARGS]{}", "[TOOL_CALLS]not a name![ARGS]{}", NULL,
                none, 0);
    char p[SERVE_TOOLS_PREFIX_MAX];
    ASSERT_OK(fmoe_serve_tools_forced_prefix(SERVE_TOOLS_MISTRAL_ARGS, "f", NULL, p));
    ASSERT_STR_EQ(p, "[TOOL_CALLS]f[ARGS]");
    char id[SERVE_TOOLS_ID_MAX];
    fmoe_serve_tools_call_id(SERVE_TOOLS_MISTRAL_ARGS, "chatcmpl-1", 0, 0, id);
    ASSERT_EQ(strlen(id), 9);
}

/* ---------------------------------------------------------------------------------------
 * Formats, prefixes and ids
 * ------------------------------------------------------------------------------------ */

static char *slurp(const char *name) {
    const char *root = getenv("FMOE_SOURCE_ROOT");
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/fixtures/chat_templates/%s", root ? root : ".", name);
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *s = calloc(1, 1 << 20);
    if (s) fread(s, 1, (1 << 20) - 1, f);
    fclose(f);
    return s;
}

TEST(format_from_the_template_text) {
    static const struct {
        const char *file;
        int32_t format;
    } cases[] = {
        {"Qwen-Qwen3-0.6B.jinja", SERVE_TOOLS_HERMES},
        {"Qwen-Qwen2.5-7B-Instruct.jinja", SERVE_TOOLS_HERMES},
        {"mistralai-Mistral-Nemo-Instruct-2407.jinja", SERVE_TOOLS_MISTRAL},
        {"deepseek-ai-DeepSeek-V3.1.jinja", SERVE_TOOLS_DEEPSEEK_V31},
        {"openai-gpt-oss-120b.jinja", SERVE_TOOLS_HARMONY},
        {"mistralai-Mistral-Small-3.2-24B-Instruct-2506.jinja", SERVE_TOOLS_MISTRAL_ARGS},
        {"olmoe-tulu.jinja", SERVE_TOOLS_NONE},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *t = slurp(cases[i].file);
        ASSERT_TRUE(t != NULL);
        ASSERT_EQ(fmoe_serve_tools_detect(t), cases[i].format);
        free(t);
    }
    ASSERT_EQ(fmoe_serve_tools_detect(NULL), SERVE_TOOLS_NONE);
    /* formats fmoe does not read are named, not read as their look-alikes */
    const char *coder = "{{- '<tool_call>\n<function=' + tool_call.name + '>' }}";
    ASSERT_EQ(fmoe_serve_tools_detect(coder), SERVE_TOOLS_NONE);
    ASSERT_CONTAINS(fmoe_serve_tools_unsupported(coder), "Qwen3-Coder");
    const char *small = "{{- '[TOOL_CALLS]' + tool.function.name + '[ARGS]' }}";
    ASSERT_EQ(fmoe_serve_tools_detect(small), SERVE_TOOLS_MISTRAL_ARGS);
    ASSERT_TRUE(fmoe_serve_tools_unsupported(small) == NULL);
    /* Llama 3.1's (<|python_tag|>) and 3.2's (only the JSON, turns closed by <|eot_id|>) */
    ASSERT_EQ(fmoe_serve_tools_detect("{{- '<|python_tag|>' + tool_call.name }}"),
              SERVE_TOOLS_LLAMA3);
    ASSERT_EQ(fmoe_serve_tools_detect("{{- '\"parameters\": ' }}{{ '<|eot_id|>' }}"),
              SERVE_TOOLS_LLAMA3);
    ASSERT_TRUE(fmoe_serve_tools_unsupported("<|tool_call|>") != NULL);
    ASSERT_TRUE(fmoe_serve_tools_unsupported("[TOOL_CALLS] [") == NULL);
    ASSERT_EQ(fmoe_serve_tools_detect("x " DS_CALLS_BEGIN " ```json"), SERVE_TOOLS_DEEPSEEK_V3);
}

TEST(mistral_forced_prefix_spaced_as_the_template) {
    char p[SERVE_TOOLS_PREFIX_MAX];
    ASSERT_OK(fmoe_serve_tools_forced_prefix(SERVE_TOOLS_MISTRAL, "f", "{{ '[TOOL_CALLS] [' }}", p));
    ASSERT_STR_EQ(p, "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": ");
    ASSERT_OK(fmoe_serve_tools_forced_prefix(SERVE_TOOLS_MISTRAL, "f", "{{ '[TOOL_CALLS][' }}", p));
    ASSERT_STR_EQ(p, "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": ");
    ASSERT_EQ(fmoe_serve_tools_forced_prefix(SERVE_TOOLS_NONE, "f", NULL, p), -1);
}

TEST(call_ids) {
    char a[SERVE_TOOLS_ID_MAX], b[SERVE_TOOLS_ID_MAX], c[SERVE_TOOLS_ID_MAX];
    fmoe_serve_tools_call_id(SERVE_TOOLS_HERMES, "chatcmpl-1", 0, 0, a);
    fmoe_serve_tools_call_id(SERVE_TOOLS_HERMES, "chatcmpl-1", 0, 1, b);
    fmoe_serve_tools_call_id(SERVE_TOOLS_HERMES, "chatcmpl-1", 0, 0, c);
    ASSERT_EQ(strlen(a), 29);
    ASSERT_EQ(strncmp(a, "call_", 5), 0);
    ASSERT_TRUE(strcmp(a, b) != 0);
    ASSERT_STR_EQ(a, c);
    /* Mistral's templates refuse an id that is not 9 letters and digits */
    fmoe_serve_tools_call_id(SERVE_TOOLS_MISTRAL, "chatcmpl-1", 0, 0, a);
    ASSERT_EQ(strlen(a), 9);
    for (int i = 0; i < 9; i++)
        ASSERT_TRUE((a[i] >= 'a' && a[i] <= 'z') || (a[i] >= 'A' && a[i] <= 'Z') ||
                    (a[i] >= '0' && a[i] <= '9'));
}

TEST(no_format_is_plain_content) {
    const serve_tools_config cfg = config(SERVE_TOOLS_NONE, SERVE_REASONING_NONE, 1);
    const want_call none[] = {{"", ""}};
    CHECK_PARSE(cfg, "<tool_call>{}</tool_call>", "<tool_call>{}</tool_call>", NULL, none, 0);
}

int main(int argc, char **argv) { return RUN_TESTS(argc, argv); }
