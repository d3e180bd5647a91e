/*
 * quant_ref32.c - f32 values to one block of the 32-value formats Q4_0, Q4_1, Q5_0, Q5_1
 * and IQ4_NL, and of IQ4_XS (IQ4_NL's grid in 256-value super-blocks), for `fmoe quantize`
 * (lib/quant_ref.c's fmoe_quant_quantize_row calls it).
 *
 * Q4_0 .. Q5_1 are ggml's reference quantisers (quantize_row_q4_0_ref ... q5_1_ref),
 * written out again: the scale from the block's extremes, each code truncated after
 * adding one half (and the offset), then clamped. gguf-py's gguf.quants.quantize does the
 * same f32 operations, and tests/python/test_gguf_quants.py checks ours against it byte
 * for byte.
 *
 * IQ4_NL is NOT ggml's quantiser. ggml searches a per-block scale (quantize_row_iq4_nl_ref:
 * a least-squares refit tried at several scales around max/-127, with an importance
 * matrix when given). Ours is simpler and documented as such (docs/quantization.md):
 * d0 = max/-127 (the value of largest magnitude lands on the grid's end, sign kept), every
 * value to its nearest level, then one least-squares refit d = Σ x·v / Σ v² with the
 * levels reassigned, kept only where it lowers the squared error. Its blocks can differ
 * from llama-quantize's; any reader dequantises them the same way, which is what must
 * match (and does: the same test, against gguf-py's dequantiser).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "half.h"
#include "fmoe/quant.h"
#include "quant_impl.h"

/* The value of largest magnitude, its sign kept (the first of equals, as ggml's strict >). */
static float signed_max(const float *x) {
    float amax = 0, max = 0;
    for (int i = 0; i < 32; i++)
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            max = x[i];
        }
    return max;
}

/* Codes q[32] packed as the block stores them: value l < 16 in the low nibble of qs[l],
 * l >= 16 in the high nibble of qs[l - 16]; with qh (5-bit types) bit l = q[l]'s bit 4. */
static void pack(const uint8_t *q, uint8_t *qs, uint8_t *qh) {
    uint32_t h = 0;
    for (int l = 0; l < 16; l++) qs[l] = (uint8_t)((q[l] & 0xF) | ((q[l + 16] & 0xF) << 4));
    for (int l = 0; l < 32; l++) h |= (uint32_t)((q[l] >> 4) & 1) << l;
    if (qh)
        for (int k = 0; k < 4; k++) qh[k] = (uint8_t)(h >> (8 * k));
}

/* ggml's code: v (the scaled value plus the offset and one half) truncated, at most
 * levels - 1. v is in [0, levels + 0.5] for finite blocks; clamping in float first keeps
 * the conversion defined for what else can come (NaN, or infinity where 1/d overflows
 * for a subnormal d), whose blocks are unspecified. */
static uint8_t code(float v, int levels) {
    if (!(v >= 0.0f)) return 0;
    if (v >= (float)(levels - 1)) return (uint8_t)(levels - 1);
    return (uint8_t)(int)v;
}

/* Q4_0 (levels 16, offset 8) and Q5_0 (32, 16): d = max / -offset, so the extreme value
 * maps to code 0; q = min(levels - 1, trunc(x/d + offset + 0.5)). */
static void quantize_sym(const float *x, uint8_t *b, int levels) {
    const int off = levels / 2;
    const float d = signed_max(x) / (float)-off;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    uint8_t q[32];
    for (int l = 0; l < 32; l++) q[l] = code(x[l] * id + ((float)off + 0.5f), levels);
    fmoe__put_f16(b, d);
    if (levels == 16)
        pack(q, b + 2, NULL);
    else
        pack(q, b + 6, b + 2);
}

/* Q4_1 (16 levels) and Q5_1 (32): d = (max - min) / (levels - 1), m = min,
 * q = min(levels - 1, trunc((x - min)/d + 0.5)). */
static void quantize_affine(const float *x, uint8_t *b, int levels) {
    float min = x[0], max = x[0];
    for (int l = 1; l < 32; l++) {
        if (x[l] < min) min = x[l];
        if (x[l] > max) max = x[l];
    }
    const float d = (max - min) / (float)(levels - 1);
    const float id = d != 0 ? 1.0f / d : 0.0f;
    uint8_t q[32];
    for (int l = 0; l < 32; l++) q[l] = code((x[l] - min) * id + 0.5f, levels);
    fmoe__put_f16(b, d);
    fmoe__put_f16(b + 2, min);
    if (levels == 16)
        pack(q, b + 4, NULL);
    else
        pack(q, b + 8, b + 4);
}

