/*
 * datasets_impl.h - internals shared by the files of datasets/: whole-file reading, line
 * splitting, UTF-8 checks, and the pieces both trace importers need (the trace header
 * built from fmoe_import_options, and a growable array helper).
 */
#ifndef FMOE_DATASETS_IMPL_H
#define FMOE_DATASETS_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "fmoe/datasets.h"
#include "fmoe/trace.h"

/* Reads a whole file into a NUL-terminated buffer (owned by the caller, free()).
 * A UTF-8 byte-order mark at the start is skipped: *data points past it, and *base is the
 * pointer to free. @return 0, FMOE_EIO naming the path, FMOE_ENOMEM. */
int fmoe__ds_read_file(const char *path, char **base, const char **data, size_t *len);

/* One line of a buffer: [begin, begin + len), without "\n" or a trailing "\r". */
typedef struct fmoe__ds_line {
    const char *begin;
    size_t len;
    int64_t number; /* 1-based */
} fmoe__ds_line;

typedef struct fmoe__ds_line_iter {
    const char *p, *end;
    int64_t number;
} fmoe__ds_line_iter;

void fmoe__ds_line_iter_init(fmoe__ds_line_iter *it, const char *data, size_t len);
/* @return 1 with the next line in *line, 0 at the end. */
int fmoe__ds_line_next(fmoe__ds_line_iter *it, fmoe__ds_line *line);

/* 1 when the bytes are only spaces, tabs, "\r" and "\n" (or empty). */
int fmoe__ds_is_blank(const char *s, size_t len);

/* 1 when [s, s + len) is valid UTF-8 without NUL bytes; *bad = offset of the first bad
 * byte otherwise. */
int fmoe__ds_utf8_valid(const char *s, size_t len, size_t *bad);

/* The last path component ("a/b/c.jsonl" -> "c.jsonl"), borrowed from `path`. */
const char *fmoe__ds_basename(const char *path);

/* Grows *ptr (an array of `elem` bytes each, `*cap` of them) to hold at least `need`.
 * @return 0 or FMOE_ENOMEM (the old array stays valid). */
int fmoe__ds_grow(void **ptr, size_t elem, int64_t *cap, int64_t need);

/* Fills a trace header for an import from `opts` (geometry, model name, config json and
 * its fingerprint). @return 0 or an error (bad geometry, bad config json). */
int fmoe__ds_import_header(const fmoe_import_options *opts, const char *dataset,
                        const char *recorded_on, fmoe_probs_kind kind,
                        fmoe_trace_header *h);

/* Checks the geometry of `opts` is usable for an import (L, J, K in range, K <= J,
 * J <= 65536 for uint16 expert ids). */
int fmoe__ds_import_check_options(const fmoe_import_options *opts);

/* How far an imported row's probabilities may stray: a full distribution must sum to 1
 * within FMOE_IMPORT_SUM_TOL, a top-k row (the chosen experts' weights) to at most
 * 1 + FMOE_IMPORT_SUM_TOL, and each value lie in [0, 1 + 1e-3] (the trace's own
 * tolerance). The slack covers logs that print probabilities rounded to a few digits; a sum
 * like 1.8 or 7.2 is not a distribution, and is refused rather than renormalised, since no
 * rescaling recovers what the logger meant. */
#define FMOE_IMPORT_SUM_TOL 0.05
#define FMOE_IMPORT_VALUE_TOL 1e-3

/* Checks one row of n probabilities read from `path` line `lineno` (full: a whole
 * distribution over the experts; else the top-k weights). `what` names a value in
 * messages ("probs" -> "probs[3]", "expert_" -> "expert_3"). @return 0 or FMOE_ERANGE
 * "path:line: ...". */
int fmoe__ds_check_probs(const float *p, int32_t n, int full, const char *path, int64_t lineno,
                         const char *what);

#endif
