/*
 * quant_rows1_avx2.h - internal: what the 8-bit row kernels (one input, and up to four a
 * pass: FMOE__R1_ROWX, eight: FMOE__R1_ROWX8, eight in the lanes: FMOE__R1_X8_ROWS, or
 * row panels of sixteen rows: fmoe__r1_panel, also lib/quant_act_avx2.c's Q5_K's)
 * of the 256-value
 * types that lib/quant_kx.c otherwise serves share (lib/quant_iq_dot_avx2.c for the
 * codebook i-quants, lib/quant_kx_dot_avx2.c for Q2_K, Q3_K and IQ4_XS): a block's
 * integer vector reduced exactly, the sixteen sub-block scales placed per 32 values, and
 * the block loop's float steps, which are the plain reference's (lib/quant_kx.c's
 * block_dot: s += da·d·sum - da·dmin·msum, in block order), so every kernel built on it
 * gives the reference's bits. Static inline with a target attribute: included only by
 * files whose callers check the CPU first.
 */
#ifndef FMOE_QUANT_ROWS1_AVX2_H
#define FMOE_QUANT_ROWS1_AVX2_H

/* An entry point's name in this compilation: name, or name_vnni in the second
 * (FMOE__R1_VNNI). Neither checks the CPU: lib/quant_act.c picks one compilation's
 * entries (fmoe__quant_vnni), as it picks lib/quant_act_avx2_vnni.c's. Off x86-64 both
 * names are the reference's loop, which nothing calls there (no AVX2 level) but which
 * lib/quant_act.c links. */
#if defined(FMOE__R1_VNNI)
#define FMOE__R1_ENTRY(name) name##_vnni
#else
#define FMOE__R1_ENTRY(name) name
#endif

#if defined(__x86_64__)

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

/* FMOE__R1_VNNI: the second compilation (lib/quant_kx_dot_avx2_vnni.c,
 * lib/quant_iq_dot_avx2_vnni.c) for CPUs with AVX512-VNNI, -BW and -VL, GFNI and BMI2
 * (fmoe__quant_vnni):
 * still 256-bit registers, but 32 of them (the eight-row step's sixteen block vectors stay
 * in registers) and vpdpwssd for each madd-then-add. */
#if defined(FMOE__R1_VNNI)
#define FMOE__R1 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,gfni,bmi2")))
#else
#define FMOE__R1 __attribute__((target("avx2,fma,f16c")))
#endif
#define FMOE__R1_INLINE __attribute__((always_inline)) inline

/* Each block asks for the weight bytes this far ahead (a matrix's rows are one stream), as
 * lib/quant_act_avx2.c's kernels do; prefetches past the end do not fault. */
#define FMOE__R1_PREFETCH 2048
#define FMOE__R1_NEXT_HINT _MM_HINT_T0

static FMOE__R1_INLINE uint32_t fmoe__r1_le32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static FMOE__R1_INLINE uint16_t fmoe__r1_le16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

/* F16C's conversion: exact, as lib/half.h's. */
FMOE__R1 static FMOE__R1_INLINE float fmoe__r1_f16(const uint8_t *p) {
    return _cvtsh_ss(fmoe__r1_le16(p));
}

FMOE__R1 static FMOE__R1_INLINE __m256i fmoe__r1_load(const void *p) {
    return _mm256_loadu_si256((const __m256i *)p);
}

FMOE__R1 static FMOE__R1_INLINE int32_t fmoe__r1_hsum(__m256i acc) {
    __m128i r = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
    r = _mm_add_epi32(r, _mm_shuffle_epi32(r, 0x4E));
    r = _mm_add_epi32(r, _mm_shuffle_epi32(r, 0xB1));
    return _mm_cvtsi128_si32(r);
}

/* With the sixteen scales as int16 ordered even ones in the low 128-bit lane, odd ones in
 * the high lane (s0 s2 .. s14 | s1 s3 .. s15), fmoe__r1_pick[k] as a byte shuffle puts
 * scale 2k in every word of the low lane and 2k + 1 in the high one: the scales of values
 * 32k .. 32k + 15 and 32k + 16 .. 32k + 31, the two halves of a 32-byte product. */
#define FMOE__R1_P(k)                                                                              \
    {2 * (k), 2 * (k) + 1, 2 * (k), 2 * (k) + 1, 2 * (k), 2 * (k) + 1, 2 * (k), 2 * (k) + 1,      \
     2 * (k), 2 * (k) + 1, 2 * (k), 2 * (k) + 1, 2 * (k), 2 * (k) + 1, 2 * (k), 2 * (k) + 1,      \
     2 * (k), 2 * (k) + 1, 2 * (k), 2 * (k) + 1, 2 * (k), 2 * (k) + 1, 2 * (k), 2 * (k) + 1,      \
     2 * (k), 2 * (k) + 1, 2 * (k), 2 * (k) + 1, 2 * (k), 2 * (k) + 1, 2 * (k), 2 * (k) + 1}
static const uint8_t fmoe__r1_pick[8][32] __attribute__((aligned(32), unused)) = {
    FMOE__R1_P(0), FMOE__R1_P(1), FMOE__R1_P(2), FMOE__R1_P(3),
    FMOE__R1_P(4), FMOE__R1_P(5), FMOE__R1_P(6), FMOE__R1_P(7)};
#undef FMOE__R1_P

/* Bits 2j and 2j + 1 of every byte as 0..3: a shift and a mask, or in the VNNI build one
 * GFNI affine transform (the bit matrix's row for output bit i, byte 7 - i of the qword,
 * picks input bit 2j + i). */
FMOE__R1 static FMOE__R1_INLINE __m256i fmoe__r1_bits2(__m256i x, int j) {
#if defined(FMOE__R1_VNNI)
    const uint64_t a = ((uint64_t)1 << (2 * j)) << 56 | ((uint64_t)1 << (2 * j + 1)) << 48;
    return _mm256_gf2p8affine_epi64_epi8(x, _mm256_set1_epi64x((long long)a), 0);
#else
    return _mm256_and_si256(_mm256_srli_epi16(x, 2 * j), _mm256_set1_epi8(3));
#endif
}

/* Bit src of every byte moved to bit 2 (value 4), the others cleared: Q3_K's high bit. */
FMOE__R1 static FMOE__R1_INLINE __m256i fmoe__r1_bit_to4(__m256i x, int src) {
#if defined(FMOE__R1_VNNI)
    const uint64_t a = ((uint64_t)1 << src) << 40; /* the row of output bit 2: byte 5 */
    return _mm256_gf2p8affine_epi64_epi8(x, _mm256_set1_epi64x((long long)a), 0);
#else
    return _mm256_and_si256(_mm256_slli_epi16(_mm256_srli_epi16(x, src), 2), _mm256_set1_epi8(4));
#endif
}

