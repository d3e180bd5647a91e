/*
 * json_vocab.c - the vocabulary as a trie of token bytes, and the per-step mask.
 *
 * A mask asks, for every token, whether the automaton takes all of its bytes from the
 * current state. Tokens share prefixes ("{\"", "{\"name", ...), so the bytes are put in
 * a trie once per tokenizer (the design of llama.cpp's grammar sampler and of
 * llguidance/xgrammar's token tries): the walk runs the automaton once per trie edge, and
 * the first byte the automaton refuses cuts off the whole subtree below it, which in most
 * states of a schema is nearly all of the vocabulary. Only in the body of a free string
 * does the walk visit most of the trie (about as many edges as the vocabulary has bytes,
 * less the shared prefixes). That state is the common one (a model writes strings for
 * most of a document), so it has a shortcut, the "context-independent tokens" of
 * xgrammar: a token whose bytes are all plain string bytes (no '"', '\\' or control
 * character, whole UTF-8 sequences) leaves a string body in the same state, so it is
 * admitted there without a walk. Those tokens' mask is computed once; only the others,
 * kept in a second trie, are walked. Each level of the walk keeps its own copy of the
 * state (json_state_copy copies only the frames in use), allocated with the matcher.
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "fmoe/utf8.h"
#include "json_impl.h"

typedef struct trie_node {
    int32_t child;     /* first child, 0: none (node 0 is the root, never a child) */
    int32_t sibling;   /* next child of the same parent, 0: none */
    int32_t token;     /* the first token whose bytes end here, -1: none */
    uint8_t byte;
} trie_node;

typedef struct trie {
    trie_node *nodes;  /* [num_nodes], node 0 the root */
    int32_t num_nodes, cap_nodes;
} trie;

struct fmoe_json_vocab {
    int32_t V;
    /* the admissible tokens in two tries: those of plain string bytes, and the rest */
    trie plain_trie, rest;
    uint8_t *plain;    /* [V] 1: a token of plain string bytes (the mask of plain_trie) */
    uint8_t *plain_chars; /* [V] a plain token's characters (UTF-8 sequences), 255 for 255
                             or more: for strings with maxLength */
    int32_t num_plain;
    int32_t *token_next; /* [V] the next token with the same bytes, -1: none */
    int32_t max_len;   /* the longest token, in bytes: the walk's depth */
    int32_t *end_ids;  /* [num_end] */
    int32_t num_end;
    /* each admissible token's bytes, for accepting it: bytes[token_off[id] ..
     * + token_len[id]); token_len 0 for end ids, special and empty tokens */
    char *bytes;
    int64_t *token_off; /* [V] */
    int32_t *token_len; /* [V] */
    int64_t num_bytes, cap_bytes;
};

struct fmoe_json_matcher {
    const fmoe_json_schema *schema;
    const fmoe_json_vocab *vocab;
    json_state state;
    json_state *walk;  /* [vocab->max_len + 1] the walk's state at each depth */
    uint8_t *allowed;  /* the mask being filled (during a walk) */
    int32_t count;
};

/* ---------------------------------------------------------------------------------- */
/* The trie                                                                           */
/* ---------------------------------------------------------------------------------- */

static int trie_init(trie *t) {
    t->cap_nodes = 4096;
    t->nodes = malloc((size_t)t->cap_nodes * sizeof *t->nodes);
    if (!t->nodes) return fmoe_error_set(FMOE_ENOMEM, "out of memory building the token trie");
    t->nodes[0] = (trie_node){.token = -1};
    t->num_nodes = 1;
    return 0;
}

static int trie_child(trie *t, int32_t parent, uint8_t byte, int32_t *out) {
    int32_t *link = &t->nodes[parent].child;
    while (*link && t->nodes[*link].byte < byte) link = &t->nodes[*link].sibling;
    if (*link && t->nodes[*link].byte == byte) {
        *out = *link;
        return 0;
    }
    if (t->num_nodes == t->cap_nodes) {
        const int32_t cap = 2 * t->cap_nodes;
        const ptrdiff_t at = (char *)link - (char *)t->nodes;
        trie_node *g = realloc(t->nodes, (size_t)cap * sizeof *g);
        if (!g) return fmoe_error_set(FMOE_ENOMEM, "out of memory building the token trie");
        t->nodes = g;
        t->cap_nodes = cap;
        link = (int32_t *)((char *)g + at);
    }
    const int32_t id = t->num_nodes++;
    t->nodes[id] = (trie_node){.child = 0, .sibling = *link, .token = -1, .byte = byte};
    *link = id;
    *out = id;
    return 0;
}

/* Adds token id of bytes p[0..len) to t; tokens with the same bytes form a list (through
 * token_next), so each is admitted with the others. */
static int trie_add(fmoe_json_vocab *v, trie *t, int32_t id, const char *p, size_t len) {
    int32_t node = 0;
    for (size_t b = 0; b < len; b++)
        FMOE_FORWARD_IF_ERROR(trie_child(t, node, (uint8_t)p[b], &node));
    v->token_next[id] = t->nodes[node].token;
    t->nodes[node].token = id;
    return 0;
}

