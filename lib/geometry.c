/*
 * geometry.c - the MoE geometry of a HuggingFace model, from its config.json.
 *
 * Design. One table, `families[]`, names every supported model_type with the keys its
 * transformers configuration uses for the expert count, top-k and expert width, the
 * defaults transformers gives the keys we treat as optional, and the family's parser.
 * parse_config() reads the keys every family shares, then calls the parser for the three
 * things that differ: which decoder layers are MoE, the shared experts, and the router.
 * Each parser cites the code it follows. Where transformers and the model authors' remote
 * code disagree we say which we took. A new family is one parser and one row.
 *
 * The model fingerprint of a config.json (fmoe_config_fingerprint) is in fingerprint.c.
 *
 * Required keys. transformers has a default for every key, but the five that define the
 * expert geometry (num_hidden_layers, hidden_size, expert count, top-k, expert width)
 * are required here: a config without them is almost never the model its user thinks,
 * and a silent Qwen1.5 default in a trace header would be wrong for years. Everything
 * else takes the family's transformers default. JSON null counts as absent, as it does
 * for transformers' keyword arguments.
 *
 * Routers, in the vocabulary of fmoe_model_geometry:
 *   mixtral      softmax over all J, top-k, renormalised (= softmax of the top-k logits)
 *   qwen2_moe    softmax, top-k, renormalised iff norm_topk_prob (default false);
 *                plus one always-on shared expert scaled by a sigmoid gate
 *   qwen3_moe    as qwen2_moe without the shared expert (norm_topk_prob default false)
 *   olmoe        softmax, top-k, norm_topk_prob default false
 *   deepseek     (V1, remote code) softmax, top-k, norm_topk_prob default false
 *   deepseek_v2  softmax; "greedy" or "group_limited_greedy" selection; weights times
 *                routed_scaling_factor
 *   deepseek_v3  sigmoid scores; "noaux_tc": groups ranked by their two best scores (plus a
 *                learned bias used only for selection), top-k within topk_group groups,
 *                renormalised iff norm_topk_prob (default true), times routed_scaling_factor
 *   phimoe       "sparsemixer": each of the top-2 weights is a softmax over the logits
 *                within a jitter threshold of that expert's logit; recorded as softmax,
 *                not renormalised
 *   gpt_oss      top-k of the logits (router has a bias), softmax over those k
 *   llama4       top-k of the logits, sigmoid of each chosen logit, not renormalised;
 *                plus one shared expert
 *   glm4_moe     DeepSeek-V3's noaux_tc (sigmoid, e_score_correction_bias, groups by their
 *                two best; the published configs have one group), renormalised iff
 *                norm_topk_prob (default true), times routed_scaling_factor
 */
#include "fmoe/geometry.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "fmoe/error.h"
#include "files.h"
#include "fmoe/gguf.h"
#include "fmoe/quant.h"

#include "geometry_impl.h"

/* Widths beyond this are not a real model and would overflow 64-bit byte counts. */
#define MAX_WIDTH (1 << 24)
/* Trace files store expert ids as uint16. */
#define MAX_EXPERTS 65536
/* config.json files are a few KB; this bounds what fmoe_geometry_load reads. */
#define MAX_CONFIG_BYTES (64 << 20)

/* ---------------------------------------------------------------------------------- */
/* Typed reads from a config object                                                   */
/* ---------------------------------------------------------------------------------- */

/*
 * Keys are looked up in `obj`, then in `outer` when given (llama4: text_config first, the
 * top-level config second). `prefix` makes error details name the key as the user sees
 * it ("text_config.num_local_experts").
 */
typedef struct reader {
    const cJSON *obj;
    const cJSON *outer;
    const char *prefix;
} reader;

/* The item for `key`, or NULL when absent or null. */
static const cJSON *lookup(const reader *r, const char *key) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(r->obj, key);
    if ((!it || cJSON_IsNull(it)) && r->outer)
        it = cJSON_GetObjectItemCaseSensitive(r->outer, key);
    return (it && !cJSON_IsNull(it)) ? it : NULL;
}

static const char *json_type_name(const cJSON *it) {
    if (cJSON_IsBool(it)) return "a boolean";
    if (cJSON_IsNumber(it)) return "a number";
    if (cJSON_IsString(it)) return "a string";
    if (cJSON_IsArray(it)) return "an array";
    if (cJSON_IsObject(it)) return "an object";
    if (cJSON_IsNull(it)) return "null";
    return "invalid";
}

/* An integral JSON number within [lo, hi]; `key` names the value in errors. */
static int as_int64(const reader *r, const char *key, const cJSON *it, int64_t lo, int64_t hi,
                    int64_t *out) {
    if (!cJSON_IsNumber(it))
        return fmoe_error_set(FMOE_EFORMAT, "%s%s must be an integer, not %s", r->prefix, key,
                              json_type_name(it));
    double d = it->valuedouble;
    if (!isfinite(d) || d != floor(d))
        return fmoe_error_set(FMOE_EFORMAT, "%s%s must be an integer, not %g", r->prefix, key,
                              d);
    if (d < (double)lo || d > (double)hi)
        return fmoe_error_set(FMOE_ERANGE, "%s%s = %.0f is out of range [%lld, %lld]",
                              r->prefix, key, d, (long long)lo, (long long)hi);
    *out = (int64_t)d;
    return 0;
}

static int read_i64(const reader *r, const char *key, int required, int64_t def, int64_t lo,
                    int64_t hi, int64_t *out) {
    const cJSON *it = lookup(r, key);
    if (!it) {
        if (required) return fmoe_error_set(FMOE_EFORMAT, "missing key %s%s", r->prefix, key);
        *out = def;
        return 0;
    }
    return as_int64(r, key, it, lo, hi, out);
}

static int read_i32(const reader *r, const char *key, int required, int32_t def, int32_t lo,
                    int32_t hi, int32_t *out) {
    int64_t v;
    FMOE_FORWARD_IF_ERROR(read_i64(r, key, required, def, lo, hi, &v));
    *out = (int32_t)v;
    return 0;
}

static int read_double(const reader *r, const char *key, double def, double *out) {
    const cJSON *it = lookup(r, key);
    if (!it) {
        *out = def;
        return 0;
    }
    if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble))
        return fmoe_error_set(FMOE_EFORMAT, "%s%s must be a number, not %s", r->prefix, key,
                              json_type_name(it));
    *out = it->valuedouble;
    return 0;
}

static int read_bool(const reader *r, const char *key, int def, int32_t *out) {
    const cJSON *it = lookup(r, key);
    if (!it) {
        *out = def;
        return 0;
    }
    if (!cJSON_IsBool(it))
        return fmoe_error_set(FMOE_EFORMAT, "%s%s must be a boolean, not %s", r->prefix, key,
                              json_type_name(it));
    *out = cJSON_IsTrue(it) ? 1 : 0;
    return 0;
}

/* A string value, or `def` when absent; the result points into the cJSON tree. */
static int read_string(const reader *r, const char *key, const char *def, const char **out) {
    const cJSON *it = lookup(r, key);
    if (!it) {
        *out = def;
        return 0;
    }
    if (!cJSON_IsString(it))
        return fmoe_error_set(FMOE_EFORMAT, "%s%s must be a string, not %s", r->prefix, key,
                              json_type_name(it));
    *out = it->valuestring;
    return 0;
}

static void copy_string(char *dst, size_t cap, const char *src) {
    snprintf(dst, cap, "%s", src ? src : "");
}

/* ---------------------------------------------------------------------------------- */
/* Dtypes                                                                             */
/* ---------------------------------------------------------------------------------- */

