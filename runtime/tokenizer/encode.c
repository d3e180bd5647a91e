/*
 * encode.c - text -> token ids, following HuggingFace tokenizers' pipeline:
 *
 *   1. added tokens that match the raw text (normalized == false) are cut out,
 *      leftmost-longest, with single_word / lstrip / rstrip applied;
 *   2. each remaining segment is normalized, then cut again by the added tokens that match
 *      normalized text (normalized == true);
 *   3. the pre-tokenizer steps split the text pieces further (regexes through PCRE2);
 *   4. the BPE model turns every piece into ids: one symbol per character (per byte for
 *      byte-level models, whose vocabulary is spelled in GPT-2's byte alphabet), unknown
 *      characters through byte fallback or the unk token, then merges applied lowest rank
 *      first with a binary heap, exactly as tokenizers' Word::merge_all (ties: leftmost);
 *   5. with add_special, the post-processor's special tokens go around the ids.
 *
 * Cost: O(n log n) in the piece length for merging (a piece of a million characters -
 * Mixtral has no pre-tokenizer - is fine); all scratch memory is owned by one call, so
 * concurrent calls on one tokenizer share nothing mutable.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "tokenizer_impl.h"

#define OOM() fmoe_error_set(FMOE_ENOMEM, "tokenizer: out of memory")

/* ---- regex compilation with Oniguruma's classes ------------------------------------------- */

/* Oniguruma (HuggingFace's regex engine) gives \s the code points 9-13, U+0085 and the Z
 * categories; PCRE2's UCP \s also takes U+180E. \w is letters, marks, decimal digits and
 * connector punctuation. The rewrite keeps everything else verbatim. */
#define ONIG_SPACE "\\t-\\r\\x{85}\\p{Z}"
#define ONIG_WORD "\\p{L}\\p{M}\\p{Nd}\\p{Pc}"

pcre2_code *fmoe__tok_regex_compile(const char *pattern, size_t len, int literal, char *errbuf,
                                    size_t errcap) {
    tok_buf b = {0};
    int in_class = 0, ok = 1;
    if (literal) {
        ok = fmoe__tok_buf_append(&b, pattern, len) == 0;
    } else {
        for (size_t i = 0; i < len && ok; i++) {
            char ch = pattern[i];
            if (ch == '\\' && i + 1 < len) {
                char e = pattern[++i];
                const char *rep = NULL;
                if (e == 's') rep = in_class ? ONIG_SPACE : "[" ONIG_SPACE "]";
                else if (e == 'S' && !in_class) rep = "[^" ONIG_SPACE "]";
                else if (e == 'w') rep = in_class ? ONIG_WORD : "[" ONIG_WORD "]";
                else if (e == 'W' && !in_class) rep = "[^" ONIG_WORD "]";
                if (rep) {
                    ok = fmoe__tok_buf_append(&b, rep, strlen(rep)) == 0;
                } else {
                    char two[2] = {ch, e};
                    ok = fmoe__tok_buf_append(&b, two, 2) == 0;
                }
                continue;
            }
            if (!in_class && ch == '[') {
                in_class = 1;
                ok = fmoe__tok_buf_append(&b, &ch, 1) == 0;
                /* a ']' right after '[' or '[^' is a literal */
                if (i + 1 < len && pattern[i + 1] == '^') ok = ok && fmoe__tok_buf_append(&b, &pattern[++i], 1) == 0;
                if (i + 1 < len && pattern[i + 1] == ']') ok = ok && fmoe__tok_buf_append(&b, &pattern[++i], 1) == 0;
                continue;
            }
            if (in_class && ch == '[' && i + 1 < len && pattern[i + 1] == ':') {
                const char *end = strstr(pattern + i + 2, ":]");
                if (end && (size_t)(end - pattern) < len) { /* POSIX class, copied as is */
                    size_t k = (size_t)(end - pattern) + 2 - i;
                    ok = fmoe__tok_buf_append(&b, pattern + i, k) == 0;
                    i += k - 1;
                    continue;
                }
            }
            if (in_class && ch == ']') in_class = 0;
            ok = fmoe__tok_buf_append(&b, &ch, 1) == 0;
        }
    }
    if (!ok || !b.p) {
        fmoe__tok_buf_free(&b);
        snprintf(errbuf, errcap, "out of memory");
        return NULL;
    }
    int err;
    PCRE2_SIZE erroff;
    uint32_t opts = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)b.p, b.len, opts, &err, &erroff, NULL);
    if (!re) {
        char msg[160];
        pcre2_get_error_message(err, (PCRE2_UCHAR *)msg, sizeof msg);
        snprintf(errbuf, errcap, "%s at offset %zu", msg, (size_t)erroff);
    } else {
        pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* the interpreter runs it otherwise */
    }
    fmoe__tok_buf_free(&b);
    return re;
}

/* ---- per-call state ------------------------------------------------------------------------ */

