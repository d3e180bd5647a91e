/*
 * test_quant.c - the dot kernels and quantisers of lib/quant*.c against plain references.
 * (Dequantisation itself is checked bit for bit against the gguf Python package by
 * tests/python/test_gguf_quants.py.)
 *
 * Tolerance of a dot product: both sides sum n products in f32 in different orders, so
 * each may be off the exact sum by about n·eps·Σ|w_i·x_i| in the worst case; we accept
 * 4·eps·sqrt(n)·Σ|w_i·x_i| + 1e-6, a bound random-sign rounding stays far inside (the
 * worst case never happens with random data, and a wrong scale or bit moves the result
 * by orders of magnitude more).
 *
 * main runs every test at each kernel level the CPU has (quant_levels.h), so "simd"
 * below is the AVX2 or the AVX-512 path (lib/quant_avx512.c: Q8_0, Q4_0 .. IQ4_NL and the
 * K-quants; F32,
 * F16 and BF16 rows stay on the AVX2 dots at that level).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "half.h"
#include "fmoe/quant.h"
#include "harness.h"
#include "quant_levels.h"

static const uint32_t all_types[] = {FMOE_GGML_F32,  FMOE_GGML_F16,  FMOE_GGML_BF16,
                                     FMOE_GGML_Q8_0, FMOE_GGML_Q4_K, FMOE_GGML_Q5_K,
                                     FMOE_GGML_Q6_K, FMOE_GGML_Q4_0, FMOE_GGML_Q4_1,
                                     FMOE_GGML_Q5_0, FMOE_GGML_Q5_1, FMOE_GGML_IQ4_NL,
                                     FMOE_GGML_Q2_K, FMOE_GGML_Q3_K, FMOE_GGML_IQ4_XS,
                                     FMOE_GGML_MXFP4, FMOE_GGML_IQ2_XXS, FMOE_GGML_IQ2_XS,
                                     FMOE_GGML_IQ2_S, FMOE_GGML_IQ3_XXS, FMOE_GGML_IQ3_S,
                                     FMOE_GGML_IQ1_S, FMOE_GGML_IQ1_M};
#define NTYPES (sizeof all_types / sizeof all_types[0])

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}
static float rndf(void) { return (float)(rnd() % 2000001) / 1000000.f - 1.f; } /* [-1, 1] */

/* IQ1_M keeps its f16 d in the top nibbles of the four scale words at byte 48. */
static void iq1_m_set_d(uint8_t *blk, uint16_t h) {
    for (int k = 0; k < 4; k++) blk[49 + 2 * k] = (uint8_t)((blk[49 + 2 * k] & 0x0F) | (((h >> (4 * k)) & 0xF) << 4));
}

/* Random bytes for a row of `type`, with sane f16 scales (random bits would give NaN and
 * infinities, whose sums compare as NaN): every f16 field is rewritten as a small value. */
