/*
 * quant_act_avx2.c - integer dots of ggml block rows with 8-bit activations, AVX2 (+ FMA,
 * F16C), after ggml's x86 vec_dot_{q8_0_q8_0, q4_K_q8_K, q5_K_q8_K, q6_K_q8_K}. Compiled for
 * every x86-64 build with target attributes; lib/quant_act.c calls it only when the CPU
 * has the instructions.
 *
 * The workhorse is _mm256_maddubs_epi16 (32 unsigned × signed byte products, summed in
 * pairs to int16) followed by _mm256_madd_epi16 with the sub-block's scale (pairs summed
 * to int32): 32 multiply-adds per instruction against 8 for an f32 FMA, and the weights
 * are never widened past bytes. The K-quants' values are unsigned (0..15, 0..31, 0..63),
 * so they go in maddubs's unsigned operand as they are; their mins and Q6_K's offset of 32
 * are applied through the activation block's bsums. Q8_0 weights are signed: |w| goes in
 * the unsigned operand and w's sign onto the activation (_mm256_sign_epi8). No int16
 * saturates: the largest pair is 2·128·127 (Q8_0's -128 as |w|) and activations stay
 * within ±127.
 *
 * Each kernel takes up to four inputs, unpacking a row block once for all of them; each
 * input has its own accumulators, summed in the same order whatever the count, so a
 * result never depends on how many inputs came with it. The loops over inputs carry
 * GCC unroll pragmas: without them GCC 12 kept them as loops with the accumulators in
 * memory (a store and a reload per input and block, 10-35% of the time at four inputs).
 * Eight inputs a pass were slower than four (accumulators spilled). The VNNI build takes
 * Q5_K's products with four inputs or more in row panels instead (dots_q5_k_panel).
 *
 * The 32-value types Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL and MXFP4 (dots_q32) take eight rows a
 * pass as well, with each row's block sums reduced into one f32 lane and added as the
 * plain reference adds them: the reference's bits, whatever the rows and inputs.
 */
#include <stdint.h>
#include <string.h>

#include "dot_avx2.h"
#include "half.h"
#include "fmoe/quant.h"
#include "quant_unpack_avx2.h"
#include "fmoe/quant_act.h"
#include "quant_act_impl.h"
#include "quant_impl.h"

#if defined(__x86_64__)
#include <immintrin.h>

#ifdef FMOE_QUANT_ACT_VNNI /* lib/quant_act_avx2_vnni.c: this file again, with AVX512-VNNI */
/* (with BMI2, which fmoe__quant_vnni also asks for, so that quant_rows1_avx2.h's panel
 * functions inline here) */
#define SIMD __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,gfni,bmi2")))
#define FMOE__R1_VNNI 1
#include "quant_rows1_avx2.h"
#else
#define SIMD __attribute__((target("avx2,fma,f16c")))
#endif
#define INLINE __attribute__((always_inline)) inline
#define MAXX 4 /* inputs per pass */
#define KERNEL_ROWS 8 /* rows per pass of the 32-value kernels (dots_q32) */
/* dots_q32 asks for the weights this many bytes past its pass's end (q32_block, q32_reach) */
#define Q32_PREFETCH_BYTES 8192

/* Each kernel asks for the weight bytes this far ahead of the block it reads (the rows of
 * a matrix are one stream). The hardware prefetcher alone kept one core at 5-10 GB/s
 * while the other core's jobs also read memory; with these requests, 10-14 GB/s
 * (docs/quantization.md). That was measured with 2048 bytes, on an earlier VM; on the
 * Zen 4 one that is too short. Matrices streamed from memory (not from the 32 MiB L3;
 * bench_vs_ggml --kernels --stream 1024 1024), ps a multiply-add with 2048 / 4096 / 8192:
 * Q4_K 22.2-22.6 / 19.6-19.8 / 19.4-20.1, Q6_K 25.1-26.7 / 23.0-24.9 / 21.6-21.7, Q8_0
 * 31.4-35.9 / 26.9-28.3 / 25.3-26.7. The whole Q4_K model's decode preferred 4096 to
 * 8192 (1 thread 377-389 against 365-387 tokens/s, 2 threads 562-582 against 534-548):
 * the pool hands a thread 16-row chunks (9 KiB of 1024-wide Q4_K rows), so the further
 * requests may fall in chunks another core reads (a guess, not measured). Prefetches past
 * the matrix's end do not fault. */
#define PREFETCH_BYTES 4096

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

SIMD static INLINE __m256i load(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* Σ u·s in int32 lanes, four byte products each: u unsigned, s signed bytes. */
SIMD static INLINE __m256i isum_us(__m256i u, __m256i s) {
#ifdef FMOE_QUANT_ACT_VNNI
    /* vpdpbusd: the four products of each int32 lane summed in one instruction, the same
     * integers as maddubs then madd, as no int16 pair of those saturates (above) */
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

/* acc + the int16 lanes of s times those of p, summed in pairs into int32 lanes: one
 * vpdpwssd in the VNNI build for madd then add (the same integers: no pair of the K-quant
 * kernels' comes near 2^31, below) */
SIMD static INLINE __m256i add_madd(__m256i acc, __m256i s, __m256i p) {
#ifdef FMOE_QUANT_ACT_VNNI
    return _mm256_dpwssd_epi32(acc, s, p);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(s, p));
#endif
}

/* The high nibble of each byte (values 0..15): in the VNNI build (whose CPUs have GFNI,
 * fmoe__quant_vnni) one affine byte transform, the bit matrix taking bits 4-7 to 0-3,
 * for a shift and a mask. */
SIMD static INLINE __m256i high_nibbles(__m256i v) {
#ifdef FMOE_QUANT_ACT_VNNI
    return _mm256_gf2p8affine_epi64_epi8(v, _mm256_set1_epi64x(0x1020408000000000ll), 0);
#else
    return _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F));
#endif
}

/* Σ w·a of one 32-value block in int32 lanes, w's codes signed (|w| in aw, w in qw): w's
 * sign moves onto the activation, whose 32 bytes are at qa. */
SIMD static INLINE __m256i isum_signed(__m256i aw, __m256i qw, const uint8_t *qa) {
    return isum_us(aw, _mm256_sign_epi8(load(qa), qw));
}

/* Q8_0 against inputs whose block scales da (f32, [nx][n/32], da_stride apart) were
 * widened once per call by fmoe__quant_act_rows_avx2: a broadcast load each instead of an
 * f16 conversion per block, input and row. dw·da is the same f32 product either way.
 *
 * Blocks go in pairs, each pair's two scaled sums added together before they join the
 * accumulator (acc += d1·p1 + d0·p0): one dependent add per 64 values instead of one
 * dependent FMA per 32, whose 4-cycle latency had bounded the one-input loop (ggml's
 * kernels keep two accumulators for the same reason). Every input count uses this order,
 * so an input's result does not depend on its companions. */
