/*
 * test_backend_ops - every operation of fmoe__backend_ops (runtime/backend/backend_impl.h)
 * run on two backends over the same random inputs (fixed seeds) and compared, op by op and
 * shape by shape: a differential test in the manner of ggml's test-backend-ops. The reference is
 * the CPU table fmoe__cpu_backend; the backend under test is the CUDA table.
 *
 *     test_backend_ops [--self] [--json FILE] [FILTER]
 *
 *   (no flag)    CPU against CUDA; exits 77 (skipped), saying why, where
 *                fmoe__cuda_backend() is NULL (no CUDA build, module or device).
 *   --self       CPU against a second CPU context: runs every case, buffer, index array and
 *                comparison of the test itself where there is no GPU (suite 'unit'), and
 *                checks the stated tolerances against a model of the CUDA path's rounding
 *                (matmul with x rounded to the weight's type) and against planted errors.
 *   --json FILE  one JSON object per comparison (op, shape, errors, tolerance, pass).
 *   FILTER       only the tests whose names contain it (harness.h).
 *
 * Each side's buffers come from its own context's alloc; inputs are uploaded to both,
 * the op runs on both, and the results are downloaded and compared. Weights (fmoe__mat:
 * f32, bf16, f16, or GGUF's ggml blocks) and model vectors are host memory
 * handed to both sides, and stay alive (and unchanged) until the contexts are freed,
 * because the CUDA backend caches its device copies by host address. Every comparison
 * prints one line:
 *
 *     op  shape  max_abs  max_rel  tol  PASS|FAIL
 *
 * where max_rel is the largest |tested - reference| / scale and an op passes when
 * max_rel <= tol (tol 0: bit for bit). The scale of each op and its tolerance are the
 * table `tolerances` below, with the reason for each number.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fmoe/error.h"
#include "half.h"
#include "fmoe/quant.h"
#include "harness.h"
#include "family_llama4.h"
#include "model_impl.h"

/* ---------------------------------------------------------------------------------- */
/* Tolerances                                                                         */
/* ---------------------------------------------------------------------------------- */

/*
 * A comparison passes when, for every element i,
 *     |tested[i] - reference[i]| <= tol * max(scale[i], floor)
 * scale[i] being |reference[i]| unless the row says otherwise. Inputs are uniform in
 * [-1, 1) (logits in [-4, 4)), so floor 1 makes the bound absolute for values below 1.
 */
typedef struct tol_row {
    const char *op;
    double tol;
    double floor;
    const char *why;
} tol_row;

/* route.topk: ids at one rank may differ only where the reference's probabilities of the
 * two experts are closer than this (a near tie that expf's last bit can flip). */
#define TIE_GAP 1e-5

static const tol_row tolerances[] = {
    {"transfer", 0, 0, "upload/download/copy/zero/write_slot move bytes: bit for bit"},
    {"get_rows", 0, 0, "bf16/f16 -> f32 widening is exact; ggml blocks dequantise with the "
                       "same C on both sides (lib/quant_block.h)"},
    {"gather_rows", 0, 0, "a copy of rows"},
    {"clamp", 0, 0, "min/max are exact"},
    {"add", 1e-6, 1, "one rounding; 1e-6 leaves room for nothing but a contracted FMA"},
    {"add_bias", 1e-6, 1, "one rounding, as add"},
    {"scatter_add", 1e-6, 1, "acc + s*x: two roundings, or one where the kernel fuses"},
    {"rmsnorm", 1e-5, 1, "same C row function; sum of squares in double, order differs"},
    {"rope", 1e-5, 1, "same C row function (--fmad=false): cos/sin products"},
    {"swiglu", 1e-5, 1, "device expf is within 2 ulp of glibc's"},
    {"add_gated", 1e-5, 1, "sigmoid through expf, as swiglu"},
    {"probs", 1e-5, 1e-3, "softmax/sigmoid: expf plus the order of the row's sum"},
    {"route.probs", 1e-5, 1e-3, "as probs"},
    {"route.topw", 1e-5, 1, "top-k weights after renormalisation and scale"},
    {"route.topk", 0, 0, "identical ids, except near ties (TIE_GAP = 1e-5 in probability)"},
    {"attention", 1e-4, 1, "outputs are convex combinations of v (|v| <= 1): absolute 1e-4; "
                           "parallel sums of scores and of the softmax denominator"},
    {"layernorm", 1e-5, 1, "same C row function; mean and deviations in double, order differs"},
    {"mla_attention", 1e-4, 1, "absorbed MLA: W_uv times a convex combination of latents; "
                               "parallel sums of scores, softmax denominator and dots"},
    {"matmul.f32", 1e-5, 0, "scale: sum_k |w*x| of the element; cuBLAS vs OpenBLAS order, "
                            "no TF32"},
    {"matmul.bf16", 1e-2, 0, "scale: sum_k |w*x|; the CUDA path rounds x to bf16 "
                             "(2^-9 relative per term)"},
    {"matmul.f16", 2e-3, 0, "scale: sum_k |w*x|; the CUDA path rounds x to f16 "
                            "(2^-12 relative per term)"},
    {"matmul.quant", 1e-5, 0, "tested vs the host's double product of the dequantised "
                              "weights; scale: sum_k |w*x|; the CUDA path multiplies the "
                              "CPU's f32 weights (lib/quant_block.h) by f32 x: f32 sums only"},
    {"matmul.quant.order", 0, 0, "CUDA's decode kernel (n <= 8) vs a host replay of its "
                                 "summation order (fmaf per lane, then the warp butterfly)"},
    {"matmul.quant.cpu", 1e-5, 0, "tested vs the CPU; scale: sum_k |w*x| + Q/1e-5, Q = "
                                  "sum over x's blocks of amax/200 * sum|w|: the CPU may "
                                  "quantise x to 8 bits (fmoe/quant_act.h: half a step, "
                                  "amax/254, plus Q8_0's f16 scale rounding, amax/2048)"},
    {"queue.chain", 1e-5, 1, "300 queued add/add_bias/clamp/rmsnorm ops, one download"},
    {"timer", 0, 0, "mark/elapsed on each side alone (times differ by nature): a mark to "
                    "itself is 0, intervals add up within 1 us, lie within the host's clock "
                    "around them; misuse is FMOE_EINVAL and leaves the context usable"},
};

static const tol_row *tol_of(const char *op) {
    for (size_t i = 0; i < sizeof tolerances / sizeof tolerances[0]; i++)
        if (strcmp(tolerances[i].op, op) == 0) return &tolerances[i];
    fprintf(stderr, "test_backend_ops: no tolerance for op %s\n", op);
    exit(99);
}

/* ---------------------------------------------------------------------------------- */
/* The two sides                                                                      */
/* ---------------------------------------------------------------------------------- */

#define MAX_COLS 4096
#define MAX_BATCH 32
#define MAX_CONTEXT 60100
#define MAX_EXPERTS 64
#define MAX_MARKS 4

static const fmoe__backend_ops *R = &fmoe__cpu_backend; /* reference */
static const fmoe__backend_ops *T;                       /* under test */
static void *rctx, *tctx;       /* the compute contexts */
static void *rio, *tio;         /* second contexts, as the offload executor's I/O thread */
static fmoe__weight_home rhome, thome;
static int self_mode;

/* Results of every comparison. */
static int n_checks, n_failed;
static double worst_ratio; /* max over checks of max_rel / tol (checks with tol > 0) */
static char worst_what[160];
static FILE *json;
static int dry_run; /* comparisons that count nowhere (the planted-error controls) */

static uint64_t lcg;
static void seed(uint64_t s) { lcg = 0x9e3779b97f4a7c15ull ^ (s * 0x100000001b3ull); }
static float frand(void) { /* uniform in [-1, 1) */
    lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((lcg >> 40) * 0x1.0p-24) * 2.0f - 1.0f;
}
static int32_t irand(int32_t n) { return (int32_t)(((frand() + 1.0f) / 2.0f) * (float)n) % n; }

static float *rand_host(int64_t n, float scale) {
    float *p = malloc((size_t)n * sizeof *p);
    for (int64_t i = 0; i < n; i++) p[i] = scale * frand();
    return p;
}

/*
 * Weights and model vectors: host memory both sides read in place or cache by address,
 * so it lives until the end (a freed block whose address came back with other values
 * would find a stale device copy).
 */
static void **weights;
static int n_weights, cap_weights;

static void *weight_alloc(size_t bytes) {
    if (n_weights == cap_weights) {
        cap_weights = cap_weights ? 2 * cap_weights : 64;
        weights = realloc(weights, (size_t)cap_weights * sizeof *weights);
    }
    void *p = malloc(bytes ? bytes : 1);
    weights[n_weights++] = p;
    return p;
}

static float *weight_vec(int64_t n, float scale, float offset) {
    float *p = weight_alloc((size_t)n * sizeof *p);
    for (int64_t i = 0; i < n; i++) p[i] = offset + scale * frand();
    return p;
}

/* A [rows][cols] matrix of dtype dt with values v (rounded to dt), its data a weight. */
static void make_mat(fmoe__mat *m, fmoe_st_dtype dt, int64_t rows, int64_t cols, const float *v) {
    const int64_t n = rows * cols;
    memset(m, 0, sizeof *m);
    if (dt == FMOE_ST_F32) {
        float *d = weight_alloc((size_t)n * 4);
        memcpy(d, v, (size_t)n * 4);
        m->data = d;
    } else {
        uint16_t *u = weight_alloc((size_t)n * 2);
        for (int64_t i = 0; i < n; i++)
            u[i] = dt == FMOE_ST_BF16 ? fmoe_float_to_bf16(v[i]) : fmoe_float_to_half(v[i]);
        m->data = u;
    }
    m->dtype = dt, m->rows = rows, m->cols = cols;
}

static size_t dtype_size(fmoe_st_dtype dt) { return dt == FMOE_ST_F32 ? 4 : 2; }

static const char *dtype_name(fmoe_st_dtype dt) {
    return dt == FMOE_ST_F32 ? "f32" : dt == FMOE_ST_BF16 ? "bf16" : "f16";
}

static double mat_value(const fmoe__mat *m, const void *data, int64_t i) {
    if (m->dtype == FMOE_ST_F32) return ((const float *)data)[i];
    const uint16_t u = ((const uint16_t *)data)[i];
    return m->dtype == FMOE_ST_BF16 ? fmoe_bf16_to_float(u) : fmoe_half_to_float(u);
}

static float round_to(fmoe_st_dtype dt, float x) {
    if (dt == FMOE_ST_BF16) return fmoe_bf16_to_float(fmoe_float_to_bf16(x));
    if (dt == FMOE_ST_F16) return fmoe_half_to_float(fmoe_float_to_half(x));
    return x;
}

static const fmoe_st_dtype dtypes[3] = {FMOE_ST_F32, FMOE_ST_BF16, FMOE_ST_F16};

/* One buffer on each side, of the same size. */
typedef struct pair {
    void *r, *t;
    int64_t bytes;
} pair;

/* Both sides' buffers of `bytes`, holding host[bytes] when host is not NULL (zeros
 * otherwise). @return 0, or -1 with the reason printed. */
static int pair_alloc(pair *p, int64_t bytes, const void *host) {
    p->bytes = bytes;
    p->r = R->alloc(rctx, bytes);
    p->t = T->alloc(tctx, bytes);
    if (!p->r || !p->t) {
        printf("alloc of %lld bytes failed: %s\n", (long long)bytes, fmoe_error_detail());
        return -1;
    }
    if (host) {
        R->upload(rctx, p->r, host, bytes);
        T->upload(tctx, p->t, host, bytes);
    }
    return 0;
}

static void pair_free(pair *p) {
    if (p->r) R->release(rctx, p->r);
    if (p->t) T->release(tctx, p->t);
    p->r = p->t = NULL;
}

#define RF(p) ((float *)(p).r)
#define TF(p) ((float *)(p).t)

/* A host copy of `bytes` at p (the side's download, which waits for every op before it),
 * or NULL with the sticky error printed. */
static void *fetch(const fmoe__backend_ops *B, void *ctx, const void *p, int64_t bytes) {
    void *h = malloc((size_t)(bytes ? bytes : 1));
    const int rc = B->download(ctx, h, p, bytes);
    if (rc != 0) {
        printf("  %s download failed (%d): %s\n", B->name, rc, fmoe_error_detail());
        free(h);
        return NULL;
    }
    return h;
}

static void record(const char *op, const char *shape, double max_abs, double max_rel,
                   double tol, int pass) {
    if (dry_run) return;
    n_checks++;
    if (!pass) n_failed++;
    if (tol > 0 && max_rel / tol > worst_ratio) {
        worst_ratio = max_rel / tol;
        snprintf(worst_what, sizeof worst_what, "%s %s", op, shape);
    }
    if (json)
        fprintf(json,
                "{\"op\": \"%s\", \"shape\": \"%s\", \"max_abs\": %.6g, \"max_rel\": %.6g, "
                "\"tol\": %.6g, \"pass\": %s}\n",
                op, shape, max_abs, max_rel, tol, pass ? "true" : "false");
}

