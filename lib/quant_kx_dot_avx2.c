/*
 * quant_kx_dot_avx2.c - Q2_K, Q3_K and IQ4_XS rows times Q8_K inputs, AVX2: a decode
 * step's product (one input) and a prefill's (several: up to four a pass over each row,
 * IQ4_XS eight and Q3_K row panels of sixteen in the VNNI build, the codes formed once
 * for all of them), for the AVX2 and AVX-512 levels (lib/quant_kx.c
 * keeps the plain reference and the unpack-once path of the levels below).
 *
 * One loop per type over a row's blocks, the codes formed in registers and fed to maddubs
 * as ggml's x86 vec_dots do (ggml-cpu/arch/x86/quants.c, ggml_vec_dot_{q2_K,q3_K,iq4_xs}
 * _q8_K), never written to lib/quant_kx.c's 256-byte buffer. Each block's integers are
 * those of the reference (lib/quant_kx.c: Σ_s sc_s·Σ q·a and, Q2_K, Σ_s m_s·bsum_s),
 * grouped otherwise but exact:
 *   Q2_K    codes 0..3 unsigned straight into maddubs;
 *   Q3_K    code q' - 4 with q' = low 2 bits + 4·high bit in 0..7: Σ sc·Σ q'·a minus
 *           4·Σ sc·bsum (the input's sums of 16), so maddubs takes q' unsigned;
 *   IQ4_XS  grid values (-127..113) by a byte shuffle, |g| unsigned and g's sign moved
 *           onto the activation (a pair at most 2·127·127, no int16 saturates).
 * The block results are added as the reference adds them (lib/quant_rows1_avx2.h), so the
 * bits are the plain C's. Compiled a second time for CPUs with AVX512-VNNI, GFNI and BMI2
 * (lib/quant_kx_dot_avx2_vnni.c, FMOE__R1_VNNI): eight rows a step (one input), vpdpwssd,
 * and the 2-bit planes (and Q3_K's high bit) by GFNI affine transforms.
 */
#include <stdint.h>
#include <string.h>

#include "fmoe/error.h"
#include "fmoe/quant.h"
#include "fmoe/quant_act.h"
#include "quant_act_impl.h"
#include "quant_impl.h"
#include "quant_rows1_avx2.h"

#if defined(__x86_64__)
#define SIMD FMOE__R1
#define INLINE FMOE__R1_INLINE

/* Q2_K (84 bytes): scales[16] (low nibble the scale, high the min of each 16 values),
 * qs[64] at 16 (value 128h + 32j + l: bits 2j of byte 32h + l), f16 d at 80, dmin at 82. */
SIMD static INLINE __m256i isum_q2_k(const uint8_t *b, const uint8_t *a, __m256i *msum) {
    const int8_t *qa = (const int8_t *)(a + FMOE__Q8K_Q);
    const __m128i packed = _mm_loadu_si128((const __m128i *)b), m4 = _mm_set1_epi8(0xF);
    const __m256i scales = fmoe__r1_scales_even_odd(_mm_and_si128(packed, m4));
    const __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), m4));
    *msum = _mm256_madd_epi16(mins, fmoe__r1_load(a + FMOE__Q8K_BSUMS));
    const __m256i m3 = _mm256_set1_epi8(3);
    __m256i acc0 = _mm256_setzero_si256(), acc1 = _mm256_setzero_si256();
    _Pragma("GCC unroll 8")
    for (int h = 0; h < 2; h++, qa += 128) {
        const __m256i qs = fmoe__r1_load(b + 16 + 32 * h);
        const __m256i p0 = _mm256_maddubs_epi16(_mm256_and_si256(qs, m3), fmoe__r1_load(qa));
        const __m256i p1 = _mm256_maddubs_epi16(fmoe__r1_bits2(qs, 1), fmoe__r1_load(qa + 32));
        const __m256i p2 = _mm256_maddubs_epi16(fmoe__r1_bits2(qs, 2), fmoe__r1_load(qa + 64));
        const __m256i p3 = _mm256_maddubs_epi16(fmoe__r1_bits2(qs, 3), fmoe__r1_load(qa + 96));
        acc0 = fmoe__r1_madd_pick(acc0, p0, scales, 4 * h);
        acc1 = fmoe__r1_madd_pick(acc1, p1, scales, 4 * h + 1);
        acc0 = fmoe__r1_madd_pick(acc0, p2, scales, 4 * h + 2);
        acc1 = fmoe__r1_madd_pick(acc1, p3, scales, 4 * h + 3);
    }
    return _mm256_add_epi32(acc0, acc1);
}

SIMD static INLINE float d_q2_k(const uint8_t *b) { return fmoe__r1_f16(b + 80); }
SIMD static INLINE float dmin_q2_k(const uint8_t *b) { return fmoe__r1_f16(b + 82); }
SIMD static INLINE void d8_q2_k(const uint8_t *b, int64_t rb, __m256 *d, __m256 *dmin) {
    *d = fmoe__r1_f16x8(b + 80, rb, 0);
    *dmin = fmoe__r1_f16x8(b + 80, rb, 1);
}

