/*
 * quantize.c - a HuggingFace MoE checkpoint written as a GGUF file (fmoe/quantize.h).
 *
 * Design. Three passes over a plan, never over the weights more than once:
 *   1. plan: every output tensor with its GGUF name, extents, ggml type and its source
 *      tensors in the checkpoint (the routed experts of a layer are J sources stacked into
 *      one [J][rows][cols] tensor, as llama.cpp's converter stacks them);
 *   2. header: key-value pairs and tensor infos into one memory buffer, with each
 *      tensor's offset in the data section (aligned to 32, GGUF's default);
 *   3. data: row by row, each source row widened to f32 and quantised (or copied as is
 *      when it keeps its dtype), into OUTPUT.partial, which is renamed at the end.
 *      Quantised matrices are done on the runtime's thread pool (write_tensor).
 * Memory: the header, one quantised source matrix and a row per thread; the checkpoint
 * stays in the page cache.
 *
 * Names, extents and metadata keys follow llama.cpp's converter (convert_hf_to_gguf.py and
 * gguf-py's constants), so that a file we write is laid out like one users have:
 * "blk.N.ffn_down_exps.weight" with extents [I, h, J] (innermost first), norms in F32,
 * the router (ffn_gate_inp) in F32. For the architectures whose GGUF RoPE is ggml's
 * "normal" (adjacent pairs: llama for Mixtral, deepseek), the converter permutes the rows
 * of q_proj and k_proj from HuggingFace's rotate-half order; we do the same (permute_row).
 * DeepSeek-V2/V3 are written as llama.cpp's deepseek2 (MLA tensors, kv_b_proj split into
 * attn_k_b/attn_v_b as its converter splits it today, the latent's key lengths) and GLM-4.5
 * as glm4moe (post_attention_norm; its multi-token-prediction layers are left out, as the
 * converter's --no-mtp leaves them). FP8 block-scaled sources (fp8_block.h) are
 * dequantised to f32 as they are written; gpt-oss's MXFP4 experts are copied as ggml
 * MXFP4 blocks, their numbers unchanged (add_gptoss_mxfp4); --type f32/f16/bf16 writes every matrix in that
 * float type (a conversion: nothing quantised).
 * config.json itself is kept in the key fmoe.hf_config, so fmoe can rebuild the exact
 * geometry and fingerprint of the checkpoint from the file.
 */
#include "fmoe/quantize.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "fmoe/error.h"
#include "files.h"
#include "fp8_block.h"
#include "fmoe/geometry.h"
#include "half.h"
#include "fmoe/quant.h"
#include "fmoe/safetensors.h"
#include "quant_block.h"
#include "quantize_imatrix.h"

#include "../backend/threadpool.h"

#define ALIGN 32
#define NAME_CAP 160

/* llama_ftype of a file whose weights are mostly `type` (llama.h). */
static uint32_t file_type(uint32_t type) {
    switch (type) {
    case FMOE_GGML_Q8_0: return 7;
    case FMOE_GGML_Q4_K: return 14; /* MOSTLY_Q4_K_S: every quantised tensor Q4_K */
    case FMOE_GGML_Q5_K: return 16; /* MOSTLY_Q5_K_S */
    case FMOE_GGML_Q6_K: return 18;
    case FMOE_GGML_Q4_0: return 2;
    case FMOE_GGML_Q4_1: return 3;
    case FMOE_GGML_Q5_0: return 8;
    case FMOE_GGML_Q5_1: return 9;
    case FMOE_GGML_IQ4_NL: return 25;
    case FMOE_GGML_Q2_K: return 10; /* MOSTLY_Q2_K (the name of its mix too) */
    case FMOE_GGML_Q3_K: return 11; /* MOSTLY_Q3_K_S: every quantised tensor Q3_K */
    case FMOE_GGML_IQ4_XS: return 30;
    case FMOE_GGML_IQ3_XXS: return 23; /* MOSTLY_IQ3_XXS */
    case FMOE_GGML_IQ3_S: return 26;   /* MOSTLY_IQ3_S */
    case FMOE_GGML_IQ2_S: return 28;   /* MOSTLY_IQ2_S */
    case FMOE_GGML_F16: return 1;   /* MOSTLY_F16 */
    case FMOE_GGML_BF16: return 32; /* MOSTLY_BF16 */
    default: return 0;              /* ALL_F32, and the unknown */
    }
}

/* ---------------------------------------------------------------------------------- */
/* The plan                                                                           */
/* ---------------------------------------------------------------------------------- */

typedef struct out_tensor {
    char name[64];
    int32_t ndim;
    int64_t ne[3];                 /* innermost first: [cols, rows, experts] */
    uint32_t type;
    const fmoe_st_tensor **src;    /* [nsrc] sources, each [rows][cols] (or [cols] for 1-D) */
    int32_t nsrc;
    int32_t permute_heads;         /* > 0: rows are heads of head_dim, rotate-half -> pairs */
    const struct strided *view;    /* NULL, or the sources read through this view */
    const fmoe_st_tensor *mx_scales; /* non-NULL: src[0] is MXFP4 blocks copied (repack_mxfp4) */
    int64_t mx_first, mx_step;     /* output row r of expert x is source row x·R + first + r·step */
    uint64_t offset;               /* in the data section */
    int64_t nbytes;
} out_tensor;

/*
 * An output tensor whose values are a strided gather of its source rather than its rows:
 * value (x, r, c) (x the expert or head, r the row, c the column of the output's
 * [ne2][ne1][ne0]) is source element off + x·e + r·row + c·col, x counted from the
 * source's index among the output's sources when there are several (each one expert).
 * What llama.cpp's converter does with a transpose, a split or a stride:
 *   deepseek2 attn_k_b [H][r][dn] from kv_b_proj [H(dn + dv)][r]: e = (dn + dv)·r, row 1,
 *     col r (each head's key rows transposed); attn_v_b [H][dv][r]: off dn·r, row r, col 1;
 *   gpt-oss's input-major fused experts [J][h][2I] (gate and up columns interleaved) to
 *     output-major ffn_{gate,up}_exps [J][I][h]: e = 2Ih, row 2, col 2I, off 0 / 1; down
 *     [J][I][h] to [J][h][I]: e = Ih, row 1, col h; biases [J][2I] to [J][I]: row 2I,
 *     col 2, off 0 / 1.
 */
typedef struct strided {
    int64_t off, e, row, col;
} strided;

typedef struct plan {
    const fmoe_safetensors *st;
    const fmoe_model_geometry *g;
    const char *dir;
    uint32_t type;
    fmoe_quant_mix mix;            /* FMOE_MIX_NONE: every quantised tensor in type */
    fmoe_quant_mix_model mixmodel; /* what the mix's rules look at */
    uint32_t experts_type;         /* 0, or the routed experts' type */
    int experts_only;
    int permute;                   /* the architecture wants q/k rows permuted */
    const cJSON *config;           /* config.json, for the keys the geometry lacks */
    int has_fp8;                   /* some source is F8_E4M3 (fp8_block.h) */
    strided kv_split[2];           /* deepseek2's attn_k_b, attn_v_b (the same every layer) */
    strided gptoss[5];             /* gpt-oss's gate, up, down, gate bias, up bias */
    strided llama4[3];             /* llama4's gate, up, down (the same every MoE layer) */
    const cJSON *text;             /* llama4: config.json's text_config, else config itself */
    fmoe_st_tensor made[2];        /* tensors computed from config.json (rope factors) */
    float *made_data[2];           /* [n] owned values of made[k] */
    out_tensor *t;
    int64_t n, cap;
    fmoe_quantize_report *report;
} plan;

/* --type f32/f16/bf16: every matrix in that float type, nothing quantised */
static int is_float_type(uint32_t t) {
    return t == FMOE_GGML_F32 || t == FMOE_GGML_F16 || t == FMOE_GGML_BF16;
}

static uint32_t ggml_of(fmoe_st_dtype d) {
    return d == FMOE_ST_F16 ? FMOE_GGML_F16 : d == FMOE_ST_BF16 ? FMOE_GGML_BF16 : FMOE_GGML_F32;
}

