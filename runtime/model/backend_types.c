/*
 * backend_types.c - a GGUF model's tensor types against the kernels of the backend a
 * session asks for: the CPU backend computes every type the loader takes
 * (fmoe_quant_supported); the CUDA backend has none yet for the 32-value Q4_0, Q4_1,
 * Q5_0, Q5_1 and IQ4_NL, nor for Q2_K, Q3_K, IQ4_XS and the i-quants IQ2_XXS .. IQ1_M
 * (lib/quant_block.h,
 * fmoe__qblock_cuda_has). Checked when the
 * session is created, before the backend is looked up, so that the refusal is one line
 * naming the tensor and its type, and reads the same on a machine without CUDA, instead
 * of a failure at the first product that uses the tensor, part way through a run.
 * A DeepSeek-V2/V3 model (multi-head latent attention) and a Phi-3.5-MoE model (LayerNorm,
 * sparsemixer), a GLM-4.5 model (partial rotary embedding, biased sigmoid routing) and a
 * gpt-oss model (attention sinks, clamped SwiGLU) and a Llama 4 model are refused there the
 * same way.
 */
#include "fmoe/error.h"
#include "fmoe/gguf.h"
#include "fmoe/quant.h"
#include "model_impl.h"
#include "quant_block.h"

int fmoe__model_check_backend_types(const fmoe_model *m, fmoe_backend_kind backend) {
    if (backend != FMOE_BACKEND_CUDA) return 0;
    /* DeepSeek-V2/V3: the CUDA table has no mla_attention, nor the grouped, biased
     * router (fmoe_route_row_grouped), this round. */
    if (m->arch.mla)
        return fmoe_error_set(FMOE_EUNSUPPORTED,
                              "model_type %s: the cuda backend has no multi-head latent "
                              "attention nor grouped routing yet; run it with --backend cpu",
                              m->geo.model_type);
    /* Phi-3.5-MoE: no LayerNorm-with-bias kernel nor sparsemixer router on CUDA yet. */
    if (m->arch.layernorm || m->arch.sparsemixer)
        return fmoe_error_set(FMOE_EUNSUPPORTED,
                              "model_type %s: the cuda backend has no LayerNorm with bias nor "
                              "sparsemixer routing yet; run it with --backend cpu",
                              m->geo.model_type);
    /* GLM-4.5: no partial rotary kernel (rope_partial) nor the biased sigmoid router. */
    if (m->geo.family == FMOE_FAMILY_GLM4_MOE)
        return fmoe_error_set(FMOE_EUNSUPPORTED,
                              "model_type %s: the cuda backend has no partial rotary embedding "
                              "nor biased sigmoid routing yet; run it with --backend cpu",
                              m->geo.model_type);
    /* gpt-oss: no attention sinks nor clamped SwiGLU kernels on CUDA yet. */
    if (m->arch.attn_sinks)
        return fmoe_error_set(FMOE_EUNSUPPORTED,
                              "model_type %s: the cuda backend has no attention sinks nor "
                              "clamped SwiGLU experts yet; run it with --backend cpu",
                              m->geo.model_type);
    /* Llama 4: its ops are the table's own (chunked attention is a moved cache pointer,
     * scaled expert inputs a gather and two scatters), but it has been checked against
     * transformers on the CPU only. */
    if (m->arch.scale_expert_input)
        return fmoe_error_set(FMOE_EUNSUPPORTED,
                              "model_type %s: the cuda backend does not run Llama 4 yet "
                              "(chunked attention, scaled expert inputs); run it with "
                              "--backend cpu",
                              m->geo.model_type);
    if (!m->gguf) return 0;
    const int64_t n = fmoe_gguf_tensor_count(m->gguf);
    for (int64_t i = 0; i < n; i++) {
        const fmoe_gguf_tensor *t = fmoe_gguf_tensor_at(m->gguf, i);
        /* every block type (block size > 1): the i-quants have no formula in
         * quant_block.h, and no CUDA kernels either */
        if (fmoe_ggml_block_size(t->type) > 1 && !fmoe__qblock_cuda_has(t->type))
            return fmoe_error_set(FMOE_EUNSUPPORTED,
                                  "%s: tensor %s is %s, which the cuda backend has no kernels "
                                  "for (it computes Q8_0, Q4_K, Q5_K, Q6_K, F32, F16, BF16); "
                                  "run this model with --backend cpu",
                                  fmoe_gguf_name(m->gguf), t->name, fmoe_ggml_type_name(t->type));
    }
    return 0;
}
