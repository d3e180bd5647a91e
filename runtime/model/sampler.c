/*
 * sampler.c - greedy, temperature, top-k and top-p sampling with a seeded generator.
 *
 * Cost per token: greedy O(V). Otherwise O(V) for the softmax, plus O(V log k) for top-k
 * (a bounded min-heap) or, for top-p alone, a sort of only the candidates that can be in
 * the nucleus: a token whose probability is below (1 - p) / (V - 1) never is (llama2.c's
 * observation), which leaves few candidates for a trained model.
 */
#include "fmoe/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"

struct fmoe_sampler {
    fmoe_sampler_params p;
    int32_t vocab;
    fmoe_rng rng;
    int32_t *idx;  /* [vocab] candidate ids */
    float *val;    /* [vocab] candidate logits, then probabilities */
};

/* ---------------------------------------------------------------------------------- */
/* RNG: xoshiro256** seeded by splitmix64                                              */
/* ---------------------------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void fmoe_rng_seed(fmoe_rng *r, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t fmoe_rng_next(fmoe_rng *r) {
    uint64_t *s = r->s;
    const uint64_t result = rotl(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

float fmoe_rng_float(fmoe_rng *r) { return (float)(fmoe_rng_next(r) >> 40) * 0x1.0p-24f; }

/* ---------------------------------------------------------------------------------- */
/* Sampling                                                                           */
/* ---------------------------------------------------------------------------------- */

int32_t fmoe_argmax(const float *logits, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (logits[i] > logits[best] || (logits[best] != logits[best] && logits[i] == logits[i]))
            best = i;
    return best;
}

int fmoe_sampler_init(const fmoe_sampler_params *params, int32_t vocab, fmoe_sampler **out) {
    if (!params || !out) return fmoe_error_set(FMOE_EINVAL, "params or output is NULL");
    FMOE_RETURN_ERROR_IF(!(params->temperature >= 0) || !isfinite(params->temperature),
                         FMOE_EINVAL, "temperature %g must be >= 0", params->temperature);
    FMOE_RETURN_ERROR_IF(!(params->top_p > 0), FMOE_EINVAL, "top_p %g must be > 0",
                         params->top_p);
    FMOE_RETURN_ERROR_IF(params->top_k < 0, FMOE_EINVAL, "top_k %d must be >= 0", params->top_k);
    FMOE_RETURN_ERROR_IF(vocab < 1, FMOE_EINVAL, "vocabulary of %d tokens", vocab);
    fmoe_sampler *s = calloc(1, sizeof *s);
    if (!s) return fmoe_error_set(FMOE_ENOMEM, "out of memory");
    s->p = *params;
    s->vocab = vocab;
    s->idx = malloc((size_t)vocab * sizeof *s->idx);
    s->val = malloc((size_t)vocab * sizeof *s->val);
    if (!s->idx || !s->val) {
        fmoe_sampler_free(s);
        return fmoe_error_set(FMOE_ENOMEM, "out of memory");
    }
    fmoe_rng_seed(&s->rng, params->seed);
    *out = s;
    return 0;
}

void fmoe_sampler_free(fmoe_sampler *s) {
    if (!s) return;
    free(s->idx);
    free(s->val);
    free(s);
}

/* "a ranks before b": higher value first, lower id on ties. */
static inline int before(float va, int32_t ia, float vb, int32_t ib) {
    return va > vb || (va == vb && ia < ib);
}

/* Min-heap on (val, idx) by `before`: the root is the worst kept candidate. */
static void sift_down(float *v, int32_t *id, int32_t n, int32_t i) {
    for (;;) {
        int32_t w = i, l = 2 * i + 1, r = l + 1;
        if (l < n && before(v[w], id[w], v[l], id[l])) w = l;
        if (r < n && before(v[w], id[w], v[r], id[r])) w = r;
        if (w == i) return;
        float tv = v[i];
        v[i] = v[w];
        v[w] = tv;
        int32_t ti = id[i];
        id[i] = id[w];
        id[w] = ti;
        i = w;
    }
}

