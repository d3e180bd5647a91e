/*
 * decode.c - ids -> text through the tokenizer.json decoder, as HuggingFace tokenizers'
 * decode does: the token strings go through each decoder's decode_chain in turn and are
 * joined (with a space when there is no decoder at all). Also the per-token pieces behind
 * fmoe_tokenizer_token_to_piece.
 */
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "tokenizer_impl.h"

#define OOM() fmoe_error_set(FMOE_ENOMEM, "tokenizer: out of memory")

/* A list of strings, each a span of one buffer. */
typedef struct str_list {
    tok_buf buf;
    size_t *off, *len;
    size_t n, cap;
} str_list;

static int list_push(str_list *l, const char *s, size_t n) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        size_t *o = realloc(l->off, cap * sizeof *o);
        if (!o) return OOM();
        l->off = o;
        size_t *k = realloc(l->len, cap * sizeof *k);
        if (!k) return OOM();
        l->len = k;
        l->cap = cap;
    }
    l->off[l->n] = l->buf.len;
    l->len[l->n] = n;
    l->n++;
    return fmoe__tok_buf_append(&l->buf, s, n);
}

/* Starts a new string at the end of the buffer; extend it with list_extend. */
static int list_open(str_list *l) { return list_push(l, "", 0); }

static int list_extend(str_list *l, const char *s, size_t n) {
    l->len[l->n - 1] += n;
    return fmoe__tok_buf_append(&l->buf, s, n);
}

static void list_free(str_list *l) {
    fmoe__tok_buf_free(&l->buf);
    free(l->off);
    free(l->len);
    memset(l, 0, sizeof *l);
}

static void list_reset(str_list *l) {
    l->buf.len = 0;
    l->n = 0;
}

/* ---- the byte alphabet's inverse ------------------------------------------------------------ */

/* Byte for a code point of GPT-2's alphabet, or -1. */
static int cp_to_byte(uint32_t cp) {
    if ((cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF))
        return (int)cp;
    if (cp < 256 || cp >= 256 + 68) return -1;
    uint32_t n = cp - 256;
    for (int b = 0; b < 256; b++) {
        if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF))
            continue;
        if (n-- == 0) return b;
    }
    return -1;
}

/* Appends the bytes a byte-level token stands for, or the token itself when one of its
 * characters is outside the alphabet (tokenizers' ByteLevel decoder). */
static int bytelevel_bytes(const char *s, size_t n, tok_buf *out) {
    const unsigned char *u = (const unsigned char *)s;
    size_t start = out->len;
    FMOE_FORWARD_IF_ERROR(fmoe__tok_buf_reserve(out, n));
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = fmoe__utf8_decode(u + i, n - i, &cp);
        int b = k ? cp_to_byte(cp) : -1;
        if (b < 0) {
            out->len = start;
            return fmoe__tok_buf_append(out, s, n);
        }
        out->p[out->len++] = (char)b;
        i += k;
    }
    out->p[out->len] = '\0';
    return 0;
}

/* "<0xXX>" -> the byte, as tokenizers' ByteFallback parses it (u8::from_str_radix). */
static int fallback_byte(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
    int v = 0, digits = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else if (c == '+' && i == 3) continue;
        else return -1;
        v = v * 16 + d;
        digits++;
    }
    return digits ? v : -1;
}

static int replace_into(const char *s, size_t n, const char *a, size_t al, const char *b,
                        size_t bl, str_list *out) {
    FMOE_FORWARD_IF_ERROR(list_open(out));
    size_t i = 0, run = 0;
    while (al && i + al <= n) {
        if (memcmp(s + i, a, al) == 0) {
            FMOE_FORWARD_IF_ERROR(list_extend(out, s + run, i - run));
            FMOE_FORWARD_IF_ERROR(list_extend(out, b, bl));
            i += al;
            run = i;
        } else {
            i++;
        }
    }
    return list_extend(out, s + run, n - run);
}

/* Code-point boundaries of s as offsets (n_cps + 1 of them). */
static size_t *cp_offsets(const char *s, size_t n, size_t *ncp) {
    size_t *o = malloc((n + 1) * sizeof *o);
    if (!o) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80) o[k++] = i;
    o[k] = n;
    *ncp = k;
    return o;
}

