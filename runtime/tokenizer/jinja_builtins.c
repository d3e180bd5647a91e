/*
 * jinja_builtins.c - the filters, tests, methods and global functions chat templates call
 * (see jinja.h), each written to give what jinja2 (or Python's str/dict method) gives.
 *
 * Case mapping (upper, lower, title, capitalize) is ASCII only: other letters are left as
 * they are, where Python would map them. Methods that change a value (list.append,
 * dict.update, ...) are refused, as transformers' ImmutableSandboxedEnvironment refuses
 * them.
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

/* ---- argument helpers ------------------------------------------------------------------ */

typedef struct {
    const jv *args;
    size_t nargs;
    const char *const *kwn;
    const jv *kw;
    size_t nkw;
} argv_t;

/* The argument at position `pos` or named `name`, else `def`. */
static jv arg(const argv_t *a, size_t pos, const char *name, jv def) {
    for (size_t k = 0; k < a->nkw; k++)
        if (name && strcmp(a->kwn[k], name) == 0) return a->kw[k];
    return pos < a->nargs ? a->args[pos] : def;
}

static int want_str(jj_ctx *c, jv v, const char *what) {
    if (v.k != JV_STR)
        return jj_fail(c, FMOE_EINVAL, "%s needs a string, not %s", what, jv_kind_name(v));
    return 0;
}

static jv arena_str(jj_ctx *c, jj_sb *sb, int *rc) {
    char *s = jj_strndup(c->A, sb->p ? sb->p : "", sb->n);
    if (!s) *rc = OOM();
    jv v = jv_strn(s ? s : "", s ? sb->n : 0);
    free(sb->p);
    sb->p = NULL;
    return v;
}

static int is_ws(unsigned char ch) { return ch == ' ' || (ch >= '\t' && ch <= '\r') || ch == 0x1c || ch == 0x1d || ch == 0x1e || ch == 0x1f; }

int jj_iterable(jj_ctx *c, jv v, jv *list) {
    switch (v.k) {
    case JV_UNDEF: return jv_list_new(c->A, 0, list);
    case JV_LIST: *list = v; return 0;
    case JV_DICT:
    case JV_NS:
        FMOE_FORWARD_IF_ERROR(jv_list_new(c->A, v.u.d->n, list));
        for (size_t i = 0; i < v.u.d->n; i++)
            FMOE_FORWARD_IF_ERROR(jv_list_push(c->A, *list, v.u.d->key[i]));
        return 0;
    case JV_STR: {
        FMOE_FORWARD_IF_ERROR(jv_list_new(c->A, v.u.s.n, list));
        size_t n = v.u.s.n;
        for (size_t i = 0; i < n;) {
            size_t j = i + 1;
            while (j < n && ((unsigned char)v.u.s.s[j] & 0xC0) == 0x80) j++;
            FMOE_FORWARD_IF_ERROR(jv_list_push(c->A, *list, jv_strn(v.u.s.s + i, j - i)));
            i = j;
        }
        return 0;
    }
    default:
        return jj_fail(c, FMOE_EINVAL, "'%s' object is not iterable",
                       v.k == JV_NONE ? "NoneType" : jv_kind_name(v));
    }
}

/* ---- string operations ----------------------------------------------------------------- */

int jj_html_escape(jj_ctx *c, jv s, jv *out) { /* markupsafe.escape */
    jj_sb sb = {0};
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < s.u.s.n; i++) {
        char ch = s.u.s.s[i];
        rc = ch == '&' ? jj_sb_puts(&sb, "&amp;") : ch == '<' ? jj_sb_puts(&sb, "&lt;")
           : ch == '>' ? jj_sb_puts(&sb, "&gt;") : ch == '"' ? jj_sb_puts(&sb, "&#34;")
           : ch == '\'' ? jj_sb_puts(&sb, "&#39;") : jj_sb_put(&sb, &ch, 1);
    }
    if (rc == 0) *out = arena_str(c, &sb, &rc);
    free(sb.p);
    out->safe = 1;
    return rc;
}