const char *fmoe_dtype_name(fmoe_dtype d) {
    switch (d) {
    case FMOE_DTYPE_F32: return "f32";
    case FMOE_DTYPE_F16: return "f16";
    case FMOE_DTYPE_BF16: return "bf16";
    case FMOE_DTYPE_F8_E4M3: return "f8_e4m3";
    case FMOE_DTYPE_MXFP4: return "mxfp4";
    case FMOE_DTYPE_Q8_0: return "q8_0";
    case FMOE_DTYPE_Q4_K: return "q4_k";
    case FMOE_DTYPE_Q5_K: return "q5_k";
    case FMOE_DTYPE_Q6_K: return "q6_k";
    case FMOE_DTYPE_Q4_0: return "q4_0";
    case FMOE_DTYPE_Q4_1: return "q4_1";
    case FMOE_DTYPE_Q5_0: return "q5_0";
    case FMOE_DTYPE_Q5_1: return "q5_1";
    case FMOE_DTYPE_IQ4_NL: return "iq4_nl";
    case FMOE_DTYPE_Q2_K: return "q2_k";
    case FMOE_DTYPE_Q3_K: return "q3_k";
    case FMOE_DTYPE_IQ4_XS: return "iq4_xs";
    case FMOE_DTYPE_IQ2_XXS: return "iq2_xxs";
    case FMOE_DTYPE_IQ2_XS: return "iq2_xs";
    case FMOE_DTYPE_IQ2_S: return "iq2_s";
    case FMOE_DTYPE_IQ3_XXS: return "iq3_xxs";
    case FMOE_DTYPE_IQ3_S: return "iq3_s";
    case FMOE_DTYPE_IQ1_S: return "iq1_s";
    case FMOE_DTYPE_IQ1_M: return "iq1_m";
    }
    return "unknown";
}

int fmoe_dtype_parse(const char *name, fmoe_dtype *out) {
    static const struct {
        const char *name;
        fmoe_dtype dtype;
    } names[] = {
        {"f32", FMOE_DTYPE_F32},         {"float32", FMOE_DTYPE_F32},
        {"fp32", FMOE_DTYPE_F32},        {"float", FMOE_DTYPE_F32},
        {"f16", FMOE_DTYPE_F16},         {"float16", FMOE_DTYPE_F16},
        {"fp16", FMOE_DTYPE_F16},        {"half", FMOE_DTYPE_F16},
        {"bf16", FMOE_DTYPE_BF16},       {"bfloat16", FMOE_DTYPE_BF16},
        {"f8_e4m3", FMOE_DTYPE_F8_E4M3}, {"float8_e4m3fn", FMOE_DTYPE_F8_E4M3},
        {"fp8", FMOE_DTYPE_F8_E4M3},     {"e4m3", FMOE_DTYPE_F8_E4M3},
        {"f8e4m3", FMOE_DTYPE_F8_E4M3},  {"mxfp4", FMOE_DTYPE_MXFP4},
        {"q8_0", FMOE_DTYPE_Q8_0},       {"q4_k", FMOE_DTYPE_Q4_K},
        {"q5_k", FMOE_DTYPE_Q5_K},       {"q6_k", FMOE_DTYPE_Q6_K},
        {"q4_0", FMOE_DTYPE_Q4_0},       {"q4_1", FMOE_DTYPE_Q4_1},
        {"q5_0", FMOE_DTYPE_Q5_0},       {"q5_1", FMOE_DTYPE_Q5_1},
        {"iq4_nl", FMOE_DTYPE_IQ4_NL},   {"q2_k", FMOE_DTYPE_Q2_K},
        {"q3_k", FMOE_DTYPE_Q3_K},       {"iq4_xs", FMOE_DTYPE_IQ4_XS},
        {"iq2_xxs", FMOE_DTYPE_IQ2_XXS}, {"iq2_xs", FMOE_DTYPE_IQ2_XS},
        {"iq2_s", FMOE_DTYPE_IQ2_S},     {"iq3_xxs", FMOE_DTYPE_IQ3_XXS},
        {"iq3_s", FMOE_DTYPE_IQ3_S},     {"iq1_s", FMOE_DTYPE_IQ1_S},
        {"iq1_m", FMOE_DTYPE_IQ1_M},
    };
    if (!name || !out) return fmoe_error_set(FMOE_EINVAL, "dtype name is NULL");
    const char *n = name;
    if (strncmp(n, "torch.", 6) == 0) n += 6;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (strcasecmp(n, names[i].name) == 0) {
            *out = names[i].dtype;
            return 0;
        }
    }
    return fmoe_error_set(FMOE_EINVAL,
                          "unknown dtype \"%.64s\" (expected f32, f16, bf16, f8_e4m3, mxfp4, "
                          "q8_0, q4_k, q5_k, q6_k, q4_0, q4_1, q5_0, q5_1, iq4_nl, q2_k, q3_k, "
                          "iq4_xs, iq2_xxs, iq2_xs, iq2_s, iq3_xxs, iq3_s, iq1_s, iq1_m)",
                          name);
}

int fmoe_dtype_of_ggml_type(uint32_t ggml_type, fmoe_dtype *out) {
    switch (ggml_type) {
    case FMOE_GGML_F32: *out = FMOE_DTYPE_F32; return 0;
    case FMOE_GGML_F16: *out = FMOE_DTYPE_F16; return 0;
    case FMOE_GGML_BF16: *out = FMOE_DTYPE_BF16; return 0;
    case FMOE_GGML_Q8_0: *out = FMOE_DTYPE_Q8_0; return 0;
    case FMOE_GGML_Q4_K: *out = FMOE_DTYPE_Q4_K; return 0;
    case FMOE_GGML_Q5_K: *out = FMOE_DTYPE_Q5_K; return 0;
    case FMOE_GGML_Q6_K: *out = FMOE_DTYPE_Q6_K; return 0;
    case FMOE_GGML_Q4_0: *out = FMOE_DTYPE_Q4_0; return 0;
    case FMOE_GGML_Q4_1: *out = FMOE_DTYPE_Q4_1; return 0;
    case FMOE_GGML_Q5_0: *out = FMOE_DTYPE_Q5_0; return 0;
    case FMOE_GGML_Q5_1: *out = FMOE_DTYPE_Q5_1; return 0;
    case FMOE_GGML_IQ4_NL: *out = FMOE_DTYPE_IQ4_NL; return 0;
    case FMOE_GGML_Q2_K: *out = FMOE_DTYPE_Q2_K; return 0;
    case FMOE_GGML_Q3_K: *out = FMOE_DTYPE_Q3_K; return 0;
    case FMOE_GGML_IQ4_XS: *out = FMOE_DTYPE_IQ4_XS; return 0;
    case FMOE_GGML_IQ2_XXS: *out = FMOE_DTYPE_IQ2_XXS; return 0;
    case FMOE_GGML_IQ2_XS: *out = FMOE_DTYPE_IQ2_XS; return 0;
    case FMOE_GGML_IQ2_S: *out = FMOE_DTYPE_IQ2_S; return 0;
    case FMOE_GGML_IQ3_XXS: *out = FMOE_DTYPE_IQ3_XXS; return 0;
    case FMOE_GGML_IQ3_S: *out = FMOE_DTYPE_IQ3_S; return 0;
    case FMOE_GGML_IQ1_S: *out = FMOE_DTYPE_IQ1_S; return 0;
    case FMOE_GGML_IQ1_M: *out = FMOE_DTYPE_IQ1_M; return 0;
    case FMOE_GGML_MXFP4: *out = FMOE_DTYPE_MXFP4; return 0;
    default: return FMOE_EUNSUPPORTED;
    }
}