/*
 * Compares got[n] (tested) with want[n] (reference) under op's tolerance; scale[i] (NULL:
 * |want[i]|) before the op's floor. Prints one line and the first element out of bounds.
 * @return 1 when it fails, else 0.
 */
static int compare_host(const char *op, const char *shape, const float *got, const float *want,
                        const double *scale, int64_t n) {
    const tol_row *t = tol_of(op);
    double max_abs = 0, max_rel = 0;
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - (double)want[i]);
        if (isnan(got[i]) || isnan(want[i])) e = INFINITY;
        double s = scale ? scale[i] : fabs((double)want[i]);
        if (s < t->floor) s = t->floor;
        const double rel = e == 0 ? 0 : s > 0 ? e / s : INFINITY;
        if (e > max_abs) max_abs = e;
        if (rel > max_rel) max_rel = rel;
        if (!(rel <= t->tol)) {
            if (first < 0) first = i;
            bad++;
        }
    }
    const int pass = bad == 0;
    if (!dry_run) {
        printf("%-12s %-44s max_abs %-9.3g max_rel %-9.3g tol %-7.1g %s\n", op, shape, max_abs,
               max_rel, t->tol, pass ? "PASS" : "FAIL");
        if (!pass)
            printf("  %lld of %lld out of bounds; first [%lld]: tested %.9g, reference %.9g\n",
                   (long long)bad, (long long)n, (long long)first, (double)got[first],
                   (double)want[first]);
    }
    record(op, shape, max_abs, max_rel, t->tol, pass);
    return !pass;
}

/* Downloads n floats at float offset `off` of both sides of p and compares them.
 * @return 1 when it fails (a failed download included). */
static int compare(const char *op, const char *shape, pair p, int64_t off, int64_t n,
                   const double *scale) {
    float *want = fetch(R, rctx, RF(p) + off, n * 4);
    float *got = fetch(T, tctx, TF(p) + off, n * 4);
    int bad = 1;
    if (want && got) {
        bad = compare_host(op, shape, got, want, scale, n);
    } else {
        printf("%-12s %-44s FAIL (download)\n", op, shape);
        record(op, shape, INFINITY, INFINITY, tol_of(op)->tol, 0);
    }
    free(want), free(got);
    return bad;
}

/* Downloads `bytes` at byte offset `off` of both sides of p and compares them byte for
 * byte (op "transfer"; max_abs: the differing bytes). @return 1 when it fails. */
static int compare_bytes(const char *shape, pair p, int64_t off, int64_t bytes) {
    unsigned char *want = fetch(R, rctx, (char *)p.r + off, bytes);
    unsigned char *got = fetch(T, tctx, (char *)p.t + off, bytes);
    int64_t diff = -1;
    if (want && got) {
        diff = 0;
        for (int64_t i = 0; i < bytes; i++) diff += want[i] != got[i];
    }
    const int pass = diff == 0;
    printf("%-12s %-44s differing bytes %lld of %lld  %s\n", "transfer", shape, (long long)diff,
           (long long)bytes, pass ? "PASS" : "FAIL");
    record("transfer", shape, (double)diff, pass ? 0 : INFINITY, 0, pass);
    free(want), free(got);
    return !pass;
}

/* Both sides' sticky errors after a test: a queued fault shows here. @return 1 if any. */
static int sides_ok(const char *what) {
    int bad = 0;
    if (R->sync(rctx) != 0) printf("  %s: reference sync: %s\n", what, fmoe_error_detail()), bad = 1;
    if (T->sync(tctx) != 0) printf("  %s: tested sync: %s\n", what, fmoe_error_detail()), bad = 1;
    return bad;
}

static void garble(void *p, size_t bytes) { memset(p, 0xA5, bytes); }

/* ---------------------------------------------------------------------------------- */
/* The comparisons themselves: planted errors must fail, a near-tie swap must pass      */
/* ---------------------------------------------------------------------------------- */

static int route_ids_compare(const char *shape, const fmoe__route_args *a,
                             const float *logits, const float *rp, const int32_t *rk,
                             const int32_t *tk, const float *rw, const float *tw);

TEST(comparisons_catch_planted_errors) {
    dry_run = 1;
    float want[64], got[64];
    seed(1);
    for (int i = 0; i < 64; i++) want[i] = got[i] = frand();
    ASSERT_EQ(compare_host("attention", "[control] identical", got, want, NULL, 64), 0);
    got[17] += 2e-4f; /* twice attention's bound */
    ASSERT_EQ(compare_host("attention", "[control] planted 2e-4", got, want, NULL, 64), 1);
    got[17] = want[17];
    got[3] = nextafterf(want[3], 2.0f); /* one ulp: an exact op must see it */
    ASSERT_EQ(compare_host("get_rows", "[control] one ulp", got, want, NULL, 64), 1);
    got[3] = NAN;
    ASSERT_EQ(compare_host("matmul.bf16", "[control] NaN", got, want, NULL, 64), 1);
    /* matmul's scale is sum |w*x|: an error of 0.5% of it passes bf16, fails f32 */
    double scale[64];
    for (int i = 0; i < 64; i++) scale[i] = 10, got[i] = want[i] + 0.05f;
    ASSERT_EQ(compare_host("matmul.bf16", "[control] 0.5% of scale", got, want, scale, 64), 0);
    ASSERT_EQ(compare_host("matmul.f32", "[control] 0.5% of scale", got, want, scale, 64), 1);

    /* route ids: a swap of two experts whose probabilities differ by less than TIE_GAP
     * passes, with the weights checked under the widened bound; a real swap fails */
    const fmoe__route_args a = {.n = 1, .num_experts = 4, .top_k = 2, .norm = 1, .scale = 1};
    const float p[4] = {0.4f, 0.3f, 0.3f - 5e-6f, 0.0f};
    const int32_t rk[2] = {0, 1}, tie[2] = {0, 2}, wrong[2] = {0, 3};
    const float rw[2] = {0.4f / 0.7f, 0.3f / 0.7f};
    const float tw[2] = {0.4f / (0.7f - 5e-6f), (0.3f - 5e-6f) / (0.7f - 5e-6f)};
    ASSERT_EQ(route_ids_compare("[control] near tie", &a, NULL, p, rk, tie, rw, tw), 0);
    ASSERT_EQ(route_ids_compare("[control] real swap", &a, NULL, p, rk, wrong, rw, tw), 1);
    /* equal logits: the order is fixed (lower index first), no tie excuses a swap */
    const float lg[4] = {2, 1, 1, 0}, pe[4] = {0.5f, 0.2f, 0.2f, 0.1f};
    const int32_t rke[2] = {0, 1}, tke[2] = {0, 2};
    ASSERT_EQ(route_ids_compare("[control] equal logits swapped", &a, lg, pe, rke, tke, rw, rw), 1);
    dry_run = 0;
}

/* ---------------------------------------------------------------------------------- */
/* Transfers                                                                          */
/* ---------------------------------------------------------------------------------- */

TEST(transfers) {
    seed(2);
    int bad = 0;
    const int64_t n = 1001; /* odd */
    float *h = rand_host(n, 5);
    pair a, b;
    ASSERT_OK(pair_alloc(&a, n * 4, NULL));
    ASSERT_OK(pair_alloc(&b, n * 4, NULL));
    bad += compare("transfer", "alloc zero-fills [1001]", a, 0, n, NULL);
    R->upload(rctx, a.r, h, n * 4), T->upload(tctx, a.t, h, n * 4);
    garble(h, (size_t)n * 4); /* upload's source may be reused at once */
    bad += compare("transfer", "upload/download [1001]", a, 0, n, NULL);
    R->copy(rctx, RF(b) + 10, RF(a) + 21, 500 * 4), T->copy(tctx, TF(b) + 10, TF(a) + 21, 500 * 4);
    bad += compare("transfer", "copy 500 at offsets 21 -> 10", b, 0, n, NULL);
    R->zero(rctx, RF(a) + 101, 57 * 4), T->zero(tctx, TF(a) + 101, 57 * 4);
    bad += compare("transfer", "zero 57 at offset 101", a, 0, n, NULL);
    /* a byte count that is no multiple of 4, at an odd byte offset */
    unsigned char bytes[64];
    for (int i = 0; i < 64; i++) bytes[i] = (unsigned char)(i * 37 + 1);
    R->upload(rctx, (char *)a.r + 1, bytes, 13), T->upload(tctx, (char *)a.t + 1, bytes, 13);
    bad += compare_bytes("13 bytes at byte offset 1", a, 0, 32);
    pair_free(&a), pair_free(&b);
    free(h);
    bad += sides_ok("transfers");
    ASSERT_EQ(bad, 0);
}

/*
 * Pinned host memory: host_register, an upload from it whose source is overwritten as
 * soon as the call returns, an index list in pinned memory reused the same way, then
 * host_unregister. The CUDA backend must wait for a copy from page-locked memory before
 * returning (cuda_forward.cu, "Host arrays").
 */
TEST(host_register_and_reuse) {
    seed(3);
    int bad = 0;
    const int64_t n = 4096, dim = 64, rows = 64;
    float *h = aligned_alloc(4096, (size_t)n * 4);
    for (int64_t i = 0; i < n; i++) h[i] = frand();
    int32_t *idx = aligned_alloc(4096, 4096);
    ASSERT_OK(R->host_register(rctx, h, n * 4));
    ASSERT_OK(T->host_register(tctx, h, n * 4));
    ASSERT_OK(R->host_register(rctx, idx, 4096));
    ASSERT_OK(T->host_register(tctx, idx, 4096));
    pair a, g;
    ASSERT_OK(pair_alloc(&a, n * 4, NULL));
    ASSERT_OK(pair_alloc(&g, 2 * 12 * dim * 4, NULL));
    R->upload(rctx, a.r, h, n * 4), T->upload(tctx, a.t, h, n * 4);
    garble(h, (size_t)n * 4);
    for (int side = 0; side < 2; side++) {
        const fmoe__backend_ops *B = side ? T : R;
        void *ctx = side ? tctx : rctx;
        for (int k = 0; k < 2; k++) { /* two gathers back to back from the one pinned list */
            for (int i = 0; i < 12; i++) idx[i] = (i * (k ? 5 : 7) + 3) % (int32_t)rows;
            B->gather_rows(ctx, (side ? TF(g) : RF(g)) + k * 12 * dim, side ? TF(a) : RF(a),
                           idx, 12, (int32_t)dim);
            garble(idx, 48);
        }
    }
    bad += compare("transfer", "upload from pinned [4096], source reused", a, 0, n, NULL);
    bad += compare("gather_rows", "pinned index list reused, 2x[12][64]", g, 0, 2 * 12 * dim,
                   NULL);
    pair_free(&a), pair_free(&g);
    R->host_unregister(rctx, h), T->host_unregister(tctx, h);
    R->host_unregister(rctx, idx), T->host_unregister(tctx, idx);
    free(h), free(idx);
    bad += sides_ok("host_register");
    ASSERT_EQ(bad, 0);
}

/* ---------------------------------------------------------------------------------- */
/* Compute ops                                                                        */
/* ---------------------------------------------------------------------------------- */

TEST(get_rows) {
    seed(4);
    int bad = 0;
    const int64_t V = 97;
    const int64_t cols_list[3] = {1, 63, 1024};
    const int32_t rows8[8] = {0, 96, 5, 5, 41, 96, 0, 13};
    for (int c = 0; c < 3; c++)
        for (int d = 0; d < 3; d++)
            for (int32_t n = 1; n <= 8; n += 7) {
                const int64_t cols = cols_list[c];
                float *v = rand_host(V * cols, 3);
                fmoe__mat m;
                make_mat(&m, dtypes[d], V, cols, v);
                pair y;
                ASSERT_OK(pair_alloc(&y, n * cols * 4, NULL));
                int32_t rows[8];
                memcpy(rows, rows8, sizeof rows);
                R->get_rows(rctx, &m, rows, n, RF(y));
                T->get_rows(tctx, &m, rows, n, TF(y));
                garble(rows, sizeof rows); /* rows_host may be reused at once */
                char shape[64];
                snprintf(shape, sizeof shape, "%s V=%lld cols=%lld n=%d", dtype_name(dtypes[d]),
                         (long long)V, (long long)cols, n);
                bad += compare("get_rows", shape, y, 0, n * cols, NULL);
                pair_free(&y);
                free(v);
            }
    bad += sides_ok("get_rows");
    ASSERT_EQ(bad, 0);
}

