/*
 * quant_iq.c - ggml's codebook quants ("i-quants") IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S,
 * IQ1_S and IQ1_M, read as blocks of 256 values (fmoe/quant.h; IQ4_NL and IQ4_XS, which
 * have no codebook, are lib/quant_block.h's).
 *
 * Each block is unpacked into the shape lib/quant_kx.c computes with (fmoe__kx_block):
 * 256 signed byte codes, sixteen integer scales (one per 16 values) and one f32 factor d,
 * value = (d·sc)·q. That one shape serves the dequantisation and every dot (f32 and 8-bit
 * activations, at every CPU kernel level): the i-quants then need no CPU kernels of their
 * own. (The CUDA backend computes a grid point at a time instead: lib/quant_iq_block.h.)
 * This file is the plain-C unpack (the reference); lib/quant_iq_avx2.c writes the same
 * bytes with AVX2 for the AVX2 and AVX-512 levels; a row times one 8-bit input takes
 * lib/quant_iq_dot_avx2.c's kernels, which never write the unpacked block.
 *
 * The formats (ggml-common.h's block_iq*; ggml-quants.c's dequantize_row_iq*): groups of
 * 8 values (4 for IQ3) are one grid point of lib/iq_grids.h (all values positive for
 * IQ2/IQ3, with 8 separately stored signs), under a 4-bit scale ls per 32 or 16 values.
 * ggml's value formulas and ours:
 *   IQ2_XXS/XS/S  d·(0.5 + ls)·0.25·g·s      = (d/8)·(2ls + 1)·(g·s)
 *   IQ3_XXS       d·(0.5 + ls)·0.5·g·s       = (d/4)·(2ls + 1)·(g·s)
 *   IQ3_S         d·(1 + 2ls)·g·s            =  d   ·(2ls + 1)·(g·s)
 *   IQ1_S         d·(2ls + 1)·(g ± 1/8)      = (d/8)·(2ls + 1)·(8g ± 1)   (ls 3 bits)
 *   IQ1_M         the same per 16 values, its d spread over the scale words' top nibbles
 * with g a grid value, s = ±1. The right-hand sides are equal to ggml's (and gguf-py's)
 * f32 results bit for bit, not just in value: the factors moved are powers of two, and
 * scaling by a power of two commutes with rounding to f32 as long as nothing leaves the
 * normal range (an f16 d over 8 is at least 2^-27, a normal f32), so d·(0.5 + ls)·0.25,
 * rounded, is exactly (d/8)·(2ls + 1) rounded; and multiplying by s, or by 1/8 inside
 * g ± 1/8, only moves the sign or the exponent. tests/python/test_gguf_iquants.py checks it
 * over random blocks against gguf-py's dequantiser.
 *
 * With codes 8g ± 1 the IQ1 types' ± 1/8 offset (ggml's IQ1S_DELTA) rides in the integer
 * codes: their 8-bit dots need no activation sums. Every code fits a signed byte
 * (|q| <= 62, IQ3_XXS's largest level), which the maddubs kernels need.
 */
#include <stdint.h>
#include <string.h>

#include "fmoe/quant.h"
#include "iq_grids.h"
#include "quant_impl.h"

static inline uint16_t le16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

/* ggml's ksigns_iq2xs: 7 stored sign bits, the eighth making the count of minus signs
 * even (the quantiser only writes such patterns), bit j set: value j negative. */
static inline uint8_t ksigns(uint32_t seven) {
    seven &= 127;
    return (uint8_t)(seven | ((uint32_t)__builtin_parity(seven) << 7));
}

/* Eight grid values are handled as one uint64, byte j value j (lib/iq_grids.h), with byte
 * arithmetic that never carries from one byte into the next: cheaper than eight separate
 * values in plain C, and what the compiler keeps in one register. */
#define ONES64 0x0101010101010101ull

/* The 8 bytes of v into q[0..8), byte j to q[j]. */
static inline void store8(int8_t *q, uint64_t v) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    memcpy(q, &v, 8);
#else
    for (int j = 0; j < 8; j++) q[j] = (int8_t)(uint8_t)(v >> (8 * j));
