/*
 * jinja_parse.c - tokens to a syntax tree (see jinja.h for the node kinds).
 *
 * Recursive descent with jinja2's precedence, lowest first: inline if/else, or, and, not,
 * comparisons (==, !=, <, <=, >, >=, in, not in), + and -, ~, * / // %, **, unary - and +,
 * then a primary with its postfix (.attr, [item or slice], (call)) and filters and tests
 * (| name(args), is [not] name arg). A for loop's iterable is parsed without the inline if,
 * so that "for x in xs if cond" filters the loop, as in jinja2. Statements that chat
 * templates do not use (include, extends, import, block, call, do, ...) are refused by name.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "jinja.h"

typedef struct {
    jj_arena *A;
    const jj_token *t;
    size_t n, i;
    int depth;
} parser;

#define OOM() fmoe_error_set(FMOE_ENOMEM, "chat template: out of memory")

static const jj_token *cur(parser *P) { return &P->t[P->i]; }

static int is_name(const jj_token *t, const char *w) {
    return t->k == JT_NAME && t->n == strlen(w) && memcmp(t->s, w, t->n) == 0;
}
static int is_op(const jj_token *t, const char *o) {
    return t->k == JT_OP && t->n == strlen(o) && memcmp(t->s, o, t->n) == 0;
}

static const char *tok_text(const jj_token *t, char *buf, size_t cap) {
    switch (t->k) {
    case JT_TEXT: return "template text";
    case JT_VAR_BEGIN: return "'{{'";
    case JT_VAR_END: return "'}}'";
    case JT_BLOCK_BEGIN: return "'{%'";
    case JT_BLOCK_END: return "'%}'";
    case JT_EOF: return "the end of the template";
    case JT_STRING: return "a string";
    case JT_INT:
    case JT_FLOAT: return "a number";
    default: snprintf(buf, cap, "'%.*s'", (int)(t->n > 40 ? 40 : t->n), t->s); return buf;
    }
}

static int unexpected(parser *P, const char *wanted) {
    char buf[64];
    const jj_token *t = cur(P);
    return fmoe_error_set(FMOE_EFORMAT, "chat template line %d: expected %s, found %s", t->line,
                          wanted, tok_text(t, buf, sizeof buf));
}

static int expect_op(parser *P, const char *o) {
    if (!is_op(cur(P), o)) {
        char w[16];
        snprintf(w, sizeof w, "'%s'", o);
        return unexpected(P, w);
    }
    P->i++;
    return 0;
}

static int expect_k(parser *P, jt_kind k, const char *what) {
    if (cur(P)->k != k) return unexpected(P, what);
    P->i++;
    return 0;
}

static jnode *node(parser *P, jn_kind k, int line) {
    jnode *x = jj_alloc(P->A, sizeof *x);
    if (x) {
        x->k = k;
        x->line = line;
    }
    return x;
}

typedef struct {
    jnode **v;
    size_t n, cap;
} nodes;

static int add(parser *P, nodes *L, jnode *x) {
    if (L->n == L->cap) {
        size_t cap = L->cap ? L->cap * 2 : 4;
        jnode **nv = jj_alloc(P->A, cap * sizeof *nv);
        if (!nv) return OOM();
        if (L->n) memcpy(nv, L->v, L->n * sizeof *nv);
        L->v = nv;
        L->cap = cap;
    }
    L->v[L->n++] = x;
    return 0;
}

static int enter(parser *P) {
    if (++P->depth > JJ_MAX_DEPTH)
        return fmoe_error_set(FMOE_ERANGE, "chat template line %d: nested more than %d deep",
                              cur(P)->line, JJ_MAX_DEPTH);
    return 0;
}

/* ---- expressions ----------------------------------------------------------------------- */

static int parse_expr(parser *P, int with_cond, jnode **out);
static int parse_unary(parser *P, int with_filter, jnode **out);
static int parse_primary(parser *P, jnode **out);
static int parse_postfix(parser *P, jnode **x);