TEST(rmsnorm) {
    seed(5);
    int bad = 0;
    const int32_t dims[4] = {1, 63, 1024, 4095};
    for (int d = 0; d < 4; d++)
        for (int64_t rows = 1; rows <= 6; rows += 5)
            for (int inplace = 0; inplace < 2; inplace++) {
                const int32_t dim = dims[d];
                float *x = rand_host(rows * dim, 3);
                const float *w = weight_vec(dim, 0.5f, 1.0f);
                pair px, py;
                ASSERT_OK(pair_alloc(&px, rows * dim * 4, x));
                ASSERT_OK(pair_alloc(&py, rows * dim * 4, NULL));
                pair out = inplace ? px : py;
                R->rmsnorm(rctx, RF(out), RF(px), w, rows, dim, 1e-6f);
                T->rmsnorm(tctx, TF(out), TF(px), w, rows, dim, 1e-6f);
                char shape[64];
                snprintf(shape, sizeof shape, "rows=%lld dim=%d%s", (long long)rows, dim,
                         inplace ? " in place" : "");
                bad += compare("rmsnorm", shape, out, 0, rows * dim, NULL);
                pair_free(&px), pair_free(&py);
                free(x);
            }
    bad += sides_ok("rmsnorm");
    ASSERT_EQ(bad, 0);
}

/* sum_k |w[r][k] x[t][k]| for every output (the scale of matmul's tolerance), and with
 * `model` the product in double with x rounded to the weight's type (what the CUDA path
 * computes), into ymodel. */
static double *matmul_scale(const fmoe__mat *m, const float *x, int32_t n, float *ymodel) {
    double *s = malloc((size_t)(n * m->rows) * sizeof *s);
    for (int32_t t = 0; t < n; t++)
        for (int64_t r = 0; r < m->rows; r++) {
            double acc = 0, mod = 0;
            for (int64_t k = 0; k < m->cols; k++) {
                const double w = mat_value(m, m->data, r * m->cols + k);
                const float xv = x[t * m->cols + k];
                acc += fabs(w * xv);
                mod += w * round_to(m->dtype, xv);
            }
            s[t * m->rows + r] = acc;
            if (ymodel) ymodel[t * m->rows + r] = (float)mod;
        }
    return s;
}

static const char *matmul_op(fmoe_st_dtype dt) {
    return dt == FMOE_ST_F32 ? "matmul.f32" : dt == FMOE_ST_BF16 ? "matmul.bf16" : "matmul.f16";
}

TEST(matmul) {
    seed(6);
    int bad = 0;
    /* rows, cols, n, offset of x and y into their buffers (floats) */
    static const int64_t cases[][4] = {
        {1, 1, 1, 0},     {7, 3, 2, 0},      {33, 17, 1, 1},    {64, 64, 4, 0},
        {127, 255, 5, 3}, {256, 1024, 1, 0}, {384, 512, 16, 0}, {1000, 1000, 32, 1},
        {2048, 1024, 1, 0}, {2048, 1024, 32, 0}, {96, 2048, 7, 0},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int d = 0; d < 3; d++) {
            const int64_t rows = cases[c][0], cols = cases[c][1], off = cases[c][3];
            const int32_t n = (int32_t)cases[c][2];
            float *v = rand_host(rows * cols, 1);
            float *x = rand_host(n * cols, 1);
            fmoe__mat m;
            make_mat(&m, dtypes[d], rows, cols, v);
            pair px, py;
            ASSERT_OK(pair_alloc(&px, (off + n * cols) * 4, NULL));
            ASSERT_OK(pair_alloc(&py, (off + n * rows) * 4, NULL));
            R->upload(rctx, RF(px) + off, x, n * cols * 4);
            T->upload(tctx, TF(px) + off, x, n * cols * 4);
            R->matmul(rctx, &m, RF(px) + off, n, RF(py) + off);
            T->matmul(tctx, &m, TF(px) + off, n, TF(py) + off);
            float *ymodel = self_mode ? malloc((size_t)(n * rows) * 4) : NULL;
            double *scale = matmul_scale(&m, x, n, ymodel);
            char shape[80];
            snprintf(shape, sizeof shape, "%s [%lld][%lld] n=%d%s", dtype_name(dtypes[d]),
                     (long long)rows, (long long)cols, n, off ? " +offset" : "");
            bad += compare(matmul_op(dtypes[d]), shape, py, off, n * rows, scale);
            if (self_mode) {
                /* the tolerance must hold the CUDA path's rounding of x: the CPU's product
                 * against a double product of x rounded to the weight's type */
                float *cpu = fetch(R, rctx, RF(py) + off, n * rows * 4);
                char mshape[128];
                snprintf(mshape, sizeof mshape, "%s [model: x rounded]", shape);
                bad += compare_host(matmul_op(dtypes[d]), mshape, cpu, ymodel, scale, n * rows);
                free(cpu);
            }
            free(ymodel), free(scale);
            pair_free(&px), pair_free(&py);
            free(v), free(x);
        }
    bad += sides_ok("matmul");
    ASSERT_EQ(bad, 0);
}

/* ---------------------------------------------------------------------------------- */
/* Quantized weights (GGUF's ggml blocks)                                             */
/* ---------------------------------------------------------------------------------- */

/* Every type with CUDA kernels (fmoe__qblock_cuda_has). The blocks of 32 (Q8_0, Q4_0 ..
 * IQ4_NL, MXFP4) go through the kernels with 4 threads a block, the blocks of 256 (the
 * K-quants, IQ4_XS, the i-quants with their device grids) with 32. */
#define NQTYPES 20
static const uint32_t qtypes[NQTYPES] = {
    FMOE_GGML_Q8_0, FMOE_GGML_Q4_K, FMOE_GGML_Q5_K, FMOE_GGML_Q6_K, FMOE_GGML_MXFP4,
    FMOE_GGML_Q4_0, FMOE_GGML_Q4_1, FMOE_GGML_Q5_0, FMOE_GGML_Q5_1, FMOE_GGML_IQ4_NL,
    FMOE_GGML_Q2_K, FMOE_GGML_Q3_K, FMOE_GGML_IQ4_XS, FMOE_GGML_IQ2_XXS, FMOE_GGML_IQ2_XS,
    FMOE_GGML_IQ2_S, FMOE_GGML_IQ3_XXS, FMOE_GGML_IQ3_S, FMOE_GGML_IQ1_S, FMOE_GGML_IQ1_M};

/*
 * A [rows][cols] matrix of ggml blocks of `type`, its data a weight: random bytes (every
 * scale, min and level pattern), with each block's f16 fields set to a modest scale
 * (random f16 bits would include NaN and infinities, which compare as failures). The
 * dequantised values (fmoe_quant_dequantize_row) into *deq[rows·cols], owned by the caller.
 */
static void make_qmat(fmoe__mat *m, uint32_t type, int64_t rows, int64_t cols, float **deq) {
    const int64_t rb = fmoe_quant_row_bytes(type, cols), bb = fmoe_ggml_type_size(type);
    uint8_t *d = weight_alloc((size_t)(rows * rb));
    for (int64_t i = 0; i < rows * rb; i++) d[i] = (uint8_t)(irand(256));
    for (int64_t b = 0; b < rows * rb; b += bb) {
        if (type == FMOE_GGML_MXFP4) { /* an E8M0 scale byte: 2^(e - 128), e in 118..125 */
            d[b] = (uint8_t)(118 + irand(8));
            continue;
        }
        const uint16_t h1 = fmoe_float_to_half(0.02f * frand());
        const uint16_t h2 = fmoe_float_to_half(0.02f * frand());
        if (type == FMOE_GGML_IQ1_M) { /* d in the top nibbles of the 4 scale words @48 */
            for (int w = 0; w < 4; w++)
                d[b + 48 + 2 * w + 1] = (uint8_t)((d[b + 48 + 2 * w + 1] & 0x0F) |
                                                  (((h1 >> (4 * w)) & 0xF) << 4));
            continue;
        }
        /* d (Q6_K, Q2_K, Q3_K: at the block's end) and the types' second f16, a min */
        const int64_t d_at = type == FMOE_GGML_Q6_K   ? 208
                             : type == FMOE_GGML_Q2_K ? 80
                             : type == FMOE_GGML_Q3_K ? 108
                                                      : 0;
        const int has_min = type == FMOE_GGML_Q4_K || type == FMOE_GGML_Q5_K ||
                            type == FMOE_GGML_Q4_1 || type == FMOE_GGML_Q5_1 ||
                            type == FMOE_GGML_Q2_K;
        memcpy(d + b + d_at, &h1, 2);
        if (has_min) memcpy(d + b + d_at + 2, &h2, 2);
    }
    memset(m, 0, sizeof *m);
    m->data = d, m->dtype = FMOE_ST_U8, m->quant = type, m->rows = rows, m->cols = cols;
    *deq = malloc((size_t)(rows * cols) * sizeof **deq);
    for (int64_t r = 0; r < rows; r++)
        fmoe_quant_dequantize_row(type, d + r * rb, *deq + r * cols, cols);
}

/* The CUDA decode kernel's sum for one output, replayed on the host (cuda_quant.cu,
 * quant_matvec_kernel): lane l takes values 8l..8l+7 of every 256, fmaf in value order,
 * then the xor butterfly over 32 lanes. fmaf is exact-then-rounded on both sides. */
static float gpu_order_dot(const float *w, const float *x, int64_t cols) {
    float lane[32];
    for (int l = 0; l < 32; l++) {
        float s = 0.0f;
        for (int64_t v = 8 * l; v < cols; v += 256)
            for (int i = 0; i < 8; i++) s = fmaf(w[v + i], x[v + i], s);
        lane[l] = s;
    }
    for (int o = 16; o > 0; o >>= 1) {
        float next[32];
        for (int l = 0; l < 32; l++) next[l] = lane[l] + lane[l ^ o];
        memcpy(lane, next, sizeof lane);
    }
    return lane[0];
}

/*
 * The checks of one quantized product y[n][rows] = x[n][cols]·wᵀ (w: the dequantised
 * weights) held at float offset `off` of both sides of py:
 *   tested vs CPU            matmul.quant.cpu (wide enough for 8-bit activations)
 *   tested vs double         matmul.quant (CUDA only: the CPU may quantise x)
 *   tested vs replayed order matmul.quant.order (CUDA only, n <= 8: the decode kernel)
 * --self checks instead that the CPU's result lies within matmul.quant.cpu's bound of the
 * double product, and the replayed order within matmul.quant's: the bounds the CUDA run
 * relies on. @return the failures.
 */
static int check_quant_product(const char *shape, uint32_t type, pair py, int64_t off,
                               const float *w, int64_t rows, int64_t cols, const float *x,
                               int32_t n) {
    const int64_t m = (int64_t)n * rows, xb = fmoe_ggml_block_size(type) == 32 ? 32 : 256;
    double *s1 = malloc((size_t)m * sizeof *s1), *s8 = malloc((size_t)m * sizeof *s8);
    float *exact = malloc((size_t)m * 4), *order = malloc((size_t)m * 4);
    for (int32_t t = 0; t < n; t++)
        for (int64_t r = 0; r < rows; r++) {
            const float *wr = w + r * cols, *xt = x + t * cols;
            double acc = 0, mod = 0, q = 0;
            for (int64_t b = 0; b < cols; b += xb) {
                double amax = 0, wsum = 0;
                for (int64_t k = b; k < b + xb; k++) {
                    const double p = (double)wr[k] * xt[k];
                    acc += fabs(p), mod += p;
                    amax = fmax(amax, fabs((double)xt[k]));
                    wsum += fabs((double)wr[k]);
                }
                q += amax / 200 * wsum;
            }
            s1[t * rows + r] = acc;
            s8[t * rows + r] = acc + q / tol_of("matmul.quant.cpu")->tol;
            exact[t * rows + r] = (float)mod;
            order[t * rows + r] = n <= 8 ? gpu_order_dot(wr, xt, cols) : 0.0f;
        }
    int bad = compare("matmul.quant.cpu", shape, py, off, m, s8);
    char sub[160];
    if (self_mode) {
        float *cpu = fetch(R, rctx, RF(py) + off, m * 4);
        snprintf(sub, sizeof sub, "%s [model: cpu vs double]", shape);
        bad += cpu ? compare_host("matmul.quant.cpu", sub, cpu, exact, s8, m) : 1;
        snprintf(sub, sizeof sub, "%s [model: cuda order vs double]", shape);
        if (n <= 8) bad += compare_host("matmul.quant", sub, order, exact, s1, m);
        free(cpu);
    } else {
        float *got = fetch(T, tctx, TF(py) + off, m * 4);
        snprintf(sub, sizeof sub, "%s vs double", shape);
        bad += got ? compare_host("matmul.quant", sub, got, exact, s1, m) : 1;
        snprintf(sub, sizeof sub, "%s vs its order", shape);
        if (got && n <= 8) bad += compare_host("matmul.quant.order", sub, got, order, NULL, m);
        free(got);
    }
    free(s1), free(s8), free(exact), free(order);
    return bad;
}

/*
 * Every quantized type through both CUDA paths: n <= 8 rows of x (the on-the-fly matvec
 * kernel; 8 is FMOE_CUDA_QMV_MAX_N), n > 8 (tiles dequantised for SGEMM; 4500 x 2048,
 * run for Q4_K only, is two tiles of the 32 MiB scratch). Q8_0 rows that are not a multiple of 256 values
 * leave lanes idle at the row's end; x and y at an odd float offset are unaligned for
 * vector loads.
 */