enum { PIECE_TEXT = 0, PIECE_TOKEN = 1, PIECE_RAW = 2 };

typedef struct piece {
    size_t off, len; /* bytes in st->arena */
    int32_t id;      /* PIECE_TOKEN */
    uint8_t kind;
    uint8_t first;   /* starts at offset 0 of the input (Metaspace prepend_scheme "first") */
} piece;

typedef struct piece_vec {
    piece *v;
    size_t len, cap;
} piece_vec;

typedef struct span {
    size_t start, end;
    int32_t id; /* added-token id, or -1 for text; for regex splits: 1 match, 0 not */
} span;

typedef struct span_vec {
    span *v;
    size_t len, cap;
} span_vec;

typedef struct bpe_sym {
    int32_t id;
    int32_t prev, next; /* -1: none */
    uint32_t len;       /* bytes; 0: merged away */
} bpe_sym;

typedef struct bpe_ent {
    uint32_t rank;
    uint32_t pos;
    int32_t new_id;
} bpe_ent;

typedef struct enc_state {
    const fmoe_tokenizer *tok;
    tok_buf arena;     /* text of all pieces */
    piece_vec pa, pb;  /* piece lists (pre-tokenizer steps go from one to the other) */
    span_vec spans, spans2;
    pcre2_match_data *md;
    bpe_sym *syms;
    size_t syms_cap;
    bpe_ent *heap;
    size_t heap_cap;
    tok_buf tmp;
    int32_t *ids;
    size_t n_ids, cap_ids;
} enc_state;

static int piece_push(piece_vec *p, piece x) {
    if (p->len == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 64;
        piece *v = realloc(p->v, cap * sizeof *v);
        if (!v) return OOM();
        p->v = v;
        p->cap = cap;
    }
    p->v[p->len++] = x;
    return 0;
}

static int span_push(span_vec *s, size_t start, size_t end, int32_t id) {
    if (s->len == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 64;
        span *v = realloc(s->v, cap * sizeof *v);
        if (!v) return OOM();
        s->v = v;
        s->cap = cap;
    }
    s->v[s->len++] = (span){start, end, id};
    return 0;
}

static int emit(enc_state *st, int32_t id) {
    if (st->n_ids == st->cap_ids) {
        size_t cap = st->cap_ids ? st->cap_ids * 2 : 256;
        int32_t *v = realloc(st->ids, cap * sizeof *v);
        if (!v) return OOM();
        st->ids = v;
        st->cap_ids = cap;
    }
    st->ids[st->n_ids++] = id;
    return 0;
}

static void enc_state_free(enc_state *st) {
    fmoe__tok_buf_free(&st->arena);
    fmoe__tok_buf_free(&st->tmp);
    free(st->pa.v);
    free(st->pb.v);
    free(st->spans.v);
    free(st->spans2.v);
    pcre2_match_data_free(st->md);
    free(st->syms);
    free(st->heap);
    free(st->ids);
}

/* ---- regex matching ------------------------------------------------------------------------- */

/* All matches of re in s[0..n) as spans with id 1 (matches) and 0 (text between), covering
 * s, like tokenizers' find_matches (empty matches included; they split the text). */
