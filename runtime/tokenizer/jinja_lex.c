/*
 * jinja_lex.c - template text to tokens, with Jinja's whitespace control as transformers
 * configures it (see jinja.h).
 *
 * Outside tags the text is one token. "{# #}" comments vanish. Inside "{{ }}" and "{% %}"
 * the expression is split into names, numbers, strings and operators; a closing "}}" or
 * "%}" only ends the tag when brackets are balanced, as in jinja2, so dict literals work.
 * Whitespace: "{%-"/"-%}" (and the {{ }} / {# #} forms) strip all whitespace on that
 * side; trim_blocks drops the first newline after a block or comment tag; lstrip_blocks
 * drops the spaces and tabs between the start of a line and a block or comment tag,
 * unless the tag opens with "{%+"; "+%}" keeps the newline. A single trailing newline of
 * the template is dropped (jinja2's keep_trailing_newline=False).
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "jinja.h"

typedef struct {
    jj_arena *A;
    jj_token *t;
    size_t n, cap;
} toks;

static int push(toks *T, jj_token tk) {
    if (T->n == T->cap) {
        size_t cap = T->cap ? T->cap * 2 : 256;
        jj_token *nt = jj_alloc(T->A, cap * sizeof *nt);
        if (!nt) return fmoe_error_set(FMOE_ENOMEM, "chat template: out of memory");
        if (T->n) memcpy(nt, T->t, T->n * sizeof *nt);
        T->t = nt;
        T->cap = cap;
    }
    T->t[T->n++] = tk;
    return 0;
}

static int lex_error(int line, const char *what) {
    return fmoe_error_set(FMOE_EFORMAT, "chat template line %d: %s", line, what);
}

static int count_lines(const char *a, const char *b) {
    int k = 0;
    for (; a < b; a++) k += *a == '\n';
    return k;
}

/* Python's unicode-escape on a string literal's body (what jinja2 applies). */
static int unescape(jj_arena *A, const char *s, size_t n, int line, jj_token *tk) {
    char *o = jj_alloc(A, n + 1);
    if (!o) return fmoe_error_set(FMOE_ENOMEM, "chat template: out of memory");
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\' || i + 1 == n) {
            o[k++] = s[i];
            continue;
        }
        char e = s[++i];
        switch (e) {
        case 'n': o[k++] = '\n'; break;
        case 't': o[k++] = '\t'; break;
        case 'r': o[k++] = '\r'; break;
        case '\\': o[k++] = '\\'; break;
        case '\'': o[k++] = '\''; break;
        case '"': o[k++] = '"'; break;
        case '\n': break; /* line continuation */
        case 'a': o[k++] = '\a'; break;
        case 'b': o[k++] = '\b'; break;
        case 'f': o[k++] = '\f'; break;
        case 'v': o[k++] = '\v'; break;
        case '0': o[k++] = '\0'; break;
        case 'x':
        case 'u':
        case 'U': {
            int digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            if (i + (size_t)digits >= n)
                return lex_error(line, "truncated \\x/\\u escape in a string");
            uint32_t cp = 0;
            for (int d = 1; d <= digits; d++) {
                char h = s[i + d];
                if (!isxdigit((unsigned char)h))
                    return lex_error(line, "bad \\x/\\u escape in a string");
                cp = cp * 16 + (uint32_t)(isdigit((unsigned char)h) ? h - '0' : (tolower(h) - 'a' + 10));
            }
            i += (size_t)digits;
            if (cp > 0x10FFFF) return lex_error(line, "escape beyond U+10FFFF in a string");
            /* UTF-8 encode (a lone surrogate is written as is, like Python's surrogatepass) */
            if (cp < 0x80) o[k++] = (char)cp;
            else if (cp < 0x800) {
                o[k++] = (char)(0xC0 | (cp >> 6));
                o[k++] = (char)(0x80 | (cp & 0x3F));
            } else if (cp < 0x10000) {
                o[k++] = (char)(0xE0 | (cp >> 12));
                o[k++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                o[k++] = (char)(0x80 | (cp & 0x3F));
            } else {
                o[k++] = (char)(0xF0 | (cp >> 18));
                o[k++] = (char)(0x80 | ((cp >> 12) & 0x3F));
                o[k++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                o[k++] = (char)(0x80 | (cp & 0x3F));
            }
            break;
        }
        default: /* unknown escapes stay as written */
            o[k++] = '\\';
            o[k++] = e;
        }
    }
    tk->s = o;
    tk->n = k;
    return 0;
}

static const char *const OPS2[] = {"//", "**", "==", "!=", "<=", ">=", NULL};
static const char OPS1[] = "+-*/%~<>=()[]{},.:|";

/* Tokens of one tag's expression, from *pp up to its end marker ("}}" or "%}").
 * Sets *pp past the end marker and *strip_after when it was "-}}"/"-%}", *keep_nl for
 * "+%}". */
