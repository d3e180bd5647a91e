/*
 * gguf_config.c - the HuggingFace config.json a GGUF file stands for (fmoe/gguf.h), so the
 * rest of fmoe gets its geometry (fmoe_geometry_parse) and fingerprint from one place.
 *
 * A file written by `fmoe quantize` carries the checkpoint's config.json verbatim in
 * fmoe.hf_config: geometry and fingerprint are then exactly the checkpoint's. A file made
 * by llama.cpp's converter carries only its own metadata keys ({arch}.block_count, ...);
 * for the architectures fmoe runs we translate them into the keys of the family's
 * config.json. The geometry is then the same as the checkpoint's for every field GGUF
 * carries; the fingerprint is that of the config built here (the original's other keys,
 * such as torch_dtype or architectures, are not in the file), so it differs from the HF
 * directory's. Defaults where GGUF has no key follow llama.cpp's loader (llama-model.cpp):
 * rope theta 10000, RMS epsilon 1e-5 (llama) / 1e-6, Qwen3-MoE renormalising top-k weights.
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "fmoe/gguf.h"
#include "fmoe/quant.h"

/* {arch}.suffix as an integer, or `def` when absent (def < 0: required). */
static int arch_int(const fmoe_gguf *g, const char *arch, const char *suffix, int64_t def,
                    int64_t *out) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (!fmoe_gguf_find_kv(g, key) && def >= 0) {
        *out = def;
        return 0;
    }
    return fmoe_gguf_get_int(g, key, out);
}

static int arch_float(const fmoe_gguf *g, const char *arch, const char *suffix, double def,
                      double *out) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (!fmoe_gguf_find_kv(g, key)) {
        *out = def;
        return 0;
    }
    return fmoe_gguf_get_float(g, key, out);
}

/* {arch}.suffix as a string into buf ("" when absent). */
static void arch_str(const fmoe_gguf *g, const char *arch, const char *suffix, char *buf,
                     size_t cap) {
    char key[128];
    fmoe_gguf_str s;
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    buf[0] = '\0';
    if (fmoe_gguf_find_kv(g, key) && fmoe_gguf_get_str(g, key, &s) == 0)
        snprintf(buf, cap, "%.*s", (int)(s.len < cap - 1 ? s.len : cap - 1), s.ptr);
}

/* The MoE keys DeepSeek V1, V2 and V3 configs share (transformers' names). */
static void add_deepseek_moe(cJSON *c, const char *model_type, int64_t experts, int64_t shared,
                             int64_t expert_ff, int64_t ff, int64_t dense, int64_t norm) {
    cJSON_AddStringToObject(c, "model_type", model_type);
    cJSON_AddNumberToObject(c, "n_routed_experts", (double)experts);
    cJSON_AddNumberToObject(c, "n_shared_experts", (double)shared);
    cJSON_AddNumberToObject(c, "moe_intermediate_size", (double)expert_ff);
    cJSON_AddNumberToObject(c, "intermediate_size", (double)ff);
    cJSON_AddNumberToObject(c, "first_k_dense_replace", (double)dense);
    cJSON_AddNumberToObject(c, "moe_layer_freq", 1);
    cJSON_AddBoolToObject(c, "norm_topk_prob", norm != 0);
}

/* rope.scaling of a GGUF file into c's rope_scaling: *rs the new object with the type under
 * `type_key` (transformers' configs say "type" or "rope_type"), factor and
 * original_max_position_embeddings, for the caller's family-specific keys; NULL when the
 * file has no scaling. A type other than yarn is refused. */
static int yarn_scaling(const fmoe_gguf *g, const char *arch, cJSON *c, const char *type_key,
                        cJSON **rs) {
    *rs = NULL;
    char type[32];
    arch_str(g, arch, "rope.scaling.type", type, sizeof type);
    if (!type[0] || strcmp(type, "none") == 0) return 0;
    FMOE_RETURN_ERROR_IF(strcmp(type, "yarn") != 0, FMOE_EUNSUPPORTED,
                         "%s: %s.rope.scaling.type %s (fmoe reads yarn)", fmoe_gguf_name(g),
                         arch, type);
    double factor, omp;
    FMOE_FORWARD_IF_ERROR(arch_float(g, arch, "rope.scaling.factor", 1.0, &factor));
    FMOE_FORWARD_IF_ERROR(arch_float(g, arch, "rope.scaling.original_context_length", 4096.0,
                                     &omp));
    *rs = cJSON_AddObjectToObject(c, "rope_scaling");
    FMOE_RETURN_ERROR_IF(!*rs, FMOE_ENOMEM, "out of memory");
    cJSON_AddStringToObject(*rs, type_key, "yarn");
    cJSON_AddNumberToObject(*rs, "factor", factor);
    cJSON_AddNumberToObject(*rs, "original_max_position_embeddings", omp);
    return 0;
}