static int regex_spans(enc_state *st, const pcre2_code *re, const char *s, size_t n,
                       span_vec *out) {
    out->len = 0;
    if (n == 0) return span_push(out, 0, 0, 0);
    size_t pos = 0, prev = 0;
    while (pos <= n) {
        int rc = pcre2_match(re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, st->md, NULL);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
            rc = pcre2_match(re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, st->md,
                             NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            char msg[160];
            pcre2_get_error_message(rc, (PCRE2_UCHAR *)msg, sizeof msg);
            return fmoe_error_set(FMOE_EINTERNAL, "tokenizer: regex match failed: %s", msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(st->md);
        size_t ms = ov[0], me = ov[1];
        if (prev != ms) FMOE_FORWARD_IF_ERROR(span_push(out, prev, ms, 0));
        FMOE_FORWARD_IF_ERROR(span_push(out, ms, me, 1));
        prev = me;
        if (me == ms) { /* empty match: step one character */
            if (me >= n) break;
            size_t k = 1;
            while (me + k < n && ((unsigned char)s[me + k] & 0xC0) == 0x80) k++;
            pos = me + k;
        } else {
            pos = me;
        }
    }
    if (prev != n) FMOE_FORWARD_IF_ERROR(span_push(out, prev, n, 0));
    return 0;
}

/* tokenizers' SplitDelimiterBehavior over spans (id: 1 match, 0 not); the result's spans are
 * the pieces to keep. */
static int apply_behavior(span_vec *in, span_vec *out, tok_split_behavior b, int invert) {
    out->len = 0;
    int prev_match = 0;
    if (invert)
        for (size_t i = 0; i < in->len; i++) in->v[i].id = !in->v[i].id;
    switch (b) {
    case TOK_SPLIT_ISOLATED:
        for (size_t i = 0; i < in->len; i++)
            FMOE_FORWARD_IF_ERROR(span_push(out, in->v[i].start, in->v[i].end, 0));
        break;
    case TOK_SPLIT_REMOVED:
        for (size_t i = 0; i < in->len; i++)
            if (!in->v[i].id) FMOE_FORWARD_IF_ERROR(span_push(out, in->v[i].start, in->v[i].end, 0));
        break;
    case TOK_SPLIT_MERGED_WITH_PREVIOUS:
        for (size_t i = 0; i < in->len; i++) {
            span x = in->v[i];
            if (x.id && !prev_match && out->len) out->v[out->len - 1].end = x.end;
            else FMOE_FORWARD_IF_ERROR(span_push(out, x.start, x.end, 0));
            prev_match = x.id;
        }
        break;
    case TOK_SPLIT_MERGED_WITH_NEXT:
        for (size_t i = in->len; i-- > 0;) {
            span x = in->v[i];
            if (x.id && !prev_match && out->len) out->v[out->len - 1].start = x.start;
            else FMOE_FORWARD_IF_ERROR(span_push(out, x.start, x.end, 0));
            prev_match = x.id;
        }
        for (size_t i = 0, j = out->len ? out->len - 1 : 0; i < j; i++, j--) {
            span t = out->v[i];
            out->v[i] = out->v[j];
            out->v[j] = t;
        }
        break;
    case TOK_SPLIT_CONTIGUOUS:
        for (size_t i = 0; i < in->len; i++) {
            span x = in->v[i];
            if (x.id == prev_match && out->len) out->v[out->len - 1].end = x.end;
            else FMOE_FORWARD_IF_ERROR(span_push(out, x.start, x.end, 0));
            prev_match = x.id;
        }
        break;
    }
    return 0;
}

/* ---- normalizers ---------------------------------------------------------------------------- */

static int replace_all(const tok_norm_step *s, const char *src, size_t n, tok_buf *out,
                       pcre2_match_data *md) {
    if (!s->re) {
        size_t i = 0, run = 0;
        while (i + s->a_len <= n) {
            if (memcmp(src + i, s->a, s->a_len) == 0) {
                FMOE_FORWARD_IF_ERROR(fmoe__tok_buf_append(out, src + run, i - run));
                FMOE_FORWARD_IF_ERROR(fmoe__tok_buf_append(out, s->b, s->b_len));
                i += s->a_len;
                run = i;
            } else {
                i++;
            }
        }
        return fmoe__tok_buf_append(out, src + run, n - run);
    }
    size_t pos = 0, run = 0;
    while (pos <= n) {
        int rc = pcre2_match(s->re, (PCRE2_SPTR)src, n, pos, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) return fmoe_error_set(FMOE_EINTERNAL, "tokenizer: Replace regex failed (%d)", rc);
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        FMOE_FORWARD_IF_ERROR(fmoe__tok_buf_append(out, src + run, ov[0] - run));
        FMOE_FORWARD_IF_ERROR(fmoe__tok_buf_append(out, s->b, s->b_len));
        run = ov[1];
        if (ov[1] == ov[0]) {
            if (ov[1] >= n) break;
            size_t k = 1;
            while (ov[1] + k < n && ((unsigned char)src[ov[1] + k] & 0xC0) == 0x80) k++;
            FMOE_FORWARD_IF_ERROR(fmoe__tok_buf_append(out, src + run, k));
            run = pos = ov[1] + k;
        } else {
            pos = ov[1];
        }
    }
    return fmoe__tok_buf_append(out, src + run, n > run ? n - run : 0);
}

static int strip_ws(const char *s, size_t n, int left, int right, tok_buf *out) {
    const unsigned char *u = (const unsigned char *)s;
    size_t a = 0, b = n;
    uint32_t cp;
    if (left)
        while (a < b) {
            size_t k = fmoe__utf8_decode(u + a, b - a, &cp);
            if (!k || !fmoe__unicode_is_space(cp)) break;
            a += k;
        }
    if (right)
        while (b > a) {
            size_t st = b - 1;
            while (st > a && (u[st] & 0xC0) == 0x80) st--;
            size_t k = fmoe__utf8_decode(u + st, b - st, &cp);
            if (!k || !fmoe__unicode_is_space(cp)) break;
            b = st;
        }
    return fmoe__tok_buf_append(out, s + a, b - a);
}

int fmoe__tok_normalize(const fmoe_tokenizer *tok, const char *s, size_t n, tok_buf *out) {
    if (tok->n_norm == 0) return fmoe__tok_buf_append(out, s, n);
    tok_buf x = {0}, y = {0};
    pcre2_match_data *md = NULL;
    int rc = fmoe__tok_buf_append(&x, s, n);
    for (int i = 0; i < tok->n_norm && rc == 0; i++) {
        const tok_norm_step *st = &tok->norm[i];
        y.len = 0;
        switch (st->kind) {
        case TOK_NORM_NFC:
        case TOK_NORM_NFD:
            rc = fmoe__unicode_normalize(x.p, x.len, st->kind == TOK_NORM_NFC, &y);
            break;
        case TOK_NORM_PREPEND:
            if (x.len) rc = fmoe__tok_buf_append(&y, st->a, st->a_len);
            if (rc == 0) rc = fmoe__tok_buf_append(&y, x.p, x.len);
            break;
        case TOK_NORM_REPLACE:
            if (st->re && !md && !(md = pcre2_match_data_create(1, NULL))) rc = OOM();
            if (rc == 0) rc = replace_all(st, x.p, x.len, &y, md);
            break;
        case TOK_NORM_STRIP:
            rc = strip_ws(x.p, x.len, st->left, st->right, &y);
            break;
        }
        tok_buf t = x;
        x = y;
        y = t;
    }
    if (rc == 0) rc = fmoe__tok_buf_append(out, x.p, x.len);
    fmoe__tok_buf_free(&x);
    fmoe__tok_buf_free(&y);
    pcre2_match_data_free(md);
    return rc;
}

/* ---- added tokens ---------------------------------------------------------------------------- */

static int is_word_char(const fmoe_tokenizer *tok, enc_state *st, const char *s, size_t k) {
    int rc = pcre2_match(tok->word_re, (PCRE2_SPTR)s, k, 0, PCRE2_NO_UTF_CHECK | PCRE2_ANCHORED,
                         st->md, NULL);
    return rc >= 0;
}

/* Last code point of s[0..n) as (start offset, length). */
static size_t last_char(const char *s, size_t n, size_t *start) {
    size_t i = n - 1;
    while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80) i--;
    *start = i;
    return n - i;
}

/* Cuts s[0..n) at the added tokens of matcher m: spans with id >= 0 are tokens, -1 text. */
static int added_spans(enc_state *st, const tok_matcher *m, const char *s, size_t n,
                       span_vec *out) {
    const fmoe_tokenizer *tok = st->tok;
    const unsigned char *u = (const unsigned char *)s;
    out->len = 0;
    size_t pos = 0, done = 0; /* search position; end of what has been emitted */
    while (m->n && pos < n) {
        /* leftmost position with a match, longest pattern there */
        const tok_added *hit = NULL;
        size_t start = pos;
        for (; start < n; start++) {
            uint32_t a = m->first[u[start]], b = m->first[u[start] + 1];
            for (uint32_t k = a; k < b && !hit; k++) {
                const tok_added *t = &tok->added[m->order[k]];
                if (t->pattern_len <= n - start && memcmp(s + start, t->pattern, t->pattern_len) == 0)
                    hit = t;
            }
            if (hit) break;
        }
        if (!hit) break;
        size_t stop = start + hit->pattern_len;
        pos = stop; /* the automaton goes on after the match, whatever happens to it */
        if (hit->single_word) {
            int start_space = 1;
            if (start > 0) {
                size_t cs;
                last_char(s, start, &cs);
                start_space = !is_word_char(tok, st, s + cs, start - cs);
            }
            int stop_space = 1;
            if (stop < n) {
                uint32_t cp;
                size_t k = fmoe__utf8_decode(u + stop, n - stop, &cp);
                stop_space = !(k && is_word_char(tok, st, s + stop, k));
            }
            if (!start_space || !stop_space) continue;
        }
        if (hit->lstrip) { /* whitespace before, but not what an earlier match took */
            size_t ns = start;
            while (ns > 0) {
                size_t cs, k = last_char(s, ns, &cs);
                uint32_t cp;
                if (fmoe__utf8_decode(u + cs, k, &cp) != k || !fmoe__unicode_is_space(cp)) break;
                ns = cs;
            }
            start = ns > done ? ns : done;
        }
        if (hit->rstrip) {
            uint32_t cp;
            size_t k;
            while (stop < n && (k = fmoe__utf8_decode(u + stop, n - stop, &cp)) &&
                   fmoe__unicode_is_space(cp))
                stop += k;
        }
        /* As in tokenizers, a match that starts inside whitespace an rstrip took still
         * counts (its span overlaps the previous one). */
        if (done < start) FMOE_FORWARD_IF_ERROR(span_push(out, done, start, -1));
        FMOE_FORWARD_IF_ERROR(span_push(out, start, stop, hit->id));
        done = stop;
    }
    if (done < n || out->len == 0) FMOE_FORWARD_IF_ERROR(span_push(out, done, n, -1));
    return 0;
}

/* A valid-UTF-8 stretch of a text segment: normalize, cut at normalized added tokens. */
static int add_valid_text(enc_state *st, const char *s, size_t n, int first) {
    const fmoe_tokenizer *tok = st->tok;
    size_t off = st->arena.len;
    FMOE_FORWARD_IF_ERROR(fmoe__tok_normalize(tok, s, n, &st->arena));
    size_t len = st->arena.len - off;
    if (len == 0) return 0;
    if (tok->match_norm.n == 0)
        return piece_push(&st->pa, (piece){off, len, -1, PIECE_TEXT, (uint8_t)first});
    FMOE_FORWARD_IF_ERROR(added_spans(st, &tok->match_norm, st->arena.p + off, len, &st->spans2));
    for (size_t i = 0; i < st->spans2.len; i++) {
        span x = st->spans2.v[i];
        if (x.end == x.start) continue;
        piece p = {off + x.start, x.end - x.start, x.id, x.id >= 0 ? PIECE_TOKEN : PIECE_TEXT,
                   (uint8_t)(first && x.start == 0)};
        FMOE_FORWARD_IF_ERROR(piece_push(&st->pa, p));
    }
    return 0;
}

/* A text segment between raw added tokens: valid stretches and invalid byte runs. */
static int add_text_segment(enc_state *st, const char *s, size_t n, int first) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        size_t j = i;
        uint32_t cp;
        size_t k;
        while (j < n && (k = fmoe__utf8_decode(u + j, n - j, &cp)) > 0) j += k;
        if (j > i) FMOE_FORWARD_IF_ERROR(add_valid_text(st, s + i, j - i, first && i == 0));
        if (j == n) break;
        size_t e = j;
        while (e < n && fmoe__utf8_decode(u + e, n - e, &cp) == 0)
            e += fmoe__utf8_invalid_len(u + e, n - e);
        size_t off = st->arena.len;
        FMOE_FORWARD_IF_ERROR(fmoe__tok_buf_append(&st->arena, s + j, e - j));
        FMOE_FORWARD_IF_ERROR(
            piece_push(&st->pa, (piece){off, e - j, -1, PIECE_RAW, (uint8_t)(first && j == 0)}));
        i = e;
    }
    return 0;
}

