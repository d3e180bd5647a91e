/*
 * jinja_eval.c - runs a parsed template (see jinja.h): statements, expressions, scopes.
 *
 * Scopes follow jinja2's rules as chat templates meet them: each iteration of a for loop
 * has its own scope, so a "set" inside it is gone after the iteration (templates use
 * namespace() to carry values out), while "if" shares its enclosing scope; a macro runs in a scope whose parent is the
 * one it was defined in. Member access follows jinja2's getattr/getitem: a missing member
 * of a defined value is undefined, a member of an undefined value is an error; on a dict,
 * ".items" is the method and ["items"] the key. "and"/"or" return an operand, as Python's.
 *
 * Every node evaluated counts a step, and macro calls count depth, so a template that
 * loops for ever or recurses without end fails with FMOE_ERANGE in one line.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "jinja.h"

#define OOM() fmoe_error_set(FMOE_ENOMEM, "chat template: out of memory")

enum { FLOW_BREAK = 1, FLOW_CONTINUE = 2 };

typedef struct {
    jj_ctx c;
    jj_scope *sc;
    int edepth; /* eval() and run_stmt() calls on the C stack */
} state;

int jj_fail(jj_ctx *c, int code, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    for (char *p = msg; *p; p++)
        if (*p == '\n' || *p == '\r') *p = ' '; /* one line */
    return fmoe_error_set(code, "chat template line %d: %s", c->line, msg);
}

/* The line last evaluated, for the memory-limit error raised after the render unwinds. */
static _Thread_local int fmoe__jinja_last_line;

static int step(state *S, const jnode *x) {
    S->c.line = fmoe__jinja_last_line = x->line;
    if (++S->c.steps > JJ_MAX_STEPS)
        return jj_fail(&S->c, FMOE_ERANGE, "more than %u evaluation steps (a runaway loop?)",
                       JJ_MAX_STEPS);
    return 0;
}

/* ---- scopes ---------------------------------------------------------------------------- */

static int scope_push(state *S, jj_scope *parent) {
    jj_scope *s = jj_alloc(S->c.A, sizeof *s);
    if (!s) return OOM();
    s->up = parent;
    FMOE_FORWARD_IF_ERROR(jv_dict_new(S->c.A, &s->vars));
    S->sc = s;
    return 0;
}

static jv lookup(state *S, const char *name, size_t n) {
    for (jj_scope *s = S->sc; s; s = s->up) {
        jv *v = jv_dict_getn(s->vars, name, n);
        if (v) return *v;
    }
    return jv_undef();
}

static int assign(state *S, const char *name, jv v) {
    return jv_dict_set(S->c.A, S->sc->vars, jv_str(name), v);
}

/* ---- members --------------------------------------------------------------------------- */

static int get_attr(state *S, jv obj, const char *name, size_t n, jv *out) {
    if (obj.k == JV_UNDEF)
        return jj_fail(&S->c, FMOE_EINVAL, "'%.*s' of an undefined value (jinja2 raises "
                       "UndefinedError)", (int)n, name);
    if (obj.k == JV_DICT || obj.k == JV_NS) {
        if (obj.k == JV_DICT) {
            jv m = jj_method(&S->c, obj, name, n);
            if (m.k != JV_UNDEF) {
                *out = m;
                return 0;
            }
        }
        jv *v = jv_dict_getn(obj, name, n);
        *out = v ? *v : jv_undef();
        return 0;
    }
    *out = jj_method(&S->c, obj, name, n);
    return 0;
}

static int index_of(jv idx, size_t len, size_t *at) {
    if (idx.k != JV_INT && idx.k != JV_BOOL) return 0;
    int64_t i = idx.k == JV_INT ? idx.u.i : idx.u.b;
    if (i < 0) i += (int64_t)len;
    if (i < 0 || (uint64_t)i >= len) return 0;
    *at = (size_t)i;
    return 1;
}

static int get_item(state *S, jv obj, jv key, jv *out) {
    *out = jv_undef();
    size_t at;
    switch (obj.k) {
    case JV_UNDEF:
        return jj_fail(&S->c, FMOE_EINVAL, "subscript of an undefined value (jinja2 raises "
                       "UndefinedError)");
    case JV_LIST:
        if (obj.u.l->gen)
            return jj_fail(&S->c, FMOE_EINVAL, "'generator' object is not subscriptable");
        if (index_of(key, obj.u.l->n, &at)) *out = obj.u.l->v[at];
        return 0;
    case JV_STR: {
        size_t cps = jj_utf8_len(obj.u.s.s, obj.u.s.n);
        if (index_of(key, cps, &at)) {
            size_t a = jj_utf8_off(obj.u.s.s, obj.u.s.n, at);
            size_t b = jj_utf8_off(obj.u.s.s, obj.u.s.n, at + 1);
            *out = jv_strn(obj.u.s.s + a, b - a);
        }
        return 0;
    }
    case JV_DICT:
    case JV_NS: {
        jv *v = jv_dict_get(obj, key);
        if (v) *out = *v;
        else if (key.k == JV_STR && obj.k == JV_DICT)
            *out = jj_method(&S->c, obj, key.u.s.s, key.u.s.n);
        return 0;
    }
    default:
        if (key.k == JV_STR) *out = jj_method(&S->c, obj, key.u.s.s, key.u.s.n);
        return 0;
    }
}

