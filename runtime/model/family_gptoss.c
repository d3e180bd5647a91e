/*
 * family_gptoss.c - binds gpt-oss's MoE block and attention sinks (transformers'
 * modeling_gpt_oss; the layout its save_pretrained writes):
 *
 *   model.layers.i.self_attn.sinks               [Hq]     one sink logit per head
 *   model.layers.i.mlp.router.{weight [J,h], bias [J]}
 *   model.layers.i.mlp.experts.gate_up_proj      [J,h,2I] input-major (x · W), the gate
 *                                                          and up columns interleaved:
 *                                                          gate = [..., ::2], up = [..., 1::2]
 *   model.layers.i.mlp.experts.gate_up_proj_bias [J,2I]   interleaved alike
 *   model.layers.i.mlp.experts.down_proj         [J,I,h]  input-major
 *   model.layers.i.mlp.experts.down_proj_bias    [J,h]
 *
 * The forward pass multiplies by row-major [out][in] matrices (y = x · Wᵀ), so each
 * expert's gate, up and down are owned transposed copies in the checkpoint's dtype, built
 * once at load: no file range holds those bytes, so a live executor serves them from its
 * host tier (the file tier needs each matrix's bytes in a file, as stored). The biases
 * are owned f32 vectors and stay resident (fmoe__mlp).
 *
 * OpenAI's published checkpoints (quantization_config mxfp4; transformers'
 * integrations/mxfp4.py reads them) store the expert matrices output-major as MXFP4:
 *
 *   *.experts.gate_up_proj_blocks [J,2I,h/32,16] U8   rows interleaved gate, up as above
 *   *.experts.gate_up_proj_scales [J,2I,h/32]    U8   E8M0: 2^(s - 127)
 *   *.experts.down_proj_blocks    [J,h,I/32,16]  U8
 *   *.experts.down_proj_scales    [J,h,I/32]     U8
 *
 * A block of 32 values is 16 bytes whose byte k holds value 2k in its low nibble and
 * 2k + 1 in its high one (convert_moe_packed_tensors: sub[:, 0::2] = lut[lo]), each an
 * E2M1 number times 2^(s - 127). ggml's MXFP4 block (quant_block.h) is the same numbers in
 * another order: the scale byte, then value l < 16 in the low nibble of byte l and value
 * l + 16 in its high one; its doubled levels with a halved scale are the same values.
 * Each row is repacked into ggml blocks (owned, 17 bytes per 32 values: nothing is
 * dequantised) and the forward pass multiplies them with the MXFP4 kernels.
 *
 * A GGUF file of architecture gpt-oss (llama.cpp's converter; gguf-py's MODEL_ARCH.GPT_OSS
 * names) has these as blk.N.attn_sinks.weight [Hq], blk.N.ffn_gate_inp.{weight,bias} and
 * the experts split and stacked output-major, ggml's [J][rows][cols]:
 * blk.N.ffn_{gate,up}_exps.weight [J][I][h] (MXFP4 in the published conversions) with
 * .bias [J][I], blk.N.ffn_down_exps.weight [J][h][I] with .bias [J][h]. Expert e is read
 * in place, a slice of the stacked tensor (so a file tier reads its true bytes).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "family_gptoss.h"
#include "fmoe/error.h"
#include "fmoe/gguf.h"
#include "fmoe/quant.h"
#include "half.h"
#include "quant_block.h"

#define NAME_CAP 256

static int get(const fmoe_model *m, int32_t ndim, const int64_t *shape,
               const fmoe_st_tensor **out, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int get(const fmoe_model *m, int32_t ndim, const int64_t *shape,
               const fmoe_st_tensor **out, const char *fmt, ...) {
    char name[NAME_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    return fmoe_safetensors_get(m->st, name, ndim, shape, out);
}

/* Element i of a float tensor (F32, F16 or BF16: what fmoe_safetensors_get allows). */
static float at(const fmoe_st_tensor *t, int64_t i) {
    const uint8_t *p = t->data;
    if (t->dtype == FMOE_ST_F32) {
        float v;
        memcpy(&v, p + 4 * i, 4);
        return v;
    }
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    return t->dtype == FMOE_ST_F16 ? fmoe_half_to_float(h) : fmoe_bf16_to_float(h);
}