/*
 * deepseek2 (DeepSeek-V2, V2-Lite, V3, R1), as llama.cpp's converter writes it: the MLA
 * sizes (attention.q_lora_rank, 0 for V2-Lite's full-rank query; attention.kv_lora_rank;
 * rope.dimension_count = qk_rope_head_dim; key/value lengths, which newer files give as
 * the latent's and keep the heads' in key_length_mla / value_length_mla), the router
 * (expert_gating_func 2 = sigmoid, with the exp_probs_b bias: V3's noaux_tc; groups from
 * expert_group_count / expert_group_used_count; expert_weights_scale, expert_weights_norm)
 * and YaRN (rope.scaling.*: yarn_log_multiplier is 0.1 · mscale_all_dim, and the published
 * configs have mscale equal to it).
 */
static int build_deepseek2(const fmoe_gguf *g, const char *arch, cJSON *c) {
    int64_t q_lora, kv_lora, rope, klen, vlen, klen_mla, vlen_mla, gating, groups, groups_used;
    int64_t shared, dense, norm, experts, expert_ff, ff;
    double scale;
    FMOE_FORWARD_IF_ERROR(arch_int(g, arch, "attention.q_lora_rank", 0, &q_lora));
    FMOE_FORWARD_IF_ERROR(arch_int(g, arch, "attention.kv_lora_rank", -1, &kv_lora));
    FMOE_FORWARD_IF_ERROR(arch_int(g, arch, "rope.dimension_count", -1, &rope));
    FMOE_FORWARD_IF_ERROR(arch_int(g, arch, "attention.key_length", -1, &klen));
    FMOE_FORWARD_IF_ERROR(arch_int(g, arch, "attention.value_length", -1, &vlen));
    FMOE_FORWARD_IF_ERROR(arch_int(g, arch, "attention.key_length_mla", klen, &klen_mla));
    FMOE_FORWARD_IF_ERROR(arch_int(g, arch, "attention.value_length_mla", vlen, &vlen_mla));
    FMOE_FORWARD_IF_ERROR(arch_int(g, arch, "expert_gating_func", 1, &gating));
    FMOE_FORWARD_IF_ERROR(arch_int(g, arch, "expert_group_count", 1, &groups));
    FMOE_FORWARD_IF_ERROR(arch_int(g, arch, "expert_group_used_count", 1, &groups_used));
    FMOE_FORWARD_IF_ERROR(arch_int(g, arch, "expert_shared_count", 0, &shared));
    FMOE_FORWARD_IF_ERROR(arch_int(g, arch, "leading_dense_block_count", 0, &dense));
    FMOE_FORWARD_IF_ERROR(arch_int(g, arch, "expert_weights_norm", 0, &norm));
    FMOE_FORWARD_IF_ERROR(arch_int(g, arch, "expert_count", -1, &experts));
    FMOE_FORWARD_IF_ERROR(arch_int(g, arch, "feed_forward_length", 0, &ff));
    FMOE_FORWARD_IF_ERROR(arch_int(g, arch, "expert_feed_forward_length", ff, &expert_ff));
    FMOE_FORWARD_IF_ERROR(arch_float(g, arch, "expert_weights_scale", 1.0, &scale));
    /* the first MoE layer's selection bias, which only V3's router has */
    char bias[64];
    snprintf(bias, sizeof bias, "blk.%lld.exp_probs_b.bias", (long long)dense);
    const int v3 = gating == 2 || fmoe_gguf_find_tensor(g, bias) != NULL;
    add_deepseek_moe(c, v3 ? "deepseek_v3" : "deepseek_v2", experts, shared, expert_ff, ff,
                     dense, norm);
    cJSON_AddNumberToObject(c, "routed_scaling_factor", scale);
    cJSON_AddStringToObject(c, "scoring_func", v3 ? "sigmoid" : "softmax");
    cJSON_AddStringToObject(c, "topk_method", v3            ? "noaux_tc"
                                              : groups > 1 ? "group_limited_greedy"
                                                           : "greedy");
    cJSON_AddNumberToObject(c, "n_group", (double)groups);
    cJSON_AddNumberToObject(c, "topk_group", (double)groups_used);
    if (q_lora > 0)
        cJSON_AddNumberToObject(c, "q_lora_rank", (double)q_lora);
    else
        cJSON_AddNullToObject(c, "q_lora_rank");
    cJSON_AddNumberToObject(c, "kv_lora_rank", (double)kv_lora);
    cJSON_AddNumberToObject(c, "qk_rope_head_dim", (double)rope);
    cJSON_AddNumberToObject(c, "qk_nope_head_dim", (double)(klen_mla - rope));
    cJSON_AddNumberToObject(c, "v_head_dim", (double)vlen_mla);
    cJSON_DeleteItemFromObject(c, "head_dim");
    cJSON_AddNumberToObject(c, "head_dim", (double)klen_mla);

    cJSON *rs;
    FMOE_FORWARD_IF_ERROR(yarn_scaling(g, arch, c, "type", &rs));
    if (rs) {
        double log_mul, fast, slow;
        FMOE_FORWARD_IF_ERROR(arch_float(g, arch, "rope.scaling.yarn_log_multiplier", 0.0,
                                         &log_mul));
        FMOE_FORWARD_IF_ERROR(arch_float(g, arch, "rope.scaling.yarn_beta_fast", 32.0, &fast));
        FMOE_FORWARD_IF_ERROR(arch_float(g, arch, "rope.scaling.yarn_beta_slow", 1.0, &slow));
        cJSON_AddNumberToObject(rs, "mscale", log_mul / 0.1);
        cJSON_AddNumberToObject(rs, "mscale_all_dim", log_mul / 0.1);
        cJSON_AddNumberToObject(rs, "beta_fast", fast);
        cJSON_AddNumberToObject(rs, "beta_slow", slow);
    }
    return 0;
}

