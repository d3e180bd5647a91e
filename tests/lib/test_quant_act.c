/*
 * test_quant_act.c - dots of ggml block rows with 8-bit activations (lib/quant_act*.c).
 *
 * Three references, none of them the code under test:
 * - by hand: inputs whose quantisation is exact (integers up to 127 in a block whose
 *   largest magnitude is 127), so the dot is a known integer;
 * - a float64 dot of the dequantised row (fmoe_quant_dequantize_row, which equals gguf-py
 *   bit for bit: tests/python/test_gguf_quants.py) with the dequantised activation: the
 *   integer sums are exact, so only f32 rounding separates them, bounded as in
 *   tests/lib/test_quant.c (4·eps·sqrt(n)·Σ|w·x| + 1e-6);
 * - a float64 dot with the f32 input itself: the activation's quantisation moves each x
 *   by at most half a step of its block, d/2 with d = amax/127, plus for Q8_0 the f16
 *   rounding of d (at most 2^-11·d per unit of q, 127 units): so the bound is
 *   Σ_blocks (0.5 + 127·2^-11)·d·Σ_block |w| plus the rounding bound above.
 * And one exact reference: inputs for which every f32 step of any path is exact
 * (integer_sums_exact), so each path's integer block sums are checked for equality.
 *
 * main runs every test at each kernel level the CPU has: plain C, AVX2, AVX-512
 * (quant_levels.h); "fast" below is whichever of them is forced.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "half.h"
#include "fmoe/quant.h"
#include "fmoe/quant_act.h"
#include "harness.h"
#include "quant_act_impl.h"
#include "quant_levels.h"

static const uint32_t types[] = {FMOE_GGML_Q8_0, FMOE_GGML_Q4_K, FMOE_GGML_Q5_K, FMOE_GGML_Q6_K,
                                 FMOE_GGML_Q4_0, FMOE_GGML_Q4_1, FMOE_GGML_Q5_0, FMOE_GGML_Q5_1,
                                 FMOE_GGML_IQ4_NL, FMOE_GGML_Q2_K, FMOE_GGML_Q3_K, FMOE_GGML_IQ4_XS,
                                 FMOE_GGML_MXFP4, FMOE_GGML_IQ2_XXS, FMOE_GGML_IQ2_XS,
                                 FMOE_GGML_IQ2_S, FMOE_GGML_IQ3_XXS, FMOE_GGML_IQ3_S,
                                 FMOE_GGML_IQ1_S, FMOE_GGML_IQ1_M};
#define NTYPES (sizeof types / sizeof types[0])

static uint64_t rng_state = 0x2545f4914f6cdd1dull;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}
static float rndf(void) { return (float)(rnd() % 2000001) / 1000000.f - 1.f; } /* [-1, 1] */

/* The f16 d of a block of the i-quants: first, or (IQ1_M) in the top nibbles of the four
 * scale words at byte 48. */
static void iq_set_d(uint32_t type, uint8_t *blk, uint16_t h) {
    if (type != FMOE_GGML_IQ1_M) {
        memcpy(blk, &h, 2);
        return;
    }
    for (int k = 0; k < 4; k++) blk[49 + 2 * k] = (uint8_t)((blk[49 + 2 * k] & 0x0F) | (((h >> (4 * k)) & 0xF) << 4));
}

/* Random bytes for a row, every f16 scale field rewritten as a small finite value. */
static void random_row(uint32_t type, uint8_t *row, int64_t n) {
    const int64_t nb = fmoe_quant_row_bytes(type, n);
    for (int64_t i = 0; i < nb; i++) row[i] = (uint8_t)rnd();
    const int32_t ts = fmoe_ggml_type_size(type);
    for (int64_t b = 0; b < nb; b += ts) {
        uint16_t h = fmoe_float_to_half(rndf() * 0.01f);
        switch (type) {
        case FMOE_GGML_Q8_0:
        case FMOE_GGML_Q4_0:
        case FMOE_GGML_Q5_0:
        case FMOE_GGML_IQ4_NL: memcpy(row + b, &h, 2); break;
        case FMOE_GGML_Q4_1:
        case FMOE_GGML_Q5_1:
        case FMOE_GGML_Q4_K:
        case FMOE_GGML_Q5_K:
            memcpy(row + b, &h, 2);
            h = fmoe_float_to_half(rndf() * 0.01f);
            memcpy(row + b + 2, &h, 2);
            break;
        case FMOE_GGML_Q6_K: memcpy(row + b + 208, &h, 2); break;
        case FMOE_GGML_Q2_K:
            memcpy(row + b + 80, &h, 2);
            h = fmoe_float_to_half(rndf() * 0.01f);
            memcpy(row + b + 82, &h, 2);
            break;
        case FMOE_GGML_Q3_K: memcpy(row + b + 108, &h, 2); break;
        case FMOE_GGML_IQ4_XS: memcpy(row + b, &h, 2); break;
        case FMOE_GGML_MXFP4: row[b] = (uint8_t)(116 + rnd() % 8); break; /* 2^-12..2^-5 */
        case FMOE_GGML_IQ2_XXS:
        case FMOE_GGML_IQ2_XS:
        case FMOE_GGML_IQ2_S:
        case FMOE_GGML_IQ3_XXS:
        case FMOE_GGML_IQ3_S:
        case FMOE_GGML_IQ1_S:
        case FMOE_GGML_IQ1_M: iq_set_d(type, row + b, h); break;
        }
    }
}

