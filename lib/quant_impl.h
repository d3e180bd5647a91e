/*
 * quant_impl.h - what lib/quant.c, lib/quant_avx2.c and lib/quant_ref.c share (internal).
 */
#ifndef FMOE_QUANT_IMPL_H
#define FMOE_QUANT_IMPL_H

#include <stdint.h>

#include "quant_block.h" /* the block formats' value formulas, fmoe__scale_min_k4 */

/* The AVX2+FMA+F16C dot product (lib/quant_avx2.c); only called when the CPU has them.
 * Handles every supported type. */
float fmoe__quant_dot_avx2(uint32_t type, const void *row, const float *x, int64_t n);

#endif