SIMD static INLINE void dots_q8_0(const uint8_t *w, const uint8_t *a, int64_t stride, int nx,
                                  int64_t n, float *y, int64_t ys, const float *da,
                                  int64_t da_stride) {
    const int64_t nb = n / FMOE_QK8_0;
    __m256 acc[MAXX];
    _Pragma("GCC unroll 4") for (int k = 0; k < nx; k++) acc[k] = _mm256_setzero_ps();
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2, w += 2 * FMOE_Q8_0_BYTES, a += 2 * FMOE_Q8_0_BYTES, da += 2) {
        prefetch(w, 2); /* 68 bytes */
        const __m256i qw0 = load(w + 2), qw1 = load(w + FMOE_Q8_0_BYTES + 2);
        const __m256i aw0 = _mm256_sign_epi8(qw0, qw0), aw1 = _mm256_sign_epi8(qw1, qw1);
        const float dw0 = f16_at(w), dw1 = f16_at(w + FMOE_Q8_0_BYTES);
        _Pragma("GCC unroll 4") for (int k = 0; k < nx; k++) {
            const uint8_t *ak = a + k * stride;
            const float *dk = da + k * da_stride;
            const __m256i p0 = isum_signed(aw0, qw0, ak + 2);
            const __m256i p1 = isum_signed(aw1, qw1, ak + FMOE_Q8_0_BYTES + 2);
            __m256 t = _mm256_mul_ps(_mm256_set1_ps(dw1 * dk[1]), _mm256_cvtepi32_ps(p1));
            t = _mm256_fmadd_ps(_mm256_set1_ps(dw0 * dk[0]), _mm256_cvtepi32_ps(p0), t);
            acc[k] = _mm256_add_ps(acc[k], t);
        }
    }
    if (b < nb) { /* an odd last block */
        const __m256i qw = load(w + 2);
        const __m256i aw = _mm256_sign_epi8(qw, qw);
        const float dw = f16_at(w);
        _Pragma("GCC unroll 4") for (int k = 0; k < nx; k++) {
            const __m256i p = isum_signed(aw, qw, a + k * stride + 2);
            acc[k] = _mm256_fmadd_ps(_mm256_set1_ps(dw * da[k * da_stride]), _mm256_cvtepi32_ps(p), acc[k]);
        }
    }
    _Pragma("GCC unroll 4") for (int k = 0; k < nx; k++) y[k * ys] = fmoe__hsum256(acc[k]);
}

/* Q4_K (bits 4) and Q5_K (bits 5): per block Σ_j sc_j·Σ q·a in int32 lanes, and the mins
 * as Σ_j m_j·(bsum_2j + bsum_2j+1) from the activation's bsums, in eight lanes each, both
 * accumulated in f32 and reduced at the end. Per block this is mostly bookkeeping around
 * 16 multiply instructions, and the bookkeeping was half the time: d and dmin are
 * converted by one instruction and scaled by da by one, the mins' lanes formed by one
 * madd (L2-resident, 1024-wide rows: 18.2 -> 16.5-17.0 ps a multiply-add on Zen 4,
 * bench_vs_ggml --kernels 1024 1024; llama.cpp's repacked gemv 16.8-17.2). */
SIMD static INLINE void dots_q45_k(const uint8_t *w, const uint8_t *a, int64_t stride, int nx,
                                   int64_t n, float *y, int64_t ys, int bits) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), sixteen = _mm256_set1_epi8(16);
    const int64_t wbytes = bits == 4 ? FMOE_Q4_K_BYTES : FMOE_Q5_K_BYTES;
    __m256 acc[MAXX], accm[MAXX];
    _Pragma("GCC unroll 4") for (int k = 0; k < nx; k++) acc[k] = accm[k] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += FMOE_QK_K, w += wbytes, a += FMOE_Q8_K_BYTES) {
        prefetch(w, 3); /* 144 or 176 bytes */
        /* d and dmin converted together */
        uint32_t dd;
        memcpy(&dd, w, 4);
        const __m128 ddf = _mm_cvtph_ps(_mm_cvtsi32_si128((int)dd));
        /* the eight 6-bit scales and mins as int16 lanes, all at once
         * (fmoe__scale_min_k4_all) */
        uint32_t u[4];
        fmoe__scale_min_k4_all(w + 4, u);
        /* u[0..1]: scales of sub-blocks 0..7, u[2..3]: their mins */
        const __m128i sc16 = _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, (int)u[1], (int)u[0]));
        /* each min twice, in the int16 lanes of the two bsums of its sub-block */
        const __m128i m8 = _mm_set_epi32(0, 0, (int)u[3], (int)u[2]);
        const __m256i mins = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
        const __m256i scales = _mm256_broadcastsi128_si256(sc16);
        const uint8_t *ql = w + (bits == 4 ? 16 : 48);
        const __m256i hb = bits == 5 ? load(w + 16) : _mm256_setzero_si256();
        /* even and odd sub-blocks in their own int32 sums, two dependency chains (one
         * vpdpwssd each a sub-block in the VNNI build), added at the block's end */
        __m256i sumi[MAXX], sumo[MAXX];
        _Pragma("GCC unroll 4") for (int k = 0; k < nx; k++) sumi[k] = sumo[k] = _mm256_setzero_si256();
        /* unrolled, so the shuffle masks below are constants: GCC 12 kept this loop and
         * built them at run time, 30% slower on a Zen 3 core (docs/quantization.md) */
        _Pragma("GCC unroll 4")
        for (int jj = 0; jj < 4; jj++, ql += 32) {
            const __m256i v = load(ql);
            __m256i q0 = _mm256_and_si256(v, m4);
            __m256i q1 = high_nibbles(v);
            if (bits == 5) {
                /* bit 2jj (2jj+1) of each qh byte to bit 4 by a 16-bit shift: the bits it
                 * carries across the byte boundary land below bit 4, which the mask drops */
                const int b0 = 2 * jj, b1 = 2 * jj + 1;
                const __m256i h0 = b0 < 4 ? _mm256_slli_epi16(hb, 4 - b0) : _mm256_srli_epi16(hb, b0 - 4);
                const __m256i h1 = b1 < 4 ? _mm256_slli_epi16(hb, 4 - b1) : _mm256_srli_epi16(hb, b1 - 4);
                q0 = _mm256_or_si256(q0, _mm256_and_si256(h0, sixteen));
                q1 = _mm256_or_si256(q1, _mm256_and_si256(h1, sixteen));
            }
            const __m256i s0 = _mm256_shuffle_epi8(scales, _mm256_set1_epi16((short)(0x0100 + 0x0202 * 2 * jj)));
            const __m256i s1 = _mm256_shuffle_epi8(scales, _mm256_set1_epi16((short)(0x0100 + 0x0202 * (2 * jj + 1))));
            _Pragma("GCC unroll 4") for (int k = 0; k < nx; k++) {
                const uint8_t *qa = a + k * stride + FMOE__Q8K_Q + 64 * jj;
                sumi[k] = add_madd(sumi[k], s0, _mm256_maddubs_epi16(q0, load(qa)));
                sumo[k] = add_madd(sumo[k], s1, _mm256_maddubs_epi16(q1, load(qa + 32)));
            }
        }
        _Pragma("GCC unroll 4") for (int k = 0; k < nx; k++) sumi[k] = _mm256_add_epi32(sumi[k], sumo[k]);
        _Pragma("GCC unroll 4") for (int k = 0; k < nx; k++) {
            const uint8_t *ak = a + k * stride;
            /* da·d and da·dmin, each one f32 product as before */
            const __m128 sd = _mm_mul_ps(_mm_broadcast_ss((const float *)ak), ddf);
            const __m256 sdmin = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(sd), _mm256_set1_epi32(1));
            /* lane j: m_j·(bsum_2j + bsum_2j+1), one madd of the bsums as they lie (a
             * horizontal add of them into pairs first, then a 128-bit madd, cost more) */
            const __m256i pm = _mm256_madd_epi16(mins, load(ak + FMOE__Q8K_BSUMS));
            acc[k] = _mm256_fmadd_ps(_mm256_broadcastss_ps(sd), _mm256_cvtepi32_ps(sumi[k]), acc[k]);
            accm[k] = _mm256_fmadd_ps(sdmin, _mm256_cvtepi32_ps(pm), accm[k]);
        }
    }
    _Pragma("GCC unroll 4") for (int k = 0; k < nx; k++) y[k * ys] = fmoe__hsum256(acc[k]) - fmoe__hsum256(accm[k]);
}

