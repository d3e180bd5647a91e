/*
 * gguf.c - validated, memory-mapped GGUF files (fmoe/gguf.h; the layout in
 * docs/quantization.md).
 *
 * Design. The file is mapped read-only and parsed once, front to back, by a cursor that
 * checks every read against the bytes that remain; nothing is allocated from a count or
 * a length before that check, so a header claiming 2^60 tensors or a 4 GB string fails
 * with one line instead of an allocation. Keys and tensor names are copied (NUL-terminated)
 * so callers get C strings; string values stay in the mapping as (ptr, len) views. Two
 * index arrays sorted by name make lookups a binary search and find duplicates.
 *
 * What is checked, in the order a bad file fails (each a one-line error naming the file,
 * the key or tensor and the byte offset):
 *   1. the magic; version 2 or 3 (1 had 32-bit counts and is long obsolete; a version that
 *      reads as a byte-swapped small number is a big-endian file, refused as such);
 *   2. per key: length 1..65535 without control characters, a known value type,
 *      strings and arrays inside the file (element count × element size, or per string
 *      its length), no arrays of arrays (llama.cpp's reader has none either), no key
 *      twice;
 *   3. general.alignment, when present, a UINT32 power of two;
 *   4. per tensor: name 1..63 bytes without control characters, 1..4 dims, each extent
 *      >= 0 and the element count without overflow, a type ggml defines, a row length
 *      that is a whole number of blocks, an offset that is a multiple of the alignment,
 *      data inside the file;
 *   5. no two tensors share bytes, no name twice.
 * A split model (fmoe/gguf.h) is its shards each parsed as above, then joined: shard 1's
 * keys, one tensor array (the names moved out of the shards) with one sorted index over it,
 * the shards' handles kept for their mappings and paths.
 */
#include "fmoe/gguf.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fmoe/error.h"
#include "files.h"
#include "fmoe/quant.h"

#define GGUF_MAGIC "GGUF"
#define MAX_KEY_LEN 65535u

struct fmoe_gguf {
    char *path;                /* owned copy of the name given */
    void *map;                 /* the mapping when opened from a path, else NULL */
    uint64_t map_size;
    const uint8_t *bytes;      /* the file's bytes (borrowed or the mapping) */
    uint64_t size;
    uint32_t version;
    uint32_t alignment;
    uint64_t data_offset;
    int64_t n_kv;
    fmoe_gguf_kv *kvs;         /* [n_kv] in file order */
    int64_t *kv_by_key;        /* [n_kv] indices sorted by key */
    fmoe_gguf_str *strs;       /* every string value, in file order */
    int64_t n_strs;
    int64_t n_tensors;
    fmoe_gguf_tensor *tensors; /* [n_tensors] in file order */
    int64_t *tensor_by_name;   /* [n_tensors] indices sorted by name */
    int32_t n_shards;          /* 1, or a split model's split.count */
    fmoe_gguf **shards;        /* [n_shards - 1] shards 2..N (their tensors moved to this
                                  handle; NULL entries not yet opened) */
};

/* ---------------------------------------------------------------------------------- */
/* The cursor                                                                         */
/* ---------------------------------------------------------------------------------- */

typedef struct cursor {
    const uint8_t *p;
    uint64_t size;
    uint64_t pos;
    const char *name;
} cursor;

static uint64_t remaining(const cursor *c) { return c->size - c->pos; }

/* Reads n bytes (n <= 8) as a little-endian unsigned integer. */
static int read_le(cursor *c, int n, uint64_t *out, const char *what) {
    if (remaining(c) < (uint64_t)n)
        return fmoe_error_set(FMOE_EFORMAT, "%s: offset %llu: file ends inside %s", c->name,
                              (unsigned long long)c->pos, what);
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | c->p[c->pos + (uint64_t)i];
    c->pos += (uint64_t)n;
    *out = v;
    return 0;
}

static int read_u32(cursor *c, uint32_t *out, const char *what) {
    uint64_t v = 0;
    FMOE_FORWARD_IF_ERROR(read_le(c, 4, &v, what));
    *out = (uint32_t)v;
    return 0;
}

static int read_u64(cursor *c, uint64_t *out, const char *what) {
    return read_le(c, 8, out, what);
}

/* A GGUF string: uint64 length + bytes. `what` names it in errors. */
static int read_str(cursor *c, fmoe_gguf_str *out, const char *what) {
    const uint64_t at = c->pos;
    uint64_t len = 0;
    FMOE_FORWARD_IF_ERROR(read_u64(c, &len, what));
    if (len > remaining(c))
        return fmoe_error_set(FMOE_EFORMAT,
                              "%s: offset %llu: %s has length %llu but only %llu bytes remain",
                              c->name, (unsigned long long)at, what, (unsigned long long)len,
                              (unsigned long long)remaining(c));
    out->ptr = (const char *)c->p + c->pos;
    out->len = len;
    c->pos += len;
    return 0;
}

/* Bytes of one fixed-size value, 0 for STRING and ARRAY, -1 for an unknown type. */
static int value_size(uint32_t t) {
    switch (t) {
    case FMOE_GGUF_UINT8:
    case FMOE_GGUF_INT8:
    case FMOE_GGUF_BOOL:
        return 1;
    case FMOE_GGUF_UINT16:
    case FMOE_GGUF_INT16:
        return 2;
    case FMOE_GGUF_UINT32:
    case FMOE_GGUF_INT32:
    case FMOE_GGUF_FLOAT32:
        return 4;
    case FMOE_GGUF_UINT64:
    case FMOE_GGUF_INT64:
    case FMOE_GGUF_FLOAT64:
        return 8;
    case FMOE_GGUF_STRING:
    case FMOE_GGUF_ARRAY:
        return 0;
    default:
        return -1;
    }
}

const char *fmoe_gguf_value_type_name(uint32_t t) {
    static const char *const names[] = {"UINT8", "INT8",   "UINT16", "INT16", "UINT32",
                                        "INT32", "FLOAT32", "BOOL",  "STRING", "ARRAY",
                                        "UINT64", "INT64", "FLOAT64"};
    return t < sizeof names / sizeof names[0] ? names[t] : "?";
}

/* ---------------------------------------------------------------------------------- */
/* Parsing                                                                            */
/* ---------------------------------------------------------------------------------- */

/* Keys and tensor names end up in error lines and on terminals: no control characters
 * (a newline would split the one-line error; an escape sequence would reach the terminal). */
static int has_control(const fmoe_gguf_str *s) {
    for (uint64_t i = 0; i < s->len; i++)
        if ((unsigned char)s->ptr[i] < 0x20 || (unsigned char)s->ptr[i] == 0x7f) return 1;
    return 0;
}

