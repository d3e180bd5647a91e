/*
 * config.c - the architecture details of config.json that the forward pass needs and
 * lib/geometry.c does not parse: attention biases, q/k norms, sliding windows, the rope
 * and its scaling. Each family's defaults are its transformers configuration's (DeepSeek
 * V1: the authors' configuration_deepseek.py).
 *
 * Rope scaling: transformers >= 4.56 writes "rope_parameters" (with rope_theta inside),
 * older versions and most published checkpoints "rope_scaling"; "rope_type" or the older
 * "type" names the kind. Implemented: default, linear, dynamic (NTK), yarn and llama3 —
 * every kind these families' published configs use (all of them: none) and the ones
 * their users add for long context. Others (longrope, ...) are refused by name.
 *
 * Partial rotary (GLM-4.5's partial_rotary_factor, 0.5 by default there, 1 and nothing
 * else for the other families): the first head_dim · factor dims of each head rotate, as
 * halves of that part, and the rest pass through (transformers' glm4_moe
 * apply_rotary_pos_emb); the frequencies are those of a head that wide.
 *
 * Sliding windows: a window W lets the query at position i attend to the keys at
 * positions j with i - W < j <= i, W keys counting its own. That is transformers'
 * masking_utils.py (sliding_window_overlay: kv_idx > q_idx - sliding_window) for prefill,
 * and the same set in decode, where cache_utils.py's DynamicSlidingWindowLayer keeps the
 * W - 1 latest keys between calls and appends the new one. The backends start at key
 * pos - W + 1 (fmoe__attn_args.window); fmoe keeps every key in its cache and skips the
 * older ones rather than evicting them. Which layers slide is the family's rule below.
 * The tiny checkpoints mixtral_swa, qwen2_moe_swa and qwen3_moe_swa
 * (tests/python/make_tiny_models.py) check both against transformers end to end, in
 * prefill and in token-by-token decode.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "model_impl.h"
#include "rowwise.h"

static const cJSON *get(const cJSON *obj, const char *key) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    return it && !cJSON_IsNull(it) ? it : NULL;
}

static int get_bool(const cJSON *obj, const char *key, int def, int32_t *out) {
    const cJSON *it = get(obj, key);
    if (!it) {
        *out = def;
        return 0;
    }
    FMOE_RETURN_ERROR_IF(!cJSON_IsBool(it), FMOE_EFORMAT, "%s must be a boolean", key);
    *out = cJSON_IsTrue(it);
    return 0;
}

static int get_num(const cJSON *obj, const char *prefix, const char *key, double def,
                   double *out) {
    const cJSON *it = get(obj, key);
    if (!it) {
        *out = def;
        return 0;
    }
    FMOE_RETURN_ERROR_IF(!cJSON_IsNumber(it) || !isfinite(it->valuedouble), FMOE_EFORMAT,
                         "%s%s must be a number", prefix, key);
    *out = it->valuedouble;
    return 0;
}

/* A window in tokens: a positive integer, or absent/null for none. */
static int get_window(const cJSON *obj, int32_t *out) {
    const cJSON *it = get(obj, "sliding_window");
    *out = 0;
    if (!it) return 0;
    FMOE_RETURN_ERROR_IF(!cJSON_IsNumber(it) || it->valuedouble < 0 ||
                             it->valuedouble != floor(it->valuedouble) ||
                             it->valuedouble > 2147483647.0,
                         FMOE_EFORMAT, "sliding_window must be a non-negative integer");
    *out = (int32_t)it->valuedouble;
    return 0;
}

/* A longrope factor list: `n` positive numbers. */
static int get_factors(const cJSON *obj, const char *prefix, const char *key, int32_t n,
                       double *out) {
    const cJSON *a = get(obj, key);
    FMOE_RETURN_ERROR_IF(!cJSON_IsArray(a) || cJSON_GetArraySize(a) != n ||
                             n > FMOE__ROPE_MAX_FACTORS,
                         FMOE_EFORMAT, "%s%s must be a list of head_dim/2 = %d numbers", prefix,
                         key, n);
    int32_t i = 0;
    for (const cJSON *it = a->child; it; it = it->next, i++) {
        FMOE_RETURN_ERROR_IF(!cJSON_IsNumber(it) || !(it->valuedouble > 0) ||
                                 !isfinite(it->valuedouble),
                             FMOE_EFORMAT, "%s%s[%d] must be a positive number", prefix, key, i);
        out[i] = it->valuedouble;
    }
    return 0;
}

/* partial_rotary_factor: 1 (every dim rotates) for every family but GLM-4.5, whose
 * configuration_glm4_moe defaults it to 0.5 and whose attention rotates the first
 * head_dim · factor dims of each head (fmoe__arch.rope_dim). */