/* The checkpoint tensor called fmt..., or NULL (required: an error when absent). */
static int find(plan *p, int required, const fmoe_st_tensor **out, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int find(plan *p, int required, const fmoe_st_tensor **out, const char *fmt, ...) {
    char name[NAME_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    const fmoe_st_tensor *t = fmoe_safetensors_find(p->st, name);
    *out = t;
    if (!t) {
        FMOE_RETURN_ERROR_IF(required, FMOE_ENOTFOUND, "%s: missing tensor %s", p->dir, name);
        return 0;
    }
    /* FP8 block-scaled weights are dequantised as they are written (source_rows) */
    const int fp8 = t->dtype == FMOE_ST_F8_E4M3 && t->ndim == 2;
    FMOE_RETURN_ERROR_IF(t->dtype != FMOE_ST_F32 && t->dtype != FMOE_ST_F16 &&
                             t->dtype != FMOE_ST_BF16 && !fp8,
                         FMOE_EUNSUPPORTED,
                         "%s: tensor %s has dtype %s (F32, F16, BF16 or 2-D F8_E4M3 needed)",
                         t->file, name, fmoe_st_dtype_name(t->dtype));
    p->has_fp8 |= fp8;
    FMOE_RETURN_ERROR_IF(t->ndim < 1 || t->ndim > 2, FMOE_EUNSUPPORTED,
                         "%s: tensor %s has %d dimensions (1 or 2 expected)", t->file, name, t->ndim);
    return 1;
}

enum kind { KIND_NORM, KIND_ROUTER, KIND_WEIGHT, KIND_EXPERT };

/* A new zeroed output tensor at the plan's end reading the `n` sources `src`. */
static int push(plan *p, const fmoe_st_tensor **src, int32_t n, out_tensor **out) {
    if (p->n == p->cap) {
        const int64_t cap = p->cap ? p->cap * 2 : 256;
        out_tensor *t = realloc(p->t, (size_t)cap * sizeof *t);
        FMOE_RETURN_ERROR_IF(!t, FMOE_ENOMEM, "out of memory");
        p->t = t;
        p->cap = cap;
    }
    out_tensor *o = &p->t[p->n];
    memset(o, 0, sizeof *o);
    o->src = malloc((size_t)n * sizeof *o->src);
    FMOE_RETURN_ERROR_IF(!o->src, FMOE_ENOMEM, "out of memory");
    p->n++;
    memcpy(o->src, src, (size_t)n * sizeof *src);
    o->nsrc = n;
    *out = o;
    return 0;
}

/* Adds output `name` from `n` sources of one shape; chooses its type by kind. */
/* add(), or (view != NULL) a strided gather of the sources with extents `ne` (ndim 3 when
 * ne[2] > 1 or there are several sources, else 2). `view` must outlive the plan. */
static int add_shaped(plan *p, enum kind kind, const char *name, const fmoe_st_tensor **src,
                      int32_t n, int32_t permute_heads, const strided *view,
                      const int64_t ne[3]) {
    for (int32_t i = 1; i < n; i++)
        FMOE_RETURN_ERROR_IF(src[i]->ndim != src[0]->ndim || src[i]->shape[0] != src[0]->shape[0] ||
                                 (src[0]->ndim == 2 && src[i]->shape[1] != src[0]->shape[1]),
                             FMOE_EFORMAT, "%s: tensor %s differs in shape from %s", p->dir,
                             src[i]->name, src[0]->name);
    out_tensor *o;
    FMOE_FORWARD_IF_ERROR(push(p, src, n, &o));
    o->permute_heads = permute_heads;
    snprintf(o->name, sizeof o->name, "%s", name);
    const fmoe_st_tensor *s = src[0];
    if (s->ndim == 1) {
        o->ndim = 1;
        o->ne[0] = s->shape[0];
    } else {
        o->ndim = n > 1 || kind == KIND_EXPERT ? 3 : 2;
        o->ne[0] = s->shape[1];
        o->ne[1] = s->shape[0];
        o->ne[2] = n;
        if (o->ndim == 2) o->ne[2] = 1;
    }
    if (view) {
        o->view = view;
        o->ndim = ne[2] > 1 || n > 1 ? 3 : 2;
        memcpy(o->ne, ne, sizeof o->ne);
    }
    const uint32_t own = s->dtype == FMOE_ST_F8_E4M3 ? FMOE_GGML_BF16 : ggml_of(s->dtype);
    const int quantize = o->ndim >= 2 && kind != KIND_ROUTER && kind != KIND_NORM &&
                         (kind == KIND_EXPERT || !p->experts_only);
    if (o->ndim == 1 || kind == KIND_ROUTER || kind == KIND_NORM) {
        o->type = FMOE_GGML_F32;
    } else if (!quantize) {
        o->type = own;
    } else {
        /* the routed experts' own type, else the mix's rule for this tensor, else the
         * one type; then llama-quantize's fallback (fmoe_quant_fallback_type): a 32-value
         * block type where one fits, the checkpoint's float dtype where none does */
        const uint32_t want = kind == KIND_EXPERT && p->experts_type ? p->experts_type
                              : p->mix ? fmoe_quant_mix_type(p->mix, &p->mixmodel, name, o->ne[0])
                                       : p->type;
        const uint32_t f = is_float_type(want) ? want : fmoe_quant_fallback_type(want, o->ne[0]);
        o->type = is_float_type(want) ? want : f ? f : own; /* FMOE_GGML_F32 is 0 */
        if (is_float_type(f))
            ;
        else if (f == want)
            p->report->quantized++;
        else
            p->report->fallback++;
    }
    p->report->by_type[o->type]++;
    const int64_t rows = o->ndim == 1 ? 1 : o->ne[1] * o->ne[2];
    o->nbytes = rows * fmoe_quant_row_bytes(o->type, o->ne[0]);
    for (int32_t i = 0; i < n && !view; i++) /* views: their caller counts the source once */
        p->report->bytes_in += src[i]->nbytes;
    return 0;
}

static int add(plan *p, enum kind kind, const char *name, const fmoe_st_tensor **src, int32_t n,
               int32_t permute_heads) {
    return add_shaped(p, kind, name, src, n, permute_heads, NULL, NULL);
}

/* One checkpoint tensor into one output tensor; absent optional ones are skipped. */
static int add1(plan *p, enum kind kind, int required, int32_t permute_heads, const char *gguf,
                const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static int add1(plan *p, enum kind kind, int required, int32_t permute_heads, const char *gguf,
                const char *fmt, ...) {
    char name[NAME_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    const fmoe_st_tensor *t;
    const int rc = find(p, required, &t, "%s", name);
    if (rc <= 0) return rc;
    return add(p, kind, gguf, &t, 1, permute_heads);
}

/* A SwiGLU MLP `prefix`.{gate,up,down}_proj.weight as blk.i.ffn_{gate,up,down}SUFFIX. */
static int add_mlp(plan *p, int32_t i, const char *prefix, const char *suffix) {
    static const char *const hf[3] = {"gate_proj", "up_proj", "down_proj"};
    static const char *const gg[3] = {"gate", "up", "down"};
    for (int k = 0; k < 3; k++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%d.ffn_%s%s.weight", i, gg[k], suffix);
        FMOE_FORWARD_IF_ERROR(add1(p, KIND_WEIGHT, 1, 0, name, "%s.%s.weight", prefix, hf[k]));
    }
    return 0;
}

static int add_experts(plan *p, int32_t i) {
    const fmoe_model_geometry *g = p->g;
    /* Phi-3.5-MoE names its experts as Mixtral does (block_sparse_moe, w1/w3/w2) */
    const int mixtral = g->family == FMOE_FAMILY_MIXTRAL || g->family == FMOE_FAMILY_PHIMOE;
    const char *moe = mixtral ? "block_sparse_moe" : "mlp";
    const fmoe_st_tensor *probe;
    if (mixtral && !fmoe_safetensors_find(p->st, "model.layers.0.block_sparse_moe.gate.weight") &&
        fmoe_safetensors_find(p->st, "model.layers.0.mlp.gate.weight"))
        moe = "mlp"; /* transformers >= 5 may save Mixtral's block as "mlp" */
    FMOE_FORWARD_IF_ERROR(find(p, 0, &probe, "model.layers.%d.%s.experts.gate_up_proj", i, moe));
    FMOE_RETURN_ERROR_IF(probe != NULL, FMOE_EUNSUPPORTED,
                         "%s: layer %d stores its experts fused (experts.gate_up_proj); fmoe "
                         "quantize reads one tensor per expert projection",
                         p->dir, i);
    char name[64];
    snprintf(name, sizeof name, "blk.%d.ffn_gate_inp.weight", i);
    FMOE_FORWARD_IF_ERROR(
        add1(p, KIND_ROUTER, 1, 0, name, "model.layers.%d.%s.gate.weight", i, moe));
    /* DeepSeek-V3's and GLM-4.5's selection bias (noaux_tc) */
    snprintf(name, sizeof name, "blk.%d.exp_probs_b.bias", i);
    FMOE_FORWARD_IF_ERROR(add1(p, KIND_NORM, 0, 0, name,
                               "model.layers.%d.%s.gate.e_score_correction_bias", i, moe));
    static const char *const hf[3] = {"gate_proj", "up_proj", "down_proj"};
    static const char *const mx[3] = {"w1", "w3", "w2"};
    static const char *const gg[3] = {"gate", "up", "down"};
    const fmoe_st_tensor **src = malloc((size_t)g->num_experts * sizeof *src);
    FMOE_RETURN_ERROR_IF(!src, FMOE_ENOMEM, "out of memory");
    int rc = 0;
    for (int k = 0; k < 3 && rc == 0; k++) {
        for (int32_t e = 0; e < g->num_experts && rc >= 0; e++)
            rc = find(p, 1, &src[e], "model.layers.%d.%s.experts.%d.%s.weight", i, moe, e,
                      mixtral ? mx[k] : hf[k]);
        if (rc < 0) break;
        snprintf(name, sizeof name, "blk.%d.ffn_%s_exps.weight", i, gg[k]);
        rc = add(p, KIND_EXPERT, name, src, g->num_experts, 0);
    }
    free(src);
    FMOE_FORWARD_IF_ERROR(rc);
    if (g->num_shared_experts > 0 && g->shared_intermediate_size > 0) {
        char prefix[NAME_CAP];
        if (g->family == FMOE_FAMILY_QWEN2_MOE) {
            snprintf(prefix, sizeof prefix, "model.layers.%d.mlp.shared_expert", i);
            FMOE_FORWARD_IF_ERROR(add_mlp(p, i, prefix, "_shexp"));
            snprintf(name, sizeof name, "blk.%d.ffn_gate_inp_shexp.weight", i);
            FMOE_FORWARD_IF_ERROR(add1(p, KIND_ROUTER, 1, 0, name,
                                       "model.layers.%d.mlp.shared_expert_gate.weight", i));
        } else {
            snprintf(prefix, sizeof prefix, "model.layers.%d.mlp.shared_experts", i);
            FMOE_FORWARD_IF_ERROR(add_mlp(p, i, prefix, "_shexp"));
        }
    }
    return 0;
}

/* DeepSeek-V2/V3's multi-head latent attention of layer i, named as llama.cpp's deepseek2
 * (gguf-py's MODEL_TENSORS[DEEPSEEK2]); kv_b_proj is written split into attn_k_b and
 * attn_v_b (strided views), as the converter writes it today. */
static int add_mla(plan *p, int32_t i) {
    const fmoe_model_geometry *g = p->g;
    const int lora = g->q_lora_rank > 0; /* V2-Lite: a full-rank q_proj */
    static const struct {
        const char *hf, *gguf;
        int lora; /* 1: only with q_lora_rank, -1: only without, 0: always */
    } map[] = {
        {"q_a_proj.weight", "attn_q_a.weight", 1},
        {"q_a_layernorm.weight", "attn_q_a_norm.weight", 1},
        {"q_b_proj.weight", "attn_q_b.weight", 1},
        {"q_proj.weight", "attn_q.weight", -1},
        {"kv_a_proj_with_mqa.weight", "attn_kv_a_mqa.weight", 0},
        {"kv_a_layernorm.weight", "attn_kv_a_norm.weight", 0},
        {"o_proj.weight", "attn_output.weight", 0},
    };
    char name[64];
    for (size_t k = 0; k < sizeof map / sizeof map[0]; k++) {
        if ((map[k].lora == 1 && !lora) || (map[k].lora == -1 && lora)) continue;
        snprintf(name, sizeof name, "blk.%d.%s", i, map[k].gguf);
        FMOE_FORWARD_IF_ERROR(add1(p, strstr(map[k].hf, "layernorm") ? KIND_NORM : KIND_WEIGHT,
                                   1, 0, name, "model.layers.%d.self_attn.%s", i, map[k].hf));
    }
    const int64_t H = g->num_attention_heads, dn = g->qk_nope_head_dim, dv = g->v_head_dim;
    const int64_t r = g->kv_lora_rank;
    const fmoe_st_tensor *kv;
    FMOE_FORWARD_IF_ERROR(find(p, 1, &kv, "model.layers.%d.self_attn.kv_b_proj.weight", i));
    FMOE_RETURN_ERROR_IF(kv->ndim != 2 || kv->shape[0] != H * (dn + dv) || kv->shape[1] != r,
                         FMOE_EMISMATCH,
                         "%s: tensor %s has shape [%lld,%lld], expected [%lld,%lld] "
                         "(heads x (qk_nope_head_dim + v_head_dim), kv_lora_rank)",
                         kv->file, kv->name, (long long)kv->shape[0],
                         (long long)(kv->ndim > 1 ? kv->shape[1] : 0), (long long)(H * (dn + dv)),
                         (long long)r);
    const int64_t kb[3] = {dn, r, H}, vb[3] = {r, dv, H};
    p->report->bytes_in += kv->nbytes;
    p->kv_split[0] = (strided){.off = 0, .e = (dn + dv) * r, .row = 1, .col = r};
    p->kv_split[1] = (strided){.off = dn * r, .e = (dn + dv) * r, .row = r, .col = 1};
    snprintf(name, sizeof name, "blk.%d.attn_k_b.weight", i);
    FMOE_FORWARD_IF_ERROR(add_shaped(p, KIND_WEIGHT, name, &kv, 1, 0, &p->kv_split[0], kb));
    snprintf(name, sizeof name, "blk.%d.attn_v_b.weight", i);
    return add_shaped(p, KIND_WEIGHT, name, &kv, 1, 0, &p->kv_split[1], vb);
}

/* A float tensor of the checkpoint with the given shape (-1: any extent). */
static int find_shaped(plan *p, const fmoe_st_tensor **out, int32_t ndim, const int64_t *shape,
                       const char *name) {
    const fmoe_st_tensor *t = fmoe_safetensors_find(p->st, name);
    FMOE_RETURN_ERROR_IF(!t, FMOE_ENOTFOUND, "%s: missing tensor %s", p->dir, name);
    FMOE_RETURN_ERROR_IF(t->dtype != FMOE_ST_F32 && t->dtype != FMOE_ST_F16 &&
                             t->dtype != FMOE_ST_BF16,
                         FMOE_EUNSUPPORTED, "%s: tensor %s has dtype %s (F32, F16 or BF16 needed)",
                         t->file, name, fmoe_st_dtype_name(t->dtype));
    int ok = t->ndim == ndim;
    for (int32_t d = 0; ok && d < ndim; d++) ok = t->shape[d] == shape[d];
    FMOE_RETURN_ERROR_IF(!ok, FMOE_EMISMATCH, "%s: tensor %s has %d dimensions [%lld, ...], "
                         "expected %d [%lld, ...]", t->file, name, t->ndim,
                         (long long)(t->ndim ? t->shape[0] : 0), ndim, (long long)shape[0]);
    *out = t;
    return 0;
}

/* Layer i's routed experts from the fused, input-major checkpoint tensors PREFIX.gate_up_proj
 * [J,h,2I] and PREFIX.down_proj [J,I,h], transposed and split (strided views, kept in v[3],
 * which must outlive the plan) into ffn_{gate,up,down}_exps [J][rows][cols]. gpt-oss
 * interleaves gate and up columns (gate even, up odd); Llama 4 puts gate's I columns first. */
static int add_fused_experts(plan *p, int32_t i, const char *prefix, int interleaved,
                             strided *v) {
    const fmoe_model_geometry *g = p->g;
    const int64_t h = g->hidden_size, I = g->moe_intermediate_size, J = g->num_experts;
    char name[64], hf[NAME_CAP];
    const fmoe_st_tensor *gu, *dn;
    const int64_t gus[3] = {J, h, 2 * I}, dns[3] = {J, I, h};
    snprintf(hf, sizeof hf, "%s.gate_up_proj", prefix);
    FMOE_FORWARD_IF_ERROR(find_shaped(p, &gu, 3, gus, hf));
    snprintf(hf, sizeof hf, "%s.down_proj", prefix);
    FMOE_FORWARD_IF_ERROR(find_shaped(p, &dn, 3, dns, hf));
    p->report->bytes_in += gu->nbytes + dn->nbytes;
    const int64_t step = interleaved ? 2 : 1;
    v[0] = (strided){.off = 0, .e = 2 * I * h, .row = step, .col = 2 * I};                 /* gate */
    v[1] = (strided){.off = interleaved ? 1 : I, .e = 2 * I * h, .row = step, .col = 2 * I}; /* up */
    v[2] = (strided){.off = 0, .e = I * h, .row = 1, .col = h};                            /* down */
    const fmoe_st_tensor **src = malloc((size_t)J * sizeof *src);
    FMOE_RETURN_ERROR_IF(!src, FMOE_ENOMEM, "out of memory");
    static const char *const gg[3] = {"gate", "up", "down"};
    int rc = 0;
    for (int k = 0; k < 3 && rc == 0; k++) {
        const int64_t ne[3] = {k < 2 ? h : I, k < 2 ? I : h, J};
        for (int64_t e = 0; e < J; e++) src[e] = k < 2 ? gu : dn;
        snprintf(name, sizeof name, "blk.%d.ffn_%s_exps.weight", i, gg[k]);
        rc = add_shaped(p, KIND_EXPERT, name, src, (int32_t)J, 0, &v[k], ne);
    }
    free(src);
    return rc;
}

/* gpt-oss's float experts of layer i: the fused input-major tensors de-interleaved and
 * transposed (strided views) into ffn_{gate,up,down}_exps, then quantised as asked. */
static int add_gptoss_float(plan *p, int32_t i) {
    char prefix[NAME_CAP];
    snprintf(prefix, sizeof prefix, "model.layers.%d.mlp.experts", i);
    return add_fused_experts(p, i, prefix, 1, p->gptoss);
}

/*
 * gpt-oss's MXFP4 experts of layer i (OpenAI's layout: family_gptoss.c), written as
 * llama.cpp's GptOssModel.repack_mxfp4 writes them: ffn_gate_exps and ffn_up_exps [J][I][h]
 * from the even and odd rows of gate_up_proj_blocks/_scales, ffn_down_exps [J][h][I] from
 * down_proj's, each block with its scale byte repacked into ggml's order
 * (fmoe__mxfp4_from_openai), never requantised: the file holds the checkpoint's numbers
 * exactly. Another
 * --experts-type would requantise already-quantised numbers; that is refused.
 */
static int add_gptoss_mxfp4(plan *p, int32_t i) {
    const fmoe_model_geometry *g = p->g;
    const int64_t h = g->hidden_size, I = g->moe_intermediate_size, J = g->num_experts;
    FMOE_RETURN_ERROR_IF(p->experts_type && p->experts_type != FMOE_GGML_MXFP4,
                         FMOE_EUNSUPPORTED,
                         "%s: the experts are MXFP4 in the checkpoint and are copied as such: "
                         "--experts-type %s would requantise quantised numbers (use mxfp4 or "
                         "leave it out)",
                         p->dir, fmoe_ggml_type_name(p->experts_type));
    FMOE_RETURN_ERROR_IF(h % 32 != 0 || I % 32 != 0, FMOE_EFORMAT,
                         "%s: MXFP4 experts need hidden_size (%lld) and intermediate_size "
                         "(%lld) in whole blocks of 32",
                         p->dir, (long long)h, (long long)I);
    static const char *const hf[2] = {"gate_up_proj", "down_proj"};
    const int64_t rows[2] = {2 * I, h}, cols[2] = {h, I};
    const fmoe_st_tensor *bl[2], *sc[2];
    for (int k = 0; k < 2; k++) {
        const int64_t want[4] = {J, rows[k], cols[k] / 32, 16};
        for (int part = 0; part < 2; part++) {
            char name[NAME_CAP];
            snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%s_%s", i, hf[k],
                     part ? "scales" : "blocks");
            const fmoe_st_tensor *t = fmoe_safetensors_find(p->st, name);
            FMOE_RETURN_ERROR_IF(!t, FMOE_ENOTFOUND, "%s: missing tensor %s", p->dir, name);
            const int32_t nd = part ? 3 : 4;
            int ok = t->dtype == FMOE_ST_U8 && t->ndim == nd;
            for (int32_t d = 0; ok && d < nd; d++) ok = t->shape[d] == want[d];
            FMOE_RETURN_ERROR_IF(!ok, FMOE_EMISMATCH,
                                 "%s: tensor %s: expected U8 [%lld, %lld, %lld%s] (MXFP4 %s)",
                                 t->file, name, (long long)want[0], (long long)want[1],
                                 (long long)want[2], part ? "" : ", 16", part ? "scales" : "blocks");
            *(part ? &sc[k] : &bl[k]) = t;
            p->report->bytes_in += t->nbytes;
        }
    }
    static const char *const gg[3] = {"gate", "up", "down"};
    for (int k = 0; k < 3; k++) {
        const int m = k < 2 ? 0 : 1; /* gate and up: rows 0, 2, 4 ... and 1, 3, 5 ... */
        out_tensor *o;
        FMOE_FORWARD_IF_ERROR(push(p, &bl[m], 1, &o));
        snprintf(o->name, sizeof o->name, "blk.%d.ffn_%s_exps.weight", i, gg[k]);
        o->ndim = 3;
        o->ne[0] = cols[m];
        o->ne[1] = m ? h : I;
        o->ne[2] = J;
        o->type = FMOE_GGML_MXFP4;
        o->mx_scales = sc[m];
        o->mx_first = k == 1;
        o->mx_step = m ? 1 : 2;
        o->nbytes = J * o->ne[1] * fmoe_quant_row_bytes(FMOE_GGML_MXFP4, o->ne[0]);
        p->report->by_type[FMOE_GGML_MXFP4]++;
    }
    return 0;
}

/*
 * gpt-oss's attention sinks and MoE block of layer i, as llama.cpp's GptOssModel writes a
 * float checkpoint (family_gptoss.c has the layouts): self_attn.sinks as attn_sinks.weight,
 * the router and its bias as ffn_gate_inp, the fused input-major experts de-interleaved and
 * transposed into ffn_{gate,up,down}_exps [J][rows][cols] and their biases into
 * ffn_{gate,up,down}_exps.bias [J][rows] (strided views); OpenAI's published MXFP4 experts
 * (_blocks, _scales) copied as ggml MXFP4 blocks, as the converter's repack_mxfp4 does.
 */
static int add_gptoss(plan *p, int32_t i) {
    const fmoe_model_geometry *g = p->g;
    const int64_t I = g->moe_intermediate_size, J = g->num_experts;
    char name[64], hf[NAME_CAP];
    snprintf(name, sizeof name, "blk.%d.attn_sinks.weight", i);
    FMOE_FORWARD_IF_ERROR(add1(p, KIND_NORM, 1, 0, name, "model.layers.%d.self_attn.sinks", i));
    snprintf(name, sizeof name, "blk.%d.ffn_gate_inp.weight", i);
    FMOE_FORWARD_IF_ERROR(add1(p, KIND_ROUTER, 1, 0, name, "model.layers.%d.mlp.router.weight", i));
    snprintf(name, sizeof name, "blk.%d.ffn_gate_inp.bias", i);
    FMOE_FORWARD_IF_ERROR(add1(p, KIND_NORM, 1, 0, name, "model.layers.%d.mlp.router.bias", i));
    snprintf(hf, sizeof hf, "model.layers.%d.mlp.experts.gate_up_proj_blocks", i);
    if (fmoe_safetensors_find(p->st, hf)) {
        FMOE_FORWARD_IF_ERROR(add_gptoss_mxfp4(p, i));
    } else {
        FMOE_FORWARD_IF_ERROR(add_gptoss_float(p, i));
    }
    const fmoe_st_tensor *gub;
    const int64_t gubs[2] = {J, 2 * I};
    snprintf(hf, sizeof hf, "model.layers.%d.mlp.experts.gate_up_proj_bias", i);
    FMOE_FORWARD_IF_ERROR(find_shaped(p, &gub, 2, gubs, hf));
    p->report->bytes_in += gub->nbytes;
    strided *v = p->gptoss;
    v[3] = (strided){.off = 0, .e = 0, .row = 2 * I, .col = 2}; /* gate bias */
    v[4] = (strided){.off = 1, .e = 0, .row = 2 * I, .col = 2}; /* up bias */
    static const char *const gg[2] = {"gate", "up"};
    const int64_t nb[3] = {I, J, 1};
    for (int k = 0; k < 2; k++) {
        snprintf(name, sizeof name, "blk.%d.ffn_%s_exps.bias", i, gg[k]);
        FMOE_FORWARD_IF_ERROR(add_shaped(p, KIND_NORM, name, &gub, 1, 0, &v[3 + k], nb));
    }
    snprintf(name, sizeof name, "blk.%d.ffn_down_exps.bias", i);
    return add1(p, KIND_NORM, 1, 0, name, "model.layers.%d.mlp.experts.down_proj_bias", i);
}

/*
 * Llama 4's MoE block of layer i, as llama.cpp's Llama4Model writes it: the router
 * (feed_forward.router) as ffn_gate_inp, the shared expert as ffn_{gate,up,down}_shexp, and
 * the fused input-major experts (family_llama4.c: gate_up_proj [J,h,2I], gate the first I
 * columns, up the last I; down_proj [J,I,h]) transposed and split into
 * ffn_{gate,up,down}_exps [J][rows][cols] (strided views).
 */
static int add_llama4_moe(plan *p, int32_t i) {
    char name[64], hf[NAME_CAP];
    snprintf(name, sizeof name, "blk.%d.ffn_gate_inp.weight", i);
    FMOE_FORWARD_IF_ERROR(
        add1(p, KIND_ROUTER, 1, 0, name, "model.layers.%d.feed_forward.router.weight", i));
    snprintf(hf, sizeof hf, "model.layers.%d.feed_forward.shared_expert", i);
    FMOE_FORWARD_IF_ERROR(add_mlp(p, i, hf, "_shexp"));
    snprintf(hf, sizeof hf, "model.layers.%d.feed_forward.experts", i);
    return add_fused_experts(p, i, hf, 0, p->llama4);
}

/* A number of the object `o` (NULL or not a number: def). */
static double json_number(const cJSON *o, const char *key, double def) {
    const cJSON *v = cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, key) : NULL;
    return cJSON_IsNumber(v) ? v->valuedouble : def;
}

/* The rope parameters object of a config (transformers >= 5: rope_parameters; before:
 * rope_scaling), or NULL. */
static const cJSON *rope_object(const cJSON *cfg) {
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(cfg, "rope_parameters");
    if (!cJSON_IsObject(o)) o = cJSON_GetObjectItemCaseSensitive(cfg, "rope_scaling");
    return cJSON_IsObject(o) ? o : NULL;
}

/* A 1-D F32 tensor `name` of n values computed from config.json, kept by the plan (slot k)
 * and written as an F32 output of that name. @return 0, FMOE_ENOMEM. */
static int add_made(plan *p, int k, const char *name, const float *v, int64_t n) {
    float *d = malloc((size_t)n * sizeof *d);
    FMOE_RETURN_ERROR_IF(!d, FMOE_ENOMEM, "out of memory");
    memcpy(d, v, (size_t)n * sizeof *d);
    p->made_data[k] = d;
    p->made[k] = (fmoe_st_tensor){.name = name, .file = p->dir, .dtype = FMOE_ST_F32, .ndim = 1,
                                  .shape = {n}, .numel = n, .nbytes = n * 4, .data = d};
    const fmoe_st_tensor *t = &p->made[k];
    return add(p, KIND_NORM, name, &t, 1, 0);
}

/*
 * llama3 rope scaling as the rope_freqs tensor of per-frequency divisors, as llama.cpp's
 * LlamaModel.generate_extra_tensors computes it (Llama 3.1's scaling: frequencies of
 * wavelength under original/high_freq_factor kept, over original/low_freq_factor divided
 * by factor, a smooth mix between). Nothing when the config has no llama3 scaling.
 */
static int add_rope_freqs(plan *p) {
    const cJSON *r = rope_object(p->text);
    const cJSON *t = r ? cJSON_GetObjectItemCaseSensitive(r, "rope_type") : NULL;
    if (!cJSON_IsString(t)) t = r ? cJSON_GetObjectItemCaseSensitive(r, "type") : NULL;
    if (!cJSON_IsString(t) || strcmp(t->valuestring, "llama3") != 0) return 0;
    const fmoe_model_geometry *g = p->g;
    const double base = json_number(r, "rope_theta", g->rope_theta);
    const double factor = json_number(r, "factor", 8.0);
    const double lo = json_number(r, "low_freq_factor", 1.0);
    const double hi = json_number(r, "high_freq_factor", 4.0);
    const double old = json_number(r, "original_max_position_embeddings", 8192);
    const int64_t D = g->head_dim, n = D / 2;
    float f[512];
    FMOE_RETURN_ERROR_IF(n > 512, FMOE_EUNSUPPORTED, "%s: head_dim %lld: at most 1024 for "
                         "rope_freqs", p->dir, (long long)D);
    /* in float32, step by step, as the converter's torch arithmetic runs (its frequencies
     * are a float32 tensor, so every value derived from one is float32 too, and the
     * Python numbers it meets are rounded to float32 first) */
    for (int64_t k = 0; k < n; k++) {
        const float freq = 1.0f / powf((float)base, (float)(2 * k) / (float)D);
        const float wl = (float)(2 * M_PI) / freq;
        if (wl < (float)(old / hi)) {
            f[k] = 1.0f;
        } else if (wl > (float)(old / lo)) {
            f[k] = (float)factor;
        } else {
            const float smooth = ((float)old / wl - (float)lo) / (float)(hi - lo);
            f[k] = 1.0f / ((1.0f - smooth) / (float)factor + smooth);
        }
    }
    return add_made(p, 0, "rope_freqs.weight", f, n);
}

/*
 * Phi-3.5-MoE's longrope as llama.cpp's Phi3MiniModel writes it: the long and short factor
 * lists as rope_factors_long/short.weight [head_dim/2] F32 (metadata_phimoe adds the
 * attention factor). Nothing when the config has no long_factor.
 */
static int add_longrope(plan *p) {
    const cJSON *r = rope_object(p->config);
    static const char *const keys[2] = {"long_factor", "short_factor"};
    static const char *const names[2] = {"rope_factors_long.weight", "rope_factors_short.weight"};
    const int64_t n = p->g->head_dim / 2;
    for (int k = 0; k < 2; k++) {
        const cJSON *a = r ? cJSON_GetObjectItemCaseSensitive(r, keys[k]) : NULL;
        if (!a && k == 0) return 0;
        FMOE_RETURN_ERROR_IF(!cJSON_IsArray(a) || cJSON_GetArraySize(a) != n || n > 512,
                             FMOE_EFORMAT, "%s: config.json: rope %s must be a list of "
                             "head_dim/2 = %lld numbers", p->dir, keys[k], (long long)n);
        float f[512];
        for (int64_t j = 0; j < n; j++) {
            const cJSON *v = cJSON_GetArrayItem(a, (int)j);
            FMOE_RETURN_ERROR_IF(!cJSON_IsNumber(v), FMOE_EFORMAT,
                                 "%s: config.json: rope %s[%lld] is not a number", p->dir,
                                 keys[k], (long long)j);
            f[j] = (float)v->valuedouble;
        }
        FMOE_FORWARD_IF_ERROR(add_made(p, k, names[k], f, n));
    }
    return 0;
}

static int build_plan(plan *p) {
    const fmoe_model_geometry *g = p->g;
    FMOE_FORWARD_IF_ERROR(
        add1(p, KIND_WEIGHT, 1, 0, "token_embd.weight", "model.embed_tokens.weight"));
    int8_t moe[FMOE_MAX_LAYERS] = {0};
    for (int32_t l = 0; l < g->num_moe_layers; l++) moe[g->moe_layer_index[l]] = 1;
    const int mla = g->family == FMOE_FAMILY_DEEPSEEK_V2 || g->family == FMOE_FAMILY_DEEPSEEK_V3;
    /* glm4moe's and gpt-oss's post-attention norm is llama.cpp's ATTN_POST_NORM
     * (lib/gguf_names.c) */
    const char *ffn_norm =
        g->family == FMOE_FAMILY_GLM4_MOE || g->family == FMOE_FAMILY_GPT_OSS
            ? "post_attention_norm"
            : "ffn_norm";
    static const char *const attn[4][2] = {
        {"q_proj", "attn_q"}, {"k_proj", "attn_k"}, {"v_proj", "attn_v"}, {"o_proj", "attn_output"}};
    for (int32_t i = 0; i < g->num_hidden_layers; i++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%d.attn_norm.weight", i);
        FMOE_FORWARD_IF_ERROR(
            add1(p, KIND_NORM, 1, 0, name, "model.layers.%d.input_layernorm.weight", i));
        /* Phi-3.5-MoE's LayerNorms have biases */
        snprintf(name, sizeof name, "blk.%d.attn_norm.bias", i);
        FMOE_FORWARD_IF_ERROR(
            add1(p, KIND_NORM, 0, 0, name, "model.layers.%d.input_layernorm.bias", i));
        if (mla) FMOE_FORWARD_IF_ERROR(add_mla(p, i));
        for (int k = 0; k < 4 && !mla; k++) {
            const int32_t heads = !p->permute ? 0
                                  : k == 0    ? g->num_attention_heads
                                  : k == 1    ? g->num_key_value_heads
                                              : 0;
            snprintf(name, sizeof name, "blk.%d.%s.weight", i, attn[k][1]);
            FMOE_FORWARD_IF_ERROR(add1(p, KIND_WEIGHT, 1, heads, name,
                                       "model.layers.%d.self_attn.%s.weight", i, attn[k][0]));
            snprintf(name, sizeof name, "blk.%d.%s.bias", i, attn[k][1]);
            FMOE_FORWARD_IF_ERROR(add1(p, KIND_NORM, 0, heads, name,
                                       "model.layers.%d.self_attn.%s.bias", i, attn[k][0]));
        }
        snprintf(name, sizeof name, "blk.%d.attn_q_norm.weight", i);
        FMOE_FORWARD_IF_ERROR(
            add1(p, KIND_NORM, 0, 0, name, "model.layers.%d.self_attn.q_norm.weight", i));
        snprintf(name, sizeof name, "blk.%d.attn_k_norm.weight", i);
        FMOE_FORWARD_IF_ERROR(
            add1(p, KIND_NORM, 0, 0, name, "model.layers.%d.self_attn.k_norm.weight", i));
        snprintf(name, sizeof name, "blk.%d.%s.weight", i, ffn_norm);
        FMOE_FORWARD_IF_ERROR(
            add1(p, KIND_NORM, 1, 0, name, "model.layers.%d.post_attention_layernorm.weight", i));
        snprintf(name, sizeof name, "blk.%d.%s.bias", i, ffn_norm);
        FMOE_FORWARD_IF_ERROR(
            add1(p, KIND_NORM, 0, 0, name, "model.layers.%d.post_attention_layernorm.bias", i));
        if (g->family == FMOE_FAMILY_GPT_OSS) {
            FMOE_FORWARD_IF_ERROR(add_gptoss(p, i));
        } else if (g->family == FMOE_FAMILY_LLAMA4) {
            char prefix[NAME_CAP];
            snprintf(prefix, sizeof prefix, "model.layers.%d.feed_forward", i);
            FMOE_FORWARD_IF_ERROR(moe[i] ? add_llama4_moe(p, i) : add_mlp(p, i, prefix, ""));
        } else if (moe[i]) {
            FMOE_FORWARD_IF_ERROR(add_experts(p, i));
        } else {
            char prefix[NAME_CAP];
            snprintf(prefix, sizeof prefix, "model.layers.%d.mlp", i);
            FMOE_FORWARD_IF_ERROR(add_mlp(p, i, prefix, ""));
        }
    }
    FMOE_FORWARD_IF_ERROR(add1(p, KIND_NORM, 1, 0, "output_norm.weight", "model.norm.weight"));
    FMOE_FORWARD_IF_ERROR(add1(p, KIND_NORM, 0, 0, "output_norm.bias", "model.norm.bias"));
    FMOE_FORWARD_IF_ERROR(add1(p, KIND_WEIGHT, !g->tie_word_embeddings, 0, "output.weight",
                               "lm_head.weight"));
    FMOE_FORWARD_IF_ERROR(add1(p, KIND_NORM, 0, 0, "output.bias", "lm_head.bias"));
    if (g->family == FMOE_FAMILY_LLAMA4) FMOE_FORWARD_IF_ERROR(add_rope_freqs(p));
    if (g->family == FMOE_FAMILY_PHIMOE) FMOE_FORWARD_IF_ERROR(add_longrope(p));
    return 0;
}

/* ---------------------------------------------------------------------------------- */
/* The header                                                                         */
/* ---------------------------------------------------------------------------------- */

typedef struct bytes {
    uint8_t *b;
    size_t n, cap;
    int oom;
} bytes;

static void put(bytes *b, const void *p, size_t n) {
    if (b->oom) return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n) cap *= 2;
        uint8_t *nb = realloc(b->b, cap);
        if (!nb) {
            b->oom = 1;
            return;
        }
        b->b = nb;
        b->cap = cap;
    }
    memcpy(b->b + b->n, p, n);
    b->n += n;
}
static void put_u32(bytes *b, uint32_t v) { put(b, &v, 4); } /* little-endian hosts only */
static void put_u64(bytes *b, uint64_t v) { put(b, &v, 8); }
static void put_str(bytes *b, const char *s, size_t n) {
    put_u64(b, n);
    put(b, s, n);
}