/* 1 when p[0..len) may stand anywhere in a string body and leaves it there: no '"', '\\'
 * or control character, and whole well-formed UTF-8 sequences (Unicode §3.9 table 3-7). */
static int plain_string_bytes(const uint8_t *p, size_t len) {
    size_t i = 0;
    while (i < len) {
        const uint8_t c = p[i];
        if (c < 0x20 || c == '"' || c == '\\') return 0;
        if (c < 0x80) {
            i++;
            continue;
        }
        unsigned lo, hi;
        const size_t k = (size_t)fmoe_utf8_lead(c, &lo, &hi);
        if (k == 0 || i + k > len || p[i + 1] < lo || p[i + 1] > hi) return 0;
        for (size_t j = 2; j < k; j++)
            if ((p[i + j] & 0xC0) != 0x80) return 0;
        i += k;
    }
    return 1;
}

int fmoe_json_vocab_init(const fmoe_tokenizer *tok, const int32_t *end_ids, int32_t num_end,
                         fmoe_json_vocab **out) {
    if (!tok || !out || num_end < 0 || (num_end > 0 && !end_ids))
        return fmoe_error_set(FMOE_EINVAL, "tokenizer, end ids or output is NULL");
    fmoe_json_vocab *v = calloc(1, sizeof *v);
    if (!v) return fmoe_error_set(FMOE_ENOMEM, "out of memory building the token trie");
    int rc = 0;
    v->V = fmoe_tokenizer_vocab_size(tok);
    if ((rc = trie_init(&v->plain_trie)) < 0 || (rc = trie_init(&v->rest)) < 0) goto fail;
    v->plain = calloc((size_t)(v->V > 0 ? v->V : 1), 1);
    v->plain_chars = calloc((size_t)(v->V > 0 ? v->V : 1), 1);
    v->token_next = malloc((size_t)(v->V > 0 ? v->V : 1) * sizeof *v->token_next);
    v->end_ids = malloc((size_t)(num_end > 0 ? num_end : 1) * sizeof *v->end_ids);
    v->token_off = calloc((size_t)(v->V > 0 ? v->V : 1), sizeof *v->token_off);
    v->token_len = calloc((size_t)(v->V > 0 ? v->V : 1), sizeof *v->token_len);
    if (!v->plain || !v->plain_chars || !v->token_next || !v->end_ids || !v->token_off || !v->token_len) {
        rc = fmoe_error_set(FMOE_ENOMEM, "out of memory building the token trie");
        goto fail;
    }
    for (int32_t i = 0; i < num_end; i++)
        if (end_ids[i] >= 0 && end_ids[i] < v->V) v->end_ids[v->num_end++] = end_ids[i];
    for (int32_t id = 0; id < v->V; id++) {
        v->token_next[id] = -1;
        const char *piece;
        size_t len;
        int is_end = 0;
        for (int32_t i = 0; i < v->num_end; i++) is_end |= v->end_ids[i] == id;
        /* end ids are admitted by state, special tokens and empty pieces never */
        if (is_end || fmoe_tokenizer_is_special(tok, id) ||
            fmoe_tokenizer_token_to_piece(tok, id, &piece, &len) < 0 || len == 0)
            continue;
        if (v->num_bytes + (int64_t)len > v->cap_bytes) {
            const int64_t cap = 2 * (v->cap_bytes + (int64_t)len) + 4096;
            char *g = realloc(v->bytes, (size_t)cap);
            if (!g) {
                rc = fmoe_error_set(FMOE_ENOMEM, "out of memory building the token trie");
                goto fail;
            }
            v->bytes = g;
            v->cap_bytes = cap;
        }
        memcpy(v->bytes + v->num_bytes, piece, len);
        v->token_off[id] = v->num_bytes;
        v->token_len[id] = (int32_t)len;
        v->num_bytes += (int64_t)len;
        v->plain[id] = (uint8_t)plain_string_bytes((const uint8_t *)piece, len);
        v->num_plain += v->plain[id];
        if (v->plain[id]) {
            int32_t chars = 0;
            for (size_t b = 0; b < len; b++) chars += ((uint8_t)piece[b] & 0xC0) != 0x80;
            v->plain_chars[id] = (uint8_t)(chars < 255 ? chars : 255);
        }
        /* same bytes, same trie: plainness depends on the bytes only */
        if ((rc = trie_add(v, v->plain[id] ? &v->plain_trie : &v->rest, id, piece, len)) < 0)
            goto fail;
        if ((int32_t)len > v->max_len) v->max_len = (int32_t)len;
    }
    *out = v;
    return 0;
fail:
    fmoe_json_vocab_free(v);
    return rc;
}

void fmoe_json_vocab_free(fmoe_json_vocab *v) {
    if (!v) return;
    free(v->plain_trie.nodes);
    free(v->rest.nodes);
    free(v->plain);
    free(v->plain_chars);
    free(v->token_next);
    free(v->end_ids);
    free(v->bytes);
    free(v->token_off);
    free(v->token_len);
    free(v);
}

