/*
 * test_quant_rows1.c - the one-input 8-bit row kernels of the 256-value types that
 * lib/quant_kx.c otherwise serves (lib/quant_iq_dot_avx2.c: IQ2_XXS .. IQ1_M;
 * lib/quant_kx_dot_avx2.c: Q2_K, Q3_K, IQ4_XS), which fmoe_quant_act_matvec takes at the
 * AVX2 and AVX-512 levels (one input, and 1 to 5 in one call: their several-input passes),
 * against the plain-C reference
 * (fmoe_quant_act_dot_ref): bit for bit, row by row, with a row count that is a multiple
 * of eight and one that is not (the VNNI build's eight-row steps and its one-row tail).
 * Each product is taken every way this CPU has (product below): through
 * fmoe_quant_act_matvec at each level, and each build's entries called directly, so one run
 * checks both builds on a VNNI CPU whichever lib/quant_act.c picks (the quant_rows1_no_vnni
 * run, FMOE_NO_VNNI=1, checks its pick of the AVX2 build there).
 *
 * Rows of random bytes (valid blocks for these types: every bit pattern decodes) with
 * their f16 scales random over the normal and subnormal range, inputs quantised by
 * fmoe_quant_act_quantize from random values (its bsums are what Q2_K's mins, Q3_K's
 * offset and IQ1_S's ±1/8 take), some inputs at ±127 throughout (the largest pair sums).
 * The reference's integers are independent of the kernels' (lib/quant_iq.c's and
 * lib/quant_block.h's unpacking, summed in plain C); tests/lib/test_quant_act.c checks
 * those against float64 of the dequantised rows.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/quant.h"
#include "fmoe/quant_act.h"
#include "half.h"
#include "harness.h"
#include "quant_impl.h"

static uint64_t rng = 0x243f6a8885a308d3ull;
static uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

static const uint32_t types[] = {FMOE_GGML_IQ2_XXS, FMOE_GGML_IQ2_XS, FMOE_GGML_IQ2_S,
                                 FMOE_GGML_IQ3_XXS, FMOE_GGML_IQ3_S,  FMOE_GGML_IQ1_S,
                                 FMOE_GGML_IQ1_M,   FMOE_GGML_Q2_K,   FMOE_GGML_Q3_K,
                                 FMOE_GGML_IQ4_XS};
#define NTYPES (int)(sizeof types / sizeof types[0])

/* A finite f16: exponent 0 (subnormal, one in eight) to 17 (up to 8), random sign and
 * mantissa. */
static uint16_t rnd_f16(void) {
    const uint32_t e = rnd() % 8 == 0 ? 0 : 1 + rnd() % 17;
    return (uint16_t)((rnd() & 0x8000) | (e << 10) | (rnd() & 0x3FF));
}

static void put16(uint8_t *p, uint16_t h) { memcpy(p, &h, 2); }

/* Random bytes, each block's f16 fields rewritten finite. */
static void random_row(uint32_t t, uint8_t *row, int64_t bytes) {
    for (int64_t i = 0; i < bytes; i++) row[i] = (uint8_t)rnd();
    const int32_t ts = fmoe_ggml_type_size(t);
    for (int64_t b = 0; b < bytes; b += ts) {
        uint8_t *blk = row + b;
        switch (t) {
        case FMOE_GGML_Q2_K:
            put16(blk + 80, rnd_f16());
            put16(blk + 82, rnd_f16());
            break;
        case FMOE_GGML_Q3_K: put16(blk + 108, rnd_f16()); break;
        case FMOE_GGML_IQ1_M: { /* d in the top nibbles of the four scale words at 48 */
            const uint16_t h = rnd_f16();
            for (int k = 0; k < 4; k++)
                blk[49 + 2 * k] = (uint8_t)((blk[49 + 2 * k] & 0x0F) | (((h >> (4 * k)) & 0xF) << 4));
            break;
        }
        default: put16(blk, rnd_f16()); break;
        }
    }
}