/*
 * gpt-oss, as llama.cpp's converter writes it (convert_hf_to_gguf.py GptOssModel): the
 * experts' width as expert_feed_forward_length, attention.sliding_window (on the even
 * layers: configuration_gpt_oss's default layer_types, llama.cpp's swa pattern 2) and
 * YaRN from rope.scaling.{factor, original_context_length}, with OpenAI's truncate false
 * (its published config; llama.cpp's ggml_rope_yarn_corr_dims rounds the ramp's ends).
 * q/k/v/o biases when the file has them. No key carries swiglu_limit or swiglu_alpha:
 * llama.cpp fixes them at 7 and 1.702, the defaults here too.
 */
static int build_gpt_oss(const fmoe_gguf *g, const char *arch, cJSON *c, int64_t experts,
                         int64_t expert_ff) {
    int64_t window;
    FMOE_FORWARD_IF_ERROR(arch_int(g, arch, "attention.sliding_window", 0, &window));
    cJSON_AddStringToObject(c, "model_type", "gpt_oss");
    cJSON_AddNumberToObject(c, "num_local_experts", (double)experts);
    cJSON_AddNumberToObject(c, "intermediate_size", (double)expert_ff);
    if (window > 0) cJSON_AddNumberToObject(c, "sliding_window", (double)window);
    cJSON_AddBoolToObject(c, "attention_bias", fmoe_gguf_find_tensor(g, "blk.0.attn_q.bias") != NULL);
    cJSON *rs;
    FMOE_FORWARD_IF_ERROR(yarn_scaling(g, arch, c, "rope_type", &rs));
    if (rs) cJSON_AddBoolToObject(rs, "truncate", 0);
    return 0;
}

/*
 * glm4moe (GLM-4.5, GLM-4.5-Air), as llama.cpp's converter writes it (conversion/glm.py,
 * Glm4MoeModel): block_count counts the num_nextn_predict_layers multi-token-prediction
 * layers after the decoder's (their blk.L.* and blk.L.nextn.* tensors are never bound);
 * rope.dimension_count is the rotated share of a head (head_dim · partial_rotary_factor);
 * the router is sigmoid with the exp_probs_b bias (expert_gating_func 2, the only one
 * transformers' glm4_moe has), expert_weights_scale and expert_weights_norm; groups from
 * expert_group_count / expert_group_used_count when present (the converter writes none:
 * GLM-4.5's one group). attention_bias and use_qk_norm have no keys: the first layer's
 * attn_q.bias and attn_q_norm.weight say them, as llama.cpp's loader finds them.
 */
