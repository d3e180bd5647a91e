/*
 * rowwise.h - internal: the per-row math of the forward pass (RMSNorm, rotary embedding, softmax,
 * top-k routing), written once as plain C that the CPU backend compiles and CUDA kernels can
 * include (no GPU op without the CPU op it must match). A CUDA kernel runs one of these per
 * row (or per head); CPU tests check them against straightforward references, so they pin
 * down the arithmetic every backend must reproduce.
 *
 * Conventions follow transformers' modeling code: RMSNorm computes in float32 and scales
 * after normalising; RoPE rotates halves (x[i] with x[i + D/2], "rotate_half"), not
 * interleaved pairs; softmax subtracts the maximum.
 */
#ifndef FMOE_ROWWISE_H
#define FMOE_ROWWISE_H

#include <math.h>
#include <stdint.h>

#include "fmoe/elementwise.h"

/* y[i] = w[i] * x[i] / sqrt(mean(x^2) + eps), i < n. y may alias x. The sum of squares
 * is accumulated in double, so the result does not depend on the summation order. */
static inline FMOE_HD void fmoe_rmsnorm_row(float *y, const float *x, const float *w,
                                            int32_t n, float eps) {
    double ss = 0.0;
    for (int32_t i = 0; i < n; i++) ss += (double)x[i] * (double)x[i];
    const float inv = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
    for (int32_t i = 0; i < n; i++) y[i] = w[i] * (x[i] * inv);
}

/* y[i] = w[i] * (x[i] - mean) / sqrt(var + eps) + b[i], i < n: torch's LayerNorm (biased
 * variance), Phi-3.5-MoE's norm. y may alias x. Mean and variance are accumulated in
 * double, as fmoe_rmsnorm_row's sum, so the result does not depend on summation order. */
static inline FMOE_HD void fmoe_layernorm_row(float *y, const float *x, const float *w,
                                              const float *b, int32_t n, float eps) {
    double sum = 0.0, ss = 0.0;
    for (int32_t i = 0; i < n; i++) sum += (double)x[i];
    const double mean = sum / (double)n;
    for (int32_t i = 0; i < n; i++) ss += ((double)x[i] - mean) * ((double)x[i] - mean);
    const float inv = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
    const float mu = (float)mean;
    for (int32_t i = 0; i < n; i++) y[i] = w[i] * ((x[i] - mu) * inv) + b[i];
}

/*
 * Rotates one head in place: x[D] with cos/sin [D/2] of its position (the table for
 * frequency i serves dims i and i + D/2):
 *   x'[i]       = x[i] * c[i] - x[i + D/2] * s[i]
 *   x'[i + D/2] = x[i + D/2] * c[i] + x[i] * s[i]
 */
static inline FMOE_HD void fmoe_rope_head(float *x, const float *c, const float *s,
                                          int32_t head_dim) {
    const int32_t half = head_dim / 2;
    for (int32_t i = 0; i < half; i++) {
        const float a = x[i], b = x[i + half];
        x[i] = a * c[i] - b * s[i];
        x[i + half] = b * c[i] + a * s[i];
    }
}

/* Most rotary dims fmoe_rope_head_pairs takes (DeepSeek: 64; config.c refuses more). */
#define FMOE_ROPE_PAIRS_MAX 512

/*
 * Multi-head latent attention's decoupled rotary part of one head, x[dr] in place
 * (runtime/cpu/cpu_mla.c and the CUDA backend's MLA kernel both run it): with
 * `interleave` the dims come as adjacent pairs (x[2i], x[2i+1]) rotated by frequency i
 * (transformers' deepseek_v2/v3) and are first permuted to halves (evens, then odds);
 * then fmoe_rope_head. Query and key go through the same permutation, so their dot
 * products are unchanged. dr <= FMOE_ROPE_PAIRS_MAX.
 */
static inline FMOE_HD void fmoe_rope_head_pairs(float *x, const float *c, const float *s,
                                                int32_t dr, int interleave) {
    if (interleave) {
        float tmp[FMOE_ROPE_PAIRS_MAX];
        const int32_t half = dr / 2; /* dr is even: the loops name the 2·half values they set */
        for (int32_t i = 0; i < half; i++) {
            tmp[i] = x[2 * i];
            tmp[i + half] = x[2 * i + 1];
        }
        for (int32_t i = 0; i < 2 * half; i++) x[i] = tmp[i];
    }
    fmoe_rope_head(x, c, s, dr);
}

/* y = softmax(x) over n values; y may alias x. -inf entries get 0; an all -inf row gets
 * all 0 (a fully masked row). */