uint32_t fmoe_dtype_ggml_type(fmoe_dtype d) {
    switch (d) {
    case FMOE_DTYPE_Q8_0: return FMOE_GGML_Q8_0;
    case FMOE_DTYPE_Q4_K: return FMOE_GGML_Q4_K;
    case FMOE_DTYPE_Q5_K: return FMOE_GGML_Q5_K;
    case FMOE_DTYPE_Q6_K: return FMOE_GGML_Q6_K;
    case FMOE_DTYPE_Q4_0: return FMOE_GGML_Q4_0;
    case FMOE_DTYPE_Q4_1: return FMOE_GGML_Q4_1;
    case FMOE_DTYPE_Q5_0: return FMOE_GGML_Q5_0;
    case FMOE_DTYPE_Q5_1: return FMOE_GGML_Q5_1;
    case FMOE_DTYPE_IQ4_NL: return FMOE_GGML_IQ4_NL;
    case FMOE_DTYPE_Q2_K: return FMOE_GGML_Q2_K;
    case FMOE_DTYPE_Q3_K: return FMOE_GGML_Q3_K;
    case FMOE_DTYPE_IQ4_XS: return FMOE_GGML_IQ4_XS;
    case FMOE_DTYPE_IQ2_XXS: return FMOE_GGML_IQ2_XXS;
    case FMOE_DTYPE_IQ2_XS: return FMOE_GGML_IQ2_XS;
    case FMOE_DTYPE_IQ2_S: return FMOE_GGML_IQ2_S;
    case FMOE_DTYPE_IQ3_XXS: return FMOE_GGML_IQ3_XXS;
    case FMOE_DTYPE_IQ3_S: return FMOE_GGML_IQ3_S;
    case FMOE_DTYPE_IQ1_S: return FMOE_GGML_IQ1_S;
    case FMOE_DTYPE_IQ1_M: return FMOE_GGML_IQ1_M;
    default: return 0; /* F32 is ggml type 0 too: callers ask only for block dtypes */
    }
}

double fmoe_dtype_bits(fmoe_dtype d) {
    switch (d) {
    case FMOE_DTYPE_F32: return 32.0;
    case FMOE_DTYPE_F16: return 16.0;
    case FMOE_DTYPE_BF16: return 16.0;
    case FMOE_DTYPE_F8_E4M3: return 8.0;
    case FMOE_DTYPE_MXFP4: return 4.25;
    case FMOE_DTYPE_Q8_0: return 8.5;
    case FMOE_DTYPE_Q4_K: return 4.5;
    case FMOE_DTYPE_Q5_K: return 5.5;
    case FMOE_DTYPE_Q6_K: return 6.5625;
    case FMOE_DTYPE_Q4_0: return 4.5;
    case FMOE_DTYPE_Q4_1: return 5.0;
    case FMOE_DTYPE_Q5_0: return 5.5;
    case FMOE_DTYPE_Q5_1: return 6.0;
    case FMOE_DTYPE_IQ4_NL: return 4.5;
    case FMOE_DTYPE_Q2_K: return 2.625;
    case FMOE_DTYPE_Q3_K: return 3.4375;
    case FMOE_DTYPE_IQ4_XS: return 4.25;
    case FMOE_DTYPE_IQ2_XXS: return 2.0625;
    case FMOE_DTYPE_IQ2_XS: return 2.3125;
    case FMOE_DTYPE_IQ2_S: return 2.5625;
    case FMOE_DTYPE_IQ3_XXS: return 3.0625;
    case FMOE_DTYPE_IQ3_S: return 3.4375;
    case FMOE_DTYPE_IQ1_S: return 1.5625;
    case FMOE_DTYPE_IQ1_M: return 1.75;
    }
    return 0.0;
}

/* ---------------------------------------------------------------------------------- */
/* Expert sizes                                                                       */
/* ---------------------------------------------------------------------------------- */

int64_t fmoe_geometry_expert_params(const fmoe_model_geometry *g) {
    if (!g) return fmoe_error_set(FMOE_EINVAL, "geometry is NULL");
    int64_t h = g->hidden_size, I = g->moe_intermediate_size;
    int64_t p = 3 * h * I; /* gate [I,h], up [I,h], down [h,I] */
    if (g->expert_has_bias) p += 2 * I + h;
    return p;
}

int64_t fmoe_geometry_attention_params(const fmoe_model_geometry *g) {
    if (!g) return fmoe_error_set(FMOE_EINVAL, "geometry is NULL");
    const int64_t h = g->hidden_size, H = g->num_attention_heads > 0 ? g->num_attention_heads : 1;
    if (g->kv_lora_rank > 0) {
        /* MLA ("DeepSeek-V2" §2.1): q_a + its norm + q_b (or q_proj), kv_a_proj_with_mqa +
         * its norm, kv_b, o. */
        const int64_t dn = g->qk_nope_head_dim, dr = g->qk_rope_head_dim, dv = g->v_head_dim;
        const int64_t r = g->kv_lora_rank, rq = g->q_lora_rank;
        const int64_t q = rq > 0 ? rq * h + rq + H * (dn + dr) * rq : H * (dn + dr) * h;
        return q + (r + dr) * h + r + H * (dn + dv) * r + h * H * dv;
    }
    const int64_t hd = g->head_dim > 0 ? g->head_dim : h / H;
    const int64_t kv = g->num_key_value_heads > 0 ? g->num_key_value_heads : H;
    return h * H * hd + 2 * h * kv * hd + H * hd * h;
}

int64_t fmoe_geometry_kv_values_per_token(const fmoe_model_geometry *g) {
    if (!g) return fmoe_error_set(FMOE_EINVAL, "geometry is NULL");
    if (g->kv_lora_rank > 0) return (int64_t)g->kv_lora_rank + g->qk_rope_head_dim;
    const int64_t h = g->hidden_size, H = g->num_attention_heads > 0 ? g->num_attention_heads : 1;
    const int64_t hd = g->head_dim > 0 ? g->head_dim : h / H;
    const int64_t kv = g->num_key_value_heads > 0 ? g->num_key_value_heads : H;
    return 2 * kv * hd;
}

int64_t fmoe_geometry_expert_bytes(const fmoe_model_geometry *g, fmoe_dtype dtype) {
    if (!g) return fmoe_error_set(FMOE_EINVAL, "geometry is NULL");
    int64_t h = g->hidden_size, I = g->moe_intermediate_size;
    int64_t weights = 3 * h * I;
    int64_t biases = g->expert_has_bias ? 2 * I + h : 0;
    switch (dtype) {
    case FMOE_DTYPE_F32: return (weights + biases) * 4;
    case FMOE_DTYPE_F16:
    case FMOE_DTYPE_BF16: return (weights + biases) * 2;
    case FMOE_DTYPE_F8_E4M3: return weights + biases * 2;
    case FMOE_DTYPE_MXFP4: {
        /* Blocks of 32 run along each projection's input dimension, as in gpt-oss's
         * *_blocks [E, rows, cols/32, 16] and *_scales [E, rows, cols/32] tensors. */
        int64_t blocks = 2 * I * ((h + 31) / 32) + h * ((I + 31) / 32);
        return blocks * 17 + biases * 2;
    }
    case FMOE_DTYPE_Q8_0:
    case FMOE_DTYPE_Q4_K:
    case FMOE_DTYPE_Q5_K:
    case FMOE_DTYPE_Q6_K:
    case FMOE_DTYPE_Q4_0:
    case FMOE_DTYPE_Q4_1:
    case FMOE_DTYPE_Q5_0:
    case FMOE_DTYPE_Q5_1:
    case FMOE_DTYPE_IQ4_NL:
    case FMOE_DTYPE_Q2_K:
    case FMOE_DTYPE_Q3_K:
    case FMOE_DTYPE_IQ4_XS:
    case FMOE_DTYPE_IQ2_XXS:
    case FMOE_DTYPE_IQ2_XS:
    case FMOE_DTYPE_IQ2_S:
    case FMOE_DTYPE_IQ3_XXS:
    case FMOE_DTYPE_IQ3_S:
    case FMOE_DTYPE_IQ1_S:
    case FMOE_DTYPE_IQ1_M:
    {
        /* ggml's blocks along each row's input dimension (fmoe/quant.h) */
        const uint32_t q = fmoe_dtype_ggml_type(dtype);
        const int64_t bs = fmoe_ggml_block_size(q), ts = fmoe_ggml_type_size(q);
        int64_t blocks = 2 * I * ((h + bs - 1) / bs) + h * ((I + bs - 1) / bs);
        return blocks * ts + biases * 2;
    }
    }
    return fmoe_error_set(FMOE_EINVAL, "unknown dtype %d", (int)dtype);
}

