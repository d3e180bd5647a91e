/*
 * geometry.c - the MoE geometry of a HuggingFace model, from its config.json.
 *
 * Design. One table, `families[]`, names every supported model_type with the keys its
 * transformers configuration uses for the expert count, top-k and expert width, and the
 * defaults transformers gives the keys we treat as optional. One function,
 * parse_family(), reads those keys and then, in a switch per family, the three things
 * that differ: which decoder layers are MoE, the shared experts, and the router. Each case
 * cites the code it follows. Where transformers and the model authors' remote code
 * disagree we say which we took.
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
 */
#include "fmoe/geometry.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "fmoe/error.h"
#include "fmoe/sha256.h"

/* Widths beyond this are not a real model and would overflow 64-bit byte counts. */
#define MAX_WIDTH (1 << 24)
/* Trace files store expert ids as uint16. */
#define MAX_EXPERTS 65536
/* config.json files are a few KB; this bounds what fmoe_geometry_load reads. */
#define MAX_CONFIG_BYTES (64 << 20)

/* ---------------------------------------------------------------------------------- */
/* The family table                                                                   */
/* ---------------------------------------------------------------------------------- */

typedef struct family_spec {
    const char *model_type;
    fmoe_family family;
    const char *experts_key;   /* routed experts per MoE layer */
    const char *width_key;     /* routed expert FFN width */
    /* transformers defaults for optional keys */
    int32_t vocab_size;
    int32_t num_attention_heads;
    int32_t num_key_value_heads; /* 0: num_attention_heads */
    int32_t head_dim;            /* 0: hidden_size / num_attention_heads */
    int64_t max_position_embeddings;
    double rope_theta;
    double rms_norm_eps;
} family_spec;

static const family_spec families[] = {
    {"mixtral", FMOE_FAMILY_MIXTRAL, "num_local_experts", "intermediate_size",
     32000, 32, 8, 0, 4096 * 32, 1e6, 1e-5},
    {"qwen2_moe", FMOE_FAMILY_QWEN2_MOE, "num_experts", "moe_intermediate_size",
     151936, 16, 16, 0, 32768, 10000.0, 1e-6},
    {"qwen3_moe", FMOE_FAMILY_QWEN3_MOE, "num_experts", "moe_intermediate_size",
     151936, 32, 4, 0, 32768, 10000.0, 1e-6},
    {"olmoe", FMOE_FAMILY_OLMOE, "num_experts", "intermediate_size",
     50304, 16, 0, 0, 4096, 10000.0, 1e-5},
    {"deepseek", FMOE_FAMILY_DEEPSEEK_V1, "n_routed_experts", "moe_intermediate_size",
     102400, 32, 0, 0, 2048, 10000.0, 1e-6},
    {"deepseek_v2", FMOE_FAMILY_DEEPSEEK_V2, "n_routed_experts", "moe_intermediate_size",
     102400, 32, 0, 0, 2048, 10000.0, 1e-6},
    {"deepseek_v3", FMOE_FAMILY_DEEPSEEK_V3, "n_routed_experts", "moe_intermediate_size",
     129280, 128, 128, 0, 4096, 10000.0, 1e-6},
    {"phimoe", FMOE_FAMILY_PHIMOE, "num_local_experts", "intermediate_size",
     32064, 32, 8, 0, 4096 * 32, 1e6, 1e-5},
    {"gpt_oss", FMOE_FAMILY_GPT_OSS, "num_local_experts", "intermediate_size",
     201088, 64, 8, 64, 131072, 150000.0, 1e-5},
    /* llama4 keeps its text model under "text_config"; llama4_text is that object. */
    {"llama4", FMOE_FAMILY_LLAMA4, "num_local_experts", "intermediate_size",
     202048, 40, 8, 128, 4096 * 32, 500000.0, 1e-5},
    {"llama4_text", FMOE_FAMILY_LLAMA4, "num_local_experts", "intermediate_size",
     202048, 40, 8, 128, 4096 * 32, 500000.0, 1e-5},
};
#define NUM_FAMILIES (sizeof families / sizeof families[0])

