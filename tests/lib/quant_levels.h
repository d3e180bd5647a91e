/*
 * quant_levels.h - runs a test binary's tests once per kernel level of lib/quant*.c
 * (plain C, AVX2, AVX-512: lib/quant_impl.h), forcing each level the CPU has in turn, so
 * one binary checks every path this CPU can run against the same references.
 *
 * A level the CPU lacks (or the environment turns off: FMOE_NO_AVX2, FMOE_NO_AVX512) is
 * said on stderr, "avx512: not supported by this CPU, its cases not run", never passed
 * over in silence; where AVX-512 ran, the last line is "avx512: N cases run", which
 * tests/gpu/device-check.sh's stage cpu_avx512 looks for.
 *
 * Built with FMOE_EMULATE_AVX512 (the *_avx512_emulated tests: the AVX-512 kernels compiled
 * against SIMDe, lib/simd512.h), a run whose AVX-512 cases did not run fails.
 */
#ifndef FMOE_TEST_QUANT_LEVELS_H
#define FMOE_TEST_QUANT_LEVELS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "quant_impl.h"

/* The tests RUN_TESTS runs with this filter (harness_run's rule). */
static inline int quant_levels_count(int argc, char **argv) {
    const char *filter = argc > 1 ? argv[1] : NULL;
    int n = 0;
    for (int i = 0; i < harness_num_tests; i++) n += !filter || strstr(harness_tests[i].name, filter);
    return n;
}

static inline int run_tests_at_every_level(int argc, char **argv) {
    int rc = 0, ran512 = 0;
    char last[128] = "";
    for (int level = FMOE__QUANT_PLAIN; level <= FMOE__QUANT_AVX512; level++) {
        const char *name = fmoe__quant_level_name(level);
        fflush(stdout);
        if (fmoe__quant_force_level(level) != 0) {
            const char *env = level == FMOE__QUANT_AVX512 ? "FMOE_NO_AVX512" : "FMOE_NO_AVX2";
            const int off = getenv(env) != NULL || (level == FMOE__QUANT_AVX512 && getenv("FMOE_NO_AVX2"));
            snprintf(last, sizeof last, "%s: %s, its cases not run", name,
                     off ? "not supported by this CPU or turned off by FMOE_NO_AVX2 / FMOE_NO_AVX512"
                         : "not supported by this CPU");
            if (level != FMOE__QUANT_AVX512) fprintf(stderr, "%s\n", last); /* avx512's: last */
            continue;
        }
        fprintf(stderr, "== kernel level %s\n", name);
        printf("%s: ", name);
        rc |= RUN_TESTS(argc, argv);
        fflush(stdout);
        if (level == FMOE__QUANT_AVX512) {
            ran512 = 1;
            snprintf(last, sizeof last, "avx512: %d cases run", quant_levels_count(argc, argv));
        }
    }
    fmoe__quant_force_level(-1);
    fflush(stdout);
#ifdef FMOE_EMULATE_AVX512
    /* The emulated variants (tests/lib/meson.build) are there to run the AVX-512 cases: one
     * that could not has failed, it has not passed. */
    fprintf(stderr, "%s\n", ran512 ? "avx512 emulated with SIMDe (lib/simd512.h), not run natively"
                                    : "avx512 emulated with SIMDe: its cases did not run (they need the avx2 "
                                      "level, and no FMOE_NO_AVX512), so this run fails");
    rc |= !ran512;
#else
    (void)ran512;
#endif
    fprintf(stderr, "%s\n", last);
    return rc;
}

#endif
