/*
 * test_cuda_ops - every operation of the CUDA backend (runtime/cuda/cuda_forward.cu)
 * against the CPU backend on the same inputs (a differential test, like ggml's test-backend-ops):
 * transfers, each compute op at several shapes, attention on both of its score paths
 * (shared memory and the global rows of a long context), expert slots written from
 * another thread through another context, the weight cache shared through a model's
 * weight home, quantized (GGUF) weights, sticky errors and the out-of-memory detail.
 * Suite "gpu": exits 77 (skipped) where fmoe__cuda_backend() is NULL (no CUDA build,
 * module or device).
 *
 * Tolerances: ops that run the same C (lib/rowwise.h, elementwise.h) differ only by
 * expf and by the order of parallel sums; bf16/f16 GEMMs round x to the weight's type,
 * so they are checked against Σ|w·x| of the row.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "half.h"
#include "fmoe/quant.h"
#include "harness.h"
#include "model_impl.h"

static const fmoe__backend_ops *C = &fmoe__cpu_backend;
static const fmoe__backend_ops *G;
static void *cc, *gc; /* the shared CPU and CUDA contexts */
static fmoe__weight_home home;

#define MAX_COLS 1024
#define MAX_BATCH 32
#define MAX_CONTEXT 512
#define MAX_EXPERTS 256

static uint64_t lcg = 987654321;
static float frand(void) { /* uniform in [-1, 1) */
    lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((lcg >> 40) * 0x1.0p-24) * 2.0f - 1.0f;
}

static float *rand_host(int64_t n, float scale) {
    float *p = malloc((size_t)n * sizeof *p);
    for (int64_t i = 0; i < n; i++) p[i] = scale * frand();
    return p;
}

/* A CPU buffer holding h[n] (zeros when h is NULL). */
static float *cbuf(void *ctx, const float *h, int64_t n) {
    float *p = C->alloc(ctx, n * 4);
    if (p && h) memcpy(p, h, (size_t)n * 4);
    return p;
}

/* A CUDA buffer holding h[n] (zeros when h is NULL). */
static float *gbuf(void *ctx, const float *h, int64_t n) {
    float *p = G->alloc(ctx, n * 4);
    if (p && h) G->upload(ctx, p, h, n * 4);
    return p;
}

/* Downloads dev[n] and counts the values outside atol + rtol·|cpu|; prints the first. */
static int64_t mismatches(void *ctx, const char *what, const float *dev, const float *cpu,
                          int64_t n, double atol, double rtol) {
    float *got = malloc((size_t)n * sizeof *got);
    if (G->download(ctx, got, dev, n * 4) != 0) {
        fprintf(stderr, "  %s: download failed: %s\n", what, fmoe_error_detail());
        free(got);
        return -1;
    }
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        const double d = fabs((double)got[i] - (double)cpu[i]);
        if (!(d <= atol + rtol * fabs((double)cpu[i]))) {
            if (!bad)
                fprintf(stderr, "  %s[%lld]: cuda %.9g, cpu %.9g\n", what, (long long)i,
                        (double)got[i], (double)cpu[i]);
            bad++;
        }
    }
    free(got);
    return bad;
}

/* A [rows][cols] matrix of dtype dt from f32 values (the host copy the mat points at). */
static void *make_mat(fmoe__mat *m, fmoe_st_dtype dt, int64_t rows, int64_t cols, const float *v) {
    const int64_t n = rows * cols;
    void *data;
    if (dt == FMOE_ST_F32) {
        data = malloc((size_t)n * 4);
        memcpy(data, v, (size_t)n * 4);
    } else {
        uint16_t *u = malloc((size_t)n * 2);
        for (int64_t i = 0; i < n; i++)
            u[i] = dt == FMOE_ST_BF16 ? fmoe_float_to_bf16(v[i]) : fmoe_float_to_half(v[i]);
        data = u;
    }
    memset(m, 0, sizeof *m);
    m->data = data, m->dtype = dt, m->rows = rows, m->cols = cols;
    return data;
}

static float mat_value(const fmoe__mat *m, int64_t i) {
    if (m->dtype == FMOE_ST_F32) return ((const float *)m->data)[i];
    const uint16_t u = ((const uint16_t *)m->data)[i];
    return m->dtype == FMOE_ST_BF16 ? fmoe_bf16_to_float(u) : fmoe_half_to_float(u);
}

