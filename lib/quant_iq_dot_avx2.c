/*
 * quant_iq_dot_avx2.c - the codebook i-quants' rows (lib/quant_iq.c's formats) times Q8_K
 * inputs, AVX2: a decode step's product (one input) and a prefill's (up to four inputs a
 * pass over each row, eight in the VNNI build, each group's grid points and signs formed
 * once for all of them),
 * for the AVX2 and AVX-512 levels.
 *
 * One loop per type over a row's blocks, after ggml's x86 vec_dots
 * (ggml-cpu/arch/x86/quants.c, ggml_vec_dot_iq*_q8_K): the grid points, all of whose
 * values are non-negative for the IQ2 and IQ3 types, go into maddubs's unsigned operand as
 * they are looked up, and the stored signs are moved onto the activation bytes
 * (_mm256_sign_epi8 by a byte that is +1 or -1), so a group's codes are never negated nor
 * written anywhere. The IQ1 types' values g are -1, 0 or 1: |g| and g's sign on the
 * activation as the other K-quants do, and the ±1/8 offset as a separate sum of the
 * activations for IQ1_S (Q8_K's bsums: its ±1/8 goes with 32 values); IQ1_M's whole code
 * 8g ± 1 (±1 per 8 values) formed as a byte, |code| <= 9, and used as the IQ2 values are.
 * The sub-block scales multiply the int16 pair sums by madd (vpdpwssd in the VNNI
 * compilation, lib/quant_iq_dot_avx2_vnni.c).
 *
 * The block's integer is lib/quant_iq.c's, Σ_s sc_s·Σ_i q_i·a_i with q = g·s (IQ1:
 * 8g ± 1): the same integer by another grouping of exact integer sums (maddubs pairs are
 * at most 2·62·127, no int16 saturates; IQ1_M's at most 2·9·127). ggml then scales each block's integer vector in f32 lanes and adds
 * lanes across blocks; here the integer is reduced per block and added as the reference
 * (lib/quant_kx.c's block_dot, lib/quant_act.c's fmoe_quant_act_dot_ref) adds it,
 * s += da·d·sum - da·dmin·msum with dmin and msum zero, so the result is the plain C's
 * bits. tests/lib/test_quant_rows1.c compares each row with the reference; the speed
 * against ggml's is docs/quantization.md's (tests/bench/bench_vs_ggml.c). Compiled a
 * second time for CPUs with AVX512-VNNI, GFNI and BMI2 (lib/quant_iq_dot_avx2_vnni.c,
 * FMOE__R1_VNNI): vpdpwssd and 32 registers, and IQ1_S's, IQ1_M's and IQ2_S's grid
 * indices four to a register by pdep. There IQ2_XXS, IQ2_XS (one input), IQ2_S, IQ3_XXS
 * and IQ3_S take 64 values a step in 512-bit registers with the signs as a mask register
 * (the stored sign bits as they are, or the 7-bit sign sets made a mask by pdep, one GF(2)
 * affine map for the eighth sign and a byte test), the activations negated under it: the
 * sign-table loads these kernels were bound by are gone (one input, ps a multiply-add on
 * the development VM's EPYC: IQ3_XXS 64 -> 49.5, IQ2_XXS 44 -> 32, IQ2_XS 46 -> 35.5,
 * IQ2_S 37 -> 31.6, IQ3_S 74 -> 57).
 */
#include <stdint.h>
#include <string.h>

#include "fmoe/error.h"
#include "fmoe/quant.h"
#include "fmoe/quant_act.h"
#include "iq_grids.h"
#include "quant_act_impl.h"
#include "quant_impl.h"
#include "quant_rows1_avx2.h"

#if defined(__x86_64__)
#define SIMD FMOE__R1
#define INLINE FMOE__R1_INLINE

/* ggml's ksigns_iq2xs as bytes for _mm256_sign_epi8: 7 stored sign bits, the eighth the
 * parity of the seven (the quantiser only writes an even count of minus signs); byte j
 * of entry x is 0xFF (-1) where value j is negative, else 0x01. ggml's keven_signs_q2xs;
 * built by the preprocessor. */
#define KS(x)                                                                                      \
    ((x) | ((((x) ^ (x) >> 1 ^ (x) >> 2 ^ (x) >> 3 ^ (x) >> 4 ^ (x) >> 5 ^ (x) >> 6) & 1) << 7))
#define KB(s, j) ((uint64_t)((((s) >> (j)) & 1) ? 0xFFull : 0x01ull) << (8 * (j)))
#define KSIGN(x)                                                                                   \
    (KB(KS(x), 0) | KB(KS(x), 1) | KB(KS(x), 2) | KB(KS(x), 3) | KB(KS(x), 4) | KB(KS(x), 5) |     \
     KB(KS(x), 6) | KB(KS(x), 7))
#define KS4(x) KSIGN(x), KSIGN((x) + 1), KSIGN((x) + 2), KSIGN((x) + 3)
#define KS16(x) KS4(x), KS4((x) + 4), KS4((x) + 8), KS4((x) + 12)
#define KS64(x) KS16(x), KS16((x) + 16), KS16((x) + 32), KS16((x) + 48)
static const uint64_t ksign_bytes[128] = {KS64(0), KS64(64)};

/* Four sign sets of 7 bits (the lowest first) as _mm256_sign_epi8 bytes for 32 values. */
SIMD static INLINE __m256i ksigns4(uint32_t aux) {
    return _mm256_set_epi64x((long long)ksign_bytes[(aux >> 21) & 127],
                             (long long)ksign_bytes[(aux >> 14) & 127],
                             (long long)ksign_bytes[(aux >> 7) & 127],
                             (long long)ksign_bytes[aux & 127]);
}

/* Four plain sign bytes (value j of 32 negative where bit j % 8 of byte j / 8 is set) as
 * sign bytes: each byte broadcast over its 8 values, compared with the value's bit, then
 * -1 or +1. */
SIMD static INLINE __m256i signs32(uint32_t bits) {
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32((int)bits),
        _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    return _mm256_or_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit),
                           _mm256_set1_epi8(1));
}

/* Sign bytes (+1, -1) for the 32 values of groups 4k .. 4k + 3 from the vector of the
 * block's 32 sign-set bytes (bit j of byte i: value j of group i negative): dword k
 * broadcast, each byte spread over its 8 values, compared with the value's bit. */
SIMD static INLINE __m256i sign_bytes4(__m256i sets, int k) {
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i x = _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(sets, _mm256_set1_epi32(k)), spread);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    return _mm256_or_si256(_mm256_cmpeq_epi8(_mm256_and_si256(x, bit), bit), _mm256_set1_epi8(1));
}

/* Four 8-value grid points, the first lowest. */
SIMD static INLINE __m256i points4(const uint64_t *grid, unsigned i0, unsigned i1, unsigned i2,
                                   unsigned i3) {
    return _mm256_set_epi64x((long long)grid[i3], (long long)grid[i2], (long long)grid[i1],
                             (long long)grid[i0]);
}

/* Eight 4-value IQ3 points by scalar loads (an AVX2 gather was slower here for IQ3_S:
 * 131 against 127 ps a multiply-add on the development VM's EPYC). */
SIMD static INLINE __m256i points8(const uint32_t *grid, const uint32_t *i) {
    return _mm256_setr_epi32((int)grid[i[0]], (int)grid[i[1]], (int)grid[i[2]], (int)grid[i[3]],
                             (int)grid[i[4]], (int)grid[i[5]], (int)grid[i[6]], (int)grid[i[7]]);
}

/* The int16 pair sums of unsigned grid values g times the activation bytes a with signs s
 * (+1/-1 bytes) applied. */
SIMD static INLINE __m256i dot_signed(__m256i g, __m256i a, __m256i s) {
    return _mm256_maddubs_epi16(g, _mm256_sign_epi8(a, s));
}

/* The same where one scale sc multiplies all 32 values, added to acc. */
SIMD static INLINE __m256i madd_scale(__m256i acc, __m256i pairs, int sc) {
    return fmoe__r1_madd_add(acc, pairs, _mm256_set1_epi16((short)sc));
}

/* Sixteen 4-bit scales two a byte (low nibble first: IQ2_XS, IQ2_S) as 2ls + 1 in the
 * even/odd lane order scale_pick expects. */
SIMD static INLINE __m256i nibble_scales(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    const __m128i m4 = _mm_set1_epi8(0xF);
    const __m128i ls = _mm_and_si128(_mm_set_epi64x((long long)(v >> 4), (long long)v), m4);
    const __m128i sc = _mm_add_epi8(_mm_add_epi8(ls, ls), _mm_set1_epi8(1));
    return _mm256_cvtepu8_epi16(sc); /* low nibbles (even scales) first: the pick order */
}

/* IQ2_XS's and IQ1_M's prefill passes (NX > 1) put each group's signs on its codes once
 * for all the pass's inputs and give maddubs the signed codes q as its unsigned operand
 * q + B (q + B >= 0 and 2·(q + B)·128 <= 32767: no int16 saturates), so each input's
 * activation bytes go in as they are, one sign op fewer per input and 32 values. Σ sc·Σ q·a
 * = Σ sc·Σ (q + B)·a - B·Σ sc·Σ a, the last per 16 values from the input's bsums: each
 * input's accumulator starts at madd(-B·sc, bsums). The same integer, so the same bits.
 * Eight inputs a pass, ps a multiply-add on the development VM's EPYC (VNNI build): IQ2_XS
 * 14.8 -> 13.4, IQ1_M 17.0 -> 14.4; AVX2 build (four a pass) 22.4 -> 22.2, 21.8 -> 21.0.
 * The same for IQ3_S, IQ3_XXS, IQ2_XXS and IQ2_S was within noise in the VNNI build and
 * slower in the AVX2 one (IQ3_XXS 24.9 -> 26.5-27.5, IQ2_XXS 19.7 -> 21.4: their scalar
 * grid lookups hold more registers), so they keep the sign on the activation. One input
 * keeps it too (the bias's setup would be all its own). */