typedef struct kvs {
    bytes b;
    uint64_t n;
    char arch[32];
} kvs;

static void key(kvs *k, const char *name, uint32_t type) {
    char full[128];
    if (name[0] == '.') snprintf(full, sizeof full, "%s%s", k->arch, name);
    else snprintf(full, sizeof full, "%s", name);
    put_str(&k->b, full, strlen(full));
    put_u32(&k->b, type);
    k->n++;
}
static void kv_u32(kvs *k, const char *name, uint32_t v) {
    key(k, name, 4 /* UINT32 */);
    put_u32(&k->b, v);
}
static void kv_f32(kvs *k, const char *name, float v) {
    key(k, name, 6 /* FLOAT32 */);
    put(&k->b, &v, 4);
}
static void kv_bool(kvs *k, const char *name, int v) {
    key(k, name, 7 /* BOOL */);
    const uint8_t b = v != 0;
    put(&k->b, &b, 1);
}
static void kv_str(kvs *k, const char *name, const char *s, size_t n) {
    key(k, name, 8 /* STRING */);
    put_str(&k->b, s, n);
}

/* A number of config.json: under rope_parameters (transformers >= 5), rope_scaling, or at
 * the top level; `def` when none has it. */
static double cfg_number(const cJSON *cfg, const char *key, double def) {
    static const char *const where[] = {"rope_parameters", "rope_scaling", NULL};
    for (int i = 0; i < 3; i++) {
        const cJSON *o = where[i] ? cJSON_GetObjectItemCaseSensitive(cfg, where[i]) : cfg;
        const cJSON *v = cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, key) : NULL;
        if (cJSON_IsNumber(v)) return v->valuedouble;
    }
    return def;
}