/* Dense families users are likely to try, for a clearer refusal than "unsupported". */
static const char *const dense_types[] = {
    "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "gemma3_text",
    "phi", "phi3", "olmo", "olmo2", "gpt2", "gpt_neox", "falcon", "starcoder2",
};

const char *fmoe_geometry_supported_types(void) {
    return "mixtral, qwen2_moe, qwen3_moe, olmoe, deepseek, deepseek_v2, deepseek_v3, "
           "phimoe, gpt_oss, llama4, llama4_text";
}

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
                          "unknown dtype \"%.64s\" (expected f32, f16, bf16, f8_e4m3, mxfp4)",
                          name);
}

double fmoe_dtype_bits(fmoe_dtype d) {
    switch (d) {
    case FMOE_DTYPE_F32: return 32.0;
    case FMOE_DTYPE_F16: return 16.0;
    case FMOE_DTYPE_BF16: return 16.0;
    case FMOE_DTYPE_F8_E4M3: return 8.0;
    case FMOE_DTYPE_MXFP4: return 4.25;
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
    }
    return fmoe_error_set(FMOE_EINVAL, "unknown dtype %d", (int)dtype);
}

/* ---------------------------------------------------------------------------------- */
/* Parsing                                                                            */
/* ---------------------------------------------------------------------------------- */

/* Parses `len` bytes into a cJSON tree; a malformed input fails with the byte offset,
 * line and column of the error. */
