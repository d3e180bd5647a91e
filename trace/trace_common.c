/* trace_common.c - names, header validation and format sniffing shared by trace/. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "fmoe/error.h"
#include "fmoe/trace.h"
#include "hdf5_util.h"
#include "trace_impl.h"

int fmoe_compression_parse(const char *name, fmoe_compression *out) {
    static const struct {
        const char *name;
        fmoe_compression c;
    } names[] = {
        {"zstd", FMOE_COMPRESSION_ZSTD},
        {"deflate", FMOE_COMPRESSION_DEFLATE},
        {"none", FMOE_COMPRESSION_NONE},
    };
    for (size_t i = 0; name && i < sizeof names / sizeof names[0]; i++) {
        if (strcmp(name, names[i].name) == 0) {
            *out = names[i].c;
            return 0;
        }
    }
    return fmoe_error_set(FMOE_EINVAL, "unknown compression '%s', expected zstd, deflate or none",
                          name ? name : "(null)");
}

const char *fmoe_probs_kind_name(fmoe_probs_kind k) {
    switch (k) {
    case FMOE_PROBS_NONE: return "none";
    case FMOE_PROBS_TOPK: return "topk";
    case FMOE_PROBS_FULL: return "full";
    }
    return "unknown";
}

int fmoe__probs_kind_parse(const char *name, fmoe_probs_kind *out) {
    for (int k = FMOE_PROBS_NONE; k <= FMOE_PROBS_FULL; k++) {
        if (strcmp(name, fmoe_probs_kind_name((fmoe_probs_kind)k)) == 0) {
            *out = (fmoe_probs_kind)k;
            return 0;
        }
    }
    return -1;
}

int fmoe__utf8_valid(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        unsigned c = p[i];
        size_t len;
        unsigned min;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xe0) == 0xc0) {
            len = 2, min = 0x80, c &= 0x1f;
        } else if ((c & 0xf0) == 0xe0) {
            len = 3, min = 0x800, c &= 0x0f;
        } else if ((c & 0xf8) == 0xf0) {
            len = 4, min = 0x10000, c &= 0x07;
        } else {
            return 0;
        }
        if (n - i < len) return 0;
        for (size_t k = 1; k < len; k++) {
            if ((p[i + k] & 0xc0) != 0x80) return 0;
            c = (c << 6) | (p[i + k] & 0x3f);
        }
        /* Overlong forms, surrogates and values past U+10FFFF are not UTF-8. */
        if (c < min || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff)) return 0;
        i += len;
    }
    return 1;
}

const char *fmoe__dims_str(char *buf, size_t cap, int rank, const int64_t *dims) {
    size_t at = 0;
    buf[0] = '\0';
    for (int i = 0; i < rank && at < cap; i++) {
        int w = snprintf(buf + at, cap - at, "%s%lld", i ? "," : "[", (long long)dims[i]);
        if (w < 0) break;
        at += (size_t)w;
    }
    if (at < cap) snprintf(buf + at, cap - at, rank ? "]" : "[]");
    return buf;
}

/* ---------------------------------------------------------------------------------------
 * Header validation
 * ------------------------------------------------------------------------------------- */

typedef struct check_ctx {
    const char *path;
    int code;
    int is_file;
} check_ctx;