static const fmoe_st_dtype dtypes[3] = {FMOE_ST_F32, FMOE_ST_BF16, FMOE_ST_F16};

/* ---------------------------------------------------------------------------------- */

TEST(alloc_zeroes_and_transfers_round_trip) {
    const int64_t n = 1000;
    float *a = gbuf(gc, NULL, n), *b = gbuf(gc, NULL, n);
    ASSERT_TRUE(a && b);
    float *zeros = calloc((size_t)n, 4), *h = rand_host(n, 5);
    ASSERT_EQ(mismatches(gc, "alloc", a, zeros, n, 0, 0), 0);
    G->upload(gc, a, h, n * 4);
    ASSERT_EQ(mismatches(gc, "upload", a, h, n, 0, 0), 0);
    G->copy(gc, b + 10, a + 20, 500 * 4);
    float *want = calloc((size_t)n, 4);
    memcpy(want + 10, h + 20, 500 * 4);
    ASSERT_EQ(mismatches(gc, "copy", b, want, n, 0, 0), 0);
    G->zero(gc, a + 100, 50 * 4);
    memset(h + 100, 0, 50 * 4);
    ASSERT_EQ(mismatches(gc, "zero", a, h, n, 0, 0), 0);
    ASSERT_OK(G->sync(gc));
    G->release(gc, a);
    G->release(gc, b);
    free(zeros), free(h), free(want);
}

TEST(get_rows_widens_exactly) {
    const int64_t V = 50, cols = 300;
    const int32_t rows[5] = {3, 0, 49, 3, 17};
    float *v = rand_host(V * cols, 2);
    for (int d = 0; d < 3; d++) {
        fmoe__mat m;
        void *data = make_mat(&m, dtypes[d], V, cols, v);
        float *cy = cbuf(cc, NULL, 5 * cols), *gy = gbuf(gc, NULL, 5 * cols);
        C->get_rows(cc, &m, rows, 5, cy);
        G->get_rows(gc, &m, rows, 5, gy);
        ASSERT_EQ(mismatches(gc, "get_rows", gy, cy, 5 * cols, 0, 0), 0);
        C->release(cc, cy), G->release(gc, gy);
        (void)data; /* stays: the weight cache is keyed by its address */
    }
    free(v);
}

TEST(rmsnorm_matches_cpu) {
    const int32_t shapes[3][2] = {{5, 333}, {24, 64}, {1, 1024}};
    for (int s = 0; s < 3; s++) {
        const int64_t rows = shapes[s][0];
        const int32_t dim = shapes[s][1];
        float *x = rand_host(rows * dim, 3), *w = rand_host(dim, 1);
        float *cx = cbuf(cc, x, rows * dim), *cy = cbuf(cc, NULL, rows * dim);
        float *gx = gbuf(gc, x, rows * dim), *gy = gbuf(gc, NULL, rows * dim);
        C->rmsnorm(cc, cy, cx, w, rows, dim, 1e-6f);
        G->rmsnorm(gc, gy, gx, w, rows, dim, 1e-6f);
        ASSERT_EQ(mismatches(gc, "rmsnorm", gy, cy, rows * dim, 1e-7, 1e-6), 0);
        C->rmsnorm(cc, cx, cx, w, rows, dim, 1e-6f); /* in place */
        G->rmsnorm(gc, gx, gx, w, rows, dim, 1e-6f);
        ASSERT_EQ(mismatches(gc, "rmsnorm in place", gx, cx, rows * dim, 1e-7, 1e-6), 0);
        C->release(cc, cx), C->release(cc, cy), G->release(gc, gx), G->release(gc, gy);
        free(x);
        /* w stays: the weight cache is keyed by its address for the session's life */
    }
}

/* Checks y[n][rows] against Σ|w·x| of each output: f32 1e-5, 16-bit weights 1/128 (x is
 * rounded to bf16 on the device: 2^-9 relative per term). */
