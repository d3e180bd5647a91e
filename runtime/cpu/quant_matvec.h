/*
 * quant_matvec.h - products of a matrix stored in a ggml block format (fmoe/quant.h) with
 * f32 vectors, over the CPU backend's thread pool (internal to runtime/).
 *
 * This is the kernel the forward pass will call for quantized GGUF weights: rows are split
 * among the pool's workers in chunks. With few input vectors (decode) each row is one
 * fmoe_quant_dot per vector (AVX2 when the CPU has it), the weights never widened in
 * memory; with QUANT_MATVEC_WIDEN_MIN or more (prefill) and scratch given, each row is
 * dequantised once into the worker's scratch and dotted in f32 with every vector, so the
 * unpacking is paid once per row instead of once per vector. Results are the same
 * whatever the thread count (each output is one row's dot on one thread); they depend on
 * nx only through that choice of path, as the CPU backend's bf16 products do.
 */
#ifndef FMOE_CPU_QUANT_MATVEC_H
#define FMOE_CPU_QUANT_MATVEC_H

#include <stdint.h>

#include "threadpool.h"

#define QUANT_MATVEC_WIDEN_MIN 4

/*
 * y[t·ldy + r] = Σ_k W[r][k]·x[t·ldx + k] for r < rows, t < nx, where W is `rows` rows of
 * `cols` values of `type` (fmoe_quant_supported; cols whole blocks), row r at
 * W + r·fmoe_quant_row_bytes(type, cols). `pool` may be NULL (the calling thread does it
 * all). `scratch`: NULL, or one buffer of `cols` floats per pool worker
 * (fmoe__pool_threads; one when pool is NULL), used when nx >= QUANT_MATVEC_WIDEN_MIN.
 * Allocates nothing; not reentrant on one pool (fmoe__pool_run is not).
 */
void fmoe__quant_matvec(fmoe__pool *pool, uint32_t type, const void *W, int64_t rows,
                        int64_t cols, const float *x, int32_t nx, int64_t ldx, float *y,
                        int64_t ldy, float *const *scratch);

#endif
