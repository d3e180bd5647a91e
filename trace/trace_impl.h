/*
 * trace_impl.h - internals shared by the trace writer and reader (trace/trace_*.c).
 */
#ifndef FMOE_TRACE_IMPL_H
#define FMOE_TRACE_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "fmoe/trace.h"

/* Probabilities are checked against [0, 1] with this much slack: a float32 softmax can
 * land a hair above 1, and half precision rounds by up to 2^-11 near 1. */
#define FMOE_TRACE_PROB_TOL 1e-3f

/* Limits that keep every per-token size well inside 64 bits and every chunk inside what
 * HDF5 can store; far beyond any real model. */
#define FMOE_TRACE_MAX_LAYERS 65535
#define FMOE_TRACE_MAX_EXPERTS 65535 /* expert ids are uint16 */
#define FMOE_TRACE_MAX_SEMANTIC (1 << 24)

/* Checks header values (L, J, K > 0, K <= J, J <= 65535, enums, strings terminated and
 * UTF-8, ...). On failure returns `code` with a detail "<path>: <field> ...". The writer
 * passes FMOE_EINVAL ("header.top_k"), the reader FMOE_EFORMAT with is_file set, which
 * names fields as the file's attributes ("/: attribute top_k"). */
int fmoe__trace_header_check(const fmoe_trace_header *h, const char *path, int code, int is_file);

/* fmoe_trace_reader_open and fmoe_store_read on an HDF5 file image in memory (`size`
 * bytes, copied) instead of a path, through HDF5's core driver; `name` labels the details.
 * For the fuzz targets (tests/fuzz); same returns as the path versions. */
int fmoe__trace_reader_open_image(fmoe_trace_reader **out, const void *image, size_t size,
                                  const char *name);
struct fmoe_store_file;
int fmoe__store_read_image(const void *image, size_t size, const char *name, int32_t max_batch,
                           struct fmoe_store_file **out);

/* "none" | "topk" | "full" -> kind. @return 0 or -1. */
int fmoe__probs_kind_parse(const char *name, fmoe_probs_kind *out);

/* 1 when s[0..n) is well-formed UTF-8. */
int fmoe__utf8_valid(const char *s, size_t n);

/* Formats dims[rank] as "[a,b,c]" into buf[cap]; returns buf. */
const char *fmoe__dims_str(char *buf, size_t cap, int rank, const int64_t *dims);

/* 1 when the K ids of row[K] are pairwise distinct. */
static inline int fmoe__experts_distinct(const uint16_t *row, int32_t k) {
    for (int32_t a = 1; a < k; a++)
        for (int32_t b = 0; b < a; b++)
            if (row[a] == row[b]) return 0;
    return 1;
}

#endif