static int build_glm4moe(const fmoe_gguf *g, const char *arch, cJSON *c, int64_t layers,
                         int64_t head_dim) {
    int64_t nextn, rope, gating, groups, groups_used, shared, dense, norm, experts, ff, eff;
    double scale;
    FMOE_FORWARD_IF_ERROR(arch_int(g, arch, "nextn_predict_layers", 0, &nextn));
    FMOE_FORWARD_IF_ERROR(arch_int(g, arch, "rope.dimension_count", head_dim / 2, &rope));
    FMOE_FORWARD_IF_ERROR(arch_int(g, arch, "expert_gating_func", 2, &gating));
    FMOE_FORWARD_IF_ERROR(arch_int(g, arch, "expert_group_count", 1, &groups));
    FMOE_FORWARD_IF_ERROR(arch_int(g, arch, "expert_group_used_count", 1, &groups_used));
    FMOE_FORWARD_IF_ERROR(arch_int(g, arch, "expert_shared_count", 0, &shared));
    FMOE_FORWARD_IF_ERROR(arch_int(g, arch, "leading_dense_block_count", 0, &dense));
    FMOE_FORWARD_IF_ERROR(arch_int(g, arch, "expert_weights_norm", 0, &norm));
    FMOE_FORWARD_IF_ERROR(arch_int(g, arch, "expert_count", -1, &experts));
    FMOE_FORWARD_IF_ERROR(arch_int(g, arch, "feed_forward_length", 0, &ff));
    FMOE_FORWARD_IF_ERROR(arch_int(g, arch, "expert_feed_forward_length", ff, &eff));
    FMOE_FORWARD_IF_ERROR(arch_float(g, arch, "expert_weights_scale", 1.0, &scale));
    FMOE_RETURN_ERROR_IF(gating != 0 && gating != 2, FMOE_EUNSUPPORTED,
                         "%s: %s.expert_gating_func %lld (glm4_moe routes by sigmoid, 2)",
                         fmoe_gguf_name(g), arch, (long long)gating);
    FMOE_RETURN_ERROR_IF(nextn < 0 || nextn >= layers || head_dim <= 0, FMOE_EFORMAT,
                         "%s: %s.nextn_predict_layers %lld of %lld blocks, head_dim %lld",
                         fmoe_gguf_name(g), arch, (long long)nextn, (long long)layers,
                         (long long)head_dim);
    char type[32];
    arch_str(g, arch, "rope.scaling.type", type, sizeof type);
    FMOE_RETURN_ERROR_IF(type[0] && strcmp(type, "none") != 0, FMOE_EUNSUPPORTED,
                         "%s: %s.rope.scaling.type %s (fmoe reads glm4moe files without rope "
                         "scaling, as the published GLM-4.5 models have)",
                         fmoe_gguf_name(g), arch, type);
    add_deepseek_moe(c, "glm4_moe", experts, shared, eff, ff, dense, norm);
    cJSON_DeleteItemFromObject(c, "moe_layer_freq"); /* not a glm4_moe key */
    cJSON_DeleteItemFromObject(c, "num_hidden_layers");
    cJSON_AddNumberToObject(c, "num_hidden_layers", (double)(layers - nextn));
    cJSON_AddNumberToObject(c, "num_nextn_predict_layers", (double)nextn);
    cJSON_AddNumberToObject(c, "routed_scaling_factor", scale);
    cJSON_AddNumberToObject(c, "n_group", (double)groups);
    cJSON_AddNumberToObject(c, "topk_group", (double)groups_used);
    cJSON_AddNumberToObject(c, "partial_rotary_factor", (double)rope / (double)head_dim);
    cJSON_AddBoolToObject(c, "attention_bias",
                          fmoe_gguf_find_tensor(g, "blk.0.attn_q.bias") != NULL);
    cJSON_AddBoolToObject(c, "use_qk_norm",
                          fmoe_gguf_find_tensor(g, "blk.0.attn_q_norm.weight") != NULL);
    return 0;
}

