/*
 * quant_act_vnni.c - the 8-bit-activation dots of the 32-value block types (Q8_0, Q4_0,
 * Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4) with AVX-512 VNNI's vpdpbusd on 256-bit registers
 * (_mm256_dpbusd_epi32: EVEX-encoded, so it needs AVX512_VNNI and AVX512VL). lib/quant.c
 * picks this file's entry at the FMOE__QUANT_VNNI level (fmoe__quant_q32_level); the
 * K-quants at that level go on to lib/quant_act_avx512.c.
 *
 * These are lib/quant_act_avx2.c's dots_q8_0 and dots_q32 with three changes (the third,
 * the codes' unpacking with AVX-512 VL/BW, is described at codes below):
 * - where those form a block's eight int32 partial sums with _mm256_maddubs_epi16 (32 u8·s8
 *   products, pairs summed to int16) then _mm256_madd_epi16 against ones (pairs to int32),
 *   vpdpbusd forms the same eight sums in one instruction: int32 lane i += Σ_{j<4}
 *   u8[4i+j]·s8[4i+j] (Intel SDM, VPDPBUSD), summed in 32 bits with no int16 step to
 *   saturate. Started from zero, lane i is exactly the AVX2 kernel's lane i (whose int16
 *   pairs never saturate either: |pair| <= 2·128·127), so the block sums are the
 *   reference's integers;
 * - the scaled blocks go into two sets of f32 accumulators, even blocks and odd ones, and
 *   Q4_1/Q5_1's m·Σa terms into sets of their own: one input's additions are then
 *   independent chains of FMAs instead of one (or two in a row) per block, which is what
 *   the one-input AVX2 kernels wait on (4 cycles an FMA on Zen 4). The sets are summed at
 *   the end the same way whatever the input count, so a result does not depend on how many
 *   inputs came with it. This order is neither the plain reference's nor the AVX2
 *   kernels': results agree with them within f32 rounding, not bit for bit (a kernel that
 *   kept the reference's order, eight block results a vector added one by one, was
 *   slower than the AVX2 kernels: docs/quantization.md "Speed").
 *
 * The signs, as in the AVX2 kernels and ggml's mul_sum_i8_pairs_float: vpdpbusd's first
 * operand is unsigned, so it takes |w| (_mm256_sign_epi8(w, w); Q8_0's -128 becomes the
 * byte 0x80, 128 unsigned, which is its magnitude) and w's sign moves onto the activation
 * (_mm256_sign_epi8(a, w), zero where w is zero: the product is zero either way). Q4_1 and
 * Q5_1's codes (0..31) are unsigned already; Σa is vpdpbusd of bytes of 1 with a.
 *
 * Why 256-bit: Zen 4 splits a 512-bit operation into two 256-bit halves, and on it these
 * types' 512-bit kernels ran 15-20% slower than their AVX2 ones (lib/quant_impl.h,
 * fmoe__quant_q32_level); VNNI saves the 256-bit kernels an instruction per 32 products.
 *
 * Under FMOE_EMULATE_AVX512 (tests/lib/meson.build's *_avx512_emulated binaries) the
 * intrinsic comes from SIMDe (lib/simd512.h), so a CPU without VNNI runs the same source.
 */
#include <stdint.h>
#include <string.h>

#include "dot_avx2.h"
#include "fmoe/quant.h"
#include "fmoe/quant_act.h"
#include "quant_act_impl.h"
#include "quant_impl.h"
#include "quant_unpack_avx2.h"

#if defined(__x86_64__)
#include "simd512.h"

#ifdef FMOE_EMULATE_AVX512
#define SIMD FMOE__AVX512 /* empty: the file is compiled with -mavx2 -mfma -mf16c */
#else
#define SIMD __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))
#endif
#define INLINE __attribute__((always_inline)) inline
#define MAXX 4 /* inputs per pass, as lib/quant_act_avx2.c */

/* as lib/quant_act_avx2.c: the weight stream asked for this far ahead */
#define PREFETCH_BYTES 2048

