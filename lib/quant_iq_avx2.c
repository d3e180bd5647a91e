/*
 * quant_iq_avx2.c - the codebook i-quants' blocks (lib/quant_iq.c) unpacked with AVX2: the
 * same 256 signed byte codes as the plain-C unpack, 32 of them (four groups of 8) a
 * register, for lib/quant_kx.c's kernels at the AVX2 and AVX-512 levels. The scales and
 * d stay lib/quant_iq.c's fmoe__iq_scales.
 *
 * The approach is ggml's (ggml-cpu/arch/x86/quants.c, ggml_vec_dot_iq*_q8_K): grid points
 * fetched as 64-bit (IQ2, IQ1) or 32-bit (IQ3, by a gather) table loads into one register;
 * the 32 sign bits of those values spread one per byte (byte j of the register gets sign
 * byte j/8, then a compare against bit j%8) and applied as (g ^ m) - m, which is -g where
 * m is all ones. Here the result is stored as bytes instead of multiplied at once, so one
 * unpack serves the f32 and the 8-bit dots of both levels, and the plain C and this file
 * can be compared byte for byte (tests/lib/test_quant_iq_unpack.c).
 */
#include <stdint.h>
#include <string.h>

#include "fmoe/quant.h"
#include "iq_grids.h"
#include "quant_impl.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define SIMD __attribute__((target("avx2,fma,f16c")))

/* ggml's ksigns_iq2xs: 7 stored sign bits, the eighth making the count of minus signs
 * even (bit 7 the parity of bits 0-6); KSMASK spreads such a sign byte to a uint64 mask,
 * byte j 0xFF where value j is negative. The table of the 128 masks (1 KiB, ggml's
 * keven_signs_q2xs in mask form) is built by the preprocessor. */
#define KS(x)                                                                                      \
    ((x) | ((((x) ^ (x) >> 1 ^ (x) >> 2 ^ (x) >> 3 ^ (x) >> 4 ^ (x) >> 5 ^ (x) >> 6) & 1) << 7))
#define KB(s, j) ((uint64_t)(((s) >> (j)) & 1) * 0xFFull << (8 * (j)))
#define KSMASK(x)                                                                                  \
    (KB(KS(x), 0) | KB(KS(x), 1) | KB(KS(x), 2) | KB(KS(x), 3) | KB(KS(x), 4) | KB(KS(x), 5) |     \
     KB(KS(x), 6) | KB(KS(x), 7))
#define KS4(x) KSMASK(x), KSMASK((x) + 1), KSMASK((x) + 2), KSMASK((x) + 3)
#define KS16(x) KS4(x), KS4((x) + 4), KS4((x) + 8), KS4((x) + 12)
#define KS64(x) KS16(x), KS16((x) + 16), KS16((x) + 32), KS16((x) + 48)
static const uint64_t ksign_masks[128] = {KS64(0), KS64(64)};

static inline uint16_t le16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

/* (g ^ m) - m: g where m's byte is 0, -g where it is 0xFF. */
SIMD static inline __m256i negate_masked(__m256i g, __m256i m) {
    return _mm256_sub_epi8(_mm256_xor_si256(g, m), m);
}

/* The sign masks of four 7-bit sign sets s0..s3 (ksigns), one per 8 values. */
SIMD static inline __m256i ksign_mask4(unsigned s0, unsigned s1, unsigned s2, unsigned s3) {
    return _mm256_set_epi64x((long long)ksign_masks[s3 & 127], (long long)ksign_masks[s2 & 127],
                             (long long)ksign_masks[s1 & 127], (long long)ksign_masks[s0 & 127]);
}

/* The same for a uint32 of four 7-bit sets, the lowest first (IQ2_XXS, IQ3_XXS). */
SIMD static inline __m256i ksign_mask_aux(uint32_t aux) {
    return ksign_mask4(aux, aux >> 7, aux >> 14, aux >> 21);
}

/* g with value j negated where bit j of `signs` is set: byte j of `signs` broadcast
 * to bytes 8j..8j+7, tested against bit j%8, and (g ^ m) - m. */
SIMD static inline __m256i apply_signs(__m256i g, uint32_t signs) {
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32((int)signs),
        _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    return negate_masked(g, _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit));
}

