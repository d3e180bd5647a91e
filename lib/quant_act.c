/*
 * quant_act.c - activations quantised to 8 bits and their integer dots with ggml block
 * rows (fmoe/quant_act.h): the quantisers, the plain-C reference dots, and the run-time
 * choice of the AVX2 or AVX-512 path (lib/quant_act_avx2.c, lib/quant_act_avx512.c; the
 * input quantisers have no AVX-512 form: the AVX2 ones serve that level too).
 *
 * The reference computes each block's integer sum exactly (int32: the largest is
 * 8·32·63·127·2 for Q4_K, far from overflow) and adds the scaled block results in f32 in
 * block order, the way ggml's generic vec_dot_*_q8_K code does. The AVX2 and AVX-512
 * paths form the same integer sums, so they differ only in how the f32 block results
 * are added.
 */
#include "fmoe/quant_act.h"

#include <math.h>
#include <string.h>

#include "fmoe/error.h"
#include "half.h"
#include "fmoe/quant.h"
#include "quant_act_impl.h"
#include "quant_impl.h"

int fmoe_quant_act_supported(uint32_t t) {
    return t == FMOE_GGML_Q8_0 || t == FMOE_GGML_Q4_K || t == FMOE_GGML_Q5_K ||
           t == FMOE_GGML_Q6_K || fmoe__is_q32(t) || fmoe__is_kx(t) || fmoe__is_iq(t) ||
           t == FMOE_GGML_MXFP4;
}

/* The rows of 32-value blocks (Q8_0, Q4_0 .. IQ4_NL, MXFP4) take Q8_0 activations, the
 * K-quants Q8_K ones. */
static int act_q8_0(uint32_t t) {
    return t == FMOE_GGML_Q8_0 || fmoe__is_q32(t) || t == FMOE_GGML_MXFP4;
}

int64_t fmoe_quant_act_bytes(uint32_t t, int64_t n) {
    if (!fmoe_quant_act_supported(t) || fmoe_quant_row_bytes(t, n) < 0) return -1;
    if (act_q8_0(t)) return n / FMOE_QK8_0 * FMOE_Q8_0_BYTES;
    return n / FMOE_QK_K * FMOE_Q8_K_BYTES;
}

/* ggml's quantize_row_q8_K_ref: the value of largest magnitude maps to -127 or 127
 * (iscale = -127 / max keeps the sign), d = 1 / iscale in f32. */
void fmoe__quant_q8_k_ref(const float *x, uint8_t *b) {
    float amax = 0, max = 0;
    for (int j = 0; j < FMOE_QK_K; j++) {
        const float ax = fabsf(x[j]);
        if (ax > amax) {
            amax = ax;
            max = x[j];
        }
    }
    int8_t *q = (int8_t *)(b + FMOE__Q8K_Q);
    int16_t bsums[16];
    float d = 0;
    if (amax == 0) {
        memset(q, 0, FMOE_QK_K);
        memset(bsums, 0, sizeof bsums);
    } else {
        const float iscale = -127.f / max;
        for (int j = 0; j < FMOE_QK_K; j++) {
            const int v = fmoe__nearest_int(iscale * x[j]);
            q[j] = (int8_t)(v < 127 ? (v > -127 ? v : -127) : 127);
        }
        for (int j = 0; j < 16; j++) {
            int s = 0;
            for (int i = 0; i < 16; i++) s += q[16 * j + i];
            bsums[j] = (int16_t)s;
        }
        d = 1 / iscale;
    }
    memcpy(b, &d, 4);
    memcpy(b + FMOE__Q8K_BSUMS, bsums, sizeof bsums);
}

void fmoe_quant_act_quantize(uint32_t t, const float *x, void *qx, int64_t n) {
    FMOE_ASSERT(fmoe_quant_act_bytes(t, n) >= 0);
    if (act_q8_0(t)) { /* ggml's q8_0 reference, the same bytes either way */
        if (fmoe_quant_simd())
            fmoe__quant_q8_0_avx2(x, qx, n);
        else
            fmoe_quant_quantize_row(FMOE_GGML_Q8_0, x, qx, n);
        return;
    }
    if (fmoe_quant_simd()) {
        fmoe__quant_q8_k_avx2(x, qx, n);
        return;
    }
    uint8_t *b = qx;
    for (int64_t i = 0; i < n; i += FMOE_QK_K, b += FMOE_Q8_K_BYTES) fmoe__quant_q8_k_ref(x + i, b);
}

