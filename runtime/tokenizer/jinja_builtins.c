/*
 * jinja_builtins.c - the methods of dict and list values, the global functions (range,
 * dict, namespace, raise_exception, strftime_now) and the tests ("is defined", ...) chat
 * templates call, each giving what jinja2 or Python gives (see jinja.h).
 *
 * Methods that change a value (list.append, dict.update, ...) are refused, as
 * transformers' ImmutableSandboxedEnvironment refuses them.
 */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fmoe/error.h"
#include "jinja.h"

#define OOM() fmoe_error_set(FMOE_ENOMEM, "chat template: out of memory")

static const char *const STR_METHODS[] = {
    "strip", "lstrip", "rstrip", "upper", "lower", "title", "capitalize", "startswith",
    "endswith", "split", "replace", "find", "rfind", "index", "count", "join", "format",
    "splitlines", "isdigit", "isalpha", "isspace", "isalnum", "isupper", "islower", NULL};
static const char *const DICT_METHODS[] = {"items", "keys", "values", "get", "copy", NULL};
static const char *const LIST_METHODS[] = {"index", "count", "copy", NULL};
/* methods that would change the value: the sandbox refuses them */
static const char *const MUTATORS[] = {"append", "extend", "insert", "pop", "remove", "clear",
                                       "update", "setdefault", "popitem", "sort", "reverse",
                                       NULL};

static const char *in_list(const char *const *l, const char *s, size_t n) {
    for (int i = 0; l[i]; i++)
        if (strlen(l[i]) == n && memcmp(l[i], s, n) == 0) return l[i];
    return NULL;
}

jv jj_method(jj_ctx *c, jv v, const char *name, size_t n) {
    const char *m = NULL;
    if (v.k == JV_STR) m = in_list(STR_METHODS, name, n);
    else if (v.k == JV_DICT) m = in_list(DICT_METHODS, name, n);
    else if (v.k == JV_LIST) m = in_list(LIST_METHODS, name, n);
    if (!m && (v.k == JV_DICT || v.k == JV_LIST)) m = in_list(MUTATORS, name, n);
    if (!m) return jv_undef();
    jj_func *f = jj_alloc(c->A, sizeof *f);
    if (!f) return jv_undef();
    f->name = m;
    f->self = v;
    return (jv){.k = JV_FUNC, .u.fn = f};
}

int jj_pairs(jj_ctx *c, jv d, jv *out) {
    FMOE_FORWARD_IF_ERROR(jv_list_new(c->A, d.u.d->n, out));
    for (size_t i = 0; i < d.u.d->n; i++) {
        jv p;
        FMOE_FORWARD_IF_ERROR(jv_list_new(c->A, 2, &p));
        p.u.l->tuple = 1;
        FMOE_FORWARD_IF_ERROR(jv_list_push(c->A, p, d.u.d->key[i]));
        FMOE_FORWARD_IF_ERROR(jv_list_push(c->A, p, d.u.d->val[i]));
        FMOE_FORWARD_IF_ERROR(jv_list_push(c->A, *out, p));
    }
    return 0;
}

static int dict_method(jj_ctx *c, const char *m, jv d, const jj_args *a, jv *out) {
    if (!strcmp(m, "items")) return jj_pairs(c, d, out);
    if (!strcmp(m, "keys") || !strcmp(m, "values")) {
        FMOE_FORWARD_IF_ERROR(jv_list_new(c->A, d.u.d->n, out));
        for (size_t i = 0; i < d.u.d->n; i++)
            FMOE_FORWARD_IF_ERROR(
                jv_list_push(c->A, *out, m[0] == 'k' ? d.u.d->key[i] : d.u.d->val[i]));
        return 0;
    }
    if (!strcmp(m, "get")) {
        jv *v = jv_dict_get(d, jj_arg(a, 0, NULL, jv_none()));
        *out = v ? *v : jj_arg(a, 1, NULL, jv_none());
        return 0;
    }
    /* copy */
    FMOE_FORWARD_IF_ERROR(jv_dict_new(c->A, out));
    for (size_t i = 0; i < d.u.d->n; i++)
        FMOE_FORWARD_IF_ERROR(jv_dict_set(c->A, *out, d.u.d->key[i], d.u.d->val[i]));
    return 0;
}

/* ---- globals --------------------------------------------------------------------------- */