static int64_t matmul_mismatches(const fmoe__mat *m, const float *x, int32_t n, const float *gy,
                                 const float *cy) {
    const double rel = m->dtype == FMOE_ST_F32 ? 1e-5 : 1.0 / 128;
    float *got = malloc((size_t)(n * m->rows) * 4);
    if (G->download(gc, got, gy, n * m->rows * 4) != 0) {
        free(got);
        return -1;
    }
    int64_t bad = 0;
    for (int32_t t = 0; t < n; t++)
        for (int64_t r = 0; r < m->rows; r++) {
            double mag = 0;
            for (int64_t c = 0; c < m->cols; c++)
                mag += fabs((double)mat_value(m, r * m->cols + c) * x[t * m->cols + c]);
            const double d = fabs((double)got[t * m->rows + r] - cy[t * m->rows + r]);
            if (!(d <= 1e-6 + rel * mag)) {
                if (!bad)
                    fprintf(stderr, "  matmul dtype %d n %d [%d][%lld]: cuda %.9g, cpu %.9g\n",
                            (int)m->dtype, n, t, (long long)r, (double)got[t * m->rows + r],
                            (double)cy[t * m->rows + r]);
                bad++;
            }
        }
    free(got);
    return bad;
}

TEST(matmul_matches_cpu_for_every_dtype_and_batch) {
    const int64_t R = 257, K = 300;
    const int32_t ns[4] = {1, 3, 17, MAX_BATCH};
    float *wv = rand_host(R * K, 0.5f);
    for (int d = 0; d < 3; d++) {
        fmoe__mat m;
        void *data = make_mat(&m, dtypes[d], R, K, wv);
        for (int i = 0; i < 4; i++) {
            const int32_t n = ns[i];
            float *x = rand_host(n * K, 2);
            float *cx = cbuf(cc, x, n * K), *cy = cbuf(cc, NULL, n * R);
            float *gx = gbuf(gc, x, n * K), *gy = gbuf(gc, NULL, n * R);
            C->matmul(cc, &m, cx, n, cy);
            G->matmul(gc, &m, gx, n, gy);
            ASSERT_EQ(matmul_mismatches(&m, x, n, gy, cy), 0);
            C->release(cc, cx), C->release(cc, cy), G->release(gc, gx), G->release(gc, gy);
            free(x);
        }
        /* weights stay alive: the cache is keyed by address */
        (void)data;
    }
    free(wv);
}

TEST(matmul_reads_backend_weights_in_place) {
    const int64_t R = 64, K = 96;
    const int32_t n = 5;
    float *wv = rand_host(R * K, 0.5f), *x = rand_host(n * K, 1);
    fmoe__mat m;
    void *data = make_mat(&m, FMOE_ST_BF16, R, K, wv);
    float *cx = cbuf(cc, x, n * K), *cy = cbuf(cc, NULL, n * R);
    float *gx = gbuf(gc, x, n * K), *gy = gbuf(gc, NULL, n * R);
    void *slot = G->alloc(gc, R * K * 2);
    ASSERT_TRUE(slot != NULL);
    G->upload(gc, slot, data, R * K * 2);
    fmoe__mat dm = m;
    dm.data = slot;
    dm.on_backend = 1;
    C->matmul(cc, &m, cx, n, cy);
    G->matmul(gc, &dm, gx, n, gy);
    ASSERT_EQ(matmul_mismatches(&m, x, n, gy, cy), 0);
    G->release(gc, slot);
    C->release(cc, cx), C->release(cc, cy), G->release(gc, gx), G->release(gc, gy);
    free(wv), free(x), free(data);
}

TEST(elementwise_ops_match_cpu) {
    const int32_t n = 7;
    const int64_t d = 333, count = n * d;
    float *y = rand_host(count, 4), *x = rand_host(count, 4), *b = rand_host(d, 1);
    float *gate = rand_host(n, 3);
    float *cy = cbuf(cc, y, count), *cx = cbuf(cc, x, count), *cg = cbuf(cc, gate, n);
    float *gy = gbuf(gc, y, count), *gx = gbuf(gc, x, count), *gg = gbuf(gc, gate, n);
    C->add_bias(cc, cy, b, n, d), G->add_bias(gc, gy, b, n, d);
    ASSERT_EQ(mismatches(gc, "add_bias", gy, cy, count, 0, 0), 0);
    C->clamp(cc, cy, count, 2.5f), G->clamp(gc, gy, count, 2.5f);
    ASSERT_EQ(mismatches(gc, "clamp", gy, cy, count, 0, 0), 0);
    C->add(cc, cy, cx, count), G->add(gc, gy, gx, count);
    ASSERT_EQ(mismatches(gc, "add", gy, cy, count, 0, 0), 0);
    C->add_gated(cc, cy, cx, cg, n, (int32_t)d), G->add_gated(gc, gy, gx, gg, n, (int32_t)d);
    ASSERT_EQ(mismatches(gc, "add_gated", gy, cy, count, 1e-6, 1e-6), 0);
    C->swiglu(cc, cy, cx, count), G->swiglu(gc, gy, gx, count);
    ASSERT_EQ(mismatches(gc, "swiglu", gy, cy, count, 1e-6, 1e-6), 0);
    C->release(cc, cy), C->release(cc, cx), C->release(cc, cg);
    G->release(gc, gy), G->release(gc, gx), G->release(gc, gg);
    free(y), free(x), free(gate);
}

