/*
 * quantize_imatrix.c - reads llama.cpp's importance-matrix GGUF files (quantize_imatrix.h)
 * with lib/gguf.c's reader, as common/imatrix-loader.cpp and llama-quantize's
 * load_imatrix read them: per expert, the sums of squares over the count of activations
 * (the count rounded to an integer first, as lround does there), 1 for an expert no token
 * reached. The file stays mapped; a tensor's entry is normalised when it is asked for, so
 * the whole matrix (about one float per input column per expert of every weight) is never
 * held twice.
 */
#include "quantize_imatrix.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "fmoe/gguf.h"
#include "fmoe/quant.h"

struct fmoe__imatrix {
    fmoe_gguf *g;
    char *path;
};

static const char SUMS[] = ".in_sum2", COUNTS[] = ".counts";

/* The tensor `base` + `suffix`, or NULL. */
static const fmoe_gguf_tensor *entry(const fmoe_gguf *g, const char *base, const char *suffix) {
    char name[256];
    if (snprintf(name, sizeof name, "%s%s", base, suffix) >= (int)sizeof name) return NULL;
    return fmoe_gguf_find_tensor(g, name);
}

static int ends_with(const char *s, const char *suffix, size_t *stem) {
    const size_t n = strlen(s), k = strlen(suffix);
    *stem = n >= k ? n - k : 0;
    return n > k && strcmp(s + n - k, suffix) == 0;
}

static int check(const fmoe__imatrix *m) {
    const fmoe_gguf *g = m->g;
    static const char *const keys[] = {"imatrix.datasets", "imatrix.chunk_count",
                                       "imatrix.chunk_size"};
    for (int i = 0; i < 3; i++)
        FMOE_RETURN_ERROR_IF(!fmoe_gguf_find_kv(g, keys[i]), FMOE_EFORMAT,
                             "%s: not an importance matrix: no key %s (llama-imatrix writes it)",
                             m->path, keys[i]);
    const int64_t n = fmoe_gguf_tensor_count(g);
    int64_t entries = 0;
    for (int64_t i = 0; i < n; i++) {
        const fmoe_gguf_tensor *t = fmoe_gguf_tensor_at(g, i);
        size_t stem;
        const int is_sums = ends_with(t->name, SUMS, &stem);
        if (!is_sums && !ends_with(t->name, COUNTS, &stem)) continue;
        char base[256];
        FMOE_RETURN_ERROR_IF(stem >= sizeof base, FMOE_EFORMAT, "%s: tensor %s: name too long",
                             m->path, t->name);
        memcpy(base, t->name, stem);
        base[stem] = '\0';
        const fmoe_gguf_tensor *other = entry(g, base, is_sums ? COUNTS : SUMS);
        FMOE_RETURN_ERROR_IF(!other, FMOE_EFORMAT, "%s: tensor %s has no %s%s beside it",
                             m->path, t->name, base, is_sums ? COUNTS : SUMS);
        FMOE_RETURN_ERROR_IF(t->type != FMOE_GGML_F32, FMOE_EFORMAT,
                             "%s: tensor %s is %s, not F32", m->path, t->name,
                             fmoe_ggml_type_name(t->type));
        const float *v = t->data;
        for (int64_t k = 0; k < t->numel; k++)
            FMOE_RETURN_ERROR_IF(!isfinite(v[k]), FMOE_EFORMAT,
                                 "%s: tensor %s, value %lld is %g: not finite", m->path,
                                 t->name, (long long)k, (double)v[k]);
        if (!is_sums) continue;
        FMOE_RETURN_ERROR_IF(other->numel < 1 || t->numel % other->numel != 0, FMOE_EFORMAT,
                             "%s: tensor %s has %lld values, not a whole number of columns "
                             "for each of the %lld counts of %s",
                             m->path, t->name, (long long)t->numel, (long long)other->numel,
                             other->name);
        entries++;
    }
    FMOE_RETURN_ERROR_IF(entries == 0, FMOE_EFORMAT, "%s: no *.in_sum2 tensors", m->path);
    return 0;
}

int fmoe__imatrix_open(const char *path, fmoe__imatrix **out) {
    *out = NULL;
    fmoe__imatrix *m = calloc(1, sizeof *m);
    FMOE_RETURN_ERROR_IF(!m, FMOE_ENOMEM, "out of memory");
    m->path = strdup(path);
    int rc = m->path ? 0 : fmoe_error_set(FMOE_ENOMEM, "out of memory");
    if (rc == 0 && (rc = fmoe_gguf_open(path, &m->g)) < 0) {
        /* llama-imatrix's older format: a count of entries, then names and sums */
        if (rc == FMOE_EFORMAT)
            fmoe_error_set(FMOE_EFORMAT,
                           "%s: not a GGUF importance matrix (the legacy .dat format is not "
                           "read: convert it with llama-imatrix --in-file %s -o FILE.gguf)",
                           path, path);
    }
    if (rc == 0) rc = check(m);
    if (rc < 0) {
        fmoe__imatrix_close(m);
        return rc;
    }
    *out = m;
    return 0;
}

void fmoe__imatrix_close(fmoe__imatrix *m) {
    if (!m) return;
    fmoe_gguf_close(m->g);
    free(m->path);
    free(m);
}

int fmoe__imatrix_get(const fmoe__imatrix *m, const char *name, int64_t cols, int64_t experts,
                      float **out) {
    *out = NULL;
    const fmoe_gguf_tensor *s = entry(m->g, name, SUMS), *c = entry(m->g, name, COUNTS);
    if (!s || !c) return 0;
    FMOE_RETURN_ERROR_IF(s->numel != cols * experts, FMOE_EFORMAT,
                         "%s: the importance of %s has %lld values; the tensor has %lld "
                         "columns x %lld experts",
                         m->path, name, (long long)s->numel, (long long)cols, (long long)experts);
    float *v = malloc((size_t)s->numel * sizeof *v);
    FMOE_RETURN_ERROR_IF(!v, FMOE_ENOMEM, "out of memory for the importance of %s", name);
    const float *sums = s->data, *counts = c->data;
    const int64_t ne0 = s->numel / c->numel;
    for (int64_t j = 0; j < c->numel; j++) {
        const float count = (float)lroundf(counts[j]);
        for (int64_t i = 0; i < ne0; i++)
            v[j * ne0 + i] = count > 0 ? sums[j * ne0 + i] / count : 1.0f;
    }
    *out = v;
    return 0;
}
