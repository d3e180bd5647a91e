/*
 * unicode.c - UTF-8 decoding with Unicode's "maximal subpart" handling of invalid input,
 * and canonical normalisation (NFC, NFD) for the tokenizer's normalizers.
 *
 * NFC follows UAX #15: full canonical decomposition (Hangul algorithmically, the rest from
 * unicode_tables.h), canonical ordering of combining marks by combining class, then
 * canonical composition of unblocked pairs into primary composites. Text below U+0300 is
 * returned unchanged by NFC without decoding (nothing there decomposes or combines); for
 * NFD the same holds below U+00C0. The tables (unicode_tables.h) hold the characters of
 * Unicode 9.0 only: that is the data HuggingFace tokenizers normalises with (its
 * unicode-normalization-alignments crate), and the ids must be the same. A combining mark
 * added since then has class 0 here, as there, so it is neither reordered nor composed.
 */
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "tokenizer_impl.h"
#include "unicode_tables.h"

/* ---- UTF-8 -------------------------------------------------------------------------------- */

/* Allowed range of the second byte for each lead byte (Unicode Table 3-7). */
static int utf8_lead(unsigned char c, int *need, unsigned char *lo, unsigned char *hi) {
    *lo = 0x80;
    *hi = 0xBF;
    if (c < 0x80) {
        *need = 0;
    } else if (c >= 0xC2 && c <= 0xDF) {
        *need = 1;
    } else if (c == 0xE0) {
        *need = 2;
        *lo = 0xA0;
    } else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) {
        *need = 2;
    } else if (c == 0xED) {
        *need = 2;
        *hi = 0x9F;
    } else if (c == 0xF0) {
        *need = 3;
        *lo = 0x90;
    } else if (c >= 0xF1 && c <= 0xF3) {
        *need = 3;
    } else if (c == 0xF4) {
        *need = 3;
        *hi = 0x8F;
    } else {
        return 0;
    }
    return 1;
}

size_t fmoe__utf8_decode(const unsigned char *s, size_t n, uint32_t *cp) {
    if (n == 0) return 0;
    unsigned char c = s[0], lo, hi;
    int need;
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    if (!utf8_lead(c, &need, &lo, &hi) || n < (size_t)need + 1) return 0;
    if (s[1] < lo || s[1] > hi) return 0;
    for (int i = 2; i <= need; i++)
        if (s[i] < 0x80 || s[i] > 0xBF) return 0;
    if (need == 1)
        *cp = ((uint32_t)(c & 0x1F) << 6) | (s[1] & 0x3F);
    else if (need == 2)
        *cp = ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    else
        *cp = ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
              ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
    return (size_t)need + 1;
}

size_t fmoe__utf8_invalid_len(const unsigned char *s, size_t n) {
    unsigned char lo, hi;
    int need;
    if (n == 0) return 0;
    if (!utf8_lead(s[0], &need, &lo, &hi) || need == 0) return 1;
    size_t i = 1;
    if (i < n && s[i] >= lo && s[i] <= hi) {
        i++;
        while (i < n && i <= (size_t)need && s[i] >= 0x80 && s[i] <= 0xBF) i++;
    }
    return i;
}

size_t fmoe__utf8_encode(uint32_t cp, char out[4]) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

int fmoe__utf8_lossy(const char *s, size_t n, tok_buf *out) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, run = 0;
    FMOE_FORWARD_IF_ERROR(fmoe__tok_buf_reserve(out, n));
    while (i < n) {
        uint32_t cp;
        size_t k = fmoe__utf8_decode(u + i, n - i, &cp);
        if (k) {
            i += k;
            continue;
        }
        FMOE_FORWARD_IF_ERROR(fmoe__tok_buf_append(out, s + run, i - run));
        FMOE_FORWARD_IF_ERROR(fmoe__tok_buf_append(out, "\xEF\xBF\xBD", 3));
        i += fmoe__utf8_invalid_len(u + i, n - i);
        run = i;
    }
    return fmoe__tok_buf_append(out, s + run, n - run);
}

int fmoe__unicode_is_space(uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

/* ---- canonical normalisation ---------------------------------------------------------------- */

enum {
    HANGUL_S = 0xAC00,
    HANGUL_L = 0x1100,
    HANGUL_V = 0x1161,
    HANGUL_T = 0x11A7,
    HANGUL_LCOUNT = 19,
    HANGUL_VCOUNT = 21,
    HANGUL_TCOUNT = 28,
    HANGUL_NCOUNT = HANGUL_VCOUNT * HANGUL_TCOUNT,
    HANGUL_SCOUNT = HANGUL_LCOUNT * HANGUL_NCOUNT,
};

static int ccc_of(uint32_t cp) {
    if (cp < 0x300) return 0;
    size_t lo = 0, hi = sizeof unicode_ccc_ranges / sizeof unicode_ccc_ranges[0];
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < unicode_ccc_ranges[mid][0])
            hi = mid;
        else if (cp > unicode_ccc_ranges[mid][1])
            lo = mid + 1;
        else
            return (int)unicode_ccc_ranges[mid][2];
    }
    return 0;
}

static const uint32_t *decomp_of(uint32_t cp) {
    if (cp < 0xC0) return NULL;
    size_t lo = 0, hi = sizeof unicode_decomp / sizeof unicode_decomp[0];
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < unicode_decomp[mid][0])
            hi = mid;
        else if (cp > unicode_decomp[mid][0])
            lo = mid + 1;
        else
            return unicode_decomp[mid];
    }
    return NULL;
}

