/*
 * jinja.h - the Jinja interpreter that renders chat templates as written (internal).
 *
 * HuggingFace chat templates are Jinja programs that transformers renders with jinja2's
 * ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, loopcontrols) and its
 * own tojson / raise_exception / strftime_now. This interpreter implements the subset real
 * templates use, with the same output bytes; anything else is refused with a one-line error
 * that names the construct and its line. The pieces, one job each:
 *
 *   jinja_lex.c     template text -> tokens (text, tags, expression tokens), whitespace
 *                   control (trim_blocks, lstrip_blocks, '-' and '+')
 *   jinja_parse.c   tokens -> syntax tree
 *   jinja_value.c   values (Python's types as Jinja sees them), arena, str()/repr()/tojson,
 *                   equality and ordering
 *   jinja_json.c    JSON text to values, ints and floats kept apart as json.loads keeps them
 *   jinja_strings.c   str methods, and the string helpers filters share
 *   jinja_builtins.c  dict/list methods, global functions, tests
 *   jinja_filters.c   filters
 *   jinja_eval.c    runs the tree: statements, expressions, scopes, limits
 *
 * Everything a render allocates lives in one arena freed at the end, so values are plain
 * structs with no ownership. Work is bounded (steps, depth, output and arena bytes), so a
 * hostile template fails in one line instead of hanging or exhausting memory.
 */
#ifndef FMOE_TOKENIZER_JINJA_H
#define FMOE_TOKENIZER_JINJA_H

#include <stddef.h>
#include <stdint.h>

/* ---- link names -------------------------------------------------------------------------- */

/* The interpreter's functions keep their short names in the source, and link as fmoe__jj_*
 * and fmoe__jv_*: the library is linked into other programs, and jq's libjq, for one,
 * exports jv_cmp and other jv_ names of its own. */
#define jj_alloc fmoe__jj_alloc
#define jj_arena_free fmoe__jj_arena_free
#define jj_arena_new fmoe__jj_arena_new
#define jj_arena_over fmoe__jj_arena_over
#define jj_arg fmoe__jj_arg
#define jj_call_builtin fmoe__jj_call_builtin
#define jj_fail fmoe__jj_fail
#define jj_filter fmoe__jj_filter
#define jj_find fmoe__jj_find
#define jj_html_escape fmoe__jj_html_escape
#define jj_is_space fmoe__jj_is_space
#define jj_iterable fmoe__jj_iterable
#define jj_lex fmoe__jj_lex
#define jj_method fmoe__jj_method
#define jj_pairs fmoe__jj_pairs
#define jj_parse fmoe__jj_parse
#define jj_recase fmoe__jj_recase
#define jj_render fmoe__jj_render
#define jj_replace fmoe__jj_replace
#define jj_sb_put fmoe__jj_sb_put
#define jj_sb_puts fmoe__jj_sb_puts
#define jj_split fmoe__jj_split
#define jj_str_method fmoe__jj_str_method
#define jj_str_out fmoe__jj_str_out
#define jj_strip fmoe__jj_strip
#define jj_strndup fmoe__jj_strndup
#define jj_test fmoe__jj_test
#define jj_utf8_len fmoe__jj_utf8_len
#define jj_utf8_off fmoe__jj_utf8_off
#define jj_want_str fmoe__jj_want_str
#define jv_cmp fmoe__jv_cmp
#define jv_dict_get fmoe__jv_dict_get
#define jv_dict_getn fmoe__jv_dict_getn
#define jv_dict_new fmoe__jv_dict_new
#define jv_dict_set fmoe__jv_dict_set
#define jv_eq fmoe__jv_eq
#define jv_kind_name fmoe__jv_kind_name
#define jv_list_new fmoe__jv_list_new
#define jv_list_push fmoe__jv_list_push
#define jv_parse_json fmoe__jv_parse_json
#define jv_str fmoe__jv_str
#define jv_to_sb fmoe__jv_to_sb
#define jv_to_str fmoe__jv_to_str
#define jv_tojson fmoe__jv_tojson
#define jv_truthy fmoe__jv_truthy

/* ---- limits ---------------------------------------------------------------------------- */

#define JJ_MAX_STEPS 5000000u           /* expression/statement evaluations per render */
#define JJ_MAX_DEPTH 200                /* nesting of parse, of macro calls, of printed values */
#define JJ_MAX_EVAL_DEPTH 1000          /* expressions and statements on the C stack at once */
#define JJ_MAX_OUTPUT (16u << 20)       /* bytes of rendered text (and of any one string) */
#define JJ_MAX_ARENA ((size_t)256 << 20) /* bytes a render may allocate */
#define JJ_MAX_RANGE 100000             /* items range() may produce */