static void random_row(uint32_t type, uint8_t *row, int64_t n) {
    const int64_t nb = fmoe_quant_row_bytes(type, n);
    for (int64_t i = 0; i < nb; i++) row[i] = (uint8_t)rnd();
    const int32_t ts = fmoe_ggml_type_size(type);
    for (int64_t b = 0; b < nb; b += ts) {
        uint8_t *blk = row + b;
        uint16_t h;
        switch (type) {
        case FMOE_GGML_F32: {
            const float f = rndf();
            memcpy(blk, &f, 4);
            break;
        }
        case FMOE_GGML_F16:
            h = fmoe_float_to_half(rndf());
            memcpy(blk, &h, 2);
            break;
        case FMOE_GGML_BF16:
            h = fmoe_float_to_bf16(rndf());
            memcpy(blk, &h, 2);
            break;
        case FMOE_GGML_Q8_0:
        case FMOE_GGML_Q4_0:
        case FMOE_GGML_Q5_0:
        case FMOE_GGML_IQ4_NL:
            h = fmoe_float_to_half(rndf() * 0.01f);
            memcpy(blk, &h, 2);
            break;
        case FMOE_GGML_MXFP4: /* E8M0 scales 2^-12 .. 2^-5 (values up to 12·2^-6) */
            blk[0] = (uint8_t)(116 + rnd() % 8);
            break;
        case FMOE_GGML_Q4_1:
        case FMOE_GGML_Q5_1:
        case FMOE_GGML_Q4_K:
        case FMOE_GGML_Q5_K:
            h = fmoe_float_to_half(rndf() * 0.01f);
            memcpy(blk, &h, 2);
            h = fmoe_float_to_half(rndf() * 0.01f);
            memcpy(blk + 2, &h, 2);
            break;
        case FMOE_GGML_Q6_K:
            h = fmoe_float_to_half(rndf() * 0.001f);
            memcpy(blk + 208, &h, 2);
            break;
        case FMOE_GGML_Q2_K: /* d and dmin at the end */
            h = fmoe_float_to_half(rndf() * 0.01f);
            memcpy(blk + 80, &h, 2);
            h = fmoe_float_to_half(rndf() * 0.01f);
            memcpy(blk + 82, &h, 2);
            break;
        case FMOE_GGML_Q3_K:
            h = fmoe_float_to_half(rndf() * 0.001f);
            memcpy(blk + 108, &h, 2);
            break;
        case FMOE_GGML_IQ4_XS:
            h = fmoe_float_to_half(rndf() * 0.0001f);
            memcpy(blk, &h, 2);
            break;
        case FMOE_GGML_IQ2_XXS: /* the i-quants: d first, values up to 62·31·d/4 */
        case FMOE_GGML_IQ2_XS:
        case FMOE_GGML_IQ2_S:
        case FMOE_GGML_IQ3_XXS:
        case FMOE_GGML_IQ3_S:
        case FMOE_GGML_IQ1_S:
            h = fmoe_float_to_half(rndf() * 0.001f);
            memcpy(blk, &h, 2);
            break;
        case FMOE_GGML_IQ1_M: iq1_m_set_d(blk, fmoe_float_to_half(rndf() * 0.001f)); break;
        }
    }
}

/* Exact-ish reference: dequantise, then sum in double. Also returns Σ|w·x|. */
static double dot_double(uint32_t type, const uint8_t *row, const float *x, int64_t n,
                         double *abs_sum) {
    float *w = malloc((size_t)n * sizeof *w);
    fmoe_quant_dequantize_row(type, row, w, n);
    double s = 0, a = 0;
    for (int64_t i = 0; i < n; i++) {
        s += (double)w[i] * x[i];
        a += fabs((double)w[i] * x[i]);
    }
    free(w);
    *abs_sum = a;
    return s;
}

static int close_enough(double got, double want, double abs_sum, int64_t n) {
    return fabs(got - want) <= 4 * 1.2e-7 * sqrt((double)n) * abs_sum + 1e-6;
}