/* Python's slice indices for a sequence of `len` items. */
static void slice_range(int has_a, int64_t a, int has_b, int64_t b, int64_t st, size_t len,
                        int64_t *from, int64_t *to) {
    int64_t n = (int64_t)len;
    if (st > 0) {
        a = has_a ? (a < 0 ? (a + n < 0 ? 0 : a + n) : (a > n ? n : a)) : 0;
        b = has_b ? (b < 0 ? (b + n < 0 ? 0 : b + n) : (b > n ? n : b)) : n;
    } else {
        a = has_a ? (a < 0 ? (a + n < 0 ? -1 : a + n) : (a >= n ? n - 1 : a)) : n - 1;
        b = has_b ? (b < 0 ? (b + n < 0 ? -1 : b + n) : (b >= n ? n - 1 : b)) : -1;
    }
    *from = a;
    *to = b;
}

static int eval(state *S, const jnode *x, jv *out);

static int eval_slice(state *S, const jnode *x, jv *out) {
    jv obj, part[3];
    int has[3];
    FMOE_FORWARD_IF_ERROR(eval(S, x->a, &obj));
    for (int k = 0; k < 3; k++) {
        part[k] = jv_none();
        if (x->kids[k]) FMOE_FORWARD_IF_ERROR(eval(S, x->kids[k], &part[k]));
        has[k] = part[k].k != JV_NONE;
        if (has[k] && part[k].k != JV_INT)
            return jj_fail(&S->c, FMOE_EINVAL, "slice indices must be integers");
    }
    int64_t st = has[2] ? part[2].u.i : 1;
    if (st == 0) return jj_fail(&S->c, FMOE_EINVAL, "slice step cannot be zero");
    if (obj.k == JV_UNDEF)
        return jj_fail(&S->c, FMOE_EINVAL, "slice of an undefined value");
    if (obj.k != JV_LIST && obj.k != JV_STR)
        return jj_fail(&S->c, FMOE_EINVAL, "a %s cannot be sliced", jv_kind_name(obj));
    size_t len = obj.k == JV_LIST ? obj.u.l->n : jj_utf8_len(obj.u.s.s, obj.u.s.n);
    int64_t a, b;
    slice_range(has[0], part[0].u.i, has[1], part[1].u.i, st, len, &a, &b);
    if (obj.k == JV_LIST) {
        FMOE_FORWARD_IF_ERROR(jv_list_new(S->c.A, 0, out));
        for (int64_t i = a; st > 0 ? i < b : i > b; i += st)
            FMOE_FORWARD_IF_ERROR(jv_list_push(S->c.A, *out, obj.u.l->v[i]));
        return 0;
    }
    const char *s = obj.u.s.s;
    size_t n = obj.u.s.n;
    if (st == 1) {
        size_t from = a < b ? jj_utf8_off(s, n, (size_t)a) : 0;
        size_t to = a < b ? jj_utf8_off(s, n, (size_t)b) : 0;
        *out = jv_strn(s + from, to - from);
        return 0;
    }
    jj_sb sb = {0};
    int rc = 0;
    for (int64_t i = a; rc == 0 && (st > 0 ? i < b : i > b); i += st) {
        size_t p = jj_utf8_off(s, n, (size_t)i), q = jj_utf8_off(s, n, (size_t)i + 1);
        rc = jj_sb_put(&sb, s + p, q - p);
    }
    if (rc == 0) {
        char *r = jj_strndup(S->c.A, sb.p ? sb.p : "", sb.n);
        if (!r) rc = OOM();
        else *out = jv_strn(r, sb.n);
    }
    free(sb.p);
    return rc;
}

/* ---- arithmetic ------------------------------------------------------------------------ */

static int is_num(jv v) { return v.k == JV_INT || v.k == JV_FLOAT || v.k == JV_BOOL; }
static double dnum(jv v) {
    return v.k == JV_FLOAT ? v.u.f : v.k == JV_INT ? (double)v.u.i : (double)v.u.b;
}
static int64_t inum(jv v) { return v.k == JV_INT ? v.u.i : v.u.b; }

static int concat(state *S, jv a, jv b, jv *out) {
    size_t n = a.u.s.n + b.u.s.n;
    if (n > JJ_MAX_OUTPUT) return jj_fail(&S->c, FMOE_ERANGE, "a string over %u bytes", JJ_MAX_OUTPUT);
    char *s = jj_alloc(S->c.A, n + 1);
    if (!s) return OOM();
    memcpy(s, a.u.s.s, a.u.s.n);
    memcpy(s + a.u.s.n, b.u.s.s, b.u.s.n);
    *out = jv_strn(s, n);
    return 0;
}