/* Values per activation block: Q8_0 blocks for the 32-value row types, Q8_K for the rest. */
static int32_t act_block(uint32_t type) { return fmoe_ggml_block_size(type) == 32 ? 32 : 256; }

static int close_enough(double got, double want, double abs_sum, int64_t n) {
    return fabs(got - want) <= 4 * 1.2e-7 * sqrt((double)n) * abs_sum + 1e-6;
}

TEST(sizes) {
    ASSERT_EQ(fmoe_quant_act_bytes(FMOE_GGML_Q8_0, 64), 68);
    ASSERT_EQ(fmoe_quant_act_bytes(FMOE_GGML_Q4_K, 512), 2 * 292);
    ASSERT_EQ(fmoe_quant_act_bytes(FMOE_GGML_Q6_K, 256), FMOE_Q8_K_BYTES);
    ASSERT_EQ(fmoe_quant_act_bytes(FMOE_GGML_Q4_K, 96), -1); /* not whole blocks */
    ASSERT_EQ(fmoe_quant_act_bytes(FMOE_GGML_BF16, 256), -1);
    ASSERT_TRUE(fmoe_quant_act_supported(FMOE_GGML_Q5_K));
    ASSERT_TRUE(!fmoe_quant_act_supported(FMOE_GGML_F32));
    ASSERT_TRUE(!fmoe_quant_act_supported(FMOE_GGML_TQ1_0));
    /* the i-quants take Q8_K activations */
    ASSERT_EQ(fmoe_quant_act_bytes(FMOE_GGML_IQ2_XS, 512), 2 * FMOE_Q8_K_BYTES);
    ASSERT_EQ(fmoe_quant_act_bytes(FMOE_GGML_IQ1_M, 256), FMOE_Q8_K_BYTES);
    /* Q2_K, Q3_K, IQ4_XS take Q8_K activations as the other K-quants */
    ASSERT_EQ(fmoe_quant_act_bytes(FMOE_GGML_Q3_K, 512), 2 * FMOE_Q8_K_BYTES);
    ASSERT_EQ(fmoe_quant_act_bytes(FMOE_GGML_IQ4_XS, 256), FMOE_Q8_K_BYTES);
    /* the 32-value types take Q8_0 activations: 34 bytes per 32 values */
    ASSERT_EQ(fmoe_quant_act_bytes(FMOE_GGML_Q5_0, 96), 3 * FMOE_Q8_0_BYTES);
    ASSERT_EQ(fmoe_quant_act_bytes(FMOE_GGML_IQ4_NL, 32), FMOE_Q8_0_BYTES);
    ASSERT_EQ(fmoe_quant_act_bytes(FMOE_GGML_Q4_1, 48), -1);
}

/* Q8_0 row d = 0.5, q = i - 16 (repeated); x integers with |x| <= 127 and 127 in every
 * block, so the activation is x exactly: dot = 0.5·Σ (i-16)·x_i. */
TEST(q8_0_by_hand) {
    enum { N = 128 };
    uint8_t row[N / 32 * FMOE_Q8_0_BYTES];
    const uint16_t h = fmoe_float_to_half(0.5f);
    float x[N];
    double want = 0;
    for (int b = 0; b < N / 32; b++) {
        memcpy(row + b * FMOE_Q8_0_BYTES, &h, 2);
        for (int i = 0; i < 32; i++) {
            row[b * FMOE_Q8_0_BYTES + 2 + i] = (uint8_t)(int8_t)(i - 16);
            x[32 * b + i] = i == 5 ? 127.f : (float)((int)(rnd() % 255) - 127);
            want += 0.5 * (i - 16) * x[32 * b + i];
        }
    }
    uint8_t qx[N / 32 * FMOE_Q8_0_BYTES];
    fmoe_quant_act_quantize(FMOE_GGML_Q8_0, x, qx, N);
    float back[N];
    fmoe_quant_act_dequantize(FMOE_GGML_Q8_0, qx, back, N);
    for (int i = 0; i < N; i++) ASSERT_NEAR(back[i], x[i], 0);
    ASSERT_NEAR(fmoe_quant_act_dot_ref(FMOE_GGML_Q8_0, row, qx, N), want, 0);
    ASSERT_NEAR(fmoe_quant_act_dot(FMOE_GGML_Q8_0, row, qx, N), want, 0);
}

/* Q8_K of integers whose largest magnitude is 127 (negative: d = 1 / (-127 / -127) = 1;
 * positive: d = -1 and q = -x): exact, and bsums are the sums of 16. */