/* "(" args ")" with the "(" current; keyword arguments become JN_KWARG. */
static int parse_call_args(parser *P, jnode *call) {
    nodes L = {0};
    FMOE_FORWARD_IF_ERROR(expect_op(P, "("));
    while (!is_op(cur(P), ")")) {
        if (L.n) FMOE_FORWARD_IF_ERROR(expect_op(P, ","));
        if (is_op(cur(P), ")")) break; /* trailing comma */
        if (is_op(cur(P), "*") || is_op(cur(P), "**"))
            return fmoe_error_set(FMOE_EUNSUPPORTED,
                                  "chat template line %d: '*args' / '**kwargs' in a call are "
                                  "not supported", cur(P)->line);
        jnode *arg;
        if (cur(P)->k == JT_NAME && is_op(&P->t[P->i + 1], "=")) {
            arg = node(P, JN_KWARG, cur(P)->line);
            if (!arg) return OOM();
            arg->s = cur(P)->s;
            arg->n = cur(P)->n;
            P->i += 2;
            FMOE_FORWARD_IF_ERROR(parse_expr(P, 1, &arg->a));
        } else {
            FMOE_FORWARD_IF_ERROR(parse_expr(P, 1, &arg));
        }
        FMOE_FORWARD_IF_ERROR(add(P, &L, arg));
    }
    P->i++;
    call->kids = L.v;
    call->nkids = L.n;
    return 0;
}

/* Filters and tests after a value: "| name(args)" and "is [not] name arg". */
static int parse_filters(parser *P, jnode **x) {
    for (;;) {
        const jj_token *t = cur(P);
        if (is_op(t, "|")) {
            P->i++;
            if (cur(P)->k != JT_NAME) return unexpected(P, "a filter name");
            jnode *f = node(P, JN_FILTER, cur(P)->line);
            if (!f) return OOM();
            f->s = cur(P)->s;
            f->n = cur(P)->n;
            P->i++;
            f->a = *x;
            if (is_op(cur(P), "(")) FMOE_FORWARD_IF_ERROR(parse_call_args(P, f));
            *x = f;
        } else if (is_name(t, "is")) {
            P->i++;
            jnode *f = node(P, JN_TEST, t->line);
            if (!f) return OOM();
            if (is_name(cur(P), "not")) {
                f->op = 1;
                P->i++;
            }
            if (cur(P)->k != JT_NAME) return unexpected(P, "a test name");
            f->s = cur(P)->s;
            f->n = cur(P)->n;
            P->i++;
            f->a = *x;
            const jj_token *u = cur(P);
            if (is_op(u, "(")) {
                FMOE_FORWARD_IF_ERROR(parse_call_args(P, f));
            } else if ((u->k == JT_NAME || u->k == JT_STRING || u->k == JT_INT ||
                        u->k == JT_FLOAT || is_op(u, "[") || is_op(u, "{")) &&
                       !is_name(u, "else") && !is_name(u, "or") && !is_name(u, "and")) {
                /* one argument without parentheses: "x is divisibleby 3" */
                jnode *arg;
                FMOE_FORWARD_IF_ERROR(parse_primary(P, &arg));
                FMOE_FORWARD_IF_ERROR(parse_postfix(P, &arg));
                f->kids = jj_alloc(P->A, sizeof *f->kids);
                if (!f->kids) return OOM();
                f->kids[0] = arg;
                f->nkids = 1;
            }
            *x = f;
        } else {
            return 0;
        }
    }
}

static int parse_subscript(parser *P, jnode *base, jnode **out) {
    int line = cur(P)->line;
    jnode *parts[3] = {NULL, NULL, NULL};
    int k = 0, slice = 0;
    for (;;) {
        if (is_op(cur(P), "]")) break;
        if (is_op(cur(P), ":")) {
            slice = 1;
            if (++k > 2) return unexpected(P, "']'");
            P->i++;
            continue;
        }
        if (parts[k]) return unexpected(P, "':' or ']'");
        FMOE_FORWARD_IF_ERROR(parse_expr(P, 1, &parts[k]));
    }
    P->i++;
    jnode *x = node(P, slice ? JN_SLICE : JN_ITEM, line);
    if (!x) return OOM();
    x->a = base;
    if (slice) {
        x->kids = jj_alloc(P->A, 3 * sizeof *x->kids);
        if (!x->kids) return OOM();
        memcpy(x->kids, parts, sizeof parts);
        x->nkids = 3;
    } else {
        if (!parts[0]) return unexpected(P, "an index");
        x->b = parts[0];
    }
    *out = x;
    return 0;
}