/* ---- pre-tokenizers --------------------------------------------------------------------------- */

static int split_pieces(enc_state *st, const pcre2_code *re, tok_split_behavior b, int invert) {
    st->pb.len = 0;
    for (size_t i = 0; i < st->pa.len; i++) {
        piece p = st->pa.v[i];
        if (p.kind != PIECE_TEXT) {
            FMOE_FORWARD_IF_ERROR(piece_push(&st->pb, p));
            continue;
        }
        FMOE_FORWARD_IF_ERROR(regex_spans(st, re, st->arena.p + p.off, p.len, &st->spans));
        FMOE_FORWARD_IF_ERROR(apply_behavior(&st->spans, &st->spans2, b, invert));
        for (size_t k = 0; k < st->spans2.len; k++) {
            span x = st->spans2.v[k];
            if (x.end == x.start) continue;
            FMOE_FORWARD_IF_ERROR(piece_push(
                &st->pb, (piece){p.off + x.start, x.end - x.start, -1, PIECE_TEXT,
                                 (uint8_t)(p.first && x.start == 0)}));
        }
    }
    piece_vec t = st->pa;
    st->pa = st->pb;
    st->pb = t;
    return 0;
}

static int pre_bytelevel(enc_state *st, const tok_pre_step *s) {
    if (s->add_prefix_space) {
        for (size_t i = 0; i < st->pa.len; i++) {
            piece *p = &st->pa.v[i];
            if (p->kind != PIECE_TEXT || st->arena.p[p->off] == ' ') continue;
            size_t off = st->arena.len;
            FMOE_FORWARD_IF_ERROR(fmoe__tok_buf_reserve(&st->arena, p->len + 1));
            st->arena.p[st->arena.len++] = ' ';
            memcpy(st->arena.p + st->arena.len, st->arena.p + p->off, p->len);
            st->arena.len += p->len;
            p->off = off;
            p->len += 1;
        }
    }
    if (s->re) return split_pieces(st, s->re, TOK_SPLIT_ISOLATED, 0);
    return 0;
}

