/*
 * quant_kx.c - dot products of Q2_K, Q3_K and IQ4_XS rows, and of the i-quants IQ2_XXS ..
 * IQ1_M unpacked into the same shape by lib/quant_iq.c (lib/quant_iq_avx2.c at the AVX2
 * and AVX-512 levels; one input at those levels takes lib/quant_iq_dot_avx2.c and
 * lib/quant_kx_dot_avx2.c's row kernels instead, lib/quant_act.c): with
 * f32 vectors (AVX2; the
 * plain-C reference is lib/quant.c's dequantise-then-dot) and with Q8_K activations
 * (fmoe/quant_act.h; plain C and AVX2, the same bits).
 *
 * The three share one shape (lib/quant_block.h): sixteen sub-blocks of 16 values, each an
 * integer scale times small signed integer codes, times the block's d, minus (Q2_K) dmin
 * times an integer min. So one kernel serves all three: a block is first unpacked to 256
 * signed byte codes and 16 integer scales and mins (plain C: fmoe__kx_sub, the very
 * decoding the dequantisation uses; AVX2: unpack_avx2, the same bytes by shifts, masks and
 * a shuffle), and the multiplications run over those bytes. Unpacking through a 256-byte
 * buffer costs a store and a reload per block that the other K-quants' kernels, which
 * unpack in registers, do not pay.
 *
 * The f32 dot sums d·sc·Σq·x - dmin·m·Σx per sub-block, another order than
 * dequantise-then-dot: results agree to rounding (tests/lib/test_quant.c's bound). The
 * 8-bit dot forms, per block, the exact integers Σ_s sc_s·Σ q·a and Σ_s m_s·bsum_s and adds
 * da·d·first - da·dmin·second in block order at both levels, so the AVX2 path gives the
 * reference's bits. At the AVX-512 level the f32 dot is lib/quant_avx512.c's (one
 * sub-block of 16 a register, on this file's unpack) and the 8-bit integer sums
 * lib/quant_act_avx512.c's (four sub-blocks a register), the same integers.
 */
#include <stdint.h>
#include <string.h>

#include "dot_avx2.h"
#include "fmoe/quant.h"
#include "fmoe/quant_act.h"
#include "quant_act_impl.h"
#include "quant_impl.h"

typedef fmoe__kx_block kx_block;

static void unpack(uint32_t type, const uint8_t *b, kx_block *u) {
    if (fmoe__is_iq(type)) { /* the i-quants: lib/quant_iq.c */
        fmoe__iq_unpack(type, b, u);
        return;
    }
    for (int s = 0; s < 16; s++) {
        int sc, m;
        fmoe__kx_sub(type, b, s, u->q + 16 * s, &sc, &m);
        u->sc[s] = (int16_t)sc;
        u->m[s] = (int16_t)m;
    }
    fmoe__kx_d(type, b, &u->d, &u->dmin);
}

/* Σ_s m_s·bsums_s: what Q2_K's mins take from the activation block. */
static int32_t min_sum(const kx_block *u, const uint8_t *a) {
    int16_t bsums[16];
    memcpy(bsums, a + FMOE__Q8K_BSUMS, sizeof bsums);
    int32_t s = 0;
    for (int j = 0; j < 16; j++) s += u->m[j] * bsums[j];
    return s;
}

static int32_t isum_ref(const kx_block *u, const int8_t *qa) {
    int32_t sum = 0;
    for (int s = 0; s < 16; s++) {
        int32_t sub = 0;
        for (int i = 0; i < 16; i++) sub += u->q[16 * s + i] * qa[16 * s + i];
        sum += u->sc[s] * sub;
    }
    return sum;
}

#if defined(__x86_64__)
#include <immintrin.h>

#define SIMD __attribute__((target("avx2,fma,f16c")))

/* unpack's block with AVX2 (the scales, 16 small integers, stay scalar): Q2_K and Q3_K
 * shift each 32-byte plane of 2-bit values right by 2j and mask (value 128h + 32j + l is
 * bits 2j of byte 32h + l), Q3_K adding 4·(its hmask bit) - 4; IQ4_XS looks its nibbles
 * up in the grid with a byte shuffle. The same bytes as fmoe__kx_sub's: test_quant_act's
 * exact integer sums and the dots at every level check them. */
