/*
 * test_json_constraint - the JSON schema automaton (runtime/constrain) on accept and
 * reject strings written by hand, its refusals of unsupported keywords, and the trie mask
 * on the bundled fmoe-tiny tokenizer checked against feeding every token's bytes one by
 * one (the mask's trie walks, and its shortcut for string bodies, must agree with a plain
 * per-token feed).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "fmoe/json_constraint.h"
#include "fmoe/sampler.h"
#include "fmoe/tokenizer.h"
#include "harness.h"

/* 1 when text is a whole document of the schema, 0 when some byte is refused or it is
 * only a prefix, -1 when the schema does not compile. */
static int doc(const char *schema, const char *text) {
    fmoe_json_schema *s;
    if ((schema ? fmoe_json_schema_compile(schema, strlen(schema), &s)
                : fmoe_json_schema_any_object(&s)) < 0)
        return -1;
    fmoe_json_matcher *m;
    if (fmoe_json_matcher_init(s, NULL, &m) < 0) return -1;
    int ok = fmoe_json_matcher_feed(m, text, strlen(text)) == 0 &&
             fmoe_json_matcher_is_complete(m);
    fmoe_json_matcher_free(m);
    fmoe_json_schema_free(s);
    return ok;
}

/* 1 when text is a prefix some document of the schema continues. */
static int prefix(const char *schema, const char *text) {
    fmoe_json_schema *s;
    if (fmoe_json_schema_compile(schema, strlen(schema), &s) < 0) return -1;
    fmoe_json_matcher *m;
    if (fmoe_json_matcher_init(s, NULL, &m) < 0) return -1;
    int ok = fmoe_json_matcher_feed(m, text, strlen(text)) == 0;
    fmoe_json_matcher_free(m);
    fmoe_json_schema_free(s);
    return ok;
}

static const char *PERSON =
    "{\"type\":\"object\",\"properties\":{"
    "\"name\":{\"type\":\"string\"},"
    "\"age\":{\"type\":\"integer\"},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\",1,null]},\"minItems\":1,"
    "\"maxItems\":2},"
    "\"home\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"number\"}},"
    "\"required\":[\"x\"],\"additionalProperties\":false},"
    "\"ok\":{\"type\":[\"boolean\",\"null\"]}},"
    "\"required\":[\"name\",\"tags\",\"home\",\"ok\"],\"additionalProperties\":false}";

TEST(object_with_properties_accepts_and_rejects) {
    ASSERT_EQ(doc(PERSON, "{\"name\":\"x\",\"age\":3,\"tags\":[\"a\"],\"home\":{\"x\":-1.5e3},"
                          "\"ok\":true}"), 1);
    /* optional "age" left out; whitespace between tokens */
    ASSERT_EQ(doc(PERSON, "{ \"name\" : \"\\\"q\\\\\\n\\u00e9\" ,\n\"tags\":[1, null],"
                          "\"home\":{\"x\":0},\"ok\":null}"), 1);
    ASSERT_EQ(doc(PERSON, "{\"name\":\"x\",\"tags\":[\"b\"],\"home\":{\"x\":2},\"ok\":false}"), 1);
    /* a required property missing, order changed, an unknown key, bad enum, too many items */
    ASSERT_EQ(doc(PERSON, "{\"name\":\"x\",\"tags\":[\"a\"],\"ok\":true}"), 0);
    ASSERT_EQ(doc(PERSON, "{\"tags\":[\"a\"],\"name\":\"x\",\"home\":{\"x\":1},\"ok\":true}"), 0);
    ASSERT_EQ(prefix(PERSON, "{\"nam\""), 0);
    ASSERT_EQ(prefix(PERSON, "{\"name\":\"x\",\"zzz"), 0);
    ASSERT_EQ(prefix(PERSON, "{\"name\":\"x\",\"tags\":[\"c"), 0);
    ASSERT_EQ(prefix(PERSON, "{\"name\":\"x\",\"tags\":[\"a\",\"b\","), 0);
    ASSERT_EQ(prefix(PERSON, "{\"name\":\"x\",\"tags\":[]"), 0); /* minItems 1 */
    ASSERT_EQ(prefix(PERSON, "{\"name\":\"x\",\"age\":3.5"), 0);  /* integer */
    ASSERT_EQ(prefix(PERSON, "{\"name\":\"x\",\"age\":03"), 0);
    ASSERT_EQ(prefix(PERSON, "{\"name\":12"), 0);
    ASSERT_EQ(prefix(PERSON, "{\"name\":\"a\tb\""), 0);          /* raw control character */
    ASSERT_EQ(prefix(PERSON, "{\"name\":\"\\x\""), 0);           /* bad escape */
    ASSERT_EQ(prefix(PERSON, "{\"name\":\"\\u12g"), 0);
    ASSERT_EQ(prefix(PERSON, " {"), 0);                           /* nothing before */
    ASSERT_EQ(prefix(PERSON, "{     \""), 0);                     /* 5 spaces > the limit */
    ASSERT_EQ(prefix(PERSON, "{    \""), 1);
    ASSERT_EQ(prefix(PERSON, "{\"name\":\"\xc3\xa9\xe2\x82\xac\""), 1); /* é € */
    ASSERT_EQ(prefix(PERSON, "{\"name\":\"\xc3("), 0);           /* broken UTF-8 */
    ASSERT_EQ(prefix(PERSON, "{\"name\":\"\xed\xa0\x80"), 0);    /* a surrogate */
    ASSERT_EQ(prefix(PERSON, "{\"name\":\"\xc0\xaf"), 0);        /* overlong */
}