/* Four 8-value grid points as 32 bytes, the first lowest. */
SIMD static inline __m256i points4(const uint64_t *grid, unsigned i0, unsigned i1, unsigned i2,
                                   unsigned i3) {
    return _mm256_set_epi64x((long long)grid[i3], (long long)grid[i2], (long long)grid[i1],
                             (long long)grid[i0]);
}

/* Eight 4-value IQ3 points whose indices are idx's 32-bit lanes, by one gather. */
SIMD static inline __m256i points8(const uint32_t *grid, __m256i idx) {
    return _mm256_i32gather_epi32((const int *)grid, idx, 4);
}

/* IQ1's codes 8g ± 1 from grid values g in {-1, 0, 1}: 8g by a 16-bit shift whose bits
 * crossing into the next byte are masked off (-1 = 0xFF gives 0xF8 = -8), then the
 * delta's ±1 per 8 values added (bytes, no carry between them). */
SIMD static inline __m256i iq1_codes(__m256i g, __m256i delta) {
    const __m256i g8 = _mm256_and_si256(_mm256_slli_epi16(g, 3), _mm256_set1_epi8((char)0xF8));
    return _mm256_add_epi8(g8, delta);
}

/* +1 in every byte of a group of 8, or -1 (every byte 0xFF) where `minus`. */
static inline long long delta8(int minus) { return minus ? -1LL : 0x0101010101010101LL; }

/* The 32 codes of values 32ib .. 32ib + 31, one function per type. */
SIMD static inline __m256i code32_iq2_xxs(const uint8_t *b, int ib) {
    const uint8_t *g = b + 2 + 8 * ib;
    const __m256i v = points4(fmoe__iq2xxs_grid, g[0], g[1], g[2], g[3]);
    return negate_masked(v, ksign_mask_aux(le32(g + 4)));
}

SIMD static inline __m256i code32_iq2_xs(const uint8_t *b, int ib) {
    uint16_t v[4];
    for (int l = 0; l < 4; l++)
        v[l] = le16(b + 2 + 8 * ib + 2 * l);
    const __m256i g = points4(fmoe__iq2xs_grid, v[0] & 511, v[1] & 511, v[2] & 511, v[3] & 511);
    return negate_masked(g, ksign_mask4(v[0] >> 9, v[1] >> 9, v[2] >> 9, v[3] >> 9));
}

SIMD static inline __m256i code32_iq2_s(const uint8_t *b, int ib) {
    /* index k: qs[k] and bits 2(k % 4) of qh[k / 4]; 32 values are one qh byte */
    const uint8_t *qs = b + 2, *signs = b + 34, *qh = b + 66;
    const unsigned h = qh[ib];
    const uint8_t *s = qs + 4 * ib;
    const __m256i g = points4(fmoe__iq2s_grid, s[0] | (h & 3) << 8, s[1] | (h & 12) << 6,
                              s[2] | (h & 48) << 4, s[3] | (h & 192) << 2);
    return apply_signs(g, le32(signs + 4 * ib));
}

SIMD static inline __m256i code32_iq3_xxs(const uint8_t *b, int ib) {
    const __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(b + 2 + 8 * ib)));
    return negate_masked(points8(fmoe__iq3xxs_grid, idx), ksign_mask_aux(le32(b + 66 + 4 * ib)));
}

SIMD static inline __m256i code32_iq3_s(const uint8_t *b, int ib) {
    /* index 8ib + j: qs[8ib + j] and bit j of qh[ib], moved to bit 8 by a per-lane shift */
    const uint8_t *qs = b + 2, *qh = b + 66, *signs = b + 74;
    const __m256i lane = _mm256_setr_epi32(8, 7, 6, 5, 4, 3, 2, 1), bit8 = _mm256_set1_epi32(256);
    const __m256i lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(qs + 8 * ib)));
    const __m256i hi = _mm256_and_si256(_mm256_sllv_epi32(_mm256_set1_epi32(qh[ib]), lane), bit8);
    return apply_signs(points8(fmoe__iq3s_grid, _mm256_or_si256(lo, hi)), le32(signs + 4 * ib));
}

