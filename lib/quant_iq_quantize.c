/*
 * quant_iq_quantize.c - f32 values to the seven codebook i-quants (256-value blocks), for
 * `fmoe quantize` (lib/quant_ref.c's fmoe_quant_quantize_row_weighted calls it).
 *
 * The algorithms are ggml's (ggml-quants.c: quantize_row_iq3_xxs_impl, _iq3_s_impl,
 * _iq2_s_impl, _iq2_xxs_impl, _iq2_xs_impl, _iq1_s_impl, _iq1_m_impl), written again.
 * Each value has a weight: with an importance matrix (the mean squared activation of its
 * column, from llama.cpp's imatrix) imp·sqrt(σ² + x²), σ² twice the block's mean square
 * (IQ2_XXS, IQ2_XS: once); without one x² (IQ3) or σ²/4 + x² (IQ2_S), which ggml's
 * quantiser accepts for these three types only. For IQ3_XXS, IQ3_S, IQ2_S and IQ2_XS, per
 * sub-block of 32 (IQ3) or 16 (IQ2) values:
 *   1. signs come off (stored apart; IQ3_XXS and IQ2_XS keep 7 of each 8 and make the count
 *      of minus signs even by flipping the value that costs least, as the format's eighth
 *      sign is implied), leaving magnitudes xval;
 *   2. for 31 (IQ3_XXS) or 19 trial scales around max/(2·kmax - 1), every value is rounded
 *      to its level l (value 2l + 1 in units of the scale); a group of 4 or 8 levels that is
 *      not a codebook point becomes the best of its nearest codebook points
 *      (lib/iq_search.h) by weighted squared error; the trial whose least-squares scale
 *      Σwxq/Σwq² explains the most (Σwxq)²/Σwq² is kept;
 *   3. the groups that were off the codebook (IQ3_S: all groups) are chosen again at that
 *      scale, and the scale refitted;
 * then the block's d = max scale / 31 (times ggml's fudge factor: 1.0125, 1.033, 0.9875
 * for IQ3_XXS, IQ3_S, IQ2_S), and each sub-block's 4-bit scale ls rounds (scale/d - 1)/2.
 * IQ2_XXS starts step 2 from make_qp_quants' fit; IQ1_S and IQ1_M find their three-level
 * split exactly (their own comments say how).
 * The arithmetic is ggml's in the same order, in f32, without contraction (our build is ISO
 * C, which turns it off; ggml's shared library is built for plain x86-64, which has no FMA),
 * so the blocks are llama.cpp's byte for byte: tests/python/test_iquant_quantise.py compares
 * them with blocks libggml-base wrote (tests/fixtures/iquants), without and with a matrix.
 * Two places differ on purpose: ggml's IQ3_S leaves its index and sign pointers where they
 * were after an all-zero sub-block, so every later sub-block of that block lands one slot
 * early and the last slot is left zero (its blocks then decode wrongly); ours writes each
 * sub-block in its own slot. And where no candidate point has a finite error (values near
 * FLT_MAX), ggml aborts; ours takes the first candidate. Non-finite inputs give
 * unspecified blocks.
 */
#include <float.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <math.h>

#include "fmoe/error.h"
#include "fmoe/quant.h"
#include "iq_search.h"
#include "quant_impl.h"

/* One type's search parameters (ggml's constants). */
typedef struct iq_params {
    int n;            /* values per sub-block with its own scale: 32, or 16 (IQ2_S) */
    int kmax;         /* levels: 8 (IQ3), 3 (IQ2_S) */
    int nstep;        /* trial scales (2·kmax - 1 + is·step)/max for is in -nstep .. nstep */
    float step;
    int start_on_grid; /* is_on_grid before any trial is kept: 1, but 0 for IQ3_S */
    int redo_all;      /* step 3 redoes every group (IQ3_S), not only those off the codebook */
} iq_params;

static const iq_params IQ3_XXS_P = {32, 8, 15, 0.2f, 1, 0};
static const iq_params IQ3_S_P = {32, 8, 9, 0.2f, 0, 1};
static const iq_params IQ2_S_P = {16, 3, 9, 0.1f, 1, 0};
static const iq_params IQ2_XS_P = {16, 3, 9, 0.1f, 1, 0};
static const iq_params IQ2_XXS_P = {32, 3, 6, 0.1f, 0, 1}; /* trials around make_qp's scale */

static inline float maxf(float a, float b) { return a > b ? a : b; } /* ggml's MAX */

/* The lattice key of a group's levels. */
static inline int32_t key_of(const fmoe__iq_search *t, const int8_t *L) {
    int32_t u = 0;
    for (int i = 0; i < t->group; i++) u |= (int32_t)L[i] << (t->bits * i);
    return u;
}

/* Of the codebook points listed for an off-codebook key (neighbours: count, indices), the
 * one nearest to xval at `scale` by Σ w·(scale·(2l + 1) - x)²; its levels into L. */
static int best_neighbour(const fmoe__iq_search *t, const uint16_t *neighbours, const float *xval,
                          const float *w, float scale, int8_t *L) {
    const int count = neighbours[0];
    float best_d2 = FLT_MAX;
    int best = neighbours[1]; /* ggml aborts when no error is below FLT_MAX */
    for (int j = 1; j <= count; j++) {
        const uint8_t *lv = t->levels + (size_t)neighbours[j] * (size_t)t->group;
        float d2 = 0;
        for (int i = 0; i < t->group; i++) {
            const float q = (float)(2 * lv[i] + 1);
            const float diff = scale * q - xval[i];
            d2 += w[i] * diff * diff;
        }
        if (d2 < best_d2) {
            best_d2 = d2;
            best = neighbours[j];
        }
    }
    const uint8_t *lv = t->levels + (size_t)best * (size_t)t->group;
    for (int i = 0; i < t->group; i++) L[i] = (int8_t)lv[i];
    return best;
}

