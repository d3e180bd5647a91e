/*
 * test_mla - DeepSeek-V2/V3 pieces against straightforward references in double:
 * the CPU backend's multi-head latent attention in its absorbed form (runtime/cpu/cpu_mla.c)
 * against the expanded form (per-head keys and values formed from the latent cache, then
 * ordinary attention), with its up-projections split as the GGUF files split them (k_b,
 * v_b) in f32, bf16 or blocks (the reference takes the values those blocks stand for,
 * dequantised, so only the kernel's arithmetic is measured), and the grouped router
 * (fmoe_route_row_grouped) against a transcription of transformers' deepseek_v2 /
 * deepseek_v3 gates.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "fmoe/quant.h"
#include "half.h"
#include "harness.h"
#include "model_impl.h"
#include "rowwise.h"

static uint64_t lcg = 777;
static float frand(void) { /* uniform in [-1, 1) */
    lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((lcg >> 40) * 0x1.0p-24) * 2.0f - 1.0f;
}

/* Rotates pairs (x[2i], x[2i+1]) by angle pos·inv[i] in double: the adjacent-pair rope of
 * transformers' deepseek code, left in pair order. */
static void rope_pairs(double *x, int dr, const double *ang) {
    for (int i = 0; i < dr / 2; i++) {
        const double a = x[2 * i], b = x[2 * i + 1], c = cos(ang[i]), s = sin(ang[i]);
        x[2 * i] = a * c - b * s;
        x[2 * i + 1] = b * c + a * s;
    }
}

/* vals[rows][cols] stored as `type` (F32, BF16 or a block type): the bytes (malloc'ed, in
 * *m), and vals set to the values they stand for. */
static void store_as(uint32_t type, float *vals, int64_t rows, int64_t cols, fmoe__mat *m) {
    *m = (fmoe__mat){.rows = rows, .cols = cols};
    if (type == FMOE_GGML_F32) {
        float *d = malloc(sizeof(float) * (size_t)(rows * cols));
        memcpy(d, vals, sizeof(float) * (size_t)(rows * cols));
        m->data = d, m->dtype = FMOE_ST_F32;
    } else if (type == FMOE_GGML_BF16) {
        uint16_t *d = malloc(sizeof(uint16_t) * (size_t)(rows * cols));
        for (int64_t i = 0; i < rows * cols; i++) {
            d[i] = fmoe_float_to_bf16(vals[i]);
            vals[i] = fmoe_bf16_to_float(d[i]);
        }
        m->data = d, m->dtype = FMOE_ST_BF16;
    } else {
        const int64_t rb = fmoe_quant_row_bytes(type, cols);
        uint8_t *d = malloc((size_t)(rows * rb));
        for (int64_t i = 0; i < rows; i++) {
            fmoe_quant_quantize_row(type, vals + i * cols, d + i * rb, cols);
            fmoe_quant_dequantize_row(type, d + i * rb, vals + i * cols, cols);
        }
        m->data = d, m->dtype = FMOE_ST_U8, m->quant = type;
    }
}

/* The absorbed attention of one sequence, in calls of `chunk` tokens (prefill then
 * decode), k_b stored as ktype and v_b as vtype, 8-bit inputs to their products or not,
 * against the expanded form: relative L2 error of the outputs <= tol. */
