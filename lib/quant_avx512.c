/*
 * quant_avx512.c - dot products of Q8_0, the 32-value types (Q4_0 .. IQ4_NL) and K-quant
 * block rows (Q2_K .. Q6_K, IQ4_XS) with f32 vectors, AVX-512
 * (F, BW, VL, on top of AVX2, FMA and F16C). lib/quant_avx2.c's kernels with 16 f32 lanes
 * instead of 8: the same factoring of the K-quants' affine form (d·sc·Σq·x - dmin·m·Σx per
 * sub-block), each 16 quants widened with one _mm512_cvtepi8_epi32. Compiled for every
 * x86-64 build with target attributes; lib/quant.c calls it only at the AVX-512 level.
 *
 * WRITTEN WITHOUT AN AVX-512 MACHINE, like lib/quant_act_avx512.c (whose head comment
 * says how it was checked and where it runs: tests/lib/test_quant.c at every level, its
 * SIMDe-emulated variant quant_avx512_emulated, stage cpu_avx512 of
 * tests/gpu/device-check.sh).
 *
 * F32, F16 and BF16 rows keep the AVX2 dots of lib/dot_avx2.h at this level: their
 * summation order is pinned (the CPU backend's bf16 results are compared bit for bit
 * across runs), so they give the same bits on every CPU with AVX2. The block types' sums
 * differ from the AVX2 path's in order only: results agree within rounding.
 */
#include <stdint.h>
#include <string.h>

#include "dot_avx2.h"
#include "half.h"
#include "fmoe/quant.h"
#include "quant_impl.h"
#include "quant_unpack_avx2.h"

#if defined(__x86_64__)
#include "simd512.h"

#define SIMD FMOE__AVX512

/* acc += the 16 signed bytes q, widened, times x[0..16). */
SIMD static inline __m512 fma16(__m128i q, const float *x, __m512 acc) {
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), _mm512_loadu_ps(x), acc);
}

/* Σ over 32 signed bytes times x[0..32), in 16 lanes. */
SIMD static inline __m512 dot32(__m256i q, const float *x) {
    const __m512 s = fma16(_mm256_castsi256_si128(q), x, _mm512_setzero_ps());
    return fma16(_mm256_extracti128_si256(q, 1), x + 16, s);
}

SIMD static inline __m512 sum32(const float *x) {
    return _mm512_add_ps(_mm512_loadu_ps(x), _mm512_loadu_ps(x + 16));
}

static inline float f16_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return fmoe_half_to_float(h);
}

SIMD static float dot_q8_0(const uint8_t *b, const float *x, int64_t n) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += FMOE_QK8_0, b += FMOE_Q8_0_BYTES) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(b + 2));
        acc = _mm512_fmadd_ps(_mm512_set1_ps(f16_at(b)), dot32(q, x + i), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

/* Q4_K (bits 4) and Q5_K (bits 5, the fifth bit of value l of sub-block j in bit j of
 * qh[l]). */
SIMD static float dot_q45_k(const uint8_t *b, const float *x, int64_t n, int bits) {
    const int64_t bytes = bits == 4 ? FMOE_Q4_K_BYTES : FMOE_Q5_K_BYTES;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += FMOE_QK_K, b += bytes) {
        const float d = f16_at(b), dmin = f16_at(b + 2);
        const uint8_t *scales = b + 4, *q = b + (bits == 4 ? 16 : 48);
        const __m256i hb = bits == 5 ? _mm256_loadu_si256((const __m256i *)(b + 16)) : _mm256_setzero_si256();
        const float *xb = x + i;
        for (int j = 0; j < 8; j += 2, q += 32, xb += 64) {
            uint8_t sc1, m1, sc2, m2;
            fmoe__scale_min_k4(j, scales, &sc1, &m1);
            fmoe__scale_min_k4(j + 1, scales, &sc2, &m2);
            __m256i q1, q2;
            fmoe__q45_k_unpack(_mm256_loadu_si256((const __m256i *)q), hb, j, bits, &q1, &q2);
            acc = _mm512_fmadd_ps(_mm512_set1_ps(d * sc1), dot32(q1, xb), acc);
            acc = _mm512_fmadd_ps(_mm512_set1_ps(d * sc2), dot32(q2, xb + 32), acc);
            acc = _mm512_fnmadd_ps(_mm512_set1_ps(dmin * m1), sum32(xb), acc);
            acc = _mm512_fnmadd_ps(_mm512_set1_ps(dmin * m2), sum32(xb + 32), acc);
        }
    }
    return _mm512_reduce_add_ps(acc);
}

