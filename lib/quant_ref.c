/*
 * quant_ref.c - f32 rows to Q8_0, Q4_K, Q5_K and Q6_K blocks, for `fmoe quantize` (and
 * the dispatch to lib/quant_ref32.c's Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL and IQ4_XS blocks,
 * lib/quant_refk.c's Q2_K and Q3_K, and lib/quant_iq_quantize.c's IQ3_XXS, IQ3_S, IQ2_S).
 *
 * The algorithms are ggml's reference quantisers (ggml-quants.c: quantize_row_q8_0_ref,
 * quantize_row_q4_K_ref / q5_K / q6_K with make_qkx2_quants and make_qx_quants), written
 * out again here: a file we write should be the file llama.cpp's `llama-quantize` would
 * write from the same f32 values without an importance matrix, so results are comparable.
 *
 * What was checked, and how (tests/python/test_gguf_quants.py):
 *   - Q8_0: byte for byte against gguf-py's gguf.quants.quantize, which its authors made
 *     bit-exact with ggml's reference;
 *   - Q4_K, Q5_K, Q6_K: gguf-py has no quantiser for these, so only that every block
 *     dequantises (by gguf-py) to within the type's error of the input. Byte equality with
 *     ggml is intended but unverified here. Two things could differ: ggml built with FMA
 *     contraction (GNU C mode) rounds a·b+c once where this ISO C build rounds twice, and
 *     ggml has changed these search parameters between releases.
 * Rounding is ggml's nearest_int: round half to even through the 1.5·2^23 trick. The last
 * pass of each K-quant picks every level against the sub-block scale the readers compute
 * (quant_block.h, which the CPU and CUDA dequantisation share), as ggml's does.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "fmoe/error.h"
#include "half.h"
#include "fmoe/quant.h"
#include "iq_search.h"
#include "quant_impl.h"

/* ---------------------------------------------------------------------------------- */
/* Q8_0: d = max|x| / 127, q = round(x / d) (half away from zero, as ggml's roundf)    */
/* ---------------------------------------------------------------------------------- */

static void quantize_q8_0(const float *x, uint8_t *b) {
    float amax = 0;
    for (int i = 0; i < FMOE_QK8_0; i++) amax = fmaxf(amax, fabsf(x[i]));
    const float d = amax / 127.f;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    fmoe__put_f16(b, d);
    for (int i = 0; i < FMOE_QK8_0; i++) b[2 + i] = (uint8_t)(int8_t)roundf(x[i] * id);
}

/* ---------------------------------------------------------------------------------- */
/* make_qkx2_quants: scale and min of an affine n-level grid, weighted least squares   */
/* over nstep+1 trial scales around nmax / (max - min).                                */
/* ---------------------------------------------------------------------------------- */

