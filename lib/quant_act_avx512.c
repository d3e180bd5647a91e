/*
 * quant_act_avx512.c - integer dots of ggml block rows with 8-bit activations, AVX-512
 * (F, BW, VL, on top of AVX2, FMA and F16C). The AVX2 kernels of lib/quant_act_avx2.c at
 * twice the width: the same arithmetic, so the same exact integer sums, with 64 byte
 * lanes a register. Compiled for every x86-64 build with target attributes; lib/quant_act.c
 * calls it only at the AVX-512 level (fmoe__quant_level, lib/quant.c), which requires
 * every feature named in FMOE__AVX512 (lib/simd512.h).
 *
 * WRITTEN WITHOUT AN AVX-512 MACHINE: the build machine has none, and neither did the
 * session that wrote this. tests/lib/test_quant_act.c runs every case at every level the
 * CPU has and says on stderr whether the AVX-512 ones ran; where SIMDe is installed, its
 * variant quant_act_avx512_emulated runs them against SIMDe's emulation of the intrinsics
 * (lib/simd512.h), in every build; tests/gpu/device-check.sh's stage cpu_avx512 runs them
 * natively where the device host has AVX-512 (docs/quantization.md).
 *
 * Where the 512-bit forms differ from the AVX2 ones:
 * - Q8_0 blocks are 32 values, so a register takes two consecutive blocks (lanes 0-7 of the
 *   int32 sums are the first, 8-15 the second, each with its own scale). AVX-512 has no
 *   _mm_sign_epi8: w's sign goes onto the activation by a masked 0 - a where w < 0 (where
 *   w = 0, |w| = 0 makes the product 0 either way).
 * - Q4_K/Q5_K: a register holds the 32 bytes of ql for sub-blocks 2jj and 2jj+1 twice; the
 *   upper copy is shifted right by 4 (a 64-bit shift: the bits it brings in from the next
 *   byte fall outside the mask 0x0F), so the register is the 64 values of two sub-blocks
 *   in the order of the activation's 64 bytes. Q5_K's fifth bit likewise (high_bits).
 * - Q6_K: a register holds two of the AVX2 kernel's four 32-value groups of a half, whose
 *   activations are consecutive.
 * - The sub-block scales reach their int16 lanes through _mm512_permutexvar_epi16 with a
 *   constant index.
 * No int16 saturates, by the AVX2 file's argument: maddubs pairs at most 2·128·127
 * (Q8_0's -128 as |w|), 2·31·127 (Q5_K), 2·63·127 (Q6_K); activations stay within ±127
 * (both quantisers clamp); an int32 lane's sum over a block stays below 2^25.
 *
 * As in the AVX2 file: up to four inputs a pass, each with its own accumulators summed in
 * the same order whatever the count, so a result never depends on how many inputs came
 * with it; the loops over inputs carry GCC unroll pragmas. The f32 accumulation differs
 * from the AVX2 path's (16 lanes, not 8), so results agree with it within rounding, not
 * bit for bit.
 */
#include <stdint.h>
#include <string.h>

#include "dot_avx2.h"
#include "half.h"
#include "fmoe/quant.h"
#include "fmoe/quant_act.h"
#include "quant_act_impl.h"
#include "quant_impl.h"
#include "quant_unpack_avx2.h"

#if defined(__x86_64__)
#include "simd512.h"

#define SIMD FMOE__AVX512
#define INLINE __attribute__((always_inline)) inline
#define MAXX 4 /* inputs per pass */

/* the weight stream asked for this far ahead: lib/quant_act_avx2.c's distance before it
 * was measured again on the Zen 4 VM (4096 there now). These kernels run only on CPUs
 * with AVX-512 that are not AMD (fmoe__quant_act_level), where no distance was measured,
 * so this one stays. */
#define PREFETCH_BYTES 2048

SIMD static INLINE void prefetch(const uint8_t *w, int lines) {
    for (int l = 0; l < lines; l++) _mm_prefetch((const char *)w + PREFETCH_BYTES + 64 * l, _MM_HINT_T0);
}

SIMD static INLINE float f16_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

static INLINE float f32_at(const uint8_t *p) {
    float f;
    memcpy(&f, p, 4);
    return f;
}

