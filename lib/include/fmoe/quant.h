/*
 * fmoe/quant.h - ggml's tensor types: their block geometry, and for the twenty-three fmoe
 * computes with (F32, F16, BF16, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, the 32-value
 * Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4, and the codebook i-quants IQ2_XXS, IQ2_XS, IQ2_S,
 * IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) rows dequantised to f32, dot products of a row with an f32
 * vector, and (for every block type of them but MXFP4; IQ2_XXS, IQ2_XS, IQ1_S and IQ1_M
 * only with an importance matrix, as llama.cpp) rows quantised from f32.
 *
 *     if (!fmoe_quant_supported(t->type)) refuse(fmoe_ggml_type_name(t->type));
 *     float y = fmoe_quant_dot(t->type, row, x, n);         // one output of W·x
 *     fmoe_quant_dequantize_row(t->type, row, buf, n);      // or the whole row as f32
 *
 * A row of n values is n / block_size blocks of type_size bytes each (ggml's layout, which
 * GGUF files store as is; docs/quantization.md lists the types). The block formats are
 * those of ggml (ggml-common.h): the byte layout has to match theirs bit for bit, since
 * the point is reading the files llama.cpp users have. Dequantisation computes in the same
 * order as ggml's reference code, so it equals gguf-py's gguf.quants.dequantize exactly
 * (tests/python/test_gguf_quants.py and, for the i-quants, test_gguf_iquants.py check
 * every type).
 *
 * Dot kernels: a plain-C reference (fmoe_quant_dot_ref) and an AVX2+FMA path chosen at run
 * time when the CPU has it (fmoe_quant_dot). Both sum in f32 in their own order, so they
 * differ from dequantise-then-dot by rounding only; tests/lib/test_quant.c bounds it.
 *
 * Thread safety: every function is pure (no state but the one-time CPU feature probe).
 */
#ifndef FMOE_QUANT_H
#define FMOE_QUANT_H

#include <stdint.h>

/* ggml_type numbers, as stored in GGUF tensor infos. Explicit values: they are a format. */
typedef enum fmoe_ggml_type {
    FMOE_GGML_F32 = 0,
    FMOE_GGML_F16 = 1,
    FMOE_GGML_Q4_0 = 2,
    FMOE_GGML_Q4_1 = 3,
    FMOE_GGML_Q5_0 = 6,
    FMOE_GGML_Q5_1 = 7,
    FMOE_GGML_Q8_0 = 8,
    FMOE_GGML_Q8_1 = 9,
    FMOE_GGML_Q2_K = 10,
    FMOE_GGML_Q3_K = 11,
    FMOE_GGML_Q4_K = 12,
    FMOE_GGML_Q5_K = 13,
    FMOE_GGML_Q6_K = 14,
    FMOE_GGML_Q8_K = 15,
    FMOE_GGML_IQ2_XXS = 16,
    FMOE_GGML_IQ2_XS = 17,
    FMOE_GGML_IQ3_XXS = 18,
    FMOE_GGML_IQ1_S = 19,
    FMOE_GGML_IQ4_NL = 20,
    FMOE_GGML_IQ3_S = 21,
    FMOE_GGML_IQ2_S = 22,
    FMOE_GGML_IQ4_XS = 23,
    FMOE_GGML_I8 = 24,
    FMOE_GGML_I16 = 25,
    FMOE_GGML_I32 = 26,
    FMOE_GGML_I64 = 27,
    FMOE_GGML_F64 = 28,
    FMOE_GGML_IQ1_M = 29,
    FMOE_GGML_BF16 = 30,
    FMOE_GGML_TQ1_0 = 34,
    FMOE_GGML_TQ2_0 = 35,
    FMOE_GGML_MXFP4 = 39,
    FMOE_GGML_TYPE_END = 40, /* every known number is below this */
} fmoe_ggml_type;

#define FMOE_QK_K 256 /* values per K-quant super-block */
#define FMOE_QK8_0 32 /* values per Q8_0 block */