static int check_partial(const fmoe_model_geometry *g, const char *prefix, double prf) {
    if (g->family == FMOE_FAMILY_GLM4_MOE) {
        const double dim = floor((double)g->head_dim * prf); /* int() in transformers */
        FMOE_RETURN_ERROR_IF(!(prf > 0 && prf <= 1) || dim < 2 || fmod(dim, 2.0) != 0,
                             FMOE_EFORMAT,
                             "%spartial_rotary_factor = %g: head_dim %d times it must be an "
                             "even number of dims in [2, head_dim]",
                             prefix, prf, g->head_dim);
        return 0;
    }
    FMOE_RETURN_ERROR_IF(prf != 1.0, FMOE_EUNSUPPORTED,
                         "%spartial_rotary_factor = %g is not supported for %s (only 1)",
                         prefix, prf, g->model_type);
    return 0;
}

/* `partial`: the rotary factor, rope_parameters' over the top level's over the family's
 * default (transformers 5 moves the top-level key into rope_parameters). */
static int parse_rope(const cJSON *root, const fmoe_model_geometry *g, fmoe__rope *r,
                      double *partial) {
    memset(r, 0, sizeof *r);
    r->type = FMOE__ROPE_DEFAULT;
    r->theta = g->rope_theta;
    r->factor = 1.0;
    r->max_position = g->max_position_embeddings;
    r->attention_factor = 1.0;
    r->truncate = 1;

    /* Zero or negative would give inf/NaN angles and silently garbage text;
     * transformers would divide by it without a word. */
    FMOE_RETURN_ERROR_IF(!(r->theta > 0), FMOE_EFORMAT,
                         "rope_theta = %g, expected a positive number", r->theta);
    const double prf_default = g->family == FMOE_FAMILY_GLM4_MOE ? 0.5 : 1.0;
    FMOE_FORWARD_IF_ERROR(get_num(root, "", "partial_rotary_factor", prf_default, partial));
    FMOE_FORWARD_IF_ERROR(check_partial(g, "", *partial));

    const char *prefix = "rope_parameters.";
    const cJSON *rp = get(root, "rope_parameters");
    if (!rp) {
        rp = get(root, "rope_scaling");
        prefix = "rope_scaling.";
    }
    if (!rp) return 0;
    FMOE_RETURN_ERROR_IF(!cJSON_IsObject(rp), FMOE_EFORMAT, "%.*s must be an object",
                         (int)strlen(prefix) - 1, prefix);
    for (const cJSON *c = rp->child; c; c = c->next)
        FMOE_RETURN_ERROR_IF(cJSON_IsObject(c), FMOE_EUNSUPPORTED,
                             "%s%s: rope parameters per layer type are not supported", prefix,
                             c->string);
    const cJSON *t = get(rp, "rope_type");
    if (!t) t = get(rp, "type");
    const char *type = "default";
    if (t) {
        FMOE_RETURN_ERROR_IF(!cJSON_IsString(t), FMOE_EFORMAT, "%srope_type must be a string",
                             prefix);
        type = t->valuestring;
    }
    FMOE_FORWARD_IF_ERROR(get_num(rp, prefix, "rope_theta", r->theta, &r->theta));
    FMOE_RETURN_ERROR_IF(!(r->theta > 0), FMOE_EFORMAT,
                         "%srope_theta = %g, expected a positive number", prefix, r->theta);
    FMOE_FORWARD_IF_ERROR(get_num(rp, prefix, "partial_rotary_factor", *partial, partial));
    FMOE_FORWARD_IF_ERROR(check_partial(g, prefix, *partial));
    double omp_root;
    FMOE_FORWARD_IF_ERROR(get_num(root, "", "original_max_position_embeddings",
                                  (double)g->max_position_embeddings, &omp_root));
    double omp;
    FMOE_FORWARD_IF_ERROR(get_num(rp, prefix, "original_max_position_embeddings", omp_root, &omp));
    r->original_max_position = (int64_t)omp;

    if (strcmp(type, "default") == 0) {
        r->type = FMOE__ROPE_DEFAULT;
    } else if (strcmp(type, "linear") == 0 || strcmp(type, "dynamic") == 0) {
        r->type = type[0] == 'l' ? FMOE__ROPE_LINEAR : FMOE__ROPE_DYNAMIC;
        FMOE_RETURN_ERROR_IF(!get(rp, "factor"), FMOE_EFORMAT, "%sfactor is missing", prefix);
        FMOE_FORWARD_IF_ERROR(get_num(rp, prefix, "factor", 1.0, &r->factor));
    } else if (strcmp(type, "yarn") == 0) {
        r->type = FMOE__ROPE_YARN;
        FMOE_FORWARD_IF_ERROR(get_num(rp, prefix, "factor",
                                      (double)r->max_position / (double)r->original_max_position,
                                      &r->factor));
        double af, ms, msa;
        FMOE_FORWARD_IF_ERROR(get_num(rp, prefix, "attention_factor", NAN, &af));
        FMOE_FORWARD_IF_ERROR(get_num(rp, prefix, "mscale", 0.0, &ms));
        FMOE_FORWARD_IF_ERROR(get_num(rp, prefix, "mscale_all_dim", 0.0, &msa));
        FMOE_FORWARD_IF_ERROR(get_num(rp, prefix, "beta_fast", 32.0, &r->beta_fast));
        FMOE_FORWARD_IF_ERROR(get_num(rp, prefix, "beta_slow", 1.0, &r->beta_slow));
        if (r->beta_fast == 0) r->beta_fast = 32.0; /* `or 32` in transformers */
        if (r->beta_slow == 0) r->beta_slow = 1.0;
        int32_t trunc;
        FMOE_FORWARD_IF_ERROR(get_bool(rp, "truncate", 1, &trunc));
        r->truncate = trunc;
#define MSCALE(s, m) ((s) <= 1.0 ? 1.0 : 0.1 * (m) * log(s) + 1.0)
        if (!isnan(af))
            r->attention_factor = af;
        else if (ms != 0.0 && msa != 0.0)
            r->attention_factor = MSCALE(r->factor, ms) / MSCALE(r->factor, msa);
        else
            r->attention_factor = MSCALE(r->factor, 1.0);
#undef MSCALE
    } else if (strcmp(type, "llama3") == 0) {
        r->type = FMOE__ROPE_LLAMA3;
        FMOE_FORWARD_IF_ERROR(get_num(rp, prefix, "factor", 8.0, &r->factor));
        FMOE_FORWARD_IF_ERROR(get_num(rp, prefix, "low_freq_factor", 1.0, &r->low_freq_factor));
        FMOE_FORWARD_IF_ERROR(
            get_num(rp, prefix, "high_freq_factor", 4.0, &r->high_freq_factor));
        FMOE_RETURN_ERROR_IF(r->high_freq_factor == r->low_freq_factor, FMOE_EFORMAT,
                             "%shigh_freq_factor equals low_freq_factor", prefix);
    } else if (strcmp(type, "longrope") == 0 || strcmp(type, "su") == 0) {
        /* modeling_phimoe takes the mscales as given (configuration_phimoe requires
         * them); other families' longrope derives an attention factor instead */
        FMOE_RETURN_ERROR_IF(g->family != FMOE_FAMILY_PHIMOE, FMOE_EUNSUPPORTED,
                             "%srope_type \"%s\" is not supported for %s (phimoe only)",
                             prefix, type, g->model_type);
        r->type = FMOE__ROPE_LONGROPE;
        FMOE_FORWARD_IF_ERROR(get_factors(rp, prefix, "short_factor", g->head_dim / 2,
                                          r->short_factor));
        FMOE_FORWARD_IF_ERROR(get_factors(rp, prefix, "long_factor", g->head_dim / 2,
                                          r->long_factor));
        FMOE_RETURN_ERROR_IF(!get(rp, "short_mscale") || !get(rp, "long_mscale"),
                             FMOE_EFORMAT, "%sshort_mscale and long_mscale are required",
                             prefix);
        FMOE_FORWARD_IF_ERROR(get_num(rp, prefix, "short_mscale", 1.0, &r->short_mscale));
        FMOE_FORWARD_IF_ERROR(get_num(rp, prefix, "long_mscale", 1.0, &r->long_mscale));
        FMOE_RETURN_ERROR_IF(r->original_max_position <= 0, FMOE_EFORMAT,
                             "%soriginal_max_position_embeddings must be positive", prefix);
    } else {
        return fmoe_error_set(FMOE_EUNSUPPORTED,
                              "%srope_type \"%.32s\" is not supported (supported: default, "
                              "linear, dynamic, yarn, llama3, longrope)",
                              prefix, type);
    }
    FMOE_RETURN_ERROR_IF(r->type != FMOE__ROPE_DEFAULT && r->type != FMOE__ROPE_LONGROPE &&
                             !(r->factor > 0),
                         FMOE_EFORMAT,
                         "%sfactor must be positive", prefix);
    FMOE_RETURN_ERROR_IF(r->type == FMOE__ROPE_DYNAMIC && floor(g->head_dim * *partial) <= 2,
                         FMOE_EFORMAT, "dynamic rope needs more than 2 rotated dims per head");
    return 0;
}

