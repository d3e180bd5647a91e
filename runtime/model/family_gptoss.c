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
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "family_gptoss.h"
#include "fmoe/error.h"
#include "half.h"

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
    FMOE_RETURN_ERROR_IF(!m->st, FMOE_EUNSUPPORTED,
                         "gpt-oss from a GGUF file is not yet supported (%s)", name);
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

int fmoe__gptoss_bind_sinks(fmoe_model *m, int32_t i, fmoe__layer *L) {
    const int64_t H = m->geo.num_attention_heads;
    const fmoe_st_tensor *t;
    FMOE_FORWARD_IF_ERROR(get(m, 1, &H, &t, "model.layers.%d.self_attn.sinks", i));
    return strided_vec(m, t, 0, 1, H, &L->sinks);
}

int fmoe__gptoss_bind_moe(fmoe_model *m, int32_t i, fmoe__layer *L) {
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
    FMOE_FORWARD_IF_ERROR(get(m, 3, gus, &gu, "%s.experts.gate_up_proj", pre));
    FMOE_FORWARD_IF_ERROR(get(m, 2, gubs, &gub, "%s.experts.gate_up_proj_bias", pre));
    FMOE_FORWARD_IF_ERROR(get(m, 3, dns, &dn, "%s.experts.down_proj", pre));
    FMOE_FORWARD_IF_ERROR(get(m, 2, dnbs, &dnb, "%s.experts.down_proj_bias", pre));

    /* the router is output-major already ([J][h]); an owned copy keeps it aligned */
    FMOE_FORWARD_IF_ERROR(transposed(m, rw, 0, h, 1, J, h, &L->router));
    FMOE_FORWARD_IF_ERROR(strided_vec(m, rb, 0, 1, J, &L->router_b));
    for (int64_t e = 0; e < J; e++) {
        fmoe__mlp *x = &L->experts[e];
        const int64_t gbase = e * h * 2 * I; /* gate_up_proj[e][c][2r (+1)] */
        FMOE_FORWARD_IF_ERROR(transposed(m, gu, gbase, 2, 2 * I, I, h, &x->gate));
        FMOE_FORWARD_IF_ERROR(transposed(m, gu, gbase + 1, 2, 2 * I, I, h, &x->up));
        FMOE_FORWARD_IF_ERROR(transposed(m, dn, e * I * h, 1, h, h, I, &x->down));
        FMOE_FORWARD_IF_ERROR(strided_vec(m, gub, e * 2 * I, 2, I, &x->gate_b));
        FMOE_FORWARD_IF_ERROR(strided_vec(m, gub, e * 2 * I + 1, 2, I, &x->up_b));
        FMOE_FORWARD_IF_ERROR(strided_vec(m, dnb, e * h, 1, h, &x->down_b));
        x->glu_alpha = m->arch.glu_alpha;
        x->glu_limit = m->arch.glu_limit;
    }
    return 0;
}