static int repeat(state *S, jv seq, int64_t times, jv *out) {
    if (times < 0) times = 0;
    size_t unit = seq.k == JV_STR ? seq.u.s.n : seq.u.l->n * sizeof(jv);
    if (unit && (uint64_t)times > JJ_MAX_OUTPUT / unit)
        return jj_fail(&S->c, FMOE_ERANGE, "a repetition over %u bytes", JJ_MAX_OUTPUT);
    if (seq.k == JV_STR) {
        size_t n = seq.u.s.n * (size_t)times;
        char *s = jj_alloc(S->c.A, n + 1);
        if (!s) return OOM();
        for (int64_t i = 0; i < times; i++) memcpy(s + (size_t)i * seq.u.s.n, seq.u.s.s, seq.u.s.n);
        *out = jv_strn(s, n);
        return 0;
    }
    FMOE_FORWARD_IF_ERROR(jv_list_new(S->c.A, seq.u.l->n * (size_t)times, out));
    for (int64_t i = 0; i < times; i++)
        for (size_t k = 0; k < seq.u.l->n; k++)
            FMOE_FORWARD_IF_ERROR(jv_list_push(S->c.A, *out, seq.u.l->v[k]));
    return 0;
}

static int binop(state *S, int op, jv a, jv b, jv *out) {
    if (op == '~') {
        jv sa, sb;
        FMOE_FORWARD_IF_ERROR(jv_to_str(S->c.A, a, &sa));
        FMOE_FORWARD_IF_ERROR(jv_to_str(S->c.A, b, &sb));
        return concat(S, sa, sb, out);
    }
    if (op == '+' && a.k == JV_STR && b.k == JV_STR) {
        if (a.safe != b.safe) { /* Markup + str escapes the str */
            FMOE_FORWARD_IF_ERROR(jj_html_escape(&S->c, a.safe ? b : a, a.safe ? &b : &a));
        }
        FMOE_FORWARD_IF_ERROR(concat(S, a, b, out));
        out->safe = a.safe;
        return 0;
    }
    if (op == '+' && a.k == JV_LIST && b.k == JV_LIST) {
        FMOE_FORWARD_IF_ERROR(jv_list_new(S->c.A, a.u.l->n + b.u.l->n, out));
        for (size_t i = 0; i < a.u.l->n; i++) FMOE_FORWARD_IF_ERROR(jv_list_push(S->c.A, *out, a.u.l->v[i]));
        for (size_t i = 0; i < b.u.l->n; i++) FMOE_FORWARD_IF_ERROR(jv_list_push(S->c.A, *out, b.u.l->v[i]));
        return 0;
    }
    if (op == '*' && (a.k == JV_STR || a.k == JV_LIST) && (b.k == JV_INT || b.k == JV_BOOL))
        return repeat(S, a, inum(b), out);
    if (op == '*' && (b.k == JV_STR || b.k == JV_LIST) && (a.k == JV_INT || a.k == JV_BOOL))
        return repeat(S, b, inum(a), out);
    if (op == '%' && a.k == JV_STR)
        return jj_fail(&S->c, FMOE_EUNSUPPORTED, "'%%' string formatting is not supported");
    if (!is_num(a) || !is_num(b)) {
        static const char *const N[] = {['+'] = "+", ['-'] = "-", ['*'] = "*", ['/'] = "/",
                                        ['%'] = "%", ['F'] = "//", ['P'] = "**"};
        return jj_fail(&S->c, FMOE_EINVAL, "unsupported operand types for %s: %s and %s", N[op],
                       jv_kind_name(a), jv_kind_name(b));
    }
    int ints = a.k != JV_FLOAT && b.k != JV_FLOAT;
    if (ints && op != '/' && op != 'P') {
        int64_t x = inum(a), y = inum(b), r;
        switch (op) {
        case '+':
            if (__builtin_add_overflow(x, y, &r)) goto overflow;
            break;
        case '-':
            if (__builtin_sub_overflow(x, y, &r)) goto overflow;
            break;
        case '*':
            if (__builtin_mul_overflow(x, y, &r)) goto overflow;
            break;
        case 'F':
        case '%': {
            if (y == 0) return jj_fail(&S->c, FMOE_EINVAL, "integer division or modulo by zero");
            if (x == INT64_MIN && y == -1) goto overflow;
            int64_t q = x / y, m = x % y;
            if (m != 0 && ((m < 0) != (y < 0))) {
                q -= 1;
                m += y;
            }
            r = op == 'F' ? q : m;
            break;
        }
        default: r = 0;
        }
        *out = jv_int(r);
        return 0;
    }
    if (ints && op == 'P' && inum(b) >= 0) {
        int64_t x = inum(a), y = inum(b), r = 1;
        for (int64_t i = 0; i < y; i++) {
            if (__builtin_mul_overflow(r, x, &r)) goto overflow;
            if (r == 0 || r == 1) break;
        }
        *out = jv_int(r);
        return 0;
    }
    double x = dnum(a), y = dnum(b), r;
    switch (op) {
    case '+': r = x + y; break;
    case '-': r = x - y; break;
    case '*': r = x * y; break;
    case '/':
        if (y == 0) return jj_fail(&S->c, FMOE_EINVAL, "division by zero");
        r = x / y;
        break;
    case 'F':
        if (y == 0) return jj_fail(&S->c, FMOE_EINVAL, "float floor division by zero");
        r = floor(x / y);
        break;
    case '%':
        if (y == 0) return jj_fail(&S->c, FMOE_EINVAL, "float modulo by zero");
        r = fmod(x, y);
        if (r != 0 && ((r < 0) != (y < 0))) r += y;
        break;
    default: r = pow(x, y); break;
    }
    *out = jv_float(r);
    return 0;
overflow:
    return jj_fail(&S->c, FMOE_ERANGE, "integer overflow (Python would use a big integer)");
}