/* Bytes of one block of each format fmoe computes with (ggml-common.h's static_asserts). */
enum {
    FMOE_Q8_0_BYTES = 2 + 32,                 /* f16 d; int8 q[32]: x = d·q */
    FMOE_Q4_0_BYTES = 2 + 16,                 /* f16 d; 4-bit q[32]: x = d·(q - 8) */
    FMOE_Q4_1_BYTES = 2 + 2 + 16,             /* f16 d, m; 4-bit q[32]: x = d·q + m */
    FMOE_Q5_0_BYTES = 2 + 4 + 16,             /* f16 d; 5th bits qh[4]; x = d·(q - 16) */
    FMOE_Q5_1_BYTES = 2 + 2 + 4 + 16,         /* f16 d, m; qh[4]; x = d·q + m */
    FMOE_IQ4_NL_BYTES = 2 + 16,               /* f16 d; 4-bit codes into a fixed grid */
    FMOE_Q4_K_BYTES = 2 + 2 + 12 + 128,       /* f16 d, dmin; 6-bit scales, mins; 4-bit q */
    FMOE_Q5_K_BYTES = 2 + 2 + 12 + 32 + 128,  /* as Q4_K plus the 5th bits qh[32] */
    FMOE_Q6_K_BYTES = 128 + 64 + 16 + 2,      /* ql[128], qh[64], int8 scales[16], f16 d */
    FMOE_Q2_K_BYTES = 16 + 64 + 2 + 2,        /* 4-bit scale|min [16]; 2-bit q; f16 d, dmin */
    FMOE_Q3_K_BYTES = 32 + 64 + 12 + 2,       /* hmask[32]; 2-bit q; 6-bit scales; f16 d */
    FMOE_IQ4_XS_BYTES = 2 + 2 + 4 + 128,      /* f16 d; 6-bit scales (high, low); 4-bit codes */
    FMOE_MXFP4_BYTES = 1 + 16,                /* E8M0 e; 4-bit E2M1 codes: x = 2^(e-128)·2v */
    /* the i-quants: grid indices into fixed codebooks, signs, 3- or 4-bit scales */
    FMOE_IQ2_XXS_BYTES = 2 + 64,              /* f16 d; uint16 qs[32] */
    FMOE_IQ2_XS_BYTES = 2 + 64 + 8,           /* f16 d; uint16 qs[32]; scales[8] */
    FMOE_IQ2_S_BYTES = 2 + 64 + 8 + 8,        /* f16 d; qs[64] (indices, signs); qh[8]; scales[8] */
    FMOE_IQ3_XXS_BYTES = 2 + 96,              /* f16 d; qs[64]; uint32 scales_and_signs[8] */
    FMOE_IQ3_S_BYTES = 2 + 64 + 8 + 32 + 4,   /* f16 d; qs[64]; qh[8]; signs[32]; scales[4] */
    FMOE_IQ1_S_BYTES = 2 + 32 + 16,           /* f16 d; qs[32]; uint16 qh[8] */
    FMOE_IQ1_M_BYTES = 32 + 16 + 8,           /* qs[32]; qh[16]; uint16 scales[4], d inside */
};

/* "Q4_K", "BF16", ... as ggml names them; NULL for a number ggml does not define. */
const char *fmoe_ggml_type_name(uint32_t type);

/* The type called `name` (case-insensitive: "q4_k" works). @return 0 and *out, or -1. */
int fmoe_ggml_type_parse(const char *name, fmoe_ggml_type *out);

/* Values per block and bytes per block; 0 for a number ggml does not define. */
int32_t fmoe_ggml_block_size(uint32_t type);
int32_t fmoe_ggml_type_size(uint32_t type);

/* 1 for the twenty-three types fmoe dequantises and computes dot products with (the types
 * fmoe_quant_can_quantize writes, F32, F16, BF16; and, read only, the i-quants
 * IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M). */
int fmoe_quant_supported(uint32_t type);

/* 1 for the types fmoe_quant_quantize_row writes: Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
 * IQ4_XS, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4, and the i-quants that need no importance
 * matrix, IQ3_XXS, IQ3_S, IQ2_S. */
int fmoe_quant_can_quantize(uint32_t type);

