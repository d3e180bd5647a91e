/*
 * jinja_value.c - the values a chat template computes with, as Python has them (see jinja.h).
 *
 * Output bytes depend on Python's spelling of values, so that spelling is reproduced here:
 * str(None) is "None", booleans "True"/"False", floats the shortest text that reads back
 * to the same double (float.__repr__), lists and dicts as their repr with quotes chosen
 * the way Python chooses them, and tojson as transformers' json.dumps(ensure_ascii=False).
 * Dicts keep insertion order (Python's), with a linear lookup: template dicts are small.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "jinja.h"

#define OOM() fmoe_error_set(FMOE_ENOMEM, "chat template: out of memory")

/* ---- arena ----------------------------------------------------------------------------- */

typedef struct chunk {
    struct chunk *next;
    size_t used, cap;
    max_align_t data[];
} chunk;

struct jj_arena {
    chunk *head;
    size_t total;
    int over; /* an allocation went past JJ_MAX_ARENA */
};

int jj_arena_over(const jj_arena *a) { return a->over; }

jj_arena *jj_arena_new(void) { return calloc(1, sizeof(jj_arena)); }

void jj_arena_free(jj_arena *a) {
    if (!a) return;
    for (chunk *c = a->head, *n; c; c = n) {
        n = c->next;
        free(c);
    }
    free(a);
}

void *jj_alloc(jj_arena *a, size_t n) {
    size_t al = sizeof(max_align_t);
    n = (n + al - 1) / al * al;
    if (n == 0) n = al;
    chunk *c = a->head;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        if (a->total + cap > JJ_MAX_ARENA) {
            a->over = 1;
            return NULL;
        }
        c = malloc(sizeof *c + cap);
        if (!c) return NULL;
        c->used = 0;
        c->cap = cap;
        c->next = a->head;
        a->head = c;
        a->total += cap;
    }
    void *p = (char *)c->data + c->used;
    c->used += n;
    memset(p, 0, n);
    return p;
}

char *jj_strndup(jj_arena *a, const char *s, size_t n) {
    char *p = jj_alloc(a, n + 1);
    if (p && n) memcpy(p, s, n);
    return p;
}

/* ---- containers ------------------------------------------------------------------------ */

jv jv_str(const char *s) { return jv_strn(s, strlen(s)); }

int jv_list_new(jj_arena *a, size_t cap, jv *out) {
    jj_list *l = jj_alloc(a, sizeof *l);
    if (!l) return OOM();
    if (cap && !(l->v = jj_alloc(a, cap * sizeof(jv)))) return OOM();
    l->cap = cap;
    *out = (jv){.k = JV_LIST, .u.l = l};
    return 0;
}

int jv_list_push(jj_arena *a, jv list, jv item) {
    jj_list *l = list.u.l;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 8;
        jv *nv = jj_alloc(a, cap * sizeof *nv);
        if (!nv) return OOM();
        if (l->n) memcpy(nv, l->v, l->n * sizeof *nv);
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = item;
    return 0;
}

int jv_dict_new(jj_arena *a, jv *out) {
    jj_dict *d = jj_alloc(a, sizeof *d);
    if (!d) return OOM();
    *out = (jv){.k = JV_DICT, .u.d = d};
    return 0;
}

jv *jv_dict_get(jv dict, jv key) {
    jj_dict *d = dict.u.d;
    for (size_t i = 0; i < d->n; i++)
        if (jv_eq(d->key[i], key)) return &d->val[i];
    return NULL;
}

jv *jv_dict_getn(jv dict, const char *key, size_t n) {
    jj_dict *d = dict.u.d;
    for (size_t i = 0; i < d->n; i++)
        if (d->key[i].k == JV_STR && d->key[i].u.s.n == n && memcmp(d->key[i].u.s.s, key, n) == 0)
            return &d->val[i];
    return NULL;
}