static void check_mla(int *harness_failed, int H, int dn, int dr, int dv, int r, int T,
                      int chunk, int interleave, uint32_t ktype, uint32_t vtype, int act8,
                      double tol, int threads) {
    const int qs = dn + dr, ks = r + dr, half = dr / 2, ctx = T, w = dn + dv;
    float *wkv = malloc(sizeof(float) * (size_t)H * w * r); /* kv_b_proj, HF's layout */
    float *kb = malloc(sizeof(float) * (size_t)H * r * dn);
    float *vb = malloc(sizeof(float) * (size_t)H * dv * r);
    float *q = malloc(sizeof(float) * (size_t)T * H * qs);
    float *kv = malloc(sizeof(float) * (size_t)T * ks);
    float *q0 = malloc(sizeof(float) * (size_t)T * H * qs);
    float *kv0 = malloc(sizeof(float) * (size_t)T * ks);
    float *cos_t = malloc(sizeof(float) * (size_t)T * half);
    float *sin_t = malloc(sizeof(float) * (size_t)T * half);
    float *cache = calloc((size_t)ctx * ks, sizeof(float));
    float *out = calloc((size_t)T * H * dv, sizeof(float));
    float *scratch =
        malloc(sizeof(float) * (size_t)threads *
               (size_t)fmoe__mla_scratch_floats(dn, dv, r, ctx, T));
    double *ang = malloc(sizeof(double) * (size_t)T * half);
    for (int i = 0; i < H * w * r; i++) wkv[i] = frand() / sqrtf((float)r);
    /* the split: k_b[h][c][d] = W_uk,h[d][c], v_b[h][v][c] = W_uv,h[v][c]; stored, then the
     * reference's kv_b takes the values the stored rows stand for */
    for (int h = 0; h < H; h++)
        for (int c = 0; c < r; c++) {
            for (int d = 0; d < dn; d++) kb[(h * r + c) * dn + d] = wkv[(h * w + d) * r + c];
            for (int v = 0; v < dv; v++) vb[(h * dv + v) * r + c] = wkv[(h * w + dn + v) * r + c];
        }
    fmoe__mat k_b, v_b;
    store_as(ktype, kb, (int64_t)H * r, dn, &k_b);
    store_as(vtype, vb, (int64_t)H * dv, r, &v_b);
    for (int h = 0; h < H; h++)
        for (int c = 0; c < r; c++) {
            for (int d = 0; d < dn; d++) wkv[(h * w + d) * r + c] = kb[(h * r + c) * dn + d];
            for (int v = 0; v < dv; v++) wkv[(h * w + dn + v) * r + c] = vb[(h * dv + v) * r + c];
        }
    for (int i = 0; i < T * H * qs; i++) q0[i] = frand();
    for (int i = 0; i < T * ks; i++) kv0[i] = frand();
    for (int t = 0; t < T; t++)
        for (int i = 0; i < half; i++) {
            ang[t * half + i] = t * pow(10000.0, -2.0 * i / dr);
            cos_t[t * half + i] = (float)cos(ang[t * half + i]);
            sin_t[t * half + i] = (float)sin(ang[t * half + i]);
        }
    memcpy(q, q0, sizeof(float) * (size_t)T * H * qs);
    memcpy(kv, kv0, sizeof(float) * (size_t)T * ks);

    const fmoe__backend_limits lim = {.threads = threads, .max_cols = r > 64 ? r : 64,
                                      .max_batch = T, .max_context = ctx, .max_experts = 1,
                                      .activations = act8 ? FMOE_ACTIVATIONS_Q8
                                                          : FMOE_ACTIVATIONS_F32};
    void *c;
    ASSERT_OK(fmoe__cpu_backend.init(&lim, &c));
    const float scale = 1.0f / sqrtf((float)qs);
    for (int t0 = 0; t0 < T; t0 += chunk) {
        const int n = T - t0 < chunk ? T - t0 : chunk;
        const fmoe__mla_args a = {
            .q = q + (int64_t)t0 * H * qs, .kv = kv + (int64_t)t0 * ks,
            .cos = cos_t + t0 * half, .sin = sin_t + t0 * half, .cache = cache,
            .wk_b = &k_b, .wv_b = &v_b,
            .out = out + (int64_t)t0 * H * dv, .scratch = scratch, .scratch_slots = threads,
            .max_context = ctx, .max_batch = T, .n = n, .pos0 = t0,
            .n_heads = H, .nope = dn, .rope = dr, .v_dim = dv, .rank = r,
            .interleave = interleave, .scale = scale};
        fmoe__cpu_backend.mla_attention(c, &a);
    }
    fmoe__cpu_backend.free(c);

    /* Expanded: K [T][H][qs], V [T][H][dv] from the latents; rope on pairs, or halves
     * when not interleaved. */
    double *K = malloc(sizeof(double) * (size_t)T * H * qs);
    double *V = malloc(sizeof(double) * (size_t)T * H * dv);
    double *Q = malloc(sizeof(double) * (size_t)T * H * qs);
    double *sc = malloc(sizeof(double) * (size_t)T);
    for (int t = 0; t < T; t++) {
        double pe[512], tmp[512];
        for (int i = 0; i < dr; i++) pe[i] = kv0[t * ks + r + i];
        if (interleave) {
            rope_pairs(pe, dr, ang + t * half);
        } else {
            for (int i = 0; i < half; i++) tmp[2 * i] = pe[i], tmp[2 * i + 1] = pe[i + half];
            rope_pairs(tmp, dr, ang + t * half);
            for (int i = 0; i < half; i++) pe[i] = tmp[2 * i], pe[i + half] = tmp[2 * i + 1];
        }
        for (int h = 0; h < H; h++) {
            for (int i = 0; i < dn; i++) {
                double s = 0;
                for (int k = 0; k < r; k++)
                    s += (double)wkv[((int64_t)h * w + i) * r + k] * kv0[t * ks + k];
                K[((int64_t)t * H + h) * qs + i] = s;
            }
            for (int i = 0; i < dr; i++) K[((int64_t)t * H + h) * qs + dn + i] = pe[i];
            for (int v = 0; v < dv; v++) {
                double s = 0;
                for (int k = 0; k < r; k++)
                    s += (double)wkv[((int64_t)h * w + dn + v) * r + k] * kv0[t * ks + k];
                V[((int64_t)t * H + h) * dv + v] = s;
            }
            double *qh = Q + ((int64_t)t * H + h) * qs;
            for (int i = 0; i < qs; i++) qh[i] = q0[((int64_t)t * H + h) * qs + i];
            if (interleave) {
                rope_pairs(qh + dn, dr, ang + t * half);
            } else {
                for (int i = 0; i < half; i++)
                    tmp[2 * i] = qh[dn + i], tmp[2 * i + 1] = qh[dn + i + half];
                rope_pairs(tmp, dr, ang + t * half);
                for (int i = 0; i < half; i++)
                    qh[dn + i] = tmp[2 * i], qh[dn + i + half] = tmp[2 * i + 1];
            }
        }
    }
    double num = 0, den = 0;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
            double mx = -INFINITY, sum = 0;
            for (int j = 0; j <= t; j++) {
                double s = 0;
                for (int i = 0; i < qs; i++)
                    s += Q[((int64_t)t * H + h) * qs + i] * K[((int64_t)j * H + h) * qs + i];
                sc[j] = s * scale;
                mx = sc[j] > mx ? sc[j] : mx;
            }
            for (int j = 0; j <= t; j++) sum += sc[j] = exp(sc[j] - mx);
            for (int v = 0; v < dv; v++) {
                double o = 0;
                for (int j = 0; j <= t; j++) o += sc[j] / sum * V[((int64_t)j * H + h) * dv + v];
                const double d = out[((int64_t)t * H + h) * dv + v] - o;
                num += d * d;
                den += o * o;
            }
        }
    const double rel = sqrt(num / den);
    if (getenv("FMOE_TEST_VERBOSE"))
        printf("  H %d dn %d r %d k_b %s v_b %s act8 %d: relative error %.3g (tolerance %g)\n",
               H, dn, r, fmoe_ggml_type_name(ktype), fmoe_ggml_type_name(vtype), act8, rel, tol);
    /* the 8-bit inputs' rounding shows, so their path was taken */
    if (act8 && ktype != FMOE_GGML_F32 && !(rel > 1e-5))
        HARNESS_FAIL("k_b %s v_b %s act8: relative error %g, f32's: 8-bit inputs not used",
                     fmoe_ggml_type_name(ktype), fmoe_ggml_type_name(vtype), rel);
    if (!(rel <= tol))
        HARNESS_FAIL("H %d dn %d dr %d dv %d r %d chunk %d interleave %d k_b %s v_b %s act8 %d: "
                     "relative error %g > %g",
                     H, dn, dr, dv, r, chunk, interleave, fmoe_ggml_type_name(ktype),
                     fmoe_ggml_type_name(vtype), act8, rel, tol);
    /* The cache holds each token's latent as given and its rotated rope dims. */
    for (int t = 0; t < T; t++)
        for (int k = 0; k < r; k++) ASSERT_NEAR(cache[t * ks + k], kv0[t * ks + k], 0);
    free((void *)k_b.data), free((void *)v_b.data), free(kb), free(vb);
    free(wkv), free(q), free(kv), free(q0), free(kv0), free(cos_t), free(sin_t);
    free(cache);
    free(out), free(scratch), free(ang), free(K), free(V), free(Q), free(sc);
}

