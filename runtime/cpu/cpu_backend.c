/*
 * cpu_backend.c - the CPU backend: OpenBLAS for f32 matrices, our own kernels for bf16 and
 * f16 weights read in place from the mmapped checkpoint, and a thread pool for both.
 *
 * Design. One pool of threads does all parallel work; OpenBLAS runs single-threaded inside
 * it (openblas_set_num_threads(1)), each worker multiplying its own slice of the weight's
 * rows. Two thread systems spinning on two cores would fight; one does not. OpenBLAS's own
 * workers, started when the library loads, are stopped (blas_one_thread).
 *
 * Matrix products y[n][rows] = x[n][cols] · Wᵀ, by the weight's dtype and n:
 *   f32, n = 1      cblas_sgemv per slice of rows
 *   f32, n > 1      cblas_sgemm per slice of rows
 *   bf16/f16, n <= SMALL_N
 *                   convert-and-dot: each row is read once (2 bytes per value, half the
 *                   memory traffic of f32), widened in registers (AVX2/F16C when the CPU
 *                   has them) and dotted with the n inputs
 *   bf16, n > SMALL_N, AVX-512F CPU, cols >= 32
 *                   gemm_bf16_512: 4x4 register tiles read the bf16 rows in place and
 *                   widen them in registers (two instructions per 32 values); x is packed
 *                   once per call. Prefill's main path (experts, attention projections).
 *   bf16/f16, n > SMALL_N otherwise (and with FMOE_NO_AVX512 set in the environment)
 *                   rows are widened in blocks of block_rows into the worker's scratch and
 *                   multiplied with cblas_sgemm: the conversion is O(rows·cols) against
 *                   O(n·rows·cols) of arithmetic, but with the 16-64 tokens an expert gets
 *                   in prefill, widening plus OpenBLAS's own packing of the widened block
 *                   cost about 30% of the time, and OpenBLAS 0.3.21 runs its AVX2 kernel
 *                   on AVX-512 parts; gemm_bf16_512 was 2x faster on the 1B bench model
 *   ggml blocks (a GGUF file's Q8_0, K-quants, Q4_0 .. IQ4_NL), n <= SMALL_N
 *                   fmoe__quant_matvec (quant_matvec.h): block dots, the rows never
 *                   widened in memory (decode reads 8.5 or 4.5 bits a weight)
 *   ggml blocks, n > SMALL_N
 *                   as bf16's fallback: blocks of rows dequantised into the worker's
 *                   scratch (quant_widen.h: AVX2, the same bits as the plain C), then
 *                   cblas_sgemm (prefill ran at 0.4x bf16 with a dot per row and token;
 *                   see docs/quantization.md)
 *   ggml blocks, any n, limits.activations q8 (the commands' --activations q8)
 *                   fmoe__quant_matvec's 8-bit path: x quantised to 8 bits once per
 *                   product and integer block dots, each row unpacked once per four
 *                   inputs (llama.cpp's scheme). Faster, less exact: opt-in (the
 *                   numbers are in docs/quantization.md)
 * Keeping weights in bf16 rather than widening them at load halves resident memory and
 * decode-time memory traffic; what it costs in prefill is measured in the report.
 *
 * Attention: one task per (query token, group of up to ATTN_GROUP query heads sharing a
 * key/value head); scores for the visible keys are computed into the worker's scratch rows
 * [ATTN_GROUP][max_context], softmaxed, and used to sum the values (attn_task says how).
 */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../backend/backend_impl.h"
#include "dot_avx2.h"
#include "fmoe/error.h"
#include "half.h"
#include "fmoe/quant_act.h"
#include "rowwise.h"
#include "cpu_fused.h"
#include "cpu_mla.h"
#include "quant_matvec.h"
#include "quant_widen.h"
#include "../backend/threadpool.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#define HAVE_X86 1
#else
#define HAVE_X86 0
#endif

#define SMALL_N 4
/* Query heads of one key/value head that one attention task takes (grouped-query models). */
#define ATTN_GROUP 4
/* Rows of an f32 matrix per OpenBLAS call, whatever the thread count (cpu_matmul). */
#define F32_SLICE 64
/* Below this many multiply-adds a product runs on the calling thread alone. */
#define PARALLEL_MIN_WORK (1 << 16)

typedef struct cpu_ctx {
    fmoe__pool *pool;
    int32_t threads;
    int64_t max_cols;
    int32_t max_context;
    int32_t max_batch;
    int32_t block_rows;   /* rows widened per block in the bf16/f16 GEMM path */
    float **scratch;      /* [threads][block_rows * max_cols] */
    float **scores;       /* [threads][ATTN_GROUP][max_context] */
    float *xpack;         /* [max_batch][max_cols] x packed for the AVX-512 bf16 GEMM */
    int simd;             /* AVX2 + FMA + F16C available */
    int simd512;          /* AVX-512F available */
    int act8;             /* FMOE_ACTIVATIONS_Q8: 8-bit inputs for block-format weights */
    double *marks;        /* [max_marks] host clock of each timer mark, s; NAN: unmarked */
    int32_t max_marks;
    double min_work;      /* multiply-adds below which a product stays on the caller:
                             PARALLEL_MIN_WORK, or FMOE_CPU_MIN_WORK from the environment
                             (tests set 0 to split even a tiny model's products) */
    fmoe__cpu_fused *fused; /* the fused products' scratch (cpu_fused.h); NULL with
                             FMOE_CPU_UNFUSED in the environment */
} cpu_ctx;

/* ---------------------------------------------------------------------------------- */
/* Kernels                                                                            */
/* ---------------------------------------------------------------------------------- */

static float dot_f32_plain(const float *a, const float *b, int64_t n) {
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += a[i] * b[i];
        s1 += a[i + 1] * b[i + 1];
        s2 += a[i + 2] * b[i + 2];
        s3 += a[i + 3] * b[i + 3];
    }
    for (; i < n; i++) s0 += a[i] * b[i];
    return (s0 + s1) + (s2 + s3);
}

static float dot_bf16_plain(const uint16_t *w, const float *x, int64_t n) {
    float s = 0;
    for (int64_t i = 0; i < n; i++) s += fmoe_bf16_to_float(w[i]) * x[i];
    return s;
}

static float dot_f16_plain(const uint16_t *w, const float *x, int64_t n) {
    float s = 0;
    for (int64_t i = 0; i < n; i++) s += fmoe_half_to_float(w[i]) * x[i];
    return s;
}