TEST(rope_matches_cpu) {
    const int32_t n = 3, heads = 5, D = 64, half = D / 2;
    float *x = rand_host((int64_t)n * heads * D, 2);
    float *cs = malloc((size_t)(n * half) * 4), *sn = malloc((size_t)(n * half) * 4);
    for (int32_t t = 0; t < n; t++)
        for (int32_t i = 0; i < half; i++) {
            const double a = (t + 11) / pow(10000.0, 2.0 * i / D);
            cs[t * half + i] = (float)cos(a), sn[t * half + i] = (float)sin(a);
        }
    float *cx = cbuf(cc, x, n * heads * D), *gx = gbuf(gc, x, n * heads * D);
    float *ccs = cbuf(cc, cs, n * half), *csn = cbuf(cc, sn, n * half);
    float *gcs = gbuf(gc, cs, n * half), *gsn = gbuf(gc, sn, n * half);
    C->rope(cc, cx, n, heads, D, ccs, csn);
    G->rope(gc, gx, n, heads, D, gcs, gsn);
    ASSERT_EQ(mismatches(gc, "rope", gx, cx, (int64_t)n * heads * D, 1e-7, 1e-6), 0);
    C->release(cc, cx), C->release(cc, ccs), C->release(cc, csn);
    G->release(gc, gx), G->release(gc, gcs), G->release(gc, gsn);
    free(x), free(cs), free(sn);
}

/* One attention call on both backends; the caches hold max_context positions. */
static int64_t attention_case(void *cctx, void *gctx, int32_t max_context, int32_t n,
                              int32_t pos0, int32_t Hq, int32_t Hk, int32_t D, int32_t window) {
    const int64_t kvn = (int64_t)max_context * Hk * D, qn = (int64_t)n * Hq * D;
    float *q = rand_host(qn, 1), *k = rand_host(kvn, 1), *v = rand_host(kvn, 1);
    float *cq = cbuf(cctx, q, qn), *ck = cbuf(cctx, k, kvn), *cv = cbuf(cctx, v, kvn);
    float *co = cbuf(cctx, NULL, qn);
    float *gq = gbuf(gctx, q, qn), *gk = gbuf(gctx, k, kvn), *gv = gbuf(gctx, v, kvn);
    float *go = gbuf(gctx, NULL, qn);
    fmoe__attn_args a = {.q = cq, .k_cache = ck, .v_cache = cv, .out = co, .n = n,
                         .pos0 = pos0, .n_heads = Hq, .n_kv_heads = Hk, .head_dim = D,
                         .window = window, .scale = 1.0f / sqrtf((float)D)};
    C->attention(cctx, &a);
    a.q = gq, a.k_cache = gk, a.v_cache = gv, a.out = go;
    G->attention(gctx, &a);
    char what[96];
    snprintf(what, sizeof what, "attention n %d pos0 %d %d/%d heads D %d window %d", n, pos0,
             Hq, Hk, D, window);
    const int64_t bad = mismatches(gctx, what, go, co, qn, 2e-6, 1e-5);
    C->release(cctx, cq), C->release(cctx, ck), C->release(cctx, cv), C->release(cctx, co);
    G->release(gctx, gq), G->release(gctx, gk), G->release(gctx, gv), G->release(gctx, go);
    free(q), free(k), free(v);
    return bad;
}