TEST(matmul_quantized) {
    seed(16);
    int bad = 0;
    /* rows, cols (Q8_0; K-quants round up to a multiple of 256), n, offset */
    static const int64_t cases[][4] = {
        {1, 32, 1, 0},     {7, 96, 2, 1},     {33, 256, 1, 0},   {300, 1024, 8, 1},
        {129, 768, 5, 0},  {64, 512, 9, 0},   {1000, 1024, 32, 1}, {4500, 2048, 9, 0},
        {2048, 4096, 1, 0},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int q = 0; q < NQTYPES; q++) {
            const uint32_t type = qtypes[q];
            const int64_t bs = fmoe_ggml_block_size(type);
            const int64_t rows = cases[c][0], off = cases[c][3];
            if (rows == 4500 && type != FMOE_GGML_Q4_K) continue; /* seconds: one type */
            const int64_t cols = (cases[c][1] + bs - 1) / bs * bs;
            const int32_t n = (int32_t)cases[c][2];
            float *deq, *x = rand_host(n * cols, 1);
            fmoe__mat m;
            make_qmat(&m, type, rows, cols, &deq);
            pair px, py;
            ASSERT_OK(pair_alloc(&px, (off + n * cols) * 4, NULL));
            ASSERT_OK(pair_alloc(&py, (off + n * rows) * 4, NULL));
            R->upload(rctx, RF(px) + off, x, n * cols * 4);
            T->upload(tctx, TF(px) + off, x, n * cols * 4);
            R->matmul(rctx, &m, RF(px) + off, n, RF(py) + off);
            T->matmul(tctx, &m, TF(px) + off, n, TF(py) + off);
            char shape[80];
            snprintf(shape, sizeof shape, "%s [%lld][%lld] n=%d%s", fmoe_ggml_type_name(type),
                     (long long)rows, (long long)cols, n, off ? " +offset" : "");
            bad += check_quant_product(shape, type, py, off, deq, rows, cols, x, n);
            free(deq), free(x);
            pair_free(&px), pair_free(&py);
        }
    bad += sides_ok("matmul_quantized");
    ASSERT_EQ(bad, 0);
}

/* Embedding rows of quantized tables (a GGUF's token_embd): bit for bit. */
TEST(get_rows_quantized) {
    seed(17);
    int bad = 0;
    const int64_t V = 97;
    const int32_t rows8[8] = {0, 96, 5, 5, 41, 96, 0, 13};
    for (int q = 0; q < NQTYPES; q++)
        for (int64_t cols = 256; cols <= 2048; cols *= 8)
            for (int32_t n = 1; n <= 8; n += 7) {
                const uint32_t type = qtypes[q];
                float *deq;
                fmoe__mat m;
                make_qmat(&m, type, V, cols, &deq);
                pair y;
                ASSERT_OK(pair_alloc(&y, n * cols * 4, NULL));
                int32_t rows[8];
                memcpy(rows, rows8, sizeof rows);
                R->get_rows(rctx, &m, rows, n, RF(y));
                T->get_rows(tctx, &m, rows, n, TF(y));
                garble(rows, sizeof rows);
                char shape[64];
                snprintf(shape, sizeof shape, "%s V=%lld cols=%lld n=%d",
                         fmoe_ggml_type_name(type), (long long)V, (long long)cols, n);
                bad += compare("get_rows", shape, y, 0, n * cols, NULL);
                if (self_mode) { /* the reference itself: fmoe_quant_dequantize_row's rows */
                    float *got = fetch(R, rctx, RF(y), n * cols * 4);
                    float *want = malloc((size_t)(n * cols) * 4);
                    for (int32_t i = 0; i < n; i++)
                        memcpy(want + i * cols, deq + rows8[i] * cols, (size_t)cols * 4);
                    snprintf(shape + strlen(shape), sizeof shape - strlen(shape), " [model]");
                    bad += compare_host("get_rows", shape, got, want, NULL, n * cols);
                    free(got), free(want);
                }
                pair_free(&y);
                free(deq);
            }
    bad += sides_ok("get_rows_quantized");
    ASSERT_EQ(bad, 0);
}

/*
 * A quantized expert in a slot: its blocks written with write_slot from the I/O context,
 * then multiplied with on_backend 1 on both paths (decode and prefill widths), against
 * the same product from the host copy.
 */
TEST(matmul_quantized_from_slot) {
    seed(18);
    int bad = 0;
    const int64_t rows = 512, cols = 1024;
    for (int q = 0; q < NQTYPES; q++) {
        const uint32_t type = qtypes[q];
        const int64_t bytes = rows * fmoe_quant_row_bytes(type, cols);
        float *deq;
        fmoe__mat hm;
        make_qmat(&hm, type, rows, cols, &deq);
        for (int32_t n = 1; n <= 16; n += 15) {
            float *x = rand_host(n * cols, 1);
            pair slot, px, py;
            ASSERT_OK(pair_alloc(&slot, bytes, NULL));
            ASSERT_OK(pair_alloc(&px, n * cols * 4, x));
            ASSERT_OK(pair_alloc(&py, n * rows * 4, NULL));
            for (int side = 0; side < 2; side++) {
                const fmoe__backend_ops *B = side ? T : R;
                void *ctx = side ? tctx : rctx, *io = side ? tio : rio;
                fmoe__mat m = hm;
                m.data = side ? slot.t : slot.r;
                m.on_backend = 1;
                ASSERT_OK(B->write_slot(io, side ? slot.t : slot.r, hm.data, bytes));
                B->matmul(ctx, &m, side ? TF(px) : RF(px), n, side ? TF(py) : RF(py));
            }
            char shape[80];
            snprintf(shape, sizeof shape, "%s slot [%lld][%lld] n=%d", fmoe_ggml_type_name(type),
                     (long long)rows, (long long)cols, n);
            bad += check_quant_product(shape, type, py, 0, deq, rows, cols, x, n);
            free(x);
            pair_free(&slot), pair_free(&px), pair_free(&py);
        }
        free(deq);
    }
    bad += sides_ok("matmul_quantized_from_slot");
    if (T->sync(tio) != 0) printf("  slot: I/O context: %s\n", fmoe_error_detail()), bad++;
    ASSERT_EQ(bad, 0);
}

TEST(add_bias_clamp_add_swiglu) {
    seed(7);
    int bad = 0;
    char shape[64];
    for (int32_t n = 1; n <= 7; n += 6)
        for (int64_t d = 1; d <= 1000; d += 999) {
            float *y = rand_host(n * d, 2);
            const float *b = weight_vec(d, 1, 0);
            pair py;
            ASSERT_OK(pair_alloc(&py, n * d * 4, y));
            R->add_bias(rctx, RF(py), b, n, d), T->add_bias(tctx, TF(py), b, n, d);
            snprintf(shape, sizeof shape, "n=%d d=%lld", n, (long long)d);
            bad += compare("add_bias", shape, py, 0, n * d, NULL);
            pair_free(&py);
            free(y);
        }
    for (int64_t count = 1; count <= 4097; count += 4096) {
        float *y = rand_host(count, 2), *x = rand_host(count, 2);
        pair py, px;
        ASSERT_OK(pair_alloc(&py, count * 4, y));
        ASSERT_OK(pair_alloc(&px, count * 4, x));
        R->clamp(rctx, RF(py), count, 0.5f), T->clamp(tctx, TF(py), count, 0.5f);
        snprintf(shape, sizeof shape, "count=%lld c=0.5", (long long)count);
        bad += compare("clamp", shape, py, 0, count, NULL);
        R->add(rctx, RF(py), RF(px), count), T->add(tctx, TF(py), TF(px), count);
        snprintf(shape, sizeof shape, "count=%lld", (long long)count);
        bad += compare("add", shape, py, 0, count, NULL);
        pair_free(&py), pair_free(&px);
        free(y), free(x);
    }
    const int64_t counts[3] = {1, 1001, 65536};
    for (int c = 0; c < 3; c++) {
        const int64_t count = counts[c];
        float *g = rand_host(count, 6), *u = rand_host(count, 2);
        pair pg, pu;
        ASSERT_OK(pair_alloc(&pg, count * 4, g));
        ASSERT_OK(pair_alloc(&pu, count * 4, u));
        R->swiglu(rctx, RF(pg), RF(pu), count), T->swiglu(tctx, TF(pg), TF(pu), count);
        snprintf(shape, sizeof shape, "count=%lld gate in [-6,6)", (long long)count);
        bad += compare("swiglu", shape, pg, 0, count, NULL);
        pair_free(&pg), pair_free(&pu);
        free(g), free(u);
    }
    bad += sides_ok("elementwise");
    ASSERT_EQ(bad, 0);
}

TEST(add_gated) {
    seed(8);
    int bad = 0;
    for (int32_t n = 1; n <= 6; n += 5)
        for (int32_t dim = 1; dim <= 1000; dim += 999) {
            float *y = rand_host(n * dim, 1), *x = rand_host(n * dim, 1), *g = rand_host(n, 4);
            pair py, px, pg;
            ASSERT_OK(pair_alloc(&py, n * dim * 4, y));
            ASSERT_OK(pair_alloc(&px, n * dim * 4, x));
            ASSERT_OK(pair_alloc(&pg, n * 4, g));
            R->add_gated(rctx, RF(py), RF(px), RF(pg), n, dim);
            T->add_gated(tctx, TF(py), TF(px), TF(pg), n, dim);
            char shape[64];
            snprintf(shape, sizeof shape, "n=%d dim=%d", n, dim);
            bad += compare("add_gated", shape, py, 0, n * dim, NULL);
            pair_free(&py), pair_free(&px), pair_free(&pg);
            free(y), free(x), free(g);
        }
    bad += sides_ok("add_gated");
    ASSERT_EQ(bad, 0);
}

TEST(rope) {
    seed(9);
    int bad = 0;
    const int32_t dims[3] = {2, 64, 128};
    for (int d = 0; d < 3; d++)
        for (int32_t n = 1; n <= 5; n += 4)
            for (int32_t heads = 1; heads <= 8; heads += 7) {
                const int32_t D = dims[d], half = D / 2;
                float *x = rand_host((int64_t)n * heads * D, 2);
                float *cs = malloc((size_t)(n * half) * 4), *sn = malloc((size_t)(n * half) * 4);
                for (int32_t i = 0; i < n * half; i++) {
                    const float ang = 40 * frand();
                    cs[i] = cosf(ang), sn[i] = sinf(ang);
                }
                pair px, pc, ps;
                ASSERT_OK(pair_alloc(&px, (int64_t)n * heads * D * 4, x));
                ASSERT_OK(pair_alloc(&pc, n * half * 4, cs));
                ASSERT_OK(pair_alloc(&ps, n * half * 4, sn));
                R->rope(rctx, RF(px), n, heads, D, RF(pc), RF(ps));
                T->rope(tctx, TF(px), n, heads, D, TF(pc), TF(ps));
                char shape[64];
                snprintf(shape, sizeof shape, "n=%d heads=%d head_dim=%d", n, heads, D);
                bad += compare("rope", shape, px, 0, (int64_t)n * heads * D, NULL);
                pair_free(&px), pair_free(&pc), pair_free(&ps);
                free(x), free(cs), free(sn);
            }
    bad += sides_ok("rope");
    ASSERT_EQ(bad, 0);
}

TEST(attention) {
    seed(10);
    int bad = 0;
    /* n, pos0, Hq, Hkv, D, window */
    static const int32_t cases[][6] = {
        {1, 37, 4, 4, 64, 0},   /* decode, group 1 */
        {13, 0, 8, 2, 128, 0},  /* prefill, GQA group 4 */
        {5, 20, 4, 1, 64, 0},   /* a chunk after a prefix, group 4 */
        {1, 100, 8, 2, 64, 16}, /* decode in a sliding window */
        {9, 30, 4, 4, 128, 7},  /* prefill chunk in a window of 7 */
        {3, 5, 6, 3, 64, 100},  /* window wider than the context, group 2 */
        {1, 0, 2, 2, 64, 0},    /* the very first token: one key */
        {2, 60000, 2, 1, 64, 0},    /* 60002 keys: past shared memory on H100 (~58k) */
        {2, 60000, 4, 1, 128, 4096}, /* the same context, windowed */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int32_t n = cases[c][0], pos0 = cases[c][1], Hq = cases[c][2], Hkv = cases[c][3];
        const int32_t D = cases[c][4], window = cases[c][5];
        const int64_t ctx_len = pos0 + n, qn = (int64_t)n * Hq * D;
        float *q = rand_host(qn, 1);
        float *k = rand_host(ctx_len * Hkv * D, 1), *v = rand_host(ctx_len * Hkv * D, 1);
        pair pq, pk, pv, po;
        ASSERT_OK(pair_alloc(&pq, qn * 4, q));
        ASSERT_OK(pair_alloc(&pk, ctx_len * Hkv * D * 4, k));
        ASSERT_OK(pair_alloc(&pv, ctx_len * Hkv * D * 4, v));
        ASSERT_OK(pair_alloc(&po, qn * 4, NULL));
        fmoe__attn_args a = {.n = n, .pos0 = pos0, .n_heads = Hq, .n_kv_heads = Hkv,
                             .head_dim = D, .window = window, .scale = 1.0f / sqrtf((float)D)};
        a.q = RF(pq), a.k_cache = RF(pk), a.v_cache = RF(pv), a.out = RF(po);
        R->attention(rctx, &a);
        a.q = TF(pq), a.k_cache = TF(pk), a.v_cache = TF(pv), a.out = TF(po);
        T->attention(tctx, &a);
        char shape[80];
        snprintf(shape, sizeof shape, "n=%d pos0=%d Hq=%d Hkv=%d D=%d window=%d", n, pos0, Hq,
                 Hkv, D, window);
        bad += compare("attention", shape, po, 0, qn, NULL);
        pair_free(&pq), pair_free(&pk), pair_free(&pv), pair_free(&po);
        free(q), free(k), free(v);
    }
    bad += sides_ok("attention");
    ASSERT_EQ(bad, 0);
}

