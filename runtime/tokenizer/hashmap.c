/*
 * hashmap.c - the tokenizer's two hash tables: token string -> id (the vocabulary and the
 * added tokens) and (left id, right id) -> merge (the BPE merges).
 *
 * Both are open addressing with linear probing over a power-of-two array kept at most
 * half full, so a probe ends after a few slots. Strings hash with 32-bit FNV-1a and keep
 * their hash beside the key to skip most memcmp calls; they grow as they fill. The merge
 * table is sized once for its n merges (they are all known at load) and never grows; its
 * lookup is inline in tokenizer_impl.h, for the BPE loop in encode.c. Neither removes.
 */
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "tokenizer_impl.h"

/* ---- string -> id ------------------------------------------------------------------------ */

uint32_t fmoe__tok_hash(const void *s, size_t n) {
    const unsigned char *p = s;
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 16777619u;
    return h;
}

int fmoe__tok_strmap_reserve(tok_strmap *m, size_t want) {
    size_t cap = 16;
    while (cap < want * 2) cap *= 2;
    if (m->slots && cap <= m->mask + 1) return 0;
    tok_strmap_slot *slots = calloc(cap, sizeof *slots);
    if (!slots) return fmoe_error_set(FMOE_ENOMEM, "tokenizer: out of memory (vocabulary)");
    if (m->slots) {
        for (size_t i = 0; i <= m->mask; i++) {
            tok_strmap_slot *s = &m->slots[i];
            if (!s->s) continue;
            size_t j = s->hash & (cap - 1);
            while (slots[j].s) j = (j + 1) & (cap - 1);
            slots[j] = *s;
        }
        free(m->slots);
    }
    m->slots = slots;
    m->mask = cap - 1;
    return 0;
}

int fmoe__tok_strmap_put(tok_strmap *m, const char *s, size_t n, int32_t id) {
    if (!m->slots || (m->count + 1) * 2 > m->mask + 1)
        FMOE_FORWARD_IF_ERROR(fmoe__tok_strmap_reserve(m, m->count + 1));
    uint32_t h = fmoe__tok_hash(s, n);
    size_t j = h & m->mask;
    while (m->slots[j].s) {
        tok_strmap_slot *e = &m->slots[j];
        if (e->hash == h && e->len == n && memcmp(e->s, s, n) == 0) {
            e->id = id;
            e->s = s;
            return 0;
        }
        j = (j + 1) & m->mask;
    }
    m->slots[j] = (tok_strmap_slot){s, (uint32_t)n, h, id};
    m->count++;
    return 0;
}

int32_t fmoe__tok_strmap_get(const tok_strmap *m, const char *s, size_t n) {
    if (!m->slots) return -1;
    uint32_t h = fmoe__tok_hash(s, n);
    size_t j = h & m->mask;
    while (m->slots[j].s) {
        const tok_strmap_slot *e = &m->slots[j];
        if (e->hash == h && e->len == n && memcmp(e->s, s, n) == 0) return e->id;
        j = (j + 1) & m->mask;
    }
    return -1;
}

void fmoe__tok_strmap_free(tok_strmap *m) {
    free(m->slots);
    memset(m, 0, sizeof *m);
}

/* ---- (left id, right id) -> merge ----------------------------------------------------------- */

int fmoe__tok_mergemap_init(tok_mergemap *m, size_t n) {
    size_t cap = 16;
    while (cap < n * 2) cap *= 2;
    m->slots = malloc(cap * sizeof *m->slots);
    if (!m->slots) return fmoe_error_set(FMOE_ENOMEM, "tokenizer: out of memory (merges)");
    for (size_t i = 0; i < cap; i++) m->slots[i].key = UINT64_MAX;
    m->mask = cap - 1;
    m->count = 0;
    return 0;
}

void fmoe__tok_mergemap_put(tok_mergemap *m, int32_t a, int32_t b, uint32_t rank,
                            int32_t new_id) {
    uint64_t key = fmoe__tok_merge_key(a, b);
    size_t j = fmoe__tok_merge_home(m, key);
    while (m->slots[j].key != UINT64_MAX && m->slots[j].key != key) j = (j + 1) & m->mask;
    if (m->slots[j].key == UINT64_MAX) m->count++;
    m->slots[j] = (tok_merge_slot){key, rank, new_id};
}

void fmoe__tok_mergemap_free(tok_mergemap *m) {
    free(m->slots);
    memset(m, 0, sizeof *m);
}