TEST(type_table_matches_ggml) {
    ASSERT_EQ(fmoe_ggml_type_size(FMOE_GGML_Q8_0), 34);
    ASSERT_EQ(fmoe_ggml_type_size(FMOE_GGML_Q4_K), 144);
    ASSERT_EQ(fmoe_ggml_type_size(FMOE_GGML_Q5_K), 176);
    ASSERT_EQ(fmoe_ggml_type_size(FMOE_GGML_Q6_K), 210);
    ASSERT_EQ(fmoe_ggml_block_size(FMOE_GGML_Q4_K), 256);
    ASSERT_EQ(fmoe_ggml_block_size(FMOE_GGML_Q8_0), 32);
    ASSERT_EQ(fmoe_ggml_block_size(31), 0); /* 31..33 were removed from ggml */
    ASSERT_EQ(fmoe_ggml_block_size(1000), 0);
    ASSERT_STR_EQ(fmoe_ggml_type_name(FMOE_GGML_Q3_K), "Q3_K");
    fmoe_ggml_type t;
    ASSERT_EQ(fmoe_ggml_type_parse("q5_k", &t), 0);
    ASSERT_EQ((int)t, FMOE_GGML_Q5_K);
    ASSERT_EQ(fmoe_ggml_type_parse("q5_kx", &t), -1);
    ASSERT_EQ(fmoe_quant_row_bytes(FMOE_GGML_Q6_K, 512), 420);
    ASSERT_EQ(fmoe_quant_row_bytes(FMOE_GGML_Q6_K, 100), -1);
    ASSERT_TRUE(fmoe_quant_supported(FMOE_GGML_BF16));
    ASSERT_TRUE(!fmoe_quant_supported(FMOE_GGML_TQ1_0));
    /* the i-quants (ggml-common.h's static_asserts): all read; written, those llama.cpp
     * quantises without an importance matrix (IQ2_S, IQ3_XXS, IQ3_S), which fall back to
     * IQ4_NL as llama-quantize's do */
    const uint32_t iq[7] = {FMOE_GGML_IQ2_XXS, FMOE_GGML_IQ2_XS, FMOE_GGML_IQ2_S, FMOE_GGML_IQ3_XXS,
                            FMOE_GGML_IQ3_S,   FMOE_GGML_IQ1_S,  FMOE_GGML_IQ1_M};
    const int32_t iq_bytes[7] = {66, 74, 82, 98, 110, 50, 56};
    const int iq_written[7] = {0, 0, 1, 1, 1, 0, 0};
    for (int i = 0; i < 7; i++) {
        ASSERT_EQ(fmoe_ggml_type_size(iq[i]), iq_bytes[i]);
        ASSERT_EQ(fmoe_ggml_block_size(iq[i]), 256);
        ASSERT_TRUE(fmoe_quant_supported(iq[i]));
        ASSERT_EQ(fmoe_quant_can_quantize(iq[i]), iq_written[i]);
        /* IQ2_XXS, IQ2_XS, IQ1_S, IQ1_M: with an importance matrix only */
        ASSERT_EQ(fmoe_quant_needs_importance(iq[i]), i < 2 || i >= 5);
        ASSERT_TRUE(fmoe_quant_uses_importance(iq[i]));
        if (iq_written[i] || fmoe_quant_needs_importance(iq[i])) {
            ASSERT_EQ(fmoe_quant_prepare(iq[i]), 0);
            ASSERT_EQ(fmoe_quant_fallback_type(iq[i], 1408), FMOE_GGML_IQ4_NL);
            ASSERT_EQ(fmoe_quant_fallback_type(iq[i], 176), 0);
        }
    }
    ASSERT_TRUE(fmoe_quant_supported(FMOE_GGML_MXFP4)); /* read, not written */
    /* the low-bit K-quants: 84, 110 and 136 bytes a 256-value block; their fallback */
    ASSERT_EQ(fmoe_ggml_type_size(FMOE_GGML_Q2_K), 84);
    ASSERT_EQ(fmoe_ggml_type_size(FMOE_GGML_Q3_K), 110);
    ASSERT_EQ(fmoe_ggml_type_size(FMOE_GGML_IQ4_XS), 136);
    ASSERT_TRUE(fmoe_quant_supported(FMOE_GGML_Q3_K) && fmoe_quant_can_quantize(FMOE_GGML_Q2_K) &&
                fmoe_quant_can_quantize(FMOE_GGML_IQ4_XS));
    ASSERT_EQ(fmoe_quant_fallback_type(FMOE_GGML_Q2_K, 1408), FMOE_GGML_IQ4_NL);
    ASSERT_EQ(fmoe_quant_fallback_type(FMOE_GGML_Q3_K, 96), FMOE_GGML_IQ4_NL);
    ASSERT_EQ(fmoe_quant_fallback_type(FMOE_GGML_IQ4_XS, 512), FMOE_GGML_IQ4_XS);
    ASSERT_EQ(fmoe_quant_fallback_type(FMOE_GGML_IQ4_XS, 100), 0);
    /* the 32-value types (ggml-common.h's static_asserts) */
    ASSERT_EQ(fmoe_ggml_type_size(FMOE_GGML_Q4_0), 18);
    ASSERT_EQ(fmoe_ggml_type_size(FMOE_GGML_Q4_1), 20);
    ASSERT_EQ(fmoe_ggml_type_size(FMOE_GGML_Q5_0), 22);
    ASSERT_EQ(fmoe_ggml_type_size(FMOE_GGML_Q5_1), 24);
    ASSERT_EQ(fmoe_ggml_type_size(FMOE_GGML_IQ4_NL), 18);
    const uint32_t q32[] = {FMOE_GGML_Q4_0, FMOE_GGML_Q4_1, FMOE_GGML_Q5_0, FMOE_GGML_Q5_1,
                            FMOE_GGML_IQ4_NL};
    for (int i = 0; i < 5; i++) {
        ASSERT_EQ(fmoe_ggml_block_size(q32[i]), 32);
        ASSERT_TRUE(fmoe_quant_supported(q32[i]));
        ASSERT_TRUE(fmoe_quant_can_quantize(q32[i]));
    }
    ASSERT_EQ(fmoe_quant_row_bytes(FMOE_GGML_Q5_0, 1408), 1408 / 32 * 22);
}

