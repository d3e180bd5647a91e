/*
 * quant_impl.h - what lib/quant.c, the kernels (quant_avx2.c, quant_avx512.c, quant_kx.c),
 * the quantisers (quant_ref.c, quant_ref32.c, quant_refk.c) and lib/quant_act.c share
 * (internal).
 */
#ifndef FMOE_QUANT_IMPL_H
#define FMOE_QUANT_IMPL_H

#include <stdint.h>
#include <string.h>

#include "half.h"
#include "quant_block.h" /* the block formats' value formulas, fmoe__scale_min_k4 */

/* A group whose largest magnitude is below this quantises to zeros (ggml's GROUP_MAX_EPS). */
#define FMOE_QUANT_GROUP_MAX_EPS 1e-15f

static inline int fmoe__clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* A block's f16 field at p (unaligned). */
static inline void fmoe__put_f16(uint8_t *p, float f) {
    const uint16_t h = fmoe_float_to_half(f);
    memcpy(p, &h, 2);
}

/* ggml's nearest_int: round to nearest, ties to even, through the 1.5·2^23 trick, for
 * |v| <= 2^22. Values outside (only from non-finite or absurd inputs, whose blocks are
 * unspecified) are clamped first so the trick stays defined. The quantisers of the weights
 * (quant_ref.c) and of the activations (quant_act.c) both round with it, as ggml's do. */
