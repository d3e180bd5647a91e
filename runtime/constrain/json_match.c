/*
 * json_match.c - the byte automaton of a compiled schema: a pushdown machine with one
 * frame per open value (json_impl.h), fed one byte at a time.
 *
 * The grammar is JSON's (RFC 8259 §2-7) narrowed by the schema and by bounds that keep
 * generation finite: whitespace runs, number digits, nesting of "any" values. Each kind
 * of frame has a few phases; a byte either moves the top frame's phase, pushes the frame
 * of a value that starts with it (the byte is then fed to the new frame), or ends the
 * top frame. Numbers and literals that are a prefix of a longer one (12 vs 1, an enum)
 * end only when a byte cannot continue them: that byte is then fed to the frame below.
 * Whitespace is handled by the container (between its tokens), never inside a value, so
 * "[ ]" is refused where "[]" is taken: the automaton accepts a subset of JSON's texts,
 * which is all that constrained generation needs, and never a text outside it.
 */
#include <string.h>

#include "fmoe/utf8.h"
#include "json_impl.h"

enum { R_REJECT = 0, R_OK, R_POP, R_POP_REFEED, R_PUSH };

/* Number phases; the ones a number may end in are 2, 3, 5, 8. */
enum {
    N_START = 0, N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_EXP, N_EXP_SIGN, N_EXP_DIGITS,
};
#define NUM_MAX_INT_DIGITS 15
#define NUM_MAX_FRAC_DIGITS 15
#define NUM_MAX_EXP_DIGITS 2

static inline int is_ws(uint8_t c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }
static inline int is_digit(uint8_t c) { return c >= '0' && c <= '9'; }
static inline int is_hex(uint8_t c) {
    return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}
static inline int starts_with(const json_node *n, uint8_t c) {
    return (n->starts[c >> 6] >> (c & 63)) & 1;
}

static int take_ws(json_frame *f) {
    if (f->ws >= FMOE_JSON_MAX_WS) return R_REJECT;
    f->ws++;
    return R_OK;
}

/* Pushes the frame of a value of `node` whose first byte is c (not consumed: the caller
 * feeds c to the new top). @return R_PUSH or R_REJECT. */
static int push_value(const fmoe_json_schema *s, json_state *st, int32_t node, uint8_t c) {
    for (;;) {
        const json_node *n = &s->nodes[node];
        if (!starts_with(n, c)) return R_REJECT;
        if (n->kind == JSON_ANYOF) {
            int32_t pick = -1;
            for (int32_t i = 0; i < n->count && pick < 0; i++)
                if (starts_with(&s->nodes[s->branches[n->first + i]], c))
                    pick = s->branches[n->first + i];
            node = pick; /* exists: starts is the union of the branches' */
            continue;
        }
        if (n->kind == JSON_ANY) {
            if ((c == '{' || c == '[') && st->depth >= FMOE_JSON_MAX_NEST) return R_REJECT;
            node = c == '{' ? s->any_object : c == '[' ? s->any_array : c == '"' ? s->string
                 : c == 't' ? s->lit_true : c == 'f' ? s->lit_false : c == 'n' ? s->lit_null
                 : s->number;
            continue;
        }
        break;
    }
    if (st->depth >= JSON_MAX_DEPTH) return R_REJECT;
    const json_node *n = &s->nodes[node];
    json_frame *f = &st->f[st->depth++];
    *f = (json_frame){.node = (uint16_t)node};
    if (n->kind == JSON_LITERALS)
        f->alive = n->count == 64 ? ~0ull : (1ull << n->count) - 1;
    return R_PUSH;
}

/* ---------------------------------------------------------------------------------- */
/* Objects with listed properties                                                    */
/* ---------------------------------------------------------------------------------- */

/* The properties that may come next after those before `next`: each optional one up to
 * and including the first required one. Bit i is property first + i. */
static uint64_t key_candidates(const fmoe_json_schema *s, const json_node *n, int32_t next) {
    uint64_t m = 0;
    for (int32_t i = next; i < n->count; i++) {
        m |= 1ull << i;
        if (s->props[n->first + i].required) break;
    }
    return m;
}

