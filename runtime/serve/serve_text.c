/*
 * serve_text.c - stop strings and held-back tails of streamed text (serve_text.h).
 */
#include "serve_text.h"

#include <string.h>

#include "fmoe/tokenizer.h"

size_t fmoe_serve_text_stop_at(const char *const *stop, int32_t num_stop, const char *text,
                          size_t n) {
    size_t at = n;
    for (int32_t i = 0; i < num_stop; i++) {
        const size_t m = strlen(stop[i]);
        if (m == 0 || m > n) continue;
        for (size_t p = 0; p + m <= n && p < at; p++)
            if (memcmp(text + p, stop[i], m) == 0) {
                at = p;
                break;
            }
    }
    return at;
}

/* Length of the longest suffix of text[0..n) that is a proper prefix of a stop string. */
static size_t stop_prefix_tail(const char *const *stop, int32_t num_stop, const char *text,
                               size_t n) {
    size_t hold = 0;
    for (int32_t i = 0; i < num_stop; i++) {
        const size_t m = strlen(stop[i]);
        if (m < 2) continue; /* a proper prefix of it would be empty */
        for (size_t k = m - 1 < n ? m - 1 : n; k > hold; k--)
            if (memcmp(text + n - k, stop[i], k) == 0) {
                hold = k;
                break;
            }
    }
    return hold;
}

size_t fmoe_serve_text_visible(const char *const *stop, int32_t num_stop, const char *text,
                          size_t n) {
    const size_t stable = fmoe_text_stable_prefix(text, n);
    return stable - stop_prefix_tail(stop, num_stop, text, stable);
}
