/* test_quantize_mix - the mixes' names and llama-quantize's per-tensor rules
 * (runtime/model/quantize_mix.c) on hand-picked tensors: the layer boundaries of
 * use_more_bits and of the n/8 and n/16 rules, the 8-expert and GQA rules, the tied head.
 * tests/python/test_quantize_mix.py checks whole files against an independent reading. */
#include "fmoe/quant.h"
#include "fmoe/quantize.h"
#include "harness.h"

static uint32_t type_of(fmoe_quant_mix m, const fmoe_quant_mix_model *g, const char *name) {
    return fmoe_quant_mix_type(m, g, name, 4096);
}

TEST(names_bases_and_file_types) {
    static const struct {
        const char *name;
        fmoe_quant_mix mix;
        uint32_t base, ftype;
    } want[] = {
        {"q2_k", FMOE_MIX_Q2_K, FMOE_GGML_Q2_K, 10},     {"q3_k_s", FMOE_MIX_Q3_K_S, FMOE_GGML_Q3_K, 11},
        {"q3_k_m", FMOE_MIX_Q3_K_M, FMOE_GGML_Q3_K, 12}, {"q3_k_l", FMOE_MIX_Q3_K_L, FMOE_GGML_Q3_K, 13},
        {"q4_k_s", FMOE_MIX_Q4_K_S, FMOE_GGML_Q4_K, 14}, {"q4_k_m", FMOE_MIX_Q4_K_M, FMOE_GGML_Q4_K, 15},
        {"q5_k_s", FMOE_MIX_Q5_K_S, FMOE_GGML_Q5_K, 16}, {"q5_k_m", FMOE_MIX_Q5_K_M, FMOE_GGML_Q5_K, 17},
    };
    for (int i = 0; i < 8; i++) {
        fmoe_quant_mix m;
        ASSERT_EQ(fmoe_quant_mix_parse(want[i].name, &m), 0);
        ASSERT_EQ((int)m, (int)want[i].mix);
        ASSERT_STR_EQ(fmoe_quant_mix_name(m), want[i].name);
        ASSERT_EQ(fmoe_quant_mix_base(m), want[i].base);
        ASSERT_EQ(fmoe_quant_mix_ftype(m), want[i].ftype);
    }
    fmoe_quant_mix m;
    ASSERT_EQ(fmoe_quant_mix_parse("q4_k", &m), -1);
    ASSERT_TRUE(fmoe_quant_mix_name(FMOE_MIX_NONE) == NULL);
    ASSERT_EQ(fmoe_quant_mix_base(FMOE_MIX_NONE), 0);
    ASSERT_EQ(fmoe_quant_mix_type(FMOE_MIX_NONE, &(fmoe_quant_mix_model){0}, "x", 256), 0);
}