static int parse_postfix(parser *P, jnode **x) {
    for (;;) {
        const jj_token *t = cur(P);
        if (is_op(t, ".")) {
            P->i++;
            const jj_token *u = cur(P);
            if (u->k == JT_NAME) {
                jnode *a = node(P, JN_ATTR, u->line);
                if (!a) return OOM();
                a->a = *x;
                a->s = u->s;
                a->n = u->n;
                P->i++;
                *x = a;
            } else if (u->k == JT_INT) { /* x.0 is x[0] */
                jnode *a = node(P, JN_ITEM, u->line), *l = node(P, JN_LIT, u->line);
                if (!a || !l) return OOM();
                l->lit = jv_int(u->i);
                a->a = *x;
                a->b = l;
                P->i++;
                *x = a;
            } else {
                return unexpected(P, "an attribute name");
            }
        } else if (is_op(t, "[")) {
            P->i++;
            FMOE_FORWARD_IF_ERROR(parse_subscript(P, *x, x));
        } else if (is_op(t, "(")) {
            jnode *c = node(P, JN_CALL, t->line);
            if (!c) return OOM();
            c->a = *x;
            FMOE_FORWARD_IF_ERROR(parse_call_args(P, c));
            *x = c;
        } else {
            return 0;
        }
    }
}

static int parse_seq(parser *P, jn_kind k, const char *close, jnode **out) {
    jnode *x = node(P, k, cur(P)->line);
    if (!x) return OOM();
    nodes L = {0};
    while (!is_op(cur(P), close)) {
        if (L.n) FMOE_FORWARD_IF_ERROR(expect_op(P, ","));
        if (is_op(cur(P), close)) break;
        jnode *e;
        FMOE_FORWARD_IF_ERROR(parse_expr(P, 1, &e));
        FMOE_FORWARD_IF_ERROR(add(P, &L, e));
        if (k == JN_DICT) {
            FMOE_FORWARD_IF_ERROR(expect_op(P, ":"));
            FMOE_FORWARD_IF_ERROR(parse_expr(P, 1, &e));
            FMOE_FORWARD_IF_ERROR(add(P, &L, e));
        }
    }
    P->i++;
    x->kids = L.v;
    x->nkids = L.n;
    *out = x;
    return 0;
}

static int parse_primary(parser *P, jnode **out) {
    const jj_token *t = cur(P);
    jnode *x = NULL;
    FMOE_FORWARD_IF_ERROR(enter(P));
    if (t->k == JT_NAME) {
        x = node(P, JN_LIT, t->line);
        if (!x) return OOM();
        if (is_name(t, "true") || is_name(t, "True")) x->lit = jv_bool(1);
        else if (is_name(t, "false") || is_name(t, "False")) x->lit = jv_bool(0);
        else if (is_name(t, "none") || is_name(t, "None")) x->lit = jv_none();
        else {
            x->k = JN_NAME;
            x->s = t->s;
            x->n = t->n;
        }
        P->i++;
    } else if (t->k == JT_STRING) {
        /* adjacent literals concatenate: "a" "b" */
        size_t n = 0, j = P->i;
        for (; P->t[j].k == JT_STRING; j++) n += P->t[j].n;
        char *s = jj_alloc(P->A, n + 1);
        if (!s) return OOM();
        size_t k = 0;
        for (; P->i < j; P->i++) {
            memcpy(s + k, P->t[P->i].s, P->t[P->i].n);
            k += P->t[P->i].n;
        }
        x = node(P, JN_LIT, t->line);
        if (!x) return OOM();
        x->lit = jv_strn(s, n);
    } else if (t->k == JT_INT || t->k == JT_FLOAT) {
        x = node(P, JN_LIT, t->line);
        if (!x) return OOM();
        x->lit = t->k == JT_INT ? jv_int(t->i) : jv_float(t->f);
        P->i++;
    } else if (is_op(t, "(")) {
        P->i++;
        if (is_op(cur(P), ")")) { /* () is an empty tuple */
            P->i++;
            x = node(P, JN_LIST, t->line);
            if (!x) return OOM();
            x->op = 1; /* a tuple */
        } else {
            FMOE_FORWARD_IF_ERROR(parse_expr(P, 1, &x));
            if (is_op(cur(P), ",")) { /* a tuple */
                jnode *l = node(P, JN_LIST, t->line);
                if (!l) return OOM();
                l->op = 1; /* a tuple */
                nodes L = {0};
                FMOE_FORWARD_IF_ERROR(add(P, &L, x));
                while (is_op(cur(P), ",")) {
                    P->i++;
                    if (is_op(cur(P), ")")) break;
                    FMOE_FORWARD_IF_ERROR(parse_expr(P, 1, &x));
                    FMOE_FORWARD_IF_ERROR(add(P, &L, x));
                }
                l->kids = L.v;
                l->nkids = L.n;
                x = l;
            }
            FMOE_FORWARD_IF_ERROR(expect_op(P, ")"));
        }
    } else if (is_op(t, "[")) {
        P->i++;
        FMOE_FORWARD_IF_ERROR(parse_seq(P, JN_LIST, "]", &x));
    } else if (is_op(t, "{")) {
        P->i++;
        FMOE_FORWARD_IF_ERROR(parse_seq(P, JN_DICT, "}", &x));
    } else {
        return unexpected(P, "an expression");
    }
    P->depth--;
    *out = x;
    return 0;
}

