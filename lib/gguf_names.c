/*
 * gguf_names.c - where a HuggingFace tensor lives in a GGUF file (fmoe/gguf.h,
 * fmoe_gguf_tensor_for): the name map of llama.cpp's converter (gguf-py's tensor_mapping
 * for the MoE architectures fmoe runs), which `fmoe quantize` writes and a GGUF
 * loader reads back. Written as a table of name suffixes so the two directions cannot
 * drift: the loader asks for the HF names it already binds (runtime/model/load.c) and gets
 * the GGUF tensor, the expert slice of a stacked *_exps tensor, and whether the rows were
 * permuted for ggml's adjacent-pair RoPE (llama, deepseek: undo it, or rotate pairs;
 * llama4, whose checkpoint rows are adjacent pairs already, the same).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "fmoe/gguf.h"

/* Per-layer suffixes: HF (after "model.layers.N.") -> GGUF (after "blk.N."). A '*' in the
 * HF pattern is an expert index; `heads` 1 = query heads, 2 = key/value heads, when the
 * architecture permutes. */
static const struct {
    const char *hf, *gguf;
    int heads;
} layer_map[] = {
    {"input_layernorm.weight", "attn_norm.weight", 0},
    {"post_attention_layernorm.weight", "ffn_norm.weight", 0},
    /* phimoe's LayerNorm biases (gguf-py: the bias of ATTN_NORM, FFN_NORM) */
    {"input_layernorm.bias", "attn_norm.bias", 0},
    {"post_attention_layernorm.bias", "ffn_norm.bias", 0},
    {"self_attn.q_proj.weight", "attn_q.weight", 1},
    {"self_attn.k_proj.weight", "attn_k.weight", 2},
    {"self_attn.v_proj.weight", "attn_v.weight", 0},
    {"self_attn.o_proj.weight", "attn_output.weight", 0},
    {"self_attn.q_proj.bias", "attn_q.bias", 1},
    {"self_attn.k_proj.bias", "attn_k.bias", 2},
    {"self_attn.v_proj.bias", "attn_v.bias", 0},
    {"self_attn.o_proj.bias", "attn_output.bias", 0},
    {"self_attn.q_norm.weight", "attn_q_norm.weight", 0},
    {"self_attn.k_norm.weight", "attn_k_norm.weight", 0},
    /* deepseek2 (DeepSeek-V2/V3): multi-head latent attention; kv_b_proj may instead be
     * split into attn_k_b and attn_v_b (runtime/model/load.c puts it back) */
    {"self_attn.q_a_proj.weight", "attn_q_a.weight", 0},
    {"self_attn.q_a_layernorm.weight", "attn_q_a_norm.weight", 0},
    {"self_attn.q_b_proj.weight", "attn_q_b.weight", 0},
    {"self_attn.kv_a_proj_with_mqa.weight", "attn_kv_a_mqa.weight", 0},
    {"self_attn.kv_a_layernorm.weight", "attn_kv_a_norm.weight", 0},
    {"self_attn.kv_b_proj.weight", "attn_kv_b.weight", 0},
    {"mlp.gate.e_score_correction_bias", "exp_probs_b.bias", 0},
    {"mlp.gate.weight", "ffn_gate_inp.weight", 0},
    {"block_sparse_moe.gate.weight", "ffn_gate_inp.weight", 0},
    {"mlp.experts.*.gate_proj.weight", "ffn_gate_exps.weight", 0},
    {"mlp.experts.*.up_proj.weight", "ffn_up_exps.weight", 0},
    {"mlp.experts.*.down_proj.weight", "ffn_down_exps.weight", 0},
    {"block_sparse_moe.experts.*.w1.weight", "ffn_gate_exps.weight", 0},
    {"block_sparse_moe.experts.*.w3.weight", "ffn_up_exps.weight", 0},
    {"block_sparse_moe.experts.*.w2.weight", "ffn_down_exps.weight", 0},
    {"mlp.experts.*.w1.weight", "ffn_gate_exps.weight", 0},
    {"mlp.experts.*.w3.weight", "ffn_up_exps.weight", 0},
    {"mlp.experts.*.w2.weight", "ffn_down_exps.weight", 0},
    {"mlp.shared_expert.gate_proj.weight", "ffn_gate_shexp.weight", 0},
    {"mlp.shared_expert.up_proj.weight", "ffn_up_shexp.weight", 0},
    {"mlp.shared_expert.down_proj.weight", "ffn_down_shexp.weight", 0},
    {"mlp.shared_experts.gate_proj.weight", "ffn_gate_shexp.weight", 0},
    {"mlp.shared_experts.up_proj.weight", "ffn_up_shexp.weight", 0},
    {"mlp.shared_experts.down_proj.weight", "ffn_down_shexp.weight", 0},
    {"mlp.shared_expert_gate.weight", "ffn_gate_inp_shexp.weight", 0},
    {"mlp.gate_proj.weight", "ffn_gate.weight", 0},
    {"mlp.up_proj.weight", "ffn_up.weight", 0},
    {"mlp.down_proj.weight", "ffn_down.weight", 0},
    /* llama4: the block is "feed_forward" (router, experts, shared_expert, dense MLP) */
    {"feed_forward.router.weight", "ffn_gate_inp.weight", 0},
    {"feed_forward.experts.*.gate_proj.weight", "ffn_gate_exps.weight", 0},
    {"feed_forward.experts.*.up_proj.weight", "ffn_up_exps.weight", 0},
    {"feed_forward.experts.*.down_proj.weight", "ffn_down_exps.weight", 0},
    {"feed_forward.shared_expert.gate_proj.weight", "ffn_gate_shexp.weight", 0},
    {"feed_forward.shared_expert.up_proj.weight", "ffn_up_shexp.weight", 0},
    {"feed_forward.shared_expert.down_proj.weight", "ffn_down_shexp.weight", 0},
    {"feed_forward.gate_proj.weight", "ffn_gate.weight", 0},
    {"feed_forward.up_proj.weight", "ffn_up.weight", 0},
    {"feed_forward.down_proj.weight", "ffn_down.weight", 0},
};

