/*
 * train_split.c - the train/validation split by request (train_split.h).
 */
#include "train_split.h"

#include <math.h>
#include <stdlib.h>

#include "fmoe/error.h"
#include "fmoe/predictor.h"

static int cmp_ref(const void *a, const void *b) {
    const cmd_request_ref *x = a, *y = b;
    if (x->trace != y->trace) return x->trace < y->trace ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

int64_t cmd_split_requests(const int64_t *counts, int32_t n, double split, uint64_t seed,
                           cmd_request_ref **out) {
    int64_t nreq = 0;
    for (int32_t t = 0; t < n; t++) nreq += counts[t];
    cmd_request_ref *reqs = malloc((size_t)(nreq > 0 ? nreq : 1) * sizeof *reqs);
    *out = reqs;
    if (!reqs) return fmoe_error_set(FMOE_ENOMEM, "a split of %lld requests", (long long)nreq);
    int64_t q = 0;
    for (int32_t t = 0; t < n; t++)
        for (int64_t r = 0; r < counts[t]; r++) reqs[q++] = (cmd_request_ref){t, r};
    uint64_t state = seed;
    for (int64_t i = nreq - 1; i > 0; i--) {
        const int64_t j =
            (int64_t)(((__uint128_t)fmoe_splitmix64(&state) * (uint64_t)(i + 1)) >> 64);
        const cmd_request_ref x = reqs[i];
        reqs[i] = reqs[j];
        reqs[j] = x;
    }
    int64_t ntrain = llround(split * (double)nreq);
    if (ntrain > nreq - 1) ntrain = nreq - 1;
    if (ntrain < 1) ntrain = 1;
    qsort(reqs, (size_t)ntrain, sizeof *reqs, cmp_ref);
    qsort(reqs + ntrain, (size_t)(nreq - ntrain), sizeof *reqs, cmp_ref);
    return ntrain;
}