/* An owned buffer of `bytes`, kept by the model. */
static void *owned(fmoe_model *m, int64_t bytes) {
    void *p = aligned_alloc(64, (size_t)((bytes + 63) / 64 * 64));
    if (!p || fmoe__model_keep_owned(m, p) < 0) {
        free(p);
        fmoe_error_set(FMOE_ENOMEM, "out of memory");
        return NULL;
    }
    return p;
}

/* f32 values t[base + k·stride], k < n, as an owned vector. */
static int strided_vec(fmoe_model *m, const fmoe_st_tensor *t, int64_t base, int64_t stride,
                       int64_t n, const float **out) {
    float *v = owned(m, n * 4);
    if (!v) return FMOE_ENOMEM;
    for (int64_t k = 0; k < n; k++) v[k] = at(t, base + k * stride);
    *out = v;
    return 0;
}

/*
 * The matrix [rows][cols] with element (r, c) at t[base + c·cstride + r·rstride] (an
 * input-major slice read as output rows), as an owned copy in t's dtype.
 */
static int transposed(fmoe_model *m, const fmoe_st_tensor *t, int64_t base, int64_t rstride,
                      int64_t cstride, int64_t rows, int64_t cols, fmoe__mat *out) {
    const int64_t es = fmoe_st_dtype_size(t->dtype);
    uint8_t *p = owned(m, rows * cols * es);
    if (!p) return FMOE_ENOMEM;
    const uint8_t *src = t->data;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            memcpy(p + (r * cols + c) * es, src + (base + c * cstride + r * rstride) * es,
                   (size_t)es);
    /* rebuilt, so no file range holds these bytes */
    *out = (fmoe__mat){.data = p, .dtype = t->dtype, .rows = rows, .cols = cols};
    return 0;
}

/* Output rows r0, r0 + step, ... (`rows` of them) of an MXFP4 matrix of `cols` inputs,
 * from the published layout (blocks [..][cols/32][16], scales [..][cols/32], starting at
 * output row `base` of each), repacked as ggml MXFP4 rows into an owned matrix. */
static int mxfp4_rows(fmoe_model *m, const fmoe_st_tensor *blocks, const fmoe_st_tensor *scales,
                      int64_t base, int64_t step, int64_t rows, int64_t cols, fmoe__mat *out) {
    const int64_t G = cols / 32, rb = G * FMOE_MXFP4_BYTES;
    uint8_t *p = owned(m, rows * rb);
    if (!p) return FMOE_ENOMEM;
    const uint8_t *bl = blocks->data, *sc = scales->data;
    for (int64_t r = 0; r < rows; r++) {
        const int64_t src = base + r * step;
        for (int64_t g = 0; g < G; g++)
            fmoe__mxfp4_from_openai(bl + (src * G + g) * 16, sc[src * G + g],
                                    p + r * rb + g * FMOE_MXFP4_BYTES);
    }
    *out = (fmoe__mat){.data = p, .dtype = FMOE_ST_U8, .rows = rows, .cols = cols,
                       .quant = FMOE_GGML_MXFP4};
    if (!m->quant) m->quant = FMOE_GGML_MXFP4;
    return 0;
}

/* A U8 tensor of the given shape (the MXFP4 blocks and scales). */
static int get_u8(const fmoe_model *m, int32_t ndim, const int64_t *shape,
                  const fmoe_st_tensor **out, const char *pre, const char *what) {
    char name[NAME_CAP];
    snprintf(name, sizeof name, "%s.experts.%s", pre, what);
    const fmoe_st_tensor *t = fmoe_safetensors_find(m->st, name);
    FMOE_RETURN_ERROR_IF(!t, FMOE_ENOTFOUND, "missing tensor %s", name);
    int ok = t->dtype == FMOE_ST_U8 && t->ndim == ndim;
    for (int32_t d = 0; ok && d < ndim; d++) ok = t->shape[d] == shape[d];
    FMOE_RETURN_ERROR_IF(!ok, FMOE_EFORMAT,
                         "tensor %s: expected U8 of %d dimensions [%lld, %lld, %lld%s] (MXFP4)",
                         name, ndim, (long long)shape[0], (long long)shape[1],
                         (long long)shape[2], ndim == 4 ? ", 16" : "");
    *out = t;
    return 0;
}