/* The config's rope type is yarn (rope_parameters.rope_type or rope_scaling.type). */
static int cfg_yarn(const cJSON *cfg) {
    static const char *const where[] = {"rope_parameters", "rope_scaling"};
    for (int i = 0; i < 2; i++) {
        const cJSON *o = cJSON_GetObjectItemCaseSensitive(cfg, where[i]);
        if (!cJSON_IsObject(o)) continue;
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "rope_type");
        if (!cJSON_IsString(t)) t = cJSON_GetObjectItemCaseSensitive(o, "type");
        if (cJSON_IsString(t)) return strcmp(t->valuestring, "yarn") == 0;
    }
    return 0;
}

/* The rotated dimensions of a head: GLM-4.5 rotates partial_rotary_factor of it
 * (llama.cpp's Glm4MoeModel: rope.dimension_count, default factor 0.5). */
static int32_t rotary_dims(const plan *p) {
    const fmoe_model_geometry *g = p->g;
    if (g->family != FMOE_FAMILY_GLM4_MOE) return g->head_dim;
    return (int32_t)(g->head_dim * cfg_number(p->config, "partial_rotary_factor", 0.5));
}

/*
 * deepseek2's attention keys, as llama.cpp's DeepseekV2Model writes them: MLA stored as
 * one shared latent "head" (head_count_kv 1, key_length kv_lora_rank + qk_rope_head_dim,
 * value_length kv_lora_rank) with the per-head sizes in key_length_mla/value_length_mla;
 * the ranks; rope.dimension_count = qk_rope_head_dim; YaRN with yarn_log_multiplier =
 * 0.1 · mscale_all_dim (the converter's [TAG_DEEPSEEK2_YARN_LOG_MUL_FIX]).
 */