void fmoe_quant_act_dequantize(uint32_t t, const void *qx, float *x, int64_t n) {
    FMOE_ASSERT(fmoe_quant_act_bytes(t, n) >= 0);
    if (act_q8_0(t)) {
        fmoe_quant_dequantize_row(FMOE_GGML_Q8_0, qx, x, n);
        return;
    }
    const uint8_t *b = qx;
    for (int64_t i = 0; i < n; i += FMOE_QK_K, b += FMOE_Q8_K_BYTES) {
        float d;
        memcpy(&d, b, 4);
        const int8_t *q = (const int8_t *)(b + FMOE__Q8K_Q);
        for (int j = 0; j < FMOE_QK_K; j++) x[i + j] = d * (float)q[j];
    }
}

static inline float f16_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return fmoe_half_to_float(h);
}

/* ---------------------------------------------------------------------------------- */
/* The reference dots, one block at a time                                            */
/* ---------------------------------------------------------------------------------- */

static float dot_q8_0_ref(const uint8_t *w, const uint8_t *a, int64_t n) {
    float s = 0;
    for (int64_t i = 0; i < n; i += FMOE_QK8_0, w += FMOE_Q8_0_BYTES, a += FMOE_Q8_0_BYTES) {
        const int8_t *qw = (const int8_t *)(w + 2), *qa = (const int8_t *)(a + 2);
        int32_t sum = 0;
        for (int j = 0; j < FMOE_QK8_0; j++) sum += qw[j] * qa[j];
        s += f16_at(w) * f16_at(a) * (float)sum;
    }
    return s;
}

/* Q4_0, Q5_0, IQ4_NL against Q8_0 activations: Σ code·a exact per block (code with its
 * offset or level), scaled by dw·da as Q8_0's. Q4_1, Q5_1: d·Σ q·a + m·Σ a, also exact
 * integer sums, the block adding dw·da·first + m·da·second. ggml pairs these two with
 * Q8_1 activations, which carry da·Σa precomputed; summing the activation's bytes here
 * instead keeps one activation format for every 32-value type. */
static float dot_q32_ref(uint32_t t, const uint8_t *w, const uint8_t *a, int64_t n) {
    static const int8_t levels[16] = FMOE__IQ4NL_LEVELS;
    const int64_t wbytes = fmoe_ggml_type_size(t);
    const int affine = t == FMOE_GGML_Q4_1 || t == FMOE_GGML_Q5_1;
    const int off = t == FMOE_GGML_Q4_0 ? 8 : t == FMOE_GGML_Q5_0 ? 16 : 0;
    float s = 0;
    for (int64_t i = 0; i < n; i += FMOE_QK8_0, w += wbytes, a += FMOE_Q8_0_BYTES) {
        const int8_t *qa = (const int8_t *)(a + 2);
        int32_t sum = 0, asum = 0;
        for (int l = 0; l < FMOE_QK8_0; l++) {
            const int q = fmoe__q32_code(t, w, l);
            sum += (t == FMOE_GGML_IQ4_NL ? levels[q] : q - off) * qa[l];
            asum += qa[l];
        }
        const float da = f16_at(a);
        s += f16_at(w) * da * (float)sum;
        if (affine) s += f16_at(w + 2) * da * (float)asum;
    }
    return s;
}

/* MXFP4 against Q8_0 activations: Σ level·a exact per block (levels are the doubled E2M1
 * integers, |level| <= 12), scaled by the block's 2^(e-128) times da, as ggml's
 * ggml_vec_dot_mxfp4_q8_0 does (E8M0 half times f16 da, then times the sum). */
static float dot_mxfp4_ref(const uint8_t *w, const uint8_t *a, int64_t n) {
    static const int8_t levels[16] = FMOE__MXFP4_LEVELS;
    float s = 0;
    for (int64_t i = 0; i < n; i += FMOE_QK8_0, w += FMOE_MXFP4_BYTES, a += FMOE_Q8_0_BYTES) {
        const int8_t *qa = (const int8_t *)(a + 2);
        int32_t sum = 0;
        for (int l = 0; l < 16; l++)
            sum += levels[w[1 + l] & 0xF] * qa[l] + levels[w[1 + l] >> 4] * qa[l + 16];
        s += fmoe__e8m0_half(w[0]) * f16_at(a) * (float)sum;
    }
    return s;
}

