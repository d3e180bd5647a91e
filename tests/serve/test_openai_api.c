/*
 * test_openai_api.c - the OpenAI request parser and response renderers of `fmoe serve`
 * (runtime/serve/openai_api.c) and its Prometheus metrics (serve_metrics.c), without a
 * server: every field and error case of the parser, the rendered JSON read back with
 * cJSON, the metrics text read back line by line.
 *
 * Expected prompt ids come from encoding hand-written ChatML text with the bundled
 * fmoe-tiny tokenizer, not from the code under test.
 */
#include <cjson/cJSON.h>

#include "fmoe/error.h"
#include "fmoe/json_constraint.h"
#include "fmoe/tokenizer.h"
#include "harness.h"
#include "openai_api.h"
#include "serve_metrics.h"

#define MAX_CONTEXT 1024

static const fmoe_tokenizer *tiny(void) {
    static fmoe_tokenizer *tok;
    if (!tok) {
        const char *root = getenv("FMOE_SOURCE_ROOT");
        char path[4096];
        snprintf(path, sizeof path, "%s/datasets/fmoe-tiny", root ? root : ".");
        if (fmoe_tokenizer_load(path, &tok) < 0) {
            fprintf(stderr, "cannot load %s: %s\n", path, fmoe_error_detail());
            exit(1);
        }
    }
    return tok;
}

static int parse(int32_t kind, const char *body, serve_api_request *r, serve_api_error *e) {
    return fmoe_serve_api_parse(kind, body, strlen(body), tiny(), MAX_CONTEXT, r, e);
}

/* Encodes text with the tiny tokenizer; *n ids, malloc'd. */
static int32_t *encode(const char *text, int add_special, size_t *n) {
    int32_t *ids = NULL;
    if (fmoe_tokenizer_encode_alloc(tiny(), text, strlen(text), add_special, &ids, n) < 0) abort();
    return ids;
}

static int same_ids(const int32_t *a, size_t na, const int32_t *b, size_t nb) {
    return na == nb && (na == 0 || memcmp(a, b, na * sizeof *a) == 0);
}

/* ---------------------------------------------------------------------------------------
 * Parsing: the good cases
 * ------------------------------------------------------------------------------------ */

TEST(chat_defaults_and_template) {
    serve_api_request r;
    serve_api_error e;
    ASSERT_OK(parse(SERVE_API_CHAT,
                    "{\"model\":\"whatever\",\"messages\":[{\"role\":\"system\",\"content\":"
                    "\"Be brief.\"},{\"role\":\"user\",\"content\":\"Hi\"}]}",
                    &r, &e));
    size_t n;
    int32_t *want = encode("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi"
                           "<|im_end|>\n<|im_start|>assistant\n",
                           0, &n);
    int same = same_ids(r.prompt, (size_t)r.num_prompt, want, n);
    free(want);
    ASSERT_TRUE(same);
    ASSERT_EQ(r.kind, SERVE_API_CHAT);
    ASSERT_NEAR(r.sampling.temperature, 1.0, 0);
    ASSERT_NEAR(r.sampling.top_p, 1.0, 0);
    ASSERT_EQ(r.sampling.top_k, 0);
    ASSERT_EQ(r.sampling.has_seed, 0);
    ASSERT_EQ(r.sampling.num_stop, 0);
    ASSERT_EQ(r.sampling.ignore_eos, 0);
    ASSERT_EQ(r.sampling.max_tokens, MAX_CONTEXT - r.num_prompt);
    ASSERT_EQ(r.stream, 0);
    ASSERT_EQ(r.include_usage, 0);
    fmoe_serve_api_request_free(&r);
}

TEST(chat_content_parts_concatenate) {
    serve_api_request a, b;
    serve_api_error e;
    ASSERT_OK(parse(SERVE_API_CHAT,
                    "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":"
                    "\"Hello, \"},{\"type\":\"text\",\"text\":\"world\"}]}]}",
                    &a, &e));
    ASSERT_OK(parse(SERVE_API_CHAT,
                    "{\"messages\":[{\"role\":\"user\",\"content\":\"Hello, world\"}]}", &b, &e));
    int same = same_ids(a.prompt, (size_t)a.num_prompt, b.prompt, (size_t)b.num_prompt);
    fmoe_serve_api_request_free(&a);
    fmoe_serve_api_request_free(&b);
    ASSERT_TRUE(same);
}

TEST(chat_every_field) {
    serve_api_request r;
    serve_api_error e;
    ASSERT_OK(parse(SERVE_API_CHAT,
                    "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":7,"
                    "\"temperature\":0.5,\"top_p\":0.9,\"top_k\":40,\"seed\":1234,"
                    "\"stop\":[\"a\",\"bb\"],\"n\":1,\"stream\":true,"
                    "\"stream_options\":{\"include_usage\":true},\"ignore_eos\":true,"
                    "\"unknown_field\":{\"deep\":[1,2]},\"presence_penalty\":0}",
                    &r, &e));
    ASSERT_EQ(r.sampling.max_tokens, 7);
    ASSERT_NEAR(r.sampling.temperature, 0.5, 1e-7);
    ASSERT_NEAR(r.sampling.top_p, 0.9, 1e-7);
    ASSERT_EQ(r.sampling.top_k, 40);
    ASSERT_EQ(r.sampling.has_seed, 1);
    ASSERT_EQ(r.sampling.seed, 1234);
    ASSERT_EQ(r.sampling.num_stop, 2);
    ASSERT_STR_EQ(r.sampling.stop[0], "a");
    ASSERT_STR_EQ(r.sampling.stop[1], "bb");
    ASSERT_EQ(r.sampling.ignore_eos, 1);
    ASSERT_EQ(r.stream, 1);
    ASSERT_EQ(r.include_usage, 1);
    fmoe_serve_api_request_free(&r);
}

TEST(max_completion_tokens_wins_and_nulls_are_absent) {
    serve_api_request r;
    serve_api_error e;
    ASSERT_OK(parse(SERVE_API_CHAT,
                    "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":9,"
                    "\"max_completion_tokens\":3,\"temperature\":null,\"stop\":null,"
                    "\"seed\":null,\"stream_options\":null}",
                    &r, &e));
    ASSERT_EQ(r.sampling.max_tokens, 3);
    ASSERT_NEAR(r.sampling.temperature, 1.0, 0);
    ASSERT_EQ(r.sampling.has_seed, 0);
    fmoe_serve_api_request_free(&r);
}

TEST(stop_string_empty_stops_and_negative_seed) {
    serve_api_request r;
    serve_api_error e;
    ASSERT_OK(parse(SERVE_API_COMPLETION,
                    "{\"prompt\":\"x\",\"stop\":\"END\",\"seed\":-1,\"temperature\":0}", &r, &e));
    ASSERT_EQ(r.sampling.num_stop, 1);
    ASSERT_STR_EQ(r.sampling.stop[0], "END");
    ASSERT_EQ(r.sampling.has_seed, 1);
    ASSERT_TRUE(r.sampling.seed == UINT64_MAX);
    ASSERT_NEAR(r.sampling.temperature, 0, 0);
    fmoe_serve_api_request_free(&r);
    ASSERT_OK(parse(SERVE_API_COMPLETION, "{\"prompt\":\"x\",\"stop\":[\"\",\"z\",\"\"]}", &r, &e));
    ASSERT_EQ(r.sampling.num_stop, 1);
    ASSERT_STR_EQ(r.sampling.stop[0], "z");
    fmoe_serve_api_request_free(&r);
}

TEST(completion_prompt_forms) {
    size_t n;
    int32_t *want = encode("The quick brown fox", 1, &n);
    serve_api_request r;
    serve_api_error e;
    int ok = 1;
    const char *forms[] = {"{\"prompt\":\"The quick brown fox\"}",
                           "{\"prompt\":[\"The quick brown fox\"]}"};
    for (int i = 0; i < 2; i++) {
        if (parse(SERVE_API_COMPLETION, forms[i], &r, &e) < 0) ok = 0;
        else ok &= same_ids(r.prompt, (size_t)r.num_prompt, want, n);
        fmoe_serve_api_request_free(&r);
    }
    free(want);
    ASSERT_TRUE(ok);
    int32_t ids[] = {5, 17, 4095};
    ASSERT_OK(parse(SERVE_API_COMPLETION, "{\"prompt\":[5,17,4095]}", &r, &e));
    ok = same_ids(r.prompt, (size_t)r.num_prompt, ids, 3);
    fmoe_serve_api_request_free(&r);
    ASSERT_TRUE(ok);
    ASSERT_OK(parse(SERVE_API_COMPLETION, "{\"prompt\":[[5,17,4095]],\"echo\":false,"
                                          "\"logprobs\":null,\"best_of\":1}", &r, &e));
    ok = same_ids(r.prompt, (size_t)r.num_prompt, ids, 3);
    ASSERT_EQ(r.kind, SERVE_API_COMPLETION);
    fmoe_serve_api_request_free(&r);
    ASSERT_TRUE(ok);
}