SIMD static INLINE __m256i codes_u(int NX, __m256i g, __m256i s, int B) {
    return NX > 1 ? _mm256_add_epi8(_mm256_sign_epi8(g, s), _mm256_set1_epi8((char)B)) : g;
}

/* The int16 pair sums of one input's 32 activation bytes a with the codes: u from codes_u,
 * or (one input) unsigned g with signs s. */
SIMD static INLINE __m256i pairs_u(int NX, __m256i g, __m256i u, __m256i s, __m256i a) {
    return NX > 1 ? _mm256_maddubs_epi16(u, a) : dot_signed(g, a, s);
}

/* -B times the sixteen scales of 16 values as int16 in bsums's order, from the even/odd
 * lane order (nibble_scales, scale_pick's). */
SIMD static INLINE __m256i corr_even_odd(__m256i scales, int B) {
    const __m128i lo = _mm256_castsi256_si128(scales), hi = _mm256_extracti128_si256(scales, 1);
    const __m256i nat = _mm256_set_m128i(_mm_unpackhi_epi16(lo, hi), _mm_unpacklo_epi16(lo, hi));
    return _mm256_mullo_epi16(nat, _mm256_set1_epi16((short)-B));
}

/* ---------------------------------------------------------------------------------- */
/* The block integers, one function per type                                          */
/* ---------------------------------------------------------------------------------- */

/* Each takes NX (1 to FMOE__R1_XMAX) inputs astride `as` bytes apart and sets v[k] to
 * input k's block vector: the codes and signs formed once for all of them (a prefill
 * pass), two accumulators per input (arrays of FMOE__R1_XMAX: sized 8 in the AVX2 build,
 * which takes four a pass, IQ3_S's four-input pass went 31.5 -> 42 ps a multiply-add). NX is a constant where they inline, so the one-input form is the
 * loop it was. QA(k, o): input k's 32 activation bytes at offset o of group pair ib. */
#define QA(k, o) fmoe__r1_load(a + (k) * as + FMOE__Q8K_Q + 32 * ib + (o))
/* Input k's first accumulator: zero, or with the bias (NX > 1) madd(corr, bsums). */
#define ACC0(k, corr)                                                                              \
    (NX > 1 ? _mm256_madd_epi16((corr), fmoe__r1_load(a + (k) * as + FMOE__Q8K_BSUMS))             \
            : _mm256_setzero_si256())

#if defined(FMOE__R1_VNNI)
/* The 512-bit steps of the VNNI build (64 values a step): signs as mask registers, the
 * grid values of a step per type, and the step's products. */

/* Eight 7-bit sign sets (set j at bits 7j, for values 8j .. 8j + 7) as a 64-bit mask, bit
 * i set where value i is negative, computed rather than looked up (ksign_bytes is four
 * loads per 32 values, and the loads bound these kernels): the sets to bytes (pdep), each
 * byte's eighth bit made the parity of its seven by one GF(2) affine map (output bit i < 7
 * is input bit i, bit 7 the parity of bits 0..6: ggml's keven_signs), each byte spread
 * over its 8 values and tested against the value's bit. */
SIMD static INLINE __mmask64 ksigns_mask64(uint64_t sets) {
    const uint64_t bytes = _pdep_u64(sets, 0x7F7F7F7F7F7F7F7Full);
    const __m128i full = _mm_gf2p8affine_epi64_epi8(_mm_cvtsi64_si128((long long)bytes),
                                                    _mm_set1_epi64x(0x010204081020407Fll), 0);
    /* 128-bit lane L: bytes 0-7 from set 2L, 8-15 from set 2L + 1 */
    const __m512i spread = _mm512_shuffle_epi8(
        _mm512_broadcastq_epi64(full),
        _mm512_set_epi64(0x0707070707070707, 0x0606060606060606, 0x0505050505050505, 0x0404040404040404,
                         0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
    return _mm512_test_epi8_mask(spread, _mm512_set1_epi64((long long)0x8040201008040201ULL));
}

/* Two uint32 of four 7-bit sign sets with a 4-bit scale on top (IQ2_XXS, IQ3_XXS), the
 * first in the low half, as ksigns_mask64's eight sets. */
SIMD static INLINE uint64_t sets_of_aux(uint64_t aux2) {
    return _pext_u64(aux2, 0x0FFFFFFF0FFFFFFFull);
}

/* The types with a scale per 32 values: group j's ls (the stored field, before 2ls + 1)
 * in dword j, for the one-input and the eight-lane kernels alike: IQ2_XXS's and IQ3_XXS's
 * top nibble of the group's uint32 of sign sets (IQ2_XXS: the odd dwords of the 64 bytes
 * at 2), IQ3_S's nibble j of the uint32 at 106, IQ1_S's bits 12-14 of the uint16 at
 * 34 + 2j. */
SIMD static INLINE __m256i ls_iq2_xxs(const uint8_t *b) {
    return _mm512_cvtepi64_epi32(_mm512_srli_epi64(_mm512_loadu_si512(b + 2), 60));
}
SIMD static INLINE __m256i ls_iq3_xxs(const uint8_t *b) { return _mm256_srli_epi32(fmoe__r1_load(b + 66), 28); }
SIMD static INLINE __m256i ls_iq3_s(const uint8_t *b) {
    return _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)fmoe__r1_le32(b + 106)),
                                              _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                            _mm256_set1_epi32(15));
}
SIMD static INLINE __m256i ls_iq1_s(const uint8_t *b) {
    return _mm256_and_si256(_mm256_srli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(b + 34))), 12),
                            _mm256_set1_epi32(7));
}

/* Sixteen 4-bit scales two a byte (IQ2_XS, IQ2_S; scale j of 16 values at nibble j) as
 * scale_words' dwords. */
SIMD static INLINE __m512i nibble_scale_words(const uint8_t *p) {
    const __m128i sb = _mm_loadl_epi64((const __m128i *)p);
    const __m512i ls = _mm512_and_si512(_mm512_srlv_epi32(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(sb, sb)),
                                                          _mm512_set4_epi32(4, 0, 4, 0)),
                                        _mm512_set1_epi32(15));
    return fmoe__r1_scale_words(ls);
}

/* The grid values of 64 values (a step of the 512-bit kernels), the first 32 in the low
 * half: two words of four 16-bit indices (idx4's) into a grid of 8-value points, or
 * sixteen indices into one of 4-value points. */
SIMD static INLINE __m512i points4x2(const uint64_t *grid, uint64_t x0, uint64_t x1) {
    return _mm512_inserti64x4(
        _mm512_castsi256_si512(points4(grid, x0 & 0xFFFF, (x0 >> 16) & 0xFFFF, (x0 >> 32) & 0xFFFF, x0 >> 48)),
        points4(grid, x1 & 0xFFFF, (x1 >> 16) & 0xFFFF, (x1 >> 32) & 0xFFFF, x1 >> 48), 1);
}

SIMD static INLINE __m512i points8x2(const uint32_t *grid, const uint32_t *i) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(points8(grid, i)), points8(grid, i + 8), 1);
}

/* Four indices as the 16-bit words of one register: the four low bytes lo8 to bits 0-7,
 * the bits of tops to where top_mask puts them (bits 8 and up), by pdep. */
SIMD static INLINE uint64_t idx4(uint32_t lo8, uint32_t tops, uint64_t top_mask) {
    return _pdep_u64(lo8, 0x00FF00FF00FF00FFull) | _pdep_u64(tops, top_mask);
}

/* Per type, a step's grid values: IQ2_XXS's from the index bytes 0-3 and 8-11 at q;
 * IQ3_XXS's from the sixteen at q; IQ3_S's from the sixteen at qs and the 16 top bits h;
 * IQ2_XS's from the low 9 bits of the eight uint16 at q; IQ2_S's from the eight bytes at
 * qs and the 2-bit tops in h0, h1; IQ1_S's from the eight bytes at qs and the 3-bit tops
 * in h0, h1's low 12 bits; IQ1_M's from the eight bytes at qs and the four qh bytes. */
SIMD static INLINE __m512i g64_iq2_xxs(const uint8_t *q) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(points4(fmoe__iq2xxs_grid, q[0], q[1], q[2], q[3])),
                              points4(fmoe__iq2xxs_grid, q[8], q[9], q[10], q[11]), 1);
}

SIMD static INLINE __m512i g64_iq3_xxs(const uint8_t *q) {
    const uint32_t i[16] = {q[0], q[1], q[2],  q[3],  q[4],  q[5],  q[6],  q[7],
                            q[8], q[9], q[10], q[11], q[12], q[13], q[14], q[15]};
    return points8x2(fmoe__iq3xxs_grid, i);
}

SIMD static INLINE __m512i g64_iq3_s(const uint8_t *qs, unsigned h) {
    uint64_t x[4];
    _Pragma("GCC unroll 4") for (int t = 0; t < 4; t++)
        x[t] = idx4(fmoe__r1_le32(qs + 4 * t), h >> 4 * t, 0x0100010001000100ull);
    /* from general registers: a vector of indices stored and read back as scalars was
     * IQ3_S's bound (74 -> 57 ps a multiply-add) */
    const uint32_t i[16] = {x[0] & 0xFFFF, (x[0] >> 16) & 0xFFFF, (x[0] >> 32) & 0xFFFF, x[0] >> 48,
                            x[1] & 0xFFFF, (x[1] >> 16) & 0xFFFF, (x[1] >> 32) & 0xFFFF, x[1] >> 48,
                            x[2] & 0xFFFF, (x[2] >> 16) & 0xFFFF, (x[2] >> 32) & 0xFFFF, x[2] >> 48,
                            x[3] & 0xFFFF, (x[3] >> 16) & 0xFFFF, (x[3] >> 32) & 0xFFFF, x[3] >> 48};
    return points8x2(fmoe__iq3s_grid, i);
}

SIMD static INLINE __m512i g64_iq2_xs(const uint8_t *q) {
    uint64_t w0, w1;
    memcpy(&w0, q, 8);
    memcpy(&w1, q + 8, 8);
    return points4x2(fmoe__iq2xs_grid, w0 & 0x01FF01FF01FF01FFull, w1 & 0x01FF01FF01FF01FFull);
}

