/*
 * gguf_config.c - the HuggingFace config.json a GGUF file stands for (fmoe/gguf.h), so the
 * rest of fmoe gets its geometry (fmoe_geometry_parse) and fingerprint from one place.
 *
 * A file written by `fmoe quantize` carries the checkpoint's config.json verbatim in
 * fmoe.hf_config: geometry and fingerprint are then exactly the checkpoint's. A file made
 * by llama.cpp's converter carries only its own metadata keys ({arch}.block_count, ...);
 * for the five architectures fmoe runs we translate them into the keys of the family's
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
    } else { /* deepseek */
        FMOE_FORWARD_IF_ERROR(arch_int(g, arch, "expert_shared_count", 0, &shared));
        FMOE_FORWARD_IF_ERROR(arch_int(g, arch, "leading_dense_block_count", 0, &dense));
        cJSON_AddStringToObject(c, "model_type", "deepseek");
        cJSON_AddNumberToObject(c, "n_routed_experts", (double)experts);
        cJSON_AddNumberToObject(c, "n_shared_experts", (double)shared);
        cJSON_AddNumberToObject(c, "moe_intermediate_size", (double)expert_ff);
        cJSON_AddNumberToObject(c, "intermediate_size", (double)ff);
        cJSON_AddNumberToObject(c, "first_k_dense_replace", (double)dense);
        cJSON_AddNumberToObject(c, "moe_layer_freq", 1);
        cJSON_AddBoolToObject(c, "norm_topk_prob", norm != 0);
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
                             strcmp(arch, "deepseek") != 0,
                         FMOE_EUNSUPPORTED,
                         "%s: architecture %s (fmoe reads llama with experts, qwen2moe, "
                         "qwen3moe, olmoe and deepseek)",
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
