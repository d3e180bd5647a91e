// cuda_quant.cu - kernels for weights stored as ggml blocks (every type lib/quant_block.h
// has a formula for: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, gpt-oss's MXFP4, Q2_K, Q3_K,
// Q4_K, Q5_K, Q6_K, IQ4_XS, and the i-quants IQ2_XXS .. IQ1_M of lib/quant_iq_block.h,
// whose grids are device copies in global memory):
// a matrix-vector product that dequantises on the fly, a tile dequantiser feeding cuBLAS,
// and embedding rows (cuda_quant.h). The value of every weight comes from
// lib/quant_block.h, the C the CPU's fmoe_quant_dequantize_row runs (tests/python/
// test_gguf_quants.py: bit for bit against gguf-py); built with --fmad=false like the rest
// of the module, so d·q - m rounds twice as in the CPU's ISO C build, and a dequantised
// weight is the CPU's bit for bit.
//
// Design
//
// Work unit. One thread produces 8 consecutive values of one block
// (fmoe__qblock_dequant8): a block of 256 values (Q2_K .. Q6_K, IQ4_XS, the i-quants:
// for those a group is one grid point, looked up per thread) is 32 groups,
// one per lane of a warp; a block of 32 (Q8_0, Q4_0 .. IQ4_NL, MXFP4) is 4 groups, so a
// warp covers 8 blocks. Either way a warp covers 256 consecutive values of a row per
// step, lane l values 8l..8l+7, so its reads of x are contiguous across the warp. A
// thread decodes its sub-block's scale and min once for its 8 values; the f16 block
// scales are read by the 32 (or 4) threads of a block from the same bytes (one broadcast
// load). Blocks of 32 of 18 to 24 bytes lie at any byte offset; all reads are bytes.
//
// quant_matvec (decode: n <= FMOE_CUDA_QMV_MAX_N rows of x). One warp per output row,
// QMV_WARPS rows per block. Each thread dequantises its 8 weights once per step and
// multiplies them into up to 8 running sums, one per row of x, with fmaf (the CPU's AVX2
// dot fuses too), in value order; the warp then adds its 32 partial sums with a fixed
// butterfly. The order of every sum is fixed by (cols, lane), so results are the same
// run to run; they differ from the CPU's (whose order is its SIMD width's) by summation
// rounding only. The weights are read once per call whatever n is; x comes through
// L1/L2 (every warp of the grid reads the same n·cols floats). A kernel that stages x in
// shared memory and reads W with vector loads is the faster one to come: this one is
// written to be checked first.
//
// dequant_rows (prefill: more rows of x). The caller dequantises a tile of W into f32
// scratch and multiplies it with cublasSgemm (no TF32), as the CPU backend dequantises
// blocks of rows into f32 and calls sgemm: both sides multiply the same f32 weights by
// the same f32 activations and differ by summation order only.
//
// get_rows. One block per requested row, threads over its groups of 8.
#include <cuda_runtime.h>

#include <stdint.h>

extern "C" {
#include "quant_block.h"
}
#include "cuda_quant.h"

#define QMV_WARPS 4    /* output rows (warps) per block of the matvec kernel */
#define DQ_THREADS 256 /* threads per block of the tile dequantiser */
#define GR_THREADS 128 /* threads per block of get_rows */

/* Values and bytes of a block of type T, as compile-time constants (the same numbers as
 * fmoe__qblock_values and fmoe__qblock_bytes, which are not constexpr: C has none;
 * tests/lib/test_quant_block.c checks those against the type table). */
