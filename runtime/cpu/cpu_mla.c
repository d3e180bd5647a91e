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
 * The up-projections are read as the GGUF files split kv_b_proj (llama.cpp's deepseek2
 * attn_k_b [H][r_kv][dn] and attn_v_b [H][dv][r_kv]; load.c builds the same split from an
 * HF checkpoint): there both products are plain row products, each row read once per call
 * in its file type,
 *
 *   q_lat[c] = k_b[h][c][:] · q_nope     r_kv rows of dn values
 *   out[v]   = v_b[h][v][:] · o_lat      dv rows of r_kv values
 *
 * through the quantized row kernels the backend's matmul uses, with its choice of inputs:
 * 8-bit (fmoe/quant_act.h, quantised once per head and call) where the context takes
 * them for that block type, else f32 dots of the stored rows. DeepSeek-V2-Lite's
 * Q4_K_M file has attn_k_b in Q5_0 (rows of 128 are not whole 256-blocks: llama-quantize
 * falls back) and attn_v_b in Q4_K: 1.3 MB a layer read where the f32 kv_b was 8.4 MB.
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
#include "fmoe/quant_act.h"
#include "quant_matvec.h"
#include "rowwise.h"

typedef struct mla_job {
    void *ctx;
    const fmoe__mla_args *a;
    int64_t slot_floats; /* one worker's scratch */
} mla_job;

/* The ggml type of a matrix's rows: its block type, or its float dtype's. */
static uint32_t row_type(const fmoe__mat *w) {
    if (w->quant) return w->quant;
    return w->dtype == FMOE_ST_F32 ? FMOE_GGML_F32
           : w->dtype == FMOE_ST_F16 ? FMOE_GGML_F16
                                     : FMOE_GGML_BF16;
}

/* y[t·ldy + i] = w's row (row0 + i) · x[t·ldx ..] for i < rows, t < nx: 8-bit inputs,
 * quantised into qx (nx·fmoe_quant_act_bytes bytes), where the context takes them for w's
 * block type, as its matmul does; else each stored row's dot with the f32 inputs. */
static void rows_times(void *ctx, const fmoe__mat *w, int64_t row0, int32_t rows,
                       const float *x, int64_t ldx, int32_t nx, float *y, int64_t ldy,
                       uint8_t *qx) {
    const int64_t cols = w->cols, rb = fmoe__row_bytes(w->dtype, w->quant, cols);
    const uint8_t *W = (const uint8_t *)w->data + row0 * rb;
    const int64_t qb =
        w->quant && fmoe__cpu_act8(ctx) ? fmoe_quant_act_bytes(w->quant, cols) : -1;
    if (qb > 0) {
        for (int32_t t = 0; t < nx; t++)
            fmoe_quant_act_quantize(w->quant, x + t * ldx, qx + t * qb, cols);
        fmoe_quant_act_matvec(w->quant, W, rb, rows, qx, qb, nx, cols, y, ldy);
        return;
    }
    fmoe__quant_matvec_rows(row_type(w), W, rb, 0, rows, cols, x, ldx, NULL, 0, nx, y, ldy,
                            NULL);
}

/* Heads [G·task, G·task + G) of every query row (G = FMOE__MLA_HEAD_GROUP, fewer at the
 * end): q_lat = W_ukᵀ q_nope for all rows, then per row the scores over the cached latents
 * and rotary keys and o_lat = Σ p_j c_j, then out = W_uv o_lat for all rows. The group's
 * heads take each cached row in turn while it is in L1, so a layer's cache is read H/G
 * times, not H (DeepSeek-V2-Lite at 300 positions: 690 KB, 16 times a layer otherwise).
 * Each head's sums are the same calls in the same order whatever the group or worker. */
static void head_task(void *arg, int32_t task, int32_t worker) {
    const mla_job *j = arg;
    const fmoe__mla_args *a = j->a;
    const int32_t H = a->n_heads, dn = a->nope, dr = a->rope, dv = a->v_dim, r = a->rank;
    const int32_t qs = dn + dr, ks = r + dr, n = a->n, h0 = task * FMOE__MLA_HEAD_GROUP;
    const int32_t G = H - h0 < FMOE__MLA_HEAD_GROUP ? H - h0 : FMOE__MLA_HEAD_GROUP;
    const int64_t lat = (int64_t)n * r, ctx = a->max_context;
    float *qlat = a->scratch + (int64_t)worker * j->slot_floats; /* [G][n][r] */
    float *olat = qlat + FMOE__MLA_HEAD_GROUP * lat;              /* [G][n][r] */
    float *sc = olat + FMOE__MLA_HEAD_GROUP * lat;                /* [G][max_context] */
    uint8_t *qx = (uint8_t *)(sc + FMOE__MLA_HEAD_GROUP * ctx); /* 8-bit inputs */
    for (int32_t g = 0; g < G; g++)
        rows_times(j->ctx, a->wk_b, (int64_t)(h0 + g) * r, r, a->q + (int64_t)(h0 + g) * qs,
                   (int64_t)H * qs, n, qlat + g * lat, r, qx);
    for (int32_t t = 0; t < n; t++) {
        const float *q = a->q + ((int64_t)t * H + h0) * qs; /* the group's first head */
        const int32_t m = a->pos0 + t + 1;
        for (int32_t p = 0; p < m; p++) {
            const float *cj = a->cache + (int64_t)p * ks;
            for (int32_t g = 0; g < G; g++)
                sc[g * ctx + p] =
                    a->scale * (fmoe__cpu_dot(j->ctx, qlat + g * lat + (int64_t)t * r, cj, r) +
                                fmoe__cpu_dot(j->ctx, q + (int64_t)g * qs + dn, cj + r, dr));
        }
        for (int32_t g = 0; g < G; g++) {
            fmoe_softmax_row(sc + g * ctx, sc + g * ctx, m);
            memset(olat + g * lat + (int64_t)t * r, 0, (size_t)r * sizeof *olat);
        }
        for (int32_t p = 0; p < m; p++) {
            const float *cj = a->cache + (int64_t)p * ks;
            for (int32_t g = 0; g < G; g++)
                fmoe__cpu_axpy(j->ctx, olat + g * lat + (int64_t)t * r, sc[g * ctx + p], cj, r);
        }
    }
    for (int32_t g = 0; g < G; g++)
        rows_times(j->ctx, a->wv_b, (int64_t)(h0 + g) * dv, dv, olat + g * lat, r, n,
                   a->out + (int64_t)(h0 + g) * dv, (int64_t)H * dv, qx);
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
    /* One scratch slot per pool worker, or the head groups run here one after the other. The
     * work counts the up-projections' multiply-adds and the attention's. */
    const double work =
        (double)H * a->n * ((double)(a->pos0 + a->n) * ks + (double)(dn + a->v_dim) * r);
    const int32_t groups = (H + FMOE__MLA_HEAD_GROUP - 1) / FMOE__MLA_HEAD_GROUP;
    if (a->scratch_slots >= fmoe__cpu_threads(ctx) && work >= fmoe__cpu_min_work(ctx)) {
        fmoe__cpu_run(ctx, head_task, (void *)&j, groups);
        return;
    }
    for (int32_t g = 0; g < groups; g++) head_task((void *)&j, g, 0);
}
