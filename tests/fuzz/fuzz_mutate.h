/*
 * fuzz_mutate.h - the seeded mutator of the fuzz targets' standalone mode (the meson
 * suite 'fuzz' replays fixtures and these mutations of them without libFuzzer): a
 * xorshift64* generator and edits that reach a text parser's error paths (replace a byte,
 * delete one, insert a token of the format, change a digit).
 */
#ifndef FMOE_TESTS_FUZZ_MUTATE_H
#define FMOE_TESTS_FUZZ_MUTATE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct fuzz_mutator {
    unsigned long long state;     /* the seed, then the generator's state */
    const char *const *tokens;    /* fragments of the format to insert */
    size_t num_tokens;
} fuzz_mutator;

static inline unsigned long long fuzz_rng(fuzz_mutator *m) { /* xorshift64* */
    m->state ^= m->state >> 12;
    m->state ^= m->state << 25;
    m->state ^= m->state >> 27;
    return m->state * 2685821657736338717ull;
}

/* One to four seeded edits of src[0..n) into dst (capacity cap >= n); returns the new
 * length. */
static inline size_t fuzz_mutate(fuzz_mutator *m, const char *src, size_t n, char *dst,
                                 size_t cap) {
    memcpy(dst, src, n);
    size_t len = n;
    int edits = 1 + (int)(fuzz_rng(m) % 4);
    for (int e = 0; e < edits && len > 0; e++) {
        size_t at = fuzz_rng(m) % len;
        switch (fuzz_rng(m) % 4) {
        case 0: dst[at] = (char)(fuzz_rng(m) & 0xff); break; /* replace a byte */
        case 1: memmove(dst + at, dst + at + 1, len - at - 1); len--; break; /* delete */
        case 2: { /* insert a token */
            const char *t = m->tokens[fuzz_rng(m) % m->num_tokens];
            size_t tl = strlen(t);
            if (len + tl > cap) break;
            memmove(dst + at + tl, dst + at, len - at);
            memcpy(dst + at, t, tl);
            len += tl;
            break;
        }
        case 3: /* change a digit, to reach range checks */
            for (size_t i = at; i < len; i++)
                if (dst[i] >= '0' && dst[i] <= '9') {
                    dst[i] = (char)('0' + fuzz_rng(m) % 10);
                    break;
                }
            break;
        }
    }
    return len;
}

/* The first `cap` bytes of a fixture file, malloc'd (*n its length); NULL with a line on
 * stderr naming `who` and the path when it cannot be read. */
static inline char *fuzz_read_fixture(const char *who, const char *path, size_t cap, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "%s: cannot open %s\n", who, path);
        return NULL;
    }
    char *src = malloc(cap);
    *n = src ? fread(src, 1, cap, f) : 0;
    fclose(f);
    return src;
}

/* Feeds `target` the prefixes of src[0..n) every `stride` bytes and src whole, then
 * `mutations` seeded mutations of it. */
static inline void fuzz_replay(fuzz_mutator *m, const char *src, size_t n, size_t stride,
                               int mutations, int (*target)(const uint8_t *, size_t)) {
    for (size_t cut = 0; cut < n; cut += stride) target((const uint8_t *)src, cut);
    target((const uint8_t *)src, n);
    char *dst = malloc(n + 64);
    for (int i = 0; dst && i < mutations; i++) {
        const size_t len = fuzz_mutate(m, src, n, dst, n + 64);
        target((const uint8_t *)dst, len);
    }
    free(dst);
}

#endif