#endif
}

/* 0xFF in byte j where bit j of `bits` is set, else 0x00: bit j isolated in byte j by a
 * multiply and mask, then moved to the byte's top bit by adding 0x7F (no carry: the byte
 * is at most 0x80), to its low bit by a shift, and spread over the byte. */
static inline uint64_t byte_mask8(uint8_t bits) {
    const uint64_t x = ((uint64_t)bits * ONES64) & 0x8040201008040201ull;
    return (((x + 0x7F7F7F7F7F7F7F7Full) >> 7) & ONES64) * 0xFF;
}

/* Grid values (positive, below 128) negated where the mask byte is 0xFF: -g = ~g + 1, and
 * ~g + 1 <= 0xF8 never carries. */
static inline uint64_t negate_where(uint64_t g, uint64_t m) { return (g ^ m) + (m & ONES64); }

/* 8 grid values of `point` into q, each negated where its bit of `signs` is set. */
static inline void put_signed8(int8_t *q, uint64_t point, uint8_t signs) {
    store8(q, negate_where(point, byte_mask8(signs)));
}

/* Two 4-value points (IQ3) into q[0..8), value j negated where bit j of `signs` is set. */
static inline void put_signed4x2(int8_t *q, uint32_t lo, uint32_t hi, uint8_t signs) {
    put_signed8(q, (uint64_t)lo | ((uint64_t)hi << 32), signs);
}

/* 8 IQ1 grid values (-1, 0, 1 as signed bytes) of `point` into q as 8g + 1, or 8g - 1
 * when `minus` (ggml's delta -IQ1S_DELTA). 8g is the bytes shifted left 3 with what
 * crossed into the next byte masked off; 8g + 1 sets the low bit 8g leaves clear; and
 * 8g - 1 = ~(8·(-g)), -g swapping the bytes 0x01 and 0xFF (an XOR with 0xFE where the
 * low bit is set). */
static inline void put_iq1(int8_t *q, uint64_t point, int minus) {
    const uint64_t low3 = 0xF8F8F8F8F8F8F8F8ull;
    if (!minus) {
        store8(q, ((point << 3) & low3) | ONES64);
        return;
    }
    const uint64_t neg = point ^ ((point & ONES64) * 0xFE);
    store8(q, ~((neg << 3) & low3));
}

/* Both 16-value scales of 32-value group ib set to sc. */
static inline void scale32(fmoe__kx_block *u, int ib, int sc) {
    u->sc[2 * ib] = u->sc[2 * ib + 1] = (int16_t)sc;
}

/* The 4-bit scale of 16-value sub-block s from a nibble-per-scale array (IQ2_XS, IQ2_S). */
static inline int16_t nibble_scale(const uint8_t *scales, int s) {
    return (int16_t)(2 * ((scales[s / 2] >> (4 * (s & 1))) & 0xF) + 1);
}

/* IQ1_M's f16 d: the top nibbles of its four scale words, lowest word first. */
static uint16_t iq1_m_d_bits(const uint8_t *b) {
    const uint8_t *sc = b + 48;
    return (uint16_t)((le16(sc) >> 12) | ((le16(sc + 2) >> 8) & 0x00F0) |
                      ((le16(sc + 4) >> 4) & 0x0F00) | (le16(sc + 6) & 0xF000));
}

/* The codes of each type (below: signed grid values, IQ1's 8g ± 1) are written by
 * iq_codes here and by lib/quant_iq_avx2.c; the scales and d, sixteen small integers and
 * one float, by fmoe__iq_scales (and, the integers, lib/quant_iq_avx2.c again). */
float fmoe__iq_block_d(uint32_t type, const uint8_t *b) {
    switch (type) {
    case FMOE_GGML_IQ3_XXS: return fmoe__qblock_f16(b) * 0.25f;
    case FMOE_GGML_IQ3_S: return fmoe__qblock_f16(b);
    case FMOE_GGML_IQ1_M: return fmoe_half_to_float(iq1_m_d_bits(b)) * 0.125f;
    default: return fmoe__qblock_f16(b) * 0.125f; /* the IQ2 types, IQ1_S */
    }
}

