/*
 * quant_block.h - the value formula of each ggml block format fmoe computes with (Q8_0,
 * Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, and the 32-value Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL,
 * MXFP4),
 * written once as
 * plain C that lib/quant.c compiles and the CUDA kernels (runtime/cuda/cuda_quant.cu)
 * include: the GPU dequantises with the very arithmetic that
 * tests/python/test_gguf_quants.py checks bit for bit against gguf-py (internal; FMOE_HD
 * marks every function for host and device under nvcc). The CUDA backend has kernels
 * for every type here (fmoe__qblock_cuda_has), and for the i-quants of
 * lib/quant_iq_block.h.
 *
 * The byte layouts are ggml's (ggml-common.h); fmoe/quant.h lists them. Each value is
 * computed on its own, in ggml's order of operations (dequantize_row_*): the block's f16
 * scale times the sub-block's integer scale, rounded to f32, times the quantised value,
 * minus (Q4_K, Q5_K) the f16 min times the integer min rounded the same way. Neither the
 * ISO C build nor the CUDA module (--fmad=false) fuses a·b - c, so both round twice and
 * agree bit for bit whatever order the values are produced in.
 *
 * Two granularities over the same functions:
 *   fmoe__qblock_dequant   a whole block (fmoe_quant_dequantize_row, host);
 *   fmoe__qblock_dequant8  values 8k..8k+7 of a block: what one GPU thread produces, with
 *                          the scales of its sub-block decoded once for its 8 values.
 * Reads are byte loads: rows of 34- and 210-byte blocks have no alignment to rely on.
 */
#ifndef FMOE_QUANT_BLOCK_H
#define FMOE_QUANT_BLOCK_H

#include <stdint.h>

#include "fmoe/elementwise.h" /* FMOE_HD */
#include "half.h"
#include "fmoe/quant.h"
#include "quant_iq_block.h" /* the i-quants' groups of 8, with their grids */

/* Values and bytes of one block of the quantized types with a formula here; 0 for any
 * other type. */
static inline FMOE_HD int32_t fmoe__qblock_values(uint32_t type) {
    switch (type) {
    case FMOE_GGML_Q4_0:
    case FMOE_GGML_Q4_1:
    case FMOE_GGML_Q5_0:
    case FMOE_GGML_Q5_1:
    case FMOE_GGML_IQ4_NL:
    case FMOE_GGML_MXFP4:
    case FMOE_GGML_Q8_0: return FMOE_QK8_0;
    case FMOE_GGML_Q2_K:
    case FMOE_GGML_Q3_K:
    case FMOE_GGML_Q4_K:
    case FMOE_GGML_Q5_K:
    case FMOE_GGML_Q6_K:
    case FMOE_GGML_IQ4_XS: return FMOE_QK_K;
    default: return fmoe__is_iq_type(type) ? FMOE_QK_K : 0;
    }
}

static inline FMOE_HD int32_t fmoe__qblock_bytes(uint32_t type) {
    switch (type) {
    case FMOE_GGML_Q8_0: return FMOE_Q8_0_BYTES;
    case FMOE_GGML_Q4_0: return FMOE_Q4_0_BYTES;
    case FMOE_GGML_Q4_1: return FMOE_Q4_1_BYTES;
    case FMOE_GGML_Q5_0: return FMOE_Q5_0_BYTES;
    case FMOE_GGML_Q5_1: return FMOE_Q5_1_BYTES;
    case FMOE_GGML_IQ4_NL: return FMOE_IQ4_NL_BYTES;
    case FMOE_GGML_Q4_K: return FMOE_Q4_K_BYTES;
    case FMOE_GGML_Q5_K: return FMOE_Q5_K_BYTES;
    case FMOE_GGML_Q6_K: return FMOE_Q6_K_BYTES;
    case FMOE_GGML_Q2_K: return FMOE_Q2_K_BYTES;
    case FMOE_GGML_Q3_K: return FMOE_Q3_K_BYTES;
    case FMOE_GGML_IQ4_XS: return FMOE_IQ4_XS_BYTES;
    case FMOE_GGML_MXFP4: return FMOE_MXFP4_BYTES;
    case FMOE_GGML_IQ2_XXS: return FMOE_IQ2_XXS_BYTES;
    case FMOE_GGML_IQ2_XS: return FMOE_IQ2_XS_BYTES;
    case FMOE_GGML_IQ2_S: return FMOE_IQ2_S_BYTES;
    case FMOE_GGML_IQ3_XXS: return FMOE_IQ3_XXS_BYTES;
    case FMOE_GGML_IQ3_S: return FMOE_IQ3_S_BYTES;
    case FMOE_GGML_IQ1_S: return FMOE_IQ1_S_BYTES;
    case FMOE_GGML_IQ1_M: return FMOE_IQ1_M_BYTES;
    default: return 0;
    }
}

