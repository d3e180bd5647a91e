/*
 * quant.c - ggml's type table, dequantisation of the types fmoe computes with (the
 * i-quants' through lib/quant_iq.c), the plain-C dot products, and the run-time choice of
 * the kernel level, plain, AVX2 or AVX-512 (fmoe/quant.h, quant_impl.h).
 *
 * Dequantisation follows ggml's dequantize_row_* operation for operation: a block's f16
 * scale times the sub-block's integer scale, rounded to f32, times the quantised value,
 * minus the f16 min times the integer min (rounded the same way). That order is what gives
 * bit-identical results to gguf-py (whose numpy code does the same f32 operations); the
 * build is ISO C11, so the compiler does not fuse a·b - c into an FMA.
 */
#include "fmoe/quant.h"

#include <ctype.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "half.h"
#include "quant_impl.h"

#if defined(__x86_64__)
#include <cpuid.h>
#define HAVE_X86 1
#else
#define HAVE_X86 0
#endif

/* ---------------------------------------------------------------------------------- */
/* The type table (ggml.c's type_traits: block size, bytes per block)                 */
/* ---------------------------------------------------------------------------------- */

static const struct {
    const char *name;
    int32_t block, size;
} types[FMOE_GGML_TYPE_END] = {
    [FMOE_GGML_F32] = {"F32", 1, 4},
    [FMOE_GGML_F16] = {"F16", 1, 2},
    [FMOE_GGML_Q4_0] = {"Q4_0", 32, FMOE_Q4_0_BYTES},
    [FMOE_GGML_Q4_1] = {"Q4_1", 32, FMOE_Q4_1_BYTES},
    [FMOE_GGML_Q5_0] = {"Q5_0", 32, FMOE_Q5_0_BYTES},
    [FMOE_GGML_Q5_1] = {"Q5_1", 32, FMOE_Q5_1_BYTES},
    [FMOE_GGML_Q8_0] = {"Q8_0", 32, FMOE_Q8_0_BYTES},
    [FMOE_GGML_Q8_1] = {"Q8_1", 32, 40},
    [FMOE_GGML_Q2_K] = {"Q2_K", 256, FMOE_Q2_K_BYTES},
    [FMOE_GGML_Q3_K] = {"Q3_K", 256, FMOE_Q3_K_BYTES},
    [FMOE_GGML_Q4_K] = {"Q4_K", 256, FMOE_Q4_K_BYTES},
    [FMOE_GGML_Q5_K] = {"Q5_K", 256, FMOE_Q5_K_BYTES},
    [FMOE_GGML_Q6_K] = {"Q6_K", 256, FMOE_Q6_K_BYTES},
    [FMOE_GGML_Q8_K] = {"Q8_K", 256, 292},
    [FMOE_GGML_IQ2_XXS] = {"IQ2_XXS", 256, FMOE_IQ2_XXS_BYTES},
    [FMOE_GGML_IQ2_XS] = {"IQ2_XS", 256, FMOE_IQ2_XS_BYTES},
    [FMOE_GGML_IQ3_XXS] = {"IQ3_XXS", 256, FMOE_IQ3_XXS_BYTES},
    [FMOE_GGML_IQ1_S] = {"IQ1_S", 256, FMOE_IQ1_S_BYTES},
    [FMOE_GGML_IQ4_NL] = {"IQ4_NL", 32, FMOE_IQ4_NL_BYTES},
    [FMOE_GGML_IQ3_S] = {"IQ3_S", 256, FMOE_IQ3_S_BYTES},
    [FMOE_GGML_IQ2_S] = {"IQ2_S", 256, FMOE_IQ2_S_BYTES},
    [FMOE_GGML_IQ4_XS] = {"IQ4_XS", 256, FMOE_IQ4_XS_BYTES},
    [FMOE_GGML_I8] = {"I8", 1, 1},
    [FMOE_GGML_I16] = {"I16", 1, 2},
    [FMOE_GGML_I32] = {"I32", 1, 4},
    [FMOE_GGML_I64] = {"I64", 1, 8},
    [FMOE_GGML_F64] = {"F64", 1, 8},
    [FMOE_GGML_IQ1_M] = {"IQ1_M", 256, FMOE_IQ1_M_BYTES},
    [FMOE_GGML_BF16] = {"BF16", 1, 2},
    [FMOE_GGML_TQ1_0] = {"TQ1_0", 256, 54},
    [FMOE_GGML_TQ2_0] = {"TQ2_0", 256, 66},
    [FMOE_GGML_MXFP4] = {"MXFP4", 32, FMOE_MXFP4_BYTES},
};

