/*
 * fmoe/elementwise.h - element-wise math written once, as plain C that the CPU backend
 * compiles and the CUDA kernels include (no GPU op without the CPU op it must match), so CPU
 * tests check the GPU arithmetic. FMOE_HD marks functions for both host and device under
 * nvcc.
 */
#ifndef FMOE_ELEMENTWISE_H
#define FMOE_ELEMENTWISE_H

#include <math.h>

#if defined(__CUDACC__)
#define FMOE_HD __host__ __device__
#else
#define FMOE_HD
#endif

/* SiLU (swish): x * sigmoid(x). */
static inline FMOE_HD float fmoe_silu(float x) { return x / (1.0f + expf(-x)); }

/* SwiGLU expert activation: silu(gate) * up. */
static inline FMOE_HD float fmoe_swiglu(float gate, float up) { return fmoe_silu(gate) * up; }

/* gpt-oss's clamped SwiGLU (transformers' GptOssExperts._apply_gate, OpenAI's
 * gpt_oss/torch/model.py swiglu): the gate clamped above at `limit`, the up projection to
 * [-limit, limit], then (up + 1) · gate · sigmoid(alpha · gate). */
static inline FMOE_HD float fmoe_swiglu_clamped(float gate, float up, float alpha, float limit) {
    gate = gate > limit ? limit : gate;
    up = up > limit ? limit : up < -limit ? -limit : up;
    return (up + 1.0f) * (gate / (1.0f + expf(-alpha * gate)));
}

#endif
