/*
 * matcher.c - semantic and trajectory search over an expert-map store (fmoe/expertmap.h;
 * POLICIES.md A.2; fMoE §4.2, Eq. 4 and 5).
 *
 * Semantic search: scores = Q · S^T (one sgemm for n queries, sgemv for one) scaled by the
 * query norms and the store's precomputed entry norms; argmax per query.
 *
 * Trajectory search, incremental: the cosine of an observed prefix (rows 0..l of this
 * iteration's map) with the same rows of stored map y is
 *     dot_l[y] / (||q_0..l|| · ||map_y rows 0..l||).
 * Both factors grow by one row per layer: dot_l[y] = dot_{l-1}[y] + q_l · map_y[l] (one
 * sgemv over the C stored rows of layer l, or one sgemm for a batch of queries), the
 * query's squared norm by ||q_l||^2, and the store keeps 1 / ||map_y rows 0..l|| for every
 * l. So each layer costs O(C·J) (plus O(C) for the argmax), never O(C·l·J). The observed
 * rows are kept too, so that a store modified between two layers of a trajectory (by the
 * same thread: the store is not locked) is caught up with one sgemm over the prefix.
 */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "expertmap_impl.h"
#include "fmoe/error.h"
#include "fmoe/expertmap.h"

struct fmoe_matcher {
    const fmoe_expertmap *store;
    int32_t max_queries;
    int32_t nq;          /* trajectories started */
    int32_t layers;      /* rows observed per trajectory */
    uint64_t version;    /* store version the running sums belong to */
    float *dots;         /* [max_queries][C] running dot products */
    float *scores;       /* [max_queries][C] scores of the last call */
    double *qnorm2;      /* [max_queries] squared norm of each observed prefix */
    float *prefix;       /* [max_queries][L][J] observed rows */
};

int fmoe_matcher_init(fmoe_matcher **out, const fmoe_expertmap *store, int32_t max_queries) {
    FMOE_RETURN_ERROR_IF(!out || !store, FMOE_EINVAL, "fmoe_matcher_init: NULL argument");
    FMOE_RETURN_ERROR_IF(max_queries < 1, FMOE_EINVAL,
                         "matcher: max_queries %d, expected >= 1", max_queries);
    *out = NULL;
    const size_t C = (size_t)store->cfg.capacity, Q = (size_t)max_queries;
    const size_t LJ = (size_t)store->cfg.num_layers * store->cfg.num_experts;
    fmoe_matcher *m = calloc(1, sizeof *m);
    if (!m) return fmoe_error_set(FMOE_ENOMEM, "matcher");
    m->store = store;
    m->max_queries = max_queries;
    m->dots = malloc(Q * C * sizeof *m->dots);
    m->scores = malloc(Q * C * sizeof *m->scores);
    m->qnorm2 = calloc(Q, sizeof *m->qnorm2);
    m->prefix = malloc(Q * LJ * sizeof *m->prefix);
    if (!m->dots || !m->scores || !m->qnorm2 || !m->prefix) {
        fmoe_matcher_free(m);
        return fmoe_error_set(FMOE_ENOMEM, "matcher for %d queries over %zu entries",
                              max_queries, C);
    }
    *out = m;
    return 0;
}

void fmoe_matcher_free(fmoe_matcher *m) {
    if (!m) return;
    free(m->dots);
    free(m->scores);
    free(m->qnorm2);
    free(m->prefix);
    free(m);
}

/* argmax of v[0..n), ties to the lowest index; -1 when n == 0. */
static int32_t argmax(const float *v, int32_t n) {
    int32_t b = n > 0 ? 0 : -1;
    for (int32_t y = 1; y < n; y++)
        if (v[y] > v[b]) b = y;
    return b;
}

int fmoe_matcher_semantic(fmoe_matcher *m, int32_t n, const float *sem, int64_t stride,
                          int32_t *best, float *score) {
    const fmoe_expertmap *s = m->store;
    const int32_t h = s->cfg.semantic_dim, C = s->cfg.capacity, size = s->size;
    FMOE_RETURN_ERROR_IF(n < 0 || n > m->max_queries, FMOE_EINVAL,
                         "matcher: %d semantic queries, expected 0..%d", n, m->max_queries);
    if (h == 0 || size == 0 || !sem) {
        for (int32_t q = 0; q < n; q++) {
            if (best) best[q] = -1;
            if (score) score[q] = 0;
            memset(m->scores + (size_t)q * C, 0, (size_t)size * sizeof *m->scores);
        }
        return 0;
    }
    FMOE_RETURN_ERROR_IF(stride < h, FMOE_EINVAL, "matcher: semantic stride %lld < h = %d",
                         (long long)stride, h);
    if (n == 1)
        cblas_sgemv(CblasRowMajor, CblasNoTrans, size, h, 1.0f, s->sem, h, sem, 1, 0.0f,
                    m->scores, 1);
    else
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, size, h, 1.0f, sem, (int)stride,
                    s->sem, h, 0.0f, m->scores, C);
    for (int32_t q = 0; q < n; q++) {
        const float *x = sem + (size_t)q * stride;
        double n2 = 0;
        for (int32_t i = 0; i < h; i++) n2 += (double)x[i] * x[i];
        const float rq = n2 > 0 ? (float)(1.0 / sqrt(n2)) : 0.0f;
        float *row = m->scores + (size_t)q * C;
        for (int32_t y = 0; y < size; y++) {
            const float ny = s->sem_norm[y];
            row[y] = ny > 0 ? row[y] * rq / ny : 0.0f;
        }
        const int32_t b = argmax(row, size);
        if (best) best[q] = b;
        if (score) score[q] = row[b];
    }
    return 0;
}