template <uint32_t T> struct qblock {
    static constexpr bool iq = T == FMOE_GGML_IQ2_XXS || T == FMOE_GGML_IQ2_XS ||
                               T == FMOE_GGML_IQ2_S || T == FMOE_GGML_IQ3_XXS ||
                               T == FMOE_GGML_IQ3_S || T == FMOE_GGML_IQ1_S ||
                               T == FMOE_GGML_IQ1_M;
    static constexpr bool k256 = iq || T == FMOE_GGML_Q2_K || T == FMOE_GGML_Q3_K ||
                                 T == FMOE_GGML_Q4_K || T == FMOE_GGML_Q5_K ||
                                 T == FMOE_GGML_Q6_K || T == FMOE_GGML_IQ4_XS;
    static constexpr int64_t values = k256 ? FMOE_QK_K : FMOE_QK8_0;
    static constexpr int64_t bytes = T == FMOE_GGML_Q8_0     ? FMOE_Q8_0_BYTES
                                     : T == FMOE_GGML_Q4_0   ? FMOE_Q4_0_BYTES
                                     : T == FMOE_GGML_Q4_1   ? FMOE_Q4_1_BYTES
                                     : T == FMOE_GGML_Q5_0   ? FMOE_Q5_0_BYTES
                                     : T == FMOE_GGML_Q5_1   ? FMOE_Q5_1_BYTES
                                     : T == FMOE_GGML_IQ4_NL ? FMOE_IQ4_NL_BYTES
                                     : T == FMOE_GGML_MXFP4  ? FMOE_MXFP4_BYTES
                                     : T == FMOE_GGML_Q2_K   ? FMOE_Q2_K_BYTES
                                     : T == FMOE_GGML_Q3_K   ? FMOE_Q3_K_BYTES
                                     : T == FMOE_GGML_Q4_K   ? FMOE_Q4_K_BYTES
                                     : T == FMOE_GGML_Q5_K   ? FMOE_Q5_K_BYTES
                                     : T == FMOE_GGML_Q6_K   ? FMOE_Q6_K_BYTES
                                     : T == FMOE_GGML_IQ4_XS ? FMOE_IQ4_XS_BYTES
                                     : T == FMOE_GGML_IQ2_XXS ? FMOE_IQ2_XXS_BYTES
                                     : T == FMOE_GGML_IQ2_XS ? FMOE_IQ2_XS_BYTES
                                     : T == FMOE_GGML_IQ2_S  ? FMOE_IQ2_S_BYTES
                                     : T == FMOE_GGML_IQ3_XXS ? FMOE_IQ3_XXS_BYTES
                                     : T == FMOE_GGML_IQ3_S  ? FMOE_IQ3_S_BYTES
                                     : T == FMOE_GGML_IQ1_S  ? FMOE_IQ1_S_BYTES
                                     : T == FMOE_GGML_IQ1_M  ? FMOE_IQ1_M_BYTES
                                                             : 0;
    static_assert(bytes > 0, "a block type without kernels");
};

/* Values v..v+7 (v a multiple of 8) of the row at wr into w[8]. */
template <uint32_t T>
__device__ static inline void group_of_8(const uint8_t *wr, int64_t v, float *w) {
    const int64_t blk = v / qblock<T>::values;
    fmoe__qblock_dequant8(T, wr + blk * qblock<T>::bytes,
                          (int)((v - blk * qblock<T>::values) / 8), w);
}

#include "cuda_reduce.cuh"

static unsigned int grid_for(int64_t items, int64_t per_block) {
    int64_t b = (items + per_block - 1) / per_block;
    if (b > (1 << 20)) b = 1 << 20; /* grid-stride loops take the rest */
    return (unsigned int)(b < 1 ? 1 : b);
}

/* ---------------------------------------------------------------------------------- */
/* Kernels                                                                            */
/* ---------------------------------------------------------------------------------- */