static int contains(state *S, jv hay, jv needle, int *in) {
    *in = 0;
    switch (hay.k) {
    case JV_UNDEF: return 0;
    case JV_STR:
        if (needle.k != JV_STR)
            return jj_fail(&S->c, FMOE_EINVAL, "'in <string>' requires string as left operand, "
                           "not %s", jv_kind_name(needle));
        if (needle.u.s.n == 0) *in = 1;
        for (size_t i = 0; !*in && i + needle.u.s.n <= hay.u.s.n; i++)
            *in = memcmp(hay.u.s.s + i, needle.u.s.s, needle.u.s.n) == 0;
        return 0;
    case JV_LIST:
        for (size_t i = 0; !*in && i < hay.u.l->n; i++) *in = jv_eq(hay.u.l->v[i], needle);
        return 0;
    case JV_DICT:
    case JV_NS: *in = jv_dict_get(hay, needle) != NULL; return 0;
    default:
        return jj_fail(&S->c, FMOE_EINVAL, "argument of type %s is not iterable",
                       jv_kind_name(hay));
    }
}

static int compare(state *S, int op, jv a, jv b, jv *out) {
    int r = 0, c;
    switch (op) {
    case 'e': r = jv_eq(a, b); break;
    case 'n': r = !jv_eq(a, b); break;
    case 'i': FMOE_FORWARD_IF_ERROR(contains(S, b, a, &r)); break;
    case 'I':
        FMOE_FORWARD_IF_ERROR(contains(S, b, a, &r));
        r = !r;
        break;
    default:
        if (jv_cmp(a, b, &c) < 0) return jj_fail(&S->c, FMOE_EINVAL, "%s", fmoe_error_detail());
        r = op == '<' ? c < 0 : op == '>' ? c > 0 : op == 'l' ? c <= 0 : c >= 0;
    }
    *out = jv_bool(r);
    return 0;
}

/* ---- calls ----------------------------------------------------------------------------- */

static int run_body(state *S, const jnode *body);

/* Runs `body` with output captured into a string. */
static int capture(state *S, const jnode *body, jv *out) {
    jj_sb sb = {0}, *saved = S->c.out;
    S->c.out = &sb;
    int rc = run_body(S, body);
    S->c.out = saved;
    if (rc >= 0) {
        char *s = jj_strndup(S->c.A, sb.p ? sb.p : "", sb.n);
        if (!s) rc = OOM();
        else *out = jv_strn(s, sb.n);
    }
    free(sb.p);
    return rc < 0 ? rc : 0;
}

static int call_macro(state *S, const jj_macro *m, const jv *args, size_t nargs,
                      const char *const *kwn, const jv *kw, size_t nkw, jv *out) {
    const jnode *def = m->node;
    if (nargs > def->nkids)
        return jj_fail(&S->c, FMOE_EINVAL, "macro '%s' takes %zu arguments, %zu given", def->s,
                       def->nkids, nargs);
    if (++S->c.depth > JJ_MAX_DEPTH)
        return jj_fail(&S->c, FMOE_ERANGE, "macro calls nested more than %d deep", JJ_MAX_DEPTH);
    jj_scope *saved = S->sc;
    int rc = scope_push(S, m->scope);
    for (size_t p = 0; rc == 0 && p < def->nkids; p++) {
        const jnode *param = def->kids[p];
        jv v = jv_undef();
        int have = 0;
        if (p < nargs) {
            v = args[p];
            have = 1;
        }
        for (size_t k = 0; k < nkw; k++)
            if (strlen(kwn[k]) == param->n && memcmp(kwn[k], param->s, param->n) == 0) {
                v = kw[k];
                have = 1;
            }
        if (!have && param->a) rc = eval(S, param->a, &v);
        if (rc == 0) rc = jv_dict_set(S->c.A, S->sc->vars, jv_strn(param->s, param->n), v);
    }
    for (size_t k = 0; rc == 0 && k < nkw; k++) {
        int known = 0;
        for (size_t p = 0; p < def->nkids; p++)
            known |= strlen(kwn[k]) == def->kids[p]->n &&
                     memcmp(kwn[k], def->kids[p]->s, def->kids[p]->n) == 0;
        if (!known)
            rc = jj_fail(&S->c, FMOE_EINVAL, "macro '%s' takes no keyword argument '%s'", def->s,
                         kwn[k]);
    }
    if (rc == 0) rc = capture(S, def->b, out);
    S->sc = saved;
    S->c.depth--;
    return rc;
}

/* The state behind a jj_ctx (its first member), for calls that come back through one. */
static state *of(jj_ctx *c) { return (state *)c; }

/* Calls a value (macro, global, bound method) with positional args and keyword args
 * (kwn[i] names kw[i]). */
static int jj_call(jj_ctx *c, jv f, const jv *args, size_t nargs, const char *const *kwn,
                   const jv *kw, size_t nkw, jv *out) {
    *out = jv_undef();
    if (f.k == JV_MACRO) return call_macro(of(c), f.u.m, args, nargs, kwn, kw, nkw, out);
    if (f.k == JV_FUNC) return jj_call_builtin(c, f.u.fn, args, nargs, kwn, kw, nkw, out);
    if (f.k == JV_UNDEF) return jj_fail(c, FMOE_EINVAL, "call of an undefined value");
    return jj_fail(c, FMOE_EINVAL, "a %s is not callable", jv_kind_name(f));
}