/* Where one architecture names a tensor otherwise: glm4moe's and gpt-oss's post-attention
 * norm is llama.cpp's ATTN_POST_NORM (gguf-py's MODEL_TENSORS[GLM4_MOE] and [GPT_OSS] have
 * no ffn_norm). */
static const struct {
    const char *arch, *hf, *gguf;
} arch_map[] = {
    {"glm4moe", "post_attention_layernorm.weight", "post_attention_norm.weight"},
    {"gpt-oss", "post_attention_layernorm.weight", "post_attention_norm.weight"},
};

/* Matches `s` against `pat`, where '*' is a decimal number (stored in *num). */
static int match(const char *s, const char *pat, int32_t *num) {
    while (*pat) {
        if (*pat == '*') {
            if (*s < '0' || *s > '9') return 0;
            long v = 0;
            while (*s >= '0' && *s <= '9' && v < 1000000) v = v * 10 + (*s++ - '0');
            *num = (int32_t)v;
            pat++;
            continue;
        }
        if (*s++ != *pat++) return 0;
    }
    return *s == '\0';
}

int fmoe_gguf_tensor_for(const char *arch, int32_t n_head, int32_t n_head_kv,
                         const char *hf_name, fmoe_gguf_tensor_ref *out) {
    memset(out, 0, sizeof *out);
    out->expert = -1;
    /* llama4: the converter keeps HF's rows (undo_permute False), but Llama 4's own are
     * adjacent rotary pairs, as llama's permuted ones are */
    const int permutes = strcmp(arch, "llama") == 0 || strcmp(arch, "deepseek") == 0 ||
                         strcmp(arch, "llama4") == 0;
    if (strcmp(hf_name, "model.embed_tokens.weight") == 0) {
        snprintf(out->name, sizeof out->name, "token_embd.weight");
        return 0;
    }
    if (strcmp(hf_name, "model.norm.weight") == 0) {
        snprintf(out->name, sizeof out->name, "output_norm.weight");
        return 0;
    }
    if (strcmp(hf_name, "lm_head.weight") == 0) {
        snprintf(out->name, sizeof out->name, "output.weight");
        return 0;
    }
    if (strcmp(hf_name, "model.norm.bias") == 0) { /* phimoe's LayerNorm */
        snprintf(out->name, sizeof out->name, "output_norm.bias");
        return 0;
    }
    if (strcmp(hf_name, "lm_head.bias") == 0) { /* phimoe's lm_head_bias */
        snprintf(out->name, sizeof out->name, "output.bias");
        return 0;
    }
    const char *p = "model.layers.";
    if (strncmp(hf_name, p, strlen(p)) == 0) {
        const char *s = hf_name + strlen(p);
        long layer = 0;
        int digits = 0;
        while (*s >= '0' && *s <= '9' && digits < 7) layer = layer * 10 + (*s++ - '0'), digits++;
        if (digits > 0 && *s == '.') {
            s++;
            for (size_t i = 0; i < sizeof arch_map / sizeof arch_map[0]; i++)
                if (strcmp(arch, arch_map[i].arch) == 0 && strcmp(s, arch_map[i].hf) == 0) {
                    snprintf(out->name, sizeof out->name, "blk.%ld.%s", layer,
                             arch_map[i].gguf);
                    return 0;
                }
            for (size_t i = 0; i < sizeof layer_map / sizeof layer_map[0]; i++) {
                int32_t e = -1;
                if (!match(s, layer_map[i].hf, &e)) continue;
                snprintf(out->name, sizeof out->name, "blk.%ld.%s", layer, layer_map[i].gguf);
                out->expert = e;
                if (permutes && layer_map[i].heads)
                    out->permute_heads = layer_map[i].heads == 1 ? n_head : n_head_kv;
                return 0;
            }
        }
    }
    return fmoe_error_set(FMOE_ENOTFOUND, "no GGUF tensor for %s (architecture %s)", hf_name,
                          arch);
}
