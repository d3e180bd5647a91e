/*
 * fmoe/quantize.h - a HuggingFace MoE checkpoint (config.json + safetensors) written as a
 * GGUF file with ggml block formats, the way llama.cpp's converter and llama-quantize
 * name, lay out and describe it, so tests and users can make quantized models without a
 * download (fmoe quantize; docs/quantization.md).
 *
 *     fmoe_quantize_params p = {.model_dir = "tiny", .output = "tiny.gguf",
 *                               .type = FMOE_GGML_Q8_0};
 *     fmoe_quantize_report r;
 *     if (fmoe_quantize_model(&p, &r) < 0) fail(fmoe_error_detail());
 *
 * Families: Mixtral (GGUF architecture "llama"), Qwen2-MoE ("qwen2moe"), Qwen3-MoE
 * ("qwen3moe"), OLMoE ("olmoe"), DeepSeek-MoE V1 ("deepseek"), DeepSeek-V2/V3
 * ("deepseek2"), GLM-4.5 ("glm4moe"), gpt-oss ("gpt-oss"; OpenAI's MXFP4 experts copied
 * as MXFP4, never requantised), Phi-3.5-MoE ("phimoe"), Llama 4's text model ("llama4").
 * What is quantised: every 2-D weight (embeddings and output head included), or with
 * experts_only the routed experts' gate/up/down only; never the norms, biases and router weights (F32, as
 * llama.cpp keeps them). A tensor whose rows are not whole blocks of the type falls back
 * as llama-quantize's does (fmoe_quant_fallback_type: Q4_K -> Q5_0, Q5_K -> Q5_1,
 * Q6_K -> Q8_0, Q2_K/Q3_K/IQ4_XS -> IQ4_NL) when its rows are whole blocks of 32, else
 * to its checkpoint dtype. A named mix (mix: q4_k_m, ...) chooses each tensor's type as
 * llama-quantize does for that name; experts_type overrides the routed experts' type, the
 * lever that matters most when experts are offloaded (their bytes are what moves).
 */
#ifndef FMOE_QUANTIZE_H
#define FMOE_QUANTIZE_H

#include <stdint.h>

#include "fmoe/progress.h"
#include "fmoe/quant.h"

/* The mixes llama-quantize names (Q2_K, Q3_K_S, ... Q5_K_M): a base type with more bits
 * for the tensors that need them (runtime/model/quantize_mix.c lists the rules). */
typedef enum fmoe_quant_mix {
    FMOE_MIX_NONE = 0, /* every quantised tensor in params->type */
    FMOE_MIX_Q2_K,
    FMOE_MIX_Q3_K_S,
    FMOE_MIX_Q3_K_M,
    FMOE_MIX_Q3_K_L,
    FMOE_MIX_Q4_K_S,
    FMOE_MIX_Q4_K_M,
    FMOE_MIX_Q5_K_S,
    FMOE_MIX_Q5_K_M,
} fmoe_quant_mix;

/* What the mix rules look at besides a tensor's name and row length. */
typedef struct fmoe_quant_mix_model {
    int32_t n_layer, n_head, n_kv_head, n_expert;
    int has_output; /* an output.weight apart from token_embd.weight */
} fmoe_quant_mix_model;

/* "q4_k_m", ... ; NULL for FMOE_MIX_NONE or an unknown value. */
const char *fmoe_quant_mix_name(fmoe_quant_mix mix);

/* The mix called `name` (lower case, as above). @return 0 and *out, or -1. */
int fmoe_quant_mix_parse(const char *name, fmoe_quant_mix *out);

/* The mix's base type (FMOE_GGML_Q2_K .. Q5_K), and the llama_ftype a file of it
 * declares in general.file_type; 0 for FMOE_MIX_NONE. */
uint32_t fmoe_quant_mix_base(fmoe_quant_mix mix);
uint32_t fmoe_quant_mix_ftype(fmoe_quant_mix mix);

/* The type llama-quantize's rule gives GGUF tensor `name` (a quantised 2-D or expert
 * weight, rows of `cols` values) in `mix`, before the fallback for rows that are not
 * whole blocks (fmoe_quant_fallback_type, applied by the caller). */
uint32_t fmoe_quant_mix_type(fmoe_quant_mix mix, const fmoe_quant_mix_model *model,
                             const char *name, int64_t cols);

typedef struct fmoe_quantize_params {
    const char *model_dir;    /* HF checkpoint: config.json + safetensors */
    const char *output;       /* the .gguf to write (via OUTPUT.partial, renamed at the end) */
    uint32_t type;            /* a type fmoe_quant_can_quantize says yes to: every quantised
                                 tensor in it (ignored where mix is set) */
    fmoe_quant_mix mix;       /* a named mix: per-tensor types by llama-quantize's rules */
    uint32_t experts_type;    /* 0, or the type of the routed experts (*_exps), whatever
                                 the mix or type says for the rest */
    int experts_only;         /* 1: quantise only the routed experts */
    fmoe_progress progress;   /* bytes of tensor data written */
    const char *imatrix;      /* NULL, or llama.cpp's importance-matrix GGUF file
                                 (llama-imatrix's): the quantisers that use one
                                 (fmoe_quant_uses_importance) weigh each tensor's columns by
                                 its entry; the others ignore it */
} fmoe_quantize_params;

typedef struct fmoe_quantize_report {
    char arch[32];            /* the GGUF architecture written */
    int64_t tensors;          /* tensors written */
    int64_t quantized;        /* of them, in the type the type, mix or experts_type chose */
    int64_t fallback;         /* of them, in the fallback block type or the checkpoint dtype
                                 for want of whole blocks */
    int64_t bytes_in;         /* checkpoint bytes of the tensors written */
    int64_t bytes_out;        /* the output file's size */
    int64_t by_type[FMOE_GGML_TYPE_END]; /* tensors written in each ggml type */
    /* with params->imatrix, quantised tensors: weighed by their entry; with an entry their
     * type's quantiser ignores (llama-quantize uses it for every type); in a type that
     * uses one but without an entry in the file (quantised without) */
    int64_t importance_used, importance_ignored, importance_missing;
} fmoe_quantize_report;

/*
 * Converts params->model_dir into params->output. Nothing is left at OUTPUT on failure
 * (the partial is removed); an existing OUTPUT is replaced only on success.
 * @return 0, FMOE_EINVAL (a type that cannot be written), FMOE_EUNSUPPORTED (a family
 *         quantize does not write; a checkpoint layout it does not know), FMOE_ENOTFOUND
 *         (a tensor the family needs is missing), the errors of fmoe_safetensors_open and
 *         fmoe_geometry_load, FMOE_EIO (writing failed; the detail names the file).
 */
int fmoe_quantize_model(const fmoe_quantize_params *params, fmoe_quantize_report *report);

#endif