/* acc + the int16 pair sums times the int16 scales, pair by pair: one vpdpwssd where the
 * build has VNNI (the same int32s: no product pair here comes near 2^31). */
FMOE__R1 static FMOE__R1_INLINE __m256i fmoe__r1_madd_add(__m256i acc, __m256i pairs, __m256i sc) {
#if defined(FMOE__R1_VNNI)
    return _mm256_dpwssd_epi32(acc, pairs, sc);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, sc));
#endif
}

/* acc + the int16 pair sums times the scales of 32-value group k (fmoe__r1_pick). */
FMOE__R1 static FMOE__R1_INLINE __m256i fmoe__r1_madd_pick(__m256i acc, __m256i pairs,
                                                          __m256i scales, int k) {
    const __m256i sc = _mm256_shuffle_epi8(scales, fmoe__r1_load(fmoe__r1_pick[k]));
    return fmoe__r1_madd_add(acc, pairs, sc);
}

/* Sixteen scale bytes (scale s in byte s, at most 127) as the int16 even/odd lane order. */
FMOE__R1 static FMOE__R1_INLINE __m256i fmoe__r1_scales_even_odd(__m128i bytes) {
    const __m128i split = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    return _mm256_cvtepi8_epi16(_mm_shuffle_epi8(bytes, split));
}

/* The totals of four vectors as the four lanes of one, in order. */
FMOE__R1 static FMOE__R1_INLINE __m128i fmoe__r1_hsum4(__m256i v0, __m256i v1, __m256i v2, __m256i v3) {
    const __m256i t = _mm256_hadd_epi32(_mm256_hadd_epi32(v0, v1), _mm256_hadd_epi32(v2, v3));
    return _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
}

/* The totals of eight vectors as the eight lanes of one, in order. */
FMOE__R1 static FMOE__R1_INLINE __m256i fmoe__r1_hsum8(const __m256i *v) {
    const __m256i t0 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    const __m256i t1 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    /* t0: the low-lane totals of v0..v3, then their high-lane totals; t1 those of v4..v7 */
    return _mm256_add_epi32(_mm256_permute2x128_si256(t0, t1, 0x20),
                            _mm256_permute2x128_si256(t0, t1, 0x31));
}

/* The f16 values in the low (high = 0) or high 16 bits of the dwords at p, p + stride, ...,
 * p + 7 stride, as f32 (exact): eight rows' block scales by eight loads and one
 * conversion (eight scalar conversions and inserts cost the eight-row step a tenth). */
FMOE__R1 static FMOE__R1_INLINE __m256 fmoe__r1_f16x8(const uint8_t *p, int64_t stride, int high) {
    const __m128i lo = _mm_setr_epi32((int)fmoe__r1_le32(p), (int)fmoe__r1_le32(p + stride),
                                      (int)fmoe__r1_le32(p + 2 * stride), (int)fmoe__r1_le32(p + 3 * stride));
    const __m128i hi = _mm_setr_epi32((int)fmoe__r1_le32(p + 4 * stride), (int)fmoe__r1_le32(p + 5 * stride),
                                      (int)fmoe__r1_le32(p + 6 * stride), (int)fmoe__r1_le32(p + 7 * stride));
    const __m128i m = _mm_set1_epi32(0xFFFF);
    const __m128i w = high ? _mm_packus_epi32(_mm_srli_epi32(lo, 16), _mm_srli_epi32(hi, 16))
                           : _mm_packus_epi32(_mm_and_si128(lo, m), _mm_and_si128(hi, m));
    return _mm256_cvtph_ps(w);
}

/* Four f32 values at p, p + stride, p + 2 stride, p + 3 stride. */
FMOE__R1 static FMOE__R1_INLINE __m128 fmoe__r1_gather4(const uint8_t *p, int64_t stride) {
    float f[4];
    for (int k = 0; k < 4; k++) memcpy(&f[k], p + k * stride, 4);
    return _mm_loadu_ps(f);
}

/* One row's blocks against one Q8_K input in the reference's float steps. VEC(w, a, &m)
 * returns the block's integer vector, whose lanes add up to Σ sc·Σ q·a, and sets m to the
 * vector of Σ m·bsums (zero without mins); D(w) and DMIN(w) are the block's f32 factors.
 * Four blocks a step: their totals reduced together, and each block's
 * t = da·d·sum - da·dmin·msum formed in its own lane of one vector (the same f32
 * operations on the same operands as the reference's scalar ones, so the same bits), then
 * s += t block by block in block order, as the reference adds. One block a step, the
 * per-block reduction and scalar tail kept the rows 10-25% slower than ggml's, which
 * accumulates f32 vectors across blocks instead (another summation order). A macro so each
 * kernel inlines. */
#define FMOE__R1_PREFETCH_BLOCK(w, bytes)                                                          \
    for (int l_ = 0; l_ < (int)(((bytes) + 63) / 64); l_++)                                        \
    _mm_prefetch((const char *)(w) + FMOE__R1_PREFETCH + 64 * l_, _MM_HINT_T0)
/* The eight-row step's: the same block of the next step's row (2 KiB ahead in the same row
 * lands, eight rows a step, in rows the step reads anyway: Q3_K streamed from memory,
 * 4096 values a row, took 30 ps a multiply-add against 19 from L2). */
#define FMOE__R1_PREFETCH_NEXT(w, bytes)                                                           \
    for (int l_ = 0; l_ < (int)(((bytes) + 63) / 64); l_++)                                        \
    _mm_prefetch((const char *)(w) + 64 * l_, FMOE__R1_NEXT_HINT)
