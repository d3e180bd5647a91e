/*
 * gemm_bench.c - the CPU backend's own matrix products for `fmoe calibrate`
 * (fmoe/model.h fmoe_cpu_gemm_bench).
 *
 * Why: a live CPU run computes a checkpoint's bf16 weights with the CPU backend's kernels
 * (runtime/cpu/cpu_backend.c: AVX-512 tiles reading bf16 in place where the CPU has
 * AVX-512F, else rows widened to f32 for OpenBLAS), not OpenBLAS on f32 weights. Decode is
 * bound by the bytes of the weights read, so on an AVX-512 machine the f32 timings were
 * twice the live ones and the simulator's predictions of live CPU runs were that much
 * off (tests/bench/bench_offload_live.py). Timing the backend's matmul on weights of the
 * checkpoint's dtype measures what the live run does. A GGUF model's quantized weights
 * (Q8_0, Q4_K, Q5_K, Q6_K) are timed as blocks of that type through the same matmul, which
 * runs the block kernels (runtime/cpu/quant_matvec.c): a Q4_K decode reads 0.28x the bytes
 * of bf16, and its compute curve must say so. With 8-bit activations (`--activations q8`)
 * those kernels quantise the inputs and take integer dots, a different speed again, so
 * the bench's backend is made with the run's choice.
 */
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "half.h"
#include "fmoe/quant.h"
#include "model_impl.h"

/* The block type a weight of `dtype` with rows of `cols` values is computed in, or 0 for a
 * float dtype: a K-quant row must be whole super-blocks of 256; a row that is not is kept
 * as Q8_0 when it is whole blocks of 32, else as bf16, as `fmoe quantize` writes it. */
static uint32_t block_type(fmoe_dtype dtype, int32_t cols) {
    uint32_t t = dtype == FMOE_DTYPE_Q8_0   ? FMOE_GGML_Q8_0
                 : dtype == FMOE_DTYPE_Q4_K ? FMOE_GGML_Q4_K
                 : dtype == FMOE_DTYPE_Q5_K ? FMOE_GGML_Q5_K
                 : dtype == FMOE_DTYPE_Q6_K ? FMOE_GGML_Q6_K
                                            : 0;
    if (t && cols % fmoe_ggml_block_size(t) != 0) t = cols % FMOE_QK8_0 == 0 ? FMOE_GGML_Q8_0 : 0;
    return t;
}

struct fmoe_cpu_gemm_bench {
    void *ctx;            /* the CPU backend's */
    int32_t mats;
    fmoe__mat *w;         /* [mats] */
    void **data;          /* [mats] their bytes */
};

void fmoe_cpu_gemm_bench_free(fmoe_cpu_gemm_bench *b) {
    if (!b) return;
    for (int32_t i = 0; b->data && i < b->mats; i++) free(b->data[i]);
    free(b->data);
    free(b->w);
    if (b->ctx) fmoe__cpu_backend.free(b->ctx);
    free(b);
}

int fmoe_cpu_gemm_bench_init(fmoe_cpu_gemm_bench **out, const int32_t *rows,
                             const int32_t *cols, int32_t mats, fmoe_dtype dtype,
                             int32_t max_batch, int32_t threads,
                             fmoe_activations activations) {
    /* the kernels the forward pass has: f32, f16, bf16, and the block types (block_type);
     * other formats are timed as bf16 */
    const fmoe_st_dtype st = dtype == FMOE_DTYPE_F32   ? FMOE_ST_F32
                             : dtype == FMOE_DTYPE_F16 ? FMOE_ST_F16
                                                       : FMOE_ST_BF16;
    *out = NULL;
    FMOE_RETURN_ERROR_IF(mats < 1 || max_batch < 1, FMOE_EINVAL,
                         "gemm timing: %d matrices, batch %d", mats, max_batch);
    for (int32_t i = 0; i < mats; i++)
        FMOE_RETURN_ERROR_IF(rows[i] < 1 || cols[i] < 1, FMOE_EINVAL,
                             "gemm timing: matrix %d is %d x %d", i, rows[i], cols[i]);
    fmoe_cpu_gemm_bench *b = calloc(1, sizeof *b);
    if (!b) return fmoe_error_set(FMOE_ENOMEM, "gemm timing");
    b->mats = mats;
    b->w = calloc((size_t)mats, sizeof *b->w);
    b->data = calloc((size_t)mats, sizeof *b->data);
    int rc = b->w && b->data ? 0 : fmoe_error_set(FMOE_ENOMEM, "gemm timing");
    int64_t max_cols = 1;
    uint32_t x = 2463534242u;
    float *row = NULL; /* a quantized matrix: each row made in f32, then quantized */
    for (int32_t i = 0; rc == 0 && i < mats; i++) {
        const size_t n = (size_t)rows[i] * (size_t)cols[i];
        const uint32_t quant = block_type(dtype, cols[i]);
        const size_t row_bytes = quant ? (size_t)fmoe_quant_row_bytes(quant, cols[i]) : 0;
        const size_t elem = st == FMOE_ST_F32 ? 4 : 2;
        const size_t bytes = quant ? row_bytes * (size_t)rows[i] : n * elem;
        /* 64-byte rows as a checkpoint's realigned tensors; small values */
        b->data[i] = aligned_alloc(64, (bytes + 63) / 64 * 64);
        float *grown = quant ? realloc(row, (size_t)cols[i] * sizeof *row) : row;
        if (grown) row = grown;
        if (!b->data[i] || (quant && !grown)) {
            rc = fmoe_error_set(FMOE_ENOMEM, "gemm timing: a %d x %d matrix", rows[i], cols[i]);
            break;
        }
        for (size_t k = 0; k < n; k++) {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            const float v = ((float)(x & 0xffff) / 65536.0f - 0.5f) * 0.04f;
            if (quant) {
                const size_t c = k % (size_t)cols[i];
                row[c] = v;
                if (c + 1 == (size_t)cols[i])
                    fmoe_quant_quantize_row(quant, row,
                                            (uint8_t *)b->data[i] + (k / (size_t)cols[i]) * row_bytes,
                                            cols[i]);
            } else if (st == FMOE_ST_BF16) ((uint16_t *)b->data[i])[k] = fmoe_float_to_bf16(v);
            else if (st == FMOE_ST_F16) ((uint16_t *)b->data[i])[k] = fmoe_float_to_half(v);
            else ((float *)b->data[i])[k] = v;
        }
        b->w[i] = quant ? (fmoe__mat){.data = b->data[i], .dtype = FMOE_ST_U8, .quant = quant,
                                      .rows = rows[i], .cols = cols[i]}
                        : (fmoe__mat){.data = b->data[i], .dtype = st,
                                      .rows = rows[i], .cols = cols[i]};
        if (cols[i] > max_cols) max_cols = cols[i];
    }
    free(row);
    const fmoe__backend_limits lim = {.threads = threads, .max_cols = max_cols,
                                      .max_batch = max_batch, .max_context = 1,
                                      .activations = activations};
    if (rc == 0) rc = fmoe__cpu_backend.init(&lim, &b->ctx);
    if (rc < 0) {
        fmoe_cpu_gemm_bench_free(b);
        return rc;
    }
    *out = b;
    return 0;
}

int fmoe_cpu_gemm_bench_run(void *bench, int32_t mat, const float *x, int32_t n, float *y) {
    fmoe_cpu_gemm_bench *b = bench;
    fmoe__cpu_backend.matmul(b->ctx, &b->w[mat], x, n, y);
    return 0;
}
