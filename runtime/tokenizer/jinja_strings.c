/*
 * jinja_strings.c - Python's str methods as templates call them (strip, split, replace,
 * startswith, format, ...), and the argument and string helpers the filters share (see
 * jinja.h).
 *
 * Case mapping (upper, lower, title, capitalize) is ASCII only: other letters are left as
 * they are, where Python would map them. Whitespace is Python's ASCII whitespace.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "jinja.h"

#define OOM() fmoe_error_set(FMOE_ENOMEM, "chat template: out of memory")

/* ---- argument helpers ------------------------------------------------------------------ */


/* The argument at position `pos` or named `name`, else `def`. */
jv jj_arg(const jj_args *a, size_t pos, const char *name, jv def) {
    for (size_t k = 0; k < a->nkw; k++)
        if (name && strcmp(a->kwn[k], name) == 0) return a->kw[k];
    return pos < a->nargs ? a->args[pos] : def;
}

int jj_want_str(jj_ctx *c, jv v, const char *what) {
    if (v.k != JV_STR)
        return jj_fail(c, FMOE_EINVAL, "%s needs a string, not %s", what, jv_kind_name(v));
    return 0;
}

jv jj_str_out(jj_ctx *c, jj_sb *sb, int *rc) {
    char *s = jj_strndup(c->A, sb->p ? sb->p : "", sb->n);
    if (!s) *rc = OOM();
    jv v = jv_strn(s ? s : "", s ? sb->n : 0);
    free(sb->p);
    sb->p = NULL;
    return v;
}

int jj_is_space(unsigned char ch) {
    return ch == ' ' || (ch >= '\t' && ch <= '\r') || (ch >= 0x1c && ch <= 0x1f);
}

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
    if (rc == 0) *out = jj_str_out(c, &sb, &rc);
    free(sb.p);
    out->safe = 1;
    return rc;
}


int jj_recase(jj_ctx *c, jv s, jj_casing how, jv *out) {
    char *o = jj_alloc(c->A, s.u.s.n + 1);
    if (!o) return OOM();
    int start = 1; /* at a word start */
    for (size_t i = 0; i < s.u.s.n; i++) {
        unsigned char ch = (unsigned char)s.u.s.s[i];
        switch (how) {
        case JJ_CASE_UPPER: o[i] = (char)toupper(ch); break;
        case JJ_CASE_LOWER: o[i] = (char)tolower(ch); break;
        case JJ_CASE_CAPITALIZE: o[i] = (char)(i == 0 ? toupper(ch) : tolower(ch)); break;
        case JJ_CASE_TITLE_PY: /* str.title(): a letter after a non-letter starts a word */
            o[i] = (char)(start ? toupper(ch) : tolower(ch));
            start = !isalpha(ch) && ch < 0x80;
            break;
        case JJ_CASE_TITLE_JINJA: /* |title: words split at whitespace, - ( { [ < */
            o[i] = (char)(start ? toupper(ch) : tolower(ch));
            start = jj_is_space(ch) || ch == '-' || ch == '(' || ch == '{' || ch == '[' || ch == '<';
            break;
        }
    }
    *out = jv_strn(o, s.u.s.n);
    return 0;
}

static int in_set(unsigned char ch, jv chars) {
    if (chars.k != JV_STR) return jj_is_space(ch);
    return memchr(chars.u.s.s, ch, chars.u.s.n) != NULL;
}

/* strip/lstrip/rstrip with Python's chars argument (ASCII chars; multi-byte characters in
 * `chars` are compared byte-wise, which is exact for UTF-8 when whole characters match). */
jv jj_strip(jv s, jv chars, int left, int right) {
    const char *a = s.u.s.s, *e = a + s.u.s.n;
    if (left) while (a < e && in_set((unsigned char)*a, chars)) a++;
    if (right) while (e > a && in_set((unsigned char)e[-1], chars)) e--;
    return jv_strn(a, (size_t)(e - a));
}

const char *jj_find(const char *h, size_t hn, const char *n, size_t nn) {
    if (nn == 0) return h;
    for (size_t i = 0; i + nn <= hn; i++)
        if (memcmp(h + i, n, nn) == 0) return h + i;
    return NULL;
}

int jj_replace(jj_ctx *c, jv s, jv old, jv new_, int64_t count, jv *out) {
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
            const char *f = jj_find(p, (size_t)(e - p), old.u.s.s, old.u.s.n);
            if (!f) break;
            rc = jj_sb_put(&sb, p, (size_t)(f - p));
            if (rc == 0) rc = jj_sb_put(&sb, new_.u.s.s, new_.u.s.n);
            p = f + old.u.s.n;
            done++;
        }
        if (rc == 0) rc = jj_sb_put(&sb, p, (size_t)(e - p));
    }
    if (rc == 0) *out = jj_str_out(c, &sb, &rc);
    free(sb.p);
    return rc;
}