/* Group k's levels at inverse scale id, snapped to the codebook (neighbours judged at
 * `scale`); @return 1 when the rounded levels were a codebook point already. */
static int snap_group(const fmoe__iq_search *t, const iq_params *p, const float *xval,
                      const float *waux, float id, float scale, int8_t *L) {
    for (int i = 0; i < t->group; i++)
        L[i] = (int8_t)fmoe__clampi(fmoe__nearest_int(0.5f * (id * xval[i] - 1)), 0, p->kmax - 1);
    const int32_t g = t->map[key_of(t, L)];
    if (g >= 0) return 1;
    best_neighbour(t, t->neighbours - g - 1, xval, waux, scale, L);
    return 0;
}

/* Σ w·x·q and Σ w·q² over a sub-block's levels (q = 2l + 1), in ggml's order. */
static void sums(const iq_params *p, const float *xval, const float *w, const int8_t *L,
                 float *sumqx, float *sumq2) {
    float a = 0, b = 0;
    for (int i = 0; i < p->n; i++) {
        const float q = (float)(2 * L[i] + 1);
        a += w[i] * xval[i] * q;
        b += w[i] * q * q;
    }
    *sumqx = a;
    *sumq2 = b;
}

/* Steps 2 and 3 of the head comment for one sub-block whose largest xval is max > 0:
 * levels into L[p->n] (each group a codebook point), @return its scale. */
static float search(const fmoe__iq_search *t, const iq_params *p, const float *xval,
                    const float *weight, const float *waux, float max, int8_t *L) {
    const int ngroups = p->n / t->group;
    int8_t Laux[32];
    int on_grid[8], on_grid_aux[8];
    float best = 0, scale = max / (float)(2 * p->kmax - 1);
    /* all level 0 (a codebook point in every grid) where no trial is kept: Σwxq = 0 when
     * the importance matrix gives the block's nonzero values no weight */
    memset(L, 0, (size_t)p->n);
    for (int k = 0; k < ngroups; k++) on_grid[k] = p->start_on_grid;
    for (int is = -p->nstep; is <= p->nstep; is++) {
        const float id = ((float)(2 * p->kmax - 1) + (float)is * p->step) / max;
        const float this_scale = 1 / id;
        for (int k = 0; k < ngroups; k++) {
            const int o = k * t->group;
            on_grid_aux[k] = snap_group(t, p, xval + o, waux + o, id, this_scale, Laux + o);
        }
        float sumqx, sumq2;
        sums(p, xval, weight, Laux, &sumqx, &sumq2);
        if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
            scale = sumqx / sumq2;
            best = scale * sumqx;
            memcpy(L, Laux, (size_t)p->n);
            memcpy(on_grid, on_grid_aux, sizeof on_grid);
        }
    }
    int off_grid = 0;
    for (int k = 0; k < ngroups; k++) off_grid += !on_grid[k];
    if (off_grid > 0 && scale > 0) {
        const float id = 1 / scale;
        for (int k = 0; k < ngroups; k++) {
            if (on_grid[k] && !p->redo_all) continue;
            const int o = k * t->group;
            snap_group(t, p, xval + o, waux + o, id, scale, L + o);
        }
        float sumqx, sumq2;
        sums(p, xval, weight, L, &sumqx, &sumq2);
        if (sumq2 > 0) scale = sumqx / sumq2;
    }
    return scale;
}

/* Magnitudes of x[8] into xval, their sign bits (bit i: x[i] < 0) returned. */
static uint8_t split_signs(const float *x, float *xval) {
    uint8_t s = 0;
    for (int i = 0; i < 8; i++) {
        if (x[i] >= 0) {
            xval[i] = x[i];
        } else {
            xval[i] = -x[i];
            s |= (uint8_t)(1 << i);
        }
    }
    return s;
}

/* ggml's σ² of a block for its weights: k·Σx²/256 (k = 2 for these three types). */
static float block_sigma2(const float *x, int k) {
    float sumx2 = 0;
    for (int i = 0; i < FMOE_QK_K; i++) sumx2 += x[i] * x[i];
    return (float)k * sumx2 / FMOE_QK_K;
}

/* The weights of n values: with an importance matrix's entries qw, qw·sqrt(σ² + x²)
 * (ggml's, for every i-quant); without, x² (the IQ3 types' own). */
static void importance_weights(const float *xb, const float *qw, float sigma2, int n, float *w) {
    if (qw)
        for (int i = 0; i < n; i++) w[i] = qw[i] * sqrtf(sigma2 + xb[i] * xb[i]);
    else
        for (int i = 0; i < n; i++) w[i] = xb[i] * xb[i];
}

/* Signs of x[8] as a 7-bit set whose implied eighth sign makes the count of minus signs
 * even (IQ3_XXS, IQ2_XXS, IQ2_XS): where the count is odd, the value whose w·x² is least
 * keeps its sign flipped (its magnitude in xval goes negative, as in ggml). */
static uint8_t split_signs_even(const float *x, const float *w, float *xval) {
    uint8_t s = split_signs(x, xval);
    if (__builtin_parity(s)) {
        int imin = 0;
        float min = w[0] * x[0] * x[0];
        for (int i = 1; i < 8; i++) {
            const float ax = w[i] * x[i] * x[i];
            if (ax < min) {
                min = ax;
                imin = i;
            }
        }
        xval[imin] = -xval[imin];
        s ^= (uint8_t)(1 << imin);
    }
    return s & 127;
}