SIMD void fmoe__kx_unpack_avx2(uint32_t type, const uint8_t *b, kx_block *u) {
    if (fmoe__is_iq(type)) { /* the codebook types: lib/quant_iq_avx2.c */
        fmoe__iq_unpack_avx2(type, b, u);
        return;
    }
    if (type == FMOE_GGML_IQ4_XS) {
        static const int8_t grid[16] = FMOE__IQ4NL_LEVELS;
        const __m128i g = _mm_loadu_si128((const __m128i *)grid), m4 = _mm_set1_epi8(0xF);
        for (int ib = 0; ib < 8; ib++) {
            const __m128i x = _mm_loadu_si128((const __m128i *)(b + 8 + 16 * ib));
            _mm_storeu_si128((__m128i *)(u->q + 32 * ib),
                             _mm_shuffle_epi8(g, _mm_and_si128(x, m4)));
            _mm_storeu_si128((__m128i *)(u->q + 32 * ib + 16),
                             _mm_shuffle_epi8(g, _mm_and_si128(_mm_srli_epi16(x, 4), m4)));
        }
    } else {
        const int q3 = type == FMOE_GGML_Q3_K;
        const __m256i m2 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
        const __m256i four = _mm256_set1_epi8(4);
        const __m256i hm = q3 ? _mm256_loadu_si256((const __m256i *)b) : _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const __m256i qs = _mm256_loadu_si256((const __m256i *)(b + (q3 ? 32 : 16) + 32 * h));
            for (int j = 0; j < 4; j++) {
                __m256i v = _mm256_and_si256(_mm256_srli_epi16(qs, 2 * j), m2);
                if (q3) {
                    const __m256i hb = _mm256_and_si256(_mm256_srli_epi16(hm, 4 * h + j), one);
                    v = _mm256_sub_epi8(_mm256_add_epi8(v, _mm256_slli_epi16(hb, 2)), four);
                }
                _mm256_storeu_si256((__m256i *)(u->q + 128 * h + 32 * j), v);
            }
        }
    }
    for (int s = 0; s < 16; s++) {
        int sc, m;
        fmoe__kx_scale(type, b, s, &sc, &m);
        u->sc[s] = (int16_t)sc;
        u->m[s] = (int16_t)m;
    }
    fmoe__kx_d(type, b, &u->d, &u->dmin);
}

/* The same integer as isum_ref: |q| in maddubs's unsigned operand, q's sign moved onto
 * the activation. No int16 saturates: |q| <= 127 (IQ4_XS's -127), |a| <= 127, so a
 * pair is at most 2·127·127. Each 128-bit half of a product is one sub-block of 16,
 * which madd multiplies by that sub-block's scale. */
SIMD static int32_t isum_avx2(const kx_block *u, const int8_t *qa) {
    __m256i acc = _mm256_setzero_si256();
    for (int p = 0; p < 8; p++) {
        const __m256i qw = _mm256_loadu_si256((const __m256i *)(u->q + 32 * p));
        const __m256i qx = _mm256_loadu_si256((const __m256i *)(qa + 32 * p));
        const __m256i prod =
            _mm256_maddubs_epi16(_mm256_sign_epi8(qw, qw), _mm256_sign_epi8(qx, qw));
        const __m256i sc =
            _mm256_set_m128i(_mm_set1_epi16(u->sc[2 * p + 1]), _mm_set1_epi16(u->sc[2 * p]));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(prod, sc));
    }
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

/* acc += 16 signed bytes widened times x[0..16). */
SIMD static inline __m256 fma16(const int8_t *q, const float *x, __m256 acc) {
    const __m128i b = _mm_loadu_si128((const __m128i *)q);
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), _mm256_loadu_ps(x), acc);
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8))),
                           _mm256_loadu_ps(x + 8), acc);
}

