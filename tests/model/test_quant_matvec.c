/*
 * test_quant_matvec.c - runtime/cpu/quant_matvec.c: quantized matrix times vectors over the
 * thread pool equals the same product on one thread bit for bit (each output is one row's
 * dot on one thread), and matches the plain-C reference dot within the bound of
 * tests/lib/test_quant.c: f32 inputs without scratch or act8, 8-bit inputs
 * (fmoe/quant_act.h) with both, whose results do not depend on how many inputs fit in
 * scratch per pass.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "half.h"
#include "fmoe/quant.h"
#include "fmoe/quant_act.h"
#include "harness.h"
#include "lib/quant_levels.h"
#include "quant_matvec.h"
#include "quant_widen.h"
#include "../../runtime/backend/threadpool.h"

static uint64_t state = 12345;
static float rndf(void) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((state >> 40) % 2000001) / 1000000.f - 1.f;
}

TEST(pool_equals_one_thread_and_reference) {
    const uint32_t types[] = {FMOE_GGML_BF16, FMOE_GGML_Q8_0, FMOE_GGML_Q4_K, FMOE_GGML_Q5_K,
                              FMOE_GGML_Q6_K, FMOE_GGML_Q4_0, FMOE_GGML_Q4_1, FMOE_GGML_Q5_0,
                              FMOE_GGML_Q5_1, FMOE_GGML_IQ4_NL, FMOE_GGML_Q2_K, FMOE_GGML_Q3_K,
                              FMOE_GGML_IQ4_XS};
    const int64_t rows = 203, cols = 512; /* rows: not a multiple of the chunk */
    const int32_t nx = 5; /* >= QUANT_MATVEC_WIDEN_MIN: BF16 widens when scratch is given */
    const int64_t sfloats = cols; /* 2048 bytes: three 8-bit inputs (1.06-1.14 bytes a value), two passes */
    fmoe__pool *pool;
    ASSERT_OK(fmoe__pool_init(3, &pool));
    float *w = malloc((size_t)(rows * cols) * sizeof *w);
    float *x = malloc((size_t)(nx * cols) * sizeof *x);
    float *y1 = malloc((size_t)(nx * rows) * sizeof *y1), *y3 = malloc((size_t)(nx * rows) * sizeof *y3);
    uint8_t *q = malloc((size_t)(rows * cols * 2));
    float *yw = malloc((size_t)(nx * rows) * sizeof *yw);
    float *scratch[3];
    for (int k = 0; k < 3; k++) scratch[k] = malloc((size_t)sfloats * sizeof **scratch);
    float *ys = malloc((size_t)(nx * rows) * sizeof *ys), *yf = malloc((size_t)(nx * rows) * sizeof *yf);
    uint8_t *qx = malloc((size_t)(nx * cols * 2));
    for (int64_t i = 0; i < rows * cols; i++) w[i] = rndf() * 0.1f;
    for (int64_t i = 0; i < nx * cols; i++) x[i] = rndf();
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        const uint32_t t = types[k];
        const int64_t rb = fmoe_quant_row_bytes(t, cols);
        for (int64_t r = 0; r < rows; r++) {
            if (t == FMOE_GGML_BF16)
                for (int64_t c = 0; c < cols; c++) {
                    const uint16_t h = fmoe_float_to_bf16(w[r * cols + c]);
                    memcpy(q + r * rb + 2 * c, &h, 2);
                }
            else
                fmoe_quant_quantize_row(t, w + r * cols, q + r * rb, cols);
        }
        fmoe__quant_matvec(NULL, t, q, rows, cols, x, nx, cols, y1, rows, NULL, 0, 1);
        fmoe__quant_matvec(pool, t, q, rows, cols, x, nx, cols, y3, rows, NULL, 0, 1);
        ASSERT_TRUE(memcmp(y1, y3, (size_t)(nx * rows) * sizeof *y1) == 0);
        fmoe__quant_matvec(pool, t, q, rows, cols, x, nx, cols, yw, rows, scratch, sfloats, 1);
        /* one pass on one thread: scratch[0] large enough for all five inputs */
        float *big = malloc((size_t)(nx * cols * 2) * sizeof *big);
        fmoe__quant_matvec(NULL, t, q, rows, cols, x, nx, cols, ys, rows, &big, nx * cols * 2, 1);
        free(big);
        ASSERT_TRUE(memcmp(yw, ys, (size_t)(nx * rows) * sizeof *yw) == 0);
        /* act8 off: the f32 path, widened rows for these five inputs */
        fmoe__quant_matvec(pool, t, q, rows, cols, x, nx, cols, yf, rows, scratch, sfloats, 0);
        const int act = fmoe_quant_act_supported(t);
        const int64_t qb = act ? fmoe_quant_act_bytes(t, cols) : 0;
        for (int32_t i = 0; act && i < nx; i++)
            fmoe_quant_act_quantize(t, x + i * cols, qx + i * qb, cols);
        for (int32_t i = 0; i < nx; i++)
            for (int64_t r = 0; r < rows; r++) {
                const float ref = fmoe_quant_dot_ref(t, q + r * rb, x + i * cols, cols);
                const double tol = 4 * 1.2e-7 * sqrt((double)cols) * cols * 0.1 + 1e-6;
                ASSERT_NEAR(y3[i * rows + r], ref, tol);
                const float refw =
                    act ? fmoe_quant_act_dot_ref(t, q + r * rb, qx + i * qb, cols) : ref;
                ASSERT_NEAR(yw[i * rows + r], refw, tol);
                ASSERT_NEAR(yf[i * rows + r], ref, tol);
            }
    }
    free(w), free(x), free(y1), free(y3), free(yw), free(ys), free(yf), free(q), free(qx);
    for (int k = 0; k < 3; k++) free(scratch[k]);
    fmoe__pool_free(pool);
}