TEST(q8_k_by_hand) {
    float x[256];
    for (int sign = -1; sign <= 1; sign += 2) {
        for (int i = 0; i < 256; i++) x[i] = (float)((int)(rnd() % 253) - 126);
        x[77] = 127.f * (float)sign;
        uint8_t qx[FMOE_Q8_K_BYTES];
        fmoe_quant_act_quantize(FMOE_GGML_Q4_K, x, qx, 256);
        float d;
        memcpy(&d, qx, 4);
        ASSERT_NEAR(d, sign < 0 ? 1.f : -1.f, 0);
        float back[256];
        fmoe_quant_act_dequantize(FMOE_GGML_Q6_K, qx, back, 256);
        for (int i = 0; i < 256; i++) ASSERT_NEAR(back[i], x[i], 0);
        int16_t bsums[16];
        memcpy(bsums, qx + 4 + 256, sizeof bsums);
        for (int g = 0; g < 16; g++) {
            int s = 0;
            for (int i = 0; i < 16; i++) s += (int8_t)qx[4 + 16 * g + i];
            ASSERT_EQ(bsums[g], s);
        }
    }
    /* an all-zero block: d = 0, q = 0 */
    memset(x, 0, sizeof x);
    uint8_t qx[FMOE_Q8_K_BYTES];
    memset(qx, 0xff, sizeof qx);
    fmoe_quant_act_quantize(FMOE_GGML_Q5_K, x, qx, 256);
    for (size_t i = 0; i < sizeof qx; i++) ASSERT_EQ(qx[i], 0);
}

/* Q6_K with every value 63 (q - 32 = 31), scales 1..16, d = 1: the dot with an exact
 * activation is Σ 31·sc·x, an integer. Checks the offset of 32 through bsums. */
TEST(q6_k_by_hand) {
    uint8_t row[FMOE_Q6_K_BYTES];
    memset(row, 0xff, 192); /* ql and qh all ones: q = 63 */
    for (int g = 0; g < 16; g++) row[192 + g] = (uint8_t)(int8_t)(g % 2 ? g + 1 : -(g + 1));
    const uint16_t h = fmoe_float_to_half(1.f);
    memcpy(row + 208, &h, 2);
    float x[256];
    double want = 0;
    for (int i = 0; i < 256; i++) {
        x[i] = i == 3 ? -127.f : (float)((int)(rnd() % 255) - 127);
        const int g = i / 16;
        want += 31.0 * (g % 2 ? g + 1 : -(g + 1)) * x[i];
    }
    uint8_t qx[FMOE_Q8_K_BYTES];
    fmoe_quant_act_quantize(FMOE_GGML_Q6_K, x, qx, 256);
    ASSERT_NEAR(fmoe_quant_act_dot_ref(FMOE_GGML_Q6_K, row, qx, 256), want, 0);
    ASSERT_NEAR(fmoe_quant_act_dot(FMOE_GGML_Q6_K, row, qx, 256), want, 0);
}

/* Both paths against float64 of what the blocks hold (row and activation dequantised). */
TEST(dots_match_dequantised_float64) {
    for (size_t k = 0; k < NTYPES; k++)
        for (size_t in = 0; in < 3; in++) {
            const uint32_t t = types[k];
            /* 96: an odd count of 32-value blocks (the AVX-512 kernels pair them) */
            const int64_t ns[] = {act_block(t) == 32 ? 96 : 256, 768, 4096};
            const int64_t n = ns[in];
            uint8_t *row = malloc((size_t)fmoe_quant_row_bytes(t, n));
            uint8_t *qx = malloc((size_t)fmoe_quant_act_bytes(t, n));
            float *x = malloc((size_t)n * sizeof *x), *w = malloc((size_t)n * sizeof *w);
            float *xa = malloc((size_t)n * sizeof *xa);
            for (int rep = 0; rep < 5; rep++) {
                random_row(t, row, n);
                for (int64_t i = 0; i < n; i++) x[i] = rndf() * (rep == 4 ? 100.f : 1.f);
                fmoe_quant_act_quantize(t, x, qx, n);
                fmoe_quant_dequantize_row(t, row, w, n);
                fmoe_quant_act_dequantize(t, qx, xa, n);
                double want = 0, a = 0;
                for (int64_t i = 0; i < n; i++) {
                    want += (double)w[i] * xa[i];
                    a += fabs((double)w[i] * xa[i]);
                }
                const float ref = fmoe_quant_act_dot_ref(t, row, qx, n);
                const float fast = fmoe_quant_act_dot(t, row, qx, n);
                if (!close_enough(ref, want, a, n) || !close_enough(fast, want, a, n))
                    HARNESS_FAIL("%s n=%lld: ref %.9g, simd %.9g, want %.9g (sum|wx| %.3g)",
                                 fmoe_ggml_type_name(t), (long long)n, ref, fast, want, a);
            }
            free(row);
            free(qx);
            free(x);
            free(w);
            free(xa);
        }
}

