/*
 * tier_timing.c - the file tier's reads of a model's experts, timed
 * (fmoe_offload_time_file_reads, fmoe/offload.h): what `fmoe calibrate --link-file MODEL`
 * measures as the link of a live run that reads its experts from disk.
 *
 * The reads are the live copy engine's own: fmoe__expert_tier_read of bytes [lo, hi) of
 * expert (l, j) into a slot, from the tier opened as fmoe_offload_init opens it, with the
 * byte ranges of its pieces (fmoe__piece_range, offload_impl.h). So a GGUF expert is its
 * three matrices' slices at their own offsets, each read split into segments kept
 * read_depth deep, O_DIRECT widened to the device's alignment - not one contiguous range
 * of the file, which a disk may serve at another rate.
 */
#include <stdlib.h>
#include <string.h>

#include "expert_tier.h"
#include "fmoe/error.h"
#include "fmoe/offload.h"
#include "monotonic.h"
#include "offload_impl.h"

#define MAX_POINTS 16
#define MAX_REPS 1000

/* xorshift64: a fixed sequence of (layer, expert, piece), the same every run */
static uint64_t next_rand(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* The mean of v[n] without its slowest and fastest tenth. Sorts v. */
static double trimmed_mean(double *v, int32_t n) {
    qsort(v, (size_t)n, sizeof *v, fmoe__cmp_double);
    const int32_t cut = n / 10;
    double sum = 0;
    for (int32_t i = cut; i < n - cut; i++) sum += v[i];
    return sum / (double)(n - 2 * cut);
}

int fmoe_offload_time_file_reads(const fmoe_model *m, int direct_io, int32_t read_depth,
                                 const int32_t *pieces, int32_t n, int32_t min_reps,
                                 double min_seconds, double *bytes, double *seconds,
                                 int32_t *reps) {
    FMOE_RETURN_ERROR_IF(n < 1 || n > MAX_POINTS, FMOE_EINVAL, "timing reads: %d points", n);
    for (int32_t i = 0; i < n; i++)
        FMOE_RETURN_ERROR_IF(pieces[i] < 1, FMOE_EINVAL, "timing reads: %d pieces", pieces[i]);
    const fmoe_model_geometry *g = fmoe_model_get_geometry(m);
    FMOE_RETURN_ERROR_IF(g->num_moe_layers < 1 || g->num_experts < 1, FMOE_EINVAL,
                         "timing reads: the model has no routed experts");
    fmoe_expert_tier *t = NULL;
    FMOE_FORWARD_IF_ERROR(fmoe__expert_tier_open(&t, m, FMOE_TIER_FILE, direct_io, read_depth));
    if (min_reps < 1) min_reps = 1;
    const int64_t slot_bytes = fmoe__expert_tier_slot_bytes(t);
    void *slot = aligned_alloc(4096, (size_t)slot_bytes);
    double *took = malloc(sizeof *took * (size_t)MAX_REPS * (size_t)n);
    double *sum_bytes = calloc((size_t)n, sizeof *sum_bytes);
    int rc = slot && took && sum_bytes
                 ? 0
                 : fmoe_error_set(FMOE_ENOMEM, "timing reads: a slot of %lld bytes",
                                  (long long)slot_bytes);
    if (rc == 0) memset(slot, 0, (size_t)slot_bytes); /* no page faults in the timings */
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    int32_t k = 0;
    const double start = fmoe__now_s();
    /* k = -1: one untimed repetition (the reader threads' first wake-up) */
    for (k = -1; rc == 0 && k < MAX_REPS; k++) {
        if (k >= min_reps && fmoe__now_s() - start >= min_seconds) break;
        for (int32_t i = 0; rc == 0 && i < n; i++) {
            const int32_t l = (int32_t)(next_rand(&seed) % (uint64_t)g->num_moe_layers);
            const int32_t j = (int32_t)(next_rand(&seed) % (uint64_t)g->num_experts);
            const int32_t p = (int32_t)(next_rand(&seed) % (uint64_t)pieces[i]);
            int64_t lo, hi;
            fmoe__piece_range(fmoe__expert_tier_layer_bytes(t, l), pieces[i], p, &lo, &hi);
            const double t0 = fmoe__now_s();
            rc = fmoe__expert_tier_read(t, l, j, lo, hi - lo, slot);
            if (rc == 0 && k >= 0) {
                took[(size_t)i * MAX_REPS + (size_t)k] = fmoe__now_s() - t0;
                sum_bytes[i] += (double)(hi - lo);
            }
        }
    }
    if (rc == 0) {
        for (int32_t i = 0; i < n; i++) {
            bytes[i] = sum_bytes[i] / k;
            seconds[i] = trimmed_mean(took + (size_t)i * MAX_REPS, k);
        }
        *reps = k;
    }
    free(sum_bytes);
    free(took);
    free(slot);
    fmoe__expert_tier_close(t);
    return rc;
}