static inline int fmoe__nearest_int(float v) {
    if (!(v > -4194303.f)) v = -4194303.f;
    if (!(v < 4194303.f)) v = 4194303.f;
    float f = v + 12582912.f;
    int32_t i;
    memcpy(&i, &f, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

/* One block of Q4_0, Q4_1, Q5_0, Q5_1 or IQ4_NL from x[32] (lib/quant_ref32.c). */
void fmoe__quantize_q32_block(uint32_t type, const float *x, uint8_t *dst);

/* 1 for the 32-value block types that Q8_0 activations multiply in the 8-bit path, other
 * than Q8_0 itself: Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL. */
static inline int fmoe__is_q32(uint32_t t) {
    return t == FMOE_GGML_Q4_0 || t == FMOE_GGML_Q4_1 || t == FMOE_GGML_Q5_0 ||
           t == FMOE_GGML_Q5_1 || t == FMOE_GGML_IQ4_NL;
}

/* 1 for the codebook i-quants of lib/quant_iq.c: IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S,
 * IQ1_S, IQ1_M (256-value blocks, computed as the Q2_K/Q3_K/IQ4_XS family below). */
static inline int fmoe__is_iq(uint32_t t) {
    return t == FMOE_GGML_IQ2_XXS || t == FMOE_GGML_IQ2_XS || t == FMOE_GGML_IQ2_S ||
           t == FMOE_GGML_IQ3_XXS || t == FMOE_GGML_IQ3_S || t == FMOE_GGML_IQ1_S ||
           t == FMOE_GGML_IQ1_M;
}

/* Q2_K, Q3_K and IQ4_XS rows (lib/quant_kx.c): the AVX2 f32 dot (only called when the CPU
 * has AVX2, FMA and F16C), and the dot against Q8_K activations, its per-block integer
 * sums at kernel level `level` (a FMOE__QUANT_* the CPU has), the same bits at every
 * level. */
float fmoe__quant_dot_kx_avx2(uint32_t type, const void *row, const float *x, int64_t n);

/* A Q2_K, Q3_K or IQ4_XS block unpacked: 256 signed codes, the sixteen sub-blocks'
 * integer scales and mins (fmoe__kx_scale), d and dmin; x[16s + i] = d·sc[s]·q - dmin·m[s]
 * up to rounding. fmoe__kx_unpack_avx2 fills one with AVX2 (only called when the CPU has
 * it), the same bytes as fmoe__kx_sub's. */
typedef struct fmoe__kx_block {
    int8_t q[FMOE_QK_K];
    int16_t sc[16], m[16];
    float d, dmin;
} fmoe__kx_block;
void fmoe__kx_unpack_avx2(uint32_t type, const uint8_t *b, fmoe__kx_block *u);

/* An i-quant block (fmoe__is_iq) unpacked into the same shape (lib/quant_iq.c): codes
 * with their signs (IQ1: 8·g ± 1), the integer scales, d the block's f16 scale times the
 * type's power of two; m and dmin zero. Value 16s + i is (d·sc[s])·q[16s + i], which
 * fmoe__iq_values writes for the block's 256 values, bit for bit ggml's dequantisation.
 * fmoe__iq_d is the block's f16 d as stored (IQ1_M: assembled from its scale words). */
void fmoe__iq_unpack(uint32_t type, const uint8_t *b, fmoe__kx_block *u);
/* fmoe__iq_scales: the part of fmoe__iq_unpack that fills sc, m, d and dmin (plain C).
 * fmoe__iq_unpack_avx2 (lib/quant_iq_avx2.c; only called when the CPU has AVX2): the
 * whole block, codes and scales by AVX2, the same bytes as fmoe__iq_unpack's. */
void fmoe__iq_scales(uint32_t type, const uint8_t *b, fmoe__kx_block *u);
/* The unpacked block's d alone (the f16 scale times the type's power of two). */
float fmoe__iq_block_d(uint32_t type, const uint8_t *b);
void fmoe__iq_unpack_avx2(uint32_t type, const uint8_t *b, fmoe__kx_block *u);
/* The 8-bit row kernels of Q2_K, Q3_K and IQ4_XS (lib/quant_kx_dot_avx2.c) and of the
 * codebook i-quants (fmoe__is_iq; lib/quant_iq_dot_avx2.c), only called when the CPU has
 * AVX2: rows1, rows x one Q8_K input into y[r], rows row_bytes apart; rowsx, rows x nx
 * inputs (astride bytes apart) into y[k·ldy + r], a prefill's product, up to four inputs a
 * pass over each row, every input its rows1 bits. Each row's blocks summed straight from
 * their bytes: the bits of fmoe__quant_act_dot_kx at any level. */
typedef void fmoe__rows1_fn(uint32_t type, const void *W, int64_t row_bytes, int64_t rows,
                            const void *qx, int64_t n, float *y);
typedef void fmoe__rowsx_fn(uint32_t type, const void *W, int64_t row_bytes, int64_t rows,
                            const void *qx, int64_t astride, int32_t nx, int64_t n, float *y,
                            int64_t ldy);
/* Both files are compiled twice, so the entries come in two builds, a pair a line: the AVX2
 * one, and the _vnni one for CPUs with AVX512-VNNI, GFNI and BMI2 (lib/quant_kx_dot_avx2_vnni.c,
 * lib/quant_iq_dot_avx2_vnni.c; eight rows a step), the same bits. Neither checks the CPU:
 * lib/quant_act.c picks the build, the _vnni one where fmoe__quant_vnni(), as it picks the
 * other 8-bit kernels' (fmoe__quant_act_rows_avx2_vnni), and tests/lib/test_quant_rows1.c
 * calls each build the CPU has. */
fmoe__rows1_fn fmoe__kx_rows1_avx2, fmoe__iq_rows1_avx2;
fmoe__rowsx_fn fmoe__kx_rowsx_avx2, fmoe__iq_rowsx_avx2;
fmoe__rows1_fn fmoe__kx_rows1_avx2_vnni, fmoe__iq_rows1_avx2_vnni;
fmoe__rowsx_fn fmoe__kx_rowsx_avx2_vnni, fmoe__iq_rowsx_avx2_vnni;
void fmoe__iq_values(uint32_t type, const uint8_t *b, float *y);
float fmoe__iq_d(uint32_t type, const uint8_t *b);

/* Σ_s sc_s·Σ_i q·qa over an unpacked block and a Q8_K block's 256 codes, AVX-512
 * (lib/quant_act_avx512.c; only called at FMOE__QUANT_AVX512): the reference's integer. */
int32_t fmoe__kx_isum_avx512(const fmoe__kx_block *u, const int8_t *qa);
float fmoe__quant_act_dot_kx(uint32_t type, const void *row, const void *qx, int64_t n,
                             int level);
/* rows x nx of those dots into y[k * ldy + r], each block unpacked once for every input;
 * the same bits as fmoe__quant_act_dot_kx's (fmoe_quant_act_matvec's path below AVX2). */
void fmoe__quant_act_rows_kx(uint32_t type, const void *W, int64_t row_bytes, int64_t rows,
                             const void *qx, int64_t stride, int32_t nx, int64_t n, float *y,
                             int64_t ldy, int level);

/* ggml's make_qkx2_quants (lib/quant_ref.c): an affine n-value grid of nmax+1 levels by
 * weighted least squares over nstep+1 trial scales; use_mad weighs absolute instead of
 * squared errors (ggml's Q2_K). Levels into L, -min into *the_min; returns the scale. */
float fmoe__make_qkx2_quants(int n, int nmax, const float *x, const float *w, uint8_t *L,
                             float *the_min, uint8_t *Laux, float rmin, float rdelta, int nstep,
                             int use_mad);

/* One block of Q2_K or Q3_K from x[256] (lib/quant_refk.c), of IQ4_XS (lib/quant_ref32.c,
 * with IQ4_NL's search per 32 values). */
void fmoe__quantize_k23_block(uint32_t type, const float *x, uint8_t *dst);
void fmoe__quantize_iq4_xs_block(const float *x, uint8_t *dst);

/* One MXFP4 block from x[32] (lib/quant_mxfp4.c: ggml's reference quantiser). */
void fmoe__quantize_mxfp4_block(const float *x, uint8_t *dst);

/* A row of n values (whole 256-value blocks) of IQ3_XXS, IQ3_S or IQ2_S into dst
 * (lib/quant_iq_quantize.c, ggml's quantisers), weighted by importance[n] where not NULL;
 * of IQ2_XXS, IQ2_XS, IQ1_S or IQ1_M, importance not NULL.
 * @return 0, or FMOE_ENOMEM where the type's search tables (lib/iq_search.h) could not be
 * built. */
int fmoe__quantize_iq_row(uint32_t type, const float *src, const float *importance,
                          uint8_t *dst, int64_t n);

/* The kernel levels, lowest first: plain C (the reference), AVX2 (+ FMA, F16C), AVX-512
 * (F, BW and VL on top of AVX2: lib/quant_avx512.c, lib/quant_act_avx512.c). A level runs only on a CPU that
 * has every instruction of it and of the levels below. */
enum { FMOE__QUANT_PLAIN = 0, FMOE__QUANT_AVX2 = 1, FMOE__QUANT_AVX512 = 2 };

/* The level the dots and quantisers of lib/quant.c and lib/quant_act.c run at: the one
 * forced by fmoe__quant_force_level, else fmoe__quant_level_max(). */
int fmoe__quant_level(void);

/* The best level this CPU has, decided once (__builtin_cpu_supports) with FMOE_NO_AVX2
 * (plain C) and FMOE_NO_AVX512 (at most AVX2) in the environment honoured. */
int fmoe__quant_level_max(void);

/* The level the 8-bit products of Q8_0, the 32-value blocks (Q4_0 .. IQ4_NL, MXFP4) and
 * Q4_K, Q5_K, Q6_K run at (lib/quant_act.c): the forced level if one is, else the best,
 * except AVX2's kernels on an AMD CPU with AVX-512. Zen 4 executes a 512-bit operation as
 * two 256-bit halves, and on the development VM's EPYC the 32-value kernels' AVX2 forms
 * took 15-20% less time than their AVX-512 ones, one input or eight, and the K-quants'
 * 10-14% less with one input, up to 10% with eight (docs/quantization.md "Speed"). Per
 * CPU, fixed for the process: the products' bits do not depend on timing. */
int fmoe__quant_act_level(void);
/* 1 where the AVX2 level's 8-bit dots may use vpdpbusd (lib/quant_act_avx2_vnni.c) and the
 * row kernels their _vnni build (fmoe__rows1_fn above): the CPU has AVX512-VNNI, -BW and -VL,
 * GFNI and BMI2, the AVX2 level is available, and FMOE_NO_VNNI is not set in the environment
 * (which lets a test run the plain AVX2 kernels on such a CPU). */
int fmoe__quant_vnni(void);

/* For tests and benchmarks, which compare the levels in one process: level (a
 * FMOE__QUANT_* value) from now on, or -1 for fmoe__quant_level_max() again. @return 0,
 * or -1 (nothing changed) where level is above fmoe__quant_level_max(). Not for use while
 * another thread runs a kernel: that one may see either level. */
int fmoe__quant_force_level(int level);

/* The name of a level ("plain", "avx2", "avx512"). */
const char *fmoe__quant_level_name(int level);

/* The AVX2+FMA+F16C dot product (lib/quant_avx2.c); only called when the CPU has them.
 * Handles every supported type. */
float fmoe__quant_dot_avx2(uint32_t type, const void *row, const float *x, int64_t n);

/* The AVX-512 one (lib/quant_avx512.c), only called at FMOE__QUANT_AVX512: its own kernels
 * for Q8_0 and the K-quants, the AVX2 ones for F32, F16 and BF16 rows. */
float fmoe__quant_dot_avx512(uint32_t type, const void *row, const float *x, int64_t n);

/* quant_block.h's fmoe__scale_min_k4 for all eight sub-blocks at once, as bytes (ggml's
 * utmp trick, four 32-bit words at a time, the SIMD kernels' form): the 12 scale bytes q
 * into u[0..1], scales of sub-blocks 0..7 in byte order, and u[2..3], their mins. */
static inline void fmoe__scale_min_k4_all(const uint8_t *q, uint32_t u[4]) {
    memcpy(u, q, 12); /* three loads (bytes assembled by shifts here cost Q4_K's kernel
                       * 15.6 -> 18.6 ps a multiply-add) */
    u[3] = ((u[2] >> 4) & 0x0f0f0f0f) | (((u[1] >> 6) & 0x03030303) << 4);
    const uint32_t u1 = u[1] & 0x3f3f3f3f;
    u[1] = (u[2] & 0x0f0f0f0f) | (((u[0] >> 6) & 0x03030303) << 4);
    u[2] = u1;
    u[0] &= 0x3f3f3f3f;
}

#endif
