/*
 * mla.c - the attention block of DeepSeek-V2/V3: multi-head latent attention ("DeepSeek-V2:
 * A Strong, Economical, and Efficient Mixture-of-Experts Language Model", §2.1), as
 * transformers' deepseek_v2/deepseek_v3 modeling code computes it:
 *
 *   q    = q_b(rmsnorm(q_a(xn)))    or q_proj(xn) without q_lora_rank (V2-Lite)
 *          [H][dn + dr]: per head dn "nope" dims and dr rotary dims
 *   kv   = kv_a_proj_with_mqa(xn)   [r_kv + dr]: the latent and one rotary key for all heads
 *   c    = rmsnorm(kv[:r_kv])       the compressed latent, cached with k_pe = rope(kv[r_kv:])
 *   k_h  = [W_uk,h c ; k_pe], v_h = W_uv,h c     (kv_b_proj's rows of head h)
 *   out  = o_proj(softmax(scale · q_h · k_hᵀ) v_h over heads)
 *   scale = 1/sqrt(dn + dr), times mscale(factor, mscale_all_dim)² under yarn (config.c)
 *
 * The cache holds c and k_pe: r_kv + dr floats per token and layer (DeepSeek-V3: 512 + 64
 * = 576) where expanded keys and values would be H(dn + dr) + H·dv (128·192 + 128·128 =
 * 40960), docs/models.md. The backend's mla_attention op rotates, appends to that cache
 * and attends in the absorbed form (runtime/cpu/cpu_mla.c); this file runs the
 * projections and norms around it through the backend table, like forward.c.
 */
#include "mla.h"

void fmoe__mla_attention(const fmoe__backend_ops *be, void *c, const fmoe_model *m,
                         const fmoe__layer *L, const fmoe__mla_bufs *b,
                         const fmoe__mla_seq *seqs, int32_t count, int32_t n) {
    const fmoe_model_geometry *g = &m->geo;
    const int32_t H = g->num_attention_heads, dn = g->qk_nope_head_dim;
    const int32_t dr = g->qk_rope_head_dim, dv = g->v_head_dim, r = g->kv_lora_rank;
    const int32_t rq = g->q_lora_rank, ks = r + dr, half = dr / 2;
    const int64_t qs = dn + dr;
    const float eps = (float)g->rms_norm_eps;

    /* the query's first product and kv_a both read xn: one call (one pool job on the CPU) */
    const fmoe__mat *ws[2] = {rq > 0 ? &L->wq_a : &L->wq, &L->wkv_a};
    float *ys[2] = {rq > 0 ? b->qa : b->q, b->kv};
    if (be->matmul_same_input) {
        be->matmul_same_input(c, ws, 2, b->xn, n, ys);
    } else {
        be->matmul(c, ws[0], b->xn, n, ys[0]);
        be->matmul(c, ws[1], b->xn, n, ys[1]);
    }
    if (rq > 0) {
        be->rmsnorm(c, b->qa, b->qa, L->q_a_norm, n, rq, eps);
        be->matmul(c, &L->wq_b, b->qa, n, b->q);
    }
    /* The norm covers the latent only; each row's k_pe follows it unnormalised. */
    for (int32_t t = 0; t < n; t++)
        be->rmsnorm(c, b->kv + (int64_t)t * ks, b->kv + (int64_t)t * ks, L->kv_a_norm, 1, r,
                    eps);
    for (int32_t i = 0; i < count; i++) {
        const fmoe__mla_seq *e = &seqs[i];
        const fmoe__mla_args a = {
            .q = b->q + (int64_t)e->row * H * qs, .kv = b->kv + (int64_t)e->row * ks,
            .cos = b->cos + (int64_t)e->row * half, .sin = b->sin + (int64_t)e->row * half,
            .cache = e->cache, .wk_b = &L->wk_b, .wv_b = &L->wv_b,
            .out = b->att + (int64_t)e->row * H * dv,
            .scratch = b->scratch, .scratch_slots = b->slots, .max_context = b->max_context,
            .max_batch = b->max_batch, .n = e->n, .pos0 = e->pos0, .n_heads = H, .nope = dn,
            .rope = dr, .v_dim = dv, .rank = r, .interleave = m->arch.rope_interleave,
            .scale = m->arch.mla_scale};
        be->mla_attention(c, &a);
    }
}