static void metadata_mla(kvs *k, const plan *p) {
    const fmoe_model_geometry *g = p->g;
    kv_u32(k, ".attention.head_count_kv", 1);
    kv_u32(k, ".attention.key_length", (uint32_t)(g->kv_lora_rank + g->qk_rope_head_dim));
    kv_u32(k, ".attention.value_length", (uint32_t)g->kv_lora_rank);
    kv_u32(k, ".attention.key_length_mla", (uint32_t)(g->qk_nope_head_dim + g->qk_rope_head_dim));
    kv_u32(k, ".attention.value_length_mla", (uint32_t)g->v_head_dim);
    if (g->q_lora_rank > 0) kv_u32(k, ".attention.q_lora_rank", (uint32_t)g->q_lora_rank);
    kv_u32(k, ".attention.kv_lora_rank", (uint32_t)g->kv_lora_rank);
    kv_u32(k, ".rope.dimension_count", (uint32_t)g->qk_rope_head_dim);
    const double mscale_all = cfg_number(p->config, "mscale_all_dim", -1);
    if (cfg_yarn(p->config) && mscale_all >= 0)
        kv_f32(k, ".rope.scaling.yarn_log_multiplier", (float)(0.1 * mscale_all));
}

/* YaRN's keys, as llama.cpp's TextModel.set_gguf_parameters writes them. */
static void metadata_yarn(kvs *k, const plan *p) {
    if (!cfg_yarn(p->config)) return;
    static const char yarn[] = "yarn";
    kv_str(k, ".rope.scaling.type", yarn, sizeof yarn - 1);
    kv_f32(k, ".rope.scaling.factor", (float)cfg_number(p->config, "factor", 1.0));
    kv_u32(k, ".rope.scaling.original_context_length",
           (uint32_t)cfg_number(p->config, "original_max_position_embeddings", 4096));
    const double fast = cfg_number(p->config, "beta_fast", -1);
    const double slow = cfg_number(p->config, "beta_slow", -1);
    if (fast >= 0) kv_f32(k, ".rope.scaling.yarn_beta_fast", (float)fast);
    if (slow >= 0) kv_f32(k, ".rope.scaling.yarn_beta_slow", (float)slow);
}

/* The router and layer keys deepseek2 and glm4moe share (llama.cpp's TextModel base and
 * DeepseekV2Model / Glm4MoeModel): dense leading layers, shared experts, the scaling
 * factor, the scoring function (1 softmax, 2 sigmoid) and the expert groups. */
static void metadata_grouped_moe(kvs *k, const plan *p) {
    const fmoe_model_geometry *g = p->g;
    kv_u32(k, ".leading_dense_block_count",
           (uint32_t)(g->num_moe_layers > 0 ? g->moe_layer_index[0] : g->num_hidden_layers));
    kv_u32(k, ".expert_shared_count", (uint32_t)g->num_shared_experts);
    kv_f32(k, ".expert_weights_scale", (float)g->routed_scaling_factor);
    kv_u32(k, ".expert_gating_func", g->scoring == FMOE_ROUTER_SOFTMAX ? 1 : 2);
    if (cJSON_GetObjectItemCaseSensitive(p->config, "n_group")) {
        kv_u32(k, ".expert_group_count", (uint32_t)g->n_group);
        kv_u32(k, ".expert_group_used_count", (uint32_t)g->topk_group);
    }
}

/* Phi-3.5-MoE's keys beyond the common ones (llama.cpp's Phi3MiniModel and PhiMoeModel):
 * the sliding window (0 for none), the original context and, with longrope, the one
 * attention factor sqrt(1 + ln(ctx / original) / ln original) (1 when ctx <= original). */
static void metadata_phimoe(kvs *k, const plan *p, double window) {
    const fmoe_model_geometry *g = p->g;
    kv_u32(k, ".attention.sliding_window", (uint32_t)(window > 0 ? window : 0));
    const cJSON *r = rope_object(p->config);
    const double omp = json_number(r, "original_max_position_embeddings",
                                   json_number(p->config, "original_max_position_embeddings",
                                               g->max_position_embeddings));
    kv_u32(k, ".rope.scaling.original_context_length", (uint32_t)omp);
    if (r && cJSON_GetObjectItemCaseSensitive(r, "long_factor")) {
        const double scale = g->max_position_embeddings / omp;
        kv_f32(k, ".rope.scaling.attn_factor",
               scale > 1 ? (float)sqrt(1 + log(scale) / log(omp)) : 1.0f);
    }
}

/* Llama 4's keys beyond the common ones (llama.cpp's Llama4Model): the MoE interleave step;
 * sliding_window 0 where every layer is full attention (MobileLLM's layer_types), which
 * tells llama.cpp to drop chunks, NoPE layers and the temperature. */