float fmoe__make_qkx2_quants(int n, int nmax, const float *x, const float *w, uint8_t *L,
                             float *the_min, uint8_t *Laux, float rmin, float rdelta, int nstep,
                             int use_mad) {
    float min = x[0], max = x[0];
    float sum_w = w[0], sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        memset(L, 0, (size_t)n);
        *the_min = -min;
        return 0.f;
    }
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    float best_error = 0;
    for (int i = 0; i < n; i++) {
        const int l = fmoe__nearest_int(iscale * (x[i] - min));
        L[i] = (uint8_t)fmoe__clampi(l, 0, nmax);
        const float diff = scale * L[i] + min - x[i];
        best_error += w[i] * (use_mad ? fabsf(diff) : diff * diff);
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            const int l = fmoe__clampi(fmoe__nearest_int(iscale * (x[i] - min)), 0, nmax);
            Laux[i] = (uint8_t)l;
            sum_l += w[i] * l;
            sum_l2 += w[i] * l * l;
            sum_xl += w[i] * l * x[i];
        }
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0;
            for (int i = 0; i < n; i++) {
                const float diff = this_scale * Laux[i] + this_min - x[i];
                cur_error += w[i] * (use_mad ? fabsf(diff) : diff * diff);
            }
            if (cur_error < best_error) {
                memcpy(L, Laux, (size_t)n);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

/* ---------------------------------------------------------------------------------- */
/* Q4_K and Q5_K: eight sub-blocks of 32, each with a 6-bit scale and min relative to   */
/* the block's f16 d and dmin.                                                          */
/* ---------------------------------------------------------------------------------- */

/* Scales, mins and the levels L[256] of one block; writes d, dmin and the 12 scale bytes
 * at b. nmax 15 (Q4_K) or 31 (Q5_K), with ggml's search parameters for each. */
static void quantize_k_affine(const float *x, uint8_t *b, int nmax, uint8_t *L) {
    uint8_t Laux[32];
    float weights[32], mins[8], scales[8];
    const float rmin = nmax == 15 ? -1.f : -0.5f;
    const int nstep = nmax == 15 ? 20 : 15;
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; j++) {
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++) sum_x2 += x[32 * j + l] * x[32 * j + l];
        const float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++) weights[l] = av_x + fabsf(x[32 * j + l]);
        scales[j] = fmoe__make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j],
                                           Laux, rmin, 0.1f, nstep, 0);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    uint8_t *sc = b + 4;
    memset(sc, 0, 12);
    for (int j = 0; j < 8; j++) {
        int ls = fmoe__nearest_int(inv_scale * scales[j]);
        int lm = fmoe__nearest_int(inv_min * mins[j]);
        ls = ls < 63 ? ls : 63;
        lm = lm < 63 ? lm : 63;
        if (j < 4) {
            sc[j] = (uint8_t)ls;
            sc[j + 4] = (uint8_t)lm;
        } else {
            sc[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
            sc[j - 4] |= (uint8_t)((ls >> 4) << 6);
            sc[j] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    fmoe__put_f16(b, max_scale / 63.f);
    fmoe__put_f16(b + 2, max_min / 63.f);
    for (int j = 0; j < 8; j++) {
        float d, dm; /* as the reader will compute them */
        fmoe__k4_sub_scale(b, j, fmoe__qblock_f16(b), fmoe__qblock_f16(b + 2), &d, &dm);
        if (d == 0) continue;
        for (int ii = 0; ii < 32; ii++)
            L[32 * j + ii] = (uint8_t)fmoe__clampi(fmoe__nearest_int((x[32 * j + ii] + dm) / d), 0, nmax);
    }
}

static void quantize_q4_k(const float *x, uint8_t *b) {
    uint8_t L[FMOE_QK_K];
    quantize_k_affine(x, b, 15, L);
    uint8_t *q = b + 16;
    for (int j = 0; j < FMOE_QK_K; j += 64, q += 32)
        for (int l = 0; l < 32; l++) q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
}

static void quantize_q5_k(const float *x, uint8_t *b) {
    uint8_t L[FMOE_QK_K];
    quantize_k_affine(x, b, 31, L);
    uint8_t *qh = b + 16, *ql = b + 48;
    memset(qh, 0, 32);
    uint8_t m1 = 1, m2 = 2;
    for (int n = 0; n < FMOE_QK_K; n += 64, ql += 32) {
        for (int j = 0; j < 32; j++) {
            int l1 = L[n + j], l2 = L[n + j + 32];
            if (l1 > 15) {
                l1 -= 16;
                qh[j] |= m1;
            }
            if (l2 > 15) {
                l2 -= 16;
                qh[j] |= m2;
            }
            ql[j] = (uint8_t)(l1 | (l2 << 4));
        }
        m1 = (uint8_t)(m1 << 2);
        m2 = (uint8_t)(m2 << 2);
    }
}

/* ---------------------------------------------------------------------------------- */
/* Q6_K: sixteen sub-blocks of 16, symmetric 6-bit values, int8 scales.                 */
/* ---------------------------------------------------------------------------------- */

/* make_qx_quants with rmse_type 1 (weights x²) and no importance matrix: the symmetric
 * scale of 2·nmax levels, searched over 19 trial scales around nmax / max|x|. */
static float make_qx_quants(int n, int nmax, const float *x, int8_t *L) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        const float ax = fabsf(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < FMOE_QUANT_GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.f;
    }
    float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        const int l = fmoe__clampi(fmoe__nearest_int(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)(l + nmax);
        const float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 != 0 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; ++is) {
        if (is == 0) continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            const int l = fmoe__clampi(fmoe__nearest_int(iscale * x[i]), -nmax, nmax - 1);
            const float w = x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++) {
                const int l = fmoe__nearest_int(iscale * x[i]);
                L[i] = (int8_t)(nmax + fmoe__clampi(l, -nmax, nmax - 1));
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

static void quantize_q6_k(const float *x, uint8_t *b) {
    int8_t L[FMOE_QK_K];
    float scales[16];
    float max_scale = 0, max_abs_scale = 0;
    for (int ib = 0; ib < 16; ib++) {
        const float scale = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib);
        scales[ib] = scale;
        const float abs_scale = fabsf(scale);
        if (abs_scale > max_abs_scale) {
            max_abs_scale = abs_scale;
            max_scale = scale;
        }
    }
    uint8_t *ql = b, *qh = b + 128;
    int8_t *sc = (int8_t *)(b + 192);
    if (max_abs_scale < FMOE_QUANT_GROUP_MAX_EPS) {
        memset(b, 0, FMOE_Q6_K_BYTES);
        fmoe__put_f16(b + 208, 0.f);
        return;
    }
    const float iscale = -128.f / max_scale;
    fmoe__put_f16(b + 208, 1 / iscale);
    for (int ib = 0; ib < 16; ib++) {
        const int v = fmoe__nearest_int(iscale * scales[ib]);
        sc[ib] = (int8_t)(v < 127 ? v : 127);
    }
    for (int j = 0; j < 16; j++) {
        const float d = fmoe__q6_k_sub_scale(b, j, fmoe__qblock_f16(b + 208));
        if (d == 0) continue;
        for (int ii = 0; ii < 16; ii++)
            L[16 * j + ii] = (int8_t)(fmoe__clampi(fmoe__nearest_int(x[16 * j + ii] / d), -32, 31) + 32);
    }
    for (int j = 0; j < FMOE_QK_K; j += 128, ql += 64, qh += 32) {
        for (int l = 0; l < 32; l++) {
            const uint8_t q1 = L[j + l] & 0xF, q2 = L[j + l + 32] & 0xF;
            const uint8_t q3 = L[j + l + 64] & 0xF, q4 = L[j + l + 96] & 0xF;
            ql[l] = (uint8_t)(q1 | (q3 << 4));
            ql[l + 32] = (uint8_t)(q2 | (q4 << 4));
            qh[l] = (uint8_t)((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) |
                              ((L[j + l + 64] >> 4) << 4) | ((L[j + l + 96] >> 4) << 6));
        }
    }
}

int fmoe_quant_prepare(uint32_t t) {
    if (!fmoe_quant_uses_importance(t)) return 0; /* the codebook types, which search */
    return fmoe__iq_search_get(t) ? 0 : FMOE_ENOMEM;
}

void fmoe_quant_quantize_row(uint32_t t, const float *src, void *dst, int64_t n) {
    fmoe_quant_quantize_row_weighted(t, src, NULL, dst, n);
}

void fmoe_quant_quantize_row_weighted(uint32_t t, const float *src, const float *importance,
                                      void *dst, int64_t n) {
    FMOE_ASSERT((fmoe_quant_can_quantize(t) || (fmoe_quant_needs_importance(t) && importance)) &&
                n % fmoe_ggml_block_size(t) == 0);
    uint8_t *b = dst;
    switch (t) {
    case FMOE_GGML_Q8_0:
        for (int64_t i = 0; i < n; i += FMOE_QK8_0, b += FMOE_Q8_0_BYTES) quantize_q8_0(src + i, b);
        return;
    case FMOE_GGML_Q4_K:
        for (int64_t i = 0; i < n; i += FMOE_QK_K, b += FMOE_Q4_K_BYTES) quantize_q4_k(src + i, b);
        return;
    case FMOE_GGML_Q5_K:
        for (int64_t i = 0; i < n; i += FMOE_QK_K, b += FMOE_Q5_K_BYTES) quantize_q5_k(src + i, b);
        return;
    case FMOE_GGML_Q6_K:
        for (int64_t i = 0; i < n; i += FMOE_QK_K, b += FMOE_Q6_K_BYTES) quantize_q6_k(src + i, b);
        return;
    case FMOE_GGML_Q2_K:
    case FMOE_GGML_Q3_K: /* lib/quant_refk.c */
        for (int64_t i = 0; i < n; i += FMOE_QK_K, b += fmoe_ggml_type_size(t))
            fmoe__quantize_k23_block(t, src + i, b);
        return;
    case FMOE_GGML_IQ3_XXS:
    case FMOE_GGML_IQ3_S:
    case FMOE_GGML_IQ2_S:
    case FMOE_GGML_IQ2_XXS:
    case FMOE_GGML_IQ2_XS:
    case FMOE_GGML_IQ1_S:
    case FMOE_GGML_IQ1_M: /* lib/quant_iq_quantize.c; fails only out of memory */
        FMOE_ASSERT(fmoe__quantize_iq_row(t, src, importance, b, n) == 0);
        return;
    case FMOE_GGML_IQ4_XS: /* lib/quant_ref32.c */
        for (int64_t i = 0; i < n; i += FMOE_QK_K, b += FMOE_IQ4_XS_BYTES)
            fmoe__quantize_iq4_xs_block(src + i, b);
        return;
    case FMOE_GGML_MXFP4: /* lib/quant_mxfp4.c */
        for (int64_t i = 0; i < n; i += 32, b += FMOE_MXFP4_BYTES) fmoe__quantize_mxfp4_block(src + i, b);
        return;
    default: /* the 32-value types (lib/quant_ref32.c) */
        for (int64_t i = 0; i < n; i += FMOE_QK8_0, b += fmoe_ggml_type_size(t))
            fmoe__quantize_q32_block(t, src + i, b);
        return;
    }
}