int jv_dict_set(jj_arena *a, jv dict, jv key, jv val) {
    jv *have = jv_dict_get(dict, key);
    if (have) {
        *have = val;
        return 0;
    }
    jj_dict *d = dict.u.d;
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 8;
        jv *nk = jj_alloc(a, cap * sizeof *nk), *nv = jj_alloc(a, cap * sizeof *nv);
        if (!nk || !nv) return OOM();
        if (d->n) {
            memcpy(nk, d->key, d->n * sizeof *nk);
            memcpy(nv, d->val, d->n * sizeof *nv);
        }
        d->key = nk;
        d->val = nv;
        d->cap = cap;
    }
    d->key[d->n] = key;
    d->val[d->n++] = val;
    return 0;
}

/* ---- predicates ------------------------------------------------------------------------ */

int jv_truthy(jv v) {
    switch (v.k) {
    case JV_UNDEF:
    case JV_NONE: return 0;
    case JV_BOOL: return v.u.b;
    case JV_INT: return v.u.i != 0;
    case JV_FLOAT: return v.u.f != 0;
    case JV_STR: return v.u.s.n > 0;
    case JV_LIST: return v.u.l->gen || v.u.l->n > 0;
    case JV_DICT: return v.u.d->n > 0;
    default: return 1;
    }
}

static int is_num(jv v) { return v.k == JV_BOOL || v.k == JV_INT || v.k == JV_FLOAT; }
static double num(jv v) {
    return v.k == JV_FLOAT ? v.u.f : v.k == JV_INT ? (double)v.u.i : (double)v.u.b;
}
static int64_t inum(jv v) { return v.k == JV_INT ? v.u.i : v.u.b; }

/* Python raises RecursionError comparing values nested ~1000 deep; past JJ_MAX_DEPTH they
 * are taken as different, which keeps the C stack bounded. */
static int eq(jv a, jv b, int level) {
    if (level > JJ_MAX_DEPTH) return 0;
    if (is_num(a) && is_num(b)) {
        if (a.k != JV_FLOAT && b.k != JV_FLOAT) return inum(a) == inum(b);
        return num(a) == num(b);
    }
    if (a.k != b.k) return 0;
    switch (a.k) {
    case JV_UNDEF:
    case JV_NONE: return 1;
    case JV_STR: return a.u.s.n == b.u.s.n && memcmp(a.u.s.s, b.u.s.s, a.u.s.n) == 0;
    case JV_LIST:
        if (a.u.l->n != b.u.l->n) return 0;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!eq(a.u.l->v[i], b.u.l->v[i], level + 1)) return 0;
        return 1;
    case JV_DICT:
        if (a.u.d->n != b.u.d->n) return 0;
        for (size_t i = 0; i < a.u.d->n; i++) {
            jv *o = jv_dict_get(b, a.u.d->key[i]);
            if (!o || !eq(a.u.d->val[i], *o, level + 1)) return 0;
        }
        return 1;
    case JV_NS: return a.u.d == b.u.d;
    case JV_MACRO: return a.u.m == b.u.m;
    case JV_FUNC: return a.u.fn == b.u.fn;
    default: return 0;
    }
}

int jv_eq(jv a, jv b) { return eq(a, b, 0); }