typedef enum { CASE_UPPER, CASE_LOWER, CASE_TITLE_PY, CASE_TITLE_JINJA, CASE_CAPITALIZE } casing;

static int recase(jj_ctx *c, jv s, casing how, jv *out) {
    char *o = jj_alloc(c->A, s.u.s.n + 1);
    if (!o) return OOM();
    int start = 1; /* at a word start */
    for (size_t i = 0; i < s.u.s.n; i++) {
        unsigned char ch = (unsigned char)s.u.s.s[i];
        switch (how) {
        case CASE_UPPER: o[i] = (char)toupper(ch); break;
        case CASE_LOWER: o[i] = (char)tolower(ch); break;
        case CASE_CAPITALIZE: o[i] = (char)(i == 0 ? toupper(ch) : tolower(ch)); break;
        case CASE_TITLE_PY: /* str.title(): a letter after a non-letter starts a word */
            o[i] = (char)(start ? toupper(ch) : tolower(ch));
            start = !isalpha(ch) && ch < 0x80;
            break;
        case CASE_TITLE_JINJA: /* |title: words split at whitespace, - ( { [ < */
            o[i] = (char)(start ? toupper(ch) : tolower(ch));
            start = is_ws(ch) || ch == '-' || ch == '(' || ch == '{' || ch == '[' || ch == '<';
            break;
        }
    }
    *out = jv_strn(o, s.u.s.n);
    return 0;
}

static int in_set(unsigned char ch, jv chars) {
    if (chars.k != JV_STR) return is_ws(ch);
    return memchr(chars.u.s.s, ch, chars.u.s.n) != NULL;
}

/* strip/lstrip/rstrip with Python's chars argument (ASCII chars; multi-byte characters in
 * `chars` are compared byte-wise, which is exact for UTF-8 when whole characters match). */
static jv strip(jv s, jv chars, int left, int right) {
    const char *a = s.u.s.s, *e = a + s.u.s.n;
    if (left) while (a < e && in_set((unsigned char)*a, chars)) a++;
    if (right) while (e > a && in_set((unsigned char)e[-1], chars)) e--;
    return jv_strn(a, (size_t)(e - a));
}

static const char *find_in(const char *h, size_t hn, const char *n, size_t nn) {
    if (nn == 0) return h;
    for (size_t i = 0; i + nn <= hn; i++)
        if (memcmp(h + i, n, nn) == 0) return h + i;
    return NULL;
}

static int replace(jj_ctx *c, jv s, jv old, jv new_, int64_t count, jv *out) {
    if (old.k != JV_STR || new_.k != JV_STR)
        return jj_fail(c, FMOE_EINVAL, "replace() needs string arguments");
    jj_sb sb = {0};
    int rc = 0;
    const char *p = s.u.s.s, *e = p + s.u.s.n;
    int64_t done = 0;
    if (old.u.s.n == 0) { /* Python inserts `new` between every character */
        size_t i = 0;
        while (rc == 0 && (count < 0 || done < count)) {
            rc = jj_sb_put(&sb, new_.u.s.s, new_.u.s.n);
            done++;
            if (i >= s.u.s.n) break;
            size_t j = jj_utf8_off(p + i, s.u.s.n - i, 1);
            if (rc == 0) rc = jj_sb_put(&sb, p + i, j);
            i += j;
        }
        if (rc == 0 && i < s.u.s.n) rc = jj_sb_put(&sb, p + i, s.u.s.n - i);
    } else {
        while (rc == 0 && (count < 0 || done < count)) {
            const char *f = find_in(p, (size_t)(e - p), old.u.s.s, old.u.s.n);
            if (!f) break;
            rc = jj_sb_put(&sb, p, (size_t)(f - p));
            if (rc == 0) rc = jj_sb_put(&sb, new_.u.s.s, new_.u.s.n);
            p = f + old.u.s.n;
            done++;
        }
        if (rc == 0) rc = jj_sb_put(&sb, p, (size_t)(e - p));
    }
    if (rc == 0) *out = arena_str(c, &sb, &rc);
    free(sb.p);
    return rc;
}

