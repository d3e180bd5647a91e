/*
 * cpu_mla.c - the CPU backend's multi-head latent attention (DeepSeek-V2/V3), in the
 * absorbed form over the latent cache.
 *
 * MLA ("DeepSeek-V2: A Strong, Economical, and Efficient Mixture-of-Experts Language
 * Model", §2.1) caches per token only the normalised latent c (r_kv values) and the
 * decoupled rotary key k_pe (dr values, shared by all heads). Head h's keys and values are
 * up-projections of the latent through kv_b_proj's rows for that head, W_uk [dn][r_kv] and
 * W_uv [dv][r_kv]:
 *
 *   k_h,j = [W_uk c_j ; k_pe_j]      v_h,j = W_uv c_j
 *   score_h,j = scale · (q_nope · W_uk c_j + q_pe · k_pe_j)
 *             = scale · ((W_ukᵀ q_nope) · c_j + q_pe · k_pe_j)
 *   out_h = Σ_j p_j W_uv c_j = W_uv (Σ_j p_j c_j)
 *
 * The second lines are the paper's "absorbed" form (§2.1.2): W_uk folds into the query
 * and W_uv into the output, so attention runs over the r_kv + dr cached values directly
 * and the per-head keys and values are never formed. It is the same sum as the expanded
 * form, reassociated; tests/model/test_mla.c checks the two agree within 1e-5 relative.
 *
 * The rotary dims: transformers' deepseek_v2/v3 take q_pe and k_pe as adjacent pairs
 * (x[2i], x[2i+1]) rotated by frequency i (V3 permutes them to halves and applies
 * rotate_half, V2 views them as complex numbers: the same rotation); here they are
 * permuted to halves (evens then odds) and rotated with fmoe_rope_head
 * (lib/rowwise.h fmoe_rope_head_pairs, which the CUDA backend runs too), and cached in
 * that order. Query and key use the same order, so their dot products are unchanged.
 */
#include <string.h>

#include "../backend/backend_impl.h"
#include "cpu_fused.h"
#include "cpu_mla.h"
#include "rowwise.h"

typedef struct mla_job {
    void *ctx;
    const fmoe__mla_args *a;
    int64_t slot_floats; /* one worker's scratch */
} mla_job;

/* Head h of every query row: its kv_b rows, then for each token q_lat = W_ukᵀ q_nope, the
 * scores over the cached latents and rotary keys, o_lat = Σ p_j c_j, out = W_uv o_lat.
 * Heads are independent, each summed in the same order whatever the worker. */
static void head_task(void *arg, int32_t h, int32_t worker) {
    const mla_job *j = arg;
    const fmoe__mla_args *a = j->a;
    const int32_t H = a->n_heads, dn = a->nope, dr = a->rope, dv = a->v_dim, r = a->rank;
    const int32_t qs = dn + dr, ks = r + dr;
    float *wbuf = a->scratch + (int64_t)worker * j->slot_floats; /* [dn + dv][r] */
    float *qlat = wbuf + (int64_t)(dn + dv) * r;                  /* [n][r] */
    float *olat = qlat + (int64_t)a->n * r;                       /* [n][r] */
    float *sc = olat + (int64_t)a->n * r;                         /* [pos0 + n] */
    /* f32 rows are read in place; others widened (or dequantised) once per head and call */
    const float *w = wbuf;
    if (!a->wkv_b->quant && a->wkv_b->dtype == FMOE_ST_F32) {
        w = (const float *)a->wkv_b->data + (int64_t)h * (dn + dv) * r;
    } else {
        for (int32_t i = 0; i < dn + dv; i++) {
            const int32_t row = h * (dn + dv) + i;
            fmoe__cpu_backend.get_rows(j->ctx, a->wkv_b, &row, 1, wbuf + (int64_t)i * r);
        }
    }
    for (int32_t t = 0; t < a->n; t++) {
        const float *q = a->q + ((int64_t)t * H + h) * qs;
        float *ql = qlat + (int64_t)t * r, *ol = olat + (int64_t)t * r;
        memset(ql, 0, (size_t)r * sizeof *ql);
        for (int32_t i = 0; i < dn; i++) fmoe__cpu_axpy(j->ctx, ql, q[i], w + (int64_t)i * r, r);
        const int32_t m = a->pos0 + t + 1;
        for (int32_t p = 0; p < m; p++) {
            const float *cj = a->cache + (int64_t)p * ks;
            sc[p] = a->scale * (fmoe__cpu_dot(j->ctx, ql, cj, r) +
                                fmoe__cpu_dot(j->ctx, q + dn, cj + r, dr));
        }
        fmoe_softmax_row(sc, sc, m);
        memset(ol, 0, (size_t)r * sizeof *ol);
        for (int32_t p = 0; p < m; p++)
            fmoe__cpu_axpy(j->ctx, ol, sc[p], a->cache + (int64_t)p * ks, r);
        float *o = a->out + ((int64_t)t * H + h) * dv;
        for (int32_t v = 0; v < dv; v++)
            o[v] = fmoe__cpu_dot(j->ctx, w + (int64_t)(dn + v) * r, ol, r);
    }
}

void fmoe__cpu_mla_attention(void *ctx, const fmoe__mla_args *a) {
    const int32_t H = a->n_heads, dn = a->nope, dr = a->rope, r = a->rank;
    const int32_t qs = dn + dr, ks = r + dr, half = dr / 2;
    if (dr > FMOE_ROPE_PAIRS_MAX) return; /* refused at load (config.c) */
    for (int32_t t = 0; t < a->n; t++) {
        const float *c = a->cos + (int64_t)t * half, *s = a->sin + (int64_t)t * half;
        for (int32_t h = 0; h < H; h++)
            fmoe_rope_head_pairs(a->q + ((int64_t)t * H + h) * qs + dn, c, s, dr, a->interleave);
        fmoe_rope_head_pairs(a->kv + (int64_t)t * ks + r, c, s, dr, a->interleave);
    }
    memcpy(a->cache + (int64_t)a->pos0 * ks, a->kv, (size_t)a->n * (size_t)ks * sizeof(float));

    const mla_job j = {.ctx = ctx, .a = a,
                       .slot_floats = fmoe__mla_scratch_floats(dn, a->v_dim, r, a->max_context,
                                                               a->max_batch)};
    /* One scratch slot per pool worker, or the heads run here one after the other. */
    const double work = (double)H * a->n * (double)(a->pos0 + a->n) * ks;
    if (a->scratch_slots >= fmoe__cpu_threads(ctx) && work >= fmoe__cpu_min_work(ctx)) {
        fmoe__cpu_run(ctx, head_task, (void *)&j, H);
        return;
    }
    for (int32_t h = 0; h < H; h++) head_task((void *)&j, h, 0);
}