/* Most rotary dims per MLA head (runtime/cpu/cpu_mla.c's bound; DeepSeek: 64). */
#define MLA_MAX_ROPE 512

/*
 * DeepSeek-V2/V3 (transformers' deepseek_v2, deepseek_v3): multi-head latent attention
 * (mla.c) and the grouped router. No biases on the attention projections
 * (attention_bias true is refused); the rope covers the qk_rope_head_dim decoupled dims,
 * which come as adjacent pairs (rope_interleave, V3's key, default true; V2 always). The
 * gate renormalises with transformers' 1e-20 guard; V3's noaux_tc ranks a group by the
 * sum of its two best biased scores, V2's group_limited_greedy by its best.
 */
static int parse_mla(const cJSON *root, const fmoe_model_geometry *g, fmoe__arch *out) {
    int32_t bias = 0, inter = 1;
    FMOE_FORWARD_IF_ERROR(get_bool(root, "attention_bias", 0, &bias));
    FMOE_RETURN_ERROR_IF(bias, FMOE_EUNSUPPORTED,
                         "attention_bias true is not supported for %s (the published "
                         "checkpoints have none)", g->model_type);
    FMOE_RETURN_ERROR_IF(g->kv_lora_rank <= 0 || g->qk_rope_head_dim <= 0 ||
                             g->qk_rope_head_dim % 2 != 0 || g->qk_rope_head_dim > MLA_MAX_ROPE ||
                             g->qk_nope_head_dim < 0 || g->v_head_dim <= 0,
                         FMOE_EFORMAT,
                         "%s: kv_lora_rank %d, qk_rope_head_dim %d, qk_nope_head_dim %d, "
                         "v_head_dim %d: expected positive sizes, an even rope dim <= %d",
                         g->model_type, g->kv_lora_rank, g->qk_rope_head_dim,
                         g->qk_nope_head_dim, g->v_head_dim, MLA_MAX_ROPE);
    FMOE_RETURN_ERROR_IF(g->n_group > FMOE_ROUTE_MAX_GROUPS, FMOE_EUNSUPPORTED,
                         "n_group = %d: at most %d expert groups are supported", g->n_group,
                         FMOE_ROUTE_MAX_GROUPS);
    if (g->family == FMOE_FAMILY_DEEPSEEK_V3)
        FMOE_FORWARD_IF_ERROR(get_bool(root, "rope_interleave", 1, &inter));
    out->mla = 1;
    out->rope_interleave = inter;
    /* transformers' deepseek_v2 gate scales the top-k scores and never renormalises them
     * (every published V2 config has norm_topk_prob false, where the authors' code
     * agrees); V3's renormalises per norm_topk_prob. */
    if (g->family == FMOE_FAMILY_DEEPSEEK_V2) out->route_norm = 0;
    out->route_norm_eps = 1e-20f;
    out->route_group_top2 = strcmp(g->topk_method, "noaux_tc") == 0;
    return 0;
}