static int pre_metaspace(enc_state *st, const tok_pre_step *s) {
    const char *rep = s->replacement;
    size_t rl = s->replacement_len;
    st->pb.len = 0;
    for (size_t i = 0; i < st->pa.len; i++) {
        piece p = st->pa.v[i];
        if (p.kind != PIECE_TEXT) {
            FMOE_FORWARD_IF_ERROR(piece_push(&st->pb, p));
            continue;
        }
        /* ' ' -> replacement, then the prefix */
        size_t spaces = 0;
        for (size_t k = 0; k < p.len; k++) spaces += st->arena.p[p.off + k] == ' ';
        FMOE_FORWARD_IF_ERROR(fmoe__tok_buf_reserve(&st->arena, p.len + spaces * rl + rl));
        size_t off = st->arena.len;
        char *w = st->arena.p + off;
        const char *r = st->arena.p + p.off;
        int starts = (p.len >= rl && memcmp(r, rep, rl) == 0) || (p.len && r[0] == ' ');
        if (!starts && (s->prepend == TOK_PREPEND_ALWAYS ||
                        (s->prepend == TOK_PREPEND_FIRST && p.first))) {
            memcpy(w, rep, rl);
            w += rl;
        }
        for (size_t k = 0; k < p.len; k++) {
            if (r[k] == ' ') {
                memcpy(w, rep, rl);
                w += rl;
            } else {
                *w++ = r[k];
            }
        }
        size_t len = (size_t)(w - (st->arena.p + off));
        st->arena.len += len;
        if (!s->split) {
            FMOE_FORWARD_IF_ERROR(piece_push(&st->pb, (piece){off, len, -1, PIECE_TEXT, p.first}));
            continue;
        }
        /* split on each replacement char, merged with the next piece */
        st->spans.len = 0;
        size_t prev = 0;
        const char *t = st->arena.p + off;
        for (size_t k = 0; k + rl <= len;) {
            if (memcmp(t + k, rep, rl) == 0) {
                if (prev != k) FMOE_FORWARD_IF_ERROR(span_push(&st->spans, prev, k, 0));
                FMOE_FORWARD_IF_ERROR(span_push(&st->spans, k, k + rl, 1));
                k += rl;
                prev = k;
            } else {
                k++;
            }
        }
        if (prev != len) FMOE_FORWARD_IF_ERROR(span_push(&st->spans, prev, len, 0));
        FMOE_FORWARD_IF_ERROR(apply_behavior(&st->spans, &st->spans2, TOK_SPLIT_MERGED_WITH_NEXT, 0));
        for (size_t k = 0; k < st->spans2.len; k++) {
            span x = st->spans2.v[k];
            if (x.end == x.start) continue;
            FMOE_FORWARD_IF_ERROR(piece_push(
                &st->pb, (piece){off + x.start, x.end - x.start, -1, PIECE_TEXT,
                                 (uint8_t)(p.first && x.start == 0)}));
        }
    }
    piece_vec t = st->pa;
    st->pa = st->pb;
    st->pb = t;
    return 0;
}