/* Q3_K's sixteen 6-bit scales minus 32 as bytes, scale u (values 16u .. 16u + 15) in
 * byte u: the low nibbles from the 8 bytes at 96, the top two bits from the 4 at 104. */
SIMD static INLINE __m128i q3_k_scales8(const uint8_t *b) {
    const uint32_t a0 = fmoe__r1_le32(b + 96), a1 = fmoe__r1_le32(b + 100);
    const uint32_t tmp = fmoe__r1_le32(b + 104), lo4 = 0x0F0F0F0F, lo2 = 0x03030303;
    return _mm_sub_epi8(_mm_setr_epi32((int)((a0 & lo4) | ((tmp & lo2) << 4)),
                                       (int)((a1 & lo4) | (((tmp >> 2) & lo2) << 4)),
                                       (int)(((a0 >> 4) & lo4) | (((tmp >> 4) & lo2) << 4)),
                                       (int)(((a1 >> 4) & lo4) | (((tmp >> 6) & lo2) << 4))),
                        _mm_set1_epi8(32));
}

/* Q3_K (110 bytes): hmask[32] (value 128h + 32j + l: bit 4h + j of byte l), qs[64] at 32
 * (as Q2_K's), twelve bytes of 6-bit scales at 96 (biased by 32: lib/quant_block.h's
 * fmoe__kx_scale), f16 d at 108. The sixteen scales are unpacked four bytes at a time as
 * ggml's q3_K dot does. */
SIMD static INLINE __m256i isum_q3_k(const uint8_t *b, const uint8_t *a, __m256i *msum) {
    *msum = _mm256_setzero_si256();
    const int8_t *qa = (const int8_t *)(a + FMOE__Q8K_Q);
    const __m128i sc8 = q3_k_scales8(b);
    const __m256i scales = fmoe__r1_scales_even_odd(sc8);
    /* Σ_s sc_s·bsum_s, whose 4 times is the codes' -4 taken out of the maddubs */
    const __m256i sc_bsums =
        _mm256_madd_epi16(_mm256_cvtepi8_epi16(sc8), fmoe__r1_load(a + FMOE__Q8K_BSUMS));
    const __m256i hmask = fmoe__r1_load(b);
    __m256i acc0 = _mm256_setzero_si256(), acc1 = _mm256_setzero_si256();
    /* value 128h + 32j + l: bit 4h + j of hmask byte l, moved to bit 2 (value 4) */
#define Q3_PART(h, j, acc)                                                                         \
    do {                                                                                           \
        const __m256i hi_ = fmoe__r1_bit_to4(hmask, 4 * (h) + (j));                                \
        const __m256i q_ = _mm256_or_si256(fmoe__r1_bits2(qs, (j)), hi_);                          \
        acc = fmoe__r1_madd_pick(acc, _mm256_maddubs_epi16(q_, fmoe__r1_load(qa + 32 * (j))),      \
                                 scales, 4 * (h) + (j));                                           \
    } while (0)
    __m256i qs = fmoe__r1_load(b + 32);
    Q3_PART(0, 0, acc0);
    Q3_PART(0, 1, acc1);
    Q3_PART(0, 2, acc0);
    Q3_PART(0, 3, acc1);
    qs = fmoe__r1_load(b + 64);
    qa += 128;
    Q3_PART(1, 0, acc0);
    Q3_PART(1, 1, acc1);
    Q3_PART(1, 2, acc0);
    Q3_PART(1, 3, acc1);
#undef Q3_PART
    return _mm256_sub_epi32(_mm256_add_epi32(acc0, acc1), _mm256_slli_epi32(sc_bsums, 2));
}

SIMD static INLINE float d_q3_k(const uint8_t *b) { return fmoe__r1_f16(b + 108); }
/* (d is the block's last two bytes: the dword before them, its high half) */
SIMD static INLINE void d8_q3_k(const uint8_t *b, int64_t rb, __m256 *d, __m256 *dmin) {
    *d = fmoe__r1_f16x8(b + 106, rb, 1);
    *dmin = _mm256_setzero_ps();
}

/* IQ4_XS (136 bytes): f16 d, uint16 scales_h at 2 (bits 2ib, 2ib + 1: the scale's top two
 * bits), scales_l[4] at 4 (nibble ib: its low four), qs[128] at 8 (values 32ib + l and
 * 32ib + 16 + l: the low and high nibble of byte 16ib + l); scale ls - 32 per 32 values. */
#if defined(FMOE__R1_VNNI)
/* The grid values of 64 values (sub-blocks 2p, 2p + 1: the 32 code bytes at q): the
 * bytes spread over the four 128-bit lanes (the first 16 twice, then the next 16 twice),
 * the second lane of each pair shifted by 4, masked, one shuffle of the levels. */
