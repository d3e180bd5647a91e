/* util.c - file reading, line splitting, UTF-8 checks and import header helpers. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "datasets_impl.h"
#include "fmoe/error.h"
#include "files.h"
#include "fmoe/geometry.h"

/* A dataset file read whole: regular files only (lib/files.h), so its size is known before
 * the read; the limit refuses only what could not be held in memory anyway. */
#define MAX_DATASET_BYTES ((long long)16 << 30)

int fmoe__ds_read_file(const char *path, char **base, const char **data, size_t *len) {
    *base = NULL;
    *data = NULL;
    *len = 0;
    char *buf = NULL;
    size_t n = 0;
    FMOE_FORWARD_IF_ERROR(
        fmoe__read_file_bounded(path, "a dataset file", MAX_DATASET_BYTES, 0, &buf, &n));
    const char *d = buf;
    if (n >= 3 && (unsigned char)d[0] == 0xEF && (unsigned char)d[1] == 0xBB &&
        (unsigned char)d[2] == 0xBF) {
        d += 3;
        n -= 3;
    }
    *base = buf;
    *data = d;
    *len = n;
    return 0;
}

void fmoe__ds_line_iter_init(fmoe__ds_line_iter *it, const char *data, size_t len) {
    it->p = data;
    it->end = data + len;
    it->number = 0;
}

int fmoe__ds_line_next(fmoe__ds_line_iter *it, fmoe__ds_line *line) {
    if (it->p >= it->end) return 0;
    const char *b = it->p;
    const char *nl = memchr(b, '\n', (size_t)(it->end - b));
    const char *e = nl ? nl : it->end;
    it->p = nl ? nl + 1 : it->end;
    size_t n = (size_t)(e - b);
    if (n > 0 && b[n - 1] == '\r') n--;
    line->begin = b;
    line->len = n;
    line->number = ++it->number;
    return 1;
}

int fmoe__ds_is_blank(const char *s, size_t len) {
    for (size_t i = 0; i < len; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n') return 0;
    return 1;
}

int fmoe__ds_utf8_valid(const char *str, size_t len, size_t *bad) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < len) {
        unsigned c = s[i];
        size_t n;
        unsigned cp;
        if (c == 0) goto invalid;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xE0) == 0xC0) {
            n = 2;
            cp = c & 0x1F;
        } else if ((c & 0xF0) == 0xE0) {
            n = 3;
            cp = c & 0x0F;
        } else if ((c & 0xF8) == 0xF0) {
            n = 4;
            cp = c & 0x07;
        } else {
            goto invalid;
        }
        if (i + n > len) goto invalid;
        for (size_t k = 1; k < n; k++) {
            if ((s[i + k] & 0xC0) != 0x80) goto invalid;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        /* Overlong forms, surrogates and values beyond U+10FFFF are not UTF-8. */
        if ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) ||
            (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF)
            goto invalid;
        i += n;
    }
    return 1;
invalid:
    if (bad) *bad = i;
    return 0;
}