static void widen_plain(const uint16_t *w, fmoe_st_dtype dt, float *y, int64_t n) {
    if (dt == FMOE_ST_BF16)
        for (int64_t i = 0; i < n; i++) y[i] = fmoe_bf16_to_float(w[i]);
    else
        for (int64_t i = 0; i < n; i++) y[i] = fmoe_half_to_float(w[i]);
}

#if HAVE_X86
#define SIMD __attribute__((target("avx2,fma,f16c")))

/* The dots themselves are lib/dot_avx2.h's, shared with lib/quant_avx2.c's F32/F16/BF16
 * rows so the two cannot drift apart (their summation order is pinned by logits tests). */

/* y[t·ystride] = dot(w, x + t·ld) for t < nx; the row stays in L1 between inputs. */
SIMD static void dots_u16_simd(const uint16_t *w, fmoe_st_dtype dt, const float *x, int64_t ld,
                               int32_t nx, int64_t n, float *y, int64_t ystride) {
    for (int32_t t = 0; t < nx; t++)
        y[t * ystride] = fmoe__dot_u16_avx2(w, dt == FMOE_ST_BF16, x + t * ld, n);
}

/* y += a·x */
SIMD static void axpy_simd(float *y, float a, const float *x, int64_t n) {
    const __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

SIMD static void widen_simd(const uint16_t *w, fmoe_st_dtype dt, float *y, int64_t n) {
    int64_t i = 0;
    if (dt == FMOE_ST_BF16)
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, fmoe__load_bf16(w + i));
    else
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, fmoe__load_f16(w + i));
    widen_plain(w + i, dt, y + i, n - i);
}

/*
 * AVX-512 GEMM straight from bf16 weights: y[t][r] = Σ_k x[t][k]·W[r][k], no widened copy
 * of W and no BLAS packing. A 512-bit load holds 32 bf16 values; as 32-bit lanes, the
 * even-indexed value sits in the low half and the odd one in the high half, so
 * `lane << 16` is W[2i] as a float and `lane & 0xffff0000` is W[2i+1] — two instructions
 * for 32 widened values, no shuffles. x is packed once per call to match (pack_x_eo:
 * per 32 columns, the 16 even ones then the 16 odd ones; the last cols % 32 columns stay
 * in order and are summed in scalar code). A tile is R <= 4 rows by
 * T <= 4 tokens in 16 accumulators; the weight rows stay in L1 while the tokens stream
 * from L2. Summation order differs from a plain dot product only by the lane split.
 */
#define SIMD512 __attribute__((target("avx512f")))

SIMD512 static void pack_x_eo(const float *x, int32_t n, int64_t cols, float *xp) {
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    const int64_t c32 = cols / 32 * 32;
    for (int64_t t = 0; t < n; t++) {
        for (int64_t k = 0; k < c32; k += 32) {
            const __m512 a = _mm512_loadu_ps(x + t * cols + k);
            const __m512 b = _mm512_loadu_ps(x + t * cols + k + 16);
            _mm512_storeu_ps(xp + t * cols + k, _mm512_permutex2var_ps(a, ev, b));
            _mm512_storeu_ps(xp + t * cols + k + 16, _mm512_permutex2var_ps(a, od, b));
        }
        memcpy(xp + t * cols + c32, x + t * cols + c32, (size_t)(cols - c32) * sizeof *xp);
    }
}

SIMD512 static inline __attribute__((always_inline)) void
tile_bf16_512(const uint16_t *W, int64_t cols, const float *xp, int64_t ldy, float *y, int R,
              int T) {
    const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
    __m512 acc[4][4];
    _Pragma("GCC unroll 4")
    for (int r = 0; r < R; r++)
        _Pragma("GCC unroll 4")
        for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps();
    const int64_t c32 = cols / 32 * 32;
    for (int64_t k = 0; k < c32; k += 32) {
        __m512 we[4], wo[4];
        _Pragma("GCC unroll 4")
        for (int r = 0; r < R; r++) {
            const __m512i v = _mm512_loadu_si512((const void *)(W + r * cols + k));
            we[r] = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
            wo[r] = _mm512_castsi512_ps(_mm512_and_si512(v, hi));
        }
        _Pragma("GCC unroll 4")
        for (int t = 0; t < T; t++) {
            const __m512 xe = _mm512_loadu_ps(xp + t * cols + k);
            const __m512 xo = _mm512_loadu_ps(xp + t * cols + k + 16);
            _Pragma("GCC unroll 4")
            for (int r = 0; r < R; r++) {
                acc[r][t] = _mm512_fmadd_ps(we[r], xe, acc[r][t]);
                acc[r][t] = _mm512_fmadd_ps(wo[r], xo, acc[r][t]);
            }
        }
    }
    _Pragma("GCC unroll 4")
    for (int t = 0; t < T; t++)
        _Pragma("GCC unroll 4")
        for (int r = 0; r < R; r++) {
            float sum = _mm512_reduce_add_ps(acc[r][t]);
            for (int64_t k = c32; k < cols; k++) /* the last cols % 32, packed as they were */
                sum += fmoe_bf16_to_float(W[r * cols + k]) * xp[t * cols + k];
            y[t * ldy + r] = sum;
        }
}

/* Rows [r0, r1) of y[n][ldy] for bf16 W[rows][cols], x packed into xp by pack_x_eo. */
SIMD512 static void gemm_bf16_512(const uint16_t *W, int64_t cols, const float *xp, int32_t n,
                                  float *y, int64_t ldy, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r += 4) {
        const int R = r1 - r < 4 ? (int)(r1 - r) : 4;
        const uint16_t *w = W + r * cols;
        int32_t t = 0;
        if (R == 4) {
            for (; t + 4 <= n; t += 4)
                tile_bf16_512(w, cols, xp + t * cols, ldy, y + t * ldy + r, 4, 4);
            const float *x = xp + t * cols;
            float *yt = y + t * ldy + r;
            switch (n - t) {
            case 3: tile_bf16_512(w, cols, x, ldy, yt, 4, 3); break;
            case 2: tile_bf16_512(w, cols, x, ldy, yt, 4, 2); break;
            case 1: tile_bf16_512(w, cols, x, ldy, yt, 4, 1); break;
            default: break;
            }
        } else { /* the last 1-3 rows of the slice, one at a time */
            for (int rr = 0; rr < R; rr++) {
                const uint16_t *wr = w + rr * cols;
                float *yr = y + r + rr;
                for (t = 0; t + 4 <= n; t += 4)
                    tile_bf16_512(wr, cols, xp + t * cols, ldy, yr + t * ldy, 1, 4);
                for (; t < n; t++) tile_bf16_512(wr, cols, xp + t * cols, ldy, yr + t * ldy, 1, 1);
            }
        }
    }
}
#endif