SIMD static INLINE __m256i load256(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)p); }
SIMD static INLINE __m512i load512(const uint8_t *p) { return _mm512_loadu_si512((const void *)p); }

/* int16 lanes 16q..16q+15 (q = 0, 1) all b + q: the index that puts two consecutive
 * sub-block scales in the lanes of their 32 values each. */
SIMD static INLINE __m512i index_by_16(int b) {
    const int x0 = b * 0x10001, x1 = (b + 1) * 0x10001;
    return _mm512_setr_epi32(x0, x0, x0, x0, x0, x0, x0, x0, x1, x1, x1, x1, x1, x1, x1, x1);
}

/* int16 lanes 8q..8q+7 (q = 0..3) all b + q: four consecutive scales of 16 values each. */
SIMD static INLINE __m512i index_by_8(int b) {
    const int x0 = b * 0x10001, x1 = (b + 1) * 0x10001, x2 = (b + 2) * 0x10001, x3 = (b + 3) * 0x10001;
    return _mm512_setr_epi32(x0, x0, x0, x0, x1, x1, x1, x1, x2, x2, x2, x2, x3, x3, x3, x3);
}

/* ---------------------------------------------------------------------------------- */
/* Q8_0                                                                               */
/* ---------------------------------------------------------------------------------- */

/* The 32 quants at p and, with two, the 32 at p + one block as the upper half (else
 * zeros: a row's odd last block). */
SIMD static INLINE __m512i q8_0_pair(const uint8_t *p, int two) {
    const __m256i hi = two ? load256(p + FMOE_Q8_0_BYTES) : _mm256_setzero_si256();
    return _mm512_inserti64x4(_mm512_castsi256_si512(load256(p)), hi, 1);
}

/* lo in f32 lanes 0-7, hi in 8-15 */
SIMD static INLINE __m512 halves(float lo, float hi) {
    return _mm512_mask_blend_ps((__mmask16)0xFF00, _mm512_set1_ps(lo), _mm512_set1_ps(hi));
}

/* Blocks b and b+1 (two) or b alone of a row against nx inputs: acc[k] += dw·da·Σ w·a in
 * the lanes of each block. */
SIMD static INLINE void q8_0_step(const uint8_t *w, const uint8_t *a, int64_t stride, int nx,
                                  const float *da, int64_t da_stride, int two, __m512 *acc) {
    const __m512i ones = _mm512_set1_epi16(1);
    const __m512i qw = q8_0_pair(w + 2, two);
    const __m512i aw = _mm512_abs_epi8(qw);
    const __mmask64 neg = _mm512_movepi8_mask(qw);
    const __m512 dw = halves(f16_at(w), two ? f16_at(w + FMOE_Q8_0_BYTES) : 0.f);
    _Pragma("GCC unroll 4") for (int k = 0; k < nx; k++) {
        const __m512i ak = q8_0_pair(a + k * stride + 2, two);
        const __m512i sa = _mm512_mask_sub_epi8(ak, neg, _mm512_setzero_si512(), ak);
        const __m512i p = _mm512_madd_epi16(_mm512_maddubs_epi16(aw, sa), ones);
        const float *dk = da + k * da_stride;
        const __m512 d = _mm512_mul_ps(dw, halves(dk[0], two ? dk[1] : 0.f));
        acc[k] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(p), acc[k]);
    }
}

/* Q8_0 against inputs whose block scales da (f32, [nx][n/32], da_stride apart) were
 * widened once per call by rows_q8_0, as in the AVX2 file. */
SIMD static INLINE void dots_q8_0(const uint8_t *w, const uint8_t *a, int64_t stride, int nx,
                                  int64_t n, float *y, int64_t ys, const float *da,
                                  int64_t da_stride) {
    __m512 acc[MAXX];
    _Pragma("GCC unroll 4") for (int k = 0; k < nx; k++) acc[k] = _mm512_setzero_ps();
    const int64_t nb = n / FMOE_QK8_0;
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2, w += 2 * FMOE_Q8_0_BYTES, a += 2 * FMOE_Q8_0_BYTES, da += 2) {
        prefetch(w, 2); /* 68 bytes */
        q8_0_step(w, a, stride, nx, da, da_stride, 1, acc);
    }
    if (b < nb) q8_0_step(w, a, stride, nx, da, da_stride, 0, acc);
    _Pragma("GCC unroll 4") for (int k = 0; k < nx; k++) y[k * ys] = _mm512_reduce_add_ps(acc[k]);
}