SIMD static inline __m256i code32_iq1_s(const uint8_t *b, int ib) {
    const unsigned h = le16(b + 34 + 2 * ib);
    const uint8_t *s = b + 2 + 4 * ib;
    const __m256i g = points4(fmoe__iq1s_grid, s[0] | (h & 7) << 8, s[1] | (h & 0x38) << 5,
                              s[2] | (h & 0x1C0) << 2, s[3] | (h & 0xE00) >> 1);
    return iq1_codes(g, _mm256_set1_epi64x(delta8(h & 0x8000)));
}

SIMD static inline __m256i code32_iq1_m(const uint8_t *b, int ib) {
    /* group k: qs[k], and the nibble k % 2 of qh[k / 2]: index top 3 bits, delta sign */
    const uint8_t *s = b + 4 * ib, *qh = b + 32;
    const unsigned h0 = qh[2 * ib], h1 = qh[2 * ib + 1];
    const __m256i g = points4(fmoe__iq1s_grid, s[0] | (h0 & 7) << 8, s[1] | (h0 & 0x70) << 4,
                              s[2] | (h1 & 7) << 8, s[3] | (h1 & 0x70) << 4);
    const __m256i delta =
        _mm256_setr_epi64x(delta8(h0 & 8), delta8(h0 & 0x80), delta8(h1 & 8), delta8(h1 & 0x80));
    return iq1_codes(g, delta);
}

/* code32 of any i-quant: inlined into callers that pass `type` as a constant (the
 * dispatch switches below), so the switch folds away and each type gets its own loop. */
#define INLINE __attribute__((always_inline)) inline
SIMD static INLINE __m256i code32(uint32_t type, const uint8_t *b, int ib) {
    switch (type) {
    case FMOE_GGML_IQ2_XXS: return code32_iq2_xxs(b, ib);
    case FMOE_GGML_IQ2_XS: return code32_iq2_xs(b, ib);
    case FMOE_GGML_IQ2_S: return code32_iq2_s(b, ib);
    case FMOE_GGML_IQ3_XXS: return code32_iq3_xxs(b, ib);
    case FMOE_GGML_IQ3_S: return code32_iq3_s(b, ib);
    case FMOE_GGML_IQ1_S: return code32_iq1_s(b, ib);
    default: return code32_iq1_m(b, ib);
    }
}

/* Calls F(T, ...) with T the i-quant `type` as a constant. */
#define EACH_IQ(type, F, ...)                                                                      \
    switch (type) {                                                                                \
    case FMOE_GGML_IQ2_XXS: F(FMOE_GGML_IQ2_XXS, __VA_ARGS__); break;                              \
    case FMOE_GGML_IQ2_XS: F(FMOE_GGML_IQ2_XS, __VA_ARGS__); break;                                \
    case FMOE_GGML_IQ2_S: F(FMOE_GGML_IQ2_S, __VA_ARGS__); break;                                  \
    case FMOE_GGML_IQ3_XXS: F(FMOE_GGML_IQ3_XXS, __VA_ARGS__); break;                              \
    case FMOE_GGML_IQ3_S: F(FMOE_GGML_IQ3_S, __VA_ARGS__); break;                                  \
    case FMOE_GGML_IQ1_S: F(FMOE_GGML_IQ1_S, __VA_ARGS__); break;                                  \
    default: F(FMOE_GGML_IQ1_M, __VA_ARGS__); break;                                               \
    }

SIMD static INLINE void codes_t(uint32_t type, const uint8_t *b, int8_t *q) {
    for (int ib = 0; ib < 8; ib++)
        _mm256_storeu_si256((__m256i *)(q + 32 * ib), code32(type, b, ib));
}

/* The sixteen scales 2ls + 1 from eight 32-bit lanes holding the 4-bit ls of each 32
 * values (bits 0-3; both 16-value halves of a 32 take it): lane v as (v << 16) | v is
 * the int16 pair sc[2ib], sc[2ib + 1]. */
SIMD static inline void store_scales32(int16_t *sc, __m256i ls) {
    const __m256i v = _mm256_add_epi32(_mm256_slli_epi32(ls, 1), _mm256_set1_epi32(1));
    _mm256_storeu_si256((__m256i *)sc, _mm256_or_si256(v, _mm256_slli_epi32(v, 16)));
}