/* Hand-made Q5_0 block: d = 0.25, code l (0..31, fifth bit in qh bit l) -> (l - 16)/4;
 * and the same codes as Q5_1 with m = -1: l/4 - 1. */
TEST(q5_blocks_by_hand) {
    uint8_t b0[FMOE_Q5_0_BYTES], b1[FMOE_Q5_1_BYTES];
    const uint16_t d = fmoe_float_to_half(0.25f), m = fmoe_float_to_half(-1.f);
    memcpy(b0, &d, 2);
    memcpy(b1, &d, 2);
    memcpy(b1 + 2, &m, 2);
    const uint32_t qh = 0xFFFF0000u; /* codes 16..31 of values 16..31 have bit 4 */
    for (int k = 0; k < 4; k++) b0[2 + k] = b1[4 + k] = (uint8_t)(qh >> (8 * k));
    for (int l = 0; l < 16; l++) b0[6 + l] = b1[8 + l] = (uint8_t)(l | (l << 4));
    float y0[32], y1[32];
    fmoe_quant_dequantize_row(FMOE_GGML_Q5_0, b0, y0, 32);
    fmoe_quant_dequantize_row(FMOE_GGML_Q5_1, b1, y1, 32);
    for (int l = 0; l < 32; l++) {
        ASSERT_NEAR(y0[l], (l - 16) * 0.25f, 0);
        ASSERT_NEAR(y1[l], l * 0.25f - 1.f, 0);
    }
}

/* Hand-made Q4_0 / IQ4_NL blocks: d = 2, low nibbles l, high 15 - l: Q4_0 gives 2(q - 8),
 * IQ4_NL 2·level[q] on ggml's grid. */
TEST(q4_0_iq4_nl_blocks_by_hand) {
    static const int levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                   1,    13,   25,  38,  53,  69,  89,  113};
    uint8_t b[FMOE_Q4_0_BYTES];
    const uint16_t d = fmoe_float_to_half(2.f);
    memcpy(b, &d, 2);
    for (int l = 0; l < 16; l++) b[2 + l] = (uint8_t)(l | ((15 - l) << 4));
    float y[32];
    fmoe_quant_dequantize_row(FMOE_GGML_Q4_0, b, y, 32);
    for (int l = 0; l < 16; l++) {
        ASSERT_NEAR(y[l], 2.f * (l - 8), 0);
        ASSERT_NEAR(y[16 + l], 2.f * (15 - l - 8), 0);
    }
    fmoe_quant_dequantize_row(FMOE_GGML_IQ4_NL, b, y, 32);
    for (int l = 0; l < 16; l++) {
        ASSERT_NEAR(y[l], 2.f * levels[l], 0);
        ASSERT_NEAR(y[16 + l], 2.f * levels[15 - l], 0);
    }
}

/* A hand-made MXFP4 block (OCP MX v1.0 E2M1: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their
 * negatives, times 2^(e - 127)): e = 128 (scale 2), low nibbles l, high 15 - l; then the
 * E8M0 ends: e = 0 and 1 (subnormal 2^-127, 2^-126 scales, exact), and 252 (2^125: 6·2^125
 * is the largest a block of finite floats reaches below e = 253). */