#define FMOE__R1_ROW(y, w0, a0, nb, bytes, VEC, D, DMIN)                                           \
    do {                                                                                           \
        const uint8_t *w_ = (w0), *a_ = (a0);                                                      \
        const int64_t ab_ = FMOE_Q8_K_BYTES;                                                       \
        float s_ = 0;                                                                              \
        int64_t i_ = 0;                                                                            \
        for (; i_ + 3 < (nb); i_ += 4, w_ += 4 * (bytes), a_ += 4 * ab_) {                         \
            FMOE__R1_PREFETCH_BLOCK(w_, 4 * (bytes));                                              \
            __m256i m0_, m1_, m2_, m3_;                                                            \
            const __m256i v0_ = VEC(w_, a_, &m0_);                                                 \
            const __m256i v1_ = VEC(w_ + (bytes), a_ + ab_, &m1_);                                 \
            const __m256i v2_ = VEC(w_ + 2 * (bytes), a_ + 2 * ab_, &m2_);                         \
            const __m256i v3_ = VEC(w_ + 3 * (bytes), a_ + 3 * ab_, &m3_);                         \
            const __m128 sum_ = _mm_cvtepi32_ps(fmoe__r1_hsum4(v0_, v1_, v2_, v3_));               \
            const __m128 msum_ = _mm_cvtepi32_ps(fmoe__r1_hsum4(m0_, m1_, m2_, m3_));              \
            const __m128 da_ = fmoe__r1_gather4(a_, ab_);                                          \
            const __m128 d_ = _mm_setr_ps(D(w_), D(w_ + (bytes)), D(w_ + 2 * (bytes)),             \
                                          D(w_ + 3 * (bytes)));                                    \
            const __m128 dmin_ = _mm_setr_ps(DMIN(w_), DMIN(w_ + (bytes)), DMIN(w_ + 2 * (bytes)), \
                                             DMIN(w_ + 3 * (bytes)));                              \
            const __m128 t_ = _mm_sub_ps(_mm_mul_ps(_mm_mul_ps(da_, d_), sum_),                    \
                                         _mm_mul_ps(_mm_mul_ps(da_, dmin_), msum_));               \
            s_ += _mm_cvtss_f32(t_);                                                               \
            s_ += _mm_cvtss_f32(_mm_shuffle_ps(t_, t_, 1));                                        \
            s_ += _mm_cvtss_f32(_mm_shuffle_ps(t_, t_, 2));                                        \
            s_ += _mm_cvtss_f32(_mm_shuffle_ps(t_, t_, 3));                                        \
        }                                                                                          \
        for (; i_ < (nb); i_++, w_ += (bytes), a_ += ab_) {                                        \
            __m256i m0_;                                                                           \
            const __m256i v0_ = VEC(w_, a_, &m0_);                                                 \
            const __m128i t_ = fmoe__r1_hsum4(v0_, m0_, v0_, m0_);                                 \
            float da1_;                                                                            \
            memcpy(&da1_, a_, 4);                                                                  \
            const float d1_ = D(w_), dmin1_ = DMIN(w_);                                            \
            s_ += da1_ * d1_ * (float)_mm_cvtsi128_si32(t_) -                                      \
                  da1_ * dmin1_ * (float)_mm_extract_epi32(t_, 1);                                 \
        }                                                                                          \
        (y) = s_;                                                                                  \
    } while (0)

/* Eight rows (rb bytes apart) against one Q8_K input, row r's result in lane r of y[0..7]:
 * the reference's float steps, lane by lane. Per block column, the eight rows' integer
 * vectors are reduced together (fmoe__r1_hsum8) and t = da·d·sum - da·dmin·msum formed in
 * eight lanes at once, then s += t in block order: every lane the same f32 operations on
 * the same operands as the reference, so the same bits, without the one-row step's
 * scalar tail per block. The eight VEC calls share the input's loads. D8(w, rb, &d, &dmin)
 * gives the eight rows' D and DMIN of the block at w as vectors. */
#define FMOE__R1_ROWS8(y, w0, rb, a0, nb, bytes, VEC, D8)                                         \
    do {                                                                                           \
        const uint8_t *w_ = (w0), *a_ = (a0);                                                      \
        const int64_t rb_ = (rb);                                                                  \
        __m256 s_ = _mm256_setzero_ps();                                                           \
        for (int64_t i_ = 0; i_ < (nb); i_++, w_ += (bytes), a_ += FMOE_Q8_K_BYTES) {              \
            __m256i v_[8], m_[8];                                                                  \
            _Pragma("GCC unroll 8") for (int k_ = 0; k_ < 8; k_++) {                               \
                FMOE__R1_PREFETCH_NEXT(w_ + (8 + k_) * rb_, (bytes));                              \
                v_[k_] = VEC(w_ + k_ * rb_, a_, &m_[k_]);                                          \
            }                                                                                      \
            const __m256 sum_ = _mm256_cvtepi32_ps(fmoe__r1_hsum8(v_));                            \
            const __m256 msum_ = _mm256_cvtepi32_ps(fmoe__r1_hsum8(m_));                           \
            float da1_;                                                                            \
            memcpy(&da1_, a_, 4);                                                                  \
            const __m256 da_ = _mm256_set1_ps(da1_);                                               \
            __m256 d_, dmin_;                                                                      \
            D8(w_, rb_, &d_, &dmin_);                                                              \
            const __m256 t_ = _mm256_sub_ps(_mm256_mul_ps(_mm256_mul_ps(da_, d_), sum_),           \
                                            _mm256_mul_ps(_mm256_mul_ps(da_, dmin_), msum_));      \
            s_ = _mm256_add_ps(s_, t_);                                                            \
        }                                                                                          \
        _mm256_storeu_ps((y), s_);                                                                 \
    } while (0)

/* One row's blocks against NX (2..4) Q8_K inputs, astride bytes apart, input k's result
 * into y[k·ldy]: a prefill pass, each block's codes formed once for every input.
 * VECN(w, a, astride, NX, v, m) sets v[k] and m[k] to what VEC(w, a + k·astride, &m)
 * gives. Per block the NX totals are reduced together (fmoe__r1_hsum4) and input k's
 * t = da·d·sum - da·dmin·msum formed in lane k, then s += t lane by lane in block order:
 * each lane the one-input kernel's f32 operations on its operands (FMOE__R1_ROW), so every
 * input gets its one-input bits. */