/* The ways to the kernels: fmoe_quant_act_matvec at the AVX2 and at the AVX-512 level
 * (lib/quant_act.c's pick of a build included), then the AVX2 build's entries and the VNNI
 * build's (lib/quant_*_dot_avx2_vnni.c), called directly, as lib/quant_act.c would: the
 * entries do not check the CPU, so the VNNI build only where fmoe__quant_vnni(). */
enum { MATVEC_AVX2, MATVEC_AVX512, AVX2_BUILD, VNNI_BUILD, NWAYS };
static const char *const way_names[NWAYS] = {"matvec at avx2", "matvec at avx512",
                                             "AVX2 build", "VNNI build"};
/* [build][i-quant]: the entries of the AVX2 build (0) and the VNNI build (1) */
static fmoe__rows1_fn *const rows1[2][2] = {{fmoe__kx_rows1_avx2, fmoe__iq_rows1_avx2},
                                            {fmoe__kx_rows1_avx2_vnni, fmoe__iq_rows1_avx2_vnni}};
static fmoe__rowsx_fn *const rowsx[2][2] = {{fmoe__kx_rowsx_avx2, fmoe__iq_rowsx_avx2},
                                            {fmoe__kx_rowsx_avx2_vnni, fmoe__iq_rowsx_avx2_vnni}};

/* rows x nx inputs (ab bytes apart) into y[k·ldy + r] by `way`; a build's one-input entry
 * where one (nx 1). @return 0 where this CPU lacks the way (nothing written). */
static int product(int way, int one, uint32_t t, const uint8_t *W, int64_t rb, int64_t rows,
                   const uint8_t *qx, int64_t ab, int32_t nx, int64_t n, float *y, int64_t ldy) {
    if (way == MATVEC_AVX2 || way == MATVEC_AVX512) {
        if (fmoe__quant_force_level(way == MATVEC_AVX2 ? FMOE__QUANT_AVX2 : FMOE__QUANT_AVX512))
            return 0;
        fmoe_quant_act_matvec(t, W, rb, rows, qx, ab, nx, n, y, ldy);
        fmoe__quant_force_level(-1);
        return 1;
    }
    const int vnni = way == VNNI_BUILD, iq = fmoe__is_iq(t);
    if (vnni && !fmoe__quant_vnni()) return 0;
    if (one)
        rows1[vnni][iq](t, W, rb, rows, qx, n, y);
    else
        rowsx[vnni][iq](t, W, rb, rows, qx, ab, nx, n, y, ldy);
    return 1;
}

TEST(one_input_rows_equal_the_reference_bit_for_bit) {
    enum { ROWS = 40 };
    const int64_t ns[] = {256, 1024, 2816};
    const int best = fmoe__quant_level_max();
    if (best < FMOE__QUANT_AVX2) {
        printf("  (no AVX2 on this CPU: the kernels do not run)\n");
        return;
    }
    for (int k = 0; k < NTYPES; k++) {
        const uint32_t t = types[k];
        for (size_t in = 0; in < sizeof ns / sizeof ns[0]; in++) {
            const int64_t n = ns[in], rb = fmoe_quant_row_bytes(t, n);
            const int64_t ab = fmoe_quant_act_bytes(t, n);
            uint8_t *W = malloc((size_t)(rb * ROWS)), *qx = malloc((size_t)ab);
            float *x = malloc((size_t)n * sizeof *x), y[ROWS];
            ASSERT_TRUE(W && qx && x);
            for (int r = 0; r < ROWS; r++) random_row(t, W + r * rb, rb);
            for (int rep = 0; rep < 3; rep++) {
                for (int64_t i = 0; i < n; i++)
                    x[i] = rep == 2 ? (rnd() & 1 ? 1.f : -1.f)
                                    : (float)((int)(rnd() % 2001) - 1000) * (rep ? 1e-3f : 7.f);
                fmoe_quant_act_quantize(t, x, qx, n);
                /* all 40 rows (five eight-row steps where the CPU has VNNI), then 37 (the
                 * last five a row at a time) */
                const int nrows = rep == 1 ? ROWS - 3 : ROWS;
                for (int way = 0; way < NWAYS; way++) {
                    memset(y, 0xFF, sizeof y);
                    if (!product(way, 1, t, W, rb, nrows, qx, ab, 1, n, y, nrows)) continue;
                    for (int r = 0; r < nrows; r++) {
                        const float want = fmoe_quant_act_dot_ref(t, W + r * rb, qx, n);
                        if (memcmp(&want, &y[r], sizeof want) != 0)
                            HARNESS_FAIL("%s n=%lld input %d %s row %d: %.9g, reference %.9g",
                                         fmoe_ggml_type_name(t), (long long)n, rep,
                                         way_names[way], r, y[r], want);
                    }
                }
            }
            free(W);
            free(qx);
            free(x);
        }
    }
}