/*
 * llama4 (Llama 4 Scout, Maverick), as llama.cpp's converter writes it (conversion/
 * llama.py Llama4Model) and its loader reads it (src/models/llama4.cpp): the routed
 * experts' width as expert_feed_forward_length, the dense layers' as feed_forward_length
 * (intermediate_size_mlp), interleave_moe_layer_step. No key carries the attention
 * details: llama.cpp fixes chunks of 8192, a NoPE layer every 4th, the query temperature
 * (floor_scale 8192, attn_scale 0.1) and the QK norm on every model but the 128-expert
 * one (Maverick), and turns all of it off when attention.sliding_window is 0 (MobileLLM).
 * Those are its defaults here too. llama3 rope scaling comes as the rope_freqs tensor
 * (runtime/model/family_llama4.c reads it).
 */
static int build_llama4(const fmoe_gguf *g, const char *arch, cJSON *c, int64_t experts,
                        int64_t expert_ff, int64_t ff) {
    int64_t step, window, layers;
    FMOE_FORWARD_IF_ERROR(arch_int(g, arch, "interleave_moe_layer_step", 1, &step));
    FMOE_FORWARD_IF_ERROR(arch_int(g, arch, "attention.sliding_window", 1, &window));
    FMOE_FORWARD_IF_ERROR(arch_int(g, arch, "block_count", -1, &layers));
    cJSON_AddStringToObject(c, "model_type", "llama4_text");
    cJSON_AddNumberToObject(c, "num_local_experts", (double)experts);
    cJSON_AddNumberToObject(c, "intermediate_size", (double)expert_ff);
    cJSON_AddNumberToObject(c, "intermediate_size_mlp", (double)ff);
    cJSON_AddNumberToObject(c, "interleave_moe_layer_step", (double)step);
    cJSON_AddBoolToObject(c, "use_qk_norm", experts != 128);
    cJSON_AddBoolToObject(c, "attention_bias",
                          fmoe_gguf_find_tensor(g, "blk.0.attn_q.bias") != NULL);
    if (window == 0) { /* every layer rotary, full attention, no temperature */
        cJSON_AddNullToObject(c, "attention_chunk_size");
        cJSON *rope = cJSON_AddArrayToObject(c, "no_rope_layers"); /* 1: rotary */
        for (int64_t i = 0; i < layers && rope; i++)
            cJSON_AddItemToArray(rope, cJSON_CreateNumber(1));
        cJSON_AddBoolToObject(c, "attn_temperature_tuning", 0);
    } else {
        cJSON_AddNumberToObject(c, "attention_chunk_size", 8192);
        cJSON_AddNumberToObject(c, "no_rope_layer_interval", 4);
        cJSON_AddNumberToObject(c, "floor_scale", 8192);
        cJSON_AddNumberToObject(c, "attn_scale", 0.1);
    }
    return 0;
}

/* An F32 vector tensor [n] of the file as a JSON array added to `o` under `key`. */
static int add_f32_list(const fmoe_gguf *g, const fmoe_gguf_tensor *t, int64_t n, cJSON *o,
                        const char *key) {
    FMOE_RETURN_ERROR_IF(t->type != FMOE_GGML_F32 || t->numel != n, FMOE_EFORMAT,
                         "%s: tensor %s holds %lld values of type %u, expected %lld F32 (half "
                         "a head's rotary dimensions)",
                         fmoe_gguf_name(g), t->name, (long long)t->numel, t->type,
                         (long long)n);
    cJSON *a = cJSON_AddArrayToObject(o, key);
    FMOE_RETURN_ERROR_IF(!a, FMOE_ENOMEM, "out of memory");
    for (int64_t i = 0; i < n; i++) {
        float v;
        memcpy(&v, (const uint8_t *)t->data + 4 * i, 4);
        cJSON_AddItemToArray(a, cJSON_CreateNumber((double)v));
    }
    return 0;
}

