/*
 * tokenizer_impl.h - internals shared by the tokenizer sources (not a public header).
 *
 * A loaded tokenizer is one immutable struct: the vocabulary (strings in one arena, two
 * open-addressing hash tables: string -> id and (left id, right id) -> merge), the added
 * tokens with their matchers, and the pipeline stages of tokenizer.json flattened into
 * arrays of steps (Sequence nodes are expanded at load).
 *
 * Files:
 *   tokenizer.c  loading tokenizer.json / tokenizer_config.json, accessors
 *   hashmap.c    the two hash tables (string -> id, (left, right) -> merge)
 *   buf.c        the growable byte buffer
 *   encode.c     added-token split, normalizers, pre-tokenizers, the BPE model,
 *                post-processor
 *   decode.c     decoders, token pieces
 *   unicode.c    UTF-8 helpers and NFC/NFD (tables in unicode_tables.h)
 *   chat.c       chat-template entry point and the fixed renderers (its fallback)
 *   chat_jinja.c the variables a template is rendered with
 *   jinja_*.c    the Jinja interpreter (jinja.h)
 */
#ifndef FMOE_TOKENIZER_IMPL_H
#define FMOE_TOKENIZER_IMPL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stddef.h>
#include <stdint.h>

#include "fmoe/tokenizer.h"

/* Largest token id accepted from a file (guards the id table against hostile input). */
#define TOK_MAX_ID (1 << 24)

/* ---- growable byte buffer ------------------------------------------------------------ */

typedef struct tok_buf {
    char *p;
    size_t len;
    size_t cap;
} tok_buf;

/* Makes room for `extra` more bytes and the NUL after them. @return 0 or FMOE_ENOMEM. */
int fmoe__tok_buf_reserve(tok_buf *b, size_t extra);
/* Appends n bytes and keeps p NUL-terminated. @return 0 or FMOE_ENOMEM. */
int fmoe__tok_buf_append(tok_buf *b, const void *data, size_t n);
void fmoe__tok_buf_free(tok_buf *b); /* leaves an empty buffer */

/* ---- string -> id hash table (open addressing, linear probing) ------------------------- */

typedef struct tok_strmap_slot {
    const char *s; /* NULL: empty; points into the tokenizer's string arena */
    uint32_t len;
    uint32_t hash;
    int32_t id;
} tok_strmap_slot;

typedef struct tok_strmap {
    tok_strmap_slot *slots; /* [mask + 1] */
    size_t mask;
    size_t count;
} tok_strmap;

/* 32-bit FNV-1a of n bytes. */
uint32_t fmoe__tok_hash(const void *s, size_t n);
/* Makes room for `want` entries without growing again. @return 0 or FMOE_ENOMEM. */
int fmoe__tok_strmap_reserve(tok_strmap *m, size_t want);
/* Inserts or replaces (the last insert of a key wins, as in HuggingFace's maps). The map
 * keeps the pointer `s`, not a copy. @return 0 or FMOE_ENOMEM. */
int fmoe__tok_strmap_put(tok_strmap *m, const char *s, size_t n, int32_t id);
int32_t fmoe__tok_strmap_get(const tok_strmap *m, const char *s, size_t n); /* -1: absent */
void fmoe__tok_strmap_free(tok_strmap *m); /* leaves an empty map */

/* ---- merges: (left id, right id) -> (rank, merged id) ------------------------------- */

typedef struct tok_merge_slot {
    uint64_t key; /* (left << 32) | right; UINT64_MAX: empty */
    uint32_t rank;
    int32_t new_id;
} tok_merge_slot;

typedef struct tok_mergemap {
    tok_merge_slot *slots; /* [mask + 1] */
    size_t mask;
    size_t count;
} tok_mergemap;

/* Sizes an empty table for n merges; it does not grow. @return 0 or FMOE_ENOMEM. */
int fmoe__tok_mergemap_init(tok_mergemap *m, size_t n);
/* Inserts or replaces the merge of (a, b); at most the n of init distinct pairs. */
void fmoe__tok_mergemap_put(tok_mergemap *m, int32_t a, int32_t b, uint32_t rank,
                            int32_t new_id);
void fmoe__tok_mergemap_free(tok_mergemap *m); /* leaves an empty table */

static inline uint64_t fmoe__tok_merge_key(int32_t a, int32_t b) {
    return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
}

/* The slot a key's probe starts at: the key mixed (the first half of murmur3's 64-bit
 * finaliser) so that pairs differing in a few low bits spread over the table. */
static inline size_t fmoe__tok_merge_home(const tok_mergemap *m, uint64_t key) {
    uint64_t x = key;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return (size_t)(x & m->mask);
}