/* ---- the BPE model ---------------------------------------------------------------------------- */

static inline int ent_less(const bpe_ent *a, const bpe_ent *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(bpe_ent *h, size_t *n, bpe_ent e) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!ent_less(&e, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = e;
}

static bpe_ent heap_pop(bpe_ent *h, size_t *n) {
    bpe_ent top = h[0], last = h[--*n];
    size_t i = 0, m = *n;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, s = i;
        const bpe_ent *best = &last;
        if (l < m && ent_less(&h[l], best)) {
            s = l;
            best = &h[l];
        }
        if (r < m && ent_less(&h[r], best)) s = r;
        if (s == i) break;
        h[i] = h[s];
        i = s;
    }
    if (m) h[i] = last;
    return top;
}

static int syms_reserve(enc_state *st, size_t n) {
    if (n <= st->syms_cap) return 0;
    size_t cap = st->syms_cap ? st->syms_cap : 64;
    while (cap < n) cap *= 2;
    bpe_sym *s = realloc(st->syms, cap * sizeof *s);
    if (!s) return OOM();
    st->syms = s;
    st->syms_cap = cap;
    /* each merge pushes at most two entries: 3n bounds the heap */
    bpe_ent *h = realloc(st->heap, 3 * cap * sizeof *h);
    if (!h) return OOM();
    st->heap = h;
    st->heap_cap = 3 * cap;
    return 0;
}

static void sym_add(enc_state *st, size_t *n, int32_t id, uint32_t len) {
    bpe_sym *s = &st->syms[*n];
    s->id = id;
    s->len = len;
    s->prev = *n ? (int32_t)*n - 1 : -1;
    s->next = -1;
    if (*n) st->syms[*n - 1].next = (int32_t)*n;
    (*n)++;
}

/* Word::merge_all of tokenizers: lowest rank first, leftmost among equals; stale heap entries
 * are recognised by the pair no longer producing the same merged id. */
