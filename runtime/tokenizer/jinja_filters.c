/*
 * jinja_filters.c - the filters chat templates use ("|tojson", "|map(attribute=...)",
 * "|selectattr", "|indent", ...), each giving what jinja2's filter (or transformers' tojson)
 * gives (see jinja.h). map, select, reject and unique return generators in jinja2; their
 * results here are lists marked as such, so that what jinja2 refuses on a generator (len,
 * JSON, last) is refused too.
 */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "jinja.h"

#define OOM() fmoe_error_set(FMOE_ENOMEM, "chat template: out of memory")

/* ---- filters --------------------------------------------------------------------------- */

/* attribute="a.b" or an int index, as jinja2's make_attrgetter reads it. */
static int attr_path(jj_ctx *c, jv v, jv path, jv *out) {
    if (path.k == JV_INT) {
        *out = jv_undef();
        if (v.k == JV_LIST && path.u.i >= 0 && (size_t)path.u.i < v.u.l->n) *out = v.u.l->v[path.u.i];
        return 0;
    }
    FMOE_FORWARD_IF_ERROR(jj_want_str(c, path, "attribute="));
    const char *p = path.u.s.s, *e = p + path.u.s.n;
    *out = v;
    while (p <= e) {
        const char *d = memchr(p, '.', (size_t)(e - p));
        if (!d) d = e;
        jv cur = *out;
        *out = jv_undef();
        if (cur.k == JV_DICT || cur.k == JV_NS) {
            jv *x = jv_dict_getn(cur, p, (size_t)(d - p));
            if (x) *out = *x;
        } else if (cur.k == JV_LIST && d > p && isdigit((unsigned char)*p)) {
            size_t i = (size_t)strtoul(p, NULL, 10);
            if (i < cur.u.l->n) *out = cur.u.l->v[i];
        } else if (cur.k == JV_UNDEF) {
            return jj_fail(c, FMOE_EINVAL, "attribute '%.*s' of an undefined value",
                           (int)path.u.s.n, path.u.s.s);
        }
        p = d + 1;
    }
    return 0;
}

/* A sort key: case-folded strings unless case_sensitive. */
typedef struct {
    jv key;
    size_t i;
} keyed;

static _Thread_local int sort_err; /* qsort's comparator cannot return an error */
static int keyed_cmp(const void *x, const void *y) {
    const keyed *a = x, *b = y;
    int c = 0;
    if (jv_cmp(a->key, b->key, &c) < 0) sort_err = 1;
    if (c == 0) c = (a->i > b->i) - (a->i < b->i); /* stable */
    return c;
}

static int fold(jj_ctx *c, jv v, int case_sensitive, jv *out) {
    if (v.k == JV_STR && !case_sensitive) return jj_recase(c, v, JJ_CASE_LOWER, out);
    *out = v;
    return 0;
}

/* Sorts items by key (of attribute `attr` or, for pairs, element `pos`). */
static int sort_list(jj_ctx *c, jv items, jv attr, int pos, int case_sensitive, int reverse,
                     jv *out) {
    size_t n = items.u.l->n;
    keyed *k = malloc((n ? n : 1) * sizeof *k);
    if (!k) return OOM();
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        jv key = items.u.l->v[i];
        if (pos >= 0) key = key.k == JV_LIST && (size_t)pos < key.u.l->n ? key.u.l->v[pos] : jv_undef();
        else if (attr.k != JV_NONE && attr.k != JV_UNDEF) rc = attr_path(c, key, attr, &key);
        if (rc == 0) rc = fold(c, key, case_sensitive, &k[i].key);
        k[i].i = i;
    }
    if (rc == 0) {
        sort_err = 0;
        qsort(k, n, sizeof *k, keyed_cmp);
        if (sort_err) rc = jj_fail(c, FMOE_EINVAL, "sort: items that do not order");
    }
    if (rc == 0) rc = jv_list_new(c->A, n, out);
    for (size_t i = 0; rc == 0 && i < n; i++)
        rc = jv_list_push(c->A, *out, items.u.l->v[k[reverse ? n - 1 - i : i].i]);
    free(k);
    return rc;
}