SIMD float fmoe__quant_dot_kx_avx2(uint32_t type, const void *row, const float *x, int64_t n) {
    const int64_t bytes = fmoe_ggml_type_size(type);
    const uint8_t *b = row;
    __m256 acc = _mm256_setzero_ps();
    kx_block u;
    for (int64_t i = 0; i < n; i += FMOE_QK_K, b += bytes) {
        fmoe__kx_unpack_avx2(type, b, &u);
        const float *xb = x + i;
        for (int s = 0; s < 16; s++, xb += 16) {
            const __m256 v = fma16(u.q + 16 * s, xb, _mm256_setzero_ps());
            acc = _mm256_fmadd_ps(_mm256_set1_ps(u.d * (float)u.sc[s]), v, acc);
            if (u.m[s])
                acc = _mm256_fnmadd_ps(_mm256_set1_ps(u.dmin * (float)u.m[s]),
                                       _mm256_add_ps(_mm256_loadu_ps(xb), _mm256_loadu_ps(xb + 8)),
                                       acc);
        }
    }
    return fmoe__hsum256(acc);
}

#define HAVE_AVX2_KX 1
#else
#define HAVE_AVX2_KX 0

float fmoe__quant_dot_kx_avx2(uint32_t type, const void *row, const float *x, int64_t n) {
    return fmoe_quant_dot_ref(type, row, x, n);
}

void fmoe__kx_unpack_avx2(uint32_t type, const uint8_t *b, kx_block *u) { unpack(type, b, u); }
#endif

/* One unpacked block against input k's Q8_K block `a`: da·d·Σ sc·q·a - da·dmin·Σ m·bsum. */
static float block_dot(uint32_t type, const kx_block *u, const uint8_t *a, int level) {
    float da;
    memcpy(&da, a, 4);
    const int8_t *qa = (const int8_t *)(a + FMOE__Q8K_Q);
#if HAVE_AVX2_KX
    const int32_t sum = level >= FMOE__QUANT_AVX512 ? fmoe__kx_isum_avx512(u, qa)
                        : level >= FMOE__QUANT_AVX2 ? isum_avx2(u, qa)
                                                    : isum_ref(u, qa);
#else
    (void)level;
    const int32_t sum = isum_ref(u, qa);
#endif
    const int32_t msum = type == FMOE_GGML_Q2_K ? min_sum(u, a) : 0;
    return da * u->d * (float)sum - da * u->dmin * (float)msum;
}

static void unpack_at(uint32_t type, const uint8_t *w, kx_block *u, int level) {
#if HAVE_AVX2_KX
    if (level >= FMOE__QUANT_AVX2) {
        fmoe__kx_unpack_avx2(type, w, u);
        return;
    }
#endif
    (void)level;
    unpack(type, w, u);
}

float fmoe__quant_act_dot_kx(uint32_t type, const void *row, const void *qx, int64_t n,
                             int level) {
    const int64_t bytes = fmoe_ggml_type_size(type);
    const uint8_t *w = row, *a = qx;
    kx_block u;
    float s = 0;
    for (int64_t i = 0; i < n; i += FMOE_QK_K, w += bytes, a += FMOE_Q8_K_BYTES) {
        unpack_at(type, w, &u, level);
        s += block_dot(type, &u, a, level);
    }
    return s;
}

/* Each block of a row is unpacked once for all nx inputs (the inputs of a prefill chunk
 * share it), each input's sum kept in y and added to in block order: the same float
 * operations in the same order as fmoe__quant_act_dot_kx's, so the same bits. */
void fmoe__quant_act_rows_kx(uint32_t type, const void *W, int64_t row_bytes, int64_t rows,
                             const void *qx, int64_t stride, int32_t nx, int64_t n, float *y,
                             int64_t ldy, int level) {
    const int64_t bytes = fmoe_ggml_type_size(type);
    kx_block u;
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *w = (const uint8_t *)W + r * row_bytes;
        for (int32_t k = 0; k < nx; k++) y[k * ldy + r] = 0;
        for (int64_t i = 0, b = 0; i < n; i += FMOE_QK_K, b++, w += bytes) {
            unpack_at(type, w, &u, level);
            for (int32_t k = 0; k < nx; k++)
                y[k * ldy + r] += block_dot(type, &u,
                                            (const uint8_t *)qx + k * stride + b * FMOE_Q8_K_BYTES,
                                            level);
        }
    }
}