/* Sorts n candidates best first (heap sort on the min-heap order, so no allocation). */
static void sort_desc(float *v, int32_t *id, int32_t n) {
    for (int32_t i = n / 2 - 1; i >= 0; i--) sift_down(v, id, n, i);
    for (int32_t end = n - 1; end > 0; end--) {
        float tv = v[0];
        v[0] = v[end];
        v[end] = tv;
        int32_t ti = id[0];
        id[0] = id[end];
        id[end] = ti;
        sift_down(v, id, end, 0);
    }
}

int32_t fmoe_top_k(const float *x, int32_t n, int32_t k, float shift, float scale, float *val,
                   int32_t *idx) {
    if (k > n) k = n;
    if (k <= 0) return 0;
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++) {
        const float v = x[i] == x[i] ? (x[i] - shift) * scale : -INFINITY;
        if (m < k) {
            val[m] = v;
            idx[m] = i;
            m++;
            if (m == k)
                for (int32_t j = k / 2 - 1; j >= 0; j--) sift_down(val, idx, k, j);
        } else if (before(v, i, val[0], idx[0])) {
            val[0] = v;
            idx[0] = i;
            sift_down(val, idx, k, 0);
        }
    }
    sort_desc(val, idx, m);
    return m;
}

int32_t fmoe_sampler_sample(fmoe_sampler *s, const float *logits) {
    const int32_t V = s->vocab;
    if (s->p.temperature == 0.0f) return fmoe_argmax(logits, V);
    /* Scaled from the largest logit down: (x - max) / T is at most 0, so a temperature
     * small enough that x / T overflows (1e-40, a float subnormal, made every logit inf
     * and the softmax NaN: the last token each step) tends to greedy, as its limit does;
     * one whose reciprocal overflows is greedy outright. */
    const float invT = 1.0f / s->p.temperature;
    float lmax = -INFINITY;
    for (int32_t i = 0; i < V; i++) lmax = logits[i] > lmax ? logits[i] : lmax;
    if (!isfinite(invT) || !isfinite(lmax)) return fmoe_argmax(logits, V);
    float *val = s->val;
    int32_t *idx = s->idx;
    int32_t n = 0;
    int sorted = 0;

    if (s->p.top_k > 0 && s->p.top_k < V) {
        n = fmoe_top_k(logits, V, s->p.top_k, lmax, invT, val, idx);
        sorted = 1;
    } else {
        for (int32_t i = 0; i < V; i++) {
            val[i] = logits[i] == logits[i] ? (logits[i] - lmax) * invT : -INFINITY;
            idx[i] = i;
        }
        n = V;
    }

    /* Softmax over the candidates. */
    float mx = -INFINITY;
    for (int32_t i = 0; i < n; i++) mx = val[i] > mx ? val[i] : mx;
    if (mx == -INFINITY) return fmoe_argmax(logits, V);
    double sum = 0;
    for (int32_t i = 0; i < n; i++) {
        val[i] = expf(val[i] - mx);
        sum += val[i];
    }
    for (int32_t i = 0; i < n; i++) val[i] = (float)(val[i] / sum);

    if (s->p.top_p < 1.0f) {
        if (!sorted) {
            /* Drop what cannot be in the nucleus, then sort the rest. */
            const float cutoff = (1.0f - s->p.top_p) / (float)(n > 1 ? n - 1 : 1);
            int32_t m = 0;
            for (int32_t i = 0; i < n; i++)
                if (val[i] >= cutoff) {
                    val[m] = val[i];
                    idx[m] = idx[i];
                    m++;
                }
            n = m;
            sort_desc(val, idx, n);
        }
        double cum = 0;
        int32_t keep = n;
        for (int32_t i = 0; i < n; i++) {
            cum += val[i];
            if (cum >= s->p.top_p) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
    }

    double total = 0;
    for (int32_t i = 0; i < n; i++) total += val[i];
    const double r = (double)fmoe_rng_float(&s->rng) * total;
    double acc = 0;
    for (int32_t i = 0; i < n; i++) {
        acc += val[i];
        if (r < acc) return idx[i];
    }
    return idx[n - 1];
}
