/*
 * dot_avx2.h - internal: the AVX2 dot products of f32, bf16 and f16 rows with f32 vectors,
 * written once for the CPU backend (runtime/cpu/cpu_backend.c: attention scores, bf16
 * matrix products) and the block-format dots of lib/quant_avx2.c (their F32/F16/BF16
 * rows). Internal to fmoe: the names are fmoe__, the functions static inline with a
 * target attribute, so a caller compiles them without -mavx2 and calls them only after
 * checking the CPU (AVX2, FMA and F16C).
 *
 * The summation order is pinned: the CPU backend's logits are compared bit for bit with
 * earlier runs and across paths (tests/model, tests/python/test_forward.py), so changing
 * the number of accumulators here changes results everywhere.
 */
#ifndef FMOE_DOT_AVX2_H
#define FMOE_DOT_AVX2_H

#if defined(__x86_64__)

#include <immintrin.h>
#include <stdint.h>

#include "half.h"

#define FMOE__AVX2 __attribute__((target("avx2,fma,f16c")))

FMOE__AVX2 static inline float fmoe__hsum256(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_shuffle_ps(lo, lo, 1));
    return _mm_cvtss_f32(lo);
}

FMOE__AVX2 static inline __m256 fmoe__load_bf16(const uint16_t *p) {
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

FMOE__AVX2 static inline __m256 fmoe__load_f16(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

/* Σ a[i]·b[i]: two accumulators over 16 values a step, then the tail in order. */
FMOE__AVX2 static inline float fmoe__dot_f32_avx2(const float *a, const float *b, int64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    float s = fmoe__hsum256(_mm256_add_ps(s0, s1));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* Σ w[i]·x[i] with w bf16 (bf != 0) or f16, widened in registers; four accumulators over
 * 32 values a step hide the FMA latency, then 8 at a time into the first, then the tail. */
FMOE__AVX2 static inline float fmoe__dot_u16_avx2(const uint16_t *w, int bf, const float *x,
                                                  int64_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    int64_t i = 0;
    if (bf) {
        for (; i + 32 <= n; i += 32) {
            a0 = _mm256_fmadd_ps(fmoe__load_bf16(w + i), _mm256_loadu_ps(x + i), a0);
            a1 = _mm256_fmadd_ps(fmoe__load_bf16(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);
            a2 = _mm256_fmadd_ps(fmoe__load_bf16(w + i + 16), _mm256_loadu_ps(x + i + 16), a2);
            a3 = _mm256_fmadd_ps(fmoe__load_bf16(w + i + 24), _mm256_loadu_ps(x + i + 24), a3);
        }
        for (; i + 8 <= n; i += 8)
            a0 = _mm256_fmadd_ps(fmoe__load_bf16(w + i), _mm256_loadu_ps(x + i), a0);
    } else {
        for (; i + 32 <= n; i += 32) {
            a0 = _mm256_fmadd_ps(fmoe__load_f16(w + i), _mm256_loadu_ps(x + i), a0);
            a1 = _mm256_fmadd_ps(fmoe__load_f16(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);
            a2 = _mm256_fmadd_ps(fmoe__load_f16(w + i + 16), _mm256_loadu_ps(x + i + 16), a2);
            a3 = _mm256_fmadd_ps(fmoe__load_f16(w + i + 24), _mm256_loadu_ps(x + i + 24), a3);
        }
        for (; i + 8 <= n; i += 8)
            a0 = _mm256_fmadd_ps(fmoe__load_f16(w + i), _mm256_loadu_ps(x + i), a0);
    }
    float s = fmoe__hsum256(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < n; i++) s += (bf ? fmoe_bf16_to_float(w[i]) : fmoe_half_to_float(w[i])) * x[i];
    return s;
}

#endif /* __x86_64__ */

#endif