/* Evaluates call arguments: positional into args, keyword into kwn/kw. */
static int eval_args(state *S, const jnode *x, size_t first, jv *args, size_t *nargs,
                     const char **kwn, jv *kw, size_t *nkw) {
    for (size_t i = 0; i < x->nkids; i++) {
        const jnode *k = x->kids[i];
        if (k->k == JN_KWARG) {
            char *name = jj_strndup(S->c.A, k->s, k->n);
            if (!name) return OOM();
            kwn[*nkw] = name;
            FMOE_FORWARD_IF_ERROR(eval(S, k->a, &kw[(*nkw)++]));
        } else {
            FMOE_FORWARD_IF_ERROR(eval(S, k, &args[first + (*nargs)++]));
        }
    }
    return 0;
}

static int eval_call(state *S, const jnode *x, jv *out) {
    jv f;
    FMOE_FORWARD_IF_ERROR(eval(S, x->a, &f));
    if (f.k == JV_UNDEF && x->a->k == JN_NAME)
        return jj_fail(&S->c, FMOE_EINVAL, "'%.*s' is undefined", (int)x->a->n, x->a->s);
    jv *args = jj_alloc(S->c.A, (x->nkids + 1) * sizeof *args);
    jv *kw = jj_alloc(S->c.A, (x->nkids + 1) * sizeof *kw);
    const char **kwn = jj_alloc(S->c.A, (x->nkids + 1) * sizeof *kwn);
    if (!args || !kw || !kwn) return OOM();
    size_t na = 0, nk = 0;
    FMOE_FORWARD_IF_ERROR(eval_args(S, x, 0, args, &na, kwn, kw, &nk));
    S->c.line = x->line;
    return jj_call(&S->c, f, args, na, kwn, kw, nk, out);
}

/* A filter node over `value`. */
static int apply_filter(state *S, const jnode *x, jv value, jv *out) {
    jv *args = jj_alloc(S->c.A, (x->nkids + 1) * sizeof *args);
    jv *kw = jj_alloc(S->c.A, (x->nkids + 1) * sizeof *kw);
    const char **kwn = jj_alloc(S->c.A, (x->nkids + 1) * sizeof *kwn);
    if (!args || !kw || !kwn) return OOM();
    args[0] = value;
    size_t na = 0, nk = 0;
    FMOE_FORWARD_IF_ERROR(eval_args(S, x, 1, args, &na, kwn, kw, &nk));
    char name[64];
    snprintf(name, sizeof name, "%.*s", (int)x->n, x->s);
    S->c.line = x->line;
    int rc = jj_filter(&S->c, name, args, na + 1, kwn, kw, nk, out);
    if (rc == 0)
        return jj_fail(&S->c, FMOE_EUNSUPPORTED, "filter '%s' is not supported", name);
    return rc < 0 ? rc : 0;
}

static int eval_test(state *S, const jnode *x, jv *out) {
    jv *args = jj_alloc(S->c.A, (x->nkids + 1) * sizeof *args);
    if (!args) return OOM();
    char name[64];
    snprintf(name, sizeof name, "%.*s", (int)x->n, x->s);
    /* "defined" must not fail on a member of an undefined value? jinja2 fails too, so the
     * operand is evaluated the ordinary way */
    FMOE_FORWARD_IF_ERROR(eval(S, x->a, &args[0]));
    for (size_t i = 0; i < x->nkids; i++) {
        if (x->kids[i]->k == JN_KWARG)
            return jj_fail(&S->c, FMOE_EUNSUPPORTED, "keyword arguments to test '%s'", name);
        FMOE_FORWARD_IF_ERROR(eval(S, x->kids[i], &args[i + 1]));
    }
    int r;
    S->c.line = x->line;
    int rc = jj_test(&S->c, name, args, x->nkids + 1, &r);
    if (rc == 0) return jj_fail(&S->c, FMOE_EUNSUPPORTED, "test '%s' is not supported", name);
    if (rc < 0) return rc;
    *out = jv_bool(x->op ? !r : r);
    return 0;
}

/* ---- expressions ----------------------------------------------------------------------- */

static int eval_node(state *S, const jnode *x, jv *out);

/* Expressions recurse on the C stack, and a chain like 1+1+...+1 is as deep as it is long:
 * the depth is bounded here so that a long chain fails instead of overflowing the stack. */
static int eval(state *S, const jnode *x, jv *out) {
    if (S->edepth >= JJ_MAX_EVAL_DEPTH)
        return jj_fail(&S->c, FMOE_ERANGE, "expressions nested more than %d deep",
                       JJ_MAX_EVAL_DEPTH);
    S->edepth++;
    int rc = eval_node(S, x, out);
    S->edepth--;
    return rc;
}