/* Against the f32 input: within the activation's quantisation step (header comment). */
TEST(dot_within_activation_step_of_f32_dot) {
    const int64_t n = 2048;
    for (size_t k = 0; k < NTYPES; k++) {
        const uint32_t t = types[k];
        const int32_t ab = act_block(t);
        uint8_t *row = malloc((size_t)fmoe_quant_row_bytes(t, n));
        uint8_t *qx = malloc((size_t)fmoe_quant_act_bytes(t, n));
        float *x = malloc((size_t)n * sizeof *x), *w = malloc((size_t)n * sizeof *w);
        for (int rep = 0; rep < 5; rep++) {
            random_row(t, row, n);
            /* reps 3 and 4 with outliers, which widen their blocks' steps */
            for (int64_t i = 0; i < n; i++) x[i] = rndf() * (rep >= 3 && i % 97 == 0 ? 30.f : 1.f);
            fmoe_quant_act_quantize(t, x, qx, n);
            fmoe_quant_dequantize_row(t, row, w, n);
            double exact = 0, a = 0, bound = 0;
            for (int64_t b = 0; b < n; b += ab) {
                double amax = 0, wsum = 0;
                for (int64_t i = b; i < b + ab; i++) {
                    exact += (double)w[i] * x[i];
                    a += fabs((double)w[i] * x[i]);
                    amax = fmax(amax, fabs(x[i]));
                    wsum += fabs(w[i]);
                }
                bound += (0.5 + 127.0 / 2048) * amax / 127 * wsum;
            }
            const float got = fmoe_quant_act_dot(t, row, qx, n);
            const double err = fabs(got - exact), tol = bound + 4 * 1.2e-7 * sqrt((double)n) * a + 1e-6;
            if (!(err <= tol))
                HARNESS_FAIL("%s: |%.9g - %.9g| = %.3g > %.3g", fmoe_ggml_type_name(t), got,
                             exact, err, tol);
            /* and the bound is not vacuous: without outliers it is about 1% of Σ|w·x|,
             * where a wrong scale or a dropped sub-block would land far outside */
            if (rep < 3) ASSERT_TRUE(bound < 0.02 * a);
        }
        free(row);
        free(qx);
        free(x);
        free(w);
    }
}

/* fmoe_quant_act_dots over 1..9 inputs: each result bit-identical to the single dot. */
TEST(many_inputs_equal_one_at_a_time) {
    const int64_t n = 512;
    for (size_t k = 0; k < NTYPES; k++) {
        const uint32_t t = types[k];
        const int64_t ab = fmoe_quant_act_bytes(t, n);
        uint8_t *row = malloc((size_t)fmoe_quant_row_bytes(t, n));
        uint8_t *qx = malloc((size_t)(ab * 9));
        float x[512], y[18];
        random_row(t, row, n);
        for (int v = 0; v < 9; v++) {
            for (int64_t i = 0; i < n; i++) x[i] = rndf();
            fmoe_quant_act_quantize(t, x, qx + v * ab, n);
        }
        for (int32_t nx = 1; nx <= 9; nx++) {
            memset(y, 0, sizeof y);
            fmoe_quant_act_dots(t, row, qx, ab, nx, n, y, 2);
            for (int v = 0; v < nx; v++) {
                const float one = fmoe_quant_act_dot(t, row, qx + v * ab, n);
                if (memcmp(&one, &y[2 * v], sizeof one) != 0)
                    HARNESS_FAIL("%s nx=%d input %d: %.9g alone, %.9g in a group",
                                 fmoe_ggml_type_name(t), nx, v, one, y[2 * v]);
            }
        }
        free(row);
        free(qx);
    }
}

/* The Q8_0 input quantiser (AVX2 where the CPU has it) writes ggml's reference bytes, as
 * fmoe_quant_quantize_row does (that one equals gguf-py byte for byte): random values, a
 * zero block, exact halves (roundf rounds them away from zero), tiny and huge blocks. */
TEST(q8_0_input_blocks_are_the_reference_bytes) {
    enum { N = 32 * 64 };
    float x[N];
    for (int i = 0; i < N; i++) x[i] = rndf() * (i / 32 % 5 == 3 ? 1e-6f : i / 32 % 5 == 4 ? 1e4f : 1.f);
    for (int i = 0; i < 32; i++) x[i] = 0;
    for (int i = 32; i < 64; i++) x[i] = (float)(i - 48) + 0.5f; /* max 15.5: d = 15.5/127 */
    for (int i = 64; i < 96; i++) x[i] = i == 64 ? 127.f : (float)(i - 80) + 0.5f; /* d = 1 */
    for (int i = 96; i < 128; i++) x[i] = i == 96 ? -127.f : -(float)(i - 96) - 0.5f;
    uint8_t a[N / 32 * FMOE_Q8_0_BYTES], b[N / 32 * FMOE_Q8_0_BYTES];
    fmoe_quant_act_quantize(FMOE_GGML_Q8_0, x, a, N);
    fmoe_quant_quantize_row(FMOE_GGML_Q8_0, x, b, N);
    for (size_t i = 0; i < sizeof a; i++)
        if (a[i] != b[i])
            HARNESS_FAIL("byte %zu (block %zu) differs: %u vs %u", i, i / FMOE_Q8_0_BYTES, a[i], b[i]);
}