TEST(nothing_after_the_document) {
    ASSERT_EQ(doc("{\"type\":\"object\"}", "{} "), 0);
    ASSERT_EQ(doc("{\"type\":\"object\"}", "{}"), 1);
    ASSERT_EQ(doc("{\"type\":\"integer\"}", "12"), 1);
    ASSERT_EQ(doc("{\"type\":\"integer\"}", "12 "), 0);
    ASSERT_EQ(doc("{\"type\":\"number\"}", "-0.5E+12"), 1);
    ASSERT_EQ(doc("{\"type\":\"number\"}", "1."), 0);
    ASSERT_EQ(doc("{\"type\":\"number\"}", "-"), 0);
    ASSERT_EQ(doc("{\"type\":\"number\"}", "1234567890123456"), 0); /* 16 digits */
    ASSERT_EQ(doc("{\"type\":\"number\"}", "123456789012345"), 1);
}

TEST(enum_prefixes_and_const) {
    const char *e = "{\"enum\":[1,12,\"x\",{\"a\":[true]}]}";
    ASSERT_EQ(doc(e, "1"), 1);
    ASSERT_EQ(doc(e, "12"), 1);
    ASSERT_EQ(doc(e, "123"), 0);
    ASSERT_EQ(doc(e, "\"x\""), 1);
    ASSERT_EQ(doc(e, "{\"a\":[true]}"), 1);
    ASSERT_EQ(doc(e, "\"y\""), 0);
    const char *arr = "{\"type\":\"array\",\"items\":{\"enum\":[1,12]}}";
    ASSERT_EQ(doc(arr, "[12,1,1]"), 1);
    ASSERT_EQ(doc(arr, "[2]"), 0);
    ASSERT_EQ(doc("{\"const\":\"hi\"}", "\"hi\""), 1);
    ASSERT_EQ(doc("{\"const\":\"hi\"}", "\"ho\""), 0);
    /* type filters the enum's values */
    ASSERT_EQ(doc("{\"type\":\"string\",\"enum\":[\"a\",1]}", "1"), 0);
}

TEST(any_of_and_any_object) {
    const char *a = "{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"integer\"},"
                    "{\"type\":\"array\",\"items\":{\"type\":\"boolean\"}},{\"type\":\"null\"}]}";
    ASSERT_EQ(doc(a, "\"s\""), 1);
    ASSERT_EQ(doc(a, "-7"), 1);
    ASSERT_EQ(doc(a, "[true,false]"), 1);
    ASSERT_EQ(doc(a, "null"), 1);
    ASSERT_EQ(doc(a, "{}"), 0);
    ASSERT_EQ(doc(NULL, "{\"a\":[1,{\"b\":null},\"x\"],\"c\":{}}"), 1);
    ASSERT_EQ(doc(NULL, "[1]"), 0);
    ASSERT_EQ(doc(NULL, "{\"a\":tru}"), 0);
    ASSERT_EQ(doc(NULL, "{\"a\":1,}"), 0);
    /* nesting of any values is bounded */
    char deep[64] = "{\"a\":";
    for (int i = 0; i < 20; i++) strcat(deep, "[");
    ASSERT_EQ(prefix("{\"type\":\"object\",\"properties\":{\"a\":{}}}", deep), 0);
}