static char *copy_name(const fmoe_gguf_str *s) {
    char *n = malloc(s->len + 1);
    if (!n) return NULL;
    memcpy(n, s->ptr, s->len);
    n[s->len] = '\0';
    return n;
}

/* Appends a string view to g->strs, growing it; @return its index or -1 (ENOMEM). */
static int64_t push_str(fmoe_gguf *g, int64_t *cap, fmoe_gguf_str s) {
    if (g->n_strs == *cap) {
        int64_t ncap = *cap ? *cap * 2 : 64;
        fmoe_gguf_str *n = realloc(g->strs, (size_t)ncap * sizeof *n);
        if (!n) return -1;
        g->strs = n;
        *cap = ncap;
    }
    g->strs[g->n_strs] = s;
    return g->n_strs++;
}

/* A merge sort of an index array with the handle as context (qsort has none), so parsing
 * stays reentrant across threads. */
static void sort_index(const fmoe_gguf *g, int64_t *idx, int64_t *tmp, int64_t n,
                       int (*cmp)(const fmoe_gguf *, int64_t, int64_t)) {
    if (n < 2) return;
    const int64_t h = n / 2;
    sort_index(g, idx, tmp, h, cmp);
    sort_index(g, idx + h, tmp, n - h, cmp);
    int64_t i = 0, j = h, k = 0;
    while (i < h && j < n) tmp[k++] = cmp(g, idx[i], idx[j]) <= 0 ? idx[i++] : idx[j++];
    while (i < h) tmp[k++] = idx[i++];
    while (j < n) tmp[k++] = idx[j++];
    memcpy(idx, tmp, (size_t)n * sizeof *idx);
}

static int by_key(const fmoe_gguf *g, int64_t a, int64_t b) {
    return strcmp(g->kvs[a].key, g->kvs[b].key);
}
static int by_name(const fmoe_gguf *g, int64_t a, int64_t b) {
    return strcmp(g->tensors[a].name, g->tensors[b].name);
}
static int by_offset(const fmoe_gguf *g, int64_t a, int64_t b) {
    return g->tensors[a].offset < g->tensors[b].offset ? -1 : g->tensors[a].offset > g->tensors[b].offset;
}

static int parse_kv(fmoe_gguf *g, cursor *c, int64_t i, int64_t *strs_cap, int64_t *str_first) {
    fmoe_gguf_kv *kv = &g->kvs[i];
    kv->offset = c->pos;
    fmoe_gguf_str key;
    FMOE_FORWARD_IF_ERROR(read_str(c, &key, "a key"));
    FMOE_RETURN_ERROR_IF(key.len == 0 || key.len > MAX_KEY_LEN, FMOE_EFORMAT,
                         "%s: offset %llu: key %lld has length %llu (1..%u allowed)", c->name,
                         (unsigned long long)kv->offset, (long long)i,
                         (unsigned long long)key.len, MAX_KEY_LEN);
    FMOE_RETURN_ERROR_IF(has_control(&key), FMOE_EFORMAT,
                         "%s: offset %llu: key %lld holds a control character", c->name,
                         (unsigned long long)kv->offset, (long long)i);
    kv->key = copy_name(&key);
    FMOE_RETURN_ERROR_IF(!kv->key, FMOE_ENOMEM, "%s: out of memory", c->name);
    uint32_t type = 0;
    const uint64_t type_at = c->pos;
    FMOE_FORWARD_IF_ERROR(read_u32(c, &type, "a value type"));
    FMOE_RETURN_ERROR_IF(value_size(type) < 0, FMOE_EFORMAT,
                         "%s: offset %llu: key %s has unknown value type %u", c->name,
                         (unsigned long long)type_at, kv->key, type);
    kv->type = kv->elem = (fmoe_gguf_value_type)type;
    kv->count = 1;
    if (type == FMOE_GGUF_ARRAY) {
        uint32_t elem = 0;
        const uint64_t elem_at = c->pos;
        FMOE_FORWARD_IF_ERROR(read_u32(c, &elem, "an array type"));
        FMOE_RETURN_ERROR_IF(value_size(elem) < 0, FMOE_EFORMAT,
                             "%s: offset %llu: key %s is an array of unknown type %u", c->name,
                             (unsigned long long)elem_at, kv->key, elem);
        FMOE_RETURN_ERROR_IF(elem == FMOE_GGUF_ARRAY, FMOE_EUNSUPPORTED,
                             "%s: offset %llu: key %s is an array of arrays (not supported)",
                             c->name, (unsigned long long)elem_at, kv->key);
        kv->elem = (fmoe_gguf_value_type)elem;
        FMOE_FORWARD_IF_ERROR(read_u64(c, &kv->count, "an array length"));
    }
    const int es = value_size(kv->elem);
    const uint64_t at = c->pos;
    if (es > 0) {
        FMOE_RETURN_ERROR_IF(kv->count > remaining(c) / (uint64_t)es, FMOE_EFORMAT,
                             "%s: offset %llu: key %s holds %llu values of %d bytes but only "
                             "%llu bytes remain",
                             c->name, (unsigned long long)at, kv->key,
                             (unsigned long long)kv->count, es, (unsigned long long)remaining(c));
        kv->data = c->p + c->pos;
        c->pos += kv->count * (uint64_t)es;
        return 0;
    }
    /* Strings: each at least its 8-byte length, checked before anything grows. */
    FMOE_RETURN_ERROR_IF(kv->count > remaining(c) / 8, FMOE_EFORMAT,
                         "%s: offset %llu: key %s holds %llu strings but only %llu bytes remain",
                         c->name, (unsigned long long)at, kv->key,
                         (unsigned long long)kv->count, (unsigned long long)remaining(c));
    *str_first = g->n_strs;
    char what[96];
    snprintf(what, sizeof what, "the value of key %.60s", kv->key);
    for (uint64_t k = 0; k < kv->count; k++) {
        fmoe_gguf_str s;
        FMOE_FORWARD_IF_ERROR(read_str(c, &s, what));
        FMOE_RETURN_ERROR_IF(push_str(g, strs_cap, s) < 0, FMOE_ENOMEM, "%s: out of memory",
                             c->name);
    }
    return 0;
}