/* ---------------------------------------------------------------------------------- */
/* Q4_K, Q5_K                                                                         */
/* ---------------------------------------------------------------------------------- */

/* Bit b of each qh byte (lower 256 bits) and bit b+1 (upper 256 bits) moved to bit 4, b
 * even. 64-bit shifts: bit 4 of a byte comes from bit b (b+1) of the same byte; what they
 * carry across bytes lands elsewhere, and the caller masks bit 4. */
SIMD static INLINE __m512i high_bits(__m512i hb, int b) {
    if (b < 4) return _mm512_sllv_epi64(hb, _mm512_setr_epi64(4 - b, 4 - b, 4 - b, 4 - b, 3 - b, 3 - b, 3 - b, 3 - b));
    return _mm512_srlv_epi64(hb, _mm512_setr_epi64(b - 4, b - 4, b - 4, b - 4, b - 3, b - 3, b - 3, b - 3));
}

/* Q4_K (bits 4) and Q5_K (bits 5): per block Σ_j sc_j·Σ q·a in int32 lanes, and the mins
 * as Σ_j m_j·(bsum_2j + bsum_2j+1) from the activation's bsums. */
SIMD static INLINE void dots_q45_k(const uint8_t *w, const uint8_t *a, int64_t stride, int nx,
                                   int64_t n, float *y, int64_t ys, int bits) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), sixteen = _mm512_set1_epi8(16);
    const __m512i nibble = _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4); /* upper copy: high nibbles */
    const int64_t wbytes = bits == 4 ? FMOE_Q4_K_BYTES : FMOE_Q5_K_BYTES;
    __m512 acc[MAXX];
    __m128 accm[MAXX];
    _Pragma("GCC unroll 4") for (int k = 0; k < nx; k++) {
        acc[k] = _mm512_setzero_ps();
        accm[k] = _mm_setzero_ps();
    }
    for (int64_t i = 0; i < n; i += FMOE_QK_K, w += wbytes, a += FMOE_Q8_K_BYTES) {
        prefetch(w, 3); /* 144 or 176 bytes */
        const float d = f16_at(w), dmin = f16_at(w + 2);
        /* the eight 6-bit scales and mins, as the AVX2 kernel unpacks them */
        uint32_t u[4];
        fmoe__scale_min_k4_all(w + 4, u);
        /* u[0..1]: scales of sub-blocks 0..7, u[2..3]: their mins */
        const __m128i sc16 = _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, (int)u[1], (int)u[0]));
        const __m128i mins = _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, (int)u[3], (int)u[2]));
        const __m512i scales = _mm512_inserti32x4(_mm512_setzero_si512(), sc16, 0);
        const uint8_t *ql = w + (bits == 4 ? 16 : 48);
        const __m512i hb = bits == 5 ? _mm512_broadcast_i64x4(load256(w + 16)) : _mm512_setzero_si512();
        __m512i sumi[MAXX];
        _Pragma("GCC unroll 4") for (int k = 0; k < nx; k++) sumi[k] = _mm512_setzero_si512();
        /* unrolled, so the shift counts and scale indices are constants (the AVX2 kernel
         * measured why) */
        _Pragma("GCC unroll 4")
        for (int jj = 0; jj < 4; jj++, ql += 32) {
            /* sub-blocks 2jj (low nibbles) and 2jj+1 (high nibbles): the 64 values of
             * activation bytes 64jj..64jj+63 */
            const __m512i v = _mm512_broadcast_i64x4(load256(ql));
            __m512i q = _mm512_and_si512(_mm512_srlv_epi64(v, nibble), m4);
            if (bits == 5) q = _mm512_or_si512(q, _mm512_and_si512(high_bits(hb, 2 * jj), sixteen));
            const __m512i s = _mm512_permutexvar_epi16(index_by_16(2 * jj), scales);
            _Pragma("GCC unroll 4") for (int k = 0; k < nx; k++) {
                const uint8_t *qa = a + k * stride + FMOE__Q8K_Q + 64 * jj;
                const __m512i p = _mm512_madd_epi16(s, _mm512_maddubs_epi16(q, load512(qa)));
                sumi[k] = _mm512_add_epi32(sumi[k], p);
            }
        }
        _Pragma("GCC unroll 4") for (int k = 0; k < nx; k++) {
            const uint8_t *ak = a + k * stride;
            const float da = f32_at(ak);
            const __m256i bs = load256(ak + FMOE__Q8K_BSUMS);
            const __m128i pairs = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
            const __m128i pm = _mm_madd_epi16(mins, pairs);
            acc[k] = _mm512_fmadd_ps(_mm512_set1_ps(da * d), _mm512_cvtepi32_ps(sumi[k]), acc[k]);
            accm[k] = _mm_fmadd_ps(_mm_set1_ps(da * dmin), _mm_cvtepi32_ps(pm), accm[k]);
        }
    }
    _Pragma("GCC unroll 4") for (int k = 0; k < nx; k++) {
        __m128 mm = accm[k];
        mm = _mm_add_ps(mm, _mm_movehl_ps(mm, mm));
        mm = _mm_add_ss(mm, _mm_shuffle_ps(mm, mm, 1));
        y[k * ys] = _mm512_reduce_add_ps(acc[k]) - _mm_cvtss_f32(mm);
    }
}