/* The MLA softmax scale: 1/sqrt(dn + dr), times mscale(factor, mscale_all_dim)² when the
 * rope is scaled (any type but default, as transformers' yarn_apply_mscale) with
 * mscale_all_dim set: YaRN's temperature applied to q·k, while the rope's own attention
 * factor (1 when mscale equals mscale_all_dim, as in DeepSeek-V3's config) scales cos/sin. */
static void mla_scale(const cJSON *root, const fmoe_model_geometry *g, fmoe__arch *out) {
    double scale = 1.0 / sqrt((double)(g->qk_nope_head_dim + g->qk_rope_head_dim));
    const cJSON *rp = get(root, "rope_parameters");
    if (!rp) rp = get(root, "rope_scaling");
    if (out->rope.type != FMOE__ROPE_DEFAULT && rp) {
        double msa = 0.0;
        if (get_num(rp, "", "mscale_all_dim", 0.0, &msa) < 0) {
            fmoe_error_clear();
            msa = 0.0;
        }
        const double f = out->rope.factor;
        if (msa != 0.0 && f > 1.0) {
            const double ms = 0.1 * msa * log(f) + 1.0;
            scale *= ms * ms;
        }
    }
    out->mla_scale = (float)scale;
}

/*
 * gpt-oss (transformers' modeling_gpt_oss, configuration_gpt_oss): biases on q/k/v/o
 * (attention_bias, default true); a sink logit per head; sliding_window (128) on the
 * layers layer_types marks "sliding_attention", by default the even ones (i + 1 odd);
 * experts with the clamped SwiGLU of swiglu_alpha (1.702) and swiglu_limit (7.0). The
 * router softmaxes its top-k logits: the renormalised top k of the full softmax, the
 * same weights (route_norm, whatever norm_topk_prob says).
 */
static int parse_gpt_oss_arch(const cJSON *root, const fmoe_model_geometry *g,
                              fmoe__arch *out) {
    int32_t bias = 1, window = 0;
    FMOE_FORWARD_IF_ERROR(get_bool(root, "attention_bias", 1, &bias));
    out->attn_bias_qkv = out->attn_bias_o = bias;
    out->attn_sinks = 1;
    out->route_norm = 1;
    double alpha, limit;
    FMOE_FORWARD_IF_ERROR(get_num(root, "", "swiglu_alpha", 1.702, &alpha));
    FMOE_FORWARD_IF_ERROR(get_num(root, "", "swiglu_limit", 7.0, &limit));
    FMOE_RETURN_ERROR_IF(!(limit > 0), FMOE_EFORMAT, "swiglu_limit = %g, expected > 0", limit);
    out->glu_alpha = (float)alpha;
    out->glu_limit = (float)limit;
    FMOE_FORWARD_IF_ERROR(get_window(root, &window));
    const cJSON *lt = get(root, "layer_types");
    FMOE_RETURN_ERROR_IF(lt && (!cJSON_IsArray(lt) ||
                                cJSON_GetArraySize(lt) != g->num_hidden_layers),
                         FMOE_EFORMAT, "layer_types must be a list of %d strings",
                         g->num_hidden_layers);
    for (int32_t i = 0; i < g->num_hidden_layers; i++) {
        int sliding = (i + 1) % 2;
        if (lt) {
            const cJSON *it = cJSON_GetArrayItem(lt, i);
            FMOE_RETURN_ERROR_IF(!cJSON_IsString(it) ||
                                     (strcmp(it->valuestring, "sliding_attention") != 0 &&
                                      strcmp(it->valuestring, "full_attention") != 0),
                                 FMOE_EFORMAT,
                                 "layer_types[%d] must be \"sliding_attention\" or "
                                 "\"full_attention\"", i);
            sliding = strcmp(it->valuestring, "sliding_attention") == 0;
        }
        out->sliding_window[i] = sliding ? window : 0;
    }
    return 0;
}

