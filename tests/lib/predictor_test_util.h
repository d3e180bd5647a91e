/*
 * predictor_test_util.h - what the tests of the two learned predictors (test_predictor.c
 * for ProMoE's, test_duoserve_predictor.c for DuoServe-MoE's) share: a seeded random
 * stream for their inputs, a round trip of a predictor through a temporary file, and the
 * check that the file cut short is refused. Include after harness.h; the file helpers
 * assert with the caller's harness_failed.
 */
#ifndef FMOE_TESTS_PREDICTOR_TEST_UTIL_H
#define FMOE_TESTS_PREDICTOR_TEST_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "fmoe/error.h"
#include "fmoe/predictor.h"

/* The random stream: a test seeds rng_state (non-zero), then draws. */
static uint64_t rng_state;
static inline double rnd(void) { /* uniform [0, 1), xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (double)((rng_state * 0x2545F4914F6CDD1Dull) >> 11) * (1.0 / 9007199254740992.0);
}

/* Writes p to a new temporary file named from `path` (a mkstemp template, "...XXXXXX",
 * filled in) and reads it back into *q (the caller compares and frees it). */
static inline void predictor_round_trip(int *harness_failed, const fmoe_predictor *p,
                                        char *path, fmoe_predictor **q) {
    int fd = mkstemp(path);
    ASSERT_TRUE(fd >= 0);
    close(fd);
    ASSERT_OK(fmoe_predictor_write(path, p));
    ASSERT_OK(fmoe_predictor_read(path, q));
}

/* Cuts the file at `path` to `size` bytes: fmoe_predictor_read refuses it with a message
 * naming the file, and leaves its output NULL. */
static inline void predictor_expect_truncated_refused(int *harness_failed, const char *path,
                                                      long size) {
    FILE *f = fopen(path, "r+b");
    ASSERT_TRUE(f != NULL);
    ASSERT_TRUE(ftruncate(fileno(f), size) == 0);
    fclose(f);
    fmoe_predictor *q = NULL;
    ASSERT_TRUE(fmoe_predictor_read(path, &q) < 0);
    ASSERT_CONTAINS(fmoe_error_detail(), path);
    ASSERT_TRUE(q == NULL);
}

#endif
