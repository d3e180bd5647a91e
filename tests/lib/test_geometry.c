/*
 * test_geometry.c - config.json parsing for every supported family, against the numbers
 * on each model card (expected byte counts are written out from those numbers, not taken
 * from the code), bad inputs, dtypes, and the config fingerprint.
 */
#include <stdio.h>
#include <unistd.h>

#include "fmoe/error.h"
#include "fmoe/geometry.h"
#include "sha256.h"
#include "harness.h"

/* Loads tests/fixtures/configs/<name>/config.json. */
static int load_fixture(const char *name, fmoe_model_geometry *g) {
    char path[1024];
    snprintf(path, sizeof path, "%s/configs/%s/config.json", harness_fixtures(), name);
    return fmoe_geometry_load(path, g);
}

static int parse_str(const char *json, fmoe_model_geometry *g) {
    return fmoe_geometry_parse(json, strlen(json), g);
}

/* Asserts decoder layers [first, num_hidden_layers) with stride `step` are exactly the
 * MoE layers. */
#define ASSERT_MOE_LAYERS(g, first, step)                                                 \
    do {                                                                                  \
        int32_t harness_l = 0;                                                            \
        for (int32_t harness_i = (first); harness_i < (g).num_hidden_layers;              \
             harness_i += (step))                                                         \
            ASSERT_EQ((g).moe_layer_index[harness_l++], harness_i);                       \
        ASSERT_EQ((g).num_moe_layers, harness_l);                                         \
    } while (0)

/* ---------------------------------------------------------------------------------- */
/* Published models                                                                   */
/* ---------------------------------------------------------------------------------- */

/* Mixtral-8x7B: 32 layers, 8 experts, top-2, h 4096, expert FFN 14336 (model card). */
static void check_mixtral_8x7b(const fmoe_model_geometry *gp, int *harness_failed) {
    fmoe_model_geometry g = *gp;
    ASSERT_STR_EQ(g.model_type, "mixtral");
    ASSERT_EQ(g.family, FMOE_FAMILY_MIXTRAL);
    ASSERT_EQ(g.num_hidden_layers, 32);
    ASSERT_MOE_LAYERS(g, 0, 1);
    ASSERT_EQ(g.num_experts, 8);
    ASSERT_EQ(g.top_k, 2);
    ASSERT_EQ(g.num_shared_experts, 0);
    ASSERT_EQ(g.shared_intermediate_size, 0);
    ASSERT_EQ(g.hidden_size, 4096);
    ASSERT_EQ(g.moe_intermediate_size, 14336);
    ASSERT_EQ(g.vocab_size, 32000);
    ASSERT_EQ(g.num_attention_heads, 32);
    ASSERT_EQ(g.num_key_value_heads, 8);
    ASSERT_EQ(g.head_dim, 128);
    ASSERT_EQ(g.max_position_embeddings, 32768);
    ASSERT_NEAR(g.rope_theta, 1e6, 0);
    ASSERT_NEAR(g.rms_norm_eps, 1e-5, 1e-12);
    ASSERT_EQ(g.scoring, FMOE_ROUTER_SOFTMAX);
    ASSERT_EQ(g.norm_topk_prob, 1); /* softmax over the top-2 logits */
    ASSERT_EQ(g.n_group, 1);
    ASSERT_NEAR(g.routed_scaling_factor, 1.0, 0);
    ASSERT_EQ(g.expert_has_bias, 0);
    ASSERT_EQ(g.dtype, FMOE_DTYPE_BF16);
    ASSERT_EQ(g.expert_dtype, FMOE_DTYPE_BF16);
    ASSERT_STR_EQ(g.topk_method, "greedy");
    ASSERT_EQ(fmoe_geometry_expert_params(&g), 3LL * 4096 * 14336);
    ASSERT_EQ(fmoe_geometry_expert_bytes(&g, FMOE_DTYPE_BF16), 3LL * 4096 * 14336 * 2);
}

TEST(mixtral_8x7b) {
    fmoe_model_geometry g;
    ASSERT_OK(load_fixture("mistralai--Mixtral-8x7B-v0.1", &g));
    check_mixtral_8x7b(&g, harness_failed);
}

TEST(mixtral_8x7b_instruct) {
    fmoe_model_geometry g;
    ASSERT_OK(load_fixture("mistralai--Mixtral-8x7B-Instruct-v0.1", &g));
    check_mixtral_8x7b(&g, harness_failed);
}

/* The whole checkpoint, from the geometry: model.safetensors.index.json of
 * Mixtral-8x7B-v0.1 says total_size 93405585408 bytes (bf16). */
TEST(mixtral_8x7b_expert_bytes_add_up_to_checkpoint) {
    fmoe_model_geometry g;
    ASSERT_OK(load_fixture("mistralai--Mixtral-8x7B-v0.1", &g));
    int64_t h = g.hidden_size, kv = (int64_t)g.num_key_value_heads * g.head_dim;
    int64_t attn = 2 * h * h + 2 * kv * h;          /* q, o; k, v */
    int64_t per_layer = attn + g.num_experts * h + 2 * h; /* + router, 2 norms */
    int64_t params = 2 * (int64_t)g.vocab_size * h + g.num_hidden_layers * per_layer + h;
    int64_t experts = (int64_t)g.num_moe_layers * g.num_experts *
                      fmoe_geometry_expert_bytes(&g, FMOE_DTYPE_BF16);
    ASSERT_EQ(experts + 2 * params, 93405585408LL);
}

TEST(mixtral_8x22b) {
    fmoe_model_geometry g;
    ASSERT_OK(load_fixture("mistralai--Mixtral-8x22B-v0.1", &g));
    ASSERT_EQ(g.num_hidden_layers, 56);
    ASSERT_MOE_LAYERS(g, 0, 1);
    ASSERT_EQ(g.num_experts, 8);
    ASSERT_EQ(g.top_k, 2);
    ASSERT_EQ(g.num_shared_experts, 0);
    ASSERT_EQ(g.hidden_size, 6144);
    ASSERT_EQ(g.moe_intermediate_size, 16384);
    ASSERT_EQ(g.num_attention_heads, 48);
    ASSERT_EQ(g.head_dim, 128);
    ASSERT_EQ(g.max_position_embeddings, 65536);
    ASSERT_EQ(fmoe_geometry_expert_bytes(&g, FMOE_DTYPE_BF16), 3LL * 6144 * 16384 * 2);
}

/* Qwen3-30B-A3B: 48 layers, 128 experts, top-8, h 2048, expert FFN 768. */
TEST(qwen3_30b_a3b) {
    fmoe_model_geometry g;
    ASSERT_OK(load_fixture("Qwen--Qwen3-30B-A3B", &g));
    ASSERT_EQ(g.family, FMOE_FAMILY_QWEN3_MOE);
    ASSERT_EQ(g.num_hidden_layers, 48);
    ASSERT_MOE_LAYERS(g, 0, 1);
    ASSERT_EQ(g.num_experts, 128);
    ASSERT_EQ(g.top_k, 8);
    ASSERT_EQ(g.num_shared_experts, 0);
    ASSERT_EQ(g.hidden_size, 2048);
    ASSERT_EQ(g.moe_intermediate_size, 768);
    ASSERT_EQ(g.intermediate_size, 6144);
    ASSERT_EQ(g.num_attention_heads, 32);
    ASSERT_EQ(g.num_key_value_heads, 4);
    ASSERT_EQ(g.head_dim, 128); /* explicit: not 2048 / 32 */
    ASSERT_EQ(g.vocab_size, 151936);
    ASSERT_EQ(g.scoring, FMOE_ROUTER_SOFTMAX);
    ASSERT_EQ(g.norm_topk_prob, 1); /* from the config; the family default is false */
    ASSERT_EQ(fmoe_geometry_expert_bytes(&g, FMOE_DTYPE_BF16), 3LL * 2048 * 768 * 2);
}

/* Qwen3-235B-A22B: 94 layers, 128 experts, top-8, h 4096, expert FFN 1536. */
TEST(qwen3_235b_a22b) {
    fmoe_model_geometry g;
    ASSERT_OK(load_fixture("Qwen--Qwen3-235B-A22B", &g));
    ASSERT_EQ(g.num_hidden_layers, 94);
    ASSERT_MOE_LAYERS(g, 0, 1);
    ASSERT_EQ(g.num_experts, 128);
    ASSERT_EQ(g.top_k, 8);
    ASSERT_EQ(g.hidden_size, 4096);
    ASSERT_EQ(g.moe_intermediate_size, 1536);
    ASSERT_EQ(g.num_attention_heads, 64);
    ASSERT_EQ(fmoe_geometry_expert_bytes(&g, FMOE_DTYPE_BF16), 3LL * 4096 * 1536 * 2);
}

