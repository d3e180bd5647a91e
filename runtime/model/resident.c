/*
 * resident.c - the non-expert weights: in the process's own memory (fmoe_model_own_weights)
 * and checked finite at load (fmoe__model_check_finite). One walk lists them
 * (visit_resident), so the two never disagree on what a model's resident weights are.
 *
 * Owned copies. A model's weights are views into its files' read-only mappings. When the
 * routed experts are offloaded to those files and the process runs under a memory budget,
 * the mapped pages of the weights every token reads (attention, routers, norms,
 * embeddings, the head) are the only memory the kernel can take back (there is no swap
 * for owned memory), so it takes them, and each token faults them back in from the disk,
 * 4 KiB at a time: a decode step many times slower than its expert reads. Owned copies
 * cannot be taken: what the budget must hold is then exactly what the process holds. Each
 * tensor's mapped pages are dropped as soon as it is copied, so the peak is one tensor
 * above the copies.
 *
 * Finite. A NaN or infinity in a weight every token reads spreads to every later value;
 * with 8-bit activations a NaN input quantises to some finite garbage, so the run prints
 * "" or "::::" with exit 0 rather than failing. The resident weights are read in full at
 * load: float values one by one, a block format's f16 scales (d, and dmin for Q4_K/Q5_K:
 * its integer quants cannot be non-finite). This reads the non-expert weights once (about
 * 1 GB for Qwen3-30B-A3B, which every token reads anyway); the routed experts are not
 * read, since that would read the whole model (tens of GB from disk when offloaded).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "fmoe/gguf.h"
#include "fmoe/safetensors.h"
#include "files.h"
#include "half.h"
#include "model_impl.h"
#include "quant_block.h"
#include "quant_impl.h" /* fmoe__is_iq, fmoe__iq_d */

/* 1 when p is the start of an allocation the model already owns. */
static int owned(const fmoe_model *m, const void *p) {
    for (int32_t i = 0; i < m->num_owned; i++)
        if (m->owned[i] == p) return 1;
    return 0;
}

/* *data (bytes long) as an owned copy, unless it is owned already. */
static int own(fmoe_model *m, const void **data, int64_t bytes) {
    if (!*data || bytes <= 0 || owned(m, *data)) return 0;
    void *copy = malloc((size_t)bytes);
    if (!copy) return fmoe_error_set(FMOE_ENOMEM, "%lld bytes of weights", (long long)bytes);
    memcpy(copy, *data, (size_t)bytes);
    /* the source's pages go now, not after the last copy: the process never holds both */
    if (m->gguf) fmoe_gguf_release_range(m->gguf, *data, (size_t)bytes);
    if (fmoe__model_keep_owned(m, copy) < 0) {
        free(copy);
        return FMOE_ENOMEM;
    }
    *data = copy;
    return 0;
}

static int own_mat(fmoe_model *m, fmoe__mat *w) {
    if (w->on_backend) return 0;
    return own(m, &w->data, fmoe__mat_bytes(w));
}

static int own_vec(fmoe_model *m, const float **v, int64_t n) {
    const void *p = *v;
    FMOE_FORWARD_IF_ERROR(own(m, &p, n * (int64_t)sizeof(float)));
    *v = p;
    return 0;
}

/* What visit_resident calls for each resident matrix and f32 vector: `what` names it
 * ("layer 3 q projection"; a vector of n floats). A non-zero return stops the walk. */
typedef struct resident_visitor {
    int (*mat)(fmoe_model *m, fmoe__mat *w, const char *what);
    int (*vec)(fmoe_model *m, const float **v, int64_t n, const char *what);
} resident_visitor;