static float dot_f32(const cpu_ctx *c, const float *a, const float *b, int64_t n) {
#if HAVE_X86
    if (c->simd) return fmoe__dot_f32_avx2(a, b, n);
#endif
    (void)c;
    return dot_f32_plain(a, b, n);
}

static void dots_u16(const cpu_ctx *c, const uint16_t *w, fmoe_st_dtype dt, const float *x,
                     int64_t ld, int32_t nx, int64_t n, float *y, int64_t ystride) {
#if HAVE_X86
    if (c->simd) {
        dots_u16_simd(w, dt, x, ld, nx, n, y, ystride);
        return;
    }
#endif
    for (int32_t t = 0; t < nx; t++)
        y[t * ystride] = dt == FMOE_ST_BF16 ? dot_bf16_plain(w, x + t * ld, n)
                                            : dot_f16_plain(w, x + t * ld, n);
}

static void axpy(const cpu_ctx *c, float *y, float a, const float *x, int64_t n) {
#if HAVE_X86
    if (c->simd) {
        axpy_simd(y, a, x, n);
        return;
    }
#endif
    (void)c;
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

static void widen(const cpu_ctx *c, const uint16_t *w, fmoe_st_dtype dt, float *y, int64_t n) {
#if HAVE_X86
    if (c->simd) {
        widen_simd(w, dt, y, n);
        return;
    }
#endif
    widen_plain(w, dt, y, n);
}

/* ---------------------------------------------------------------------------------- */
/* Matrix products                                                                    */
/* ---------------------------------------------------------------------------------- */

typedef struct matmul_job {
    cpu_ctx *c;
    const fmoe__mat *w;
    const float *x;
    float *y;
    int32_t n;
    int32_t ntasks;
    int64_t chunk; /* rows per task */
    int packed;    /* bf16 through gemm_bf16_512, x packed in c->xpack */
} matmul_job;

static void matmul_task(void *arg, int32_t task, int32_t worker) {
    matmul_job *j = arg;
    const fmoe__mat *w = j->w;
    const int64_t rows = w->rows, cols = w->cols;
    const int64_t r0 = (int64_t)task * j->chunk;
    const int64_t r1 = r0 + j->chunk < rows ? r0 + j->chunk : rows;
    if (r0 >= r1) return;
    const int32_t n = j->n;
    if (w->dtype == FMOE_ST_F32) {
        const float *W = (const float *)w->data + r0 * cols;
        if (n == 1)
            cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)(r1 - r0), (int)cols, 1.0f, W,
                        (int)cols, j->x, 1, 0.0f, j->y + r0, 1);
        else
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, (int)(r1 - r0), (int)cols,
                        1.0f, j->x, (int)cols, W, (int)cols, 0.0f, j->y + r0, (int)rows);
        return;
    }
    float *buf = j->c->scratch[worker];
    if (w->quant) { /* n > SMALL_N: blocks of rows dequantised, then one sgemm each */
        const int64_t rb = fmoe_quant_row_bytes(w->quant, cols);
        for (int64_t b0 = r0; b0 < r1; b0 += j->c->block_rows) {
            const int64_t nb = b0 + j->c->block_rows < r1 ? j->c->block_rows : r1 - b0;
            fmoe__quant_widen_rows(w->quant, (const uint8_t *)w->data + b0 * rb, nb, cols, buf);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, (int)nb, (int)cols, 1.0f,
                        j->x, (int)cols, buf, (int)cols, 0.0f, j->y + b0, (int)rows);
        }
        return;
    }
    const uint16_t *W = (const uint16_t *)w->data;
#if HAVE_X86
    if (j->packed) {
        gemm_bf16_512(W, cols, j->c->xpack, n, j->y, rows, r0, r1);
        return;
    }
#endif
    if (n <= SMALL_N) {
        for (int64_t r = r0; r < r1; r++)
            dots_u16(j->c, W + r * cols, w->dtype, j->x, cols, n, cols, j->y + r, rows);
        return;
    }
    for (int64_t b0 = r0; b0 < r1; b0 += j->c->block_rows) {
        const int64_t nb = b0 + j->c->block_rows < r1 ? j->c->block_rows : r1 - b0;
        widen(j->c, W + b0 * cols, w->dtype, buf, nb * cols);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, (int)nb, (int)cols, 1.0f, j->x,
                    (int)cols, buf, (int)cols, 0.0f, j->y + b0, (int)rows);
    }
}

static void cpu_matmul(void *ctx, const fmoe__mat *w, const float *x, int32_t n, float *y) {
    cpu_ctx *c = ctx;
    if (w->quant && (n <= SMALL_N || (c->act8 && fmoe_quant_act_supported(w->quant)))) {
        /* scratch rows hold block_rows·max_cols >= cols floats, one per pool worker */
        const double work = (double)w->rows * (double)w->cols * (double)n;
        fmoe__quant_matvec(work < c->min_work ? NULL : c->pool, w->quant, w->data, w->rows,
                           w->cols, x, n, w->cols, y, w->rows, c->scratch,
                           (int64_t)c->block_rows * c->max_cols, c->act8);
        return;
    }
    matmul_job j = {.c = c, .w = w, .x = x, .y = y, .n = n};
    const double work = (double)w->rows * (double)w->cols * (double)n;
    int32_t tasks = work < c->min_work ? 1 : c->threads;
    if (tasks > w->rows) tasks = (int32_t)w->rows;
    if (tasks < 1) tasks = 1;
    /* Slices in multiples of 16 rows keep each worker's output stores apart. */
    int64_t chunk = (w->rows + tasks - 1) / tasks;
    chunk = (chunk + 15) / 16 * 16;
#if HAVE_X86
    if (c->simd512 && c->xpack && w->dtype == FMOE_ST_BF16 && n > SMALL_N && w->cols >= 32 &&
        n <= c->max_batch && w->cols <= c->max_cols) {
        pack_x_eo(x, n, w->cols, c->xpack);
        j.packed = 1;
    }
#endif
    /* Rows widened into blocks for sgemm: the blocks must not depend on the thread count
     * (OpenBLAS's sums over a block of other height can differ in the last bit), so a
     * slice is one block, wherever the threads' slices would have ended */
    if (!j.packed && w->dtype != FMOE_ST_F32 && (w->quant || n > SMALL_N) && tasks > 1)
        chunk = c->block_rows;
    /* f32 rows likewise: OpenBLAS's sum for a row can differ in the last bit with the
     * height of the slice it is in (sgemm's and sgemv's edge kernels), so slices of the
     * rows over the threads made an f32 matrix's products depend on the thread count
     * (tests/python/test_threads.py, DeepSeek-V2's f32 matrices in a prefill pass); the
     * slices are F32_SLICE rows at any count */
    if (w->dtype == FMOE_ST_F32) chunk = F32_SLICE;
    j.chunk = chunk;
    j.ntasks = (int32_t)((w->rows + chunk - 1) / chunk);
    fmoe__pool_run(work < c->min_work ? NULL : c->pool, matmul_task, &j, j.ntasks);
}