/* ---------------------------------------------------------------------------------------
 * Parsing: errors name their field
 * ------------------------------------------------------------------------------------ */

static const struct {
    int32_t kind;
    const char *body;
    const char *param; /* "" : null */
    const char *code;  /* NULL: null */
} bad_cases[] = {
#define CHAT_MSG "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]"
    {SERVE_API_CHAT, "{" CHAT_MSG ",\"max_tokens\":\"5\"}", "max_tokens", NULL},
    {SERVE_API_CHAT, "{" CHAT_MSG ",\"max_tokens\":0}", "max_tokens", NULL},
    {SERVE_API_CHAT, "{" CHAT_MSG ",\"max_tokens\":-3}", "max_tokens", NULL},
    {SERVE_API_CHAT, "{" CHAT_MSG ",\"max_tokens\":2.5}", "max_tokens", NULL},
    {SERVE_API_CHAT, "{" CHAT_MSG ",\"max_completion_tokens\":0}", "max_completion_tokens", NULL},
    {SERVE_API_CHAT, "{" CHAT_MSG ",\"temperature\":\"hot\"}", "temperature", NULL},
    {SERVE_API_CHAT, "{" CHAT_MSG ",\"temperature\":2.5}", "temperature", NULL},
    {SERVE_API_CHAT, "{" CHAT_MSG ",\"temperature\":-0.1}", "temperature", NULL},
    {SERVE_API_CHAT, "{" CHAT_MSG ",\"top_p\":0}", "top_p", NULL},
    {SERVE_API_CHAT, "{" CHAT_MSG ",\"top_p\":1.01}", "top_p", NULL},
    {SERVE_API_CHAT, "{" CHAT_MSG ",\"top_p\":[1]}", "top_p", NULL},
    {SERVE_API_CHAT, "{" CHAT_MSG ",\"top_k\":-1}", "top_k", NULL},
    {SERVE_API_CHAT, "{" CHAT_MSG ",\"top_k\":1.5}", "top_k", NULL},
    {SERVE_API_CHAT, "{" CHAT_MSG ",\"seed\":\"x\"}", "seed", NULL},
    {SERVE_API_CHAT, "{" CHAT_MSG ",\"seed\":0.5}", "seed", NULL},
    {SERVE_API_CHAT, "{" CHAT_MSG ",\"stop\":5}", "stop", NULL},
    {SERVE_API_CHAT, "{" CHAT_MSG ",\"stop\":[\"a\",1]}", "stop", NULL},
    {SERVE_API_CHAT, "{" CHAT_MSG ",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", "stop", NULL},
    {SERVE_API_CHAT, "{" CHAT_MSG ",\"n\":9}", "n", NULL},
    {SERVE_API_CHAT, "{" CHAT_MSG ",\"n\":0}", "n", NULL},
    {SERVE_API_CHAT, "{" CHAT_MSG ",\"n\":\"1\"}", "n", NULL},
    {SERVE_API_CHAT, "{" CHAT_MSG ",\"stream\":\"yes\"}", "stream", NULL},
    {SERVE_API_CHAT, "{" CHAT_MSG ",\"stream\":1}", "stream", NULL},
    {SERVE_API_CHAT, "{" CHAT_MSG ",\"stream_options\":1}", "stream_options", NULL},
    {SERVE_API_CHAT, "{" CHAT_MSG ",\"stream_options\":{\"include_usage\":1}}",
     "stream_options.include_usage", NULL},
    {SERVE_API_CHAT, "{" CHAT_MSG ",\"ignore_eos\":\"no\"}", "ignore_eos", NULL},
    {SERVE_API_CHAT, "{" CHAT_MSG ",\"logprobs\":1}", "logprobs", NULL},
    {SERVE_API_CHAT, "{" CHAT_MSG ",\"logprobs\":true,\"top_logprobs\":21}", "top_logprobs", NULL},
    {SERVE_API_CHAT, "{" CHAT_MSG ",\"logprobs\":true,\"top_logprobs\":-1}", "top_logprobs", NULL},
    {SERVE_API_CHAT, "{" CHAT_MSG ",\"logprobs\":true,\"top_logprobs\":1.5}", "top_logprobs", NULL},
    {SERVE_API_CHAT, "{" CHAT_MSG ",\"top_logprobs\":2}", "top_logprobs", NULL},
    {SERVE_API_CHAT, "{" CHAT_MSG ",\"logprobs\":false,\"top_logprobs\":0}", "top_logprobs", NULL},
    {SERVE_API_CHAT, "{\"model\":\"m\"}", "messages", NULL},
    {SERVE_API_CHAT, "{\"messages\":null}", "messages", NULL},
    {SERVE_API_CHAT, "{\"messages\":\"hi\"}", "messages", NULL},
    {SERVE_API_CHAT, "{\"messages\":[]}", "messages", NULL},
    {SERVE_API_CHAT, "{\"messages\":[1]}", "messages[0]", NULL},
    {SERVE_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"content\":\"b\"}]}",
     "messages[1].role", NULL},
    {SERVE_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":5}]}", "messages[0].content",
     NULL},
    {SERVE_API_CHAT,
     "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{}}]}]}",
     "messages[0].content", NULL},
    {SERVE_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}",
     "messages[0].content", NULL},
    {SERVE_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[\"x\"]}]}",
     "messages[0].content", NULL},
    {SERVE_API_CHAT, "{" CHAT_MSG ",\"max_tokens\":1024}", "messages", "context_length_exceeded"},
    {SERVE_API_COMPLETION, "{\"prompt\":\"x\",\"max_tokens\":100000}", "prompt",
     "context_length_exceeded"},
    {SERVE_API_COMPLETION, "{}", "prompt", NULL},
    {SERVE_API_COMPLETION, "{\"prompt\":5}", "prompt", NULL},
    {SERVE_API_COMPLETION, "{\"prompt\":\"\"}", "prompt", NULL},
    {SERVE_API_COMPLETION, "{\"prompt\":[]}", "prompt", NULL},
    {SERVE_API_COMPLETION, "{\"prompt\":[\"a\",\"b\"]}", "prompt", NULL},
    {SERVE_API_COMPLETION, "{\"prompt\":[4096]}", "prompt", NULL},
    {SERVE_API_COMPLETION, "{\"prompt\":[-1]}", "prompt", NULL},
    {SERVE_API_COMPLETION, "{\"prompt\":[1,1.5]}", "prompt", NULL},
    {SERVE_API_COMPLETION, "{\"prompt\":[1,\"a\"]}", "prompt", NULL},
    {SERVE_API_COMPLETION, "{\"prompt\":[{}]}", "prompt", NULL},
    {SERVE_API_COMPLETION, "{\"prompt\":\"x\",\"echo\":true}", "echo", NULL},
    {SERVE_API_COMPLETION, "{\"prompt\":\"x\",\"logprobs\":6}", "logprobs", NULL},
    {SERVE_API_COMPLETION, "{\"prompt\":\"x\",\"logprobs\":-1}", "logprobs", NULL},
    {SERVE_API_COMPLETION, "{\"prompt\":\"x\",\"logprobs\":true}", "logprobs", NULL},
    {SERVE_API_COMPLETION, "{\"prompt\":\"x\",\"logprobs\":1e300}", "logprobs", NULL},
    {SERVE_API_COMPLETION, "{\"prompt\":\"x\",\"best_of\":2}", "best_of", NULL},
    {SERVE_API_COMPLETION, "{\"prompt\":\"x\",\"n\":1e9}", "n", NULL},
    {SERVE_API_COMPLETION, "{\"prompt\":\"x\",\"suffix\":\"y\"}", "suffix", NULL},
    {SERVE_API_COMPLETION, "", "", NULL},
    {SERVE_API_COMPLETION, "{\"prompt\":", "", NULL},
    {SERVE_API_COMPLETION, "{\"prompt\":\"x\",}", "", NULL},
    {SERVE_API_COMPLETION, "[]", "", NULL},
    {SERVE_API_COMPLETION, "\"prompt\"", "", NULL},
    {SERVE_API_COMPLETION, "{\"prompt\":\"x\"} trailing", "", NULL},
#undef CHAT_MSG
};