/* IQ2_XS's eight sign sets of a step (the top 7 bits of each uint16 at q), packed. */
SIMD static INLINE uint64_t sets_iq2_xs(const uint8_t *q) {
    uint64_t w0, w1;
    memcpy(&w0, q, 8);
    memcpy(&w1, q + 8, 8);
    return _pext_u64(w0, 0xFE00FE00FE00FE00ull) | _pext_u64(w1, 0xFE00FE00FE00FE00ull) << 28;
}

SIMD static INLINE __m512i g64_iq2_s(const uint8_t *qs, unsigned h0, unsigned h1) {
    return points4x2(fmoe__iq2s_grid, idx4(fmoe__r1_le32(qs), h0, 0x0300030003000300ull),
                     idx4(fmoe__r1_le32(qs + 4), h1, 0x0300030003000300ull));
}

SIMD static INLINE __m512i g64_iq1_s(const uint8_t *qs, unsigned h0, unsigned h1) {
    return points4x2(fmoe__iq1s_grid, idx4(fmoe__r1_le32(qs), h0 & 0xFFFu, 0x0700070007000700ull),
                     idx4(fmoe__r1_le32(qs + 4), h1 & 0xFFFu, 0x0700070007000700ull));
}

SIMD static INLINE __m512i g64_iq1_m(const uint8_t *qs, const uint8_t *qh) {
    return points4x2(fmoe__iq1s_grid, idx4(fmoe__r1_le32(qs), fmoe__r1_le16(qh) & 0x7777u, 0x0F000F000F000F00ull),
                     idx4(fmoe__r1_le32(qs + 4), fmoe__r1_le16(qh + 2) & 0x7777u, 0x0F000F000F000F00ull));
}

/* acc[k] += the int16 pair sums of 64 unsigned grid values g times input k's 64
 * activation bytes from 32·ib, negated where neg, times the scales sc (vpdpwssd). */
SIMD static INLINE void dot64_signed(__m512i *acc, __m512i g, __mmask64 neg, __m512i sc,
                                     const uint8_t *a, int64_t as, int NX, int ib) {
    _Pragma("GCC unroll 8") for (int k = 0; k < NX; k++) {
        const __m512i x = _mm512_loadu_si512(a + k * as + FMOE__Q8K_Q + 32 * ib);
        const __m512i xs = _mm512_mask_sub_epi8(x, neg, _mm512_setzero_si512(), x);
        acc[k] = _mm512_dpwssd_epi32(acc[k], _mm512_maddubs_epi16(g, xs), sc);
    }
}
#endif

/* IQ2_XXS: per 32 values 8 bytes, four grid indices then a uint32 of four 7-bit sign sets
 * and the 4-bit scale on top. */
#if !defined(FMOE__R1_VNNI)
SIMD static INLINE void isum_iq2_xxs(const uint8_t *b, const uint8_t *a, int64_t as, int NX,
                                        __m256i *v) {
    __m256i acc0[FMOE__R1_XMAX], acc1[FMOE__R1_XMAX];
    _Pragma("GCC unroll 8") for (int k = 0; k < NX; k++) acc0[k] = acc1[k] = _mm256_setzero_si256();
    const uint8_t *q = b + 2;
    _Pragma("GCC unroll 8")
    for (int ib = 0; ib < 8; ib += 2, q += 16) {
        const uint32_t a1 = fmoe__r1_le32(q + 4), a3 = fmoe__r1_le32(q + 12);
        const __m256i g0 = points4(fmoe__iq2xxs_grid, q[0], q[1], q[2], q[3]);
        const __m256i g1 = points4(fmoe__iq2xxs_grid, q[8], q[9], q[10], q[11]);
        const __m256i s0 = ksigns4(a1), s1 = ksigns4(a3);
        _Pragma("GCC unroll 8") for (int k = 0; k < NX; k++) {
            acc0[k] = madd_scale(acc0[k], dot_signed(g0, QA(k, 0), s0), 2 * (int)(a1 >> 28) + 1);
            acc1[k] = madd_scale(acc1[k], dot_signed(g1, QA(k, 32), s1), 2 * (int)(a3 >> 28) + 1);
        }
    }
    _Pragma("GCC unroll 8") for (int k = 0; k < NX; k++) v[k] = _mm256_add_epi32(acc0[k], acc1[k]);
}
#else
/* IQ2_XXS as IQ3_XXS below, 64 values a step: the 64 block bytes as qwords, group j's in
 * qword j (four indices, then four sign sets with the scale on top). */
SIMD static INLINE void isum_iq2_xxs(const uint8_t *b, const uint8_t *a, int64_t as, int NX,
                                        __m256i *v) {
    const uint8_t *q = b + 2;
    const __m512i sc = fmoe__r1_scale_words(_mm512_castsi256_si512(ls_iq2_xxs(b)));
    __m512i acc[FMOE__R1_XMAX];
    _Pragma("GCC unroll 8") for (int k = 0; k < NX; k++) acc[k] = _mm512_setzero_si512();
    _Pragma("GCC unroll 8")
    for (int ib = 0; ib < 8; ib += 2, q += 16) {
        const uint64_t a2 = (uint64_t)fmoe__r1_le32(q + 4) | (uint64_t)fmoe__r1_le32(q + 12) << 32;
        const __m512i g = g64_iq2_xxs(q);
        dot64_signed(acc, g, ksigns_mask64(sets_of_aux(a2)), fmoe__r1_scales64(sc, ib, ib, ib + 1, ib + 1), a, as, NX, ib);
    }
    fmoe__r1_fold64(acc, NX, v);
}
#endif

/* IQ2_XS: per 8 values a uint16, a 9-bit grid index under 7 sign bits; a 4-bit scale per
 * 16 values at 66. */
#if defined(FMOE__R1_VNNI)
/* IQ2_XS, one input, in 512-bit registers, 64 values a step: the eight words' sign sets
 * (their top 7 bits) gathered by pext into ksigns_mask64's mask, a scale per 16 values
 * one per 128-bit quarter. Several inputs take the 256-bit form below, whose codes with
 * the signs applied serve every input. */
SIMD static INLINE void isum_iq2_xs_one(const uint8_t *b, const uint8_t *a, __m256i *v) {
    const __m512i sc = nibble_scale_words(b + 66);
    __m512i acc = _mm512_setzero_si512();
    const uint8_t *q = b + 2;
    _Pragma("GCC unroll 4")
    for (int ib = 0; ib < 8; ib += 2, q += 16) {
        dot64_signed(&acc, g64_iq2_xs(q), ksigns_mask64(sets_iq2_xs(q)), fmoe__r1_scales64(sc, 2 * ib, 2 * ib + 1, 2 * ib + 2, 2 * ib + 3), a, 0, 1, ib);
    }
    fmoe__r1_fold64(&acc, 1, v);
}
#endif

SIMD static INLINE void isum_iq2_xs(const uint8_t *b, const uint8_t *a, int64_t as, int NX,
                                       __m256i *v) {
#if defined(FMOE__R1_VNNI)
    if (NX == 1) {
        isum_iq2_xs_one(b, a, v);
        return;
    }
#endif
    const __m256i scales = nibble_scales(b + 66);
    /* The 32 sign sets as bytes, formed at once: each word's top 7 bits, packed (lane-wise:
     * put back in order), with the parity of the seven as bit 7 (the nibbles' bit counts by
     * a 16-entry shuffle). Looking them up one by one in ksign_bytes took two scalar ops and
     * a load each, and these kernels are bound by their scalar ops. */
    const __m256i w0 = fmoe__r1_load(b + 2), w1 = fmoe__r1_load(b + 34);
    const __m256i s7 = _mm256_permute4x64_epi64(
        _mm256_packus_epi16(_mm256_srli_epi16(w0, 9), _mm256_srli_epi16(w1, 9)), 0xD8);
    const __m256i m4 = _mm256_set1_epi8(0xF);
    const __m256i bits = _mm256_setr_epi8(0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4,
                                          0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4);
    const __m256i pc = _mm256_add_epi8(_mm256_shuffle_epi8(bits, _mm256_and_si256(s7, m4)),
                                       _mm256_shuffle_epi8(bits, _mm256_and_si256(_mm256_srli_epi16(s7, 4), m4)));
    const __m256i s8 = _mm256_or_si256(s7, _mm256_slli_epi16(_mm256_and_si256(pc, _mm256_set1_epi8(1)), 7));
    __m256i acc0[FMOE__R1_XMAX], acc1[FMOE__R1_XMAX];
    const __m256i corr = NX > 1 ? corr_even_odd(scales, 64) : _mm256_setzero_si256();
    _Pragma("GCC unroll 8") for (int k = 0; k < NX; k++) {
        acc0[k] = ACC0(k, corr);
        acc1[k] = _mm256_setzero_si256();
    }
    const uint8_t *q = b + 2;
    _Pragma("GCC unroll 8")
    for (int ib = 0; ib < 8; ib += 2, q += 16) {
        uint16_t v[8];
        memcpy(v, q, 16);
        const __m256i g0 = points4(fmoe__iq2xs_grid, v[0] & 511, v[1] & 511, v[2] & 511, v[3] & 511);
        const __m256i g1 = points4(fmoe__iq2xs_grid, v[4] & 511, v[5] & 511, v[6] & 511, v[7] & 511);
        const __m256i s0 = sign_bytes4(s8, ib), s1 = sign_bytes4(s8, ib + 1);
        const __m256i u0 = codes_u(NX, g0, s0, 64), u1 = codes_u(NX, g1, s1, 64); /* |q| <= 43 */
        _Pragma("GCC unroll 8") for (int k = 0; k < NX; k++) {
            acc0[k] = fmoe__r1_madd_pick(acc0[k], pairs_u(NX, g0, u0, s0, QA(k, 0)), scales, ib);
            acc1[k] = fmoe__r1_madd_pick(acc1[k], pairs_u(NX, g1, u1, s1, QA(k, 32)), scales, ib + 1);
        }
    }
    _Pragma("GCC unroll 8") for (int k = 0; k < NX; k++) v[k] = _mm256_add_epi32(acc0[k], acc1[k]);
}