static int required_left(const fmoe_json_schema *s, const json_node *n, int32_t next) {
    for (int32_t i = next; i < n->count; i++)
        if (s->props[n->first + i].required) return 1;
    return 0;
}

/* Phases: 0 '{', 1 key or '}', 2 in a key (b: bytes matched), 3 ':', 4 value, 5 ',' or
 * '}', 6 key. a: the next property index; the chosen one's value is pushed in phase 4. */
static int object_step(const fmoe_json_schema *s, json_state *st, json_frame *f, uint8_t c) {
    const json_node *n = &s->nodes[f->node];
    switch (f->phase) {
    case 0:
        if (c != '{') return R_REJECT;
        f->phase = 1;
        return R_OK;
    case 1:
    case 6:
        if (is_ws(c)) return take_ws(f);
        if (c == '}' && f->phase == 1 && !required_left(s, n, f->a)) return R_POP;
        if (c != '"') return R_REJECT;
        f->alive = key_candidates(s, n, f->a);
        if (!f->alive) return R_REJECT;
        f->ws = 0;
        f->b = 1;
        f->phase = 2;
        return R_OK;
    case 2: {
        uint64_t keep = 0, done = 0;
        for (uint64_t m = f->alive; m; m &= m - 1) {
            const int32_t i = __builtin_ctzll(m);
            const json_lit *k = &s->lits[s->props[n->first + i].key];
            if (k->len > f->b && (uint8_t)s->pool[k->off + f->b] == c) {
                keep |= 1ull << i;
                if (k->len == f->b + 1) done = 1ull << i;
            }
        }
        if (!keep) return R_REJECT;
        f->b++;
        f->alive = keep;
        if (done) { /* the closing quote: names are distinct, so one key is left */
            f->b = __builtin_ctzll(done);
            f->a = f->b + 1;
            f->phase = 3;
        }
        return R_OK;
    }
    case 3:
        if (is_ws(c)) return take_ws(f);
        if (c != ':') return R_REJECT;
        f->ws = 0;
        f->phase = 4;
        return R_OK;
    case 4:
        if (is_ws(c)) return take_ws(f);
        f->ws = 0;
        f->phase = 5;
        return push_value(s, st, s->props[n->first + f->b].value, c);
    case 5:
        if (is_ws(c)) return take_ws(f);
        if (c == '}' && !required_left(s, n, f->a)) return R_POP;
        if (c == ',' && key_candidates(s, n, f->a)) {
            f->ws = 0;
            f->phase = 6;
            return R_OK;
        }
        return R_REJECT;
    }
    return R_REJECT;
}

/* Any object: phases 0 '{', 1 key or '}', 3 ':', 4 value, 5 ',' or '}', 6 key. A key is
 * a string frame pushed past its opening quote. */
static int any_object_step(const fmoe_json_schema *s, json_state *st, json_frame *f,
                           uint8_t c) {
    switch (f->phase) {
    case 0:
        if (c != '{') return R_REJECT;
        f->phase = 1;
        return R_OK;
    case 1:
    case 6:
        if (is_ws(c)) return take_ws(f);
        if (c == '}' && f->phase == 1) return R_POP;
        if (c != '"' || st->depth >= JSON_MAX_DEPTH) return R_REJECT;
        f->ws = 0;
        f->phase = 3;
        st->f[st->depth++] = (json_frame){.node = (uint16_t)s->string, .phase = 1};
        return R_OK;
    case 3:
        if (is_ws(c)) return take_ws(f);
        if (c != ':') return R_REJECT;
        f->ws = 0;
        f->phase = 4;
        return R_OK;
    case 4:
        if (is_ws(c)) return take_ws(f);
        f->ws = 0;
        f->phase = 5;
        return push_value(s, st, s->any, c);
    case 5:
        if (is_ws(c)) return take_ws(f);
        if (c == '}') return R_POP;
        if (c != ',') return R_REJECT;
        f->ws = 0;
        f->phase = 6;
        return R_OK;
    }
    return R_REJECT;
}

