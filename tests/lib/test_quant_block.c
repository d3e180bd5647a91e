/*
 * test_quant_block.c - lib/quant_block.h, the block formulas the CPU and the CUDA kernels
 * share, on the host: fmoe__qblock_dequant8 (the 8 values one GPU thread computes) equals
 * fmoe_quant_dequantize_row bit for bit for every group of every block, and both equal an
 * independent transcription of ggml's dequantize_row_q*_K loops (the order in which ggml
 * walks a block, which quant_block.h does not follow). Blocks are random bytes: any
 * scale, subnormal, infinite or NaN included, compared as bit patterns.
 * (tests/python/test_gguf_quants.py checks fmoe_quant_dequantize_row against gguf-py.)
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "half.h"
#include "fmoe/quant.h"
#include "harness.h"
#include "quant_block.h"

static uint64_t rng = 0x243f6a8885a308d3ull;
static uint8_t rnd8(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint8_t)(rng >> 24);
}

static const uint32_t types[] = {FMOE_GGML_Q8_0, FMOE_GGML_Q4_K, FMOE_GGML_Q5_K,
                                 FMOE_GGML_Q6_K, FMOE_GGML_Q4_0, FMOE_GGML_Q4_1,
                                 FMOE_GGML_Q5_0, FMOE_GGML_Q5_1, FMOE_GGML_IQ4_NL,
                                 FMOE_GGML_MXFP4, FMOE_GGML_Q2_K, FMOE_GGML_Q3_K,
                                 FMOE_GGML_IQ4_XS, FMOE_GGML_IQ2_XXS, FMOE_GGML_IQ2_XS,
                                 FMOE_GGML_IQ2_S, FMOE_GGML_IQ3_XXS, FMOE_GGML_IQ3_S,
                                 FMOE_GGML_IQ1_S, FMOE_GGML_IQ1_M};
/* The i-quants: the row's values come from lib/quant_iq.c (byte tricks over whole
 * blocks, checked against gguf-py by tests/python/test_gguf_iquants.py), the groups of 8
 * from lib/quant_iq_block.h; ggml_block has no transcription of them. */
#define FIRST_IQ 13
#define NTYPES (int)(sizeof types / sizeof types[0])

static float f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return fmoe_half_to_float(h);
}

/* Offset of a block's f16 d (the field the test sets to a modest scale). */
static int d_at(uint32_t type) {
    return type == FMOE_GGML_Q6_K   ? 208
           : type == FMOE_GGML_Q2_K ? 80
           : type == FMOE_GGML_Q3_K ? 108
                                    : 0;
}

static const int8_t iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                 1,    13,   25,  38,  53,  69,  89,  113};

/* ggml's dequantize_row_q2_K, q3_K and iq4_xs for one block (ggml-quants.c: the walk in
 * halves of 128 and shifts, and Q3_K's scales unpacked through four uint32 words). */