static int f_indent(jj_ctx *c, jv s, const jj_args *a, jv *out) {
    jv w = jj_arg(a, 1, "width", jv_int(4));
    int first = jv_truthy(jj_arg(a, 2, "first", jv_bool(0)));
    int blank = jv_truthy(jj_arg(a, 3, "blank", jv_bool(0)));
    jj_sb ind = {0}, sb = {0};
    int rc = 0;
    if (w.k == JV_STR) rc = jj_sb_put(&ind, w.u.s.s, w.u.s.n);
    else
        for (int64_t i = 0; rc == 0 && i < (w.k == JV_INT ? w.u.i : 4); i++) rc = jj_sb_puts(&ind, " ");
    jv lines;
    /* jinja2 appends "\n" before splitlines, so a trailing newline is a line */
    jv sn = s;
    if (rc == 0) rc = jj_str_method(c, "splitlines", s, &(jj_args){0}, &lines);
    (void)sn;
    if (rc == 0 && first) rc = jj_sb_put(&sb, ind.p ? ind.p : "", ind.n);
    for (size_t i = 0; rc == 0 && i < lines.u.l->n; i++) {
        jv l = lines.u.l->v[i];
        if (i) {
            rc = jj_sb_puts(&sb, "\n");
            if (rc == 0 && (blank || l.u.s.n)) rc = jj_sb_put(&sb, ind.p ? ind.p : "", ind.n);
        }
        if (rc == 0) rc = jj_sb_put(&sb, l.u.s.s, l.u.s.n);
    }
    if (rc == 0 && s.u.s.n && (s.u.s.s[s.u.s.n - 1] == '\n' || s.u.s.s[s.u.s.n - 1] == '\r')) {
        rc = jj_sb_puts(&sb, "\n"); /* the last empty line, never indented (blank or not) */
        if (rc == 0 && blank) rc = jj_sb_put(&sb, ind.p ? ind.p : "", ind.n);
    }
    free(ind.p);
    if (rc == 0) *out = jj_str_out(c, &sb, &rc);
    free(sb.p);
    return rc;
}

/* select/reject/selectattr/rejectattr */
static int f_select(jj_ctx *c, jv seq, const jj_args *a, int attr, int keep, jv *out) {
    jv items;
    /* jinja2 yields nothing for a false value (None included) */
    if (jv_truthy(seq)) FMOE_FORWARD_IF_ERROR(jj_iterable(c, seq, &items));
    else FMOE_FORWARD_IF_ERROR(jv_list_new(c->A, 0, &items));
    FMOE_FORWARD_IF_ERROR(jv_list_new(c->A, items.u.l->n, out));
    out->u.l->gen = 1;
    size_t t0 = attr ? 1 : 0;
    jv tname = t0 < a->nargs ? a->args[t0] : jv_undef();
    if (tname.k != JV_UNDEF) FMOE_FORWARD_IF_ERROR(jj_want_str(c, tname, "select test name"));
    char name[64];
    if (tname.k == JV_STR) snprintf(name, sizeof name, "%.*s", (int)tname.u.s.n, tname.u.s.s);
    for (size_t i = 0; i < items.u.l->n; i++) {
        jv v = items.u.l->v[i];
        if (attr) FMOE_FORWARD_IF_ERROR(attr_path(c, v, a->args[0], &v));
        int r;
        if (tname.k == JV_UNDEF) {
            r = jv_truthy(v);
        } else {
            jv targs[8];
            size_t nt = 0;
            targs[nt++] = v;
            for (size_t k = t0 + 1; k < a->nargs && nt < 8; k++) targs[nt++] = a->args[k];
            int rc = jj_test(c, name, targs, nt, &r);
            if (rc == 0) return jj_fail(c, FMOE_EUNSUPPORTED, "test '%s' is not supported", name);
            if (rc < 0) return rc;
        }
        if (r == keep) FMOE_FORWARD_IF_ERROR(jv_list_push(c->A, *out, items.u.l->v[i]));
    }
    return 0;
}