void fmoe__iq_scales(uint32_t type, const uint8_t *b, fmoe__kx_block *u) {
    memset(u->m, 0, sizeof u->m);
    u->dmin = 0;
    u->d = fmoe__iq_block_d(type, b);
    switch (type) {
    case FMOE_GGML_IQ2_XXS: /* the top 4 bits of each 32 values' sign word */
        for (int ib = 0; ib < 8; ib++) scale32(u, ib, 2 * (int)(le32(b + 6 + 8 * ib) >> 28) + 1);
        return;
    case FMOE_GGML_IQ2_XS:
        for (int s = 0; s < 16; s++) u->sc[s] = nibble_scale(b + 66, s);
        return;
    case FMOE_GGML_IQ2_S:
        for (int s = 0; s < 16; s++) u->sc[s] = nibble_scale(b + 74, s);
        return;
    case FMOE_GGML_IQ3_XXS: /* as IQ2_XXS, the sign words after the 64 index bytes */
        for (int ib = 0; ib < 8; ib++) scale32(u, ib, 2 * (int)(le32(b + 66 + 4 * ib) >> 28) + 1);
        return;
    case FMOE_GGML_IQ3_S: /* a 4-bit scale per 32 values */
        for (int ib = 0; ib < 8; ib++) scale32(u, ib, nibble_scale(b + 106, ib));
        return;
    case FMOE_GGML_IQ1_S: /* bits 12-14 of each 32 values' qh */
        for (int ib = 0; ib < 8; ib++) scale32(u, ib, 2 * ((le16(b + 34 + 2 * ib) >> 12) & 7) + 1);
        return;
    case FMOE_GGML_IQ1_M: /* 3 bits per 16 values, four to a scale word */
        for (int s = 0; s < 16; s++)
            u->sc[s] = (int16_t)(2 * ((le16(b + 48 + 2 * (s / 4)) >> (3 * (s % 4))) & 7) + 1);
        return;
    default: return;
    }
}

static void codes_iq2_xxs(const uint8_t *b, int8_t *q) {
    /* per 32 values, 8 bytes: 4 grid indices, then a uint32 of four 7-bit sign sets and
     * the 4-bit scale on top */
    for (int ib = 0; ib < 8; ib++) {
        const uint8_t *g = b + 2 + 8 * ib;
        const uint32_t aux = le32(g + 4);
        for (int l = 0; l < 4; l++)
            put_signed8(q + 32 * ib + 8 * l, fmoe__iq2xxs_grid[g[l]], ksigns(aux >> (7 * l)));
    }
}

static void codes_iq2_xs(const uint8_t *b, int8_t *q) {
    /* per 8 values a uint16: 9-bit grid index, 7 sign bits; a 4-bit scale per 16 */
    for (int k = 0; k < 32; k++) {
        const uint16_t v = le16(b + 2 + 2 * k);
        put_signed8(q + 8 * k, fmoe__iq2xs_grid[v & 511], ksigns(v >> 9));
    }
}

static void codes_iq2_s(const uint8_t *b, int8_t *q) {
    /* per 8 values: the low 8 bits of a 10-bit index in qs[k], its top 2 bits in
     * qh[k / 4] (bits 2(k % 4)), and 8 plain sign bits in qs[32 + k] */
    const uint8_t *qs = b + 2, *signs = b + 34, *qh = b + 66;
    for (int k = 0; k < 32; k++) {
        const int idx = qs[k] | (((qh[k / 4] >> (2 * (k % 4))) & 3) << 8);
        put_signed8(q + 8 * k, fmoe__iq2s_grid[idx], signs[k]);
    }
}

