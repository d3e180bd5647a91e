/*
 * quant_act_impl.h - what lib/quant_act.c, lib/quant_act_avx2.c and lib/quant_act_avx512.c
 * share (internal).
 */
#ifndef FMOE_QUANT_ACT_IMPL_H
#define FMOE_QUANT_ACT_IMPL_H

#include <stdint.h>

/* Q8_K block offsets: f32 d, int8 q[256], int16 bsums[16]. */
#define FMOE__Q8K_Q 4
#define FMOE__Q8K_BSUMS (4 + 256)

/* The AVX2 dots (lib/quant_act_avx2.c), only called when the CPU has AVX2, FMA and F16C:
 * y[t·ldy + r] for rows r < rows (row_bytes apart) and inputs t < nx, each bit-identical
 * to the single-row, single-input result. */
void fmoe__quant_act_rows_avx2(uint32_t wtype, const void *W, int64_t row_bytes, int64_t rows,
                               const void *qx, int64_t qx_stride, int32_t nx, int64_t n,
                               float *y, int64_t ldy);

/* The same kernels with vpdpbusd for maddubs + madd (lib/quant_act_avx2_vnni.c), the same
 * bits; only called where fmoe__quant_vnni() (the CPU has AVX512-VNNI, -BW and -VL and GFNI). */
void fmoe__quant_act_rows_avx2_vnni(uint32_t wtype, const void *W, int64_t row_bytes, int64_t rows,
                                    const void *qx, int64_t qx_stride, int32_t nx, int64_t n,
                                    float *y, int64_t ldy);

/* The same with AVX-512 (lib/quant_act_avx512.c), only called when fmoe__quant_level() is
 * FMOE__QUANT_AVX512 (the CPU has AVX-512 F, BW and VL besides the AVX2 level's). */
void fmoe__quant_act_rows_avx512(uint32_t wtype, const void *W, int64_t row_bytes, int64_t rows,
                                 const void *qx, int64_t qx_stride, int32_t nx, int64_t n,
                                 float *y, int64_t ldy);

/* Q8_0 blocks of x[n] (n a multiple of 32), AVX2: the bytes of ggml's reference quantiser
 * (fmoe_quant_quantize_row), roundf's half-away-from-zero included. */
void fmoe__quant_q8_0_avx2(const float *x, uint8_t *dst, int64_t n);

/* One Q8_K block of x[256], ggml's quantize_row_q8_K_ref (lib/quant_act.c), and the same
 * bytes for n values (whole blocks) through AVX2. */
void fmoe__quant_q8_k_ref(const float *x, uint8_t *dst);
void fmoe__quant_q8_k_avx2(const float *x, uint8_t *dst, int64_t n);

#endif
