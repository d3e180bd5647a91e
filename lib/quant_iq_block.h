/*
 * quant_iq_block.h - the i-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M)
 * 8 values at a time, as plain C for host and device (FMOE_HD): what one CUDA thread
 * computes (lib/quant_block.h's fmoe__qblock_dequant8 calls fmoe__iq_group8). Internal.
 *
 * The CPU unpacks whole blocks with byte tricks (lib/quant_iq.c, whose design comment
 * gives the formats and the value formula). This is a second, value-by-value reading of
 * the same layouts, written from ggml's dequantize_row_iq* loops: group k (values
 * 8k..8k+7) is one grid point (two 4-value points for IQ3), its sign bits and its
 * sub-block's scale. Each value is computed as the CPU computes it, (d'·sc)·q rounded
 * twice, with d' the f16 d times 1/8 (IQ2, IQ1), 1/4 (IQ3_XXS) or 1 (IQ3_S), sc = 2ls + 1
 * and q the signed grid value (IQ1: 8g ± 1), so both agree bit for bit;
 * tests/lib/test_quant_block.c checks every group against fmoe_quant_dequantize_row.
 *
 * The grids: on the host lib/iq_grids.c's tables; under nvcc each translation unit gets
 * device copies defined here from the same generated initializers
 * (lib/iq_grids_data.h), so there is no second copy of the numbers to keep in step and
 * no initialisation to run. 33 KiB of global memory per translation unit that uses them.
 */
#ifndef FMOE_QUANT_IQ_BLOCK_H
#define FMOE_QUANT_IQ_BLOCK_H

#include <stdint.h>

#include "fmoe/elementwise.h" /* FMOE_HD */
#include "fmoe/quant.h"
#include "half.h"
#include "iq_grids.h"

#if defined(__CUDACC__)
#include "iq_grids_data.h"
static __device__ const uint64_t fmoe__iq2xxs_grid_dev[256] = FMOE__IQ2XXS_GRID_DATA;
static __device__ const uint64_t fmoe__iq2xs_grid_dev[512] = FMOE__IQ2XS_GRID_DATA;
static __device__ const uint64_t fmoe__iq2s_grid_dev[1024] = FMOE__IQ2S_GRID_DATA;
static __device__ const uint32_t fmoe__iq3xxs_grid_dev[256] = FMOE__IQ3XXS_GRID_DATA;
static __device__ const uint32_t fmoe__iq3s_grid_dev[512] = FMOE__IQ3S_GRID_DATA;
static __device__ const uint64_t fmoe__iq1s_grid_dev[2048] = FMOE__IQ1S_GRID_DATA;
#endif

/* Entry i of grid `name` (fmoe__iq2xxs_grid ...): the device copy in device code. */
#if defined(__CUDA_ARCH__)
#define FMOE__IQ_GRID(name, i) (name##_dev[i])
#else
#define FMOE__IQ_GRID(name, i) (name[i])
#endif

/* 1 for the seven i-quants. */
static inline FMOE_HD int fmoe__is_iq_type(uint32_t type) {
    return type == FMOE_GGML_IQ2_XXS || type == FMOE_GGML_IQ2_XS || type == FMOE_GGML_IQ2_S ||
           type == FMOE_GGML_IQ3_XXS || type == FMOE_GGML_IQ3_S || type == FMOE_GGML_IQ1_S ||
           type == FMOE_GGML_IQ1_M;
}

static inline FMOE_HD uint32_t fmoe__iq_le16(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8);
}
static inline FMOE_HD uint32_t fmoe__iq_le32(const uint8_t *p) {
    return fmoe__iq_le16(p) | (fmoe__iq_le16(p + 2) << 16);
}

/* ggml's ksigns_iq2xs: 7 stored sign bits and an eighth making the count of set bits
 * even; bit j set: value j negative. */
static inline FMOE_HD uint32_t fmoe__iq_ksigns(uint32_t seven) {
    seven &= 127;
    uint32_t p = seven ^ (seven >> 4);
    p ^= p >> 2;
    p ^= p >> 1;
    return seven | ((p & 1) << 7);
}

/* The block's d' (see above) as f32. */
static inline FMOE_HD float fmoe__iq_dprime(uint32_t type, const uint8_t *b) {
    if (type == FMOE_GGML_IQ1_M) { /* the top nibbles of the four scale words, lowest first */
        const uint8_t *sc = b + 48;
        const uint32_t bits =
            (fmoe__iq_le16(sc) >> 12) | ((fmoe__iq_le16(sc + 2) >> 8) & 0x00F0) |
            ((fmoe__iq_le16(sc + 4) >> 4) & 0x0F00) | (fmoe__iq_le16(sc + 6) & 0xF000);
        return fmoe_half_to_float((uint16_t)bits) * 0.125f;
    }
    const float d = fmoe_half_to_float((uint16_t)fmoe__iq_le16(b));
    return type == FMOE_GGML_IQ3_S ? d : type == FMOE_GGML_IQ3_XXS ? d * 0.25f : d * 0.125f;
}