/* The experts of layer i from the published MXFP4 layout (matrices), with their biases. */
static int bind_mxfp4_experts(fmoe_model *m, const char *pre, fmoe__layer *L) {
    const fmoe_model_geometry *g = &m->geo;
    const int64_t h = g->hidden_size, I = g->moe_intermediate_size, J = g->num_experts;
    FMOE_RETURN_ERROR_IF(h % 32 != 0 || I % 32 != 0, FMOE_EFORMAT,
                         "MXFP4 experts need hidden_size (%lld) and intermediate_size (%lld) "
                         "in whole blocks of 32", (long long)h, (long long)I);
    const fmoe_st_tensor *gb, *gs, *db, *ds;
    const int64_t gbs[4] = {J, 2 * I, h / 32, 16}, dbs[4] = {J, h, I / 32, 16};
    FMOE_FORWARD_IF_ERROR(get_u8(m, 4, gbs, &gb, pre, "gate_up_proj_blocks"));
    FMOE_FORWARD_IF_ERROR(get_u8(m, 3, gbs, &gs, pre, "gate_up_proj_scales"));
    FMOE_FORWARD_IF_ERROR(get_u8(m, 4, dbs, &db, pre, "down_proj_blocks"));
    FMOE_FORWARD_IF_ERROR(get_u8(m, 3, dbs, &ds, pre, "down_proj_scales"));
    for (int64_t e = 0; e < J; e++) {
        fmoe__mlp *x = &L->experts[e];
        FMOE_FORWARD_IF_ERROR(mxfp4_rows(m, gb, gs, e * 2 * I, 2, I, h, &x->gate));
        FMOE_FORWARD_IF_ERROR(mxfp4_rows(m, gb, gs, e * 2 * I + 1, 2, I, h, &x->up));
        FMOE_FORWARD_IF_ERROR(mxfp4_rows(m, db, ds, e * h, 1, h, I, &x->down));
    }
    return 0;
}

/* ---------------------------------------------------------------------------------- */
/* GGUF                                                                               */
/* ---------------------------------------------------------------------------------- */

/* GGUF tensor blk.i.<what> with extents ne (innermost first; ndim of them), checked. */
static int gguf_tensor(const fmoe_model *m, int32_t i, const char *what, int32_t ndim,
                       const int64_t *ne, const fmoe_gguf_tensor **out) {
    char name[NAME_CAP];
    snprintf(name, sizeof name, "blk.%d.%s", i, what);
    return fmoe_gguf_get_tensor(m->gguf, name, ndim, ne, out);
}

/* Row r0.. (rows of them) of a GGUF tensor whose rows hold `cols` values, as f32 vectors
 * into an owned array of rows·cols. */
static int gguf_f32(fmoe_model *m, const fmoe_gguf_tensor *t, int64_t r0, int64_t rows,
                    int64_t cols, const float **out) {
    float *v = owned(m, rows * cols * 4);
    if (!v) return FMOE_ENOMEM;
    for (int64_t r = 0; r < rows; r++)
        fmoe_quant_dequantize_row(t->type, (const uint8_t *)t->data + (r0 + r) * t->row_bytes,
                                  v + r * cols, cols);
    *out = v;
    return 0;
}

/* Slice e of a stacked GGUF tensor [J][rows][cols] (e = 0, J = 1: the whole of a 2-D
 * one), read in place: its bytes and their place in the file. */