TEST(errors_are_400_with_param) {
    int failures = 0;
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
        serve_api_request r;
        serve_api_error e;
        int rc = parse(bad_cases[i].kind, bad_cases[i].body, &r, &e);
        const char *code = bad_cases[i].code;
        if (rc != FMOE_EINVAL || e.status != 400 || strcmp(e.param, bad_cases[i].param) != 0 ||
            strcmp(e.type, "invalid_request_error") != 0 || !e.message[0] ||
            (code ? !e.code || strcmp(e.code, code) != 0 : e.code != NULL) || r.prompt) {
            fprintf(stderr, "  case %zu %s: rc %d status %d param '%s' (want '%s') code %s: %s\n",
                    i, bad_cases[i].body, rc, e.status, e.param, bad_cases[i].param,
                    e.code ? e.code : "null", e.message);
            failures++;
        }
        fmoe_serve_api_request_free(&r);
    }
    ASSERT_EQ(failures, 0);
}

/* response_format: text asks for nothing, json_object and json_schema compile a schema the
 * request owns (fmoe_serve_api_request_free drops it: ASan's leak check sees a miss);
 * shapes and keywords it cannot do are 400s naming response_format. */
TEST(response_format_parsed_into_a_schema) {
    serve_api_request r;
    serve_api_error e;
    ASSERT_OK(parse(SERVE_API_CHAT,
                    "{\"messages\":[{\"role\":\"user\",\"content\":\"j\"}],"
                    "\"response_format\":{\"type\":\"text\"}}", &r, &e));
    ASSERT_TRUE(r.sampling.json == NULL);
    fmoe_serve_api_request_free(&r);
    ASSERT_OK(parse(SERVE_API_COMPLETION,
                    "{\"prompt\":\"p\",\"response_format\":{\"type\":\"json_object\"}}", &r,
                    &e));
    ASSERT_TRUE(r.sampling.json != NULL);
    fmoe_serve_api_request_free(&r);
    ASSERT_OK(parse(SERVE_API_CHAT,
                    "{\"messages\":[{\"role\":\"user\",\"content\":\"j\"}],"
                    "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":"
                    "\"p\",\"strict\":true,\"schema\":{\"type\":\"object\",\"properties\":"
                    "{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]}}}}", &r, &e));
    ASSERT_TRUE(r.sampling.json != NULL);
    /* the compiled schema takes {"a":7} and not {"b":7} */
    fmoe_json_matcher *m;
    ASSERT_OK(fmoe_json_matcher_init(r.sampling.json, NULL, &m));
    ASSERT_EQ(fmoe_json_matcher_feed(m, "{\"b\"", 4), FMOE_EINVAL);
    ASSERT_OK(fmoe_json_matcher_feed(m, "{\"a\":7}", 7));
    ASSERT_TRUE(fmoe_json_matcher_is_complete(m));
    fmoe_json_matcher_free(m);
    fmoe_serve_api_request_free(&r);
    static const char *const bad[] = {
        "{\"type\":\"yaml\"}", "{\"type\":\"json_schema\"}", "\"json_object\"",
        "{\"type\":\"json_schema\",\"json_schema\":{\"schema\":{}}}",
        "{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\",\"schema\":"
        "{\"type\":\"string\",\"format\":\"date\"}}}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char body[512];
        snprintf(body, sizeof body, "{\"prompt\":\"p\",\"response_format\":%s}", bad[i]);
        ASSERT_EQ(parse(SERVE_API_COMPLETION, body, &r, &e), FMOE_EINVAL);
        ASSERT_EQ(e.status, 400);
        ASSERT_STR_EQ(e.param, "response_format");
        ASSERT_TRUE(r.sampling.json == NULL);
    }
    ASSERT_CONTAINS(e.message, "'format' at $ is not supported");
}

TEST(invalid_json_message_names_a_byte) {
    serve_api_request r;
    serve_api_error e;
    ASSERT_EQ(parse(SERVE_API_CHAT, "{\"messages\": [}", &r, &e), FMOE_EINVAL);
    ASSERT_CONTAINS(e.message, "not valid JSON");
    ASSERT_CONTAINS(e.message, "byte 14");
}

TEST(template_error_is_400_with_its_message) {
    /* Mixtral's template insists on alternating user/assistant roles. */
    fmoe_tokenizer *mix = NULL;
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizers/mixtral-8x7b-instruct", harness_fixtures());
    ASSERT_OK(fmoe_tokenizer_load(path, &mix));
    const char *body = "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},"
                       "{\"role\":\"user\",\"content\":\"b\"}]}";
    serve_api_request r;
    serve_api_error e;
    int rc = fmoe_serve_api_parse(SERVE_API_CHAT, body, strlen(body), mix, 4096, &r, &e);
    fmoe_tokenizer_free(mix);
    ASSERT_EQ(rc, FMOE_EINVAL);
    ASSERT_EQ(e.status, 400);
    ASSERT_STR_EQ(e.param, "messages");
    ASSERT_TRUE(strlen(e.message) > 10);
}

TEST(prompt_filling_the_context_is_refused) {
    serve_api_request r;
    serve_api_error e;
    const char *body = "{\"prompt\":\"one two three four five six seven eight nine ten\"}";
    ASSERT_EQ(fmoe_serve_api_parse(SERVE_API_COMPLETION, body, strlen(body), tiny(), 3, &r, &e),
              FMOE_EINVAL);
    ASSERT_STR_EQ(e.code, "context_length_exceeded");
    ASSERT_CONTAINS(e.message, "maximum context length is 3");
}

TEST(body_need_not_be_nul_terminated) {
    const char text[] = "{\"prompt\":\"x\"}GARBAGE";
    serve_api_request r;
    serve_api_error e;
    ASSERT_OK(fmoe_serve_api_parse(SERVE_API_COMPLETION, text, 14, tiny(), MAX_CONTEXT, &r, &e));
    fmoe_serve_api_request_free(&r);
}

