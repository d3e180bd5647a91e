/*
 * quant_matvec.h - products of a matrix stored in a ggml block format (fmoe/quant.h) with
 * f32 vectors, over the CPU backend's thread pool (internal to runtime/).
 *
 * This is the kernel the forward pass will call for quantized GGUF weights: rows are split
 * among the pool's workers in chunks, each row is one fmoe_quant_dot per input vector
 * (AVX2 when the CPU has it), so the weights are never widened in memory. Results are the
 * same whatever the thread count: each output is one row's dot, computed by one thread.
 */
#ifndef FMOE_CPU_QUANT_MATVEC_H
#define FMOE_CPU_QUANT_MATVEC_H

#include <stdint.h>

#include "threadpool.h"

/*
 * y[t·ldy + r] = Σ_k W[r][k]·x[t·ldx + k] for r < rows, t < nx, where W is `rows` rows of
 * `cols` values of `type` (fmoe_quant_supported; cols whole blocks), row r at
 * W + r·fmoe_quant_row_bytes(type, cols). `pool` may be NULL (the calling thread does it
 * all). Allocates nothing; not reentrant on one pool (fmoe__pool_run is not).
 */
void fmoe__quant_matvec(fmoe__pool *pool, uint32_t type, const void *W, int64_t rows,
                        int64_t cols, const float *x, int32_t nx, int64_t ldx, float *y,
                        int64_t ldy);

#endif