/* ---------------------------------------------------------------------------------- */
/* Parsing                                                                            */
/* ---------------------------------------------------------------------------------- */

/* Parses `len` bytes into a cJSON tree; a malformed input fails with the byte offset,
 * line and column of the error. */
int fmoe__config_json_parse(const char *json, size_t len, cJSON **out) {
    if (!json && len) return fmoe_error_set(FMOE_EINVAL, "JSON text is NULL");
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json ? json : "", len, &end, 0);
    size_t off = len;
    if (root) {
        /* Anything but whitespace after the value is an error, as for json.loads. */
        off = (size_t)(end - json);
        while (off < len && (json[off] == ' ' || json[off] == '\t' || json[off] == '\n' ||
                             json[off] == '\r'))
            off++;
        if (off == len) {
            *out = root;
            return 0;
        }
        cJSON_Delete(root);
    } else if (end && json && end >= json && (size_t)(end - json) <= len) {
        off = (size_t)(end - json);
    }
    if (len == 0) return fmoe_error_set(FMOE_EFORMAT, "malformed JSON: empty input");
    size_t line = 1, col = 1;
    for (size_t i = 0; i < off && i < len; i++) {
        if (json[i] == '\n') {
            line++;
            col = 1;
        } else {
            col++;
        }
    }
    return fmoe_error_set(FMOE_EFORMAT, "malformed JSON near byte %zu (line %zu, column %zu)",
                          off, line, col);
}

/* The checkpoint dtype: torch_dtype, or "dtype" as transformers >= 4.56 writes it. */
static int read_dtype(const reader *r, fmoe_dtype *out) {
    const char *name = NULL;
    FMOE_FORWARD_IF_ERROR(read_string(r, "torch_dtype", NULL, &name));
    if (!name) FMOE_FORWARD_IF_ERROR(read_string(r, "dtype", NULL, &name));
    if (!name) {
        *out = FMOE_DTYPE_BF16;
        return 0;
    }
    int rc = fmoe_dtype_parse(name, out);
    if (rc < 0)
        return fmoe_error_set(FMOE_EFORMAT,
                              "%storch_dtype \"%.64s\" is not one of float32, float16, "
                              "bfloat16",
                              r->prefix, name);
    return 0;
}

/*
 * quantization_config: mxfp4 (gpt-oss: experts quantised, attention and router not) and
 * fp8 with e4m3 values (DeepSeek V3/R1) change how experts are stored. Other methods
 * (awq, gptq, bitsandbytes, ...) are recorded in quant_method but not modelled: their
 * expert_dtype stays the torch_dtype.
 */
static int read_quantization(const cJSON *root, fmoe_model_geometry *g) {
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(root, "quantization_config");
    g->expert_dtype = g->dtype;
    g->quant_method[0] = '\0';
    if (!q || cJSON_IsNull(q)) return 0;
    if (!cJSON_IsObject(q))
        return fmoe_error_set(FMOE_EFORMAT, "quantization_config must be an object, not %s",
                              json_type_name(q));
    reader qr = {q, NULL, "quantization_config."};
    const char *method = NULL, *fmt = NULL;
    FMOE_FORWARD_IF_ERROR(read_string(&qr, "quant_method", NULL, &method));
    FMOE_FORWARD_IF_ERROR(read_string(&qr, "fmt", NULL, &fmt));
    if (!method) return 0;
    copy_string(g->quant_method, sizeof g->quant_method, method);
    if (strcmp(method, "mxfp4") == 0) {
        g->expert_dtype = FMOE_DTYPE_MXFP4;
    } else if (strcmp(method, "fp8") == 0 && (!fmt || strcmp(fmt, "e4m3") == 0)) {
        g->expert_dtype = FMOE_DTYPE_F8_E4M3;
    }
    return 0;
}

/* Reads a list of layer indices into `mark` (1 per listed layer < n); entries outside
 * [0, n) are ignored, as transformers only tests membership. */
static int read_layer_list(const reader *r, const char *key, int32_t n, uint8_t *mark,
                           int *present) {
    const cJSON *list = lookup(r, key);
    *present = list != NULL;
    if (!list) return 0;
    if (!cJSON_IsArray(list))
        return fmoe_error_set(FMOE_EFORMAT, "%s%s must be an array of layer indices, not %s",
                              r->prefix, key, json_type_name(list));
    const cJSON *it;
    cJSON_ArrayForEach(it, list) {
        int64_t idx;
        FMOE_FORWARD_IF_ERROR(as_int64(r, key, it, INT32_MIN, INT32_MAX, &idx));
        if (idx >= 0 && idx < n) mark[idx] = 1;
    }
    return 0;
}

/* Validates grouped routing: J splits into n_group equal groups, topk_group of them are
 * kept, and they hold at least K experts. */
static int check_groups(const reader *r, const fmoe_model_geometry *g) {
    FMOE_RETURN_ERROR_IF(g->num_experts % g->n_group != 0, FMOE_ERANGE,
                         "%sn_group = %d does not divide %d routed experts", r->prefix,
                         g->n_group, g->num_experts);
    FMOE_RETURN_ERROR_IF(g->topk_group > g->n_group, FMOE_ERANGE,
                         "%stopk_group = %d exceeds n_group = %d", r->prefix, g->topk_group,
                         g->n_group);
    FMOE_RETURN_ERROR_IF((int64_t)g->topk_group * (g->num_experts / g->n_group) < g->top_k,
                         FMOE_ERANGE,
                         "%stopk_group = %d groups of %d experts cannot hold top-k = %d",
                         r->prefix, g->topk_group, g->num_experts / g->n_group, g->top_k);
    return 0;
}

/* Reads the DeepSeek MLA dimensions (absent keys: 0). */
static int read_mla(const reader *r, fmoe_model_geometry *g) {
    FMOE_FORWARD_IF_ERROR(read_i32(r, "q_lora_rank", 0, 0, 0, MAX_WIDTH, &g->q_lora_rank));
    FMOE_FORWARD_IF_ERROR(read_i32(r, "kv_lora_rank", 0, 0, 0, MAX_WIDTH, &g->kv_lora_rank));
    FMOE_FORWARD_IF_ERROR(
        read_i32(r, "qk_nope_head_dim", 0, 0, 0, MAX_WIDTH, &g->qk_nope_head_dim));
    FMOE_FORWARD_IF_ERROR(
        read_i32(r, "qk_rope_head_dim", 0, 0, 0, MAX_WIDTH, &g->qk_rope_head_dim));
    FMOE_FORWARD_IF_ERROR(read_i32(r, "v_head_dim", 0, 0, 0, MAX_WIDTH, &g->v_head_dim));
    return 0;
}

/* ---------------------------------------------------------------------------------- */
/* The families: which layers are MoE, the shared experts, the router                 */
/* ---------------------------------------------------------------------------------- */

/*
 * A family's parser reads what only that family has, after the keys every family shares
 * (parse_config). It marks in `moe` ([num_hidden_layers], zeroed) the decoder layers that
 * are MoE and may override the router defaults parse_config set. Each cites the code it
 * follows.
 */
typedef int (*family_parser)(const reader *r, fmoe_model_geometry *g, uint8_t *moe);

/* modeling_mixtral: every layer is sparse; MixtralSparseMoeBlock softmaxes the logits,
 * takes the top-k and divides by their sum (always). */
static int parse_mixtral(const reader *r, fmoe_model_geometry *g, uint8_t *moe) {
    (void)r;
    memset(moe, 1, (size_t)g->num_hidden_layers);
    g->norm_topk_prob = 1;
    return 0;
}