TEST(refs_to_definitions_expand_in_place) {
    const char *r = "{\"$defs\":{\"Addr\":{\"type\":\"object\",\"properties\":"
                    "{\"zip\":{\"type\":\"integer\"}},\"required\":[\"zip\"],"
                    "\"additionalProperties\":false,\"title\":\"Addr\"}},"
                    "\"definitions\":{\"C\":{\"enum\":[\"r\",\"g\"]}},"
                    "\"type\":\"object\",\"properties\":{\"home\":{\"$ref\":\"#/$defs/Addr\","
                    "\"description\":\"d\"},\"work\":{\"anyOf\":[{\"$ref\":\"#/$defs/Addr\"},"
                    "{\"type\":\"null\"}]},\"c\":{\"$ref\":\"#/definitions/C\"}},"
                    "\"required\":[\"home\",\"work\",\"c\"],\"additionalProperties\":false}";
    ASSERT_EQ(doc(r, "{\"home\":{\"zip\":1},\"work\":null,\"c\":\"g\"}"), 1);
    ASSERT_EQ(doc(r, "{\"home\":{\"zip\":1},\"work\":{\"zip\":2},\"c\":\"r\"}"), 1);
    ASSERT_EQ(doc(r, "{\"home\":{\"zip\":\"1\"},\"work\":null,\"c\":\"g\"}"), 0);
    ASSERT_EQ(doc(r, "{\"home\":{\"zip\":1},\"work\":null,\"c\":\"b\"}"), 0);
}

/* The refusal's detail names the keyword and the JSON path. */
TEST(integer_bounds_at_their_edges) {
    /* JSON Schema 2020-12 validation §6.2: minimum/maximum inclusive, exclusive* not */
    const char *age = "{\"type\":\"integer\",\"minimum\":18,\"maximum\":99}";
    ASSERT_EQ(doc(age, "18"), 1);
    ASSERT_EQ(doc(age, "99"), 1);
    ASSERT_EQ(doc(age, "17"), 0);
    ASSERT_EQ(doc(age, "100"), 0);
    ASSERT_EQ(doc(age, "1"), 0);       /* a prefix of 18..19, not a document */
    ASSERT_EQ(prefix(age, "1"), 1);
    ASSERT_EQ(prefix(age, "-"), 0);    /* no negative value is allowed */
    ASSERT_EQ(prefix(age, "0"), 0);
    ASSERT_EQ(prefix(age, "100"), 0);
    const char *cold = "{\"type\":\"integer\",\"exclusiveMinimum\":-40,\"exclusiveMaximum\":-3}";
    ASSERT_EQ(doc(cold, "-39"), 1);
    ASSERT_EQ(doc(cold, "-4"), 1);
    ASSERT_EQ(doc(cold, "-40"), 0);
    ASSERT_EQ(doc(cold, "-3"), 0);
    ASSERT_EQ(prefix(cold, "5"), 0);
    ASSERT_EQ(doc(cold, "-0"), 0);
    /* fractional bounds: the integers inside them */
    ASSERT_EQ(doc("{\"type\":\"integer\",\"minimum\":2.5,\"maximum\":3.5}", "3"), 1);
    ASSERT_EQ(doc("{\"type\":\"integer\",\"minimum\":2.5,\"maximum\":3.5}", "2"), 0);
    /* one bound: the other side runs to 15 digits */
    ASSERT_EQ(doc("{\"type\":\"integer\",\"minimum\":1000}", "123456789012345"), 1);
    ASSERT_EQ(doc("{\"type\":\"integer\",\"minimum\":1000}", "999"), 0);
    /* inside an object the bound is checked where the number ends */
    const char *obj = "{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\","
                      "\"maximum\":5}},\"required\":[\"n\"],\"additionalProperties\":false}";
    ASSERT_EQ(doc(obj, "{\"n\":5}"), 1);
    ASSERT_EQ(doc(obj, "{\"n\":6}"), 0);
    ASSERT_EQ(doc(obj, "{\"n\":-12}"), 1);
}