const char *fmoe_ggml_type_name(uint32_t t) { return t < FMOE_GGML_TYPE_END ? types[t].name : NULL; }
int32_t fmoe_ggml_block_size(uint32_t t) { return t < FMOE_GGML_TYPE_END ? types[t].block : 0; }
int32_t fmoe_ggml_type_size(uint32_t t) { return t < FMOE_GGML_TYPE_END ? types[t].size : 0; }

int fmoe_ggml_type_parse(const char *name, fmoe_ggml_type *out) {
    for (uint32_t t = 0; t < FMOE_GGML_TYPE_END; t++) {
        const char *n = types[t].name;
        if (!n) continue;
        size_t i = 0;
        while (n[i] && name[i] && toupper((unsigned char)name[i]) == n[i]) i++;
        if (!n[i] && !name[i]) {
            *out = (fmoe_ggml_type)t;
            return 0;
        }
    }
    return -1;
}

int fmoe_quant_supported(uint32_t t) {
    return t == FMOE_GGML_F32 || t == FMOE_GGML_F16 || t == FMOE_GGML_BF16 ||
           fmoe__is_iq(t) || fmoe_quant_can_quantize(t);
}

int fmoe_quant_can_quantize(uint32_t t) {
    return t == FMOE_GGML_Q8_0 || t == FMOE_GGML_Q4_K || t == FMOE_GGML_Q5_K || t == FMOE_GGML_Q6_K ||
           t == FMOE_GGML_Q4_0 || t == FMOE_GGML_Q4_1 || t == FMOE_GGML_Q5_0 || t == FMOE_GGML_Q5_1 ||
           t == FMOE_GGML_IQ4_NL || t == FMOE_GGML_Q2_K || t == FMOE_GGML_Q3_K ||
           t == FMOE_GGML_IQ4_XS || t == FMOE_GGML_MXFP4 || t == FMOE_GGML_IQ3_XXS ||
           t == FMOE_GGML_IQ3_S || t == FMOE_GGML_IQ2_S;
}

int fmoe_quant_uses_importance(uint32_t t) {
    return t == FMOE_GGML_IQ3_XXS || t == FMOE_GGML_IQ3_S || t == FMOE_GGML_IQ2_S ||
           fmoe_quant_needs_importance(t);
}

int fmoe_quant_needs_importance(uint32_t t) {
    return t == FMOE_GGML_IQ2_XXS || t == FMOE_GGML_IQ2_XS || t == FMOE_GGML_IQ1_S ||
           t == FMOE_GGML_IQ1_M;
}

/* llama.cpp's rule (src/llama-quant.cpp, llama_tensor_get_type's fallback for a row that
 * is not whole blocks of the requested type), restricted to the types fmoe writes: each
 * K-quant falls back to the 32-value type of about its bits, one step up so as not to lose
 * precision (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0); the low-bit ones (Q2_K, Q3_K,
 * IQ4_XS and the i-quants IQ3_XXS, IQ3_S, IQ2_S) all go to IQ4_NL, 4.5 bits, the cheapest
 * 32-value type llama.cpp trusts there. */
uint32_t fmoe_quant_fallback_type(uint32_t t, int64_t cols) {
    const int32_t bs = fmoe_ggml_block_size(t);
    if (bs > 0 && cols % bs == 0) return t;
    uint32_t f = 0;
    switch (t) {
    case FMOE_GGML_Q4_K: f = FMOE_GGML_Q5_0; break;
    case FMOE_GGML_Q5_K: f = FMOE_GGML_Q5_1; break;
    case FMOE_GGML_Q6_K: f = FMOE_GGML_Q8_0; break;
    case FMOE_GGML_Q2_K:
    case FMOE_GGML_Q3_K:
    case FMOE_GGML_IQ4_XS:
    case FMOE_GGML_IQ3_XXS:
    case FMOE_GGML_IQ3_S:
    case FMOE_GGML_IQ2_S:
    case FMOE_GGML_IQ2_XXS:
    case FMOE_GGML_IQ2_XS:
    case FMOE_GGML_IQ1_S:
    case FMOE_GGML_IQ1_M: f = FMOE_GGML_IQ4_NL; break;
    default: return 0; /* a 32-value type already: nothing smaller to fall back to */
    }
    return cols % FMOE_QK8_0 == 0 ? f : 0;
}

