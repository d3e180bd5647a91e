/*
 * matcher_internal.h - internal: the matcher's hooks for differential tests (the scalar
 * reference passes and a forced SIMD level) and its definition of the semantic dot, which
 * the fmoe policies and tests/expertmap use beside fmoe/expertmap.h.
 */
#ifndef FMOE_MATCHER_INTERNAL_H
#define FMOE_MATCHER_INTERNAL_H

#include <stdint.h>

#include "fmoe/expertmap.h"

/* For differential tests of a policy: makes the matcher compute every trajectory step
 * with fmoe_matcher_trajectory_reference (slow: O(C·l·J) per layer) instead of the
 * incremental pass. The results are the same bits. */
void fmoe__matcher_set_reference(fmoe_matcher *m, int on);

/* For tests: runs the trajectory step and the semantic pass built for x86-64 level
 * `level` (0: the baseline build, 4 lanes; 1: AVX2, 8 lanes; 2: AVX-512, 16 lanes; -1: the
 * widest this CPU runs, the default). @return 0, or -1 when this CPU or build has none. */
int fmoe__matcher_force_level(fmoe_matcher *m, int level);

/* The semantic search's dot product x · e of h floats, the definition, in scalar code:
 * 16 running sums, sum i takes x_k·e_k for k = i, i + 16, ... in turn, then the sums
 * folded 8, 4, 2 and 1 apart (matcher.c). */
float fmoe__matcher_semantic_dot(const float *x, const float *e, int32_t h);

#endif
