/*
 * quant_impl.h - what lib/quant.c, lib/quant_avx2.c and lib/quant_ref.c share (internal).
 */
#ifndef FMOE_QUANT_IMPL_H
#define FMOE_QUANT_IMPL_H

#include <stdint.h>

/* The 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K block's 12 scale bytes
 * (ggml's get_scale_min_k4): j < 4 in the low 6 bits of bytes j and j+4; j >= 4 split
 * into a nibble of byte j+4 and the top 2 bits of bytes j-4 and j. */
static inline void fmoe__scale_min_k4(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* The AVX2+FMA+F16C dot product (lib/quant_avx2.c); only called when the CPU has them.
 * Handles every supported type. */
float fmoe__quant_dot_avx2(uint32_t type, const void *row, const float *x, int64_t n);

#endif