/* IQ2_S: per 8 values the low 8 bits of a 10-bit index in qs[k], its top 2 bits in
 * qh[k / 4] (bits 2(k % 4)), 8 plain sign bits in qs[32 + k]; scales as IQ2_XS at 74. */
#if !defined(FMOE__R1_VNNI)
SIMD static INLINE void isum_iq2_s(const uint8_t *b, const uint8_t *a, int64_t as, int NX,
                                      __m256i *v) {
    const __m256i scales = nibble_scales(b + 74);
    const uint8_t *qs = b + 2, *signs = b + 34, *qh = b + 66;
    __m256i acc0[FMOE__R1_XMAX], acc1[FMOE__R1_XMAX];
    _Pragma("GCC unroll 8") for (int k = 0; k < NX; k++) acc0[k] = acc1[k] = _mm256_setzero_si256();
    _Pragma("GCC unroll 8")
    for (int ib = 0; ib < 8; ib += 2, qs += 8, signs += 8) {
        const unsigned h0 = qh[ib], h1 = qh[ib + 1];
        const __m256i g0 = points4(fmoe__iq2s_grid, qs[0] | (h0 & 3) << 8, qs[1] | (h0 & 12) << 6,
                                   qs[2] | (h0 & 48) << 4, qs[3] | (h0 & 192) << 2);
        const __m256i g1 = points4(fmoe__iq2s_grid, qs[4] | (h1 & 3) << 8, qs[5] | (h1 & 12) << 6,
                                   qs[6] | (h1 & 48) << 4, qs[7] | (h1 & 192) << 2);
        const __m256i s0 = signs32(fmoe__r1_le32(signs)), s1 = signs32(fmoe__r1_le32(signs + 4));
        _Pragma("GCC unroll 8") for (int k = 0; k < NX; k++) {
            acc0[k] = fmoe__r1_madd_pick(acc0[k], dot_signed(g0, QA(k, 0), s0), scales, ib);
            acc1[k] = fmoe__r1_madd_pick(acc1[k], dot_signed(g1, QA(k, 32), s1), scales, ib + 1);
        }
    }
    _Pragma("GCC unroll 8") for (int k = 0; k < NX; k++) v[k] = _mm256_add_epi32(acc0[k], acc1[k]);
}
#else
/* IQ2_S in 512-bit registers, 64 values a step: the stored sign bits are the negation
 * mask, and a scale per 16 values is one per 128-bit quarter. */
SIMD static INLINE void isum_iq2_s(const uint8_t *b, const uint8_t *a, int64_t as, int NX,
                                      __m256i *v) {
    const uint8_t *qs = b + 2, *signs = b + 34, *qh = b + 66;
    const __m512i sc = nibble_scale_words(b + 74);
    __m512i acc[FMOE__R1_XMAX];
    _Pragma("GCC unroll 8") for (int k = 0; k < NX; k++) acc[k] = _mm512_setzero_si512();
    _Pragma("GCC unroll 8")
    for (int ib = 0; ib < 8; ib += 2, qs += 8, signs += 8) {
        const __m512i g = g64_iq2_s(qs, qh[ib], qh[ib + 1]);
        uint64_t neg;
        memcpy(&neg, signs, 8);
        dot64_signed(acc, g, (__mmask64)neg, fmoe__r1_scales64(sc, 2 * ib, 2 * ib + 1, 2 * ib + 2, 2 * ib + 3), a, as, NX, ib);
    }
    fmoe__r1_fold64(acc, NX, v);
}
#endif

/* IQ3_XXS: a grid index (4 values) a byte; per 32 values a uint32 at 66 + 4ib of four
 * 7-bit sign sets and the 4-bit scale on top. */
#if !defined(FMOE__R1_VNNI)
SIMD static INLINE void isum_iq3_xxs(const uint8_t *b, const uint8_t *a, int64_t as, int NX,
                                        __m256i *v) {
    const uint8_t *q = b + 2, *aux = b + 66;
    __m256i acc0[FMOE__R1_XMAX], acc1[FMOE__R1_XMAX];
    _Pragma("GCC unroll 8") for (int k = 0; k < NX; k++) acc0[k] = acc1[k] = _mm256_setzero_si256();
    _Pragma("GCC unroll 8")
    for (int ib = 0; ib < 8; ib += 2, q += 16, aux += 8) {
        const uint32_t i0[8] = {q[0], q[1], q[2], q[3], q[4], q[5], q[6], q[7]};
        const uint32_t i1[8] = {q[8], q[9], q[10], q[11], q[12], q[13], q[14], q[15]};
        const uint32_t a0 = fmoe__r1_le32(aux), a1 = fmoe__r1_le32(aux + 4);
        const __m256i g0 = points8(fmoe__iq3xxs_grid, i0), g1 = points8(fmoe__iq3xxs_grid, i1);
        const __m256i s0 = ksigns4(a0), s1 = ksigns4(a1);
        _Pragma("GCC unroll 8") for (int k = 0; k < NX; k++) {
            acc0[k] = madd_scale(acc0[k], dot_signed(g0, QA(k, 0), s0), 2 * (int)(a0 >> 28) + 1);
            acc1[k] = madd_scale(acc1[k], dot_signed(g1, QA(k, 32), s1), 2 * (int)(a1 >> 28) + 1);
        }
    }
    _Pragma("GCC unroll 8") for (int k = 0; k < NX; k++) v[k] = _mm256_add_epi32(acc0[k], acc1[k]);
}
#else
/* IQ3_XXS in 512-bit registers, 64 values (two groups of 32) a step: the same integer,
 * group 2j's sums in the low half, 2j + 1's in the high half, as acc0 and acc1 above. The
 * scales 2ls + 1 of the block's eight groups formed once, as dwords of two equal words
 * (vpdpwssd's pairs). */
SIMD static INLINE void isum_iq3_xxs(const uint8_t *b, const uint8_t *a, int64_t as, int NX,
                                        __m256i *v) {
    const uint8_t *q = b + 2, *aux = b + 66;
    const __m512i sc = fmoe__r1_scale_words(_mm512_castsi256_si512(ls_iq3_xxs(b)));
    __m512i acc[FMOE__R1_XMAX];
    _Pragma("GCC unroll 8") for (int k = 0; k < NX; k++) acc[k] = _mm512_setzero_si512();
    _Pragma("GCC unroll 8")
    for (int ib = 0; ib < 8; ib += 2, q += 16, aux += 8) {
        const __m512i g = g64_iq3_xxs(q);
        uint64_t aux2;
        memcpy(&aux2, aux, 8);
        dot64_signed(acc, g, ksigns_mask64(sets_of_aux(aux2)), fmoe__r1_scales64(sc, ib, ib, ib + 1, ib + 1), a, as, NX, ib);
    }
    fmoe__r1_fold64(acc, NX, v);
}
#endif

/* IQ3_S: per 4 values a 9-bit index, qs[k] and bit k % 8 of qh[k / 8]; sign bits 8 a byte
 * at 74; a 4-bit scale per 32 values at 106. */
#if !defined(FMOE__R1_VNNI)
SIMD static INLINE void isum_iq3_s(const uint8_t *b, const uint8_t *a, int64_t as, int NX,
                                      __m256i *v) {
    const uint8_t *qs = b + 2, *qh = b + 66, *signs = b + 74, *scales = b + 106;
    /* index 8ib + j: qs[8ib + j] and bit j of qh[ib], moved to bit 8 by a per-lane shift */
    const __m256i lane = _mm256_setr_epi32(8, 7, 6, 5, 4, 3, 2, 1), bit8 = _mm256_set1_epi32(256);
    __m256i acc0[FMOE__R1_XMAX], acc1[FMOE__R1_XMAX];
    _Pragma("GCC unroll 8") for (int k = 0; k < NX; k++) acc0[k] = acc1[k] = _mm256_setzero_si256();
    _Pragma("GCC unroll 8")
    for (int ib = 0; ib < 8; ib += 2, qs += 16, signs += 8) {
        const __m256i lo0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)qs));
        const __m256i lo1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(qs + 8)));
        const __m256i hi0 = _mm256_and_si256(_mm256_sllv_epi32(_mm256_set1_epi32(qh[ib]), lane), bit8);
        const __m256i hi1 = _mm256_and_si256(_mm256_sllv_epi32(_mm256_set1_epi32(qh[ib + 1]), lane), bit8);
        uint32_t idx[16] __attribute__((aligned(32)));
        _mm256_store_si256((__m256i *)idx, _mm256_or_si256(lo0, hi0));
        _mm256_store_si256((__m256i *)(idx + 8), _mm256_or_si256(lo1, hi1));
        const __m256i g0 = points8(fmoe__iq3s_grid, idx), g1 = points8(fmoe__iq3s_grid, idx + 8);
        const unsigned ls = scales[ib / 2];
        const __m256i s0 = signs32(fmoe__r1_le32(signs)), s1 = signs32(fmoe__r1_le32(signs + 4));
        _Pragma("GCC unroll 8") for (int k = 0; k < NX; k++) {
            acc0[k] = madd_scale(acc0[k], dot_signed(g0, QA(k, 0), s0), 2 * (int)(ls & 15) + 1);
            acc1[k] = madd_scale(acc1[k], dot_signed(g1, QA(k, 32), s1), 2 * (int)(ls >> 4) + 1);
        }
    }
    _Pragma("GCC unroll 8") for (int k = 0; k < NX; k++) v[k] = _mm256_add_epi32(acc0[k], acc1[k]);
}
#else
/* IQ3_S in 512-bit registers, 64 values a step: the 16 indices' top bits by a mask move
 * of qh's two bytes, the 64 stored sign bits are the negation mask as they are. */