/* A decode step's products (one to four inputs) take one chunk a thread
 * (fmoe__quant_matvec_chunk): every row is still computed, and each output has the bits
 * of that row's product computed alone, at 1 and 3 threads. The chunks: a thread's share
 * rounded up to a multiple of 16, all the rows on one thread, 16 with more than four
 * inputs. */
TEST(decode_chunks_give_each_rows_bits) {
    ASSERT_EQ(fmoe__quant_matvec_chunk(1, 1000, 1), 1008);
    ASSERT_EQ(fmoe__quant_matvec_chunk(1, 8, 4), 16);
    ASSERT_EQ(fmoe__quant_matvec_chunk(3, 1000, 1), 336);
    ASSERT_EQ(fmoe__quant_matvec_chunk(2, 32000, 1), 16000);
    ASSERT_EQ(fmoe__quant_matvec_chunk(2, 100, 2), 64);
    ASSERT_EQ(fmoe__quant_matvec_chunk(2, 20, 1), 16);
    ASSERT_EQ(fmoe__quant_matvec_chunk(1, 1000, 5), 16);
    ASSERT_EQ(fmoe__quant_matvec_chunk(3, 32000, 64), 16);
    const uint32_t types[] = {FMOE_GGML_Q8_0, FMOE_GGML_Q4_K, FMOE_GGML_Q6_K, FMOE_GGML_Q4_0,
                              FMOE_GGML_IQ4_NL, FMOE_GGML_Q3_K, FMOE_GGML_BF16};
    const int64_t rows = 1000, cols = 256; /* 3 threads: 336-row chunks, the last one short */
    fmoe__pool *pool;
    ASSERT_OK(fmoe__pool_init(3, &pool));
    float *w = malloc((size_t)(rows * cols) * sizeof *w), *x = malloc((size_t)(4 * cols) * sizeof *x);
    float *y1 = malloc((size_t)(4 * rows) * sizeof *y1), *y3 = malloc((size_t)(4 * rows) * sizeof *y3);
    float *yr = malloc((size_t)(4 * rows) * sizeof *yr);
    uint8_t *q = malloc((size_t)(rows * cols * 2)), *qx = malloc((size_t)(4 * cols * 2));
    float *scratch[3];
    for (int k = 0; k < 3; k++) scratch[k] = malloc((size_t)cols * 2 * sizeof **scratch);
    for (int64_t i = 0; i < rows * cols; i++) w[i] = rndf() * 0.1f;
    for (int64_t i = 0; i < 4 * cols; i++) x[i] = rndf();
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        const uint32_t t = types[k];
        const int64_t rb = fmoe_quant_row_bytes(t, cols);
        for (int64_t r = 0; r < rows; r++) {
            if (t == FMOE_GGML_BF16)
                for (int64_t c = 0; c < cols; c++) {
                    const uint16_t h = fmoe_float_to_bf16(w[r * cols + c]);
                    memcpy(q + r * rb + 2 * c, &h, 2);
                }
            else
                fmoe_quant_quantize_row(t, w + r * cols, q + r * rb, cols);
        }
        const int act = fmoe_quant_act_supported(t);
        const int64_t qb = act ? fmoe_quant_act_bytes(t, cols) : 0;
        for (int32_t nx = 1; nx <= 4; nx++)
            for (int act8 = 0; act8 <= act; act8++) {
                for (int32_t i = 0; act8 && i < nx; i++)
                    fmoe_quant_act_quantize(t, x + i * cols, qx + i * qb, cols);
                for (int64_t r = 0; r < rows; r++)
                    fmoe__quant_matvec_rows(t, q, rb, r, r + 1, cols, x, cols, act8 ? qx : NULL, qb,
                                            nx, yr, rows, NULL);
                memset(y1, 0xff, (size_t)(4 * rows) * sizeof *y1); /* NaN: a row not written */
                memset(y3, 0xff, (size_t)(4 * rows) * sizeof *y3);
                fmoe__quant_matvec(NULL, t, q, rows, cols, x, nx, cols, y1, rows,
                                   act8 ? scratch : NULL, act8 ? cols * 2 : 0, act8);
                fmoe__quant_matvec(pool, t, q, rows, cols, x, nx, cols, y3, rows,
                                   act8 ? scratch : NULL, act8 ? cols * 2 : 0, act8);
                ASSERT_TRUE(memcmp(y1, yr, (size_t)(nx * rows) * sizeof *y1) == 0);
                ASSERT_TRUE(memcmp(y3, yr, (size_t)(nx * rows) * sizeof *y3) == 0);
            }
    }
    free(w), free(x), free(y1), free(y3), free(yr), free(q), free(qx);
    for (int k = 0; k < 3; k++) free(scratch[k]);
    fmoe__pool_free(pool);
}