static int cmp_at(jv a, jv b, int *cmp, int level) {
    if (level > JJ_MAX_DEPTH)
        return fmoe_error_set(FMOE_ERANGE, "values nested more than %d deep compared",
                              JJ_MAX_DEPTH);
    if (is_num(a) && is_num(b)) {
        if (a.k != JV_FLOAT && b.k != JV_FLOAT) *cmp = (inum(a) > inum(b)) - (inum(a) < inum(b));
        else *cmp = (num(a) > num(b)) - (num(a) < num(b));
        return 0;
    }
    if (a.k == JV_STR && b.k == JV_STR) {
        /* UTF-8 byte order is code point order, which is Python's */
        size_t n = a.u.s.n < b.u.s.n ? a.u.s.n : b.u.s.n;
        int c = n ? memcmp(a.u.s.s, b.u.s.s, n) : 0;
        *cmp = c ? (c > 0) - (c < 0) : (a.u.s.n > b.u.s.n) - (a.u.s.n < b.u.s.n);
        return 0;
    }
    if (a.k == JV_LIST && b.k == JV_LIST) {
        for (size_t i = 0; i < a.u.l->n && i < b.u.l->n; i++) {
            if (jv_eq(a.u.l->v[i], b.u.l->v[i])) continue;
            return cmp_at(a.u.l->v[i], b.u.l->v[i], cmp, level + 1);
        }
        *cmp = (a.u.l->n > b.u.l->n) - (a.u.l->n < b.u.l->n);
        return 0;
    }
    return fmoe_error_set(FMOE_EINVAL, "'<' not supported between %s and %s", jv_kind_name(a),
                          jv_kind_name(b));
}

int jv_cmp(jv a, jv b, int *cmp) { return cmp_at(a, b, cmp, 0); }

const char *jv_kind_name(jv v) {
    static const char *const N[] = {"undefined", "none", "bool", "int", "float", "str",
                                    "list", "dict", "namespace", "macro", "function"};
    return N[v.k];
}

size_t jj_utf8_len(const char *s, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += ((unsigned char)s[i] & 0xC0) != 0x80;
    return k;
}

size_t jj_utf8_off(const char *s, size_t n, size_t cp) {
    size_t i = 0;
    while (i < n && cp > 0) {
        i++;
        while (i < n && ((unsigned char)s[i] & 0xC0) == 0x80) i++;
        cp--;
    }
    return i;
}

/* ---- string builder -------------------------------------------------------------------- */

int jj_sb_put(jj_sb *b, const char *s, size_t n) {
    if (b->n + n + 1 > JJ_MAX_OUTPUT)
        return fmoe_error_set(FMOE_ERANGE, "chat template: output is over %u bytes",
                              (unsigned)JJ_MAX_OUTPUT);
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return OOM();
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
    return 0;
}

int jj_sb_puts(jj_sb *b, const char *s) { return jj_sb_put(b, s, strlen(s)); }

/* ---- str() and repr() ------------------------------------------------------------------ */

/* float.__repr__: the shortest digits that read back exactly, in Python's layout. */
static void float_repr(double f, char *out, size_t cap) {
    if (isnan(f)) {
        snprintf(out, cap, "nan");
        return;
    }
    if (isinf(f)) {
        snprintf(out, cap, f < 0 ? "-inf" : "inf");
        return;
    }
    char buf[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec - 1, f);
        if (strtod(buf, NULL) == f) break;
    }
    /* buf: [-]d[.ddd]e[+-]XX */
    const char *p = buf;
    char *o = out;
    if (*p == '-') *o++ = *p++;
    char digits[20];
    int nd = 0;
    for (; *p && *p != 'e'; p++)
        if (*p != '.') digits[nd++] = *p;
    int exp = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    if (exp < -4 || exp >= 16) {
        *o++ = digits[0];
        if (nd > 1) {
            *o++ = '.';
            for (int i = 1; i < nd; i++) *o++ = digits[i];
        }
        snprintf(o, cap - (size_t)(o - out), "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
        return;
    }
    if (exp < 0) {
        *o++ = '0';
        *o++ = '.';
        for (int i = 0; i < -exp - 1; i++) *o++ = '0';
        for (int i = 0; i < nd; i++) *o++ = digits[i];
    } else {
        for (int i = 0; i <= exp; i++) *o++ = i < nd ? digits[i] : '0';
        *o++ = '.';
        if (nd > exp + 1)
            for (int i = exp + 1; i < nd; i++) *o++ = digits[i];
        else
            *o++ = '0';
    }
    *o = '\0';
}