TEST(mxfp4_block_by_hand) {
    static const float e2m1[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f,
                                   -2, -3, -4, -6};
    uint8_t b[FMOE_MXFP4_BYTES];
    for (int l = 0; l < 16; l++) b[1 + l] = (uint8_t)(l | ((15 - l) << 4));
    float y[32];
    const int es[] = {128, 0, 1, 252};
    for (int k = 0; k < 4; k++) {
        b[0] = (uint8_t)es[k];
        const float scale = ldexpf(1.0f, es[k] - 127);
        fmoe_quant_dequantize_row(FMOE_GGML_MXFP4, b, y, 32);
        for (int l = 0; l < 16; l++) {
            ASSERT_NEAR(y[l], e2m1[l] * scale, 0);
            ASSERT_NEAR(y[16 + l], e2m1[15 - l] * scale, 0);
        }
    }
    ASSERT_EQ(fmoe_ggml_type_size(FMOE_GGML_MXFP4), 17);
    ASSERT_EQ(fmoe_quant_row_bytes(FMOE_GGML_MXFP4, 2880), 90 * 17);
    ASSERT_TRUE(fmoe_quant_supported(FMOE_GGML_MXFP4) && fmoe_quant_can_quantize(FMOE_GGML_MXFP4));
}

/* Values already on MXFP4's grid (E2M1 levels times a power of two, the largest magnitude 6
 * times it, so the shared exponent is that power) come back exactly from a quantise and
 * dequantise; and the exponent byte is floor(log2 amax) - 2 + 127. gguf-py's quantiser is
 * the byte-for-byte check (test_gguf_quants.py). */