SIMD static INLINE __m512i g64_iq4_xs(const uint8_t *q) {
    static const int8_t levels[16] = FMOE__IQ4NL_LEVELS;
    const __m512i x = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 1, 0, 1, 2, 3, 2, 3),
                                               _mm512_castsi256_si512(fmoe__r1_load(q)));
    return _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)levels)),
                               _mm512_and_si512(_mm512_srlv_epi64(x, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4)),
                                                _mm512_set1_epi8(0xF)));
}

/* IQ4_XS's eight scales ls - 32, scale j in dword j: nibble j of the uint32 at 4 and bits
 * 2j, 2j + 1 of the uint16 at 2 on top. */
SIMD static INLINE __m256i iq4_xs_scales(const uint8_t *b) {
    const __m256i j4 = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    const __m256i lo = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)fmoe__r1_le32(b + 4)), j4),
                                        _mm256_set1_epi32(0xF));
    const __m256i hi = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(fmoe__r1_le16(b + 2)),
                                                          _mm256_srli_epi32(j4, 1)),
                                        _mm256_set1_epi32(3));
    return _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)), _mm256_set1_epi32(32));
}

/* In 512-bit registers, 64 values (two sub-blocks) a step: one shuffle looks up 64 grid
 * values (g64_iq4_xs, 22 -> 19.2 ps a multiply-add); their signs as a mask negate the
 * activations; the scales ls - 32 formed once a block, one permute a
 * step. The same block integer (exact sums), so the same bits. */
SIMD static INLINE __m256i isum_iq4_xs(const uint8_t *b, const uint8_t *a, __m256i *msum) {
    *msum = _mm256_setzero_si256();
    const __m256i ls = iq4_xs_scales(b);
    const __m512i sc = _mm512_castsi256_si512(
        _mm256_or_si256(_mm256_and_si256(ls, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(ls, 16)));
    __m512i acc = _mm512_setzero_si512();
    const uint8_t *q = b + 8, *qa = a + FMOE__Q8K_Q;
    _Pragma("GCC unroll 4")
    for (int p = 0; p < 4; p++, q += 32, qa += 64) {
        const __m512i g = g64_iq4_xs(q);
        const __m512i av = _mm512_loadu_si512(qa);
        const __m512i as = _mm512_mask_sub_epi8(av, _mm512_movepi8_mask(g), _mm512_setzero_si512(), av);
        acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(_mm512_abs_epi8(g), as),
                                  fmoe__r1_scales64(sc, 2 * p, 2 * p, 2 * p + 1, 2 * p + 1));
    }
    __m256i v;
    fmoe__r1_fold64(&acc, 1, &v);
    return v;
}
#else
SIMD static INLINE __m256i isum_iq4_xs(const uint8_t *b, const uint8_t *a, __m256i *msum) {
    *msum = _mm256_setzero_si256();
    static const int8_t levels[16] = FMOE__IQ4NL_LEVELS;
    const int8_t *qa = (const int8_t *)(a + FMOE__Q8K_Q);
    /* the 16 bytes of 32 values in both 128-bit lanes, the high lane shifted right by 4:
     * masked, each lane's nibbles are its 16 values' grid indices */
    const __m256i grid = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)levels));
    const __m256i m4 = _mm256_set1_epi8(0xF), lane_shift = _mm256_setr_epi64x(0, 0, 4, 4);
    __m256i acc0 = _mm256_setzero_si256(), acc1 = _mm256_setzero_si256();
    unsigned sh = fmoe__r1_le16(b + 2);
    uint32_t sl = fmoe__r1_le32(b + 4);
    const uint8_t *q = b + 8;
    _Pragma("GCC unroll 8")
    for (int ib = 0; ib < 8; ib += 2, q += 32, qa += 64, sh >>= 4, sl >>= 8) {
        const __m256i x0 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)q));
        const __m256i x1 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(q + 16)));
        const __m256i g0 = _mm256_shuffle_epi8(grid, _mm256_and_si256(_mm256_srlv_epi64(x0, lane_shift), m4));
        const __m256i g1 = _mm256_shuffle_epi8(grid, _mm256_and_si256(_mm256_srlv_epi64(x1, lane_shift), m4));
        const __m256i a0 = fmoe__r1_load(qa), a1 = fmoe__r1_load(qa + 32);
        const __m256i p0 = _mm256_maddubs_epi16(_mm256_sign_epi8(g0, g0), _mm256_sign_epi8(a0, g0));
        const __m256i p1 = _mm256_maddubs_epi16(_mm256_sign_epi8(g1, g1), _mm256_sign_epi8(a1, g1));
        const int ls0 = (int)((sl & 0xF) | ((sh << 4) & 0x30)) - 32;
        const int ls1 = (int)(((sl >> 4) & 0xF) | ((sh << 2) & 0x30)) - 32;
        acc0 = fmoe__r1_madd_add(acc0, p0, _mm256_set1_epi16((short)ls0));
        acc1 = fmoe__r1_madd_add(acc1, p1, _mm256_set1_epi16((short)ls1));
    }
    return _mm256_add_epi32(acc0, acc1);
}
#endif