/* A prefill's product, 1 to 13 inputs in one call (fmoe__kx_rowsx_avx2's passes of two to
 * four inputs, five as three and two, and in the VNNI build of eight; the i-quants' shared
 * unpack): every input's result
 * the reference's bits, row by row, every way, with inputs of unlike scales side by
 * side (a lane mixed up with another input's shows). */
TEST(several_inputs_each_equal_the_reference_bit_for_bit) {
    enum { ROWS = 19, NX = 13 };
    const int64_t ns[] = {256, 1280};
    const int best = fmoe__quant_level_max();
    if (best < FMOE__QUANT_AVX2) {
        printf("  (no AVX2 on this CPU: the kernels do not run)\n");
        return;
    }
    for (int k = 0; k < NTYPES; k++) {
        const uint32_t t = types[k];
        for (size_t in = 0; in < sizeof ns / sizeof ns[0]; in++) {
            const int64_t n = ns[in], rb = fmoe_quant_row_bytes(t, n);
            const int64_t ab = fmoe_quant_act_bytes(t, n);
            uint8_t *W = malloc((size_t)(rb * ROWS)), *qx = malloc((size_t)(ab * NX));
            float *x = malloc((size_t)n * sizeof *x), y[NX * ROWS];
            ASSERT_TRUE(W && qx && x);
            for (int r = 0; r < ROWS; r++) random_row(t, W + r * rb, rb);
            for (int i = 0; i < NX; i++) {
                for (int64_t j = 0; j < n; j++)
                    x[j] = i == 3 ? (rnd() & 1 ? 1.f : -1.f)
                                  : (float)((int)(rnd() % 2001) - 1000) * (i == 1 ? 1e-3f : 7.f + (float)i);
                fmoe_quant_act_quantize(t, x, qx + i * ab, n);
            }
            for (int nx = 1; nx <= NX; nx++)
                for (int way = 0; way < NWAYS; way++) {
                    memset(y, 0xFF, sizeof y);
                    if (!product(way, 0, t, W, rb, ROWS, qx, ab, nx, n, y, ROWS)) continue;
                    for (int i = 0; i < nx; i++)
                        for (int r = 0; r < ROWS; r++) {
                            const float want = fmoe_quant_act_dot_ref(t, W + r * rb, qx + i * ab, n);
                            if (memcmp(&want, &y[i * ROWS + r], sizeof want) != 0)
                                HARNESS_FAIL("%s n=%lld nx=%d input %d %s row %d: %.9g, "
                                             "reference %.9g",
                                             fmoe_ggml_type_name(t), (long long)n, nx, i,
                                             way_names[way], r, y[i * ROWS + r], want);
                        }
                }
            free(W);
            free(qx);
            free(x);
        }
    }
}

int main(int argc, char **argv) { return RUN_TESTS(argc, argv); }