/* Builds what quantising to `type` needs before its first row: for IQ3_XXS, IQ3_S, IQ2_S,
 * IQ2_XXS and IQ2_XS the search tables of their codebooks (once per process, thread-safe, some
 * milliseconds); nothing for the other types. fmoe_quant_quantize_row builds them too, but
 * can only stop the process (FMOE_ASSERT) where memory runs out: call this first to get
 * the error. @return 0, or FMOE_ENOMEM (fmoe_error_detail says which type). */
int fmoe_quant_prepare(uint32_t type);

/* The type a row of `cols` values requested as `type` is written in, by llama-quantize's
 * rule: `type` itself where cols is whole blocks of it; else for a K-quant the 32-value
 * type llama.cpp falls back to (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0; Q2_K, Q3_K,
 * IQ4_XS and the i-quants fmoe writes -> IQ4_NL) where cols is whole blocks of 32; else 0:
 * no block type fits, the row stays a float type (llama.cpp writes F16 there;
 * `fmoe quantize` keeps the checkpoint's own f16/bf16). */
uint32_t fmoe_quant_fallback_type(uint32_t type, int64_t cols);

/* Bytes of a row of n values (n a multiple of the block size), or -1 when n is not. */
int64_t fmoe_quant_row_bytes(uint32_t type, int64_t n);

/* Dequantises a row of n values (n a multiple of the block size) into dst[n].
 * The type must be supported (checked with FMOE_ASSERT: a caller bug otherwise). */
void fmoe_quant_dequantize_row(uint32_t type, const void *row, float *dst, int64_t n);

/* Σ_i row[i]·x[i] over n values: the fastest path this CPU has. */
float fmoe_quant_dot(uint32_t type, const void *row, const float *x, int64_t n);

/* The same in plain C, one block at a time (the reference the SIMD path is tested with). */
float fmoe_quant_dot_ref(uint32_t type, const void *row, const float *x, int64_t n);

/* 1 when fmoe_quant_dot uses a SIMD path on this CPU, AVX2 or AVX-512 (which needs AVX2
 * too): FMOE_NO_AVX2 in the environment turns both off, FMOE_NO_AVX512 the second, so
 * tests can compare the paths on one machine. */
int fmoe_quant_simd(void);

/* Quantises src[n] (n a multiple of the block size) into dst, fmoe_quant_row_bytes(type, n)
 * bytes, with ggml's reference quantisers' algorithms (lib/quant_ref.c says which match
 * byte for byte and how that was checked). Non-finite inputs give unspecified blocks.
 * The type must be one fmoe_quant_can_quantize says yes to (FMOE_ASSERT otherwise). */
void fmoe_quant_quantize_row(uint32_t type, const float *src, void *dst, int64_t n);

/* The same with an importance matrix's entries for the row's columns (importance[n], the
 * mean squared activation of each column, as llama.cpp's imatrix files hold them; NULL:
 * none): the i-quant quantisers (IQ3_XXS, IQ3_S, IQ2_S) weigh each value by
 * importance·sqrt(σ² + x²) as llama.cpp's do; the other types' quantisers, which follow
 * llama.cpp's algorithms without a matrix only, ignore it. Also writes the types that need
 * one (fmoe_quant_needs_importance: IQ2_XXS, IQ2_XS, IQ1_S, IQ1_M), importance not NULL
 * (FMOE_ASSERT). */
void fmoe_quant_quantize_row_weighted(uint32_t type, const float *src, const float *importance,
                                      void *dst, int64_t n);

/* 1 for the types whose quantiser uses an importance matrix (IQ3_XXS, IQ3_S, IQ2_S, and
 * those that need one). */
int fmoe_quant_uses_importance(uint32_t type);

/* 1 for the types fmoe_quant_quantize_row_weighted writes only with an importance matrix,
 * as llama.cpp's quantiser (IQ2_XXS, IQ2_XS, IQ1_S; IQ1_M as llama-quantize);
 * fmoe_quant_can_quantize says 0 for them. */
int fmoe_quant_needs_importance(uint32_t type);

#endif