static int parse_tensor(fmoe_gguf *g, cursor *c, int64_t i) {
    fmoe_gguf_tensor *t = &g->tensors[i];
    const uint64_t at = c->pos;
    fmoe_gguf_str name;
    FMOE_FORWARD_IF_ERROR(read_str(c, &name, "a tensor name"));
    FMOE_RETURN_ERROR_IF(name.len == 0 || name.len > FMOE_GGUF_MAX_NAME || has_control(&name),
                         FMOE_EFORMAT,
                         "%s: offset %llu: tensor %lld has a name of %llu bytes (1..%d without "
                         "control characters allowed)",
                         c->name, (unsigned long long)at, (long long)i,
                         (unsigned long long)name.len, FMOE_GGUF_MAX_NAME);
    t->name = copy_name(&name);
    FMOE_RETURN_ERROR_IF(!t->name, FMOE_ENOMEM, "%s: out of memory", c->name);
    uint32_t ndim = 0;
    FMOE_FORWARD_IF_ERROR(read_u32(c, &ndim, "a tensor's dimension count"));
    FMOE_RETURN_ERROR_IF(ndim < 1 || ndim > FMOE_GGUF_MAX_DIMS, FMOE_EFORMAT,
                         "%s: offset %llu: tensor %s has %u dimensions (1..%d allowed)",
                         c->name, (unsigned long long)at, t->name, ndim, FMOE_GGUF_MAX_DIMS);
    t->ndim = (int32_t)ndim;
    t->numel = 1;
    for (int d = 0; d < FMOE_GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < ndim; d++) {
        uint64_t ne = 0;
        FMOE_FORWARD_IF_ERROR(read_u64(c, &ne, "a tensor extent"));
        FMOE_RETURN_ERROR_IF(ne > (uint64_t)INT64_MAX, FMOE_EFORMAT,
                             "%s: offset %llu: tensor %s has extent %llu in dimension %u",
                             c->name, (unsigned long long)at, t->name, (unsigned long long)ne, d);
        t->ne[d] = (int64_t)ne;
        FMOE_RETURN_ERROR_IF(ne != 0 && (uint64_t)t->numel > (uint64_t)INT64_MAX / ne,
                             FMOE_EFORMAT,
                             "%s: offset %llu: tensor %s has too many elements", c->name,
                             (unsigned long long)at, t->name);
        t->numel *= (int64_t)ne;
    }
    const uint64_t type_at = c->pos;
    FMOE_FORWARD_IF_ERROR(read_u32(c, &t->type, "a tensor type"));
    const int32_t bs = fmoe_ggml_block_size(t->type), ts = fmoe_ggml_type_size(t->type);
    FMOE_RETURN_ERROR_IF(bs == 0, FMOE_EUNSUPPORTED,
                         "%s: offset %llu: tensor %s has type %u, which ggml does not define",
                         c->name, (unsigned long long)type_at, t->name, t->type);
    FMOE_RETURN_ERROR_IF(t->ne[0] % bs != 0, FMOE_EFORMAT,
                         "%s: offset %llu: tensor %s has rows of %lld values, not a multiple of "
                         "%s's block of %d",
                         c->name, (unsigned long long)at, t->name, (long long)t->ne[0],
                         fmoe_ggml_type_name(t->type), bs);
    /* bytes = numel / bs * ts; numel / bs fits, and the product is checked. */
    const uint64_t blocks = (uint64_t)t->numel / (uint64_t)bs;
    /* The row alone can be too large when another extent is 0 and numel with it. */
    FMOE_RETURN_ERROR_IF(blocks > (uint64_t)INT64_MAX / (uint64_t)ts ||
                             (uint64_t)(t->ne[0] / bs) > (uint64_t)INT64_MAX / (uint64_t)ts,
                         FMOE_EFORMAT,
                         "%s: offset %llu: tensor %s is too large", c->name,
                         (unsigned long long)at, t->name);
    t->nbytes = (int64_t)(blocks * (uint64_t)ts);
    t->row_bytes = t->ne[0] / bs * ts;
    uint64_t rel = 0;
    FMOE_FORWARD_IF_ERROR(read_u64(c, &rel, "a tensor offset"));
    t->offset = rel; /* relative until the data section is known */
    return 0;
}

static void free_contents(fmoe_gguf *g) {
    if (g->shards)
        for (int32_t i = 0; i < g->n_shards - 1; i++) fmoe_gguf_close(g->shards[i]);
    free(g->shards);
    if (g->kvs)
        for (int64_t i = 0; i < g->n_kv; i++) free((char *)g->kvs[i].key);
    if (g->tensors)
        for (int64_t i = 0; i < g->n_tensors; i++) free((char *)g->tensors[i].name);
    free(g->kvs);
    free(g->kv_by_key);
    free(g->strs);
    free(g->tensors);
    free(g->tensor_by_name);
    free(g->path);
}