static int f_map(jj_ctx *c, jv seq, const jj_args *a, jv *out) {
    jv items;
    if (jv_truthy(seq)) FMOE_FORWARD_IF_ERROR(jj_iterable(c, seq, &items));
    else FMOE_FORWARD_IF_ERROR(jv_list_new(c->A, 0, &items));
    FMOE_FORWARD_IF_ERROR(jv_list_new(c->A, items.u.l->n, out));
    out->u.l->gen = 1;
    jv at = jj_arg(a, 99, "attribute", jv_undef());
    jv def = jj_arg(a, 99, "default", jv_undef());
    for (size_t i = 0; i < items.u.l->n; i++) {
        jv v = items.u.l->v[i];
        if (at.k != JV_UNDEF) {
            FMOE_FORWARD_IF_ERROR(attr_path(c, v, at, &v));
            if (v.k == JV_UNDEF && def.k != JV_UNDEF) v = def;
        } else {
            if (a->nargs < 1 || a->args[0].k != JV_STR)
                return jj_fail(c, FMOE_EINVAL, "map() needs a filter name or attribute=");
            char name[64];
            snprintf(name, sizeof name, "%.*s", (int)a->args[0].u.s.n, a->args[0].u.s.s);
            jv fargs[8];
            size_t nf = 0;
            fargs[nf++] = v;
            for (size_t k = 1; k < a->nargs && nf < 8; k++) fargs[nf++] = a->args[k];
            int rc = jj_filter(c, name, fargs, nf, NULL, NULL, 0, &v);
            if (rc == 0) return jj_fail(c, FMOE_EUNSUPPORTED, "filter '%s' is not supported", name);
            if (rc < 0) return rc;
        }
        FMOE_FORWARD_IF_ERROR(jv_list_push(c->A, *out, v));
    }
    return 0;
}

static int to_int(jj_ctx *c, jv v, jv def, jv *out) {
    (void)c;
    switch (v.k) {
    case JV_INT: *out = v; return 0;
    case JV_BOOL: *out = jv_int(v.u.b); return 0;
    case JV_FLOAT:
        *out = isfinite(v.u.f) ? jv_int((int64_t)v.u.f) : def;
        return 0;
    case JV_STR: {
        char buf[64];
        snprintf(buf, sizeof buf, "%.*s", (int)(v.u.s.n < 63 ? v.u.s.n : 63), v.u.s.s);
        char *end;
        long long i = strtoll(buf, &end, 10);
        while (jj_is_space((unsigned char)*end)) end++;
        if (end != buf && !*end) {
            *out = jv_int(i);
            return 0;
        }
        double d = strtod(buf, &end);
        while (jj_is_space((unsigned char)*end)) end++;
        *out = end != buf && !*end && isfinite(d) ? jv_int((int64_t)d) : def;
        return 0;
    }
    default: *out = def; return 0;
    }
}

static int f_round(jj_ctx *c, jv v, const jj_args *a, jv *out) {
    jv p = jj_arg(a, 1, "precision", jv_int(0));
    jv method = jj_arg(a, 2, "method", jv_str("common"));
    if (v.k != JV_INT && v.k != JV_FLOAT && v.k != JV_BOOL)
        return jj_fail(c, FMOE_EINVAL, "round needs a number, not %s", jv_kind_name(v));
    double x = v.k == JV_FLOAT ? v.u.f : v.k == JV_INT ? (double)v.u.i : v.u.b;
    int prec = p.k == JV_INT ? (int)p.u.i : 0;
    double scale = pow(10, prec);
    if (method.k == JV_STR && method.u.s.n && method.u.s.s[0] == 'f') x = floor(x * scale) / scale;
    else if (method.k == JV_STR && method.u.s.n && method.u.s.s[0] == 'c' && method.u.s.n == 4)
        x = ceil(x * scale) / scale;
    else if (prec >= 0 && prec < 30) { /* Python's round: correctly rounded, ties to even */
        char buf[400];
        snprintf(buf, sizeof buf, "%.*f", prec, x);
        x = strtod(buf, NULL);
    }
    *out = jv_float(x);
    return 0;
}