/* Qwen1.5-MoE-A2.7B: 24 layers, 60 routed experts, top-4, plus a shared expert of width
 * 5632 (4 x 1408), h 2048, expert FFN 1408; norm_topk_prob false. */
TEST(qwen15_moe_a27b) {
    fmoe_model_geometry g;
    ASSERT_OK(load_fixture("Qwen--Qwen1.5-MoE-A2.7B", &g));
    ASSERT_EQ(g.family, FMOE_FAMILY_QWEN2_MOE);
    ASSERT_EQ(g.num_hidden_layers, 24);
    ASSERT_MOE_LAYERS(g, 0, 1);
    ASSERT_EQ(g.num_experts, 60);
    ASSERT_EQ(g.top_k, 4);
    ASSERT_EQ(g.num_shared_experts, 1);
    ASSERT_EQ(g.shared_intermediate_size, 4 * 1408);
    ASSERT_EQ(g.hidden_size, 2048);
    ASSERT_EQ(g.moe_intermediate_size, 1408);
    ASSERT_EQ(g.norm_topk_prob, 0);
    ASSERT_NEAR(g.rope_theta, 1e6, 0);
    ASSERT_EQ(fmoe_geometry_expert_bytes(&g, FMOE_DTYPE_BF16), 3LL * 2048 * 1408 * 2);
}

/* OLMoE-1B-7B-0924: 16 layers, 64 experts, top-8, h 2048, expert FFN 1024. */
TEST(olmoe_1b_7b) {
    fmoe_model_geometry g;
    ASSERT_OK(load_fixture("allenai--OLMoE-1B-7B-0924", &g));
    ASSERT_EQ(g.family, FMOE_FAMILY_OLMOE);
    ASSERT_EQ(g.num_hidden_layers, 16);
    ASSERT_MOE_LAYERS(g, 0, 1);
    ASSERT_EQ(g.num_experts, 64);
    ASSERT_EQ(g.top_k, 8);
    ASSERT_EQ(g.num_shared_experts, 0);
    ASSERT_EQ(g.hidden_size, 2048);
    ASSERT_EQ(g.moe_intermediate_size, 1024);
    ASSERT_EQ(g.norm_topk_prob, 0);
    ASSERT_EQ(g.vocab_size, 50304);
    ASSERT_EQ(fmoe_geometry_expert_bytes(&g, FMOE_DTYPE_BF16), 3LL * 2048 * 1024 * 2);
}

/* deepseek-moe-16b-base: 28 layers, the first dense, 64 routed + 2 shared experts, top-6,
 * h 2048, expert FFN 1408, dense FFN 10944. */
TEST(deepseek_moe_16b) {
    fmoe_model_geometry g;
    ASSERT_OK(load_fixture("deepseek-ai--deepseek-moe-16b-base", &g));
    ASSERT_EQ(g.family, FMOE_FAMILY_DEEPSEEK_V1);
    ASSERT_EQ(g.num_hidden_layers, 28);
    ASSERT_MOE_LAYERS(g, 1, 1);
    ASSERT_EQ(g.num_moe_layers, 27);
    ASSERT_EQ(g.num_experts, 64);
    ASSERT_EQ(g.top_k, 6);
    ASSERT_EQ(g.num_shared_experts, 2);
    ASSERT_EQ(g.shared_intermediate_size, 2 * 1408);
    ASSERT_EQ(g.hidden_size, 2048);
    ASSERT_EQ(g.moe_intermediate_size, 1408);
    ASSERT_EQ(g.intermediate_size, 10944);
    ASSERT_EQ(g.scoring, FMOE_ROUTER_SOFTMAX);
    ASSERT_EQ(g.norm_topk_prob, 0);
    ASSERT_EQ(g.kv_lora_rank, 0); /* V1 has ordinary attention */
    ASSERT_EQ(fmoe_geometry_expert_bytes(&g, FMOE_DTYPE_BF16), 3LL * 2048 * 1408 * 2);
}

/* DeepSeek-V2-Lite: 27 layers, the first dense, 64 routed + 2 shared, top-6, MLA with
 * kv_lora_rank 512 and no query compression, greedy softmax routing. */
TEST(deepseek_v2_lite) {
    fmoe_model_geometry g;
    ASSERT_OK(load_fixture("deepseek-ai--DeepSeek-V2-Lite", &g));
    ASSERT_EQ(g.family, FMOE_FAMILY_DEEPSEEK_V2);
    ASSERT_EQ(g.num_hidden_layers, 27);
    ASSERT_MOE_LAYERS(g, 1, 1);
    ASSERT_EQ(g.num_moe_layers, 26);
    ASSERT_EQ(g.num_experts, 64);
    ASSERT_EQ(g.top_k, 6);
    ASSERT_EQ(g.num_shared_experts, 2);
    ASSERT_EQ(g.hidden_size, 2048);
    ASSERT_EQ(g.moe_intermediate_size, 1408);
    ASSERT_EQ(g.scoring, FMOE_ROUTER_SOFTMAX);
    ASSERT_EQ(g.norm_topk_prob, 0);
    ASSERT_STR_EQ(g.topk_method, "greedy");
    ASSERT_EQ(g.n_group, 1);
    ASSERT_EQ(g.topk_group, 1);
    ASSERT_NEAR(g.routed_scaling_factor, 1.0, 0);
    ASSERT_EQ(g.q_lora_rank, 0);
    ASSERT_EQ(g.kv_lora_rank, 512);
    ASSERT_EQ(g.qk_nope_head_dim, 128);
    ASSERT_EQ(g.qk_rope_head_dim, 64);
    ASSERT_EQ(g.v_head_dim, 128);
    ASSERT_EQ(g.head_dim, 128 + 64);
    ASSERT_EQ(g.max_position_embeddings, 163840);
    ASSERT_EQ(fmoe_geometry_expert_bytes(&g, FMOE_DTYPE_BF16), 3LL * 2048 * 1408 * 2);
}

/* DeepSeek-R1 (V3 architecture): 61 layers of which the first 3 are dense (58 MoE), 256
 * routed + 1 shared expert, top-8 by sigmoid within 4 of 8 groups, scaling 2.5, h 7168,
 * expert FFN 2048, FP8 e4m3 weights. */
TEST(deepseek_r1) {
    fmoe_model_geometry g;
    ASSERT_OK(load_fixture("deepseek-ai--DeepSeek-R1", &g));
    ASSERT_EQ(g.family, FMOE_FAMILY_DEEPSEEK_V3);
    ASSERT_EQ(g.num_hidden_layers, 61);
    ASSERT_MOE_LAYERS(g, 3, 1);
    ASSERT_EQ(g.num_moe_layers, 58);
    ASSERT_EQ(g.num_experts, 256);
    ASSERT_EQ(g.top_k, 8);
    ASSERT_EQ(g.num_shared_experts, 1);
    ASSERT_EQ(g.shared_intermediate_size, 2048);
    ASSERT_EQ(g.hidden_size, 7168);
    ASSERT_EQ(g.moe_intermediate_size, 2048);
    ASSERT_EQ(g.intermediate_size, 18432);
    ASSERT_EQ(g.scoring, FMOE_ROUTER_SIGMOID);
    ASSERT_EQ(g.n_group, 8);
    ASSERT_EQ(g.topk_group, 4);
    ASSERT_NEAR(g.routed_scaling_factor, 2.5, 0);
    ASSERT_EQ(g.norm_topk_prob, 1);
    ASSERT_STR_EQ(g.topk_method, "noaux_tc");
    ASSERT_EQ(g.q_lora_rank, 1536);
    ASSERT_EQ(g.kv_lora_rank, 512);
    ASSERT_EQ(g.num_attention_heads, 128);
    ASSERT_EQ(g.vocab_size, 129280);
    ASSERT_EQ(g.dtype, FMOE_DTYPE_BF16);
    ASSERT_STR_EQ(g.quant_method, "fp8");
    ASSERT_EQ(g.expert_dtype, FMOE_DTYPE_F8_E4M3);
    ASSERT_EQ(fmoe_geometry_expert_bytes(&g, FMOE_DTYPE_BF16), 3LL * 7168 * 2048 * 2);
    ASSERT_EQ(fmoe_geometry_expert_bytes(&g, g.expert_dtype), 3LL * 7168 * 2048);
}