/* ggml's make_qp_quants: a scale for n non-negative values on the levels 0 .. nmax by
 * weighted least squares (9 trial scales, then up to 5 passes moving single levels).
 * Levels are kept in bytes as ggml keeps them, so a value the parity flip made negative
 * rounds to a level that wraps (-1 -> 255) where ggml's does: the passes read it so. */
static float make_qp_quants(int n, int nmax, const float *x, uint8_t *L, const float *w) {
    float max = 0;
    for (int i = 0; i < n; i++) max = maxf(max, x[i]);
    if (max < FMOE_QUANT_GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.f;
    }
    float iscale = (float)nmax / max;
    for (int i = 0; i < n; i++) L[i] = (uint8_t)fmoe__nearest_int(iscale * x[i]);
    const float scale = 1 / iscale;
    float best_mse = 0;
    for (int i = 0; i < n; i++) {
        const float diff = x[i] - scale * (float)L[i];
        best_mse += w[i] * diff * diff;
    }
    for (int is = -4; is <= 4; is++) {
        if (is == 0) continue;
        const float iscale_is = (0.1f * (float)is + (float)nmax) / max;
        const float scale_is = 1 / iscale_is;
        float mse = 0;
        for (int i = 0; i < n; i++) {
            int l = fmoe__nearest_int(iscale_is * x[i]);
            if (l > nmax) l = nmax;
            const float diff = x[i] - scale_is * (float)l;
            mse += w[i] * diff * diff;
        }
        if (mse < best_mse) {
            best_mse = mse;
            iscale = iscale_is;
        }
    }
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = fmoe__nearest_int(iscale * x[i]);
        if (l > nmax) l = nmax;
        L[i] = (uint8_t)l;
        sumlx += w[i] * x[i] * (float)l;
        suml2 += w[i] * (float)l * (float)l;
    }
    for (int itry = 0; itry < 5; itry++) {
        int n_changed = 0;
        for (int i = 0; i < n; i++) {
            float slx = sumlx - w[i] * x[i] * (float)L[i];
            float sl2 = suml2 - w[i] * (float)L[i] * (float)L[i];
            if (slx > 0 && sl2 > 0) {
                int new_l = fmoe__nearest_int(x[i] * sl2 / slx);
                if (new_l > nmax) new_l = nmax;
                if (new_l != L[i]) {
                    slx += w[i] * x[i] * (float)new_l;
                    sl2 += w[i] * (float)new_l * (float)new_l;
                    if (slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (uint8_t)new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed++;
                    }
                }
            }
        }
        if (!n_changed) break;
    }
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* The codebook index of a group's levels (a codebook point by construction). */
static int32_t index_of(const fmoe__iq_search *t, const int8_t *L) {
    const int32_t g = t->map[key_of(t, L)];
    FMOE_ASSERT(g >= 0);
    return g;
}

/* The 4-bit scale of a sub-block: (scale/d - 1)/2 rounded, 0 .. 15. */
static inline uint8_t scale_code(float id, float scale) {
    return (uint8_t)fmoe__clampi(fmoe__nearest_int(0.5f * (id * scale - 1)), 0, 15);
}

/* IQ3_XXS: f16 d; qs[64] one-byte indices of 4-value points; per 32 values a uint32 of
 * four 7-bit sign sets and the 4-bit scale on top. */
static void quantize_iq3_xxs(const fmoe__iq_search *t, const float *x, const float *qw,
                             uint8_t *b) {
    const iq_params *p = &IQ3_XXS_P;
    float scales[8], weight[32], waux[32], xval[32], max_scale = 0;
    uint32_t sas[8] = {0};
    int8_t L[32];
    memset(b, 0, FMOE_IQ3_XXS_BYTES);
    const float sigma2 = block_sigma2(x, 2);
    for (int ib = 0; ib < 8; ib++) {
        const float *xb = x + 32 * ib;
        importance_weights(xb, qw ? qw + 32 * ib : NULL, sigma2, 32, weight);
        for (int i = 0; i < 32; i++) waux[i] = sqrtf(weight[i]);
        uint8_t signs[4];
        for (int k = 0; k < 4; k++)
            signs[k] = split_signs_even(xb + 8 * k, weight + 8 * k, xval + 8 * k);
        float max = xval[0];
        for (int i = 1; i < 32; i++) max = maxf(max, xval[i]);
        if (max < 1e-8f) { /* ggml's GROUP_MAX_EPS_IQ3_XXS */
            scales[ib] = 0;
            continue;
        }
        float scale = search(t, p, xval, weight, waux, max, L);
        if (scale < 0) { /* cannot happen with these weights; ggml's guard kept */
            scale = -scale;
            for (int k = 0; k < 4; k++) signs[k] = (uint8_t)(~signs[k] & 127);
        }
        for (int k = 0; k < 8; k++) b[2 + 8 * ib + k] = (uint8_t)index_of(t, L + 4 * k);
        sas[ib] = signs[0] | ((uint32_t)signs[1] << 7) | ((uint32_t)signs[2] << 14) |
                  ((uint32_t)signs[3] << 21);
        scales[ib] = scale;
        max_scale = maxf(max_scale, scale);
    }
    if (!max_scale) {
        memset(b, 0, FMOE_IQ3_XXS_BYTES);
        return;
    }
    const float d = max_scale / 31;
    fmoe__put_f16(b, d * 1.0125f);
    const float id = 1 / d;
    for (int ib = 0; ib < 8; ib++) {
        const uint32_t v = sas[ib] | ((uint32_t)scale_code(id, scales[ib]) << 28);
        for (int j = 0; j < 4; j++) b[66 + 4 * ib + j] = (uint8_t)(v >> (8 * j));
    }
}