TEST(attention_matches_cpu) {
    ASSERT_EQ(attention_case(cc, gc, MAX_CONTEXT, 1, 0, 4, 4, 64, 0), 0);
    ASSERT_EQ(attention_case(cc, gc, MAX_CONTEXT, 6, 0, 8, 2, 64, 0), 0);
    ASSERT_EQ(attention_case(cc, gc, MAX_CONTEXT, 4, 37, 8, 2, 128, 0), 0);
    ASSERT_EQ(attention_case(cc, gc, MAX_CONTEXT, 1, 300, 16, 4, 128, 0), 0);
    ASSERT_EQ(attention_case(cc, gc, MAX_CONTEXT, 6, 20, 4, 1, 64, 8), 0);  /* window */
    ASSERT_EQ(attention_case(cc, gc, MAX_CONTEXT, 3, 5, 4, 2, 64, 16), 0);  /* window > pos */
    ASSERT_EQ(attention_case(cc, gc, MAX_CONTEXT, MAX_BATCH, MAX_CONTEXT - MAX_BATCH, 4, 4, 96, 0), 0);
}

/* A context of 70k positions: more scores than shared memory holds (227 KiB on H100),
 * so the kernel takes the global score rows; a window keeps another call in shared memory. */
TEST(attention_long_context_uses_global_scores) {
    const int32_t ctx_len = 70000;
    fmoe__backend_limits lim = {.threads = 0, .max_cols = 256, .max_batch = 4,
                                .max_context = ctx_len, .max_experts = 16};
    void *c2 = NULL, *g2 = NULL;
    ASSERT_OK(C->init(&lim, &c2));
    ASSERT_OK(G->init(&lim, &g2));
    ASSERT_EQ(attention_case(c2, g2, ctx_len, 2, ctx_len - 2, 4, 2, 64, 0), 0);
    ASSERT_EQ(attention_case(c2, g2, ctx_len, 3, ctx_len - 3, 4, 2, 64, 4096), 0);
    ASSERT_OK(G->sync(g2));
    G->free(g2);
    C->free(c2);
}

TEST(route_and_probs_match_cpu) {
    const int32_t n = 7, J = 64, K = 6;
    float *logits = rand_host((int64_t)n * J, 4);
    for (int sig = 0; sig < 2; sig++) {
        const fmoe__route_args a = {.n = n, .num_experts = J, .top_k = K, .sigmoid = sig,
                                    .norm = 1, .norm_eps = sig ? 1e-20f : 0.0f,
                                    .scale = sig ? 2.5f : 1.0f};
        float *cl = cbuf(cc, logits, n * J), *cp = cbuf(cc, NULL, n * J);
        float *cw = cbuf(cc, NULL, n * K), *gl = gbuf(gc, logits, n * J);
        float *gp = gbuf(gc, NULL, n * J), *gw = gbuf(gc, NULL, n * K);
        int32_t *ck = C->alloc(cc, n * K * 4), *gk = G->alloc(gc, n * K * 4);
        C->route(cc, &a, cl, cp, ck, cw);
        G->route(gc, &a, gl, gp, gk, gw);
        ASSERT_EQ(mismatches(gc, "route probs", gp, cp, n * J, 1e-7, 1e-6), 0);
        ASSERT_EQ(mismatches(gc, "route weights", gw, cw, n * K, 1e-7, 1e-5), 0);
        int32_t got[7 * 6];
        ASSERT_OK(G->download(gc, got, gk, n * K * 4));
        for (int32_t i = 0; i < n * K; i++) ASSERT_EQ(got[i], ck[i]);
        /* probs into a strided destination */
        const int64_t stride = 3 * J;
        float *cy = cbuf(cc, NULL, n * stride), *gy = gbuf(gc, NULL, n * stride);
        C->probs(cc, cy + J, stride, cl, n, J, sig);
        G->probs(gc, gy + J, stride, gl, n, J, sig);
        ASSERT_EQ(mismatches(gc, "probs", gy, cy, n * stride, 1e-7, 1e-6), 0);
        C->release(cc, cl), C->release(cc, cp), C->release(cc, cw), C->release(cc, ck);
        C->release(cc, cy);
        G->release(gc, gl), G->release(gc, gp), G->release(gc, gw), G->release(gc, gk);
        G->release(gc, gy);
    }
    free(logits);
}