/* A tagged union (anyOf of objects whose first, required property is a string const
 * of its own, like OpenAI's {"name": N, "arguments": ...} of a call to one of several
 * functions): phases 0 '{', 1 the key's '"', 2 in the key (b: bytes matched), 3 ':', 4
 * the tag's value, pushed as the LITERALS node of all branches' consts. When that literal
 * ends, pop_frame turns this frame into the branch it named, past its first property. */
static int tagged_step(const fmoe_json_schema *s, json_state *st, json_frame *f, uint8_t c) {
    const json_node *n = &s->nodes[f->node];
    const json_node *first = &s->nodes[s->branches[n->first]];
    const json_lit *key = &s->lits[s->props[first->first].key];
    switch (f->phase) {
    case 0:
        if (c != '{') return R_REJECT;
        f->phase = 1;
        return R_OK;
    case 1:
        if (is_ws(c)) return take_ws(f);
        if (c != '"') return R_REJECT;
        f->ws = 0;
        f->b = 1;
        f->phase = 2;
        return R_OK;
    case 2:
        if (f->b >= key->len || (uint8_t)s->pool[key->off + f->b] != c) return R_REJECT;
        if (++f->b == key->len) f->phase = 3;
        return R_OK;
    case 3:
        if (is_ws(c)) return take_ws(f);
        if (c != ':') return R_REJECT;
        f->ws = 0;
        f->phase = 4;
        return R_OK;
    case 4:
        if (is_ws(c)) return take_ws(f);
        f->ws = 0;
        f->phase = 5; /* until the literal ends */
        return push_value(s, st, n->item, c);
    }
    return R_REJECT;
}

/* ---------------------------------------------------------------------------------- */
/* Arrays, strings, numbers, literals                                                 */
/* ---------------------------------------------------------------------------------- */

/* Phases: 0 '[', 1 first item or ']', 2 ',' or ']', 3 an item. a: items begun. */
static int array_step(const fmoe_json_schema *s, json_state *st, json_frame *f, uint8_t c) {
    const json_node *n = &s->nodes[f->node];
    switch (f->phase) {
    case 0:
        if (c != '[') return R_REJECT;
        f->phase = 1;
        return R_OK;
    case 1:
    case 3:
        if (is_ws(c)) return take_ws(f);
        if (c == ']' && f->phase == 1 && n->min_items == 0) return R_POP;
        if (n->max_items >= 0 && f->a >= n->max_items) return R_REJECT;
        f->ws = 0;
        f->a++;
        f->phase = 2;
        return push_value(s, st, n->item, c);
    case 2:
        if (is_ws(c)) return take_ws(f);
        if (c == ']' && f->a >= n->min_items) return R_POP;
        if (c == ',' && (n->max_items < 0 || f->a < n->max_items)) {
            f->ws = 0;
            f->phase = 3;
            return R_OK;
        }
        return R_REJECT;
    }
    return R_REJECT;
}

/* Phases: 0 '"', 1 body, 2 after '\', 3 \u digits (a: so far), 4 inside a UTF-8 sequence
 * (a: continuation bytes left; b: the next byte's range lo | hi << 8). The ranges are
 * those of well-formed UTF-8 (Unicode §3.9, table 3-7): no overlong forms, surrogates,
 * or code points past U+10FFFF. Control characters must be escaped (RFC 8259 §7). */