/* modeling_qwen2_moe / qwen3_moe decoder layer: sparse iff
 *   layer not in mlp_only_layers and num_experts > 0
 *   and (layer + 1) % decoder_sparse_step == 0.
 * `dense_width` is transformers' default intermediate_size (the dense layers' width). */
static int read_qwen_moe(const reader *r, fmoe_model_geometry *g, uint8_t *moe,
                         int32_t dense_width) {
    const int32_t n = g->num_hidden_layers;
    int32_t step;
    FMOE_FORWARD_IF_ERROR(read_i32(r, "decoder_sparse_step", 0, 1, 1, INT32_MAX, &step));
    uint8_t mlp_only[FMOE_MAX_LAYERS] = {0};
    int present;
    FMOE_FORWARD_IF_ERROR(read_layer_list(r, "mlp_only_layers", n, mlp_only, &present));
    for (int32_t i = 0; i < n; i++) moe[i] = !mlp_only[i] && (i + 1) % step == 0;
    FMOE_FORWARD_IF_ERROR(read_bool(r, "norm_topk_prob", 0, &g->norm_topk_prob));
    FMOE_FORWARD_IF_ERROR(read_i32(r, "intermediate_size", 0, dense_width, 0, MAX_WIDTH,
                                   &g->intermediate_size));
    return 0;
}

/* Qwen2MoeSparseMoeBlock adds one shared expert of shared_expert_intermediate_size,
 * gated by sigmoid(shared_expert_gate(x)). */
static int parse_qwen2_moe(const reader *r, fmoe_model_geometry *g, uint8_t *moe) {
    FMOE_FORWARD_IF_ERROR(read_qwen_moe(r, g, moe, 5632));
    FMOE_FORWARD_IF_ERROR(read_i32(r, "shared_expert_intermediate_size", 0, 5632, 0,
                                   MAX_WIDTH, &g->shared_intermediate_size));
    g->num_shared_experts = g->shared_intermediate_size > 0 ? 1 : 0;
    return 0;
}

static int parse_qwen3_moe(const reader *r, fmoe_model_geometry *g, uint8_t *moe) {
    return read_qwen_moe(r, g, moe, 6144);
}

/* modeling_olmoe: every layer sparse; softmax, top-k, optional renormalisation. */
static int parse_olmoe(const reader *r, fmoe_model_geometry *g, uint8_t *moe) {
    memset(moe, 1, (size_t)g->num_hidden_layers);
    return read_bool(r, "norm_topk_prob", 0, &g->norm_topk_prob);
}

/* What a DeepSeek version assumes for an absent key: the authors' code for V1,
 * transformers' deepseek_v2 and deepseek_v3 for the others. */
typedef struct deepseek_defaults {
    int32_t first_k_dense_replace;
    int32_t n_shared_experts; /* V1: none in the authors' code */
    int32_t intermediate_size;
    int32_t norm_topk_prob;
    const char *scoring_func; /* V3: sigmoid (transformers hard-codes it; the authors' code
                               * refuses anything else) */
    /* The router's keys, read for V2 and V3 only. */
    double routed_scaling_factor;
    const char *topk_method;
    int32_t n_group;
    int32_t topk_group;
} deepseek_defaults;

static const deepseek_defaults deepseek_v1 = {0, 0, 11008, 0, "softmax", 1.0, "greedy", 1, 1};
static const deepseek_defaults deepseek_v2 = {0, 2, 11008, 0, "softmax", 1.0, "greedy", 1, 1};
static const deepseek_defaults deepseek_v3 = {3, 1, 18432, 1, "sigmoid", 2.5, "noaux_tc", 8, 4};

/* The authors' modeling_deepseek.py (V1, V2, V3 alike): a layer is MoE iff
 *   layer >= first_k_dense_replace and layer % moe_layer_freq == 0.
 * transformers' deepseek_v2/v3 ignore moe_layer_freq; every published checkpoint has
 * moe_layer_freq = 1, where the two agree. Shared experts are one MLP of width
 * n_shared_experts * moe_intermediate_size. */
static int read_deepseek_moe(const reader *r, fmoe_model_geometry *g, uint8_t *moe,
                             const deepseek_defaults *d) {
    const int32_t n = g->num_hidden_layers;
    int32_t first_dense, freq, shared;
    FMOE_FORWARD_IF_ERROR(read_i32(r, "first_k_dense_replace", 0, d->first_k_dense_replace,
                                   0, INT32_MAX, &first_dense));
    FMOE_FORWARD_IF_ERROR(read_i32(r, "moe_layer_freq", 0, 1, 1, INT32_MAX, &freq));
    for (int32_t i = 0; i < n; i++) moe[i] = i >= first_dense && i % freq == 0;
    FMOE_FORWARD_IF_ERROR(
        read_i32(r, "n_shared_experts", 0, d->n_shared_experts, 0, MAX_EXPERTS, &shared));
    g->num_shared_experts = shared;
    g->shared_intermediate_size = shared * g->moe_intermediate_size;
    FMOE_FORWARD_IF_ERROR(read_i32(r, "intermediate_size", 0, d->intermediate_size, 0,
                                   MAX_WIDTH, &g->intermediate_size));
    FMOE_FORWARD_IF_ERROR(read_bool(r, "norm_topk_prob", d->norm_topk_prob, &g->norm_topk_prob));

    const char *scoring;
    FMOE_FORWARD_IF_ERROR(read_string(r, "scoring_func", d->scoring_func, &scoring));
    if (strcmp(scoring, "softmax") == 0)
        g->scoring = FMOE_ROUTER_SOFTMAX;
    else if (strcmp(scoring, "sigmoid") == 0)
        g->scoring = FMOE_ROUTER_SIGMOID;
    else
        return fmoe_error_set(FMOE_EUNSUPPORTED,
                              "%sscoring_func \"%.32s\" (supported: softmax, sigmoid)",
                              r->prefix, scoring);
    return 0;
}

/* V2 and V3: MLA attention, the routed scaling factor and the top-k method with its
 * groups. */
static int read_deepseek_router(const reader *r, fmoe_model_geometry *g,
                                const deepseek_defaults *d) {
    FMOE_FORWARD_IF_ERROR(read_mla(r, g));
    FMOE_FORWARD_IF_ERROR(read_double(r, "routed_scaling_factor", d->routed_scaling_factor,
                                      &g->routed_scaling_factor));
    const char *method;
    FMOE_FORWARD_IF_ERROR(read_string(r, "topk_method", d->topk_method, &method));
    if (strcmp(method, "greedy") != 0 && strcmp(method, "group_limited_greedy") != 0 &&
        strcmp(method, "noaux_tc") != 0)
        return fmoe_error_set(FMOE_EUNSUPPORTED,
                              "%stopk_method \"%.32s\" (supported: greedy, "
                              "group_limited_greedy, noaux_tc)",
                              r->prefix, method);
    copy_string(g->topk_method, sizeof g->topk_method, method);
    /* Groups matter only to the grouped methods; plain greedy ignores n_group (V2-Lite
     * writes n_group 1), so it is recorded as ungrouped. */
    if (strcmp(method, "greedy") != 0) {
        FMOE_FORWARD_IF_ERROR(
            read_i32(r, "n_group", 0, d->n_group, 1, MAX_EXPERTS, &g->n_group));
        FMOE_FORWARD_IF_ERROR(
            read_i32(r, "topk_group", 0, d->topk_group, 1, MAX_EXPERTS, &g->topk_group));
        FMOE_FORWARD_IF_ERROR(check_groups(r, g));
    }
    /* A query/key head is qk_nope + qk_rope wide. transformers >= 5 writes "head_dim" as
     * qk_rope_head_dim (the width its rotary embedding reads), so that key does not say
     * the head width here. */
    if (g->qk_nope_head_dim + g->qk_rope_head_dim > 0)
        g->head_dim = g->qk_nope_head_dim + g->qk_rope_head_dim;
    return 0;
}

static int parse_deepseek_v1(const reader *r, fmoe_model_geometry *g, uint8_t *moe) {
    return read_deepseek_moe(r, g, moe, &deepseek_v1);
}

