/*
 * quant_widen.h - rows of a ggml block format dequantised to f32 for the CPU backend's
 * sgemm path (prefill with quantized weights), AVX2 when the CPU has it (internal to
 * runtime/).
 *
 * The values are fmoe_quant_dequantize_row's bit for bit (each is the same f32 multiply,
 * then subtract, in the same order; no FMA), so the choice of path changes no logit;
 * tests/model/test_quant_matvec.c compares every byte. The plain-C path is
 * fmoe_quant_dequantize_row itself.
 */
#ifndef FMOE_CPU_QUANT_WIDEN_H
#define FMOE_CPU_QUANT_WIDEN_H

#include <stdint.h>

/* dst[r·cols + k] = value k of row r, for r < nrows; rows of `type` (fmoe_quant_supported,
 * cols whole blocks) are fmoe_quant_row_bytes(type, cols) apart from `rows`. */
void fmoe__quant_widen_rows(uint32_t type, const void *rows, int64_t nrows, int64_t cols,
                            float *dst);

#endif