#ifdef FMOE_QUANT_ACT_VNNI
/* Q5_K with four inputs or more (the VNNI build): row panels (lib/quant_rows1_avx2.h,
 * fmoe__r1_panel). dots_q45_k with four inputs a pass forms each row's codes once per four
 * inputs and per input and 32 values still takes a load, a maddubs and a vpdpwssd: 11.6
 * ps a multiply-add with eight inputs (bench_vs_ggml 128 4096 15 Q5_K), 70% of a 64-token
 * prefill's samples (perf, forward_driver, 1 thread), whose tokens/s were 0.78-0.83x
 * llama.cpp's (its prefill: a tiled GEMM, the weights unpacked once, then vpdpbusd
 * tiles). A panel's accumulator lane l is dots_q45_k's sum vector's lane l (values
 * 32j + 4l .. 32j + 4l + 3 of every sub-block j), and the mins' lane j is
 * m_j·bsum_2j + m_j·bsum_2j+1 (a vpdpwssd of (m_j, m_j) pairs with the bsums' dword j),
 * so the f32 steps are its steps on the same integers, lane by lane (da·d and da·dmin,
 * an FMA per lane and block, fmoe__hsum256's order at the end): every input keeps its
 * bits. With panels: 8.5 ps, prefill 1.01x (docs/quantization.md, "Q5_K and Q3_K with
 * several inputs"). */
struct q5k_panel {
    struct fmoe__r1_panel p; /* the codes, sub-block j's scale in lanes 8h .. 8h + 7 */
    __m512i m[FMOE__R1_PANEL_PAIRS];     /* (m_j, m_j) of row 2rp + h in lane 8h + j */
    __m512 d[FMOE__R1_PANEL_PAIRS], dmin[FMOE__R1_PANEL_PAIRS];
    __m512 acc[FMOE__R1_PANEL_X][FMOE__R1_PANEL_PAIRS], accm[FMOE__R1_PANEL_X][FMOE__R1_PANEL_PAIRS];
};

/* One row's Q5_K block: sub-block j's 32 codes into q[j], its eight scales as dwords into
 * sc, the (m_j, m_j) pairs as dwords into mins, d and dmin into dd[0..1] (f16). */
SIMD static INLINE void q5k_panel_row(const uint8_t *w, __m256i *q, __m256i *sc, __m256i *mins, uint16_t *dd) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    memcpy(dd, w, 4);
    uint32_t u[4]; /* dots_q45_k's unpacking of the 6-bit scales and mins */
    fmoe__scale_min_k4_all(w + 4, u);
    *mins = _mm256_mullo_epi32(_mm256_cvtepu8_epi32(_mm_set_epi32(0, 0, (int)u[3], (int)u[2])),
                               _mm256_set1_epi32(0x10001));
    *sc = _mm256_cvtepu8_epi32(_mm_set_epi32(0, 0, (int)u[1], (int)u[0]));
    const __m256i hb = load(w + 16);
    /* bit j of each qh byte as a mask adding 16 */
    _Pragma("GCC unroll 4") for (int jj = 0; jj < 4; jj++) {
        const __m256i v = load(w + 48 + 32 * jj);
        const int b0 = 2 * jj, b1 = 2 * jj + 1;
        const __mmask32 h0 = _mm256_test_epi8_mask(hb, _mm256_set1_epi8((char)(1 << b0)));
        const __mmask32 h1 = _mm256_test_epi8_mask(hb, _mm256_set1_epi8((char)(1 << b1)));
        q[b0] = _mm256_mask_add_epi8(_mm256_and_si256(v, m4), h0, _mm256_and_si256(v, m4), _mm256_set1_epi8(16));
        q[b1] = _mm256_mask_add_epi8(high_nibbles(v), h1, high_nibbles(v), _mm256_set1_epi8(16));
    }
}

/* Block off of rows w[0..15] into the panel, with the rows' scales, mins, d and dmin. */
SIMD static void q5k_panel_block(const uint8_t *const *w, int64_t off, struct q5k_panel *P) {
    const __m512i sel = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2);
    const __m512i lane8 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 8, 8, 8, 8, 8, 8, 8, 8);
    for (int rp = 0; rp < FMOE__R1_PANEL_PAIRS; rp++) {
        __m256i q0[8], q1[8], sc0, sc1, m0, m1;
        uint16_t dd[4];
        q5k_panel_row(w[2 * rp] + off, q0, &sc0, &m0, dd);
        q5k_panel_row(w[2 * rp + 1] + off, q1, &sc1, &m1, dd + 2);
        const __m512i sc = _mm512_inserti64x4(_mm512_castsi256_si512(sc0), sc1, 1);
        _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) {
            P->p.q[j][rp] = _mm512_inserti64x4(_mm512_castsi256_si512(q0[j]), q1[j], 1);
            P->p.sc[j][rp] = _mm512_permutexvar_epi32(_mm512_add_epi32(lane8, _mm512_set1_epi32(j)), sc);
        }
        P->m[rp] = _mm512_inserti64x4(_mm512_castsi256_si512(m0), m1, 1);
        /* d0 dmin0 d1 dmin1 in each 128-bit lane */
        const __m512 f = _mm512_broadcast_f32x4(_mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)dd)));
        P->d[rp] = _mm512_permutexvar_ps(sel, f);
        P->dmin[rp] = _mm512_permutexvar_ps(_mm512_add_epi32(sel, _mm512_set1_epi32(1)), f);
    }
}

