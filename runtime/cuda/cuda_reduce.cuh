// cuda_reduce.cuh - the warp and block reductions the CUDA kernels share (cuda_forward.cu,
// cuda_mla.cu, cuda_quant.cu): fixed butterflies, so a sum is the same run to run; every
// thread gets the result. Internal; included by the backend's .cu files only.
#ifndef FMOE_CUDA_REDUCE_CUH
#define FMOE_CUDA_REDUCE_CUH

#include <math.h>

/* T float or double (the norms sum squares in double) */
template <typename T> __device__ static inline T warp_sum(T v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* The comparison of fmoe_softmax_row's max (a NaN never replaces the running value). */
__device__ static inline float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) {
        const float u = __shfl_xor_sync(0xffffffffu, v, o);
        v = u > v ? u : v;
    }
    return v;
}

/* Block reductions over blockDim.x (a multiple of 32, at most 1024) threads; every thread
 * gets the result. red: [32] shared. Each warp reduces the per-warp partials itself, in
 * the same order, so no broadcast is needed; the closing barrier lets `red` be reused. */
__device__ static float block_max(float v, float *red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = warp_max(lane < nw ? red[lane] : -INFINITY);
    __syncthreads();
    return v;
}

template <typename T> __device__ static T block_sum(T v, T *red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = warp_sum(lane < nw ? red[lane] : T(0));
    __syncthreads();
    return v;
}

#endif