/* IQ4_NL: the nearest of the 16 levels to v (in units of the scale). */
static int nearest_level(const int8_t *levels, float v) {
    int best = 0;
    float err = fabsf(v - levels[0]);
    for (int k = 1; k < 16; k++)
        if (fabsf(v - levels[k]) < err) {
            err = fabsf(v - levels[k]);
            best = k;
        }
    return best;
}

/* Codes for scale d, and their squared error against x. */
static float assign_iq4(const int8_t *levels, const float *x, float d, uint8_t *q) {
    const float id = d != 0 ? 1.0f / d : 0.0f;
    float err = 0;
    for (int l = 0; l < 32; l++) {
        q[l] = (uint8_t)nearest_level(levels, x[l] * id);
        const float e = x[l] - d * (float)levels[q[l]];
        err += e * e;
    }
    return err;
}

/* IQ4_NL's scale for x[32] and its codes q[32]: d0 = max/-127, then the least-squares
 * refit where it lowers the squared error. */
static float iq4_search(const int8_t *levels, const float *x, uint8_t *q) {
    float d = signed_max(x) / (float)levels[0];
    uint8_t q2[32];
    float err = assign_iq4(levels, x, d, q);
    double sxv = 0, svv = 0; /* the least-squares scale for these codes */
    for (int l = 0; l < 32; l++) {
        sxv += (double)x[l] * levels[q[l]];
        svv += (double)levels[q[l]] * levels[q[l]];
    }
    if (svv > 0) {
        const float d2 = (float)(sxv / svv);
        const float err2 = assign_iq4(levels, x, d2, q2);
        if (err2 < err) {
            d = d2;
            memcpy(q, q2, sizeof q2);
        }
    }
    return d;
}

static void quantize_iq4_nl(const float *x, uint8_t *b) {
    const int8_t levels[16] = FMOE__IQ4NL_LEVELS;
    uint8_t q[32];
    const float d = iq4_search(levels, x, q);
    /* the block stores d as f16: the codes were chosen for the f32 d, which is what ggml
     * does too (its search is in f32 and rounds d on store) */
    fmoe__put_f16(b, d);
    pack(q, b + 2, NULL);
}

/* IQ4_XS: eight 32-value sub-blocks of IQ4_NL's grid under one f16 d and 6-bit signed
 * scales. Each sub-block's own scale comes from IQ4_NL's search above (not ggml's
 * quantize_iq4_xs search, which tries more scales: ours is simpler, as IQ4_NL's is);
 * then, as ggml does, d = -max/32 for the scale of largest magnitude (so it lands on
 * -32, the 6-bit range's longer end), each scale rounded to d's steps, and the codes
 * reassigned against the scale the reader will compute from the stored f16 d. */
void fmoe__quantize_iq4_xs_block(const float *x, uint8_t *b) {
    const int8_t levels[16] = FMOE__IQ4NL_LEVELS;
    float scales[8], max = 0, amax = 0;
    uint8_t q[32];
    for (int ib = 0; ib < 8; ib++) {
        scales[ib] = iq4_search(levels, x + 32 * ib, q);
        if (fabsf(scales[ib]) > amax) {
            amax = fabsf(scales[ib]);
            max = scales[ib];
        }
    }
    memset(b, 0, FMOE_IQ4_XS_BYTES);
    fmoe__put_f16(b, -max / 32);
    const float d = fmoe__qblock_f16(b);
    const float id = d != 0 ? 1.0f / d : 0.0f;
    uint16_t sh = 0;
    for (int ib = 0; ib < 8; ib++) {
        int l = fmoe__nearest_int(id * scales[ib]);
        l = l < -32 ? -32 : l > 31 ? 31 : l;
        const int ls = l + 32;
        b[4 + ib / 2] |= (uint8_t)((ls & 0xF) << (4 * (ib % 2)));
        sh |= (uint16_t)((ls >> 4) << (2 * ib));
        assign_iq4(levels, x + 32 * ib, d * (float)l, q);
        pack(q, b + 8 + 16 * ib, NULL);
    }
    b[2] = (uint8_t)sh;
    b[3] = (uint8_t)(sh >> 8);
}

void fmoe__quantize_q32_block(uint32_t t, const float *x, uint8_t *b) {
    switch (t) {
    case FMOE_GGML_Q4_0: quantize_sym(x, b, 16); return;
    case FMOE_GGML_Q5_0: quantize_sym(x, b, 32); return;
    case FMOE_GGML_Q4_1: quantize_affine(x, b, 16); return;
    case FMOE_GGML_Q5_1: quantize_affine(x, b, 32); return;
    case FMOE_GGML_IQ4_NL: quantize_iq4_nl(x, b); return;
    default: return;
    }
}