/* K inputs (their Q8_K blocks at a[0..K-1], slots x0 ..) against the panel's block: the
 * lane integers (fmoe__r1_panel_dots), then dots_q45_k's f32 steps for each, the first
 * block's FMAs onto zero as that kernel's (not onto accumulators cleared first: two
 * memsets of up to 16 KiB a call, 2% of a Q5_K prefill). */
SIMD static INLINE void q5k_panel_dots(struct q5k_panel *P, int x0, int K, const uint8_t *const *a, int first) {
    __m512i s[3][FMOE__R1_PANEL_PAIRS];
    _Pragma("GCC unroll 3") for (int k = 0; k < K; k++)
        _Pragma("GCC unroll 8") for (int rp = 0; rp < FMOE__R1_PANEL_PAIRS; rp++)
            s[k][rp] = _mm512_setzero_si512();
    fmoe__r1_panel_dots(&P->p, a, K, s);
    _Pragma("GCC unroll 3") for (int k = 0; k < K; k++) {
        const __m512 da = _mm512_set1_ps(f32_at(a[k]));
        const __m512i bs = _mm512_broadcast_i64x4(load(a[k] + FMOE__Q8K_BSUMS));
        __m512 *acc = P->acc[x0 + k], *accm = P->accm[x0 + k];
        _Pragma("GCC unroll 8") for (int rp = 0; rp < FMOE__R1_PANEL_PAIRS; rp++) {
            const __m512 a0 = first ? _mm512_setzero_ps() : acc[rp], m0 = first ? _mm512_setzero_ps() : accm[rp];
            acc[rp] = _mm512_fmadd_ps(_mm512_mul_ps(da, P->d[rp]), _mm512_cvtepi32_ps(s[k][rp]), a0);
            const __m512i pm = _mm512_dpwssd_epi32(_mm512_setzero_si512(), P->m[rp], bs);
            accm[rp] = _mm512_fmadd_ps(_mm512_mul_ps(da, P->dmin[rp]), _mm512_cvtepi32_ps(pm), m0);
        }
    }
}

/* fmoe__hsum256 of each 256-bit half, into lanes 0 and 8 */
SIMD static INLINE __m512 hsum_halves(__m512 v) {
    v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0xB1)); /* lane l: x_l + x_l+4 */
    v = _mm512_add_ps(v, _mm512_permute_ps(v, 0x4E));        /* + the pair two lanes on */
    return _mm512_add_ps(v, _mm512_permute_ps(v, 0xB1));     /* + the next lane */
}

/* A row panel's results: per input, each row pair's two lanes' sums (acc - accm, the
 * one-input kernel's last step). */
SIMD static INLINE void q5k_panel_finish(const struct q5k_panel *P, int m, float *y, int64_t ldy, int64_t nr) {
    for (int k = 0; k < m; k++) {
        float out[16];
        for (int rp = 0; 2 * rp < nr; rp++) {
            _mm512_storeu_ps(out, _mm512_sub_ps(hsum_halves(P->acc[k][rp]), hsum_halves(P->accm[k][rp])));
            y[k * ldy + 2 * rp] = out[0];
            if (2 * rp + 1 < nr) y[k * ldy + 2 * rp + 1] = out[8];
        }
    }
}
/* nothing before a row panel: its first block's products start the sums */
#define Q5K_PANEL_START(P, m) ((void)(P), (void)(m))
/* rows x nx inputs of Q5_K by row panels */
FMOE__R1_PANEL_ROWSX(dots_q5_k_panel, struct q5k_panel, FMOE_Q5_K_BYTES, Q5K_PANEL_START, q5k_panel_block,
                     q5k_panel_dots, q5k_panel_finish)
/* inputs from which QUANT_ACT_ROWS takes dots_q5_k_panel: four inputs in one panel 12.3 ps
 * a multiply-add, in one pass of dots_q45_k 13.8; three level (16-row calls, 1024 wide) */
#define Q5K_PANEL_MIN 4
#endif

/* Q6_K: 6-bit values 0..63 from ql's nibbles and qh's pairs; the offset of 32 comes off
 * once per block as 32·Σ sc·bsum. */
SIMD static INLINE void dots_q6_k(const uint8_t *w, const uint8_t *a, int64_t stride, int nx,
                                  int64_t n, float *y, int64_t ys) {
    __m256 acc[MAXX];
    _Pragma("GCC unroll 4") for (int k = 0; k < nx; k++) acc[k] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += FMOE_QK_K, w += FMOE_Q6_K_BYTES, a += FMOE_Q8_K_BYTES) {
        prefetch(w, 4); /* 210 bytes */
        const int8_t *sc = (const int8_t *)(w + 192);
        const float d = f16_at(w + 208);
        const __m128i sc8 = _mm_loadu_si128((const __m128i *)sc);
        const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
        /* two int32 sums a block (the even and odd quarters of each half), as in dots_q45_k */
        __m256i sumi[MAXX], sumo[MAXX];
        _Pragma("GCC unroll 4") for (int k = 0; k < nx; k++) sumi[k] = sumo[k] = _mm256_setzero_si256();
        /* unrolled as dots_q45_k's loop is, for constant scale shuffles */
        _Pragma("GCC unroll 2")
        for (int half = 0; half < 2; half++) {
            const uint8_t *ql = w + 64 * half, *qh = w + 128 + 32 * half;
            __m256i q[4];
            fmoe__q6_k_unpack_half(ql, qh, q);
            /* this half's eight scales as int16, in both 128-bit lanes */
            const __m256i sch = half ? _mm256_permute2x128_si256(sc16, sc16, 0x11)
                                     : _mm256_permute2x128_si256(sc16, sc16, 0x00);
            _Pragma("GCC unroll 4")
            for (int qq = 0; qq < 4; qq++) {
                /* scales 8·half + 2qq (values 0..15) and the next (16..31) as int16 lanes */
                const short lo = (short)(0x0100 + 0x0202 * (2 * qq)), hi = (short)(lo + 0x0202);
                const __m256i s = _mm256_shuffle_epi8(sch, _mm256_setr_epi16(lo, lo, lo, lo, lo, lo, lo, lo,
                                                                             hi, hi, hi, hi, hi, hi, hi, hi));
                _Pragma("GCC unroll 4") for (int k = 0; k < nx; k++) {
                    const uint8_t *qa = a + k * stride + FMOE__Q8K_Q + 128 * half + 32 * qq;
                    const __m256i p = _mm256_maddubs_epi16(q[qq], load(qa));
                    if (qq & 1) sumo[k] = add_madd(sumo[k], s, p);
                    else sumi[k] = add_madd(sumi[k], s, p);
                }
            }
        }
        _Pragma("GCC unroll 4") for (int k = 0; k < nx; k++) sumi[k] = _mm256_add_epi32(sumi[k], sumo[k]);
        _Pragma("GCC unroll 4") for (int k = 0; k < nx; k++) {
            const uint8_t *ak = a + k * stride;
            const __m256i off = _mm256_slli_epi32(_mm256_madd_epi16(load(ak + FMOE__Q8K_BSUMS), sc16), 5);
            acc[k] = _mm256_fmadd_ps(_mm256_set1_ps(f32_at(ak) * d),
                                     _mm256_cvtepi32_ps(_mm256_sub_epi32(sumi[k], off)), acc[k]);
        }
    }
    _Pragma("GCC unroll 4") for (int k = 0; k < nx; k++) y[k * ys] = fmoe__hsum256(acc[k]);
}