static int parse(fmoe_gguf *g) {
    cursor c = {.p = g->bytes, .size = g->size, .pos = 0, .name = g->path};
    const char *name = g->path;
    FMOE_RETURN_ERROR_IF(g->size < 4, FMOE_EFORMAT,
                         "%s: offset 0: not a GGUF file: %llu bytes, shorter than the magic "
                         "\"GGUF\"",
                         name, (unsigned long long)g->size);
    if (memcmp(g->bytes, GGUF_MAGIC, 4) != 0) {
        char shown[5];
        for (int i = 0; i < 4; i++)
            shown[i] = g->bytes[i] > 0x20 && g->bytes[i] < 0x7f && g->bytes[i] != '"'
                           ? (char)g->bytes[i] : '.';
        shown[4] = '\0';
        return fmoe_error_set(FMOE_EFORMAT,
                              "%s: offset 0: not a GGUF file: magic %02x %02x %02x %02x "
                              "(\"%s\"), expected 47 47 55 46 (\"GGUF\")",
                              name, g->bytes[0], g->bytes[1], g->bytes[2], g->bytes[3], shown);
    }
    c.pos = 4;
    FMOE_FORWARD_IF_ERROR(read_u32(&c, &g->version, "the version"));
    if (g->version > 0xffff && (g->version & 0xffff) == 0)
        return fmoe_error_set(FMOE_EUNSUPPORTED,
                              "%s: offset 4: a big-endian GGUF file (version %u byte-swapped); "
                              "fmoe reads little-endian files",
                              name, __builtin_bswap32(g->version));
    FMOE_RETURN_ERROR_IF(g->version != 2 && g->version != 3, FMOE_EUNSUPPORTED,
                         "%s: offset 4: GGUF version %u (fmoe reads versions 2 and 3)", name,
                         g->version);
    uint64_t n_tensors = 0, n_kv = 0;
    FMOE_FORWARD_IF_ERROR(read_u64(&c, &n_tensors, "the tensor count"));
    FMOE_FORWARD_IF_ERROR(read_u64(&c, &n_kv, "the key-value count"));
    /* Minimum bytes per entry: a key is 8 + 1 + 4 + 1, a tensor info 8 + 1 + 4 + 8 + 4 + 8. */
    FMOE_RETURN_ERROR_IF(n_kv > remaining(&c) / 14, FMOE_EFORMAT,
                         "%s: offset 16: %llu key-value pairs cannot fit in the %llu bytes "
                         "that remain",
                         name, (unsigned long long)n_kv, (unsigned long long)remaining(&c));
    FMOE_RETURN_ERROR_IF(n_tensors > remaining(&c) / 33, FMOE_EFORMAT,
                         "%s: offset 8: %llu tensors cannot fit in the %llu bytes that remain",
                         name, (unsigned long long)n_tensors, (unsigned long long)remaining(&c));
    g->n_kv = (int64_t)n_kv;
    g->n_tensors = (int64_t)n_tensors;
    g->kvs = calloc(n_kv ? n_kv : 1, sizeof *g->kvs);
    g->kv_by_key = calloc(n_kv ? n_kv : 1, sizeof *g->kv_by_key);
    g->tensors = calloc(n_tensors ? n_tensors : 1, sizeof *g->tensors);
    g->tensor_by_name = calloc(n_tensors ? n_tensors : 1, sizeof *g->tensor_by_name);
    int64_t *tmp = calloc((n_kv > n_tensors ? n_kv : n_tensors) + 1, sizeof *tmp);
    int64_t *str_first = calloc(n_kv ? n_kv : 1, sizeof *str_first);
    int rc = 0;
    if (!g->kvs || !g->kv_by_key || !g->tensors || !g->tensor_by_name || !tmp || !str_first) {
        rc = fmoe_error_set(FMOE_ENOMEM, "%s: out of memory", name);
        goto done;
    }
    int64_t strs_cap = 0;
    for (int64_t i = 0; i < g->n_kv; i++) {
        rc = parse_kv(g, &c, i, &strs_cap, &str_first[i]);
        if (rc < 0) goto done; /* keys not yet parsed are NULL (calloc) */
    }
    /* Views into g->strs only now that it no longer moves. */
    for (int64_t i = 0; i < g->n_kv; i++)
        if (g->kvs[i].elem == FMOE_GGUF_STRING) g->kvs[i].strs = g->strs + str_first[i];
    for (int64_t i = 0; i < g->n_kv; i++) g->kv_by_key[i] = i;
    sort_index(g, g->kv_by_key, tmp, g->n_kv, by_key);
    for (int64_t i = 1; i < g->n_kv; i++)
        if (strcmp(g->kvs[g->kv_by_key[i]].key, g->kvs[g->kv_by_key[i - 1]].key) == 0) {
            const fmoe_gguf_kv *kv = &g->kvs[g->kv_by_key[i]];
            rc = fmoe_error_set(FMOE_EFORMAT, "%s: offset %llu: key %s appears twice", name,
                                (unsigned long long)kv->offset, kv->key);
            goto done;
        }

    g->alignment = FMOE_GGUF_DEFAULT_ALIGNMENT;
    const fmoe_gguf_kv *al = fmoe_gguf_find_kv(g, "general.alignment");
    if (al) {
        uint32_t a = 0;
        if (al->type == FMOE_GGUF_UINT32) memcpy(&a, al->data, 4);
        if (al->type != FMOE_GGUF_UINT32 || a == 0 || (a & (a - 1)) != 0) {
            rc = fmoe_error_set(FMOE_EFORMAT,
                                "%s: offset %llu: key general.alignment must be a UINT32 power "
                                "of two, got %s %u",
                                name, (unsigned long long)al->offset,
                                fmoe_gguf_value_type_name(al->type), a);
            goto done;
        }
        g->alignment = a;
    }

    for (int64_t i = 0; i < g->n_tensors; i++) {
        rc = parse_tensor(g, &c, i);
        if (rc < 0) goto done;
    }
    const uint64_t pad = (g->alignment - c.pos % g->alignment) % g->alignment;
    g->data_offset = c.pos + pad;
    if (g->n_tensors > 0 && g->data_offset > g->size) {
        rc = fmoe_error_set(FMOE_EFORMAT,
                            "%s: offset %llu: file ends before the data section at %llu", name,
                            (unsigned long long)c.pos, (unsigned long long)g->data_offset);
        goto done;
    }
    for (int64_t i = 0; i < g->n_tensors; i++) {
        fmoe_gguf_tensor *t = &g->tensors[i];
        const uint64_t rel = t->offset;
        if (rel % g->alignment != 0) {
            rc = fmoe_error_set(FMOE_EFORMAT,
                                "%s: tensor %s: data offset %llu is not a multiple of the "
                                "alignment %u",
                                name, t->name, (unsigned long long)rel, g->alignment);
            goto done;
        }
        if (rel > g->size - g->data_offset ||
            (uint64_t)t->nbytes > g->size - g->data_offset - rel) {
            rc = fmoe_error_set(FMOE_EFORMAT,
                                "%s: tensor %s: %lld bytes at offset %llu run past the end of "
                                "the file (%llu bytes)",
                                name, t->name, (long long)t->nbytes,
                                (unsigned long long)(g->data_offset + rel),
                                (unsigned long long)g->size);
            goto done;
        }
        t->offset = g->data_offset + rel;
        t->data = g->bytes + t->offset;
        t->file = g->path;
    }
    for (int64_t i = 0; i < g->n_tensors; i++) g->tensor_by_name[i] = i;
    sort_index(g, g->tensor_by_name, tmp, g->n_tensors, by_name);
    for (int64_t i = 1; i < g->n_tensors; i++)
        if (strcmp(g->tensors[g->tensor_by_name[i]].name,
                   g->tensors[g->tensor_by_name[i - 1]].name) == 0) {
            rc = fmoe_error_set(FMOE_EFORMAT, "%s: tensor %s appears twice", name,
                                g->tensors[g->tensor_by_name[i]].name);
            goto done;
        }
    /* Overlaps: sorted by offset, each starts at or after the previous one's end. */
    int64_t *by_off = str_first; /* reuse: large enough only when n_kv >= n_tensors */
    if (g->n_tensors > g->n_kv) {
        by_off = calloc((size_t)g->n_tensors, sizeof *by_off);
        if (!by_off) {
            rc = fmoe_error_set(FMOE_ENOMEM, "%s: out of memory", name);
            goto done;
        }
    }
    for (int64_t i = 0; i < g->n_tensors; i++) by_off[i] = i;
    sort_index(g, by_off, tmp, g->n_tensors, by_offset);
    for (int64_t i = 1; i < g->n_tensors && rc == 0; i++) {
        const fmoe_gguf_tensor *a = &g->tensors[by_off[i - 1]], *b = &g->tensors[by_off[i]];
        if (b->offset < a->offset + (uint64_t)a->nbytes)
            rc = fmoe_error_set(FMOE_EFORMAT, "%s: tensors %s and %s overlap at offset %llu",
                                name, a->name, b->name, (unsigned long long)b->offset);
    }
    if (by_off != str_first) free(by_off);
done:
    free(tmp);
    free(str_first);
    return rc;
}