/* 1 for the block types the CUDA backend has kernels for (runtime/cuda/cuda_quant.cu's
 * fmoe__cuda_quant_has, and the host's refusal of a model before it runs:
 * runtime/model/backend_types.c): every type with a formula here, the i-quants
 * (lib/quant_iq_block.h) included. All are compiled; none has yet run on a GPU. */
static inline FMOE_HD int fmoe__qblock_cuda_has(uint32_t type) {
    return fmoe__qblock_values(type) != 0;
}

/* The little-endian f16 at p, as f32 (exact). */
static inline FMOE_HD float fmoe__qblock_f16(const uint8_t *p) {
    return fmoe_half_to_float((uint16_t)(p[0] | (p[1] << 8)));
}

/* ---------------------------------------------------------------------------------- */
/* Q8_0: f16 d; int8 q[32]; x = q·d                                                     */
/* ---------------------------------------------------------------------------------- */

/* Values l0..l0+n-1 of the block b (d = its scale) into y[n]. */
static inline FMOE_HD void fmoe__q8_0_values(const uint8_t *b, float d, int l0, int n,
                                             float *y) {
    for (int i = 0; i < n; i++) y[i] = (float)(int8_t)b[2 + l0 + i] * d;
}

/* ---------------------------------------------------------------------------------- */
/* Q4_K, Q5_K: f16 d, dmin; 12 bytes of 6-bit scales and mins for 8 sub-blocks of 32;  */
/* 4-bit values, 32 bytes per pair of sub-blocks (low nibbles: the even one); Q5_K's  */
/* fifth bit of value l of sub-block j is bit j of qh[l].                             */
/* ---------------------------------------------------------------------------------- */

/* The 6-bit scale and min of sub-block j (0..7) of the 12 scale bytes q (ggml's
 * get_scale_min_k4): j < 4 in the low 6 bits of bytes j and j+4; j >= 4 split into a
 * nibble of byte j+4 and the top 2 bits of bytes j-4 and j. */
