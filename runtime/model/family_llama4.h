/*
 * family_llama4.h - Llama 4's pieces beyond the GQA families' (family_llama4.c): what
 * load.c binds (the queries' and keys' rotary pairs, the fused input-major experts) and
 * what forward.c runs (chunked and temperature-tuned attention).
 */
#ifndef FMOE_FAMILY_LLAMA4_H
#define FMOE_FAMILY_LLAMA4_H

#include "model_impl.h"

/* Layer i's q/k projections (and biases) with each head's rows put from Llama 4's
 * adjacent rotary pairs into the rotate-half order the backends rotate (owned copies; a
 * GGUF file's were put back by its loader already: `rows_done`), and the weightless L2
 * norm of the rotary layers' heads (use_qk_norm) as q_norm/k_norm vectors of ones.
 * @return 0 or FMOE_ENOMEM. */
int fmoe__llama4_bind_attention(fmoe_model *m, int32_t i, fmoe__layer *L, int rows_done);

/* Layer i's routed experts from transformers' fused input-major tensors
 * (feed_forward.experts.gate_up_proj [J,h,2I], down_proj [J,I,h]) as owned output-major
 * copies in the checkpoint's dtype. @return 0, FMOE_ENOTFOUND, FMOE_EMISMATCH,
 * FMOE_EUNSUPPORTED (the detail names the tensor), FMOE_ENOMEM. */
int fmoe__llama4_bind_experts(fmoe_model *m, int32_t i, fmoe__mlp *ex);

/* A GGUF file's rope_freqs.weight [head_dim/2] (llama.cpp's converter writes Llama 4's
 * llama3 scaling as these per-frequency divisors), when it has one, as the model's rope.
 * @return 0, FMOE_EFORMAT (its size named). */
int fmoe__llama4_gguf_rope(fmoe_model *m);

/*
 * One segment's attention on layer li, as `a` describes it for the whole segment (cache
 * rows of kv_width floats): on a chunked layer each query attends only to the keys of its
 * own chunk, and on a NoPE layer with temperature tuning each query's scores are scaled by
 * its position's factor. Both are constant over runs of rows, so the segment is issued
 * as one backend attention call per run (the cache pointers moved to the chunk's start).
 */
void fmoe__llama4_attention(const fmoe__backend_ops *be, void *ctx, const fmoe__arch *arch,
                            int32_t li, const fmoe__attn_args *a, int64_t kv_width);

#endif