static int split(jj_ctx *c, jv s, jv sep, int64_t maxsplit, jv *out) {
    FMOE_FORWARD_IF_ERROR(jv_list_new(c->A, 4, out));
    const char *p = s.u.s.s, *e = p + s.u.s.n;
    int64_t done = 0;
    if (sep.k == JV_NONE || sep.k == JV_UNDEF) { /* runs of whitespace, no empty items */
        for (;;) {
            while (p < e && is_ws((unsigned char)*p)) p++;
            if (p >= e) return 0;
            const char *q = p;
            if (maxsplit >= 0 && done >= maxsplit) q = e;
            else
                while (q < e && !is_ws((unsigned char)*q)) q++;
            if (q == e && maxsplit >= 0 && done >= maxsplit) {
                const char *t = e;
                while (t > p && is_ws((unsigned char)t[-1])) t--;
                q = t;
            }
            FMOE_FORWARD_IF_ERROR(jv_list_push(c->A, *out, jv_strn(p, (size_t)(q - p))));
            done++;
            p = q;
        }
    }
    FMOE_FORWARD_IF_ERROR(want_str(c, sep, "split()"));
    if (sep.u.s.n == 0) return jj_fail(c, FMOE_EINVAL, "split(): empty separator");
    for (;;) {
        const char *f = maxsplit >= 0 && done >= maxsplit
                            ? NULL
                            : find_in(p, (size_t)(e - p), sep.u.s.s, sep.u.s.n);
        if (!f) return jv_list_push(c->A, *out, jv_strn(p, (size_t)(e - p)));
        FMOE_FORWARD_IF_ERROR(jv_list_push(c->A, *out, jv_strn(p, (size_t)(f - p))));
        p = f + sep.u.s.n;
        done++;
    }
}

static int affix(jj_ctx *c, jv s, jv fix, int end, int *r) {
    *r = 0;
    if (fix.k == JV_LIST) {
        for (size_t i = 0; i < fix.u.l->n && !*r; i++)
            FMOE_FORWARD_IF_ERROR(affix(c, s, fix.u.l->v[i], end, r));
        return 0;
    }
    FMOE_FORWARD_IF_ERROR(want_str(c, fix, end ? "endswith()" : "startswith()"));
    size_t n = fix.u.s.n;
    *r = n <= s.u.s.n && memcmp(end ? s.u.s.s + s.u.s.n - n : s.u.s.s, fix.u.s.s, n) == 0;
    return 0;
}

/* str.format with "{}", "{0}" and "{name}" fields (no format specs). */
static int format(jj_ctx *c, jv s, const argv_t *a, jv *out) {
    jj_sb sb = {0};
    int rc = 0;
    size_t auto_i = 0;
    for (size_t i = 0; rc == 0 && i < s.u.s.n; i++) {
        char ch = s.u.s.s[i];
        if ((ch == '{' || ch == '}') && i + 1 < s.u.s.n && s.u.s.s[i + 1] == ch) {
            rc = jj_sb_put(&sb, &ch, 1);
            i++;
            continue;
        }
        if (ch != '{') {
            rc = jj_sb_put(&sb, &ch, 1);
            continue;
        }
        const char *close = memchr(s.u.s.s + i, '}', s.u.s.n - i);
        if (!close) {
            rc = jj_fail(c, FMOE_EINVAL, "format(): single '{' in the format string");
            break;
        }
        const char *f = s.u.s.s + i + 1;
        size_t fn = (size_t)(close - f);
        jv v = jv_undef();
        if (memchr(f, ':', fn) || memchr(f, '!', fn) || memchr(f, '.', fn) || memchr(f, '[', fn)) {
            rc = jj_fail(c, FMOE_EUNSUPPORTED, "format(): format specs are not supported");
            break;
        }
        if (fn == 0) v = auto_i < a->nargs ? a->args[auto_i++] : jv_undef();
        else if (isdigit((unsigned char)f[0])) {
            size_t k = (size_t)atoi(f);
            v = k < a->nargs ? a->args[k] : jv_undef();
        } else
            for (size_t k = 0; k < a->nkw; k++)
                if (strlen(a->kwn[k]) == fn && memcmp(a->kwn[k], f, fn) == 0) v = a->kw[k];
        if (v.k == JV_UNDEF) {
            rc = jj_fail(c, FMOE_EINVAL, "format(): no argument for '{%.*s}'", (int)fn, f);
            break;
        }
        rc = jv_to_sb(&sb, v);
        i = (size_t)(close - s.u.s.s);
    }
    if (rc == 0) *out = arena_str(c, &sb, &rc);
    free(sb.p);
    return rc;
}

