/*
 * cuda_quant.h - the CUDA backend's kernels for quantized weights (cuda_quant.cu), which
 * cuda_forward.cu queues for matmul and get_rows on a fmoe__mat with quant set. Internal
 * to libfmoe-cuda.so (C++ linkage, hidden).
 *
 * W is a device copy of rows of ggml blocks, row_bytes = cols / block values · block bytes
 * (lib/quant_block.h), exactly the bytes of the GGUF file: nothing is repacked, so an
 * expert slot filled by write_slot from the file's bytes is used as is. cols must be a
 * multiple of the block's values (the caller checks). Each launcher queues its kernel on
 * `stream` and returns cudaGetLastError() (a bad configuration; a fault shows at the next
 * sync).
 */
#ifndef FMOE_CUDA_QUANT_H
#define FMOE_CUDA_QUANT_H

#include <cuda_runtime.h>
#include <stdint.h>

/* Most rows of x the on-the-fly kernel takes in one pass over the weights; matmuls with
 * more rows dequantise tiles of W into f32 and call cuBLAS (cuda_forward.cu). */
#define FMOE_CUDA_QMV_MAX_N 8

/* 1 when the kernels below handle ggml type `type` (fmoe__qblock_cuda_has: every type
 * with a formula in lib/quant_block.h). */
int fmoe__cuda_quant_has(uint32_t type);

/* y[t][rows] = x[t][cols] · Wᵀ for t < n <= FMOE_CUDA_QMV_MAX_N: one warp per row,
 * blocks dequantised on the fly, f32 sums in a fixed order. */
cudaError_t fmoe__cuda_quant_matvec(cudaStream_t stream, uint32_t type, const void *W,
                                    int64_t rows, int64_t cols, const float *x, int32_t n,
                                    float *y);

/* dst[rows][cols] = rows 0..rows-1 of W (already offset to the first row) as f32. */
cudaError_t fmoe__cuda_quant_dequant_rows(cudaStream_t stream, uint32_t type, const void *W,
                                          int64_t rows, int64_t cols, float *dst);

/* y[i][cols] = row idx[i] of W as f32, i < n; idx: device memory. */
cudaError_t fmoe__cuda_quant_get_rows(cudaStream_t stream, uint32_t type, const void *W,
                                      const int32_t *idx, int32_t n, int64_t cols, float *y);

#endif