static void bpe_merge_all(enc_state *st, size_t n) {
    const tok_mergemap *mm = &st->tok->merges;
    bpe_sym *sy = st->syms;
    bpe_ent *h = st->heap;
    size_t hn = 0;
    for (size_t i = 0; i + 1 < n; i++) {
        const tok_merge_slot *m = fmoe__tok_mergemap_get(mm, sy[i].id, sy[i + 1].id);
        if (m) heap_push(h, &hn, (bpe_ent){m->rank, (uint32_t)i, m->new_id});
    }
    while (hn) {
        bpe_ent top = heap_pop(h, &hn);
        bpe_sym *cur = &sy[top.pos];
        if (cur->len == 0 || cur->next < 0) continue;
        bpe_sym *right = &sy[cur->next];
        const tok_merge_slot *m = fmoe__tok_mergemap_get(mm, cur->id, right->id);
        if (!m || m->new_id != top.new_id) continue;
        cur->id = top.new_id;
        cur->len += right->len;
        right->len = 0;
        cur->next = right->next;
        if (cur->next >= 0) sy[cur->next].prev = (int32_t)top.pos;
        if (cur->prev >= 0) {
            const tok_merge_slot *p = fmoe__tok_mergemap_get(mm, sy[cur->prev].id, cur->id);
            if (p) heap_push(h, &hn, (bpe_ent){p->rank, (uint32_t)cur->prev, p->new_id});
        }
        if (cur->next >= 0) {
            const tok_merge_slot *p = fmoe__tok_mergemap_get(mm, cur->id, sy[cur->next].id);
            if (p) heap_push(h, &hn, (bpe_ent){p->rank, top.pos, p->new_id});
        }
    }
}

/* One character (or one byte) without a vocabulary entry: tokenizers' unk handling. */
typedef struct unk_state {
    int pending;
    uint32_t len;
} unk_state;

static void unk_char(enc_state *st, size_t *n, unk_state *u, uint32_t len) {
    const fmoe_tokenizer *tok = st->tok;
    if (tok->unk_id < 0) return; /* no unk token: the character is dropped */
    if (u->pending && tok->fuse_unk) {
        u->len += len;
        return;
    }
    if (u->pending) sym_add(st, n, tok->unk_id, u->len);
    u->pending = 1;
    u->len = len;
}

static void unk_flush(enc_state *st, size_t *n, unk_state *u) {
    if (u->pending) sym_add(st, n, st->tok->unk_id, u->len);
    u->pending = 0;
}

/* One word (a piece, or a part of one) through the model. `raw`: invalid UTF-8 bytes. */
static int model_word(enc_state *st, const char *s, size_t len, int raw) {
    const fmoe_tokenizer *tok = st->tok;
    const unsigned char *u = (const unsigned char *)s;
    size_t n = 0;
    unk_state unk = {0, 0};
    int bytes = tok->byte_level || raw;

    if (tok->ignore_merges) { /* the whole piece as one token when it is in the vocabulary */
        int32_t id;
        if (tok->byte_level) {
            st->tmp.len = 0;
            FMOE_FORWARD_IF_ERROR(fmoe__tok_buf_reserve(&st->tmp, len * 2));
            for (size_t i = 0; i < len; i++) {
                int32_t bid = tok->byte_ids[u[i]];
                const char *bs = bid >= 0 ? tok->strings + tok->entries[bid].str_off : NULL;
                if (!bs) {
                    st->tmp.len = 0;
                    break;
                }
                size_t bl = tok->entries[bid].str_len;
                memcpy(st->tmp.p + st->tmp.len, bs, bl);
                st->tmp.len += bl;
            }
            id = st->tmp.len ? fmoe__tok_strmap_get(&tok->vocab, st->tmp.p, st->tmp.len) : -1;
        } else {
            id = !raw ? fmoe__tok_strmap_get(&tok->vocab, s, len) : -1;
        }
        if (id >= 0) return emit(st, id);
    }

    FMOE_FORWARD_IF_ERROR(syms_reserve(st, len + 1));
    if (bytes) {
        for (size_t i = 0; i < len; i++) {
            int32_t id = tok->byte_ids[u[i]];
            /* byte_ids holds byte-alphabet ids for byte-level models, <0xXX> ids for
             * byte-fallback ones; a RAW piece of a model with neither gets unk */
            if (id >= 0 && (tok->byte_level || tok->byte_fallback)) {
                if (tok->byte_level) unk_flush(st, &n, &unk);
                sym_add(st, &n, id, 1);
            } else {
                unk_char(st, &n, &unk, 1);
            }
        }
    } else {
        for (size_t i = 0; i < len;) {
            uint32_t cp;
            size_t k = fmoe__utf8_decode(u + i, len - i, &cp);
            if (!k) k = 1; /* cannot happen: TEXT pieces are valid UTF-8 */
            int32_t id = fmoe__tok_strmap_get(&tok->vocab, s + i, k);
            if (id >= 0) {
                unk_flush(st, &n, &unk);
                sym_add(st, &n, id, (uint32_t)k);
            } else {
                int all = tok->byte_fallback;
                for (size_t b = 0; all && b < k; b++) all = tok->byte_ids[u[i + b]] >= 0;
                if (all) { /* like tokenizers, a pending unk is not flushed first */
                    for (size_t b = 0; b < k; b++) sym_add(st, &n, tok->byte_ids[u[i + b]], 1);
                } else {
                    unk_char(st, &n, &unk, (uint32_t)k);
                }
            }
            i += k;
        }
    }
    unk_flush(st, &n, &unk);
    if (n > 1) bpe_merge_all(st, n);
    for (int32_t i = n ? 0 : -1; i >= 0; i = st->syms[i].next)
        FMOE_FORWARD_IF_ERROR(emit(st, st->syms[i].id));
    return 0;
}