static int parse_deepseek_v2(const reader *r, fmoe_model_geometry *g, uint8_t *moe) {
    FMOE_FORWARD_IF_ERROR(read_deepseek_moe(r, g, moe, &deepseek_v2));
    return read_deepseek_router(r, g, &deepseek_v2);
}

static int parse_deepseek_v3(const reader *r, fmoe_model_geometry *g, uint8_t *moe) {
    FMOE_FORWARD_IF_ERROR(read_deepseek_moe(r, g, moe, &deepseek_v3));
    return read_deepseek_router(r, g, &deepseek_v3);
}

/* modeling_glm4_moe (GLM-4.5, GLM-4.5-Air): DeepSeek-V3's layer rule and shared experts
 * (Glm4MoeDecoderLayer: MoE iff layer >= first_k_dense_replace, default 1; one shared MLP of
 * n_shared_experts * moe_intermediate_size) and its router (Glm4MoeTopkRouter: sigmoid,
 * e_score_correction_bias for selection, groups ranked by their two best), with GQA
 * attention instead of MLA. It has no scoring_func nor topk_method key: sigmoid and
 * noaux_tc always. num_nextn_predict_layers (the multi-token-prediction layer after the
 * last decoder layer) is not a decoder layer: inference skips it, as transformers does. */
static const deepseek_defaults glm4_moe = {1, 1, 10944, 1, "sigmoid", 1.0, "noaux_tc", 1, 1};

static int parse_glm4_moe(const reader *r, fmoe_model_geometry *g, uint8_t *moe) {
    FMOE_FORWARD_IF_ERROR(read_deepseek_moe(r, g, moe, &glm4_moe));
    g->scoring = FMOE_ROUTER_SIGMOID; /* whatever a stray scoring_func says, as transformers */
    FMOE_FORWARD_IF_ERROR(read_double(r, "routed_scaling_factor",
                                      glm4_moe.routed_scaling_factor,
                                      &g->routed_scaling_factor));
    copy_string(g->topk_method, sizeof g->topk_method, glm4_moe.topk_method);
    FMOE_FORWARD_IF_ERROR(read_i32(r, "n_group", 0, 1, 1, MAX_EXPERTS, &g->n_group));
    FMOE_FORWARD_IF_ERROR(read_i32(r, "topk_group", 0, 1, 1, MAX_EXPERTS, &g->topk_group));
    return check_groups(r, g);
}

/* modeling_phimoe: every layer sparse; sparsemixer top-2 routing (see the top of this
 * file). */
static int parse_phimoe(const reader *r, fmoe_model_geometry *g, uint8_t *moe) {
    (void)r;
    memset(moe, 1, (size_t)g->num_hidden_layers);
    copy_string(g->topk_method, sizeof g->topk_method, "sparsemixer");
    return 0;
}

/* modeling_gpt_oss: every layer sparse; GptOssTopKRouter takes the top-k of the (biased)
 * logits and softmaxes those k; experts carry biases on gate_up (2I) and down (h). */
static int parse_gpt_oss(const reader *r, fmoe_model_geometry *g, uint8_t *moe) {
    (void)r;
    memset(moe, 1, (size_t)g->num_hidden_layers);
    g->norm_topk_prob = 1;
    g->expert_has_bias = 1;
    return 0;
}

/* configuration_llama4: moe_layers when given, else
 *   range(interleave_moe_layer_step - 1, num_hidden_layers, step)
 * (Scout: step 1, every layer; Maverick: step 2, layers 1, 3, 5, ...). Llama4TextMoe adds
 * one shared expert of the routed width (intermediate_size); dense layers use
 * intermediate_size_mlp. Llama4Router: top-k of the logits, sigmoid of each, no
 * renormalisation. */
static int parse_llama4(const reader *r, fmoe_model_geometry *g, uint8_t *moe) {
    const int32_t n = g->num_hidden_layers;
    int present;
    FMOE_FORWARD_IF_ERROR(read_layer_list(r, "moe_layers", n, moe, &present));
    if (!present) {
        int32_t step;
        FMOE_FORWARD_IF_ERROR(
            read_i32(r, "interleave_moe_layer_step", 0, 1, 1, INT32_MAX, &step));
        for (int32_t i = step - 1; i < n; i += step) moe[i] = 1;
    }
    g->num_shared_experts = 1;
    g->shared_intermediate_size = g->moe_intermediate_size;
    FMOE_FORWARD_IF_ERROR(read_i32(r, "intermediate_size_mlp", 0, 16384, 0, MAX_WIDTH,
                                   &g->intermediate_size));
    g->scoring = FMOE_ROUTER_SIGMOID;
    return 0;
}

/* ---------------------------------------------------------------------------------- */
/* The family table                                                                   */
/* ---------------------------------------------------------------------------------- */

typedef struct family_spec {
    const char *model_type;
    fmoe_family family;
    family_parser parse;
    int text_config;           /* 1: the text model's keys sit under "text_config" */
    const char *experts_key;   /* routed experts per MoE layer */
    const char *experts_alias; /* read instead when experts_key is absent, or NULL */
    const char *top_k_alias;   /* read instead when num_experts_per_tok is absent, or NULL */
    const char *width_key;     /* routed expert FFN width */
    struct {                   /* transformers defaults for optional keys */
        int32_t vocab_size;
        int32_t num_attention_heads;
        int32_t num_key_value_heads; /* 0: num_attention_heads */
        int32_t head_dim;            /* 0: hidden_size / num_attention_heads */
        int64_t max_position_embeddings;
        double rope_theta;
        double rms_norm_eps;
    } defaults;
} family_spec;

static const family_spec families[] = {
    {.model_type = "mixtral", .family = FMOE_FAMILY_MIXTRAL, .parse = parse_mixtral,
     .experts_key = "num_local_experts", .width_key = "intermediate_size",
     .defaults = {32000, 32, 8, 0, 4096 * 32, 1e6, 1e-5}},
    {.model_type = "qwen2_moe", .family = FMOE_FAMILY_QWEN2_MOE, .parse = parse_qwen2_moe,
     .experts_key = "num_experts", .width_key = "moe_intermediate_size",
     .defaults = {151936, 16, 16, 0, 32768, 10000.0, 1e-6}},
    /* transformers 5 saves Qwen3-MoE with num_local_experts. */
    {.model_type = "qwen3_moe", .family = FMOE_FAMILY_QWEN3_MOE, .parse = parse_qwen3_moe,
     .experts_key = "num_experts", .experts_alias = "num_local_experts",
     .width_key = "moe_intermediate_size",
     .defaults = {151936, 32, 4, 0, 32768, 10000.0, 1e-6}},
    {.model_type = "olmoe", .family = FMOE_FAMILY_OLMOE, .parse = parse_olmoe,
     .experts_key = "num_experts", .width_key = "intermediate_size",
     .defaults = {50304, 16, 0, 0, 4096, 10000.0, 1e-5}},
    {.model_type = "deepseek", .family = FMOE_FAMILY_DEEPSEEK_V1, .parse = parse_deepseek_v1,
     .experts_key = "n_routed_experts", .width_key = "moe_intermediate_size",
     .defaults = {102400, 32, 0, 0, 2048, 10000.0, 1e-6}},
    {.model_type = "deepseek_v2", .family = FMOE_FAMILY_DEEPSEEK_V2,
     .parse = parse_deepseek_v2, .experts_key = "n_routed_experts",
     .width_key = "moe_intermediate_size",
     .defaults = {102400, 32, 0, 0, 2048, 10000.0, 1e-6}},
    {.model_type = "deepseek_v3", .family = FMOE_FAMILY_DEEPSEEK_V3,
     .parse = parse_deepseek_v3, .experts_key = "n_routed_experts",
     .width_key = "moe_intermediate_size",
     .defaults = {129280, 128, 128, 0, 4096, 10000.0, 1e-6}},
    {.model_type = "phimoe", .family = FMOE_FAMILY_PHIMOE, .parse = parse_phimoe,
     .experts_key = "num_local_experts", .width_key = "intermediate_size",
     .defaults = {32064, 32, 8, 0, 4096 * 32, 1e6, 1e-5}},
    /* glm4_moe: n_routed_experts (num_local_experts is transformers' attribute_map alias) */
    {.model_type = "glm4_moe", .family = FMOE_FAMILY_GLM4_MOE, .parse = parse_glm4_moe,
     .experts_key = "n_routed_experts", .experts_alias = "num_local_experts",
     .width_key = "moe_intermediate_size",
     .defaults = {151552, 96, 8, 0, 131072, 10000.0, 1e-5}},
    /* gpt_oss: num_experts is transformers' attribute_map alias; experts_per_token the
     * name in OpenAI's original config. */
    {.model_type = "gpt_oss", .family = FMOE_FAMILY_GPT_OSS, .parse = parse_gpt_oss,
     .experts_key = "num_local_experts", .experts_alias = "num_experts",
     .top_k_alias = "experts_per_token", .width_key = "intermediate_size",
     .defaults = {201088, 64, 8, 64, 131072, 150000.0, 1e-5}},
    /* llama4 keeps its text model under "text_config"; llama4_text is that object. */
    {.model_type = "llama4", .family = FMOE_FAMILY_LLAMA4, .parse = parse_llama4,
     .text_config = 1, .experts_key = "num_local_experts", .width_key = "intermediate_size",
     .defaults = {202048, 40, 8, 128, 4096 * 32, 500000.0, 1e-5}},
    {.model_type = "llama4_text", .family = FMOE_FAMILY_LLAMA4, .parse = parse_llama4,
     .experts_key = "num_local_experts", .width_key = "intermediate_size",
     .defaults = {202048, 40, 8, 128, 4096 * 32, 500000.0, 1e-5}},
};
#define NUM_FAMILIES (sizeof families / sizeof families[0])