/* All parameters of a DeepSeek-V2/V3 model from its geometry, and those a token uses (K
 * routed experts of J), without the embedding: what the papers publish. */
static void deepseek_params(const fmoe_model_geometry *g, double *total, double *active) {
    const double h = g->hidden_size, V = g->vocab_size, L = g->num_hidden_layers;
    const double Lm = g->num_moe_layers, expert = (double)fmoe_geometry_expert_params(g);
    const double layer = (double)fmoe_geometry_attention_params(g) + 2 * h;
    const double dense = (L - Lm) * 3 * h * g->intermediate_size;
    const double shared = 3 * h * g->shared_intermediate_size + g->num_experts * h;
    *total = 2 * V * h + h + L * layer + dense + Lm * (g->num_experts * expert + shared);
    *active = V * h + h + L * layer + dense + Lm * (g->top_k * expert + shared);
}

/* The published sizes: DeepSeek-V2-Lite 15.7B parameters, 2.4B activated per token
 * ("DeepSeek-V2" paper, appendix B); DeepSeek-V3 (R1's architecture) 671B, 37B activated
 * (DeepSeek-V3 technical report §1; the checkpoint's 14B multi-token-prediction module
 * not counted). MLA's low-rank projections are what make these add up: counted as
 * full-width q/k/v they would be 2.3x (V3) too many. */
TEST(deepseek_v2_lite_and_v3_parameter_counts) {
    fmoe_model_geometry g;
    double total, active;
    ASSERT_OK(load_fixture("deepseek-ai--DeepSeek-V2-Lite", &g));
    deepseek_params(&g, &total, &active);
    ASSERT_NEAR(total / 1e9, 15.7, 0.05);
    ASSERT_NEAR(active / 1e9, 2.4, 0.06);
    ASSERT_EQ(fmoe_geometry_kv_values_per_token(&g), 512 + 64);
    ASSERT_OK(load_fixture("deepseek-ai--DeepSeek-R1", &g));
    deepseek_params(&g, &total, &active);
    ASSERT_NEAR(total / 1e9, 671, 0.5);
    ASSERT_NEAR(active / 1e9, 37, 0.7);
    ASSERT_EQ(fmoe_geometry_kv_values_per_token(&g), 512 + 64);
    ASSERT_EQ(fmoe_geometry_attention_params(NULL), FMOE_EINVAL);
}

/* GLM-4.5 (glm4_moe): 92 layers of which the first 3 are dense (89 MoE), 160 routed + 1
 * shared expert, top-8 by sigmoid with the selection bias (noaux_tc, one group), scaling
 * 2.5, GQA 96 heads of 128 over 8 KV heads (wider than h 5120 / 96), expert FFN 1536; the
 * multi-token-prediction layer (num_nextn_predict_layers) is not a decoder layer.
 * GLM-4.5-Air: 46 layers, 1 dense, 128 experts, h 4096, expert FFN 1408, scaling 1. */
TEST(glm4_5_and_air) {
    fmoe_model_geometry g;
    ASSERT_OK(load_fixture("zai-org--GLM-4.5", &g));
    ASSERT_EQ(g.family, FMOE_FAMILY_GLM4_MOE);
    ASSERT_EQ(g.num_hidden_layers, 92);
    ASSERT_MOE_LAYERS(g, 3, 1);
    ASSERT_EQ(g.num_moe_layers, 89);
    ASSERT_EQ(g.num_experts, 160);
    ASSERT_EQ(g.top_k, 8);
    ASSERT_EQ(g.num_shared_experts, 1);
    ASSERT_EQ(g.shared_intermediate_size, 1536);
    ASSERT_EQ(g.hidden_size, 5120);
    ASSERT_EQ(g.moe_intermediate_size, 1536);
    ASSERT_EQ(g.intermediate_size, 12288);
    ASSERT_EQ(g.num_attention_heads, 96);
    ASSERT_EQ(g.num_key_value_heads, 8);
    ASSERT_EQ(g.head_dim, 128);
    ASSERT_EQ(g.scoring, FMOE_ROUTER_SIGMOID);
    ASSERT_STR_EQ(g.topk_method, "noaux_tc");
    ASSERT_EQ(g.n_group, 1);
    ASSERT_EQ(g.topk_group, 1);
    ASSERT_NEAR(g.routed_scaling_factor, 2.5, 0);
    ASSERT_EQ(g.norm_topk_prob, 1);
    ASSERT_EQ(g.kv_lora_rank, 0);
    ASSERT_EQ(fmoe_geometry_kv_values_per_token(&g), 2 * 8 * 128);
    ASSERT_EQ(fmoe_geometry_expert_bytes(&g, FMOE_DTYPE_BF16), 3LL * 5120 * 1536 * 2);
    ASSERT_OK(load_fixture("zai-org--GLM-4.5-Air", &g));
    ASSERT_EQ(g.family, FMOE_FAMILY_GLM4_MOE);
    ASSERT_EQ(g.num_hidden_layers, 46);
    ASSERT_MOE_LAYERS(g, 1, 1);
    ASSERT_EQ(g.num_experts, 128);
    ASSERT_EQ(g.top_k, 8);
    ASSERT_EQ(g.shared_intermediate_size, 1408);
    ASSERT_EQ(g.hidden_size, 4096);
    ASSERT_EQ(g.moe_intermediate_size, 1408);
    ASSERT_EQ(g.intermediate_size, 10944);
    ASSERT_NEAR(g.routed_scaling_factor, 1.0, 0);
    /* transformers' defaults where the keys are absent */
    ASSERT_OK(parse_str("{\"model_type\":\"glm4_moe\",\"num_hidden_layers\":3,"
                        "\"hidden_size\":64,\"n_routed_experts\":8,"
                        "\"num_experts_per_tok\":2,\"moe_intermediate_size\":32}",
                        &g));
    ASSERT_MOE_LAYERS(g, 1, 1);
    ASSERT_EQ(g.num_shared_experts, 1);
    ASSERT_EQ(g.norm_topk_prob, 1);
    ASSERT_EQ(g.scoring, FMOE_ROUTER_SIGMOID);
    ASSERT_STR_EQ(g.topk_method, "noaux_tc");
    ASSERT_EQ(g.intermediate_size, 10944);
    ASSERT_EQ(parse_str("{\"model_type\":\"glm4_moe\",\"num_hidden_layers\":3,"
                        "\"hidden_size\":64,\"n_routed_experts\":8,\"n_group\":3,"
                        "\"num_experts_per_tok\":2,\"moe_intermediate_size\":32}",
                        &g),
              FMOE_ERANGE);
}

/* Every parameter of a GLM-4.5 model from its geometry, as transformers'
 * Glm4MoeForCausalLM holds them (q/k/v biases, per-head q/k norms when use_qk_norm: 2·D
 * per layer, `qk_norm` here; e_score_correction_bias is a buffer, not a parameter), and
 * those a token uses apart from the embeddings (K routed experts of J). */
static void glm4_moe_params(const fmoe_model_geometry *g, int qk_norm, double *total,
                            double *active) {
    const double h = g->hidden_size, V = g->vocab_size, L = g->num_hidden_layers;
    const double H = g->num_attention_heads, Hkv = g->num_key_value_heads, D = g->head_dim;
    const double Lm = g->num_moe_layers, expert = (double)fmoe_geometry_expert_params(g);
    const double layer = (double)fmoe_geometry_attention_params(g) + (H + 2 * Hkv) * D +
                         (qk_norm ? 2 * D : 0) + 2 * h;
    const double dense = (L - Lm) * 3 * h * g->intermediate_size;
    const double shared = 3 * h * g->shared_intermediate_size + g->num_experts * h;
    *total = 2 * V * h + h + L * layer + dense + Lm * (g->num_experts * expert + shared);
    *active = *total - 2 * V * h - Lm * (g->num_experts - g->top_k) * expert;
}