static void cpu_get_rows(void *ctx, const fmoe__mat *w, const int32_t *rows_host, int32_t n,
                         float *y) {
    const cpu_ctx *c = ctx;
    for (int32_t i = 0; i < n; i++) {
        float *dst = y + (int64_t)i * w->cols;
        const int64_t row = rows_host[i];
        if (w->quant)
            fmoe_quant_dequantize_row(w->quant,
                                      (const uint8_t *)w->data +
                                          row * fmoe_quant_row_bytes(w->quant, w->cols),
                                      dst, w->cols);
        else if (w->dtype == FMOE_ST_F32)
            memcpy(dst, (const float *)w->data + row * w->cols, (size_t)w->cols * sizeof *dst);
        else
            widen(c, (const uint16_t *)w->data + row * w->cols, w->dtype, dst, w->cols);
    }
}

/* ---------------------------------------------------------------------------------- */
/* Attention                                                                          */
/* ---------------------------------------------------------------------------------- */

typedef struct attn_job {
    cpu_ctx *c;
    const fmoe__attn_args *a;
    int32_t G; /* query heads per task, dividing the heads per key/value head */
} attn_job;

#if HAVE_X86
/*
 * The attention's dots and sums with the AVX2 paths' arithmetic, faster. Scores: four query
 * heads' dots with each key row (one head's: two key rows at a time), each dot
 * fmoe__dot_f32_avx2's own accumulators and order (two chains over 16 values a step, then
 * fmoe__hsum256), interleaved so that their FMA chains overlap, the key row loaded once
 * (the per-head calls ran one dot's chain of latencies at a time). Values: out = Σ_p s_p·v_p as axpy_simd
 * computes it (one FMA per element and position, positions in order), with the running sums
 * of 64 values in registers across the positions instead of a load and a store of all of
 * out per position. So the bits are those of the per-head dot_f32 / axpy calls; head_dim a
 * multiple of 16 (every model's: 64, 128, 256), else attn_task takes those calls.
 */
/* Four heads' dots with one key row at a time (their 8 accumulators in registers). */
SIMD static void scores4(const float *q0, const float *q1, const float *q2, const float *q3,
                         const float *k, int64_t kv_stride, int32_t m, int32_t D, float scale,
                         float *sc, int64_t sc_stride) {
    for (int32_t p = 0; p < m; p++, k += kv_stride) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, b0 = a0, b1 = a0, c0 = a0, c1 = a0, d0 = a0,
               d1 = a0;
        for (int32_t i = 0; i < D; i += 16) {
            const __m256 k0 = _mm256_loadu_ps(k + i), k1 = _mm256_loadu_ps(k + i + 8);
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q0 + i), k0, a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q0 + i + 8), k1, a1);
            b0 = _mm256_fmadd_ps(_mm256_loadu_ps(q1 + i), k0, b0);
            b1 = _mm256_fmadd_ps(_mm256_loadu_ps(q1 + i + 8), k1, b1);
            c0 = _mm256_fmadd_ps(_mm256_loadu_ps(q2 + i), k0, c0);
            c1 = _mm256_fmadd_ps(_mm256_loadu_ps(q2 + i + 8), k1, c1);
            d0 = _mm256_fmadd_ps(_mm256_loadu_ps(q3 + i), k0, d0);
            d1 = _mm256_fmadd_ps(_mm256_loadu_ps(q3 + i + 8), k1, d1);
        }
        sc[p] = fmoe__hsum256(_mm256_add_ps(a0, a1)) * scale;
        sc[sc_stride + p] = fmoe__hsum256(_mm256_add_ps(b0, b1)) * scale;
        sc[2 * sc_stride + p] = fmoe__hsum256(_mm256_add_ps(c0, c1)) * scale;
        sc[3 * sc_stride + p] = fmoe__hsum256(_mm256_add_ps(d0, d1)) * scale;
    }
}

/* One head's: positions in pairs, so that two dots' chains overlap. */
SIMD static void scores1(const float *q, const float *k, int64_t kv_stride, int32_t m, int32_t D,
                         float scale, float *sc) {
    int32_t p = 0;
    for (; p + 2 <= m; p += 2, k += 2 * kv_stride) {
        const float *k2 = k + kv_stride;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, b0 = a0, b1 = a0;
        for (int32_t i = 0; i < D; i += 16) {
            const __m256 x0 = _mm256_loadu_ps(q + i), x1 = _mm256_loadu_ps(q + i + 8);
            a0 = _mm256_fmadd_ps(x0, _mm256_loadu_ps(k + i), a0);
            a1 = _mm256_fmadd_ps(x1, _mm256_loadu_ps(k + i + 8), a1);
            b0 = _mm256_fmadd_ps(x0, _mm256_loadu_ps(k2 + i), b0);
            b1 = _mm256_fmadd_ps(x1, _mm256_loadu_ps(k2 + i + 8), b1);
        }
        sc[p] = fmoe__hsum256(_mm256_add_ps(a0, a1)) * scale;
        sc[p + 1] = fmoe__hsum256(_mm256_add_ps(b0, b1)) * scale;
    }
    if (p < m) sc[p] = fmoe__dot_f32_avx2(q, k, D) * scale;
}

