// cuda_mla.cu - multi-head latent attention (DeepSeek-V2/V3) on the device, the
// absorbed form over the latent cache that runtime/cpu/cpu_mla.c computes on the host
// (its comment has the maths: "DeepSeek-V2", §2.1.2; runtime/model/mla.c the block
// around it). Written to be checked first, not to be fast: nothing here has run on a GPU
// yet (docs/gpu.md).
//
// Design
//
// Three steps queued on the compute stream, the CPU's order:
//   1. rotary dims: one thread per query head row and per kv row runs
//      fmoe_rope_head_pairs (lib/rowwise.h), the very C cpu_mla.c runs, with the same
//      roundings (--fmad=false: a·c - b·s rounds twice, as in the CPU's ISO C build);
//      test_backend_ops compares them under rope's tolerance, claiming no more;
//   2. kv's n rows into the latent cache at pos0 (a device-to-device copy);
//   3. heads: one block per head, at most scratch_slots blocks (each loops over heads
//      h = blockIdx.x, blockIdx.x + gridDim.x, ...), each using its own slot of the
//      caller's scratch (backend_impl.h fmoe__mla_scratch_floats): wbuf [r][dn] the
//      head's k_b rows then [dv][r] its v_b rows, as f32 (widened from bf16/f16, or
//      dequantised with lib/quant_block.h), qlat [n][r], olat [n][r], sc [pos0 + n] the
//      scores. Per query row t:
//        qlat[c] = k_b[c] · q_nope   thread per latent dim, fmaf over i in order (the
//                               CPU's row dot, in another order)
//        sc[p] = scale · (qlat · c_p + q_pe · k_pe_p)   warp per key, lane-strided sums
//        softmax                block max, expf, block sum (attention_kernel's reductions)
//        olat = Σ_p sc[p] c_p   thread per latent dim, fmaf over p in order
//        out[v] = v_b[v] · olat   warp per output dim
//      Barriers separate the steps: scratch is global memory, which __syncthreads makes
//      visible within the block.
// Every sum has a fixed order (by lane and dimension), so a result is the same run to
// run; it differs from the CPU's by the order of the dot products and expf only.
// A fast kernel (keys tiled in shared memory, several heads per block, the latent cache
// read once per block) is work to come, as for attention_kernel.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <math.h>
#include <stdint.h>

extern "C" {
#include "quant_block.h"
#include "rowwise.h"
}
#include "cuda_mla.h"

#define MLA_THREADS 256
#define MLA_ROPE_THREADS 64

#include "cuda_reduce.cuh"

/* Step 1: task < n·H rotates query row (t, h)'s rope dims, task >= n·H kv row t's. */
__global__ static void mla_rope_kernel(float *q, float *kv, const float *cos, const float *sin,
                                       int32_t n, int32_t H, int32_t dn, int32_t dr,
                                       int32_t r, int32_t interleave) {
    const int64_t task = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t nq = (int64_t)n * H;
    if (task >= nq + n) return;
    const int64_t t = task < nq ? task / H : task - nq, half = dr / 2;
    float *x = task < nq ? q + task * (dn + dr) + dn : kv + t * (r + dr) + r;
    fmoe_rope_head_pairs(x, cos + t * half, sin + t * half, dr, interleave);
}

/* Rows row0.. (count of them) of a matrix [..][cols] (k_b's rows are dn long, v_b's r)
 * as f32 into dst[count][cols], by the block's threads: elements of f32/bf16/f16, groups
 * of 8 of ggml blocks. */
__device__ static void widen_rows(float *dst, const void *W, uint32_t quant, int32_t dtype,
                                  int64_t row0, int32_t count, int32_t cols) {
    if (quant) {
        const int64_t bv = fmoe__qblock_values(quant), bb = fmoe__qblock_bytes(quant);
        const int64_t row_bytes = cols / bv * bb, per_row = cols / 8;
        for (int64_t g = threadIdx.x; g < (int64_t)count * per_row; g += blockDim.x) {
            const int64_t i = g / per_row, v = (g - i * per_row) * 8, blk = v / bv;
            const uint8_t *b = (const uint8_t *)W + (row0 + i) * row_bytes + blk * bb;
            fmoe__qblock_dequant8(quant, b, (int)((v - blk * bv) / 8), dst + i * cols + v);
        }
        return;
    }
    const int64_t total = (int64_t)count * cols, base = row0 * cols;
    for (int64_t e = threadIdx.x; e < total; e += blockDim.x) {
        if (dtype == FMOE_ST_F32)
            dst[e] = ((const float *)W)[base + e];
        else if (dtype == FMOE_ST_BF16)
            dst[e] = __uint_as_float((uint32_t)((const uint16_t *)W)[base + e] << 16);
        else
            dst[e] = __half2float(((const __half *)W)[base + e]);
    }
}

/* Step 3 (design comment): heads blockIdx.x, blockIdx.x + gridDim.x, ... on slot
 * blockIdx.x of the scratch. Branches on m and mx are uniform across the block. */