static void codes_iq3_xxs(const uint8_t *b, int8_t *q) {
    /* a grid index (4 values) a byte; per 32 values a uint32 of four 7-bit sign sets (one
     * per 8 values) and the 4-bit scale on top */
    const uint8_t *qs = b + 2;
    for (int ib = 0; ib < 8; ib++) {
        const uint32_t aux = le32(b + 66 + 4 * ib);
        for (int l = 0; l < 4; l++)
            put_signed4x2(q + 32 * ib + 8 * l, fmoe__iq3xxs_grid[qs[8 * ib + 2 * l]],
                          fmoe__iq3xxs_grid[qs[8 * ib + 2 * l + 1]], ksigns(aux >> (7 * l)));
    }
}

static void codes_iq3_s(const uint8_t *b, int8_t *q) {
    /* per 4 values a 9-bit index: qs[k] and bit k % 8 of qh[k / 8]; sign bits 8 a byte;
     * a 4-bit scale per 32 values */
    const uint8_t *qs = b + 2, *qh = b + 66, *signs = b + 74;
    for (int k = 0; k < 64; k += 2) {
        const int lo = qs[k] | (((qh[k / 8] >> (k % 8)) & 1) << 8);
        const int hi = qs[k + 1] | (((qh[k / 8] >> (k % 8 + 1)) & 1) << 8);
        put_signed4x2(q + 4 * k, fmoe__iq3s_grid[lo], fmoe__iq3s_grid[hi], signs[k / 2]);
    }
}

static void codes_iq1_s(const uint8_t *b, int8_t *q) {
    /* per 32 values a uint16 qh: four 3-bit index tops, a 3-bit scale, the delta's sign;
     * per 8 values the index's low 8 bits in qs */
    const uint8_t *qs = b + 2;
    for (int ib = 0; ib < 8; ib++) {
        const uint16_t qh = le16(b + 34 + 2 * ib);
        for (int l = 0; l < 4; l++) {
            const int idx = qs[4 * ib + l] | (((qh >> (3 * l)) & 7) << 8);
            put_iq1(q + 32 * ib + 8 * l, fmoe__iq1s_grid[idx], qh & 0x8000);
        }
    }
}

static void codes_iq1_m(const uint8_t *b, int8_t *q) {
    /* per 8 values: index low bits in qs[k], a nibble of qh (k even: low) holding the
     * index's top 3 bits and the delta's sign (bit 3); a 3-bit scale per 16 values,
     * four to a scale word */
    const uint8_t *qs = b, *qh = b + 32;
    for (int k = 0; k < 32; k++) {
        const int nib = (qh[k / 2] >> (4 * (k & 1))) & 0xF;
        put_iq1(q + 8 * k, fmoe__iq1s_grid[qs[k] | ((nib & 7) << 8)], nib & 8);
    }
}

static void iq_codes(uint32_t type, const uint8_t *b, int8_t *q) {
    switch (type) {
    case FMOE_GGML_IQ2_XXS: codes_iq2_xxs(b, q); return;
    case FMOE_GGML_IQ2_XS: codes_iq2_xs(b, q); return;
    case FMOE_GGML_IQ2_S: codes_iq2_s(b, q); return;
    case FMOE_GGML_IQ3_XXS: codes_iq3_xxs(b, q); return;
    case FMOE_GGML_IQ3_S: codes_iq3_s(b, q); return;
    case FMOE_GGML_IQ1_S: codes_iq1_s(b, q); return;
    case FMOE_GGML_IQ1_M: codes_iq1_m(b, q); return;
    default: return;
    }
}

void fmoe__iq_unpack(uint32_t type, const uint8_t *b, fmoe__kx_block *u) {
    iq_codes(type, b, u->q);
    fmoe__iq_scales(type, b, u);
}

float fmoe__iq_d(uint32_t type, const uint8_t *b) {
    return type == FMOE_GGML_IQ1_M ? fmoe_half_to_float(iq1_m_d_bits(b)) : fmoe__qblock_f16(b);
}

void fmoe__iq_values(uint32_t type, const uint8_t *b, float *y) {
    fmoe__kx_block u;
    fmoe__iq_unpack(type, b, &u);
    for (int s = 0; s < 16; s++) {
        const float dl = u.d * (float)u.sc[s];
        for (int i = 0; i < 16; i++) y[16 * s + i] = dl * (float)u.q[16 * s + i];
    }
}
