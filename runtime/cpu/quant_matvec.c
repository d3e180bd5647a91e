/*
 * quant_matvec.c - quantized matrix times f32 vectors over the thread pool
 * (quant_matvec.h). Chunks of 16 rows where many inputs stream past (each chunk's rows stay
 * in L1/L2 meanwhile); with a decode step's one to four inputs, one chunk per thread
 * (fmoe__quant_matvec_chunk: a call per 16 rows was ~7,000 kernel dispatches a token on
 * the small benchmark model, 2,000 of them the output head's).
 *
 * The 8-bit path quantises the inputs on the calling thread before the workers start:
 * O(nx·cols) against the product's O(nx·rows·cols), and every worker then reads the same
 * quantised inputs (nx·cols·1.14 bytes: 130 KB for 32 inputs of 3584, L2-resident).
 */
#include "quant_matvec.h"

#include <stddef.h>

#include "fmoe/quant.h"
#include "fmoe/quant_act.h"
#include "quant_widen.h"

#define CHUNK_ROWS 16
#define CHUNK_INPUTS 4     /* inputs the 8-bit kernels take in one pass over the rows */

typedef struct job {
    uint32_t type;
    const uint8_t *W;
    int64_t rows, cols, row_bytes;
    const float *x;         /* f32 inputs, or NULL on the 8-bit path */
    const uint8_t *qx;      /* [nx][qx_bytes] 8-bit inputs on the 8-bit path */
    int64_t qx_bytes;
    int32_t nx;
    int64_t ldx;
    float *y;
    int64_t ldy;
    float *const *scratch; /* [workers][cols] or NULL */
    int64_t chunk;          /* rows per task */
} job;

/* A decode step's rows go to the threads as one run each, a multiple of CHUNK_ROWS. They
 * had been split into eight chunks a thread (so that a thread the VM stalled for a while
 * held up at most an eighth of its share; the pool's claims still let the others take
 * unclaimed chunks): every chunk then began with data the prefetchers had not asked for
 * and ended with requests in rows another thread read, and the threads' runs through
 * memory were 36 KiB long on the 1024-wide benchmark model. One run a thread, the 8-layer
 * files of docs/quantization.md ("Per type against llama.cpp"), 2 threads, decode
 * tokens/s medians of 5 interleaved runs: Q4_K 519 -> 604, IQ4_NL 475 -> 585, Q4_0 490
 * -> 549 (llama.cpp 525, 522, 578 in the same runs); two runs a thread were in between. A
 * late thread's run is taken by the one that is not (threadpool.c), as before. */
int64_t fmoe__quant_matvec_chunk(int32_t threads, int64_t rows, int32_t nx) {
    if (nx > CHUNK_INPUTS) return CHUNK_ROWS;
    const int64_t t = threads > 1 ? threads : 1;
    const int64_t c = ((rows + t - 1) / t + CHUNK_ROWS - 1) / CHUNK_ROWS * CHUNK_ROWS;
    return c > CHUNK_ROWS ? c : CHUNK_ROWS;
}

void fmoe__quant_matvec_rows(uint32_t type, const void *W, int64_t row_bytes, int64_t r0,
                             int64_t r1, int64_t cols, const float *x, int64_t ldx,
                             const void *qx, int64_t qx_bytes, int32_t nx, float *y,
                             int64_t ldy, float *widen_row) {
    const uint8_t *Wb = W;
    if (qx) {
        fmoe_quant_act_matvec(type, Wb + r0 * row_bytes, row_bytes, r1 - r0, qx, qx_bytes, nx,
                              cols, y + r0, ldy);
        return;
    }
    const int widen = widen_row && nx >= QUANT_MATVEC_WIDEN_MIN;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = Wb + r * row_bytes;
        if (widen) {
            fmoe__quant_widen_rows(type, row, 1, cols, widen_row);
            for (int32_t t = 0; t < nx; t++)
                y[t * ldy + r] = fmoe_quant_dot(FMOE_GGML_F32, widen_row, x + t * ldx, cols);
        } else {
            for (int32_t t = 0; t < nx; t++)
                y[t * ldy + r] = fmoe_quant_dot(type, row, x + t * ldx, cols);
        }
    }
}

static void run_chunk(void *ctx, int32_t task, int32_t worker) {
    const job *j = ctx;
    const int64_t r0 = (int64_t)task * j->chunk;
    const int64_t r1 = r0 + j->chunk < j->rows ? r0 + j->chunk : j->rows;
    fmoe__quant_matvec_rows(j->type, j->W, j->row_bytes, r0, r1, j->cols, j->x, j->ldx, j->qx,
                            j->qx_bytes, j->nx, j->y, j->ldy,
                            j->scratch ? j->scratch[worker] : NULL);
}

static void run(fmoe__pool *pool, job *j) {
    j->chunk = fmoe__quant_matvec_chunk(fmoe__pool_threads(pool), j->rows, j->nx);
    const int32_t tasks = (int32_t)((j->rows + j->chunk - 1) / j->chunk);
    if (!pool || tasks <= 1) {
        for (int32_t t = 0; t < tasks; t++) run_chunk(j, t, 0);
        return;
    }
    fmoe__pool_run(pool, run_chunk, j, tasks);
}

void fmoe__quant_matvec(fmoe__pool *pool, uint32_t type, const void *W, int64_t rows,
                        int64_t cols, const float *x, int32_t nx, int64_t ldx, float *y,
                        int64_t ldy, float *const *scratch, int64_t scratch_floats, int act8) {
    job j = {.type = type, .W = W, .rows = rows, .cols = cols,
             .row_bytes = fmoe_quant_row_bytes(type, cols), .x = x, .nx = nx, .ldx = ldx,
             .y = y, .ldy = ldy, .scratch = scratch};
    const int64_t qb = fmoe_quant_act_bytes(type, cols);
    const int64_t fit = act8 && scratch && qb > 0 ? scratch_floats * (int64_t)sizeof(float) / qb : 0;
    if (fit < 1) {
        run(pool, &j);
        return;
    }
    /* 8-bit inputs, as many per pass as scratch[0] holds */
    uint8_t *qx = (uint8_t *)scratch[0];
    j.x = NULL;
    j.qx = qx;
    j.qx_bytes = qb;
    for (int32_t t0 = 0; t0 < nx; t0 += (int32_t)fit) {
        const int32_t m = nx - t0 < fit ? nx - t0 : (int32_t)fit;
        for (int32_t t = 0; t < m; t++)
            fmoe_quant_act_quantize(type, x + (t0 + t) * ldx, qx + t * qb, cols);
        j.nx = m;
        j.y = y + t0 * ldy;
        run(pool, &j);
    }
}