TEST(utf8_validation) {
    static const struct {
        const char *s;
        size_t n, bad;
    } cases[] = {
        {"plain ascii", 11, 11},
        {"caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80", 14, 14},
        {"\xC0\x80", 2, 0},               /* overlong NUL */
        {"a\xE0\x80\xAF", 4, 1},          /* overlong 3-byte */
        {"a\xED\xA0\x80", 4, 1},          /* surrogate U+D800 */
        {"\xF4\x90\x80\x80", 4, 0},       /* past U+10FFFF */
        {"ab\xE2\x82", 4, 2},             /* truncated */
        {"ok\xFF", 3, 2},
        {"\xC3\x28", 2, 0},               /* bad continuation */
        {"x\xF0\x9F\x98", 4, 1},
        {"\xEF\xBF\xBF", 3, 3},           /* U+FFFF is well-formed */
        {"\xF4\x8F\xBF\xBF", 4, 4},       /* U+10FFFF */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        ASSERT_EQ(fmoe_serve_api_utf8_invalid_at(cases[i].s, cases[i].n), cases[i].bad);
}

/* ---------------------------------------------------------------------------------------
 * Rendering
 * ------------------------------------------------------------------------------------ */

static const serve_job_status *sample_status(void) {
    static serve_job_status st;
    memset(&st, 0, sizeof st);
    st.finished = SERVE_FINISH_LENGTH;
    st.prompt_tokens = 10;
    st.completion_tokens = 4;
    st.queue_ms = 1.5;
    st.prompt_ms = 20;
    st.predicted_ms = 50;
    st.cache = (serve_job_cache){.hits = 7, .misses = 3, .late = 1, .prefetched = 2,
                                 .bytes_loaded = 123456789012, .stall_ms = 4.25};
    return &st;
}

static double num(const cJSON *o, const char *path) {
    /* path: "a.b.c" */
    char buf[128];
    snprintf(buf, sizeof buf, "%s", path);
    const cJSON *cur = o;
    for (char *tok = strtok(buf, "."); tok && cur; tok = strtok(NULL, "."))
        cur = cJSON_GetObjectItemCaseSensitive(cur, tok);
    return cJSON_IsNumber(cur) ? cur->valuedouble : NAN;
}

static const char *str(const cJSON *o, const char *name) {
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(o, name);
    return cJSON_IsString(s) ? s->valuestring : NULL;
}

static const cJSON *choice0(const cJSON *o) {
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(o, "choices");
    return cJSON_IsArray(c) && cJSON_GetArraySize(c) == 1 ? cJSON_GetArrayItem(c, 0) : NULL;
}

TEST(render_chat_response) {
    serve_api_meta m = {SERVE_API_CHAT, "chatcmpl-abc", 1700000000, "fmoe-tiny", 0, NULL, {0}};
    const char text[] = "say \"hi\"\nand go!XYZ";
    char *json = fmoe_serve_api_render_response(&m, text, strlen(text) - 3, sample_status());
    ASSERT_TRUE(json != NULL);
    cJSON *o = cJSON_Parse(json);
    free(json);
    ASSERT_TRUE(o != NULL);
    ASSERT_STR_EQ(str(o, "id"), "chatcmpl-abc");
    ASSERT_STR_EQ(str(o, "object"), "chat.completion");
    ASSERT_EQ(num(o, "created"), 1700000000);
    ASSERT_STR_EQ(str(o, "model"), "fmoe-tiny");
    const cJSON *c = choice0(o);
    ASSERT_TRUE(c != NULL);
    ASSERT_EQ(num(c, "index"), 0);
    const cJSON *msg = cJSON_GetObjectItemCaseSensitive(c, "message");
    ASSERT_STR_EQ(str(msg, "role"), "assistant");
    ASSERT_STR_EQ(str(msg, "content"), "say \"hi\"\nand go!");
    ASSERT_STR_EQ(str(c, "finish_reason"), "length");
    ASSERT_TRUE(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(c, "logprobs")));
    ASSERT_EQ(num(o, "usage.prompt_tokens"), 10);
    ASSERT_EQ(num(o, "usage.completion_tokens"), 4);
    ASSERT_EQ(num(o, "usage.total_tokens"), 14);
    ASSERT_EQ(num(o, "timings.prompt_n"), 10);
    ASSERT_NEAR(num(o, "timings.prompt_ms"), 20, 1e-9);
    ASSERT_NEAR(num(o, "timings.prompt_per_token_ms"), 2, 1e-9);
    ASSERT_NEAR(num(o, "timings.prompt_per_second"), 500, 1e-9);
    ASSERT_EQ(num(o, "timings.predicted_n"), 4);
    ASSERT_NEAR(num(o, "timings.predicted_per_token_ms"), 12.5, 1e-9);
    ASSERT_NEAR(num(o, "timings.predicted_per_second"), 80, 1e-9);
    ASSERT_EQ(num(o, "fmoe.hits"), 7);
    ASSERT_EQ(num(o, "fmoe.misses"), 3);
    ASSERT_EQ(num(o, "fmoe.late"), 1);
    ASSERT_EQ(num(o, "fmoe.prefetched"), 2);
    ASSERT_EQ(num(o, "fmoe.bytes_loaded"), 123456789012.0);
    ASSERT_NEAR(num(o, "fmoe.stall_ms"), 4.25, 1e-12);
    ASSERT_NEAR(num(o, "fmoe.queue_ms"), 1.5, 1e-12);
    cJSON_Delete(o);
}

TEST(render_completion_response_and_zero_times) {
    serve_api_meta m = {SERVE_API_COMPLETION, "cmpl-1", 5, "m", 0, NULL, {0}};
    serve_job_status st = {.finished = SERVE_FINISH_STOP, .prompt_tokens = 3};
    char *json = fmoe_serve_api_render_response(&m, "", 0, &st);
    cJSON *o = json ? cJSON_Parse(json) : NULL;
    free(json);
    ASSERT_TRUE(o != NULL);
    ASSERT_STR_EQ(str(o, "object"), "text_completion");
    const cJSON *c = choice0(o);
    ASSERT_STR_EQ(str(c, "text"), "");
    ASSERT_STR_EQ(str(c, "finish_reason"), "stop");
    ASSERT_TRUE(cJSON_GetObjectItemCaseSensitive(c, "message") == NULL);
    ASSERT_EQ(num(o, "timings.predicted_per_second"), 0); /* no division by zero */
    ASSERT_EQ(num(o, "usage.total_tokens"), 3);
    cJSON_Delete(o);
}

TEST(render_chat_chunks) {
    serve_api_meta m = {SERVE_API_CHAT, "chatcmpl-x", 42, "tiny", 0, NULL, {0}};
    char *j1 = fmoe_serve_api_render_chunk(&m, 1, NULL, 0, NULL, 0);
    char *j2 = fmoe_serve_api_render_chunk(&m, 0, "pieceZZ", 5, NULL, 1);
    char *j3 = fmoe_serve_api_render_chunk(&m, 0, "", 0, "stop", 0);
    cJSON *a = j1 ? cJSON_Parse(j1) : NULL, *b = j2 ? cJSON_Parse(j2) : NULL,
          *c = j3 ? cJSON_Parse(j3) : NULL;
    free(j1), free(j2), free(j3);
    ASSERT_TRUE(a && b && c);
    ASSERT_STR_EQ(str(a, "object"), "chat.completion.chunk");
    ASSERT_STR_EQ(str(b, "id"), "chatcmpl-x");
    ASSERT_EQ(num(c, "created"), 42);
    const cJSON *d1 = cJSON_GetObjectItemCaseSensitive(choice0(a), "delta");
    ASSERT_STR_EQ(str(d1, "role"), "assistant");
    ASSERT_STR_EQ(str(d1, "content"), "");
    ASSERT_TRUE(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(choice0(a), "finish_reason")));
    ASSERT_TRUE(cJSON_GetObjectItemCaseSensitive(a, "usage") == NULL);
    const cJSON *d2 = cJSON_GetObjectItemCaseSensitive(choice0(b), "delta");
    ASSERT_STR_EQ(str(d2, "content"), "piece");
    ASSERT_TRUE(str(d2, "role") == NULL);
    ASSERT_TRUE(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(b, "usage")));
    const cJSON *d3 = cJSON_GetObjectItemCaseSensitive(choice0(c), "delta");
    ASSERT_TRUE(cJSON_IsObject(d3) && d3->child == NULL);
    ASSERT_STR_EQ(str(choice0(c), "finish_reason"), "stop");
    cJSON_Delete(a), cJSON_Delete(b), cJSON_Delete(c);
}

/* A split output (tools, <think>): message.content / reasoning_content / tool_calls in
 * OpenAI's shapes, read back with cJSON. */
TEST(render_tool_calls_and_reasoning) {
    serve_api_meta m = {SERVE_API_CHAT, "chatcmpl-t", 1, "tiny", 0, NULL, {0}};
    m.tools.format = SERVE_TOOLS_HERMES;
    m.tools.reasoning = SERVE_REASONING_TAG;
    m.tools.parallel = 1;
    static const char out[] = "<think>why</think>\n<tool_call>\n{\"name\": \"get_weather\", "
                              "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    serve_tools_parse p;
    ASSERT_OK(fmoe_serve_tools_parse(&m.tools, out, sizeof out - 1, 1, &p));
    const serve_api_choice ch = {out, sizeof out - 1, SERVE_FINISH_STOP, NULL, 0, &p};
    char *json = fmoe_serve_api_render_response_n(&m, &ch, 1, sample_status());
    cJSON *o = json ? cJSON_Parse(json) : NULL;
    free(json);
    fmoe_serve_tools_parse_free(&p);
    ASSERT_TRUE(o != NULL);
    const cJSON *c = choice0(o), *msg = cJSON_GetObjectItemCaseSensitive(c, "message");
    ASSERT_STR_EQ(str(c, "finish_reason"), "tool_calls");
    ASSERT_TRUE(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(msg, "content")));
    ASSERT_STR_EQ(str(msg, "reasoning_content"), "why");
    const cJSON *calls = cJSON_GetObjectItemCaseSensitive(msg, "tool_calls");
    ASSERT_EQ(cJSON_GetArraySize(calls), 1);
    const cJSON *call = cJSON_GetArrayItem(calls, 0);
    char id[SERVE_TOOLS_ID_MAX];
    fmoe_serve_tools_call_id(SERVE_TOOLS_HERMES, "chatcmpl-t", 0, 0, id);
    ASSERT_STR_EQ(str(call, "id"), id);
    ASSERT_STR_EQ(str(call, "type"), "function");
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(call, "function");
    ASSERT_STR_EQ(str(f, "name"), "get_weather");
    ASSERT_STR_EQ(str(f, "arguments"), "{\"city\": \"Paris\"}"); /* a string of JSON */
    ASSERT_TRUE(cJSON_GetObjectItemCaseSensitive(call, "index") == NULL);
    cJSON_Delete(o);

    /* the same cut by max_tokens: finish_reason stays "length" */
    ASSERT_OK(fmoe_serve_tools_parse(&m.tools, out, sizeof out - 1, 1, &p));
    const serve_api_choice cut = {out, sizeof out - 1, SERVE_FINISH_LENGTH, NULL, 0, &p};
    json = fmoe_serve_api_render_response_n(&m, &cut, 1, sample_status());
    o = json ? cJSON_Parse(json) : NULL;
    free(json);
    fmoe_serve_tools_parse_free(&p);
    ASSERT_STR_EQ(str(choice0(o), "finish_reason"), "length");
    cJSON_Delete(o);
}