/* IQ3_S: f16 d; qs[64] index low bytes; qh[8] their ninth bits; signs[32]; scales[4]
 * (two 4-bit scales a byte, one per 32 values). */
static void quantize_iq3_s(const fmoe__iq_search *t, const float *x, const float *qw,
                           uint8_t *b) {
    const iq_params *p = &IQ3_S_P;
    float scales[8], weight[32], waux[32], xval[32], max_scale = 0;
    int8_t L[32];
    uint8_t *qs = b + 2, *qh = b + 66, *sg = b + 74, *sc = b + 106;
    memset(b, 0, FMOE_IQ3_S_BYTES);
    const float sigma2 = block_sigma2(x, 2);
    for (int ib = 0; ib < 8; ib++) {
        const float *xb = x + 32 * ib;
        importance_weights(xb, qw ? qw + 32 * ib : NULL, sigma2, 32, weight);
        for (int i = 0; i < 32; i++) waux[i] = sqrtf(weight[i]);
        uint8_t signs[4];
        for (int k = 0; k < 4; k++) signs[k] = split_signs(xb + 8 * k, xval + 8 * k);
        float max = xval[0];
        for (int i = 1; i < 32; i++) max = maxf(max, xval[i]);
        if (!max) {
            scales[ib] = 0;
            continue;
        }
        float scale = search(t, p, xval, weight, waux, max, L);
        if (scale < 0) {
            scale = -scale;
            for (int k = 0; k < 4; k++) signs[k] = (uint8_t)~signs[k];
        }
        for (int k = 0; k < 8; k++) {
            const int32_t g = index_of(t, L + 4 * k);
            qs[8 * ib + k] = (uint8_t)(g & 255);
            qh[ib] |= (uint8_t)((g >> 8) << k);
        }
        memcpy(sg + 4 * ib, signs, 4);
        scales[ib] = scale;
        max_scale = maxf(max_scale, scale);
    }
    if (!max_scale) return;
    const float d = max_scale / 31;
    fmoe__put_f16(b, d * 1.033f);
    const float id = 1 / d;
    for (int ib = 0; ib < 8; ib += 2)
        sc[ib / 2] = (uint8_t)(scale_code(id, scales[ib]) | (scale_code(id, scales[ib + 1]) << 4));
}

/* IQ2_S: f16 d; qs[32] index low bytes, then 32 sign bytes; qh[8] the indices' two high
 * bits (four a byte); scales[8] (two 4-bit scales a byte, one per 16 values). */
static void quantize_iq2_s(const fmoe__iq_search *t, const float *x, const float *qw,
                           uint8_t *b) {
    const iq_params *p = &IQ2_S_P;
    float scales[16], weight[16], waux[16], xval[16], max_scale = 0;
    int8_t L[16];
    uint8_t *qs = b + 2, *qh = b + 66, *sc = b + 74;
    memset(b, 0, FMOE_IQ2_S_BYTES);
    const float sigma2 = block_sigma2(x, 2);
    for (int ib = 0; ib < 16; ib++) {
        const float *xb = x + 16 * ib;
        if (qw)
            importance_weights(xb, qw + 16 * ib, sigma2, 16, weight);
        else /* IQ2_S's own weights without a matrix */
            for (int i = 0; i < 16; i++) weight[i] = 0.25f * sigma2 + xb[i] * xb[i];
        for (int i = 0; i < 16; i++) waux[i] = sqrtf(weight[i]);
        uint8_t signs[2];
        for (int k = 0; k < 2; k++) signs[k] = split_signs(xb + 8 * k, xval + 8 * k);
        float max = xval[0];
        for (int i = 1; i < 16; i++) max = maxf(max, xval[i]);
        if (max < 1e-8f) { /* ggml's GROUP_MAX_EPS_IQ2_S */
            scales[ib] = 0;
            continue;
        }
        float scale = search(t, p, xval, weight, waux, max, L);
        if (scale < 0) {
            scale = -scale;
            for (int k = 0; k < 2; k++) signs[k] = (uint8_t)~signs[k];
        }
        for (int k = 0; k < 2; k++) {
            const int32_t g = index_of(t, L + 8 * k);
            const int i8 = 2 * ib + k;
            qs[i8] = (uint8_t)(g & 255);
            qh[i8 / 4] |= (uint8_t)((g >> 8) << 2 * (i8 % 4));
            qs[32 + i8] = signs[k];
        }
        scales[ib] = scale;
        max_scale = maxf(max_scale, scale);
    }
    if (!max_scale) return;
    const float d = max_scale / 31;
    fmoe__put_f16(b, d * 0.9875f);
    const float id = 1 / d;
    for (int ib = 0; ib < 16; ib += 2)
        sc[ib / 2] = (uint8_t)(scale_code(id, scales[ib]) | (scale_code(id, scales[ib + 1]) << 4));
}

/* IQ2_XXS (an importance matrix required, as ggml's): f16 d; per 32 values a uint32 of
 * four one-byte indices into the 256-point grid and a uint32 of four 7-bit sign sets with
 * the 4-bit scale on top. The scale search starts from make_qp_quants' fit on 4 levels and
 * tries 13 scales around it; every group is then snapped again at the kept scale. */