template <uint32_t T>
__global__ static void __launch_bounds__(QMV_WARPS * 32)
    quant_matvec_kernel(float *y, const uint8_t *W, int64_t rows, int64_t cols,
                        const float *x, int32_t n) {
    const int64_t row_bytes = cols / qblock<T>::values * qblock<T>::bytes;
    const int lane = threadIdx.x & 31;
    /* r is uniform across a warp, so every lane reaches the shuffles below */
    for (int64_t r = (int64_t)blockIdx.x * QMV_WARPS + (threadIdx.x >> 5); r < rows;
         r += (int64_t)gridDim.x * QMV_WARPS) {
        const uint8_t *wr = W + r * row_bytes;
        float acc[FMOE_CUDA_QMV_MAX_N];
#pragma unroll
        for (int t = 0; t < FMOE_CUDA_QMV_MAX_N; t++) acc[t] = 0.0f;
        for (int64_t v = 8 * lane; v < cols; v += 256) {
            float w[8];
            group_of_8<T>(wr, v, w);
#pragma unroll
            for (int t = 0; t < FMOE_CUDA_QMV_MAX_N; t++) {
                if (t < n) {
                    const float *xt = x + t * cols + v;
                    float s = acc[t];
#pragma unroll
                    for (int i = 0; i < 8; i++) s = fmaf(w[i], xt[i], s);
                    acc[t] = s;
                }
            }
        }
#pragma unroll
        for (int t = 0; t < FMOE_CUDA_QMV_MAX_N; t++) {
            if (t < n) {
                const float s = warp_sum(acc[t]);
                if (lane == 0) y[t * rows + r] = s;
            }
        }
    }
}

template <uint32_t T>
__global__ static void dequant_rows_kernel(float *dst, const uint8_t *W, int64_t rows,
                                           int64_t cols) {
    const int64_t row_bytes = cols / qblock<T>::values * qblock<T>::bytes;
    const int64_t groups = cols / 8, total = rows * groups;
    for (int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; g < total;
         g += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = g / groups, v = (g - r * groups) * 8;
        float w[8];
        group_of_8<T>(W + r * row_bytes, v, w);
        float *d = dst + r * cols + v;
#pragma unroll
        for (int i = 0; i < 8; i++) d[i] = w[i];
    }
}

template <uint32_t T>
__global__ static void get_rows_kernel(float *y, const uint8_t *W, const int32_t *idx,
                                       int64_t cols) {
    const int64_t row_bytes = cols / qblock<T>::values * qblock<T>::bytes;
    const int64_t i = blockIdx.x;
    const uint8_t *wr = W + (int64_t)idx[i] * row_bytes;
    float *yr = y + i * cols;
    for (int64_t v = 8 * (int64_t)threadIdx.x; v < cols; v += 8 * (int64_t)blockDim.x) {
        float w[8];
        group_of_8<T>(wr, v, w);
#pragma unroll
        for (int k = 0; k < 8; k++) yr[v + k] = w[k];
    }
}

/* ---------------------------------------------------------------------------------- */
/* Launchers                                                                          */
/* ---------------------------------------------------------------------------------- */

int fmoe__cuda_quant_has(uint32_t type) { return fmoe__qblock_cuda_has(type); }

/* Runs the launch given (of a kernel template at T) for the type's T and returns its
 * status; cudaErrorInvalidValue for a type without kernels (callers check
 * fmoe__cuda_quant_has first). */