/* ---------------------------------------------------------------------------------- */
/* Q6_K                                                                               */
/* ---------------------------------------------------------------------------------- */

/* Q6_K: 6-bit values 0..63 from ql's nibbles and qh's pairs; the offset of 32 comes off
 * once per block as 32·Σ sc·bsum. Of a half's 128 values, register 0 holds values 0-63
 * (ql's low nibbles, qh bits 0-1 then 2-3) and register 1 values 64-127 (high nibbles,
 * qh bits 4-5 then 6-7): the activation's bytes in order. */
SIMD static INLINE void dots_q6_k(const uint8_t *w, const uint8_t *a, int64_t stride, int nx,
                                  int64_t n, float *y, int64_t ys) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m3 = _mm512_set1_epi8(3);
    const __m512i hshift0 = _mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2, 2);
    const __m512i hshift1 = _mm512_setr_epi64(4, 4, 4, 4, 6, 6, 6, 6);
    __m256 acc[MAXX];
    _Pragma("GCC unroll 4") for (int k = 0; k < nx; k++) acc[k] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += FMOE_QK_K, w += FMOE_Q6_K_BYTES, a += FMOE_Q8_K_BYTES) {
        prefetch(w, 4); /* 210 bytes */
        const float d = f16_at(w + 208);
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + 192)));
        const __m512i scales = _mm512_inserti64x4(_mm512_setzero_si512(), sc16, 0);
        __m512i sumi[MAXX];
        _Pragma("GCC unroll 4") for (int k = 0; k < nx; k++) sumi[k] = _mm512_setzero_si512();
        _Pragma("GCC unroll 2")
        for (int half = 0; half < 2; half++) {
            const __m512i l = load512(w + 64 * half);
            const __m512i h = _mm512_broadcast_i64x4(load256(w + 128 + 32 * half));
            /* 64-bit shifts of qh: bits 2k, 2k+1 of a byte reach bits 0-1 of the same byte
             * (the mask m3 drops what came from the next one) */
            const __m512i q0 = _mm512_or_si512(
                _mm512_and_si512(l, m4),
                _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi64(h, hshift0), m3), 4));
            const __m512i q1 = _mm512_or_si512(
                _mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
                _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi64(h, hshift1), m3), 4));
            /* scales 8·half + 0..3 for register 0, + 4..7 for register 1, 16 values each */
            const __m512i s0 = _mm512_permutexvar_epi16(index_by_8(8 * half), scales);
            const __m512i s1 = _mm512_permutexvar_epi16(index_by_8(8 * half + 4), scales);
            _Pragma("GCC unroll 4") for (int k = 0; k < nx; k++) {
                const uint8_t *qa = a + k * stride + FMOE__Q8K_Q + 128 * half;
                const __m512i p0 = _mm512_madd_epi16(s0, _mm512_maddubs_epi16(q0, load512(qa)));
                const __m512i p1 = _mm512_madd_epi16(s1, _mm512_maddubs_epi16(q1, load512(qa + 64)));
                sumi[k] = _mm512_add_epi32(sumi[k], _mm512_add_epi32(p0, p1));
            }
        }
        _Pragma("GCC unroll 4") for (int k = 0; k < nx; k++) {
            const uint8_t *ak = a + k * stride;
            /* the 16 int32 lanes folded to 8 (exact), then the AVX2 kernel's offset */
            const __m256i s8 = _mm256_add_epi32(_mm512_castsi512_si256(sumi[k]), _mm512_extracti64x4_epi64(sumi[k], 1));
            const __m256i off = _mm256_slli_epi32(_mm256_madd_epi16(load256(ak + FMOE__Q8K_BSUMS), sc16), 5);
            acc[k] = _mm256_fmadd_ps(_mm256_set1_ps(f32_at(ak) * d),
                                     _mm256_cvtepi32_ps(_mm256_sub_epi32(s8, off)), acc[k]);
        }
    }
    _Pragma("GCC unroll 4") for (int k = 0; k < nx; k++) y[k * ys] = fmoe__hsum256(acc[k]);
}

