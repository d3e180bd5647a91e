/* test_prompts.c - prompt dataset readers and the Azure arrival CSV reader. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fmoe/datasets.h"
#include "fmoe/error.h"
#include "harness.h"

static char tmpdir[256];

static const char *fixture(const char *name) {
    static char buf[4][1024];
    static int i;
    char *b = buf[i++ & 3];
    snprintf(b, sizeof buf[0], "%s/datasets/%s", harness_fixtures(), name);
    return b;
}

/* Writes `text` to <tmpdir>/<name>; returns the path (static, rotating). */
static const char *write_tmp(const char *name, const char *text, size_t len) {
    static char buf[4][512];
    static int i;
    if (!tmpdir[0]) {
        snprintf(tmpdir, sizeof tmpdir, "/tmp/fmoe-test-prompts-XXXXXX");
        if (!mkdtemp(tmpdir)) abort();
    }
    char *b = buf[i++ & 3];
    snprintf(b, sizeof buf[0], "%s/%s", tmpdir, name);
    FILE *f = fopen(b, "wb");
    if (!f) abort();
    fwrite(text, 1, len, f);
    fclose(f);
    return b;
}
#define WRITE_TMP(name, lit) write_tmp((name), (lit), sizeof(lit) - 1)

/* ------------------------------------------------------------ prompts */

TEST(sharegpt_first_human_turn) {
    fmoe_prompt_set *s = NULL;
    ASSERT_OK(fmoe_prompts_load(fixture("sharegpt.json"), FMOE_PROMPTS_SHAREGPT, &s));
    ASSERT_EQ(s->format, FMOE_PROMPTS_SHAREGPT);
    ASSERT_EQ(s->count, 3);
    ASSERT_EQ(s->skipped, 1); /* sg-3: the assistant only */
    ASSERT_STR_EQ(s->ids[0], "sg-1");
    ASSERT_STR_EQ(s->prompts[0], "How do I boil an egg?");
    ASSERT_STR_EQ(s->ids[1], "sg-2"); /* the first turn is "gpt": the human one is taken */
    ASSERT_STR_EQ(s->prompts[1], "Write a haiku about caches.\nMake it rhyme.");
    ASSERT_STR_EQ(s->ids[2], "4"); /* numeric id, printed; "user" accepted as well */
    ASSERT_STR_EQ(s->prompts[2], "Caf\xc3\xa9 au lait, s'il vous pla\xc3\xaet \xe2\x98\x95");
    fmoe_prompt_set_free(s);
}

TEST(auto_detects_every_format) {
    static const struct {
        const char *file;
        fmoe_prompt_format format;
        int64_t count;
    } cases[] = {
        {"sharegpt.json", FMOE_PROMPTS_SHAREGPT, 3},
        {"lmsys.json", FMOE_PROMPTS_LMSYS, 2},
        {"lmsys.jsonl", FMOE_PROMPTS_LMSYS, 2},
        {"prompts.jsonl", FMOE_PROMPTS_JSONL, 3},
        {"prompts.txt", FMOE_PROMPTS_TEXT, 3},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        fmoe_prompt_set *s = NULL;
        ASSERT_OK(fmoe_prompts_load(fixture(cases[i].file), FMOE_PROMPTS_AUTO, &s));
        ASSERT_EQ(s->format, cases[i].format);
        ASSERT_EQ(s->count, cases[i].count);
        fmoe_prompt_set_free(s);
    }
}

TEST(lmsys_list_and_lines) {
    fmoe_prompt_set *s = NULL;
    ASSERT_OK(fmoe_prompts_load(fixture("lmsys.json"), FMOE_PROMPTS_LMSYS, &s));
    ASSERT_EQ(s->count, 2);
    ASSERT_STR_EQ(s->ids[0], "c-01");
    ASSERT_STR_EQ(s->prompts[0], "What is a mixture of experts?");
    ASSERT_STR_EQ(s->ids[1], ""); /* no conversation_id */
    ASSERT_STR_EQ(s->prompts[1], "Name three sorting algorithms."); /* after the system turn */
    fmoe_prompt_set_free(s);

    ASSERT_OK(fmoe_prompts_load(fixture("lmsys.jsonl"), FMOE_PROMPTS_LMSYS, &s));
    ASSERT_EQ(s->count, 2);
    ASSERT_EQ(s->skipped, 1);
    ASSERT_STR_EQ(s->ids[0], "a1");
    ASSERT_STR_EQ(s->prompts[0], "Translate 'cache' to German.");
    ASSERT_STR_EQ(s->ids[1], "a3");
    ASSERT_STR_EQ(s->prompts[1], "Why is the sky blue?");
    fmoe_prompt_set_free(s);
}