static int parse_unary(parser *P, int with_filter, jnode **out) {
    const jj_token *t = cur(P);
    jnode *x;
    FMOE_FORWARD_IF_ERROR(enter(P));
    if (is_op(t, "-") || is_op(t, "+")) {
        P->i++;
        x = node(P, is_op(t, "-") ? JN_NEG : JN_POS, t->line);
        if (!x) return OOM();
        FMOE_FORWARD_IF_ERROR(parse_unary(P, 0, &x->a));
    } else {
        FMOE_FORWARD_IF_ERROR(parse_primary(P, &x));
    }
    FMOE_FORWARD_IF_ERROR(parse_postfix(P, &x));
    if (with_filter) FMOE_FORWARD_IF_ERROR(parse_filters(P, &x));
    P->depth--;
    *out = x;
    return 0;
}

static int binop(parser *P, jn_kind k, int op, jnode *a, jnode *b, jnode **out) {
    jnode *x = node(P, k, a->line);
    if (!x) return OOM();
    x->op = op;
    x->a = a;
    x->b = b;
    *out = x;
    return 0;
}

static int parse_pow(parser *P, jnode **out) {
    FMOE_FORWARD_IF_ERROR(parse_unary(P, 1, out));
    while (is_op(cur(P), "**")) {
        P->i++;
        jnode *b;
        FMOE_FORWARD_IF_ERROR(parse_unary(P, 1, &b));
        FMOE_FORWARD_IF_ERROR(binop(P, JN_BINOP, 'P', *out, b, out));
    }
    return 0;
}

static int parse_math2(parser *P, jnode **out) {
    FMOE_FORWARD_IF_ERROR(parse_pow(P, out));
    for (;;) {
        const jj_token *t = cur(P);
        int op = is_op(t, "*") ? '*' : is_op(t, "/") ? '/' : is_op(t, "//") ? 'F'
               : is_op(t, "%") ? '%' : 0;
        if (!op) return 0;
        P->i++;
        jnode *b;
        FMOE_FORWARD_IF_ERROR(parse_pow(P, &b));
        FMOE_FORWARD_IF_ERROR(binop(P, JN_BINOP, op, *out, b, out));
    }
}

static int parse_concat(parser *P, jnode **out) {
    FMOE_FORWARD_IF_ERROR(parse_math2(P, out));
    while (is_op(cur(P), "~")) {
        P->i++;
        jnode *b;
        FMOE_FORWARD_IF_ERROR(parse_math2(P, &b));
        FMOE_FORWARD_IF_ERROR(binop(P, JN_BINOP, '~', *out, b, out));
    }
    return 0;
}

