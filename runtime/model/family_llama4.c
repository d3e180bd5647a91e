/*
 * family_llama4.c - Llama 4 (transformers' modeling_llama4, configuration_llama4; Meta's
 * Llama 4 Scout and Maverick), the pieces its decoder has beyond the other GQA families:
 *
 *   rotary pairs   Llama4TextAttention rotates adjacent pairs (dims 2j, 2j + 1 as one
 *                  complex number: apply_rotary_emb's view_as_complex), where the backends
 *                  rotate halves (j, j + D/2). The q and k projections' rows of each head
 *                  are reordered once at load so that pair j lands at (j, j + D/2): the
 *                  same numbers rotate by the same angles, and q·k is unchanged because
 *                  both sides move alike (v and o are untouched). NoPE layers are
 *                  reordered too, harmlessly.
 *   QK L2 norm     Llama4TextL2Norm on the rotary layers (use_qk_norm): x / sqrt(mean(x²) +
 *                  eps) per head, no weight, after the rotation. A rotation keeps a head's
 *                  norm, so normalising before it (where the pass normalises) gives the same
 *                  vectors; the weight is a vector of ones (an RMSNorm with weight 1).
 *   chunked        the rotary layers' mask (masking_utils chunked_overlay: key j is seen by
 *   attention      query i iff j // C == i // C, and j <= i) with C = attention_chunk_size.
 *   temperature    on NoPE layers (attn_temperature_tuning): each query is scaled by
 *   tuning         1 + attn_scale · log1p(floor((pos + 1) / floor_scale)), pos its absolute
 *                  position (the paper transformers cites: arXiv 2501.19399, "Scalable-
 *                  Softmax"). Scaling q by s scales its scores by s: folded into the call's
 *                  softmax scale.
 *   experts        feed_forward.experts.gate_up_proj [J,h,2I] input-major, gate the first I
 *                  columns and up the last I (gate_up.chunk(2)); down_proj [J,I,h]. Owned
 *                  output-major copies, as gpt-oss's (no file range holds them).
 *
 * The router (Llama4Router: top-k of the logits, sigmoid of each chosen one, the weight
 * multiplying the expert's input, not its output) and the shared expert are forward.c's
 * (fmoe__arch.scale_expert_input).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "family_llama4.h"
#include "fmoe/error.h"
#include "fmoe/gguf.h"
#include "fmoe/quant.h"

#define NAME_CAP 256

static void *owned(fmoe_model *m, int64_t bytes) {
    void *p = aligned_alloc(64, (size_t)((bytes + 63) / 64 * 64));
    if (!p || fmoe__model_keep_owned(m, p) < 0) {
        free(p);
        fmoe_error_set(FMOE_ENOMEM, "out of memory");
        return NULL;
    }
    return p;
}

/* The row of a head-major projection (heads of D rows) where adjacent-pair row r goes in
 * rotate-half order: pair j = (2j, 2j + 1) becomes (j, j + D/2). */
static int64_t halves_row(int64_t r, int64_t D) {
    const int64_t h = r / D, d = r % D;
    return h * D + (d % 2) * (D / 2) + d / 2;
}

static int reorder_mat(fmoe_model *m, fmoe__mat *w, int64_t D) {
    const int64_t rb = fmoe__row_bytes(w->dtype, w->quant, w->cols);
    uint8_t *p = owned(m, w->rows * rb);
    if (!p) return FMOE_ENOMEM;
    for (int64_t r = 0; r < w->rows; r++)
        memcpy(p + halves_row(r, D) * rb, (const uint8_t *)w->data + r * rb, (size_t)rb);
    w->data = p;
    w->file = NULL; /* rebuilt: no file range holds these rows in this order */
    w->file_offset = 0;
    return 0;
}

static int reorder_vec(fmoe_model *m, const float **v, int64_t n, int64_t D) {
    float *p = owned(m, n * 4);
    if (!p) return FMOE_ENOMEM;
    for (int64_t r = 0; r < n; r++) p[halves_row(r, D)] = (*v)[r];
    *v = p;
    return 0;
}

int fmoe__llama4_bind_attention(fmoe_model *m, int32_t i, fmoe__layer *L, int rows_done) {
    const int64_t D = m->geo.head_dim;
    if (!rows_done) {
        FMOE_FORWARD_IF_ERROR(reorder_mat(m, &L->wq, D));
        FMOE_FORWARD_IF_ERROR(reorder_mat(m, &L->wk, D));
        if (L->bq) FMOE_FORWARD_IF_ERROR(reorder_vec(m, &L->bq, L->wq.rows, D));
        if (L->bk) FMOE_FORWARD_IF_ERROR(reorder_vec(m, &L->bk, L->wk.rows, D));
    }
    if (m->arch.qk_norm == FMOE__QK_NORM_HEAD && !m->arch.layer_nope[i]) {
        float *ones = owned(m, D * 4);
        if (!ones) return FMOE_ENOMEM;
        for (int64_t d = 0; d < D; d++) ones[d] = 1.0f;
        L->q_norm = L->k_norm = ones;
    }
    return 0;
}