#define FMOE__R1_ROWX(y, ldy, w0, a0, astride, NX, nb, bytes, VECN, D, DMIN)                     \
    do {                                                                                           \
        const uint8_t *w_ = (w0), *a_ = (a0);                                                      \
        const int64_t as_ = (astride);                                                             \
        __m128 s_ = _mm_setzero_ps();                                                              \
        for (int64_t i_ = 0; i_ < (nb); i_++, w_ += (bytes), a_ += FMOE_Q8_K_BYTES) {              \
            FMOE__R1_PREFETCH_BLOCK(w_, (bytes));                                                  \
            __m256i v_[4], m_[4];                                                                  \
            VECN(w_, a_, as_, NX, v_, m_);                                                         \
            _Pragma("GCC unroll 4") for (int k_ = (NX); k_ < 4; k_++) v_[k_] = v_[0], m_[k_] = m_[0]; \
            const __m128 sum_ = _mm_cvtepi32_ps(fmoe__r1_hsum4(v_[0], v_[1], v_[2], v_[3]));       \
            const __m128 msum_ = _mm_cvtepi32_ps(fmoe__r1_hsum4(m_[0], m_[1], m_[2], m_[3]));      \
            float da4_[4] = {0, 0, 0, 0};                                                          \
            _Pragma("GCC unroll 4") for (int k_ = 0; k_ < (NX); k_++) memcpy(&da4_[k_], a_ + k_ * as_, 4); \
            const __m128 da_ = _mm_loadu_ps(da4_);                                                 \
            const __m128 d_ = _mm_set1_ps(D(w_)), dmin_ = _mm_set1_ps(DMIN(w_));                   \
            const __m128 t_ = _mm_sub_ps(_mm_mul_ps(_mm_mul_ps(da_, d_), sum_),                    \
                                         _mm_mul_ps(_mm_mul_ps(da_, dmin_), msum_));               \
            s_ = _mm_add_ps(s_, t_);                                                               \
        }                                                                                          \
        float out_[4];                                                                             \
        _mm_storeu_ps(out_, s_);                                                                   \
        for (int k_ = 0; k_ < (NX); k_++) (y)[k_ * (ldy)] = out_[k_];                              \
    } while (0)

/* Eight inputs a pass (NX 8), lanes k of one __m256 as FMOE__R1_ROWX's of an __m128: the
 * same f32 operations lane by lane, so the same bits; the eight totals reduced together
 * (fmoe__r1_hsum8). */
#define FMOE__R1_ROWX8(y, ldy, w0, a0, astride, nb, bytes, VECN, D, DMIN)                         \
    do {                                                                                           \
        const uint8_t *w_ = (w0), *a_ = (a0);                                                      \
        const int64_t as_ = (astride);                                                             \
        __m256 s_ = _mm256_setzero_ps();                                                           \
        for (int64_t i_ = 0; i_ < (nb); i_++, w_ += (bytes), a_ += FMOE_Q8_K_BYTES) {              \
            FMOE__R1_PREFETCH_BLOCK(w_, (bytes));                                                  \
            __m256i v_[8], m_[8];                                                                  \
            VECN(w_, a_, as_, 8, v_, m_);                                                          \
            const __m256 sum_ = _mm256_cvtepi32_ps(fmoe__r1_hsum8(v_));                            \
            const __m256 msum_ = _mm256_cvtepi32_ps(fmoe__r1_hsum8(m_));                           \
            float da8_[8];                                                                         \
            _Pragma("GCC unroll 8") for (int k_ = 0; k_ < 8; k_++) memcpy(&da8_[k_], a_ + k_ * as_, 4); \
            const __m256 da_ = _mm256_loadu_ps(da8_);                                              \
            const __m256 d_ = _mm256_set1_ps(D(w_)), dmin_ = _mm256_set1_ps(DMIN(w_));             \
            const __m256 t_ = _mm256_sub_ps(_mm256_mul_ps(_mm256_mul_ps(da_, d_), sum_),           \
                                            _mm256_mul_ps(_mm256_mul_ps(da_, dmin_), msum_));      \
            s_ = _mm256_add_ps(s_, t_);                                                            \
        }                                                                                          \
        float out_[8];                                                                             \
        _mm256_storeu_ps(out_, s_);                                                                \
        for (int k_ = 0; k_ < 8; k_++) (y)[k_ * (ldy)] = out_[k_];                                 \
    } while (0)

#if defined(FMOE__R1_VNNI)
/* The 512-bit one-input kernels' (64 values a step) scales and sums. */
/* The scales of 64 values from sc, whose dwords hold one scale each in both words: dword
 * i0 in every dword of the 128-bit quarter 0 (16 values), i1 in quarter 1, and so on. */
FMOE__R1 static FMOE__R1_INLINE __m512i fmoe__r1_scales64(__m512i sc, int i0, int i1, int i2, int i3) {
    return _mm512_permutexvar_epi32(_mm512_set_epi32(i3, i3, i3, i3, i2, i2, i2, i2, i1, i1, i1, i1,
                                                     i0, i0, i0, i0),
                                    sc);
}

/* A scale a dword for each of eight 32-value groups, or sixteen 16-value ones: 2ls + 1
 * in both words of the dword, vpdpwssd's pairs. */
FMOE__R1 static FMOE__R1_INLINE __m512i fmoe__r1_scale_words(__m512i ls) {
    const __m512i s = _mm512_add_epi32(_mm512_add_epi32(ls, ls), _mm512_set1_epi32(1));
    return _mm512_or_si512(s, _mm512_slli_epi32(s, 16));
}

/* The two halves' sums: the block's integer vector as the 256-bit kernels give it. */
FMOE__R1 static FMOE__R1_INLINE void fmoe__r1_fold64(const __m512i *acc, int NX, __m256i *v) {
    _Pragma("GCC unroll 8") for (int k = 0; k < NX; k++)
        v[k] = _mm256_add_epi32(_mm512_castsi512_si256(acc[k]), _mm512_extracti64x4_epi64(acc[k], 1));
}

/* Eight inputs in the lanes (the VNNI build; lib/quant_kx_dot_avx2.c's IQ4_XS and
 * lib/quant_iq_dot_avx2.c's types with a scale per 32 values): each row's block unpacked
 * once to its 256 signed codes q as q + 128 (unsigned bytes), each four of them
 * broadcast (vpermd) and multiplied by vpdpbusd with the eight inputs' four activation
 * bytes side by side, so one vpdpbusd does 32 multiply-adds and a sub-block's eight
 * inputs end in one register, its scale then one vpmulld for all of them: per input and
 * 32 values a vpdpbusd and a share of a vpermd where the row-wise pass (FMOE__R1_ROWX8)
 * takes a load, a sign op, a maddubs, a vpdpwssd and a share of the reduction. The inputs'
 * blocks are put in that layout once per call, FMOE__R1_X8_ROWS_N rows and
 * FMOE__R1_X8_CHUNK blocks (fmoe__r1_x8_repack), each row's pass then reading them from
 * L1. The +128 comes out exactly: each sub-block's chain starts at -128·Σ a (the input's
 * bsums). Each input's block integer is the reference's, and its float steps
 * FMOE__R1_ROWX8's, so the bits are the same. The broadcasts as loads from the codes
 * stored took IQ4_XS to 14.6 ps a multiply-add against the row-wise 11.3 (the compiler
 * forwarded the stores and took the dwords out of the registers, three ops each), the
 * sub-blocks' chains one after another 13.6 (each vpdpbusd waited on the one before it),
 * the scales and the bsums' sums in scalar code 10.7; as here 9.3. */