static int string_bytes(json_frame *f, uint8_t c) {
    switch (f->phase) {
    case 0:
        if (c != '"') return R_REJECT;
        f->phase = 1;
        return R_OK;
    case 1: {
        if (c == '"') return R_POP;
        if (c == '\\') {
            f->phase = 2;
            return R_OK;
        }
        if (c < 0x20) return R_REJECT;
        if (c < 0x80) return R_OK;
        unsigned lo, hi;
        const int k = fmoe_utf8_lead(c, &lo, &hi);
        if (k == 0) return R_REJECT;
        f->a = k - 1; /* continuation bytes to come */
        f->b = (int32_t)(lo | hi << 8);
        f->phase = 4;
        return R_OK;
    }
    case 2:
        if (c == 'u') {
            f->a = 0;
            f->phase = 3;
            return R_OK;
        }
        if (!strchr("\"\\/bfnrt", c) || c == 0) return R_REJECT;
        f->phase = 1;
        return R_OK;
    case 3:
        if (!is_hex(c)) return R_REJECT;
        if (++f->a == 4) f->phase = 1;
        return R_OK;
    case 4:
        if (c < (f->b & 0xFF) || c > (f->b >> 8)) return R_REJECT;
        f->b = 0x80 | 0xBF << 8;
        if (--f->a == 0) f->phase = 1;
        return R_OK;
    }
    return R_REJECT;
}

/* A string of a `pattern` (json_regex.c): its body written without escapes, ASCII only,
 * each byte one character the automaton takes; alive: the set of positions reached. */
static int pattern_step(const json_regex *re, json_frame *f, uint8_t c) {
    if (f->phase == 0) {
        if (c != '"') return R_REJECT;
        f->phase = 1;
        f->alive = JSON_REGEX_START;
        return R_OK;
    }
    if (c == '"') return fmoe__json_regex_accepts(re, f->alive) ? R_POP : R_REJECT;
    const uint64_t next = fmoe__json_regex_step(re, f->alive, c);
    if (!next) return R_REJECT;
    f->alive = next;
    return R_OK;
}

static int string_bounded(const json_node *n) { return n->min_items > 0 || n->max_items >= 0; }

/* A string of minLength / maxLength (n->min_items, n->max_items) characters, counted as
 * JSON Schema counts them (code points, §6.3.1 of its validation spec): a character
 * starts at a plain ASCII byte, at a UTF-8 lead byte and at a backslash. \u escapes are
 * not written in such a string (a surrogate pair would be two escapes for one code
 * point); every character has a plain or short-escape spelling. alive: characters so far. */
static int string_step(const fmoe_json_schema *s, const json_node *n, json_frame *f,
                       uint8_t c) {
    if (n->pattern >= 0) return pattern_step(&s->regexes[n->pattern], f, c);
    if (!string_bounded(n)) return string_bytes(f, c);
    if (f->phase == 1) {
        if (c == '"' && f->alive < (uint64_t)n->min_items) return R_REJECT;
        if (c != '"' && n->max_items >= 0 && f->alive >= (uint64_t)n->max_items) return R_REJECT;
        /* in the body every other byte starts a character (continuation bytes are
         * phase 4; a byte string_bytes refuses leaves the frame unused) */
        if (c != '"') f->alive++;
    } else if (f->phase == 2 && c == 'u') {
        return R_REJECT;
    }
    return string_bytes(f, c);
}

/* RFC 8259 §6: -? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?, digits bounded;
 * an integer has no fraction or exponent. a: digits of the current part. */
static int number_step(json_frame *f, int integer, uint8_t c) {
    const int frac_ok = !integer && (c == '.');
    const int exp_ok = !integer && (c == 'e' || c == 'E');
    switch (f->phase) {
    case N_START:
        if (c == '-') {
            f->phase = N_MINUS;
            return R_OK;
        }
        /* fall through */
    case N_MINUS:
        if (c == '0') f->phase = N_ZERO;
        else if (c >= '1' && c <= '9') f->phase = N_INT, f->a = 1;
        else return R_REJECT;
        return R_OK;
    case N_ZERO:
    case N_INT:
        if (f->phase == N_INT && is_digit(c) && f->a < NUM_MAX_INT_DIGITS) {
            f->a++;
            return R_OK;
        }
        if (frac_ok) f->phase = N_DOT;
        else if (exp_ok) f->phase = N_EXP;
        else return R_POP_REFEED;
        return R_OK;
    case N_DOT:
        if (!is_digit(c)) return R_REJECT;
        f->phase = N_FRAC;
        f->a = 1;
        return R_OK;
    case N_FRAC:
        if (is_digit(c) && f->a < NUM_MAX_FRAC_DIGITS) {
            f->a++;
            return R_OK;
        }
        if (!exp_ok) return R_POP_REFEED;
        f->phase = N_EXP;
        return R_OK;
    case N_EXP:
        if (c == '+' || c == '-') {
            f->phase = N_EXP_SIGN;
            return R_OK;
        }
        /* fall through */
    case N_EXP_SIGN:
        if (!is_digit(c)) return R_REJECT;
        f->phase = N_EXP_DIGITS;
        f->a = 1;
        return R_OK;
    case N_EXP_DIGITS:
        if (is_digit(c) && f->a < NUM_MAX_EXP_DIGITS) {
            f->a++;
            return R_OK;
        }
        return R_POP_REFEED;
    }
    return R_REJECT;
}

