/*
 * backend_types.c - a GGUF model's tensor types against the kernels of the backend a
 * session asks for: the CPU backend computes every type the loader takes
 * (fmoe_quant_supported); the CUDA backend has kernels for every block type with a
 * formula in lib/quant_block.h (fmoe__qblock_cuda_has), which today are all the types the
 * loader takes (tests/lib/test_quant_block.c checks it): this check stays for a type
 * added to the loader before its kernels. Checked when the session is created, before
 * the backend is looked up, so that the refusal is one line naming the tensor and its type,
 * and reads the same on a machine without CUDA, instead of a failure at the first product
 * that uses the tensor, part way through a run.
 * The families added later (DeepSeek-V2/V3, GLM-4.5, Phi-3.5-MoE, gpt-oss, Llama 4) are
 * no longer refused here: the CUDA table has every op they use (docs/gpu.md, "New model
 * families"), compiled but not yet run on a GPU; fmoe_session_init still refuses a family
 * on a backend whose table lacks one of its ops.
 */
#include "fmoe/error.h"
#include "fmoe/gguf.h"
#include "fmoe/quant.h"
#include "model_impl.h"
#include "quant_block.h"

int fmoe__model_check_backend_types(const fmoe_model *m, fmoe_backend_kind backend) {
    if (backend != FMOE_BACKEND_CUDA) return 0;
    if (!m->gguf) return 0;
    const int64_t n = fmoe_gguf_tensor_count(m->gguf);
    for (int64_t i = 0; i < n; i++) {
        const fmoe_gguf_tensor *t = fmoe_gguf_tensor_at(m->gguf, i);
        /* every block type (block size > 1) without a formula in quant_block.h */
        if (fmoe_ggml_block_size(t->type) > 1 && !fmoe__qblock_cuda_has(t->type))
            return fmoe_error_set(FMOE_EUNSUPPORTED,
                                  "%s: tensor %s is %s, which the cuda backend has no kernels "
                                  "for; run this model with --backend cpu",
                                  fmoe_gguf_name(m->gguf), t->name, fmoe_ggml_type_name(t->type));
    }
    return 0;
}