static int visit_resident(fmoe_model *m, const resident_visitor *v) {
    const fmoe_model_geometry *g = &m->geo;
    const int64_t h = g->hidden_size;
    const void *embed = m->embed.data;
    FMOE_FORWARD_IF_ERROR(v->mat(m, &m->embed, "the embeddings"));
    if (m->lm_head.data == embed) m->lm_head.data = m->embed.data; /* tied: one copy */
    FMOE_FORWARD_IF_ERROR(v->mat(m, &m->lm_head, "the LM head"));
    FMOE_FORWARD_IF_ERROR(v->vec(m, &m->final_norm, h, "the final norm"));
    static const char *const mat_names[] = {"q projection", "k projection", "v projection",
                                            "o projection", "router", "shared expert gate",
                                            "shared expert up", "shared expert down",
                                            "shared expert's gate", "q_a projection",
                                            "q_b projection", "kv_a projection",
                                            "kv_b projection's keys (k_b)",
                                            "kv_b projection's values (v_b)"};
    static const char *const vec_names[] = {"attention norm", "FFN norm", "q bias", "k bias",
                                            "v bias", "o bias", "q norm", "k norm",
                                            "q_a norm", "kv_a norm", "router bias",
                                            "router logit bias", "attention sinks"};
    for (int32_t i = 0; i < g->num_hidden_layers; i++) {
        fmoe__layer *y = &m->layers[i];
        /* MLA's (DeepSeek-V2/V3) are unset (NULL data) in other families, and theirs in MLA
         * models: a walk skips what is absent */
        fmoe__mat *mats[] = {&y->wq,          &y->wk,        &y->wv,          &y->wo,
                             &y->router,      &y->shared.gate, &y->shared.up, &y->shared.down,
                             &y->shared_gate, &y->wq_a,      &y->wq_b,        &y->wkv_a,
                             &y->wk_b,        &y->wv_b};
        char what[96];
        for (size_t k = 0; k < sizeof mats / sizeof mats[0]; k++) {
            snprintf(what, sizeof what, "layer %d %s", i, mat_names[k]);
            FMOE_FORWARD_IF_ERROR(v->mat(m, mats[k], what));
        }
        /* the vectors' lengths are their matrices' output widths */
        const int full = m->arch.qk_norm == FMOE__QK_NORM_FULL;
        const int64_t D = g->num_attention_heads > 0 ? y->wq.rows / g->num_attention_heads : 0;
        const float **vecs[] = {&y->attn_norm, &y->ffn_norm, &y->bq,        &y->bk,
                                &y->bv,        &y->bo,       &y->q_norm,    &y->k_norm,
                                &y->q_a_norm,  &y->kv_a_norm, &y->route_bias,
                                &y->router_b,  &y->sinks};
        const int64_t lens[] = {h, h, y->wq.rows, y->wk.rows, y->wv.rows, y->wo.rows,
                                full ? y->wq.rows : D, full ? y->wk.rows : D,
                                g->q_lora_rank, g->kv_lora_rank, g->num_experts,
                                g->num_experts, g->num_attention_heads};
        for (size_t k = 0; k < sizeof vecs / sizeof vecs[0]; k++) {
            snprintf(what, sizeof what, "layer %d %s", i, vec_names[k]);
            FMOE_FORWARD_IF_ERROR(v->vec(m, vecs[k], lens[k], what));
        }
    }
    return 0;
}

static int own_mat_v(fmoe_model *m, fmoe__mat *w, const char *what) {
    (void)what;
    return own_mat(m, w);
}

static int own_vec_v(fmoe_model *m, const float **v, int64_t n, const char *what) {
    (void)what;
    return own_vec(m, v, n);
}

int fmoe_model_own_weights(fmoe_model *m) {
    static const resident_visitor own_all = {own_mat_v, own_vec_v};
    FMOE_FORWARD_IF_ERROR(visit_resident(m, &own_all));
    if (m->gguf) fmoe_gguf_release_pages(m->gguf);
    if (m->st) fmoe_safetensors_release_pages(m->st);
    return 0;
}

/* ------------------------------------------------------------------ populate */

/* MemAvailable of /proc/meminfo in bytes, or -1 where it cannot be read. */
static int64_t mem_available_bytes(void) {
    FILE *f = NULL;
    if (fmoe__fopen_regular("/proc/meminfo", &f) < 0) {
        fmoe_error_clear(); /* no /proc: nothing populated, not an error */
        return -1;
    }
    char line[128];
    long long kb = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lld kB", &kb) == 1) break;
    fclose(f);
    return kb < 0 ? -1 : (int64_t)kb * 1024;
}

int fmoe_model_populate(fmoe_model *m) {
    const int64_t avail = mem_available_bytes(), bytes = fmoe_model_weight_bytes(m);
    if (avail < 0 || bytes <= 0 || bytes > avail) return 0;
    if (m->gguf) fmoe_gguf_populate_pages(m->gguf);
    if (m->st) fmoe_safetensors_populate_pages(m->st);
    return 1;
}

