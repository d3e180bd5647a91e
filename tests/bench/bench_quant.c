/*
 * bench_quant.c - speed of the ggml block-format kernels (lib/quant*.c) on one core: for
 * each type, quantising a ROWS x COLS f32 matrix (ns per value), and the matrix-vector
 * product with fmoe_quant_dot (AVX2 when the CPU has it) and fmoe_quant_dot_ref (plain C),
 * as milliseconds and GB/s of weight bytes read, and for the block types the product with
 * the vector quantised to 8 bits (fmoe/quant_act.h: the vector's quantisation included,
 * once per product, as the CPU backend does it). The types fmoe reads but does not write
 * (MXFP4, the i-quants IQ2_XXS, IQ2_XS, IQ1_S, IQ1_M) are timed on blocks of hashed bytes, their
 * "quantise" column being that fill. Not a test (no timed tests); the numbers
 * in docs/quantization.md come from it.
 *
 * Then the block types at each SIMD kernel level the CPU has (avx2, avx512: forced in
 * turn, lib/quant_impl.h), in one process on the same data: fmoe_quant_dot row by row with
 * the f32 vector, and fmoe_quant_act_matvec over the whole matrix with 1 and with 8
 * inputs (quantised outside the timing), so a machine with AVX-512 compares its two paths
 * side by side. FMOE_NO_AVX512 leaves AVX-512 out.
 *
 *     build/tests/lib/bench_quant [ROWS COLS REPS]      (default 1024 4096 5)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "half.h"
#include "fmoe/quant.h"
#include "fmoe/quant_act.h"
#include "quant_impl.h"

/* Row r of a type fmoe reads but does not write (MXFP4, four of the i-quants): blocks of
 * hashed bytes with small scales (MXFP4 2^-8 .. 2^-1; the i-quants' f16 d 1/64, IQ1_M's in the
 * top nibbles of its scale words), rb bytes into dst. */
static void hashed_row(uint32_t t, int64_t r, int64_t rb, uint8_t *dst) {
    for (int64_t b = 0; b < rb; b++) dst[b] = (uint8_t)(((uint64_t)(r * rb + b) * 2654435761u) >> 13);
    const int64_t bs = fmoe_ggml_type_size(t);
    for (int64_t b = 0; b < rb; b += bs) {
        if (t == FMOE_GGML_MXFP4) {
            dst[b] = (uint8_t)(120 + (r + b) % 8);
        } else if (t == FMOE_GGML_IQ1_M) { /* 0x2400 = 1/64 in f16: nibbles 0, 0, 4, 2 */
            for (int k = 0; k < 4; k++)
                dst[b + 49 + 2 * k] = (uint8_t)((dst[b + 49 + 2 * k] & 0x0F) | (((0x2400 >> (4 * k)) & 0xF) << 4));
        } else {
            dst[b] = 0x00;
            dst[b + 1] = 0x24;
        }
    }
}