static inline FMOE_HD void fmoe_softmax_row(float *y, const float *x, int32_t n) {
    float mx = -INFINITY;
    for (int32_t i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    if (mx == -INFINITY) {
        for (int32_t i = 0; i < n; i++) y[i] = 0.0f;
        return;
    }
    float sum = 0.0f;
    for (int32_t i = 0; i < n; i++) {
        y[i] = expf(x[i] - mx);
        sum += y[i];
    }
    const float inv = 1.0f / sum;
    for (int32_t i = 0; i < n; i++) y[i] *= inv;
}

/* y = the first n values of softmax([x, sink]) over n + 1 logits: gpt-oss's attention
 * sink, a learned logit per head that takes a share of the probability and brings no
 * value (transformers' modeling_gpt_oss eager_attention_forward drops its column after the
 * softmax). y may alias x. */
static inline FMOE_HD void fmoe_softmax_row_sink(float *y, const float *x, int32_t n,
                                                 float sink) {
    float mx = sink;
    for (int32_t i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    float sum = expf(sink - mx);
    for (int32_t i = 0; i < n; i++) {
        y[i] = expf(x[i] - mx);
        sum += y[i];
    }
    const float inv = 1.0f / sum;
    for (int32_t i = 0; i < n; i++) y[i] *= inv;
}

/* Logistic sigmoid. */
static inline FMOE_HD float fmoe_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/*
 * The k largest of p[0..n) in descending order into idx[k] and val[k] (k <= n); among
 * equal values the lower index comes first, and NaN never wins over a number. O(n·k²)
 * comparisons, meant for the router's small n and k.
 */
static inline FMOE_HD void fmoe_topk_row(const float *p, int32_t n, int32_t k, int32_t *idx,
                                         float *val) {
    for (int32_t j = 0; j < k; j++) {
        int32_t best = -1;
        for (int32_t i = 0; i < n; i++) {
            int taken = 0;
            for (int32_t t = 0; t < j; t++) taken |= idx[t] == i;
            if (taken) continue;
            if (best < 0 || p[i] > p[best] || (p[best] != p[best] && p[i] == p[i])) best = i;
        }
        idx[j] = best;
        val[j] = p[best];
    }
}

/*
 * One choice of Phi-3.5-MoE's sparsemixer at inference (transformers' modeling_phimoe.py
 * `sparsemixer`, eval branch; Phi-3 Technical Report, Phi-3.5-MoE; GRIN-MoE,
 * arXiv 2409.12136): `s` are the logits with the experts already chosen at -inf, `logits`
 * the unmasked ones. The choice is the argmax m of s (first of equals, as torch.max).
 * Expert j stays in a softmax iff (m - logits[j]) / max(|logits[j]|, m) <= 2·eps (a 0/0
 * is NaN, which the comparison keeps, as torch's does), and the choice's weight is that
 * softmax at the choice. The choice is the softmax's maximum, so the weight is
 * 1 / sum(exp(s[j] - m)) over the kept j: no scratch row.
 */
static inline FMOE_HD void fmoe__sparsemixer_pick(const float *logits, const float *s,
                                                  int32_t J, float eps, int32_t *idx,
                                                  float *weight) {
    int32_t best = 0;
    for (int32_t j = 1; j < J; j++)
        if (s[j] > s[best]) best = j;
    const float m = s[best];
    float sum = 0.0f;
    for (int32_t j = 0; j < J; j++) {
        const float a = fabsf(logits[j]);
        const float factor = a > m ? a : m;
        if (!((m - logits[j]) / factor > 2.0f * eps)) sum += expf(s[j] - m);
    }
    *idx = best;
    *weight = 1.0f / sum;
}

/* Most expert groups fmoe_route_row_grouped ranks (DeepSeek-V3: 8). */
#define FMOE_ROUTE_MAX_GROUPS 64

/*
 * The router of one token, DeepSeek-V2/V3's grouped form (each family's plain router is
 * the case n_group <= 1, bias NULL: fmoe_route_row):
 *   probs[J]  = softmax(logits), or sigmoid(logits) for sigmoid scoring
 *   choice[j] = probs[j] + bias[j]          (V3's e_score_correction_bias; else probs)
 *   groups    (n_group > 1) J splits into n_group equal groups, each scored by its best
 *             choice (V2 group_limited_greedy) or the sum of its two best (V3 noaux_tc,
 *             group_top2); the topk_group best groups stay and the others' choices
 *             become -inf (transformers' V3 masked_fill; V2 fills 0.0, the same choice
 *             for softmax scores, which are positive)
 *   idx[K]    the K largest choices, descending (fmoe_topk_row)
 *   weight[k] = probs[idx[k]] (unbiased: the bias only selects), renormalised to sum 1
 *             when `norm` (denominator + norm_eps), then times `scale`.
 * `sparsemixer` (Phi-3.5-MoE) replaces the selection and weights after probs by
 * fmoe__sparsemixer_pick, K times, with `jitter_eps` (router_jitter_noise); groups, bias,
 * norm and scale do not apply.
 * `choice` is [J] scratch, distinct from probs unless n_group <= 1, bias is NULL and not
 * sparsemixer (nothing then changes it; masking would otherwise zero recorded probs).
 * DeepSeek-V3 technical report §2.1 (routing), DeepSeek-V2 paper §2.2 (device-limited
 * routing, which group_limited_greedy stands for).
 */
static inline FMOE_HD void fmoe_route_row_grouped(const float *logits, int32_t J, int32_t K,
                                                  int sigmoid, int norm, float norm_eps,
                                                  float scale, int32_t n_group,
                                                  int32_t topk_group, int group_top2,
                                                  const float *bias, int sparsemixer,
                                                  float jitter_eps, float *probs,
                                                  float *choice, int32_t *idx, float *weight) {
    if (sigmoid) {
        for (int32_t j = 0; j < J; j++) probs[j] = fmoe_sigmoid(logits[j]);
    } else {
        fmoe_softmax_row(probs, logits, J);
    }
    if (sparsemixer) {
        /* Phi-3.5-MoE: probs stay the plain softmax (what policies and traces see); each
         * of the K choices (2 in transformers) masks the ones before it (its scatter of
         * -inf into `choice`, the logits) and weighs itself by a softmax of its own, not
         * renormalised nor scaled. */
        for (int32_t j = 0; j < J; j++) choice[j] = logits[j];
        for (int32_t k = 0; k < K; k++) {
            fmoe__sparsemixer_pick(logits, choice, J, jitter_eps, &idx[k], &weight[k]);
            choice[idx[k]] = -INFINITY;
        }
        return;
    }
    if (choice != probs || bias) /* the plain router selects on probs themselves */
        for (int32_t j = 0; j < J; j++) choice[j] = probs[j] + (bias ? bias[j] : 0.0f);
    if (n_group > 1 && n_group <= FMOE_ROUTE_MAX_GROUPS && topk_group < n_group) {
        const int32_t per = J / n_group;
        float gs[FMOE_ROUTE_MAX_GROUPS], gv[FMOE_ROUTE_MAX_GROUPS];
        int32_t gi[FMOE_ROUTE_MAX_GROUPS];
        for (int32_t gr = 0; gr < n_group; gr++) {
            int32_t top[2];
            float val[2];
            const int32_t k = group_top2 && per >= 2 ? 2 : 1;
            fmoe_topk_row(choice + (int64_t)gr * per, per, k, top, val);
            gs[gr] = k == 2 ? val[0] + val[1] : val[0];
        }
        fmoe_topk_row(gs, n_group, topk_group, gi, gv);
        for (int32_t gr = 0; gr < n_group; gr++) {
            int kept = 0;
            for (int32_t t = 0; t < topk_group; t++) kept |= gi[t] == gr;
            if (!kept)
                for (int32_t j = gr * per; j < (gr + 1) * per; j++) choice[j] = -INFINITY;
        }
    }
    fmoe_topk_row(choice, J, K, idx, weight);
    for (int32_t k = 0; k < K; k++) weight[k] = probs[idx[k]];
    if (norm) {
        float sum = 0.0f;
        for (int32_t k = 0; k < K; k++) sum += weight[k];
        sum += norm_eps;
        for (int32_t k = 0; k < K; k++) weight[k] /= sum;
    }
    if (scale != 1.0f)
        for (int32_t k = 0; k < K; k++) weight[k] *= scale;
}

/*
 * The router of one token: probs[J] = softmax(logits) (or sigmoid(logits) for sigmoid
 * scoring), then the top k into idx/weight, renormalised to sum 1 when `norm` (the
 * denominator gets `norm_eps`, which DeepSeek's code adds and the others do not), then
 * times `scale` (routed_scaling_factor). The ungrouped, unbiased case of
 * fmoe_route_row_grouped (choice is probs itself: nothing masks it).
 */
static inline FMOE_HD void fmoe_route_row(const float *logits, int32_t J, int32_t K,
                                          int sigmoid, int norm, float norm_eps, float scale,
                                          float *probs, int32_t *idx, float *weight) {
    fmoe_route_row_grouped(logits, J, K, sigmoid, norm, norm_eps, scale, 1, 1, 0, NULL, 0, 0.0f,
                           probs, probs, idx, weight);
}

#endif