/*
 * route's top-k ids, rank by rank: a different id passes only as a near tie (the
 * reference's probabilities of the two ids closer than TIE_GAP), never where the two
 * logits are equal (fmoe_topk_row: the lower index first, which a backend computing equal
 * probabilities from equal logits must keep). The weights of a row with a near-tie swap
 * are checked under a bound widened by what the swap moves them (2·scale·gap / the top-k
 * sum). Prints two lines (ids, weights). @return 1 on failure.
 */
static int route_ids_compare(const char *shape, const fmoe__route_args *a,
                             const float *logits, const float *rp, const int32_t *rk,
                             const int32_t *tk, const float *rw, const float *tw) {
    const int32_t J = a->num_experts, K = a->top_k;
    const tol_row *tw_tol = tol_of("route.topw");
    int64_t mismatched = 0, ties = 0;
    double w_abs = 0, w_rel = 0;
    int w_bad = 0;
    for (int32_t t = 0; t < a->n; t++) {
        double gap = 0, sum = 0;
        for (int32_t r = 0; r < K; r++) {
            const int32_t it = tk[t * K + r], ir = rk[t * K + r];
            sum += rp[(int64_t)t * J + ir];
            if (it == ir) continue;
            if (it < 0 || it >= J) {
                mismatched++;
                continue;
            }
            const double g = fabs((double)rp[(int64_t)t * J + it] - rp[(int64_t)t * J + ir]);
            const int equal_logits =
                logits && logits[(int64_t)t * J + it] == logits[(int64_t)t * J + ir];
            if (g < TIE_GAP && !equal_logits) {
                ties++;
                if (g > gap) gap = g;
            } else {
                mismatched++;
            }
        }
        if (!a->norm) sum = 1;
        sum += a->norm_eps;
        const double extra = gap > 0 ? 2.0 * a->scale * gap / (sum < 1e-6 ? 1e-6 : sum) : 0;
        for (int32_t r = 0; r < K; r++) {
            const double want = rw[t * K + r], got = tw[t * K + r];
            double e = fabs(got - want);
            if (isnan(got) || isnan(want)) e = INFINITY;
            const double s = fabs(want) > tw_tol->floor ? fabs(want) : tw_tol->floor;
            if (e > w_abs) w_abs = e;
            if (e / s > w_rel) w_rel = e / s;
            if (!(e <= tw_tol->tol * s + extra)) w_bad = 1;
        }
    }
    const int ids_pass = mismatched == 0;
    if (!dry_run)
        printf("%-12s %-44s mismatched %lld, near-tie swaps %lld  tie gap %.0e  %s\n",
               "route.topk", shape, (long long)mismatched, (long long)ties, TIE_GAP,
               ids_pass ? "PASS" : "FAIL");
    record("route.topk", shape, (double)mismatched, (double)ties, 0, ids_pass);
    if (!dry_run)
        printf("%-12s %-44s max_abs %-9.3g max_rel %-9.3g tol %-7.1g %s\n", "route.topw", shape,
               w_abs, w_rel, tw_tol->tol, w_bad ? "FAIL" : "PASS");
    record("route.topw", shape, w_abs, w_rel, tw_tol->tol, !w_bad);
    return !ids_pass || w_bad;
}

TEST(route) {
    seed(11);
    int bad = 0;
    /* J, K, n, sigmoid, norm, scale (norm_eps 1e-20 with sigmoid, as DeepSeek) */
    static const float cases[][6] = {
        {8, 1, 1, 0, 0, 1},    {8, 2, 9, 0, 1, 1},    {8, 8, 9, 0, 1, 1},
        {60, 1, 9, 0, 0, 1},   {60, 2, 1, 0, 1, 1},   {60, 2, 9, 0, 1, 1},
        {60, 8, 9, 0, 1, 1},   {60, 8, 5, 1, 1, 2.5f}, {128, 1, 9, 0, 1, 1},
        {128, 2, 9, 0, 0, 1},  {128, 8, 1, 0, 1, 1},  {128, 8, 9, 0, 1, 1},
        {128, 8, 9, 1, 1, 2.5f},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        fmoe__route_args a = {.num_experts = (int32_t)cases[c][0], .top_k = (int32_t)cases[c][1],
                              .n = (int32_t)cases[c][2], .sigmoid = (int32_t)cases[c][3],
                              .norm = (int32_t)cases[c][4], .scale = cases[c][5]};
        a.norm_eps = a.sigmoid ? 1e-20f : 0;
        const int32_t J = a.num_experts, K = a.top_k, n = a.n;
        float *logits = rand_host((int64_t)n * J, 4);
        if (n > 1 && K > 1) /* exact ties in row 1: the lower index must come first */
            logits[J + 3] = logits[J + 5] = logits[J + J - 1] = 4.5f;
        pair pl, pp, pk, pw;
        ASSERT_OK(pair_alloc(&pl, (int64_t)n * J * 4, logits));
        ASSERT_OK(pair_alloc(&pp, (int64_t)n * J * 4, NULL));
        ASSERT_OK(pair_alloc(&pk, (int64_t)n * K * 4, NULL));
        ASSERT_OK(pair_alloc(&pw, (int64_t)n * K * 4, NULL));
        R->route(rctx, &a, RF(pl), RF(pp), (int32_t *)pk.r, RF(pw));
        T->route(tctx, &a, TF(pl), TF(pp), (int32_t *)pk.t, TF(pw));
        char shape[80];
        snprintf(shape, sizeof shape, "J=%d K=%d n=%d %s%s scale=%g", J, K, n,
                 a.sigmoid ? "sigmoid" : "softmax", a.norm ? " norm" : "", (double)a.scale);
        bad += compare("route.probs", shape, pp, 0, (int64_t)n * J, NULL);
        float *rp = fetch(R, rctx, pp.r, (int64_t)n * J * 4);
        int32_t *rk = fetch(R, rctx, pk.r, (int64_t)n * K * 4);
        int32_t *tk = fetch(T, tctx, pk.t, (int64_t)n * K * 4);
        float *rw = fetch(R, rctx, pw.r, (int64_t)n * K * 4);
        float *tw = fetch(T, tctx, pw.t, (int64_t)n * K * 4);
        if (rp && rk && tk && rw && tw)
            bad += route_ids_compare(shape, &a, logits, rp, rk, tk, rw, tw);
        else
            bad++;
        free(rp), free(rk), free(tk), free(rw), free(tw);
        pair_free(&pl), pair_free(&pp), pair_free(&pk), pair_free(&pw);
        free(logits);
    }
    bad += sides_ok("route");
    ASSERT_EQ(bad, 0);
}

/* ---------------------------------------------------------------------------------- */
/* The ops of the families added later: DeepSeek-V2/V3 (MLA, grouped routing), GLM-4.5 */
/* (partial rotary, biased sigmoid routing), Phi-3.5-MoE (LayerNorm, sparsemixer),      */
/* gpt-oss (sinks, clamped SwiGLU; MXFP4 is in the quantized tests above), Llama 4      */
/* (chunked and temperature-tuned attention, a composition of attention calls)          */
/* ---------------------------------------------------------------------------------- */

TEST(layernorm) {
    seed(20);
    int bad = 0;
    const int32_t dims[4] = {1, 63, 1024, 4095};
    for (int d = 0; d < 4; d++)
        for (int64_t rows = 1; rows <= 6; rows += 5)
            for (int inplace = 0; inplace < 2; inplace++) {
                const int32_t dim = dims[d];
                float *x = rand_host(rows * dim, 3);
                for (int64_t i = 0; i < rows * dim; i++) x[i] += 0.75f; /* a mean to remove */
                const float *w = weight_vec(dim, 0.5f, 1.0f), *b = weight_vec(dim, 0.5f, 0.0f);
                pair px, py;
                ASSERT_OK(pair_alloc(&px, rows * dim * 4, x));
                ASSERT_OK(pair_alloc(&py, rows * dim * 4, NULL));
                pair out = inplace ? px : py;
                R->layernorm(rctx, RF(out), RF(px), w, b, rows, dim, 1e-5f);
                T->layernorm(tctx, TF(out), TF(px), w, b, rows, dim, 1e-5f);
                char shape[64];
                snprintf(shape, sizeof shape, "rows=%lld dim=%d%s", (long long)rows, dim,
                         inplace ? " in place" : "");
                bad += compare("layernorm", shape, out, 0, rows * dim, NULL);
                pair_free(&px), pair_free(&py);
                free(x);
            }
    bad += sides_ok("layernorm");
    ASSERT_EQ(bad, 0);
}

/* GLM-4.5's partial rotary: the first rot_dim of each head rotate, the rest must come back
 * untouched (compared with the rest; rot_dim = head_dim is plain rope through this entry). */
TEST(rope_partial) {
    seed(21);
    int bad = 0;
    /* head_dim, rot_dim */
    static const int32_t cases[][2] = {{32, 16}, {64, 32}, {128, 64}, {128, 128}, {96, 2}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int32_t n = 1; n <= 5; n += 4)
            for (int32_t heads = 1; heads <= 8; heads += 7) {
                const int32_t D = cases[c][0], rd = cases[c][1], half = rd / 2;
                float *x = rand_host((int64_t)n * heads * D, 2);
                float *cs = malloc((size_t)(n * half) * 4), *sn = malloc((size_t)(n * half) * 4);
                for (int32_t i = 0; i < n * half; i++) {
                    const float ang = 40 * frand();
                    cs[i] = cosf(ang), sn[i] = sinf(ang);
                }
                pair px, pc, ps;
                ASSERT_OK(pair_alloc(&px, (int64_t)n * heads * D * 4, x));
                ASSERT_OK(pair_alloc(&pc, n * half * 4, cs));
                ASSERT_OK(pair_alloc(&ps, n * half * 4, sn));
                R->rope_partial(rctx, RF(px), n, heads, D, rd, RF(pc), RF(ps));
                T->rope_partial(tctx, TF(px), n, heads, D, rd, TF(pc), TF(ps));
                char shape[64];
                snprintf(shape, sizeof shape, "n=%d heads=%d head_dim=%d rot=%d", n, heads, D,
                         rd);
                bad += compare("rope", shape, px, 0, (int64_t)n * heads * D, NULL);
                if (rd < D) { /* the reference itself: the unrotated dims are the input's */
                    float *got = fetch(R, rctx, RF(px), (int64_t)n * heads * D * 4);
                    int64_t moved = 0;
                    for (int64_t r = 0; got && r < (int64_t)n * heads; r++)
                        for (int32_t i = rd; i < D; i++) moved += got[r * D + i] != x[r * D + i];
                    if (!got || moved) printf("  rope_partial: %lld unrotated dims moved\n",
                                              (long long)moved), bad++;
                    free(got);
                }
                pair_free(&px), pair_free(&pc), pair_free(&ps);
                free(x), free(cs), free(sn);
            }
    bad += sides_ok("rope_partial");
    ASSERT_EQ(bad, 0);
}

/* gpt-oss's experts: gates past the limit, ups past ±limit, both clamps and the sigmoid's
 * alpha (1.702, published) exercised. */
TEST(swiglu_clamped) {
    seed(22);
    int bad = 0;
    const int64_t counts[3] = {1, 1001, 65536};
    const float limits[2] = {7.0f, 1.5f};
    for (int c = 0; c < 3; c++)
        for (int l = 0; l < 2; l++) {
            const int64_t count = counts[c];
            float *g = rand_host(count, 12), *u = rand_host(count, 12);
            pair pg, pu;
            ASSERT_OK(pair_alloc(&pg, count * 4, g));
            ASSERT_OK(pair_alloc(&pu, count * 4, u));
            R->swiglu_clamped(rctx, RF(pg), RF(pu), count, 1.702f, limits[l]);
            T->swiglu_clamped(tctx, TF(pg), TF(pu), count, 1.702f, limits[l]);
            char shape[64];
            snprintf(shape, sizeof shape, "count=%lld limit=%g in [-12,12)", (long long)count,
                     (double)limits[l]);
            bad += compare("swiglu", shape, pg, 0, count, NULL);
            pair_free(&pg), pair_free(&pu);
            free(g), free(u);
        }
    bad += sides_ok("swiglu_clamped");
    ASSERT_EQ(bad, 0);
}