SIMD static INLINE float d_iq4_xs(const uint8_t *b) { return fmoe__r1_f16(b); }
SIMD static INLINE void d8_iq4_xs(const uint8_t *b, int64_t rb, __m256 *d, __m256 *dmin) {
    *d = fmoe__r1_f16x8(b, rb, 0);
    *dmin = _mm256_setzero_ps();
}

/* One group of 32 codes q with its scales sc against NX inputs (as bytes apart, the
 * group's 32 activation bytes at qa): acc[k] += Σ sc·q·a. Q2_K and Q3_K pass their odd
 * groups' accumulators and their even groups' alternately, two chains per input. */
SIMD static INLINE void group_madd(__m256i q, __m256i sc, const uint8_t *qa, int64_t as, int NX,
                                   __m256i *acc) {
    _Pragma("GCC unroll 4") for (int k = 0; k < NX; k++)
        acc[k] = fmoe__r1_madd_add(acc[k], _mm256_maddubs_epi16(q, fmoe__r1_load(qa + k * as)), sc);
}

/* The several-input forms (fmoe__kx_rowsx_avx2): the same integers for NX inputs at once,
 * the codes (and Q3_K's scales per 32 values) formed once per block for all of them. One
 * accumulator per input; NX is a constant where they inline. */
SIMD static INLINE void isumn_q2_k(const uint8_t *b, const uint8_t *a, int64_t as, int NX,
                                   __m256i *v, __m256i *m) {
    __m256i u[4]; /* odd groups' accumulators: two chains per input */
    _Pragma("GCC unroll 4") for (int k = 0; k < NX; k++) u[k] = _mm256_setzero_si256();
    const __m128i packed = _mm_loadu_si128((const __m128i *)b), m4 = _mm_set1_epi8(0xF);
    const __m256i scales = fmoe__r1_scales_even_odd(_mm_and_si128(packed, m4));
    const __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), m4));
    _Pragma("GCC unroll 4") for (int k = 0; k < NX; k++) {
        m[k] = _mm256_madd_epi16(mins, fmoe__r1_load(a + k * as + FMOE__Q8K_BSUMS));
        v[k] = _mm256_setzero_si256();
    }
    const __m256i m3 = _mm256_set1_epi8(3);
    _Pragma("GCC unroll 8")
    for (int h = 0; h < 2; h++) {
        const __m256i qs = fmoe__r1_load(b + 16 + 32 * h);
        _Pragma("GCC unroll 8")
        for (int j = 0; j < 4; j++) {
            const __m256i q = j ? fmoe__r1_bits2(qs, j) : _mm256_and_si256(qs, m3);
            const __m256i sc = _mm256_shuffle_epi8(scales, fmoe__r1_load(fmoe__r1_pick[4 * h + j]));
            group_madd(q, sc, a + FMOE__Q8K_Q + 128 * h + 32 * j, as, NX, j & 1 ? u : v);
        }
    }
    _Pragma("GCC unroll 4") for (int k = 0; k < NX; k++) v[k] = _mm256_add_epi32(v[k], u[k]);
}

SIMD static INLINE void isumn_q3_k(const uint8_t *b, const uint8_t *a, int64_t as, int NX,
                                   __m256i *v, __m256i *m) {
    __m256i u[4]; /* odd groups' accumulators: two chains per input */
    _Pragma("GCC unroll 4") for (int k = 0; k < NX; k++) u[k] = _mm256_setzero_si256();
    const __m128i sc8 = q3_k_scales8(b);
    const __m256i scales = fmoe__r1_scales_even_odd(sc8), sc16 = _mm256_cvtepi8_epi16(sc8);
    _Pragma("GCC unroll 4") for (int k = 0; k < NX; k++) {
        m[k] = _mm256_setzero_si256();
        /* minus 4·Σ_s sc_s·bsum_s, the codes' -4 taken out of the maddubs, up front */
        v[k] = _mm256_sub_epi32(_mm256_setzero_si256(),
                                _mm256_slli_epi32(_mm256_madd_epi16(
                                    sc16, fmoe__r1_load(a + k * as + FMOE__Q8K_BSUMS)), 2));
    }
    const __m256i hmask = fmoe__r1_load(b);
    _Pragma("GCC unroll 8")
    for (int h = 0; h < 2; h++) {
        const __m256i qs = fmoe__r1_load(b + 32 + 32 * h);
        _Pragma("GCC unroll 8")
        for (int j = 0; j < 4; j++) {
            const __m256i q = _mm256_or_si256(fmoe__r1_bits2(qs, j), fmoe__r1_bit_to4(hmask, 4 * h + j));
            const __m256i sc = _mm256_shuffle_epi8(scales, fmoe__r1_load(fmoe__r1_pick[4 * h + j]));
            group_madd(q, sc, a + FMOE__Q8K_Q + 128 * h + 32 * j, as, NX, j & 1 ? u : v);
        }
    }
    _Pragma("GCC unroll 4") for (int k = 0; k < NX; k++) v[k] = _mm256_add_epi32(v[k], u[k]);
}

