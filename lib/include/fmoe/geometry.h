/*
 * fmoe/geometry.h - the MoE geometry of a HuggingFace model, parsed from its config.json.
 *
 * Everything the rest of fmoe needs to know about a model without its weights: how many
 * decoder layers there are and which of them are MoE, routed experts J, top-k K, shared
 * experts, sizes, bytes per routed expert at a dtype, and the router's semantics.
 *
 * Families: Mixtral, Qwen2-MoE (Qwen1.5-MoE), Qwen3-MoE, OLMoE, DeepSeek-MoE V1/V2/V3,
 * Phi-3.5-MoE, gpt-oss, Llama-4, GLM-4.5. An unknown model_type is FMOE_EUNSUPPORTED with
 * a detail listing the supported ones.
 */
#ifndef FMOE_GEOMETRY_H
#define FMOE_GEOMETRY_H

#include <stddef.h>
#include <stdint.h>

#define FMOE_MAX_LAYERS 512

typedef enum fmoe_family {
    FMOE_FAMILY_MIXTRAL = 0,
    FMOE_FAMILY_QWEN2_MOE = 1,
    FMOE_FAMILY_QWEN3_MOE = 2,
    FMOE_FAMILY_OLMOE = 3,
    FMOE_FAMILY_DEEPSEEK_V1 = 4,
    FMOE_FAMILY_DEEPSEEK_V2 = 5,
    FMOE_FAMILY_DEEPSEEK_V3 = 6,
    FMOE_FAMILY_PHIMOE = 7,
    FMOE_FAMILY_GPT_OSS = 8,
    FMOE_FAMILY_LLAMA4 = 9,
    FMOE_FAMILY_GENERIC = 10, /* geometry given by hand (--layers/--experts/--top-k) */
    FMOE_FAMILY_GLM4_MOE = 11, /* GLM-4.5, GLM-4.5-Air */
} fmoe_family;

typedef enum fmoe_dtype {
    FMOE_DTYPE_F32 = 0,
    FMOE_DTYPE_F16 = 1,
    FMOE_DTYPE_BF16 = 2,
    FMOE_DTYPE_F8_E4M3 = 3,
    FMOE_DTYPE_MXFP4 = 4, /* 4-bit values + one 8-bit scale per 32: 4.25 bits/param */
    /* ggml's block formats, as GGUF files store experts (fmoe/quant.h): */
    FMOE_DTYPE_Q8_0 = 5,  /* 32 int8 + an f16 scale: 8.5 bits/param */
    FMOE_DTYPE_Q4_K = 6,  /* super-blocks of 256 in 144 bytes: 4.5 bits/param */
    FMOE_DTYPE_Q5_K = 7,  /* 256 in 176 bytes: 5.5 bits/param */
    FMOE_DTYPE_Q6_K = 8,  /* 256 in 210 bytes: 6.5625 bits/param */
    /* ggml's 32-value blocks, which llama-quantize falls back to for rows that are not
     * whole 256-value super-blocks (and IQ4_NL for i-quant mixes): */
    FMOE_DTYPE_Q4_0 = 9,   /* 32 in 18 bytes: 4.5 bits/param */
    FMOE_DTYPE_Q4_1 = 10,  /* 32 in 20 bytes: 5 bits/param */
    FMOE_DTYPE_Q5_0 = 11,  /* 32 in 22 bytes: 5.5 bits/param */
    FMOE_DTYPE_Q5_1 = 12,  /* 32 in 24 bytes: 6 bits/param */
    FMOE_DTYPE_IQ4_NL = 13, /* 32 in 18 bytes: 4.5 bits/param */
    /* the low-bit K-quants of the Q2_K / Q3_K mixes and "dynamic" expert quantizations: */
    FMOE_DTYPE_Q2_K = 14,   /* 256 in 84 bytes: 2.625 bits/param */
    FMOE_DTYPE_Q3_K = 15,   /* 256 in 110 bytes: 3.4375 bits/param */
    FMOE_DTYPE_IQ4_XS = 16, /* 256 in 136 bytes: 4.25 bits/param */
    /* the codebook i-quants of those expert quantizations (read only: fmoe/quant.h): */
    FMOE_DTYPE_IQ2_XXS = 17, /* 256 in 66 bytes: 2.0625 bits/param */
    FMOE_DTYPE_IQ2_XS = 18,  /* 256 in 74 bytes: 2.3125 bits/param */
    FMOE_DTYPE_IQ2_S = 19,   /* 256 in 82 bytes: 2.5625 bits/param */
    FMOE_DTYPE_IQ3_XXS = 20, /* 256 in 98 bytes: 3.0625 bits/param */
    FMOE_DTYPE_IQ3_S = 21,   /* 256 in 110 bytes: 3.4375 bits/param */
    FMOE_DTYPE_IQ1_S = 22,   /* 256 in 50 bytes: 1.5625 bits/param */
    FMOE_DTYPE_IQ1_M = 23,   /* 256 in 56 bytes: 1.75 bits/param */
} fmoe_dtype;