/* gpt-oss's attention sinks: a logit per head in the softmax, no value. Large sinks take
 * most of the probability (outputs near 0), small ones little; windows and GQA groups as
 * gpt-oss has them. The sink is added after the scores wherever they are kept, so the
 * long-context path (scores in global memory, TEST(attention)'s 60000 keys) is left out
 * here: under memcheck_ops it would cost seconds for no new line of the kernel. */
TEST(attention_sinks) {
    seed(23);
    int bad = 0;
    /* n, pos0, Hq, Hkv, D, window, sink scale */
    static const int32_t cases[][7] = {
        {1, 37, 4, 4, 64, 0, 2},  {13, 0, 8, 2, 64, 0, 2},  {1, 100, 8, 2, 64, 4, 8},
        {9, 30, 4, 1, 64, 4, 1},  {1, 0, 2, 2, 64, 0, 8},   {3, 5, 6, 3, 128, 100, 2},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int32_t n = cases[c][0], pos0 = cases[c][1], Hq = cases[c][2], Hkv = cases[c][3];
        const int32_t D = cases[c][4], window = cases[c][5];
        const int64_t ctx_len = pos0 + n, qn = (int64_t)n * Hq * D;
        float *q = rand_host(qn, 1);
        float *k = rand_host(ctx_len * Hkv * D, 1), *v = rand_host(ctx_len * Hkv * D, 1);
        const float *sinks = weight_vec(Hq, (float)cases[c][6], 0.0f);
        pair pq, pk, pv, po;
        ASSERT_OK(pair_alloc(&pq, qn * 4, q));
        ASSERT_OK(pair_alloc(&pk, ctx_len * Hkv * D * 4, k));
        ASSERT_OK(pair_alloc(&pv, ctx_len * Hkv * D * 4, v));
        ASSERT_OK(pair_alloc(&po, qn * 4, NULL));
        fmoe__attn_args a = {.n = n, .pos0 = pos0, .n_heads = Hq, .n_kv_heads = Hkv,
                             .head_dim = D, .window = window, .scale = 1.0f / sqrtf((float)D),
                             .sinks = sinks};
        a.q = RF(pq), a.k_cache = RF(pk), a.v_cache = RF(pv), a.out = RF(po);
        R->attention(rctx, &a);
        a.q = TF(pq), a.k_cache = TF(pk), a.v_cache = TF(pv), a.out = TF(po);
        T->attention(tctx, &a);
        char shape[80];
        snprintf(shape, sizeof shape, "sinks n=%d pos0=%d Hq=%d Hkv=%d D=%d window=%d", n, pos0,
                 Hq, Hkv, D, window);
        bad += compare("attention", shape, po, 0, qn, NULL);
        pair_free(&pq), pair_free(&pk), pair_free(&pv), pair_free(&po);
        free(q), free(k), free(v);
    }
    bad += sides_ok("attention_sinks");
    ASSERT_EQ(bad, 0);
}

/* Llama 4's attention as the forward pass issues it (family_llama4.c): chunks of 8 and a
 * NoPE layer's query temperature, each a run of rows issued as one attention call with the
 * cache pointers moved; the device side sees only offsets into its buffers. */
TEST(llama4_attention) {
    seed(24);
    int bad = 0;
    int32_t nope[2] = {0, 1}, chunk[2] = {8, 0};
    const fmoe__arch arch = {.layer_nope = nope, .attn_chunk = chunk, .attn_temp_scale = 0.5f,
                             .attn_floor_scale = 4.0f};
    /* n, pos0, layer (0: chunked, 1: NoPE with temperature) */
    static const int32_t cases[][3] = {{12, 0, 0}, {1, 21, 0}, {5, 14, 0},
                                       {12, 0, 1}, {1, 43, 1}, {6, 9, 1}};
    const int32_t Hq = 4, Hkv = 2, D = 64;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int32_t n = cases[c][0], pos0 = cases[c][1], li = cases[c][2];
        const int64_t kd = (int64_t)Hkv * D, ctx_len = pos0 + n, qn = (int64_t)n * Hq * D;
        float *q = rand_host(qn, 1), *k = rand_host(ctx_len * kd, 1);
        float *v = rand_host(ctx_len * kd, 1);
        pair pq, pk, pv, po;
        ASSERT_OK(pair_alloc(&pq, qn * 4, q));
        ASSERT_OK(pair_alloc(&pk, ctx_len * kd * 4, k));
        ASSERT_OK(pair_alloc(&pv, ctx_len * kd * 4, v));
        ASSERT_OK(pair_alloc(&po, qn * 4, NULL));
        fmoe__attn_args a = {.n = n, .pos0 = pos0, .n_heads = Hq, .n_kv_heads = Hkv,
                             .head_dim = D, .scale = 1.0f / sqrtf((float)D)};
        a.q = RF(pq), a.k_cache = RF(pk), a.v_cache = RF(pv), a.out = RF(po);
        fmoe__llama4_attention(R, rctx, &arch, li, &a, kd);
        a.q = TF(pq), a.k_cache = TF(pk), a.v_cache = TF(pv), a.out = TF(po);
        fmoe__llama4_attention(T, tctx, &arch, li, &a, kd);
        char shape[80];
        snprintf(shape, sizeof shape, "llama4 %s n=%d pos0=%d Hq=%d Hkv=%d D=%d",
                 li ? "nope+temp" : "chunk 8", n, pos0, Hq, Hkv, D);
        bad += compare("attention", shape, po, 0, qn, NULL);
        pair_free(&pq), pair_free(&pk), pair_free(&pv), pair_free(&po);
        free(q), free(k), free(v);
    }
    bad += sides_ok("llama4_attention");
    ASSERT_EQ(bad, 0);
}

/* DeepSeek-V2 (softmax, groups ranked by their best), V3 and GLM-4.5 (sigmoid, the score
 * correction bias, groups ranked by their two best, renormalised and scaled) and
 * Phi-3.5-MoE's sparsemixer (both jitter thresholds), through route's `choice` scratch. */
TEST(route_grouped) {
    seed(25);
    int bad = 0;
    /* J, K, n, sigmoid, norm, scale, n_group, topk_group, group_top2, bias, sparsemixer,
     * jitter */
    static const float cases[][12] = {
        {64, 6, 9, 0, 0, 16, 8, 3, 0, 0, 0, 0},   /* V2: group_limited_greedy */
        {16, 4, 9, 0, 1, 1, 4, 1, 0, 0, 0, 0},    /* V2, one group of four kept */
        {256, 8, 5, 1, 1, 2.5f, 8, 4, 1, 1, 0, 0}, /* V3: noaux_tc */
        {8, 2, 9, 1, 1, 1, 4, 2, 1, 1, 0, 0},     /* GLM-4.5's tiny shape */
        {128, 8, 9, 1, 1, 2.5f, 1, 1, 0, 1, 0, 0}, /* bias without groups */
        {16, 2, 9, 0, 0, 1, 1, 1, 0, 0, 1, 0.3f}, /* Phi-3.5-MoE, wide threshold */
        {16, 2, 9, 0, 0, 1, 1, 1, 0, 0, 1, 0.01f}, /* Phi-3.5-MoE, published */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const float *k = cases[c];
        fmoe__route_args a = {.num_experts = (int32_t)k[0], .top_k = (int32_t)k[1],
                              .n = (int32_t)k[2], .sigmoid = (int32_t)k[3],
                              .norm = (int32_t)k[4], .scale = k[5], .n_group = (int32_t)k[6],
                              .topk_group = (int32_t)k[7], .group_top2 = (int32_t)k[8],
                              .sparsemixer = (int32_t)k[10], .jitter_eps = k[11]};
        a.norm_eps = a.sigmoid ? 1e-20f : 0;
        const int32_t J = a.num_experts, K = a.top_k, n = a.n;
        if (k[9] != 0) a.bias = weight_vec(J, 0.5f, 0.0f);
        float *logits = rand_host((int64_t)n * J, 4);
        if (n > 1 && K > 1) /* exact ties in row 1: the lower index must come first */
            logits[J + 3] = logits[J + 5] = logits[J + J - 1] = 4.5f;
        pair pl, pp, pk, pw, pc;
        ASSERT_OK(pair_alloc(&pl, (int64_t)n * J * 4, logits));
        ASSERT_OK(pair_alloc(&pp, (int64_t)n * J * 4, NULL));
        ASSERT_OK(pair_alloc(&pk, (int64_t)n * K * 4, NULL));
        ASSERT_OK(pair_alloc(&pw, (int64_t)n * K * 4, NULL));
        ASSERT_OK(pair_alloc(&pc, (int64_t)n * J * 4, NULL));
        a.choice = RF(pc);
        R->route(rctx, &a, RF(pl), RF(pp), (int32_t *)pk.r, RF(pw));
        a.choice = TF(pc);
        T->route(tctx, &a, TF(pl), TF(pp), (int32_t *)pk.t, TF(pw));
        char shape[80];
        snprintf(shape, sizeof shape, "J=%d K=%d n=%d %s g=%d/%d%s%s%s", J, K, n,
                 a.sigmoid ? "sigmoid" : "softmax", a.n_group, a.topk_group,
                 a.group_top2 ? " top2" : "", a.bias ? " bias" : "",
                 a.sparsemixer ? " sparsemixer" : "");
        bad += compare("route.probs", shape, pp, 0, (int64_t)n * J, NULL);
        float *rp = fetch(R, rctx, pp.r, (int64_t)n * J * 4);
        int32_t *rk = fetch(R, rctx, pk.r, (int64_t)n * K * 4);
        int32_t *tk = fetch(T, tctx, pk.t, (int64_t)n * K * 4);
        float *rw = fetch(R, rctx, pw.r, (int64_t)n * K * 4);
        float *tw = fetch(T, tctx, pw.t, (int64_t)n * K * 4);
        if (rp && rk && tk && rw && tw)
            bad += route_ids_compare(shape, &a, logits, rp, rk, tk, rw, tw);
        else
            bad++;
        free(rp), free(rk), free(tk), free(rw), free(tw);
        pair_free(&pl), pair_free(&pp), pair_free(&pk), pair_free(&pw), pair_free(&pc);
        free(logits);
    }
    bad += sides_ok("route_grouped");
    ASSERT_EQ(bad, 0);
}

/*
 * DeepSeek-V2/V3's multi-head latent attention: q's rope dims rotated in place, kv's rows
 * rotated and appended to a latent cache already holding pos0 rows, and the heads'
 * outputs. kv_b_proj split as the GGUF files split it, k_b [H·r][dn] and v_b [H·dv][r], in
 * f32, bf16, and blocks (k_b Q5_0, v_b Q4_K or Q5_0 where r is not whole 256-blocks:
 * DeepSeek-V2-Lite's Q4_K_M types); the rope dims as halves and as adjacent pairs
 * (rope_interleave); one scratch slot (the device's heads one after the other) and three
 * (heads in turn).
 */