TEST(string_lengths_count_characters) {
    const char *code = "{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}";
    ASSERT_EQ(doc(code, "\"ab\""), 1);
    ASSERT_EQ(doc(code, "\"abc\""), 1);
    ASSERT_EQ(doc(code, "\"a\""), 0);
    ASSERT_EQ(prefix(code, "\"abcd"), 0);
    /* characters, not bytes: two-byte é and three-byte € count one each; an escape one */
    ASSERT_EQ(doc(code, "\"\xC3\xA9\xE2\x82\xAC\""), 1);
    ASSERT_EQ(doc(code, "\"\\n\\\"x\""), 1);
    ASSERT_EQ(doc(code, "\"\\n\\\"xy\""), 0);
    /* \u escapes are not written in a bounded string */
    ASSERT_EQ(prefix(code, "\"\\u"), 0);
    ASSERT_EQ(doc("{\"type\":\"string\",\"maxLength\":0}", "\"\""), 1);
}

TEST(one_of_and_all_of_of_one) {
    const char *one = "{\"oneOf\":[{\"type\":\"string\",\"maxLength\":1},{\"type\":\"integer\","
                      "\"minimum\":5,\"maximum\":7}]}";
    ASSERT_EQ(doc(one, "\"x\""), 1);
    ASSERT_EQ(doc(one, "6"), 1);
    ASSERT_EQ(doc(one, "8"), 0);
    const char *all = "{\"$defs\":{\"D\":{\"type\":\"integer\",\"maximum\":9}},"
                      "\"allOf\":[{\"$ref\":\"#/$defs/D\"}],\"description\":\"a digit\"}";
    ASSERT_EQ(doc(all, "9"), 1);
    ASSERT_EQ(doc(all, "10"), 0);
}

static void refused(const char *schema, int code, const char *needle, int *harness_failed) {
    fmoe_json_schema *s = NULL;
    ASSERT_EQ(fmoe_json_schema_compile(schema, strlen(schema), &s), code);
    ASSERT_CONTAINS(fmoe_error_detail(), needle);
}

/* Calls to one of several functions, as tool_choice "required" constrains them: an anyOf
 * of objects whose first, required property is a string const of its own (a tagged
 * union); the rest of the object follows the branch that const names. */
static const char *CALLS =
    "{\"anyOf\":["
    "{\"type\":\"object\",\"properties\":{\"name\":{\"const\":\"get\"},"
    "\"arguments\":{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\"}},"
    "\"required\":[\"n\"]}},\"required\":[\"name\",\"arguments\"]},"
    "{\"type\":\"object\",\"properties\":{\"name\":{\"const\":\"get_all\"},"
    "\"arguments\":{\"type\":\"object\",\"properties\":{\"s\":{\"enum\":[\"a\",\"b\"]}},"
    "\"required\":[\"s\"]}},\"required\":[\"name\",\"arguments\"]},"
    "{\"type\":\"string\"}]}";

TEST(tagged_union_of_objects_follows_the_named_branch) {
    ASSERT_EQ(doc(CALLS, "{\"name\":\"get\",\"arguments\":{\"n\":5}}"), 1);
    ASSERT_EQ(doc(CALLS, "{ \"name\": \"get_all\", \"arguments\": {\"s\": \"b\"}}"), 1);
    ASSERT_EQ(doc(CALLS, "\"a string branch\""), 1);
    /* the other branch's arguments, an unknown name, the tag not first, not whole */
    ASSERT_EQ(doc(CALLS, "{\"name\":\"get\",\"arguments\":{\"s\":\"a\"}}"), 0);
    ASSERT_EQ(doc(CALLS, "{\"name\":\"get_all\",\"arguments\":{\"n\":1}}"), 0);
    ASSERT_EQ(doc(CALLS, "{\"name\":\"got\",\"arguments\":{}}"), 0);
    ASSERT_EQ(doc(CALLS, "{\"arguments\":{\"n\":5},\"name\":\"get\"}"), 0);
    ASSERT_EQ(doc(CALLS, "{\"name\":\"get\"}"), 0);
    ASSERT_EQ(prefix(CALLS, "{\"name\":\"get"), 1);
    /* branches whose first keys differ, or whose tag is not a const, stay refused */
    refused("{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"const\":\"x\"}},"
            "\"required\":[\"a\"]},{\"type\":\"object\",\"properties\":{\"b\":"
            "{\"const\":\"y\"}},\"required\":[\"b\"]}]}",
            FMOE_EUNSUPPORTED, "both start with '{'", harness_failed);
    refused("{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"const\":\"x\"}},"
            "\"required\":[\"a\"]},{\"type\":\"object\",\"properties\":{\"a\":"
            "{\"type\":\"string\"}},\"required\":[\"a\"]}]}",
            FMOE_EUNSUPPORTED, "both start with '{'", harness_failed);
}