static int parse_math1(parser *P, jnode **out) {
    FMOE_FORWARD_IF_ERROR(parse_concat(P, out));
    for (;;) {
        const jj_token *t = cur(P);
        int op = is_op(t, "+") ? '+' : is_op(t, "-") ? '-' : 0;
        if (!op) return 0;
        P->i++;
        jnode *b;
        FMOE_FORWARD_IF_ERROR(parse_concat(P, &b));
        FMOE_FORWARD_IF_ERROR(binop(P, JN_BINOP, op, *out, b, out));
    }
}

static int parse_compare(parser *P, jnode **out) {
    jnode *left;
    FMOE_FORWARD_IF_ERROR(parse_math1(P, &left));
    jnode *result = NULL;
    for (;;) {
        const jj_token *t = cur(P);
        int op = is_op(t, "==") ? 'e' : is_op(t, "!=") ? 'n' : is_op(t, "<") ? '<'
               : is_op(t, ">") ? '>' : is_op(t, "<=") ? 'l' : is_op(t, ">=") ? 'g'
               : is_name(t, "in") ? 'i' : 0;
        if (!op && is_name(t, "not") && is_name(&P->t[P->i + 1], "in")) {
            op = 'I';
            P->i++;
        }
        if (!op) break;
        P->i++;
        jnode *right, *c = NULL;
        FMOE_FORWARD_IF_ERROR(parse_math1(P, &right));
        FMOE_FORWARD_IF_ERROR(binop(P, JN_CMP, op, left, right, &c));
        /* a < b < c is (a < b) and (b < c) */
        if (result) FMOE_FORWARD_IF_ERROR(binop(P, JN_AND, 0, result, c, &result));
        else result = c;
        left = right;
    }
    *out = result ? result : left;
    return 0;
}

static int parse_not(parser *P, jnode **out) {
    if (is_name(cur(P), "not")) {
        jnode *x = node(P, JN_NOT, cur(P)->line);
        if (!x) return OOM();
        P->i++;
        FMOE_FORWARD_IF_ERROR(enter(P));
        FMOE_FORWARD_IF_ERROR(parse_not(P, &x->a));
        P->depth--;
        *out = x;
        return 0;
    }
    return parse_compare(P, out);
}

static int parse_and(parser *P, jnode **out) {
    FMOE_FORWARD_IF_ERROR(parse_not(P, out));
    while (is_name(cur(P), "and")) {
        P->i++;
        jnode *b;
        FMOE_FORWARD_IF_ERROR(parse_not(P, &b));
        FMOE_FORWARD_IF_ERROR(binop(P, JN_AND, 0, *out, b, out));
    }
    return 0;
}

static int parse_or(parser *P, jnode **out) {
    FMOE_FORWARD_IF_ERROR(parse_and(P, out));
    while (is_name(cur(P), "or")) {
        P->i++;
        jnode *b;
        FMOE_FORWARD_IF_ERROR(parse_and(P, &b));
        FMOE_FORWARD_IF_ERROR(binop(P, JN_OR, 0, *out, b, out));
    }
    return 0;
}

static int parse_expr(parser *P, int with_cond, jnode **out) {
    FMOE_FORWARD_IF_ERROR(enter(P));
    FMOE_FORWARD_IF_ERROR(parse_or(P, out));
    while (with_cond && is_name(cur(P), "if")) {
        jnode *x = node(P, JN_COND, cur(P)->line);
        if (!x) return OOM();
        P->i++;
        x->b = *out;
        FMOE_FORWARD_IF_ERROR(parse_or(P, &x->a));
        if (is_name(cur(P), "else")) {
            P->i++;
            FMOE_FORWARD_IF_ERROR(parse_expr(P, 1, &x->c));
        }
        *out = x;
    }
    P->depth--;
    return 0;
}