/*
 * GLM-4.5 (transformers' glm4_moe): grouped-query attention with q/k/v biases
 * (attention_bias; none on o), RMSNorm per head on q and k when use_qk_norm, and a partial
 * rotary embedding (parse_rope); DeepSeek-V3's router (sigmoid scores, the
 * e_score_correction_bias for selection, groups ranked by their two best, the 1e-20 guard
 * when renormalising) and shared experts added without a gate.
 */
static int parse_glm4_moe(const cJSON *root, fmoe__arch *out) {
    int32_t bias = 0, qk_norm = 0;
    FMOE_FORWARD_IF_ERROR(get_bool(root, "attention_bias", 0, &bias));
    FMOE_FORWARD_IF_ERROR(get_bool(root, "use_qk_norm", 0, &qk_norm));
    out->attn_bias_qkv = bias;
    out->qk_norm = qk_norm ? FMOE__QK_NORM_HEAD : FMOE__QK_NORM_NONE;
    out->route_norm_eps = 1e-20f;
    out->route_group_top2 = 1;
    return 0;
}

/*
 * Llama 4 (transformers' configuration_llama4, modeling_llama4; family_llama4.c has the
 * maths). no_rope_layers[i] is 1 where layer i USES the rotary embedding (the name says
 * the opposite); absent or empty, every no_rope_layer_interval-th layer (default 4) goes
 * without. layer_types (default: "chunked_attention" on the rotary layers, else
 * "full_attention") picks the mask, chunks of attention_chunk_size (8192; null: none).
 * use_qk_norm (true): the rotary layers' weightless L2 norm of q and k per head.
 * attn_temperature_tuning (true) with attn_scale (0.1) and floor_scale (8192): the NoPE
 * layers' query scale. attention_bias (false) on q/k/v/o. The router's weights are not
 * renormalised and multiply the experts' inputs. Rope scaling must keep cos/sin unscaled
 * (the L2 norm is applied before the rotation here, after it in transformers: the same
 * only for a pure rotation), so yarn is refused; Scout's llama3 is one.
 */
static int parse_llama4_arch(const cJSON *root, const fmoe_model_geometry *g,
                             fmoe__arch *out) {
    const int32_t n = g->num_hidden_layers;
    int32_t bias = 0, qk = 1, tuning = 1;
    FMOE_FORWARD_IF_ERROR(get_bool(root, "attention_bias", 0, &bias));
    FMOE_FORWARD_IF_ERROR(get_bool(root, "use_qk_norm", 1, &qk));
    FMOE_FORWARD_IF_ERROR(get_bool(root, "attn_temperature_tuning", 1, &tuning));
    double interval, chunk, attn_scale, floor_scale;
    FMOE_FORWARD_IF_ERROR(get_num(root, "", "no_rope_layer_interval", 4, &interval));
    /* absent: 8192; null: no chunking */
    const int chunk_key = cJSON_GetObjectItemCaseSensitive(root, "attention_chunk_size") != NULL;
    FMOE_FORWARD_IF_ERROR(get_num(root, "", "attention_chunk_size", chunk_key ? 0 : 8192, &chunk));
    FMOE_FORWARD_IF_ERROR(get_num(root, "", "attn_scale", 0.1, &attn_scale));
    FMOE_FORWARD_IF_ERROR(get_num(root, "", "floor_scale", 8192, &floor_scale));
    FMOE_RETURN_ERROR_IF(interval < 1 || interval != floor(interval), FMOE_EFORMAT,
                         "no_rope_layer_interval = %g, expected a positive integer", interval);
    FMOE_RETURN_ERROR_IF(chunk < 0 || chunk != floor(chunk) || chunk > 2147483647.0,
                         FMOE_EFORMAT,
                         "attention_chunk_size = %g, expected a non-negative integer", chunk);
    FMOE_RETURN_ERROR_IF(tuning && !(floor_scale > 0), FMOE_EFORMAT,
                         "floor_scale = %g, expected a positive number", floor_scale);
    out->layer_nope = calloc((size_t)n, sizeof *out->layer_nope);
    out->attn_chunk = calloc((size_t)n, sizeof *out->attn_chunk);
    FMOE_RETURN_ERROR_IF(!out->layer_nope || !out->attn_chunk, FMOE_ENOMEM, "out of memory");
    const cJSON *nr = get(root, "no_rope_layers"), *lt = get(root, "layer_types");
    if (nr && cJSON_IsArray(nr) && cJSON_GetArraySize(nr) == 0) nr = NULL; /* `or` default */
    FMOE_RETURN_ERROR_IF(nr && (!cJSON_IsArray(nr) || cJSON_GetArraySize(nr) != n),
                         FMOE_EFORMAT, "no_rope_layers must be a list of %d integers", n);
    FMOE_RETURN_ERROR_IF(lt && (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != n),
                         FMOE_EFORMAT, "layer_types must be a list of %d strings", n);
    for (int32_t i = 0; i < n; i++) {
        int rope = (i + 1) % (int32_t)interval != 0;
        if (nr) {
            const cJSON *it = cJSON_GetArrayItem(nr, i);
            FMOE_RETURN_ERROR_IF(!cJSON_IsNumber(it) && !cJSON_IsBool(it), FMOE_EFORMAT,
                                 "no_rope_layers[%d] must be 0 or 1", i);
            rope = cJSON_IsBool(it) ? cJSON_IsTrue(it) : it->valuedouble != 0;
        }
        int chunked = rope;
        if (lt) {
            const cJSON *it = cJSON_GetArrayItem(lt, i);
            FMOE_RETURN_ERROR_IF(!cJSON_IsString(it) ||
                                     (strcmp(it->valuestring, "chunked_attention") != 0 &&
                                      strcmp(it->valuestring, "full_attention") != 0),
                                 FMOE_EFORMAT,
                                 "layer_types[%d] must be \"chunked_attention\" or "
                                 "\"full_attention\"", i);
            chunked = strcmp(it->valuestring, "chunked_attention") == 0;
        }
        out->layer_nope[i] = !rope;
        out->attn_chunk[i] = chunked ? (int32_t)chunk : 0;
    }
    out->attn_bias_qkv = out->attn_bias_o = bias;
    out->qk_norm = qk ? FMOE__QK_NORM_HEAD : FMOE__QK_NORM_NONE;
    out->attn_temp_scale = tuning ? (float)attn_scale : 0.0f;
    out->attn_floor_scale = (float)floor_scale;
    out->scale_expert_input = 1;
    out->route_norm = 0;
    return 0;
}

