/*
 * serve_logprobs.c - log_softmax of one row of logits at a token, and its top k, by a
 * bounded min-heap (serve_logprobs.h says why the raw distribution and what it costs).
 */
#include "serve_logprobs.h"

#include <math.h>

#include "fmoe/sampler.h" /* fmoe_top_k */

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
    const int32_t n = fmoe_top_k(logits, V, k, 0.0f, 1.0f, v, out->top_id);
    for (int32_t i = 0; i < n; i++) v[i] = LP(v[i]);
#undef LP
    out->num_top = n;
}
