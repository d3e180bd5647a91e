/*
 * cpu_fused.c - a MoE layer's experts in two pool jobs (fmoe__backend_ops.moe_experts)
 * when a pass has a few rows (a decode step), or up to FMOE__CPU_FUSED_PREFILL_N rows
 * with 8-bit inputs (prefill).
 *
 * Why. Run expert by expert, a decode step of DeepSeek-V2-Lite (6 routed experts and a
 * shared one, 26 layers) is 3 products per expert plus the element-wise ops between them,
 * each product one pool job: ~570 jobs a token, each ending in a wait for the slowest
 * thread, with the gathers, SwiGLUs and scatters run by the caller alone in between while
 * the other threads spin or fall asleep. llama.cpp runs the same layer as three
 * MUL_MAT_ID nodes over all chosen experts. Here:
 *
 *   job 1  every (expert, chunk of rows of I): its gate and up rows for the expert's
 *          tokens, their biases, the SwiGLU, and (8-bit inputs) each block of those values
 *          quantised for down by the task that finishes the block
 *   job 2  every chunk of rows of h: each expert's down rows, its bias, and the
 *          weighted sum into acc, expert after expert in the order given
 *
 * Chunks are fmoe__quant_matvec_chunk's: 16 rows in prefill, in a decode step one per
 * thread, each a kernel call.
 *
 * Bits. Every output is computed by the kernel cpu_matmul picks for the same product and
 * row count (fmoe__quant_matvec_rows, or the bf16/f16 dots), each row's dot on one thread;
 * biases, SwiGLU and the weighted sum run per element in the loop's order (acc gets expert
 * after expert, the shared expert last, 1·y being y). So the layer's result is the
 * per-expert loop's bit for bit, whatever the thread count: tests/python/test_threads.py
 * compares logits both ways at 1, 2 and 3 threads, for decode steps and prefill.
 * Quantising gate's SwiGLU outputs in job 1 is exact too: the 8-bit formats (Q8_0, Q8_K)
 * quantise each block on its own, once all of its rows are in.
 *
 * Prefill. The loop ran 3 jobs per expert (24 a layer for 8 experts), and between them the
 * caller alone gathered, quantised the same rows twice (gate, up), took the SwiGLU,
 * quantised for down and scattered: the second thread idled through all of that. With
 * 8-bit inputs (the commands' --activations q8) the loop's products of any row count call
 * the kernels product() calls, so the fused path takes a prefill pass too, up to the
 * scratch's rows (FMOE__CPU_FUSED_PREFILL_N tokens: the default max_batch).
 *
 * It declines what it would not compute the same way: more than FMOE__CPU_FUSED_MAX_N rows
 * with a matrix off the 8-bit path or with more inputs than cpu_matmul quantises in one
 * pass (prefill's other kernels), f32 matrices (OpenBLAS's sgemv, whose bits may depend on
 * the slice), rows or widths beyond the scratch.
 */
#include "cpu_fused.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_mla.h"
#include "fmoe/elementwise.h"
#include "fmoe/error.h"
#include "fmoe/quant_act.h"
#include "quant_matvec.h"

#define MAX_QTYPES 3  /* gate/up types whose 8-bit inputs one call may need */

typedef struct entry {
    const fmoe__mlp *w;
    int32_t c, off;           /* its rows, and the first of them in the scratch rows */
    const int32_t *rows;      /* [c] token rows, or NULL: 0.. (the shared expert) */
    const float *scale;       /* [c] combine weights, or NULL: 1 */
    const uint8_t *qgate, *qup; /* its c 8-bit input rows for gate/up, qrow apart, or NULL */
    int32_t down_act;         /* down takes 8-bit inputs (qg) */
    int64_t chunk;            /* job-1 rows of I per task, a multiple of 16 */
    int32_t first_task;       /* its first job-1 task */
    int32_t first_block;      /* its first counter in `done` (down_act) */
} entry;

