/*
 * json_regex.c - a string's `pattern` (JSON Schema validation §6.3.3, ECMA-262 regular
 * expressions) compiled, for a small subset, to the position automaton that the string
 * state of json_match.c runs byte by byte.
 *
 * The subset: literal characters, `.`, classes `[a-z0-9_]` and `[^...]`, the escapes
 * \d \w \s (and \D \W \S) and escaped punctuation, quantifiers ? * + {m} {m,} {m,n},
 * groups ( ) and alternation |; a leading ^ and a trailing $ are dropped. Anything else
 * (back-references, lookaround, \b, (?...), lazy quantifiers, ^ or $ inside, non-ASCII
 * characters) is refused, naming the construct and its offset.
 *
 * Generation writes whole matches: a string of the language of the pattern, which the
 * unanchored search JSON Schema specifies also accepts. Characters are those a JSON
 * string holds without escapes: printable ASCII but '"' and '\' (so \s is the space, `.`
 * any of those); a pattern whose class keeps none of them is refused.
 *
 * The automaton is Glushkov's (Berry and Sethi 1986: "From regular expressions to
 * deterministic automata"): one state per character occurrence ("position") of the
 * expanded expression, no epsilon moves; the set of positions reached is a 64-bit mask
 * kept in the string's frame. A bounded repetition is expanded by parsing its atom again
 * for each copy. Every class being non-empty, every reached position can still end a
 * match, so a byte the automaton takes never leads to a dead end.
 */
#include <string.h>

#include "fmoe/error.h"
#include "json_impl.h"

/* The bytes a JSON string body may hold unescaped, as a 128-bit class. */
static void writable(uint64_t cls[2]) {
    cls[0] = cls[1] = 0;
    for (unsigned c = 0x20; c < 0x7F; c++)
        if (c != '"' && c != '\\') cls[c >> 6] |= 1ull << (c & 63);
}

static void cls_add(uint64_t cls[2], unsigned c) { cls[c >> 6] |= 1ull << (c & 63); }

static void cls_range(uint64_t cls[2], unsigned a, unsigned b) {
    for (unsigned c = a; c <= b; c++) cls_add(cls, c);
}

/* A fragment of the expression: the positions a match of it may start and end at, and
 * whether it matches the empty string. */
typedef struct frag {
    uint64_t first, last;
    int nullable;
} frag;

typedef struct parser {
    const char *src;
    size_t pos, end;
    json_regex *re;
    const char *where;  /* the JSON path, for errors */
    int depth;
    int atoms;          /* atoms parsed, copies included */
} parser;

#define REGEX_MAX_NEST 16
/* Repetitions of repetitions of empty groups add no position but are parsed again for
 * each copy ("((){999}){999}"): the work is bounded by the atoms parsed instead. */
#define REGEX_MAX_ATOMS 4096

static int unsupported(const parser *P, const char *what) {
    return fmoe_error_set(FMOE_EUNSUPPORTED,
                          "'pattern' at %s: %s at offset %zu is not supported (fmoe takes "
                          "literals, ., [classes], \\d \\w \\s, ? * + {m,n}, groups and |)",
                          P->where, what, P->pos);
}

static void follow_add(json_regex *re, uint64_t from, uint64_t to) {
    for (uint64_t m = from; m; m &= m - 1) re->follow[__builtin_ctzll(m)] |= to;
}

static frag concat(json_regex *re, frag a, frag b) {
    follow_add(re, a.last, b.first);
    return (frag){a.first | (a.nullable ? b.first : 0), b.last | (b.nullable ? a.last : 0),
                  a.nullable && b.nullable};
}