/* ---- arena ----------------------------------------------------------------------------- */

typedef struct jj_arena jj_arena;
jj_arena *jj_arena_new(void);
void jj_arena_free(jj_arena *a);
/* @return zeroed memory, or NULL when out of memory or over JJ_MAX_ARENA. */
void *jj_alloc(jj_arena *a, size_t n);
/* Whether an allocation failed for JJ_MAX_ARENA rather than the system's memory. */
int jj_arena_over(const jj_arena *a);
char *jj_strndup(jj_arena *a, const char *s, size_t n);

/* ---- values ---------------------------------------------------------------------------- */

typedef enum {
    JV_UNDEF, /* a name or member that does not exist: prints "", is falsy */
    JV_NONE,
    JV_BOOL,
    JV_INT,
    JV_FLOAT,
    JV_STR,
    JV_LIST,  /* lists and tuples */
    JV_DICT,
    JV_NS,    /* namespace(): a dict whose members can be assigned */
    JV_MACRO,
    JV_FUNC,  /* a global function or a bound method */
} jv_kind;

typedef struct jj_list jj_list;
typedef struct jj_dict jj_dict;
struct jnode;
struct jj_scope;

typedef struct jv {
    jv_kind k;
    int safe; /* JV_STR: markupsafe's Markup (from |safe): "+" with a plain string escapes
                 that string for HTML, as Markup.__add__ does */
    union {
        int b;
        int64_t i;
        double f;
        struct {
            const char *s;
            size_t n;
        } s;
        jj_list *l;
        jj_dict *d; /* JV_DICT, JV_NS */
        struct jj_macro *m;
        struct jj_func *fn;
    } u;
} jv;

struct jj_list {
    jv *v;
    size_t n, cap;
    int tuple; /* prints as (a, b): dict items, tuple literals */
    int gen;   /* a generator in jinja2 (map, select, ...): always true, no len(), no JSON */
};
struct jj_dict {
    jv *key, *val;
    size_t n, cap;
};
typedef struct jj_macro {
    const struct jnode *node;
    struct jj_scope *scope; /* where it was defined: what its body sees */
} jj_macro;
typedef struct jj_func {
    const char *name; /* a global ("range") or a method ("strip") */
    jv self;          /* JV_UNDEF for globals */
} jj_func;

static inline jv jv_undef(void) { return (jv){.k = JV_UNDEF}; }
static inline jv jv_none(void) { return (jv){.k = JV_NONE}; }
static inline jv jv_bool(int b) { return (jv){.k = JV_BOOL, .u.b = !!b}; }
static inline jv jv_int(int64_t i) { return (jv){.k = JV_INT, .u.i = i}; }
static inline jv jv_float(double f) { return (jv){.k = JV_FLOAT, .u.f = f}; }
static inline jv jv_strn(const char *s, size_t n) { return (jv){.k = JV_STR, .u.s = {s, n}}; }
jv jv_str(const char *s);

/* Containers: NULL-safe constructors return JV_UNDEF-kinded values never; they fail with
 * FMOE_ENOMEM through the return code. */
int jv_list_new(jj_arena *a, size_t cap, jv *out);
int jv_list_push(jj_arena *a, jv list, jv item);
int jv_dict_new(jj_arena *a, jv *out);
int jv_dict_set(jj_arena *a, jv dict, jv key, jv val);
/* @return the value, or NULL when the key is absent. */
jv *jv_dict_get(jv dict, jv key);
jv *jv_dict_getn(jv dict, const char *key, size_t n);

int jv_truthy(jv v);
int jv_eq(jv a, jv b);
/* Python's ordering for numbers and strings (lists element-wise); 0 and *cmp, or
 * FMOE_EINVAL for kinds that do not order. */
int jv_cmp(jv a, jv b, int *cmp);
const char *jv_kind_name(jv v);
size_t jj_utf8_len(const char *s, size_t n);
/* Byte offset of code point `cp` in s[0, n) (n when past the end). */
size_t jj_utf8_off(const char *s, size_t n, size_t cp);

/* A growable byte string (malloc'd; the output and captured blocks). */
typedef struct jj_sb {
    char *p;
    size_t n, cap;
} jj_sb;
int jj_sb_put(jj_sb *b, const char *s, size_t n);
int jj_sb_puts(jj_sb *b, const char *s);