int jj_filter(jj_ctx *c, const char *f, const jv *args, size_t nargs,
              const char *const *kwnames, const jv *kw, size_t nkw, jv *out) {
    jv v = args[0];
    jj_args a = {args, nargs, kwnames, kw, nkw};
    jv none = jv_none();
    if (!strcmp(f, "safe")) {
        FMOE_FORWARD_IF_ERROR(jv_to_str(c->A, v, out));
        out->safe = 1;
        return 1;
    }
    if (!strcmp(f, "string")) {
        FMOE_FORWARD_IF_ERROR(jv_to_str(c->A, v, out));
        return 1;
    }
    if (!strcmp(f, "e") || !strcmp(f, "escape") || !strcmp(f, "forceescape")) {
        if (v.k == JV_STR && v.safe && f[0] != 'f') {
            *out = v;
            return 1;
        }
        jv s;
        FMOE_FORWARD_IF_ERROR(jv_to_str(c->A, v, &s));
        FMOE_FORWARD_IF_ERROR(jj_html_escape(c, s, out));
        return 1;
    }
    if (!strcmp(f, "tojson")) {
        /* transformers' tojson(x, ensure_ascii=False, indent=None, separators=None,
         * sort_keys=False) */
        jv ind = jj_arg(&a, 2, "indent", none), sep = jj_arg(&a, 3, "separators", none);
        jj_json_opts jo = {.indent = -1,
                           .ensure_ascii = jv_truthy(jj_arg(&a, 1, "ensure_ascii", jv_bool(0))),
                           .sort_keys = jv_truthy(jj_arg(&a, 4, "sort_keys", jv_bool(0)))};
        if (ind.k == JV_INT) jo.indent = (int)(ind.u.i < 0 ? 0 : ind.u.i > 64 ? 64 : ind.u.i);
        else if (ind.k != JV_NONE)
            return jj_fail(c, FMOE_EUNSUPPORTED, "tojson(indent=) other than an integer");
        if (sep.k != JV_NONE) {
            if (sep.k != JV_LIST || sep.u.l->n != 2 || sep.u.l->v[0].k != JV_STR ||
                sep.u.l->v[1].k != JV_STR)
                return jj_fail(c, FMOE_EINVAL, "tojson(separators=) must be two strings");
            jo.item_sep = jj_strndup(c->A, sep.u.l->v[0].u.s.s, sep.u.l->v[0].u.s.n);
            jo.key_sep = jj_strndup(c->A, sep.u.l->v[1].u.s.s, sep.u.l->v[1].u.s.n);
            if (!jo.item_sep || !jo.key_sep) return OOM();
        }
        jj_sb sb = {0};
        int rc = jv_tojson(&sb, v, &jo);
        if (rc < 0) {
            rc = jj_fail(c, rc, "%s", fmoe_error_detail());
            free(sb.p);
            return rc;
        }
        *out = jj_str_out(c, &sb, &rc);
        FMOE_FORWARD_IF_ERROR(rc);
        return 1;
    }
    if (!strcmp(f, "length") || !strcmp(f, "count")) {
        switch (v.k) {
        case JV_UNDEF: *out = jv_int(0); break;
        case JV_STR: *out = jv_int((int64_t)jj_utf8_len(v.u.s.s, v.u.s.n)); break;
        case JV_LIST:
            if (v.u.l->gen)
                return jj_fail(c, FMOE_EINVAL, "object of type 'generator' has no len() (add "
                               "|list)");
            *out = jv_int((int64_t)v.u.l->n);
            break;
        case JV_DICT:
        case JV_NS: *out = jv_int((int64_t)v.u.d->n); break;
        default:
            return jj_fail(c, FMOE_EINVAL, "object of type '%s' has no len()", jv_kind_name(v));
        }
        return 1;
    }
    if (!strcmp(f, "default") || !strcmp(f, "d")) {
        jv def = jj_arg(&a, 1, "default_value", jv_str(""));
        int boolean = jv_truthy(jj_arg(&a, 2, "boolean", jv_bool(0)));
        *out = v.k == JV_UNDEF || (boolean && !jv_truthy(v)) ? def : v;
        return 1;
    }
    if (!strcmp(f, "list")) {
        FMOE_FORWARD_IF_ERROR(jj_iterable(c, v, out));
        if (out->k == JV_LIST && out->u.l == v.u.l && v.k == JV_LIST) { /* a new list */
            jv copy;
            FMOE_FORWARD_IF_ERROR(jv_list_new(c->A, v.u.l->n, &copy));
            for (size_t i = 0; i < v.u.l->n; i++) FMOE_FORWARD_IF_ERROR(jv_list_push(c->A, copy, v.u.l->v[i]));
            *out = copy;
        }
        return 1;
    }
    if (!strcmp(f, "items")) {
        if (v.k == JV_UNDEF) FMOE_FORWARD_IF_ERROR(jv_list_new(c->A, 0, out));
        else if (v.k != JV_DICT && v.k != JV_NS)
            return jj_fail(c, FMOE_EINVAL, "items: can only get item pairs from a mapping");
        else FMOE_FORWARD_IF_ERROR(jj_pairs(c, v, out));
        return 1;
    }
    if (!strcmp(f, "int")) {
        FMOE_FORWARD_IF_ERROR(to_int(c, v, jj_arg(&a, 1, "default", jv_int(0)), out));
        return 1;
    }
    if (!strcmp(f, "float")) {
        jv def = jj_arg(&a, 1, "default", jv_float(0));
        if (v.k == JV_FLOAT) *out = v;
        else if (v.k == JV_INT) *out = jv_float((double)v.u.i);
        else if (v.k == JV_BOOL) *out = jv_float(v.u.b);
        else if (v.k == JV_STR) {
            char buf[64], *end;
            snprintf(buf, sizeof buf, "%.*s", (int)(v.u.s.n < 63 ? v.u.s.n : 63), v.u.s.s);
            double d = strtod(buf, &end);
            while (jj_is_space((unsigned char)*end)) end++;
            *out = end != buf && !*end ? jv_float(d) : def;
        } else *out = def;
        return 1;
    }
    if (!strcmp(f, "abs")) {
        if (v.k == JV_INT) *out = jv_int(v.u.i < 0 ? -v.u.i : v.u.i);
        else if (v.k == JV_FLOAT) *out = jv_float(fabs(v.u.f));
        else if (v.k == JV_BOOL) *out = jv_int(v.u.b);
        else return jj_fail(c, FMOE_EINVAL, "bad operand type for abs(): %s", jv_kind_name(v));
        return 1;
    }
    if (!strcmp(f, "round")) {
        FMOE_FORWARD_IF_ERROR(f_round(c, v, &a, out));
        return 1;
    }
    if (!strcmp(f, "first") || !strcmp(f, "last")) {
        jv items;
        if (f[0] == 'l' && v.k == JV_LIST && v.u.l->gen)
            return jj_fail(c, FMOE_EINVAL, "last of a generator: 'generator' object is not "
                           "reversible (add |list)");
        FMOE_FORWARD_IF_ERROR(jj_iterable(c, v, &items));
        *out = items.u.l->n ? items.u.l->v[f[0] == 'f' ? 0 : items.u.l->n - 1] : jv_undef();
        return 1;
    }
    if (!strcmp(f, "join")) {
        jv items, sep = jj_arg(&a, 1, "d", jv_str("")), at = jj_arg(&a, 2, "attribute", none);
        FMOE_FORWARD_IF_ERROR(jj_iterable(c, v, &items));
        jj_sb sb = {0};
        int rc = 0;
        for (size_t i = 0; rc == 0 && i < items.u.l->n; i++) {
            jv x = items.u.l->v[i];
            if (at.k != JV_NONE) rc = attr_path(c, x, at, &x);
            if (rc == 0 && i) rc = jv_to_sb(&sb, sep);
            if (rc == 0) rc = jv_to_sb(&sb, x);
        }
        if (rc == 0) *out = jj_str_out(c, &sb, &rc);
        free(sb.p);
        FMOE_FORWARD_IF_ERROR(rc);
        return 1;
    }
    if (!strcmp(f, "sort")) {
        jv items;
        FMOE_FORWARD_IF_ERROR(jj_iterable(c, v, &items));
        FMOE_FORWARD_IF_ERROR(sort_list(c, items, jj_arg(&a, 3, "attribute", none), -1,
                                        jv_truthy(jj_arg(&a, 2, "case_sensitive", jv_bool(0))),
                                        jv_truthy(jj_arg(&a, 1, "reverse", jv_bool(0))), out));
        return 1;
    }
    if (!strcmp(f, "dictsort")) {
        if (v.k != JV_DICT) return jj_fail(c, FMOE_EINVAL, "dictsort needs a dict");
        jv p;
        FMOE_FORWARD_IF_ERROR(jj_pairs(c, v, &p));
        jv by = jj_arg(&a, 2, "by", jv_str("key"));
        int pos = by.k == JV_STR && by.u.s.n == 5 && !memcmp(by.u.s.s, "value", 5) ? 1 : 0;
        FMOE_FORWARD_IF_ERROR(sort_list(c, p, none, pos,
                                        jv_truthy(jj_arg(&a, 1, "case_sensitive", jv_bool(0))),
                                        jv_truthy(jj_arg(&a, 3, "reverse", jv_bool(0))), out));
        return 1;
    }
    if (!strcmp(f, "reverse")) {
        if (v.k == JV_STR) {
            jv items;
            FMOE_FORWARD_IF_ERROR(jj_iterable(c, v, &items));
            jj_sb sb = {0};
            int rc = 0;
            for (size_t i = items.u.l->n; rc == 0 && i-- > 0;) rc = jv_to_sb(&sb, items.u.l->v[i]);
            if (rc == 0) *out = jj_str_out(c, &sb, &rc);
            free(sb.p);
            FMOE_FORWARD_IF_ERROR(rc);
            return 1;
        }
        jv items;
        FMOE_FORWARD_IF_ERROR(jj_iterable(c, v, &items));
        FMOE_FORWARD_IF_ERROR(jv_list_new(c->A, items.u.l->n, out));
        for (size_t i = items.u.l->n; i-- > 0;)
            FMOE_FORWARD_IF_ERROR(jv_list_push(c->A, *out, items.u.l->v[i]));
        return 1;
    }
    if (!strcmp(f, "unique")) {
        jv items, at = jj_arg(&a, 2, "attribute", none);
        int cs = jv_truthy(jj_arg(&a, 1, "case_sensitive", jv_bool(0)));
        FMOE_FORWARD_IF_ERROR(jj_iterable(c, v, &items));
        jv seen;
        FMOE_FORWARD_IF_ERROR(jv_list_new(c->A, items.u.l->n, &seen));
        FMOE_FORWARD_IF_ERROR(jv_list_new(c->A, items.u.l->n, out));
        out->u.l->gen = 1;
        for (size_t i = 0; i < items.u.l->n; i++) {
            jv k = items.u.l->v[i];
            if (at.k != JV_NONE) FMOE_FORWARD_IF_ERROR(attr_path(c, k, at, &k));
            FMOE_FORWARD_IF_ERROR(fold(c, k, cs, &k));
            int dup = 0;
            for (size_t j = 0; j < seen.u.l->n && !dup; j++) dup = jv_eq(seen.u.l->v[j], k);
            if (dup) continue;
            FMOE_FORWARD_IF_ERROR(jv_list_push(c->A, seen, k));
            FMOE_FORWARD_IF_ERROR(jv_list_push(c->A, *out, items.u.l->v[i]));
        }
        return 1;
    }
    if (!strcmp(f, "map")) {
        FMOE_FORWARD_IF_ERROR(f_map(c, v, &(jj_args){args + 1, nargs - 1, kwnames, kw, nkw}, out));
        return 1;
    }
    if (!strcmp(f, "select") || !strcmp(f, "reject") || !strcmp(f, "selectattr") ||
        !strcmp(f, "rejectattr")) {
        if (f[6] == 'a' && nargs < 2) return jj_fail(c, FMOE_EINVAL, "%s needs an attribute", f);
        FMOE_FORWARD_IF_ERROR(f_select(c, v, &(jj_args){args + 1, nargs - 1, NULL, NULL, 0},
                                       f[6] == 'a', f[0] == 's', out));
        return 1;
    }
    if (!strcmp(f, "batch")) {
        jv n = jj_arg(&a, 1, "linecount", jv_int(1)), fill = jj_arg(&a, 2, "fill_with", none);
        if (n.k != JV_INT || n.u.i <= 0) return jj_fail(c, FMOE_EINVAL, "batch needs a count > 0");
        jv items, cur = jv_undef();
        FMOE_FORWARD_IF_ERROR(jj_iterable(c, v, &items));
        FMOE_FORWARD_IF_ERROR(jv_list_new(c->A, 0, out));
        for (size_t i = 0; i < items.u.l->n; i++) {
            if (cur.k == JV_UNDEF || cur.u.l->n == (size_t)n.u.i) {
                FMOE_FORWARD_IF_ERROR(jv_list_new(c->A, (size_t)n.u.i, &cur));
                FMOE_FORWARD_IF_ERROR(jv_list_push(c->A, *out, cur));
            }
            FMOE_FORWARD_IF_ERROR(jv_list_push(c->A, cur, items.u.l->v[i]));
        }
        if (fill.k != JV_NONE && cur.k == JV_LIST)
            while (cur.u.l->n < (size_t)n.u.i) FMOE_FORWARD_IF_ERROR(jv_list_push(c->A, cur, fill));
        return 1;
    }
    if (!strcmp(f, "sum") || !strcmp(f, "min") || !strcmp(f, "max")) {
        jv items;
        FMOE_FORWARD_IF_ERROR(jj_iterable(c, v, &items));
        if (f[1] == 'u') {
            jv acc = jj_arg(&a, 2, "start", jv_int(0)), at = jj_arg(&a, 1, "attribute", none);
            for (size_t i = 0; i < items.u.l->n; i++) {
                jv x = items.u.l->v[i];
                if (at.k != JV_NONE) FMOE_FORWARD_IF_ERROR(attr_path(c, x, at, &x));
                if (x.k == JV_INT && acc.k == JV_INT) acc = jv_int(acc.u.i + x.u.i);
                else if ((x.k == JV_INT || x.k == JV_FLOAT) && (acc.k == JV_INT || acc.k == JV_FLOAT))
                    acc = jv_float((acc.k == JV_INT ? (double)acc.u.i : acc.u.f) +
                                   (x.k == JV_INT ? (double)x.u.i : x.u.f));
                else return jj_fail(c, FMOE_EINVAL, "sum of a %s", jv_kind_name(x));
            }
            *out = acc;
            return 1;
        }
        *out = jv_undef();
        for (size_t i = 0; i < items.u.l->n; i++) {
            int cmp;
            if (out->k == JV_UNDEF) {
                *out = items.u.l->v[i];
                continue;
            }
            if (jv_cmp(items.u.l->v[i], *out, &cmp) < 0)
                return jj_fail(c, FMOE_EINVAL, "%s", fmoe_error_detail());
            if (f[1] == 'i' ? cmp < 0 : cmp > 0) *out = items.u.l->v[i];
        }
        return 1;
    }
    /* string filters */
    static const char *const SF[] = {"trim", "lower", "upper", "title", "capitalize", "replace",
                                     "indent", "wordcount", NULL};
    int known = 0;
    for (int i = 0; SF[i]; i++) known |= !strcmp(f, SF[i]);
    if (!known) return 0;
    jv s;
    FMOE_FORWARD_IF_ERROR(jv_to_str(c->A, v, &s));
    if (!strcmp(f, "trim")) *out = jj_strip(s, jj_arg(&a, 1, "chars", none), 1, 1);
    else if (!strcmp(f, "lower")) FMOE_FORWARD_IF_ERROR(jj_recase(c, s, JJ_CASE_LOWER, out));
    else if (!strcmp(f, "upper")) FMOE_FORWARD_IF_ERROR(jj_recase(c, s, JJ_CASE_UPPER, out));
    else if (!strcmp(f, "title")) FMOE_FORWARD_IF_ERROR(jj_recase(c, s, JJ_CASE_TITLE_JINJA, out));
    else if (!strcmp(f, "capitalize")) FMOE_FORWARD_IF_ERROR(jj_recase(c, s, JJ_CASE_CAPITALIZE, out));
    else if (!strcmp(f, "replace")) {
        jv n = jj_arg(&a, 3, "count", none);
        FMOE_FORWARD_IF_ERROR(jj_replace(c, s, jj_arg(&a, 1, "old", none), jj_arg(&a, 2, "new", none),
                                      n.k == JV_INT ? n.u.i : -1, out));
    } else if (!strcmp(f, "indent")) FMOE_FORWARD_IF_ERROR(f_indent(c, s, &a, out));
    else { /* wordcount */
        jv words;
        FMOE_FORWARD_IF_ERROR(jj_split(c, s, none, -1, &words));
        *out = jv_int((int64_t)words.u.l->n);
    }
    return 1;
}
