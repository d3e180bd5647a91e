/*
 * quant_avx2.c - dot products of ggml block rows with f32 vectors, AVX2 + FMA (+ F16C for
 * F16 rows). Compiled for every x86-64 build with target attributes; lib/quant.c calls it
 * only when the CPU has the instructions.
 *
 * The 32-value types (Q4_0 .. IQ4_NL) unpack a block's codes to signed bytes
 * (fmoe__q32_unpack) and take Q8_0's path, plus m·Σx for Q4_1 and Q5_1.
 * The K-quants factor their affine form out of the inner loop: a sub-block of 32 values
 * y = d·sc·q - dmin·m contributes d·sc·Σq·x - dmin·m·Σx, so the loop widens the small
 * integers to f32 and accumulates Σq·x (and Σx) in registers, and the scales are applied
 * once per sub-block. The summation order therefore differs from dequantise-then-dot:
 * results agree to rounding (tests/lib/test_quant.c states the bound), not bit for bit.
 * F32, F16 and BF16 rows take the CPU backend's own dots (lib/dot_avx2.h).
 */
#include <stdint.h>
#include <string.h>

#include "dot_avx2.h"
#include "half.h"
#include "fmoe/quant.h"
#include "quant_impl.h"
#include "quant_unpack_avx2.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define SIMD __attribute__((target("avx2,fma,f16c")))

/* acc += the 8 signed bytes in the low half of q, widened, times x[0..8). */
SIMD static inline __m256 fma8(__m128i q, const float *x, __m256 acc) {
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), _mm256_loadu_ps(x), acc);
}

/* acc += 16 signed bytes times x[0..16). */
SIMD static inline __m256 fma16(__m128i q, const float *x, __m256 acc) {
    acc = fma8(q, x, acc);
    return fma8(_mm_srli_si128(q, 8), x + 8, acc);
}

/* acc += 32 signed bytes times x[0..32). */
SIMD static inline __m256 fma32(__m256i q, const float *x, __m256 acc) {
    acc = fma16(_mm256_castsi256_si128(q), x, acc);
    return fma16(_mm256_extracti128_si256(q, 1), x + 16, acc);
}

SIMD static inline __m256 sum32(const float *x) {
    return _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(x), _mm256_loadu_ps(x + 8)),
                         _mm256_add_ps(_mm256_loadu_ps(x + 16), _mm256_loadu_ps(x + 24)));
}

static inline float f16_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return fmoe_half_to_float(h);
}

SIMD static float dot_q8_0(const uint8_t *b, const float *x, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += FMOE_QK8_0, b += FMOE_Q8_0_BYTES) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(b + 2));
        const __m256 s = fma32(q, x + i, _mm256_setzero_ps());
        acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(b)), s, acc);
    }
    return fmoe__hsum256(acc);
}

SIMD static float dot_q4_k(const uint8_t *b, const float *x, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += FMOE_QK_K, b += FMOE_Q4_K_BYTES) {
        const float d = f16_at(b), dmin = f16_at(b + 2);
        const uint8_t *scales = b + 4, *q = b + 16;
        const float *xb = x + i;
        for (int j = 0; j < 8; j += 2, q += 32, xb += 64) {
            uint8_t sc1, m1, sc2, m2;
            fmoe__scale_min_k4(j, scales, &sc1, &m1);
            fmoe__scale_min_k4(j + 1, scales, &sc2, &m2);
            __m256i q1, q2;
            fmoe__q45_k_unpack(_mm256_loadu_si256((const __m256i *)q), _mm256_setzero_si256(), j,
                               4, &q1, &q2);
            const __m256 s1 = fma32(q1, xb, _mm256_setzero_ps());
            const __m256 s2 = fma32(q2, xb + 32, _mm256_setzero_ps());
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d * sc1), s1, acc);
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d * sc2), s2, acc);
            acc = _mm256_fnmadd_ps(_mm256_set1_ps(dmin * m1), sum32(xb), acc);
            acc = _mm256_fnmadd_ps(_mm256_set1_ps(dmin * m2), sum32(xb + 32), acc);
        }
    }
    return fmoe__hsum256(acc);
}

SIMD static float dot_q5_k(const uint8_t *b, const float *x, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += FMOE_QK_K, b += FMOE_Q5_K_BYTES) {
        const float d = f16_at(b), dmin = f16_at(b + 2);
        const uint8_t *scales = b + 4, *ql = b + 48;
        const __m256i hb = _mm256_loadu_si256((const __m256i *)(b + 16));
        const float *xb = x + i;
        for (int j = 0; j < 8; j += 2, ql += 32, xb += 64) {
            uint8_t sc1, m1, sc2, m2;
            fmoe__scale_min_k4(j, scales, &sc1, &m1);
            fmoe__scale_min_k4(j + 1, scales, &sc2, &m2);
            __m256i q1, q2;
            fmoe__q45_k_unpack(_mm256_loadu_si256((const __m256i *)ql), hb, j, 5, &q1, &q2);
            const __m256 s1 = fma32(q1, xb, _mm256_setzero_ps());
            const __m256 s2 = fma32(q2, xb + 32, _mm256_setzero_ps());
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d * sc1), s1, acc);
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d * sc2), s2, acc);
            acc = _mm256_fnmadd_ps(_mm256_set1_ps(dmin * m1), sum32(xb), acc);
            acc = _mm256_fnmadd_ps(_mm256_set1_ps(dmin * m2), sum32(xb + 32), acc);
        }
    }
    return fmoe__hsum256(acc);
}