static int new_position(parser *P, const uint64_t cls[2], frag *out) {
    uint64_t w[2];
    writable(w);
    const uint64_t c0 = cls[0] & w[0], c1 = cls[1] & w[1];
    if (!c0 && !c1)
        return fmoe_error_set(FMOE_EUNSUPPORTED,
                              "'pattern' at %s: the character or class before offset %zu "
                              "matches no character fmoe writes unescaped (printable ASCII "
                              "but '\"' and '\\')", P->where, P->pos);
    if (P->re->npos == JSON_REGEX_MAX_POS)
        return fmoe_error_set(FMOE_EUNSUPPORTED,
                              "'pattern' at %s has more than %d character positions once its "
                              "repetitions are expanded", P->where, JSON_REGEX_MAX_POS);
    const int32_t p = P->re->npos++;
    P->re->cls[p][0] = c0;
    P->re->cls[p][1] = c1;
    P->re->follow[p] = 0;
    *out = (frag){1ull << p, 1ull << p, 0};
    return 0;
}

/* An escape after '\' (P->pos at the letter) into cls. */
static int escape(parser *P, uint64_t cls[2]) {
    if (P->pos >= P->end) return unsupported(P, "a trailing '\\'");
    const unsigned char c = (unsigned char)P->src[P->pos];
    uint64_t w[2], tmp[2] = {0, 0};
    writable(w);
    switch (c) {
    case 'd': case 'D': cls_range(tmp, '0', '9'); break;
    case 'w': case 'W':
        cls_range(tmp, 'a', 'z');
        cls_range(tmp, 'A', 'Z');
        cls_range(tmp, '0', '9');
        cls_add(tmp, '_');
        break;
    case 's': case 'S': cls_add(tmp, ' '); break; /* tabs and newlines need escapes */
    default:
        if (c < 0x80 && strchr("^$\\.*+?()[]{}|/-\"", c) && c) {
            cls_add(tmp, c);
            break;
        }
        return unsupported(P, "this escape");
    }
    if (c == 'D' || c == 'W' || c == 'S') {
        tmp[0] = w[0] & ~tmp[0];
        tmp[1] = w[1] & ~tmp[1];
    }
    cls[0] |= tmp[0];
    cls[1] |= tmp[1];
    P->pos++;
    return 0;
}

/* [...] after '[' into cls. */
static int bracket(parser *P, uint64_t cls[2]) {
    uint64_t set[2] = {0, 0};
    int negate = 0, any = 0;
    if (P->pos < P->end && P->src[P->pos] == '^') negate = 1, P->pos++;
    for (;;) {
        if (P->pos >= P->end) return unsupported(P, "an unclosed '['");
        unsigned char c = (unsigned char)P->src[P->pos];
        if (c == ']' && any) break;
        if (c >= 0x80) return unsupported(P, "a non-ASCII character");
        if (c == '[') return unsupported(P, "'[' inside a class");
        if (c == '\\') {
            P->pos++;
            const unsigned char e = P->pos < P->end ? (unsigned char)P->src[P->pos] : 0;
            if (strchr("dDwWsS", e) && e) {
                FMOE_FORWARD_IF_ERROR(escape(P, set));
                any = 1;
                continue;
            }
            uint64_t one[2] = {0, 0};
            FMOE_FORWARD_IF_ERROR(escape(P, one));
            c = (unsigned char)__builtin_ctzll(one[0] ? one[0] : one[1]) + (one[0] ? 0 : 64);
        } else {
            P->pos++;
        }
        any = 1;
        /* a range c-d (a '-' before ']' is a literal) */
        if (P->pos + 1 < P->end && P->src[P->pos] == '-' && P->src[P->pos + 1] != ']') {
            P->pos++;
            unsigned char d = (unsigned char)P->src[P->pos];
            if (d == '\\') {
                P->pos++;
                uint64_t one[2] = {0, 0};
                const unsigned char e = P->pos < P->end ? (unsigned char)P->src[P->pos] : 0;
                if (strchr("dDwWsS", e) && e) return unsupported(P, "a range to a class");
                FMOE_FORWARD_IF_ERROR(escape(P, one));
                d = (unsigned char)__builtin_ctzll(one[0] ? one[0] : one[1]) + (one[0] ? 0 : 64);
            } else {
                if (d >= 0x80) return unsupported(P, "a non-ASCII character");
                P->pos++;
            }
            if (d < c) return unsupported(P, "a range out of order");
            cls_range(set, c, d);
        } else {
            cls_add(set, c);
        }
    }
    P->pos++; /* ']' */
    if (negate) {
        uint64_t w[2];
        writable(w);
        set[0] = w[0] & ~set[0];
        set[1] = w[1] & ~set[1];
    }
    cls[0] |= set[0];
    cls[1] |= set[1];
    return 0;
}