static void metadata_llama4(kvs *k, const plan *p) {
    kv_u32(k, ".interleave_moe_layer_step",
           (uint32_t)json_number(p->text, "interleave_moe_layer_step", 1));
    const cJSON *types = cJSON_GetObjectItemCaseSensitive(p->text, "layer_types");
    if (!cJSON_IsArray(types) || cJSON_GetArraySize(types) == 0) return;
    const cJSON *t;
    cJSON_ArrayForEach(t, types) {
        if (!cJSON_IsString(t) || strcmp(t->valuestring, "full_attention") != 0) return;
    }
    kv_u32(k, ".attention.sliding_window", 0);
}

static void metadata(kvs *k, const plan *p, const char *config, size_t config_len) {
    const fmoe_model_geometry *g = p->g;
    kv_str(k, "general.architecture", k->arch, strlen(k->arch));
    const char *base = strrchr(p->dir, '/');
    base = base && base[1] ? base + 1 : p->dir;
    kv_str(k, "general.name", base, strlen(base));
    kv_u32(k, "general.file_type", p->mix ? fmoe_quant_mix_ftype(p->mix) : file_type(p->type));
    kv_u32(k, "general.quantization_version", 2);
    kv_u32(k, ".vocab_size", (uint32_t)g->vocab_size);
    kv_u32(k, ".context_length", (uint32_t)g->max_position_embeddings);
    kv_u32(k, ".embedding_length", (uint32_t)g->hidden_size);
    kv_u32(k, ".block_count", (uint32_t)g->num_hidden_layers);
    kv_u32(k, ".feed_forward_length",
           (uint32_t)(g->intermediate_size > 0 ? g->intermediate_size : g->moe_intermediate_size));
    kv_u32(k, ".attention.head_count", (uint32_t)g->num_attention_heads);
    const int mla = g->family == FMOE_FAMILY_DEEPSEEK_V2 || g->family == FMOE_FAMILY_DEEPSEEK_V3;
    if (mla) {
        metadata_mla(k, p);
    } else {
        kv_u32(k, ".attention.head_count_kv", (uint32_t)g->num_key_value_heads);
        kv_u32(k, ".attention.key_length", (uint32_t)g->head_dim);
        kv_u32(k, ".attention.value_length", (uint32_t)g->head_dim);
        kv_u32(k, ".rope.dimension_count", (uint32_t)rotary_dims(p));
    }
    kv_f32(k, ".rope.freq_base", (float)g->rope_theta);
    kv_f32(k, ".attention.layer_norm_rms_epsilon", (float)g->rms_norm_eps);
    kv_u32(k, ".expert_count", (uint32_t)g->num_experts);
    kv_u32(k, ".expert_used_count", (uint32_t)g->top_k);
    kv_bool(k, ".expert_weights_norm", g->norm_topk_prob);
    if (g->family != FMOE_FAMILY_MIXTRAL && g->family != FMOE_FAMILY_OLMOE &&
        g->family != FMOE_FAMILY_PHIMOE)
        kv_u32(k, ".expert_feed_forward_length", (uint32_t)g->moe_intermediate_size);
    if (g->family == FMOE_FAMILY_QWEN2_MOE)
        kv_u32(k, ".expert_shared_feed_forward_length", (uint32_t)g->shared_intermediate_size);
    if (g->family == FMOE_FAMILY_DEEPSEEK_V1) {
        kv_u32(k, ".leading_dense_block_count",
               (uint32_t)(g->num_moe_layers > 0 ? g->moe_layer_index[0] : 0));
        kv_u32(k, ".expert_shared_count", (uint32_t)g->num_shared_experts);
        kv_f32(k, ".expert_weights_scale", (float)g->routed_scaling_factor);
    }
    if (mla || g->family == FMOE_FAMILY_GLM4_MOE) metadata_grouped_moe(k, p);
    if (mla || g->family == FMOE_FAMILY_GPT_OSS) metadata_yarn(k, p);
    const double window = cfg_number(p->config, "sliding_window", 0);
    if (g->family == FMOE_FAMILY_GPT_OSS && window > 0)
        kv_u32(k, ".attention.sliding_window", (uint32_t)window);
    if (g->family == FMOE_FAMILY_PHIMOE) metadata_phimoe(k, p, window);
    if (g->family == FMOE_FAMILY_LLAMA4) metadata_llama4(k, p);
    kv_str(k, "fmoe.hf_config", config, config_len);
}

/* The checkpoint folder's tokenizer and generation files, embedded as string keys
 * fmoe.file.NAME (fmoe/gguf.h, fmoe_gguf_get_file), so the GGUF file runs without the
 * folder: fmoe's tokenizer reads tokenizer.json, not llama.cpp's tokenizer.ggml.* keys.
 * Absent files are skipped. @return 0 or the read's error (named). */
static int embed_files(kvs *k, const char *dir) {
    static const char *const names[] = {"tokenizer.json", "tokenizer_config.json",
                                        "chat_template.jinja", "generation_config.json"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char path[4096], key[64];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (access(path, F_OK) != 0) continue;
        char *text = NULL;
        size_t len = 0;
        /* tokenizer.json of a 256k vocabulary is ~30 MB */
        FMOE_FORWARD_IF_ERROR(fmoe__read_file_bounded(path, names[i], (long long)256 << 20, 0,
                                                      &text, &len));
        snprintf(key, sizeof key, "fmoe.file.%s", names[i]);
        kv_str(k, key, text, len);
        free(text);
    }
    return 0;
}

/* ---------------------------------------------------------------------------------- */
/* The data                                                                           */
/* ---------------------------------------------------------------------------------- */

/* The checkpoint row that output row r of a permuted q/k projection comes from:
 * llama.cpp's permute() reshapes rows as [heads][2][head_dim/2] and swaps the last two
 * axes, so output (h, j, i) = input (h, i, j), i in {0, 1}, j < head_dim/2. */
static int64_t permute_row(int64_t r, int64_t rows, int32_t heads) {
    if (heads <= 0) return r;
    const int64_t hd = rows / heads, half = hd / 2;
    const int64_t h = r / hd, j = (r % hd) / 2, i = r % 2;
    return h * hd + i * half + j;
}

static void widen(const fmoe_st_tensor *s, int64_t at, int64_t n, float *y) {
    const uint8_t *p = (const uint8_t *)s->data;
    for (int64_t k = 0; k < n; k++) {
        const int64_t e = at + k;
        if (s->dtype == FMOE_ST_F32) {
            memcpy(&y[k], p + 4 * e, 4);
        } else {
            uint16_t h;
            memcpy(&h, p + 2 * e, 2);
            y[k] = s->dtype == FMOE_ST_F16 ? fmoe_half_to_float(h) : fmoe_bf16_to_float(h);
        }
    }
}

static int write_all(FILE *f, const void *p, size_t n, const char *path) {
    if (n && fwrite(p, 1, n, f) != n)
        return fmoe_error_set(FMOE_EIO, "%s: write failed: %s", path, strerror(errno));
    return 0;
}

/* Quantising is the slow part (about 150 ns a value for the K-quants' searches): the rows
 * of one source matrix are spread over the runtime's thread pool into one buffer, which is
 * then written in order, so the file is the same whatever the thread count. */
typedef struct quant_job {
    const out_tensor *o;
    const fmoe_st_tensor *s;
    int64_t rows, cols, rb;
    uint8_t *out;              /* [rows][rb] */
    const float *importance;   /* NULL, or [experts][cols]: row r's are those of expert
                                  expert0 + r / rows_per_expert */
    int64_t expert0, rows_per_expert;
    float **scratch;           /* [workers][cols] */
    int64_t *bad_row;          /* [workers] first row with a non-finite value, or -1 */
    int64_t *bad_col;
} quant_job;

#define QUANT_CHUNK 32 /* rows per task */

static void quant_rows(void *ctx, int32_t task, int32_t worker) {
    quant_job *j = ctx;
    float *row = j->scratch[worker];
    const int64_t r0 = (int64_t)task * QUANT_CHUNK;
    const int64_t r1 = r0 + QUANT_CHUNK < j->rows ? r0 + QUANT_CHUNK : j->rows;
    for (int64_t r = r0; r < r1; r++) {
        const int64_t sr = permute_row(r, j->rows, j->o->permute_heads);
        widen(j->s, sr * j->cols, j->cols, row);
        for (int64_t k = 0; k < j->cols; k++)
            if (!isfinite(row[k])) {
                if (j->bad_row[worker] < 0 || sr < j->bad_row[worker]) {
                    j->bad_row[worker] = sr;
                    j->bad_col[worker] = k;
                }
                memset(row, 0, (size_t)j->cols * sizeof *row);
                break;
            }
        const float *imp = j->importance
                               ? j->importance + (j->expert0 + r / j->rows_per_expert) * j->cols
                               : NULL;
        fmoe_quant_quantize_row_weighted(j->o->type, row, imp, j->out + r * j->rb, j->cols);
    }
}

typedef struct writer {
    FILE *f;
    const char *path;
    fmoe__pool *pool;
    int32_t workers;
    float **scratch;           /* [workers][max_cols] */
    int64_t bad_row[256], bad_col[256];
    uint8_t *out;              /* one quantised source matrix */
    int64_t out_cap;
    float *row;                /* [max_cols] for the sequential paths */
    uint16_t *row16;           /* [max_cols] a row narrowed to F16/BF16 */
    const fmoe_safetensors *st;
    int64_t fp8_bm, fp8_bn;    /* FP8 sources' block size (fp8_block.h) */
    float *src_f32, *view_f32; /* a source not read in place, as f32 (source_rows) */
    int64_t src_cap, view_cap;
    const fmoe_st_tensor *widened; /* the source src_f32 holds */
    const fmoe__imatrix *imatrix;  /* NULL, or --imatrix's file */
    const char *imatrix_path;
    fmoe_quantize_report *report;
} writer;

/* Grows *buf to hold n floats. */
static int reserve(float **buf, int64_t *cap, int64_t n, const char *what) {
    if (n <= *cap) return 0;
    float *nb = realloc(*buf, (size_t)n * sizeof *nb);
    FMOE_RETURN_ERROR_IF(!nb, FMOE_ENOMEM, "out of memory for tensor %s", what);
    *buf = nb;
    *cap = n;
    return 0;
}

/*
 * Source e of output o, as the rows the writer reads: the source itself, or (an FP8 weight,
 * a strided view) an f32 copy in the writer's buffers described by *tmp. A source widened
 * once is kept for the next outputs that read it (gpt-oss's fused experts: J views each).
 */