static inline FMOE_HD void fmoe__scale_min_k4(int j, const uint8_t *q, uint8_t *sc,
                                              uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* Sub-block j's scale d·sc and min dmin·m (each rounded to f32), d and dmin being the
 * block's f16 fields as f32. */
static inline FMOE_HD void fmoe__k4_sub_scale(const uint8_t *b, int j, float d, float dmin,
                                              float *dj, float *mj) {
    uint8_t sc, m;
    fmoe__scale_min_k4(j, b + 4, &sc, &m);
    *dj = d * sc;
    *mj = dmin * m;
}

/* Values l0..l0+n-1 (l0 + n <= 32) of sub-block j of a Q4_K block into y[n]. */
static inline FMOE_HD void fmoe__q4_k_values(const uint8_t *b, int j, int l0, int n, float dj,
                                             float mj, float *y) {
    const uint8_t *q = b + 16 + 32 * (j / 2) + l0;
    const int sh = 4 * (j & 1);
    for (int i = 0; i < n; i++) y[i] = dj * (float)((q[i] >> sh) & 0xF) - mj;
}

/* The same for Q5_K. */
static inline FMOE_HD void fmoe__q5_k_values(const uint8_t *b, int j, int l0, int n, float dj,
                                             float mj, float *y) {
    const uint8_t *qh = b + 16 + l0, *ql = b + 48 + 32 * (j / 2) + l0;
    const int sh = 4 * (j & 1);
    for (int i = 0; i < n; i++)
        y[i] = dj * (float)(((ql[i] >> sh) & 0xF) + ((qh[i] >> j) & 1) * 16) - mj;
}

/* ---------------------------------------------------------------------------------- */
/* Q6_K: ql[128] low 4 bits, qh[64] high 2 bits, int8 scales[16], f16 d; values are    */
/* 6-bit minus 32. Sub-block s (0..15) holds values 16s..16s+15; ggml lays a block out */
/* as two halves of 128, each four quarters g of 32 sharing bytes: quarter g of a half */
/* takes the low (g < 2) or high nibbles of ql[32(g&1) + l] and bits 2g, 2g+1 of qh[l].  */
/* ---------------------------------------------------------------------------------- */

/* Sub-block s's scale d·scales[s] (rounded to f32). */
static inline FMOE_HD float fmoe__q6_k_sub_scale(const uint8_t *b, int s, float d) {
    return d * (float)(int8_t)b[192 + s];
}

/* Values l0..l0+n-1 (l0 + n <= 16) of sub-block s of a Q6_K block into y[n]. */
static inline FMOE_HD void fmoe__q6_k_values(const uint8_t *b, int s, int l0, int n, float ds,
                                             float *y) {
    const int quarter = s / 2, half = quarter / 4, g = quarter % 4, l = 16 * (s & 1) + l0;
    const uint8_t *ql = b + 64 * half + 32 * (g & 1) + l, *qh = b + 128 + 32 * half + l;
    const int sh = 4 * (g >> 1), hs = 2 * g;
    for (int i = 0; i < n; i++) {
        const int q = (((ql[i] >> sh) & 0xF) | (((qh[i] >> hs) & 3) << 4)) - 32;
        y[i] = ds * (float)q;
    }
}

/* ---------------------------------------------------------------------------------- */
/* The 32-value formats of ggml's first generation and IQ4_NL. 16 bytes qs hold the 32  */
/* 4-bit codes: value l < 16 in the low nibble of qs[l], value l >= 16 in the high      */
/* nibble of qs[l - 16]. Q5_0/Q5_1 add a little-endian uint32 qh whose bit l is value   */
/* l's fifth bit. Layouts (offsets of d, m, qh, qs):                                   */
/*   Q4_0   f16 d @0;             qs @2    x = d·(q - 8)                                */
/*   Q4_1   f16 d @0, f16 m @2;   qs @4    x = d·q + m                                  */
/*   Q5_0   f16 d @0; qh @2;      qs @6    x = d·(q - 16)                               */
/*   Q5_1   f16 d @0, m @2; qh @4; qs @8   x = d·q + m                                  */
/*   IQ4_NL f16 d @0;             qs @2    x = d·kvalues[q] (a fixed non-linear grid)   */
/* ---------------------------------------------------------------------------------- */

/* IQ4_NL's 16 levels (ggml-common.h's kvalues_iq4nl): a format constant, not code. */
#define FMOE__IQ4NL_LEVELS {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113}

/* Offset of qs in a block of `type` (one of the five, or MXFP4: its E8M0 scale is one
 * byte), and (Q5_0, Q5_1) of qh. */
static inline FMOE_HD int fmoe__q32_qs_at(uint32_t type) {
    return type == FMOE_GGML_Q5_1   ? 8
           : type == FMOE_GGML_Q5_0 ? 6
           : type == FMOE_GGML_Q4_1 ? 4
           : type == FMOE_GGML_MXFP4 ? 1
                                     : 2;
}
static inline FMOE_HD int fmoe__q32_qh_at(uint32_t type) { return type == FMOE_GGML_Q5_0 ? 2 : 4; }

/* The integer code of value l (0..31) of block b: 0..15 for the 4-bit types, 0..31 for
 * the 5-bit ones (before any offset or grid). */
static inline FMOE_HD int fmoe__q32_code(uint32_t type, const uint8_t *b, int l) {
    const uint8_t byte = b[fmoe__q32_qs_at(type) + (l & 15)];
    int q = l < 16 ? byte & 0xF : byte >> 4;
    if (type == FMOE_GGML_Q5_0 || type == FMOE_GGML_Q5_1) {
        const uint8_t *qh = b + fmoe__q32_qh_at(type);
        q |= ((qh[l >> 3] >> (l & 7)) & 1) << 4;
    }
    return q;
}

/* Values l0..l0+n-1 (l0 + n <= 32) of a block of one of the five types into y[n], in
 * ggml's order of operations: the code (offset removed, or IQ4_NL's level) as f32 times
 * d, then (Q4_1, Q5_1) plus m, two roundings. */
static inline FMOE_HD void fmoe__q32_values(uint32_t type, const uint8_t *b, int l0, int n,
                                            float *y) {
    const int8_t levels[16] = FMOE__IQ4NL_LEVELS;
    const float d = fmoe__qblock_f16(b);
    const int affine = type == FMOE_GGML_Q4_1 || type == FMOE_GGML_Q5_1;
    const float m = affine ? fmoe__qblock_f16(b + 2) : 0.0f;
    const int off = type == FMOE_GGML_Q4_0 ? 8 : type == FMOE_GGML_Q5_0 ? 16 : 0;
    for (int i = 0; i < n; i++) {
        const int q = fmoe__q32_code(type, b, l0 + i);
        if (type == FMOE_GGML_IQ4_NL)
            y[i] = d * (float)levels[q];
        else if (affine)
            y[i] = d * (float)q + m;
        else
            y[i] = d * (float)(q - off);
    }
}

/* ---------------------------------------------------------------------------------- */
/* MXFP4 (OCP Microscaling v1.0, as ggml stores it: block_mxfp4 in ggml-common.h): an  */
/* E8M0 scale byte e @0, then qs[16] @1 laid out as IQ4_NL's: value l < 16 in the low   */
/* nibble of qs[l], value l >= 16 in the high nibble of qs[l - 16]. Each nibble is an  */
/* E2M1 number (sign, 2-bit exponent, 1-bit mantissa); ggml keeps them doubled as the   */
/* integers kvalues_mxfp4 and halves the scale instead: x = kvalues[q] · 2^(e - 128)    */
/* (GGML_E8M0_TO_FP32_HALF; e < 2 gives the subnormal 2^-128 and 2^-127). One product, */
/* one rounding (exact here: a small integer times a power of two).                    */
/* ---------------------------------------------------------------------------------- */

/* MXFP4's 16 levels, doubled E2M1 (ggml-common.h's kvalues_mxfp4): a format constant. */
#define FMOE__MXFP4_LEVELS {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12}

/* Half the value of the E8M0 scale e, 2^(e - 128), as ggml_e8m0_to_fp32_half builds its
 * bits: (e - 1) << 23 for e >= 2 (a normal float), 0x00200000 << e below (subnormal). */
static inline FMOE_HD float fmoe__e8m0_half(uint8_t e) {
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    union {
        uint32_t u;
        float f;
    } v;
    v.u = bits;
    return v.f;
}

/* One block of OpenAI's MXFP4 layout (gpt-oss checkpoints; transformers'
 * integrations/mxfp4.py: 16 bytes, value 2k in the low nibble of byte k and 2k + 1 in its
 * high one) with its E8M0 scale byte, as a ggml block out[17]: the same numbers, the
 * nibbles moved (llama.cpp's converter does this in GptOssModel.repack_mxfp4). */
static inline void fmoe__mxfp4_from_openai(const uint8_t *in, uint8_t scale, uint8_t *out) {
    out[0] = scale;
    for (int l = 0; l < 16; l++) { /* value l from byte l/2, value l + 16 from 8 + l/2 */
        const uint8_t lo = (in[l / 2] >> (4 * (l & 1))) & 0xF;
        const uint8_t hi = (in[8 + l / 2] >> (4 * (l & 1))) & 0xF;
        out[1 + l] = (uint8_t)(lo | hi << 4);
    }
}

/* Values l0..l0+n-1 (l0 + n <= 32) of an MXFP4 block into y[n]. */
static inline FMOE_HD void fmoe__mxfp4_values(const uint8_t *b, int l0, int n, float *y) {
    const int8_t levels[16] = FMOE__MXFP4_LEVELS;
    const float d = fmoe__e8m0_half(b[0]);
    for (int i = 0; i < n; i++) {
        const int l = l0 + i;
        const uint8_t byte = b[1 + (l & 15)];
        y[i] = (float)levels[l < 16 ? byte & 0xF : byte >> 4] * d;
    }
}

/* ---------------------------------------------------------------------------------- */
/* Q2_K, Q3_K, IQ4_XS: 256 values in sixteen sub-blocks of 16 (IQ4_XS: eight of 32,     */
/* seen here as pairs of 16 sharing a scale). Each value is an integer scale times a    */
/* small signed integer code, times the block's f16 d (minus, for Q2_K, dmin times an    */
/* integer min). Layouts (ggml-common.h):                                               */
/*   Q2_K   scales[16] @0 (low nibble scale, high nibble min); qs[64] @16; d @80,       */
/*          dmin @82. Value 128h + 32j + l (l < 32) is bits 2j, 2j+1 of qs[32h + l].     */
/*          x = (d·sc)·q - dmin·m, q in 0..3.                                            */
/*   Q3_K   hmask[32] @0; qs[64] @32; 12 bytes of 6-bit scales @96; d @108. Value        */
/*          128h + 32j + l: low 2 bits as Q2_K's, its third bit is bit 4h + j of         */
/*          hmask[l] and a CLEAR bit subtracts 4: q in -4..3. x = (d·(sc - 32))·q.        */
/*   IQ4_XS d @0; uint16 scales_h @2 (2 high bits per 32); scales_l[4] @4 (a nibble per  */
/*          32); qs[128] @8, 16 bytes per 32 values laid out as IQ4_NL's block.          */
/*          x = (d·(ls - 32))·kvalues[code].                                             */
/* ---------------------------------------------------------------------------------- */

/* 1 for the three types below. */
static inline FMOE_HD int fmoe__is_kx(uint32_t type) {
    return type == FMOE_GGML_Q2_K || type == FMOE_GGML_Q3_K || type == FMOE_GGML_IQ4_XS;
}

/* The integer scale *sc (signed: Q3_K and IQ4_XS store it biased by 32) and integer min
 * *m (Q2_K; 0 otherwise) of sub-block s (0..15: values 16s..16s+15) of block b. */
static inline FMOE_HD void fmoe__kx_scale(uint32_t type, const uint8_t *b, int s, int *sc,
                                          int *m) {
    if (type == FMOE_GGML_Q2_K) {
        *sc = b[s] & 0xF;
        *m = b[s] >> 4;
    } else if (type == FMOE_GGML_Q3_K) {
        /* low nibble: byte s (s < 8) or the high nibble of byte s - 8; the two high bits:
         * bits 2(s/4), 2(s/4)+1 of byte 8 + s%4 */
        const uint8_t *scales = b + 96;
        const int lo = s < 8 ? scales[s] & 0xF : scales[s - 8] >> 4;
        const int hi = (scales[8 + s % 4] >> (2 * (s / 4))) & 3;
        *sc = (lo | (hi << 4)) - 32;
        *m = 0;
    } else { /* IQ4_XS: one scale per 32 values */
        const int ib = s / 2, sh = b[2] | (b[3] << 8);
        const int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) | (((sh >> (2 * ib)) & 3) << 4);
        *sc = ls - 32;
        *m = 0;
    }
}