SIMD static INLINE void isumn_iq4_xs(const uint8_t *b, const uint8_t *a, int64_t as, int NX,
                                     __m256i *v, __m256i *m) {
    __m256i u[FMOE__R1_XMAX]; /* odd groups' accumulators: two chains per input */
    _Pragma("GCC unroll 8") for (int k = 0; k < NX; k++) u[k] = _mm256_setzero_si256();
    static const int8_t levels[16] = FMOE__IQ4NL_LEVELS;
    const __m256i grid = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)levels));
    const __m256i m4 = _mm256_set1_epi8(0xF), lane_shift = _mm256_setr_epi64x(0, 0, 4, 4);
    _Pragma("GCC unroll 8") for (int k = 0; k < NX; k++) v[k] = m[k] = _mm256_setzero_si256();
    unsigned sh = fmoe__r1_le16(b + 2);
    uint32_t sl = fmoe__r1_le32(b + 4);
    const uint8_t *q = b + 8;
    _Pragma("GCC unroll 8")
    for (int ib = 0; ib < 8; ib++, q += 16, sh >>= 2, sl >>= 4) {
        const __m256i x = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)q));
        const __m256i g = _mm256_shuffle_epi8(grid, _mm256_and_si256(_mm256_srlv_epi64(x, lane_shift), m4));
        const __m256i ga = _mm256_sign_epi8(g, g);
        const __m256i sc = _mm256_set1_epi16((short)((int)((sl & 0xF) | ((sh << 4) & 0x30)) - 32));
        _Pragma("GCC unroll 8") for (int k = 0; k < NX; k++) {
            const __m256i qa = fmoe__r1_load(a + k * as + FMOE__Q8K_Q + 32 * ib);
            const __m256i p = _mm256_maddubs_epi16(ga, _mm256_sign_epi8(qa, g));
            if (ib & 1)
                u[k] = fmoe__r1_madd_add(u[k], p, sc);
            else
                v[k] = fmoe__r1_madd_add(v[k], p, sc);
        }
    }
    _Pragma("GCC unroll 8") for (int k = 0; k < NX; k++) v[k] = _mm256_add_epi32(v[k], u[k]);
}

static INLINE float no_dmin(const uint8_t *b) {
    (void)b;
    return 0;
}

#define ROWS(name, type, ISUM, D, DMIN, D8, EIGHT)                                                      \
    SIMD static void name(const uint8_t *W, int64_t row_bytes, int64_t rows, const uint8_t *qx,    \
                          int64_t n, float *y) {                                                   \
        const int64_t bytes = type##_BYTES;                                                        \
        FMOE__R1_ROWS(W, row_bytes, rows, qx, n / FMOE_QK_K, bytes, ISUM, D, DMIN, D8, y, EIGHT);  \
    }
ROWS(rows_q2_k, FMOE_Q2_K, isum_q2_k, d_q2_k, dmin_q2_k, d8_q2_k, 1)
ROWS(rows_q3_k, FMOE_Q3_K, isum_q3_k, d_q3_k, no_dmin, d8_q3_k, 1)
ROWS(rows_iq4_xs, FMOE_IQ4_XS, isum_iq4_xs, d_iq4_xs, no_dmin, d8_iq4_xs, 1)

/* rows x nx inputs (astride bytes apart) into y[k·ldy + r]: passes of up to XMAX (4 or 8)
 * inputs over each row (fmoe__r1_group_max), one input alone by the one-input rows. */
#define ROWSX(name, type, ISUMN, D, DMIN, ONE, XMAX)                                               \
    SIMD static void name(const uint8_t *W, int64_t row_bytes, int64_t rows, const uint8_t *qx,   \
                          int64_t astride, int32_t nx, int64_t n, float *y, int64_t ldy) {         \
        const int64_t bytes = type##_BYTES, nb = n / FMOE_QK_K;                                    \
        for (int32_t k = 0; k < nx;) {                                                             \
            const int g = fmoe__r1_group_max(nx - k, XMAX);                                        \
            const uint8_t *a = qx + k * astride;                                                   \
            float *yk = y + k * ldy;                                                               \
            if (g == 1)                                                                            \
                ONE(W, row_bytes, rows, a, n, yk);                                                 \
            else                                                                                   \
                for (int64_t r = 0; r < rows; r++) {                                               \
                    const uint8_t *w = W + r * row_bytes;                                          \
                    if (g == 8)                                                                    \
                        FMOE__R1_ROWX8(yk + r, ldy, w, a, astride, nb, bytes, ISUMN, D, DMIN);     \
                    else if (g == 4)                                                               \
                        FMOE__R1_ROWX(yk + r, ldy, w, a, astride, 4, nb, bytes, ISUMN, D, DMIN);   \
                    else if (g == 3)                                                               \
                        FMOE__R1_ROWX(yk + r, ldy, w, a, astride, 3, nb, bytes, ISUMN, D, DMIN);   \
                    else                                                                           \
                        FMOE__R1_ROWX(yk + r, ldy, w, a, astride, 2, nb, bytes, ISUMN, D, DMIN);   \
                }                                                                                  \
            k += g;                                                                                \
        }                                                                                          \
    }