/* The i-quants (lib/quant_iq.c), which fmoe reads but does not write: random blocks with
 * small finite scales, the pool's products equal one thread's bit for bit, the f32 path is
 * within the dot bound of the plain reference, the 8-bit path within it of
 * fmoe_quant_act_dot_ref. */
TEST(iquants_pool_equals_one_thread_and_reference) {
    const uint32_t types[] = {FMOE_GGML_IQ2_XXS, FMOE_GGML_IQ2_XS, FMOE_GGML_IQ2_S,
                              FMOE_GGML_IQ3_XXS, FMOE_GGML_IQ3_S,  FMOE_GGML_IQ1_S,
                              FMOE_GGML_IQ1_M};
    const int64_t rows = 67, cols = 512;
    const int32_t nx = 5;
    fmoe__pool *pool;
    ASSERT_OK(fmoe__pool_init(3, &pool));
    uint8_t *q = malloc((size_t)(rows * cols)), *qx = malloc((size_t)(nx * cols * 2));
    float *x = malloc((size_t)(nx * cols) * sizeof *x), *w = malloc((size_t)cols * sizeof *w);
    float *y1 = malloc((size_t)(nx * rows) * sizeof *y1), *y3 = malloc((size_t)(nx * rows) * sizeof *y3);
    float *scratch[3];
    for (int k = 0; k < 3; k++) scratch[k] = malloc((size_t)cols * 2 * sizeof **scratch);
    for (int64_t i = 0; i < nx * cols; i++) x[i] = rndf();
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        const uint32_t t = types[k];
        const int64_t rb = fmoe_quant_row_bytes(t, cols), bs = fmoe_ggml_type_size(t);
        for (int64_t i = 0; i < rows * rb; i++) q[i] = (uint8_t)(rndf() * 127.f + 128.f);
        for (int64_t i = 0; i < rows * rb; i += bs) {
            const uint16_t h = fmoe_float_to_half(rndf() * 0.001f);
            if (t != FMOE_GGML_IQ1_M) {
                memcpy(q + i, &h, 2);
            } else { /* IQ1_M: d in the top nibbles of the scale words at byte 48 */
                for (int s = 0; s < 4; s++)
                    q[i + 49 + 2 * s] = (uint8_t)((q[i + 49 + 2 * s] & 0x0F) | (((h >> (4 * s)) & 0xF) << 4));
            }
        }
        const int64_t qb = fmoe_quant_act_bytes(t, cols);
        for (int32_t i = 0; i < nx; i++) fmoe_quant_act_quantize(t, x + i * cols, qx + i * qb, cols);
        for (int act8 = 0; act8 < 2; act8++) {
            fmoe__quant_matvec(NULL, t, q, rows, cols, x, nx, cols, y1, rows, act8 ? scratch : NULL,
                               act8 ? cols * 2 : 0, act8);
            fmoe__quant_matvec(pool, t, q, rows, cols, x, nx, cols, y3, rows, act8 ? scratch : NULL,
                               act8 ? cols * 2 : 0, act8);
            ASSERT_TRUE(memcmp(y1, y3, (size_t)(nx * rows) * sizeof *y1) == 0);
            for (int64_t r = 0; r < rows; r++) {
                fmoe_quant_dequantize_row(t, q + r * rb, w, cols);
                for (int32_t i = 0; i < nx; i++) {
                    double abs_sum = 0;
                    for (int64_t c = 0; c < cols; c++) abs_sum += fabs((double)w[c] * x[i * cols + c]);
                    const double tol = 4 * 1.2e-7 * sqrt((double)cols) * abs_sum + 1e-6;
                    const float ref = act8 ? fmoe_quant_act_dot_ref(t, q + r * rb, qx + i * qb, cols)
                                           : fmoe_quant_dot_ref(t, q + r * rb, x + i * cols, cols);
                    ASSERT_NEAR(y3[i * rows + r], ref, tol);
                }
            }
        }
    }
    free(q), free(qx), free(x), free(w), free(y1), free(y3);
    for (int k = 0; k < 3; k++) free(scratch[k]);
    fmoe__pool_free(pool);
}