/* Codes l0..l0+n-1 (l0 + n <= 16) of sub-block s of block b into q[n], signed: Q3_K's
 * offset and IQ4_XS's grid applied. */
static inline FMOE_HD void fmoe__kx_codes(uint32_t type, const uint8_t *b, int s, int l0,
                                          int n, int8_t *q) {
    const int h = s / 8, j = (s % 8) / 2, o = 16 * (s & 1) + l0;
    if (type == FMOE_GGML_Q2_K) {
        const uint8_t *qs = b + 16 + 32 * h + o;
        for (int i = 0; i < n; i++) q[i] = (int8_t)((qs[i] >> (2 * j)) & 3);
    } else if (type == FMOE_GGML_Q3_K) {
        const uint8_t *qs = b + 32 + 32 * h + o, *hm = b + o;
        const int hbit = 4 * h + j;
        for (int i = 0; i < n; i++)
            q[i] = (int8_t)(((qs[i] >> (2 * j)) & 3) - (((hm[i] >> hbit) & 1) ? 0 : 4));
    } else { /* IQ4_XS */
        const int8_t levels[16] = FMOE__IQ4NL_LEVELS;
        const uint8_t *qs = b + 8 + 16 * (s / 2) + l0;
        for (int i = 0; i < n; i++) q[i] = levels[(s & 1) ? qs[i] >> 4 : qs[i] & 0xF];
    }
}