/* ---------------------------------------------------------------------------------- */
/* Open and close                                                                     */
/* ---------------------------------------------------------------------------------- */

int fmoe_gguf_parse(const void *bytes, uint64_t size, const char *name, fmoe_gguf **out) {
    fmoe_gguf *g = calloc(1, sizeof *g);
    if (!g) return fmoe_error_set(FMOE_ENOMEM, "%s: out of memory", name);
    g->path = strdup(name ? name : "gguf");
    if (!g->path) {
        free(g);
        return fmoe_error_set(FMOE_ENOMEM, "%s: out of memory", name);
    }
    g->bytes = bytes;
    g->size = size;
    g->n_shards = 1;
    int rc = parse(g);
    if (rc < 0) {
        free_contents(g);
        free(g);
        return rc;
    }
    *out = g;
    return 0;
}

/* One file, mapped and parsed. */
static int open_one(const char *path, fmoe_gguf **out) {
    const int fd = fmoe__open_regular(path);
    if (fd < 0) return fd;
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        const int e = errno;
        close(fd);
        return fmoe_error_set(FMOE_EIO, "%s: stat: %s", path, strerror(e));
    }
    const uint64_t size = (uint64_t)sb.st_size;
    void *map = NULL;
    if (size > 0) {
        map = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            const int e = errno;
            close(fd);
            return fmoe_error_set(FMOE_EIO, "%s: mmap: %s", path, strerror(e));
        }
    }
    close(fd);
    static const uint8_t empty[1];
    fmoe_gguf *g;
    int rc = fmoe_gguf_parse(map ? map : empty, size, path, &g);
    if (rc < 0) {
        if (map) munmap(map, (size_t)size);
        return rc;
    }
    g->map = map;
    g->map_size = size;
    *out = g;
    return 0;
}

/* ---------------------------------------------------------------------------------- */
/* Split models                                                                       */
/* ---------------------------------------------------------------------------------- */

/* The shard suffix llama.cpp's llama_split_path writes: "-%05d-of-%05d.gguf", 1-based. */
static void shard_suffix(char *buf, size_t cap, int64_t no, int64_t count) {
    snprintf(buf, cap, "-%05d-of-%05d.gguf", (int)no + 1, (int)count); /* count <= 99999 */
}

#define SHARD_SUFFIX_LEN 20 /* strlen("-00001-of-00003.gguf") */

/* The number of five decimal digits at s, or -1. */
static int32_t five_digits(const char *s) {
    int32_t v = 0;
    for (int k = 0; k < 5; k++) {
        if (s[k] < '0' || s[k] > '9') return -1;
        v = v * 10 + (s[k] - '0');
    }
    return v;
}

int32_t fmoe_gguf_split_path(const char *path, int32_t i, char *buf, size_t cap) {
    const size_t len = path ? strlen(path) : 0;
    if (len < SHARD_SUFFIX_LEN) return 0;
    const char *sfx = path + len - SHARD_SUFFIX_LEN;
    if (sfx[0] != '-' || memcmp(sfx + 6, "-of-", 4) != 0 || strcmp(sfx + 15, ".gguf") != 0)
        return 0;
    const int32_t k = five_digits(sfx + 1), n = five_digits(sfx + 10);
    if (k < 1 || n < 2 || k > n || i < 0 || i >= n || len + 1 > cap) return 0;
    char sfx_i[40];
    shard_suffix(sfx_i, sizeof sfx_i, i, n); /* SHARD_SUFFIX_LEN bytes: n <= 99999 */
    memcpy(buf, path, len - SHARD_SUFFIX_LEN);
    memcpy(buf + len - SHARD_SUFFIX_LEN, sfx_i, SHARD_SUFFIX_LEN + 1);
    return n;
}

/* split.no and split.count of a shard; *count 0 when the file has no split.count. */
static int split_keys(const fmoe_gguf *g, int64_t *no, int64_t *count) {
    *no = 0;
    *count = 0;
    if (!fmoe_gguf_find_kv(g, "split.count")) return 0;
    FMOE_FORWARD_IF_ERROR(fmoe_gguf_get_int(g, "split.count", count));
    FMOE_FORWARD_IF_ERROR(fmoe_gguf_get_int(g, "split.no", no));
    FMOE_RETURN_ERROR_IF(*count < 1 || *count > 99999 || *no < 0 || *no >= *count, FMOE_EFORMAT,
                         "%s: split.no %lld and split.count %lld do not name a shard", g->path,
                         (long long)*no, (long long)*count);
    return 0;
}

/* 1 when two keys hold the same value: type, element type, count and bytes (strings by
 * their content). */
static int kv_equal(const fmoe_gguf_kv *a, const fmoe_gguf_kv *b) {
    if (a->type != b->type || a->elem != b->elem || a->count != b->count) return 0;
    if (a->elem != FMOE_GGUF_STRING)
        return memcmp(a->data, b->data, (size_t)a->count * (size_t)value_size(a->elem)) == 0;
    for (uint64_t i = 0; i < a->count; i++)
        if (a->strs[i].len != b->strs[i].len ||
            memcmp(a->strs[i].ptr, b->strs[i].ptr, (size_t)a->strs[i].len) != 0)
            return 0;
    return 1;
}

/* Checks that shard s (0-based no `i`) belongs to the split model whose shard 1 is g: its
 * split.no and split.count; then what ties it to shard 1, since nothing else in the format
 * does (llama.cpp checks split.no alone): the same GGUF version, split.tensors.count, and
 * every key the two both carry of one value (writers copy into later shards, if anything,
 * the keys of shard 1). A shard of another model is refused when any of these differs; one
 * of the same config, split the same way, that agrees on all of them (the same tensors,
 * other weights) is not told apart (docs/quantization.md). */