ROWSX(rowsx_q2_k, FMOE_Q2_K, isumn_q2_k, d_q2_k, dmin_q2_k, rows_q2_k, 4)
#if defined(FMOE__R1_VNNI)
/* Q3_K with five inputs or more in the VNNI build: row panels (lib/quant_rows1_avx2.h,
 * fmoe__r1_panel), the codes q' = q + 4 (0..7) unsigned, formed once for up to sixteen
 * inputs; the -4 comes off as isumn_q3_k's does, each accumulator starting from
 * -4·Σ_s sc_s·bsum_s (lane 8h + t: scales 2t and 2t + 1 of row h against bsums 2t and
 * 2t + 1). A row's block integer is its accumulator half's eight lanes added (exact, in
 * any order: q3k_panel_sums does sixteen rows at once), and the f32 steps are
 * FMOE__R1_ROWX8's, the reference's, lane by lane: the reference's bits. */
struct q3k_panel {
    struct fmoe__r1_panel p;
    __m512i corr[FMOE__R1_PANEL_PAIRS]; /* (-4 sc_2t, -4 sc_2t+1) of row 2rp + h in lane 8h + t */
    uint16_t d[FMOE__R1_PANEL_ROWS];    /* the rows' f16 d */
    __m512 s[FMOE__R1_PANEL_X];         /* input x's sums so far, row r in lane r */
};

/* One row's Q3_K block: group g's 32 codes q' (values 128h + 32j + l, g = 4h + j) into
 * q[g], its sixteen scales (scale u for values 16u .. 16u + 15) as dwords into sc[0..1]
 * and as int16 into sc16. */
SIMD static INLINE void q3k_panel_row(const uint8_t *b, __m256i *q, __m512i *sc, __m256i *sc16) {
    const __m128i sc8 = q3_k_scales8(b);
    *sc = _mm512_cvtepi8_epi32(sc8);
    *sc16 = _mm256_cvtepi8_epi16(sc8);
    const __m256i hmask = fmoe__r1_load(b);
    _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
        const __m256i qs = fmoe__r1_load(b + 32 + 32 * h);
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++)
            q[4 * h + j] = _mm256_or_si256(fmoe__r1_bits2(qs, j), fmoe__r1_bit_to4(hmask, 4 * h + j));
    }
}

/* Block off of rows w[0..15] into the panel, with the rows' corrections and d: lane
 * 8h + l of group g takes scale 2g (l < 4, values 0..15 of the group) or 2g + 1. */
SIMD static void q3k_panel_block(const uint8_t *const *w, int64_t off, struct q3k_panel *P) {
    const __m512i pick = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 16, 16, 16, 16, 17, 17, 17, 17);
    for (int rp = 0; rp < FMOE__R1_PANEL_PAIRS; rp++) {
        __m256i q0[8], q1[8], c0, c1;
        __m512i sc0, sc1;
        q3k_panel_row(w[2 * rp] + off, q0, &sc0, &c0);
        q3k_panel_row(w[2 * rp + 1] + off, q1, &sc1, &c1);
        _Pragma("GCC unroll 8") for (int g = 0; g < 8; g++) {
            P->p.q[g][rp] = _mm512_inserti64x4(_mm512_castsi256_si512(q0[g]), q1[g], 1);
            /* (scale, 0): the high half cleared, or a negative scale's sign bits would
             * multiply the high half of a negative four-value sum */
            P->p.sc[g][rp] = _mm512_and_si512(
                _mm512_permutex2var_epi32(sc0, _mm512_add_epi32(pick, _mm512_set1_epi32(2 * g)), sc1),
                _mm512_set1_epi32(0xFFFF));
        }
        const __m512i c = _mm512_inserti64x4(_mm512_castsi256_si512(c0), c1, 1);
        P->corr[rp] = _mm512_sub_epi16(_mm512_setzero_si512(), _mm512_slli_epi16(c, 2));
        memcpy(&P->d[2 * rp], w[2 * rp] + off + 108, 2);
        memcpy(&P->d[2 * rp + 1], w[2 * rp + 1] + off + 108, 2);
    }
}