/* fmoe__quant_widen_rows (AVX2 where the CPU has it) gives fmoe_quant_dequantize_row's
 * bits for random blocks, subnormal and zero scales included. */
TEST(widen_rows_equal_dequantise) {
    const uint32_t types[] = {FMOE_GGML_Q8_0, FMOE_GGML_Q4_K, FMOE_GGML_Q5_K, FMOE_GGML_Q6_K,
                              FMOE_GGML_BF16, FMOE_GGML_Q4_0, FMOE_GGML_Q4_1, FMOE_GGML_Q5_0,
                              FMOE_GGML_Q5_1, FMOE_GGML_IQ4_NL};
    const int64_t rows = 7, cols = 1024;
    uint8_t *q = malloc((size_t)(rows * cols * 2));
    float *a = malloc((size_t)(rows * cols) * sizeof *a), *b = malloc((size_t)(rows * cols) * sizeof *b);
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        const uint32_t t = types[k];
        const int64_t rb = fmoe_quant_row_bytes(t, cols), bs = fmoe_ggml_type_size(t);
        for (int64_t i = 0; i < rows * rb; i++) q[i] = (uint8_t)(rndf() * 127.f + 128.f);
        for (int64_t i = 0; i < rows * rb; i += bs) { /* finite f16 scales: small, subnormal, zero */
            const float v[3] = {rndf() * 0.01f, rndf() * 1e-6f, 0.f};
            const uint16_t h = fmoe_float_to_half(v[(i / bs) % 3]);
            if (t == FMOE_GGML_Q6_K) {
                memcpy(q + i + 208, &h, 2);
            } else if (t != FMOE_GGML_BF16) {
                memcpy(q + i, &h, 2);
                /* the second f16 (K-quants' dmin, Q4_1/Q5_1's m); Q4_0, Q5_0 and IQ4_NL
                 * have codes or fifth bits there, any bytes of which are valid */
                if (t == FMOE_GGML_Q4_K || t == FMOE_GGML_Q5_K || t == FMOE_GGML_Q4_1 ||
                    t == FMOE_GGML_Q5_1)
                    memcpy(q + i + 2, &h, 2);
            } else {
                const uint16_t bf = fmoe_float_to_bf16(rndf());
                memcpy(q + i, &bf, 2);
            }
        }
        fmoe__quant_widen_rows(t, q, rows, cols, a);
        for (int64_t r = 0; r < rows; r++) fmoe_quant_dequantize_row(t, q + r * rb, b + r * cols, cols);
        ASSERT_TRUE(memcmp(a, b, (size_t)(rows * cols) * sizeof *a) == 0);
    }
    free(q), free(a), free(b);
}

/* Every test once per kernel level this CPU has (tests/lib/quant_levels.h): the level is
 * forced before the pool's workers start, so they run that level's kernels too. */
int main(int argc, char **argv) { return run_tests_at_every_level(argc, argv); }