/* An expression, or several separated by commas (a tuple): "set a = 1, 2". */
static int parse_tuple(parser *P, int with_cond, jnode **out) {
    FMOE_FORWARD_IF_ERROR(parse_expr(P, with_cond, out));
    if (!is_op(cur(P), ",")) return 0;
    jnode *l = node(P, JN_LIST, (*out)->line);
    if (!l) return OOM();
    l->op = 1; /* a tuple */
    nodes L = {0};
    FMOE_FORWARD_IF_ERROR(add(P, &L, *out));
    while (is_op(cur(P), ",")) {
        P->i++;
        if (cur(P)->k == JT_BLOCK_END || cur(P)->k == JT_VAR_END) break;
        jnode *e;
        FMOE_FORWARD_IF_ERROR(parse_expr(P, with_cond, &e));
        FMOE_FORWARD_IF_ERROR(add(P, &L, e));
    }
    l->kids = L.v;
    l->nkids = L.n;
    *out = l;
    return 0;
}

/* ---- statements ------------------------------------------------------------------------ */

/* Parses statements until a block tag whose keyword is one of `stops` (NULL-terminated);
 * leaves the parser on that keyword and sets *which to its index. stops NULL: to EOF. */
static int parse_body(parser *P, const char *const *stops, int *which, jnode **out);

static int parse_targets(parser *P, jnode *x) {
    size_t cap = 4;
    x->names = jj_alloc(P->A, cap * sizeof *x->names);
    if (!x->names) return OOM();
    int paren = is_op(cur(P), "(");
    if (paren) P->i++;
    for (;;) {
        if (cur(P)->k != JT_NAME) return unexpected(P, "a variable name");
        if (x->nnames == cap) return unexpected(P, "at most 4 names");
        x->names[x->nnames++] = jj_strndup(P->A, cur(P)->s, cur(P)->n);
        P->i++;
        if (!is_op(cur(P), ",")) break;
        P->i++;
    }
    if (paren) FMOE_FORWARD_IF_ERROR(expect_op(P, ")"));
    return 0;
}

static int end_tag(parser *P) { return expect_k(P, JT_BLOCK_END, "'%}'"); }

static int parse_for(parser *P, jnode *x) {
    FMOE_FORWARD_IF_ERROR(parse_targets(P, x));
    if (!is_name(cur(P), "in")) return unexpected(P, "'in'");
    P->i++;
    FMOE_FORWARD_IF_ERROR(parse_expr(P, 0, &x->a));
    if (is_name(cur(P), "if")) {
        P->i++;
        FMOE_FORWARD_IF_ERROR(parse_expr(P, 1, &x->d));
    }
    if (is_name(cur(P), "recursive"))
        return fmoe_error_set(FMOE_EUNSUPPORTED,
                              "chat template line %d: recursive for loops are not supported",
                              cur(P)->line);
    FMOE_FORWARD_IF_ERROR(end_tag(P));
    static const char *const S[] = {"else", "endfor", NULL};
    int w;
    FMOE_FORWARD_IF_ERROR(parse_body(P, S, &w, &x->b));
    P->i++;
    FMOE_FORWARD_IF_ERROR(end_tag(P));
    if (w == 0) {
        static const char *const E[] = {"endfor", NULL};
        FMOE_FORWARD_IF_ERROR(parse_body(P, E, &w, &x->c));
        P->i++;
        FMOE_FORWARD_IF_ERROR(end_tag(P));
    }
    return 0;
}

static int parse_if(parser *P, jnode *x) {
    FMOE_FORWARD_IF_ERROR(parse_tuple(P, 1, &x->a));
    FMOE_FORWARD_IF_ERROR(end_tag(P));
    static const char *const S[] = {"elif", "else", "endif", NULL};
    int w;
    FMOE_FORWARD_IF_ERROR(parse_body(P, S, &w, &x->b));
    int line = cur(P)->line;
    P->i++;
    if (w == 0) {
        jnode *e = node(P, JN_IF, line);
        if (!e) return OOM();
        x->c = e;
        return parse_if(P, e);
    }
    FMOE_FORWARD_IF_ERROR(end_tag(P));
    if (w == 1) {
        static const char *const E[] = {"endif", NULL};
        FMOE_FORWARD_IF_ERROR(parse_body(P, E, &w, &x->c));
        P->i++;
        FMOE_FORWARD_IF_ERROR(end_tag(P));
    }
    return 0;
}