enum { FMOE__R1_X8_CHUNK = 4, FMOE__R1_X8_ROWS_N = 16, FMOE__R1_X8_MIN = 5 };

/* The repacked blocks: per block, step s (values 4s .. 4s + 3) of sub-block j the eight
 * inputs' four bytes as dwords 0..7, at q[fmoe__r1_x8_at(j, s)]: sub-blocks 2p and 2p + 1
 * side by side at each step, one 64-byte load for both (fmoe__r1_x8_dots); per sub-block
 * the chains' start -128·Σ a per input; da per input. */
struct fmoe__r1_x8 {
    uint8_t q[FMOE__R1_X8_CHUNK][64][32];
    int32_t neg[FMOE__R1_X8_CHUNK][8][8];
    int32_t neg16[FMOE__R1_X8_CHUNK][16][8]; /* the same per 16 values (halves set) */
    float da[FMOE__R1_X8_CHUNK][8];
};

/* Where step s (0..7) of sub-block j (0..7) lies in a block's q. */
static FMOE__R1_INLINE int fmoe__r1_x8_at(int j, int s) { return ((j >> 1) * 8 + s) * 2 + (j & 1); }

/* The 8 x 8 dword transpose of r[0..7] into o[0..7]: dword k of o[m] is dword m of r[k]. */
FMOE__R1 static FMOE__R1_INLINE void fmoe__r1_transpose8x8(const __m256i *r, __m256i *o) {
    __m256i t[8], u[8];
    _Pragma("GCC unroll 8") for (int k = 0; k < 8; k += 2) {
        t[k] = _mm256_unpacklo_epi32(r[k], r[k + 1]);
        t[k + 1] = _mm256_unpackhi_epi32(r[k], r[k + 1]);
    }
    _Pragma("GCC unroll 8") for (int k = 0; k < 8; k += 4) {
        u[k] = _mm256_unpacklo_epi64(t[k], t[k + 2]);
        u[k + 1] = _mm256_unpackhi_epi64(t[k], t[k + 2]);
        u[k + 2] = _mm256_unpacklo_epi64(t[k + 1], t[k + 3]);
        u[k + 3] = _mm256_unpackhi_epi64(t[k + 1], t[k + 3]);
    }
    _Pragma("GCC unroll 8") for (int m = 0; m < 4; m++) {
        o[m] = _mm256_permute2x128_si256(u[m], u[m + 4], 0x20);
        o[m + 4] = _mm256_permute2x128_si256(u[m], u[m + 4], 0x31);
    }
}

/* Blocks [i0, i0 + nc) of the nx (1..8) inputs at a (as bytes apart) into x: each 32 values
 * of the eight inputs an 8 x 8 dword transpose, and so the eight inputs' sub-block sums
 * (bsums in pairs, times -128), or with halves their sums of 16 (bsums times -128). */
FMOE__R1 static __attribute__((unused)) void fmoe__r1_x8_repack(const uint8_t *a, int64_t as, int nx, int64_t i0,
                                                                int64_t nc, int halves, struct fmoe__r1_x8 *x) {
    /* fewer than eight inputs: the last one again in the lanes left (their sums unused) */
    int64_t off[8];
    for (int k = 0; k < 8; k++) off[k] = (k < nx ? k : nx - 1) * as;
    for (int64_t c = 0; c < nc; c++) {
        const uint8_t *ab = a + (i0 + c) * FMOE_Q8_K_BYTES;
        __m256i r[8], o[8];
        _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++) memcpy(&x->da[c][k], ab + off[k], 4);
        _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) { /* sub-block j: steps 8j .. 8j + 7 */
            _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++)
                r[k] = fmoe__r1_load(ab + off[k] + FMOE__Q8K_Q + 32 * j);
            fmoe__r1_transpose8x8(r, o);
            _Pragma("GCC unroll 8") for (int m = 0; m < 8; m++)
                _mm256_store_si256((__m256i *)x->q[c][fmoe__r1_x8_at(j, m)], o[m]);
        }
        const __m256i m128 = _mm256_set1_epi16(-128);
        if (!halves) {
            _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++)
                r[k] = _mm256_madd_epi16(fmoe__r1_load(ab + off[k] + FMOE__Q8K_BSUMS), m128);
            fmoe__r1_transpose8x8(r, o);
            _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++)
                _mm256_store_si256((__m256i *)x->neg[c][j], o[j]);
            continue;
        }
        for (int h = 0; h < 2; h++) { /* bsums 8h .. 8h + 7 */
            _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++)
                r[k] = _mm256_mullo_epi32(_mm256_cvtepi16_epi32(_mm_loadu_si128(
                                              (const __m128i *)(ab + off[k] + FMOE__Q8K_BSUMS + 16 * h))),
                                          _mm256_set1_epi32(-128));
            fmoe__r1_transpose8x8(r, o);
            _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++)
                _mm256_store_si256((__m256i *)x->neg16[c][8 * h + j], o[j]);
        }
    }
}

/* One row's block, its codes gu[0..7] (sub-block j's 32 as q + 128) and scales sc (scale
 * j in dword j), against repacked block c: the eight inputs' block integers. Sub-blocks
 * 2p and 2p + 1 share a 512-bit register (the low and the high half), the four pairs'
 * chains side by side: one vpermd and one vpdpbusd for 64 multiply-adds of eight inputs
 * (two of each in 256-bit registers: 9.3 -> ... ps). The halves fold into the same int32
 * sums, so the same bits. */