static int check_shard(const fmoe_gguf *g, const fmoe_gguf *s, int64_t i, int64_t count,
                       int64_t total) {
    int64_t sno = 0, scount = 0;
    FMOE_FORWARD_IF_ERROR(split_keys(s, &sno, &scount));
    FMOE_RETURN_ERROR_IF(sno != i || scount != count, FMOE_EFORMAT,
                         "%s: says it is shard %lld of %lld, expected shard %lld of %lld "
                         "(the split model %s)",
                         s->path, (long long)sno + 1, (long long)scount, (long long)i + 1,
                         (long long)count, g->path);
    FMOE_RETURN_ERROR_IF(s->version != g->version, FMOE_EFORMAT,
                         "%s: offset 4: GGUF version %u, but shard 1 (%s) is version %u: a "
                         "shard of another model",
                         s->path, s->version, g->path, g->version);
    const fmoe_gguf_kv *tc = fmoe_gguf_find_kv(s, "split.tensors.count");
    int64_t stotal = 0;
    FMOE_RETURN_ERROR_IF(!tc, FMOE_EFORMAT,
                         "%s: no key split.tensors.count, which every shard of a split model "
                         "carries (the split model %s)",
                         s->path, g->path);
    FMOE_FORWARD_IF_ERROR(fmoe_gguf_get_int(s, "split.tensors.count", &stotal));
    FMOE_RETURN_ERROR_IF(stotal != total, FMOE_EFORMAT,
                         "%s: offset %llu: split.tensors.count is %lld, but shard 1 (%s) says "
                         "%lld: a shard of another model",
                         s->path, (unsigned long long)tc->offset, (long long)stotal, g->path,
                         (long long)total);
    for (int64_t k = 0; k < s->n_kv; k++) {
        const fmoe_gguf_kv *kv = &s->kvs[k];
        if (strcmp(kv->key, "split.no") == 0) continue;
        const fmoe_gguf_kv *first = fmoe_gguf_find_kv(g, kv->key);
        FMOE_RETURN_ERROR_IF(first && !kv_equal(first, kv), FMOE_EFORMAT,
                             "%s: offset %llu: key %s differs from shard 1's (%s, offset %llu): "
                             "a shard of another model",
                             s->path, (unsigned long long)kv->offset, kv->key, g->path,
                             (unsigned long long)first->offset);
    }
    return 0;
}

/* Joins g's shards 2..N, opened into g->shards (g->n_shards set) and each checked against
 * shard 1 (check_shard): the tensors summed against split.tensors.count, then moved into g
 * and no name allowed in two shards. */
static int join_shards(fmoe_gguf *g, int64_t total) {
    const int64_t count = g->n_shards;
    int64_t n = g->n_tensors;
    for (int64_t i = 1; i < count; i++) n += g->shards[i - 1]->n_tensors;
    FMOE_RETURN_ERROR_IF(n != total, FMOE_EFORMAT,
                         "%s: the %lld shards hold %lld tensors, split.tensors.count says %lld",
                         g->path, (long long)count, (long long)n, (long long)total);
    /* One tensor array: shard 1's, then each shard's, their names moved here. */
    fmoe_gguf_tensor *all = realloc(g->tensors, (size_t)(n ? n : 1) * sizeof *all);
    FMOE_RETURN_ERROR_IF(!all, FMOE_ENOMEM, "%s: out of memory", g->path);
    g->tensors = all;
    for (int32_t k = 0; k < g->n_shards - 1; k++) {
        fmoe_gguf *s = g->shards[k];
        for (int64_t i = 0; i < s->n_tensors; i++) {
            all[g->n_tensors] = s->tensors[i];
            all[g->n_tensors].shard = k + 1;
            s->tensors[i].name = NULL;
            g->n_tensors++;
        }
    }
    int64_t *idx = realloc(g->tensor_by_name, (size_t)(n ? n : 1) * sizeof *idx);
    if (idx) g->tensor_by_name = idx;
    int64_t *tmp = calloc((size_t)(n ? n : 1), sizeof *tmp);
    if (!idx || !tmp) {
        free(tmp);
        return fmoe_error_set(FMOE_ENOMEM, "%s: out of memory", g->path);
    }
    for (int64_t i = 0; i < n; i++) idx[i] = i;
    sort_index(g, idx, tmp, n, by_name);
    free(tmp);
    for (int64_t i = 1; i < n; i++) {
        const fmoe_gguf_tensor *a = &all[idx[i - 1]], *b = &all[idx[i]];
        FMOE_RETURN_ERROR_IF(strcmp(a->name, b->name) == 0, FMOE_EFORMAT,
                             "%s: tensor %s is in two shards, %s and %s", g->path, a->name,
                             a->file, b->file);
    }
    return 0;
}

/* split.count and split.tensors.count of shard 1 (g); *count <= 1: a single file, or a
 * "split" of one shard, nothing to join. Another shard than the first is refused. */
static int split_of_first(const fmoe_gguf *g, int64_t *count, int64_t *total) {
    int64_t no = 0;
    *total = 0;
    FMOE_FORWARD_IF_ERROR(split_keys(g, &no, count));
    if (*count <= 1) return 0;
    if (no != 0) {
        /* llama.cpp, too, loads a split model from its first shard. */
        char want[40], first[40];
        shard_suffix(want, sizeof want, no, *count);
        shard_suffix(first, sizeof first, 0, *count);
        const size_t len = strlen(g->path), wl = strlen(want);
        const int named = len > wl && strcmp(g->path + len - wl, want) == 0;
        return fmoe_error_set(FMOE_EFORMAT,
                              "%s: shard %lld of %lld of a split model; give the first shard, "
                              "%.*s%s",
                              g->path, (long long)no + 1, (long long)*count,
                              named ? (int)(len - wl) : 6, named ? g->path : "PREFIX", first);
    }
    return fmoe_gguf_get_int(g, "split.tensors.count", total);
}

/* Opens shards 2..N of the split model whose shard 1 is g and moves their tensors into g. */
static int open_shards(fmoe_gguf *g) {
    int64_t count = 0, total = 0;
    FMOE_FORWARD_IF_ERROR(split_of_first(g, &count, &total));
    if (count <= 1) return 0;
    char want[40];
    shard_suffix(want, sizeof want, 0, count);
    const size_t len = strlen(g->path), wl = strlen(want);
    FMOE_RETURN_ERROR_IF(len <= wl || strcmp(g->path + len - wl, want) != 0, FMOE_EFORMAT,
                         "%s: shard 1 of %lld of a split model, but its name does not end in "
                         "%s, so the other shards cannot be found",
                         g->path, (long long)count, want);
    g->shards = calloc((size_t)count - 1, sizeof *g->shards);
    char *path = malloc(len + 1);
    int rc = 0;
    if (!g->shards || !path) {
        rc = fmoe_error_set(FMOE_ENOMEM, "%s: out of memory", g->path);
        goto done;
    }
    g->n_shards = (int32_t)count;
    for (int64_t i = 1; i < count; i++) {
        memcpy(path, g->path, len - wl);
        shard_suffix(path + len - wl, wl + 1, i, count);
        struct stat sb;
        if (stat(path, &sb) != 0) {
            rc = fmoe_error_set(FMOE_EIO, "%s: shard %lld of %lld is missing: %s: %s", g->path,
                                (long long)i + 1, (long long)count, path, strerror(errno));
            goto done;
        }
        if ((rc = open_one(path, &g->shards[i - 1])) < 0) goto done;
        if ((rc = check_shard(g, g->shards[i - 1], i, count, total)) < 0) goto done;
    }
    rc = join_shards(g, total);
done:
    free(path);
    return rc;
}