/* n = 32: use_more_bits is i < 4, i >= 28, or (i - 4) % 3 == 2 (6, 9, ..., 27). */
TEST(use_more_bits_layers_of_q4_k_m) {
    const fmoe_quant_mix_model g = {.n_layer = 32, .n_head = 32, .n_kv_head = 8, .n_expert = 128,
                                    .has_output = 1};
    const int more[] = {0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31};
    for (int i = 0, k = 0; i < 32; i++) {
        char down[64], v[64];
        snprintf(down, sizeof down, "blk.%d.ffn_down_exps.weight", i);
        snprintf(v, sizeof v, "blk.%d.attn_v.weight", i);
        const int yes = k < 16 && more[k] == i;
        k += yes;
        ASSERT_EQ(type_of(FMOE_MIX_Q4_K_M, &g, down), yes ? FMOE_GGML_Q6_K : FMOE_GGML_Q4_K);
        ASSERT_EQ(type_of(FMOE_MIX_Q5_K_M, &g, v), yes ? FMOE_GGML_Q6_K : FMOE_GGML_Q5_K);
        ASSERT_EQ(type_of(FMOE_MIX_Q4_K_S, &g, down), i < 4 ? FMOE_GGML_Q5_K : FMOE_GGML_Q4_K);
        ASSERT_EQ(type_of(FMOE_MIX_Q3_K_M, &g, down), i < 2 ? FMOE_GGML_Q5_K : FMOE_GGML_Q4_K);
        ASSERT_EQ(type_of(FMOE_MIX_Q3_K_M, &g, v), i < 2 ? FMOE_GGML_Q5_K : FMOE_GGML_Q4_K);
    }
    /* shared experts and dense layers' ffn_down take the same rule */
    ASSERT_EQ(type_of(FMOE_MIX_Q4_K_M, &g, "blk.6.ffn_down_shexp.weight"), FMOE_GGML_Q6_K);
    ASSERT_EQ(type_of(FMOE_MIX_Q4_K_M, &g, "blk.0.ffn_down.weight"), FMOE_GGML_Q6_K);
    ASSERT_EQ(type_of(FMOE_MIX_Q4_K_M, &g, "blk.5.ffn_gate_exps.weight"), FMOE_GGML_Q4_K);
    ASSERT_EQ(type_of(FMOE_MIX_Q2_K, &g, "blk.5.ffn_down_exps.weight"), FMOE_GGML_Q3_K);
    ASSERT_EQ(type_of(FMOE_MIX_Q2_K, &g, "blk.5.ffn_up_exps.weight"), FMOE_GGML_Q2_K);
    ASSERT_EQ(type_of(FMOE_MIX_Q2_K, &g, "blk.5.attn_v.weight"), FMOE_GGML_Q4_K); /* GQA 4 */
    ASSERT_EQ(type_of(FMOE_MIX_Q2_K, &g, "blk.5.attn_output.weight"), FMOE_GGML_Q3_K);
}

TEST(eight_experts_head_and_embeddings) {
    fmoe_quant_mix_model g = {.n_layer = 32, .n_head = 32, .n_kv_head = 8, .n_expert = 8,
                              .has_output = 1};
    ASSERT_EQ(type_of(FMOE_MIX_Q4_K_M, &g, "blk.7.attn_v.weight"), FMOE_GGML_Q8_0);
    ASSERT_EQ(type_of(FMOE_MIX_Q2_K, &g, "blk.7.attn_k.weight"), FMOE_GGML_Q8_0);
    ASSERT_EQ(type_of(FMOE_MIX_Q4_K_M, &g, "blk.7.attn_output.weight"), FMOE_GGML_Q5_K);
    ASSERT_EQ(type_of(FMOE_MIX_Q3_K_L, &g, "blk.7.attn_output.weight"), FMOE_GGML_Q3_K);
    ASSERT_EQ(type_of(FMOE_MIX_Q4_K_M, &g, "output.weight"), FMOE_GGML_Q6_K);
    ASSERT_EQ(type_of(FMOE_MIX_Q4_K_M, &g, "token_embd.weight"), FMOE_GGML_Q4_K);
    ASSERT_EQ(fmoe_quant_mix_type(FMOE_MIX_Q2_K, &g, "output.weight", 1408), FMOE_GGML_Q8_0);
    g.has_output = 0; /* tied: the embeddings take the head's type */
    ASSERT_EQ(type_of(FMOE_MIX_Q2_K, &g, "token_embd.weight"), FMOE_GGML_Q6_K);
    g.n_expert = 16; /* the Mixtral rules are for exactly 8 */
    ASSERT_EQ(type_of(FMOE_MIX_Q4_K_M, &g, "blk.7.attn_k.weight"), FMOE_GGML_Q4_K);
    ASSERT_EQ(type_of(FMOE_MIX_Q4_K_M, &g, "blk.7.attn_output.weight"), FMOE_GGML_Q4_K);
}

int main(int argc, char **argv) { return RUN_TESTS(argc, argv); }
