/*
 * mla.h - internal: DeepSeek-V2/V3's multi-head latent attention block (mla.c), run by
 * forward.c for models whose arch.mla is set.
 */
#ifndef FMOE_MLA_H
#define FMOE_MLA_H

#include "model_impl.h"

/* The pass's buffers the block uses (backend buffers, rows of all segments). */
typedef struct fmoe__mla_bufs {
    const float *xn;  /* [n][h] the normalised input */
    float *q;         /* [n][H(dn + dr)] */
    float *kv;        /* [n][r_kv + dr] */
    float *qa;        /* [n][r_q] (q_lora_rank > 0) */
    float *att;       /* [n][H·dv] the heads' outputs, before o_proj */
    const float *cos, *sin; /* [n][dr/2] each row's rope tables */
    float *scratch;   /* slots × fmoe__mla_scratch_floats(.., max_context, max_batch) */
    int32_t slots, max_context, max_batch;
} fmoe__mla_bufs;

/* One sequence's rows [row, row + n) at positions pos0.. and its layer's latent cache
 * [max_context][r_kv + dr]. */
typedef struct fmoe__mla_seq {
    int32_t row, n, pos0;
    float *cache;
} fmoe__mla_seq;

/* The heads' outputs of layer L into b->att for the n rows of `count` sequences; each
 * sequence's latents and rotary keys are appended to its cache. */
void fmoe__mla_attention(const fmoe__backend_ops *be, void *c, const fmoe_model *m,
                         const fmoe__layer *L, const fmoe__mla_bufs *b,
                         const fmoe__mla_seq *seqs, int32_t count, int32_t n);

#endif