TEST(mla_attention) {
    seed(26);
    int bad = 0;
    /* n, pos0, H, nope, rope, v_dim, rank, interleave, dtype (0 f32, 1 bf16, 2 blocks),
     * slots */
    static const int32_t cases[][10] = {
        {1, 37, 4, 16, 8, 16, 32, 0, 0, 1},    {5, 0, 4, 16, 8, 16, 32, 1, 0, 3},
        {3, 20, 8, 32, 16, 24, 64, 1, 1, 3},   {1, 90, 2, 128, 64, 128, 512, 1, 1, 1},
        {4, 11, 3, 32, 8, 16, 64, 0, 2, 2},    {1, 60, 16, 32, 64, 32, 256, 1, 2, 3},
    };
    const int32_t max_context = 96, max_batch = 8;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int32_t *k = cases[c];
        const int32_t n = k[0], pos0 = k[1], H = k[2], dn = k[3], dr = k[4], dv = k[5];
        const int32_t r = k[6], interleave = k[7], kind = k[8], slots = k[9];
        const int64_t qs = dn + dr, ks = r + dr, half = dr / 2, qn = (int64_t)n * H * qs;
        float *q = rand_host(qn, 1), *kv = rand_host((int64_t)n * ks, 1);
        float *cache = rand_host((int64_t)max_context * ks, 1); /* rows < pos0: earlier ones */
        float *wk = rand_host((int64_t)H * r * dn, 0.2f);
        float *wv = rand_host((int64_t)H * dv * r, 0.2f);
        float *cs = malloc((size_t)(n * half) * 4), *sn = malloc((size_t)(n * half) * 4);
        for (int64_t i = 0; i < n * half; i++) {
            const float ang = 40 * frand();
            cs[i] = cosf(ang), sn[i] = sinf(ang);
        }
        fmoe__mat k_b, v_b;
        float *kdeq = NULL, *vdeq = NULL;
        const uint32_t vtype = r % 256 == 0 ? FMOE_GGML_Q4_K : FMOE_GGML_Q5_0;
        if (kind == 2) {
            make_qmat(&k_b, FMOE_GGML_Q5_0, (int64_t)H * r, dn, &kdeq);
            make_qmat(&v_b, vtype, (int64_t)H * dv, r, &vdeq);
        } else {
            make_mat(&k_b, kind ? FMOE_ST_BF16 : FMOE_ST_F32, (int64_t)H * r, dn, wk);
            make_mat(&v_b, kind ? FMOE_ST_BF16 : FMOE_ST_F32, (int64_t)H * dv, r, wv);
        }
        const int64_t slot = fmoe__mla_scratch_floats(dn, dv, r, max_context, max_batch);
        pair pq, pkv, pc, ps, pcache, pout, pscr;
        ASSERT_OK(pair_alloc(&pq, qn * 4, q));
        ASSERT_OK(pair_alloc(&pkv, (int64_t)n * ks * 4, kv));
        ASSERT_OK(pair_alloc(&pc, n * half * 4, cs));
        ASSERT_OK(pair_alloc(&ps, n * half * 4, sn));
        ASSERT_OK(pair_alloc(&pcache, (int64_t)max_context * ks * 4, cache));
        ASSERT_OK(pair_alloc(&pout, (int64_t)n * H * dv * 4, NULL));
        ASSERT_OK(pair_alloc(&pscr, slots * slot * 4, NULL));
        fmoe__mla_args a = {.wk_b = &k_b, .wv_b = &v_b, .scratch_slots = slots,
                            .max_context = max_context,
                            .max_batch = max_batch, .n = n, .pos0 = pos0, .n_heads = H,
                            .nope = dn, .rope = dr, .v_dim = dv, .rank = r,
                            .interleave = interleave, .scale = 1.0f / sqrtf((float)qs)};
        for (int side = 0; side < 2; side++) {
            a.q = side ? TF(pq) : RF(pq), a.kv = side ? TF(pkv) : RF(pkv);
            a.cos = side ? TF(pc) : RF(pc), a.sin = side ? TF(ps) : RF(ps);
            a.cache = side ? TF(pcache) : RF(pcache), a.out = side ? TF(pout) : RF(pout);
            a.scratch = side ? TF(pscr) : RF(pscr);
            (side ? T : R)->mla_attention(side ? tctx : rctx, &a);
        }
        char shape[112];
        snprintf(shape, sizeof shape, "n=%d pos0=%d H=%d dn=%d dr=%d dv=%d r=%d %s%s slots=%d",
                 n, pos0, H, dn, dr, dv, r,
                 kind == 2 ? (vtype == FMOE_GGML_Q4_K ? "q5_0/q4_k" : "q5_0")
                 : kind    ? "bf16"
                           : "f32",
                 interleave ? " pairs" : "", slots);
        bad += compare("mla_attention", shape, pout, 0, (int64_t)n * H * dv, NULL);
        char sub[128];
        snprintf(sub, sizeof sub, "%s [q rotated]", shape);
        bad += compare("rope", sub, pq, 0, qn, NULL);
        snprintf(sub, sizeof sub, "%s [cache]", shape);
        bad += compare("rope", sub, pcache, 0, (int64_t)(pos0 + n) * ks, NULL);
        pair_free(&pq), pair_free(&pkv), pair_free(&pc), pair_free(&ps);
        pair_free(&pcache), pair_free(&pout), pair_free(&pscr);
        free(q), free(kv), free(cache), free(wk), free(wv), free(cs), free(sn);
        free(kdeq), free(vdeq);
    }
    bad += sides_ok("mla_attention");
    ASSERT_EQ(bad, 0);
}

TEST(probs) {
    seed(12);
    int bad = 0;
    const int32_t Js[3] = {8, 60, 128};
    for (int j = 0; j < 3; j++)
        for (int32_t n = 1; n <= 9; n += 8)
            for (int sig = 0; sig < 2; sig++) {
                const int32_t J = Js[j];
                const int64_t stride = n > 1 ? J + 5 : J; /* rows of a wider record */
                float *x = rand_host((int64_t)n * J, 4);
                pair px, py;
                ASSERT_OK(pair_alloc(&px, (int64_t)n * J * 4, x));
                ASSERT_OK(pair_alloc(&py, n * stride * 4, NULL));
                R->probs(rctx, RF(py), stride, RF(px), n, J, sig);
                T->probs(tctx, TF(py), stride, TF(px), n, J, sig);
                char shape[64];
                snprintf(shape, sizeof shape, "J=%d n=%d stride=%lld %s", J, n,
                         (long long)stride, sig ? "sigmoid" : "softmax");
                bad += compare("probs", shape, py, 0, n * stride, NULL);
                pair_free(&px), pair_free(&py);
                free(x);
            }
    bad += sides_ok("probs");
    ASSERT_EQ(bad, 0);
}

/* gather_rows then scatter_add, each index/scale list garbled as soon as the call returns
 * and the next op issued before any download (so a backend that read the list late, or
 * reused its staging too early, shows here). */
TEST(gather_scatter) {
    seed(13);
    int bad = 0;
    const int32_t dims[3] = {1, 129, 1024};
    const int32_t ns[3] = {1, 12, 64};
    const int32_t src_rows = 64;
    for (int d = 0; d < 3; d++)
        for (int k = 0; k < 3; k++) {
            const int32_t dim = dims[d], n = ns[k];
            float *src = rand_host((int64_t)src_rows * dim, 2);
            float *acc = rand_host((int64_t)src_rows * dim, 2);
            int32_t perm[64];
            for (int32_t i = 0; i < 64; i++) perm[i] = i;
            for (int32_t i = 63; i > 0; i--) {
                const int32_t j = irand(i + 1), tmp = perm[i];
                perm[i] = perm[j], perm[j] = tmp;
            }
            pair ps, pg, pa;
            ASSERT_OK(pair_alloc(&ps, (int64_t)src_rows * dim * 4, src));
            ASSERT_OK(pair_alloc(&pg, (int64_t)2 * n * dim * 4, NULL));
            ASSERT_OK(pair_alloc(&pa, (int64_t)src_rows * dim * 4, acc));
            /* two gathers (repeated rows allowed), a scatter_add of each into acc */
            int32_t rows[2][64];
            float scales[2][64];
            for (int g = 0; g < 2; g++) {
                for (int32_t i = 0; i < n; i++) {
                    rows[g][i] = g == 0 ? perm[i] : irand(src_rows);
                    scales[g][i] = frand();
                }
            }
            for (int side = 0; side < 2; side++) {
                const fmoe__backend_ops *B = side ? T : R;
                void *ctx = side ? tctx : rctx;
                float *S = side ? TF(ps) : RF(ps), *G = side ? TF(pg) : RF(pg);
                float *A = side ? TF(pa) : RF(pa);
                int32_t idx[64];
                float sc[64];
                for (int g = 0; g < 2; g++) {
                    memcpy(idx, rows[g], sizeof idx);
                    B->gather_rows(ctx, G + (int64_t)g * n * dim, S, idx, n, dim);
                    garble(idx, sizeof idx);
                }
                /* scatter: rows distinct (a prefix of a permutation, reversed) */
                for (int g = 0; g < 2; g++) {
                    for (int32_t i = 0; i < n; i++) idx[i] = perm[63 - i];
                    memcpy(sc, scales[g], sizeof sc);
                    B->scatter_add(ctx, A, G + (int64_t)g * n * dim, idx, sc, n, dim);
                    garble(idx, sizeof idx), garble(sc, sizeof sc);
                }
            }
            char shape[64];
            snprintf(shape, sizeof shape, "n=%d dim=%d of [%d][%d]", n, dim, src_rows, dim);
            bad += compare("gather_rows", shape, pg, 0, (int64_t)2 * n * dim, NULL);
            bad += compare("scatter_add", shape, pa, 0, (int64_t)src_rows * dim, NULL);
            pair_free(&ps), pair_free(&pg), pair_free(&pa);
            free(src), free(acc);
        }
    bad += sides_ok("gather_scatter");
    ASSERT_EQ(bad, 0);
}

/* 300 ops queued behind each other and one download at the end: the tested side must
 * run them in order and its download wait for all of them. */
TEST(download_after_many_queued_ops) {
    seed(14);
    int bad = 0;
    const int32_t n = 4, dim = 1024;
    const int64_t count = (int64_t)n * dim;
    float *y = rand_host(count, 1), *xs[4];
    pair py, px[4];
    ASSERT_OK(pair_alloc(&py, count * 4, y));
    for (int i = 0; i < 4; i++) {
        xs[i] = rand_host(count, 1);
        ASSERT_OK(pair_alloc(&px[i], count * 4, xs[i]));
    }
    const float *b = weight_vec(dim, 0.25f, 0), *w = weight_vec(dim, 0.1f, 1);
    for (int op = 0; op < 300; op++) {
        const int i = op % 4;
        if (op % 100 == 99) {
            R->rmsnorm(rctx, RF(py), RF(py), w, n, dim, 1e-6f);
            T->rmsnorm(tctx, TF(py), TF(py), w, n, dim, 1e-6f);
        } else if (op % 10 == 9) {
            R->clamp(rctx, RF(py), count, 3), T->clamp(tctx, TF(py), count, 3);
        } else if (op % 3 == 2) {
            R->add_bias(rctx, RF(py), b, n, dim), T->add_bias(tctx, TF(py), b, n, dim);
        } else {
            R->add(rctx, RF(py), RF(px[i]), count), T->add(tctx, TF(py), TF(px[i]), count);
        }
    }
    bad += compare("queue.chain", "300 ops on [4][1024], one download", py, 0, count, NULL);
    pair_free(&py);
    for (int i = 0; i < 4; i++) pair_free(&px[i]), free(xs[i]);
    free(y);
    bad += sides_ok("queue");
    ASSERT_EQ(bad, 0);
}

/* Products from slot m to queue ahead of the checked ones on a device, so that its compute
 * stream is still reading the slot when the rewrite is queued: about BUSY_S of work,
 * sized from the measured time of 4 products (timer marks 0 and 1). Without them the
 * device finished the few checked products long before the copy began, and a build that
 * never waited on the fence passed as well. 0 on a host-memory backend, which runs each op
 * before the call returns. */
#define BUSY_S 0.02
static int32_t busy_products(const fmoe__backend_ops *B, void *ctx, const fmoe__mat *m,
                             const float *x, int32_t n, float *y) {
    if (B->host_memory) return 0;
    B->mark(ctx, 0);
    for (int i = 0; i < 4; i++) B->matmul(ctx, m, x, n, y);
    B->mark(ctx, 1);
    double s = 0;
    if (B->sync(ctx) != 0 || B->elapsed(ctx, 0, 1, &s) != 0 || !(s > 0)) return 4096;
    const double k = ceil(BUSY_S / (s / 4));
    return k > 4096 ? 4096 : (int32_t)k;
}

/*
 * Expert slots: the weights written into a backend buffer with write_slot from a second
 * context (as the offload executor's I/O thread does), then multiplied with on_backend 1.
 * The slot is then rewritten with other weights while products from it are still queued,
 * behind the slot's fence (recorded after the products, waited for by the I/O context's
 * copy stream, as the offload executor does): the products must see the old weights, the
 * product after the rewrite the new ones. On a device the checked products come after
 * ~20 ms of other products from the slot (busy_products), so the copy is queued while the
 * compute stream still reads the slot: removing the wait, waiting on another fence, or not
 * recording the fence lets the copy overwrite the slot under the checked products, and
 * their comparison fails. (The offload executor's own use of the fences is checked on the
 * CPU by tests/offload/test_offload_device.c's fake device, which logs every record and
 * wait.)
 */