TEST(render_tool_call_chunks) {
    serve_api_meta m = {SERVE_API_CHAT, "chatcmpl-s", 1, "tiny", 0, NULL, {0}};
    m.tools.format = SERVE_TOOLS_HERMES;
    serve_tools_call_delta first = {0, "get_weather", "{\"ci", 4}, more = {0, NULL, "ty\"", 3};
    serve_tools_delta d1 = {"Sure.", 5, NULL, 0, &first, 1}, d2 = {NULL, 0, "hm", 2, &more, 1};
    char *j1 = fmoe_serve_api_render_chunk_tools(&m, 0, &d1, NULL, 0, NULL, 0, 0);
    char *j2 = fmoe_serve_api_render_chunk_tools(&m, 0, &d2, NULL, 1, NULL, 0, 0);
    cJSON *a = j1 ? cJSON_Parse(j1) : NULL, *b = j2 ? cJSON_Parse(j2) : NULL;
    free(j1), free(j2);
    ASSERT_TRUE(a && b);
    const cJSON *da = cJSON_GetObjectItemCaseSensitive(choice0(a), "delta");
    ASSERT_STR_EQ(str(da, "content"), "Sure.");
    ASSERT_TRUE(cJSON_GetObjectItemCaseSensitive(da, "reasoning_content") == NULL);
    const cJSON *ca = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(da, "tool_calls"), 0);
    ASSERT_EQ(num(ca, "index"), 0);
    ASSERT_TRUE(str(ca, "id") != NULL);
    ASSERT_STR_EQ(str(ca, "type"), "function");
    ASSERT_STR_EQ(str(cJSON_GetObjectItemCaseSensitive(ca, "function"), "name"), "get_weather");
    ASSERT_STR_EQ(str(cJSON_GetObjectItemCaseSensitive(ca, "function"), "arguments"), "{\"ci");
    const cJSON *db = cJSON_GetObjectItemCaseSensitive(choice0(b), "delta");
    ASSERT_TRUE(cJSON_GetObjectItemCaseSensitive(db, "content") == NULL);
    ASSERT_STR_EQ(str(db, "reasoning_content"), "hm");
    const cJSON *cb = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(db, "tool_calls"), 0);
    ASSERT_TRUE(str(cb, "id") == NULL && str(cb, "type") == NULL);
    ASSERT_TRUE(str(cJSON_GetObjectItemCaseSensitive(cb, "function"), "name") == NULL);
    ASSERT_STR_EQ(str(cJSON_GetObjectItemCaseSensitive(cb, "function"), "arguments"), "ty\"");
    ASSERT_TRUE(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(b, "usage")));
    cJSON_Delete(a), cJSON_Delete(b);
}

/* fmoe-tiny's template writes no tool calls: tools are refused naming the field, the
 * completions endpoint refuses them too, and a bad tool list is named before that. */
TEST(tools_refused_where_the_template_has_no_format) {
    serve_api_request r;
    serve_api_error e;
    const char *cases[][2] = {
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"tools\":[{\"type\":"
         "\"function\",\"function\":{\"name\":\"f\"}}]}", "tools"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"tools\":[{\"type\":"
         "\"function\",\"function\":{}}]}", "tools[0].function.name"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"tools\":[{\"type\":"
         "\"function\",\"function\":{\"name\":\"f\"}}],\"tool_choice\":{\"type\":\"function\","
         "\"function\":{\"name\":\"g\"}}}", "tool_choice"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"tools\":\"f\"}", "tools"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ASSERT_EQ(parse(SERVE_API_CHAT, cases[i][0], &r, &e), FMOE_EINVAL);
        ASSERT_EQ(e.status, 400);
        ASSERT_STR_EQ(e.param, cases[i][1]);
    }
    ASSERT_EQ(parse(SERVE_API_COMPLETION, "{\"prompt\":\"Hi\",\"tools\":[{\"type\":\"function\","
                                          "\"function\":{\"name\":\"f\"}}]}", &r, &e),
              FMOE_EINVAL);
    ASSERT_STR_EQ(e.param, "tools");
    /* asking for nothing is fine: tool_choice none, an empty list */
    ASSERT_OK(parse(SERVE_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],"
                                    "\"tools\":[],\"tool_choice\":\"none\"}", &r, &e));
    ASSERT_EQ(r.tools.format, SERVE_TOOLS_NONE);
    ASSERT_TRUE(r.tools_json == NULL);
    fmoe_serve_api_request_free(&r);
}

TEST(render_completion_chunk_and_usage_chunk) {
    serve_api_meta m = {SERVE_API_COMPLETION, "cmpl-y", 7, "tiny", 0, NULL, {0}};
    char *j1 = fmoe_serve_api_render_chunk(&m, 0, "abc", 3, NULL, 0);
    char *j2 = fmoe_serve_api_render_usage_chunk(&m, sample_status());
    cJSON *a = j1 ? cJSON_Parse(j1) : NULL, *b = j2 ? cJSON_Parse(j2) : NULL;
    free(j1), free(j2);
    ASSERT_TRUE(a && b);
    ASSERT_STR_EQ(str(a, "object"), "text_completion");
    ASSERT_STR_EQ(str(choice0(a), "text"), "abc");
    ASSERT_EQ(num(choice0(a), "index"), 0);
    const cJSON *ch = cJSON_GetObjectItemCaseSensitive(b, "choices");
    ASSERT_TRUE(cJSON_IsArray(ch) && cJSON_GetArraySize(ch) == 0);
    ASSERT_EQ(num(b, "usage.total_tokens"), 14);
    ASSERT_EQ(num(b, "fmoe.hits"), 7);
    ASSERT_STR_EQ(str(b, "id"), "cmpl-y");
    cJSON_Delete(a), cJSON_Delete(b);
}