int fmoe_matcher_trajectory_begin(fmoe_matcher *m, int32_t n) {
    FMOE_RETURN_ERROR_IF(n < 0 || n > m->max_queries, FMOE_EINVAL,
                         "matcher: %d trajectories, expected 0..%d", n, m->max_queries);
    m->nq = n;
    m->layers = 0;
    m->version = m->store->version;
    memset(m->qnorm2, 0, (size_t)n * sizeof *m->qnorm2);
    return 0;
}

int32_t fmoe_matcher_trajectory_layers(const fmoe_matcher *m) { return m->layers; }

/* Recomputes the running dot products from the kept prefixes (the store changed). */
static void rebuild(fmoe_matcher *m) {
    const fmoe_expertmap *s = m->store;
    const int32_t C = s->cfg.capacity, J = s->cfg.num_experts, LJ = s->cfg.num_layers * J;
    if (m->nq > 0 && s->size > 0)
        for (int32_t l = 0; l < m->layers; l++)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m->nq, s->size, J, 1.0f,
                        m->prefix + (size_t)l * J, LJ, s->maps + (size_t)l * C * J, J,
                        l ? 1.0f : 0.0f, m->dots, C);
    m->version = s->version;
}

int fmoe_matcher_trajectory_add(fmoe_matcher *m, int32_t layer, const float *rows,
                                int64_t stride, int32_t *best, float *score) {
    const fmoe_expertmap *s = m->store;
    const int32_t C = s->cfg.capacity, L = s->cfg.num_layers, J = s->cfg.num_experts;
    const int32_t size = s->size, n = m->nq;
    FMOE_RETURN_ERROR_IF(layer != m->layers || layer >= L, FMOE_EINVAL,
                         "matcher: layer %d added, expected layer %d", layer, m->layers);
    FMOE_RETURN_ERROR_IF(n > 0 && (!rows || stride < J), FMOE_EINVAL,
                         "matcher: rows %p, stride %lld (J = %d)", (const void *)rows,
                         (long long)stride, J);
    if (m->version != s->version) rebuild(m);
    for (int32_t q = 0; q < n; q++) {
        const float *r = rows + (size_t)q * stride;
        memcpy(m->prefix + ((size_t)q * L + layer) * J, r, (size_t)J * sizeof *r);
        double n2 = 0;
        for (int32_t j = 0; j < J; j++) n2 += (double)r[j] * r[j];
        m->qnorm2[q] += n2;
    }
    m->layers++;
    if (size > 0 && n > 0) {
        const float *ml = s->maps + (size_t)layer * C * J; /* [size][J], contiguous */
        if (layer == 0) {
            /* first row: write instead of accumulate, no need to clear the sums */
            if (n == 1)
                cblas_sgemv(CblasRowMajor, CblasNoTrans, size, J, 1.0f, ml, J, rows, 1, 0.0f,
                            m->dots, 1);
            else
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, size, J, 1.0f, rows,
                            (int)stride, ml, J, 0.0f, m->dots, C);
        } else if (n == 1) {
            cblas_sgemv(CblasRowMajor, CblasNoTrans, size, J, 1.0f, ml, J, rows, 1, 1.0f,
                        m->dots, 1);
        } else {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, size, J, 1.0f, rows,
                        (int)stride, ml, J, 1.0f, m->dots, C);
        }
    }
    const float *rn = s->prefix_rnorm + (size_t)layer * C;
    for (int32_t q = 0; q < n; q++) {
        const double n2 = m->qnorm2[q];
        const float rq = n2 > 0 ? (float)(1.0 / sqrt(n2)) : 0.0f;
        const float *dq = m->dots + (size_t)q * C;
        float *sc = m->scores + (size_t)q * C;
        /* one pass: score and running argmax (ties to the lowest index) */
        int32_t b = size > 0 ? 0 : -1;
        float bv = size > 0 ? dq[0] * rn[0] * rq : 0.0f;
        for (int32_t y = 0; y < size; y++) {
            const float v = dq[y] * rn[y] * rq;
            sc[y] = v;
            if (v > bv) {
                bv = v;
                b = y;
            }
        }
        if (best) best[q] = b;
        if (score) score[q] = b >= 0 ? bv : 0.0f;
    }
    return 0;
}

const float *fmoe_matcher_scores(const fmoe_matcher *m, int32_t q) {
    return q >= 0 && q < m->max_queries ? m->scores + (size_t)q * m->store->cfg.capacity : NULL;
}

int32_t fmoe_matcher_trajectory_naive(const fmoe_expertmap *s, const float *prefix,
                                      int32_t layers, float *scores) {
    const size_t J = (size_t)s->cfg.num_experts;
    const size_t k = (size_t)layers * J;
    double qq = 0;
    for (size_t i = 0; i < k; i++) qq += (double)prefix[i] * prefix[i];
    int32_t best = -1;
    for (int32_t y = 0; y < s->size; y++) {
        double ab = 0, bb = 0;
        for (int32_t l = 0; l < layers; l++) {
            const float *row = fmoe_expertmap_row(s, y, l), *q = prefix + (size_t)l * J;
            for (size_t j = 0; j < J; j++) {
                ab += (double)q[j] * row[j];
                bb += (double)row[j] * row[j];
            }
        }
        scores[y] = qq > 0 && bb > 0 ? (float)(ab / sqrt(qq * bb)) : 0.0f;
        if (best < 0 || scores[y] > scores[best]) best = y;
    }
    return best;
}