SIMD static INLINE float f16_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

SIMD static INLINE __m256i load(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* Eight int32 lanes, lane i the sum of u[4i..4i+3]·s[4i..4i+3] (u unsigned, s signed). */
SIMD static INLINE __m256i dot4(__m256i u, __m256i s) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
}

/* A block's 32 codes as signed bytes, as fmoe__q32_unpack (lib/quant_unpack_avx2.h) gives
 * them (byte l from the low nibble of qs[l], byte 16 + l from its high one; Q4_0, Q5_0
 * offset removed; IQ4_NL, MXFP4 as their levels) in fewer instructions with AVX-512 VL and
 * BW: the 16 bytes broadcast to both lanes and the high lane shifted by 4 (one variable
 * 16-bit shift: what it brings in from the next byte the mask drops), and the 5-bit types'
 * qh used as a byte mask (bit l for byte l): Q5_1 takes nibble | 16 where the bit is set,
 * Q5_0 nibble - 16 where it is not (nibble + 16·bit - 16). */
SIMD static INLINE __m256i codes(uint32_t type, const uint8_t *b) {
    const int qs_at = type == FMOE_GGML_MXFP4  ? 1
                      : type == FMOE_GGML_Q4_1 ? 4
                      : type == FMOE_GGML_Q5_0 ? 6
                      : type == FMOE_GGML_Q5_1 ? 8
                                               : 2;
    const __m256i sixteen = _mm256_set1_epi8(16);
    const __m256i both = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(b + qs_at)));
    __m256i q = _mm256_and_si256(
        _mm256_srlv_epi16(both, _mm256_setr_epi16(0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 4, 4, 4, 4)),
        _mm256_set1_epi8(0x0F));
    if (type == FMOE_GGML_Q5_0 || type == FMOE_GGML_Q5_1) {
        uint32_t h;
        memcpy(&h, b + (type == FMOE_GGML_Q5_0 ? 2 : 4), 4);
        /* a blend, not a masked add: SIMDe 0.7.4 (the emulated build) has no masked add */
        q = type == FMOE_GGML_Q5_1 ? _mm256_mask_blend_epi8((__mmask32)h, q, _mm256_or_si256(q, sixteen))
                                   : _mm256_mask_blend_epi8((__mmask32)h, _mm256_sub_epi8(q, sixteen), q);
    }
    if (type == FMOE_GGML_Q4_0) q = _mm256_sub_epi8(q, _mm256_set1_epi8(8));
    if (type == FMOE_GGML_IQ4_NL)
        q = _mm256_shuffle_epi8(_mm256_setr_epi8(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38,
                                                 53, 69, 89, 113, -127, -104, -83, -65, -49, -35, -22,
                                                 -10, 1, 13, 25, 38, 53, 69, 89, 113), /* FMOE__IQ4NL_LEVELS */
                                q);
    if (type == FMOE_GGML_MXFP4)
        q = _mm256_shuffle_epi8(_mm256_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12,
                                                 0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12),
                                q); /* FMOE__MXFP4_LEVELS */
    return q;
}

/* The accumulators: two sets, for even and odd blocks, so one input's f32 additions are two
 * chains of FMAs, not one (4 cycles each on Zen 4: the one-input kernels waited on it),
 * and for Q4_1 and Q5_1 the m·Σa terms in sets of their own. Summed at the end the same way
 * whatever the input count: (even + odd) + (m even + m odd), then fmoe__hsum256. */
typedef struct {
    __m256 d[2][MAXX], m[2][MAXX];
} accs;

SIMD static INLINE void accs_zero(accs *c, int nx) {
    _Pragma("GCC unroll 4") for (int k = 0; k < nx; k++) {
        c->d[0][k] = c->d[1][k] = _mm256_setzero_ps();
        c->m[0][k] = c->m[1][k] = _mm256_setzero_ps();
    }
}

