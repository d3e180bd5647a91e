/*
 * parts.c - pieces of a loaded model for code beside the forward pass (a live executor):
 * token embeddings before a forward call (the semantic embedding, docs/design.md §3, handed to
 * policies at request and iteration start; the conversions are exact, so the values are
 * the forward pass's) and where each routed expert's bytes live (its slow tier).
 */
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "half.h"
#include "model_impl.h"

int fmoe_model_embed(const fmoe_model *m, const int32_t *tokens, int32_t n, float *out) {
    const fmoe__mat *w = &m->embed;
    const int64_t h = w->cols;
    for (int32_t t = 0; t < n; t++) {
        FMOE_RETURN_ERROR_IF(tokens[t] < 0 || tokens[t] >= w->rows, FMOE_EINVAL,
                             "token %d at index %d is outside the vocabulary [0, %lld)",
                             tokens[t], t, (long long)w->rows);
        float *y = out + (int64_t)t * h;
        if (w->quant) {
            fmoe_quant_dequantize_row(w->quant,
                                      (const uint8_t *)w->data +
                                          tokens[t] * fmoe__row_bytes(w->dtype, w->quant, h),
                                      y, h);
            continue;
        }
        if (w->dtype == FMOE_ST_F32) {
            memcpy(y, (const float *)w->data + tokens[t] * h, (size_t)h * sizeof *y);
            continue;
        }
        const uint16_t *row = (const uint16_t *)w->data + tokens[t] * h;
        for (int64_t i = 0; i < h; i++)
            y[i] = w->dtype == FMOE_ST_BF16 ? fmoe_bf16_to_float(row[i]) : fmoe_half_to_float(row[i]);
    }
    return 0;
}

static fmoe_expert_tensor expert_tensor(const fmoe__mat *w) {
    return (fmoe_expert_tensor){
        .view = {.data = w->data, .dtype = w->dtype, .rows = w->rows, .cols = w->cols,
                 .quant = w->quant},
        .file = w->file, .offset = w->file_offset};
}

int fmoe_model_expert_tensors(const fmoe_model *m, int32_t l, int32_t j, fmoe_expert_tensors *out) {
    const fmoe_model_geometry *g = &m->geo;
    FMOE_RETURN_ERROR_IF(l < 0 || l >= g->num_moe_layers || j < 0 || j >= g->num_experts,
                         FMOE_EINVAL, "expert (%d, %d) outside %d layers of %d experts", l, j,
                         g->num_moe_layers, g->num_experts);
    const fmoe__mlp *e = &m->expert_pool[(int64_t)l * g->num_experts + j];
    out->gate = expert_tensor(&e->gate);
    out->up = expert_tensor(&e->up);
    out->down = expert_tensor(&e->down);
    return 0;
}

int64_t fmoe_matrix_view_bytes(const fmoe_matrix_view *v) {
    return v->rows * fmoe__row_bytes(v->dtype, v->quant, v->cols);
}

/* A GGUF file's experts are as it stores them, and a llama-quantize mix stores some
 * layers' projections with more bits (Q4_K_M: Q6_K down projections in some layers), so
 * the bytes are counted per layer from the first expert of each (a layer's experts are
 * slices of one stacked tensor: alike). A checkpoint's are one dtype throughout. */
int fmoe__model_count_expert_bytes(fmoe_model *m) {
    const fmoe_model_geometry *g = &m->geo;
    const int32_t L = g->num_moe_layers;
    if (L <= 0) return 0;
    m->layer_expert_bytes = malloc((size_t)L * sizeof *m->layer_expert_bytes);
    if (!m->layer_expert_bytes) return fmoe_error_set(FMOE_ENOMEM, "out of memory");
    const int64_t uniform = fmoe_geometry_expert_bytes(g, g->expert_dtype);
    for (int32_t l = 0; l < L; l++) {
        const fmoe__mlp *e = &m->expert_pool[(int64_t)l * g->num_experts];
        /* gpt-oss's expert biases stay resident (fmoe__mlp): what moves, and what an
         * executor's pieces and the simulator count, is the three matrices */
        const int as_stored = m->gguf || e->gate_b;
        m->layer_expert_bytes[l] =
            as_stored ? fmoe__mat_bytes(&e->gate) + fmoe__mat_bytes(&e->up) +
                            fmoe__mat_bytes(&e->down)
                      : uniform;
    }
    return 0;
}

int64_t fmoe_model_expert_bytes(const fmoe_model *m) {
    const fmoe_model_geometry *g = &m->geo;
    if (!m->layer_expert_bytes) return fmoe_geometry_expert_bytes(g, g->expert_dtype);
    int64_t most = 0;
    for (int32_t l = 0; l < g->num_moe_layers; l++)
        most = m->layer_expert_bytes[l] > most ? m->layer_expert_bytes[l] : most;
    return most;
}

const int64_t *fmoe_model_layer_expert_bytes(const fmoe_model *m) {
    return m ? m->layer_expert_bytes : NULL;
}

int64_t fmoe_model_routed_expert_bytes(const fmoe_model *m) {
    int64_t bytes = 0;
    for (int32_t l = 0; m->layer_expert_bytes && l < m->geo.num_moe_layers; l++)
        bytes += m->layer_expert_bytes[l] * m->geo.num_experts;
    return bytes;
}
