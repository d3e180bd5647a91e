/*
 * resident.c - the non-expert weights in the process's own memory (fmoe_model_own_weights).
 *
 * A model's weights are views into its files' read-only mappings. When the routed experts
 * are offloaded to those files and the process runs under a memory budget, the mapped
 * pages of the weights every token reads (attention, routers, norms, embeddings, the head)
 * are the only memory the kernel can take back (there is no swap for owned memory), so it
 * takes them, and each token faults them back in from the disk, 4 KiB at a time: a decode
 * step many times slower than its expert reads. Owned copies cannot be taken: what the
 * budget must hold is then exactly what the process holds. Each tensor's mapped pages
 * are dropped as soon as it is copied, so the peak is one tensor above the copies.
 */
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "fmoe/gguf.h"
#include "fmoe/safetensors.h"
#include "model_impl.h"

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

int fmoe_model_own_weights(fmoe_model *m) {
    const fmoe_model_geometry *g = &m->geo;
    const int64_t h = g->hidden_size;
    const void *embed = m->embed.data;
    FMOE_FORWARD_IF_ERROR(own_mat(m, &m->embed));
    if (m->lm_head.data == embed) m->lm_head.data = m->embed.data; /* tied: one copy */
    FMOE_FORWARD_IF_ERROR(own_mat(m, &m->lm_head));
    FMOE_FORWARD_IF_ERROR(own_vec(m, &m->final_norm, h));
    for (int32_t i = 0; i < g->num_hidden_layers; i++) {
        fmoe__layer *y = &m->layers[i];
        fmoe__mat *mats[] = {&y->wq, &y->wk, &y->wv, &y->wo, &y->router,
                             &y->shared.gate, &y->shared.up, &y->shared.down, &y->shared_gate};
        for (size_t k = 0; k < sizeof mats / sizeof mats[0]; k++)
            FMOE_FORWARD_IF_ERROR(own_mat(m, mats[k]));
        /* the vectors' lengths are their matrices' output widths */
        FMOE_FORWARD_IF_ERROR(own_vec(m, &y->attn_norm, h));
        FMOE_FORWARD_IF_ERROR(own_vec(m, &y->ffn_norm, h));
        FMOE_FORWARD_IF_ERROR(own_vec(m, &y->bq, y->wq.rows));
        FMOE_FORWARD_IF_ERROR(own_vec(m, &y->bk, y->wk.rows));
        FMOE_FORWARD_IF_ERROR(own_vec(m, &y->bv, y->wv.rows));
        FMOE_FORWARD_IF_ERROR(own_vec(m, &y->bo, y->wo.rows));
        const int full = m->arch.qk_norm == FMOE__QK_NORM_FULL;
        const int64_t D = g->num_attention_heads > 0 ? y->wq.rows / g->num_attention_heads : 0;
        FMOE_FORWARD_IF_ERROR(own_vec(m, &y->q_norm, full ? y->wq.rows : D));
        FMOE_FORWARD_IF_ERROR(own_vec(m, &y->k_norm, full ? y->wk.rows : D));
    }
    if (m->gguf) fmoe_gguf_release_pages(m->gguf);
    if (m->st) fmoe_safetensors_release_pages(m->st);
    return 0;
}