static int eval_node(state *S, const jnode *x, jv *out) {
    FMOE_FORWARD_IF_ERROR(step(S, x));
    jv a, b;
    switch (x->k) {
    case JN_LIT: *out = x->lit; return 0;
    case JN_NAME: *out = lookup(S, x->s, x->n); return 0;
    case JN_LIST:
        FMOE_FORWARD_IF_ERROR(jv_list_new(S->c.A, x->nkids, out));
        out->u.l->tuple = x->op;
        for (size_t i = 0; i < x->nkids; i++) {
            FMOE_FORWARD_IF_ERROR(eval(S, x->kids[i], &a));
            FMOE_FORWARD_IF_ERROR(jv_list_push(S->c.A, *out, a));
        }
        return 0;
    case JN_DICT:
        FMOE_FORWARD_IF_ERROR(jv_dict_new(S->c.A, out));
        for (size_t i = 0; i + 1 < x->nkids; i += 2) {
            FMOE_FORWARD_IF_ERROR(eval(S, x->kids[i], &a));
            FMOE_FORWARD_IF_ERROR(eval(S, x->kids[i + 1], &b));
            FMOE_FORWARD_IF_ERROR(jv_dict_set(S->c.A, *out, a, b));
        }
        return 0;
    case JN_ATTR:
        FMOE_FORWARD_IF_ERROR(eval(S, x->a, &a));
        S->c.line = x->line;
        return get_attr(S, a, x->s, x->n, out);
    case JN_ITEM:
        FMOE_FORWARD_IF_ERROR(eval(S, x->a, &a));
        FMOE_FORWARD_IF_ERROR(eval(S, x->b, &b));
        S->c.line = x->line;
        return get_item(S, a, b, out);
    case JN_SLICE: return eval_slice(S, x, out);
    case JN_CALL: return eval_call(S, x, out);
    case JN_FILTER:
        FMOE_FORWARD_IF_ERROR(eval(S, x->a, &a));
        return apply_filter(S, x, a, out);
    case JN_TEST: return eval_test(S, x, out);
    case JN_BINOP:
        FMOE_FORWARD_IF_ERROR(eval(S, x->a, &a));
        FMOE_FORWARD_IF_ERROR(eval(S, x->b, &b));
        S->c.line = x->line;
        if (x->op != '~' && (a.k == JV_UNDEF || b.k == JV_UNDEF))
            return jj_fail(&S->c, FMOE_EINVAL, "arithmetic on an undefined value (jinja2 raises "
                           "UndefinedError)");
        return binop(S, x->op, a, b, out);
    case JN_CMP:
        FMOE_FORWARD_IF_ERROR(eval(S, x->a, &a));
        FMOE_FORWARD_IF_ERROR(eval(S, x->b, &b));
        S->c.line = x->line;
        return compare(S, x->op, a, b, out);
    case JN_AND:
    case JN_OR:
        FMOE_FORWARD_IF_ERROR(eval(S, x->a, &a));
        if (jv_truthy(a) == (x->k == JN_OR)) {
            *out = a;
            return 0;
        }
        return eval(S, x->b, out);
    case JN_NOT:
        FMOE_FORWARD_IF_ERROR(eval(S, x->a, &a));
        *out = jv_bool(!jv_truthy(a));
        return 0;
    case JN_NEG:
    case JN_POS:
        FMOE_FORWARD_IF_ERROR(eval(S, x->a, &a));
        if (!is_num(a))
            return jj_fail(&S->c, FMOE_EINVAL, "bad operand type for unary %c: %s",
                           x->k == JN_NEG ? '-' : '+', jv_kind_name(a));
        if (x->k == JN_POS) *out = a.k == JV_BOOL ? jv_int(a.u.b) : a;
        else *out = a.k == JV_FLOAT ? jv_float(-a.u.f) : jv_int(-inum(a));
        return 0;
    case JN_COND:
        FMOE_FORWARD_IF_ERROR(eval(S, x->a, &a));
        if (jv_truthy(a)) return eval(S, x->b, out);
        if (x->c) return eval(S, x->c, out);
        *out = jv_undef();
        return 0;
    default:
        return jj_fail(&S->c, FMOE_EINTERNAL, "node %d is not an expression", (int)x->k);
    }
}

/* ---- statements ------------------------------------------------------------------------ */

static int unpack(state *S, const jnode *x, jv v) {
    if (x->nnames == 1) return assign(S, x->names[0], v);
    if (v.k != JV_LIST || v.u.l->n != x->nnames)
        return jj_fail(&S->c, FMOE_EINVAL, "cannot unpack a %s into %zu names", jv_kind_name(v),
                       x->nnames);
    for (size_t i = 0; i < x->nnames; i++)
        FMOE_FORWARD_IF_ERROR(assign(S, x->names[i], v.u.l->v[i]));
    return 0;
}