/*
 * phimoe (Phi-3.5-MoE), as llama.cpp's converter writes it (conversion/phi.py PhiMoeModel
 * over Phi3MiniModel): the experts' width is feed_forward_length (Mixtral's
 * intermediate_size), the LayerNorm epsilon layer_norm_rms_eps (the config's rms_norm_eps),
 * sliding_window 0 for none, and longrope as two tensors rope_factors_long/short
 * [rotary dims / 2] with rope.scaling.original_context_length and one
 * rope.scaling.attn_factor, sqrt(1 + ln(ctx / omp) / ln omp), where the HF config has
 * short_mscale and long_mscale (Phi-3.5-MoE's: 1.2432, the file's 1.1902): both are taken
 * as the file's factor, which is what llama.cpp computes with. No key carries
 * router_jitter_noise (the sparsemixer's threshold): the published 0.01, configuration_phimoe's
 * default, is assumed. attention_bias and lm_head_bias: the tensors present.
 */
static int build_phimoe(const fmoe_gguf *g, const char *arch, cJSON *c, int64_t experts,
                        int64_t ff, int64_t head_dim) {
    int64_t window, omp, rope_dims;
    double attn_factor;
    FMOE_FORWARD_IF_ERROR(arch_int(g, arch, "attention.sliding_window", 0, &window));
    FMOE_FORWARD_IF_ERROR(arch_int(g, arch, "rope.dimension_count", head_dim, &rope_dims));
    FMOE_FORWARD_IF_ERROR(arch_int(g, arch, "rope.scaling.original_context_length", 0, &omp));
    FMOE_FORWARD_IF_ERROR(arch_float(g, arch, "rope.scaling.attn_factor", 1.0, &attn_factor));
    FMOE_RETURN_ERROR_IF(rope_dims != head_dim, FMOE_EUNSUPPORTED,
                         "%s: %s.rope.dimension_count %lld of a head of %lld (fmoe's phimoe "
                         "rotates whole heads, as Phi-3.5-MoE does)",
                         fmoe_gguf_name(g), arch, (long long)rope_dims, (long long)head_dim);
    cJSON_AddStringToObject(c, "model_type", "phimoe");
    cJSON_AddNumberToObject(c, "num_local_experts", (double)experts);
    cJSON_AddNumberToObject(c, "intermediate_size", (double)ff);
    if (window > 0) cJSON_AddNumberToObject(c, "sliding_window", (double)window);
    cJSON_AddBoolToObject(c, "attention_bias", fmoe_gguf_find_tensor(g, "blk.0.attn_q.bias") != NULL);
    cJSON_AddBoolToObject(c, "lm_head_bias", fmoe_gguf_find_tensor(g, "output.bias") != NULL);
    const fmoe_gguf_tensor *lf = fmoe_gguf_find_tensor(g, "rope_factors_long.weight");
    const fmoe_gguf_tensor *sf = fmoe_gguf_find_tensor(g, "rope_factors_short.weight");
    if (!lf && !sf) return 0;
    FMOE_RETURN_ERROR_IF(!lf || !sf || omp <= 0, FMOE_EFORMAT,
                         "%s: longrope needs rope_factors_long.weight, rope_factors_short.weight "
                         "and %s.rope.scaling.original_context_length",
                         fmoe_gguf_name(g), arch);
    cJSON *rs = cJSON_AddObjectToObject(c, "rope_scaling");
    FMOE_RETURN_ERROR_IF(!rs, FMOE_ENOMEM, "out of memory");
    cJSON_AddStringToObject(rs, "type", "longrope");
    FMOE_FORWARD_IF_ERROR(add_f32_list(g, lf, head_dim / 2, rs, "long_factor"));
    FMOE_FORWARD_IF_ERROR(add_f32_list(g, sf, head_dim / 2, rs, "short_factor"));
    cJSON_AddNumberToObject(rs, "long_mscale", attn_factor);
    cJSON_AddNumberToObject(rs, "short_mscale", attn_factor);
    cJSON_AddNumberToObject(rs, "original_max_position_embeddings", (double)omp);
    return 0;
}