static int str_repr(jj_sb *b, const char *s, size_t n) {
    char q = '\'';
    if (memchr(s, '\'', n) && !memchr(s, '"', n)) q = '"';
    FMOE_FORWARD_IF_ERROR(jj_sb_put(b, &q, 1));
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        char e[8];
        if (ch == '\\' || ch == (unsigned char)q) {
            e[0] = '\\';
            e[1] = (char)ch;
            FMOE_FORWARD_IF_ERROR(jj_sb_put(b, e, 2));
        } else if (ch == '\n') FMOE_FORWARD_IF_ERROR(jj_sb_puts(b, "\\n"));
        else if (ch == '\r') FMOE_FORWARD_IF_ERROR(jj_sb_puts(b, "\\r"));
        else if (ch == '\t') FMOE_FORWARD_IF_ERROR(jj_sb_puts(b, "\\t"));
        else if (ch < 0x20 || ch == 0x7f) {
            snprintf(e, sizeof e, "\\x%02x", ch);
            FMOE_FORWARD_IF_ERROR(jj_sb_puts(b, e));
        } else FMOE_FORWARD_IF_ERROR(jj_sb_put(b, (const char *)&s[i], 1));
    }
    return jj_sb_put(b, &q, 1);
}

static int to_sb(jj_sb *b, jv v, int repr, int level) {
    char buf[64];
    if (level > JJ_MAX_DEPTH)
        return fmoe_error_set(FMOE_ERANGE, "a value nested more than %d deep printed",
                              JJ_MAX_DEPTH);
    switch (v.k) {
    case JV_UNDEF: return 0;
    case JV_NONE: return jj_sb_puts(b, "None");
    case JV_BOOL: return jj_sb_puts(b, v.u.b ? "True" : "False");
    case JV_INT:
        snprintf(buf, sizeof buf, "%lld", (long long)v.u.i);
        return jj_sb_puts(b, buf);
    case JV_FLOAT:
        float_repr(v.u.f, buf, sizeof buf);
        return jj_sb_puts(b, buf);
    case JV_STR: return repr ? str_repr(b, v.u.s.s, v.u.s.n) : jj_sb_put(b, v.u.s.s, v.u.s.n);
    case JV_LIST:
        if (v.u.l->gen)
            return fmoe_error_set(FMOE_EINVAL, "a generator (from map, select, ...) printed: "
                                  "jinja2 would print its memory address; add |list");
        FMOE_FORWARD_IF_ERROR(jj_sb_puts(b, v.u.l->tuple ? "(" : "["));
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i) FMOE_FORWARD_IF_ERROR(jj_sb_puts(b, ", "));
            FMOE_FORWARD_IF_ERROR(to_sb(b, v.u.l->v[i], 1, level + 1));
        }
        if (v.u.l->tuple && v.u.l->n == 1) FMOE_FORWARD_IF_ERROR(jj_sb_puts(b, ","));
        return jj_sb_puts(b, v.u.l->tuple ? ")" : "]");
    case JV_NS:
        FMOE_FORWARD_IF_ERROR(jj_sb_puts(b, "<Namespace "));
        /* fall through */
    case JV_DICT:
        FMOE_FORWARD_IF_ERROR(jj_sb_puts(b, "{"));
        for (size_t i = 0; i < v.u.d->n; i++) {
            if (i) FMOE_FORWARD_IF_ERROR(jj_sb_puts(b, ", "));
            FMOE_FORWARD_IF_ERROR(to_sb(b, v.u.d->key[i], 1, level + 1));
            FMOE_FORWARD_IF_ERROR(jj_sb_puts(b, ": "));
            FMOE_FORWARD_IF_ERROR(to_sb(b, v.u.d->val[i], 1, level + 1));
        }
        return jj_sb_puts(b, v.k == JV_NS ? "}>" : "}");
    case JV_MACRO: return jj_sb_puts(b, "<Macro>");
    case JV_FUNC:
        return fmoe_error_set(FMOE_EINVAL, "a function printed: jinja2 would print its memory "
                              "address (call it?)");
    }
    return 0;
}