/* ---------------------------------------------------------------------------------- */
/* Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4 against Q8_0 activations                      */
/* ---------------------------------------------------------------------------------- */

/* Blocks b and b+1 (two) or b alone, as q8_0_step: the codes of each block from the AVX2
 * unpack (fmoe__q32_unpack) in one half of the register. Signed codes (Q4_0, Q5_0,
 * IQ4_NL, MXFP4's doubled E2M1 levels, its E8M0 scale halved as the reference's) take Q8_0's |w| and masked negation; Q4_1 and Q5_1's unsigned ones go into
 * maddubs as they are, plus m·Σa with Σa from maddubs against ones. */
SIMD static INLINE void q32_step(uint32_t type, const uint8_t *w, const uint8_t *a, int64_t stride,
                                 int nx, int two, __m512 *acc) {
    const __m512i ones = _mm512_set1_epi16(1), ones8 = _mm512_set1_epi8(1);
    const int64_t wb = fmoe__q32_block_bytes(type);
    const int affine = type == FMOE_GGML_Q4_1 || type == FMOE_GGML_Q5_1;
    const __m256i hi = two ? fmoe__q32_unpack(type, w + wb) : _mm256_setzero_si256();
    const __m512i qw = _mm512_inserti64x4(_mm512_castsi256_si512(fmoe__q32_unpack(type, w)), hi, 1);
    const __m512 dw = type == FMOE_GGML_MXFP4
                          ? halves(fmoe__e8m0_half(w[0]), two ? fmoe__e8m0_half(w[wb]) : 0.f)
                          : halves(f16_at(w), two ? f16_at(w + wb) : 0.f);
    if (!affine) {
        const __m512i aw = _mm512_abs_epi8(qw);
        const __mmask64 neg = _mm512_movepi8_mask(qw);
        _Pragma("GCC unroll 4") for (int k = 0; k < nx; k++) {
            const uint8_t *ak = a + k * stride;
            const __m512i qa = q8_0_pair(ak + 2, two);
            const __m512i sa = _mm512_mask_sub_epi8(qa, neg, _mm512_setzero_si512(), qa);
            const __m512i p = _mm512_madd_epi16(_mm512_maddubs_epi16(aw, sa), ones);
            const __m512 da = halves(f16_at(ak), two ? f16_at(ak + FMOE_Q8_0_BYTES) : 0.f);
            acc[k] = _mm512_fmadd_ps(_mm512_mul_ps(dw, da), _mm512_cvtepi32_ps(p), acc[k]);
        }
    } else {
        const __m512 mw = halves(f16_at(w + 2), two ? f16_at(w + wb + 2) : 0.f);
        _Pragma("GCC unroll 4") for (int k = 0; k < nx; k++) {
            const uint8_t *ak = a + k * stride;
            const __m512i qa = q8_0_pair(ak + 2, two);
            const __m512i p = _mm512_madd_epi16(_mm512_maddubs_epi16(qw, qa), ones);
            const __m512i sa = _mm512_madd_epi16(_mm512_maddubs_epi16(ones8, qa), ones);
            const __m512 da = halves(f16_at(ak), two ? f16_at(ak + FMOE_Q8_0_BYTES) : 0.f);
            acc[k] = _mm512_fmadd_ps(_mm512_mul_ps(dw, da), _mm512_cvtepi32_ps(p), acc[k]);
            acc[k] = _mm512_fmadd_ps(_mm512_mul_ps(mw, da), _mm512_cvtepi32_ps(sa), acc[k]);
        }
    }
}