static int lex_expr(toks *T, const char **pp, const char *end, int *line, int block,
                    int *strip_after, int *keep_nl) {
    const char *p = *pp;
    int depth = 0;
    for (;;) {
        while (p < end && isspace((unsigned char)*p)) {
            if (*p == '\n') (*line)++;
            p++;
        }
        if (p >= end) return lex_error(*line, block ? "'{%' is not closed" : "'{{' is not closed");
        char close = block ? '%' : '}';
        if (depth == 0) {
            if (*p == '-' && p + 2 < end && p[1] == close && p[2] == '}') {
                *strip_after = 1;
                *pp = p + 3;
                return 0;
            }
            if (block && *p == '+' && p + 2 < end && p[1] == '%' && p[2] == '}') {
                *keep_nl = 1;
                *pp = p + 3;
                return 0;
            }
            if (*p == close && p + 1 < end && p[1] == '}') {
                *pp = p + 2;
                return 0;
            }
        }
        jj_token tk = {.line = *line};
        if (isalpha((unsigned char)*p) || *p == '_') {
            const char *s = p;
            while (p < end && (isalnum((unsigned char)*p) || *p == '_')) p++;
            tk.k = JT_NAME;
            tk.s = s;
            tk.n = (size_t)(p - s);
        } else if (isdigit((unsigned char)*p)) {
            const char *s = p;
            int is_float = 0;
            while (p < end && (isdigit((unsigned char)*p) || *p == '_')) p++;
            if (p + 1 < end && *p == '.' && isdigit((unsigned char)p[1])) {
                is_float = 1;
                p++;
                while (p < end && (isdigit((unsigned char)*p) || *p == '_')) p++;
            }
            if (p < end && (*p == 'e' || *p == 'E')) {
                const char *q = p + 1;
                if (q < end && (*q == '+' || *q == '-')) q++;
                if (q < end && isdigit((unsigned char)*q)) {
                    is_float = 1;
                    p = q;
                    while (p < end && isdigit((unsigned char)*p)) p++;
                }
            }
            char buf[64];
            size_t k = 0;
            for (const char *q = s; q < p && k < sizeof buf - 1; q++)
                if (*q != '_') buf[k++] = *q;
            buf[k] = '\0';
            if (is_float) {
                tk.k = JT_FLOAT;
                tk.f = strtod(buf, NULL);
            } else {
                tk.k = JT_INT;
                tk.i = strtoll(buf, NULL, 10);
            }
        } else if (*p == '\'' || *p == '"') {
            char q = *p++;
            const char *s = p;
            while (p < end && *p != q) {
                if (*p == '\\' && p + 1 < end) p++;
                p++;
            }
            if (p >= end) return lex_error(*line, "a string is not closed");
            tk.k = JT_STRING;
            FMOE_FORWARD_IF_ERROR(unescape(T->A, s, (size_t)(p - s), *line, &tk));
            *line += count_lines(s, p);
            p++;
        } else {
            tk.k = JT_OP;
            tk.s = NULL;
            for (int o = 0; OPS2[o]; o++)
                if (p + 1 < end && p[0] == OPS2[o][0] && p[1] == OPS2[o][1]) {
                    tk.s = OPS2[o];
                    tk.n = 2;
                }
            if (!tk.s) {
                const char *f = strchr(OPS1, *p);
                if (!f || !*p) {
                    char msg[64];
                    snprintf(msg, sizeof msg, "unexpected character '%c'", *p);
                    return lex_error(*line, msg);
                }
                tk.s = f;
                tk.n = 1;
            }
            if (*p == '(' || *p == '[' || *p == '{') depth++;
            if (*p == ')' || *p == ']' || *p == '}') depth = depth > 0 ? depth - 1 : 0;
            p += tk.n;
        }
        FMOE_FORWARD_IF_ERROR(push(T, tk));
    }
}

/* The tag that starts at or after p: its position and kind ('{', '%', '#'), or NULL. */
static const char *next_tag(const char *p, const char *end, char *kind) {
    for (; p + 1 < end; p++) {
        if (p[0] == '{' && (p[1] == '{' || p[1] == '%' || p[1] == '#')) {
            *kind = p[1];
            return p;
        }
    }
    return NULL;
}

static int is_hspace(char ch) { return ch == ' ' || ch == '\t'; }

/* "{% raw %}" at p (any whitespace control)? Sets *after to just past the tag. */
static int tag_word(const char *p, const char *end, const char *word, const char **after,
                    int *minus_before, int *minus_after) {
    const char *q = p + 2;
    *minus_before = q < end && *q == '-';
    if (q < end && (*q == '-' || *q == '+')) q++;
    while (q < end && isspace((unsigned char)*q)) q++;
    size_t w = strlen(word);
    if ((size_t)(end - q) < w || memcmp(q, word, w) != 0) return 0;
    q += w;
    while (q < end && isspace((unsigned char)*q)) q++;
    *minus_after = q < end && *q == '-';
    if (q < end && (*q == '-' || *q == '+')) q++;
    if (q + 1 < end && q[0] == '%' && q[1] == '}') {
        *after = q + 2;
        return 1;
    }
    return 0;
}