int jv_to_sb(jj_sb *b, jv v) { return to_sb(b, v, 0, 0); }

int jv_to_str(jj_arena *a, jv v, jv *out) {
    if (v.k == JV_STR) {
        *out = v;
        return 0;
    }
    jj_sb b = {0};
    int rc = to_sb(&b, v, 0, 0);
    if (rc == 0) {
        char *s = jj_strndup(a, b.p ? b.p : "", b.n);
        if (!s) rc = OOM();
        else *out = jv_strn(s, b.n);
    }
    free(b.p);
    return rc;
}

/* ---- tojson ---------------------------------------------------------------------------- */

static int json_str(jj_sb *b, const char *s, size_t n, int ascii) {
    FMOE_FORWARD_IF_ERROR(jj_sb_puts(b, "\""));
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        const char *e = NULL;
        char u[16];
        size_t skip = 0;
        if (ch == '"') e = "\\\"";
        else if (ch == '\\') e = "\\\\";
        else if (ch == '\n') e = "\\n";
        else if (ch == '\r') e = "\\r";
        else if (ch == '\t') e = "\\t";
        else if (ch == '\b') e = "\\b";
        else if (ch == '\f') e = "\\f";
        else if (ch < 0x20 || (ascii && ch == 0x7f)) {
            snprintf(u, sizeof u, "\\u%04x", ch);
            e = u;
        } else if (ascii && ch >= 0x80) { /* \uXXXX, with a surrogate pair above U+FFFF */
            uint32_t cp = 0;
            int k = ch >= 0xF0 ? 3 : ch >= 0xE0 ? 2 : 1;
            cp = ch & (0x3F >> k);
            for (int j = 1; j <= k && i + (size_t)j < n; j++)
                cp = (cp << 6) | ((unsigned char)s[i + (size_t)j] & 0x3F);
            skip = (size_t)k;
            if (cp >= 0x10000)
                snprintf(u, sizeof u, "\\u%04x\\u%04x", 0xD800 + ((cp - 0x10000) >> 10),
                         0xDC00 + ((cp - 0x10000) & 0x3FF));
            else
                snprintf(u, sizeof u, "\\u%04x", cp);
            e = u;
        }
        if (!e) {
            run++;
            continue;
        }
        FMOE_FORWARD_IF_ERROR(jj_sb_put(b, s + i - run, run));
        run = 0;
        FMOE_FORWARD_IF_ERROR(jj_sb_puts(b, e));
        i += skip;
    }
    FMOE_FORWARD_IF_ERROR(jj_sb_put(b, s + n - run, run));
    return jj_sb_puts(b, "\"");
}

static int newline_indent(jj_sb *b, int indent, int level) {
    FMOE_FORWARD_IF_ERROR(jj_sb_puts(b, "\n"));
    for (int i = 0; i < indent * level; i++) FMOE_FORWARD_IF_ERROR(jj_sb_puts(b, " "));
    return 0;
}

static int json_key(jj_sb *b, jv k, int ascii) {
    switch (k.k) {
    case JV_STR: return json_str(b, k.u.s.s, k.u.s.n, ascii);
    case JV_NONE: return jj_sb_puts(b, "\"null\"");
    case JV_BOOL: return jj_sb_puts(b, k.u.b ? "\"true\"" : "\"false\"");
    case JV_INT:
    case JV_FLOAT: {
        FMOE_FORWARD_IF_ERROR(jj_sb_puts(b, "\""));
        FMOE_FORWARD_IF_ERROR(to_sb(b, k, 0, 0));
        return jj_sb_puts(b, "\"");
    }
    default:
        return fmoe_error_set(FMOE_EINVAL, "tojson: keys must be str, int, float, bool or None, "
                                           "not %s", jv_kind_name(k));
    }
}

