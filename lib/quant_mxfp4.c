/*
 * quant_mxfp4.c - f32 values to MXFP4 blocks (quant_block.h has the layout), for
 * `fmoe quantize --experts-type mxfp4` (lib/quant_ref.c's fmoe_quant_quantize_row calls it).
 *
 * ggml's reference quantiser (quantize_row_mxfp4_ref in ggml-quants.c), written out again:
 * the shared exponent is the OCP Microscaling v1.0 spec's conversion rule (the largest
 * power of two not above amax, less E2M1's largest exponent, 2): e = floor(log2 amax) - 2 + 127,
 * stored as the E8M0 byte; then every value takes the doubled E2M1 level whose product
 * with half the scale is nearest, the first of equals (ggml's strict <, so +0 before -0
 * and the lower index at a tie). Levels are not clamped: amax / 2^(e-127) is below 8,
 * so the largest level 6 (12 doubled) is the nearest one for anything larger.
 * gguf-py's gguf.quants MXFP4.quantize_blocks does the same f32 operations, and
 * tests/python/test_gguf_quants.py checks ours against it byte for byte.
 *
 * One departure, outside what either defines: where amax is below 2^-125 (the exponent
 * would be negative, an out-of-range cast in C) the byte is 0, the smallest scale.
 */
#include <math.h>
#include <stdint.h>

#include "quant_block.h"
#include "quant_impl.h"

void fmoe__quantize_mxfp4_block(const float *x, uint8_t *dst) {
    static const int8_t levels[16] = FMOE__MXFP4_LEVELS;
    float amax = 0;
    for (int j = 0; j < 32; j++)
        if (amax < fabsf(x[j])) amax = fabsf(x[j]);
    const float ef = amax > 0 ? floorf(log2f(amax)) - 2 + 127 : 0;
    const uint8_t e = ef < 0 ? 0 : ef > 255 ? 255 : (uint8_t)ef;
    const float d = fmoe__e8m0_half(e);
    dst[0] = e;
    for (int j = 0; j < 16; j++) {
        uint8_t q[2];
        for (int h = 0; h < 2; h++) { /* value j in the low nibble, j + 16 in the high */
            const float v = x[j + 16 * h];
            int best = 0;
            float best_err = fabsf((float)levels[0] * d - v);
            for (int k = 1; k < 16; k++) {
                const float err = fabsf((float)levels[k] * d - v);
                if (err < best_err) {
                    best = k;
                    best_err = err;
                }
            }
            q[h] = (uint8_t)best;
        }
        dst[1 + j] = (uint8_t)(q[0] | q[1] << 4);
    }
}