static int g_range(jj_ctx *c, const jj_args *a, jv *out) {
    int64_t v[3] = {0, 0, 1};
    if (a->nargs < 1 || a->nargs > 3)
        return jj_fail(c, FMOE_EINVAL, "range() takes 1 to 3 arguments");
    for (size_t i = 0; i < a->nargs; i++) {
        if (a->args[i].k != JV_INT && a->args[i].k != JV_BOOL)
            return jj_fail(c, FMOE_EINVAL, "range() needs integers, not %s",
                           jv_kind_name(a->args[i]));
        v[a->nargs == 1 ? 1 : i] = a->args[i].k == JV_INT ? a->args[i].u.i : a->args[i].u.b;
    }
    if (v[2] == 0) return jj_fail(c, FMOE_EINVAL, "range() arg 3 must not be zero");
    double count = ceil(((double)v[1] - (double)v[0]) / (double)v[2]);
    if (count > JJ_MAX_RANGE)
        return jj_fail(c, FMOE_ERANGE, "range() of more than %d items", JJ_MAX_RANGE);
    FMOE_FORWARD_IF_ERROR(jv_list_new(c->A, count > 0 ? (size_t)count : 0, out));
    for (int64_t i = v[0]; v[2] > 0 ? i < v[1] : i > v[1]; i += v[2])
        FMOE_FORWARD_IF_ERROR(jv_list_push(c->A, *out, jv_int(i)));
    return 0;
}

static int g_dict(jj_ctx *c, const jj_args *a, jv *out, int ns) {
    FMOE_FORWARD_IF_ERROR(jv_dict_new(c->A, out));
    if (a->nargs > 1) return jj_fail(c, FMOE_EINVAL, "dict()/namespace() takes one mapping");
    if (a->nargs == 1) {
        jv src = a->args[0];
        if (src.k != JV_DICT && src.k != JV_NS)
            return jj_fail(c, FMOE_EUNSUPPORTED, "dict()/namespace() from a %s",
                           jv_kind_name(src));
        for (size_t i = 0; i < src.u.d->n; i++)
            FMOE_FORWARD_IF_ERROR(jv_dict_set(c->A, *out, src.u.d->key[i], src.u.d->val[i]));
    }
    for (size_t k = 0; k < a->nkw; k++)
        FMOE_FORWARD_IF_ERROR(jv_dict_set(c->A, *out, jv_str(a->kwn[k]), a->kw[k]));
    if (ns) out->k = JV_NS;
    return 0;
}

static int g_strftime(jj_ctx *c, const jj_args *a, jv *out) {
    jv fmt = jj_arg(a, 0, "format", jv_undef());
    FMOE_FORWARD_IF_ERROR(jj_want_str(c, fmt, "strftime_now()"));
    char f[256], buf[512];
    snprintf(f, sizeof f, "%.*s", (int)fmt.u.s.n, fmt.u.s.s);
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    size_t n = strftime(buf, sizeof buf, f, &tm);
    char *s = jj_strndup(c->A, buf, n);
    if (!s) return OOM();
    *out = jv_strn(s, n);
    return 0;
}

int jj_call_builtin(jj_ctx *c, const jj_func *f, const jv *args, size_t nargs,
                    const char *const *kwnames, const jv *kw, size_t nkw, jv *out) {
    jj_args a = {args, nargs, kwnames, kw, nkw};
    const char *m = f->name;
    jv self = f->self;
    switch (self.k) {
    case JV_UNDEF:
        if (!strcmp(m, "range")) return g_range(c, &a, out);
        if (!strcmp(m, "dict")) return g_dict(c, &a, out, 0);
        if (!strcmp(m, "namespace")) return g_dict(c, &a, out, 1);
        if (!strcmp(m, "strftime_now")) return g_strftime(c, &a, out);
        if (!strcmp(m, "raise_exception")) {
            jv msg = jj_arg(&a, 0, NULL, jv_str(""));
            jj_sb sb = {0};
            int rc = jv_to_sb(&sb, msg);
            if (rc == 0)
                rc = jj_fail(c, FMOE_EINVAL, "the template raised: %s", sb.p ? sb.p : "");
            free(sb.p);
            return rc;
        }
        return jj_fail(c, FMOE_EUNSUPPORTED, "%s() is not supported", m);
    case JV_INT: /* loop.cycle(a, b, ...): self is loop.index0 */
        if (nargs == 0) return jj_fail(c, FMOE_EINVAL, "loop.cycle() needs arguments");
        *out = args[(size_t)self.u.i % nargs];
        return 0;
    case JV_STR: return jj_str_method(c, m, self, &a, out);
    case JV_DICT:
    case JV_LIST:
        if (in_list(MUTATORS, m, strlen(m)))
            return jj_fail(c, FMOE_EINVAL, "%s.%s() changes a value, which the sandbox transformers "
                           "renders in refuses", jv_kind_name(self), m);
        if (self.k == JV_DICT) return dict_method(c, m, self, &a, out);
        if (!strcmp(m, "copy")) {
            FMOE_FORWARD_IF_ERROR(jv_list_new(c->A, self.u.l->n, out));
            for (size_t i = 0; i < self.u.l->n; i++)
                FMOE_FORWARD_IF_ERROR(jv_list_push(c->A, *out, self.u.l->v[i]));
            return 0;
        }
        {
            jv x = jj_arg(&a, 0, NULL, jv_undef());
            int64_t k = 0, at = -1;
            for (size_t i = 0; i < self.u.l->n; i++)
                if (jv_eq(self.u.l->v[i], x)) {
                    k++;
                    if (at < 0) at = (int64_t)i;
                }
            if (!strcmp(m, "count")) *out = jv_int(k);
            else if (at < 0) return jj_fail(c, FMOE_EINVAL, "list.index(x): x not in list");
            else *out = jv_int(at);
            return 0;
        }
    default: return jj_fail(c, FMOE_EINTERNAL, "no method %s", m);
    }
}