static int parse_set(parser *P, jnode *x) {
    if (cur(P)->k == JT_NAME && is_op(&P->t[P->i + 1], ".")) { /* ns.attr = value */
        x->names = jj_alloc(P->A, sizeof *x->names);
        if (!x->names) return OOM();
        x->names[0] = jj_strndup(P->A, cur(P)->s, cur(P)->n);
        x->nnames = 1;
        P->i += 2;
        if (cur(P)->k != JT_NAME) return unexpected(P, "an attribute name");
        x->s2 = jj_strndup(P->A, cur(P)->s, cur(P)->n);
        P->i++;
    } else {
        FMOE_FORWARD_IF_ERROR(parse_targets(P, x));
    }
    if (cur(P)->k == JT_BLOCK_END || is_op(cur(P), "|")) { /* {% set x %}...{% endset %} */
        if (x->nnames != 1 || x->s2)
            return unexpected(P, "'=' (a block set assigns one name)");
        if (is_op(cur(P), "|"))
            return fmoe_error_set(FMOE_EUNSUPPORTED,
                                  "chat template line %d: a filter on a block set is not "
                                  "supported", cur(P)->line);
        P->i++;
        static const char *const S[] = {"endset", NULL};
        int w;
        FMOE_FORWARD_IF_ERROR(parse_body(P, S, &w, &x->b));
        P->i++;
        return end_tag(P);
    }
    FMOE_FORWARD_IF_ERROR(expect_op(P, "="));
    FMOE_FORWARD_IF_ERROR(parse_tuple(P, 1, &x->a));
    return end_tag(P);
}

static int parse_macro(parser *P, jnode *x) {
    if (cur(P)->k != JT_NAME) return unexpected(P, "a macro name");
    x->s = jj_strndup(P->A, cur(P)->s, cur(P)->n);
    x->n = cur(P)->n;
    P->i++;
    FMOE_FORWARD_IF_ERROR(expect_op(P, "("));
    nodes L = {0};
    while (!is_op(cur(P), ")")) {
        if (L.n) FMOE_FORWARD_IF_ERROR(expect_op(P, ","));
        if (cur(P)->k != JT_NAME) return unexpected(P, "a parameter name");
        jnode *p = node(P, JN_NAME, cur(P)->line);
        if (!p) return OOM();
        p->s = cur(P)->s;
        p->n = cur(P)->n;
        P->i++;
        if (is_op(cur(P), "=")) {
            P->i++;
            FMOE_FORWARD_IF_ERROR(parse_expr(P, 1, &p->a));
        }
        FMOE_FORWARD_IF_ERROR(add(P, &L, p));
    }
    P->i++;
    x->kids = L.v;
    x->nkids = L.n;
    FMOE_FORWARD_IF_ERROR(end_tag(P));
    static const char *const S[] = {"endmacro", NULL};
    int w;
    FMOE_FORWARD_IF_ERROR(parse_body(P, S, &w, &x->b));
    P->i++;
    return end_tag(P);
}

/* {% filter name(args) | name2 %}...{% endfilter %}: x->a is the chain over a NULL value */
static int parse_filter_block(parser *P, jnode *x) {
    jnode *chain = NULL;
    for (;;) {
        if (cur(P)->k != JT_NAME) return unexpected(P, "a filter name");
        jnode *f = node(P, JN_FILTER, cur(P)->line);
        if (!f) return OOM();
        f->s = cur(P)->s;
        f->n = cur(P)->n;
        f->a = chain;
        P->i++;
        if (is_op(cur(P), "(")) FMOE_FORWARD_IF_ERROR(parse_call_args(P, f));
        chain = f;
        if (!is_op(cur(P), "|")) break;
        P->i++;
    }
    x->a = chain;
    FMOE_FORWARD_IF_ERROR(end_tag(P));
    static const char *const S[] = {"endfilter", NULL};
    int w;
    FMOE_FORWARD_IF_ERROR(parse_body(P, S, &w, &x->b));
    P->i++;
    return end_tag(P);
}