static int number_can_end(const json_frame *f) {
    return f->phase == N_ZERO || f->phase == N_INT || f->phase == N_FRAC ||
           f->phase == N_EXP_DIGITS;
}

/* Integers between n->lo and n->hi (minimum, maximum, exclusive*): the frame keeps the
 * sign (b) and the value of the digits so far (alive); a byte is taken only when some
 * integer of at most NUM_MAX_INT_DIGITS digits that starts with the bytes so far is in
 * range, and the number ends only in range. */
static int64_t pow10_of(int m) {
    int64_t p = 1;
    while (m-- > 0) p *= 10;
    return p;
}

static int in_range(const json_node *n, int64_t v) { return v >= n->lo && v <= n->hi; }

/* Some completion of the frame's digits lies in [lo, hi]. */
static int integer_feasible(const json_node *n, const json_frame *f) {
    const int neg = f->b;
    if (f->phase == N_START || f->phase == N_MINUS) {
        const int64_t most = pow10_of(NUM_MAX_INT_DIGITS) - 1;
        return neg ? n->lo <= 0 && n->hi >= -most : n->hi >= 0 && n->lo <= most;
    }
    const int64_t v = (int64_t)f->alive;
    if (f->phase == N_ZERO) return in_range(n, 0);
    for (int m = 0; f->a + m <= NUM_MAX_INT_DIGITS; m++) {
        const int64_t p = pow10_of(m), a = v * p, b = v * p + p - 1;
        const int64_t lo = neg ? -b : a, hi = neg ? -a : b;
        if (hi >= n->lo && lo <= n->hi) return 1;
    }
    return 0;
}

static int integer_step(const json_node *n, json_frame *f, uint8_t c) {
    if (!n->bounded) return number_step(f, 1, c);
    json_frame g = *f;
    const int r = number_step(&g, 1, c);
    if (r == R_POP_REFEED)
        return in_range(n, f->b ? -(int64_t)f->alive : (int64_t)f->alive) ? r : R_REJECT;
    if (r != R_OK) return r;
    if (c == '-') g.b = 1;
    else g.alive = g.alive * 10 + (uint64_t)(c - '0');
    if (!integer_feasible(n, &g)) return R_REJECT;
    *f = g;
    return R_OK;
}

static int integer_can_end(const json_node *n, const json_frame *f) {
    if (!number_can_end(f)) return 0;
    return !n->bounded || in_range(n, f->b ? -(int64_t)f->alive : (int64_t)f->alive);
}

/* b: bytes matched; alive: the literals that match them. */
static int literal_can_end(const fmoe_json_schema *s, const json_frame *f) {
    const json_node *n = &s->nodes[f->node];
    for (uint64_t m = f->alive; m; m &= m - 1)
        if (s->lits[n->first + __builtin_ctzll(m)].len == f->b) return 1;
    return 0;
}