SIMD static INLINE void isum_iq3_s(const uint8_t *b, const uint8_t *a, int64_t as, int NX,
                                      __m256i *v) {
    const uint8_t *qs = b + 2, *qh = b + 66, *signs = b + 74;
    const __m512i sc = fmoe__r1_scale_words(_mm512_castsi256_si512(ls_iq3_s(b)));
    __m512i acc[FMOE__R1_XMAX];
    _Pragma("GCC unroll 8") for (int k = 0; k < NX; k++) acc[k] = _mm512_setzero_si512();
    _Pragma("GCC unroll 8")
    for (int ib = 0; ib < 8; ib += 2, qs += 16, signs += 8) {
        const unsigned h = fmoe__r1_le16(qh + ib);
        const __m512i g = g64_iq3_s(qs, h);
        uint64_t neg;
        memcpy(&neg, signs, 8);
        dot64_signed(acc, g, (__mmask64)neg, fmoe__r1_scales64(sc, ib, ib, ib + 1, ib + 1), a, as, NX, ib);
    }
    fmoe__r1_fold64(acc, NX, v);
}
#endif

/* IQ1_S: per 32 values a uint16 qh at 34 + 2ib (four 3-bit index tops, a 3-bit scale at
 * bit 12, the offset's sign at bit 15), per 8 values the index's low 8 bits. The code is
 * 8g + δ (δ = ±1 per 32 values): Σ sc·Σ(8g + δ)·a = 8·Σ sc·Σ g·a + Σ sc·δ·Σ a, the last
 * a madd of the input's sums of 16 (bsums) with sc·δ for each 16, formed from the eight qh
 * words at once. */
SIMD static INLINE void isum_iq1_s(const uint8_t *b, const uint8_t *a, int64_t as, int NX,
                                    __m256i *v) {
    const uint8_t *qs = b + 2;
    const __m128i qh = _mm_loadu_si128((const __m128i *)(b + 34));
    const __m128i sc = _mm_add_epi16(_mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(qh, 12), _mm_set1_epi16(7)), 1),
                                     _mm_set1_epi16(1));
    /* sc·δ: δ = -1 where qh's bit 15 (its int16 sign) is set; qh | 1 is never 0 */
    const __m128i scd = _mm_sign_epi16(sc, _mm_or_si128(qh, _mm_set1_epi16(1)));
    /* g + 1 (0..2) is maddubs's unsigned operand, so the activation goes in as it is (no
     * sign op per input): Σ sc·Σ g·a = Σ sc·Σ (g + 1)·a - Σ sc·bsum, the last joining the
     * offset's madd as (sc·δ - 8sc)·bsum (eight inputs a pass 16.5 -> 12.5 ps a
     * multiply-add, one input 39.5 either way). */
    const __m128i off = _mm_sub_epi16(scd, _mm_slli_epi16(sc, 3));
    const __m256i off16 = _mm256_set_m128i(_mm_unpackhi_epi16(off, off), _mm_unpacklo_epi16(off, off));
#if defined(FMOE__R1_VNNI)
    /* 64 values a step in 512-bit registers: g + 1 of both groups in one register, the
     * scales 2ls + 1 a dword per 32 values (bits 12-14 of qh), one permute a step */
    const __m512i sc64 = fmoe__r1_scale_words(_mm512_castsi256_si512(ls_iq1_s(b)));
    __m512i acc[FMOE__R1_XMAX];
    _Pragma("GCC unroll 8") for (int k = 0; k < NX; k++) acc[k] = _mm512_setzero_si512();
    _Pragma("GCC unroll 8")
    for (int ib = 0; ib < 8; ib += 2, qs += 8) {
        const unsigned h0 = fmoe__r1_le16(b + 34 + 2 * ib), h1 = fmoe__r1_le16(b + 36 + 2 * ib);
        const __m512i u = _mm512_add_epi8(g64_iq1_s(qs, h0, h1), _mm512_set1_epi8(1));
        const __m512i scj = fmoe__r1_scales64(sc64, ib, ib, ib + 1, ib + 1);
        _Pragma("GCC unroll 8") for (int k = 0; k < NX; k++) acc[k] = _mm512_dpwssd_epi32(
            acc[k], _mm512_maddubs_epi16(u, _mm512_loadu_si512(a + k * as + FMOE__Q8K_Q + 32 * ib)), scj);
    }
    __m256i sums[FMOE__R1_XMAX];
    fmoe__r1_fold64(acc, NX, sums);
    _Pragma("GCC unroll 8") for (int k = 0; k < NX; k++) {
        const __m256i offset = _mm256_madd_epi16(off16, fmoe__r1_load(a + k * as + FMOE__Q8K_BSUMS));
        v[k] = _mm256_add_epi32(_mm256_slli_epi32(sums[k], 3), offset);
    }
}
#else
    const __m256i one = _mm256_set1_epi8(1);
    __m256i acc0[FMOE__R1_XMAX], acc1[FMOE__R1_XMAX];
    _Pragma("GCC unroll 8") for (int k = 0; k < NX; k++) acc0[k] = acc1[k] = _mm256_setzero_si256();
    _Pragma("GCC unroll 8")
    for (int ib = 0; ib < 8; ib += 2, qs += 8) {
        const unsigned h0 = fmoe__r1_le16(b + 34 + 2 * ib), h1 = fmoe__r1_le16(b + 36 + 2 * ib);
        const __m256i g0 = points4(fmoe__iq1s_grid, qs[0] | (h0 & 7) << 8, qs[1] | (h0 & 0x38) << 5,
                                   qs[2] | (h0 & 0x1C0) << 2, qs[3] | (h0 & 0xE00) >> 1);
        const __m256i g1 = points4(fmoe__iq1s_grid, qs[4] | (h1 & 7) << 8, qs[5] | (h1 & 0x38) << 5,
                                   qs[6] | (h1 & 0x1C0) << 2, qs[7] | (h1 & 0xE00) >> 1);
        const int sc0 = 2 * (int)((h0 >> 12) & 7) + 1, sc1 = 2 * (int)((h1 >> 12) & 7) + 1;
        const __m256i u0 = _mm256_add_epi8(g0, one), u1 = _mm256_add_epi8(g1, one);
        _Pragma("GCC unroll 8") for (int k = 0; k < NX; k++) {
            acc0[k] = madd_scale(acc0[k], _mm256_maddubs_epi16(u0, QA(k, 0)), sc0);
            acc1[k] = madd_scale(acc1[k], _mm256_maddubs_epi16(u1, QA(k, 32)), sc1);
        }
    }
    _Pragma("GCC unroll 8") for (int k = 0; k < NX; k++) {
        const __m256i offset = _mm256_madd_epi16(off16, fmoe__r1_load(a + k * as + FMOE__Q8K_BSUMS));
        v[k] = _mm256_add_epi32(_mm256_slli_epi32(_mm256_add_epi32(acc0[k], acc1[k]), 3), offset);
    }
}
#endif

/* IQ1_M's δ of each group of 8 values as byte k of 32, -1 where bit 3 of nibble k % 2 of
 * qh[k / 2] is set, else 1: each qh byte taken twice, the even copies multiplied by 256
 * and the odd by 16 put that bit at bit 11 of a word, shifted to its sign and packed
 * (lane-wise, so the quarters come out as k 0-7, 16-23, 8-15, 24-31 and are put back in
 * order). */
SIMD static INLINE __m256i iq1_m_deltas(const uint8_t *qh) {
    const __m128i qh8 = _mm_loadu_si128((const __m128i *)qh);
    const __m256i mul = _mm256_set1_epi32(0x00100100); /* words 256, 16, 256, 16, ... */
    const __m256i hlo = _mm256_mullo_epi16(_mm256_cvtepu8_epi16(_mm_unpacklo_epi8(qh8, qh8)), mul);
    const __m256i hhi = _mm256_mullo_epi16(_mm256_cvtepu8_epi16(_mm_unpackhi_epi8(qh8, qh8)), mul);
    const __m256i dw = _mm256_packs_epi16(_mm256_srai_epi16(_mm256_slli_epi16(hlo, 4), 15),
                                          _mm256_srai_epi16(_mm256_slli_epi16(hhi, 4), 15));
    return _mm256_or_si256(_mm256_permute4x64_epi64(dw, 0xD8), _mm256_set1_epi8(1));
}

#if defined(FMOE__R1_VNNI)
/* IQ1_M, one input, in 512-bit registers, 64 values a step: the codes 8g + δ as bytes,
 * code + 16 maddubs's unsigned operand (no sign op on the activations), the bias taken out
 * once a block through the input's sums of 16 (bsums); a scale per 16 values (3 bits at 3(s % 4) of the uint16 s / 4 at 48),
 * one per 128-bit quarter. Several inputs take the 256-bit form below, whose biased codes
 * serve every input. */
