/*
 * quantize_mix.c - the per-tensor types of the named mixes of `fmoe quantize` (q2_k,
 * q3_k_s/m/l, q4_k_s/m, q5_k_s/m: fmoe/quantize.h), as llama.cpp's llama-quantize chooses
 * them for the same names (src/llama-quant.cpp, llama_tensor_get_type), restricted to the
 * tensors fmoe's five families have and to quantising without an importance matrix.
 *
 * Why follow llama.cpp's choices rather than our own: a "Q4_K_M" file is a thing users
 * compare (size, perplexity, speed) across tools; a file we call Q4_K_M should hold the
 * same types tensor by tensor. tests/python/test_quantize_mix.py checks that against an
 * independent Python reading of the same rules.
 *
 * The rules, by tensor (i: the tensor's layer, n: the layer count, more(i): llama.cpp's
 * "use_more_bits", the first and last eighth of the layers and every third layer between):
 *   output.weight (token_embd.weight where the embeddings are tied): Q6_K, or Q8_0 when its
 *     rows are not whole 256-value blocks;
 *   attn_v: q2_k Q4_K where n_head / n_kv_head >= 4 else Q3_K; q3_k_m Q5_K for i < 2 else
 *     Q4_K; q3_k_l Q5_K; q4_k_m, q5_k_m Q6_K where more(i); q4_k_s Q5_K for i < 4; and Q8_0
 *     for every mix in a model of exactly 8 experts (llama.cpp's Mixtral rule: attn_v is
 *     small there, so 8 bits cost little);
 *   attn_k: Q8_0 in a model of exactly 8 experts;
 *   every ffn_down (dense, shared and routed experts alike): q2_k Q3_K; q3_k_m Q5_K for
 *     i < n/16 else Q4_K; q3_k_l Q5_K; q4_k_m, q5_k_m Q6_K where more(i); q4_k_s Q5_K for
 *     i < n/8;
 *   attn_output: with 8 experts, Q5_K for q2_k, q3_k_s, q3_k_m, q4_k_s, q4_k_m; otherwise
 *     q2_k Q3_K, q3_k_m Q4_K, q3_k_l Q5_K;
 *   anything else: the mix's base type (Q2_K, Q3_K, Q4_K, Q5_K).
 * llama.cpp counts attn_v tensors in layer order, one per layer, so its counter is the
 * layer index here. The fallback for rows that are not whole blocks is applied after
 * (fmoe_quant_fallback_type), as llama.cpp applies its own after these rules.
 */
#include <stdio.h>
#include <string.h>

#include "fmoe/quant.h"
#include "fmoe/quantize.h"

static const struct {
    const char *name;
    uint32_t base;
    uint32_t ftype; /* llama_ftype (llama.h): general.file_type of such a file */
} mixes[] = {
    [FMOE_MIX_Q2_K] = {"q2_k", FMOE_GGML_Q2_K, 10},
    [FMOE_MIX_Q3_K_S] = {"q3_k_s", FMOE_GGML_Q3_K, 11},
    [FMOE_MIX_Q3_K_M] = {"q3_k_m", FMOE_GGML_Q3_K, 12},
    [FMOE_MIX_Q3_K_L] = {"q3_k_l", FMOE_GGML_Q3_K, 13},
    [FMOE_MIX_Q4_K_S] = {"q4_k_s", FMOE_GGML_Q4_K, 14},
    [FMOE_MIX_Q4_K_M] = {"q4_k_m", FMOE_GGML_Q4_K, 15},
    [FMOE_MIX_Q5_K_S] = {"q5_k_s", FMOE_GGML_Q5_K, 16},
    [FMOE_MIX_Q5_K_M] = {"q5_k_m", FMOE_GGML_Q5_K, 17},
};
#define NMIX ((int)(sizeof mixes / sizeof mixes[0]))

const char *fmoe_quant_mix_name(fmoe_quant_mix m) {
    return m > FMOE_MIX_NONE && (int)m < NMIX ? mixes[m].name : NULL;
}