static int gguf_slice(fmoe_model *m, const fmoe_gguf_tensor *t, int64_t e, int64_t rows,
                      int64_t cols, fmoe__mat *out) {
    const int64_t at = e * rows * t->row_bytes;
    *out = (fmoe__mat){.data = (const uint8_t *)t->data + at, .rows = rows, .cols = cols,
                       .file = t->file, .file_offset = (int64_t)t->offset + at};
    switch (t->type) {
    case FMOE_GGML_F32: out->dtype = FMOE_ST_F32; break;
    case FMOE_GGML_F16: out->dtype = FMOE_ST_F16; break;
    case FMOE_GGML_BF16: out->dtype = FMOE_ST_BF16; break;
    default:
        out->dtype = FMOE_ST_U8;
        out->quant = t->type;
        if (!m->quant) m->quant = t->type;
        break;
    }
    const int64_t es = out->quant ? 1 : fmoe_st_dtype_size(out->dtype);
    FMOE_RETURN_ERROR_IF((uintptr_t)out->data % (uintptr_t)es != 0, FMOE_EFORMAT,
                         "%s: tensor %s is misaligned for its type", fmoe_gguf_name(m->gguf),
                         t->name);
    return 0;
}

static int gguf_sinks(fmoe_model *m, int32_t i, fmoe__layer *L) {
    const int64_t H = m->geo.num_attention_heads;
    const fmoe_gguf_tensor *t;
    FMOE_FORWARD_IF_ERROR(gguf_tensor(m, i, "attn_sinks.weight", 1, &H, &t));
    return gguf_f32(m, t, 0, 1, H, &L->sinks);
}

