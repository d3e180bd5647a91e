/*
 * fp8_block.c - FP8 e4m3 block-scaled weights dequantised on load (fp8_block.h).
 *
 * Why on load: fmoe's kernels read F32/F16/BF16 rows and ggml's block types; a block of
 * 128x128 values sharing one scale is none of those (ggml's blocks run along one row). A
 * model loaded from FP8 files holds its weights as BF16 (what DeepSeek's own
 * weight_dequant produces), twice the FP8 bytes; `fmoe quantize` reads the same files and
 * writes any GGUF type from the exact values, which is the way to run V3/R1 offloaded.
 */
#include "fp8_block.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "fmoe/error.h"
#include "half.h"

/* OCP 8-bit Floating Point Specification (OFP8) rev 1.0, section 5.3, E4M3: exponent bias
 * 7; exponent field 0 is subnormal, m/8 · 2^-6; S.1111.111 is NaN and S.1111.000-110 are
 * normal numbers (up to ±448), so there is no infinity. */
float fmoe__fp8_e4m3_to_float(uint8_t code) {
    const int sign = code >> 7, exp = (code >> 3) & 15, man = code & 7;
    float v;
    if (exp == 15 && man == 7)
        v = NAN;
    else if (exp == 0)
        v = ldexpf((float)man, -9); /* m/8 · 2^(1-7) */
    else
        v = ldexpf((float)(8 + man), exp - 10); /* (1 + m/8) · 2^(e-7) */
    return sign ? -v : v;
}

int fmoe__fp8_block_size(const char *config_json, size_t len, int64_t *bm, int64_t *bn) {
    *bm = *bn = 128;
    cJSON *root = cJSON_ParseWithLength(config_json, len);
    FMOE_RETURN_ERROR_IF(!root, FMOE_EFORMAT, "config.json: malformed JSON");
    int rc = 0;
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(root, "quantization_config");
    if (cJSON_IsObject(q)) {
        const cJSON *method = cJSON_GetObjectItemCaseSensitive(q, "quant_method");
        const cJSON *bs = cJSON_GetObjectItemCaseSensitive(q, "weight_block_size");
        if (cJSON_IsString(method) && strcmp(method->valuestring, "fp8") != 0) {
            rc = fmoe_error_set(FMOE_EUNSUPPORTED,
                                "config.json: quantization_config.quant_method \"%.32s\" with "
                                "F8_E4M3 tensors (fmoe reads fp8 block scales)",
                                method->valuestring);
        } else if (bs) {
            const cJSON *a = cJSON_GetArrayItem(bs, 0), *b = cJSON_GetArrayItem(bs, 1);
            if (!cJSON_IsArray(bs) || cJSON_GetArraySize(bs) != 2 || !cJSON_IsNumber(a) ||
                !cJSON_IsNumber(b) || a->valuedouble < 1 || b->valuedouble < 1 ||
                a->valuedouble > 1 << 20 || b->valuedouble > 1 << 20 ||
                a->valuedouble != floor(a->valuedouble) ||
                b->valuedouble != floor(b->valuedouble))
                rc = fmoe_error_set(FMOE_EFORMAT,
                                    "config.json: quantization_config.weight_block_size must "
                                    "be two positive integers [rows, cols]");
            else
                *bm = (int64_t)a->valuedouble, *bn = (int64_t)b->valuedouble;
        }
    }
    cJSON_Delete(root);
    return rc;
}

/* Element i of a float tensor (F32, F16 or BF16). */
static float scale_at(const fmoe_st_tensor *s, int64_t i) {
    const uint8_t *p = s->data;
    if (s->dtype == FMOE_ST_F32) {
        float v;
        memcpy(&v, p + 4 * i, 4);
        return v;
    }
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    return s->dtype == FMOE_ST_F16 ? fmoe_half_to_float(h) : fmoe_bf16_to_float(h);
}