struct fmoe__cpu_fused {
    int32_t threads, max_n, max_rows;
    int64_t max_cols, qrow;  /* floats of a scratch row; bytes of an 8-bit one */
    float *g, *u, *y;        /* [max_rows][max_cols] each: gate (then SwiGLU), up, down
                                outputs */
    float *x;                /* [x_rows][max_cols] gathered f32 inputs: only a decode
                                step's rows take them (prefill's are 8-bit) */
    int32_t x_rows;
    uint8_t *qx;             /* [MAX_QTYPES][max_n][qrow] xn, 8-bit */
    uint8_t *qg;             /* [max_rows][qrow] SwiGLU rows, 8-bit for down */
    uint8_t *qin[2];         /* [max_rows][qrow] each: routed experts' 8-bit input rows
                                for gate and up, gathered so that one kernel call takes
                                all of an expert's rows (each block unpacked once) */
    float *widen;            /* [threads][max_cols] a row widened (f32 inputs, 4 rows) */
    entry *e;                /* [max_rows + 1] */
    _Atomic int32_t *done;   /* [max_blocks] rows of each 8-bit block of down's input that
                                job 1 has finished (an expert's blocks, expert after expert) */
    int64_t max_blocks;
};

int fmoe__cpu_fused_init(int32_t threads, int64_t max_cols, int32_t max_n, int32_t max_rows,
                           fmoe__cpu_fused **out) {
    *out = NULL;
    fmoe__cpu_fused *x = calloc(1, sizeof *x);
    if (!x) return fmoe_error_set(FMOE_ENOMEM, "out of memory");
    x->threads = threads;
    x->max_n = max_n;
    x->max_rows = max_rows;
    x->max_cols = max_cols;
    /* Q8_K: 292 bytes per 256 values, Q8_0: 34 per 32; whole blocks */
    x->qrow = (max_cols + 255) / 256 * 292 + 64;
    const size_t rows = (size_t)max_rows * (size_t)max_cols * sizeof(float);
    x->x_rows = FMOE__CPU_FUSED_MAX_N * (max_rows / (max_n > 0 ? max_n : 1));
    if (x->x_rows > max_rows) x->x_rows = max_rows;
    x->x = malloc((size_t)x->x_rows * (size_t)max_cols * sizeof(float));
    x->g = malloc(rows);
    x->u = malloc(rows);
    x->y = malloc(rows);
    x->qx = malloc((size_t)MAX_QTYPES * (size_t)max_n * (size_t)x->qrow);
    x->qg = malloc((size_t)max_rows * (size_t)x->qrow);
    x->qin[0] = malloc((size_t)max_rows * (size_t)x->qrow);
    x->qin[1] = malloc((size_t)max_rows * (size_t)x->qrow);
    x->widen = malloc((size_t)threads * (size_t)max_cols * sizeof(float));
    x->e = malloc((size_t)(max_rows + 1) * sizeof *x->e);
    /* an entry's blocks: its I <= max_cols rows in 8-bit blocks of at least 32 */
    x->max_blocks = (int64_t)(max_rows + 1) * (max_cols / 32 + 1);
    x->done = malloc((size_t)x->max_blocks * sizeof *x->done);
    if (!x->x || !x->g || !x->u || !x->y || !x->qx || !x->qg || !x->qin[0] || !x->qin[1] ||
        !x->widen || !x->e || !x->done) {
        fmoe__cpu_fused_free(x);
        return fmoe_error_set(FMOE_ENOMEM, "out of memory for the fused experts' scratch");
    }
    *out = x;
    return 0;
}

void fmoe__cpu_fused_free(fmoe__cpu_fused *x) {
    if (!x) return;
    free(x->x);
    free(x->g);
    free(x->u);
    free(x->y);
    free(x->qx);
    free(x->qg);
    free(x->qin[0]);
    free(x->qin[1]);
    free(x->widen);
    free(x->e);
    free(x->done);
    free(x);
}

typedef struct plan {
    void *ctx;
    fmoe__cpu_fused *x;
    const fmoe__moe_args *a;
    int32_t count;      /* entries: the routed experts, then the shared one */
    int64_t down_chunk; /* job-2 rows of h per task */
} plan;