/* Two rows' blocks side by side. dots_q32 takes the 32 codes of a block as two halves of
 * 16, so that one register holds a half of two rows: lo = [row A's codes 0-15 | row B's
 * 0-15], hi = [A's 16-31 | B's 16-31], against the activation halves broadcast to both
 * 128-bit lanes ([a0-15 | a0-15], [a16-31 | a16-31]: loads only). A pair's products then
 * come out in one register, row A's in lanes 0-3 and B's in 4-7, and the eight rows'
 * sums take half the reduction that eight one-row registers did (hsum_pairs). The codes:
 * the AVX2 build's as fmoe__q32_unpack gives them (signed, levels looked up, Q4_1's and
 * Q5_1's unsigned); the VNNI build's, for vpdpbusd, plus q32_offset(type) (0..240). */
#ifdef FMOE_QUANT_ACT_VNNI
/* The signed 32-value types with vpdpbusd, which does not saturate: the codes plus a
 * constant offset c (Q4_0 8, Q5_0 16, IQ4_NL 127, MXFP4 12) go in as unsigned bytes
 * against the activation as it is, and c·Σa, the same for every row, comes off the
 * block's integer sum once per input block (q32_block). The sum is then Σ w·a, that of
 * the sign-trick kernel, without its two sign operations per block and input. */
static INLINE int q32_offset(uint32_t type) {
    switch (type) {
    case FMOE_GGML_Q4_0: return 8;
    case FMOE_GGML_Q5_0: return 16;
    case FMOE_GGML_IQ4_NL: return 127;
    case FMOE_GGML_MXFP4: return 12;
    default: return 0; /* Q4_1, Q5_1: unsigned codes as they are */
    }
}
#endif

/* The values of nibbles (and fifth bits) 0..31: the code, or the VNNI build's code +
 * q32_offset, for the types with a table or an offset */
SIMD static INLINE __m256i q32_levels(uint32_t type, __m256i q) {
#ifdef FMOE_QUANT_ACT_VNNI
    if (type == FMOE_GGML_IQ4_NL) /* FMOE__IQ4NL_LEVELS + 127 */
        return _mm256_shuffle_epi8(_mm256_setr_epi8(0, 23, 44, 62, 78, 92, 105, 117, (char)128, (char)140,
                                                    (char)152, (char)165, (char)180, (char)196, (char)216, (char)240,
                                                    0, 23, 44, 62, 78, 92, 105, 117, (char)128, (char)140,
                                                    (char)152, (char)165, (char)180, (char)196, (char)216, (char)240),
                                   q);
    if (type == FMOE_GGML_MXFP4) /* FMOE__MXFP4_LEVELS + 12 */
        return _mm256_shuffle_epi8(_mm256_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0,
                                                    12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0),
                                   q);
    return q; /* Q4_0 and Q5_0: nibble (+ 16·fifth bit) is the code plus the offset */
#else
    return fmoe__q32_levels_avx2(type, q);
#endif
}

/* Row A's block at wa and row B's at wb as lo and hi (above). */
SIMD static INLINE void q32_pair(uint32_t type, const uint8_t *wa, const uint8_t *wb, __m256i *lo, __m256i *hi) {
    const int qs_at = fmoe__q32_qs_at(type);
    const int q5 = type == FMOE_GGML_Q5_0 || type == FMOE_GGML_Q5_1;
    uint32_t ha = 0, hb = 0; /* Q5_0's, Q5_1's fifth bits: qh bit l is code l's */
    if (q5) {
        memcpy(&ha, wa + fmoe__q32_qh_at(type), 4);
        memcpy(&hb, wb + fmoe__q32_qh_at(type), 4);
    }
#ifdef FMOE_QUANT_ACT_VNNI
    if (q5) {
        /* each row's 32 codes in one register first ([0-15 | 16-31]: one GFNI transform
         * of its broadcast bytes, the bit matrix's rows 1, 2, 4, 8 masking the low lane,
         * 16, 32, 64, 128 shifting the high one), 16 added where the bit is set by one
         * masked add with qh itself the mask (these CPUs have AVX512-BW and VL), then the
         * halves paired by two lane shuffles. Split as the other types are, each half's
         * 16 bits moved into a mask of its own, the kernel ran 10% slower (Q5_0 21 -> 23
         * ps a multiply-add). */
        const __m256i m = _mm256_setr_epi64x(0x0102040800000000ll, 0x0102040800000000ll,
                                             0x1020408000000000ll, 0x1020408000000000ll);
        __m256i ra = _mm256_gf2p8affine_epi64_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(wa + qs_at))), m, 0);
        __m256i rb = _mm256_gf2p8affine_epi64_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(wb + qs_at))), m, 0);
        ra = _mm256_mask_add_epi8(ra, (__mmask32)ha, ra, _mm256_set1_epi8(16));
        rb = _mm256_mask_add_epi8(rb, (__mmask32)hb, rb, _mm256_set1_epi8(16));
        *lo = _mm256_permute2x128_si256(ra, rb, 0x20);
        *hi = _mm256_permute2x128_si256(ra, rb, 0x31);
        return; /* code + 16 for Q5_0 (q32_offset), the code for Q5_1 */
    }
#endif
    /* A's 16 bytes in the low lane, B's in the high one: two broadcast loads and a blend,
     * no shuffle */
    const __m256i x = _mm256_blend_epi32(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(wa + qs_at))),
                                         _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(wb + qs_at))),
                                         0xF0);
    __m256i l = _mm256_and_si256(x, _mm256_set1_epi8(0x0F));
#ifdef FMOE_QUANT_ACT_VNNI
    /* the high nibbles by one GFNI affine transform (the bit matrix's rows 16, 32, 64,
     * 128 for output bits 0-3), in place of a shift and a mask */
    __m256i h = _mm256_gf2p8affine_epi64_epi8(x, _mm256_set1_epi64x(0x1020408000000000ll), 0);
#else
    __m256i h = _mm256_and_si256(_mm256_srli_epi16(x, 4), _mm256_set1_epi8(0x0F));
    if (q5) { /* bits 0-15 go with lo, 16-31 with hi */
        l = _mm256_or_si256(l, fmoe__q32_fifth((ha & 0xFFFFu) | (hb << 16)));
        h = _mm256_or_si256(h, fmoe__q32_fifth((ha >> 16) | (hb & 0xFFFF0000u)));
    }