TEST(jsonl_and_text) {
    fmoe_prompt_set *s = NULL;
    ASSERT_OK(fmoe_prompts_load(fixture("prompts.jsonl"), FMOE_PROMPTS_JSONL, &s));
    ASSERT_EQ(s->count, 3);
    ASSERT_STR_EQ(s->ids[0], "p1");
    ASSERT_STR_EQ(s->prompts[0], "Summarise the plot of Hamlet in one sentence.");
    ASSERT_STR_EQ(s->ids[1], "");
    ASSERT_STR_EQ(s->ids[2], "3");
    ASSERT_STR_EQ(s->prompts[2], "Explain \"top-k\" routing.\nUse two sentences.");
    fmoe_prompt_set_free(s);

    ASSERT_OK(fmoe_prompts_load(fixture("prompts.txt"), FMOE_PROMPTS_TEXT, &s));
    ASSERT_EQ(s->count, 3);
    ASSERT_STR_EQ(s->prompts[0], "What is the capital of France?");
    ASSERT_STR_EQ(s->prompts[1], "Give me a recipe for pancakes."); /* "\r\n" stripped */
    ASSERT_STR_EQ(s->prompts[2], "Why do cats purr?");               /* no final newline */
    ASSERT_STR_EQ(s->ids[2], "");
    fmoe_prompt_set_free(s);
}

TEST(prompt_format_names) {
    fmoe_prompt_format f;
    ASSERT_OK(fmoe_prompt_format_parse("lmsys", &f));
    ASSERT_EQ(f, FMOE_PROMPTS_LMSYS);
    ASSERT_STR_EQ(fmoe_prompt_format_name(FMOE_PROMPTS_SHAREGPT), "sharegpt");
    ASSERT_EQ(fmoe_prompt_format_parse("csv", &f), FMOE_EINVAL);
    ASSERT_CONTAINS(fmoe_error_detail(), "csv");
}

TEST(empty_inputs) {
    fmoe_prompt_set *s = NULL;
    ASSERT_OK(fmoe_prompts_load(WRITE_TMP("empty.txt", ""), FMOE_PROMPTS_AUTO, &s));
    ASSERT_EQ(s->count, 0);
    ASSERT_EQ(s->format, FMOE_PROMPTS_TEXT);
    fmoe_prompt_set_free(s);
    ASSERT_OK(fmoe_prompts_load(WRITE_TMP("empty.json", " [ ]\n"), FMOE_PROMPTS_AUTO, &s));
    ASSERT_EQ(s->count, 0);
    fmoe_prompt_set_free(s);
}

/* A malformed input: the code, and where the detail says it is. */
typedef struct bad_case {
    const char *name;
    const char *text;
    fmoe_prompt_format format;
    int code;
    const char *where; /* substring of the detail, after the file name */
} bad_case;