static int dec_step(const tok_dec_step *st, str_list *in, str_list *out) {
    list_reset(out);
    switch (st->kind) {
    case TOK_DEC_BYTELEVEL: {
        tok_buf raw = {0};
        int rc = 0;
        for (size_t i = 0; i < in->n && rc == 0; i++)
            rc = bytelevel_bytes(in->buf.p + in->off[i], in->len[i], &raw);
        if (rc == 0) rc = list_open(out);
        if (rc == 0) {
            size_t before = out->buf.len;
            rc = fmoe__utf8_lossy(raw.p ? raw.p : "", raw.len, &out->buf);
            out->len[out->n - 1] = out->buf.len - before;
        }
        fmoe__tok_buf_free(&raw);
        return rc;
    }
    case TOK_DEC_METASPACE:
        for (size_t i = 0; i < in->n; i++) {
            const char *s = in->buf.p + in->off[i];
            if (i == 0 && st->strip_first) {
                FMOE_FORWARD_IF_ERROR(replace_into(s, in->len[i], st->a, st->a_len, "", 0, out));
            } else {
                FMOE_FORWARD_IF_ERROR(replace_into(s, in->len[i], st->a, st->a_len, " ", 1, out));
            }
        }
        return 0;
    case TOK_DEC_REPLACE:
        for (size_t i = 0; i < in->n; i++)
            FMOE_FORWARD_IF_ERROR(replace_into(in->buf.p + in->off[i], in->len[i], st->a,
                                               st->a_len, st->b, st->b_len, out));
        return 0;
    case TOK_DEC_BYTEFALLBACK: {
        /* a run of <0xXX> tokens becomes its bytes when they are valid UTF-8, else one
         * U+FFFD per token */
        tok_buf run = {0};
        int rc = 0;
        for (size_t i = 0; i < in->n && rc == 0;) {
            if (fallback_byte(in->buf.p + in->off[i], in->len[i]) < 0) {
                rc = list_push(out, in->buf.p + in->off[i], in->len[i]);
                i++;
                continue;
            }
            run.len = 0;
            int b;
            for (; i < in->n && (b = fallback_byte(in->buf.p + in->off[i], in->len[i])) >= 0; i++) {
                char c = (char)b;
                if ((rc = fmoe__tok_buf_append(&run, &c, 1)) < 0) break;
            }
            if (rc < 0) break;
            int valid = 1;
            for (size_t k = 0; k < run.len && valid;) {
                uint32_t cp;
                size_t m = fmoe__utf8_decode((const unsigned char *)run.p + k, run.len - k, &cp);
                valid = m > 0;
                k += m;
            }
            if (valid) rc = list_push(out, run.p, run.len);
            else
                for (size_t k = 0; k < run.len && rc == 0; k++) rc = list_push(out, "\xEF\xBF\xBD", 3);
        }
        fmoe__tok_buf_free(&run);
        return rc;
    }
    case TOK_DEC_FUSE:
        FMOE_FORWARD_IF_ERROR(list_open(out));
        for (size_t i = 0; i < in->n; i++)
            FMOE_FORWARD_IF_ERROR(list_extend(out, in->buf.p + in->off[i], in->len[i]));
        return 0;
    case TOK_DEC_STRIP:
        for (size_t i = 0; i < in->n; i++) {
            const char *s = in->buf.p + in->off[i];
            size_t ncp;
            size_t *o = cp_offsets(s, in->len[i], &ncp);
            if (!o) return OOM();
            size_t a = 0, b = ncp;
            for (size_t k = 0; k < (size_t)st->start && k < ncp; k++) {
                if (o[k + 1] - o[k] == st->a_len && memcmp(s + o[k], st->a, st->a_len) == 0) a = k + 1;
                else break;
            }
            for (size_t k = 0; k < (size_t)st->stop && k < ncp; k++) {
                size_t idx = ncp - k - 1;
                if (o[idx + 1] - o[idx] == st->a_len && memcmp(s + o[idx], st->a, st->a_len) == 0)
                    b = idx;
                else
                    break;
            }
            if (b < a) b = a;
            int rc = list_push(out, s + o[a], o[b] - o[a]);
            free(o);
            FMOE_FORWARD_IF_ERROR(rc);
        }
        return 0;
    }
    return 0;
}