int64_t fmoe_quant_row_bytes(uint32_t t, int64_t n) {
    const int32_t bs = fmoe_ggml_block_size(t);
    if (bs == 0 || n < 0 || n % bs != 0) return -1;
    return n / bs * types[t].size;
}

/* ---------------------------------------------------------------------------------- */
/* Dequantisation, one block at a time (quant_block.h: the formulas the CUDA kernels    */
/* share)                                                                             */
/* ---------------------------------------------------------------------------------- */

void fmoe_quant_dequantize_row(uint32_t t, const void *row, float *y, int64_t n) {
    FMOE_ASSERT(fmoe_quant_supported(t) && n % types[t].block == 0);
    const uint8_t *b = row;
    switch (t) {
    case FMOE_GGML_F32:
        memcpy(y, row, (size_t)n * sizeof *y);
        return;
    case FMOE_GGML_F16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, b + 2 * i, 2);
            y[i] = fmoe_half_to_float(h);
        }
        return;
    case FMOE_GGML_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, b + 2 * i, 2);
            y[i] = fmoe_bf16_to_float(h);
        }
        return;
    case FMOE_GGML_Q8_0:
        for (int64_t i = 0; i < n; i += FMOE_QK8_0, b += FMOE_Q8_0_BYTES)
            fmoe__qblock_dequant(FMOE_GGML_Q8_0, b, y + i);
        return;
    case FMOE_GGML_Q4_0:
    case FMOE_GGML_Q4_1:
    case FMOE_GGML_Q5_0:
    case FMOE_GGML_Q5_1:
    case FMOE_GGML_IQ4_NL:
    case FMOE_GGML_MXFP4:
        for (int64_t i = 0; i < n; i += FMOE_QK8_0, b += types[t].size)
            fmoe__qblock_dequant(t, b, y + i);
        return;
    case FMOE_GGML_Q4_K:
        for (int64_t i = 0; i < n; i += FMOE_QK_K, b += FMOE_Q4_K_BYTES)
            fmoe__qblock_dequant(FMOE_GGML_Q4_K, b, y + i);
        return;
    case FMOE_GGML_Q5_K:
        for (int64_t i = 0; i < n; i += FMOE_QK_K, b += FMOE_Q5_K_BYTES)
            fmoe__qblock_dequant(FMOE_GGML_Q5_K, b, y + i);
        return;
    case FMOE_GGML_Q6_K:
        for (int64_t i = 0; i < n; i += FMOE_QK_K, b += FMOE_Q6_K_BYTES)
            fmoe__qblock_dequant(FMOE_GGML_Q6_K, b, y + i);
        return;
    case FMOE_GGML_Q2_K:
    case FMOE_GGML_Q3_K:
    case FMOE_GGML_IQ4_XS:
        for (int64_t i = 0; i < n; i += FMOE_QK_K, b += types[t].size) fmoe__kx_values(t, b, y + i);
        return;
    case FMOE_GGML_IQ2_XXS:
    case FMOE_GGML_IQ2_XS:
    case FMOE_GGML_IQ2_S:
    case FMOE_GGML_IQ3_XXS:
    case FMOE_GGML_IQ3_S:
    case FMOE_GGML_IQ1_S:
    case FMOE_GGML_IQ1_M: /* lib/quant_iq.c */
        for (int64_t i = 0; i < n; i += FMOE_QK_K, b += types[t].size) fmoe__iq_values(t, b, y + i);
        return;
    }
}

/* ---------------------------------------------------------------------------------- */
/* Dot products                                                                       */
/* ---------------------------------------------------------------------------------- */

/* The reference: each block dequantised into a small buffer, then summed in order. Plain
 * on purpose: it is what the SIMD path is checked against, so it must be obviously right. */