/* loop.*: built on the first iteration, then its values updated in place. */
static int set_loop(state *S, jv items, size_t i, jv *loop) {
    jj_arena *A = S->c.A;
    size_t n = items.u.l->n;
    jj_func *cyc;
    if (loop->k == JV_DICT) {
        cyc = jv_dict_getn(*loop, "cycle", 5)->u.fn;
    } else {
        FMOE_FORWARD_IF_ERROR(jv_dict_new(A, loop));
        if (!(cyc = jj_alloc(A, sizeof *cyc))) return OOM();
    }
    cyc->name = "cycle";
    cyc->self = jv_int((int64_t)i);
    struct {
        const char *k;
        jv v;
    } f[] = {
        {"index", jv_int((int64_t)i + 1)},
        {"index0", jv_int((int64_t)i)},
        {"revindex", jv_int((int64_t)(n - i))},
        {"revindex0", jv_int((int64_t)(n - i - 1))},
        {"first", jv_bool(i == 0)},
        {"last", jv_bool(i + 1 == n)},
        {"length", jv_int((int64_t)n)},
        {"depth", jv_int(1)},
        {"depth0", jv_int(0)},
        {"previtem", i > 0 ? items.u.l->v[i - 1] : jv_undef()},
        {"nextitem", i + 1 < n ? items.u.l->v[i + 1] : jv_undef()},
        {"cycle", (jv){.k = JV_FUNC, .u.fn = cyc}},
    };
    if (loop->u.d->n == sizeof f / sizeof f[0]) { /* keys in place: write the values */
        for (size_t k = 0; k < sizeof f / sizeof f[0]; k++) loop->u.d->val[k] = f[k].v;
        return 0;
    }
    for (size_t k = 0; k < sizeof f / sizeof f[0]; k++)
        FMOE_FORWARD_IF_ERROR(jv_dict_set(A, *loop, jv_str(f[k].k), f[k].v));
    return 0;
}

static int run_for(state *S, const jnode *x) {
    jv seq, items;
    FMOE_FORWARD_IF_ERROR(eval(S, x->a, &seq));
    if (seq.k == JV_NONE || (seq.k != JV_UNDEF && seq.k != JV_LIST && seq.k != JV_DICT &&
                             seq.k != JV_STR))
        return jj_fail(&S->c, FMOE_EINVAL, "'%s' object is not iterable",
                       seq.k == JV_NONE ? "NoneType" : jv_kind_name(seq));
    FMOE_FORWARD_IF_ERROR(jj_iterable(&S->c, seq, &items));
    jj_scope *saved = S->sc;
    int rc = scope_push(S, saved);
    if (rc == 0 && x->d) { /* "for x in xs if cond": the loop sees only the kept items */
        jv kept;
        rc = jv_list_new(S->c.A, items.u.l->n, &kept);
        for (size_t i = 0; rc == 0 && i < items.u.l->n; i++) {
            jv ok;
            rc = unpack(S, x, items.u.l->v[i]);
            if (rc == 0) rc = eval(S, x->d, &ok);
            if (rc == 0 && jv_truthy(ok)) rc = jv_list_push(S->c.A, kept, items.u.l->v[i]);
        }
        items = kept;
    }
    jv loop = jv_undef();
    for (size_t i = 0; rc == 0 && i < items.u.l->n; i++) {
        /* each iteration starts afresh: a "set" in the body is seen by the rest of that
         * iteration only, and reads the enclosing value before it (jinja2's scoping). The
         * scope's and loop's storage is reused, so a long loop does not grow memory. */
        S->sc->vars.u.d->n = 0;
        rc = step(S, x);
        if (rc == 0) rc = unpack(S, x, items.u.l->v[i]);
        if (rc == 0) rc = set_loop(S, items, i, &loop);
        if (rc == 0) rc = assign(S, "loop", loop);
        if (rc == 0) rc = run_body(S, x->b);
        if (rc == FLOW_CONTINUE) rc = 0;
        if (rc == FLOW_BREAK) {
            rc = 0;
            break;
        }
    }
    S->sc = saved;
    if (rc == 0 && items.u.l->n == 0 && x->c) rc = run_body(S, x->c);
    return rc;
}

static int run_set(state *S, const jnode *x) {
    jv v;
    if (x->a) FMOE_FORWARD_IF_ERROR(eval(S, x->a, &v));
    else FMOE_FORWARD_IF_ERROR(capture(S, x->b, &v));
    if (x->s2) {
        jv ns = lookup(S, x->names[0], strlen(x->names[0]));
        if (ns.k != JV_NS)
            return jj_fail(&S->c, FMOE_EINVAL, "cannot assign attribute '%s' on '%s' (a %s, not "
                           "a namespace)", x->s2, x->names[0], jv_kind_name(ns));
        return jv_dict_set(S->c.A, ns, jv_str(x->s2), v);
    }
    return unpack(S, x, v);
}

static int run_stmt_node(state *S, const jnode *x);

/* Statements count against the same C-stack bound as expressions: a macro that recurses
 * through deeply nested blocks stacks both. */
static int run_stmt(state *S, const jnode *x) {
    if (S->edepth >= JJ_MAX_EVAL_DEPTH)
        return jj_fail(&S->c, FMOE_ERANGE, "expressions nested more than %d deep",
                       JJ_MAX_EVAL_DEPTH);
    S->edepth++;
    int rc = run_stmt_node(S, x);
    S->edepth--;
    return rc;
}