TEST(mxfp4_quantise_grid_round_trip) {
    static const float e2m1[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
    float x[64], y[64];
    uint8_t q[2 * 17];
    for (int i = 0; i < 64; i++) {
        const float s = ldexpf(1.0f, i < 32 ? -3 : 5);
        x[i] = (i % 3 == 1 ? -1 : 1) * e2m1[(i * 5) % 8] * s;
    }
    x[7] = 6 * ldexpf(1.0f, -3);
    x[40] = -6 * ldexpf(1.0f, 5);
    fmoe_quant_quantize_row(FMOE_GGML_MXFP4, x, q, 64);
    ASSERT_EQ(q[0], 127 - 3); /* amax 6·2^-3: floor(log2) = -1 */
    ASSERT_EQ(q[17], 127 + 5);
    fmoe_quant_dequantize_row(FMOE_GGML_MXFP4, q, y, 64);
    for (int i = 0; i < 64; i++) ASSERT_NEAR(y[i], x[i], 0);
}

/* Rows of an odd count of 32-value blocks, 1408 wide as Qwen1.5-MoE's down projections:
 * the SIMD paths (AVX-512: a block per 16 lanes twice) against dequantise-then-dot. */
TEST(dot_q32_odd_rows) {
    const uint32_t ts[] = {FMOE_GGML_Q4_0, FMOE_GGML_Q4_1, FMOE_GGML_Q5_0, FMOE_GGML_Q5_1,
                           FMOE_GGML_IQ4_NL, FMOE_GGML_Q8_0};
    const int64_t ns[] = {32, 96, 1408};
    for (size_t k = 0; k < 6; k++)
        for (size_t in = 0; in < 3; in++) {
            const uint32_t t = ts[k];
            const int64_t n = ns[in];
            uint8_t *row = malloc((size_t)fmoe_quant_row_bytes(t, n));
            float *x = malloc((size_t)n * sizeof *x);
            for (int rep = 0; rep < 5; rep++) {
                random_row(t, row, n);
                for (int64_t i = 0; i < n; i++) x[i] = rndf();
                double a;
                const double want = dot_double(t, row, x, n, &a);
                const float got = fmoe_quant_dot(t, row, x, n), ref = fmoe_quant_dot_ref(t, row, x, n);
                if (!close_enough(got, want, a, n) || !close_enough(ref, want, a, n))
                    HARNESS_FAIL("%s n=%lld: dot %.9g, ref %.9g, want %.9g\n", fmoe_ggml_type_name(t),
                                 (long long)n, got, ref, want);
            }
            free(row);
            free(x);
        }
}

/* Hand-made Q8_0 block: d = 0.5, q = i - 16 -> x = (i - 16) / 2. */
TEST(q8_0_block_by_hand) {
    uint8_t b[FMOE_Q8_0_BYTES];
    const uint16_t h = fmoe_float_to_half(0.5f);
    memcpy(b, &h, 2);
    for (int i = 0; i < 32; i++) b[2 + i] = (uint8_t)(int8_t)(i - 16);
    float y[32];
    fmoe_quant_dequantize_row(FMOE_GGML_Q8_0, b, y, 32);
    for (int i = 0; i < 32; i++) ASSERT_NEAR(y[i], (i - 16) * 0.5f, 0);
}

/* Hand-made Q4_K block: d = 1, dmin = 0.5, sub-block j has scale j+1 and min j (j < 4 in
 * the plain 6-bit bytes, j >= 4 split across nibbles and top bits), value q = l % 16. */
TEST(q4_k_block_by_hand) {
    uint8_t b[FMOE_Q4_K_BYTES] = {0};
    uint16_t h = fmoe_float_to_half(1.f);
    memcpy(b, &h, 2);
    h = fmoe_float_to_half(0.5f);
    memcpy(b + 2, &h, 2);
    uint8_t *sc = b + 4;
    for (int j = 0; j < 8; j++) {
        const int s = j + 1 + (j >= 4 ? 40 : 0), m = j + (j >= 4 ? 20 : 0); /* > 15: top bits */
        if (j < 4) {
            sc[j] = (uint8_t)s;
            sc[j + 4] = (uint8_t)m;
        } else {
            sc[j + 4] = (uint8_t)((s & 0xF) | ((m & 0xF) << 4));
            sc[j - 4] |= (uint8_t)((s >> 4) << 6);
            sc[j] |= (uint8_t)((m >> 4) << 6);
        }
    }
    for (int p = 0; p < 4; p++)
        for (int l = 0; l < 32; l++) b[16 + 32 * p + l] = (uint8_t)((l % 16) | ((15 - l % 16) << 4));
    float y[256];
    fmoe_quant_dequantize_row(FMOE_GGML_Q4_K, b, y, 256);
    for (int j = 0; j < 8; j++) {
        const int s = j + 1 + (j >= 4 ? 40 : 0), m = j + (j >= 4 ? 20 : 0);
        for (int l = 0; l < 32; l++) {
            const int q = j % 2 == 0 ? l % 16 : 15 - l % 16;
            ASSERT_NEAR(y[32 * j + l], (float)(s * q) - 0.5f * (float)m, 0);
        }
    }
}

TEST(dot_ref_matches_dequantise_then_dot) {
    const int64_t ns[] = {256, 512, 2048};
    for (size_t k = 0; k < NTYPES; k++)
        for (size_t in = 0; in < 3; in++) {
            const uint32_t t = all_types[k];
            const int64_t n = ns[in];
            uint8_t *row = malloc((size_t)fmoe_quant_row_bytes(t, n));
            float *x = malloc((size_t)n * sizeof *x);
            for (int rep = 0; rep < 5; rep++) {
                random_row(t, row, n);
                for (int64_t i = 0; i < n; i++) x[i] = rndf();
                double a;
                const double want = dot_double(t, row, x, n, &a);
                const float got = fmoe_quant_dot_ref(t, row, x, n);
                if (!close_enough(got, want, a, n))
                    HARNESS_FAIL("%s n=%lld: dot_ref %.9g, want %.9g (sum|wx| %.3g)\n",
                                 fmoe_ggml_type_name(t), (long long)n, got, want, a);
            }
            free(row);
            free(x);
        }
}

TEST(dot_simd_matches_reference) {
    const int64_t ns[] = {256, 768, 4096};
    for (size_t k = 0; k < NTYPES; k++)
        for (size_t in = 0; in < 3; in++) {
            const uint32_t t = all_types[k];
            const int64_t n = ns[in];
            uint8_t *row = malloc((size_t)fmoe_quant_row_bytes(t, n));
            float *x = malloc((size_t)n * sizeof *x);
            for (int rep = 0; rep < 5; rep++) {
                random_row(t, row, n);
                for (int64_t i = 0; i < n; i++) x[i] = rndf();
                double a;
                const double want = dot_double(t, row, x, n, &a);
                const float got = fmoe_quant_dot(t, row, x, n);
                if (!close_enough(got, want, a, n))
                    HARNESS_FAIL("%s n=%lld: dot %.9g, want %.9g (sum|wx| %.3g)\n",
                                 fmoe_ggml_type_name(t), (long long)n, got, want, a);
            }
            free(row);
            free(x);
        }
}

/* Odd tails for the plain types (n not a multiple of the SIMD width). */
TEST(dot_simd_tails) {
    const uint32_t ts[] = {FMOE_GGML_F32, FMOE_GGML_F16, FMOE_GGML_BF16};
    for (size_t k = 0; k < 3; k++)
        for (int64_t n = 1; n < 40; n += 3) {
            uint8_t row[160];
            float x[40];
            random_row(ts[k], row, n);
            for (int64_t i = 0; i < n; i++) x[i] = rndf();
            double a;
            const double want = dot_double(ts[k], row, x, n, &a);
            ASSERT_TRUE(close_enough(fmoe_quant_dot(ts[k], row, x, n), want, a, n));
        }
}

/* Quantise, dequantise: the error per value stays within the format's step. Q8_0's step
 * is max|x|/127 per 32 (error <= half of it, plus f16 rounding of d); the K-quants' steps
 * are bounded here by their bit width over the block's range (generous: the search can
 * trade one value's error for a better fit of the rest, never by a whole range). */
TEST(quantise_round_trip_error) {
    const struct {
        uint32_t type;
        double rel; /* max |err| / max|x| of the block */
    } cases[] = {
        {FMOE_GGML_Q8_0, 0.5 / 127 + 1e-3},
        {FMOE_GGML_Q6_K, 2.0 / 32},
        {FMOE_GGML_Q5_K, 2.0 / 31},
        {FMOE_GGML_Q4_K, 2.0 / 15},
        /* Q4_0/Q5_0: d = max/-8 (-16), so the opposite extreme clamps to code 15 (31): one
         * step off, 1/8 (1/16) of the block's max, plus f16 rounding of d */
        {FMOE_GGML_Q4_0, 1.0 / 8 + 2e-3},
        {FMOE_GGML_Q5_0, 1.0 / 16 + 2e-3},
        /* Q4_1/Q5_1: half a step of (max - min)/15 (31) <= max/15 (max/31), plus the f16
         * rounding of d (times up to 15 or 31) and of m */
        {FMOE_GGML_Q4_1, 1.0 / 15 + 4e-3},
        {FMOE_GGML_Q5_1, 1.0 / 31 + 4e-3},
        /* IQ4_NL: half the widest gap of its grid (24 of 127 at d = max/127), the refit
         * moving d by a little */
        {FMOE_GGML_IQ4_NL, 0.15},
        /* Q2_K: four levels over a sub-block of 16, the scale and min on a 4-bit grid of
         * the block's largest (an outlier in the block makes the others' step coarse);
         * Q3_K: eight levels, a 6-bit scale; IQ4_XS: IQ4_NL's grid under 6-bit scales */
        {FMOE_GGML_Q2_K, 0.75},
        {FMOE_GGML_Q3_K, 0.35},
        {FMOE_GGML_IQ4_XS, 0.2},
        /* the codebook i-quants: a group of 4 or 8 values must be one of 256-1024 points,
         * which can move a value by much of its sub-block's range; llama.cpp's own blocks
         * (byte for byte the same: tests/python/test_iquant_quantise.py) err by up to
         * 0.56 (IQ3_XXS), 0.42 (IQ3_S), 0.53 (IQ2_S) of the block's max on Gaussian rows */
        {FMOE_GGML_IQ3_XXS, 0.75},
        {FMOE_GGML_IQ3_S, 0.6},
        {FMOE_GGML_IQ2_S, 0.75},
    };
    const int64_t n = 1024;
    float x[1024], y[1024];
    uint8_t q[1024 * 2];
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        double rms_err = 0, rms_x = 0;
        for (int rep = 0; rep < 4; rep++) {
            for (int64_t i = 0; i < n; i++) x[i] = rndf() * (rep + 1) * 0.05f;
            if (rep == 3) x[7] = 3.f; /* an outlier */
            fmoe_quant_quantize_row(cases[c].type, x, q, n);
            fmoe_quant_dequantize_row(cases[c].type, q, y, n);
            const int32_t bs = fmoe_ggml_block_size(cases[c].type);
            for (int64_t b = 0; b < n; b += bs) {
                float amax = 0;
                for (int64_t i = b; i < b + bs; i++) amax = fmaxf(amax, fabsf(x[i]));
                for (int64_t i = b; i < b + bs; i++) {
                    const double e = fabs((double)y[i] - x[i]);
                    if (e > cases[c].rel * amax + 1e-7)
                        HARNESS_FAIL("%s: x[%lld] = %g came back as %g (block max %g)\n",
                                     fmoe_ggml_type_name(cases[c].type), (long long)i, x[i],
                                     y[i], amax);
                    rms_err += e * e;
                    rms_x += (double)x[i] * x[i];
                }
            }
        }
        /* Relative RMS error: about 2^-bits of the range; 8-bit ~0.3%, 4-bit ~7%. */
        const double rel = sqrt(rms_err / rms_x);
        const uint32_t ct = cases[c].type;
        /* Q4_0 and Q5_0 fix d at max/-8 (-16), so their grid spans twice the block's
         * max rather than its range: a little coarser than the affine types' */
        const double limit = ct == FMOE_GGML_Q4_0 ? 0.15
                             : ct == FMOE_GGML_Q5_0 ? 0.08
                             : ct == FMOE_GGML_Q4_K || ct == FMOE_GGML_Q4_1 || ct == FMOE_GGML_IQ4_NL
                                 ? 0.12
                             : ct == FMOE_GGML_Q5_K || ct == FMOE_GGML_Q5_1 ? 0.06
                             : cases[c].type == FMOE_GGML_Q6_K ? 0.03
                             : ct == FMOE_GGML_Q2_K ? 0.45
                             : ct == FMOE_GGML_Q3_K ? 0.2
                             : ct == FMOE_GGML_IQ4_XS ? 0.12
                             /* measured here 0.25, 0.21, 0.41 (uniform rows and an
                              * outlier; Gaussian rows 0.21, 0.17, 0.26) */
                             : ct == FMOE_GGML_IQ3_XXS ? 0.3
                             : ct == FMOE_GGML_IQ3_S ? 0.25
                             : ct == FMOE_GGML_IQ2_S ? 0.45 : 0.01;
        if (!(rel < limit))
            HARNESS_FAIL("%s: relative RMS error %.4f >= %.2f\n",
                         fmoe_ggml_type_name(cases[c].type), rel, limit);
    }
}