/* ggml's quantize_row_q8_K_ref written out again: the first value of largest magnitude
 * sets iscale = -127/max, q = round-half-even(iscale·x) within ±127, d = 1/iscale. */
static void q8_k_block(const float *x, uint8_t *b) {
    float amax = 0, max = 0;
    for (int j = 0; j < 256; j++)
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    memset(b, 0, FMOE_Q8_K_BYTES);
    if (amax == 0) return;
    const float iscale = -127.f / max, d = 1 / iscale;
    int16_t bsums[16] = {0};
    for (int j = 0; j < 256; j++) {
        long v = lrintf(iscale * x[j]);
        v = v > 127 ? 127 : v < -127 ? -127 : v;
        b[4 + j] = (uint8_t)(int8_t)v;
        bsums[j / 16] = (int16_t)(bsums[j / 16] + v);
    }
    memcpy(b, &d, 4);
    memcpy(b + 4 + 256, bsums, sizeof bsums);
}

/* The Q8_K input quantiser (AVX2 where the CPU has it) writes those bytes: random blocks,
 * a zero block, exact halves (ties go to even), both signs of the largest magnitude (the
 * first one wins), tiny and huge blocks. */
TEST(q8_k_input_blocks_are_the_reference_bytes) {
    enum { NB = 24, N = 256 * NB };
    float *x = malloc(N * sizeof *x);
    for (int i = 0; i < N; i++) x[i] = rndf() * (i / 256 % 6 == 4 ? 1e-20f : i / 256 % 6 == 5 ? 1e20f : 1.f);
    for (int i = 0; i < 256; i++) x[i] = 0;
    for (int i = 256; i < 512; i++) x[i] = (float)(i % 200 - 100) + 0.5f; /* iscale = 1 */
    x[256 + 3] = -127.f;
    for (int i = 512; i < 768; i++) x[i] = rndf();
    x[512 + 9] = 2.f, x[512 + 200] = -2.f;  /* positive first */
    for (int i = 768; i < 1024; i++) x[i] = rndf();
    x[768 + 1] = -3.f, x[768 + 255] = 3.f;  /* negative first */
    uint8_t *a = malloc(NB * FMOE_Q8_K_BYTES), *b = malloc(NB * FMOE_Q8_K_BYTES);
    fmoe_quant_act_quantize(FMOE_GGML_Q4_K, x, a, N);
    for (int k = 0; k < NB; k++) q8_k_block(x + 256 * k, b + k * FMOE_Q8_K_BYTES);
    for (int i = 0; i < NB * FMOE_Q8_K_BYTES; i++)
        if (a[i] != b[i])
            HARNESS_FAIL("byte %d (block %d) differs: %u vs %u", i, i / FMOE_Q8_K_BYTES, a[i], b[i]);
    free(x);
    free(a);
    free(b);
}

/* fmoe_quant_act_matvec over rows equals fmoe_quant_act_dots row by row, bit for bit. */
TEST(matvec_equals_row_by_row) {
    const int64_t n = 256, rows = 5;
    for (size_t k = 0; k < NTYPES; k++) {
        const uint32_t t = types[k];
        const int64_t rb = fmoe_quant_row_bytes(t, n), ab = fmoe_quant_act_bytes(t, n);
        uint8_t *w = malloc((size_t)(rb * rows)), *qx = malloc((size_t)(ab * 6));
        float x[256], y[6 * 5], z[6 * 5];
        for (int64_t r = 0; r < rows; r++) random_row(t, w + r * rb, n);
        for (int v = 0; v < 6; v++) {
            for (int i = 0; i < 256; i++) x[i] = rndf();
            fmoe_quant_act_quantize(t, x, qx + v * ab, n);
        }
        fmoe_quant_act_matvec(t, w, rb, rows, qx, ab, 6, n, y, rows);
        for (int64_t r = 0; r < rows; r++) fmoe_quant_act_dots(t, w + r * rb, qx, ab, 6, n, z + r, rows);
        ASSERT_TRUE(memcmp(y, z, sizeof y) == 0);
        free(w);
        free(qx);
    }
}

/* Q8_0 rows long enough that the AVX2 path's table of widened input scales takes the
 * inputs a few at a time (1100 blocks: three a group, so seven inputs are groups of 3, 3
 * and 1), and longer than the table (4100 blocks: the plain-C dot): every output is the
 * bits of the one-input dot, and within rounding of the float64 dot of what the row and
 * the quantised input hold. */