int jj_lex(jj_arena *A, const char *src0, size_t len0, jj_token **out, size_t *nout) {
    /* newlines as jinja2 normalises them: \r\n and \r become \n */
    char *src = jj_alloc(A, len0 + 1);
    if (!src) return fmoe_error_set(FMOE_ENOMEM, "chat template: out of memory");
    size_t len = 0;
    for (size_t i = 0; i < len0; i++) {
        if (src0[i] == '\r') {
            src[len++] = '\n';
            if (i + 1 < len0 && src0[i + 1] == '\n') i++;
        } else {
            src[len++] = src0[i];
        }
    }
    if (len && src[len - 1] == '\n') len--;
    const char *p = src, *end = src + len;
    toks T = {.A = A};
    int line = 1;
    int strip_next = 0; /* the previous tag ended with '-' */
    int trim_nl = 0;    /* the previous tag was a block/comment: drop one newline */
    for (;;) {
        char kind = 0;
        const char *tag = next_tag(p, end, &kind);
        const char *te = tag ? tag : end;
        const char *ts = p;
        if (strip_next)
            while (ts < te && isspace((unsigned char)*ts)) ts++;
        else if (trim_nl && ts < te && *ts == '\n')
            ts++;
        int line_start = ts == src || ts[-1] == '\n';
        if (tag) {
            char mod = tag + 2 < end ? tag[2] : 0;
            if (mod == '-') {
                while (te > ts && isspace((unsigned char)te[-1])) te--;
            } else if (kind != '{' && mod != '+') {
                const char *q = te;
                while (q > ts && is_hspace(q[-1])) q--;
                if ((q > ts && q[-1] == '\n') || (q == ts && line_start)) te = q;
            }
        }
        line += count_lines(p, ts);
        if (te > ts) {
            FMOE_FORWARD_IF_ERROR(push(&T, (jj_token){.k = JT_TEXT, .line = line, .s = ts,
                                                       .n = (size_t)(te - ts)}));
        }
        line += count_lines(ts, tag ? tag : end);
        if (!tag) break;
        strip_next = trim_nl = 0;
        const char *q = tag + 2;
        if (q < end && (*q == '-' || *q == '+')) q++;
        if (kind == '#') {
            const char *c = q;
            while (c + 1 < end && !(c[0] == '#' && c[1] == '}')) c++;
            if (c + 1 >= end) return lex_error(line, "'{#' comment is not closed");
            line += count_lines(tag, c);
            strip_next = c > q && c[-1] == '-';
            trim_nl = !strip_next;
            p = c + 2;
            continue;
        }
        const char *after;
        int mb, ma;
        if (kind == '%' && tag_word(tag, end, "raw", &after, &mb, &ma)) {
            /* everything up to {% endraw %} is text */
            const char *r = after, *re = NULL, *rafter = NULL;
            int emb = 0, ema = 0;
            for (; r + 1 < end; r++)
                if (r[0] == '{' && r[1] == '%' && tag_word(r, end, "endraw", &rafter, &emb, &ema)) {
                    re = r;
                    break;
                }
            if (!re) return lex_error(line, "'{% raw %}' is not closed by '{% endraw %}'");
            const char *bs = after, *be = re;
            if (ma) while (bs < be && isspace((unsigned char)*bs)) bs++;
            else if (bs < be && *bs == '\n') bs++;
            if (emb) while (be > bs && isspace((unsigned char)be[-1])) be--;
            if (be > bs)
                FMOE_FORWARD_IF_ERROR(push(&T, (jj_token){.k = JT_TEXT, .line = line, .s = bs,
                                                           .n = (size_t)(be - bs)}));
            line += count_lines(tag, rafter);
            strip_next = ema;
            trim_nl = !ema;
            p = rafter;
            continue;
        }
        int block = kind == '%';
        FMOE_FORWARD_IF_ERROR(push(&T, (jj_token){.k = block ? JT_BLOCK_BEGIN : JT_VAR_BEGIN,
                                                   .line = line}));
        int sa = 0, keep = 0;
        FMOE_FORWARD_IF_ERROR(lex_expr(&T, &q, end, &line, block, &sa, &keep));
        FMOE_FORWARD_IF_ERROR(push(&T, (jj_token){.k = block ? JT_BLOCK_END : JT_VAR_END,
                                                   .line = line}));
        strip_next = sa;
        trim_nl = block && !sa && !keep;
        p = q;
    }
    FMOE_FORWARD_IF_ERROR(push(&T, (jj_token){.k = JT_EOF, .line = line}));
    *out = T.t;
    *nout = T.n;
    return 0;
}