static void ggml_block_kx(uint32_t type, const uint8_t *b, float *y) {
    if (type == FMOE_GGML_Q2_K) {
        const float d = f16(b + 80), min = f16(b + 82);
        const uint8_t *q = b + 16;
        int is = 0;
        for (int n = 0; n < 256; n += 128, q += 32)
            for (int j = 0, shift = 0; j < 4; j++, shift += 2)
                for (int half = 0; half < 2; half++) {
                    const uint8_t sc = b[is++];
                    const float dl = d * (sc & 0xF), ml = min * (sc >> 4);
                    for (int l = 0; l < 16; l++)
                        *y++ = dl * (int8_t)((q[l + 16 * half] >> shift) & 3) - ml;
                }
    } else if (type == FMOE_GGML_Q3_K) {
        const uint32_t kmask1 = 0x03030303, kmask2 = 0x0f0f0f0f;
        uint32_t aux[4];
        memcpy(aux, b + 96, 12);
        const uint32_t tmp = aux[2];
        aux[2] = ((aux[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
        aux[3] = ((aux[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
        aux[0] = (aux[0] & kmask2) | (((tmp >> 0) & kmask1) << 4);
        aux[1] = (aux[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
        int8_t scales[16];
        memcpy(scales, aux, 16);
        const float d_all = f16(b + 108);
        const uint8_t *q = b + 32, *hm = b;
        uint8_t m = 1;
        int is = 0;
        for (int n = 0; n < 256; n += 128, q += 32)
            for (int j = 0, shift = 0; j < 4; j++, shift += 2, m <<= 1)
                for (int half = 0; half < 2; half++) {
                    const float dl = d_all * (scales[is++] - 32);
                    for (int l = 16 * half; l < 16 * half + 16; l++)
                        *y++ = dl * ((int8_t)((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4));
                }
    } else { /* IQ4_XS */
        const float d = f16(b);
        const uint16_t scales_h = (uint16_t)(b[2] | (b[3] << 8));
        const uint8_t *qs = b + 8;
        for (int ib = 0; ib < 8; ib++, y += 32, qs += 16) {
            const int ls =
                ((b[4 + ib / 2] >> 4 * (ib % 2)) & 0xf) | (((scales_h >> 2 * ib) & 3) << 4);
            const float dl = d * (ls - 32);
            for (int j = 0; j < 16; j++) {
                y[j] = dl * iq4nl[qs[j] & 0xf];
                y[j + 16] = dl * iq4nl[qs[j] >> 4];
            }
        }
    }
}

/* ggml's loops (ggml-quants.c, dequantize_row_*), one block into y. */
static void ggml_block(uint32_t type, const uint8_t *b, float *y) {
    if (type == FMOE_GGML_Q2_K || type == FMOE_GGML_Q3_K || type == FMOE_GGML_IQ4_XS) {
        ggml_block_kx(type, b, y);
    } else if (type == FMOE_GGML_Q4_0 || type == FMOE_GGML_IQ4_NL) {
        const float d = f16(b);
        for (int j = 0; j < 16; j++) {
            const int x0 = b[2 + j] & 0x0F, x1 = b[2 + j] >> 4;
            y[j] = type == FMOE_GGML_IQ4_NL ? d * iq4nl[x0] : (float)(x0 - 8) * d;
            y[j + 16] = type == FMOE_GGML_IQ4_NL ? d * iq4nl[x1] : (float)(x1 - 8) * d;
        }
    } else if (type == FMOE_GGML_Q4_1) {
        const float d = f16(b), m = f16(b + 2);
        for (int j = 0; j < 16; j++) {
            y[j] = (float)(b[4 + j] & 0x0F) * d + m;
            y[j + 16] = (float)(b[4 + j] >> 4) * d + m;
        }
    } else if (type == FMOE_GGML_Q5_0 || type == FMOE_GGML_Q5_1) {
        const int one = type == FMOE_GGML_Q5_1;
        const float d = f16(b), m = one ? f16(b + 2) : 0.f;
        uint32_t qh;
        memcpy(&qh, b + (one ? 4 : 2), 4);
        const uint8_t *qs = b + (one ? 8 : 6);
        for (int j = 0; j < 16; j++) {
            const int xh0 = ((qh >> j) << 4) & 0x10, xh1 = (qh >> (j + 12)) & 0x10;
            const int x0 = (qs[j] & 0x0F) | xh0, x1 = (qs[j] >> 4) | xh1;
            y[j] = one ? (float)x0 * d + m : (float)(x0 - 16) * d;
            y[j + 16] = one ? (float)x1 * d + m : (float)(x1 - 16) * d;
        }
    } else if (type == FMOE_GGML_MXFP4) { /* dequantize_row_mxfp4, ggml_e8m0_to_fp32_half */
        static const int8_t kvalues_mxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12,
                                                 0, -1, -2, -3, -4, -6, -8, -12};
        const uint32_t bits = b[0] < 2 ? 0x00200000u << b[0] : (uint32_t)(b[0] - 1) << 23;
        float d;
        memcpy(&d, &bits, 4);
        for (int j = 0; j < 16; j++) {
            const int8_t x0 = kvalues_mxfp4[b[1 + j] & 0x0F], x1 = kvalues_mxfp4[b[1 + j] >> 4];
            y[j] = x0 * d;
            y[j + 16] = x1 * d;
        }
    } else if (type == FMOE_GGML_Q8_0) {
        const float d = f16(b);
        for (int i = 0; i < 32; i++) y[i] = (float)(int8_t)b[2 + i] * d;
    } else if (type == FMOE_GGML_Q4_K || type == FMOE_GGML_Q5_K) {
        const float d = f16(b), dmin = f16(b + 2);
        const uint8_t *sc = b + 4, *qh = b + 16;
        const uint8_t *q = type == FMOE_GGML_Q4_K ? b + 16 : b + 48;
        for (int j = 0; j < 8; j += 2, q += 32, y += 64) {
            uint8_t s, m;
            fmoe__scale_min_k4(j, sc, &s, &m);
            const float d1 = d * s, m1 = dmin * m;
            fmoe__scale_min_k4(j + 1, sc, &s, &m);
            const float d2 = d * s, m2 = dmin * m;
            for (int l = 0; l < 32; l++) {
                int lo = q[l] & 0xF, hi = q[l] >> 4;
                if (type == FMOE_GGML_Q5_K) {
                    lo += ((qh[l] >> j) & 1) * 16;
                    hi += ((qh[l] >> (j + 1)) & 1) * 16;
                }
                y[l] = d1 * (float)lo - m1;
                y[32 + l] = d2 * (float)hi - m2;
            }
        }
    } else {
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        const float d = f16(b + 208);
        for (int half = 0; half < 2; half++, y += 128, ql += 64, qh += 32, sc += 8)
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                y[l] = d * sc[is] * (float)(((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32);
                y[l + 32] =
                    d * sc[is + 2] * (float)(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
                y[l + 64] =
                    d * sc[is + 4] * (float)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
                y[l + 96] =
                    d * sc[is + 6] * (float)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
            }
    }
}

/* The first value whose bits differ, or -1. */
static int first_diff(const float *a, const float *b, int n) {
    for (int i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof *a) != 0) return i;
    return -1;
}

TEST(block_geometry_matches_the_type_table) {
    for (int t = 0; t < NTYPES; t++) {
        ASSERT_EQ(fmoe__qblock_values(types[t]), fmoe_ggml_block_size(types[t]));
        ASSERT_EQ(fmoe__qblock_bytes(types[t]), fmoe_ggml_type_size(types[t]));
    }
    /* the float types and every other quant have no formula here */
    ASSERT_EQ(fmoe__qblock_values(FMOE_GGML_F32), 0);
    ASSERT_EQ(fmoe__qblock_values(FMOE_GGML_BF16), 0);
    ASSERT_EQ(fmoe__qblock_values(FMOE_GGML_TQ1_0), 0);
    ASSERT_EQ(fmoe__qblock_bytes(FMOE_GGML_TQ2_0), 0);
    ASSERT_EQ(types[FIRST_IQ], FMOE_GGML_IQ2_XXS);
    /* MXFP4: a formula, and CUDA kernels (gpt-oss's experts; compiled, not yet run on a
     * device: tests/gpu/test_backend_ops.c checks them there) */
    ASSERT_TRUE(fmoe__qblock_cuda_has(FMOE_GGML_MXFP4));
    /* every type with a formula has CUDA kernels (compiled, not yet run on a device) */
    ASSERT_EQ(fmoe__qblock_bytes(FMOE_GGML_Q3_K), 110);
    for (int t = 0; t < NTYPES; t++) ASSERT_TRUE(fmoe__qblock_cuda_has(types[t]));
    ASSERT_TRUE(!fmoe__qblock_cuda_has(FMOE_GGML_F16) && !fmoe__qblock_cuda_has(FMOE_GGML_TQ1_0));
    /* ... which are all the block types the loader takes (runtime/model/backend_types.c
     * refuses none today) */
    for (uint32_t t = 0; t < 64; t++)
        if (fmoe_quant_supported(t) && fmoe_ggml_block_size(t) > 1)
            ASSERT_TRUE(fmoe__qblock_cuda_has(t));
}

TEST(groups_of_8_equal_the_row_and_ggml_bit_for_bit) {
    enum { BLOCKS = 64 };
    for (int t = 0; t < NTYPES; t++) {
        const uint32_t type = types[t];
        const int bs = fmoe__qblock_values(type), bb = fmoe__qblock_bytes(type);
        const int64_t n = (int64_t)BLOCKS * bs;
        uint8_t *row = malloc((size_t)BLOCKS * bb);
        float *want = malloc((size_t)n * sizeof *want), *ref = malloc((size_t)n * sizeof *ref);
        for (int64_t i = 0; i < (int64_t)BLOCKS * bb; i++) row[i] = rnd8();
        /* half the blocks with a modest f16 scale, so most values are finite and vary */
        for (int k = 0; k < BLOCKS; k += 2) {
            const uint16_t h = fmoe_float_to_half((float)(k + 1) * 1e-3f);
            uint8_t *blk = row + (int64_t)k * bb;
            memcpy(blk + d_at(type), &h, 2);
        }
        fmoe_quant_dequantize_row(type, row, want, n);
        for (int k = 0; k < BLOCKS; k++) {
            if (t >= FIRST_IQ) /* the whole-block path of quant_block.h instead */
                fmoe__qblock_dequant(type, row + (int64_t)k * bb, ref + k * bs);
            else
                ggml_block(type, row + (int64_t)k * bb, ref + k * bs);
        }
        const int d = first_diff(want, ref, (int)n);
        if (d >= 0) printf("  type %u value %d: row %.9g, ggml %.9g\n", type, d, want[d], ref[d]);
        ASSERT_EQ(d, -1);
        int bad = 0;
        for (int k = 0; k < BLOCKS; k++)
            for (int g = 0; g < bs / 8; g++) {
                float y[8];
                fmoe__qblock_dequant8(type, row + (int64_t)k * bb, g, y);
                const int e = first_diff(y, want + (int64_t)k * bs + 8 * g, 8);
                if (e >= 0 && !bad++)
                    printf("  type %u block %d group %d value %d: dequant8 %.9g, row %.9g\n",
                           type, k, g, e, y[e], want[(int64_t)k * bs + 8 * g + e]);
            }
        ASSERT_EQ(bad, 0);
        free(row), free(want), free(ref);
    }
}

/* A value planted by hand in each format lands where ggml's layout says. */
TEST(planted_values_land_in_their_group) {
    uint8_t b[FMOE_Q6_K_BYTES];
    float y[8];
    /* Q6_K value 200: half 1, quarter 2 (high nibbles, qh bits 4-5), l = 8, scale 12 */
    memset(b, 0, sizeof b);
    const uint16_t one = fmoe_float_to_half(1.0f);
    memcpy(b + 208, &one, 2);
    b[192 + 12] = (uint8_t)(int8_t)-3;
    b[64 + 8] = 0x50;            /* high nibble 5 */
    b[128 + 32 + 8] = 2u << 4;   /* high bits 2 */
    fmoe__qblock_dequant8(FMOE_GGML_Q6_K, b, 200 / 8, y);
    ASSERT_NEAR(y[0], -3.0f * (float)((5 | (2 << 4)) - 32), 0);
    ASSERT_NEAR(y[1], -3.0f * -32.0f, 0);
    /* Q5_K value 100: sub-block 3 (odd: high nibbles of ql[32 + 4]), fifth bit bit 3 of qh[4] */
    memset(b, 0, sizeof b);
    const uint16_t half = fmoe_float_to_half(0.5f), quarter = fmoe_float_to_half(0.25f);
    memcpy(b, &half, 2);
    memcpy(b + 2, &quarter, 2);
    b[4 + 3] = 7;      /* scale of sub-block 3 */
    b[4 + 7] = 2;      /* its min */
    b[48 + 32 + 4] = 0x90;
    b[16 + 4] = 1u << 3;
    fmoe__qblock_dequant8(FMOE_GGML_Q5_K, b, 100 / 8, y);
    ASSERT_NEAR(y[4], 0.5f * 7 * (float)(9 + 16) - 0.25f * 2, 0);
    ASSERT_NEAR(y[3], -0.5f, 0);
}

int main(int argc, char **argv) { return RUN_TESTS(argc, argv); }