/* A string schema of pattern pat (C text, JSON-escaped by the caller). */
#define PAT(pat) "{\"type\":\"string\",\"pattern\":\"" pat "\"}"

/* Whole matches of the pattern, worked out by hand (JSON Schema searches unanchored; a
 * whole match is one such match, and generation writes whole ones). */
TEST(pattern_strings_are_whole_matches) {
    ASSERT_EQ(doc(PAT("^[a-z][a-z0-9_]{2,4}$"), "\"ab_1\""), 1);
    ASSERT_EQ(doc(PAT("^[a-z][a-z0-9_]{2,4}$"), "\"ab\""), 0);       /* too short */
    ASSERT_EQ(doc(PAT("^[a-z][a-z0-9_]{2,4}$"), "\"abcdef\""), 0);   /* too long */
    ASSERT_EQ(doc(PAT("^[a-z][a-z0-9_]{2,4}$"), "\"1bc\""), 0);
    ASSERT_EQ(doc(PAT("\\\\d{3}-\\\\d{4}"), "\"555-1234\""), 1);
    ASSERT_EQ(doc(PAT("\\\\d{3}-\\\\d{4}"), "\"555-123\""), 0);
    ASSERT_EQ(doc(PAT("(cat|dog)s?"), "\"dogs\""), 1);
    ASSERT_EQ(doc(PAT("(cat|dog)s?"), "\"cat\""), 1);
    ASSERT_EQ(doc(PAT("(cat|dog)s?"), "\"cow\""), 0);
    ASSERT_EQ(doc(PAT("a*b+"), "\"b\""), 1);
    ASSERT_EQ(doc(PAT("a*b+"), "\"aab\""), 1);
    ASSERT_EQ(doc(PAT("a*b+"), "\"aa\""), 0);
    ASSERT_EQ(doc(PAT("x?"), "\"\""), 1);
    ASSERT_EQ(doc(PAT("\\\\w+\\\\s\\\\w+"), "\"hi there\""), 1);
    ASSERT_EQ(doc(PAT("[^0-9]{2}"), "\"a1\""), 0);
    ASSERT_EQ(doc(PAT("[^0-9]{2}"), "\"ab\""), 1);
    ASSERT_EQ(doc(PAT("v\\\\.[0-9]+(\\\\.[0-9]+){0,2}"), "\"v.1.22.3\""), 1);
    ASSERT_EQ(doc(PAT("v\\\\.[0-9]+(\\\\.[0-9]+){0,2}"), "\"v.1.2.3.4\""), 0);
    ASSERT_EQ(doc(PAT("a{2,}"), "\"aaaaa\""), 1);
    ASSERT_EQ(doc(PAT("a{2,}"), "\"a\""), 0);
    /* characters that need escapes in JSON are not written: a backslash escape or a
     * quote inside never comes, even where `.` would allow it */
    ASSERT_EQ(prefix(PAT(".+"), "\"a\\n"), 0);
    /* a pattern inside an object */
    ASSERT_EQ(doc("{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"string\","
                  "\"pattern\":\"^[A-Z]{2}[0-9]{2}$\"}},\"required\":[\"id\"]}",
                  "{\"id\":\"AB12\"}"), 1);
}

TEST(patterns_outside_the_subset_are_refused_naming_the_construct) {
    refused(PAT("(a)\\\\1"), FMOE_EUNSUPPORTED, "a back-reference", harness_failed);
    refused(PAT("(?=a)b"), FMOE_EUNSUPPORTED, "'(?'", harness_failed);
    refused(PAT("\\\\bword"), FMOE_EUNSUPPORTED, "a word boundary", harness_failed);
    refused(PAT("a*?"), FMOE_EUNSUPPORTED, "lazy", harness_failed);
    refused(PAT("a^b"), FMOE_EUNSUPPORTED, "an anchor inside", harness_failed);
    refused(PAT("[\\\\\\\"]"), FMOE_EUNSUPPORTED, "matches no character", harness_failed);
    refused(PAT("a{70}"), FMOE_EUNSUPPORTED, "more than 63", harness_failed);
    refused(PAT("((()){999}){999}"), FMOE_EUNSUPPORTED, "repetition this large",
            harness_failed);
    refused("{\"type\":\"string\",\"pattern\":\"a\",\"maxLength\":3}", FMOE_EUNSUPPORTED,
            "'pattern' together with", harness_failed);
    refused("{\"pattern\":\"a\"}", FMOE_EUNSUPPORTED, "'pattern' at $ is supported only beside",
            harness_failed);
    refused("{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"string\","
            "\"pattern\":\"\\\\p{L}\"}}}",
            FMOE_EUNSUPPORTED, "'pattern' at $.properties.n: this escape at offset 1",
            harness_failed);
}