/* Sixteen 4-bit scales, two a byte low nibble first (IQ2_XS, IQ2_S), as 2ls + 1. */
SIMD static inline void store_scales_nibbles(int16_t *sc, const uint8_t *p) {
    const __m128i x = _mm_loadl_epi64((const __m128i *)p), lo4 = _mm_set1_epi8(0xF);
    const __m128i ls =
        _mm_unpacklo_epi8(_mm_and_si128(x, lo4), _mm_and_si128(_mm_srli_epi16(x, 4), lo4));
    const __m256i v = _mm256_cvtepu8_epi16(ls);
    _mm256_storeu_si256((__m256i *)sc,
                        _mm256_add_epi16(_mm256_slli_epi16(v, 1), _mm256_set1_epi16(1)));
}

/* fmoe__iq_scales's integers without its scalar loops: where each type keeps its scale
 * bits is lib/quant_iq.c's (there in plain C). */
SIMD static void scales_avx2(uint32_t type, const uint8_t *b, int16_t *sc) {
    const __m256i lo4 = _mm256_set1_epi32(0xF), lo3 = _mm256_set1_epi32(7);
    switch (type) {
    case FMOE_GGML_IQ2_XXS: /* the top nibbles of the sign words at 6 + 8ib */
        store_scales32(
            sc, _mm256_srli_epi32(
                    _mm256_i32gather_epi32((const int *)(b + 6),
                                           _mm256_setr_epi32(0, 8, 16, 24, 32, 40, 48, 56), 1),
                    28));
        return;
    case FMOE_GGML_IQ2_XS: store_scales_nibbles(sc, b + 66); return;
    case FMOE_GGML_IQ2_S: store_scales_nibbles(sc, b + 74); return;
    case FMOE_GGML_IQ3_XXS: /* the top nibbles of the eight sign words at 66 */
        store_scales32(sc, _mm256_srli_epi32(_mm256_loadu_si256((const __m256i *)(b + 66)), 28));
        return;
    case FMOE_GGML_IQ3_S: { /* nibble ib of the 4 bytes at 106 */
        uint32_t w;
        memcpy(&w, b + 106, 4);
        store_scales32(
            sc, _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)w),
                                                   _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                                 lo4));
        return;
    }
    case FMOE_GGML_IQ1_S: { /* bits 12-14 of the eight qh words at 34 */
        const __m256i qh = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(b + 34)));
        store_scales32(sc, _mm256_and_si256(_mm256_srli_epi32(qh, 12), lo3));
        return;
    }
    case FMOE_GGML_IQ1_M: { /* scale s: bits 3(s % 4) of word s / 4 at 48 */
        const __m256i w = _mm256_cvtepu16_epi32(_mm_loadl_epi64((const __m128i *)(b + 48)));
        const __m256i shift = _mm256_setr_epi32(0, 3, 6, 9, 0, 3, 6, 9);
        const __m256i s0 = _mm256_and_si256(
            _mm256_srlv_epi32(
                _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1)), shift),
            lo3);
        const __m256i s1 = _mm256_and_si256(
            _mm256_srlv_epi32(
                _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3)), shift),
            lo3);
        /* packs interleaves the 128-bit lanes (s0 lo, s1 lo, s0 hi, s1 hi): 0xD8 restores order */
        const __m256i v = _mm256_permute4x64_epi64(_mm256_packs_epi32(s0, s1), 0xD8);
        _mm256_storeu_si256((__m256i *)sc,
                            _mm256_add_epi16(_mm256_slli_epi16(v, 1), _mm256_set1_epi16(1)));
        return;
    }
    default: return;
    }
}

SIMD void fmoe__iq_unpack_avx2(uint32_t type, const uint8_t *b, fmoe__kx_block *u) {
    if (!fmoe__is_iq(type)) { /* not an i-quant: left to the plain unpack */
        fmoe__iq_unpack(type, b, u);
        return;
    }
    EACH_IQ(type, codes_t, b, u->q)
    scales_avx2(type, b, u->sc);
    memset(u->m, 0, sizeof u->m);
    u->d = fmoe__iq_block_d(type, b);
    u->dmin = 0;
}

#else

void fmoe__iq_unpack_avx2(uint32_t type, const uint8_t *b, fmoe__kx_block *u) {
    fmoe__iq_unpack(type, b, u);
}


#endif