/* Row r of w quantised to t, or for a read-only type hashed blocks. */
static void make_row(uint32_t t, const float *w, int64_t r, int64_t cols, int64_t rb, uint8_t *dst) {
    if (fmoe_quant_can_quantize(t))
        fmoe_quant_quantize_row(t, w + r * cols, dst, cols);
    else
        hashed_row(t, r, rb, dst);
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    const int64_t rows = argc > 1 ? atoll(argv[1]) : 1024, cols = argc > 2 ? atoll(argv[2]) : 4096;
    const int reps = argc > 3 ? atoi(argv[3]) : 5;
    if (rows < 1 || cols < 256 || cols % 256 != 0 || reps < 1) {
        fprintf(stderr, "usage: bench_quant [ROWS COLS REPS] (COLS a multiple of 256)\n");
        return 2;
    }
    float *w = malloc((size_t)(rows * cols) * sizeof *w), *x = malloc((size_t)cols * sizeof *x);
    uint8_t *q = malloc((size_t)(rows * cols) * 4), *qx = malloc((size_t)cols * 2);
    if (!w || !x || !q || !qx) return 1;
    for (int64_t i = 0; i < rows * cols; i++)
        w[i] = (float)((uint64_t)i * 2654435761u % 1000) / 1000.f - 0.5f;
    for (int64_t i = 0; i < cols; i++) x[i] = (float)(i % 13) - 6;
    const int best = fmoe__quant_level_max();
    /* the first table's "AVX2" columns are AVX2's, also on a CPU with AVX-512 */
    if (best > FMOE__QUANT_AVX2) fmoe__quant_force_level(FMOE__QUANT_AVX2);
    printf("%lld x %lld, %d reps, AVX2 path %s, best kernel level %s\n\n", (long long)rows,
           (long long)cols, reps, fmoe_quant_simd() ? "on" : "off", fmoe__quant_level_name(best));
    printf("| type | quantise ns/value | matvec AVX2 ms | GB/s | matvec plain C ms | speed-up "
           "| 8-bit x AVX2 ms | GB/s |\n");
    printf("|---|---|---|---|---|---|---|---|\n");
    const uint32_t ts[] = {FMOE_GGML_F32,  FMOE_GGML_BF16, FMOE_GGML_Q8_0,
                           FMOE_GGML_Q4_K, FMOE_GGML_Q5_K, FMOE_GGML_Q6_K,
                           FMOE_GGML_Q4_0, FMOE_GGML_Q4_1, FMOE_GGML_Q5_0,
                           FMOE_GGML_Q5_1, FMOE_GGML_IQ4_NL, FMOE_GGML_Q2_K,
                           FMOE_GGML_Q3_K, FMOE_GGML_IQ4_XS, FMOE_GGML_MXFP4,
                           FMOE_GGML_IQ2_XXS, FMOE_GGML_IQ2_XS, FMOE_GGML_IQ2_S,
                           FMOE_GGML_IQ3_XXS, FMOE_GGML_IQ3_S, FMOE_GGML_IQ1_S,
                           FMOE_GGML_IQ1_M};
    for (size_t k = 0; k < sizeof ts / sizeof ts[0]; k++) {
        const uint32_t t = ts[k];
        const int64_t rb = fmoe_quant_row_bytes(t, cols);
        double tq = now();
        for (int64_t r = 0; r < rows; r++) {
            if (t == FMOE_GGML_F32) {
                memcpy(q + r * rb, w + r * cols, (size_t)rb);
            } else if (t == FMOE_GGML_BF16) {
                for (int64_t c = 0; c < cols; c++) {
                    const uint16_t h = fmoe_float_to_bf16(w[r * cols + c]);
                    memcpy(q + r * rb + 2 * c, &h, 2);
                }
            } else { /* read-only types: their quantise column times hashed_row */
                make_row(t, w, r, cols, rb, q + r * rb);
            }
        }
        tq = now() - tq;
        volatile float sink = 0;
        double ta = now();
        for (int rep = 0; rep < reps; rep++)
            for (int64_t r = 0; r < rows; r++) sink += fmoe_quant_dot(t, q + r * rb, x, cols);
        ta = (now() - ta) / reps;
        double tr = now();
        for (int rep = 0; rep < reps; rep++)
            for (int64_t r = 0; r < rows; r++) sink += fmoe_quant_dot_ref(t, q + r * rb, x, cols);
        tr = (now() - tr) / reps;
        printf("| %s | %.1f | %.2f | %.2f | %.2f | %.1fx |", fmoe_ggml_type_name(t),
               tq / (double)(rows * cols) * 1e9, ta * 1e3, (double)(rows * rb) / ta / 1e9,
               tr * 1e3, tr / ta);
        if (fmoe_quant_act_supported(t)) {
            double ti = now();
            for (int rep = 0; rep < reps; rep++) {
                fmoe_quant_act_quantize(t, x, qx, cols);
                for (int64_t r = 0; r < rows; r++) sink += fmoe_quant_act_dot(t, q + r * rb, qx, cols);
            }
            ti = (now() - ti) / reps;
            printf(" %.2f | %.2f |\n", ti * 1e3, (double)(rows * rb) / ti / 1e9);
        } else {
            printf(" - | - |\n");
        }
    }
    /* the 8-bit product per level (q held one type at a time: each is quantised again) */
    enum { NX = 8 };
    uint8_t *qxs = malloc((size_t)cols * 2 * NX);
    float *y = malloc((size_t)(rows * NX) * sizeof *y);
    if (!qxs || !y) return 1;
    printf("\nPer kernel level, one core: ms per product (GB/s of weights)\n\n");
    printf("| type | level | f32 input | 8-bit, 1 input | 8-bit, %d inputs |\n|---|---|---|---|---|\n", NX);
    const uint32_t qts[] = {FMOE_GGML_Q8_0, FMOE_GGML_Q4_K, FMOE_GGML_Q5_K, FMOE_GGML_Q6_K,
                            FMOE_GGML_Q4_0, FMOE_GGML_Q4_1, FMOE_GGML_Q5_0, FMOE_GGML_Q5_1,
                            FMOE_GGML_IQ4_NL, FMOE_GGML_MXFP4, FMOE_GGML_Q2_K, FMOE_GGML_Q3_K,
                            FMOE_GGML_IQ4_XS, FMOE_GGML_IQ2_XXS, FMOE_GGML_IQ2_XS, FMOE_GGML_IQ2_S,
                            FMOE_GGML_IQ3_XXS, FMOE_GGML_IQ3_S, FMOE_GGML_IQ1_S, FMOE_GGML_IQ1_M};
    for (size_t k = 0; k < sizeof qts / sizeof qts[0]; k++) {
        const uint32_t t = qts[k];
        const int64_t rb = fmoe_quant_row_bytes(t, cols), ab = fmoe_quant_act_bytes(t, cols);
        for (int64_t r = 0; r < rows; r++) make_row(t, w, r, cols, rb, q + r * rb);
        for (int v = 0; v < NX; v++) fmoe_quant_act_quantize(t, x, qxs + v * ab, cols);
        for (int level = FMOE__QUANT_AVX2; level <= best; level++) {
            fmoe__quant_force_level(level);
            volatile float sink = 0;
            double tf = now();
            for (int rep = 0; rep < reps; rep++)
                for (int64_t r = 0; r < rows; r++) sink += fmoe_quant_dot(t, q + r * rb, x, cols);
            tf = (now() - tf) / reps;
            double t1 = now();
            for (int rep = 0; rep < reps; rep++) fmoe_quant_act_matvec(t, q, rb, rows, qxs, ab, 1, cols, y, rows);
            t1 = (now() - t1) / reps;
            double t8 = now();
            for (int rep = 0; rep < reps; rep++) fmoe_quant_act_matvec(t, q, rb, rows, qxs, ab, NX, cols, y, rows);
            t8 = (now() - t8) / reps;
            printf("| %s | %s | %.2f (%.2f) | %.2f (%.2f) | %.2f (%.2f) |\n", fmoe_ggml_type_name(t),
                   fmoe__quant_level_name(level), tf * 1e3, (double)(rows * rb) / tf / 1e9, t1 * 1e3,
                   (double)(rows * rb) / t1 / 1e9, t8 * 1e3, (double)(rows * rb) / t8 / 1e9);
        }
    }
    fmoe__quant_force_level(-1);
    free(qxs);
    free(y);
    free(w);
    free(x);
    free(q);
    free(qx);
    return 0;
}