/* Sub-block s of block b: its 16 signed codes q[16], with its scale and min as
 * fmoe__kx_scale gives them. */
static inline FMOE_HD void fmoe__kx_sub(uint32_t type, const uint8_t *b, int s, int8_t *q,
                                        int *sc, int *m) {
    fmoe__kx_codes(type, b, s, 0, 16, q);
    fmoe__kx_scale(type, b, s, sc, m);
}

/* d and (Q2_K) dmin of a block of one of the three. */
static inline FMOE_HD void fmoe__kx_d(uint32_t type, const uint8_t *b, float *d, float *dmin) {
    *d = fmoe__qblock_f16(b + (type == FMOE_GGML_Q2_K ? 80 : type == FMOE_GGML_Q3_K ? 108 : 0));
    *dmin = type == FMOE_GGML_Q2_K ? fmoe__qblock_f16(b + 82) : 0.0f;
}

/* Values l0..l0+n-1 (l0 + n <= 16) of sub-block s of block b (d, dmin: fmoe__kx_d's)
 * into y[n], in ggml's order of operations: d times the integer scale, rounded to f32,
 * times the code, minus dmin times the min (rounded the same way), two roundings as
 * gguf-py's numpy does. */
static inline FMOE_HD void fmoe__kx_sub_values(uint32_t type, const uint8_t *b, int s, int l0,
                                               int n, float d, float dmin, float *y) {
    int8_t q[16];
    int sc, m;
    fmoe__kx_codes(type, b, s, l0, n, q);
    fmoe__kx_scale(type, b, s, &sc, &m);
    const float dl = d * (float)sc, ml = dmin * (float)m;
    for (int i = 0; i < n; i++) y[i] = dl * (float)q[i] - ml;
}