/* Q4_K and Q5_K: Σ_j sc_j·Σ q·a and Σ_j m_j·(bsums of sub-block j), both exact integers;
 * the block adds d·da·first - dmin·da·second. bits: 4 or 5 (qh at w + 16). */
static float dot_q45_k_ref(const uint8_t *w, const uint8_t *a, int64_t n, int bits) {
    float s = 0;
    const int64_t wbytes = bits == 4 ? FMOE_Q4_K_BYTES : FMOE_Q5_K_BYTES;
    for (int64_t i = 0; i < n; i += FMOE_QK_K, w += wbytes, a += FMOE_Q8_K_BYTES) {
        float da;
        memcpy(&da, a, 4);
        const int8_t *qa = (const int8_t *)(a + FMOE__Q8K_Q);
        int16_t bsums[16];
        memcpy(bsums, a + FMOE__Q8K_BSUMS, sizeof bsums);
        const uint8_t *scales = w + 4, *qh = w + 16, *ql = w + (bits == 4 ? 16 : 48);
        int32_t sum = 0, msum = 0;
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            fmoe__scale_min_k4(j, scales, &sc, &m);
            const uint8_t *q = ql + 32 * (j / 2);
            const int shift = 4 * (j % 2);
            int32_t sub = 0;
            for (int l = 0; l < 32; l++) {
                int v = (q[l] >> shift) & 0xF;
                if (bits == 5) v += ((qh[l] >> j) & 1) << 4;
                sub += v * qa[32 * j + l];
            }
            sum += sc * sub;
            msum += m * (bsums[2 * j] + bsums[2 * j + 1]);
        }
        s += da * f16_at(w) * (float)sum - da * f16_at(w + 2) * (float)msum;
    }
    return s;
}

/* Q6_K: Σ sc·(q - 32)·a = Σ sc·(Σ q·a - 32·bsum) per 16 values, exact. */
static float dot_q6_k_ref(const uint8_t *w, const uint8_t *a, int64_t n) {
    float s = 0;
    for (int64_t i = 0; i < n; i += FMOE_QK_K, w += FMOE_Q6_K_BYTES, a += FMOE_Q8_K_BYTES) {
        float da;
        memcpy(&da, a, 4);
        const int8_t *qa = (const int8_t *)(a + FMOE__Q8K_Q);
        int16_t bsums[16];
        memcpy(bsums, a + FMOE__Q8K_BSUMS, sizeof bsums);
        const int8_t *sc = (const int8_t *)(w + 192);
        int32_t sum = 0;
        for (int half = 0; half < 2; half++) {
            const uint8_t *ql = w + 64 * half, *qh = w + 128 + 32 * half;
            for (int k = 0; k < 4; k++) {     /* 32 values: k-th quarter of the half */
                for (int g = 0; g < 2; g++) { /* 16 values, one scale */
                    const int idx = 8 * half + 2 * k + g;
                    int32_t sub = 0;
                    for (int l = 16 * g; l < 16 * g + 16; l++) {
                        const int lo = (k & 1) ? ql[l + 32] : ql[l];
                        const int v = ((k < 2 ? lo & 0xF : lo >> 4) | (((qh[l] >> (2 * k)) & 3) << 4));
                        sub += v * qa[128 * half + 32 * k + l];
                    }
                    sum += sc[idx] * (sub - 32 * bsums[idx]);
                }
            }
        }
        s += da * f16_at(w + 208) * (float)sum;
    }
    return s;
}

float fmoe_quant_act_dot_ref(uint32_t t, const void *row, const void *qx, int64_t n) {
    FMOE_ASSERT(fmoe_quant_act_bytes(t, n) >= 0);
    switch (t) {
    case FMOE_GGML_Q8_0: return dot_q8_0_ref(row, qx, n);
    case FMOE_GGML_Q4_K: return dot_q45_k_ref(row, qx, n, 4);
    case FMOE_GGML_Q5_K: return dot_q45_k_ref(row, qx, n, 5);
    case FMOE_GGML_Q6_K: return dot_q6_k_ref(row, qx, n);
    case FMOE_GGML_Q2_K:
    case FMOE_GGML_Q3_K:
    case FMOE_GGML_IQ4_XS:
    case FMOE_GGML_IQ2_XXS:
    case FMOE_GGML_IQ2_XS:
    case FMOE_GGML_IQ2_S:
    case FMOE_GGML_IQ3_XXS:
    case FMOE_GGML_IQ3_S:
    case FMOE_GGML_IQ1_S:
    case FMOE_GGML_IQ1_M: return fmoe__quant_act_dot_kx(t, row, qx, n, FMOE__QUANT_PLAIN);
    case FMOE_GGML_MXFP4: return dot_mxfp4_ref(row, qx, n);
    default: return dot_q32_ref(t, row, qx, n);
    }
}