/* Dense families users are likely to try, for a clearer refusal than "unsupported". */
static const char *const dense_types[] = {
    "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "gemma3_text",
    "phi", "phi3", "olmo", "olmo2", "gpt2", "gpt_neox", "falcon", "starcoder2",
};

const char *fmoe_geometry_supported_types(void) {
    return "mixtral, qwen2_moe, qwen3_moe, olmoe, deepseek, deepseek_v2, deepseek_v3, "
           "phimoe, glm4_moe, gpt_oss, llama4, llama4_text";
}

static const family_spec *find_family(const char *model_type) {
    for (size_t i = 0; i < NUM_FAMILIES; i++)
        if (strcmp(model_type, families[i].model_type) == 0) return &families[i];
    return NULL;
}

/* ---------------------------------------------------------------------------------- */
/* The keys every family shares                                                       */
/* ---------------------------------------------------------------------------------- */

/* `alias` when `key` is absent and `alias` present, else `key`. */
static const char *key_or_alias(const reader *r, const char *key, const char *alias) {
    return alias && !lookup(r, key) && lookup(r, alias) ? alias : key;
}

/* The five required keys: layers, hidden size, expert count, top-k, expert width. */
static int read_required(const family_spec *fs, const reader *r, fmoe_model_geometry *g) {
    FMOE_FORWARD_IF_ERROR(read_i32(r, "num_hidden_layers", 1, 0, 1, FMOE_MAX_LAYERS,
                                   &g->num_hidden_layers));
    FMOE_FORWARD_IF_ERROR(read_i32(r, "hidden_size", 1, 0, 1, MAX_WIDTH, &g->hidden_size));
    const cJSON *ex = cJSON_GetObjectItemCaseSensitive(r->obj, fs->experts_key);
    if (ex && cJSON_IsNull(ex))
        return fmoe_error_set(FMOE_EUNSUPPORTED,
                              "%s%s is null: a dense model without routed experts; fmoe "
                              "needs a Mixture-of-Experts model",
                              r->prefix, fs->experts_key);
    FMOE_FORWARD_IF_ERROR(read_i32(r, key_or_alias(r, fs->experts_key, fs->experts_alias), 1,
                                   0, 0, MAX_EXPERTS, &g->num_experts));
    if (g->num_experts == 0)
        return fmoe_error_set(FMOE_EUNSUPPORTED,
                              "%s%s = 0: a dense model without routed experts; fmoe needs a "
                              "Mixture-of-Experts model",
                              r->prefix, fs->experts_key);
    FMOE_FORWARD_IF_ERROR(read_i32(r, key_or_alias(r, "num_experts_per_tok", fs->top_k_alias),
                                   1, 0, 1, MAX_EXPERTS, &g->top_k));
    FMOE_RETURN_ERROR_IF(g->top_k > g->num_experts, FMOE_ERANGE,
                         "%snum_experts_per_tok = %d exceeds the %d routed experts", r->prefix,
                         g->top_k, g->num_experts);
    return read_i32(r, fs->width_key, 1, 0, 1, MAX_WIDTH, &g->moe_intermediate_size);
}

/* Optional keys with the family's transformers defaults. */
static int read_optional(const family_spec *fs, const reader *r, const cJSON *root,
                         fmoe_model_geometry *g) {
    FMOE_FORWARD_IF_ERROR(
        read_i32(r, "vocab_size", 0, fs->defaults.vocab_size, 1, INT32_MAX, &g->vocab_size));
    FMOE_FORWARD_IF_ERROR(read_i32(r, "num_attention_heads", 0,
                                   fs->defaults.num_attention_heads, 1, MAX_WIDTH,
                                   &g->num_attention_heads));
    FMOE_FORWARD_IF_ERROR(read_i32(r, "num_key_value_heads", 0,
                                   fs->defaults.num_key_value_heads
                                       ? fs->defaults.num_key_value_heads
                                       : g->num_attention_heads,
                                   1, MAX_WIDTH, &g->num_key_value_heads));
    FMOE_FORWARD_IF_ERROR(read_i32(r, "head_dim", 0,
                                   fs->defaults.head_dim
                                       ? fs->defaults.head_dim
                                       : g->hidden_size / g->num_attention_heads,
                                   1, MAX_WIDTH, &g->head_dim));
    FMOE_FORWARD_IF_ERROR(read_i64(r, "max_position_embeddings", 0,
                                   fs->defaults.max_position_embeddings, 1, INT64_MAX / 2,
                                   &g->max_position_embeddings));
    /* rope_theta, or inside rope_parameters as transformers >= 4.56 writes it. */
    double theta = fs->defaults.rope_theta;
    const cJSON *rp = lookup(r, "rope_parameters");
    if (rp && cJSON_IsObject(rp)) {
        reader rr = {rp, NULL, "rope_parameters."};
        FMOE_FORWARD_IF_ERROR(read_double(&rr, "rope_theta", theta, &theta));
    }
    FMOE_FORWARD_IF_ERROR(read_double(r, "rope_theta", theta, &g->rope_theta));
    FMOE_FORWARD_IF_ERROR(
        read_double(r, "rms_norm_eps", fs->defaults.rms_norm_eps, &g->rms_norm_eps));
    FMOE_FORWARD_IF_ERROR(read_bool(r, "tie_word_embeddings", 0, &g->tie_word_embeddings));
    FMOE_FORWARD_IF_ERROR(read_dtype(r, &g->dtype));
    return read_quantization(root, g);
}

/*
 * Fills `g` from the config object of one family. `r` reads the object that holds the
 * text model's keys (the root, or llama4's text_config); `root` is the whole config.
 */