SIMD static INLINE void accs_store(const accs *c, int nx, float *y, int64_t ys, int affine) {
    _Pragma("GCC unroll 4") for (int k = 0; k < nx; k++) {
        __m256 v = _mm256_add_ps(c->d[0][k], c->d[1][k]);
        if (affine) v = _mm256_add_ps(v, _mm256_add_ps(c->m[0][k], c->m[1][k]));
        y[k * ys] = fmoe__hsum256(v);
    }
}

/* One Q8_0 block against nx inputs into the set par; da: the inputs' block scales, widened
 * once per call (rows_q8_0), da_stride apart. */
SIMD static INLINE void q8_0_block(const uint8_t *w, const uint8_t *a, int64_t stride, int nx,
                                   const float *da, int64_t da_stride, accs *c, int par) {
    const __m256i qw = load(w + 2);
    const __m256i aw = _mm256_sign_epi8(qw, qw);
    const __m256 dw = _mm256_set1_ps(f16_at(w));
    _Pragma("GCC unroll 4") for (int k = 0; k < nx; k++) {
        const __m256i p = dot4(aw, _mm256_sign_epi8(load(a + k * stride + 2), qw));
        const __m256 d = _mm256_mul_ps(dw, _mm256_broadcast_ss(da + k * da_stride));
        c->d[par][k] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), c->d[par][k]);
    }
}

SIMD static INLINE void dots_q8_0(const uint8_t *w, const uint8_t *a, int64_t stride, int nx,
                                  int64_t n, float *y, int64_t ys, const float *da,
                                  int64_t da_stride) {
    const int64_t bb = FMOE_Q8_0_BYTES;
    accs c;
    accs_zero(&c, nx);
    int64_t i = 0;
    for (; i + 2 * FMOE_QK8_0 <= n; i += 2 * FMOE_QK8_0, w += 2 * bb, a += 2 * bb, da += 2) {
        _mm_prefetch((const char *)w + PREFETCH_BYTES, _MM_HINT_T0);
        _mm_prefetch((const char *)w + PREFETCH_BYTES + 64, _MM_HINT_T0);
        q8_0_block(w, a, stride, nx, da, da_stride, &c, 0);
        q8_0_block(w + bb, a + bb, stride, nx, da + 1, da_stride, &c, 1);
    }
    if (i < n) q8_0_block(w, a, stride, nx, da, da_stride, &c, 0);
    accs_store(&c, nx, y, ys, 0);
}

/* One block of Q4_0, Q5_0, IQ4_NL, MXFP4 (signed codes: |code| into the unsigned operand)
 * or Q4_1, Q5_1 (unsigned codes as they are, plus m·Σa), the codes from fmoe__q32_unpack,
 * against nx inputs into the set par. */
SIMD static INLINE void q32_block(uint32_t type, const uint8_t *w, const uint8_t *a, int64_t stride,
                                  int nx, accs *c, int par) {
    const int affine = type == FMOE_GGML_Q4_1 || type == FMOE_GGML_Q5_1;
    const __m256i qw = codes(type, w);
    const __m256 dw = _mm256_set1_ps(type == FMOE_GGML_MXFP4 ? fmoe__e8m0_half(w[0]) : f16_at(w));
    if (!affine) {
        const __m256i aw = _mm256_sign_epi8(qw, qw);
        _Pragma("GCC unroll 4") for (int k = 0; k < nx; k++) {
            const uint8_t *ak = a + k * stride;
            const __m256i p = dot4(aw, _mm256_sign_epi8(load(ak + 2), qw));
            const __m256 d = _mm256_mul_ps(dw, _mm256_set1_ps(f16_at(ak)));
            c->d[par][k] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), c->d[par][k]);
        }
    } else {
        const __m256i ones8 = _mm256_set1_epi8(1);
        const __m256 mw = _mm256_set1_ps(f16_at(w + 2));
        _Pragma("GCC unroll 4") for (int k = 0; k < nx; k++) {
            const uint8_t *ak = a + k * stride;
            const __m256i qa = load(ak + 2);
            const __m256 da = _mm256_set1_ps(f16_at(ak));
            c->d[par][k] = _mm256_fmadd_ps(_mm256_mul_ps(dw, da), _mm256_cvtepi32_ps(dot4(qw, qa)), c->d[par][k]);
            c->m[par][k] = _mm256_fmadd_ps(_mm256_mul_ps(mw, da), _mm256_cvtepi32_ps(dot4(ones8, qa)), c->m[par][k]);
        }
    }
}