static int str_method(jj_ctx *c, const char *m, jv s, const argv_t *a, jv *out) {
    jv none = jv_none();
    if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip")) {
        *out = strip(s, arg(a, 0, "chars", none), m[0] != 'r', m[0] != 'l');
        return 0;
    }
    if (!strcmp(m, "upper")) return recase(c, s, CASE_UPPER, out);
    if (!strcmp(m, "lower")) return recase(c, s, CASE_LOWER, out);
    if (!strcmp(m, "title")) return recase(c, s, CASE_TITLE_PY, out);
    if (!strcmp(m, "capitalize")) return recase(c, s, CASE_CAPITALIZE, out);
    if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
        int r;
        FMOE_FORWARD_IF_ERROR(affix(c, s, arg(a, 0, NULL, jv_undef()), m[0] == 'e', &r));
        *out = jv_bool(r);
        return 0;
    }
    if (!strcmp(m, "split")) {
        jv ms = arg(a, 1, "maxsplit", jv_int(-1));
        return split(c, s, arg(a, 0, "sep", none), ms.k == JV_INT ? ms.u.i : -1, out);
    }
    if (!strcmp(m, "replace")) {
        jv n = arg(a, 2, "count", jv_int(-1));
        return replace(c, s, arg(a, 0, NULL, none), arg(a, 1, NULL, none),
                       n.k == JV_INT ? n.u.i : -1, out);
    }
    if (!strcmp(m, "find") || !strcmp(m, "rfind") || !strcmp(m, "index") || !strcmp(m, "count")) {
        jv sub = arg(a, 0, NULL, none);
        FMOE_FORWARD_IF_ERROR(want_str(c, sub, m));
        if (!strcmp(m, "count")) {
            int64_t k = 0;
            const char *p = s.u.s.s, *e = p + s.u.s.n, *f;
            if (sub.u.s.n == 0) k = (int64_t)jj_utf8_len(p, s.u.s.n) + 1;
            else
                while ((f = find_in(p, (size_t)(e - p), sub.u.s.s, sub.u.s.n))) {
                    k++;
                    p = f + sub.u.s.n;
                }
            *out = jv_int(k);
            return 0;
        }
        const char *f = NULL;
        if (m[0] == 'r') {
            for (size_t i = s.u.s.n + 1; i-- > 0 && !f;)
                if (i + sub.u.s.n <= s.u.s.n && memcmp(s.u.s.s + i, sub.u.s.s, sub.u.s.n) == 0)
                    f = s.u.s.s + i;
        } else {
            f = find_in(s.u.s.s, s.u.s.n, sub.u.s.s, sub.u.s.n);
        }
        if (!f && m[0] == 'i') return jj_fail(c, FMOE_EINVAL, "substring not found");
        *out = jv_int(f ? (int64_t)jj_utf8_len(s.u.s.s, (size_t)(f - s.u.s.s)) : -1);
        return 0;
    }
    if (!strcmp(m, "join")) {
        jv items;
        FMOE_FORWARD_IF_ERROR(jj_iterable(c, arg(a, 0, NULL, none), &items));
        jj_sb sb = {0};
        int rc = 0;
        for (size_t i = 0; rc == 0 && i < items.u.l->n; i++) {
            if (items.u.l->v[i].k != JV_STR)
                rc = jj_fail(c, FMOE_EINVAL, "join(): item %zu is a %s, not a string", i,
                             jv_kind_name(items.u.l->v[i]));
            if (rc == 0 && i) rc = jj_sb_put(&sb, s.u.s.s, s.u.s.n);
            if (rc == 0) rc = jv_to_sb(&sb, items.u.l->v[i]);
        }
        if (rc == 0) *out = arena_str(c, &sb, &rc);
        free(sb.p);
        return rc;
    }
    if (!strcmp(m, "format")) return format(c, s, a, out);
    if (!strcmp(m, "splitlines")) {
        FMOE_FORWARD_IF_ERROR(jv_list_new(c->A, 4, out));
        const char *p = s.u.s.s, *e = p + s.u.s.n;
        while (p < e) {
            const char *q = p;
            while (q < e && *q != '\n' && *q != '\r') q++;
            FMOE_FORWARD_IF_ERROR(jv_list_push(c->A, *out, jv_strn(p, (size_t)(q - p))));
            if (q < e && *q == '\r' && q + 1 < e && q[1] == '\n') q++;
            p = q + 1;
        }
        return 0;
    }
    if (!strcmp(m, "isdigit") || !strcmp(m, "isalpha") || !strcmp(m, "isspace") ||
        !strcmp(m, "isalnum") || !strcmp(m, "isupper") || !strcmp(m, "islower")) {
        int r = s.u.s.n > 0, cased = 0;
        for (size_t i = 0; i < s.u.s.n; i++) {
            unsigned char ch = (unsigned char)s.u.s.s[i];
            switch (m[2]) {
            case 'd': r &= isdigit(ch) != 0; break;
            case 'a': r &= m[4] == 'n' ? isalnum(ch) != 0 : isalpha(ch) != 0; break;
            case 's': r &= is_ws(ch); break;
            case 'u': r &= !islower(ch); cased |= isupper(ch) != 0; break;
            default: r &= !isupper(ch); cased |= islower(ch) != 0; break;
            }
        }
        if (m[2] == 'u' || m[2] == 'l') r &= cased;
        *out = jv_bool(r);
        return 0;
    }
    return 0; /* not reached: jj_method only binds the names above */
}

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