int fmoe_gguf_open(const char *path, fmoe_gguf **out) {
    fmoe_gguf *g;
    FMOE_FORWARD_IF_ERROR(open_one(path, &g));
    const int rc = open_shards(g);
    if (rc < 0) {
        fmoe_gguf_close(g);
        return rc;
    }
    *out = g;
    return 0;
}

int fmoe_gguf_parse_split(const void *const *bytes, const uint64_t *sizes, int32_t n,
                          const char *name, fmoe_gguf **out) {
    FMOE_RETURN_ERROR_IF(n < 1 || !bytes || !sizes, FMOE_EINVAL, "%s: no shards given",
                         name ? name : "gguf");
    fmoe_gguf *g;
    FMOE_FORWARD_IF_ERROR(fmoe_gguf_parse(bytes[0], sizes[0], name, &g));
    int64_t count = 0, total = 0;
    int rc = split_of_first(g, &count, &total);
    const size_t cap = strlen(g->path) + 32;
    char *path = malloc(cap);
    if (rc < 0) goto fail;
    if (!path) {
        rc = fmoe_error_set(FMOE_ENOMEM, "%s: out of memory", g->path);
        goto fail;
    }
    if ((count > 1 ? count : 1) != n) {
        rc = fmoe_error_set(FMOE_EFORMAT, "%s: %d shards given, but split.count says %lld",
                            g->path, (int)n, (long long)(count > 1 ? count : 1));
        goto fail;
    }
    if (count <= 1) {
        free(path);
        *out = g;
        return 0;
    }
    if (!(g->shards = calloc((size_t)count - 1, sizeof *g->shards))) {
        rc = fmoe_error_set(FMOE_ENOMEM, "%s: out of memory", g->path);
        goto fail;
    }
    g->n_shards = (int32_t)count;
    for (int32_t i = 1; i < n; i++) {
        if (fmoe_gguf_split_path(g->path, i, path, cap) == 0)
            snprintf(path, cap, "%s (shard %d)", g->path, (int)i + 1);
        if ((rc = fmoe_gguf_parse(bytes[i], sizes[i], path, &g->shards[i - 1])) < 0) goto fail;
        if ((rc = check_shard(g, g->shards[i - 1], i, count, total)) < 0) goto fail;
    }
    if ((rc = join_shards(g, total)) < 0) goto fail;
    free(path);
    *out = g;
    return 0;
fail:
    free(path);
    fmoe_gguf_close(g);
    return rc;
}

/* madvise(MADV_DONTNEED) of the pages [p, p + n) covers whole, inside [map, map + size). */
static void release_in(void *map, uint64_t size, const void *p, size_t n) {
    const uintptr_t lo = (uintptr_t)map, hi = lo + (uintptr_t)size, a = (uintptr_t)p;
    if (!map || a < lo || a + n > hi) return;
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t first = (a + page - 1) / page * page, last = (a + n) / page * page;
    if (last > first) madvise((void *)first, (size_t)(last - first), MADV_DONTNEED);
}

void fmoe_gguf_release_range(fmoe_gguf *g, const void *p, size_t n) {
    if (!g) return;
    release_in(g->map, g->map_size, p, n);
    for (int32_t i = 0; g->shards && i < g->n_shards - 1; i++)
        fmoe_gguf_release_range(g->shards[i], p, n);
}

void fmoe_gguf_release_pages(fmoe_gguf *g) {
    if (!g) return;
    if (g->map) madvise(g->map, (size_t)g->map_size, MADV_DONTNEED);
    for (int32_t i = 0; g->shards && i < g->n_shards - 1; i++) fmoe_gguf_release_pages(g->shards[i]);
}

void fmoe_gguf_populate_pages(fmoe_gguf *g) {
    if (!g) return;
    if (g->map) fmoe__populate_read(g->map, (size_t)g->map_size);
    for (int32_t i = 0; g->shards && i < g->n_shards - 1; i++) fmoe_gguf_populate_pages(g->shards[i]);
}

void fmoe_gguf_close(fmoe_gguf *g) {
    if (!g) return;
    if (g->map) munmap(g->map, (size_t)g->map_size);
    free_contents(g);
    free(g);
}

/* ---------------------------------------------------------------------------------- */
/* Accessors                                                                          */
/* ---------------------------------------------------------------------------------- */

uint32_t fmoe_gguf_version(const fmoe_gguf *g) { return g->version; }
uint32_t fmoe_gguf_alignment(const fmoe_gguf *g) { return g->alignment; }
uint64_t fmoe_gguf_data_offset(const fmoe_gguf *g) { return g->data_offset; }
const char *fmoe_gguf_name(const fmoe_gguf *g) { return g->path; }
int32_t fmoe_gguf_shard_count(const fmoe_gguf *g) { return g->n_shards; }

const char *fmoe_gguf_shard_name(const fmoe_gguf *g, int32_t i) {
    if (i == 0) return g->path;
    return i > 0 && i < g->n_shards && g->shards[i - 1] ? g->shards[i - 1]->path : NULL;
}
int64_t fmoe_gguf_kv_count(const fmoe_gguf *g) { return g->n_kv; }
int64_t fmoe_gguf_tensor_count(const fmoe_gguf *g) { return g->n_tensors; }

const fmoe_gguf_kv *fmoe_gguf_kv_at(const fmoe_gguf *g, int64_t i) {
    return i >= 0 && i < g->n_kv ? &g->kvs[i] : NULL;
}

const fmoe_gguf_tensor *fmoe_gguf_tensor_at(const fmoe_gguf *g, int64_t i) {
    return i >= 0 && i < g->n_tensors ? &g->tensors[i] : NULL;
}