SIMD static INLINE void isum_iq1_m_one(const uint8_t *b, const uint8_t *a, __m256i *v) {
    const uint8_t *qs = b, *qh = b + 32;
    /* dword s: word s / 4 moved to its low half, shifted by 3(s % 4) */
    const __m512i words = _mm512_castsi128_si512(_mm_loadl_epi64((const __m128i *)(b + 48)));
    const __m512i wsel = _mm512_permutexvar_epi16(
        _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0), words);
    const __m512i sc = fmoe__r1_scale_words(_mm512_and_si512(
        _mm512_srlv_epi32(wsel, _mm512_set4_epi32(9, 6, 3, 0)), _mm512_set1_epi32(7)));
    const __m256i dall = iq1_m_deltas(qh); /* δ of group k (8 values) as byte k */
    const __m512i dz = _mm512_castsi256_si512(dall);
    /* 128-bit lane L of a step: bytes 0-7 from group 2L, 8-15 from 2L + 1 */
    const __m512i spread = _mm512_set_epi64(0x0707070707070707, 0x0606060606060606, 0x0505050505050505,
                                            0x0404040404040404, 0x0303030303030303, 0x0202020202020202,
                                            0x0101010101010101, 0);
    __m512i acc = _mm512_setzero_si512();
    _Pragma("GCC unroll 4")
    for (int ib = 0; ib < 8; ib += 2, qs += 8, qh += 4) {
        const __m512i g = g64_iq1_m(qs, qh);
        /* the step's eight δ bytes (qword ib / 2 of dall) spread over their values */
        const __m512i d = _mm512_shuffle_epi8(_mm512_permutexvar_epi64(_mm512_set1_epi64(ib / 2), dz), spread);
        /* 8g by a 16-bit shift, the bits shifted in from the byte below cleared: g is -1, 0, 1 */
        const __m512i c = _mm512_add_epi8(_mm512_and_si512(_mm512_slli_epi16(g, 3), _mm512_set1_epi8((char)0xF8)), d);
        const __m512i u = _mm512_add_epi8(c, _mm512_set1_epi8(16));
        acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(u, _mm512_loadu_si512(a + FMOE__Q8K_Q + 32 * ib)),
                                  fmoe__r1_scales64(sc, 2 * ib, 2 * ib + 1, 2 * ib + 2, 2 * ib + 3));
    }
    /* the bias out: - Σ_s 16·sc_s·(the input's sum of the 16 values s) */
    const __m256i sc16 = _mm512_cvtepi32_epi16(sc);
    const __m256i bias = _mm256_madd_epi16(_mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(sc16, 4)),
                                           fmoe__r1_load(a + FMOE__Q8K_BSUMS));
    fmoe__r1_fold64(&acc, 1, v);
    *v = _mm256_add_epi32(*v, bias);
}
#endif

/* IQ1_M: per 8 values the index's low 8 bits in qs[k] and a nibble of qh (k even: the low
 * one) holding its top 3 bits and the offset's sign (bit 3); a 3-bit scale per 16 values,
 * four to each uint16 at 48 (their top nibbles are d). The code 8g + δ (δ = ±1 per 8
 * values) as a byte, 8g by a sign op: one maddubs of |code| and the activation with the
 * code's sign per 32 values (it was a maddubs for g, a shift and a maddubs of ±1 for δ),
 * then madd by the scale of its 16. */
SIMD static INLINE void isum_iq1_m(const uint8_t *b, const uint8_t *a, int64_t as, int NX,
                                      __m256i *v) {
#if defined(FMOE__R1_VNNI)
    if (NX == 1) {
        isum_iq1_m_one(b, a, v);
        return;
    }
#endif
    const uint8_t *qs = b, *qh = b + 32;
    /* scale s = bits 3(s % 4) of word s / 4, as int16 2ls + 1, even s in the low lane */
    uint64_t words;
    memcpy(&words, b + 48, 8);
    const __m256i sh = _mm256_setr_epi64x(0, 6, 3, 9); /* s % 4 = 0, 2 low; 1, 3 high */
    const __m256i w4 = _mm256_srlv_epi64(_mm256_set1_epi64x((long long)words), sh);
    /* lane 64-bit j holds, in its four 16-bit words, scales 4w + (0, 2, 1, 3)[j] of word w */
    const __m256i ls = _mm256_and_si256(w4, _mm256_set1_epi16(7));
    /* even/odd lanes: low lane scales 0 2 4 .. 14 = words (j=0: s 0,4,8,12; j=1: 2,6,10,14) */
    const __m256i order = _mm256_setr_epi8(0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15,
                                           0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15);
    const __m256i sc16 = _mm256_shuffle_epi8(ls, order);
    const __m256i scales = _mm256_add_epi16(_mm256_add_epi16(sc16, sc16), _mm256_set1_epi16(1));
    const __m256i dall = iq1_m_deltas(qh); /* δ of group k (8 values) as byte k */
    /* four δ bytes (32 values: dword ib of dall) each spread over its 8 values */
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i eight = _mm256_set1_epi8(8);
    __m256i acc0[FMOE__R1_XMAX], acc1[FMOE__R1_XMAX];
    const __m256i corr = NX > 1 ? corr_even_odd(scales, 16) : _mm256_setzero_si256();
    _Pragma("GCC unroll 8") for (int k = 0; k < NX; k++) {
        acc0[k] = ACC0(k, corr);
        acc1[k] = _mm256_setzero_si256();
    }
    _Pragma("GCC unroll 8")
    for (int ib = 0; ib < 8; ib += 2, qs += 8, qh += 4) {
#if defined(FMOE__R1_VNNI)
        /* four indices as the words of one register: the qs bytes to the low bytes, qh's
         * four 3-bit fields to bits 8..10, by BMI2's pdep (as ggml's iq1_m dot) */
        const uint64_t x0 = _pdep_u64(fmoe__r1_le32(qs), 0x00FF00FF00FF00FFull) |
                            _pdep_u64(fmoe__r1_le16(qh) & 0x7777u, 0x0F000F000F000F00ull);
        const uint64_t x1 = _pdep_u64(fmoe__r1_le32(qs + 4), 0x00FF00FF00FF00FFull) |
                            _pdep_u64(fmoe__r1_le16(qh + 2) & 0x7777u, 0x0F000F000F000F00ull);
        const __m256i g0 = points4(fmoe__iq1s_grid, x0 & 0xFFFF, (x0 >> 16) & 0xFFFF, (x0 >> 32) & 0xFFFF, x0 >> 48);
        const __m256i g1 = points4(fmoe__iq1s_grid, x1 & 0xFFFF, (x1 >> 16) & 0xFFFF, (x1 >> 32) & 0xFFFF, x1 >> 48);
#else
        const unsigned h0 = qh[0], h1 = qh[1], h2 = qh[2], h3 = qh[3];
        const __m256i g0 = points4(fmoe__iq1s_grid, qs[0] | (h0 & 7) << 8, qs[1] | (h0 & 0x70) << 4,
                                   qs[2] | (h1 & 7) << 8, qs[3] | (h1 & 0x70) << 4);
        const __m256i g1 = points4(fmoe__iq1s_grid, qs[4] | (h2 & 7) << 8, qs[5] | (h2 & 0x70) << 4,
                                   qs[6] | (h3 & 7) << 8, qs[7] | (h3 & 0x70) << 4);
#endif
        const __m256i d0 = _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(dall, _mm256_set1_epi32(ib)), spread);
        const __m256i d1 = _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(dall, _mm256_set1_epi32(ib + 1)), spread);
        /* the codes 8g + δ as bytes (8g: eight with g's sign), |8g + δ| <= 9 */
        const __m256i c0 = _mm256_add_epi8(_mm256_sign_epi8(eight, g0), d0);
        const __m256i c1 = _mm256_add_epi8(_mm256_sign_epi8(eight, g1), d1);
        const __m256i ca0 = _mm256_abs_epi8(c0), ca1 = _mm256_abs_epi8(c1);
        /* with the bias, code + 16 (|code| <= 9) */
        const __m256i u0 = _mm256_add_epi8(c0, _mm256_set1_epi8(16)), u1 = _mm256_add_epi8(c1, _mm256_set1_epi8(16));
        _Pragma("GCC unroll 8") for (int k = 0; k < NX; k++) {
            const __m256i p0 = NX > 1 ? _mm256_maddubs_epi16(u0, QA(k, 0))
                                      : _mm256_maddubs_epi16(ca0, _mm256_sign_epi8(QA(k, 0), c0));
            const __m256i p1 = NX > 1 ? _mm256_maddubs_epi16(u1, QA(k, 32))
                                      : _mm256_maddubs_epi16(ca1, _mm256_sign_epi8(QA(k, 32), c1));
            acc0[k] = fmoe__r1_madd_pick(acc0[k], p0, scales, ib);
            acc1[k] = fmoe__r1_madd_pick(acc1[k], p1, scales, ib + 1);
        }
    }
    _Pragma("GCC unroll 8") for (int k = 0; k < NX; k++) v[k] = _mm256_add_epi32(acc0[k], acc1[k]);
}

/* ---------------------------------------------------------------------------------- */
/* The rows                                                                           */
/* ---------------------------------------------------------------------------------- */

/* The block vectors with the ROW macro's signature (no mins: m zero), one input, and with
 * FMOE__R1_ROWX's, NX inputs. */
#define VEC_QA(name)                                                                               \
    SIMD static INLINE __m256i name##_vec(const uint8_t *b, const uint8_t *a, __m256i *m) {        \
        *m = _mm256_setzero_si256();                                                               \
        __m256i v;                                                                                 \
        name(b, a, 0, 1, &v);                                                                      \
        return v;                                                                                  \
    }                                                                                              \
    SIMD static INLINE void name##_vecn(const uint8_t *b, const uint8_t *a, int64_t as, int NX,    \
                                        __m256i *v, __m256i *m) {                                  \
        _Pragma("GCC unroll 8") for (int k = 0; k < NX; k++) m[k] = _mm256_setzero_si256();                                \
        name(b, a, as, NX, v);                                                                     \
    }
VEC_QA(isum_iq2_xxs)
VEC_QA(isum_iq2_xs)
VEC_QA(isum_iq2_s)
VEC_QA(isum_iq3_xxs)
VEC_QA(isum_iq3_s)
VEC_QA(isum_iq1_s)
VEC_QA(isum_iq1_m)
#undef QA
#undef ACC0

SIMD static INLINE float d_iq3_xxs(const uint8_t *b) { return fmoe__r1_f16(b) * 0.25f; }
SIMD static INLINE float d_iq3_s(const uint8_t *b) { return fmoe__r1_f16(b); }
SIMD static INLINE float d_eighth(const uint8_t *b) { return fmoe__r1_f16(b) * 0.125f; }
SIMD static INLINE float d_iq1_m(const uint8_t *b) {
    const uint8_t *sc = b + 48;
    const uint16_t bits = (uint16_t)((fmoe__r1_le16(sc) >> 12) | ((fmoe__r1_le16(sc + 2) >> 8) & 0x00F0) |
                                     ((fmoe__r1_le16(sc + 4) >> 4) & 0x0F00) |
                                     (fmoe__r1_le16(sc + 6) & 0xF000));
    return _cvtsh_ss(bits) * 0.125f;
}
static INLINE float no_dmin(const uint8_t *b) {
    (void)b;
    return 0;
}