#define FMOE_DTYPE_LAST FMOE_DTYPE_IQ1_M /* the largest value: arrays indexed by dtype */

typedef enum fmoe_router_scoring {
    FMOE_ROUTER_SOFTMAX = 0,
    FMOE_ROUTER_SIGMOID = 1,
} fmoe_router_scoring;

typedef struct fmoe_model_geometry {
    char model_type[64];          /* config.json "model_type", verbatim */
    fmoe_family family;
    int32_t num_hidden_layers;    /* all decoder layers */
    int32_t num_moe_layers;       /* L: layers with routed experts */
    int32_t moe_layer_index[FMOE_MAX_LAYERS]; /* [L] decoder-layer index of MoE layer l */
    int32_t num_experts;          /* J: routed experts per MoE layer */
    int32_t top_k;                /* K: experts chosen per token */
    int32_t num_shared_experts;   /* always-on experts per MoE layer (0 if none) */
    int32_t hidden_size;          /* h */
    int32_t moe_intermediate_size;    /* routed expert FFN width */
    int32_t shared_intermediate_size; /* total width of the shared expert(s) (0 if none) */
    int32_t intermediate_size;        /* dense FFN width (dense layers); 0 for families
                                         without dense FFNs (Mixtral, OLMoE, Phi-MoE, gpt-oss) */
    int32_t vocab_size;
    int32_t num_attention_heads;
    int32_t num_key_value_heads;
    int32_t head_dim;             /* MLA (DeepSeek V2/V3): qk_nope + qk_rope head dims */
    int64_t max_position_embeddings;
    double rope_theta;
    double rms_norm_eps;
    /* router */
    fmoe_router_scoring scoring;
    int32_t norm_topk_prob;       /* 1: top-k weights renormalised to sum 1 */
    int32_t n_group;              /* grouped routing (DeepSeek V2/V3): groups, 1 = none */
    int32_t topk_group;           /* groups kept per token */
    double routed_scaling_factor; /* 1.0 when absent */
    int32_t expert_has_bias;      /* 1: expert projections carry biases (gpt-oss) */
    int32_t tie_word_embeddings;
    fmoe_dtype dtype;             /* the checkpoint's torch_dtype (bf16 when absent) */
    /* Fields below were added after the first version; new ones go at the end. */
    fmoe_dtype expert_dtype;      /* how the checkpoint stores routed expert weights:
                                     mxfp4 or f8_e4m3 from quantization_config, else dtype */
    char quant_method[32];        /* quantization_config.quant_method ("" when none) */
    char topk_method[32];         /* expert selection: "greedy" (plain top-k),
                                     "group_limited_greedy", "noaux_tc" (DeepSeek V2/V3),
                                     "sparsemixer" (Phi-3.5-MoE) */
    /* Multi-head latent attention (DeepSeek V2/V3); all 0 for other families. */
    int32_t q_lora_rank;          /* 0: full-rank q_proj (V2-Lite) */
    int32_t kv_lora_rank;
    int32_t qk_nope_head_dim;
    int32_t qk_rope_head_dim;
    int32_t v_head_dim;
} fmoe_model_geometry;

/*
 * Parses config.json text (`len` bytes, need not be NUL-terminated) into `out`.
 * Which decoder layers are MoE, the defaults of absent keys and the router semantics
 * follow each family's transformers configuration/modeling code (lib/geometry.c says
 * where it departs). `out` is written only on success. Safe to call from several threads
 * (the one shared write is cJSON's global last-error pointer, which fmoe never reads).
 * @return 0, FMOE_EFORMAT (malformed JSON, missing or wrong-typed field: detail names it),
 *         FMOE_EUNSUPPORTED (unknown model_type: detail lists the supported ones; or a
 *         dense model without routed experts), FMOE_ERANGE (a value out of range, e.g.
 *         top-k > experts or more than FMOE_MAX_LAYERS layers), FMOE_ENOMEM.
 */
int fmoe_geometry_parse(const char *json, size_t len, fmoe_model_geometry *out);

/* Reads and parses a config.json file; errors name the path. A GGUF file (it starts with
 * "GGUF") gives the config it stands for (fmoe_gguf_config_json) and, as expert_dtype,
 * its routed experts' stored type (q8_0, q4_k, ...).
 * @return as fmoe_geometry_parse, or FMOE_EIO when the file cannot be read; for GGUF also
 *         fmoe_gguf_open's and fmoe_gguf_config_json's errors. */
int fmoe_geometry_load(const char *path, fmoe_model_geometry *out);

/* A geometry given by hand: L MoE layers, J experts, top-k K, hidden size h (may be 0).
 * Every layer is MoE, the router is softmax, dtype bf16; sizes not given are 0, so
 * expert bytes are 0 until the caller sets moe_intermediate_size. @return 0 or FMOE_EINVAL. */