/* The published sizes (GLM-4.5 technical report, arXiv 2508.06471, and the model cards):
 * GLM-4.5 355B parameters, 32B activated; GLM-4.5-Air 106B, 12B. transformers 5.23's
 * Glm4MoeForCausalLM built on the meta device from these configs holds exactly
 * 352797814784 and 106852245504 parameters (the MTP layer, which it does not build, left
 * out), which the sums here equal; activated, the embeddings left out, 32.08B and 12.18B.
 * The published totals are rounded within 1% of these. */
TEST(glm4_5_parameter_counts) {
    fmoe_model_geometry g;
    double total, active;
    ASSERT_OK(load_fixture("zai-org--GLM-4.5", &g));
    glm4_moe_params(&g, 1, &total, &active);
    ASSERT_NEAR(total, 352797814784.0, 0.5);
    ASSERT_NEAR(total / 1e9, 355, 355 * 0.01);
    ASSERT_NEAR(active / 1e9, 32, 0.1);
    ASSERT_OK(load_fixture("zai-org--GLM-4.5-Air", &g));
    glm4_moe_params(&g, 0, &total, &active);
    ASSERT_NEAR(total, 106852245504.0, 0.5);
    ASSERT_NEAR(total / 1e9, 106, 106 * 0.01);
    ASSERT_NEAR(active / 1e9, 12, 0.2);
}

/* Phi-3.5-MoE: 32 layers, 16 experts, top-2, h 4096, expert FFN 6400. */
TEST(phi35_moe) {
    fmoe_model_geometry g;
    ASSERT_OK(load_fixture("microsoft--Phi-3.5-MoE-instruct", &g));
    ASSERT_EQ(g.family, FMOE_FAMILY_PHIMOE);
    ASSERT_EQ(g.num_hidden_layers, 32);
    ASSERT_MOE_LAYERS(g, 0, 1);
    ASSERT_EQ(g.num_experts, 16);
    ASSERT_EQ(g.top_k, 2);
    ASSERT_EQ(g.num_shared_experts, 0);
    ASSERT_EQ(g.hidden_size, 4096);
    ASSERT_EQ(g.moe_intermediate_size, 6400);
    ASSERT_EQ(g.num_key_value_heads, 8);
    ASSERT_EQ(g.vocab_size, 32064);
    ASSERT_STR_EQ(g.topk_method, "sparsemixer");
    ASSERT_EQ(g.norm_topk_prob, 0);
    ASSERT_EQ(fmoe_geometry_expert_bytes(&g, FMOE_DTYPE_BF16), 3LL * 4096 * 6400 * 2);
}

/* gpt-oss-20b: 24 layers, 32 experts, top-4, h 2880, expert FFN 2880, biased experts,
 * MXFP4 expert weights. */
TEST(gpt_oss_20b) {
    fmoe_model_geometry g;
    ASSERT_OK(load_fixture("openai--gpt-oss-20b", &g));
    ASSERT_EQ(g.family, FMOE_FAMILY_GPT_OSS);
    ASSERT_EQ(g.num_hidden_layers, 24);
    ASSERT_MOE_LAYERS(g, 0, 1);
    ASSERT_EQ(g.num_experts, 32);
    ASSERT_EQ(g.top_k, 4);
    ASSERT_EQ(g.num_shared_experts, 0);
    ASSERT_EQ(g.hidden_size, 2880);
    ASSERT_EQ(g.moe_intermediate_size, 2880);
    ASSERT_EQ(g.head_dim, 64);
    ASSERT_EQ(g.num_attention_heads, 64);
    ASSERT_EQ(g.num_key_value_heads, 8);
    ASSERT_EQ(g.vocab_size, 201088);
    ASSERT_NEAR(g.rope_theta, 150000, 0);
    ASSERT_EQ(g.expert_has_bias, 1);
    ASSERT_EQ(g.norm_topk_prob, 1); /* softmax over the top-4 logits */
    ASSERT_EQ(g.dtype, FMOE_DTYPE_BF16); /* no torch_dtype in this config */
    ASSERT_STR_EQ(g.quant_method, "mxfp4");
    ASSERT_EQ(g.expert_dtype, FMOE_DTYPE_MXFP4);
    int64_t h = 2880, I = 2880;
    ASSERT_EQ(fmoe_geometry_expert_params(&g), 3 * h * I + 2 * I + h);
    ASSERT_EQ(fmoe_geometry_expert_bytes(&g, FMOE_DTYPE_BF16), (3 * h * I + 2 * I + h) * 2);
    /* 4.25 bits per weight (2880 is a multiple of 32), biases in bf16 */
    ASSERT_EQ(fmoe_geometry_expert_bytes(&g, FMOE_DTYPE_MXFP4),
              3 * h * I * 17 / 32 + (2 * I + h) * 2);
}

/* The MXFP4 count is the checkpoint's: model.safetensors.index.json of gpt-oss-20b says
 * total_size 13761264768 bytes; everything but the experts is bf16. */
TEST(gpt_oss_20b_expert_bytes_add_up_to_checkpoint) {
    fmoe_model_geometry g;
    ASSERT_OK(load_fixture("openai--gpt-oss-20b", &g));
    int64_t h = g.hidden_size, q = (int64_t)g.num_attention_heads * g.head_dim,
            kv = (int64_t)g.num_key_value_heads * g.head_dim;
    int64_t attn = (q * h + q) + 2 * (kv * h + kv) + (h * q + h) + g.num_attention_heads;
    int64_t router = g.num_experts * h + g.num_experts;
    int64_t per_layer = attn + router + 2 * h;
    int64_t params = 2 * (int64_t)g.vocab_size * h + g.num_hidden_layers * per_layer + h;
    int64_t experts = (int64_t)g.num_moe_layers * g.num_experts *
                      fmoe_geometry_expert_bytes(&g, g.expert_dtype);
    ASSERT_EQ(experts + 2 * params, 13761264768LL);
}

/* Llama-4-Scout-17B-16E: 48 layers, all MoE, 16 routed experts + 1 shared, top-1,
 * h 5120, expert FFN 8192, dense FFN 16384. */
TEST(llama4_scout) {
    fmoe_model_geometry g;
    ASSERT_OK(load_fixture("meta-llama--Llama-4-Scout-17B-16E", &g));
    ASSERT_STR_EQ(g.model_type, "llama4");
    ASSERT_EQ(g.family, FMOE_FAMILY_LLAMA4);
    ASSERT_EQ(g.num_hidden_layers, 48);
    ASSERT_MOE_LAYERS(g, 0, 1);
    ASSERT_EQ(g.num_experts, 16);
    ASSERT_EQ(g.top_k, 1);
    ASSERT_EQ(g.num_shared_experts, 1);
    ASSERT_EQ(g.shared_intermediate_size, 8192);
    ASSERT_EQ(g.hidden_size, 5120);
    ASSERT_EQ(g.moe_intermediate_size, 8192);
    ASSERT_EQ(g.intermediate_size, 16384);
    ASSERT_EQ(g.num_attention_heads, 40);
    ASSERT_EQ(g.head_dim, 128);
    ASSERT_EQ(g.vocab_size, 202048);
    ASSERT_EQ(g.scoring, FMOE_ROUTER_SIGMOID);
    ASSERT_EQ(g.norm_topk_prob, 0);
    ASSERT_EQ(g.tie_word_embeddings, 0);
    ASSERT_EQ(fmoe_geometry_expert_bytes(&g, FMOE_DTYPE_BF16), 3LL * 5120 * 8192 * 2);
}

/* Llama-4-Maverick-17B-128E: interleave_moe_layer_step 2 -> MoE on layers 1, 3, ..., 47. */
TEST(llama4_maverick_alternates) {
    fmoe_model_geometry g;
    ASSERT_OK(load_fixture("meta-llama--Llama-4-Maverick-17B-128E", &g));
    ASSERT_EQ(g.num_hidden_layers, 48);
    ASSERT_MOE_LAYERS(g, 1, 2);
    ASSERT_EQ(g.num_moe_layers, 24);
    ASSERT_EQ(g.num_experts, 128);
    ASSERT_EQ(g.top_k, 1);
}

/* ---------------------------------------------------------------------------------- */
/* Layer rules and defaults on small configs                                          */
/* ---------------------------------------------------------------------------------- */