static int run_stmt_node(state *S, const jnode *x) {
    FMOE_FORWARD_IF_ERROR(step(S, x));
    jv v;
    switch (x->k) {
    case JN_TEXT: return jj_sb_put(S->c.out, x->s, x->n);
    case JN_OUTPUT:
        FMOE_FORWARD_IF_ERROR(eval(S, x->a, &v));
        return jv_to_sb(S->c.out, v);
    case JN_IF:
        FMOE_FORWARD_IF_ERROR(eval(S, x->a, &v));
        if (jv_truthy(v)) return run_body(S, x->b);
        if (!x->c) return 0;
        return x->c->k == JN_IF ? run_stmt(S, x->c) : run_body(S, x->c);
    case JN_FOR: return run_for(S, x);
    case JN_SET: return run_set(S, x);
    case JN_MACRO: {
        jj_macro *m = jj_alloc(S->c.A, sizeof *m);
        if (!m) return OOM();
        m->node = x;
        m->scope = S->sc;
        return jv_dict_set(S->c.A, S->sc->vars, jv_str(x->s), (jv){.k = JV_MACRO, .u.m = m});
    }
    case JN_FILTERBLOCK: {
        FMOE_FORWARD_IF_ERROR(capture(S, x->b, &v));
        /* the chain was parsed innermost-last: collect and apply from the first */
        const jnode *chain[32];
        size_t n = 0;
        for (const jnode *f = x->a; f && n < 32; f = f->a) chain[n++] = f;
        while (n-- > 0) FMOE_FORWARD_IF_ERROR(apply_filter(S, chain[n], v, &v));
        return jv_to_sb(S->c.out, v);
    }
    case JN_BREAK: return FLOW_BREAK;
    case JN_CONTINUE: return FLOW_CONTINUE;
    case JN_BODY: return run_body(S, x);
    default:
        return jj_fail(&S->c, FMOE_EINTERNAL, "node %d is not a statement", (int)x->k);
    }
}

static int run_body(state *S, const jnode *body) {
    if (!body) return 0;
    for (size_t i = 0; i < body->nkids; i++) {
        int rc = run_stmt(S, body->kids[i]);
        if (rc != 0) return rc;
    }
    return 0;
}

int jj_render(jj_arena *A, const jnode *root, jv vars, jj_sb *out) {
    state S = {.c = {.A = A, .out = out}};
    static const char *const GLOBALS[] = {"range", "dict", "namespace", "raise_exception",
                                          "strftime_now", "joiner", "cycler", NULL};
    FMOE_FORWARD_IF_ERROR(scope_push(&S, NULL));
    for (int g = 0; GLOBALS[g]; g++) {
        jj_func *f = jj_alloc(A, sizeof *f);
        if (!f) return OOM();
        f->name = GLOBALS[g];
        FMOE_FORWARD_IF_ERROR(assign(&S, GLOBALS[g], (jv){.k = JV_FUNC, .u.fn = f}));
    }
    /* the caller's variables sit in a scope above the globals, so they may shadow them */
    FMOE_FORWARD_IF_ERROR(scope_push(&S, S.sc));
    for (size_t i = 0; i < vars.u.d->n; i++)
        FMOE_FORWARD_IF_ERROR(jv_dict_set(A, S.sc->vars, vars.u.d->key[i], vars.u.d->val[i]));
    /* template-level sets go into their own scope, so that they never change the caller's */
    FMOE_FORWARD_IF_ERROR(scope_push(&S, S.sc));
    int rc = run_body(&S, root);
    if (rc > 0)
        return fmoe_error_set(FMOE_EFORMAT, "chat template line %d: 'break' or 'continue' "
                              "outside a loop", S.c.line);
    return rc;
}

/* ---- whole-template entry points ------------------------------------------------------- */

static int parse_all(jj_arena *A, const char *tmpl, jnode **root) {
    jj_token *toks;
    size_t n;
    FMOE_FORWARD_IF_ERROR(jj_lex(A, tmpl, strlen(tmpl), &toks, &n));
    return jj_parse(A, toks, n, root);
}

int fmoe__jinja_check(const char *tmpl) {
    jj_arena *A = jj_arena_new();
    if (!A) return OOM();
    jnode *root;
    int rc = parse_all(A, tmpl, &root);
    jj_arena_free(A);
    return rc;
}

int fmoe__jinja_render_vars(jj_arena *A, const char *tmpl, jv vars, char **out, size_t *len) {
    *out = NULL;
    if (len) *len = 0;
    jnode *root;
    jj_sb sb = {0};
    int rc = parse_all(A, tmpl, &root);
    if (rc == 0 && vars.k != JV_DICT)
        rc = fmoe_error_set(FMOE_EINVAL, "chat template: the variables must be an object");
    if (rc == 0) rc = jj_render(A, root, vars, &sb);
    if (rc == 0 && !sb.p) rc = jj_sb_put(&sb, "", 0);
    if (rc == FMOE_ENOMEM && jj_arena_over(A))
        rc = fmoe_error_set(FMOE_ERANGE, "chat template line %d: more than %zu MiB of working "
                            "memory (a runaway template?)", fmoe__jinja_last_line,
                            JJ_MAX_ARENA >> 20);
    /* the values' own errors (printing, JSON, output size) do not know the line */
    if (rc < 0 && strncmp(fmoe_error_detail(), "chat template", 13) != 0)
        fmoe_error_prefix("chat template line %d", fmoe__jinja_last_line);
    if (rc < 0) {
        free(sb.p);
        return rc;
    }
    *out = sb.p;
    if (len) *len = sb.n;
    return 0;
}

int fmoe__jinja_render(const char *tmpl, const char *vars_json, char **out, size_t *len) {
    *out = NULL;
    jj_arena *A = jj_arena_new();
    if (!A) return OOM();
    jv vars;
    int rc = jv_parse_json(A, vars_json, strlen(vars_json), "chat template variables", &vars);
    if (rc == 0) rc = fmoe__jinja_render_vars(A, tmpl, vars, out, len);
    jj_arena_free(A);
    return rc;
}
