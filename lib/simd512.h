/*
 * simd512.h - internal: where lib/quant_avx512.c and lib/quant_act_avx512.c get their
 * intrinsics, and FMOE__AVX512, the target attribute of their functions.
 *
 * Normally <immintrin.h> and the AVX-512 F, BW and VL target (with the AVX2 level's AVX2,
 * FMA and F16C below it): the kernels lib/quant.c calls on a CPU that has them.
 *
 * With FMOE_EMULATE_AVX512 defined (only in the *_avx512_emulated test binaries that
 * tests/lib/meson.build and tests/model/meson.build build where SIMDe's headers are
 * installed, never in the library) the same names come from SIMDe
 * (https://github.com/simd-everywhere/simde), which implements the AVX-512 intrinsics in
 * portable C, and no function needs AVX-512: a machine without it runs these kernels'
 * arithmetic, and lib/quant.c, built with the same define, counts the emulated level as
 * present (docs/quantization.md, Kernels). That checks what the kernels compute, not their
 * speed, nor that a real AVX-512 CPU agrees with SIMDe on every instruction:
 * tests/gpu/device-check.sh's stage cpu_avx512 runs them natively.
 *
 * SIMDE_ENABLE_NATIVE_ALIASES makes the name of every intrinsic the compiler does not
 * enable (here AVX-512's) a macro for SIMDe's function, and __m512, __m512i, __mmask16, ...
 * names of SIMDe's types, so the kernels' source is the same in both builds. <immintrin.h>
 * may be included already (lib/dot_avx2.h): the macros rename only the uses that follow.
 */
#ifndef FMOE_SIMD512_H
#define FMOE_SIMD512_H

#if defined(__x86_64__)

#ifndef FMOE_EMULATE_AVX512

#include <immintrin.h>

#define FMOE__AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl")))

#else /* FMOE_EMULATE_AVX512 */

#include <stdint.h>

#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#include <simde/x86/f16c.h>
#include <simde/x86/fma.h>

/* The emulated level, like the real one, runs only where the AVX2 level does, so the two
 * files are compiled with -mavx2 -mfma -mf16c, for the whole file: clang refuses the
 * target attribute here, as SIMDe's functions, which have none, would pass 256-bit vectors
 * to and from functions that have AVX (an ABI mismatch). SIMDe then does its 512-bit
 * operations with AVX2 ones. And with -Wno-psabi: GCC and clang note every function that
 * passes a 512-bit vector without AVX-512, whose ABI differs; all of them, SIMDe's and the
 * kernels', are static to the one file, so no caller compiled otherwise calls them. */
#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "FMOE_EMULATE_AVX512 needs -mavx2 -mfma -mf16c"
#endif
#define FMOE__AVX512

/* Three intrinsics SIMDe 0.7.4 (Debian 12's libsimde-dev) lacks, written plainly, lane by
 * lane, from Intel's description. */

static inline simde__m512 fmoe__emu_mm512_cvtepi32_ps(simde__m512i a) {
    int32_t v[16];
    float f[16];
    simde_mm512_storeu_si512((void *)v, a);
    for (int i = 0; i < 16; i++) f[i] = (float)v[i];
    return simde_mm512_loadu_ps(f);
}

static inline simde__m512i fmoe__emu_mm512_cvtepi8_epi32(simde__m128i a) {
    int8_t b[16];
    int32_t v[16];
    simde_mm_storeu_si128((simde__m128i *)b, a);
    for (int i = 0; i < 16; i++) v[i] = b[i];
    return simde_mm512_loadu_si512((const void *)v);
}

/* In the order of GCC's _mm512_reduce_add_ps (the upper 8 lanes added to the lower 8,
 * then 4 to 4, 2 to 2, 1 to 1), so the emulated sums round as the real ones do. */
static inline float fmoe__emu_mm512_reduce_add_ps(simde__m512 a) {
    float f[16];
    simde_mm512_storeu_ps(f, a);
    for (int w = 8; w >= 1; w /= 2)
        for (int i = 0; i < w; i++) f[i] = f[i] + f[i + w];
    return f[0];
}

#undef _mm512_cvtepi32_ps /* in case a later SIMDe has them */
#undef _mm512_cvtepi8_epi32
#undef _mm512_reduce_add_ps
#define _mm512_cvtepi32_ps(a) fmoe__emu_mm512_cvtepi32_ps(a)
#define _mm512_cvtepi8_epi32(a) fmoe__emu_mm512_cvtepi8_epi32(a)
#define _mm512_reduce_add_ps(a) fmoe__emu_mm512_reduce_add_ps(a)

/* SIMDe 0.7.4's alias for this one takes the masked form's four parameters. */
#undef _mm512_madd_epi16
#define _mm512_madd_epi16(a, b) simde_mm512_madd_epi16(a, b)

#endif /* FMOE_EMULATE_AVX512 */

#endif /* __x86_64__ */

#endif