int fmoe__fp8_dequantize(const fmoe_safetensors *st, const fmoe_st_tensor *w, int64_t bm,
                         int64_t bn, fmoe_st_dtype out_dtype, void *out) {
    FMOE_RETURN_ERROR_IF(w->dtype != FMOE_ST_F8_E4M3 || w->ndim != 2, FMOE_EUNSUPPORTED,
                         "%s: tensor %s: dtype %s with %d dimensions (FP8 weights are 2-D "
                         "F8_E4M3)",
                         w->file, w->name, fmoe_st_dtype_name(w->dtype), w->ndim);
    FMOE_RETURN_ERROR_IF(out_dtype != FMOE_ST_F32 && out_dtype != FMOE_ST_BF16, FMOE_EINVAL,
                         "fp8: output dtype %s", fmoe_st_dtype_name(out_dtype));
    const int64_t rows = w->shape[0], cols = w->shape[1];
    const int64_t br = (rows + bm - 1) / bm, bc = (cols + bn - 1) / bn;
    char name[300];
    snprintf(name, sizeof name, "%s_scale_inv", w->name);
    const fmoe_st_tensor *s = fmoe_safetensors_find(st, name);
    FMOE_RETURN_ERROR_IF(!s, FMOE_ENOTFOUND,
                         "%s: tensor %s is F8_E4M3 but its block scales %s are missing",
                         w->file, w->name, name);
    FMOE_RETURN_ERROR_IF(s->dtype != FMOE_ST_F32 && s->dtype != FMOE_ST_BF16 &&
                             s->dtype != FMOE_ST_F16,
                         FMOE_EFORMAT, "%s: tensor %s has dtype %s (block scales are F32)",
                         s->file, name, fmoe_st_dtype_name(s->dtype));
    FMOE_RETURN_ERROR_IF(s->ndim != 2, FMOE_EMISMATCH,
                         "%s: tensor %s has %d dimensions, expected 2: [%lld,%lld], one "
                         "scale per %lldx%lld block of %s [%lld,%lld]",
                         s->file, name, s->ndim, (long long)br, (long long)bc, (long long)bm,
                         (long long)bn, w->name, (long long)rows, (long long)cols);
    FMOE_RETURN_ERROR_IF(s->shape[0] != br || s->shape[1] != bc, FMOE_EMISMATCH,
                         "%s: tensor %s has shape [%lld,%lld], expected [%lld,%lld]: one "
                         "scale per %lldx%lld block of %s [%lld,%lld]",
                         s->file, name, (long long)s->shape[0], (long long)s->shape[1],
                         (long long)br, (long long)bc, (long long)bm, (long long)bn, w->name,
                         (long long)rows, (long long)cols);
    for (int64_t i = 0; i < br * bc; i++) {
        const float v = scale_at(s, i);
        FMOE_RETURN_ERROR_IF(!isfinite(v), FMOE_EFORMAT,
                             "%s: tensor %s, block [%lld,%lld] is %g: a non-finite scale",
                             s->file, name, (long long)(i / bc), (long long)(i % bc),
                             (double)v);
    }
    float lut[256];
    for (int c = 0; c < 256; c++) lut[c] = fmoe__fp8_e4m3_to_float((uint8_t)c);
    const uint8_t *q = w->data;
    float *of = out;
    uint16_t *ob = out;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t c = 0; c < cols; c++) {
            const uint8_t code = q[r * cols + c];
            /* a NaN would poison every block it is summed with; refuse it by name */
            FMOE_RETURN_ERROR_IF((code & 0x7f) == 0x7f, FMOE_EFORMAT,
                                 "%s: tensor %s, row %lld, column %lld holds the FP8 NaN code "
                                 "0x%02x",
                                 w->file, w->name, (long long)r, (long long)c, code);
            const float v = lut[code] * scale_at(s, (r / bm) * bc + c / bn);
            if (out_dtype == FMOE_ST_F32)
                of[r * cols + c] = v;
            else
                ob[r * cols + c] = fmoe_float_to_bf16(v);
        }
    }
    return 0;
}