/* Bytes of an 8-bit input of cols values for rows of W, or 0 when W's products take f32
 * inputs: cpu_matmul's rule (block formats with an 8-bit dot, when the context asks). */
static int64_t act_bytes(const void *ctx, const fmoe__mat *W) {
    if (!W->quant || !fmoe__cpu_act8(ctx)) return 0;
    const int64_t qb = fmoe_quant_act_bytes(W->quant, W->cols);
    return qb > 0 ? qb : 0;
}

/* Values per block of W's 8-bit input format: 32 (Q8_0) or 256 (Q8_K). */
static int64_t act_block(uint32_t type) { return fmoe_quant_act_bytes(type, 32) > 0 ? 32 : 256; }

/*
 * Rows [r0, r1) of y[t·ldy + r] = W[r]·input_t for t < c, by the kernel cpu_matmul takes
 * for c rows: the 8-bit block dot (q: the c inputs q_stride apart), the f32 block dot (in,
 * ld apart), or the bf16/f16 dots.
 */
static void product(void *ctx, fmoe__cpu_fused *x, const fmoe__mat *W, int64_t r0, int64_t r1,
                    const float *in, int64_t ld, const uint8_t *q, int64_t q_stride, int32_t c,
                    float *y, int64_t ldy, int32_t worker) {
    if (W->quant) {
        const int64_t rb = fmoe_quant_row_bytes(W->quant, W->cols);
        if (!q)
            fmoe__quant_matvec_rows(W->quant, W->data, rb, r0, r1, W->cols, in, ld, NULL, 0, c,
                                    y, ldy, x->widen + (int64_t)worker * x->max_cols);
        else
            fmoe__quant_matvec_rows(W->quant, W->data, rb, r0, r1, W->cols, NULL, 0, q,
                                    q_stride, c, y, ldy, NULL);
        return;
    }
    const uint16_t *w = W->data;
    for (int64_t r = r0; r < r1; r++)
        fmoe__cpu_dots_u16(ctx, w + r * W->cols, W->dtype, in, ld, c, W->cols, y + r, ldy);
}

/* Job 1: gate and up rows of one chunk of one expert, bias, SwiGLU, 8-bit for down. */
static void up_task(void *arg, int32_t task, int32_t worker) {
    const plan *p = arg;
    fmoe__cpu_fused *x = p->x;
    int32_t k = 0;
    while (k + 1 < p->count && x->e[k + 1].first_task <= task) k++;
    const entry *e = &x->e[k];
    const fmoe__mlp *w = e->w;
    const int64_t I = w->gate.rows, mc = x->max_cols, h = p->a->h;
    const int64_t r0 = (int64_t)(task - e->first_task) * e->chunk;
    const int64_t r1 = r0 + e->chunk < I ? r0 + e->chunk : I;
    float *G = x->g + (int64_t)e->off * mc, *U = x->u + (int64_t)e->off * mc;
    /* f32 inputs: the gathered rows (the shared expert's: xn itself) */
    const float *in = e->rows ? x->x + (int64_t)e->off * mc : p->a->xn;
    const int64_t ld = e->rows ? mc : h;
    product(p->ctx, x, &w->gate, r0, r1, in, ld, e->qgate, x->qrow, e->c, G, mc, worker);
    product(p->ctx, x, &w->up, r0, r1, in, ld, e->qup, x->qrow, e->c, U, mc, worker);
    for (int32_t t = 0; t < e->c; t++) {
        float *g = G + t * mc, *u = U + t * mc;
        for (int64_t r = r0; r < r1; r++) {
            float gv = g[r], uv = u[r];
            if (w->gate_b) gv += w->gate_b[r];
            if (w->up_b) uv += w->up_b[r];
            g[r] = w->glu_limit > 0 ? fmoe_swiglu_clamped(gv, uv, w->glu_alpha, w->glu_limit)
                                    : fmoe_swiglu(gv, uv);
        }
    }
    if (!e->down_act) return;
    /* Down's 8-bit input is quantised a block at a time (each block on its own, so the
     * bits are a whole row's), by the task that finishes the block's last rows: the
     * seq_cst add orders the other tasks' SwiGLU values before it. A task can then be 16
     * rows where a block is 256 (Q8_K), or span several blocks */
    const uint32_t dt = w->down.quant;
    const int64_t blk = act_block(dt), bb = fmoe_quant_act_bytes(dt, blk);
    for (int64_t b = r0 / blk; b * blk < r1; b++) {
        const int64_t lo = b * blk > r0 ? b * blk : r0;
        const int64_t hi = (b + 1) * blk < r1 ? (b + 1) * blk : r1;
        if (atomic_fetch_add(&x->done[e->first_block + b], (int32_t)(hi - lo)) + (hi - lo) < blk)
            continue;
        for (int32_t t = 0; t < e->c; t++)
            fmoe_quant_act_quantize(dt, G + t * mc + b * blk,
                                    x->qg + (int64_t)(e->off + t) * x->qrow + b * bb, blk);
    }
}