int jj_split(jj_ctx *c, jv s, jv sep, int64_t maxsplit, jv *out) {
    FMOE_FORWARD_IF_ERROR(jv_list_new(c->A, 4, out));
    const char *p = s.u.s.s, *e = p + s.u.s.n;
    int64_t done = 0;
    if (sep.k == JV_NONE || sep.k == JV_UNDEF) { /* runs of whitespace, no empty items */
        for (;;) {
            while (p < e && jj_is_space((unsigned char)*p)) p++;
            if (p >= e) return 0;
            const char *q = p;
            if (maxsplit >= 0 && done >= maxsplit) q = e;
            else
                while (q < e && !jj_is_space((unsigned char)*q)) q++;
            if (q == e && maxsplit >= 0 && done >= maxsplit) {
                const char *t = e;
                while (t > p && jj_is_space((unsigned char)t[-1])) t--;
                q = t;
            }
            FMOE_FORWARD_IF_ERROR(jv_list_push(c->A, *out, jv_strn(p, (size_t)(q - p))));
            done++;
            p = q;
        }
    }
    FMOE_FORWARD_IF_ERROR(jj_want_str(c, sep, "split()"));
    if (sep.u.s.n == 0) return jj_fail(c, FMOE_EINVAL, "split(): empty separator");
    for (;;) {
        const char *f = maxsplit >= 0 && done >= maxsplit
                            ? NULL
                            : jj_find(p, (size_t)(e - p), sep.u.s.s, sep.u.s.n);
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
    FMOE_FORWARD_IF_ERROR(jj_want_str(c, fix, end ? "endswith()" : "startswith()"));
    size_t n = fix.u.s.n;
    *r = n <= s.u.s.n && memcmp(end ? s.u.s.s + s.u.s.n - n : s.u.s.s, fix.u.s.s, n) == 0;
    return 0;
}

/* str.format with "{}", "{0}" and "{name}" fields (no format specs). */
static int format(jj_ctx *c, jv s, const jj_args *a, jv *out) {
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
    if (rc == 0) *out = jj_str_out(c, &sb, &rc);
    free(sb.p);
    return rc;
}

int jj_str_method(jj_ctx *c, const char *m, jv s, const jj_args *a, jv *out) {
    jv none = jv_none();
    if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip")) {
        *out = jj_strip(s, jj_arg(a, 0, "chars", none), m[0] != 'r', m[0] != 'l');
        return 0;
    }
    if (!strcmp(m, "upper")) return jj_recase(c, s, JJ_CASE_UPPER, out);
    if (!strcmp(m, "lower")) return jj_recase(c, s, JJ_CASE_LOWER, out);
    if (!strcmp(m, "title")) return jj_recase(c, s, JJ_CASE_TITLE_PY, out);
    if (!strcmp(m, "capitalize")) return jj_recase(c, s, JJ_CASE_CAPITALIZE, out);
    if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
        int r;
        FMOE_FORWARD_IF_ERROR(affix(c, s, jj_arg(a, 0, NULL, jv_undef()), m[0] == 'e', &r));
        *out = jv_bool(r);
        return 0;
    }
    if (!strcmp(m, "split")) {
        jv ms = jj_arg(a, 1, "maxsplit", jv_int(-1));
        return jj_split(c, s, jj_arg(a, 0, "sep", none), ms.k == JV_INT ? ms.u.i : -1, out);
    }
    if (!strcmp(m, "replace")) {
        jv n = jj_arg(a, 2, "count", jv_int(-1));
        return jj_replace(c, s, jj_arg(a, 0, NULL, none), jj_arg(a, 1, NULL, none),
                       n.k == JV_INT ? n.u.i : -1, out);
    }
    if (!strcmp(m, "find") || !strcmp(m, "rfind") || !strcmp(m, "index") || !strcmp(m, "count")) {
        jv sub = jj_arg(a, 0, NULL, none);
        FMOE_FORWARD_IF_ERROR(jj_want_str(c, sub, m));
        if (!strcmp(m, "count")) {
            int64_t k = 0;
            const char *p = s.u.s.s, *e = p + s.u.s.n, *f;
            if (sub.u.s.n == 0) k = (int64_t)jj_utf8_len(p, s.u.s.n) + 1;
            else
                while ((f = jj_find(p, (size_t)(e - p), sub.u.s.s, sub.u.s.n))) {
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
            f = jj_find(s.u.s.s, s.u.s.n, sub.u.s.s, sub.u.s.n);
        }
        if (!f && m[0] == 'i') return jj_fail(c, FMOE_EINVAL, "substring not found");
        *out = jv_int(f ? (int64_t)jj_utf8_len(s.u.s.s, (size_t)(f - s.u.s.s)) : -1);
        return 0;
    }
    if (!strcmp(m, "join")) {
        jv items;
        FMOE_FORWARD_IF_ERROR(jj_iterable(c, jj_arg(a, 0, NULL, none), &items));
        jj_sb sb = {0};
        int rc = 0;
        for (size_t i = 0; rc == 0 && i < items.u.l->n; i++) {
            if (items.u.l->v[i].k != JV_STR)
                rc = jj_fail(c, FMOE_EINVAL, "join(): item %zu is a %s, not a string", i,
                             jv_kind_name(items.u.l->v[i]));
            if (rc == 0 && i) rc = jj_sb_put(&sb, s.u.s.s, s.u.s.n);
            if (rc == 0) rc = jv_to_sb(&sb, items.u.l->v[i]);
        }
        if (rc == 0) *out = jj_str_out(c, &sb, &rc);
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
            case 's': r &= jj_is_space(ch); break;
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