static int bad_field(const check_ctx *c, const char *field, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static int bad_field(const check_ctx *c, const char *field, const char *fmt, ...) {
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (c->is_file)
        return fmoe_error_set(c->code, "%s: /: attribute %s = %s", c->path, field, what);
    return fmoe_error_set(c->code, "%s: header.%s = %s", c->path, field, what);
}

static int check_string(const check_ctx *c, const char *field, const char *s, size_t cap) {
    const char *end = memchr(s, '\0', cap);
    if (!end) {
        if (c->is_file)
            return fmoe_error_set(c->code, "%s: /: attribute %s is not terminated", c->path, field);
        return fmoe_error_set(c->code, "%s: header.%s is not NUL-terminated within %zu bytes",
                              c->path, field, cap);
    }
    if (!fmoe__utf8_valid(s, (size_t)(end - s))) {
        if (c->is_file)
            return fmoe_error_set(c->code, "%s: /: attribute %s is not valid UTF-8", c->path,
                                  field);
        return fmoe_error_set(c->code, "%s: header.%s is not valid UTF-8", c->path, field);
    }
    return 0;
}

#define CHECK_STR(field) FMOE_FORWARD_IF_ERROR(check_string(&c, #field, h->field, sizeof h->field))

int fmoe__trace_header_check(const fmoe_trace_header *h, const char *path, int code, int is_file) {
    const check_ctx c = {path, code, is_file};
    if (h->num_layers < 1 || h->num_layers > FMOE_TRACE_MAX_LAYERS)
        return bad_field(&c, "num_layers", "%d, expected 1..%d", h->num_layers,
                         FMOE_TRACE_MAX_LAYERS);
    if (h->num_experts < 1 || h->num_experts > FMOE_TRACE_MAX_EXPERTS)
        return bad_field(&c, "num_experts", "%d, expected 1..%d", h->num_experts,
                         FMOE_TRACE_MAX_EXPERTS);
    if (h->top_k < 1 || h->top_k > h->num_experts)
        return bad_field(&c, "top_k", "%d, expected 1..num_experts (%d)", h->top_k, h->num_experts);
    if (h->hidden_size < 0)
        return bad_field(&c, "hidden_size", "%d, expected >= 0", h->hidden_size);
    if (h->shared_experts < 0)
        return bad_field(&c, "shared_experts", "%d, expected >= 0", h->shared_experts);
    if (h->expert_bytes < 0)
        return bad_field(&c, "expert_bytes", "%lld, expected >= 0", (long long)h->expert_bytes);
    if ((unsigned)h->probs_kind > FMOE_PROBS_FULL)
        return bad_field(&c, "probs_kind", "%d, expected none, topk or full", (int)h->probs_kind);
    if (h->probs_half != 0 && h->probs_half != 1)
        return bad_field(&c, "probs_half", "%d, expected 0 or 1", h->probs_half);
    if (h->semantic_dim < 0 || h->semantic_dim > FMOE_TRACE_MAX_SEMANTIC)
        return bad_field(&c, "semantic_dim", "%d, expected 0..%d", h->semantic_dim,
                         FMOE_TRACE_MAX_SEMANTIC);
    /* Depth s looks s layers ahead of layer l, so more than L - 1 has nothing to hold. */
    if (h->speculative_depth < 0 || h->speculative_depth > h->num_layers - 1)
        return bad_field(&c, "speculative_depth", "%d, expected 0..num_layers-1 (%d)",
                         h->speculative_depth, h->num_layers - 1);
    for (int32_t l = 0; h->layer_expert_bytes && l < h->num_layers; l++)
        if (h->layer_expert_bytes[l] < 1 || h->layer_expert_bytes[l] > h->expert_bytes)
            return bad_field(&c, "layer_expert_bytes",
                             "layer %d: %lld, expected 1..expert_bytes (%lld)", l,
                             (long long)h->layer_expert_bytes[l], (long long)h->expert_bytes);
    CHECK_STR(model_name);
    CHECK_STR(model_fingerprint);
    CHECK_STR(dtype);
    CHECK_STR(dataset);
    CHECK_STR(created);
    CHECK_STR(fmoe_version);
    CHECK_STR(recorded_on);
    CHECK_STR(semantic_kind);
    CHECK_STR(activations);
    if (h->activations[0] && strcmp(h->activations, "f32") != 0 &&
        strcmp(h->activations, "q8") != 0)
        return bad_field(&c, "activations", "'%s', expected f32 or q8", h->activations);
    return 0;
}

/* ---------------------------------------------------------------------------------------
 * Format sniffing
 * ------------------------------------------------------------------------------------- */

static int read_format(const char *path, char *out, size_t cap) {
    if (!path || !out || cap == 0)
        return fmoe_error_set(FMOE_EINVAL, "fmoe_hdf5_read_format: NULL path or empty buffer");
    FMOE_FORWARD_IF_ERROR(fmoe__h5_init());
    hid_t file = fmoe__h5_open_read(path, NULL, 0, "file");
    if (file < 0) return (int)file;
    int rc = fmoe__h5_attr_read_str(file, path, "/", "format", out, cap);
    H5Fclose(file);
    return rc;
}

/* ---------------------------------------------------------------------------------------
 * Public entry points: each holds the HDF5 lock (hdf5_util.h) for its whole call
 * ------------------------------------------------------------------------------------- */

int fmoe_hdf5_read_format(const char *path, char *out, size_t cap) {
    fmoe__h5_lock();
    int rc = read_format(path, out, cap);
    fmoe__h5_unlock();
    return rc;
}