/* Random patterns of the subset against Python's re.fullmatch, whose verdicts
 * tests/fixtures/patterns/make_pattern_cases.py wrote (an independent regex engine). */
TEST(patterns_agree_with_python_re_on_random_cases) {
    const char *fixtures = getenv("FMOE_FIXTURES");
    char path[4096], line[1024];
    snprintf(path, sizeof path, "%s/patterns/pattern_cases.tsv",
             fixtures ? fixtures : "tests/fixtures");
    FILE *f = fopen(path, "r");
    ASSERT_TRUE(f != NULL);
    int cases = 0, matches = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        char *t1 = strchr(line, '\t'), *t2 = t1 ? strchr(t1 + 1, '\t') : NULL;
        ASSERT_TRUE(t2 != NULL);
        *t1 = *t2 = '\0';
        char schema[1200], text[600];
        snprintf(schema, sizeof schema, "{\"type\":\"string\",\"pattern\":%s}", line);
        snprintf(text, sizeof text, "\"%s\"", t1 + 1);
        const int want = t2[1] == '1', got = doc(schema, text);
        if (got != want) fprintf(stderr, "pattern %s on \"%s\": fmoe %d, re %d\n", line,
                                 t1 + 1, got, want);
        ASSERT_EQ(got, want);
        cases++;
        matches += want;
    }
    fclose(f);
    ASSERT_TRUE(cases > 1000 && matches > 300);
}

TEST(unsupported_keywords_are_refused_with_their_path) {
    refused("{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"string\",\"format\":\"date\"}}}",
            FMOE_EUNSUPPORTED, "'format' at $.properties.n is not supported", harness_failed);
    refused("{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/x\"}}", FMOE_EINVAL,
            "'$ref' at $.items: \"#/$defs/x\" is not defined", harness_failed);
    refused("{\"$defs\":{\"N\":{\"type\":\"object\",\"properties\":{\"next\":"
            "{\"$ref\":\"#/$defs/N\"}}}},\"$ref\":\"#/$defs/N\"}", FMOE_EUNSUPPORTED,
            "'$ref' at $->#/$defs/N.properties.next: \"#/$defs/N\" refers to itself",
            harness_failed);
    refused("{\"$defs\":{\"A\":{}},\"$ref\":\"#/$defs/A\",\"type\":\"object\"}",
            FMOE_EUNSUPPORTED, "'type' beside '$ref' at $", harness_failed);
    refused("{\"$ref\":\"other.json#/x\"}", FMOE_EUNSUPPORTED, "only \"#/$defs/NAME\"",
            harness_failed);
    refused("{\"anyOf\":[{\"type\":\"object\"},{\"type\":\"object\",\"properties\":{}}]}",
            FMOE_EUNSUPPORTED, "'anyOf' at $: branches 0 and 1 both start with '{'",
            harness_failed);
    refused("{\"type\":[\"number\",\"integer\"]}", FMOE_EUNSUPPORTED, "'type' at $",
            harness_failed);
    refused("{\"type\":\"object\",\"required\":[\"x\"],\"properties\":{}}", FMOE_EINVAL,
            "'required' at $ names 'x'", harness_failed);
    refused("{\"type\":\"strin\"}", FMOE_EINVAL, "unknown type", harness_failed);
    refused("[1", FMOE_EINVAL, "not valid JSON", harness_failed);
    refused("{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}", FMOE_EINVAL, "'maxItems' 2",
            harness_failed);
    refused("{\"type\":\"number\",\"minimum\":1}", FMOE_EUNSUPPORTED,
            "'minimum' at $ is not supported on a number", harness_failed);
    refused("{\"maxLength\":3}", FMOE_EUNSUPPORTED, "'maxLength' at $ is supported only beside",
            harness_failed);
    refused("{\"oneOf\":[{\"type\":\"integer\"},{\"type\":\"number\"}]}", FMOE_EUNSUPPORTED,
            "'oneOf' at $: branches 0 and 1", harness_failed);
    refused("{\"allOf\":[{\"type\":\"integer\"},{\"minimum\":1}]}", FMOE_EUNSUPPORTED,
            "'allOf' at $ is supported only with one schema", harness_failed);
    refused("{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", FMOE_EINVAL,
            "admit no integer", harness_failed);
    refused("{\"type\":\"string\",\"minLength\":5,\"maxLength\":4}", FMOE_EINVAL,
            "'minLength' at $ is above", harness_failed);
}