const fmoe_gguf_kv *fmoe_gguf_find_kv(const fmoe_gguf *g, const char *key) {
    int64_t lo = 0, hi = g->n_kv;
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        const int c = strcmp(g->kvs[g->kv_by_key[mid]].key, key);
        if (c == 0) return &g->kvs[g->kv_by_key[mid]];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

const fmoe_gguf_tensor *fmoe_gguf_find_tensor(const fmoe_gguf *g, const char *name) {
    int64_t lo = 0, hi = g->n_tensors;
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        const int c = strcmp(g->tensors[g->tensor_by_name[mid]].name, name);
        if (c == 0) return &g->tensors[g->tensor_by_name[mid]];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

/* Element i of a fixed-size value as int64 (integers and bool) or double. */
static int elem_int(const fmoe_gguf_kv *kv, uint64_t i, int64_t *out) {
    if (!kv->data || i >= kv->count) return -1; /* strings (and empty arrays) have no data */
    const uint8_t *p = (const uint8_t *)kv->data + i * (uint64_t)value_size(kv->elem);
    switch (kv->elem) {
    case FMOE_GGUF_UINT8: *out = p[0]; return 0;
    case FMOE_GGUF_BOOL: *out = p[0] != 0; return 0;
    case FMOE_GGUF_INT8: *out = (int8_t)p[0]; return 0;
    case FMOE_GGUF_UINT16: { uint16_t v; memcpy(&v, p, 2); *out = v; return 0; }
    case FMOE_GGUF_INT16: { int16_t v; memcpy(&v, p, 2); *out = v; return 0; }
    case FMOE_GGUF_UINT32: { uint32_t v; memcpy(&v, p, 4); *out = v; return 0; }
    case FMOE_GGUF_INT32: { int32_t v; memcpy(&v, p, 4); *out = v; return 0; }
    case FMOE_GGUF_INT64: { int64_t v; memcpy(&v, p, 8); *out = v; return 0; }
    case FMOE_GGUF_UINT64: {
        uint64_t v;
        memcpy(&v, p, 8);
        if (v > (uint64_t)INT64_MAX) return -1;
        *out = (int64_t)v;
        return 0;
    }
    default: return -1;
    }
}

double fmoe_gguf_kv_number(const fmoe_gguf_kv *kv, uint64_t i) {
    if (i >= kv->count || !kv->data) return 0;
    const uint8_t *p = (const uint8_t *)kv->data + i * (uint64_t)value_size(kv->elem);
    if (kv->elem == FMOE_GGUF_FLOAT32) { float v; memcpy(&v, p, 4); return v; }
    if (kv->elem == FMOE_GGUF_FLOAT64) { double v; memcpy(&v, p, 8); return v; }
    if (kv->elem == FMOE_GGUF_UINT64) { uint64_t v; memcpy(&v, p, 8); return (double)v; }
    int64_t v;
    return elem_int(kv, i, &v) == 0 ? (double)v : 0;
}

static int scalar(const fmoe_gguf *g, const char *key, const fmoe_gguf_kv **out) {
    const fmoe_gguf_kv *kv = fmoe_gguf_find_kv(g, key);
    FMOE_RETURN_ERROR_IF(!kv, FMOE_ENOTFOUND, "%s: missing key %s", g->path, key);
    FMOE_RETURN_ERROR_IF(kv->type == FMOE_GGUF_ARRAY, FMOE_EFORMAT,
                         "%s: key %s is an array, expected one value", g->path, key);
    *out = kv;
    return 0;
}

int fmoe_gguf_get_int(const fmoe_gguf *g, const char *key, int64_t *out) {
    const fmoe_gguf_kv *kv = NULL;
    FMOE_FORWARD_IF_ERROR(scalar(g, key, &kv));
    FMOE_RETURN_ERROR_IF(elem_int(kv, 0, out) != 0, FMOE_EFORMAT,
                         "%s: key %s is %s, expected an integer", g->path, key,
                         fmoe_gguf_value_type_name(kv->type));
    return 0;
}

int fmoe_gguf_get_float(const fmoe_gguf *g, const char *key, double *out) {
    const fmoe_gguf_kv *kv = NULL;
    FMOE_FORWARD_IF_ERROR(scalar(g, key, &kv));
    FMOE_RETURN_ERROR_IF(kv->type == FMOE_GGUF_STRING, FMOE_EFORMAT,
                         "%s: key %s is STRING, expected a number", g->path, key);
    *out = fmoe_gguf_kv_number(kv, 0);
    return 0;
}

int fmoe_gguf_get_str(const fmoe_gguf *g, const char *key, fmoe_gguf_str *out) {
    const fmoe_gguf_kv *kv = NULL;
    FMOE_FORWARD_IF_ERROR(scalar(g, key, &kv));
    FMOE_RETURN_ERROR_IF(kv->type != FMOE_GGUF_STRING, FMOE_EFORMAT,
                         "%s: key %s is %s, expected STRING", g->path, key,
                         fmoe_gguf_value_type_name(kv->type));
    *out = kv->strs[0];
    return 0;
}

int fmoe_gguf_get_file(const fmoe_gguf *g, const char *name, char **data, size_t *len) {
    *data = NULL;
    *len = 0;
    char key[128];
    snprintf(key, sizeof key, "fmoe.file.%s", name);
    const fmoe_gguf_kv *kv = fmoe_gguf_find_kv(g, key);
    if (!kv) return 1;
    fmoe_gguf_str s;
    FMOE_FORWARD_IF_ERROR(fmoe_gguf_get_str(g, key, &s));
    char *copy = malloc((size_t)s.len + 1);
    if (!copy) return fmoe_error_set(FMOE_ENOMEM, "%s: out of memory for %s", g->path, key);
    memcpy(copy, s.ptr, (size_t)s.len);
    copy[s.len] = '\0';
    *data = copy;
    *len = (size_t)s.len;
    return 0;
}

int fmoe_gguf_is_file(const char *path) {
    const int fd = fmoe__open_regular(path);
    if (fd < 0) {
        fmoe_error_clear();
        return 0;
    }
    char magic[4];
    const int yes = fmoe__pread_all(fd, magic, 4, 0) == 0 && memcmp(magic, "GGUF", 4) == 0;
    close(fd);
    return yes;
}

int fmoe_gguf_get_tensor(const fmoe_gguf *g, const char *name, int32_t ndim, const int64_t *ne,
                         const fmoe_gguf_tensor **out) {
    const fmoe_gguf_tensor *t = fmoe_gguf_find_tensor(g, name);
    FMOE_RETURN_ERROR_IF(!t, FMOE_ENOTFOUND, "%s: missing tensor %s", g->path, name);
    FMOE_RETURN_ERROR_IF(!fmoe_quant_supported(t->type), FMOE_EUNSUPPORTED,
                         "%s: tensor %s has type %s; fmoe computes with F32, F16, BF16, Q8_0, "
                         "Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, "
                         "MXFP4, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M",
                         g->path, name, fmoe_ggml_type_name(t->type));
    int ok = t->ndim == ndim;
    for (int32_t d = 0; ok && d < ndim; d++) ok = ne[d] < 0 || ne[d] == t->ne[d];
    if (!ok) {
        char got[96], want[96];
        int n = 0, m = 0;
        for (int32_t d = 0; d < t->ndim; d++)
            n += snprintf(got + n, sizeof got - (size_t)n, "%s%lld", d ? "," : "", (long long)t->ne[d]);
        for (int32_t d = 0; d < ndim; d++)
            m += snprintf(want + m, sizeof want - (size_t)m, "%s%lld", d ? "," : "", (long long)ne[d]);
        return fmoe_error_set(FMOE_EMISMATCH, "%s: tensor %s has extents [%s], expected [%s]",
                              g->path, name, got, want);
    }
    *out = t;
    return 0;
}