TEST(qwen_sparse_step_and_mlp_only_layers) {
    /* transformers: MoE iff not in mlp_only_layers and (i + 1) % step == 0 */
    fmoe_model_geometry g;
    ASSERT_OK(parse_str("{\"model_type\":\"qwen2_moe\",\"num_hidden_layers\":8,"
                        "\"hidden_size\":64,\"num_experts\":4,\"num_experts_per_tok\":2,"
                        "\"moe_intermediate_size\":32,\"decoder_sparse_step\":2,"
                        "\"mlp_only_layers\":[3,100]}",
                        &g));
    ASSERT_EQ(g.num_moe_layers, 3);
    ASSERT_EQ(g.moe_layer_index[0], 1);
    ASSERT_EQ(g.moe_layer_index[1], 5);
    ASSERT_EQ(g.moe_layer_index[2], 7);
    /* absent keys take transformers' Qwen2-MoE defaults */
    ASSERT_EQ(g.norm_topk_prob, 0);
    ASSERT_EQ(g.num_shared_experts, 1);
    ASSERT_EQ(g.shared_intermediate_size, 5632);
    ASSERT_EQ(g.vocab_size, 151936);
    ASSERT_EQ(g.dtype, FMOE_DTYPE_BF16);
    ASSERT_EQ(g.head_dim, 64 / 16);
}

TEST(llama4_text_and_explicit_moe_layers) {
    fmoe_model_geometry g;
    ASSERT_OK(parse_str("{\"model_type\":\"llama4_text\",\"num_hidden_layers\":6,"
                        "\"hidden_size\":64,\"intermediate_size\":32,"
                        "\"num_local_experts\":4,\"num_experts_per_tok\":1,"
                        "\"moe_layers\":[4,0],\"interleave_moe_layer_step\":2}",
                        &g));
    ASSERT_EQ(g.num_moe_layers, 2); /* moe_layers wins over the step */
    ASSERT_EQ(g.moe_layer_index[0], 0);
    ASSERT_EQ(g.moe_layer_index[1], 4);
    ASSERT_EQ(g.intermediate_size, 16384); /* intermediate_size_mlp default */
}

TEST(deepseek_moe_layer_freq) {
    /* the authors' rule: layer >= first_k_dense_replace and layer % moe_layer_freq == 0 */
    fmoe_model_geometry g;
    ASSERT_OK(parse_str("{\"model_type\":\"deepseek\",\"num_hidden_layers\":10,"
                        "\"hidden_size\":64,\"n_routed_experts\":8,\"num_experts_per_tok\":2,"
                        "\"moe_intermediate_size\":16,\"first_k_dense_replace\":2,"
                        "\"moe_layer_freq\":3}",
                        &g));
    ASSERT_EQ(g.num_moe_layers, 3);
    ASSERT_EQ(g.moe_layer_index[0], 3);
    ASSERT_EQ(g.moe_layer_index[1], 6);
    ASSERT_EQ(g.moe_layer_index[2], 9);
    ASSERT_EQ(g.num_shared_experts, 0); /* n_shared_experts absent: none */
}

TEST(deepseek_v2_grouped_routing) {
    fmoe_model_geometry g;
    ASSERT_OK(parse_str("{\"model_type\":\"deepseek_v2\",\"num_hidden_layers\":4,"
                        "\"hidden_size\":64,\"n_routed_experts\":160,\"num_experts_per_tok\":6,"
                        "\"moe_intermediate_size\":16,\"topk_method\":\"group_limited_greedy\","
                        "\"n_group\":8,\"topk_group\":3,\"routed_scaling_factor\":16.0}",
                        &g));
    ASSERT_STR_EQ(g.topk_method, "group_limited_greedy");
    ASSERT_EQ(g.n_group, 8);
    ASSERT_EQ(g.topk_group, 3);
    ASSERT_NEAR(g.routed_scaling_factor, 16.0, 0);
    ASSERT_EQ(g.num_moe_layers, 4);
}

TEST(gpt_oss_original_key_names) {
    /* OpenAI's own config spells top-k experts_per_token; transformers aliases
     * num_experts to num_local_experts. */
    fmoe_model_geometry g;
    ASSERT_OK(parse_str("{\"model_type\":\"gpt_oss\",\"num_hidden_layers\":2,"
                        "\"hidden_size\":64,\"intermediate_size\":64,\"num_experts\":8,"
                        "\"experts_per_token\":2}",
                        &g));
    ASSERT_EQ(g.num_experts, 8);
    ASSERT_EQ(g.top_k, 2);
}

TEST(rope_theta_in_rope_parameters_and_dtype_key) {
    fmoe_model_geometry g;
    ASSERT_OK(parse_str("{\"model_type\":\"mixtral\",\"num_hidden_layers\":2,"
                        "\"hidden_size\":64,\"intermediate_size\":64,\"num_local_experts\":8,"
                        "\"num_experts_per_tok\":2,\"dtype\":\"float16\","
                        "\"rope_parameters\":{\"rope_theta\":123.0,\"rope_type\":\"default\"}}",
                        &g));
    ASSERT_NEAR(g.rope_theta, 123.0, 0);
    ASSERT_EQ(g.dtype, FMOE_DTYPE_F16);
    ASSERT_EQ(g.expert_dtype, FMOE_DTYPE_F16);
}

TEST(integral_float_is_an_integer) {
    fmoe_model_geometry g;
    ASSERT_OK(parse_str("{\"model_type\":\"olmoe\",\"num_hidden_layers\":2.0,"
                        "\"hidden_size\":64,\"intermediate_size\":64,\"num_experts\":8,"
                        "\"num_experts_per_tok\":2}",
                        &g));
    ASSERT_EQ(g.num_hidden_layers, 2);
}

/* ---------------------------------------------------------------------------------- */
/* Bad input                                                                          */
/* ---------------------------------------------------------------------------------- */

TEST(unknown_model_type_lists_supported) {
    fmoe_model_geometry g;
    ASSERT_EQ(parse_str("{\"model_type\":\"foo\",\"num_hidden_layers\":2}", &g),
              FMOE_EUNSUPPORTED);
    ASSERT_CONTAINS(fmoe_error_detail(), "unsupported model_type \"foo\"");
    ASSERT_CONTAINS(fmoe_error_detail(), "(supported: mixtral, qwen2_moe, qwen3_moe, olmoe");
    ASSERT_CONTAINS(fmoe_error_detail(), "gpt_oss, llama4");
}

TEST(dense_model_type_is_refused_clearly) {
    fmoe_model_geometry g;
    ASSERT_EQ(parse_str("{\"model_type\":\"llama\",\"num_hidden_layers\":32,"
                        "\"hidden_size\":4096,\"intermediate_size\":14336}",
                        &g),
              FMOE_EUNSUPPORTED);
    ASSERT_CONTAINS(fmoe_error_detail(), "\"llama\" is a dense model");
}

TEST(moe_family_without_experts_is_dense) {
    fmoe_model_geometry g;
    ASSERT_EQ(parse_str("{\"model_type\":\"deepseek_v3\",\"num_hidden_layers\":2,"
                        "\"hidden_size\":64,\"n_routed_experts\":null,"
                        "\"num_experts_per_tok\":null,\"moe_intermediate_size\":16}",
                        &g),
              FMOE_EUNSUPPORTED);
    ASSERT_CONTAINS(fmoe_error_detail(), "n_routed_experts is null");
    ASSERT_CONTAINS(fmoe_error_detail(), "dense");

    ASSERT_EQ(parse_str("{\"model_type\":\"qwen3_moe\",\"num_hidden_layers\":2,"
                        "\"hidden_size\":64,\"num_experts\":0,\"num_experts_per_tok\":2,"
                        "\"moe_intermediate_size\":16}",
                        &g),
              FMOE_EUNSUPPORTED);
    ASSERT_CONTAINS(fmoe_error_detail(), "num_experts = 0");

    /* every layer listed as dense */
    ASSERT_EQ(parse_str("{\"model_type\":\"qwen3_moe\",\"num_hidden_layers\":2,"
                        "\"hidden_size\":64,\"num_experts\":4,\"num_experts_per_tok\":2,"
                        "\"moe_intermediate_size\":16,\"mlp_only_layers\":[0,1]}",
                        &g),
              FMOE_EUNSUPPORTED);
    ASSERT_CONTAINS(fmoe_error_detail(), "none of the 2 decoder layers is a MoE layer");
}