TEST(gather_and_scatter_match_cpu) {
    const int32_t rows = 10, dim = 300;
    const int32_t idx[4] = {7, 2, 9, 0};
    const float scale[4] = {0.5f, -1.0f, 2.0f, 0.25f};
    float *src = rand_host(rows * dim, 2), *acc = rand_host(rows * dim, 1);
    float *cs = cbuf(cc, src, rows * dim), *ca = cbuf(cc, acc, rows * dim);
    float *gs = gbuf(gc, src, rows * dim), *ga = gbuf(gc, acc, rows * dim);
    float *cd = cbuf(cc, NULL, 4 * dim), *gd = gbuf(gc, NULL, 4 * dim);
    C->gather_rows(cc, cd, cs, idx, 4, dim);
    G->gather_rows(gc, gd, gs, idx, 4, dim);
    ASSERT_EQ(mismatches(gc, "gather_rows", gd, cd, 4 * dim, 0, 0), 0);
    C->scatter_add(cc, ca, cd, idx, scale, 4, dim);
    G->scatter_add(gc, ga, gd, idx, scale, 4, dim);
    /* the host arrays may change once the calls return; a second pair reuses the scratch */
    int32_t idx2[2] = {1, 3};
    float scale2[2] = {3.0f, -0.5f};
    C->scatter_add(cc, ca, cd, idx2, scale2, 2, dim);
    G->scatter_add(gc, ga, gd, idx2, scale2, 2, dim);
    idx2[0] = 5, scale2[0] = 100.0f;
    ASSERT_EQ(mismatches(gc, "scatter_add", ga, ca, rows * dim, 1e-7, 1e-6), 0);
    C->release(cc, cs), C->release(cc, ca), C->release(cc, cd);
    G->release(gc, gs), G->release(gc, ga), G->release(gc, gd);
    free(src), free(acc);
}

typedef struct slot_job {
    void *ctx;
    void *slot;
    const void *src;
    int64_t bytes;
    void *fence; /* waited for before the write, as the executor's I/O thread does */
    int rc;
} slot_job;

static void *write_slot_thread(void *arg) {
    slot_job *j = arg;
    j->rc = G->fence_wait(j->ctx, j->fence);
    if (j->rc == 0) j->rc = G->write_slot(j->ctx, j->slot, j->src, j->bytes);
    return NULL;
}

/* The executor's shape: an I/O context of its own fills a slot from another thread (from
 * pinned memory), the session's context multiplies by it and records the slot's fence, and
 * a rewrite of the slot waits for that fence. */
TEST(write_slot_from_another_thread_and_context) {
    const int64_t R = 128, K = 256;
    const int32_t n = 4;
    fmoe__backend_limits lim = {.weights = &home, .max_cols = MAX_COLS, .max_batch = MAX_BATCH,
                                .max_context = 16, .max_experts = 16};
    void *io = NULL;
    ASSERT_OK(G->init(&lim, &io));
    float *wv = rand_host(R * K, 0.5f), *x = rand_host(n * K, 1);
    fmoe__mat m;
    void *data = make_mat(&m, FMOE_ST_BF16, R, K, wv);
    void *pinned = NULL;
    ASSERT_TRUE(posix_memalign(&pinned, 4096, (size_t)(R * K * 2)) == 0);
    memcpy(pinned, data, (size_t)(R * K * 2));
    ASSERT_OK(G->host_register(io, pinned, R * K * 2));
    void *slot = G->alloc(io, R * K * 2);
    ASSERT_TRUE(slot != NULL);
    void *fence = G->fence_new(io);
    ASSERT_TRUE(fence != NULL);
    slot_job j = {io, slot, pinned, R * K * 2, fence, -1}; /* never recorded: no wait */
    pthread_t th;
    ASSERT_TRUE(pthread_create(&th, NULL, write_slot_thread, &j) == 0);
    pthread_join(th, NULL);
    ASSERT_OK(j.rc);
    fmoe__mat dm = m;
    dm.data = slot, dm.on_backend = 1;
    float *cx = cbuf(cc, x, n * K), *cy = cbuf(cc, NULL, n * R);
    float *gx = gbuf(gc, x, n * K), *gy = gbuf(gc, NULL, n * R);
    C->matmul(cc, &m, cx, n, cy);
    G->matmul(gc, &dm, gx, n, gy);
    ASSERT_EQ(matmul_mismatches(&m, x, n, gy, cy), 0);
    /* A second write into the slot waits for the queued read above (the slot's fence). */
    float *wv2 = rand_host(R * K, 0.5f);
    fmoe__mat m2;
    void *data2 = make_mat(&m2, FMOE_ST_BF16, R, K, wv2);
    G->matmul(gc, &dm, gx, n, gy);
    ASSERT_OK(G->fence_record(gc, fence));
    slot_job j2 = {io, slot, data2, R * K * 2, fence, -1};
    ASSERT_TRUE(pthread_create(&th, NULL, write_slot_thread, &j2) == 0);
    pthread_join(th, NULL);
    ASSERT_OK(j2.rc);
    ASSERT_EQ(matmul_mismatches(&m, x, n, gy, cy), 0); /* computed from the old weights */
    G->matmul(gc, &dm, gx, n, gy);
    C->matmul(cc, &m2, cx, n, cy);
    ASSERT_EQ(matmul_mismatches(&m2, x, n, gy, cy), 0);
    G->host_unregister(io, pinned);
    G->fence_free(io, fence);
    G->release(io, slot);
    G->free(io);
    C->release(cc, cx), C->release(cc, cy), G->release(gc, gx), G->release(gc, gy);
    free(pinned), free(wv), free(wv2), free(x), free(data), free(data2);
}