TEST(q8_0_long_rows_many_inputs) {
    static const int64_t lens[] = {32 * 1100, 32 * 4100};
    enum { ROWS = 2, NX = 7 };
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        const int64_t n = lens[li];
        const int64_t rb = fmoe_quant_row_bytes(FMOE_GGML_Q8_0, n), ab = fmoe_quant_act_bytes(FMOE_GGML_Q8_0, n);
        uint8_t *w = malloc((size_t)(rb * ROWS)), *qx = malloc((size_t)(ab * NX));
        float *x = malloc((size_t)n * sizeof *x), *wf = malloc((size_t)n * sizeof *wf);
        float y[NX * ROWS];
        for (int r = 0; r < ROWS; r++) random_row(FMOE_GGML_Q8_0, w + r * rb, n);
        for (int k = 0; k < NX; k++) {
            for (int64_t i = 0; i < n; i++) x[i] = rndf();
            fmoe_quant_act_quantize(FMOE_GGML_Q8_0, x, qx + k * ab, n);
        }
        fmoe_quant_act_matvec(FMOE_GGML_Q8_0, w, rb, ROWS, qx, ab, NX, n, y, ROWS);
        for (int r = 0; r < ROWS; r++) {
            fmoe_quant_dequantize_row(FMOE_GGML_Q8_0, w + r * rb, wf, n);
            for (int k = 0; k < NX; k++) {
                const float one = fmoe_quant_act_dot(FMOE_GGML_Q8_0, w + r * rb, qx + k * ab, n);
                ASSERT_TRUE(memcmp(&one, &y[k * ROWS + r], sizeof one) == 0);
                fmoe_quant_act_dequantize(FMOE_GGML_Q8_0, qx + k * ab, x, n);
                double want = 0, abs_sum = 0;
                for (int64_t i = 0; i < n; i++) {
                    want += (double)wf[i] * x[i];
                    abs_sum += fabs((double)wf[i] * x[i]);
                }
                if (!close_enough(y[k * ROWS + r], want, abs_sum, n))
                    HARNESS_FAIL("n %lld row %d input %d: %.9g vs float64 %.9g", (long long)n, r, k,
                                 y[k * ROWS + r], want);
            }
        }
        free(w);
        free(qx);
        free(x);
        free(wf);
    }
}

/* Inputs and rows whose every f32 step is exact: activations integers within ±3 with 127
 * first in each block (so Q8_0's d is 1 and Q8_K's -1, and the quantised values are the
 * integers themselves), weight scales d = 1 and dmin = 0.5. Every partial sum any path
 * forms, in any order, is then a multiple of 0.5 below 2^23 in magnitude (Q4_K/Q5_K, the
 * largest: per block Σ(|sc·q| + |m|)·|a| <= (63·31 + 63)·(127 + 255·3) < 1.8M, two
 * blocks; the i-quants' values, multiples of 1/8 (IQ3_XXS: 1/4) at most 62·31/4 = 480,
 * keep every sum below 2^20; the bound is asserted below), so the result must equal the
 * float64 dot of what
 * the blocks hold exactly, at every level, whatever the rows (several, so the row loop
 * runs), the inputs (five: a pass of four and one of one) and an odd count of Q8_0
 * blocks (the AVX-512 kernel takes them two at a time). */
TEST(integer_sums_exact) {
    enum { ROWS = 3, NX = 5 };
    for (size_t k = 0; k < NTYPES; k++) {
        const uint32_t t = types[k];
        const int64_t ns[2] = {act_block(t) == 32 ? 32 : 256, act_block(t) == 32 ? 480 : 512};
        for (int in = 0; in < 2; in++) {
            const int64_t n = ns[in], rb = fmoe_quant_row_bytes(t, n), ab = fmoe_quant_act_bytes(t, n);
            const int32_t blk = act_block(t), ts = fmoe_ggml_type_size(t);
            uint8_t *w = malloc((size_t)(rb * ROWS)), *qx = malloc((size_t)(ab * NX));
            float *x = malloc((size_t)n * sizeof *x), *wf = malloc((size_t)n * ROWS * sizeof *wf);
            float *xa = malloc((size_t)n * NX * sizeof *xa), y[ROWS * NX];
            const uint16_t one = fmoe_float_to_half(1.f), half = fmoe_float_to_half(0.5f);
            for (int r = 0; r < ROWS; r++) {
                uint8_t *row = w + r * rb;
                random_row(t, row, n);
                for (int64_t b = 0; b < rb; b += ts) {
                    const int d_at = t == FMOE_GGML_Q6_K   ? 208
                                     : t == FMOE_GGML_Q2_K ? 80
                                     : t == FMOE_GGML_Q3_K ? 108
                                                           : 0;
                    if (t == FMOE_GGML_IQ1_M)
                        iq_set_d(t, row + b, one);
                    else
                        memcpy(row + b + d_at, &one, 2);
                    if (t == FMOE_GGML_Q4_K || t == FMOE_GGML_Q5_K || t == FMOE_GGML_Q4_1 ||
                        t == FMOE_GGML_Q5_1 || t == FMOE_GGML_Q2_K)
                        memcpy(row + b + d_at + 2, &half, 2);
                }
                fmoe_quant_dequantize_row(t, row, wf + r * n, n);
            }
            for (int v = 0; v < NX; v++) {
                for (int64_t i = 0; i < n; i++) x[i] = i % blk == 0 ? 127.f : (float)((int)(rnd() % 7) - 3);
                fmoe_quant_act_quantize(t, x, qx + v * ab, n);
                fmoe_quant_act_dequantize(t, qx + v * ab, xa + v * n, n);
                for (int64_t i = 0; i < n; i++) ASSERT_NEAR(xa[v * n + i], x[i], 0);
            }
            fmoe_quant_act_matvec(t, w, rb, ROWS, qx, ab, NX, n, y, ROWS);
            for (int r = 0; r < ROWS; r++)
                for (int v = 0; v < NX; v++) {
                    double want = 0, bound = 0;
                    for (int64_t i = 0; i < n; i++) {
                        want += (double)wf[r * n + i] * xa[v * n + i];
                        bound += (63.0 * 31 + 63) * fabs(xa[v * n + i]);
                    }
                    ASSERT_TRUE(bound < 8388608.0);
                    if (y[v * ROWS + r] != want)
                        HARNESS_FAIL("%s n=%lld row %d input %d: %.9g, want exactly %.9g",
                                     fmoe_ggml_type_name(t), (long long)n, r, v, y[v * ROWS + r], want);
                    ASSERT_TRUE(fmoe_quant_act_dot_ref(t, w + r * rb, qx + v * ab, n) == want);
                }
            free(w);
            free(qx);
            free(x);
            free(wf);
            free(xa);
        }
    }
}