SIMD static INLINE void dots_q32(const uint8_t *w, const uint8_t *a, int64_t stride, int nx,
                                 int64_t n, float *y, int64_t ys, uint32_t type) {
    const int64_t wb = fmoe__q32_block_bytes(type), nb = n / FMOE_QK8_0;
    __m512 acc[MAXX];
    _Pragma("GCC unroll 4") for (int k = 0; k < nx; k++) acc[k] = _mm512_setzero_ps();
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2, w += 2 * wb, a += 2 * FMOE_Q8_0_BYTES) {
        prefetch(w, 1);
        q32_step(type, w, a, stride, nx, 1, acc);
    }
    if (b < nb) q32_step(type, w, a, stride, nx, 0, acc);
    _Pragma("GCC unroll 4") for (int k = 0; k < nx; k++) y[k * ys] = _mm512_reduce_add_ps(acc[k]);
}

/* ---------------------------------------------------------------------------------- */
/* Rows and inputs: the loops every level shares                                      */
/* ---------------------------------------------------------------------------------- */

#define QUANT_ACT_ROWS fmoe__quant_act_rows_avx512
#include "quant_act_rows.inc"

/* Q2_K, Q3_K, IQ4_XS (lib/quant_kx.c): Σ_s sc_s·Σ q·a over a block unpacked to signed
 * bytes, four sub-blocks of 16 a register; q's sign moved onto the activation as Q8_0's,
 * each sub-block's 8 int16 pair sums multiplied by its scale. The same integer as the
 * reference's (no int16 saturates: |q|, |a| <= 127). */
SIMD int32_t fmoe__kx_isum_avx512(const fmoe__kx_block *u, const int8_t *qa) {
    __m512i acc = _mm512_setzero_si512();
    /* the 16 scales in the low half of a register; lane j of part p's product (8 pairs a
     * sub-block) takes scale 4p + j / 8, picked by a permute rather than built in memory */
    const __m512i sc16 = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)u->sc));
    const __m512i eighth = _mm512_srli_epi16(
        _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14,
                         13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), 3);
    for (int p = 0; p < 4; p++) {
        const __m512i qw = _mm512_loadu_si512((const void *)(u->q + 64 * p));
        const __m512i a = _mm512_loadu_si512((const void *)(qa + 64 * p));
        const __mmask64 neg = _mm512_movepi8_mask(qw);
        const __m512i sa = _mm512_mask_sub_epi8(a, neg, _mm512_setzero_si512(), a);
        const __m512i prod = _mm512_maddubs_epi16(_mm512_abs_epi8(qw), sa);
        const __m512i scv = _mm512_permutexvar_epi16(
            _mm512_add_epi16(eighth, _mm512_set1_epi16((short)(4 * p))), sc16);
        acc = _mm512_add_epi32(acc, _mm512_madd_epi16(prod, scv));
    }
    /* summed by halves: GCC 12 refuses to inline _mm512_reduce_add_epi32 here */
    const __m256i h =
        _mm256_add_epi32(_mm512_castsi512_si256(acc), _mm512_extracti64x4_epi64(acc, 1));
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

#else

int32_t fmoe__kx_isum_avx512(const fmoe__kx_block *u, const int8_t *qa) {
    (void)u, (void)qa;
    return 0; /* never called: no AVX-512 level off x86-64 */
}

void fmoe__quant_act_rows_avx512(uint32_t t, const void *W, int64_t row_bytes, int64_t rows,
                                 const void *qx, int64_t stride, int32_t nx, int64_t n, float *y,
                                 int64_t ldy) {
    for (int64_t r = 0; r < rows; r++)
        for (int32_t k = 0; k < nx; k++)
            y[k * ldy + r] = fmoe_quant_act_dot_ref(t, (const uint8_t *)W + r * row_bytes,
                                                    (const uint8_t *)qx + k * stride, n);
}

#endif