int fmoe_geometry_generic(int32_t layers, int32_t experts, int32_t top_k, int32_t hidden,
                          fmoe_model_geometry *out);

/*
 * Bytes of one routed expert's weights stored as `dtype` (biases included where present).
 * Counted: gate, up and down projections, 3·h·I values, plus gpt-oss's biases (2I + h).
 * f32/f16/bf16: every value at that width. f8_e4m3: weights 1 byte, biases bf16, block
 * scales not counted. mxfp4: per row of each projection, blocks of 32 values along the
 * input dimension at 17 bytes each (16 bytes of 4-bit values + one 8-bit scale, i.e. 4.25
 * bits/value when the width is a multiple of 32); biases bf16. q8_0, q4_k, q5_k, q6_k,
 * q4_0, q4_1, q5_0, q5_1, iq4_nl, q2_k, q3_k, iq4_xs: ggml's blocks (32 or 256 values)
 * along each row's input dimension, as a GGUF file holds them. Router and shared experts are not part of a routed expert.
 * @return bytes (>= 0), or FMOE_EINVAL for a NULL geometry or an unknown dtype.
 */
int64_t fmoe_geometry_expert_bytes(const fmoe_model_geometry *g, fmoe_dtype dtype);

/* Parameters of one routed expert (weights and biases): 3·h·I (+ 2I + h with biases).
 * @return the count, or FMOE_EINVAL for NULL. */
int64_t fmoe_geometry_expert_params(const fmoe_model_geometry *g);

/* Parameters of one decoder layer's attention projections (norms inside them included,
 * biases not): q, k, v, o as h·H·D + 2·h·Hkv·D + H·D·h; for multi-head latent attention
 * (DeepSeek-V2/V3, kv_lora_rank > 0) q_a (+ its norm) and q_b, or q_proj without
 * q_lora_rank, kv_a_proj_with_mqa (+ its norm), kv_b and o. @return the count, or
 * FMOE_EINVAL for NULL. */
int64_t fmoe_geometry_attention_params(const fmoe_model_geometry *g);

/* Values one token keeps in one layer's KV cache: keys and values, 2·Hkv·D; with MLA the
 * compressed latent and the rotary key, kv_lora_rank + qk_rope_head_dim. @return the
 * count, or FMOE_EINVAL for NULL. */
int64_t fmoe_geometry_kv_values_per_token(const fmoe_model_geometry *g);

/* Comma-separated list of the supported model_type values. */
const char *fmoe_geometry_supported_types(void);

/* Names: "f32", "f16", "bf16", "f8_e4m3", "mxfp4", "q8_0", "q4_k", "q5_k", "q6_k", "q4_0",
 * "q4_1", "q5_0", "q5_1", "iq4_nl", "q2_k", "q3_k", "iq4_xs". parse
 * accepts torch names too
 * ("float32", "bfloat16", ...). @return 0 or FMOE_EINVAL. */
const char *fmoe_dtype_name(fmoe_dtype d);
int fmoe_dtype_parse(const char *name, fmoe_dtype *out);
/* The dtype of a GGUF tensor's ggml type number (fmoe/quant.h's fmoe_ggml_type: f32, f16,
 * bf16, q8_0, q4_k, q5_k, q6_k, q4_0, q4_1, q5_0, q5_1, iq4_nl, q2_k, q3_k, iq4_xs).
 * @return 0, or FMOE_EUNSUPPORTED for another type (*out untouched). */
int fmoe_dtype_of_ggml_type(uint32_t ggml_type, fmoe_dtype *out);
/* The ggml block type of a block dtype (q8_0, the K-quants, q4_0 .. iq4_nl); 0 for the
 * others. */
uint32_t fmoe_dtype_ggml_type(fmoe_dtype d);
/* Storage size in bits per parameter; mxfp4 is 4.25 (4-bit values plus one 8-bit scale
 * per block of 32). 0 for an unknown dtype. */
double fmoe_dtype_bits(fmoe_dtype d);

/*
 * The model fingerprint of docs/design.md §4: sha256 (hex) of the canonical config.json, i.e.
 * the parsed JSON printed with object keys sorted (recursively) and no whitespace, so
 * that formatting and key order do not change it. Canonical form, exactly: the value
 * parsed by cJSON; every object's members stably sorted by key in byte order (strcmp;
 * duplicate keys keep their input order); printed by cJSON_PrintUnformatted (numbers as
 * %d when integral and within int range, else %1.15g when that reads back as the same
 * double, else %1.17g; strings with cJSON's escapes, UTF-8 passed through). Any JSON
 * value is accepted, not only objects. A test pins the digest of a fixture so that the
 * form cannot drift. @return 0, FMOE_EFORMAT (malformed JSON), FMOE_ENOMEM.
 */
int fmoe_config_fingerprint(const char *json, size_t len, char hex[65]);

#endif