#endif
    *lo = q32_levels(type, l);
    *hi = q32_levels(type, h);
}

/* blend_epi32(a, b, m): the VNNI build has the EVEX form, which reaches its 32 vector
 * registers (GCC copied every operand held in ymm16-31 into ymm0-15 for vpblendd, which
 * has no EVEX encoding) */
#ifdef FMOE_QUANT_ACT_VNNI
#define BLEND32(a, b, m) _mm256_mask_blend_epi32((__mmask8)(m), a, b)
#else
#define BLEND32(a, b, m) _mm256_blend_epi32(a, b, m)
#endif

/* The rows of the pairs q32_block forms, PAIR_ROWS[i] = {A, B} of p[i]: the order in which
 * hsum_pairs leaves row j in lane j. */
static const int PAIR_ROWS[4][2] = {{0, 4}, {2, 6}, {1, 5}, {3, 7}};

/* p[i]'s lanes 0-3 summed into one lane and 4-7 into another (exact: |Σ| < 2^24 for these
 * blocks): row j's total in lane j, p[i] holding rows PAIR_ROWS[i]. Blends and adds, one
 * shuffle (vpalignr, vpshufd) per merge of two vectors: shuffles are what these kernels
 * run short of (two of Zen 4's four vector pipes). Eight one-row registers had taken four
 * more merges (vperm2i128 each) before these. */
SIMD static INLINE __m256i hsum_pairs(const __m256i p[4]) {
    __m256i q[2];
    /* p[2i], p[2i+1] -> each 128-bit lane [a a b b]: a, b the two vectors' rows there */
    _Pragma("GCC unroll 2") for (int i = 0; i < 2; i++)
        q[i] = _mm256_add_epi32(BLEND32(p[2 * i], p[2 * i + 1], 0xCC),
                                _mm256_alignr_epi8(p[2 * i + 1], p[2 * i], 8));
    /* and the last pair: lanes (0, 1, 2, 3) of the low half get p[0], p[2], p[1], p[3]'s
     * row A, those of the high half their row B */
    const __m256i v = BLEND32(_mm256_shuffle_epi32(q[0], 0xB1), _mm256_shuffle_epi32(q[1], 0xB1), 0xAA);
    return _mm256_add_epi32(BLEND32(q[0], q[1], 0xAA), v);
}

SIMD static INLINE int32_t hsum_epi32(__m256i v) {
    __m128i x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0x4E));
    x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0xB1));
    return _mm_cvtsi128_si32(x);
}

/* The f16 at byte `at` of each of the eight blocks w[j], as f32 lanes. Put together in
 * two general registers (loads, shifts and ors: the integer pipes, which these kernels
 * leave idle) and moved over in two steps: eight vpinsrw took eight of the vector shuffle
 * slots that the products and hsum_pairs run short of. (Eight 2-byte stores read back as
 * one 16-byte load would stall store forwarding.) */
SIMD static INLINE __m256 f16x8_at(const uint8_t *const w[8], int at) {
    uint64_t q[2] = {0, 0};
    _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) {
        uint16_t v;
        memcpy(&v, w[j] + at, 2);
        q[j / 4] |= (uint64_t)v << (16 * (j % 4));
    }
    return _mm256_cvtph_ps(_mm_insert_epi64(_mm_cvtsi64_si128((long long)q[0]), (long long)q[1], 1));
}

/* The weight scales of eight blocks: MXFP4's E8M0 byte as fmoe__e8m0_half makes it
 * (2^(e-128): e - 1 in the exponent field, the two smallest as subnormals), else the f16 at
 * the block's start. */
SIMD static INLINE __m256 q32_d8(uint32_t type, const uint8_t *const w[8]) {
    if (type != FMOE_GGML_MXFP4) return f16x8_at(w, 0);
    const __m256i e = _mm256_setr_epi32(w[0][0], w[1][0], w[2][0], w[3][0], w[4][0], w[5][0], w[6][0], w[7][0]);
    const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    const __m256i sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
    const __m256i small = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(normal, sub, small));
}

/* How far ahead of a pass's start dots_q32 asks for the weights: the pass itself (eight
 * rows, one run of memory) and Q32_PREFETCH_BYTES more, so that each row of the next pass
 * is asked for before the pass reaches it whatever the rows' width (q32_block). */
static INLINE int64_t q32_reach(int64_t row_bytes) { return KERNEL_ROWS * row_bytes + Q32_PREFETCH_BYTES; }

/* One block of the eight rows w[j] (advanced past it) against nx inputs, added to acc[k],
 * after asking for the lines from *pf up to pf_to into L1 (dots_q32's prefetch cursor).
 *
 * The prefetch. The one-row kernels' PREFETCH_BYTES ahead in the same row lands, eight
 * rows a pass, in the rows this pass reads anyway: a matrix streamed from memory then ran
 * at 55-58 ps a multiply-add against 37.5 for the one-row kernel (Q4_0, 16384 x 4096,
 * bench_vs_ggml --kernels --stream). A pass of eight rows is one run of memory
 * (8·row_bytes), so the kernel asks for the next passes as one stream q32_reach ahead (a
 * pass and Q32_PREFETCH_BYTES), a block's share (its eight rows' block bytes) with each
 * block, and never past the end of the rows it was given (the next rows may be another
 * thread's). The stream Q32_PREFETCH_BYTES ahead of the pass's start, not of its end, had
 * covered the 1024-wide rows below (a pass is 4.5 KiB) but not gpt-oss's 2880-wide MXFP4
 * experts (12 KiB a pass: its last rows were asked for after they were read): that shape's
 * decode fell from 10.3-10.7 to 8.7-8.9 tokens/s at one thread, and the pass added to the
 * distance gave 11.2-11.3 back (fmoe generate, 24 tokens, docs/results.md). An earlier form asked,
 * every other block, for each row's bytes whole passes ahead, at least 16 KiB: the fastest
 * on one long streamed matrix (17.6-19.5 ps, Q4_0), but a decode step's chunks of 64 rows
 * (36 KiB of 1024-wide Q4_0) then had their first 16 KiB not asked for and their last
 * passes' requests in another thread's rows; in the whole model, 2 threads, it cost 3-6%.
 * Whole-model decode of the 8-layer Q4_0 and IQ4_NL files (docs/quantization.md, "Per type
 * against llama.cpp"; forward_driver --tokens <8 ids> --generate 32 --threads 2), with
 * dots_q32_head and the one-task-a-thread decode chunks (runtime/cpu/quant_matvec.c),
 * tokens/s medians of 5 interleaved runs: 4 KiB ahead 537 / 580, 8 KiB 609 / 606, 12 KiB
 * 605 / 583; 8 KiB without dots_q32_head 546 / 522; 8 KiB into L2 (_MM_HINT_T1) 584 /
 * 528. One stream 16 KiB ahead into L1, with the earlier eight chunks a thread and no
 * head, fell to 306 (Q4_0): L1 is 32 KiB. */