TEST(render_error_models_and_ids) {
    char *j = fmoe_serve_api_render_error("invalid_request_error", "bad \"x\"", "", NULL);
    cJSON *o = j ? cJSON_Parse(j) : NULL;
    free(j);
    ASSERT_TRUE(o != NULL);
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(o, "error");
    ASSERT_STR_EQ(str(e, "message"), "bad \"x\"");
    ASSERT_STR_EQ(str(e, "type"), "invalid_request_error");
    ASSERT_TRUE(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(e, "param")));
    ASSERT_TRUE(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(e, "code")));
    cJSON_Delete(o);
    j = fmoe_serve_api_render_error("overloaded_error", "busy", "n", "queue_full");
    o = j ? cJSON_Parse(j) : NULL;
    free(j);
    e = cJSON_GetObjectItemCaseSensitive(o, "error");
    ASSERT_STR_EQ(str(e, "param"), "n");
    ASSERT_STR_EQ(str(e, "code"), "queue_full");
    cJSON_Delete(o);

    serve_engine_info info = {.model_name = "fmoe-tiny", .max_context = 1024, .parallel = 4,
                              .created = 1234};
    j = fmoe_serve_api_render_models(&info);
    o = j ? cJSON_Parse(j) : NULL;
    free(j);
    ASSERT_STR_EQ(str(o, "object"), "list");
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(o, "data");
    ASSERT_TRUE(cJSON_IsArray(d) && cJSON_GetArraySize(d) == 1);
    const cJSON *m0 = cJSON_GetArrayItem(d, 0);
    ASSERT_STR_EQ(str(m0, "id"), "fmoe-tiny");
    ASSERT_STR_EQ(str(m0, "object"), "model");
    ASSERT_STR_EQ(str(m0, "owned_by"), "fmoe");
    ASSERT_EQ(num(m0, "created"), 1234);
    ASSERT_EQ(num(m0, "max_context"), 1024);
    ASSERT_STR_EQ(str(m0, "backend"), "cpu"); /* unset: the default backend */
    cJSON_Delete(o);
    info.backend = "cuda";
    j = fmoe_serve_api_render_models(&info);
    o = j ? cJSON_Parse(j) : NULL;
    free(j);
    d = cJSON_GetObjectItemCaseSensitive(o, "data");
    ASSERT_STR_EQ(str(cJSON_GetArrayItem(d, 0), "backend"), "cuda");
    cJSON_Delete(o);

    const uint8_t rnd[12] = {0x00, 0x01, 0x7f, 0x80, 0xab, 0xff,
                             0x10, 0x20, 0x30, 0x40, 0x50, 0x6e};
    char id[SERVE_API_ID_MAX];
    fmoe_serve_api_make_id(SERVE_API_CHAT, rnd, id);
    ASSERT_STR_EQ(id, "chatcmpl-00017f80abff10203040506e");
    fmoe_serve_api_make_id(SERVE_API_COMPLETION, rnd, id);
    ASSERT_STR_EQ(id, "cmpl-00017f80abff10203040506e");
    ASSERT_STR_EQ(fmoe_serve_api_finish_reason(SERVE_FINISH_STOP), "stop");
    ASSERT_STR_EQ(fmoe_serve_api_finish_reason(SERVE_FINISH_LENGTH), "length");
    ASSERT_TRUE(fmoe_serve_api_finish_reason(SERVE_RUNNING) == NULL);
}

/* ---------------------------------------------------------------------------------------
 * Metrics
 * ------------------------------------------------------------------------------------ */

/* The value of the sample line that starts with `series ` (name plus labels). */
static double sample(const char *text, const char *series) {
    size_t n = strlen(series);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (strncmp(p, series, n) == 0 && p[n] == ' ') return strtod(p + n + 1, NULL);
    return NAN;
}

/* Every sample line's family has a # TYPE line above it, every TYPE a HELP, no family is
 * typed twice, and counters end in _total. @return the number of problems (printed). */
static int check_format(const char *text) {
    int problems = 0;
    char typed[64][96];
    int ntyped = 0;
    char prev_help[96] = "";
    for (const char *p = text; *p;) {
        const char *e = strchr(p, '\n');
        if (!e) {
            fprintf(stderr, "  no newline at the end\n");
            return problems + 1;
        }
        char line[512];
        snprintf(line, sizeof line, "%.*s", (int)(e - p), p);
        char name[96], type[32];
        if (sscanf(line, "# HELP %95s", name) == 1) {
            snprintf(prev_help, sizeof prev_help, "%s", name);
        } else if (sscanf(line, "# TYPE %95s %31s", name, type) == 2) {
            if (strcmp(name, prev_help) != 0) fprintf(stderr, "  %s: TYPE without HELP\n", name), problems++;
            for (int i = 0; i < ntyped; i++)
                if (!strcmp(typed[i], name)) fprintf(stderr, "  %s typed twice\n", name), problems++;
            if (!strcmp(type, "counter") && !strstr(name, "_total"))
                fprintf(stderr, "  counter %s without _total\n", name), problems++;
            if (ntyped < 64) snprintf(typed[ntyped++], 96, "%s", name);
        } else {
            size_t k = strcspn(line, "{ ");
            snprintf(name, sizeof name, "%.*s", (int)k, line);
            int found = 0;
            for (int i = 0; i < ntyped; i++) {
                size_t tl = strlen(typed[i]);
                if (!strncmp(name, typed[i], tl) &&
                    (name[tl] == '\0' || !strcmp(name + tl, "_bucket") ||
                     !strcmp(name + tl, "_sum") || !strcmp(name + tl, "_count")))
                    found = 1;
            }
            if (!found) fprintf(stderr, "  sample of an untyped family: %s\n", line), problems++;
        }
        p = e + 1;
    }
    return problems;
}

TEST(metrics_histograms_counters_and_format) {
    serve_metrics *m = fmoe_serve_metrics_new();
    ASSERT_TRUE(m != NULL);
    fmoe_serve_metrics_observe_ttft(m, 0.003);
    fmoe_serve_metrics_observe_ttft(m, 0.02);
    fmoe_serve_metrics_observe_ttft(m, 0.025); /* on a bound: counted in le="0.025" */
    fmoe_serve_metrics_observe_ttft(m, 100);
    fmoe_serve_metrics_observe_ttft(m, -1);    /* dropped */
    fmoe_serve_metrics_observe_itl(m, 0.0005);
    fmoe_serve_metrics_add_tokens(m, 12, 5);
    fmoe_serve_metrics_add_tokens(m, 3, 0);
    fmoe_serve_metrics_request_done(m, SERVE_FINISH_STOP);
    fmoe_serve_metrics_request_done(m, SERVE_FINISH_STOP);
    fmoe_serve_metrics_request_done(m, SERVE_FINISH_ERROR);
    fmoe_serve_metrics_http_status(m, 200);
    fmoe_serve_metrics_http_status(m, 200);
    fmoe_serve_metrics_http_status(m, 413);
    serve_engine_gauges g = {.running = 2, .waiting = 5, .ready = 1};
    serve_layer_counters layers[2] = {
        {.hits = 10, .misses = 2, .late = 1, .prefetch_issued = 4, .prefetch_useful = 3,
         .load_bytes = 1000, .resident = 6, .stall_s = 0.5},
        {.hits = 20, .resident = 8, .stall_s = 0.125},
    };
    char *text;
    size_t len;
    ASSERT_OK(fmoe_serve_metrics_render(m, &g, layers, 2, &text, &len));
    fmoe_serve_metrics_free(m);
    ASSERT_EQ(strlen(text), len);
    int problems = check_format(text);

    const char *h = "fmoe_time_to_first_token_seconds";
    char s[160];
#define V(fmt, ...) (snprintf(s, sizeof s, fmt, __VA_ARGS__), sample(text, s))
    double b005 = V("%s_bucket{le=\"0.005\"}", h), b01 = V("%s_bucket{le=\"0.01\"}", h),
           b025 = V("%s_bucket{le=\"0.025\"}", h), b60 = V("%s_bucket{le=\"60\"}", h),
           binf = V("%s_bucket{le=\"+Inf\"}", h), cnt = V("%s_count", h), sum = V("%s_sum", h);
    double itl001 = V("%s_bucket{le=\"0.001\"}", "fmoe_inter_token_latency_seconds");
    double e2e = V("%s_count", "fmoe_request_latency_seconds");
    double q = V("%s_bucket{le=\"+Inf\"}", "fmoe_request_queue_time_seconds");
    double ptok = sample(text, "fmoe_prompt_tokens_total"),
           gtok = sample(text, "fmoe_generation_tokens_total");
    double stop = sample(text, "fmoe_requests_total{finish_reason=\"stop\"}"),
           err = sample(text, "fmoe_requests_total{finish_reason=\"error\"}"),
           len_ = sample(text, "fmoe_requests_total{finish_reason=\"length\"}");
    double c200 = sample(text, "fmoe_http_requests_total{code=\"200\"}"),
           c413 = sample(text, "fmoe_http_requests_total{code=\"413\"}"),
           c404 = sample(text, "fmoe_http_requests_total{code=\"404\"}");
    double run = sample(text, "fmoe_requests_running"), wait = sample(text, "fmoe_requests_waiting");
    double h0 = sample(text, "fmoe_expert_cache_hits_total{layer=\"0\"}"),
           h1 = sample(text, "fmoe_expert_cache_hits_total{layer=\"1\"}"),
           r1 = sample(text, "fmoe_expert_cache_resident{layer=\"1\"}"),
           st0 = sample(text, "fmoe_expert_stall_seconds_total{layer=\"0\"}"),
           lb0 = sample(text, "fmoe_expert_load_bytes_total{layer=\"0\"}"),
           pu0 = sample(text, "fmoe_expert_prefetch_useful_total{layer=\"0\"}");
    int has_layer2 = strstr(text, "layer=\"2\"") != NULL;
#undef V
    free(text);
    ASSERT_EQ(problems, 0);
    ASSERT_EQ(b005, 1);
    ASSERT_EQ(b01, 1);
    ASSERT_EQ(b025, 3);
    ASSERT_EQ(b60, 3);
    ASSERT_EQ(binf, 4);
    ASSERT_EQ(cnt, 4);
    ASSERT_NEAR(sum, 100.048, 1e-9);
    ASSERT_EQ(itl001, 1);
    ASSERT_EQ(e2e, 0);
    ASSERT_EQ(q, 0);
    ASSERT_EQ(ptok, 15);
    ASSERT_EQ(gtok, 5);
    ASSERT_EQ(stop, 2);
    ASSERT_EQ(err, 1);
    ASSERT_EQ(len_, 0);
    ASSERT_EQ(c200, 2);
    ASSERT_EQ(c413, 1);
    ASSERT_TRUE(isnan(c404)); /* codes never seen are not listed */
    ASSERT_EQ(run, 2);
    ASSERT_EQ(wait, 5);
    ASSERT_EQ(h0, 10);
    ASSERT_EQ(h1, 20);
    ASSERT_EQ(r1, 8);
    ASSERT_NEAR(st0, 0.5, 0);
    ASSERT_EQ(lb0, 1000);
    ASSERT_EQ(pu0, 3);
    ASSERT_TRUE(!has_layer2);
}