float fmoe_quant_dot_ref(uint32_t t, const void *row, const float *x, int64_t n) {
    FMOE_ASSERT(fmoe_quant_supported(t) && n % types[t].block == 0);
    const int64_t chunk = types[t].block > 1 ? types[t].block : FMOE_QK_K;
    float buf[FMOE_QK_K];
    float s = 0;
    const uint8_t *b = row;
    for (int64_t i = 0; i < n; i += chunk) {
        const int64_t m = n - i < chunk ? n - i : chunk;
        fmoe_quant_dequantize_row(t, b + i / types[t].block * types[t].size, buf, m);
        for (int64_t k = 0; k < m; k++) s += buf[k] * x[i + k];
    }
    return s;
}

static pthread_once_t simd_once = PTHREAD_ONCE_INIT;
static int level_max;              /* FMOE__QUANT_*: the best this CPU has */
static _Atomic int level_forced = -1; /* fmoe__quant_force_level's, or -1 */
static int cpu_amd;                /* AMD's AVX-512 (Zen 4) runs 512-bit operations in halves */
static int cpu_vnni;               /* AVX512-VNNI, BW and VL, GFNI and BMI2: vpdpbusd, byte masks
                                    * and gf2p8affineqb at 256 bits (lib/quant_act_avx2_vnni.c),
                                    * and the row kernels' pdep (lib/quant_rows1_avx2.h's
                                    * FMOE__R1_VNNI; every CPU with the others has BMI2, checked
                                    * all the same) */

/* The one place that decides which kernels may run. AVX-512 needs F (the 512-bit
 * registers and masks), BW (byte and word lanes: maddubs, the byte masks) and VL (their
 * 128/256-bit forms), and the AVX2 level below it, whose instructions its kernels also use. */
static void simd_probe(void) {
#if HAVE_X86
    __builtin_cpu_init();
    unsigned eax, ebx, ecx = 0, edx; /* F16C from CPUID: clang 14 lacks the builtin's "f16c" */
    const int f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C);
    const int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c &&
                     getenv("FMOE_NO_AVX2") == NULL;
#ifndef FMOE_EMULATE_AVX512
    const int avx512 = avx2 && __builtin_cpu_supports("avx512f") &&
                       __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                       getenv("FMOE_NO_AVX512") == NULL;
#else
    /* Only in the test binaries that link the AVX-512 kernels compiled against SIMDe
     * (lib/simd512.h), never in the library: they need the AVX2 level alone. */
    const int avx512 = avx2 && getenv("FMOE_NO_AVX512") == NULL;
#endif
    level_max = avx512 ? FMOE__QUANT_AVX512 : avx2 ? FMOE__QUANT_AVX2 : FMOE__QUANT_PLAIN;
    cpu_amd = __builtin_cpu_is("amd");
    cpu_vnni = avx2 && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") &&
               __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("gfni") &&
               __builtin_cpu_supports("bmi2") && getenv("FMOE_NO_VNNI") == NULL;
#endif
}

int fmoe__quant_level_max(void) {
    pthread_once(&simd_once, simd_probe);
    return level_max;
}

int fmoe__quant_level(void) {
    const int forced = level_forced;
    return forced >= 0 ? forced : fmoe__quant_level_max();
}

int fmoe__quant_act_level(void) {
    const int forced = level_forced;
    if (forced >= 0) return forced;
    const int best = fmoe__quant_level_max();
    return best == FMOE__QUANT_AVX512 && cpu_amd ? FMOE__QUANT_AVX2 : best;
}

int fmoe__quant_vnni(void) {
    pthread_once(&simd_once, simd_probe);
    return cpu_vnni;
}

int fmoe__quant_force_level(int level) {
    if (level > fmoe__quant_level_max()) return -1;
    level_forced = level < 0 ? -1 : level;
    return 0;
}

const char *fmoe__quant_level_name(int level) {
    return level == FMOE__QUANT_AVX512 ? "avx512" : level == FMOE__QUANT_AVX2 ? "avx2" : "plain";
}

int fmoe_quant_simd(void) { return fmoe__quant_level() >= FMOE__QUANT_AVX2; }

float fmoe_quant_dot(uint32_t t, const void *row, const float *x, int64_t n) {
    switch (fmoe__quant_level()) {
    case FMOE__QUANT_AVX512: return fmoe__quant_dot_avx512(t, row, x, n);
    case FMOE__QUANT_AVX2: return fmoe__quant_dot_avx2(t, row, x, n);
    default: return fmoe_quant_dot_ref(t, row, x, n);
    }
}
