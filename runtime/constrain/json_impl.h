/*
 * json_impl.h - the compiled schema (json_schema.c) and the byte automaton that runs it
 * (json_match.c), shared by the vocabulary mask (json_vocab.c).
 *
 * A schema is a flat table of nodes. The automaton is a pushdown machine whose stack
 * holds one frame per value being written (an object holds its property's value above
 * it); a byte changes the top frame, pushes a child or pops a finished one. A frame is
 * 24 bytes, so the vocabulary walk copies a state of a few frames per trie edge.
 */
#ifndef FMOE_JSON_IMPL_H
#define FMOE_JSON_IMPL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "fmoe/json_constraint.h"

/* Nesting of frames: schema nesting plus FMOE_JSON_MAX_NEST for "any JSON". */
#define JSON_MAX_DEPTH 40
/* Properties of one object, literals of one enum, branches of one anyOf: a frame keeps
 * the candidates still alive in a 64-bit mask. */
#define JSON_MAX_ALTS 64

typedef enum json_kind {
    JSON_ANY = 0,      /* any JSON value: dispatched on its first byte */
    JSON_OBJECT = 1,   /* listed properties, in order */
    JSON_ANY_OBJECT,   /* any keys, values any JSON */
    JSON_ARRAY,
    JSON_STRING,
    JSON_NUMBER,
    JSON_INTEGER,
    JSON_LITERALS,     /* one of a few JSON texts: enum, const, true/false, null */
    JSON_ANYOF,        /* branches told apart by their first byte */
    JSON_TAGGED,       /* object branches told apart by their first property's string const
                          (a tagged union): the tag key and value are read here, then the
                          frame becomes the branch whose const it was */
} json_kind;

typedef struct json_node {
    int32_t kind;      /* json_kind */
    /* OBJECT: props [first, first + count) of schema->props; LITERALS: literals
     * [first, first + count) of schema->lits; ANYOF, TAGGED: branches [first, first +
     * count) of schema->branches (TAGGED: OBJECT nodes sharing their first, required
     * property's key) */
    int32_t first, count;
    int32_t item;      /* ARRAY: the items' node; TAGGED: the LITERALS node of the tag
                          values, literal i being branch i's */
    int32_t min_items, max_items; /* ARRAY: items; STRING: characters (minLength,
                                     maxLength); max_items -1: no limit */
    int32_t bounded;   /* INTEGER: 1 when lo and hi apply */
    int32_t pattern;   /* STRING: its `pattern` in schema->regexes, or -1 */
    int64_t lo, hi;    /* INTEGER: the values allowed (minimum, maximum, exclusive*) */
    uint64_t starts[4]; /* the bytes a value of this node may begin with (256 bits) */
} json_node;

typedef struct json_prop {
    int32_t key;       /* the literal of its JSON-encoded name, quotes included */
    int32_t value;     /* node */
    int32_t required;
} json_prop;

typedef struct json_lit {
    int32_t off, len;  /* bytes in schema->pool */
} json_lit;

/* A string's `pattern` as a position automaton (json_regex.c): positions 0..npos-1,
 * each one character class of ASCII bytes; a set of positions is a 64-bit mask, and
 * JSON_REGEX_START (bit 63, never a position) the set before the first character. */
#define JSON_REGEX_MAX_POS 63
#define JSON_REGEX_START (1ull << 63)
typedef struct json_regex {
    int32_t npos;
    int32_t nullable;           /* the empty string matches */
    uint64_t first, last;       /* positions a match starts at / ends at */
    uint64_t follow[JSON_REGEX_MAX_POS];  /* positions that may come after each one */
    uint64_t cls[JSON_REGEX_MAX_POS][2];  /* the bytes (0..127) each one matches */
} json_regex;

/* Compiles pattern src[0..len) (where: its JSON path, for the error). @return 0, or
 * FMOE_EUNSUPPORTED naming the construct the subset does not have. */
int fmoe__json_regex_compile(const char *src, size_t len, const char *where, json_regex *re);

/* @return the set of positions after byte c from set `at` (0: c refused). */
uint64_t fmoe__json_regex_step(const json_regex *re, uint64_t at, uint8_t c);

/* @return 1 when a match may end at set `at`. */
int fmoe__json_regex_accepts(const json_regex *re, uint64_t at);

struct fmoe_json_schema {
    atomic_int refs;
    json_node *nodes;
    int32_t num_nodes, cap_nodes;
    json_prop *props;
    int32_t num_props, cap_props;
    json_lit *lits;
    int32_t num_lits, cap_lits;
    int32_t *branches;
    int32_t num_branches, cap_branches;
    char *pool;
    int32_t pool_len, pool_cap;
    json_regex *regexes;
    int32_t num_regexes, cap_regexes;
    int32_t root;
    /* built-in nodes every schema has, for "any JSON" values and object keys */
    int32_t any, any_object, any_array, string, number, lit_true, lit_false, lit_null;
};

typedef struct json_frame {
    uint16_t node;
    uint8_t phase;
    uint8_t ws;        /* whitespace bytes in a row */
    int32_t a, b;      /* per kind: counters, the chosen property, UTF-8 state */
    uint64_t alive;    /* OBJECT key candidates / LITERALS candidates */
} json_frame;

typedef struct json_state {
    int32_t depth;     /* frames in use; 0 once the document is closed */
    int32_t started;   /* 0 before the first byte (the root is not pushed yet) */
    json_frame f[JSON_MAX_DEPTH];
} json_state;

/* The state before the first byte. */
void fmoe__json_state_start(const fmoe_json_schema *s, json_state *st);

/* Feeds one byte. @return 1 when accepted (st advanced), 0 when refused (st is then
 * in an unspecified state: callers feed a copy). */
int fmoe__json_step(const fmoe_json_schema *s, json_state *st, uint8_t c);

/* @return 1 when st is a whole document. */
int fmoe__json_complete(const fmoe_json_schema *s, const json_state *st);

/* @return -1 when st is not inside the body of a string (or is in an escape or a UTF-8
 * sequence); else the characters the string may still take: INT64_MAX without maxLength
 * (plain string bytes then leave the state as it is), else maxLength minus those so far
 * (plain bytes only count up). */
int64_t fmoe__json_string_room(const fmoe_json_schema *s, const json_state *st);

/* Copies the frames in use. */
static inline void json_state_copy(json_state *dst, const json_state *src) {
    dst->depth = src->depth;
    dst->started = src->started;
    for (int32_t i = 0; i < src->depth; i++) dst->f[i] = src->f[i];
}

#endif