int32_t fmoe_json_vocab_size(const fmoe_json_vocab *v) { return v->V; }

/* ---------------------------------------------------------------------------------- */
/* The matcher                                                                        */
/* ---------------------------------------------------------------------------------- */

int fmoe_json_matcher_init(const fmoe_json_schema *schema, const fmoe_json_vocab *vocab,
                           fmoe_json_matcher **out) {
    if (!schema || !out) return fmoe_error_set(FMOE_EINVAL, "schema or output is NULL");
    fmoe_json_matcher *m = calloc(1, sizeof *m);
    if (!m) return fmoe_error_set(FMOE_ENOMEM, "out of memory for a JSON matcher");
    m->schema = schema;
    m->vocab = vocab;
    fmoe__json_state_start(schema, &m->state);
    if (vocab) {
        m->walk = malloc((size_t)(vocab->max_len + 1) * sizeof *m->walk);
        if (!m->walk) {
            free(m);
            return fmoe_error_set(FMOE_ENOMEM, "out of memory for a JSON matcher");
        }
    }
    *out = m;
    return 0;
}

void fmoe_json_matcher_free(fmoe_json_matcher *m) {
    if (!m) return;
    free(m->walk);
    free(m);
}

/* Depth first over the children of node `node` of trie t, from the state m->walk[level]. */
static void walk(fmoe_json_matcher *m, const trie_node *nodes, int32_t node, int32_t level) {
    const json_state *from = &m->walk[level];
    json_state *to = &m->walk[level + 1];
    for (int32_t c = nodes[node].child; c; c = nodes[c].sibling) {
        json_state_copy(to, from);
        if (!fmoe__json_step(m->schema, to, nodes[c].byte)) continue;
        for (int32_t t = nodes[c].token; t >= 0; t = m->vocab->token_next[t]) {
            m->allowed[t] = 1;
            m->count++;
        }
        if (nodes[c].child) walk(m, nodes, c, level + 1);
    }
}

int32_t fmoe_json_matcher_mask(fmoe_json_matcher *m, uint8_t *allowed) {
    const fmoe_json_vocab *v = m->vocab;
    m->allowed = allowed;
    json_state_copy(&m->walk[0], &m->state);
    const int64_t room = fmoe__json_string_room(m->schema, &m->state);
    if (room == INT64_MAX) {
        memcpy(allowed, v->plain, (size_t)v->V);
        m->count = v->num_plain;
    } else if (room >= 0) {
        /* maxLength: a plain token fits when its characters do (255: too many to count) */
        m->count = 0;
        for (int32_t i = 0; i < v->V; i++) {
            allowed[i] = v->plain[i] && v->plain_chars[i] < 255 && v->plain_chars[i] <= room;
            m->count += allowed[i];
        }
    } else {
        memset(allowed, 0, (size_t)v->V);
        m->count = 0;
        walk(m, v->plain_trie.nodes, 0, 0);
    }
    walk(m, v->rest.nodes, 0, 0);
    if (fmoe__json_complete(m->schema, &m->state))
        for (int32_t i = 0; i < v->num_end; i++)
            if (!allowed[v->end_ids[i]]) {
                allowed[v->end_ids[i]] = 1;
                m->count++;
            }
    m->allowed = NULL;
    return m->count;
}

int fmoe_json_matcher_is_end(const fmoe_json_matcher *m, int32_t id) {
    if (!m->vocab) return 0;
    for (int32_t i = 0; i < m->vocab->num_end; i++)
        if (m->vocab->end_ids[i] == id) return 1;
    return 0;
}

int fmoe_json_matcher_feed(fmoe_json_matcher *m, const char *bytes, size_t n) {
    json_state st;
    json_state_copy(&st, &m->state);
    for (size_t i = 0; i < n; i++)
        FMOE_RETURN_ERROR_IF(!fmoe__json_step(m->schema, &st, (uint8_t)bytes[i]), FMOE_EINVAL,
                             "byte %zu (0x%02x) cannot continue the JSON document", i,
                             (unsigned)(uint8_t)bytes[i]);
    json_state_copy(&m->state, &st);
    return 0;
}

int fmoe_json_matcher_accept(fmoe_json_matcher *m, int32_t id) {
    const fmoe_json_vocab *v = m->vocab;
    FMOE_RETURN_ERROR_IF(!v || id < 0 || id >= v->V, FMOE_EINVAL,
                         "token %d is outside the vocabulary", id);
    FMOE_RETURN_ERROR_IF(v->token_len[id] == 0, FMOE_EINVAL,
                         "token %d is never admitted (an end id, special or empty)", id);
    return fmoe_json_matcher_feed(m, v->bytes + v->token_off[id], (size_t)v->token_len[id]);
}

int fmoe_json_matcher_is_complete(const fmoe_json_matcher *m) {
    return fmoe__json_complete(m->schema, &m->state);
}