SIMD static INLINE void q32_block(uint32_t type, const uint8_t *w[8], const uint8_t *a, int64_t stride,
                                  int nx, __m256 *acc, const uint8_t **pf, const uint8_t *pf_to) {
    const int affine = type == FMOE_GGML_Q4_1 || type == FMOE_GGML_Q5_1;
#ifdef FMOE_QUANT_ACT_VNNI
    const int c = q32_offset(type);
#endif
    const __m256 dw = q32_d8(type, w);
    const __m256 mw = affine ? f16x8_at(w, 2) : _mm256_setzero_ps();
    for (; *pf < pf_to; *pf += 64) _mm_prefetch((const char *)*pf, _MM_HINT_T0);
    __m256i lo[4], hi[4];
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++)
        q32_pair(type, w[PAIR_ROWS[i][0]], w[PAIR_ROWS[i][1]], &lo[i], &hi[i]);
    _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) w[j] += fmoe__q32_block_bytes(type);
    _Pragma("GCC unroll 4") for (int k = 0; k < nx; k++) {
        const uint8_t *ak = a + k * stride;
        const __m256i alo = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(ak + 2)));
        const __m256i ahi = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(ak + 18)));
        __m256i p[4];
#ifdef FMOE_QUANT_ACT_VNNI
        /* -c times each int32 lane's eight activation bytes (four of each half): every
         * pair's vpdpbusd starts from it, so its lanes sum to Σ code·a */
        const __m256i c8 = _mm256_set1_epi8((char)c);
        const __m256i corr = c ? _mm256_sub_epi32(_mm256_setzero_si256(),
                                                  _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), c8, alo),
                                                                      c8, ahi))
                               : _mm256_setzero_si256();
#endif
        _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
#ifdef FMOE_QUANT_ACT_VNNI
            p[i] = _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(corr, lo[i], alo), hi[i], ahi);
#else
            p[i] = affine ? _mm256_add_epi32(isum_us(lo[i], alo), isum_us(hi[i], ahi))
                          : _mm256_add_epi32(isum_us(_mm256_sign_epi8(lo[i], lo[i]), _mm256_sign_epi8(alo, lo[i])),
                                             isum_us(_mm256_sign_epi8(hi[i], hi[i]), _mm256_sign_epi8(ahi, hi[i])));
#endif
        }
        const __m256i sum = hsum_pairs(p);
        const int32_t asum = affine ? hsum_epi32(isum_us(_mm256_set1_epi8(1), load(ak + 2))) : 0;
        const __m256 da = _mm256_set1_ps(f16_at(ak));
        acc[k] = _mm256_add_ps(acc[k], _mm256_mul_ps(_mm256_mul_ps(dw, da), _mm256_cvtepi32_ps(sum)));
        if (affine)
            acc[k] = _mm256_add_ps(acc[k], _mm256_mul_ps(_mm256_mul_ps(mw, da), _mm256_set1_ps((float)asum)));
    }
}

/* Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL and MXFP4 against Q8_0 activations, eight rows a pass
 * (w[j], row_bytes apart; rows past the matrix's end repeat a real one and their results
 * are dropped) and nx inputs, with each row's result in one f32 lane:
 *
 *   acc_j += (dw_j·da)·S_j   (and for Q4_1, Q5_1 then acc_j += (m_j·da)·Σa)
 *
 * per block in block order, S_j the block's exact integer Σ code·a, each product and sum
 * rounded once (no FMA): the plain reference's arithmetic (dot_q32_ref, dot_mxfp4_ref in
 * lib/quant_act.c, compiled as ISO C without contraction), so every row count, input
 * count and kernel build gives the reference's bits. One row a pass, with an FMA chain
 * per row, had been bound by that chain's latency (4 cycles a block on Zen 4) plus, per
 * block and row, a scale conversion and broadcast; here the eight rows' integer sums are
 * reduced into one vector (q32_pair's halves of two rows a register, then hsum_pairs) and
 * scaled, converted and added once for all of them, much as llama.cpp's repacked gemv
 * does with eight interleaved rows, but reading the GGUF layout as it is. L2-resident
 * 1024 x 1024 (bench_vs_ggml --kernels), ps a multiply-add, one row a register and eight
 * merged by hsum8 before the pairs, then with them: VNNI build Q4_0 16.6 -> 15.5, IQ4_NL
 * 19.0 -> 17.0, MXFP4 21.5 -> 17.7, Q4_1 22.3 -> 20.4, Q5_0 20.6 -> 20.3, Q5_1 26.3 ->
 * 25.3; AVX2 build Q4_0 28.3 -> 23.5, IQ4_NL 27.8 -> 23.3, Q5_0 39.8 -> 41.0.
 *
 * The integer sums: AVX2 moves w's sign onto the activation (Q8_0's trick) for the signed
 * types and puts Q4_1's and Q5_1's unsigned codes into maddubs as they are; |code| <= 127
 * (IQ4_NL's -127), so no int16 pair saturates. The VNNI build puts code + c into vpdpbusd,
 * each pair's starting from -c·Σa (q32_offset), formed once per input block for the four
 * pairs, as Σa is for Q4_1's and Q5_1's mins. */
SIMD static INLINE void dots_q32(const uint8_t *W, int64_t row_bytes, int nrows, const uint8_t *a,
                                 int64_t stride, int nx, int64_t n, float *y, int64_t ys,
                                 uint32_t type, const uint8_t *pf_end) {
    const uint8_t *w[8];
    _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) w[j] = W + (j < nrows ? j : nrows - 1) * row_bytes;
    __m256 acc[MAXX];
    _Pragma("GCC unroll 4") for (int k = 0; k < nx; k++) acc[k] = _mm256_setzero_ps();
    /* the bytes q32_reach on, a block's share of them with each block (nrows blocks'
     * bytes), never past pf_end */
    const int64_t share = nrows * fmoe__q32_block_bytes(type);
    const uint8_t *pf = W + q32_reach(row_bytes), *pf_to = pf;
    for (int64_t i = 0; i < n; i += FMOE_QK8_0, a += FMOE_Q8_0_BYTES) {
        pf_to += share;
        q32_block(type, w, a, stride, nx, acc, &pf, pf_to < pf_end ? pf_to : pf_end);
    }
    _Pragma("GCC unroll 4") for (int k = 0; k < nx; k++) {
        float out[8];
        _mm256_storeu_ps(out, acc[k]);
        for (int j = 0; j < nrows; j++) y[k * ys + j] = out[j];
    }
}

/* The first q32_reach bytes of a call's rows (at most `bytes`), asked for before its
 * first pass, whose own requests start that far on: without it, each of a decode step's
 * chunks began with those bytes left to the hardware prefetcher (see q32_block). */