static int parse_alt(parser *P, frag *out);

static int parse_atom(parser *P, frag *out) {
    const unsigned char c = (unsigned char)P->src[P->pos];
    if (++P->atoms > REGEX_MAX_ATOMS) return unsupported(P, "repetition this large");
    uint64_t cls[2] = {0, 0};
    if (c == '(') {
        P->pos++;
        if (P->pos < P->end && P->src[P->pos] == '?') return unsupported(P, "'(?'");
        if (++P->depth > REGEX_MAX_NEST) return unsupported(P, "nesting this deep");
        FMOE_FORWARD_IF_ERROR(parse_alt(P, out));
        P->depth--;
        if (P->pos >= P->end || P->src[P->pos] != ')') return unsupported(P, "an unclosed '('");
        P->pos++;
        return 0;
    }
    if (c == '[') {
        P->pos++;
        FMOE_FORWARD_IF_ERROR(bracket(P, cls));
    } else if (c == '\\') {
        P->pos++;
        const unsigned char e = P->pos < P->end ? (unsigned char)P->src[P->pos] : 0;
        if (e >= '0' && e <= '9') return unsupported(P, "a back-reference");
        if (e == 'b' || e == 'B') return unsupported(P, "a word boundary");
        FMOE_FORWARD_IF_ERROR(escape(P, cls));
    } else if (c == '.') {
        P->pos++;
        writable(cls);
    } else if (c == '^' || c == '$') {
        return unsupported(P, "an anchor inside the pattern");
    } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        return unsupported(P, "a quantifier with nothing to repeat (or a lazy one)");
    } else if (c == ']' || c == '}') {
        return unsupported(P, "an unmatched bracket");
    } else if (c >= 0x80) {
        return unsupported(P, "a non-ASCII character");
    } else {
        P->pos++;
        cls_add(cls, c);
    }
    return new_position(P, cls, out);
}

/* {m}, {m,}, {m,n} after '{'. @return 1 and the bounds (hi -1: none), 0 when the '{' is
 * not a quantifier, <0 on error. */
static int bounds(parser *P, int *lo, int *hi) {
    size_t q = P->pos + 1;
    int m = 0, n = -1, digits = 0;
    while (q < P->end && P->src[q] >= '0' && P->src[q] <= '9' && m < 1000)
        m = m * 10 + (P->src[q++] - '0'), digits++;
    if (!digits) return 0;
    if (q < P->end && P->src[q] == ',') {
        q++;
        if (q < P->end && P->src[q] >= '0' && P->src[q] <= '9') {
            n = 0;
            while (q < P->end && P->src[q] >= '0' && P->src[q] <= '9' && n < 1000)
                n = n * 10 + (P->src[q++] - '0');
        }
    } else {
        n = m;
    }
    if (q >= P->end || P->src[q] != '}') return 0;
    if (n >= 0 && n < m) return unsupported(P, "{m,n} with n below m");
    P->pos = q + 1;
    *lo = m;
    *hi = n;
    return 1;
}