static int parse_statement(parser *P, jnode **out) {
    const jj_token *t = cur(P);
    if (t->k != JT_NAME) return unexpected(P, "a statement name");
    int line = t->line;
    jnode *x = node(P, JN_BODY, line);
    if (!x) return OOM();
    P->i++;
    *out = x;
    if (is_name(t, "for")) {
        x->k = JN_FOR;
        return parse_for(P, x);
    }
    if (is_name(t, "if")) {
        x->k = JN_IF;
        return parse_if(P, x);
    }
    if (is_name(t, "set")) {
        x->k = JN_SET;
        return parse_set(P, x);
    }
    if (is_name(t, "macro")) {
        x->k = JN_MACRO;
        return parse_macro(P, x);
    }
    if (is_name(t, "filter")) {
        x->k = JN_FILTERBLOCK;
        return parse_filter_block(P, x);
    }
    if (is_name(t, "break") || is_name(t, "continue")) {
        x->k = is_name(t, "break") ? JN_BREAK : JN_CONTINUE;
        return end_tag(P);
    }
    if (is_name(t, "generation")) {
        /* transformers' {% generation %} marks assistant text for masks; it renders the
         * body unchanged */
        FMOE_FORWARD_IF_ERROR(end_tag(P));
        static const char *const S[] = {"endgeneration", NULL};
        int w;
        jnode *body;
        FMOE_FORWARD_IF_ERROR(parse_body(P, S, &w, &body));
        P->i++;
        *out = body;
        return end_tag(P);
    }
    return fmoe_error_set(FMOE_EUNSUPPORTED, "chat template line %d: '{%% %.*s %%}' is not "
                          "supported", line, (int)(t->n > 32 ? 32 : t->n), t->s);
}

static int parse_body(parser *P, const char *const *stops, int *which, jnode **out) {
    FMOE_FORWARD_IF_ERROR(enter(P));
    jnode *body = node(P, JN_BODY, cur(P)->line);
    if (!body) return OOM();
    nodes L = {0};
    int open_line = cur(P)->line;
    for (;;) {
        const jj_token *t = cur(P);
        if (t->k == JT_EOF) {
            if (stops)
                return fmoe_error_set(FMOE_EFORMAT,
                                      "chat template line %d: a block opened near line %d is "
                                      "not closed (expected '{%% %s %%}')",
                                      t->line, open_line, stops[0]);
            break;
        }
        jnode *x = NULL;
        if (t->k == JT_TEXT) {
            x = node(P, JN_TEXT, t->line);
            if (!x) return OOM();
            x->s = t->s;
            x->n = t->n;
            P->i++;
        } else if (t->k == JT_VAR_BEGIN) {
            P->i++;
            x = node(P, JN_OUTPUT, t->line);
            if (!x) return OOM();
            FMOE_FORWARD_IF_ERROR(parse_tuple(P, 1, &x->a));
            FMOE_FORWARD_IF_ERROR(expect_k(P, JT_VAR_END, "'}}'"));
        } else if (t->k == JT_BLOCK_BEGIN) {
            const jj_token *kw = &P->t[P->i + 1];
            int hit = -1;
            for (int k = 0; stops && stops[k]; k++)
                if (is_name(kw, stops[k])) hit = k;
            if (hit >= 0) {
                P->i++;
                *which = hit;
                break;
            }
            if (kw->k == JT_NAME &&
                (is_name(kw, "endfor") || is_name(kw, "endif") || is_name(kw, "elif") ||
                 is_name(kw, "else") || is_name(kw, "endset") || is_name(kw, "endmacro") ||
                 is_name(kw, "endfilter") || is_name(kw, "endgeneration"))) {
                char buf[64];
                return fmoe_error_set(FMOE_EFORMAT, "chat template line %d: unexpected %s",
                                      kw->line, tok_text(kw, buf, sizeof buf));
            }
            P->i++;
            FMOE_FORWARD_IF_ERROR(parse_statement(P, &x));
        } else {
            return unexpected(P, "template text or a tag");
        }
        FMOE_FORWARD_IF_ERROR(add(P, &L, x));
    }
    body->kids = L.v;
    body->nkids = L.n;
    *out = body;
    P->depth--;
    return 0;
}

int jj_parse(jj_arena *A, const jj_token *toks, size_t ntoks, jnode **root) {
    parser P = {.A = A, .t = toks, .n = ntoks};
    int w;
    return parse_body(&P, NULL, &w, root);
}