/* fmoe_quant_act_matvec of rows x nx inputs into y (rows apart) equals dot(row, input)
 * for every row and input, bit for bit; what names dot in the failure. */
static void matvec_has_the_bits_of(int *harness_failed, float (*dot)(uint32_t, const void *, const void *, int64_t),
                                   const char *what, uint32_t t, const uint8_t *w, int64_t rb, int rows,
                                   const uint8_t *qx, int64_t ab, int nx, int64_t n, float *y) {
    fmoe_quant_act_matvec(t, w, rb, rows, qx, ab, nx, n, y, rows);
    for (int r = 0; r < rows; r++)
        for (int v = 0; v < nx; v++) {
            const float want = dot(t, w + r * rb, qx + v * ab, n);
            if (memcmp(&want, &y[v * rows + r], sizeof want) != 0)
                HARNESS_FAIL("%s rows=%d nx=%d row %d input %d: %.9g, %s %.9g", fmoe_ggml_type_name(t),
                             rows, nx, r, v, y[v * rows + r], what, want);
        }
}

/* The AVX2 level's kernels of the 32-value types (lib/quant_act_avx2.c's dots_q32: eight
 * rows a pass, each block's exact integer sum scaled and added in block order as the plain
 * reference does) give the plain reference's bits, whatever the rows (1-19: whole passes
 * of eight and a short last one) and inputs (1-5: a group of four and one), with or
 * without vpdpbusd (quant_act_no_vnni). Three MXFP4 rows have every block's E8M0 exponent
 * 0, 1 (subnormal scales, which the kernel forms apart) or 2. Other levels are held to the
 * tolerance of the tests above, not to these bits. */
TEST(q32_rows_are_the_reference_bits_at_avx2) {
    static const uint32_t q32[] = {FMOE_GGML_Q4_0, FMOE_GGML_Q4_1, FMOE_GGML_Q5_0,
                                   FMOE_GGML_Q5_1, FMOE_GGML_IQ4_NL, FMOE_GGML_MXFP4};
    if (fmoe__quant_act_level() != FMOE__QUANT_AVX2) return;
    enum { ROWS = 19, NX = 5, N = 320 };
    for (size_t k = 0; k < sizeof q32 / sizeof q32[0]; k++) {
        const uint32_t t = q32[k];
        const int64_t rb = fmoe_quant_row_bytes(t, N), ab = fmoe_quant_act_bytes(t, N);
        uint8_t *w = malloc((size_t)(rb * ROWS)), *qx = malloc((size_t)(ab * NX));
        float x[N], y[ROWS * NX];
        for (int r = 0; r < ROWS; r++) random_row(t, w + r * rb, N);
        if (t == FMOE_GGML_MXFP4) /* rows 5, 6, 7: every block's exponent 0, 1, 2 */
            for (int e = 0; e < 3; e++)
                for (int b = 0; b < N / 32; b++) w[(e + 5) * rb + b * FMOE_MXFP4_BYTES] = (uint8_t)e;
        for (int v = 0; v < NX; v++) {
            for (int i = 0; i < N; i++) x[i] = rndf() * (v == 0 && i % 32 == 0 ? 50.f : 1.f);
            fmoe_quant_act_quantize(t, x, qx + v * ab, N);
        }
        for (int rows = 1; rows <= ROWS; rows++)
            for (int nx = 1; nx <= NX; nx++)
                matvec_has_the_bits_of(harness_failed, fmoe_quant_act_dot_ref, "reference", t, w, rb, rows, qx, ab, nx, N, y);
        free(w);
        free(qx);
    }
}