static int build(const fmoe_gguf *g, const char *arch, cJSON *c) {
    int64_t layers, hidden, heads, kv_heads, ff, experts, used, ctx, vocab, head_dim;
    double theta, eps;
    FMOE_FORWARD_IF_ERROR(arch_int(g, arch, "block_count", -1, &layers));
    FMOE_FORWARD_IF_ERROR(arch_int(g, arch, "embedding_length", -1, &hidden));
    FMOE_FORWARD_IF_ERROR(arch_int(g, arch, "attention.head_count", -1, &heads));
    FMOE_FORWARD_IF_ERROR(arch_int(g, arch, "attention.head_count_kv", heads, &kv_heads));
    FMOE_FORWARD_IF_ERROR(arch_int(g, arch, "feed_forward_length", 0, &ff));
    FMOE_FORWARD_IF_ERROR(arch_int(g, arch, "expert_count", -1, &experts));
    FMOE_FORWARD_IF_ERROR(arch_int(g, arch, "expert_used_count", -1, &used));
    FMOE_FORWARD_IF_ERROR(arch_int(g, arch, "context_length", 4096, &ctx));
    FMOE_FORWARD_IF_ERROR(arch_int(g, arch, "attention.key_length",
                                   heads > 0 ? hidden / heads : 0, &head_dim));
    FMOE_FORWARD_IF_ERROR(arch_float(g, arch, "rope.freq_base", 10000.0, &theta));
    FMOE_FORWARD_IF_ERROR(arch_float(g, arch, "attention.layer_norm_rms_epsilon",
                                     strcmp(arch, "llama") == 0 ? 1e-5 : 1e-6, &eps));
    /* vocabulary: the key, else the tokenizer's token list, else the embedding's rows */
    const fmoe_gguf_kv *tokens = fmoe_gguf_find_kv(g, "tokenizer.ggml.tokens");
    const fmoe_gguf_tensor *embd = fmoe_gguf_find_tensor(g, "token_embd.weight");
    FMOE_FORWARD_IF_ERROR(arch_int(g, arch, "vocab_size",
                                   tokens ? (int64_t)tokens->count
                                   : embd ? embd->ne[1]
                                          : -1,
                                   &vocab));
    cJSON_AddNumberToObject(c, "num_hidden_layers", (double)layers);
    cJSON_AddNumberToObject(c, "hidden_size", (double)hidden);
    cJSON_AddNumberToObject(c, "num_attention_heads", (double)heads);
    cJSON_AddNumberToObject(c, "num_key_value_heads", (double)kv_heads);
    cJSON_AddNumberToObject(c, "head_dim", (double)head_dim);
    cJSON_AddNumberToObject(c, "num_experts_per_tok", (double)used);
    cJSON_AddNumberToObject(c, "max_position_embeddings", (double)ctx);
    cJSON_AddNumberToObject(c, "vocab_size", (double)vocab);
    cJSON_AddNumberToObject(c, "rope_theta", theta);
    cJSON_AddNumberToObject(c, "rms_norm_eps", eps);
    cJSON_AddBoolToObject(c, "tie_word_embeddings", !fmoe_gguf_find_tensor(g, "output.weight"));

    int64_t expert_ff, shared_ff, shared, dense, norm;
    FMOE_FORWARD_IF_ERROR(arch_int(g, arch, "expert_feed_forward_length", ff, &expert_ff));
    FMOE_FORWARD_IF_ERROR(arch_int(g, arch, "expert_weights_norm",
                                   strcmp(arch, "qwen3moe") == 0, &norm));
    if (strcmp(arch, "llama") == 0) {
        cJSON_AddStringToObject(c, "model_type", "mixtral");
        cJSON_AddNumberToObject(c, "num_local_experts", (double)experts);
        cJSON_AddNumberToObject(c, "intermediate_size", (double)ff);
    } else if (strcmp(arch, "qwen2moe") == 0 || strcmp(arch, "qwen3moe") == 0) {
        const int q2 = arch[4] == '2';
        cJSON_AddStringToObject(c, "model_type", q2 ? "qwen2_moe" : "qwen3_moe");
        cJSON_AddNumberToObject(c, "num_experts", (double)experts);
        cJSON_AddNumberToObject(c, "moe_intermediate_size", (double)expert_ff);
        cJSON_AddNumberToObject(c, "intermediate_size", (double)ff);
        cJSON_AddBoolToObject(c, "norm_topk_prob", norm != 0);
        /* Dense layers (HF mlp_only_layers) have no router tensor; llama.cpp's metadata
         * has no key for them. */
        cJSON *dense_layers = cJSON_AddArrayToObject(c, "mlp_only_layers");
        for (int64_t i = 0; i < layers && dense_layers; i++) {
            char name[64];
            snprintf(name, sizeof name, "blk.%lld.ffn_gate_inp.weight", (long long)i);
            if (!fmoe_gguf_find_tensor(g, name))
                cJSON_AddItemToArray(dense_layers, cJSON_CreateNumber((double)i));
        }
        if (q2) {
            FMOE_FORWARD_IF_ERROR(arch_int(g, arch, "expert_shared_feed_forward_length", 0, &shared_ff));
            cJSON_AddNumberToObject(c, "shared_expert_intermediate_size", (double)shared_ff);
        }
    } else if (strcmp(arch, "olmoe") == 0) {
        cJSON_AddStringToObject(c, "model_type", "olmoe");
        cJSON_AddNumberToObject(c, "num_experts", (double)experts);
        cJSON_AddNumberToObject(c, "intermediate_size", (double)(ff ? ff : expert_ff));
        cJSON_AddBoolToObject(c, "norm_topk_prob", norm != 0);
    } else if (strcmp(arch, "deepseek2") == 0) {
        FMOE_FORWARD_IF_ERROR(build_deepseek2(g, arch, c));
    } else if (strcmp(arch, "glm4moe") == 0) {
        FMOE_FORWARD_IF_ERROR(build_glm4moe(g, arch, c, layers, head_dim));
    } else if (strcmp(arch, "phimoe") == 0) {
        FMOE_FORWARD_IF_ERROR(build_phimoe(g, arch, c, experts, ff, head_dim));
    } else if (strcmp(arch, "gpt-oss") == 0) {
        FMOE_FORWARD_IF_ERROR(build_gpt_oss(g, arch, c, experts, expert_ff));
    } else if (strcmp(arch, "llama4") == 0) {
        FMOE_FORWARD_IF_ERROR(build_llama4(g, arch, c, experts, expert_ff, ff));
    } else { /* deepseek */
        FMOE_FORWARD_IF_ERROR(arch_int(g, arch, "expert_shared_count", 0, &shared));
        FMOE_FORWARD_IF_ERROR(arch_int(g, arch, "leading_dense_block_count", 0, &dense));
        add_deepseek_moe(c, "deepseek", experts, shared, expert_ff, ff, dense, norm);
        cJSON_AddStringToObject(c, "scoring_func", "softmax");
    }
    return 0;
}