SIMD static INLINE void dots_q32(const uint8_t *w, const uint8_t *a, int64_t stride, int nx,
                                 int64_t n, float *y, int64_t ys, uint32_t type) {
    const int64_t wb = fmoe__q32_block_bytes(type), ab = FMOE_Q8_0_BYTES;
    accs c;
    accs_zero(&c, nx);
    int64_t i = 0;
    for (; i + 2 * FMOE_QK8_0 <= n; i += 2 * FMOE_QK8_0, w += 2 * wb, a += 2 * ab) {
        _mm_prefetch((const char *)w + PREFETCH_BYTES, _MM_HINT_T0);
        q32_block(type, w, a, stride, nx, &c, 0);
        q32_block(type, w + wb, a + ab, stride, nx, &c, 1);
    }
    if (i < n) q32_block(type, w, a, stride, nx, &c, 0);
    accs_store(&c, nx, y, ys, type == FMOE_GGML_Q4_1 || type == FMOE_GGML_Q5_1);
}

/* One function per input count and type, so the unrolled input loop keeps its
 * accumulators in registers and every branch on the type folds (lib/quant_act_rows.inc
 * says why: a run-time type cost 2-10x per block). */
#define ROWS_N(name, T)                                                                            \
    SIMD static void name(const uint8_t *W, int64_t row_bytes, int64_t rows, const uint8_t *a,     \
                          int64_t s, int nx, int64_t n, float *y, int64_t ys) {                     \
        for (int64_t r = 0; r < rows; r++) {                                                       \
            const uint8_t *w = W + r * row_bytes;                                                  \
            switch (nx) {                                                                          \
            case 1: dots_q32(w, a, s, 1, n, y + r, ys, T); break;                                  \
            case 2: dots_q32(w, a, s, 2, n, y + r, ys, T); break;                                  \
            case 3: dots_q32(w, a, s, 3, n, y + r, ys, T); break;                                  \
            default: dots_q32(w, a, s, 4, n, y + r, ys, T); break;                                 \
            }                                                                                      \
        }                                                                                          \
    }
ROWS_N(rows_q4_0, FMOE_GGML_Q4_0)
ROWS_N(rows_q4_1, FMOE_GGML_Q4_1)
ROWS_N(rows_q5_0, FMOE_GGML_Q5_0)
ROWS_N(rows_q5_1, FMOE_GGML_Q5_1)
ROWS_N(rows_iq4_nl, FMOE_GGML_IQ4_NL)
ROWS_N(rows_mxfp4, FMOE_GGML_MXFP4)
#undef ROWS_N

SIMD static void rows_q8_0_n(const uint8_t *W, int64_t row_bytes, int64_t rows, const uint8_t *a,
                             int64_t s, int nx, int64_t n, float *y, int64_t ys, const float *da,
                             int64_t das) {
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *w = W + r * row_bytes;
        switch (nx) {
        case 1: dots_q8_0(w, a, s, 1, n, y + r, ys, da, das); break;
        case 2: dots_q8_0(w, a, s, 2, n, y + r, ys, da, das); break;
        case 3: dots_q8_0(w, a, s, 3, n, y + r, ys, da, das); break;
        default: dots_q8_0(w, a, s, 4, n, y + r, ys, da, das); break;
        }
    }
}

/* Q8_0 rows: the inputs' f16 block scales widened to f32 once per call, in groups of
 * inputs whose table fits DA_FLOATS, as lib/quant_act_rows.inc's rows_q8_0 (whose
 * products these are, bit for bit). */