int fmoe__llama4_bind_experts(fmoe_model *m, int32_t i, fmoe__mlp *ex) {
    const fmoe_model_geometry *g = &m->geo;
    const int64_t h = g->hidden_size, I = g->moe_intermediate_size, J = g->num_experts;
    char gn[NAME_CAP], dn[NAME_CAP];
    snprintf(gn, sizeof gn, "model.layers.%d.feed_forward.experts.gate_up_proj", i);
    snprintf(dn, sizeof dn, "model.layers.%d.feed_forward.experts.down_proj", i);
    const int64_t gs[3] = {J, h, 2 * I}, ds[3] = {J, I, h};
    const fmoe_st_tensor *gu, *dw;
    FMOE_FORWARD_IF_ERROR(fmoe_safetensors_get(m->st, gn, 3, gs, &gu));
    FMOE_FORWARD_IF_ERROR(fmoe_safetensors_get(m->st, dn, 3, ds, &dw));
    const int64_t es = fmoe_st_dtype_size(gu->dtype);
    FMOE_RETURN_ERROR_IF(dw->dtype != gu->dtype, FMOE_EFORMAT, "%s is %s but %s is %s", gn,
                         fmoe_st_dtype_name(gu->dtype), dn, fmoe_st_dtype_name(dw->dtype));
    for (int64_t e = 0; e < J; e++) {
        /* (output r, input c) of gate: gate_up[e][c][r]; of up: [e][c][I + r]; of down:
         * down[e][c][r] */
        uint8_t *gate = owned(m, I * h * es), *up = owned(m, I * h * es);
        uint8_t *down = owned(m, h * I * es);
        if (!gate || !up || !down) return FMOE_ENOMEM;
        const uint8_t *s = (const uint8_t *)gu->data + e * h * 2 * I * es;
        for (int64_t c = 0; c < h; c++)
            for (int64_t r = 0; r < I; r++) {
                memcpy(gate + (r * h + c) * es, s + (c * 2 * I + r) * es, (size_t)es);
                memcpy(up + (r * h + c) * es, s + (c * 2 * I + I + r) * es, (size_t)es);
            }
        const uint8_t *d = (const uint8_t *)dw->data + e * I * h * es;
        for (int64_t c = 0; c < I; c++)
            for (int64_t r = 0; r < h; r++)
                memcpy(down + (r * I + c) * es, d + (c * h + r) * es, (size_t)es);
        ex[e].gate = (fmoe__mat){.data = gate, .dtype = gu->dtype, .rows = I, .cols = h};
        ex[e].up = (fmoe__mat){.data = up, .dtype = gu->dtype, .rows = I, .cols = h};
        ex[e].down = (fmoe__mat){.data = down, .dtype = gu->dtype, .rows = h, .cols = I};
    }
    return 0;
}

int fmoe__llama4_gguf_rope(fmoe_model *m) {
    const fmoe_gguf_tensor *t = fmoe_gguf_find_tensor(m->gguf, "rope_freqs.weight");
    if (!t) return 0;
    const int64_t half = m->geo.head_dim / 2;
    FMOE_RETURN_ERROR_IF(t->numel != half || half > FMOE__ROPE_MAX_FACTORS ||
                             !fmoe_quant_supported(t->type),
                         FMOE_EFORMAT, "%s: rope_freqs.weight has %lld values, expected "
                         "head_dim/2 = %lld floats", fmoe_gguf_name(m->gguf),
                         (long long)t->numel, (long long)half);
    float f[FMOE__ROPE_MAX_FACTORS];
    fmoe_quant_dequantize_row(t->type, t->data, f, half);
    fmoe__rope *r = &m->arch.rope;
    for (int64_t i = 0; i < half; i++) {
        FMOE_RETURN_ERROR_IF(!(f[i] > 0), FMOE_EFORMAT, "%s: rope_freqs.weight[%lld] = %g, "
                             "expected a positive divisor", fmoe_gguf_name(m->gguf),
                             (long long)i, (double)f[i]);
        r->short_factor[i] = f[i];
    }
    r->type = FMOE__ROPE_FACTORS;
    snprintf(m->arch.rope_desc, sizeof m->arch.rope_desc, "rope theta %g, rope_freqs",
             r->theta);
    return 0;
}

/* The query temperature at position pos, computed in float32 as transformers does. */
static float temperature(const fmoe__arch *a, int32_t pos) {
    const float f = floorf(((float)pos + 1.0f) / a->attn_floor_scale);
    return log1pf(f) * a->attn_temp_scale + 1.0f;
}

void fmoe__llama4_attention(const fmoe__backend_ops *be, void *ctx, const fmoe__arch *arch,
                            int32_t li, const fmoe__attn_args *a, int64_t kv_width) {
    const int32_t chunk = arch->attn_chunk[li];
    const int tuned = arch->layer_nope[li] && arch->attn_temp_scale != 0.0f;
    const int64_t qw = (int64_t)a->n_heads * a->head_dim;
    int32_t t0 = 0;
    while (t0 < a->n) {
        const int32_t p0 = a->pos0 + t0;
        const int32_t lo = chunk > 0 ? p0 / chunk * chunk : 0;
        const float s0 = tuned ? temperature(arch, p0) : 1.0f;
        int32_t t1 = t0 + 1;
        while (t1 < a->n && (chunk <= 0 || (a->pos0 + t1) / chunk * chunk == lo) &&
               (!tuned || temperature(arch, a->pos0 + t1) == s0))
            t1++;
        fmoe__attn_args run = *a;
        run.q = a->q + t0 * qw;
        run.out = a->out + t0 * qw;
        run.n = t1 - t0;
        run.pos0 = p0 - lo; /* positions within the cache from the chunk's first key */
        run.k_cache = a->k_cache + lo * kv_width;
        run.v_cache = a->v_cache + lo * kv_width;
        run.scale = a->scale * s0;
        be->attention(ctx, &run);
        t0 = t1;
    }
}
