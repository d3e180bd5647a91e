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
 * ("qwen3moe"), OLMoE ("olmoe"), DeepSeek-MoE V1 ("deepseek"). What is quantised: every
 * 2-D weight (embeddings and output head included), or with experts_only the routed
 * experts' gate/up/down only; never the norms, biases and router weights (F32, as
 * llama.cpp keeps them). A tensor whose rows are not whole blocks of the type falls back
 * as llama-quantize's does (fmoe_quant_fallback_type: Q4_K -> Q5_0, Q5_K -> Q5_1,
 * Q6_K -> Q8_0) when its rows are whole blocks of 32, else to its checkpoint dtype.
 */
#ifndef FMOE_QUANTIZE_H
#define FMOE_QUANTIZE_H

#include <stdint.h>

#include "fmoe/progress.h"

typedef struct fmoe_quantize_params {
    const char *model_dir;    /* HF checkpoint: config.json + safetensors */
    const char *output;       /* the .gguf to write (via OUTPUT.partial, renamed at the end) */
    uint32_t type;            /* FMOE_GGML_Q8_0, _Q4_K, _Q5_K, _Q6_K, _Q4_0, _Q4_1, _Q5_0,
                                 _Q5_1 or _IQ4_NL (fmoe_quant_can_quantize) */
    int experts_only;         /* 1: quantise only the routed experts */
    fmoe_progress progress;   /* bytes of tensor data written */
} fmoe_quantize_params;

typedef struct fmoe_quantize_report {
    char arch[32];            /* the GGUF architecture written */
    int64_t tensors;          /* tensors written */
    int64_t quantized;        /* of them, in the requested type */
    int64_t fallback;         /* of them, in the fallback block type or the checkpoint dtype
                                 for want of whole blocks */
    int64_t bytes_in;         /* checkpoint bytes of the tensors written */
    int64_t bytes_out;        /* the output file's size */
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