static int pairs(jj_ctx *c, jv d, jv *out) {
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

static int dict_method(jj_ctx *c, const char *m, jv d, const argv_t *a, jv *out) {
    if (!strcmp(m, "items")) return pairs(c, d, out);
    if (!strcmp(m, "keys") || !strcmp(m, "values")) {
        FMOE_FORWARD_IF_ERROR(jv_list_new(c->A, d.u.d->n, out));
        for (size_t i = 0; i < d.u.d->n; i++)
            FMOE_FORWARD_IF_ERROR(
                jv_list_push(c->A, *out, m[0] == 'k' ? d.u.d->key[i] : d.u.d->val[i]));
        return 0;
    }
    if (!strcmp(m, "get")) {
        jv *v = jv_dict_get(d, arg(a, 0, NULL, jv_none()));
        *out = v ? *v : arg(a, 1, NULL, jv_none());
        return 0;
    }
    /* copy */
    FMOE_FORWARD_IF_ERROR(jv_dict_new(c->A, out));
    for (size_t i = 0; i < d.u.d->n; i++)
        FMOE_FORWARD_IF_ERROR(jv_dict_set(c->A, *out, d.u.d->key[i], d.u.d->val[i]));
    return 0;
}

/* ---- globals --------------------------------------------------------------------------- */

static int g_range(jj_ctx *c, const argv_t *a, jv *out) {
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

static int g_dict(jj_ctx *c, const argv_t *a, jv *out, int ns) {
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

static int g_strftime(jj_ctx *c, const argv_t *a, jv *out) {
    jv fmt = arg(a, 0, "format", jv_undef());
    FMOE_FORWARD_IF_ERROR(want_str(c, fmt, "strftime_now()"));
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
    argv_t a = {args, nargs, kwnames, kw, nkw};
    const char *m = f->name;
    jv self = f->self;
    switch (self.k) {
    case JV_UNDEF:
        if (!strcmp(m, "range")) return g_range(c, &a, out);
        if (!strcmp(m, "dict")) return g_dict(c, &a, out, 0);
        if (!strcmp(m, "namespace")) return g_dict(c, &a, out, 1);
        if (!strcmp(m, "strftime_now")) return g_strftime(c, &a, out);
        if (!strcmp(m, "raise_exception")) {
            jv msg = arg(&a, 0, NULL, jv_str(""));
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
    case JV_STR: return str_method(c, m, self, &a, out);
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
            jv x = arg(&a, 0, NULL, jv_undef());
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
            *r = find_in(o.u.s.s, o.u.s.n, v.u.s.s, v.u.s.n) != NULL;
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

/* ---- filters --------------------------------------------------------------------------- */

/* attribute="a.b" or an int index, as jinja2's make_attrgetter reads it. */
static int attr_path(jj_ctx *c, jv v, jv path, jv *out) {
    if (path.k == JV_INT) {
        *out = jv_undef();
        if (v.k == JV_LIST && path.u.i >= 0 && (size_t)path.u.i < v.u.l->n) *out = v.u.l->v[path.u.i];
        return 0;
    }
    FMOE_FORWARD_IF_ERROR(want_str(c, path, "attribute="));
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
    if (v.k == JV_STR && !case_sensitive) return recase(c, v, CASE_LOWER, out);
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

static int f_indent(jj_ctx *c, jv s, const argv_t *a, jv *out) {
    jv w = arg(a, 1, "width", jv_int(4));
    int first = jv_truthy(arg(a, 2, "first", jv_bool(0)));
    int blank = jv_truthy(arg(a, 3, "blank", jv_bool(0)));
    jj_sb ind = {0}, sb = {0};
    int rc = 0;
    if (w.k == JV_STR) rc = jj_sb_put(&ind, w.u.s.s, w.u.s.n);
    else
        for (int64_t i = 0; rc == 0 && i < (w.k == JV_INT ? w.u.i : 4); i++) rc = jj_sb_puts(&ind, " ");
    jv lines;
    /* jinja2 appends "\n" before splitlines, so a trailing newline is a line */
    jv sn = s;
    if (rc == 0) rc = str_method(c, "splitlines", s, &(argv_t){0}, &lines);
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
    if (rc == 0) *out = arena_str(c, &sb, &rc);
    free(sb.p);
    return rc;
}

/* select/reject/selectattr/rejectattr */
static int f_select(jj_ctx *c, jv seq, const argv_t *a, int attr, int keep, jv *out) {
    jv items;
    /* jinja2 yields nothing for a false value (None included) */
    if (jv_truthy(seq)) FMOE_FORWARD_IF_ERROR(jj_iterable(c, seq, &items));
    else FMOE_FORWARD_IF_ERROR(jv_list_new(c->A, 0, &items));
    FMOE_FORWARD_IF_ERROR(jv_list_new(c->A, items.u.l->n, out));
    out->u.l->gen = 1;
    size_t t0 = attr ? 1 : 0;
    jv tname = t0 < a->nargs ? a->args[t0] : jv_undef();
    if (tname.k != JV_UNDEF) FMOE_FORWARD_IF_ERROR(want_str(c, tname, "select test name"));
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

static int f_map(jj_ctx *c, jv seq, const argv_t *a, jv *out) {
    jv items;
    if (jv_truthy(seq)) FMOE_FORWARD_IF_ERROR(jj_iterable(c, seq, &items));
    else FMOE_FORWARD_IF_ERROR(jv_list_new(c->A, 0, &items));
    FMOE_FORWARD_IF_ERROR(jv_list_new(c->A, items.u.l->n, out));
    out->u.l->gen = 1;
    jv at = arg(a, 99, "attribute", jv_undef());
    jv def = arg(a, 99, "default", jv_undef());
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
        while (is_ws((unsigned char)*end)) end++;
        if (end != buf && !*end) {
            *out = jv_int(i);
            return 0;
        }
        double d = strtod(buf, &end);
        while (is_ws((unsigned char)*end)) end++;
        *out = end != buf && !*end && isfinite(d) ? jv_int((int64_t)d) : def;
        return 0;
    }
    default: *out = def; return 0;
    }
}

static int f_round(jj_ctx *c, jv v, const argv_t *a, jv *out) {
    jv p = arg(a, 1, "precision", jv_int(0));
    jv method = arg(a, 2, "method", jv_str("common"));
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
    argv_t a = {args, nargs, kwnames, kw, nkw};
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
        jv ind = arg(&a, 2, "indent", none), sep = arg(&a, 3, "separators", none);
        jj_json_opts jo = {.indent = -1,
                           .ensure_ascii = jv_truthy(arg(&a, 1, "ensure_ascii", jv_bool(0))),
                           .sort_keys = jv_truthy(arg(&a, 4, "sort_keys", jv_bool(0)))};
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
        *out = arena_str(c, &sb, &rc);
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
        jv def = arg(&a, 1, "default_value", jv_str(""));
        int boolean = jv_truthy(arg(&a, 2, "boolean", jv_bool(0)));
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
        else FMOE_FORWARD_IF_ERROR(pairs(c, v, out));
        return 1;
    }
    if (!strcmp(f, "int")) {
        FMOE_FORWARD_IF_ERROR(to_int(c, v, arg(&a, 1, "default", jv_int(0)), out));
        return 1;
    }
    if (!strcmp(f, "float")) {
        jv def = arg(&a, 1, "default", jv_float(0));
        if (v.k == JV_FLOAT) *out = v;
        else if (v.k == JV_INT) *out = jv_float((double)v.u.i);
        else if (v.k == JV_BOOL) *out = jv_float(v.u.b);
        else if (v.k == JV_STR) {
            char buf[64], *end;
            snprintf(buf, sizeof buf, "%.*s", (int)(v.u.s.n < 63 ? v.u.s.n : 63), v.u.s.s);
            double d = strtod(buf, &end);
            while (is_ws((unsigned char)*end)) end++;
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
        jv items, sep = arg(&a, 1, "d", jv_str("")), at = arg(&a, 2, "attribute", none);
        FMOE_FORWARD_IF_ERROR(jj_iterable(c, v, &items));
        jj_sb sb = {0};
        int rc = 0;
        for (size_t i = 0; rc == 0 && i < items.u.l->n; i++) {
            jv x = items.u.l->v[i];
            if (at.k != JV_NONE) rc = attr_path(c, x, at, &x);
            if (rc == 0 && i) rc = jv_to_sb(&sb, sep);
            if (rc == 0) rc = jv_to_sb(&sb, x);
        }
        if (rc == 0) *out = arena_str(c, &sb, &rc);
        free(sb.p);
        FMOE_FORWARD_IF_ERROR(rc);
        return 1;
    }
    if (!strcmp(f, "sort")) {
        jv items;
        FMOE_FORWARD_IF_ERROR(jj_iterable(c, v, &items));
        FMOE_FORWARD_IF_ERROR(sort_list(c, items, arg(&a, 3, "attribute", none), -1,
                                        jv_truthy(arg(&a, 2, "case_sensitive", jv_bool(0))),
                                        jv_truthy(arg(&a, 1, "reverse", jv_bool(0))), out));
        return 1;
    }
    if (!strcmp(f, "dictsort")) {
        if (v.k != JV_DICT) return jj_fail(c, FMOE_EINVAL, "dictsort needs a dict");
        jv p;
        FMOE_FORWARD_IF_ERROR(pairs(c, v, &p));
        jv by = arg(&a, 2, "by", jv_str("key"));
        int pos = by.k == JV_STR && by.u.s.n == 5 && !memcmp(by.u.s.s, "value", 5) ? 1 : 0;
        FMOE_FORWARD_IF_ERROR(sort_list(c, p, none, pos,
                                        jv_truthy(arg(&a, 1, "case_sensitive", jv_bool(0))),
                                        jv_truthy(arg(&a, 3, "reverse", jv_bool(0))), out));
        return 1;
    }
    if (!strcmp(f, "reverse")) {
        if (v.k == JV_STR) {
            jv items;
            FMOE_FORWARD_IF_ERROR(jj_iterable(c, v, &items));
            jj_sb sb = {0};
            int rc = 0;
            for (size_t i = items.u.l->n; rc == 0 && i-- > 0;) rc = jv_to_sb(&sb, items.u.l->v[i]);
            if (rc == 0) *out = arena_str(c, &sb, &rc);
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
        jv items, at = arg(&a, 2, "attribute", none);
        int cs = jv_truthy(arg(&a, 1, "case_sensitive", jv_bool(0)));
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
        FMOE_FORWARD_IF_ERROR(f_map(c, v, &(argv_t){args + 1, nargs - 1, kwnames, kw, nkw}, out));
        return 1;
    }
    if (!strcmp(f, "select") || !strcmp(f, "reject") || !strcmp(f, "selectattr") ||
        !strcmp(f, "rejectattr")) {
        if (f[6] == 'a' && nargs < 2) return jj_fail(c, FMOE_EINVAL, "%s needs an attribute", f);
        FMOE_FORWARD_IF_ERROR(f_select(c, v, &(argv_t){args + 1, nargs - 1, NULL, NULL, 0},
                                       f[6] == 'a', f[0] == 's', out));
        return 1;
    }
    if (!strcmp(f, "batch")) {
        jv n = arg(&a, 1, "linecount", jv_int(1)), fill = arg(&a, 2, "fill_with", none);
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
            jv acc = arg(&a, 2, "start", jv_int(0)), at = arg(&a, 1, "attribute", none);
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
    if (!strcmp(f, "trim")) *out = strip(s, arg(&a, 1, "chars", none), 1, 1);
    else if (!strcmp(f, "lower")) FMOE_FORWARD_IF_ERROR(recase(c, s, CASE_LOWER, out));
    else if (!strcmp(f, "upper")) FMOE_FORWARD_IF_ERROR(recase(c, s, CASE_UPPER, out));
    else if (!strcmp(f, "title")) FMOE_FORWARD_IF_ERROR(recase(c, s, CASE_TITLE_JINJA, out));
    else if (!strcmp(f, "capitalize")) FMOE_FORWARD_IF_ERROR(recase(c, s, CASE_CAPITALIZE, out));
    else if (!strcmp(f, "replace")) {
        jv n = arg(&a, 3, "count", none);
        FMOE_FORWARD_IF_ERROR(replace(c, s, arg(&a, 1, "old", none), arg(&a, 2, "new", none),
                                      n.k == JV_INT ? n.u.i : -1, out));
    } else if (!strcmp(f, "indent")) FMOE_FORWARD_IF_ERROR(f_indent(c, s, &a, out));
    else { /* wordcount */
        jv words;
        FMOE_FORWARD_IF_ERROR(split(c, s, none, -1, &words));
        *out = jv_int((int64_t)words.u.l->n);
    }
    return 1;
}
