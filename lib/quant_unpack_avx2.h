/*
 * quant_unpack_avx2.h - K-quant blocks unpacked into bytes in 256-bit registers: the one
 * copy that the f32-input kernels of every level (lib/quant_avx2.c, lib/quant_avx512.c)
 * multiply from, and (Q6_K) the AVX2 8-bit dots (lib/quant_act_avx2.c) and the CPU
 * backend's widening to f32 (runtime/cpu/quant_widen.c). Internal; static inline with AVX2's target attribute (dot_avx2.h's
 * FMOE__AVX2), so that each level inlines it into its own kernels.
 */
#ifndef FMOE_QUANT_UNPACK_AVX2_H
#define FMOE_QUANT_UNPACK_AVX2_H

#include <stdint.h>

#include "dot_avx2.h"

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

#endif /* __x86_64__ */

#endif