TEST(mla_absorbed_equals_expanded) {
    const uint32_t F32 = FMOE_GGML_F32, BF16 = FMOE_GGML_BF16;
    check_mla(harness_failed, 4, 16, 8, 12, 24, 13, 13, 1, F32, F32, 0, 1e-5, 1); /* prefill */
    check_mla(harness_failed, 4, 16, 8, 12, 24, 13, 1, 1, F32, F32, 0, 1e-5, 1); /* by token */
    check_mla(harness_failed, 3, 8, 4, 20, 10, 9, 4, 0, F32, F32, 0, 1e-5, 1); /* dv > dn */
    check_mla(harness_failed, 2, 32, 16, 32, 64, 20, 7, 1, BF16, BF16, 0, 1e-5, 1);
    check_mla(harness_failed, 8, 16, 8, 16, 64, 24, 24, 1, BF16, BF16, 0, 1e-5, 3); /* 3 thr. */
}

/* k_b and v_b in blocks, as DeepSeek-V2-Lite's Q4_K_M file has them (k_b Q5_0: its rows of
 * dn = 128 are not whole 256-blocks; v_b Q4_K), and Q8_0. With f32 inputs the products are
 * the blocks' exact values dotted in f32: 1e-5, as above. With 8-bit inputs each input
 * moves by up to half a step of its 8-bit block (amax/254; fmoe/quant_act.h), about 0.2%
 * of a dot's size for random rows, twice over (q_lat from q_nope, then out from o_lat),
 * and the scores' errors pass through the softmax: 0.45-0.56% measured on these cases,
 * 1e-2 allowed. A wrong row or head is off by its whole size (relative error ~1). */