/* str(v) as Jinja prints it ("None", "True", Python's float repr, list/dict repr). */
int jv_to_sb(jj_sb *b, jv v);
/* str(v) into the arena. */
int jv_to_str(jj_arena *a, jv v, jv *out);
/* json.dumps(v, ensure_ascii=, indent=indent (<0: None), separators=(item_sep, key_sep)
 * (NULL: json's defaults), sort_keys=). */
typedef struct jj_json_opts {
    int indent;
    int sort_keys;
    int ensure_ascii;
    const char *item_sep, *key_sep;
} jj_json_opts;
int jv_tojson(jj_sb *b, jv v, const jj_json_opts *o);
/* JSON text as values, as json.loads reads it (jinja_json.c); `what` names the text in
 * errors. @return 0, FMOE_EINVAL (not JSON), FMOE_ERANGE (nested too deep), FMOE_ENOMEM. */
int jv_parse_json(jj_arena *a, const char *text, size_t n, const char *what, jv *out);

/* ---- tokens and syntax tree ------------------------------------------------------------ */

typedef enum {
    JT_TEXT,
    JT_VAR_BEGIN,
    JT_VAR_END,
    JT_BLOCK_BEGIN,
    JT_BLOCK_END,
    JT_NAME,
    JT_STRING,
    JT_INT,
    JT_FLOAT,
    JT_OP, /* s holds the operator: "+", "//", "==", "(", ... */
    JT_EOF,
} jt_kind;

typedef struct jj_token {
    jt_kind k;
    int line;
    const char *s; /* text, name, operator, or unescaped string (arena) */
    size_t n;
    int64_t i;
    double f;
} jj_token;

/* Splits a template into tokens, applying whitespace control. @return 0, or FMOE_EFORMAT
 * with "chat template line N: ..." set. */
int jj_lex(jj_arena *a, const char *src, size_t len, jj_token **toks, size_t *ntoks);

typedef enum {
    /* statements */
    JN_BODY,     /* kids: statements */
    JN_TEXT,     /* s */
    JN_OUTPUT,   /* a */
    JN_IF,       /* a cond, b then-body, c else (body or JN_IF) */
    JN_FOR,      /* names: targets; a iterable, b body, c else-body, d filter (or NULL) */
    JN_SET,      /* names: targets; a value or NULL with b body (block set); s2 attribute */
    JN_MACRO,    /* s name; kids params (JN_NAME with a = default or NULL); b body */
    JN_BREAK,
    JN_CONTINUE,
    JN_FILTERBLOCK, /* a: filter chain applied to the body b's output */
    /* expressions */
    JN_LIT,      /* lit */
    JN_NAME,     /* s */
    JN_LIST,     /* kids; op 1: a tuple */
    JN_DICT,     /* kids: key, value, key, value, ... */
    JN_ATTR,     /* a . s */
    JN_ITEM,     /* a [ b ] */
    JN_SLICE,    /* a [ kids[0] : kids[1] : kids[2] ] (NULL kids allowed) */
    JN_CALL,     /* a ( kids ); keyword arguments are JN_KWARG (s = a) */
    JN_KWARG,
    JN_FILTER,   /* a | s ( kids ) */
    JN_TEST,     /* a is [not] s ( kids ); op 1 when negated */
    JN_BINOP,    /* a op b: op '+', '-', '*', '/', '%', '~', 'F' (floor division), 'P' (power) */
    JN_CMP,      /* a op b: op 'e' ==, 'n' !=, '<', '>', 'l' <=, 'g' >=, 'i' in, 'I' not in */
    JN_AND,
    JN_OR,
    JN_NOT,
    JN_NEG,
    JN_POS,
    JN_COND,     /* b if a else c (c NULL: undefined) */
} jn_kind;

typedef struct jnode {
    jn_kind k;
    int line;
    int op;
    const char *s;  /* names, text */
    size_t n;
    const char *s2; /* JN_SET: attribute of a namespace */
    struct jnode *a, *b, *c, *d;
    struct jnode **kids;
    size_t nkids;
    const char **names; /* JN_FOR / JN_SET targets */
    size_t nnames;
    jv lit;
} jnode;

/* Parses tokens into a JN_BODY. @return 0, or FMOE_EUNSUPPORTED / FMOE_EFORMAT with
 * "chat template line N: ..." set. */
int jj_parse(jj_arena *a, const jj_token *toks, size_t ntoks, jnode **root);

/* ---- evaluation ------------------------------------------------------------------------ */

typedef struct jj_scope {
    struct jj_scope *up;
    jv vars; /* JV_DICT */
} jj_scope;

