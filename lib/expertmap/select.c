/*
 * select.c - similarity-aware expert selection (fmoe/expertmap.h; "fMoE: Fine-Grained
 * Expert Offloading for Large Mixture-of-Experts Serving" §4.3, Eq. 6-8).
 *
 * delta = clip(1 - score, 0, 1). Experts are taken in decreasing probability until their
 * sum reaches delta, and never fewer than K. Two readings are pinned down here:
 *   - "reaches" is Eq. 7's >= (the smallest such set), not the reference code's count of
 *     cumulative sums <= delta, which can stop one expert short of the mass;
 *   - delta is a share of the row's total, sum(p). A full softmax row sums to 1, so this
 *     is exactly the paper's rule; a row that holds only the top-k weights of a trace
 *     without full distributions (sums of 0.2 are common) would otherwise never reach
 *     delta and every expert, even those of probability 0, would be prefetched.
 * Experts of probability 0 are never taken for the mass, only to reach K.
 *
 * Cost: a heap over the J indexes, built in O(J), popped once per chosen expert: O(J + m
 * log J) for m chosen, allocation-free (the heap lives in the output array); rows of up
 * to 32 experts take the m best by repeated maximum instead, O(J·m), the same picks.
 */
#include "fmoe/expertmap.h"

/* a ranks before b: higher probability, then lower index */
static int before(const float *p, int32_t a, int32_t b) {
    return p[a] > p[b] || (p[a] == p[b] && a < b);
}

static void sift_down(const float *p, int32_t *h, int32_t n, int32_t i) {
    for (;;) {
        int32_t c = 2 * i + 1;
        if (c >= n) return;
        if (c + 1 < n && before(p, h[c + 1], h[c])) c++;
        if (!before(p, h[c], h[i])) return;
        const int32_t t = h[c];
        h[c] = h[i];
        h[i] = t;
        i = c;
    }
}

/* The same picks for a small row by repeated maximum, O(J·m) with no heap to build: the
 * candidates stay in out[m..J), the pick of step m is swapped into out[m]. "before" is a
 * strict total order on a row without NaN, so the picks are the heap's, in its order. */
static int32_t select_small(const float *p, int32_t J, int32_t k_min, double threshold,
                            int32_t *out) {
    int32_t m = 0;
    double acc = 0;
    while (m < J) {
        int32_t b = m;
        for (int32_t i = m + 1; i < J; i++)
            if (before(p, out[i], out[b])) b = i;
        const int32_t top = out[b];
        const int need_k = m < k_min;
        const int need_mass = acc < threshold && p[top] > 0;
        if (!need_k && !need_mass) break;
        out[b] = out[m];
        out[m] = top;
        acc += p[top] > 0 ? p[top] : 0;
        m++;
    }
    return m;
}

int32_t fmoe_expertmap_select(const float *p, int32_t J, double score, int32_t k_min,
                              int32_t *out) {
    if (J <= 0) return 0;
    if (k_min > J) k_min = J;
    double total = 0;
    int nan = 0;
    for (int32_t j = 0; j < J; j++) {
        out[j] = j;
        if (p[j] > 0) total += p[j];
        nan |= p[j] != p[j];
    }
    const double threshold = fmoe_expertmap_delta(score) * total * (1.0 - 1e-6);
    if (J <= 32 && !nan) return select_small(p, J, k_min, threshold, out);
    /* Max-heap in out[0..n); chosen experts collect at the end, out[J - m .. J). */
    int32_t n = J;
    for (int32_t i = J / 2 - 1; i >= 0; i--) sift_down(p, out, n, i);
    int32_t m = 0;
    double acc = 0;
    while (n > 0) {
        const int32_t top = out[0];
        const int need_k = m < k_min;
        const int need_mass = acc < threshold && p[top] > 0;
        if (!need_k && !need_mass) break;
        out[0] = out[n - 1];
        out[n - 1] = top;
        n--;
        sift_down(p, out, n, 0);
        acc += p[top] > 0 ? p[top] : 0;
        m++;
    }
    /* chosen are out[J-m..J) in reverse pick order: move them to the front, best first */
    for (int32_t i = 0; i < m; i++) {
        const int32_t a = i, b = J - 1 - i;
        if (a >= b) break;
        const int32_t t = out[a];
        out[a] = out[b];
        out[b] = t;
    }
    return m;
}