TEST(malformed_json_gives_offset) {
    fmoe_model_geometry g;
    const char *bad = "{\n  \"model_type\": \"mixtral\",\n  \"hidden_size\": ,\n}";
    ASSERT_EQ(parse_str(bad, &g), FMOE_EFORMAT);
    ASSERT_CONTAINS(fmoe_error_detail(), "malformed JSON near byte");
    ASSERT_CONTAINS(fmoe_error_detail(), "line 3");

    ASSERT_EQ(parse_str("{\"model_type\": \"mixtral\"", &g), FMOE_EFORMAT); /* truncated */
    ASSERT_CONTAINS(fmoe_error_detail(), "malformed JSON");
    ASSERT_EQ(parse_str("{\"model_type\": \"mixtral\"} x", &g), FMOE_EFORMAT); /* trailing */
    ASSERT_CONTAINS(fmoe_error_detail(), "near byte 26");
    ASSERT_EQ(fmoe_geometry_parse("", 0, &g), FMOE_EFORMAT);
    ASSERT_CONTAINS(fmoe_error_detail(), "empty input");
    ASSERT_EQ(parse_str("[1, 2]", &g), FMOE_EFORMAT);
    ASSERT_CONTAINS(fmoe_error_detail(), "must be a JSON object, not an array");
}

TEST(missing_keys_are_named) {
    fmoe_model_geometry g;
    ASSERT_EQ(parse_str("{\"num_hidden_layers\":2}", &g), FMOE_EFORMAT);
    ASSERT_CONTAINS(fmoe_error_detail(), "missing key model_type");
    ASSERT_EQ(parse_str("{\"model_type\":\"mixtral\",\"num_hidden_layers\":32,"
                        "\"hidden_size\":4096,\"intermediate_size\":14336,"
                        "\"num_experts_per_tok\":2}",
                        &g),
              FMOE_EFORMAT);
    ASSERT_CONTAINS(fmoe_error_detail(), "missing key num_local_experts");
    ASSERT_EQ(parse_str("{\"model_type\":\"qwen3_moe\",\"num_hidden_layers\":2,"
                        "\"hidden_size\":64,\"num_experts\":4,\"num_experts_per_tok\":2}",
                        &g),
              FMOE_EFORMAT);
    ASSERT_CONTAINS(fmoe_error_detail(), "missing key moe_intermediate_size");
    ASSERT_EQ(parse_str("{\"model_type\":\"llama4\"}", &g), FMOE_EFORMAT);
    ASSERT_CONTAINS(fmoe_error_detail(), "missing key text_config");
    ASSERT_EQ(parse_str("{\"model_type\":\"llama4\",\"text_config\":{\"num_hidden_layers\":2,"
                        "\"hidden_size\":64,\"intermediate_size\":64,"
                        "\"num_experts_per_tok\":1}}",
                        &g),
              FMOE_EFORMAT);
    ASSERT_CONTAINS(fmoe_error_detail(), "missing key text_config.num_local_experts");
}

TEST(wrong_types_are_named) {
    fmoe_model_geometry g;
    ASSERT_EQ(parse_str("{\"model_type\":\"mixtral\",\"num_hidden_layers\":32,"
                        "\"hidden_size\":4096,\"intermediate_size\":14336,"
                        "\"num_local_experts\":8,\"num_experts_per_tok\":\"2\"}",
                        &g),
              FMOE_EFORMAT);
    ASSERT_CONTAINS(fmoe_error_detail(), "num_experts_per_tok must be an integer, not a string");
    ASSERT_EQ(parse_str("{\"model_type\":\"mixtral\",\"num_hidden_layers\":32,"
                        "\"hidden_size\":4096.5,\"intermediate_size\":14336,"
                        "\"num_local_experts\":8,\"num_experts_per_tok\":2}",
                        &g),
              FMOE_EFORMAT);
    ASSERT_CONTAINS(fmoe_error_detail(), "hidden_size must be an integer");
    ASSERT_EQ(parse_str("{\"model_type\":\"olmoe\",\"num_hidden_layers\":2,"
                        "\"hidden_size\":64,\"intermediate_size\":64,\"num_experts\":8,"
                        "\"num_experts_per_tok\":2,\"norm_topk_prob\":1}",
                        &g),
              FMOE_EFORMAT);
    ASSERT_CONTAINS(fmoe_error_detail(), "norm_topk_prob must be a boolean, not a number");
    ASSERT_EQ(parse_str("{\"model_type\":7}", &g), FMOE_EFORMAT);
    ASSERT_CONTAINS(fmoe_error_detail(), "model_type must be a string");
    ASSERT_EQ(parse_str("{\"model_type\":\"qwen3_moe\",\"num_hidden_layers\":2,"
                        "\"hidden_size\":64,\"num_experts\":4,\"num_experts_per_tok\":2,"
                        "\"moe_intermediate_size\":16,\"mlp_only_layers\":[\"0\"]}",
                        &g),
              FMOE_EFORMAT);
    ASSERT_CONTAINS(fmoe_error_detail(), "mlp_only_layers must be an integer");
    ASSERT_EQ(parse_str("{\"model_type\":\"mixtral\",\"num_hidden_layers\":2,"
                        "\"hidden_size\":64,\"intermediate_size\":64,\"num_local_experts\":8,"
                        "\"num_experts_per_tok\":2,\"torch_dtype\":\"int4\"}",
                        &g),
              FMOE_EFORMAT);
    ASSERT_CONTAINS(fmoe_error_detail(), "torch_dtype \"int4\"");
}

TEST(values_out_of_range) {
    fmoe_model_geometry g;
    ASSERT_EQ(parse_str("{\"model_type\":\"mixtral\",\"num_hidden_layers\":32,"
                        "\"hidden_size\":4096,\"intermediate_size\":14336,"
                        "\"num_local_experts\":8,\"num_experts_per_tok\":9}",
                        &g),
              FMOE_ERANGE);
    ASSERT_CONTAINS(fmoe_error_detail(), "num_experts_per_tok = 9 exceeds the 8 routed experts");
    ASSERT_EQ(parse_str("{\"model_type\":\"mixtral\",\"num_hidden_layers\":1000,"
                        "\"hidden_size\":4096,\"intermediate_size\":14336,"
                        "\"num_local_experts\":8,\"num_experts_per_tok\":2}",
                        &g),
              FMOE_ERANGE);
    ASSERT_CONTAINS(fmoe_error_detail(), "num_hidden_layers = 1000 is out of range [1, 512]");
    ASSERT_EQ(parse_str("{\"model_type\":\"deepseek_v3\",\"num_hidden_layers\":4,"
                        "\"hidden_size\":64,\"n_routed_experts\":10,\"num_experts_per_tok\":2,"
                        "\"moe_intermediate_size\":16,\"n_group\":4,\"topk_group\":2}",
                        &g),
              FMOE_ERANGE);
    ASSERT_CONTAINS(fmoe_error_detail(), "n_group = 4 does not divide 10 routed experts");
    ASSERT_EQ(parse_str("{\"model_type\":\"deepseek_v3\",\"num_hidden_layers\":4,"
                        "\"hidden_size\":64,\"n_routed_experts\":8,\"num_experts_per_tok\":4,"
                        "\"moe_intermediate_size\":16,\"n_group\":4,\"topk_group\":1}",
                        &g),
              FMOE_ERANGE);
    ASSERT_CONTAINS(fmoe_error_detail(), "cannot hold top-k = 4");
}

TEST(output_untouched_on_error) {
    fmoe_model_geometry g;
    memset(&g, 0xab, sizeof g);
    ASSERT_EQ(parse_str("{\"model_type\":\"mixtral\",\"num_hidden_layers\":32,"
                        "\"hidden_size\":4096,\"intermediate_size\":14336,"
                        "\"num_local_experts\":8,\"num_experts_per_tok\":9}",
                        &g),
              FMOE_ERANGE);
    const unsigned char *p = (const unsigned char *)&g;
    for (size_t i = 0; i < sizeof g; i++) ASSERT_EQ(p[i], 0xab);
}

/* The text is read through `len` only: an exact-size heap copy with no NUL lets ASan
 * catch any read past the end. */