typedef struct jj_ctx {
    jj_arena *A;
    jj_sb *out;          /* where output goes (a capture while a macro or block set runs) */
    uint64_t steps;
    int depth;
    int line;            /* line of the node being evaluated, for errors */
} jj_ctx;

/* Errors raised while evaluating name the template line being run. */
int jj_fail(jj_ctx *c, int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* Arguments of a filter, method or global: positional, and keyword (kwn[i] names kw[i]). */
typedef struct jj_args {
    const jv *args;
    size_t nargs;
    const char *const *kwn;
    const jv *kw;
    size_t nkw;
} jj_args;

/* ---- strings (jinja_strings.c) --------------------------------------------------------- */

/* The argument at position `pos` or named `name`, else `def`. */
jv jj_arg(const jj_args *a, size_t pos, const char *name, jv def);
int jj_want_str(jj_ctx *c, jv v, const char *what);
/* The builder's text as a string in the arena (the builder is freed); *rc on failure. */
jv jj_str_out(jj_ctx *c, jj_sb *sb, int *rc);
int jj_is_space(unsigned char ch); /* Python's ASCII whitespace */
const char *jj_find(const char *h, size_t hn, const char *n, size_t nn);
typedef enum {
    JJ_CASE_UPPER,
    JJ_CASE_LOWER,
    JJ_CASE_TITLE_PY,    /* str.title() */
    JJ_CASE_TITLE_JINJA, /* |title */
    JJ_CASE_CAPITALIZE,
} jj_casing;
int jj_recase(jj_ctx *c, jv s, jj_casing how, jv *out);
/* str.strip/lstrip/rstrip(chars): chars JV_NONE for whitespace. */
jv jj_strip(jv s, jv chars, int left, int right);
int jj_replace(jj_ctx *c, jv s, jv old, jv new_, int64_t count, jv *out);
int jj_split(jj_ctx *c, jv s, jv sep, int64_t maxsplit, jv *out);
/* A str method by name (one of those jj_method binds) on s. */
int jj_str_method(jj_ctx *c, const char *m, jv s, const jj_args *a, jv *out);

/* ---- builtins (jinja_builtins.c, jinja_filters.c) -------------------------------------- */

/* [(key, value), ...] of a dict, as tuples. */
int jj_pairs(jj_ctx *c, jv d, jv *out);

/* A filter (jinja_filters.c) or test by name. @return 1 and *out / *result when the name is
 * known, 0 when not, <0 on error. `args[0]` is the value filtered or tested. */
int jj_filter(jj_ctx *c, const char *name, const jv *args, size_t nargs,
              const char *const *kwnames, const jv *kw, size_t nkw, jv *out);
int jj_test(jj_ctx *c, const char *name, const jv *args, size_t nargs, int *result);
/* A member of a string/dict/list that is a method: JV_FUNC bound to v, or JV_UNDEF. */
jv jj_method(jj_ctx *c, jv v, const char *name, size_t n);
int jj_call_builtin(jj_ctx *c, const jj_func *f, const jv *args, size_t nargs,
                    const char *const *kwnames, const jv *kw, size_t nkw, jv *out);
/* markupsafe.escape(s): & < > " ' as HTML entities; the result is safe (jinja_strings.c). */
int jj_html_escape(jj_ctx *c, jv s, jv *out);
/* Iteration: a list's items, a dict's keys, a string's characters (jinja_strings.c). */
int jj_iterable(jj_ctx *c, jv v, jv *list);

/* Renders a parsed template with the variables of `vars` (a JV_DICT). */
int jj_render(jj_arena *a, const jnode *root, jv vars, jj_sb *out);

/* Parses `tmpl` and renders it with `vars` (a JV_DICT in arena A, which the render also
 * allocates from). @return 0 and *out (malloc'd, NUL-terminated), or a negative FMOE_E*
 * code with a one-line detail: FMOE_EUNSUPPORTED for a construct the interpreter does not
 * implement, FMOE_EFORMAT for a template Jinja would not parse, FMOE_EINVAL for an error
 * the template raised or a failed operation, FMOE_ERANGE for a limit reached. */
int fmoe__jinja_render_vars(jj_arena *A, const char *tmpl, jv vars, char **out, size_t *len);

/* The same with the variables as the JSON text of an object (tests/tokenizer/). */
int fmoe__jinja_render(const char *tmpl, const char *vars_json, char **out, size_t *len);

/* Parses only (to tell at load whether the template can be interpreted). */
int fmoe__jinja_check(const char *tmpl);

#endif
