/*
 * serve_logprobs.c - log_softmax of one row of logits at a token, and its top k, by a
 * bounded min-heap (serve_logprobs.h says why the raw distribution and what it costs).
 */
#include "serve_logprobs.h"

#include <math.h>

/* "a ranks before b": larger logit first, lower id on ties (the sampler's order). */
static int before(float va, int32_t ia, float vb, int32_t ib) {
    return va > vb || (va == vb && ia < ib);
}

/* Min-heap by `before`: the root is the worst of the kept candidates. */
static void sift_down(float *v, int32_t *id, int32_t n, int32_t i) {
    for (;;) {
        int32_t w = i, l = 2 * i + 1, r = l + 1;
        if (l < n && before(v[w], id[w], v[l], id[l])) w = l;
        if (r < n && before(v[w], id[w], v[r], id[r])) w = r;
        if (w == i) return;
        const float tv = v[i];
        v[i] = v[w];
        v[w] = tv;
        const int32_t ti = id[i];
        id[i] = id[w];
        id[w] = ti;
        i = w;
    }
}

static float clean(float x) { return x == x ? x : -INFINITY; }

void fmoe_serve_logprobs_of(const float *logits, int32_t V, int32_t id, int32_t k,
                            serve_token_logprob *out) {
    out->id = id;
    out->num_top = 0;
    if (k > V) k = V;
    if (k > SERVE_MAX_TOP_LOGPROBS) k = SERVE_MAX_TOP_LOGPROBS;
    if (k < 0) k = 0;
    float mx = -INFINITY;
    for (int32_t i = 0; i < V; i++) mx = clean(logits[i]) > mx ? logits[i] : mx;
    /* log p(i) = (x_i - mx) - log sum exp(x - mx): every exponent is <= 0, so nothing
     * overflows, and the largest term is 1, so the sum is >= 1 and its log finite; x_i - mx
     * is taken first so that huge logits (1e30) keep the small differences between them. */
    double log_sum = NAN;
    if (isfinite(mx)) {
        double sum = 0;
        for (int32_t i = 0; i < V; i++) sum += exp((double)clean(logits[i]) - mx);
        log_sum = log(sum);
    }
    /* all logits -inf or NaN (or an inf one): no distribution; say -inf rather than NaN */
    const int ok = isfinite(log_sum);
#define LP(x) (ok ? (float)(((double)clean(x) - mx) - log_sum) : -INFINITY)
    out->logprob = id >= 0 && id < V ? LP(logits[id]) : -INFINITY;
    if (k == 0) return;
    float *v = out->top_logprob; /* logits while selecting, log-probabilities after */
    int32_t *ix = out->top_id;
    int32_t n = 0;
    for (int32_t i = 0; i < V; i++) {
        const float x = clean(logits[i]);
        if (n < k) {
            v[n] = x;
            ix[n++] = i;
            if (n == k)
                for (int32_t j = k / 2 - 1; j >= 0; j--) sift_down(v, ix, k, j);
        } else if (before(x, i, v[0], ix[0])) {
            v[0] = x;
            ix[0] = i;
            sift_down(v, ix, k, 0);
        }
    }
    /* heap sort: the root (worst) goes to the end each time, leaving best first */
    for (int32_t end = n - 1; end > 0; end--) {
        const float tv = v[0];
        v[0] = v[end];
        v[end] = tv;
        const int32_t ti = ix[0];
        ix[0] = ix[end];
        ix[end] = ti;
        sift_down(v, ix, end, 0);
    }
    for (int32_t i = 0; i < n; i++) v[i] = LP(v[i]);
#undef LP
    out->num_top = n;
}