/* The merge of (a, b), or NULL. Inline: the BPE loop (encode.c) calls it per pair. */
static inline const tok_merge_slot *fmoe__tok_mergemap_get(const tok_mergemap *m, int32_t a,
                                                           int32_t b) {
    uint64_t key = fmoe__tok_merge_key(a, b);
    size_t j = fmoe__tok_merge_home(m, key);
    while (m->slots[j].key != UINT64_MAX) {
        if (m->slots[j].key == key) return &m->slots[j];
        j = (j + 1) & m->mask;
    }
    return NULL;
}

/* ---- added tokens ----------------------------------------------------------------------- */

typedef struct tok_added {
    char *content;   /* as in tokenizer.json */
    size_t len;
    char *pattern;   /* what is matched: content, or its normalized form when normalized */
    size_t pattern_len;
    int32_t id;
    uint8_t single_word, lstrip, rstrip, normalized, special;
} tok_added;

/* Leftmost-longest matcher over a set of added tokens: candidates bucketed by first byte,
 * longest first. */
typedef struct tok_matcher {
    int32_t *order;       /* [n] indices into tokenizer.added */
    uint32_t first[257];  /* bucket b is order[first[b] .. first[b+1]) */
    size_t n;
} tok_matcher;

/* ---- pipeline steps ------------------------------------------------------------------ */

typedef enum tok_norm_kind {
    TOK_NORM_NFC,
    TOK_NORM_NFD,
    TOK_NORM_PREPEND,
    TOK_NORM_REPLACE,
    TOK_NORM_STRIP,
} tok_norm_kind;

typedef struct tok_norm_step {
    tok_norm_kind kind;
    char *a;          /* PREPEND: the prefix; REPLACE: the literal pattern (NULL for regex) */
    size_t a_len;
    char *b;          /* REPLACE: the replacement */
    size_t b_len;
    pcre2_code *re;   /* REPLACE with a Regex pattern */
    int left, right;  /* STRIP */
} tok_norm_step;

typedef enum tok_split_behavior {
    TOK_SPLIT_REMOVED,
    TOK_SPLIT_ISOLATED,
    TOK_SPLIT_MERGED_WITH_PREVIOUS,
    TOK_SPLIT_MERGED_WITH_NEXT,
    TOK_SPLIT_CONTIGUOUS,
} tok_split_behavior;

typedef enum tok_pre_kind {
    TOK_PRE_SPLIT,     /* also Digits (as a \p{N} regex, Isolated) */
    TOK_PRE_BYTELEVEL,
    TOK_PRE_METASPACE,
} tok_pre_kind;

typedef enum tok_prepend_scheme {
    TOK_PREPEND_ALWAYS,
    TOK_PREPEND_FIRST,
    TOK_PREPEND_NEVER,
} tok_prepend_scheme;

typedef struct tok_pre_step {
    tok_pre_kind kind;
    pcre2_code *re;               /* SPLIT; BYTELEVEL with use_regex (shared GPT-2 regex) */
    tok_split_behavior behavior;  /* SPLIT */
    int invert;                   /* SPLIT */
    int add_prefix_space;         /* BYTELEVEL */
    char replacement[8];          /* METASPACE: UTF-8 of the replacement char */
    size_t replacement_len;
    tok_prepend_scheme prepend;   /* METASPACE */
    int split;                    /* METASPACE */
} tok_pre_step;

typedef enum tok_dec_kind {
    TOK_DEC_BYTELEVEL,
    TOK_DEC_METASPACE,
    TOK_DEC_REPLACE,
    TOK_DEC_BYTEFALLBACK,
    TOK_DEC_FUSE,
    TOK_DEC_STRIP,
} tok_dec_kind;

typedef struct tok_dec_step {
    tok_dec_kind kind;
    char *a;              /* REPLACE: pattern; STRIP: content char (UTF-8); METASPACE: replacement */
    size_t a_len;
    char *b;              /* REPLACE: replacement */
    size_t b_len;
    int start, stop;      /* STRIP */
    int strip_first;      /* METASPACE: prepend_scheme != never */
} tok_dec_step;

/* Per-id data. */
typedef struct tok_entry {
    uint32_t str_off;   /* token string in strings arena; UINT32_MAX: no token */
    uint32_t str_len;
    uint32_t piece_off; /* piece bytes (token_to_piece) in pieces arena */
    uint32_t piece_len;
    uint8_t added;      /* 1: an added token */
    uint8_t special;    /* 1: a special added token */
} tok_entry;

#define TOK_MAX_STEPS 16

struct fmoe_tokenizer {
    char *path;                /* tokenizer.json path, for messages */

    /* vocabulary */
    char *strings;             /* arena of NUL-terminated token strings */
    size_t strings_len;
    char *pieces;              /* arena of token pieces */
    tok_entry *entries;        /* [n_ids] */
    int32_t n_ids;
    tok_strmap vocab;          /* model vocabulary string -> id */
    tok_strmap added_map;      /* added token content -> id */
    tok_mergemap merges;

