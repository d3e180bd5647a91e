/*
 * test_jinja.c - the Jinja interpreter's pieces one at a time (runtime/tokenizer/jinja.h):
 * the lexer's whitespace control, values as Python prints them, tojson, the parser's
 * precedence and refusals, evaluation and its limits. Whole templates against jinja2 are
 * tests/python/test_chat_jinja.py's.
 */
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "harness.h"
#include "jinja.h"

/* Renders `tmpl` with the JSON object `vars`; NULL (and the detail set) on error. */
static char *render(const char *tmpl, const char *vars) {
    char *out = NULL;
    size_t len;
    int rc = fmoe__jinja_render(tmpl, vars ? vars : "{}", &out, &len);
    return rc == 0 ? out : NULL;
}

#define RENDERS(tmpl, vars, want)                                                        \
    do {                                                                                 \
        char *got_ = render((tmpl), (vars));                                             \
        if (!got_) HARNESS_FAIL("%s: %s", (tmpl), fmoe_error_detail());                 \
        ASSERT_STR_EQ(got_, (want));                                                     \
        free(got_);                                                                      \
    } while (0)

#define REFUSES(tmpl, code, msg)                                                         \
    do {                                                                                 \
        char *out_ = NULL;                                                               \
        ASSERT_EQ(fmoe__jinja_render((tmpl), "{}", &out_, NULL), (code));                \
        ASSERT_CONTAINS(fmoe_error_detail(), (msg));                                     \
        ASSERT_TRUE(strchr(fmoe_error_detail(), '\n') == NULL);                          \
        ASSERT_TRUE(out_ == NULL);                                                       \
    } while (0)

TEST(lexer_tokens) {
    jj_arena *A = jj_arena_new();
    jj_token *t;
    size_t n;
    ASSERT_OK(jj_lex(A, "a{{ x.y|f(1, 'q\\n') }}b{% if 2.5 // 3 %}", 40, &t, &n));
    jt_kind want[] = {JT_TEXT, JT_VAR_BEGIN, JT_NAME, JT_OP, JT_NAME, JT_OP, JT_NAME, JT_OP,
                      JT_INT, JT_OP, JT_STRING, JT_OP, JT_VAR_END, JT_TEXT, JT_BLOCK_BEGIN,
                      JT_NAME, JT_FLOAT, JT_OP, JT_INT, JT_BLOCK_END, JT_EOF};
    ASSERT_EQ(n, sizeof want / sizeof want[0]);
    for (size_t i = 0; i < n; i++) ASSERT_EQ(t[i].k, want[i]);
    ASSERT_EQ(t[10].n, 2);
    ASSERT_TRUE(memcmp(t[10].s, "q\n", 2) == 0);
    ASSERT_EQ(t[17].n, 2); /* "//" */
    ASSERT_TRUE(t[16].f == 2.5);
    jj_arena_free(A);
}

TEST(whitespace_control) {
    /* trim_blocks: the newline after a block tag goes; lstrip_blocks: the indentation
     * before one goes; neither for {{ }} */
    RENDERS("  {% if true %}\n  yes\n  {% endif %}\nend\n", NULL, "  yes\nend");
    RENDERS("a {{ 1 }}\n b", NULL, "a 1\n b");
    RENDERS("a  {%- if true -%}  \n b {%- endif %}", NULL, "ab");
    RENDERS("a  {%+ if true %}b{% endif +%}\nc", NULL, "a  b\nc");
    RENDERS("x {# c #}\n  {#- d -#}  y", NULL, "x y");
    RENDERS("{% raw %}{{ x }}{% endraw %}", NULL, "{{ x }}");
    RENDERS("a\r\nb\rc\n\n", NULL, "a\nb\nc\n"); /* newlines normalised, one trailing dropped */
}

TEST(values_print_as_python) {
    RENDERS("{{ none }} {{ True }} {{ false }} {{ 3 }} {{ x }}|", NULL, "None True False 3 |");
    RENDERS("{{ 1.0 }} {{ 0.1 + 0.2 }} {{ 1e16 }} {{ 1.5e-7 }} {{ 123456.789 }} {{ 1e22 }}", NULL,
            "1.0 0.30000000000000004 1e+16 1.5e-07 123456.789 1e+22");
    RENDERS("{{ [1, 'a', none, [true]] }} {{ {'k': \"it's\"} }} {{ (1,) }}", NULL,
            "[1, 'a', None, [True]] {'k': \"it's\"} (1,)");
}

TEST(tojson_as_transformers) {
    RENDERS("{{ x|tojson }}", "{\"x\": {\"a\": [1, 2.5, null, true, \"\\u00e9\\\"\\n\"], \"b\": {}}}",
            "{\"a\": [1, 2.5, null, true, \"\xC3\xA9\\\"\\n\"], \"b\": {}}");
    RENDERS("{{ x|tojson(indent=2) }}", "{\"x\": {\"a\": [1], \"b\": []}}",
            "{\n  \"a\": [\n    1\n  ],\n  \"b\": []\n}");
    RENDERS("{{ {'b': 1, 'a': 2}|tojson(sort_keys=true) }}", NULL, "{\"a\": 2, \"b\": 1}");
    /* the variables' JSON keeps 1.0 a float and 1 an int, as json.loads does */
    RENDERS("{{ x|tojson }} {{ x }}", "{\"x\": [1.0, 1, 1e2, -0.0, \"\\ud83d\\ude42\\u00e9\"]}",
            "[1.0, 1, 100.0, -0.0, \"\xF0\x9F\x99\x82\xC3\xA9\"] [1.0, 1, 100.0, -0.0, '\xF0\x9F\x99\x82\xC3\xA9']");
    RENDERS("{{ '\xF0\x9F\x99\x82'|tojson(ensure_ascii=true) }}", NULL, "\"\\ud83d\\ude42\"");
}