static void quantize_iq2_xxs(const fmoe__iq_search *t, const float *x, const float *qw,
                             uint8_t *b) {
    const iq_params *p = &IQ2_XXS_P;
    float scales[8], weight[32], waux[32], xval[32], max_scale = 0;
    uint32_t q2[16] = {0};
    int8_t L[32], Laux[32];
    memset(b, 0, FMOE_IQ2_XXS_BYTES);
    const float sigma2 = block_sigma2(x, 1);
    for (int ib = 0; ib < 8; ib++) {
        const float *xb = x + 32 * ib;
        importance_weights(xb, qw + 32 * ib, sigma2, 32, weight);
        for (int i = 0; i < 32; i++) waux[i] = sqrtf(weight[i]);
        uint8_t signs[4];
        for (int k = 0; k < 4; k++)
            signs[k] = split_signs_even(xb + 8 * k, weight + 8 * k, xval + 8 * k);
        float max = xval[0];
        for (int i = 1; i < 32; i++) max = maxf(max, xval[i]);
        if (max < FMOE_QUANT_GROUP_MAX_EPS) {
            scales[ib] = 0;
            continue;
        }
        float scale = make_qp_quants(32, p->kmax + 1, xval, (uint8_t *)L, weight);
        const float eff_max = scale * (float)p->kmax;
        if (eff_max <= 0) {
            scales[ib] = 0;
            continue;
        }
        float best = 0;
        for (int is = -p->nstep; is <= p->nstep; is++) {
            const float id = ((float)(2 * p->kmax - 1) + (float)is * p->step) / eff_max;
            const float this_scale = 1 / id;
            for (int k = 0; k < 4; k++)
                snap_group(t, p, xval + 8 * k, waux + 8 * k, id, this_scale, Laux + 8 * k);
            float sumqx, sumq2;
            sums(p, xval, weight, Laux, &sumqx, &sumq2);
            if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
                scale = sumqx / sumq2;
                best = scale * sumqx;
                memcpy(L, Laux, 32);
            }
        }
        if (scale > 0) {
            const float id = 1 / scale;
            for (int k = 0; k < 4; k++)
                snap_group(t, p, xval + 8 * k, waux + 8 * k, id, scale, L + 8 * k);
            float sumqx, sumq2;
            sums(p, xval, weight, L, &sumqx, &sumq2);
            if (sumq2 > 0) scale = sumqx / sumq2;
        }
        if (scale < 0) {
            scale = -scale;
            for (int k = 0; k < 4; k++) signs[k] = (uint8_t)(~signs[k] & 127);
        }
        for (int k = 0; k < 4; k++) {
            q2[2 * ib] |= (uint32_t)index_of(t, L + 8 * k) << (8 * k);
            q2[2 * ib + 1] |= (uint32_t)signs[k] << (7 * k);
        }
        scales[ib] = scale;
        max_scale = maxf(max_scale, scale);
    }
    if (!max_scale) return;
    const float d = max_scale / 31;
    fmoe__put_f16(b, d);
    const float id = 1 / d;
    for (int ib = 0; ib < 8; ib++) q2[2 * ib + 1] |= (uint32_t)scale_code(id, scales[ib]) << 28;
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 4; j++) b[2 + 4 * i + j] = (uint8_t)(q2[i] >> (8 * j));
}

/* IQ2_XS (an importance matrix required): f16 d; per 8 values a uint16 of a 9-bit index
 * into the 512-point grid and 7 signs; scales[8] (two 4-bit scales a byte, one per 16). */
static void quantize_iq2_xs(const fmoe__iq_search *t, const float *x, const float *qw,
                            uint8_t *b) {
    const iq_params *p = &IQ2_XS_P;
    float scales[16], weight[16], waux[16], xval[16], max_scale = 0;
    uint16_t q2[32] = {0};
    int8_t L[16];
    uint8_t *sc = b + 66;
    memset(b, 0, FMOE_IQ2_XS_BYTES);
    const float sigma2 = block_sigma2(x, 1);
    for (int ib = 0; ib < 16; ib++) {
        const float *xb = x + 16 * ib;
        importance_weights(xb, qw + 16 * ib, sigma2, 16, weight);
        for (int i = 0; i < 16; i++) waux[i] = sqrtf(weight[i]);
        uint8_t signs[2];
        for (int k = 0; k < 2; k++)
            signs[k] = split_signs_even(xb + 8 * k, weight + 8 * k, xval + 8 * k);
        float max = xval[0];
        for (int i = 1; i < 16; i++) max = maxf(max, xval[i]);
        if (max < FMOE_QUANT_GROUP_MAX_EPS) {
            scales[ib] = 0;
            continue;
        }
        float scale = search(t, p, xval, weight, waux, max, L);
        if (scale < 0) {
            scale = -scale;
            for (int k = 0; k < 2; k++) signs[k] = (uint8_t)(~signs[k] & 127);
        }
        for (int k = 0; k < 2; k++)
            q2[2 * ib + k] = (uint16_t)(index_of(t, L + 8 * k) | (signs[k] << 9));
        scales[ib] = scale;
        max_scale = maxf(max_scale, scale);
    }
    if (!max_scale) return;
    const float d = max_scale / 31;
    fmoe__put_f16(b, d);
    const float id = 1 / d;
    for (int ib = 0; ib < 16; ib += 2)
        sc[ib / 2] = (uint8_t)(scale_code(id, scales[ib]) | (scale_code(id, scales[ib + 1]) << 4));
    for (int i = 0; i < 32; i++) {
        b[2 + 2 * i] = (uint8_t)q2[i];
        b[3 + 2 * i] = (uint8_t)(q2[i] >> 8);
    }
}

/* IQ1_S (an importance matrix required): values on the levels -1, 0, 1, shifted by ±1/8
 * per 32 (ggml's IQ1S_DELTA), under a 3-bit scale. With three levels the weighted
 * least-squares split is found exactly: the values sorted, every pair of split points and
 * both shifts tried through prefix sums (ggml's quantize_row_iq1_s_impl). The sort is the
 * C library's qsort on (value, index) pairs with ggml's comparator, as ggml's: values that
 * compare equal keep the order qsort leaves them in, so blocks with ties equal llama.cpp's
 * where both use the same qsort (the fixture's were made with this glibc, 2.36). */