__global__ static void __launch_bounds__(MLA_THREADS)
    mla_head_kernel(fmoe__mla_args a, const void *Wk, uint32_t kquant, int32_t kdtype,
                    const void *Wv, uint32_t vquant, int32_t vdtype, int64_t slot_floats) {
    __shared__ float red[32];
    const int32_t H = a.n_heads, dn = a.nope, dr = a.rope, dv = a.v_dim, r = a.rank;
    const int64_t qs = dn + dr, ks = r + dr;
    float *wbuf = a.scratch + (int64_t)blockIdx.x * slot_floats; /* [r][dn], [dv][r] */
    float *vbuf = wbuf + (int64_t)r * dn;
    float *qlat = wbuf + (int64_t)(dn + dv) * r;                  /* [n][r] */
    float *olat = qlat + (int64_t)a.n * r;                        /* [n][r] */
    float *sc = olat + (int64_t)a.n * r;                          /* [pos0 + n] */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int32_t h = blockIdx.x; h < H; h += gridDim.x) {
        widen_rows(wbuf, Wk, kquant, kdtype, (int64_t)h * r, r, dn);
        widen_rows(vbuf, Wv, vquant, vdtype, (int64_t)h * dv, dv, r);
        __syncthreads();
        for (int32_t t = 0; t < a.n; t++) {
            const float *q = a.q + ((int64_t)t * H + h) * qs;
            float *ql = qlat + (int64_t)t * r, *ol = olat + (int64_t)t * r;
            for (int32_t i = threadIdx.x; i < r; i += blockDim.x) {
                float s = 0.0f;
                const float *kb = wbuf + (int64_t)i * dn;
                for (int32_t d = 0; d < dn; d++) s = fmaf(q[d], kb[d], s);
                ql[i] = s;
            }
            __syncthreads();
            const int32_t m = a.pos0 + t + 1;
            for (int32_t p = warp; p < m; p += nw) {
                const float *cj = a.cache + (int64_t)p * ks;
                float s1 = 0.0f, s2 = 0.0f;
                for (int32_t i = lane; i < r; i += 32) s1 = fmaf(ql[i], cj[i], s1);
                for (int32_t d = lane; d < dr; d += 32) s2 = fmaf(q[dn + d], cj[r + d], s2);
                s1 = warp_sum(s1);
                s2 = warp_sum(s2);
                if (lane == 0) sc[p] = a.scale * (s1 + s2);
            }
            __syncthreads();
            float mx = -INFINITY;
            for (int32_t p = threadIdx.x; p < m; p += blockDim.x) mx = sc[p] > mx ? sc[p] : mx;
            mx = block_max(mx, red);
            if (mx == -INFINITY) { /* fmoe_softmax_row's all-masked row: zeros */
                for (int32_t p = threadIdx.x; p < m; p += blockDim.x) sc[p] = 0.0f;
            } else {
                float sum = 0.0f;
                for (int32_t p = threadIdx.x; p < m; p += blockDim.x) {
                    const float e = expf(sc[p] - mx);
                    sc[p] = e;
                    sum += e;
                }
                sum = block_sum(sum, red);
                const float inv = 1.0f / sum;
                for (int32_t p = threadIdx.x; p < m; p += blockDim.x) sc[p] *= inv;
            }
            __syncthreads();
            for (int32_t i = threadIdx.x; i < r; i += blockDim.x) {
                float s = 0.0f;
                for (int32_t p = 0; p < m; p++) s = fmaf(sc[p], a.cache[(int64_t)p * ks + i], s);
                ol[i] = s;
            }
            __syncthreads();
            float *o = a.out + ((int64_t)t * H + h) * dv;
            for (int32_t v = warp; v < dv; v += nw) {
                const float *wv = vbuf + (int64_t)v * r;
                float s = 0.0f;
                for (int32_t i = lane; i < r; i += 32) s = fmaf(wv[i], ol[i], s);
                s = warp_sum(s);
                if (lane == 0) o[v] = s;
            }
            __syncthreads(); /* qlat, olat and sc are rewritten by the next row */
        }
    }
}

cudaError_t fmoe__cuda_mla_attention(cudaStream_t stream, const fmoe__mla_args *a,
                                     const void *wk_b, const void *wv_b) {
    const int32_t n = a->n, H = a->n_heads, r = a->rank, dr = a->rope;
    const int64_t ks = (int64_t)r + dr, tasks = (int64_t)n * (H + 1);
    mla_rope_kernel<<<(unsigned)((tasks + MLA_ROPE_THREADS - 1) / MLA_ROPE_THREADS),
                      MLA_ROPE_THREADS, 0, stream>>>(a->q, a->kv, a->cos, a->sin, n, H, a->nope,
                                                     dr, r, a->interleave);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    e = cudaMemcpyAsync(a->cache + (int64_t)a->pos0 * ks, a->kv, (size_t)(n * ks) * sizeof(float),
                        cudaMemcpyDeviceToDevice, stream);
    if (e != cudaSuccess) return e;
    const int64_t slot = fmoe__mla_scratch_floats(a->nope, a->v_dim, r, a->max_context,
                                                  a->max_batch);
    const int32_t grid = H < a->scratch_slots ? H : a->scratch_slots;
    mla_head_kernel<<<(unsigned)grid, MLA_THREADS, 0, stream>>>(
        *a, wk_b, a->wk_b->quant, (int32_t)a->wk_b->dtype, wv_b, a->wv_b->quant,
        (int32_t)a->wv_b->dtype, slot);
    return cudaGetLastError();
}