static int parse_json(const char *json, size_t len, cJSON **out) {
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

static const family_spec *find_family(const char *model_type) {
    for (size_t i = 0; i < NUM_FAMILIES; i++)
        if (strcmp(model_type, families[i].model_type) == 0) return &families[i];
    return NULL;
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

/*
 * Fills `g` from the config object of one family. `r` reads the object that holds the
 * text model's keys (the root, or llama4's text_config); `root` is the whole config.
 */
static int parse_family(const family_spec *fs, const reader *r, const cJSON *root,
                        fmoe_model_geometry *g) {
    g->family = fs->family;

    /* The five required keys. */
    FMOE_FORWARD_IF_ERROR(read_i32(r, "num_hidden_layers", 1, 0, 1, FMOE_MAX_LAYERS,
                                   &g->num_hidden_layers));
    FMOE_FORWARD_IF_ERROR(read_i32(r, "hidden_size", 1, 0, 1, MAX_WIDTH, &g->hidden_size));
    {
        const cJSON *ex = cJSON_GetObjectItemCaseSensitive(r->obj, fs->experts_key);
        if (ex && cJSON_IsNull(ex))
            return fmoe_error_set(FMOE_EUNSUPPORTED,
                                  "%s%s is null: a dense model without routed experts; fmoe "
                                  "needs a Mixture-of-Experts model",
                                  r->prefix, fs->experts_key);
    }
    if (fs->family == FMOE_FAMILY_GPT_OSS && !lookup(r, fs->experts_key) &&
        lookup(r, "num_experts")) /* transformers' attribute_map alias */
        FMOE_FORWARD_IF_ERROR(read_i32(r, "num_experts", 1, 0, 0, MAX_EXPERTS, &g->num_experts));
    else if (fs->family == FMOE_FAMILY_QWEN3_MOE && !lookup(r, fs->experts_key) &&
             lookup(r, "num_local_experts")) /* transformers 5 saves Qwen3-MoE this way */
        FMOE_FORWARD_IF_ERROR(
            read_i32(r, "num_local_experts", 1, 0, 0, MAX_EXPERTS, &g->num_experts));
    else
        FMOE_FORWARD_IF_ERROR(
            read_i32(r, fs->experts_key, 1, 0, 0, MAX_EXPERTS, &g->num_experts));
    if (g->num_experts == 0)
        return fmoe_error_set(FMOE_EUNSUPPORTED,
                              "%s%s = 0: a dense model without routed experts; fmoe needs a "
                              "Mixture-of-Experts model",
                              r->prefix, fs->experts_key);
    if (fs->family == FMOE_FAMILY_GPT_OSS && !lookup(r, "num_experts_per_tok") &&
        lookup(r, "experts_per_token")) /* the name in OpenAI's original config */
        FMOE_FORWARD_IF_ERROR(
            read_i32(r, "experts_per_token", 1, 0, 1, MAX_EXPERTS, &g->top_k));
    else
        FMOE_FORWARD_IF_ERROR(
            read_i32(r, "num_experts_per_tok", 1, 0, 1, MAX_EXPERTS, &g->top_k));
    FMOE_RETURN_ERROR_IF(g->top_k > g->num_experts, FMOE_ERANGE,
                         "%snum_experts_per_tok = %d exceeds the %d routed experts", r->prefix,
                         g->top_k, g->num_experts);
    FMOE_FORWARD_IF_ERROR(
        read_i32(r, fs->width_key, 1, 0, 1, MAX_WIDTH, &g->moe_intermediate_size));

    /* Optional keys with transformers' defaults. */
    FMOE_FORWARD_IF_ERROR(
        read_i32(r, "vocab_size", 0, fs->vocab_size, 1, INT32_MAX, &g->vocab_size));
    FMOE_FORWARD_IF_ERROR(read_i32(r, "num_attention_heads", 0, fs->num_attention_heads, 1,
                                   MAX_WIDTH, &g->num_attention_heads));
    FMOE_FORWARD_IF_ERROR(read_i32(r, "num_key_value_heads", 0,
                                   fs->num_key_value_heads ? fs->num_key_value_heads
                                                           : g->num_attention_heads,
                                   1, MAX_WIDTH, &g->num_key_value_heads));
    FMOE_FORWARD_IF_ERROR(read_i32(r, "head_dim", 0,
                                   fs->head_dim ? fs->head_dim
                                                : g->hidden_size / g->num_attention_heads,
                                   1, MAX_WIDTH, &g->head_dim));
    FMOE_FORWARD_IF_ERROR(read_i64(r, "max_position_embeddings", 0,
                                   fs->max_position_embeddings, 1, INT64_MAX / 2,
                                   &g->max_position_embeddings));
    {
        /* rope_theta, or inside rope_parameters as transformers >= 4.56 writes it. */
        double theta = fs->rope_theta;
        const cJSON *rp = lookup(r, "rope_parameters");
        if (rp && cJSON_IsObject(rp)) {
            reader rr = {rp, NULL, "rope_parameters."};
            FMOE_FORWARD_IF_ERROR(read_double(&rr, "rope_theta", theta, &theta));
        }
        FMOE_FORWARD_IF_ERROR(read_double(r, "rope_theta", theta, &g->rope_theta));
    }
    FMOE_FORWARD_IF_ERROR(read_double(r, "rms_norm_eps", fs->rms_norm_eps, &g->rms_norm_eps));
    FMOE_FORWARD_IF_ERROR(read_bool(r, "tie_word_embeddings", 0, &g->tie_word_embeddings));
    FMOE_FORWARD_IF_ERROR(read_dtype(r, &g->dtype));
    FMOE_FORWARD_IF_ERROR(read_quantization(root, g));

    /* Router defaults; the switch overrides per family. */
    g->scoring = FMOE_ROUTER_SOFTMAX;
    g->norm_topk_prob = 0;
    g->n_group = 1;
    g->topk_group = 1;
    g->routed_scaling_factor = 1.0;
    copy_string(g->topk_method, sizeof g->topk_method, "greedy");

    const int32_t n = g->num_hidden_layers;
    uint8_t moe[FMOE_MAX_LAYERS] = {0}; /* [n] 1 where decoder layer i is MoE */

    switch (fs->family) {
    case FMOE_FAMILY_MIXTRAL:
        /* modeling_mixtral: every layer is sparse; MixtralSparseMoeBlock softmaxes the
         * logits, takes the top-k and divides by their sum (always). */
        memset(moe, 1, (size_t)n);
        g->norm_topk_prob = 1;
        break;

    case FMOE_FAMILY_QWEN2_MOE:
    case FMOE_FAMILY_QWEN3_MOE: {
        /* modeling_qwen2_moe / qwen3_moe decoder layer: sparse iff
         *   layer not in mlp_only_layers and num_experts > 0
         *   and (layer + 1) % decoder_sparse_step == 0. */
        int32_t step;
        FMOE_FORWARD_IF_ERROR(read_i32(r, "decoder_sparse_step", 0, 1, 1, INT32_MAX, &step));
        uint8_t mlp_only[FMOE_MAX_LAYERS] = {0};
        int present;
        FMOE_FORWARD_IF_ERROR(read_layer_list(r, "mlp_only_layers", n, mlp_only, &present));
        for (int32_t i = 0; i < n; i++) moe[i] = !mlp_only[i] && (i + 1) % step == 0;
        FMOE_FORWARD_IF_ERROR(read_bool(r, "norm_topk_prob", 0, &g->norm_topk_prob));
        FMOE_FORWARD_IF_ERROR(read_i32(r, "intermediate_size", 0,
                                       fs->family == FMOE_FAMILY_QWEN2_MOE ? 5632 : 6144, 0,
                                       MAX_WIDTH, &g->intermediate_size));
        if (fs->family == FMOE_FAMILY_QWEN2_MOE) {
            /* Qwen2MoeSparseMoeBlock: one shared expert of this width, gated by
             * sigmoid(shared_expert_gate(x)). */
            FMOE_FORWARD_IF_ERROR(read_i32(r, "shared_expert_intermediate_size", 0, 5632, 0,
                                           MAX_WIDTH, &g->shared_intermediate_size));
            g->num_shared_experts = g->shared_intermediate_size > 0 ? 1 : 0;
        }
        break;
    }

    case FMOE_FAMILY_OLMOE:
        /* modeling_olmoe: every layer sparse; softmax, top-k, optional renormalisation. */
        memset(moe, 1, (size_t)n);
        FMOE_FORWARD_IF_ERROR(read_bool(r, "norm_topk_prob", 0, &g->norm_topk_prob));
        break;

    case FMOE_FAMILY_DEEPSEEK_V1:
    case FMOE_FAMILY_DEEPSEEK_V2:
    case FMOE_FAMILY_DEEPSEEK_V3: {
        /* The authors' modeling_deepseek.py (V1, V2, V3 alike): a layer is MoE iff
         *   layer >= first_k_dense_replace and layer % moe_layer_freq == 0.
         * transformers' deepseek_v2/v3 ignore moe_layer_freq; every published checkpoint
         * has moe_layer_freq = 1, where the two agree. Shared experts are one MLP of width
         * n_shared_experts * moe_intermediate_size. */
        const int v3 = fs->family == FMOE_FAMILY_DEEPSEEK_V3;
        int32_t first_dense, freq, shared;
        FMOE_FORWARD_IF_ERROR(read_i32(r, "first_k_dense_replace", 0, v3 ? 3 : 0, 0,
                                       INT32_MAX, &first_dense));
        FMOE_FORWARD_IF_ERROR(read_i32(r, "moe_layer_freq", 0, 1, 1, INT32_MAX, &freq));
        for (int32_t i = 0; i < n; i++) moe[i] = i >= first_dense && i % freq == 0;
        /* n_shared_experts absent: none in the authors' code (V1); transformers'
         * deepseek_v2 and v3 default to 2 and 1. */
        const int32_t shared_default = fs->family == FMOE_FAMILY_DEEPSEEK_V1 ? 0 : v3 ? 1 : 2;
        FMOE_FORWARD_IF_ERROR(
            read_i32(r, "n_shared_experts", 0, shared_default, 0, MAX_EXPERTS, &shared));
        g->num_shared_experts = shared;
        g->shared_intermediate_size = shared * g->moe_intermediate_size;
        FMOE_FORWARD_IF_ERROR(read_i32(r, "intermediate_size", 0, v3 ? 18432 : 11008, 0,
                                       MAX_WIDTH, &g->intermediate_size));
        FMOE_FORWARD_IF_ERROR(read_bool(r, "norm_topk_prob", v3, &g->norm_topk_prob));

        /* scoring_func: V1/V2 softmax; V3 sigmoid (transformers hard-codes it; the authors'
         * code refuses anything else). */
        const char *scoring;
        FMOE_FORWARD_IF_ERROR(read_string(r, "scoring_func", v3 ? "sigmoid" : "softmax",
                                          &scoring));
        if (strcmp(scoring, "softmax") == 0)
            g->scoring = FMOE_ROUTER_SOFTMAX;
        else if (strcmp(scoring, "sigmoid") == 0)
            g->scoring = FMOE_ROUTER_SIGMOID;
        else
            return fmoe_error_set(FMOE_EUNSUPPORTED,
                                  "%sscoring_func \"%.32s\" (supported: softmax, sigmoid)",
                                  r->prefix, scoring);

        if (fs->family != FMOE_FAMILY_DEEPSEEK_V1) {
            FMOE_FORWARD_IF_ERROR(read_mla(r, g));
            FMOE_FORWARD_IF_ERROR(read_double(r, "routed_scaling_factor", v3 ? 2.5 : 1.0,
                                              &g->routed_scaling_factor));
            const char *method;
            FMOE_FORWARD_IF_ERROR(
                read_string(r, "topk_method", v3 ? "noaux_tc" : "greedy", &method));
            if (strcmp(method, "greedy") != 0 && strcmp(method, "group_limited_greedy") != 0 &&
                strcmp(method, "noaux_tc") != 0)
                return fmoe_error_set(FMOE_EUNSUPPORTED,
                                      "%stopk_method \"%.32s\" (supported: greedy, "
                                      "group_limited_greedy, noaux_tc)",
                                      r->prefix, method);
            copy_string(g->topk_method, sizeof g->topk_method, method);
            /* Groups matter only to the grouped methods; plain greedy ignores n_group
             * (V2-Lite writes n_group 1), so it is recorded as ungrouped. */
            if (strcmp(method, "greedy") != 0) {
                FMOE_FORWARD_IF_ERROR(
                    read_i32(r, "n_group", 0, v3 ? 8 : 1, 1, MAX_EXPERTS, &g->n_group));
                FMOE_FORWARD_IF_ERROR(
                    read_i32(r, "topk_group", 0, v3 ? 4 : 1, 1, MAX_EXPERTS, &g->topk_group));
                FMOE_FORWARD_IF_ERROR(check_groups(r, g));
            }
            if (g->qk_nope_head_dim + g->qk_rope_head_dim > 0 && !lookup(r, "head_dim"))
                g->head_dim = g->qk_nope_head_dim + g->qk_rope_head_dim;
        }
        break;
    }

    case FMOE_FAMILY_PHIMOE:
        /* modeling_phimoe: every layer sparse; sparsemixer top-2 routing (see the top of
         * this file). */
        memset(moe, 1, (size_t)n);
        copy_string(g->topk_method, sizeof g->topk_method, "sparsemixer");
        break;

    case FMOE_FAMILY_GPT_OSS:
        /* modeling_gpt_oss: every layer sparse; GptOssTopKRouter takes the top-k of the
         * (biased) logits and softmaxes those k; experts carry biases on gate_up (2I) and
         * down (h). */
        memset(moe, 1, (size_t)n);
        g->norm_topk_prob = 1;
        g->expert_has_bias = 1;
        break;

    case FMOE_FAMILY_LLAMA4: {
        /* configuration_llama4: moe_layers when given, else
         *   range(interleave_moe_layer_step - 1, num_hidden_layers, step)
         * (Scout: step 1, every layer; Maverick: step 2, layers 1, 3, 5, ...).
         * Llama4TextMoe adds one shared expert of the routed width (intermediate_size);
         * dense layers use intermediate_size_mlp. Llama4Router: top-k of the logits,
         * sigmoid of each, no renormalisation. */
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
        break;
    }

    case FMOE_FAMILY_GENERIC:
        FMOE_ASSERT(0);
        break;
    }

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
    FMOE_FORWARD_IF_ERROR(parse_json(json, len, &root));

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
    if (strcmp(fs->model_type, "llama4") == 0) {
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
    rc = parse_family(fs, &r, root, g);
    if (rc < 0) goto fail;

    *out = *g;
fail:
    free(g);
    cJSON_Delete(root);
    return rc;
}

int fmoe_geometry_load(const char *path, fmoe_model_geometry *out) {
    if (!path || !out) return fmoe_error_set(FMOE_EINVAL, "path or output is NULL");
    FILE *f = fopen(path, "rb");
    if (!f) return fmoe_error_set(FMOE_EIO, "%s: %s", path, strerror(errno));

    int rc = 0;
    size_t cap = 16384, len = 0;
    char *buf = malloc(cap);
    if (!buf) {
        rc = fmoe_error_set(FMOE_ENOMEM, "%s: out of memory", path);
        goto done;
    }
    for (;;) {
        if (len == cap) {
            if (cap >= MAX_CONFIG_BYTES) {
                rc = fmoe_error_set(FMOE_EFORMAT, "%s: larger than %d MiB, not a config.json",
                                    path, MAX_CONFIG_BYTES >> 20);
                goto done;
            }
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                rc = fmoe_error_set(FMOE_ENOMEM, "%s: out of memory", path);
                goto done;
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) {
            if (ferror(f)) {
                rc = fmoe_error_set(FMOE_EIO, "%s: read error: %s", path, strerror(errno));
                goto done;
            }
            break;
        }
    }
    rc = fmoe_geometry_parse(buf, len, out);
    if (rc < 0) fmoe_error_prefix("%s", path);
done:
    free(buf);
    fclose(f);
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

/* ---------------------------------------------------------------------------------- */
/* Fingerprint                                                                        */
/* ---------------------------------------------------------------------------------- */

static int key_cmp(const cJSON *a, const cJSON *b) {
    return strcmp(a->string ? a->string : "", b->string ? b->string : "");
}

/* Stable merge sort of n items through scratch `tmp`. */
static void merge_sort(cJSON **v, cJSON **tmp, size_t n) {
    if (n < 2) return;
    size_t h = n / 2;
    merge_sort(v, tmp, h);
    merge_sort(v + h, tmp, n - h);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) tmp[k++] = key_cmp(v[j], v[i]) < 0 ? v[j++] : v[i++];
    while (i < h) tmp[k++] = v[i++];
    while (j < n) tmp[k++] = v[j++];
    memcpy(v, tmp, n * sizeof *v);
}

/* Sorts every object's members by key, recursively. Depth is bounded by cJSON's nesting
 * limit (CJSON_NESTING_LIMIT, 1000). */
static int sort_keys(cJSON *node) {
    if (!cJSON_IsObject(node) && !cJSON_IsArray(node)) return 0;
    size_t n = 0;
    for (cJSON *c = node->child; c; c = c->next) {
        FMOE_FORWARD_IF_ERROR(sort_keys(c));
        n++;
    }
    if (!cJSON_IsObject(node) || n < 2) return 0;
    cJSON **v = malloc(2 * n * sizeof *v);
    if (!v) return fmoe_error_set(FMOE_ENOMEM, "out of memory sorting %zu keys", n);
    size_t i = 0;
    for (cJSON *c = node->child; c; c = c->next) v[i++] = c;
    merge_sort(v, v + n, n);
    /* Relink in the cJSON convention: child->prev is the last element, last->next NULL. */
    for (i = 0; i < n; i++) {
        v[i]->next = i + 1 < n ? v[i + 1] : NULL;
        v[i]->prev = i > 0 ? v[i - 1] : v[n - 1];
    }
    node->child = v[0];
    free(v);
    return 0;
}

int fmoe_config_fingerprint(const char *json, size_t len, char hex[65]) {
    if (!hex) return fmoe_error_set(FMOE_EINVAL, "hex output is NULL");
    cJSON *root = NULL;
    FMOE_FORWARD_IF_ERROR(parse_json(json, len, &root));
    int rc = sort_keys(root);
    if (rc == 0) {
        char *canon = cJSON_PrintUnformatted(root);
        if (!canon) {
            rc = fmoe_error_set(FMOE_ENOMEM, "out of memory printing canonical JSON");
        } else {
            fmoe_sha256_hex(canon, strlen(canon), hex);
            cJSON_free(canon);
        }
    }
    cJSON_Delete(root);
    return rc;
}
