/*
 * quant_matvec.h - products of a matrix stored in a ggml block format (fmoe/quant.h) with
 * f32 vectors, over the CPU backend's thread pool (internal to runtime/).
 *
 * The kernel the forward pass calls for quantized GGUF weights: rows are split among the
 * pool's workers in chunks. Two paths:
 * - f32 inputs (the default): each output is an f32 fmoe_quant_dot of the row's blocks,
 *   except that with QUANT_MATVEC_WIDEN_MIN or more inputs and scratch each row is first
 *   dequantised into the worker's scratch and dotted in f32;
 * - 8-bit inputs (act8, for Q8_0 and the K-quants, given scratch): the inputs are
 *   quantised once per call (fmoe/quant_act.h, as llama.cpp does) into scratch[0] and
 *   every row is unpacked once per four inputs for integer dots. About twice as fast,
 *   but each input moves by up to half a step of its 8-bit block, which moves a model's
 *   logits several times more than the weights' own quantisation does
 *   (docs/quantization.md), so the CPU backend takes it only when asked.
 * Results are the same whatever the thread count (each output is one row's dot on one
 * thread), and on the 8-bit path whatever the number of inputs too.
 */
#ifndef FMOE_CPU_QUANT_MATVEC_H
#define FMOE_CPU_QUANT_MATVEC_H

#include <stdint.h>

#include "../backend/threadpool.h"

#define QUANT_MATVEC_WIDEN_MIN 4

/*
 * y[t·ldy + r] = Σ_k W[r][k]·x[t·ldx + k] for r < rows, t < nx, where W is `rows` rows of
 * `cols` values of `type` (fmoe_quant_supported; cols whole blocks), row r at
 * W + r·fmoe_quant_row_bytes(type, cols). `pool` may be NULL (the calling thread does it
 * all). `scratch`: NULL, or one buffer of `scratch_floats` >= cols floats per pool worker
 * (fmoe__pool_threads; one when pool is NULL): with act8, scratch[0] holds the 8-bit
 * inputs (as many per pass as fit); otherwise each worker widens rows into its own.
 * `act8`: nonzero for the 8-bit path where the type has one (fmoe_quant_act_supported).
 * Allocates nothing; not reentrant on one pool (fmoe__pool_run is not).
 */
void fmoe__quant_matvec(fmoe__pool *pool, uint32_t type, const void *W, int64_t rows,
                        int64_t cols, const float *x, int32_t nx, int64_t ldx, float *y,
                        int64_t ldy, float *const *scratch, int64_t scratch_floats,
                        int act8);

/*
 * Rows [r0, r1) of one such product: the kernel of every chunk fmoe__quant_matvec hands a
 * worker, for callers that split products their own way (cpu_experts.c). `qx`: nx 8-bit
 * inputs qx_bytes apart (the 8-bit path; x unused), or NULL for f32 inputs x (ldx apart);
 * `widen_row`: cols floats of scratch, or NULL. The same bits as fmoe__quant_matvec's for
 * those rows, whatever the split.
 */
void fmoe__quant_matvec_rows(uint32_t type, const void *W, int64_t row_bytes, int64_t r0,
                             int64_t r1, int64_t cols, const float *x, int64_t ldx,
                             const void *qx, int64_t qx_bytes, int32_t nx, float *y,
                             int64_t ldy, float *widen_row);

/*
 * Rows of a product with nx inputs that one task (one kernel call) takes when `threads`
 * threads share it: a multiple of 16. With more inputs than the 8-bit kernels take in one
 * pass (4), 16, so that a chunk's rows stay in L1/L2 while the groups of inputs go past.
 * With fewer, the kernel reads each row once whatever the chunk, and every call costs a
 * dispatch (type, CPU level, row sizes: ~300 instructions, as many as a 16-row chunk's
 * loads of 4-bit weights take time for), so chunks are as large as balance allows: all the
 * rows on one thread, else about TASKS_PER_THREAD tasks a thread. A row's dot has the same
 * bits whatever the chunk, so the results still do not depend on the thread count.
 */
int64_t fmoe__quant_matvec_chunk(int32_t threads, int64_t rows, int32_t nx);

#endif