FMOE__R1 static FMOE__R1_INLINE __m256i fmoe__r1_x8_dots(const __m256i *gu, __m256i sc,
                                                         const struct fmoe__r1_x8 *x, int64_t c) {
    __m512i t[4], g[4];
    _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++) {
        t[p] = _mm512_load_si512((const void *)x->neg[c][2 * p]);
        g[p] = _mm512_inserti64x4(_mm512_castsi256_si512(gu[2 * p]), gu[2 * p + 1], 1);
    }
    _Pragma("GCC unroll 8")
    for (int s = 0; s < 8; s++) {
        const __m512i idx = _mm512_inserti64x4(_mm512_set1_epi32(s), _mm256_set1_epi32(s + 8), 1);
        _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++)
            t[p] = _mm512_dpbusd_epi32(t[p], _mm512_permutexvar_epi32(idx, g[p]),
                                       _mm512_load_si512((const void *)x->q[c][fmoe__r1_x8_at(2 * p, s)]));
    }
    const __m512i scz = _mm512_castsi256_si512(sc);
    __m512i v = _mm512_setzero_si512();
    _Pragma("GCC unroll 4")
    for (int p = 0; p < 4; p++)
        v = _mm512_add_epi32(v, _mm512_mullo_epi32(t[p], _mm512_permutexvar_epi32(
                                     _mm512_inserti64x4(_mm512_set1_epi32(2 * p), _mm256_set1_epi32(2 * p + 1), 1), scz)));
    return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}

/* The same with a scale per 16 values: sc2[0] holds scale 2j in dword j, sc2[1] scale
 * 2j + 1; each sub-block's chain in two halves, steps 0..3 and 4..7, the pairs of
 * sub-blocks in 512-bit registers as fmoe__r1_x8_dots has them. */
FMOE__R1 static FMOE__R1_INLINE __m256i fmoe__r1_x8_dots16(const __m256i *gu, const __m256i *sc2,
                                                           const struct fmoe__r1_x8 *x, int64_t c) {
    __m512i g[4];
    _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++)
        g[p] = _mm512_inserti64x4(_mm512_castsi256_si512(gu[2 * p]), gu[2 * p + 1], 1);
    __m512i v = _mm512_setzero_si512();
    _Pragma("GCC unroll 2")
    for (int h = 0; h < 2; h++) {
        __m512i t[4];
        _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++)
            t[p] = _mm512_inserti64x4(_mm512_castsi256_si512(fmoe__r1_load(x->neg16[c][4 * p + h])),
                                      fmoe__r1_load(x->neg16[c][4 * p + 2 + h]), 1);
        _Pragma("GCC unroll 4")
        for (int s = 4 * h; s < 4 * h + 4; s++) {
            const __m512i idx = _mm512_inserti64x4(_mm512_set1_epi32(s), _mm256_set1_epi32(s + 8), 1);
            _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++)
                t[p] = _mm512_dpbusd_epi32(t[p], _mm512_permutexvar_epi32(idx, g[p]),
                                           _mm512_load_si512((const void *)x->q[c][fmoe__r1_x8_at(2 * p, s)]));
        }
        const __m512i scz = _mm512_castsi256_si512(sc2[h]);
        _Pragma("GCC unroll 4")
        for (int p = 0; p < 4; p++)
            v = _mm512_add_epi32(v, _mm512_mullo_epi32(t[p], _mm512_permutexvar_epi32(
                                         _mm512_inserti64x4(_mm512_set1_epi32(2 * p), _mm256_set1_epi32(2 * p + 1), 1), scz)));
    }
    return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}

/* The scales per 32 values (one vector) or per 16 (two, HALVES) and the dots. */
#define FMOE__R1_X8_DOTS(HALVES, CODES, w, gu, x, c)                                               \
    (HALVES ? fmoe__r1_x8_dots16(gu, (CODES(w, gu, sc2_), sc2_), x, c)                             \
            : fmoe__r1_x8_dots(gu, CODES(w, gu, sc2_), x, c))

/* name(W, rb, rows, a, as, nb, y, ldy): rows x eight inputs, FMOE__R1_X8_ROWS_N rows at a
 * time, their per-input sums s kept across the chunks of FMOE__R1_X8_CHUNK blocks,
 * s += (da·d)·sum - (da·dmin)·msum in block order (dmin and msum zero, as the row-wise
 * pass of these types has them). CODES(b, gu, sc2) sets a block's codes and returns its
 * scales, or with HALVES sets sc2[0..1] to its scales per 16 values; D(b) is its f32
 * factor. */
#define FMOE__R1_X8_ROWS(name, BYTES, CODES, D, HALVES)                                            \
    FMOE__R1 static void name(const uint8_t *W, int64_t rb, int64_t rows, const uint8_t *a,       \
                              int64_t as, int nx, int64_t nb, float *y, int64_t ldy) {             \
        struct fmoe__r1_x8 x __attribute__((aligned(64)));                                         \
        for (int64_t r0 = 0; r0 < rows; r0 += FMOE__R1_X8_ROWS_N) {                                \
            const int64_t nr = rows - r0 < FMOE__R1_X8_ROWS_N ? rows - r0 : FMOE__R1_X8_ROWS_N;    \
            __m256 s[FMOE__R1_X8_ROWS_N];                                                          \
            for (int64_t r = 0; r < nr; r++) s[r] = _mm256_setzero_ps();                           \
            for (int64_t i0 = 0; i0 < nb; i0 += FMOE__R1_X8_CHUNK) {                               \
                const int64_t nc = nb - i0 < FMOE__R1_X8_CHUNK ? nb - i0 : FMOE__R1_X8_CHUNK;      \
                fmoe__r1_x8_repack(a, as, nx, i0, nc, (HALVES), &x);                                \
                for (int64_t r = 0; r < nr; r++) {                                                 \
                    const uint8_t *w = W + (r0 + r) * rb + i0 * (BYTES);                           \
                    __m256 sr = s[r];                                                              \
                    for (int64_t c = 0; c < nc; c++, w += (BYTES)) {                               \
                        FMOE__R1_PREFETCH_BLOCK(w, (BYTES));                                       \
                        __m256i gu[8], sc2_[2];                                                    \
                        const __m256 sum =                                                         \
                            _mm256_cvtepi32_ps(FMOE__R1_X8_DOTS((HALVES), CODES, w, gu, &x, c));   \
                        const __m256 msum = _mm256_setzero_ps(), dmin = _mm256_setzero_ps();       \
                        const __m256 da = _mm256_load_ps(x.da[c]), d = _mm256_set1_ps(D(w));      \
                        const __m256 t = _mm256_sub_ps(_mm256_mul_ps(_mm256_mul_ps(da, d), sum),   \
                                                       _mm256_mul_ps(_mm256_mul_ps(da, dmin), msum)); \
                        sr = _mm256_add_ps(sr, t);                                                 \
                    }                                                                              \
                    s[r] = sr;                                                                     \
                }                                                                                  \
            }                                                                                      \
            for (int64_t r = 0; r < nr; r++) {                                                     \
                float out[8];                                                                      \
                _mm256_storeu_ps(out, s[r]);                                                       \
                for (int k = 0; k < nx; k++) y[k * ldy + r0 + r] = out[k];                         \
            }                                                                                      \
        }                                                                                          \
    }

