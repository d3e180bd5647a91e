/*
 * load.c - binds a checkpoint's tensors to the model of its family.
 *
 * Tensor names follow each family's published checkpoints (the layout transformers'
 * save_pretrained writes, which reverts its in-memory fusions):
 *
 *   all          model.embed_tokens.weight [V,h], model.norm.weight [h],
 *                lm_head.weight [V,h] (absent when tie_word_embeddings),
 *                model.layers.i.{input_layernorm,post_attention_layernorm}.weight [h],
 *                model.layers.i.self_attn.{q,k,v,o}_proj.weight (+ .bias per family)
 *   qwen3_moe    self_attn.{q,k}_norm.weight [D]
 *   olmoe        self_attn.q_norm.weight [Hq·D], self_attn.k_norm.weight [Hkv·D]
 *   glm4_moe     self_attn.{q,k,v}_proj.bias (attention_bias), self_attn.{q,k}_norm.weight
 *                [D] (use_qk_norm); MoE and dense layers as deepseek, plus
 *                mlp.gate.e_score_correction_bias [J]. The multi-token-prediction layers
 *                (model.layers.L.. for L = num_hidden_layers, num_nextn_predict_layers of
 *                them) are in the files and never bound: inference skips them.
 *   gpt_oss      self_attn.sinks [Hq], mlp.router.{weight,bias}, fused input-major experts
 *                with biases (family_gptoss.c)
 *   phimoe       {input_layernorm,post_attention_layernorm}.bias, model.norm.bias [h]
 *                (LayerNorm), lm_head.bias [V] (lm_head_bias), experts as mixtral
 *   mixtral      block_sparse_moe.gate.weight [J,h],
 *                block_sparse_moe.experts.e.{w1 (gate), w3 (up)} [I,h], w2 (down) [h,I]
 *   qwen2_moe,   mlp.gate.weight [J,h], mlp.experts.e.{gate,up}_proj.weight [I,h],
 *   qwen3_moe,   mlp.experts.e.down_proj.weight [h,I]
 *   olmoe,
 *   deepseek
 *   qwen2_moe    mlp.shared_expert.{gate,up,down}_proj.weight, mlp.shared_expert_gate.weight [1,h]
 *   deepseek     mlp.shared_experts.{gate,up,down}_proj.weight (width n_shared·I)
 *   dense layers mlp.{gate,up,down}_proj.weight (qwen mlp_only / sparse-step layers,
 *                deepseek's first_k_dense_replace layers)
 *
 * transformers >= 5 keeps experts fused in memory (mlp.experts.gate_up_proj [J,2I,h] and
 * mlp.experts.down_proj [J,h,I]); a checkpoint saved in that layout is read too: expert
 * e's gate is rows [0, I) of gate_up_proj[e], its up rows [I, 2I).
 *
 * DeepSeek-V3/R1's and GLM-4.5-FP8's official files store the linear weights as F8_E4M3
 * with block scales (W_scale_inv, fp8_block.h): those are dequantised on load into owned
 * BF16 matrices (fp8_mat); the other tensors are read as usual.
 *
 * A GGUF file (llama.cpp's layout, or fmoe quantize's) is bound through the same HF names:
 * fmoe_gguf_tensor_for gives each one's GGUF tensor and, for routed experts, the slice of
 * the stacked blk.N.ffn_*_exps tensor [J][rows][cols] (a view at e·rows·row_bytes, read in
 * place whatever its block type). Where the converter permuted q/k rows for ggml's
 * adjacent-pair RoPE (llama, deepseek), an owned copy puts whole rows back in HF's
 * rotate-half order, so the forward pass is the one it runs for the HF checkpoint.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fmoe/error.h"
#include "files.h"
#include "fmoe/gguf.h"
#include "family_gptoss.h"
#include "family_llama4.h"
#include "fp8_block.h"
#include "half.h"
#include "model_impl.h"

#define NAME_CAP 256

int fmoe__model_keep_owned(fmoe_model *m, void *p) {
    if (m->num_owned == m->cap_owned) {
        int32_t cap = m->cap_owned ? m->cap_owned * 2 : 64;
        void **no = realloc(m->owned, (size_t)cap * sizeof *no);
        if (!no) return fmoe_error_set(FMOE_ENOMEM, "out of memory");
        m->owned = no;
        m->cap_owned = cap;
    }
    m->owned[m->num_owned++] = p;
    return 0;
}

/* A tensor of the given shape; the name is formatted. */
static int get_tensor(fmoe_model *m, int32_t ndim, const int64_t *shape,
                      const fmoe_st_tensor **out, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int get_tensor(fmoe_model *m, int32_t ndim, const int64_t *shape,
                      const fmoe_st_tensor **out, const char *fmt, ...) {
    char name[NAME_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    return fmoe_safetensors_get(m->st, name, ndim, shape, out);
}

static int has_tensor(fmoe_model *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int has_tensor(fmoe_model *m, const char *fmt, ...) {
    char name[NAME_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    if (m->gguf) {
        fmoe_gguf_tensor_ref ref;
        const fmoe_model_geometry *g = &m->geo;
        if (fmoe_gguf_tensor_for(m->gguf_arch, g->num_attention_heads, g->num_key_value_heads,
                                 name, &ref) < 0) {
            fmoe_error_clear();
            return 0;
        }
        return fmoe_gguf_find_tensor(m->gguf, ref.name) != NULL;
    }
    return fmoe_safetensors_find(m->st, name) != NULL;
}

/* ---------------------------------------------------------------------------------- */
/* GGUF                                                                               */
/* ---------------------------------------------------------------------------------- */

/* The checkpoint row that row r of a permuted q/k projection came from (as quantize.c and
 * llama.cpp's permute(): rows as [heads][2][D/2] with the last two axes swapped). */
static int64_t unpermute_row(int64_t r, int64_t rows, int32_t heads) {
    if (heads <= 0) return r;
    const int64_t hd = rows / heads, half = hd / 2;
    const int64_t h = r / hd, j = (r % hd) / 2, i = r % 2;
    return h * hd + i * half + j;
}

/* The GGUF tensor standing for HF tensor `name` with its HF shape [rows][cols] (rows 0:
 * a vector of cols), checked: present, a type fmoe computes with, the extents expected
 * (a stacked expert tensor: [J][rows][cols]). */
static int gguf_get(fmoe_model *m, const char *name, int64_t rows, int64_t cols,
                    fmoe_gguf_tensor_ref *ref, const fmoe_gguf_tensor **t) {
    const fmoe_model_geometry *g = &m->geo;
    FMOE_FORWARD_IF_ERROR(fmoe_gguf_tensor_for(m->gguf_arch, g->num_attention_heads,
                                               g->num_key_value_heads, name, ref));
    const fmoe_gguf_tensor *found = fmoe_gguf_find_tensor(m->gguf, ref->name);
    FMOE_RETURN_ERROR_IF(!found, FMOE_ENOTFOUND, "%s: missing tensor %s (HF %s)",
                         fmoe_gguf_name(m->gguf), ref->name, name);
    int64_t ne[3] = {cols, rows, g->num_experts};
    int32_t ndim = ref->expert >= 0 ? 3 : 2;
    if (rows == 0 || (rows == 1 && found->ndim == 1 && ref->expert < 0)) ndim = 1;
    FMOE_RETURN_ERROR_IF(ref->expert >= g->num_experts, FMOE_ENOTFOUND,
                         "%s: no expert %d in %s (%d experts)", fmoe_gguf_name(m->gguf),
                         ref->expert, ref->name, g->num_experts);
    return fmoe_gguf_get_tensor(m->gguf, ref->name, ndim, ne, t);
}

/* A vector [n] of the GGUF file as owned f32 (in HF order). */
static int gguf_vec(fmoe_model *m, const char *name, int64_t n, const float **out) {
    fmoe_gguf_tensor_ref ref;
    const fmoe_gguf_tensor *t;
    FMOE_FORWARD_IF_ERROR(gguf_get(m, name, 0, n, &ref, &t));
    float *v = malloc((size_t)(n ? n : 1) * sizeof *v), *tmp = malloc((size_t)(n ? n : 1) * sizeof *v);
    if (!v || !tmp || fmoe__model_keep_owned(m, v) < 0) {
        free(v);
        free(tmp);
        return fmoe_error_set(FMOE_ENOMEM, "out of memory");
    }
    fmoe_quant_dequantize_row(t->type, t->data, tmp, n);
    for (int64_t k = 0; k < n; k++) v[unpermute_row(k, n, ref.permute_heads)] = tmp[k];
    free(tmp);
    *out = v;
    return 0;
}

/* A matrix [rows][cols] of the GGUF file, read in place (an owned copy when its rows were
 * permuted, or its bytes are misaligned for a float type). */
static int gguf_mat(fmoe_model *m, const char *name, int64_t rows, int64_t cols,
                    fmoe__mat *out) {
    fmoe_gguf_tensor_ref ref;
    const fmoe_gguf_tensor *t;
    FMOE_FORWARD_IF_ERROR(gguf_get(m, name, rows, cols, &ref, &t));
    memset(out, 0, sizeof *out);
    switch (t->type) {
    case FMOE_GGML_F32: out->dtype = FMOE_ST_F32; break;
    case FMOE_GGML_F16: out->dtype = FMOE_ST_F16; break;
    case FMOE_GGML_BF16: out->dtype = FMOE_ST_BF16; break;
    default: out->dtype = FMOE_ST_U8, out->quant = t->type; break;
    }
    out->rows = rows;
    out->cols = cols;
    const int64_t rb = t->row_bytes, bytes = rows * rb;
    const int64_t at = ref.expert >= 0 ? (int64_t)ref.expert * bytes : 0;
    const uint8_t *p = (const uint8_t *)t->data + at;
    out->file = t->file; /* a split model: the shard holding the tensor */
    out->file_offset = (int64_t)t->offset + at;
    const int64_t es = out->quant ? 1 : fmoe_st_dtype_size(out->dtype);
    if (ref.permute_heads > 0 || (uintptr_t)p % (uintptr_t)es != 0) {
        uint8_t *copy = aligned_alloc(64, (size_t)((bytes + 63) / 64 * 64));
        if (!copy || fmoe__model_keep_owned(m, copy) < 0) {
            free(copy);
            return fmoe_error_set(FMOE_ENOMEM, "out of memory");
        }
        for (int64_t r = 0; r < rows; r++)
            memcpy(copy + unpermute_row(r, rows, ref.permute_heads) * rb, p + r * rb, (size_t)rb);
        p = copy;
    }
    out->data = p;
    if (out->quant && !m->quant) m->quant = out->quant;
    return 0;
}

/* One GGUF tensor of an MLA split (attn_k_b, attn_v_b) as `rows` rows of `cols` values,
 * checked (a type fmoe computes with; llama.cpp writes them 3-D, [H][rows/H][cols]) and
 * read in place in its file type (an owned copy when a float type's bytes are
 * misaligned). */
static int gguf_split_mat(fmoe_model *m, const char *name, int64_t cols, int64_t rows,
                          fmoe__mat *out) {
    const fmoe_gguf_tensor *t = fmoe_gguf_find_tensor(m->gguf, name);
    FMOE_RETURN_ERROR_IF(!t, FMOE_ENOTFOUND, "%s: missing tensor %s", fmoe_gguf_name(m->gguf),
                         name);
    FMOE_RETURN_ERROR_IF(t->ne[0] != cols || t->numel != cols * rows, FMOE_EFORMAT,
                         "%s: tensor %s has %lld values of rows of %lld, expected %lld x %lld",
                         fmoe_gguf_name(m->gguf), name, (long long)t->numel,
                         (long long)t->ne[0], (long long)rows, (long long)cols);
    FMOE_RETURN_ERROR_IF(!fmoe_quant_supported(t->type), FMOE_EUNSUPPORTED,
                         "%s: tensor %s has type %s, which fmoe does not compute with",
                         fmoe_gguf_name(m->gguf), name, fmoe_ggml_type_name(t->type));
    *out = (fmoe__mat){.rows = rows, .cols = cols, .file = t->file,
                       .file_offset = (int64_t)t->offset};
    switch (t->type) {
    case FMOE_GGML_F32: out->dtype = FMOE_ST_F32; break;
    case FMOE_GGML_F16: out->dtype = FMOE_ST_F16; break;
    case FMOE_GGML_BF16: out->dtype = FMOE_ST_BF16; break;
    default: out->dtype = FMOE_ST_U8, out->quant = t->type; break;
    }
    const int64_t es = out->quant ? 1 : fmoe_st_dtype_size(out->dtype);
    const int64_t bytes = fmoe__mat_bytes(out);
    const void *p = t->data;
    if ((uintptr_t)p % (uintptr_t)es != 0) {
        void *copy = aligned_alloc(64, (size_t)((bytes + 63) / 64 * 64));
        if (!copy || fmoe__model_keep_owned(m, copy) < 0) {
            free(copy);
            return fmoe_error_set(FMOE_ENOMEM, "out of memory");
        }
        memcpy(copy, p, (size_t)bytes);
        p = copy;
    }
    out->data = p;
    if (out->quant && !m->quant) m->quant = out->quant;
    return 0;
}

/* An owned, zeroed matrix [rows][cols] of (dtype, quant), its bytes in *out. */
static int owned_mat(fmoe_model *m, fmoe_st_dtype dtype, uint32_t quant, int64_t rows,
                     int64_t cols, fmoe__mat *out) {
    *out = (fmoe__mat){.dtype = dtype, .quant = quant, .rows = rows, .cols = cols};
    const int64_t bytes = fmoe__mat_bytes(out);
    void *p = aligned_alloc(64, (size_t)((bytes + 63) / 64 * 64));
    if (!p || fmoe__model_keep_owned(m, p) < 0) {
        free(p);
        return fmoe_error_set(FMOE_ENOMEM, "out of memory");
    }
    memset(p, 0, (size_t)bytes);
    out->data = p;
    return 0;
}

/*
 * kv_b_proj [H(dn + dv)][r] (an HF checkpoint's, or an older GGUF's attn_kv_b) split as
 * llama.cpp's converter splits it (model_impl.h wk_b, wv_b), so one attention code path
 * serves both: head h's dv value rows are copied as they are (any type), its dn key rows
 * transposed into r rows of dn, in the source's float type, or as f32 from a block type
 * (whose blocks run along r, not dn). Owned: no file range holds these bytes.
 */
static int kv_b_split(fmoe_model *m, const fmoe__mat *kv, int64_t H, int64_t dn, int64_t dv,
                      int64_t r, fmoe__mat *k_b, fmoe__mat *v_b) {
    const int64_t w = dn + dv, kv_rb = fmoe__row_bytes(kv->dtype, kv->quant, r);
    FMOE_FORWARD_IF_ERROR(owned_mat(m, kv->dtype, kv->quant, H * dv, r, v_b));
    const fmoe_st_dtype kt = kv->quant ? FMOE_ST_F32 : kv->dtype;
    FMOE_FORWARD_IF_ERROR(owned_mat(m, kt, 0, H * r, dn, k_b));
    const uint8_t *src = kv->data;
    uint8_t *vd = (uint8_t *)v_b->data, *kd = (uint8_t *)k_b->data;
    const int64_t es = fmoe_st_dtype_size(kt);
    float *row = kv->quant ? malloc((size_t)r * sizeof *row) : NULL;
    if (kv->quant && !row) return fmoe_error_set(FMOE_ENOMEM, "out of memory");
    for (int64_t h = 0; h < H; h++) {
        for (int64_t v = 0; v < dv; v++)
            memcpy(vd + (h * dv + v) * kv_rb, src + (h * w + dn + v) * kv_rb, (size_t)kv_rb);
        for (int64_t d = 0; d < dn; d++) { /* key row d of head h is column d of k_b[h] */
            const uint8_t *in = src + (h * w + d) * kv_rb;
            if (row) {
                fmoe_quant_dequantize_row(kv->quant, in, row, r);
                in = (const uint8_t *)row;
            }
            for (int64_t c = 0; c < r; c++)
                memcpy(kd + ((h * r + c) * dn + d) * es, in + c * es, (size_t)es);
        }
    }
    free(row);
    return 0;
}

/* Frees p if the model owns it (a converted source, once its split is made), so that the
 * model does not hold both; a view into a file is left alone. */
static void drop_owned(fmoe_model *m, const void *p) {
    for (int32_t k = m->num_owned - 1; k >= 0; k--) {
        if (m->owned[k] != p) continue;
        free(m->owned[k]);
        memmove(m->owned + k, m->owned + k + 1,
                (size_t)(m->num_owned - k - 1) * sizeof *m->owned);
        m->num_owned--;
        return;
    }
}

/* Converts a 1-D tensor of n values to an owned f32 array. */
static int to_f32(fmoe_model *m, const fmoe_st_tensor *t, const float **out) {
    float *v = malloc((size_t)(t->numel ? t->numel : 1) * sizeof *v);
    if (!v || fmoe__model_keep_owned(m, v) < 0) {
        free(v);
        return fmoe_error_set(FMOE_ENOMEM, "out of memory");
    }
    const uint8_t *p = t->data;
    for (int64_t i = 0; i < t->numel; i++) {
        if (t->dtype == FMOE_ST_F32) {
            memcpy(&v[i], p + 4 * i, 4);
        } else {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            v[i] = t->dtype == FMOE_ST_F16 ? fmoe_half_to_float(h) : fmoe_bf16_to_float(h);
        }
    }
    *out = v;
    return 0;
}

/* A vector [n] converted to f32. */
static int vec(fmoe_model *m, int64_t n, const float **out, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int vec(fmoe_model *m, int64_t n, const float **out, const char *fmt, ...) {
    char name[NAME_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    if (m->gguf) return gguf_vec(m, name, n, out);
    const fmoe_st_tensor *t;
    FMOE_FORWARD_IF_ERROR(fmoe_safetensors_get(m->st, name, 1, &n, &t));
    return to_f32(m, t, out);
}

/* A view of `rows` x `cols` values starting `offset` elements into tensor t; copied to
 * an aligned owned buffer when the mapped bytes are misaligned for the dtype. */
static int view(fmoe_model *m, const fmoe_st_tensor *t, int64_t offset, int64_t rows,
                int64_t cols, fmoe__mat *out) {
    const int64_t es = fmoe_st_dtype_size(t->dtype);
    const uint8_t *p = (const uint8_t *)t->data + offset * es;
    out->dtype = t->dtype;
    out->quant = 0;
    out->rows = rows;
    out->cols = cols;
    out->file = t->file;
    out->file_offset = t->offset + offset * es;
    if (((uintptr_t)p % (uintptr_t)es) != 0) {
        void *copy = aligned_alloc(64, (size_t)((rows * cols * es + 63) / 64 * 64));
        if (!copy || fmoe__model_keep_owned(m, copy) < 0) {
            free(copy);
            return fmoe_error_set(FMOE_ENOMEM, "out of memory");
        }
        memcpy(copy, p, (size_t)(rows * cols * es));
        p = copy;
    }
    out->data = p;
    return 0;
}

/* An FP8 block-scaled weight [rows][cols] (DeepSeek-V3's and GLM-4.5-FP8's official
 * files, fp8_block.h), dequantised into an owned BF16 matrix: no file range holds those
 * bytes, so a live executor serves them from its host tier. */
static int fp8_mat(fmoe_model *m, const fmoe_st_tensor *t, int64_t rows, int64_t cols,
                   fmoe__mat *out) {
    FMOE_RETURN_ERROR_IF(t->ndim != 2, FMOE_EMISMATCH,
                         "%s: tensor %s has %d dimensions, expected 2: [%lld,%lld]", t->file,
                         t->name, t->ndim, (long long)rows, (long long)cols);
    FMOE_RETURN_ERROR_IF(t->shape[0] != rows || t->shape[1] != cols, FMOE_EMISMATCH,
                         "%s: tensor %s has shape [%lld,%lld], expected [%lld,%lld]", t->file,
                         t->name, (long long)t->shape[0], (long long)t->shape[1],
                         (long long)rows, (long long)cols);
    int64_t bm, bn;
    FMOE_FORWARD_IF_ERROR(fmoe__fp8_block_size(m->config_json, strlen(m->config_json), &bm, &bn));
    uint16_t *w = aligned_alloc(64, (size_t)((rows * cols * 2 + 63) / 64 * 64));
    if (!w || fmoe__model_keep_owned(m, w) < 0) {
        free(w);
        return fmoe_error_set(FMOE_ENOMEM, "out of memory for tensor %s", t->name);
    }
    FMOE_FORWARD_IF_ERROR(fmoe__fp8_dequantize(m->st, t, bm, bn, FMOE_ST_BF16, w));
    *out = (fmoe__mat){.data = w, .dtype = FMOE_ST_BF16, .rows = rows, .cols = cols};
    return 0;
}

/* A matrix [rows][cols]. */
static int mat(fmoe_model *m, int64_t rows, int64_t cols, fmoe__mat *out, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int mat(fmoe_model *m, int64_t rows, int64_t cols, fmoe__mat *out, const char *fmt, ...) {
    char name[NAME_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    if (m->gguf) return gguf_mat(m, name, rows, cols, out);
    const int64_t shape[2] = {rows, cols};
    const fmoe_st_tensor *t = fmoe_safetensors_find(m->st, name);
    if (t && t->dtype == FMOE_ST_F8_E4M3) return fp8_mat(m, t, rows, cols, out);
    FMOE_FORWARD_IF_ERROR(fmoe_safetensors_get(m->st, name, 2, shape, &t));
    return view(m, t, 0, rows, cols, out);
}

/* A SwiGLU MLP `prefix`.{gate,up,down}_proj.weight of width I. */
static int mlp(fmoe_model *m, const char *prefix, int64_t I, fmoe__mlp *out) {
    const int64_t h = m->geo.hidden_size;
    FMOE_FORWARD_IF_ERROR(mat(m, I, h, &out->gate, "%s.gate_proj.weight", prefix));
    FMOE_FORWARD_IF_ERROR(mat(m, I, h, &out->up, "%s.up_proj.weight", prefix));
    FMOE_FORWARD_IF_ERROR(mat(m, h, I, &out->down, "%s.down_proj.weight", prefix));
    return 0;
}

/* The routed experts of decoder layer i, in either layout. */
static int experts(fmoe_model *m, int32_t i, const char *moe, fmoe__mlp *ex) {
    const int64_t h = m->geo.hidden_size, I = m->geo.moe_intermediate_size;
    const int32_t J = m->geo.num_experts;
    const int mixtral =
        m->geo.family == FMOE_FAMILY_MIXTRAL || m->geo.family == FMOE_FAMILY_PHIMOE;
    if (has_tensor(m, "model.layers.%d.%s.experts.gate_up_proj", i, moe) ||
        (mixtral && has_tensor(m, "model.layers.%d.mlp.experts.gate_up_proj", i))) {
        const char *blk = has_tensor(m, "model.layers.%d.%s.experts.gate_up_proj", i, moe)
                              ? moe
                              : "mlp";
        const fmoe_st_tensor *gu, *dn;
        const int64_t gs[3] = {J, 2 * I, h}, ds[3] = {J, h, I};
        FMOE_FORWARD_IF_ERROR(
            get_tensor(m, 3, gs, &gu, "model.layers.%d.%s.experts.gate_up_proj", i, blk));
        FMOE_FORWARD_IF_ERROR(
            get_tensor(m, 3, ds, &dn, "model.layers.%d.%s.experts.down_proj", i, blk));
        for (int32_t e = 0; e < J; e++) {
            FMOE_FORWARD_IF_ERROR(view(m, gu, (int64_t)e * 2 * I * h, I, h, &ex[e].gate));
            FMOE_FORWARD_IF_ERROR(view(m, gu, (int64_t)e * 2 * I * h + I * h, I, h, &ex[e].up));
            FMOE_FORWARD_IF_ERROR(view(m, dn, (int64_t)e * h * I, h, I, &ex[e].down));
        }
        return 0;
    }
    for (int32_t e = 0; e < J; e++) {
        if (mixtral) {
            FMOE_FORWARD_IF_ERROR(
                mat(m, I, h, &ex[e].gate, "model.layers.%d.%s.experts.%d.w1.weight", i, moe, e));
            FMOE_FORWARD_IF_ERROR(
                mat(m, I, h, &ex[e].up, "model.layers.%d.%s.experts.%d.w3.weight", i, moe, e));
            FMOE_FORWARD_IF_ERROR(
                mat(m, h, I, &ex[e].down, "model.layers.%d.%s.experts.%d.w2.weight", i, moe, e));
        } else {
            char prefix[NAME_CAP];
            snprintf(prefix, sizeof prefix, "model.layers.%d.%s.experts.%d", i, moe, e);
            FMOE_FORWARD_IF_ERROR(mlp(m, prefix, I, &ex[e]));
        }
    }
    return 0;
}

/* DeepSeek-V2/V3's multi-head latent attention projections of layer i (mla.c). */
static int bind_mla(fmoe_model *m, int32_t i, fmoe__layer *L) {
    const fmoe_model_geometry *g = &m->geo;
    const int64_t h = g->hidden_size, H = g->num_attention_heads;
    const int64_t dn = g->qk_nope_head_dim, dr = g->qk_rope_head_dim, dv = g->v_head_dim;
    const int64_t r = g->kv_lora_rank, rq = g->q_lora_rank;
    const char *a = "model.layers.%d.self_attn";
    char p[NAME_CAP];
    snprintf(p, sizeof p, a, i);
    if (rq > 0) {
        FMOE_FORWARD_IF_ERROR(mat(m, rq, h, &L->wq_a, "%s.q_a_proj.weight", p));
        FMOE_FORWARD_IF_ERROR(vec(m, rq, &L->q_a_norm, "%s.q_a_layernorm.weight", p));
        FMOE_FORWARD_IF_ERROR(mat(m, H * (dn + dr), rq, &L->wq_b, "%s.q_b_proj.weight", p));
    } else {
        FMOE_FORWARD_IF_ERROR(mat(m, H * (dn + dr), h, &L->wq, "%s.q_proj.weight", p));
    }
    FMOE_FORWARD_IF_ERROR(mat(m, r + dr, h, &L->wkv_a, "%s.kv_a_proj_with_mqa.weight", p));
    FMOE_FORWARD_IF_ERROR(vec(m, r, &L->kv_a_norm, "%s.kv_a_layernorm.weight", p));
    if (m->gguf && !has_tensor(m, "%s.kv_b_proj.weight", p)) { /* split by the converter */
        char kn[64], vn[64];
        snprintf(kn, sizeof kn, "blk.%d.attn_k_b.weight", i);
        snprintf(vn, sizeof vn, "blk.%d.attn_v_b.weight", i);
        FMOE_FORWARD_IF_ERROR(gguf_split_mat(m, kn, dn, H * r, &L->wk_b));
        FMOE_FORWARD_IF_ERROR(gguf_split_mat(m, vn, r, H * dv, &L->wv_b));
    } else {
        fmoe__mat kv;
        FMOE_FORWARD_IF_ERROR(mat(m, H * (dn + dv), r, &kv, "%s.kv_b_proj.weight", p));
        FMOE_FORWARD_IF_ERROR(kv_b_split(m, &kv, H, dn, dv, r, &L->wk_b, &L->wv_b));
        drop_owned(m, kv.data); /* FP8's dequantised or a realigned copy: not kept */
    }
    return mat(m, h, H * dv, &L->wo, "%s.o_proj.weight", p);
}

/* The grouped-query attention projections of layer i (every family but MLA's). */
static int bind_gqa(fmoe_model *m, int32_t i, fmoe__layer *L) {
    const fmoe_model_geometry *g = &m->geo;
    const fmoe__arch *a = &m->arch;
    const int64_t h = g->hidden_size, D = g->head_dim;
    const int64_t qd = (int64_t)g->num_attention_heads * D, kd = (int64_t)g->num_key_value_heads * D;

    FMOE_FORWARD_IF_ERROR(mat(m, qd, h, &L->wq, "model.layers.%d.self_attn.q_proj.weight", i));
    FMOE_FORWARD_IF_ERROR(mat(m, kd, h, &L->wk, "model.layers.%d.self_attn.k_proj.weight", i));
    FMOE_FORWARD_IF_ERROR(mat(m, kd, h, &L->wv, "model.layers.%d.self_attn.v_proj.weight", i));
    FMOE_FORWARD_IF_ERROR(mat(m, h, qd, &L->wo, "model.layers.%d.self_attn.o_proj.weight", i));
    if (a->attn_bias_qkv) {
        FMOE_FORWARD_IF_ERROR(vec(m, qd, &L->bq, "model.layers.%d.self_attn.q_proj.bias", i));
        FMOE_FORWARD_IF_ERROR(vec(m, kd, &L->bk, "model.layers.%d.self_attn.k_proj.bias", i));
        FMOE_FORWARD_IF_ERROR(vec(m, kd, &L->bv, "model.layers.%d.self_attn.v_proj.bias", i));
    }
    if (a->attn_bias_o)
        FMOE_FORWARD_IF_ERROR(vec(m, h, &L->bo, "model.layers.%d.self_attn.o_proj.bias", i));
    if (a->qk_norm == FMOE__QK_NORM_HEAD && g->family != FMOE_FAMILY_LLAMA4) {
        /* (Llama 4's L2 norm has no weight: fmoe__llama4_bind_attention) */
        FMOE_FORWARD_IF_ERROR(vec(m, D, &L->q_norm, "model.layers.%d.self_attn.q_norm.weight", i));
        FMOE_FORWARD_IF_ERROR(vec(m, D, &L->k_norm, "model.layers.%d.self_attn.k_norm.weight", i));
    } else if (a->qk_norm == FMOE__QK_NORM_FULL) {
        FMOE_FORWARD_IF_ERROR(
            vec(m, qd, &L->q_norm, "model.layers.%d.self_attn.q_norm.weight", i));
        FMOE_FORWARD_IF_ERROR(
            vec(m, kd, &L->k_norm, "model.layers.%d.self_attn.k_norm.weight", i));
    }
    return 0;
}

/* Llama 4's MoE block (feed_forward.*): router, routed experts (fused input-major in a
 * checkpoint: family_llama4.c; stacked in a GGUF file, read in place) and the shared
 * expert of the routed width. */
static int bind_llama4_moe(fmoe_model *m, int32_t i, fmoe__layer *L, int32_t moe_index) {
    const fmoe_model_geometry *g = &m->geo;
    const int64_t h = g->hidden_size, I = g->moe_intermediate_size;
    FMOE_FORWARD_IF_ERROR(mat(m, g->num_experts, h, &L->router,
                              "model.layers.%d.feed_forward.router.weight", i));
    L->experts = m->expert_pool + (int64_t)moe_index * g->num_experts;
    if (m->gguf) {
        for (int32_t e = 0; e < g->num_experts; e++) {
            char prefix[NAME_CAP];
            snprintf(prefix, sizeof prefix, "model.layers.%d.feed_forward.experts.%d", i, e);
            FMOE_FORWARD_IF_ERROR(mlp(m, prefix, I, &L->experts[e]));
        }
    } else {
        FMOE_FORWARD_IF_ERROR(fmoe__llama4_bind_experts(m, i, L->experts));
    }
    char prefix[NAME_CAP];
    snprintf(prefix, sizeof prefix, "model.layers.%d.feed_forward.shared_expert", i);
    L->has_shared = 1;
    return mlp(m, prefix, g->shared_intermediate_size, &L->shared);
}

static int bind_layer(fmoe_model *m, int32_t i, int32_t moe_index) {
    const fmoe_model_geometry *g = &m->geo;
    fmoe__layer *L = &m->layers[i];
    const int64_t h = g->hidden_size;

    FMOE_FORWARD_IF_ERROR(vec(m, h, &L->attn_norm, "model.layers.%d.input_layernorm.weight", i));
    FMOE_FORWARD_IF_ERROR(
        vec(m, h, &L->ffn_norm, "model.layers.%d.post_attention_layernorm.weight", i));
    if (m->arch.layernorm) {
        FMOE_FORWARD_IF_ERROR(
            vec(m, h, &L->attn_norm_b, "model.layers.%d.input_layernorm.bias", i));
        FMOE_FORWARD_IF_ERROR(
            vec(m, h, &L->ffn_norm_b, "model.layers.%d.post_attention_layernorm.bias", i));
    }
    FMOE_FORWARD_IF_ERROR(m->arch.mla ? bind_mla(m, i, L) : bind_gqa(m, i, L));
    if (m->arch.attn_sinks) FMOE_FORWARD_IF_ERROR(fmoe__gptoss_bind_sinks(m, i, L));
    const int llama4 = g->family == FMOE_FAMILY_LLAMA4;
    if (llama4) FMOE_FORWARD_IF_ERROR(fmoe__llama4_bind_attention(m, i, L, m->gguf != NULL));

    L->moe_index = moe_index;
    if (moe_index < 0) {
        char prefix[NAME_CAP];
        snprintf(prefix, sizeof prefix, "model.layers.%d.%s", i, llama4 ? "feed_forward" : "mlp");
        FMOE_RETURN_ERROR_IF(g->intermediate_size <= 0, FMOE_EFORMAT,
                             "layer %d is dense but intermediate_size is 0", i);
        return mlp(m, prefix, g->intermediate_size, &L->shared);
    }

    if (g->family == FMOE_FAMILY_GPT_OSS) { /* its own layout (family_gptoss.c) */
        L->experts = m->expert_pool + (int64_t)moe_index * g->num_experts;
        return fmoe__gptoss_bind_moe(m, i, L);
    }
    if (llama4) return bind_llama4_moe(m, i, L, moe_index);
    /* Phi-3.5-MoE keeps Mixtral's names (block_sparse_moe, experts.e.w1/w2/w3) */
    const int mixtral_names =
        g->family == FMOE_FAMILY_MIXTRAL || g->family == FMOE_FAMILY_PHIMOE;
    const char *moe = mixtral_names ? "block_sparse_moe" : "mlp";
    /* transformers >= 5 may save Mixtral's block as "mlp" */
    if (mixtral_names &&
        !has_tensor(m, "model.layers.%d.block_sparse_moe.gate.weight", i) &&
        has_tensor(m, "model.layers.%d.mlp.gate.weight", i))
        moe = "mlp";
    FMOE_FORWARD_IF_ERROR(
        mat(m, g->num_experts, h, &L->router, "model.layers.%d.%s.gate.weight", i, moe));
    if (strcmp(g->topk_method, "noaux_tc") == 0)
        FMOE_FORWARD_IF_ERROR(vec(m, g->num_experts, &L->route_bias,
                                  "model.layers.%d.%s.gate.e_score_correction_bias", i, moe));
    L->experts = m->expert_pool + (int64_t)moe_index * g->num_experts;
    FMOE_FORWARD_IF_ERROR(experts(m, i, moe, L->experts));

    if (g->num_shared_experts > 0 && g->shared_intermediate_size > 0) {
        char prefix[NAME_CAP];
        L->has_shared = 1;
        if (g->family == FMOE_FAMILY_QWEN2_MOE) {
            snprintf(prefix, sizeof prefix, "model.layers.%d.mlp.shared_expert", i);
            FMOE_FORWARD_IF_ERROR(mlp(m, prefix, g->shared_intermediate_size, &L->shared));
            FMOE_FORWARD_IF_ERROR(
                mat(m, 1, h, &L->shared_gate, "model.layers.%d.mlp.shared_expert_gate.weight", i));
        } else {
            snprintf(prefix, sizeof prefix, "model.layers.%d.mlp.shared_experts", i);
            FMOE_FORWARD_IF_ERROR(mlp(m, prefix, g->shared_intermediate_size, &L->shared));
        }
    }
    return 0;
}

/* Reads config.json into a NUL-terminated string (lib/files.h: a regular file, so a FIFO
 * does not block the load; 64 MiB at most, far above any config). */
static int read_config(const char *path, char **out, size_t *len) {
    return fmoe__read_file_bounded(path, "a config.json", (long long)64 << 20, 0, out, len);
}

void fmoe_model_free(fmoe_model *m) {
    if (!m) return;
    if (m->backend_weights.cache && m->backend_weights.cache_free)
        m->backend_weights.cache_free(m->backend_weights.cache);
    for (int32_t i = 0; i < m->num_owned; i++) free(m->owned[i]);
    free(m->owned);
    free(m->layers);
    free(m->expert_pool);
    free(m->layer_expert_bytes);
    fmoe__arch_free(&m->arch);
    fmoe_safetensors_close(m->st);
    fmoe_gguf_close(m->gguf);
    free(m->config_json);
    free(m->dir);
    free(m);
}

int fmoe_model_load(const char *dir, const void *options, fmoe_model **out) {
    (void)options;
    if (!dir || !out) return fmoe_error_set(FMOE_EINVAL, "model directory or output is NULL");
    *out = NULL;
    fmoe_model *m = calloc(1, sizeof *m);
    if (!m) return fmoe_error_set(FMOE_ENOMEM, "out of memory");
    int rc;
    char *path = NULL;
    size_t plen = strlen(dir) + 32, json_len = 0;
    if (!(path = malloc(plen)) || !(m->dir = strdup(dir))) {
        rc = fmoe_error_set(FMOE_ENOMEM, "out of memory");
        goto fail;
    }

    /* Config first: an unsupported family fails before any weight is touched. A GGUF
     * file carries it (fmoe.hf_config, or built from llama.cpp's keys). */
    const int gguf = fmoe_gguf_is_file(dir);
    struct stat st;
    if (!gguf && stat(dir, &st) != 0) {
        rc = fmoe_error_set(FMOE_EIO, "%s: cannot open: %s", dir, strerror(errno));
        goto fail;
    }
    if (!gguf && !S_ISDIR(st.st_mode)) {
        rc = fmoe_error_set(FMOE_EFORMAT, "%s: neither a model directory nor a GGUF file", dir);
        goto fail;
    }
    if (gguf) {
        snprintf(path, plen, "%s", dir);
        int exact = 0;
        fmoe_gguf_str arch;
        if ((rc = fmoe_gguf_open(dir, &m->gguf)) < 0) goto fail;
        if ((rc = fmoe_gguf_get_str(m->gguf, "general.architecture", &arch)) < 0) goto fail;
        snprintf(m->gguf_arch, sizeof m->gguf_arch, "%.*s",
                 (int)(arch.len < 31 ? arch.len : 31), arch.ptr);
        if ((rc = fmoe_gguf_config_json(m->gguf, &m->config_json, &exact)) < 0) goto fail;
        json_len = strlen(m->config_json);
    } else {
        snprintf(path, plen, "%s/config.json", dir);
        if ((rc = read_config(path, &m->config_json, &json_len)) < 0) goto fail;
    }
    if ((rc = fmoe_geometry_parse(m->config_json, json_len, &m->geo)) < 0) {
        fmoe_error_prefix("%s", path);
        goto fail;
    }
    const fmoe_model_geometry *g = &m->geo;
    switch (g->family) {
    case FMOE_FAMILY_MIXTRAL:
    case FMOE_FAMILY_QWEN2_MOE:
    case FMOE_FAMILY_QWEN3_MOE:
    case FMOE_FAMILY_OLMOE:
    case FMOE_FAMILY_DEEPSEEK_V1:
    case FMOE_FAMILY_DEEPSEEK_V2:
    case FMOE_FAMILY_DEEPSEEK_V3:
    case FMOE_FAMILY_PHIMOE:
    case FMOE_FAMILY_GLM4_MOE: break;
    case FMOE_FAMILY_GPT_OSS: break;
    case FMOE_FAMILY_LLAMA4: break;
    default: {
        const char *what = g->family == FMOE_FAMILY_LLAMA4 ? "Llama-4" : "this family";
        rc = fmoe_error_set(FMOE_EUNSUPPORTED,
                            "%s: model_type \"%s\" (%s) is not yet supported by the forward "
                            "pass (supported: mixtral, qwen2_moe, qwen3_moe, olmoe, deepseek, "
                            "deepseek_v2, deepseek_v3, phimoe, glm4_moe, gpt_oss, llama4)",
                            path, g->model_type, what);
        goto fail;
    }
    }
    if ((rc = fmoe__arch_parse(m->config_json, json_len, g, &m->arch)) < 0) {
        fmoe_error_prefix("%s", path);
        goto fail;
    }
    /* Sigmoid scores and expert groups are DeepSeek-V2/V3's and GLM-4.5's
     * (fmoe_route_row_grouped). */
    const int v23 = g->family == FMOE_FAMILY_DEEPSEEK_V2 ||
                    g->family == FMOE_FAMILY_DEEPSEEK_V3 || g->family == FMOE_FAMILY_GLM4_MOE;
    /* Llama 4: sigmoid of the chosen logits, no groups */
    const int sig_ok = v23 || (g->family == FMOE_FAMILY_LLAMA4 && g->n_group <= 1);
    if (g->head_dim % 2 != 0 || g->num_attention_heads % g->num_key_value_heads != 0 ||
        (!sig_ok && (g->scoring != FMOE_ROUTER_SOFTMAX || g->n_group > 1))) {
        rc = fmoe_error_set(FMOE_EUNSUPPORTED,
                            "%s: head_dim %d, %d heads over %d kv heads, %s router: not "
                            "supported (even head_dim, whole kv groups, softmax routing)",
                            path, g->head_dim, g->num_attention_heads, g->num_key_value_heads,
                            g->scoring == FMOE_ROUTER_SOFTMAX ? "softmax" : "sigmoid");
        goto fail;
    }

    if (!gguf && (rc = fmoe_safetensors_open(dir, &m->st)) < 0) goto fail;
    if (gguf && g->family == FMOE_FAMILY_LLAMA4 && (rc = fmoe__llama4_gguf_rope(m)) < 0)
        goto fail;
    /* Llama 4's multimodal checkpoints (Llama4ForConditionalGeneration) keep the text
     * model under language_model.; the vision tower's tensors are never bound */
    if (!gguf && g->family == FMOE_FAMILY_LLAMA4 &&
        (rc = fmoe_safetensors_strip_prefix(m->st, "language_model.")) < 0)
        goto fail;

    const int64_t V = g->vocab_size, h = g->hidden_size;
    m->layers = calloc((size_t)g->num_hidden_layers, sizeof *m->layers);
    m->expert_pool =
        calloc((size_t)g->num_moe_layers * (size_t)g->num_experts, sizeof *m->expert_pool);
    if (!m->layers || !m->expert_pool) {
        rc = fmoe_error_set(FMOE_ENOMEM, "out of memory");
        goto fail;
    }
    if ((rc = mat(m, V, h, &m->embed, "model.embed_tokens.weight")) < 0) goto fail;
    if ((rc = vec(m, h, &m->final_norm, "model.norm.weight")) < 0) goto fail;
    if (m->arch.layernorm && (rc = vec(m, h, &m->final_norm_b, "model.norm.bias")) < 0)
        goto fail;
    if (g->tie_word_embeddings) /* as transformers ties them, whatever the file holds */
        m->lm_head = m->embed;
    else if ((rc = mat(m, V, h, &m->lm_head, "lm_head.weight")) < 0)
        goto fail;
    if (m->arch.lm_head_bias && (rc = vec(m, V, &m->lm_head_b, "lm_head.bias")) < 0) goto fail;

    int32_t l = 0;
    for (int32_t i = 0; i < g->num_hidden_layers; i++) {
        int32_t moe_index = -1;
        if (l < g->num_moe_layers && g->moe_layer_index[l] == i) moe_index = l++;
        if ((rc = bind_layer(m, i, moe_index)) < 0) goto fail;
    }

    /* the query projection's type (MLA with a low-rank query: q_b_proj's) */
    const fmoe__mat *wq = m->layers[0].wq.data ? &m->layers[0].wq : &m->layers[0].wq_b;
    const char *dt = wq->quant ? fmoe_ggml_type_name(wq->quant) : fmoe_st_dtype_name(wq->dtype);
    char types[64];
    snprintf(types, sizeof types, "%s", dt);
    if (g->num_moe_layers > 0) {
        /* A GGUF file's experts are what it quantised; the trace and the simulator's
         * expert bytes follow them (fmoe_geometry_expert_bytes at expert_dtype). */
        const fmoe__mat *e = &m->expert_pool[0].gate;
        fmoe_dtype ed = e->dtype == FMOE_ST_F32   ? FMOE_DTYPE_F32
                        : e->dtype == FMOE_ST_F16 ? FMOE_DTYPE_F16
                                                  : FMOE_DTYPE_BF16;
        if (e->quant) (void)fmoe_dtype_of_ggml_type(e->quant, &ed);
        if (gguf) m->geo.expert_dtype = ed;
        if (e->quant != wq->quant || (!e->quant && e->dtype != wq->dtype))
            snprintf(types, sizeof types, "%s, experts %s", dt,
                     e->quant ? fmoe_ggml_type_name(e->quant) : fmoe_st_dtype_name(e->dtype));
    }
    if ((rc = fmoe__model_count_expert_bytes(m)) < 0) goto fail;
    if ((rc = fmoe__model_check_finite(m)) < 0) {
        fmoe_error_prefix("%s", dir);
        goto fail;
    }
    char attn[64] = "";
    if (m->arch.mla) /* what the cache holds per token and layer (mla.c) */
        snprintf(attn, sizeof attn, ", MLA latent %d + rope %d", g->kv_lora_rank,
                 g->qk_rope_head_dim);
    snprintf(m->describe, sizeof m->describe,
             "%s: %d layers (%d MoE), %d experts top-%d%s, hidden %d%s, %s, %s", g->model_type,
             g->num_hidden_layers, g->num_moe_layers, g->num_experts, g->top_k,
             g->num_shared_experts ? " + shared" : "", g->hidden_size, attn, types,
             m->arch.rope_desc);
    free(path);
    *out = m;
    return 0;
fail:
    free(path);
    fmoe_model_free(m);
    return rc;
}

const fmoe_model_geometry *fmoe_model_get_geometry(const fmoe_model *m) {
    return m ? &m->geo : NULL;
}

const char *fmoe_model_config_json(const fmoe_model *m) { return m ? m->config_json : NULL; }

int64_t fmoe_model_weight_bytes(const fmoe_model *m) {
    if (!m) return 0;
    if (!m->gguf) return fmoe_safetensors_data_bytes(m->st);
    int64_t bytes = 0;
    for (int64_t i = 0; i < fmoe_gguf_tensor_count(m->gguf); i++)
        bytes += fmoe_gguf_tensor_at(m->gguf, i)->nbytes;
    return bytes;
}

const char *fmoe_model_describe(const fmoe_model *m) { return m ? m->describe : ""; }