int fmoe_tokenizer_decode(const fmoe_tokenizer *tok, const int32_t *ids, size_t n,
                          int skip_special, char **text, size_t *len) {
    *text = NULL;
    if (len) *len = 0;
    if (!tok || (!ids && n)) return fmoe_error_set(FMOE_EINVAL, "tokenizer: decode: no ids");
    str_list a = {0}, b = {0};
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= tok->n_ids || tok->entries[id].str_off == UINT32_MAX) continue;
        if (skip_special && tok->entries[id].special) continue;
        rc = list_push(&a, tok->strings + tok->entries[id].str_off, tok->entries[id].str_len);
    }
    for (int s = 0; s < tok->n_dec && rc == 0; s++) {
        rc = dec_step(&tok->dec[s], &a, &b);
        str_list t = a;
        a = b;
        b = t;
    }
    tok_buf out = {0};
    for (size_t i = 0; i < a.n && rc == 0; i++) {
        if (i && !tok->has_decoder) rc = fmoe__tok_buf_append(&out, " ", 1);
        if (rc == 0) rc = fmoe__tok_buf_append(&out, a.buf.p + a.off[i], a.len[i]);
    }
    if (rc == 0 && !out.p) rc = fmoe__tok_buf_reserve(&out, 0);
    list_free(&a);
    list_free(&b);
    if (rc < 0) {
        fmoe__tok_buf_free(&out);
        return rc;
    }
    out.p[out.len] = '\0';
    *text = out.p;
    if (len) *len = out.len;
    return 0;
}

/* ---- token pieces ------------------------------------------------------------------------------ */

int fmoe__tok_build_pieces(fmoe_tokenizer *tok) {
    tok_buf arena = {0}, tmp = {0};
    int bytelevel = 0, fallback = 0;
    for (int s = 0; s < tok->n_dec; s++) {
        bytelevel |= tok->dec[s].kind == TOK_DEC_BYTELEVEL;
        fallback |= tok->dec[s].kind == TOK_DEC_BYTEFALLBACK;
    }
    int rc = 0;
    for (int32_t id = 0; id < tok->n_ids && rc == 0; id++) {
        tok_entry *e = &tok->entries[id];
        if (e->str_off == UINT32_MAX) continue;
        const char *s = tok->strings + e->str_off;
        size_t n = e->str_len;
        tmp.len = 0;
        /* added tokens too: tokenizers' decode sends them through the decoder as well */
        if (bytelevel) {
            rc = bytelevel_bytes(s, n, &tmp);
        } else if (fallback && fallback_byte(s, n) >= 0) {
            char c = (char)fallback_byte(s, n);
            rc = fmoe__tok_buf_append(&tmp, &c, 1);
        } else {
            rc = fmoe__tok_buf_append(&tmp, s, n);
            for (int k = 0; k < tok->n_dec && rc == 0; k++) {
                const tok_dec_step *st = &tok->dec[k];
                const char *a = NULL, *b = NULL;
                size_t al = 0, bl = 0;
                if (st->kind == TOK_DEC_REPLACE) {
                    a = st->a, al = st->a_len, b = st->b, bl = st->b_len;
                } else if (st->kind == TOK_DEC_METASPACE) {
                    a = st->a, al = st->a_len, b = " ", bl = 1;
                } else {
                    continue;
                }
                str_list one = {0};
                rc = replace_into(tmp.p, tmp.len, a, al, b, bl, &one);
                tmp.len = 0;
                if (rc == 0) rc = fmoe__tok_buf_append(&tmp, one.buf.p + one.off[0], one.len[0]);
                list_free(&one);
            }
        }
        if (rc < 0) break;
        if (arena.len + tmp.len > UINT32_MAX) {
            rc = fmoe_error_set(FMOE_ERANGE, "tokenizer: token pieces exceed 4 GiB");
            break;
        }
        e->piece_off = (uint32_t)arena.len;
        e->piece_len = (uint32_t)tmp.len;
        rc = fmoe__tok_buf_append(&arena, tmp.p ? tmp.p : "", tmp.len);
    }
    fmoe__tok_buf_free(&tmp);
    if (rc < 0) {
        fmoe__tok_buf_free(&arena);
        return rc;
    }
    if (!arena.p && (rc = fmoe__tok_buf_reserve(&arena, 0)) < 0) return rc;
    tok->pieces = arena.p;
    return 0;
}

size_t fmoe_text_stable_prefix(const char *text, size_t n) {
    while (n >= 3 && (unsigned char)text[n - 3] == 0xEF && (unsigned char)text[n - 2] == 0xBF &&
           (unsigned char)text[n - 1] == 0xBD)
        n -= 3;
    return n;
}