TEST(precedence) {
    RENDERS("{{ 1 + 2 * 3 }} {{ -2 ** 2 }} {{ 'a' ~ 1 * 2 }} {{ not 1 == 2 }} {{ 2 * 3|abs }}", NULL,
            "7 4 a2 True 6");
    RENDERS("{{ 'a' if 0 else 'b' if 1 else 'c' }} {{ 1 < 2 < 3 }} {{ x is defined or 'u' }}", NULL,
            "b True u");
    RENDERS("{{ 7 // -2 }} {{ 7 % -2 }} {{ -7.5 // 2 }} {{ 1 / 4 }}", NULL, "-4 -1 -4.0 0.25");
}

TEST(statements) {
    RENDERS("{% for k, v in d.items() %}{{ loop.index }}{{ k }}{{ v }}{% if not loop.last %},"
            "{% endif %}{% endfor %}", "{\"d\": {\"a\": 1, \"b\": 2}}", "1a1,2b2");
    RENDERS("{% set ns = namespace(n=0) %}{% for i in range(4) if i is odd %}{% set ns.n = ns.n"
            " + i %}{% endfor %}{{ ns.n }}", NULL, "4");
    RENDERS("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}", NULL, "1");
    RENDERS("{% macro m(a, b='B') %}{{ a }}{{ b }}{% endmacro %}{{ m('A') }}{{ m(1, b=2) }}", NULL,
            "AB12");
    RENDERS("{% for i in range(9) %}{% if i > 2 %}{% break %}{% endif %}{{ i }}{% endfor %}",
            NULL, "012");
    RENDERS("{% set s %}x{{ 1 }}{% endset %}{{ s }}{% filter upper %}y{% endfilter %}", NULL, "x1Y");
}

TEST(members_and_methods) {
    const char *v = "{\"m\": {\"role\": \"user\", \"content\": \" Hi \"}, \"xs\": [3, 1, 2]}";
    RENDERS("{{ m.role }} {{ m['content'].strip() }} {{ m.missing is defined }} {{ m.get('x', 0) }}",
            v, "user Hi False 0");
    RENDERS("{{ xs[-1] }} {{ xs[::-1] }} {{ xs|sort }} {{ xs[5] is defined }}", v,
            "2 [2, 1, 3] [1, 2, 3] False");
    RENDERS("{{ 'a,b'.split(',') }} {{ 'abc'.startswith('a') }} {{ '{}-{}'.format(1, 2) }}", v,
            "['a', 'b'] True 1-2");
}

TEST(refusals_name_construct_and_line) {
    REFUSES("a\n{% include 'x' %}", FMOE_EUNSUPPORTED, "chat template line 2: '{% include %}'");
    REFUSES("{{ x|nonesuch }}", FMOE_EUNSUPPORTED, "filter 'nonesuch' is not supported");
    REFUSES("{% for x in y %}", FMOE_EFORMAT, "is not closed");
    REFUSES("{{ 1 +", FMOE_EFORMAT, "line 1");
    REFUSES("{{ raise_exception('no\nway') }}", FMOE_EINVAL, "the template raised: no way");
    REFUSES("{{ u.v }}", FMOE_EINVAL, "undefined");
    REFUSES("{{ [].append(1) }}", FMOE_EINVAL, "sandbox");
}

TEST(variables_json) {
    char *out = NULL;
    ASSERT_EQ(fmoe__jinja_render("x", "{\"a\": }", &out, NULL), FMOE_EINVAL);
    ASSERT_CONTAINS(fmoe_error_detail(), "not valid JSON at byte 6");
    ASSERT_EQ(fmoe__jinja_render("x", "{} x", &out, NULL), FMOE_EINVAL);
    ASSERT_EQ(fmoe__jinja_render("x", "[1]", &out, NULL), FMOE_EINVAL);
    ASSERT_EQ(fmoe__jinja_render("x", "{\"a\": \"\\u0000\"}", &out, NULL), FMOE_EINVAL);
    RENDERS("{{ d }}", "{\"d\": {\"k\": 1, \"j\": 2, \"k\": 3}}", "{'k': 3, 'j': 2}");
    ASSERT_TRUE(out == NULL);
}

TEST(limits) {
    REFUSES("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
            FMOE_ERANGE, "evaluation steps");
    REFUSES("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", FMOE_ERANGE, "nested more than");
    REFUSES("{{ 'x' * 100000000 }}", FMOE_ERANGE, "over");
    char deep[4096] = "{{ ";
    for (int i = 0; i < 1000; i++) strcat(deep, "(");
    strcat(deep, "1");
    for (int i = 0; i < 1000; i++) strcat(deep, ")");
    strcat(deep, " }}");
    REFUSES(deep, FMOE_ERANGE, "nested more than");
}

int main(int argc, char **argv) { return RUN_TESTS(argc, argv); }