/* rows x one input, one loop per type: d as lib/quant_iq.c's fmoe__iq_block_d (the f16
 * scale times the type's power of two), dmin 0; EIGHT as lib/quant_rows1_avx2.h's
 * FMOE__R1_ROWS (the eight rows' d then by eight scalar conversions). */
#define ROWS(name, type, ISUM, D, EIGHT)                                                            \
    SIMD static INLINE void name##_d8(const uint8_t *b, int64_t rb, __m256 *d, __m256 *dmin) {     \
        *d = _mm256_setr_ps(D(b), D(b + rb), D(b + 2 * rb), D(b + 3 * rb), D(b + 4 * rb),          \
                            D(b + 5 * rb), D(b + 6 * rb), D(b + 7 * rb));                          \
        *dmin = _mm256_setzero_ps();                                                               \
    }                                                                                              \
    SIMD static void name(const uint8_t *W, int64_t row_bytes, int64_t rows, const uint8_t *qx,    \
                          int64_t n, float *y) {                                                   \
        const int64_t bytes = type##_BYTES;                                                        \
        FMOE__R1_ROWS(W, row_bytes, rows, qx, n / FMOE_QK_K, bytes, ISUM, D, no_dmin, name##_d8,   \
                      y, EIGHT);                                                                   \
    }                                                                                              \
    SIMD static void name##_x(const uint8_t *W, int64_t row_bytes, int64_t rows, const uint8_t *qx, \
                              int64_t astride, int32_t nx, int64_t n, float *y, int64_t ldy) {     \
        const int64_t bytes = type##_BYTES, nb = n / FMOE_QK_K;                                    \
        for (int32_t k = 0; k < nx;) {                                                             \
            const int g = fmoe__r1_group_max(nx - k, FMOE__R1_XMAX);                               \
            const uint8_t *a = qx + k * astride;                                                   \
            float *yk = y + k * ldy;                                                               \
            if (g == 1)                                                                            \
                name(W, row_bytes, rows, a, n, yk);                                                \
            else                                                                                   \
                for (int64_t r = 0; r < rows; r++) {                                               \
                    const uint8_t *w = W + r * row_bytes;                                          \
                    if (g == 8)                                                                    \
                        FMOE__R1_ROWX8(yk + r, ldy, w, a, astride, nb, bytes, ISUM##n, D, no_dmin); \
                    else if (g == 4)                                                               \
                        FMOE__R1_ROWX(yk + r, ldy, w, a, astride, 4, nb, bytes, ISUM##n, D,        \
                                      no_dmin);                                                    \
                    else if (g == 3)                                                               \
                        FMOE__R1_ROWX(yk + r, ldy, w, a, astride, 3, nb, bytes, ISUM##n, D,        \
                                      no_dmin);                                                    \
                    else                                                                           \
                        FMOE__R1_ROWX(yk + r, ldy, w, a, astride, 2, nb, bytes, ISUM##n, D,        \
                                      no_dmin);                                                    \
                }                                                                                  \
            k += g;                                                                                \
        }                                                                                          \
    }
ROWS(rows_iq2_xxs, FMOE_IQ2_XXS, isum_iq2_xxs_vec, d_eighth, 0)
ROWS(rows_iq2_xs, FMOE_IQ2_XS, isum_iq2_xs_vec, d_eighth, 0)
ROWS(rows_iq2_s, FMOE_IQ2_S, isum_iq2_s_vec, d_eighth, 0)
ROWS(rows_iq3_xxs, FMOE_IQ3_XXS, isum_iq3_xxs_vec, d_iq3_xxs, 0)
ROWS(rows_iq3_s, FMOE_IQ3_S, isum_iq3_s_vec, d_iq3_s, 0)
ROWS(rows_iq1_s, FMOE_IQ1_S, isum_iq1_s_vec, d_eighth, 0)
ROWS(rows_iq1_m, FMOE_IQ1_M, isum_iq1_m_vec, d_iq1_m, 0)

#if defined(FMOE__R1_VNNI)
/* The types with a scale per 32 values, eight inputs a pass: FMOE__R1_X8_ROWS (the inputs
 * in the lanes, lib/quant_rows1_avx2.h). Eight inputs, ps a multiply-add on the
 * development VM's EPYC, against the row-wise FMOE__R1_ROWX8: IQ3_S 22.1 -> 17.0, IQ3_XXS
 * 16.7 -> 13.6, IQ2_XXS 14.2 -> 10.8, IQ1_S 12.4 -> 10.6; whole-model prefill (one thread,
 * tests/bench/bench_types_vs_llama.py's files) 1.18x, 1.17x, 1.21x, 1.10x. Since then
 * the codes 64 at a time with the signs as a mask, and sub-block pairs in 512-bit registers
 * (lib/quant_rows1_avx2.h): IQ3_XXS 13.1 -> 10.3, IQ3_S 16.5 -> 11.7, IQ2_XXS 10.4 -> 8.7;
 * and the types with a scale per 16 values (HALVES) too: IQ2_XS 13.1 -> 9.5 (row-wise
 * before), IQ2_S 9.6 -> 9.0 (row-wise before), IQ1_M 12.6 -> 10.7; whole-model prefill
 * (64 tokens, one thread) IQ2_XS 805 -> 1056, IQ2_S 730 -> 980, IQ1_M 863 -> 1002 tokens/s.
 * Each sets gu[j] to sub-block j's 32 codes q = g·s (IQ1_S: 8g + δ) as q + 128 and
 * returns the scales 2ls + 1, scale j in dword j. */
SIMD static INLINE __m256i x8_scales(__m256i ls) {
    return _mm256_add_epi32(_mm256_add_epi32(ls, ls), _mm256_set1_epi32(1));
}

/* Sub-blocks 2p, 2p + 1's codes q + 128 from their grid values g and the mask of their
 * negative values: g + 128 (g < 128) or 128 - g, into gu[2p], gu[2p + 1]. */
SIMD static INLINE void x8_codes_pair(__m512i g, __mmask64 neg, __m256i *gu) {
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    const __m512i u = _mm512_mask_sub_epi8(_mm512_xor_si512(g, bias), neg, bias, g);
    gu[0] = _mm512_castsi512_si256(u);
    gu[1] = _mm512_extracti64x4_epi64(u, 1);
}

SIMD static INLINE __m256i codes8_iq2_xxs(const uint8_t *b, __m256i *gu, __m256i *sc2) {
    (void)sc2;
    const uint8_t *q = b + 2;
    _Pragma("GCC unroll 4")
    for (int p = 0; p < 4; p++, q += 16) {
        const __m512i g = g64_iq2_xxs(q);
        const uint64_t a2 = (uint64_t)fmoe__r1_le32(q + 4) | (uint64_t)fmoe__r1_le32(q + 12) << 32;
        x8_codes_pair(g, ksigns_mask64(sets_of_aux(a2)), gu + 2 * p);
    }
    return x8_scales(ls_iq2_xxs(b));
}

SIMD static INLINE __m256i codes8_iq3_xxs(const uint8_t *b, __m256i *gu, __m256i *sc2) {
    (void)sc2;
    const uint8_t *q = b + 2, *aux = b + 66;
    _Pragma("GCC unroll 4")
    for (int p = 0; p < 4; p++, q += 16, aux += 8) {
        const __m512i g = g64_iq3_xxs(q);
        uint64_t aux2;
        memcpy(&aux2, aux, 8);
        x8_codes_pair(g, ksigns_mask64(sets_of_aux(aux2)), gu + 2 * p);
    }
    return x8_scales(ls_iq3_xxs(b));
}

SIMD static INLINE __m256i codes8_iq3_s(const uint8_t *b, __m256i *gu, __m256i *sc2) {
    (void)sc2;
    const uint8_t *qs = b + 2, *qh = b + 66, *signs = b + 74;
    _Pragma("GCC unroll 4")
    for (int p = 0; p < 4; p++, qs += 16, signs += 8) {
        const unsigned h = fmoe__r1_le16(qh + 2 * p);
        const __m512i g = g64_iq3_s(qs, h);
        uint64_t neg;
        memcpy(&neg, signs, 8);
        x8_codes_pair(g, (__mmask64)neg, gu + 2 * p);
    }
    return x8_scales(ls_iq3_s(b));
}

SIMD static INLINE __m256i codes8_iq1_s(const uint8_t *b, __m256i *gu, __m256i *sc2) {
    (void)sc2;
    const uint8_t *qs = b + 2;
    _Pragma("GCC unroll 4")
    for (int p = 0; p < 4; p++, qs += 8) {
        const unsigned h0 = fmoe__r1_le16(b + 34 + 4 * p), h1 = fmoe__r1_le16(b + 36 + 4 * p);
        const __m512i g = g64_iq1_s(qs, h0, h1);
        /* 8g (g is -1, 0, 1: a 16-bit shift, the bits from the byte below cleared) plus
         * δ + 128, 127 where the sub-block's δ is -1 (bit 15 of its qh), else 129 */
        const __mmask64 minus = (h0 & 0x8000 ? 0xFFFFFFFFull : 0) | (h1 & 0x8000 ? 0xFFFFFFFF00000000ull : 0);
        const __m512i d = _mm512_mask_mov_epi8(_mm512_set1_epi8((char)129), minus, _mm512_set1_epi8(127));
        const __m512i u = _mm512_add_epi8(_mm512_and_si512(_mm512_slli_epi16(g, 3), _mm512_set1_epi8((char)0xF8)), d);
        gu[2 * p] = _mm512_castsi512_si256(u);
        gu[2 * p + 1] = _mm512_extracti64x4_epi64(u, 1);
    }
    return x8_scales(ls_iq1_s(b));
}

/* IQ1_M, a scale per 16 values (FMOE__R1_X8_ROWS's HALVES; sc2[0] holds scale 2j in dword
 * j, sc2[1] scale 2j + 1): eight inputs 14.4 -> 12.8 ps a multiply-add, whole-model
 * prefill 1.045x, when the dots were 256-bit. */
SIMD static INLINE __m256i codes8_iq1_m(const uint8_t *b, __m256i *gu, __m256i *sc2) {
    const uint8_t *qs = b, *qh = b + 32;
    const __m256i dall = iq1_m_deltas(qh); /* δ of group k (8 values) as byte k */
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i eight = _mm256_set1_epi8(8);
    _Pragma("GCC unroll 8")
    for (int j = 0; j < 8; j++, qs += 4, qh += 2) {
        const uint64_t x = _pdep_u64(fmoe__r1_le32(qs), 0x00FF00FF00FF00FFull) |
                           _pdep_u64(fmoe__r1_le16(qh) & 0x7777u, 0x0F000F000F000F00ull);
        const __m256i g = points4(fmoe__iq1s_grid, x & 0xFFFF, (x >> 16) & 0xFFFF, (x >> 32) & 0xFFFF, x >> 48);
        const __m256i d = _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(dall, _mm256_set1_epi32(j)), spread);
        gu[j] = _mm256_xor_si256(_mm256_add_epi8(_mm256_sign_epi8(eight, g), d), _mm256_set1_epi8((char)0x80));
    }
    /* scale s: bits 3(s % 4) of word s / 4; sub-block j's are s = 2j, 2j + 1 */
    const __m256i words = _mm256_permutevar8x32_epi32(_mm256_cvtepu16_epi32(_mm_loadl_epi64((const __m128i *)(b + 48))),
                                                      _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3));
    const __m256i sh = _mm256_setr_epi32(0, 6, 0, 6, 0, 6, 0, 6), m7 = _mm256_set1_epi32(7);
    sc2[0] = x8_scales(_mm256_and_si256(_mm256_srlv_epi32(words, sh), m7));
    sc2[1] = x8_scales(_mm256_and_si256(_mm256_srlv_epi32(words, _mm256_add_epi32(sh, _mm256_set1_epi32(3))), m7));
    return sc2[0];
}