/* The AVX2 level's K-quant and Q8_0 kernels compiled with AVX512-VNNI and GFNI
 * (lib/quant_act_avx2_vnni.c: vpdpwssd for madd then add, a GFNI transform for Q4_K's
 * and Q5_K's high nibbles) give the bits of the plain AVX2 build, whatever the rows (1-5)
 * and inputs (1-5): the same integer block sums, added in f32 in the same order. Random
 * rows, so every 6-bit scale and min and every code occurs; run where the CPU has those
 * instructions (fmoe__quant_vnni), which quant_act_no_vnni alone cannot compare. */
TEST(vnni_build_gives_the_avx2_bits) {
    static const uint32_t kq[] = {FMOE_GGML_Q4_K, FMOE_GGML_Q5_K, FMOE_GGML_Q6_K, FMOE_GGML_Q8_0};
    if (fmoe__quant_level() != FMOE__QUANT_AVX2 || !fmoe__quant_vnni()) return;
    enum { ROWS = 5, NX = 5, N = 768 };
    for (size_t k = 0; k < sizeof kq / sizeof kq[0]; k++) {
        const uint32_t t = kq[k];
        const int64_t rb = fmoe_quant_row_bytes(t, N), ab = fmoe_quant_act_bytes(t, N);
        uint8_t *w = malloc((size_t)(rb * ROWS)), *qx = malloc((size_t)(ab * NX));
        float x[N], y[ROWS * NX], z[ROWS * NX];
        for (int r = 0; r < ROWS; r++) random_row(t, w + r * rb, N);
        for (int v = 0; v < NX; v++) {
            for (int i = 0; i < N; i++) x[i] = rndf() * (v == 1 && i % 256 == 0 ? 40.f : 1.f);
            fmoe_quant_act_quantize(t, x, qx + v * ab, N);
        }
        for (int rows = 1; rows <= ROWS; rows++)
            for (int nx = 1; nx <= NX; nx++) {
                fmoe__quant_act_rows_avx2(t, w, rb, rows, qx, ab, nx, N, y, rows);
                fmoe__quant_act_rows_avx2_vnni(t, w, rb, rows, qx, ab, nx, N, z, rows);
                for (int i = 0; i < rows * nx; i++)
                    if (memcmp(&y[i], &z[i], sizeof y[i]) != 0)
                        HARNESS_FAIL("%s rows=%d nx=%d output %d: AVX2 %.9g, VNNI build %.9g",
                                     fmoe_ggml_type_name(t), rows, nx, i, y[i], z[i]);
            }
        free(w);
        free(qx);
    }
}

/* Many rows times many inputs, each output the bits of the one-input dot: the VNNI build's
 * row panels (lib/quant_rows1_avx2.h's fmoe__r1_panel: Q5_K's dots_q5_k_panel, Q3_K's
 * rowsp_q3_k; 16 rows and up to 16 inputs a panel, the inputs in equal groups, three at a
 * time then two or one) over every count of rows a panel leaves (1, a pair and a half, a
 * panel, one over, two and one row) and of inputs from 1 (the one-input kernels) past two
 * groups; the other K-quants the same through their own passes. */
TEST(row_panels_equal_one_input) {
    static const uint32_t kq[] = {FMOE_GGML_Q5_K, FMOE_GGML_Q3_K, FMOE_GGML_Q4_K, FMOE_GGML_Q6_K};
    static const int rowss[] = {1, 3, 16, 17, 33};
    enum { N = 512, MAXR = 33, MAXX = 35 };
    for (size_t ti = 0; ti < sizeof kq / sizeof kq[0]; ti++) {
        const uint32_t t = kq[ti];
        const int64_t rb = fmoe_quant_row_bytes(t, N), ab = fmoe_quant_act_bytes(t, N);
        uint8_t *w = malloc((size_t)(rb * MAXR)), *qx = malloc((size_t)(ab * MAXX));
        float x[N], *y = malloc(sizeof(float) * MAXR * MAXX);
        for (int r = 0; r < MAXR; r++) random_row(t, w + r * rb, N);
        for (int v = 0; v < MAXX; v++) {
            for (int i = 0; i < N; i++) x[i] = rndf() * (v % 7 == 2 && i % 256 == 5 ? 30.f : 1.f);
            fmoe_quant_act_quantize(t, x, qx + v * ab, N);
        }
        for (size_t ri = 0; ri < sizeof rowss / sizeof rowss[0]; ri++) {
            const int rows = rowss[ri];
            for (int nx = 1; nx <= MAXX; nx += nx < 20 ? 1 : 15)
                matvec_has_the_bits_of(harness_failed, fmoe_quant_act_dot, "one input", t, w, rb, rows, qx, ab, nx, N, y);
        }
        free(w);
        free(qx);
        free(y);
    }
}

/* Every test above once per kernel level this CPU has (quant_levels.h). */
int main(int argc, char **argv) { return run_tests_at_every_level(argc, argv); }