/* Row panels (the VNNI build, 512-bit registers; lib/quant_act_avx2.c's Q5_K and
 * lib/quant_kx_dot_avx2.c's Q3_K with several inputs): FMOE__R1_PANEL_ROWS rows and up to
 * FMOE__R1_PANEL_X inputs a panel, each row's block unpacked once for all the inputs. A
 * register holds two rows' codes of one 32-value group g, row 2rp + h's 32 in bytes
 * 32h .. 32h + 31, against the input's 32 bytes of the group in both halves (one 256-bit
 * load broadcast, the Q8_K block as it is): one vpdpbusd gives lane 8h + l the sum of
 * values 32g + 4l .. 32g + 4l + 3 of row 2rp + h (64 multiply-adds), at most 4·31·127,
 * an int16, so one vpdpwssd with (scale, 0) pairs adds it times its scale into the lane's
 * sum. Each accumulator lane then gathers exactly the products of values 32g + 4l ..
 * 32g + 4l + 3 of every group g: lane l of lib/quant_act_avx2.c's one-input Q5_K kernel
 * (whose f32 steps are per lane), and the lanes of a row add up to its block integer
 * (Q3_K). Tried on the way (Q5_K, 16 inputs, ps a multiply-add, fmoe_quant_act_matvec in
 * 16-row calls over a 128 x 1024 matrix as a prefill makes them, best of 500): sixteen
 * rows in the lanes with an input's int16 pair broadcast to them (a 16 x 16 transpose per
 * panel, eight accumulators per input) 12.1-12.3, no better than four inputs a pass
 * (12.2): a broadcast per vpdpwssd; the codes times scales as int16, two rows a register
 * against the input's pairs side by side (one vpdpwssd per 32 multiply-adds) 8.7-9.1; as
 * here 7.8-8.0, the unpacking without widening, multiplies and permutes and the inputs
 * without conversion (Q3_K 7.9-8.0 -> 7.3-7.4). */
enum { FMOE__R1_PANEL_ROWS = 16, FMOE__R1_PANEL_PAIRS = 8, FMOE__R1_PANEL_X = 16 };

struct fmoe__r1_panel {
    __m512i q[8][FMOE__R1_PANEL_PAIRS];  /* group g's codes (unsigned bytes), rows 2rp, 2rp + 1 */
    __m512i sc[8][FMOE__R1_PANEL_PAIRS]; /* lane 8h + l: (scale of values 32g + 4l .., 0) */
};

/* The K (at most 3: 24 accumulators) inputs' blocks a[0..K-1] against the panel's block:
 * s[k][rp] += the lane sums. Unrolled whole: with the groups a loop, GCC 12 kept the
 * accumulators in memory. */
FMOE__R1 static FMOE__R1_INLINE void fmoe__r1_panel_dots(const struct fmoe__r1_panel *P,
                                                         const uint8_t *const *a, int K,
                                                         __m512i s[][FMOE__R1_PANEL_PAIRS]) {
    _Pragma("GCC unroll 8") for (int g = 0; g < 8; g++) {
        __m512i av[3];
        _Pragma("GCC unroll 3") for (int k = 0; k < K; k++)
            av[k] = _mm512_broadcast_i64x4(fmoe__r1_load(a[k] + FMOE__Q8K_Q + 32 * g));
        _Pragma("GCC unroll 8") for (int rp = 0; rp < FMOE__R1_PANEL_PAIRS; rp++) {
            const __m512i qv = P->q[g][rp], sv = P->sc[g][rp];
            _Pragma("GCC unroll 3") for (int k = 0; k < K; k++) {
                const __m512i four = _mm512_dpbusd_epi32(_mm512_setzero_si512(), qv, av[k]);
                s[k][rp] = _mm512_dpwssd_epi32(s[k][rp], four, sv);
            }
        }
    }
}

/* Panel rows r0 .. r0 + 15 of W (rows past `rows` repeat the last; their results are
 * dropped): w[r] */
static FMOE__R1_INLINE void fmoe__r1_panel_rows(const uint8_t *W, int64_t rb, int64_t rows, int64_t r0,
                                                const uint8_t **w) {
    const int64_t nr = rows - r0 < FMOE__R1_PANEL_ROWS ? rows - r0 : FMOE__R1_PANEL_ROWS;
    for (int r = 0; r < FMOE__R1_PANEL_ROWS; r++) w[r] = W + (r0 + (r < nr ? r : nr - 1)) * rb;
}

/* Asks for `bytes` at base, base + rb, .. of sixteen rows (a block of each; past the
 * matrix's end the requests do not fault). The panels ask for their rows' next block a
 * block ahead: a prefill's expert matrices come from memory, and without it the first
 * loads of each block's codes took the most samples of the panel (perf). Whole model,
 * 64-token prefill, 1 thread, medians of 11 alternating runs: Q5_K 1137 -> 1214 tokens/s,
 * Q3_K 1283 -> 1347; L2-resident kernels 1-2% slower (the requests' own cost). */
static FMOE__R1_INLINE void fmoe__r1_panel_prefetch(const uint8_t *base, int64_t rb, int64_t bytes) {
    for (int r = 0; r < FMOE__R1_PANEL_ROWS; r++)
        for (int64_t o = 0; o < bytes + 63; o += 64)
            _mm_prefetch((const char *)base + r * rb + (o < bytes ? o : bytes - 1), _MM_HINT_T0);
}

/* How many inputs the next panel takes of the left ones, `groups` panels left: equal
 * shares (17 as 9 and 8, not 16 and 1: a panel's unpacking costs as much for one input
 * as for sixteen). */
static inline int fmoe__r1_panel_share(int left, int groups) { return left / groups; }

/* name(W, row_bytes, rows, a, stride, nx, n, y, ldy): rows x nx inputs (stride bytes
 * apart) by row panels, the inputs in equal groups of at most FMOE__R1_PANEL_X, a panel's
 * inputs three at a time (then two or one). Per type: PANEL the panel's struct, BYTES a
 * block's, START(P, m) before a row panel's blocks, BLOCK(w, offset, P) the panel rows'
 * block at offset into P, DOTS(P, x, K, ab, first) inputs x .. x + K - 1 (their blocks
 * ab; first: the row panel's first block), FINISH(P, m, y, ldy, nr) the first nr rows'
 * results of the m inputs to y[k·ldy + r]. */