static int gguf_moe(fmoe_model *m, int32_t i, fmoe__layer *L) {
    const fmoe_model_geometry *g = &m->geo;
    const int64_t h = g->hidden_size, I = g->moe_intermediate_size, J = g->num_experts;
    const fmoe_gguf_tensor *rw, *rb, *gw, *gb, *uw, *ub, *dw, *db;
    const int64_t rws[2] = {h, J}, ups[3] = {h, I, J}, dns[3] = {I, h, J};
    const int64_t ubs[2] = {I, J}, dbs[2] = {h, J};
    FMOE_FORWARD_IF_ERROR(gguf_tensor(m, i, "ffn_gate_inp.weight", 2, rws, &rw));
    FMOE_FORWARD_IF_ERROR(gguf_tensor(m, i, "ffn_gate_inp.bias", 1, &J, &rb));
    FMOE_FORWARD_IF_ERROR(gguf_tensor(m, i, "ffn_gate_exps.weight", 3, ups, &gw));
    FMOE_FORWARD_IF_ERROR(gguf_tensor(m, i, "ffn_gate_exps.bias", 2, ubs, &gb));
    FMOE_FORWARD_IF_ERROR(gguf_tensor(m, i, "ffn_up_exps.weight", 3, ups, &uw));
    FMOE_FORWARD_IF_ERROR(gguf_tensor(m, i, "ffn_up_exps.bias", 2, ubs, &ub));
    FMOE_FORWARD_IF_ERROR(gguf_tensor(m, i, "ffn_down_exps.weight", 3, dns, &dw));
    FMOE_FORWARD_IF_ERROR(gguf_tensor(m, i, "ffn_down_exps.bias", 2, dbs, &db));
    FMOE_FORWARD_IF_ERROR(gguf_slice(m, rw, 0, J, h, &L->router));
    FMOE_FORWARD_IF_ERROR(gguf_f32(m, rb, 0, 1, J, &L->router_b));
    for (int64_t e = 0; e < J; e++) {
        fmoe__mlp *x = &L->experts[e];
        FMOE_FORWARD_IF_ERROR(gguf_slice(m, gw, e, I, h, &x->gate));
        FMOE_FORWARD_IF_ERROR(gguf_slice(m, uw, e, I, h, &x->up));
        FMOE_FORWARD_IF_ERROR(gguf_slice(m, dw, e, h, I, &x->down));
        FMOE_FORWARD_IF_ERROR(gguf_f32(m, gb, e, 1, I, &x->gate_b));
        FMOE_FORWARD_IF_ERROR(gguf_f32(m, ub, e, 1, I, &x->up_b));
        FMOE_FORWARD_IF_ERROR(gguf_f32(m, db, e, 1, h, &x->down_b));
        x->glu_alpha = m->arch.glu_alpha;
        x->glu_limit = m->arch.glu_limit;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------- */
/* Both                                                                               */
/* ---------------------------------------------------------------------------------- */

int fmoe__gptoss_bind_sinks(fmoe_model *m, int32_t i, fmoe__layer *L) {
    if (m->gguf) return gguf_sinks(m, i, L);
    const int64_t H = m->geo.num_attention_heads;
    const fmoe_st_tensor *t;
    FMOE_FORWARD_IF_ERROR(get(m, 1, &H, &t, "model.layers.%d.self_attn.sinks", i));
    return strided_vec(m, t, 0, 1, H, &L->sinks);
}

int fmoe__gptoss_bind_moe(fmoe_model *m, int32_t i, fmoe__layer *L) {
    if (m->gguf) return gguf_moe(m, i, L);
    const fmoe_model_geometry *g = &m->geo;
    const int64_t h = g->hidden_size, I = g->moe_intermediate_size, J = g->num_experts;
    const fmoe_st_tensor *rw, *rb, *gu, *gub, *dn, *dnb;
    const int64_t rws[2] = {J, h}, gus[3] = {J, h, 2 * I}, gubs[2] = {J, 2 * I};
    const int64_t dns[3] = {J, I, h}, dnbs[2] = {J, h};
    const char *p = "model.layers.%d.mlp";
    char pre[64];
    snprintf(pre, sizeof pre, p, i);
    FMOE_FORWARD_IF_ERROR(get(m, 2, rws, &rw, "%s.router.weight", pre));
    FMOE_FORWARD_IF_ERROR(get(m, 1, &J, &rb, "%s.router.bias", pre));
    FMOE_FORWARD_IF_ERROR(get(m, 2, gubs, &gub, "%s.experts.gate_up_proj_bias", pre));
    FMOE_FORWARD_IF_ERROR(get(m, 2, dnbs, &dnb, "%s.experts.down_proj_bias", pre));
    char blocks[NAME_CAP];
    snprintf(blocks, sizeof blocks, "%s.experts.gate_up_proj_blocks", pre);
    const int mxfp4 = fmoe_safetensors_find(m->st, blocks) != NULL;
    if (mxfp4) {
        FMOE_FORWARD_IF_ERROR(bind_mxfp4_experts(m, pre, L));
    } else {
        FMOE_FORWARD_IF_ERROR(get(m, 3, gus, &gu, "%s.experts.gate_up_proj", pre));
        FMOE_FORWARD_IF_ERROR(get(m, 3, dns, &dn, "%s.experts.down_proj", pre));
    }

    /* the router is output-major already ([J][h]); an owned copy keeps it aligned */
    FMOE_FORWARD_IF_ERROR(transposed(m, rw, 0, h, 1, J, h, &L->router));
    FMOE_FORWARD_IF_ERROR(strided_vec(m, rb, 0, 1, J, &L->router_b));
    for (int64_t e = 0; e < J; e++) {
        fmoe__mlp *x = &L->experts[e];
        const int64_t gbase = e * h * 2 * I; /* gate_up_proj[e][c][2r (+1)] */
        if (!mxfp4) {
            FMOE_FORWARD_IF_ERROR(transposed(m, gu, gbase, 2, 2 * I, I, h, &x->gate));
            FMOE_FORWARD_IF_ERROR(transposed(m, gu, gbase + 1, 2, 2 * I, I, h, &x->up));
            FMOE_FORWARD_IF_ERROR(transposed(m, dn, e * I * h, 1, h, h, I, &x->down));
        }
        FMOE_FORWARD_IF_ERROR(strided_vec(m, gub, e * 2 * I, 2, I, &x->gate_b));
        FMOE_FORWARD_IF_ERROR(strided_vec(m, gub, e * 2 * I + 1, 2, I, &x->up_b));
        FMOE_FORWARD_IF_ERROR(strided_vec(m, dnb, e * h, 1, h, &x->down_b));
        x->glu_alpha = m->arch.glu_alpha;
        x->glu_limit = m->arch.glu_limit;
    }
    return 0;
}