SIMD static void attn_scores_simd(const float *const *q, int G, const float *k, int64_t kv_stride,
                                  int32_t m, int32_t D, float scale, float *sc, int64_t sc_stride) {
    int g = 0;
    for (; g + 4 <= G; g += 4)
        scores4(q[g], q[g + 1], q[g + 2], q[g + 3], k, kv_stride, m, D, scale, sc + g * sc_stride,
                sc_stride);
    for (; g < G; g++) scores1(q[g], k, kv_stride, m, D, scale, sc + g * sc_stride);
}

/* out[0..D) = Σ_{p<m} s[p]·v[p·kv_stride ..], D a multiple of 16 (sums from zero). */
SIMD static void attn_values_simd(const float *s, const float *v, int64_t kv_stride, int32_t m,
                                  int32_t D, float *out) {
    int32_t i = 0;
    for (; i + 64 <= D; i += 64) {
        __m256 r0 = _mm256_setzero_ps(), r1 = r0, r2 = r0, r3 = r0, r4 = r0, r5 = r0, r6 = r0,
               r7 = r0;
        const float *vp = v + i;
        for (int32_t p = 0; p < m; p++, vp += kv_stride) {
            const __m256 a = _mm256_set1_ps(s[p]);
            r0 = _mm256_fmadd_ps(a, _mm256_loadu_ps(vp), r0);
            r1 = _mm256_fmadd_ps(a, _mm256_loadu_ps(vp + 8), r1);
            r2 = _mm256_fmadd_ps(a, _mm256_loadu_ps(vp + 16), r2);
            r3 = _mm256_fmadd_ps(a, _mm256_loadu_ps(vp + 24), r3);
            r4 = _mm256_fmadd_ps(a, _mm256_loadu_ps(vp + 32), r4);
            r5 = _mm256_fmadd_ps(a, _mm256_loadu_ps(vp + 40), r5);
            r6 = _mm256_fmadd_ps(a, _mm256_loadu_ps(vp + 48), r6);
            r7 = _mm256_fmadd_ps(a, _mm256_loadu_ps(vp + 56), r7);
        }
        _mm256_storeu_ps(out + i, r0);
        _mm256_storeu_ps(out + i + 8, r1);
        _mm256_storeu_ps(out + i + 16, r2);
        _mm256_storeu_ps(out + i + 24, r3);
        _mm256_storeu_ps(out + i + 32, r4);
        _mm256_storeu_ps(out + i + 40, r5);
        _mm256_storeu_ps(out + i + 48, r6);
        _mm256_storeu_ps(out + i + 56, r7);
    }
    for (; i < D; i += 16) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0;
        const float *vp = v + i;
        for (int32_t p = 0; p < m; p++, vp += kv_stride) {
            const __m256 a = _mm256_set1_ps(s[p]);
            a0 = _mm256_fmadd_ps(a, _mm256_loadu_ps(vp), a0);
            a1 = _mm256_fmadd_ps(a, _mm256_loadu_ps(vp + 8), a1);
        }
        _mm256_storeu_ps(out + i, a0);
        _mm256_storeu_ps(out + i + 8, a1);
    }
}
#endif

/* Query heads [h0, h0 + G) of query token t: they share key/value head hk, whose rows are
 * read once for all G. Each head's scores, softmax and sum are the per-head computation's:
 * the same dots and FMAs in the same order, so the bits do not depend on G (nor on the
 * thread count, which G follows). */
static void attn_task(void *arg, int32_t task, int32_t worker) {
    attn_job *j = arg;
    const fmoe__attn_args *a = j->a;
    const int32_t G = j->G, per_token = a->n_heads / G;
    const int32_t t = task / per_token, h0 = task % per_token * G;
    const int32_t group = a->n_heads / a->n_kv_heads, hk = h0 / group;
    const int32_t D = a->head_dim;
    const int64_t kv_stride = (int64_t)a->n_kv_heads * D, ctx = j->c->max_context;
    const int32_t pos = a->pos0 + t;
    int32_t lo = 0;
    if (a->window > 0 && pos - a->window + 1 > 0) lo = pos - a->window + 1;
    const float *q[ATTN_GROUP];
    for (int32_t g = 0; g < G; g++) q[g] = a->q + (int64_t)t * a->n_heads * D + (int64_t)(h0 + g) * D;
    const float *k = a->k_cache + (int64_t)lo * kv_stride + (int64_t)hk * D;
    const float *v = a->v_cache + (int64_t)lo * kv_stride + (int64_t)hk * D;
    float *sc = j->c->scores[worker];
    const int32_t m = pos - lo + 1;
#if HAVE_X86
    const int fast = j->c->simd && D % 16 == 0;
#else
    const int fast = 0;
#endif
#if HAVE_X86
    if (fast) attn_scores_simd(q, G, k, kv_stride, m, D, a->scale, sc, ctx);
#endif
    if (!fast)
        for (int32_t p = 0; p < m; p++)
            for (int32_t g = 0; g < G; g++)
                sc[g * ctx + p] = dot_f32(j->c, q[g], k + (int64_t)p * kv_stride, D) * a->scale;
    for (int32_t g = 0; g < G; g++) {
        float *sg = sc + g * ctx;
        if (a->sinks)
            fmoe_softmax_row_sink(sg, sg, m, a->sinks[h0 + g]);
        else
            fmoe_softmax_row(sg, sg, m);
        float *out = a->out + (int64_t)t * a->n_heads * D + (int64_t)(h0 + g) * D;
#if HAVE_X86
        if (fast) {
            attn_values_simd(sg, v, kv_stride, m, D, out);
            continue;
        }
#endif
        memset(out, 0, (size_t)D * sizeof *out);
        for (int32_t p = 0; p < m; p++) axpy(j->c, out, sg[p], v + (int64_t)p * kv_stride, D);
    }
}

int32_t fmoe__cpu_threads(const void *ctx) { return ((const cpu_ctx *)ctx)->threads; }

float fmoe__cpu_dot(const void *ctx, const float *a, const float *b, int64_t n) {
    return dot_f32(ctx, a, b, n);
}

void fmoe__cpu_axpy(const void *ctx, float *y, float a, const float *x, int64_t n) {
    axpy(ctx, y, a, x, n);
}

void fmoe__cpu_run(void *ctx, fmoe__task_fn fn, void *arg, int32_t tasks) {
    fmoe__pool_run(((cpu_ctx *)ctx)->pool, fn, arg, tasks);
}

void fmoe__cpu_matmul(void *ctx, const fmoe__mat *w, const float *x, int32_t n, float *y) {
    cpu_matmul(ctx, w, x, n, y);
}

