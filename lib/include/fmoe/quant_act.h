/*
 * fmoe/quant_act.h - dot products of ggml block rows with activations quantised to 8 bits,
 * the way llama.cpp's CPU backend multiplies quantized weights: the input vector is
 * quantised once per matrix product (Q8_0 blocks against rows of the 32-value types Q8_0,
 * Q4_0, Q4_1, Q5_0, Q5_1 and IQ4_NL; Q8_K blocks against Q2_K/Q3_K/Q4_K/Q5_K/Q6_K/IQ4_XS
 * rows and the i-quants IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M), and each
 * block's dot is an integer sum scaled once.
 *
 *     uint8_t qx[fmoe_quant_act_bytes(type, n)];
 *     fmoe_quant_act_quantize(type, x, qx, n);               // once per input vector
 *     float y = fmoe_quant_act_dot(type, row, qx, n);        // per row
 *
 * Integer products are exact, so the AVX2 path (maddubs/madd, picked at run time as
 * fmoe_quant_dot's is) and the plain-C reference (fmoe_quant_act_dot_ref) compute the same
 * per-block sums and differ only in the order they add the scaled f32 block results.
 * Against an f32 input the result carries the quantisation of x: each value moves by at
 * most half a step of its block (amax/254 for Q8_0 blocks of 32, the same for Q8_K blocks
 * of 256), so |y - Σ w·x| <= Σ_blocks step/2 · Σ_block |w| plus rounding
 * (tests/lib/test_quant_act.c checks both bounds). docs/quantization.md has the speed.
 *
 * Block formats (ggml-common.h): Q8_0 is an f16 d and int8 q[32], x = d·q. Q8_K is an f32
 * d, int8 q[256] and int16 bsums[16] (the sum of each 16 q, which the K-quants' mins and
 * Q6_K's offset of 32 multiply), x = d·q. The quantisers are ggml's reference ones
 * (quantize_row_q8_0_ref, quantize_row_q8_K_ref), so the blocks equal llama.cpp's.
 *
 * Thread safety: every function is pure (no state but the one-time CPU feature probe).
 */
#ifndef FMOE_QUANT_ACT_H
#define FMOE_QUANT_ACT_H

#include <stdint.h>

#define FMOE_Q8_K_BYTES (4 + 256 + 2 * 16) /* f32 d; int8 q[256]; int16 bsums[16] */

/* 1 for the weight types with an 8-bit-activation dot: Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
 * IQ4_XS and the i-quants IQ2_XXS .. IQ1_M (against Q8_K inputs), Q4_0, Q4_1, Q5_0, Q5_1,
 * IQ4_NL, MXFP4 (against Q8_0). */
int fmoe_quant_act_supported(uint32_t wtype);

/* Bytes of one quantised input of n values for rows of wtype (n whole blocks of the
 * row type), or -1 when wtype is not supported or n is not whole blocks. */
int64_t fmoe_quant_act_bytes(uint32_t wtype, int64_t n);

/* Quantises x[n] into qx (fmoe_quant_act_bytes(wtype, n) bytes) for rows of wtype.
 * Non-finite inputs give unspecified blocks. FMOE_ASSERT on an unsupported wtype. */
void fmoe_quant_act_quantize(uint32_t wtype, const float *x, void *qx, int64_t n);

/* The values qx stands for (d·q), into x[n]: what the dots below multiply with. */
void fmoe_quant_act_dequantize(uint32_t wtype, const void *qx, float *x, int64_t n);

/* Σ_i row[i]·qx[i] over n values, row in wtype and qx from fmoe_quant_act_quantize: the
 * fastest path this CPU has (FMOE_NO_AVX2 in the environment: the reference). */
float fmoe_quant_act_dot(uint32_t wtype, const void *row, const void *qx, int64_t n);

/* The same for nx inputs at once: y[t·ystride] = dot(row, qx + t·qx_stride) for t < nx.
 * Each row block is unpacked once for all of them; every y equals what
 * fmoe_quant_act_dot gives for that input, bit for bit. */
void fmoe_quant_act_dots(uint32_t wtype, const void *row, const void *qx, int64_t qx_stride,
                         int32_t nx, int64_t n, float *y, int64_t ystride);

/* Rows [0, rows) of a matrix, row r at W + r·row_bytes, against nx inputs:
 * y[t·ldy + r] = dot(row r, qx + t·qx_stride). The same bits as fmoe_quant_act_dots row by
 * row, with the checks and the dispatch paid once per call instead of once per row (which
 * matters for short rows: a 256-value row is one Q8_K block). */
void fmoe_quant_act_matvec(uint32_t wtype, const void *W, int64_t row_bytes, int64_t rows,
                           const void *qx, int64_t qx_stride, int32_t nx, int64_t n, float *y,
                           int64_t ldy);

/* The plain-C reference, one block at a time. */
float fmoe_quant_act_dot_ref(uint32_t wtype, const void *row, const void *qx, int64_t n);

#endif