TEST(metrics_buckets_are_cumulative) {
    serve_metrics *m = fmoe_serve_metrics_new();
    ASSERT_TRUE(m != NULL);
    for (int i = 0; i < 200; i++) fmoe_serve_metrics_observe_e2e(m, (double)i * 0.37 / 7.0);
    char *text;
    size_t len;
    ASSERT_OK(fmoe_serve_metrics_render(m, NULL, NULL, 0, &text, &len));
    fmoe_serve_metrics_free(m);
    double prev = -1, prev_le = -1;
    int n = 0, bad = 0;
    const char *pre = "fmoe_request_latency_seconds_bucket{le=\"";
    for (const char *p = strstr(text, pre); p; p = strstr(p + 1, pre)) {
        const char *q = p + strlen(pre);
        double le = strncmp(q, "+Inf", 4) == 0 ? INFINITY : strtod(q, NULL);
        double v = strtod(strchr(q, ' ') + 1, NULL);
        /* count of observations <= le, computed here */
        int want = 0;
        for (int i = 0; i < 200; i++) want += (double)i * 0.37 / 7.0 <= le;
        if (v != want || v < prev || le <= prev_le) bad++;
        prev = v, prev_le = le, n++;
    }
    free(text);
    ASSERT_EQ(bad, 0);
    ASSERT_EQ(n, 14);
    ASSERT_EQ(prev, 200);
}

TEST(metrics_label_escaping) {
    char out[64];
    size_t need = fmoe_serve_metrics_escape_label("a\"b\\c\nd", out, sizeof out);
    ASSERT_STR_EQ(out, "a\\\"b\\\\c\\nd");
    ASSERT_EQ(need, strlen("a\\\"b\\\\c\\nd"));
    /* Truncation keeps escapes whole. */
    need = fmoe_serve_metrics_escape_label("ab\"", out, 4);
    ASSERT_STR_EQ(out, "ab");
    ASSERT_EQ(need, 4);

    serve_metrics *m = fmoe_serve_metrics_new();
    ASSERT_TRUE(m != NULL);
    ASSERT_OK(fmoe_serve_metrics_set_model_name(m, "my \"model\"\\v2\n"));
    char *text;
    size_t len;
    ASSERT_OK(fmoe_serve_metrics_render(m, NULL, NULL, 0, &text, &len));
    fmoe_serve_metrics_free(m);
    double v = sample(text, "fmoe_model_info{model=\"my \\\"model\\\"\\\\v2\\n\"}");
    int problems = check_format(text);
    free(text);
    ASSERT_EQ(v, 1);
    ASSERT_EQ(problems, 0);
}

TEST(metrics_null_engine_parts) {
    char *text;
    size_t len;
    ASSERT_OK(fmoe_serve_metrics_render(NULL, NULL, NULL, 3, &text, &len));
    int problems = check_format(text);
    double run = sample(text, "fmoe_requests_running");
    int has_help = strstr(text, "# TYPE fmoe_expert_cache_hits_total counter\n") != NULL;
    free(text);
    ASSERT_EQ(problems, 0);
    ASSERT_EQ(run, 0);
    ASSERT_TRUE(has_help);
}

/* ---------------------------------------------------------------------------------------
 * logprobs
 * ------------------------------------------------------------------------------------ */

#define LP_CHAT "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]"

TEST(logprobs_parsed) {
    serve_api_request r;
    serve_api_error e;
    ASSERT_OK(parse(SERVE_API_COMPLETION, "{\"prompt\":\"x\",\"logprobs\":5}", &r, &e));
    ASSERT_EQ(r.sampling.logprobs, 1);
    ASSERT_EQ(r.sampling.top_logprobs, 5);
    fmoe_serve_api_request_free(&r);
    /* 0: each chosen token's own logprob, no alternatives */
    ASSERT_OK(parse(SERVE_API_COMPLETION, "{\"prompt\":\"x\",\"logprobs\":0}", &r, &e));
    ASSERT_EQ(r.sampling.logprobs, 1);
    ASSERT_EQ(r.sampling.top_logprobs, 0);
    fmoe_serve_api_request_free(&r);
    ASSERT_OK(parse(SERVE_API_COMPLETION, "{\"prompt\":\"x\",\"logprobs\":false}", &r, &e));
    ASSERT_EQ(r.sampling.logprobs, 0);
    fmoe_serve_api_request_free(&r);
    ASSERT_OK(parse(SERVE_API_CHAT, "{" LP_CHAT ",\"logprobs\":true,\"top_logprobs\":20}", &r,
                    &e));
    ASSERT_EQ(r.sampling.logprobs, 1);
    ASSERT_EQ(r.sampling.top_logprobs, 20);
    fmoe_serve_api_request_free(&r);
    ASSERT_OK(parse(SERVE_API_CHAT, "{" LP_CHAT ",\"logprobs\":true}", &r, &e));
    ASSERT_EQ(r.sampling.logprobs, 1);
    ASSERT_EQ(r.sampling.top_logprobs, 0);
    fmoe_serve_api_request_free(&r);
    ASSERT_OK(parse(SERVE_API_CHAT, "{" LP_CHAT ",\"logprobs\":false,\"top_logprobs\":null}",
                    &r, &e));
    ASSERT_EQ(r.sampling.logprobs, 0);
    fmoe_serve_api_request_free(&r);
}

TEST(n_parsed) {
    serve_api_request r;
    serve_api_error e;
    ASSERT_OK(parse(SERVE_API_COMPLETION, "{\"prompt\":\"x\",\"n\":8}", &r, &e));
    ASSERT_EQ(r.n, 8);
    fmoe_serve_api_request_free(&r);
    ASSERT_OK(parse(SERVE_API_COMPLETION, "{\"prompt\":\"x\"}", &r, &e));
    ASSERT_EQ(r.n, 1);
    fmoe_serve_api_request_free(&r);
}

TEST(render_response_of_n_choices) {
    serve_api_meta m = {SERVE_API_CHAT, "chatcmpl-n", 1, "tiny", 0, NULL, {0}};
    const serve_api_choice ch[2] = {{"ab", 2, SERVE_FINISH_STOP, NULL, 0, NULL},
                                    {"cde", 3, SERVE_FINISH_LENGTH, NULL, 0, NULL}};
    serve_job_status st = {.finished = SERVE_FINISH_LENGTH, .prompt_tokens = 4,
                           .completion_tokens = 9};
    char *json = fmoe_serve_api_render_response_n(&m, ch, 2, &st);
    cJSON *o = json ? cJSON_Parse(json) : NULL;
    free(json);
    ASSERT_TRUE(o != NULL);
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(o, "choices");
    ASSERT_TRUE(cJSON_IsArray(c) && cJSON_GetArraySize(c) == 2);
    const cJSON *c1 = cJSON_GetArrayItem(c, 1);
    ASSERT_EQ(num(c1, "index"), 1);
    ASSERT_STR_EQ(str(cJSON_GetObjectItemCaseSensitive(c1, "message"), "content"), "cde");
    ASSERT_STR_EQ(str(c1, "finish_reason"), "length");
    ASSERT_STR_EQ(str(cJSON_GetArrayItem(c, 0), "finish_reason"), "stop");
    ASSERT_EQ(num(o, "usage.total_tokens"), 13);
    cJSON_Delete(o);
    json = fmoe_serve_api_render_chunk_lp(&m, 3, 0, "x", 1, NULL, 0, NULL, 0, 0);
    o = json ? cJSON_Parse(json) : NULL;
    free(json);
    ASSERT_TRUE(o != NULL);
    ASSERT_EQ(num(choice0(o), "index"), 3);
    cJSON_Delete(o);
}