/* ---- tests ----------------------------------------------------------------------------- */

int jj_test(jj_ctx *c, const char *t, const jv *args, size_t nargs, int *r) {
    jv v = args[0], o = nargs > 1 ? args[1] : jv_undef();
    (void)c;
    if (!strcmp(t, "defined")) *r = v.k != JV_UNDEF;
    else if (!strcmp(t, "undefined")) *r = v.k == JV_UNDEF;
    else if (!strcmp(t, "none")) *r = v.k == JV_NONE;
    else if (!strcmp(t, "string")) *r = v.k == JV_STR;
    else if (!strcmp(t, "number")) *r = v.k == JV_INT || v.k == JV_FLOAT || v.k == JV_BOOL;
    else if (!strcmp(t, "integer")) *r = v.k == JV_INT;
    else if (!strcmp(t, "float")) *r = v.k == JV_FLOAT;
    else if (!strcmp(t, "boolean")) *r = v.k == JV_BOOL;
    else if (!strcmp(t, "true")) *r = v.k == JV_BOOL && v.u.b;
    else if (!strcmp(t, "false")) *r = v.k == JV_BOOL && !v.u.b;
    else if (!strcmp(t, "mapping")) *r = v.k == JV_DICT;
    else if (!strcmp(t, "iterable")) *r = v.k == JV_LIST || v.k == JV_DICT || v.k == JV_STR || v.k == JV_UNDEF;
    else if (!strcmp(t, "sequence")) *r = v.k == JV_LIST || v.k == JV_DICT || v.k == JV_STR || v.k == JV_UNDEF;
    else if (!strcmp(t, "callable")) *r = v.k == JV_MACRO || v.k == JV_FUNC;
    else if (!strcmp(t, "odd") || !strcmp(t, "even") || !strcmp(t, "divisibleby")) {
        if (v.k != JV_INT) return jj_fail(c, FMOE_EINVAL, "test '%s' needs an integer", t);
        int64_t d = t[0] == 'd' ? (o.k == JV_INT ? o.u.i : 0) : 2;
        if (d == 0) return jj_fail(c, FMOE_EINVAL, "divisibleby 0");
        int64_t m = v.u.i % d;
        *r = t[0] == 'o' ? m != 0 : m == 0;
    } else if (!strcmp(t, "equalto") || !strcmp(t, "eq") || !strcmp(t, "==") ||
               !strcmp(t, "sameas"))
        *r = jv_eq(v, o) && (t[0] != 's' || v.k == o.k);
    else if (!strcmp(t, "ne") || !strcmp(t, "!=")) *r = !jv_eq(v, o);
    else if (!strcmp(t, "lt") || !strcmp(t, "le") || !strcmp(t, "gt") || !strcmp(t, "ge") ||
             !strcmp(t, "lessthan") || !strcmp(t, "greaterthan")) {
        int cmp;
        if (jv_cmp(v, o, &cmp) < 0) return jj_fail(c, FMOE_EINVAL, "%s", fmoe_error_detail());
        *r = t[0] == 'l' ? (t[1] == 'e' && t[2] == '\0' ? cmp <= 0 : cmp < 0)
                         : (t[1] == 'e' && t[2] == '\0' ? cmp >= 0 : cmp > 0);
    } else if (!strcmp(t, "in")) {
        *r = 0;
        if (o.k == JV_LIST)
            for (size_t i = 0; i < o.u.l->n && !*r; i++) *r = jv_eq(o.u.l->v[i], v);
        else if (o.k == JV_DICT) *r = jv_dict_get(o, v) != NULL;
        else if (o.k == JV_STR && v.k == JV_STR)
            *r = jj_find(o.u.s.s, o.u.s.n, v.u.s.s, v.u.s.n) != NULL;
    } else if (!strcmp(t, "lower") || !strcmp(t, "upper")) {
        if (v.k != JV_STR) return jj_fail(c, FMOE_EINVAL, "test '%s' needs a string", t);
        int cased = 0, ok = 1;
        for (size_t i = 0; i < v.u.s.n; i++) {
            unsigned char ch = (unsigned char)v.u.s.s[i];
            if (t[0] == 'l' ? isupper(ch) : islower(ch)) ok = 0;
            if (isalpha(ch)) cased = 1;
        }
        *r = ok && cased;
    } else if (!strcmp(t, "escaped")) *r = 0;
    else return 0;
    return 1;
}