/* The row kernels of Q2_K, Q3_K, IQ4_XS (lib/quant_kx_dot_avx2.c) and the i-quants
 * (lib/quant_iq_dot_avx2.c) at the AVX2 and AVX-512 levels: their VNNI build where
 * fmoe__quant_vnni(), else their AVX2 one, the same bits; the entries do not check. */
static fmoe__rowsx_fn *rows_kx_avx2(uint32_t t) {
    if (fmoe__quant_vnni())
        return fmoe__is_iq(t) ? fmoe__iq_rowsx_avx2_vnni : fmoe__kx_rowsx_avx2_vnni;
    return fmoe__is_iq(t) ? fmoe__iq_rowsx_avx2 : fmoe__kx_rowsx_avx2;
}

void fmoe_quant_act_matvec(uint32_t t, const void *W, int64_t row_bytes, int64_t rows,
                           const void *qx, int64_t qx_stride, int32_t nx, int64_t n, float *y,
                           int64_t ldy) {
    FMOE_ASSERT(fmoe_quant_act_supported(t) && n % (act_q8_0(t) ? FMOE_QK8_0 : FMOE_QK_K) == 0);
    if (fmoe__quant_level() >= FMOE__QUANT_AVX2 && (fmoe__is_kx(t) || fmoe__is_iq(t))) {
        /* Q2_K, Q3_K, IQ4_XS (lib/quant_kx_dot_avx2.c) and the i-quants
         * (lib/quant_iq_dot_avx2.c), the reference's bits at every level: the codes formed in
         * registers, once per block for up to four inputs (a prefill's product; lib/quant_kx.c's
         * shared unpack through a buffer, once per block for every input, was 1.3-2x slower) */
        rows_kx_avx2(t)(t, W, row_bytes, rows, qx, qx_stride, nx, n, y, ldy);
        return;
    }
    if (fmoe__is_kx(t) || fmoe__is_iq(t)) { /* Q2_K, Q3_K, IQ4_XS, the i-quants:
                                             * lib/quant_kx.c, every level the same bits */
        fmoe__quant_act_rows_kx(t, W, row_bytes, rows, qx, qx_stride, nx, n, y, ldy,
                                fmoe__quant_level());
        return;
    }
    switch (fmoe__quant_act_level()) {
    case FMOE__QUANT_AVX512:
        fmoe__quant_act_rows_avx512(t, W, row_bytes, rows, qx, qx_stride, nx, n, y, ldy);
        return;
    case FMOE__QUANT_AVX2:
        if (fmoe__quant_vnni())
            fmoe__quant_act_rows_avx2_vnni(t, W, row_bytes, rows, qx, qx_stride, nx, n, y, ldy);
        else
            fmoe__quant_act_rows_avx2(t, W, row_bytes, rows, qx, qx_stride, nx, n, y, ldy);
        return;
    }
    for (int64_t r = 0; r < rows; r++)
        for (int32_t k = 0; k < nx; k++)
            y[k * ldy + r] = fmoe_quant_act_dot_ref(t, (const uint8_t *)W + r * row_bytes,
                                                    (const uint8_t *)qx + k * qx_stride, n);
}

void fmoe_quant_act_dots(uint32_t t, const void *row, const void *qx, int64_t qx_stride,
                         int32_t nx, int64_t n, float *y, int64_t ystride) {
    fmoe_quant_act_matvec(t, row, 0, 1, qx, qx_stride, nx, n, y, ystride);
}

float fmoe_quant_act_dot(uint32_t t, const void *row, const void *qx, int64_t n) {
    float y;
    fmoe_quant_act_dots(t, row, qx, 0, 1, n, &y, 0);
    return y;
}
