/*
 * st_writer.h - writes safetensors files and tiny model directories for the C tests
 * (header-only, test code). A file is built tensor by tensor into a growing header and
 * data buffer; raw_file() writes arbitrary header text and data for malformed cases.
 */
#ifndef FMOE_TEST_ST_WRITER_H
#define FMOE_TEST_ST_WRITER_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "half.h"

typedef struct st_builder {
    char header[1 << 16];
    size_t hlen;
    uint8_t *data;
    size_t dlen, dcap;
} st_builder;

static inline void stb_init(st_builder *b) {
    memset(b, 0, sizeof *b);
    b->hlen = (size_t)snprintf(b->header, sizeof b->header, "{");
}

static inline void stb_free(st_builder *b) { free(b->data); }

/* Adds a tensor with `nbytes` of data from `bytes` (NULL: zeros). shape has ndim entries. */
static inline void stb_add(st_builder *b, const char *name, const char *dtype, int ndim,
                           const int64_t *shape, const void *bytes, size_t nbytes) {
    if (b->dlen + nbytes > b->dcap) {
        b->dcap = (b->dlen + nbytes) * 2 + 64;
        b->data = realloc(b->data, b->dcap);
    }
    if (bytes)
        memcpy(b->data + b->dlen, bytes, nbytes);
    else
        memset(b->data + b->dlen, 0, nbytes);
    b->hlen += (size_t)snprintf(b->header + b->hlen, sizeof b->header - b->hlen,
                                "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", b->hlen > 1 ? "," : "",
                                name, dtype);
    for (int i = 0; i < ndim; i++)
        b->hlen += (size_t)snprintf(b->header + b->hlen, sizeof b->header - b->hlen,
                                    i ? ",%lld" : "%lld", (long long)shape[i]);
    b->hlen += (size_t)snprintf(b->header + b->hlen, sizeof b->header - b->hlen,
                                "],\"data_offsets\":[%zu,%zu]}", b->dlen, b->dlen + nbytes);
    b->dlen += nbytes;
}

/* Adds float values as F32, BF16 or F16. */
static inline void stb_add_f(st_builder *b, const char *name, const char *dtype, int ndim,
                             const int64_t *shape, const float *v) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    if (strcmp(dtype, "F32") == 0) {
        stb_add(b, name, dtype, ndim, shape, v, (size_t)n * 4);
        return;
    }
    uint16_t *h = malloc((size_t)(n ? n : 1) * 2);
    for (int64_t i = 0; i < n; i++)
        h[i] = strcmp(dtype, "BF16") == 0 ? fmoe_float_to_bf16(v[i]) : fmoe_float_to_half(v[i]);
    stb_add(b, name, dtype, ndim, shape, h, (size_t)n * 2);
    free(h);
}

/* Writes u64 header length + header + data; `pad` spaces are appended to the header. */
static inline int raw_file(const char *path, const char *header, size_t hlen, const void *data,
                           size_t dlen) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    uint8_t len[8];
    for (int i = 0; i < 8; i++) len[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    fwrite(len, 1, 8, f);
    fwrite(header, 1, hlen, f);
    if (dlen) fwrite(data, 1, dlen, f);
    return fclose(f);
}

/* Writes the built file; `pad_to` > 0 pads the header with spaces to a multiple of it
 * (safetensors writers use 8); `extra_pad` adds that many spaces more (misalignment). */
static inline int stb_write(st_builder *b, const char *path, int pad_to, int extra_pad) {
    char *h = malloc(b->hlen + 64);
    size_t n = (size_t)snprintf(h, b->hlen + 64, "%s}", b->header);
    while (pad_to > 0 && n % (size_t)pad_to) h[n++] = ' ';
    for (int i = 0; i < extra_pad; i++) h[n++] = ' ';
    int rc = raw_file(path, h, n, b->data, b->dlen);
    free(h);
    return rc;
}

static inline int write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fputs(text, f);
    return fclose(f);
}

/* A fresh empty directory under $TMPDIR (or /tmp). */
static inline void make_tmpdir(char *out, size_t cap, const char *tag) {
    const char *t = getenv("TMPDIR");
    snprintf(out, cap, "%s/fmoe-%s-XXXXXX", t && t[0] ? t : "/tmp", tag);
    if (!mkdtemp(out)) out[0] = '\0';
}

/* Removes a directory's plain files and the directory (test cleanup). */
static inline void remove_tree(const char *dir) {
    char cmd[1100];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) { /* best effort */
    }
}

#endif