/* ---------------------------------------------------------------------------------- */
/* The mask on a real vocabulary                                                      */
/* ---------------------------------------------------------------------------------- */

/* 1 when one of the bytes of set occurs in p[0..n). */
static int strpbrk_n(const char *p, size_t n, const char *set) {
    for (size_t i = 0; i < n; i++)
        if (strchr(set, p[i]) && p[i]) return 1;
    return 0;
}

static fmoe_tokenizer *tiny(void) {
    const char *root = getenv("FMOE_SOURCE_ROOT");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/datasets/fmoe-tiny", root ? root : ".");
    fmoe_tokenizer *tok = NULL;
    return fmoe_tokenizer_load(dir, &tok) < 0 ? NULL : tok;
}

/* Random walks through the mask: each step's mask equals feeding every token's bytes to
 * a copy of the state, the walk ends only with an end id, and the text is a document. */
static void random_walks(const char *schema, int steps_max, int *harness_failed) {
    fmoe_tokenizer *tok = tiny();
    ASSERT_TRUE(tok != NULL);
    const int32_t V = fmoe_tokenizer_vocab_size(tok);
    const int32_t end = fmoe_tokenizer_eos_id(tok);
    fmoe_json_vocab *v;
    ASSERT_OK(fmoe_json_vocab_init(tok, &end, 1, &v));
    fmoe_json_schema *s;
    ASSERT_OK(schema ? fmoe_json_schema_compile(schema, strlen(schema), &s)
                     : fmoe_json_schema_any_object(&s));
    uint8_t *allowed = malloc((size_t)V);
    char *text = malloc(1 << 16);
    fmoe_rng rng;
    fmoe_rng_seed(&rng, 7);
    int completed = 0;
    for (int walk = 0; walk < 4; walk++) {
        fmoe_json_matcher *m, *probe;
        ASSERT_OK(fmoe_json_matcher_init(s, v, &m));
        size_t len = 0;
        int ended = 0;
        for (int step = 0; step < steps_max && !ended; step++) {
            const int32_t n = fmoe_json_matcher_mask(m, allowed);
            ASSERT_TRUE(n > 0);
            int32_t count = 0;
            for (int32_t id = 0; id < V; id++) {
                count += allowed[id];
                if (id == end) {
                    ASSERT_EQ(allowed[id], fmoe_json_matcher_is_complete(m));
                    continue;
                }
                /* the trie walk against a plain feed of the token's bytes */
                const char *piece;
                size_t plen;
                int want = 0;
                if (!fmoe_tokenizer_is_special(tok, id) &&
                    fmoe_tokenizer_token_to_piece(tok, id, &piece, &plen) == 0 && plen > 0) {
                    ASSERT_OK(fmoe_json_matcher_init(s, v, &probe));
                    ASSERT_OK(fmoe_json_matcher_feed(probe, text, len));
                    want = fmoe_json_matcher_feed(probe, piece, plen) == 0;
                    fmoe_json_matcher_free(probe);
                }
                ASSERT_EQ(allowed[id], want);
            }
            ASSERT_EQ(count, n);
            /* uniform among the allowed tokens, but after the first quarter the end id,
             * or a token that closes something, when one comes up in 256 draws: a string
             * would else run on (few of the tokens a string admits hold a quote) */
            int32_t pick = -1;
            if (allowed[end] && step > steps_max / 4) pick = end;
            for (int draw = 0; pick < 0; draw++) {
                const int32_t id = (int32_t)(fmoe_rng_next(&rng) % (uint64_t)V);
                if (!allowed[id]) continue;
                const char *piece;
                size_t plen;
                if (draw >= 256 || step <= steps_max / 4 ||
                    (fmoe_tokenizer_token_to_piece(tok, id, &piece, &plen) == 0 &&
                     strpbrk_n(piece, plen, "\"]}")))
                    pick = id;
            }
            if (pick == end) {
                ended = 1;
                break;
            }
            const char *piece;
            size_t plen;
            ASSERT_OK(fmoe_tokenizer_token_to_piece(tok, pick, &piece, &plen));
            ASSERT_OK(fmoe_json_matcher_accept(m, pick));
            memcpy(text + len, piece, plen);
            len += plen;
        }
        if (ended) {
            completed++;
            text[len] = 0;
            ASSERT_EQ(doc(schema, text), 1);
        }
        fmoe_json_matcher_free(m);
    }
    ASSERT_TRUE(completed > 0);
    free(text);
    free(allowed);
    fmoe_json_schema_free(s);
    fmoe_json_vocab_free(v);
    fmoe_tokenizer_free(tok);
}