#define FMOE__R1_PANEL_ROWSX(name, PANEL, BYTES, START, BLOCK, DOTS, FINISH)                        \
    FMOE__R1 static void name(const uint8_t *W, int64_t row_bytes, int64_t rows, const uint8_t *a,  \
                              int64_t stride, int32_t nx, int64_t n, float *y, int64_t ldy) {        \
        PANEL P __attribute__((aligned(64)));                                                       \
        const int64_t nb = n / FMOE_QK_K;                                                           \
        const int groups = (nx + FMOE__R1_PANEL_X - 1) / FMOE__R1_PANEL_X;                          \
        for (int g = 0, x0 = 0; g < groups; g++) {                                                  \
            const int m = fmoe__r1_panel_share(nx - x0, groups - g);                                \
            const uint8_t *ax = a + x0 * stride;                                                    \
            for (int64_t r0 = 0; r0 < rows; r0 += FMOE__R1_PANEL_ROWS) {                            \
                const uint8_t *w[FMOE__R1_PANEL_ROWS];                                              \
                fmoe__r1_panel_rows(W, row_bytes, rows, r0, w);                                     \
                START(&P, m);                                                                       \
                for (int64_t i = 0; i < nb; i++) {                                                  \
                    /* the panel rows' next block, after the last the next sixteen rows' first     \
                     * (the next chunk, which the same thread usually claims) */                    \
                    fmoe__r1_panel_prefetch(i + 1 < nb ? W + r0 * row_bytes + (i + 1) * (BYTES)     \
                                                       : W + (r0 + FMOE__R1_PANEL_ROWS) * row_bytes, \
                                            row_bytes, (BYTES));                                    \
                    BLOCK(w, i * (BYTES), &P);                                                      \
                    const uint8_t *ab[FMOE__R1_PANEL_X];                                            \
                    for (int k = 0; k < m; k++) ab[k] = ax + k * stride + i * FMOE_Q8_K_BYTES;      \
                    int k = 0;                                                                      \
                    for (; k + 3 <= m; k += 3) DOTS(&P, k, 3, ab + k, i == 0);                      \
                    if (m - k == 2)                                                                 \
                        DOTS(&P, k, 2, ab + k, i == 0);                                             \
                    else if (m - k == 1)                                                            \
                        DOTS(&P, k, 1, ab + k, i == 0);                                             \
                }                                                                                   \
                FINISH(&P, m, y + x0 * ldy + r0, ldy,                                               \
                       rows - r0 < FMOE__R1_PANEL_ROWS ? rows - r0 : FMOE__R1_PANEL_ROWS);          \
            }                                                                                       \
            x0 += m;                                                                                \
        }                                                                                           \
    }

/* name(W, row_bytes, rows, qx, astride, nx, n, y, ldy): eight inputs a pass by ROWS8 (an
 * FMOE__R1_X8_ROWS), and so the last FMOE__R1_X8_MIN .. 7 (lanes left over); fewer by
 * REST (passes of up to four). */
#define FMOE__R1_X8_ROWSX(name, ROWS8, REST)                                                       \
    FMOE__R1 static void name(const uint8_t *W, int64_t row_bytes, int64_t rows, const uint8_t *qx, \
                              int64_t astride, int32_t nx, int64_t n, float *y, int64_t ldy) {     \
        int32_t k = 0;                                                                             \
        for (; nx - k >= FMOE__R1_X8_MIN; k += 8) {                                                \
            const int g = nx - k < 8 ? nx - k : 8;                                                 \
            ROWS8(W, row_bytes, rows, qx + k * astride, astride, g, n / FMOE_QK_K, y + k * ldy, ldy); \
        }                                                                                          \
        if (k < nx)                                                                                \
            REST(W, row_bytes, rows, qx + k * astride, astride, nx - k, n, y + k * ldy, ldy);      \
    }
#endif

/* How many inputs the next pass takes of the left ones: four, but five as three and two
 * (a one-input pass forms its codes for one input alone); with max 8, eight while eight
 * are left. */
static inline int fmoe__r1_group(int left) { return left == 5 ? 3 : left > 4 ? 4 : left; }
static inline int fmoe__r1_group_max(int left, int max) {
    return max >= 8 && left >= 8 ? 8 : fmoe__r1_group(left);
}

/* rows x one input: where the build has VNNI and EIGHT is 1, eight rows a step (its 32
 * registers hold the step's vectors), then one row a step. EIGHT is 0 for the kernels whose
 * block vectors take many registers themselves (the i-quants whose grid indices are formed
 * in scalar registers): eight of them a step spilled, slower than one. */
#if defined(FMOE__R1_VNNI)
#define FMOE__R1_EIGHT 1
#else
#define FMOE__R1_EIGHT 0
#endif
/* The most inputs a prefill pass takes (lib/quant_iq_dot_avx2.c, IQ4_XS): eight where the
 * build has 32 registers (the eight inputs' accumulators stay in them), else four. Each
 * block's codes formed once for eight inputs instead of four, ps a multiply-add with eight
 * inputs on the development VM's EPYC (VNNI build): IQ4_XS 13.1 -> 11.4, IQ3_S
 * 27.6 -> 21.6, IQ3_XXS 22.9 -> 16.5, IQ2_XXS 16.0 -> 14.2, IQ2_XS 19.8 -> 14.8, IQ1_S
 * 17.4 -> 16.3, IQ1_M 19.0 -> 17.0. Q2_K and Q3_K, whose codes are a few vector ops, stay
 * at four. */
#if defined(FMOE__R1_VNNI)
#define FMOE__R1_XMAX 8
#else
#define FMOE__R1_XMAX 4
#endif
#define FMOE__R1_ROWS(W, row_bytes, rows, qx, nb, bytes, VEC, D, DMIN, D8, y, EIGHT)               \
    do {                                                                                           \
        int64_t r_ = 0;                                                                            \
        if (FMOE__R1_EIGHT && (EIGHT))                                                             \
            for (; r_ + 7 < (rows); r_ += 8)                                                       \
                FMOE__R1_ROWS8((y) + r_, (W) + r_ * (row_bytes), (row_bytes), (qx), (nb), (bytes), \
                               VEC, D8);                                                           \
        for (; r_ < (rows); r_++)                                                                  \
            FMOE__R1_ROW((y)[r_], (W) + r_ * (row_bytes), (qx), (nb), (bytes), VEC, D, DMIN);      \
    } while (0)

#endif
#endif