uint32_t fmoe_quant_mix_base(fmoe_quant_mix m) {
    return m > FMOE_MIX_NONE && (int)m < NMIX ? mixes[m].base : 0;
}

uint32_t fmoe_quant_mix_ftype(fmoe_quant_mix m) {
    return m > FMOE_MIX_NONE && (int)m < NMIX ? mixes[m].ftype : 0;
}

int fmoe_quant_mix_parse(const char *name, fmoe_quant_mix *out) {
    for (int m = 1; m < NMIX; m++)
        if (strcmp(name, mixes[m].name) == 0) {
            *out = (fmoe_quant_mix)m;
            return 0;
        }
    return -1;
}

/* llama.cpp's use_more_bits: the first and last eighth, and every third layer between. */
static int more_bits(int i, int n) {
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

uint32_t fmoe_quant_mix_type(fmoe_quant_mix m, const fmoe_quant_mix_model *model,
                             const char *name, int64_t cols) {
    const uint32_t base = fmoe_quant_mix_base(m);
    if (!base) return 0;
    const int moe8 = model->n_expert == 8;
    const int gqa4 = model->n_kv_head > 0 && model->n_head / model->n_kv_head >= 4;
    const int n = model->n_layer;
    int i = 0;
    if (sscanf(name, "blk.%d.", &i) != 1) i = 0;
    if (strcmp(name, "output.weight") == 0 ||
        (!model->has_output && strcmp(name, "token_embd.weight") == 0))
        return cols % fmoe_ggml_block_size(base) != 0 ? FMOE_GGML_Q8_0 : FMOE_GGML_Q6_K;
    if (strstr(name, "attn_v.weight")) {
        uint32_t t = base;
        switch (m) {
        case FMOE_MIX_Q2_K: t = gqa4 ? FMOE_GGML_Q4_K : FMOE_GGML_Q3_K; break;
        case FMOE_MIX_Q3_K_M: t = i < 2 ? FMOE_GGML_Q5_K : FMOE_GGML_Q4_K; break;
        case FMOE_MIX_Q3_K_L: t = FMOE_GGML_Q5_K; break;
        case FMOE_MIX_Q4_K_M:
        case FMOE_MIX_Q5_K_M: t = more_bits(i, n) ? FMOE_GGML_Q6_K : base; break;
        case FMOE_MIX_Q4_K_S: t = i < 4 ? FMOE_GGML_Q5_K : base; break;
        default: break;
        }
        return moe8 ? FMOE_GGML_Q8_0 : t;
    }
    if (strstr(name, "attn_k.weight")) return moe8 ? FMOE_GGML_Q8_0 : base;
    if (strstr(name, "ffn_down")) {
        switch (m) {
        case FMOE_MIX_Q2_K: return FMOE_GGML_Q3_K;
        case FMOE_MIX_Q3_K_M: return i < n / 16 ? FMOE_GGML_Q5_K : FMOE_GGML_Q4_K;
        case FMOE_MIX_Q3_K_L: return FMOE_GGML_Q5_K;
        case FMOE_MIX_Q4_K_M:
        case FMOE_MIX_Q5_K_M: return more_bits(i, n) ? FMOE_GGML_Q6_K : base;
        case FMOE_MIX_Q4_K_S: return i < n / 8 ? FMOE_GGML_Q5_K : base;
        default: return base;
        }
    }
    if (strstr(name, "attn_output.weight")) {
        if (moe8)
            return m == FMOE_MIX_Q2_K || m == FMOE_MIX_Q3_K_S || m == FMOE_MIX_Q3_K_M ||
                           m == FMOE_MIX_Q4_K_S || m == FMOE_MIX_Q4_K_M
                       ? FMOE_GGML_Q5_K
                       : base;
        switch (m) {
        case FMOE_MIX_Q2_K: return FMOE_GGML_Q3_K;
        case FMOE_MIX_Q3_K_M: return FMOE_GGML_Q4_K;
        case FMOE_MIX_Q3_K_L: return FMOE_GGML_Q5_K;
        default: return base;
        }
    }
    return base;
}
