/*
 * cuda_mla.h - the CUDA backend's multi-head latent attention (DeepSeek-V2/V3;
 * cuda_mla.cu), which cuda_forward.cu's mla_attention entry queues after checking the
 * arguments and mapping k_b and v_b to their device copies. Internal to libfmoe-cuda.so
 * (C++ linkage, hidden).
 */
#ifndef FMOE_CUDA_MLA_H
#define FMOE_CUDA_MLA_H

#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "../backend/backend_impl.h"
}

/*
 * Queues the whole op of `a` (backend_impl.h fmoe__mla_args; every pointer device memory)
 * on `stream`: the rotary dims of q and kv, kv's rows into the latent cache at pos0, and
 * the absorbed attention. `wk_b` and `wv_b` are the device copies of a->wk_b's and
 * a->wv_b's bytes (f32, bf16, f16, or ggml blocks of a type fmoe__qblock_cuda_has takes,
 * as each says); the caller has checked the shapes (rope <= FMOE_ROPE_PAIRS_MAX and even,
 * n <= max_batch, pos0 + n <= max_context, scratch_slots >= 1, the rows of a block type
 * whole blocks: nope for k_b, rank for v_b).
 * @return the launches' status (a fault shows at the next sync).
 */
cudaError_t fmoe__cuda_mla_attention(cudaStream_t stream, const fmoe__mla_args *a,
                                     const void *wk_b, const void *wv_b);

#endif