#define DA_FLOATS 4096

SIMD static void rows_q8_0(const uint8_t *W, int64_t row_bytes, int64_t rows, const uint8_t *a,
                           int64_t stride, int32_t nx, int64_t n, float *y, int64_t ldy) {
    float da[DA_FLOATS];
    const int64_t nb = n / FMOE_QK8_0;
    if (nb > DA_FLOATS) { /* rows of over 131072 values: the plain dot, as the AVX2 path */
        for (int64_t r = 0; r < rows; r++)
            for (int32_t k = 0; k < nx; k++)
                y[k * ldy + r] = fmoe_quant_act_dot_ref(FMOE_GGML_Q8_0, W + r * row_bytes, a + k * stride, n);
        return;
    }
    int64_t group = DA_FLOATS / nb / MAXX * MAXX;
    if (group < 1) group = DA_FLOATS / nb;
    for (int32_t g0 = 0; g0 < nx; g0 += (int32_t)group) {
        const int32_t gm = nx - g0 < group ? nx - g0 : (int32_t)group;
        for (int32_t k = 0; k < gm; k++)
            for (int64_t b = 0; b < nb; b++) da[k * nb + b] = f16_at(a + (g0 + k) * stride + b * FMOE_Q8_0_BYTES);
        for (int32_t k0 = 0; k0 < gm; k0 += MAXX) {
            const int m = gm - k0 < MAXX ? gm - k0 : MAXX;
            rows_q8_0_n(W, row_bytes, rows, a + (g0 + k0) * stride, stride, m, n,
                        y + (g0 + k0) * ldy, ldy, da + k0 * nb, nb);
        }
    }
}

void fmoe__quant_act_rows_vnni(uint32_t t, const void *W, int64_t row_bytes, int64_t rows,
                               const void *qx, int64_t stride, int32_t nx, int64_t n, float *y,
                               int64_t ldy) {
    const uint8_t *w = W, *a = qx;
    void (*rows_of)(const uint8_t *, int64_t, int64_t, const uint8_t *, int64_t, int, int64_t,
                    float *, int64_t);
    switch (t) {
    case FMOE_GGML_Q8_0: rows_q8_0(w, row_bytes, rows, a, stride, nx, n, y, ldy); return;
    case FMOE_GGML_Q4_0: rows_of = rows_q4_0; break;
    case FMOE_GGML_Q4_1: rows_of = rows_q4_1; break;
    case FMOE_GGML_Q5_0: rows_of = rows_q5_0; break;
    case FMOE_GGML_Q5_1: rows_of = rows_q5_1; break;
    case FMOE_GGML_IQ4_NL: rows_of = rows_iq4_nl; break;
    case FMOE_GGML_MXFP4: rows_of = rows_mxfp4; break;
    default: /* the K-quants: VNNI implies the AVX-512 level, whose kernels serve them */
        fmoe__quant_act_rows_avx512(t, W, row_bytes, rows, qx, stride, nx, n, y, ldy);
        return;
    }
    /* inputs in groups of MAXX, each group over all the rows, as the AVX2 path */
    for (int32_t k0 = 0; k0 < nx; k0 += MAXX) {
        const int m = nx - k0 < MAXX ? nx - k0 : MAXX;
        rows_of(w, row_bytes, rows, a + k0 * stride, stride, m, n, y + k0 * ldy, ldy);
    }
}

#else

void fmoe__quant_act_rows_vnni(uint32_t t, const void *W, int64_t row_bytes, int64_t rows,
                               const void *qx, int64_t stride, int32_t nx, int64_t n, float *y,
                               int64_t ldy) {
    /* no VNNI level off x86-64 (lib/quant.c never picks it): the plain dots */
    for (int64_t r = 0; r < rows; r++)
        for (int32_t k = 0; k < nx; k++)
            y[k * ldy + r] = fmoe_quant_act_dot_ref(t, (const uint8_t *)W + r * row_bytes,
                                                    (const uint8_t *)qx + k * stride, n);
}

#endif