fmoe__cpu_fused *fmoe__cpu_fused_of(void *ctx) { return ((cpu_ctx *)ctx)->fused; }

int fmoe__cpu_act8(const void *ctx) { return ((const cpu_ctx *)ctx)->act8; }

int64_t fmoe__cpu_act8_pass(const void *ctx, const fmoe__mat *W) {
    const cpu_ctx *c = ctx;
    if (!c->act8 || !W->quant || !fmoe_quant_act_supported(W->quant)) return 0;
    const int64_t qb = fmoe_quant_act_bytes(W->quant, W->cols);
    /* cpu_matmul hands fmoe__quant_matvec scratch[0] of block_rows·max_cols floats */
    return qb > 0 ? (int64_t)c->block_rows * c->max_cols * (int64_t)sizeof(float) / qb : 0;
}

double fmoe__cpu_min_work(const void *ctx) { return ((const cpu_ctx *)ctx)->min_work; }

void fmoe__cpu_dots_u16(const void *ctx, const uint16_t *w, fmoe_st_dtype dt, const float *x,
                        int64_t ld, int32_t nx, int64_t n, float *y, int64_t ystride) {
    dots_u16(ctx, w, dt, x, ld, nx, n, y, ystride);
}

static void cpu_attention(void *ctx, const fmoe__attn_args *a) {
    cpu_ctx *c = ctx;
    /* Query heads per task: the most (up to ATTN_GROUP, dividing a key/value head's) that
     * still give every thread a task (a decode step of 8 query heads over 2 key/value heads:
     * 2 tasks of 4 heads at 1 or 2 threads, 4 of 2 at 3 or 4) */
    const int32_t group = a->n_heads / a->n_kv_heads;
    int32_t G = group < ATTN_GROUP ? group : ATTN_GROUP;
    while (G > 1 && (group % G != 0 || (int64_t)a->n * (a->n_heads / G) < c->threads)) G--;
    attn_job j = {c, a, G};
    const int32_t tasks = a->n * (a->n_heads / G);
    const double work = (double)a->n * a->n_heads * (double)(a->pos0 + a->n) * a->head_dim;
    if (work < c->min_work) {
        for (int32_t t = 0; t < tasks; t++) attn_task(&j, t, 0);
        return;
    }
    fmoe__pool_run(c->pool, attn_task, &j, tasks);
}

/* ---------------------------------------------------------------------------------- */
/* Row-wise and element-wise ops: lib/rowwise.h and fmoe/elementwise.h as the CUDA      */
/* kernels run them, one row at a time on the calling thread (they are O(n·h) against    */
/* the products' O(n·h·cols))                                                            */
/* ---------------------------------------------------------------------------------- */

static void cpu_rmsnorm(void *ctx, float *y, const float *x, const float *w, int64_t rows,
                        int32_t dim, float eps) {
    (void)ctx;
    for (int64_t r = 0; r < rows; r++) fmoe_rmsnorm_row(y + r * dim, x + r * dim, w, dim, eps);
}

static void cpu_add_bias(void *ctx, float *y, const float *b, int32_t n, int64_t d) {
    (void)ctx;
    for (int32_t t = 0; t < n; t++)
        for (int64_t i = 0; i < d; i++) y[t * d + i] += b[i];
}

static void cpu_clamp(void *ctx, float *y, int64_t count, float c) {
    (void)ctx;
    for (int64_t i = 0; i < count; i++) y[i] = y[i] < -c ? -c : y[i] > c ? c : y[i];
}

/* fmoe_rope_head over the first rot_dim of each head: the rotate-half pairs (i, i +
 * rot_dim/2) of that part, as transformers' apply_rotary_pos_emb on q[..., :rotary_dim]. */
static void cpu_rope_partial(void *ctx, float *x, int32_t n, int32_t heads, int32_t head_dim,
                             int32_t rot_dim, const float *cos, const float *sin) {
    (void)ctx;
    const int32_t half = rot_dim / 2;
    const int64_t stride = (int64_t)heads * head_dim;
    for (int32_t t = 0; t < n; t++)
        for (int32_t hh = 0; hh < heads; hh++)
            fmoe_rope_head(x + t * stride + (int64_t)hh * head_dim, cos + (int64_t)t * half,
                           sin + (int64_t)t * half, rot_dim);
}

static void cpu_rope(void *ctx, float *x, int32_t n, int32_t heads, int32_t head_dim,
                     const float *cos, const float *sin) {
    cpu_rope_partial(ctx, x, n, heads, head_dim, head_dim, cos, sin);
}

static void cpu_layernorm(void *ctx, float *y, const float *x, const float *w, const float *b,
                          int64_t rows, int32_t dim, float eps) {
    (void)ctx;
    for (int64_t r = 0; r < rows; r++)
        fmoe_layernorm_row(y + r * dim, x + r * dim, w, b, dim, eps);
}

static void cpu_route(void *ctx, const fmoe__route_args *a, const float *logits, float *probs,
                      int32_t *topk, float *topw) {
    (void)ctx;
    const int64_t J = a->num_experts, K = a->top_k;
    const int plain = a->n_group <= 1 && !a->bias && !a->sparsemixer;
    for (int32_t t = 0; t < a->n; t++)
        fmoe_route_row_grouped(logits + t * J, (int32_t)J, (int32_t)K, a->sigmoid, a->norm,
                               a->norm_eps, a->scale, a->n_group, a->topk_group,
                               a->group_top2, a->bias, a->sparsemixer, a->jitter_eps,
                               probs + t * J,
                               plain ? probs + t * J : a->choice + t * J, topk + t * K,
                               topw + t * K);
}

static void cpu_probs(void *ctx, float *y, int64_t y_stride, const float *x, int32_t n,
                      int32_t J, int32_t sigmoid) {
    (void)ctx;
    for (int32_t t = 0; t < n; t++) {
        float *dst = y + t * y_stride;
        const float *src = x + (int64_t)t * J;
        if (sigmoid)
            for (int32_t j = 0; j < J; j++) dst[j] = fmoe_sigmoid(src[j]);
        else
            fmoe_softmax_row(dst, src, J);
    }
}

static void cpu_swiglu(void *ctx, float *g, const float *u, int64_t count) {
    (void)ctx;
    for (int64_t i = 0; i < count; i++) g[i] = fmoe_swiglu(g[i], u[i]);
}