/* Values 8k..8k+7 (k < 32) of i-quant block b into y[8]. */
static inline FMOE_HD void fmoe__iq_group8(uint32_t type, const uint8_t *b, int k, float *y) {
    const int ib = k / 4, l = k % 4, s = k / 2; /* 32-value group, point in it, sub-block */
    int8_t q[8];
    int sc = 1;
    uint32_t signs = 0;
    uint64_t point = 0; /* 8 grid bytes, value j in byte j */
    int iq1_minus = 0;
    switch (type) {
    case FMOE_GGML_IQ2_XXS: { /* per 32 values: 4 index bytes, a uint32 of 4x7 signs + ls */
        const uint32_t aux = fmoe__iq_le32(b + 2 + 8 * ib + 4);
        point = FMOE__IQ_GRID(fmoe__iq2xxs_grid, b[2 + 8 * ib + l]);
        signs = fmoe__iq_ksigns(aux >> (7 * l));
        sc = 2 * (int)(aux >> 28) + 1;
        break;
    }
    case FMOE_GGML_IQ2_XS: { /* per 8 values a uint16: 9-bit index, 7 signs; ls per 16 */
        const uint32_t v = fmoe__iq_le16(b + 2 + 2 * k);
        point = FMOE__IQ_GRID(fmoe__iq2xs_grid, v & 511);
        signs = fmoe__iq_ksigns(v >> 9);
        sc = 2 * ((b[66 + s / 2] >> (4 * (s & 1))) & 0xF) + 1;
        break;
    }
    case FMOE_GGML_IQ2_S: { /* index low byte qs[k], top 2 bits in qh; 8 plain signs */
        const int idx = b[2 + k] | (((b[66 + k / 4] >> (2 * (k % 4))) & 3) << 8);
        point = FMOE__IQ_GRID(fmoe__iq2s_grid, idx);
        signs = b[34 + k];
        sc = 2 * ((b[74 + s / 2] >> (4 * (s & 1))) & 0xF) + 1;
        break;
    }
    case FMOE_GGML_IQ3_XXS: { /* two index bytes; the sign words after the 64 index bytes */
        const uint32_t aux = fmoe__iq_le32(b + 66 + 4 * ib);
        const uint8_t *qs = b + 2 + 8 * ib + 2 * l;
        point = (uint64_t)FMOE__IQ_GRID(fmoe__iq3xxs_grid, qs[0]) |
                ((uint64_t)FMOE__IQ_GRID(fmoe__iq3xxs_grid, qs[1]) << 32);
        signs = fmoe__iq_ksigns(aux >> (7 * l));
        sc = 2 * (int)(aux >> 28) + 1;
        break;
    }
    case FMOE_GGML_IQ3_S: { /* two 9-bit indices: qs[2k + i], bit (2k + i) % 8 of qh */
        const int k2 = 2 * k, hb = b[66 + k2 / 8];
        const int lo = b[2 + k2] | (((hb >> (k2 % 8)) & 1) << 8);
        const int hi = b[2 + k2 + 1] | (((hb >> (k2 % 8 + 1)) & 1) << 8);
        point = (uint64_t)FMOE__IQ_GRID(fmoe__iq3s_grid, lo) |
                ((uint64_t)FMOE__IQ_GRID(fmoe__iq3s_grid, hi) << 32);
        signs = b[74 + k];
        sc = 2 * ((b[106 + ib / 2] >> (4 * (ib & 1))) & 0xF) + 1;
        break;
    }
    case FMOE_GGML_IQ1_S: { /* per 32 values a uint16 qh: 4 index tops, ls, delta's sign */
        const uint32_t qh = fmoe__iq_le16(b + 34 + 2 * ib);
        point = FMOE__IQ_GRID(fmoe__iq1s_grid, b[2 + 4 * ib + l] | (((qh >> (3 * l)) & 7) << 8));
        iq1_minus = (qh & 0x8000) != 0;
        sc = 2 * (int)((qh >> 12) & 7) + 1;
        break;
    }
    case FMOE_GGML_IQ1_M: { /* a nibble of qh per 8 values: index top, delta's sign */
        const int nib = (b[32 + k / 2] >> (4 * (k & 1))) & 0xF;
        point = FMOE__IQ_GRID(fmoe__iq1s_grid, b[k] | ((nib & 7) << 8));
        iq1_minus = (nib & 8) != 0;
        sc = 2 * (int)((fmoe__iq_le16(b + 48 + 2 * (s / 4)) >> (3 * (s % 4))) & 7) + 1;
        break;
    }
    default: return;
    }
    const int iq1 = type == FMOE_GGML_IQ1_S || type == FMOE_GGML_IQ1_M;
    for (int j = 0; j < 8; j++) {
        const int g = (int8_t)(uint8_t)(point >> (8 * j));
        q[j] = (int8_t)(iq1 ? 8 * g + (iq1_minus ? -1 : 1) : ((signs >> j) & 1) ? -g : g);
    }
    const float dl = fmoe__iq_dprime(type, b) * (float)sc;
    for (int j = 0; j < 8; j++) y[j] = dl * (float)q[j];
}

#endif