/* All-zero input: every quantiser writes a block that dequantises to zeros. */
TEST(quantise_zeros) {
    const uint32_t ts[] = {FMOE_GGML_Q8_0, FMOE_GGML_Q4_K, FMOE_GGML_Q5_K, FMOE_GGML_Q6_K,
                           FMOE_GGML_Q4_0, FMOE_GGML_Q4_1, FMOE_GGML_Q5_0, FMOE_GGML_Q5_1,
                           FMOE_GGML_IQ4_NL, FMOE_GGML_Q2_K, FMOE_GGML_Q3_K, FMOE_GGML_IQ4_XS,
                           FMOE_GGML_IQ3_XXS, FMOE_GGML_IQ3_S, FMOE_GGML_IQ2_S};
    float x[256] = {0}, y[256];
    uint8_t q[512]; /* Q8_0: 272 bytes for 256 values */
    for (size_t k = 0; k < sizeof ts / sizeof ts[0]; k++) {
        memset(y, 0xff, sizeof y);
        fmoe_quant_quantize_row(ts[k], x, q, 256);
        fmoe_quant_dequantize_row(ts[k], q, y, 256);
        for (int i = 0; i < 256; i++) ASSERT_NEAR(y[i], 0.f, 0);
    }
}

/* Every test above once per kernel level this CPU has (quant_levels.h). */
int main(int argc, char **argv) { return run_tests_at_every_level(argc, argv); }