TEST(mla_quantized_up_projections) {
    const uint32_t Q50 = FMOE_GGML_Q5_0, Q4K = FMOE_GGML_Q4_K, Q80 = FMOE_GGML_Q8_0;
    check_mla(harness_failed, 2, 64, 16, 32, 256, 9, 9, 1, Q50, Q4K, 0, 1e-5, 1);
    check_mla(harness_failed, 2, 64, 16, 32, 256, 9, 1, 1, Q50, Q4K, 1, 1e-2, 1);
    check_mla(harness_failed, 4, 32, 8, 32, 64, 11, 4, 0, Q80, Q80, 1, 1e-2, 3);
    check_mla(harness_failed, 4, 32, 8, 32, 64, 11, 11, 0, Q50, Q50, 1, 1e-2, 3);
}

/* transformers' gate in double: V2 (softmax, group max) or V3 (sigmoid + bias, group
 * top-2 sum), the other groups masked to -inf, top-k, weights from the unbiased scores. */
static void ref_route(const float *logits, int J, int K, int v3, int G, int TG,
                      const float *bias, int norm, double scale, int *idx, double *w) {
    double p[256], ch[256];
    if (v3) {
        for (int j = 0; j < J; j++) p[j] = 1 / (1 + exp(-(double)logits[j]));
    } else {
        double mx = -INFINITY, s = 0;
        for (int j = 0; j < J; j++) mx = logits[j] > mx ? logits[j] : mx;
        for (int j = 0; j < J; j++) s += p[j] = exp(logits[j] - mx);
        for (int j = 0; j < J; j++) p[j] /= s;
    }
    for (int j = 0; j < J; j++) ch[j] = p[j] + (bias ? bias[j] : 0);
    if (G > 1) {
        const int per = J / G;
        double gs[64];
        int keep[64] = {0};
        for (int g = 0; g < G; g++) {
            double a = -INFINITY, b = -INFINITY;
            for (int j = g * per; j < (g + 1) * per; j++) {
                if (ch[j] > a) b = a, a = ch[j];
                else if (ch[j] > b) b = ch[j];
            }
            gs[g] = v3 ? a + b : a;
        }
        for (int t = 0; t < TG; t++) {
            int best = -1;
            for (int g = 0; g < G; g++)
                if (!keep[g] && (best < 0 || gs[g] > gs[best])) best = g;
            keep[best] = 1;
        }
        for (int g = 0; g < G; g++)
            if (!keep[g])
                for (int j = g * per; j < (g + 1) * per; j++) ch[j] = -INFINITY;
    }
    int used[256] = {0};
    double sum = 0;
    for (int k = 0; k < K; k++) {
        int best = -1;
        for (int j = 0; j < J; j++)
            if (!used[j] && (best < 0 || ch[j] > ch[best])) best = j;
        used[best] = 1;
        idx[k] = best;
        w[k] = p[best];
        sum += p[best];
    }
    for (int k = 0; k < K; k++) w[k] = (norm ? w[k] / (sum + 1e-20) : w[k]) * scale;
}