SIMD static float dot_q6_k(const uint8_t *b, const float *x, int64_t n) {
    const __m256i off = _mm256_set1_epi8(32);
    __m512 acc = _mm512_setzero_ps();
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
                /* one scale per 16 values: one 16-lane product each */
                const __m512 s0 = fma16(_mm256_castsi256_si128(qs), xk, _mm512_setzero_ps());
                const __m512 s1 = fma16(_mm256_extracti128_si256(qs, 1), xk + 16, _mm512_setzero_ps());
                acc = _mm512_fmadd_ps(_mm512_set1_ps(d * sc[2 * k]), s0, acc);
                acc = _mm512_fmadd_ps(_mm512_set1_ps(d * sc[2 * k + 1]), s1, acc);
            }
        }
    }
    return _mm512_reduce_add_ps(acc);
}

/* Q4_0, Q5_0, IQ4_NL and Q4_1, Q5_1 (+ m·Σx): the AVX2 unpack, 16-lane products. */
SIMD static float dot_q32(uint32_t type, const uint8_t *b, const float *x, int64_t n) {
    const int64_t bytes = fmoe_ggml_type_size(type);
    const int affine = type == FMOE_GGML_Q4_1 || type == FMOE_GGML_Q5_1;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += FMOE_QK8_0, b += bytes) {
        acc = _mm512_fmadd_ps(_mm512_set1_ps(f16_at(b)), dot32(fmoe__q32_unpack(type, b), x + i), acc);
        if (affine) acc = _mm512_fmadd_ps(_mm512_set1_ps(f16_at(b + 2)), sum32(x + i), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

/* Q2_K, Q3_K, IQ4_XS: the block unpacked by lib/quant_kx.c (AVX2), then one sub-block of
 * 16 values a register: d·sc·Σq·x, minus (Q2_K) dmin·m·Σx in the same lanes. */
SIMD static float dot_kx(uint32_t type, const uint8_t *b, const float *x, int64_t n) {
    const int64_t bytes = fmoe_ggml_type_size(type);
    __m512 acc = _mm512_setzero_ps();
    fmoe__kx_block u;
    for (int64_t i = 0; i < n; i += FMOE_QK_K, b += bytes) {
        fmoe__kx_unpack_avx2(type, b, &u);
        const float *xb = x + i;
        for (int s = 0; s < 16; s++, xb += 16) {
            const __m128i q = _mm_loadu_si128((const __m128i *)(u.q + 16 * s));
            acc = _mm512_fmadd_ps(_mm512_set1_ps(u.d * (float)u.sc[s]),
                                  fma16(q, xb, _mm512_setzero_ps()), acc);
            if (u.m[s])
                acc = _mm512_fnmadd_ps(_mm512_set1_ps(u.dmin * (float)u.m[s]),
                                       _mm512_loadu_ps(xb), acc);
        }
    }
    return _mm512_reduce_add_ps(acc);
}

float fmoe__quant_dot_avx512(uint32_t type, const void *row, const float *x, int64_t n) {
    switch (type) {
    case FMOE_GGML_Q2_K:
    case FMOE_GGML_Q3_K:
    case FMOE_GGML_IQ4_XS:
    case FMOE_GGML_IQ2_XXS:
    case FMOE_GGML_IQ2_XS:
    case FMOE_GGML_IQ2_S:
    case FMOE_GGML_IQ3_XXS:
    case FMOE_GGML_IQ3_S:
    case FMOE_GGML_IQ1_S:
    case FMOE_GGML_IQ1_M: return dot_kx(type, row, x, n);
    case FMOE_GGML_Q4_0:
    case FMOE_GGML_Q4_1:
    case FMOE_GGML_Q5_0:
    case FMOE_GGML_Q5_1:
    case FMOE_GGML_IQ4_NL: return dot_q32(type, row, x, n);
    case FMOE_GGML_Q8_0: return dot_q8_0(row, x, n);
    case FMOE_GGML_Q4_K: return dot_q45_k(row, x, n, 4);
    case FMOE_GGML_Q5_K: return dot_q45_k(row, x, n, 5);
    case FMOE_GGML_Q6_K: return dot_q6_k(row, x, n);
    default: return fmoe__quant_dot_avx2(type, row, x, n); /* F32, F16, BF16: pinned order */
    }
}

#else

float fmoe__quant_dot_avx512(uint32_t type, const void *row, const float *x, int64_t n) {
    return fmoe_quant_dot_ref(type, row, x, n);
}

#endif