/* Job 2: a chunk of rows of h of every expert's down product, bias, and the weighted sum. */
static void down_task(void *arg, int32_t task, int32_t worker) {
    const plan *p = arg;
    fmoe__cpu_fused *x = p->x;
    const int64_t h = p->a->h, mc = x->max_cols;
    const int64_t r0 = (int64_t)task * p->down_chunk;
    const int64_t r1 = r0 + p->down_chunk < h ? r0 + p->down_chunk : h;
    for (int32_t k = 0; k < p->count; k++) {
        const entry *e = &x->e[k];
        const fmoe__mlp *w = e->w;
        float *Y = x->y + (int64_t)e->off * mc;
        product(p->ctx, x, &w->down, r0, r1, x->g + (int64_t)e->off * mc, mc,
                e->down_act ? x->qg + (int64_t)e->off * x->qrow : NULL, x->qrow, e->c, Y, mc,
                worker);
        for (int32_t t = 0; t < e->c; t++) {
            float *yt = Y + t * mc;
            if (w->down_b)
                for (int64_t r = r0; r < r1; r++) yt[r] += w->down_b[r];
            const int64_t row = e->rows ? e->rows[t] : t;
            const float wt = e->scale ? e->scale[t] : 1.0f;
            float *acc = p->a->acc + row * h;
            for (int64_t r = r0; r < r1; r++) acc[r] += wt * yt[r];
        }
    }
}

/* The 8-bit form of the n rows of in[n][cols] for matrices of type `type`, quantised on
 * first use into one of MAX_QTYPES slots (types[0..*ntypes): the slots' types so far).
 * @return them, or NULL when the slots are full. */
static const uint8_t *rows_8bit(fmoe__cpu_fused *x, uint32_t type, const float *in, int32_t n,
                                int64_t cols, uint32_t *types, int32_t *ntypes) {
    const int64_t slot_bytes = (int64_t)x->max_n * x->qrow;
    for (int32_t i = 0; i < *ntypes; i++)
        if (types[i] == type) return x->qx + i * slot_bytes;
    if (*ntypes == MAX_QTYPES) return NULL;
    uint8_t *q = x->qx + *ntypes * slot_bytes;
    for (int32_t t = 0; t < n; t++) fmoe_quant_act_quantize(type, in + t * cols, q + t * x->qrow, cols);
    types[(*ntypes)++] = type;
    return q;
}

static int fusable(const fmoe__cpu_fused *x, const fmoe__mat *W) {
    if (W->on_backend || W->cols > x->max_cols || W->rows > x->max_cols) return 0;
    if (W->quant) return fmoe_quant_act_bytes(W->quant, W->cols) <= x->qrow;
    return W->dtype == FMOE_ST_BF16 || W->dtype == FMOE_ST_F16;
}

/* Whether cpu_matmul multiplies W by n rows with 8-bit inputs in one pass: the kernel
 * calls product() makes for more than FMOE__CPU_FUSED_MAX_N rows. */
