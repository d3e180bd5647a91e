/*
 * quant_impl.h - what lib/quant.c, lib/quant_avx2.c, lib/quant_ref.c and lib/quant_act.c
 * share (internal).
 */
#ifndef FMOE_QUANT_IMPL_H
#define FMOE_QUANT_IMPL_H

#include <stdint.h>
#include <string.h>

#include "quant_block.h" /* the block formats' value formulas, fmoe__scale_min_k4 */

/* ggml's nearest_int: round to nearest, ties to even, through the 1.5·2^23 trick, for
 * |v| <= 2^22. Values outside (only from non-finite or absurd inputs, whose blocks are
 * unspecified) are clamped first so the trick stays defined. The quantisers of the weights
 * (quant_ref.c) and of the activations (quant_act.c) both round with it, as ggml's do. */
static inline int fmoe__nearest_int(float v) {
    if (!(v > -4194303.f)) v = -4194303.f;
    if (!(v < 4194303.f)) v = 4194303.f;
    float f = v + 12582912.f;
    int32_t i;
    memcpy(&i, &f, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

/* The AVX2+FMA+F16C dot product (lib/quant_avx2.c); only called when the CPU has them.
 * Handles every supported type. */
float fmoe__quant_dot_avx2(uint32_t type, const void *row, const float *x, int64_t n);

#endif