typedef struct sort_pair {
    float x;
    int32_t i;
} sort_pair;

static int by_value(const void *a, const void *b) {
    const float l = ((const sort_pair *)a)->x, r = ((const sort_pair *)b)->x;
    return l < r ? -1 : l > r ? 1 : 0;
}

/* Of the codebook points listed for a key, the nearest to xval at `scale`, the levels
 * valued xx[l] (IQ1's shifted levels); its levels into L (ggml's iq1_find_best_neighbour2). */
static int iq1_best_neighbour(const fmoe__iq_search *t, const uint16_t *neighbours,
                              const float *xval, const float *w, float scale, const float *xx,
                              int8_t *L) {
    const int count = neighbours[0];
    float best_d2 = FLT_MAX;
    int best = neighbours[1]; /* ggml searches the whole grid, then aborts, past FLT_MAX */
    for (int j = 1; j <= count; j++) {
        const uint8_t *lv = t->levels + (size_t)neighbours[j] * 8;
        float d2 = 0;
        for (int i = 0; i < 8; i++) {
            const float diff = scale * xx[lv[i]] - xval[i];
            d2 += w[i] * diff * diff;
        }
        if (d2 < best_d2) {
            best_d2 = d2;
            best = neighbours[j];
        }
    }
    const uint8_t *lv = t->levels + (size_t)best * 8;
    for (int i = 0; i < 8; i++) L[i] = (int8_t)lv[i];
    return best;
}

static void quantize_iq1_s(const fmoe__iq_search *t, const float *x, const float *qw,
                           uint8_t *b) {
    static const float x_p[3] = {-1 + 0.125f, 0.125f, 1 + 0.125f};
    static const float x_m[3] = {-1 - 0.125f, -0.125f, 1 - 0.125f};
    float scales[8], weight[32], sumx[33], sumw[33], max_scale = 0;
    int8_t L[32], shifts[8];
    sort_pair pairs[32];
    uint16_t qh[8] = {0};
    memset(b, 0, FMOE_IQ1_S_BYTES);
    const float sigma2 = block_sigma2(x, 2);
    for (int ib = 0; ib < 8; ib++) {
        const float *xb = x + 32 * ib;
        importance_weights(xb, qw + 32 * ib, sigma2, 32, weight);
        float max = fabsf(xb[0]);
        for (int i = 1; i < 32; i++) max = maxf(max, fabsf(xb[i]));
        if (max < 1e-12f) { /* ggml's GROUP_MAX_EPS_IQ1_S */
            scales[ib] = 0;
            shifts[ib] = 1;
            continue;
        }
        for (int j = 0; j < 32; j++) pairs[j] = (sort_pair){xb[j], j};
        qsort(pairs, 32, sizeof pairs[0], by_value);
        sumx[0] = sumw[0] = 0;
        for (int j = 0; j < 32; j++) {
            const int i = pairs[j].i;
            sumx[j + 1] = sumx[j] + weight[i] * xb[i];
            sumw[j + 1] = sumw[j] + weight[i];
        }
        float best_score = -FLT_MAX, scale = max;
        int besti1 = -1, besti2 = -1, best_shift = 0;
        for (int i1 = 0; i1 <= 32; i1++) {
            for (int i2 = i1; i2 <= 32; i2++) {
                for (int sh = 1; sh >= -1; sh -= 2) {
                    const float *v = sh == 1 ? x_p : x_m;
                    const float sumqx = (sumx[i1] - sumx[0]) * v[0] + (sumx[i2] - sumx[i1]) * v[1] +
                                        (sumx[32] - sumx[i2]) * v[2];
                    const float sumq2 = (sumw[i1] - sumw[0]) * v[0] * v[0] +
                                        (sumw[i2] - sumw[i1]) * v[1] * v[1] +
                                        (sumw[32] - sumw[i2]) * v[2] * v[2];
                    if (sumq2 > 0 && sumqx * sumqx > best_score * sumq2) {
                        scale = sumqx / sumq2;
                        best_score = scale * sumqx;
                        besti1 = i1;
                        besti2 = i2;
                        best_shift = sh;
                    }
                }
            }
        }
        if (besti1 < 0 || besti2 < 0 || best_shift == 0) {
            scales[ib] = 0;
            shifts[ib] = 1;
            continue;
        }
        for (int j = 0; j < 32; j++) L[pairs[j].i] = (int8_t)(j < besti1 ? 0 : j < besti2 ? 1 : 2);
        if (scale < 0) {
            for (int j = 0; j < 32; j++) L[j] = (int8_t)(2 - L[j]);
            scale = -scale;
            best_shift = -best_shift;
        }
        const float *xx = best_shift == 1 ? x_p : x_m;
        int all_on_grid = 1;
        int32_t index[4];
        for (int k = 0; k < 4; k++) {
            const int32_t g = t->map[key_of(t, L + 8 * k)];
            if (g >= 0) {
                index[k] = g;
            } else {
                all_on_grid = 0;
                index[k] = iq1_best_neighbour(t, t->neighbours - g - 1, xb + 8 * k, weight + 8 * k,
                                              scale, xx, L + 8 * k);
            }
        }
        if (!all_on_grid) {
            float sumqx = 0, sumq2 = 0;
            for (int k = 0; k < 4; k++) {
                const uint8_t *lv = t->levels + (size_t)index[k] * 8;
                for (int j = 0; j < 8; j++) {
                    const float w = weight[8 * k + j], q = xx[lv[j]];
                    sumqx += w * q * xb[8 * k + j];
                    sumq2 += w * q * q;
                }
            }
            if (sumqx > 0 && sumq2 > 0) scale = sumqx / sumq2;
        }
        for (int k = 0; k < 4; k++) {
            b[2 + 4 * ib + k] = (uint8_t)(index[k] & 255);
            qh[ib] |= (uint16_t)((index[k] >> 8) << 3 * k);
        }
        scales[ib] = scale;
        shifts[ib] = (int8_t)best_shift;
        max_scale = maxf(max_scale, scale);
    }
    if (!max_scale) return;
    const float d = max_scale / 15;
    fmoe__put_f16(b, d * 1.125f);
    const float id = 1 / d;
    for (int ib = 0; ib < 8; ib++) {
        int l = fmoe__clampi(fmoe__nearest_int(0.5f * (id * scales[ib] - 1)), 0, 7);
        if (shifts[ib] == -1) l |= 8;
        qh[ib] |= (uint16_t)(l << 12);
    }
    for (int ib = 0; ib < 8; ib++) {
        b[34 + 2 * ib] = (uint8_t)qh[ib];
        b[35 + 2 * ib] = (uint8_t)(qh[ib] >> 8);
    }
}