/* IQ2_XS and IQ2_S, a scale per 16 values (HALVES), their codes 64 at a time with the
 * signs as a mask: IQ2_XS's sets by pext into ksigns_mask64, IQ2_S's stored bits as they
 * are. The 16-value scales: nibble 2j of the bytes at p for sub-block j's first half,
 * 2j + 1 for its second. */
SIMD static INLINE void x8_nibble_scales(const uint8_t *p, __m256i *sc2) {
    const __m256i bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    sc2[0] = x8_scales(_mm256_and_si256(bytes, _mm256_set1_epi32(15)));
    sc2[1] = x8_scales(_mm256_srli_epi32(bytes, 4));
}

SIMD static INLINE __m256i codes8_iq2_xs(const uint8_t *b, __m256i *gu, __m256i *sc2) {
    const uint8_t *q = b + 2;
    _Pragma("GCC unroll 4")
    for (int p = 0; p < 4; p++, q += 16) {
        x8_codes_pair(g64_iq2_xs(q), ksigns_mask64(sets_iq2_xs(q)), gu + 2 * p);
    }
    x8_nibble_scales(b + 66, sc2);
    return sc2[0];
}

SIMD static INLINE __m256i codes8_iq2_s(const uint8_t *b, __m256i *gu, __m256i *sc2) {
    const uint8_t *qs = b + 2, *signs = b + 34, *qh = b + 66;
    _Pragma("GCC unroll 4")
    for (int p = 0; p < 4; p++, qs += 8, signs += 8) {
        const __m512i g = g64_iq2_s(qs, qh[2 * p], qh[2 * p + 1]);
        uint64_t neg;
        memcpy(&neg, signs, 8);
        x8_codes_pair(g, (__mmask64)neg, gu + 2 * p);
    }
    x8_nibble_scales(b + 74, sc2);
    return sc2[0];
}

FMOE__R1_X8_ROWS(rows8_iq2_xs, FMOE_IQ2_XS_BYTES, codes8_iq2_xs, d_eighth, 1)
FMOE__R1_X8_ROWS(rows8_iq2_s, FMOE_IQ2_S_BYTES, codes8_iq2_s, d_eighth, 1)
FMOE__R1_X8_ROWSX(rows_iq2_xs_x_x8, rows8_iq2_xs, rows_iq2_xs_x)
FMOE__R1_X8_ROWSX(rows_iq2_s_x_x8, rows8_iq2_s, rows_iq2_s_x)
FMOE__R1_X8_ROWS(rows8_iq2_xxs, FMOE_IQ2_XXS_BYTES, codes8_iq2_xxs, d_eighth, 0)
FMOE__R1_X8_ROWS(rows8_iq1_m, FMOE_IQ1_M_BYTES, codes8_iq1_m, d_iq1_m, 1)
FMOE__R1_X8_ROWS(rows8_iq3_xxs, FMOE_IQ3_XXS_BYTES, codes8_iq3_xxs, d_iq3_xxs, 0)
FMOE__R1_X8_ROWS(rows8_iq3_s, FMOE_IQ3_S_BYTES, codes8_iq3_s, d_iq3_s, 0)
FMOE__R1_X8_ROWS(rows8_iq1_s, FMOE_IQ1_S_BYTES, codes8_iq1_s, d_eighth, 0)
FMOE__R1_X8_ROWSX(rows_iq2_xxs_x_x8, rows8_iq2_xxs, rows_iq2_xxs_x)
FMOE__R1_X8_ROWSX(rows_iq3_xxs_x_x8, rows8_iq3_xxs, rows_iq3_xxs_x)
FMOE__R1_X8_ROWSX(rows_iq3_s_x_x8, rows8_iq3_s, rows_iq3_s_x)
FMOE__R1_X8_ROWSX(rows_iq1_s_x_x8, rows8_iq1_s, rows_iq1_s_x)
FMOE__R1_X8_ROWSX(rows_iq1_m_x_x8, rows8_iq1_m, rows_iq1_m_x)
#define X8(name) name##_x8
#else
#define X8(name) name
#endif

void FMOE__R1_ENTRY(fmoe__iq_rows1_avx2)(uint32_t type, const void *W, int64_t row_bytes,
                                         int64_t rows, const void *qx, int64_t n, float *y) {
    switch (type) {
    case FMOE_GGML_IQ2_XXS: rows_iq2_xxs(W, row_bytes, rows, qx, n, y); return;
    case FMOE_GGML_IQ2_XS: rows_iq2_xs(W, row_bytes, rows, qx, n, y); return;
    case FMOE_GGML_IQ2_S: rows_iq2_s(W, row_bytes, rows, qx, n, y); return;
    case FMOE_GGML_IQ3_XXS: rows_iq3_xxs(W, row_bytes, rows, qx, n, y); return;
    case FMOE_GGML_IQ3_S: rows_iq3_s(W, row_bytes, rows, qx, n, y); return;
    case FMOE_GGML_IQ1_S: rows_iq1_s(W, row_bytes, rows, qx, n, y); return;
    case FMOE_GGML_IQ1_M: rows_iq1_m(W, row_bytes, rows, qx, n, y); return;
    default: FMOE_ASSERT(!"fmoe__iq_rows1_avx2: not a codebook i-quant");
    }
}

/* rows x nx inputs (astride bytes apart) into y[k·ldy + r]: passes of up to four inputs,
 * eight in the VNNI build, over each row (fmoe__r1_group_max), each input its one-input
 * bits. */
void FMOE__R1_ENTRY(fmoe__iq_rowsx_avx2)(uint32_t type, const void *W, int64_t row_bytes,
                                         int64_t rows, const void *qx, int64_t astride, int32_t nx,
                                         int64_t n, float *y, int64_t ldy) {
    switch (type) {
    case FMOE_GGML_IQ2_XXS: X8(rows_iq2_xxs_x)(W, row_bytes, rows, qx, astride, nx, n, y, ldy); return;
    case FMOE_GGML_IQ2_XS: X8(rows_iq2_xs_x)(W, row_bytes, rows, qx, astride, nx, n, y, ldy); return;
    case FMOE_GGML_IQ2_S: X8(rows_iq2_s_x)(W, row_bytes, rows, qx, astride, nx, n, y, ldy); return;
    case FMOE_GGML_IQ3_XXS: X8(rows_iq3_xxs_x)(W, row_bytes, rows, qx, astride, nx, n, y, ldy); return;
    case FMOE_GGML_IQ3_S: X8(rows_iq3_s_x)(W, row_bytes, rows, qx, astride, nx, n, y, ldy); return;
    case FMOE_GGML_IQ1_S: X8(rows_iq1_s_x)(W, row_bytes, rows, qx, astride, nx, n, y, ldy); return;
    case FMOE_GGML_IQ1_M: X8(rows_iq1_m_x)(W, row_bytes, rows, qx, astride, nx, n, y, ldy); return;
    default: FMOE_ASSERT(!"fmoe__iq_rowsx_avx2: not a codebook i-quant");
    }
}
#undef X8

#else /* no AVX2 level, so never called: the reference, under both compilations' names */
void FMOE__R1_ENTRY(fmoe__iq_rows1_avx2)(uint32_t type, const void *W, int64_t row_bytes,
                                         int64_t rows, const void *qx, int64_t n, float *y) {
    for (int64_t r = 0; r < rows; r++)
        y[r] = fmoe__quant_act_dot_kx(type, (const uint8_t *)W + r * row_bytes, qx, n,
                                      FMOE__QUANT_PLAIN);
}

void FMOE__R1_ENTRY(fmoe__iq_rowsx_avx2)(uint32_t type, const void *W, int64_t row_bytes,
                                         int64_t rows, const void *qx, int64_t astride, int32_t nx,
                                         int64_t n, float *y, int64_t ldy) {
    for (int32_t k = 0; k < nx; k++)
        FMOE__R1_ENTRY(fmoe__iq_rows1_avx2)(type, W, row_bytes, rows,
                                            (const uint8_t *)qx + k * astride, n, y + k * ldy);
}

#endif
