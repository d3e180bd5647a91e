/*
 * fmoe/geometry.h - the MoE geometry of a HuggingFace model, parsed from its config.json.
 *
 * Everything the rest of fmoe needs to know about a model without its weights: how many
 * decoder layers there are and which of them are MoE, routed experts J, top-k K, shared
 * experts, sizes, bytes per routed expert at a dtype, and the router's semantics.
 *
 * Families: Mixtral, Qwen2-MoE (Qwen1.5-MoE), Qwen3-MoE, OLMoE, DeepSeek-MoE V1/V2/V3,
 * Phi-3.5-MoE, gpt-oss, Llama-4. An unknown model_type is FMOE_EUNSUPPORTED with a detail
 * listing the supported ones.
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
} fmoe_family;

typedef enum fmoe_dtype {
    FMOE_DTYPE_F32 = 0,
    FMOE_DTYPE_F16 = 1,
    FMOE_DTYPE_BF16 = 2,
    FMOE_DTYPE_F8_E4M3 = 3,
    FMOE_DTYPE_MXFP4 = 4, /* 4-bit values + one 8-bit scale per 32: 4.25 bits/param */
} fmoe_dtype;

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
    int32_t intermediate_size;        /* dense FFN width (dense layers) */
    int32_t vocab_size;
    int32_t num_attention_heads;
    int32_t num_key_value_heads;
    int32_t head_dim;
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
} fmoe_model_geometry;

/*
 * Parses config.json text (`len` bytes, need not be NUL-terminated) into `out`.
 * @return 0, FMOE_EFORMAT (malformed JSON, missing or wrong-typed field: detail names it),
 *         FMOE_EUNSUPPORTED (unknown model_type: detail lists the supported ones).
 */
int fmoe_geometry_parse(const char *json, size_t len, fmoe_model_geometry *out);

/* Reads and parses a config.json file; errors name the path. */
int fmoe_geometry_load(const char *path, fmoe_model_geometry *out);

/* A geometry given by hand: L MoE layers, J experts, top-k K, hidden size h (may be 0). */
int fmoe_geometry_generic(int32_t layers, int32_t experts, int32_t top_k, int32_t hidden,
                          fmoe_model_geometry *out);

/* Bytes of one routed expert's weights stored as `dtype` (biases included where present). */
int64_t fmoe_geometry_expert_bytes(const fmoe_model_geometry *g, fmoe_dtype dtype);

/* Parameters of one routed expert (weights and biases). */
int64_t fmoe_geometry_expert_params(const fmoe_model_geometry *g);

/* Comma-separated list of the supported model_type values. */
const char *fmoe_geometry_supported_types(void);

/* Names: "f32", "f16", "bf16", "f8_e4m3", "mxfp4". parse accepts torch names too
 * ("float32", "bfloat16", ...). @return 0 or FMOE_EINVAL. */
const char *fmoe_dtype_name(fmoe_dtype d);
int fmoe_dtype_parse(const char *name, fmoe_dtype *out);
/* Storage size in bits per parameter (mxfp4: 4.25 rounded per block, reported as 4). */
double fmoe_dtype_bits(fmoe_dtype d);

/*
 * The model fingerprint of DESIGN.md §4: sha256 (hex) of the canonical config.json, i.e.
 * the parsed JSON printed with object keys sorted (recursively) and no whitespace, so
 * that formatting and key order do not change it.
 */
int fmoe_config_fingerprint(const char *json, size_t len, char hex[65]);

#endif