TEST(input_need_not_be_nul_terminated) {
    char path[1024];
    snprintf(path, sizeof path, "%s/configs/openai--gpt-oss-20b/config.json",
             harness_fixtures());
    FILE *f = fopen(path, "rb");
    ASSERT_TRUE(f != NULL);
    char tmp[8192];
    size_t n = fread(tmp, 1, sizeof tmp, f);
    fclose(f);
    ASSERT_TRUE(n > 100 && n < sizeof tmp);
    char *exact = malloc(n);
    memcpy(exact, tmp, n);
    fmoe_model_geometry g;
    int rc = fmoe_geometry_parse(exact, n, &g);
    char hex1[65], hex2[65];
    int rc2 = fmoe_config_fingerprint(exact, n, hex1);
    /* and a truncated prefix fails cleanly */
    int rc3 = fmoe_geometry_parse(exact, n / 2, &g);
    free(exact);
    ASSERT_OK(rc);
    ASSERT_OK(rc2);
    ASSERT_EQ(rc3, FMOE_EFORMAT);
    ASSERT_OK(fmoe_config_fingerprint(tmp, n, hex2));
    ASSERT_STR_EQ(hex1, hex2);
}

TEST(load_errors_name_the_path) {
    fmoe_model_geometry g;
    ASSERT_EQ(fmoe_geometry_load("/nonexistent/dir/config.json", &g), FMOE_EIO);
    ASSERT_CONTAINS(fmoe_error_detail(), "/nonexistent/dir/config.json");

    char path[] = "/tmp/fmoe-test-geometry-XXXXXX";
    int fd = mkstemp(path);
    ASSERT_TRUE(fd >= 0);
    const char *bad = "{\"model_type\": \"mixtral\", }";
    ASSERT_EQ(write(fd, bad, strlen(bad)), (long long)strlen(bad));
    close(fd);
    int rc = fmoe_geometry_load(path, &g);
    unlink(path);
    ASSERT_EQ(rc, FMOE_EFORMAT);
    ASSERT_CONTAINS(fmoe_error_detail(), path);
    ASSERT_CONTAINS(fmoe_error_detail(), "malformed JSON");
}

/* ---------------------------------------------------------------------------------- */
/* Generic geometry, dtypes, sizes                                                    */
/* ---------------------------------------------------------------------------------- */

TEST(generic_geometry) {
    fmoe_model_geometry g;
    ASSERT_OK(fmoe_geometry_generic(32, 8, 2, 4096, &g));
    ASSERT_EQ(g.family, FMOE_FAMILY_GENERIC);
    ASSERT_STR_EQ(g.model_type, "generic");
    ASSERT_EQ(g.num_hidden_layers, 32);
    ASSERT_MOE_LAYERS(g, 0, 1);
    ASSERT_EQ(g.num_experts, 8);
    ASSERT_EQ(g.top_k, 2);
    ASSERT_EQ(g.hidden_size, 4096);
    ASSERT_EQ(fmoe_geometry_expert_bytes(&g, FMOE_DTYPE_BF16), 0);
    g.moe_intermediate_size = 14336;
    ASSERT_EQ(fmoe_geometry_expert_bytes(&g, FMOE_DTYPE_BF16), 3LL * 4096 * 14336 * 2);
    ASSERT_EQ(fmoe_geometry_generic(32, 8, 9, 0, &g), FMOE_EINVAL);
    ASSERT_EQ(fmoe_geometry_generic(0, 8, 2, 0, &g), FMOE_EINVAL);
    ASSERT_EQ(fmoe_geometry_generic(FMOE_MAX_LAYERS + 1, 8, 2, 0, &g), FMOE_EINVAL);
    ASSERT_EQ(fmoe_geometry_generic(2, 0, 1, 0, &g), FMOE_EINVAL);
    ASSERT_EQ(fmoe_geometry_generic(2, 8, 2, -1, &g), FMOE_EINVAL);
}

TEST(expert_bytes_every_dtype) {
    fmoe_model_geometry g;
    ASSERT_OK(load_fixture("mistralai--Mixtral-8x7B-v0.1", &g));
    int64_t p = 3LL * 4096 * 14336;
    ASSERT_EQ(fmoe_geometry_expert_bytes(&g, FMOE_DTYPE_F32), p * 4);
    ASSERT_EQ(fmoe_geometry_expert_bytes(&g, FMOE_DTYPE_F16), p * 2);
    ASSERT_EQ(fmoe_geometry_expert_bytes(&g, FMOE_DTYPE_BF16), p * 2);
    ASSERT_EQ(fmoe_geometry_expert_bytes(&g, FMOE_DTYPE_F8_E4M3), p);
    ASSERT_EQ(fmoe_geometry_expert_bytes(&g, FMOE_DTYPE_MXFP4), p * 17 / 32); /* 4.25 bits */
    ASSERT_EQ(fmoe_geometry_expert_bytes(&g, (fmoe_dtype)99), FMOE_EINVAL);
    ASSERT_EQ(fmoe_geometry_expert_bytes(NULL, FMOE_DTYPE_BF16), FMOE_EINVAL);
    ASSERT_EQ(fmoe_geometry_expert_params(NULL), FMOE_EINVAL);
    /* widths that are not multiples of 32 round each row up to whole blocks */
    g.hidden_size = 40;
    g.moe_intermediate_size = 33;
    ASSERT_EQ(fmoe_geometry_expert_bytes(&g, FMOE_DTYPE_MXFP4), (2 * 33 * 2 + 40 * 2) * 17);
}

TEST(dtype_names) {
    fmoe_dtype d;
    ASSERT_OK(fmoe_dtype_parse("bfloat16", &d));
    ASSERT_EQ(d, FMOE_DTYPE_BF16);
    ASSERT_OK(fmoe_dtype_parse("torch.float16", &d));
    ASSERT_EQ(d, FMOE_DTYPE_F16);
    ASSERT_OK(fmoe_dtype_parse("float32", &d));
    ASSERT_EQ(d, FMOE_DTYPE_F32);
    ASSERT_OK(fmoe_dtype_parse("float8_e4m3fn", &d));
    ASSERT_EQ(d, FMOE_DTYPE_F8_E4M3);
    ASSERT_OK(fmoe_dtype_parse("MXFP4", &d));
    ASSERT_EQ(d, FMOE_DTYPE_MXFP4);
    ASSERT_OK(fmoe_dtype_parse("Q4_K", &d));
    ASSERT_EQ(d, FMOE_DTYPE_Q4_K);
    for (int i = 0; i <= FMOE_DTYPE_Q6_K; i++) {
        ASSERT_OK(fmoe_dtype_parse(fmoe_dtype_name((fmoe_dtype)i), &d));
        ASSERT_EQ(d, i);
    }
    ASSERT_EQ(fmoe_dtype_parse("int4", &d), FMOE_EINVAL);
    ASSERT_CONTAINS(fmoe_error_detail(), "unknown dtype \"int4\"");
    ASSERT_STR_EQ(fmoe_dtype_name((fmoe_dtype)42), "unknown");
    ASSERT_NEAR(fmoe_dtype_bits(FMOE_DTYPE_F32), 32, 0);
    ASSERT_NEAR(fmoe_dtype_bits(FMOE_DTYPE_BF16), 16, 0);
    ASSERT_NEAR(fmoe_dtype_bits(FMOE_DTYPE_F8_E4M3), 8, 0);
    ASSERT_NEAR(fmoe_dtype_bits(FMOE_DTYPE_MXFP4), 4.25, 0);
    ASSERT_NEAR(fmoe_dtype_bits(FMOE_DTYPE_Q8_0), 8.5, 0);
    ASSERT_NEAR(fmoe_dtype_bits(FMOE_DTYPE_Q4_K), 4.5, 0);
    ASSERT_NEAR(fmoe_dtype_bits((fmoe_dtype)42), 0, 0);
}

/* ggml's block formats as a GGUF file stores experts: blocks along each row's input
 * dimension (ggml-common.h: Q8_0 32 values in 34 bytes, K-quants 256 in 144/176/210). */