#define BY_TYPE(type, ...)                                                                \
    do {                                                                                  \
        switch (type) {                                                                   \
        case FMOE_GGML_Q8_0: { constexpr uint32_t T = FMOE_GGML_Q8_0; __VA_ARGS__; break; } \
        case FMOE_GGML_Q4_0: { constexpr uint32_t T = FMOE_GGML_Q4_0; __VA_ARGS__; break; } \
        case FMOE_GGML_Q4_1: { constexpr uint32_t T = FMOE_GGML_Q4_1; __VA_ARGS__; break; } \
        case FMOE_GGML_Q5_0: { constexpr uint32_t T = FMOE_GGML_Q5_0; __VA_ARGS__; break; } \
        case FMOE_GGML_Q5_1: { constexpr uint32_t T = FMOE_GGML_Q5_1; __VA_ARGS__; break; } \
        case FMOE_GGML_IQ4_NL: { constexpr uint32_t T = FMOE_GGML_IQ4_NL; __VA_ARGS__; break; } \
        case FMOE_GGML_MXFP4: { constexpr uint32_t T = FMOE_GGML_MXFP4; __VA_ARGS__; break; } \
        case FMOE_GGML_Q2_K: { constexpr uint32_t T = FMOE_GGML_Q2_K; __VA_ARGS__; break; } \
        case FMOE_GGML_Q3_K: { constexpr uint32_t T = FMOE_GGML_Q3_K; __VA_ARGS__; break; } \
        case FMOE_GGML_Q4_K: { constexpr uint32_t T = FMOE_GGML_Q4_K; __VA_ARGS__; break; } \
        case FMOE_GGML_Q5_K: { constexpr uint32_t T = FMOE_GGML_Q5_K; __VA_ARGS__; break; } \
        case FMOE_GGML_Q6_K: { constexpr uint32_t T = FMOE_GGML_Q6_K; __VA_ARGS__; break; } \
        case FMOE_GGML_IQ4_XS: { constexpr uint32_t T = FMOE_GGML_IQ4_XS; __VA_ARGS__; break; } \
        case FMOE_GGML_IQ2_XXS: { constexpr uint32_t T = FMOE_GGML_IQ2_XXS; __VA_ARGS__; break; } \
        case FMOE_GGML_IQ2_XS: { constexpr uint32_t T = FMOE_GGML_IQ2_XS; __VA_ARGS__; break; } \
        case FMOE_GGML_IQ2_S: { constexpr uint32_t T = FMOE_GGML_IQ2_S; __VA_ARGS__; break; } \
        case FMOE_GGML_IQ3_XXS: { constexpr uint32_t T = FMOE_GGML_IQ3_XXS; __VA_ARGS__; break; } \
        case FMOE_GGML_IQ3_S: { constexpr uint32_t T = FMOE_GGML_IQ3_S; __VA_ARGS__; break; } \
        case FMOE_GGML_IQ1_S: { constexpr uint32_t T = FMOE_GGML_IQ1_S; __VA_ARGS__; break; } \
        case FMOE_GGML_IQ1_M: { constexpr uint32_t T = FMOE_GGML_IQ1_M; __VA_ARGS__; break; } \
        default: return cudaErrorInvalidValue;                                            \
        }                                                                                 \
        return cudaGetLastError();                                                        \
    } while (0)

cudaError_t fmoe__cuda_quant_matvec(cudaStream_t stream, uint32_t type, const void *W,
                                    int64_t rows, int64_t cols, const float *x, int32_t n,
                                    float *y) {
    if (n < 1 || n > FMOE_CUDA_QMV_MAX_N) return cudaErrorInvalidValue;
    const unsigned grid = grid_for(rows, QMV_WARPS);
    const uint8_t *w = (const uint8_t *)W;
    BY_TYPE(type,
            quant_matvec_kernel<T><<<grid, QMV_WARPS * 32, 0, stream>>>(y, w, rows, cols, x, n));
}

cudaError_t fmoe__cuda_quant_dequant_rows(cudaStream_t stream, uint32_t type, const void *W,
                                          int64_t rows, int64_t cols, float *dst) {
    const unsigned grid = grid_for(rows * (cols / 8), DQ_THREADS);
    const uint8_t *w = (const uint8_t *)W;
    BY_TYPE(type, dequant_rows_kernel<T><<<grid, DQ_THREADS, 0, stream>>>(dst, w, rows, cols));
}

cudaError_t fmoe__cuda_quant_get_rows(cudaStream_t stream, uint32_t type, const void *W,
                                      const int32_t *idx, int32_t n, int64_t cols, float *y) {
    const int threads = cols / 8 < GR_THREADS ? 32 * (int)((cols / 8 + 31) / 32) : GR_THREADS;
    const uint8_t *w = (const uint8_t *)W;
    BY_TYPE(type, get_rows_kernel<T><<<(unsigned)n, threads, 0, stream>>>(y, w, idx, cols));
}
