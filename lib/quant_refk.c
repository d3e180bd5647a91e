/*
 * quant_refk.c - f32 values to one Q2_K or Q3_K block (256 values), for `fmoe quantize`
 * (lib/quant_ref.c's fmoe_quant_quantize_row calls it).
 *
 * The algorithms are ggml's reference quantisers without an importance matrix
 * (quantize_row_q2_K_ref with make_qkx2_quants weighing absolute errors, and
 * quantize_row_q3_K_ref with make_q3_quants), written out again. As for Q4_K .. Q6_K
 * (lib/quant_ref.c's head comment), gguf-py has no quantiser for them, so byte equality
 * with llama-quantize is intended but unverified; tests/python/test_gguf_quants.py checks
 * that gguf-py dequantises our blocks to within the type's error of the input. The last
 * pass picks every level against the sub-block scale the readers compute from the stored
 * f16 d (fmoe__kx_sub in lib/quant_block.h), as ggml's does.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "half.h"
#include "fmoe/quant.h"
#include "quant_impl.h"

/* Levels L[256] (0..3) into Q2_K/Q3_K's qs[64]: value 128h + 32j + l at bits 2j of
 * qs[32h + l]. */
static void pack2(const uint8_t *L, uint8_t *qs) {
    for (int j = 0; j < FMOE_QK_K; j += 128)
        for (int l = 0; l < 32; l++)
            qs[j / 4 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) |
                                      (L[j + l + 96] << 6));
}

/* Q2_K: sixteen sub-blocks of 16, each an affine 4-level grid; the scales and mins as
 * 4-bit multiples of the block's d = max scale / 15 and dmin = max min / 15. */
static void quantize_q2_k(const float *x, uint8_t *b) {
    uint8_t L[FMOE_QK_K], Laux[16];
    float weights[16], mins[16], scales[16], max_scale = 0, max_min = 0;
    for (int j = 0; j < 16; j++) {
        for (int l = 0; l < 16; l++) weights[l] = fabsf(x[16 * j + l]);
        scales[j] = fmoe__make_qkx2_quants(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux,
                                           -0.5f, 0.1f, 15, 1);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    memset(b, 0, FMOE_Q2_K_BYTES);
    if (max_scale > 0) {
        const float iscale = 15.f / max_scale;
        for (int j = 0; j < 16; j++)
            b[j] = (uint8_t)fmoe__clampi(fmoe__nearest_int(iscale * scales[j]), 0, 15);
        fmoe__put_f16(b + 80, max_scale / 15.f);
    }
    if (max_min > 0) {
        const float iscale = 15.f / max_min;
        for (int j = 0; j < 16; j++)
            b[j] |= (uint8_t)(fmoe__clampi(fmoe__nearest_int(iscale * mins[j]), 0, 15) << 4);
        fmoe__put_f16(b + 82, max_min / 15.f);
    }
    const float d = fmoe__qblock_f16(b + 80), dmin = fmoe__qblock_f16(b + 82);
    for (int j = 0; j < 16; j++) {
        const float dl = d * (float)(b[j] & 0xF);
        if (dl == 0) continue;
        const float ml = dmin * (float)(b[j] >> 4);
        for (int i = 0; i < 16; i++)
            L[16 * j + i] = (uint8_t)fmoe__clampi(fmoe__nearest_int((x[16 * j + i] + ml) / dl), 0, 3);
    }
    pack2(L, b + 16);
}

/* ggml's make_q3_quants with do_rmse: a symmetric grid of 2·nmax levels, scale -nmax/max,
 * then up to 5 passes moving single levels where that raises (Σ w·x·l)² / Σ w·l² (the
 * weighted least-squares fit's gain, w = x²). Levels + nmax into L; returns the scale. */
static float make_q3_quants(int n, int nmax, const float *x, int8_t *L) {
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
    const float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        const int l = fmoe__clampi(fmoe__nearest_int(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)l;
        const float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    for (int itry = 0; itry < 5; itry++) {
        int changed = 0;
        for (int i = 0; i < n; i++) {
            const float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * L[i];
            if (slx > 0) {
                float sl2 = suml2 - w * L[i] * L[i];
                const int nl = fmoe__clampi(fmoe__nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
                if (nl != L[i]) {
                    slx += w * x[i] * nl;
                    sl2 += w * nl * nl;
                    if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (int8_t)nl;
                        sumlx = slx;
                        suml2 = sl2;
                        changed++;
                    }
                }
            }
        }
        if (!changed) break;
    }
    for (int i = 0; i < n; i++) L[i] = (int8_t)(L[i] + nmax);
    return suml2 > 0 ? sumlx / suml2 : 0.f;
}

/* Q3_K: sixteen sub-blocks of 16, symmetric 3-bit levels -4..3, 6-bit signed scales
 * (biased by 32) times the block's d; the third bit of each level in hmask. */
static void quantize_q3_k(const float *x, uint8_t *b) {
    int8_t L[FMOE_QK_K];
    float scales[16], max_scale = 0, amax = 0;
    for (int j = 0; j < 16; j++) {
        scales[j] = make_q3_quants(16, 4, x + 16 * j, L + 16 * j);
        if (fabsf(scales[j]) > amax) {
            amax = fabsf(scales[j]);
            max_scale = scales[j];
        }
    }
    memset(b, 0, FMOE_Q3_K_BYTES);
    uint8_t *sc = b + 96;
    if (max_scale != 0) {
        const float iscale = -32.f / max_scale;
        for (int j = 0; j < 16; j++) {
            const int l = fmoe__clampi(fmoe__nearest_int(iscale * scales[j]), -32, 31) + 32;
            if (j < 8)
                sc[j] = (uint8_t)(l & 0xF);
            else
                sc[j - 8] |= (uint8_t)((l & 0xF) << 4);
            sc[8 + j % 4] |= (uint8_t)((l >> 4) << (2 * (j / 4)));
        }
        fmoe__put_f16(b + 108, 1 / iscale);
    }
    float d, dmin;
    fmoe__kx_d(FMOE_GGML_Q3_K, b, &d, &dmin);
    for (int j = 0; j < 16; j++) {
        int8_t q[16];
        int s, m;
        fmoe__kx_sub(FMOE_GGML_Q3_K, b, j, q, &s, &m); /* its scale, as the reader decodes it */
        const float dl = d * (float)s;
        if (dl == 0) continue;
        for (int i = 0; i < 16; i++)
            L[16 * j + i] = (int8_t)(fmoe__clampi(fmoe__nearest_int(x[16 * j + i] / dl), -4, 3) + 4);
    }
    /* the third bit into hmask (value 128h + 32j + l: bit 4h + j of hmask[l]), the low two
     * into qs */
    uint8_t low[FMOE_QK_K];
    for (int v = 0; v < FMOE_QK_K; v++) {
        const int h = v / 128, j = (v % 128) / 32, l = v % 32;
        if (L[v] > 3) b[l] |= (uint8_t)(1u << (4 * h + j));
        low[v] = (uint8_t)(L[v] & 3);
    }
    pack2(low, b + 32);
}

void fmoe__quantize_k23_block(uint32_t t, const float *x, uint8_t *b) {
    if (t == FMOE_GGML_Q2_K)
        quantize_q2_k(x, b);
    else
        quantize_q3_k(x, b);
}
