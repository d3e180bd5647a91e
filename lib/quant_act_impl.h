/*
 * quant_act_impl.h - what lib/quant_act.c and lib/quant_act_avx2.c share (internal).
 */
#ifndef FMOE_QUANT_ACT_IMPL_H
#define FMOE_QUANT_ACT_IMPL_H

#include <stdint.h>

/* Q8_K block offsets: f32 d, int8 q[256], int16 bsums[16]. */
#define FMOE__Q8K_Q 4
#define FMOE__Q8K_BSUMS (4 + 256)

/* The AVX2 dots (lib/quant_act_avx2.c), only called when the CPU has AVX2, FMA and F16C:
 * y[t·ystride] for t < nx, each bit-identical to the single-input result. */
void fmoe__quant_act_dots_avx2(uint32_t wtype, const void *row, const void *qx,
                               int64_t qx_stride, int32_t nx, int64_t n, float *y,
                               int64_t ystride);

#endif