static int source_rows(writer *w, const out_tensor *o, int32_t e, fmoe_st_tensor *tmp,
                       const fmoe_st_tensor **out) {
    const fmoe_st_tensor *s = o->src[e];
    *out = s;
    if (s->dtype != FMOE_ST_F8_E4M3 && !o->view) return 0;
    if (w->widened != s) {
        FMOE_FORWARD_IF_ERROR(reserve(&w->src_f32, &w->src_cap, s->numel, s->name));
        w->widened = NULL;
        if (s->dtype == FMOE_ST_F8_E4M3)
            FMOE_FORWARD_IF_ERROR(
                fmoe__fp8_dequantize(w->st, s, w->fp8_bm, w->fp8_bn, FMOE_ST_F32, w->src_f32));
        else
            widen(s, 0, s->numel, w->src_f32);
        w->widened = s;
    }
    *tmp = *s;
    tmp->dtype = FMOE_ST_F32;
    tmp->data = w->src_f32;
    tmp->nbytes = s->numel * 4;
    if (o->view) {
        const strided *v = o->view;
        const int64_t nx = o->nsrc == 1 ? o->ne[2] : 1, x0 = o->nsrc == 1 ? 0 : e;
        const int64_t rows = o->ne[1], cols = o->ne[0], n = nx * rows * cols;
        FMOE_FORWARD_IF_ERROR(reserve(&w->view_f32, &w->view_cap, n, s->name));
        float *d = w->view_f32;
        for (int64_t x = x0; x < x0 + nx; x++)
            for (int64_t r = 0; r < rows; r++)
                for (int64_t c = 0; c < cols; c++) {
                    const int64_t at = v->off + x * v->e + r * v->row + c * v->col;
                    FMOE_RETURN_ERROR_IF(at < 0 || at >= s->numel, FMOE_EFORMAT,
                                         "%s: tensor %s is too small for %s", s->file, s->name,
                                         o->name);
                    *d++ = w->src_f32[at];
                }
        tmp->data = w->view_f32;
        tmp->ndim = 2;
        tmp->numel = n;
        tmp->nbytes = n * 4;
        tmp->shape[0] = nx * rows;
        tmp->shape[1] = cols;
    }
    *out = tmp;
    return 0;
}

/* A tensor kept unquantized must hold finite values too: a NaN or infinity there (a
 * norm, a router, an F16 matrix) turns every logit it reaches into NaN, which the quantized
 * path refuses by the block. `row` holds n values widened from source row sr (column
 * offset c0). @return 0, or FMOE_EFORMAT naming the tensor, row and column. */
static int check_finite(const fmoe_st_tensor *s, const float *row, int64_t n, int64_t sr,
                        int64_t c0) {
    for (int64_t k = 0; k < n; k++)
        if (!isfinite(row[k]))
            return fmoe_error_set(FMOE_EFORMAT,
                                  "%s: tensor %s, row %lld, column %lld is %g: a non-finite "
                                  "weight (kept unquantized, it would still make every logit "
                                  "NaN)",
                                  s->file, s->name, (long long)sr, (long long)(c0 + k),
                                  (double)row[k]);
    return 0;
}

/* An MXFP4 output copied from the checkpoint's blocks (add_gptoss_mxfp4): each block's
 * nibbles moved into ggml's order (quant_block.h), no number changed. */
static int write_mxfp4_copy(writer *w, const out_tensor *o) {
    const fmoe_st_tensor *bl = o->src[0], *sc = o->mx_scales;
    const int64_t G = o->ne[0] / 32, R = bl->shape[1], rb = G * FMOE_MXFP4_BYTES;
    if (rb > w->out_cap) {
        uint8_t *nb = realloc(w->out, (size_t)rb);
        FMOE_RETURN_ERROR_IF(!nb, FMOE_ENOMEM, "out of memory for tensor %s", o->name);
        w->out = nb;
        w->out_cap = rb;
    }
    for (int64_t x = 0; x < o->ne[2]; x++)
        for (int64_t r = 0; r < o->ne[1]; r++) {
            const int64_t sr = x * R + o->mx_first + r * o->mx_step;
            const uint8_t *in = (const uint8_t *)bl->data + sr * G * 16;
            const uint8_t *scale = (const uint8_t *)sc->data + sr * G;
            for (int64_t g = 0; g < G; g++)
                fmoe__mxfp4_from_openai(in + g * 16, scale[g], w->out + g * FMOE_MXFP4_BYTES);
            FMOE_FORWARD_IF_ERROR(write_all(w->f, w->out, (size_t)rb, w->path));
        }
    return 0;
}

static int write_source(writer *w, const out_tensor *o, int32_t e, int64_t rows, int64_t rb,
                        const float *importance, const fmoe_progress *progress, int64_t *done,
                        int64_t total);


static int write_tensor(writer *w, const out_tensor *o, const fmoe_progress *progress,
                        int64_t *done, int64_t total) {
    const int64_t cols = o->ne[0];
    if (o->mx_scales) {
        FMOE_FORWARD_IF_ERROR(write_mxfp4_copy(w, o));
        *done += o->nbytes;
        fmoe_progress_report(progress, *done, total, "bytes");
        return 0;
    }
    if (o->ndim == 1) { /* one row; a permuted q/k bias moves by element */
        const fmoe_st_tensor *s = o->src[0];
        for (int64_t k = 0; k < cols; k++) {
            const int64_t sk = permute_row(k, cols, o->permute_heads);
            widen(s, sk, 1, w->row + k);
            FMOE_FORWARD_IF_ERROR(check_finite(s, w->row + k, 1, 0, sk));
        }
        return write_all(w->f, w->row, (size_t)cols * 4, w->path);
    }
    /* rows of one source: one of nsrc stacked experts, or all of a lone 3-D tensor */
    const int64_t rows = o->ne[1] * (o->nsrc == 1 ? o->ne[2] : 1);
    const int64_t rb = fmoe_quant_row_bytes(o->type, cols);
    const int quantised = !is_float_type(o->type);
    float *importance = NULL; /* [experts][cols], as llama-quantize hands it to ggml */
    if (quantised && w->imatrix) {
        FMOE_FORWARD_IF_ERROR(fmoe__imatrix_get(w->imatrix, o->name, cols,
                                                o->ndim == 3 ? o->ne[2] : 1, &importance));
        const int uses = fmoe_quant_uses_importance(o->type);
        if (importance && !uses) {
            free(importance);
            importance = NULL;
            w->report->importance_ignored++;
        } else if (importance) {
            w->report->importance_used++;
        } else if (fmoe_quant_needs_importance(o->type)) {
            return fmoe_error_set(FMOE_EFORMAT,
                                  "%s: no importance for tensor %s, which is %s: its quantizer "
                                  "needs one (llama-quantize's error too)",
                                  w->imatrix_path, o->name, fmoe_ggml_type_name(o->type));
        } else if (uses) {
            w->report->importance_missing++;
        }
    }
    int rc = 0;
    for (int32_t e = 0; e < o->nsrc && rc == 0; e++)
        rc = write_source(w, o, e, rows, rb, importance, progress, done, total);
    free(importance);
    return rc;
}

/* Source e of o (one expert of stacked ones, or the whole tensor): its rows quantised or
 * converted, and written. */
static int write_source(writer *w, const out_tensor *o, int32_t e, int64_t rows, int64_t rb,
                        const float *importance, const fmoe_progress *progress, int64_t *done,
                        int64_t total) {
    const int64_t cols = o->ne[0];
    const int quantised = !is_float_type(o->type);
    {
        fmoe_st_tensor tmp;
        const fmoe_st_tensor *s;
        FMOE_FORWARD_IF_ERROR(source_rows(w, o, e, &tmp, &s));
        if (quantised) {
            if (rows * rb > w->out_cap) {
                uint8_t *nb = realloc(w->out, (size_t)(rows * rb));
                FMOE_RETURN_ERROR_IF(!nb, FMOE_ENOMEM, "out of memory for tensor %s", o->name);
                w->out = nb;
                w->out_cap = rows * rb;
            }
            for (int32_t k = 0; k < w->workers; k++) w->bad_row[k] = w->bad_col[k] = -1;
            quant_job j = {.o = o, .s = s, .rows = rows, .cols = cols, .rb = rb, .out = w->out,
                           .importance = importance, .expert0 = o->nsrc > 1 ? e : 0,
                           .rows_per_expert = o->ne[1], .scratch = w->scratch,
                           .bad_row = w->bad_row, .bad_col = w->bad_col};
            fmoe__pool_run(w->pool, quant_rows, &j, (int32_t)((rows + QUANT_CHUNK - 1) / QUANT_CHUNK));
            int64_t br = -1, bc = -1;
            for (int32_t k = 0; k < w->workers; k++)
                if (w->bad_row[k] >= 0 && (br < 0 || w->bad_row[k] < br))
                    br = w->bad_row[k], bc = w->bad_col[k];
            if (br >= 0) { /* a NaN or infinity would make its whole block garbage */
                float v;
                widen(s, br * cols + bc, 1, &v);
                return fmoe_error_set(FMOE_EFORMAT,
                                      "%s: tensor %s, row %lld, column %lld is %g: cannot "
                                      "quantize a non-finite value",
                                      s->file, s->name, (long long)br, (long long)bc, (double)v);
            }
            FMOE_FORWARD_IF_ERROR(write_all(w->f, w->out, (size_t)(rows * rb), w->path));
        } else {
            for (int64_t r = 0; r < rows; r++) {
                const int64_t sr = permute_row(r, rows, o->permute_heads);
                const void *out;
                widen(s, sr * cols, cols, w->row);
                FMOE_FORWARD_IF_ERROR(check_finite(s, w->row, cols, sr, 0));
                if (ggml_of(s->dtype) == o->type) { /* kept as is */
                    out = (const uint8_t *)s->data + sr * cols * fmoe_st_dtype_size(s->dtype);
                } else if (o->type == FMOE_GGML_F32) { /* F32 from F16/BF16 */
                    out = w->row;
                } else { /* F16/BF16 from another dtype (--type f16/bf16, FP8 kept) */
                    for (int64_t c = 0; c < cols; c++)
                        w->row16[c] = o->type == FMOE_GGML_F16 ? fmoe_float_to_half(w->row[c])
                                                               : fmoe_float_to_bf16(w->row[c]);
                    out = w->row16;
                }
                FMOE_FORWARD_IF_ERROR(write_all(w->f, out, (size_t)rb, w->path));
            }
        }
        *done += rows * rb;
        fmoe_progress_report(progress, *done, total, "bytes");
    }
    return 0;
}

/* ---------------------------------------------------------------------------------- */
/* The whole conversion                                                               */
/* ---------------------------------------------------------------------------------- */

static int arch_of(const fmoe_model_geometry *g, const char *dir, char arch[32], int *permute) {
    *permute = 0;
    switch (g->family) {
    case FMOE_FAMILY_MIXTRAL: strcpy(arch, "llama"), *permute = 1; return 0;
    case FMOE_FAMILY_QWEN2_MOE: strcpy(arch, "qwen2moe"); return 0;
    case FMOE_FAMILY_QWEN3_MOE: strcpy(arch, "qwen3moe"); return 0;
    case FMOE_FAMILY_OLMOE: strcpy(arch, "olmoe"); return 0;
    case FMOE_FAMILY_DEEPSEEK_V1: strcpy(arch, "deepseek"), *permute = 1; return 0;
    case FMOE_FAMILY_DEEPSEEK_V2:
    case FMOE_FAMILY_DEEPSEEK_V3: strcpy(arch, "deepseek2"); return 0; /* no permutation */
    case FMOE_FAMILY_GLM4_MOE: strcpy(arch, "glm4moe"); return 0;      /* neox rope already */
    case FMOE_FAMILY_GPT_OSS: strcpy(arch, "gpt-oss"); return 0;
    case FMOE_FAMILY_PHIMOE: strcpy(arch, "phimoe"); return 0;  /* neox rope: no permutation */
    case FMOE_FAMILY_LLAMA4: strcpy(arch, "llama4"); return 0;  /* undo_permute False */
    default:
        return fmoe_error_set(FMOE_EUNSUPPORTED,
                              "%s: model_type %s: fmoe quantize writes mixtral, qwen2_moe, "
                              "qwen3_moe, olmoe, deepseek, deepseek_v2, deepseek_v3, "
                              "glm4_moe, gpt_oss, phimoe and llama4 checkpoints",
                              dir, g->model_type);
    }
}