    /* model */
    int byte_level;            /* a ByteLevel pre-tokenizer: the model sees bytes */
    int byte_fallback;
    int ignore_merges;
    int fuse_unk;
    int split_metaspace;       /* no merge joins a char to a following "▁": words may be cut
                                  before each "▁" (see encode.c model_piece) */
    int32_t unk_id;            /* -1: none */
    int32_t byte_ids[256];     /* byte_level: id of each byte's alphabet char (-1: none);
                                  else byte_fallback: id of <0xXX> (-1: none) */

    /* added tokens */
    tok_added *added;          /* [n_added] */
    size_t n_added;
    tok_matcher match_raw;     /* normalized == false */
    tok_matcher match_norm;    /* normalized == true */
    pcre2_code *word_re;       /* single_word: one \w code point */

    /* pipeline */
    tok_norm_step norm[TOK_MAX_STEPS];
    int n_norm;
    tok_pre_step pre[TOK_MAX_STEPS];
    int n_pre;
    pcre2_code *gpt2_re;       /* owned here when a ByteLevel step uses the regex */
    int32_t *post_prefix;      /* ids added before the text when add_special */
    size_t n_post_prefix;
    int32_t *post_suffix;
    size_t n_post_suffix;
    tok_dec_step dec[TOK_MAX_STEPS];
    int n_dec;
    int has_decoder;

    /* tokenizer_config.json */
    int32_t bos_id, eos_id;
    char *bos_text;            /* bos_token / eos_token text for templates ("" if none) */
    char *eos_text;
    char *chat_template_text;  /* raw template (NULL if none) */
    char *chat_template_tool_use; /* the "tool_use" one of a list of named templates */
    char *chat_refused;        /* why the interpreter refuses chat_template_text (NULL: it
                                  does not) */
    const char *chat_family;   /* detected renderer name, or NULL */
    char *chat_default_system; /* chatml: the template's default system message, or NULL */
    int chat_space_inst;       /* mixtral: ' [INST] ' form */
    int chat_bos;              /* olmoe: template starts with bos_token */
};

/* ---- unicode.c ----------------------------------------------------------------------- */

/* Length of the valid UTF-8 sequence at s[0..n), or 0 when s starts an invalid sequence
 * (maximal invalid subparts are then found by calling again one byte later). Decodes into
 * *cp when valid. */
size_t fmoe__utf8_decode(const unsigned char *s, size_t n, uint32_t *cp);
/* Length of the maximal invalid subsequence at s (>= 1) per Unicode's "maximal subpart"
 * practice (what Rust's from_utf8_lossy replaces with one U+FFFD). */
size_t fmoe__utf8_invalid_len(const unsigned char *s, size_t n);
size_t fmoe__utf8_encode(uint32_t cp, char out[4]);
/* Appends NFC (compose = 1) or NFD (compose = 0) of valid UTF-8 s to out. */
int fmoe__unicode_normalize(const char *s, size_t n, int compose, tok_buf *out);
/* 1 when cp is Unicode White_Space (Rust's char::is_whitespace). */
int fmoe__unicode_is_space(uint32_t cp);
/* Appends s with invalid sequences replaced by U+FFFD (Rust's from_utf8_lossy). */
int fmoe__utf8_lossy(const char *s, size_t n, tok_buf *out);

/* ---- encode.c / decode.c ---------------------------------------------------------------- */

/* Compiles a tokenizer.json regex for PCRE2 (rewriting \s \S \w \W \d as Oniguruma means
 * them); literal = 1 for String patterns. @return NULL with the error in *err (static or
 * written into errbuf). */
pcre2_code *fmoe__tok_regex_compile(const char *pattern, size_t len, int literal, char *errbuf,
                                    size_t errcap);
/* Normalizes s through the normalizer steps into out (appends). */
int fmoe__tok_normalize(const fmoe_tokenizer *tok, const char *s, size_t n, tok_buf *out);
/* Fills entries[].piece_* (needs decoder steps and byte tables). */
int fmoe__tok_build_pieces(fmoe_tokenizer *tok);

/* ---- chat.c ----------------------------------------------------------------------------- */

/* Sets chat_family & co. from chat_template_text or the added tokens, and chat_refused when
 * the interpreter cannot parse the template. */
void fmoe__tok_chat_detect(fmoe_tokenizer *tok);

/* ---- chat_jinja.c ----------------------------------------------------------------------- */

/* The template text a render uses: "tool_use" when there are tools and the model has one. */
const char *fmoe__chat_template_for(const fmoe_tokenizer *tok, const fmoe_chat_options *o);
/* Renders `tmpl` with transformers' variables for these messages and options. */
int fmoe__chat_render_jinja(const fmoe_tokenizer *tok, const char *tmpl,
                            const fmoe_chat_message *msgs, size_t n, const fmoe_chat_options *o,
                            char **text, size_t *len);

#endif