TEST(mask_equals_per_token_feed_on_fmoe_tiny) {
    random_walks("{\"type\":\"object\",\"properties\":{\"k\":{\"enum\":[\"red\",\"green\"]},"
                 "\"n\":{\"type\":\"number\"},\"s\":{\"type\":\"string\"},"
                 "\"b\":{\"type\":\"boolean\"}},"
                 "\"required\":[\"k\",\"n\",\"s\",\"b\"],\"additionalProperties\":false}",
                 60, harness_failed);
}

TEST(mask_any_object_on_fmoe_tiny) { random_walks(NULL, 40, harness_failed); }

TEST(mask_equals_per_token_feed_on_a_tagged_union) { random_walks(CALLS, 60, harness_failed); }

TEST(mask_equals_per_token_feed_with_patterns) {
    random_walks("{\"type\":\"object\",\"properties\":{"
                 "\"id\":{\"type\":\"string\",\"pattern\":\"^[a-z][a-z0-9_]{1,8}$\"},"
                 "\"tel\":{\"type\":\"string\",\"pattern\":\"\\\\d{3}-\\\\d{2,4}\"},"
                 "\"w\":{\"type\":\"string\",\"pattern\":\"(red|green)( \\\\w+)*\"},"
                 "\"any\":{\"type\":\"string\",\"pattern\":\".*\"}},"
                 "\"required\":[\"id\",\"tel\",\"w\",\"any\"],\"additionalProperties\":false}",
                 60, harness_failed);
}

TEST(mask_equals_per_token_feed_with_bounds) {
    random_walks("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\","
                 "\"minimum\":-20,\"maximum\":300},\"s\":{\"type\":\"string\",\"minLength\":2,"
                 "\"maxLength\":6},\"o\":{\"oneOf\":[{\"type\":\"integer\",\"minimum\":100},"
                 "{\"type\":\"null\"}]}},\"required\":[\"a\",\"s\",\"o\"],"
                 "\"additionalProperties\":false}",
                 60, harness_failed);
}

TEST(accept_refuses_a_token_the_mask_refuses) {
    fmoe_tokenizer *tok = tiny();
    ASSERT_TRUE(tok != NULL);
    const int32_t end = fmoe_tokenizer_eos_id(tok);
    fmoe_json_vocab *v;
    ASSERT_OK(fmoe_json_vocab_init(tok, &end, 1, &v));
    fmoe_json_schema *s;
    ASSERT_OK(fmoe_json_schema_any_object(&s));
    fmoe_json_matcher *m;
    ASSERT_OK(fmoe_json_matcher_init(s, v, &m));
    int32_t *ids;
    size_t n;
    ASSERT_OK(fmoe_tokenizer_encode_alloc(tok, "hello", 5, 0, &ids, &n));
    ASSERT_EQ(fmoe_json_matcher_accept(m, ids[0]), FMOE_EINVAL);
    ASSERT_EQ(fmoe_json_matcher_accept(m, end), FMOE_EINVAL);
    ASSERT_TRUE(fmoe_json_matcher_is_end(m, end));
    free(ids);
    fmoe_json_matcher_free(m);
    fmoe_json_schema_free(s);
    fmoe_json_vocab_free(v);
    fmoe_tokenizer_free(tok);
}

int main(int argc, char **argv) { return RUN_TESTS(argc, argv); }
