/*
 * quant_widen.c - block rows to f32 (quant_widen.h). The plain-C dequantisation costs
 * 1-4 ns a value, which with the 16-64 tokens an expert gets in prefill was a third of the
 * time next to the sgemm it feeds; these loops widen 8 values an instruction.
 *
 * Exactness: each value is computed as lib/quant_block.h computes it for lib/quant.c —
 * Q8_0 d·q; Q4_0, Q5_0, IQ4_NL d·code; Q4_1, Q5_1 d·q + m; Q4_K/Q5_K (d·sc)·q - dmin·m with d·sc and dmin·m from its own
 * fmoe__k4_sub_scale; Q6_K (d·sc)·(q - 32) with fmoe__q6_k_sub_scale — as separate
 * multiplies and subtracts (never _mm256_fmadd_ps), and F16C's f16 conversion is exact
 * like fmoe_half_to_float, so the results are the same bits.
 */
#include "quant_widen.h"

#include <string.h>

#include "fmoe/quant.h"
#include "quant_unpack_avx2.h"
#include "quant_block.h" /* the scale formulas, shared with lib/quant.c */

#if defined(__x86_64__)
#include <immintrin.h>

#define SIMD __attribute__((target("avx2,fma,f16c")))

SIMD static inline float f16_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* y[0..32) = d·q for 32 signed bytes (already offset where the format has one). */
SIMD static inline void put32(__m256i q, __m256 d, float *y) {
    const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    _mm256_storeu_ps(y, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo))));
    _mm256_storeu_ps(y + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)))));
    _mm256_storeu_ps(y + 16, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi))));
    _mm256_storeu_ps(y + 24, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)))));
}

/* y[0..32) = d·q - m for 32 unsigned bytes. */
SIMD static inline void put32_min(__m256i q, __m256 d, __m256 m, float *y) {
    const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    const __m128i part[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int k = 0; k < 4; k++)
        _mm256_storeu_ps(y + 8 * k, _mm256_sub_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(part[k]))), m));
}

SIMD static void widen_q8_0(const uint8_t *b, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i += FMOE_QK8_0, b += FMOE_Q8_0_BYTES)
        put32(_mm256_loadu_si256((const __m256i *)(b + 2)), _mm256_set1_ps(f16_at(b)), y + i);
}

SIMD static void widen_q45_k(const uint8_t *b, float *y, int64_t n, int bits) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), sixteen = _mm256_set1_epi8(16);
    const int64_t bytes = bits == 4 ? FMOE_Q4_K_BYTES : FMOE_Q5_K_BYTES;
    for (int64_t i = 0; i < n; i += FMOE_QK_K, b += bytes) {
        const float d = f16_at(b), dmin = f16_at(b + 2);
        const uint8_t *ql = b + (bits == 4 ? 16 : 48);
        const __m256i hb = bits == 5 ? _mm256_loadu_si256((const __m256i *)(b + 16)) : _mm256_setzero_si256();
        __m256i hmask = _mm256_set1_epi8(1);
        float *yb = y + i;
        for (int j = 0; j < 8; j += 2, ql += 32, yb += 64) {
            float d1, m1, d2, m2; /* lib/quant_block.h's d·sc and dmin·m, as the plain C */
            fmoe__k4_sub_scale(b, j, d, dmin, &d1, &m1);
            fmoe__k4_sub_scale(b, j + 1, d, dmin, &d2, &m2);
            const __m256i v = _mm256_loadu_si256((const __m256i *)ql);
            __m256i q0 = _mm256_and_si256(v, m4), q1 = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            if (bits == 5) {
                const __m256i h0 = _mm256_cmpeq_epi8(_mm256_and_si256(hb, hmask), hmask);
                hmask = _mm256_add_epi8(hmask, hmask);
                const __m256i h1 = _mm256_cmpeq_epi8(_mm256_and_si256(hb, hmask), hmask);
                hmask = _mm256_add_epi8(hmask, hmask);
                q0 = _mm256_or_si256(q0, _mm256_and_si256(h0, sixteen));
                q1 = _mm256_or_si256(q1, _mm256_and_si256(h1, sixteen));
            }
            put32_min(q0, _mm256_set1_ps(d1), _mm256_set1_ps(m1), yb);
            put32_min(q1, _mm256_set1_ps(d2), _mm256_set1_ps(m2), yb + 32);
        }
    }
}