/* The sixteen rows' block integers, row r in lane r, from the eight row pairs' lane sums:
 * three levels of adding neighbouring lanes, each merging two vectors into one. */
SIMD static INLINE __m512i q3k_panel_sums(const __m512i *v) {
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
#define Q3_MERGE(x, y)                                                                             \
    _mm512_add_epi32(_mm512_permutex2var_epi32(x, even, y), _mm512_permutex2var_epi32(x, odd, y))
    const __m512i x0 = Q3_MERGE(v[0], v[1]), x1 = Q3_MERGE(v[2], v[3]); /* rows 0-3, 4-7: 4 lanes each */
    const __m512i x2 = Q3_MERGE(v[4], v[5]), x3 = Q3_MERGE(v[6], v[7]);
    return Q3_MERGE(Q3_MERGE(x0, x1), Q3_MERGE(x2, x3)); /* 2 lanes a row, then 1 */
#undef Q3_MERGE
}

/* K inputs (their Q8_K blocks at a[0..K-1], slots x0 ..) against the panel's block:
 * s += (da·d)·sum - (da·dmin)·msum, dmin and msum zero as in FMOE__R1_ROWX8. */
SIMD static INLINE void q3k_panel_dots(struct q3k_panel *P, int x0, int K, const uint8_t *const *a) {
    __m512i s[3][FMOE__R1_PANEL_PAIRS];
    _Pragma("GCC unroll 3") for (int k = 0; k < K; k++) {
        const __m512i bs = _mm512_broadcast_i64x4(fmoe__r1_load(a[k] + FMOE__Q8K_BSUMS));
        _Pragma("GCC unroll 8") for (int rp = 0; rp < FMOE__R1_PANEL_PAIRS; rp++)
            s[k][rp] = _mm512_dpwssd_epi32(_mm512_setzero_si512(), P->corr[rp], bs);
    }
    fmoe__r1_panel_dots(&P->p, a, K, s);
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)P->d)), zero = _mm512_setzero_ps();
    _Pragma("GCC unroll 3") for (int k = 0; k < K; k++) {
        float da1;
        memcpy(&da1, a[k], 4);
        const __m512 da = _mm512_set1_ps(da1), sum = _mm512_cvtepi32_ps(q3k_panel_sums(s[k]));
        const __m512 t = _mm512_sub_ps(_mm512_mul_ps(_mm512_mul_ps(da, d), sum),
                                       _mm512_mul_ps(_mm512_mul_ps(da, zero), zero));
        P->s[x0 + k] = _mm512_add_ps(P->s[x0 + k], t);
    }
}

SIMD static INLINE void q3k_panel_start(struct q3k_panel *P, int m) {
    for (int k = 0; k < m; k++) P->s[k] = _mm512_setzero_ps();
}
SIMD static INLINE void q3k_panel_finish(const struct q3k_panel *P, int m, float *y, int64_t ldy, int64_t nr) {
    for (int k = 0; k < m; k++) _mm512_mask_storeu_ps(y + k * ldy, (__mmask16)((1u << nr) - 1), P->s[k]);
}
/* every block's products added to the sums (first unused) */
#define Q3K_PANEL_DOTS(P, x0, K, ab, first) q3k_panel_dots(P, x0, K, ab)
/* rows x nx inputs of Q3_K (astride bytes apart) into y[k·ldy + r] by row panels */
FMOE__R1_PANEL_ROWSX(rowsp_q3_k, struct q3k_panel, FMOE_Q3_K_BYTES, q3k_panel_start, q3k_panel_block,
                     Q3K_PANEL_DOTS, q3k_panel_finish)

ROWSX(rowsx4_q3_k, FMOE_Q3_K, isumn_q3_k, d_q3_k, no_dmin, rows_q3_k, 4)
/* panels from Q3K_PANEL_MIN inputs, passes of up to four below (16-row calls, 1024 wide:
 * four inputs 12.1 ps a multiply-add in one pass, 14.5 in a panel; five 17.9 as three and
 * two, 12.6 in a panel) */
#define Q3K_PANEL_MIN 5
SIMD static void rowsx_q3_k(const uint8_t *W, int64_t row_bytes, int64_t rows, const uint8_t *qx,
                            int64_t astride, int32_t nx, int64_t n, float *y, int64_t ldy) {
    if (nx >= Q3K_PANEL_MIN)
        rowsp_q3_k(W, row_bytes, rows, qx, astride, nx, n, y, ldy);
    else
        rowsx4_q3_k(W, row_bytes, rows, qx, astride, nx, n, y, ldy);
}
#else
ROWSX(rowsx_q3_k, FMOE_Q3_K, isumn_q3_k, d_q3_k, no_dmin, rows_q3_k, 4)
#endif
#if defined(FMOE__R1_VNNI)
/* IQ4_XS's eight-input passes in the VNNI build: FMOE__R1_X8_ROWS (lib/quant_rows1_avx2.h),
 * the inputs in the lanes. Eight inputs, ps a multiply-add on the development VM's EPYC:
 * 11.3 (the row-wise pass, FMOE__R1_ROWX8) -> 9.3; whole-model prefill
 * (tests/bench/bench_types_vs_llama.py's IQ4_XS file, one thread) 829 -> 994 tokens/s.
 * The block's 256 grid values g + 128 (unsigned bytes), sub-block j in gu[j], and the
 * eight scales ls - 32, scale j in dword j. */
