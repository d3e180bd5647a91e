/*
 * monotonic.h - the clock and the median that fmoe's timing loops share (internal: the
 * calibration benches, the live executor, MPI sweeps, the simulator's summaries).
 *
 * CLOCK_MONOTONIC because a timing must not jump with the wall clock; the median because
 * one preempted run of a short operation would drag a mean far off on a shared machine.
 */
#ifndef FMOE_MONOTONIC_H
#define FMOE_MONOTONIC_H

#include <stdint.h>
#include <stdlib.h>
#include <time.h>

/* Seconds on CLOCK_MONOTONIC. */
static inline double fmoe__now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* qsort order of doubles, ascending. */
static inline int fmoe__cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of v[n] (n >= 1; the mean of the middle two for even n). Sorts v. */
static inline double fmoe__median(double *v, int64_t n) {
    qsort(v, (size_t)n, sizeof *v, fmoe__cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#endif