static int tojson(jj_sb *b, jv v, const jj_json_opts *o, int level) {
    int indent = o->indent;
    /* json.dumps: ", " between items without indent, "," with it */
    const char *isep = o->item_sep ? o->item_sep : indent >= 0 ? "," : ", ";
    const char *ksep = o->key_sep ? o->key_sep : ": ";
    if (level > JJ_MAX_DEPTH) return fmoe_error_set(FMOE_ERANGE, "tojson: nesting too deep");
    char buf[64];
    switch (v.k) {
    case JV_NONE: return jj_sb_puts(b, "null");
    case JV_BOOL: return jj_sb_puts(b, v.u.b ? "true" : "false");
    case JV_INT: return to_sb(b, v, 0, 0);
    case JV_FLOAT:
        if (isnan(v.u.f)) return jj_sb_puts(b, "NaN");
        if (isinf(v.u.f)) return jj_sb_puts(b, v.u.f < 0 ? "-Infinity" : "Infinity");
        float_repr(v.u.f, buf, sizeof buf);
        return jj_sb_puts(b, buf);
    case JV_STR: return json_str(b, v.u.s.s, v.u.s.n, o->ensure_ascii);
    case JV_LIST:
        if (v.u.l->gen)
            return fmoe_error_set(FMOE_EINVAL, "tojson: Object of type generator is not JSON "
                                  "serializable (add |list)");
        if (v.u.l->n == 0) return jj_sb_puts(b, "[]");
        FMOE_FORWARD_IF_ERROR(jj_sb_puts(b, "["));
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i) FMOE_FORWARD_IF_ERROR(jj_sb_puts(b, isep));
            if (indent >= 0) FMOE_FORWARD_IF_ERROR(newline_indent(b, indent, level + 1));
            FMOE_FORWARD_IF_ERROR(tojson(b, v.u.l->v[i], o, level + 1));
        }
        if (indent >= 0) FMOE_FORWARD_IF_ERROR(newline_indent(b, indent, level));
        return jj_sb_puts(b, "]");
    case JV_DICT: {
        jj_dict *d = v.u.d;
        if (d->n == 0) return jj_sb_puts(b, "{}");
        size_t *ord = malloc(d->n * sizeof *ord);
        if (!ord) return OOM();
        for (size_t i = 0; i < d->n; i++) ord[i] = i;
        if (o->sort_keys) /* insertion sort: small dicts, stable */
            for (size_t i = 1; i < d->n; i++)
                for (size_t j = i; j > 0; j--) {
                    int c = 0;
                    if (jv_cmp(d->key[ord[j - 1]], d->key[ord[j]], &c) < 0 || c <= 0) break;
                    size_t t = ord[j];
                    ord[j] = ord[j - 1];
                    ord[j - 1] = t;
                }
        int rc = jj_sb_puts(b, "{");
        for (size_t i = 0; rc == 0 && i < d->n; i++) {
            if (i) rc = jj_sb_puts(b, isep);
            if (rc == 0 && indent >= 0) rc = newline_indent(b, indent, level + 1);
            if (rc == 0) rc = json_key(b, d->key[ord[i]], o->ensure_ascii);
            if (rc == 0) rc = jj_sb_puts(b, ksep);
            if (rc == 0) rc = tojson(b, d->val[ord[i]], o, level + 1);
        }
        free(ord);
        FMOE_FORWARD_IF_ERROR(rc);
        if (indent >= 0) FMOE_FORWARD_IF_ERROR(newline_indent(b, indent, level));
        return jj_sb_puts(b, "}");
    }
    default:
        return fmoe_error_set(FMOE_EINVAL, "tojson: Object of type %s is not JSON serializable",
                              v.k == JV_UNDEF ? "Undefined" : jv_kind_name(v));
    }
}

int jv_tojson(jj_sb *b, jv v, const jj_json_opts *o) { return tojson(b, v, o, 0); }