/* Contexts of one model share its weight home; cache_free releases the copies. */
TEST(weight_home_is_shared_and_freed) {
    fmoe__weight_home h = {0};
    fmoe__backend_limits lim = {.weights = &h, .max_cols = 64, .max_batch = 4,
                                .max_context = 16, .max_experts = 4};
    void *a = NULL, *b = NULL;
    ASSERT_OK(G->init(&lim, &a));
    ASSERT_TRUE(h.cache != NULL && h.cache_free != NULL);
    void *first = h.cache;
    ASSERT_OK(G->init(&lim, &b));
    ASSERT_TRUE(h.cache == first);
    float *w = rand_host(64, 1), *x = rand_host(4 * 64, 1);
    float *cx = cbuf(cc, x, 4 * 64), *cy = cbuf(cc, NULL, 4 * 64);
    C->rmsnorm(cc, cy, cx, w, 4, 64, 1e-5f);
    void *ctxs[2] = {a, b};
    for (int i = 0; i < 2; i++) {
        float *gx = gbuf(ctxs[i], x, 4 * 64), *gy = gbuf(ctxs[i], NULL, 4 * 64);
        G->rmsnorm(ctxs[i], gy, gx, w, 4, 64, 1e-5f);
        ASSERT_EQ(mismatches(ctxs[i], "rmsnorm (shared weights)", gy, cy, 4 * 64, 1e-7, 1e-6), 0);
        G->release(ctxs[i], gx), G->release(ctxs[i], gy);
    }
    G->free(a);
    G->free(b);
    h.cache_free(h.cache);
    C->release(cc, cx), C->release(cc, cy);
    free(w), free(x);
}

TEST(errors_are_sticky_and_say_what) {
    fmoe__backend_limits lim = {.max_cols = 64, .max_batch = 4, .max_context = 16,
                                .max_experts = 4};
    void *g = NULL;
    ASSERT_OK(G->init(&lim, &g));
    float *buf = gbuf(g, NULL, 64);
    fmoe__attn_args a = {.q = buf, .k_cache = buf, .v_cache = buf, .out = buf, .n = 1,
                         .n_heads = 3, .n_kv_heads = 2, .head_dim = 4, .scale = 1};
    G->attention(g, &a);
    ASSERT_EQ(G->sync(g), FMOE_EINVAL);
    ASSERT_CONTAINS(fmoe_error_detail(), "attention");
    float h[4];
    ASSERT_EQ(G->download(g, h, buf, 16), FMOE_EINVAL); /* still */
    ASSERT_TRUE(G->alloc(g, (int64_t)1 << 50) == NULL);
    ASSERT_CONTAINS(fmoe_error_detail(), "out of device memory");
    G->release(g, buf);
    G->free(g);
    ASSERT_OK(G->sync(gc)); /* other contexts are unaffected */
}