TEST(write_slot_on_backend_matmul) {
    seed(15);
    int bad = 0;
    const int64_t rows = 2048, cols = 1024;
    const int32_t n = 32;
    for (int d = 0; d < 3; d++) {
        const fmoe_st_dtype dt = dtypes[d];
        const int64_t bytes = rows * cols * (int64_t)dtype_size(dt);
        float *va = rand_host(rows * cols, 1), *vb = rand_host(rows * cols, 1);
        float *x = rand_host(n * cols, 1);
        fmoe__mat ha, hb; /* host views: the reference's products and the bytes to write */
        make_mat(&ha, dt, rows, cols, va);
        make_mat(&hb, dt, rows, cols, vb);
        /* the slot's source is pinned, as the executor's host tier is */
        void *stage = aligned_alloc(4096, (size_t)((bytes + 4095) / 4096 * 4096));
        ASSERT_OK(T->host_register(tio, stage, bytes));
        pair slot, px, pyA, pyB;
        ASSERT_OK(pair_alloc(&slot, bytes, NULL));
        ASSERT_OK(pair_alloc(&px, n * cols * 4, x));
        ASSERT_OK(pair_alloc(&pyA, 4 * n * rows * 4, NULL));
        ASSERT_OK(pair_alloc(&pyB, n * rows * 4, NULL));
        for (int side = 0; side < 2; side++) {
            const fmoe__backend_ops *B = side ? T : R;
            void *ctx = side ? tctx : rctx, *io = side ? tio : rio;
            fmoe__mat m = ha;
            m.data = side ? slot.t : slot.r;
            m.on_backend = 1;
            void *fence = B->fence_new(io);
            ASSERT_TRUE(fence != NULL);
            memcpy(stage, ha.data, (size_t)bytes);
            ASSERT_OK(B->fence_wait(io, fence)); /* never recorded: waits for nothing */
            ASSERT_OK(B->write_slot(io, side ? slot.t : slot.r, stage, bytes));
            float *yA = side ? TF(pyA) : RF(pyA), *X = side ? TF(px) : RF(px);
            const int32_t busy = busy_products(B, ctx, &m, X, n, yA);
            if (busy) printf("  write_slot %s: %d products (~%.0f ms) ahead of the rewrite\n",
                             dtype_name(dt), busy, BUSY_S * 1e3);
            for (int32_t i = 0; i < busy; i++) B->matmul(ctx, &m, X, n, yA);
            for (int rep = 0; rep < 4; rep++) B->matmul(ctx, &m, X, n, yA + (int64_t)rep * n * rows);
            ASSERT_OK(B->fence_record(ctx, fence));
            memcpy(stage, hb.data, (size_t)bytes);
            ASSERT_OK(B->fence_wait(io, fence));
            ASSERT_OK(B->write_slot(io, side ? slot.t : slot.r, stage, bytes));
            B->matmul(ctx, &m, X, n, side ? TF(pyB) : RF(pyB));
            B->fence_free(io, fence);
        }
        /* the reference's side against host views, to pin what "old" and "new" mean */
        double *sa = matmul_scale(&ha, x, n, NULL), *sb = matmul_scale(&hb, x, n, NULL);
        double *sa4 = malloc((size_t)(4 * n * rows) * sizeof *sa4);
        for (int rep = 0; rep < 4; rep++) memcpy(sa4 + rep * n * rows, sa, (size_t)(n * rows) * 8);
        char shape[80];
        snprintf(shape, sizeof shape, "%s slot [%lld][%lld] n=%d, 4 products before rewrite",
                 dtype_name(dt), (long long)rows, (long long)cols, n);
        bad += compare(matmul_op(dt), shape, pyA, 0, 4 * n * rows, sa4);
        snprintf(shape, sizeof shape, "%s slot after rewrite", dtype_name(dt));
        bad += compare(matmul_op(dt), shape, pyB, 0, n * rows, sb);
        /* the same product from the host weights (on_backend 0) on the tested side */
        R->matmul(rctx, &ha, RF(px), n, RF(pyB));
        T->matmul(tctx, &ha, TF(px), n, TF(pyB));
        snprintf(shape, sizeof shape, "%s host weights, same product", dtype_name(dt));
        bad += compare(matmul_op(dt), shape, pyB, 0, n * rows, sa);
        T->host_unregister(tio, stage);
        free(stage), free(sa), free(sb), free(sa4);
        pair_free(&slot), pair_free(&px), pair_free(&pyA), pair_free(&pyB);
        free(va), free(vb), free(x);
    }
    bad += sides_ok("write_slot");
    if (T->sync(tio) != 0) printf("  write_slot: I/O context: %s\n", fmoe_error_detail()), bad++;
    ASSERT_EQ(bad, 0);
}

/*
 * Timer marks (the forward pass's per-layer times): checked on each side alone, since two
 * backends' times have nothing to agree on. Marks 0, 1, 2 around a chain of queued ops, read
 * after a sync: elapsed(0, 0) is 0; the intervals are >= 0 and add up (0->2 = 0->1 + 1->2,
 * within 1 us: CUDA's events resolve about 0.5 us); the marks lie between the host's clock
 * before the first and after the sync (within 10 us of slack), since a device stamps a mark
 * after it was issued and before the wait returns. A slot never marked, or out of range,
 * is FMOE_EINVAL, and a mark out of range records nothing and faults nothing. Marking a
 * slot again moves it.
 */
static double host_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int timer_side(const fmoe__backend_ops *B, void *ctx, float *y, const float *x,
                      int64_t count) {
    int bad = 0;
    double e = -1, e01 = -1, e12 = -1, e02 = -1, e10 = 1;
#define TIMER_EXPECT(cond, ...)                                                            \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            printf("  %s: timer: ", B->name);                                              \
            printf(__VA_ARGS__);                                                           \
            printf("\n");                                                                  \
            bad++;                                                                         \
        }                                                                                  \
    } while (0)
    TIMER_EXPECT(B->elapsed(ctx, 0, 3, &e) == FMOE_EINVAL, "unmarked slots: not EINVAL");
    B->mark(ctx, MAX_MARKS);
    B->mark(ctx, -1);
    TIMER_EXPECT(B->elapsed(ctx, 0, MAX_MARKS, &e) == FMOE_EINVAL, "slot %d: not EINVAL",
                 MAX_MARKS);
    TIMER_EXPECT(B->elapsed(ctx, -1, 0, &e) == FMOE_EINVAL, "slot -1: not EINVAL");
    TIMER_EXPECT(B->sync(ctx) == 0, "sync after marks out of range: %s", fmoe_error_detail());
    const double t0 = host_s();
    B->mark(ctx, 0);
    for (int i = 0; i < 100; i++) B->add(ctx, y, x, count);
    B->mark(ctx, 1);
    for (int i = 0; i < 100; i++) B->add(ctx, y, x, count);
    B->mark(ctx, 2);
    TIMER_EXPECT(B->sync(ctx) == 0, "sync: %s", fmoe_error_detail());
    const double host = host_s() - t0;
    TIMER_EXPECT(B->elapsed(ctx, 0, 0, &e) == 0 && e == 0, "0 -> 0 is %g s", e);
    TIMER_EXPECT(B->elapsed(ctx, 0, 1, &e01) == 0 && e01 >= 0, "0 -> 1 is %g s", e01);
    TIMER_EXPECT(B->elapsed(ctx, 1, 2, &e12) == 0 && e12 >= 0, "1 -> 2 is %g s", e12);
    TIMER_EXPECT(B->elapsed(ctx, 0, 2, &e02) == 0 && fabs(e02 - (e01 + e12)) <= 1e-6,
                 "0 -> 2 is %g s, 0 -> 1 plus 1 -> 2 is %g s", e02, e01 + e12);
    TIMER_EXPECT(e02 <= host + 1e-5, "0 -> 2 is %g s, the host's clock around it %g s", e02,
                 host);
    TIMER_EXPECT(B->elapsed(ctx, 0, 3, &e) == FMOE_EINVAL, "slot 3 never marked: not EINVAL");
    /* mark 0 again after mark 1: the interval 1 -> 0 is now forward in time */
    B->add(ctx, y, x, count);
    B->mark(ctx, 0);
    TIMER_EXPECT(B->sync(ctx) == 0, "sync: %s", fmoe_error_detail());
    TIMER_EXPECT(B->elapsed(ctx, 1, 0, &e10) == 0 && e10 >= 0, "1 -> re-marked 0 is %g s",
                 e10);
#undef TIMER_EXPECT
    printf("%-12s %-44s 0->1 %.3g s, 1->2 %.3g s, 0->2 %.3g s (host %.3g s)  %s\n", "timer",
           B->name, e01, e12, e02, host, bad ? "FAIL" : "PASS");
    record("timer", B->name, 0, bad ? INFINITY : 0, 0, bad == 0);
    return bad;
}

TEST(timer_marks) {
    seed(16);
    const int64_t count = 4 * 1024;
    float *x = rand_host(count, 1e-3f);
    pair py, px;
    ASSERT_OK(pair_alloc(&py, count * 4, NULL));
    ASSERT_OK(pair_alloc(&px, count * 4, x));
    int bad = timer_side(R, rctx, RF(py), RF(px), count);
    bad += timer_side(T, tctx, TF(py), TF(px), count);
    pair_free(&py), pair_free(&px);
    free(x);
    bad += sides_ok("timer");
    ASSERT_EQ(bad, 0);
}

/* ---------------------------------------------------------------------------------- */

static void usage(void) {
    fprintf(stderr, "usage: test_backend_ops [--self] [--cpu-activations f32|q8] [--json FILE] "
                    "[FILTER]\n");
}

int main(int argc, char **argv) {
    const char *json_path = NULL;
    /* the CPU reference's inputs for quantized weights: q8 checks that matmul.quant.cpu's
     * bound holds for the CPU's 8-bit path too (the commands' --activations q8) */
    fmoe_activations cpu_act = FMOE_ACTIVATIONS_F32;
    char *filter_argv[2] = {argv[0], NULL};
    int filter_argc = 1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--self") == 0) {
            self_mode = 1;
        } else if (strcmp(argv[i], "--json") == 0 && i + 1 < argc) {
            json_path = argv[++i];
        } else if (strcmp(argv[i], "--cpu-activations") == 0 && i + 1 < argc &&
                   (strcmp(argv[i + 1], "f32") == 0 || strcmp(argv[i + 1], "q8") == 0)) {
            cpu_act = strcmp(argv[++i], "q8") == 0 ? FMOE_ACTIVATIONS_Q8 : FMOE_ACTIVATIONS_F32;
        } else if (argv[i][0] == '-') {
            usage();
            return 2;
        } else {
            filter_argv[1] = argv[i];
            filter_argc = 2;
        }
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (self_mode) {
        T = &fmoe__cpu_backend;
    } else {
        /* the loader looks beside the fmoe binary (<build>/cmd/../runtime); a test names
         * the build's module: FMOE_BUILD_ROOT from meson, else <exe>/../../runtime */
        char path[4096], exe[4000];
        const char *root = getenv("FMOE_BUILD_ROOT");
        if (!getenv("FMOE_CUDA_MODULE")) {
            const ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
            if (root) {
                snprintf(path, sizeof path, "%s/runtime/libfmoe-cuda.so", root);
                setenv("FMOE_CUDA_MODULE", path, 1);
            } else if (len > 0) {
                exe[len] = '\0';
                char *slash = strrchr(exe, '/');
                if (slash) *slash = '\0';
                snprintf(path, sizeof path, "%s/../../runtime/libfmoe-cuda.so", exe);
                setenv("FMOE_CUDA_MODULE", path, 1);
            }
        }
        T = fmoe__cuda_backend();
        if (!T) {
            printf("backend_ops: skipped: %s\n", fmoe_error_detail());
            return 77;
        }
    }
    fmoe__backend_limits lim = {.threads = 0, .max_cols = MAX_COLS, .max_batch = MAX_BATCH,
                                .max_context = MAX_CONTEXT, .max_experts = MAX_EXPERTS,
                                .max_marks = MAX_MARKS};
    lim.weights = &rhome;
    lim.activations = cpu_act;
    if (R->init(&lim, &rctx) != 0 || R->init(&lim, &rio) != 0) {
        printf("backend_ops: cpu init: %s\n", fmoe_error_detail());
        return 1;
    }
    lim.weights = &thome;
    lim.activations = FMOE_ACTIVATIONS_F32; /* the CUDA kernels' own inputs (or --self's) */
    if (T->init(&lim, &tctx) != 0 || T->init(&lim, &tio) != 0) {
        printf("backend_ops: %s init: %s\n", T->name, fmoe_error_detail());
        return 1;
    }
    if (json_path && !(json = fopen(json_path, "w"))) {
        printf("backend_ops: %s: cannot write\n", json_path);
        return 1;
    }
    printf("backend_ops: reference %s, tested %s%s\n", R->name, T->name,
           self_mode ? " (--self: a second CPU context)" : "");
    printf("tolerances (pass: |tested - reference| <= tol * max(scale, floor)):\n");
    for (size_t i = 0; i < sizeof tolerances / sizeof tolerances[0]; i++)
        printf("  %-12s tol %-7.1g floor %-5g %s\n", tolerances[i].op, tolerances[i].tol,
               tolerances[i].floor, tolerances[i].why);

    const int rc = RUN_TESTS(filter_argc, filter_argv);

    T->free(tio), T->free(tctx);
    R->free(rio), R->free(rctx);
    if (thome.cache_free) thome.cache_free(thome.cache);
    if (rhome.cache_free) rhome.cache_free(rhome.cache);
    for (int i = 0; i < n_weights; i++) free(weights[i]);
    free(weights);
    if (json) fclose(json);
    printf("backend_ops: %s vs %s: %d checks, %d failed, worst err/tol %.3g (%s)\n", R->name,
           T->name, n_checks, n_failed, worst_ratio, worst_what[0] ? worst_what : "-");
    return rc || n_failed ? 1 : 0;
}