static char *read_text(const char *path, size_t *len) {
    FILE *f;
    if (fmoe__fopen_regular(path, &f) < 0) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        char *nb = realloc(buf, cap *= 2);
        if (!nb) free(buf);
        buf = nb;
    }
    const int bad = ferror(f);
    fclose(f);
    if (!buf || bad) {
        free(buf);
        fmoe_error_set(bad ? FMOE_EIO : FMOE_ENOMEM, "%s: cannot read", path);
        return NULL;
    }
    *len = n;
    return buf;
}

int fmoe_quantize_model(const fmoe_quantize_params *params, fmoe_quantize_report *report) {
    FMOE_RETURN_ERROR_IF(!params || !params->model_dir || !params->output || !report,
                         FMOE_EINVAL, "quantize: missing model directory or output");
    const uint32_t type = params->mix ? fmoe_quant_mix_base(params->mix) : params->type;
    FMOE_RETURN_ERROR_IF(params->mix && !type, FMOE_EINVAL, "quantize: unknown mix %d",
                         (int)params->mix);
    FMOE_RETURN_ERROR_IF(!fmoe_quant_can_quantize(type) && !is_float_type(type), FMOE_EINVAL,
                         "quantize: cannot write type %u (f32, f16, bf16, q8_0, q2_k, q3_k, "
                         "q4_k, q5_k, q6_k, iq4_xs, q4_0, q4_1, q5_0, q5_1, iq4_nl, mxfp4, "
                         "iq3_xxs, iq3_s or iq2_s)",
                         type);
    FMOE_RETURN_ERROR_IF(params->experts_type && !fmoe_quant_can_quantize(params->experts_type) &&
                             !fmoe_quant_needs_importance(params->experts_type),
                         FMOE_EINVAL, "quantize: cannot write experts type %u",
                         params->experts_type);
    FMOE_RETURN_ERROR_IF(params->experts_type && !params->imatrix &&
                             fmoe_quant_needs_importance(params->experts_type),
                         FMOE_EINVAL,
                         "quantize: experts type %s needs an importance matrix (--imatrix), as "
                         "llama.cpp's quantizer does",
                         fmoe_ggml_type_name(params->experts_type));
    /* the i-quants' search tables, built here so that running out of memory is an error
     * rather than an abort inside the thread pool */
    FMOE_FORWARD_IF_ERROR(fmoe_quant_prepare(type));
    if (params->experts_type) FMOE_FORWARD_IF_ERROR(fmoe_quant_prepare(params->experts_type));
    fmoe__imatrix *imatrix = NULL; /* opened first: a bad file fails before any work */
    if (params->imatrix) FMOE_FORWARD_IF_ERROR(fmoe__imatrix_open(params->imatrix, &imatrix));
    memset(report, 0, sizeof *report);
    const char *dir = params->model_dir;
    char path[4096], partial[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    snprintf(partial, sizeof partial, "%s.partial", params->output);

    fmoe_model_geometry *g = calloc(1, sizeof *g);
    fmoe_safetensors *st = NULL;
    char *config = NULL;
    cJSON *cfg = NULL;
    size_t config_len = 0;
    plan p = {0};
    kvs k = {0};
    bytes hdr = {0};
    FILE *f = NULL;
    writer wr = {0};
    int created = 0; /* the partial is ours to remove on failure */
    int rc;
    if (!g) {
        fmoe__imatrix_close(imatrix);
        return fmoe_error_set(FMOE_ENOMEM, "out of memory");
    }
    if ((rc = fmoe_geometry_load(path, g)) < 0) goto fail;
    if ((rc = arch_of(g, dir, k.arch, &p.permute)) < 0) goto fail;
    if (!(config = read_text(path, &config_len))) {
        rc = FMOE_EIO;
        goto fail;
    }
    if (!(cfg = cJSON_ParseWithLength(config, config_len))) {
        rc = fmoe_error_set(FMOE_EFORMAT, "%s: malformed JSON", path);
        goto fail;
    }
    if ((rc = fmoe_safetensors_open(dir, &st)) < 0) goto fail;
    /* Llama 4's multimodal checkpoints keep the text model under language_model. and its
     * config under text_config; the vision tower is not written (llama.cpp's converter
     * writes it to a separate mmproj file) */
    if (g->family == FMOE_FAMILY_LLAMA4 &&
        (rc = (int)fmoe_safetensors_strip_prefix(st, "language_model.")) < 0)
        goto fail;
    p.st = st;
    p.config = cfg;
    p.text = cJSON_GetObjectItemCaseSensitive(cfg, "text_config");
    if (!cJSON_IsObject(p.text)) p.text = cfg;
    p.g = g;
    p.dir = dir;
    p.type = type;
    p.mix = params->mix;
    p.experts_type = params->experts_type;
    p.mixmodel = (fmoe_quant_mix_model){
        .n_layer = g->num_hidden_layers,
        .n_head = g->num_attention_heads,
        .n_kv_head = g->num_key_value_heads,
        .n_expert = g->num_experts,
        /* llama.cpp gives the token embeddings the output head's type where the file has
         * no separate head */
        .has_output = fmoe_safetensors_find(st, "lm_head.weight") != NULL,
    };
    p.experts_only = params->experts_only;
    p.report = report;
    wr.imatrix = imatrix;
    wr.imatrix_path = params->imatrix;
    wr.report = report;
    snprintf(report->arch, sizeof report->arch, "%s", k.arch);
    if ((rc = build_plan(&p)) < 0) goto fail;
    wr.st = st;
    if (p.has_fp8 && (rc = fmoe__fp8_block_size(config, config_len, &wr.fp8_bm, &wr.fp8_bn)) < 0) {
        fmoe_error_prefix("%s", dir);
        goto fail;
    }

    /* header: magic, version, counts, key-value pairs, tensor infos, padding */
    metadata(&k, &p, config, config_len);
    if ((rc = embed_files(&k, dir)) < 0) goto fail;
    put(&hdr, "GGUF", 4);
    put_u32(&hdr, 3);
    put_u64(&hdr, (uint64_t)p.n);
    put_u64(&hdr, k.n);
    put(&hdr, k.b.b, k.b.n);
    uint64_t off = 0;
    int64_t max_cols = 1, total = 0;
    for (int64_t i = 0; i < p.n; i++) {
        out_tensor *o = &p.t[i];
        o->offset = off;
        off += ((uint64_t)o->nbytes + ALIGN - 1) / ALIGN * ALIGN;
        total += o->nbytes;
        if (o->ne[0] > max_cols) max_cols = o->ne[0];
        put_str(&hdr, o->name, strlen(o->name));
        put_u32(&hdr, (uint32_t)o->ndim);
        for (int d = 0; d < o->ndim; d++) put_u64(&hdr, (uint64_t)o->ne[d]);
        put_u32(&hdr, o->type);
        put_u64(&hdr, o->offset);
    }
    static const uint8_t zeros[ALIGN];
    put(&hdr, zeros, (ALIGN - hdr.n % ALIGN) % ALIGN);
    if (hdr.oom || k.b.oom) {
        rc = fmoe_error_set(FMOE_ENOMEM, "out of memory");
        goto fail;
    }
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    wr.workers = (int32_t)(ncpu < 1 ? 1 : ncpu > 256 ? 256 : ncpu);
    wr.row = malloc((size_t)max_cols * sizeof *wr.row);
    wr.row16 = malloc((size_t)max_cols * sizeof *wr.row16);
    wr.scratch = calloc((size_t)wr.workers, sizeof *wr.scratch);
    if (!wr.row || !wr.row16 || !wr.scratch) {
        rc = fmoe_error_set(FMOE_ENOMEM, "out of memory");
        goto fail;
    }
    for (int32_t k = 0; k < wr.workers; k++)
        if (!(wr.scratch[k] = malloc((size_t)max_cols * sizeof **wr.scratch))) {
            rc = fmoe_error_set(FMOE_ENOMEM, "out of memory");
            goto fail;
        }
    if ((rc = fmoe__pool_init(wr.workers, &wr.pool)) < 0) goto fail;

    if ((rc = fmoe__partial_fopen(params->output, partial, "wb", &f)) < 0) goto fail;
    created = 1;
    wr.f = f;
    wr.path = partial;
    if ((rc = write_all(f, hdr.b, hdr.n, partial)) < 0) goto fail;
    int64_t done = 0;
    for (int64_t i = 0; i < p.n; i++) {
        const out_tensor *o = &p.t[i];
        if ((rc = write_tensor(&wr, o, &params->progress, &done, total)) < 0)
            goto fail;
        if (i + 1 < p.n &&
            (rc = write_all(f, zeros, (size_t)(p.t[i + 1].offset - o->offset - (uint64_t)o->nbytes),
                            partial)) < 0)
            goto fail;
    }
    report->tensors = p.n;
    report->bytes_out = (int64_t)hdr.n + (int64_t)(p.n ? p.t[p.n - 1].offset + (uint64_t)p.t[p.n - 1].nbytes : 0);
    if (fflush(f) != 0 || ferror(f)) {
        rc = fmoe_error_set(FMOE_EIO, "%s: write failed: %s", partial, strerror(errno));
        goto fail;
    }
    const int closed = fclose(f);
    f = NULL;
    if (closed != 0) {
        rc = fmoe_error_set(FMOE_EIO, "%s: write failed: %s", partial, strerror(errno));
        goto fail;
    }
    if ((rc = fmoe__partial_commit(partial, params->output)) < 0) goto fail;
    rc = 0;
    goto done;
fail:
    if (f) fclose(f);
    if (created) unlink(partial); /* a half-written model is worth nothing */
done:
    for (int64_t i = 0; i < p.n; i++) free(p.t[i].src);
    free(p.t);
    free(p.made_data[0]);
    free(p.made_data[1]);
    free(k.b.b);
    free(hdr.b);
    fmoe__pool_free(wr.pool);
    for (int32_t k = 0; wr.scratch && k < wr.workers; k++) free(wr.scratch[k]);
    free(wr.scratch);
    free(wr.row);
    free(wr.row16);
    free(wr.src_f32);
    free(wr.view_f32);
    free(wr.out);
    cJSON_Delete(cfg);
    free(config);
    fmoe_safetensors_close(st);
    fmoe__imatrix_close(imatrix);
    free(g);
    return rc;
}
