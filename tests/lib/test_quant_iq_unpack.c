/*
 * test_quant_iq_unpack.c - the AVX2 unpack of the codebook i-quants (lib/quant_iq_avx2.c)
 * against the plain-C one (lib/quant_iq.c, itself checked against gguf-py's dequantiser
 * by tests/python/test_gguf_iquants.py): over random blocks of every type, the 256 codes,
 * sixteen scales and mins, d and dmin equal byte for byte. Random bytes are valid blocks
 * for these types (every index lands in its grid; signs and scales take any bits), and
 * they reach every grid index, sign pattern, scale and IQ1 delta the kernels distinguish.
 * (One input's 8-bit dot at the AVX2 level takes lib/quant_iq_dot_avx2.c's row kernels,
 * checked bit for bit against the plain reference by tests/lib/test_quant_rows1.c.) The
 * dots built on them are tests/lib/test_quant*.c's. Skipped without AVX2.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "fmoe/quant.h"
#include "harness.h"
#include "quant_impl.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint8_t rnd8(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint8_t)(rng >> 24);
}

static const uint32_t types[] = {FMOE_GGML_IQ2_XXS, FMOE_GGML_IQ2_XS, FMOE_GGML_IQ2_S,
                                 FMOE_GGML_IQ3_XXS, FMOE_GGML_IQ3_S,  FMOE_GGML_IQ1_S,
                                 FMOE_GGML_IQ1_M};
#define NTYPES (int)(sizeof types / sizeof types[0])

/* The first field where two unpacked blocks differ, or -1: q index, 256 + sc, 272 + m,
 * 288 d, 289 dmin (compared as bit patterns, so NaN d from random f16 bits compares). */
static int first_difference(const fmoe__kx_block *a, const fmoe__kx_block *b) {
    for (int i = 0; i < FMOE_QK_K; i++)
        if (a->q[i] != b->q[i]) return i;
    for (int s = 0; s < 16; s++) {
        if (a->sc[s] != b->sc[s]) return 256 + s;
        if (a->m[s] != b->m[s]) return 272 + s;
    }
    if (memcmp(&a->d, &b->d, 4)) return 288;
    if (memcmp(&a->dmin, &b->dmin, 4)) return 289;
    return -1;
}

TEST(avx2_unpack_equals_plain_on_random_blocks) {
    if (fmoe__quant_level_max() < FMOE__QUANT_AVX2) {
        printf("  (no AVX2 on this CPU: nothing to compare)\n");
        return;
    }
    uint8_t block[256];
    for (int t = 0; t < NTYPES; t++) {
        const int64_t bytes = fmoe_ggml_type_size(types[t]);
        ASSERT_TRUE(bytes > 0 && bytes <= (int64_t)sizeof block);
        for (int trial = 0; trial < 2000; trial++) {
            for (int64_t i = 0; i < bytes; i++) block[i] = rnd8();
            fmoe__kx_block plain, avx2;
            memset(&plain, 0x55, sizeof plain); /* what neither writes shows up as a difference */
            memset(&avx2, 0xAA, sizeof avx2);
            fmoe__iq_unpack(types[t], block, &plain);
            fmoe__iq_unpack_avx2(types[t], block, &avx2);
            const int at = first_difference(&plain, &avx2);
            if (at >= 0)
                HARNESS_FAIL("%s block %d: unpacks differ at field %d (q: %d vs %d)",
                             fmoe_ggml_type_name(types[t]), trial, at,
                             at < 256 ? plain.q[at] : 0, at < 256 ? avx2.q[at] : 0);
        }
    }
}

int main(int argc, char **argv) { return RUN_TESTS(argc, argv); }