static void cpu_swiglu_clamped(void *ctx, float *g, const float *u, int64_t count, float alpha,
                               float limit) {
    (void)ctx;
    for (int64_t i = 0; i < count; i++) g[i] = fmoe_swiglu_clamped(g[i], u[i], alpha, limit);
}

static void cpu_gather_rows(void *ctx, float *dst, const float *src, const int32_t *rows_host,
                            int32_t n, int32_t dim) {
    (void)ctx;
    for (int32_t r = 0; r < n; r++)
        memcpy(dst + (int64_t)r * dim, src + (int64_t)rows_host[r] * dim,
               (size_t)dim * sizeof(float));
}

static void cpu_scatter_add(void *ctx, float *acc, const float *src, const int32_t *rows_host,
                            const float *scale_host, int32_t n, int32_t dim) {
    (void)ctx;
    for (int32_t r = 0; r < n; r++) {
        const float wt = scale_host[r];
        float *d = acc + (int64_t)rows_host[r] * dim;
        const float *x = src + (int64_t)r * dim;
        for (int32_t i = 0; i < dim; i++) d[i] += wt * x[i];
    }
}

static void cpu_add(void *ctx, float *y, const float *x, int64_t count) {
    (void)ctx;
    for (int64_t i = 0; i < count; i++) y[i] += x[i];
}

static void cpu_add_gated(void *ctx, float *y, const float *x, const float *gate, int32_t n,
                          int32_t dim) {
    (void)ctx;
    for (int32_t t = 0; t < n; t++) {
        const float gt = fmoe_sigmoid(gate[t]);
        for (int32_t i = 0; i < dim; i++) y[(int64_t)t * dim + i] += gt * x[(int64_t)t * dim + i];
    }
}

/* ---------------------------------------------------------------------------------- */
/* Transfers: buffers are host memory, so each is a memcpy                              */
/* ---------------------------------------------------------------------------------- */

static void cpu_upload(void *ctx, void *dst, const void *src, int64_t bytes) {
    (void)ctx;
    memcpy(dst, src, (size_t)bytes);
}

static int cpu_download(void *ctx, void *dst, const void *src, int64_t bytes) {
    (void)ctx;
    if (dst != src) memcpy(dst, src, (size_t)bytes);
    return 0;
}

static void cpu_copy(void *ctx, void *dst, const void *src, int64_t bytes) {
    (void)ctx;
    memmove(dst, src, (size_t)bytes);
}

static void cpu_zero(void *ctx, void *dst, int64_t bytes) {
    (void)ctx;
    memset(dst, 0, (size_t)bytes);
}

static int cpu_sync(void *ctx) {
    (void)ctx;
    return 0;
}

/* ---------------------------------------------------------------------------------- */
/* Timers: every op has run when it returns, so a mark is the host clock now            */
/* ---------------------------------------------------------------------------------- */