int fmoe_gguf_config_json(const fmoe_gguf *g, char **out, int *exact) {
    *out = NULL;
    *exact = 0;
    const fmoe_gguf_kv *hf = fmoe_gguf_find_kv(g, "fmoe.hf_config");
    if (hf && hf->type == FMOE_GGUF_STRING) {
        char *s = malloc(hf->strs[0].len + 1);
        FMOE_RETURN_ERROR_IF(!s, FMOE_ENOMEM, "out of memory");
        memcpy(s, hf->strs[0].ptr, hf->strs[0].len);
        s[hf->strs[0].len] = '\0';
        *out = s;
        *exact = 1;
        return 0;
    }
    fmoe_gguf_str a;
    FMOE_FORWARD_IF_ERROR(fmoe_gguf_get_str(g, "general.architecture", &a));
    char arch[32];
    snprintf(arch, sizeof arch, "%.*s", (int)(a.len < 31 ? a.len : 31), a.ptr);
    FMOE_RETURN_ERROR_IF(strcmp(arch, "llama") != 0 && strcmp(arch, "qwen2moe") != 0 &&
                             strcmp(arch, "qwen3moe") != 0 && strcmp(arch, "olmoe") != 0 &&
                             strcmp(arch, "deepseek") != 0 && strcmp(arch, "deepseek2") != 0 &&
                             strcmp(arch, "glm4moe") != 0 && strcmp(arch, "gpt-oss") != 0 &&
                             strcmp(arch, "llama4") != 0 && strcmp(arch, "phimoe") != 0,
                         FMOE_EUNSUPPORTED,
                         "%s: architecture %s (fmoe reads llama with experts, qwen2moe, "
                         "qwen3moe, olmoe, deepseek, deepseek2, glm4moe, gpt-oss, llama4 and "
                         "phimoe)",
                         fmoe_gguf_name(g), arch);
    cJSON *c = cJSON_CreateObject();
    FMOE_RETURN_ERROR_IF(!c, FMOE_ENOMEM, "out of memory");
    int rc = build(g, arch, c);
    if (rc == 0) {
        *out = cJSON_PrintUnformatted(c);
        if (!*out) rc = fmoe_error_set(FMOE_ENOMEM, "out of memory");
    }
    cJSON_Delete(c);
    return rc;
}
