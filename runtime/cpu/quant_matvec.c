/*
 * quant_matvec.c - quantized matrix times f32 vectors over the thread pool
 * (quant_matvec.h). Chunks of 16 rows: small enough to balance a decode step's few
 * thousand rows over the workers, large enough that a task is not dominated by the pool's
 * hand-off; each chunk's rows stay in L1/L2 while the nx inputs stream past.
 */
#include "quant_matvec.h"

#include "fmoe/quant.h"

#define CHUNK_ROWS 16

typedef struct job {
    uint32_t type;
    const uint8_t *W;
    int64_t rows, cols, row_bytes;
    const float *x;
    int32_t nx;
    int64_t ldx;
    float *y;
    int64_t ldy;
    float *const *scratch; /* [workers][cols] or NULL */
} job;

static void run_chunk(void *ctx, int32_t task, int32_t worker) {
    const job *j = ctx;
    const int64_t r0 = (int64_t)task * CHUNK_ROWS;
    const int64_t r1 = r0 + CHUNK_ROWS < j->rows ? r0 + CHUNK_ROWS : j->rows;
    const int widen = j->scratch && j->nx >= QUANT_MATVEC_WIDEN_MIN;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = j->W + r * j->row_bytes;
        if (widen) {
            float *w = j->scratch[worker];
            fmoe_quant_dequantize_row(j->type, row, w, j->cols);
            for (int32_t t = 0; t < j->nx; t++)
                j->y[t * j->ldy + r] = fmoe_quant_dot(FMOE_GGML_F32, w, j->x + t * j->ldx, j->cols);
        } else {
            for (int32_t t = 0; t < j->nx; t++)
                j->y[t * j->ldy + r] = fmoe_quant_dot(j->type, row, j->x + t * j->ldx, j->cols);
        }
    }
}

void fmoe__quant_matvec(fmoe__pool *pool, uint32_t type, const void *W, int64_t rows,
                        int64_t cols, const float *x, int32_t nx, int64_t ldx, float *y,
                        int64_t ldy, float *const *scratch) {
    job j = {.type = type, .W = W, .rows = rows, .cols = cols,
             .row_bytes = fmoe_quant_row_bytes(type, cols), .x = x, .nx = nx, .ldx = ldx,
             .y = y, .ldy = ldy, .scratch = scratch};
    const int32_t tasks = (int32_t)((rows + CHUNK_ROWS - 1) / CHUNK_ROWS);
    if (!pool || tasks <= 1) {
        for (int32_t t = 0; t < tasks; t++) run_chunk(&j, t, 0);
        return;
    }
    fmoe__pool_run(pool, run_chunk, &j, tasks);
}