static const char *rope_name(fmoe__rope_type t) {
    switch (t) {
    case FMOE__ROPE_DEFAULT: return "default";
    case FMOE__ROPE_LINEAR: return "linear";
    case FMOE__ROPE_DYNAMIC: return "dynamic";
    case FMOE__ROPE_YARN: return "yarn";
    case FMOE__ROPE_LLAMA3: return "llama3";
    case FMOE__ROPE_LONGROPE: return "longrope";
    case FMOE__ROPE_FACTORS: return "rope_freqs";
    }
    return "?";
}

int fmoe__arch_parse(const char *json, size_t len, const fmoe_model_geometry *g,
                     fmoe__arch *out) {
    memset(out, 0, sizeof *out);
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return fmoe_error_set(FMOE_EFORMAT, "malformed JSON");
    }
    int rc = 0;
    /* llama4 (the multimodal checkpoints) keeps the text model's keys under text_config;
     * the rest of its config (vision) is not read */
    const cJSON *whole = root;
    const cJSON *tc = get(whole, "text_config");
    if (g->family == FMOE_FAMILY_LLAMA4 && tc && cJSON_IsObject(tc)) root = (cJSON *)tc;
    const int32_t n = g->num_hidden_layers;
    out->sliding_window = calloc((size_t)n, sizeof *out->sliding_window);
    if (!out->sliding_window) {
        rc = fmoe_error_set(FMOE_ENOMEM, "out of memory");
        goto done;
    }

    const cJSON *act = get(root, "hidden_act");
    if (!act) act = get(root, "hidden_activation");
    if (act && (!cJSON_IsString(act) || (strcmp(act->valuestring, "silu") != 0 &&
                                         strcmp(act->valuestring, "swish") != 0))) {
        rc = fmoe_error_set(FMOE_EUNSUPPORTED,
                            "hidden_act \"%.32s\" is not supported (experts are SwiGLU: silu)",
                            cJSON_IsString(act) ? act->valuestring : "?");
        goto done;
    }

    int32_t bias = 0, window = 0, use_sliding = 0;
    out->route_norm = g->norm_topk_prob;
    switch (g->family) {
    case FMOE_FAMILY_MIXTRAL:
        /* modeling_mixtral: no biases; sliding_window (null in the published configs)
         * applies to every layer (one sliding mask for all of them). */
        if ((rc = get_window(root, &window)) < 0) goto done;
        for (int32_t i = 0; i < n; i++) out->sliding_window[i] = window;
        break;
    case FMOE_FAMILY_QWEN2_MOE: {
        /* modeling_qwen2_moe: q/k/v biases per qkv_bias (default true), none on o; a
         * sliding window only with use_sliding_window, on the layers layer_types marks
         * "sliding_attention" (without it, configuration_qwen2_moe.py's rule: layers i
         * with i + 1 odd, i.e. 0, 2, 4..., below max_window_layers, default 28). */
        if ((rc = get_bool(root, "qkv_bias", 1, &out->attn_bias_qkv)) < 0) goto done;
        if ((rc = get_bool(root, "use_sliding_window", 0, &use_sliding)) < 0) goto done;
        if ((rc = get_window(root, &window)) < 0) goto done;
        out->shared_gate = g->num_shared_experts > 0;
        if (use_sliding && window > 0) {
            const cJSON *lt = get(root, "layer_types");
            double mwl;
            if ((rc = get_num(root, "", "max_window_layers", 28, &mwl)) < 0) goto done;
            for (int32_t i = 0; i < n; i++) {
                int sliding = (i + 1) % 2 && i < mwl;
                if (cJSON_IsArray(lt) && i < cJSON_GetArraySize(lt)) {
                    const cJSON *it = cJSON_GetArrayItem(lt, i);
                    sliding = cJSON_IsString(it) && strcmp(it->valuestring, "sliding_attention") == 0;
                }
                out->sliding_window[i] = sliding ? window : 0;
            }
        }
        break;
    }
    case FMOE_FAMILY_QWEN3_MOE:
        /* modeling_qwen3_moe: attention_bias on q/k/v/o (default false); RMSNorm per head
         * on q and k; sliding_window on every layer iff use_sliding_window. */
        if ((rc = get_bool(root, "attention_bias", 0, &bias)) < 0) goto done;
        out->attn_bias_qkv = out->attn_bias_o = bias;
        out->qk_norm = FMOE__QK_NORM_HEAD;
        if ((rc = get_bool(root, "use_sliding_window", 0, &use_sliding)) < 0) goto done;
        if ((rc = get_window(root, &window)) < 0) goto done;
        for (int32_t i = 0; i < n; i++) out->sliding_window[i] = use_sliding ? window : 0;
        break;
    case FMOE_FAMILY_OLMOE: {
        /* modeling_olmoe: attention_bias on q/k/v/o; RMSNorm over the whole q and k
         * projections, then clamp of q, k, v to clip_qkv when set. */
        if ((rc = get_bool(root, "attention_bias", 0, &bias)) < 0) goto done;
        out->attn_bias_qkv = out->attn_bias_o = bias;
        out->qk_norm = FMOE__QK_NORM_FULL;
        double clip;
        if ((rc = get_num(root, "", "clip_qkv", 0.0, &clip)) < 0) goto done;
        if (clip < 0) {
            rc = fmoe_error_set(FMOE_EFORMAT, "clip_qkv must be positive");
            goto done;
        }
        out->clip_qkv = (float)clip;
        break;
    }
    case FMOE_FAMILY_DEEPSEEK_V1:
        /* modeling_deepseek.py (V1): Llama attention with attention_bias on q/k/v/o; the
         * gate renormalises with a 1e-20 guard. */
        if ((rc = get_bool(root, "attention_bias", 0, &bias)) < 0) goto done;
        out->attn_bias_qkv = out->attn_bias_o = bias;
        out->route_norm_eps = 1e-20f;
        break;
    case FMOE_FAMILY_DEEPSEEK_V2:
    case FMOE_FAMILY_DEEPSEEK_V3:
        if ((rc = parse_mla(root, g, out)) < 0) goto done;
        break;
    case FMOE_FAMILY_PHIMOE: {
        /* modeling_phimoe: attention_bias on q/k/v/o; nn.LayerNorm (weight and bias, eps
         * rms_norm_eps) for every norm; lm_head_bias; sparsemixer top-2 routing with
         * router_jitter_noise (default 0.01) as its threshold; sliding_window on every
         * layer (null in Phi-3.5-MoE's config). */
        if ((rc = get_bool(root, "attention_bias", 0, &bias)) < 0) goto done;
        out->attn_bias_qkv = out->attn_bias_o = bias;
        if ((rc = get_bool(root, "lm_head_bias", 0, &out->lm_head_bias)) < 0) goto done;
        double jitter;
        if ((rc = get_num(root, "", "router_jitter_noise", 0.01, &jitter)) < 0) goto done;
        if (!(jitter >= 0)) {
            rc = fmoe_error_set(FMOE_EFORMAT, "router_jitter_noise must be >= 0");
            goto done;
        }
        out->layernorm = out->sparsemixer = 1;
        out->jitter_eps = (float)jitter;
        out->route_norm = 0;
        if ((rc = get_window(root, &window)) < 0) goto done;
        for (int32_t i = 0; i < n; i++) out->sliding_window[i] = window;
        break;
    }
    case FMOE_FAMILY_GPT_OSS:
        if ((rc = parse_gpt_oss_arch(root, g, out)) < 0) goto done;
        break;
    case FMOE_FAMILY_GLM4_MOE:
        if ((rc = parse_glm4_moe(root, out)) < 0) goto done;
        break;
    case FMOE_FAMILY_LLAMA4:
        if ((rc = parse_llama4_arch(root, g, out)) < 0) goto done;
        break;
    default:
        rc = fmoe_error_set(FMOE_EUNSUPPORTED, "model_type \"%s\" is not yet supported",
                            g->model_type);
        goto done;
    }
    /* RMSNorm divides by sqrt(mean(x^2) + eps): eps <= 0 can make that 0 or NaN. */
    if (!(g->rms_norm_eps > 0)) {
        rc = fmoe_error_set(FMOE_EFORMAT, "rms_norm_eps = %g, expected a positive number",
                            g->rms_norm_eps);
        goto done;
    }
    double partial = 1.0;
    if ((rc = parse_rope(root, g, &out->rope, &partial)) < 0) goto done;
    if (g->family == FMOE_FAMILY_LLAMA4 && out->rope.type == FMOE__ROPE_YARN) {
        rc = fmoe_error_set(FMOE_EUNSUPPORTED,
                            "rope_type yarn is not supported for llama4 (its cos/sin scale "
                            "would not commute with the QK L2 norm)");
        goto done;
    }
    out->rope_dim = out->mla ? g->qk_rope_head_dim : (int32_t)floor(g->head_dim * partial);
    if (out->mla) mla_scale(root, g, out);
    if (out->rope.type == FMOE__ROPE_DEFAULT && !out->mla && out->rope_dim < g->head_dim)
        snprintf(out->rope_desc, sizeof out->rope_desc, "rope theta %g on %d of %d dims",
                 out->rope.theta, out->rope_dim, g->head_dim);
    else if (out->rope.type == FMOE__ROPE_DEFAULT)
        snprintf(out->rope_desc, sizeof out->rope_desc, "rope theta %g", out->rope.theta);
    else if (out->rope.type == FMOE__ROPE_LONGROPE)
        snprintf(out->rope_desc, sizeof out->rope_desc, "rope theta %g, longrope past %lld",
                 out->rope.theta, (long long)out->rope.original_max_position);
    else
        snprintf(out->rope_desc, sizeof out->rope_desc, "rope theta %g, %s x%g",
                 out->rope.theta, rope_name(out->rope.type), out->rope.factor);
