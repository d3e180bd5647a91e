/*
 * predictor_eval.c - how expert predictions are scored ("ProMoE: Fast MoE-based LLM Serving
 * using Proactive Caching" §4.1-§4.3): top-K selection, the overlap behind ACCURACY_i(k), and
 * ProMoE's token-based baseline. Contracts in fmoe/predictor.h.
 *
 * ACCURACY_i(k) is "the proportion of correctly predicted experts" (ProMoE §4.1); we read it
 * (docs/policies.md#learned-predictors) as |pred ∩ actual| / |actual| with |pred| = K, the
 * experts the model activates per token, which is what fmoe_topk_overlap(...) / K gives per
 * token.
 *
 * The token-based baseline (ProMoE §4.2, "Token-based prediction"): "in the offline stage, a
 * trace of input token ids and the selected experts is collected. During online inference,
 * the predictor predicts the experts of one iteration by finding the most frequently used
 * experts in the trace according to the input token id." The table holds one count per (token
 * id seen, expert); a token id the training trace never held gets the layer's overall most
 * frequent experts (the paper does not say; this is the natural fallback). Cost: O(n log n)
 * to build, O(log U + K·J) per prediction.
 */
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "fmoe/predictor.h"

void fmoe_topk_indices(const float *scores, int32_t J, int32_t K, int32_t *out) {
    for (int32_t k = 0; k < K; k++) {
        int32_t best = -1;
        for (int32_t j = 0; j < J; j++) {
            int taken = 0;
            for (int32_t q = 0; q < k; q++) taken |= out[q] == j;
            if (taken) continue;
            if (best < 0 || scores[j] > scores[best]) best = j;
        }
        out[k] = best;
    }
}

int32_t fmoe_topk_overlap(const int32_t *pred, const uint16_t *actual, int32_t K) {
    int32_t hits = 0;
    for (int32_t a = 0; a < K; a++)
        for (int32_t b = 0; b < K; b++)
            if (pred[b] == (int32_t)actual[a]) {
                hits++;
                break;
            }
    return hits;
}

struct fmoe_token_table {
    int32_t J, K;
    int64_t num_ids;
    int32_t *ids;    /* [num_ids] ascending */
    float *counts;   /* [num_ids][J] times each expert was chosen for that id */
    float *overall;  /* [J] over every token */
};

typedef struct id_row {
    int32_t id;
    int64_t row;
} id_row;

static int cmp_id_row(const void *a, const void *b) {
    const id_row *x = a, *y = b;
    if (x->id != y->id) return x->id < y->id ? -1 : 1;
    return x->row < y->row ? -1 : x->row > y->row;
}

int fmoe_token_table_build(fmoe_token_table **out, int32_t J, int32_t K, const int32_t *token_id,
                           const uint16_t *experts, int64_t stride, int64_t n) {
    FMOE_RETURN_ERROR_IF(!out || J < 1 || K < 1 || K > J || n < 0 || (n > 0 && (!token_id ||
                                                                                 !experts)),
                         FMOE_EINVAL, "fmoe_token_table_build: bad arguments");
    *out = NULL;
    fmoe_token_table *t = calloc(1, sizeof *t);
    id_row *rows = malloc((size_t)(n > 0 ? n : 1) * sizeof *rows);
    if (!t || !rows) {
        free(t);
        free(rows);
        return fmoe_error_set(FMOE_ENOMEM, "token table: out of memory");
    }
    t->J = J;
    t->K = K;
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++)
        if (token_id[i] >= 0) rows[m++] = (id_row){token_id[i], i};
    qsort(rows, (size_t)m, sizeof *rows, cmp_id_row);
    int64_t u = 0;
    for (int64_t i = 0; i < m; i++) u += i == 0 || rows[i].id != rows[i - 1].id;
    t->ids = malloc((size_t)(u > 0 ? u : 1) * sizeof *t->ids);
    t->counts = calloc((size_t)(u > 0 ? u : 1) * (size_t)J, sizeof *t->counts);
    t->overall = calloc((size_t)J, sizeof *t->overall);
    if (!t->ids || !t->counts || !t->overall) {
        free(rows);
        fmoe_token_table_free(t);
        return fmoe_error_set(FMOE_ENOMEM, "token table: out of memory");
    }
    int64_t slot = -1;
    for (int64_t i = 0; i < m; i++) {
        if (i == 0 || rows[i].id != rows[i - 1].id) t->ids[++slot] = rows[i].id;
        const uint16_t *e = experts + (size_t)rows[i].row * (size_t)stride;
        for (int32_t k = 0; k < K; k++) {
            t->counts[(size_t)slot * J + e[k]] += 1.0f;
            t->overall[e[k]] += 1.0f;
        }
    }
    t->num_ids = u;
    free(rows);
    *out = t;
    return 0;
}

void fmoe_token_table_free(fmoe_token_table *t) {
    if (!t) return;
    free(t->ids);
    free(t->counts);
    free(t->overall);
    free(t);
}

void fmoe_token_table_predict(const fmoe_token_table *t, int32_t token_id, int32_t *out) {
    const float *scores = t->overall;
    int64_t lo = 0, hi = t->num_ids;
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (t->ids[mid] < token_id)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < t->num_ids && t->ids[lo] == token_id) scores = t->counts + (size_t)lo * t->J;
    fmoe_topk_indices(scores, t->J, t->K, out);
}