static void cpu_mark(void *ctx, int32_t slot) {
    cpu_ctx *c = ctx;
    if (slot < 0 || slot >= c->max_marks) return;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    c->marks[slot] = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cpu_elapsed(void *ctx, int32_t a, int32_t b, double *seconds) {
    const cpu_ctx *c = ctx;
    FMOE_RETURN_ERROR_IF(a < 0 || a >= c->max_marks || b < 0 || b >= c->max_marks,
                         FMOE_EINVAL, "elapsed: marks %d and %d, slots are [0, %d)", a, b,
                         c->max_marks);
    FMOE_RETURN_ERROR_IF(isnan(c->marks[a]) || isnan(c->marks[b]), FMOE_EINVAL,
                         "elapsed: mark %d was never recorded", isnan(c->marks[a]) ? a : b);
    *seconds = c->marks[b] - c->marks[a];
    return 0;
}

static int cpu_write_slot(void *ctx, void *dst, const void *src, int64_t bytes) {
    (void)ctx;
    memcpy(dst, src, (size_t)bytes);
    return 0;
}

static int cpu_host_register(void *ctx, void *p, int64_t bytes) {
    (void)ctx, (void)p, (void)bytes;
    return 0;
}

static void cpu_host_unregister(void *ctx, void *p) { (void)ctx, (void)p; }

/* Slot fences (backend_impl.h): every op has run when it returns, so a slot's reads are over
 * before anyone could rewrite it. fence_new hands out one placeholder, never NULL. */
static char cpu_fence_placeholder;

static void *cpu_fence_new(void *ctx) {
    (void)ctx;
    return &cpu_fence_placeholder;
}

static void cpu_fence_free(void *ctx, void *fence) { (void)ctx, (void)fence; }

static int cpu_fence_record(void *ctx, void *fence) {
    (void)ctx, (void)fence;
    return 0;
}

static int cpu_fence_wait(void *ctx, void *fence) {
    (void)ctx, (void)fence;
    return 0;
}

/* ---------------------------------------------------------------------------------- */
/* Lifetime                                                                           */
/* ---------------------------------------------------------------------------------- */

static void cpu_free(void *ctx) {
    cpu_ctx *c = ctx;
    if (!c) return;
    fmoe__pool_free(c->pool);
    fmoe__cpu_fused_free(c->fused);
    for (int32_t i = 0; i < c->threads; i++) {
        if (c->scratch) free(c->scratch[i]);
        if (c->scores) free(c->scores[i]);
    }
    free(c->scratch);
    free(c->scores);
    free(c->xpack);
    free(c->marks);
    free(c);
}

/* OpenBLAS on one thread, and its own workers stopped. The pthreads build starts a worker
 * per core when it loads, and each spins, yielding, for its thread timeout (about 0.1 s)
 * before it sleeps. fmoe calls OpenBLAS on one thread per pool worker, so those workers
 * never get work, but while they spin they take a core from the pool: a 2-thread decode
 * of 31 tokens right after the load ran at 391 tokens/s against 548 with
 * OPENBLAS_NUM_THREADS=1 (docs/cpu.md, Threads). blas_thread_shutdown_ (OpenBLAS's own,
 * which its fork handler uses) stops them, and openblas_set_num_threads starts them again
 * whenever it is called (even with 1), so it is called only to change the count (fmoe
 * calibrate raises it for its own products, and the next CPU backend lowers it and stops
 * the workers again). Stopping waits for nothing: OpenBLAS on one thread never hands them
 * work. Weak, so a BLAS without it links and keeps its threads. */
extern void blas_thread_shutdown_(void) __attribute__((weak));
static void blas_one_thread(void) {
    if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
    if (blas_thread_shutdown_) blas_thread_shutdown_();
}

static int cpu_init(const fmoe__backend_limits *lim, void **out) {
    cpu_ctx *c = calloc(1, sizeof *c);
    if (!c) return fmoe_error_set(FMOE_ENOMEM, "out of memory");
    int32_t threads = lim->threads;
    if (threads <= 0) {
        long nc = sysconf(_SC_NPROCESSORS_ONLN);
        threads = nc > 0 ? (int32_t)nc : 1;
    }
    if (threads > 256) threads = 256;
    c->threads = threads;
    c->max_cols = lim->max_cols;
    c->max_context = lim->max_context;
    c->max_batch = lim->max_batch;
    /* ~1 MiB of widened rows per block, at least 16 rows. */
    int64_t br = (256 * 1024) / (lim->max_cols > 0 ? lim->max_cols : 1);
    c->block_rows = (int32_t)(br < 16 ? 16 : br > 1024 ? 1024 : br);
    c->act8 = lim->activations == FMOE_ACTIVATIONS_Q8;
    c->min_work = PARALLEL_MIN_WORK;
    const char *mw = getenv("FMOE_CPU_MIN_WORK");
    if (mw && *mw) c->min_work = atof(mw);
#if HAVE_X86
    __builtin_cpu_init();
    unsigned eax, ebx, ecx = 0, edx; /* F16C from CPUID: clang 14 lacks the builtin's "f16c" */
    const int f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C);
    c->simd = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
    c->simd512 = __builtin_cpu_supports("avx512f") && getenv("FMOE_NO_AVX512") == NULL;
    if (c->simd512 && lim->max_batch > 0 && lim->max_cols > 0) {
        const int64_t bytes = (int64_t)lim->max_batch * lim->max_cols * 4;
        c->xpack = aligned_alloc(64, (size_t)((bytes + 63) / 64 * 64));
        if (!c->xpack) goto oom;
    }
#endif
    c->max_marks = lim->max_marks > 0 ? lim->max_marks : 0;
    if (c->max_marks > 0) {
        if (!(c->marks = malloc((size_t)c->max_marks * sizeof *c->marks))) goto oom;
        for (int32_t i = 0; i < c->max_marks; i++) c->marks[i] = NAN;
    }
    c->scratch = calloc((size_t)threads, sizeof *c->scratch);
    c->scores = calloc((size_t)threads, sizeof *c->scores);
    if (!c->scratch || !c->scores) goto oom;
    for (int32_t i = 0; i < threads; i++) {
        c->scratch[i] = aligned_alloc(64, (size_t)((c->block_rows * lim->max_cols * 4 + 63) / 64 * 64));
        c->scores[i] = aligned_alloc(64, (size_t)((ATTN_GROUP * lim->max_context * 4 + 63) / 64 * 64));
        if (!c->scratch[i] || !c->scores[i]) goto oom;
    }
    int rc = fmoe__pool_init(threads, &c->pool);
    if (rc == 0 && !getenv("FMOE_CPU_UNFUSED")) {
        /* a pass's expert rows: a decode step's FUSED_MAX_N tokens, or with 8-bit inputs up
         * to max_batch (prefill's FUSED_PREFILL_N at most), top_k each, and the shared one.
         * The prefill rows cost memory: ~46 MB at Mixtral-8x7B's widths (192 rows of 14336,
         * where a decode step's 12 took ~3.5 MB) */
        const int32_t k = lim->max_batch > 0 ? lim->max_experts / lim->max_batch : 0;
        int32_t n = lim->max_batch < FMOE__CPU_FUSED_PREFILL_N ? lim->max_batch
                                                                : FMOE__CPU_FUSED_PREFILL_N;
        if (!c->act8 || n < FMOE__CPU_FUSED_MAX_N) n = FMOE__CPU_FUSED_MAX_N;
        rc = fmoe__cpu_fused_init(threads, lim->max_cols > 0 ? lim->max_cols : 1, n,
                                    n * (k > 0 ? k : 1) + n, &c->fused);
    }
    if (rc < 0) {
        cpu_free(c);
        return rc;
    }
    blas_one_thread();
    *out = c;
    return 0;
oom:
    cpu_free(c);
    return fmoe_error_set(FMOE_ENOMEM, "out of memory for CPU scratch");
}

static void *cpu_alloc(void *ctx, int64_t bytes) {
    (void)ctx;
    const size_t size = bytes > 64 ? (size_t)((bytes + 63) / 64 * 64) : 64;
    void *p = aligned_alloc(64, size);
    if (p) memset(p, 0, size);
    return p;
}

static void cpu_release(void *ctx, void *p) {
    (void)ctx;
    free(p);
}

const fmoe__backend_ops fmoe__cpu_backend = {
    .name = "cpu",
    .host_memory = 1,
    .init = cpu_init,
    .free = cpu_free,
    .alloc = cpu_alloc,
    .release = cpu_release,
    .upload = cpu_upload,
    .download = cpu_download,
    .copy = cpu_copy,
    .zero = cpu_zero,
    .sync = cpu_sync,
    .mark = cpu_mark,
    .elapsed = cpu_elapsed,
    .get_rows = cpu_get_rows,
    .rmsnorm = cpu_rmsnorm,
    .matmul = cpu_matmul,
    .add_bias = cpu_add_bias,
    .clamp = cpu_clamp,
    .rope = cpu_rope,
    .attention = cpu_attention,
    .route = cpu_route,
    .layernorm = cpu_layernorm,
    .probs = cpu_probs,
    .swiglu = cpu_swiglu,
    .gather_rows = cpu_gather_rows,
    .scatter_add = cpu_scatter_add,
    .add = cpu_add,
    .add_gated = cpu_add_gated,
    .write_slot = cpu_write_slot,
    .host_register = cpu_host_register,
    .host_unregister = cpu_host_unregister,
    .fence_new = cpu_fence_new,
    .fence_free = cpu_fence_free,
    .fence_record = cpu_fence_record,
    .fence_wait = cpu_fence_wait,
    .mla_attention = fmoe__cpu_mla_attention,
    .swiglu_clamped = cpu_swiglu_clamped,
    .rope_partial = cpu_rope_partial,
    .moe_experts = fmoe__cpu_moe_experts,
    .matmul_same_input = fmoe__cpu_matmul_same_input,
};