TEST(quantized_expert_bytes) {
    fmoe_model_geometry g;
    ASSERT_OK(fmoe_geometry_generic(2, 8, 2, 256, &g));
    g.moe_intermediate_size = 512;
    const int64_t vals = 3LL * 256 * 512;
    ASSERT_EQ(fmoe_geometry_expert_bytes(&g, FMOE_DTYPE_Q8_0), vals / 32 * 34);
    ASSERT_EQ(fmoe_geometry_expert_bytes(&g, FMOE_DTYPE_Q4_K), vals / 256 * 144);
    ASSERT_EQ(fmoe_geometry_expert_bytes(&g, FMOE_DTYPE_Q5_K), vals / 256 * 176);
    ASSERT_EQ(fmoe_geometry_expert_bytes(&g, FMOE_DTYPE_Q6_K), vals / 256 * 210);
    ASSERT_EQ(fmoe_geometry_expert_bytes(&g, FMOE_DTYPE_Q4_K) * 8,
              (int64_t)(fmoe_dtype_bits(FMOE_DTYPE_Q4_K) * (double)vals));
    /* the 32-value types: 18, 20, 22, 24, 18 bytes a block, and their bits */
    static const struct { fmoe_dtype d; int64_t bytes; double bits; const char *name; } q32[] = {
        {FMOE_DTYPE_Q4_0, 18, 4.5, "q4_0"}, {FMOE_DTYPE_Q4_1, 20, 5.0, "q4_1"},
        {FMOE_DTYPE_Q5_0, 22, 5.5, "q5_0"}, {FMOE_DTYPE_Q5_1, 24, 6.0, "q5_1"},
        {FMOE_DTYPE_IQ4_NL, 18, 4.5, "iq4_nl"},
    };
    for (int i = 0; i < 5; i++) {
        ASSERT_EQ(fmoe_geometry_expert_bytes(&g, q32[i].d), vals / 32 * q32[i].bytes);
        ASSERT_NEAR(fmoe_dtype_bits(q32[i].d), q32[i].bits, 0);
        ASSERT_EQ(fmoe_geometry_expert_bytes(&g, q32[i].d) * 8,
                  (int64_t)(fmoe_dtype_bits(q32[i].d) * (double)vals));
        ASSERT_STR_EQ(fmoe_dtype_name(q32[i].d), q32[i].name);
        fmoe_dtype back;
        ASSERT_OK(fmoe_dtype_parse(q32[i].name, &back));
        ASSERT_EQ((int)back, (int)q32[i].d);
        ASSERT_EQ(fmoe_dtype_ggml_type(q32[i].d) != 0, 1);
        ASSERT_OK(fmoe_dtype_of_ggml_type(fmoe_dtype_ggml_type(q32[i].d), &back));
        ASSERT_EQ((int)back, (int)q32[i].d);
    }
    /* the low-bit K-quants: 84, 110, 136 bytes a 256-value block */
    static const struct { fmoe_dtype d; int64_t bytes; double bits; const char *name; } kx[] = {
        {FMOE_DTYPE_Q2_K, 84, 2.625, "q2_k"}, {FMOE_DTYPE_Q3_K, 110, 3.4375, "q3_k"},
        {FMOE_DTYPE_IQ4_XS, 136, 4.25, "iq4_xs"},
        /* the i-quants (ggml-common.h's block sizes) */
        {FMOE_DTYPE_IQ2_XXS, 66, 2.0625, "iq2_xxs"}, {FMOE_DTYPE_IQ2_XS, 74, 2.3125, "iq2_xs"},
        {FMOE_DTYPE_IQ2_S, 82, 2.5625, "iq2_s"},     {FMOE_DTYPE_IQ3_XXS, 98, 3.0625, "iq3_xxs"},
        {FMOE_DTYPE_IQ3_S, 110, 3.4375, "iq3_s"},    {FMOE_DTYPE_IQ1_S, 50, 1.5625, "iq1_s"},
        {FMOE_DTYPE_IQ1_M, 56, 1.75, "iq1_m"},
    };
    for (int i = 0; i < (int)(sizeof kx / sizeof kx[0]); i++) {
        ASSERT_EQ(fmoe_geometry_expert_bytes(&g, kx[i].d), vals / 256 * kx[i].bytes);
        ASSERT_EQ(fmoe_geometry_expert_bytes(&g, kx[i].d) * 8,
                  (int64_t)(fmoe_dtype_bits(kx[i].d) * (double)vals));
        ASSERT_STR_EQ(fmoe_dtype_name(kx[i].d), kx[i].name);
        fmoe_dtype back;
        ASSERT_OK(fmoe_dtype_parse(kx[i].name, &back));
        ASSERT_EQ((int)back, (int)kx[i].d);
        ASSERT_OK(fmoe_dtype_of_ggml_type(fmoe_dtype_ggml_type(kx[i].d), &back));
        ASSERT_EQ((int)back, (int)kx[i].d);
    }
    /* a 1408-wide down projection (Qwen1.5-MoE, DeepSeek-MoE): whole blocks of 32, not 256 */
    g.moe_intermediate_size = 1408;
    ASSERT_EQ(fmoe_geometry_expert_bytes(&g, FMOE_DTYPE_Q5_0), 3LL * 256 * 1408 / 32 * 22);
}

/* ---------------------------------------------------------------------------------- */
/* Fingerprint                                                                        */
/* ---------------------------------------------------------------------------------- */

static int fp(const char *json, char hex[65]) {
    return fmoe_config_fingerprint(json, strlen(json), hex);
}

TEST(fingerprint_ignores_key_order_and_whitespace) {
    char a[65], b[65], c[65];
    ASSERT_OK(fp("{\"b\": 1, \"a\": [1, {\"d\": 2.0, \"c\": \"x\\/y\"}], \"e\": null}", a));
    ASSERT_OK(fp("{\n\t\"e\":null,\n  \"a\" : [ 1 , { \"c\":\"x/y\" , \"d\":2 } ] ,\"b\":1 }\n",
                 b));
    ASSERT_STR_EQ(a, b);
    /* and it is the hash of exactly the documented canonical text */
    const char *canon = "{\"a\":[1,{\"c\":\"x/y\",\"d\":2}],\"b\":1,\"e\":null}";
    fmoe_sha256_hex(canon, strlen(canon), c);
    ASSERT_STR_EQ(a, c);
}

TEST(fingerprint_changes_with_a_value) {
    char a[65], b[65], c[65];
    ASSERT_OK(fp("{\"num_experts\": 8, \"top_k\": 2}", a));
    ASSERT_OK(fp("{\"num_experts\": 8, \"top_k\": 3}", b));
    ASSERT_OK(fp("{\"num_experts\": 8, \"top_k\": \"2\"}", c));
    ASSERT_TRUE(strcmp(a, b) != 0);
    ASSERT_TRUE(strcmp(a, c) != 0);
    /* array order is data, not formatting */
    ASSERT_OK(fp("[1, 2]", a));
    ASSERT_OK(fp("[2, 1]", b));
    ASSERT_TRUE(strcmp(a, b) != 0);
}

TEST(fingerprint_of_fixtures) {
    /* Mixtral-8x7B base and Instruct share one config.json. */
    char path[1024], a[65], b[65];
    const char *names[2] = {"mistralai--Mixtral-8x7B-v0.1",
                            "mistralai--Mixtral-8x7B-Instruct-v0.1"};
    char *hex[2] = {a, b};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/configs/%s/config.json", harness_fixtures(), names[i]);
        FILE *f = fopen(path, "rb");
        ASSERT_TRUE(f != NULL);
        char buf[4096];
        size_t n = fread(buf, 1, sizeof buf, f);
        fclose(f);
        ASSERT_OK(fmoe_config_fingerprint(buf, n, hex[i]));
    }
    ASSERT_STR_EQ(a, b);
    /* Regression pin: trace and store files carry this value, so the canonical form must
     * not drift. Checked independently: Python's json.load, keys sorted by UTF-8 bytes,
     * no whitespace, numbers as cJSON prints them ("%d" when integral, else %1.15g, else
     * %1.17g), hashed with hashlib.sha256, gives the same digest. */
    ASSERT_STR_EQ(a, "9a32df5f7c5348c198ebbbb2a9e4fde116f903c6d313b8f6723c617d400bdfbf");
}

TEST(fingerprint_rejects_malformed) {
    char hex[65];
    ASSERT_EQ(fp("{\"a\": }", hex), FMOE_EFORMAT);
    ASSERT_CONTAINS(fmoe_error_detail(), "malformed JSON");
    ASSERT_EQ(fmoe_config_fingerprint("{}", 2, NULL), FMOE_EINVAL);
}

int main(int argc, char **argv) { return RUN_TESTS(argc, argv); }