/* IQ1_M (an importance matrix required, as llama-quantize): IQ1_S's exact split per 16
 * values, each half of 8 with its own ±1/8 shift (four combinations scored at once from
 * prefix sums kept per half: ggml's quantize_row_iq1_m_impl), 3-bit scales; the block's d
 * is then refitted over all 256 values by least squares and its f16 bits spread over the
 * top nibbles of the four scale words. Layout: qs[32] index low bytes; qh[16] per 16
 * values two nibbles, each the index's 3 high bits and the shift's sign (bit 3); scales
 * as four little-endian uint16. */
static void quantize_iq1_m(const fmoe__iq_search *t, const float *x, const float *qw,
                           uint8_t *b) {
    static const float x_p[3] = {-1 + 0.125f, 0.125f, 1 + 0.125f};
    static const float x_m[3] = {-1 - 0.125f, -0.125f, 1 - 0.125f};
    static const uint8_t masks[4] = {0x00, 0x80, 0x08, 0x88};
    float scales[16], weight[16], max_scale = 0;
    int8_t L[16], shifts[16];
    sort_pair pairs[16];
    uint8_t *qs = b, *qh = b + 32;
    uint16_t sc[4] = {0};
    memset(b, 0, FMOE_IQ1_M_BYTES);
    const float sigma2 = block_sigma2(x, 2);
    for (int ib = 0; ib < 16; ib++) {
        const float *xb = x + 16 * ib;
        importance_weights(xb, qw + 16 * ib, sigma2, 16, weight);
        float max = fabsf(xb[0]);
        for (int i = 1; i < 16; i++) max = maxf(max, fabsf(xb[i]));
        if (max < 1e-7f) { /* ggml's GROUP_MAX_EPS_IQ1_M */
            scales[ib] = 0;
            shifts[ib] = 0;
            continue;
        }
        for (int j = 0; j < 16; j++) pairs[j] = (sort_pair){xb[j], j};
        qsort(pairs, 16, sizeof pairs[0], by_value);
        float best_score = -FLT_MAX, scale = max;
        int besti1 = -1, besti2 = -1, best_k = -1;
        /* k: the shifts of the two halves, 0 (+, +), 1 (+, -), 2 (-, +), 3 (-, -); since
         * the levels step by 1 under either shift, a split's Σwxq collapses to
         * T·v[2] - px[i1] - px[i2] per half (ggml's rewriting, kept for its rounding) */
        float px[2][17], pw[2][17];
        px[0][0] = px[1][0] = pw[0][0] = pw[1][0] = 0;
        for (int j = 0; j < 16; j++) {
            const int i = pairs[j].i, h = i < 8 ? 0 : 1;
            px[h][j + 1] = px[h][j] + weight[i] * xb[i];
            px[1 - h][j + 1] = px[1 - h][j];
            pw[h][j + 1] = pw[h][j] + weight[i];
            pw[1 - h][j + 1] = pw[1 - h][j];
        }
        const float txs[2] = {px[0][16], px[1][16]}, tws[2] = {pw[0][16], pw[1][16]};
        const float p2 = x_p[2], m2 = x_m[2];
        const float cp1 = x_p[0] * x_p[0] - x_p[1] * x_p[1];
        const float cp2 = x_p[1] * x_p[1] - x_p[2] * x_p[2];
        const float cm1 = x_m[0] * x_m[0] - x_m[1] * x_m[1];
        const float cm2 = x_m[1] * x_m[1] - x_m[2] * x_m[2];
        for (int i1 = 0; i1 <= 16; i1++) {
            for (int i2 = i1; i2 <= 16; i2++) {
                float qx_p[2], qx_m[2], q2_p[2], q2_m[2], sumqx[4], sumq2[4];
                for (int h = 0; h < 2; h++) {
                    const float sx = px[h][i1] + px[h][i2];
                    qx_p[h] = txs[h] * p2 - sx;
                    qx_m[h] = txs[h] * m2 - sx;
                    q2_p[h] = tws[h] * p2 * p2 + pw[h][i1] * cp1 + pw[h][i2] * cp2;
                    q2_m[h] = tws[h] * m2 * m2 + pw[h][i1] * cm1 + pw[h][i2] * cm2;
                }
                sumqx[0] = qx_p[0] + qx_p[1];
                sumqx[1] = qx_p[0] + qx_m[1];
                sumqx[2] = qx_m[0] + qx_p[1];
                sumqx[3] = qx_m[0] + qx_m[1];
                sumq2[0] = q2_p[0] + q2_p[1];
                sumq2[1] = q2_p[0] + q2_m[1];
                sumq2[2] = q2_m[0] + q2_p[1];
                sumq2[3] = q2_m[0] + q2_m[1];
                for (int k = 0; k < 4; k++) {
                    if (sumq2[k] > 0 && sumqx[k] * sumqx[k] > best_score * sumq2[k]) {
                        scale = sumqx[k] / sumq2[k];
                        best_score = scale * sumqx[k];
                        besti1 = i1;
                        besti2 = i2;
                        best_k = k;
                    }
                }
            }
        }
        if (besti1 < 0 || besti2 < 0 || best_k < 0) {
            scales[ib] = 0;
            shifts[ib] = 0;
            continue;
        }
        for (int j = 0; j < 16; j++) L[pairs[j].i] = (int8_t)(j < besti1 ? 0 : j < besti2 ? 1 : 2);
        if (scale < 0) {
            for (int j = 0; j < 16; j++) L[j] = (int8_t)(2 - L[j]);
            scale = -scale;
            best_k = 3 - best_k;
        }
        int all_on_grid = 1;
        int32_t index[2];
        for (int k = 0; k < 2; k++) {
            const float *xx = (k == 0 ? best_k < 2 : best_k % 2 == 0) ? x_p : x_m;
            const int32_t g = t->map[key_of(t, L + 8 * k)];
            if (g >= 0) {
                index[k] = g;
            } else {
                all_on_grid = 0;
                index[k] = iq1_best_neighbour(t, t->neighbours - g - 1, xb + 8 * k, weight + 8 * k,
                                              scale, xx, L + 8 * k);
            }
        }
        if (!all_on_grid) {
            float sumqx = 0, sumq2 = 0;
            for (int k = 0; k < 2; k++) {
                const float *xx = (k == 0 ? best_k < 2 : best_k % 2 == 0) ? x_p : x_m;
                const uint8_t *lv = t->levels + (size_t)index[k] * 8;
                for (int j = 0; j < 8; j++) {
                    const float w = weight[8 * k + j], q = xx[lv[j]];
                    sumqx += w * q * xb[8 * k + j];
                    sumq2 += w * q * q;
                }
            }
            if (sumqx > 0 && sumq2 > 0) scale = sumqx / sumq2;
        }
        qs[2 * ib] = (uint8_t)(index[0] & 255);
        qs[2 * ib + 1] = (uint8_t)(index[1] & 255);
        qh[ib] = (uint8_t)((index[0] >> 8) | ((index[1] >> 8) << 4));
        scales[ib] = scale;
        shifts[ib] = (int8_t)best_k;
        max_scale = maxf(max_scale, scale);
    }
    if (!max_scale) return;
    float d = max_scale / 15;
    const float id = 1 / d;
    float sumqx = 0, sumq2 = 0;
    for (int ib = 0; ib < 16; ib++) {
        const int l = fmoe__clampi(fmoe__nearest_int(0.5f * (id * scales[ib] - 1)), 0, 7);
        sc[ib / 4] |= (uint16_t)(l << 3 * (ib % 4));
        qh[ib] |= masks[shifts[ib]];
        const float *xb = x + 16 * ib;
        importance_weights(xb, qw + 16 * ib, sigma2, 16, weight);
        for (int k = 0; k < 2; k++) {
            const float *xx = (k == 0 ? shifts[ib] < 2 : shifts[ib] % 2 == 0) ? x_p : x_m;
            const int32_t g = qs[2 * ib + k] + ((qh[ib] << (8 - 4 * k)) & 0x700);
            const uint8_t *lv = t->levels + (size_t)g * 8;
            for (int j = 0; j < 8; j++) {
                const float w = weight[8 * k + j], q = xx[lv[j]] * (float)(2 * l + 1);
                sumqx += w * q * xb[8 * k + j];
                sumq2 += w * q * q;
            }
        }
    }
    if (sumq2 > 0) d = sumqx / sumq2;
    const uint16_t h = fmoe_float_to_half(d * 1.1125f);
    sc[0] |= (uint16_t)((h & 0x000f) << 12);
    sc[1] |= (uint16_t)((h & 0x00f0) << 8);
    sc[2] |= (uint16_t)((h & 0x0f00) << 4);
    sc[3] |= (uint16_t)(h & 0xf000);
    for (int i = 0; i < 4; i++) {
        b[48 + 2 * i] = (uint8_t)sc[i];
        b[49 + 2 * i] = (uint8_t)(sc[i] >> 8);
    }
}

int fmoe__quantize_iq_row(uint32_t type, const float *src, const float *importance,
                          uint8_t *dst, int64_t n) {
    const fmoe__iq_search *t = fmoe__iq_search_get(type);
    if (!t) return FMOE_ENOMEM;
    const int32_t size = fmoe_ggml_type_size(type);
    for (int64_t i = 0; i < n; i += FMOE_QK_K, dst += size) {
        const float *qw = importance ? importance + i : NULL;
        switch (type) {
        case FMOE_GGML_IQ3_XXS: quantize_iq3_xxs(t, src + i, qw, dst); break;
        case FMOE_GGML_IQ3_S: quantize_iq3_s(t, src + i, qw, dst); break;
        case FMOE_GGML_IQ2_XXS: quantize_iq2_xxs(t, src + i, qw, dst); break;
        case FMOE_GGML_IQ2_XS: quantize_iq2_xs(t, src + i, qw, dst); break;
        case FMOE_GGML_IQ1_S: quantize_iq1_s(t, src + i, qw, dst); break;
        case FMOE_GGML_IQ1_M: quantize_iq1_m(t, src + i, qw, dst); break;
        default: quantize_iq2_s(t, src + i, qw, dst); break;
        }
    }
    return 0;
}
