/*
 * fp8_block.h - FP8 (e4m3) weights with 128x128 block scales, as DeepSeek-V3/R1's and
 * GLM-4.5-FP8's official safetensors store them (internal to runtime/model).
 *
 * A linear weight W [rows][cols] is stored as dtype F8_E4M3 beside a tensor named
 * W's name + "_scale_inv" [ceil(rows/bm)][ceil(cols/bn)] (float32), one scale per block of
 * bm x bn values, the last block row and column cut short where rows or cols are not whole
 * blocks; config.json's quantization_config says {"quant_method": "fp8",
 * "weight_block_size": [bm, bn]}. The real value is fp8 · scale_inv (DeepSeek-V3's
 * inference/kernel.py weight_dequant; transformers' integrations/finegrained_fp8.py).
 */
#ifndef FMOE_FP8_BLOCK_H
#define FMOE_FP8_BLOCK_H

#include <stddef.h>
#include <stdint.h>

#include "fmoe/safetensors.h"

/* The value of an e4m3 code (OCP 8-bit floating point, E4M3 "fn": bias 7, no infinities,
 * S.1111.111 the only NaNs); NAN for those two codes. */
float fmoe__fp8_e4m3_to_float(uint8_t code);

/* quantization_config.weight_block_size of config.json text (bm, bn); 128 x 128 when the
 * config names none. @return 0, or FMOE_EFORMAT / FMOE_EUNSUPPORTED naming the key (a
 * quant_method other than fp8, a block size that is not two positive integers). */
int fmoe__fp8_block_size(const char *config_json, size_t len, int64_t *bm, int64_t *bn);

/*
 * Dequantises the F8_E4M3 matrix `w` [rows][cols] of `st` with its block scales into `out`:
 * rows·cols values of `out_dtype` (FMOE_ST_F32, or FMOE_ST_BF16 rounded to nearest even),
 * each fp8 · scale_inv computed in float32.
 * @return 0, or a one-line error naming the tensor: FMOE_ENOTFOUND (no W_scale_inv),
 * FMOE_EMISMATCH (a scale tensor of the wrong shape), FMOE_EFORMAT (a NaN code, with its row
 * and column; a non-finite or non-float scale), FMOE_EUNSUPPORTED (w not 2-D F8_E4M3).
 */
int fmoe__fp8_dequantize(const fmoe_safetensors *st, const fmoe_st_tensor *w, int64_t bm,
                         int64_t bn, fmoe_st_dtype out_dtype, void *out);

#endif
