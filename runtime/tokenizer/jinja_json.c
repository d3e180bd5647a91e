/*
 * jinja_json.c - JSON text to template values (see jinja.h), as Python's json.loads reads it.
 *
 * Messages, tools and keyword arguments reach a template as JSON. They are read here
 * rather than through cJSON because cJSON keeps a number as a double: "1.0" and "1" would
 * arrive as the same value, where json.loads gives a float and an int that a template's
 * tojson prints as "1.0" and "1". Objects keep their order; a repeated key keeps its
 * first place and its last value, as a dict built by json.loads does. Integers beyond
 * int64 become floats (Python would keep them exact).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "jinja.h"
#include "tokenizer_impl.h" /* fmoe__utf8_encode */

#define OOM() fmoe_error_set(FMOE_ENOMEM, "chat template: out of memory")

typedef struct {
    jj_arena *A;
    const char *p, *e, *start;
    const char *what; /* what the text is, for errors */
} reader;

static int bad(reader *r, const char *msg) {
    return fmoe_error_set(FMOE_EINVAL, "%s: not valid JSON at byte %zu: %s", r->what,
                          (size_t)(r->p - r->start), msg);
}

static void ws(reader *r) {
    while (r->p < r->e && (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r'))
        r->p++;
}

static int hex4(reader *r, uint32_t *cp) {
    if (r->e - r->p < 4) return bad(r, "a short \\u escape");
    *cp = 0;
    for (int i = 0; i < 4; i++) {
        char h = r->p[i];
        int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
              : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
        if (d < 0) return bad(r, "a bad \\u escape");
        *cp = *cp * 16 + (uint32_t)d;
    }
    r->p += 4;
    return 0;
}

static int string(reader *r, jv *out) {
    r->p++; /* the opening quote */
    const char *s = r->p;
    size_t n = 0;
    while (r->p < r->e && *r->p != '"') { /* a bound on the decoded length */
        if (*r->p == '\\') r->p++;
        r->p++;
        n++;
    }
    if (r->p >= r->e) return bad(r, "a string is not closed");
    char *o = jj_alloc(r->A, (size_t)(r->p - s) + 1);
    if (!o) return OOM();
    r->p = s;
    size_t k = 0;
    while (*r->p != '"') {
        unsigned char ch = (unsigned char)*r->p;
        if (ch < 0x20) return bad(r, "a control character in a string");
        if (ch != '\\') {
            o[k++] = (char)ch;
            r->p++;
            continue;
        }
        r->p++;
        char e = *r->p++;
        switch (e) {
        case '"': o[k++] = '"'; break;
        case '\\': o[k++] = '\\'; break;
        case '/': o[k++] = '/'; break;
        case 'b': o[k++] = '\b'; break;
        case 'f': o[k++] = '\f'; break;
        case 'n': o[k++] = '\n'; break;
        case 'r': o[k++] = '\r'; break;
        case 't': o[k++] = '\t'; break;
        case 'u': {
            uint32_t cp;
            FMOE_FORWARD_IF_ERROR(hex4(r, &cp));
            if (cp >= 0xD800 && cp < 0xDC00 && r->e - r->p >= 6 && r->p[0] == '\\' &&
                r->p[1] == 'u') { /* a surrogate pair */
                const char *save = r->p;
                uint32_t lo;
                r->p += 2;
                FMOE_FORWARD_IF_ERROR(hex4(r, &lo));
                if (lo >= 0xDC00 && lo < 0xE000) cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                else r->p = save;
            }
            if (cp == 0) return bad(r, "a NUL character (\\u0000) in a string");
            /* a lone surrogate is written as its 3 bytes, as Python's surrogatepass would */
            k += fmoe__utf8_encode(cp, o + k);
            break;
        }
        default: return bad(r, "an unknown escape in a string");
        }
    }
    r->p++;
    (void)n;
    *out = jv_strn(o, k);
    return 0;
}

static int number(reader *r, jv *out) {
    const char *s = r->p;
    int is_float = 0;
    if (r->p < r->e && *r->p == '-') r->p++;
    if (r->p >= r->e || *r->p < '0' || *r->p > '9') return bad(r, "a bad number");
    if (*r->p == '0') r->p++;
    else
        while (r->p < r->e && *r->p >= '0' && *r->p <= '9') r->p++;
    if (r->p < r->e && *r->p == '.') {
        is_float = 1;
        r->p++;
        if (r->p >= r->e || *r->p < '0' || *r->p > '9') return bad(r, "a bad number");
        while (r->p < r->e && *r->p >= '0' && *r->p <= '9') r->p++;
    }
    if (r->p < r->e && (*r->p == 'e' || *r->p == 'E')) {
        is_float = 1;
        r->p++;
        if (r->p < r->e && (*r->p == '+' || *r->p == '-')) r->p++;
        if (r->p >= r->e || *r->p < '0' || *r->p > '9') return bad(r, "a bad number");
        while (r->p < r->e && *r->p >= '0' && *r->p <= '9') r->p++;
    }
    char buf[400];
    size_t n = (size_t)(r->p - s);
    if (n >= sizeof buf) return bad(r, "a number too long");
    memcpy(buf, s, n);
    buf[n] = '\0';
    if (!is_float) {
        errno = 0;
        long long i = strtoll(buf, NULL, 10);
        if (errno != ERANGE) {
            *out = jv_int(i);
            return 0;
        }
    }
    *out = jv_float(strtod(buf, NULL));
    return 0;
}

static int word(reader *r, const char *w, jv v, jv *out) {
    size_t n = strlen(w);
    if ((size_t)(r->e - r->p) < n || memcmp(r->p, w, n) != 0) return bad(r, "an unexpected word");
    r->p += n;
    *out = v;
    return 0;
}

static int value(reader *r, jv *out, int level) {
    if (level > JJ_MAX_DEPTH)
        return fmoe_error_set(FMOE_ERANGE, "%s: JSON nested more than %d deep", r->what,
                              JJ_MAX_DEPTH);
    ws(r);
    if (r->p >= r->e) return bad(r, "a value is missing");
    switch (*r->p) {
    case '"': return string(r, out);
    case 't': return word(r, "true", jv_bool(1), out);
    case 'f': return word(r, "false", jv_bool(0), out);
    case 'n': return word(r, "null", jv_none(), out);
    case '[':
        r->p++;
        FMOE_FORWARD_IF_ERROR(jv_list_new(r->A, 0, out));
        ws(r);
        if (r->p < r->e && *r->p == ']') {
            r->p++;
            return 0;
        }
        for (;;) {
            jv item;
            FMOE_FORWARD_IF_ERROR(value(r, &item, level + 1));
            FMOE_FORWARD_IF_ERROR(jv_list_push(r->A, *out, item));
            ws(r);
            if (r->p < r->e && *r->p == ',') {
                r->p++;
                continue;
            }
            if (r->p < r->e && *r->p == ']') {
                r->p++;
                return 0;
            }
            return bad(r, "expected ',' or ']'");
        }
    case '{':
        r->p++;
        FMOE_FORWARD_IF_ERROR(jv_dict_new(r->A, out));
        ws(r);
        if (r->p < r->e && *r->p == '}') {
            r->p++;
            return 0;
        }
        for (;;) {
            jv k, v;
            ws(r);
            if (r->p >= r->e || *r->p != '"') return bad(r, "expected a key");
            FMOE_FORWARD_IF_ERROR(string(r, &k));
            ws(r);
            if (r->p >= r->e || *r->p != ':') return bad(r, "expected ':'");
            r->p++;
            FMOE_FORWARD_IF_ERROR(value(r, &v, level + 1));
            FMOE_FORWARD_IF_ERROR(jv_dict_set(r->A, *out, k, v));
            ws(r);
            if (r->p < r->e && *r->p == ',') {
                r->p++;
                continue;
            }
            if (r->p < r->e && *r->p == '}') {
                r->p++;
                return 0;
            }
            return bad(r, "expected ',' or '}'");
        }
    default: return number(r, out);
    }
}

int jv_parse_json(jj_arena *a, const char *text, size_t n, const char *what, jv *out) {
    reader r = {.A = a, .p = text, .e = text + n, .start = text, .what = what};
    FMOE_FORWARD_IF_ERROR(value(&r, out, 0));
    ws(&r);
    if (r.p != r.e) return bad(&r, "data after the value");
    return 0;
}