const char *fmoe__ds_basename(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

int fmoe__ds_grow(void **ptr, size_t elem, int64_t *cap, int64_t need) {
    if (need <= *cap) return 0;
    int64_t ncap = *cap > 0 ? *cap : 16;
    while (ncap < need) {
        if (ncap > INT64_MAX / 2) return fmoe_error_set(FMOE_ENOMEM, "array too large");
        ncap *= 2;
    }
    if ((uint64_t)ncap > SIZE_MAX / elem)
        return fmoe_error_set(FMOE_ENOMEM, "array of %lld elements too large", (long long)ncap);
    void *p = realloc(*ptr, (size_t)ncap * elem);
    if (!p)
        return fmoe_error_set(FMOE_ENOMEM, "cannot allocate %lld elements of %zu bytes",
                              (long long)ncap, elem);
    *ptr = p;
    *cap = ncap;
    return 0;
}

int fmoe__ds_import_check_options(const fmoe_import_options *opts) {
    FMOE_RETURN_ERROR_IF(!opts || !opts->geometry, FMOE_EINVAL, "import: no model geometry");
    const fmoe_model_geometry *g = opts->geometry;
    FMOE_RETURN_ERROR_IF(g->num_moe_layers < 1 || g->num_moe_layers > FMOE_MAX_LAYERS,
                         FMOE_EINVAL, "import: %d MoE layers (expected 1..%d)",
                         (int)g->num_moe_layers, FMOE_MAX_LAYERS);
    FMOE_RETURN_ERROR_IF(g->num_experts < 1 || g->num_experts > 65536, FMOE_EINVAL,
                         "import: %d experts (expected 1..65536)", (int)g->num_experts);
    FMOE_RETURN_ERROR_IF(g->top_k < 1 || g->top_k > g->num_experts, FMOE_EINVAL,
                         "import: top-k %d (expected 1..J = %d)", (int)g->top_k,
                         (int)g->num_experts);
    return 0;
}

static void copy_str(char *dst, size_t cap, const char *src) {
    snprintf(dst, cap, "%s", src ? src : "");
}

int fmoe__ds_import_header(const fmoe_import_options *opts, const char *dataset,
                        const char *recorded_on, fmoe_probs_kind kind,
                        fmoe_trace_header *h) {
    const fmoe_model_geometry *g = opts->geometry;
    memset(h, 0, sizeof *h);
    copy_str(h->model_name, sizeof h->model_name, opts->model_name);
    h->num_layers = g->num_moe_layers;
    h->num_experts = g->num_experts;
    h->top_k = g->top_k;
    h->hidden_size = g->hidden_size;
    h->shared_experts = g->num_shared_experts;
    /* Expert size as the checkpoint stores routed experts (quantised or not); the dtype
     * attribute names that storage type. */
    h->expert_bytes = fmoe_geometry_expert_bytes(g, g->expert_dtype);
    if (h->expert_bytes < 0) h->expert_bytes = 0;
    if (opts->expert_bytes > 0) h->expert_bytes = opts->expert_bytes;
    copy_str(h->dtype, sizeof h->dtype, fmoe_dtype_name(g->expert_dtype));
    copy_str(h->dataset, sizeof h->dataset, dataset);
    copy_str(h->recorded_on, sizeof h->recorded_on, recorded_on);
    h->probs_kind = kind;
    h->probs_half = 0; /* imported weights are kept exactly as float32 */
    if (opts->config_json && opts->config_json[0]) {
        FMOE_FORWARD_IF_ERROR(fmoe_config_fingerprint(opts->config_json,
                                                      strlen(opts->config_json),
                                                      h->model_fingerprint));
        h->config_json = opts->config_json;
    }
    return 0;
}

int fmoe__ds_check_probs(const float *p, int32_t n, int full, const char *path, int64_t lineno,
                         const char *what) {
    const int bracket = what[strlen(what) - 1] != '_';
    double sum = 0;
    for (int32_t i = 0; i < n; i++) {
        if (p[i] > 1.0 + FMOE_IMPORT_VALUE_TOL)
            return fmoe_error_set(FMOE_ERANGE, "%s:%lld: %s%s%d%s = %g, expected a probability "
                                  "in [0, 1]",
                                  path, (long long)lineno, what, bracket ? "[" : "", (int)i,
                                  bracket ? "]" : "", (double)p[i]);
        sum += p[i];
    }
    if (full && fabs(sum - 1.0) > FMOE_IMPORT_SUM_TOL)
        return fmoe_error_set(FMOE_ERANGE,
                              "%s:%lld: the %d probabilities sum to %g, expected a full "
                              "distribution summing to 1 (within %g)",
                              path, (long long)lineno, (int)n, sum, FMOE_IMPORT_SUM_TOL);
    if (!full && sum > 1.0 + FMOE_IMPORT_SUM_TOL)
        return fmoe_error_set(FMOE_ERANGE,
                              "%s:%lld: the chosen experts' probabilities sum to %g, "
                              "expected at most 1 (within %g)",
                              path, (long long)lineno, sum, FMOE_IMPORT_SUM_TOL);
    return 0;
}