static int one_8bit_pass(void *ctx, const fmoe__mat *W, int32_t n) {
    return act_bytes(ctx, W) > 0 && fmoe__cpu_act8_pass(ctx, W) >= n;
}

int fmoe__cpu_moe_experts(void *ctx, const fmoe__moe_args *a) {
    fmoe__cpu_fused *x = fmoe__cpu_fused_of(ctx);
    if (!x || a->n > x->max_n || a->h > x->max_cols) return 1;
    const int prefill = a->n > FMOE__CPU_FUSED_MAX_N;
    const int32_t count = a->count + (a->shared ? 1 : 0);
    const int32_t rows = a->offset_host[a->count] + (a->shared ? a->n : 0);
    if (rows > x->max_rows || count > x->max_rows + 1) return 1;
    plan p = {.ctx = ctx, .x = x, .a = a, .count = count};
    uint32_t types[MAX_QTYPES];
    int32_t ntypes = 0, tasks = 0, off = 0, blocks = 0, max_c = 0;
    double work = 0;
    for (int32_t k = 0; k < count; k++) {
        const int shared = k == a->count;
        const fmoe__mlp *w = shared ? a->shared : &a->experts[k];
        if (!fusable(x, &w->gate) || !fusable(x, &w->up) || !fusable(x, &w->down)) return 1;
        /* prefill: the loop's products of more than FMOE__CPU_FUSED_MAX_N rows take other
         * kernels except on the 8-bit path, which the fused products share */
        if (prefill && (!one_8bit_pass(ctx, &w->gate, a->n) || !one_8bit_pass(ctx, &w->up, a->n) ||
                        !one_8bit_pass(ctx, &w->down, a->n)))
            return 1;
        entry *e = &x->e[k];
        const int32_t o = shared ? 0 : a->offset_host[k];
        *e = (entry){.w = w, .c = shared ? a->n : a->offset_host[k + 1] - o, .off = off,
                     .rows = shared ? NULL : a->rows_host + o,
                     .scale = shared ? NULL : a->scale_host + o};
        /* 8-bit inputs: xn's rows quantised once per type, an expert's gathered */
        const fmoe__mat *gu[2] = {&w->gate, &w->up};
        const uint8_t **dst[2] = {&e->qgate, &e->qup};
        for (int m = 0; m < 2; m++) {
            const int64_t qb = act_bytes(ctx, gu[m]);
            if (!qb) continue;
            const uint8_t *q = rows_8bit(x, gu[m]->quant, a->xn, a->n, a->h, types, &ntypes);
            if (!q) return 1;
            *dst[m] = q; /* the shared expert's rows are xn's, in order */
            if (shared) continue;
            uint8_t *g = x->qin[m] + (int64_t)e->off * x->qrow;
            for (int32_t t = 0; t < e->c; t++)
                memcpy(g + t * x->qrow, q + (int64_t)e->rows[t] * x->qrow, (size_t)qb);
            *dst[m] = g;
        }
        e->down_act = act_bytes(ctx, &w->down) > 0;
        const int64_t I = w->gate.rows; /* whole 8-bit blocks (32 or 256) */
        e->chunk = fmoe__quant_matvec_chunk(x->threads, I, e->c);
        e->first_task = tasks;
        if (e->c > max_c) max_c = e->c;
        e->first_block = blocks;
        if (e->down_act) {
            blocks += (int32_t)(I / act_block(w->down.quant));
            if (blocks > x->max_blocks) return 1;
        }
        tasks += (int32_t)((I + e->chunk - 1) / e->chunk);
        off += e->c;
        work += 3.0 * (double)e->c * (double)I * (double)a->h;
    }
    /* f32 inputs of the routed experts: their rows gathered */
    for (int32_t k = 0; k < a->count; k++) {
        const entry *e = &x->e[k];
        if (e->qgate && e->qup) continue;
        if (e->off + e->c > x->x_rows) return 1; /* not with fmoe__cpu_moe_experts' rules */
        for (int32_t t = 0; t < e->c; t++)
            memcpy(x->x + (int64_t)(e->off + t) * x->max_cols, a->xn + (int64_t)e->rows[t] * a->h,
                   (size_t)a->h * sizeof(float));
    }
    for (int32_t b = 0; b < blocks; b++) atomic_store_explicit(&x->done[b], 0, memory_order_relaxed);
    p.down_chunk = fmoe__quant_matvec_chunk(x->threads, a->h, max_c);
    const int32_t down_tasks = (int32_t)((a->h + p.down_chunk - 1) / p.down_chunk);
    if (work < fmoe__cpu_min_work(ctx)) {
        for (int32_t t = 0; t < tasks; t++) up_task(&p, t, 0);
        for (int32_t t = 0; t < down_tasks; t++) down_task(&p, t, 0);
        return 0;
    }
    fmoe__cpu_run(ctx, up_task, &p, tasks);
    fmoe__cpu_run(ctx, down_task, &p, down_tasks);
    return 0;
}