SIMD static INLINE __m256i codes8_iq4_xs(const uint8_t *b, __m256i *gu, __m256i *sc2) {
    (void)sc2;
    static const int8_t levels[16] = FMOE__IQ4NL_LEVELS;
    const __m256i grid = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)levels));
    const __m256i m4 = _mm256_set1_epi8(0xF), lane_shift = _mm256_setr_epi64x(0, 0, 4, 4);
    /* 256-bit steps: g64_iq4_xs's 512-bit one was slower here (7.5 -> 7.9 ps) */
    _Pragma("GCC unroll 8")
    for (int j = 0; j < 8; j++) {
        const __m256i q = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(b + 8 + 16 * j)));
        const __m256i g = _mm256_shuffle_epi8(grid, _mm256_and_si256(_mm256_srlv_epi64(q, lane_shift), m4));
        gu[j] = _mm256_xor_si256(g, _mm256_set1_epi8((char)0x80));
    }
    return iq4_xs_scales(b);
}

FMOE__R1_X8_ROWS(rows8_iq4_xs, FMOE_IQ4_XS_BYTES, codes8_iq4_xs, d_iq4_xs, 0)
ROWSX(rowsx4_iq4_xs, FMOE_IQ4_XS, isumn_iq4_xs, d_iq4_xs, no_dmin, rows_iq4_xs, 4)
FMOE__R1_X8_ROWSX(rowsx_iq4_xs, rows8_iq4_xs, rowsx4_iq4_xs)
#else
ROWSX(rowsx_iq4_xs, FMOE_IQ4_XS, isumn_iq4_xs, d_iq4_xs, no_dmin, rows_iq4_xs, FMOE__R1_XMAX)
#endif

void FMOE__R1_ENTRY(fmoe__kx_rowsx_avx2)(uint32_t type, const void *W, int64_t row_bytes,
                                         int64_t rows, const void *qx, int64_t astride, int32_t nx,
                                         int64_t n, float *y, int64_t ldy) {
    switch (type) {
    case FMOE_GGML_Q2_K: rowsx_q2_k(W, row_bytes, rows, qx, astride, nx, n, y, ldy); return;
    case FMOE_GGML_Q3_K: rowsx_q3_k(W, row_bytes, rows, qx, astride, nx, n, y, ldy); return;
    case FMOE_GGML_IQ4_XS: rowsx_iq4_xs(W, row_bytes, rows, qx, astride, nx, n, y, ldy); return;
    default: FMOE_ASSERT(!"fmoe__kx_rowsx_avx2: not Q2_K, Q3_K or IQ4_XS");
    }
}

void FMOE__R1_ENTRY(fmoe__kx_rows1_avx2)(uint32_t type, const void *W, int64_t row_bytes,
                                         int64_t rows, const void *qx, int64_t n, float *y) {
    switch (type) {
    case FMOE_GGML_Q2_K: rows_q2_k(W, row_bytes, rows, qx, n, y); return;
    case FMOE_GGML_Q3_K: rows_q3_k(W, row_bytes, rows, qx, n, y); return;
    case FMOE_GGML_IQ4_XS: rows_iq4_xs(W, row_bytes, rows, qx, n, y); return;
    default: FMOE_ASSERT(!"fmoe__kx_rows1_avx2: not Q2_K, Q3_K or IQ4_XS");
    }
}

#else /* no AVX2 level, so never called: the reference, under both compilations' names */

void FMOE__R1_ENTRY(fmoe__kx_rowsx_avx2)(uint32_t type, const void *W, int64_t row_bytes,
                                         int64_t rows, const void *qx, int64_t astride, int32_t nx,
                                         int64_t n, float *y, int64_t ldy) {
    for (int32_t k = 0; k < nx; k++)
        FMOE__R1_ENTRY(fmoe__kx_rows1_avx2)(type, W, row_bytes, rows,
                                            (const uint8_t *)qx + k * astride, n, y + k * ldy);
}

void FMOE__R1_ENTRY(fmoe__kx_rows1_avx2)(uint32_t type, const void *W, int64_t row_bytes,
                                         int64_t rows, const void *qx, int64_t n, float *y) {
    for (int64_t r = 0; r < rows; r++)
        y[r] = fmoe__quant_act_dot_kx(type, (const uint8_t *)W + r * row_bytes, qx, n,
                                      FMOE__QUANT_PLAIN);
}

#endif