static uint32_t compose_pair(uint32_t a, uint32_t b) {
    if (a >= HANGUL_L && a < HANGUL_L + HANGUL_LCOUNT && b >= HANGUL_V &&
        b < HANGUL_V + HANGUL_VCOUNT)
        return HANGUL_S + ((a - HANGUL_L) * HANGUL_VCOUNT + (b - HANGUL_V)) * HANGUL_TCOUNT;
    if (a >= HANGUL_S && a < HANGUL_S + HANGUL_SCOUNT && (a - HANGUL_S) % HANGUL_TCOUNT == 0 &&
        b > HANGUL_T && b < HANGUL_T + HANGUL_TCOUNT)
        return a + (b - HANGUL_T);
    size_t lo = 0, hi = sizeof unicode_comp / sizeof unicode_comp[0];
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        const uint32_t *e = unicode_comp[mid];
        if (a < e[0] || (a == e[0] && b < e[1]))
            hi = mid;
        else if (a > e[0] || b > e[1])
            lo = mid + 1;
        else
            return e[2];
    }
    return 0;
}

typedef struct cp_vec {
    uint32_t *v;
    size_t len, cap;
} cp_vec;

static int cp_push(cp_vec *c, uint32_t cp) {
    if (c->len == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 64;
        uint32_t *v = realloc(c->v, cap * sizeof *v);
        if (!v) return fmoe_error_set(FMOE_ENOMEM, "tokenizer: out of memory (normalizer)");
        c->v = v;
        c->cap = cap;
    }
    c->v[c->len++] = cp;
    return 0;
}

static int decompose(uint32_t cp, cp_vec *out) {
    if (cp >= HANGUL_S && cp < HANGUL_S + HANGUL_SCOUNT) {
        uint32_t s = cp - HANGUL_S;
        FMOE_FORWARD_IF_ERROR(cp_push(out, HANGUL_L + s / HANGUL_NCOUNT));
        FMOE_FORWARD_IF_ERROR(cp_push(out, HANGUL_V + (s % HANGUL_NCOUNT) / HANGUL_TCOUNT));
        if (s % HANGUL_TCOUNT) FMOE_FORWARD_IF_ERROR(cp_push(out, HANGUL_T + s % HANGUL_TCOUNT));
        return 0;
    }
    const uint32_t *d = decomp_of(cp);
    if (!d) return cp_push(out, cp);
    FMOE_FORWARD_IF_ERROR(decompose(d[1], out)); /* depth is bounded by the data (<= 4) */
    if (d[2]) FMOE_FORWARD_IF_ERROR(decompose(d[2], out));
    return 0;
}

int fmoe__unicode_normalize(const char *s, size_t n, int compose, tok_buf *out) {
    const unsigned char *u = (const unsigned char *)s;
    /* Quick check: nothing below U+0300 changes under NFC, nothing below U+00C0 under NFD
     * (lead bytes 0xCC and 0xC3). */
    const unsigned char limit = compose ? 0xCC : 0xC3;
    size_t i;
    for (i = 0; i < n && u[i] < limit; i++) {
    }
    if (i == n) return fmoe__tok_buf_append(out, s, n);

    cp_vec c = {0};
    int rc = 0;
    for (i = 0; i < n;) {
        uint32_t cp;
        size_t k = fmoe__utf8_decode(u + i, n - i, &cp);
        if (!k) { /* callers pass valid UTF-8; keep going defensively */
            cp = 0xFFFD;
            k = fmoe__utf8_invalid_len(u + i, n - i);
        }
        i += k;
        if ((rc = decompose(cp, &c)) < 0) goto done;
    }
    /* canonical ordering: stable insertion sort of each run of non-starters */
    for (size_t a = 0; a < c.len; a++) {
        int ka = ccc_of(c.v[a]);
        if (ka == 0) continue;
        size_t b = a;
        while (b > 0) {
            int kp = ccc_of(c.v[b - 1]);
            if (kp <= ka) break;
            uint32_t t = c.v[b - 1];
            c.v[b - 1] = c.v[b];
            c.v[b] = t;
            b--;
        }
    }
    size_t m = c.len;
    if (compose && c.len) {
        size_t w = 0;
        long starter = -1;
        int last_ccc = -1; /* ccc of the last kept char after the starter; -1: adjacent */
        for (size_t r = 0; r < c.len; r++) {
            uint32_t cp = c.v[r];
            int k = ccc_of(cp);
            if (starter >= 0 && (last_ccc == -1 || (last_ccc != 0 && last_ccc < k))) {
                uint32_t comp = compose_pair(c.v[starter], cp);
                if (comp) {
                    c.v[starter] = comp;
                    continue;
                }
            }
            if (k == 0) {
                starter = (long)w;
                last_ccc = -1;
            } else {
                last_ccc = k;
            }
            c.v[w++] = cp;
        }
        m = w;
    }
    if ((rc = fmoe__tok_buf_reserve(out, m * 4)) < 0) goto done;
    for (size_t r = 0; r < m; r++) out->len += fmoe__utf8_encode(c.v[r], out->p + out->len);
    out->p[out->len] = '\0';
done:
    free(c.v);
    return rc;
}