TEST(grouped_routing_matches_transformers_gates) {
    const int J = 32, K = 4;
    float logits[32], bias[32], probs[32], choice[32], w[8];
    int32_t idx[8];
    int ridx[8];
    double rw[8];
    for (int round = 0; round < 200; round++) {
        const int v3 = round % 2, G = round % 3 == 0 ? 1 : round % 3 == 1 ? 4 : 8;
        const int TG = G == 1 ? 1 : G / 2, norm = round % 5 != 0;
        const double scale = v3 ? 2.5 : 1.0 + (round % 4);
        for (int j = 0; j < J; j++) logits[j] = 3 * frand(), bias[j] = 0.2f * frand();
        /* negative biased scores: a kept group's negative choices still beat the masked */
        if (round % 7 == 0)
            for (int j = 0; j < J; j++) bias[j] = -1.5f + 0.1f * frand();
        fmoe_route_row_grouped(logits, J, K, v3, norm, 1e-20f, (float)scale, G, TG, v3,
                               v3 ? bias : NULL, 0, 0.0f, probs, choice, idx, w);
        ref_route(logits, J, K, v3, G, TG, v3 ? bias : NULL, norm, scale, ridx, rw);
        for (int k = 0; k < K; k++) {
            if (idx[k] != ridx[k])
                HARNESS_FAIL("round %d (v3 %d, groups %d): expert %d is %d, reference %d",
                             round, v3, G, k, idx[k], ridx[k]);
            ASSERT_NEAR(w[k], rw[k], 1e-5 * scale);
        }
        /* the recorded probabilities stay unbiased and unmasked */
        double s = 0;
        for (int j = 0; j < J; j++) s += probs[j];
        if (!v3) ASSERT_NEAR(s, 1.0, 1e-5);
        else ASSERT_NEAR(probs[3], 1 / (1 + exp(-(double)logits[3])), 1e-6);
    }
}

int main(int argc, char **argv) { return RUN_TESTS(argc, argv); }