done:
    cJSON_Delete((cJSON *)whole);
    if (rc < 0) fmoe__arch_free(out);
    return rc;
}

void fmoe__arch_free(fmoe__arch *a) {
    if (!a) return;
    free(a->sliding_window);
    a->sliding_window = NULL;
    free(a->layer_nope);
    a->layer_nope = NULL;
    free(a->attn_chunk);
    a->attn_chunk = NULL;
}

void fmoe__rope_inv_freq(const fmoe__rope *r, int32_t head_dim, int64_t seq_len,
                         float *inv_freq, float *scale) {
    const int32_t half = head_dim / 2;
    const double dim = head_dim;
    double base = r->theta;
    *scale = 1.0f;
    if (r->type == FMOE__ROPE_DYNAMIC && seq_len > r->max_position) {
        const double f = r->factor;
        base = r->theta *
               pow(f * (double)seq_len / (double)r->max_position - (f - 1.0), dim / (dim - 2.0));
    }
    for (int32_t i = 0; i < half; i++) {
        const double pos_freq = pow(base, (double)(2 * i) / dim);
        double inv = 1.0 / pos_freq;
        switch (r->type) {
        case FMOE__ROPE_DEFAULT:
        case FMOE__ROPE_DYNAMIC: break;
        case FMOE__ROPE_LINEAR: inv /= r->factor; break;
        case FMOE__ROPE_FACTORS: inv /= r->short_factor[i]; break;
        case FMOE__ROPE_LONGROPE: {
            /* Microsoft's Phi-3.5-MoE code and transformers' _compute_longrope_parameters:
             * long factors once the call's sequence (largest position + 1) passes
             * original_max_position_embeddings, with modeling_phimoe's mscale switch */
            const int lng = seq_len > r->original_max_position;
            inv = 1.0 / ((lng ? r->long_factor[i] : r->short_factor[i]) * pos_freq);
            *scale = (float)(lng ? r->long_mscale : r->short_mscale);
            break;
        }
        case FMOE__ROPE_YARN: {
            /* transformers' _compute_yarn_parameters. */
            const double two_pi = 2.0 * M_PI, omp = (double)r->original_max_position;
            double low = dim * log(omp / (r->beta_fast * two_pi)) / (2.0 * log(r->theta));
            double high = dim * log(omp / (r->beta_slow * two_pi)) / (2.0 * log(r->theta));
            if (r->truncate) {
                low = floor(low);
                high = ceil(high);
            }
            if (low < 0) low = 0;
            if (high > dim - 1) high = dim - 1;
            if (low == high) high += 0.001;
            double ramp = ((double)i - low) / (high - low);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            const double extrapolation = 1.0 - ramp;
            inv = (1.0 / (r->factor * pos_freq)) * (1.0 - extrapolation) +
                  (1.0 / pos_freq) * extrapolation;
            *scale = (float)r->attention_factor;
            break;
        }
        case FMOE__ROPE_LLAMA3: {
            /* transformers' _compute_llama3_parameters. */
            const double old = (double)r->original_max_position;
            const double low_wl = old / r->low_freq_factor, high_wl = old / r->high_freq_factor;
            const double wl = 2.0 * M_PI / inv;
            if (wl > low_wl) {
                inv = inv / r->factor;
            } else if (wl >= high_wl) {
                const double smooth = (old / wl - r->low_freq_factor) /
                                      (r->high_freq_factor - r->low_freq_factor);
                inv = (1.0 - smooth) * inv / r->factor + smooth * inv;
            }
            break;
        }
        }
        inv_freq[i] = (float)inv;
    }
}