/* ------------------------------------------------------------------ finite */

static int not_finite(const char *what, int64_t row, int64_t col, float x) {
    return fmoe_error_set(FMOE_EFORMAT,
                          "%s holds a non-finite weight (%g at row %lld, column %lld): the "
                          "file is damaged or the checkpoint diverged",
                          what, (double)x, (long long)row, (long long)col);
}

static int finite_mat(fmoe_model *m, fmoe__mat *w, const char *what) {
    (void)m;
    if (!w->data || w->on_backend || w->rows < 1 || w->cols < 1) return 0;
    const uint8_t *p = w->data;
    if (w->quant) {
        /* the f16 scales of each block: d first (Q6_K: last), dmin or m after d (Q4_K,
         * Q5_K, Q4_1, Q5_1); Q2_K, Q3_K, IQ4_XS where fmoe__kx_d reads them; the
         * i-quants' d where fmoe__iq_d does (IQ1_M's is spread over its scale words) */
        /* MXFP4's scale is one E8M0 byte, finite for every value (ggml's reading: e = 255
         * is 2^127, lib/quant_block.h fmoe__e8m0_half), and its levels are a table: nothing
         * to check. Read as an f16, its first two bytes (scale, first nibbles) are a NaN
         * whenever the nibbles are 0xFF, which refused llama-quantize's --pure files. */
        if (w->quant == FMOE_GGML_MXFP4) return 0;
        const int iq = fmoe__is_iq(w->quant);
        const int64_t bytes = iq ? fmoe_ggml_type_size(w->quant) : fmoe__qblock_bytes(w->quant),
                      vals = iq ? FMOE_QK_K : fmoe__qblock_values(w->quant);
        if (!bytes || w->cols % vals) return 0; /* a format without a formula here */
        const int64_t per_row = w->cols / vals;
        const int64_t d_at = w->quant == FMOE_GGML_Q6_K ? bytes - 2 : 0;
        const int has_min = w->quant == FMOE_GGML_Q4_K || w->quant == FMOE_GGML_Q5_K ||
                            w->quant == FMOE_GGML_Q4_1 || w->quant == FMOE_GGML_Q5_1;
        for (int64_t r = 0; r < w->rows; r++)
            for (int64_t b = 0; b < per_row; b++) {
                const uint8_t *blk = p + (r * per_row + b) * bytes;
                float d = fmoe__qblock_f16(blk + d_at);
                float dmin = has_min ? fmoe__qblock_f16(blk + 2) : 0.0f;
                if (fmoe__is_kx(w->quant)) /* Q2_K's d, dmin and Q3_K's d are at the end */
                    fmoe__kx_d(w->quant, blk, &d, &dmin);
                if (iq) d = fmoe__iq_d(w->quant, blk);
                if (!isfinite(d) || !isfinite(dmin))
                    return not_finite(what, r, b * vals, isfinite(d) ? dmin : d);
            }
        return 0;
    }
    const int64_t n = w->rows * w->cols;
    for (int64_t i = 0; i < n; i++) {
        float x;
        switch (w->dtype) {
        case FMOE_ST_F32: memcpy(&x, p + 4 * i, 4); break;
        case FMOE_ST_F16: x = fmoe_half_to_float((uint16_t)(p[2 * i] | (p[2 * i + 1] << 8))); break;
        case FMOE_ST_BF16: x = fmoe_bf16_to_float((uint16_t)(p[2 * i] | (p[2 * i + 1] << 8))); break;
        default: return 0; /* an 8-bit float: no infinity in e4m3; NaN not looked for */
        }
        if (!isfinite(x)) return not_finite(what, i / w->cols, i % w->cols, x);
    }
    return 0;
}

static int finite_vec(fmoe_model *m, const float **v, int64_t n, const char *what) {
    (void)m;
    for (int64_t i = 0; *v && i < n; i++)
        if (!isfinite((*v)[i])) return not_finite(what, 0, i, (*v)[i]);
    return 0;
}

int fmoe__model_check_finite(fmoe_model *m) {
    static const resident_visitor check = {finite_mat, finite_vec};
    return visit_resident(m, &check);
}