/* The 256 values of a block of one of the three into y. */
static inline FMOE_HD void fmoe__kx_values(uint32_t type, const uint8_t *b, float *y) {
    float d, dmin;
    fmoe__kx_d(type, b, &d, &dmin);
    for (int s = 0; s < 16; s++) fmoe__kx_sub_values(type, b, s, 0, 16, d, dmin, y + 16 * s);
}

/* ---------------------------------------------------------------------------------- */
/* Whole blocks, and groups of 8 values                                                 */
/* ---------------------------------------------------------------------------------- */

/* The fmoe__qblock_values(type) values of block b into y. type must have a formula. */
static inline FMOE_HD void fmoe__qblock_dequant(uint32_t type, const uint8_t *b, float *y) {
    switch (type) {
    case FMOE_GGML_Q8_0:
        fmoe__q8_0_values(b, fmoe__qblock_f16(b), 0, FMOE_QK8_0, y);
        return;
    case FMOE_GGML_Q4_0:
    case FMOE_GGML_Q4_1:
    case FMOE_GGML_Q5_0:
    case FMOE_GGML_Q5_1:
    case FMOE_GGML_IQ4_NL:
        fmoe__q32_values(type, b, 0, FMOE_QK8_0, y);
        return;
    case FMOE_GGML_Q4_K:
    case FMOE_GGML_Q5_K: {
        const float d = fmoe__qblock_f16(b), dmin = fmoe__qblock_f16(b + 2);
        for (int j = 0; j < 8; j++) {
            float dj, mj;
            fmoe__k4_sub_scale(b, j, d, dmin, &dj, &mj);
            if (type == FMOE_GGML_Q4_K)
                fmoe__q4_k_values(b, j, 0, 32, dj, mj, y + 32 * j);
            else
                fmoe__q5_k_values(b, j, 0, 32, dj, mj, y + 32 * j);
        }
        return;
    }
    case FMOE_GGML_Q6_K: {
        const float d = fmoe__qblock_f16(b + 208);
        for (int s = 0; s < 16; s++)
            fmoe__q6_k_values(b, s, 0, 16, fmoe__q6_k_sub_scale(b, s, d), y + 16 * s);
        return;
    }
    case FMOE_GGML_Q2_K:
    case FMOE_GGML_Q3_K:
    case FMOE_GGML_IQ4_XS:
        fmoe__kx_values(type, b, y);
        return;
    case FMOE_GGML_MXFP4:
        fmoe__mxfp4_values(b, 0, FMOE_QK8_0, y);
        return;
    default: /* the i-quants (the CPU's own path is lib/quant_iq.c) */
        if (fmoe__is_iq_type(type))
            for (int k = 0; k < FMOE_QK_K / 8; k++) fmoe__iq_group8(type, b, k, y + 8 * k);
        return;
    }
}