TEST(malformed_prompt_records) {
    static const bad_case cases[] = {
        {"sg_not_list.json", "[{\"id\": \"a\", \"conversations\": {\"from\": \"human\"}}]",
         FMOE_PROMPTS_SHAREGPT, FMOE_EFORMAT, ": record 0: \"conversations\" is not a list"},
        {"sg_turn.json",
         "[{\"id\": \"a\", \"conversations\": [{\"from\": \"human\", \"value\": \"x\"}]},\n"
         " {\"id\": \"b\", \"conversations\": [{\"from\": \"human\"}]}]",
         FMOE_PROMPTS_SHAREGPT, FMOE_EFORMAT, ": record 1: conversations[0] has no string"},
        {"sg_broken.json", "[\n{\"id\": \"a\",\n \"conversations\": [}\n]", FMOE_PROMPTS_AUTO,
         FMOE_EFORMAT, ":3: malformed JSON"},
        {"sg_not_object.json", "[{\"conversations\": []}, 5]", FMOE_PROMPTS_SHAREGPT,
         FMOE_EFORMAT, ": record 1: record is not a JSON object"},
        {"lm_bad.jsonl",
         "{\"conversation\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n\n"
         "{\"conversation\": [{\"role\": \"user\", \"content\": \"hi\"}\n",
         FMOE_PROMPTS_LMSYS, FMOE_EFORMAT, ":3: malformed JSON"},
        {"lm_no_conv.jsonl", "{\"conversation\": []}\n{\"turns\": []}\n", FMOE_PROMPTS_LMSYS,
         FMOE_EFORMAT, ":2: no \"conversation\" list"},
        {"jl_no_prompt.jsonl", "{\"prompt\": \"a\"}\n{\"text\": \"b\"}\n", FMOE_PROMPTS_JSONL,
         FMOE_EFORMAT, ":2: no \"prompt\""},
        {"jl_type.jsonl", "{\"prompt\": 5}\n", FMOE_PROMPTS_JSONL, FMOE_EFORMAT,
         ":1: \"prompt\" is not a string"},
        {"jl_unknown.jsonl", "{\"question\": \"a\"}\n", FMOE_PROMPTS_AUTO, FMOE_EFORMAT,
         ":1: unknown record layout"},
        {"one_object.json", "{\n  \"data\": [\n    {\"prompt\": \"a\"}\n  ]\n}\n",
         FMOE_PROMPTS_AUTO, FMOE_EFORMAT, ": one JSON object; expected a JSON list"},
        {"utf8.txt", "fine\nbad \xff byte\n", FMOE_PROMPTS_TEXT, FMOE_EFORMAT,
         ":2: prompt is not valid UTF-8"},
        {"nul.txt", "ok\nnul\0byte\n", FMOE_PROMPTS_TEXT, FMOE_EFORMAT,
         ":2: prompt is not valid UTF-8"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const bad_case *c = &cases[i];
        size_t len = strlen(c->text);
        if (strcmp(c->name, "nul.txt") == 0) len = sizeof "ok\nnul\0byte\n" - 1;
        const char *path = write_tmp(c->name, c->text, len);
        fmoe_prompt_set *s = (fmoe_prompt_set *)1;
        fmoe_error_clear();
        int rc = fmoe_prompts_load(path, c->format, &s);
        if (rc != c->code) fprintf(stderr, "  case %s: %s\n", c->name, fmoe_error_detail());
        ASSERT_EQ(rc, c->code);
        ASSERT_TRUE(s == NULL);
        ASSERT_CONTAINS(fmoe_error_detail(), c->name);
        ASSERT_CONTAINS(fmoe_error_detail(), c->where);
    }
}

TEST(missing_file) {
    fmoe_prompt_set *s = NULL;
    ASSERT_EQ(fmoe_prompts_load("/nonexistent/prompts.json", FMOE_PROMPTS_AUTO, &s), FMOE_EIO);
    ASSERT_CONTAINS(fmoe_error_detail(), "/nonexistent/prompts.json");
}

/* ------------------------------------------------------------ arrivals */

TEST(azure_arrivals_values) {
    fmoe_arrivals *a = NULL;
    ASSERT_OK(fmoe_arrivals_load_azure(fixture("azure_small.csv"), &a));
    ASSERT_EQ(a->count, 5);
    ASSERT_NEAR(a->arrival_s[0], 0.0, 0);
    ASSERT_NEAR(a->arrival_s[1], 4.314579, 1e-9); /* 18:15:50.9951690 - 18:15:46.6805900 */
    ASSERT_NEAR(a->arrival_s[2], 4.314579, 1e-9);
    ASSERT_NEAR(a->arrival_s[3], 13.31941, 1e-9);
    /* across midnight: 2023-11-17 00:00:01.5 - 2023-11-16 18:15:46.68059 */
    ASSERT_NEAR(a->arrival_s[4], 5 * 3600 + 44 * 60 + 14.81941, 1e-9);
    ASSERT_EQ(a->context_tokens[0], 374);
    ASSERT_EQ(a->generated_tokens[0], 44);
    ASSERT_EQ(a->context_tokens[3], 1024);
    ASSERT_EQ(a->generated_tokens[4], 512);
    ASSERT_EQ(a->context_tokens[4], 0);
    fmoe_arrivals_free(a);
}

TEST(azure_arrivals_errors) {
    static const bad_case cases[] = {
        {"hdr.csv", "TIME,Context,Generated\n", 0, FMOE_EFORMAT, ":1: header is"},
        {"empty.csv", "", 0, FMOE_EFORMAT, ":1: header is"},
        {"fields.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9,1\n", 0,
         FMOE_EFORMAT, ":2: expected 3 comma-separated fields"},
        {"ts.csv",
         "TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:17:03.9,1,2\r\n"
         "2023-13-16 18:17:03.9,1,2\r\n",
         0, FMOE_EFORMAT, ":3: bad timestamp '2023-13-16 18:17:03.9'"},
        {"feb.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-02-29 00:00:00,1,2\n", 0,
         FMOE_EFORMAT, ":2: bad timestamp"},
        {"neg.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03,-4,2\n", 0,
         FMOE_EFORMAT, ":2: ContextTokens and GeneratedTokens"},
        {"big.csv",
         "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03,1,99999999999\n", 0,
         FMOE_EFORMAT, ":2: ContextTokens and GeneratedTokens"},
        {"order.csv",
         "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.5,1,2\n\n"
         "2023-11-16 18:17:03.4,1,2\n",
         0, FMOE_EFORMAT, ":4: timestamp goes back in time"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const bad_case *c = &cases[i];
        const char *path = write_tmp(c->name, c->text, strlen(c->text));
        fmoe_arrivals *a = (fmoe_arrivals *)1;
        int rc = fmoe_arrivals_load_azure(path, &a);
        if (rc != c->code) fprintf(stderr, "  case %s: %s\n", c->name, fmoe_error_detail());
        ASSERT_EQ(rc, c->code);
        ASSERT_TRUE(a == NULL);
        ASSERT_CONTAINS(fmoe_error_detail(), c->name);
        ASSERT_CONTAINS(fmoe_error_detail(), c->where);
    }
}

TEST(azure_arrivals_leap_year_and_precision) {
    const char *path = WRITE_TMP("leap.csv",
                                 "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                 "2024-02-28 23:59:59.9999999,1,1\n"
                                 "2024-02-29 00:00:00.0000001,2,2\n"
                                 "2024-03-01 00:00:00,3,3\n");
    fmoe_arrivals *a = NULL;
    ASSERT_OK(fmoe_arrivals_load_azure(path, &a));
    ASSERT_EQ(a->count, 3);
    ASSERT_NEAR(a->arrival_s[1], 2e-7, 1e-12);
    ASSERT_NEAR(a->arrival_s[2], 86400.0000001, 1e-9);
    fmoe_arrivals_free(a);
}

/* ------------------------------------------------------------ the real files, when present */

/* The real datasets are not shipped (large, other licences): the folder FMOE_REAL_DATA
 * names holds them (docs/TESTING.md). Without it the test is skipped; with it, every file
 * must be there. */
static const char *real_file(int *harness_failed, const char *dir, const char *rel) {
    static char buf[4][1024];
    static int i;
    char *b = buf[i++ & 3];
    snprintf(b, sizeof buf[0], "%s/%s", dir, rel);
    if (access(b, R_OK) != 0) HARNESS_FAIL("FMOE_REAL_DATA: cannot read %s", b);
    return b;
}

TEST(real_sharegpt_and_azure_files) {
    const char *dir = getenv("FMOE_REAL_DATA");
    if (!dir || !dir[0]) {
        fprintf(stderr, "  (FMOE_REAL_DATA not set: skipped)\n");
        return;
    }
    const char *sg =
        real_file(harness_failed, dir, "sharegpt-ml-energy/ShareGPT_V3_filtered_500.json");
    const char *sg90 = real_file(
        harness_failed, dir,
        "sharegpt-ml-energy/sg_90k_part1_html_cleaned_lang_first_sampled_sorted.json");
    const char *code =
        real_file(harness_failed, dir, "azure-llm-inference-2023/AzureLLMInferenceTrace_code.csv");
    const char *conv =
        real_file(harness_failed, dir, "azure-llm-inference-2023/AzureLLMInferenceTrace_conv.csv");
    fmoe_prompt_set *s = NULL;
    ASSERT_OK(fmoe_prompts_load(sg, FMOE_PROMPTS_AUTO, &s));
    fmoe_prompt_format f = s->format;
    int64_t n = s->count;
    fmoe_prompt_set_free(s);
    ASSERT_EQ(f, FMOE_PROMPTS_SHAREGPT);
    ASSERT_EQ(n, 500);
    ASSERT_OK(fmoe_prompts_load(sg90, FMOE_PROMPTS_SHAREGPT, &s));
    /* 2,978 records: 20 have no human turn (system or gpt only), 1 an empty one */
    n = s->count;
    int64_t skipped = s->skipped;
    fmoe_prompt_set_free(s);
    ASSERT_EQ(n, 2957);
    ASSERT_EQ(skipped, 21);

    fmoe_arrivals *a = NULL;
    ASSERT_OK(fmoe_arrivals_load_azure(code, &a));
    int64_t count = a->count;
    int32_t ctx0 = a->context_tokens[0], gen0 = a->generated_tokens[0];
    double t1 = a->arrival_s[1], tlast = a->arrival_s[a->count - 1];
    fmoe_arrivals_free(a);
    ASSERT_EQ(count, 8819);
    ASSERT_EQ(ctx0, 4808); /* 2023-11-16 18:17:03.9799600,4808,10 */
    ASSERT_EQ(gen0, 10);
    ASSERT_NEAR(t1, 0.052, 1e-9); /* 18:17:04.0319600 */
    ASSERT_NEAR(tlast, 3435.948056, 1e-9);  /* 19:14:19.9280160 */
    ASSERT_OK(fmoe_arrivals_load_azure(conv, &a));
    count = a->count;
    fmoe_arrivals_free(a);
    ASSERT_EQ(count, 19366);
}

static void cleanup(void) {
    if (!tmpdir[0]) return;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
}

int main(int argc, char **argv) {
    int rc = RUN_TESTS(argc, argv);
    cleanup();
    return rc;
}