/* ---------------------------------------------------------------------------------- */
/* Products of one input                                                               */
/* ---------------------------------------------------------------------------------- */

#define MAX_SAME 4

typedef struct same_job {
    void *ctx;
    fmoe__cpu_fused *x;
    const fmoe__mat *const *ws;
    float *const *ys;
    const float *in;
    int32_t n, count;
    const uint8_t *q[MAX_SAME];   /* 8-bit rows of `in` for ws[i], or NULL: f32 */
    int32_t first[MAX_SAME + 1];  /* ws[i]'s first task */
    int64_t chunk[MAX_SAME];      /* ws[i]'s rows per task */
} same_job;

static void same_task(void *arg, int32_t task, int32_t worker) {
    const same_job *j = arg;
    int32_t i = 0;
    while (j->first[i + 1] <= task) i++;
    const fmoe__mat *W = j->ws[i];
    const int64_t r0 = (int64_t)(task - j->first[i]) * j->chunk[i];
    const int64_t r1 = r0 + j->chunk[i] < W->rows ? r0 + j->chunk[i] : W->rows;
    product(j->ctx, j->x, W, r0, r1, j->in, W->cols, j->q[i], j->x->qrow, j->n, j->ys[i],
            W->rows, worker);
}

void fmoe__cpu_matmul_same_input(void *ctx, const fmoe__mat *const *ws, int32_t count,
                                 const float *in, int32_t n, float *const *ys) {
    fmoe__cpu_fused *x = fmoe__cpu_fused_of(ctx);
    int ok = x && n <= x->max_n && count <= MAX_SAME;
    for (int32_t i = 0; ok && i < count; i++)
        ok = fusable(x, ws[i]) && ws[i]->cols == ws[0]->cols &&
             (n <= FMOE__CPU_FUSED_MAX_N || one_8bit_pass(ctx, ws[i], n));
    same_job j = {.ctx = ctx, .x = x, .ws = ws, .ys = ys, .in = in, .n = n, .count = count};
    uint32_t types[MAX_QTYPES];
    int32_t ntypes = 0;
    double work = 0;
    for (int32_t i = 0; ok && i < count; i++) {
        if (act_bytes(ctx, ws[i]) > 0 &&
            !(j.q[i] = rows_8bit(x, ws[i]->quant, in, n, ws[i]->cols, types, &ntypes)))
            ok = 0;
        j.chunk[i] = fmoe__quant_matvec_chunk(x->threads, ws[i]->rows, n);
        j.first[i + 1] = j.first[i] + (int32_t)((ws[i]->rows + j.chunk[i] - 1) / j.chunk[i]);
        work += (double)n * (double)ws[i]->rows * (double)ws[i]->cols;
    }
    if (!ok) {
        for (int32_t i = 0; i < count; i++) fmoe__cpu_matmul(ctx, ws[i], in, n, ys[i]);
        return;
    }
    if (work < fmoe__cpu_min_work(ctx)) {
        for (int32_t t = 0; t < j.first[count]; t++) same_task(&j, t, 0);
        return;
    }
    fmoe__cpu_run(ctx, same_task, &j, j.first[count]);
}