static int parse_config(const family_spec *fs, const reader *r, const cJSON *root,
                        fmoe_model_geometry *g) {
    g->family = fs->family;
    FMOE_FORWARD_IF_ERROR(read_required(fs, r, g));
    FMOE_FORWARD_IF_ERROR(read_optional(fs, r, root, g));

    /* Router defaults; the family's parser overrides them. */
    g->scoring = FMOE_ROUTER_SOFTMAX;
    g->norm_topk_prob = 0;
    g->n_group = 1;
    g->topk_group = 1;
    g->routed_scaling_factor = 1.0;
    copy_string(g->topk_method, sizeof g->topk_method, "greedy");

    const int32_t n = g->num_hidden_layers;
    uint8_t moe[FMOE_MAX_LAYERS] = {0}; /* [n] 1 where decoder layer i is MoE */
    FMOE_FORWARD_IF_ERROR(fs->parse(r, g, moe));

    g->num_moe_layers = 0;
    for (int32_t i = 0; i < n; i++)
        if (moe[i]) g->moe_layer_index[g->num_moe_layers++] = i;
    if (g->num_moe_layers == 0)
        return fmoe_error_set(FMOE_EUNSUPPORTED,
                              "none of the %d decoder layers is a MoE layer: a dense model; "
                              "fmoe needs a Mixture-of-Experts model",
                              n);
    return 0;
}

int fmoe_geometry_parse(const char *json, size_t len, fmoe_model_geometry *out) {
    if (!out) return fmoe_error_set(FMOE_EINVAL, "geometry output is NULL");
    cJSON *root = NULL;
    FMOE_FORWARD_IF_ERROR(fmoe__config_json_parse(json, len, &root));

    int rc = 0;
    fmoe_model_geometry *g = calloc(1, sizeof *g); /* ~2 KB; `out` stays untouched on error */
    if (!g) {
        rc = fmoe_error_set(FMOE_ENOMEM, "out of memory");
        goto fail;
    }
    if (!cJSON_IsObject(root)) {
        rc = fmoe_error_set(FMOE_EFORMAT, "config.json must be a JSON object, not %s",
                            json_type_name(root));
        goto fail;
    }
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    if (!mt || cJSON_IsNull(mt)) {
        rc = fmoe_error_set(FMOE_EFORMAT, "missing key model_type");
        goto fail;
    }
    if (!cJSON_IsString(mt)) {
        rc = fmoe_error_set(FMOE_EFORMAT, "model_type must be a string, not %s",
                            json_type_name(mt));
        goto fail;
    }
    const family_spec *fs = find_family(mt->valuestring);
    if (!fs) {
        for (size_t i = 0; i < sizeof dense_types / sizeof dense_types[0]; i++) {
            if (strcmp(mt->valuestring, dense_types[i]) == 0) {
                rc = fmoe_error_set(FMOE_EUNSUPPORTED,
                                    "model_type \"%s\" is a dense model without routed "
                                    "experts; fmoe needs a Mixture-of-Experts model "
                                    "(supported: %s)",
                                    mt->valuestring, fmoe_geometry_supported_types());
                goto fail;
            }
        }
        rc = fmoe_error_set(FMOE_EUNSUPPORTED, "unsupported model_type \"%.64s\" (supported: %s)",
                            mt->valuestring, fmoe_geometry_supported_types());
        goto fail;
    }
    copy_string(g->model_type, sizeof g->model_type, fs->model_type);

    reader r = {root, NULL, ""};
    if (fs->text_config) {
        const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "text_config");
        if (!tc || cJSON_IsNull(tc)) {
            rc = fmoe_error_set(FMOE_EFORMAT, "missing key text_config");
            goto fail;
        }
        if (!cJSON_IsObject(tc)) {
            rc = fmoe_error_set(FMOE_EFORMAT, "text_config must be an object, not %s",
                                json_type_name(tc));
            goto fail;
        }
        r = (reader){tc, root, "text_config."};
    }
    rc = parse_config(fs, &r, root, g);
    if (rc < 0) goto fail;

    *out = *g;
fail:
    free(g);
    cJSON_Delete(root);
    return rc;
}

/* A GGUF file's geometry: its config (fmoe_gguf_config_json), with expert_dtype the type
 * of its first MoE layer's stacked gate experts, as the forward pass stores them. */
static int geometry_from_gguf(const char *path, fmoe_model_geometry *out) {
    fmoe_gguf *g = NULL;
    char *json = NULL;
    int exact = 0, rc;
    fmoe_model_geometry geo;
    if ((rc = fmoe_gguf_open(path, &g)) < 0) return rc;
    if ((rc = fmoe_gguf_config_json(g, &json, &exact)) < 0) goto done;
    if ((rc = fmoe_geometry_parse(json, strlen(json), &geo)) < 0) {
        fmoe_error_prefix("%s", path);
        goto done;
    }
    if (geo.num_moe_layers > 0) {
        char name[64];
        snprintf(name, sizeof name, "blk.%d.ffn_gate_exps.weight", geo.moe_layer_index[0]);
        const fmoe_gguf_tensor *t = fmoe_gguf_find_tensor(g, name);
        /* absent or another type: the config's */
        if (t) (void)fmoe_dtype_of_ggml_type(t->type, &geo.expert_dtype);
    }
    *out = geo;
done:
    free(json);
    fmoe_gguf_close(g);
    return rc;
}

int fmoe_geometry_load(const char *path, fmoe_model_geometry *out) {
    if (!path || !out) return fmoe_error_set(FMOE_EINVAL, "path or output is NULL");
    /* regular files only (lib/files.h): a FIFO would block, /dev/zero never end */
    const int fd = fmoe__open_regular(path);
    if (fd < 0) return fd;
    char magic[4];
    const int gguf = fmoe__pread_all(fd, magic, 4, 0) == 0 && memcmp(magic, "GGUF", 4) == 0;
    close(fd);
    if (gguf) return geometry_from_gguf(path, out);
    char *buf = NULL;
    size_t len = 0;
    int rc = fmoe__read_file_bounded(path, "a config.json", MAX_CONFIG_BYTES, 0, &buf, &len);
    if (rc < 0) return rc;
    rc = fmoe_geometry_parse(buf, len, out);
    if (rc < 0) fmoe_error_prefix("%s", path);
    free(buf);
    return rc;
}

int fmoe_geometry_generic(int32_t layers, int32_t experts, int32_t top_k, int32_t hidden,
                          fmoe_model_geometry *out) {
    if (!out) return fmoe_error_set(FMOE_EINVAL, "geometry output is NULL");
    FMOE_RETURN_ERROR_IF(layers < 1 || layers > FMOE_MAX_LAYERS, FMOE_EINVAL,
                         "layers = %d is out of range [1, %d]", layers, FMOE_MAX_LAYERS);
    FMOE_RETURN_ERROR_IF(experts < 1 || experts > MAX_EXPERTS, FMOE_EINVAL,
                         "experts = %d is out of range [1, %d]", experts, MAX_EXPERTS);
    FMOE_RETURN_ERROR_IF(top_k < 1 || top_k > experts, FMOE_EINVAL,
                         "top-k = %d is out of range [1, %d experts]", top_k, experts);
    FMOE_RETURN_ERROR_IF(hidden < 0 || hidden > MAX_WIDTH, FMOE_EINVAL,
                         "hidden size = %d is out of range [0, %d]", hidden, MAX_WIDTH);
    memset(out, 0, sizeof *out);
    copy_string(out->model_type, sizeof out->model_type, "generic");
    out->family = FMOE_FAMILY_GENERIC;
    out->num_hidden_layers = layers;
    out->num_moe_layers = layers;
    for (int32_t i = 0; i < layers; i++) out->moe_layer_index[i] = i;
    out->num_experts = experts;
    out->top_k = top_k;
    out->hidden_size = hidden;
    out->scoring = FMOE_ROUTER_SOFTMAX;
    out->n_group = 1;
    out->topk_group = 1;
    out->routed_scaling_factor = 1.0;
    out->dtype = FMOE_DTYPE_BF16;
    out->expert_dtype = FMOE_DTYPE_BF16;
    copy_string(out->topk_method, sizeof out->topk_method, "greedy");
    return 0;
}