/* Values 8k..8k+7 of block b into y[8], k < fmoe__qblock_values(type) / 8. With type a
 * compile-time constant (the CUDA kernels' template parameter) the switch folds away. */
static inline FMOE_HD void fmoe__qblock_dequant8(uint32_t type, const uint8_t *b, int k,
                                                 float *y) {
    switch (type) {
    case FMOE_GGML_Q8_0:
        fmoe__q8_0_values(b, fmoe__qblock_f16(b), 8 * k, 8, y);
        return;
    case FMOE_GGML_Q4_0:
    case FMOE_GGML_Q4_1:
    case FMOE_GGML_Q5_0:
    case FMOE_GGML_Q5_1:
    case FMOE_GGML_IQ4_NL:
        fmoe__q32_values(type, b, 8 * k, 8, y);
        return;
    case FMOE_GGML_MXFP4:
        fmoe__mxfp4_values(b, 8 * k, 8, y);
        return;
    case FMOE_GGML_Q4_K:
    case FMOE_GGML_Q5_K: {
        const int j = k / 4;
        float dj, mj;
        fmoe__k4_sub_scale(b, j, fmoe__qblock_f16(b), fmoe__qblock_f16(b + 2), &dj, &mj);
        if (type == FMOE_GGML_Q4_K)
            fmoe__q4_k_values(b, j, 8 * (k % 4), 8, dj, mj, y);
        else
            fmoe__q5_k_values(b, j, 8 * (k % 4), 8, dj, mj, y);
        return;
    }
    case FMOE_GGML_Q6_K: {
        const int s = k / 2;
        fmoe__q6_k_values(b, s, 8 * (k % 2), 8,
                          fmoe__q6_k_sub_scale(b, s, fmoe__qblock_f16(b + 208)), y);
        return;
    }
    case FMOE_GGML_Q2_K:
    case FMOE_GGML_Q3_K:
    case FMOE_GGML_IQ4_XS: {
        float d, dmin;
        fmoe__kx_d(type, b, &d, &dmin);
        fmoe__kx_sub_values(type, b, k / 2, 8 * (k % 2), 8, d, dmin, y);
        return;
    }
    default:
        fmoe__iq_group8(type, b, k, y); /* the i-quants; nothing for any other type */
        return;
    }
}

#endif