TEST(logprobs_of_a_row) {
    /* log_softmax by hand: logits {1, 3, 2, NaN, 3} -> the two 3s tie (lower id first) */
    const float logits[5] = {1, 3, 2, NAN, 3};
    const double lse = log(exp(1.0) + 2 * exp(3.0) + exp(2.0));
    serve_token_logprob t;
    fmoe_serve_logprobs_of(logits, 5, 2, 3, &t);
    ASSERT_EQ(t.id, 2);
    ASSERT_NEAR(t.logprob, 2 - lse, 1e-6);
    ASSERT_EQ(t.num_top, 3);
    ASSERT_EQ(t.top_id[0], 1);
    ASSERT_EQ(t.top_id[1], 4);
    ASSERT_EQ(t.top_id[2], 2);
    ASSERT_NEAR(t.top_logprob[0], 3 - lse, 1e-6);
    ASSERT_NEAR(t.top_logprob[2], 2 - lse, 1e-6);
    fmoe_serve_logprobs_of(logits, 5, 3, 99, &t); /* k clamped to V; NaN is -inf */
    ASSERT_EQ(t.num_top, 5);
    ASSERT_TRUE(isinf(t.logprob) && t.logprob < 0);
    ASSERT_EQ(t.top_id[4], 3);
    /* huge logits: no overflow */
    const float big[3] = {1e30f, 1e30f, -1e30f};
    fmoe_serve_logprobs_of(big, 3, 0, 0, &t);
    ASSERT_NEAR(t.logprob, -log(2.0), 1e-6);
    ASSERT_EQ(t.num_top, 0);
}

/* Two generated tokens "The" and " world" of the tiny tokenizer, made-up logprobs. */
static void two_tokens(serve_token_logprob lp[2], int32_t *a, int32_t *b) {
    size_t n;
    int32_t *ids = encode("The world", 0, &n);
    if (n != 2) abort();
    *a = ids[0], *b = ids[1];
    free(ids);
    memset(lp, 0, 2 * sizeof *lp);
    lp[0] = (serve_token_logprob){.id = *a, .logprob = -0.5f, .num_top = 2,
                                  .top_id = {*a, *b}, .top_logprob = {-0.5f, -1.5f},
                                  .text_end = 3};
    lp[1] = (serve_token_logprob){.id = *b, .logprob = -INFINITY, .num_top = 0, .text_end = 9};
}

TEST(render_chat_logprobs) {
    serve_api_meta m = {SERVE_API_CHAT, "chatcmpl-l", 1, "tiny", 1, tiny(), {0}};
    serve_token_logprob lp[2];
    int32_t a, b;
    two_tokens(lp, &a, &b);
    serve_job_status st = {.finished = SERVE_FINISH_STOP};
    char *json = fmoe_serve_api_render_response_lp(&m, "The world", 9, &st, lp, 2);
    cJSON *o = json ? cJSON_Parse(json) : NULL;
    free(json);
    ASSERT_TRUE(o != NULL);
    const cJSON *content =
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(choice0(o), "logprobs"),
                                         "content");
    ASSERT_TRUE(cJSON_IsArray(content) && cJSON_GetArraySize(content) == 2);
    const cJSON *t0 = cJSON_GetArrayItem(content, 0), *t1 = cJSON_GetArrayItem(content, 1);
    ASSERT_STR_EQ(str(t0, "token"), "The");
    ASSERT_NEAR(num(t0, "logprob"), -0.5, 1e-6);
    const cJSON *bytes = cJSON_GetObjectItemCaseSensitive(t0, "bytes");
    ASSERT_TRUE(cJSON_IsArray(bytes) && cJSON_GetArraySize(bytes) == 3);
    ASSERT_EQ(cJSON_GetArrayItem(bytes, 0)->valuedouble, 'T');
    const cJSON *top = cJSON_GetObjectItemCaseSensitive(t0, "top_logprobs");
    ASSERT_TRUE(cJSON_IsArray(top) && cJSON_GetArraySize(top) == 2);
    ASSERT_STR_EQ(str(cJSON_GetArrayItem(top, 1), "token"), " world");
    ASSERT_NEAR(num(cJSON_GetArrayItem(top, 1), "logprob"), -1.5, 1e-6);
    ASSERT_STR_EQ(str(t1, "token"), " world");
    ASSERT_EQ(num(t1, "logprob"), -9999); /* -inf: OpenAI's floor, JSON has no infinity */
    top = cJSON_GetObjectItemCaseSensitive(t1, "top_logprobs");
    ASSERT_TRUE(cJSON_IsArray(top) && cJSON_GetArraySize(top) == 0);
    cJSON_Delete(o);
    /* asked for none: null */
    m.logprobs = 0;
    json = fmoe_serve_api_render_response_lp(&m, "The world", 9, &st, lp, 2);
    o = json ? cJSON_Parse(json) : NULL;
    free(json);
    ASSERT_TRUE(o && cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(choice0(o), "logprobs")));
    cJSON_Delete(o);
}

TEST(render_completion_logprobs_chunk) {
    serve_api_meta m = {SERVE_API_COMPLETION, "cmpl-l", 1, "tiny", 1, tiny(), {0}};
    serve_token_logprob lp[2];
    int32_t a, b;
    two_tokens(lp, &a, &b);
    /* a chunk holding the second token only, which starts where the first ended */
    char *json = fmoe_serve_api_render_chunk_lp(&m, 0, 0, " world", 6, NULL, 0, lp + 1, 1, 3);
    cJSON *o = json ? cJSON_Parse(json) : NULL;
    free(json);
    ASSERT_TRUE(o != NULL);
    const cJSON *l = cJSON_GetObjectItemCaseSensitive(choice0(o), "logprobs");
    const cJSON *tokens = cJSON_GetObjectItemCaseSensitive(l, "tokens");
    ASSERT_TRUE(cJSON_IsArray(tokens) && cJSON_GetArraySize(tokens) == 1);
    ASSERT_STR_EQ(cJSON_GetArrayItem(tokens, 0)->valuestring, " world");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(l, "text_offset");
    ASSERT_EQ(cJSON_GetArrayItem(off, 0)->valuedouble, 3);
    cJSON_Delete(o);
    /* the whole response: top_logprobs as {piece: logprob}, offsets from 0 */
    serve_job_status st = {.finished = SERVE_FINISH_LENGTH};
    json = fmoe_serve_api_render_response_lp(&m, "The world", 9, &st, lp, 2);
    o = json ? cJSON_Parse(json) : NULL;
    free(json);
    ASSERT_TRUE(o != NULL);
    l = cJSON_GetObjectItemCaseSensitive(choice0(o), "logprobs");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(l, "text_offset");
    ASSERT_EQ(cJSON_GetArrayItem(offs, 0)->valuedouble, 0);
    ASSERT_EQ(cJSON_GetArrayItem(offs, 1)->valuedouble, 3);
    const cJSON *tl = cJSON_GetObjectItemCaseSensitive(l, "token_logprobs");
    ASSERT_NEAR(cJSON_GetArrayItem(tl, 0)->valuedouble, -0.5, 1e-6);
    const cJSON *tops = cJSON_GetObjectItemCaseSensitive(l, "top_logprobs");
    ASSERT_NEAR(num(cJSON_GetArrayItem(tops, 0), "The"), -0.5, 1e-6);
    ASSERT_NEAR(num(cJSON_GetArrayItem(tops, 0), " world"), -1.5, 1e-6);
    ASSERT_TRUE(cJSON_GetArrayItem(tops, 1)->child == NULL);
    cJSON_Delete(o);
    /* the final chunk with nothing left: null */
    json = fmoe_serve_api_render_chunk_lp(&m, 0, 0, "", 0, "stop", 0, NULL, 0, 9);
    o = json ? cJSON_Parse(json) : NULL;
    free(json);
    ASSERT_TRUE(o && cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(choice0(o), "logprobs")));
    cJSON_Delete(o);
}

int main(int argc, char **argv) { return RUN_TESTS(argc, argv); }