/* A piece through the model. Without a pre-tokenizer (Mixtral) a piece is a whole text
 * segment; when no merge joins a character to a following "▁" (checked at load), cutting
 * before each such "▁" changes nothing and keeps the merge heap small. */
static int model_piece(enc_state *st, const piece *p) {
    const fmoe_tokenizer *tok = st->tok;
    const char *s = st->arena.p + p->off;
    if (p->kind == PIECE_RAW || tok->byte_level || tok->ignore_merges || !tok->split_metaspace)
        return model_word(st, s, p->len, p->kind == PIECE_RAW);
    static const char MS[] = "\xE2\x96\x81";
    size_t start = 0;
    for (size_t i = 1; i + 3 <= p->len; i++) {
        if (memcmp(s + i, MS, 3) != 0) continue;
        if (i >= 3 && memcmp(s + i - 3, MS, 3) == 0) continue; /* inside a run of ▁ */
        FMOE_FORWARD_IF_ERROR(model_word(st, s + start, i - start, 0));
        start = i;
        i += 2;
    }
    return model_word(st, s + start, p->len - start, 0);
}

/* ---- encode --------------------------------------------------------------------------------- */

static int encode_all(enc_state *st, const char *text, size_t len, int add_special) {
    const fmoe_tokenizer *tok = st->tok;
    if (!(st->md = pcre2_match_data_create(1, NULL))) return OOM();
    if (add_special)
        for (size_t i = 0; i < tok->n_post_prefix; i++)
            FMOE_FORWARD_IF_ERROR(emit(st, tok->post_prefix[i]));
    if (len) {
        FMOE_FORWARD_IF_ERROR(added_spans(st, &tok->match_raw, text, len, &st->spans));
        /* added_spans reuses st->spans2 below: copy the raw spans out first */
        span_vec raw = st->spans;
        st->spans = (span_vec){0};
        int rc = 0;
        for (size_t i = 0; i < raw.len && rc == 0; i++) {
            span x = raw.v[i];
            if (x.id >= 0)
                rc = piece_push(&st->pa, (piece){0, 0, x.id, PIECE_TOKEN, 0});
            else if (x.end > x.start)
                rc = add_text_segment(st, text + x.start, x.end - x.start, x.start == 0);
        }
        free(raw.v);
        FMOE_FORWARD_IF_ERROR(rc);
    }
    for (int i = 0; i < tok->n_pre; i++) {
        const tok_pre_step *s = &tok->pre[i];
        switch (s->kind) {
        case TOK_PRE_SPLIT:
            FMOE_FORWARD_IF_ERROR(split_pieces(st, s->re, s->behavior, s->invert));
            break;
        case TOK_PRE_BYTELEVEL:
            FMOE_FORWARD_IF_ERROR(pre_bytelevel(st, s));
            break;
        case TOK_PRE_METASPACE:
            FMOE_FORWARD_IF_ERROR(pre_metaspace(st, s));
            break;
        }
    }
    for (size_t i = 0; i < st->pa.len; i++) {
        const piece *p = &st->pa.v[i];
        if (p->kind == PIECE_TOKEN) FMOE_FORWARD_IF_ERROR(emit(st, p->id));
        else if (p->len) FMOE_FORWARD_IF_ERROR(model_piece(st, p));
    }
    if (add_special)
        for (size_t i = 0; i < tok->n_post_suffix; i++)
            FMOE_FORWARD_IF_ERROR(emit(st, tok->post_suffix[i]));
    return 0;
}

int fmoe_tokenizer_encode_alloc(const fmoe_tokenizer *tok, const char *text, size_t len,
                                int add_special, int32_t **ids, size_t *n) {
    *ids = NULL;
    *n = 0;
    if (!tok || (!text && len)) return fmoe_error_set(FMOE_EINVAL, "tokenizer: encode: no text");
    enc_state st = {0};
    st.tok = tok;
    int rc = encode_all(&st, text ? text : "", len, add_special);
    if (rc == 0) {
        *ids = st.ids ? st.ids : malloc(sizeof(int32_t));
        *n = st.n_ids;
        st.ids = NULL;
        if (!*ids) rc = OOM();
    }
    enc_state_free(&st);
    return rc;
}

int64_t fmoe_tokenizer_encode(const fmoe_tokenizer *tok, const char *text, size_t len,
                              int add_special, int32_t *ids, size_t cap) {
    int32_t *all;
    size_t n;
    int rc = fmoe_tokenizer_encode_alloc(tok, text, len, add_special, &all, &n);
    if (rc < 0) return rc;
    if (ids) memcpy(ids, all, (n < cap ? n : cap) * sizeof *ids);
    free(all);
    return (int64_t)n;
}