static int parse_repeat(parser *P, frag *out) {
    const size_t start = P->pos;
    frag a = {0, 0, 1};
    FMOE_FORWARD_IF_ERROR(parse_atom(P, &a));
    if (P->pos >= P->end) {
        *out = a;
        return 0;
    }
    const char q = P->src[P->pos];
    int lo = 1, hi = 1;
    if (q == '?') lo = 0, hi = 1, P->pos++;
    else if (q == '*') lo = 0, hi = -1, P->pos++;
    else if (q == '+') lo = 1, hi = -1, P->pos++;
    else if (q == '{') {
        const int b = bounds(P, &lo, &hi);
        if (b < 0) return b;
        if (b == 0) return unsupported(P, "a '{' that is not {m}, {m,} or {m,n}");
    }
    if (P->pos < P->end && (P->src[P->pos] == '?' || P->src[P->pos] == '+') &&
        (q == '?' || q == '*' || q == '+' || q == '{'))
        return unsupported(P, "a lazy or possessive quantifier");
    if (lo == 1 && hi == 1) {
        *out = a;
        return 0;
    }
    /* copies: lo required ones, then hi - lo optional ones, or the last one starred */
    const int copies = hi < 0 ? (lo > 0 ? lo : 1) : hi;
    if (copies == 0) { /* x{0}: matches only the empty string (x's positions unreachable) */
        *out = (frag){0, 0, 1};
        return 0;
    }
    const size_t after = P->pos;
    frag acc = {0, 0, 1};
    for (int k = 0; k < copies; k++) {
        frag c = a;
        if (k > 0) {
            P->pos = start;
            FMOE_FORWARD_IF_ERROR(parse_atom(P, &c));
        }
        if (hi < 0 && k == copies - 1) {
            follow_add(P->re, c.last, c.first); /* the last copy repeats */
            if (lo == 0) c.nullable = 1;
        } else if (k >= lo) {
            c.nullable = 1;
        }
        acc = concat(P->re, acc, c);
    }
    P->pos = after;
    *out = acc;
    return 0;
}

static int parse_concat(parser *P, frag *out) {
    frag acc = {0, 0, 1};
    while (P->pos < P->end && P->src[P->pos] != '|' && P->src[P->pos] != ')') {
        frag f = {0, 0, 1};
        FMOE_FORWARD_IF_ERROR(parse_repeat(P, &f));
        acc = concat(P->re, acc, f);
    }
    *out = acc;
    return 0;
}

static int parse_alt(parser *P, frag *out) {
    FMOE_FORWARD_IF_ERROR(parse_concat(P, out));
    while (P->pos < P->end && P->src[P->pos] == '|') {
        P->pos++;
        frag b = {0, 0, 1};
        FMOE_FORWARD_IF_ERROR(parse_concat(P, &b));
        out->first |= b.first;
        out->last |= b.last;
        out->nullable |= b.nullable;
    }
    return 0;
}

int fmoe__json_regex_compile(const char *src, size_t len, const char *where, json_regex *re) {
    memset(re, 0, sizeof *re);
    parser P = {.src = src, .pos = 0, .end = len, .re = re, .where = where};
    if (P.end > 0 && src[0] == '^') P.pos = 1;
    /* a trailing '$' not escaped by an odd run of backslashes */
    if (P.end > P.pos && src[P.end - 1] == '$') {
        size_t k = 0;
        while (P.end >= 2 + k && src[P.end - 2 - k] == '\\') k++;
        if (k % 2 == 0) P.end--;
    }
    frag f = {0, 0, 1};
    FMOE_FORWARD_IF_ERROR(parse_alt(&P, &f));
    if (P.pos < P.end) return unsupported(&P, "an unmatched ')'");
    re->first = f.first;
    re->last = f.last;
    re->nullable = f.nullable;
    return 0;
}

uint64_t fmoe__json_regex_step(const json_regex *re, uint64_t at, uint8_t c) {
    if (c >= 0x80) return 0;
    uint64_t cand = 0;
    if (at == JSON_REGEX_START) cand = re->first;
    else
        for (uint64_t m = at; m; m &= m - 1) cand |= re->follow[__builtin_ctzll(m)];
    uint64_t next = 0;
    for (uint64_t m = cand; m; m &= m - 1) {
        const int p = __builtin_ctzll(m);
        if ((re->cls[p][c >> 6] >> (c & 63)) & 1) next |= 1ull << p;
    }
    return next;
}

int fmoe__json_regex_accepts(const json_regex *re, uint64_t at) {
    return at == JSON_REGEX_START ? re->nullable : (at & re->last) != 0;
}