SIMD static INLINE void dots_q32_head(const uint8_t *W, int64_t row_bytes, int64_t bytes) {
    const int64_t reach = q32_reach(row_bytes);
    const int64_t end = bytes < reach ? bytes : reach;
    for (int64_t o = 0; o < end; o += 64) _mm_prefetch((const char *)W + o, _MM_HINT_T0);
}

#ifdef FMOE_QUANT_ACT_VNNI
#define QUANT_ACT_ROWS fmoe__quant_act_rows_avx2_vnni
#include "quant_act_rows.inc"
#else
#define QUANT_ACT_ROWS fmoe__quant_act_rows_avx2
#include "quant_act_rows.inc"

/* roundf (half away from zero) of 8 floats of magnitude below 2^23: truncate, then step
 * away from zero where the dropped fraction is at least one half (the fraction v - trunc(v)
 * is exact). */
SIMD static INLINE __m256i round_away(__m256 v) {
    const __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 frac = _mm256_sub_ps(v, t);
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 half = _mm256_cmp_ps(_mm256_and_ps(frac, absmask), _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    const __m256 one = _mm256_or_ps(_mm256_set1_ps(1.0f), _mm256_andnot_ps(absmask, v));
    return _mm256_cvttps_epi32(_mm256_add_ps(t, _mm256_and_ps(half, one)));
}

SIMD void fmoe__quant_q8_0_avx2(const float *x, uint8_t *b, int64_t n) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int64_t i = 0; i < n; i += FMOE_QK8_0, x += FMOE_QK8_0, b += FMOE_Q8_0_BYTES) {
        const __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8);
        const __m256 v2 = _mm256_loadu_ps(x + 16), v3 = _mm256_loadu_ps(x + 24);
        __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v0, absmask), _mm256_and_ps(v1, absmask)),
                                 _mm256_max_ps(_mm256_and_ps(v2, absmask), _mm256_and_ps(v3, absmask)));
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
        const float amax = _mm_cvtss_f32(h);
        const float d = amax / 127.f;
        const float id = d != 0 ? 1.0f / d : 0.0f;
        const uint16_t dh = fmoe_float_to_half(d);
        memcpy(b, &dh, 2);
        const __m256 vid = _mm256_set1_ps(id);
        const __m256i q0 = round_away(_mm256_mul_ps(v0, vid)), q1 = round_away(_mm256_mul_ps(v1, vid));
        const __m256i q2 = round_away(_mm256_mul_ps(v2, vid)), q3 = round_away(_mm256_mul_ps(v3, vid));
        /* packs work within 128-bit lanes: the permute puts the 32 bytes back in order */
        const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3));
        _mm256_storeu_si256((__m256i *)(b + 2),
                            _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    }
}

/* Q8_K blocks of 256 (ggml's quantize_row_q8_K_ref, byte for byte): the sign of the
 * value of largest magnitude is that of its first occurrence, as the reference's strict >
 * keeps; _mm256_cvtps_epi32 rounds to nearest even in the default MXCSR mode, as
 * fmoe__nearest_int does for these magnitudes (|iscale·x| <= 127). */
SIMD void fmoe__quant_q8_k_avx2(const float *x, uint8_t *b, int64_t n) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    for (int64_t i = 0; i < n; i += FMOE_QK_K, x += FMOE_QK_K, b += FMOE_Q8_K_BYTES) {
        __m256 m = _mm256_setzero_ps();
        for (int k = 0; k < FMOE_QK_K; k += 8) m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(x + k), absmask));
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
        const float amax = _mm_cvtss_f32(h);
        if (!(amax > 0)) { /* zeros (and NaN blocks, unspecified) */
            memset(b, 0, FMOE_Q8_K_BYTES);
            continue;
        }
        int first = 0;
        for (int k = 0; k < FMOE_QK_K; k += 8) {
            const __m256 eq = _mm256_cmp_ps(_mm256_and_ps(_mm256_loadu_ps(x + k), absmask),
                                            _mm256_set1_ps(amax), _CMP_EQ_OQ);
            const int mask = _mm256_movemask_ps(eq);
            if (mask) {
                first = k + __builtin_ctz((unsigned)mask);
                break;
            }
        }
        const float iscale = -127.f / x[first];
        const __m256 vis = _mm256_set1_ps(iscale);
        int32_t quads[8][8]; /* sums of 4 consecutive q, 32 per group of 32 values */
        for (int g = 0; g < 8; g++) {
            const float *xg = x + 32 * g;
            const __m256i q0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xg), vis));
            const __m256i q1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xg + 8), vis));
            const __m256i q2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xg + 16), vis));
            const __m256i q3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xg + 24), vis));
            /* packs saturate to 127 above; the reference's floor is -127 */
            __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3));
            p = _mm256_max_epi8(_mm256_permutevar8x32_epi32(p, order), _mm256_set1_epi8(-127));
            _mm256_storeu_si256((__m256i *)(b + FMOE__Q8K_Q + 32 * g), p);
            _mm256_storeu_si256((__m256i *)quads[g],
                                _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, p), ones16));
        }
        int16_t bsums[16];
        for (int j = 0; j < 16; j++) {
            const int32_t *s = &quads[j / 2][4 * (j % 2)];
            bsums[j] = (int16_t)(s[0] + s[1] + s[2] + s[3]);
        }
        const float d = 1 / iscale;
        memcpy(b, &d, 4);
        memcpy(b + FMOE__Q8K_BSUMS, bsums, sizeof bsums);
    }
}

#endif /* FMOE_QUANT_ACT_VNNI */

#elif defined(FMOE_QUANT_ACT_VNNI)

void fmoe__quant_act_rows_avx2_vnni(uint32_t t, const void *W, int64_t row_bytes, int64_t rows,
                                    const void *qx, int64_t stride, int32_t nx, int64_t n, float *y,
                                    int64_t ldy) {
    fmoe__quant_act_rows_avx2(t, W, row_bytes, rows, qx, stride, nx, n, y, ldy);
}

#else

void fmoe__quant_act_rows_avx2(uint32_t t, const void *W, int64_t row_bytes, int64_t rows,
                               const void *qx, int64_t stride, int32_t nx, int64_t n, float *y,
                               int64_t ldy) {
    for (int64_t r = 0; r < rows; r++)
        for (int32_t k = 0; k < nx; k++)
            y[k * ldy + r] = fmoe_quant_act_dot_ref(t, (const uint8_t *)W + r * row_bytes,
                                                    (const uint8_t *)qx + k * stride, n);
}

void fmoe__quant_q8_0_avx2(const float *x, uint8_t *dst, int64_t n) {
    fmoe_quant_quantize_row(FMOE_GGML_Q8_0, x, dst, n);
}

void fmoe__quant_q8_k_avx2(const float *x, uint8_t *dst, int64_t n) {
    for (int64_t i = 0; i < n; i += FMOE_QK_K, dst += FMOE_Q8_K_BYTES) fmoe__quant_q8_k_ref(x + i, dst);
}

#endif