/*
 * GGUF's quantized weights: a Q4_K matrix multiplied on both CUDA paths (decode kernel,
 * n = 1; dequantised tiles and SGEMM, n = 12) against the double product of its
 * dequantised rows on the host, and a ggml type without a kernel (Q4_0) refused in one
 * line that names it. (tests/gpu/test_backend_ops.c covers every type and shape.)
 */
TEST(quantized_matmul_and_refusal) {
    const int64_t rows = 48, cols = 512;
    const int64_t rb = fmoe_quant_row_bytes(FMOE_GGML_Q4_K, cols);
    float *v = rand_host(rows * cols, 1), *deq = malloc((size_t)(rows * cols) * 4);
    uint8_t *blocks = malloc((size_t)(rows * rb));
    for (int64_t r = 0; r < rows; r++) {
        fmoe_quant_quantize_row(FMOE_GGML_Q4_K, v + r * cols, blocks + r * rb, cols);
        fmoe_quant_dequantize_row(FMOE_GGML_Q4_K, blocks + r * rb, deq + r * cols, cols);
    }
    fmoe__mat m = {.data = blocks, .dtype = FMOE_ST_U8, .rows = rows, .cols = cols,
                   .quant = FMOE_GGML_Q4_K};
    for (int32_t n = 1; n <= 12; n += 11) {
        float *x = rand_host(n * cols, 1), *want = malloc((size_t)(n * rows) * 4);
        for (int32_t t = 0; t < n; t++)
            for (int64_t r = 0; r < rows; r++) {
                double s = 0;
                for (int64_t k = 0; k < cols; k++) s += (double)deq[r * cols + k] * x[t * cols + k];
                want[t * rows + r] = (float)s;
            }
        float *gx = gbuf(gc, x, n * cols), *gy = gbuf(gc, NULL, n * rows);
        G->matmul(gc, &m, gx, n, gy);
        /* |y| is about 10 here; f32 sums of 512 terms are good to ~1e-5 */
        ASSERT_EQ(mismatches(gc, "q4_k matmul", gy, want, n * rows, 1e-4, 1e-5), 0);
        G->release(gc, gx), G->release(gc, gy);
        free(x), free(want);
    }

    fmoe__backend_limits lim = {.max_cols = 64, .max_batch = 4, .max_context = 16,
                                .max_experts = 4};
    void *g = NULL;
    ASSERT_OK(G->init(&lim, &g));
    uint8_t q4_0[2 * 18] = {0};
    fmoe__mat bad = {.data = q4_0, .dtype = FMOE_ST_U8, .rows = 1, .cols = 64,
                     .quant = FMOE_GGML_Q4_0};
    float *x = gbuf(g, NULL, 64), *y = gbuf(g, NULL, 4);
    G->matmul(g, &bad, x, 1, y);
    ASSERT_EQ(G->sync(g), FMOE_EUNSUPPORTED);
    ASSERT_CONTAINS(fmoe_error_detail(), "ggml type 2");
    ASSERT_TRUE(strchr(fmoe_error_detail(), '\n') == NULL);
    G->release(g, x), G->release(g, y);
    G->free(g);
    free(v), free(deq), free(blocks);
}

int main(int argc, char **argv) {
    /* The loader looks next to the fmoe binary; a test names the build's module. */
    char path[4096];
    const char *root = getenv("FMOE_BUILD_ROOT");
    if (!getenv("FMOE_CUDA_MODULE") && root) {
        snprintf(path, sizeof path, "%s/runtime/libfmoe-cuda.so", root);
        setenv("FMOE_CUDA_MODULE", path, 1);
    }
    G = fmoe__cuda_backend();
    if (!G) {
        printf("skipped: %s\n", fmoe_error_detail());
        return 77;
    }
    fmoe__backend_limits lim = {.threads = 0, .max_cols = MAX_COLS, .max_batch = MAX_BATCH,
                                .max_context = MAX_CONTEXT, .max_experts = MAX_EXPERTS};
    if (C->init(&lim, &cc) != 0) return 1;
    lim.weights = &home;
    if (G->init(&lim, &gc) != 0) {
        fprintf(stderr, "cuda init: %s\n", fmoe_error_detail());
        return 1;
    }
    const int rc = RUN_TESTS(argc, argv);
    G->free(gc);
    C->free(cc);
    if (home.cache) home.cache_free(home.cache);
    return rc;
}