SIMD static void widen_q6_k(const uint8_t *b, float *y, int64_t n) {
    const __m256i off = _mm256_set1_epi8(32);
    for (int64_t i = 0; i < n; i += FMOE_QK_K, b += FMOE_Q6_K_BYTES) {
        const float d = f16_at(b + 208);
        float *yb = y + i;
        for (int half = 0; half < 2; half++, yb += 128) {
            const uint8_t *ql = b + 64 * half, *qh = b + 128 + 32 * half;
            __m256i q[4];
            fmoe__q6_k_unpack_half(ql, qh, q);
            for (int k = 0; k < 4; k++) {
                /* values 32k..32k+31 of the half: sub-block scales 8·half + 2k (first 16)
                 * and 8·half + 2k + 1 (last 16) */
                const __m256i qs = _mm256_sub_epi8(q[k], off);
                const __m128i lo = _mm256_castsi256_si128(qs), hi = _mm256_extracti128_si256(qs, 1);
                const __m256 da = _mm256_set1_ps(fmoe__q6_k_sub_scale(b, 8 * half + 2 * k, d));
                const __m256 db = _mm256_set1_ps(fmoe__q6_k_sub_scale(b, 8 * half + 2 * k + 1, d));
                float *yk = yb + 32 * k;
                _mm256_storeu_ps(yk, _mm256_mul_ps(da, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo))));
                _mm256_storeu_ps(yk + 8, _mm256_mul_ps(da, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)))));
                _mm256_storeu_ps(yk + 16, _mm256_mul_ps(db, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi))));
                _mm256_storeu_ps(yk + 24, _mm256_mul_ps(db, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)))));
            }
        }
    }
}

/* Q4_0, Q5_0, IQ4_NL: d·code (the code signed: offset removed, or IQ4_NL's level), as
 * ggml's (float)code·d, one rounding either way; Q4_1, Q5_1: d·q + m, the product rounded
 * and then the sum, as the plain C (never an FMA). */
SIMD static void widen_q32(uint32_t type, const uint8_t *b, float *y, int64_t n) {
    const int64_t bytes = fmoe_ggml_type_size(type);
    const int affine = type == FMOE_GGML_Q4_1 || type == FMOE_GGML_Q5_1;
    for (int64_t i = 0; i < n; i += FMOE_QK8_0, b += bytes) {
        const __m256i q = fmoe__q32_unpack(type, b);
        const __m256 d = _mm256_set1_ps(f16_at(b));
        put32(q, d, y + i);
        if (affine) {
            const __m256 m = _mm256_set1_ps(f16_at(b + 2));
            for (int k = 0; k < 32; k += 8)
                _mm256_storeu_ps(y + i + k, _mm256_add_ps(_mm256_loadu_ps(y + i + k), m));
        }
    }
}

static int widen_simd(uint32_t type, const uint8_t *row, int64_t cols, float *dst) {
    switch (type) {
    case FMOE_GGML_Q4_0:
    case FMOE_GGML_Q4_1:
    case FMOE_GGML_Q5_0:
    case FMOE_GGML_Q5_1:
    case FMOE_GGML_IQ4_NL: widen_q32(type, row, dst, cols); return 1;
    case FMOE_GGML_Q8_0: widen_q8_0(row, dst, cols); return 1;
    case FMOE_GGML_Q4_K: widen_q45_k(row, dst, cols, 4); return 1;
    case FMOE_GGML_Q5_K: widen_q45_k(row, dst, cols, 5); return 1;
    case FMOE_GGML_Q6_K: widen_q6_k(row, dst, cols); return 1;
    default: return 0;
    }
}
#else
static int widen_simd(uint32_t type, const uint8_t *row, int64_t cols, float *dst) {
    (void)type, (void)row, (void)cols, (void)dst;
    return 0;
}
#endif

void fmoe__quant_widen_rows(uint32_t type, const void *rows, int64_t nrows, int64_t cols,
                            float *dst) {
    const int64_t rb = fmoe_quant_row_bytes(type, cols);
    const int simd = fmoe_quant_simd();
    for (int64_t r = 0; r < nrows; r++) {
        const uint8_t *row = (const uint8_t *)rows + r * rb;
        float *y = dst + r * cols;
        if (!simd || !widen_simd(type, row, cols, y)) fmoe_quant_dequantize_row(type, row, y, cols);
    }
}