static int literal_step(const fmoe_json_schema *s, json_frame *f, uint8_t c) {
    const json_node *n = &s->nodes[f->node];
    uint64_t keep = 0;
    int longer = 0;
    for (uint64_t m = f->alive; m; m &= m - 1) {
        const int32_t i = __builtin_ctzll(m);
        const json_lit *l = &s->lits[n->first + i];
        if (l->len > f->b && (uint8_t)s->pool[l->off + f->b] == c) {
            keep |= 1ull << i;
            longer |= l->len > f->b + 1;
        }
    }
    if (!keep) return f->b > 0 && literal_can_end(s, f) ? R_POP_REFEED : R_REJECT;
    f->alive = keep;
    f->b++;
    return longer ? R_OK : R_POP;
}

/* ---------------------------------------------------------------------------------- */
/* The machine                                                                        */
/* ---------------------------------------------------------------------------------- */

static int frame_step(const fmoe_json_schema *s, json_state *st, uint8_t c) {
    json_frame *f = &st->f[st->depth - 1];
    switch (s->nodes[f->node].kind) {
    case JSON_OBJECT: return object_step(s, st, f, c);
    case JSON_ANY_OBJECT: return any_object_step(s, st, f, c);
    case JSON_ARRAY: return array_step(s, st, f, c);
    case JSON_STRING: return string_step(s, &s->nodes[f->node], f, c);
    case JSON_NUMBER: return number_step(f, 0, c);
    case JSON_INTEGER: return integer_step(&s->nodes[f->node], f, c);
    case JSON_LITERALS: return literal_step(s, f, c);
    case JSON_TAGGED: return tagged_step(s, st, f, c);
    }
    return R_REJECT; /* ANY and ANYOF frames are never pushed */
}

/* Ends the top frame. A tag's literal ending under a TAGGED frame picks the branch: the
 * tags are strings, distinct, so their closing quote leaves exactly one literal alive. */
static void pop_frame(const fmoe_json_schema *s, json_state *st) {
    const json_frame *top = &st->f[--st->depth];
    if (st->depth == 0) return;
    json_frame *parent = &st->f[st->depth - 1];
    const json_node *pn = &s->nodes[parent->node];
    if (pn->kind != JSON_TAGGED) return;
    const int32_t branch = s->branches[pn->first + __builtin_ctzll(top->alive)];
    /* as the branch's object frame is after its first property's value */
    *parent = (json_frame){.node = (uint16_t)branch, .phase = 5, .a = 1};
}

void fmoe__json_state_start(const fmoe_json_schema *s, json_state *st) {
    (void)s;
    st->depth = 0;
    st->started = 0;
}

int fmoe__json_step(const fmoe_json_schema *s, json_state *st, uint8_t c) {
    if (!st->started) {
        /* no whitespace before the document */
        if (push_value(s, st, s->root, c) != R_PUSH) return 0;
        st->started = 1;
    }
    while (st->depth > 0) {
        switch (frame_step(s, st, c)) {
        case R_OK: return 1;
        case R_POP: pop_frame(s, st); return 1;
        case R_POP_REFEED: pop_frame(s, st); break;
        case R_PUSH: break;
        default: return 0;
        }
    }
    return 0; /* a byte after the document */
}

int fmoe__json_complete(const fmoe_json_schema *s, const json_state *st) {
    if (!st->started) return 0;
    if (st->depth == 0) return 1;
    if (st->depth > 1) return 0;
    const json_frame *f = &st->f[0];
    switch (s->nodes[f->node].kind) {
    case JSON_NUMBER: return number_can_end(f);
    case JSON_INTEGER: return integer_can_end(&s->nodes[f->node], f);
    case JSON_LITERALS: return f->b > 0 && literal_can_end(s, f);
    default: return 0;
    }
}

int64_t fmoe__json_string_room(const fmoe_json_schema *s, const json_state *st) {
    if (st->depth == 0) return -1;
    const json_frame *f = &st->f[st->depth - 1];
    const json_node *n = &s->nodes[f->node];
    if (n->kind != JSON_STRING || f->phase != 1 || n->pattern >= 0) return -1;
    if (n->max_items < 0) return INT64_MAX;
    return (int64_t)n->max_items - (int64_t)f->alive;
}