SIMD static float dot_q6_k(const uint8_t *b, const float *x, int64_t n) {
    const __m256i off = _mm256_set1_epi8(32);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += FMOE_QK_K, b += FMOE_Q6_K_BYTES) {
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        const float d = f16_at(b + 208);
        const float *xb = x + i;
        for (int half = 0; half < 2; half++, ql += 64, qh += 32, sc += 8, xb += 128) {
            __m256i q[4];
            fmoe__q6_k_unpack_half(ql, qh, q);
            for (int k = 0; k < 4; k++) {
                const __m256i qs = _mm256_sub_epi8(q[k], off);
                const float *xk = xb + 32 * k;
                const __m256 s0 = fma16(_mm256_castsi256_si128(qs), xk, _mm256_setzero_ps());
                const __m256 s1 =
                    fma16(_mm256_extracti128_si256(qs, 1), xk + 16, _mm256_setzero_ps());
                acc = _mm256_fmadd_ps(_mm256_set1_ps(d * sc[2 * k]), s0, acc);
                acc = _mm256_fmadd_ps(_mm256_set1_ps(d * sc[2 * k + 1]), s1, acc);
            }
        }
    }
    return fmoe__hsum256(acc);
}

/* Q4_0, Q5_0, IQ4_NL, MXFP4 (signed codes: d·Σq·x a block; MXFP4's d its E8M0 half) and
 * Q4_1, Q5_1 (d·Σq·x + m·Σx). */
SIMD static float dot_q32(uint32_t type, const uint8_t *b, const float *x, int64_t n) {
    const int64_t bytes = fmoe_ggml_type_size(type);
    const int affine = type == FMOE_GGML_Q4_1 || type == FMOE_GGML_Q5_1;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += FMOE_QK8_0, b += bytes) {
        const __m256 s = fma32(fmoe__q32_unpack(type, b), x + i, _mm256_setzero_ps());
        const float d = type == FMOE_GGML_MXFP4 ? fmoe__e8m0_half(b[0]) : f16_at(b);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), s, acc);
        if (affine) acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(b + 2)), sum32(x + i), acc);
    }
    return fmoe__hsum256(acc);
}

float fmoe__quant_dot_avx2(uint32_t type, const void *row, const float *x, int64_t n) {
    switch (type) {
    case FMOE_GGML_Q4_0:
    case FMOE_GGML_Q4_1:
    case FMOE_GGML_Q5_0:
    case FMOE_GGML_Q5_1:
    case FMOE_GGML_IQ4_NL: return dot_q32(type, row, x, n);
    case FMOE_GGML_MXFP4: return dot_q32(FMOE_GGML_MXFP4, row, x, n);
    case FMOE_GGML_F32: return fmoe__dot_f32_avx2(row, x, n);
    case FMOE_GGML_F16: return fmoe__dot_u16_avx2(row, 0, x, n);
    case FMOE_GGML_BF16: return fmoe__dot_u16_avx2(row, 1, x, n);
    case FMOE_GGML_Q8_0: return dot_q8_0(row, x, n);
    case FMOE_GGML_Q4_K: return dot_q4_k(row, x, n);
    case FMOE_GGML_Q5_K: return dot_q5_k(row, x, n);
    case FMOE_GGML_Q6_K: return dot_q6_k(row, x, n);
    case FMOE_GGML_Q2_K:
    case FMOE_GGML_Q3_K:
    case FMOE_GGML_IQ4_XS:
    case FMOE_GGML_IQ2_XXS:
    case FMOE_GGML_IQ2_XS:
    case FMOE_GGML_IQ2_S:
    case FMOE_GGML_IQ3_XXS:
    case FMOE_GGML_IQ3_S:
    case FMOE_GGML_IQ1_S:
    case FMOE_GGML_IQ1_M: return fmoe__quant_dot_kx_avx2(type, row, x, n); /* lib/quant_kx.c */
    default: return fmoe_quant_dot_ref(type, row, x, n);
    }
}

#else

float fmoe__quant_dot_avx2(uint32_t type, const void *row, const float *x, int64_t n) {
    return fmoe_quant_dot_ref(type, row, x, n);
}

#endif
