/*
 * quant_unpack_avx2.h - K-quant blocks (and the 32-value Q4_0 .. IQ4_NL blocks) unpacked
 * into bytes in 256-bit registers: the one
 * copy that the f32-input kernels of every level (lib/quant_avx2.c, lib/quant_avx512.c)
 * multiply from, and (Q6_K) the AVX2 8-bit dots (lib/quant_act_avx2.c) and the CPU
 * backend's widening to f32 (runtime/cpu/quant_widen.c). Internal; static inline with AVX2's target attribute (dot_avx2.h's
 * FMOE__AVX2), so that each level inlines it into its own kernels.
 */
#ifndef FMOE_QUANT_UNPACK_AVX2_H
#define FMOE_QUANT_UNPACK_AVX2_H

#include <stdint.h>

#include <string.h>

#include "dot_avx2.h"
#include "fmoe/quant.h"
#include "quant_block.h"

#if defined(__x86_64__)

/* Q4_K (bits 4) or Q5_K (bits 5) sub-blocks j and j + 1 from the 32 bytes v of their
 * quants: q1 the low nibbles (sub-block j), q2 the high ones (j + 1), values 0..15, and
 * for Q5_K each with its fifth bit from qh (hb): bit j (j + 1) of each qh byte, moved to
 * bit 4. The 16-bit shifts carry bits across bytes, which the byte mask with 1 then drops. */
FMOE__AVX2 static inline void fmoe__q45_k_unpack(__m256i v, __m256i hb, int j, int bits,
                                                 __m256i *q1, __m256i *q2) {
    const __m256i lo4 = _mm256_set1_epi8(0x0F);
    *q1 = _mm256_and_si256(v, lo4);
    *q2 = _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4);
    if (bits == 5) {
        const __m256i one = _mm256_set1_epi8(1);
        const __m256i h1 = _mm256_and_si256(_mm256_srl_epi16(hb, _mm_cvtsi32_si128(j)), one);
        const __m256i h2 = _mm256_and_si256(_mm256_srl_epi16(hb, _mm_cvtsi32_si128(j + 1)), one);
        *q1 = _mm256_or_si256(*q1, _mm256_slli_epi16(h1, 4));
        *q2 = _mm256_or_si256(*q2, _mm256_slli_epi16(h2, 4));
    }
}

/* Q6_K: one half of a block (128 values) from its 64 bytes of low nibbles ql and 32 bytes
 * of high pairs qh, as four registers of 32 values 0..63 in value order (the offset of 32
 * still on them). */
FMOE__AVX2 static inline void fmoe__q6_k_unpack_half(const uint8_t *ql, const uint8_t *qh,
                                                     __m256i q[4]) {
    const __m256i lo4 = _mm256_set1_epi8(0x0F), three = _mm256_set1_epi8(3);
    const __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
    const __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
    const __m256i h = _mm256_loadu_si256((const __m256i *)qh);
    q[0] = _mm256_or_si256(_mm256_and_si256(l0, lo4),
                           _mm256_slli_epi16(_mm256_and_si256(h, three), 4));
    q[1] = _mm256_or_si256(_mm256_and_si256(l1, lo4),
                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2), three), 4));
    q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), lo4),
                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 4), three), 4));
    q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), lo4),
                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 6), three), 4));
}

/* The 32 codes of a block of Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL or MXFP4 (quant_block.h's
 * layouts; MXFP4's qs after its scale byte, its doubled E2M1 levels -12..12 by the same
 * shuffle as IQ4_NL's) as
 * 32 signed bytes in value order: bytes 0-15 from the low nibbles of qs, 16-31 from the
 * high ones. Q4_0 and Q5_0 come with their offset removed (-8..7, -16..15), IQ4_NL as its
 * levels (-127..113, a byte shuffle through the table), Q4_1 and Q5_1 as they are (0..15,
 * 0..31: the min is the caller's). The 5-bit types' qh bit l goes to bit 4 of byte l: qh
 * broadcast, byte l given byte l/8 of it, then tested against bit l%8. */
/* The bytes of one 32-value block of the types fmoe__q32_unpack takes, as a constant where
 * the type is one: fmoe_ggml_type_size is a call the kernels' loops cannot fold. */
static inline int64_t fmoe__q32_block_bytes(uint32_t type) {
    switch (type) {
    case FMOE_GGML_Q4_1: return 20;  /* d, m, 16 bytes of nibbles */
    case FMOE_GGML_Q5_0: return 22;  /* d, 4 bytes of fifth bits, nibbles */
    case FMOE_GGML_Q5_1: return 24;  /* d, m, fifth bits, nibbles */
    case FMOE_GGML_MXFP4: return 17; /* e8m0 scale, nibbles */
    default: return 18;              /* Q4_0, IQ4_NL: d, nibbles */
    }
}

/* The 16 bytes at qs as 32 nibbles in value order: the low ones in bytes 0-15, the high
 * ones in 16-31. The bytes are loaded into both halves (vbroadcasti128, a load only) and
 * the halves shifted apart by a blend, not joined by an insert, which needs a shuffle
 * pipe. */
FMOE__AVX2 static inline __m256i fmoe__q32_nibbles(const uint8_t *qs) {
    const __m256i x = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
    return _mm256_and_si256(_mm256_blend_epi32(x, _mm256_srli_epi16(x, 4), 0xF0), _mm256_set1_epi8(0x0F));
}

/* 16 in each byte l whose bit l of m is set (Q5_0's and Q5_1's fifth bits, in the byte
 * order of fmoe__q32_nibbles): m broadcast, byte l given byte l/8 of it, then tested
 * against bit l%8. */
FMOE__AVX2 static inline __m256i fmoe__q32_fifth(uint32_t m) {
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32((int)m),
        _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(16));
}

/* Each byte's code (0..15, or 0..31 with the fifth bit) as the type's value: Q4_0's and
 * Q5_0's offset removed, IQ4_NL's and MXFP4's levels looked up, Q4_1's and Q5_1's as they
 * are. */
FMOE__AVX2 static inline __m256i fmoe__q32_levels_avx2(uint32_t type, __m256i q) {
    if (type == FMOE_GGML_Q4_0) return _mm256_sub_epi8(q, _mm256_set1_epi8(8));
    if (type == FMOE_GGML_Q5_0) return _mm256_sub_epi8(q, _mm256_set1_epi8(16));
    if (type == FMOE_GGML_IQ4_NL) {
        const __m128i levels = _mm_setr_epi8(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25,
                                             38, 53, 69, 89, 113); /* FMOE__IQ4NL_LEVELS */
        return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(levels), q);
    }
    if (type == FMOE_GGML_MXFP4) {
        const __m128i levels = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8,
                                             -12); /* FMOE__MXFP4_LEVELS */
        return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(levels), q);
    }
    return q;
}

FMOE__AVX2 static inline __m256i fmoe__q32_unpack(uint32_t type, const uint8_t *b) {
    __m256i q = fmoe__q32_nibbles(b + fmoe__q32_qs_at(type));
    if (type == FMOE_GGML_Q5_0 || type == FMOE_GGML_Q5_1) {
        uint32_t h;
        memcpy(&h, b + fmoe__q32_qh_at(type), 4);
        q = _mm256_or_si256(q, fmoe__q32_fifth(h));
    }
    return fmoe__q32_levels_avx2(type, q);
}

#endif /* __x86_64__ */

#endif
